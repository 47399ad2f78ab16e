/* serve_prefill.c - prefill: the peer listener, prefill requests, sending.
 *
 * Design. Prefill trusts nothing decode decided. Each prefill_request goes
 * through prefill's *own* admission (invariant 3): the node admits new
 * work, the destination page list is exactly pages_for(prompt) long, every
 * token id is in the vocabulary, and prompt + max_tokens fits this node's
 * advertised context and pool. A refusal is a prefill_reject carrying the
 * typed error; nothing is computed, and no prompt is ever substituted
 * (the incident's placeholder cannot happen: the engine only ever sees the
 * tokens the request carried).
 *
 * An admitted request computes its prompt's KV in this node's pool
 * (engine-owned pages, prefill_only), then its pages go out in batches of
 * at most the negotiated max_batch_bytes through the transport, each page
 * re-tagged for its destination page and generation. prefill_done follows
 * once every batch has left and carries the first sampled token. The
 * pages stay held until decode's release_ack (or abort, answered with
 * abort_ack once no batch for the request is still queued), or until the
 * connection to that decode node is gone.
 *
 * Connections: every accepted connection starts with one frame. "hello"
 * makes it a control connection (hellos must match: model fingerprint, KV
 * dtype, layout); "data" with the session from our hello makes it that
 * control connection's data connection, whose socket is handed to a tcp
 * transport (dup + uv_tcp_open, so libuv handles never change owner).
 */
#include "daemon/serve_int.h"
#include "conf/util.h"

#include <errno.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PREFILL_SEND_WINDOW 2     /* batches queued per request at once */
#define SLOW_BATCH_MS 300         /* fault point slow_batch */
#define STUCK_SUBMIT_MS 2500      /* fault point stuck_submit */

static void pconn_lost(struct pconn *pc, const char *why);

/* The daemon's view of the decode peers that completed a handshake. */
static void pconn_figures_update(struct serve *s)
{
	struct kvd_peer_figures pf = { 0 };

	for (const struct pconn *q = s->pconns; q; q = q->next) {
		if (!q->hello_done || q->closing || q->is_data)
			continue;
		serve__figures_add(&pf, &q->hello);
	}
	s->d->peers = pf;
}
static void prefill_send_more(struct serve_req *r);
static void pconn_data_resume(struct pconn *pc);
static bool pconn_data_full(const struct pconn *pc);

/* Every control frame to a decode peer goes through its bounded write
 * queue (net/wbound.h): past listen.write_queue_soft we stop reading the
 * peer (a peer that does not read our answers - abort_acks, rejects -
 * cannot make us produce more); past write_queue_hard nothing more is
 * queued and the connection is torn down at the next heartbeat tick, not
 * here: callers of pconn_send are in the middle of a request's state
 * change and must not see its connection vanish under them. */
static int pconn_send(struct pconn *pc, const struct proto_peer_msg *m)
{
	if (!pc || pc->closing)
		return -EPIPE;
	return serve__link_send(&pc->wb, &pc->wb_dead,
				pc->sealed ? &pc->ss.tx : NULL, m);
}

/* Heartbeat tick: a control queue past its hard bound, or past the soft
 * bound for write_stall_timeout_ms, ends the connection (and with it
 * every request of that peer). True when pc was torn down. */
static bool pconn_write_check(struct pconn *pc, uint64_t now)
{
	const char *why = serve__link_write_poll(pc->s, &pc->wb, pc->wb_dead, now,
						 &pc->last_heard_ns,
						 pc->hello.node[0] ? pc->hello.node : "?");

	if (why)
		pconn_lost(pc, why);
	return why != NULL;
}

