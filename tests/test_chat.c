/* test_chat.c - built-in chat templates (gpu/text/chat.c): rendered text,
 * detection from template sources, refusals, config names.
 *
 * Every expected prompt below is written out by hand from the model's
 * reference Jinja template (its tokenizer_config.json on Hugging Face)
 * applied to the same messages, minus the first BOS (kvd leaves it to the
 * tokenizer, see gpu/text/chat.h). Token ids are checked in test_chat_vocab.c.
 */
#include <check.h>
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "conf/config.h"
#include "gpu/text/chat.h"

static const struct chat_msg conv[] = {
	{ "system", "Be brief." },
	{ "user", "Hi" },
	{ "assistant", "Hello!" },
	{ "user", "2+2?" },
};
#define NCONV (sizeof(conv) / sizeof(conv[0]))

static void expect(enum chat_format f, const struct chat_msg *m, size_t n,
		   bool gen, const char *want)
{
	char *out = NULL, err[160];
	size_t len = 99;
	int rc = chat_render(f, m, n, gen, &out, &len, err, sizeof(err));

	ck_assert_msg(rc == 0, "%s: %d %s", chat_format_name(f), rc, err);
	ck_assert_msg(len == strlen(want) && strcmp(out, want) == 0,
		      "%s:\n got [%s]\nwant [%s]", chat_format_name(f), out, want);
	ck_assert_uint_eq(strlen(out), len);
	free(out);
}

static void refuse(enum chat_format f, const struct chat_msg *m, size_t n,
		   int code, const char *words)
{
	char *out = (char *)1, err[200];
	size_t len = 99;
	int rc = chat_render(f, m, n, true, &out, &len, err, sizeof(err));

	ck_assert_msg(rc == code, "%s: rc %d, want %d (%s)", chat_format_name(f),
		      rc, code, err);
	ck_assert_ptr_null(out);
	ck_assert_uint_eq(len, 0);
	ck_assert_msg(strstr(err, words), "%s: error '%s' lacks '%s'",
		      chat_format_name(f), err, words);
}

/* Llama 2: the template opens every user turn with bos_token + '[INST] '
 * (the first BOS is the tokenizer's), puts the system message in <<SYS>>
 * inside the first turn, strips contents, and closes an assistant turn
 * with ' ' + content + ' ' + eos_token. */
START_TEST(test_llama2)
{
	expect(CHAT_LLAMA2, conv, NCONV, true,
	       "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello! </s>"
	       "<s>[INST] 2+2? [/INST]");
	/* no system; strip() removes the spaces around the content */
	expect(CHAT_LLAMA2, conv + 1, 1, false, "[INST] Hi [/INST]");
	struct chat_msg sp[] = { { "user", "  Hi \n" } };
	expect(CHAT_LLAMA2, sp, 1, true, "[INST] Hi [/INST]");
}
END_TEST

/* Llama 3: '<|start_header_id|>' + role + '<|end_header_id|>\n\n' +
 * content | trim + '<|eot_id|>' per message, the generation prompt opens
 * an assistant header. */
START_TEST(test_llama3)
{
	expect(CHAT_LLAMA3, conv, NCONV, true,
	       "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
	       "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
	       "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
	       "<|start_header_id|>user<|end_header_id|>\n\n2+2?<|eot_id|>"
	       "<|start_header_id|>assistant<|end_header_id|>\n\n");
	expect(CHAT_LLAMA3, conv + 1, 1, false,
	       "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>");
}
END_TEST

/* ChatML: '<|im_start|>' + role + '\n' + content + '<|im_end|>\n', no
 * trimming; the generation prompt is '<|im_start|>assistant\n'. kvd adds
 * no default system prompt. */
START_TEST(test_chatml)
{
	expect(CHAT_CHATML, conv, NCONV, true,
	       "<|im_start|>system\nBe brief.<|im_end|>\n"
	       "<|im_start|>user\nHi<|im_end|>\n"
	       "<|im_start|>assistant\nHello!<|im_end|>\n"
	       "<|im_start|>user\n2+2?<|im_end|>\n"
	       "<|im_start|>assistant\n");
	struct chat_msg sp[] = { { "user", " a " } };
	expect(CHAT_CHATML, sp, 1, false, "<|im_start|>user\n a <|im_end|>\n");
	/* a system message anywhere is a turn like the others */
	struct chat_msg mid[] = { { "user", "a" }, { "system", "b" } };
	expect(CHAT_CHATML, mid, 2, false,
	       "<|im_start|>user\na<|im_end|>\n<|im_start|>system\nb<|im_end|>\n");
}
END_TEST

/* Mistral v0.1/v0.2: '[INST] ' + content + ' [/INST]' for a user,
 * content + eos_token for the assistant, no BOS between turns; the
 * system message goes before the first user content with a blank line. */
START_TEST(test_mistral)
{
	expect(CHAT_MISTRAL, conv, NCONV, true,
	       "[INST] Be brief.\n\nHi [/INST]Hello!</s>[INST] 2+2? [/INST]");
	expect(CHAT_MISTRAL, conv + 1, 3, false,
	       "[INST] Hi [/INST]Hello!</s>[INST] 2+2? [/INST]");
}
END_TEST

