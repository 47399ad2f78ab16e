/* http_tok.c - POST /tokenize and POST /detokenize, as llama-server has
 * them.
 *
 *   /tokenize   {"content": str, "add_special": bool (false),
 *                "parse_special": bool (http.parse_special),
 *                "with_pieces": bool (false)}
 *            -> {"tokens": [id, ...]}, or with pieces
 *               {"tokens": [{"id": n, "piece": "text"}, ...]}; a piece
 *               that is not valid UTF-8 alone (a byte token, part of a
 *               character) is its byte values, [226, 150]
 *   /detokenize {"tokens": [id, ...]} -> {"content": str}
 *
 * The same gate as a generation's first steps: a tenant's key (401 before
 * the body is read, api_head), the body bound (http.max_body_bytes, the
 * parser's 413), then the body itself: JSON, each field's type, unknown
 * fields named (400, `param`), at most PROTO_CLIENT_TOKENS_MAX ids each
 * way, every id inside the vocabulary (400 naming `tokens`). Nothing is
 * admitted and no page is touched: the tokenizer is immutable and any
 * thread may use it (gpu/text/tokenizer.h).
 *
 * Where it runs: as for generation bodies (http_api.c, prep.h), a body
 * up to HTTP_TOK_INLINE_MAX bytes is handled on the loop (tens of
 * microseconds); a larger one - a megabyte of text is seconds of BPE -
 * goes to the prep pool under its tenant's key and bounds, so the loop
 * keeps every other stream moving. The answer's JSON is built there too.
 * A connection that closes meanwhile cancels the job, which frees itself
 * when it comes back (http__tok_detach).
 */
#include "daemon/front/http_int.h"
#include "conf/util.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Bodies up to this many bytes are tokenized on the loop. */
#define HTTP_TOK_INLINE_MAX 4096u

struct http_tok_job {
	struct prep_job job;             /* key: the tenant */
	struct http_conn *hc;            /* NULL once its connection closed */
	struct serve *s;
	bool detok;                      /* /detokenize */
	bool parse_special;              /* http.parse_special: the default */
	char tenant[KVD_TENANT_MAX];
	char *body;                      /* (len) taken from the wire */
	size_t len;
	const struct tokenizer *tok;     /* lives until prep_stop */
	/* the worker's result: status 200 and out, or an error */
	int status;
	const char *type, *code, *param; /* constants */
	char msg[PROTO_CLIENT_MSG_MAX];
	char *out;                       /* (out_len) the answer's JSON */
	size_t out_len;
};

/* ---- the worker's part: no loop state ------------------------------------------ */

static int tok_fail(struct http_tok_job *t, int status, const char *param,
		    const char *fmt, const char *what)
{
	t->status = status;
	t->type = status >= 500 ? "server_error" : "invalid_request_error";
	t->code = NULL;
	t->param = param;
	snprintf(t->msg, sizeof(t->msg), fmt, what);
	return 1;
}

/* The body as a JSON object whose keys are all in `known` (NULL-ended);
 * NULL after tok_fail. */
static json_t *tok_body(struct http_tok_job *t, const char *const *known)
{
	json_error_t je;
	json_t *j = json_loadb(t->body, t->len, JSON_REJECT_DUPLICATES, &je);
	const char *k;
	json_t *v;

	if (!j || !json_is_object(j)) {
		json_decref(j);
		tok_fail(t, 400, NULL, "%s", "the body is not a JSON object");
		return NULL;
	}
	json_object_foreach(j, k, v) {
		size_t i = 0;

		while (known[i] && strcmp(known[i], k))
			i++;
		if (!known[i]) {
			/* k is the client's: named only when printable */
			bool plain = strlen(k) <= 64 && strspn(k,
				"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.") == strlen(k);

			tok_fail(t, 400, NULL, "unsupported parameter '%s'", plain ? k : "?");
			json_decref(j);
			return NULL;
		}
	}
	return j;
}

/* A boolean field: *out unchanged when absent; 1 after tok_fail. */
static int tok_bool(struct http_tok_job *t, json_t *j, const char *name, bool *out)
{
	json_t *v = json_object_get(j, name);

	if (!v)
		return 0;
	if (!json_is_boolean(v))
		return tok_fail(t, 400, name, "'%s' must be a boolean", name);
	*out = json_is_true(v);
	return 0;
}

/* A piece: its text when valid UTF-8 alone, else its byte values. */
static json_t *tok_piece_json(const char *p, size_t n)
{
	json_t *a;

	if (tokenizer_utf8_valid(p, n))
		return json_stringn(p, n);
	a = json_array();
	for (size_t i = 0; a && i < n; i++)
		if (json_array_append_new(a, json_integer((unsigned char)p[i]))) {
			json_decref(a);
			return NULL;
		}
	return a;
}

