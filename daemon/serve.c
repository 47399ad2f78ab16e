/* serve.c - the serving layer's top: setup, the bridge to the compute
 * thread, the periodic timers, teardown. It wires the files below it
 * (net/PROTOCOL.md's roles over client.c, decode.c, prefill.c, link.c,
 * req.c, io.c, compute.c) and none of them calls back into it.
 *
 * Design. The loop thread owns every socket, every request struct and
 * every decision; one compute thread (daemon/node/compute.c) owns the engine
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
 * A request is terminal exactly once (serve__req_end, daemon/node/req.c).
 */
#include "daemon/serve.h"
#include "daemon/front/front_int.h"
#include "conf/util.h"
#include "conf/fingerprint.h"
#include "conf/keyfile.h"

#include <errno.h>
#include <sodium.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <string.h>

/* ---- the compute thread (daemon/node/compute.c) ------------------------------------- */

/* Loop: one message of the compute thread, for the request it names (a
 * request that ended already hears nothing more). */
static void serve_compute_deliver(void *arg, struct compute_msg *m)
{
	struct serve *s = arg;
	struct serve_req *r = serve__req_find(s, m->owner);

	if (m->kind == COMPUTE_MSG_FREED && m->error)
		KVLOG_ERR(s->log, "invariant_breach",
			  "id=%llu tenant=%s op=release code=%d msg=\"the pool refused the pages of a freed request; quarantined\"",
			  (unsigned long long)m->owner,
			  KVLOG_Q(r ? r->tenant : SERVE_TENANT_UNKNOWN), m->error);
	if (r)
		r->rops->engine_msg(r, m);
}

/* The automatic step budget of a prefill node (engine.step_tokens = 0):
 * whole prompts first come, first served, a step at a time (daemon/README.md,
 * "Scheduling and TTFT under load"). */
#define SERVE_PREFILL_STEP_TOKENS 128u

static int serve_compute_start(struct serve *s)
{
	struct engine_params ep = ENGINE_PARAMS_DEFAULT;
	char pack_dir[1024] = "";
	int r;

	/* the repack cache lives beside the fingerprint cache */
	if (s->d->cfg.pack_cache)
		kvd_fingerprint_cache_dir(s->d->cfg.fingerprint_cache, pack_dir,
					  sizeof(pack_dir));
	ep.pack_dir = pack_dir;
	ep.model_sha256 = s->d->model_sha256;
	ep.pack_clean = true;
	ep.pack_keep_days = s->d->cfg.pack_cache_keep_days;
	ep.threads = s->d->cfg.threads;
	if (!ep.threads) {
		long n = sysconf(_SC_NPROCESSORS_ONLN);

		ep.threads = n > 0 ? (uint32_t)n : 1;
	}
	ep.max_batch = s->d->cfg.max_batch ? s->d->cfg.max_batch : 16;
	if (s->d->cfg.prefill_chunk)
		ep.prefill_chunk = s->d->cfg.prefill_chunk;
	ep.step_tokens = s->d->cfg.step_tokens;
	ep.step_us = s->d->cfg.step_ms > UINT32_MAX / 1000u ? UINT32_MAX :
		     s->d->cfg.step_ms * 1000u;
	/* A prefill node has no decoders whose inter-token latency small
	 * steps protect: by default a step takes the oldest prompts whole,
	 * up to 128 tokens (tests/bench/sched.sh: lower TTFT than 512-token
	 * steps, at the same throughput, and than 96-token slices). */
	if (s->d->cfg.role == KVD_ROLE_PREFILL && !ep.step_tokens) {
		ep.step_tokens = KVD_MAX(ep.max_batch + ep.prefill_chunk,
					 SERVE_PREFILL_STEP_TOKENS);
		ep.prefill_chunk = ep.step_tokens;
	}
	ep.n_ctx = s->d->cap.advertised_context;
	ep.cache = s->d->cache;
	r = compute_start(&s->comp, &s->d->loop, s->model, s->d->pool, &ep,
			  s->log, serve_compute_deliver, s);
	return r > 0 ? KVD_E_MODEL : r;
}

/* ---- lifetime -------------------------------------------------------------- */

/* A flood of rate-limited lines that ended: say how many it cost (both
 * timers call it: a prefill node has no sweep). */
static void serve_rl_flush(struct serve *s)
{
	for (size_t i = 0; i < SERVE_RL__N; i++)
		kvlog_ratelimit_flush(s->log, KVLOG_WARN, &s->rl[i]);
}

