/* sha256.c - SHA-256 written from FIPS 180-4.
 *
 * The compression function is the textbook one: a 64-word message
 * schedule, eight working variables, 64 rounds with the K constants (the
 * first 32 bits of the fractional parts of the cube roots of the first 64
 * primes). Words are read big-endian byte by byte, so there is no
 * alignment or endianness assumption. The padding in sha256_final() is the
 * standard 0x80, zeros, then the 64-bit big-endian bit length, which may
 * spill into one extra block.
 *
 * This scalar compression (a few hundred MB/s) is the reference. A model
 * file is hashed at a boot that finds no fingerprint cache entry
 * (conf/fingerprint.c), and at several GB that is the boot's time, so
 * runs of whole blocks go to the x86 SHA-extension version
 * (sha256_x86.c, several times faster) when the CPU has it; both give the
 * same bits, tested on random inputs. sha256_fd() reads in 4 MiB chunks
 * so a model larger than memory hashes without mapping it.
 */
#include "conf/sha256.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* the round constants, shared with the x86 path (aligned for its loads) */
const uint32_t sha256__k[64] __attribute__((aligned(16))) = {
	0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1,
	0x923f82a4, 0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3,
	0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786,
	0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
	0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147,
	0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
	0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
	0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
	0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a,
	0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208,
	0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static inline uint32_t ror(uint32_t x, unsigned n)
{
	return (x >> n) | (x << (32 - n));
}

/* Compress one 64-byte block into the state. */
static void sha256_block(uint32_t h[8], const uint8_t *p)
{
	uint32_t w[64]; /* (64) message schedule */
	uint32_t a, b, c, d, e, f, g, hh;

	for (int i = 0; i < 16; i++)
		w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
		       (uint32_t)p[4 * i + 2] << 8 | (uint32_t)p[4 * i + 3];
	for (int i = 16; i < 64; i++) {
		uint32_t s0 = ror(w[i - 15], 7) ^ ror(w[i - 15], 18) ^ (w[i - 15] >> 3);
		uint32_t s1 = ror(w[i - 2], 17) ^ ror(w[i - 2], 19) ^ (w[i - 2] >> 10);
		w[i] = w[i - 16] + s0 + w[i - 7] + s1;
	}
	a = h[0]; b = h[1]; c = h[2]; d = h[3];
	e = h[4]; f = h[5]; g = h[6]; hh = h[7];
	for (int i = 0; i < 64; i++) {
		uint32_t S1 = ror(e, 6) ^ ror(e, 11) ^ ror(e, 25);
		uint32_t ch = (e & f) ^ (~e & g);
		uint32_t t1 = hh + S1 + ch + sha256__k[i] + w[i];
		uint32_t S0 = ror(a, 2) ^ ror(a, 13) ^ ror(a, 22);
		uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
		uint32_t t2 = S0 + maj;
		hh = g; g = f; f = e; e = d + t1;
		d = c; c = b; b = a; a = t1 + t2;
	}
	h[0] += a; h[1] += b; h[2] += c; h[3] += d;
	h[4] += e; h[5] += f; h[6] += g; h[7] += hh;
}

void sha256__blocks_scalar(uint32_t h[8], const uint8_t *p, size_t n)
{
	for (; n; n--, p += 64)
		sha256_block(h, p);
}

void sha256_init(struct sha256 *c)
{
	static const uint32_t iv[8] = {
		0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
		0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
	};

	memcpy(c->h, iv, sizeof(iv));
	c->nbytes = 0;
	c->fill = 0;
}

void sha256_update(struct sha256 *c, const void *data, size_t len)
{
	const uint8_t *p = data;

	c->nbytes += len;
	if (c->fill) {
		size_t take = 64 - c->fill < len ? 64 - c->fill : len;
		memcpy(c->buf + c->fill, p, take);
		c->fill += take;
		p += take;
		len -= take;
		if (c->fill < 64)
			return;
		sha256_block(c->h, c->buf);
		c->fill = 0;
	}
	/* asking the CPU costs a CPUID: only for runs worth it */
	if (len >= 64 * 16 && sha256__have_x86_sha()) {
		sha256__blocks_x86(c->h, p, len / 64);
		p += len / 64 * 64;
		len %= 64;
	}
	for (; len >= 64; p += 64, len -= 64)
		sha256_block(c->h, p);
	if (len) {
		memcpy(c->buf, p, len);
		c->fill = len;
	}
}

void sha256_final(struct sha256 *c, uint8_t digest[SHA256_DIGEST_SIZE])
{
	uint64_t bits = c->nbytes * 8;

	c->buf[c->fill++] = 0x80;
	if (c->fill > 56) {
		memset(c->buf + c->fill, 0, 64 - c->fill);
		sha256_block(c->h, c->buf);
		c->fill = 0;
	}
	memset(c->buf + c->fill, 0, 56 - c->fill);
	for (int i = 0; i < 8; i++)
		c->buf[56 + i] = (uint8_t)(bits >> (56 - 8 * i));
	sha256_block(c->h, c->buf);
	for (int i = 0; i < 8; i++) {
		digest[4 * i] = (uint8_t)(c->h[i] >> 24);
		digest[4 * i + 1] = (uint8_t)(c->h[i] >> 16);
		digest[4 * i + 2] = (uint8_t)(c->h[i] >> 8);
		digest[4 * i + 3] = (uint8_t)c->h[i];
	}
}

void sha256_buf(const void *data, size_t len,
		uint8_t digest[SHA256_DIGEST_SIZE])
{
	struct sha256 c;

	sha256_init(&c);
	sha256_update(&c, data, len);
	sha256_final(&c, digest);
}

void sha256_hex(const uint8_t digest[SHA256_DIGEST_SIZE],
		char hex[SHA256_HEX_SIZE])
{
	static const char xd[] = "0123456789abcdef";

	for (int i = 0; i < SHA256_DIGEST_SIZE; i++) {
		hex[2 * i] = xd[digest[i] >> 4];
		hex[2 * i + 1] = xd[digest[i] & 15];
	}
	hex[64] = '\0';
}

int sha256_fd(int fd, char hex[SHA256_HEX_SIZE], unsigned long long *bytes)
{
	enum { CHUNK = 4 << 20 };
	uint8_t digest[SHA256_DIGEST_SIZE];
	struct sha256 c;
	uint8_t *buf = malloc(CHUNK); /* (CHUNK) read buffer */
	unsigned long long total = 0;
	int rc = 0;

	if (!buf)
		return -ENOMEM;
	(void)posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
	sha256_init(&c);
	for (;;) {
		ssize_t n = read(fd, buf, CHUNK);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			rc = -errno;
			break;
		}
		if (n == 0)
			break;
		sha256_update(&c, buf, (size_t)n);
		total += (unsigned long long)n;
	}
	free(buf);
	if (rc)
		return rc;
	sha256_final(&c, digest);
	sha256_hex(digest, hex);
	if (bytes)
		*bytes = total;
	return 0;
}

int sha256_file(const char *path, char hex[SHA256_HEX_SIZE])
{
	int fd = open(path, O_RDONLY | O_CLOEXEC), rc;

	if (fd < 0)
		return -errno;
	rc = sha256_fd(fd, hex, NULL);
	close(fd);
	return rc;
}
