/* test_openai_tools.c - tools in OpenAI chat bodies and the calls in a
 * model's output (net/wire/openai_tools.c): the request's tools kept as
 * the templates print them, the refusals (param named), an assistant's
 * tool_calls and a tool message read back; the output scanned into calls
 * per format - well-formed, several, malformed, an unknown name, never
 * closed, too long - and the same answer whatever the pieces a stream
 * brings it in (every byte boundary, and byte by byte).
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net/wire/openai.h"
#include "net/wire/openai_tools.h"

static int parse(const char *body, struct openai_req *q, struct openai_error *e)
{
	memset(e, 0, sizeof(*e));
	return openai_req_parse(q, true, body, strlen(body), e);
}

#define MSGS "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"
#define TOOL(name) "{\"type\":\"function\",\"function\":{\"name\":\"" name "\"," \
	"\"description\":\"d\",\"parameters\":{\"type\":\"object\",\"properties\":" \
	"{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}}}"

static void refused(const char *body, const char *param, const char *words)
{
	struct openai_req q;
	struct openai_error e;

	ck_assert_msg(parse(body, &q, &e) == OPENAI_E_INVALID, "accepted: %s", body);
	ck_assert_int_eq(e.status, 400);
	ck_assert_msg(!strcmp(e.param, param), "%s: param %s, want %s", body, e.param, param);
	ck_assert_msg(strstr(e.msg, words), "%s: '%s' lacks '%s'", body, e.msg, words);
}

/* The tool kept as json.dumps writes it (", " and ": "), and indented by
 * 4 as tojson(indent=4), in the client's key order. */
START_TEST(test_tools_kept)
{
	struct openai_req q;
	struct openai_error e;

	ck_assert_int_eq(parse("{" MSGS ",\"tools\":[" TOOL("get_weather") "," TOOL("b-2") "],"
			       "\"tool_choice\":\"auto\",\"parallel_tool_calls\":true}", &q, &e), 0);
	ck_assert_uint_eq(q.n_tools, 2);
	ck_assert_str_eq(q.tools[0].name, "get_weather");
	ck_assert_str_eq(q.tools[1].name, "b-2");
	ck_assert_str_eq(q.tools[0].json,
		"{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
		"\"description\": \"d\", \"parameters\": {\"type\": \"object\", "
		"\"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}");
	ck_assert_str_eq(q.tools[0].json_indent,
		"{\n    \"type\": \"function\",\n    \"function\": {\n"
		"        \"name\": \"get_weather\",\n        \"description\": \"d\",\n"
		"        \"parameters\": {\n            \"type\": \"object\",\n"
		"            \"properties\": {\n                \"city\": {\n"
		"                    \"type\": \"string\"\n                }\n"
		"            },\n            \"required\": [\n                \"city\"\n"
		"            ]\n        }\n    }\n}");
	ck_assert(openai_req_calls(&q));
	ck_assert(q.ignored & (1u << OPENAI_IGN_PARALLEL_TOOL_CALLS));   /* true: changes nothing */
	openai_req_deinit(&q);
	ck_assert_int_eq(parse("{" MSGS ",\"tools\":[" TOOL("f") "],\"parallel_tool_calls\":false}", &q, &e), 0);
	ck_assert(q.no_parallel_calls && !(q.ignored & (1u << OPENAI_IGN_PARALLEL_TOOL_CALLS)));
	openai_req_deinit(&q);
	/* "none": kept, but the model may not call */
	ck_assert_int_eq(parse("{" MSGS ",\"tools\":[" TOOL("f") "],\"tool_choice\":\"none\","
			       "\"parallel_tool_calls\":false}", &q, &e), 0);
	ck_assert(!openai_req_calls(&q));
	openai_req_deinit(&q);
	/* empty and null: no tools */
	ck_assert_int_eq(parse("{" MSGS ",\"tools\":[],\"tool_choice\":null}", &q, &e), 0);
	ck_assert_uint_eq(q.n_tools, 0);
	ck_assert(!openai_req_calls(&q));
	openai_req_deinit(&q);
}
END_TEST

START_TEST(test_tools_refused)
{
	char body[64000];
	size_t o;

	refused("{" MSGS ",\"tools\":{}}", "tools", "array");
	refused("{" MSGS ",\"tools\":[{\"type\":\"retrieval\",\"function\":{\"name\":\"f\"}}]}",
		"tools", "type function");
	refused("{" MSGS ",\"tools\":[{\"type\":\"function\"}]}", "tools", "must be");
	refused("{" MSGS ",\"tools\":[" TOOL("a b") "]}", "tools", "a-z");
	refused("{" MSGS ",\"tools\":[" TOOL("") "]}", "tools", "a-z");
	refused("{" MSGS ",\"tools\":[" TOOL("x12345678901234567890123456789012345678901234567890123456789012345") "]}",
		"tools", "a-z");
	refused("{" MSGS ",\"tools\":[" TOOL("f") "," TOOL("f") "]}", "tools", "two tools");
	refused("{" MSGS ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":[]}}]}",
		"tools", "wrong type");
	refused("{" MSGS ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"strict\":true}}]}",
		"tools", "needs 'parameters'");
	/* strict: the schema's keywords outside jschema's subset, by name */
	refused("{" MSGS ",\"tools\":[" TOOL("g") ",{\"type\":\"function\",\"function\":{\"name\":\"f\",\"strict\":true,"
		"\"parameters\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"not\":{}}}}}}]}",
		"tools", "tools[1].function.parameters': the schema keyword 'not'");
	refused("{" MSGS ",\"tools\":[" TOOL("g") ",{\"type\":\"function\",\"function\":{\"name\":\"f\",\"strict\":true,"
		"\"parameters\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"pattern\":\"(?!x)\"}}}}}]}",
		"tools", "tools[1].function.parameters': 'pattern' cannot be served: lookaround");
	refused("{" MSGS ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"strict\":1}}]}",
		"tools", "wrong type");
	refused("{" MSGS ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"code\":1}}]}",
		"tools", "takes name");
	refused("{" MSGS ",\"tool_choice\":\"required\"}", "tool_choice", "needs 'tools'");
	refused("{" MSGS ",\"tools\":[" TOOL("f") "],\"tool_choice\":{\"type\":\"function\","
		"\"function\":{\"name\":\"g\"}}}", "tool_choice", "names 'g', which is not");
	refused("{" MSGS ",\"tools\":[" TOOL("f") "],\"tool_choice\":{\"type\":\"function\","
		"\"function\":{\"name\":\"f\",\"x\":1}}}", "tool_choice", "must be");
	refused("{" MSGS ",\"tools\":[" TOOL("f") "],\"tool_choice\":{\"type\":\"allowed_tools\","
		"\"allowed_tools\":{\"mode\":\"sometimes\",\"tools\":[]}}}", "tool_choice", "allowed_tools");
	refused("{" MSGS ",\"tools\":[" TOOL("f") "],\"tool_choice\":{\"type\":\"allowed_tools\","
		"\"allowed_tools\":{\"mode\":\"required\",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"h\"}}]}}}",
		"tool_choice", "tools[0]' names 'h'");
	refused("{" MSGS ",\"tool_choice\":\"sometimes\"}", "tool_choice", "must be");
	refused("{" MSGS ",\"functions\":[{\"name\":\"f\"}]}", "functions", "not supported");
	/* 129 tools */
	o = (size_t)snprintf(body, sizeof(body), "{" MSGS ",\"tools\":[");
	for (int i = 0; i < 129; i++)
		o += (size_t)snprintf(body + o, sizeof(body) - o, "%s{\"type\":\"function\",\"function\":{\"name\":\"f%d\"}}",
				      i ? "," : "", i);
	snprintf(body + o, sizeof(body) - o, "]}");
	refused(body, "tools", "at most 128");
	/* 128 pass */
	char *comma = strstr(body, ",{\"type\":\"function\",\"function\":{\"name\":\"f128\"}}");
	ck_assert_ptr_nonnull(comma);
	strcpy(comma, "]}");
	struct openai_req q;
	struct openai_error e;
	ck_assert_int_eq(parse(body, &q, &e), 0);
	ck_assert_uint_eq(q.n_tools, 128);
	openai_req_deinit(&q);
}
END_TEST