static void serve_hb_cb(uv_timer_t *t)
{
	struct serve *s = t->data;

	serve__link_tick(s);
	serve_rl_flush(s);
}

/* Client bounds are swept on their own period: the heartbeat's is a
 * peer-plane setting and may be long. */
static void serve_sweep_cb(uv_timer_t *t)
{
	struct serve *s = t->data;
	bool clients = s->d->cfg.role != KVD_ROLE_PREFILL;

	if (clients)
		serve__client_sweep(s);
	serve__http_sweep(s);
	if (clients)
		serve__gate_sweep(s);
	serve_rl_flush(s);
}

static void serve_rl_init(struct serve *s)
{
	static const char *const kind[SERVE_RL__N] = {
		[SERVE_RL_PEER_PROTOCOL] = "peer_protocol",
		[SERVE_RL_PEER_ACK] = "peer_ack",
		[SERVE_RL_PEER_REFUSED] = "peer_refused",
		[SERVE_RL_PEER_DOWN] = "peer_down",
		[SERVE_RL_PEER_REQUEST] = "peer_request",
		[SERVE_RL_CLIENT_REFUSED] = "client_refused",
		[SERVE_RL_CLIENT_FULL] = "client_full",
		[SERVE_RL_CLIENT_CONN] = "client_closed",
		[SERVE_RL_HTTP_REFUSED] = "http_refused",
		[SERVE_RL_LOOP_BUSY] = "loop_busy",
	};

	for (size_t i = 0; i < SERVE_RL__N; i++)
		kvd_ratelimit_init(&s->rl[i], kind[i], SERVE_RL_BURST,
				   SERVE_RL_PERIOD_MS);
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
	fairq_deinit(&s->fq);
	kvd_apikeys_free(s->keys);
	if (s->model)
		model_free(s->model);
	jgram_vocab_free(s->jvocab);
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
	serve__http_close_all(s);
	/* every job's connection is gone (cancelled): the workers finish
	 * what runs, the rest is handed back and freed */
	prep_stop(&s->front->prep);
	if (prep_close(&s->front->prep, serve__handle_closed, s))
		s->closes_pending++;
	serve__peerdns_stop(s);
	serve__link_stop(s);
	if (s->hb_open) {
		serve__close_handle(s, (uv_handle_t *)&s->hb_timer);
		s->hb_open = false;
	}
	if (s->sweep_open) {
		serve__close_handle(s, (uv_handle_t *)&s->sweep_timer);
		s->sweep_open = false;
	}
	d->reload.fn = NULL;    /* s goes away */
	serve__gate_stop(s);
	compute_stop(&s->comp);
	/* every request still alive ends now (its pages go back with the
	 * pool, which the daemon frees after the loop stopped) */
	while (!kvd_list_empty(&s->reqs)) {
		struct serve_req *r = kvd_list_entry(s->reqs.next, struct serve_req, node);

		r->sink = NULL;
		serve__req_end(r, false);
	}
	if (compute_close(&s->comp, serve__handle_closed, s))
		s->closes_pending++;
	f = calloc(1, sizeof(*f));
	if (!f || uv_idle_init(&d->loop, &f->idle)) {
		free(f);
		return;   /* leak s rather than free it under live handles */
	}
	f->s = s;
	uv_idle_start(&f->idle, serve_final_idle);
}

/* The chat format resolved at boot must keep contents out of the
 * template's turns (chat_format_check): a format whose markers are text
 * in this vocabulary lets a tenant spell out a system turn. Refused:
 * chat stays off when the format was recognized from the GGUF, and the
 * node does not start when model.chat_template forced it - unless
 * model.chat_template_unsafe accepts it (logged). */
static int serve_check_chat(struct serve *s)
{
	struct kvd_daemon *d = s->d;
	char why[300];
	int r;

	if (d->chat_format == CHAT_NONE)
		return 0;
	r = chat_format_check(d->chat_format, s->tok, why, sizeof(why));
	if (r == 0)
		return 0;
	if (d->cfg.chat_template_unsafe) {
		KVLOG_WARN(s->log, "chat_template_unsafe", "format=%s msg=%s",
			   chat_format_name(d->chat_format), KVLOG_Q(why));
		return 0;
	}
	if (d->cfg.chat_template) {
		KVLOG_ERR(s->log, "chat_template_refused",
			  "format=%s source=config msg=%s hint=\"model.chat_template_unsafe = true accepts it\"",
			  chat_format_name(d->chat_format), KVLOG_Q(why));
		return KVD_E_MODEL;
	}
	KVLOG_WARN(s->log, "chat_template_refused",
		   "format=%s source=gguf msg=%s hint=\"chat is off; model.chat_template_unsafe = true accepts it\"",
		   chat_format_name(d->chat_format), KVLOG_Q(why));
	d->chat_format = CHAT_NONE;
	return 0;
}

