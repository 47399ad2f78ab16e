/* peer_auth.h - who may be a peer, and the keys of one peer link
 * (invariant 11: a node acts on nothing from a peer, and reveals nothing
 * to it, before both have proved they hold the cluster key).
 *
 * The cluster key is derived from peers.key_file's bytes (conf/keyfile.h).
 * A link is authenticated by four plaintext frames before anything else
 * (net/PROTOCOL.md s. 2.1); decode (the side that connects) is the
 * initiator:
 *   d -> p  auth_hello     {version, nonce_d}
 *   p -> d  auth_challenge {nonce_p}
 *   d -> p  auth_proof     {proof_d = MAC_K("decode", nonce_d, nonce_p,
 *                           name_d, "", addr_d, addr_p), name: sealed name_d}
 *   p -> d  auth_proof     {proof_p = MAC_K("prefill", nonce_d, nonce_p,
 *                           name_d, name_p, addr_d, addr_p), name: sealed name_p}
 * Each side checks the other's proof over both fresh nonces, so neither
 * a replayed nor a reflected proof verifies (the role is in the MAC), and
 * over both ends' identities: the node names (decode's proof cannot hold
 * prefill's, which a stranger must not learn) and the control
 * connection's two addresses as each end sees its own socket - a proof
 * relayed by a man in the middle to another node is computed over other
 * addresses and never verifies. The names travel encrypted under the
 * link's control keys (a stranger learns no name). Prefill proves only
 * after decode has: a stranger learns one random nonce. Both derive this
 * link's keys from K and both nonces:
 *   ctl d->p, ctl p->d   AEAD keys of every later control frame (hellos -
 *                        roles, node names, model fingerprint - included,
 *                        so they are bound to this session);
 *   data p->d            AEAD key of every KV batch;
 *   token                binds the data connection to this link.
 * MAC and KDF are keyed BLAKE2b; the AEAD is ChaCha20-Poly1305 (IETF)
 * with a 64-bit message counter per direction as nonce: a frame that is
 * replayed, reordered, dropped or forged fails to open, and the stream is
 * torn down. With transfer.encrypt off the payload is authenticated only
 * (all of it is additional data); on, it is encrypted too.
 * Every primitive is libsodium's or, for the AEAD, libcrypto's (net/
 * chapoly.h: the same bytes, faster); nothing here is homemade crypto.
 *
 * Errors: 0; PEER_AUTH_E_* (positive) for a refusal; -ENOMEM, -EIO.
 * Thread safety: none; one link per object, loop thread.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PEER_AUTH_BYTES 32      /* nonces, proofs, keys, tokens */
#define PEER_AUTH_TAG_BYTES 16  /* AEAD tag appended to a frame or batch */
#define PEER_AUTH_NAME_BYTES 64 /* a node name in a proof, NUL-padded */
#define PEER_AUTH_NAME_SEALED (PEER_AUTH_NAME_BYTES + PEER_AUTH_TAG_BYTES)
#define PEER_AUTH_ADDR_MAX 64   /* "ip:port" as a socket gives it */

enum {
	PEER_AUTH_E_PROOF = 1,   /* the proof does not verify */
	PEER_AUTH_E_OPEN,        /* a frame or batch failed to authenticate */
	PEER_AUTH_E_SIZE,        /* too short to hold a tag, or too long */
};

enum peer_auth_side { PEER_SIDE_DECODE = 0, PEER_SIDE_PREFILL = 1 };

/* The cluster key (derived; the file's bytes are never kept). */
struct peer_key {
	uint8_t k[PEER_AUTH_BYTES];
	bool set;
};

/* One direction of AEAD: key, next counter, whether to encrypt. */
struct peer_aead {
	uint8_t key[PEER_AUTH_BYTES];
	uint64_t seq;
	bool encrypt;
};

struct peer_session {
	struct peer_aead tx, rx;         /* control frames we send / receive */
	struct peer_aead data;           /* KV batches, prefill -> decode */
	uint8_t token[PEER_AUTH_BYTES];  /* data connection binding */
};

/* libsodium init; call once before anything else here. 0 or -EIO. */
int peer_auth_global_init(void);

/* Derive the cluster key from key material (>= 32 bytes). */
int peer_key_init(struct peer_key *key, const uint8_t *material, size_t n);
void peer_key_wipe(struct peer_key *key);

/* Fresh random bytes (nonces; keyless links' data tokens). */
void peer_auth_random(uint8_t out[PEER_AUTH_BYTES]);