/* Gemma: '<start_of_turn>' + ('model' for the assistant) + '\n' + content
 * | trim + '<end_of_turn>\n'; generation prompt '<start_of_turn>model\n';
 * the system message prefixes the first user turn (gemma-3's rule). */
START_TEST(test_gemma)
{
	expect(CHAT_GEMMA, conv, NCONV, true,
	       "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
	       "<start_of_turn>model\nHello!<end_of_turn>\n"
	       "<start_of_turn>user\n2+2?<end_of_turn>\n"
	       "<start_of_turn>model\n");
}
END_TEST

/* Phi-3: '<|' + role + '|>\n' + content + '<|end|>\n'; generation prompt
 * '<|assistant|>\n'. */
START_TEST(test_phi3)
{
	expect(CHAT_PHI3, conv, NCONV, true,
	       "<|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n"
	       "<|assistant|>\nHello!<|end|>\n<|user|>\n2+2?<|end|>\n"
	       "<|assistant|>\n");
	expect(CHAT_PHI3, conv + 1, 1, false, "<|user|>\nHi<|end|>\n");
}
END_TEST

/* DeepSeek LLM chat: system content + '\n\n', 'User: ' + content +
 * '\n\n', 'Assistant: ' + content + eos_token (<｜end▁of▁sentence｜>),
 * generation prompt 'Assistant:' (no space: the model writes it). */
START_TEST(test_deepseek)
{
	expect(CHAT_DEEPSEEK, conv, NCONV, true,
	       "Be brief.\n\nUser: Hi\n\nAssistant: Hello!"
	       "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
	       "User: 2+2?\n\nAssistant:");
}
END_TEST

/* ---- tools ------------------------------------------------------------------ */

/* One tool, as the caller serializes it (net/wire/openai.c: json.dumps's
 * separators, and indent 4 for Llama 3.1). */
static const struct chat_tool weather[] = { {
	"{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {}}}",
	"{\n    \"type\": \"function\",\n    \"function\": {\n        \"name\": \"get_weather\",\n        \"parameters\": {}\n    }\n}",
	"{\"name\": \"get_weather\", \"parameters\": {}}",
} };
static const struct chat_msg tconv[] = {
	{ "system", "Be brief." },
	{ "user", " Weather in Paris? " },
	{ "assistant", "" },
	{ "tool", "18 \"C\"\n" },
	{ "tool", "dry" },
};
static const struct chat_call paris[] = { { "get_weather", "{\"city\": \"Paris\"}", NULL } };
static const struct chat_call two[] = { { "a", "{}", NULL }, { "b", "{\"x\": 1}", NULL } };
static const struct chat_call *const tcalls[] = { NULL, NULL, paris, NULL, NULL };
static const size_t tn_calls[] = { 0, 0, 1, 0, 0 };

static void expect_tools(enum chat_format f, const struct chat_msg *m, size_t n,
			 const struct chat_tools *tt, const char *want)
{
	char *out = NULL, err[200];
	size_t len = 99;
	int rc = chat_render_tools(f, m, n, tt, true, &out, &len, err, sizeof(err));

	ck_assert_msg(rc == 0, "%s: %d %s", chat_format_name(f), rc, err);
	ck_assert_msg(len == strlen(want) && strcmp(out, want) == 0,
		      "%s:\n got [%s]\nwant [%s]", chat_format_name(f), out, want);
	free(out);
}

static void refuse_tools(enum chat_format f, const struct chat_msg *m, size_t n,
			 const struct chat_tools *tt, const char *words)
{
	char *out = (char *)1, err[200];
	size_t len = 99;
	int rc = chat_render_tools(f, m, n, tt, true, &out, &len, err, sizeof(err));

	ck_assert_msg(rc == -EINVAL, "%s: rc %d (%s)", chat_format_name(f), rc, err);
	ck_assert_ptr_null(out);
	ck_assert_msg(strstr(err, words), "%s: error '%s' lacks '%s'",
		      chat_format_name(f), err, words);
}

/* Llama 3.1 (custom tools in the first user message, the template's
 * defaults): the system turn gains "Environment: ipython" and the dates;
 * the first user turn the instruction and each tool tojson(indent=4) +
 * "\n\n"; a call is {"name": ..., "parameters": ...}; each result its own
 * ipython turn, tojson-quoted (a Jinja string is iterable). */
