/* serve_decode.c - decode: prefill peers, KV reception, coverage.
 *
 * Design. Decode is the side that reads KV it did not compute, so it is
 * the side that must distrust it. A request's KV goes through these gates
 * before attention reads a byte of it:
 *   1. admission (invariant 3): prompt + max_tokens fits the smallest
 *      context and pool on the path - this node's and the chosen peer's,
 *      as the peer declared them in its hello - or PROMPT_TOO_LONG before
 *      any page is reserved;
 *   2. every batch passes its XXH3 checksum (net/xfer.c), then every entry
 *      must name a page of *this* request's prefix, in the generation we
 *      reserved it in, not yet written, with the token count that page
 *      must hold, with finite K/V - else INTEGRITY and nothing of the
 *      batch is written (xfer_check_batch, net/xfer_check.h);
 *   3. coverage (invariant 6): prefill_done must report exactly the prompt
 *      tokens and prefix pages we asked for, exactly the batches it
 *      announced must have arrived and every prefix page must have been
 *      written once (xfer_check_coverage);
 *      then kvpool_mark_ready checks each page's tag in page memory
 *      (owner, generation, page, index, tokens). A short transfer fails
 *      here and is never decoded;
 *   4. the engine verifies the table and tags again before every step
 *      (invariant 1).
 *
 * Deferred release (invariants 2, 7): the prefix pages carry a fence from
 * the prefill_request until the transfer is complete. On any failure
 * decode sends abort and releases the pages, which stay FENCED (out of the
 * free list) until prefill's abort_ack says no byte for them is still in
 * flight, or the connections to that peer are torn down (also after
 * release_timeout_ms without an ack). A request whose client left keeps
 * running its transfer and releases afterwards (invariant 8). Pages whose
 * tag check fails (at mark_ready, or in the engine later) had a writer we
 * cannot trust: they are quarantined, never released.
 *
 * Peers: decode connects to every peers.prefill address, exchanges hellos
 * (a mismatch of model, KV dtype or layout refuses the pairing), opens
 * the data connection, then heartbeats. It picks the up peer with the
 * fewest requests in flight (its own count plus the peer's reported load).
 */
#include "daemon/serve_int.h"
#include "conf/util.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PEER_RETRY_MS 500

static void peer_connect(struct peer *p);
static void peer_lost(struct peer *p, const char *why);
static unsigned peer_lost_code(struct peer *p, const char *why, int code,
			       const char *msg);
static void peer_figures_update(struct serve *s);
static void decode_try_complete(struct serve_req *r);
static void peer_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf);
static void peer_data_bound(struct peer *p);
static void peer_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf);

/* Every control frame to a prefill peer: sealed once the link proved,
 * through the link's bounded write queue (serve__link_send). */
static int peer_send(struct peer *p, const struct proto_peer_msg *m)
{
	if (!p || !p->ctl_open || p->closing)
		return -EPIPE;
	return serve__link_send(&p->wb, &p->wb_dead, p->sealed ? &p->ss.tx : NULL, m);
}

/* Heartbeat tick: true when the link was torn down for its write queue. */
static bool peer_write_check(struct peer *p, uint64_t now)
{
	const char *why = serve__link_write_poll(p->s, &p->wb, p->wb_dead, now,
						 &p->last_heard_ns, p->addr);

	if (why)
		peer_lost(p, why);
	return why != NULL;
}

/* ---- the decode request machine (daemon/machine.h: dreq) -------------------- */

