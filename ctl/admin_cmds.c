/* admin_cmds.c - the admin commands: one table row and one handler each.
 *
 * A row is (name, handler, argument schema, privilege, fault-point only).
 * admin.c finds the row, checks the privilege and the schema (strict:
 * unknown keys are errors), then runs the handler, so handlers receive
 * typed, validated arguments and stay short. Each handler calls one
 * daemon/node/ops.h operation and turns its result into one reply map; ops'
 * and the daemon's codes become wire codes in admin_code_of() and
 * nowhere else.
 *
 * Waiting commands (a drain with wait, a shrinking resize) return
 * ADMIN_PENDING and finish through admin__call_complete(): the drain from
 * a poll on the client's timer, the resize from the ops layer's callback.
 * The protocol each command speaks is documented in ctl/README.md.
 */
#include "conf/util.h"
#include "ctl/admin_int.h"
#include "daemon/node/daemon.h"
#include "daemon/node/metrics.h"
#include "daemon/node/ops.h"
#include "gpu/kv/pcache.h"
#include "kvd_build.h"
#include "net/wire/frame.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ADMIN_POLL_MS 10
#define ADMIN_RESIZE_TIMEOUT_MS 10000

/* An ops/daemon code as a wire code. */
static int admin_code_of(int r)
{
	switch (r) {
	case KVD_E_CAPACITY: return ADMIN_E_CAPACITY;
	case KVD_E_DRAINING: return ADMIN_E_DRAINING;
	case KVD_E_BUSY: return ADMIN_E_BUSY;
	case KVD_E_NOTFOUND: return ADMIN_E_NOT_FOUND;
	case KVD_OPS_E_STATE: return ADMIN_E_WRONG_STATE;
	case KVD_OPS_E_RANGE: return ADMIN_E_OUT_OF_RANGE;
	case KVD_OPS_E_TIMEOUT: return ADMIN_E_TIMEOUT;
	case KVD_OPS_E_FULL: return ADMIN_E_POOL_FULL;
	case KVD_OPS_E_UNSUPPORTED: return ADMIN_E_UNSUPPORTED;
	default: return ADMIN_E_INTERNAL;
	}
}

/* ---- result packing -------------------------------------------------------- */

static void pack_capacity(msgpack_packer *pk, struct kvd_daemon *d,
			  const struct kvd_capacity *cap)
{
	msgpack_pack_map(pk, 18);
	frame_pack_kv_u64(pk, "pool_tokens", cap->pool_tokens);
	frame_pack_kv_u64(pk, "pages", cap->pages);
	frame_pack_kv_u64(pk, "page_tokens", cap->page_tokens);
	frame_pack_kv_u64(pk, "page_bytes", cap->page_bytes);
	frame_pack_kv_u64(pk, "kv_bytes_per_token", cap->kv_bytes_per_token);
	frame_pack_kv_u64(pk, "context_length", cap->context_length);
	frame_pack_kv_double(pk, "margin", cap->margin);
	frame_pack_kv_u64(pk, "required_tokens", cap->required_tokens);
	frame_pack_kv_bool(pk, "ok", cap->ok);
	frame_pack_kv_str(pk, "verdict", cap->ok ? "ok" : "insufficient");
	frame_pack_kv_str(pk, "policy",
			  kvd_cap_policy_name(d->cfg.capacity_policy));
	frame_pack_kv_u64(pk, "advertised_context", cap->advertised_context);
	frame_pack_kv_str(pk, "model_sha256", d->model_sha256);
	frame_pack_kv_str(pk, "kv_dtype",
			  kv_dtype_name((enum kv_dtype)d->cfg.kv_dtype));
	frame_pack_kv_str(pk, "transport", kvd_transport_name(d->cfg.transport));
	frame_pack_kv_str(pk, "verbs_device",
			  d->cfg.transport == KVD_TRANSPORT_VERBS ?
			  d->cfg.verbs_device : "");
	frame_pack_kv_str(pk, "verbs_write_scope", d->verbs_write_scope);
	frame_pack_kv_u64(pk, "verbs_inline", d->verbs_inline);
}