static void prefill_reject(struct pconn *pc, uint64_t remote_id, int code,
			   const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static void prefill_reject(struct pconn *pc, uint64_t remote_id, int code,
			   const char *fmt, ...)
{
	struct proto_peer_msg m = { .type = PEER_MSG_PREFILL_REJECT,
				    .id = remote_id, .code = code };
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(m.message, sizeof(m.message), fmt, ap);
	va_end(ap);
	KVLOG_WARN(pc->s->log, "prefill_reject",
		   "peer_node=%s remote_id=%llu code=%s msg=%s",
		   KVLOG_Q(pc->hello.node), (unsigned long long)remote_id,
		   proto_err_name(code), KVLOG_Q(m.message));
	(void)pconn_send(pc, &m);
}

/* ---- the prefill request machine (daemon/machine.h: preq) -------------------- */

static void preq_fail(struct serve_req *r, int code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* The first failure is the one decode hears about. */
static void preq_fail(struct serve_req *r, int code, const char *fmt, ...)
{
	va_list ap;

	if (r->fail_code)
		return;
	r->fail_code = code;
	va_start(ap, fmt);
	vsnprintf(r->fail_msg, sizeof(r->fail_msg), fmt, ap);
	va_end(ap);
}

static void prefill_detach(struct serve_req *r)
{
	if (r->pc) {
		r->pc->n_reqs--;
		r->pc->n_pages -= r->n_dst;
		r->pc = NULL;
	}
}

/* abort_ack, possibly late (fault point slow_abort_ack): a delayed ack
 * finds its connection again by session, which may be gone by then. */
struct late_ack {
	uv_timer_t timer;
	struct serve *s;
	uint64_t conn_id;
	uint64_t remote_id;
};

static void late_ack_closed(uv_handle_t *h)
{
	struct late_ack *a = kvd_container_of((uv_timer_t *)h, struct late_ack, timer);

	a->s->closes_pending--;
	free(a);
}

static void late_ack_cb(uv_timer_t *t)
{
	struct late_ack *a = kvd_container_of(t, struct late_ack, timer);
	struct proto_peer_msg ack = { .type = PEER_MSG_ABORT_ACK, .id = a->remote_id };

	for (struct pconn *pc = a->s->pconns; pc; pc = pc->next)
		if (pc->conn_id == a->conn_id && !pc->closing)
			(void)pconn_send(pc, &ack);
	uv_close((uv_handle_t *)t, late_ack_closed);
}

static void prefill_send_abort_ack(struct serve *s, struct pconn *pc,
				   uint64_t remote_id)
{
	struct proto_peer_msg ack = { .type = PEER_MSG_ABORT_ACK, .id = remote_id };
	struct late_ack *a;

	if (!pc)
		return;
	if (kvd_fault_fire(&s->fault, KVD_FAULT_SLOW_ABORT_ACK) && !s->stopping &&
	    (a = calloc(1, sizeof(*a))) != NULL) {
		KVLOG_WARN(s->log, "fault", "point=slow_abort_ack remote_id=%llu delay_ms=1000",
			   (unsigned long long)remote_id);
		a->s = s;
		a->conn_id = pc->conn_id;
		a->remote_id = remote_id;
		/* counted from now: the serving layer outlives the timer */
		s->closes_pending++;
		uv_timer_init(&s->d->loop, &a->timer);
		uv_timer_start(&a->timer, late_ack_cb, 1000, 0);
		return;
	}
	(void)pconn_send(pc, &ack);
}

/* Prefill itself fails the request: tell decode (it answers abort_ack,
 * which needs nothing from us: decode never writes into our pages). */
static void preq_send_abort(struct serve_req *r)
{
	struct proto_peer_msg m = { .type = PEER_MSG_ABORT, .id = r->remote_id,
				    .code = r->fail_code };

	snprintf(m.message, sizeof(m.message), "%s", r->fail_msg);
	KVLOG_WARN(r->s->log, "prefill_failed", "id=%llu remote_id=%llu code=%s msg=%s",
		   (unsigned long long)r->reg.id, (unsigned long long)r->remote_id,
		   proto_err_name(r->fail_code), KVLOG_Q(r->fail_msg));
	if (r->pc)
		(void)pconn_send(r->pc, &m);
}

static void preq_abort_ack(struct serve_req *r)
{
	KVLOG_DEBUG(r->s->log, "abort_ack", "id=%llu remote_id=%llu state=%s",
		    (unsigned long long)r->reg.id, (unsigned long long)r->remote_id,
		    machine_state_name(&preq_machine, r->state));
	r->ack_owed = false;
	prefill_send_abort_ack(r->s, r->pc, r->remote_id);
}

/* No release_ack within release_timeout_ms of prefill_done: release our
 * pages anyway. This is safe on prefill, and only here: decode never
 * writes into prefill's pages (KV flows one way, from our pages into
 * decode's), and every batch of this request has already been reported
 * sent (prefill_done leaves only then), so nothing local or remote can
 * still touch them (invariant 2). Without this bound a peer that never
 * acknowledges would hold our pages as long as its connection lives. A
 * late release_ack finds no request and is ignored. */
static void preq_timer_cb(uv_timer_t *t)
{
	serve__preq_event(t->data, PEV_TIMEOUT);
}

static void preq_count_timeout(struct serve_req *r)
{
	r->s->d->counters.release_timeouts++;
	KVLOG_WARN(r->s->log, "release_timeout",
		   "id=%llu remote_id=%llu peer_node=%s pages=%u release_timeout_ms=%u msg=\"no release_ack; pages released\"",
		   (unsigned long long)r->reg.id, (unsigned long long)r->remote_id,
		   r->pc ? r->pc->hello.node : "?", r->n_dst,
		   r->s->d->cfg.release_timeout_ms);
	preq_fail(r, PROTO_ERR_TIMEOUT, "no release_ack within release_timeout_ms");
}

static void prefill_done_send(struct serve_req *r)
{
	struct proto_peer_msg m = { .type = PEER_MSG_PREFILL_DONE, .id = r->remote_id };

	m.first_token = r->first_token;
	m.done_tokens = r->n_kv;
	m.batches = r->batches_sent;
	m.done_pages = r->n_dst;
	(void)pconn_send(r->pc, &m);
	KVLOG_DEBUG(r->s->log, "prefill_done", "id=%llu remote_id=%llu batches=%u pages=%u tokens=%u first_token=%u",
		    (unsigned long long)r->reg.id, (unsigned long long)r->remote_id,
		    r->batches_sent, r->n_dst, r->n_kv, r->first_token);
	/* the pages stay held until release_ack, abort, the connection to
	 * the decode node is gone, or release_timeout_ms */
}

static void preq_act(struct serve_req *r, uint32_t a)
{
	struct serve *s = r->s;

	switch (a) {
	case PA_SEND_REJECT:
		if (r->pc)
			prefill_reject(r->pc, r->remote_id,
				       r->fail_code ? r->fail_code : PROTO_ERR_INTERNAL,
				       "%s", r->fail_msg);
		return;
	case PA_SEND_ABORT:
		preq_send_abort(r);
		return;
	case PA_OWE_ACK:
		r->ack_owed = true;
		return;
	case PA_SEND_ABORT_ACK:
		preq_abort_ack(r);
		return;
	case PA_ACK_OWED:
		if (r->ack_owed)
			preq_abort_ack(r);
		return;
	case PA_DETACH_LINK:
		prefill_detach(r);
		return;
	case PA_SEND_MORE:
		prefill_send_more(r);
		return;
	case PA_SEND_DONE:
		prefill_done_send(r);
		return;
	case PA_TIMER_RELEASE:
		serve__timer_start(r, s->d->cfg.release_timeout_ms, preq_timer_cb);
		return;
	case PA_RELEASED:
		r->released_by_peer = true;
		return;
	case PA_COUNT_TIMEOUT:
		preq_count_timeout(r);
		return;
	case PA_FREE_ENGINE:
		serve__compute_free(s, r, false, false);
		return;
	}
}

/* The only way into DONE. */
static void preq_finish(struct serve_req *r)
{
	KVD_ASSERT(r->s->log, !r->pc && !r->ereq && !r->sends_pending,
		   "id=%llu msg=\"a prefill request ends attached, in the engine or with batches queued\"",
		   (unsigned long long)r->reg.id);
	if (r->fail_code && !r->released_by_peer)
		KVLOG_INFO(r->s->log, "prefill_aborted", "id=%llu remote_id=%llu reason=%s",
			   (unsigned long long)r->reg.id,
			   (unsigned long long)r->remote_id, KVLOG_Q(r->fail_msg));
	serve__req_end(r, r->released_by_peer && !r->fail_code);
}

void serve__preq_event(struct serve_req *r, enum preq_event ev)
{
	const struct machine_step *st;

	if (r->ended)
		return;
	st = serve__req_step(r, &preq_machine, ev);
	if (st)
		for (uint32_t a = 1; a && a < (1u << PA__BITS) && !r->ended; a <<= 1)
			if (st->actions & a)
				preq_act(r, a);
	if (r->ended)
		return;
	/* ABORT_DRAINING is left as soon as no batch is queued */
	if (r->state == PRS_ABORT_DRAINING && !r->sends_pending)
		serve__preq_event(r, PEV_DRAINED);
	else if (r->state == PRS_DONE)
		preq_finish(r);
}

static struct serve_req *prefill_find(struct pconn *pc, uint64_t remote_id)
{
	for (struct serve_req *r = pc->s->reqs; r; r = r->next)
		if (r->kind == SREQ_PREFILL && r->pc == pc &&
		    r->remote_id == remote_id && !r->ended)
			return r;
	return NULL;
}

void serve__prefill_abort(struct serve_req *r, const char *reason)
{
	preq_fail(r, PROTO_ERR_INTERNAL, "%s", reason);
	serve__preq_event(r, PEV_OP_ABORT);
}

/* ---- admission ----------------------------------------------------------------- */

/* Fault point stuck_submit: the submit "was queued" for STUCK_SUBMIT_MS,
 * then the engine refuses it as busy. Found again by id: the request may
 * have ended by then. */
struct stuck_submit {
	uv_timer_t timer;
	struct serve *s;
	uint64_t id;
};

static void stuck_submit_closed(uv_handle_t *h)
{
	struct stuck_submit *k = kvd_container_of((uv_timer_t *)h, struct stuck_submit, timer);

	k->s->closes_pending--;
	free(k);
}

static void stuck_submit_cb(uv_timer_t *t)
{
	struct stuck_submit *k = kvd_container_of(t, struct stuck_submit, timer);
	struct serve_req *r = serve__req_find(k->s, k->id);
	struct compute_msg m = { .kind = COMPUTE_MSG_SUBMITTED, .error = ENGINE_E_BUSY };

	if (r) {
		m.owner = r->reg.id;
		serve__prefill_engine_msg(r, &m);
	}
	uv_close((uv_handle_t *)t, stuck_submit_closed);
}

static int prefill_stuck_submit(struct serve_req *r)
{
	struct serve *s = r->s;
	struct stuck_submit *k = calloc(1, sizeof(*k));

	if (!k)
		return -ENOMEM;
	KVLOG_WARN(s->log, "fault", "point=stuck_submit id=%llu delay_ms=%u",
		   (unsigned long long)r->reg.id, STUCK_SUBMIT_MS);
	k->s = s;
	k->id = r->reg.id;
	s->closes_pending++;
	uv_timer_init(&s->d->loop, &k->timer);
	uv_timer_start(&k->timer, stuck_submit_cb, STUCK_SUBMIT_MS, 0);
	return 0;
}

/* Per-peer caps (invariant 11): one decode node may hold at most
 * peers.max_requests requests and s->peer_max_pages pages of this node,
 * so a peer that never acknowledges cannot take the whole pool from the
 * others. Checked before anything is reserved or computed. True when m
 * was rejected. */
static bool prefill_peer_cap(struct pconn *pc, const struct proto_peer_msg *m)
{
	struct serve *s = pc->s;
	const char *cap = NULL;

	if (pc->n_reqs >= s->d->cfg.peer_max_requests)
		cap = "max_requests";
	else if ((uint64_t)pc->n_pages + m->n_pages > s->peer_max_pages)
		cap = "max_pages";
	if (!cap)
		return false;
	s->d->counters.rejected[KVD_REJECT_OVERLOADED]++;
	KVLOG_WARN(s->log, "peer_cap",
		   "peer_node=%s remote_id=%llu cap=%s requests=%u max_requests=%u pages=%u want_pages=%u max_pages=%u",
		   pc->hello.node, (unsigned long long)m->id, cap, pc->n_reqs,
		   s->d->cfg.peer_max_requests, pc->n_pages, m->n_pages,
		   s->peer_max_pages);
	prefill_reject(pc, m->id, PROTO_ERR_OVERLOADED,
		       "decode node %s holds %u requests and %u pages of prefill node %s (caps: %u requests, %u pages)",
		       pc->hello.node, pc->n_reqs, pc->n_pages, s->d->cfg.node_name,
		       s->d->cfg.peer_max_requests, s->peer_max_pages);
	return true;
}

/* Prefill's own admission (invariant 3). True when m was refused (a
 * prefill_reject went out; nothing was created). */
static bool prefill_refuse(struct pconn *pc, const struct proto_peer_msg *m)
{
	struct serve *s = pc->s;
	struct kvpool *pool = s->d->pool;
	uint64_t need = (uint64_t)m->n_tokens + m->max_tokens;
	uint64_t lim = serve__own_limit(s);
	uint32_t n_vocab = tokenizer_n_vocab(s->tok);

	if (kvd_request_gate(s->reqtab) || s->stopping) {
		s->d->counters.rejected[KVD_REJECT_DRAINING]++;
		prefill_reject(pc, m->id, PROTO_ERR_DRAINING,
			       "the prefill node is draining");
		return true;
	}
	if (need > lim) {
		KVLOG_WARN(s->log, "admission_reject",
			   "remote_id=%llu peer_node=%s reason=prompt_too_long prompt_tokens=%u max_tokens=%u need=%llu limit=%llu context=%u pool_tokens=%llu",
			   (unsigned long long)m->id, KVLOG_Q(pc->hello.node),
			   m->n_tokens,
			   m->max_tokens, (unsigned long long)need,
			   (unsigned long long)lim, s->d->cap.advertised_context,
			   (unsigned long long)s->d->cap.pool_tokens);
		s->d->counters.rejected[KVD_REJECT_PROMPT_TOO_LONG]++;
		prefill_reject(pc, m->id, PROTO_ERR_PROMPT_TOO_LONG,
			       "prompt (%u tokens) + max_tokens (%u) = %llu exceeds what prefill node %s can hold (%llu tokens: context %u, pool %llu)",
			       m->n_tokens, m->max_tokens, (unsigned long long)need,
			       s->d->cfg.node_name, (unsigned long long)lim,
			       s->d->cap.advertised_context,
			       (unsigned long long)s->d->cap.pool_tokens);
		return true;
	}
	if (m->n_pages != kvpool_pages_for(pool, m->n_tokens)) {
		s->d->counters.rejected[KVD_REJECT_INVALID]++;
		prefill_reject(pc, m->id, PROTO_ERR_INVALID_REQUEST,
			       "%u destination pages for %u prompt tokens; %u expected",
			       m->n_pages, m->n_tokens,
			       kvpool_pages_for(pool, m->n_tokens));
		return true;
	}
	for (uint32_t i = 0; i < m->n_tokens; i++) {
		if (m->tokens[i] >= n_vocab) {
			s->d->counters.rejected[KVD_REJECT_INVALID]++;
			prefill_reject(pc, m->id, PROTO_ERR_INVALID_REQUEST,
				       "token id %u outside the vocabulary", m->tokens[i]);
			return true;
		}
	}
	if (!pc->data || prefill_find(pc, m->id)) {
		prefill_reject(pc, m->id, PROTO_ERR_INTERNAL,
			       pc->data ? "duplicate request id" : "no data connection");
		return true;
	}
	return prefill_peer_cap(pc, m);
}

/* kvctl abort ID, the drain deadline: OP_ABORT. */
static int preq_abort(struct kvd_request *reg, const char *reason)
{
	serve__prefill_abort(kvd_container_of(reg, struct serve_req, reg), reason);
	return 0;
}

static const struct serve_req_ops preq_ops = {
	.reg = { "prefill", KVD_REQ_SERVE, preq_abort },
	.engine_msg = serve__prefill_engine_msg,
};

static void prefill_admit(struct pconn *pc, struct proto_peer_msg *m)
{
	struct serve *s = pc->s;
	struct serve_req *r;
	int rc;

	if (prefill_refuse(pc, m))
		return;
	r = serve__req_new(s, SREQ_PREFILL);
	if (!r) {
		prefill_reject(pc, m->id, PROTO_ERR_INTERNAL, "out of memory");
		return;
	}
	r->rops = &preq_ops;
	r->pc = pc;
	pc->n_reqs++;
	r->remote_id = m->id;
	r->n_prompt = m->n_tokens;
	r->max_tokens = m->max_tokens;
	r->sp = (struct sampler_params){ .temperature = m->temperature,
					 .top_k = m->top_k, .top_p = m->top_p,
					 .seed = m->seed };
	r->prompt = malloc(sizeof(int32_t) * m->n_tokens);
	r->dst = m->pages;        /* take the array */
	r->n_dst = m->n_pages;
	pc->n_pages += r->n_dst;
	m->pages = NULL;
	m->n_pages = 0;
	if (!r->prompt) {
		preq_fail(r, PROTO_ERR_INTERNAL, "out of memory");
		serve__preq_event(r, PEV_REFUSE);
		return;
	}
	for (uint32_t i = 0; i < m->n_tokens; i++)
		r->prompt[i] = (int32_t)m->tokens[i];
	serve__req_register(r);
	if (kvd_fault_fire(&s->fault, KVD_FAULT_STUCK_SUBMIT))
		rc = prefill_stuck_submit(r);
	else
		rc = serve__compute_submit(s, r, r->prompt, r->n_prompt, r->max_tokens,
					   true, NULL, 0, 0);
	if (rc) {
		preq_fail(r, PROTO_ERR_INTERNAL, "out of memory");
		serve__preq_event(r, PEV_REFUSE);
		return;
	}
	serve__preq_event(r, PEV_ADMIT);
}

/* ---- sending --------------------------------------------------------------------- */

/* A send in flight names its request by id, never by pointer: the
 * request may have ended when the transport reports the batch. */
struct prefill_ticket {
	struct serve *s;
	uint64_t id;
};

static void prefill_sent_cb(void *arg, int status)
{
	struct prefill_ticket *t = arg;
	struct serve_req *r = serve__req_find(t->s, t->id);
	struct pconn *pc;

	free(t);
	if (!r)
		return;
	KVD_ASSERT(r->s->log, r->sends_pending > 0,
		   "id=%llu msg=\"a batch reported sent that was never queued\"",
		   (unsigned long long)r->reg.id);
	r->sends_pending--;
	pc = r->pc;
	if (status == 0) {
		r->batches_sent++;
		serve__preq_event(r, PEV_BATCH_SENT);
	} else {
		preq_fail(r, PROTO_ERR_INTERNAL, "the KV batch could not be sent");
		serve__preq_event(r, PEV_SEND_FAIL);
	}
	if (pc)
		pconn_data_resume(pc);
}

static void prefill_slow_cb(uv_timer_t *t)
{
	struct serve_req *r = t->data;

	r->slow_waited = true;   /* the delay for this batch is over */
	prefill_send_more(r);
}

/* Bytes a data connection may hold queued before new batches wait: the
 * configured soft bound, but never less than two batches, so a fast
 * reader always has the next batch in the pipe. */
static size_t pconn_data_soft(const struct pconn *pc)
{
	return KVD_MAX((size_t)pc->s->d->cfg.write_queue_soft,
		       2 * (size_t)pc->max_batch_bytes);
}

/* A decode peer that does not read its data connection must not make
 * us hold batch after batch (sealed batches are copies): past the soft
 * bound no request of it sends more until the queue drains. */
static bool pconn_data_full(const struct pconn *pc)
{
	return pc->data && pc->data->ops->queued &&
	       pc->data->ops->queued(pc->data) > pconn_data_soft(pc);
}

/* Fault points on a batch's entries before it is queued. */
static void prefill_fault_entries(struct serve_req *r, struct transport_page *pages,
				  uint32_t n)
{
	struct serve *s = r->s;

	if (r->next_page == 0 &&
	    kvd_fault_fire(&s->fault, KVD_FAULT_STALE_GENERATION)) {
		KVLOG_WARN(s->log, "fault", "point=stale_generation id=%llu page=%u",
			   (unsigned long long)r->reg.id, pages[0].dst.dst_page);
		pages[0].dst.dst_gen++;
	}
	if (n >= 2 && kvd_fault_fire(&s->fault, KVD_FAULT_DUP_ENTRY)) {
		KVLOG_WARN(s->log, "fault", "point=dup_entry id=%llu index=%u",
			   (unsigned long long)r->reg.id, pages[0].dst.index);
		pages[1] = pages[0];
	}
}

/* Queue one batch of n pages from r->next_page: 0, or the request failed
 * (SEND_FAIL has been taken). */
static int prefill_send_batch(struct serve_req *r, uint32_t n)
{
	struct serve *s = r->s;
	uint32_t pt = kvpool_geom(s->d->pool)->page_tokens;
	struct transport_page *pages = calloc(n, sizeof(*pages));
	struct prefill_ticket *t = malloc(sizeof(*t));
	int rc;

	if (!pages || !t) {
		free(pages);
		free(t);
		preq_fail(r, PROTO_ERR_INTERNAL, "out of memory");
		serve__preq_event(r, PEV_SEND_FAIL);
		return -ENOMEM;
	}
	for (uint32_t i = 0; i < n; i++) {
		uint32_t idx = r->next_page + i;

		pages[i].src_page = r->src[idx].page;
		pages[i].dst = (struct xfer_entry){
			.dst_page = r->dst[idx].page, .index = idx,
			.dst_gen = r->dst[idx].gen,
			.tokens = KVD_MIN(pt, r->n_kv - idx * pt) };
	}
	prefill_fault_entries(r, pages, n);
	t->s = s;
	t->id = r->reg.id;
	rc = transport_send(r->pc->data, r->remote_id, r->batches_sent + r->sends_pending,
			    pages, n, prefill_sent_cb, t);
	free(pages);
	if (rc) {
		free(t);
		preq_fail(r, PROTO_ERR_INTERNAL, "the transport refused the batch");
		serve__preq_event(r, PEV_SEND_FAIL);
		return rc;
	}
	r->sends_pending++;
	r->next_page += n;
	return 0;
}

/* PA_SEND_MORE (also resumed by the slow_batch timer and a drained data
 * connection): at most PREFILL_SEND_WINDOW batches of r queued at once;
 * ALL_SENT once every batch has been reported. */
static void prefill_send_more(struct serve_req *r)
{
	struct serve *s = r->s;
	struct pconn *pc = r->pc;
	uint32_t limit = r->n_dst, per;

	if (r->ended || r->state != PRS_SENDING || !pc || !pc->data)
		return;
	if (r->short_fault)     /* fault point: one page fewer, same report */
		limit--;
	per = xfer_batch_pages_max(pc->max_batch_bytes, s->page_bytes);
	while (r->next_page < limit && r->sends_pending < PREFILL_SEND_WINDOW) {
		if (pconn_data_full(pc)) {
			pc->data_waiters = true;   /* resumed once it drains */
			return;
		}
		if (!r->slow_waited &&
		    kvd_fault_fire(&s->fault, KVD_FAULT_SLOW_BATCH)) {
			serve__timer_start(r, SLOW_BATCH_MS, prefill_slow_cb);
			return;
		}
		r->slow_waited = false;
		if (prefill_send_batch(r, KVD_MIN(per, limit - r->next_page)))
			return;
	}
	if (r->next_page >= limit && !r->sends_pending)
		serve__preq_event(r, PEV_ALL_SENT);
}

/* Fault point: a NaN in position 0 of the first page's layer-0 K block,
 * after compute and verify, before checksumming: only decode's finite
 * check can catch it. */
static void prefill_fault_nan(struct serve_req *r, const struct kvpool_ref *ref)
{
	struct serve *s = r->s;
	const struct kvmem *mem = &s->d->mem;
	char *page = kvpool_page_addr(s->d->pool, ref->page);
	uint32_t nan32 = 0x7fc00000u;
	uint16_t nan16 = 0x7e00u;
	bool f16 = kvpool_geom(s->d->pool)->dtype == KV_DTYPE_F16;

	KVLOG_WARN(s->log, "fault", "point=nan_kv id=%llu page=%u",
		   (unsigned long long)r->reg.id, ref->page);
	if (page)
		(void)mem->ops->write(mem->ctx,
				      page + kvpool_block_offset(s->d->pool, 0, 0),
				      f16 ? (const void *)&nan16 : (const void *)&nan32,
				      f16 ? 2 : 4);
}

/* The engine computed the prompt: check our own pages (COMPUTED), or
 * fail (COMPUTE_FAIL). */
static enum preq_event prefill_computed(struct serve_req *r, const struct compute_msg *m)
{
	struct serve *s = r->s;
	uint32_t pt = kvpool_geom(s->d->pool)->page_tokens;
	uint32_t bad = 0;
	int rc;

	if (!m->table || m->n_kv != r->n_prompt ||
	    m->n_table != kvpool_pages_for(s->d->pool, m->n_kv) ||
	    m->n_table != r->n_dst) {
		preq_fail(r, PROTO_ERR_INTERNAL,
			  "prefill computed a different number of positions or pages than requested");
		return PEV_COMPUTE_FAIL;
	}
	rc = kvpool_verify(s->d->pool, r->reg.id, m->table, m->n_table, m->n_kv, &bad);
	if (rc) {
		s->d->counters.integrity_failures++;
		preq_fail(r, PROTO_ERR_INTEGRITY, "prefill's own pages failed verification");
		return PEV_COMPUTE_FAIL;
	}
	/* Invariant 10: positions past n_kv of the last page still hold an
	 * earlier owner's K/V. Zero them before any byte of the request is
	 * sent (batches carry whole pages). */
	rc = kvpool_zero_tail(s->d->pool, r->reg.id, &m->table[m->n_table - 1],
			      m->n_kv - (m->n_table - 1) * pt);
	if (rc) {
		preq_fail(r, PROTO_ERR_INTERNAL,
			  "cannot clear the unfilled tail of the last page");
		return PEV_COMPUTE_FAIL;
	}
	if (kvd_fault_fire(&s->fault, KVD_FAULT_NAN_KV))
		prefill_fault_nan(r, &m->table[0]);
	free(r->src);
	r->src = malloc(sizeof(*r->src) * m->n_table);
	if (!r->src) {
		preq_fail(r, PROTO_ERR_INTERNAL, "out of memory");
		return PEV_COMPUTE_FAIL;
	}
	memcpy(r->src, m->table, sizeof(*r->src) * m->n_table);
	r->n_kv = m->n_kv;
	if (kvd_fault_fire(&s->fault, KVD_FAULT_SHORT_TRANSFER) && r->n_dst > 0) {
		KVLOG_WARN(s->log, "fault", "point=short_transfer id=%llu pages=%u sent=%u",
			   (unsigned long long)r->reg.id, r->n_dst, r->n_dst - 1);
		r->short_fault = true;
	}
	return PEV_COMPUTED;
}

static int prefill_submit_code(int e)
{
	return e == KVPOOL_E_FULL || e == ENGINE_E_BUSY ? PROTO_ERR_OVERLOADED :
	       e == ENGINE_E_TOO_LONG ? PROTO_ERR_PROMPT_TOO_LONG :
	       e == ENGINE_E_INVALID ? PROTO_ERR_INVALID_REQUEST :
	       PROTO_ERR_INTERNAL;
}

void serve__prefill_engine_msg(struct serve_req *r, const struct compute_msg *m)
{
	switch (m->kind) {
	case COMPUTE_MSG_SUBMITTED:
		if (m->error) {
			/* the refusal is what the reject says, also after an
			 * abort (decode ignores it then) */
			r->fail_code = 0;
			preq_fail(r, prefill_submit_code(m->error), "prefill engine refused: %s",
				  engine_strerror(m->error));
			serve__preq_event(r, PEV_SUBMIT_ERR);
			return;
		}
		r->ereq = m->req;
		serve__preq_event(r, PEV_SUBMITTED);
		return;
	case COMPUTE_MSG_TOKEN:
		if (r->state == PRS_COMPUTE)
			r->first_token = (uint32_t)m->token;
		serve__preq_event(r, PEV_TOKEN);
		return;
	case COMPUTE_MSG_DONE:
		if (r->state != PRS_COMPUTE) {
			serve__preq_event(r, PEV_COMPUTE_FAIL);   /* late: ignored */
			return;
		}
		if (m->finish == ENGINE_FINISH_STOP)
			r->first_token = (uint32_t)r->s->model->eos_id;
		if (m->finish == ENGINE_FINISH_PREFILLED || m->finish == ENGINE_FINISH_STOP) {
			serve__preq_event(r, prefill_computed(r, m));
			return;
		}
		preq_fail(r, m->error == ENGINE_E_INTEGRITY ? PROTO_ERR_INTEGRITY
							    : PROTO_ERR_INTERNAL,
			  "%s", engine_strerror(m->error));
		serve__preq_event(r, PEV_COMPUTE_FAIL);
		return;
	case COMPUTE_MSG_FREED:
		serve__preq_event(r, PEV_FREED);
		return;
	}
}

/* ---- control messages ------------------------------------------------------------ */

/* ---- handshake: authentication, hello, data connection ----------------------- */

/* A bare refusal: one word (and, for a mismatch between proven peers or
 * on a keyless loopback link, the field), one escaped log line, close.
 * Nothing about this node is revealed to a peer that has not proved. */
static void pconn_refuse(struct pconn *pc, const char *reason, const char *field,
			 const char *why)
{
	struct proto_peer_msg m = { .type = PEER_MSG_REFUSED };

	if (field && field[0])
		snprintf(m.reason, sizeof(m.reason), "%s:%s", reason, field);
	else
		snprintf(m.reason, sizeof(m.reason), "%s", reason);
	KVLOG_ERR(pc->s->log, "peer_refused", "peer=%s peer_node=%s reason=%s msg=%s",
		  KVLOG_Q(pc->addr),
		  KVLOG_Q(pc->hello_done || pc->sealed ?
			      pc->hello.node : "?"),
		  m.reason, KVLOG_Q(why));
	(void)pconn_send(pc, &m);
	pconn_lost(pc, NULL);
}

/* auth_hello: the first frame of a keyed control connection. Answer with
 * our nonce only: nothing else before decode has proved. */
static void pconn_on_auth_hello(struct pconn *pc, const struct proto_peer_msg *m)
{
	struct proto_peer_msg ch = { .type = PEER_MSG_AUTH_CHALLENGE };

	if (!pc->s->key.set) {
		pconn_refuse(pc, "no_key", NULL,
			     "this node has no peers.key_file: it peers only without authentication, over loopback");
		return;
	}
	if (m->version != PROTO_PEER_VERSION) {
		pconn_refuse(pc, "version", NULL, "protocol version differs");
		return;
	}
	memcpy(pc->nonce_d, m->nonce, PEER_AUTH_BYTES);
	peer_auth_random(pc->nonce_p);
	memcpy(ch.nonce, pc->nonce_p, PEER_AUTH_BYTES);
	pc->phase = PCONN_AUTH_PROOF;
	(void)pconn_send(pc, &ch);
}

/* Decode's proof: check it, prove ourselves, derive the link's keys;
 * every frame after our proof is sealed, both ways. */
static void pconn_on_auth_proof(struct pconn *pc, const struct proto_peer_msg *m)
{
	struct serve *s = pc->s;
	struct proto_peer_msg pr = { .type = PEER_MSG_AUTH_PROOF };

	if (peer_auth_check(&s->key, PEER_SIDE_DECODE, pc->nonce_d, pc->nonce_p,
			    m->proof)) {
		s->d->counters.peer_auth_failures++;
		pconn_refuse(pc, "auth_failed", NULL,
			     "the peer did not prove it holds the cluster key");
		return;
	}
	peer_auth_proof(&s->key, PEER_SIDE_PREFILL, pc->nonce_d, pc->nonce_p, pr.proof);
	if (pconn_send(pc, &pr)) {
		pconn_lost(pc, NULL);
		return;
	}
	peer_session_derive(&pc->ss, &s->key, PEER_SIDE_PREFILL, pc->nonce_d,
			    pc->nonce_p, s->d->cfg.encrypt);
	frame_decoder_set_opener(&pc->dec, peer_frame_open, &pc->ss.rx);
	pc->sealed = true;
	frame_decoder_set_max(&pc->dec, SERVE_PEER_FRAME_MAX);
	memcpy(pc->token, pc->ss.token, PEER_AUTH_BYTES);
	pc->phase = PCONN_HELLO;
}

static void pconn_on_hello(struct pconn *pc, const struct proto_peer_msg *m)
{
	struct serve *s = pc->s;
	struct proto_peer_msg reply = { .type = PEER_MSG_HELLO };
	char field[32] = "", why[200] = "";

	if (proto_peer_hello_match(&s->my_hello, &m->hello, field, sizeof(field),
				   why, sizeof(why)) ||
	    !strcmp(m->hello.role, "prefill")) {
		if (!field[0]) {
			snprintf(field, sizeof(field), "role");
			snprintf(why, sizeof(why), "a prefill node cannot be a decode peer");
		}
		pc->hello = m->hello;   /* for the log line (escaped there) */
		pconn_refuse(pc, "mismatch", field, why);
		return;
	}
	pc->hello = m->hello;
	pc->hello_done = true;
	frame_decoder_set_max(&pc->dec, SERVE_PEER_FRAME_MAX);
	pc->max_batch_bytes = KVD_MIN(s->d->cfg.max_batch_bytes, m->hello.max_batch_bytes);
	pc->checksum = s->d->cfg.checksum || m->hello.checksum;
	reply.hello = s->my_hello;
	if (!pc->sealed) {
		/* keyless (loopback) link: a random token binds the data
		 * connection; a keyed link derived one from its keys */
		peer_auth_random(pc->token);
		memcpy(reply.hello.session, pc->token, PEER_AUTH_BYTES);
		reply.hello.has_session = true;
	}
	pc->has_token = true;
	(void)pconn_send(pc, &reply);
	pconn_figures_update(s);
	kvd_daemon_capacity(s->d, "peer", NULL);
	KVLOG_INFO(s->log, "peer_capacity",
		   "peer_node=%s peer_role=%s peer_pool_tokens=%llu peer_context=%llu own_context=%u own_pool_tokens=%llu authenticated=%s",
		   KVLOG_Q(m->hello.node),
		   KVLOG_Q(m->hello.role),
		   (unsigned long long)m->hello.pool_tokens,
		   (unsigned long long)m->hello.context,
		   s->d->cap.advertised_context,
		   (unsigned long long)s->d->cap.pool_tokens,
		   pc->sealed ? "yes" : "no");
}

static void pconn_data_closed(void *arg, int status)
{
	struct pconn *pc = arg;

	pconn_lost(pc, status ? "data connection error" : "data connection closed");
}

/* The control connection a data token belongs to: compared in constant
 * time, and usable once (has_token drops when the data connection binds),
 * so a racing process can neither guess nor reuse one. */
static struct pconn *pconn_by_token(struct serve *s, const uint8_t *token)
{
	for (struct pconn *pc = s->pconns; pc; pc = pc->next)
		if (pc->hello_done && pc->has_token && !pc->closing && !pc->data &&
		    !sodium_memcmp(pc->token, token, PEER_AUTH_BYTES))
			return pc;
	return NULL;
}

static void pconn_on_data(struct pconn *tmp, const struct proto_peer_msg *m)
{
	struct serve *s = tmp->s;
	struct pconn *pc;
	struct transport_cfg tc = { 0 };
	uv_os_fd_t fd;
	int nfd, rc;

	pc = pconn_by_token(s, m->token);
	if (!pc) {
		s->d->counters.peer_auth_failures++;
		pconn_refuse(tmp, "bad_token", NULL,
			     "a data connection presented an unknown or used token");
		return;
	}
	pc->has_token = false;
	tc.pool = s->d->pool;
	tc.mem = &s->d->mem;
	tc.page_bytes = s->page_bytes;
	tc.checksum_ns = &s->d->counters.checksum_ns;
	tc.max_batch_bytes = pc->max_batch_bytes;
	tc.checksum = pc->checksum;
	tc.seal = pc->sealed ? &pc->ss.data : NULL;
	tc.fault = &s->fault;
	tc.log = s->log;
	tc.recv.closed = pconn_data_closed;
	tc.recv_arg = pc;
	rc = transport_tcp_new(&pc->data, &s->d->loop, &tc);
	if (rc) {
		KVLOG_ERR(s->log, "peer_refused",
			  "peer_node=%s field=max_batch_bytes msg=\"a %llu-byte page does not fit in a %llu-byte batch\"",
			  KVLOG_Q(pc->hello.node),
			  (unsigned long long)s->page_bytes,
			  (unsigned long long)pc->max_batch_bytes);
		pc->data = NULL;
		pconn_lost(tmp, NULL);
		pconn_lost(pc, "transport");
		return;
	}
	pc->data->data = pc;
	rc = uv_fileno((uv_handle_t *)&tmp->tcp, &fd);
	nfd = rc ? -1 : dup(fd);
	if (nfd < 0 || uv_tcp_open((uv_tcp_t *)transport_tcp_stream(pc->data), nfd) ||
	    transport_tcp_start(pc->data, false)) {
		if (nfd >= 0)
			close(nfd);
		pconn_lost(tmp, NULL);
		pconn_lost(pc, "data connection setup");
		return;
	}
	uv_tcp_nodelay((uv_tcp_t *)transport_tcp_stream(pc->data), 1);
	tmp->is_data = true;
	pconn_lost(tmp, NULL);
	/* decode sends no request before this: a request that overtook the
	 * data connection would find nothing to send its KV on */
	(void)pconn_send(pc, &(struct proto_peer_msg){ .type = PEER_MSG_DATA_BOUND });
	KVLOG_INFO(s->log, "peer_up", "peer=%s peer_node=%s max_batch_bytes=%llu checksum=%s authenticated=%s encrypt=%s transport=tcp",
		   KVLOG_Q(pc->addr),
		   KVLOG_Q(pc->hello.node),
		   (unsigned long long)pc->max_batch_bytes,
		   pc->checksum ? "on" : "off", pc->sealed ? "yes" : "no",
		   pc->sealed && pc->ss.data.encrypt ? "on" : "off");
}

static void pconn_on_abort(struct pconn *pc, const struct proto_peer_msg *m)
{
	struct serve_req *r = prefill_find(pc, m->id);

	if (!r) {
		/* nothing of it here (any more): the ack is all decode needs */
		prefill_send_abort_ack(pc->s, pc, m->id);
		return;
	}
	preq_fail(r, m->code ? m->code : PROTO_ERR_INTERNAL, "decode aborted: %s (%.200s)",
		  proto_err_name(m->code), m->message);
	/* decode holds its pages fenced until our ack: every state answers
	 * it, at once or as soon as no batch of r is queued */
	serve__preq_event(r, PEV_PEER_ABORT);
}

static void pconn_on_msg(struct pconn *pc, struct proto_peer_msg *m)
{
	struct serve_req *r;

	switch (m->type) {
	case PEER_MSG_HEARTBEAT:
		return;
	case PEER_MSG_PREFILL_REQUEST:
		prefill_admit(pc, m);
		return;
	case PEER_MSG_ABORT:
		pconn_on_abort(pc, m);
		return;
	case PEER_MSG_ABORT_ACK:
		return;   /* our aborts need no ack: decode never writes to us */
	case PEER_MSG_RELEASE_ACK:
		r = prefill_find(pc, m->id);
		if (r)
			serve__preq_event(r, PEV_RELEASE_ACK);
		return;
	default:
		KVLOG_WARN(pc->s->log, "peer_protocol", "peer_node=%s msg=\"unexpected %s\"",
			   KVLOG_Q(pc->hello.node), proto_peer_type_name(m->type));
		return;
	}
}

/* ---- connections ------------------------------------------------------------------- */

static void pconn_maybe_free(struct pconn *pc)
{
	if (pc->pending_closes)
		return;
	frame_decoder_deinit(&pc->dec);
	free(pc);
}

static void pconn_tcp_closed(uv_handle_t *h)
{
	struct pconn *pc = h->data;

	pc->s->closes_pending--;
	pc->pending_closes--;
	pconn_maybe_free(pc);
}

static void pconn_transport_closed(struct transport *t)
{
	struct pconn *pc = t->data;

	t->ops->free(t);
	pc->s->closes_pending--;
	pc->pending_closes--;
	pconn_maybe_free(pc);
}

/* The decode node behind pc is gone: nothing it could still do matters to
 * our pages (it never writes to them), so every request of it ends once
 * its queued batches have been reported. */
static void pconn_lost(struct pconn *pc, const char *why)
{
	struct serve *s = pc->s;
	struct serve_req *r, *next;

	if (pc->closing)
		return;
	pc->closing = true;
	if (why)
		KVLOG_WARN(s->log, "peer_down", "peer_node=%s msg=%s",
			   KVLOG_Q(pc->hello.node[0] ? pc->hello.node : "?"),
			   KVLOG_Q(why));
	if (pc->prev)
		pc->prev->next = pc->next;
	else
		s->pconns = pc->next;
	if (pc->next)
		pc->next->prev = pc->prev;
	pconn_figures_update(s);
	for (r = s->reqs; r; r = next) {
		next = r->next;
		if (r->kind != SREQ_PREFILL || r->pc != pc)
			continue;
		preq_fail(r, PROTO_ERR_INTERNAL, "the decode peer was lost");
		serve__preq_event(r, PEV_LINK_LOST);
	}
	pc->pending_closes = 1;
	s->closes_pending++;
	uv_close((uv_handle_t *)&pc->tcp, pconn_tcp_closed);
	if (pc->data) {
		pc->pending_closes++;
		s->closes_pending++;
		transport_close(pc->data, pconn_transport_closed);
		pc->data = NULL;
	}
}

static void pconn_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf)
{
	struct pconn *pc = h->data;

	(void)hint;
	*buf = uv_buf_init(pc->rbuf, sizeof(pc->rbuf));
}

/* One control message from a decode peer. Before the hello, each phase
 * accepts exactly one message type (net/PROTOCOL.md s. 2.1); anything
 * else is refused. A keyed node accepts no plaintext hello, a keyless
 * one no auth_hello. */
static void pconn_dispatch(void *arg, struct proto_peer_msg *m)
{
	struct pconn *pc = arg;
	bool keyed = pc->s->key.set;

	if (pc->hello_done) {
		pconn_on_msg(pc, m);
		return;
	}
	switch (pc->phase) {
	case PCONN_FIRST:
		if (m->type == PEER_MSG_AUTH_HELLO)
			pconn_on_auth_hello(pc, m);
		else if (m->type == PEER_MSG_DATA)
			pconn_on_data(pc, m);
		else if (m->type == PEER_MSG_HELLO && !keyed)
			pconn_on_hello(pc, m);
		else if (m->type == PEER_MSG_HELLO)
			pconn_refuse(pc, "auth_required", NULL,
				     "this node requires peers to prove the cluster key first");
		else
			pconn_refuse(pc, "protocol", NULL, "unexpected first message");
		return;
	case PCONN_AUTH_PROOF:
		if (m->type == PEER_MSG_AUTH_PROOF)
			pconn_on_auth_proof(pc, m);
		else
			pconn_refuse(pc, "protocol", NULL, "expected auth_proof");
		return;
	case PCONN_HELLO:
		if (m->type == PEER_MSG_HELLO)
			pconn_on_hello(pc, m);
		else
			pconn_refuse(pc, "protocol", NULL, "expected hello");
		return;
	}
}

static void pconn_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
	struct pconn *pc = st->data;
	const char *why;

	if (nread < 0) {
		pconn_lost(pc, pc->hello_done ? "control connection closed" : NULL);
		return;
	}
	pc->last_heard_ns = kvd_now_ns();
	why = serve__peer_feed(pc->s, pc->hello.node[0] ? pc->hello.node : "?",
			       &pc->dec, buf->base, nread > 0 ? (size_t)nread : 0,
			       &pc->closing, pconn_dispatch, pc);
	if (why)
		pconn_lost(pc, why);
}

