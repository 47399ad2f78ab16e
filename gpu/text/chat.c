/* chat.c - built-in chat templates.
 *
 * Design. A GGUF carries its chat template as Jinja source
 * (tokenizer.chat_template). Running Jinja would mean a template engine
 * in the daemon fed by files from anywhere; instead kvd knows the eight
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
#include "conf/util.h"

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

/* s (NUL-terminated) as a JSON string, as Jinja's tojson (json.dumps)
 * writes it: kvd_json_str's escapes (control bytes as \u00xx). */
static void sb_json_str(struct sb *b, const char *s)
{
	char *p = NULL;
	size_t n = 0;
	FILE *f = b->err ? NULL : open_memstream(&p, &n);

	if (!f) {
		if (!b->err)
			b->err = -ENOMEM;
		return;
	}
	kvd_json_str(f, s, strlen(s));
	if (fclose(f) || !p)
		b->err = b->err ? b->err : -ENOMEM;
	else
		sb_put(b, p, n);
	free(p);
}

/* ---- roles ---------------------------------------------------------------- */

enum role { R_SYSTEM, R_USER, R_ASSISTANT, R_TOOL };

struct turn {
	enum role role;
	const char *content;
	const char *call_id;             /* tool: the call it answers, or NULL */
	const struct chat_call *calls;   /* assistant: (n_calls) */
	size_t n_calls;
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
		case R_TOOL:   /* never: the format has no tool syntax (role_of) */
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
		case R_TOOL:   /* never: the format has no tool syntax (role_of) */
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
		case R_TOOL:   /* never: the format has no tool syntax (role_of) */
			break;
		}
	}
	if (gen)
		sb_str(b, "Assistant:");
}

/* ---- tools ---------------------------------------------------------------- */

/* Llama 3.1 instruct's JSON tool calling (meta-llama/Llama-3.1-8B-Instruct,
 * custom tools, tools_in_user_message as its default):
 *   <|start_header_id|>system<|end_header_id|>\n\n
 *   [Environment: ipython\n when tools are offered]
 *   Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n
 *   SYSTEM|trim<|eot_id|>
 * then, with tools, the first user message carries them: its header, the
 * instruction, each tool as tojson(indent=4) + "\n\n", the content|trim,
 * <|eot_id|>. An assistant call is {"name": "N", "parameters": ARGS} in an
 * assistant turn; a result is tojson(content) in the ipython turn (a
 * string is iterable in Jinja: the template quotes it). The date is the
 * template's default, never the clock: the prompt is a function of the
 * request (invariant 9). */
static const char LLAMA31_TOOLS_INTRO[] =
	"Given the following functions, please respond with a JSON for a "
	"function call with its proper arguments that best answers the given "
	"prompt.\n\nRespond in the format {\"name\": function name, "
	"\"parameters\": dictionary of argument name and its value}.Do not use "
	"variables.\n\n";

static void llama31_header(struct sb *b, const char *role)
{
	sb_str(b, "<|start_header_id|>");
	sb_str(b, role);
	sb_str(b, "<|end_header_id|>\n\n");
}

static void llama31_turn(struct sb *b, const struct turn *t)
{
	static const char *const names[] = { "system", "user", "assistant" };

	if (t->role == R_TOOL) {
		llama31_header(b, "ipython");
		sb_json_str(b, t->content);
	} else if (t->n_calls) {
		llama31_header(b, "assistant");
		sb_str(b, "{\"name\": \"");
		sb_str(b, t->calls[0].name);
		sb_str(b, "\", \"parameters\": ");
		sb_str(b, t->calls[0].arguments);
		sb_str(b, "}");
	} else {
		llama31_header(b, names[t->role]);
		sb_trim(b, t->content);
	}
	sb_str(b, "<|eot_id|>");
}