/* An assistant's calls (content null) and the tool results read back:
 * arguments re-serialized as the templates print a mapping. */
START_TEST(test_tool_messages)
{
	struct openai_req q;
	struct openai_error e;

	ck_assert_int_eq(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"w?\"},"
			       "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":["
			       "{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
			       "\"arguments\":\"{\\\"city\\\":\\\"Paris\\\",\\\"n\\\":[1,2]}\"}},"
			       "{\"id\":\"call_2\",\"type\":\"function\",\"function\":{\"name\":\"g\",\"arguments\":\"{}\"}}]},"
			       "{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"18C\"},"
			       "{\"role\":\"tool\",\"tool_call_id\":\"call_2\",\"content\":[{\"type\":\"text\",\"text\":\"ok\"}]}]}",
			       &q, &e), 0);
	ck_assert_uint_eq(q.n_msgs, 4);
	ck_assert_str_eq(q.msgs[1].role, "assistant");
	ck_assert_str_eq(q.msgs[1].content, "");
	ck_assert_uint_eq(q.msgs[1].n_calls, 2);
	ck_assert_str_eq(q.msgs[1].calls[0].name, "get_weather");
	ck_assert_str_eq(q.msgs[1].calls[0].arguments, "{\"city\": \"Paris\", \"n\": [1, 2]}");
	ck_assert_str_eq(q.msgs[1].calls[1].arguments, "{}");
	ck_assert_str_eq(q.msgs[2].role, "tool");
	ck_assert_str_eq(q.msgs[2].content, "18C");
	ck_assert_str_eq(q.msgs[3].content, "ok");
	openai_req_deinit(&q);

	refused("{\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}", "messages", "tool_call_id");
	refused("{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"tool_call_id\":\"a\"}]}",
		"tool_call_id", "not supported");
	refused("{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"tool_calls\":[]}]}",
		"tool_calls", "not supported");
	refused("{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"c\",\"type\":\"function\","
		"\"function\":{\"name\":\"f\",\"arguments\":\"[1]\"}}]}]}", "messages", "JSON object");
	refused("{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"c\",\"type\":\"function\","
		"\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\":\"}}]}]}", "messages", "JSON object");
	refused("{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"c\",\"type\":\"function\","
		"\"function\":{\"name\":\"f g\",\"arguments\":\"{}\"}}]}]}", "messages", "a-z");
	refused("{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":{}}]}", "messages", "array");
	refused("{\"messages\":[{\"role\":\"assistant\",\"content\":null}]}", "messages", "content");
	refused("{\"messages\":[{\"role\":\"function\",\"content\":\"x\"}]}", "messages", "tool");
}
END_TEST

/* The assistant message the openai SDK's chat.completions.parse()
 * answers, sent back as it is (its docs' round trip): its "parsed" and
 * each function's "parsed_arguments" (the SDK's own parses) are ignored,
 * the content and the arguments string count; elsewhere they stay
 * refused. */
START_TEST(test_sdk_parsed_echo)
{
	struct openai_req q;
	struct openai_error e;

	ck_assert_int_eq(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"w?\"},"
			       "{\"role\":\"assistant\",\"content\":null,\"parsed\":null,\"tool_calls\":["
			       "{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
			       "\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\",\"parsed_arguments\":{\"city\":\"Rome\"}}}]},"
			       "{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"18C\"},"
			       "{\"role\":\"assistant\",\"content\":\"{\\\"a\\\":1}\",\"parsed\":{\"a\":1}}]}",
			       &q, &e), 0);
	ck_assert_uint_eq(q.n_msgs, 4);
	ck_assert_uint_eq(q.msgs[1].n_calls, 1);
	ck_assert_str_eq(q.msgs[1].calls[0].arguments, "{\"city\": \"Paris\"}");
	ck_assert_str_eq(q.msgs[3].content, "{\"a\":1}");
	openai_req_deinit(&q);

	refused("{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"parsed\":null}]}",
		"parsed", "not supported");
	refused("{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"c\",\"type\":\"function\","
		"\"function\":{\"name\":\"f\",\"arguments\":\"{}\",\"extra\":1}}]}]}", "messages", "function");
	refused("{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"c\",\"type\":\"function\","
		"\"function\":{\"name\":\"f\",\"parsed_arguments\":{}}}]}]}", "messages", "function");
}
END_TEST

/* ---- the output ------------------------------------------------------------------ */

static const struct openai_tool tools[] = { { .name = "get_weather" },
					    { .name = "f" } };

/* What an answer became: its text and calls ("name args;" each). */
struct got {
	char text[OPENAI_CALL_HOLD_MAX * 2 + 4096];
	char calls[4096];
	size_t n_calls;
	size_t max_held;
};

/* The text as the front gives it out: without the calls mark. */
static void got_text(struct got *g, const char *p, size_t n)
{
	size_t l = strlen(g->text);

	ck_assert_uint_lt(l + n, sizeof(g->text));
	l += openai_calls_unmark(g->text + l, p, n);
	g->text[l] = 0;
}

