/* threadpool.h - a fixed set of compute threads that run one function at a
 * time over a number of chunks.
 *
 * threadpool_run(tp, fn, arg, n_chunks) calls fn(arg, c, n_chunks, t) once
 * for every chunk c in [0, n_chunks), on some thread t in [0, size) (0 is
 * the caller), and returns when every chunk is done. Chunks are handed out
 * dynamically, so a worker that the OS has descheduled does not stall the
 * run: the others take its share. Which thread runs a chunk varies; what a
 * chunk computes must not depend on it (callers split work by output rows
 * and use `t` only to pick per-thread scratch), so results never depend on
 * the thread count or scheduling (engine determinism).
 *
 * Between runs workers spin (with PAUSE) for 0.4 ms of wall time, then
 * sleep on a condition variable; a run wakes them only when one sleeps
 * (threadpool.c has the protocol and the measurements behind it).
 *
 * Errors: threadpool_new returns 0 or a negative errno (pthread_create).
 * Thread safety: one caller thread drives a pool (run is not reentrant and
 * must not be called from inside fn). Free from the same caller.
 */
#pragma once

#include <stdint.h>

struct threadpool;

typedef void (*threadpool_fn)(void *arg, uint32_t chunk, uint32_t n_chunks,
			      uint32_t thread);

/* n_threads >= 1 (1 = no extra threads: run() calls fn inline). */
int threadpool_new(struct threadpool **out, uint32_t n_threads);
void threadpool_free(struct threadpool *tp);
uint32_t threadpool_size(const struct threadpool *tp);

/* Counters since threadpool_new, kept by the caller thread (read them from
 * it): runs handed to the workers (not those run inline), runs that had
 * to wake a sleeping worker, and the time the caller waited, after its
 * own chunks, for the workers to finish theirs. */
struct threadpool_stats {
	uint64_t runs;
	uint64_t wakes;
	uint64_t wait_ns;
};
void threadpool_stats(const struct threadpool *tp, struct threadpool_stats *out);
/* n_chunks >= 1 */
void threadpool_run(struct threadpool *tp, threadpool_fn fn, void *arg,
		    uint32_t n_chunks);

/* The range [*b, *e) of chunk `c` of n items split in n_chunks: contiguous,
 * sizes differ by at most one, fixed for (n, n_chunks). */
static inline void threadpool_split(uint32_t n, uint32_t c, uint32_t n_chunks,
				    uint32_t *b, uint32_t *e)
{
	*b = (uint32_t)((uint64_t)n * c / n_chunks);
	*e = (uint32_t)((uint64_t)n * (c + 1) / n_chunks);
}
