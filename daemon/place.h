/* place.h - where a decode node's prompt is computed (conditional
 * disaggregation).
 *
 * A decode node sends every prompt to a prefill peer unless
 * peers.local_prefill is set. With it set, the node compares the wait a
 * prompt can expect in the two queues it can see and computes the prompt
 * itself when the local one is shorter:
 *
 *   local  when  (local_pending + n) * 100 < percent * (peer_pending + n)
 *
 * local_pending: prompt tokens this node is computing itself that have no
 * first token yet; peer_pending: prompt tokens of this node's requests on
 * the chosen prefill peer whose prefill_done has not arrived; n: the new
 * prompt's tokens; percent: peers.local_prefill, how fast this node
 * computes prompts (between its decode steps) relative to one prefill
 * peer. An idle peer always wins (n * 100 < percent * n never holds), so
 * a lightly loaded pair stays fully disaggregated; a prefill queue that
 * grows makes the decode node take prompts until the two waits are even.
 * Pure: no state, no I/O.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

bool serve_place_local(uint32_t percent, uint64_t local_pending,
		       uint64_t peer_pending, uint32_t n_prompt);
