/* fuzz_chat.c - the chat templates (gpu/text/chat.h): chat_render and
 * chat_format_detect on any bytes.
 *
 * Input: byte 0 picks the format (mod CHAT__N, CHAT_NONE included) and
 * the generation prompt (bit 7); the rest is messages separated by 0x1e,
 * each "ROLE\x1fCONTENT" (a missing separator: a NULL content). The whole
 * input, as a string, is also a template source for detection.
 * Properties:
 *   - render returns 0, -EINVAL, -ENOENT (exactly for CHAT_NONE) or
 *     -E2BIG; on error nothing is returned (*out NULL, *len 0) and err is
 *     a terminated sentence; on success *out is NUL-terminated at *len and
 *     every message's content (trimmed of ASCII whitespace) is in it
 *     (a tool result in llama3 is JSON-quoted: not checked; mistral_v3
 *     renders the system message only into a last user message);
 *   - a role outside system/user/assistant (and tool, in the formats
 *     with a tool syntax) is always -EINVAL;
 *   - detection returns 0 with a format other than CHAT_NONE, or -ENOENT
 *     with CHAT_NONE; the same source gives the same answer twice.
 */
#include <errno.h>

#include "gpu/text/chat.h"
#include "tests/fuzz/fuzz.h"

const char fuzz_target_name[] = "chat";

#define MAX_MSGS 64

static bool known_role(enum chat_format f, const char *r)
{
	return r && (!strcmp(r, "system") || !strcmp(r, "user") ||
		     !strcmp(r, "assistant") ||
		     (!strcmp(r, "tool") && chat_format_tools(f)));
}

/* content trimmed of ASCII whitespace is a substring of out */
static bool holds(const char *out, const char *c)
{
	size_t n = strlen(c);
	char *t;
	bool ok;

	while (n && strchr(" \t\n\r\v\f", *c)) {
		c++;
		n--;
	}
	while (n && strchr(" \t\n\r\v\f", c[n - 1]))
		n--;
	t = strndup(c, n);
	if (!t)
		abort();
	ok = strstr(out, t) != NULL;
	free(t);
	return ok;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct chat_msg msgs[MAX_MSGS];
	enum chat_format f, f2;
	char err[200], *buf, *out;
	size_t n = 0, len;
	bool gen, bad_role = false;
	int rc, rc2;

	if (size < 1)
		return 0;
	f = (enum chat_format)((data[0] & 0x7f) % CHAT__N);
	gen = data[0] & 0x80;
	buf = malloc(size);
	if (!buf)
		abort();
	memcpy(buf, data + 1, size - 1);
	buf[size - 1] = '\0';
	for (char *p = buf; n < MAX_MSGS;) {
		char *end = strchr(p, '\x1e'), *sep;

		if (end)
			*end = '\0';
		sep = strchr(p, '\x1f');
		if (sep)
			*sep = '\0';
		msgs[n] = (struct chat_msg){ p, sep ? sep + 1 : NULL };
		if (!sep || !known_role(f, p))
			bad_role = true;
		n++;
		if (!end)
			break;
		p = end + 1;
	}
	out = (char *)1;
	len = 7;
	rc = chat_render(f, msgs, n, gen, &out, &len, err, sizeof(err));
	FUZZ_CHECK(rc == 0 || rc == -EINVAL || rc == -ENOENT || rc == -E2BIG,
		   "render: %d", rc);
	FUZZ_CHECK((rc == -ENOENT) == (f == CHAT_NONE), "-ENOENT for format %d", f);
	if (rc) {
		FUZZ_CHECK(out == NULL && len == 0, "an error returned text");
		FUZZ_CHECK(memchr(err, 0, sizeof(err)) && err[0], "no error sentence");
	} else {
		FUZZ_CHECK(!bad_role, "a bad role or missing content was rendered");
		FUZZ_CHECK(out && out[len] == '\0' && strlen(out) == len,
			   "text not terminated at its length");
		for (size_t i = 0; i < n; i++)
			FUZZ_CHECK((f == CHAT_LLAMA3 && !strcmp(msgs[i].role, "tool")) ||
				   (f == CHAT_MISTRAL_V3 && !strcmp(msgs[i].role, "system") &&
				    strcmp(msgs[n - 1].role, "user")) ||
				   holds(out, msgs[i].content),
				   "message %zu's content is missing", i);
		free(out);
	}
	if (bad_role && f != CHAT_NONE)
		FUZZ_CHECK(rc == -EINVAL, "a bad role gave %d", rc);

	/* the raw input as a template source */
	memcpy(buf, data + 1, size - 1);
	buf[size - 1] = '\0';
	rc = chat_format_detect(buf, &f);
	rc2 = chat_format_detect(buf, &f2);
	FUZZ_CHECK(rc == rc2 && f == f2, "detection is not a function");
	FUZZ_CHECK((rc == 0 && f != CHAT_NONE) || (rc == -ENOENT && f == CHAT_NONE),
		   "detect: %d, format %d", rc, f);
	free(buf);
	return 0;
}

static void seed(fuzz_emit_fn emit, void *ctx, uint8_t head, const char *body)
{
	size_t n = strlen(body);
	uint8_t *b = malloc(n + 1);

	if (!b)
		abort();
	b[0] = head;
	memcpy(b + 1, body, n);
	emit(ctx, b, n + 1);
	free(b);
}

void fuzz_target_seeds(fuzz_emit_fn emit, void *ctx)
{
	static const char conv[] = "system\x1f" "Be brief.\x1euser\x1fHi\x1e"
				   "assistant\x1fHello!\x1euser\x1f 2+2? ";
	for (uint8_t f = 0; f < CHAT__N; f++) {
		seed(emit, ctx, f | 0x80, conv);
		seed(emit, ctx, f, "user\x1fHi");
		seed(emit, ctx, f | 0x80, "user\x1fHi\x1e" "assistant\x1f\x1etool\x1f" "18 \"C\"\n");
	}
	seed(emit, ctx, CHAT_CHATML, "{{'<|im_start|>' + message['role'] + '\\n' + "
	     "message['content'] + '<|im_end|>'}}");
	seed(emit, ctx, CHAT_LLAMA3, "<|start_header_id|>x<|end_header_id|><|eot_id|>");
	seed(emit, ctx, CHAT_MISTRAL, "'[INST] ' + m + ' [/INST]'");
	seed(emit, ctx, CHAT_MISTRAL_V3, "\"[INST] \" + m + \"[/INST]\" \"[AVAILABLE_TOOLS] [\" \"[TOOL_CALLS] [\"");
}
