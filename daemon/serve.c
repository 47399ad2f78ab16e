/* serve.c - the serving layer's skeleton: setup, the bridge to the
 * compute thread, request lifetime, teardown.
 *
 * Design. The loop thread owns every socket, every request struct and
 * every decision; one compute thread (daemon/compute.c) owns the engine
 * and knows requests only by their id. The loop never calls an engine
 * function and the thread never touches a socket or a request struct.
 * The pool is shared (its calls lock), but page *bytes* are only touched
 * by the request that holds them: the engine while a request computes,
 * the loop while KV is being sent or received.
 *
 * A request's end never needs memory on the thread: compute.c allocates
 * its SUBMITTED and DONE messages with its submit job, and the request
 * takes its free job (with the FREED message) at creation, loop side,
 * where a failure is answered at once. A message for an id that is no
 * longer registered is dropped here (serve_compute_deliver).
 *
 * Pages lent to the engine (decode's transferred KV) are released by the
 * compute thread right after engine_req_free, in the same free job, so
 * no window exists in which the pool could hand them out while the
 * engine still reads them (invariant 2).
 *
 * A request is terminal exactly once (serve__req_end): it leaves the
 * registry (drain and status see it go), and its memory is freed in its
 * timer's close callback, after which no callback can name it.
 */
#include "daemon/serve.h"
#include "daemon/serve_int.h"
#include "conf/util.h"
#include "conf/keyfile.h"

#include <assert.h>
#include <errno.h>
#include <sodium.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <string.h>

/* ---- writing frames -------------------------------------------------------- */

struct serve_write {
	uv_write_t req;
	char *data;
};

static void serve_write_cb(uv_write_t *req, int status)
{
	struct serve_write *w = kvd_container_of(req, struct serve_write, req);

	(void)status;
	free(w->data);
	free(w);
}

/* Queue data (malloc'd, consumed in every case). */
int serve__write(uv_stream_t *st, char *data, size_t len)
{
	struct serve_write *w;
	uv_buf_t buf;
	int r;

	if (uv_is_closing((uv_handle_t *)st) || !uv_is_writable(st)) {
		free(data);
		return -EPIPE;
	}
	w = malloc(sizeof(*w));
	if (!w) {
		free(data);
		return -ENOMEM;
	}
	w->data = data;
	buf = uv_buf_init(data, (unsigned)len);
	r = uv_write(&w->req, st, &buf, 1, serve_write_cb);
	if (r) {
		free(data);
		free(w);
	}
	return r;
}

int serve__peer_frame(struct peer_aead *tx, const struct proto_peer_msg *m,
		      char **data, size_t *len)
{
	int r = proto_peer_frame(m, data, len);

	if (r)
		return r > 0 ? -EMSGSIZE : r;
	if (tx) {
		r = peer_frame_seal(tx, data, len);
		if (r) {
			free(*data);
			*data = NULL;
			return r;
		}
	}
	return 0;
}

void serve__figures_add(struct kvd_peer_figures *pf,
			const struct proto_peer_hello *h)
{
	pf->min_pool_tokens = pf->up ? KVD_MIN(pf->min_pool_tokens, h->pool_tokens)
				     : h->pool_tokens;
	pf->min_context = pf->up ? KVD_MIN(pf->min_context, (uint32_t)h->context)
				 : (uint32_t)h->context;
	pf->up++;
}

int serve__link_send(struct wbound *wb, bool *dead, struct peer_aead *tx,
		     const struct proto_peer_msg *m)
{
	char *data;
	size_t len;
	int rc;

	if (*dead)
		return -EPIPE;
	rc = serve__peer_frame(tx, m, &data, &len);
	if (rc)
		return rc;
	rc = wbound_write(wb, data, len);
	if (rc == WBOUND_E_HARD) {
		*dead = true;
		wbound_read_stop(wb);
		return -EPIPE;
	}
	return rc;
}

