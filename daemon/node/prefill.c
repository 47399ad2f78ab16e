/* prefill.c - prefill: prefill requests (the preq machine), admission, sending.
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
 * Links: the peer listener and every decode node's link (handshake,
 * data connection bound by token, heartbeats, bounds) are daemon/node/link.c's;
 * prefill registers struct link_ops (control messages, a lost link, a
 * drained data connection) and finds a peer's requests on its own link.
 */
#include "daemon/node/serve_int.h"
#include "gpu/errors.h"
#include "net/errors.h"
#include "conf/util.h"
#include "net/verbs/verbs_target.h"

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

static void prefill_send_more(struct serve_req *r);

static void prefill_reject(struct link *l, uint64_t remote_id,
			   const char *tenant, int code, const char *fmt, ...)
	__attribute__((format(printf, 5, 6)));

/* `tenant`: the request's, SERVE_TENANT_UNKNOWN when it was not valid. */
static void prefill_reject(struct link *l, uint64_t remote_id,
			   const char *tenant, int code, const char *fmt, ...)
{
	struct proto_peer_msg m = { .type = PEER_MSG_PREFILL_REJECT,
				    .id = remote_id, .code = code };
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(m.message, sizeof(m.message), fmt, ap);
	va_end(ap);
	KVLOG_RL_WARN(l->s->log, &l->s->rl[SERVE_RL_PEER_REQUEST], "prefill_reject",
		   "peer_node=%s remote_id=%llu tenant=%s code=%s msg=%s",
		   KVLOG_Q(l->hello.node), (unsigned long long)remote_id,
		   KVLOG_Q(tenant), proto_err_name(code), KVLOG_Q(m.message));
	serve__link_post(l, &m);
}

/* ---- the prefill request machine (daemon/node/machine.h: preq) -------------------- */

/* abort_ack, possibly late (fault point slow_abort_ack): a delayed ack
 * finds its connection again by session, which may be gone by then. */
struct late_ack {
	uv_timer_t timer;
	struct serve *s;
	uint64_t conn_id;
	uint64_t remote_id;
	uint32_t batches;
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
	struct proto_peer_msg ack = { .type = PEER_MSG_ABORT_ACK, .id = a->remote_id,
				      .batches = a->batches };

	struct link *l = serve__link_by_conn(a->s, a->conn_id);

	if (l)
		serve__link_post(l, &ack);
	uv_close((uv_handle_t *)t, late_ack_closed);
}

/* Fault point lie_abort_batches: a lying prefill claims 1000 batches
 * more than it posted in abort / abort_ack (decode must not believe it
 * into an early unfence, nor wait for it forever). */
static uint32_t prefill_lie_batches(struct serve *s, uint64_t remote_id,
				    uint32_t batches, const char *what)
{
	if (!kvd_fault_fire(&s->fault, KVD_FAULT_LIE_ABORT_BATCHES))
		return batches;
	KVLOG_WARN(s->log, "fault", "point=lie_abort_batches remote_id=%llu msg=%s posted=%u claimed=%u",
		   (unsigned long long)remote_id, what, batches, batches + 1000);
	return batches + 1000;
}

/* Fault point lie_unasked_ack: an abort_ack decode never asked for, with
 * a count past anything posted, beside the request's first batch. */
static void prefill_fault_unasked_ack(struct serve_req *r)
{
	struct sreq_prefill *pp = sreq_p(r);
	struct proto_peer_msg ack = { .type = PEER_MSG_ABORT_ACK, .id = pp->remote_id,
				      .batches = 1000 };

	if (!kvd_fault_fire(&r->s->fault, KVD_FAULT_LIE_UNASKED_ACK))
		return;
	KVLOG_WARN(r->s->log, "fault", "point=lie_unasked_ack remote_id=%llu batches=%u",
		   (unsigned long long)pp->remote_id, ack.batches);
	serve__link_post(r->link, &ack);
}

/* batches: those posted for the request (0 for one not known here). */
static void prefill_send_abort_ack(struct serve *s, struct link *l,
				   uint64_t remote_id, const char *tenant,
				   uint32_t batches)
{
	struct proto_peer_msg ack = { .type = PEER_MSG_ABORT_ACK, .id = remote_id,
				      .batches = batches };
	struct late_ack *a;

	if (!l)
		return;
	ack.batches = batches = prefill_lie_batches(s, remote_id, batches, "abort_ack");
	if (kvd_fault_fire(&s->fault, KVD_FAULT_SLOW_ABORT_ACK) && !s->stopping &&
	    (a = calloc(1, sizeof(*a))) != NULL) {
		KVLOG_WARN(s->log, "fault", "point=slow_abort_ack remote_id=%llu tenant=%s delay_ms=1000",
			   (unsigned long long)remote_id, KVLOG_Q(tenant));
		a->s = s;
		a->conn_id = l->conn_id;
		a->remote_id = remote_id;
		a->batches = batches;
		/* counted from now: the serving layer outlives the timer */
		s->closes_pending++;
		uv_timer_init(&s->d->loop, &a->timer);
		uv_timer_start(&a->timer, late_ack_cb, 1000, 0);
		return;
	}
	serve__link_post(l, &ack);
}

/* Prefill itself fails the request: tell decode (it answers abort_ack,
 * which needs nothing from us: decode never writes into our pages). */
