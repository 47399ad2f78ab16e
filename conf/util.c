/* util.c - clocks, and claiming a unix socket path.
 *
 * A unix socket's file outlives a node that was killed, and bind(2)
 * fails on it; removing it unconditionally would let a second node
 * silently take over a live node's socket (its clients then reach the
 * wrong process). So a path is taken only when connect(2) finds nobody
 * there. Two nodes started at the same instant can both see a dead file;
 * one of them then loses at bind (EADDRINUSE), which is still a refusal.
 */
#include "conf/util.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

uint64_t kvd_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t kvd_wall_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int kvd_unix_claim(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct stat st;
	int fd, r;

	if (lstat(path, &st) < 0)
		return errno == ENOENT ? 0 : -errno;
	if (!S_ISSOCK(st.st_mode))
		return -EEXIST;
	if (strlen(path) >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	r = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
	close(fd);
	if (r == 0)
		return -EADDRINUSE;
	return unlink(path) < 0 && errno != ENOENT ? -errno : 0;
}

int kvd_unix_connect(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd, e;

	if (strlen(path) >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	memcpy(sa.sun_path, path, strlen(path) + 1);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		e = errno;
		close(fd);
		return -e;
	}
	return fd;
}

bool kvd_dir_owner_only(int dfd)
{
	struct stat st;

	if (fstat(dfd, &st) || !S_ISDIR(st.st_mode))
		return false;
	if (st.st_uid != geteuid() && st.st_uid != 0)
		return false;
	return (st.st_mode & (S_IWGRP | S_IWOTH)) == 0;
}

/* The digits s[0..n): 0, -EINVAL when that is not digits only (or
 * empty), -ERANGE past UINT64_MAX. */
static int parse_u64_span(const char *s, size_t n, uint64_t *out)
{
	uint64_t v = 0;

	if (!n)
		return -EINVAL;
	for (size_t i = 0; i < n; i++)
		if (!isdigit((unsigned char)s[i]))
			return -EINVAL;
	for (size_t i = 0; i < n; i++)
		if (__builtin_mul_overflow(v, 10, &v) ||
		    __builtin_add_overflow(v, (uint64_t)(s[i] - '0'), &v))
			return -ERANGE;
	*out = v;
	return 0;
}

int kvd_parse_u64(const char *s, uint64_t *out)
{
	return s ? parse_u64_span(s, strlen(s), out) : -EINVAL;
}

/* The multiplier of a size's unit (case-insensitive), 0 if none is. */
static uint64_t size_unit(const char *u)
{
	static const struct { const char *unit; uint64_t mult; } units[] = {
		{ "", 1 }, { "b", 1 },
		{ "k", 1ull << 10 }, { "kib", 1ull << 10 }, { "kb", 1000ull },
		{ "m", 1ull << 20 }, { "mib", 1ull << 20 }, { "mb", 1000000ull },
		{ "g", 1ull << 30 }, { "gib", 1ull << 30 }, { "gb", 1000000000ull },
		{ "t", 1ull << 40 }, { "tib", 1ull << 40 },
		{ "tb", 1000000000000ull },
	};

	for (size_t i = 0; i < KVD_ARRAY_SIZE(units); i++)
		if (!strcasecmp(u, units[i].unit))
			return units[i].mult;
	return 0;
}

int kvd_parse_size(const char *s, uint64_t *out)
{
	size_t n = 0, nf = 0;
	uint64_t v, mult, part, frac = 0, scale = 1;
	int r;

	if (!s)
		return -EINVAL;
	while (isdigit((unsigned char)s[n]))
		n++;
	r = parse_u64_span(s, n, &v);
	if (r)
		return r;
	if (s[n] == '.') {
		/* 9 digits reach below one byte of a TiB; later ones are
		 * rounded away with the rest */
		for (n++; isdigit((unsigned char)s[n]); n++, nf++)
			if (nf < 9) {
				frac = frac * 10 + (uint64_t)(s[n] - '0');
				scale *= 10;
			}
		if (!nf)
			return -EINVAL;
	}
	mult = size_unit(s + n);
	if (!mult || (nf && mult == 1))
		return -EINVAL;
	/* frac * mult / scale without overflow: frac < scale <= 1e9 */
	part = mult / scale * frac + mult % scale * frac / scale;
	if (__builtin_mul_overflow(v, mult, &v) ||
	    __builtin_add_overflow(v, part, &v))
		return -ERANGE;
	*out = v;
	return 0;
}

int kvd_parse_double(const char *s, double *out)
{
	size_t i = 0, digits = 0;
	char *end;
	double v;

	if (!s)
		return -EINVAL;
	/* the grammar first: strtod alone would take space, signs, hex,
	 * inf and nan */
	for (; isdigit((unsigned char)s[i]); i++)
		digits++;
	if (s[i] == '.')
		for (i++; isdigit((unsigned char)s[i]); i++)
			digits++;
	if (!digits)
		return -EINVAL;
	if (s[i] == 'e' || s[i] == 'E') {
		i += s[i + 1] == '+' || s[i + 1] == '-' ? 2 : 1;
		if (!isdigit((unsigned char)s[i]))
			return -EINVAL;
		while (isdigit((unsigned char)s[i]))
			i++;
	}
	if (s[i])
		return -EINVAL;
	errno = 0;
	v = strtod(s, &end);
	if (errno || *end)
		return -ERANGE;
	*out = v;
	return 0;
}

int kvd_parse_u32_list(const char *s, uint32_t max, uint32_t **out, size_t *n)
{
	size_t cap = 1, k = 0;
	uint32_t *a;

	if (!s)
		return -EINVAL;
	for (const char *p = s; *p; p++)
		cap += *p == ',';
	a = malloc(cap * sizeof(*a));
	if (!a)
		return -ENOMEM;
	for (const char *p = s;; p++) {
		const char *comma = strchr(p, ',');
		size_t len = comma ? (size_t)(comma - p) : strlen(p);
		uint64_t v;

		if (parse_u64_span(p, len, &v) || v > max) {
			free(a);
			return -EINVAL;
		}
		a[k++] = (uint32_t)v;
		if (!comma)
			break;
		p = comma;
	}
	*out = a;
	*n = k;
	return 0;
}

size_t kvd_utf8_len(const char *s, size_t n)
{
	const unsigned char *p = (const unsigned char *)s;
	unsigned char c, lo = 0x80, hi = 0xbf;
	size_t len;

	if (!n)
		return 0;
	c = p[0];
	if (c < 0x80)
		return 1;
	if (c >= 0xc2 && c <= 0xdf)
		len = 2;
	else if (c >= 0xe0 && c <= 0xef)
		len = 3;
	else if (c >= 0xf0 && c <= 0xf4)
		len = 4;
	else
		return 0;
	if (n < len)
		return 0;
	/* the second byte's range rules out overlongs, surrogates and
	 * code points past U+10FFFF */
	if (c == 0xe0)
		lo = 0xa0;
	else if (c == 0xed)
		hi = 0x9f;
	else if (c == 0xf0)
		lo = 0x90;
	else if (c == 0xf4)
		hi = 0x8f;
	if (p[1] < lo || p[1] > hi)
		return 0;
	for (size_t i = 2; i < len; i++)
		if (p[i] < 0x80 || p[i] > 0xbf)
			return 0;
	return len;
}

void kvd_json_str(FILE *out, const char *s, size_t n)
{
	fputc('"', out);
	for (size_t i = 0; i < n;) {
		unsigned char c = (unsigned char)s[i];
		size_t len = kvd_utf8_len(s + i, n - i);

		if (c == '"' || c == '\\')
			fprintf(out, "\\%c", c);
		else if (c == '\n')
			fputs("\\n", out);
		else if (c == '\t')
			fputs("\\t", out);
		else if (c == '\r')
			fputs("\\r", out);
		else if (c < 0x20 || c == 0x7f || len == 0)
			fprintf(out, "\\u%04x", c);
		else {
			fwrite(s + i, 1, len, out);
			i += len;
			continue;
		}
		i++;
	}
	fputc('"', out);
}

void kvd_json_u32s(FILE *out, const uint32_t *ids, size_t n)
{
	fputc('[', out);
	for (size_t i = 0; i < n; i++)
		fprintf(out, "%s%u", i ? "," : "", ids[i]);
	fputc(']', out);
}

int kvd_buf_add(struct kvd_buf *b, const void *s, size_t n)
{
	size_t need;

	if (kvd_add_size(b->len, n, &need) || kvd_add_size(need, 1, &need))
		return -ENOMEM;
	if (need > b->cap) {
		size_t cap = KVD_MAX(KVD_MAX(need, (size_t)64), b->cap * 2);
		char *p = realloc(b->p, cap);

		if (!p)
			return -ENOMEM;
		b->p = p;
		b->cap = cap;
	}
	if (n)
		memcpy(b->p + b->len, s, n);
	b->len += n;
	b->p[b->len] = '\0';
	return 0;
}

void kvd_buf_deinit(struct kvd_buf *b)
{
	free(b->p);
	*b = (struct kvd_buf)KVD_BUF_NULL;
}

/* ---- web origins ------------------------------------------------------------ */

static bool origin_valid(const char *o)
{
	const char *h;

	if (!strncasecmp(o, "http://", 7))
		h = o + 7;
	else if (!strncasecmp(o, "https://", 8))
		h = o + 8;
	else
		return false;
	if (!*h || strlen(o) > KVD_ORIGIN_MAX)
		return false;
	for (const char *p = h; *p; p++)
		if (!(isalnum((unsigned char)*p) || strchr("-._:[]", *p)))
			return false;
	return true;
}

static char *origin_trim(char *p)
{
	char *e;

	while (*p == ' ' || *p == '\t')
		p++;
	e = p + strlen(p);
	while (e > p && (e[-1] == ' ' || e[-1] == '\t'))
		*--e = 0;
	return p;
}

int kvd_origins_parse(struct kvd_origins *o, const char *spec, const char **why,
		      char *bad, size_t bad_size)
{
	char *save = NULL, *tok;

	memset(o, 0, sizeof(*o));
	bad[0] = 0;
	if (strlen(spec) >= sizeof(o->buf)) {
		*why = "the list is too long";
		return -EINVAL;
	}
	snprintf(o->buf, sizeof(o->buf), "%s", spec);
	for (tok = strtok_r(o->buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		tok = origin_trim(tok);
		if (!*tok)
			continue;
		snprintf(bad, bad_size, "%s", tok);
		if (!strcmp(tok, "*")) {
			o->any = true;
			continue;
		}
		if (!origin_valid(tok)) {
			*why = "an origin is scheme://host[:port] (http or https, no path), or *";
			return -EINVAL;
		}
		if (o->n == KVD_ORIGINS_MAX) {
			*why = "at most 32 origins";
			return -EINVAL;
		}
		o->origin[o->n++] = tok;
	}
	bad[0] = 0;
	return 0;
}

void kvd_origins_copy(struct kvd_origins *dst, const struct kvd_origins *src)
{
	memcpy(dst, src, sizeof(*dst));
	for (uint32_t i = 0; i < src->n; i++)
		dst->origin[i] = dst->buf + (src->origin[i] - src->buf);
}

bool kvd_origins_allow(const struct kvd_origins *o, const char *origin)
{
	if (!origin_valid(origin))
		return false;   /* "null" (a sandboxed page), garbage */
	if (o->any)
		return true;
	for (uint32_t i = 0; i < o->n; i++)
		if (!strcasecmp(o->origin[i], origin))
			return true;
	return false;
}