START_TEST(test_tools_llama3)
{
	struct chat_tools tt = { weather, 1, tcalls, tn_calls, NULL };

	expect_tools(CHAT_LLAMA3, tconv, 5, &tt,
		"<|start_header_id|>system<|end_header_id|>\n\n"
		"Environment: ipython\nCutting Knowledge Date: December 2023\n"
		"Today Date: 26 Jul 2024\n\nBe brief.<|eot_id|>"
		"<|start_header_id|>user<|end_header_id|>\n\n"
		"Given the following functions, please respond with a JSON for a "
		"function call with its proper arguments that best answers the "
		"given prompt.\n\nRespond in the format {\"name\": function name, "
		"\"parameters\": dictionary of argument name and its value}.Do not "
		"use variables.\n\n"
		"{\n    \"type\": \"function\",\n    \"function\": {\n        \"name\": \"get_weather\",\n        \"parameters\": {}\n    }\n}\n\n"
		"Weather in Paris?<|eot_id|>"
		"<|start_header_id|>assistant<|end_header_id|>\n\n"
		"{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}<|eot_id|>"
		"<|start_header_id|>ipython<|end_header_id|>\n\n\"18 \\\"C\\\"\\n\"<|eot_id|>"
		"<|start_header_id|>ipython<|end_header_id|>\n\n\"dry\"<|eot_id|>"
		"<|start_header_id|>assistant<|end_header_id|>\n\n");
	/* a history with calls but no tools offered: 3.1's system turn
	 * without "Environment", the user turn as it is */
	expect_tools(CHAT_LLAMA3, tconv + 1, 3, &(struct chat_tools){ NULL, 0, tcalls + 1, tn_calls + 1, NULL },
		"<|start_header_id|>system<|end_header_id|>\n\n"
		"Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|>"
		"<|start_header_id|>user<|end_header_id|>\n\nWeather in Paris?<|eot_id|>"
		"<|start_header_id|>assistant<|end_header_id|>\n\n"
		"{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}<|eot_id|>"
		"<|start_header_id|>ipython<|end_header_id|>\n\n\"18 \\\"C\\\"\\n\"<|eot_id|>"
		"<|start_header_id|>assistant<|end_header_id|>\n\n");
	/* without tools nor calls: Llama 3's rendering, unchanged */
	expect_tools(CHAT_LLAMA3, tconv + 1, 1, &(struct chat_tools){ 0 },
		"<|start_header_id|>user<|end_header_id|>\n\nWeather in Paris?<|eot_id|>"
		"<|start_header_id|>assistant<|end_header_id|>\n\n");
}
END_TEST

/* Qwen2.5 / Hermes: the tools section in the system turn after the system
 * message, each tool tojson on its own line inside <tools>; calls as
 * <tool_call> blocks after the assistant's content; consecutive results
 * in one user turn of <tool_response> blocks. */
#define QWEN_TOOLS(sys) \
	"<|im_start|>system\n" sys "# Tools\n\nYou may call one or more functions " \
	"to assist with the user query.\n\nYou are provided with function " \
	"signatures within <tools></tools> XML tags:\n<tools>\n" \
	"{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {}}}" \
	"\n</tools>\n\nFor each function call, return a json object with function " \
	"name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n" \
	"{\"name\": <function-name>, \"arguments\": <args-json-object>}\n" \
	"</tool_call><|im_end|>\n"
START_TEST(test_tools_chatml)
{
	struct chat_tools tt = { weather, 1, tcalls, tn_calls, NULL };

	expect_tools(CHAT_CHATML, tconv, 5, &tt,
		QWEN_TOOLS("Be brief.\n\n")
		"<|im_start|>user\n Weather in Paris? <|im_end|>\n"
		"<|im_start|>assistant\n<tool_call>\n"
		"{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
		"</tool_call><|im_end|>\n"
		"<|im_start|>user\n<tool_response>\n18 \"C\"\n\n</tool_response>"
		"\n<tool_response>\ndry\n</tool_response><|im_end|>\n"
		"<|im_start|>assistant\n");
	/* no system message: no default prompt invented; two calls after
	 * the assistant's text; a result that ends the conversation */
	struct chat_msg m[] = { { "user", "x" }, { "assistant", "Let me see." },
				{ "tool", "r" } };
	const struct chat_call *c[] = { NULL, two, NULL };
	size_t nc[] = { 0, 2, 0 };
	struct chat_tools t2 = { weather, 1, c, nc, NULL };
	expect_tools(CHAT_CHATML, m, 3, &t2,
		QWEN_TOOLS("")
		"<|im_start|>user\nx<|im_end|>\n"
		"<|im_start|>assistant\nLet me see.\n<tool_call>\n"
		"{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n"
		"{\"name\": \"b\", \"arguments\": {\"x\": 1}}\n</tool_call><|im_end|>\n"
		"<|im_start|>user\n<tool_response>\nr\n</tool_response><|im_end|>\n"
		"<|im_start|>assistant\n");
}
END_TEST

/* Mistral 7B Instruct v0.3 (its tokenizer_config.json template): the
 * tools before the last user message, the system message inside the last
 * message when that is a user message (else not rendered), user contents
 * as they are and "[/INST]" without a space, an assistant's " " + trimmed
 * content + "</s>", calls as [TOOL_CALLS] [{name, arguments, id}]</s>,
 * results as [TOOL_RESULTS] {"content": CONTENT, "call_id": ID}, ids of 9
 * alphanumeric characters. */
#define MISTRAL_TOOLS \
	"[AVAILABLE_TOOLS] [{\"type\": \"function\", \"function\": " \
	"{\"name\": \"get_weather\", \"parameters\": {}}}][/AVAILABLE_TOOLS]"
