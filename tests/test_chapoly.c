/* test_chapoly.c - ChaCha20-Poly1305 for links (net/chapoly.h): both
 * implementations (libcrypto, libsodium) give RFC 8439's vector and each
 * other's tags, the streamed MAC equals the one-shot AEAD however the
 * input is cut, and a flipped bit of the data, the additional data, the
 * tag, the nonce or the key is refused, leaving no unverified plaintext. */
#include <check.h>
#include <sodium.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "net/chapoly.h"
#include "net/peer_auth.h"

/* RFC 8439 s. 2.8.2 */
static const uint8_t rfc_nonce[12] = { 0x07, 0, 0, 0, 0x40, 0x41, 0x42, 0x43,
				       0x44, 0x45, 0x46, 0x47 };
static const uint8_t rfc_ad[12] = { 0x50, 0x51, 0x52, 0x53, 0xc0, 0xc1,
				    0xc2, 0xc3, 0xc4, 0xc5, 0xc6, 0xc7 };
static const char rfc_text[] =
	"Ladies and Gentlemen of the class of '99: If I could offer you only "
	"one tip for the future, sunscreen would be it.";
static const uint8_t rfc_ct[114] = {
	0xd3, 0x1a, 0x8d, 0x34, 0x64, 0x8e, 0x60, 0xdb, 0x7b, 0x86, 0xaf, 0xbc,
	0x53, 0xef, 0x7e, 0xc2, 0xa4, 0xad, 0xed, 0x51, 0x29, 0x6e, 0x08, 0xfe,
	0xa9, 0xe2, 0xb5, 0xa7, 0x36, 0xee, 0x62, 0xd6, 0x3d, 0xbe, 0xa4, 0x5e,
	0x8c, 0xa9, 0x67, 0x12, 0x82, 0xfa, 0xfb, 0x69, 0xda, 0x92, 0x72, 0x8b,
	0x1a, 0x71, 0xde, 0x0a, 0x9e, 0x06, 0x0b, 0x29, 0x05, 0xd6, 0xa5, 0xb6,
	0x7e, 0xcd, 0x3b, 0x36, 0x92, 0xdd, 0xbd, 0x7f, 0x2d, 0x77, 0x8b, 0x8c,
	0x98, 0x03, 0xae, 0xe3, 0x28, 0x09, 0x1b, 0x58, 0xfa, 0xb3, 0x24, 0xe4,
	0xfa, 0xd6, 0x75, 0x94, 0x55, 0x85, 0x80, 0x8b, 0x48, 0x31, 0xd7, 0xbc,
	0x3f, 0xf4, 0xde, 0xf0, 0x8e, 0x4b, 0x7a, 0x9d, 0xe5, 0x76, 0xd2, 0x65,
	0x86, 0xce, 0xc6, 0x4b, 0x61, 0x16 };
static const uint8_t rfc_tag[16] = { 0x1a, 0xe1, 0x0b, 0x59, 0x4f, 0x09, 0xe2, 0x6a,
				     0x7e, 0x90, 0x2e, 0xcb, 0xd0, 0x60, 0x06, 0x91 };

static uint8_t rfc_key[32];

static const enum chapoly_impl impls[2] = { CHAPOLY_LIBCRYPTO, CHAPOLY_LIBSODIUM };

static void setup(void)
{
	ck_assert_int_eq(peer_auth_global_init(), 0);
	for (int i = 0; i < 32; i++)
		rfc_key[i] = (uint8_t)(0x80 + i);
}

static void teardown(void)
{
	chapoly_global_init();   /* back to the default implementation */
}

/* The development machine's libcrypto has the cipher: the fast path is
 * what runs (a build where it silently fell back would pass the rest). */
START_TEST(test_libcrypto_in_use)
{
	ck_assert_str_eq(chapoly_impl_name(chapoly_impl()), "libcrypto");
	ck_assert_int_eq(chapoly_impl_set(CHAPOLY_LIBSODIUM), CHAPOLY_LIBCRYPTO);
	ck_assert_int_eq(chapoly_impl(), CHAPOLY_LIBSODIUM);
}
END_TEST

START_TEST(test_rfc8439_vector)
{
	uint8_t buf[114], tag[16];

	chapoly_impl_set(impls[_i]);
	ck_assert_uint_eq(sizeof(rfc_text) - 1, sizeof(buf));
	memcpy(buf, rfc_text, sizeof(buf));
	chapoly_seal(rfc_key, rfc_nonce, rfc_ad, sizeof(rfc_ad), buf, sizeof(buf),
		     true, tag);
	ck_assert_mem_eq(buf, rfc_ct, sizeof(buf));
	ck_assert_mem_eq(tag, rfc_tag, 16);
	ck_assert_int_eq(chapoly_open(rfc_key, rfc_nonce, rfc_ad, sizeof(rfc_ad), buf,
				      sizeof(buf), true, tag), 0);
	ck_assert_mem_eq(buf, rfc_text, sizeof(buf));
}
END_TEST

