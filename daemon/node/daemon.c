/* daemon.c - building, running and stopping one kvd node.
 *
 * Boot order is the safety argument of invariant 4:
 *   1. open the model (header and metadata only) and fingerprint it;
 *   2. compute the pool's capacity from the config and the model, and log
 *      exactly one event=kv_capacity line;
 *   3. with verdict=insufficient and policy refuse, stop here: nothing was
 *      allocated and nothing listens (the caller exits 78);
 *   4. allocate the pool;
 *   5. the caller opens listeners (admin socket, later client and peer)
 *      and calls kvd_daemon_ready(), which tells systemd READY=1.
 *
 * Shutdown is the reverse: SIGTERM drains (admits nothing new, waits for
 * in-flight work up to node.drain_timeout_ms, then aborts what is left),
 * then every upper-layer stop hook
 * closes its handles, the daemon closes its own, and uv_run returns when the
 * last close callback has run. The pool is freed in deinit, after the loop
 * has stopped, so no callback can touch it afterwards.
 */
#include "daemon/node/daemon.h"
#include "conf/fingerprint.h"
#include "conf/sha256.h"
#include "conf/util.h"
#include "daemon/node/fpcheck.h"
#include "gpu/kv/pcache.h"
#include "kvd_build.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if KVD_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif


static const char *const state_names[] = {
	"starting", "ready", "draining", "drained", "stopping",
};

static const char *const reject_names[] = {
	"prompt_too_long", "invalid", "overloaded", "draining", "no_peer",
};

const char *kvd_state_name(enum kvd_state s)
{
	return (unsigned)s < KVD_ARRAY_SIZE(state_names) ? state_names[s] : "?";
}

const char *kvd_reject_name(enum kvd_reject r)
{
	return (unsigned)r < KVD_ARRAY_SIZE(reject_names) ? reject_names[r] : "?";
}

/* ---- capacity (invariant 4) ------------------------------------------- */

/* K and V rows are n_head_kv * head_dim wide, head_dim being the file's
 * attention.key_length where it has one (qwen3): never derived from
 * n_embd, so pages, capacity and the peer hello follow the real heads. */
static struct kvpool_geom daemon_geom(const struct kvd_config *cfg,
				      const struct llama_hparams *hp)
{
	struct kvpool_geom g = {
		.page_tokens = cfg->page_tokens,
		.n_layer = hp->n_layer,
		.kv_dim = hp->n_head_kv * hp->head_dim,
		.dtype = (enum kv_dtype)cfg->kv_dtype,
	};

	return g;
}

int kvd_capacity_pages(const struct kvd_config *cfg,
		       const struct llama_hparams *hp, uint32_t *pages)
{
	struct kvpool_geom g = daemon_geom(cfg, hp);
	uint64_t page_bytes = kvpool_page_bytes(&g);
	uint64_t n;

	if (!page_bytes)
		return -EINVAL;
	if (cfg->pool_tokens)
		n = (cfg->pool_tokens + cfg->page_tokens - 1) / cfg->page_tokens;
	else
		n = cfg->memory_bytes / page_bytes;
	if (n > UINT32_MAX)
		return -E2BIG;
	*pages = (uint32_t)n;
	return 0;
}

void kvd_capacity_compute(const struct kvd_config *cfg,
			  const struct llama_hparams *hp, uint32_t pages,
			  struct kvd_capacity *out)
{
	struct kvpool_geom g = daemon_geom(cfg, hp);
	uint32_t ctx = cfg->context_length ? cfg->context_length
					   : hp->n_ctx_train;
	double fit;

	memset(out, 0, sizeof(*out));
	out->pages = pages;
	out->page_tokens = cfg->page_tokens;
	out->pool_tokens = (uint64_t)pages * cfg->page_tokens;
	out->page_bytes = kvpool_page_bytes(&g);
	out->kv_bytes_per_token = llama_kv_bytes_per_token(hp, g.dtype);
	out->context_length = ctx;
	out->margin = cfg->capacity_margin;
	out->required_tokens = (uint64_t)ceil((double)ctx * cfg->capacity_margin);
	out->ok = out->pool_tokens >= out->required_tokens;
	if (out->ok) {
		out->advertised_context = ctx;
	} else if (cfg->capacity_policy == KVD_CAP_CLAMP) {
		/* The largest context whose margin-scaled need fits. */
		fit = floor((double)out->pool_tokens / cfg->capacity_margin);
		out->advertised_context = (uint32_t)KVD_MIN(fit, (double)ctx);
	} else {
		out->advertised_context = 0;
	}
}

