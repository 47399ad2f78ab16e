/* chat.h - built-in chat templates: messages -> prompt text.
 *
 * kvd does not run Jinja. It knows eight chat formats as code and picks
 * one by recognizing the model's tokenizer.chat_template (distinctive
 * markers; an unknown or ambiguous template is -ENOENT, never a guess)
 * or by the config key model.chat_template.
 *
 * The rendered text holds the template's special tokens as text
 * ("<|im_start|>", "[INST]", "</s>") and never the first BOS: the
 * tokenizer adds that one. Encode it with chat_encode() (or with
 * tokenizer_encode_ex(TOKENIZER_PARSE_SPECIAL, plus TOKENIZER_ADD_BOS
 * when tokenizer_add_bos()), so the template's specials become their
 * control tokens. Because the whole text is parsed for specials,
 * chat_encode() refuses a message whose content holds the text of a
 * control token (-EPERM): a tenant cannot forge a turn.
 *
 * Pure functions of their arguments; any thread.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct tokenizer;

enum chat_format {
	CHAT_NONE = 0,     /* no template: chat is refused */
	CHAT_LLAMA2,       /* Llama 2 chat: [INST] <<SYS>> ... [/INST] */
	CHAT_LLAMA3,       /* Llama 3 instruct: <|start_header_id|> ... <|eot_id|> */
	CHAT_CHATML,       /* ChatML (Qwen): <|im_start|>role ... <|im_end|> */
	CHAT_MISTRAL,      /* Mistral 7B Instruct v0.1/v0.2: [INST] ... [/INST] */
	CHAT_GEMMA,        /* Gemma: <start_of_turn>user|model ... <end_of_turn> */
	CHAT_PHI3,         /* Phi-3: <|user|> ... <|end|> */
	CHAT_DEEPSEEK,     /* DeepSeek LLM / V2 chat: User: ... Assistant: */
	CHAT_MISTRAL_V3,   /* Mistral 7B Instruct v0.3 (tools): [INST] ...[/INST],
			    * [AVAILABLE_TOOLS], [TOOL_CALLS], [TOOL_RESULTS] */
	CHAT__N,
};

/* One tool call of an assistant message (formats with a tool syntax). */
struct chat_call {
	const char *name;      /* the function's name */
	const char *arguments; /* its arguments: a JSON object as text, as
				* Python's json.dumps writes it (", " and
				* ": "), rendered as given */
	const char *id;        /* the call's id (NULL: none); mistral_v3
				* renders it as its 9-character id
				* (chat_mistral_id) */
};

struct chat_msg {
	const char *role;      /* "system", "user", "assistant"; "tool" in
				* the formats with a tool syntax */
	const char *content;   /* NUL-terminated UTF-8 ("" for an assistant
				* message that only calls) */
};

/* A tool offered to the model, already serialized by the caller (the
 * templates print it with Jinja's tojson, which is json.dumps): the
 * whole object ({"type": "function", "function": {"name": ...,
 * "description": ..., "parameters": {...}}}) in the client's key order. */
struct chat_tool {
	const char *json;         /* ", " and ": " separators, one line */
	const char *json_indent;  /* the same, indented by 4 (Llama 3.1) */
	const char *function_json; /* its "function" object alone, ", " and
				    * ": " (mistral_v3 writes {"type":
				    * "function", "function": F}); NULL
				    * where the format does not need it */
};

/* What a conversation with tools adds to its messages. */
struct chat_tools {
	const struct chat_tool *tools;   /* (n_tools) offered; 0: none */
	size_t n_tools;
	const struct chat_call *const *calls;  /* NULL, or (n messages):
						* message i's calls ... */
	const size_t *n_calls;           /* ... (n_calls[i]), assistant only */
	const char *const *result_ids;   /* NULL, or (n messages): a "tool"
					  * message's tool_call_id (NULL:
					  * none); mistral_v3 renders it */
};

/* Recognize a tokenizer.chat_template source. 0 and *out set; -ENOENT
 * when no built-in format matches or more than one does (then *out is
 * CHAT_NONE); -EINVAL for a NULL source. */
int chat_format_detect(const char *jinja_src, enum chat_format *out);
/* A format by its config name ("llama2" .. "mistral_v3"; "none"); -ENOENT
 * for any other name ("auto" included: the caller resolves it). */
int chat_format_by_name(const char *name, enum chat_format *out);
/* "none", "llama2", ... ; "?" out of range. */
const char *chat_format_name(enum chat_format f);
/* A short Jinja source in format f (kvd's own, for generated models:
 * kvctl model make --chat-template) that chat_format_detect() recognizes
 * as f; NULL for CHAT_NONE and out of range. */
