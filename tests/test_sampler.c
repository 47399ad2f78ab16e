/* test_sampler.c - the sampler's logit processing and logprobs
 * (gpu/sampler.h) on hand-made logits.
 *
 * The processed logits are observed through the logprobs: with
 * top_logprobs = the whole (small) vocabulary, logprob[i] - logprob[j] is
 * x[i] - x[j] of the processed logits, so each penalty is checked to move
 * exactly the tokens it should by exactly what it should. The plain draw
 * is checked against a reference written here (a full sort, the old
 * algorithm's definition), so a change to the existing path fails.
 */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/sampler.h"

enum { V = 8 };

/* the processed logits, up to a constant, from the logprobs: x[id] =
 * logprob(id) for every id (top_logprobs = V) */
static void processed(struct sampler *s, const struct sampler_params *p0,
		      const float *logits, const struct sampler_hist *h,
		      double *x)
{
	struct sampler_params p = *p0;
	struct sampler_logprobs lp;

	p.logprobs = true;
	p.top_logprobs = V;
	sampler_choose(s, &p, 0, logits, h, &lp);
	ck_assert_uint_eq(lp.n_top, V);
	for (uint32_t i = 0; i < V; i++)
		x[lp.top[i].id] = lp.top[i].logprob;
}

static const float base[V] = { 1.0f, 2.0f, -1.0f, 0.5f, 3.0f, -2.0f, 0.0f, 1.5f };

/* x[i] - x[0] against want[i] - want[0] */
static void expect_diff(const double *x, const double *want)
{
	for (uint32_t i = 1; i < V; i++)
		ck_assert_msg(fabs((x[i] - x[0]) - (want[i] - want[0])) < 1e-4,
			      "token %u: %g, want %g", i, x[i] - x[0], want[i] - want[0]);
}

START_TEST(test_frequency_presence)
{
	struct sampler s;
	/* prompt 1 1 3, output 4 4 6 4 */
	int32_t toks[] = { 1, 1, 3, 4, 4, 6, 4 };
	struct sampler_hist h = { .tokens = toks, .n_tokens = 7, .n_prompt = 3 };
	struct sampler_params p = SAMPLER_PARAMS_GREEDY;
	double x[V], want[V];

	ck_assert_int_eq(sampler_init(&s, V), 0);
	p.frequency_penalty = 0.5f;
	p.presence_penalty = 0.25f;
	processed(&s, &p, base, &h, x);
	for (uint32_t i = 0; i < V; i++)
		want[i] = base[i];
	want[4] -= 0.5 * 3 + 0.25;   /* three times in the output */
	want[6] -= 0.5 * 1 + 0.25;
	/* 1 and 3 are prompt tokens only: untouched */
	expect_diff(x, want);
	/* greedy: 4 (3.0 -> 1.25) loses to token 1 (2.0) */
	ck_assert_uint_eq(sampler_choose(&s, &p, 0, base, &h, NULL), 1);
	/* negative: encourages */
	p.frequency_penalty = -2.0f;
	p.presence_penalty = 0.0f;
	processed(&s, &p, base, &h, x);
	want[4] = base[4] + 6.0;
	want[6] = base[6] + 2.0;
	expect_diff(x, want);
	/* scratch left clean */
	for (uint32_t i = 0; i < V; i++)
		ck_assert(s.count[i] == 0 && s.seen[i] == 0);
	sampler_deinit(&s);
}
END_TEST

START_TEST(test_repetition)
{
	struct sampler s;
	int32_t toks[] = { 1, 2, 2, 5, 1 };   /* prompt 1 2 2, output 5 1 */
	struct sampler_hist h = { .tokens = toks, .n_tokens = 5, .n_prompt = 3 };
	struct sampler_params p = SAMPLER_PARAMS_GREEDY;
	double x[V], want[V];

	ck_assert_int_eq(sampler_init(&s, V), 0);
	p.repetition_penalty = 2.0f;
	processed(&s, &p, base, &h, x);
	for (uint32_t i = 0; i < V; i++)
		want[i] = base[i];
	want[1] /= 2.0;   /* positive: divided, once although seen twice */
	want[2] *= 2.0;   /* negative: multiplied (prompt tokens count) */
	want[5] *= 2.0;
	expect_diff(x, want);
	/* 1 = off, and so is 0 (unset) */
	p.repetition_penalty = 1.0f;
	processed(&s, &p, base, &h, x);
	for (uint32_t i = 0; i < V; i++)
		want[i] = base[i];
	expect_diff(x, want);
	for (uint32_t i = 0; i < V; i++)
		ck_assert(s.count[i] == 0 && s.seen[i] == 0);
	sampler_deinit(&s);
}
END_TEST