/* The smallest pool on the path decides what a request may use: a peer
 * whose pool or context is smaller than ours lowers the path's context. */
static void capacity_join_peers(struct kvd_capacity *cap,
				const struct kvd_peer_figures *pf)
{
	uint64_t path = cap->advertised_context;

	cap->peers = pf->up;
	cap->peer_min_pool_tokens = pf->up ? pf->min_pool_tokens : 0;
	if (pf->up) {
		path = KVD_MIN(path, pf->min_pool_tokens);
		path = KVD_MIN(path, (uint64_t)pf->min_context);
	}
	cap->path_context = (uint32_t)path;
}

void kvd_daemon_capacity(struct kvd_daemon *d, const char *reason,
			 struct kvd_capacity *out)
{
	struct kvd_capacity cap;
	struct kvpool_stats st;
	uint32_t pages;
	char model[1100];
	char dev[600];

	if (d->pool) {
		kvpool_get_stats(d->pool, &st);
		/* Retiring pages are leaving: do not count on them. */
		pages = st.pages - st.retiring;
	} else if (kvd_capacity_pages(&d->cfg, &d->hp, &pages) < 0) {
		pages = 0;
	}
	kvd_capacity_compute(&d->cfg, &d->hp, pages, &cap);
	capacity_join_peers(&cap, &d->peers);
	KVLOG(&d->log, cap.ok ? KVLOG_INFO : KVLOG_ERROR, "kv_capacity",
	      "role=%s pool_tokens=%llu pages=%u page_tokens=%u page_bytes=%llu"
	      " kv_bytes_per_token=%llu context_length=%u margin=%g"
	      " required_tokens=%llu model=%s model_sha256=%s kv_dtype=%s"
	      " transport=%s verbs_device=%s"
	      " verdict=%s policy=%s advertised_context=%u peers=%u"
	      " peer_min_pool_tokens=%llu path_context=%u reason=%s",
	      kvd_role_name(d->cfg.role), (unsigned long long)cap.pool_tokens,
	      cap.pages, cap.page_tokens, (unsigned long long)cap.page_bytes,
	      (unsigned long long)cap.kv_bytes_per_token, cap.context_length,
	      cap.margin, (unsigned long long)cap.required_tokens,
	      kvlog_quote(model, sizeof(model), d->cfg.model_path),
	      d->model_sha256, kv_dtype_name((enum kv_dtype)d->cfg.kv_dtype),
	      kvd_transport_name(d->cfg.transport),
	      kvlog_quote(dev, sizeof(dev),
			  d->cfg.transport == KVD_TRANSPORT_VERBS ?
			  d->cfg.verbs_device : ""),
	      cap.ok ? "ok" : "insufficient",
	      kvd_cap_policy_name(d->cfg.capacity_policy),
	      cap.advertised_context, cap.peers,
	      (unsigned long long)cap.peer_min_pool_tokens, cap.path_context,
	      reason);
	d->cap = cap;
	if (out)
		*out = cap;
}

/* ---- systemd ------------------------------------------------------------ */