static void pack_pool(msgpack_packer *pk, const struct kvpool_stats *p,
		      uint32_t cached_held)
{
	static const char *const keys[KVPAGE_N_STATES] = {
		[KVPAGE_FREE] = "free", [KVPAGE_RESERVED] = "reserved",
		[KVPAGE_FILLING] = "filling", [KVPAGE_READY] = "ready",
		[KVPAGE_FENCED] = "fenced", [KVPAGE_QUARANTINED] = "quarantined",
		[KVPAGE_RETIRED] = "retired",
		[KVPAGE_CACHED] = "cached",
	};

	msgpack_pack_map(pk, 7 + KVPAGE_N_STATES);
	frame_pack_kv_u64(pk, "pages", p->pages);
	for (int i = 0; i < KVPAGE_N_STATES; i++)
		frame_pack_kv_u64(pk, keys[i], p->by_state[i]);
	frame_pack_kv_u64(pk, "cached_held", cached_held);
	frame_pack_kv_u64(pk, "retiring", p->retiring);
	frame_pack_kv_u64(pk, "fences", p->fences);
	frame_pack_kv_u64(pk, "page_tokens", p->page_tokens);
	frame_pack_kv_u64(pk, "page_bytes", p->page_bytes);
	frame_pack_kv_u64(pk, "tokens", p->tokens);
}

static void pack_counters(msgpack_packer *pk, const struct kvd_counters *k)
{
	msgpack_pack_map(pk, 13);
	frame_pack_kv_u64(pk, "admitted", k->admitted);
	frame_pack_str(pk, "rejected");
	msgpack_pack_map(pk, KVD_REJECT__N);
	for (int i = 0; i < KVD_REJECT__N; i++)
		frame_pack_kv_u64(pk, kvd_reject_name((enum kvd_reject)i),
				  k->rejected[i]);
	frame_pack_kv_u64(pk, "completed", k->completed);
	frame_pack_kv_u64(pk, "failed", k->failed);
	frame_pack_kv_u64(pk, "integrity_failures", k->integrity_failures);
	frame_pack_kv_u64(pk, "peer_auth_failures", k->peer_auth_failures);
	frame_pack_kv_u64(pk, "verbs_flush_timeouts", k->verbs_flush_timeouts);
	frame_pack_kv_u64(pk, "checksum_ns", k->checksum_ns);
	frame_pack_kv_u64(pk, "release_timeouts", k->release_timeouts);
	frame_pack_kv_u64(pk, "send_timeouts", k->send_timeouts);
	frame_pack_kv_u64(pk, "drain_aborts", k->drain_aborts);
	frame_pack_kv_u64(pk, "failovers", k->failovers);
	frame_pack_str(pk, "verbs");
	msgpack_pack_map(pk, 5);
	frame_pack_kv_u64(pk, "header_inline", k->verbs.header_inline);
	frame_pack_kv_u64(pk, "header_staged", k->verbs.header_staged);
	frame_pack_kv_u64(pk, "credit_waits", k->verbs.credit_waits);
	frame_pack_kv_u64(pk, "credits_returned", k->verbs.credits_returned);
	frame_pack_kv_u64(pk, "credit_violations", k->verbs.credit_violations);
}

/* ---- handlers ---------------------------------------------------------------- */

static struct kvd_ops *call_ops(struct admin_call *call)
{
	return &call->c->s->ops;
}

