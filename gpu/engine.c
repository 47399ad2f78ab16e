/* engine.c - scheduling requests over the backend, pages through the pool.
 *
 * A request is a token array (prompt, then outputs) and two counters:
 * n_tokens, the tokens known, and n_kv, the positions whose K/V are in its
 * pages. A request with n_tokens - n_kv > 1 is reading its prompt; one
 * with exactly one token ahead of its KV is decoding (that token is the
 * last one sampled). Each step:
 *
 *   1. choose: the first max_batch running requests in submit order;
 *      decoding ones take one token each, prompt readers a chunk of up to
 *      prefill_chunk tokens. The step's token budget (step_tokens, by
 *      default max_batch + prefill_chunk) is filled decoders first, then
 *      prompts oldest first. Since step_tokens >= max_batch, every
 *      decoding request gets its token in every step and every prompt
 *      reader at least one token: a running generation waits at most one
 *      step of at most step_tokens tokens between two tokens however many
 *      prompts arrive (the inter-token bound), and prompts are served in
 *      arrival order, none starved (the TTFT policy: under load TTFT grows
 *      with the prompt tokens queued ahead, by the budget left after the
 *      decoders per step);
 *   2. check: for each chosen request, verify its table for the positions
 *      already written (kvpool_verify: ownership, generation, coverage and
 *      the tags in page memory - invariant 1), write the tags for the
 *      positions this step adds, and verify again; a failure ends only
 *      that request, with ENGINE_E_INTEGRITY;
 *   3. compute: one backend forward over the whole batch, logits for the
 *      requests whose chunk reaches their last known token;
 *   4. sample the token at position n_tokens with (seed, position), emit
 *      it, and finish the request on EOS, max_tokens, a full context or
 *      prefill_only.
 *
 * Nothing in 1-4 lets one request's numbers depend on another's: the
 * backend is row-independent and the sampler is keyed by position. So a
 * batch of eight gives each request the tokens it gets alone.
 *
 * Pages the engine reserved are released when the caller frees the
 * request, never earlier, so the caller decides when nothing can still
 * write into them (invariant 2): a transfer reading a prefill-only
 * request's pages, for instance, finishes before engine_req_free.
 */
#include "gpu/engine.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "conf/util.h"
#include "gpu/backend.h"
#include "gpu/model/model.h"
#include "gpu/cpu/ops_info.h"
#include "gpu/kv/pcache.h"
#include "gpu/model/prepack.h"
#include "gpu/cpu/stepcost.h"
#include "gpu/cpu/threadpool.h"

struct engine_req {
	struct engine_req *prev, *next;  /* submit order */
	uint64_t owner;
	void *user;
	int32_t *tokens;                 /* (n_prompt + max_tokens) prompt, then outputs */
	uint32_t n_prompt;
	uint32_t n_tokens;               /* tokens known */
	uint32_t n_kv;                   /* positions with K/V in the pages */
	uint32_t max_tokens;
	uint32_t n_output;
	struct sampler_params sp;        /* sp.logit_bias: bias */
	struct sampler_bias *bias;       /* (sp.n_logit_bias) own copy */
	struct engine_constraint cons;   /* ctx NULL: none */
	bool prefill_only;
	bool ignore_eos;
	bool own_pages;                  /* reserved by the engine: release on free */
	bool integrity_bad;              /* quarantine own pages on free */
	struct kvpool_ref *table;        /* (n_table) [0, map.n): mapped
					  * cached pages, then its own */
	uint32_t n_table;
	struct pcache_map map;           /* cached prompt pages it maps */
	struct pcache_key key;           /* with use_cache: whose cache */
	bool use_cache;
	uint32_t n_reused;               /* prompt tokens read from the cache */
	uint8_t **pages;                 /* (n_table) host address of each page */
	enum engine_finish finish;
	int error;
};

struct engine {
	const struct model *m;
	struct kvpool *pool;
	struct engine_params p;
	struct kvlog *log;
	struct backend be;
	uint32_t n_ctx;
	uint32_t max_step_tokens;        /* step_tokens, or max_batch + prefill_chunk */
	uint32_t last_seq, last_tok, last_dec; /* what the last step computed */
	uint32_t last_budget;            /* prompt tokens step_us allowed */
	struct stepcost cost;            /* learned step time (step_us) */
	uint64_t *k_off;                 /* (n_layer) K block offset in a page */
	uint64_t *v_off;                 /* (n_layer) */

	struct engine_req *head, *tail;
	uint32_t n_reqs;                 /* submitted, not freed */
	uint32_t n_running;              /* finish == NONE */