/* The API keys (http.api_keys_file) both client fronts check. */
static int serve_client_keys(struct serve *s)
{
	char why[600];
	int rc;

	if (!s->d->cfg.http_api_keys_file[0])
		return 0;
	rc = kvd_apikeys_load(&s->keys, s->d->cfg.http_api_keys_file, why, sizeof(why));
	if (rc)
		KVLOG_ERR(s->log, "api_keys", "msg=%s",
			  KVLOG_Q(rc == -ENOMEM ? "out of memory" : why));
	return rc < 0 ? rc : rc ? -EINVAL : 0;
}

/* SIGHUP: the API keys file read again, through the same checks as at
 * boot. A file that fails them keeps the keys in use (logged, with why).
 * The swap is one pointer on the loop thread, and every reader (both
 * fronts' key checks) runs there and copies what it keeps (tenant,
 * limits), so nothing points into the old set when it is freed: the next
 * request or msgpack `auth` meets the new keys. A msgpack connection
 * already authenticated keeps its tenant until it closes; a tenant's new
 * limits apply once it has nothing running (daemon/node/fairq.c); the
 * prefix cache keeps the split it made at boot. kvd logs to stderr only
 * (journald keeps the file), so there is no log file to reopen. */
static void serve_reload_keys(struct serve *s)
{
	const char *path = s->d->cfg.http_api_keys_file;
	struct kvd_apikeys *k = NULL;
	char why[600];
	int rc;

	/* a prefill node has the file only with listen.http (its admin
	 * keys read /metrics there): the config refuses it otherwise */
	if (!path[0]) {
		KVLOG_INFO(s->log, "reload", "signal=HUP api_keys=none log=stderr");
		return;
	}
	rc = kvd_apikeys_load(&k, path, why, sizeof(why));
	if (rc) {
		KVLOG_ERR(s->log, "reload",
			  "signal=HUP api_keys=kept file=%s keys=%zu log=stderr msg=%s",
			  KVLOG_Q(path), kvd_apikeys_count(s->keys),
			  KVLOG_Q(rc == -ENOMEM ? "out of memory" : why));
		return;
	}
	kvd_apikeys_free(s->keys);
	s->keys = k;
	KVLOG_INFO(s->log, "reload",
		   "signal=HUP api_keys=loaded file=%s keys=%zu tenants=%zu log=stderr",
		   KVLOG_Q(path), kvd_apikeys_count(k), kvd_apikeys_tenants(k));
}

/* The INI read again (path_is_file) for http.cors_origins, the one key
 * of it a SIGHUP applies: through every check of the file the boot runs
 * (kvd_config_load: each key's parse, resolve, validate), so an INI that
 * fails any of them (not only this key) changes nothing, and says why as
 * the boot would (FILE:LINE: key: message). Not kvd_config_check_host
 * (admin.socket's directory on this machine): the socket is bound
 * already and the key takes a restart, so that check is the next
 * start's. The other keys are
 * read and dropped: they take a restart. The new list is parsed into a
 * scratch list first, then into place: the list in use is never left
 * half written. */
static int serve_reload_cors_read(struct serve *s, char *spec, size_t size,
				  char *why, size_t why_size)
{
	struct kvd_config *c = malloc(sizeof(*c));
	struct kvd_config_error err;
	int r;

	if (!c) {
		snprintf(why, why_size, "out of memory");
		return -ENOMEM;
	}
	r = kvd_config_load(c, s->d->cfg.path, &err);
	if (r)
		kvd_config_error_format(&err, why, why_size);
	else
		snprintf(spec, size, "%s", c->http_cors_origins);
	free(c);
	return r ? -EINVAL : 0;
}

