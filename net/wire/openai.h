/* openai.h - OpenAI API request bodies (completions, chat completions).
 *
 * openai_req_parse reads one JSON body (jansson) into a struct openai_req
 * and refuses, with the OpenAI error fields filled, anything kvd would
 * otherwise have to ignore or guess: a parameter kvd does not know, or one
 * it knows but cannot honour at the value given (best_of other than n,
 * echo, suffix, the legacy functions, a json_schema using a keyword
 * net/wire/jschema.h does not serve...) names itself in a 400
 * (`param`, code `unsupported_parameter`), since silently dropping it
 * would change the result the caller expects. Known parameters that
 * cannot change the output (OpenAI's bookkeeping: user, metadata, store,
 * service_tier, ...: enum openai_ignored) are accepted when their type
 * is right and reported in `ignored`, for the front to log and count;
 * stream_options is accepted, and so is cache_salt (a non-empty string of
 * at most OPENAI_SALT_MAX bytes), which scopes prefix-cache reuse and
 * never changes the output either.
 *
 * n (chat and completions): the choices, 1..OPENAI_N_MAX (1 when absent;
 * the front's http.max_n bounds it further); best_of (completions) is
 * accepted only equal to n.
 *
 * Defaults: max_tokens 0 = not given (the front fills in the rest of the
 * context), temperature 1, top_p 1; top_k 0 (off; -1 is taken as off
 * too); has_seed false when absent (the front draws one and reports it:
 * kvd's output is a function of the seed, invariant 9).
 *
 * Sampling controls (gpu/sampler.h has their semantics): presence_penalty
 * and frequency_penalty in [-2, 2], repetition_penalty (and llama.cpp's
 * alias repeat_penalty) in (0, 10], min_p in [0, 1], logit_bias an
 * object of at most OPENAI_BIAS_MAX token ids (decimal strings, no sign
 * or leading zero) to numbers in [-100, 100], kept sorted by id (whether
 * an id is in the vocabulary is the front's check). Logprobs: completions
 * `logprobs` an integer 0..5 (the alternatives; 0 still reports the chosen
 * token's); chat `logprobs` true/false and `top_logprobs` 0..20, which
 * needs logprobs true. Each bad value is a 400 naming its parameter.
 * response_format (both endpoints): text; json_object (any JSON object)
 * or json_schema (its schema compiled here, bounded by jschema.h) give
 * q->gram, the grammar the output is sampled under.
 *
 * Chat content is a string or an array of text parts ({"type": "text",
 * "text": ...}), joined with "\n" as vLLM does; any other part type is
 * a 400 naming it.
 *
 * The Responses API (OPENAI_EP_RESPONSES, stateless) reads into the same
 * struct: `input` (a string: one user message; or message items whose
 * content is a string or input_text/output_text parts) and
 * `instructions` (a system message put first) become msgs,
 * max_output_tokens becomes max_tokens. What would need state or
 * capabilities kvd lacks (previous_response_id, conversation, tools,
 * reasoning, a text.format other than text, input items other than
 * messages, image/file/audio parts) is a 400 naming the parameter (for
 * an input item, its path: "input[2].type").
 *
 * Tools (openai_tools.c): `tools` is up to OPENAI_TOOLS_MAX functions
 * ({"type": "function", "function": {"name": [a-zA-Z0-9_-]{1,64},
 * "description": a string, "parameters": an object, "strict": a
 * boolean}}), each kept serialized for the chat template
 * (gpu/text/chat.h struct chat_tool), a strict one's parameters checked
 * against jschema.h's subset (a keyword outside it is a 400 naming it);
 * `tool_choice` "auto", "none" (then the tools are not rendered and no
 * call is parsed: the model cannot call), "required", a named function
 * or allowed_tools ({"mode": "auto"|"required", "tools": [names]}: the
 * others' tools[].allowed cleared); a name not among the tools is a 400.
 * A forced call (and under "auto" a strict tool) is held by
 * openai_tools_grammar, once the model's chat format is known (the
 * front's). An
 * assistant message may carry `tool_calls` (its content then may be
 * null), a "tool" message its `tool_call_id`; call arguments must be a
 * JSON object's text and are kept re-serialized as json.dumps writes them.
 * Whether the model's format has a tool syntax is the front's to judge.
 *
 * Errors: 0; OPENAI_E_INVALID with `err` filled (status 400); -ENOMEM.
 * Thread safety: none needed (pure).
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "gpu/sampler.h"
#include "gpu/text/chat.h"
#include "gpu/text/jsongram.h"

#define OPENAI_E_INVALID 1
#define OPENAI_STOP_MAX 4u
#define OPENAI_STOP_BYTES 256u
#define OPENAI_MODEL_MAX 127u
#define OPENAI_MSGS_MAX 1024u
#define OPENAI_SALT_MAX 256u   /* cache_salt bytes */
#define OPENAI_BIAS_MAX 300u   /* logit_bias entries (OpenAI's bound) */
#define OPENAI_TOP_LOGPROBS_MAX 20u    /* chat top_logprobs */
#define OPENAI_CMPL_LOGPROBS_MAX 5u    /* completions logprobs */
#define OPENAI_N_MAX 128u              /* n, best_of: what a body may say */

