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
 * Waiting. A decode step is about 60 runs of 10..50 us with a few us of
 * the caller's own work between them, and waking a sleeping worker (a
 * futex wake, then the scheduler running it) costs as much as a run: a
 * worker that slept between runs left the caller doing most chunks alone
 * (bench_threads counted a wake for nearly every run when the spin was
 * 20000 loads, a few microseconds). So a worker spins for TP_SPIN_NS of
 * wall time after its last run (PAUSE in the loop; the clock, ~0.4 us a
 * read in this guest, every 64 turns) before it sleeps on `wake`, and
 * the caller takes the mutex and broadcasts only when a worker is
 * asleep: it stores the new ticket, then reads `sleepers`; a worker
 * increments `sleepers` under the mutex, then re-reads the ticket before
 * waiting (both sequentially consistent), so either the caller sees the
 * sleeper and broadcasts under the mutex the worker holds until it
 * waits, or the worker sees the new run. No wake-up is lost. The caller
 * itself takes chunks, so a run completes even when no worker gets
 * scheduled; waiting for the workers' last chunks it spins with PAUSE
 * and yields the CPU after TP_SPIN_NS.
 *
 * Oversubscribed CPUs: a spinning thread that finds two of its clock
 * reads TP_PREEMPT_NS apart was descheduled for other work; it marks the
 * pool contended for TP_CONTENDED_NS, during which spins last only
 * TP_SPIN_BUSY_NS (a spin then burns the CPU time that the caller, or
 * the worker holding a chunk, is waiting for).
 *
 * Layout: the ticket, the done count and the run's description are on
 * cache lines of their own, so a claim does not invalidate the line the
 * caller polls.
 */
#include "gpu/cpu/threadpool.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* How long a waiting thread spins before it sleeps (worker) or yields
 * (caller): longer than the gaps inside a decode step, short enough that
 * an idle engine leaves the CPU within a millisecond. */
#define TP_SPIN_NS 400000u
/* While other work competes for the CPUs (a spinning thread found itself
 * descheduled for TP_PREEMPT_NS, in the last TP_CONTENDED_NS), a spin
 * only burns the CPU time that the caller, or the worker holding a chunk,
 * is waiting for: spin this long at most, then sleep (or yield). */
#define TP_SPIN_BUSY_NS 5000u
#define TP_PREEMPT_NS 50000u
#define TP_CONTENDED_NS 100000000u
#define TP_LINE 64

static inline void tp_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield" ::: "memory");
#endif
}

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
	struct threadpool_stats st;  /* the caller's */
	/* the current run; stable while any of its chunks is unclaimed */
	_Alignas(TP_LINE) _Atomic(threadpool_fn) fn;
	_Atomic(void *) arg;
	_Atomic uint32_t n_chunks;
	_Atomic bool stop;
	_Atomic uint32_t sleepers;   /* workers in (or entering) cond_wait */
	_Atomic uint64_t contended_until; /* tp_now_ns() */
	_Alignas(TP_LINE) _Atomic uint64_t ticket; /* gen << 32 | next chunk */
	_Alignas(TP_LINE) _Atomic uint32_t done;   /* chunks finished in this run */
};

static uint64_t tp_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

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

/* Whether the CPUs were found oversubscribed lately. */
static bool tp_contended(struct threadpool *tp, uint64_t now)
{
	return now < atomic_load_explicit(&tp->contended_until, memory_order_relaxed);
}

/* A spinning thread saw `gap` ns between two of its clock reads (a few
 * hundred ns apart when it runs): it was descheduled for other work, so
 * spinning now takes CPU time that runnable threads need. */
static bool tp_note_gap(struct threadpool *tp, uint64_t now, uint64_t gap)
{
	if (gap < TP_PREEMPT_NS)
		return false;
	atomic_store_explicit(&tp->contended_until, now + TP_CONTENDED_NS,
			      memory_order_relaxed);
	return true;
}

/* Wait for a generation other than `seen`: spin for TP_SPIN_NS (or
 * TP_SPIN_BUSY_NS while contended), then sleep; false when stopping. */
static bool tp_wait_gen(struct threadpool *tp, uint32_t seen)
{
	uint64_t t0 = tp_now_ns(), last = t0;
	uint64_t budget = tp_contended(tp, t0) ? TP_SPIN_BUSY_NS : TP_SPIN_NS;

	for (uint32_t i = 1;; i++) {
		if (tp_gen(tp) != seen)
			return true;
		if (atomic_load_explicit(&tp->stop, memory_order_acquire))
			return false;
		if (i % 64 == 0) {
			uint64_t now = tp_now_ns();

			if (tp_note_gap(tp, now, now - last) || now - t0 > budget)
				break;
			last = now;
		}
		tp_relax();
	}
	pthread_mutex_lock(&tp->lock);
	atomic_fetch_add(&tp->sleepers, 1); /* seq_cst: before the re-check */
	while (atomic_load(&tp->ticket) >> 32 == seen &&
	       !atomic_load_explicit(&tp->stop, memory_order_acquire))
		pthread_cond_wait(&tp->wake, &tp->lock);
	atomic_fetch_sub(&tp->sleepers, 1);
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
	/* cache-line aligned members: the block itself aligned */
	tp = aligned_alloc(TP_LINE, (sizeof(*tp) + TP_LINE - 1) / TP_LINE * TP_LINE);
	if (!tp)
		return -ENOMEM;
	memset(tp, 0, sizeof(*tp));
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
	uint64_t t0, last;

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
	atomic_store(&tp->ticket, (uint64_t)gen << 32); /* seq_cst: before sleepers */
	tp->st.runs++;
	if (atomic_load(&tp->sleepers)) {
		tp->st.wakes++;
		pthread_mutex_lock(&tp->lock);
		pthread_cond_broadcast(&tp->wake);
		pthread_mutex_unlock(&tp->lock);
	}
	tp_work(tp, gen, 0);
	/* the clock (a few hundred ns in this guest) only when waiting */
	if (atomic_load_explicit(&tp->done, memory_order_acquire) == n_chunks)
		return;
	t0 = last = tp_now_ns();
	while (atomic_load_explicit(&tp->done, memory_order_acquire) != n_chunks) {
		uint64_t now;

		if (++spins % 64) {
			tp_relax();
			continue;
		}
		now = tp_now_ns();
		tp_note_gap(tp, now, now - last);
		last = now;
		/* a worker holds a chunk but does not finish it: it is likely
		 * waiting for a CPU, maybe this one */
		if (now - t0 > (tp_contended(tp, now) ? TP_SPIN_BUSY_NS : TP_SPIN_NS))
			sched_yield();
	}
	tp->st.wait_ns += tp_now_ns() - t0;
}

void threadpool_stats(const struct threadpool *tp, struct threadpool_stats *out)
{
	*out = tp->st;
}