/* "ip:port" of the remote end, for log lines. */
static void pconn_addr(struct pconn *pc)
{
	struct sockaddr_storage ss;
	int len = sizeof(ss);
	char ip[INET6_ADDRSTRLEN] = "?";
	int port = 0;

	if (uv_tcp_getpeername(&pc->tcp, (struct sockaddr *)&ss, &len))
		return;
	if (ss.ss_family == AF_INET) {
		uv_ip4_name((struct sockaddr_in *)&ss, ip, sizeof(ip));
		port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
	} else if (ss.ss_family == AF_INET6) {
		uv_ip6_name((struct sockaddr_in6 *)&ss, ip, sizeof(ip));
		port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
	}
	snprintf(pc->addr, sizeof(pc->addr), "%s:%d", ip, port);
}

/* Connections that have not finished their handshake (they hold an fd
 * and a buffer for up to connect_timeout_ms each), and peer connections
 * in all: past either bound one more is accepted and closed at once, so
 * a flood of strangers cannot use up the descriptors the admin socket
 * and the real peers need. */
#define PCONN_PENDING_MAX 64u
#define PCONN_TOTAL_MAX 512u

static bool pconn_room(struct serve *s)
{
	unsigned pending = 0, total = 0;

	for (const struct pconn *q = s->pconns; q; q = q->next) {
		total++;
		pending += !q->hello_done && !q->closing;
	}
	return pending < PCONN_PENDING_MAX && total < PCONN_TOTAL_MAX;
}

