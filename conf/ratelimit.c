/* ratelimit.c - the log lines' token bucket (see ratelimit.h).
 *
 * Design. A generic cell rate algorithm: instead of a token count that a
 * timer refills, one timestamp, the "theoretical arrival time" tat. Each
 * line let through pushes tat one period later; a line is let through
 * while tat is at most (burst - 1) periods in the future. A bucket that
 * rested is full again (tat in the past is treated as now), so there is
 * no refill work and no drift; all arithmetic is on u64 nanoseconds and
 * saturates instead of wrapping.
 */
#include "conf/ratelimit.h"

#include <string.h>

void kvd_ratelimit_init(struct kvd_ratelimit *rl, const char *kind,
			uint32_t burst, uint32_t period_ms)
{
	memset(rl, 0, sizeof(*rl));
	rl->kind = kind;
	rl->burst = burst ? burst : 1;
	rl->period_ns = (uint64_t)period_ms * 1000000u;
}

/* How far past now the bucket may run: (burst - 1) periods. */
static uint64_t ratelimit_slack(const struct kvd_ratelimit *rl)
{
	uint32_t b = rl->burst ? rl->burst : 1;

	if (rl->period_ns && (uint64_t)(b - 1) > UINT64_MAX / rl->period_ns)
		return UINT64_MAX;
	return (uint64_t)(b - 1) * rl->period_ns;
}

/* A token is there at now_ns. */
static bool ratelimit_room(const struct kvd_ratelimit *rl, uint64_t now_ns)
{
	uint64_t slack = ratelimit_slack(rl);

	return rl->tat_ns <= now_ns || rl->tat_ns - now_ns <= slack;
}

bool kvd_ratelimit_take(struct kvd_ratelimit *rl, uint64_t now_ns,
			uint64_t *report)
{
	uint64_t base;

	*report = 0;
	if (!rl)
		return true;   /* no bucket: not limited */
	if (!ratelimit_room(rl, now_ns)) {
		rl->suppressed++;
		rl->dropped++;
		return false;
	}
	base = rl->tat_ns > now_ns ? rl->tat_ns : now_ns;
	rl->tat_ns = base > UINT64_MAX - rl->period_ns ? UINT64_MAX
						       : base + rl->period_ns;
	*report = rl->suppressed;
	rl->suppressed = 0;
	return true;
}

uint64_t kvd_ratelimit_flush(struct kvd_ratelimit *rl, uint64_t now_ns)
{
	uint64_t n;

	if (!rl->suppressed || !ratelimit_room(rl, now_ns))
		return 0;
	n = rl->suppressed;
	rl->suppressed = 0;
	return n;
}
