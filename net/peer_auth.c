/* peer_auth.c - cluster key, proofs, link keys and sealing (peer_auth.h).
 *
 * Labels. Every MAC and KDF input starts with a fixed label naming its
 * purpose and protocol version, so no value computed for one purpose can
 * be presented for another (a proof is never a key, decode's proof is
 * never prefill's).
 *
 * Nonces for the AEAD are the 64-bit per-direction counter, little-endian,
 * in the last 8 bytes of the 12-byte IETF nonce. Keys are fresh per link
 * (derived from two fresh 32-byte nonces), so a (key, counter) pair never
 * repeats; the counter cannot wrap in practice (2^64 frames).
 */
#include "net/peer_auth.h"
#include "net/chapoly.h"
#include "net/wire/frame.h"

#include <errno.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#define LBL_KEY "kvd/2 cluster key"
#define LBL_PROOF_D "kvd/3 proof decode"
#define LBL_PROOF_P "kvd/3 proof prefill"
#define LBL_CTL_D2P "kvd/2 ctl decode->prefill"
#define LBL_CTL_P2D "kvd/2 ctl prefill->decode"
#define LBL_DATA "kvd/2 data prefill->decode"
#define LBL_TOKEN "kvd/2 data token"

int peer_auth_global_init(void)
{
	if (sodium_init() < 0)
		return -EIO;
	return chapoly_global_init();
}

int peer_key_init(struct peer_key *key, const uint8_t *material, size_t n)
{
	crypto_generichash_state st;

	memset(key, 0, sizeof(*key));
	if (!material || n < PEER_AUTH_BYTES)
		return -EINVAL;
	/* K = BLAKE2b-256(label || material): fixed-size, uniform whatever
	 * the file's encoding (hex, raw, base64) */
	crypto_generichash_init(&st, NULL, 0, PEER_AUTH_BYTES);
	crypto_generichash_update(&st, (const uint8_t *)LBL_KEY, sizeof(LBL_KEY));
	crypto_generichash_update(&st, material, n);
	crypto_generichash_final(&st, key->k, PEER_AUTH_BYTES);
	sodium_memzero(&st, sizeof(st));
	key->set = true;
	return 0;
}

void peer_key_wipe(struct peer_key *key)
{
	sodium_memzero(key, sizeof(*key));
}

void peer_auth_random(uint8_t out[PEER_AUTH_BYTES])
{
	randombytes_buf(out, PEER_AUTH_BYTES);
}

/* out = BLAKE2b-256 keyed with K over (label, nonce_d, nonce_p). */
static void peer_mac(const struct peer_key *key, const char *label,
		     const uint8_t nonce_d[PEER_AUTH_BYTES],
		     const uint8_t nonce_p[PEER_AUTH_BYTES],
		     uint8_t out[PEER_AUTH_BYTES])
{
	crypto_generichash_state st;

	crypto_generichash_init(&st, key->k, PEER_AUTH_BYTES, PEER_AUTH_BYTES);
	crypto_generichash_update(&st, (const uint8_t *)label, strlen(label) + 1);
	crypto_generichash_update(&st, nonce_d, PEER_AUTH_BYTES);
	crypto_generichash_update(&st, nonce_p, PEER_AUTH_BYTES);
	crypto_generichash_final(&st, out, PEER_AUTH_BYTES);
	sodium_memzero(&st, sizeof(st));
}

/* One identity string into a proof: its length (one byte) then its
 * bytes, so no two lists of strings hash alike. */
static void peer_mac_str(crypto_generichash_state *st, const char *v, size_t max)
{
	size_t n = v ? strnlen(v, max - 1) : 0;
	uint8_t len = (uint8_t)n;

	crypto_generichash_update(st, &len, 1);
	crypto_generichash_update(st, (const uint8_t *)(v ? v : ""), n);
}

/* proof = BLAKE2b-256 keyed with K over (label, nonce_d, nonce_p, name_d,
 * name_p, addr_d, addr_p). */