static int cmd_status(struct admin_call *call)
{
	struct admin_server *s = call->c->s;
	struct kvd_daemon *d = s->d;
	msgpack_packer *pk = frame_writer_packer(&call->res);
	struct kvd_status st;

	kvd_ops_status(&s->ops, &st);
	msgpack_pack_map(pk, 15);
	frame_pack_kv_str(pk, "node", d->cfg.node_name);
	frame_pack_kv_str(pk, "role", kvd_role_name(st.role));
	frame_pack_kv_str(pk, "state", kvd_state_name(st.state));
	frame_pack_kv_str(pk, "version", KVD_VERSION);
	frame_pack_kv_u64(pk, "uptime_ms", st.uptime_ms);
	frame_pack_str(pk, "pool");
	pack_pool(pk, &st.pool, st.cached_held);
	frame_pack_str(pk, "capacity");
	pack_capacity(pk, d, &st.cap);
	frame_pack_kv_u64(pk, "in_flight", st.in_flight);
	frame_pack_kv_u64(pk, "requests", st.requests);
	frame_pack_kv_u64(pk, "waiting", st.waiting);
	frame_pack_kv_u64(pk, "peers", st.peers);
	frame_pack_str(pk, "counters");
	pack_counters(pk, &st.counters);
	frame_pack_kv_bool(pk, "resizing", st.resizing);
	frame_pack_kv_u64(pk, "synthetic", st.synthetic);
	frame_pack_kv_u64(pk, "admin_clients", s->n_clients);
	return 0;
}

static void pack_state(struct admin_call *call)
{
	struct kvd_daemon *d = call->c->s->d;
	msgpack_packer *pk = frame_writer_packer(&call->res);

	msgpack_pack_map(pk, 2);
	frame_pack_kv_str(pk, "state", kvd_state_name(d->state));
	frame_pack_kv_u64(pk, "in_flight", d->in_flight);
}

static void drain_poll_cb(uv_timer_t *t)
{
	struct admin_client *c = t->data;
	struct admin_call *call = &c->call;
	struct kvd_daemon *d = c->s->d;

	if (d->state == KVD_STATE_DRAINED) {
		pack_state(call);
		admin__call_complete(call, 0);
	} else if (d->state != KVD_STATE_DRAINING) {
		admin__call_complete(call, admin__call_fail(call,
			ADMIN_E_WRONG_STATE,
			"node left draining while waiting (now %s)",
			kvd_state_name(d->state)));
	} else if (call->deadline_ns && kvd_now_ns() >= call->deadline_ns) {
		admin__call_complete(call, admin__call_fail(call,
			ADMIN_E_TIMEOUT,
			"still draining: %u in flight; the drain goes on",
			d->in_flight));
	}
}

static int cmd_drain(struct admin_call *call)
{
	struct admin_client *c = call->c;
	struct kvd_daemon *d = c->s->d;
	int r = kvd_ops_drain(call_ops(call));

	if (r)
		return admin__call_fail(call, admin_code_of(r),
					"cannot drain while %s",
					kvd_state_name(d->state));
	/* wait defaults to true */
	if (!(call->present & ADMIN_DRAIN_WAIT))
		call->a.wait = true;
	if (!call->a.wait || d->state == KVD_STATE_DRAINED) {
		pack_state(call);
		return 0;
	}
	call->deadline_ns = call->a.timeout_ms ?
		kvd_now_ns() + call->a.timeout_ms * 1000000u : 0;
	uv_timer_start(&c->timer, drain_poll_cb, ADMIN_POLL_MS, ADMIN_POLL_MS);
	return ADMIN_PENDING;
}

static int cmd_resume(struct admin_call *call)
{
	struct kvd_daemon *d = call->c->s->d;
	int r = kvd_ops_resume(call_ops(call));

	if (r)
		return admin__call_fail(call, admin_code_of(r),
					"cannot resume while %s%s",
					kvd_state_name(d->state),
					d->stop_after_drain ? " (stopping)"
							    : "");
	pack_state(call);
	return 0;
}

