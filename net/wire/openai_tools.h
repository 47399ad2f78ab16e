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
 *     front writes OPENAI_CALLS_MARK into the answer's text when the
 *     model draws that token; the scanner reads that byte, never the
 *     token's text spelled out of ordinary pieces (such a list would
 *     skip the call grammar), and the front drops it from the text it
 *     gives out (openai_calls_unmark).
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

/* The byte the front writes into the answer's text for the control
 * token that opens calls (openai_calls_token): 0xFF is in no UTF-8
 * text, and detokenized text is UTF-8 only (gpu/text/detok.c turns an
 * impossible byte into U+FFFD), so only the token drawn makes it; nor
 * is it in any stop string (valid UTF-8 from JSON). */
#define OPENAI_CALLS_MARK '\xff'

/* Whether format f has a call syntax that openai_calls_scan reads. */
bool openai_calls_format(enum chat_format f);
/* The text of the control token that opens format f's calls
 * ("[TOOL_CALLS]": the front looks its id up by it, and writes
 * OPENAI_CALLS_MARK for that id); NULL when f's calls are ordinary
 * text. */
const char *openai_calls_token(enum chat_format f);

/* p[0, n) without its marks (OPENAI_CALLS_MARK) into out (room for n
 * bytes; out == p is fine): the bytes written. */
size_t openai_calls_unmark(char *out, const char *p, size_t n);

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