/* The first failure of a request is the one its client hears about. */
static void dreq_fail(struct serve_req *r, int code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void dreq_fail(struct serve_req *r, int code, const char *fmt, ...)
{
	va_list ap;

	if (r->fail_code)
		return;
	r->fail_code = code;
	va_start(ap, fmt);
	vsnprintf(r->fail_msg, sizeof(r->fail_msg), fmt, ap);
	va_end(ap);
	if (code == PROTO_ERR_INTEGRITY)
		r->s->d->counters.integrity_failures++;
}

/* A pool call on pages this request holds failed: the pool and the
 * request disagree about who owns what, so nothing of the table may go
 * back to the free list (invariant 2). */
static void dreq_breach(struct serve_req *r, const char *what, int rc)
{
	struct serve *s = r->s;

	KVLOG_ERR(s->log, "invariant_breach", "id=%llu op=%s code=%d pages=%u",
		  (unsigned long long)r->reg.id, what, rc, r->n_table);
	if (r->pages_held)
		(void)kvpool_quarantine(s->d->pool, r->reg.id, r->table, r->n_table);
	r->pages_held = false;
	r->fenced = false;
	dreq_fail(r, PROTO_ERR_INTERNAL, "the KV pool refused an operation on this request's pages");
}

static void dreq_release(struct serve_req *r)
{
	int rc;

	if (!r->pages_held)
		return;
	rc = kvpool_release(r->s->d->pool, r->reg.id, r->table, r->n_table);
	if (rc) {
		dreq_breach(r, "release", rc);
		return;
	}
	r->pages_held = false;
}

static void dreq_unfence(struct serve_req *r)
{
	struct serve *s = r->s;
	int rc;

	if (!r->fenced)
		return;
	rc = kvpool_unfence(s->d->pool, r->reg.id, r->table, r->n_prefix);
	r->fenced = false;
	if (rc) {
		dreq_breach(r, "unfence", rc);
		return;
	}
	/* how long the pages stayed fenced after an abort: the handshake's
	 * wait, measured (tests check it against a delayed ack) */
	if (r->t_abort_ns)
		KVLOG_INFO(s->log, "abort_done", "id=%llu fenced_ms=%llu",
			   (unsigned long long)r->reg.id,
			   (unsigned long long)((kvd_now_ns() - r->t_abort_ns) / 1000000u));
}

/* The prefix was written by a writer we cannot trust: quarantine it,
 * release the rest of the table (never written by anyone). */
static void dreq_quarantine(struct serve_req *r, const char *reason)
{
	struct serve *s = r->s;
	int rc;

	if (!r->pages_held)
		return;
	rc = kvpool_quarantine(s->d->pool, r->reg.id, r->table, r->n_prefix);
	if (!rc && r->n_table > r->n_prefix)
		rc = kvpool_release(s->d->pool, r->reg.id, r->table + r->n_prefix,
				    r->n_table - r->n_prefix);
	if (rc) {
		dreq_breach(r, "quarantine", rc);
		return;
	}
	r->pages_held = false;
	KVLOG_WARN(s->log, "pages_quarantined", "id=%llu pages=%u reason=%s",
		   (unsigned long long)r->reg.id, r->n_prefix, reason);
}

static void dreq_send_abort(struct serve_req *r)
{
	struct serve *s = r->s;
	struct proto_peer_msg m = { .type = PEER_MSG_ABORT, .id = r->reg.id,
				    .code = r->fail_code };

	snprintf(m.message, sizeof(m.message), "%s", r->fail_msg);
	/* a lost send ends in the abort timer's teardown */
	(void)peer_send(r->peer, &m);
	r->t_abort_ns = kvd_now_ns();
	KVLOG_INFO(s->log, "transfer_abort", "id=%llu peer=%s code=%s pages=%u fenced=%u",
		   (unsigned long long)r->reg.id,
		   KVLOG_Q(r->peer ? r->peer->addr : "-"),
		   proto_err_name(r->fail_code), r->n_table, r->fenced ? r->n_prefix : 0);
}

static void dreq_send(struct serve_req *r, enum proto_peer_type type)
{
	struct proto_peer_msg m = { .type = type, .id = r->reg.id };

	(void)peer_send(r->peer, &m);
}

static void dreq_detach_peer(struct serve_req *r)
{
	if (r->peer) {
		r->peer->outstanding--;
		r->peer = NULL;
	}
}

static void dreq_timer_cb(uv_timer_t *t)
{
	struct serve_req *r = t->data;

	if (r->state == DRS_TRANSFER)
		dreq_fail(r, PROTO_ERR_TIMEOUT, "%s",
			  r->done_seen ? "the KV transfer did not complete within transfer.transfer_timeout_ms"
				       : "prefill did not complete within transfer.prefill_timeout_ms");
	serve__dreq_event(r, DEV_TIMEOUT);
}

/* No abort_ack within release_timeout_ms: tearing the link down is what
 * ends every write the peer could still make (LINK_LOST follows). */
static void dreq_teardown(struct serve_req *r)
{
	struct peer *p = r->peer;

	KVLOG_WARN(r->s->log, "abort_ack_timeout",
		   "id=%llu peer=%s msg=\"no abort_ack within release_timeout_ms; tearing the peer connection down\"",
		   (unsigned long long)r->reg.id, KVLOG_Q(p ? p->addr : "-"));
	if (p)
		peer_lost(p, "abort_ack timeout");
}

/* Submit to the engine: a standalone request its prompt, a decode request
 * its prompt and first token over the received KV. */
static void dreq_submit(struct serve_req *r)
{
	struct serve *s = r->s;
	bool lent = r->kind == SREQ_DECODE;
	int32_t *toks = malloc(sizeof(int32_t) * (r->n_prompt + 1));
	int rc = -ENOMEM;

	if (toks) {
		memcpy(toks, r->prompt, sizeof(int32_t) * r->n_prompt);
		toks[r->n_prompt] = (int32_t)r->first_token;
		rc = serve__compute_submit(s, r, toks, r->n_prompt + lent,
					   r->max_tokens - lent, false,
					   lent ? r->table : NULL,
					   lent ? r->n_table : 0,
					   lent ? r->n_prompt : 0);
		free(toks);
	}
	if (rc) {
		dreq_fail(r, PROTO_ERR_INTERNAL, "out of memory");
		serve__dreq_event(r, DEV_SUBMIT_FAIL);
	}
}

/* Free the engine's request; decode also hands back its lent pages,
 * quarantined when the engine reported ENGINE_E_INTEGRITY: a page whose
 * tag is wrong had a writer we cannot trust (invariants 1, 2). The
 * engine quarantines its own pages by the same rule. */
static void dreq_free_engine(struct serve_req *r)
{
	bool lent = r->pages_held;

	if (lent && r->engine_integrity)
		KVLOG_WARN(r->s->log, "pages_quarantined",
			   "id=%llu pages=%u reason=engine_integrity",
			   (unsigned long long)r->reg.id, r->n_table);
	r->pages_held = false;
	serve__compute_free(r->s, r, lent, lent && r->engine_integrity);
}

static void dreq_act(struct serve_req *r, uint32_t a)
{
	struct serve *s = r->s;

	switch (a) {
	case DA_ANSWER_ERR:
		serve__client_error(r, r->fail_code ? r->fail_code : PROTO_ERR_INTERNAL,
				    "%s", r->fail_msg[0] ? r->fail_msg : "the request failed");
		return;
	case DA_STREAM_FIRST:
		if ((int32_t)r->first_token != s->model->eos_id)
			serve__client_token(r, (int32_t)r->first_token);
		return;
	case DA_STREAM:
		serve__client_token(r, r->last_token);
		return;
	case DA_ANSWER_FINAL:
		r->final_ok = true;
		serve__client_final(r, r->finish_reason);
		return;
	case DA_DETACH_CLIENT:
		serve__client_detach(r);
		return;
	case DA_SEND_ABORT:
		dreq_send_abort(r);
		return;
	case DA_SEND_ABORT_ACK:
		dreq_send(r, PEER_MSG_ABORT_ACK);
		return;
	case DA_SEND_RELEASE_ACK:
		dreq_send(r, PEER_MSG_RELEASE_ACK);
		return;
	case DA_RELEASE:
		dreq_release(r);
		return;
	case DA_UNFENCE:
		dreq_unfence(r);
		return;
	case DA_QUARANTINE:
		dreq_quarantine(r, r->fence_failed ? "fence_failed" : "tag_check");
		return;
	case DA_DETACH_PEER:
		dreq_detach_peer(r);
		return;
	case DA_TIMER_PREFILL:
		serve__timer_start(r, s->d->cfg.prefill_timeout_ms, dreq_timer_cb);
		return;
	case DA_TIMER_TRANSFER:
		serve__timer_start(r, s->d->cfg.transfer_timeout_ms, dreq_timer_cb);
		return;
	case DA_TIMER_ABORT:
		serve__timer_start(r, s->d->cfg.release_timeout_ms, dreq_timer_cb);
		return;
	case DA_FREE_ENGINE:
		dreq_free_engine(r);
		return;
	case DA_SUBMIT:
		dreq_submit(r);
		return;
	case DA_TEARDOWN:
		dreq_teardown(r);
		return;
	}
}

/* The only way into DONE: everything the request held is given back. */
static void dreq_finish(struct serve_req *r)
{
	KVD_ASSERT(r->s->log, !r->pages_held && !r->fenced && !r->peer && !r->ereq,
		   "id=%llu msg=\"a decode request ends holding pages, a fence, a peer or an engine request\"",
		   (unsigned long long)r->reg.id);
	if (!r->answered)
		serve__client_error(r, PROTO_ERR_INTERNAL, "the request ended unanswered");
	serve__client_detach(r);
	serve__req_end(r, r->final_ok && !r->fail_code);
}

void serve__dreq_event(struct serve_req *r, enum dreq_event ev)
{
	const struct machine_step *st;

	if (r->ended)
		return;
	st = serve__req_step(r, &dreq_machine, ev);
	if (!st)
		return;
	for (uint32_t a = 1; a && a < (1u << DA__BITS) && !r->ended; a <<= 1)
		if (st->actions & a)
			dreq_act(r, a);
	if (r->state == DRS_DONE && !r->ended)
		dreq_finish(r);
}

void serve__decode_abort(struct serve_req *r, const char *reason)
{
	dreq_fail(r, PROTO_ERR_INTERNAL, "aborted by the operator: %s", reason);
	serve__dreq_event(r, DEV_OP_ABORT);
}

/* kvctl abort ID, the drain deadline: OP_ABORT, in any state. */
static int dreq_abort(struct kvd_request *reg, const char *reason)
{
	serve__decode_abort(kvd_container_of(reg, struct serve_req, reg), reason);
	return 0;
}

static void dreq_client_gone(struct serve_req *r)
{
	serve__dreq_event(r, DEV_CLIENT_GONE);
}

static const struct serve_req_ops dreq_local_ops = {
	.reg = { "generate", KVD_REQ_SERVE, dreq_abort },
	.engine_msg = serve__dreq_engine_msg,
	.client_gone = dreq_client_gone,
};

static const struct serve_req_ops dreq_decode_ops = {
	.reg = { "decode", KVD_REQ_SERVE, dreq_abort },
	.engine_msg = serve__dreq_engine_msg,
	.client_gone = dreq_client_gone,
};

/* ---- engine messages (standalone and decode requests) --------------------- */

static int engine_code_to_proto(int e)
{
	switch (e) {
	case ENGINE_E_TOO_LONG: return PROTO_ERR_PROMPT_TOO_LONG;
	case ENGINE_E_INVALID: return PROTO_ERR_INVALID_REQUEST;
	case ENGINE_E_INTEGRITY: return PROTO_ERR_INTEGRITY;
	case ENGINE_E_BUSY:
	case KVPOOL_E_FULL: return PROTO_ERR_OVERLOADED;
	default: return PROTO_ERR_INTERNAL;
	}
}

void serve__dreq_engine_msg(struct serve_req *r, const struct compute_msg *m)
{
	switch (m->kind) {
	case COMPUTE_MSG_SUBMITTED:
		if (m->error) {
			r->engine_integrity = m->error == ENGINE_E_INTEGRITY;
			dreq_fail(r, engine_code_to_proto(m->error),
				  "engine refused the request: %s",
				  engine_strerror(m->error));
			serve__dreq_event(r, DEV_SUBMIT_ERR);
			return;
		}
		r->ereq = m->req;
		serve__dreq_event(r, r->client ? DEV_SUBMITTED : DEV_SUBMITTED_ORPHAN);
		return;
	case COMPUTE_MSG_TOKEN:
		r->last_token = m->token;
		serve__dreq_event(r, DEV_TOKEN);
		return;
	case COMPUTE_MSG_DONE:
		if (m->finish == ENGINE_FINISH_STOP || m->finish == ENGINE_FINISH_LENGTH) {
			snprintf(r->finish_reason, sizeof(r->finish_reason), "%s",
				 m->finish == ENGINE_FINISH_STOP ? "stop" : "length");
			serve__dreq_event(r, DEV_FINISH);
			return;
		}
		if (r->state == DRS_COMPUTE) {
			r->engine_integrity = m->error == ENGINE_E_INTEGRITY;
			dreq_fail(r, r->engine_integrity ? PROTO_ERR_INTEGRITY : PROTO_ERR_INTERNAL,
				  "generation failed: %s (%s)", engine_finish_name(m->finish),
				  engine_strerror(m->error));
		}
		serve__dreq_event(r, DEV_ENGINE_FAIL);
		return;
	case COMPUTE_MSG_FREED:
		serve__dreq_event(r, DEV_FREED);
		return;
	}
}

/* ---- admission -------------------------------------------------------------- */

/* Standalone: the node's own context and pool are the whole path; the
 * request enters the dreq machine at SUBMIT. */
void serve__local_admit(struct serve_req *r)
{
	struct serve *s = r->s;
	uint64_t need = (uint64_t)r->n_prompt + r->max_tokens;
	uint64_t lim = serve__own_limit(s);

	r->rops = &dreq_local_ops;
	if (need > lim) {
		KVLOG_WARN(s->log, "admission_reject",
			   "client_id=%llu reason=prompt_too_long prompt_tokens=%u max_tokens=%u need=%llu limit=%llu context=%u pool_tokens=%llu",
			   (unsigned long long)r->client_id, r->n_prompt,
			   r->max_tokens, (unsigned long long)need,
			   (unsigned long long)lim,
			   s->d->cap.advertised_context,
			   (unsigned long long)s->d->cap.pool_tokens);
		s->d->counters.rejected[KVD_REJECT_PROMPT_TOO_LONG]++;
		r->fail_code = PROTO_ERR_PROMPT_TOO_LONG;
		snprintf(r->fail_msg, sizeof(r->fail_msg),
			 "prompt (%u tokens) + max_tokens (%u) = %llu exceeds what this node can hold (%llu tokens)",
			 r->n_prompt, r->max_tokens, (unsigned long long)need,
			 (unsigned long long)lim);
		serve__dreq_event(r, DEV_REFUSE);
		return;
	}
	serve__req_register(r);
	if (serve__client_stream_begin(r)) {
		r->fail_code = PROTO_ERR_INTERNAL;
		snprintf(r->fail_msg, sizeof(r->fail_msg), "out of memory");
		serve__dreq_event(r, DEV_REFUSE);
		return;
	}
	serve__dreq_event(r, DEV_ADMIT_LOCAL);
}


static struct peer *decode_pick_peer(struct serve *s)
{
	struct peer *best = NULL;

	for (unsigned i = 0; i < s->n_peers; i++) {
		struct peer *p = &s->peers[i];

		if (!p->up)
			continue;
		if (!best || p->load + p->outstanding < best->load + best->outstanding)
			best = p;
	}
	return best;
}

static int decode_send_request(struct serve_req *r)
{
	struct proto_peer_msg m = { .type = PEER_MSG_PREFILL_REQUEST };
	struct proto_peer_page *pages;
	uint32_t *toks;
	int rc;

	pages = calloc(r->n_prefix, sizeof(*pages));
	toks = calloc(r->n_prompt, sizeof(*toks));
	if (!pages || !toks) {
		free(pages);
		free(toks);
		return -ENOMEM;
	}
	for (uint32_t i = 0; i < r->n_prefix; i++) {
		pages[i].page = r->table[i].page;
		pages[i].gen = r->table[i].gen;
	}
	for (uint32_t i = 0; i < r->n_prompt; i++)
		toks[i] = (uint32_t)r->prompt[i];
	m.id = r->reg.id;
	m.tokens = toks;
	m.n_tokens = r->n_prompt;
	m.pages = pages;
	m.n_pages = r->n_prefix;
	m.max_tokens = r->max_tokens;
	m.temperature = r->sp.temperature;
	m.top_k = r->sp.top_k;
	m.top_p = r->sp.top_p;
	m.seed = r->sp.seed;
	rc = peer_send(r->peer, &m);
	free(pages);
	free(toks);
	return rc;
}

/* Invariant 3 on the path: prompt + max_tokens must fit this node's and
 * the chosen peer's context and pool. True when r was refused. */
static bool decode_too_long(struct serve_req *r, const struct peer *p)
{
	struct serve *s = r->s;
	uint64_t need = (uint64_t)r->n_prompt + r->max_tokens;
	uint64_t lim = serve__own_limit(s);

	lim = KVD_MIN(lim, p->hello.context);
	lim = KVD_MIN(lim, p->hello.pool_tokens);
	if (need <= lim)
		return false;
	if (kvd_fault_fire(&s->fault, KVD_FAULT_SKIP_DECODE_ADMISSION)) {
		KVLOG_WARN(s->log, "fault",
			   "point=skip_decode_admission client_id=%llu need=%llu limit=%llu",
			   (unsigned long long)r->client_id,
			   (unsigned long long)need, (unsigned long long)lim);
		return false;
	}
	KVLOG_WARN(s->log, "admission_reject",
		   "client_id=%llu reason=prompt_too_long prompt_tokens=%u max_tokens=%u need=%llu limit=%llu context=%u pool_tokens=%llu peer=%s peer_context=%llu peer_pool_tokens=%llu",
		   (unsigned long long)r->client_id, r->n_prompt,
		   r->max_tokens, (unsigned long long)need,
		   (unsigned long long)lim,
		   s->d->cap.advertised_context,
		   (unsigned long long)s->d->cap.pool_tokens,
		   KVLOG_Q(p->addr),
		   (unsigned long long)p->hello.context,
		   (unsigned long long)p->hello.pool_tokens);
	s->d->counters.rejected[KVD_REJECT_PROMPT_TOO_LONG]++;
	dreq_fail(r, PROTO_ERR_PROMPT_TOO_LONG,
		  "prompt (%u tokens) + max_tokens (%u) = %llu exceeds the smallest context or KV pool on the path (%llu tokens)",
		  r->n_prompt, r->max_tokens, (unsigned long long)need,
		  (unsigned long long)lim);
	return true;
}

/* Reserve the table and fence the prefix; false (r failed) when not. */
static enum dreq_event decode_reserve(struct serve_req *r)
{
	struct serve *s = r->s;
	struct kvpool *pool = s->d->pool;
	uint64_t need = (uint64_t)r->n_prompt + r->max_tokens;
	int rc;

	r->n_table = kvpool_pages_for(pool, need - 1);
	r->n_prefix = kvpool_pages_for(pool, r->n_prompt);
	r->table = calloc(r->n_table, sizeof(*r->table));
	r->rx.got = calloc(r->n_prefix, 1);
	if (!r->table || !r->rx.got) {
		dreq_fail(r, PROTO_ERR_INTERNAL, "out of memory");
		return DEV_REFUSE;
	}
	rc = kvpool_reserve(pool, r->reg.id, r->n_table, r->table);
	if (rc) {
		s->d->counters.rejected[KVD_REJECT_OVERLOADED]++;
		dreq_fail(r, rc == KVPOOL_E_FULL ? PROTO_ERR_OVERLOADED : PROTO_ERR_INTERNAL,
			  "the KV pool cannot reserve %u pages now", r->n_table);
		return DEV_REFUSE;
	}
	r->pages_held = true;
	/* an in-flight transfer may write the prefix: fence it (invariant 2);
	 * a pool that refuses is a breach, and the pages go to quarantine */
	rc = kvpool_fill_begin(pool, r->reg.id, r->table, r->n_table);
	if (!rc)
		rc = kvpool_fence(pool, r->reg.id, r->table, r->n_prefix);
	if (rc) {
		KVLOG_ERR(s->log, "invariant_breach", "id=%llu op=fence code=%d pages=%u",
			  (unsigned long long)r->reg.id, rc, r->n_table);
		dreq_fail(r, PROTO_ERR_INTERNAL, "the KV pool refused to fence the request's pages");
		r->fence_failed = true;
		return DEV_BREACH;
	}
	r->fenced = true;
	return DEV_ADMIT;
}

void serve__decode_admit(struct serve_req *r)
{
	struct serve *s = r->s;
	struct peer *p = decode_pick_peer(s);
	enum dreq_event ev;
	int rc;

	r->rops = &dreq_decode_ops;
	if (!p) {
		s->d->counters.rejected[KVD_REJECT_NO_PEER]++;
		dreq_fail(r, PROTO_ERR_NO_PREFILL_PEER, "no healthy prefill peer is connected");
		serve__dreq_event(r, DEV_REFUSE);
		return;
	}
	if (decode_too_long(r, p)) {
		serve__dreq_event(r, DEV_REFUSE);
		return;
	}
	/* admitted: now, and only now, pages */
	serve__req_register(r);
	ev = decode_reserve(r);
	if (ev == DEV_ADMIT) {
		r->peer = p;
		p->outstanding++;
	}
	serve__dreq_event(r, ev);
	if (ev != DEV_ADMIT)
		return;
	rc = decode_send_request(r);
	if (rc) {
		dreq_fail(r, PROTO_ERR_INTERNAL, "cannot send the prefill request: %s",
			  strerror(-rc));
		serve__dreq_event(r, DEV_SEND_FAIL);
		return;
	}
	KVLOG_DEBUG(s->log, "prefill_sent",
		    "id=%llu client_id=%llu peer=%s prompt_tokens=%u pages=%u prefix_pages=%u",
		    (unsigned long long)r->reg.id, (unsigned long long)r->client_id,
		    KVLOG_Q(p->addr), r->n_prompt, r->n_table, r->n_prefix);
}

/* ---- receiving KV ----------------------------------------------------------- */

static struct serve_req *decode_req_of(struct peer *p, uint64_t id)
{
	struct serve_req *r = serve__req_find(p->s, id);

	if (!r || r->kind != SREQ_DECODE || r->peer != p)
		return NULL;
	return r;
}

/* The request's reservation as net/xfer_check.h sees it: every entry of
 * a batch is checked against it, and the K/V it carries for finiteness
 * in the pool's page layout. */
static void decode_rx_req(const struct serve_req *r, struct xfer_check_req *q)
{
	const struct kvpool_geom *g = kvpool_geom(r->s->d->pool);

	*q = (struct xfer_check_req){
		.table = r->table, .n_prefix = r->n_prefix,
		.n_prompt = r->n_prompt, .page_tokens = g->page_tokens, .kv = g,
	};
}

/* Write an accepted batch's pages; a failure fails r (BAD). */
static bool decode_rx_write(struct serve_req *r, const struct xfer_hdr *h,
			    const uint8_t *batch)
{
	struct serve *s = r->s;
	const struct kvmem *mem = &s->d->mem;

	for (uint32_t i = 0; i < h->n_entries; i++) {
		struct xfer_entry e;
		void *dst;

		xfer_batch_entry(batch, i, &e);
		dst = kvpool_page_addr(s->d->pool, e.dst_page);
		if (!dst || mem->ops->write(mem->ctx, dst, xfer_batch_page(batch, h, i),
					    s->page_bytes)) {
			dreq_fail(r, PROTO_ERR_INTERNAL, "cannot write a received page");
			return false;
		}
		/* Invariant 10: zero-fill the positions the page does not
		 * hold (xfer_check_batch matched e.tokens to our own
		 * count); never rely on the sender having cleared them. */
		if (kvpool_zero_tail(s->d->pool, r->reg.id, &r->table[e.index],
				     e.tokens)) {
			dreq_fail(r, PROTO_ERR_INTERNAL,
				  "cannot clear the tail of a received page");
			return false;
		}
	}
	return true;
}

static void peer_rx_batch(void *arg, const struct xfer_hdr *h,
			  const uint8_t *batch)
{
	struct peer *p = arg;
	struct serve *s = p->s;
	struct serve_req *r = decode_req_of(p, h->request_id);
	struct xfer_check_req q;
	struct xfer_check_refusal ref;

	if (!r || r->state != DRS_TRANSFER) {
		/* dreq: ABORTING ignores batches (they are not written) */
		KVLOG_DEBUG(s->log, "batch_discarded", "id=%llu seq=%u peer=%s",
			    (unsigned long long)h->request_id, h->seq,
			    KVLOG_Q(p->addr));
		return;
	}
	/* every entry checked before any page is written; on accept the
	 * pages count as arrived (a write failure below fails r anyway) */
	decode_rx_req(r, &q);
	if (xfer_check_batch(&q, &r->rx, h, batch, &ref)) {
		dreq_fail(r, PROTO_ERR_INTEGRITY, "%s", ref.why);
		serve__dreq_event(r, DEV_BAD);
		return;
	}
	if (!decode_rx_write(r, h, batch)) {
		serve__dreq_event(r, DEV_BAD);
		return;
	}
	serve__dreq_event(r, DEV_BATCH);
	decode_try_complete(r);
}

/* A batch failed its checksum (or came without one): its header is as
 * untrustworthy as its pages, so the id it names may be an innocent
 * request's and the real victim's pages may be anywhere in the stream.
 * The data stream as a whole is broken: every transfer on this peer fails
 * with INTEGRITY and both connections are torn down, which also ends any
 * write into their pages (invariants 2, 7). */
static void peer_rx_bad(void *arg, int code, const struct xfer_hdr *h)
{
	struct peer *p = arg;
	bool auth = code == XFER_E_AUTH;

	KVLOG_WARN(p->s->log, "batch_checksum",
		   "peer=%s claimed_id=%llu seq=%u error=%s",
		   KVLOG_Q(p->addr),
		   (unsigned long long)h->request_id, h->seq, xfer_strerror(code));
	if (auth)
		p->s->d->counters.peer_auth_failures++;
	if (!peer_lost_code(p, auth ? "a KV batch failed authentication" :
				      "a KV batch failed its checksum",
			    PROTO_ERR_INTEGRITY,
			    auth ? "a KV batch on the prefill peer's data connection failed authentication; no token was produced from it" :
				   "a KV batch on the prefill peer's data connection failed its checksum; no token was produced from it"))
		p->s->d->counters.integrity_failures++;
}

static void peer_rx_closed(void *arg, int status)
{
	struct peer *p = arg;

	peer_lost(p, status == -ECONNRESET ? "data connection cut mid-batch"
					   : "data connection closed");
}

/* Fault point retag_ready: after mark_ready, give the first prefix page
 * another owner's tag, so only the engine's own check can catch it. */
static void decode_fault_retag(struct serve_req *r)
{
	struct serve *s = r->s;
	const struct kvmem *mem = &s->d->mem;
	uint32_t pt = kvpool_geom(s->d->pool)->page_tokens;
	struct kvtag tag;
	void *dst;

	if (!r->n_prefix || !kvd_fault_fire(&s->fault, KVD_FAULT_RETAG_READY))
		return;
	dst = kvpool_page_addr(s->d->pool, r->table[0].page);
	kvtag_make(&tag, r->reg.id + 1, r->table[0].gen, r->table[0].page, 0,
		   KVD_MIN(pt, r->n_prompt));
	KVLOG_WARN(s->log, "fault", "point=retag_ready id=%llu page=%u",
		   (unsigned long long)r->reg.id, r->table[0].page);
	if (dst)
		(void)mem->ops->write(mem->ctx, dst, &tag, sizeof(tag));
}

/* Which of the COVERED events the completed transfer is: the tags are
 * checked in page memory (kvpool_mark_ready), then the first token and
 * the client decide how it goes on. */
static enum dreq_event decode_covered_event(struct serve_req *r)
{
	struct serve *s = r->s;
	int rc = kvpool_mark_ready(s->d->pool, r->reg.id, r->table, r->n_prefix,
				   r->n_prompt);

	if (rc) {
		/* every batch is in and passed its checksum and entry checks,
		 * yet a tag is wrong: whoever wrote the prefix cannot be
		 * trusted, so its pages never go back to the free list
		 * (invariants 1, 2); the rest of the table was never written */
		dreq_fail(r, PROTO_ERR_INTEGRITY, "the received KV failed the %s check (pool error %d)",
			  rc == KVPOOL_E_COVERAGE ? "coverage" : "tag", rc);
		return DEV_TAG_BAD;
	}
	decode_fault_retag(r);
	KVLOG_DEBUG(s->log, "transfer_done", "id=%llu batches=%u pages=%u tokens=%u",
		    (unsigned long long)r->reg.id, r->rx.batches, r->rx.n_got,
		    r->n_prompt);
	if (!r->client)
		return DEV_COVERED_ORPHAN;   /* complete; now release */
	if (serve__client_stream_begin(r)) {
		dreq_fail(r, PROTO_ERR_INTERNAL, "out of memory");
		return DEV_COVERED_FAIL;
	}
	if ((int32_t)r->first_token == s->model->eos_id || r->max_tokens == 1) {
		snprintf(r->finish_reason, sizeof(r->finish_reason), "%s",
			 (int32_t)r->first_token == s->model->eos_id ? "stop" : "length");
		return DEV_COVERED_FINAL;
	}
	return DEV_COVERED;
}

/* All batches in and prefill_done seen: check coverage, mark ready. */
static void decode_try_complete(struct serve_req *r)
{
	struct xfer_check_done done = { .tokens = r->done_tokens,
					.pages = r->done_pages,
					.batches = r->done_batches };
	struct xfer_check_req q;
	char why[200];
	int rc;

	if (r->ended || r->state != DRS_TRANSFER || !r->done_seen)
		return;
	decode_rx_req(r, &q);
	rc = xfer_check_coverage(&q, &r->rx, &done, why, sizeof(why));
	if (rc == XFER_CHECK_PENDING)
		return;
	if (rc) {
		dreq_fail(r, PROTO_ERR_INTEGRITY, "%s", why);
		serve__dreq_event(r, DEV_BAD);
		return;
	}
	serve__dreq_event(r, decode_covered_event(r));
}

/* ---- control messages from prefill ------------------------------------------ */

static void peer_on_reject(struct peer *p, const struct proto_peer_msg *m)
{
	struct serve *s = p->s;
	struct serve_req *r = decode_req_of(p, m->id);

	if (!r)
		return;
	if (r->state == DRS_TRANSFER) {
		KVLOG_WARN(s->log, "prefill_rejected",
			   "id=%llu client_id=%llu peer=%s code=%s msg=%s",
			   (unsigned long long)r->reg.id,
			   (unsigned long long)r->client_id, KVLOG_Q(p->addr),
			   proto_err_name(m->code), KVLOG_Q(m->message));
		if (m->code == PROTO_ERR_PROMPT_TOO_LONG)
			s->d->counters.rejected[KVD_REJECT_PROMPT_TOO_LONG]++;
		dreq_fail(r, m->code, "%s", m->message);
	}
	/* prefill computed and sent nothing: release at once */
	serve__dreq_event(r, DEV_REJECT);
}

static void peer_on_done(struct peer *p, const struct proto_peer_msg *m)
{
	struct serve_req *r = decode_req_of(p, m->id);

	if (!r || r->state != DRS_TRANSFER) {
		if (r)
			serve__dreq_event(r, DEV_PREFILL_DONE);   /* late: ignored */
		return;
	}
	r->done_seen = true;
	r->first_token = m->first_token;
	r->done_tokens = m->done_tokens;
	r->done_batches = m->batches;
	r->done_pages = m->done_pages;
	if (m->first_token >= tokenizer_n_vocab(p->s->tok)) {
		dreq_fail(r, PROTO_ERR_INTEGRITY,
			  "prefill sent a first token outside the vocabulary");
		serve__dreq_event(r, DEV_BAD);
		return;
	}
	serve__dreq_event(r, DEV_PREFILL_DONE);
	decode_try_complete(r);
}

static void peer_on_abort(struct peer *p, const struct proto_peer_msg *m)
{
	struct serve_req *r = decode_req_of(p, m->id);

	if (!r) {
		/* nothing of it here any more: the ack is all prefill needs */
		struct proto_peer_msg ack = { .type = PEER_MSG_ABORT_ACK, .id = m->id };

		(void)peer_send(p, &ack);
		return;
	}
	/* prefill gives up: its batches for r have left, and decode writes
	 * nothing for a request it no longer holds */
	dreq_fail(r, m->code ? m->code : PROTO_ERR_INTERNAL, "%s",
		  m->message[0] ? m->message : "prefill aborted the request");
	serve__dreq_event(r, DEV_PEER_ABORT);
}

static void peer_on_msg(struct peer *p, const struct proto_peer_msg *m)
{
	struct serve_req *r;

	switch (m->type) {
	case PEER_MSG_HEARTBEAT:
		p->load = m->load;
		return;
	case PEER_MSG_DATA_BOUND:
		peer_data_bound(p);
		return;
	case PEER_MSG_PREFILL_REJECT:
		peer_on_reject(p, m);
		return;
	case PEER_MSG_PREFILL_DONE:
		peer_on_done(p, m);
		return;
	case PEER_MSG_ABORT:
		peer_on_abort(p, m);
		return;
	case PEER_MSG_ABORT_ACK:
		r = decode_req_of(p, m->id);
		if (r)
			serve__dreq_event(r, DEV_ABORT_ACK);
		return;
	default:
		KVLOG_WARN(p->s->log, "peer_protocol", "peer=%s msg=\"unexpected %s\"",
			   KVLOG_Q(p->addr), proto_peer_type_name(m->type));
		return;
	}
}

/* ---- peer connections ------------------------------------------------------- */

/* The daemon's view of the prefill peers that completed a handshake. */
static void peer_figures_update(struct serve *s)
{
	struct kvd_peer_figures pf = { 0 };

	for (unsigned i = 0; i < s->n_peers; i++) {
		const struct peer *q = &s->peers[i];

		if (!q->hello_seen || q->closing)
			continue;
		serve__figures_add(&pf, &q->hello);
	}
	s->d->peers = pf;
}

static void peer_log_capacity(struct peer *p)
{
	struct serve *s = p->s;
	uint64_t own = serve__own_limit(s);
	uint64_t path = KVD_MIN(own, KVD_MIN(p->hello.context, p->hello.pool_tokens));

	peer_figures_update(s);
	kvd_daemon_capacity(s->d, "peer", NULL);
	KVLOG_INFO(s->log, "peer_capacity",
		   "peer=%s peer_node=%s peer_role=%s peer_pool_tokens=%llu peer_context=%llu own_context=%u own_pool_tokens=%llu path_limit=%llu verdict=%s",
		   KVLOG_Q(p->addr), KVLOG_Q(p->hello.node),
		   KVLOG_Q(p->hello.role),
		   (unsigned long long)p->hello.pool_tokens,
		   (unsigned long long)p->hello.context,
		   s->d->cap.advertised_context,
		   (unsigned long long)s->d->cap.pool_tokens,
		   (unsigned long long)path,
		   p->hello.pool_tokens >= p->hello.context ? "ok" : "peer_pool_smaller_than_context");
}

static void peer_data_connected(uv_connect_t *req, int status)
{
	struct peer *p = req->data;
	struct proto_peer_msg m = { .type = PEER_MSG_DATA };
	int rc;

	if (status < 0 || p->closing || !p->data) {
		if (!p->closing)
			peer_lost(p, "data connection failed");
		return;
	}
	/* the token: derived from the link's keys, or (keyless) the random
	 * one prefill sent in its hello */
	memcpy(m.token, p->sealed ? p->ss.token : p->hello.session, PEER_AUTH_BYTES);
	rc = serve__send_peer(transport_tcp_stream(p->data), NULL, &m);
	if (!rc)
		rc = transport_tcp_start(p->data, true);
	if (rc) {
		peer_lost(p, "data connection setup failed");
		return;
	}
	/* up once prefill says it bound the data connection (data_bound) */
}

static void peer_data_bound(struct peer *p)
{
	if (p->up || !p->data)
		return;
	p->up = true;
	p->last_heard_ns = kvd_now_ns();
	KVLOG_INFO(p->s->log, "peer_up",
		   "peer=%s node=%s max_batch_bytes=%llu checksum=%s transport=tcp",
		   KVLOG_Q(p->addr), KVLOG_Q(p->hello.node),
		   (unsigned long long)p->max_batch_bytes,
		   p->hello.checksum || p->s->d->cfg.checksum ? "on" : "off");
	peer_log_capacity(p);
}

static void peer_on_hello(struct peer *p, const struct proto_peer_msg *m)
{
	struct serve *s = p->s;
	struct transport_cfg tc = { 0 };
	struct sockaddr_storage ss;
	char field[32], why[200];
	int rc;

	if (proto_peer_hello_match(&s->my_hello, &m->hello, field, sizeof(field),
				   why, sizeof(why)) ||
	    strcmp(m->hello.role, "prefill") || (!p->sealed && !m->hello.has_session)) {
		if (!field[0] || strcmp(m->hello.role, "prefill"))
			snprintf(field, sizeof(field), "role");
		KVLOG_ERR(s->log, "peer_refused", "peer=%s field=%s msg=%s",
			  KVLOG_Q(p->addr), field,
			  KVLOG_Q(strcmp(m->hello.role, "prefill")
				  ? "the peer is not a prefill node" : why));
		peer_lost(p, "handshake refused");
		return;
	}
	p->hello = m->hello;
	p->hello_seen = true;
	frame_decoder_set_max(&p->dec, SERVE_PEER_FRAME_MAX);
	p->max_batch_bytes = KVD_MIN(s->d->cfg.max_batch_bytes, m->hello.max_batch_bytes);
	tc.pool = s->d->pool;
	tc.mem = &s->d->mem;
	tc.page_bytes = s->page_bytes;
	tc.checksum_ns = &s->d->counters.checksum_ns;
	tc.max_batch_bytes = p->max_batch_bytes;
	tc.checksum = s->d->cfg.checksum || m->hello.checksum;
	tc.seal = p->sealed ? &p->ss.data : NULL;
	tc.fault = &s->fault;
	tc.log = s->log;
	tc.recv = (struct transport_recv){ peer_rx_batch, peer_rx_bad, peer_rx_closed };
	tc.recv_arg = p;
	rc = transport_tcp_new(&p->data, &s->d->loop, &tc);
	if (rc) {
		KVLOG_ERR(s->log, "peer_refused",
			  "peer=%s field=max_batch_bytes msg=\"a %llu-byte page does not fit in a %llu-byte batch\"",
			  KVLOG_Q(p->addr), (unsigned long long)s->page_bytes,
			  (unsigned long long)p->max_batch_bytes);
		p->data = NULL;
		peer_lost(p, "transport");
		return;
	}
	p->data->data = p;
	serve__parse_hostport(p->addr, &ss);
	p->data_req.data = p;
	rc = uv_tcp_connect(&p->data_req, (uv_tcp_t *)transport_tcp_stream(p->data),
			    (struct sockaddr *)&ss, peer_data_connected);
	if (rc)
		peer_lost(p, "data connect");
}

static void peer_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf)
{
	struct peer *p = h->data;

	(void)hint;
	*buf = uv_buf_init(p->rbuf, sizeof(p->rbuf));
}

