/* chat.c - built-in chat templates.
 *
 * Design. A GGUF carries its chat template as Jinja source
 * (tokenizer.chat_template). Running Jinja would mean a template engine
 * in the daemon fed by files from anywhere; instead kvd knows the seven
 * formats most models use as code, one row each in `formats[]`:
 *
 *   - how to recognize the format's source: every marker of `need` must
 *     appear and none of `refuse` (markers of look-alike formats kvd
 *     renders differently, e.g. Mistral v3's [AVAILABLE_TOOLS]). A source
 *     that matches no row, or more than one, is not recognized: kvd never
 *     renders with a format it is not sure of;
 *   - which turns it takes: a system message only first (`sys_first`),
 *     user and assistant strictly alternating (`alternate`), as the
 *     reference templates' raise_exception() calls demand;
 *   - the render function, written after the model's reference template
 *     (Hugging Face tokenizer_config.json), with two rules for all: the
 *     first BOS is left to the tokenizer (tokenizer_add_bos), so it is
 *     never doubled; and no default system prompt is invented (Qwen2's
 *     "You are a helpful assistant." is the caller's to send).
 *
 * Where a reference template trims a content (Jinja `| trim`, Python
 * strip()), so do we, for ASCII whitespace.
 */
#include "gpu/text/chat.h"
#include "gpu/text/tokenizer.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- a growing string --------------------------------------------------- */

struct sb {
	char *p;      /* (cap) bytes, NUL-terminated at len */
	size_t len, cap;
	int err;      /* first error: -ENOMEM or -E2BIG; later appends no-op */
};

static void sb_put(struct sb *b, const char *s, size_t n)
{
	if (b->err)
		return;
	if (n > CHAT_TEXT_MAX || b->len + n > CHAT_TEXT_MAX) {
		b->err = -E2BIG;
		return;
	}
	if (b->len + n + 1 > b->cap) {
		size_t cap = b->cap ? b->cap : 256;
		while (cap < b->len + n + 1)
			cap *= 2;
		char *np = realloc(b->p, cap);
		if (!np) {
			b->err = -ENOMEM;
			return;
		}
		b->p = np;
		b->cap = cap;
	}
	memcpy(b->p + b->len, s, n);
	b->len += n;
	b->p[b->len] = '\0';
}

static void sb_str(struct sb *b, const char *s)
{
	sb_put(b, s, strlen(s));
}

static int is_ws(char c)
{
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' ||
	       c == '\f';
}

/* content with leading and trailing ASCII whitespace removed */
static void sb_trim(struct sb *b, const char *s)
{
	size_t n = strlen(s);
	while (n && is_ws(*s)) {
		s++;
		n--;
	}
	while (n && is_ws(s[n - 1]))
		n--;
	sb_put(b, s, n);
}

/* ---- roles ---------------------------------------------------------------- */

enum role { R_SYSTEM, R_USER, R_ASSISTANT };

struct turn {
	enum role role;
	const char *content;
};

/* ---- the formats ---------------------------------------------------------- */

/* Llama 2 chat (meta-llama/Llama-2-7b-chat-hf):
 *   [INST] <<SYS>>\nS\n<</SYS>>\n\nU1 [/INST] A1 </s><s>[INST] U2 [/INST]
 * (the first <s> is the tokenizer's). Contents stripped. The user turn
 * ends with [/INST], which is the generation prompt already. */
static void r_llama2(struct sb *b, const struct turn *t, size_t n, bool gen)
{
	(void)gen;
	bool open = true;   /* inside "[INST] ..." that the BOS began */
	sb_str(b, "[INST] ");
	for (size_t i = 0; i < n; i++) {
		if (!open) {
			sb_str(b, "<s>[INST] ");
			open = true;
		}
		switch (t[i].role) {
		case R_SYSTEM:
			sb_str(b, "<<SYS>>\n");
			sb_trim(b, t[i].content);
			sb_str(b, "\n<</SYS>>\n\n");
			break;
		case R_USER:
			sb_trim(b, t[i].content);
			sb_str(b, " [/INST]");
			break;
		case R_ASSISTANT:
			sb_str(b, " ");
			sb_trim(b, t[i].content);
			sb_str(b, " </s>");
			open = false;
			break;
		}
	}
}

/* Llama 3 instruct (meta-llama/Meta-Llama-3-8B-Instruct):
 *   <|start_header_id|>ROLE<|end_header_id|>\n\nTRIMMED<|eot_id|> per turn,
 *   then <|start_header_id|>assistant<|end_header_id|>\n\n. */