static void preq_send_abort(struct serve_req *r)
{
	struct sreq_prefill *pp = sreq_p(r);
	struct proto_peer_msg m = { .type = PEER_MSG_ABORT, .id = pp->remote_id,
				    .code = r->fail_code,
				    .batches = pp->batches_sent + pp->sends_pending };

	m.batches = prefill_lie_batches(r->s, pp->remote_id, m.batches, "abort");
	snprintf(m.message, sizeof(m.message), "%s", r->fail_msg);
	KVLOG_WARN(r->s->log, "prefill_failed", "id=%llu tenant=%s remote_id=%llu code=%s msg=%s",
		   (unsigned long long)r->reg.id, KVLOG_Q(r->tenant), (unsigned long long)pp->remote_id,
		   proto_err_name(r->fail_code), KVLOG_Q(r->fail_msg));
	if (r->link)
		serve__link_post(r->link, &m);
}

static void preq_abort_ack(struct serve_req *r)
{
	struct sreq_prefill *pp = sreq_p(r);

	KVLOG_DEBUG(r->s->log, "abort_ack", "id=%llu tenant=%s remote_id=%llu state=%s",
		    (unsigned long long)r->reg.id, KVLOG_Q(r->tenant), (unsigned long long)pp->remote_id,
		    machine_state_name(&preq_machine, r->state));
	pp->ack_owed = false;
	prefill_send_abort_ack(r->s, r->link, pp->remote_id, r->tenant,
			       pp->batches_sent + pp->sends_pending);
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
	struct sreq_prefill *pp = sreq_p(r);

	r->s->d->counters.release_timeouts++;
	KVLOG_WARN(r->s->log, "release_timeout",
		   "id=%llu tenant=%s remote_id=%llu peer_node=%s pages=%u release_timeout_ms=%u msg=\"no release_ack; pages released\"",
		   (unsigned long long)r->reg.id, KVLOG_Q(r->tenant), (unsigned long long)pp->remote_id,
		   r->link ? r->link->hello.node : "?", pp->n_dst,
		   r->s->d->cfg.release_timeout_ms);
	serve__req_fail(r, PROTO_ERR_TIMEOUT, "no release_ack within release_timeout_ms");
}

static void prefill_done_send(struct serve_req *r)
{
	struct sreq_prefill *pp = sreq_p(r);
	struct proto_peer_msg m = { .type = PEER_MSG_PREFILL_DONE, .id = pp->remote_id };

	m.first_token = pp->first_token;
	m.done_tokens = pp->n_kv;
	m.cached_tokens = r->cached_tokens;
	m.batches = pp->batches_sent;
	m.done_pages = pp->n_dst;
	m.prefill_id = r->reg.id;     /* decode logs it: one grep, both sides */
	if (kvd_fault_fire(&r->s->fault, KVD_FAULT_LIE_DONE_BATCHES)) {
		/* a lying prefill: decode waits for batches that never come */
		m.batches += 3;
		KVLOG_WARN(r->s->log, "fault", "point=lie_done_batches remote_id=%llu posted=%u claimed=%u",
			   (unsigned long long)pp->remote_id, pp->batches_sent, m.batches);
	}
	serve__link_post(r->link, &m);
	KVLOG_DEBUG(r->s->log, "prefill_done", "id=%llu tenant=%s remote_id=%llu batches=%u pages=%u tokens=%u first_token=%u",
		    (unsigned long long)r->reg.id, KVLOG_Q(r->tenant), (unsigned long long)pp->remote_id,
		    pp->batches_sent, pp->n_dst, pp->n_kv, pp->first_token);
	/* the pages stay held until release_ack, abort, the connection to
	 * the decode node is gone, or release_timeout_ms */
}

