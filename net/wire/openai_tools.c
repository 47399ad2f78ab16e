/* openai_tools.c - tools in a chat body, and the calls in a model's
 * output (openai_tools.h, openai_int.h).
 *
 * Design. The request side reads `tools`, `tool_choice` and a message's
 * `tool_calls` for openai.c's field table, bounding every array and
 * string, and keeps each tool as the two texts the chat templates print
 * (Jinja's tojson is Python's json.dumps: jansson's default separators
 * are the same, ", " and ": ", and so is its indent; only a real number
 * may print differently: jansson writes 17 digits, Python the shortest).
 * A call's arguments are a string holding JSON in OpenAI's API and a
 * mapping in the templates: it is parsed and re-serialized the same way.
 *
 * The output side scans text for the format's calls. It is written for
 * a stream: it says which prefix is text for sure and which suffix may
 * still become a call, so the front holds back only that suffix (in the
 * same buffer as its stop-string hold-back) and at most
 * OPENAI_CALL_HOLD_MAX bytes of it.
 */
#include "net/wire/jschema.h"
#include "net/wire/openai_int.h"
#include "net/wire/openai_tools.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MISTRAL_CALLS "[TOOL_CALLS]"   /* a control token (openai_calls_token) */
#define TOOL_CALL_OPEN "<tool_call>"
#define TOOL_CALL_CLOSE "</tool_call>"
#define TOOL_CALL_ID_MAX 256u   /* a tool_call_id's or a call id's bytes */

/* [a-zA-Z0-9_-]{1,64}, OpenAI's rule for a function's name */
static bool name_ok(json_t *v)
{
	const char *s = json_string_value(v);
	size_t n = json_string_length(v);

	if (!s || n == 0 || n > OPENAI_TOOL_NAME_MAX)
		return false;
	for (size_t i = 0; i < n; i++)
		if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
		      (s[i] >= '0' && s[i] <= '9') || s[i] == '_' || s[i] == '-'))
			return false;
	return true;
}

/* ---- tools ------------------------------------------------------------------ */

/* A strict tool's parameters: a schema jschema.h serves (compiled once
 * here to name what it does not; openai_toolgram.c compiles it again
 * into the call grammar). */
static int strict_schema(size_t i, json_t *params, struct openai_error *err)
{
	struct jgram *g = NULL;
	char msg[160];
	int rc;

	if (!params)
		return openai__bad(err, "tools", "'tools[%zu].function.strict' needs 'parameters'", i);
	rc = jschema_compile(params, &g, msg, sizeof(msg));
	jgram_free(g);
	if (rc == JSCHEMA_E_INVALID)
		return openai__bad(err, "tools", "'tools[%zu].function.parameters': %s", i, msg);
	return rc;
}

/* tools[i].function: name, description, parameters, strict. */
static int function_of(size_t i, json_t *fn, struct openai_error *err)
{
	json_t *name = json_object_get(fn, "name"), *x;
	const char *key;

	if (!json_is_object(fn))
		return openai__bad(err, "tools", "'tools[%zu].function' must be an object", i);
	if (!name_ok(name))
		return openai__bad(err, "tools", "'tools[%zu].function.name' must be 1 to %u of a-z, A-Z, 0-9, _ and -",
			   i, OPENAI_TOOL_NAME_MAX);
	json_object_foreach(fn, key, x) {
		if (!strcmp(key, "name"))
			continue;
		if (!strcmp(key, "description") && json_is_string(x))
			continue;
		if (!strcmp(key, "parameters") && json_is_object(x))
			continue;
		if (!strcmp(key, "strict") && json_is_true(x)) {
			int rc = strict_schema(i, json_object_get(fn, "parameters"), err);

			if (rc)
				return rc;
			continue;
		}
		if (!strcmp(key, "strict") && (json_is_false(x) || json_is_null(x)))
			continue;
		if (!strcmp(key, "description") || !strcmp(key, "parameters") ||
		    !strcmp(key, "strict"))
			return openai__bad(err, "tools", "'tools[%zu].function.%s' has the wrong type (description: a string, parameters: an object, strict: a boolean)",
				   i, key);
		return openai__bad(err, "tools", "'tools[%zu].function' takes name, description, parameters and strict only", i);
	}
	return 0;
}

