/* log.c - structured log lines.
 *
 * The line is formatted into a stack buffer and written with a single
 * write(2): a log call never allocates, never takes a lock, and lines from
 * different threads never interleave (pipes and journald keep writes of up
 * to PIPE_BUF atomic; longer lines are truncated to the buffer and end in
 * "...").
 *
 * One call is one line, whatever its arguments hold. Values from outside
 * (peers, clients, files, the config, admin frames) are passed through
 * KVLOG_Q()/kvlog_quote(), which double-quotes them with \" \\ and \xNN
 * escapes, so a hostile value can neither end the line nor add a key. As
 * a second wall, the emitter writes any control byte left in the
 * formatted text as \xNN: a call site that forgot to quote can garble its
 * own line but cannot start another (a forged event=kv_capacity line is
 * what `kvctl audit` would trust).
 */
#include "conf/log.h"
#include "conf/util.h"

#include <stdbool.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define KVLOG_LINE_MAX 4096

static const char *const level_names[] = { "error", "warn", "info", "debug" };

void kvlog_init(struct kvlog *lg, int level, int fd, const char *node)
{
	lg->level = level;
	lg->fd = fd;
	/* The name comes from the config: quoted like any outside value. */
	if (node && node[0])
		kvlog_quote(lg->node, sizeof(lg->node), node);
	else
		lg->node[0] = '\0';
}

int kvlog_level_parse(const char *s)
{
	for (size_t i = 0; i < KVD_ARRAY_SIZE(level_names); i++)
		if (strcmp(s, level_names[i]) == 0)
			return (int)i;
	return -1;
}

const char *kvlog_level_name(int level)
{
	if (level < 0 || level >= (int)KVD_ARRAY_SIZE(level_names))
		return "?";
	return level_names[level];
}

static size_t put_ts(char *buf, size_t size)
{
	uint64_t ns = kvd_wall_ns();
	time_t secs = (time_t)(ns / 1000000000u);
	struct tm tm;
	size_t n;

	gmtime_r(&secs, &tm);
	n = strftime(buf, size, "ts=%Y-%m-%dT%H:%M:%S", &tm);
	n += (size_t)snprintf(buf + n, size - n, ".%03uZ",
			      (unsigned)((ns / 1000000u) % 1000u));
	return n;
}

/* Copy the formatted tail into the line, control bytes (a newline above
 * all) written as \xNN: whatever a call site passed unquoted, one call is
 * one line. Returns the bytes written; stops, whole escapes only, when
 * `room` is spent. */
static size_t put_tail(char *dst, size_t room, const char *src, size_t len)
{
	size_t o = 0;

	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)src[i];

		if (c >= 0x20 && c != 0x7f) {
			if (o + 1 > room)
				break;
			dst[o++] = (char)c;
		} else {
			if (o + 4 > room)
				break;
			snprintf(dst + o, 5, "\\x%02x", c);
			o += 4;
		}
	}
	return o;
}

void kvlog__emit(struct kvlog *lg, int level, const char *event,
		 const char *fmt, ...)
{
	char line[KVLOG_LINE_MAX];
	char tail[KVLOG_LINE_MAX];
	size_t n = put_ts(line, sizeof(line));
	va_list ap;
	int r;

	n += (size_t)snprintf(line + n, sizeof(line) - n, " level=%s",
			      kvlog_level_name(level));
	if (lg->node[0])
		n += (size_t)snprintf(line + n, sizeof(line) - n, " node=%s",
				      lg->node);
	n += put_tail(line + n, sizeof(line) - 1 - n, " event=", 7);
	n += put_tail(line + n, sizeof(line) - 1 - n, event, strlen(event));
	if (fmt && fmt[0]) {
		va_start(ap, fmt);
		r = vsnprintf(tail, sizeof(tail), fmt, ap);
		va_end(ap);
		if (r < 0)
			r = 0;
		if (n + 2 < sizeof(line)) {
			line[n++] = ' ';
			n += put_tail(line + n, sizeof(line) - 1 - n, tail,
				      KVD_MIN((size_t)r, sizeof(tail) - 1));
		}
	}
	/* Cut lines end in "...": the tail did not fit (or was cut by
	 * vsnprintf itself). */
	if (n >= sizeof(line) - 8) {
		n = sizeof(line) - 5;
		memcpy(line + n, "...", 3);
		n += 3;
	}
	line[n++] = '\n';
	/* A failed log write has nowhere to be reported; drop it. */
	if (write(lg->fd, line, n) < 0)
		return;
}

/* kvd_utf8_len on the NUL-terminated string at p (NUL is never a
 * continuation byte, so a character the string ends inside is invalid). */
static size_t utf8_len(const unsigned char *p)
{
	return kvd_utf8_len((const char *)p, strnlen((const char *)p, 4));
}

static bool quote_bare_char(const unsigned char *p)
{
	return *p != ' ' && *p != '"' && *p != '=' && *p != '\\' &&
	       *p >= 0x20 && *p != 0x7f && utf8_len(p) > 0;
}

const char *kvlog_quote(char *buf, size_t size, const char *s)
{
	const unsigned char *p;
	size_t o = 0;
	bool bare;

	if (!s)
		s = "";
	bare = s[0] != '\0';
	for (p = (const unsigned char *)s; *p && bare; p += utf8_len(p))
		bare = quote_bare_char(p);
	if (bare) {
		snprintf(buf, size, "%s", s);
		return buf;
	}
	if (size < 3) {
		if (size)
			buf[0] = '\0';
		return buf;
	}
	buf[o++] = '"';
	/* Room for the longest step (a \xNN escape or a 4-byte sequence)
	 * plus the closing quote and NUL: a cut value is cut between
	 * characters and is still one well-formed quoted value. */
	for (p = (const unsigned char *)s; *p && o + 6 <= size;) {
		size_t len = utf8_len(p);

		if (*p == '"' || *p == '\\') {
			buf[o++] = '\\';
			buf[o++] = (char)*p++;
		} else if (*p < 0x20 || *p == 0x7f || len == 0) {
			o += (size_t)snprintf(buf + o, size - o, "\\x%02x", *p++);
		} else {
			memcpy(buf + o, p, len);
			o += len;
			p += len;
		}
	}
	buf[o++] = '"';
	buf[o] = '\0';
	return buf;
}

void kvlog__suppressed(struct kvlog *lg, int level,
		       const struct kvd_ratelimit *rl, uint64_t n)
{
	/* kind: a bare word kvd chose (the bucket's name) */
	kvlog__emit(lg, level, "log_suppressed", "kind=%s suppressed=%llu",
		    rl->kind ? rl->kind : "-", (unsigned long long)n);
}

void kvlog_ratelimit_flush(struct kvlog *lg, int level,
			   struct kvd_ratelimit *rl)
{
	uint64_t n;

	if (!lg || lg->level < level)
		return;
	n = kvd_ratelimit_flush(rl, kvd_now_ns());
	if (n)
		kvlog__suppressed(lg, level, rl, n);
}
