/* sampler.c - greedy and stochastic sampling with a position-keyed RNG.
 *
 * The random number for position p is splitmix64(seed ^ splitmix64(p)):
 * a pure function, so no sampler state carries from one step to the next
 * and a request gives the same tokens alone or among hundreds.
 *
 * Stochastic path: candidates are ordered by (logit desc, id asc) - a
 * total order, so ties never depend on the sort's stability - cut to top-k
 * (selection with a bounded min-heap when k is small, a full sort
 * otherwise), softmax'd at the temperature in double, cut to the smallest
 * prefix whose mass reaches top-p, and one draw walks the cumulative sum.
 */
#include "gpu/sampler.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t splitmix64(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

double sampler_uniform(uint64_t seed, uint64_t pos)
{
	uint64_t r = splitmix64(seed ^ splitmix64(pos));

	return (double)(r >> 11) * (1.0 / 9007199254740992.0);
}

int sampler_init(struct sampler *s, uint32_t n_vocab)
{
	s->n_vocab = n_vocab;
	s->cand = calloc(n_vocab ? n_vocab : 1, sizeof(*s->cand));
	s->prob = calloc(n_vocab ? n_vocab : 1, sizeof(*s->prob));
	if (!s->cand || !s->prob) {
		sampler_deinit(s);
		return -ENOMEM;
	}
	return 0;
}

void sampler_deinit(struct sampler *s)
{
	free(s->cand);
	free(s->prob);
	s->cand = NULL;
	s->prob = NULL;
}

/* The scan itself: best = i when x[i] > x[best], from best = 0 (a NaN is
 * never greater, nothing is greater than a NaN in x[0], and on ties, -0
 * and +0 included, the first index stays). */
static uint32_t argmax_scan(const float *x, uint32_t n)
{
	uint32_t best = 0;

	for (uint32_t i = 1; i < n; i++)
		if (x[i] > x[best])
			best = i;
	return best;
}

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

/* The scan's answer in two AVX2 passes: the largest value, 16 lanes at
 * a time (vmaxps is `a > b ? a : b` per lane, the scan's own compare, so
 * NaNs are passed over as the scan passes them), then the first index
 * holding it (== matches -0 for +0, the scan's ties). A greedy decode
 * step calls this once per sequence over the whole vocabulary
 * (16000-150000 floats), where the scan's chain of dependent compares
 * was ~3% of a batched decode step (tests/bench/bench_engine --batch). */
__attribute__((target("avx2")))
static uint32_t argmax_avx2(const float *x, uint32_t n)
{
	__m256 a = _mm256_set1_ps(x[0]), b = a, mv;
	float lane[8], m = x[0];
	uint32_t i;

	for (i = 0; i + 16 <= n; i += 16) {
		a = _mm256_max_ps(_mm256_loadu_ps(x + i), a);
		b = _mm256_max_ps(_mm256_loadu_ps(x + i + 8), b);
	}
	_mm256_storeu_ps(lane, _mm256_max_ps(a, b));
	for (int l = 0; l < 8; l++)
		m = lane[l] > m ? lane[l] : m;
	for (uint32_t j = i; j < n; j++)
		m = x[j] > m ? x[j] : m;
	mv = _mm256_set1_ps(m);
	for (i = 0; i + 8 <= n; i += 8) {
		int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), mv,
							   _CMP_EQ_OQ));

		if (hit)
			return i + (uint32_t)__builtin_ctz((unsigned)hit);
	}
	for (; i < n; i++)
		if (x[i] == m)
			return i;
	return 0;
}
#endif

uint32_t sampler_argmax(const float *x, uint32_t n)
{
	/* x[0] a NaN: the scan never moves (and m below must be a value) */
	if (n < 64 || x[0] != x[0])
		return argmax_scan(x, n);
#if defined(__x86_64__) || defined(__i386__)
	if (__builtin_cpu_supports("avx2"))
		return argmax_avx2(x, n);
#endif
	return argmax_scan(x, n);
}

/* a before b: higher logit first, then lower id */
static int cand_before(const struct sampler_cand *a, const struct sampler_cand *b)
{
	if (a->logit != b->logit)
		return a->logit > b->logit;
	return a->id < b->id;
}

static int cand_cmp(const void *pa, const void *pb)
{
	const struct sampler_cand *a = pa, *b = pb;

	if (cand_before(a, b))
		return -1;
	if (cand_before(b, a))
		return 1;
	return 0;
}

/* Keep the k best of c[0..n) in c[0..k) (a min-heap on "before" order,
 * root = worst kept), then sort them. */
static void select_top_k(struct sampler_cand *c, uint32_t n, uint32_t k)
{
	for (uint32_t i = k; i < n; i++) {
		uint32_t j = 0;

		if (!cand_before(&c[i], &c[0]))
			continue;
		c[0] = c[i];
		for (;;) { /* sift down: children that are worse rise */
			uint32_t l = 2 * j + 1, r = l + 1, w = j;

			if (l < k && cand_before(&c[w], &c[l]))
				w = l;
			if (r < k && cand_before(&c[w], &c[r]))
				w = r;
			if (w == j)
				break;
			struct sampler_cand t = c[j];
			c[j] = c[w];
			c[w] = t;
			j = w;
		}
	}
}

static void heapify_worst(struct sampler_cand *c, uint32_t k)
{
	for (uint32_t s = k / 2; s-- > 0;) {
		uint32_t j = s;

		for (;;) {
			uint32_t l = 2 * j + 1, r = l + 1, w = j;

			if (l < k && cand_before(&c[w], &c[l]))
				w = l;
			if (r < k && cand_before(&c[w], &c[r]))
				w = r;
			if (w == j)
				break;
			struct sampler_cand t = c[j];
			c[j] = c[w];
			c[w] = t;
			j = w;
		}
	}
}

uint32_t sampler_sample(struct sampler *s, const struct sampler_params *p,
			uint64_t pos, const float *logits)
{
	uint32_t n = s->n_vocab, k;
	double sum = 0.0, u, acc;
	float max;

	if (p->temperature <= 0.0f || n <= 1)
		return sampler_argmax(logits, n);
	for (uint32_t i = 0; i < n; i++) {
		s->cand[i].logit = logits[i];
		s->cand[i].id = i;
	}
	k = (p->top_k == 0 || p->top_k > n) ? n : p->top_k;
	if (k < n && k <= 1024) {
		heapify_worst(s->cand, k);
		select_top_k(s->cand, n, k);
		qsort(s->cand, k, sizeof(*s->cand), cand_cmp);
	} else {
		qsort(s->cand, n, sizeof(*s->cand), cand_cmp);
	}
	max = s->cand[0].logit;
	for (uint32_t i = 0; i < k; i++) {
		double e = exp((double)(s->cand[i].logit - max) / p->temperature);

		s->prob[i] = (float)e;
		sum += s->prob[i];
	}
	if (p->top_p > 0.0f && p->top_p < 1.0f) {
		double cum = 0.0;
		uint32_t keep = k;

		for (uint32_t i = 0; i < k; i++) {
			cum += s->prob[i];
			if (cum >= p->top_p * sum) {
				keep = i + 1;
				break;
			}
		}
		k = keep;
		sum = cum;
	}
	u = sampler_uniform(p->seed, pos) * sum;
	acc = 0.0;
	for (uint32_t i = 0; i < k; i++) {
		acc += s->prob[i];
		if (u < acc)
			return s->cand[i].id;
	}
	return s->cand[k - 1].id;
}
