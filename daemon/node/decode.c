/* decode.c - decode: decode requests (the dreq machine), KV reception, coverage.
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
 * Peers: decode dials every peers.prefill address through daemon/node/link.c
 * (hellos must match - model, KV dtype, layout - then the data
 * connection, then heartbeats) and registers struct link_ops (control
 * messages, a lost link, received batches). It picks the up peer with the
 * fewest requests in flight (its own count plus the peer's reported load);
 * a later choice of an HTTP n > 1 request goes to its choice 0's peer,
 * whose prefix cache holds the prompt (decode_sibling_peer).
 * With peers.local_prefill set it may instead compute a prompt itself,
 * when that is the shorter wait (daemon/node/place.h); such a request runs as a
 * standalone one, with no peer, transfer or lent page.
 */
#include "daemon/node/serve_int.h"
#include "gpu/errors.h"
#include "net/errors.h"
#include "conf/util.h"
#include "net/verbs/verbs_scope.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void decode_try_complete(struct serve_req *r);
static void dreq_retry(struct serve_req *r);

/* ---- the decode request machine (daemon/node/machine.h: dreq) -------------------- */

/* The first failure of a request is the one its client hears about; an
 * integrity failure is counted once per request, by what caught it
 * (enum kvd_integrity_kind; dreq_fail: the peer reported it). */
#define dreq_fail_kind(r, code, kind, ...)                                   \
	do {                                                                 \
		if (serve__req_fail((r), (code), __VA_ARGS__) &&             \
		    (code) == PROTO_ERR_INTEGRITY) {                         \
			(r)->s->d->counters.integrity_failures++;            \
			kvd_metrics_integrity(&(r)->s->d->metrics, (kind));  \
		}                                                            \
	} while (0)
#define dreq_fail(r, code, ...)                                              \
	dreq_fail_kind(r, code, KVD_INTEGRITY_PEER, __VA_ARGS__)

/* verbs: take the request's write scope back before its pages change
 * hands (released, quarantined, marked ready). Registrations: the peer's
 * NIC writes are refused from here on (true). Windows: the invalidations
 * are posted (false until their completions came, scope_dead) and the
 * transport holds a fence on every page of the scope until then - so a
 * release or quarantine right after leaves them FENCED, out of the free
 * list, and needs no wait of its own (event=release_waited_revoke says
 * how long they waited); only a check of their bytes must wait
 * (SEALING). Nothing to do on tcp, or once the link is gone (its
 * transport revoked everything when it closed). */
static bool dreq_revoke(struct serve_req *r)
{
	if (r->link && r->link->data && transport_is_verbs(r->link->data))
		return transport_verbs_revoke(r->link->data, r->reg.id);
	return true;
}

/* A pool call on pages this request holds failed: the pool and the
 * request disagree about who owns what, so nothing of the table may go
 * back to the free list (invariant 2). */
static void dreq_breach(struct serve_req *r, const char *what, int rc)
{
	struct sreq_decode *dp = sreq_d(r);
	struct serve *s = r->s;

	dreq_revoke(r);
	KVLOG_ERR(s->log, "invariant_breach", "id=%llu tenant=%s op=%s code=%d pages=%u",
		  (unsigned long long)r->reg.id, KVLOG_Q(r->tenant), what, rc, dp->n_table);
	/* a quarantine the pool refuses too leaves the pages where they
	 * are, which is still out of the free list: the request lets go of
	 * them either way, and never releases them */
	if (dp->pages_held &&
	    kvpool_quarantine(s->d->pool, r->reg.id, dp->table, dp->n_table))
		KVLOG_ERR(s->log, "invariant_breach", "id=%llu tenant=%s op=quarantine pages=%u msg=\"left where they are\"",
			  (unsigned long long)r->reg.id, KVLOG_Q(r->tenant), dp->n_table);
	dp->pages_held = false;
	dp->fenced = false;
	dreq_fail(r, PROTO_ERR_INTERNAL, "the KV pool refused an operation on this request's pages");
}

static void dreq_release(struct serve_req *r)
{
	struct sreq_decode *dp = sreq_d(r);
	int rc;

	if (!dp->pages_held)
		return;
	dreq_revoke(r);
	rc = kvpool_release(r->s->d->pool, r->reg.id, dp->table, dp->n_table);
	if (rc) {
		dreq_breach(r, "release", rc);
		return;
	}
	dp->pages_held = false;
}

static void dreq_unfence(struct serve_req *r)
{
	struct sreq_decode *dp = sreq_d(r);
	struct serve *s = r->s;
	int rc;

	if (!dp->fenced)
		return;
	rc = kvpool_unfence(s->d->pool, r->reg.id, dp->table, dp->n_prefix);
	dp->fenced = false;
	if (rc) {
		dreq_breach(r, "unfence", rc);
		return;
	}
	/* how long the pages stayed fenced after an abort: the handshake's
	 * wait, measured (tests check it against a delayed ack) */
	if (dp->t_abort_ns)
		KVLOG_INFO(s->log, "abort_done", "id=%llu tenant=%s fenced_ms=%llu",
			   (unsigned long long)r->reg.id, KVLOG_Q(r->tenant),
			   (unsigned long long)((kvd_now_ns() - dp->t_abort_ns) / 1000000u));
}

/* The prefix was written by a writer we cannot trust: quarantine it,
 * release the rest of the table (never written by anyone). */
static void dreq_quarantine(struct serve_req *r, const char *reason)
{
	struct sreq_decode *dp = sreq_d(r);
	struct serve *s = r->s;
	int rc;

	if (!dp->pages_held)
		return;
	dreq_revoke(r);
	rc = kvpool_quarantine(s->d->pool, r->reg.id, dp->table, dp->n_prefix);
	if (!rc && dp->n_table > dp->n_prefix)
		rc = kvpool_release(s->d->pool, r->reg.id, dp->table + dp->n_prefix,
				    dp->n_table - dp->n_prefix);
	if (rc) {
		dreq_breach(r, "quarantine", rc);
		return;
	}
	dp->pages_held = false;
	KVLOG_WARN(s->log, "pages_quarantined", "id=%llu tenant=%s pages=%u reason=%s",
		   (unsigned long long)r->reg.id, KVLOG_Q(r->tenant), dp->n_prefix, reason);
}

static void dreq_send_abort(struct serve_req *r)
{
	struct sreq_decode *dp = sreq_d(r);
	struct serve *s = r->s;
	struct proto_peer_msg m = { .type = PEER_MSG_ABORT, .id = r->reg.id,
				    .code = r->fail_code };

	snprintf(m.message, sizeof(m.message), "%s", r->fail_msg);
	/* a lost send ends in the abort timer's teardown */
	serve__link_post(r->link, &m);
	dp->t_abort_ns = kvd_now_ns();
	KVLOG_INFO(s->log, "transfer_abort", "id=%llu tenant=%s peer=%s code=%s pages=%u fenced=%u",
		   (unsigned long long)r->reg.id, KVLOG_Q(r->tenant),
		   KVLOG_Q(r->link ? r->link->addr : "-"),
		   proto_err_name(r->fail_code), dp->n_table, dp->fenced ? dp->n_prefix : 0);
}

static void dreq_send(struct serve_req *r, enum proto_peer_type type)
{
	struct proto_peer_msg m = { .type = type, .id = r->reg.id };

	serve__link_post(r->link, &m);
}

static void dreq_timer_cb(uv_timer_t *t)
{
	struct serve_req *r = t->data;

	if (r->state == DRS_TRANSFER || r->state == DRS_SEALING)
		dreq_fail(r, PROTO_ERR_TIMEOUT, "%s",
			  sreq_d(r)->done_seen ? "the KV transfer did not complete within transfer.transfer_timeout_ms"
				       : "prefill did not complete within transfer.prefill_timeout_ms");
	serve__dreq_event(r, DEV_TIMEOUT);
}

