/* test_place.c - daemon/place.h: where a decode node's prompt runs.
 *
 * The rule is checked against a reference written differently (exact
 * rational comparison of the two expected waits in long double, on values
 * small enough to be exact), then for the properties the policy promises:
 * off means never, an idle peer always wins, more queued at the peer only
 * ever moves prompts here and more queued here only ever moves them away,
 * no overflow at the largest counts, and a burst of prompts placed one by
 * one (nothing finishing meanwhile) ends split in the ratio the percentage
 * states: local / peer tokens -> percent / 100.
 */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>

#include "daemon/place.h"

/* wait here: (local + n) / (percent / 100); at the peer: peer + n */
static bool ref_local(uint32_t percent, uint64_t local, uint64_t peer, uint32_t n)
{
	long double here, there;

	if (percent == 0 || percent > 100)
		return false;
	here = (long double)(local + n) / ((long double)percent / 100.0L);
	there = (long double)(peer + n);
	return here < there;
}

START_TEST(test_off_and_idle)
{
	for (uint64_t l = 0; l < 4096; l += 64)
		for (uint64_t p = 0; p < 4096; p += 64) {
			ck_assert(!serve_place_local(0, l, p, 128));
			ck_assert(!serve_place_local(101, l, p, 128));
		}
	/* an idle peer (nothing of ours queued there) always wins */
	for (uint32_t pc = 1; pc <= 100; pc++)
		for (uint32_t n = 1; n < 5000; n += 97)
			ck_assert_msg(!serve_place_local(pc, 0, 0, n), "pc=%u n=%u", pc, n);
	/* one prompt queued at the peer: at 100 percent the second one is
	 * computed here (its wait, n, is shorter than 2n) */
	ck_assert(serve_place_local(100, 0, 128, 128));
	ck_assert(!serve_place_local(50, 0, 128, 128));   /* 2n vs 2n: not shorter */
	ck_assert(serve_place_local(50, 0, 129, 128));
}
END_TEST

START_TEST(test_reference)
{
	uint32_t seed = 12345;

	for (int i = 0; i < 200000; i++) {
		uint32_t pc, n;
		uint64_t l, p;

		seed = seed * 1103515245u + 12345u;
		pc = (seed >> 8) % 102;            /* includes 0 and 101 */
		seed = seed * 1103515245u + 12345u;
		n = 1 + (seed >> 8) % 4096;
		seed = seed * 1103515245u + 12345u;
		l = (seed >> 4) % 70000;
		seed = seed * 1103515245u + 12345u;
		p = (seed >> 4) % 70000;
		ck_assert_msg(serve_place_local(pc, l, p, n) == ref_local(pc, l, p, n),
			      "pc=%u l=%llu p=%llu n=%u", pc, (unsigned long long)l,
			      (unsigned long long)p, n);
	}
}
END_TEST

START_TEST(test_monotonic)
{
	for (uint32_t pc = 10; pc <= 100; pc += 15)
		for (uint64_t l = 0; l < 2048; l += 32)
			for (uint64_t p = 0; p < 4096; p += 32) {
				bool here = serve_place_local(pc, l, p, 100);

				/* more at the peer: never moves a prompt away */
				if (here)
					ck_assert(serve_place_local(pc, l, p + 32, 100));
				/* more here: never moves a prompt here */
				if (!here)
					ck_assert(!serve_place_local(pc, l + 32, p, 100));
			}
}
END_TEST

START_TEST(test_no_overflow)
{
	uint64_t big = (uint64_t)1 << 40;   /* beyond any pool */

	ck_assert(!serve_place_local(100, big, 0, 4096));
	ck_assert(serve_place_local(100, 0, big, 4096));
	ck_assert(!serve_place_local(100, big, big - 1, UINT32_MAX));
	ck_assert(serve_place_local(100, big - 1, big, UINT32_MAX));
}
END_TEST

/* A burst placed one by one: the split converges to percent : 100. */
START_TEST(test_burst_split)
{
	static const uint32_t pcs[] = { 25, 50, 75, 100 };

	for (size_t k = 0; k < sizeof(pcs) / sizeof(pcs[0]); k++) {
		uint64_t local = 0, peer = 0;
		uint32_t n = 128, n_local = 0, total = 400;

		for (uint32_t i = 0; i < total; i++) {
			if (serve_place_local(pcs[k], local, peer, n)) {
				local += n;
				n_local++;
			} else {
				peer += n;
			}
		}
		/* local / peer within one prompt of percent / 100 */
		ck_assert_msg(local * 100 <= (uint64_t)pcs[k] * (peer + n) &&
			      (local + n) * 100 >= (uint64_t)pcs[k] * peer,
			      "percent %u: %llu tokens here, %llu at the peer", pcs[k],
			      (unsigned long long)local, (unsigned long long)peer);
		ck_assert_uint_gt(n_local, 0);
		ck_assert_uint_lt(n_local, total);
	}
}
END_TEST

int main(void)
{
	Suite *s = suite_create("place");
	TCase *tc = tcase_create("core");
	SRunner *sr;
	int failed;

	tcase_add_test(tc, test_off_and_idle);
	tcase_add_test(tc, test_reference);
	tcase_add_test(tc, test_monotonic);
	tcase_add_test(tc, test_no_overflow);
	tcase_add_test(tc, test_burst_split);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
