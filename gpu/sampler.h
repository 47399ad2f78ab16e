/* sampler.h - choose the next token from logits.
 *
 * Greedy (temperature <= 0: the arg max, lowest id on ties) or a random
 * draw after temperature, top-k (0 = off) and top-p (>= 1 = off). The draw
 * for position `pos` uses a counter-based generator: u = hash(seed, pos),
 * so the token chosen depends only on (params, pos, logits), never on the
 * order in which requests are stepped or what else is in the batch
 * (invariant 9).
 *
 * Thread safety: a struct sampler is scratch for one thread at a time;
 * params are plain values.
 */
#pragma once

#include <stdint.h>

struct sampler_params {
	float temperature;   /* <= 0: greedy */
	uint32_t top_k;      /* 0: all tokens */
	float top_p;         /* (0, 1]; >= 1: off */
	uint64_t seed;
};

#define SAMPLER_PARAMS_GREEDY \
	{ .temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .seed = 0 }

struct sampler_cand {
	float logit;
	uint32_t id;
};

struct sampler {
	uint32_t n_vocab;
	struct sampler_cand *cand;  /* (n_vocab) scratch */
	float *prob;                /* (n_vocab) scratch */
};

int sampler_init(struct sampler *s, uint32_t n_vocab);
void sampler_deinit(struct sampler *s);

/* The uniform draw in [0, 1) for (seed, pos). */
double sampler_uniform(uint64_t seed, uint64_t pos);

/* logits: (n_vocab), not modified. Returns the token id. */
uint32_t sampler_sample(struct sampler *s, const struct sampler_params *p,
			uint64_t pos, const float *logits);
/* Arg max of x (n), lowest index on ties. */
uint32_t sampler_argmax(const float *x, uint32_t n);
