/* bench_mac.c - the batch integrity primitives side by side (issue 22.9):
 * GB/s per core for 64 KiB, 256 KiB and 1 MiB batches.
 *
 * Rows: XXH3-64 (the checksum, no key), keyed BLAKE2b (the verbs MAC
 * before), ChaCha20-Poly1305 authenticating only as libsodium computes it
 * (the TCP seal before) and as libcrypto does (kvd's now, net/chapoly.h),
 * AES-256-GCM authenticating only (GMAC) from libcrypto and libsodium
 * (where the CPU has AES-NI), then the encrypting AEADs for
 * transfer.encrypt. "Per core" is bytes over the thread's CPU time
 * (CLOCK_THREAD_CPUTIME_ID), so other work on a shared machine does not
 * count against a row; rows run interleaved in rounds and the median of
 * the rounds is printed, with the spread (min-max) beside it.
 *
 *   bench_mac [rounds, default 5]
 *
 * Ends with one key=value line (GB/s at 1 MiB) for scripts. Never fails
 * on speed; exits 1 only if a primitive cannot run or chapoly disagrees
 * with libsodium's one-shot AEAD (the figures would then be of a wrong
 * MAC).
 */
#include <openssl/evp.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

#include "net/chapoly.h"
#include "net/peer_auth.h"

#define ROUNDS_MAX 31
#define SIZES 3

static const size_t bm_sizes[SIZES] = { 64 << 10, 256 << 10, 1 << 20 };

struct bm_ctx {
	uint8_t key[32], nonce[12], tag[16];
	uint8_t *buf;            /* (1 MiB) the batch */
	EVP_CIPHER *gcm;         /* libcrypto AES-256-GCM */
	uint64_t sink;
};

typedef void bm_fn(struct bm_ctx *c, size_t n);

static void bm_xxh3(struct bm_ctx *c, size_t n)
{
	c->sink += XXH3_64bits(c->buf, n);
}

static void bm_blake2b(struct bm_ctx *c, size_t n)
{
	crypto_generichash(c->tag, 16, c->buf, n, c->key, 32);
}

static void bm_sodium_chapoly_mac(struct bm_ctx *c, size_t n)
{
	crypto_aead_chacha20poly1305_ietf_encrypt_detached(
		c->tag, c->tag, NULL, NULL, 0, c->buf, n, NULL, c->nonce, c->key);
}

static void bm_chapoly_mac(struct bm_ctx *c, size_t n)
{
	chapoly_seal(c->key, c->nonce, NULL, 0, c->buf, n, false, c->tag);
}

static void bm_chapoly_enc(struct bm_ctx *c, size_t n)
{
	chapoly_seal(c->key, c->nonce, NULL, 0, c->buf, n, true, c->tag);
}

static void bm_sodium_chapoly_enc(struct bm_ctx *c, size_t n)
{
	crypto_aead_chacha20poly1305_ietf_encrypt_detached(
		c->buf, c->tag, NULL, c->buf, n, NULL, 0, NULL, c->nonce, c->key);
}

/* libcrypto AES-256-GCM over buf: additional data only, or encrypted. */
static void bm_gcm(struct bm_ctx *c, size_t n, bool encrypt)
{
	EVP_CIPHER_CTX *x = EVP_CIPHER_CTX_new();
	int l;

	if (!x || EVP_EncryptInit_ex2(x, c->gcm, c->key, c->nonce, NULL) != 1 ||
	    EVP_EncryptUpdate(x, encrypt ? c->buf : NULL, &l, c->buf, (int)n) != 1 ||
	    EVP_EncryptFinal_ex(x, c->tag, &l) != 1 ||
	    EVP_CIPHER_CTX_ctrl(x, EVP_CTRL_AEAD_GET_TAG, 16, c->tag) != 1) {
		fprintf(stderr, "bench_mac: libcrypto AES-256-GCM failed\n");
		exit(1);
	}
	EVP_CIPHER_CTX_free(x);
}

static void bm_gmac(struct bm_ctx *c, size_t n)
{
	bm_gcm(c, n, false);
}

static void bm_gcm_enc(struct bm_ctx *c, size_t n)
{
	bm_gcm(c, n, true);
}

static void bm_sodium_gmac(struct bm_ctx *c, size_t n)
{
	crypto_aead_aes256gcm_encrypt_detached(c->tag, c->tag, NULL, NULL, 0, c->buf, n,
					       NULL, c->nonce, c->key);
}

static void bm_sodium_gcm_enc(struct bm_ctx *c, size_t n)
{
	crypto_aead_aes256gcm_encrypt_detached(c->buf, c->tag, NULL, c->buf, n, NULL, 0,
					       NULL, c->nonce, c->key);
}

struct bm_row {
	const char *name, *what;
	bm_fn *fn;
	bool aesni;        /* needs libsodium's AES-NI check */
	bool mac_only;     /* in the key=value line */
	const char *key;
};

