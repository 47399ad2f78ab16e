/* gate.c - admission between tenants, in front of the role's admission.
 *
 * Design. A parsed request does not go to the role (serve->admit)
 * directly: it is offered to its tenant's queue (daemon/node/fairq.h) and is
 * admitted when the node has a slot (tenants.node_max_active, default
 * engine.max_batch, so every admitted request is in the decode batch)
 * and the pool has its pages free, in weighted fair order between
 * tenants. The role then reserves its pages exactly as before
 * (invariant 3: admission before allocation): the gate only decides
 * when a request may try.
 *
 * Pages. A request still reserves prompt + max_tokens at admission (the
 * engine's and decode's rule): growing a reservation as tokens come
 * would need preemption when the pool runs dry mid-generation, and a
 * pool that never overcommits is the invariant. What changes is that a
 * request that does not fit *now* waits in its queue instead of being
 * refused. The gate counts the pages the pool has free minus the pages
 * of requests it admitted that the engine has not reserved yet (its
 * thread reserves them, later): so it never admits more than the pool
 * holds, and the pool's own all-or-nothing reservation stays the last
 * word (a refusal there is still OVERLOADED, as before).
 *
 * Bounds. Each tenant waits at most tenants.max_queued requests (one
 * more: OVERLOADED, HTTP 429 with Retry-After), each at most
 * tenants.queue_timeout_ms (then the same). A client that leaves takes
 * its waiting request out of the queue. A drain refuses what waits.
 *
 * Pumping. An admitted request that ends lets others in: req.c starts
 * the gate timer (0 ms) and the pump runs from it, never inside the
 * ending request's state change. The sweep pumps too (pages come back
 * when fences lift, without a request ending).
 *
 * Prefix hold-back (cache.enabled; issue 21.6). A tenant's head request
 * at least half of whose prompt is full pages that an admitted request
 * of the same tenant and cache_salt is still computing (s->computing: no
 * first token yet) waits until that one has its first token (or ends):
 * the engine caches a prompt's full pages at the step that computed its
 * last token, so the held request then maps them and computes only the
 * rest, instead of computing the same prefix beside it. Only its own
 * tenant and salt can hold a request (so this adds nothing another
 * tenant can time), a held head never blocks another tenant (fairq
 * skips it), and it waits at most half of tenants.queue_timeout_ms
 * (then it computes itself; it is never refused for having been held).
 * On a decode node only with one prefill peer: with several, the held
 * request may be placed on another peer than the one that cached -
 * except a later choice of an n > 1 request behind its own choice 0,
 * which goes to choice 0's peer (below).
 *
 * The choices of an HTTP request with n > 1 (daemon/front/http_api.c)
 * are n requests of one tenant and salt, choice 0 first: the hold-back
 * is what makes them compute the prompt once. Choices 1.. are marked
 * shares_prompt and never join s->computing themselves (they compute
 * one page, and holding each behind the one before would serialize
 * them for nothing): once choice 0 has its first token, they all go.
 * On a decode node with several prefill peers they are held too (only
 * behind their own choice 0, the same public id), and placed on the
 * peer choice 0 went to (decode.c decode_sibling_peer), whose prefix
 * cache then holds the prompt.
 */
#include "daemon/node/serve_int.h"
#include "gpu/kv/pcache.h"
#include "conf/util.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void gate_client_gone(struct serve_req *r);

/* What a waiting request is to the layers below: no engine, not in the
 * registry; a client that leaves takes it out of the queue. */
static const struct serve_req_ops gate_wait_ops = {
	.reg = { .family = KVD_REQ_SERVE, .kind = "waiting" },
	.client_gone = gate_client_gone,
};

static struct fairq_limits gate_limits(const struct kvd_config *c,
				       const struct kvd_tenant_limits *k)
{
	return (struct fairq_limits){
		.share = k->share ? k->share : c->tenant_share,
		.max_active = k->max_active ? k->max_active : c->tenant_max_active,
		.max_queued = k->max_queued ? k->max_queued : c->tenant_max_queued,
		.max_tokens = k->max_tokens ? k->max_tokens : c->tenant_max_tokens,
	};
}

