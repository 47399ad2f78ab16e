/* http_api.c - the OpenAI-compatible endpoints.
 *
 * Design. One table routes (method, path) to a handler. A generation
 * request goes through the same gate as a msgpack one (client.c), in the
 * same order, and the first refusal is the answer: the key (401), the
 * body (400: JSON, an unsupported parameter named, the model), draining
 * (503), the prompt (400), then the role's admission (decode.c: prompt
 * too long is 400 `context_length_exceeded`, a full pool 429) - before
 * any page is touched (invariant 3).
 *
 * Only the key is judged on the loop. The body - its JSON, the chat
 * template, the tokens: work that grows with its size - is prepared on a
 * worker (daemon/front/prep.h, struct api_prep), so one tenant's megabyte
 * cannot stall another's stream; the rest of the gate runs when the job
 * comes back. Meanwhile the exchange is active (the connection reads no
 * further request), and a connection that closes cancels its job, which
 * frees itself (api_prep_done always comes).
 *
 * The exchange is the request's sink (sink.c): tokens become SSE chunks
 * (stream) or accumulate into one JSON body, in the shape of its
 * endpoint (struct api_shape: completions, chat completions, or the
 * Responses API's events and object - the same gate, rendering and
 * request for all three); the final answer carries finish_reason and usage; an error before any byte went out is an
 * OpenAI error object with its status (500 for an integrity failure: no
 * token is sent), after it an SSE error event. Text is sent only up to
 * a UTF-8 boundary and, with stop strings, only what cannot be the start
 * of one; a matched stop string ends the answer and orphans the request
 * (the kick, outside the state change), so its pages go back once nothing
 * writes them (invariant 8). With tools, the same held text is scanned
 * for the model's calls (stream_ready): what may begin one is held too,
 * a complete one goes out as delta.tool_calls (or, not streamed, into
 * message.tool_calls).
 *
 * Keys: `Authorization: Bearer KEY`, looked up in constant time
 * (conf/apikeys.h); the tenant is stored in the request and written in
 * its log lines. /health, /livez and /readyz answer without a key
 * (probes carry none), and so does an OPTIONS preflight (browsers send
 * none: http_cors.c); /metrics takes one when keys are configured (see
 * api_metrics). /tokenize and /detokenize are http_tok.c's.
 *
 * Allocation failures. Once a request exists, an allocation that fails
 * while its answer is built (the held text, a JSON answer or event)
 * ends the exchange at once: a 500 (or, after the head went out, an SSE
 * error event and the end of the stream), the connection closes, and
 * the request is orphaned through the kick, so its pages go back once
 * nothing writes them - never an exchange that waits for an answer that
 * cannot be made. A write that cannot be queued dooms the connection
 * (http.c), which the sweep closes. In fault-point builds
 * KVD_HTTP_NOMEM=N makes the N-th allocation of every exchange fail
 * (tests/integration/http_harden.sh walks N through all of them).
 *
 * Every refusal before a request exists (the key, the body, routing,
 * draining at the door; http.c: parse errors, timeouts, max_clients) is
 * counted once in kvd_requests_total (http__refusal_count); a request's
 * own outcome is counted when it ends (req.c).
 */
#include "daemon/front/http_int.h"
#include "daemon/front/http_page.h"
#include "conf/apikeys.h"
#include "conf/util.h"
#include "kvd_build.h"
#include "net/wire/openai_tools.h"

#include <errno.h>
#include <jansson.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void api_prep_detach(struct api_prep *ap);

/* The answer's shape, one row per endpoint (api_shapes): the id's
 * prefix, how the prompt is read, and the writers of a stream's text,
 * of the final answer and of an error once the head went out.
 * Completions and chat share OpenAI's chunk writers (x->chat picks the
 * objects); the Responses API has its own events and object. The gate,
 * the request, stop strings and UTF-8 hold-back are the exchange's,
 * whatever the shape. */
struct api_shape {
	const char *id_prefix;           /* "cmpl-", "chatcmpl-", "resp_" */
	enum openai_ep ep;               /* the body's reader */
	bool chat;                       /* messages, rendered by the chat template */
	const char *prompt_param;        /* names the prompt in a 400 */
	/* stream: text[0, n) may go out (what was sent is dropped or
	 * remembered, the writer's choice); -ENOMEM when it cannot (the
	 * caller fails the exchange); all: the last text of the answer (a
	 * writer may flush what it held for it) */
	int (*text)(struct http_conn *hc, size_t n, bool all);
	/* the final answer (a stop string, or the request's final); ends
	 * the exchange */
	void (*final)(struct http_conn *hc, const char *finish, uint32_t completion);
	/* an error after the head went out: its events, then the end */
	void (*stream_error)(struct http_conn *hc, const char *type,
			     const char *code, const char *msg);
	/* no memory after the head went out: the stream's end, made without
	 * allocating here */
	void (*nomem_tail)(struct http_conn *hc);
};

/* ---- answering -------------------------------------------------------------- */

/* An allocation of the exchange is about to be made: true when the
 * fault point says it fails (fault-point builds, KVD_HTTP_NOMEM=N: the
 * N-th of every exchange). */
static bool x_nomem(struct http_conn *hc)
{
	if (!KVD_FAULT_POINTS || !hc->hs->nomem_at)
		return false;
	return ++hc->x.allocs == hc->hs->nomem_at;
}

/* proto error -> HTTP status, OpenAI type and code */
static void err_map(int code, int *status, const char **type, const char **ecode)
{
	switch (code) {
	case PROTO_ERR_PROMPT_TOO_LONG:
		*status = 400; *type = "invalid_request_error";
		*ecode = "context_length_exceeded"; return;
	case PROTO_ERR_INVALID_REQUEST:
		*status = 400; *type = "invalid_request_error"; *ecode = NULL; return;
	case PROTO_ERR_OVERLOADED:
		*status = 429; *type = "server_error"; *ecode = "overloaded"; return;
	case PROTO_ERR_DRAINING:
		*status = 503; *type = "server_error"; *ecode = "draining"; return;
	case PROTO_ERR_NO_PREFILL_PEER:
		*status = 503; *type = "server_error"; *ecode = "no_prefill_peer"; return;
	case PROTO_ERR_TIMEOUT:
		*status = 504; *type = "server_error"; *ecode = "timeout"; return;
	case PROTO_ERR_INTEGRITY:
		*status = 500; *type = "server_error"; *ecode = "integrity_failure"; return;
	default:
		*status = 500; *type = "server_error"; *ecode = "internal_error"; return;
	}
}

/* ---- text: UTF-8 and stop strings --------------------------------------------- */

/* Length of the longest prefix of p[0, n) that does not end inside a
 * UTF-8 sequence (the rest may complete with the next piece). */
static size_t utf8_whole(const char *p, size_t n)
{
	size_t i = n, back = 0;

	while (i > 0 && back < 4 && ((unsigned char)p[i - 1] & 0xC0) == 0x80) {
		i--;
		back++;
	}
	if (i == 0)
		return n;
	unsigned char c = (unsigned char)p[i - 1];
	size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;

	return (need > 1 && back + 1 < need) ? i - 1 : n;
}

/* A JSON string of p[0, n): invalid UTF-8 bytes become U+FFFD, so a
 * model's stray byte never breaks the JSON. */