static json_t *tok_ids_json(const struct tokenizer *tok, const int32_t *ids,
			    size_t n, bool with_pieces)
{
	json_t *a = json_array();

	for (size_t i = 0; a && i < n; i++) {
		const char *p;
		size_t len;
		json_t *e;

		if (!with_pieces) {
			e = json_integer(ids[i]);
		} else {
			e = tokenizer_piece(tok, ids[i], &p, &len) ? NULL :
			    json_pack("{s:I, s:o}", "id", (json_int_t)ids[i],
				      "piece", tok_piece_json(p, len));
		}
		if (!e || json_array_append_new(a, e)) {
			json_decref(a);
			return NULL;
		}
	}
	return a;
}

/* /tokenize's body to its answer. 0 with t->out, 1 (tok_fail), -ENOMEM. */
static int tok_tokenize(struct http_tok_job *t)
{
	static const char *const known[] = { "content", "add_special", "parse_special",
					     "with_pieces", NULL };
	json_t *j = tok_body(t, known), *c, *a;
	bool add_special = false, parse_special = t->parse_special, pieces = false;
	int32_t *ids = NULL;
	size_t n = 0;
	int rc;

	if (!j)
		return 1;
	c = json_object_get(j, "content");
	if (!c || !json_is_string(c)) {
		json_decref(j);
		return tok_fail(t, 400, "content", "%s", "'content' must be a string");
	}
	if (tok_bool(t, j, "add_special", &add_special) ||
	    tok_bool(t, j, "parse_special", &parse_special) ||
	    tok_bool(t, j, "with_pieces", &pieces)) {
		json_decref(j);
		return 1;
	}
	rc = json_string_length(c) == 0 ? 0 :
	     tokenizer_encode_ex(t->tok, json_string_value(c), json_string_length(c),
				 (add_special && tokenizer_add_bos(t->tok) ? TOKENIZER_ADD_BOS : 0) |
				 (parse_special ? TOKENIZER_PARSE_SPECIAL : 0), &ids, &n);
	if (!rc && json_string_length(c) == 0 && add_special && tokenizer_add_bos(t->tok) &&
	    tokenizer_bos(t->tok) >= 0) {
		ids = malloc(sizeof(*ids));
		rc = ids ? 0 : -ENOMEM;
		if (ids) {
			ids[0] = tokenizer_bos(t->tok);
			n = 1;
		}
	}
	json_decref(j);
	if (rc) {
		free(ids);
		return rc == -ENOMEM ? -ENOMEM :
		       tok_fail(t, 400, "content", "%s", "the content cannot be tokenized");
	}
	if (n > PROTO_CLIENT_TOKENS_MAX) {
		char m[96];

		free(ids);
		snprintf(m, sizeof(m), "the content tokenizes to %zu tokens (at most %u)",
			 n, (unsigned)PROTO_CLIENT_TOKENS_MAX);
		return tok_fail(t, 400, "content", "%s", m);
	}
	a = tok_ids_json(t->tok, ids, n, pieces);
	free(ids);
	j = a ? json_pack("{s:o}", "tokens", a) : NULL;
	t->out = j ? json_dumps(j, JSON_COMPACT) : NULL;
	json_decref(j);
	return t->out ? 0 : -ENOMEM;
}

/* "tokens" as ids inside the vocabulary: 0 with *ids (malloc'd, *n), 1
 * (tok_fail naming `tokens`), -ENOMEM. */
static int tok_ids_of(struct http_tok_job *t, json_t *a, int32_t **out, size_t *n)
{
	uint32_t n_vocab = tokenizer_n_vocab(t->tok);
	size_t len;
	int32_t *ids;
	char at[96];

	if (!a || !json_is_array(a))
		return tok_fail(t, 400, "tokens", "%s", "'tokens' must be an array of token ids");
	len = json_array_size(a);
	if (len > PROTO_CLIENT_TOKENS_MAX) {
		snprintf(at, sizeof(at), "'tokens' holds %zu ids (at most %u)", len,
			 (unsigned)PROTO_CLIENT_TOKENS_MAX);
		return tok_fail(t, 400, "tokens", "%s", at);
	}
	ids = malloc(sizeof(*ids) * (len ? len : 1));
	if (!ids)
		return -ENOMEM;
	for (size_t i = 0; i < len; i++) {
		json_t *v = json_array_get(a, i);
		json_int_t id = json_is_integer(v) ? json_integer_value(v) : -1;

		if (id < 0 || (uint64_t)id >= n_vocab) {
			snprintf(at, sizeof(at), "tokens[%zu] is not a token id of the vocabulary (0..%u)",
				 i, n_vocab - 1);
			free(ids);
			return tok_fail(t, 400, "tokens", "%s", at);
		}
		ids[i] = (int32_t)id;
	}
	*out = ids;
	*n = len;
	return 0;
}

