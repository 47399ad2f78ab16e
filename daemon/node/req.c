/* req.c - the common life of a serving request: creation, the node's
 * registry, the phase timer, the one state setter of the machines
 * (daemon/node/machine.h), the end, and the request's side of the compute
 * bridge.
 *
 * Below every role: nothing here calls client.c, decode.c or prefill.c.
 * What is kind-specific (the name the registry shows, the abort path,
 * engine messages, a client leaving) comes through r->rops, which the
 * role sets when it admits the request.
 *
 * A request is terminal exactly once (serve__req_end): it leaves the
 * registry (drain and status see it go), and its memory is freed in its
 * timer's close callback, after which no callback can name it.
 */
#include "daemon/node/serve_int.h"
#include "conf/util.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct sreq_decode *sreq_d(struct serve_req *r)
{
	KVD_ASSERT(r->s->log, r->kind == SREQ_DECODE || r->kind == SREQ_LOCAL,
		   "kind=%d msg=\"the decode part of a prefill request\"", (int)r->kind);
	return &r->part.d;
}

struct sreq_prefill *sreq_p(struct serve_req *r)
{
	KVD_ASSERT(r->s->log, r->kind == SREQ_PREFILL,
		   "kind=%d msg=\"the prefill part of a decode request\"", (int)r->kind);
	return &r->part.p;
}

const struct sreq_decode *sreq_dc(const struct serve_req *r)
{
	return sreq_d((struct serve_req *)r);
}

const struct sreq_prefill *sreq_pc(const struct serve_req *r)
{
	return sreq_p((struct serve_req *)r);
}


struct serve_req *serve__req_new(struct serve *s, enum serve_req_kind kind)
{
	struct serve_req *r = calloc(1, sizeof(*r));

	if (!r)
		return NULL;
	r->s = s;
	kvd_list_init(&r->sink_node);
	r->kind = kind;
	r->t_arrive_ns = kvd_now_ns();
	snprintf(r->tenant, sizeof(r->tenant), "%s", KVD_TENANT_DEFAULT);
	r->free_job = compute_free_job_new();
	if (!r->free_job || uv_timer_init(&s->d->loop, &r->timer)) {
		compute_job_free(r->free_job);
		free(r);
		return NULL;
	}
	r->timer.data = r;
	kvd_list_init(&r->link_node);
	kvd_list_add(&s->reqs, &r->node);
	s->n_reqs++;
	return r;
}

/* The kind is the role's, not first's: the placement may have made
 * choice 0 local (SREQ_LOCAL: decode reuse, peers.local_prefill) while
 * choice i goes to a peer, whose messages find only SREQ_DECODE requests
 * (decode_req_of). decode_run_peer sets it again at the placement. */
struct serve_req *serve__req_choice_new(const struct serve_req *first, uint32_t i,
					struct jgram_run *run)
{
	struct serve *s = first->s;
	size_t nb = first->sp.n_logit_bias * sizeof(*first->bias);
	int32_t *prompt = malloc(first->n_prompt * sizeof(*prompt));
	struct sampler_bias *bias = nb ? malloc(nb) : NULL;
	enum serve_req_kind kind = s->d->cfg.role == KVD_ROLE_DECODE ? SREQ_DECODE
								    : SREQ_LOCAL;
	struct serve_req *r = prompt && (bias || !nb) ? serve__req_new(s, kind) : NULL;

	if (!r) {
		free(prompt);
		free(bias);
		return NULL;
	}
	memcpy(prompt, first->prompt, first->n_prompt * sizeof(*prompt));
	if (nb)
		memcpy(bias, first->bias, nb);
	r->client_id = first->client_id;
	snprintf(r->public_id, sizeof(r->public_id), "%s", first->public_id);
	snprintf(r->tenant, sizeof(r->tenant), "%s", first->tenant);
	snprintf(r->cache_salt, sizeof(r->cache_salt), "%s", first->cache_salt);
	r->lim = first->lim;
	r->prompt = prompt;
	r->n_prompt = first->n_prompt;
	r->max_tokens = first->max_tokens;
	r->sp = first->sp;
	r->sp.seed = first->sp.seed + i;
	r->bias = bias;
	r->sp.logit_bias = bias;
	if (first->gram) {               /* each choice its own run of it */
		r->gram = jgram_ref(first->gram);
		r->jrun = run;
	}
	r->shares_prompt = true;
	return r;
}