	/* step scratch */
	struct engine_req **b_req;       /* (max_batch) requests of the step */
	uint32_t *b_chunk;               /* (max_batch) tokens each adds */
	struct backend_seq *b_seqs;      /* (max_batch) */
	int32_t *b_tok;                  /* (max_step_tokens) */
	uint32_t *b_pos;                 /* (max_step_tokens) */
	uint32_t *b_seq;                 /* (max_step_tokens) */
	uint32_t *b_out;                 /* (max_batch) batch index of logits rows */
	uint32_t *b_out_seq;             /* (max_batch) seq of each logits row */
	float *logits;                   /* (max_batch, n_vocab) */
	struct engine_event *ev;         /* (2 * max_batch) */
	struct sampler_logprobs *lp;     /* (max_batch) the step's token events' */
	uint32_t n_lp;
	size_t n_ev;
	struct sampler smp;

	/* where step time goes: integrity checks vs the whole step */
	uint64_t integrity_ns;
	uint64_t step_ns;
	uint64_t sample_ns;
};

/* ---- names ---------------------------------------------------------------- */

const char *engine_finish_name(enum engine_finish f)
{
	switch (f) {
	case ENGINE_FINISH_NONE: return "none";
	case ENGINE_FINISH_STOP: return "stop";
	case ENGINE_FINISH_LENGTH: return "length";
	case ENGINE_FINISH_PREFILLED: return "prefilled";
	case ENGINE_FINISH_CANCELLED: return "cancelled";
	case ENGINE_FINISH_ERROR: return "error";
	}
	return "?";
}

const char *engine_strerror(int code)
{
	switch (code) {
	case 0: return "ok";
	case ENGINE_E_TOO_LONG: return "prompt plus max_tokens exceeds the context length";
	case ENGINE_E_INVALID: return "invalid request";
	case ENGINE_E_INTEGRITY: return "KV page integrity check failed";
	case ENGINE_E_GEOMETRY: return "KV pool geometry does not fit the model";
	case ENGINE_E_MEMORY: return "KV pool memory is not addressable by this compute backend";
	case ENGINE_E_BUSY: return "too many requests";
	case ENGINE_E_FULL: return "KV pool full";
	case ENGINE_E_POOL: return "the KV pool refused an operation on fresh pages";
	}
	if (code < 0)
		return strerror(-code);
	return "unknown error";
}

/* ---- lifecycle ------------------------------------------------------------- */

/* The step time model's weights: multiply-adds of a token through the
 * layers against those of one logits row. */
static void engine_cost_init(struct engine *e)
{
	const struct model *m = e->m;
	uint64_t layer = 0;

	for (uint32_t l = 0; l < m->hp.n_layer; l++) {
		const struct model_layer *L = &m->layers[l];
		const struct ops_mat *w[] = { &L->wq, &L->wk, &L->wv, &L->wo,
					      &L->w_gate, &L->w_up, &L->w_down };

		for (size_t i = 0; i < sizeof(w) / sizeof(w[0]); i++)
			layer += (uint64_t)w[i]->rows * w[i]->cols;
	}
	stepcost_init(&e->cost, layer, (uint64_t)m->output.rows * m->output.cols);
	e->last_budget = UINT32_MAX;
}

/* The parameters, and the pool against the model: ENGINE_E_INVALID,
 * ENGINE_E_GEOMETRY (layers, KV width, dtype), ENGINE_E_MEMORY (pages
 * the CPU cannot address), or 0. */
static int engine_check(const struct model *m, struct kvpool *pool,
			const struct engine_params *p)
{
	const struct llama_hparams *hp = &m->hp;
	const struct kvpool_geom *g = kvpool_geom(pool);

	if (p->threads < 1 || p->max_batch < 1 || p->prefill_chunk < 1 ||
	    (p->step_tokens && p->step_tokens < p->max_batch))
		return ENGINE_E_INVALID;
	if (g->n_layer != hp->n_layer || g->kv_dim != hp->n_head_kv * hp->head_dim ||
	    (g->dtype != KV_DTYPE_F32 && g->dtype != KV_DTYPE_F16))
		return ENGINE_E_GEOMETRY;
	/* The CPU backend reads and writes page bytes directly: device
	 * memory needs the CUDA backend. */
	if (!kvpool_host_visible(pool))
		return ENGINE_E_MEMORY;
	return 0;
}

/* The layers' block offsets and the step scratch, for max_batch
 * requests and max_step_tokens tokens. 0, or -ENOMEM (engine_free
 * frees what was allocated). */
