/* compute.h - the compute thread: one engine, a job queue, a loop wakeup.
 *
 * The engine never runs on the loop thread. The loop queues jobs (submit,
 * free), each keyed by an opaque uint64 owner (the pool owner: a request
 * id); the thread answers with messages, handed to deliver(arg, m) on the
 * loop thread through a uv_async_t. The module knows nothing of what an
 * owner is: the caller maps owners back to its own objects.
 *
 * Per owner the messages are: SUBMITTED (always, once per submit), then
 * TOKEN..., then DONE (once, unless the owner is freed first), and FREED
 * (always, once per free). SUBMITTED, DONE and FREED are allocated on the
 * loop side with their jobs, so ending an owner never needs memory on the
 * thread.
 *
 * Thread: every function here is loop-thread only.
 */
#pragma once

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "gpu/engine.h"
#include "gpu/kv/pcache.h"
#include "gpu/cpu/stepcost.h"

struct kvlog;
struct kvpool;
struct model;

enum compute_job_kind { COMPUTE_JOB_SUBMIT = 1, COMPUTE_JOB_FREE };

struct compute_job {
	enum compute_job_kind kind;
	struct compute_job *next;
	uint64_t owner;
	struct engine_req_params rp;     /* SUBMIT; prompt/table owned below */
	int32_t *prompt;                 /* (rp.n_prompt) */
	struct kvpool_ref *table;        /* (rp.n_table) lent pages, or NULL */
	struct sampler_bias *bias;       /* (rp.sampling.n_logit_bias) or NULL */
	struct pcache_key key;           /* rp.cache_key points here when set */
	struct engine_req *req;          /* FREE */
	struct kvpool_ref *release;      /* FREE: (n_release) lent pages to
					  * release after, owned by the job */
	uint32_t n_release;
	bool quarantine;                 /* FREE: quarantine them instead (the
					  * engine found a page it cannot trust) */
	int32_t *cache_prompt;           /* FREE: the first cache_pages pages of
					  * release go to the prefix cache under
					  * key first (compute_job_cache) */
	uint32_t cache_pages;
	struct compute_msg *reply;       /* its answer (SUBMIT: SUBMITTED,
					  * FREE: FREED), allocated with the
					  * job so the answer cannot be lost */
	struct compute_msg *done;        /* SUBMIT: the owner's DONE, allocated
					  * with the job, so ending never
					  * needs memory on the thread */
	bool nomem;                      /* SUBMIT: act as if no TOKEN message
					  * could be allocated (fault point) */
};

enum compute_msg_kind {
	COMPUTE_MSG_SUBMITTED = 1,
	COMPUTE_MSG_TOKEN,
	COMPUTE_MSG_DONE,
	COMPUTE_MSG_FREED,
};

struct compute_msg {
	enum compute_msg_kind kind;
	struct compute_msg *next;
	uint64_t owner;
	struct engine_req *req;
	int error;                       /* SUBMITTED: submit's code; DONE;
					  * FREED: the pool's code when it
					  * refused to take the pages back
					  * (an invariant breach: they were
					  * quarantined instead) */
	uint32_t cached;                 /* SUBMITTED: prompt tokens the
					  * prefix cache gave */
	int32_t token;                   /* TOKEN */
	uint32_t pos;
	struct sampler_logprobs *lp;     /* TOKEN of a request that asked for
					  * logprobs: in m's own allocation;
					  * else NULL */
	enum engine_finish finish;       /* DONE */
	struct kvpool_ref *table;        /* DONE of a finished prompt:
					  * (n_table) copy of its pages, or
					  * NULL without memory for it */
	uint32_t n_table;
	uint32_t n_kv;
	uint64_t *mapped;                /* DONE with a table: (n_mapped) cache
					  * entries owning table[0..n_mapped)
					  * (gpu/kv/pcache.h), or NULL */
	uint32_t n_mapped;
	bool nomem;                      /* a pending DONE: its submit's
					  * nomem (thread-owned) */
};

/* Called on the loop thread for every message; m (and m->table) is freed
 * when it returns. */
typedef void compute_deliver_fn(void *arg, struct compute_msg *m);

