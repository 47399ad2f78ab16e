/* verbs_mac.c - keyed BLAKE2b over a batch's header and filled page bytes.
 *
 * Design. Input, in order: the label (with its NUL), the counter (8 bytes
 * little-endian), the header length (8 bytes) and bytes, then for each
 * page its token count (4 bytes) and its extents' bytes in ascending
 * order. The lengths are in the input so that no two different batches
 * give the same byte stream. The key is BLAKE2b(data key, label2): the
 * AEAD key is never used by a second primitive.
 */
#include "net/verbs_mac.h"

#include <sodium.h>
#include <string.h>

#include "net/verbs_extent.h"

#define LBL_KEY "kvd verbs batch mac key"
#define LBL_MAC "kvd verbs batch"
#define EXTENTS_MAX 1024

static void put_le(uint8_t *p, uint64_t v, int n)
{
	for (int i = 0; i < n; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static int batch_mac(const struct peer_aead *a, uint64_t seq,
		     const struct kvpool_geom *g, const void *hdr, size_t hdr_n,
		     const struct verbs_mac_page *pages, uint32_t n,
		     uint8_t tag[PEER_AUTH_TAG_BYTES])
{
	crypto_generichash_state st;
	uint8_t key[PEER_AUTH_BYTES], num[8];
	struct verbs_extent ex[EXTENTS_MAX];

	for (uint32_t i = 0; i < n; i++)
		if (verbs_extent_count(g, pages[i].tokens) == 0 ||
		    verbs_extent_count(g, pages[i].tokens) > EXTENTS_MAX)
			return VERBS_MAC_E_PAGE;
	crypto_generichash(key, sizeof(key), (const uint8_t *)LBL_KEY,
			   sizeof(LBL_KEY), a->key, PEER_AUTH_BYTES);
	crypto_generichash_init(&st, key, sizeof(key), PEER_AUTH_TAG_BYTES);
	sodium_memzero(key, sizeof(key));
	crypto_generichash_update(&st, (const uint8_t *)LBL_MAC, sizeof(LBL_MAC));
	put_le(num, seq, 8);
	crypto_generichash_update(&st, num, 8);
	put_le(num, hdr_n, 8);
	crypto_generichash_update(&st, num, 8);
	crypto_generichash_update(&st, hdr, hdr_n);
	for (uint32_t i = 0; i < n; i++) {
		int k = verbs_extent_page(g, pages[i].tokens, ex, EXTENTS_MAX);

		put_le(num, pages[i].tokens, 4);
		crypto_generichash_update(&st, num, 4);
		for (int j = 0; j < k; j++)
			crypto_generichash_update(&st, pages[i].base + ex[j].offset,
						  ex[j].length);
	}
	crypto_generichash_final(&st, tag, PEER_AUTH_TAG_BYTES);
	sodium_memzero(&st, sizeof(st));
	return 0;
}

int verbs_mac_seal(struct peer_aead *a, const struct kvpool_geom *g,
		   const void *hdr, size_t hdr_n,
		   const struct verbs_mac_page *pages, uint32_t n,
		   uint8_t tag[PEER_AUTH_TAG_BYTES])
{
	int r = batch_mac(a, a->seq, g, hdr, hdr_n, pages, n, tag);

	if (r == 0)
		a->seq++;
	return r;
}

int verbs_mac_open(struct peer_aead *a, const struct kvpool_geom *g,
		   const void *hdr, size_t hdr_n,
		   const struct verbs_mac_page *pages, uint32_t n,
		   const uint8_t tag[PEER_AUTH_TAG_BYTES])
{
	uint8_t want[PEER_AUTH_TAG_BYTES];
	int r = batch_mac(a, a->seq, g, hdr, hdr_n, pages, n, want);

	if (r)
		return r;
	r = crypto_verify_16(want, tag) == 0 ? 0 : VERBS_MAC_E_AUTH;
	sodium_memzero(want, sizeof(want));
	if (r == 0)
		a->seq++;
	return r;
}
