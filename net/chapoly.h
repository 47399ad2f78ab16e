/* chapoly.h - ChaCha20-Poly1305 (RFC 8439, 96-bit nonce) for peer links:
 * the AEAD of control frames and TCP KV batches, and a streamed MAC (every
 * byte additional data, nothing encrypted) for batches that travel by RDMA.
 *
 * Two implementations of the one algorithm, giving the same bytes:
 * OpenSSL's libcrypto 3 (ChaCha20 and Poly1305 in AVX-512/AVX2 assembly
 * where the CPU has them; 13 GB/s per core MAC-only on the development
 * machine, tests/bench/bench_mac.c) and libsodium's (portable, 3.5 GB/s).
 * chapoly_global_init picks libcrypto when it provides the cipher (a
 * FIPS-only provider does not), else libsodium; either side of a link may
 * run either, so nothing is negotiated and nothing can be downgraded.
 *
 * Nonces: the caller's. A (key, nonce) pair must never seal two different
 * messages: peer links derive fresh keys per link and use a per-direction
 * counter as nonce (net/peer_auth.c).
 *
 * Errors: chapoly_open and chapoly_mac_verify return 0 or CHAPOLY_E_AUTH.
 * Thread safety: after chapoly_global_init (once, before threads), every
 * call is independent (own state, no shared mutable data).
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CHAPOLY_KEY_BYTES 32
#define CHAPOLY_NONCE_BYTES 12
#define CHAPOLY_TAG_BYTES 16

enum { CHAPOLY_E_AUTH = 1 };   /* the tag does not match */

enum chapoly_impl {
	CHAPOLY_LIBSODIUM = 0,   /* portable; always there */
	CHAPOLY_LIBCRYPTO,       /* OpenSSL 3, vectorised where the CPU allows */
};

/* Fetch libcrypto's cipher; libsodium stays when it is missing. Call
 * after sodium_init. Always 0 (the fallback is always there). */
int chapoly_global_init(void);
void chapoly_global_deinit(void);
/* Which implementation calls use now, and its name for logs/benches. */
enum chapoly_impl chapoly_impl(void);
const char *chapoly_impl_name(enum chapoly_impl impl);
/* Tests and benches: use `impl` from now on (libcrypto only when
 * chapoly_global_init found it); returns the one in use before. */
enum chapoly_impl chapoly_impl_set(enum chapoly_impl impl);

/* Seal in place: ad[0, ad_n) authenticated; buf[0, n) encrypted in place
 * when `encrypt`, else authenticated as additional data after ad (so the
 * tag equals the AEAD's over ad || buf as additional data and no text). */
void chapoly_seal(const uint8_t key[CHAPOLY_KEY_BYTES],
		  const uint8_t nonce[CHAPOLY_NONCE_BYTES],
		  const uint8_t *ad, size_t ad_n, uint8_t *buf, size_t n,
		  bool encrypt, uint8_t tag[CHAPOLY_TAG_BYTES]);
/* Open what chapoly_seal made: 0, buf decrypted in place when `encrypt`;
 * or CHAPOLY_E_AUTH: with `encrypt` buf[0, n) is zeros (no unverified
 * plaintext ever shows), else nothing changed. */
int chapoly_open(const uint8_t key[CHAPOLY_KEY_BYTES],
		 const uint8_t nonce[CHAPOLY_NONCE_BYTES],
		 const uint8_t *ad, size_t ad_n, uint8_t *buf, size_t n,
		 bool encrypt, const uint8_t tag[CHAPOLY_TAG_BYTES]);

/* A streamed MAC: the AEAD's tag over the concatenation of every update as
 * additional data and an empty text (chapoly_seal with n = 0 over the same
 * bytes gives the same tag). Embedded; _init, any number of _update, then
 * one _final or _verify, which also wipe it. */
struct chapoly_mac {
	enum chapoly_impl impl;
	void *evp;             /* libcrypto: an EVP_CIPHER_CTX */
	uint64_t ad_n;         /* libsodium: bytes so far */
	/* libsodium: crypto_onetimeauth_poly1305_state (256 bytes, aligned) */
	_Alignas(16) uint8_t poly[256];
};

void chapoly_mac_init(struct chapoly_mac *m, const uint8_t key[CHAPOLY_KEY_BYTES],
		      const uint8_t nonce[CHAPOLY_NONCE_BYTES]);
void chapoly_mac_update(struct chapoly_mac *m, const void *p, size_t n);
void chapoly_mac_final(struct chapoly_mac *m, uint8_t tag[CHAPOLY_TAG_BYTES]);
/* 0 when `tag` is the MAC (constant time), else CHAPOLY_E_AUTH. */
int chapoly_mac_verify(struct chapoly_mac *m, const uint8_t tag[CHAPOLY_TAG_BYTES]);