static void resize_done_cb(void *arg, const struct kvd_resize_result *res)
{
	struct admin_client *c = arg;
	struct admin_call *call = &c->call;
	msgpack_packer *pk = frame_writer_packer(&call->res);

	if (res->code) {
		admin__call_complete(call, admin__call_fail(call,
			ADMIN_E_TIMEOUT, "%u pages still in use after %llu ms;"
			" they retire when released (pool now %u pages)", res->retiring_left,
			(unsigned long long)res->waited_ms, res->pages_after));
		return;
	}
	msgpack_pack_map(pk, 6);
	frame_pack_kv_u64(pk, "pages_before", res->pages_before);
	frame_pack_kv_u64(pk, "pages_after", res->pages_after);
	frame_pack_kv_u64(pk, "retired_now", res->retired_now);
	frame_pack_kv_u64(pk, "waited_ms", res->waited_ms);
	frame_pack_kv_u64(pk, "retiring_left", res->retiring_left);
	frame_pack_str(pk, "capacity");
	pack_capacity(pk, c->s->d, &res->cap);
	admin__call_complete(call, 0);
}

static int cmd_pool_resize(struct admin_call *call)
{
	struct kvd_ops *o = call_ops(call);
	bool by_tokens = call->present & ADMIN_RESIZE_TOKENS;
	bool by_bytes = call->present & ADMIN_RESIZE_BYTES;
	uint64_t pages;
	uint32_t timeout;
	int r;

	if (by_tokens == by_bytes) {
		snprintf(call->key, sizeof(call->key), "tokens");
		return admin__call_fail(call, ADMIN_E_BAD_ARGS,
					"give exactly one of tokens, bytes");
	}
	pages = by_tokens ? kvd_ops_pages_for_tokens(o, call->a.tokens)
			  : kvd_ops_pages_for_bytes(o, call->a.bytes);
	timeout = call->present & ADMIN_RESIZE_TIMEOUT
		? (uint32_t)call->a.timeout_ms : ADMIN_RESIZE_TIMEOUT_MS;
	r = kvd_ops_resize(o, pages, call->a.force, timeout, resize_done_cb,
			   call->c);
	if (r == KVD_E_CAPACITY) {
		struct kvd_capacity want;
		struct kvd_daemon *d = call->c->s->d;

		kvd_capacity_compute(&d->cfg, &d->hp, (uint32_t)pages, &want);
		return admin__call_fail(call, ADMIN_E_CAPACITY,
					"%llu pages hold %llu tokens; context %u"
					" x margin %g needs %llu (force to"
					" override)", (unsigned long long)pages,
					(unsigned long long)want.pool_tokens,
					want.context_length, want.margin,
					(unsigned long long)
						want.required_tokens);
	}
	if (r)
		return admin__call_fail(call, admin_code_of(r),
					"resize to %llu pages: %s",
					(unsigned long long)pages,
					kvd_ops_strerror(r));
	return ADMIN_PENDING;
}

static int cmd_capacity(struct admin_call *call)
{
	struct kvd_capacity cap;

	kvd_ops_capacity(call_ops(call), &cap);
	pack_capacity(frame_writer_packer(&call->res), call->c->s->d, &cap);
	return 0;
}

/* By the registry's id (`request`) or by the id the client was given
 * (`public_id`, "cmpl-..."): exactly one. */
static int cmd_abort(struct admin_call *call)
{
	bool by_id = call->present & ADMIN_ABORT_ID;
	uint64_t req = call->a.request;
	msgpack_packer *pk = frame_writer_packer(&call->res);
	int r;

	if (by_id == !!(call->present & ADMIN_ABORT_REQUEST)) {
		/* the key named is the one always accepted */
		snprintf(call->key, sizeof(call->key), "request");
		return admin__call_fail(call, ADMIN_E_BAD_ARGS,
					"abort takes exactly one of request and public_id");
	}
	r = by_id ? kvd_ops_abort_public(call_ops(call), call->a.public_id, &req)
		  : kvd_ops_abort(call_ops(call), req);
	if (r && by_id)
		/* the client's id is not echoed: the caller has it */
		return admin__call_fail(call, admin_code_of(r), "that id: %s",
					r == KVD_E_BUSY ? "already aborting"
							: kvd_ops_strerror(r));
	if (r)
		return admin__call_fail(call, admin_code_of(r),
					"request %llu: %s", (unsigned long long)req,
					r == KVD_E_BUSY ? "already aborting"
							: kvd_ops_strerror(r));
	msgpack_pack_map(pk, 1);
	frame_pack_kv_u64(pk, "request", req);
	return 0;
}