/* A prefill peer refused us (bare: a reason word, maybe ":field"). */
static void peer_on_refused(struct peer *p, const struct proto_peer_msg *m)
{
	char reason[sizeof(m->reason)];
	char *field;

	snprintf(reason, sizeof(reason), "%s", m->reason);
	field = strchr(reason, ':');
	if (field)
		*field++ = '\0';
	KVLOG_ERR(p->s->log, "peer_refused", "peer=%s by=peer reason=%s field=%s",
		  KVLOG_Q(p->addr),
		  KVLOG_Q(reason),
		  KVLOG_Q(field ? field : ""));
	peer_lost(p, "refused by the peer");
}

/* auth_challenge: prefill's nonce; prove we hold the key. */
static void peer_on_challenge(struct peer *p, const struct proto_peer_msg *m)
{
	struct proto_peer_msg pr = { .type = PEER_MSG_AUTH_PROOF };

	memcpy(p->nonce_p, m->nonce, PEER_AUTH_BYTES);
	peer_auth_proof(&p->s->key, PEER_SIDE_DECODE, p->nonce_d, p->nonce_p, pr.proof);
	p->auth_phase = PEER_AUTH_PROOF;
	if (peer_send(p, &pr))
		peer_lost(p, "control setup");
}

/* Prefill's proof: only now is it a peer. Derive the link's keys, seal
 * everything from here on, and say hello. */
