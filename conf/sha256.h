/* sha256.h - SHA-256 (FIPS 180-4), streaming and whole-file.
 *
 * Used for the model fingerprint (`model_sha256=` in event=kv_capacity),
 * which peers compare at handshake and `kvctl audit` compares across nodes.
 *
 * A struct sha256 is plain data: embed it, sha256_init() it, feed bytes
 * with sha256_update() in any split, then sha256_final() writes the digest
 * (the context must be re-initialised before reuse). No allocation, no
 * global state; any thread may use its own context.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SHA256_DIGEST_SIZE 32
#define SHA256_HEX_SIZE 65 /* 64 hex digits + NUL */

struct sha256 {
	uint32_t h[8];      /* chaining state */
	uint64_t nbytes;    /* total bytes fed so far */
	uint8_t buf[64];    /* (64) partial block */
	size_t fill;        /* bytes used in buf */
};

void sha256_init(struct sha256 *c);
void sha256_update(struct sha256 *c, const void *data, size_t len);
void sha256_final(struct sha256 *c, uint8_t digest[SHA256_DIGEST_SIZE]);

/* One-shot helpers. */
void sha256_buf(const void *data, size_t len,
		uint8_t digest[SHA256_DIGEST_SIZE]);
/* Lower-case hex of a digest into hex[65] (NUL-terminated). */
void sha256_hex(const uint8_t digest[SHA256_DIGEST_SIZE],
		char hex[SHA256_HEX_SIZE]);
/* Hash a whole file, reading it in 4 MiB chunks (works on pipes and
 * files larger than memory). 0, or a negative errno from open/read
 * (-ENOMEM without a read buffer). */
int sha256_file(const char *path, char hex[SHA256_HEX_SIZE]);
/* The same over an open fd, read from its current offset to EOF (the
 * caller keeps the fd); *bytes (when not NULL) = the bytes hashed. */
int sha256_fd(int fd, char hex[SHA256_HEX_SIZE], unsigned long long *bytes);

/* Internal, shared with tests/test_sha256.c: compress n 64-byte blocks
 * into h. The x86 SHA-extension version may be called only after
 * sha256__have_x86_sha() said yes; sha256_update() uses it for runs of
 * blocks when it can, the scalar one otherwise (same bits). */
/* FIPS 180-4 round constants (16-byte aligned), for both block paths. */
extern const uint32_t sha256__k[64];
void sha256__blocks_scalar(uint32_t h[8], const uint8_t *p, size_t n);
bool sha256__have_x86_sha(void);
void sha256__blocks_x86(uint32_t h[8], const uint8_t *p, size_t n);