const char *serve__link_write_poll(struct serve *s, struct wbound *wb, bool dead,
				   uint64_t now, uint64_t *last_heard_ns,
				   const char *who)
{
	int rc = dead ? WBOUND_E_HARD : wbound_poll(wb, now);

	if (!rc) {
		/* not reading it (past soft): its silence is ours, and the
		 * stall bound, not liveness, decides how long it may last */
		if (wb->paused)
			*last_heard_ns = now;
		return NULL;
	}
	KVLOG_WARN(s->log, "write_bound",
		   "peer=%s conn=peer_control reason=%s queued=%zu peak=%llu soft=%llu hard=%llu stall_ms=%u",
		   KVLOG_Q(who), rc == WBOUND_E_HARD ? "hard" : "stall",
		   wbound_queued(wb), (unsigned long long)wb->peak,
		   (unsigned long long)wb->lim.soft,
		   (unsigned long long)wb->lim.hard, wb->lim.stall_ms);
	return rc == WBOUND_E_HARD ? "control write queue past its hard bound" :
				     "control write queue stalled past its soft bound";
}

int serve__send_peer(uv_stream_t *st, struct peer_aead *tx,
		     const struct proto_peer_msg *m)
{
	char *data;
	size_t len;
	int r;

	if (uv_is_closing((uv_handle_t *)st))
		return -EPIPE;   /* never spend a counter on a dead link */
	r = serve__peer_frame(tx, m, &data, &len);
	if (r)
		return r;
	return serve__write(st, data, len);
}

/* ---- refusing a connection at accept ------------------------------------------- */

struct serve_drop {
	union {
		uv_tcp_t tcp;
		uv_pipe_t pipe;
		uv_handle_t handle;
		uv_stream_t stream;
	} h;
	struct serve *s;
};

static void serve_drop_closed(uv_handle_t *h)
{
	struct serve_drop *d = h->data;

	d->s->closes_pending--;
	free(d);
}

/* libuv has already accept(2)ed the connection it reports, and stops
 * polling a listener whose callback leaves it unaccepted; so a refused
 * connection is accepted into a small handle and closed at once. */
void serve__accept_drop(struct serve *s, uv_stream_t *server)
{
	struct serve_drop *d = malloc(sizeof(*d));
	int rc = -ENOMEM;

	if (d) {
		d->s = s;
		rc = server->type == UV_NAMED_PIPE ? uv_pipe_init(&s->d->loop, &d->h.pipe, 0)
						   : uv_tcp_init(&s->d->loop, &d->h.tcp);
		if (rc)
			free(d);
	}
	if (rc) {
		/* no memory even for that: close the descriptor libuv holds
		 * for us (accepted_fd, in uv.h's unix stream fields) */
		if (server->accepted_fd >= 0) {
			close(server->accepted_fd);
			server->accepted_fd = -1;
		}
		return;
	}
	d->h.handle.data = d;
	(void)uv_accept(server, &d->h.stream);
	s->closes_pending++;
	uv_close(&d->h.handle, serve_drop_closed);
}

/* ---- requests -------------------------------------------------------------- */

struct serve_req *serve__req_new(struct serve *s, enum serve_req_kind kind)
{
	struct serve_req *r = calloc(1, sizeof(*r));

	if (!r)
		return NULL;
	r->s = s;
	r->kind = kind;
	r->t_arrive_ns = kvd_now_ns();
	r->free_job = compute_free_job_new();
	if (!r->free_job || uv_timer_init(&s->d->loop, &r->timer)) {
		compute_job_free(r->free_job);
		free(r);
		return NULL;
	}
	r->timer.data = r;
	r->next = s->reqs;
	if (s->reqs)
		s->reqs->prev = r;
	s->reqs = r;
	s->n_reqs++;
	return r;
}

static int serve_req_abort(struct kvd_request *reg, const char *reason);

static const struct kvd_request_ops serve_req_ops[] = {
	[SREQ_LOCAL] = { "generate", serve_req_abort },
	[SREQ_DECODE] = { "decode", serve_req_abort },
	[SREQ_PREFILL] = { "prefill", serve_req_abort },
};

/* The registry is the node's (daemon/ops.c's synthetic requests are in
 * it too): only an entry whose ops are one of ours is a serve_req. */
static bool serve_req_ops_ours(const struct kvd_request_ops *ops)
{
	for (size_t k = SREQ_LOCAL; k < KVD_ARRAY_SIZE(serve_req_ops); k++)
		if (ops == &serve_req_ops[k])
			return true;
	return false;
}