static void r_llama31(struct sb *b, const struct turn *t, size_t n,
		      const struct chat_tool *tools, size_t n_tools, bool gen)
{
	size_t i = 0;

	llama31_header(b, "system");
	if (n_tools)
		sb_str(b, "Environment: ipython\n");
	sb_str(b, "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n");
	if (n && t[0].role == R_SYSTEM)
		sb_trim(b, t[i++].content);
	sb_str(b, "<|eot_id|>");
	if (n_tools) {   /* t[i] is a user turn (check_tool_turns) */
		llama31_header(b, "user");
		sb_str(b, LLAMA31_TOOLS_INTRO);
		for (size_t k = 0; k < n_tools; k++) {
			sb_str(b, tools[k].json_indent);
			sb_str(b, "\n\n");
		}
		sb_trim(b, t[i++].content);
		sb_str(b, "<|eot_id|>");
	}
	for (; i < n; i++)
		llama31_turn(b, &t[i]);
	if (gen)
		llama31_header(b, "assistant");
}

/* Qwen2.5 instruct's tool calling (Qwen/Qwen2.5-7B-Instruct; the Hermes
 * convention): with tools the system turn is the system message (none:
 * kvd invents no default prompt, so the section opens the turn) and
 *   \n\n# Tools\n\n...<tools>\nTOOL\nTOOL\n</tools>\n\n...<|im_end|>\n
 * (each tool tojson); an assistant turn with calls is its content (if
 * any) then \n<tool_call>\n{"name": "N", "arguments": ARGS}\n</tool_call>
 * per call; consecutive "tool" results share one user turn, each
 * \n<tool_response>\nCONTENT\n</tool_response>. Contents are not trimmed. */
static const char QWEN_TOOLS_HEAD[] =
	"# Tools\n\nYou may call one or more functions to assist with the user "
	"query.\n\nYou are provided with function signatures within "
	"<tools></tools> XML tags:\n<tools>";
static const char QWEN_TOOLS_TAIL[] =
	"\n</tools>\n\nFor each function call, return a json object with "
	"function name and arguments within <tool_call></tool_call> XML tags:"
	"\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
	"<args-json-object>}\n</tool_call><|im_end|>\n";

static void qwen_calls(struct sb *b, const struct turn *t)
{
	sb_str(b, "<|im_start|>assistant");
	if (t->content[0]) {
		sb_str(b, "\n");
		sb_str(b, t->content);
	}
	for (size_t k = 0; k < t->n_calls; k++) {
		sb_str(b, "\n<tool_call>\n{\"name\": \"");
		sb_str(b, t->calls[k].name);
		sb_str(b, "\", \"arguments\": ");
		sb_str(b, t->calls[k].arguments);
		sb_str(b, "}\n</tool_call>");
	}
	sb_str(b, "<|im_end|>\n");
}

static void qwen_turn(struct sb *b, const struct turn *t, size_t i, size_t n)
{
	static const char *const names[] = { "system", "user", "assistant" };

	if (t[i].role == R_TOOL) {
		if (i == 0 || t[i - 1].role != R_TOOL)
			sb_str(b, "<|im_start|>user");
		sb_str(b, "\n<tool_response>\n");
		sb_str(b, t[i].content);
		sb_str(b, "\n</tool_response>");
		if (i + 1 == n || t[i + 1].role != R_TOOL)
			sb_str(b, "<|im_end|>\n");
	} else if (t[i].n_calls) {
		qwen_calls(b, &t[i]);
	} else {
		sb_str(b, "<|im_start|>");
		sb_str(b, names[t[i].role]);
		sb_str(b, "\n");
		sb_str(b, t[i].content);
		sb_str(b, "<|im_end|>\n");
	}
}

