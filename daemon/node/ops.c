/* ops.c - operator actions on a running node: status, drain, resize,
 * capacity, abort, and synthetic load for tests.
 *
 * Drain is a state machine on d->state shared with the SIGTERM path in
 * daemon.c: drain moves READY to DRAINING, and the registry's last
 * kvd_request_end() moves DRAINING to DRAINED through
 * kvd_daemon_in_flight_changed(). Admission (kvd_request_gate) admits only
 * in READY, so a draining node admits nothing new and loses nothing that
 * is in flight. Resume is refused once SIGTERM asked the node to stop.
 * A drain is bounded: after node.drain_timeout_ms the daemon aborts what
 * is still in flight through each request's normal failure path
 * (kvd_daemon_drain_arm), and the drain completes once they are terminal.
 *
 * Resize works on "live" pages: the pool's pages minus those already
 * marked retiring. Growing is immediate. Shrinking asks the pool to retire
 * pages: free ones retire at once, pages in use (or fenced, waiting for a
 * remote writer) are marked and retire when released, so a shrink never
 * takes a page from under its owner (invariant 2). The resize then polls
 * the pool every RESIZE_POLL_MS until nothing is retiring or the timeout
 * passes, re-runs the capacity check (which logs event=kv_capacity with
 * reason=resize and counts only non-retiring pages) and reports. A target
 * below what the capacity check requires is refused unless forced: the
 * boot check is an invariant, not a suggestion.
 *
 * Synthetic requests (fault points only) go through the same gate and the
 * same registry as real ones. Each reserves pages all-or-nothing, fills
 * and tags them like a local writer, optionally holds a fence (as an
 * in-flight transfer would), and releases at hold_ms. If the fence outlives
 * the hold, the release is deferred by the pool until the unfence: the
 * request is terminal, its pages are not free yet.
 */
#include "daemon/node/ops.h"
#include "conf/util.h"
#include "gpu/kv/pcache.h"
#include "kvd_build.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define RESIZE_POLL_MS 10

struct kvd_synth {
	struct kvd_request req;
	struct kvd_ops *o;
	uv_timer_t timer;
	struct kvpool_ref *table;     /* (n_pages) the request's page table */
	uint32_t n_pages;
	uint64_t unfence_at_ns;       /* 0: no fence held */
	uint64_t release_at_ns;       /* 0: released (request terminal) */
	struct kvd_list link;         /* in o->synth */
};

static const char *const ops_error_names[] = {
	[KVD_E_CAPACITY] = "capacity",
	[KVD_E_MODEL] = "model",
	[KVD_E_DRAINING] = "draining",
	[KVD_E_BUSY] = "busy",
	[KVD_E_NOTFOUND] = "not_found",
	[KVD_OPS_E_STATE] = "wrong_state",
	[KVD_OPS_E_RANGE] = "out_of_range",
	[KVD_OPS_E_TIMEOUT] = "timeout",
	[KVD_OPS_E_FULL] = "pool_full",
	[KVD_OPS_E_UNSUPPORTED] = "unsupported",
};

const char *kvd_ops_strerror(int code)
{
	if (code < 0)
		return "system";
	if (code == 0 || code >= (int)KVD_ARRAY_SIZE(ops_error_names) ||
	    !ops_error_names[code])
		return "?";
	return ops_error_names[code];
}

int kvd_ops_init(struct kvd_ops *o, struct kvd_daemon *d)
{
	int r;

	memset(o, 0, sizeof(*o));
	o->d = d;
	o->requests = kvd_daemon_requests(d);
	kvd_list_init(&o->synth);
	r = uv_timer_init(&d->loop, &o->resize_timer);
	if (r < 0)
		return r;
	o->resize_timer.data = o;
	o->open = true;
	return 0;
}

void kvd_ops_status(struct kvd_ops *o, struct kvd_status *st)
{
	struct kvd_daemon *d = o->d;

	memset(st, 0, sizeof(*st));
	st->role = d->cfg.role;
	st->state = d->state;
	st->uptime_ms = (kvd_now_ns() - d->start_ns) / 1000000u;
	if (d->pool)
		kvpool_get_stats(d->pool, &st->pool);
	if (d->cache)
		pcache_stats(d->cache, NULL, &st->cached_held, NULL, 0);
	st->cap = d->cap;
	st->in_flight = d->in_flight;
	st->peers = d->peers.up;
	st->requests = o->requests->n;
	st->waiting = kvd_ops_waiting(o, NULL, 0);
	st->counters = d->counters;
	st->resizing = o->resizing;
	st->synthetic = o->n_synth;
}