START_TEST(test_logit_bias)
{
	struct sampler s;
	struct sampler_bias ban[] = { { 4, -100.0f } };
	struct sampler_bias force[] = { { 2, 100.0f }, { 99, 100.0f } };
	struct sampler_params p = SAMPLER_PARAMS_GREEDY;
	double x[V], want[V];

	ck_assert_int_eq(sampler_init(&s, V), 0);
	ck_assert_uint_eq(sampler_choose(&s, &p, 0, base, NULL, NULL), 4);
	p.logit_bias = ban;
	p.n_logit_bias = 1;
	ck_assert_uint_eq(sampler_choose(&s, &p, 0, base, NULL, NULL), 1);
	processed(&s, &p, base, NULL, x);
	for (uint32_t i = 0; i < V; i++)
		want[i] = base[i];
	want[4] -= 100.0;
	expect_diff(x, want);
	/* +100 forces, at any temperature and seed; an id out of range is
	 * ignored */
	p.logit_bias = force;
	p.n_logit_bias = 2;
	p.temperature = 1.5f;
	for (uint64_t pos = 0; pos < 200; pos++) {
		p.seed = pos * 31;
		ck_assert_uint_eq(sampler_choose(&s, &p, pos, base, NULL, NULL), 2);
	}
	sampler_deinit(&s);
}
END_TEST

START_TEST(test_min_p)
{
	struct sampler s;
	/* probabilities at T = 1: 0.4, 0.3, 0.2, 0.1 (of 4 tokens) */
	float lg[4] = { logf(0.4f), logf(0.3f), logf(0.2f), logf(0.1f) };
	struct sampler_params p = { .temperature = 1.0f, .top_p = 1.0f, .seed = 3 };
	uint32_t hits[4] = { 0 }, N = 4000;

	ck_assert_int_eq(sampler_init(&s, 4), 0);
	p.min_p = 0.6f;   /* keeps p >= 0.24: tokens 0 and 1 */
	for (uint32_t pos = 0; pos < N; pos++)
		hits[sampler_choose(&s, &p, pos, lg, NULL, NULL)]++;
	ck_assert_uint_eq(hits[2] + hits[3], 0);
	/* renormalised over what is kept: 4/7 and 3/7 */
	ck_assert_msg(fabs(hits[0] / (double)N - 4.0 / 7.0) < 0.03, "p0 %u", hits[0]);
	/* at T = 2 the ratios to p_max are square roots: 0.87, 0.71, 0.5;
	 * min_p 0.75 keeps tokens 0 and 1 only */
	p.temperature = 2.0f;
	p.min_p = 0.75f;
	memset(hits, 0, sizeof(hits));
	for (uint32_t pos = 0; pos < N; pos++)
		hits[sampler_choose(&s, &p, pos, lg, NULL, NULL)]++;
	ck_assert_uint_eq(hits[2] + hits[3], 0);
	ck_assert_uint_gt(hits[1], N / 5);
	/* min_p 0: every token appears */
	p.min_p = 0.0f;
	memset(hits, 0, sizeof(hits));
	for (uint32_t pos = 0; pos < N; pos++)
		hits[sampler_choose(&s, &p, pos, lg, NULL, NULL)]++;
	ck_assert_uint_gt(hits[3], 0);
	/* greedy: unchanged by min_p */
	p.temperature = 0.0f;
	p.min_p = 1.0f;
	ck_assert_uint_eq(sampler_choose(&s, &p, 0, lg, NULL, NULL), 0);
	sampler_deinit(&s);
}
END_TEST

