/* fuzz.h - the contract between a fuzz target and its two drivers.
 *
 * Each tests/fuzz/fuzz_<name>.c defines:
 *   LLVMFuzzerTestOneInput()  one input, any bytes; returns 0. It checks
 *                             properties beyond "no crash" and calls
 *                             FUZZ_CHECK(), which aborts, on a violation.
 *   fuzz_target_seeds()       emits valid inputs (built with kvd's own
 *                             writers/packers at run time, so nothing
 *                             binary is committed).
 *   fuzz_target_name          "gguf", "frame", ...
 *
 * Two drivers call them: libFuzzer (tests/fuzz/run, clang) and
 * tests/fuzz/driver.c, a deterministic mutation loop that any compiler
 * builds (meson suite 'fuzz').
 *
 * A target may keep read-only state built once on first use (a tokenizer,
 * a kvd_build-style table); nothing it keeps may change between inputs,
 * so every input is independent and replayable alone.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_MIN(a, b) ((a) < (b) ? (a) : (b))

typedef void (*fuzz_emit_fn)(void *ctx, const void *data, size_t len);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
void fuzz_target_seeds(fuzz_emit_fn emit, void *ctx);
extern const char fuzz_target_name[];

/* A property violation: say which and where, then abort (both drivers
 * save the input that did it). */
#define FUZZ_CHECK(cond, ...)                                               \
	do {                                                                \
		if (!(cond)) {                                              \
			fprintf(stderr, "fuzz_%s: property violated at %s:%d: " \
				"%s: ", fuzz_target_name, __FILE__,        \
				__LINE__, #cond);                           \
			fprintf(stderr, __VA_ARGS__);                       \
			fputc('\n', stderr);                                \
			abort();                                            \
		}                                                           \
	} while (0)

/* KVD_FUZZ_STRICT=1: known bugs are fatal (see FUZZ_KNOWN). */
static inline bool fuzz_strict(void)
{
	const char *s = getenv("KVD_FUZZ_STRICT");

	return s && *s && *s != '0';
}

/* Say once per process that known bug `id` was hit (not fatal). */
#define FUZZ_KNOWN_HIT(id, ...)                                             \
	do {                                                                \
		static bool fuzz_known_seen_;                               \
		if (!fuzz_known_seen_) {                                    \
			fuzz_known_seen_ = true;                            \
			fprintf(stderr, "fuzz_%s: KNOWN BUG %s hit (%s:%d, " \
				"not fatal; KVD_FUZZ_STRICT=1 to fail): ",  \
				fuzz_target_name, id, __FILE__, __LINE__);  \
			fprintf(stderr, __VA_ARGS__);                       \
			fputc('\n', stderr);                                \
		}                                                           \
	} while (0)

/* A known bug in someone else's decoder, reported and awaiting its fix
 * (tests/fuzz/README.md lists each with its reproducer). It is reported
 * once per process and does not fail the run, so fuzzing goes on finding
 * new bugs; KVD_FUZZ_STRICT=1 makes it fatal like FUZZ_CHECK. Delete the
 * FUZZ_KNOWN (make it a FUZZ_CHECK) in the commit that fixes the bug. */
#define FUZZ_KNOWN(id, cond, ...)                                           \
	do {                                                                \
		if (!(cond)) {                                              \
			if (fuzz_strict())                                  \
				FUZZ_CHECK(cond, __VA_ARGS__);              \
			FUZZ_KNOWN_HIT(id, __VA_ARGS__);                    \
		}                                                           \
	} while (0)

/* A growing byte buffer: transcripts, re-encodings, built seeds. */
struct fuzz_bytes {
	uint8_t *p;     /* (cap) bytes, [0, n) used */
	size_t n, cap;
};

static inline void fuzz_bytes_add(struct fuzz_bytes *b, const void *p,
				  size_t n)
{
	if (b->n + n > b->cap) {
		size_t cap = b->cap ? b->cap : 256;

		while (cap < b->n + n)
			cap *= 2;
		uint8_t *q = realloc(b->p, cap);

		if (!q)
			abort();
		b->p = q;
		b->cap = cap;
	}
	if (n)
		memcpy(b->p + b->n, p, n);
	b->n += n;
}

/* msgpack_packer write callback appending to a struct fuzz_bytes. */
static inline int fuzz_bytes_write(void *data, const char *buf, size_t len)
{
	fuzz_bytes_add(data, buf, len);
	return 0;
}

static inline bool fuzz_bytes_eq(const struct fuzz_bytes *a,
				 const struct fuzz_bytes *b)
{
	return a->n == b->n && (!a->n || !memcmp(a->p, b->p, a->n));
}