_Static_assert(OPENAI_BIAS_MAX == SAMPLER_BIAS_MAX &&
	       OPENAI_TOP_LOGPROBS_MAX == SAMPLER_TOP_LOGPROBS_MAX,
	       "the API's bounds are the sampler's");
#define OPENAI_TOOLS_MAX 128u       /* tools offered */
#define OPENAI_TOOLS_BYTES (1u << 20)  /* their JSON, all together */
#define OPENAI_TOOL_NAME_MAX 64u
#define OPENAI_CALLS_MAX 64u        /* tool_calls of one message */

struct openai_error {
	int status;               /* HTTP status */
	char type[32];            /* "invalid_request_error", ... */
	char code[48];            /* "" = null */
	char param[48];           /* "" = null */
	char msg[256];
};

/* Fields that cannot change the output (bit i of openai_req.ignored). */
enum openai_ignored {
	OPENAI_IGN_USER,
	OPENAI_IGN_METADATA,
	OPENAI_IGN_STORE,
	OPENAI_IGN_SERVICE_TIER,
	OPENAI_IGN_PARALLEL_TOOL_CALLS,  /* true, or false without tools */
	OPENAI_IGN_PROMPT_CACHE_KEY,
	OPENAI_IGN_PROMPT_CACHE_RETENTION,
	OPENAI_IGN_SAFETY_IDENTIFIER,
	OPENAI_IGNORED__N
};

/* A tool offered (tools[i]): its function's name and the whole object
 * as the templates print it (tojson). */
struct openai_tool {
	char name[OPENAI_TOOL_NAME_MAX + 1];
	char *json;               /* owned: json.dumps's ", " and ": " */
	char *json_indent;        /* owned: the same, indent 4 */
	char *function_json;      /* owned: its "function" object alone */
	json_t *parameters;       /* a reference (strict only; else NULL) */
	bool strict;              /* its parameters schema is enforced */
	bool allowed;             /* tool_choice lets the model call it */
};

/* tool_choice. REQUIRED and NAMED are held by a grammar
 * (openai_tools_grammar); AUTO may answer text or calls. */
enum openai_tool_choice {
	OPENAI_TC_AUTO = 0,
	OPENAI_TC_NONE,
	OPENAI_TC_REQUIRED,       /* one of the allowed tools */
	OPENAI_TC_NAMED,          /* that one (its only allowed tool) */
};

/* A call of an assistant message (messages[i].tool_calls[k]). */
struct openai_call {
	char name[OPENAI_TOOL_NAME_MAX + 1];
	char *arguments;          /* owned: the object re-serialized (", ") */
	char *id;                 /* owned: its "id", or NULL */
};

struct openai_msg {
	char *role;               /* owned, NUL-ended */
	char *content;            /* owned, NUL-ended ("" for null) */
	struct openai_call *calls;   /* owned (n_calls): assistant */
	size_t n_calls;
	char *tool_call_id;       /* owned: a tool result's, or NULL */
};

enum openai_ep {
	OPENAI_EP_COMPLETIONS,
	OPENAI_EP_CHAT,
	OPENAI_EP_RESPONSES,
};