/* The two ends of a link, as a proof binds them: node names (name_p is
 * "" in decode's proof) and the control connection's addresses, "ip:port"
 * of decode's end and of prefill's end, each read by its own side from
 * its socket (getsockname / getpeername). Strings shorter than
 * PEER_AUTH_NAME_BYTES / PEER_AUTH_ADDR_MAX; NULL is "". */
struct peer_auth_ids {
	const char *name_d, *name_p;
	const char *addr_d, *addr_p;
};

/* The proof of `side` over both nonces and ids. */
void peer_auth_proof(const struct peer_key *key, enum peer_auth_side side,
		     const uint8_t nonce_d[PEER_AUTH_BYTES],
		     const uint8_t nonce_p[PEER_AUTH_BYTES],
		     const struct peer_auth_ids *ids,
		     uint8_t proof[PEER_AUTH_BYTES]);
/* 0 when `proof` is side's proof over these nonces and ids (constant
 * time), else PEER_AUTH_E_PROOF. */
int peer_auth_check(const struct peer_key *key, enum peer_auth_side side,
		    const uint8_t nonce_d[PEER_AUTH_BYTES],
		    const uint8_t nonce_p[PEER_AUTH_BYTES],
		    const struct peer_auth_ids *ids,
		    const uint8_t proof[PEER_AUTH_BYTES]);

/* A node name for an auth_proof: NUL-padded to PEER_AUTH_NAME_BYTES and
 * encrypted (whatever a->encrypt says) under a - the sender's control
 * key, whose counter it uses and advances (the hello then takes the
 * next). A name of PEER_AUTH_NAME_BYTES or more is cut. */
void peer_auth_name_seal(struct peer_aead *a, const char *name,
			 uint8_t out[PEER_AUTH_NAME_SEALED]);
/* Open one: 0 with the name (NUL-terminated) in name, or
 * PEER_AUTH_E_OPEN (forged, or no NUL) with a->seq unchanged. */
int peer_auth_name_open(struct peer_aead *a, const uint8_t in[PEER_AUTH_NAME_SEALED],
			char name[PEER_AUTH_NAME_BYTES]);

/* This link's keys, as seen by `self`. */
void peer_session_derive(struct peer_session *ss, const struct peer_key *key,
			 enum peer_auth_side self,
			 const uint8_t nonce_d[PEER_AUTH_BYTES],
			 const uint8_t nonce_p[PEER_AUTH_BYTES], bool encrypt);
void peer_session_wipe(struct peer_session *ss);

/* Seal buf[0, n) in place and write the tag: `ad` bytes [0, ad_n) are
 * authenticated, not encrypted; [ad_n, n) is encrypted when a->encrypt,
 * else authenticated too. Uses and advances a->seq. */
void peer_aead_seal(struct peer_aead *a, uint8_t *buf, size_t n, size_t ad_n,
		    uint8_t tag[PEER_AUTH_TAG_BYTES]);
/* Open what peer_aead_seal made with the same counter: 0 (buf decrypted
 * in place, a->seq advanced) or PEER_AUTH_E_OPEN: a->seq, the `ad` bytes
 * and the tag unchanged; with a->encrypt the encrypted part [ad_n, n) is
 * wiped to zeros (libsodium clears its output, so no unauthenticated
 * plaintext ever shows), else nothing changed. */
int peer_aead_open(struct peer_aead *a, uint8_t *buf, size_t n, size_t ad_n,
		   const uint8_t tag[PEER_AUTH_TAG_BYTES]);

/* MAC-only sealing (a->encrypt false) of a message given as pieces in
 * order: the tag peer_aead_seal would write over their concatenation
 * (zero-copy senders); uses and advances a->seq. */
struct iovec;
void peer_aead_mac_iov(struct peer_aead *a, const struct iovec *iov, int n_iov,
		       uint8_t tag[PEER_AUTH_TAG_BYTES]);

/* Seal a whole frame (net/wire/frame.h: 4-byte length then payload) made by
 * proto_peer_frame: the payload gets a tag appended and the length is
 * patched. *data is realloc'd. 0 or -ENOMEM. */
int peer_frame_seal(struct peer_aead *a, char **data, size_t *len);
/* A frame_decoder opener (frame_decoder_set_opener): payload p[0, n) is
 * sealed payload || tag; on success *plain_n is the plaintext length. */
int peer_frame_open(void *aead, uint8_t *p, size_t n, size_t *plain_n);