/* No abort_ack within release_timeout_ms: tearing the link down is what
 * ends every write the peer could still make (LINK_LOST follows). */
static void dreq_teardown(struct serve_req *r)
{
	struct link *l = r->link;

	KVLOG_WARN(r->s->log, "abort_ack_timeout",
		   "id=%llu tenant=%s peer=%s msg=\"no abort_ack within release_timeout_ms; tearing the peer connection down\"",
		   (unsigned long long)r->reg.id, KVLOG_Q(r->tenant), KVLOG_Q(l ? l->addr : "-"));
	if (l)
		serve__link_lost(l, "abort_ack timeout");
}

/* A decode request whose sampling needs more than the prefill peer
 * samples with (temperature, top_k, top_p, seed: the peer protocol):
 * the peer's first token is ignored and the engine recomputes the last
 * prompt position over the received KV, then samples the first token
 * itself with the request's whole state (penalties, bias, min_p,
 * logprobs, response_format's grammar: the peer has none) - so a pair
 * answers as a standalone node does. */
static bool dreq_recompute(const struct serve_req *r)
{
	return r->kind == SREQ_DECODE &&
	       (sampler_params_extended(&r->sp) || r->jrun);
}

/* The recompute's submit: the received prompt's tags say n_prompt
 * positions; the engine verifies n_prompt - 1 and rewrites the last
 * position's page itself. The last page's tag is rewritten to the count
 * the engine checks (our own page, READY, after mark_ready verified it;
 * nothing else writes it: the transfer is complete). */
static int dreq_submit_recompute(struct serve_req *r)
{
	struct sreq_decode *dp = sreq_d(r);
	struct serve *s = r->s;
	uint32_t n_kv = r->n_prompt - 1, n_pages = kvpool_pages_for(s->d->pool, n_kv);
	int rc = 0;

	if (n_pages)
		rc = kvpool_tag_write_from(s->d->pool, r->reg.id, dp->table,
					   n_pages - 1, n_pages, n_kv);
	if (rc) {
		KVLOG_WARN(s->log, "recompute_retag_failed", "id=%llu tenant=%s rc=%d",
			   (unsigned long long)r->reg.id, KVLOG_Q(r->tenant), rc);
		return rc;
	}
	KVLOG_DEBUG(s->log, "decode_recompute", "id=%llu tenant=%s n_kv=%u",
		    (unsigned long long)r->reg.id, KVLOG_Q(r->tenant), n_kv);
	return serve__compute_submit(s, r, r->prompt, r->n_prompt, r->max_tokens,
				     false, dp->table, dp->n_table, n_kv);
}

/* Submit to the engine: a standalone request its prompt, a decode request
 * its prompt and first token over the received KV (or, dreq_recompute,
 * its prompt with the last position to compute). */
static void dreq_submit(struct serve_req *r)
{
	struct sreq_decode *dp = sreq_d(r);
	struct serve *s = r->s;
	bool lent = r->kind == SREQ_DECODE;
	int32_t *toks = NULL;
	int rc = -ENOMEM;

	if (dreq_recompute(r)) {
		rc = dreq_submit_recompute(r);
		if (rc > 0) {
			dreq_fail_kind(r, PROTO_ERR_INTEGRITY, KVD_INTEGRITY_TAG,
				       "the received KV could not be retagged (pool error %d)", rc);
			serve__dreq_event(r, DEV_SUBMIT_FAIL);
			return;
		}
	} else if ((toks = malloc(sizeof(int32_t) * (r->n_prompt + 1)))) {
		memcpy(toks, r->prompt, sizeof(int32_t) * r->n_prompt);
		toks[r->n_prompt] = (int32_t)dp->first_token;
		rc = serve__compute_submit(s, r, toks, r->n_prompt + lent,
					   r->max_tokens - lent, false,
					   lent ? dp->table : NULL,
					   lent ? dp->n_table : 0,
					   lent ? r->n_prompt : 0);
		free(toks);
	}
	if (rc) {
		dreq_fail(r, PROTO_ERR_INTERNAL, "out of memory");
		serve__dreq_event(r, DEV_SUBMIT_FAIL);
	}
}

/* cache.decode_reuse: a received prompt whose tags held (and that the
 * engine never found wrong) leaves its full pages in this node's prefix
 * cache, under its tenant and salt, for the next request that starts
 * with them (decode_place_cached). Done on the compute thread with the
 * release, after the engine let the pages go; without memory for the
 * prompt's copy they are released as before. */
static void decode_cache_received(struct serve_req *r)
{
	struct serve *s = r->s;
	uint32_t pt = kvpool_geom(s->d->pool)->page_tokens;
	struct pcache_key key;
	int32_t *prompt;

	if (!s->d->cache || !s->d->cfg.cache_decode_reuse || r->kind != SREQ_DECODE ||
	    !sreq_d(r)->kv_ready || !r->free_job || r->n_prompt < pt ||
	    r->fail_code == PROTO_ERR_INTEGRITY)
		return;
	prompt = malloc(sizeof(*prompt) * r->n_prompt);
	if (!prompt)
		return;
	memcpy(prompt, r->prompt, sizeof(*prompt) * r->n_prompt);
	pcache_key_make(&key, s->d->cache_fp, r->tenant, r->cache_salt,
			strlen(r->cache_salt));
	compute_job_cache(r->free_job, &key, prompt, r->n_prompt / pt);
}

/* Free the engine's request; decode also hands back its lent pages,
 * quarantined when the engine reported ENGINE_E_INTEGRITY: a page whose
 * tag is wrong had a writer we cannot trust (invariants 1, 2). The
 * engine quarantines its own pages by the same rule. */
static void dreq_free_engine(struct serve_req *r)
{
	struct sreq_decode *dp = sreq_d(r);
	bool lent = dp->pages_held;

	if (lent && !r->engine_integrity)
		decode_cache_received(r);
	if (lent && r->engine_integrity)
		KVLOG_WARN(r->s->log, "pages_quarantined",
			   "id=%llu tenant=%s pages=%u reason=engine_integrity",
			   (unsigned long long)r->reg.id, KVLOG_Q(r->tenant), dp->n_table);
	dp->pages_held = false;
	serve__compute_free(r->s, r, lent, lent && r->engine_integrity);
}

static void dreq_act(struct serve_req *r, uint32_t a)
{
	struct sreq_decode *dp = sreq_d(r);
	struct serve *s = r->s;

	switch (a) {
	case DA_ANSWER_ERR:
		serve__sink_error(r, r->fail_code ? r->fail_code : PROTO_ERR_INTERNAL,
				    "%s", r->fail_msg[0] ? r->fail_msg : "the request failed");
		return;
	case DA_STREAM_FIRST:
		/* only a token prefill sampled: a prompt computed here
		 * (standalone, local) streams its first from the engine */
		if (r->kind == SREQ_DECODE && !dreq_recompute(r) &&
		    (int32_t)dp->first_token != s->model->eos_id)
			serve__sink_token(r, (int32_t)dp->first_token, NULL);
		return;
	case DA_STREAM:
		serve__sink_token(r, r->last_token, r->last_lp);
		return;
	case DA_ANSWER_FINAL:
		r->final_ok = true;
		serve__sink_final(r, r->finish_reason);
		return;
	case DA_DETACH_CLIENT:
		serve__sink_detach(r);
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
		dreq_quarantine(r, dp->fence_failed ? "fence_failed" : "tag_check");
		return;
	case DA_DETACH_PEER:
		serve__link_detach(r);
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
	case DA_KEEP_TIMER:
		return;   /* read by the state setter */
	case DA_RETRY:
		dreq_retry(r);
		return;
	}
}

/* A prompt this decode node computed itself is no longer pending. */
static void dreq_local_prompt_done(struct serve_req *r)
{
	if (!r->local_prompt)
		return;
	r->local_prompt = false;
	r->s->local_prompt_tokens -= r->n_prompt;
	place_speed_observe(&r->s->place_here, kvd_now_ns(),
			    r->s->local_prompt_tokens, r->n_prompt);
}