START_TEST(test_tools_mistral_v3)
{
	static const struct chat_call paris_id[] = {
		{ "get_weather", "{\"city\": \"Paris\"}", "call_abc123def456" } };
	const struct chat_call *c[] = { NULL, NULL, paris_id, NULL, NULL };
	const char *ids[] = { NULL, NULL, NULL, "call_abc123def456", "abcDEF789" };
	struct chat_tools tt = { weather, 1, c, tn_calls, ids };
	char m_id[CHAT_MISTRAL_ID_LEN + 1];

	expect_tools(CHAT_MISTRAL_V3, tconv, 5, &tt,
		MISTRAL_TOOLS "[INST]  Weather in Paris? [/INST]"
		"[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": "
		"{\"city\": \"Paris\"}, \"id\": \"123def456\"}]</s>"
		"[TOOL_RESULTS] {\"content\": 18 \"C\"\n, \"call_id\": \"123def456\"}[/TOOL_RESULTS]"
		"[TOOL_RESULTS] {\"content\": dry, \"call_id\": \"abcDEF789\"}[/TOOL_RESULTS]");
	/* the system message goes into the last user message, the tools
	 * before it; without tools, the same turns */
	expect_tools(CHAT_MISTRAL_V3, conv, NCONV, &(struct chat_tools){ weather, 1, NULL, NULL, NULL },
		"[INST] Hi[/INST] Hello!</s>" MISTRAL_TOOLS "[INST] Be brief.\n\n2+2?[/INST]");
	expect(CHAT_MISTRAL_V3, conv, NCONV, true,
	       "[INST] Hi[/INST] Hello!</s>[INST] Be brief.\n\n2+2?[/INST]");
	expect(CHAT_MISTRAL_V3, conv + 1, 2, false, "[INST] Hi[/INST] Hello!</s>");
	/* two calls; ids without 9 alphanumerics hash; the tools before the
	 * last user message only, not before one equal to it (the template
	 * compares values; mistral_common and vLLM take the last by index:
	 * every equal one would render the tools again, a body's tools times
	 * its messages) */
	struct chat_msg m[] = { { "user", "x" }, { "assistant", "" }, { "tool", "{\"t\": 1}" },
				{ "tool", "r" }, { "assistant", " ok " }, { "user", "x" } };
	static const struct chat_call two_ids[] = { { "a", "{}", "x-1" },
						    { "b", "{\"x\": 1}", NULL } };
	const struct chat_call *c2[] = { NULL, two_ids, NULL, NULL, NULL, NULL };
	size_t n2[] = { 0, 2, 0, 0, 0, 0 };
	const char *ids2[] = { NULL, NULL, "x-1", NULL, NULL, NULL };
	struct chat_tools t2 = { weather, 1, c2, n2, ids2 };
	char h1[CHAT_MISTRAL_ID_LEN + 1], h0[CHAT_MISTRAL_ID_LEN + 1], want[1024];
	chat_mistral_id("x-1", h1);
	chat_mistral_id(NULL, h0);
	snprintf(want, sizeof(want),
		 "[INST] x[/INST]"
		 "[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {}, \"id\": \"%s\"}, "
		 "{\"name\": \"b\", \"arguments\": {\"x\": 1}, \"id\": \"%s\"}]</s>"
		 "[TOOL_RESULTS] {\"content\": {\"t\": 1}, \"call_id\": \"%s\"}[/TOOL_RESULTS]"
		 "[TOOL_RESULTS] {\"content\": r, \"call_id\": \"%s\"}[/TOOL_RESULTS]"
		 " ok</s>" MISTRAL_TOOLS "[INST] x[/INST]", h1, h0, h1, h0);
	expect_tools(CHAT_MISTRAL_V3, m, 6, &t2, want);
	/* many equal user messages: the tools once */
	struct chat_msg hi[63];
	char *out = NULL, err[200];
	size_t len = 0, k = 0;

	for (size_t i = 0; i < 63; i++)
		hi[i] = (struct chat_msg){ i % 2 ? "assistant" : "user", i % 2 ? "ok" : "hi" };
	ck_assert_int_eq(chat_render_tools(CHAT_MISTRAL_V3, hi, 63,
					   &(struct chat_tools){ weather, 1, NULL, NULL, NULL },
					   true, &out, &len, err, sizeof(err)), 0);
	for (const char *q = out; (q = strstr(q, "[AVAILABLE_TOOLS]")); q++)
		k++;
	ck_assert_uint_eq(k, 1);
	ck_assert_ptr_nonnull(strstr(out, "ok</s>" MISTRAL_TOOLS "[INST] hi[/INST]"));
	ck_assert_uint_eq(len, strlen(out));
	free(out);
	/* after results the answer comes before the next user turn; one
	 * system message, first */
	struct chat_msg m4[] = { { "user", "x" }, { "assistant", "" }, { "tool", "r" },
				 { "user", "y" } };
	refuse_tools(CHAT_MISTRAL_V3, m4, 4, &(struct chat_tools){ NULL, 0, c2, n2, ids2 },
		     "alternate");
	struct chat_msg ms[] = { { "user", "x" }, { "system", "s" } };
	refuse_tools(CHAT_MISTRAL_V3, ms, 2, &tt, "only first");
	/* a tool without its function JSON */
	struct chat_tool nofn[] = { { "{}", "{}", NULL } };
	refuse_tools(CHAT_MISTRAL_V3, conv + 1, 1,
		     &(struct chat_tools){ nofn, 1, NULL, NULL, NULL }, "no JSON");

	/* ids: 9 alphanumerics kept, else the last 9 of them, else a hash */
	chat_mistral_id("abcDEF789", m_id);
	ck_assert_str_eq(m_id, "abcDEF789");
	chat_mistral_id("call_0123456789abcdef01234567", m_id);
	ck_assert_str_eq(m_id, "f01234567");
	chat_mistral_id("call_abc123def456", m_id);
	ck_assert_str_eq(m_id, "123def456");
	ck_assert_uint_eq(strlen(h1), 9);
	ck_assert_uint_eq(strlen(h0), 9);
	for (size_t i = 0; i < 9; i++)
		ck_assert(isalnum((unsigned char)h1[i]) && isalnum((unsigned char)h0[i]));
	ck_assert_str_ne(h1, h0);
	chat_mistral_id("x-1", m_id);
	ck_assert_str_eq(m_id, h1);
	chat_mistral_id("x-2", m_id);
	ck_assert_str_ne(m_id, h1);
}
END_TEST

