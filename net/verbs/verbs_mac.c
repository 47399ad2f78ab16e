/* verbs_mac.c - a Poly1305 MAC over a batch's header and filled page bytes.
 *
 * Design. Input, in order: the label (with its NUL), the counter (8 bytes
 * little-endian), the header length (8 bytes) and bytes, then for each
 * page its token count (4 bytes) and its extents' bytes in ascending
 * order. The lengths are in the input so that no two different batches
 * give the same byte stream.
 *
 * The MAC is ChaCha20-Poly1305 with the whole input as additional data
 * (net/chapoly.h, streamed: the extents are scattered over the pool), at
 * 13 GB/s per core where keyed BLAKE2b did 0.65 (tests/bench/bench_mac.c;
 * issue 22.9). Its key is BLAKE2b(key = data key, label): the AEAD key of
 * the TCP path is never used by a second construction.
 *
 * Nonce discipline. Poly1305's one-time key comes from ChaCha20 under
 * (MAC key, nonce), so a nonce must never MAC two different batches under
 * one key. The nonce is the data direction's batch counter (a->seq, in
 * the last 8 of 12 bytes). The MAC key is derived per link from the
 * link's data key, itself fresh per link (both handshake nonces, net/
 * peer_auth.c), so no two links share it; within a link only the sender
 * seals, and verbs_mac_seal advances the counter after every tag it
 * makes, so a nonce is used for one batch only. (A refused page leaves
 * the counter where it was, but then no tag was made.) The receiver
 * verifies with its own copy of the counter, which advances only on a
 * batch that verifies: a replayed or reordered batch is checked against
 * the wrong nonce and refused. The counter cannot wrap (2^64 batches).
 * Keyless links (loopback only) MAC with a zero data key: the key is
 * public, every such link counts from 0, so nonces repeat across links -
 * harmless, since there the MAC claims no authenticity (anyone can
 * compute it); it is a checksum against accidents only.
 */
#include "net/verbs/verbs_mac.h"

#include <sodium.h>
#include <stdbool.h>
#include <string.h>

#include "net/chapoly.h"
#include "net/verbs/verbs_extent.h"

#define LBL_KEY "kvd/3 verbs batch mac key"
#define LBL_MAC "kvd/3 verbs batch"
#define EXTENTS_MAX 1024

static void put_le(uint8_t *p, uint64_t v, int n)
{
	for (int i = 0; i < n; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

/* Start m for batch `seq`: key and nonce as the design says. */
static void batch_mac_start(struct chapoly_mac *m, const struct peer_aead *a,
			    uint64_t seq)
{
	uint8_t key[CHAPOLY_KEY_BYTES], nonce[CHAPOLY_NONCE_BYTES];

	crypto_generichash(key, sizeof(key), (const uint8_t *)LBL_KEY,
			   sizeof(LBL_KEY), a->key, PEER_AUTH_BYTES);
	memset(nonce, 0, sizeof(nonce));
	put_le(nonce + 4, seq, 8);
	chapoly_mac_init(m, key, nonce);
	sodium_memzero(key, sizeof(key));
}

/* Every page's token count is one the MAC can cover. */
static bool batch_pages_ok(const struct kvpool_geom *g,
			   const struct verbs_mac_page *pages, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		if (verbs_extent_count(g, pages[i].tokens) == 0 ||
		    verbs_extent_count(g, pages[i].tokens) > EXTENTS_MAX)
			return false;
	return true;
}

/* Feed the batch (pages checked) into m, started for seq. */
static void batch_mac_feed(struct chapoly_mac *m, uint64_t seq,
			   const struct kvpool_geom *g, const void *hdr, size_t hdr_n,
			   const struct verbs_mac_page *pages, uint32_t n)
{
	uint8_t num[8];
	struct verbs_extent ex[EXTENTS_MAX];

	chapoly_mac_update(m, LBL_MAC, sizeof(LBL_MAC));
	put_le(num, seq, 8);
	chapoly_mac_update(m, num, 8);
	put_le(num, hdr_n, 8);
	chapoly_mac_update(m, num, 8);
	chapoly_mac_update(m, hdr, hdr_n);
	for (uint32_t i = 0; i < n; i++) {
		int k = verbs_extent_page(g, pages[i].tokens, ex, EXTENTS_MAX);

		put_le(num, pages[i].tokens, 4);
		chapoly_mac_update(m, num, 4);
		for (int j = 0; j < k; j++)
			chapoly_mac_update(m, pages[i].base + ex[j].offset,
					   ex[j].length);
	}
}

int verbs_mac_seal(struct peer_aead *a, const struct kvpool_geom *g,
		   const void *hdr, size_t hdr_n,
		   const struct verbs_mac_page *pages, uint32_t n,
		   uint8_t tag[PEER_AUTH_TAG_BYTES])
{
	struct chapoly_mac m;

	if (!batch_pages_ok(g, pages, n))
		return VERBS_MAC_E_PAGE;
	batch_mac_start(&m, a, a->seq);
	batch_mac_feed(&m, a->seq, g, hdr, hdr_n, pages, n);
	chapoly_mac_final(&m, tag);
	a->seq++;   /* this nonce has made its one tag */
	return 0;
}

int verbs_mac_open(struct peer_aead *a, const struct kvpool_geom *g,
		   const void *hdr, size_t hdr_n,
		   const struct verbs_mac_page *pages, uint32_t n,
		   const uint8_t tag[PEER_AUTH_TAG_BYTES])
{
	struct chapoly_mac m;

	if (!batch_pages_ok(g, pages, n))
		return VERBS_MAC_E_PAGE;
	batch_mac_start(&m, a, a->seq);
	batch_mac_feed(&m, a->seq, g, hdr, hdr_n, pages, n);
	if (chapoly_mac_verify(&m, tag))
		return VERBS_MAC_E_AUTH;
	a->seq++;
	return 0;
}