static int cmd_fault_load(struct admin_call *call)
{
	struct kvd_synth_spec sp = {
		.count = (uint32_t)call->a.count,
		.tokens = (uint32_t)call->a.tokens,
		.hold_ms = (uint32_t)call->a.hold_ms,
		.fence_ms = (uint32_t)call->a.fence_ms,
	};
	struct kvd_synth_result res;
	msgpack_packer *pk = frame_writer_packer(&call->res);
	int r = kvd_ops_synth_start(call_ops(call), &sp, &res);

	if (r)
		return admin__call_fail(call, admin_code_of(r),
					"synthetic load: %s",
					kvd_ops_strerror(r));
	msgpack_pack_map(pk, 5);
	frame_pack_kv_u64(pk, "admitted", res.admitted);
	frame_pack_kv_u64(pk, "rejected_draining", res.rejected_draining);
	frame_pack_kv_u64(pk, "rejected_full", res.rejected_full);
	frame_pack_kv_u64(pk, "first_id", res.first_id);
	frame_pack_kv_u64(pk, "last_id", res.last_id);
	return 0;
}

/* The Prometheus text (daemon/node/metrics.h), as the HTTP /metrics serves
 * it, in one string field. */
static int cmd_metrics(struct admin_call *call)
{
	msgpack_packer *pk = frame_writer_packer(&call->res);
	char *text;
	size_t len;

	if (kvd_metrics_render(call->c->s->d, &text, &len))
		return admin__call_fail(call, ADMIN_E_INTERNAL,
					"out of memory rendering the metrics");
	msgpack_pack_map(pk, 1);
	frame_pack_str(pk, "text");
	msgpack_pack_str(pk, len);
	msgpack_pack_str_body(pk, text, len);
	free(text);
	return 0;
}

/* The requests waiting at the tenant gate, tenant by tenant, oldest
 * first: at most ADMIN_QUEUE_MAX listed, `waiting` counts them all. */
#define ADMIN_QUEUE_MAX 256u

static int cmd_queue(struct admin_call *call)
{
	msgpack_packer *pk = frame_writer_packer(&call->res);
	struct kvd_waiting *w = calloc(ADMIN_QUEUE_MAX, sizeof(*w));
	uint32_t n, shown;

	if (!w)
		return admin__call_fail(call, ADMIN_E_INTERNAL, "out of memory");
	n = kvd_ops_waiting(call_ops(call), w, ADMIN_QUEUE_MAX);
	shown = KVD_MIN(n, ADMIN_QUEUE_MAX);
	msgpack_pack_map(pk, 2);
	frame_pack_kv_u64(pk, "waiting", n);
	frame_pack_str(pk, "requests");
	msgpack_pack_array(pk, shown);
	for (uint32_t i = 0; i < shown; i++) {
		msgpack_pack_map(pk, 7);
		frame_pack_kv_u64(pk, "request", w[i].id);
		frame_pack_kv_str(pk, "public_id", w[i].public_id);
		frame_pack_kv_str(pk, "tenant", w[i].tenant);
		frame_pack_kv_u64(pk, "prompt_tokens", w[i].prompt_tokens);
		frame_pack_kv_u64(pk, "max_tokens", w[i].max_tokens);
		frame_pack_kv_u64(pk, "waited_ms", w[i].waited_ms);
		frame_pack_kv_bool(pk, "held", w[i].held);
	}
	free(w);
	return 0;
}

/* The prefix cache: pages, held pages, and per tenant its pages, lookups,
 * hits, hit rate and evictions. enabled=false when cache.enabled is off. */