START_TEST(test_tools_refusals)
{
	struct chat_tools tt = { weather, 1, NULL, NULL, NULL };

	for (int f = CHAT_LLAMA2; f < CHAT__N; f++) {
		bool has = f == CHAT_LLAMA3 || f == CHAT_CHATML || f == CHAT_MISTRAL_V3;

		ck_assert_int_eq(chat_format_tools((enum chat_format)f), has);
		if (has)
			continue;
		/* no tool syntax (Mistral v0.1/v0.2 included): refused */
		refuse_tools((enum chat_format)f, tconv + 1, 1, &tt, "no tool syntax");
		refuse_tools((enum chat_format)f, tconv + 1, 2,
			     &(struct chat_tools){ NULL, 0, tcalls + 1, tn_calls + 1, NULL },
			     "no tool syntax");
		refuse((enum chat_format)f, tconv + 3, 1, -EINVAL, "unknown role");
	}
	ck_assert(!chat_format_tools(CHAT_NONE));
	ck_assert(!chat_format_tools((enum chat_format)CHAT__N));
	/* Llama 3.1: one call per assistant message; the tools need a
	 * first user message */
	const struct chat_call *c2[] = { NULL, two };
	size_t n2[] = { 0, 2 };
	refuse_tools(CHAT_LLAMA3, tconv + 1, 2,
		     &(struct chat_tools){ NULL, 0, c2, n2, NULL }, "1 tool call");
	refuse_tools(CHAT_LLAMA3, tconv + 2, 2, &tt, "first user message");
	refuse_tools(CHAT_LLAMA3, tconv, 1, &tt, "first user message");
	/* a call on a user message */
	const struct chat_call *cu[] = { paris };
	size_t nu[] = { 1 };
	refuse_tools(CHAT_CHATML, tconv + 1, 1,
		     &(struct chat_tools){ NULL, 0, cu, nu, NULL }, "only an assistant");
	/* a tool without its JSON, a call without arguments */
	struct chat_tool nojson[] = { { NULL, "x", NULL } };
	refuse_tools(CHAT_CHATML, tconv + 1, 1,
		     &(struct chat_tools){ nojson, 1, NULL, NULL, NULL }, "no JSON");
	struct chat_call noargs[] = { { "f", NULL, NULL } };
	const struct chat_call *cn[] = { NULL, noargs };
	size_t nn[] = { 0, 1 };
	refuse_tools(CHAT_CHATML, tconv + 1, 2,
		     &(struct chat_tools){ NULL, 0, cn, nn, NULL }, "no name or no arguments");
}
END_TEST

