/* stepcost.h - how long an engine step takes, learned from the steps run,
 * and how many prompt tokens fit beside a step's decoders in a time target
 * (engine.step_ms).
 *
 * The model: a step's time is proportional to its work units,
 *
 *     units = tokens + outputs * logits_ratio
 *
 * where tokens are all the tokens the step computes through the layers
 * (one per decoder, a chunk per prompt), outputs the rows of logits it
 * computes (one per decoder, one per prompt it finishes) and logits_ratio
 * the multiply-adds of one logits row over those of one token through the
 * layers (from the model's matrix sizes: 0.65 on a dim-512 model with a
 * 16000-token vocabulary and four layers, 0.15 on a 12-layer dim-768 one).
 * The time per unit is an exponentially weighted mean over steps of at
 * least STEPCOST_MIN_UNITS units (smaller ones are mostly fixed costs,
 * which would inflate it), weight 1/8 for the newest. Attention grows with
 * context, thread counts and the machine's load change the speed: the mean
 * follows them within a few dozen steps.
 *
 * A pure calculator: no clock, no threads, no allocation. The engine
 * feeds it each step's counts and duration.
 */
#pragma once

#include <stdint.h>

#define STEPCOST_MIN_UNITS 8u

struct stepcost {
	uint32_t logits_q8;   /* logits_ratio x 256 */
	double ns_per_unit;   /* 0 until a step was observed */
	uint64_t steps;       /* steps observed (large enough) */
};

/* layer_macs: multiply-adds of one token through all layers' matrices;
 * logits_macs: of one row of logits. */
void stepcost_init(struct stepcost *c, uint64_t layer_macs, uint64_t logits_macs);

/* A step ran: tokens through the layers, outputs logits rows, ns long. */
void stepcost_observe(struct stepcost *c, uint32_t tokens, uint32_t outputs,
		      uint64_t ns);

/* The prompt tokens that fit beside n_dec decoders in target_ns:
 * UINT32_MAX while nothing was observed (no limit yet), else
 * floor(target / ns_per_unit - n_dec * (1 + ratio)), at least 0. */
uint32_t stepcost_prompt_budget(const struct stepcost *c, uint32_t n_dec,
				uint64_t target_ns);

/* The time n_dec decoders and n_prompt prompt tokens are predicted to
 * take (0 while nothing was observed). */
uint64_t stepcost_predict_ns(const struct stepcost *c, uint32_t n_dec,
			     uint32_t n_prompt);
