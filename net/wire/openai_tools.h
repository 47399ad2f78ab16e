/* openai_tools.h - the tool calls in a model's output (chat completions).
 *
 * A model answers a tools request in its chat format's call syntax:
 *   chatml (Qwen2.5 / Hermes): text, and calls as
 *     <tool_call>\n{"name": N, "arguments": {...}}\n</tool_call>
 *   llama3 (Llama 3.1's JSON tool calling): the whole answer is one
 *     {"name": N, "parameters": {...}} ("arguments" taken too).
 *   mistral_v3 (Mistral 7B Instruct v0.3): text, then the [TOOL_CALLS]
 *     control token and a JSON array of {"name": N, "arguments": {...}}
 *     (an "id" taken too). Detokenizing drops control tokens, so the
 *     front writes openai_calls_token()'s text into the answer when the
 *     model draws that token; the scanner reads that text.
 *     A list with any element that is not a call is text, all of it.
 * openai_calls_scan finds them in the text not yet answered, for the
 * stream (as the text grows) and for the final answer alike. A call is
 * one whose JSON parses to an object with a name among the tools offered
 * and an object of arguments; anything else (bad JSON, another name, a
 * block never closed, one longer than OPENAI_CALL_HOLD_MAX) stays text.
 *
 * Pure; any thread. The request side (tools, tool_choice, messages'
 * tool_calls) is read by openai.c (openai.h).
 */
#pragma once

#include "gpu/text/chat.h"
#include "net/wire/openai.h"

#include <stdbool.h>
#include <stddef.h>

/* Bytes of a call held back from a stream, at most: beyond, it is text. */
#define OPENAI_CALL_HOLD_MAX (64u << 10)

enum {
	OPENAI_SCAN_TEXT = 0,   /* [0, text) is text; [text, len) may begin a
				 * call (held until more comes, or final) */
	OPENAI_SCAN_CALL = 1,   /* [0, text) is text, then a call [text, end) */
};

struct openai_found {
	size_t text;
	size_t end;                          /* CALL */
	char name[OPENAI_TOOL_NAME_MAX + 1]; /* CALL */
	char *arguments;                     /* CALL: malloc'd JSON object
					      * text (compact); the caller's */
};

/* Whether format f has a call syntax that openai_calls_scan reads. */
bool openai_calls_format(enum chat_format f);
/* The text of the control token that opens format f's calls, which the
 * front writes for that token's id ("[TOOL_CALLS]"); NULL when f's calls
 * are ordinary text. */
const char *openai_calls_token(enum chat_format f);

/* Scan p[0, len), the answer's text not yet given out, in format f for
 * the first call of tools[0, n_tools). final: no more text will come
 * (a call still open is text). *plain: the format's one bit of state
 * across the scans of an answer, kept by the caller, false at first
 * (llama3: the answer is text from here on, it did not open with a call;
 * mistral_v3: the text begins inside a call list already read whole). OPENAI_SCAN_TEXT, OPENAI_SCAN_CALL (out set;
 * drop [0, end) and scan again), -ENOMEM. */
int openai_calls_scan(enum chat_format f, const struct openai_tool *tools,
		      size_t n_tools, const char *p, size_t len, bool final,
		      bool *plain, struct openai_found *out);