/* tools[i] checked and kept as its two texts. */
static int tool_of(struct openai_tool *t, size_t i, json_t *v, size_t *bytes,
		   struct openai_error *err)
{
	json_t *type = json_object_get(v, "type"), *fn;
	int rc;

	if (!json_is_object(v) || json_object_size(v) != 2 || !json_is_string(type) ||
	    !json_object_get(v, "function"))
		return openai__bad(err, "tools", "'tools[%zu]' must be {\"type\": \"function\", \"function\": {...}}", i);
	if (strcmp(json_string_value(type), "function"))
		return openai__unsupported(err, "tools", "tools of type function only");
	if ((rc = function_of(i, json_object_get(v, "function"), err)))
		return rc;
	fn = json_object_get(v, "function");
	snprintf(t->name, sizeof(t->name), "%s", json_string_value(json_object_get(fn, "name")));
	t->allowed = true;
	t->strict = json_is_true(json_object_get(fn, "strict"));
	t->parameters = t->strict ? json_incref(json_object_get(fn, "parameters")) : NULL;
	t->json = json_dumps(v, 0);
	t->json_indent = json_dumps(v, JSON_INDENT(4));
	t->function_json = json_dumps(fn, 0);
	if (!t->json || !t->json_indent || !t->function_json)
		return -ENOMEM;
	*bytes += strlen(t->json_indent);
	if (*bytes > OPENAI_TOOLS_BYTES)
		return openai__bad(err, "tools", "'tools' is over %u bytes of JSON", OPENAI_TOOLS_BYTES);
	return 0;
}

int openai__rd_tools(struct openai_req *q, const char *k, json_t *v,
		     struct openai_error *err)
{
	size_t n = json_array_size(v), i, bytes = 0;
	json_t *e;
	int rc;

	if (json_is_null(v) || (json_is_array(v) && n == 0))
		return 0;
	if (!json_is_array(v) || n > OPENAI_TOOLS_MAX)
		return openai__bad(err, k, "'%s' must be an array of at most %u tools", k, OPENAI_TOOLS_MAX);
	q->tools = calloc(n, sizeof(*q->tools));
	if (!q->tools)
		return -ENOMEM;
	json_array_foreach(v, i, e) {
		q->n_tools = i + 1;
		if ((rc = tool_of(&q->tools[i], i, e, &bytes, err)))
			return rc;
		for (size_t j = 0; j < i; j++)
			if (!strcmp(q->tools[j].name, q->tools[i].name))
				return openai__bad(err, k, "'%s[%zu]': two tools are named '%s'", k, i,
					   q->tools[i].name);
	}
	return 0;
}

/* {"type": "function", "function": {"name": N}}: N, or NULL. */
static const char *choice_name(json_t *v)
{
	json_t *type = json_object_get(v, "type"), *fn = json_object_get(v, "function");
	json_t *name = json_object_get(fn, "name");

	if (!json_is_object(v) || json_object_size(v) != 2 || !json_is_string(type) ||
	    strcmp(json_string_value(type), "function") || !json_is_object(fn) ||
	    json_object_size(fn) != 1 || !name_ok(name))
		return NULL;
	return json_string_value(name);
}

/* {"type": "allowed_tools", "allowed_tools": {"mode": "auto"|"required",
 * "tools": [{"type": "function", "function": {"name": N}}, ...]}}: the
 * names are kept in q->allowed_names until the tools are read. */
static int allowed_tools_of(struct openai_req *q, const char *k, json_t *v,
			    struct openai_error *err)
{
	json_t *a = json_object_get(v, "allowed_tools");
	json_t *mode = json_object_get(a, "mode"), *tools = json_object_get(a, "tools");
	const char *m = json_string_value(mode);
	size_t i;
	json_t *e;

	if (json_object_size(v) != 2 || !json_is_object(a) || json_object_size(a) != 2 || !m ||
	    (strcmp(m, "auto") && strcmp(m, "required")) || !json_is_array(tools) ||
	    json_array_size(tools) == 0 || json_array_size(tools) > OPENAI_TOOLS_MAX)
		return openai__bad(err, k, "'%s' of type allowed_tools must be {\"type\": \"allowed_tools\", \"allowed_tools\": {\"mode\": \"auto\" or \"required\", \"tools\": [1 to %u functions]}}",
			   k, OPENAI_TOOLS_MAX);
	json_array_foreach(tools, i, e)
		if (!choice_name(e))
			return openai__bad(err, k, "'%s.allowed_tools.tools[%zu]' must be {\"type\": \"function\", \"function\": {\"name\": ...}}",
				   k, i);
	q->allowed_names = json_incref(tools);
	q->tool_choice = strcmp(m, "auto") ? OPENAI_TC_REQUIRED : OPENAI_TC_AUTO;
	return 0;
}

