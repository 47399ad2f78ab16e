/* test_verbs_mac.c - the MAC of an RDMA batch (net/verbs/verbs_mac.h): what
 * decode's pool holds verifies only if every covered byte - header, tags,
 * filled positions, token counts - is what prefill sealed, in order and
 * once; the stale tail is outside it (decode zeroes it anyway). */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "net/chapoly.h"
#include "net/verbs/verbs_extent.h"
#include "net/verbs/verbs_mac.h"

static const struct kvpool_geom G = { .page_tokens = 4, .n_layer = 2,
				      .kv_dim = 4, .dtype = KV_DTYPE_F16 };
#define TB (4u * 2u)          /* bytes per position in a block */
#define BLOCK (4u * TB)       /* one K or V block */

static uint8_t src[2][512], dst[2][512];
static uint8_t hdr[40];
static struct peer_aead tx, rx;

static void setup(void)
{
	ck_assert_uint_ge(sizeof(src[0]), kvpool_page_bytes(&G));
	ck_assert_int_eq(peer_auth_global_init(), 0);
	for (size_t i = 0; i < sizeof(src); i++)
		((uint8_t *)src)[i] = (uint8_t)(i * 37 + (i >> 9) * 101 + 11);
	for (size_t i = 0; i < sizeof(hdr); i++)
		hdr[i] = (uint8_t)i;
	memcpy(dst, src, sizeof(src));
	memset(&tx, 0, sizeof(tx));
	memset(tx.key, 0x5a, sizeof(tx.key));
	rx = tx;
}

/* seal the source pages (page 0 full, page 1 with 2 positions), then
 * open what decode holds */
static int roundtrip(const uint32_t tokens_rx[2])
{
	const struct verbs_mac_page sp[2] = { { src[0], 4 }, { src[1], 2 } };
	const struct verbs_mac_page dp[2] = { { dst[0], tokens_rx[0] },
					      { dst[1], tokens_rx[1] } };
	uint8_t tag[PEER_AUTH_TAG_BYTES];

	ck_assert_int_eq(verbs_mac_seal(&tx, &G, hdr, sizeof(hdr), sp, 2, tag), 0);
	return verbs_mac_open(&rx, &G, hdr, sizeof(hdr), dp, 2, tag);
}

static const uint32_t same[2] = { 4, 2 };

START_TEST(test_verifies_and_counts)
{
	ck_assert_int_eq(roundtrip(same), 0);
	ck_assert_uint_eq(tx.seq, 1);
	ck_assert_uint_eq(rx.seq, 1);
	ck_assert_int_eq(roundtrip(same), 0);
	ck_assert_uint_eq(rx.seq, 2);
}
END_TEST

/* Each covered byte matters: the tag, a filled position of a partial
 * page's later block, a full page's last byte, the header. */
START_TEST(test_covered_bytes)
{
	static const struct { int page; size_t off; } hits[] = {
		{ 0, 0 },                              /* page 0's tag */
		{ 1, 10 },                             /* page 1's tag */
		{ 1, KVTAG_BYTES + 3 * BLOCK + 2 * TB - 1 }, /* last filled byte of V(1) */
		{ 0, KVTAG_BYTES + 4 * BLOCK - 1 },    /* full page's last byte */
		{ -1, 5 },                             /* the header */
	};

	for (size_t i = 0; i < sizeof(hits) / sizeof(hits[0]); i++) {
		uint8_t tag[PEER_AUTH_TAG_BYTES];
		const struct verbs_mac_page sp[2] = { { src[0], 4 }, { src[1], 2 } };
		const struct verbs_mac_page dp[2] = { { dst[0], 4 }, { dst[1], 2 } };
		uint8_t *b = hits[i].page < 0 ? hdr : dst[hits[i].page];

		setup();
		ck_assert_int_eq(verbs_mac_seal(&tx, &G, hdr, sizeof(hdr), sp, 2, tag), 0);
		b[hits[i].off] ^= 0x01;
		ck_assert_msg(verbs_mac_open(&rx, &G, hdr, sizeof(hdr), dp, 2, tag) ==
			      VERBS_MAC_E_AUTH, "hit %zu verified", i);
		ck_assert_uint_eq(rx.seq, 0);
		b[hits[i].off] ^= 0x01;
		ck_assert_int_eq(verbs_mac_open(&rx, &G, hdr, sizeof(hdr), dp, 2, tag), 0);
	}
}
END_TEST

/* The stale tail of a partial page is not covered: a write never carries
 * it (net/verbs/verbs_extent.h), and decode zeroes it. */
START_TEST(test_tail_not_covered)
{
	dst[1][KVTAG_BYTES + 2 * TB] ^= 0xff;            /* K(0) position 2 */
	dst[1][KVTAG_BYTES + 3 * BLOCK + 3 * TB] ^= 0xff; /* V(1) position 3 */
	ck_assert_int_eq(roundtrip(same), 0);
}
END_TEST