/* Scan buf[0, *len) as the front does: text out, calls out, the rest
 * held (moved to the front of buf). */
static void drain(enum chat_format f, char *buf, size_t *len, bool final,
		  bool *plain, struct got *g)
{
	struct openai_found o;
	int rc;

	do {
		rc = openai_calls_scan(f, tools, 2, buf, *len, final, plain, &o);
		ck_assert_int_ge(rc, 0);
		ck_assert_uint_le(o.text, *len);
		got_text(g, buf, o.text);
		if (rc == OPENAI_SCAN_CALL) {
			ck_assert_uint_le(o.end, *len);
			snprintf(g->calls + strlen(g->calls), sizeof(g->calls) - strlen(g->calls),
				 "%s %s;", o.name, o.arguments);
			g->n_calls++;
			free(o.arguments);
		} else {
			ck_assert_ptr_null(o.arguments);
			o.end = o.text;
		}
		memmove(buf, buf + o.end, *len - o.end);
		*len -= o.end;
	} while (rc == OPENAI_SCAN_CALL);
	if (*len > g->max_held)
		g->max_held = *len;
	if (final)
		ck_assert_uint_eq(*len, 0);
}

/* The answer s arriving in pieces cut at cuts[0..n_cuts) */
static void run_pieces(enum chat_format f, const char *s, const size_t *cuts,
		       size_t n_cuts, struct got *g)
{
	size_t n = strlen(s), len = 0, from = 0;
	char *buf = malloc(n + 1);
	bool plain = false;

	memset(g, 0, sizeof(*g));
	for (size_t c = 0; c <= n_cuts; c++) {
		size_t to = c < n_cuts ? cuts[c] : n;

		memcpy(buf + len, s + from, to - from);
		len += to - from;
		from = to;
		drain(f, buf, &len, false, &plain, g);
	}
	drain(f, buf, &len, true, &plain, g);
	free(buf);
}

/* s parsed whole, then in two pieces cut at every byte, then byte by
 * byte: always text `text` and calls `calls`. */
static void expect_scan(enum chat_format f, const char *s, const char *text,
			const char *calls)
{
	size_t n = strlen(s), *cuts = malloc((n + 1) * sizeof(*cuts));
	struct got g;

	run_pieces(f, s, NULL, 0, &g);
	ck_assert_msg(!strcmp(g.text, text) && !strcmp(g.calls, calls),
		      "[%s]: text [%s] calls [%s], want [%s] [%s]", s, g.text, g.calls, text, calls);
	for (size_t c = 0; c <= n; c++) {
		cuts[0] = c;
		run_pieces(f, s, cuts, 1, &g);
		ck_assert_msg(!strcmp(g.text, text) && !strcmp(g.calls, calls),
			      "[%s] cut at %zu: text [%s] calls [%s]", s, c, g.text, g.calls);
	}
	for (size_t c = 0; c < n; c++)
		cuts[c] = c;
	run_pieces(f, s, cuts, n, &g);
	ck_assert_msg(!strcmp(g.text, text) && !strcmp(g.calls, calls),
		      "[%s] byte by byte: text [%s] calls [%s]", s, g.text, g.calls);
	free(cuts);
}

#define CALL_W "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"

START_TEST(test_scan_chatml)
{
	ck_assert(openai_calls_format(CHAT_CHATML));
	ck_assert(openai_calls_format(CHAT_LLAMA3));
	ck_assert(!openai_calls_format(CHAT_MISTRAL));
	/* plain text, a near miss, a "<" that is not a tag */
	expect_scan(CHAT_CHATML, "Hello <tool> a<b", "Hello <tool> a<b", "");
	/* one call, text before it */
	expect_scan(CHAT_CHATML, "Let me check.\n" CALL_W, "Let me check.\n",
		    "get_weather {\"city\": \"Paris\"};");
	/* several, with text between and after */
	expect_scan(CHAT_CHATML, CALL_W "\n<tool_call>{\"name\":\"f\",\"arguments\":{}}</tool_call> done",
		    "\n done", "get_weather {\"city\": \"Paris\"};f {};");
	/* malformed: bad JSON, an unknown name, no arguments object, extra
	 * keys - each stays text, the well-formed call after it still counts */
	const char *bad[] = {
		"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\"}\n</tool_call>",
		"<tool_call>{\"name\": \"rm_rf\", \"arguments\": {}}</tool_call>",
		"<tool_call>{\"name\": \"f\", \"arguments\": \"{}\"}</tool_call>",
		"<tool_call>{\"name\": \"f\", \"arguments\": {}, \"x\": 1}</tool_call>",
		"<tool_call>{\"name\": \"f\"}</tool_call>",
		"<tool_call>{\"name\": 5, \"arguments\": {}}</tool_call>",
		"<tool_call>{\"foo\": \"f\", \"arguments\": {}}</tool_call>",
		"<tool_call></tool_call>",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char s[512], t[512];

		snprintf(s, sizeof(s), "a%sb" CALL_W, bad[i]);
		snprintf(t, sizeof(t), "a%sb", bad[i]);
		expect_scan(CHAT_CHATML, s, t, "get_weather {\"city\": \"Paris\"};");
	}
	/* a close tag inside a string does not end the call (a call grammar
	 * lets a string hold it); a key given twice keeps its last value */
	expect_scan(CHAT_CHATML, "a<tool_call>{\"name\": \"f\", \"arguments\": {\"s\": \"<\\\"/</tool_call>\"}}</tool_call>b",
		    "ab", "f {\"s\": \"<\\\"/</tool_call>\"};");
	expect_scan(CHAT_CHATML, "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1, \"a\": 2}}</tool_call>",
		    "", "f {\"a\": 2};");
	/* ... but a block whose JSON is bad stays text up to its first close */
	expect_scan(CHAT_CHATML, "<tool_call>{\"x</tool_call>y\"</tool_call>z",
		    "<tool_call>{\"x</tool_call>y\"</tool_call>z", "");
	/* never closed: text at the end */
	expect_scan(CHAT_CHATML, "x<tool_call>{\"name\": \"f\", \"arguments\": {}}",
		    "x<tool_call>{\"name\": \"f\", \"arguments\": {}}", "");
	/* a tag begun at the very end */
	expect_scan(CHAT_CHATML, "x<tool_ca", "x<tool_ca", "");
}
END_TEST