int openai__rd_tool_choice(struct openai_req *q, const char *k, json_t *v,
			   struct openai_error *err)
{
	const char *s = json_string_value(v), *name = choice_name(v);
	json_t *type = json_object_get(v, "type");

	if (json_is_null(v) || (s && !strcmp(s, "auto")))
		return 0;
	if (s && !strcmp(s, "none")) {
		q->tool_choice = OPENAI_TC_NONE;
		return 0;
	}
	if (s && !strcmp(s, "required")) {
		q->tool_choice = OPENAI_TC_REQUIRED;
		return 0;
	}
	if (name) {
		q->tool_choice = OPENAI_TC_NAMED;
		snprintf(q->tool_named, sizeof(q->tool_named), "%s", name);
		return 0;
	}
	if (json_is_string(type) && !strcmp(json_string_value(type), "allowed_tools"))
		return allowed_tools_of(q, k, v, err);
	return openai__bad(err, k, "'%s' must be \"auto\", \"none\", \"required\", {\"type\": \"function\", \"function\": {\"name\": ...}} or {\"type\": \"allowed_tools\", ...}", k);
}

/* ---- an assistant message's calls ---------------------------------------------- */

/* The arguments' text, re-serialized as the templates print a mapping. */
static int arguments_of(struct openai_call *c, size_t i, size_t j, json_t *a,
			struct openai_error *err)
{
	json_t *o = json_is_string(a) ? json_loadb(json_string_value(a),
						   json_string_length(a),
						   JSON_REJECT_DUPLICATES, NULL) : NULL;

	if (!json_is_object(o)) {
		json_decref(o);
		return openai__bad(err, "messages", "'messages[%zu].tool_calls[%zu].function.arguments' must be a string holding a JSON object",
			   i, j);
	}
	c->arguments = json_dumps(o, 0);
	json_decref(o);
	return c->arguments ? 0 : -ENOMEM;
}

/* An assistant's call: {id?, type "function", function: {name,
 * arguments}}. The function's "parsed_arguments" is ignored: the openai
 * SDK's parse() adds it (its parse of arguments) to the calls it
 * answers, and the message goes back as it is; arguments counts. */
static int call_of(struct openai_call *c, size_t i, size_t j, json_t *v,
		   struct openai_error *err)
{
	json_t *id = json_object_get(v, "id"), *type = json_object_get(v, "type");
	json_t *fn = json_object_get(v, "function");
	json_t *name = json_object_get(fn, "name");

	if (!json_is_object(v) || !json_is_object(fn) ||
	    json_object_size(v) != 2u + (id != NULL) ||
	    (id && (!json_is_string(id) || json_string_length(id) > TOOL_CALL_ID_MAX)) ||
	    !json_is_string(type) || strcmp(json_string_value(type), "function") ||
	    json_object_size(fn) != 2u + (json_object_get(fn, "parsed_arguments") != NULL))
		return openai__bad(err, "messages", "'messages[%zu].tool_calls[%zu]' must be {\"id\": a string, \"type\": \"function\", \"function\": {\"name\", \"arguments\"}}",
			   i, j);
	if (!name_ok(name))
		return openai__bad(err, "messages", "'messages[%zu].tool_calls[%zu].function.name' must be 1 to %u of a-z, A-Z, 0-9, _ and -",
			   i, j, OPENAI_TOOL_NAME_MAX);
	snprintf(c->name, sizeof(c->name), "%s", json_string_value(name));
	if (id && !(c->id = strdup(json_string_value(id))))
		return -ENOMEM;
	return arguments_of(c, i, j, json_object_get(fn, "arguments"), err);
}

int openai__msg_calls(struct openai_msg *m, size_t i, json_t *v,
		      struct openai_error *err)
{
	size_t n = json_array_size(v), j;
	json_t *e;
	int rc;