static void pconn_accept(uv_stream_t *server, int status)
{
	struct serve *s = server->data;
	struct pconn *pc;

	if (status < 0) {
		KVLOG_WARN(s->log, "peer_accept_failed", "error=%s", uv_err_name(status));
		return;
	}
	pc = s->stopping || !pconn_room(s) ? NULL : calloc(1, sizeof(*pc));
	if (!pc) {
		s->peer_refused_conns++;
		serve__accept_drop(s, server);
		return;
	}
	pc->s = s;
	if (uv_tcp_init(&s->d->loop, &pc->tcp)) {
		free(pc);
		s->peer_refused_conns++;
		serve__accept_drop(s, server);
		return;
	}
	pc->tcp.data = pc;
	frame_decoder_init(&pc->dec, SERVE_PEER_HANDSHAKE_FRAME_MAX);
	pc->last_heard_ns = pc->t_accept_ns = kvd_now_ns();
	pc->conn_id = ++s->next_conn_id;
	snprintf(pc->addr, sizeof(pc->addr), "?");
	pc->next = s->pconns;
	if (s->pconns)
		s->pconns->prev = pc;
	s->pconns = pc;
	wbound_init(&pc->wb, (uv_stream_t *)&pc->tcp, &(struct wbound_limits){
			    .soft = s->d->cfg.write_queue_soft,
			    .hard = s->d->cfg.write_queue_hard,
			    .stall_ms = s->d->cfg.write_stall_timeout_ms },
		    pconn_alloc, pconn_read);
	if (uv_accept(server, (uv_stream_t *)&pc->tcp) ||
	    wbound_read_start(&pc->wb)) {
		pconn_lost(pc, NULL);
		return;
	}
	uv_tcp_nodelay(&pc->tcp, 1);
	pconn_addr(pc);
}