/* ---- drain ---------------------------------------------------------------- */

int kvd_ops_drain(struct kvd_ops *o)
{
	struct kvd_daemon *d = o->d;

	if (d->state == KVD_STATE_DRAINING || d->state == KVD_STATE_DRAINED)
		return 0;
	if (d->state != KVD_STATE_READY)
		return KVD_OPS_E_STATE;
	d->state = KVD_STATE_DRAINING;
	KVLOG_INFO(&d->log, "draining", "source=admin in_flight=%u",
		   d->in_flight);
	kvd_daemon_notify_status(d, "draining: %u in flight", d->in_flight);
	kvd_daemon_drain_arm(d);
	kvd_daemon_in_flight_changed(d);
	return 0;
}

int kvd_ops_resume(struct kvd_ops *o)
{
	struct kvd_daemon *d = o->d;

	if (d->state == KVD_STATE_READY)
		return 0;
	if (d->stop_after_drain ||
	    (d->state != KVD_STATE_DRAINING && d->state != KVD_STATE_DRAINED))
		return KVD_OPS_E_STATE;
	kvd_daemon_drain_disarm(d);
	d->state = KVD_STATE_READY;
	KVLOG_INFO(&d->log, "resumed", "source=admin in_flight=%u",
		   d->in_flight);
	kvd_daemon_notify_status(d, "ready (resumed)");
	return 0;
}

/* ---- resize ---------------------------------------------------------------- */

static uint32_t ops_live_pages(struct kvd_ops *o)
{
	struct kvpool_stats st;

	kvpool_get_stats(o->d->pool, &st);
	return st.pages - st.retiring;
}

uint64_t kvd_ops_pages_for_tokens(struct kvd_ops *o, uint64_t tokens)
{
	uint64_t pt = kvpool_geom(o->d->pool)->page_tokens;

	return tokens / pt + (tokens % pt != 0);
}

uint64_t kvd_ops_pages_for_bytes(struct kvd_ops *o, uint64_t bytes)
{
	uint64_t pb = kvpool_page_bytes(kvpool_geom(o->d->pool));

	return pb ? bytes / pb : 0;
}

static void resize_finish(struct kvd_ops *o, uint32_t retiring)
{
	kvd_resize_cb cb = o->resize_cb;
	void *arg = o->resize_arg;

	o->resize.retiring_left = retiring;
	o->resize.code = retiring ? KVD_OPS_E_TIMEOUT : 0;
	o->resize.waited_ms = (kvd_now_ns() - o->resize_start_ns) / 1000000u;
	kvd_daemon_capacity(o->d, "resize", &o->resize.cap);
	o->resize.pages_after = o->resize.cap.pages;
	KVLOG(&o->d->log, retiring ? KVLOG_WARN : KVLOG_INFO, "kv_pool_resized",
	      "pages_before=%u pages_after=%u retired_now=%u retiring=%u"
	      " waited_ms=%llu result=%s", o->resize.pages_before,
	      o->resize.pages_after, o->resize.retired_now, retiring,
	      (unsigned long long)o->resize.waited_ms,
	      retiring ? "timeout" : "ok");
	o->resizing = false;
	o->resize_cb = NULL;
	o->resize_arg = NULL;
	if (cb)
		cb(arg, &o->resize);
}

static void resize_tick(uv_timer_t *t)
{
	struct kvd_ops *o = t->data;
	struct kvpool_stats st;

	kvpool_get_stats(o->d->pool, &st);
	if (st.retiring == 0 || kvd_now_ns() >= o->resize_deadline_ns) {
		resize_finish(o, st.retiring);
		return;
	}
	uv_timer_start(&o->resize_timer, resize_tick, RESIZE_POLL_MS, 0);
}