	if (!v || json_is_null(v) || (json_is_array(v) && n == 0))
		return 0;   /* absent, null or none */
	if (!json_is_array(v) || n > OPENAI_CALLS_MAX)
		return openai__bad(err, "messages", "'messages[%zu].tool_calls' must be an array of at most %u calls",
			   i, OPENAI_CALLS_MAX);
	m->calls = calloc(n, sizeof(*m->calls));
	if (!m->calls)
		return -ENOMEM;
	json_array_foreach(v, j, e) {
		m->n_calls = j + 1;
		if ((rc = call_of(&m->calls[j], i, j, e, err)))
			return rc;
	}
	return 0;
}

/* The tool named n, or NULL. */
static struct openai_tool *tool_named(struct openai_req *q, const char *n)
{
	for (size_t t = 0; t < q->n_tools; t++)
		if (!strcmp(q->tools[t].name, n))
			return &q->tools[t];
	return NULL;
}

/* tool_choice's names against the tools: a named function, or the
 * allowed_tools subset (the others' allowed cleared). */
static int choice_check(struct openai_req *q, struct openai_error *err)
{
	size_t i;
	json_t *e;

	if (q->tool_choice == OPENAI_TC_NAMED) {
		if (!tool_named(q, q->tool_named))
			return openai__bad(err, "tool_choice", "'tool_choice' names '%s', which is not among 'tools'",
				   q->tool_named);
		for (size_t t = 0; t < q->n_tools; t++)
			q->tools[t].allowed = !strcmp(q->tools[t].name, q->tool_named);
	}
	if (!q->allowed_names)
		return 0;
	for (size_t t = 0; t < q->n_tools; t++)
		q->tools[t].allowed = false;
	json_array_foreach(q->allowed_names, i, e) {
		struct openai_tool *t = tool_named(q, choice_name(e));

		if (!t)
			return openai__bad(err, "tool_choice", "'tool_choice.allowed_tools.tools[%zu]' names '%s', which is not among 'tools'",
				   i, choice_name(e));
		t->allowed = true;
	}
	q->tool_subset = true;
	return 0;
}

int openai__tools_check(struct openai_req *q, struct openai_error *err)
{
	/* parallel_tool_calls false with tools is honoured, not ignored */
	if (q->no_parallel_calls && openai_req_calls(q))
		q->ignored &= ~(1u << OPENAI_IGN_PARALLEL_TOOL_CALLS);
	if ((q->tool_choice == OPENAI_TC_REQUIRED || q->tool_choice == OPENAI_TC_NAMED) &&
	    !q->n_tools)
		return openai__bad(err, "tool_choice", "'tool_choice' \"required\" or a function needs 'tools'");
	return choice_check(q, err);
}

void openai__tools_free(struct openai_req *q)
{
	for (size_t i = 0; i < q->n_tools; i++) {
		free(q->tools[i].json);
		free(q->tools[i].json_indent);
		free(q->tools[i].function_json);
		json_decref(q->tools[i].parameters);
	}
	free(q->tools);
	json_decref(q->allowed_names);
	for (size_t i = 0; i < q->n_msgs; i++) {
		for (size_t j = 0; j < q->msgs[i].n_calls; j++) {
			free(q->msgs[i].calls[j].arguments);
			free(q->msgs[i].calls[j].id);
		}
		free(q->msgs[i].tool_call_id);
		free(q->msgs[i].calls);
	}
}

bool openai_req_calls(const struct openai_req *q)
{
	return q->n_tools > 0 && q->tool_choice != OPENAI_TC_NONE;
}

/* ---- the model's calls ----------------------------------------------------------- */

bool openai_calls_format(enum chat_format f)
{
	return f == CHAT_CHATML || f == CHAT_LLAMA3 || f == CHAT_MISTRAL_V3;
}

const char *openai_calls_token(enum chat_format f)
{
	return f == CHAT_MISTRAL_V3 ? MISTRAL_CALLS : NULL;
}

size_t openai_calls_unmark(char *out, const char *p, size_t n)
{
	size_t k = 0;

	for (size_t i = 0; i < n; i++)
		if (p[i] != OPENAI_CALLS_MARK)
			out[k++] = p[i];
	return k;
}

