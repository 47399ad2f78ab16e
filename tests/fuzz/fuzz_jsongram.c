/* fuzz_jsongram.c - the schema compiler (net/wire/jschema.h) and the JSON
 * recognizer (gpu/text/jsongram.h) on any bytes.
 *
 * Input: byte 0 bit 0 set: a schema follows, up to the first NUL, then
 * the document; clear: the document follows (json_object). Bit 1 set
 * with bit 0: the schema is a strict tool's parameters, and the grammar
 * is a forced call (tool_choice required, net/wire/openai_toolgram.c)
 * of that tool or a non-strict one, in the chatml format (Hermes
 * <tool_call> tags, repeated; bit 3: parallel_tool_calls false) or,
 * with bit 2, llama3's bare call object, or, with bit 4 (bit 2 clear),
 * mistral_v3's list of calls (fed the bytes after its [TOOL_CALLS]
 * token, the grammar's lead, whose mark the scanner reads first); bit 5:
 * tool_choice "auto" instead, the same grammar made lazy (free text
 * until "<tool_call>", or llama3's first `{`; mistral_v3's lazy run
 * waits for its lead token, which a run fed bytes has not: its bytes
 * are the grammar's from the first). The document
 * is fed byte by byte; a refused byte is skipped (the state must not
 * change) and the next is tried.
 * Properties:
 *   - the compiler returns 0 with a grammar, or JSCHEMA_E_INVALID with
 *     no grammar and a message, or -ENOMEM; nothing else;
 *   - no dead end: after every accepted byte, the value is complete or
 *     some byte is accepted;
 *   - a refused byte changes nothing (the next byte is judged the same
 *     as without it: checked by replaying the accepted bytes alone);
 *   - when the accepted bytes form a complete value, jansson (another
 *     parser) reads them, as an object for json_object (unless a key
 *     holds \u0000, which jansson cannot store); a complete forced call
 *     is read by openai_calls_scan as calls of the two tools only;
 *   - lazy: every byte of free text is accepted; the run has left free
 *     text exactly when the accepted bytes hold "<tool_call>" (chatml)
 *     or start with `{` after whitespace (llama3), and once complete
 *     what follows the trigger is calls of the two tools only.
 */
#include <errno.h>
#include <jansson.h>

#include "gpu/text/jsongram.h"
#include "net/wire/jschema.h"
#include "net/wire/openai.h"
#include "net/wire/openai_tools.h"
#include "tests/fuzz/fuzz.h"

const char fuzz_target_name[] = "jsongram";

static bool some_byte(const struct jgram_run *r)
{
	for (unsigned c = 0; c < 256; c++)
		if (jgram_run_can(r, (uint8_t)c))
			return true;
	return false;
}

/* The forced call's grammar: q parsed and its grammar in q->gram; false
 * when the schema is no JSON or the request is refused (a 400). */
static bool call_req(struct openai_req *q, const uint8_t *schema, size_t n,
		     enum chat_format f, bool one, bool lazy)
{
	json_t *params = json_loadb((const char *)schema, n, JSON_DECODE_ANY, NULL);
	json_t *body = params ? json_pack("{s:[{s:s,s:s}],s:s,s:b,s:[{s:s,s:{s:s,s:b,s:o}},"
					  "{s:s,s:{s:s}}]}",
					  "messages", "role", "user", "content", "x",
					  "tool_choice", lazy ? "auto" : "required",
					  "parallel_tool_calls", !one,
					  "tools", "type", "function", "function", "name", "f",
					  "strict", 1, "parameters", params,
					  "type", "function", "function", "name", "g") : NULL;
	char *text = body ? json_dumps(body, 0) : NULL;
	struct openai_error e;
	bool ok = text && !openai_req_parse(q, true, text, strlen(text), &e);

	if (ok && openai_tools_grammar(q, f, &e)) {
		openai_req_deinit(q);
		ok = false;
	}
	FUZZ_CHECK(!ok || q->gram, "a forced call without a grammar");
	free(text);
	json_decref(body);
	return ok;
}

/* A complete forced call is calls of f or g to the scanner, nothing else
 * (after the format's lead token's mark, which the front writes). */