void peer_auth_proof(const struct peer_key *key, enum peer_auth_side side,
		     const uint8_t nonce_d[PEER_AUTH_BYTES],
		     const uint8_t nonce_p[PEER_AUTH_BYTES],
		     const struct peer_auth_ids *ids,
		     uint8_t proof[PEER_AUTH_BYTES])
{
	const char *label = side == PEER_SIDE_DECODE ? LBL_PROOF_D : LBL_PROOF_P;
	crypto_generichash_state st;

	crypto_generichash_init(&st, key->k, PEER_AUTH_BYTES, PEER_AUTH_BYTES);
	crypto_generichash_update(&st, (const uint8_t *)label, strlen(label) + 1);
	crypto_generichash_update(&st, nonce_d, PEER_AUTH_BYTES);
	crypto_generichash_update(&st, nonce_p, PEER_AUTH_BYTES);
	peer_mac_str(&st, ids->name_d, PEER_AUTH_NAME_BYTES);
	peer_mac_str(&st, ids->name_p, PEER_AUTH_NAME_BYTES);
	peer_mac_str(&st, ids->addr_d, PEER_AUTH_ADDR_MAX);
	peer_mac_str(&st, ids->addr_p, PEER_AUTH_ADDR_MAX);
	crypto_generichash_final(&st, proof, PEER_AUTH_BYTES);
	sodium_memzero(&st, sizeof(st));
}

int peer_auth_check(const struct peer_key *key, enum peer_auth_side side,
		    const uint8_t nonce_d[PEER_AUTH_BYTES],
		    const uint8_t nonce_p[PEER_AUTH_BYTES],
		    const struct peer_auth_ids *ids,
		    const uint8_t proof[PEER_AUTH_BYTES])
{
	uint8_t want[PEER_AUTH_BYTES];
	int ok;

	/* equal nonces: a reflected handshake, never two fresh draws */
	if (!key->set || !sodium_memcmp(nonce_d, nonce_p, PEER_AUTH_BYTES))
		return PEER_AUTH_E_PROOF;
	peer_auth_proof(key, side, nonce_d, nonce_p, ids, want);
	ok = crypto_verify_32(want, proof) == 0;
	sodium_memzero(want, sizeof(want));
	return ok ? 0 : PEER_AUTH_E_PROOF;
}

void peer_session_derive(struct peer_session *ss, const struct peer_key *key,
			 enum peer_auth_side self,
			 const uint8_t nonce_d[PEER_AUTH_BYTES],
			 const uint8_t nonce_p[PEER_AUTH_BYTES], bool encrypt)
{
	uint8_t d2p[PEER_AUTH_BYTES], p2d[PEER_AUTH_BYTES];

	memset(ss, 0, sizeof(*ss));
	peer_mac(key, LBL_CTL_D2P, nonce_d, nonce_p, d2p);
	peer_mac(key, LBL_CTL_P2D, nonce_d, nonce_p, p2d);
	peer_mac(key, LBL_DATA, nonce_d, nonce_p, ss->data.key);
	peer_mac(key, LBL_TOKEN, nonce_d, nonce_p, ss->token);
	memcpy(ss->tx.key, self == PEER_SIDE_DECODE ? d2p : p2d, PEER_AUTH_BYTES);
	memcpy(ss->rx.key, self == PEER_SIDE_DECODE ? p2d : d2p, PEER_AUTH_BYTES);
	ss->tx.encrypt = ss->rx.encrypt = ss->data.encrypt = encrypt;
	sodium_memzero(d2p, sizeof(d2p));
	sodium_memzero(p2d, sizeof(p2d));
}

void peer_session_wipe(struct peer_session *ss)
{
	sodium_memzero(ss, sizeof(*ss));
}

static void peer_nonce(uint64_t seq, uint8_t n[CHAPOLY_NONCE_BYTES])
{
	memset(n, 0, CHAPOLY_NONCE_BYTES);
	for (int i = 0; i < 8; i++)
		n[4 + i] = (uint8_t)(seq >> (8 * i));
}

void peer_aead_seal(struct peer_aead *a, uint8_t *buf, size_t n, size_t ad_n,
		    uint8_t tag[PEER_AUTH_TAG_BYTES])
{
	uint8_t nonce[CHAPOLY_NONCE_BYTES];
	size_t ad = a->encrypt ? ad_n : n;

	peer_nonce(a->seq++, nonce);
	chapoly_seal(a->key, nonce, buf, ad, buf + ad, n - ad, a->encrypt, tag);
}

