/* prep.h - a small worker pool for preparing requests off the loop.
 *
 * What a request needs before it can be admitted and that grows with
 * its size - parsing a large JSON body, rendering a chat template,
 * tokenizing a long prompt - takes milliseconds per 100 KB and seconds
 * per megabyte. On the loop thread it stalls every other tenant's
 * streams. The loop hands such work here as a job: run(job) on a worker
 * thread, then done(job) back on the loop thread through a uv_async_t.
 * The module knows nothing of HTTP or tokenizers.
 *
 * Lifetime: the caller owns the job's memory (embedded in its own
 * struct) and done(job, cancelled) is called exactly once for every job
 * prep_submit accepted - after run, or without it when the job was
 * cancelled before a worker took it, or by prep_stop. done is where the
 * owner frees it; nothing touches the job afterwards. prep_cancel only
 * sets a flag: a job already running finishes (run must not block) and
 * its done says cancelled.
 *
 * Bounds: at most PREP_JOBS_MAX jobs and PREP_BYTES_MAX bytes (the
 * caller's figure, e.g. a body's length) between submit and done, and
 * at most PREP_KEY_JOBS_MAX of them and PREP_KEY_BYTES_MAX bytes (past
 * its first job) under one key (a tenant), so one key cannot fill the
 * pool; beyond, prep_submit refuses (PREP_E_FULL, PREP_E_KEY_FULL) and
 * nothing is queued.
 *
 * Order and fairness: a worker takes the oldest queued job whose key no
 * other worker is running, else the oldest: another key's job waits
 * behind a flood only until the first worker finishes its current job. Workers run at a lower priority
 * (nice +10) than the loop and the engine threads, so preparing bulk
 * input yields the CPU to what streams.
 *
 * Thread: prep_* on the loop thread only; run on a worker, done on the
 * loop.
 */
#pragma once

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#define PREP_THREADS 2u
#define PREP_JOBS_MAX 64u
#define PREP_KEY_JOBS_MAX 8u
#define PREP_BYTES_MAX (64u << 20)
#define PREP_KEY_BYTES_MAX (PREP_BYTES_MAX / 4) /* under one key, beyond
					  * its first job: one key's large
					  * bodies cannot fill the bytes */
#define PREP_KEY_MAX 64u                 /* bytes, NUL included */

enum {
	PREP_E_FULL = 1,                 /* PREP_JOBS_MAX or PREP_BYTES_MAX */
	PREP_E_KEY_FULL,                 /* PREP_KEY_JOBS_MAX under the key */
};

struct prep_job;
typedef void prep_run_fn(struct prep_job *j);
typedef void prep_done_fn(struct prep_job *j, bool cancelled);

struct prep_job {
	prep_run_fn *run;                /* worker thread */
	prep_done_fn *done;              /* loop thread, exactly once */
	char key[PREP_KEY_MAX];          /* fairness and the per-key bound */
	size_t bytes;                    /* counted in the pool's bound */
	struct prep_job *next;           /* the pool's lists (under mu) */
	atomic_bool cancelled;
	bool ran;                        /* run() was called (under mu) */
};

struct prep;
struct prep_slot {                       /* a worker's argument */
	struct prep *p;
	unsigned slot;
};

struct prep {
	pthread_t th[PREP_THREADS];
	struct prep_slot slots[PREP_THREADS];
	unsigned n_threads;              /* started */
	bool mu_init;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct prep_job *queue, *queue_tail;    /* loop -> workers */
	struct prep_job *done, *done_tail;      /* workers -> loop */
	const struct prep_job *running[PREP_THREADS];  /* per worker */
	uint32_t n_jobs;                 /* submitted, done not called */
	size_t bytes;                    /* their bytes */
	bool stop;
	uv_async_t async;
	bool async_open;
};

/* p zeroed by the caller (embedded). Open the wakeup and start the
 * workers. 0 or a negative errno; on failure call prep_stop and
 * prep_close all the same. */
int prep_start(struct prep *p, uv_loop_t *loop);

/* Queue j (run, done, key and bytes set; the rest zeroed here). 0;
 * PREP_E_FULL or PREP_E_KEY_FULL (nothing queued, done will not be
 * called). */
int prep_submit(struct prep *p, struct prep_job *j);

/* Its owner no longer wants the result (the client left). done still
 * comes, with cancelled. */
void prep_cancel(struct prep_job *j);

/* Stop and join the workers (a running job finishes first), then call
 * done(cancelled) for every job not delivered yet. Safe twice. */
void prep_stop(struct prep *p);

/* After prep_stop: close the wakeup (h->data = data). true when cb will
 * run (p must live until then), false when nothing was open. */
bool prep_close(struct prep *p, uv_close_cb cb, void *data);

/* Jobs and bytes between submit and done (for tests and status). */
uint32_t prep_jobs(const struct prep *p);
