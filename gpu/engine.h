/* engine.h - requests in, tokens out: continuous batching over a KV pool.
 *
 * An engine runs one model on one backend (CPU now) with K and V in the
 * pages of a struct kvpool. Requests are submitted, then the caller drives
 * the engine with engine_step(): each step gathers every running request
 * (up to max_batch) into one batch - one token for each request that is
 * decoding, a chunk of up to prefill_chunk prompt tokens for each request
 * still reading its prompt - runs the forward pass once, samples, and
 * reports what happened as events. Requests join and leave between steps.
 *
 * KV pages. A request's K/V live only in its own pages, addressed through
 * its page table (kvpool_ref: page + generation). Before a step reads a
 * request's pages, the engine verifies the table against the pool and the
 * integrity tags in page memory (kvpool_verify, invariant 1); a failure
 * ends that request with ENGINE_E_INTEGRITY and no token, and the step
 * goes on for the others. Tags are rewritten (kvpool_tag_write) as the
 * request's positions grow.
 *   - By default the engine reserves pages_for(prompt + max_tokens - 1)
 *     pages at submit (all or nothing: ENGINE_E_FULL is returned and
 *     nothing is held) and releases them in engine_req_free (quarantines
 *     them after an integrity failure).
 *   - With a prefix cache (params.cache) and a request's cache_key, the
 *     first pages of the table are cached pages of the same tenant and
 *     salt (gpu/kv/pcache.h), mapped read-only: the request computes from
 *     the first position after them, verifies them with their cache
 *     entry as owner (kvpool_verify_mapped) and never writes them or
 *     their tags; they are given back, not released, at free.
 *   - With params.table the caller lends its own reserved pages (decode
 *     after a transfer); they must be FILLING or READY and hold K/V of the
 *     first n_cached tokens with matching tags. The engine never releases
 *     lent pages.
 *
 * Purity (invariant 9): a request's tokens depend only on (model, prompt,
 * sampling params, seed): kernels split work by output rows only, the
 * sampler's draw for position p is keyed by (seed, p), and no request's
 * numbers depend on the batch or the page layout.
 *
 * Errors: 0, a negative errno for system failures, or a positive
 * ENGINE_E_* for conditions the caller reports to the client - nothing
 * else: the pool's codes are folded at submit (a full pool is
 * ENGINE_E_FULL). Another layer acts on the kind (conf/err.h) that
 * kvd_err_engine (gpu/errors.c) folds a code into.
 *
 * Threading contract: an engine and its requests belong to one driver
 * thread - never the libuv loop thread, since engine_step() computes for
 * as long as a forward pass takes. The daemon runs a compute thread that
 * takes work from a queue, calls engine_submit()/engine_step()/
 * engine_req_free(), and hands events back to the loop with a uv_async_t.
 * The engine uses its own worker threads (engine.threads) inside a step.
 * The kvpool may be shared with other threads (its calls lock).
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "conf/log.h"
#include "gpu/gguf/gguf.h"
#include "gpu/kv/kvpool.h"
#include "gpu/sampler.h"

struct prepack_info;
struct pcache;
struct pcache_key;

struct model;
struct engine;
struct engine_req;

enum {
	ENGINE_E_TOO_LONG = 200, /* prompt + max_tokens exceeds the context */
	ENGINE_E_INVALID,        /* empty prompt, token id out of range, bad args */
	ENGINE_E_INTEGRITY,      /* a page table or tag failed verification */
	ENGINE_E_GEOMETRY,       /* pool geometry does not fit the model */
	ENGINE_E_BUSY,           /* max_requests already submitted */
	ENGINE_E_MEMORY,         /* pool memory the backend cannot address */
	ENGINE_E_FULL,           /* the pool has not the pages free now */
	ENGINE_E_POOL,           /* the pool refused an operation on the
				  * request's fresh pages (a bug) */
};

struct engine_params {
	uint32_t threads;        /* compute threads, >= 1 */
	uint32_t max_batch;      /* running requests per step (>= 1) */
	uint32_t max_requests;   /* submitted, not yet freed (0 = unlimited) */
	uint32_t prefill_chunk;  /* prompt tokens per request per step (>= 1) */
	uint32_t step_tokens;    /* tokens per step, all requests together;
				  * 0 = max_batch + prefill_chunk, else >=
				  * max_batch (every decoder fits every step) */
	uint32_t n_ctx;          /* context length; 0 = the model's */
	/* Step time target (engine.step_ms) in microseconds, 0 = none: in a
	 * step with decoders, prompt tokens are admitted only as far as the
	 * learned step cost (gpu/cpu/stepcost.h) predicts the step stays within
	 * it, but never fewer than ENGINE_STEP_MIN_PROMPT (or prefill_chunk
	 * when smaller) while a prompt waits, so prompts always progress. A
	 * step without decoders has no limit but step_tokens. */
	uint32_t step_us;
	bool simd;               /* AVX2 kernels when the CPU has them */
	/* The prefix cache (gpu/kv/pcache.h; NULL: none), on the same pool:
	 * requests with a cache_key map the cached pages their prompt starts
	 * with and compute only the rest; at engine_req_free the full pages
	 * of a prompt they computed themselves are cached. Borrowed. */
	struct pcache *cache;
	/* The repack cache (gpu/model/prepack.h): directory (NULL or "": none)
	 * and, with one, the model's SHA-256 (64 hex digits). */
	const char *pack_dir;
	const char *model_sha256;
	/* after binding, remove the directory's other pack files that are
	 * stale or unused for pack_keep_days (prepack_clean; logged to the
	 * engine's log) */
	bool pack_clean;
	uint32_t pack_keep_days;
	/* engine_prof's backend split in this thread's CPU time instead of
	 * wall time (a system call per clock read; for benchmarks) */
	bool prof_cpu;
};