int peer_aead_open(struct peer_aead *a, uint8_t *buf, size_t n, size_t ad_n,
		   const uint8_t tag[PEER_AUTH_TAG_BYTES])
{
	uint8_t nonce[CHAPOLY_NONCE_BYTES];
	size_t ad = a->encrypt ? ad_n : n;

	peer_nonce(a->seq, nonce);
	/* the tag is verified before any plaintext is believed; on a
	 * mismatch the encrypted part is zeroed (chapoly_open) */
	if (chapoly_open(a->key, nonce, buf, ad, buf + ad, n - ad, a->encrypt, tag))
		return PEER_AUTH_E_OPEN;
	a->seq++;
	return 0;
}

void peer_auth_name_seal(struct peer_aead *a, const char *name,
			 uint8_t out[PEER_AUTH_NAME_SEALED])
{
	struct peer_aead enc = *a;

	memset(out, 0, PEER_AUTH_NAME_SEALED);
	if (name)
		memcpy(out, name, strnlen(name, PEER_AUTH_NAME_BYTES - 1));
	enc.encrypt = true;   /* a name is never shown to the wire */
	peer_aead_seal(&enc, out, PEER_AUTH_NAME_BYTES, 0, out + PEER_AUTH_NAME_BYTES);
	a->seq = enc.seq;
	sodium_memzero(&enc, sizeof(enc));
}

int peer_auth_name_open(struct peer_aead *a, const uint8_t in[PEER_AUTH_NAME_SEALED],
			char name[PEER_AUTH_NAME_BYTES])
{
	struct peer_aead dec = *a;
	uint8_t buf[PEER_AUTH_NAME_BYTES];
	int rc;

	memcpy(buf, in, PEER_AUTH_NAME_BYTES);
	dec.encrypt = true;
	rc = peer_aead_open(&dec, buf, PEER_AUTH_NAME_BYTES, 0, in + PEER_AUTH_NAME_BYTES);
	if (!rc && !memchr(buf, '\0', PEER_AUTH_NAME_BYTES))
		rc = PEER_AUTH_E_OPEN;
	if (!rc) {
		memcpy(name, buf, PEER_AUTH_NAME_BYTES);
		a->seq = dec.seq;
	}
	sodium_memzero(&dec, sizeof(dec));
	sodium_memzero(buf, sizeof(buf));
	return rc;
}

void peer_aead_mac_iov(struct peer_aead *a, const struct iovec *iov, int n_iov,
		       uint8_t tag[PEER_AUTH_TAG_BYTES])
{
	uint8_t nonce[CHAPOLY_NONCE_BYTES];
	struct chapoly_mac m;

	peer_nonce(a->seq++, nonce);
	chapoly_mac_init(&m, a->key, nonce);
	for (int i = 0; i < n_iov; i++)
		chapoly_mac_update(&m, iov[i].iov_base, iov[i].iov_len);
	chapoly_mac_final(&m, tag);
}

int peer_frame_seal(struct peer_aead *a, char **data, size_t *len)
{
	size_t plen = *len - FRAME_HEADER_BYTES;
	char *nb = realloc(*data, *len + PEER_AUTH_TAG_BYTES);
	uint32_t wl;

	if (!nb)
		return -ENOMEM;
	*data = nb;
	wl = (uint32_t)(plen + PEER_AUTH_TAG_BYTES);
	nb[0] = (char)(wl >> 24);
	nb[1] = (char)(wl >> 16);
	nb[2] = (char)(wl >> 8);
	nb[3] = (char)wl;
	peer_aead_seal(a, (uint8_t *)nb + FRAME_HEADER_BYTES, plen, 0,
		       (uint8_t *)nb + FRAME_HEADER_BYTES + plen);
	*len += PEER_AUTH_TAG_BYTES;
	return 0;
}

int peer_frame_open(void *aead, uint8_t *p, size_t n, size_t *plain_n)
{
	if (n < PEER_AUTH_TAG_BYTES)
		return PEER_AUTH_E_SIZE;
	if (peer_aead_open(aead, p, n - PEER_AUTH_TAG_BYTES, 0,
			   p + n - PEER_AUTH_TAG_BYTES))
		return PEER_AUTH_E_OPEN;
	*plain_n = n - PEER_AUTH_TAG_BYTES;
	return 0;
}
