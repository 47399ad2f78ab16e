/* bench_sampler.c - the per-token cost of the sampler's processing and
 * logprobs (gpu/sampler.h) against the plain greedy and sampled paths,
 * at the vocabularies of Llama 2 (32000) and Llama 3 (128256), with a
 * request history of 512 tokens (256 prompt, 256 output) for the
 * penalties. Prints the median CPU time per token (this thread's) of 7
 * rounds and the cost over the matching plain path; never fails on speed.
 *
 *   bench_sampler [ROUNDS_OF_TOKENS]   (default 100 tokens a round)
 */
#include "gpu/sampler.h"
#include "conf/util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { ROUNDS = 7, HIST = 512, PROMPT = 256 };

static volatile uint32_t sink;

/* this thread's CPU time: the figures hold on a shared, loaded machine */
static uint64_t cpu_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/* median ns per sampler_choose over ROUNDS rounds of n tokens */
static double run(struct sampler *s, const struct sampler_params *p,
		  const float *logits, const struct sampler_hist *h, unsigned n)
{
	struct sampler_logprobs lp;
	double r[ROUNDS];

	for (int k = 0; k < ROUNDS; k++) {
		uint64_t t0 = cpu_ns();

		for (unsigned i = 0; i < n; i++)
			sink += sampler_choose(s, p, i, logits, h, &lp);
		r[k] = (double)(cpu_ns() - t0) / n;
	}
	qsort(r, ROUNDS, sizeof(r[0]), cmp_d);
	return r[ROUNDS / 2];
}

static void bench_vocab(uint32_t V, unsigned n)
{
	struct sampler s;
	float *lg = malloc(sizeof(float) * V);
	int32_t *toks = malloc(sizeof(int32_t) * HIST);
	struct sampler_bias *bias = malloc(sizeof(*bias) * SAMPLER_BIAS_MAX);
	struct sampler_hist h = { .tokens = toks, .n_tokens = HIST, .n_prompt = PROMPT };
	uint64_t x = 88172645463325252ull;

	if (!lg || !toks || !bias || sampler_init(&s, V)) {
		fprintf(stderr, "bench_sampler: out of memory\n");
		exit(1);
	}
	for (uint32_t i = 0; i < V; i++) {   /* a peaked, logit-like spread */
		x ^= x << 13; x ^= x >> 7; x ^= x << 17;
		lg[i] = (float)((double)(x >> 40) / (1 << 24) * 8.0 - 4.0);
	}
	for (int i = 0; i < HIST; i++)
		toks[i] = (int32_t)((uint32_t)(i * 7919u) % (V / 8));
	for (uint32_t i = 0; i < SAMPLER_BIAS_MAX; i++)
		bias[i] = (struct sampler_bias){ .id = i * (V / SAMPLER_BIAS_MAX), .bias = -1.0f };
	struct {
		const char *name;
		int base;                /* the case it adds to; -1: none */
		struct sampler_params p;
		double ns;
	} c[] = {
		{ "greedy (plain)", -1, SAMPLER_PARAMS_GREEDY, 0 },
		{ "greedy + freq/presence/repetition", 0, { .frequency_penalty = 0.5f,
		  .presence_penalty = 0.5f, .repetition_penalty = 1.1f, .top_p = 1.0f }, 0 },
		{ "greedy + logit_bias (300)", 0, { .logit_bias = bias,
		  .n_logit_bias = SAMPLER_BIAS_MAX, .top_p = 1.0f }, 0 },
		{ "greedy + logprobs (top 0)", 0, { .logprobs = true, .top_p = 1.0f }, 0 },
		{ "greedy + logprobs (top 20)", 0, { .logprobs = true, .top_logprobs = 20,
		  .top_p = 1.0f }, 0 },
		{ "T=0.8 top_k=40 (plain)", -1, { .temperature = 0.8f, .top_k = 40,
		  .top_p = 1.0f, .seed = 1 }, 0 },
		{ "T=0.8 top_k=40 + penalties + min_p", 5, { .temperature = 0.8f,
		  .top_k = 40, .top_p = 1.0f, .seed = 1, .frequency_penalty = 0.5f,
		  .presence_penalty = 0.5f, .repetition_penalty = 1.1f, .min_p = 0.05f }, 0 },
		{ "T=0.8 top_k=40 + logprobs (top 20)", 5, { .temperature = 0.8f,
		  .top_k = 40, .top_p = 1.0f, .seed = 1, .logprobs = true,
		  .top_logprobs = 20 }, 0 },
	};
	size_t nc = sizeof(c) / sizeof(c[0]);

	printf("vocab %u, history %d tokens (%d prompt), %u tokens a round, median of %d:\n",
	       V, HIST, PROMPT, n, ROUNDS);
	for (size_t i = 0; i < nc; i++)
		c[i].ns = run(&s, &c[i].p, lg, &h, n);
	for (size_t i = 0; i < nc; i++) {
		printf("  %-40s %8.1f us/token", c[i].name, c[i].ns / 1000.0);
		if (c[i].base >= 0)
			printf("  (%+.1f us over %s)", (c[i].ns - c[c[i].base].ns) / 1000.0,
			       c[c[i].base].name);
		printf("\n");
	}
	sampler_deinit(&s);
	free(lg);
	free(toks);
	free(bias);
}

int main(int argc, char **argv)
{
	unsigned n = argc > 1 ? (unsigned)strtoul(argv[1], NULL, 10) : 100;

	if (!n)
		n = 100;
	bench_vocab(32000, n);
	bench_vocab(128256, n);
	return 0;
}