#define ENGINE_STEP_MIN_PROMPT 4u

#define ENGINE_PARAMS_DEFAULT { .threads = 1, .max_batch = 16, \
	.max_requests = 0, .prefill_chunk = 64, .step_tokens = 0, .n_ctx = 0, \
	.simd = true }

enum engine_finish {
	ENGINE_FINISH_NONE = 0,  /* still running */
	ENGINE_FINISH_STOP,      /* end-of-sequence token (not emitted) */
	ENGINE_FINISH_LENGTH,    /* max_tokens reached or the context is full */
	ENGINE_FINISH_PREFILLED, /* prefill_only: KV built, first token emitted */
	ENGINE_FINISH_CANCELLED, /* engine_req_cancel */
	ENGINE_FINISH_ERROR,     /* see error */
};

/* A constraint on what a request may generate (gpu/text/jsongram.h's
 * run is one: JSON output). Before each draw mask sets the logits
 * (n_vocab) of the tokens that may not come to -INFINITY and returns
 * how many may; after the draw accept is told the token (false: it was
 * not allowed). Both run on the compute thread; ctx is the caller's and
 * lives until engine_req_free. When nothing may come (mask returns 0) or
 * the sampler still picked a masked token, the request ends as if EOS
 * had been drawn. The mask depends on the request's own tokens only
 * (invariant 9). */
struct engine_constraint {
	void *ctx;                       /* NULL: none */
	uint32_t (*mask)(void *ctx, float *logits, uint32_t n_vocab);
	bool (*accept)(void *ctx, int32_t token);
};

struct engine_req_params {
	uint64_t owner;                 /* request id: the pool owner */
	void *user;                     /* caller's pointer, echoed in events */
	const int32_t *prompt;          /* (n_prompt) token ids, copied */
	uint32_t n_prompt;              /* >= 1 */
	uint32_t max_tokens;            /* tokens to generate, >= 1 */
	struct sampler_params sampling; /* logit_bias copied at submit */
	bool prefill_only;              /* stop after the first sampled token */
	bool ignore_eos;                /* do not stop at the EOS token */
	/* Lent pages (NULL: the engine reserves its own). */
	const struct kvpool_ref *table; /* (n_table) */
	uint32_t n_table;
	uint32_t n_cached;              /* prompt tokens whose K/V the pages hold */
	/* Whose cached prefix it may use and feed (tenant, salt): NULL for
	 * none; only with engine pages (no table). Copied. */
	const struct pcache_key *cache_key;
	struct engine_constraint constraint;  /* ctx NULL: none */
};

enum engine_event_kind {
	ENGINE_EV_TOKEN = 1,     /* token: a new output token */
	ENGINE_EV_DONE,          /* finish (and error) set; request is idle */
};

struct engine_event {
	enum engine_event_kind kind;
	struct engine_req *req;
	uint64_t owner;
	void *user;                     /* engine_req_params.user */
	int32_t token;                  /* ENGINE_EV_TOKEN */
	uint32_t pos;                   /* position of that token */
	/* ENGINE_EV_TOKEN of a request whose sampling.logprobs is set: its
	 * log-probabilities (gpu/sampler.h), valid as the event; else NULL */
	const struct sampler_logprobs *lp;
	enum engine_finish finish;      /* ENGINE_EV_DONE */
	int error;                      /* ENGINE_EV_DONE with FINISH_ERROR */
};

/* The pool's geometry must match the model (n_layer, kv_dim) and its
 * memory must be host-visible. model and pool must outlive the engine;
 * log may be NULL. ENGINE_E_GEOMETRY on a mismatch. */
int engine_new(struct engine **out, const struct model *m,
	       struct kvpool *pool, const struct engine_params *p,
	       struct kvlog *log);
struct stepcost;
/* The prompt tokens a step with n_dec decoders may carry under p's
 * step_tokens (max_step_tokens: its value or default) and step_us, with
 * the step cost learned so far: the pure rule of step 1 (gpu/engine.c),
 * for a caller that wants to predict it (daemon/node/place.h). */
uint32_t engine_prompt_budget(const struct engine_params *p,
			      uint32_t max_step_tokens,
			      const struct stepcost *cost, uint32_t n_dec);
/* The engine's learned step cost (a copy). */
void engine_step_cost(const struct engine *e, struct stepcost *out);
/* The prompt-token budget the last step's time target allowed
 * (UINT32_MAX: no target, no decoders, or no cost learned yet), and the
 * learned cost of one work unit (gpu/cpu/stepcost.h) in ns, 0 before any. */