static void peer_on_proof(struct peer *p, const struct proto_peer_msg *m)
{
	struct serve *s = p->s;
	struct proto_peer_msg h = { .type = PEER_MSG_HELLO };

	if (peer_auth_check(&s->key, PEER_SIDE_PREFILL, p->nonce_d, p->nonce_p,
			    m->proof)) {
		s->d->counters.peer_auth_failures++;
		KVLOG_ERR(s->log, "peer_refused",
			  "peer=%s reason=auth_failed msg=\"the prefill peer did not prove it holds the cluster key\"",
			  KVLOG_Q(p->addr));
		peer_lost(p, "authentication failed");
		return;
	}
	peer_session_derive(&p->ss, &s->key, PEER_SIDE_DECODE, p->nonce_d,
			    p->nonce_p, s->d->cfg.encrypt);
	frame_decoder_set_opener(&p->dec, peer_frame_open, &p->ss.rx);
	p->sealed = true;
	frame_decoder_set_max(&p->dec, SERVE_PEER_FRAME_MAX);
	p->auth_phase = PEER_AUTH_HELLO;
	h.hello = s->my_hello;
	if (peer_send(p, &h))
		peer_lost(p, "control setup");
}

/* One control message from a prefill peer: the proofs (keyed links),
 * the hello, then the rest. Each phase accepts one message type. */