const char *chat_format_template(enum chat_format f);

/* Render msgs[0..n) in format f. *out is malloc'd and NUL-terminated,
 * *len its length; the caller frees it. add_generation_prompt appends the
 * assistant's opening (formats whose user turn already ends with it
 * ignore the flag). Errors, with a sentence in err (errlen may be 0):
 *   -ENOENT  f is CHAT_NONE or unknown (the model has no template)
 *   -EINVAL  no messages, a NULL role or content, an unknown role, a
 *            system message where the format does not take one, turns
 *            that do not alternate where the format needs them to
 *   -E2BIG   the text would exceed CHAT_TEXT_MAX bytes
 *   -ENOMEM
 * On error *out is NULL and *len 0. */
#define CHAT_TEXT_MAX (64u << 20)
int chat_render(enum chat_format f, const struct chat_msg *msgs, size_t n,
		bool add_generation_prompt, char **out, size_t *len,
		char *err, size_t errlen);

/* Whether format f has a tool syntax (tools rendered, assistant calls
 * and "tool" results in the conversation): llama3 (Llama 3.1's JSON
 * calls, results in the ipython role) and chatml (Qwen2.5 / Hermes:
 * <tools> in the system turn, <tool_call> blocks, <tool_response> in a
 * user turn) and mistral_v3 ([AVAILABLE_TOOLS] before the last user
 * turn, [TOOL_CALLS] [...] and [TOOL_RESULTS] {...} with 9-character call
 * ids). The others have none: Mistral v0.1/v0.2 included. */
bool chat_format_tools(enum chat_format f);

/* chat_render with tt's tools offered to the model (tt NULL or n_tools 0:
 * none, but the conversation may still hold calls and results). Beyond
 * chat_render's errors, -EINVAL (err says which) when the format has no
 * tool syntax and tools, a call or a "tool" message is given, or when
 * the format's own rule refuses the turns (llama3: the tools go into the
 * first user message, so one must open the conversation; one call per
 * assistant message). chat_render(...) is chat_render_tools(..., NULL, ...). */
int chat_render_tools(enum chat_format f, const struct chat_msg *msgs,
		      size_t n, const struct chat_tools *tt,
		      bool add_generation_prompt, char **out, size_t *len,
		      char *err, size_t errlen);

/* Whether format f can be served safely with tok: every control marker
 * the format writes around contents ("<|im_start|>", "[INST]", ...) is
 * one control token of the vocabulary, so no content can produce it
 * (chat_encode refuses a content holding a control token's text). 0;
 * -ENOTSUP (err names the first marker that is not: written as text,
 * a tenant can spell out a system turn that tokenizes exactly like the
 * template's); -ENOENT for CHAT_NONE; -EINVAL. The daemon refuses such
 * a template at boot unless model.chat_template_unsafe. */
int chat_format_check(enum chat_format f, const struct tokenizer *tok,
		      char *err, size_t errlen);

/* Mistral's tool call id for an OpenAI one: id itself when it is 9 of
 * [A-Za-z0-9]; else the last 9 of its alphanumeric characters when it
 * has that many (what vLLM sends for "call_..." ids); else 9 characters
 * of a hash of the whole id. Deterministic, so a call and the result
 * that names it map alike. out: 10 bytes, NUL-terminated. NULL is "". */
#define CHAT_MISTRAL_ID_LEN 9u
void chat_mistral_id(const char *id, char out[CHAT_MISTRAL_ID_LEN + 1]);

/* Render and tokenize as the model expects: BOS when the tokenizer adds
 * one, the template's specials as control tokens. -EPERM (err names the
 * message and token) when a message's content holds a control token's
 * text; otherwise chat_render's and tokenizer_encode_ex's errors. *ids
 * malloc'd. */
int chat_encode(enum chat_format f, const struct tokenizer *tok,
		const struct chat_msg *msgs, size_t n,
		bool add_generation_prompt, int32_t **ids, size_t *n_ids,
		char *err, size_t errlen);
/* chat_encode with tools (chat_render_tools). The control-token rule
 * covers every outside string rendered: contents, call names and
 * arguments, the tools' JSON (-EPERM, err names the message or tool). */
int chat_encode_tools(enum chat_format f, const struct tokenizer *tok,
		      const struct chat_msg *msgs, size_t n,
		      const struct chat_tools *tt,
		      bool add_generation_prompt, int32_t **ids, size_t *n_ids,
		      char *err, size_t errlen);
