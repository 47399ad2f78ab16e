/* fuzz_http.c - the HTTP front's request path off the wire: llhttp with
 * kvd's limits (net/wire/http_wire.c), then each request body through the
 * OpenAI body reader (net/wire/openai.c) for both endpoints, and the API keys
 * file parser (conf/apikeys.c) on the same bytes.
 *
 * Input: byte 0 = how the stream is cut into reads (chunk size 1..32, or
 * whole), the rest = what a client sends on one connection.
 *
 * Properties:
 *   - the stream gives the same transcript (each request's method, path,
 *     Authorization, keep-alive and body; then the error and its status,
 *     after which nothing more parses) whether fed whole or in chunks;
 *   - a request is within bounds: path, auth and content type
 *     NUL-terminated in their buffers, body_len <= max_body and
 *     NUL-terminated; an error has a 4xx/5xx status and a sentence;
 *   - openai_req_parse: 0 or OPENAI_E_INVALID (400, a message) or
 *     -ENOMEM; accepted: completions have exactly one of prompt and
 *     tokens, chat at least one message with role and content; max_tokens
 *     in 1..PROTO_CLIENT_MAX_TOKENS, temperature in [0, 100], top_p in
 *     (0, 1], at most 4 stop strings of 1..256 bytes; no leak;
 *   - a chat body's tools: at most OPENAI_TOOLS_MAX, each with a valid
 *     name and both texts; the body, as a model's answer in the chatml,
 *     llama3 and mistral_v3 formats with those tools (or one named
 *     "f"), scans to text and calls that stay within it, each call
 *     naming a tool offered, its arguments a JSON object's text;
 *   - kvd_apikeys_parse: an error names the source; accepted: at least
 *     one key; a lookup of the input itself finds nothing or a valid
 *     tenant.
 */
#include <errno.h>
#include <string.h>

#include "conf/apikeys.h"
#include "net/wire/http_wire.h"
#include "net/wire/openai.h"
#include "net/wire/openai_tools.h"
#include "net/wire/proto_client.h"
#include "tests/fuzz/fuzz.h"

const char fuzz_target_name[] = "http";

#define MAX_HEADER 2048
#define MAX_BODY 8192

/* A transcript: a running hash of what the parser produced. */
struct transcript {
	uint64_t h;
	unsigned n_msgs;
	int err, status;
};

static void mix(struct transcript *t, const void *p, size_t n)
{
	const uint8_t *b = p;

	for (size_t i = 0; i < n; i++)
		t->h = (t->h ^ b[i]) * 1099511628211ull;
	t->h = (t->h ^ n) * 1099511628211ull;
}

/* The body as a model's answer: scanned to the end, all in bounds. */
static void check_scan(const struct openai_req *q, const char *p, size_t len)
{
	static const struct openai_tool f = { .name = "f" };
	const struct openai_tool *tools = q && q->n_tools ? q->tools : &f;
	size_t n_tools = q && q->n_tools ? q->n_tools : 1;
	const enum chat_format fmts[] = { CHAT_CHATML, CHAT_LLAMA3, CHAT_MISTRAL_V3 };

	for (unsigned k = 0; k < 3; k++) {
		struct openai_found o;
		size_t pos = 0;
		bool plain = false;
		int rc;

		do {
			rc = openai_calls_scan(fmts[k], tools, n_tools, p + pos, len - pos,
					       true, &plain, &o);
			FUZZ_CHECK(rc == OPENAI_SCAN_TEXT || rc == OPENAI_SCAN_CALL || rc == -ENOMEM,
				   "scan returned %d", rc);
			FUZZ_CHECK(o.text <= len - pos && (rc != OPENAI_SCAN_CALL ||
				   (o.end > o.text && o.end <= len - pos)), "scan out of bounds");
			if (rc == OPENAI_SCAN_CALL) {
				size_t t = 0;

				while (t < n_tools && strcmp(tools[t].name, o.name))
					t++;
				FUZZ_CHECK(t < n_tools, "a call to a tool not offered");
				FUZZ_CHECK(o.arguments && o.arguments[0] == '{', "arguments");
				pos += o.end;
			}
			free(o.arguments);
		} while (rc == OPENAI_SCAN_CALL);
	}
}

