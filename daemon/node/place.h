/* place.h - where a decode node's prompt is computed (conditional
 * disaggregation).
 *
 * A decode node sends every prompt to a prefill peer unless
 * peers.local_prefill is set. With it set, the node compares the wait a
 * new prompt of n tokens can expect in the two queues it can see, and
 * computes the prompt itself when the local one is shorter:
 *
 *   local  when  (local_pending + n) / here  <  (peer_pending + n) / peer
 *
 * local_pending: prompt tokens this node is computing itself that have no
 * first token yet; peer_pending: prompt tokens of this node's requests on
 * the chosen prefill peer whose prefill_done has not arrived. here / peer
 * is the ratio of the two queues' speeds:
 *
 *   - measured, once both queues have finished PLACE_MIN_TOKENS while
 *     they had work (struct place_speed: prompt tokens finished per second
 *     of time with work, over the last PLACE_WINDOW_S or so of such
 *     time), capped at percent / 100;
 *   - until then percent / 100 * (step_units - decoder_units) /
 *     step_units: percent (peers.local_prefill) is how fast this node
 *     computes prompts relative to one prefill peer when it generates
 *     nothing; its decoders take their share of each step first
 *     (gpu/engine.c), so only the rest serves prompts. The caller counts
 *     a step's work in prompt tokens: decoder_units what its decoders cost
 *     (a token and a logits row each, gpu/cpu/stepcost.h), step_units that
 *     plus the prompt tokens the step would carry beside them
 *     (engine_prompt_budget: engine.step_tokens, engine.step_ms). The
 *     decoders to expect are every other request of the node, not only
 *     those decoding now: a burst of prompts is placed as the node will
 *     be once their first tokens are out, not as the idle node it was.
 *
 * An idle peer always wins (n / here < n / peer never holds for a ratio
 * at most 1), so a lightly loaded pair stays fully disaggregated; a
 * prefill queue that grows makes the decode node take prompts until the
 * two waits are even. Pure: no state but what the caller keeps, no I/O.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#define PLACE_MIN_TOKENS 512     /* finished before a speed is trusted */
#define PLACE_WINDOW_S 10.0      /* time with work a speed remembers */

/* A queue's measured speed. Zeroed = nothing known. */
struct place_speed {
	uint64_t t_last_ns;          /* the last observation */
	uint64_t pending;            /* its pending tokens then */
	double busy_s;               /* time with work (decayed) */
	double done;                 /* tokens finished meanwhile (decayed) */
};

/* Observe the queue at now_ns: `pending` tokens wait in it now, and
 * done_tokens finished since the last observation. The time since then
 * counts as busy when tokens were pending at the last one. */
void place_speed_observe(struct place_speed *q, uint64_t now_ns,
			 uint64_t pending, uint64_t done_tokens);

/* Tokens per second of busy time; 0 while too little is known. */
double place_speed_get(const struct place_speed *q);

/* A step's work in prompt tokens for serve_place_local: n_dec decoders
 * of per_decoder prompt tokens each (1 + a logits row's share,
 * gpu/cpu/stepcost.h; rounded up) beside prompt_budget prompt tokens. Both
 * results saturate at PLACE_UNITS_MAX (a model file sets per_decoder:
 * nothing it holds may wrap the sum); per_decoder not a number >= 1
 * counts as 1. *step_units - *decoder_units is the prompt share. */
#define PLACE_UNITS_MAX (UINT32_MAX / 2)
void place_step_units(uint32_t prompt_budget, uint32_t n_dec, double per_decoder,
		      uint32_t *step_units, uint32_t *decoder_units);

/* v_here, v_peer: the measured speeds (0: not known yet). */
bool serve_place_local(uint32_t percent, uint32_t step_units, uint32_t decoder_units,
		       uint64_t local_pending, uint64_t peer_pending,
		       uint32_t n_prompt, double v_here, double v_peer);