int kvd_ops_resize(struct kvd_ops *o, uint64_t pages, bool force,
		   uint32_t timeout_ms, kvd_resize_cb cb, void *arg)
{
	struct kvd_daemon *d = o->d;
	struct kvd_capacity want;
	uint32_t live, now = 0;
	int r = 0;

	if (!o->open || !d->pool)
		return KVD_OPS_E_STATE;
	if (o->resizing)
		return KVD_E_BUSY;
	if (pages == 0 || pages > UINT32_MAX)
		return KVD_OPS_E_RANGE;
	kvd_capacity_compute(&d->cfg, &d->hp, (uint32_t)pages, &want);
	if (!want.ok && !force)
		return KVD_E_CAPACITY;
	live = ops_live_pages(o);
	KVLOG_INFO(&d->log, "kv_pool_resize",
		   "pages_before=%u pages_target=%llu tokens_target=%llu force=%d",
		   live, (unsigned long long)pages,
		   (unsigned long long)want.pool_tokens, force);
	/* A shrink waits for retiring pages, and a cached page leaves only
	 * when the cache lets go: the cache empties first (pages a request
	 * maps go at its end). */
	if (pages < live && d->cache) {
		uint32_t ev = pcache_flush(d->cache, NULL);

		KVLOG_INFO(&d->log, "cache_flush", "tenant=%s evicted_pages=%u source=resize",
			   KVLOG_Q("*"), ev);
	}
	if (pages > live)
		r = kvpool_grow(d->pool, (uint32_t)(pages - live));
	else if (pages < live)
		r = kvpool_shrink(d->pool, live - (uint32_t)pages, &now);
	if (r) {
		KVLOG_ERR(&d->log, "kv_pool_resize_failed",
			  "pages_before=%u pages_target=%llu code=%d", live,
			  (unsigned long long)pages, r);
		return r < 0 ? r : KVD_OPS_E_RANGE;
	}
	memset(&o->resize, 0, sizeof(o->resize));
	o->resize.pages_before = live;
	o->resize.retired_now = now;
	o->resizing = true;
	o->resize_cb = cb;
	o->resize_arg = arg;
	o->resize_start_ns = kvd_now_ns();
	o->resize_deadline_ns = o->resize_start_ns +
				(uint64_t)timeout_ms * 1000000u;
	/* Report from the loop, never from within this call. */
	uv_timer_start(&o->resize_timer, resize_tick, 0, 0);
	return 0;
}

void kvd_ops_resize_detach(struct kvd_ops *o, void *arg)
{
	if (o->resize_arg == arg) {
		o->resize_cb = NULL;
		o->resize_arg = NULL;
	}
}

/* ---- capacity, abort ------------------------------------------------------ */

void kvd_ops_capacity(struct kvd_ops *o, struct kvd_capacity *cap)
{
	kvd_daemon_capacity(o->d, "admin", cap);
}

int kvd_ops_abort(struct kvd_ops *o, uint64_t id)
{
	struct kvd_request *q = kvd_reqtab_find(o->requests, id);
	char tenant[64];
	int r;

	/* copied first: an abort may end the request and free its memory */
	snprintf(tenant, sizeof(tenant), "%s", q && q->tenant ? q->tenant : "-");
	if (!q && o->d->queue.abort) {
		r = o->d->queue.abort(o->d->queue.arg, &id, NULL);
		KVLOG(&o->d->log, r ? KVLOG_WARN : KVLOG_INFO, "request_abort",
		      "id=%llu source=admin state=waiting result=%s",
		      (unsigned long long)id, r ? kvd_ops_strerror(r) : "ok");
		return r;
	}
	r = kvd_reqtab_abort(o->requests, id, "admin");
	KVLOG(&o->d->log, r ? KVLOG_WARN : KVLOG_INFO, "request_abort",
	      "id=%llu tenant=%s source=admin result=%s", (unsigned long long)id,
	      KVLOG_Q(tenant), r ? kvd_ops_strerror(r) : "ok");
	return r;
}

int kvd_ops_abort_public(struct kvd_ops *o, const char *pid, uint64_t *id)
{
	struct kvd_request *q = kvd_reqtab_find_public(o->requests, pid);

	*id = 0;
	if (!q && o->d->queue.abort && pid && *pid &&
	    o->d->queue.abort(o->d->queue.arg, id, pid) == 0) {
		KVLOG_INFO(&o->d->log, "request_abort",
			   "id=%llu public_id=%s source=admin state=waiting result=ok",
			   (unsigned long long)*id, KVLOG_Q(pid));
		return 0;
	}
	if (!q) {
		KVLOG_WARN(&o->d->log, "request_abort",
			   "public_id=%s source=admin result=%s", KVLOG_Q(pid),
			   kvd_ops_strerror(KVD_E_NOTFOUND));
		return KVD_E_NOTFOUND;
	}
	*id = q->id;
	return kvd_ops_abort(o, q->id);
}