static void check_calls(const struct openai_req *q, enum chat_format f,
			const char *doc, size_t n)
{
	static const char mark[] = { OPENAI_CALLS_MARK };
	size_t ll = openai_calls_token(f) ? sizeof(mark) : 0;
	char *all = malloc(ll + n + 1);
	const char *p = all;
	struct openai_found o;
	bool plain = false;
	unsigned calls = 0;
	int rc;

	FUZZ_CHECK(all, "out of memory");
	memcpy(all, mark, ll);
	memcpy(all + ll, doc, n);
	n += ll;

	do {
		rc = openai_calls_scan(f, q->tools, q->n_tools, p, n, true, &plain, &o);
		FUZZ_CHECK(rc >= 0, "out of memory");
		for (size_t i = 0; i < o.text; i++)
			FUZZ_CHECK(strchr(" \t\r\n", p[i]), "text beside the calls: '%.*s'", (int)n, p);
		free(o.arguments);
		calls += rc == OPENAI_SCAN_CALL;
		p += rc == OPENAI_SCAN_CALL ? o.end : o.text;
		n -= rc == OPENAI_SCAN_CALL ? o.end : o.text;
	} while (rc == OPENAI_SCAN_CALL);
	FUZZ_CHECK(calls >= 1, "a complete forced call the scanner does not read");
	free(all);
}

/* Where a lazy run's grammar begins in acc (k bytes), or NULL when it
 * stays free text: after the first "<tool_call>" (chatml; the call's
 * pre is checked from its start), at a first `{` (llama3), at once
 * (mistral_v3, whose trigger is its lead token, absent here). */
static const char *lazy_start(enum chat_format f, const char *acc, size_t k)
{
	size_t i = 0;

	if (f == CHAT_CHATML)
		return memmem(acc, k, "<tool_call>", 11);
	if (f == CHAT_MISTRAL_V3)
		return acc;   /* no lead in a run fed bytes: the grammar's at once */
	while (i < k && (acc[i] == ' ' || acc[i] == '\t' || acc[i] == '\r' || acc[i] == '\n'))
		i++;
	return i < k && acc[i] == '{' ? acc + i : NULL;
}

