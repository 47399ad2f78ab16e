/* place.c - where a decode node's prompt is computed (place.h). */
#include "daemon/place.h"

bool serve_place_local(uint32_t percent, uint32_t step_tokens, uint32_t decoders,
		       uint64_t local_pending, uint64_t peer_pending,
		       uint32_t n_prompt)
{
	unsigned __int128 here, there;

	if (percent == 0 || percent > 100 || decoders >= step_tokens)
		return false;
	/* (local + n) * 100 * step_tokens < percent * (step_tokens -
	 * decoders) * (peer + n), in 128 bits: the counts may be as large
	 * as a pool (< 2^64), the factors below 2^7 and 2^32 */
	here = (unsigned __int128)(local_pending + n_prompt) * 100u * step_tokens;
	there = (unsigned __int128)(peer_pending + n_prompt) * percent *
		(step_tokens - decoders);
	return here < there;
}