static void preq_act(struct serve_req *r, uint32_t a)
{
	struct sreq_prefill *pp = sreq_p(r);
	struct serve *s = r->s;

	switch (a) {
	case PA_SEND_REJECT:
		if (r->link)
			prefill_reject(r->link, pp->remote_id, r->tenant,
				       r->fail_code ? r->fail_code : PROTO_ERR_INTERNAL,
				       "%s", r->fail_msg);
		return;
	case PA_SEND_ABORT:
		preq_send_abort(r);
		return;
	case PA_OWE_ACK:
		pp->ack_owed = true;
		return;
	case PA_SEND_ABORT_ACK:
		preq_abort_ack(r);
		return;
	case PA_ACK_OWED:
		if (pp->ack_owed)
			preq_abort_ack(r);
		return;
	case PA_DETACH_LINK:
		serve__link_detach(r);
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
		pp->released_by_peer = true;
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
	struct sreq_prefill *pp = sreq_p(r);

	KVD_ASSERT(r->s->log, !r->link && !r->ereq && !pp->sends_pending,
		   "id=%llu tenant=%s msg=\"a prefill request ends attached, in the engine or with batches queued\"",
		   (unsigned long long)r->reg.id, KVLOG_Q(r->tenant));
	if (r->fail_code && !pp->released_by_peer)
		KVLOG_INFO(r->s->log, "prefill_aborted", "id=%llu tenant=%s remote_id=%llu decode_node=%s reason=%s",
			   (unsigned long long)r->reg.id, KVLOG_Q(r->tenant),
			   (unsigned long long)pp->remote_id, KVLOG_Q(pp->decode_node),
			   KVLOG_Q(r->fail_msg));
	else if (pp->released_by_peer && !r->fail_code)
		KVLOG_INFO(r->s->log, "prefill_served",
			   "id=%llu tenant=%s remote_id=%llu decode_node=%s prompt_tokens=%u cached_tokens=%u pages=%u batches=%u ms=%.1f",
			   (unsigned long long)r->reg.id, KVLOG_Q(r->tenant),
			   (unsigned long long)pp->remote_id, KVLOG_Q(pp->decode_node),
			   r->n_prompt, r->cached_tokens, pp->n_dst, pp->batches_sent,
			   (double)(kvd_now_ns() - r->t_arrive_ns) / 1e6);
	serve__req_end(r, pp->released_by_peer && !r->fail_code);
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
	if (r->state == PRS_ABORT_DRAINING && !sreq_p(r)->sends_pending)
		serve__preq_event(r, PEV_DRAINED);
	else if (r->state == PRS_DONE)
		preq_finish(r);
}

/* The request decode knows as remote_id on link l (only l's requests). */
static struct serve_req *prefill_find(struct link *l, uint64_t remote_id)
{
	struct kvd_list *e;

	kvd_list_for_each(e, &l->reqs) {
		struct serve_req *r = kvd_list_entry(e, struct serve_req, link_node);

		if (sreq_p(r)->remote_id == remote_id && !r->ended)
			return r;
	}
	return NULL;
}

void serve__prefill_abort(struct serve_req *r, const char *reason)
{
	serve__req_fail(r, PROTO_ERR_INTERNAL, "%s", reason);
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
	KVLOG_WARN(s->log, "fault", "point=stuck_submit id=%llu tenant=%s delay_ms=%u",
		   (unsigned long long)r->reg.id, KVLOG_Q(r->tenant), STUCK_SUBMIT_MS);
	k->s = s;
	k->id = r->reg.id;
	s->closes_pending++;
	uv_timer_init(&s->d->loop, &k->timer);
	uv_timer_start(&k->timer, stuck_submit_cb, STUCK_SUBMIT_MS, 0);
	return 0;
}

/* Per-node caps (invariant 11): one decode node - every proven link
 * from its address (link.c, link_same_node), however many it opens - may
 * hold at most peers.max_requests requests and s->peer_max_pages pages
 * of this node, so a peer that never acknowledges cannot take the whole
 * pool from the others. Checked before anything is reserved or computed.
 * True when m was rejected. */
/* What the decode node of l holds here: its links, and its requests and
 * their pages - every request admitted for it that has not ended,
 * including those whose link is gone (a request detached by a lost link
 * runs on until its compute and abort end: a key holder that drops its
 * links and reconnects must not get a fresh set of caps meanwhile). */
static void prefill_node_usage(struct link *l, struct link_node_usage *u)
{
	struct kvd_list *e;

	serve__link_node_usage(l, u);   /* links; an unnamed node: its own */
	if (!l->node_addr[0])
		return;
	u->reqs = u->pages = 0;
	kvd_list_for_each(e, &l->s->reqs) {
		const struct serve_req *r = kvd_list_entry(e, struct serve_req, node);

		if (r->kind != SREQ_PREFILL || r->ended || strcmp(r->peer_node, l->node_addr))
			continue;
		u->reqs++;
		u->pages += sreq_pc(r)->n_dst;
	}
}

static bool prefill_peer_cap(struct link *l, const struct proto_peer_msg *m)
{
	struct serve *s = l->s;
	struct link_node_usage u;
	const char *cap = NULL;

	prefill_node_usage(l, &u);
	if (u.reqs >= s->d->cfg.peer_max_requests)
		cap = "max_requests";
	else if ((uint64_t)u.pages + m->n_pages > s->peer_max_pages)
		cap = "max_pages";
	if (!cap)
		return false;
	s->d->counters.rejected[KVD_REJECT_OVERLOADED]++;
	KVLOG_RL_WARN(s->log, &s->rl[SERVE_RL_PEER_REQUEST], "peer_cap",
		   "peer_node=%s peer_addr=%s remote_id=%llu tenant=%s cap=%s requests=%u max_requests=%u pages=%u want_pages=%u max_pages=%u links=%u",
		   KVLOG_Q(l->hello.node), KVLOG_Q(l->node_addr),
		   (unsigned long long)m->id, KVLOG_Q(m->tenant), cap, u.reqs,
		   s->d->cfg.peer_max_requests, u.pages, m->n_pages,
		   s->peer_max_pages, u.links);
	prefill_reject(l, m->id, m->tenant, PROTO_ERR_OVERLOADED,
		       "decode node %s holds %u requests and %u pages of prefill node %s over %u links (caps: %u requests, %u pages)",
		       l->node_addr, u.reqs, u.pages, s->d->cfg.node_name, u.links,
		       s->d->cfg.peer_max_requests, s->peer_max_pages);
	return true;
}

/* Prefill's own admission (invariant 3). True when m was refused (a
 * prefill_reject went out; nothing was created). */
static bool prefill_refuse(struct link *l, const struct proto_peer_msg *m)
{
	struct serve *s = l->s;
	struct kvpool *pool = s->d->pool;
	uint64_t need = (uint64_t)m->n_tokens + m->max_tokens;
	uint64_t lim = serve__own_limit(s);
	uint32_t n_vocab = tokenizer_n_vocab(s->tok);

	if (kvd_request_gate(s->reqtab) || s->stopping) {
		s->d->counters.rejected[KVD_REJECT_DRAINING]++;
		prefill_reject(l, m->id, m->tenant, PROTO_ERR_DRAINING,
			       "the prefill node is draining");
		return true;
	}
	if (need > lim) {
		KVLOG_RL_WARN(s->log, &s->rl[SERVE_RL_PEER_REQUEST], "admission_reject",
			   "remote_id=%llu tenant=%s peer_node=%s reason=prompt_too_long prompt_tokens=%u max_tokens=%u need=%llu limit=%llu context=%u pool_tokens=%llu",
			   (unsigned long long)m->id, KVLOG_Q(m->tenant),
			   KVLOG_Q(l->hello.node),
			   m->n_tokens,
			   m->max_tokens, (unsigned long long)need,
			   (unsigned long long)lim, s->d->cap.advertised_context,
			   (unsigned long long)s->d->cap.pool_tokens);
		s->d->counters.rejected[KVD_REJECT_PROMPT_TOO_LONG]++;
		prefill_reject(l, m->id, m->tenant, PROTO_ERR_PROMPT_TOO_LONG,
			       "prompt (%u tokens) + max_tokens (%u) = %llu exceeds what prefill node %s can hold (%llu tokens: context %u, pool %llu)",
			       m->n_tokens, m->max_tokens, (unsigned long long)need,
			       s->d->cfg.node_name, (unsigned long long)lim,
			       s->d->cap.advertised_context,
			       (unsigned long long)s->d->cap.pool_tokens);
		return true;
	}
	if (m->n_pages != kvpool_pages_for(pool, m->n_tokens)) {
		s->d->counters.rejected[KVD_REJECT_INVALID]++;
		prefill_reject(l, m->id, m->tenant, PROTO_ERR_INVALID_REQUEST,
			       "%u destination pages for %u prompt tokens; %u expected",
			       m->n_pages, m->n_tokens,
			       kvpool_pages_for(pool, m->n_tokens));
		return true;
	}
	for (uint32_t i = 0; i < m->n_tokens; i++) {
		if (m->tokens[i] >= n_vocab) {
			s->d->counters.rejected[KVD_REJECT_INVALID]++;
			prefill_reject(l, m->id, m->tenant, PROTO_ERR_INVALID_REQUEST,
				       "token id %u outside the vocabulary", m->tokens[i]);
			return true;
		}
	}
	if (!l->data || prefill_find(l, m->id)) {
		prefill_reject(l, m->id, m->tenant, PROTO_ERR_INTERNAL,
			       l->data ? "duplicate request id" : "no data connection");
		return true;
	}
	return prefill_peer_cap(l, m);
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

static void prefill_admit(struct link *l, struct proto_peer_msg *m)
{
	struct serve *s = l->s;
	struct serve_req *r;
	int rc;

	if (prefill_refuse(l, m))
		return;
	r = serve__req_new(s, SREQ_PREFILL);
	if (!r) {
		prefill_reject(l, m->id, m->tenant, PROTO_ERR_INTERNAL, "out of memory");
		return;
	}
	r->rops = &preq_ops;
	sreq_p(r)->remote_id = m->id;
	snprintf(r->tenant, sizeof(r->tenant), "%s", m->tenant);
	snprintf(r->cache_salt, sizeof(r->cache_salt), "%s", m->cache_salt);
	r->n_prompt = m->n_tokens;
	r->max_tokens = m->max_tokens;
	r->sp = (struct sampler_params){ .temperature = m->temperature,
					 .top_k = m->top_k, .top_p = m->top_p,
					 .seed = m->seed };
	r->prompt = malloc(sizeof(int32_t) * m->n_tokens);
	sreq_p(r)->dst = m->pages;        /* take the array */
	sreq_p(r)->n_dst = m->n_pages;
	snprintf(r->peer_node, sizeof(r->peer_node), "%s", l->node_addr);
	snprintf(sreq_p(r)->decode_node, sizeof(sreq_p(r)->decode_node), "%s",
		 l->hello.node[0] ? l->hello.node : "?");
	serve__link_attach(l, r, sreq_p(r)->n_dst);
	m->pages = NULL;
	m->n_pages = 0;
	if (!r->prompt) {
		serve__req_fail(r, PROTO_ERR_INTERNAL, "out of memory");
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
		serve__req_fail(r, PROTO_ERR_INTERNAL, "out of memory");
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
	uint64_t bytes;      /* the batch's KV payload, for the metrics */
};

static void prefill_sent_cb(void *arg, int status)
{
	struct prefill_ticket *t = arg;
	struct serve_req *r = serve__req_find(t->s, t->id);
	uint64_t bytes = t->bytes;
	struct link *l;

	free(t);
	if (!r)
		return;
	KVD_ASSERT(r->s->log, sreq_p(r)->sends_pending > 0,
		   "id=%llu tenant=%s msg=\"a batch reported sent that was never queued\"",
		   (unsigned long long)r->reg.id, KVLOG_Q(r->tenant));
	sreq_p(r)->sends_pending--;
	sreq_p(r)->t_progress_ns = kvd_now_ns();
	l = r->link;
	if (status == 0) {
		kvd_metrics_xfer_batch(&r->s->d->metrics, KVD_XFER_SEND, bytes);
		sreq_p(r)->batches_sent++;
		serve__preq_event(r, PEV_BATCH_SENT);
	} else {
		serve__req_fail(r, PROTO_ERR_INTERNAL, "the KV batch could not be sent");
		serve__preq_event(r, PEV_SEND_FAIL);
	}
	if (l)
		serve__link_data_resume(l);
}

static void prefill_slow_cb(uv_timer_t *t)
{
	struct serve_req *r = t->data;

	sreq_p(r)->slow_waited = true;   /* the delay for this batch is over */
	prefill_send_more(r);
}

/* Fault points on a batch's entries before it is queued. */
static void prefill_fault_entries(struct serve_req *r, struct transport_page *pages,
				  uint32_t n)
{
	struct serve *s = r->s;

	if (sreq_p(r)->next_page == 0 &&
	    kvd_fault_fire(&s->fault, KVD_FAULT_STALE_GENERATION)) {
		KVLOG_WARN(s->log, "fault", "point=stale_generation id=%llu tenant=%s page=%u",
			   (unsigned long long)r->reg.id, KVLOG_Q(r->tenant), pages[0].dst.dst_page);
		pages[0].dst.dst_gen++;
	}
	if (n >= 2 && kvd_fault_fire(&s->fault, KVD_FAULT_DUP_ENTRY)) {
		KVLOG_WARN(s->log, "fault", "point=dup_entry id=%llu tenant=%s index=%u",
			   (unsigned long long)r->reg.id, KVLOG_Q(r->tenant), pages[0].dst.index);
		pages[1] = pages[0];
	}
}

/* Queue one batch of n pages from r->next_page: 0, or the request failed
 * (SEND_FAIL has been taken). */
static int prefill_send_batch(struct serve_req *r, uint32_t n)
{
	struct sreq_prefill *pp = sreq_p(r);
	struct serve *s = r->s;
	uint32_t pt = kvpool_geom(s->d->pool)->page_tokens;
	struct transport_page *pages = calloc(n, sizeof(*pages));
	struct prefill_ticket *t = malloc(sizeof(*t));
	int rc;

	if (!pages || !t) {
		free(pages);
		free(t);
		serve__req_fail(r, PROTO_ERR_INTERNAL, "out of memory");
		serve__preq_event(r, PEV_SEND_FAIL);
		return -ENOMEM;
	}
	for (uint32_t i = 0; i < n; i++) {
		uint32_t idx = pp->next_page + i;

		pages[i].src_page = pp->src[idx].page;
		pages[i].dst = (struct xfer_entry){
			.dst_page = pp->dst[idx].page, .index = idx,
			.dst_gen = pp->dst[idx].gen,
			.tokens = KVD_MIN(pt, pp->n_kv - idx * pt) };
	}
	prefill_fault_entries(r, pages, n);
	t->s = s;
	t->id = r->reg.id;
	t->bytes = (uint64_t)n * s->page_bytes;
	if (pp->next_page == 0) {
		r->t_xfer_ns = kvd_now_ns();
		prefill_fault_unasked_ack(r);
	}
	rc = transport_send(r->link->data, pp->remote_id, pp->batches_sent + pp->sends_pending,
			    pages, n, prefill_sent_cb, t);
	free(pages);
	if (rc) {
		free(t);
		serve__req_fail(r, PROTO_ERR_INTERNAL, "the transport refused the batch");
		serve__preq_event(r, PEV_SEND_FAIL);
		return rc;
	}
	pp->sends_pending++;
	pp->next_page += n;
	return 0;
}

/* PA_SEND_MORE (also resumed by the slow_batch timer and a drained data
 * connection): at most PREFILL_SEND_WINDOW batches of r queued at once;
 * ALL_SENT once every batch has been reported. */
static void prefill_send_more(struct serve_req *r)
{
	struct sreq_prefill *pp = sreq_p(r);
	struct serve *s = r->s;
	struct link *l = r->link;
	uint32_t limit = pp->n_dst, per;

	if (r->ended || r->state != PRS_SENDING || !l || !l->data)
		return;
	if (!pp->t_progress_ns)   /* the send deadline counts from here */
		pp->t_progress_ns = kvd_now_ns();
	if (pp->short_fault)     /* fault point: one page fewer, same report */
		limit--;
	per = xfer_batch_pages_max(l->max_batch_bytes, s->page_bytes);
	while (pp->next_page < limit && pp->sends_pending < PREFILL_SEND_WINDOW) {
		if (serve__link_data_full(l))
			return;   /* resumed once it drains */
		if (!pp->slow_waited &&
		    kvd_fault_fire(&s->fault, KVD_FAULT_SLOW_BATCH)) {
			serve__timer_start(r, SLOW_BATCH_MS, prefill_slow_cb);
			return;
		}
		pp->slow_waited = false;
		if (prefill_send_batch(r, KVD_MIN(per, limit - pp->next_page)))
			return;
	}
	if (pp->next_page >= limit && !pp->sends_pending) {
		if (r->t_xfer_ns)
			kvd_metrics_xfer_time(&s->d->metrics, KVD_XFER_SEND,
					      kvd_now_ns() - r->t_xfer_ns);
		serve__preq_event(r, PEV_ALL_SENT);
	}
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

	KVLOG_WARN(s->log, "fault", "point=nan_kv id=%llu tenant=%s page=%u",
		   (unsigned long long)r->reg.id, KVLOG_Q(r->tenant), ref->page);
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
	struct sreq_prefill *pp = sreq_p(r);
	struct serve *s = r->s;
	uint32_t pt = kvpool_geom(s->d->pool)->page_tokens;
	uint32_t bad = 0;
	int rc;

	if (!m->table || m->n_kv != r->n_prompt ||
	    m->n_table != kvpool_pages_for(s->d->pool, m->n_kv) ||
	    m->n_table != pp->n_dst) {
		serve__req_fail(r, PROTO_ERR_INTERNAL,
			  "prefill computed a different number of positions or pages than requested");
		return PEV_COMPUTE_FAIL;
	}
	/* the first n_mapped pages may be cached pages of this tenant and
	 * salt (gpu/kv/pcache.h): verified under their cache entries, sent as
	 * they are (read, never written) */
	rc = kvpool_verify_mapped(s->d->pool, r->reg.id, m->mapped, m->n_mapped,
				  m->table, m->n_table, m->n_kv, &bad);
	if (rc) {
		s->d->counters.integrity_failures++;
		kvd_metrics_integrity(&s->d->metrics, KVD_INTEGRITY_TAG);
		serve__req_fail(r, PROTO_ERR_INTEGRITY, "prefill's own pages failed verification");
		return PEV_COMPUTE_FAIL;
	}
	/* Invariant 10: positions past n_kv of the last page still hold an
	 * earlier owner's K/V. Zero them before any byte of the request is
	 * sent (batches carry whole pages). */
	/* a cached (mapped) last page is full: it has no tail, and is not
	 * ours to write */
	rc = m->n_mapped == m->n_table ? 0 :
	     kvpool_zero_tail(s->d->pool, r->reg.id, &m->table[m->n_table - 1],
			      m->n_kv - (m->n_table - 1) * pt);
	if (rc) {
		serve__req_fail(r, PROTO_ERR_INTERNAL,
			  "cannot clear the unfilled tail of the last page");
		return PEV_COMPUTE_FAIL;
	}
	if (kvd_fault_fire(&s->fault, KVD_FAULT_NAN_KV))
		prefill_fault_nan(r, &m->table[0]);
	free(pp->src);
	pp->src = malloc(sizeof(*pp->src) * m->n_table);
	if (!pp->src) {
		serve__req_fail(r, PROTO_ERR_INTERNAL, "out of memory");
		return PEV_COMPUTE_FAIL;
	}
	memcpy(pp->src, m->table, sizeof(*pp->src) * m->n_table);
	pp->n_kv = m->n_kv;
	if (kvd_fault_fire(&s->fault, KVD_FAULT_SHORT_TRANSFER) && pp->n_dst > 0) {
		KVLOG_WARN(s->log, "fault", "point=short_transfer id=%llu tenant=%s pages=%u sent=%u",
			   (unsigned long long)r->reg.id, KVLOG_Q(r->tenant), pp->n_dst, pp->n_dst - 1);
		pp->short_fault = true;
	}
	return PEV_COMPUTED;
}

/* An engine code as the peer's error (the one fold, net/errors.h). */
static int prefill_submit_code(int e)
{
	return kvd_err_to_proto(kvd_err_fold(&kvd_err_engine, e));
}

void serve__prefill_engine_msg(struct serve_req *r, const struct compute_msg *m)
{
	struct sreq_prefill *pp = sreq_p(r);

	switch (m->kind) {
	case COMPUTE_MSG_SUBMITTED:
		if (m->error) {
			/* the refusal is what the reject says, also after an
			 * abort (decode ignores it then) */
			r->fail_code = 0;
			serve__req_fail(r, prefill_submit_code(m->error), "prefill engine refused: %s",
				  engine_strerror(m->error));
			serve__preq_event(r, PEV_SUBMIT_ERR);
			return;
		}
		r->ereq = m->req;
		r->cached_tokens = m->cached;
		serve__preq_event(r, PEV_SUBMITTED);
		return;
	case COMPUTE_MSG_TOKEN:
		if (r->state == PRS_COMPUTE)
			pp->first_token = (uint32_t)m->token;
		serve__preq_event(r, PEV_TOKEN);
		return;
	case COMPUTE_MSG_DONE:
		if (r->state != PRS_COMPUTE) {
			serve__preq_event(r, PEV_COMPUTE_FAIL);   /* late: ignored */
			return;
		}
		if (m->finish == ENGINE_FINISH_STOP)
			pp->first_token = (uint32_t)r->s->model->eos_id;
		if (m->finish == ENGINE_FINISH_PREFILLED || m->finish == ENGINE_FINISH_STOP) {
			serve__preq_event(r, prefill_computed(r, m));
			return;
		}
		serve__req_fail(r, m->error == ENGINE_E_INTEGRITY ? PROTO_ERR_INTEGRITY
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

static void prefill_on_abort(struct link *l, const struct proto_peer_msg *m)
{
	struct serve_req *r = prefill_find(l, m->id);

	if (!r) {
		/* nothing of it here (any more): the ack is all decode needs */
		prefill_send_abort_ack(l->s, l, m->id, SERVE_TENANT_UNKNOWN, 0);
		return;
	}
	/* verbs: batches of r not yet on the wire never leave (their
	 * callbacks fire now, before the abort is taken) */
	if (l->data && transport_is_verbs(l->data)) {
		transport_verbs_forget(l->data, sreq_p(r)->remote_id);
		/* a cancelled batch's report may have ended r: find it again */
		r = prefill_find(l, m->id);
		if (!r) {
			prefill_send_abort_ack(l->s, l, m->id, SERVE_TENANT_UNKNOWN, 0);
			return;
		}
	}
	serve__req_fail(r, m->code ? m->code : PROTO_ERR_INTERNAL, "decode aborted: %s (%.200s)",
		  proto_err_name(m->code), m->message);
	/* decode holds its pages fenced until our ack: every state answers
	 * it, at once or as soon as no batch of r is queued */
	serve__preq_event(r, PEV_PEER_ABORT);
}

/* verbs_scope: where decode lets us write r's pages. The runs come from
 * the peer: they must cover exactly the destination pages it named in
 * the prefill_request (net/verbs/verbs_target.h) before a write goes through
 * them; else r is aborted with the reason. */
static void prefill_on_scope(struct link *l, const struct proto_peer_msg *m)
{
	struct serve_req *r = prefill_find(l, m->id);
	uint32_t *dst;
	char why[200] = "";
	int rc;

	if (!r || !l->data || !transport_is_verbs(l->data)) {
		KVLOG_RL_WARN(l->s->log, &l->s->rl[SERVE_RL_PEER_PROTOCOL], "peer_protocol",
			      "peer_node=%s msg=\"verbs_scope for no request of this link\" remote_id=%llu",
			      KVLOG_Q(l->hello.node), (unsigned long long)m->id);
		return;
	}
	dst = calloc(sreq_p(r)->n_dst ? sreq_p(r)->n_dst : 1, sizeof(*dst));
	if (!dst) {
		serve__prefill_abort(r, "out of memory");
		return;
	}
	for (uint32_t i = 0; i < sreq_p(r)->n_dst; i++)
		dst[i] = sreq_p(r)->dst[i].page;
	rc = verbs_target_check(m->runs, m->n_runs, dst, sreq_p(r)->n_dst, l->s->page_bytes,
				why, sizeof(why));
	free(dst);
	if (!rc)
		rc = transport_verbs_scope(l->data, m->id, m->runs, m->n_runs);
	if (rc) {
		KVLOG_RL_WARN(l->s->log, &l->s->rl[SERVE_RL_PEER_REQUEST], "verbs_scope_refused",
			      "id=%llu tenant=%s remote_id=%llu code=%d msg=%s",
			      (unsigned long long)r->reg.id, KVLOG_Q(r->tenant),
			      (unsigned long long)sreq_p(r)->remote_id, rc,
			      KVLOG_Q(why[0] ? why : "the transport refused the scope"));
		serve__prefill_abort(r, why[0] ? why : "the transport refused decode's write scope");
	}
}

/* link_ops.on_msg: a control message from a decode node after the
 * handshake (heartbeats are the link's). */
static void prefill_on_msg(struct link *l, struct proto_peer_msg *m)
{
	struct serve_req *r;

	switch (m->type) {
	case PEER_MSG_PREFILL_REQUEST:
		prefill_admit(l, m);
		return;
	case PEER_MSG_ABORT:
		prefill_on_abort(l, m);
		return;
	case PEER_MSG_VERBS_SCOPE:
		prefill_on_scope(l, m);
		return;
	case PEER_MSG_ABORT_ACK:
		return;   /* our aborts need no ack: decode never writes to us */
	case PEER_MSG_RELEASE_ACK:
		r = prefill_find(l, m->id);
		if (r)
			serve__preq_event(r, PEV_RELEASE_ACK);
		return;
	default:
		KVLOG_RL_WARN(l->s->log, &l->s->rl[SERVE_RL_PEER_PROTOCOL], "peer_protocol", "peer_node=%s msg=\"unexpected %s\"",
			   KVLOG_Q(l->hello.node), proto_peer_type_name(m->type));
		return;
	}
}

/* ---- the link's callbacks ---------------------------------------------------- */

/* link_ops.bad_request: a prefill_request whose only problem is its
 * tenant (the last field read, so every other field was valid) is that
 * request's error, not the link's: it is refused with a prefill_reject
 * and nothing is created. err->msg names the key, never the value. */
static bool prefill_bad_request(struct link *l, const struct proto_peer_msg *m,
				const struct frame_error *err)
{
	if (m->type != PEER_MSG_PREFILL_REQUEST || strcmp(err->key, "tenant"))
		return false;
	l->s->d->counters.rejected[KVD_REJECT_INVALID]++;
	prefill_reject(l, m->id, SERVE_TENANT_UNKNOWN, PROTO_ERR_INVALID_REQUEST,
		       "%s", err->msg);
	return true;
}

/* link_ops.req_lost: the decode node behind r's link is gone. Nothing it
 * could still do matters to our pages (it never writes to them), so r
 * ends once its queued batches have been reported. */
static bool prefill_req_lost(struct serve_req *r, int code, const char *msg)
{
	(void)code;
	(void)msg;
	serve__req_fail(r, PROTO_ERR_INTERNAL, "the decode peer was lost");
	serve__preq_event(r, PEV_LINK_LOST);
	return false;
}

/* link_ops.req_resume: the data connection drained; r sends again if it
 * waited for that. */
static void prefill_req_resume(struct serve_req *r)
{
	if (r->state == PRS_SENDING && !sreq_p(r)->sends_pending)
		prefill_send_more(r);
}

/* ---- the send deadline (transfer.send_timeout_ms) ---------------------------- */

/* Before prefill_done neither release_timeout_ms nor the data
 * connection's stall bound need apply: a peer that stops reading leaves
 * a backlog below the stall bound, and its requests never finish
 * sending. So every request from its first send on (SENDING), and while
 * it waits for its queued batches after an abort (ABORT_DRAINING), must
 * see one of its batches reported within send_timeout_ms of the last.
 *
 * True when r is past it. */
static bool prefill_send_late(const struct serve_req *r, uint64_t now)
{
	const struct sreq_prefill *pp = sreq_pc(r);

	return (r->state == PRS_SENDING || r->state == PRS_ABORT_DRAINING) &&
	       pp->t_progress_ns &&
	       now - pp->t_progress_ns >= (uint64_t)r->s->send_timeout_ms * 1000000ull;
}

static void prefill_send_timeout(struct serve_req *r, uint64_t now, const char *action)
{
	struct sreq_prefill *pp = sreq_p(r);

	r->s->d->counters.send_timeouts++;
	KVLOG_WARN(r->s->log, "send_timeout",
		   "id=%llu tenant=%s remote_id=%llu peer_node=%s peer=%s state=%s pages=%u batches_sent=%u batches_queued=%u idle_ms=%llu send_timeout_ms=%u action=%s",
		   (unsigned long long)r->reg.id, KVLOG_Q(r->tenant),
		   (unsigned long long)pp->remote_id,
		   KVLOG_Q(r->link ? r->link->hello.node : "?"),
		   KVLOG_Q(r->link ? r->link->addr : "?"),
		   machine_state_name(&preq_machine, r->state), pp->n_dst,
		   pp->batches_sent, pp->sends_pending,
		   (unsigned long long)((now - pp->t_progress_ns) / 1000000ull),
		   r->s->send_timeout_ms, action);
	serve__req_fail(r, PROTO_ERR_TIMEOUT,
			"no KV batch of the request left within transfer.send_timeout_ms");
}

/* link_ops.tick. A late request with a batch still queued means the data
 * connection is stuck: the queued batches come back (and with them the
 * right to free the pages they read, invariant 2) only when it closes,
 * so l is torn down and every request on it takes LINK_LOST; each one
 * then frees its pages once its batches are reported cancelled. A late
 * request with nothing queued (waiting for the backlog to drain) ends
 * alone: its abort goes to decode and its pages back at once. */
static void prefill_link_tick(struct link *l, uint64_t now)
{
	struct kvd_list *e, *nxt;

	kvd_list_for_each(e, &l->reqs) {
		struct serve_req *r = kvd_list_entry(e, struct serve_req, link_node);

		if (sreq_p(r)->sends_pending && prefill_send_late(r, now)) {
			prefill_send_timeout(r, now, "close_data");
			serve__link_lost(l, "data connection made no progress within transfer.send_timeout_ms");
			return;
		}
	}
	kvd_list_for_each_safe(e, nxt, &l->reqs) {
		struct serve_req *r = kvd_list_entry(e, struct serve_req, link_node);

		if (prefill_send_late(r, now)) {
			prefill_send_timeout(r, now, "abort");
			serve__preq_event(r, PEV_OP_ABORT);
		}
	}
}

static const struct link_ops prefill_link_ops = {
	.on_msg = prefill_on_msg,
	.bad_request = prefill_bad_request,
	.req_lost = prefill_req_lost,
	.req_resume = prefill_req_resume,
	.tick = prefill_link_tick,
};

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
	s->send_timeout_ms = c->send_timeout_ms ? c->send_timeout_ms : c->release_timeout_ms;
	KVLOG_INFO(s->log, "peer_limits",
		   "max_requests=%u max_pages=%u max_pages_source=%s max_links=%u per=node_address pool_pages=%u full_context_pages=%u write_queue_soft=%llu write_queue_hard=%llu write_stall_timeout_ms=%u release_timeout_ms=%u send_timeout_ms=%u",
		   c->peer_max_requests, s->peer_max_pages,
		   c->peer_max_pages ? "config" : "auto", c->peer_max_links, pool, full,
		   (unsigned long long)c->write_queue_soft,
		   (unsigned long long)c->write_queue_hard,
		   c->write_stall_timeout_ms, c->release_timeout_ms,
		   s->send_timeout_ms);
}

int serve__prefill_start(struct serve *s)
{
	prefill_peer_limits(s);
	{
		/* room for the 512 accepted peer links (link.c) besides the admin
		 * socket, its clients and the node's own descriptors */
		struct rlimit rl;

		if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
			rl.rlim_cur = rl.rlim_max;
			(void)setrlimit(RLIMIT_NOFILE, &rl);
		}
	}

	return serve__link_listen(s, &prefill_link_ops);
}