static const struct bm_row bm_rows[] = {
	{ "xxh3-64", "checksum, no key", bm_xxh3, false, true, "xxh3" },
	{ "blake2b-keyed", "libsodium; verbs MAC before", bm_blake2b, false, true, "blake2b" },
	{ "chacha20-poly1305 mac", "libsodium; TCP seal before", bm_sodium_chapoly_mac,
	  false, true, "chapoly_sodium" },
	{ "chacha20-poly1305 mac", "libcrypto; kvd now (chapoly)", bm_chapoly_mac,
	  false, true, "chapoly_libcrypto" },
	{ "aes-256-gcm gmac", "libcrypto", bm_gmac, false, true, "gmac_libcrypto" },
	{ "aes-256-gcm gmac", "libsodium (AES-NI)", bm_sodium_gmac, true, true, "gmac_sodium" },
	{ "chacha20-poly1305 enc", "libsodium; encrypt before", bm_sodium_chapoly_enc,
	  false, false, NULL },
	{ "chacha20-poly1305 enc", "libcrypto; encrypt now", bm_chapoly_enc, false, false, NULL },
	{ "aes-256-gcm enc", "libcrypto", bm_gcm_enc, false, false, NULL },
	{ "aes-256-gcm enc", "libsodium (AES-NI)", bm_sodium_gcm_enc, true, false, NULL },
};
#define ROWS (sizeof(bm_rows) / sizeof(bm_rows[0]))

static double bm_cpu_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* GB/s of fn over n bytes, about 0.1 s of CPU. */
static double bm_run(struct bm_ctx *c, bm_fn *fn, size_t n)
{
	size_t reps = ((size_t)64 << 20) / n;
	double t0, t;

	fn(c, n);   /* warm */
	t0 = bm_cpu_s();
	for (size_t r = 0; r < reps; r++)
		fn(c, n);
	t = bm_cpu_s() - t0;
	return (double)(reps * n) / t / 1e9;
}

static int bm_cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/* chapoly (whichever implementation) must give libsodium's tag. */
static void bm_check(struct bm_ctx *c)
{
	uint8_t want[16], got[16];

	randombytes_buf(c->buf, 1 << 20);
	crypto_aead_chacha20poly1305_ietf_encrypt_detached(
		want, want, NULL, NULL, 0, c->buf, 1 << 20, NULL, c->nonce, c->key);
	chapoly_seal(c->key, c->nonce, NULL, 0, c->buf, 1 << 20, false, got);
	if (memcmp(want, got, 16) != 0) {
		fprintf(stderr, "bench_mac: chapoly (%s) disagrees with libsodium\n",
			chapoly_impl_name(chapoly_impl()));
		exit(1);
	}
}

int main(int argc, char **argv)
{
	static struct bm_ctx c;
	static double gb[ROWS][SIZES][ROUNDS_MAX];
	int rounds = argc > 1 ? atoi(argv[1]) : 5;
	bool aesni;

	if (rounds < 1 || rounds > ROUNDS_MAX || peer_auth_global_init() ||
	    !(c.buf = aligned_alloc(64, 1 << 20)) ||
	    !(c.gcm = EVP_CIPHER_fetch(NULL, "AES-256-GCM", NULL))) {
		fprintf(stderr, "usage: bench_mac [rounds 1..%d] (or setup failed)\n",
			ROUNDS_MAX);
		return 1;
	}
	aesni = crypto_aead_aes256gcm_is_available();
	randombytes_buf(c.key, sizeof(c.key));
	bm_check(&c);
	for (int r = 0; r < rounds; r++)
		for (size_t i = 0; i < ROWS; i++)
			for (int s = 0; s < SIZES; s++)
				gb[i][s][r] = !bm_rows[i].aesni || aesni
						      ? bm_run(&c, bm_rows[i].fn, bm_sizes[s]) : 0;
	printf("batch MAC primitives, GB/s per core (thread CPU time), median of %d rounds [min-max]; chapoly uses %s\n",
	       rounds, chapoly_impl_name(chapoly_impl()));
	printf("%-24s %-30s %22s %22s %22s\n", "primitive", "implementation",
	       "64 KiB", "256 KiB", "1 MiB");
	for (size_t i = 0; i < ROWS; i++) {
		printf("%-24s %-30s", bm_rows[i].name, bm_rows[i].what);
		for (int s = 0; s < SIZES; s++) {
			double *v = gb[i][s];

			qsort(v, (size_t)rounds, sizeof(double), bm_cmp);
			if (v[rounds - 1] == 0)
				printf(" %22s", "(no AES-NI)");
			else
				printf("    %7.2f [%5.2f-%5.2f]", v[rounds / 2], v[0],
				       v[rounds - 1]);
		}
		printf("\n");
	}
	for (size_t i = 0; i < ROWS; i++)
		if (bm_rows[i].mac_only)
			printf("%smac_gbps_1m_%s=%.2f", i ? " " : "", bm_rows[i].key,
			       gb[i][SIZES - 1][rounds / 2]);
	printf(" sink=%llu\n", (unsigned long long)(c.sink & 1));
	EVP_CIPHER_free(c.gcm);
	free(c.buf);
	return 0;
}