START_TEST(test_logprobs)
{
	enum { N = 300 };
	struct sampler s;
	float *lg = malloc(N * sizeof(float));
	struct sampler_params p = { .temperature = 0.8f, .top_p = 0.9f, .seed = 9,
				    .logprobs = true, .top_logprobs = 20 };
	struct sampler_logprobs lp;
	double mx = -1e30, sum = 0.0, lz;
	uint32_t tok;

	ck_assert_int_eq(sampler_init(&s, N), 0);
	for (int i = 0; i < N; i++) {
		lg[i] = (float)sin(i * 1.7) * 4.0f;
		mx = fmax(mx, lg[i]);
	}
	lg[77] = lg[78];   /* a tie: lower id first */
	for (int i = 0; i < N; i++)
		sum += exp(lg[i] - mx);
	lz = mx + log(sum);
	for (uint64_t pos = 0; pos < 50; pos++) {
		tok = sampler_choose(&s, &p, pos, lg, NULL, &lp);
		/* the same token as without logprobs */
		ck_assert_uint_eq(tok, sampler_sample(&s, &p, pos, lg));
		ck_assert_msg(fabs(lp.logprob - (lg[tok] - lz)) < 1e-4,
			      "chosen %g want %g", lp.logprob, lg[tok] - lz);
		ck_assert_uint_eq(lp.n_top, 20);
		for (uint32_t i = 0; i < lp.n_top; i++) {
			int32_t id = lp.top[i].id;

			ck_assert(fabs(lp.top[i].logprob - (lg[id] - lz)) < 1e-4);
			if (i)
				ck_assert(lp.top[i].logprob < lp.top[i - 1].logprob ||
					  (lp.top[i].logprob == lp.top[i - 1].logprob &&
					   id > lp.top[i - 1].id));
		}
		/* nothing outside the top is more likely than its last */
		for (int i = 0; i < N; i++) {
			bool in = false;

			for (uint32_t j = 0; j < lp.n_top; j++)
				in |= lp.top[j].id == i;
			if (!in)
				ck_assert(lg[i] - lz <= lp.top[19].logprob + 1e-6);
		}
	}
	/* greedy: the chosen token is the top one */
	p.temperature = 0.0f;
	tok = sampler_choose(&s, &p, 0, lg, NULL, &lp);
	ck_assert_int_eq(lp.top[0].id, (int32_t)tok);
	ck_assert(lp.logprob == lp.top[0].logprob);
	/* the whole distribution sums to one */
	{
		struct sampler s8;
		double tot = 0.0;

		ck_assert_int_eq(sampler_init(&s8, V), 0);
		p.top_logprobs = V;
		sampler_choose(&s8, &p, 0, base, NULL, &lp);
		for (uint32_t i = 0; i < V; i++)
			tot += exp(lp.top[i].logprob);
		ck_assert_msg(fabs(tot - 1.0) < 1e-5, "sum %g", tot);
		/* a banned token reports the floor, not -inf */
		float inf[V];

		memcpy(inf, base, sizeof(inf));
		inf[3] = -INFINITY;
		sampler_choose(&s8, &p, 0, inf, NULL, &lp);
		ck_assert(lp.top[V - 1].id == 3 && lp.top[V - 1].logprob == SAMPLER_LOGPROB_FLOOR);
		/* top_logprobs 0: only the chosen token's */
		p.top_logprobs = 0;
		sampler_choose(&s8, &p, 0, base, NULL, &lp);
		ck_assert_uint_eq(lp.n_top, 0);
		sampler_deinit(&s8);
	}
	sampler_deinit(&s);
	free(lg);
}
END_TEST

/* ---- the plain draw, against its definition ------------------------------ */

struct ref_cand {
	float logit;
	uint32_t id;
};

static int ref_cmp(const void *pa, const void *pb)
{
	const struct ref_cand *a = pa, *b = pb;

	if (a->logit != b->logit)
		return a->logit > b->logit ? -1 : 1;
	return a->id < b->id ? -1 : a->id > b->id;
}

/* sort all, cut to k, exp at T in double stored as float, sum in double,
 * top-p prefix, one draw on the cumulative sum */