static int cmd_cache_status(struct admin_call *call)
{
	struct pcache *pc = call->c->s->d->cache;
	msgpack_packer *pk = frame_writer_packer(&call->res);
	struct pcache_tenant_stats *ts = NULL;
	uint32_t pages = 0, held = 0, n = 0;

	if (pc) {
		ts = calloc(PCACHE_TENANTS_MAX, sizeof(*ts));
		if (!ts)
			return admin__call_fail(call, ADMIN_E_INTERNAL, "out of memory");
		n = pcache_stats(pc, &pages, &held, ts, PCACHE_TENANTS_MAX);
	}
	msgpack_pack_map(pk, 4);
	frame_pack_kv_bool(pk, "enabled", pc != NULL);
	frame_pack_kv_u64(pk, "pages", pages);
	frame_pack_kv_u64(pk, "held", held);
	frame_pack_str(pk, "tenants");
	msgpack_pack_array(pk, n);
	for (uint32_t i = 0; i < n; i++) {
		msgpack_pack_map(pk, 7);
		frame_pack_kv_str(pk, "tenant", ts[i].tenant);
		frame_pack_kv_u64(pk, "pages", ts[i].pages);
		frame_pack_kv_u64(pk, "lookups", ts[i].lookups);
		frame_pack_kv_u64(pk, "hits", ts[i].hits);
		frame_pack_kv_u64(pk, "hit_tokens", ts[i].hit_tokens);
		frame_pack_kv_double(pk, "hit_rate", ts[i].lookups ?
				     (double)ts[i].hits / (double)ts[i].lookups : 0.0);
		frame_pack_kv_u64(pk, "evictions", ts[i].evictions);
	}
	free(ts);
	return 0;
}

static int cmd_cache_flush(struct admin_call *call)
{
	msgpack_packer *pk = frame_writer_packer(&call->res);
	uint32_t evicted;
	int r = kvd_ops_cache_flush(call_ops(call), call->a.tenant, &evicted);

	if (r)
		return admin__call_fail(call, admin_code_of(r),
					"cache flush: the prefix cache is off (cache.enabled)");
	msgpack_pack_map(pk, 2);
	frame_pack_kv_str(pk, "tenant", call->a.tenant[0] ? call->a.tenant : "*");
	frame_pack_kv_u64(pk, "evicted", evicted);
	return 0;
}

/* ---- the table ---------------------------------------------------------------- */

static const struct admin_cmd admin_cmds[] = {
	{ "status", cmd_status, NULL, ADMIN_PRIV_MEMBER, false },
	{ "drain", cmd_drain, &admin_args_schemas[ADMIN_ARGS_DRAIN],
	  ADMIN_PRIV_MEMBER, false },
	{ "resume", cmd_resume, NULL, ADMIN_PRIV_MEMBER, false },
	{ "pool.resize", cmd_pool_resize,
	  &admin_args_schemas[ADMIN_ARGS_RESIZE], ADMIN_PRIV_MEMBER, false },
	{ "capacity", cmd_capacity, NULL, ADMIN_PRIV_MEMBER, false },
	{ "metrics", cmd_metrics, NULL, ADMIN_PRIV_MEMBER, false },
	{ "abort", cmd_abort, &admin_args_schemas[ADMIN_ARGS_ABORT],
	  ADMIN_PRIV_MEMBER, false },
	{ "queue", cmd_queue, NULL, ADMIN_PRIV_MEMBER, false },
	{ "cache.status", cmd_cache_status, NULL, ADMIN_PRIV_MEMBER, false },
	{ "cache.flush", cmd_cache_flush,
	  &admin_args_schemas[ADMIN_ARGS_CACHE_FLUSH], ADMIN_PRIV_MEMBER, false },
	{ "fault.load", cmd_fault_load, &admin_args_schemas[ADMIN_ARGS_LOAD],
	  ADMIN_PRIV_ROOT, true },
};

const struct admin_cmd *admin__cmd_find(const msgpack_object *name)
{
	for (size_t i = 0; i < KVD_ARRAY_SIZE(admin_cmds); i++) {
		if (admin_cmds[i].fault_only && !KVD_FAULT_POINTS)
			continue;
		if (frame_obj_streq(name, admin_cmds[i].name))
			return &admin_cmds[i];
	}
	return NULL;
}