static json_t *json_text(const char *p, size_t n)
{
	json_t *j = json_stringn(p, n);
	char *fix;
	size_t o = 0;

	if (j)
		return j;
	fix = malloc(n * 3 + 1);
	if (!fix)
		return NULL;
	for (size_t i = 0; i < n;) {
		unsigned char c = (unsigned char)p[i];
		size_t need = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 :
			      (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
		json_t *t = need && i + need <= n ? json_stringn(p + i, need) : NULL;

		if (t) {
			memcpy(fix + o, p + i, need);
			o += need;
			i += need;
			json_decref(t);
		} else {
			memcpy(fix + o, "\xEF\xBF\xBD", 3);
			o += 3;
			i++;
		}
	}
	j = json_stringn(fix, o);
	free(fix);
	return j;
}

static int text_add(struct http_conn *hc, const char *p, size_t n)
{
	struct http_exchange *x = &hc->x;

	if (x->len + n + 1 > x->cap) {
		size_t cap = x->cap ? x->cap * 2 : 256;
		char *nt;

		while (cap < x->len + n + 1)
			cap *= 2;
		nt = x_nomem(hc) ? NULL : realloc(x->text, cap);
		if (!nt)
			return -ENOMEM;
		x->text = nt;
		x->cap = cap;
	}
	memcpy(x->text + x->len, p, n);
	x->len += n;
	x->text[x->len] = 0;
	return 0;
}

/* The first stop string in text[from, len): its offset, or -1. */
static long stop_find(const struct http_exchange *x, size_t from)
{
	long best = -1;

	for (uint32_t i = 0; i < x->n_stop; i++) {
		size_t sl = x->stop_len[i];

		for (size_t o = from; o + sl <= x->len; o++)
			if (!memcmp(x->text + o, x->stop[i], sl)) {
				if (best < 0 || (long)o < best)
					best = (long)o;
				break;
			}
	}
	return best;
}

/* Bytes at the end of text that could begin a stop string. */
static size_t stop_holdback(const struct http_exchange *x)
{
	size_t hold = 0;

	for (uint32_t i = 0; i < x->n_stop; i++)
		for (size_t k = KVD_MIN(x->stop_len[i] - 1, x->len); k > hold; k--)
			if (!memcmp(x->text + x->len - k, x->stop[i], k)) {
				hold = k;
				break;
			}
	return hold;
}

static size_t longest_stop(const struct http_exchange *x)
{
	size_t m = 0;

	for (uint32_t i = 0; i < x->n_stop; i++)
		m = KVD_MAX(m, x->stop_len[i]);
	return m;
}

/* ---- the exchange's JSON --------------------------------------------------------- */

/* OpenAI's usage, with prompt_tokens_details.cached_tokens: the prompt
 * tokens this request read from its own tenant's prefix cache. */
_Static_assert(OPENAI_SALT_MAX == PROTO_CLIENT_SALT_MAX,
	       "one cache_salt bound on both client APIs");

static json_t *usage_json(uint32_t prompt, uint32_t cached, uint32_t completion)
{
	return json_pack("{s:I, s:I, s:I, s:{s:I}}", "prompt_tokens", (json_int_t)prompt,
			 "completion_tokens", (json_int_t)completion,
			 "total_tokens", (json_int_t)prompt + completion,
			 "prompt_tokens_details", "cached_tokens", (json_int_t)cached);
}

/* One choice: completions {text}, chat {message} or {delta}. The first
 * delta of a chat stream carries the assistant role (OpenAI's shape),
 * the final one too when no text went before it. */
static json_t *choice_json(const struct http_exchange *x, json_t *text,
			   json_t *lp, const char *finish, bool chunk)
{
	json_t *c;

	if (!x->chat)
		c = json_pack("{s:o, s:i, s:o?, s:o}", "text", text, "index", (int)x->index,
			      "logprobs", lp, "finish_reason",
			      finish ? json_string(finish) : json_null());
	else if (!chunk)
		c = json_pack("{s:i, s:{s:s, s:o}, s:o?, s:o}", "index", (int)x->index, "message",
			      "role", "assistant", "content", text, "logprobs", lp,
			      "finish_reason", finish ? json_string(finish) : json_null());
	else
		c = json_pack("{s:i, s:o, s:o?, s:o}", "index", (int)x->index, "delta",
			      text ? (x->role_sent ? json_pack("{s:o}", "content", text) :
				      json_pack("{s:s, s:o}", "role", "assistant", "content", text))
				   : x->role_sent ? json_object()
						  : json_pack("{s:s}", "role", "assistant"),
			      "logprobs", lp, "finish_reason",
			      finish ? json_string(finish) : json_null());
	return c;
}

/* ---- logprobs ------------------------------------------------------------------ */

/* Hold token id's logprobs with the n text bytes it adds next. */
static int lp_add(struct http_conn *hc, int32_t id,
		  const struct sampler_logprobs *lp, size_t n)
{
	struct http_exchange *x = &hc->x;
	size_t at = x->base + x->len;

	if (x->n_lp == x->cap_lp) {
		uint32_t cap = x->cap_lp ? x->cap_lp * 2 : 16;
		struct http_lp *nl = x_nomem(hc) ? NULL :
				     realloc(x->lps, cap * sizeof(*nl));

		if (!nl)
			return -ENOMEM;
		x->lps = nl;
		x->cap_lp = cap;
	}
	x->lps[x->n_lp++] = (struct http_lp){ .id = id, .start = at,
					      .end = at + n, .lp = *lp };
	return 0;
}

/* How many held tokens' text ends by byte `end` (absolute). */
static uint32_t lp_upto(const struct http_exchange *x, size_t end)
{
	uint32_t n = 0;

	while (n < x->n_lp && x->lps[n].end <= end)
		n++;
	return n;
}

/* A stop string cut the text at byte `cut` (absolute): the tokens whose
 * text lies wholly after it were never part of the answer. */
static void lp_cut(struct http_exchange *x, size_t cut)
{
	while (x->n_lp) {
		const struct http_lp *l = &x->lps[x->n_lp - 1];

		if (l->start < cut || (l->start == cut && l->end == cut))
			break;
		x->n_lp--;
	}
}

static void lp_drop(struct http_exchange *x, uint32_t n)
{
	if (!n)
		return;   /* x->lps may be NULL (no logprobs asked) */
	memmove(x->lps, x->lps + n, (x->n_lp - n) * sizeof(*x->lps));
	x->n_lp -= n;
}

/* A token's text (its bytes as decoded; invalid UTF-8 as U+FFFD) and,
 * with bytes, those bytes as integers (OpenAI's `bytes`). */
static json_t *lp_token(const struct tokenizer *tok, int32_t id, json_t **bytes)
{
	const char *p = "";
	size_t n = 0;

	if (tokenizer_piece(tok, id, &p, &n))
		n = 0;
	if (bytes) {
		*bytes = json_array();
		for (size_t i = 0; *bytes && i < n; i++)
			if (json_array_append_new(*bytes, json_integer((unsigned char)p[i]))) {
				json_decref(*bytes);
				*bytes = NULL;
			}
	}
	return json_text(p, n);
}

/* chat: {token, logprob, bytes} */
static json_t *lp_chat_one(const struct tokenizer *tok, int32_t id, float logprob)
{
	json_t *bytes = NULL, *t = lp_token(tok, id, &bytes);

	if (!t || !bytes) {
		json_decref(t);
		json_decref(bytes);
		return NULL;
	}
	return json_pack("{s:o, s:f, s:o}", "token", t, "logprob", (double)logprob,
			 "bytes", bytes);
}

static json_t *lp_chat_entry(const struct tokenizer *tok, const struct http_lp *l)
{
	json_t *e = lp_chat_one(tok, l->id, l->lp.logprob), *top = json_array();

	for (uint32_t i = 0; e && top && i < l->lp.n_top; i++)
		if (json_array_append_new(top, lp_chat_one(tok, l->lp.top[i].id,
							   l->lp.top[i].logprob)))
			break;
	if (!e || !top || json_array_size(top) != l->lp.n_top ||
	    json_object_set_new(e, "top_logprobs", top)) {
		json_decref(e);
		return NULL;
	}
	return e;
}

/* completions: the four parallel arrays gain one token */
static int lp_cmpl_add(const struct tokenizer *tok, const struct http_lp *l,
		       json_t *toks, json_t *lps, json_t *tops, json_t *offs)
{
	json_t *top = json_object();

	for (uint32_t i = 0; top && i < l->lp.n_top; i++) {
		json_t *t = lp_token(tok, l->lp.top[i].id, NULL);

		if (!t || json_object_setn_new(top, json_string_value(t),
					       json_string_length(t),
					       json_real(l->lp.top[i].logprob))) {
			json_decref(t);
			json_decref(top);
			return -ENOMEM;
		}
		json_decref(t);
	}
	if (json_array_append_new(toks, lp_token(tok, l->id, NULL)) ||
	    json_array_append_new(lps, json_real(l->lp.logprob)) ||
	    json_array_append_new(tops, top) ||
	    json_array_append_new(offs, json_integer((json_int_t)l->start)))
		return -ENOMEM;
	return 0;
}

/* The logprobs of the first n held tokens, in the endpoint's shape (chat:
 * {content: [...]}; completions: {tokens, token_logprobs, top_logprobs,
 * text_offset}); NULL without memory. */
static json_t *lp_json(const struct http_conn *hc, uint32_t n)
{
	const struct http_exchange *x = &hc->x;
	const struct tokenizer *tok = hc->s->tok;
	json_t *a[4] = { json_array(), json_array(), json_array(), json_array() };
	bool ok = a[0] && a[1] && a[2] && a[3];

	for (uint32_t i = 0; ok && i < n; i++)
		ok = x->chat ? !json_array_append_new(a[0], lp_chat_entry(tok, &x->lps[i]))
			     : !lp_cmpl_add(tok, &x->lps[i], a[0], a[1], a[2], a[3]);
	if (!ok) {
		for (int i = 0; i < 4; i++)
			json_decref(a[i]);
		return NULL;
	}
	if (x->chat) {
		for (int i = 1; i < 4; i++)
			json_decref(a[i]);
		return json_pack("{s:o}", "content", a[0]);
	}
	return json_pack("{s:o, s:o, s:o, s:o}", "tokens", a[0], "token_logprobs", a[1],
			 "top_logprobs", a[2], "text_offset", a[3]);
}

/* The answer, or one chunk of it; the seed used (kvd's extension) in
 * the answer and in a stream's first chunk. */
static json_t *answer_json(const struct http_exchange *x, json_t *choice,
			   bool chunk)
{
	json_t *j = json_pack("{s:s, s:s, s:I, s:s, s:[o]}", "id", x->id, "object",
			      x->chat ? (chunk ? "chat.completion.chunk" : "chat.completion")
				      : "text_completion",
			      "created", (json_int_t)x->created, "model", x->model,
			      "choices", choice);

	if (j && (!chunk || !x->role_sent) &&
	    json_object_set_new(j, "seed", json_integer((json_int_t)x->seed))) {
		json_decref(j);
		j = NULL;
	}
	return j;
}

/* One SSE event of j (consumed), named `name` ("event: " line) or not
 * (NULL). -ENOMEM when j is NULL (its building failed) or it cannot be
 * written out: the caller fails the exchange. */
static int sse_event(struct http_conn *hc, const char *name, json_t *j)
{
	char *s = j && !x_nomem(hc) ? json_dumps(j, JSON_COMPACT) : NULL;
	size_t head = name ? strlen(name) + 8 : 0;   /* "event: NAME\n" */
	char *ev;
	size_t n;

	json_decref(j);
	if (!s)
		return -ENOMEM;
	n = strlen(s);
	ev = x_nomem(hc) ? NULL : malloc(head + n + 8);
	if (!ev) {
		free(s);
		return -ENOMEM;
	}
	if (name) {
		memcpy(ev, "event: ", 7);
		memcpy(ev + 7, name, head - 8);
		ev[head - 1] = '\n';
	}
	memcpy(ev + head, "data: ", 6);
	memcpy(ev + head + 6, s, n);
	memcpy(ev + head + 6 + n, "\n\n", 2);
	http__chunk(hc, ev, head + n + 8);
	free(ev);
	free(s);
	return 0;
}

static int sse_send(struct http_conn *hc, json_t *j)
{
	return sse_event(hc, NULL, j);
}

static void stream_head(struct http_conn *hc)
{
	if (hc->x.head_sent)
		return;
	hc->x.head_sent = true;
	http__head(hc, 200, "text/event-stream", -1);
}

/* The whole non-streamed answer j (consumed): 200 with its JSON. -ENOMEM
 * (nothing sent) when j is NULL or cannot be written out. */
static int respond_whole(struct http_conn *hc, json_t *j)
{
	char *body = j && !x_nomem(hc) ? json_dumps(j, JSON_COMPACT) : NULL;

	json_decref(j);
	if (!body)
		return -ENOMEM;
	hc->x.head_sent = true;
	http__respond(hc, 200, "application/json", body, strlen(body));
	free(body);
	return 0;
}

/* A JSON string of p[0, n) without the calls mark the sink wrote for
 * the token that opens calls (OPENAI_CALLS_MARK: when it opened none, the
 * answer's content holds nothing of it). NULL: no memory. */
static json_t *text_unmarked_json(const char *p, size_t n)
{
	char *u;
	json_t *t;

	if (!n || !memchr(p, OPENAI_CALLS_MARK, n))
		return json_text(p, n);
	if (!(u = malloc(n)))
		return NULL;
	t = json_text(u, openai_calls_unmark(u, p, n));
	free(u);
	return t;
}

/* Whether p[0, n) holds only calls marks (a [TOOL_CALLS] token that
 * opened no calls: no content). */
static bool marks_only(const char *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != OPENAI_CALLS_MARK)
			return false;
	return true;
}

/* Stream text[0, n) as one chunk (none when it is only calls marks and
 * no logprobs go with it), with the logprobs of the tokens whose
 * text it completes (all that are held, at the end), and drop them from
 * the buffers; -ENOMEM (nothing sent: the caller fails the exchange). */
static int stream_text(struct http_conn *hc, size_t n, bool all)
{
	struct http_exchange *x = &hc->x;
	uint32_t k = all ? x->n_lp : lp_upto(x, x->base + n);
	json_t *t, *lp = NULL;

	if (!n && (!all || !k))
		return 0;
	if (!k && marks_only(x->text, n)) {   /* nothing to say: no chunk */
		memmove(x->text, x->text + n, x->len - n);
		x->len -= n;
		x->base += n;
		return 0;
	}
	stream_head(hc);
	if (x->lp_on && !(lp = x_nomem(hc) ? NULL : lp_json(hc, k)))
		return -ENOMEM;
	t = x_nomem(hc) ? NULL : text_unmarked_json(x->text, n);
	if (!t) {
		json_decref(lp);
		return -ENOMEM;
	}
	if (sse_send(hc, answer_json(x, choice_json(x, t, lp, NULL, true), true)))
		return -ENOMEM;
	x->role_sent = true;
	memmove(x->text, x->text + n, x->len - n);
	x->len -= n;
	x->base += n;
	lp_drop(x, k);
	return 0;
}

/* ---- tool calls in the answer (net/wire/openai_tools.h) ------------------------------- */

/* One call as OpenAI writes it, with a fresh id ("call_" and 96 random
 * bits: what the client sends back as tool_call_id; for mistral_v3 the
 * 9 random alphanumerics Mistral's template renders as they are, as
 * vLLM gives); index >= 0 for a stream's delta. NULL: no memory. */
static json_t *call_json(struct http_conn *hc, const struct openai_found *c,
			 int index)
{
	static const char alnum[] =
		"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
	unsigned char rnd[12];
	char hex[2 * sizeof(rnd) + 1], id[8 + sizeof(hex)];
	json_t *j;

	randombytes_buf(rnd, sizeof(rnd));
	sodium_bin2hex(hex, sizeof(hex), rnd, sizeof(rnd));
	snprintf(id, sizeof(id), "call_%s", hex);
	if (hc->x.tool_fmt == CHAT_MISTRAL_V3) {
		for (size_t i = 0; i < CHAT_MISTRAL_ID_LEN; i++)
			id[i] = alnum[randombytes_uniform(sizeof(alnum) - 1)];
		id[CHAT_MISTRAL_ID_LEN] = '\0';
	}
	j = x_nomem(hc) ? NULL
	    : json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", id, "type", "function",
			"function", "name", c->name, "arguments", c->arguments);
	if (j && index >= 0 && json_object_set_new(j, "index", json_integer(index))) {
		json_decref(j);
		j = NULL;
	}
	return j;
}

/* One call as a chunk: delta.tool_calls (the role too when it is the
 * first delta). -ENOMEM. */
static int stream_call(struct http_conn *hc, const struct openai_found *c)
{
	struct http_exchange *x = &hc->x;
	json_t *call = call_json(hc, c, (int)x->n_calls);
	json_t *delta = call ? json_pack("{s:[o]}", "tool_calls", call) : NULL;

	if (delta && !x->role_sent &&
	    json_object_set_new(delta, "role", json_string("assistant"))) {
		json_decref(delta);
		delta = NULL;
	}
	if (!delta)
		return -ENOMEM;
	stream_head(hc);
	if (sse_send(hc, answer_json(x, json_pack("{s:i, s:o, s:n, s:n}", "index", (int)x->index,
						  "delta", delta, "logprobs",
						  "finish_reason"), true)))
		return -ENOMEM;
	x->role_sent = true;
	x->n_calls++;
	return 0;
}

/* Stream what is sure: the text up to what may start a stop string, a
 * UTF-8 sequence or a call (one hold-back: the unsent text, x->text),
 * and each call once it is complete; final: all of it. -ENOMEM. */
static int stream_ready(struct http_conn *hc, bool final)
{
	struct http_exchange *x = &hc->x;
	size_t safe = final ? x->len : x->len - stop_holdback(x), used;
	struct openai_found f;
	int rc;

	if (x->tool_fmt == CHAT_NONE)
		return x->shape->text(hc, final ? safe : utf8_whole(x->text, safe), final);
	for (;;) {
		rc = openai_calls_scan(x->tool_fmt, x->tools, x->n_tools, x->text, safe,
				       final, &x->tool_plain, &f);
		if (rc < 0)
			return rc;
		if (stream_text(hc, rc == OPENAI_SCAN_CALL || final ? f.text
					: utf8_whole(x->text, f.text),
				final && rc != OPENAI_SCAN_CALL) ||
		    (rc == OPENAI_SCAN_CALL && stream_call(hc, &f))) {
			free(f.arguments);
			return -ENOMEM;
		}
		free(f.arguments);
		if (rc != OPENAI_SCAN_CALL)
			return 0;
		/* the text before it went out: the call is x->text[0, used);
		 * its tokens' logprobs go with it */
		used = f.end - f.text;
		memmove(x->text, x->text + used, x->len - used);
		x->len -= used;
		lp_drop(x, lp_upto(x, x->base + used));
		x->base += used;
		safe -= f.end;
	}
}

/* Not streamed: the answer's text split into its text (content, less
 * the calls marks) and its calls (x->calls). -ENOMEM. */