uint32_t kvd_ops_waiting(struct kvd_ops *o, struct kvd_waiting *out,
			 uint32_t max)
{
	const struct kvd_queue_hook *h = &o->d->queue;

	return h->waiting ? h->waiting(h->arg, out, max) : 0;
}

int kvd_ops_cache_flush(struct kvd_ops *o, const char *tenant,
			uint32_t *evicted)
{
	const char *t = tenant && tenant[0] ? tenant : NULL;

	*evicted = 0;
	if (!o->d->cache)
		return KVD_OPS_E_STATE;
	*evicted = pcache_flush(o->d->cache, t);
	KVLOG_INFO(&o->d->log, "cache_flush", "tenant=%s evicted_pages=%u source=admin",
		   KVLOG_Q(t ? t : "*"), *evicted);
	return 0;
}

/* ---- synthetic load -------------------------------------------------------- */

static void synth_closed_cb(uv_handle_t *h)
{
	struct kvd_synth *s = h->data;

	free(s->table);
	free(s);
}

static void synth_unlink(struct kvd_synth *s)
{
	kvd_list_del(&s->link);
	s->o->n_synth--;
}

/* Release the pages (fenced ones stay out of the free list until their
 * unfence) and make the request terminal. Returns true when the request
 * was live. */
static bool synth_release(struct kvd_synth *s)
{
	struct kvd_ops *o = s->o;

	if (!s->release_at_ns)
		return false;
	s->release_at_ns = 0;
	kvpool_release(o->d->pool, s->req.id, s->table, s->n_pages);
	return true;
}

static void synth_tick(uv_timer_t *t);

/* Arm the timer for the next event (unfence or release), or retire the
 * synth when none is left. Callers end the request (kvd_request_end)
 * *after* this, since ending may stop the daemon. */
static void synth_arm(struct kvd_synth *s)
{
	uint64_t next = 0, now = kvd_now_ns();

	if (s->unfence_at_ns)
		next = s->unfence_at_ns;
	if (s->release_at_ns && (!next || s->release_at_ns < next))
		next = s->release_at_ns;
	if (!next) {
		synth_unlink(s);
		uv_close((uv_handle_t *)&s->timer, synth_closed_cb);
		return;
	}
	uv_timer_start(&s->timer, synth_tick,
		       next > now ? (next - now + 999999) / 1000000u : 0, 0);
}

static void synth_tick(uv_timer_t *t)
{
	struct kvd_synth *s = t->data;
	struct kvd_ops *o = s->o;
	uint64_t now = kvd_now_ns();
	bool ended = false;

	if (s->unfence_at_ns && now >= s->unfence_at_ns) {
		s->unfence_at_ns = 0;
		kvpool_unfence(o->d->pool, s->req.id, s->table, s->n_pages);
	}
	if (s->release_at_ns && now >= s->release_at_ns)
		ended = synth_release(s);
	synth_arm(s);
	if (ended)
		kvd_request_end(o->requests, &s->req, true);
}

static int synth_abort(struct kvd_request *r, const char *reason)
{
	struct kvd_synth *s = kvd_container_of(r, struct kvd_synth, req);
	struct kvd_ops *o = s->o;
	bool ended;

	(void)reason;
	ended = synth_release(s);
	synth_arm(s);
	if (ended)
		kvd_request_end(o->requests, r, false);
	return 0;
}

static const struct kvd_request_ops synth_request_ops = {
	.kind = "synthetic",
	.abort = synth_abort,
};

/* Reserve, fill and tag like a local writer; fence like a transfer. */
static int synth_admit_one(struct kvd_ops *o, const struct kvd_synth_spec *sp,
			   struct kvd_synth_result *res)
{
	struct kvd_daemon *d = o->d;
	struct kvd_synth *s;
	uint32_t n = kvpool_pages_for(d->pool, sp->tokens);
	uint64_t now;
	int r;