START_TEST(test_replay_key_counts)
{
	const struct verbs_mac_page sp[2] = { { src[0], 4 }, { src[1], 2 } };
	const struct verbs_mac_page dp[2] = { { dst[0], 4 }, { dst[1], 2 } };
	const uint32_t more[2] = { 4, 3 }, fewer[2] = { 4, 1 }, zero[2] = { 4, 0 };
	uint8_t tag[PEER_AUTH_TAG_BYTES];

	/* a replayed batch (decode's counter moved on) */
	ck_assert_int_eq(verbs_mac_seal(&tx, &G, hdr, sizeof(hdr), sp, 2, tag), 0);
	ck_assert_int_eq(verbs_mac_open(&rx, &G, hdr, sizeof(hdr), dp, 2, tag), 0);
	ck_assert_int_eq(verbs_mac_open(&rx, &G, hdr, sizeof(hdr), dp, 2, tag),
			 VERBS_MAC_E_AUTH);
	/* another link's key */
	setup();
	rx.key[0] ^= 1;
	ck_assert_int_eq(roundtrip(same), VERBS_MAC_E_AUTH);
	/* decode believing another token count */
	setup();
	ck_assert_int_eq(roundtrip(more), VERBS_MAC_E_AUTH);
	setup();
	ck_assert_int_eq(roundtrip(fewer), VERBS_MAC_E_AUTH);
	/* a count out of range is refused before anything is read */
	setup();
	ck_assert_int_eq(roundtrip(zero), VERBS_MAC_E_PAGE);
	ck_assert_uint_eq(rx.seq, 0);
	/* pages swapped in order */
	setup();
	{
		const struct verbs_mac_page a[2] = { { src[0], 4 }, { src[1], 4 } };
		const struct verbs_mac_page b[2] = { { dst[1], 4 }, { dst[0], 4 } };

		ck_assert_int_eq(verbs_mac_seal(&tx, &G, hdr, sizeof(hdr), a, 2, tag), 0);
		ck_assert_int_eq(verbs_mac_open(&rx, &G, hdr, sizeof(hdr), b, 2, tag),
				 VERBS_MAC_E_AUTH);
	}
}
END_TEST

/* The construction, pinned (net/PROTOCOL.md s. 4): the tag is libsodium's
 * one-shot ChaCha20-Poly1305 (RFC 8439) under key BLAKE2b-256(key = data
 * key, "kvd/3 verbs batch mac key\0") and nonce = 4 zero bytes || le64(seq),
 * over no text and, as additional data, "kvd/3 verbs batch\0" || le64(seq)
 * || le64(header bytes) || header || per page le32(tokens) || its extents;
 * both chapoly implementations give it, for two consecutive batches. */
static size_t ref_stream(uint8_t *out, uint64_t seq, const struct verbs_mac_page *pg,
			 int n)
{
	static const char lbl[] = "kvd/3 verbs batch";
	struct verbs_extent ex[64];
	size_t o = 0;

	memcpy(out, lbl, sizeof(lbl));
	o += sizeof(lbl);
	for (int i = 0; i < 8; i++)
		out[o++] = (uint8_t)(seq >> (8 * i));
	for (int i = 0; i < 8; i++)
		out[o++] = (uint8_t)((uint64_t)sizeof(hdr) >> (8 * i));
	memcpy(out + o, hdr, sizeof(hdr));
	o += sizeof(hdr);
	for (int p = 0; p < n; p++) {
		int k = verbs_extent_page(&G, pg[p].tokens, ex, 64);

		ck_assert_int_gt(k, 0);
		for (int i = 0; i < 4; i++)
			out[o++] = (uint8_t)(pg[p].tokens >> (8 * i));
		for (int j = 0; j < k; j++) {
			memcpy(out + o, pg[p].base + ex[j].offset, ex[j].length);
			o += ex[j].length;
		}
	}
	return o;
}

START_TEST(test_reference_construction)
{
	static const char lbl_key[] = "kvd/3 verbs batch mac key";
	const struct verbs_mac_page sp[2] = { { src[0], 4 }, { src[1], 2 } };
	uint8_t key[32], nonce[12] = { 0 }, want[16], tag[16], stream[2048];

	chapoly_impl_set(_i ? CHAPOLY_LIBSODIUM : CHAPOLY_LIBCRYPTO);
	crypto_generichash(key, sizeof(key), (const uint8_t *)lbl_key, sizeof(lbl_key),
			   tx.key, sizeof(tx.key));
	for (uint64_t seq = 0; seq < 2; seq++) {
		size_t n = ref_stream(stream, seq, sp, 2);

		nonce[4] = (uint8_t)seq;
		crypto_aead_chacha20poly1305_ietf_encrypt_detached(
			stream, want, NULL, NULL, 0, stream, n, NULL, nonce, key);
		ck_assert_int_eq(verbs_mac_seal(&tx, &G, hdr, sizeof(hdr), sp, 2, tag), 0);
		ck_assert_mem_eq(tag, want, 16);
	}
	chapoly_global_init();
}
END_TEST

int main(void)
{
	Suite *s = suite_create("verbs_mac");
	TCase *tc = tcase_create("core");
	SRunner *sr;
	int failed;

	tcase_add_checked_fixture(tc, setup, NULL);
	tcase_add_test(tc, test_verifies_and_counts);
	tcase_add_test(tc, test_covered_bytes);
	tcase_add_test(tc, test_tail_not_covered);
	tcase_add_test(tc, test_replay_key_counts);
	tcase_add_loop_test(tc, test_reference_construction, 0, 2);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