/* Pages the pool has free for the gate to give: free now, and the
 * prefix cache's pages no running request maps (every reservation
 * evicts those before it answers full: pcache_pool_reserve), less those
 * admitted requests will still reserve. */
static uint32_t gate_free_pages(struct serve *s)
{
	struct kvpool_stats st;
	uint64_t f;

	kvpool_get_stats(s->d->pool, &st);
	f = st.by_state[KVPAGE_FREE];
	if (s->d->cache) {
		uint32_t cached = 0, held = 0;

		pcache_stats(s->d->cache, &cached, &held, NULL, 0);
		f += cached > held ? cached - held : 0;
	}
	return f > s->gate_unsettled ? (uint32_t)KVD_MIN(f - s->gate_unsettled, UINT32_MAX) : 0;
}

static uint32_t gate_pages(struct serve_req *r)
{
	uint64_t need = (uint64_t)r->n_prompt + r->max_tokens;

	return kvpool_pages_for(r->s->d->pool, need ? need - 1 : 0);
}

/* (serve_int.h) Anything larger is the role's refusal at once
 * (prompt_too_long, no_peer), never a wait. */
uint64_t serve__gate_path_limit(struct serve *s)
{
	uint64_t own = serve__own_limit(s), best = 0;
	struct kvd_list *e;

	if (s->d->cfg.role != KVD_ROLE_DECODE)
		return own;
	kvd_list_for_each(e, &s->links) {
		const struct link *l = kvd_list_entry(e, struct link, node);

		if (l->side == LINK_DIAL && link_takes_requests(l))
			best = KVD_MAX(best, KVD_MIN((uint64_t)l->hello.context,
						     (uint64_t)l->hello.pool_tokens));
	}
	return KVD_MIN(own, best);
}

/* A waiting request leaves without being admitted: answered with code
 * (0: its client is gone, nothing to answer), ended. */