static void serve_reload_cors(struct serve *s)
{
	struct kvd_origins *cur = serve__http_cors(s), next;
	struct kvd_config *cfg = &s->d->cfg;
	char spec[sizeof(cfg->http_cors_origins)], why[1800], bad[KVD_ORIGIN_MAX + 1];
	const char *bwhy = NULL;
	int r;

	if (!cur)      /* no HTTP front: no answer carries CORS headers */
		return;
	if (!cfg->path_is_file) {
		KVLOG_INFO(s->log, "reload", "signal=HUP cors_origins=kept origins=%u any=%s msg=%s",
			   cur->n, cur->any ? "yes" : "no",
			   KVLOG_Q("no config file to read again (kvd serve)"));
		return;
	}
	r = serve_reload_cors_read(s, spec, sizeof(spec), why, sizeof(why));
	/* the load checked the list already: kept for a check that drifts */
	if (!r && kvd_origins_parse(&next, spec, &bwhy, bad, sizeof(bad))) {
		snprintf(why, sizeof(why), "%s: http.cors_origins: '%s': %s", cfg->path, bad, bwhy);
		r = -EINVAL;
	}
	if (r) {
		KVLOG_ERR(s->log, "reload",
			  "signal=HUP cors_origins=kept file=%s origins=%u any=%s msg=%s",
			  KVLOG_Q(cfg->path), cur->n, cur->any ? "yes" : "no", KVLOG_Q(why));
		return;
	}
	kvd_origins_copy(cur, &next);
	snprintf(cfg->http_cors_origins, sizeof(cfg->http_cors_origins), "%s", spec);
	KVLOG_INFO(s->log, "reload", "signal=HUP cors_origins=loaded file=%s origins=%u any=%s",
		   KVLOG_Q(cfg->path), cur->n, cur->any ? "yes" : "no");
}

/* SIGHUP: each reloadable part, each with its own line. */
static void serve_reload(struct serve *s)
{
	serve_reload_keys(s);
	serve_reload_cors(s);
}

static void serve_reload_hook(struct kvd_daemon *d, void *arg)
{
	(void)d;
	serve_reload(arg);
}

/* cache.tenant_pages unset on a client-facing node: the cache split
 * evenly between the tenants of the keys file (one without it), so a
 * tenant's inserts never need another tenant's pages (gpu/kv/pcache.h). */
static void serve_cache_shares(struct serve *s)
{
	struct pcache *c = s->d->cache;
	size_t n = s->keys ? kvd_apikeys_tenants(s->keys) : 1;

	if (!c || s->d->cfg.cache_tenant_pages)
		return;
	pcache_split(c, (uint32_t)KVD_MIN(KVD_MAX(n, (size_t)1), UINT32_MAX));
	KVLOG_INFO(s->log, "prefix_cache_shares", "tenants=%zu tenant_pages=%u source=%s",
		   n, pcache_tenant_pages(c), s->keys ? "api_keys_file" : "keyless");
}

/* Decode and standalone: keys, the gate, the preparation workers both
 * client fronts share, the msgpack listeners. */
static int serve_client_start(struct serve *s)
{
	int r = serve_client_keys(s);

	if (!r)
		serve_cache_shares(s);

	if (!r)
		r = serve__gate_init(s);
	if (!r) {
		r = prep_start(&s->front->prep, &s->d->loop);
		if (r)
			KVLOG_ERR(s->log, "serve_prep", "msg=\"preparation workers: %s\"",
				  uv_strerror(r));
	}
	if (!r)
		r = serve__client_listen(s);
	return r;
}