/* peers.max_pages = 0: half the pool, but at least one request of the
 * full advertised context (else one peer could never be served at all),
 * and never more than the pool. Computed once, at start. */
static void prefill_peer_limits(struct serve *s)
{
	const struct kvd_config *c = &s->d->cfg;
	uint32_t pool = s->d->cap.pages;
	uint32_t full = kvpool_pages_for(s->d->pool, s->d->cap.advertised_context);

	s->peer_max_pages = c->peer_max_pages ? c->peer_max_pages :
		KVD_MIN(pool, KVD_MAX(pool / 2, full));
	KVLOG_INFO(s->log, "peer_limits",
		   "max_requests=%u max_pages=%u max_pages_source=%s pool_pages=%u full_context_pages=%u write_queue_soft=%llu write_queue_hard=%llu write_stall_timeout_ms=%u release_timeout_ms=%u",
		   c->peer_max_requests, s->peer_max_pages,
		   c->peer_max_pages ? "config" : "auto", pool, full,
		   (unsigned long long)c->write_queue_soft,
		   (unsigned long long)c->write_queue_hard,
		   c->write_stall_timeout_ms, c->release_timeout_ms);
}

int serve__prefill_start(struct serve *s)
{
	struct sockaddr_storage ss;
	int rc;

	prefill_peer_limits(s);
	{
		/* room for PCONN_TOTAL_MAX peer connections besides the admin
		 * socket, its clients and the node's own descriptors */
		struct rlimit rl;

		if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
			rl.rlim_cur = rl.rlim_max;
			(void)setrlimit(RLIMIT_NOFILE, &rl);
		}
	}

	if (!s->d->cfg.listen_peer[0]) {
		KVLOG_ERR(s->log, "listen_peer", "msg=\"a prefill node needs listen.peer\"");
		return -EINVAL;
	}
	rc = serve__parse_hostport(s->d->cfg.listen_peer, &ss);
	if (rc) {
		KVLOG_ERR(s->log, "listen_peer", "addr=%s msg=\"bad address\"",
			  KVLOG_Q(s->d->cfg.listen_peer));
		return rc;
	}
	rc = uv_tcp_init(&s->d->loop, &s->peer_listener);
	if (rc)
		return rc;
	s->peer_listener.data = s;
	s->peer_listener_open = true;
	rc = uv_tcp_bind(&s->peer_listener, (struct sockaddr *)&ss, 0);
	if (!rc)
		rc = uv_listen((uv_stream_t *)&s->peer_listener, 511, pconn_accept);
	if (rc)
		KVLOG_ERR(s->log, "listen_peer", "addr=%s msg=%s",
			  KVLOG_Q(s->d->cfg.listen_peer), KVLOG_Q(uv_strerror(rc)));
	else
		KVLOG_INFO(s->log, "listen_peer", "addr=%s",
			   KVLOG_Q(s->d->cfg.listen_peer));
	return rc;
}

