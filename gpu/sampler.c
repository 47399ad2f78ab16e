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

uint32_t sampler_argmax(const float *x, uint32_t n)
{
	uint32_t best = 0;

	for (uint32_t i = 1; i < n; i++)
		if (x[i] > x[best])
			best = i;
	return best;
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