static void r_qwen_tools(struct sb *b, const struct turn *t, size_t n,
			 const struct chat_tool *tools, size_t n_tools, bool gen)
{
	size_t i = 0;

	if (n_tools) {
		sb_str(b, "<|im_start|>system\n");
		if (n && t[0].role == R_SYSTEM) {
			sb_str(b, t[i++].content);
			sb_str(b, "\n\n");
		}
		sb_str(b, QWEN_TOOLS_HEAD);
		for (size_t k = 0; k < n_tools; k++) {
			sb_str(b, "\n");
			sb_str(b, tools[k].json);
		}
		sb_str(b, QWEN_TOOLS_TAIL);
	}
	for (; i < n; i++)
		qwen_turn(b, t, i, n);
	if (gen)
		sb_str(b, "<|im_start|>assistant\n");
}

/* Mistral 7B Instruct v0.3 (mistralai/Mistral-7B-Instruct-v0.3; the v3
 * template Mixtral-8x22B-Instruct shares), tools or not:
 *   [INST] U1[/INST] A1|trim</s>...[AVAILABLE_TOOLS] [T, T][/AVAILABLE_TOOLS]
 *   [INST] SYSTEM\n\nUn[/INST]
 * The tools go once, before the last user message by index (as
 * mistral_common and vLLM; the template compares the messages by value
 * and renders them before any user message equal to the last one too,
 * which repeats a body's tools for each: not here); each is
 * {"type": "function", "function": F}. The system
 * message goes into the last message when that is a user message, and
 * is not rendered otherwise (the template drops it). An assistant call
 * message is [TOOL_CALLS] [{"name": N, "arguments": ARGS, "id": ID},
 * ...]</s> (its content is not rendered, as in the template); a result
 * is [TOOL_RESULTS] {"content": CONTENT, "call_id": ID}[/TOOL_RESULTS]
 * with the content as the template writes it (as is: a JSON result
 * stays JSON). IDs are Mistral's 9 characters (chat_mistral_id). The
 * template writes a tool's string values unescaped; kvd writes JSON
 * (the same text unless a string holds a character JSON escapes). */
static void mistral3_tools(struct sb *b, const struct chat_tool *tools,
			   size_t n_tools)
{
	sb_str(b, "[AVAILABLE_TOOLS] [");
	for (size_t k = 0; k < n_tools; k++) {
		sb_str(b, "{\"type\": \"function\", \"function\": ");
		sb_str(b, tools[k].function_json);
		sb_str(b, k + 1 < n_tools ? "}, " : "}]");
	}
	sb_str(b, "[/AVAILABLE_TOOLS]");
}

static void mistral3_id(struct sb *b, const char *id)
{
	char m[CHAT_MISTRAL_ID_LEN + 1];

	chat_mistral_id(id, m);
	sb_str(b, m);
}

static void mistral3_calls(struct sb *b, const struct turn *t)
{
	sb_str(b, "[TOOL_CALLS] [");
	for (size_t k = 0; k < t->n_calls; k++) {
		sb_str(b, "{\"name\": \"");
		sb_str(b, t->calls[k].name);
		sb_str(b, "\", \"arguments\": ");
		sb_str(b, t->calls[k].arguments);
		sb_str(b, ", \"id\": \"");
		mistral3_id(b, t->calls[k].id);
		sb_str(b, k + 1 < t->n_calls ? "\"}, " : "\"}]");
	}
	sb_str(b, "</s>");
}

static void mistral3_turn(struct sb *b, const struct turn *t, const char *sys)
{
	switch (t->role) {
	case R_USER:
		sb_str(b, "[INST] ");
		if (sys) {
			sb_str(b, sys);
			sb_str(b, "\n\n");
		}
		sb_str(b, t->content);
		sb_str(b, "[/INST]");
		break;
	case R_ASSISTANT:
		if (t->n_calls) {
			mistral3_calls(b, t);
			break;
		}
		sb_str(b, " ");
		sb_trim(b, t->content);
		sb_str(b, "</s>");
		break;
	case R_TOOL:
		sb_str(b, "[TOOL_RESULTS] {\"content\": ");
		sb_str(b, t->content);
		sb_str(b, ", \"call_id\": \"");
		mistral3_id(b, t->call_id);
		sb_str(b, "\"}[/TOOL_RESULTS]");
		break;
	case R_SYSTEM:   /* never: only first (sys_first), taken apart */
		break;
	}
}

