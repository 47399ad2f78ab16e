/* threadpool.h - a fixed set of compute threads that run one function at a
 * time, split by the caller into as many parts as there are threads.
 *
 * threadpool_run(tp, fn, arg) calls fn(arg, i, n) once for every i in
 * [0, n) where n = threadpool_size(tp), part 0 on the calling thread, and
 * returns when every part is done. Which part a thread runs is fixed, and
 * callers split work by output rows only, so results never depend on the
 * thread count (engine determinism).
 *
 * Between runs workers spin briefly, then sleep on a condition variable.
 *
 * Errors: threadpool_new returns 0 or a negative errno (pthread_create).
 * Thread safety: one caller thread drives a pool (run is not reentrant and
 * must not be called from inside fn). Free from the same caller.
 */
#pragma once

#include <stdint.h>

struct threadpool;

typedef void (*threadpool_fn)(void *arg, uint32_t part, uint32_t n_parts);

/* n_threads >= 1 (1 = no extra threads: run() calls fn inline). */
int threadpool_new(struct threadpool **out, uint32_t n_threads);
void threadpool_free(struct threadpool *tp);
uint32_t threadpool_size(const struct threadpool *tp);
void threadpool_run(struct threadpool *tp, threadpool_fn fn, void *arg);

/* The range [*b, *e) of part `part` of n items split in n_parts: contiguous,
 * sizes differ by at most one, fixed for (n, n_parts). */
static inline void threadpool_split(uint32_t n, uint32_t part, uint32_t n_parts,
				    uint32_t *b, uint32_t *e)
{
	*b = (uint32_t)((uint64_t)n * part / n_parts);
	*e = (uint32_t)((uint64_t)n * (part + 1) / n_parts);
}
