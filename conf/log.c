/* log.c - structured log lines.
 *
 * The line is formatted into a stack buffer and written with a single
 * write(2): a log call never allocates, never takes a lock, and lines from
 * different threads never interleave (pipes and journald keep writes of up
 * to PIPE_BUF atomic; longer lines are truncated to the buffer and end in
 * "...").
 */
#include "conf/log.h"
#include "conf/util.h"

#include <string.h>
#include <time.h>
#include <unistd.h>

#define KVLOG_LINE_MAX 4096

static const char *const level_names[] = { "error", "warn", "info", "debug" };

void kvlog_init(struct kvlog *lg, int level, int fd, const char *node)
{
	lg->level = level;
	lg->fd = fd;
	snprintf(lg->node, sizeof(lg->node), "%s", node ? node : "");
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

void kvlog__emit(struct kvlog *lg, int level, const char *event,
		 const char *fmt, ...)
{
	char line[KVLOG_LINE_MAX];
	size_t n = put_ts(line, sizeof(line));
	va_list ap;
	int r;

	n += (size_t)snprintf(line + n, sizeof(line) - n, " level=%s",
			      kvlog_level_name(level));
	if (lg->node[0])
		n += (size_t)snprintf(line + n, sizeof(line) - n, " node=%s",
				      lg->node);
	n += (size_t)snprintf(line + n, sizeof(line) - n, " event=%s", event);
	if (fmt && fmt[0]) {
		line[n++] = ' ';
		va_start(ap, fmt);
		r = vsnprintf(line + n, sizeof(line) - n, fmt, ap);
		va_end(ap);
		if (r < 0)
			r = 0;
		n += (size_t)r;
	}
	if (n >= sizeof(line) - 1) {
		n = sizeof(line) - 5;
		memcpy(line + n, "...", 3);
		n += 3;
	}
	line[n++] = '\n';
	/* A failed log write has nowhere to be reported; drop it. */
	if (write(lg->fd, line, n) < 0)
		return;
}

const char *kvlog_quote(char *buf, size_t size, const char *s)
{
	size_t o = 0;
	int bare = s[0] != '\0';

	for (const char *p = s; *p && bare; p++)
		if (*p == ' ' || *p == '"' || *p == '=' || *p == '\\' ||
		    (unsigned char)*p < 0x20 || *p == 0x7f)
			bare = 0;
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
	for (const char *p = s; *p && o + 5 < size; p++) {
		unsigned char c = (unsigned char)*p;

		if (c == '"' || c == '\\') {
			buf[o++] = '\\';
			buf[o++] = (char)c;
		} else if (c < 0x20 || c == 0x7f) {
			o += (size_t)snprintf(buf + o, size - o, "\\x%02x", c);
		} else {
			buf[o++] = (char)c;
		}
	}
	buf[o++] = '"';
	buf[o] = '\0';
	return buf;
}
