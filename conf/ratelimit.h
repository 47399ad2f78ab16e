/* ratelimit.h - a token bucket for log lines a remote party can trigger.
 *
 * A peer or a client that can make kvd write one line per message it
 * sends can fill the disk. Each such kind of line draws from its own
 * bucket: at most `burst` lines at once, refilled at one line per
 * `period_ns`; what does not fit is counted, not written, and the count
 * is reported once (`event=log_suppressed kind=K suppressed=N`) when the
 * bucket lets a line through again, or at the owner's next flush
 * (kvd_ratelimit_flush from a periodic timer), whichever comes first.
 *
 * Pure: the caller passes the time (kvd_now_ns()), so the unit test
 * drives it with its own clock. Not thread safe: one owner (the loop).
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

struct kvd_ratelimit {
	const char *kind;      /* a bare word, named in the summary line */
	uint64_t period_ns;    /* one more line per period */
	uint32_t burst;        /* lines at once (>= 1) */
	uint64_t tat_ns;       /* theoretical arrival time (GCRA): the bucket
				* is full when tat_ns <= now */
	uint64_t suppressed;   /* lines dropped, not reported yet */
	uint64_t dropped;      /* lines dropped in all (for tests, status) */
};

void kvd_ratelimit_init(struct kvd_ratelimit *rl, const char *kind,
			uint32_t burst, uint32_t period_ms);

/* One line wants out at now_ns: true to write it (one token taken; a
 * NULL rl limits nothing, for a call site that limits only some lines),
 * false when the bucket is empty (the line is counted as suppressed).
 * When true and lines were suppressed since the last report, *report is
 * their number (the caller writes the summary first) and the count
 * starts again; otherwise *report is 0. */
bool kvd_ratelimit_take(struct kvd_ratelimit *rl, uint64_t now_ns,
			uint64_t *report);

/* The periodic summary: once the bucket has a token again, the lines
 * suppressed since the last report (and the count starts again), else 0
 * (nothing to say yet, or still flooded: said at the next flush or
 * take). Takes no token. */
uint64_t kvd_ratelimit_flush(struct kvd_ratelimit *rl, uint64_t now_ns);