void engine_last_budget(const struct engine *e, uint32_t *prompt_budget,
			double *ns_per_unit);
/* Frees every request still held (as engine_req_free). */
void engine_free(struct engine *e);

/* Admit a request: checks (ENGINE_E_INVALID - also over SAMPLER_BIAS_MAX
 * logit_bias entries or SAMPLER_TOP_LOGPROBS_MAX top_logprobs -,
 * ENGINE_E_TOO_LONG, ENGINE_E_BUSY),
 * then reserves pages (ENGINE_E_FULL, ENGINE_E_POOL) unless lent. Nothing is held on
 * error. The request runs from the next step on. */
int engine_submit(struct engine *e, const struct engine_req_params *rp,
		  struct engine_req **out);

/* Run one step. *ev (valid until the next engine call) receives the
 * events of this step, *n_ev their count (0 when nothing was runnable).
 * Returns 0, or a negative errno when the backend failed (the requests of
 * that step are then ended with FINISH_ERROR and the error). */
int engine_step(struct engine *e, const struct engine_event **ev,
		size_t *n_ev);

/* true when no submitted request is still running. */
bool engine_idle(const struct engine *e);
/* Running (submitted, not finished) requests. */
uint32_t engine_running(const struct engine *e);

/* End a running request now (FINISH_CANCELLED, reported by no event). */
void engine_req_cancel(struct engine *e, struct engine_req *r);
/* Forget a request (cancelling it if it still runs) and release or
 * quarantine its own pages. `r` is invalid afterwards. */
void engine_req_free(struct engine *e, struct engine_req *r);

/* Accessors. Tokens: prompt then outputs (n_prompt + n_output). */
const int32_t *engine_req_tokens(const struct engine_req *r, uint32_t *n);
uint32_t engine_req_n_prompt(const struct engine_req *r);
uint32_t engine_req_n_output(const struct engine_req *r);
enum engine_finish engine_req_finish(const struct engine_req *r, int *error);
/* A check of its table or tags failed (it ended with ENGINE_E_INTEGRITY):
 * whoever lent its pages must quarantine them. */
bool engine_req_integrity_bad(const struct engine_req *r);
uint64_t engine_req_owner(const struct engine_req *r);
/* The cache entries owning the first *n table entries (mapped cached
 * pages, for kvpool_verify_mapped); NULL with *n = 0 when none. */
const uint64_t *engine_req_mapped(const struct engine_req *r, uint32_t *n);
/* Prompt tokens whose K/V came from the prefix cache (0: none). */
uint32_t engine_req_cached(const struct engine_req *r);
/* The request's page table and the positions its pages hold K/V for. */
const struct kvpool_ref *engine_req_table(const struct engine_req *r,
					  uint32_t *n_table, uint32_t *n_kv);

const char *engine_finish_name(enum engine_finish f);
const char *engine_strerror(int code);
/* The kernel table the backend uses ("avx2", "scalar"). */
const char *engine_kernels(const struct engine *e);
/* The kernel variant the backend runs for weight type t ("avx512",
 * "avx2", "scalar"; "none" when unsupported): gpu/cpu/ops_info.h. */
const char *engine_kernel_variant(const struct engine *e, enum ggml_type t);
/* Where the backend's packed weight copies came from (gpu/model/prepack.h). */
const struct prepack_info *engine_pack_info(const struct engine *e);
/* What the last engine_step() computed: requests, tokens, and how many
 * of those requests were decoding (one token each). */
void engine_last_step(const struct engine *e, uint32_t *n_seq,
		      uint32_t *n_tok, uint32_t *n_decode);
/* Time spent so far in the integrity checks of completed steps (verify,
 * tag write, verify again) and in those steps in all: the cost of tags,
 * measured in the same run (tests/bench/bench_engine). */
void engine_timing(const struct engine *e, uint64_t *integrity_ns,
		   uint64_t *step_ns);
/* Where the time of completed steps went so far (ns; wall time on the
 * stepping thread): the step, its integrity checks (as engine_timing),
 * sampling, and the backend's forward pass split as
 * struct backend_cpu_prof (gpu/backend.h) splits it. For benchmarks
 * (tests/bench/bench_engine --batch). */
struct engine_prof {
	uint64_t step_ns;
	uint64_t integrity_ns;
	uint64_t sample_ns;     /* the sampler and events, after forward */
	uint64_t forward_ns;
	uint64_t mm_ns;         /* layer matmuls */
	uint64_t att_ns;        /* attention */
	uint64_t tok_ns;        /* per-token steps, embedding */
	uint64_t logits_ns;     /* final norm and the output matmul */
};
void engine_prof(const struct engine *e, struct engine_prof *out);
/* The compute threads' counters so far (gpu/cpu/threadpool.h: runs handed to
 * the workers, runs that woke a sleeping worker, caller wait time). */
struct engine_pool_stats {
	uint64_t runs;
	uint64_t wakes;
	uint64_t wait_ns;
};
void engine_pool_stats(const struct engine *e, struct engine_pool_stats *out);