struct serve_req *serve__req_find(struct serve *s, uint64_t id)
{
	struct kvd_request *reg = kvd_reqtab_find(s->reqtab, id);
	struct serve_req *r;

	if (!reg || !serve_req_ops_ours(reg->ops))
		return NULL;
	r = kvd_container_of(reg, struct serve_req, reg);
	assert(r->s == s && r->registered);
	return r->ended ? NULL : r;
}

void serve__req_register(struct serve_req *r)
{
	kvd_request_register(r->s->reqtab, &r->reg, &serve_req_ops[r->kind]);
	r->registered = true;
}

static void serve_req_free_cb(uv_handle_t *h)
{
	struct serve_req *r = h->data;
	struct serve *s = r->s;

	if (r->dt_init)
		detok_deinit(&r->dt);
	compute_job_free(r->free_job);
	free(r->prompt);
	free(r->table);
	free(r->rx.got);
	free(r->dst);
	free(r->src);
	free(r);
	s->closes_pending--;
}

void serve__req_end(struct serve_req *r, bool ok)
{
	struct serve *s = r->s;

	if (r->ended)
		return;
	r->ended = true;
	r->state = SRS_DEAD;
	serve__client_detach(r);
	if (r->prev)
		r->prev->next = r->next;
	else
		s->reqs = r->next;
	if (r->next)
		r->next->prev = r->prev;
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

/* kvctl abort ID: the normal failure path of each kind. */
static int serve_req_abort(struct kvd_request *reg, const char *reason)
{
	struct serve_req *r = kvd_container_of(reg, struct serve_req, reg);

	if (r->kind == SREQ_PREFILL) {
		serve__prefill_abort(r, reason);
		return 0;
	}
	if (r->kind == SREQ_DECODE && r->state == SRS_TRANSFER) {
		/* stop the transfer: abort handshake, pages fenced until
		 * prefill's ack (invariant 7) */
		serve__decode_abort(r, reason);
		return 0;
	}
	/* computing (or already failing): stop streaming, free, and end
	 * as failed, not ok */
	if (!r->fail_code)
		r->fail_code = PROTO_ERR_INTERNAL;
	serve__client_error(r, PROTO_ERR_INTERNAL, "aborted by the operator: %s",
			    reason);
	serve__req_orphan(r);
	return 0;
}

const char *serve__peer_feed(struct serve *s, const char *who,
			     struct frame_decoder *dec, const char *q, size_t n,
			     const bool *closing,
			     void (*on_msg)(void *arg, struct proto_peer_msg *m),
			     void *arg)
{
	while (n > 0 && !*closing) {
		size_t used;
		int rc = frame_decoder_feed(dec, q, n, &used);

		if (rc)
			return "control stream error";
		q += used;
		n -= used;
		for (;;) {
			const msgpack_object *map;
			struct proto_peer_msg m;
			struct frame_error err = { 0 };

			rc = frame_decoder_next(dec, &map);
			if (rc == FRAME_E_AGAIN)
				break;
			if (rc == 0)
				rc = proto_peer_parse(map, &m, &err);
			if (rc) {
				KVLOG_ERR(s->log, "peer_protocol", "peer=%s code=%s msg=%s",
					  KVLOG_Q(who), frame_strerror(rc),
					  KVLOG_Q(err.msg));
				return "protocol error";
			}
			on_msg(arg, &m);
			proto_peer_msg_deinit(&m);
			if (*closing)
				return NULL;
		}
	}
	return NULL;
}

uint64_t serve__own_limit(struct serve *s)
{
	uint64_t lim = s->d->cap.advertised_context;

	return KVD_MIN(lim, s->d->cap.pool_tokens);
}

/* ---- the compute thread (daemon/compute.c) ------------------------------------- */

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
	int rc;

	rc = compute_submit(&s->comp, r->reg.id, &rp, prompt, n_prompt, table,
			    n_table, nomem);
	if (rc)
		return rc;
	r->submit_pending = true;
	r->in_engine = true;
	return 0;
}