static void r_llama3(struct sb *b, const struct turn *t, size_t n, bool gen)
{
	static const char *const names[] = { "system", "user", "assistant" };
	for (size_t i = 0; i < n; i++) {
		sb_str(b, "<|start_header_id|>");
		sb_str(b, names[t[i].role]);
		sb_str(b, "<|end_header_id|>\n\n");
		sb_trim(b, t[i].content);
		sb_str(b, "<|eot_id|>");
	}
	if (gen)
		sb_str(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

/* ChatML (Qwen/Qwen2-7B-Instruct, without its default system prompt):
 *   <|im_start|>ROLE\nCONTENT<|im_end|>\n per turn, then
 *   <|im_start|>assistant\n. */
static void r_chatml(struct sb *b, const struct turn *t, size_t n, bool gen)
{
	static const char *const names[] = { "system", "user", "assistant" };
	for (size_t i = 0; i < n; i++) {
		sb_str(b, "<|im_start|>");
		sb_str(b, names[t[i].role]);
		sb_str(b, "\n");
		sb_str(b, t[i].content);
		sb_str(b, "<|im_end|>\n");
	}
	if (gen)
		sb_str(b, "<|im_start|>assistant\n");
}

/* Mistral 7B Instruct v0.1/v0.2 (mistralai/Mistral-7B-Instruct-v0.2):
 *   [INST] U1 [/INST]A1</s>[INST] U2 [/INST]
 * (the first <s> is the tokenizer's). v0.1 refuses a system message;
 * we put it before the first user message with a blank line, as the
 * later Mistral templates do. */
static void r_mistral(struct sb *b, const struct turn *t, size_t n, bool gen)
{
	(void)gen;
	const char *sys = NULL;
	for (size_t i = 0; i < n; i++) {
		switch (t[i].role) {
		case R_SYSTEM:
			sys = t[i].content;
			break;
		case R_USER:
			sb_str(b, "[INST] ");
			if (sys) {
				sb_str(b, sys);
				sb_str(b, "\n\n");
				sys = NULL;
			}
			sb_str(b, t[i].content);
			sb_str(b, " [/INST]");
			break;
		case R_ASSISTANT:
			sb_str(b, t[i].content);
			sb_str(b, "</s>");
			break;
		}
	}
}

/* Gemma (google/gemma-2-9b-it; a system message goes before the first
 * user message with a blank line, as gemma-3's template does):
 *   <start_of_turn>user\nTRIMMED<end_of_turn>\n
 *   <start_of_turn>model\nTRIMMED<end_of_turn>\n, then <start_of_turn>model\n */
static void r_gemma(struct sb *b, const struct turn *t, size_t n, bool gen)
{
	const char *sys = NULL;
	for (size_t i = 0; i < n; i++) {
		if (t[i].role == R_SYSTEM) {
			sys = t[i].content;
			continue;
		}
		sb_str(b, t[i].role == R_USER ? "<start_of_turn>user\n"
					      : "<start_of_turn>model\n");
		if (sys && t[i].role == R_USER) {
			sb_str(b, sys);
			sb_str(b, "\n\n");
			sys = NULL;
		}
		sb_trim(b, t[i].content);
		sb_str(b, "<end_of_turn>\n");
	}
	if (gen)
		sb_str(b, "<start_of_turn>model\n");
}

/* Phi-3 (microsoft/Phi-3-mini-4k-instruct, later revision):
 *   <|ROLE|>\nCONTENT<|end|>\n per turn, then <|assistant|>\n. Without the
 * generation prompt the reference appends eos_token; we do not (the
 * rendered text is a prompt, never a finished conversation). */
static void r_phi3(struct sb *b, const struct turn *t, size_t n, bool gen)
{
	static const char *const tags[] = { "<|system|>\n", "<|user|>\n",
					    "<|assistant|>\n" };
	for (size_t i = 0; i < n; i++) {
		sb_str(b, tags[t[i].role]);
		sb_str(b, t[i].content);
		sb_str(b, "<|end|>\n");
	}
	if (gen)
		sb_str(b, "<|assistant|>\n");
}

/* DeepSeek LLM / V2 chat (deepseek-ai/deepseek-llm-7b-chat):
 *   SYSTEM\n\n  User: U\n\n  Assistant: A<｜end▁of▁sentence｜>  then
 *   "Assistant:" (the first BOS is the tokenizer's). */
static void r_deepseek(struct sb *b, const struct turn *t, size_t n, bool gen)
{
	for (size_t i = 0; i < n; i++) {
		switch (t[i].role) {
		case R_SYSTEM:
			sb_str(b, t[i].content);
			sb_str(b, "\n\n");
			break;
		case R_USER:
			sb_str(b, "User: ");
			sb_str(b, t[i].content);
			sb_str(b, "\n\n");
			break;
		case R_ASSISTANT:
			sb_str(b, "Assistant: ");
			sb_str(b, t[i].content);
			sb_str(b, "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence"
				  "\xef\xbd\x9c>");
			break;
		}
	}
	if (gen)
		sb_str(b, "Assistant:");
}

struct chat_format_row {
	const char *name;
	/* recognition: all of need, none of refuse (NULL-terminated) */
	const char *need[4];
	const char *refuse[4];
	bool sys_first;     /* a system message may only be the first */
	bool alternate;     /* user, assistant, user, ... after it */
	void (*render)(struct sb *b, const struct turn *t, size_t n, bool gen);
	/* the control markers the render writes around contents: a turn
	 * cannot be forged only when each is one control token of the
	 * vocabulary (chat_format_check) */
	const char *markers[7];
};

static const struct chat_format_row formats[CHAT__N] = {
	[CHAT_NONE] = { .name = "none" },
	[CHAT_LLAMA2] = { "llama2", { "[INST]", "<<SYS>>" }, { NULL },
			  true, true, r_llama2,
			  { "[INST]", "[/INST]", "<<SYS>>", "<</SYS>>", "<s>", "</s>" } },
	[CHAT_LLAMA3] = { "llama3",
			  { "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>" },
			  { NULL }, false, false, r_llama3,
			  { "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>" } },
	[CHAT_CHATML] = { "chatml", { "<|im_start|>", "<|im_end|>" }, { NULL },
			  false, false, r_chatml, { "<|im_start|>", "<|im_end|>" } },
	/* v0.3 writes "[/INST]" without the space and v7 has
	 * [SYSTEM_PROMPT]: other formats */
	[CHAT_MISTRAL] = { "mistral", { "[INST] ", " [/INST]" },
			   { "<<SYS>>", "[AVAILABLE_TOOLS]", "[SYSTEM_PROMPT]" },
			   true, true, r_mistral, { "[INST]", "[/INST]", "</s>" } },
	[CHAT_GEMMA] = { "gemma", { "<start_of_turn>", "<end_of_turn>" }, { NULL },
			 true, true, r_gemma, { "<start_of_turn>", "<end_of_turn>" } },
	[CHAT_PHI3] = { "phi3", { "<|user|>", "<|assistant|>", "<|end|>" }, { NULL },
			false, false, r_phi3,
			{ "<|system|>", "<|user|>", "<|assistant|>", "<|end|>" } },
	/* DeepSeek V3's <｜User｜> turns are another format */
	[CHAT_DEEPSEEK] = { "deepseek", { "User: ", "Assistant: ", "Assistant:" },
			    { "<\xef\xbd\x9cUser\xef\xbd\x9c>" },
			    false, false, r_deepseek,
			    { "User:", "Assistant:",
			      "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence" "\xef\xbd\x9c>" } },
};

/* chat_format_template(): one short Jinja source per format, written for
 * kvd's generated models (kvctl model make --chat-template). \n is the
 * two characters of a Jinja escape. */
static const char *const format_src[CHAT__N] = {
	[CHAT_LLAMA2] =
		"{% for m in messages %}{% if m['role'] == 'system' %}{{ '<<SYS>>\\n' + m['content'] + '\\n<</SYS>>\\n\\n' }}{% elif m['role'] == 'user' %}{{ bos_token + '[INST] ' + m['content'] + ' [/INST]' }}{% else %}{{ ' ' + m['content'] + ' ' + eos_token }}{% endif %}{% endfor %}",
	[CHAT_LLAMA3] =
		"{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + m['content'] | trim + '<|eot_id|>' }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}",
	[CHAT_CHATML] =
		"{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
	[CHAT_MISTRAL] =
		"{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}{{ '[INST] ' + m['content'] + ' [/INST]' }}{% else %}{{ m['content'] + eos_token }}{% endif %}{% endfor %}",
	[CHAT_GEMMA] =
		"{% for m in messages %}{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\\n' + m['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}",
	[CHAT_PHI3] =
		"{% for m in messages %}{% if m['role'] == 'user' %}{{ '<|user|>\\n' }}{% elif m['role'] == 'assistant' %}{{ '<|assistant|>\\n' }}{% else %}{{ '<|system|>\\n' }}{% endif %}{{ m['content'] + '<|end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}",
	[CHAT_DEEPSEEK] =
		"{% for m in messages %}{% if m['role'] == 'user' %}{{ 'User: ' + m['content'] + '\\n\\n' }}{% elif m['role'] == 'assistant' %}{{ 'Assistant: ' + m['content'] + eos_token }}{% else %}{{ m['content'] + '\\n\\n' }}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}",
};

/* ---- public --------------------------------------------------------------- */

const char *chat_format_template(enum chat_format f)
{
	return (unsigned)f < CHAT__N ? format_src[f] : NULL;
}

const char *chat_format_name(enum chat_format f)
{
	if ((unsigned)f >= CHAT__N)
		return "?";
	return formats[f].name;
}

int chat_format_by_name(const char *name, enum chat_format *out)
{
	if (!name || !out)
		return -EINVAL;
	for (unsigned i = 0; i < CHAT__N; i++) {
		if (strcmp(name, formats[i].name) == 0) {
			*out = (enum chat_format)i;
			return 0;
		}
	}
	return -ENOENT;
}

static bool row_matches(const struct chat_format_row *r, const char *src)
{
	if (!r->render)
		return false;
	for (unsigned i = 0; i < 4 && r->need[i]; i++)
		if (!strstr(src, r->need[i]))
			return false;
	for (unsigned i = 0; i < 4 && r->refuse[i]; i++)
		if (strstr(src, r->refuse[i]))
			return false;
	return true;
}

int chat_format_detect(const char *jinja_src, enum chat_format *out)
{
	if (!out)
		return -EINVAL;
	*out = CHAT_NONE;
	if (!jinja_src)
		return -EINVAL;
	enum chat_format found = CHAT_NONE;
	unsigned hits = 0;
	for (unsigned i = 1; i < CHAT__N; i++) {
		if (row_matches(&formats[i], jinja_src)) {
			found = (enum chat_format)i;
			hits++;
		}
	}
	if (hits != 1)
		return -ENOENT;   /* none, or ambiguous: never guess */
	*out = found;
	return 0;
}

static int fail(char *err, size_t errlen, int code, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static int fail(char *err, size_t errlen, int code, const char *fmt, ...)
{
	if (err && errlen) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
	}
	return code;
}

/* Check the turns against the format's rules and map the roles. */
static int check_turns(const struct chat_format_row *row,
		       const struct chat_msg *msgs, size_t n, struct turn *t,
		       char *err, size_t errlen)
{
	size_t k = 0;   /* index among the non-system turns */
	for (size_t i = 0; i < n; i++) {
		if (!msgs[i].role || !msgs[i].content)
			return fail(err, errlen, -EINVAL,
				    "message %zu has no role or no content", i);
		if (strcmp(msgs[i].role, "system") == 0)
			t[i].role = R_SYSTEM;
		else if (strcmp(msgs[i].role, "user") == 0)
			t[i].role = R_USER;
		else if (strcmp(msgs[i].role, "assistant") == 0)
			t[i].role = R_ASSISTANT;
		else
			/* the role is the client's string: not echoed */
			return fail(err, errlen, -EINVAL,
				    "message %zu has an unknown role (system, user or assistant)",
				    i);
		t[i].content = msgs[i].content;
		if (t[i].role == R_SYSTEM) {
			if (row->sys_first && i != 0)
				return fail(err, errlen, -EINVAL,
					    "message %zu: the %s format takes a system message only first",
					    i, row->name);
			continue;
		}
		if (row->alternate &&
		    t[i].role != (k % 2 == 0 ? R_USER : R_ASSISTANT))
			return fail(err, errlen, -EINVAL,
				    "message %zu: the %s format needs user and assistant turns to alternate, starting with user",
				    i, row->name);
		k++;
	}
	if (row->alternate && k == 0)
		return fail(err, errlen, -EINVAL,
			    "the %s format needs a user message", row->name);
	return 0;
}

int chat_render(enum chat_format f, const struct chat_msg *msgs, size_t n,
		bool add_generation_prompt, char **out, size_t *len,
		char *err, size_t errlen)
{
	if (err && errlen)
		err[0] = '\0';
	if (!out || !len)
		return -EINVAL;
	*out = NULL;
	*len = 0;
	if ((unsigned)f >= CHAT__N || !formats[f].render)
		return fail(err, errlen, -ENOENT,
			    "the model has no chat template kvd knows (set model.chat_template)");
	if (n == 0 || !msgs)
		return fail(err, errlen, -EINVAL, "no messages");
	if (n > CHAT_TEXT_MAX / 16)
		return fail(err, errlen, -E2BIG, "%zu messages is too many", n);
	const struct chat_format_row *row = &formats[f];
	struct turn *t = calloc(n, sizeof *t);
	if (!t)
		return fail(err, errlen, -ENOMEM, "out of memory");
	int rc = check_turns(row, msgs, n, t, err, errlen);
	if (rc) {
		free(t);
		return rc;
	}
	struct sb b = { 0 };
	sb_put(&b, "", 0);   /* an empty render is still a string */
	row->render(&b, t, n, add_generation_prompt);
	free(t);
	if (b.err) {
		free(b.p);
		return fail(err, errlen, b.err, b.err == -E2BIG
			    ? "the conversation is longer than %u bytes"
			    : "out of memory (%u)", CHAT_TEXT_MAX);
	}
	*out = b.p;
	*len = b.len;
	return 0;
}

/* A control token's text inside content would be parsed as that token
 * once the whole prompt is encoded with specials: refuse it. */
static int check_specials(const struct tokenizer *tok,
			  const struct chat_msg *msgs, size_t n,
			  char *err, size_t errlen)
{
	uint32_t nv = tokenizer_n_vocab(tok);
	for (uint32_t id = 0; id < nv; id++) {
		enum tokenizer_type ty = tokenizer_token_type(tok, (int32_t)id);
		if (ty != TOKEN_TYPE_CONTROL && ty != TOKEN_TYPE_UNKNOWN)
			continue;
		const char *p;
		size_t l;
		if (tokenizer_token_text(tok, (int32_t)id, &p, &l) || l == 0)
			continue;
		for (size_t i = 0; i < n; i++) {
			const char *c = msgs[i].content;
			for (const char *h = strchr(c, p[0]); h; h = strchr(h + 1, p[0])) {
				if (strncmp(h, p, l) == 0)
					return fail(err, errlen, -EPERM,
						    "message %zu contains the text of control token %u",
						    i, id);
			}
		}
	}
	return 0;
}

int chat_encode(enum chat_format f, const struct tokenizer *tok,
		const struct chat_msg *msgs, size_t n,
		bool add_generation_prompt, int32_t **ids, size_t *n_ids,
		char *err, size_t errlen)
{
	if (!tok || !ids || !n_ids)
		return -EINVAL;
	*ids = NULL;
	*n_ids = 0;
	char *text;
	size_t len;
	int rc = chat_render(f, msgs, n, add_generation_prompt, &text, &len,
			     err, errlen);
	if (rc)
		return rc;
	rc = check_specials(tok, msgs, n, err, errlen);
	if (rc == 0) {
		unsigned flags = TOKENIZER_PARSE_SPECIAL;
		if (tokenizer_add_bos(tok))
			flags |= TOKENIZER_ADD_BOS;
		rc = tokenizer_encode_ex(tok, text, len, flags, ids, n_ids);
		if (rc)
			fail(err, errlen, rc, "tokenizing the chat prompt failed (%d)", rc);
	}
	free(text);
	return rc;
}

/* A marker is safe when the vocabulary has it as one control token:
 * the tokenizer makes it only from the template's own text (contents
 * holding it are refused, check_specials). Spelled out in pieces of
 * ordinary text, the same ids come from a content as from the
 * template: a tenant could write a system turn. */
static bool marker_is_control(const struct tokenizer *tok, const char *marker)
{
	int32_t *ids = NULL;
	size_t n = 0;
	bool ok;

	if (tokenizer_encode_ex(tok, marker, strlen(marker),
				TOKENIZER_PARSE_SPECIAL, &ids, &n))
		return false;
	ok = n == 1 && tokenizer_token_type(tok, ids[0]) == TOKEN_TYPE_CONTROL;
	free(ids);
	return ok;
}

int chat_format_check(enum chat_format f, const struct tokenizer *tok,
		      char *err, size_t errlen)
{
	if (err && errlen)
		err[0] = '\0';
	if (!tok)
		return -EINVAL;
	if ((unsigned)f >= CHAT__N || !formats[f].render)
		return fail(err, errlen, -ENOENT, "no chat format");
	for (unsigned i = 0; i < 7 && formats[f].markers[i]; i++) {
		const char *mk = formats[f].markers[i];

		if (!marker_is_control(tok, mk))
			return fail(err, errlen, -ENOTSUP,
				    "the %s format's marker \"%s\" is not one control token of the vocabulary: a message could spell out a turn",
				    formats[f].name, mk);
	}
	return 0;
}