static void peer_dispatch(void *arg, struct proto_peer_msg *m)
{
	struct peer *p = arg;

	if (p->hello_seen) {
		peer_on_msg(p, m);
		return;
	}
	if (m->type == PEER_MSG_REFUSED) {
		peer_on_refused(p, m);
		return;
	}
	if (p->auth_phase == PEER_AUTH_CHALLENGE && m->type == PEER_MSG_AUTH_CHALLENGE)
		peer_on_challenge(p, m);
	else if (p->auth_phase == PEER_AUTH_PROOF && m->type == PEER_MSG_AUTH_PROOF)
		peer_on_proof(p, m);
	else if (p->auth_phase == PEER_AUTH_HELLO && m->type == PEER_MSG_HELLO)
		peer_on_hello(p, m);
	else
		peer_lost(p, "unexpected message during the handshake");
}

static void peer_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
	struct peer *p = st->data;
	const char *why;

	if (nread < 0) {
		peer_lost(p, "control connection closed");
		return;
	}
	p->last_heard_ns = kvd_now_ns();
	why = serve__peer_feed(p->s, p->addr, &p->dec, buf->base,
			       nread > 0 ? (size_t)nread : 0, &p->closing,
			       peer_dispatch, p);
	if (why)
		peer_lost(p, why);
}

