/* openai_toolgram.c - tool_choice "required" or a named function, and
 * strict tools under "auto", as a grammar (openai.h
 * openai_tools_grammar).
 *
 * Design. A forced call is sampled under a jsongram grammar in the
 * call syntax of the model's chat format, so the answer is a call by
 * construction (the scanner in openai_tools.c then reads it like any
 * other). The call object is a tagged union (gpu/text/jsongram.h): its
 * first key is "name", whose value - one of the allowed tools' names -
 * picks the variant: an object of one required key, "parameters"
 * (llama3, the key the Llama 3.1 template asks for) or "arguments"
 * (chatml/Hermes), whose value is the tool's parameters schema when the
 * tool is strict (compiled by jschema.c into the same grammar) or any
 * JSON object when it is not. Hermes calls are wrapped in <tool_call>
 * tags, one or (parallel_tool_calls not false) several; a llama3 answer
 * is one call by its format. Key order is the template's, forced.
 * Mistral v0.3 answers the [TOOL_CALLS] control token, then a JSON
 * array of call objects ("arguments", one element under
 * parallel_tool_calls false): the token is the grammar's lead
 * (jgram_lead: a control token is no byte text), the array its root.
 *
 * Under tool_choice "auto" the answer may be text, so the same grammar
 * is made lazy (jsongram.h jgram_lazy): sampling starts free and the
 * grammar takes over at the call's trigger. chatml: "<tool_call>"
 * anywhere in the answer (the wrap's pre); from the byte after it the
 * answer is calls only - the arguments of a strict tool its schema's,
 * with parallel_tool_calls false exactly one call and then only the
 * end. llama3: Llama 3.1's template makes a call the whole answer (the
 * scanner reads one only from a first `{`), so the trigger is `{` as the
 * answer's first non-whitespace byte, and any other first byte leaves
 * the answer free text. mistral_v3: the [TOOL_CALLS] token, when drawn
 * (JGRAM_LAZY_LEAD); the list of calls follows it. This runs only when
 * it buys something: a strict tool, or parallel_tool_calls false where
 * several calls may come (chatml, mistral_v3); non-strict tools
 * under "auto" with parallel calls sample unconstrained, at no cost.
 * The SDKs' helpers (zodFunction, pydantic_function_tool) send strict
 * tools with the default tool_choice: they are served, not refused.
 *
 * What cannot be held is refused rather than ignored: response_format
 * together with a call grammar (a forced call, or auto's lazy one).
 */
#include "net/wire/jschema.h"
#include "net/wire/openai_int.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#define HERMES_OPEN "<tool_call>"
#define HERMES_CLOSE "</tool_call>"
#define MISTRAL_CALLS "[TOOL_CALLS]"

/* The call syntax of the formats that have one. */
static const struct call_syntax {
	enum chat_format fmt;
	const char *args_key;     /* the arguments' key, quoted */
	const char *pre, *post;   /* a wrap (NULL: the bare object) */
	bool many;                /* several calls may follow each other */
	const char *lead;         /* a control token first (NULL: none) */
	bool list;                /* the calls are one JSON array */
} syntaxes[] = {
	{ CHAT_LLAMA3, "\"parameters\"", NULL, NULL, false, NULL, false },
	{ CHAT_CHATML, "\"arguments\"", HERMES_OPEN, HERMES_CLOSE, true, NULL, false },
	{ CHAT_MISTRAL_V3, "\"arguments\"", NULL, NULL, true, MISTRAL_CALLS, true },
};

static const struct call_syntax *syntax_of(enum chat_format f)
{
	for (size_t i = 0; i < sizeof(syntaxes) / sizeof(syntaxes[0]); i++)
		if (syntaxes[i].fmt == f)
			return &syntaxes[i];
	return NULL;
}

static int gram_bad(struct openai_error *err, const char *what, int rc)
{
	if (rc == JGRAM_E_INVALID)
		return openai__bad(err, "tools", "the tools' schemas exceed what one call grammar holds (%s)",
			   what);
	return rc;
}

/* Tool t's variant: {args_key: its schema or any object}, required.
 * any_obj: the shared "any JSON object" node. */
static int variant_of(struct jgram *g, const struct call_syntax *cs,
		      const struct openai_tool *t, size_t i, uint16_t any_obj,
		      uint16_t *id, struct openai_error *err)
{
	uint16_t args = any_obj;
	struct jgram_node *n;
	uint32_t lit;
	char msg[160];
	int rc;

	if (t->strict) {
		rc = jschema_add(g, t->parameters, &args, msg, sizeof(msg));
		if (rc == JSCHEMA_E_INVALID)
			return openai__bad(err, "tools", "'tools[%zu].function.parameters': %s", i, msg);
		if (rc)
			return rc;
		n = jgram_node(g, args);
		if (n->is_enum || n->types != JGRAM_T_OBJECT || n->alt)   /* (anyOf) */
			return openai__bad(err, "tools", "'tools[%zu].function.parameters' must be a schema of type object",
				   i);
	}
	rc = jgram_lit_add(g, cs->args_key, strlen(cs->args_key), args, &lit);
	if (!rc)
		rc = jgram_node_add(g, id, &n);
	if (rc)
		return gram_bad(err, "nodes", rc);
	*n = (struct jgram_node){ .types = JGRAM_T_OBJECT, .lit = lit, .n_lit = 1,
				  .required = 1, .max_items = JGRAM_ITEMS_MAX };
	return 0;
}

/* The union: "name" first, one allowed tool's name, then its variant.
 * The names' literals must be contiguous: the variants come first. */