/* p[0, n) as a call: a JSON object of exactly a name among the tools and
 * an object of arguments (under "arguments" or, Llama 3.1's word,
 * "parameters"), and optionally "type": "function" (Llama 3.2 writes
 * it). 0 with out's name and arguments; 1 when it is not one; -ENOMEM. */
static unsigned typed(json_t *o)
{
	json_t *t = json_object_get(o, "type");

	return json_is_string(t) && !strcmp(json_string_value(t), "function");
}

static int call_json(const struct openai_tool *tools, size_t n_tools,
		     const char *p, size_t n, struct openai_found *out)
{
	/* a key given twice keeps its last value (as Python's json reads it):
	 * a free object under a call grammar cannot refuse one */
	json_t *o = json_loadb(p, n, 0, NULL);
	json_t *name = json_object_get(o, "name");
	json_t *args = json_object_get(o, "arguments");
	size_t t = 0;
	int rc = 1;

	if (!args)
		args = json_object_get(o, "parameters");
	while (json_is_string(name) && t < n_tools &&
	       strcmp(tools[t].name, json_string_value(name)))
		t++;
	if (json_is_string(name) && json_object_size(o) == 2u + typed(o) &&
	    json_is_object(args) && t < n_tools) {
		snprintf(out->name, sizeof(out->name), "%s", tools[t].name);
		out->arguments = json_dumps(args, 0);
		rc = out->arguments ? 0 : -ENOMEM;
	}
	json_decref(o);
	return rc;
}

/* The longest end of p[0, len) that begins tag: it may be completed. */
static size_t tag_begun(const char *p, size_t len, const char *tag)
{
	size_t t = strlen(tag);

	for (size_t k = t - 1 < len ? t - 1 : len; k > 0; k--)
		if (!memcmp(p + len - k, tag, k))
			return k;
	return 0;
}

/* One byte of JSON text, in order: true when it lies outside every
 * string (a quote and what an escape covers are inside). in_str and esc
 * carry the state from byte to byte, both false at the start. */
static bool json_outside(char c, bool *in_str, bool *esc)
{
	if (*esc) {
		*esc = false;
		return false;
	}
	if (*in_str) {
		if (c == '\\')
			*esc = true;
		else if (c == '"')
			*in_str = false;
		return false;
	}
	if (c == '"') {
		*in_str = true;
		return false;
	}
	return true;
}

/* The first close tag in p[body, len) outside a JSON string, or NULL: a
 * call's string may hold "</tool_call>" (a grammar-held call may write
 * one: jsongram.h), which then does not end it. */
static const char *close_outside(const char *p, size_t body, size_t len)
{
	const size_t cl = strlen(TOOL_CALL_CLOSE);
	bool in_str = false, esc = false;

	for (size_t i = body; i < len; i++)
		if (json_outside(p[i], &in_str, &esc) && len - i >= cl &&
		    !memcmp(p + i, TOOL_CALL_CLOSE, cl))
			return p + i;
	return NULL;
}

/* The block [at, c + close) did not parse. When its first close lies in
 * a string, the call may end at the next close outside strings c2:
 * 0/-ENOMEM as call_json with out->end set; 1: not a call; 2: wait for
 * more text (no such close yet). */
static int call_past_string(const struct openai_tool *tools, size_t n_tools,
			    const char *p, size_t at, size_t body, const char *c,
			    size_t len, bool final, struct openai_found *out)
{
	const char *c2 = close_outside(p, body, len);
	int rc;

	if (c2 == c)
		return 1;
	if (!c2)
		return final || len - at > OPENAI_CALL_HOLD_MAX ? 1 : 2;
	rc = call_json(tools, n_tools, p + body, (size_t)(c2 - p) - body, out);
	out->end = (size_t)(c2 - p) + strlen(TOOL_CALL_CLOSE);
	return rc;
}

static int scan_chatml(const struct openai_tool *tools, size_t n_tools,
		       const char *p, size_t len, bool final,
		       struct openai_found *out)
{
	const size_t ol = strlen(TOOL_CALL_OPEN), cl = strlen(TOOL_CALL_CLOSE);
	size_t from = 0;

