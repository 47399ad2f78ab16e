/* util.h - the few macros every kvd module shares.
 *
 * No state lives here. Everything is header-only so the bottom layer stays
 * dependency-free.
 */
#pragma once

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define KVD_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

/* Recover the owner of an embedded member (libuv handles live inside their
 * owners). */
#define kvd_container_of(ptr, type, member) \
	((type *)((char *)(ptr) - offsetof(type, member)))

#define KVD_MIN(a, b) ((a) < (b) ? (a) : (b))
#define KVD_MAX(a, b) ((a) > (b) ? (a) : (b))

#define kvd_likely(x) __builtin_expect(!!(x), 1)
#define kvd_unlikely(x) __builtin_expect(!!(x), 0)

/* Cleanup-attributed locals: build an object into one, hand it over with
 * kvd_steal() on the single success path. */
#define _cleanup_(f) __attribute__((cleanup(f)))

static inline void kvd_freep(void *p)
{
	free(*(void **)p);
}
#define _cleanup_free_ _cleanup_(kvd_freep)

static inline void *kvd_steal_ptr(void *pp)
{
	void **p = (void **)pp;
	void *v = *p;

	*p = NULL;
	return v;
}
#define kvd_steal(pp) kvd_steal_ptr((void *)(pp))

/* Overflow-checked size arithmetic: return -EOVERFLOW rather than wrap. */
static inline int kvd_mul_size(size_t a, size_t b, size_t *out)
{
	return __builtin_mul_overflow(a, b, out) ? -EOVERFLOW : 0;
}

static inline int kvd_add_size(size_t a, size_t b, size_t *out)
{
	return __builtin_add_overflow(a, b, out) ? -EOVERFLOW : 0;
}

/* A decimal number, digits only (no sign, space or base prefix): 0,
 * -EINVAL when s is not one, -ERANGE past UINT64_MAX. The one number
 * parser of config values, command lines and log fields. */
int kvd_parse_u64(const char *s, uint64_t *out);
/* A size in bytes: digits, an optional fraction (".5") and an optional
 * unit, case-insensitive: none or B bytes; K M G T and KiB MiB GiB TiB
 * powers of 1024 (a bare K/M/G/T is binary, as kvd's sizes always
 * were); KB MB GB TB powers of 1000 ("4GB" = 4000000000, "4GiB" = "4G"
 * = 4294967296). A fraction needs a unit and is rounded down to whole
 * bytes. 0, -EINVAL when s is not one, -ERANGE past UINT64_MAX. The one
 * size parser of config values and command lines. */
int kvd_parse_size(const char *s, uint64_t *out);
#define KVD_SIZE_UNITS "B; K M G T or KiB MiB GiB TiB: x1024; KB MB GB TB: x1000"
/* Its counterpart for fractions: a decimal number, digits with an
 * optional fraction and exponent ("0.7", ".5", "1e-3"; no sign, space,
 * hex, inf or nan): 0, -EINVAL when s is not one, -ERANGE when it
 * overflows or underflows a double. The caller judges the range. */
int kvd_parse_double(const char *s, double *out);
/* "1,2,3": kvd_parse_u64 numbers <= max separated by single commas (no
 * empty entry, so no leading or trailing comma; at least one) into a
 * malloc'd *out of *n entries. 0, -EINVAL (nothing allocated), -ENOMEM. */
int kvd_parse_u32_list(const char *s, uint32_t max, uint32_t **out, size_t *n);

/* The length of the valid UTF-8 character at s (n bytes left; 1 for
 * ASCII, NUL included), 0 when s does not start one: overlongs,
 * surrogates, code points past U+10FFFF and a character cut by n are
 * invalid. Reads no byte past the first one that is wrong. */
size_t kvd_utf8_len(const char *s, size_t n);

/* s (n bytes) as a JSON string with its quotes: `"` and `\` escaped,
 * newline, tab and return as \n \t \r, other control bytes and DEL as
 * \u00XX, a valid UTF-8 character as it is, and each byte that is not
 * part of one as \u00XX (its value as a code point: a character split
 * across tokens comes out byte by byte), so the output is valid JSON
 * whatever s holds. The one JSON string writer of kvd and kvctl. */
void kvd_json_str(FILE *out, const char *s, size_t n);

/* ids (n) as a JSON array of numbers: [1,2,3]. (Token ids held as
 * int32_t are never negative once checked: their uint32_t view prints
 * the same.) */
void kvd_json_u32s(FILE *out, const uint32_t *ids, size_t n);

/* A growing buffer: p holds len bytes, then a NUL (so text added to it
 * is a C string; an array of fixed-size entries added one by one stays
 * aligned for them, p being malloc's); cap bytes allocated. Owned by its
 * holder; KVD_BUF_NULL is empty (p NULL until the first add). */
struct kvd_buf {
	char *p;
	size_t len, cap;
};
#define KVD_BUF_NULL { NULL, 0, 0 }
/* Append n bytes of s: 0, or -ENOMEM with b unchanged. */
int kvd_buf_add(struct kvd_buf *b, const void *s, size_t n);
/* Free p and empty b (safe twice). */
void kvd_buf_deinit(struct kvd_buf *b);

/* An allow-list of web origins (http.cors_origins): "*" (any) and/or
 * origins scheme://host[:port] (http or https; letters, digits, "-._:[]"
 * in the host part; no path), comma-separated. */
#define KVD_ORIGINS_MAX 32u
#define KVD_ORIGIN_MAX 320u              /* bytes of one origin */
struct kvd_origins {
	bool any;
	uint32_t n;
	char buf[1024];                  /* the list, each origin NUL-ended */
	const char *origin[KVD_ORIGINS_MAX]; /* into buf */
};
/* Split spec into o: 0, or -EINVAL with `why` (a constant sentence) and
 * the bad entry in bad[bad_size]. */
int kvd_origins_parse(struct kvd_origins *o, const char *spec, const char **why,
		      char *bad, size_t bad_size);
/* dst = src, dst's pointers into its own buf. */
void kvd_origins_copy(struct kvd_origins *dst, const struct kvd_origins *src);
/* Whether `origin` (a request's Origin value) is allowed: well formed,
 * and listed (case-insensitively) or any. */
bool kvd_origins_allow(const struct kvd_origins *o, const char *origin);

/* Monotonic clock in nanoseconds. */
uint64_t kvd_now_ns(void);
/* Wall clock in nanoseconds since the epoch. */
uint64_t kvd_wall_ns(void);

/* Make `path` free for a unix socket this process is about to bind: 0
 * when nothing is there or a socket file nobody listens on (a dead
 * node's) was removed; -EADDRINUSE when a live process accepts on it;
 * -EEXIST when the path is not a socket; another negative errno. */
int kvd_unix_claim(const char *path);

/* A stream socket connected to the unix socket at path: the fd
 * (close-on-exec), or -ENAMETOOLONG or the negative errno of socket(2) or
 * connect(2). */
int kvd_unix_connect(const char *path);

/* Whether the directory open at dfd may hold a cache this process trusts:
 * owned by this user or root and writable by nobody else (no group or
 * world write), so nobody but its owner can add or replace entries. */
bool kvd_dir_owner_only(int dfd);
