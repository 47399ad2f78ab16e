/* place.c - where a decode node's prompt is computed (place.h). */
#include "daemon/place.h"

bool serve_place_local(uint32_t percent, uint64_t local_pending,
		       uint64_t peer_pending, uint32_t n_prompt)
{
	/* 64-bit products: pending counts are bounded by the pool
	 * (< 2^40 tokens), percent by 100 */
	if (percent == 0 || percent > 100)
		return false;
	return (local_pending + n_prompt) * 100 <
	       (uint64_t)percent * (peer_pending + n_prompt);
}
