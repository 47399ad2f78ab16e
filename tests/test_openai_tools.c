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
		"tools", "constrained decoding");
	refused("{" MSGS ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"code\":1}}]}",
		"tools", "takes name");
	refused("{" MSGS ",\"tools\":[" TOOL("f") "],\"tool_choice\":\"required\"}", "tool_choice",
		"constrained decoding");
	refused("{" MSGS ",\"tools\":[" TOOL("f") "],\"tool_choice\":{\"type\":\"function\","
		"\"function\":{\"name\":\"f\"}}}", "tool_choice", "constrained decoding");
	refused("{" MSGS ",\"tool_choice\":\"sometimes\"}", "tool_choice", "must be");
	refused("{" MSGS ",\"tools\":[" TOOL("f") "],\"parallel_tool_calls\":false}",
		"parallel_tool_calls", "constrained decoding");
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

/* ---- the output ------------------------------------------------------------------ */

static const struct openai_tool tools[] = { { "get_weather", NULL, NULL },
					    { "f", NULL, NULL } };

/* What an answer became: its text and calls ("name args;" each). */
struct got {
	char text[OPENAI_CALL_HOLD_MAX * 2 + 4096];
	char calls[4096];
	size_t n_calls;
	size_t max_held;
};

static void got_text(struct got *g, const char *p, size_t n)
{
	size_t l = strlen(g->text);

	ck_assert_uint_lt(l + n, sizeof(g->text));
	memcpy(g->text + l, p, n);
	g->text[l + n] = 0;
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
		"<tool_call></tool_call>",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char s[512], t[512];

		snprintf(s, sizeof(s), "a%sb" CALL_W, bad[i]);
		snprintf(t, sizeof(t), "a%sb", bad[i]);
		expect_scan(CHAT_CHATML, s, t, "get_weather {\"city\": \"Paris\"};");
	}
	/* never closed: text at the end */
	expect_scan(CHAT_CHATML, "x<tool_call>{\"name\": \"f\", \"arguments\": {}}",
		    "x<tool_call>{\"name\": \"f\", \"arguments\": {}}", "");
	/* a tag begun at the very end */
	expect_scan(CHAT_CHATML, "x<tool_ca", "x<tool_ca", "");
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
	expect_scan(CHAT_LLAMA3, "  ", "  ", "");
	/* a format without a call syntax: all text */
	expect_scan(CHAT_MISTRAL, CALL_W, CALL_W, "");
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
	enum chat_format fmts[] = { CHAT_CHATML, CHAT_LLAMA3 };

	for (size_t k = 0; k < 2; k++) {
		strcpy(s, fmts[k] == CHAT_CHATML ? "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": \""
						 : "{\"name\": \"f\", \"parameters\": {\"a\": \"");
		size_t l = strlen(s);
		memset(s + l, 'x', n - l);
		s[n] = 0;
		for (size_t c = 0; c < 1024; c++)
			cuts[c] = (c + 1) * (n / 1025);
		run_pieces(fmts[k], s, cuts, 1024, &g);
		ck_assert_uint_eq(g.n_calls, 0);
		ck_assert_uint_eq(strlen(g.text), n);
		ck_assert_uint_le(g.max_held, OPENAI_CALL_HOLD_MAX + n / 1025 + 1);
	}
	free(s);
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
	tcase_add_test(tc, test_scan_chatml);
	tcase_add_test(tc, test_scan_llama3);
	tcase_add_test(tc, test_scan_bounded);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
