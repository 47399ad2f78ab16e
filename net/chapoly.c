/* chapoly.c - ChaCha20-Poly1305 through libcrypto or libsodium (chapoly.h).
 *
 * Why this algorithm (issue 22.9, tests/bench/bench_mac.c on the
 * development machine, an AVX-512 EPYC, GB/s per core over 64 KiB-1 MiB):
 * libcrypto's ChaCha20-Poly1305 authenticating only 13.3, its AES-256-GCM
 * as GMAC 8.4 (OpenSSL 3.0 has no VAES/AVX-512 GCM), libsodium's
 * AES-256-GCM 4.5, libsodium's ChaCha20-Poly1305 3.5, keyed BLAKE2b 0.65.
 * The fastest is the algorithm links already used, so the wire does not
 * change for TCP and no CPU lacks it: libcrypto's code runs everywhere
 * (scalar where there is no SIMD) and libsodium's is kept as the fallback
 * for a libcrypto without the cipher. Both compute RFC 8439 exactly; the
 * unit test holds both to the RFC's vector and to each other.
 *
 * The streamed MAC is the AEAD with all input as additional data and an
 * empty text. libcrypto streams additional data through repeated
 * EVP_EncryptUpdate(out = NULL) calls. libsodium has no streamed AEAD, so
 * the fallback builds RFC 8439 s. 2.8's MAC from its primitives: the
 * one-time Poly1305 key is the first 32 bytes of the ChaCha20 keystream
 * block 0 under (key, nonce), the MAC input is ad || zero pad to 16 ||
 * le64(ad length) || le64(0) (no text).
 *
 * SIMD state. OpenSSL 3.0's AVX-512 code returns with the upper halves of
 * the vector registers dirty; legacy-SSE code after it (libxxhash's
 * XXH3 as Debian builds it) then runs 3-4 times slower - XXH3 at 3.8 GB/s
 * instead of 13 in the same process (measured; a checksum=on transfer
 * lost most of its speed after a sealed one). Every libcrypto call here
 * is followed by VZEROUPPER (when the CPU has AVX), which costs a few
 * cycles and gives the rest of the node back its speed.
 *
 * A libcrypto failure before any byte was touched falls back to
 * libsodium for that call (the same bytes); one after (which libcrypto
 * does not do with valid arguments) leaves a random tag, so the peer
 * refuses the message - never a wrong tag that verifies, never plaintext
 * where ciphertext was due (the buffer is zeroed).
 */
#include "net/chapoly.h"

#include <limits.h>
#include <openssl/evp.h>
#include <sodium.h>
#include <string.h>

_Static_assert(sizeof(crypto_onetimeauth_poly1305_state) <=
	       sizeof(((struct chapoly_mac *)0)->poly), "poly1305 state size");
_Static_assert(CHAPOLY_TAG_BYTES == crypto_aead_chacha20poly1305_IETF_ABYTES &&
	       CHAPOLY_NONCE_BYTES == crypto_aead_chacha20poly1305_IETF_NPUBBYTES &&
	       CHAPOLY_KEY_BYTES == crypto_aead_chacha20poly1305_IETF_KEYBYTES,
	       "RFC 8439 sizes");

/* Process-wide and immutable after init, like libsodium's own state: the
 * fetched cipher (NULL: libcrypto does not offer it), the choice, and
 * whether the CPU has AVX (VZEROUPPER exists). */
static EVP_CIPHER *chapoly_evp;
static enum chapoly_impl chapoly_cur = CHAPOLY_LIBSODIUM;
static bool chapoly_avx;

/* Clean the upper vector state libcrypto leaves dirty (design note). The
 * lower 128 bits survive VZEROUPPER; the clobbers keep the compiler from
 * holding wider values across it. */
static void simd_clean(void)
{
#if defined(__x86_64__)
	if (chapoly_avx)
		__asm__ volatile("vzeroupper" ::: "memory", "xmm0", "xmm1", "xmm2",
				 "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9",
				 "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15");
#endif
}

int chapoly_global_init(void)
{
#if defined(__x86_64__)
	chapoly_avx = __builtin_cpu_supports("avx");
#endif
	if (!chapoly_evp)
		chapoly_evp = EVP_CIPHER_fetch(NULL, "ChaCha20-Poly1305", NULL);
	chapoly_cur = chapoly_evp ? CHAPOLY_LIBCRYPTO : CHAPOLY_LIBSODIUM;
	return 0;
}

void chapoly_global_deinit(void)
{
	EVP_CIPHER_free(chapoly_evp);
	chapoly_evp = NULL;
	chapoly_cur = CHAPOLY_LIBSODIUM;
}