/* The data connection drained: requests that waited for it send again. */
static void pconn_data_resume(struct pconn *pc)
{
	struct serve_req *r, *next;

	if (!pc->data_waiters || pconn_data_full(pc))
		return;
	pc->data_waiters = false;
	for (r = pc->s->reqs; r; r = next) {
		next = r->next;
		if (r->kind == SREQ_PREFILL && r->pc == pc &&
		    r->state == PRS_SENDING && !r->sends_pending)
			prefill_send_more(r);
	}
}

/* Heartbeat tick for a data connection: true when pc was torn down
 * because decode stopped reading it (past the soft bound for the stall
 * timeout); else restart requests that waited for it to drain. */
static bool pconn_data_check(struct pconn *pc, uint64_t now)
{
	struct serve *s = pc->s;

	if (!pc->data || !pc->hello_done)
		return false;
	if (pconn_data_full(pc)) {
		if (!pc->data_over_since_ns)
			pc->data_over_since_ns = now;
		if (now - pc->data_over_since_ns <
		    (uint64_t)s->d->cfg.write_stall_timeout_ms * 1000000ull)
			return false;
		KVLOG_WARN(s->log, "write_bound",
			   "peer_node=%s conn=peer_data reason=stall queued=%zu soft=%zu stall_ms=%u",
			   KVLOG_Q(pc->hello.node), pc->data->ops->queued(pc->data),
			   pconn_data_soft(pc), s->d->cfg.write_stall_timeout_ms);
		pconn_lost(pc, "data connection stalled past its soft bound");
		return true;
	}
	pc->data_over_since_ns = 0;
	pconn_data_resume(pc);
	return false;
}