static void peer_connected(uv_connect_t *req, int status)
{
	struct peer *p = req->data;
	struct proto_peer_msg m = { .type = PEER_MSG_HELLO };

	if (p->closing)
		return;
	if (status < 0) {
		KVLOG_DEBUG(p->s->log, "peer_connect", "peer=%s msg=%s",
			    KVLOG_Q(p->addr), KVLOG_Q(uv_strerror(status)));
		peer_lost(p, NULL);
		return;
	}
	if (p->s->key.set) {
		/* keyed: prove first; nothing about us before the peer has */
		m.type = PEER_MSG_AUTH_HELLO;
		m.version = PROTO_PEER_VERSION;
		peer_auth_random(p->nonce_d);
		memcpy(m.nonce, p->nonce_d, PEER_AUTH_BYTES);
		p->auth_phase = PEER_AUTH_CHALLENGE;
	} else {
		m.hello = p->s->my_hello;
		p->auth_phase = PEER_AUTH_HELLO;
	}
	if (wbound_read_start(&p->wb) || peer_send(p, &m))
		peer_lost(p, "control setup");
}

static void peer_retry_cb(uv_timer_t *t)
{
	struct peer *p = t->data;

	if (!p->s->stopping && !p->closing && !p->ctl_open)
		peer_connect(p);
}