enum chapoly_impl chapoly_impl(void)
{
	return chapoly_cur;
}

const char *chapoly_impl_name(enum chapoly_impl impl)
{
	return impl == CHAPOLY_LIBCRYPTO ? "libcrypto" : "libsodium";
}

enum chapoly_impl chapoly_impl_set(enum chapoly_impl impl)
{
	enum chapoly_impl was = chapoly_cur;

	chapoly_cur = impl == CHAPOLY_LIBCRYPTO && chapoly_evp ? impl
							       : CHAPOLY_LIBSODIUM;
	return was;
}

/* ---- libcrypto ------------------------------------------------------------ */

/* A context keyed for (key, nonce) in direction `enc`, or NULL. */
static EVP_CIPHER_CTX *evp_start(const uint8_t *key, const uint8_t *nonce, int enc)
{
	EVP_CIPHER_CTX *c;

	if (chapoly_cur != CHAPOLY_LIBCRYPTO || !chapoly_evp)
		return NULL;
	c = EVP_CIPHER_CTX_new();
	if (c && EVP_CipherInit_ex2(c, chapoly_evp, key, nonce, enc, NULL) == 1) {
		simd_clean();
		return c;
	}
	EVP_CIPHER_CTX_free(c);
	simd_clean();
	return NULL;
}

/* Feed p[0, n) in int-sized pieces: additional data when out is NULL,
 * else text (en/decrypted into out). 1 or 0. */
static int evp_feed(EVP_CIPHER_CTX *c, uint8_t *out, const uint8_t *p, size_t n)
{
	while (n > 0) {
		int k = n > (size_t)(INT_MAX / 2) ? INT_MAX / 2 : (int)n, l;

		if (EVP_CipherUpdate(c, out, &l, p, k) != 1)
			return 0;
		p += k;
		out = out ? out + k : NULL;
		n -= (size_t)k;
	}
	simd_clean();
	return 1;
}

/* ---- the streamed MAC ----------------------------------------------------- */

static void put_le64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static crypto_onetimeauth_poly1305_state *mac_poly(struct chapoly_mac *m)
{
	return (crypto_onetimeauth_poly1305_state *)m->poly;
}

void chapoly_mac_init(struct chapoly_mac *m, const uint8_t key[CHAPOLY_KEY_BYTES],
		      const uint8_t nonce[CHAPOLY_NONCE_BYTES])
{
	uint8_t otk[32];

	memset(m, 0, sizeof(*m));
	m->evp = evp_start(key, nonce, 1);
	if (m->evp) {
		m->impl = CHAPOLY_LIBCRYPTO;
		return;
	}
	m->impl = CHAPOLY_LIBSODIUM;
	crypto_stream_chacha20_ietf(otk, sizeof(otk), nonce, key);
	crypto_onetimeauth_poly1305_init(mac_poly(m), otk);
	sodium_memzero(otk, sizeof(otk));
}

void chapoly_mac_update(struct chapoly_mac *m, const void *p, size_t n)
{
	if (m->impl == CHAPOLY_LIBCRYPTO) {
		/* a failure here poisons the MAC (final: a random tag) */
		if (m->evp && !evp_feed(m->evp, NULL, p, n)) {
			EVP_CIPHER_CTX_free(m->evp);
			m->evp = NULL;
			simd_clean();
		}
		return;
	}
	crypto_onetimeauth_poly1305_update(mac_poly(m), p, n);
	m->ad_n += n;
}

void chapoly_mac_final(struct chapoly_mac *m, uint8_t tag[CHAPOLY_TAG_BYTES])
{
	static const uint8_t zero[16];
	uint8_t lens[16];
	int l;

	if (m->impl == CHAPOLY_LIBCRYPTO) {
		if (!m->evp || EVP_CipherFinal_ex(m->evp, lens, &l) != 1 ||
		    EVP_CIPHER_CTX_ctrl(m->evp, EVP_CTRL_AEAD_GET_TAG,
					CHAPOLY_TAG_BYTES, tag) != 1)
			randombytes_buf(tag, CHAPOLY_TAG_BYTES);
		EVP_CIPHER_CTX_free(m->evp);
		simd_clean();
	} else {
		crypto_onetimeauth_poly1305_update(mac_poly(m), zero,
						   (16 - m->ad_n % 16) % 16);
		put_le64(lens, m->ad_n);
		put_le64(lens + 8, 0);
		crypto_onetimeauth_poly1305_update(mac_poly(m), lens, sizeof(lens));
		crypto_onetimeauth_poly1305_final(mac_poly(m), tag);
	}
	sodium_memzero(m, sizeof(*m));
}