/* O(1): the node's registry by id. Synthetic requests (daemon/node/ops.c)
 * share it; only an entry of the serve family is a serve_req. */
struct serve_req *serve__req_find(struct serve *s, uint64_t id)
{
	struct kvd_request *reg = kvd_reqtab_find(s->reqtab, id);
	struct serve_req *r;

	if (!reg || reg->ops->family != KVD_REQ_SERVE)
		return NULL;
	r = kvd_container_of(reg, struct serve_req, reg);
	KVD_ASSERT(s->log, r->s == s && r->registered,
		   "id=%llu tenant=%s msg=\"a registered serve request of another serving layer\"",
		   (unsigned long long)id, KVLOG_Q(r->tenant));
	return r->ended ? NULL : r;
}

const char *serve__req_tenant(struct serve *s, uint64_t id)
{
	struct serve_req *r = serve__req_find(s, id);

	return r ? r->tenant : SERVE_TENANT_UNKNOWN;
}

void serve__req_register(struct serve_req *r)
{
	kvd_request_register(r->s->reqtab, &r->reg, &r->rops->reg);
	r->reg.tenant = r->tenant;
	r->reg.public_id = r->public_id[0] ? r->public_id : NULL;
	r->registered = true;
}

static void serve_req_free_cb(uv_handle_t *h)
{
	struct serve_req *r = h->data;
	struct serve *s = r->s;

	if (r->dt_init)
		detok_deinit(&r->dt);
	compute_job_free(r->free_job);
	if (r->jrun && jgram_run_triggered(r->jrun))   /* a lazy call grammar took over */
		KVLOG_DEBUG(s->log, "grammar_trigger", "id=%llu tenant=%s",
			    (unsigned long long)r->reg.id, KVLOG_Q(r->tenant));
	jgram_run_free(r->jrun);
	jgram_free(r->gram);
	free(r->prompt);
	free(r->bias);
	if (r->kind == SREQ_PREFILL) {
		free(r->part.p.dst);
		free(r->part.p.src);
	} else {
		free(r->part.d.table);
		free(r->part.d.rx.got);
	}
	free(r);
	s->closes_pending--;
}

void serve__req_end(struct serve_req *r, bool ok)
{
	struct serve *s = r->s;

	if (r->ended)
		return;
	r->ended = true;
	/* its admission slot and the pages it was to reserve go back; the
	 * queues are pumped from the gate timer, not inside this change */
	serve__gate_settle(r);
	serve__gate_first_token(r);   /* holds nobody any more */
	if (r->fq.t) {
		fairq_done(&s->fq, &r->fq);
		if (s->gate_open)
			uv_timer_start(&s->gate_timer, s->gate_cb, 0, 0);
	}
	/* a client request's outcome, once: its answer, its first failure,
	 * or abandoned (the client left before either) */
	if (r->kind != SREQ_PREFILL)
		kvd_metrics_request_end(&s->d->metrics, r->tenant,
					ok && r->finish_reason[0] ? r->finish_reason : NULL,
					r->fail_code, kvd_now_ns() - r->t_arrive_ns);
	KVD_ASSERT(s->log, !r->sink,
		   "id=%llu tenant=%s msg=\"a request ends still attached to its client\"",
		   (unsigned long long)r->reg.id, KVLOG_Q(r->tenant));
	/* off its link's list before the memory goes (its machine detached
	 * it already, except at stop) */
	kvd_list_del(&r->link_node);
	kvd_list_del(&r->node);
	s->n_reqs--;
	s->closes_pending++;
	uv_close((uv_handle_t *)&r->timer, serve_req_free_cb);
	/* last: ending may complete a SIGTERM drain and stop the node */
	if (r->registered)
		kvd_request_end(s->reqtab, &r->reg, ok);
}

void serve__timer_start(struct serve_req *r, uint64_t ms, uv_timer_cb cb)
{
	if (!r->ended)
		uv_timer_start(&r->timer, cb, ms, 0);
}

void serve__timer_stop(struct serve_req *r)
{
	if (!r->ended)
		uv_timer_stop(&r->timer);
}