static int final_calls(struct http_conn *hc, struct kvd_buf *content)
{
	struct http_exchange *x = &hc->x;
	struct openai_found f;
	size_t pos = 0;
	int rc;

	if (!(x->calls = x_nomem(hc) ? NULL : json_array()))
		return -ENOMEM;
	do {
		rc = openai_calls_scan(x->tool_fmt, x->tools, x->n_tools, x->text + pos,
				       x->len - pos, true, &x->tool_plain, &f);
		if (rc < 0 || kvd_buf_add(content, x->text + pos, f.text) ||
		    (rc == OPENAI_SCAN_CALL &&
		     json_array_append_new(x->calls, call_json(hc, &f, -1)))) {
			free(f.arguments);
			return -ENOMEM;
		}
		free(f.arguments);
		pos += rc == OPENAI_SCAN_CALL ? f.end : f.text;
		x->n_calls += rc == OPENAI_SCAN_CALL;
	} while (rc == OPENAI_SCAN_CALL);
	if (content->p)   /* a mark that opened no calls is not content */
		content->len = openai_calls_unmark(content->p, content->p, content->len);
	return 0;
}

/* Whether p[0, n) is only whitespace (the text between calls). */
static bool blank(const char *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != ' ' && p[i] != '\n' && p[i] != '\t' && p[i] != '\r')
			return false;
	return true;
}

/* The finish reason: "tool_calls" for an answer with calls in it, as
 * vLLM says (also when max_tokens ended it after them: the calls are
 * complete, and the client's next step is to run them). */
static const char *tools_finish(const struct http_exchange *x, const char *finish)
{
	return x->n_calls ? "tool_calls" : finish;
}

/* Not streamed, with tools: the message's content (null when only calls
 * and whitespace) and tool_calls. NULL: no memory. */
static json_t *tools_message_choice(struct http_conn *hc, const char *finish)
{
	struct http_exchange *x = &hc->x;
	struct kvd_buf content = KVD_BUF_NULL;
	json_t *c = NULL, *t;

	if (final_calls(hc, &content) == 0) {
		finish = tools_finish(x, finish);
		t = x->n_calls && blank(content.p, content.len) ? json_null()
		    : x_nomem(hc) ? NULL : json_text(content.p ? content.p : "", content.len);
		c = t ? choice_json(x, t, x->lp_on ? lp_json(hc, x->n_lp) : NULL,
				    finish, false) : NULL;
		if (c && x->n_calls &&
		    json_object_set(json_object_get(c, "message"), "tool_calls", x->calls)) {
			json_decref(c);
			c = NULL;
		}
	}
	kvd_buf_deinit(&content);
	return c;
}

/* ---- n > 1: the choices of one exchange ------------------------------------------- */

/* Each choice is an engine request of its own (api_admit_choices); its
 * fields (struct http_choice) are the exchange's while it is answered,
 * so every writer above serves any choice. A sink op takes the choice
 * of its request first (choice_of); the answer goes out when the last
 * choice is done (choices_final). With n == 1 there is no array and
 * nothing here does anything. */

/* r's answer is complete but it may still run: the kick orphans it. */
static void exchange_cancel(struct http_exchange *x, struct serve_req *r)
{
	if (r && x->n_cancel < HTTP_N_MAX)
		x->cancel[x->n_cancel++] = r;
}

/* Choice i's fields become the exchange's; the current ones are put
 * aside. */
static void choice_take(struct http_exchange *x, uint32_t i)
{
	if (!x->choices || i == x->cur)
		return;
	x->choices[x->cur] = x->ch;
	x->ch = x->choices[i];
	x->cur = i;
}

/* Take the choice whose request is r; false when none is (answered). */
static bool choice_of(struct http_exchange *x, const struct serve_req *r)
{
	if (x->r == r)
		return r != NULL;
	for (uint32_t i = 0; x->choices && i < x->n_choices; i++)
		if (i != x->cur && x->choices[i].r == r) {
			choice_take(x, i);
			return true;
		}
	return false;
}

/* The exchange ends: every choice still running is orphaned. */
static void choices_cancel(struct http_exchange *x)
{
	exchange_cancel(x, x->r);
	x->r = NULL;
	for (uint32_t i = 0; x->choices && i < x->n_choices; i++)
		if (i != x->cur) {
			exchange_cancel(x, x->choices[i].r);
			x->choices[i].r = NULL;
		}
}

static void choices_free(struct http_exchange *x)
{
	if (!x->choices)
		return;
	x->choices[x->cur] = x->ch;
	memset(&x->ch, 0, sizeof(x->ch));
	for (uint32_t i = 0; i < x->n_choices; i++) {
		free(x->choices[i].text);
		free(x->choices[i].lps);
		json_decref(x->choices[i].calls);
		json_decref(x->choices[i].json);
	}
	free(x->choices);
	x->choices = NULL;
}

static void exchange_free(struct http_exchange *x)
{
	choices_free(x);
	if (x->prep)
		api_prep_detach(x->prep);
	if (x->tok)
		http__tok_detach(x->tok);
	for (uint32_t i = 0; i < x->n_stop; i++)
		free(x->stop[i]);
	free(x->text);
	free(x->lps);
	free(x->tools);
	json_decref(x->calls);
	json_decref(x->json);
	memset(x, 0, sizeof(*x));
}

/* The answer is complete: log it, free the exchange, let the next go. */
static void exchange_end(struct http_conn *hc, int status, uint32_t completion,
			 const char *finish)
{
	struct http_exchange *x = &hc->x;

	KVLOG_INFO(hc->s->log, "http_request",
		   "conn=%llu tenant=%s method=%s path=%s status=%d id=%llu client_id=%llu completion=%s stream=%d prompt_tokens=%u completion_tokens=%u finish=%s total_us=%llu",
		   (unsigned long long)hc->conn_id, KVLOG_Q(x->tenant),
		   KVLOG_Q(x->method), KVLOG_Q(x->path), status,
		   (unsigned long long)x->req_id, (unsigned long long)x->num,
		   x->id[0] ? x->id : "-", x->stream, x->prompt_tokens,
		   completion, finish,
		   (unsigned long long)((kvd_now_ns() - x->t_start_ns) / 1000));
	choices_cancel(x);   /* n > 1: the choices still running */
	{
		struct serve_req *cancel[HTTP_N_MAX];
		uint32_t n_cancel = x->n_cancel;
		bool active = x->active;

		memcpy(cancel, x->cancel, n_cancel * sizeof(*cancel));
		exchange_free(x);
		memcpy(x->cancel, cancel, n_cancel * sizeof(*cancel));
		x->n_cancel = n_cancel;
		x->active = active;
	}
	http__exchange_done(hc);
	if (hc->x.n_cancel)
		http__kick(hc);
}

/* No memory for the answer: a 500 (or, once the head is out, an SSE
 * error event and the end of the stream), made without allocating here;
 * the connection closes and the request, if it still runs, is orphaned
 * through the kick (its pages go back once nothing writes them). */
#define NOMEM_ERROR "{\"error\":{\"message\":\"out of memory while answering\",\"type\":\"server_error\",\"param\":null,\"code\":\"internal_error\"}}"

/* completions and chat: an error chunk, then [DONE] */
static void oa_nomem_tail(struct http_conn *hc)
{
	static const char event[] = "data: " NOMEM_ERROR "\n\n";

	http__chunk(hc, event, sizeof(event) - 1);
	http__chunk(hc, "data: [DONE]\n\n", 14);
	http__chunk(hc, "", 0);
}

static void exchange_fail(struct http_conn *hc, uint32_t completion)
{
	struct http_exchange *x = &hc->x;
	static const char body[] = NOMEM_ERROR "\n";

	exchange_cancel(x, x->r);
	x->r = NULL;
	hc->close_after = true;
	if (!x->head_sent) {
		x->head_sent = true;
		http__respond(hc, 500, "application/json", body, sizeof(body) - 1);
	} else {
		x->shape->nomem_tail(hc);
	}
	exchange_end(hc, 500, completion, "out_of_memory");
}
#undef NOMEM_ERROR

/* ---- n > 1: the choices' ends -------------------------------------------------------- */

static void choices_final(struct http_conn *hc, const char *finish,
			  uint32_t completion);

/* The final answer (a stop string, or the request's final). */
static void answer_final(struct http_conn *hc, const char *finish,
			 uint32_t completion)
{
	struct http_exchange *x = &hc->x;
	json_t *j, *t, *lp;

	if (x->r)   /* a stop string ended it before its final */
		x->cached_tokens = x->r->cached_tokens;
	if (x->n_choices > 1) {
		choices_final(hc, finish, completion);
		return;
	}
	if (x->stream) {
		/* a stop string matched before any text went out: the head
		 * is still ours to send */
		stream_head(hc);
		if (stream_ready(hc, true)) {
			exchange_fail(hc, completion);
			return;
		}
		finish = tools_finish(x, finish);
		t = x->chat ? NULL : x_nomem(hc) ? NULL : json_string("");
		j = x->chat || t ? answer_json(x, choice_json(x, t, NULL, finish, true), true) : NULL;
		if (j && json_object_set_new(j, "usage", usage_json(x->prompt_tokens, x->cached_tokens, completion))) {
			json_decref(j);
			j = NULL;
		}
		if (sse_send(hc, j)) {
			exchange_fail(hc, completion);
			return;
		}
		http__chunk(hc, "data: [DONE]\n\n", 14);
		http__chunk(hc, "", 0);
	} else if (x->tool_fmt != CHAT_NONE) {
		j = answer_json(x, tools_message_choice(hc, finish), false);
		finish = tools_finish(x, finish);
	} else {
		lp = x->lp_on && !x_nomem(hc) ? lp_json(hc, x->n_lp) : NULL;
		t = x_nomem(hc) || (x->lp_on && !lp) ? NULL : json_text(x->text, x->len);
		if (!t)
			json_decref(lp);
		j = t ? answer_json(x, choice_json(x, t, lp, finish, false), false) : NULL;
	}
	if (!x->stream) {
		if (j && json_object_set_new(j, "usage", usage_json(x->prompt_tokens, x->cached_tokens, completion))) {
			json_decref(j);
			j = NULL;
		}
		if (respond_whole(hc, j)) {
			exchange_fail(hc, completion);
			return;
		}
	}
	exchange_end(hc, 200, completion, finish);
}

/* n > 1, streamed: the choice's last text, then its chunk with its
 * finish_reason (the usage comes once, after the last choice). -ENOMEM. */
static int choice_stream_end(struct http_conn *hc, const char *finish)
{
	struct http_exchange *x = &hc->x;
	json_t *t = NULL;

	stream_head(hc);
	if (stream_ready(hc, true))
		return -ENOMEM;
	snprintf(x->finish, sizeof(x->finish), "%s", tools_finish(x, finish));
	if (!x->chat && !(t = x_nomem(hc) ? NULL : json_string("")))
		return -ENOMEM;
	if (sse_send(hc, answer_json(x, choice_json(x, t, NULL, x->finish, true), true)))
		return -ENOMEM;
	x->role_sent = true;
	return 0;
}

/* n > 1, not streamed: the choice's object, kept for the answer. -ENOMEM. */
static int choice_keep(struct http_conn *hc, const char *finish)
{
	struct http_exchange *x = &hc->x;
	json_t *t, *lp = NULL;

	if (x->tool_fmt != CHAT_NONE) {
		x->json = tools_message_choice(hc, finish);
		snprintf(x->finish, sizeof(x->finish), "%s", tools_finish(x, finish));
		return x->json ? 0 : -ENOMEM;
	}
	if (x->lp_on && !(lp = x_nomem(hc) ? NULL : lp_json(hc, x->n_lp)))
		return -ENOMEM;
	t = x_nomem(hc) ? NULL : json_text(x->text, x->len);
	if (!t) {
		json_decref(lp);
		return -ENOMEM;
	}
	snprintf(x->finish, sizeof(x->finish), "%s", finish);
	x->json = choice_json(x, t, lp, finish, false);
	return x->json ? 0 : -ENOMEM;
}

/* The usage of every choice: the prompt once, the completion tokens
 * summed, cached_tokens the fewest any choice read from the prefix cache
 * (what the prompt's one computation reused). */
static json_t *choices_usage(struct http_conn *hc, uint32_t *completion)
{
	const struct http_exchange *x = &hc->x;
	uint32_t sum = 0, cached = UINT32_MAX;

	for (uint32_t i = 0; i < x->n_choices; i++) {
		const struct http_choice *c = i == x->cur ? &x->ch : &x->choices[i];

		sum += c->completion;
		cached = KVD_MIN(cached, c->cached_tokens);
	}
	*completion = sum;
	return x_nomem(hc) ? NULL : usage_json(x->prompt_tokens, cached, sum);
}

/* Not streamed: one answer with every choice's object, in index order.
 * usage consumed. -ENOMEM. */
static int choices_respond(struct http_conn *hc, json_t *usage)
{
	struct http_exchange *x = &hc->x;
	json_t *all = x_nomem(hc) ? NULL : json_array(), *j;

	for (uint32_t i = 0; all && i < x->n_choices; i++)
		if (json_array_append(all, x->choices[i].json)) {
			json_decref(all);
			all = NULL;
		}
	j = all && usage ? json_pack("{s:s, s:s, s:I, s:s, s:o, s:o, s:I}", "id", x->id,
				     "object", x->chat ? "chat.completion" : "text_completion",
				     "created", (json_int_t)x->created, "model", x->model,
				     "choices", json_incref(all), "usage", json_incref(usage),
				     "seed", (json_int_t)x->seed) : NULL;
	json_decref(all);
	json_decref(usage);
	return respond_whole(hc, j);
}