/* the [TOOL_CALLS] token as the front writes it (openai_tools.h) */
#define MK "\xff"
#define MCALL_W "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}"
START_TEST(test_scan_mistral_v3)
{
	ck_assert(openai_calls_format(CHAT_MISTRAL_V3));
	ck_assert_str_eq(openai_calls_token(CHAT_MISTRAL_V3), "[TOOL_CALLS]");
	ck_assert_int_eq(OPENAI_CALLS_MARK, MK[0]);
	ck_assert_ptr_null(openai_calls_token(CHAT_CHATML));
	ck_assert_ptr_null(openai_calls_token(CHAT_LLAMA3));
	/* text, a near miss */
	expect_scan(CHAT_MISTRAL_V3, "Hello [TOOL] [x]", "Hello [TOOL] [x]", "");
	/* text, then the token and a list of one call */
	expect_scan(CHAT_MISTRAL_V3, "Let me check. " MK " [" MCALL_W "]",
		    "Let me check. ", "get_weather {\"city\": \"Paris\"};");
	/* two calls, an id, no space, brackets in strings and arguments,
	 * text after the list */
	expect_scan(CHAT_MISTRAL_V3,
		    MK "[{\"name\":\"f\",\"arguments\":{},\"id\":\"abcdefghi\"}, "
		    "{\"name\": \"get_weather\", \"arguments\": {\"a\": [1, \"]\\\"}\"]}}]\n done",
		    "\n done", "f {};get_weather {\"a\": [1, \"]\\\"}\"]};");
	/* a list with one element that is not a call is text, all of it;
	 * a later list of calls still counts */
	const char *bad[] = {
		"[" MCALL_W ", {\"name\": \"rm\", \"arguments\": {}}]",
		"[{\"name\": \"f\", \"arguments\": \"{}\"}]",
		"[{\"name\": \"f\", \"arguments\": {}, \"x\": 1}]",
		"[{\"name\": \"f\", \"arguments\": {}, \"id\": 7}]",
		"[{\"name\": \"f\"}]",
		"[{\"name\": 5, \"arguments\": {\"x\": 1}}]",      /* not a name: not tools[0] */
		"[{\"foo\": \"get_weather\", \"arguments\": {}}]",
		"[{\"arguments\": {}, \"id\": \"abcdefghi\"}]",
		"[]",
		"[1]",
		"[{\"name\": \"f\", \"arguments\": {}}",
		MCALL_W,
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char s[512], t[512];

		snprintf(s, sizeof(s), "a" MK " %sb", bad[i]);
		snprintf(t, sizeof(t), "a %sb", bad[i]);
		expect_scan(CHAT_MISTRAL_V3, s, t, "");
		snprintf(s, sizeof(s), "a" MK " %s " MK " [" MCALL_W "]", bad[i]);
		snprintf(t, sizeof(t), "a %s ", bad[i]);
		expect_scan(CHAT_MISTRAL_V3, s, t, "get_weather {\"city\": \"Paris\"};");
	}
	/* never closed, the token alone at the end, or prose after it:
	 * text, without the token */
	expect_scan(CHAT_MISTRAL_V3, "x" MK " [{\"name\": \"f\"", "x [{\"name\": \"f\"", "");
	expect_scan(CHAT_MISTRAL_V3, "x" MK " ", "x ", "");
	expect_scan(CHAT_MISTRAL_V3, "x" MK "Sure." MK MK "[1]", "xSure.[1]", "");
	expect_scan(CHAT_MISTRAL_V3, "x[TOOL_CA", "x[TOOL_CA", "");
	/* the token's text spelled out of ordinary pieces (a model's or a
	 * prompt injection's) opens no calls: they would skip the grammar */
	expect_scan(CHAT_MISTRAL_V3, "a[TOOL_CALLS] [" MCALL_W "]", "a[TOOL_CALLS] [" MCALL_W "]", "");
	/* ... nor does it add one to the token's (parallel_tool_calls false
	 * holds the grammar to one) */
	expect_scan(CHAT_MISTRAL_V3, "[TOOL_CALLS] [" MCALL_W "] " MK "[" MCALL_W "]",
		    "[TOOL_CALLS] [" MCALL_W "] ", "get_weather {\"city\": \"Paris\"};");
	/* Mistral v0.1 has none */
	expect_scan(CHAT_MISTRAL, "[TOOL_CALLS] [" MCALL_W "]", "[TOOL_CALLS] [" MCALL_W "]", "");
	expect_scan(CHAT_MISTRAL, MK "[" MCALL_W "]", "[" MCALL_W "]", "");
}
END_TEST

START_TEST(test_scan_llama3)
{
	/* the whole answer is the call (Llama 3.1's "parameters";
	 * "arguments" taken too) */
	expect_scan(CHAT_LLAMA3, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
		    "", "get_weather {\"city\": \"Paris\"};");
	expect_scan(CHAT_LLAMA3, "\n {\"name\":\"f\",\"arguments\":{\"a\":[1]}} \n", "", "f {\"a\": [1]};");
	/* Llama 3.2 adds "type": "function"; another type is not a call */
	expect_scan(CHAT_LLAMA3, "{\"type\": \"function\", \"name\": \"f\", \"parameters\": {}}", "", "f {};");
	expect_scan(CHAT_LLAMA3, "{\"type\": \"x\", \"name\": \"f\", \"parameters\": {}}",
		    "{\"type\": \"x\", \"name\": \"f\", \"parameters\": {}}", "");
	/* text: it does not open with "{" */
	expect_scan(CHAT_LLAMA3, "Sure: {\"name\": \"f\", \"parameters\": {}}",
		    "Sure: {\"name\": \"f\", \"parameters\": {}}", "");
	/* malformed, an unknown name, text after the object, two objects */
	expect_scan(CHAT_LLAMA3, "{\"name\": \"f\", \"parameters\": {}", "{\"name\": \"f\", \"parameters\": {}", "");
	expect_scan(CHAT_LLAMA3, "{\"name\": \"g\", \"parameters\": {}}", "{\"name\": \"g\", \"parameters\": {}}", "");
	expect_scan(CHAT_LLAMA3, "{\"name\": \"f\", \"parameters\": {}} ok", "{\"name\": \"f\", \"parameters\": {}} ok", "");
	expect_scan(CHAT_LLAMA3, "{} {}", "{} {}", "");
	/* a name that is not a string, or none: not a call of tools[0] */
	expect_scan(CHAT_LLAMA3, "{\"name\": 5, \"parameters\": {}}", "{\"name\": 5, \"parameters\": {}}", "");
	expect_scan(CHAT_LLAMA3, "{\"foo\": \"f\", \"parameters\": {}}", "{\"foo\": \"f\", \"parameters\": {}}", "");
	expect_scan(CHAT_LLAMA3, "  ", "  ", "");
	/* a format without a call syntax: all text */
	expect_scan(CHAT_MISTRAL, CALL_W, CALL_W, "");
}
END_TEST