	for (;;) {
		const char *o = memmem(p + from, len - from, TOOL_CALL_OPEN, ol);
		const char *c;
		size_t at, body;
		int rc;

		if (!o) {
			out->text = final ? len : len - tag_begun(p + from, len - from,
								 TOOL_CALL_OPEN);
			return OPENAI_SCAN_TEXT;
		}
		at = (size_t)(o - p);
		body = at + ol;
		c = memmem(p + body, len - body, TOOL_CALL_CLOSE, cl);
		if (!c) {   /* open: held, unless the answer ends or it grows too long */
			out->text = final || len - at > OPENAI_CALL_HOLD_MAX ? len : at;
			return OPENAI_SCAN_TEXT;
		}
		rc = call_json(tools, n_tools, p + body, (size_t)(c - p) - body, out);
		out->end = (size_t)(c - p) + cl;
		if (rc == 1)
			rc = call_past_string(tools, n_tools, p, at, body, c, len, final, out);
		if (rc == 2) {   /* held, like an open block */
			out->text = at;
			return OPENAI_SCAN_TEXT;
		}
		if (rc <= 0) {
			out->text = at;
			return rc ? rc : OPENAI_SCAN_CALL;
		}
		from = (size_t)(c - p) + cl;   /* not a call: text */
	}
}

/* Llama 3.1: a call is the whole answer, so text that opens with
 * anything but "{" is text to the end (*plain); one that opens with "{"
 * is held until the answer ends. */
static int scan_llama3(const struct openai_tool *tools, size_t n_tools,
		       const char *p, size_t len, bool final, bool *plain,
		       struct openai_found *out)
{
	size_t i = 0;
	int rc;

	while (i < len && (p[i] == ' ' || p[i] == '\n' || p[i] == '\t' || p[i] == '\r'))
		i++;
	out->text = len;
	if (*plain || (i < len && p[i] != '{') || len > OPENAI_CALL_HOLD_MAX) {
		*plain = true;
		return OPENAI_SCAN_TEXT;
	}
	if (!final) {
		out->text = 0;   /* whitespace, or a "{" that may be a call */
		return OPENAI_SCAN_TEXT;
	}
	*plain = true;
	if (i == len)
		return OPENAI_SCAN_TEXT;
	rc = call_json(tools, n_tools, p, len, out);
	if (rc)
		return rc < 0 ? rc : OPENAI_SCAN_TEXT;
	out->text = 0;
	out->end = len;
	return OPENAI_SCAN_CALL;
}

/* ---- Mistral v0.3: [TOOL_CALLS] [call, ...] ---------------------------------------- */

static size_t skip_ws(const char *p, size_t i, size_t len)
{
	while (i < len && (p[i] == ' ' || p[i] == '\n' || p[i] == '\t' || p[i] == '\r'))
		i++;
	return i;
}

/* Where the array opened at p[i] == '[' closes: the index after its ']',
 * or 0 while it is open (brackets in strings do not count). */
static size_t list_close(const char *p, size_t i, size_t len)
{
	bool in_str = false, esc = false;
	size_t depth = 0;

	for (; i < len; i++) {
		if (!json_outside(p[i], &in_str, &esc))
			continue;
		if (p[i] == '[' || p[i] == '{')
			depth++;
		else if ((p[i] == ']' || p[i] == '}') && --depth == 0)
			return i + 1;
	}
	return 0;
}

/* o as a Mistral call: a name among the tools, an object of arguments,
 * optionally a string id, nothing else. 0 with out's name and arguments
 * (out may be NULL: only checked); 1 when it is not one; -ENOMEM. */
static int mistral_call(const struct openai_tool *tools, size_t n_tools,
			json_t *o, struct openai_found *out)
{
	json_t *name = json_object_get(o, "name"), *args = json_object_get(o, "arguments");
	json_t *id = json_object_get(o, "id");
	size_t t = 0;

	if (!json_is_string(name))
		return 1;   /* else t stayed 0: a call of tools[0] */
	while (t < n_tools && strcmp(tools[t].name, json_string_value(name)))
		t++;
	if (t == n_tools || !json_is_object(args) || (id && !json_is_string(id)) ||
	    json_object_size(o) != 2u + (id != NULL))
		return 1;
	if (!out)
		return 0;
	snprintf(out->name, sizeof(out->name), "%s", tools[t].name);
	out->arguments = json_dumps(args, 0);
	return out->arguments ? 0 : -ENOMEM;
}