static uint32_t ref_draw(const float *lg, uint32_t n, const struct sampler_params *p,
			 uint64_t pos)
{
	struct ref_cand *c = malloc(n * sizeof(*c));
	float *pr = malloc(n * sizeof(*pr));
	uint32_t k = (p->top_k == 0 || p->top_k > n) ? n : p->top_k, out;
	double sum = 0.0, u, acc = 0.0;

	for (uint32_t i = 0; i < n; i++)
		c[i] = (struct ref_cand){ lg[i], i };
	qsort(c, n, sizeof(*c), ref_cmp);
	for (uint32_t i = 0; i < k; i++) {
		pr[i] = (float)exp((double)(c[i].logit - c[0].logit) / p->temperature);
		sum += pr[i];
	}
	if (p->top_p > 0.0f && p->top_p < 1.0f) {
		double cum = 0.0;

		for (uint32_t i = 0; i < k; i++) {
			cum += pr[i];
			if (cum >= p->top_p * sum) {
				k = i + 1;
				break;
			}
		}
		sum = cum;
	}
	u = sampler_uniform(p->seed, pos) * sum;
	out = c[k - 1].id;
	for (uint32_t i = 0; i < k; i++) {
		acc += pr[i];
		if (u < acc) {
			out = c[i].id;
			break;
		}
	}
	free(c);
	free(pr);
	return out;
}

START_TEST(test_plain_unchanged)
{
	enum { N = 2000 };
	static const struct { float t; uint32_t k; float top_p; } cases[] = {
		{ 1.0f, 0, 1.0f }, { 0.7f, 40, 0.95f }, { 1.3f, 0, 0.5f },
		{ 0.5f, 1500, 1.0f }, { 2.0f, 3, 0.8f },
	};
	struct sampler s;
	float *lg = malloc(N * sizeof(float));
	int32_t toks[] = { 5, 6, 7, 8, 5 };
	struct sampler_hist h = { .tokens = toks, .n_tokens = 5, .n_prompt = 2 };

	ck_assert_int_eq(sampler_init(&s, N), 0);
	for (int i = 0; i < N; i++)
		lg[i] = (float)cos(i * 0.37) * 3.0f + (float)(i % 7) * 0.1f;
	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		struct sampler_params p = { .temperature = cases[c].t, .top_k = cases[c].k,
					    .top_p = cases[c].top_p, .seed = 1000 + c };

		ck_assert(!sampler_params_extended(&p));
		for (uint64_t pos = 0; pos < 300; pos++) {
			uint32_t want = ref_draw(lg, N, &p, pos);

			ck_assert_uint_eq(sampler_sample(&s, &p, pos, lg), want);
			ck_assert_uint_eq(sampler_choose(&s, &p, pos, lg, &h, NULL), want);
		}
	}
	sampler_deinit(&s);
	free(lg);
}
END_TEST

START_TEST(test_extended)
{
	struct sampler_params p = SAMPLER_PARAMS_GREEDY;
	struct sampler_bias b = { 1, 1.0f };

	ck_assert(!sampler_params_extended(&p));
	p.repetition_penalty = 1.0f;
	ck_assert(!sampler_params_extended(&p));
	p.repetition_penalty = 1.1f;
	ck_assert(sampler_params_extended(&p));
	p = (struct sampler_params)SAMPLER_PARAMS_GREEDY;
	p.min_p = 0.1f;
	ck_assert(sampler_params_extended(&p));
	p = (struct sampler_params)SAMPLER_PARAMS_GREEDY;
	p.logprobs = true;
	ck_assert(sampler_params_extended(&p));
	p = (struct sampler_params)SAMPLER_PARAMS_GREEDY;
	p.logit_bias = &b;
	p.n_logit_bias = 1;
	ck_assert(sampler_params_extended(&p));
	p = (struct sampler_params)SAMPLER_PARAMS_GREEDY;
	p.presence_penalty = -0.5f;
	ck_assert(sampler_params_extended(&p));
	p = (struct sampler_params)SAMPLER_PARAMS_GREEDY;
	p.frequency_penalty = 0.5f;
	ck_assert(sampler_params_extended(&p));
}
END_TEST

static Suite *sampler_suite(void)
{
	Suite *s = suite_create("sampler");
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, test_frequency_presence);
	tcase_add_test(tc, test_repetition);
	tcase_add_test(tc, test_logit_bias);
	tcase_add_test(tc, test_min_p);
	tcase_add_test(tc, test_logprobs);
	tcase_add_test(tc, test_plain_unchanged);
	tcase_add_test(tc, test_extended);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(sampler_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