/* An empty answer's text is NULL (the front's buffer, never grown):
 * text, nothing read from it (UBSan: no NULL to memmem or memchr). */
START_TEST(test_scan_empty)
{
	enum chat_format fmts[] = { CHAT_CHATML, CHAT_LLAMA3, CHAT_MISTRAL_V3 };
	struct openai_found o;

	for (size_t k = 0; k < 3; k++)
		for (int final = 0; final < 2; final++) {
			bool plain = false;

			ck_assert_int_eq(openai_calls_scan(fmts[k], tools, 2, NULL, 0, final, &plain, &o),
					 OPENAI_SCAN_TEXT);
			ck_assert_uint_eq(o.text, 0);
		}
}
END_TEST

/* What is held back is bounded: a call that never closes goes out as
 * text once it passes OPENAI_CALL_HOLD_MAX. */
START_TEST(test_scan_bounded)
{
	size_t n = OPENAI_CALL_HOLD_MAX * 2;
	char *s = malloc(n + 64);
	size_t cuts[1024];
	struct got g;
	enum chat_format fmts[] = { CHAT_CHATML, CHAT_LLAMA3, CHAT_MISTRAL_V3 };
	const char *open[] = { "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": \"",
			       "{\"name\": \"f\", \"parameters\": {\"a\": \"",
			       MK " [{\"name\": \"f\", \"arguments\": {\"a\": \"" };

	for (size_t k = 0; k < 3; k++) {
		strcpy(s, open[k]);
		size_t l = strlen(s);
		memset(s + l, 'x', n - l);
		s[n] = 0;
		for (size_t c = 0; c < 1024; c++)
			cuts[c] = (c + 1) * (n / 1025);
		run_pieces(fmts[k], s, cuts, 1024, &g);
		ck_assert_uint_eq(g.n_calls, 0);
		ck_assert_uint_eq(strlen(g.text), n - (k == 2));   /* less mistral_v3's mark */
		ck_assert_uint_le(g.max_held, OPENAI_CALL_HOLD_MAX + n / 1025 + 1);
	}
	free(s);
}
END_TEST

/* ---- tool_choice by grammar (openai_toolgram.c) ---------------------------------- */

#define STRICT(name) "{\"type\":\"function\",\"function\":{\"name\":\"" name "\"," \
	"\"strict\":true,\"parameters\":{\"type\":\"object\",\"properties\":" \
	"{\"n\":{\"type\":\"integer\"},\"u\":{\"enum\":[\"c\",\"f\"]}},\"required\":[\"n\",\"u\"]}}}"

/* q parsed from body and its grammar in format f (0 expected). */
static void gram_of(const char *body, enum chat_format f, struct openai_req *q)
{
	struct openai_error e;

	ck_assert_msg(parse(body, q, &e) == 0, "%s: %s", body, e.msg);
	ck_assert_msg(openai_tools_grammar(q, f, &e) == 0, "%s: %s", body, e.msg);
}

/* -1: text is accepted whole (complete tells whether it may end there);
 * else the index of the first byte refused */
static long gram_feed(const struct jgram *g, const char *text, bool *complete)
{
	struct jgram_run *r;
	long bad = -1;

	ck_assert_int_eq(jgram_run_new(&r, g, NULL), 0);
	for (size_t i = 0; text[i] && bad < 0; i++)
		if (!jgram_run_feed(r, text + i, 1))
			bad = (long)i;
	*complete = jgram_run_complete(r);
	jgram_run_free(r);
	return bad;
}

static void gram_ok(const struct jgram *g, const char *text)
{
	bool complete;
	long bad = gram_feed(g, text, &complete);

	ck_assert_msg(bad < 0 && complete, "'%s': refused at %ld (complete %d)", text, bad,
		      complete);
}

/* text is refused at the byte after prefix (or, with no rest, cannot end) */
static void gram_no(const struct jgram *g, const char *prefix, const char *rest)
{
	char all[512];
	bool complete;
	long bad;

	snprintf(all, sizeof(all), "%s%s", prefix, rest);
	bad = gram_feed(g, all, &complete);
	if (!rest[0])
		ck_assert_msg(bad < 0 && !complete, "'%s': may end (refused at %ld)", all, bad);
	else
		ck_assert_msg(bad == (long)strlen(prefix), "'%s' + '%s': refused at %ld", prefix,
			      rest, bad);
}

/* What the grammar accepts is a call the scanner reads (the front's
 * parse of the answer), with the name and arguments given. */
static void scans_as(enum chat_format f, const struct openai_req *q, const char *text,
		     const char *name, const char *args)
{
	struct openai_found o;
	bool plain = false;

	ck_assert_int_eq(openai_calls_scan(f, q->tools, q->n_tools, text, strlen(text), true,
					   &plain, &o), OPENAI_SCAN_CALL);
	ck_assert_str_eq(o.name, name);
	ck_assert_str_eq(o.arguments, args);
	free(o.arguments);
}

/* llama3, required: {"name": one of the tools, "parameters": ...}, name
 * first, that tool's schema when strict, any object when not; EOS after
 * one call. */