START_TEST(test_refusals)
{
	struct chat_msg bad_role[] = { { "function", "x" } };   /* "tool": test_tools_refusals */
	struct chat_msg late_sys[] = { { "user", "a" }, { "assistant", "b" },
				       { "system", "c" }, { "user", "d" } };
	struct chat_msg two_users[] = { { "user", "a" }, { "user", "b" } };
	struct chat_msg starts_asst[] = { { "assistant", "a" } };
	struct chat_msg only_sys[] = { { "system", "a" } };
	struct chat_msg null_c[] = { { "user", NULL } };
	struct chat_msg null_r[] = { { NULL, "a" } };

	for (int f = CHAT_LLAMA2; f < CHAT__N; f++) {
		refuse((enum chat_format)f, bad_role, 1, -EINVAL, "unknown role");
		refuse((enum chat_format)f, conv, 0, -EINVAL, "no messages");
		refuse((enum chat_format)f, null_c, 1, -EINVAL, "no role or no content");
		refuse((enum chat_format)f, null_r, 1, -EINVAL, "no role or no content");
	}
	/* formats whose reference templates raise_exception() on order */
	const enum chat_format strict[] = { CHAT_LLAMA2, CHAT_MISTRAL, CHAT_GEMMA };
	for (size_t i = 0; i < 3; i++) {
		refuse(strict[i], late_sys, 4, -EINVAL, "system message only first");
		refuse(strict[i], two_users, 2, -EINVAL, "alternate");
		refuse(strict[i], starts_asst, 1, -EINVAL, "alternate");
		refuse(strict[i], only_sys, 1, -EINVAL, "needs a user message");
	}
	/* turn-by-turn formats take them */
	expect(CHAT_LLAMA3, two_users, 2, false,
	       "<|start_header_id|>user<|end_header_id|>\n\na<|eot_id|>"
	       "<|start_header_id|>user<|end_header_id|>\n\nb<|eot_id|>");
	/* no template */
	refuse(CHAT_NONE, conv, NCONV, -ENOENT, "model.chat_template");
	refuse((enum chat_format)CHAT__N, conv, NCONV, -ENOENT, "no chat template");
	/* the role string is the client's: never echoed */
	struct chat_msg evil[] = { { "x\nevent=forged", "a" } };
	char *out, err[200];
	size_t len;
	ck_assert_int_eq(chat_render(CHAT_CHATML, evil, 1, true, &out, &len,
				     err, sizeof(err)), -EINVAL);
	ck_assert_ptr_null(strstr(err, "forged"));
	/* errlen 0 and a NULL err are fine */
	ck_assert_int_eq(chat_render(CHAT_CHATML, evil, 1, true, &out, &len,
				     NULL, 0), -EINVAL);
	ck_assert_int_eq(chat_render(CHAT_CHATML, conv, 1, true, NULL, &len,
				     NULL, 0), -EINVAL);
}
END_TEST

/* A conversation past CHAT_TEXT_MAX is -E2BIG, not an allocation of it. */
START_TEST(test_too_big)
{
	size_t n = 5;
	size_t each = CHAT_TEXT_MAX / 4;
	char *big = malloc(each + 1);
	struct chat_msg m[5];
	char *out, err[120];
	size_t len;

	ck_assert_ptr_nonnull(big);
	memset(big, 'a', each);
	big[each] = 0;
	for (size_t i = 0; i < n; i++)
		m[i] = (struct chat_msg){ "user", big };
	ck_assert_int_eq(chat_render(CHAT_CHATML, m, n, true, &out, &len, err,
				     sizeof(err)), -E2BIG);
	ck_assert_ptr_null(out);
	ck_assert_ptr_nonnull(strstr(err, "longer than"));
	/* three fit: the text is exactly the contents plus the markup */
	ck_assert_int_eq(chat_render(CHAT_CHATML, m, 3, true, &out, &len, err,
				     sizeof(err)), 0);
	ck_assert_uint_eq(len, 3 * (each + strlen("<|im_start|>user\n<|im_end|>\n")) +
			  strlen("<|im_start|>assistant\n"));
	free(out);
	free(big);
}
END_TEST

/* ---- detection, on template sources as the models ship them ---------- */

static const char llama2_src[] =
	"{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
	"{% set system_message = messages[0]['content'] %}{% else %}"
	"{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
	"{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
	"{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
	"{% if loop.index0 == 0 and system_message != false %}"
	"{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
	"{% else %}{% set content = message['content'] %}{% endif %}"
	"{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
	"{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}";

static const char llama3_src[] =
	"{% set loop_messages = messages %}{% for message in loop_messages %}"
	"{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
	"+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
	"{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
	"{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

/* Llama 3.2 instruct's template, in its parts that matter here: the same
 * headers, custom tools in the first user message by default
 * (tools_in_user_message), calls as {"name": ..., "parameters": ...},
 * results in the ipython role; its date comes from strftime_now, which
 * kvd does not call (the prompt stays a function of the request). */
static const char llama32_src[] =
	"{{- bos_token }}{%- if not tools_in_user_message is defined %}{%- set tools_in_user_message = true %}{%- endif %}"
	"{%- if not date_string is defined %}{%- if strftime_now is defined %}{%- set date_string = strftime_now(\"%d %b %Y\") %}"
	"{%- else %}{%- set date_string = \"26 Jul 2024\" %}{%- endif %}{%- endif %}"
	"{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}{%- if tools is not none %}{{- \"Environment: ipython\\n\" }}{%- endif %}"
	"{{- \"Cutting Knowledge Date: December 2023\\n\" }}{{- \"Today Date: \" + date_string + \"\\n\\n\" }}"
	"{{- system_message }}{{- \"<|eot_id|>\" }}"
	"{%- if tools_in_user_message and not tools is none %}{{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}"
	"{{- \"Given the following functions, please respond with a JSON for a function call \" }}{%- endif %}"
	"{%- for message in messages %}{%- if 'tool_calls' in message %}{%- set tool_call = message.tool_calls[0].function %}"
	"{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}{{- '{\"name\": \"' + tool_call.name + '\", ' }}"
	"{{- '\"parameters\": ' }}{{- tool_call.arguments | tojson }}{{- \"}\" }}{{- \"<|eot_id|>\" }}"
	"{%- elif message.role == \"tool\" or message.role == \"ipython\" %}{{- \"<|start_header_id|>ipython<|end_header_id|>\\n\\n\" }}"
	"{%- endif %}{%- endfor %}{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}";