/* Streamed: a last chunk without choices carrying the usage (OpenAI's
 * shape for stream_options.include_usage), then [DONE]. usage consumed.
 * -ENOMEM. */
static int choices_stream_usage(struct http_conn *hc, json_t *usage)
{
	struct http_exchange *x = &hc->x;
	json_t *j = usage ? json_pack("{s:s, s:s, s:I, s:s, s:[], s:o}", "id", x->id,
				      "object", x->chat ? "chat.completion.chunk"
							: "text_completion",
				      "created", (json_int_t)x->created, "model", x->model,
				      "choices", "usage", usage) : NULL;

	if (sse_send(hc, j))
		return -ENOMEM;
	http__chunk(hc, "data: [DONE]\n\n", 14);
	http__chunk(hc, "", 0);
	return 0;
}

/* The current choice is answered (its final, or a stop string): its
 * end goes out (streamed) or is kept; the last one answers for all and
 * ends the exchange. */
static void choices_final(struct http_conn *hc, const char *finish,
			  uint32_t completion)
{
	struct http_exchange *x = &hc->x;
	json_t *usage;
	uint32_t total;
	char last[sizeof(x->finish)];

	if (x->stream ? choice_stream_end(hc, finish) : choice_keep(hc, finish)) {
		exchange_fail(hc, completion);
		return;
	}
	x->done = true;
	x->completion = completion;
	if (++x->n_done < x->n_choices)
		return;
	usage = choices_usage(hc, &total);
	x->choices[x->cur] = x->ch;   /* the array is whole (x->ch stays) */
	if (x->stream ? choices_stream_usage(hc, usage) : choices_respond(hc, usage)) {
		exchange_fail(hc, total);
		return;
	}
	snprintf(last, sizeof(last), "%s", x->finish);   /* x is freed first */
	exchange_end(hc, 200, total, last);
}

/* completions and chat mid-stream: an error chunk, then [DONE] */
static void oa_stream_error(struct http_conn *hc, const char *type,
			    const char *code, const char *msg)
{
	size_t len;
	char *body = http__error_json(msg, type, code, NULL, &len);

	if (body) {
		char *ev = malloc(len + 8);

		if (ev) {
			memcpy(ev, "data: ", 6);
			memcpy(ev + 6, body, len);
			memcpy(ev + 6 + len, "\n\n", 2);
			http__chunk(hc, ev, len + 8);
			free(ev);
		}
	}
	free(body);
	http__chunk(hc, "data: [DONE]\n\n", 14);
	http__chunk(hc, "", 0);
}

/* ---- the Responses API's answer --------------------------------------------------- */

/* The Responses API (POST /v1/responses, stateless): one assistant
 * message item with one output_text part. Stream events, each with
 * its sequence_number: response.created and .in_progress, the item and
 * its part added (at the first text, or at the end), output_text.delta
 * per piece, then output_text.done, content_part.done, output_item.done
 * and response.completed (or .incomplete: max_output_tokens) - the done
 * events carry the whole text, which the exchange keeps (x->sent marks
 * what the deltas sent). An error after the head is an `error` event and
 * response.failed. No [DONE]: OpenAI sends none on this API. */

/* The message item's id: "msg_" and the response's random hex. */
static void resp_msg_id(const struct http_exchange *x, char *out, size_t size)
{
	snprintf(out, size, "msg_%s", x->id + strlen("resp_"));
}

static json_t *resp_usage_json(const struct http_exchange *x, uint32_t completion)
{
	return json_pack("{s:I, s:{s:I}, s:I, s:{s:I}, s:I}",
			 "input_tokens", (json_int_t)x->prompt_tokens,
			 "input_tokens_details", "cached_tokens", (json_int_t)x->cached_tokens,
			 "output_tokens", (json_int_t)completion,
			 "output_tokens_details", "reasoning_tokens", (json_int_t)0,
			 "total_tokens", (json_int_t)x->prompt_tokens + completion);
}

/* The output_text part of text (consumed). */
static json_t *resp_part_json(json_t *text)
{
	return json_pack("{s:s, s:o, s:[], s:[]}", "type", "output_text", "text", text,
			 "annotations", "logprobs");
}

/* The assistant's message item; content (consumed): [] or [part]. */
static json_t *resp_item_json(const struct http_exchange *x, const char *status,
			      json_t *content)
{
	char id[KVD_PUBLIC_ID_MAX];

	resp_msg_id(x, id, sizeof(id));
	return json_pack("{s:s, s:s, s:s, s:s, s:o}", "type", "message", "id", id,
			 "status", status, "role", "assistant", "content", content);
}

/* The message item of the whole text, or NULL. */
static json_t *resp_item_done(struct http_conn *hc, const char *status)
{
	json_t *t = x_nomem(hc) ? NULL : json_text(hc->x.text, hc->x.len);

	return t ? resp_item_json(&hc->x, status, json_pack("[o]", resp_part_json(t))) : NULL;
}

/* The response object, `status` in_progress, completed, incomplete or
 * failed; output, usage and error consumed ([] or [item]; null or the
 * usage; null or {code, message}). "store" is false: kvd keeps nothing. */
static json_t *resp_json(const struct http_exchange *x, const char *status,
			 json_t *output, json_t *usage, json_t *error)
{
	bool cut = !strcmp(status, "incomplete");

	return json_pack("{s:s, s:s, s:I, s:s, s:b, s:o, s:o, s:n, s:o, s:s, s:o, s:b, s:n,"
			 " s:{s:n, s:n}, s:b, s:f, s:f, s:{s:{s:s}}, s:s, s:[], s:s, s:o, s:{}, s:I}",
			 "id", x->id, "object", "response", "created_at", (json_int_t)x->created,
			 "status", status, "background", 0, "error", error,
			 "incomplete_details", cut ? json_pack("{s:s}", "reason", "max_output_tokens")
						   : json_null(),
			 "instructions",
			 "max_output_tokens", x->max_tokens ? json_integer(x->max_tokens)
							    : json_null(),
			 "model", x->model, "output", output, "parallel_tool_calls", 0,
			 "previous_response_id", "reasoning", "effort", "summary",
			 "store", 0, "temperature", (double)x->temperature,
			 "top_p", (double)x->top_p, "text", "format", "type", "text",
			 "tool_choice", "none", "tools", "truncation", "disabled",
			 "usage", usage, "metadata", "seed", (json_int_t)x->seed);
}

/* One event: {type, sequence_number} and j's fields (j consumed). */
static int resp_event(struct http_conn *hc, const char *type, json_t *j)
{
	json_t *e = j ? json_pack("{s:s, s:I}", "type", type, "sequence_number",
				  (json_int_t)hc->x.seq++) : NULL;

	if (e && json_object_update(e, j)) {
		json_decref(e);
		e = NULL;
	}
	json_decref(j);
	return sse_event(hc, type, e);
}

/* The event of the item's part: {item_id, output_index, content_index}
 * and `key`: val (consumed). */
static int resp_part_event(struct http_conn *hc, const char *type,
			   const char *key, json_t *val)
{
	char id[KVD_PUBLIC_ID_MAX];
	json_t *j;

	resp_msg_id(&hc->x, id, sizeof(id));
	j = json_pack("{s:s, s:i, s:i, s:o}", "item_id", id, "output_index", 0,
		      "content_index", 0, key, val);
	if (j && strcmp(key, "part") && json_object_set_new(j, "logprobs", json_array())) {
		json_decref(j);
		j = NULL;
	}
	return resp_event(hc, type, j);
}

/* The head and the opening events, once. */
static int resp_open(struct http_conn *hc)
{
	struct http_exchange *x = &hc->x;

	if (x->head_sent)
		return 0;
	stream_head(hc);
	if (resp_event(hc, "response.created", json_pack("{s:o}", "response",
		resp_json(x, "in_progress", json_array(), json_null(), json_null()))) ||
	    resp_event(hc, "response.in_progress", json_pack("{s:o}", "response",
		resp_json(x, "in_progress", json_array(), json_null(), json_null()))) ||
	    resp_event(hc, "response.output_item.added", json_pack("{s:i, s:o}",
		"output_index", 0, "item", resp_item_json(x, "in_progress", json_array()))) ||
	    resp_part_event(hc, "response.content_part.added", "part",
			    resp_part_json(json_string(""))))
		return -ENOMEM;
	return 0;
}

/* api_shape.text: text[sent, n) as one delta; the text stays. */
static int resp_text(struct http_conn *hc, size_t n, bool all)
{
	struct http_exchange *x = &hc->x;
	json_t *d;

	(void)all;   /* the Responses API carries no logprobs here */
	if (n <= x->sent)
		return 0;
	if (resp_open(hc))
		return -ENOMEM;
	d = x_nomem(hc) ? NULL : json_text(x->text + x->sent, n - x->sent);
	if (!d || resp_part_event(hc, "response.output_text.delta", "delta", d))
		return -ENOMEM;
	x->sent = n;
	return 0;
}

static int resp_stream_end(struct http_conn *hc, const char *status,
			   uint32_t completion)
{
	struct http_exchange *x = &hc->x;
	json_t *t;

	if (resp_open(hc) || resp_text(hc, x->len, true))
		return -ENOMEM;
	t = x_nomem(hc) ? NULL : json_text(x->text, x->len);
	if (!t || resp_part_event(hc, "response.output_text.done", "text", json_incref(t)) ||
	    resp_part_event(hc, "response.content_part.done", "part",
			    resp_part_json(json_incref(t))) ||
	    resp_event(hc, "response.output_item.done", json_pack("{s:i, s:o}",
		"output_index", 0, "item", resp_item_done(hc, status))) ||
	    resp_event(hc, strcmp(status, "completed") ? "response.incomplete"
						       : "response.completed",
		json_pack("{s:o}", "response", resp_json(x, status,
			json_pack("[o]", resp_item_done(hc, status)),
			resp_usage_json(x, completion), json_null())))) {
		json_decref(t);
		return -ENOMEM;
	}
	json_decref(t);
	http__chunk(hc, "", 0);
	return 0;
}

static int resp_answer(struct http_conn *hc, const char *status,
		       uint32_t completion)
{
	struct http_exchange *x = &hc->x;
	json_t *item = resp_item_done(hc, status);
	json_t *j = item ? resp_json(x, status, json_pack("[o]", item),
				     resp_usage_json(x, completion), json_null()) : NULL;

	return respond_whole(hc, j);
}

/* api_shape.final: "length" is status incomplete (max_output_tokens). */
static void resp_final(struct http_conn *hc, const char *finish,
		       uint32_t completion)
{
	struct http_exchange *x = &hc->x;
	const char *status = strcmp(finish, "length") ? "completed" : "incomplete";

	if (x->r)   /* a stop string ended it before its final */
		x->cached_tokens = x->r->cached_tokens;
	if (x->stream ? resp_stream_end(hc, status, completion)
		      : resp_answer(hc, status, completion)) {
		exchange_fail(hc, completion);
		return;
	}
	exchange_end(hc, 200, completion, finish);
}

static void resp_stream_error(struct http_conn *hc, const char *type,
			      const char *code, const char *msg)
{
	(void)type;
	(void)resp_event(hc, "error", json_pack("{s:s?, s:s, s:n}", "code", code,
						"message", msg, "param"));
	(void)resp_event(hc, "response.failed", json_pack("{s:o}", "response",
		resp_json(&hc->x, "failed", json_array(), json_null(),
			  json_pack("{s:s, s:s}", "code", code ? code : "server_error",
				    "message", msg))));
	http__chunk(hc, "", 0);
}

/* Made on the stack: nothing to allocate here. */
static void resp_nomem_tail(struct http_conn *hc)
{
	char ev[256];
	int n = snprintf(ev, sizeof(ev), "event: error\ndata: {\"type\":\"error\",\"sequence_number\":%u,\"code\":\"internal_error\",\"message\":\"out of memory while answering\",\"param\":null}\n\n",
			 hc->x.seq++);

	http__chunk(hc, ev, (size_t)n);
	http__chunk(hc, "", 0);
}

enum { API_CMPL, API_CHAT, API_RESP };

static const struct api_shape api_shapes[] = {
	[API_CMPL] = { "cmpl-", OPENAI_EP_COMPLETIONS, false, "prompt", stream_text,
		       answer_final, oa_stream_error, oa_nomem_tail },
	[API_CHAT] = { "chatcmpl-", OPENAI_EP_CHAT, true, "messages", stream_text,
		       answer_final, oa_stream_error, oa_nomem_tail },
	[API_RESP] = { "resp_", OPENAI_EP_RESPONSES, true, "input", resp_text,
		       resp_final, resp_stream_error, resp_nomem_tail },
};

/* ---- the exchange as a sink (sink.c calls these) ------------------------------------ */

static struct http_conn *conn_of(struct serve_sink *k)
{
	return kvd_container_of(k, struct http_conn, sink);
}

/* New text: hold back what may start a stop string or a UTF-8 sequence;
 * true when a stop string matched (the answer is then complete). */
static bool exchange_text(struct http_conn *hc, const char *p, size_t n,
			  uint32_t completion)
{
	struct http_exchange *x = &hc->x;
	size_t from = x->len > longest_stop(x) ? x->len - longest_stop(x) : 0;
	long at;

	if (n && text_add(hc, p, n)) {
		exchange_fail(hc, completion);   /* the text is lost: say so */
		return true;
	}
	at = x->n_stop ? stop_find(x, from) : -1;
	if (at >= 0) {
		x->len = (size_t)at;
		lp_cut(x, x->base + x->len);
		x->cached_tokens = x->r->cached_tokens;
		exchange_cancel(x, x->r);
		x->r = NULL;
		x->shape->final(hc, "stop", completion);
		return true;
	}
	if (x->stream && stream_ready(hc, false)) {
		exchange_fail(hc, completion);
		return true;
	}
	return false;
}