START_TEST(test_grammar_llama3)
{
	struct openai_req q;

	gram_of("{" MSGS ",\"tools\":[" TOOL("get_weather") "," STRICT("count") "],"
		"\"tool_choice\":\"required\"}", CHAT_LLAMA3, &q);
	ck_assert_ptr_nonnull(q.gram);
	gram_ok(q.gram, "{\"name\": \"get_weather\", \"parameters\": {\"x\": [1, {}]}}");
	gram_ok(q.gram, "{\"name\":\"count\",\"parameters\":{\"u\":\"c\",\"n\":-3}}");
	scans_as(CHAT_LLAMA3, &q, "{\"name\": \"count\", \"parameters\": {\"n\": 2, \"u\": \"f\"}}",
		 "count", "{\"n\": 2, \"u\": \"f\"}");
	gram_no(q.gram, "", "Sure");                          /* text */
	gram_no(q.gram, "{\"", "parameters\"");               /* name first */
	gram_no(q.gram, "{\"name\": \"", "other\"");          /* not a tool */
	gram_no(q.gram, "{\"name\": \"get_weather", "s");
	gram_no(q.gram, "{\"name\": \"count\"", "}");          /* its arguments due */
	gram_no(q.gram, "{\"name\": \"count\", \"", "arguments\"");  /* llama3's key */
	gram_no(q.gram, "{\"name\": \"count\", \"parameters\": {\"n\": 1", ".5");  /* strict */
	gram_no(q.gram, "{\"name\": \"count\", \"parameters\": {\"n\": 1, \"u\": \"", "k");
	gram_no(q.gram, "{\"name\": \"count\", \"parameters\": {\"n\": 1", "}");   /* u required */
	gram_no(q.gram, "{\"name\": \"count\", \"parameters\": {\"n\": 1, \"", "z");
	gram_no(q.gram, "{\"name\": \"get_weather\", \"parameters\": ", "[");   /* an object */
	gram_no(q.gram, "{\"name\": \"get_weather\", \"parameters\": {}", ",");  /* nothing else */
	gram_no(q.gram, "{\"name\": \"get_weather\", \"parameters\": {}}", "{");  /* one call */
	gram_no(q.gram, "{\"name\": \"get_weather\", \"parameters\": {}", "");
	openai_req_deinit(&q);
	/* named: that tool only */
	gram_of("{" MSGS ",\"tools\":[" TOOL("get_weather") "," STRICT("count") "],"
		"\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"count\"}}}",
		CHAT_LLAMA3, &q);
	gram_ok(q.gram, "{\"name\": \"count\", \"parameters\": {\"n\": 0, \"u\": \"c\"}}");
	gram_no(q.gram, "{\"name\": \"", "get_weather");
	openai_req_deinit(&q);
	/* allowed_tools required: the subset */
	gram_of("{" MSGS ",\"tools\":[" TOOL("a") "," TOOL("b") "," TOOL("c") "],"
		"\"tool_choice\":{\"type\":\"allowed_tools\",\"allowed_tools\":{\"mode\":\"required\","
		"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"c\"}},"
		"{\"type\":\"function\",\"function\":{\"name\":\"a\"}}]}}}", CHAT_LLAMA3, &q);
	gram_ok(q.gram, "{\"name\": \"a\", \"parameters\": {}}");
	gram_ok(q.gram, "{\"name\": \"c\", \"parameters\": {}}");
	gram_no(q.gram, "{\"name\": \"", "b");
	ck_assert(q.tools[0].allowed && !q.tools[1].allowed && q.tools[2].allowed);
	openai_req_deinit(&q);
}
END_TEST

/* chatml (Hermes): <tool_call>{"name": ..., "arguments": ...}</tool_call>,
 * several unless parallel_tool_calls is false. */
START_TEST(test_grammar_chatml)
{
	static const char one[] = "<tool_call>\n{\"name\": \"count\", \"arguments\": {\"n\": 7, \"u\": \"c\"}}\n</tool_call>";
	struct openai_req q;

	gram_of("{" MSGS ",\"tools\":[" TOOL("get_weather") "," STRICT("count") "],"
		"\"tool_choice\":\"required\"}", CHAT_CHATML, &q);
	gram_ok(q.gram, one);
	gram_ok(q.gram, "<tool_call>{\"name\":\"get_weather\",\"arguments\":{\"city\":1}}</tool_call>\n"
		"<tool_call>\n{\"name\": \"count\", \"arguments\": {\"n\": 1, \"u\": \"f\"}}\n</tool_call>\n");
	scans_as(CHAT_CHATML, &q, one, "count", "{\"n\": 7, \"u\": \"c\"}");
	gram_no(q.gram, "", "{");
	gram_no(q.gram, "<tool_", "x");
	gram_no(q.gram, "<tool_call>\n{\"name\": \"count\", \"", "parameters\"");
	gram_no(q.gram, "<tool_call>\n{\"name\": \"count\", \"arguments\": {\"n\": 7, \"u\": \"c\"}}\n<", "tool");
	gram_no(q.gram, "<tool_call>\n{\"name\": \"count\", \"arguments\": {\"n\": 7, \"u\": \"c\"}}\n</tool_call", "");
	gram_no(q.gram, "<tool_call>\n{\"name\": \"count\", \"arguments\": {\"n\": 7, \"u\": \"c\"}}", "");
	gram_no(q.gram, "<tool_call>", "");
	openai_req_deinit(&q);
	/* parallel_tool_calls false: one call, then only whitespace and EOS */
	gram_of("{" MSGS ",\"tools\":[" TOOL("get_weather") "," STRICT("count") "],"
		"\"tool_choice\":\"required\",\"parallel_tool_calls\":false}", CHAT_CHATML, &q);
	gram_ok(q.gram, one);
	gram_no(q.gram, "<tool_call>\n{\"name\": \"count\", \"arguments\": {\"n\": 7, \"u\": \"c\"}}\n</tool_call>\n", "<");
	openai_req_deinit(&q);
	/* auto and none: no grammar (the answer may be text) */
	gram_of("{" MSGS ",\"tools\":[" TOOL("f") "]}", CHAT_CHATML, &q);
	ck_assert_ptr_null(q.gram);
	openai_req_deinit(&q);
	gram_of("{" MSGS ",\"tools\":[" STRICT("f") "],\"tool_choice\":\"none\"}", CHAT_CHATML, &q);
	ck_assert_ptr_null(q.gram);
	openai_req_deinit(&q);
	/* a format without a call syntax: none either (the front refuses) */
	gram_of("{" MSGS ",\"tools\":[" TOOL("f") "],\"tool_choice\":\"required\"}", CHAT_MISTRAL, &q);
	ck_assert_ptr_null(q.gram);
	openai_req_deinit(&q);
}
END_TEST

/* What no grammar can hold here is a 400 naming its param. */
static void gram_refused(const char *body, enum chat_format f, const char *param,
			 const char *words)
{
	struct openai_req q;
	struct openai_error e;

	ck_assert_msg(parse(body, &q, &e) == 0, "%s: %s", body, e.msg);
	memset(&e, 0, sizeof(e));
	ck_assert_int_eq(openai_tools_grammar(&q, f, &e), OPENAI_E_INVALID);
	ck_assert_int_eq(e.status, 400);
	ck_assert_msg(!strcmp(e.param, param), "%s: param %s, want %s", body, e.param, param);
	ck_assert_msg(strstr(e.msg, words), "%s: '%s' lacks '%s'", body, e.msg, words);
	openai_req_deinit(&q);
}

/* tool_choice "auto" with a strict tool, or chatml's
 * parallel_tool_calls false: a lazy grammar - free text, and from the
 * call's trigger on only calls as "required" would hold them. */