static int serve_bind_model(struct serve *s)
{
	struct gguf_error err = { 0 };
	int r;

	r = model_from_gguf(&s->model, s->d->model, &err);
	if (r) {
		KVLOG_ERR(s->log, "serve_model", "code=%d msg=%s", r,
			  KVLOG_Q(gguf_error_msg(r, &err)));
		return KVD_E_MODEL;
	}
	r = tokenizer_new(&s->tok, s->d->model, &err);
	if (r) {
		KVLOG_ERR(s->log, "serve_tokenizer", "code=%d msg=%s", r,
			  KVLOG_Q(gguf_error_msg(r, &err)));
		return KVD_E_MODEL;
	}
	/* response_format json's trie, where clients are served; without it
	 * (no memory) json is refused, not fatal */
	if (s->d->cfg.role != KVD_ROLE_PREFILL && jgram_vocab_new(&s->jvocab, s->tok))
		s->jvocab = NULL;
	return serve_check_chat(s);
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

/* transfer.transport = verbs must find a device that meets the
 * configured terms, or the node refuses to start: it never silently falls
 * back to TCP. Each peer link opens its own QP later (daemon/node/link.c). */
static int serve_check_transport(struct serve *s)
{
	struct transport_cfg tc = { .page_bytes = s->page_bytes,
				    .max_batch_bytes = s->d->cfg.max_batch_bytes,
				    .log = s->log,
				    .verbs_device = s->d->cfg.verbs_device,
				    .verbs_port = s->d->cfg.verbs_port,
				    .verbs_gid_index = s->d->cfg.verbs_gid_index,
				    .verbs_qp_depth = s->d->cfg.verbs_qp_depth,
				    .verbs_inline = s->d->cfg.verbs_inline,
				    .verbs_write_scope = (uint32_t)s->d->cfg.verbs_write_scope,
				    .verbs_flush_timeout_ms = s->d->cfg.verbs_flush_timeout_ms };
	struct transport *t = NULL;
	char why[400] = "", fig[300], asked[16];
	int r;

	_Static_assert(KVD_VERBS_INLINE_AUTO == TRANSPORT_VERBS_INLINE_AUTO,
		       "conf and net agree on transfer.verbs_inline=auto");
	if (s->d->cfg.transport != KVD_TRANSPORT_VERBS)
		return 0;
	r = transport_verbs_new(&t, NULL, &tc, why, sizeof(why));
	if (r) {
		KVLOG_ERR(s->log, "transport_unavailable", "transport=verbs code=%d msg=%s",
			  r, KVLOG_Q(why));
		return r < 0 ? r : -EINVAL;
	}
	transport_verbs_figures(t, fig, sizeof(fig));
	snprintf(s->d->verbs_write_scope, sizeof(s->d->verbs_write_scope), "%s",
		 transport_verbs_scope_mode(t));
	s->d->verbs_inline = transport_verbs_inline(t);
	t->ops->free(t);
	if (s->d->cfg.verbs_inline == KVD_VERBS_INLINE_AUTO)
		snprintf(asked, sizeof(asked), "auto");
	else
		snprintf(asked, sizeof(asked), "%u", s->d->cfg.verbs_inline);
	/* fig carries inline= (the size in use) and inline_granted= */
	KVLOG_INFO(s->log, "transport", "transport=verbs %s inline_config=%s qp_depth=%u flush_timeout_ms=%u msg=\"the real-device path has not run on RDMA hardware\"",
		   fig, asked, s->d->cfg.verbs_qp_depth,
		   s->d->cfg.verbs_flush_timeout_ms);
	return 0;
}

/* The node's serving state and its client fronts' (empty on prefill),
 * one allocation: freed as s (serve_free). */
struct serve_with_front {
	struct serve s;
	struct front front;
};

/* The node's serving state and its fronts, one zeroed allocation on d:
 * lists empty, the request table, the rate limits. NULL when out of
 * memory. */
static struct serve *serve_alloc(struct kvd_daemon *d)
{
	struct serve_with_front *both;
	struct serve *s;

	both = calloc(1, sizeof(*both));
	if (!both)
		return NULL;
	s = &both->s;
	s->front = &both->front;
	s->d = d;
	s->log = &d->log;
	kvd_list_init(&s->front->clients);
	kvd_list_init(&s->front->pending);
	kvd_list_init(&s->reqs);
	kvd_list_init(&s->links);
	kvd_list_init(&s->dns_names);
	s->reqtab = kvd_daemon_requests(d);
	serve_rl_init(s);
	return s;
}

/* The fault points KVD_FAULT (spec) names, into s->fault; a node with any
 * says so at boot. 0, or -EINVAL (logged) for a spec that does not parse. */
static int serve_faults(struct serve *s, const char *spec)
{
	const char *bad = NULL;

	if (kvd_fault_parse(&s->fault, spec, &bad)) {
		KVLOG_ERR(s->log, "fault_spec", "spec=%s at=%s", KVLOG_Q(spec),
			  KVLOG_Q(bad));
		return -EINVAL;
	}
	if (spec && *spec)
		KVLOG_WARN(s->log, "fault_points", "spec=%s compiled=%d", KVLOG_Q(spec),
			   KVD_FAULT_POINTS);
	return 0;
}

/* What may refuse the node before it serves, in order: the cluster key,
 * the transport, the model, the compute thread, the stop hook. 0 or the
 * first error (logged where it happened); the caller undoes. */
static int serve_open(struct serve *s)
{
	int r;

	r = serve_load_key(s);
	if (!r)
		r = serve_check_transport(s);
	if (!r)
		r = serve_bind_model(s);
	if (!r)
		r = serve_compute_start(s);
	if (!r)
		r = kvd_daemon_on_stop(s->d, serve_stop_hook, s);
	return r;
}

/* The heartbeat timer, and the sweep timer where clients connect (on
 * prefill: only its HTTP probe listener); one that cannot be made is left
 * out (its flag stays false for the stop hook). */
static void serve_timers(struct serve *s)
{
	struct kvd_daemon *d = s->d;

	if (uv_timer_init(&d->loop, &s->hb_timer) == 0) {
		s->hb_open = true;
		s->hb_timer.data = s;
		uv_timer_start(&s->hb_timer, serve_hb_cb, d->cfg.heartbeat_ms,
			       d->cfg.heartbeat_ms);
	}
	if ((d->cfg.role != KVD_ROLE_PREFILL || d->cfg.listen_http[0]) &&
	    uv_timer_init(&d->loop, &s->sweep_timer) == 0) {
		s->sweep_open = true;
		s->sweep_timer.data = s;
		uv_timer_start(&s->sweep_timer, serve_sweep_cb, SERVE_SWEEP_MS,
			       SERVE_SWEEP_MS);
	}
}

/* A prefill node's HTTP listener (listen.http): the probes and /metrics
 * only (http_api.c's routes say which), so it needs the keys file (an
 * admin key reads /metrics) and the connection bound, but no gate and no
 * preparation workers. */
static int serve_probe_start(struct serve *s)
{
	int r = serve_client_keys(s);

	if (r)
		return r;
	serve__client_limits(s);
	return serve__http_listen(s);
}

/* The role's admission and listeners: prefill's peer side, or the client
 * socket, then HTTP when configured (on prefill, its probes) and, on
 * decode, the peer side. 0 or the first error. */
static int serve_fronts(struct serve *s)
{
	const struct kvd_config *c = &s->d->cfg;
	int r;

	s->admit = c->role == KVD_ROLE_DECODE ? serve__decode_admit
					      : serve__local_admit;
	if (c->role == KVD_ROLE_PREFILL)
		r = serve__prefill_start(s);
	else
		r = serve_client_start(s);
	if (!r && c->listen_http[0])
		r = c->role == KVD_ROLE_PREFILL ? serve_probe_start(s)
						: serve__http_listen(s);
	if (!r && c->role == KVD_ROLE_DECODE)
		r = serve__decode_start(s);
	return r;
}

int serve_start(struct kvd_daemon *d)
{
	struct serve *s;
	const char *spec = getenv("KVD_FAULT");
	int r;

	if (!d->pool || !d->model)
		return -EINVAL;
	/* A peer that closes a connection we are writing to must fail that
	 * write (EPIPE, handled as a lost peer), not kill the node: libuv
	 * writes with write(2), which raises SIGPIPE. */
	signal(SIGPIPE, SIG_IGN);
	s = serve_alloc(d);
	if (!s)
		return -ENOMEM;
	if (serve_faults(s, spec)) {
		free(s);
		return -EINVAL;
	}
	{
		struct kvpool_geom g = *kvpool_geom(d->pool);

		s->page_bytes = kvpool_page_bytes(&g);
	}
	serve_my_hello(s);
	r = serve_open(s);
	if (r) {
		compute_stop(&s->comp);
		/* the async handle must close before s goes away */
		if (compute_close(&s->comp, NULL, NULL))
			uv_run(&d->loop, UV_RUN_NOWAIT);
		serve_free(s);
		return r;
	}
	/* from here the stop hook cleans up whatever opened */
	serve_timers(s);
	d->reload.fn = serve_reload_hook;
	d->reload.arg = s;
	r = serve_fronts(s);
	if (r)
		KVLOG_ERR(s->log, "serve_start", "code=%d msg=%s", r,
			  KVLOG_Q(r < 0 ? strerror(-r) : "see previous lines"));
	else
		KVLOG_INFO(s->log, "serve_ready",
			   "role=%s client=%s http=%s peer=%s peers=%u page_bytes=%llu advertised_context=%u faults=%s",
			   kvd_role_name(d->cfg.role),
			   KVLOG_Q(d->cfg.listen_client[0] ? d->cfg.listen_client : "-"),
			   KVLOG_Q(d->cfg.listen_http[0] ? d->cfg.listen_http : "-"),
			   KVLOG_Q(d->cfg.listen_peer[0] ? d->cfg.listen_peer : "-"),
			   d->cfg.n_peers_prefill,
			   (unsigned long long)s->page_bytes,
			   d->cap.advertised_context,
			   KVLOG_Q(spec && *spec ? spec : "none"));
	return r;
}