static void api_sink_token(struct serve_sink *k, struct serve_req *r,
			   uint32_t index, int32_t token, const char *piece,
			   size_t len, const struct sampler_logprobs *lp)
{
	struct http_conn *hc = conn_of(k);

	if (!choice_of(&hc->x, r))
		return;   /* answered already (a stop string) */
	if (hc->x.tool_fmt != CHAT_NONE && token == hc->x.tool_token) {
		/* its mark, not its text: no piece spells it, so only the
		 * token drawn opens calls (the lazy grammar's lead), and no
		 * stop string matches it */
		static const char mark[] = { OPENAI_CALLS_MARK };

		piece = mark;
		len = sizeof(mark);
	}
	if (hc->x.lp_on && lp && lp_add(hc, token, lp, len)) {
		exchange_fail(hc, index + 1);
		return;
	}
	exchange_text(hc, piece, len, index + 1);
}

static void api_sink_final(struct serve_sink *k, struct serve_req *r,
			   const struct serve_final_info *f)
{
	struct http_conn *hc = conn_of(k);

	if (!choice_of(&hc->x, r))
		return;
	if (exchange_text(hc, f->text, f->text_len, f->output_tokens))
		return;
	hc->x.r = NULL;
	hc->x.cached_tokens = f->cached_tokens;
	hc->x.shape->final(hc, f->reason, f->output_tokens);
}

static void api_sink_error(struct serve_sink *k, struct serve_req *r, int code,
			   const char *msg)
{
	struct http_conn *hc = conn_of(k);
	struct http_exchange *x = &hc->x;
	const char *type, *ecode;
	int status;
	size_t len;
	char *body;

	if (!choice_of(x, r))
		return;
	x->r = NULL;   /* n > 1: the others are cancelled at the end */
	err_map(code, &status, &type, &ecode);
	if (!x->head_sent) {
		body = http__error_json(msg, type, ecode, NULL, &len);
		if (body)
			http__respond(hc, status, "application/json", body, len);
		else
			http__respond(hc, 500, "application/json", "{}", 2);
		free(body);
	} else {
		/* mid-stream: the status is gone; the shape's error events */
		x->shape->stream_error(hc, type, ecode, msg);
	}
	exchange_end(hc, status, r->n_out, proto_err_name(code));
}

static void api_sink_detached(struct serve_sink *k, struct serve_req *r)
{
	struct http_conn *hc = conn_of(k);
	struct http_exchange *x = &hc->x;

	for (uint32_t i = 0; i < x->n_cancel; i++)
		if (x->cancel[i] == r) {   /* it ended before the kick */
			x->cancel[i] = x->cancel[--x->n_cancel];
			break;
		}
	if (x->r == r)
		x->r = NULL;
	for (uint32_t i = 0; x->choices && i < x->n_choices; i++)
		if (i != x->cur && x->choices[i].r == r)
			x->choices[i].r = NULL;
}

static const struct serve_sink_ops api_sink_ops = {
	.token = api_sink_token,
	.final = api_sink_final,
	.error = api_sink_error,
	.detached = api_sink_detached,
};

/* ---- keys ---------------------------------------------------------------------- */

/* ---- chat: messages -> prompt ids ---------------------------------------------------- */

/* The request's tools and its messages' calls as chat.h takes them:
 * views into q (the arrays are the view's: api_tools_free). tools only
 * when the model may call (tool_choice "none" renders none). */
struct api_tools {
	struct chat_tools tt;
	struct chat_tool *tools;         /* (n_tools) */
	const struct chat_call **calls;  /* (n_msgs) */
	size_t *n_calls;                 /* (n_msgs) */
	struct chat_call *flat;          /* every call, in order */
	const char **result_ids;         /* (n_msgs) */
};

static void api_tools_free(struct api_tools *v)
{
	free(v->tools);
	free(v->calls);
	free(v->n_calls);
	free(v->flat);
	free(v->result_ids);
}

static int api_tools_of(const struct openai_req *q, struct api_tools *v)
{
	size_t n_tools = openai_req_calls(q) ? q->n_tools : 0, total = 0, k = 0;

	memset(v, 0, sizeof(*v));
	for (size_t i = 0; i < q->n_msgs; i++)
		total += q->msgs[i].n_calls;
	v->tools = calloc(n_tools ? n_tools : 1, sizeof(*v->tools));
	v->calls = calloc(q->n_msgs, sizeof(*v->calls));
	v->n_calls = calloc(q->n_msgs, sizeof(*v->n_calls));
	v->flat = calloc(total ? total : 1, sizeof(*v->flat));
	v->result_ids = calloc(q->n_msgs, sizeof(*v->result_ids));
	if (!v->tools || !v->calls || !v->n_calls || !v->flat || !v->result_ids)
		return -ENOMEM;
	for (size_t t = 0; t < n_tools; t++)
		v->tools[t] = (struct chat_tool){ q->tools[t].json, q->tools[t].json_indent,
						  q->tools[t].function_json };
	for (size_t i = 0; i < q->n_msgs; i++) {
		v->calls[i] = q->msgs[i].n_calls ? &v->flat[k] : NULL;
		v->n_calls[i] = q->msgs[i].n_calls;
		v->result_ids[i] = q->msgs[i].tool_call_id;
		for (size_t c = 0; c < q->msgs[i].n_calls; c++)
			v->flat[k++] = (struct chat_call){ q->msgs[i].calls[c].name,
							   q->msgs[i].calls[c].arguments,
							   q->msgs[i].calls[c].id };
	}
	v->tt = (struct chat_tools){ v->tools, n_tools, v->calls, v->n_calls,
				     v->result_ids };
	return 0;
}

/* A chat_encode error as the answer's code and param (a tool's forged
 * control token names tools). */
static void api_chat_refusal(int rc, enum chat_format fmt, const char **code,
			     const char **param, char *msg, size_t msg_size)
{
	/* -EINVAL (turns), -EPERM (a forged control token), -E2BIG:
	 * chat.c's sentence; anything else is the tokenizer's */
	*code = rc == -EPERM ? "forged_control_token" :
		rc == -E2BIG ? "prompt_too_large" : "invalid_messages";
	if (rc == -EPERM && !strncmp(msg, "tool ", 5))
		*param = "tools";
	if (!msg[0])
		snprintf(msg, msg_size, "the messages cannot be rendered in the %s chat format",
			 chat_format_name(fmt));
}

/* The chat request's prompt: its messages rendered in the model's chat
 * format (gpu/text/chat.h, resolved at boot: model.chat_template or the GGUF's
 * tokenizer.chat_template recognized) and tokenized with the template's
 * specials as control tokens. OpenAI's `developer` role is its newer
 * name for `system`. Never a guessed template: a model without one is a
 * 400 naming model.chat_template; tools for a format without a tool
 * syntax are a 400 naming tools. 0 with *out (malloc'd, *n ids), 1 with
 * *status, *code, *param and `msg` set, -ENOMEM. */
static int api_chat_ids(enum chat_format fmt, const struct tokenizer *tok,
			const char *model_name, const struct openai_req *q,
			int32_t **out, uint32_t *n, int *status,
			const char **code, const char **param, char *msg,
			size_t msg_size)
{
	struct chat_msg *cm;
	struct api_tools tv;
	int32_t *ids = NULL;
	size_t n_ids = 0;
	int rc;

	*status = 400;
	*code = NULL;
	*param = "messages";
	if (fmt == CHAT_NONE) {
		*code = "no_chat_template";
		snprintf(msg, msg_size, "the model '%.64s' has no chat template kvd recognizes; set model.chat_template in the config (llama2, llama3, chatml, mistral, gemma, phi3, deepseek, mistral_v3) or use /v1/completions",
			 model_name);
		return 1;
	}
	if (q->n_tools && !chat_format_tools(fmt)) {
		*code = "unsupported_parameter";
		*param = "tools";
		snprintf(msg, msg_size, "the model's chat format (%s) has no tool syntax: tools are served for llama3 (Llama 3.1), chatml (Qwen2.5, Hermes) and mistral_v3 (Mistral 7B Instruct v0.3)",
			 chat_format_name(fmt));
		return 1;
	}
	cm = calloc(q->n_msgs ? q->n_msgs : 1, sizeof(*cm));
	if (!cm || api_tools_of(q, &tv)) {
		free(cm);
		api_tools_free(&tv);
		return -ENOMEM;
	}
	for (size_t i = 0; i < q->n_msgs; i++) {
		cm[i].role = strcmp(q->msgs[i].role, "developer") ? q->msgs[i].role
								   : "system";
		cm[i].content = q->msgs[i].content;
	}
	msg[0] = 0;
	rc = chat_encode_tools(fmt, tok, cm, q->n_msgs, &tv.tt, true, &ids,
			       &n_ids, msg, msg_size);
	free(cm);
	api_tools_free(&tv);
	if (rc == -ENOMEM)
		return -ENOMEM;
	if (rc) {
		api_chat_refusal(rc, fmt, code, param, msg, msg_size);
		return 1;
	}
	if (n_ids == 0 || n_ids > PROTO_CLIENT_TOKENS_MAX) {
		free(ids);
		snprintf(msg, msg_size, "the messages render to %zu tokens (at most %u)",
			 n_ids, (unsigned)PROTO_CLIENT_TOKENS_MAX);
		return 1;
	}
	*out = ids;
	*n = (uint32_t)n_ids;
	return 0;
}

/* ---- ids --------------------------------------------------------------------------- */

/* The id an exchange's answers carry, and the one `kvctl abort` takes:
 * OpenAI's prefix and 128 bits from libsodium's CSPRNG in hex. Unique
 * across nodes and restarts without coordination, and it says nothing
 * of how many requests the node (or any other tenant) has made - the
 * exchange number it replaces did. */
static void api_public_id(char *out, size_t size, const char *prefix)
{
	unsigned char rnd[16];
	char hex[2 * sizeof(rnd) + 1];

	randombytes_buf(rnd, sizeof(rnd));
	sodium_bin2hex(hex, sizeof(hex), rnd, sizeof(rnd));
	snprintf(out, size, "%s%s", prefix, hex);
}

/* ---- endpoints ------------------------------------------------------------------- */

/* Why the node takes no new work now, NULL when it does: the one
 * readiness decision (/health, /readyz), on every role. Not ready while
 * it starts, drains (kvctl drain: at once, while what it holds is still
 * served) or stops, when the capacity check failed under
 * capacity_policy=refuse, while a fingerprint taken from the cache is
 * still being hashed in full (daemon/node/fpcheck.h: the node serves
 * meanwhile, but a load balancer or a rolling restart should not count
 * on a model identity not yet proved), and on decode while no
 * authenticated prefill link is up (a local engine - prefill,
 * standalone - needs none). */
static const char *api_unready(const struct serve *s)
{
	const struct kvd_daemon *d = s->d;
	struct kvd_list *e;

	if (d->state == KVD_STATE_DRAINING || d->state == KVD_STATE_DRAINED ||
	    kvd_request_gate(s->reqtab))
		return "draining";
	if (d->state == KVD_STATE_STOPPING || s->stopping)
		return "stopping";
	if (d->state != KVD_STATE_READY)
		return "starting";
	if (!d->cap.ok && d->cfg.capacity_policy == KVD_CAP_REFUSE)
		return "capacity";
	if (d->fpcheck)
		return "verifying: the model's cached fingerprint is being hashed in full";
	if (d->cfg.role != KVD_ROLE_DECODE)
		return NULL;
	kvd_list_for_each(e, &s->links) {
		struct link *l = kvd_list_entry(e, struct link, node);

		if (l->side == LINK_DIAL && link_takes_requests(l))
			return NULL;
	}
	return "unpaired: no authenticated prefill peer is up";
}

/* GET /health (kvd's first probe, kept as it was) and GET /readyz:
 * 200 when the node takes new work, else 503 saying why. Keyless:
 * probes carry no key. */
static void api_ready_answer(struct http_conn *hc, const char *ok_status)
{
	const char *why = api_unready(hc->s);
	json_t *j;

	j = why ? json_pack("{s:s, s:s}", "status", "unavailable", "reason", why)
		: json_pack("{s:s, s:s}", "status", ok_status,
			    "role", kvd_role_name(hc->s->d->cfg.role));
	http__respond_json(hc, why ? 503 : 200, j);
	http__exchange_done(hc);
}

static void api_health(struct http_conn *hc, const struct http_msg *m)
{
	(void)m;
	api_ready_answer(hc, "ok");
}

static void api_readyz(struct http_conn *hc, const struct http_msg *m)
{
	(void)m;
	api_ready_answer(hc, "ready");
}

/* GET /livez: the loop answers, so the process lives - whatever its
 * readiness (a draining node is alive; restarting it would drop what it
 * still serves). */
static void api_livez(struct http_conn *hc, const struct http_msg *m)
{
	(void)m;
	http__respond_json(hc, 200, json_pack("{s:s}", "status", "alive"));
	http__exchange_done(hc);
}