const struct machine_step *serve__req_step(struct serve_req *r,
					   const struct machine *m,
					   unsigned event)
{
	const struct machine_step *st = machine_step(m, r->state, event);
	char acts[256];

	if (st->kind == MSTEP_IGNORE) {
		KVLOG_DEBUG(r->s->log, "req_event_ignored", "id=%llu tenant=%s machine=%s state=%s event=%s",
			    (unsigned long long)r->reg.id, KVLOG_Q(r->tenant), m->name,
			    machine_state_name(m, r->state), machine_event_name(m, event));
		return NULL;
	}
	KVD_ASSERT(r->s->log, st->kind == MSTEP_GO && machine_edge(m, r->state, st->next),
		   "id=%llu tenant=%s machine=%s state=%s event=%s msg=\"no such transition\"",
		   (unsigned long long)r->reg.id, KVLOG_Q(r->tenant), m->name,
		   machine_state_name(m, r->state), machine_event_name(m, event));
	KVLOG_DEBUG(r->s->log, "req_state", "id=%llu tenant=%s machine=%s from=%s event=%s to=%s actions=%s",
		    (unsigned long long)r->reg.id, KVLOG_Q(r->tenant), m->name,
		    machine_state_name(m, r->state), machine_event_name(m, event),
		    machine_state_name(m, st->next),
		    machine_actions_str(m, st->actions, acts, sizeof(acts)));
	/* every phase timer belongs to its state, unless the step says the
	 * deadline carries on (decode's ABORTING -> ABORT_LANDING) */
	if (st->next != r->state && !(st->actions & m->keep_timer))
		serve__timer_stop(r);
	r->state = st->next;
	return st;
}

uint64_t serve__own_limit(struct serve *s)
{
	uint64_t lim = s->d->cap.advertised_context;

	return KVD_MIN(lim, s->d->cap.pool_tokens);
}

int serve__compute_submit(struct serve *s, struct serve_req *r,
			  const int32_t *prompt, uint32_t n_prompt,
			  uint32_t max_tokens, bool prefill_only,
			  const struct kvpool_ref *table, uint32_t n_table,
			  uint32_t n_cached)
{
	struct engine_req_params rp = {
		.max_tokens = max_tokens, .sampling = r->sp,
		.prefill_only = prefill_only, .n_cached = n_cached };
	bool nomem = kvd_fault_fire(&s->fault, KVD_FAULT_COMPUTE_NOMEM);
	struct pcache_key key;
	int rc;

	/* A prompt this node computes into its own pages (standalone, a
	 * decode node's local prefill, a prefill node for its peer) uses the
	 * prefix cache of its tenant and salt; lent pages never do. */
	if (s->d->cache && !table) {
		pcache_key_make(&key, s->d->cache_fp, r->tenant, r->cache_salt,
				strlen(r->cache_salt));
		rp.cache_key = &key;
	}
	if (r->jrun)
		rp.constraint = (struct engine_constraint){ .ctx = r->jrun,
			.mask = jgram_run_mask, .accept = jgram_run_accept };
	rc = compute_submit(&s->comp, r->reg.id, &rp, prompt, n_prompt, table,
			    n_table, nomem);
	return rc;
}

void serve__compute_free(struct serve *s, struct serve_req *r,
			 bool release_table, bool quarantine)
{
	struct compute_job *j = r->free_job;
	struct kvpool_ref *release = NULL;
	uint32_t n_release = 0;

	if (!j)
		return;   /* queued already: its FREED ends r */
	r->free_job = NULL;
	if (release_table && sreq_d(r)->table && sreq_d(r)->n_table) {
		struct sreq_decode *d = sreq_d(r);

		release = d->table;
		n_release = d->n_table;
		d->table = NULL;
	}
	compute_free(&s->comp, j, r->reg.id, r->ereq, release, n_release,
		     quarantine);
	r->ereq = NULL;
}

bool serve__req_fail(struct serve_req *r, int code, const char *fmt, ...)
{
	va_list ap;

	if (r->fail_code)
		return false;
	r->fail_code = code;
	va_start(ap, fmt);
	vsnprintf(r->fail_msg, sizeof(r->fail_msg), fmt, ap);
	va_end(ap);
	return true;
}