static void r_mistral3_tools(struct sb *b, const struct turn *t, size_t n,
			     const struct chat_tool *tools, size_t n_tools,
			     bool gen)
{
	const char *sys = n && t[0].role == R_SYSTEM ? t[0].content : NULL;
	size_t last_user = n;

	(void)gen;   /* the user turn ends with [/INST] */
	/* the tools before the last user message by index, as mistral_common
	 * and vLLM render them (the template's `message == user_messages[-1]`
	 * also matches every user message equal to the last: the tools
	 * again before each, a body's tools times its messages) */
	for (size_t i = 0; i < n; i++)
		if (t[i].role == R_USER)
			last_user = i;
	for (size_t i = sys ? 1 : 0; i < n; i++) {
		if (n_tools && i == last_user)
			mistral3_tools(b, tools, n_tools);
		mistral3_turn(b, &t[i], i + 1 == n ? sys : NULL);
	}
}

static void r_mistral3(struct sb *b, const struct turn *t, size_t n, bool gen)
{
	r_mistral3_tools(b, t, n, NULL, 0, gen);
}

typedef void render_tools_fn(struct sb *b, const struct turn *t, size_t n,
			     const struct chat_tool *tools, size_t n_tools,
			     bool gen);

#define CHAT_MARKERS_MAX 9u   /* a row's markers, NULL-terminated */

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
	const char *markers[CHAT_MARKERS_MAX];
	/* the format's tool syntax (NULL: none), and its rules */
	render_tools_fn *render_tools;
	size_t max_calls;   /* per assistant message; 0 unbounded */
	bool tools_in_first_user;   /* the tools go into the first user turn */
	bool tools_function_json;   /* renders chat_tool.function_json */
};

