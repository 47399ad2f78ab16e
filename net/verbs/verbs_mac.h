/* verbs_mac.h - the MAC of a KV batch that travelled by RDMA.
 *
 * Over TCP a batch is one buffer and peer_aead_seal authenticates all of
 * it. Over RDMA the pages are placed by the NIC straight into decode's
 * pool and only the header and entries travel as one message, so decode
 * must authenticate what its pool now holds: the MAC covers a batch
 * counter, the header-and-entries bytes and, page by page, exactly the
 * bytes the stale-tail rule lets a WRITE carry (net/verbs/verbs_extent.h: the
 * tag and positions [0, tokens) of every K/V block - the tags are inside
 * the MAC). Prefill computes it over its source pages, decode over its
 * destination pages after the batch's completion, before any tag, token
 * count or KV is believed. ChaCha20-Poly1305 with everything as
 * additional data (net/chapoly.h, streamed), with a key derived from the
 * link's data key for this use only; the nonce is the data direction's
 * counter (a->seq), so a replayed or reordered batch does not verify. Batches are authenticated, never
 * encrypted (transfer.encrypt is refused with verbs).
 */
#pragma once

#include <stdint.h>

#include "gpu/kv/kvpool.h"
#include "net/peer_auth.h"

enum {
	VERBS_MAC_E_AUTH = 1,     /* the tag does not match */
	VERBS_MAC_E_PAGE,         /* a page's token count is out of range */
};

/* One page of the batch: its first byte in this side's memory (source on
 * prefill, destination on decode) and the positions it holds. */
struct verbs_mac_page {
	const uint8_t *base;
	uint32_t tokens;
};

/* Sender: the tag with a->seq, then a->seq advances. 0 or
 * VERBS_MAC_E_PAGE (a->seq unchanged). */
int verbs_mac_seal(struct peer_aead *a, const struct kvpool_geom *g,
		   const void *hdr, size_t hdr_n,
		   const struct verbs_mac_page *pages, uint32_t n,
		   uint8_t tag[PEER_AUTH_TAG_BYTES]);
/* Receiver: 0 when tag is the one for a->seq (which then advances), else
 * VERBS_MAC_E_AUTH or VERBS_MAC_E_PAGE with a->seq unchanged. Constant
 * time in the tag comparison. */
int verbs_mac_open(struct peer_aead *a, const struct kvpool_geom *g,
		   const void *hdr, size_t hdr_n,
		   const struct verbs_mac_page *pages, uint32_t n,
		   const uint8_t tag[PEER_AUTH_TAG_BYTES]);