static void check_body(const struct http_msg *m)
{
	struct openai_req q;
	struct openai_error e;

	check_scan(NULL, m->body ? m->body : "", m->body_len);
	for (int ep = OPENAI_EP_COMPLETIONS; ep <= OPENAI_EP_RESPONSES; ep++) {
		bool chat = ep != OPENAI_EP_COMPLETIONS;
		int rc;

		memset(&e, 0, sizeof(e));
		rc = openai_req_parse_ep(&q, (enum openai_ep)ep, m->body ? m->body : "",
					 m->body_len, &e);
		FUZZ_CHECK(rc == 0 || rc == OPENAI_E_INVALID || rc == -ENOMEM,
			   "openai_req_parse returned %d", rc);
		if (rc == OPENAI_E_INVALID) {
			FUZZ_CHECK(e.status == 400 && e.msg[0] &&
				   memchr(e.msg, 0, sizeof(e.msg)) &&
				   memchr(e.param, 0, sizeof(e.param)),
				   "refusal without a message (status %d)", e.status);
			for (const char *c = e.param; *c; c++)
				FUZZ_CHECK(*c >= 0x20 && *c < 0x7f && *c != '"',
					   "param holds a raw byte 0x%02x", (unsigned char)*c);
			continue;
		}
		if (rc)
			continue;
		if (chat) {
			FUZZ_CHECK(q.n_msgs >= 1 && q.msgs && q.chat, "chat accepted without messages");
			/* responses: the input's items and the instructions */
			FUZZ_CHECK(q.n_msgs <= OPENAI_MSGS_MAX + 1 && !q.instructions,
				   "%zu messages, instructions left", q.n_msgs);
			FUZZ_CHECK(q.n_tools <= OPENAI_TOOLS_MAX, "%zu tools", q.n_tools);
			for (size_t i = 0; i < q.n_tools; i++)
				FUZZ_CHECK(q.tools[i].name[0] && q.tools[i].json &&
					   q.tools[i].json_indent, "tool %zu", i);
			check_scan(&q, m->body ? m->body : "", m->body_len);
			for (size_t i = 0; i < q.n_msgs; i++)
				FUZZ_CHECK(q.msgs[i].role && q.msgs[i].content,
					   "message %zu without role or content", i);
		} else {
			FUZZ_CHECK(!!q.prompt != !!q.tokens, "not exactly one of prompt and tokens");
			FUZZ_CHECK(!q.tokens || (q.n_tokens >= 1 && q.n_tokens <= PROTO_CLIENT_TOKENS_MAX),
				   "token count %u", q.n_tokens);
			FUZZ_CHECK(!q.prompt || (q.prompt[0] && strlen(q.prompt) <= PROTO_CLIENT_PROMPT_MAX),
				   "prompt length");
		}
		/* 0: not given (the front fills in the rest of the context) */
		FUZZ_CHECK(q.max_tokens <= PROTO_CLIENT_MAX_TOKENS,
			   "max_tokens %u", q.max_tokens);
		FUZZ_CHECK(!(q.ignored >> OPENAI_IGNORED__N), "ignored bits %#x", q.ignored);
		FUZZ_CHECK(q.temperature >= 0.0f && q.temperature <= 100.0f,
			   "temperature %g", q.temperature);
		FUZZ_CHECK(q.top_p > 0.0f && q.top_p <= 1.0f, "top_p %g", q.top_p);
		FUZZ_CHECK(q.n_stop <= OPENAI_STOP_MAX, "n_stop %u", q.n_stop);
		for (uint32_t i = 0; i < q.n_stop; i++)
			FUZZ_CHECK(q.stop_len[i] >= 1 && q.stop_len[i] <= OPENAI_STOP_BYTES &&
				   strlen(q.stop[i]) == q.stop_len[i], "stop %u", i);
		openai_req_deinit(&q);
	}
}

static void on_msg(struct transcript *t, const struct http_msg *m, bool props)
{
	FUZZ_CHECK(memchr(m->path, 0, sizeof(m->path)) && memchr(m->auth, 0, sizeof(m->auth)) &&
		   memchr(m->ctype, 0, sizeof(m->ctype)) &&
		   memchr(m->method_name, 0, sizeof(m->method_name)), "unterminated field");
	FUZZ_CHECK(m->body_len <= MAX_BODY, "body %zu past the bound", m->body_len);
	FUZZ_CHECK(!m->body_len || (m->body && m->body[m->body_len] == 0), "body not terminated");
	t->n_msgs++;
	mix(t, m->method_name, strlen(m->method_name));
	mix(t, m->path, strlen(m->path));
	mix(t, m->auth, strlen(m->auth));
	mix(t, &m->keep_alive, 1);
	mix(t, m->body ? m->body : "", m->body_len);
	if (props)
		check_body(m);
}

/* Feed [p, p+n) in reads of `chunk` bytes (0: whole), as http.c does:
 * unparsed bytes stay buffered and are offered again with the next read. */