/* The only way into DONE: everything the request held is given back. */
static void dreq_finish(struct serve_req *r)
{
	struct sreq_decode *dp = sreq_d(r);

	dreq_local_prompt_done(r);
	KVD_ASSERT(r->s->log, !dp->pages_held && !dp->fenced && !r->link && !r->ereq,
		   "id=%llu tenant=%s msg=\"a decode request ends holding pages, a fence, a peer or an engine request\"",
		   (unsigned long long)r->reg.id, KVLOG_Q(r->tenant));
	/* a client that left was told nothing: its client_gone line said why */
	if (!r->answered && !r->client_left)
		serve__sink_error(r, PROTO_ERR_INTERNAL, "the request ended unanswered");
	serve__sink_detach(r);
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

/* An engine code as the client's error (the one fold, net/errors.h). */
static int engine_code_to_proto(int e)
{
	return kvd_err_to_proto(kvd_err_fold(&kvd_err_engine, e));
}

void serve__dreq_engine_msg(struct serve_req *r, const struct compute_msg *m)
{
	switch (m->kind) {
	case COMPUTE_MSG_SUBMITTED:
		serve__gate_settle(r);   /* the engine reserved, or never will */
		if (m->error) {
			r->engine_integrity = m->error == ENGINE_E_INTEGRITY;
			dreq_fail_kind(r, engine_code_to_proto(m->error),
				       KVD_INTEGRITY_TAG,
				       "engine refused the request: %s",
				       engine_strerror(m->error));
			serve__dreq_event(r, DEV_SUBMIT_ERR);
			return;
		}
		r->ereq = m->req;
		if (m->cached)   /* a prompt computed here; a pair's came with
				  * prefill_done */
			r->cached_tokens = m->cached;
		serve__dreq_event(r, r->sink ? DEV_SUBMITTED : DEV_SUBMITTED_ORPHAN);
		return;
	case COMPUTE_MSG_TOKEN:
		dreq_local_prompt_done(r);
		r->last_token = m->token;
		r->last_lp = m->lp;   /* m lives through the event */
		serve__dreq_event(r, DEV_TOKEN);
		r->last_lp = NULL;
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
			dreq_fail_kind(r, r->engine_integrity ? PROTO_ERR_INTEGRITY : PROTO_ERR_INTERNAL,
				       KVD_INTEGRITY_TAG,
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
		KVLOG_RL_WARN(s->log, &s->rl[SERVE_RL_CLIENT_REFUSED], "admission_reject",
			   "client_id=%llu tenant=%s reason=prompt_too_long prompt_tokens=%u max_tokens=%u need=%llu limit=%llu context=%u pool_tokens=%llu",
			   (unsigned long long)r->client_id, KVLOG_Q(r->tenant), r->n_prompt,
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
	if (!r->registered)   /* a failover placed here is */
		serve__req_register(r);
	if (serve__sink_stream_begin(r)) {
		r->fail_code = PROTO_ERR_INTERNAL;
		snprintf(r->fail_msg, sizeof(r->fail_msg), "out of memory");
		serve__dreq_event(r, DEV_REFUSE);
		return;
	}
	serve__dreq_event(r, DEV_ADMIT_LOCAL);
}


/* l refused a request as DRAINING within the last three heartbeats. */
static bool peer_refused_lately(const struct serve *s, const struct link *l,
				uint64_t now)
{
	uint64_t window = 3ull * s->d->cfg.heartbeat_ms * 1000000ull;

	return l->refused_draining_ns && now - l->refused_draining_ns < window;
}

/* The dialled link of that serial that takes requests now (not `avoid`,
 * nor one that refused as DRAINING lately); NULL when none. */
static struct link *decode_link_usable(struct serve *s, uint64_t serial,
				       const struct link *avoid, uint64_t now)
{
	struct kvd_list *e;

	kvd_list_for_each(e, &s->links) {
		struct link *l = kvd_list_entry(e, struct link, node);

		if (l->serial == serial)
			return l->side == LINK_DIAL && link_takes_requests(l) && l != avoid &&
			       !peer_refused_lately(s, l, now) ? l : NULL;
	}
	return NULL;
}

/* A later choice of an HTTP n > 1 request (shares_prompt) goes to the
 * peer a choice of its exchange (the same public id and tenant) was
 * placed on - choice 0 first: the peer that computed the prompt (the
 * gate held this choice until choice 0's first token), whose prefix
 * cache then lends it to this choice - while that link takes requests
 * (decode_link_usable). Without this, with several prefill peers, the
 * choices went by load and another peer computed the whole prompt
 * again. NULL: the normal placement. */
static struct link *decode_sibling_peer(struct serve *s, const struct serve_req *r,
					const struct link *avoid, uint64_t now)
{
	struct link *best = NULL;
	struct kvd_list *e;

	if (!r->shares_prompt || !r->public_id[0])
		return NULL;
	kvd_list_for_each(e, &s->reqs) {
		const struct serve_req *q = kvd_list_entry(e, struct serve_req, node);
		struct link *l;

		if (q == r || !q->peer_serial || strcmp(q->public_id, r->public_id) ||
		    strcmp(q->tenant, r->tenant))
			continue;
		l = decode_link_usable(s, q->peer_serial, avoid, now);
		if (l && !q->shares_prompt)
			return l;        /* choice 0's */
		if (l && !best)
			best = l;
	}
	return best;
}

/* Where r's prompt goes: a sibling choice's peer (above), else the up
 * prefill peer with the fewest requests in flight: ours on it plus the
 * load it reported. A draining one (its address left its name's
 * answer, peerdns.c) takes none, nor `avoid` (the peer a failover
 * leaves); one that refused as DRAINING lately only when no other takes
 * requests (it may have been resumed). */
struct link *serve__decode_pick_peer(struct serve *s, const struct serve_req *r,
				     const struct link *avoid)
{
	struct link *best = NULL;
	bool best_refused = false;
	uint64_t now = kvd_now_ns();
	struct kvd_list *e;

	if ((best = decode_sibling_peer(s, r, avoid, now)))
		return best;
	kvd_list_for_each(e, &s->links) {
		struct link *l = kvd_list_entry(e, struct link, node);
		bool refused;

		if (l->side != LINK_DIAL || !link_takes_requests(l) || l == avoid)
			continue;
		refused = peer_refused_lately(s, l, now);
		if (!best || (best_refused && !refused) ||
		    (refused == best_refused &&
		     l->load + l->n_reqs < best->load + best->n_reqs)) {
			best = l;
			best_refused = refused;
		}
	}
	return best;
}

static int decode_send_request(struct serve_req *r)
{
	struct sreq_decode *dp = sreq_d(r);
	struct proto_peer_msg m = { .type = PEER_MSG_PREFILL_REQUEST };
	struct proto_peer_page *pages;
	uint32_t *toks;
	int rc;

	pages = calloc(dp->n_prefix, sizeof(*pages));
	toks = calloc(r->n_prompt, sizeof(*toks));
	if (!pages || !toks) {
		free(pages);
		free(toks);
		return -ENOMEM;
	}
	for (uint32_t i = 0; i < dp->n_prefix; i++) {
		pages[i].page = dp->table[i].page;
		pages[i].gen = dp->table[i].gen;
	}
	for (uint32_t i = 0; i < r->n_prompt; i++)
		toks[i] = (uint32_t)r->prompt[i];
	m.id = r->reg.id;
	m.tokens = toks;
	m.n_tokens = r->n_prompt;
	m.pages = pages;
	m.n_pages = dp->n_prefix;
	m.max_tokens = r->max_tokens;
	m.temperature = r->sp.temperature;
	m.top_k = r->sp.top_k;
	m.top_p = r->sp.top_p;
	m.seed = r->sp.seed;
	snprintf(m.tenant, sizeof(m.tenant), "%s", r->tenant);
	snprintf(m.cache_salt, sizeof(m.cache_salt), "%s", r->cache_salt);
	rc = serve__link_send(r->link, &m);
	free(pages);
	free(toks);
	if (rc == 0)
		r->t_xfer_ns = kvd_now_ns();
	return rc;
}

/* Invariant 3 on the path: prompt + max_tokens must fit this node's and
 * the chosen peer's context and pool. True when r was refused. */
static bool decode_too_long(struct serve_req *r, const struct link *p)
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
			   "point=skip_decode_admission client_id=%llu tenant=%s need=%llu limit=%llu",
			   (unsigned long long)r->client_id, KVLOG_Q(r->tenant),
			   (unsigned long long)need, (unsigned long long)lim);
		return false;
	}
	KVLOG_RL_WARN(s->log, &s->rl[SERVE_RL_CLIENT_REFUSED], "admission_reject",
		   "client_id=%llu tenant=%s reason=prompt_too_long prompt_tokens=%u max_tokens=%u need=%llu limit=%llu context=%u pool_tokens=%llu peer=%s peer_context=%llu peer_pool_tokens=%llu",
		   (unsigned long long)r->client_id, KVLOG_Q(r->tenant), r->n_prompt,
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
	struct sreq_decode *dp = sreq_d(r);
	struct serve *s = r->s;
	struct kvpool *pool = s->d->pool;
	uint64_t need = (uint64_t)r->n_prompt + r->max_tokens;
	int rc;

	dp->n_table = kvpool_pages_for(pool, need - 1);
	dp->n_prefix = kvpool_pages_for(pool, r->n_prompt);
	dp->table = calloc(dp->n_table, sizeof(*dp->table));
	dp->rx.got = calloc(dp->n_prefix, 1);
	if (!dp->table || !dp->rx.got) {
		dreq_fail(r, PROTO_ERR_INTERNAL, "out of memory");
		return DEV_REFUSE;
	}
	/* a decode node's cached pages (its local prefills) never refuse a
	 * transfer: unmapped ones are evicted when the pool is short */
	rc = pcache_pool_reserve(s->d->cache, pool, r->reg.id, dp->n_table, dp->table);
	serve__gate_settle(r);
	if (rc) {
		s->d->counters.rejected[KVD_REJECT_OVERLOADED]++;
		dreq_fail(r, rc == KVPOOL_E_FULL ? PROTO_ERR_OVERLOADED : PROTO_ERR_INTERNAL,
			  "the KV pool cannot reserve %u pages now", dp->n_table);
		return DEV_REFUSE;
	}
	dp->pages_held = true;
	/* an in-flight transfer may write the prefix: fence it (invariant 2);
	 * a pool that refuses is a breach, and the pages go to quarantine */
	rc = kvpool_fill_begin(pool, r->reg.id, dp->table, dp->n_table);
	if (!rc)
		rc = kvpool_fence(pool, r->reg.id, dp->table, dp->n_prefix);
	if (rc) {
		KVLOG_ERR(s->log, "invariant_breach", "id=%llu tenant=%s op=fence code=%d pages=%u",
			  (unsigned long long)r->reg.id, KVLOG_Q(r->tenant), rc, dp->n_table);
		dreq_fail(r, PROTO_ERR_INTERNAL, "the KV pool refused to fence the request's pages");
		dp->fence_failed = true;
		return DEV_BREACH;
	}
	dp->fenced = true;
	return DEV_ADMIT;
}

/* Prompt tokens of this node's requests that peer p has not finished
 * (no prefill_done yet). Bounded walk: at most peers.max_requests. */
static uint64_t decode_peer_pending(const struct link *p)
{
	const struct kvd_list *e;
	uint64_t n = 0;

	kvd_list_for_each(e, &p->reqs) {
		const struct serve_req *q = kvd_list_entry(e, struct serve_req, link_node);

		if (q->state == DRS_TRANSFER && !sreq_dc(q)->done_seen)
			n += q->n_prompt;
	}
	return n;
}

/* Prompt tokens of this node's requests that no prefill peer has
 * finished, over every up peer (*n_up of them). */
static uint64_t decode_peers_pending(struct serve *s, uint32_t *n_up)
{
	struct kvd_list *e;
	uint64_t n = 0;

	*n_up = 0;
	kvd_list_for_each(e, &s->links) {
		struct link *l = kvd_list_entry(e, struct link, node);

		if (l->side != LINK_DIAL)
			continue;
		n += decode_peer_pending(l);
		*n_up += link_takes_requests(l);
	}
	return n;
}

/* A prefill peer finished one of this node's prompts (n tokens). */
static void decode_peer_speed(struct serve *s, uint32_t n)
{
	uint32_t n_up;

	if (!s->d->cfg.local_prefill)
		return;
	place_speed_observe(&s->place_peers, kvd_now_ns(),
			    decode_peers_pending(s, &n_up), n);
}

/* Conditional disaggregation (daemon/node/place.h): true when r's prompt is
 * computed here rather than on peer p. r then runs as a standalone
 * request of this node (serve__local_admit). */
static bool decode_place_local(struct serve_req *r, const struct link *p)
{
	struct serve *s = r->s;
	uint64_t peer, now = kvd_now_ns();
	uint32_t budget, pbudget, dunits, dec, n_up;
	double v_here, v_peer;

	if (!s->d->cfg.local_prefill)
		return false;
	peer = decode_peer_pending(p);
	/* the decoders to expect: every other request of this node will
	 * be one soon (a burst of prompts must not be placed as if the
	 * node stayed idle), at most a step's worth */
	dec = compute_decoders(&s->comp);
	if (s->n_reqs > 1 && s->n_reqs - 1 > dec)
		dec = s->n_reqs - 1;
	dec = KVD_MIN(dec, s->d->cfg.max_batch ? s->d->cfg.max_batch : 16);
	/* a step's work in prompt tokens: the prompt tokens it would carry
	 * beside dec decoders (engine.step_tokens, engine.step_ms), and what
	 * the decoders cost, a logits row each (gpu/cpu/stepcost.h) */
	pbudget = compute_prompt_budget(&s->comp, dec);
	place_step_units(pbudget, dec, compute_decoder_units(&s->comp), &budget, &dunits);
	/* the queues' busy time runs up to now */
	place_speed_observe(&s->place_here, now, s->local_prompt_tokens, 0);
	place_speed_observe(&s->place_peers, now, decode_peers_pending(s, &n_up), 0);
	v_here = place_speed_get(&s->place_here);
	/* the peers' speed is all of them together: one peer's share */
	v_peer = place_speed_get(&s->place_peers) / (n_up ? n_up : 1);
	if (!serve_place_local(s->d->cfg.local_prefill, budget, dunits,
			       s->local_prompt_tokens, peer, r->n_prompt,
			       v_here, v_peer))
		return false;
	KVLOG_DEBUG(s->log, "prefill_local",
		    "client_id=%llu tenant=%s prompt_tokens=%u local_pending=%llu prompt_budget=%u decoders=%u decoder_units=%u local_tok_s=%.0f peer=%s peer_pending=%llu peer_tok_s=%.0f",
		    (unsigned long long)r->client_id, KVLOG_Q(r->tenant), r->n_prompt,
		    (unsigned long long)s->local_prompt_tokens, pbudget, dec, dunits, v_here,
		    KVLOG_Q(p->addr), (unsigned long long)peer, v_peer);
	return true;
}

/* cache.decode_reuse: at least half of r's prompt is full pages this
 * node holds in its prefix cache for r's tenant and salt (received for
 * an earlier request: decode_cache_received), so r is computed here on
 * those pages, its uncached rest as a local prompt, instead of having
 * the peer send the whole prompt again. Only r's own tenant and salt can
 * answer (the key), so where a request runs says nothing of others. */
static bool decode_place_cached(struct serve_req *r)
{
	struct serve *s = r->s;
	uint32_t pt = kvpool_geom(s->d->pool)->page_tokens, n;
	struct pcache_key key;

	if (!s->d->cache || !s->d->cfg.cache_decode_reuse || r->n_prompt <= pt)
		return false;
	pcache_key_make(&key, s->d->cache_fp, r->tenant, r->cache_salt,
			strlen(r->cache_salt));
	n = pcache_probe(s->d->cache, &key, r->prompt, r->n_prompt,
			 (r->n_prompt - 1) / pt);
	if (2ull * n * pt < r->n_prompt)
		return false;
	KVLOG_DEBUG(s->log, "prefill_local",
		    "client_id=%llu tenant=%s prompt_tokens=%u reason=prefix_cache cached_tokens=%u",
		    (unsigned long long)r->client_id, KVLOG_Q(r->tenant), r->n_prompt, n * pt);
	return true;
}

/* verbs: grant p write access to r's prefix pages (net/verbs/verbs_scope.h)
 * and fill *m with the verbs_scope that tells it where (m->runs
 * malloc'd; n_runs 0 on tcp, or while memory windows are being bound:
 * decode_scope_live sends it once they are). 0, or why not (nothing
 * granted). */
static int decode_verbs_grant(struct serve_req *r, struct link *p,
			      struct proto_peer_msg *m)
{
	struct sreq_decode *dp = sreq_d(r);
	bool live = false;
	int rc;

	*m = (struct proto_peer_msg){ .type = PEER_MSG_VERBS_SCOPE, .id = r->reg.id };
	if (!p->data || !transport_is_verbs(p->data))
		return 0;
	m->runs = calloc(VERBS_SCOPE_RUNS_MAX, sizeof(*m->runs));
	if (!m->runs)
		return -ENOMEM;
	rc = transport_verbs_grant(p->data, r->reg.id, dp->table, dp->n_prefix,
				   m->runs, &m->n_runs, &live);
	if (!rc && !live)
		m->n_runs = 0;
	if (rc) {
		free(m->runs);
		m->runs = NULL;
		m->n_runs = 0;
	}
	return rc;
}

/* A failover's line, once its new place is known (to: NULL, here). */
static void decode_failover_log(struct serve_req *r, const struct link *to)
{
	if (!r->fo_from)
		return;
	KVLOG_INFO(r->s->log, "failover",
		   "id=%llu client_id=%llu tenant=%s from=%s to=%s reason=%s attempt=%u",
		   (unsigned long long)r->reg.id, (unsigned long long)r->client_id,
		   KVLOG_Q(r->tenant), KVLOG_Q(r->fo_from->addr),
		   KVLOG_Q(to ? to->addr : "local"), r->fo_why, r->failovers);
	r->fo_from = NULL;
}

/* r's prompt is computed here (daemon/node/place.h); `counted`: as
 * local prompt work (a prefix-cache hit is not). */
static void decode_run_local(struct serve_req *r, bool counted)
{
	decode_failover_log(r, NULL);
	r->kind = SREQ_LOCAL;
	r->peer_serial = 0;              /* no peer holds its prompt */
	if (counted) {
		r->local_prompt = true;
		r->s->local_prompt_tokens += r->n_prompt;
	}
	serve__local_admit(r);
}

/* r goes to prefill peer p: admission on the path, pages, the request. */
static void decode_run_peer(struct serve_req *r, struct link *p)
{
	struct sreq_decode *dp = sreq_d(r);
	struct serve *s = r->s;
	struct proto_peer_msg scope = { 0 };
	enum dreq_event ev;
	int rc;

	/* the placement decides the kind: peer messages find only
	 * SREQ_DECODE requests (decode_req_of) */
	r->kind = SREQ_DECODE;
	r->peer_serial = p->serial;
	decode_failover_log(r, p);
	if (decode_too_long(r, p)) {
		serve__dreq_event(r, DEV_REFUSE);
		return;
	}
	/* admitted: now, and only now, pages (a failover is registered) */
	if (!r->registered)
		serve__req_register(r);
	ev = decode_reserve(r);
	if (ev == DEV_ADMIT)
		serve__link_attach(p, r, 0);
	serve__dreq_event(r, ev);
	if (ev != DEV_ADMIT)
		return;
	rc = decode_verbs_grant(r, p, &scope);
	if (rc) {
		dreq_fail(r, PROTO_ERR_OVERLOADED,
			  "cannot grant the peer RDMA write access to this request's pages (%s)",
			  rc < 0 ? strerror(-rc) : "too many runs of pages, or pages outside the registered pool");
		serve__dreq_event(r, DEV_SEND_FAIL);
		return;
	}
	rc = decode_send_request(r);
	if (!rc && scope.n_runs)
		rc = serve__link_send(r->link, &scope);
	free(scope.runs);
	if (rc) {
		dreq_fail(r, PROTO_ERR_INTERNAL, "cannot send the prefill request: %s",
			  strerror(-rc));
		serve__dreq_event(r, DEV_SEND_FAIL);
		return;
	}
	KVLOG_DEBUG(s->log, "prefill_sent",
		    "id=%llu client_id=%llu tenant=%s peer=%s prompt_tokens=%u pages=%u prefix_pages=%u",
		    (unsigned long long)r->reg.id, (unsigned long long)r->client_id,
		    KVLOG_Q(r->tenant), KVLOG_Q(p->addr), r->n_prompt, dp->n_table,
		    dp->n_prefix);
}

/* Where r's prompt runs (r in NEW): a prefill peer other than `avoid`
 * (the one a failover leaves), or here (the prefix cache, or the
 * placement; a failover with no other peer comes here when
 * peers.local_prefill allows local prompts at all). */
static void decode_place(struct serve_req *r, const struct link *avoid)
{
	struct serve *s = r->s;
	struct link *p = serve__decode_pick_peer(s, r, avoid);

	if (!p && avoid && s->d->cfg.local_prefill) {
		decode_run_local(r, true);
		return;
	}
	if (!p) {
		s->d->counters.rejected[KVD_REJECT_NO_PEER]++;
		dreq_fail(r, PROTO_ERR_NO_PREFILL_PEER, "no healthy prefill peer is connected");
		serve__dreq_event(r, DEV_REFUSE);
		return;
	}
	/* a cache hit is not counted as local prompt work: most of it is
	 * cached, and the placement's speed figures are of computed tokens */
	if (decode_place_cached(r))
		decode_run_local(r, false);
	else if (decode_place_local(r, p))
		decode_run_local(r, true);
	else
		decode_run_peer(r, p);
}

void serve__decode_admit(struct serve_req *r)
{
	r->rops = &dreq_decode_ops;
	decode_place(r, NULL);
}

/* ---- failover (peers.failover_retries) -------------------------------------- */

/* Somewhere r can go instead of `from`: another prefill peer that takes
 * requests, or this node (peers.local_prefill). */
static bool decode_failover_target(struct serve *s, const struct link *from)
{
	struct kvd_list *e;

	if (s->d->cfg.local_prefill)
		return true;
	kvd_list_for_each(e, &s->links) {
		const struct link *l = kvd_list_entry(e, struct link, node);

		if (l != from && l->side == LINK_DIAL && link_takes_requests(l))
			return true;
	}
	return false;
}

/* Whether r, whose prefill failed it for a cause of the peer's (the
 * caller judged the code), is placed again rather than answered with
 * the error: nothing reached its client yet (TRANSFER, SEALING: the
 * first token streams from SUBMIT on), the client is still there, a
 * failover is left and somewhere else can take it. When it is, the
 * retry step needs the link it leaves and why. */
static bool decode_failover(struct serve_req *r, const char *why)
{
	struct serve *s = r->s;

	if ((r->state != DRS_TRANSFER && r->state != DRS_SEALING) || !r->sink ||
	    r->answered || r->fail_code || s->stopping ||
	    r->failovers >= s->d->cfg.failover_retries || !r->link ||
	    !decode_failover_target(s, r->link))
		return false;
	r->fo_from = r->link;
	r->fo_why = why;
	return true;
}

/* DA_RETRY (r in NEW, its pages released and unfenced, its peer
 * detached: the D_RETRY actions before it): a clean slate for the
 * decode part, then the placement again. A pool call that failed in
 * those actions failed r (a breach): it ends with that error instead. */
static void dreq_retry(struct serve_req *r)
{
	struct sreq_decode *dp = sreq_d(r);
	struct serve *s = r->s;

	KVD_ASSERT(s->log, !dp->pages_held && !dp->fenced && !r->link && !r->ereq,
		   "id=%llu tenant=%s msg=\"a failover with pages, a fence, a peer or an engine request\"",
		   (unsigned long long)r->reg.id, KVLOG_Q(r->tenant));
	if (r->fail_code) {
		r->fo_from = NULL;
		serve__dreq_event(r, DEV_REFUSE);
		return;
	}
	free(dp->table);
	free(dp->rx.got);
	*dp = (struct sreq_decode){ 0 };
	r->failovers++;
	r->cached_tokens = 0;
	r->t_xfer_ns = 0;
	s->d->counters.failovers++;
	/* its pages went back to the pool: until it reserves again (here,
	 * or the engine's for a local prompt) the gate must not lend them */
	serve__gate_unsettle(r, kvpool_pages_for(s->d->pool,
			(uint64_t)r->n_prompt + r->max_tokens - 1));
	decode_place(r, r->fo_from);
}

/* ---- receiving KV ----------------------------------------------------------- */

static struct serve_req *decode_req_of(struct link *p, uint64_t id)
{
	struct serve_req *r = serve__req_find(p->s, id);

	if (!r || r->kind != SREQ_DECODE || r->link != p)
		return NULL;
	return r;
}

/* The request's reservation as net/xfer_check.h sees it: every entry of
 * a batch is checked against it, and the K/V it carries for finiteness
 * in the pool's page layout. */
static void decode_rx_req(const struct serve_req *r, struct xfer_check_req *q)
{
	const struct sreq_decode *dp = sreq_dc(r);
	const struct kvpool_geom *g = kvpool_geom(r->s->d->pool);

	*q = (struct xfer_check_req){
		.table = dp->table, .n_prefix = dp->n_prefix,
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
		if (kvpool_zero_tail(s->d->pool, r->reg.id, &sreq_d(r)->table[e.index],
				     e.tokens)) {
			dreq_fail(r, PROTO_ERR_INTERNAL,
				  "cannot clear the tail of a received page");
			return false;
		}
	}
	return true;
}

/* A batch the transport passed (checksum, seal): check its entries
 * against its request, then write it. */
static void decode_rx_batch(struct link *p, const struct xfer_hdr *h,
			    const uint8_t *batch)
{
	struct serve *s = p->s;
	struct serve_req *r = decode_req_of(p, h->request_id);
	struct xfer_check_req q;
	struct xfer_check_refusal ref;

	if (r) {
		struct sreq_decode *dp = sreq_d(r);

		/* verbs: a batch of r completed - every write it carried has
		 * landed; an acknowledged abort waits for the count prefill
		 * posted (ABORT_LANDING) */
		dp->batches_landed++;
		if (r->state == DRS_ABORT_LANDING && dp->batches_landed >= dp->peer_batches) {
			KVLOG_INFO(s->log, "abort_fence_done",
				   "id=%llu tenant=%s batches_posted=%u batches_landed=%u",
				   (unsigned long long)r->reg.id, KVLOG_Q(r->tenant),
				   dp->peer_batches, dp->batches_landed);
			serve__dreq_event(r, DEV_LANDED);
			return;
		}
	}
	if (!r || (r->state != DRS_TRANSFER && r->state != DRS_SEALING)) {
		/* dreq: ABORTING ignores batches (they are not written);
		 * SEALING checks them (every page is in: refused) */
		KVLOG_DEBUG(s->log, "batch_discarded", "id=%llu tenant=%s seq=%u peer=%s",
			    (unsigned long long)h->request_id,
			    KVLOG_Q(r ? r->tenant : SERVE_TENANT_UNKNOWN), h->seq,
			    KVLOG_Q(p->addr));
		return;
	}
	/* every entry checked before any page is written; on accept the
	 * pages count as arrived (a write failure below fails r anyway) */
	decode_rx_req(r, &q);
	if (xfer_check_batch(&q, &sreq_d(r)->rx, h, batch, &ref)) {
		dreq_fail_kind(r, PROTO_ERR_INTEGRITY, KVD_INTEGRITY_TRANSFER, "%s", ref.why);
		serve__dreq_event(r, DEV_BAD);
		return;
	}
	if (!decode_rx_write(r, h, batch)) {
		serve__dreq_event(r, DEV_BAD);
		return;
	}
	kvd_metrics_xfer_batch(&s->d->metrics, KVD_XFER_RECV, h->payload_bytes);
	serve__dreq_event(r, DEV_BATCH);
	decode_try_complete(r);
}

/* Fault point retag_ready: after mark_ready, give the first prefix page
 * another owner's tag, so only the engine's own check can catch it. */
static void decode_fault_retag(struct serve_req *r)
{
	struct sreq_decode *dp = sreq_d(r);
	struct serve *s = r->s;
	const struct kvmem *mem = &s->d->mem;
	uint32_t pt = kvpool_geom(s->d->pool)->page_tokens;
	struct kvtag tag;
	void *dst;

	if (!dp->n_prefix || !kvd_fault_fire(&s->fault, KVD_FAULT_RETAG_READY))
		return;
	dst = kvpool_page_addr(s->d->pool, dp->table[0].page);
	kvtag_make(&tag, r->reg.id + 1, dp->table[0].gen, dp->table[0].page, 0,
		   KVD_MIN(pt, r->n_prompt));
	KVLOG_WARN(s->log, "fault", "point=retag_ready id=%llu tenant=%s page=%u",
		   (unsigned long long)r->reg.id, KVLOG_Q(r->tenant), dp->table[0].page);
	if (dst)
		(void)mem->ops->write(mem->ctx, dst, &tag, sizeof(tag));
}

/* Which of the COVERED events the completed transfer is: the tags are
 * checked in page memory (kvpool_mark_ready), then the first token and
 * the client decide how it goes on. */
static enum dreq_event decode_covered_event(struct serve_req *r)
{
	struct sreq_decode *dp = sreq_d(r);
	struct serve *s = r->s;
	int rc;

	/* verbs: every batch is in; nothing may change the pages now that
	 * their tags are checked and the engine reads them */
	dreq_revoke(r);
	rc = kvpool_mark_ready(s->d->pool, r->reg.id, dp->table, dp->n_prefix,
			       r->n_prompt);

	if (rc) {
		/* every batch is in and passed its checksum and entry checks,
		 * yet a tag is wrong: whoever wrote the prefix cannot be
		 * trusted, so its pages never go back to the free list
		 * (invariants 1, 2); the rest of the table was never written */
		dreq_fail_kind(r, PROTO_ERR_INTEGRITY, KVD_INTEGRITY_TAG,
			       "the received KV failed the %s check (pool error %d)",
			  rc == KVPOOL_E_COVERAGE ? "coverage" : "tag", rc);
		return DEV_TAG_BAD;
	}
	dp->kv_ready = true;
	decode_fault_retag(r);
	if (r->t_xfer_ns)
		kvd_metrics_xfer_time(&s->d->metrics, KVD_XFER_RECV,
				      kvd_now_ns() - r->t_xfer_ns);
	KVLOG_DEBUG(s->log, "transfer_done", "id=%llu tenant=%s batches=%u pages=%u tokens=%u",
		    (unsigned long long)r->reg.id, KVLOG_Q(r->tenant), dp->rx.batches, dp->rx.n_got,
		    r->n_prompt);
	if (!r->sink)
		return DEV_COVERED_ORPHAN;   /* complete; now release */
	if (serve__sink_stream_begin(r)) {
		dreq_fail(r, PROTO_ERR_INTERNAL, "out of memory");
		return DEV_COVERED_FAIL;
	}
	if (!dreq_recompute(r) &&
	    ((int32_t)dp->first_token == s->model->eos_id || r->max_tokens == 1)) {
		snprintf(r->finish_reason, sizeof(r->finish_reason), "%s",
			 (int32_t)dp->first_token == s->model->eos_id ? "stop" : "length");
		return DEV_COVERED_FINAL;
	}
	return DEV_COVERED;
}

/* The final value check (verbs), on the pool's own bytes once the
 * scope is dead: the positions each prefix page holds are finite. The
 * batch check saw the bytes at the batch's completion; a peer that holds
 * the key could write into a page after that, through the scope still
 * live, and before prefill_done. 0, 1 (a page fails: logged), -ENOMEM. */
static int decode_prefix_recheck(struct serve_req *r)
{
	struct sreq_decode *dp = sreq_d(r);
	struct serve *s = r->s;
	const struct kvmem *mem = &s->d->mem;
	const struct kvpool_geom *g = kvpool_geom(s->d->pool);
	uint8_t *buf = malloc(s->page_bytes);   /* (page_bytes) one page */
	int rc = 0;

	if (!buf)
		return -ENOMEM;
	for (uint32_t i = 0; !rc && i < dp->n_prefix; i++) {
		uint32_t tokens = KVD_MIN(g->page_tokens, r->n_prompt - i * g->page_tokens);
		const void *src = kvpool_page_addr(s->d->pool, dp->table[i].page);

		if (src && !mem->ops->read(mem->ctx, buf, src, s->page_bytes) &&
		    kvpool_page_kv_finite(g, buf, tokens))
			continue;
		KVLOG_WARN(s->log, "transfer_check_failed",
			   "id=%llu tenant=%s check=finite page=%u index=%u msg=\"the page changed after its batch was checked\"",
			   (unsigned long long)r->reg.id, KVLOG_Q(r->tenant),
			   dp->table[i].page, i);
		rc = 1;
	}
	free(buf);
	return rc;
}

/* The scope is dead (verbs) or there is none (tcp): no byte of the
 * prefix can change any more, so the checks that must hold when the
 * engine reads it run now - values here, tags in kvpool_mark_ready. */
static void decode_sealed(struct serve_req *r)
{
	struct sreq_decode *dp = sreq_d(r);
	int rc;

	if (!r->link || !r->link->data || !transport_is_verbs(r->link->data)) {
		serve__dreq_event(r, decode_covered_event(r));
		return;
	}
	KVLOG_DEBUG(r->s->log, "transfer_sealed", "id=%llu tenant=%s pages=%u",
		    (unsigned long long)r->reg.id, KVLOG_Q(r->tenant), dp->n_prefix);
	rc = decode_prefix_recheck(r);
	if (rc < 0) {
		dreq_fail(r, PROTO_ERR_INTERNAL, "out of memory");
		serve__dreq_event(r, DEV_COVERED_FAIL);
		return;
	}
	if (rc) {
		/* its writer cannot be trusted: quarantine (invariants 1, 2) */
		dreq_fail_kind(r, PROTO_ERR_INTEGRITY, KVD_INTEGRITY_TRANSFER,
			       "the received KV changed after it was checked (non-finite values)");
		serve__dreq_event(r, DEV_TAG_BAD);
		return;
	}
	serve__dreq_event(r, decode_covered_event(r));
}

/* All batches in and prefill_done seen: check coverage, mark ready. */
static void decode_try_complete(struct serve_req *r)
{
	struct sreq_decode *dp = sreq_d(r);
	struct xfer_check_done done = { .tokens = dp->done_tokens,
					.pages = dp->done_pages,
					.batches = dp->done_batches };
	struct xfer_check_req q;
	char why[200];
	int rc;

	if (r->ended || r->state != DRS_TRANSFER || !dp->done_seen)
		return;
	decode_rx_req(r, &q);
	rc = xfer_check_coverage(&q, &dp->rx, &done, why, sizeof(why));
	if (rc == XFER_CHECK_PENDING)
		return;
	if (rc) {
		dreq_fail_kind(r, PROTO_ERR_INTEGRITY, KVD_INTEGRITY_TRANSFER, "%s", why);
		serve__dreq_event(r, DEV_BAD);
		return;
	}
	/* every batch is in: take the write scope back first, and check
	 * the pages only once the NIC refuses the peer's writes (verbs,
	 * windows: SEALING until decode_scope_dead; the transfer timer
	 * still runs) */
	if (dreq_revoke(r))
		decode_sealed(r);
	else
		serve__dreq_event(r, DEV_SEAL);
}

/* ---- control messages from prefill ------------------------------------------ */

static void peer_on_reject(struct link *p, const struct proto_peer_msg *m)
{
	struct serve *s = p->s;
	struct serve_req *r = decode_req_of(p, m->id);

	if (!r)
		return;
	if (r->state == DRS_TRANSFER || r->state == DRS_SEALING) {
		KVLOG_WARN(s->log, "prefill_rejected",
			   "id=%llu client_id=%llu tenant=%s peer=%s code=%s msg=%s",
			   (unsigned long long)r->reg.id,
			   (unsigned long long)r->client_id, KVLOG_Q(r->tenant),
			   KVLOG_Q(p->addr), proto_err_name(m->code),
			   KVLOG_Q(m->message));
		/* the peer's state (a drain, its caps), not the request's:
		 * another prefill may take it (a refusal of the request
		 * itself - its size, its input - would be the same there) */
		if (m->code == PROTO_ERR_DRAINING)
			p->refused_draining_ns = kvd_now_ns();
		if ((m->code == PROTO_ERR_DRAINING || m->code == PROTO_ERR_OVERLOADED) &&
		    decode_failover(r, "reject")) {
			serve__dreq_event(r, DEV_REJECT_RETRY);
			return;
		}
		if (m->code == PROTO_ERR_PROMPT_TOO_LONG)
			s->d->counters.rejected[KVD_REJECT_PROMPT_TOO_LONG]++;
		dreq_fail(r, m->code, "%s", m->message);
	}
	/* prefill computed and sent nothing: release at once */
	serve__dreq_event(r, DEV_REJECT);
}

static void peer_on_done(struct link *p, const struct proto_peer_msg *m)
{
	struct serve_req *r = decode_req_of(p, m->id);

	if (!r || r->state != DRS_TRANSFER) {
		if (r)
			serve__dreq_event(r, DEV_PREFILL_DONE);   /* late: ignored */
		return;
	}
	sreq_d(r)->done_seen = true;
	decode_peer_speed(p->s, r->n_prompt);
	sreq_d(r)->first_token = m->first_token;
	sreq_d(r)->done_tokens = m->done_tokens;
	r->cached_tokens = KVD_MIN(m->cached_tokens, m->done_tokens);
	sreq_d(r)->done_batches = m->batches;
	sreq_d(r)->done_pages = m->done_pages;
	sreq_d(r)->prefill_id = m->prefill_id;
	snprintf(sreq_d(r)->prefill_node, sizeof(sreq_d(r)->prefill_node), "%s",
		 p->hello.node[0] ? p->hello.node : "?");
	if (m->first_token >= tokenizer_n_vocab(p->s->tok)) {
		dreq_fail_kind(r, PROTO_ERR_INTEGRITY, KVD_INTEGRITY_TRANSFER,
			       "prefill sent a first token outside the vocabulary");
		serve__dreq_event(r, DEV_BAD);
		return;
	}
	serve__dreq_event(r, DEV_PREFILL_DONE);
	decode_try_complete(r);
}

static void peer_on_abort(struct link *p, const struct proto_peer_msg *m)
{
	struct serve_req *r = decode_req_of(p, m->id);

	if (!r) {
		/* nothing of it here any more: the ack is all prefill needs */
		struct proto_peer_msg ack = { .type = PEER_MSG_ABORT_ACK, .id = m->id };

		serve__link_post(p, &ack);
		return;
	}
	sreq_d(r)->peer_batches = KVD_MAX(sreq_d(r)->peer_batches, m->batches);
	/* prefill gives up: its batches for r have left, and decode writes
	 * nothing for a request it no longer holds */
	dreq_fail(r, m->code ? m->code : PROTO_ERR_INTERNAL, "%s",
		  m->message[0] ? m->message : "prefill aborted the request");
	serve__dreq_event(r, DEV_PEER_ABORT);
}

/* link_ops.on_msg: a control message from a prefill peer after the
 * handshake (heartbeats and data_bound are the link's). */
static void decode_on_msg(struct link *p, struct proto_peer_msg *m)
{
	struct serve_req *r;

	switch (m->type) {
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
		if (!r)
			return;
		sreq_d(r)->peer_batches = KVD_MAX(sreq_d(r)->peer_batches, m->batches);
		/* over TCP every batch prefill posted has left before
		 * abort_ack and the checks refuse it for a released request.
		 * Over RDMA a posted batch may still be landing in our pages:
		 * they stay fenced until every batch prefill says it posted
		 * has completed here (or the QP is in error and drained: the
		 * link's loss, LINK_LOST) */
		KVLOG_RL_INFO(p->s->log, &p->s->rl[SERVE_RL_PEER_ACK], "abort_acked", "id=%llu tenant=%s peer=%s batches_posted=%u batches_received=%u batches_landed=%u",
			   (unsigned long long)r->reg.id, KVLOG_Q(r->tenant), KVLOG_Q(p->addr),
			   sreq_d(r)->peer_batches, sreq_d(r)->rx.batches, sreq_d(r)->batches_landed);
		serve__dreq_event(r, p->data && transport_is_verbs(p->data) &&
				  sreq_d(r)->batches_landed < sreq_d(r)->peer_batches ?
				  DEV_ABORT_ACK_EARLY : DEV_ABORT_ACK);
		return;
	default:
		KVLOG_RL_WARN(p->s->log, &p->s->rl[SERVE_RL_PEER_PROTOCOL], "peer_protocol", "peer=%s msg=\"unexpected %s\"",
			   KVLOG_Q(p->addr), proto_peer_type_name(m->type));
		return;
	}
}

/* ---- the link's callbacks -------------------------------------------------- */

/* link_ops.scope_live (verbs, memory windows): the binds of r's scope
 * completed, so prefill may be told where to write - or one failed, and
 * r fails with a typed error (the link is lost right after, and its
 * flush drain ends whatever the windows could still let in). */
static void decode_scope_live(struct link *p, uint64_t id, const struct proto_peer_run *runs,
			      uint32_t n_runs, int status)
{
	struct serve_req *r = decode_req_of(p, id);
	struct proto_peer_msg m = { .type = PEER_MSG_VERBS_SCOPE, .id = id };

	if (!r || r->state != DRS_TRANSFER)
		return;
	if (status) {
		dreq_fail(r, PROTO_ERR_INTERNAL,
			  "cannot grant the peer RDMA write access to this request's pages (a memory window bind failed)");
		return;
	}
	m.runs = (struct proto_peer_run *)runs;
	m.n_runs = n_runs;
	if (serve__link_send(p, &m)) {
		dreq_fail(r, PROTO_ERR_INTERNAL, "cannot send the verbs_scope");
		serve__dreq_event(r, DEV_TIMEOUT);
		return;
	}
	KVLOG_DEBUG(p->s->log, "verbs_scope_live", "id=%llu tenant=%s runs=%u",
		    (unsigned long long)id, KVLOG_Q(r->tenant), n_runs);
}

/* link_ops.scope_dead (verbs, memory windows): the invalidations of r's
 * scope completed; if r waits for them to make its final check, it runs
 * now. */
static void decode_scope_dead(struct link *p, uint64_t id)
{
	struct serve_req *r = decode_req_of(p, id);

	if (r && r->state == DRS_SEALING && !r->ended)
		decode_sealed(r);
}

/* link_ops.req_flush_lost: the QP's flush never came, so the peer may
 * still write r's prefix: it never goes back to the free list. */
static void decode_req_flush_lost(struct serve_req *r)
{
	struct sreq_decode *dp = sreq_d(r);
	struct serve *s = r->s;
	struct kvpool_page_info pi;
	int rc;

	if (dp->pages_held) {
		dreq_quarantine(r, "verbs_flush_timeout");
		return;
	}
	if (!dp->fenced)
		return;   /* its pages left with nothing that could write them */
	if (dp->n_prefix && !kvpool_page_info(s->d->pool, dp->table[0].page, &pi) &&
	    pi.state == KVPAGE_QUARANTINED && pi.owner == r->reg.id &&
	    pi.gen == dp->table[0].gen)
		return;   /* the transport quarantined them (its scope) */
	rc = kvpool_quarantine(s->d->pool, r->reg.id, dp->table, dp->n_prefix);
	if (rc)
		KVLOG_ERR(s->log, "invariant_breach", "id=%llu tenant=%s op=quarantine code=%d pages=%u msg=\"left fenced\"",
			  (unsigned long long)r->reg.id, KVLOG_Q(r->tenant), rc, dp->n_prefix);
	else
		KVLOG_WARN(s->log, "pages_quarantined", "id=%llu tenant=%s pages=%u reason=verbs_flush_timeout",
			   (unsigned long long)r->reg.id, KVLOG_Q(r->tenant), dp->n_prefix);
}

/* link_ops.req_lost: both connections to r's peer are torn down; a
 * transfer fails with code and msg, and since nothing can write for it
 * any more, its pages are unfenced (LINK_LOST). */
static bool decode_req_lost(struct serve_req *r, int code, const char *msg)
{
	bool failed = r->state == DRS_TRANSFER || r->state == DRS_SEALING;

	/* a lost peer, not a lying one: the request may go elsewhere (an
	 * integrity loss fails it: what it had received was not KV) */
	if (failed && code != PROTO_ERR_INTEGRITY && decode_failover(r, "link_lost")) {
		serve__dreq_event(r, DEV_LINK_LOST_RETRY);
		return false;
	}
	if (failed)
		dreq_fail_kind(r, code, r->link ? r->link->lost_kind : KVD_INTEGRITY_PEER,
			       "%s", msg ? msg : "the prefill peer was lost during the transfer");
	serve__dreq_event(r, DEV_LINK_LOST);
	return failed;
}

static const struct link_ops decode_link_ops = {
	.on_msg = decode_on_msg,
	.req_lost = decode_req_lost,
	.rx_batch = decode_rx_batch,
	.scope_live = decode_scope_live,
	.scope_dead = decode_scope_dead,
	.req_flush_lost = decode_req_flush_lost,
	.redial = serve__peerdns_redial,
};

/* Decode dials every peers.prefill address (link.c keeps them up), and
 * every address each name resolves to (peerdns.c). */
int serve__decode_start(struct serve *s)
{
	for (unsigned i = 0; i < s->d->cfg.n_peers_prefill && i < KVD_MAX_PEERS; i++) {
		const char *e = s->d->cfg.peers_prefill[i];
		int rc = serve__peerdns_is_name(e) ? serve__peerdns_add(s, e, &decode_link_ops)
						   : serve__link_dial(s, e, &decode_link_ops, NULL);

		if (rc)
			return rc;
	}
	return 0;
}