static void peer_handle_closed(uv_handle_t *h)
{
	struct peer *p = h->data;

	p->s->closes_pending--;
	if (--p->pending_closes)
		return;
	p->closing = false;
	frame_decoder_deinit(&p->dec);
	if (!p->s->stopping && p->retry_open)
		uv_timer_start(&p->retry, peer_retry_cb, PEER_RETRY_MS, 0);
}

static void peer_data_closed(struct transport *t)
{
	struct peer *p = t->data;

	t->ops->free(t);
	p->s->closes_pending--;
	if (--p->pending_closes)
		return;
	p->closing = false;
	frame_decoder_deinit(&p->dec);
	if (!p->s->stopping && p->retry_open)
		uv_timer_start(&p->retry, peer_retry_cb, PEER_RETRY_MS, 0);
}

/* Tear both connections down; every transfer on this peer fails with
 * `code` and `msg`, and since nothing can write for them any more, their
 * pages are unfenced. Returns how many transfers failed. */
static unsigned peer_lost_code(struct peer *p, const char *why, int code,
			       const char *msg)
{
	struct serve *s = p->s;
	struct serve_req *r, *next;
	unsigned n = 0;

	if (p->closing || !p->ctl_open)
		return 0;
	if (why)
		KVLOG_WARN(s->log, "peer_down", "peer=%s msg=%s was_up=%d",
			   KVLOG_Q(p->addr), KVLOG_Q(why), p->up);
	p->closing = true;
	p->up = false;
	p->hello_seen = false;
	/* the keys stay until the transport (which holds ss.data) has
	 * closed; the next connect derives new ones */
	p->sealed = false;
	peer_figures_update(s);
	p->ctl_open = false;
	p->pending_closes = 1;
	s->closes_pending++;
	p->ctl.data = p;
	uv_close((uv_handle_t *)&p->ctl, peer_handle_closed);
	if (p->data) {
		p->pending_closes++;
		s->closes_pending++;
		transport_close(p->data, peer_data_closed);
		p->data = NULL;
	}
	for (r = s->reqs; r; r = next) {
		next = r->next;
		if (r->kind != SREQ_DECODE || r->peer != p)
			continue;
		if (r->state == DRS_TRANSFER) {
			dreq_fail(r, code, "%s", msg);
			n++;
		}
		serve__dreq_event(r, DEV_LINK_LOST);
	}
	return n;
}