static int engine_alloc(struct engine *e)
{
	uint32_t B = e->p.max_batch, n_layer = e->m->hp.n_layer;

	e->k_off = calloc(n_layer, sizeof(*e->k_off));
	e->v_off = calloc(n_layer, sizeof(*e->v_off));
	e->b_req = calloc(B, sizeof(*e->b_req));
	e->b_chunk = calloc(B, sizeof(*e->b_chunk));
	e->b_seqs = calloc(B, sizeof(*e->b_seqs));
	e->b_tok = calloc(e->max_step_tokens, sizeof(*e->b_tok));
	e->b_pos = calloc(e->max_step_tokens, sizeof(*e->b_pos));
	e->b_seq = calloc(e->max_step_tokens, sizeof(*e->b_seq));
	e->b_out = calloc(B, sizeof(*e->b_out));
	e->b_out_seq = calloc(B, sizeof(*e->b_out_seq));
	e->logits = calloc((size_t)B * e->m->hp.n_vocab, sizeof(*e->logits));
	e->ev = calloc(2 * (size_t)B, sizeof(*e->ev));
	e->lp = calloc(B, sizeof(*e->lp));
	if (!e->lp || !e->k_off || !e->v_off || !e->b_req || !e->b_chunk || !e->b_seqs ||
	    !e->b_tok || !e->b_pos || !e->b_seq || !e->b_out || !e->b_out_seq ||
	    !e->logits || !e->ev)
		return -ENOMEM;
	return 0;
}

/* True when the repack cache's outcome is worth a warning: a cache file
 * refused or a store that failed (the next start packs again). */
static bool pack_info_warns(const struct prepack_info *pi)
{
	return !strcmp(pi->store, "error") || !strcmp(pi->lookup, "unsafe_dir") ||
	       !strcmp(pi->lookup, "unsafe_entry") || !strcmp(pi->lookup, "corrupt") ||
	       !strcmp(pi->lookup, "truncated") || !strcmp(pi->lookup, "content") ||
	       !strcmp(pi->lookup, "io_error") || !strcmp(pi->lookup, "dir_error");
}

/* The CPU backend over the model and the pool's page layout, with the
 * repack cache e->p names, and the pack_cache line on what the cache
 * did. 0, or the backend's error. */
static int engine_start_backend(struct engine *e)
{
	const struct engine_params *p = &e->p;
	const struct kvpool_geom *g = kvpool_geom(e->pool);
	struct backend_kv_layout lay;
	struct backend_cpu_params cp;
	const struct prepack_info *pi;
	uint64_t t0;
	int rc;

	for (uint32_t l = 0; l < e->m->hp.n_layer; l++) {
		e->k_off[l] = kvpool_block_offset(e->pool, l, 0);
		e->v_off[l] = kvpool_block_offset(e->pool, l, 1);
	}
	lay = (struct backend_kv_layout){ .page_tokens = g->page_tokens,
					  .dtype = g->dtype, .k_off = e->k_off,
					  .v_off = e->v_off };
	cp = (struct backend_cpu_params){ .threads = p->threads,
					  .max_tokens = e->max_step_tokens,
					  .max_ctx = e->n_ctx, .simd = p->simd,
					  .pack_dir = p->pack_dir,
					  .model_sha256 = p->model_sha256,
					  .pack_clean = p->pack_clean,
					  .pack_keep_days = p->pack_keep_days,
					  .pack_log = e->log,
					  .prof_cpu = p->prof_cpu };
	t0 = kvd_now_ns();
	rc = backend_cpu_new(&e->be, e->m, &lay, &cp);
	if (rc)
		return rc;
	pi = backend_cpu_pack_info(&e->be);
	KVLOG(e->log, pack_info_warns(pi) ? KVLOG_WARN : KVLOG_INFO, "pack_cache",
	      "lookup=%s store=%s hold=%s errno=%d mapped=%u packed=%u bytes=%llu ms=%.1f removed=%u freed=%llu in_use=%u",
	      pi->lookup, pi->store, pi->hold, pi->err, pi->mapped, pi->packed,
	      (unsigned long long)pi->bytes, (double)(kvd_now_ns() - t0) / 1e6,
	      pi->clean.removed, (unsigned long long)pi->clean.freed,
	      pi->clean.in_use);
	return 0;
}

int engine_new(struct engine **out, const struct model *m,
	       struct kvpool *pool, const struct engine_params *p,
	       struct kvlog *log)
{
	const struct llama_hparams *hp = &m->hp;
	const struct kvpool_geom *g = kvpool_geom(pool);
	struct engine *e;
	uint32_t B;
	int rc;