/* A flipped bit anywhere - text, additional data, tag, nonce, key - is
 * refused; encrypted, the text is zeros after a refusal. */
START_TEST(test_rfc8439_flips)
{
	const bool enc = _i >= 2;
	uint8_t buf[114], ad[12], tag[16], nonce[12], key[32];

	chapoly_impl_set(impls[_i % 2]);
	for (int where = 0; where < 5; where++)
		for (int bit = 0; bit < 8 * 12; bit += 7) {
			memcpy(buf, enc ? (const void *)rfc_ct : (const void *)rfc_text,
			       sizeof(buf));
			memcpy(ad, rfc_ad, 12);
			memcpy(nonce, rfc_nonce, 12);
			memcpy(key, rfc_key, 32);
			if (enc)
				memcpy(tag, rfc_tag, 16);
			else
				chapoly_seal(key, nonce, ad, 12, buf, sizeof(buf), false, tag);
			uint8_t *p = where == 0 ? buf : where == 1 ? ad : where == 2 ? tag
				     : where == 3 ? nonce : key;
			p[(bit / 8) % (where == 2 ? 16 : 12)] ^= (uint8_t)(1u << (bit % 8));
			ck_assert_int_eq(chapoly_open(key, nonce, ad, 12, buf, sizeof(buf), enc,
						      tag), CHAPOLY_E_AUTH);
			if (enc) {
				for (size_t i = 0; i < sizeof(buf); i++)
					ck_assert_uint_eq(buf[i], 0);
			} else if (where != 0) {
				ck_assert_mem_eq(buf, rfc_text, sizeof(buf));
			}
		}
}
END_TEST

/* The streamed MAC, cut anywhere, is libsodium's one-shot AEAD with all
 * of it as additional data; both implementations, lengths around the
 * 16-byte pad and past OpenSSL's buffering. */
START_TEST(test_stream_equals_oneshot)
{
	static const size_t lens[] = { 0, 1, 15, 16, 17, 63, 64, 1000, 65537, 300001 };
	uint8_t *data = malloc(300001), want[16], got[16], nonce[12];

	ck_assert_ptr_nonnull(data);
	randombytes_buf(data, 300001);
	chapoly_impl_set(impls[_i]);
	for (size_t l = 0; l < sizeof(lens) / sizeof(lens[0]); l++) {
		struct chapoly_mac m;
		size_t n = lens[l], off = 0;

		randombytes_buf(nonce, sizeof(nonce));
		crypto_aead_chacha20poly1305_ietf_encrypt_detached(
			data, want, NULL, NULL, 0, data, n, NULL, nonce, rfc_key);
		chapoly_mac_init(&m, rfc_key, nonce);
		while (off < n) {
			size_t k = 1 + (size_t)randombytes_uniform(5000);

			k = k > n - off ? n - off : k;
			chapoly_mac_update(&m, data + off, k);
			off += k;
		}
		chapoly_mac_final(&m, got);
		ck_assert_mem_eq(got, want, 16);
		chapoly_mac_init(&m, rfc_key, nonce);
		chapoly_mac_update(&m, data, n);
		ck_assert_int_eq(chapoly_mac_verify(&m, want), 0);
		chapoly_mac_init(&m, rfc_key, nonce);
		chapoly_mac_update(&m, data, n);
		want[l % 16] ^= 0x80;
		ck_assert_int_eq(chapoly_mac_verify(&m, want), CHAPOLY_E_AUTH);
	}
	free(data);
}
END_TEST

/* What one implementation seals, the other opens (peers may differ). */
START_TEST(test_cross_implementation)
{
	const bool enc = _i == 1;
	uint8_t buf[4099], copy[4099], ad[64], tag[16], nonce[12] = { 1 };

	randombytes_buf(buf, sizeof(buf));
	randombytes_buf(ad, sizeof(ad));
	memcpy(copy, buf, sizeof(buf));
	for (int from = 0; from < 2; from++) {
		chapoly_impl_set(impls[from]);
		chapoly_seal(rfc_key, nonce, ad, sizeof(ad), buf, sizeof(buf), enc, tag);
		ck_assert_int_eq(memcmp(buf, copy, sizeof(buf)) != 0, enc);
		chapoly_impl_set(impls[1 - from]);
		ck_assert_int_eq(chapoly_open(rfc_key, nonce, ad, sizeof(ad), buf,
					      sizeof(buf), enc, tag), 0);
		ck_assert_mem_eq(buf, copy, sizeof(buf));
	}
}
END_TEST

Suite *chapoly_suite(void);
Suite *chapoly_suite(void)
{
	Suite *s = suite_create("chapoly");
	TCase *tc = tcase_create("core");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_libcrypto_in_use);
	tcase_add_loop_test(tc, test_rfc8439_vector, 0, 2);
	tcase_add_loop_test(tc, test_rfc8439_flips, 0, 4);
	tcase_add_loop_test(tc, test_stream_equals_oneshot, 0, 2);
	tcase_add_loop_test(tc, test_cross_implementation, 0, 2);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(chapoly_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
