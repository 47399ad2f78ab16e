/* test_xfer.c - KV batches: build/verify round trip, the bound, every
 * header rejection, checksum catching any single flipped byte, and the
 * incremental reader fed byte by byte, in random chunks, truncated and
 * with random garbage (never a crash, never more than the bound buffered).
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "conf/util.h"
#include "net/xfer.h"

#define PB 256u           /* page bytes used by these tests */

/* Build a batch of n pages; page i is filled with bytes (seed + i + j). */
static size_t build(struct xfer_batch *b, uint32_t n, uint8_t seed, bool ck)
{
	xfer_batch_reset(b, 0xabcdef, 3);
	for (uint32_t i = 0; i < n; i++) {
		struct xfer_entry e = { .dst_page = 10 + i, .index = i,
					.dst_gen = 100 + i, .tokens = 16 };
		uint8_t *slot;

		ck_assert_int_eq(xfer_batch_add(b, &e, &slot), 0);
		for (uint32_t j = 0; j < PB; j++)
			slot[j] = (uint8_t)(seed + i + j);
	}
	return xfer_batch_seal(b, ck);
}

START_TEST(test_roundtrip)
{
	struct xfer_batch b;
	struct xfer_hdr h;
	struct xfer_entry e;
	uint64_t bound = xfer_batch_bytes(4, PB);
	size_t len;

	ck_assert_int_eq(xfer_batch_init(&b, PB, bound), 0);
	ck_assert_uint_eq(b.n_max, 4);
	len = build(&b, 3, 7, true);
	ck_assert_uint_eq(len, xfer_batch_bytes(3, PB));
	ck_assert_uint_le(len, bound);
	ck_assert_int_eq(xfer_batch_verify(b.buf, len, PB, bound, true, &h), 0);
	ck_assert_uint_eq(h.request_id, 0xabcdef);
	ck_assert_uint_eq(h.seq, 3);
	ck_assert_uint_eq(h.n_entries, 3);
	xfer_batch_entry(b.buf, 2, &e);
	ck_assert_uint_eq(e.dst_page, 12);
	ck_assert_uint_eq(e.index, 2);
	ck_assert_uint_eq(e.dst_gen, 102);
	ck_assert_uint_eq(e.tokens, 16);
	ck_assert_uint_eq(xfer_batch_page(b.buf, &h, 2)[5], (uint8_t)(7 + 2 + 5));
	/* the fifth page does not fit */
	build(&b, 4, 1, true);
	{
		uint8_t *slot;
		struct xfer_entry x = { 0 };

		ck_assert_int_eq(xfer_batch_add(&b, &x, &slot), XFER_E_FULL);
	}
	/* checksum off: verifies only when not required */
	len = build(&b, 2, 1, false);
	ck_assert_int_eq(xfer_batch_verify(b.buf, len, PB, bound, false, &h), 0);
	ck_assert_int_eq(xfer_batch_verify(b.buf, len, PB, bound, true, &h),
			 XFER_E_NOCHECKSUM);
	xfer_batch_deinit(&b);
	xfer_batch_deinit(&b);
	ck_assert_int_eq(xfer_batch_init(&b, PB, PB), XFER_E_BOUND);
}
END_TEST

START_TEST(test_every_byte_flip)
{
	struct xfer_batch b;
	struct xfer_hdr h;
	uint64_t bound = xfer_batch_bytes(2, PB);
	size_t len;

	ck_assert_int_eq(xfer_batch_init(&b, PB, bound), 0);
	len = build(&b, 2, 3, true);
	for (size_t i = 0; i < len; i++) {
		b.buf[i] ^= 0x10;
		ck_assert_int_ne(xfer_batch_verify(b.buf, len, PB, bound, true, &h), 0);
		b.buf[i] ^= 0x10;
	}
	ck_assert_int_eq(xfer_batch_verify(b.buf, len, PB, bound, true, &h), 0);
	xfer_batch_deinit(&b);
}
END_TEST

START_TEST(test_header_rejects)
{
	struct xfer_batch b;
	struct xfer_hdr h;
	uint64_t bound = xfer_batch_bytes(2, PB);
	size_t len;

	ck_assert_int_eq(xfer_batch_init(&b, PB, bound), 0);
	len = build(&b, 2, 3, true);
	/* a receiver with a smaller bound refuses before reading the body */
	ck_assert_int_eq(xfer_hdr_parse(b.buf, PB, xfer_batch_bytes(1, PB), &h),
			 XFER_E_BOUND);
	ck_assert_int_eq(xfer_hdr_parse(b.buf, PB + 64, bound, &h), XFER_E_GEOMETRY);
	b.buf[0] ^= 1;
	ck_assert_int_eq(xfer_hdr_parse(b.buf, PB, bound, &h), XFER_E_MAGIC);
	b.buf[0] ^= 1;
	b.buf[4] = 9;
	ck_assert_int_eq(xfer_hdr_parse(b.buf, PB, bound, &h), XFER_E_VERSION);
	b.buf[4] = 1;
	ck_assert_int_eq(xfer_batch_verify(b.buf, len - 1, PB, bound, true, &h),
			 XFER_E_GEOMETRY);
	ck_assert_int_eq(xfer_batch_verify(b.buf, 10, PB, bound, true, &h),
			 XFER_E_MAGIC);
	xfer_batch_deinit(&b);
}
END_TEST