static void peer_lost(struct peer *p, const char *why)
{
	(void)peer_lost_code(p, why, PROTO_ERR_INTERNAL,
			     "the prefill peer was lost during the transfer");
}

static void peer_connect(struct peer *p)
{
	struct serve *s = p->s;
	struct sockaddr_storage ss;
	int rc;

	if (serve__parse_hostport(p->addr, &ss)) {
		KVLOG_ERR(s->log, "peer_address", "peer=%s msg=\"bad address\"",
			  KVLOG_Q(p->addr));
		return;
	}
	if (uv_tcp_init(&s->d->loop, &p->ctl)) {
		/* nothing to close: try again later, or never reconnect */
		if (!s->stopping && p->retry_open)
			uv_timer_start(&p->retry, peer_retry_cb, PEER_RETRY_MS, 0);
		return;
	}
	p->ctl.data = p;
	p->ctl_open = true;
	p->wb_dead = false;
	wbound_init(&p->wb, (uv_stream_t *)&p->ctl, &(struct wbound_limits){
			    .soft = s->d->cfg.write_queue_soft,
			    .hard = s->d->cfg.write_queue_hard,
			    .stall_ms = s->d->cfg.write_stall_timeout_ms },
		    peer_alloc, peer_read);
	uv_tcp_nodelay(&p->ctl, 1);
	frame_decoder_init(&p->dec, SERVE_PEER_HANDSHAKE_FRAME_MAX);
	p->conn_req.data = p;
	p->last_heard_ns = p->t_connect_ns = kvd_now_ns();
	rc = uv_tcp_connect(&p->conn_req, &p->ctl, (struct sockaddr *)&ss,
			    peer_connected);
	if (rc)
		peer_lost(p, NULL);
}

int serve__decode_start(struct serve *s)
{
	for (unsigned i = 0; i < s->d->cfg.n_peers_prefill && i < KVD_MAX_PEERS; i++) {
		struct peer *p = &s->peers[i];

		p->s = s;
		snprintf(p->addr, sizeof(p->addr), "%s", s->d->cfg.peers_prefill[i]);
		if (uv_timer_init(&s->d->loop, &p->retry))
			return -ENOMEM;
		p->retry.data = p;
		p->retry_open = true;
		s->n_peers++;
		peer_connect(p);
	}
	return 0;
}

void serve__decode_heartbeat(struct serve *s)
{
	uint64_t now = kvd_now_ns();
	uint64_t dead_ns = 3ull * s->d->cfg.heartbeat_ms * 1000000ull;

	for (unsigned i = 0; i < s->n_peers; i++) {
		struct peer *p = &s->peers[i];
		struct proto_peer_msg m = { .type = PEER_MSG_HEARTBEAT };
		struct kvpool_stats st;

		if (!p->ctl_open || p->closing || peer_write_check(p, now))
			continue;
		if (!p->up && now - p->t_connect_ns >
			      (uint64_t)s->d->cfg.connect_timeout_ms * 1000000ull) {
			peer_lost(p, "connect timeout");
			continue;
		}
		if (p->up && now - p->last_heard_ns > dead_ns) {
			peer_lost(p, p->up ? "three heartbeats missed" : "connect timeout");
			continue;
		}
		if (!p->up)
			continue;
		kvpool_get_stats(s->d->pool, &st);
		m.load = p->outstanding;
		m.free_tokens = (uint64_t)st.by_state[KVPAGE_FREE] * st.page_tokens;
		(void)peer_send(p, &m);
	}
}

static void peer_retry_closed(uv_handle_t *h)
{
	struct peer *p = h->data;

	p->s->closes_pending--;
}

void serve__decode_stop(struct serve *s)
{
	for (unsigned i = 0; i < s->n_peers; i++) {
		struct peer *p = &s->peers[i];

		peer_lost(p, NULL);
		if (p->retry_open) {
			p->retry_open = false;
			s->closes_pending++;
			uv_close((uv_handle_t *)&p->retry, peer_retry_closed);
		}
	}
}
