/* threadpool.c - compute workers.
 *
 * A run is published by bumping `gen` (release) after storing fn and arg;
 * workers notice the new generation, run their part and decrement
 * `pending`; the caller runs part 0 and then waits for pending to reach
 * zero. Workers spin for a short while after each run (decode issues tens
 * of runs per token, and a futex wake costs more than the work of a small
 * model's step), then take the mutex and sleep on `wake`. The caller takes
 * the mutex before broadcasting, and a worker re-checks `gen` under it
 * before sleeping, so no wake-up is lost.
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
	uint32_t part;
	pthread_t thread;
};

struct threadpool {
	uint32_t n;                  /* parts per run (threads incl. caller) */
	struct tp_worker *workers;   /* (n - 1) */
	uint32_t started;            /* workers actually created */
	pthread_mutex_t lock;
	pthread_cond_t wake;
	_Atomic uint64_t gen;        /* bumped once per run */
	_Atomic uint32_t pending;    /* worker parts not yet done */
	_Atomic bool stop;
	threadpool_fn fn;            /* valid while a run is in flight */
	void *arg;
};

static bool tp_wait_gen(struct threadpool *tp, uint64_t seen)
{
	for (int i = 0; i < TP_SPIN; i++) {
		if (atomic_load_explicit(&tp->gen, memory_order_acquire) != seen)
			return true;
		if (atomic_load_explicit(&tp->stop, memory_order_acquire))
			return false;
	}
	pthread_mutex_lock(&tp->lock);
	while (atomic_load_explicit(&tp->gen, memory_order_acquire) == seen &&
	       !atomic_load_explicit(&tp->stop, memory_order_acquire))
		pthread_cond_wait(&tp->wake, &tp->lock);
	pthread_mutex_unlock(&tp->lock);
	return !atomic_load_explicit(&tp->stop, memory_order_acquire);
}

static void *tp_main(void *p)
{
	struct tp_worker *w = p;
	struct threadpool *tp = w->tp;
	uint64_t seen = 0;

	while (tp_wait_gen(tp, seen)) {
		seen = atomic_load_explicit(&tp->gen, memory_order_acquire);
		tp->fn(tp->arg, w->part, tp->n);
		atomic_fetch_sub_explicit(&tp->pending, 1, memory_order_acq_rel);
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
		w->part = i;
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

void threadpool_run(struct threadpool *tp, threadpool_fn fn, void *arg)
{
	uint32_t spins = 0;

	if (tp->n == 1) {
		fn(arg, 0, 1);
		return;
	}
	tp->fn = fn;
	tp->arg = arg;
	atomic_store_explicit(&tp->pending, tp->n - 1, memory_order_release);
	atomic_fetch_add_explicit(&tp->gen, 1, memory_order_acq_rel);
	pthread_mutex_lock(&tp->lock);
	pthread_cond_broadcast(&tp->wake);
	pthread_mutex_unlock(&tp->lock);
	fn(arg, 0, tp->n);
	while (atomic_load_explicit(&tp->pending, memory_order_acquire) != 0)
		if (++spins > TP_SPIN)
			sched_yield();
}
