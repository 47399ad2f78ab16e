/* test_sha256.c - FIPS 180 vectors, split feeding, and whole files. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "conf/sha256.h"

static void hex_of(const void *p, size_t n, char hex[SHA256_HEX_SIZE])
{
	uint8_t d[SHA256_DIGEST_SIZE];

	sha256_buf(p, n, d);
	sha256_hex(d, hex);
}

START_TEST(test_vectors)
{
	char hex[SHA256_HEX_SIZE];

	hex_of("abc", 3, hex);
	ck_assert_str_eq(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
	hex_of("", 0, hex);
	ck_assert_str_eq(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
	const char *m448 = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
	ck_assert_uint_eq(strlen(m448) * 8, 448);
	hex_of(m448, strlen(m448), hex);
	ck_assert_str_eq(hex, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
	const char *m896 = "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu";
	hex_of(m896, strlen(m896), hex);
	ck_assert_str_eq(hex, "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
}
END_TEST

START_TEST(test_million_a)
{
	char hex[SHA256_HEX_SIZE];
	uint8_t d[SHA256_DIGEST_SIZE];
	struct sha256 c;
	char a[1000];

	memset(a, 'a', sizeof(a));
	sha256_init(&c);
	for (int i = 0; i < 1000; i++)
		sha256_update(&c, a, sizeof(a));
	sha256_final(&c, d);
	sha256_hex(d, hex);
	ck_assert_str_eq(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}
END_TEST

/* Any split of the input gives the digest of the whole, including the
 * lengths around the 55/56/64-byte padding boundaries. */
START_TEST(test_splits)
{
	uint8_t msg[300], whole[SHA256_DIGEST_SIZE], part[SHA256_DIGEST_SIZE];
	uint64_t s = 88172645463325252ull;

	for (size_t i = 0; i < sizeof(msg); i++) {
		s ^= s << 13; s ^= s >> 7; s ^= s << 17;
		msg[i] = (uint8_t)s;
	}
	for (size_t len = 0; len <= sizeof(msg); len++) {
		sha256_buf(msg, len, whole);
		for (size_t cut = 0; cut <= len; cut += 1 + len / 7) {
			struct sha256 c;
			sha256_init(&c);
			sha256_update(&c, msg, cut);
			for (size_t i = cut; i < len; i++)
				sha256_update(&c, msg + i, 1);
			sha256_final(&c, part);
			ck_assert_mem_eq(whole, part, sizeof(whole));
		}
	}
	/* Different inputs differ (the digest depends on every byte). */
	sha256_buf(msg, 100, whole);
	msg[50] ^= 1;
	sha256_buf(msg, 100, part);
	ck_assert(memcmp(whole, part, sizeof(whole)) != 0);
}
END_TEST

/* The x86 SHA-extension blocks against the scalar reference, bit for bit:
 * random states and messages, 1 to 40 blocks at a time; and the million
 * 'a' through sha256_update in one call (the path that uses them). */
START_TEST(test_x86_blocks)
{
	uint8_t msg[64 * 40];
	uint64_t s = 0x9e3779b97f4a7c15ull;
	char hex[SHA256_HEX_SIZE];
	uint8_t d[SHA256_DIGEST_SIZE];
	char *a;

	if (!sha256__have_x86_sha()) {
		fprintf(stderr, "test_x86_blocks: this CPU has no SHA extensions; scalar only\n");
		return;
	}
	for (int rep = 0; rep < 200; rep++) {
		uint32_t h1[8], h2[8];
		size_t n = 1 + (size_t)rep % 40;

		for (size_t i = 0; i < sizeof(msg); i++) {
			s ^= s << 13; s ^= s >> 7; s ^= s << 17;
			msg[i] = (uint8_t)s;
		}
		for (int i = 0; i < 8; i++) {
			s ^= s << 13; s ^= s >> 7; s ^= s << 17;
			h1[i] = h2[i] = (uint32_t)s;
		}
		sha256__blocks_scalar(h1, msg, n);
		sha256__blocks_x86(h2, msg, n);
		ck_assert_mem_eq(h1, h2, sizeof(h1));
	}
	a = malloc(1000000);
	ck_assert_ptr_nonnull(a);
	memset(a, 'a', 1000000);
	sha256_buf(a, 1000000, d);
	sha256_hex(d, hex);
	ck_assert_str_eq(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
	free(a);
}
END_TEST

START_TEST(test_file)
{
	char path[] = "/tmp/kvd-sha-XXXXXX", hex[SHA256_HEX_SIZE];
	int fd = mkstemp(path);
	size_t n = 3 << 20; /* spans several 1 MiB reads */
	char *a = malloc(n);

	ck_assert_int_ge(fd, 0);
	memset(a, 'a', n);
	ck_assert_int_eq(write(fd, a, 1000000), 1000000);
	close(fd);
	ck_assert_int_eq(sha256_file(path, hex), 0);
	ck_assert_str_eq(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
	fd = open(path, O_WRONLY | O_TRUNC);
	ck_assert_int_eq(write(fd, a, n), (ssize_t)n);
	close(fd);
	char want[SHA256_HEX_SIZE];
	hex_of(a, n, want);
	ck_assert_int_eq(sha256_file(path, hex), 0);
	ck_assert_str_eq(hex, want);
	unlink(path);
	free(a);
	ck_assert_int_eq(sha256_file("/nonexistent/file", hex), -ENOENT);

	/* The shared model's published digest, when present. */
	const char *sh = getenv("KVD_SHARED");
	char mp[1100];
	snprintf(mp, sizeof(mp), "%s/models/stories260K.gguf", sh ? sh : "../shared");
	if (access(mp, R_OK) == 0) {
		ck_assert_int_eq(sha256_file(mp, hex), 0);
		ck_assert_str_eq(hex, "270cba1bd5109f42d03350f60406024560464db173c0e387d91f0426d3bd256d");
	}
}
END_TEST

int main(void)
{
	Suite *s = suite_create("sha256");
	TCase *tc = tcase_create("core");
	SRunner *sr;
	int failed;

	tcase_add_test(tc, test_vectors);
	tcase_add_test(tc, test_million_a);
	tcase_add_test(tc, test_splits);
	tcase_add_test(tc, test_x86_blocks);
	tcase_add_test(tc, test_file);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
