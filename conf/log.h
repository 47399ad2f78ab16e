/* log.h - structured log lines: one event per line, key=value pairs.
 *
 * Every line reads
 *   ts=2026-11-29T14:25:37.123Z level=info node=NAME event=NAME key=value ...
 * Event names are stable: operators grep and audit them (kvctl audit reads
 * event=kv_capacity). Modules never print; they take a `struct kvlog *` from
 * their owner and log through the KVLOG() macro, which checks the level
 * before any argument is formatted.
 *
 * Every value that came from outside (a peer, a client, a file, the
 * config, an admin frame, an error message carried in a frame) is written
 * with KVLOG_Q() / kvlog_quote(), never as a raw "%s" nor inside a literal
 * \"%s\": an embedded quote or newline would break out. A raw "%s" is
 * only for bare words kvd itself chose (enum names, table entries).
 * kvlog__emit() also writes any control byte in the formatted text as
 * \xNN, so one call is always exactly one line.
 *
 * Thread safety: kvlog_emit() builds the whole line in a local buffer and
 * writes it with one write(2), so lines from the compute threads and the
 * loop never interleave.
 */
#pragma once

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "conf/ratelimit.h"
#include "conf/util.h"

enum kvlog_level {
	KVLOG_ERROR = 0,
	KVLOG_WARN = 1,
	KVLOG_INFO = 2,
	KVLOG_DEBUG = 3,
};

struct kvlog {
	int level;        /* lines above this level are dropped before formatting */
	int fd;           /* destination; 2 (stderr) by default */
	char node[256];   /* node name added to every line, quoted as needed;
			     empty = omitted */
};

#define KVLOG_NULL { .level = KVLOG_INFO, .fd = 2, .node = "" }

void kvlog_init(struct kvlog *lg, int level, int fd, const char *node);

/* Parse "error|warn|info|debug"; returns the level or -1. */
int kvlog_level_parse(const char *s);
const char *kvlog_level_name(int level);

/* Emit one line: `event` then the printf-formatted key=value tail. */
void kvlog__emit(struct kvlog *lg, int level, const char *event,
		 const char *fmt, ...) __attribute__((format(printf, 4, 5)));

#define KVLOG(lg, lvl, event, ...)                                    \
	do {                                                          \
		struct kvlog *kvlog__lg = (lg);                       \
		if (kvlog__lg && kvlog__lg->level >= (lvl))           \
			kvlog__emit(kvlog__lg, (lvl), (event), __VA_ARGS__); \
	} while (0)

/* A line a remote party can trigger at will (a peer's or a client's
 * message, a refused connection): as KVLOG(), and then only when the
 * token bucket `rl` (conf/ratelimit.h) lets it through. Lines the bucket
 * held back are summed in one `event=log_suppressed kind=K suppressed=N`
 * line, written before the next line it lets through (and by the
 * owner's periodic kvlog_ratelimit_flush()). The level is checked
 * first: a line that would be dropped anyway takes no token. */
#define KVLOG_RL(lg, rl, lvl, event, ...)                             \
	do {                                                          \
		struct kvlog *kvlog__lg = (lg);                       \
		uint64_t kvlog__n;                                    \
		if (kvlog__lg && kvlog__lg->level >= (lvl) &&         \
		    kvd_ratelimit_take((rl), kvd_now_ns(), &kvlog__n)) { \
			if (kvlog__n)                                 \
				kvlog__suppressed(kvlog__lg, (lvl), (rl), kvlog__n); \
			kvlog__emit(kvlog__lg, (lvl), (event), __VA_ARGS__); \
		}                                                     \
	} while (0)

#define KVLOG_RL_ERR(lg, rl, event, ...) KVLOG_RL(lg, rl, KVLOG_ERROR, event, __VA_ARGS__)
#define KVLOG_RL_WARN(lg, rl, event, ...) KVLOG_RL(lg, rl, KVLOG_WARN, event, __VA_ARGS__)
#define KVLOG_RL_INFO(lg, rl, event, ...) KVLOG_RL(lg, rl, KVLOG_INFO, event, __VA_ARGS__)

/* The summary line of `n` lines rl held back. */
void kvlog__suppressed(struct kvlog *lg, int level,
		       const struct kvd_ratelimit *rl, uint64_t n);
/* The periodic summary: when rl has room again and held lines back,
 * write their count (at `level`). Call it from a timer. */
void kvlog_ratelimit_flush(struct kvlog *lg, int level,
			   struct kvd_ratelimit *rl);

#define KVLOG_ERR(lg, event, ...) KVLOG(lg, KVLOG_ERROR, event, __VA_ARGS__)
#define KVLOG_WARN(lg, event, ...) KVLOG(lg, KVLOG_WARN, event, __VA_ARGS__)
#define KVLOG_INFO(lg, event, ...) KVLOG(lg, KVLOG_INFO, event, __VA_ARGS__)
#define KVLOG_DEBUG(lg, event, ...) KVLOG(lg, KVLOG_DEBUG, event, __VA_ARGS__)

/* An internal invariant, checked in every build: when it does not hold,
 * one error line `event=invariant_breach` names it and the process aborts
 * (a node that lost track of whose KV a page holds must not go on). */
#define KVD_ASSERT(lg, cond, ...)                                       \
	do {                                                            \
		if (kvd_unlikely(!(cond))) {                            \
			KVLOG_ERR(lg, "invariant_breach", "assert=%s at=%s:%d", \
				  #cond, __FILE__, __LINE__);           \
			KVLOG_ERR(lg, "invariant_breach", __VA_ARGS__); \
			abort();                                        \
		}                                                       \
	} while (0)

/* Write `s` as a log value into buf: bare if it is non-empty valid UTF-8
 * with no space, quote, '=', backslash or control character, else
 * double-quoted with \" and \\ escaped and control bytes and bytes of
 * invalid UTF-8 as \xNN (valid UTF-8 stays readable). NULL logs as "".
 * A value too long for buf is cut between characters, still quoted.
 * Returns buf. */
const char *kvlog_quote(char *buf, size_t size, const char *s);

/* Room for one quoted value in KVLOG_Q(); longer values are cut. */
#define KVLOG_QUOTE_MAX 512

/* kvlog_quote() into a compound literal, for use as a KVLOG() argument:
 *   KVLOG_WARN(lg, "peer_refused", "peer_node=%s msg=%s",
 *              KVLOG_Q(hello.node), KVLOG_Q(m.message));
 * The buffer lives until the end of the block KVLOG() opens, and is only
 * filled when the level lets the line through. */
#define KVLOG_Q(s) kvlog_quote((char[KVLOG_QUOTE_MAX]){ 0 }, KVLOG_QUOTE_MAX, (s))