	rc = engine_check(m, pool, p);
	if (rc)
		return rc;
	e = calloc(1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	e->m = m;
	e->pool = pool;
	e->p = *p;
	e->log = log;
	e->n_ctx = p->n_ctx ? p->n_ctx : hp->n_ctx_train;
	B = p->max_batch;
	e->max_step_tokens = p->step_tokens ? p->step_tokens : B + p->prefill_chunk;
	engine_cost_init(e);
	rc = engine_alloc(e);
	if (!rc)
		rc = sampler_init(&e->smp, hp->n_vocab);
	if (!rc)
		rc = engine_start_backend(e);
	if (rc) {
		engine_free(e);
		return rc;
	}
	KVLOG_INFO(log, "engine_ready",
		   "backend=cpu kernels=%s threads=%u max_batch=%u prefill_chunk=%u step_tokens=%u n_ctx=%u page_tokens=%u kv_dtype=%s",
		   backend_cpu_kernels(&e->be), p->threads, B, p->prefill_chunk,
		   e->max_step_tokens,
		   e->n_ctx, g->page_tokens, kv_dtype_name(g->dtype));
	*out = e;
	return 0;
}

void engine_free(struct engine *e)
{
	if (!e)
		return;
	while (e->head)
		engine_req_free(e, e->head);
	backend_deinit(&e->be);
	sampler_deinit(&e->smp);
	free(e->k_off);
	free(e->v_off);
	free(e->b_req);
	free(e->b_chunk);
	free(e->b_seqs);
	free(e->b_tok);
	free(e->b_pos);
	free(e->b_seq);
	free(e->b_out);
	free(e->b_out_seq);
	free(e->logits);
	free(e->ev);
	free(e->lp);
	free(e);
}

const char *engine_kernels(const struct engine *e)
{
	return backend_cpu_kernels(&e->be);
}

void engine_last_budget(const struct engine *e, uint32_t *prompt_budget,
			double *ns_per_unit)
{
	*prompt_budget = e->last_budget;
	*ns_per_unit = e->cost.ns_per_unit;
}

void engine_last_step(const struct engine *e, uint32_t *n_seq,
		      uint32_t *n_tok, uint32_t *n_decode)
{
	*n_seq = e->last_seq;
	*n_tok = e->last_tok;
	*n_decode = e->last_dec;
}

void engine_pool_stats(const struct engine *e, struct engine_pool_stats *out)
{
	struct threadpool_stats st;

	backend_cpu_pool_stats(&e->be, &st);
	*out = (struct engine_pool_stats){
		.runs = st.runs, .wakes = st.wakes, .wait_ns = st.wait_ns };
}

const char *engine_kernel_variant(const struct engine *e, enum ggml_type t)
{
	return ops_kernel_variant(backend_cpu_kernel_table(&e->be), t);
}

const struct prepack_info *engine_pack_info(const struct engine *e)
{
	return backend_cpu_pack_info(&e->be);
}

/* ---- requests -------------------------------------------------------------- */

static void req_destroy(struct engine_req *r)
{
	free(r->bias);
	free(r->tokens);
	free(r->table);
	free(r->pages);
	free(r);
}

static int req_check(const struct engine *e, const struct engine_req_params *rp)
{
	uint32_t n_vocab = e->m->hp.n_vocab;

	if (!rp->prompt || rp->n_prompt == 0 || rp->max_tokens == 0)
		return ENGINE_E_INVALID;
	for (uint32_t i = 0; i < rp->n_prompt; i++)
		if (rp->prompt[i] < 0 || (uint32_t)rp->prompt[i] >= n_vocab)
			return ENGINE_E_INVALID;
	if ((uint64_t)rp->n_prompt + rp->max_tokens > e->n_ctx)
		return ENGINE_E_TOO_LONG;
	if (rp->table && (rp->n_cached >= rp->n_prompt || rp->n_table == 0))
		return ENGINE_E_INVALID;
	if (!rp->table && rp->n_cached)
		return ENGINE_E_INVALID;
	if (rp->sampling.n_logit_bias > SAMPLER_BIAS_MAX ||
	    (rp->sampling.n_logit_bias && !rp->sampling.logit_bias) ||
	    rp->sampling.top_logprobs > SAMPLER_TOP_LOGPROBS_MAX)
		return ENGINE_E_INVALID;
	if (e->p.max_requests && e->n_reqs >= e->p.max_requests)
		return ENGINE_E_BUSY;
	return 0;
}

/* Release (or quarantine) the pages the engine reserved for r, and give
 * back the cached pages it maps (poisoned after an integrity failure). */
static int req_release_own(struct engine *e, struct engine_req *r, bool bad)
{
	uint32_t first = r->map.n;
	int rc = 0;

	if (r->own_pages && r->n_table > first)
		rc = bad ? kvpool_quarantine(e->pool, r->owner, r->table + first,
					     r->n_table - first)
			 : kvpool_release(e->pool, r->owner, r->table + first,
					  r->n_table - first);
	r->own_pages = false;
	if (e->p.cache)
		pcache_release(e->p.cache, &r->map, bad);
	return rc;
}

/* The engine's own pages for r: the cached pages its prompt starts with
 * (same tenant and salt: rp->cache_key), at most all but the last prompt
 * token's page, mapped; the rest reserved and FILLING. */
static int req_reserve(struct engine *e, struct engine_req *r,
		       const struct engine_req_params *rp)
{
	uint32_t pt = kvpool_geom(e->pool)->page_tokens;
	uint32_t n_own;
	int rc;

	if (e->p.cache && rp->cache_key) {
		r->key = *rp->cache_key;
		r->use_cache = true;
		rc = pcache_lookup(e->p.cache, &r->key, rp->prompt, rp->n_prompt,
				   (rp->n_prompt - 1) / pt, &r->map);
		if (rc)
			return rc;
		if (r->map.n)
			memcpy(r->table, r->map.refs,
			       r->map.n * sizeof(*r->table));
		r->n_kv = r->map.n * pt;
		r->n_reused = r->n_kv;
	}
	n_own = r->n_table - r->map.n;
	/* cached pages nobody maps go first when the pool is short: the
	 * cache never fails a request that would fit without it */
	rc = pcache_pool_reserve(e->p.cache, e->pool, r->owner, n_own,
				 r->table + r->map.n);
	if (!rc) {
		r->own_pages = true;
		rc = kvpool_fill_begin(e->pool, r->owner, r->table + r->map.n,
				       n_own);
	}
	if (rc)
		req_release_own(e, r, false);
	return rc;
}

/* The step that computed r's last prompt token: its full prompt pages
 * are cached now, so the next request of its tenant and salt maps them
 * while r still generates (r holds them as if it had mapped them). */
static void req_cache_prompt(struct engine *e, struct engine_req *r)
{
	uint32_t pt = kvpool_geom(e->pool)->page_tokens;

	if (!e->p.cache || !r->use_cache || !r->own_pages || r->integrity_bad)
		return;
	if (pcache_adopt_held(e->p.cache, &r->key, r->tokens, r->owner,
			      r->table, &r->map, r->n_prompt / pt) < 0)
		KVLOG_WARN(e->log, "engine_cache_skipped",
			   "owner=%llu reason=no_memory",
			   (unsigned long long)r->owner);
}

/* A finished prompt's full pages it computed itself go to the cache;
 * then everything else is released. */
static int req_cache_and_release(struct engine *e, struct engine_req *r)
{
	uint32_t pt = kvpool_geom(e->pool)->page_tokens;
	uint32_t n_full = KVD_MIN(r->n_kv, r->n_prompt) / pt;
	uint32_t first = r->map.n, kept = first;
	bool *taken;
	int rc = 0;

	if (!r->use_cache || !r->own_pages || r->integrity_bad ||
	    r->finish == ENGINE_FINISH_ERROR || n_full <= first)
		return req_release_own(e, r, r->integrity_bad);
	taken = calloc(r->n_table, sizeof(*taken));
	if (!taken || !pcache_insert(e->p.cache, &r->key, r->tokens, r->owner,
				     r->table, first, n_full, taken)) {
		free(taken);
		return req_release_own(e, r, false);
	}
	/* the adopted pages are the cache's now: release the others */
	for (uint32_t i = first; i < r->n_table; i++)
		if (!taken[i])
			r->table[kept++] = r->table[i];
	free(taken);
	if (kept > first)
		rc = kvpool_release(e->pool, r->owner, r->table + first,
				    kept - first);
	r->own_pages = false;
	pcache_release(e->p.cache, &r->map, false);
	return rc;
}

int engine_submit(struct engine *e, const struct engine_req_params *rp,
		  struct engine_req **out)
{
	struct engine_req *r;
	uint32_t kv_max, need;
	int rc;