struct openai_req {
	bool chat;                /* msgs, not prompt (chat and responses) */
	char model[OPENAI_MODEL_MAX + 1];  /* "" when absent */
	char *prompt;             /* completions: text (owned), or NULL */
	uint32_t *tokens;         /* completions: prompt ids (n_tokens), or NULL */
	uint32_t n_tokens;
	struct openai_msg *msgs;  /* chat: (n_msgs) */
	size_t n_msgs;
	uint32_t max_tokens;      /* 0: not given */
	uint32_t n;               /* choices, 1..OPENAI_N_MAX (1: absent) */
	uint32_t best_of;         /* completions; 0: absent, else == n */
	float temperature, top_p;
	uint32_t top_k;
	uint64_t seed;            /* has_seed: given */
	bool has_seed;
	uint32_t ignored;         /* bit (1u << enum openai_ignored) */
	char *stop[OPENAI_STOP_MAX];   /* owned, NUL-ended, (stop_len[i]) */
	size_t stop_len[OPENAI_STOP_MAX];
	uint32_t n_stop;
	bool stream;
	/* cache_salt (vLLM's field): isolates the prefix cache further
	 * within a tenant; "" when absent (gpu/kv/pcache.h) */
	char cache_salt[OPENAI_SALT_MAX + 1];
	char *instructions;       /* responses, while parsing: owned; then
				   * msgs[0] (role system) */
	/* sampling controls: 0 when absent (off; repetition_penalty 0 is
	 * off as 1 is) */
	float presence_penalty, frequency_penalty;
	float repetition_penalty;
	float min_p;
	struct sampler_bias *bias;      /* (n_bias) ids increasing, owned */
	uint32_t n_bias;
	bool logprobs;                  /* report logprobs ... */
	uint32_t top_logprobs;          /* ... with this many alternatives */
	bool has_top_logprobs;          /* chat: top_logprobs given */
	struct openai_tool *tools;   /* owned (n_tools): chat */
	size_t n_tools;
	enum openai_tool_choice tool_choice;
	char tool_named[OPENAI_TOOL_NAME_MAX + 1];  /* NAMED: its name */
	bool tool_subset;         /* allowed_tools named a subset (tools[].allowed) */
	json_t *allowed_names;    /* allowed_tools' list while parsing (a reference) */
	bool no_parallel_calls;   /* parallel_tool_calls false */
	/* response_format json_object or json_schema: the grammar the
	 * output is held to (gpu/text/jsongram.h; owned), NULL for text */
	struct jgram *gram;
};

int openai_req_parse(struct openai_req *q, bool chat, const char *body,
		     size_t len, struct openai_error *err);
/* The same for any endpoint (openai_req_parse is its chat/completions
 * form). */
int openai_req_parse_ep(struct openai_req *q, enum openai_ep ep,
			const char *body, size_t len, struct openai_error *err);
void openai_req_deinit(struct openai_req *q);
/* The field's name ("?" out of range): a fixed string, safe as a label. */
const char *openai_ignored_name(unsigned i);
/* Fill err (any status); `code`/`param` NULL for null. Returns
 * OPENAI_E_INVALID. */
int openai_error_set(struct openai_error *err, int status, const char *type,
		     const char *code, const char *param, const char *fmt, ...)
	__attribute__((format(printf, 6, 7)));
/* Whether the model may call: tools offered and tool_choice not "none". */
bool openai_req_calls(const struct openai_req *q);
/* A tools request's grammar in chat format f (openai_toolgram.c): for
 * tool_choice "required" or a named function, q->gram is set to the
 * format's call syntax - llama3: {"name": N, "parameters": ARGS}; chatml:
 * <tool_call>{"name": N, "arguments": ARGS}</tool_call>, repeated unless
 * parallel_tool_calls is false - where N is an allowed tool's name and
 * ARGS its parameters schema when the tool is strict, any JSON object
 * otherwise. Under "auto" with a strict tool, or parallel_tool_calls
 * false where several calls may follow each other (chatml), the same
 * grammar made lazy (jgram_lazy: free text until "<tool_call>", or for
 * llama3 a first `{`). Nothing to do (0, q->gram untouched) for a
 * format without a call syntax (the front refuses its tools), "none",
 * or "auto" with neither. OPENAI_E_INVALID (err: 400) for what cannot
 * be held: response_format together with a call grammar, more than
 * JGRAM_LITS_MAX tools to choose from, the schemas past the grammar's
 * bounds; -ENOMEM. Pure. */
int openai_tools_grammar(struct openai_req *q, enum chat_format f,
			 struct openai_error *err);