int chapoly_mac_verify(struct chapoly_mac *m, const uint8_t tag[CHAPOLY_TAG_BYTES])
{
	uint8_t want[CHAPOLY_TAG_BYTES];
	int r;

	chapoly_mac_final(m, want);
	r = crypto_verify_16(want, tag) == 0 ? 0 : CHAPOLY_E_AUTH;
	sodium_memzero(want, sizeof(want));
	return r;
}

/* ---- the AEAD --------------------------------------------------------------- */

/* Encrypt buf in place with libcrypto. 1 done; 0 nothing touched (use
 * libsodium); -1 failed midway (buf zeroed, tag random). */
static int evp_seal(const uint8_t *key, const uint8_t *nonce, const uint8_t *ad,
		    size_t ad_n, uint8_t *buf, size_t n, uint8_t *tag)
{
	EVP_CIPHER_CTX *c = evp_start(key, nonce, 1);
	uint8_t fin[16];
	int l, ok;

	if (!c)
		return 0;
	ok = evp_feed(c, NULL, ad, ad_n) && evp_feed(c, buf, buf, n) &&
	     EVP_CipherFinal_ex(c, fin, &l) == 1 &&
	     EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_AEAD_GET_TAG, CHAPOLY_TAG_BYTES, tag) == 1;
	EVP_CIPHER_CTX_free(c);
	simd_clean();
	if (ok)
		return 1;
	sodium_memzero(buf, n);
	randombytes_buf(tag, CHAPOLY_TAG_BYTES);
	return -1;
}

/* Decrypt buf in place with libcrypto, tag checked. 1 opened; 0 nothing
 * touched (use libsodium); -1 refused (buf zeroed). */
static int evp_open(const uint8_t *key, const uint8_t *nonce, const uint8_t *ad,
		    size_t ad_n, uint8_t *buf, size_t n, const uint8_t *tag)
{
	EVP_CIPHER_CTX *c = evp_start(key, nonce, 0);
	uint8_t fin[16];
	int l, ok;

	if (!c)
		return 0;
	ok = EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_AEAD_SET_TAG, CHAPOLY_TAG_BYTES,
				 (void *)tag) == 1 &&
	     evp_feed(c, NULL, ad, ad_n) && evp_feed(c, buf, buf, n) &&
	     EVP_CipherFinal_ex(c, fin, &l) == 1;
	EVP_CIPHER_CTX_free(c);
	simd_clean();
	if (ok)
		return 1;
	sodium_memzero(buf, n);
	return -1;
}

void chapoly_seal(const uint8_t key[CHAPOLY_KEY_BYTES],
		  const uint8_t nonce[CHAPOLY_NONCE_BYTES],
		  const uint8_t *ad, size_t ad_n, uint8_t *buf, size_t n,
		  bool encrypt, uint8_t tag[CHAPOLY_TAG_BYTES])
{
	struct chapoly_mac m;

	if (!encrypt) {
		chapoly_mac_init(&m, key, nonce);
		chapoly_mac_update(&m, ad, ad_n);
		chapoly_mac_update(&m, buf, n);
		chapoly_mac_final(&m, tag);
		return;
	}
	if (evp_seal(key, nonce, ad, ad_n, buf, n, tag) == 0)
		crypto_aead_chacha20poly1305_ietf_encrypt_detached(
			buf, tag, NULL, buf, n, ad, ad_n, NULL, nonce, key);
}

int chapoly_open(const uint8_t key[CHAPOLY_KEY_BYTES],
		 const uint8_t nonce[CHAPOLY_NONCE_BYTES],
		 const uint8_t *ad, size_t ad_n, uint8_t *buf, size_t n,
		 bool encrypt, const uint8_t tag[CHAPOLY_TAG_BYTES])
{
	struct chapoly_mac m;
	int r;

	if (!encrypt) {
		chapoly_mac_init(&m, key, nonce);
		chapoly_mac_update(&m, ad, ad_n);
		chapoly_mac_update(&m, buf, n);
		return chapoly_mac_verify(&m, tag);
	}
	r = evp_open(key, nonce, ad, ad_n, buf, n, tag);
	if (r)
		return r > 0 ? 0 : CHAPOLY_E_AUTH;
	/* libsodium verifies before it writes and zeroes its output (here
	 * the ciphertext itself) on a mismatch */
	return crypto_aead_chacha20poly1305_ietf_decrypt_detached(
		       buf, NULL, buf, n, tag, ad, ad_n, nonce, key) == 0
		       ? 0 : CHAPOLY_E_AUTH;
}
