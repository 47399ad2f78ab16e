/* sampler.h - choose the next token from logits.
 *
 * Greedy (temperature <= 0: the arg max, lowest id on ties) or a random
 * draw after temperature, top-k (0 = off) and top-p (>= 1 = off). The draw
 * for position `pos` uses a counter-based generator: u = hash(seed, pos),
 * so the token chosen depends only on (params, pos, logits), never on the
 * order in which requests are stepped or what else is in the batch
 * (invariant 9).
 *
 * Logit processing (sampler_choose), each off by default, in this order
 * over a scratch copy of the logits (the model's are never changed):
 *   1. logit_bias: logit[id] += bias (OpenAI; [-100, 100]);
 *   2. repetition_penalty (llama.cpp/HF; (0, 10], 1 or 0 = off): a token
 *      seen in the prompt or the output so far has its logit divided by
 *      it when positive, multiplied by it otherwise;
 *   3. frequency_penalty and presence_penalty (OpenAI; [-2, 2]): over
 *      the output so far, logit -= frequency * count + presence * (count
 *      > 0);
 * then greedy or the draw as above, with min_p ([0, 1], 0 = off) after
 * temperature and top-k, before top-p: a candidate whose probability is
 * below min_p * p_max is dropped (greedy is unchanged by it). Parameters
 * that use none of these choose exactly what sampler_sample chooses.
 * The choice depends only on (params, pos, logits, the request's tokens).
 *
 * Log-probabilities (SAMPLER_LOGPROBS): the log-softmax of the processed
 * logits (after logit_bias and the penalties, before temperature, top-k,
 * min_p and top-p: vLLM's default "raw logprobs" of the processed logits),
 * floored at SAMPLER_LOGPROB_FLOOR (-9999, as OpenAI reports a token the
 * bias banned), for the chosen token and the top_logprobs most likely
 * (logprob desc, id asc).
 *
 * Thread safety: a struct sampler is scratch for one thread at a time;
 * params are plain values.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#define SAMPLER_BIAS_MAX 300u        /* logit_bias entries, as OpenAI */
#define SAMPLER_TOP_LOGPROBS_MAX 20u /* alternatives reported per token */
#define SAMPLER_LOGPROB_FLOOR (-9999.0f)

struct sampler_bias {
	uint32_t id;
	float bias;                  /* [-100, 100] */
};

struct sampler_params {
	float temperature;   /* <= 0: greedy */
	uint32_t top_k;      /* 0: all tokens */
	float top_p;         /* (0, 1]; >= 1: off */
	uint64_t seed;
	/* processing (0 = off, repetition_penalty also 1) */
	float presence_penalty;      /* [-2, 2] */
	float frequency_penalty;     /* [-2, 2] */
	float repetition_penalty;    /* (0, 10] */
	float min_p;                 /* [0, 1] */
	/* (n_logit_bias <= SAMPLER_BIAS_MAX) ids strictly increasing, each
	 * < n_vocab (one out of range is ignored); borrowed: whoever holds
	 * the params keeps it alive (the engine copies it at submit) */
	const struct sampler_bias *logit_bias;
	uint32_t n_logit_bias;
	/* report log-probabilities (chosen token and top_logprobs <=
	 * SAMPLER_TOP_LOGPROBS_MAX alternatives); no effect on the choice */
	bool logprobs;
	uint8_t top_logprobs;
};

#define SAMPLER_PARAMS_GREEDY \
	{ .temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .seed = 0 }

/* true when p asks for anything beyond temperature, top_k, top_p and seed
 * (what a prefill peer samples the first token with): processing or
 * logprobs. */
bool sampler_params_extended(const struct sampler_params *p);

/* The log-probabilities of one chosen token. */
struct sampler_top {
	int32_t id;
	float logprob;
};

struct sampler_logprobs {
	float logprob;               /* the chosen token's */
	uint32_t n_top;              /* <= SAMPLER_TOP_LOGPROBS_MAX */
	struct sampler_top top[SAMPLER_TOP_LOGPROBS_MAX]; /* most likely first */
};

/* The tokens a request has so far: prompt then output. */
struct sampler_hist {
	const int32_t *tokens;       /* (n_tokens) */
	uint32_t n_tokens;
	uint32_t n_prompt;           /* <= n_tokens */
};

struct sampler_cand {
	float logit;
	uint32_t id;
};

struct sampler {
	uint32_t n_vocab;
	struct sampler_cand *cand;  /* (n_vocab) scratch */
	float *prob;                /* (n_vocab) scratch */
	float *work;                /* (n_vocab) processed logits */
	uint32_t *count;            /* (n_vocab) output counts, kept zero
				     * between calls */
	uint8_t *seen;              /* (n_vocab) kept zero between calls */
};

int sampler_init(struct sampler *s, uint32_t n_vocab);
void sampler_deinit(struct sampler *s);

/* The uniform draw in [0, 1) for (seed, pos). */
double sampler_uniform(uint64_t seed, uint64_t pos);

/* logits: (n_vocab), not modified. Returns the token id. */
uint32_t sampler_sample(struct sampler *s, const struct sampler_params *p,
			uint64_t pos, const float *logits);
/* sampler_sample with the processing above over h (the request's tokens;
 * NULL: none), and with p->logprobs and lp non-NULL, *lp filled for the
 * chosen token. O(n_tokens + n_vocab), no allocation. */
uint32_t sampler_choose(struct sampler *s, const struct sampler_params *p,
			uint64_t pos, const float *logits,
			const struct sampler_hist *h, struct sampler_logprobs *lp);
/* Arg max of x (n), lowest index on ties. */
uint32_t sampler_argmax(const float *x, uint32_t n);