/* p[0, n) is a JSON array of 1 or more calls: 0; 1 when not; -ENOMEM. */
static int mistral_list(const struct openai_tool *tools, size_t n_tools,
			const char *p, size_t n)
{
	json_t *a = json_loadb(p, n, 0, NULL), *e;
	size_t i;
	int rc = json_array_size(a) ? 0 : 1;

	json_array_foreach(a, i, e)
		if (!rc)
			rc = mistral_call(tools, n_tools, e, NULL);
	json_decref(a);
	return rc;
}

/* The next call of a list read whole (mistral_list), at p[i] (after its
 * '[' or a call): out->end past it, and past the list's ']' when it is
 * the last (*in_list cleared). */
static int mistral_next(const struct openai_tool *tools, size_t n_tools,
			const char *p, size_t i, size_t len, bool *in_list,
			struct openai_found *out)
{
	json_error_t je;
	json_t *o;
	int rc;

	i = skip_ws(p, i, len);
	if (i < len && p[i] == ',')
		i = skip_ws(p, i + 1, len);
	o = json_loadb(p + i, len - i, JSON_DISABLE_EOF_CHECK, &je);
	rc = o ? mistral_call(tools, n_tools, o, out) : 1;
	json_decref(o);
	if (rc) {   /* never for a list read whole: the rest is text */
		*in_list = false;
		return rc < 0 ? rc : OPENAI_SCAN_TEXT;
	}
	out->end = skip_ws(p, i + (size_t)je.position, len);
	if (out->end < len && p[out->end] == ']') {
		out->end++;
		*in_list = false;
	}
	return OPENAI_SCAN_CALL;
}

/* Text, then the [TOOL_CALLS] token (its mark: the text "[TOOL_CALLS]"
 * spelled out of ordinary pieces is text) and a list: the list is held
 * until its ']' comes (at most OPENAI_CALL_HOLD_MAX bytes from the
 * token), then read whole; a list of calls gives them one per scan
 * (*in_list between). A mark that opens no list of calls is text (the
 * front gives none out: openai_calls_unmark). */
static int scan_mistral(const struct openai_tool *tools, size_t n_tools,
			const char *p, size_t len, bool final, bool *in_list,
			struct openai_found *out)
{
	const size_t ml = 1;   /* OPENAI_CALLS_MARK */
	size_t from = 0;

	if (*in_list) {
		out->text = 0;
		return mistral_next(tools, n_tools, p, 0, len, in_list, out);
	}
	for (;;) {
		const char *m = memchr(p + from, OPENAI_CALLS_MARK, len - from);
		size_t at, i, end;
		int rc;

		if (!m) {
			out->text = len;
			return OPENAI_SCAN_TEXT;
		}
		at = (size_t)(m - p);
		i = skip_ws(p, at + ml, len);
		end = i < len && p[i] == '[' ? list_close(p, i, len) : 0;
		if ((i == len || (p[i] == '[' && !end)) && !final &&
		    len - at <= OPENAI_CALL_HOLD_MAX) {
			out->text = at;   /* held: the list may still come */
			return OPENAI_SCAN_TEXT;
		}
		rc = end ? mistral_list(tools, n_tools, p + i, end - i) : 1;
		if (rc < 0)
			return rc;
		if (rc == 0) {
			*in_list = true;
			out->text = at;
			return mistral_next(tools, n_tools, p, i + 1, len, in_list, out);
		}
		from = end ? end : at + ml;   /* not a list of calls: text */
	}
}

int openai_calls_scan(enum chat_format f, const struct openai_tool *tools,
		      size_t n_tools, const char *p, size_t len, bool final,
		      bool *plain, struct openai_found *out)
{
	out->text = len;
	out->end = len;
	out->arguments = NULL;
	out->name[0] = '\0';
	if (!p)
		p = "";   /* an empty answer's (len 0): memmem and memchr take no NULL */
	if (f == CHAT_CHATML)
		return scan_chatml(tools, n_tools, p, len, final, out);
	if (f == CHAT_LLAMA3)
		return scan_llama3(tools, n_tools, p, len, final, plain, out);
	if (f == CHAT_MISTRAL_V3)
		return scan_mistral(tools, n_tools, p, len, final, plain, out);
	return OPENAI_SCAN_TEXT;
}