	if (kvd_request_gate(o->requests)) {
		d->counters.rejected[KVD_REJECT_DRAINING]++;
		res->rejected_draining++;
		return 0;
	}
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->table = calloc(n, sizeof(*s->table));
	if (!s->table) {
		free(s);
		return -ENOMEM;
	}
	s->o = o;
	s->n_pages = n;
	/* its registry id now: the pool needs the owner first */
	s->req.id = kvd_reqtab_new_id(o->requests);
	r = kvpool_reserve(d->pool, s->req.id, n, s->table);
	if (r == 0)
		r = kvpool_fill_begin(d->pool, s->req.id, s->table, n);
	if (r == 0)
		r = kvpool_tag_write(d->pool, s->req.id, s->table, n, sp->tokens);
	if (r == 0)
		r = kvpool_mark_ready(d->pool, s->req.id, s->table, n, sp->tokens);
	if (r == 0 && sp->fence_ms)
		r = kvpool_fence(d->pool, s->req.id, s->table, n);
	if (r) {
		if (r != KVPOOL_E_FULL)
			kvpool_release(d->pool, s->req.id, s->table, n);
		free(s->table);
		free(s);
		if (r != KVPOOL_E_FULL)
			return r < 0 ? r : KVD_OPS_E_STATE;
		d->counters.rejected[KVD_REJECT_OVERLOADED]++;
		res->rejected_full++;
		return 0;
	}
	kvd_request_register(o->requests, &s->req, &synth_request_ops);
	s->req.tokens = sp->tokens;
	s->req.pages = n;
	uv_timer_init(&d->loop, &s->timer);
	s->timer.data = s;
	now = kvd_now_ns();
	s->release_at_ns = now + (uint64_t)sp->hold_ms * 1000000u + 1;
	s->unfence_at_ns = sp->fence_ms ?
			   now + (uint64_t)sp->fence_ms * 1000000u + 1 : 0;
	kvd_list_add(&o->synth, &s->link);
	o->n_synth++;
	if (!res->admitted)
		res->first_id = s->req.id;
	res->last_id = s->req.id;
	res->admitted++;
	synth_arm(s);
	return 0;
}

int kvd_ops_synth_start(struct kvd_ops *o, const struct kvd_synth_spec *spec,
			struct kvd_synth_result *res)
{
	int r = 0;

	memset(res, 0, sizeof(*res));
	if (!KVD_FAULT_POINTS)
		return KVD_OPS_E_UNSUPPORTED;
	if (!o->open || !o->d->pool)
		return KVD_OPS_E_STATE;
	if (spec->count == 0 || spec->count > 100000 || spec->tokens == 0 ||
	    spec->tokens > (1u << 24) || spec->hold_ms > 600000 ||
	    spec->fence_ms > 600000)
		return KVD_OPS_E_RANGE;
	for (uint32_t i = 0; i < spec->count && r == 0; i++)
		r = synth_admit_one(o, spec, res);
	KVLOG_INFO(&o->d->log, "fault_synthetic_load",
		   "admitted=%u rejected_draining=%u rejected_full=%u tokens=%u"
		   " hold_ms=%u fence_ms=%u", res->admitted,
		   res->rejected_draining, res->rejected_full, spec->tokens,
		   spec->hold_ms, spec->fence_ms);
	return r;
}

/* ---- close ------------------------------------------------------------------ */

static void ops_resize_closed_cb(uv_handle_t *h)
{
	struct kvd_ops *o = h->data;

	if (o->close_done)
		o->close_done(o);
}

void kvd_ops_close(struct kvd_ops *o, void (*done)(struct kvd_ops *o))
{
	if (!o->open)
		return;
	o->open = false;
	/* End every synthetic request: unfence (nothing really writes into
	 * these pages), release, close the timer. */
	while (!kvd_list_empty(&o->synth)) {
		struct kvd_synth *s = kvd_list_entry(o->synth.next,
						     struct kvd_synth, link);
		bool ended;

		if (s->unfence_at_ns) {
			s->unfence_at_ns = 0;
			kvpool_unfence(o->d->pool, s->req.id, s->table,
				       s->n_pages);
		}
		ended = synth_release(s);
		uv_timer_stop(&s->timer);
		synth_unlink(s);
		uv_close((uv_handle_t *)&s->timer, synth_closed_cb);
		if (ended)
			kvd_request_end(o->requests, &s->req, false);
	}
	/* A pending resize never reports; the pool keeps what it did. */
	o->resizing = false;
	o->resize_cb = NULL;
	/* libuv closes in order: the synth timers' close callbacks run
	 * before this one, so `done` is the last word. */
	o->resize_arg = NULL;
	o->close_done = done;
	uv_close((uv_handle_t *)&o->resize_timer, ops_resize_closed_cb);
}