	rc = req_check(e, rp);
	if (rc)
		return rc;
	/* positions that will ever hold K/V: the last output's never does */
	kv_max = rp->prefill_only ? rp->n_prompt : rp->n_prompt + rp->max_tokens - 1;
	need = kvpool_pages_for(e->pool, kv_max);
	if (rp->table && rp->n_table < need)
		return ENGINE_E_INVALID;
	r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	r->owner = rp->owner;
	r->user = rp->user;
	r->n_prompt = rp->n_prompt;
	r->n_tokens = rp->n_prompt;
	r->n_kv = rp->n_cached;
	r->max_tokens = rp->max_tokens;
	r->sp = rp->sampling;
	if (r->sp.n_logit_bias) {
		r->bias = malloc(sizeof(*r->bias) * r->sp.n_logit_bias);
		if (!r->bias) {
			req_destroy(r);
			return -ENOMEM;
		}
		memcpy(r->bias, rp->sampling.logit_bias,
		       sizeof(*r->bias) * r->sp.n_logit_bias);
		r->sp.logit_bias = r->bias;
	}
	r->cons = rp->constraint;
	r->prefill_only = rp->prefill_only;
	r->ignore_eos = rp->ignore_eos;
	r->n_table = rp->table ? rp->n_table : need;
	r->tokens = calloc((size_t)rp->n_prompt + rp->max_tokens, sizeof(*r->tokens));
	r->table = calloc(r->n_table, sizeof(*r->table));
	r->pages = calloc(r->n_table, sizeof(*r->pages));
	if (!r->tokens || !r->table || !r->pages) {
		req_destroy(r);
		return -ENOMEM;
	}
	memcpy(r->tokens, rp->prompt, (size_t)rp->n_prompt * sizeof(*r->tokens));
	if (rp->table)
		memcpy(r->table, rp->table, r->n_table * sizeof(*r->table));
	else if ((rc = req_reserve(e, r, rp)) != 0) {
		req_destroy(r);
		/* the pool's codes end here */
		return rc == KVPOOL_E_FULL ? ENGINE_E_FULL : rc > 0 ? ENGINE_E_POOL : rc;
	}
	for (uint32_t i = 0; i < r->n_table; i++) {
		r->pages[i] = kvpool_page_addr(e->pool, r->table[i].page);
		if (!r->pages[i]) {
			req_release_own(e, r, false);
			req_destroy(r);
			return ENGINE_E_INVALID;
		}
	}
	r->prev = e->tail;
	if (e->tail)
		e->tail->next = r;
	else
		e->head = r;
	e->tail = r;
	e->n_reqs++;
	e->n_running++;
	*out = r;
	return 0;
}

static void req_finish(struct engine *e, struct engine_req *r,
		       enum engine_finish f, int error)
{
	if (r->finish != ENGINE_FINISH_NONE)
		return;
	r->finish = f;
	r->error = error;
	e->n_running--;
}

void engine_req_cancel(struct engine *e, struct engine_req *r)
{
	req_finish(e, r, ENGINE_FINISH_CANCELLED, 0);
}

void engine_req_free(struct engine *e, struct engine_req *r)
{
	int rc = 0;

	req_finish(e, r, ENGINE_FINISH_CANCELLED, 0);
	rc = req_cache_and_release(e, r);
	if (rc)
		KVLOG_ERR(e->log, "engine_release_failed",
			  "owner=%llu pages=%u rc=%d",
			  (unsigned long long)r->owner, r->n_table, rc);
	if (r->prev)
		r->prev->next = r->next;
	else
		e->head = r->next;
	if (r->next)
		r->next->prev = r->prev;
	else
		e->tail = r->prev;
	e->n_reqs--;
	req_destroy(r);
}

bool engine_idle(const struct engine *e)
{
	return e->n_running == 0;
}

uint32_t engine_running(const struct engine *e)
{
	return e->n_running;
}

const int32_t *engine_req_tokens(const struct engine_req *r, uint32_t *n)
{
	if (n)
		*n = r->n_tokens;
	return r->tokens;
}

uint32_t engine_req_n_prompt(const struct engine_req *r)
{
	return r->n_prompt;
}

uint32_t engine_req_n_output(const struct engine_req *r)
{
	return r->n_output;
}

enum engine_finish engine_req_finish(const struct engine_req *r, int *error)
{
	if (error)
		*error = r->error;
	return r->finish;
}

bool engine_req_integrity_bad(const struct engine_req *r)
{
	return r->integrity_bad;
}

const uint64_t *engine_req_mapped(const struct engine_req *r, uint32_t *n)
{
	*n = r->map.n;
	return r->map.n ? r->map.ids : NULL;
}

uint32_t engine_req_cached(const struct engine_req *r)
{
	return r->n_reused;
}

uint64_t engine_req_owner(const struct engine_req *r)
{
	return r->owner;
}

const struct kvpool_ref *engine_req_table(const struct engine_req *r,
					  uint32_t *n_table, uint32_t *n_kv)
{
	if (n_table)
		*n_table = r->n_table;
	if (n_kv)
		*n_kv = r->n_kv;
	return r->table;
}

/* ---- a step ------------------------------------------------------------------ */

static void ev_push(struct engine *e, enum engine_event_kind kind,
		    struct engine_req *r, int32_t token, uint32_t pos)
{
	e->ev[e->n_ev++] = (struct engine_event){
		.kind = kind, .req = r, .owner = r->owner, .user = r->user,
		.token = token,
		.pos = pos, .finish = r->finish, .error = r->error };
}

static void req_fail(struct engine *e, struct engine_req *r, int error)
{
	req_finish(e, r, ENGINE_FINISH_ERROR, error);
	ev_push(e, ENGINE_EV_DONE, r, -1, r->n_tokens);
}

/* Step 2: the pages this step reads and writes belong to r, in this
 * generation, with tags that say so. */
static int req_check_pages(struct engine *e, struct engine_req *r,
			   uint32_t n_after)
{
	uint32_t bad = UINT32_MAX;
	const char *what = "verify";
	int rc = 0;

	if (r->n_kv > 0)
		rc = kvpool_verify_mapped(e->pool, r->owner, r->map.ids, r->map.n,
					  r->table, kvpool_pages_for(e->pool, r->n_kv),
					  r->n_kv, &bad);
	if (!rc) {
		/* never a mapped page: only the request's own are written */
		what = "tag_write";
		rc = kvpool_tag_write_from(e->pool, r->owner, r->table, r->map.n,
					   kvpool_pages_for(e->pool, n_after), n_after);
	}
	if (!rc) {
		what = "verify_after";
		rc = kvpool_verify_mapped(e->pool, r->owner, r->map.ids, r->map.n,
					  r->table, kvpool_pages_for(e->pool, n_after),
					  n_after, &bad);
	}
	if (rc) {
		KVLOG_WARN(e->log, "engine_integrity",
			   "owner=%llu check=%s rc=%d bad_index=%d n_kv=%u tokens=%u",
			   (unsigned long long)r->owner, what, rc,
			   bad == UINT32_MAX ? -1 : (int)bad, r->n_kv, n_after);
		r->integrity_bad = true;
	}
	return rc;
}

uint32_t engine_prompt_budget(const struct engine_params *p,
			      uint32_t max_step_tokens,
			      const struct stepcost *cost, uint32_t n_dec)
{
	uint32_t left = max_step_tokens > n_dec ? max_step_tokens - n_dec : 0, b;

	if (!p->step_us || n_dec == 0)
		return left;
	b = stepcost_prompt_budget(cost, n_dec, (uint64_t)p->step_us * 1000u);
	/* prompts always progress */
	b = KVD_MAX(b, KVD_MIN(ENGINE_STEP_MIN_PROMPT, p->prefill_chunk));
	return KVD_MIN(left, b);
}

void engine_step_cost(const struct engine *e, struct stepcost *out)
{
	*out = e->cost;
}

/* Step 1: choose the requests and their chunks; returns how many.
 * Decoders first (one token each), then prompt readers, both in submit
 * order, within step_tokens; prompts also within step_us's budget. */
static uint32_t step_choose(struct engine *e)
{
	uint32_t n = 0, n_dec = 0, budget = e->max_step_tokens;

	for (int pass = 0; pass < 2; pass++) {
		if (pass == 1) {
			e->last_budget = e->p.step_us && n_dec ?
				engine_prompt_budget(&e->p, e->max_step_tokens,
						     &e->cost, n_dec) : UINT32_MAX;
			budget = KVD_MIN(budget, e->last_budget);
		}
		for (struct engine_req *r = e->head; r && n < e->p.max_batch; r = r->next) {
			uint32_t ahead = r->n_tokens - r->n_kv, chunk;

			if (r->finish != ENGINE_FINISH_NONE || budget == 0 ||
			    (pass == 0) != (ahead == 1))
				continue;
			chunk = KVD_MIN(KVD_MIN(ahead, e->p.prefill_chunk), budget);
			e->b_req[n] = r;
			e->b_chunk[n] = chunk;
			budget -= chunk;
			n_dec += pass == 0;
			n++;
		}
	}
	return n;
}

/* Step 4: the sampled token for r (logits row j). */
static void req_take_token(struct engine *e, struct engine_req *r,
			   float *logits)
{
	uint32_t pos = r->n_tokens;
	struct sampler_hist h = { .tokens = r->tokens, .n_tokens = r->n_tokens,
				  .n_prompt = r->n_prompt };
	struct sampler_logprobs *lp = r->sp.logprobs ? &e->lp[e->n_lp++] : NULL;
	int32_t tok = e->m->eos_id;

	/* a constraint masks the engine's own logits row in place */
	if (!r->cons.ctx || r->cons.mask(r->cons.ctx, logits, e->m->hp.n_vocab))
		tok = (int32_t)sampler_choose(&e->smp, &r->sp, pos, logits, &h, lp);
	if (r->cons.ctx && tok != e->m->eos_id && !r->cons.accept(r->cons.ctx, tok))
		tok = e->m->eos_id;

	if (tok == e->m->eos_id && (!r->ignore_eos || tok < 0)) {
		req_finish(e, r, ENGINE_FINISH_STOP, 0);
		ev_push(e, ENGINE_EV_DONE, r, -1, pos);
		return;
	}
	r->tokens[r->n_tokens++] = tok;
	r->n_output++;
	ev_push(e, ENGINE_EV_TOKEN, r, tok, pos);
	e->ev[e->n_ev - 1].lp = lp;
	if (r->prefill_only)
		req_finish(e, r, ENGINE_FINISH_PREFILLED, 0);
	else if (r->n_output >= r->max_tokens || r->n_tokens >= e->n_ctx)
		req_finish(e, r, ENGINE_FINISH_LENGTH, 0);
	if (r->finish != ENGINE_FINISH_NONE)
		ev_push(e, ENGINE_EV_DONE, r, -1, pos);
}

/* Steps 2 and 3's input: check the pages of the n_req chosen requests
 * (one whose check fails is failed and left out) and lay the others out
 * in the step scratch, their tokens, positions and logits rows, as
 * *batch; e->last_seq, last_tok and last_dec say what it holds. Returns
 * its number of sequences. */
static uint32_t step_gather(struct engine *e, uint32_t n_req,
			    struct backend_batch *batch)
{
	uint32_t n_seq = 0, n_tok = 0, n_out = 0, n_dec = 0;
	uint64_t t_check;
	int rc;