void kvd_daemon_notify_status(struct kvd_daemon *d, const char *fmt, ...)
{
#if KVD_HAVE_SYSTEMD
	char msg[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	sd_notifyf(0, "STATUS=%s", msg);
#else
	(void)fmt;
#endif
	(void)d;
}

static void watchdog_cb(uv_timer_t *t)
{
#if KVD_HAVE_SYSTEMD
	sd_notify(0, "WATCHDOG=1");
#endif
	(void)t;
}

static void watchdog_start(struct kvd_daemon *d)
{
#if KVD_HAVE_SYSTEMD
	uint64_t usec = 0;

	if (sd_watchdog_enabled(0, &usec) > 0 && usec >= 2000)
		uv_timer_start(&d->watchdog_timer, watchdog_cb, usec / 2000,
			       usec / 2000);
#else
	(void)d;
#endif
}

/* ---- boot ---------------------------------------------------------------- */

static void daemon_resolve_chat(struct kvd_daemon *d);

/* The model's SHA-256, from the fingerprint cache when the file has not
 * changed (conf/fingerprint.c): one line says where it came from and how
 * long it took, so time to ready is explained in the log. */
static int daemon_fingerprint(struct kvd_daemon *d)
{
	struct kvd_fp_info *fi = &d->fp;
	char dir[1024];
	uint64_t t0 = kvd_now_ns();
	int r;

	kvd_fingerprint_cache_dir(d->cfg.fingerprint_cache, dir, sizeof(dir));
	r = kvd_fingerprint(d->cfg.model_path, dir, d->model_sha256, fi);
	if (r < 0) {
		KVLOG_ERR(&d->log, "model_error", "path=%s msg=\"sha256: %s\"",
			  KVLOG_Q(d->cfg.model_path), strerror(-r));
		return r;
	}
	if (!strcmp(fi->lookup, "unsafe_dir") || !strcmp(fi->lookup, "dir_error") ||
	    !strcmp(fi->store, "error"))
		KVLOG_WARN(&d->log, "fingerprint_cache_error",
			   "dir=%s lookup=%s store=%s errno=%s",
			   KVLOG_Q(dir), fi->lookup, fi->store,
			   fi->store_errno ? strerror(fi->store_errno) : "-");
	if (!strcmp(fi->lookup, "evidence"))
		KVLOG_WARN(&d->log, "fingerprint_cache_evidence",
			   "dir=%s msg=\"an entry with this file's metadata named other bytes; hashed in full\"",
			   KVLOG_Q(dir));
	KVLOG_INFO(&d->log, "model_fingerprint",
		   "source=%s lookup=%s store=%s hashed_bytes=%llu evidence_bytes=%llu ms=%.1f sha256=%s",
		   fi->cached ? "cache" : "hash", fi->lookup, fi->store,
		   fi->hashed_bytes, (unsigned long long)fi->evidence_bytes,
		   (double)(kvd_now_ns() - t0) / 1e6, d->model_sha256);
	return 0;
}

/* The full hash of a cached fingerprint came back. A mismatch means the
 * node has advertised, and paired on, another model's identity since it
 * started: it leaves service at once (no drain - draining would go on
 * serving under the wrong identity), the cache entry is dropped so the
 * restart hashes in full, and the exit status is KVD_EX_FINGERPRINT. */
static void daemon_fpcheck_done(void *arg, bool match, const char *actual,
				uint64_t bytes, double ms)
{
	struct kvd_daemon *d = arg;
	char dir[1024];
	int r;

	if (match) {
		KVLOG_INFO(&d->log, "model_fingerprint_verified",
			   "bytes=%llu ms=%.1f sha256=%s", (unsigned long long)bytes,
			   ms, d->model_sha256);
		fpcheck_stop(d->fpcheck);
		d->fpcheck = NULL;
		return;
	}
	kvd_fingerprint_cache_dir(d->cfg.fingerprint_cache, dir, sizeof(dir));
	r = kvd_fingerprint_forget(dir, d->fp.dev, d->fp.ino);
	KVLOG_ERR(&d->log, "model_fingerprint_mismatch",
		  "path=%s cached=%s actual=%s bytes=%llu ms=%.1f entry=%s action=stop exit_code=%d",
		  KVLOG_Q(d->cfg.model_path), d->model_sha256, actual,
		  (unsigned long long)bytes, ms, r ? "kept" : "dropped",
		  KVD_EX_FINGERPRINT);
	fpcheck_stop(d->fpcheck);
	d->fpcheck = NULL;
	d->exit_code = KVD_EX_FINGERPRINT;
	kvd_daemon_stop(d);
}

static int daemon_open_model(struct kvd_daemon *d)
{
	struct gguf_error gerr = { 0 };
	int r;

	r = gguf_open(&d->model, d->cfg.model_path, &gerr);
	if (r == 0)
		r = gguf_llama_hparams(d->model, &d->hp, &gerr);
	if (r) {
		KVLOG_ERR(&d->log, "model_error",
			  "path=%s code=%d offset=%llu msg=%s",
			  KVLOG_Q(d->cfg.model_path), r,
			  (unsigned long long)gerr.offset, KVLOG_Q(gerr.msg));
		return r < 0 ? r : KVD_E_MODEL;
	}
	r = daemon_fingerprint(d);
	if (r < 0)
		return r;
	KVLOG_INFO(&d->log, "model_loaded",
		   "path=%s arch=%s layers=%u embd=%u heads=%u kv_heads=%u"
		   " head_dim=%u ff=%u vocab=%u ctx_train=%u sha256=%s",
		   KVLOG_Q(d->cfg.model_path), KVLOG_Q(d->hp.arch),
		   d->hp.n_layer, d->hp.n_embd, d->hp.n_head, d->hp.n_head_kv,
		   d->hp.head_dim, d->hp.n_ff, d->hp.n_vocab,
		   d->hp.n_ctx_train, d->model_sha256);
	daemon_resolve_chat(d);
	return 0;
}

/* Templates longer than this are not looked at (the longest known
 * ones, with tool calling, are ~10 KiB). */
#define DAEMON_CHAT_TEMPLATE_MAX (1u << 20)

/* Resolve the chat format once: the config's, else the one the model's
 * tokenizer.chat_template is recognized as. Never fails the boot: a
 * model without a template kvd knows still serves completions. */
static void daemon_resolve_chat(struct kvd_daemon *d)
{
	struct gguf_str src;
	char *copy;
	int r;

	d->chat_format = CHAT_NONE;
	if (d->cfg.chat_template > CHAT_NONE && d->cfg.chat_template < CHAT__N) {
		d->chat_format = (enum chat_format)d->cfg.chat_template;
		KVLOG_INFO(&d->log, "chat_template", "format=%s source=config",
			   chat_format_name(d->chat_format));
		return;
	}
	if (gguf_get_str(d->model, "tokenizer.chat_template", &src) != 0) {
		KVLOG_INFO(&d->log, "chat_template",
			   "format=none source=gguf reason=absent");
		return;
	}
	if (src.len > DAEMON_CHAT_TEMPLATE_MAX) {
		KVLOG_WARN(&d->log, "chat_template",
			   "format=none source=gguf reason=too_long bytes=%llu",
			   (unsigned long long)src.len);
		return;
	}
	copy = malloc(src.len + 1);
	if (!copy) {
		KVLOG_WARN(&d->log, "chat_template",
			   "format=none source=gguf reason=no_memory");
		return;
	}
	memcpy(copy, src.ptr, src.len);
	copy[src.len] = '\0';
	r = chat_format_detect(copy, &d->chat_format);
	free(copy);
	if (r) {
		d->chat_format = CHAT_NONE;
		KVLOG_WARN(&d->log, "chat_template",
			   "format=none source=gguf reason=unrecognized bytes=%llu"
			   " msg=\"set model.chat_template to serve chat\"",
			   (unsigned long long)src.len);
		return;
	}
	KVLOG_INFO(&d->log, "chat_template", "format=%s source=gguf",
		   chat_format_name(d->chat_format));
}

/* The prefix cache (cache.enabled): at most cache.max_pages (0: half
 * the pool) pages, cache.tenant_pages per tenant. Its keys start from the
 * model's fingerprint and the page layout, so a page is only ever found
 * by a prompt computed with the same weights into the same layout. */
static int daemon_open_cache(struct kvd_daemon *d, const struct kvpool_geom *g)
{
	struct pcache_params pp = { .max_pages = d->cfg.cache_max_pages,
				    .tenant_pages = d->cfg.cache_tenant_pages };
	struct sha256 h;
	int r;

	if (!d->cfg.cache_enabled)
		return 0;
	sha256_init(&h);
	sha256_update(&h, d->model_sha256, strlen(d->model_sha256));
	sha256_update(&h, g, sizeof(*g));
	sha256_final(&h, d->cache_fp);
	if (!pp.max_pages)
		pp.max_pages = KVD_MAX(d->cap.pages / 2, 1u);
	/* unset: shared out between tenants, so that one tenant's inserts
	 * never need another's room; a client-facing node knows its tenants
	 * and narrows this at start (serve.c), a prefill node does not */
	if (!pp.tenant_pages)
		pp.tenant_pages = KVD_MAX(pp.max_pages / PCACHE_DEFAULT_TENANTS, 1u);
	r = pcache_new(&d->cache, d->pool, &pp);
	if (r) {
		KVLOG_ERR(&d->log, "kv_pool_error", "what=prefix_cache code=%d", r);
		return r < 0 ? r : -ENOMEM;
	}
	KVLOG_INFO(&d->log, "prefix_cache_ready", "max_pages=%u tenant_pages=%u",
		   pp.max_pages, pp.tenant_pages ? pp.tenant_pages : pp.max_pages);
	return 0;
}

static int daemon_open_pool(struct kvd_daemon *d)
{
	struct kvpool_geom g = daemon_geom(&d->cfg, &d->hp);
	int r;

	if (!strcmp(d->cfg.kv_backend, "cuda")) {
		r = kvmem_cuda_init(&d->mem, 0);
		if (r < 0) {
			KVLOG_ERR(&d->log, "kv_pool_error",
				  "backend=cuda msg=%s", KVLOG_Q(strerror(-r)));
			return r;
		}
	} else {
		kvmem_host_init(&d->mem);
	}
	r = kvpool_new(&d->pool, &d->mem, &g, d->cap.pages);
	if (r) {
		KVLOG_ERR(&d->log, "kv_pool_error",
			  "backend=%s pages=%u page_bytes=%llu code=%d",
			  KVLOG_Q(d->cfg.kv_backend),
			  d->cap.pages, (unsigned long long)d->cap.page_bytes, r);
		return r < 0 ? r : -ENOMEM;
	}
	KVLOG_INFO(&d->log, "kv_pool_ready", "backend=%s pages=%u bytes=%llu",
		   KVLOG_Q(d->cfg.kv_backend), d->cap.pages,
		   (unsigned long long)d->cap.pages * d->cap.page_bytes);
	return daemon_open_cache(d, &g);
}

static void signal_cb(uv_signal_t *h, int signum)
{
	struct kvd_daemon *d = h->data;

	KVLOG_INFO(&d->log, "signal", "signal=%s state=%s",
		   signum == SIGTERM ? "TERM" : "INT", kvd_state_name(d->state));
	/* A second signal while draining means "now". */
	if (d->state == KVD_STATE_DRAINING || d->state == KVD_STATE_DRAINED ||
	    signum == SIGINT)
		kvd_daemon_stop(d);
	else
		kvd_daemon_drain_and_stop(d);
}

/* SIGHUP: what can be reloaded is the serving layer's (its hook). */
static void sighup_cb(uv_signal_t *h, int signum)
{
	struct kvd_daemon *d = h->data;

	(void)signum;
	if (d->reload.fn)
		d->reload.fn(d, d->reload.arg);
	else
		KVLOG_INFO(&d->log, "reload", "signal=HUP state=%s msg=\"nothing to reload: not serving\"",
			   kvd_state_name(d->state));
}

static int daemon_open_loop(struct kvd_daemon *d)
{
	int r;

	r = uv_loop_init(&d->loop);
	if (r < 0)
		return r;
	d->loop.data = d;
	uv_signal_init(&d->loop, &d->sigterm);
	uv_signal_init(&d->loop, &d->sigint);
	uv_signal_init(&d->loop, &d->sighup);
	uv_timer_init(&d->loop, &d->drain_timer);
	uv_timer_init(&d->loop, &d->watchdog_timer);
	d->sigterm.data = d;
	d->sigint.data = d;
	d->sighup.data = d;
	d->drain_timer.data = d;
	d->signals_open = true;
	d->timers_open = true;
	r = uv_signal_start(&d->sigterm, signal_cb, SIGTERM);
	if (r == 0)
		r = uv_signal_start(&d->sigint, signal_cb, SIGINT);
	if (r == 0)
		r = uv_signal_start(&d->sighup, sighup_cb, SIGHUP);
	return r;
}

/* A fingerprint from the cache is verified in full off the loop; the
 * node serves meanwhile (the sampled evidence already matched). */
static int daemon_fpcheck_start(struct kvd_daemon *d)
{
	int r;

	if (!d->fp.cached)
		return 0;
	r = fpcheck_start(&d->fpcheck, &d->loop, d->model->map, d->model->size,
			  d->model_sha256, daemon_fpcheck_done, d);
	if (r)
		KVLOG_ERR(&d->log, "model_error", "msg=\"cannot start the fingerprint check: %s\"",
			  strerror(-r));
	return r;
}

int kvd_daemon_init(struct kvd_daemon *d, const struct kvd_config *cfg)
{
	int r;

	memset(d, 0, sizeof(*d));
	d->cfg = *cfg;
	d->state = KVD_STATE_STARTING;
	d->start_ns = kvd_now_ns();
	kvlog_init(&d->log, cfg->log_level, 2, cfg->node_name);
	/* a SIGHUP while the model loads is dropped, not fatal; the loop's
	 * handler (daemon_open_loop) takes over */
	signal(SIGHUP, SIG_IGN);
	KVLOG_INFO(&d->log, "starting", "version=%s role=%s config=%s",
		   KVD_VERSION, kvd_role_name(cfg->role), KVLOG_Q(cfg->path));

	r = daemon_open_model(d);
	if (r)
		return r;
	kvd_daemon_capacity(d, "boot", NULL);
	if (!d->cap.ok && d->cfg.capacity_policy == KVD_CAP_REFUSE) {
		KVLOG_ERR(&d->log, "refuse_start",
			  "reason=capacity pool_tokens=%llu required_tokens=%llu",
			  (unsigned long long)d->cap.pool_tokens,
			  (unsigned long long)d->cap.required_tokens);
		return KVD_E_CAPACITY;
	}
	if (!d->cap.ok && d->cap.advertised_context == 0) {
		KVLOG_ERR(&d->log, "refuse_start",
			  "reason=capacity msg=\"pool holds no context even clamped\"");
		return KVD_E_CAPACITY;
	}
	if (!d->cap.ok)
		KVLOG_WARN(&d->log, "context_clamped",
			   "context_length=%u advertised_context=%u",
			   d->cap.context_length, d->cap.advertised_context);
	r = daemon_open_pool(d);
	if (r)
		return r;
	r = daemon_open_loop(d);
	if (r)
		return r;
	return daemon_fpcheck_start(d);
}

void kvd_daemon_ready(struct kvd_daemon *d)
{
	d->state = KVD_STATE_READY;
	KVLOG_INFO(&d->log, "ready", "role=%s advertised_context=%u",
		   kvd_role_name(d->cfg.role), d->cap.advertised_context);
#if KVD_HAVE_SYSTEMD
	sd_notifyf(0, "READY=1\nSTATUS=ready: %s, context %u, pool %llu tokens",
		   kvd_role_name(d->cfg.role), d->cap.advertised_context,
		   (unsigned long long)d->cap.pool_tokens);
#endif
	watchdog_start(d);
}

int kvd_daemon_on_stop(struct kvd_daemon *d,
		       void (*fn)(struct kvd_daemon *d, void *arg), void *arg)
{
	if (d->n_stop_hooks == KVD_ARRAY_SIZE(d->stop_hooks))
		return -ENOSPC;
	d->stop_hooks[d->n_stop_hooks].fn = fn;
	d->stop_hooks[d->n_stop_hooks].arg = arg;
	d->n_stop_hooks++;
	return 0;
}

/* ---- run and stop -------------------------------------------------------- */

int kvd_daemon_run(struct kvd_daemon *d)
{
	int r = uv_run(&d->loop, UV_RUN_DEFAULT);

	KVLOG_INFO(&d->log, "stopped", "exit_code=%d", d->exit_code);
	return r < 0 ? r : 0;
}

void kvd_daemon_stop(struct kvd_daemon *d)
{
	if (d->state == KVD_STATE_STOPPING)
		return;
	d->state = KVD_STATE_STOPPING;
	KVLOG_INFO(&d->log, "stopping", "in_flight=%u", d->in_flight);
#if KVD_HAVE_SYSTEMD
	sd_notify(0, "STOPPING=1");
#endif
	fpcheck_stop(d->fpcheck);
	d->fpcheck = NULL;
	while (d->n_stop_hooks > 0) {
		struct kvd_stop_hook *h = &d->stop_hooks[--d->n_stop_hooks];

		h->fn(d, h->arg);
	}
	if (d->signals_open) {
		uv_close((uv_handle_t *)&d->sigterm, NULL);
		uv_close((uv_handle_t *)&d->sigint, NULL);
		uv_close((uv_handle_t *)&d->sighup, NULL);
		d->signals_open = false;
	}
	if (d->timers_open) {
		uv_close((uv_handle_t *)&d->drain_timer, NULL);
		uv_close((uv_handle_t *)&d->watchdog_timer, NULL);
		d->timers_open = false;
	}
}

/* ---- the drain bound ------------------------------------------------------
 *
 * A drain (kvctl drain or SIGTERM) waits node.drain_timeout_ms for the
 * requests in flight to end on their own. Then every one still in flight
 * is aborted through its owner's normal failure path - decode: the abort
 * handshake, its pages fenced until prefill's ack or the connection's
 * end; prefill: abort to decode, pages back once no batch is queued - so
 * deferred release (invariant 2) holds, and the drain completes when
 * they are terminal. Those paths are bounded themselves (abort_ack and
 * release timeouts, heartbeats, and on prefill the send deadline, which
 * ends an aborted request whose batches a stalled peer never takes), so
 * a peer that never answers or never reads cannot hold a drain
 * (invariant 11). A SIGTERM drain stops the node after a last grace of
 * two release timeouts even if something still hangs (the engine).
 */
static void drain_stop_cb(uv_timer_t *t)
{
	struct kvd_daemon *d = t->data;

	KVLOG_WARN(&d->log, "drain_timeout", "in_flight=%u action=stop", d->in_flight);
	kvd_daemon_stop(d);
}

static void drain_deadline_cb(uv_timer_t *t)
{
	struct kvd_daemon *d = t->data;
	uint32_t n;

	if (d->state != KVD_STATE_DRAINING || d->in_flight == 0)
		return;
	KVLOG_WARN(&d->log, "drain_timeout",
		   "in_flight=%u action=abort drain_timeout_ms=%u", d->in_flight,
		   d->cfg.drain_timeout_ms);
	n = kvd_reqtab_abort_all(kvd_daemon_requests(d), "drain timeout");
	d->counters.drain_aborts += n;
	/* aborts may have ended everything, and a SIGTERM drain with it */
	if (d->state == KVD_STATE_DRAINING && d->stop_after_drain && d->timers_open)
		uv_timer_start(&d->drain_timer, drain_stop_cb,
			       2ull * d->cfg.release_timeout_ms, 0);
}

void kvd_daemon_drain_arm(struct kvd_daemon *d)
{
	if (d->timers_open && d->in_flight > 0)
		uv_timer_start(&d->drain_timer, drain_deadline_cb,
			       d->cfg.drain_timeout_ms, 0);
}

void kvd_daemon_drain_disarm(struct kvd_daemon *d)
{
	if (d->timers_open)
		uv_timer_stop(&d->drain_timer);
}

void kvd_daemon_drain_and_stop(struct kvd_daemon *d)
{
	if (d->state == KVD_STATE_STOPPING)
		return;
	d->state = KVD_STATE_DRAINING;
	d->exit_code = 0;
	kvd_daemon_notify_status(d, "draining: %u in flight", d->in_flight);
	if (d->in_flight == 0) {
		kvd_daemon_stop(d);
		return;
	}
	/* stop_after_drain: in_flight_changed stops us when it hits zero. */
	d->stop_after_drain = true;
	kvd_daemon_drain_arm(d);
}

void kvd_daemon_in_flight_changed(struct kvd_daemon *d)
{
	if (d->in_flight != 0)
		return;
	if (d->state == KVD_STATE_DRAINING) {
		kvd_daemon_drain_disarm(d);
		d->state = KVD_STATE_DRAINED;
		KVLOG_INFO(&d->log, "drained", "in_flight=0");
		kvd_daemon_notify_status(d, "drained");
	}
	if (d->stop_after_drain)
		kvd_daemon_stop(d);
}

struct kvd_reqtab *kvd_daemon_requests(struct kvd_daemon *d)
{
	if (!d->requests.d) {
		kvd_reqtab_init(&d->requests, d);
		d->requests.on_end = kvd_daemon_in_flight_changed;
	}
	return &d->requests;
}

void kvd_daemon_deinit(struct kvd_daemon *d)
{
	if (d->signals_open || d->timers_open) {
		/* init failed after the loop was built: close, then drain. */
		kvd_daemon_stop(d);
	}
	if (d->loop.data) {
		uv_run(&d->loop, UV_RUN_DEFAULT);
		uv_loop_close(&d->loop);
		d->loop.data = NULL;
	}
	kvd_reqtab_deinit(&d->requests);
	pcache_free(d->cache);
	d->cache = NULL;
	if (d->pool) {
		kvpool_free(d->pool);
		d->pool = NULL;
	}
	if (d->mem.ops) {
		kvmem_deinit(&d->mem);
		d->mem.ops = NULL;
	}
	if (d->model) {
		gguf_close(d->model);
		d->model = NULL;
	}
}
