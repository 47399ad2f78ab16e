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
 *
 * Processing (sampler_choose) works on s->work, a copy of the logits,
 * only when the params ask for it, so a plain request reads the model's
 * logits exactly as before. The penalties need each token's count in the
 * output and whether it was seen at all: s->count and s->seen are zero
 * between calls; one pass over the tokens sets them, a second applies
 * each distinct token's penalty once and clears its entry, so a step
 * costs O(tokens) there and O(vocab) for the copy, never a clear of the
 * whole vocabulary. min_p is a cut of the sorted candidates at the
 * temperature: p_i >= min_p * p_max is e_i >= min_p, as e_max = 1.
 */
#include "gpu/sampler.h"
#include "conf/util.h"

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
	s->work = calloc(n_vocab ? n_vocab : 1, sizeof(*s->work));
	s->count = calloc(n_vocab ? n_vocab : 1, sizeof(*s->count));
	s->seen = calloc(n_vocab ? n_vocab : 1, sizeof(*s->seen));
	if (!s->cand || !s->prob || !s->work || !s->count || !s->seen) {
		sampler_deinit(s);
		return -ENOMEM;
	}
	return 0;
}

void sampler_deinit(struct sampler *s)
{
	free(s->cand);
	free(s->prob);
	free(s->work);
	free(s->count);
	free(s->seen);
	s->cand = NULL;
	s->prob = NULL;
	s->work = NULL;
	s->count = NULL;
	s->seen = NULL;
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

/* The k best candidates of x, sorted, in s->cand[0..k). */
static void cand_top(struct sampler *s, const float *x, uint32_t k)
{
	uint32_t n = s->n_vocab;

	for (uint32_t i = 0; i < n; i++) {
		s->cand[i].logit = x[i];
		s->cand[i].id = i;
	}
	if (k < n && k <= 1024) {
		heapify_worst(s->cand, k);
		select_top_k(s->cand, n, k);
		qsort(s->cand, k, sizeof(*s->cand), cand_cmp);
	} else {
		qsort(s->cand, n, sizeof(*s->cand), cand_cmp);
	}
}

/* The kept prefix of the k sorted candidates under min_p (0: all). */
static uint32_t min_p_keep(const struct sampler *s, float min_p, uint32_t k)
{
	if (!(min_p > 0.0f))
		return k;
	for (uint32_t i = 1; i < k; i++)
		if (s->prob[i] < min_p)   /* prob[0] = 1: the max */
			return i;
	return k;
}

/* The stochastic draw over x (temperature > 0, n > 1). */
static uint32_t sample_draw(struct sampler *s, const struct sampler_params *p,
			    uint64_t pos, const float *x)
{
	uint32_t n = s->n_vocab, k;
	double sum = 0.0, u, acc;
	float max;

	k = (p->top_k == 0 || p->top_k > n) ? n : p->top_k;
	cand_top(s, x, k);
	max = s->cand[0].logit;
	for (uint32_t i = 0; i < k; i++) {
		double e = exp((double)(s->cand[i].logit - max) / p->temperature);

		s->prob[i] = (float)e;
	}
	k = min_p_keep(s, p->min_p, k);
	for (uint32_t i = 0; i < k; i++)
		sum += s->prob[i];
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

uint32_t sampler_sample(struct sampler *s, const struct sampler_params *p,
			uint64_t pos, const float *logits)
{
	if (p->temperature <= 0.0f || s->n_vocab <= 1)
		return sampler_argmax(logits, s->n_vocab);
	return sample_draw(s, p, pos, logits);
}

static bool rep_on(const struct sampler_params *p)
{
	return p->repetition_penalty > 0.0f && p->repetition_penalty != 1.0f;
}

static bool processing_on(const struct sampler_params *p)
{
	return p->n_logit_bias || rep_on(p) || p->presence_penalty != 0.0f ||
	       p->frequency_penalty != 0.0f;
}

bool sampler_params_extended(const struct sampler_params *p)
{
	return processing_on(p) || p->min_p > 0.0f || p->logprobs;
}

static void apply_bias(struct sampler *s, const struct sampler_params *p)
{
	for (uint32_t i = 0; i < p->n_logit_bias; i++)
		if (p->logit_bias[i].id < s->n_vocab)
			s->work[p->logit_bias[i].id] += p->logit_bias[i].bias;
}

/* repetition over every token, then frequency/presence over the output */
static void apply_penalties(struct sampler *s, const struct sampler_params *p,
			    const struct sampler_hist *h)
{
	uint32_t n = s->n_vocab, np = KVD_MIN(h->n_prompt, h->n_tokens);
	uint32_t from = rep_on(p) ? 0 : np;
	float rp = p->repetition_penalty;

	for (uint32_t i = from; i < h->n_tokens; i++) {
		uint32_t t = (uint32_t)h->tokens[i];

		if (t >= n)
			continue;
		s->seen[t] = 1;
		s->count[t] += i >= np;
	}
	for (uint32_t i = from; i < h->n_tokens; i++) {
		uint32_t t = (uint32_t)h->tokens[i];
		float *x = &s->work[t];

		if (t >= n || !s->seen[t])
			continue;
		if (rep_on(p))
			*x = *x > 0.0f ? *x / rp : *x * rp;
		if (s->count[t])
			*x -= p->frequency_penalty * (float)s->count[t] +
			      p->presence_penalty;
		s->seen[t] = 0;
		s->count[t] = 0;
	}
}

/* log-softmax of x: the chosen token's and the top alternatives */
static void fill_logprobs(struct sampler *s, const struct sampler_params *p,
			  const float *x, uint32_t tok, struct sampler_logprobs *lp)
{
	uint32_t n = s->n_vocab, k = KVD_MIN(p->top_logprobs, SAMPLER_TOP_LOGPROBS_MAX);
	float max = x[sampler_argmax(x, n)];
	double sum = 0.0, lz;

	/* expf of a value <= 0 in float (its error ~1e-7 relative is far
	 * below what a logprob shows), summed in double */
	for (uint32_t i = 0; i < n; i++)
		sum += expf(x[i] - max);
	lz = (double)max + log(sum);
	lp->logprob = fmaxf((float)(x[tok] - lz), SAMPLER_LOGPROB_FLOOR);
	k = KVD_MIN(k, n);
	lp->n_top = k;
	if (!k)
		return;
	cand_top(s, x, k);
	for (uint32_t i = 0; i < k; i++)
		lp->top[i] = (struct sampler_top){ .id = (int32_t)s->cand[i].id,
			.logprob = fmaxf((float)(s->cand[i].logit - lz),
					 SAMPLER_LOGPROB_FLOOR) };
}

uint32_t sampler_choose(struct sampler *s, const struct sampler_params *p,
			uint64_t pos, const float *logits,
			const struct sampler_hist *h, struct sampler_logprobs *lp)
{
	const float *x = logits;
	uint32_t tok;

	if (processing_on(p)) {
		memcpy(s->work, logits, sizeof(*s->work) * s->n_vocab);
		apply_bias(s, p);
		if (h)
			apply_penalties(s, p, h);
		x = s->work;
	}
	tok = sampler_sample(s, p, pos, x);
	if (lp && p->logprobs)
		fill_logprobs(s, p, x, tok, lp);
	return tok;
}