START_TEST(test_grammar_auto)
{
	static const char one[] = "<tool_call>\n{\"name\": \"count\", \"arguments\": {\"n\": 7, \"u\": \"c\"}}\n</tool_call>";
	static const char text_one[] = "Let me count.\n<tool_call>\n{\"name\": \"count\", \"arguments\": {\"n\": 7, \"u\": \"c\"}}\n</tool_call>";
	struct openai_req q;

	gram_of("{" MSGS ",\"tools\":[" TOOL("get_weather") "," STRICT("count") "]}", CHAT_CHATML, &q);
	ck_assert_ptr_nonnull(q.gram);
	gram_ok(q.gram, "");
	gram_ok(q.gram, "It is sunny; <tool_ and </tool_call> are text here. {\"n\": 1.5}");
	gram_ok(q.gram, one);
	gram_ok(q.gram, text_one);
	gram_ok(q.gram, "x<tool_call>{\"name\":\"get_weather\",\"arguments\":{\"city\":1}}</tool_call>\n"
		"<tool_call>\n{\"name\": \"count\", \"arguments\": {\"n\": 1, \"u\": \"f\"}}\n</tool_call>\n");
	scans_as(CHAT_CHATML, &q, one, "count", "{\"n\": 7, \"u\": \"c\"}");
	gram_no(q.gram, "Sure <tool_call>", "Sure");                  /* calls only after it */
	gram_no(q.gram, "<tool_call>\n{\"name\": \"count\", \"arguments\": {\"n\": 7", ".5");  /* strict */
	gram_no(q.gram, "a <tool_call>\n{\"name\": \"", "other");  /* not a tool */
	gram_no(q.gram, text_one, "Done.");                          /* no text after */
	gram_no(q.gram, "<tool_call>\n{\"name\": \"count\"", "");   /* cannot end inside */
	openai_req_deinit(&q);
	/* parallel_tool_calls false, tools not strict: one call, then the end */
	gram_of("{" MSGS ",\"tools\":[" TOOL("get_weather") "," TOOL("count") "],"
		"\"parallel_tool_calls\":false}", CHAT_CHATML, &q);
	ck_assert_ptr_nonnull(q.gram);
	gram_ok(q.gram, "No call.");
	gram_ok(q.gram, text_one);
	gram_no(q.gram, "<tool_call>\n{\"name\": \"count\", \"arguments\": {\"n\": 7.5}}\n</tool_call>\n", "<");
	openai_req_deinit(&q);
	/* allowed_tools auto: the subset */
	gram_of("{" MSGS ",\"tools\":[" TOOL("a") "," STRICT("count") "],"
		"\"tool_choice\":{\"type\":\"allowed_tools\",\"allowed_tools\":{\"mode\":\"auto\","
		"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"count\"}}]}}}", CHAT_CHATML, &q);
	ck_assert_ptr_nonnull(q.gram);
	gram_ok(q.gram, "text");
	gram_no(q.gram, "<tool_call>{\"name\": \"", "a\"");
	openai_req_deinit(&q);
	/* llama3: a first `{` is the call, anything else text to the end */
	gram_of("{" MSGS ",\"tools\":[" TOOL("get_weather") "," STRICT("count") "]}", CHAT_LLAMA3, &q);
	ck_assert_ptr_nonnull(q.gram);
	gram_ok(q.gram, "");
	gram_ok(q.gram, "Sure: {\"name\": \"count\", \"parameters\": {\"n\": 1.5}} and more");
	gram_ok(q.gram, " \n{\"name\": \"count\", \"parameters\": {\"n\": 2, \"u\": \"f\"}}");
	scans_as(CHAT_LLAMA3, &q, " {\"name\": \"count\", \"parameters\": {\"n\": 2, \"u\": \"f\"}}",
		 "count", "{\"n\": 2, \"u\": \"f\"}");
	gram_no(q.gram, "  {", "x");
	gram_no(q.gram, "{\"name\": \"count\", \"parameters\": {\"n\": 1", ".5");   /* strict */
	gram_no(q.gram, "{\"name\": \"get_weather\", \"parameters\": {}} ", "x");   /* one call */
	gram_no(q.gram, "{\"name\": \"get_weather\"", "");
	openai_req_deinit(&q);
	/* no strict tool, parallel calls: nothing to hold, no grammar */
	gram_of("{" MSGS ",\"tools\":[" TOOL("f") "],\"parallel_tool_calls\":true}", CHAT_CHATML, &q);
	ck_assert_ptr_null(q.gram);
	openai_req_deinit(&q);
	gram_of("{" MSGS ",\"tools\":[" TOOL("f") "],\"parallel_tool_calls\":false}", CHAT_LLAMA3, &q);
	ck_assert_ptr_null(q.gram);
	openai_req_deinit(&q);
	/* none: unconstrained, strict or not */
	gram_of("{" MSGS ",\"tools\":[" STRICT("f") "],\"tool_choice\":\"none\","
		"\"parallel_tool_calls\":false}", CHAT_CHATML, &q);
	ck_assert_ptr_null(q.gram);
	openai_req_deinit(&q);
}
END_TEST

START_TEST(test_grammar_refused)
{
	char body[40000];
	size_t o;
	struct openai_req q;

	/* under auto a call grammar and response_format cannot both hold */
	gram_refused("{" MSGS ",\"tools\":[" STRICT("f") "],"
		     "\"response_format\":{\"type\":\"json_object\"}}", CHAT_CHATML,
		     "response_format", "strict tools");
	gram_refused("{" MSGS ",\"tools\":[" TOOL("f") "],\"parallel_tool_calls\":false,"
		     "\"response_format\":{\"type\":\"json_object\"}}", CHAT_CHATML,
		     "response_format", "strict tools");
	gram_refused("{" MSGS ",\"tools\":[" TOOL("f") "],\"tool_choice\":\"required\","
		     "\"response_format\":{\"type\":\"json_object\"}}", CHAT_LLAMA3,
		     "response_format", "forced tool call");
	gram_refused("{" MSGS ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"strict\":true,"
		     "\"parameters\":{\"type\":\"string\"}}}],\"tool_choice\":\"required\"}", CHAT_LLAMA3,
		     "tools", "type object");
	gram_refused("{" MSGS ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"strict\":true,"
		     "\"parameters\":{\"anyOf\":[{\"type\":\"null\"},{\"type\":\"object\"}]}}}],"
		     "\"tool_choice\":\"required\"}", CHAT_CHATML, "tools", "type object");
	/* llama3 answers one call anyway: parallel_tool_calls false is kept */
	gram_of("{" MSGS ",\"tools\":[" TOOL("f") "],\"parallel_tool_calls\":false}", CHAT_LLAMA3, &q);
	ck_assert_ptr_null(q.gram);
	openai_req_deinit(&q);
	/* 65 tools to choose from: more than one union holds */
	o = (size_t)snprintf(body, sizeof(body), "{" MSGS ",\"tool_choice\":\"required\",\"tools\":[");
	for (int i = 0; i < 65; i++)
		o += (size_t)snprintf(body + o, sizeof(body) - o, "%s{\"type\":\"function\",\"function\":{\"name\":\"f%d\"}}",
				      i ? "," : "", i);
	snprintf(body + o, sizeof(body) - o, "]}");
	gram_refused(body, CHAT_CHATML, "tool_choice", "at most 64");
	/* 64 are served */
	strcpy(strstr(body, ",{\"type\":\"function\",\"function\":{\"name\":\"f64\"}}"), "]}");
	gram_of(body, CHAT_CHATML, &q);
	gram_ok(q.gram, "<tool_call>{\"name\": \"f63\", \"arguments\": {}}</tool_call>");
	gram_no(q.gram, "<tool_call>{\"name\": \"f6", "4");
	openai_req_deinit(&q);	/* the same under auto with a strict tool among them */
	o = (size_t)snprintf(body, sizeof(body), "{" MSGS ",\"tools\":[" STRICT("s"));
	for (int i = 0; i < 64; i++)
		o += (size_t)snprintf(body + o, sizeof(body) - o, ",{\"type\":\"function\",\"function\":{\"name\":\"f%d\"}}",
				      i);
	snprintf(body + o, sizeof(body) - o, "]}");
	gram_refused(body, CHAT_CHATML, "tools", "at most 64");
}
END_TEST