void serve__prefill_heartbeat(struct serve *s)
{
	uint64_t now = kvd_now_ns();
	uint64_t dead_ns = 3ull * s->d->cfg.heartbeat_ms * 1000000ull;
	struct pconn *pc, *next;

	if (s->peer_refused_conns) {
		/* one line per tick, not one per connection */
		KVLOG_WARN(s->log, "peer_conn_refused",
			   "count=%llu reason=too_many_connections pending_max=%u total_max=%u",
			   (unsigned long long)s->peer_refused_conns,
			   PCONN_PENDING_MAX, PCONN_TOTAL_MAX);
		s->peer_refused_conns = 0;
	}
	for (pc = s->pconns; pc; pc = next) {
		struct proto_peer_msg m = { .type = PEER_MSG_HEARTBEAT };
		struct kvpool_stats st;

		next = pc->next;
		if (pc->closing || pconn_write_check(pc, now) ||
		    pconn_data_check(pc, now))
			continue;

		if (!pc->hello_done && now - pc->t_accept_ns >
			  (uint64_t)s->d->cfg.connect_timeout_ms * 1000000ull) {
			/* a connection that has not finished its handshake in
			 * time holds nothing more of ours */
			pconn_lost(pc, NULL);
			continue;
		}
		if (now - pc->last_heard_ns > dead_ns) {
			pconn_lost(pc, pc->hello_done ? "three heartbeats missed" : NULL);
			continue;
		}
		if (!pc->hello_done)
			continue;
		kvpool_get_stats(s->d->pool, &st);
		m.load = pc->n_reqs;
		m.free_tokens = (uint64_t)st.by_state[KVPAGE_FREE] * st.page_tokens;
		(void)pconn_send(pc, &m);
	}
}

void serve__prefill_stop(struct serve *s)
{
	if (s->peer_listener_open) {
		s->peer_listener_open = false;
		serve__close_handle(s, (uv_handle_t *)&s->peer_listener);
	}
	while (s->pconns)
		pconn_lost(s->pconns, NULL);
}