void serve__compute_free(struct serve *s, struct serve_req *r,
			 bool release_table, bool quarantine)
{
	struct compute_job *j = r->free_job;
	struct kvpool_ref *release = NULL;
	uint32_t n_release = 0;

	r->state = SRS_FREEING;
	if (!j)
		return;   /* queued already: its FREED ends r */
	r->free_job = NULL;
	if (release_table && r->table && r->n_table) {
		release = r->table;
		n_release = r->n_table;
		r->table = NULL;
	}
	compute_free(&s->comp, j, r->reg.id, r->ereq, release, n_release,
		     quarantine);
	r->ereq = NULL;
	r->in_engine = false;
}

/* Loop: one message of the compute thread, for the request it names (a
 * request that ended already hears nothing more). */
static void serve_compute_deliver(void *arg, struct compute_msg *m)
{
	struct serve *s = arg;
	struct serve_req *r = serve__req_find(s, m->owner);

	if (!r)
		return;
	if (m->kind == COMPUTE_MSG_SUBMITTED) {
		r->submit_pending = false;
		r->ereq = m->req;
		if (m->error)
			r->in_engine = false;
	}
	if (r->kind == SREQ_PREFILL)
		serve__prefill_engine_msg(r, m);
	else
		serve__client_engine_msg(r, m);
}

static int serve_compute_start(struct serve *s)
{
	struct engine_params ep = ENGINE_PARAMS_DEFAULT;
	int r;

	ep.threads = s->d->cfg.threads;
	if (!ep.threads) {
		long n = sysconf(_SC_NPROCESSORS_ONLN);

		ep.threads = n > 0 ? (uint32_t)n : 1;
	}
	ep.max_batch = s->d->cfg.max_batch ? s->d->cfg.max_batch : 16;
	ep.n_ctx = s->d->cap.advertised_context;
	r = compute_start(&s->comp, &s->d->loop, s->model, s->d->pool, &ep,
			  s->log, serve_compute_deliver, s);
	return r > 0 ? KVD_E_MODEL : r;
}

/* ---- lifetime -------------------------------------------------------------- */

static void serve_handle_closed(uv_handle_t *h)
{
	struct serve *s = h->data;

	s->closes_pending--;
}

void serve__close_handle(struct serve *s, uv_handle_t *h)
{
	h->data = s;
	s->closes_pending++;
	uv_close(h, serve_handle_closed);
}

static void serve_hb_cb(uv_timer_t *t)
{
	struct serve *s = t->data;

	serve__decode_heartbeat(s);
	serve__prefill_heartbeat(s);
}

/* Client bounds are swept on their own period: the heartbeat's is a
 * peer-plane setting and may be long. */
static void serve_sweep_cb(uv_timer_t *t)
{
	serve__client_sweep(t->data);
}

/* The whole serving layer goes away: memory is freed once every handle's
 * close callback ran (a final check in a zero-delay idle is not needed:
 * the loop runs until then because the handles are still referenced). */
struct serve_final {
	uv_idle_t idle;
	struct serve *s;
};

static void serve_free(struct serve *s)
{
	peer_key_wipe(&s->key);
	if (s->model)
		model_free(s->model);
	if (s->tok)
		tokenizer_free(s->tok);
	free(s);
}

static void serve_final_closed(uv_handle_t *h)
{
	struct serve_final *f = kvd_container_of(h, struct serve_final, idle);

	serve_free(f->s);
	free(f);
}

static void serve_final_idle(uv_idle_t *i)
{
	struct serve_final *f = kvd_container_of(i, struct serve_final, idle);

	if (f->s->closes_pending)
		return;
	uv_idle_stop(i);
	uv_close((uv_handle_t *)i, serve_final_closed);
}