static const struct chat_format_row formats[CHAT__N] = {
	[CHAT_NONE] = { .name = "none" },
	[CHAT_LLAMA2] = { "llama2", { "[INST]", "<<SYS>>" }, { NULL },
			  true, true, r_llama2,
			  { "[INST]", "[/INST]", "<<SYS>>", "<</SYS>>", "<s>", "</s>" } },
	[CHAT_LLAMA3] = { "llama3",
			  { "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>" },
			  { NULL }, false, false, r_llama3,
			  { "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>" },
			  r_llama31, 1, true },
	[CHAT_CHATML] = { "chatml", { "<|im_start|>", "<|im_end|>" }, { NULL },
			  false, false, r_chatml, { "<|im_start|>", "<|im_end|>" },
			  r_qwen_tools, 0, false },
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
	/* the spacing is v0.3's ("[TOOL_CALLS] [", "[AVAILABLE_TOOLS] ["):
	 * Mistral Nemo's template writes them without, and renders turns
	 * differently, so it is not recognized; alternation skips the tool
	 * results and call messages, as the template's check does */
	[CHAT_MISTRAL_V3] = { "mistral_v3",
			      { "[INST] ", "[/INST]", "[AVAILABLE_TOOLS] [", "[TOOL_CALLS] [" },
			      { "<<SYS>>", "[SYSTEM_PROMPT]" },
			      true, true, r_mistral3,
			      { "[INST]", "[/INST]", "</s>", "[AVAILABLE_TOOLS]",
				"[/AVAILABLE_TOOLS]", "[TOOL_CALLS]", "[TOOL_RESULTS]",
				"[/TOOL_RESULTS]" },
			      r_mistral3_tools, 0, false, true },
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
	/* tools and ids left out: kvd renders them (r_mistral3_tools) */
	[CHAT_MISTRAL_V3] =
		"{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}{% if tools is defined and tools %}{{ '[AVAILABLE_TOOLS] [' + tools | map('tojson') | join(', ') + '][/AVAILABLE_TOOLS]' }}{% endif %}{{ '[INST] ' + m['content'] + '[/INST]' }}{% elif m['tool_calls'] is defined %}{{ '[TOOL_CALLS] [' + m['tool_calls'] | map(attribute='function') | map('tojson') | join(', ') + ']' + eos_token }}{% elif m['role'] == 'tool' %}{{ '[TOOL_RESULTS] {\"content\": ' + m['content'] + '}[/TOOL_RESULTS]' }}{% else %}{{ ' ' + m['content'] | trim + eos_token }}{% endif %}{% endfor %}",
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

/* The role of a message: 0 and *r; -1 for an unknown role. "tool" is a
 * role of the formats with a tool syntax only. */
static int role_of(const struct chat_format_row *row, const char *name,
		   enum role *r)
{
	static const char *const names[] = { "system", "user", "assistant", "tool" };

	for (unsigned i = 0; i < 4; i++) {
		if (strcmp(name, names[i]))
			continue;
		if (i == R_TOOL && !row->render_tools)
			return -1;
		*r = (enum role)i;
		return 0;
	}
	return -1;
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
		if (role_of(row, msgs[i].role, &t[i].role))
			/* the role is the client's string: not echoed */
			return fail(err, errlen, -EINVAL,
				    "message %zu has an unknown role (system, user or assistant%s)",
				    i, row->render_tools ? ", tool" : "");
		t[i].content = msgs[i].content;
		if (t[i].role == R_SYSTEM) {
			if (row->sys_first && i != 0)
				return fail(err, errlen, -EINVAL,
					    "message %zu: the %s format takes a system message only first",
					    i, row->name);
			continue;
		}
		if (row->render_tools && (t[i].role == R_TOOL || t[i].n_calls))
			continue;   /* outside the alternation (mistral_v3) */
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

/* The calls of the turns against the format's tool rules; *uses set when
 * the conversation needs the tool rendering (a call or a result). */
static int check_tool_turns(const struct chat_format_row *row,
			    const struct turn *t, size_t n, size_t n_tools,
			    bool *uses, char *err, size_t errlen)
{
	*uses = n_tools > 0;
	for (size_t i = 0; i < n; i++) {
		*uses |= t[i].role == R_TOOL || t[i].n_calls;
		if (t[i].n_calls && !row->render_tools)
			return fail(err, errlen, -EINVAL,
				    "message %zu: the %s format has no tool syntax", i, row->name);
		if (t[i].n_calls && t[i].role != R_ASSISTANT)
			return fail(err, errlen, -EINVAL,
				    "message %zu: only an assistant message calls tools", i);
		if (row->max_calls && t[i].n_calls > row->max_calls)
			return fail(err, errlen, -EINVAL,
				    "message %zu: the %s format takes %zu tool call per assistant message",
				    i, row->name, row->max_calls);
		for (size_t c = 0; c < t[i].n_calls; c++)
			if (!t[i].calls[c].name || !t[i].calls[c].arguments)
				return fail(err, errlen, -EINVAL,
					    "message %zu: call %zu has no name or no arguments", i, c);
	}
	if (n_tools && !row->render_tools)
		return fail(err, errlen, -EINVAL,
			    "the %s format has no tool syntax", row->name);
	if (n_tools && row->tools_in_first_user) {
		size_t f = n && t[0].role == R_SYSTEM ? 1 : 0;

		if (f >= n || t[f].role != R_USER)
			return fail(err, errlen, -EINVAL,
				    "the %s format puts the tools into the first user message: the conversation must open with one",
				    row->name);
	}
	return 0;
}

static int check_tools(const struct chat_format_row *row,
		       const struct chat_tool *tools, size_t n_tools,
		       char *err, size_t errlen)
{
	if (n_tools && !tools)
		return fail(err, errlen, -EINVAL, "no tools");
	for (size_t k = 0; k < n_tools; k++)
		if (!tools[k].json || !tools[k].json_indent ||
		    (row->tools_function_json && !tools[k].function_json))
			return fail(err, errlen, -EINVAL, "tool %zu has no JSON", k);
	return 0;
}

int chat_render(enum chat_format f, const struct chat_msg *msgs, size_t n,
		bool add_generation_prompt, char **out, size_t *len,
		char *err, size_t errlen)
{
	return chat_render_tools(f, msgs, n, NULL, add_generation_prompt, out,
				 len, err, errlen);
}

bool chat_format_tools(enum chat_format f)
{
	return (unsigned)f < CHAT__N && formats[f].render_tools;
}

/* The turns rendered in the row's format: with its tool syntax when the
 * conversation uses tools, else as before tools existed. */
static int render_turns(const struct chat_format_row *row,
			const struct chat_msg *msgs, size_t n,
			const struct chat_tools *tt, bool gen,
			struct sb *b, char *err, size_t errlen)
{
	struct turn *t = calloc(n, sizeof *t);
	size_t n_tools = tt ? tt->n_tools : 0;
	bool uses;
	int rc;

	if (!t)
		return fail(err, errlen, -ENOMEM, "out of memory");
	for (size_t i = 0; tt && tt->calls && i < n; i++) {
		t[i].calls = tt->calls[i];
		t[i].n_calls = tt->calls[i] ? tt->n_calls[i] : 0;
	}
	for (size_t i = 0; tt && tt->result_ids && i < n; i++)
		t[i].call_id = tt->result_ids[i];
	rc = check_turns(row, msgs, n, t, err, errlen);
	if (!rc)
		rc = check_tool_turns(row, t, n, n_tools, &uses, err, errlen);
	if (!rc) {
		sb_put(b, "", 0);   /* an empty render is still a string */
		if (uses)
			row->render_tools(b, t, n, n_tools ? tt->tools : NULL,
					  n_tools, gen);
		else
			row->render(b, t, n, gen);
	}
	free(t);
	return rc;
}

int chat_render_tools(enum chat_format f, const struct chat_msg *msgs,
		      size_t n, const struct chat_tools *tt,
		      bool add_generation_prompt, char **out, size_t *len,
		      char *err, size_t errlen)
{
	struct sb b = { 0 };
	int rc;

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
	if (n > CHAT_TEXT_MAX / 16 || (tt && tt->n_tools > CHAT_TEXT_MAX / 16))
		return fail(err, errlen, -E2BIG, "%zu messages is too many", n);
	rc = tt ? check_tools(&formats[f], tt->tools, tt->n_tools, err, errlen) : 0;
	if (!rc)
		rc = render_turns(&formats[f], msgs, n, tt,
				  add_generation_prompt, &b, err, errlen);
	if (rc) {
		free(b.p);
		return rc;
	}
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

/* Whether s holds the text p[0, l). */
static bool holds(const char *s, const char *p, size_t l)
{
	for (const char *h = strchr(s, p[0]); h; h = strchr(h + 1, p[0]))
		if (strncmp(h, p, l) == 0)
			return true;
	return false;
}

/* Whether message i renders an outside string holding p[0, l): its
 * content, its calls' names and arguments. */
static bool msg_holds(const struct chat_msg *msgs, size_t i,
		      const struct chat_tools *tt, const char *p, size_t l)
{
	const struct chat_call *c = tt && tt->calls ? tt->calls[i] : NULL;

	if (holds(msgs[i].content, p, l))
		return true;
	for (size_t k = 0; c && k < tt->n_calls[i]; k++)
		if (holds(c[k].name, p, l) || holds(c[k].arguments, p, l))
			return true;
	return false;
}

/* A control token's text inside an outside string (a content, a call, a
 * tool's JSON: name, description, schema) would be parsed as that token
 * once the whole prompt is encoded with specials: refuse it. */
static int check_specials(const struct tokenizer *tok,
			  const struct chat_msg *msgs, size_t n,
			  const struct chat_tools *tt, char *err, size_t errlen)
{
	size_t n_tools = tt ? tt->n_tools : 0;
	uint32_t nv = tokenizer_n_vocab(tok);
	for (uint32_t id = 0; id < nv; id++) {
		enum tokenizer_type ty = tokenizer_token_type(tok, (int32_t)id);
		if (ty != TOKEN_TYPE_CONTROL && ty != TOKEN_TYPE_UNKNOWN)
			continue;
		const char *p;
		size_t l;
		if (tokenizer_token_text(tok, (int32_t)id, &p, &l) || l == 0)
			continue;
		for (size_t i = 0; i < n; i++)
			if (msg_holds(msgs, i, tt, p, l))
				return fail(err, errlen, -EPERM,
					    "message %zu contains the text of control token %u",
					    i, id);
		for (size_t k = 0; k < n_tools; k++)
			if (holds(tt->tools[k].json, p, l) ||
			    holds(tt->tools[k].json_indent, p, l) ||
			    (tt->tools[k].function_json &&
			     holds(tt->tools[k].function_json, p, l)))
				return fail(err, errlen, -EPERM,
					    "tool %zu contains the text of control token %u",
					    k, id);
	}
	return 0;
}

int chat_encode(enum chat_format f, const struct tokenizer *tok,
		const struct chat_msg *msgs, size_t n,
		bool add_generation_prompt, int32_t **ids, size_t *n_ids,
		char *err, size_t errlen)
{
	return chat_encode_tools(f, tok, msgs, n, NULL, add_generation_prompt,
				 ids, n_ids, err, errlen);
}

int chat_encode_tools(enum chat_format f, const struct tokenizer *tok,
		      const struct chat_msg *msgs, size_t n,
		      const struct chat_tools *tt,
		      bool add_generation_prompt, int32_t **ids, size_t *n_ids,
		      char *err, size_t errlen)
{
	if (!tok || !ids || !n_ids)
		return -EINVAL;
	*ids = NULL;
	*n_ids = 0;
	char *text;
	size_t len;
	int rc = chat_render_tools(f, msgs, n, tt, add_generation_prompt, &text,
				   &len, err, errlen);
	if (rc)
		return rc;
	rc = check_specials(tok, msgs, n, tt, err, errlen);
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
	for (unsigned i = 0; i < CHAT_MARKERS_MAX && formats[f].markers[i]; i++) {
		const char *mk = formats[f].markers[i];

		if (!marker_is_control(tok, mk))
			return fail(err, errlen, -ENOTSUP,
				    "the %s format's marker \"%s\" is not one control token of the vocabulary: a message could spell out a turn",
				    formats[f].name, mk);
	}
	return 0;
}

static bool is_alnum(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
	       (c >= '0' && c <= '9');
}

void chat_mistral_id(const char *id, char out[CHAT_MISTRAL_ID_LEN + 1])
{
	static const char digits[] =
		"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
	size_t n = id ? strlen(id) : 0, k = CHAT_MISTRAL_ID_LEN;
	uint64_t h = UINT64_C(0xcbf29ce484222325);   /* FNV-1a 64 */

	out[k] = '\0';
	for (size_t i = n; i > 0 && k > 0; i--)   /* the last 9 alphanumerics */
		if (is_alnum(id[i - 1]))
			out[--k] = id[i - 1];
	if (k == 0)
		return;
	for (size_t i = 0; i < n; i++) {
		h ^= (uint8_t)id[i];
		h *= UINT64_C(0x100000001b3);
	}
	for (k = 0; k < CHAT_MISTRAL_ID_LEN; k++) {   /* 62^9 < 2^64 */
		out[k] = digits[h % 62];
		h /= 62;
	}
}