	for (uint32_t i = 0; i < n_req; i++) {
		struct engine_req *r = e->b_req[i];
		uint32_t n_after = r->n_kv + e->b_chunk[i];

		t_check = kvd_now_ns();
		rc = req_check_pages(e, r, n_after);
		e->integrity_ns += kvd_now_ns() - t_check;
		if (rc) {
			req_fail(e, r, ENGINE_E_INTEGRITY);
			continue;
		}
		n_dec += r->n_tokens - r->n_kv == 1;
		e->b_req[n_seq] = r;
		e->b_seqs[n_seq] = (struct backend_seq){
			.pages = r->pages, .n_pages = r->n_table, .n_kv = n_after };
		for (uint32_t p = r->n_kv; p < n_after; p++) {
			e->b_tok[n_tok] = r->tokens[p];
			e->b_pos[n_tok] = p;
			e->b_seq[n_tok] = n_seq;
			n_tok++;
		}
		if (n_after == r->n_tokens) {
			e->b_out[n_out] = n_tok - 1;
			e->b_out_seq[n_out] = n_seq;
			n_out++;
		}
		n_seq++;
	}
	e->last_seq = n_seq;
	e->last_tok = n_tok;
	e->last_dec = n_dec;
	*batch = (struct backend_batch){
		.n_tokens = n_tok, .tokens = e->b_tok, .pos = e->b_pos,
		.seq = e->b_seq, .seqs = e->b_seqs, .n_seqs = n_seq,
		.out = e->b_out, .n_out = n_out };
	return n_seq;
}

int engine_step(struct engine *e, const struct engine_event **ev,
		size_t *n_ev)
{
	uint32_t n_seq, n_tok, n_out;
	struct backend_batch batch;
	uint64_t t_step = kvd_now_ns(), t_check;
	int rc;

	e->n_ev = 0;
	e->n_lp = 0;
	*ev = e->ev;
	*n_ev = 0;
	n_seq = step_gather(e, step_choose(e), &batch);
	if (n_seq == 0) {
		*n_ev = e->n_ev;
		return 0;
	}
	n_tok = batch.n_tokens;
	n_out = batch.n_out;
	rc = backend_forward(&e->be, &batch, e->logits);
	if (rc) {
		KVLOG_ERR(e->log, "engine_forward_failed", "rc=%d tokens=%u seqs=%u",
			  rc, n_tok, n_seq);
		for (uint32_t s = 0; s < n_seq; s++)
			req_fail(e, e->b_req[s], rc);
		*n_ev = e->n_ev;
		return rc;
	}
	for (uint32_t s = 0; s < n_seq; s++) {
		struct engine_req *r = e->b_req[s];
		bool prompt_done = r->n_kv < r->n_prompt &&
				   e->b_seqs[s].n_kv >= r->n_prompt;

		r->n_kv = e->b_seqs[s].n_kv;
		if (prompt_done)
			req_cache_prompt(e, r);
	}
	t_check = kvd_now_ns();
	for (uint32_t j = 0; j < n_out; j++)
		req_take_token(e, e->b_req[e->b_out_seq[j]],
			       e->logits + (size_t)j * e->m->hp.n_vocab);
	*n_ev = e->n_ev;
	t_check = kvd_now_ns() - t_check;
	e->sample_ns += t_check;
	t_step = kvd_now_ns() - t_step;
	e->step_ns += t_step;
	stepcost_observe(&e->cost, n_tok, n_out, t_step);
	return 0;
}

void engine_timing(const struct engine *e, uint64_t *integrity_ns,
		   uint64_t *step_ns)
{
	*integrity_ns = e->integrity_ns;
	*step_ns = e->step_ns;
}

void engine_prof(const struct engine *e, struct engine_prof *out)
{
	struct backend_cpu_prof bp;

	backend_cpu_prof(&e->be, &bp);
	*out = (struct engine_prof){
		.step_ns = e->step_ns, .integrity_ns = e->integrity_ns,
		.sample_ns = e->sample_ns, .forward_ns = bp.forward_ns,
		.mm_ns = bp.mm_ns, .att_ns = bp.att_ns, .tok_ns = bp.tok_ns,
		.logits_ns = bp.logits_ns };
}