static void gate_refuse(struct serve_req *r, int code, const char *reason,
			const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static void gate_refuse(struct serve_req *r, int code, const char *reason,
			const char *fmt, ...)
{
	struct serve *s = r->s;
	va_list ap;

	fairq_done(&s->fq, &r->fq);
	serve__gate_kick(s);   /* its tenant's next request may go now */
	if (code) {
		s->d->counters.rejected[code == PROTO_ERR_DRAINING ? KVD_REJECT_DRAINING :
					code == PROTO_ERR_INVALID_REQUEST ? KVD_REJECT_INVALID :
					KVD_REJECT_OVERLOADED]++;
		r->fail_code = code;
		va_start(ap, fmt);
		vsnprintf(r->fail_msg, sizeof(r->fail_msg), fmt, ap);
		va_end(ap);
		KVLOG_RL_WARN(s->log, &s->rl[SERVE_RL_CLIENT_REFUSED], "admission_reject",
			      "client_id=%llu tenant=%s reason=%s prompt_tokens=%u max_tokens=%u waited_ms=%llu",
			      (unsigned long long)r->client_id, KVLOG_Q(r->tenant), reason,
			      r->n_prompt, r->max_tokens,
			      (unsigned long long)((kvd_now_ns() - r->t_arrive_ns) / 1000000u));
	}
	serve__dreq_event(r, DEV_REFUSE);
}

static void gate_client_gone(struct serve_req *r)
{
	r->answered = true;   /* nobody to answer */
	gate_refuse(r, 0, "client_gone", "%s", "");
}

static bool gate_holds(const struct serve *s);
static bool gate_holds_choices(const struct serve *s);

/* Its turn: the role's admission, which reserves its pages (or refuses).
 * Until its first token (or end) it may hold same-prefix requests of its
 * tenant (s->computing). */
static void gate_run(struct serve_req *r, uint32_t pages)
{
	struct serve *s = r->s;

	r->gate_unsettled = pages;
	s->gate_unsettled += pages;
	r->rops = NULL;
	if (gate_holds_choices(s) && r->prompt && !r->shares_prompt &&
	    r->n_prompt >= kvpool_geom(s->d->pool)->page_tokens) {
		kvd_list_add_tail(&s->computing, &r->computing);
		r->on_computing = true;
	}
	if (r->t_arrive_ns && kvd_now_ns() - r->t_arrive_ns > 1000000u)
		KVLOG_DEBUG(s->log, "admission_waited",
			    "client_id=%llu tenant=%s waited_ms=%llu",
			    (unsigned long long)r->client_id, KVLOG_Q(r->tenant),
			    (unsigned long long)((kvd_now_ns() - r->t_arrive_ns) / 1000000u));
	s->admit(r);
}

/* The prefix hold-back applies where this node's admission decides where
 * the prompt is cached: standalone, or a decode node with one prefill
 * peer (with several, the held request may go to another peer, whose
 * cache the first one never filled). */
static bool gate_holds(const struct serve *s)
{
	const struct kvd_config *c = &s->d->cfg;

	return c->cache_enabled &&
	       (c->role != KVD_ROLE_DECODE || c->n_peers_prefill == 1);
}

/* The later choices of an n > 1 request are held behind their choice 0
 * wherever a cache is: with several prefill peers too, since they are
 * placed on the peer choice 0 went to (decode.c decode_sibling_peer). */
static bool gate_holds_choices(const struct serve *s)
{
	return s->d->cfg.cache_enabled;
}

/* q (computing) may hold r: anyone may where gate_holds; elsewhere only
 * a later choice of q's own exchange (the same public id). */
static bool gate_may_hold(const struct serve *s, const struct serve_req *r,
			  const struct serve_req *q)
{
	return gate_holds(s) ||
	       (r->shares_prompt && r->public_id[0] && !strcmp(q->public_id, r->public_id));
}

/* Full pages r's prompt shares with q's, of those r could map (all but
 * its last token's page), same tenant and salt. */
static uint32_t gate_shared_pages(const struct serve_req *r, const struct serve_req *q,
				  uint32_t pt)
{
	uint32_t n = KVD_MIN((r->n_prompt - 1) / pt, q->n_prompt / pt), i = 0;

	if (!q->prompt || strcmp(q->tenant, r->tenant) || strcmp(q->cache_salt, r->cache_salt))
		return 0;
	while (i < n && !memcmp(q->prompt + (size_t)i * pt, r->prompt + (size_t)i * pt,
				(size_t)pt * sizeof(*r->prompt)))
		i++;
	return i;
}

/* r waits for a request computing a prompt whose full pages make at
 * least half of r's own: then waiting for it saves r at least half its
 * compute. At most half its tenants.queue_timeout_ms: then it goes and
 * computes itself, never refused for having waited. */
static bool gate_prefix_computing(struct serve *s, const struct serve_req *r, uint64_t now)
{
	uint32_t pt = kvpool_geom(s->d->pool)->page_tokens;
	uint64_t hold_ns = (uint64_t)s->d->cfg.tenant_queue_timeout_ms * 500000u;
	struct kvd_list *e;

	if (!r->prompt || r->n_prompt <= pt || now - r->t_arrive_ns >= hold_ns)
		return false;
	kvd_list_for_each(e, &s->computing) {
		const struct serve_req *q = kvd_list_entry(e, struct serve_req, computing);

		if (q != r && gate_may_hold(s, r, q) &&
		    2ull * gate_shared_pages(r, q, pt) * pt >= r->n_prompt)
			return true;
	}
	return false;
}

/* Each tenant's head: held while most of its prompt is being computed
 * for another request of its tenant (s->computing, at most the node's
 * admission slots). */
static void gate_mark_held(struct serve *s)
{
	uint64_t now = kvd_now_ns();
	bool any = gate_holds_choices(s) && !kvd_list_empty(&s->computing);
	struct kvd_list *e;

	/* every head, so a hold that ended is cleared too */
	kvd_list_for_each(e, &s->fq.tenants) {
		struct fairq_tenant *t = kvd_list_entry(e, struct fairq_tenant, node);
		struct fairq_item *it;

		if (!t->queued)
			continue;
		it = kvd_list_entry(t->waiting.next, struct fairq_item, node);
		it->held = any &&
			   gate_prefix_computing(s, kvd_container_of(it, struct serve_req, fq), now);
	}
}

/* A drain refuses what waits, at once and from every path that pumps:
 * a request ending or a first token kicks the pump, and admitting from
 * the queue then would start work the drain said it would not take. */
static void gate_refuse_waiting(struct serve *s)
{
	struct kvd_list *pos, *nxt;

	/* every live request, so refusing one (it leaves s->reqs) never
	 * frees a list this walk still stands in */
	kvd_list_for_each_safe(pos, nxt, &s->reqs) {
		struct serve_req *r = kvd_list_entry(pos, struct serve_req, node);

		if (!r->ended && r->fq.waiting)
			gate_refuse(r, PROTO_ERR_DRAINING, "draining",
				    "the node is draining and admits no new requests");
	}
}

static void gate_pump(struct serve *s)
{
	struct fairq_item *it;
	uint32_t avail;

	if (s->stopping || !s->fq.queued)
		return;
	if (kvd_request_gate(s->reqtab)) {
		gate_refuse_waiting(s);
		return;
	}
	avail = gate_free_pages(s);
	for (;;) {
		struct serve_req *r;

		gate_mark_held(s);   /* the one admitted last may hold the next */
		it = fairq_next(&s->fq, avail);
		if (!it)
			break;
		r = kvd_container_of(it, struct serve_req, fq);
		avail -= KVD_MIN(avail, it->pages);
		gate_run(r, it->pages);
	}
}


/* ---- what admin sees (struct kvd_queue_hook) -------------------------------- */

/* Every waiting request, tenant by tenant, oldest first in each. */
static uint32_t gate_hook_waiting(void *arg, struct kvd_waiting *out, uint32_t max)
{
	struct serve *s = arg;
	uint64_t now = kvd_now_ns();
	uint32_t n = 0;
	struct kvd_list *e, *f;

	kvd_list_for_each(e, &s->fq.tenants) {
		struct fairq_tenant *t = kvd_list_entry(e, struct fairq_tenant, node);

		kvd_list_for_each(f, &t->waiting) {
			struct fairq_item *it = kvd_list_entry(f, struct fairq_item, node);
			const struct serve_req *r = kvd_container_of(it, struct serve_req, fq);

			if (n < max) {
				struct kvd_waiting *w = &out[n];

				w->id = r->reg.id;
				snprintf(w->public_id, sizeof(w->public_id), "%s", r->public_id);
				snprintf(w->tenant, sizeof(w->tenant), "%s", r->tenant);
				w->prompt_tokens = r->n_prompt;
				w->max_tokens = r->max_tokens;
				w->waited_ms = (now - r->t_arrive_ns) / 1000000u;
				w->held = it->held;
			}
			n++;
		}
	}
	return n;
}

static int gate_hook_abort(void *arg, uint64_t *id, const char *pid)
{
	struct serve *s = arg;
	struct kvd_list *e;

	kvd_list_for_each(e, &s->reqs) {
		struct serve_req *r = kvd_list_entry(e, struct serve_req, node);

		if (r->ended || !r->fq.waiting ||
		    (pid ? strcmp(r->public_id, pid) : r->reg.id != *id))
			continue;
		*id = r->reg.id;
		/* the operator's (daemon/node/ops.c logs it), not a rejection */
		fairq_done(&s->fq, &r->fq);
		serve__gate_kick(s);
		r->fail_code = PROTO_ERR_INTERNAL;
		snprintf(r->fail_msg, sizeof(r->fail_msg), "%s",
			 "aborted by the operator while waiting for admission");
		serve__dreq_event(r, DEV_REFUSE);
		return 0;
	}
	return KVD_E_NOTFOUND;
}

static void gate_timer_cb(uv_timer_t *t)
{
	gate_pump(t->data);
}

int serve__gate_init(struct serve *s)
{
	const struct kvd_config *c = &s->d->cfg;
	int rc;

	fairq_init(&s->fq, c->node_max_active ? c->node_max_active : c->max_batch);
	kvd_list_init(&s->computing);
	rc = uv_timer_init(&s->d->loop, &s->gate_timer);
	if (rc)
		return rc;
	s->gate_timer.data = s;
	s->gate_cb = gate_timer_cb;
	s->gate_open = true;
	s->d->queue = (struct kvd_queue_hook){
		.arg = s, .waiting = gate_hook_waiting, .abort = gate_hook_abort,
	};
	return 0;
}

void serve__gate_stop(struct serve *s)
{
	if (!s->gate_open)
		return;
	s->gate_open = false;
	memset(&s->d->queue, 0, sizeof(s->d->queue));
	serve__close_handle(s, (uv_handle_t *)&s->gate_timer);
}

void serve__gate_admit(struct serve_req *r)
{
	struct serve *s = r->s;
	struct fairq_limits lim = gate_limits(&s->d->cfg, &r->lim);
	struct fairq_tenant *t;
	uint64_t need = (uint64_t)r->n_prompt + r->max_tokens;
	uint32_t pages = gate_pages(r);
	int rc;

	/* what cannot fit the path is the role's refusal, at once */
	if (need > serve__gate_path_limit(s)) {
		s->admit(r);
		return;
	}
	r->rops = &gate_wait_ops;
	/* one id from here to its end: kvctl queue shows it, kvctl abort
	 * takes it, and registration at admission keeps it */
	if (!r->reg.id)
		r->reg.id = kvd_reqtab_new_id(s->reqtab);
	t = fairq_tenant(&s->fq, r->tenant, &lim);
	if (!t) {
		gate_refuse(r, PROTO_ERR_INTERNAL, "nomem", "out of memory");
		return;
	}
	rc = fairq_offer(&s->fq, t, &r->fq, (uint32_t)KVD_MIN(need, UINT32_MAX),
			 pages);
	if (rc == FAIRQ_E_TOO_BIG) {
		gate_refuse(r, PROTO_ERR_INVALID_REQUEST, "tenant_max_tokens",
			    "prompt (%u tokens) + max_tokens (%u) exceeds this tenant's max_tokens (%u)",
			    r->n_prompt, r->max_tokens, lim.max_tokens);
		return;
	}
	if (rc == 0) {
		gate_pump(s);
		/* still waiting, one past the tenant's bound: refused */
		if (r->fq.waiting && !fairq_overfull(t))
			return;
		if (!r->fq.waiting)
			return;   /* admitted (and maybe ended) */
	}
	gate_refuse(r, PROTO_ERR_OVERLOADED, "tenant_queue_full",
		    "the node is busy and this tenant already has %u requests waiting (tenants.max_queued); retry later",
		    lim.max_queued);
}

void serve__gate_sweep(struct serve *s)
{
	uint64_t now = kvd_now_ns();
	uint64_t lim = (uint64_t)s->d->cfg.tenant_queue_timeout_ms * 1000000u;
	bool draining = kvd_request_gate(s->reqtab) || s->stopping;
	struct kvd_list *pos, *nxt;

	/* every live request, so refusing one (it leaves s->reqs) never
	 * frees a list this walk still stands in */
	kvd_list_for_each_safe(pos, nxt, &s->reqs) {
		struct serve_req *r = kvd_list_entry(pos, struct serve_req, node);

		if (r->ended || !r->fq.waiting)
			continue;
		if (draining)
			gate_refuse(r, PROTO_ERR_DRAINING, "draining",
				    "the node is draining and admits no new requests");
		else if (now - r->t_arrive_ns >= lim)
			gate_refuse(r, PROTO_ERR_OVERLOADED, "queue_timeout",
				    "waited %u ms for admission (tenants.queue_timeout_ms); the node is busy, retry later",
				    s->d->cfg.tenant_queue_timeout_ms);
	}
	gate_pump(s);
}