static void serve_stop_hook(struct kvd_daemon *d, void *arg)
{
	struct serve *s = arg;
	struct serve_final *f;

	if (s->stopping)
		return;
	s->stopping = true;
	serve__client_close_all(s);
	serve__decode_stop(s);
	serve__prefill_stop(s);
	if (s->hb_open) {
		serve__close_handle(s, (uv_handle_t *)&s->hb_timer);
		s->hb_open = false;
	}
	if (s->sweep_open) {
		serve__close_handle(s, (uv_handle_t *)&s->sweep_timer);
		s->sweep_open = false;
	}
	compute_stop(&s->comp);
	/* every request still alive ends now (its pages go back with the
	 * pool, which the daemon frees after the loop stopped) */
	while (s->reqs) {
		struct serve_req *r = s->reqs;

		r->client = NULL;
		serve__req_end(r, false);
	}
	if (compute_close(&s->comp, serve_handle_closed, s))
		s->closes_pending++;
	f = calloc(1, sizeof(*f));
	if (!f || uv_idle_init(&d->loop, &f->idle)) {
		free(f);
		return;   /* leak s rather than free it under live handles */
	}
	f->s = s;
	uv_idle_start(&f->idle, serve_final_idle);
}

static int serve_bind_model(struct serve *s)
{
	struct gguf_error err = { 0 };
	int r;

	r = model_from_gguf(&s->model, s->d->model, &err);
	if (r) {
		KVLOG_ERR(s->log, "serve_model", "code=%d msg=%s", r,
			  KVLOG_Q(r < 0 ? strerror(-r) : err.msg));
		return KVD_E_MODEL;
	}
	r = tokenizer_new(&s->tok, s->d->model, &err);
	if (r) {
		KVLOG_ERR(s->log, "serve_tokenizer", "code=%d msg=%s", r,
			  KVLOG_Q(r < 0 ? strerror(-r) : err.msg));
		return KVD_E_MODEL;
	}
	return 0;
}

static void serve_my_hello(struct serve *s)
{
	struct proto_peer_hello *h = &s->my_hello;
	const struct kvpool_geom *g = kvpool_geom(s->d->pool);

	memset(h, 0, sizeof(*h));
	h->version = PROTO_PEER_VERSION;
	snprintf(h->role, sizeof(h->role), "%s", kvd_role_name(s->d->cfg.role));
	snprintf(h->node, sizeof(h->node), "%s", s->d->cfg.node_name);
	snprintf(h->model_sha256, sizeof(h->model_sha256), "%s", s->d->model_sha256);
	snprintf(h->kv_dtype, sizeof(h->kv_dtype), "%s", kv_dtype_name(g->dtype));
	h->page_tokens = g->page_tokens;
	h->n_layer = g->n_layer;
	h->kv_dim = g->kv_dim;
	h->page_bytes = s->page_bytes;
	h->pool_tokens = s->d->cap.pool_tokens;
	h->context = s->d->cap.advertised_context;
	h->max_batch_bytes = s->d->cfg.max_batch_bytes;
	h->checksum = s->d->cfg.checksum;
}

/* The cluster key (invariant 11). Without one the config layer has
 * already made sure every peer address is loopback; say so at boot. */
static int serve_load_key(struct serve *s)
{
	const struct kvd_config *c = &s->d->cfg;
	uint8_t buf[KVD_KEYFILE_MAX];
	char why[600];
	size_t len;
	int r;

	if (peer_auth_global_init()) {
		KVLOG_ERR(s->log, "peer_auth", "msg=\"libsodium failed to initialise\"");
		return -EIO;
	}
	if (!c->key_file[0]) {
		if (c->role != KVD_ROLE_STANDALONE)
			KVLOG_WARN(s->log, "peer_auth",
				   "mode=loopback_only msg=\"no peers.key_file: peers are not authenticated; only loopback peering is allowed\"");
		return 0;
	}
	r = kvd_keyfile_read(c->key_file, buf, &len, why, sizeof(why));
	if (!r)
		r = peer_key_init(&s->key, buf, len);
	sodium_memzero(buf, sizeof(buf));
	if (r) {
		KVLOG_ERR(s->log, "peer_auth", "key_file=%s msg=%s",
			  KVLOG_Q(c->key_file),
			  KVLOG_Q(why));
		return -EINVAL;
	}
	KVLOG_INFO(s->log, "peer_auth", "mode=keyed encrypt=%s",
		   c->encrypt ? "on" : "off");
	return 0;
}

/* transfer.transport = verbs must find a device, or the node refuses to
 * start: it never silently falls back to TCP. */