static void run_doc(const struct jgram *g, const uint8_t *d, size_t n, bool object,
		    const struct openai_req *calls, enum chat_format f, bool lazy)
{
	const char *from;
	struct jgram_run *r, *replay;
	char *acc = malloc(n + 1);
	size_t k = 0;
	json_error_t je;
	json_t *j;

	FUZZ_CHECK(acc && !jgram_run_new(&r, g, NULL) && !jgram_run_new(&replay, g, NULL),
		   "out of memory");
	for (size_t i = 0; i < n; i++) {
		bool free_text = jgram_run_free_text(r);

		FUZZ_CHECK(lazy || !free_text, "free text in a grammar that is not lazy");
		if (!jgram_run_feed(r, (const char *)d + i, 1)) {
			FUZZ_CHECK(!free_text, "free text refused byte %zu", i);
			continue;
		}
		acc[k++] = (char)d[i];
		FUZZ_CHECK(jgram_run_feed(replay, (const char *)d + i, 1),
			   "byte %zu accepted after refused bytes, refused without them", i);
		FUZZ_CHECK(jgram_run_complete(r) || some_byte(r), "a dead end after %zu bytes", k);
		FUZZ_CHECK(!lazy || jgram_run_triggered(r) == !!lazy_start(f, acc, k),
			   "triggered %d after '%.*s'", jgram_run_triggered(r), (int)k, acc);
	}
	FUZZ_CHECK(jgram_run_complete(r) == jgram_run_complete(replay), "replay differs");
	if (jgram_run_complete(r)) {
		j = calls ? NULL : json_loadb(acc, k, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
		/* jansson holds no NUL in keys: valid JSON it cannot store */
		FUZZ_CHECK(calls || j || strstr(je.text, "NUL byte in object key"),
			   "complete but jansson refuses '%.*s': %s", (int)k, acc, je.text);
		FUZZ_CHECK(!j || !object || json_is_object(j), "json_object gave another value");
		json_decref(j);
		/* (jansson, the scanner's parser, holds no NUL in a key) */
		from = lazy ? lazy_start(f, acc, k) : acc;
		if (calls && from && !memmem(acc, k, "\\u0000", 6))
			check_calls(calls, f, from, k - (size_t)(from - acc));
	}
	jgram_run_free(r);
	jgram_run_free(replay);
	free(acc);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct jgram *g = NULL;
	const uint8_t *doc;
	char msg[200] = "";
	size_t n_schema;
	int rc;

	if (size < 1)
		return 0;
	if (!(data[0] & 1)) {
		FUZZ_CHECK(!jgram_new_object(&g), "json_object grammar");
		run_doc(g, data + 1, size - 1, true, NULL, CHAT_NONE, false);
		jgram_free(g);
		return 0;
	}
	doc = memchr(data + 1, 0, size - 1);
	n_schema = doc ? (size_t)(doc - data - 1) : size - 1;
	doc = doc ? doc + 1 : data + size;
	if (data[0] & 2) {
		enum chat_format f = (data[0] & 4) ? CHAT_LLAMA3
				     : (data[0] & 16) ? CHAT_MISTRAL_V3 : CHAT_CHATML;
		struct openai_req q;

		if (call_req(&q, data + 1, n_schema, f, data[0] & 8, data[0] & 32)) {
			run_doc(q.gram, doc, (size_t)(data + size - doc), false, &q, f, data[0] & 32);
			openai_req_deinit(&q);
		}
		return 0;
	}
	rc = jschema_compile_text((const char *)data + 1, n_schema, &g, msg, sizeof(msg));
	FUZZ_CHECK(rc == 0 || rc == JSCHEMA_E_INVALID || rc == -ENOMEM, "rc %d", rc);
	FUZZ_CHECK(rc || g, "success without a grammar");
	FUZZ_CHECK(!rc || (!g && (rc < 0 || msg[0])), "rc %d: a grammar or no message", rc);
	if (!rc)
		run_doc(g, doc, (size_t)(data + size - doc), false, NULL, CHAT_NONE, false);
	jgram_free(g);
	return 0;
}

static void seed(fuzz_emit_fn emit, void *ctx, uint8_t mode, const char *schema,
		 const char *doc)
{
	size_t ns = schema ? strlen(schema) + 1 : 0, nd = strlen(doc);
	uint8_t *b = malloc(1 + ns + nd);

	if (!b)
		abort();
	b[0] = mode;
	if (schema)
		memcpy(b + 1, schema, ns);
	memcpy(b + 1 + ns, doc, nd);
	emit(ctx, b, 1 + ns + nd);
	free(b);
}

void fuzz_target_seeds(fuzz_emit_fn emit, void *ctx)
{
	static const char person[] =
		"{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
		"\"age\":{\"type\":\"integer\"},\"tags\":{\"type\":\"array\",\"items\":"
		"{\"enum\":[\"a\",\"b\",1.5,null]},\"minItems\":1,\"maxItems\":3},"
		"\"x\":{\"$ref\":\"#/$defs/x\"}},\"required\":[\"name\"],"
		"\"$defs\":{\"x\":{\"type\":[\"number\",\"boolean\"]}}}";

	seed(emit, ctx, 0, NULL, "{\"a\":[1,-2.5e+3,true,null,\"\\u00e9\\ud83d\\ude00\"]}");
	seed(emit, ctx, 0, NULL, " {\"k\" : {\"n\":{}} , \"s\":\"\xc3\xa9\xf0\x9f\x98\x80\"}  ");
	seed(emit, ctx, 1, person, "{\"name\":\"x\",\"age\":3,\"tags\":[\"a\",1.5],\"x\":true}");
	seed(emit, ctx, 1, "{\"enum\":[1,12,\"s\",true]}", "12");
	seed(emit, ctx, 1, "{}", "[{\"q\":[null]},\"s\",0.5]");
	seed(emit, ctx, 1, "{\"type\":\"string\",\"pattern\":\"x\"}", "\"x\"");
	seed(emit, ctx, 1, "{\"type\":\"string\",\"pattern\":\"^(a|\\\\\\\"b)[^x-z]{1,3}\\\\d*\\\\.?$\","
	     "\"minLength\":2,\"maxLength\":6}", "\"\\\"b\\u00e9\xc3\xa9q\\\\7.\"");
	seed(emit, ctx, 1, "{\"type\":\"string\",\"minLength\":1,\"maxLength\":2}",
	     "\"\\ud83d\\ude00\xc3\xa9x\"");
	seed(emit, ctx, 1, "{\"type\":\"array\",\"items\":{\"type\":\"string\",\"format\":\"date-time\"}}",
	     "[\"2024-02-28T23:59:09.5+01:00\",\"1999-13\"]");
	seed(emit, ctx, 1, "{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"null\"}}},"
	     "{\"type\":[\"string\",\"null\"],\"format\":\"uuid\"},{\"enum\":[1,true]}]}",
	     "{\"a\":null}");
	seed(emit, ctx, 1, "{\"type\":\"array\",\"items\":{\"anyOf\":[{\"type\":\"integer\",\"minimum\":-7,"
	     "\"exclusiveMaximum\":1200},{\"type\":\"string\",\"maxLength\":2}]}}",
	     "[-7,1199,0,\"ab\",15]");
	seed(emit, ctx, 1, "{\"type\":\"number\",\"exclusiveMinimum\":-1,\"maximum\":0}", "-0.5");
	seed(emit, ctx, 1, "{\"oneOf\":[{\"type\":\"object\",\"properties\":{\"k\":{\"const\":\"a\"},"
	     "\"v\":{\"type\":\"integer\"}},\"required\":[\"k\"]},{\"type\":\"object\",\"properties\":"
	     "{\"k\":{\"enum\":[\"b\"]}},\"required\":[\"k\"]},{\"type\":\"array\"}]}",
	     "{\"k\":\"a\",\"v\":3}");
	seed(emit, ctx, 3, "{\"type\":\"object\",\"properties\":{\"e\":{\"oneOf\":[{\"type\":\"integer\"},"
	     "{\"type\":\"string\",\"format\":\"email\",\"maxLength\":9}]}}}",
	     "<tool_call>{\"name\": \"f\", \"arguments\": {\"e\": \"a.b@cd.io\"}}</tool_call>");
	seed(emit, ctx, 3, person, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"name\": \"x\"}}\n"
	     "</tool_call>\n<tool_call>{\"name\": \"g\", \"arguments\": {\"q\": [1]}}</tool_call>");
	seed(emit, ctx, 7, "{\"type\":\"object\"}", "{\"name\": \"g\", \"parameters\": {}}");
	seed(emit, ctx, 11, "{\"type\":\"object\",\"properties\":{\"k\":{\"enum\":[1,2]}}}",
	     "<tool_call>{\"name\":\"f\",\"arguments\":{\"k\":2}}</tool_call><tool_call>");
	seed(emit, ctx, 19, person, " [{\"name\": \"f\", \"arguments\": {\"name\": \"x\"}}, "
	     "{\"name\":\"g\",\"arguments\":{\"q\":\"]\"}}] ");
	seed(emit, ctx, 27, "{\"type\":\"object\"}", "[{\"name\": \"g\", \"arguments\": {}}, {");
	/* tool_choice auto: lazy */
	seed(emit, ctx, 35, "{\"type\":\"object\",\"properties\":{\"k\":{\"enum\":[1,2]}}}",
	     "Let me see <tool <<tool_call>\n{\"name\":\"f\",\"arguments\":{\"k\":3}}</tool_call> x");
	seed(emit, ctx, 43, "{\"type\":\"object\"}",
	     "text<tool_call>{\"name\": \"g\", \"arguments\": {}}</tool_call>\n<tool_call>");
	seed(emit, ctx, 39, "{\"type\":\"object\"}", " \n{\"name\": \"f\", \"parameters\": {}} x");
	seed(emit, ctx, 39, "{\"type\":\"object\"}", "Sure: {\"name\": \"f\"}");
	seed(emit, ctx, 51, "{\"type\":\"object\"}", "[{\"name\": \"g\", \"arguments\": {}}] x");
}