static int union_of(struct jgram *g, const struct call_syntax *cs,
		    const struct openai_req *q, uint16_t *root,
		    struct openai_error *err)
{
	uint16_t var[JGRAM_LITS_MAX], any_obj;
	uint32_t tag, first = 0, k = 0, lit;
	struct jgram_node *n;
	char text[OPENAI_TOOL_NAME_MAX + 3];
	int rc;

	rc = jgram_node_add(g, &any_obj, &n);
	if (rc)
		return gram_bad(err, "nodes", rc);
	*n = (struct jgram_node){ .types = JGRAM_T_OBJECT, .free_keys = true,
				  .max_items = JGRAM_ITEMS_MAX };
	for (size_t i = 0; i < q->n_tools; i++)
		if (q->tools[i].allowed &&
		    (rc = variant_of(g, cs, &q->tools[i], i, any_obj, &var[k++], err)))
			return rc;
	rc = jgram_lit_add(g, "\"name\"", 6, 0, &tag);
	for (size_t i = 0, v = 0; !rc && i < q->n_tools; i++) {
		if (!q->tools[i].allowed)
			continue;
		snprintf(text, sizeof(text), "\"%s\"", q->tools[i].name);   /* [A-Za-z0-9_-] */
		rc = jgram_lit_add(g, text, strlen(text), var[v++], &lit);
		first = v == 1 ? lit : first;
	}
	if (!rc)
		rc = jgram_node_add(g, root, &n);
	if (rc)
		return gram_bad(err, "names", rc);
	*n = (struct jgram_node){ .is_union = true, .tag = tag, .lit = first, .n_lit = k,
				  .max_items = JGRAM_ITEMS_MAX };
	return 0;
}

/* Whether "auto" needs its lazy grammar: a strict tool, or several
 * calls possible in the format (wraps repeated, a list) and
 * parallel_tool_calls false. */
static bool auto_lazy(const struct openai_req *q, const struct call_syntax *cs)
{
	for (size_t i = 0; i < q->n_tools; i++)
		if (q->tools[i].strict)
			return true;
	return q->no_parallel_calls && (cs->many || cs->list);
}

static size_t allowed_count(const struct openai_req *q)
{
	size_t k = 0;

	for (size_t i = 0; i < q->n_tools; i++)
		k += q->tools[i].allowed;
	return k;
}

/* Mistral: the lead token, then [call, ...] (one under parallel false). */
static int list_of(struct jgram *g, const struct call_syntax *cs,
		   const struct openai_req *q, uint16_t *root,
		   struct openai_error *err)
{
	struct jgram_node *n;
	uint16_t call = *root;
	int rc = jgram_lead(g, cs->lead, strlen(cs->lead));

	if (!rc)
		rc = jgram_node_add(g, root, &n);
	if (rc)
		return gram_bad(err, "list", rc);
	*n = (struct jgram_node){ .types = JGRAM_T_ARRAY, .items = call, .min_items = 1,
				  .max_items = q->no_parallel_calls ? 1 : JGRAM_REPS_MAX };
	return 0;
}

static int tools_grammar(struct openai_req *q, const struct call_syntax *cs,
			 bool lazy, struct jgram *g, struct openai_error *err)
{
	char msg[128];
	uint16_t root;
	int rc = union_of(g, cs, q, &root, err);

	if (!rc && cs->list)
		rc = list_of(g, cs, q, &root, err);
	if (rc)
		return rc;
	if (cs->pre && (rc = jgram_wrap(g, cs->pre, strlen(cs->pre), cs->post,
					strlen(cs->post),
					q->no_parallel_calls ? 1 : JGRAM_REPS_MAX)))
		return gram_bad(err, "wrap", rc);
	if (lazy && (rc = jgram_lazy(g, cs->lead ? JGRAM_LAZY_LEAD
				     : cs->pre ? JGRAM_LAZY_PRE : JGRAM_LAZY_START)))
		return gram_bad(err, "trigger", rc);
	rc = jgram_seal(g, root, msg, sizeof(msg));
	return rc ? openai__bad(err, "tools", "the call grammar cannot be generated: %s", msg) : 0;
}

int openai_tools_grammar(struct openai_req *q, enum chat_format f,
			 struct openai_error *err)
{
	const struct call_syntax *cs = syntax_of(f);
	struct jgram *g = NULL;
	bool lazy;
	int rc;

	if (!cs || !openai_req_calls(q))
		return 0;
	lazy = q->tool_choice == OPENAI_TC_AUTO;
	if (lazy && !auto_lazy(q, cs))
		return 0;
	if (q->gram && lazy)
		return openai__unsupported(err, "response_format",
					   "under tool_choice \"auto\", strict tools (or parallel_tool_calls false in this model's format) are held by a call grammar: response_format goes with non-strict tools or tool_choice \"none\"");
	if (q->gram)
		return openai__unsupported(err, "response_format",
					   "a forced tool call is its own format: response_format goes with tool_choice \"auto\" or \"none\"");
	if (allowed_count(q) > JGRAM_LITS_MAX)
		return openai__bad(err, lazy ? "tools" : "tool_choice",
				   "%s chooses among at most %u tools",
				   lazy ? "a call grammar (strict tools or parallel_tool_calls false)"
					: "'tool_choice' \"required\"", JGRAM_LITS_MAX);
	rc = jgram_new(&g);
	if (!rc)
		rc = tools_grammar(q, cs, lazy, g, err);
	if (rc) {
		jgram_free(g);
		return rc;
	}
	q->gram = g;
	return 0;
}