static int serve_check_transport(struct serve *s)
{
	struct transport_cfg tc = { .pool = s->d->pool, .mem = &s->d->mem,
				    .page_bytes = s->page_bytes,
				    .max_batch_bytes = s->d->cfg.max_batch_bytes,
				    .log = s->log };
	struct transport *t = NULL;
	char why[200] = "";
	int r;

	if (s->d->cfg.transport != KVD_TRANSPORT_VERBS)
		return 0;
	r = transport_verbs_new(&t, &s->d->loop, &tc, why, sizeof(why));
	if (t)
		t->ops->free(t);
	KVLOG_ERR(s->log, "transport_unavailable", "transport=verbs code=%d msg=%s",
		  r, KVLOG_Q(why));
	return r < 0 ? r : -ENOTSUP;
}

int serve_start(struct kvd_daemon *d)
{
	struct serve *s;
	const char *spec = getenv("KVD_FAULT"), *bad = NULL;
	int r;

	if (!d->pool || !d->model)
		return -EINVAL;
	/* A peer that closes a connection we are writing to must fail that
	 * write (EPIPE, handled as a lost peer), not kill the node: libuv
	 * writes with write(2), which raises SIGPIPE. */
	signal(SIGPIPE, SIG_IGN);
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->d = d;
	s->log = &d->log;
	s->reqtab = kvd_daemon_requests(d);
	if (kvd_fault_parse(&s->fault, spec, &bad)) {
		KVLOG_ERR(s->log, "fault_spec", "spec=%s at=%s", KVLOG_Q(spec),
			  KVLOG_Q(bad));
		free(s);
		return -EINVAL;
	}
	if (spec && *spec)
		KVLOG_WARN(s->log, "fault_points", "spec=%s compiled=%d", KVLOG_Q(spec),
			   KVD_FAULT_POINTS);
	{
		struct kvpool_geom g = *kvpool_geom(d->pool);

		s->page_bytes = kvpool_page_bytes(&g);
	}
	serve_my_hello(s);
	r = serve_load_key(s);
	if (!r)
		r = serve_check_transport(s);
	if (!r)
		r = serve_bind_model(s);
	if (!r)
		r = serve_compute_start(s);
	if (!r)
		r = kvd_daemon_on_stop(d, serve_stop_hook, s);
	if (r) {
		compute_stop(&s->comp);
		/* the async handle must close before s goes away */
		if (compute_close(&s->comp, NULL, NULL))
			uv_run(&d->loop, UV_RUN_NOWAIT);
		serve_free(s);
		return r;
	}
	/* from here the stop hook cleans up whatever opened */
	if (uv_timer_init(&d->loop, &s->hb_timer) == 0) {
		s->hb_open = true;
		s->hb_timer.data = s;
		uv_timer_start(&s->hb_timer, serve_hb_cb, d->cfg.heartbeat_ms,
			       d->cfg.heartbeat_ms);
	}
	if (d->cfg.role != KVD_ROLE_PREFILL &&
	    uv_timer_init(&d->loop, &s->sweep_timer) == 0) {
		s->sweep_open = true;
		s->sweep_timer.data = s;
		uv_timer_start(&s->sweep_timer, serve_sweep_cb, SERVE_SWEEP_MS,
			       SERVE_SWEEP_MS);
	}
	if (d->cfg.role == KVD_ROLE_PREFILL)
		r = serve__prefill_start(s);
	else
		r = serve__client_listen(s);
	if (!r && d->cfg.role == KVD_ROLE_DECODE)
		r = serve__decode_start(s);
	if (r)
		KVLOG_ERR(s->log, "serve_start", "code=%d msg=%s", r,
			  KVLOG_Q(r < 0 ? strerror(-r) : "see previous lines"));
	else
		KVLOG_INFO(s->log, "serve_ready",
			   "role=%s client=%s peer=%s peers=%u page_bytes=%llu advertised_context=%u faults=%s",
			   kvd_role_name(d->cfg.role),
			   KVLOG_Q(d->cfg.listen_client[0] ? d->cfg.listen_client : "-"),
			   KVLOG_Q(d->cfg.listen_peer[0] ? d->cfg.listen_peer : "-"),
			   d->cfg.n_peers_prefill,
			   (unsigned long long)s->page_bytes,
			   d->cap.advertised_context,
			   KVLOG_Q(spec && *spec ? spec : "none"));
	return r;
}
