/* place.c - where a decode node's prompt is computed (place.h). */
#include "daemon/node/place.h"

#include <math.h>

void place_speed_observe(struct place_speed *q, uint64_t now_ns,
			 uint64_t pending, uint64_t done_tokens)
{
	if (q->pending > 0 && q->t_last_ns && now_ns > q->t_last_ns)
		q->busy_s += (double)(now_ns - q->t_last_ns) / 1e9;
	q->done += (double)done_tokens;
	/* remember about a window of busy time: older halves fade */
	while (q->busy_s > PLACE_WINDOW_S) {
		q->busy_s /= 2;
		q->done /= 2;
	}
	q->pending = pending;
	q->t_last_ns = now_ns;
}

double place_speed_get(const struct place_speed *q)
{
	if (q->done < PLACE_MIN_TOKENS || q->busy_s <= 0)
		return 0;
	return q->done / q->busy_s;
}

void place_step_units(uint32_t prompt_budget, uint32_t n_dec, double per_decoder,
		      uint32_t *step_units, uint32_t *decoder_units)
{
	double d;

	if (!(per_decoder >= 1.0))      /* NaN too */
		per_decoder = 1.0;
	d = ceil((double)n_dec * per_decoder);
	*decoder_units = d < (double)PLACE_UNITS_MAX ? (uint32_t)d : PLACE_UNITS_MAX;
	if (prompt_budget > PLACE_UNITS_MAX - *decoder_units)
		prompt_budget = PLACE_UNITS_MAX - *decoder_units;
	*step_units = *decoder_units + prompt_budget;
}

bool serve_place_local(uint32_t percent, uint32_t step_units, uint32_t decoder_units,
		       uint64_t local_pending, uint64_t peer_pending,
		       uint32_t n_prompt, double v_here, double v_peer)
{
	unsigned __int128 here, there;

	if (percent == 0 || percent > 100 || decoder_units >= step_units)
		return false;
	if (v_here > 0 && v_peer > 0) {
		double ratio = v_here / v_peer;

		if (ratio > percent / 100.0)
			ratio = percent / 100.0;
		return (double)(local_pending + n_prompt) <
		       ratio * (double)(peer_pending + n_prompt);
	}
	/* (local + n) * 100 * step_units < percent * (step_units -
	 * decoder_units) * (peer + n), in 128 bits: the counts may be as
	 * large as a pool (< 2^64), the factors below 2^7 and 2^32 */
	here = (unsigned __int128)(local_pending + n_prompt) * 100u * step_units;
	there = (unsigned __int128)(peer_pending + n_prompt) * percent *
		(step_units - decoder_units);
	return here < there;
}