/* /detokenize's body to its answer. 0 with t->out, 1 (tok_fail), -ENOMEM. */
static int tok_detokenize(struct http_tok_job *t)
{
	static const char *const known[] = { "tokens", NULL };
	json_t *j = tok_body(t, known);
	int32_t *ids = NULL;
	char *text = NULL;
	size_t n = 0, len = 0;
	int rc;

	if (!j)
		return 1;
	rc = tok_ids_of(t, json_object_get(j, "tokens"), &ids, &n);
	json_decref(j);
	if (rc)
		return rc;
	rc = tokenizer_decode(t->tok, ids, n, &text, &len);
	free(ids);
	if (rc) {
		free(text);
		return rc == -ENOMEM ? -ENOMEM :
		       tok_fail(t, 400, "tokens", "%s", "the tokens cannot be decoded");
	}
	/* decode replaced invalid UTF-8 with U+FFFD: a valid JSON string */
	j = json_pack("{s:s%}", "content", text, len);
	free(text);
	t->out = j ? json_dumps(j, JSON_COMPACT) : NULL;
	json_decref(j);
	return t->out ? 0 : -ENOMEM;
}

/* Worker thread (or the loop, for a small body). */
static void tok_run(struct prep_job *pj)
{
	struct http_tok_job *t = kvd_container_of(pj, struct http_tok_job, job);
	int rc = t->detok ? tok_detokenize(t) : tok_tokenize(t);

	free(t->body);
	t->body = NULL;
	if (rc == 0) {
		t->status = 200;
		t->out_len = strlen(t->out);
	} else if (rc < 0) {
		tok_fail(t, 500, NULL, "%s", "out of memory");
	}
}

/* ---- the loop's part ------------------------------------------------------------- */

static void tok_free(struct http_tok_job *t)
{
	free(t->body);
	free(t->out);
	free(t);
}

/* Loop thread: the answer (or nothing when the client left). */
static void tok_done(struct prep_job *pj, bool cancelled)
{
	struct http_tok_job *t = kvd_container_of(pj, struct http_tok_job, job);
	struct http_conn *hc = t->hc;

	if (hc)
		hc->x.tok = NULL;
	if (!cancelled && hc && !hc->closing) {
		hc->x.method[0] = hc->x.path[0] = '\0';
		if (t->status == 200) {
			http__respond(hc, 200, "application/json", t->out, t->out_len);
			KVLOG_DEBUG(hc->s->log, "http_request",
				    "conn=%llu tenant=%s path=%s status=200 bytes=%zu",
				    (unsigned long long)hc->conn_id, KVLOG_Q(t->tenant),
				    t->detok ? "/detokenize" : "/tokenize", t->out_len);
			http__exchange_done(hc);
		} else {
			http__error(hc, t->status, t->type, t->code, t->param, t->msg,
				    t->tenant);
		}
	}
	tok_free(t);
}

void http__tok_detach(struct http_tok_job *t)
{
	t->hc = NULL;
	prep_cancel(&t->job);
}

/* The key judged (the tenant), the body taken from the wire, then run
 * here or on the pool. */
static void tok_start(struct http_conn *hc, const struct http_msg *m, bool detok)
{
	const char *tenant = http__auth(hc, m);
	struct http_tok_job *t;

	if (!tenant)
		return;
	t = calloc(1, sizeof(*t));
	if (!t) {
		http__error(hc, 500, "server_error", NULL, NULL, "out of memory", tenant);
		return;
	}
	t->body = http_wire_take_body(&hc->wire, &t->len);
	t->hc = hc;
	t->s = hc->s;
	t->detok = detok;
	t->parse_special = hc->s->d->cfg.http_parse_special;
	t->tok = hc->s->tok;
	snprintf(t->tenant, sizeof(t->tenant), "%s", tenant);
	snprintf(t->job.key, sizeof(t->job.key), "%s", tenant);
	t->job.bytes = t->len;
	t->job.run = tok_run;
	t->job.done = tok_done;
	if (!t->body)
		t->len = 0;   /* no body: tok_body says so */
	if (t->len <= HTTP_TOK_INLINE_MAX) {
		tok_run(&t->job);
		tok_done(&t->job, false);
		return;
	}
	if (prep_submit(&hc->s->front->prep, &t->job)) {
		tok_free(t);
		hc->s->d->counters.rejected[KVD_REJECT_OVERLOADED]++;
		http__error(hc, 429, "server_error", "overloaded", NULL,
			    "too many requests are being prepared; retry later", tenant);
		return;
	}
	hc->x.active = true;
	hc->x.tok = t;
	snprintf(hc->x.method, sizeof(hc->x.method), "%s", m->method_name);
	snprintf(hc->x.path, sizeof(hc->x.path), "%.63s", m->path);
}

void http__tokenize(struct http_conn *hc, const struct http_msg *m)
{
	tok_start(hc, m, false);
}

void http__detokenize(struct http_conn *hc, const struct http_msg *m)
{
	tok_start(hc, m, true);
}
