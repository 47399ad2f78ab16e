/* threadpool.c - compute workers with dynamic chunk hand-out.
 *
 * One 64-bit atomic, `ticket`, holds (generation << 32 | next chunk). The
 * caller publishes a run by storing fn, arg and n_chunks, zeroing `done`,
 * then setting ticket to (gen + 1, 0) with release order. Every
 * participant claims chunks by compare-and-swap on ticket, which succeeds
 * only while the generation it read is current and chunks remain; fn, arg
 * and n_chunks read between the load and a successful CAS belong to that
 * generation, because the caller cannot start the next run while a chunk
 * of this one is unclaimed. After a chunk, `done` is incremented; the
 * caller returns when done == n_chunks.
 *
 * Waiting: workers spin for a short while after each run (decode issues
 * tens of runs per token, and a futex wake costs more than a small step),
 * then sleep on `wake`; the caller broadcasts under the mutex and a worker
 * re-checks the generation under it before sleeping, so no wake-up is
 * lost. The caller itself takes chunks, so a run completes even when no
 * worker gets scheduled.
 */
#include "gpu/threadpool.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

#define TP_SPIN 20000

struct tp_worker {
	struct threadpool *tp;
	uint32_t index;
	pthread_t thread;
};

struct threadpool {
	uint32_t n;                  /* threads incl. the caller */
	struct tp_worker *workers;   /* (n - 1) */
	uint32_t started;            /* workers actually created */
	pthread_mutex_t lock;
	pthread_cond_t wake;
	_Atomic uint64_t ticket;     /* gen << 32 | next chunk */
	_Atomic uint32_t done;       /* chunks finished in this run */
	_Atomic bool stop;
	/* the current run; stable while any of its chunks is unclaimed */
	_Atomic(threadpool_fn) fn;
	_Atomic(void *) arg;
	_Atomic uint32_t n_chunks;
};

/* Claim and run chunks of generation `gen` until none are left. */
static void tp_work(struct threadpool *tp, uint32_t gen, uint32_t self)
{
	for (;;) {
		uint64_t t = atomic_load_explicit(&tp->ticket, memory_order_acquire);
		threadpool_fn fn;
		void *arg;
		uint32_t n, c;

		if ((uint32_t)(t >> 32) != gen)
			return;
		fn = atomic_load_explicit(&tp->fn, memory_order_relaxed);
		arg = atomic_load_explicit(&tp->arg, memory_order_relaxed);
		n = atomic_load_explicit(&tp->n_chunks, memory_order_relaxed);
		c = (uint32_t)t;
		if (c >= n)
			return;
		if (!atomic_compare_exchange_weak_explicit(&tp->ticket, &t, t + 1,
							   memory_order_acq_rel,
							   memory_order_acquire))
			continue;
		fn(arg, c, n, self);
		atomic_fetch_add_explicit(&tp->done, 1, memory_order_acq_rel);
	}
}

static uint32_t tp_gen(struct threadpool *tp)
{
	return (uint32_t)(atomic_load_explicit(&tp->ticket, memory_order_acquire) >> 32);
}

/* Wait for a generation other than `seen`; false when stopping. */
static bool tp_wait_gen(struct threadpool *tp, uint32_t seen)
{
	for (int i = 0; i < TP_SPIN; i++) {
		if (tp_gen(tp) != seen)
			return true;
		if (atomic_load_explicit(&tp->stop, memory_order_acquire))
			return false;
	}
	pthread_mutex_lock(&tp->lock);
	while (tp_gen(tp) == seen &&
	       !atomic_load_explicit(&tp->stop, memory_order_acquire))
		pthread_cond_wait(&tp->wake, &tp->lock);
	pthread_mutex_unlock(&tp->lock);
	return !atomic_load_explicit(&tp->stop, memory_order_acquire);
}

static void *tp_main(void *p)
{
	struct tp_worker *w = p;
	struct threadpool *tp = w->tp;
	uint32_t seen = 0;

	while (tp_wait_gen(tp, seen)) {
		seen = tp_gen(tp);
		tp_work(tp, seen, w->index);
	}
	return NULL;
}

int threadpool_new(struct threadpool **out, uint32_t n_threads)
{
	struct threadpool *tp;
	int r;

	if (n_threads < 1)
		return -EINVAL;
	tp = calloc(1, sizeof(*tp));
	if (!tp)
		return -ENOMEM;
	tp->n = n_threads;
	pthread_mutex_init(&tp->lock, NULL);
	pthread_cond_init(&tp->wake, NULL);
	tp->workers = calloc(n_threads, sizeof(*tp->workers));
	if (!tp->workers) {
		threadpool_free(tp);
		return -ENOMEM;
	}
	for (uint32_t i = 1; i < n_threads; i++) {
		struct tp_worker *w = &tp->workers[i - 1];

		w->tp = tp;
		w->index = i;
		r = pthread_create(&w->thread, NULL, tp_main, w);
		if (r) {
			threadpool_free(tp);
			return -r;
		}
		tp->started++;
	}
	*out = tp;
	return 0;
}

void threadpool_free(struct threadpool *tp)
{
	if (!tp)
		return;
	pthread_mutex_lock(&tp->lock);
	atomic_store_explicit(&tp->stop, true, memory_order_release);
	pthread_cond_broadcast(&tp->wake);
	pthread_mutex_unlock(&tp->lock);
	for (uint32_t i = 0; i < tp->started; i++)
		pthread_join(tp->workers[i].thread, NULL);
	pthread_cond_destroy(&tp->wake);
	pthread_mutex_destroy(&tp->lock);
	free(tp->workers);
	free(tp);
}

uint32_t threadpool_size(const struct threadpool *tp)
{
	return tp->n;
}

void threadpool_run(struct threadpool *tp, threadpool_fn fn, void *arg,
		    uint32_t n_chunks)
{
	uint32_t gen, spins = 0;

	if (n_chunks == 0)
		return;
	if (tp->n == 1) {
		for (uint32_t c = 0; c < n_chunks; c++)
			fn(arg, c, n_chunks, 0);
		return;
	}
	gen = tp_gen(tp) + 1;
	atomic_store_explicit(&tp->fn, fn, memory_order_relaxed);
	atomic_store_explicit(&tp->arg, arg, memory_order_relaxed);
	atomic_store_explicit(&tp->n_chunks, n_chunks, memory_order_relaxed);
	atomic_store_explicit(&tp->done, 0, memory_order_relaxed);
	atomic_store_explicit(&tp->ticket, (uint64_t)gen << 32, memory_order_release);
	pthread_mutex_lock(&tp->lock);
	pthread_cond_broadcast(&tp->wake);
	pthread_mutex_unlock(&tp->lock);
	tp_work(tp, gen, 0);
	while (atomic_load_explicit(&tp->done, memory_order_acquire) != n_chunks)
		if (++spins > TP_SPIN)
			sched_yield();
}