/* Stream three batches in random chunk sizes; corrupt the middle one. */
START_TEST(test_reader_stream)
{
	struct xfer_batch b;
	struct xfer_reader r;
	uint64_t bound = xfer_batch_bytes(3, PB);
	uint8_t *stream;
	size_t lens[3], total = 0, off = 0;
	int good = 0, bad = 0;
	unsigned seed = (unsigned)time(NULL);

	fprintf(stderr, "test_reader_stream seed=%u\n", seed);
	srand(seed);
	ck_assert_int_eq(xfer_batch_init(&b, PB, bound), 0);
	stream = malloc(3 * bound);
	for (int k = 0; k < 3; k++) {
		lens[k] = build(&b, (uint32_t)(k + 1), (uint8_t)k, true);
		memcpy(stream + total, b.buf, lens[k]);
		if (k == 1)
			stream[total + lens[k] - 3] ^= 0x80;  /* payload byte */
		total += lens[k];
	}
	xfer_reader_init(&r, PB, bound, true);
	while (off < total) {
		size_t chunk = KVD_MIN((size_t)(1 + rand() % 700), total - off);
		size_t used;

		ck_assert_int_eq(xfer_reader_feed(&r, stream + off, chunk, &used), 0);
		off += used;
		for (;;) {
			const uint8_t *batch;
			struct xfer_hdr h;
			int ret = xfer_reader_next(&r, &h, &batch);

			if (ret == XFER_E_AGAIN)
				break;
			if (ret == 0) {
				good++;
				ck_assert_uint_le(xfer_batch_bytes(h.n_entries, PB), bound);
			} else {
				ck_assert_int_eq(ret, XFER_E_CHECKSUM);
				ck_assert_uint_eq(h.n_entries, 2);
				bad++;
			}
		}
		ck_assert_uint_le(r.cap, bound);
	}
	ck_assert_int_eq(good, 2);
	ck_assert_int_eq(bad, 1);
	ck_assert_uint_eq(xfer_reader_pending(&r), 0);
	xfer_reader_deinit(&r);

	/* truncated stream: the partial batch stays pending */
	xfer_reader_init(&r, PB, bound, true);
	{
		size_t used;
		const uint8_t *batch;
		struct xfer_hdr h;

		ck_assert_int_eq(xfer_reader_feed(&r, stream, lens[0] - 1, &used), 0);
		ck_assert_int_eq(xfer_reader_next(&r, &h, &batch), XFER_E_AGAIN);
		ck_assert_uint_eq(xfer_reader_pending(&r), lens[0] - 1);
	}
	xfer_reader_deinit(&r);
	free(stream);
	xfer_batch_deinit(&b);
}
END_TEST

START_TEST(test_reader_garbage)
{
	uint64_t bound = xfer_batch_bytes(3, PB);
	unsigned seed = (unsigned)time(NULL);
	uint8_t buf[4096];
	int broken = 0;

	fprintf(stderr, "test_reader_garbage seed=%u\n", seed);
	srand(seed);
	for (int it = 0; it < 2000; it++) {
		struct xfer_reader r;
		size_t n = 1 + (size_t)rand() % sizeof(buf), off = 0, used;
		int ret = 0;

		for (size_t i = 0; i < n; i++)
			buf[i] = (uint8_t)rand();
		if (it % 2) {   /* a valid-looking header with random sizes */
			uint32_t magic = XFER_MAGIC;

			memcpy(buf, &magic, 4);
			buf[4] = 1;
			buf[5] = buf[6] = buf[7] = 0;
		}
		xfer_reader_init(&r, PB, bound, true);
		while (off < n && ret == 0) {
			const uint8_t *batch;
			struct xfer_hdr h;

			ret = xfer_reader_feed(&r, buf + off, n - off, &used);
			off += used;
			if (ret == 0) {
				int x = xfer_reader_next(&r, &h, &batch);

				if (x != 0 && x != XFER_E_AGAIN &&
				    x != XFER_E_CHECKSUM && x != XFER_E_NOCHECKSUM)
					ret = x;
			}
			ck_assert_uint_le(r.cap, bound);
		}
		broken += ret != 0;
		xfer_reader_deinit(&r);
	}
	ck_assert_int_gt(broken, 0);
}
END_TEST

static Suite *xfer_suite(void)
{
	Suite *s = suite_create("xfer");
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, test_roundtrip);
	tcase_add_test(tc, test_every_byte_flip);
	tcase_add_test(tc, test_header_rejects);
	tcase_add_test(tc, test_reader_stream);
	tcase_add_test(tc, test_reader_garbage);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(xfer_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