static const char qwen2_src[] =
	"{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
	"{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
	"{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
	"{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

static const char mistral_src[] =
	"{{ bos_token }}{% for message in messages %}"
	"{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
	"{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
	"{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
	"{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
	"{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}";

static const char gemma_src[] =
	"{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
	"{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
	"{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
	"{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}"
	"{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
	"{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}";

static const char phi3_src[] =
	"{% for message in messages %}{% if message['role'] == 'system' %}"
	"{{'<|system|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}"
	"{{'<|user|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}"
	"{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}"
	"{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}";

static const char deepseek_src[] =
	"{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}"
	"{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
	"{{ 'User: ' + message['content'] + '\n\n' }}{% elif message['role'] == 'assistant' %}"
	"{{ 'Assistant: ' + message['content'] + eos_token }}{% elif message['role'] == 'system' %}"
	"{{ message['content'] + '\n\n' }}{% endif %}{% endfor %}"
	"{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}";

/* Look-alikes kvd does not render: each must be refused, never mapped to
 * the format it resembles. */
static const char mistral_v3_src[] =
	"{%- if messages[0][\"role\"] == \"system\" %}{%- set system_message = messages[0][\"content\"] %}"
	"{%- endif %}{{- bos_token }}{%- for message in loop_messages %}"
	"{%- if message[\"role\"] == \"user\" %}{%- if tools is not none and (message == user_messages[-1]) %}"
	"{{- \"[AVAILABLE_TOOLS] [\" }}{%- endif %}"
	"{{- \"[INST] \" + message[\"content\"] + \"[/INST]\" }}{%- endif %}{%- endfor %}";

static const char mistral_v03_plain_src[] =
	"{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
	"{{ '[INST] ' + message['content'] + '[/INST]' }}{% elif message['role'] == 'assistant' %}"
	"{{ message['content'] + eos_token}}{% endif %}{% endfor %}";

static const char deepseek_v3_src[] =
	"{{ bos_token }}{% for message in messages %}{%- if message['role'] == 'user' %}"
	"{{'<\xef\xbd\x9cUser\xef\xbd\x9c>' + message['content']}}{%- endif %}"
	"{%- if message['role'] == 'assistant' %}{{'<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>' + "
	"message['content'] + '<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>'}}"
	"{%- endif %}{%- endfor %}{% if add_generation_prompt %}{{'<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>'}}{% endif %}"
	"{# 'User: ' 'Assistant: ' appear in a comment #}";

/* Mistral 7B Instruct v0.3's, abridged (its markers as it writes them) */
static const char mistral_v3_full_src[] =
	"{%- if messages[0][\"role\"] == \"system\" %}{%- set system_message = messages[0][\"content\"] %}"
	"{%- endif %}{{- bos_token }}{%- for message in loop_messages %}"
	"{%- if message[\"role\"] == \"user\" %}{%- if tools is not none and (message == user_messages[-1]) %}"
	"{{- \"[AVAILABLE_TOOLS] [\" }}{%- endif %}"
	"{{- \"[INST] \" + message[\"content\"] + \"[/INST]\" }}"
	"{%- elif message.tool_calls is defined and message.tool_calls is not none %}"
	"{{- \"[TOOL_CALLS] [\" }}{%- elif message[\"role\"] == \"assistant\" %}"
	"{{- \" \" + message[\"content\"]|trim + eos_token}}"
	"{%- elif message[\"role\"] == \"tool_results\" or message[\"role\"] == \"tool\" %}"
	"{{- '[TOOL_RESULTS] {\"content\": ' + content|string + \", \" }}"
	"{{- '\"call_id\": \"' + message.tool_call_id + '\"}[/TOOL_RESULTS]' }}{%- endif %}{%- endfor %}";

static const char zephyr_src[] =
	"{% for message in messages %}{% if message['role'] == 'user' %}"
	"{{ '<|user|>\n' + message['content'] + eos_token }}{% elif message['role'] == 'system' %}"
	"{{ '<|system|>\n' + message['content'] + eos_token }}{% elif message['role'] == 'assistant' %}"
	"{{ '<|assistant|>\n'  + message['content'] + eos_token }}{% endif %}"
	"{% if loop.last and add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}{% endfor %}";

static const char vicuna_src[] =
	"{% for message in messages %}{% if message['role'] == 'user' %}{{ 'USER: ' + message['content'] + '\n' }}"
	"{% elif message['role'] == 'assistant' %}{{ 'ASSISTANT: ' + message['content'] + '</s>\n' }}{% endif %}{% endfor %}";