struct compute {
	pthread_t thread;
	bool started;                    /* the thread runs */
	bool mu_init;                    /* mu and cv initialised */
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct compute_job *jobs, *jobs_tail;   /* loop -> thread */
	struct compute_msg *msgs, *msgs_tail;   /* thread -> loop */
	bool stop;
	uv_async_t async;                /* wakes the loop: msgs is not empty */
	bool async_open;
	struct engine *eng;              /* thread-owned after start */
	struct compute_msg *dones;       /* thread-owned: the DONE of each
					  * owner in the engine that has not
					  * ended (linked by next) */
	struct kvpool *pool;
	struct kvlog *log;               /* engine_step lines at debug */
	uint32_t step_tokens;            /* the engine's step budget */
	struct engine_params ep;         /* the engine's parameters */
	struct stepcost cost;            /* the engine's learned step cost,
					  * copied by the thread after each
					  * step (under mu) */
	_Atomic uint32_t decoders;       /* decoding requests in the last
					  * step (0 once the engine idles);
					  * written by the thread */
	compute_deliver_fn *deliver;
	void *deliver_arg;
};

/* c zeroed by the caller (embedded). Create the engine (ep, m and pool
 * borrowed; pool must outlive c) and start the thread. 0, a negative
 * errno, or engine_new's positive ENGINE_E_* code. On failure nothing
 * runs, but the wakeup handle may be open: the caller still calls
 * compute_stop and compute_close. */
int compute_start(struct compute *c, uv_loop_t *loop, const struct model *m,
		  struct kvpool *pool, const struct engine_params *ep,
		  struct kvlog *log, compute_deliver_fn *deliver, void *arg);

/* Stop and join the thread, drop every queued job and undelivered
 * message, free the engine. No message is delivered after it. Safe
 * twice and after a failed start. */
void compute_stop(struct compute *c);

/* After compute_stop: close the wakeup handle (h->data = data). true when
 * cb will run (c's memory must live until then), false when nothing was
 * open (cb will not run). */
bool compute_close(struct compute *c, uv_close_cb cb, void *data);

/* The engine's step budget (engine.step_tokens, or its default), and how
 * many requests its last step decoded (0 when it is idle): what is left of
 * a step for prompts. */
uint32_t compute_step_tokens(const struct compute *c);
uint32_t compute_decoders(const struct compute *c);
/* The prompt tokens a step with n_dec decoders would carry now
 * (engine_prompt_budget with the cost learned so far), and what one
 * decoder costs in prompt tokens (1 + a logits row's share,
 * gpu/cpu/stepcost.h): for placement (daemon/node/place.h). Loop thread. */
uint32_t compute_prompt_budget(struct compute *c, uint32_t n_dec);
double compute_decoder_units(struct compute *c);

/* A FREE job with its FREED reply, for an owner to keep from its creation
 * so that freeing it later cannot fail. NULL without memory. */
struct compute_job *compute_free_job_new(void);
/* Free a job that was never queued (NULL: nothing). */
void compute_job_free(struct compute_job *j);

/* Submit `owner`'s request: rp's sampling (its logit_bias copied), max_tokens, prefill_only,
 * ignore_eos, n_cached and cache_key (copied) are used; prompt (n_prompt) and table (n_table
 * lent pages, NULL: the engine reserves its own) are copied. nomem: the
 * thread acts as if it could not allocate this owner's messages (fault
 * point compute_nomem): it ends at its first token, -ENOMEM. 0 or
 * -ENOMEM (nothing queued). SUBMITTED follows. */
int compute_submit(struct compute *c, uint64_t owner,
		   const struct engine_req_params *rp, const int32_t *prompt,
		   uint32_t n_prompt, const struct kvpool_ref *table,
		   uint32_t n_table, bool nomem);

/* Before compute_free: the first n_full pages of the lent pages it will
 * release hold the full pages of prompt (at least n_full pages of tokens;
 * consumed, freed with the job) and are offered to the engine's prefix
 * cache under key; those the cache adopts are not released. Nothing
 * happens when the pages are quarantined or the engine has no cache. */
void compute_job_cache(struct compute_job *job, const struct pcache_key *key,
		       int32_t *prompt, uint32_t n_full);

/* Queue `job` (from compute_free_job_new; consumed): free owner's engine
 * request `ereq` (NULL: none), then release the n_release pages of
 * `release` (consumed, may be NULL) on the thread, right after the
 * engine let them go, or with `quarantine` take them out of circulation.
 * Cannot fail. Owner's pending DONE is dropped; FREED follows. */
void compute_free(struct compute *c, struct compute_job *job, uint64_t owner,
		  struct engine_req *ereq, struct kvpool_ref *release,
		  uint32_t n_release, bool quarantine);