/* mistral_v3: the [TOOL_CALLS] control token (the grammar's lead: a run
 * fed bytes, as here, starts after it), then a JSON list of calls, one
 * under parallel_tool_calls false. */
START_TEST(test_grammar_mistral_v3)
{
	static const char two[] = " [{\"name\": \"count\", \"arguments\": {\"n\": 7, \"u\": \"c\"}}, "
				  "{\"name\":\"get_weather\",\"arguments\":{\"city\":[1]}}]";
	struct openai_req q;
	struct openai_found o;
	bool in_list = false;
	char text[256];

	gram_of("{" MSGS ",\"tools\":[" TOOL("get_weather") "," STRICT("count") "],"
		"\"tool_choice\":\"required\"}", CHAT_MISTRAL_V3, &q);
	ck_assert_ptr_nonnull(q.gram);
	gram_ok(q.gram, two);
	gram_ok(q.gram, "[{\"name\":\"get_weather\",\"arguments\":{}}]");
	snprintf(text, sizeof(text), MK "%s", two);
	ck_assert_int_eq(openai_calls_scan(CHAT_MISTRAL_V3, q.tools, q.n_tools, text, strlen(text),
					   true, &in_list, &o), OPENAI_SCAN_CALL);
	ck_assert_str_eq(o.name, "count");
	ck_assert_str_eq(o.arguments, "{\"n\": 7, \"u\": \"c\"}");
	free(o.arguments);
	ck_assert_int_eq(openai_calls_scan(CHAT_MISTRAL_V3, q.tools, q.n_tools, text + o.end,
					   strlen(text) - o.end, true, &in_list, &o), OPENAI_SCAN_CALL);
	ck_assert_str_eq(o.name, "get_weather");
	free(o.arguments);
	ck_assert(!in_list);
	gram_no(q.gram, "", "{");                               /* a list */
	gram_no(q.gram, "[", "]");                              /* of 1 or more */
	gram_no(q.gram, "[{\"name\": \"count\", \"", "parameters\"");
	gram_no(q.gram, "[{\"name\": \"count\", \"arguments\": {\"n\": 1", ".5");   /* strict */
	gram_no(q.gram, "[{\"name\": \"", "other\"");
	gram_no(q.gram, "[{\"name\": \"get_weather\", \"arguments\": {}}", "");
	gram_no(q.gram, "[{\"name\": \"get_weather\", \"arguments\": {}}]", "[");
	openai_req_deinit(&q);
	/* parallel_tool_calls false: one element; a named function */
	gram_of("{" MSGS ",\"tools\":[" TOOL("get_weather") "," STRICT("count") "],"
		"\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"count\"}},"
		"\"parallel_tool_calls\":false}", CHAT_MISTRAL_V3, &q);
	gram_ok(q.gram, "[{\"name\": \"count\", \"arguments\": {\"n\": 7, \"u\": \"c\"}}]");
	gram_no(q.gram, "[{\"name\": \"count\", \"arguments\": {\"n\": 7, \"u\": \"c\"}}", ",");
	gram_no(q.gram, "[{\"name\": \"", "get_weather");
	openai_req_deinit(&q);
	/* under auto, strict or parallel false: the same grammar, lazy at
	 * the [TOOL_CALLS] token (a run fed bytes has no lead: its bytes are
	 * those after it); without either, no grammar */
	gram_of("{" MSGS ",\"tools\":[" TOOL("get_weather") "," STRICT("count") "]}",
		CHAT_MISTRAL_V3, &q);
	ck_assert_ptr_nonnull(q.gram);
	gram_ok(q.gram, two);
	gram_no(q.gram, "[{\"name\": \"count\", \"arguments\": {\"n\": 1", ".5");
	openai_req_deinit(&q);
	gram_of("{" MSGS ",\"tools\":[" TOOL("get_weather") "],\"parallel_tool_calls\":false}",
		CHAT_MISTRAL_V3, &q);
	ck_assert_ptr_nonnull(q.gram);
	gram_no(q.gram, "[{\"name\": \"get_weather\", \"arguments\": {}}", ",");
	openai_req_deinit(&q);
	gram_of("{" MSGS ",\"tools\":[" TOOL("get_weather") "]}", CHAT_MISTRAL_V3, &q);
	ck_assert_ptr_null(q.gram);
	openai_req_deinit(&q);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("openai_tools");
	TCase *tc = tcase_create("core");
	SRunner *sr;
	int failed;

	tcase_add_test(tc, test_tools_kept);
	tcase_add_test(tc, test_tools_refused);
	tcase_add_test(tc, test_tool_messages);
	tcase_add_test(tc, test_sdk_parsed_echo);
	tcase_add_test(tc, test_scan_chatml);
	tcase_add_test(tc, test_scan_llama3);
	tcase_add_test(tc, test_scan_mistral_v3);
	tcase_add_test(tc, test_scan_empty);
	tcase_add_test(tc, test_scan_bounded);
	tcase_add_test(tc, test_grammar_llama3);
	tcase_add_test(tc, test_grammar_chatml);
	tcase_add_test(tc, test_grammar_auto);
	tcase_add_test(tc, test_grammar_refused);
	tcase_add_test(tc, test_grammar_mistral_v3);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