static void run(struct transcript *t, const uint8_t *p, size_t n, size_t chunk,
		bool props)
{
	struct http_wire w;
	char *buf = malloc(n + 1);
	size_t have = 0, off = 0;

	memset(t, 0, sizeof(*t));
	t->h = 1469598103934665603ull;
	http_wire_init(&w, MAX_HEADER, MAX_BODY);
	while (buf && !t->err) {
		size_t take = chunk ? FUZZ_MIN(chunk, n - off) : n - off, used;
		int rc;

		memcpy(buf + have, p + off, take);
		have += take;
		off += take;
		for (;;) {
			rc = http_wire_feed(&w, buf, have, &used);
			memmove(buf, buf + used, have - used);
			have -= used;
			if (rc == HTTP_WIRE_MSG) {
				on_msg(t, &w.msg, props);
				http_wire_next(&w);
				continue;
			}
			break;
		}
		if (rc != HTTP_WIRE_AGAIN && rc != HTTP_WIRE_MSG) {
			t->err = rc;
			t->status = w.status;
			if (rc != -ENOMEM)
				FUZZ_CHECK(w.status >= 400 && w.status < 600 && w.why && w.why[0],
					   "error %d with status %d", rc, w.status);
		}
		if (off == n)
			break;
	}
	http_wire_deinit(&w);
	free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct transcript whole, cut;
	struct kvd_apikeys *k = NULL;
	char why[300];
	size_t chunk;
	int rc;

	if (size < 1)
		return 0;
	chunk = data[0] & 0x1f;
	data++;
	size--;
	run(&whole, data, size, 0, true);
	if (chunk) {
		run(&cut, data, size, chunk, false);
		/* a request cut in reads may end sooner (the bytes after an
		 * error never parse), never differently */
		FUZZ_CHECK(whole.n_msgs == cut.n_msgs && whole.h == cut.h &&
			   whole.err == cut.err && whole.status == cut.status,
			   "chunk %zu: %u msgs err %d vs whole %u msgs err %d",
			   chunk, cut.n_msgs, cut.err, whole.n_msgs, whole.err);
	}
	rc = kvd_apikeys_parse(&k, "fuzz", (const char *)data, size, why, sizeof(why));
	FUZZ_CHECK(rc == 0 || rc == -ENOMEM || (rc == -1 && !strncmp(why, "fuzz", 4)),
		   "apikeys rc %d why %s", rc, rc == -1 ? why : "");
	if (rc == 0) {
		const char *ten;

		FUZZ_CHECK(kvd_apikeys_count(k) >= 1, "accepted without a key");
		ten = kvd_apikeys_lookup(k, (const char *)data, FUZZ_MIN(size, 300));
		FUZZ_CHECK(!ten || (ten[0] && strlen(ten) <= KVD_APIKEY_TENANT_MAX), "tenant");
		kvd_apikeys_free(k);
	}
	return 0;
}

static void seed(fuzz_emit_fn emit, void *ctx, uint8_t chunk, const char *s)
{
	size_t n = strlen(s);
	uint8_t *b = malloc(n + 1);

	if (!b)
		return;
	b[0] = chunk;
	memcpy(b + 1, s, n);
	emit(ctx, b, n + 1);
	free(b);
}

void fuzz_target_seeds(fuzz_emit_fn emit, void *ctx)
{
	seed(emit, ctx, 0, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer abcdefghijklmnop\r\n"
			   "Content-Type: application/json\r\nContent-Length: 86\r\n\r\n"
			   "{\"model\":\"m\",\"prompt\":\"Once upon a time\",\"max_tokens\":8,\"temperature\":0,\"stop\":[\"x\"]}");
	seed(emit, ctx, 3, "POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 76\r\n\r\n"
			   "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"stream\":true,\"top_p\":0.5}\r\n\r\n");
	/* issue 24.1: text parts, fields ignored */
	seed(emit, ctx, 2, "POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 197\r\n\r\n"
			   "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"}]},{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"b\"}]}],\"user\":\"u\",\"metadata\":{\"k\":\"v\"},\"store\":false,\"parallel_tool_calls\":true}");
	/* issue 24.4: the Responses API's items and fields */
	seed(emit, ctx, 5, "POST /v1/responses HTTP/1.1\r\nContent-Length: 263\r\n\r\n"
			   "{\"input\":[{\"role\":\"developer\",\"content\":\"d\"},{\"type\":\"message\",\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"a\"},{\"type\":\"output_text\",\"text\":\"b\",\"annotations\":[]}]}],\"instructions\":\"i\",\"max_output_tokens\":4,\"store\":true,\"text\":{\"format\":{\"type\":\"text\"}}}");
	seed(emit, ctx, 7, "POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
			   "10\r\n{\"prompt\":[1,2,\r\n5\r\n3],\"n\r\n6\r\n\":1}  \r\n0\r\n\r\n"
			   "GET /v1/models HTTP/1.1\r\n\r\nGET /health HTTP/1.0\r\n\r\n");
	/* issue 24.3: tools, a call and a result holding a call's text */
	seed(emit, ctx, 5, "POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 360\r\n\r\n"
			   "{\"messages\":[{\"role\":\"user\",\"content\":\"w\"},{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"c\",\"content\":\"<tool_call>{\\\"name\\\":\\\"f\\\",\\\"arguments\\\":{}}</tool_call>\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{}}}],\"tool_choice\":\"auto\"}");
	seed(emit, ctx, 1, "GET /health HTTP/1.1\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n");
	seed(emit, ctx, 0, "0123456789abcdef0123456789abcdef alice\n# c\nfedcba9876543210fedcba9876543210 bob-2\n");
}