/* OpenAI's model object. */
static json_t *api_model_json(const struct http_server *hs)
{
	return json_pack("{s:s, s:s, s:I, s:s}", "id", hs->model_name, "object",
			 "model", "created", (json_int_t)0, "owned_by", "kvd");
}

static void api_models(struct http_conn *hc, const struct http_msg *m)
{
	const char *tenant = http__auth(hc, m);

	if (!tenant)
		return;
	http__respond_json(hc, 200, json_pack("{s:s, s:[o]}", "object", "list", "data",
					api_model_json(hc->hs)));
	http__log(hc, 200, tenant, "models");
	http__exchange_done(hc);
}

static int api_hex(char c)
{
	return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 :
	       c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* p[0, n) percent-decoded into out[size] (NUL-ended): its length, or -1
 * for a bad escape, a NUL, or no room. */
static long api_pct_decode(const char *p, size_t n, char *out, size_t size)
{
	size_t o = 0;

	for (size_t i = 0; i < n; i++) {
		int v = (unsigned char)p[i];

		if (v == '%') {
			if (i + 2 >= n || api_hex(p[i + 1]) < 0 || api_hex(p[i + 2]) < 0)
				return -1;
			v = api_hex(p[i + 1]) * 16 + api_hex(p[i + 2]);
			i += 2;
		}
		if (!v || o + 1 >= size)
			return -1;
		out[o++] = (char)v;
	}
	out[o] = 0;
	return (long)o;
}

/* Valid UTF-8 without control characters: safe to echo in a message. */
static bool api_printable(const char *p, size_t n)
{
	for (size_t i = 0, k; i < n; i += k) {
		k = kvd_utf8_len(p + i, n - i);
		if (!k || (unsigned char)p[i] < 0x20 || p[i] == 0x7f)
			return false;
	}
	return true;
}

/* GET /v1/models/{id}: the model object when id (percent-decoded, so
 * "org%2Fname" names "org/name") is the model served, else OpenAI's 404
 * (code model_not_found). */
static void api_model_get(struct http_conn *hc, const struct http_msg *m)
{
	const char *tenant = http__auth(hc, m);
	const char *seg = m->path + strlen("/v1/models/");
	char id[HTTP_WIRE_PATH_MAX + 1], msg[PROTO_CLIENT_MSG_MAX];
	long n;

	if (!tenant)
		return;
	n = api_pct_decode(seg, strcspn(seg, "?"), id, sizeof(id));
	if (n > 0 && !strcmp(id, hc->hs->model_name)) {
		http__respond_json(hc, 200, api_model_json(hc->hs));
		http__log(hc, 200, tenant, "model");
		http__exchange_done(hc);
		return;
	}
	/* the id is echoed only when it is printable UTF-8 (error_json
	 * escapes it; a bad byte would break the JSON) */
	if (n > 0 && n <= 64 && api_printable(id, (size_t)n))
		snprintf(msg, sizeof(msg), "The model '%s' does not exist; this server serves '%.64s'.",
			 id, hc->hs->model_name);
	else
		snprintf(msg, sizeof(msg), "The model does not exist; this server serves '%.64s'.",
			 hc->hs->model_name);
	http__error(hc, 404, "invalid_request_error", "model_not_found", "model", msg,
		  tenant);
}

/* GET /metrics: the Prometheus text (daemon/node/metrics.h), which names
 * every tenant's series: with http.api_keys_file a scrape carries an
 * admin key (role `admin`; Prometheus: `authorization: {credentials:
 * KEY}`), a tenant's key gets 403; without keys (HTTP is then loopback
 * only) it is open. Logged at debug: scrapes are periodic. */
static void api_metrics(struct http_conn *hc, const struct http_msg *m)
{
	const struct kvd_apikey_info *k = http__auth_key(hc, m);
	const char *tenant = k ? k->tenant : NULL;
	char *text = NULL;
	size_t len = 0;

	if (!tenant)
		return;
	if (hc->s->keys && !k->admin) {
		http__error(hc, 403, "invalid_request_error", "forbidden", NULL,
			  "/metrics needs an admin key (role `admin` in http.api_keys_file)",
			  tenant);
		return;
	}
	if (kvd_metrics_render(hc->s->d, &text, &len)) {
		http__error(hc, 500, "server_error", NULL, NULL, "out of memory", tenant);
		return;
	}
	http__respond(hc, 200, "text/plain; version=0.0.4; charset=utf-8", text, len);
	free(text);
	KVLOG_DEBUG(hc->s->log, "http_request",
		    "conn=%llu tenant=%s method=GET path=/metrics status=200 bytes=%zu",
		    (unsigned long long)hc->conn_id, KVLOG_Q(tenant), len);
	http__exchange_done(hc);
}

/* ---- a generation: prepared off the loop, then admitted ---------------------------------- */

/* One generation request while its body is prepared on a worker
 * (daemon/front/prep.h): the JSON parsed, the model named checked, the prompt
 * rendered and tokenized - the work that grows with the body. The loop
 * then answers the first refusal in the gate's order or admits it. */
struct api_prep {
	struct prep_job job;             /* key: the tenant */
	struct http_conn *hc;            /* NULL once its connection closed */
	struct serve *s;                 /* outlives the pool */
	const struct api_shape *shape;   /* the endpoint's row (api_shapes) */
	uint64_t t_start_ns;
	char tenant[KVD_TENANT_MAX];
	struct kvd_tenant_limits lim;    /* its key's limits */
	char method[16];
	char path[64];
	char *body;                      /* (len) a copy of the request's */
	size_t len;
	/* read by the worker; the tokenizer lives until prep_stop (serve.c
	 * stops the pool before the tokenizer goes) */
	const struct tokenizer *tok;
	enum chat_format fmt;
	bool parse_special;              /* http.parse_special (completions) */
	const struct jgram_vocab *jvocab;   /* as tok; NULL: json refused */
	uint32_t max_n;                  /* http.max_n (at least 1) */
	char model_name[128];            /* http_server.model_name's copy */
	/* what the worker found */
	int parse_rc;                    /* openai_req_parse's */
	struct openai_req q;             /* parse_rc 0: deinit at the end */
	struct openai_error oe;
	bool wrong_model;
	int prompt_rc;                   /* 0, 1 (status/code/msg), -ENOMEM */
	int status;
	const char *code;
	const char *param;               /* chat: "messages" or "tools" */
	int32_t *ids;                    /* (n_ids), handed to the request */
	uint32_t n_ids;
	/* q.gram's runs, one per choice (api_prep_runs), each handed to its
	 * choice's request */
	struct jgram_run *jruns[HTTP_N_MAX];
	uint32_t n_jruns;
	int jrun_rc;                     /* jgram_run_new's */
	char msg[PROTO_CLIENT_MSG_MAX];
};

/* The connection closes while its body is prepared: the job finishes or
 * is dropped, and frees itself (api_prep_done); it answers nobody. */
static void api_prep_detach(struct api_prep *ap)
{
	ap->hc = NULL;
	prep_cancel(&ap->job);
}

static void api_prep_free(struct api_prep *ap)
{
	free(ap->body);
	free(ap->ids);
	for (uint32_t i = 0; i < ap->n_jruns; i++)
		jgram_run_free(ap->jruns[i]);
	if (ap->parse_rc == 0)
		openai_req_deinit(&ap->q);
	free(ap);
}

/* A logit_bias id outside the vocabulary is the body's 400 (the ids are
 * sorted: the last is the largest). true when so (q released). */
static bool api_bias_outside(struct api_prep *ap)
{
	uint32_t n_vocab = tokenizer_n_vocab(ap->tok);

	if (!ap->q.n_bias || ap->q.bias[ap->q.n_bias - 1].id < n_vocab)
		return false;
	openai_error_set(&ap->oe, 400, "invalid_request_error", NULL, "logit_bias",
			 "'logit_bias' names token %u; the vocabulary has %u tokens",
			 ap->q.bias[ap->q.n_bias - 1].id, n_vocab);
	openai_req_deinit(&ap->q);
	ap->parse_rc = OPENAI_E_INVALID;
	return true;
}

/* The id of the control token that opens fmt's calls (mistral_v3's
 * [TOOL_CALLS]), or -1 when its calls are text or the vocabulary lacks
 * it as one control token (then they stay text: chat_format_check
 * refuses such a vocabulary at boot unless model.chat_template_unsafe). */
static int32_t api_calls_token(const struct tokenizer *tok, enum chat_format fmt)
{
	const char *t = openai_calls_token(fmt);
	int32_t *ids = NULL, id = -1;
	size_t n = 0;

	if (t && !tokenizer_encode_ex(tok, t, strlen(t), TOKENIZER_PARSE_SPECIAL, &ids, &n) &&
	    n == 1 && tokenizer_token_type(tok, ids[0]) == TOKEN_TYPE_CONTROL)
		id = ids[0];
	free(ids);
	return id;
}

/* tool_choice "required" or a named function (or "auto" with strict
 * tools: the same grammar, lazy): the call grammar of the
 * model's format becomes q.gram (sampled like response_format's). A
 * request it cannot serve is the body's 400. true when so (q released). */
static bool api_tools_refused(struct api_prep *ap)
{
	int rc = openai_tools_grammar(&ap->q, ap->fmt, &ap->oe);

	if (!rc)
		return false;
	openai_req_deinit(&ap->q);
	ap->parse_rc = rc;
	return true;
}

/* The grammar's runs: one per choice (n > 1: each choice samples under
 * it on its own, from the start), made here, so a run that cannot be
 * made refuses the whole request (api_json_refused) before any choice
 * exists. None past http.max_n (refused: api_n_refused). Every kind of
 * request grammar (response_format, a forced tool call) gets its runs
 * here, the same way. */
static int api_prep_runs(struct api_prep *ap)
{
	uint32_t n = ap->q.n > 1 ? ap->q.n : 1;
	int rc;

	if (n > ap->max_n)
		return 0;
	if (!ap->jvocab)
		return -ENOMEM;
	for (; ap->n_jruns < n; ap->n_jruns++)
		if ((rc = jgram_run_new(&ap->jruns[ap->n_jruns], ap->q.gram, ap->jvocab)))
			return rc;
	return 0;
}

/* Worker thread: touches only ap, the tokenizer and the model name. */
static void api_prep_run(struct prep_job *j)
{
	struct api_prep *ap = kvd_container_of(j, struct api_prep, job);
	const struct openai_req *q = &ap->q;

	ap->parse_rc = openai_req_parse_ep(&ap->q, ap->shape->ep, ap->body, ap->len,
					   &ap->oe);
	free(ap->body);
	ap->body = NULL;
	if (!ap->parse_rc && api_bias_outside(ap))
		return;
	if (ap->parse_rc)
		return;
	if (q->model[0] && strcmp(q->model, ap->model_name)) {
		ap->wrong_model = true;
		return;
	}
	if (ap->shape->chat && api_tools_refused(ap))
		return;
	if (q->gram)
		ap->jrun_rc = api_prep_runs(ap);
	ap->status = 400;
	if (ap->shape->chat)
		ap->prompt_rc = api_chat_ids(ap->fmt, ap->tok, ap->model_name, q,
					     &ap->ids, &ap->n_ids, &ap->status,
					     &ap->code, &ap->param, ap->msg,
					     sizeof(ap->msg));
	else
		ap->prompt_rc = serve__sink_prompt_ids(ap->tok, q->tokens, q->n_tokens,
						       q->prompt,
						       q->prompt ? strlen(q->prompt) : 0,
						       ap->parse_special, &ap->ids, &ap->n_ids, ap->msg,
						       sizeof(ap->msg));
}

/* response_format json: its run not made (no memory, or no vocabulary
 * trie) is a 500. true when refused. (A decode node draws the first
 * token itself: daemon/node/decode.c dreq_recompute.) */
static bool api_json_refused(struct http_conn *hc, struct api_prep *ap)
{
	struct serve *s = hc->s;

	if (!ap->q.gram)
		return false;
	if (!ap->jrun_rc)
		return false;
	s->d->counters.rejected[KVD_REJECT_INVALID]++;
	/* -ENOENT: the call grammar's lead token (mistral_v3's [TOOL_CALLS])
	 * is not one control token of this vocabulary (a template served
	 * with model.chat_template_unsafe) */
	http__error(hc, 500, "server_error", NULL, NULL,
		    ap->jrun_rc == -ENOENT ? "the model's vocabulary has no control token for its call syntax"
					   : "out of memory", ap->tenant);
	return true;
}

/* n past http.max_n is the body's 400. true when refused. */
static bool api_n_refused(struct http_conn *hc, struct api_prep *ap)
{
	struct serve *s = hc->s;
	char msg[160];

	if (ap->q.n <= ap->max_n)
		return false;
	s->d->counters.rejected[KVD_REJECT_INVALID]++;
	snprintf(msg, sizeof(msg), "'n' is %u; this server answers at most %u choices (http.max_n)",
		 ap->q.n, ap->max_n);
	http__error(hc, 400, "invalid_request_error", NULL, "n", msg, ap->tenant);
	return true;
}

/* Tokens of logprobs each of q's choices may hold: HTTP_LP_HELD_MAX is
 * the exchange's, over its n choices. */
static uint32_t api_lp_cap(const struct openai_req *q)
{
	return HTTP_LP_HELD_MAX / (q->n > 1 ? q->n : 1);
}

/* A non-streamed answer with logprobs holds them all until it is sent:
 * its max_tokens x n is bounded by HTTP_LP_HELD_MAX (a larger one asked
 * for is the body's 400; a default is clamped: api_lp_clamp). true when
 * refused. */
static bool api_lp_refused(struct http_conn *hc, struct api_prep *ap)
{
	char msg[200];

	if (!ap->q.logprobs || ap->q.stream || ap->q.max_tokens <= api_lp_cap(&ap->q))
		return false;
	snprintf(msg, sizeof(msg), "a non-streamed answer with logprobs holds at most %u tokens over its choices (max_tokens %u, n %u): stream it, or ask for fewer",
		 HTTP_LP_HELD_MAX, ap->q.max_tokens, ap->q.n > 1 ? ap->q.n : 1);
	hc->s->d->counters.rejected[KVD_REJECT_INVALID]++;
	http__error(hc, 400, "invalid_request_error", NULL, "max_tokens", msg, ap->tenant);
	return true;
}

/* The gate after the body: its JSON (400), the model (404), draining
 * (503), the prompt (400). true when one refused (answered). */
static bool api_prep_refused(struct http_conn *hc, struct api_prep *ap)
{
	struct serve *s = hc->s;
	const char *tenant = ap->tenant;
	char msg[PROTO_CLIENT_MSG_MAX];

	if (ap->parse_rc) {
		s->d->counters.rejected[KVD_REJECT_INVALID]++;
		if (ap->parse_rc < 0)
			http__error(hc, 500, "server_error", NULL, NULL, "out of memory", tenant);
		else
			http__error(hc, ap->oe.status, ap->oe.type, ap->oe.code,
				  ap->oe.param, ap->oe.msg, tenant);
		return true;
	}
	if (ap->wrong_model) {
		snprintf(msg, sizeof(msg), "The model '%.64s' does not exist; this server serves '%.64s'.",
			 ap->q.model, hc->hs->model_name);
		http__error(hc, 404, "invalid_request_error", "model_not_found", "model",
			  msg, tenant);
		return true;
	}
	if (kvd_request_gate(s->reqtab) || s->stopping) {
		s->d->counters.rejected[KVD_REJECT_DRAINING]++;
		http__error(hc, 503, "server_error", "draining", NULL,
			  "the node is draining and admits no new requests", tenant);
		return true;
	}
	if (ap->prompt_rc) {
		bool nomem = ap->prompt_rc < 0;

		s->d->counters.rejected[KVD_REJECT_INVALID]++;
		http__error(hc, nomem ? 500 : ap->shape->chat ? ap->status : 400,
			  nomem ? "server_error" : "invalid_request_error",
			  nomem || !ap->shape->chat ? NULL : ap->code,
			  nomem ? NULL : ap->shape->chat ? ap->param : ap->shape->prompt_param,
			  nomem ? "out of memory" : ap->msg, tenant);
		return true;
	}
	return api_lp_refused(hc, ap) || api_json_refused(hc, ap) ||
	       api_n_refused(hc, ap);
}

/* max_tokens when the request gives none: the rest of the context - what
 * OpenAI's, vLLM's and llama-server's clients expect (generate to EOS) -
 * bounded by what any path admits: the role's limit now
 * (serve__gate_path_limit) and the path's context (kvd_capacity
 * path_context: the smallest context and pool of this node and its up
 * peers, so whichever prefill peer decode picks - by load, not size -
 * holds it), then the tenant's max_tokens and http.default_max_tokens.
 * The request reserves pages for all of it at admission (no preemption:
 * the pool never overcommits), as llama-server's slot holds its whole
 * context: so such a request never fails admission for its default, it
 * waits in its tenant's queue for the pages. At least 1: a prompt that
 * fills the context alone is the role's prompt_too_long. */
static uint32_t api_default_max_tokens(struct serve *s,
				       const struct kvd_tenant_limits *lim,
				       uint32_t n_prompt)
{
	const struct kvd_config *c = &s->d->cfg;
	uint64_t limit = KVD_MIN(serve__gate_path_limit(s),
				 (uint64_t)s->d->cap.path_context);
	uint32_t tenant = lim->max_tokens ? lim->max_tokens : c->tenant_max_tokens;
	uint64_t n;

	if (tenant)
		limit = KVD_MIN(limit, (uint64_t)tenant);
	n = limit > n_prompt ? limit - n_prompt : 1;
	if (c->http_default_max_tokens)
		n = KVD_MIN(n, (uint64_t)c->http_default_max_tokens);
	return (uint32_t)KVD_MIN(n, (uint64_t)PROTO_CLIENT_MAX_TOKENS);
}

/* The default max_tokens of a non-streamed answer with logprobs stops at
 * what each choice may hold (api_lp_refused refused a larger one asked
 * for). */
static uint32_t api_lp_clamp(const struct openai_req *q, uint32_t max_tokens)
{
	return q->logprobs && !q->stream ? KVD_MIN(max_tokens, api_lp_cap(q)) : max_tokens;
}

/* The request's sampling: its own, with a seed drawn when it gave none
 * (from libsodium's CSPRNG, below 2^53 so a JavaScript client can send it
 * back exactly) - so identical sampled requests differ, and the answer
 * says which seed to send to repeat one (invariant 9 still holds: the
 * output is a function of the seed used). Greedy ignores the seed. */
static void api_req_params(struct http_conn *hc, struct api_prep *ap,
			   struct serve_req *r)
{
	const struct openai_req *q = &ap->q;
	uint64_t seed = q->seed;

	if (!q->has_seed) {
		/* below 2^53 for every choice's seed + i too */
		randombytes_buf(&seed, sizeof(seed));
		seed %= (UINT64_C(1) << 53) - HTTP_N_MAX;
	}
	hc->x.seed = seed;
	r->max_tokens = api_lp_clamp(q, q->max_tokens ? q->max_tokens
				      : api_default_max_tokens(hc->s, &ap->lim, ap->n_ids));
	r->sp = (struct sampler_params){ .temperature = q->temperature,
					 .top_k = q->top_k, .top_p = q->top_p,
					 .seed = seed,
					 .presence_penalty = q->presence_penalty,
					 .frequency_penalty = q->frequency_penalty,
					 .repetition_penalty = q->repetition_penalty,
					 .min_p = q->min_p,
					 .logprobs = q->logprobs,
					 .top_logprobs = (uint8_t)q->top_logprobs };
	/* the bias array moves to the request (freed with it) */
	r->bias = ap->q.bias;
	r->sp.logit_bias = r->bias;
	r->sp.n_logit_bias = q->n_bias;
	ap->q.bias = NULL;
	ap->q.n_bias = 0;
	hc->x.lp_on = q->logprobs;
}

/* The request's fields that were accepted and change nothing: one debug
 * line and one count each (the names are openai.h's, never the client's
 * bytes). */
static void api_ignored_note(struct http_conn *hc, const struct api_prep *ap)
{
	struct serve *s = hc->s;

	for (unsigned i = 0; i < OPENAI_IGNORED__N; i++) {
		if (!(ap->q.ignored & (1u << i)))
			continue;
		s->d->metrics.http_ignored[i]++;
		KVLOG_DEBUG(s->log, "http_ignored_field",
			    "conn=%llu tenant=%s field=%s",
			    (unsigned long long)hc->conn_id, KVLOG_Q(ap->tenant),
			    KVLOG_Q(openai_ignored_name(i)));
	}
}

/* The tools the answer's calls may name go to the exchange (their JSON,
 * rendered already, is freed; those tool_choice does not allow are
 * dropped: a call of one stays text); none when the model may not call
 * or its format has no call syntax. */
static void api_admit_tools(struct http_exchange *x, struct api_prep *ap)
{
	struct openai_req *q = &ap->q;
	size_t k = 0;

	if (!openai_req_calls(q) || !openai_calls_format(ap->fmt))
		return;
	x->tool_token = api_calls_token(ap->tok, ap->fmt);
	for (size_t i = 0; i < q->n_tools; i++) {
		free(q->tools[i].json);
		free(q->tools[i].json_indent);
		free(q->tools[i].function_json);
		json_decref(q->tools[i].parameters);
		q->tools[i].json = q->tools[i].json_indent = q->tools[i].function_json = NULL;
		q->tools[i].parameters = NULL;
		if (q->tools[i].allowed)
			q->tools[k++] = q->tools[i];
	}
	x->tool_fmt = ap->fmt;
	x->tools = q->tools;
	x->n_tools = k;
	q->tools = NULL;
	q->n_tools = 0;
}

/* Choice i (> 0) of an n > 1 request (serve__req_choice_new): a
 * request of its own with the first choice's prompt and parameters and
 * the seed + i (invariant 9: each choice is what a request with that
 * seed alone gets), the same tenant, cache_salt and public id (kvctl
 * abort of the id aborts one choice, whose error ends the others), the
 * role's kind, and with a grammar its own run of it (ap->jruns[i],
 * taken) and a reference to it (the request frees both, req.c,
 * whichever way it ends). NULL without memory (the run stays ap's). */
static struct serve_req *api_choice_req(struct http_conn *hc, struct api_prep *ap,
					const struct serve_req *first, uint32_t i)
{
	/* with a grammar, api_prep_runs made n runs */
	struct serve_req *r = x_nomem(hc) ? NULL
			      : serve__req_choice_new(first, i, ap->jruns[i]);

	if (!r)
		return NULL;
	ap->jruns[i] = NULL;             /* r's (freed with it) */
	serve__sink_attach(r, &hc->sink);
	return r;
}

/* The choices go to the gate in order, each a request of its own: they
 * count against the tenant's max_active, max_queued and max_tokens and
 * take their turns in the fair queue as separate requests would, and
 * each reserves its own pages. Behind choice 0 in its tenant's queue,
 * the others are held until choice 0's prompt is computed (gate.c,
 * prefix hold-back): its full pages are then in the tenant's prefix
 * cache, and each maps them, read-only, and computes only the tokens of
 * its last page into a page of its own. A choice refused (the tenant's
 * queue full, ...) ends the exchange: its error is the answer and the
 * choices admitted already are orphaned - never half an answer. */
static void api_admit_choices(struct http_conn *hc, struct api_prep *ap,
			      struct serve_req *first)
{
	struct http_exchange *x = &hc->x;
	uint64_t num = x->num;

	serve__gate_admit(first);
	for (uint32_t i = 1; i < x->n_choices; i++) {
		struct serve_req *r;

		if (!x->active || x->num != num)
			return;   /* refused as a whole already */
		r = api_choice_req(hc, ap, first, i);
		if (!r) {
			exchange_fail(hc, 0);
			return;
		}
		choice_take(x, i);
		x->r = r;
		serve__gate_admit(r);
	}
}

/* The prepared request becomes a serve request on this exchange and goes
 * to the role's admission. */
static void api_admit(struct http_conn *hc, struct api_prep *ap)
{
	struct serve *s = hc->s;
	struct http_exchange *x = &hc->x;
	const struct openai_req *q = &ap->q;
	struct http_choice *chs = q->n > 1 ? calloc(q->n, sizeof(*chs)) : NULL;
	struct serve_req *r;

	r = q->n > 1 && !chs ? NULL :
	    serve__req_new(s, s->d->cfg.role == KVD_ROLE_DECODE ? SREQ_DECODE
							       : SREQ_LOCAL);
	if (!r) {
		free(chs);
		http__error(hc, 500, "server_error", NULL, NULL, "out of memory", ap->tenant);
		return;
	}
	/* the exchange: from here every answer comes through the sink ops */
	memset(x, 0, sizeof(*x));
	x->active = true;
	x->stream = q->stream;
	x->chat = ap->shape->chat;
	x->shape = ap->shape;
	x->r = r;
	x->choices = chs;
	x->n_choices = q->n > 1 ? q->n : 1;
	for (uint32_t i = 0; chs && i < q->n; i++)
		chs[i].index = i;
	x->num = ++hc->hs->next_exchange;
	/* its id from here (the gate keeps it): the access line names it */
	r->reg.id = x->req_id = kvd_reqtab_new_id(s->reqtab);
	api_public_id(x->id, sizeof(x->id), ap->shape->id_prefix);
	x->created = (int64_t)time(NULL);
	x->prompt_tokens = ap->n_ids;
	x->t_start_ns = ap->t_start_ns;
	snprintf(x->model, sizeof(x->model), "%s", hc->hs->model_name);
	snprintf(x->method, sizeof(x->method), "%s", ap->method);
	snprintf(x->path, sizeof(x->path), "%s", ap->path);
	snprintf(x->tenant, sizeof(x->tenant), "%s", ap->tenant);
	for (uint32_t i = 0; i < q->n_stop; i++) {
		x->stop[i] = q->stop[i];
		x->stop_len[i] = q->stop_len[i];
		ap->q.stop[i] = NULL;
	}
	x->n_stop = q->n_stop;
	ap->q.n_stop = 0;
	api_admit_tools(x, ap);
	serve__sink_attach(r, &hc->sink);
	r->client_id = x->num;
	snprintf(r->public_id, sizeof(r->public_id), "%s", x->id);
	snprintf(r->tenant, sizeof(r->tenant), "%s", ap->tenant);
	r->lim = ap->lim;
	snprintf(r->cache_salt, sizeof(r->cache_salt), "%s", q->cache_salt);
	r->prompt = ap->ids;
	r->n_prompt = ap->n_ids;
	ap->ids = NULL;
	r->gram = ap->q.gram;            /* the run reads it: they go together */
	ap->q.gram = NULL;
	r->jrun = ap->jruns[0];
	ap->jruns[0] = NULL;
	api_req_params(hc, ap, r);
	x->temperature = q->temperature;
	x->top_p = q->top_p;
	x->max_tokens = q->max_tokens;
	KVLOG_DEBUG(s->log, "http_admit", "conn=%llu id=%llu client_id=%llu completion=%s tenant=%s stream=%d prep_us=%llu",
		    (unsigned long long)hc->conn_id, (unsigned long long)x->req_id,
		    (unsigned long long)x->num,
		    x->id, KVLOG_Q(ap->tenant), x->stream,
		    (unsigned long long)((kvd_now_ns() - ap->t_start_ns) / 1000));
	api_admit_choices(hc, ap, r);   /* the tenant's queue, then the role's admission */
}

/* Loop thread: the worker is done (or the job was cancelled). */
static void api_prep_done(struct prep_job *j, bool cancelled)
{
	struct api_prep *ap = kvd_container_of(j, struct api_prep, job);
	struct http_conn *hc = ap->hc;

	if (hc)
		hc->x.prep = NULL;
	if (cancelled || !hc)
		KVLOG_DEBUG(ap->s->log, "http_prep_dropped",
			    "tenant=%s bytes=%zu ran=%d msg=\"the client left while its body was prepared\"",
			    KVLOG_Q(ap->tenant), ap->len, j->ran);
	if (!cancelled && hc && !hc->closing) {
		if (ap->parse_rc == 0)
			api_ignored_note(hc, ap);
		if (api_prep_refused(hc, ap))
			hc->x.method[0] = hc->x.path[0] = '\0';   /* answered */
		else
			api_admit(hc, ap);
	}
	api_prep_free(ap);
}

/* Bodies up to this many bytes are prepared on the loop: parsing,
 * rendering and tokenizing them takes tens of microseconds, and the
 * workers' per-tenant bound (PREP_KEY_JOBS_MAX being prepared) would
 * otherwise refuse a tenant's burst of small requests while the engine
 * keeps the (lower-priority) workers waiting. */
#define API_PREP_INLINE_MAX 4096u

/* POST /v1/completions, /v1/chat/completions and /v1/responses: the key
 * here, the rest of the gate once the body is prepared. The exchange
 * stays active (the connection reads no further request) until then; a
 * connection that closes meanwhile cancels the job (exchange_free). */
static void api_generate(struct http_conn *hc, const struct http_msg *m,
			 const struct api_shape *shape)
{
	struct http_server *hs = hc->hs;
	const struct kvd_apikey_info *key = http__auth_key(hc, m);
	const char *tenant = key ? key->tenant : NULL;
	struct api_prep *ap;
	int rc;

	if (!tenant)
		return;
	ap = calloc(1, sizeof(*ap));
	if (!ap) {
		http__error(hc, 500, "server_error", NULL, NULL, "out of memory", tenant);
		return;
	}
	/* the body is read as JSON whatever its Content-Type says (curl -d
	 * sends form-urlencoded): the parser is what judges it. It is taken
	 * from the wire, not copied: a 1 MB body copied on the loop cost a
	 * few milliseconds there (more under ASan), for every request. */
	ap->body = http_wire_take_body(&hc->wire, &ap->len);
	if (!ap->body && !(ap->body = strdup(""))) {
		free(ap);
		http__error(hc, 500, "server_error", NULL, NULL, "out of memory", tenant);
		return;
	}
	ap->hc = hc;
	ap->s = hc->s;
	ap->shape = shape;
	ap->t_start_ns = kvd_now_ns();
	ap->parse_rc = -1;               /* nothing to deinit until parsed */
	ap->tok = hs->s->tok;
	ap->jvocab = hs->s->jvocab;
	ap->max_n = hs->s->d->cfg.http_max_n ? hs->s->d->cfg.http_max_n : 1;
	ap->fmt = hs->chat_format;
	ap->parse_special = hs->s->d->cfg.http_parse_special;
	snprintf(ap->model_name, sizeof(ap->model_name), "%s", hs->model_name);
	snprintf(ap->tenant, sizeof(ap->tenant), "%s", tenant);
	ap->lim = key->lim;
	snprintf(ap->method, sizeof(ap->method), "%s", m->method_name);
	snprintf(ap->path, sizeof(ap->path), "%.63s", m->path);
	snprintf(ap->job.key, sizeof(ap->job.key), "%s", tenant);
	ap->job.bytes = ap->len;
	ap->job.run = api_prep_run;
	ap->job.done = api_prep_done;
	if (ap->len <= API_PREP_INLINE_MAX) {
		/* small: prepared here, at once (tens of microseconds) */
		api_prep_run(&ap->job);
		api_prep_done(&ap->job, false);
		return;
	}
	rc = prep_submit(&hs->s->front->prep, &ap->job);
	if (rc) {
		ap->parse_rc = 1;
		api_prep_free(ap);
		hc->s->d->counters.rejected[KVD_REJECT_OVERLOADED]++;
		/* one sentence for both bounds: whether the others' work
		 * filled the pool is not this tenant's to learn */
		http__error(hc, 429, "server_error", "overloaded", NULL,
			  "too many requests are being prepared; retry later", tenant);
		return;
	}
	hc->x.active = true;
	hc->x.prep = ap;
	snprintf(hc->x.method, sizeof(hc->x.method), "%s", ap->method);
	snprintf(hc->x.path, sizeof(hc->x.path), "%s", ap->path);
}

static void api_completions(struct http_conn *hc, const struct http_msg *m)
{
	api_generate(hc, m, &api_shapes[API_CMPL]);
}

static void api_chat(struct http_conn *hc, const struct http_msg *m)
{
	api_generate(hc, m, &api_shapes[API_CHAT]);
}

static void api_responses(struct http_conn *hc, const struct http_msg *m)
{
	api_generate(hc, m, &api_shapes[API_RESP]);
}

/* GET /, /chat.js, /chat.css: the chat page (http_page.c), without a
 * key (it holds no data); 404 like any unknown path when http.chat_page
 * is off. */
static void api_page(struct http_conn *hc, const struct http_msg *m)
{
	if (!http_page_get(hc, m))
		http__error(hc, 404, "invalid_request_error", NULL, NULL,
			  "no such endpoint", "-");
}

/* The routes. A path ending in '/' with `prefix` matches that path
 * followed by one non-empty segment (GET /v1/models/{id}); the handler
 * reads the segment itself. `prefill`: a prefill node serves it too - it
 * serves no clients, so only the probes and /metrics; there every other
 * path is unknown (404). Add a route with one line here. */
static const struct api_route {
	const char *path;
	enum http_wire_method method;
	http_handler_fn fn;
	bool keyless;                    /* served without a key (probes) */
	bool prefix;                     /* path + one segment */
	bool prefill;                    /* served on a prefill node too */
} routes[] = {
	{ "/v1/completions", HTTP_WIRE_POST, api_completions, false, false, false },
	{ "/v1/chat/completions", HTTP_WIRE_POST, api_chat, false, false, false },
	{ "/v1/responses", HTTP_WIRE_POST, api_responses, false, false, false },
	{ "/v1/models", HTTP_WIRE_GET, api_models, false, false, false },
	{ "/v1/models/", HTTP_WIRE_GET, api_model_get, false, true, false },
	{ "/tokenize", HTTP_WIRE_POST, http__tokenize, false, false, false },
	{ "/detokenize", HTTP_WIRE_POST, http__detokenize, false, false, false },
	{ "/health", HTTP_WIRE_GET, api_health, true, false, true },
	{ "/livez", HTTP_WIRE_GET, api_livez, true, false, true },
	{ "/readyz", HTTP_WIRE_GET, api_readyz, true, false, true },
	{ "/metrics", HTTP_WIRE_GET, api_metrics, false, false, true },
	{ "/", HTTP_WIRE_GET, api_page, true, false, false },   /* the chat page */
	{ "/chat.js", HTTP_WIRE_GET, api_page, true, false, false },
	{ "/chat.css", HTTP_WIRE_GET, api_page, true, false, false },
};

/* Whether rt serves the path p[0, plen) (the query cut off) on a node of
 * role `role`. */
static bool api_route_path(const struct api_route *rt, enum kvd_role role,
			   const char *p, size_t plen)
{
	size_t rl = strlen(rt->path);

	if (role == KVD_ROLE_PREFILL && !rt->prefill)
		return false;
	if (!rt->prefix)
		return rl == plen && !strncmp(rt->path, p, plen);
	return plen > rl && !strncmp(rt->path, p, rl) &&
	       !memchr(p + rl, '/', plen - rl);
}

/* The route of (method, path) on hc's node; NULL when none, *path_known
 * when the path exists for another method. */
static const struct api_route *api_route(const struct http_conn *hc,
					 const struct http_msg *m,
					 bool *path_known)
{
	size_t plen = strcspn(m->path, "?");

	*path_known = false;
	for (size_t i = 0; i < KVD_ARRAY_SIZE(routes); i++) {
		if (!api_route_path(&routes[i], hc->s->d->cfg.role, m->path, plen))
			continue;
		*path_known = true;
		if (routes[i].method == m->method)
			return &routes[i];
	}
	return NULL;
}

/* OPTIONS on a path that exists: the CORS preflight, with the path's
 * methods (http_cors.c). */
static void api_options(struct http_conn *hc, const struct http_msg *m)
{
	size_t plen = strcspn(m->path, "?");
	char methods[64] = "";

	for (size_t i = 0; i < KVD_ARRAY_SIZE(routes); i++) {
		if (!api_route_path(&routes[i], hc->s->d->cfg.role, m->path, plen))
			continue;
		snprintf(methods + strlen(methods), sizeof(methods) - strlen(methods),
			 "%s%s", methods[0] ? ", " : "",
			 routes[i].method == HTTP_WIRE_GET ? "GET" : "POST");
	}
	http__cors_preflight(hc, m, methods);
}

/* http_head_fn: a request whose body is still to come is refused on its
 * key before a byte of the body is read (the body may be up to
 * http.max_body_bytes that a client without a key could make us take):
 * 401, `Connection: close`, and the connection ends. Everything else
 * (no keys, a route without one, an unknown route, a good key) reads its
 * body; the handler judges the whole request as before. */
static bool api_head(struct http_conn *hc, const struct http_msg *m)
{
	bool path_known;
	const struct api_route *rt = api_route(hc, m, &path_known);

	if (!rt || rt->keyless || http__key_info(hc->hs, m))
		return true;
	http__drain_after(hc);    /* the unread body ends the stream */
	(void)http__auth(hc, m);    /* answers 401 */
	return false;
}

/* http_auth_fn: a head with a good key (any head without keys). */
static bool api_head_auth(const struct http_conn *hc, const struct http_msg *m)
{
	return http__key_info(hc->hs, m) != NULL;
}

static void api_handle(struct http_conn *hc, const struct http_msg *m)
{
	bool path_known;
	const struct api_route *rt = api_route(hc, m, &path_known);

	if (rt) {
		rt->fn(hc, m);
		return;
	}
	if (path_known && m->method == HTTP_WIRE_OPTIONS)
		api_options(hc, m);
	else if (path_known)
		http__error(hc, 405, "invalid_request_error", NULL, NULL,
			  "method not allowed on this path", "-");
	else
		http__error(hc, 404, "invalid_request_error", NULL, NULL,
			  hc->s->d->cfg.role == KVD_ROLE_PREFILL ?
			  "no such endpoint: a prefill node serves only /livez, /readyz, /health and /metrics" :
			  "no such endpoint", "-");
}

/* ---- setup ------------------------------------------------------------------------ */

int serve__http_listen(struct serve *s)
{
	struct http_server *hs = calloc(1, sizeof(*hs));

	if (!hs)
		return -ENOMEM;
	hs->s = s;
	hs->handler = api_handle;
	hs->head_check = api_head;
	hs->head_auth = api_head_auth;
	hs->sink_ops = &api_sink_ops;
	hs->exchange_free = exchange_free;
	kvd_config_model_name(&s->d->cfg, hs->model_name, sizeof(hs->model_name));
	{
		const char *why = NULL;
		char bad[HTTP_WIRE_ORIGIN_MAX + 1];

		/* checked by the config already (exit 78): kept for a
		 * config built another way */
		if (kvd_origins_parse(&hs->cors, s->d->cfg.http_cors_origins, &why,
				      bad, sizeof(bad))) {
			KVLOG_ERR(s->log, "config_error", "key=http.cors_origins value=%s msg=%s",
				  KVLOG_Q(bad), KVLOG_Q(why));
			free(hs);
			return -EINVAL;
		}
	}
	hs->chat_format = s->d->chat_format;
	if (KVD_FAULT_POINTS && getenv("KVD_HTTP_NOMEM")) {
		const char *e = getenv("KVD_HTTP_NOMEM");
		char *end;
		unsigned long n = strtoul(e, &end, 10);

		if (*end || n > 100000) {
			KVLOG_ERR(s->log, "fault_spec", "spec=%s msg=\"KVD_HTTP_NOMEM is the allocation of each exchange that fails, 1..100000\"",
				  KVLOG_Q(e));
			free(hs);
			return -EINVAL;
		}
		hs->nomem_at = (uint32_t)n;
		KVLOG_WARN(s->log, "fault_points", "http_nomem=%u", hs->nomem_at);
	}
	s->front->http = hs;
	return http__listen(hs);
}