START_TEST(test_detect)
{
	static const struct { const char *src; enum chat_format want; } ok[] = {
		{ llama2_src, CHAT_LLAMA2 }, { llama3_src, CHAT_LLAMA3 },
		{ llama32_src, CHAT_LLAMA3 },
		{ qwen2_src, CHAT_CHATML }, { mistral_src, CHAT_MISTRAL },
		{ gemma_src, CHAT_GEMMA }, { phi3_src, CHAT_PHI3 },
		{ deepseek_src, CHAT_DEEPSEEK }, { mistral_v3_full_src, CHAT_MISTRAL_V3 },
	};
	static const char *const no[] = {
		mistral_v3_src, mistral_v03_plain_src, deepseek_v3_src,
		zephyr_src, vicuna_src, "", "{{ messages }}",
	};
	enum chat_format f;

	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		f = CHAT__N;
		ck_assert_int_eq(chat_format_detect(ok[i].src, &f), 0);
		ck_assert_msg(f == ok[i].want, "source %zu: %s, want %s", i,
			      chat_format_name(f), chat_format_name(ok[i].want));
	}
	for (size_t i = 0; i < sizeof(no) / sizeof(no[0]); i++) {
		f = CHAT__N;
		ck_assert_msg(chat_format_detect(no[i], &f) == -ENOENT,
			      "look-alike %zu recognized as %s", i, chat_format_name(f));
		ck_assert_int_eq(f, CHAT_NONE);
	}
	/* two formats' markers in one source: ambiguous, refused */
	size_t l1 = strlen(qwen2_src), l2 = strlen(llama3_src);
	char *both = malloc(l1 + l2 + 1);
	memcpy(both, qwen2_src, l1);
	memcpy(both + l1, llama3_src, l2 + 1);
	ck_assert_int_eq(chat_format_detect(both, &f), -ENOENT);
	free(both);
	/* kvd's own sources (generated models) are recognized as theirs */
	ck_assert_ptr_null(chat_format_template(CHAT_NONE));
	ck_assert_ptr_null(chat_format_template(CHAT__N));
	for (int i = CHAT_LLAMA2; i < CHAT__N; i++) {
		ck_assert_ptr_nonnull(chat_format_template((enum chat_format)i));
		ck_assert_int_eq(chat_format_detect(chat_format_template((enum chat_format)i), &f), 0);
		ck_assert_msg((int)f == i, "kvd's %s source detected as %s",
			      chat_format_name((enum chat_format)i), chat_format_name(f));
	}
	ck_assert_int_eq(chat_format_detect(NULL, &f), -EINVAL);
	ck_assert_int_eq(chat_format_detect(llama3_src, NULL), -EINVAL);
}
END_TEST

/* Names round-trip, and model.chat_template's choices are these names in
 * enum order (the daemon casts the config index to enum chat_format). */
START_TEST(test_names_and_config)
{
	enum chat_format f;
	char path[] = "/tmp/kvd_test_chat_XXXXXX";

	for (int i = 0; i < CHAT__N; i++) {
		ck_assert_int_eq(chat_format_by_name(chat_format_name((enum chat_format)i),
						     &f), 0);
		ck_assert_int_eq(f, i);
	}
	ck_assert_int_eq(chat_format_by_name("auto", &f), -ENOENT);
	ck_assert_int_eq(chat_format_by_name("LLAMA3", &f), -ENOENT);
	ck_assert_str_eq(chat_format_name((enum chat_format)99), "?");

	int fd = mkstemp(path);
	ck_assert_int_ge(fd, 0);   /* an empty, readable model.path */
	close(fd);
	for (int i = 0; i <= CHAT__N; i++) {
		const char *name = i == 0 ? "auto" : i == CHAT__N ? "jinja"
			: chat_format_name((enum chat_format)i);
		char text[256];
		struct kvd_config cfg;
		struct kvd_config_error e;
		snprintf(text, sizeof(text), "[model]\npath = %s\nchat_template = %s\n[kv]\npool_tokens = 64\n",
			 path, name);
		int rc = kvd_config_load_string(&cfg, "t.ini", text, &e);
		if (i == CHAT__N) {
			ck_assert_int_ne(rc, 0);
			ck_assert_str_eq(e.key, "model.chat_template");
		} else {
			ck_assert_msg(rc == 0, "%s: %s", name, e.msg);
			ck_assert_int_eq(cfg.chat_template, i);
		}
	}
	unlink(path);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("chat");
	TCase *tc = tcase_create("core");
	SRunner *sr;
	int failed;

	tcase_add_test(tc, test_llama2);
	tcase_add_test(tc, test_llama3);
	tcase_add_test(tc, test_chatml);
	tcase_add_test(tc, test_mistral);
	tcase_add_test(tc, test_gemma);
	tcase_add_test(tc, test_phi3);
	tcase_add_test(tc, test_deepseek);
	tcase_add_test(tc, test_tools_llama3);
	tcase_add_test(tc, test_tools_chatml);
	tcase_add_test(tc, test_tools_mistral_v3);
	tcase_add_test(tc, test_tools_refusals);
	tcase_add_test(tc, test_refusals);
	tcase_add_test(tc, test_too_big);
	tcase_add_test(tc, test_detect);
	tcase_add_test(tc, test_names_and_config);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
