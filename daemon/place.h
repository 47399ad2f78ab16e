/* place.h - where a decode node's prompt is computed (conditional
 * disaggregation).
 *
 * A decode node sends every prompt to a prefill peer unless
 * peers.local_prefill is set. With it set, the node compares the wait a
 * new prompt of n tokens can expect in the two queues it can see, and
 * computes the prompt itself when the local one is shorter:
 *
 *   local  when  (local_pending + n) / here  <  (peer_pending + n)
 *   here = percent / 100 * (step_tokens - decoders) / step_tokens
 *
 * local_pending: prompt tokens this node is computing itself that have no
 * first token yet; peer_pending: prompt tokens of this node's requests on
 * the chosen prefill peer whose prefill_done has not arrived; percent:
 * peers.local_prefill, how fast this node computes prompts relative to
 * one prefill peer when it has nothing else to do; step_tokens: its
 * engine's step budget, of which its running decoders take one token
 * each first (gpu/engine.c), so only the rest serves prompts: the busier
 * its generations, the slower its prompts, the fewer it takes. An idle
 * peer always wins (n / here < n never holds for here <= 1), so a lightly
 * loaded pair stays fully disaggregated; a prefill queue that grows makes
 * the decode node take prompts until the two waits are even. Pure: no
 * state, no I/O.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

bool serve_place_local(uint32_t percent, uint32_t step_tokens, uint32_t decoders,
		       uint64_t local_pending, uint64_t peer_pending,
		       uint32_t n_prompt);
