/* test_verbs_target.c - the writing side's check of a peer's scope runs
 * (net/verbs/verbs_target.h): each way a run can aim a write outside the
 * request is refused with its code, and a good scope maps every page to
 * its run's address. */
#include <check.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "net/verbs/verbs_target.h"

#define PB 4096u

static const uint32_t dst[] = { 7, 3, 4, 5, 20, 21 };
#define N_DST (uint32_t)(sizeof(dst) / sizeof(dst[0]))

static int check(const struct proto_peer_run *runs, uint32_t n,
		 const uint32_t *d, uint32_t nd, char *why)
{
	why[0] = '\0';
	return verbs_target_check(runs, n, d, nd, PB, why, 200);
}

START_TEST(test_good_scope)
{
	const struct proto_peer_run runs[] = {
		{ .first_page = 20, .n_pages = 2, .addr = 0x100000, .rkey = 9 },
		{ .first_page = 3, .n_pages = 3, .addr = 0x200000, .rkey = 8 },
		{ .first_page = 7, .n_pages = 1, .addr = 0x900000, .rkey = 7 },
	};
	uint64_t addr;
	uint32_t rkey;
	char why[200];

	ck_assert_int_eq(check(runs, 3, dst, N_DST, why), 0);
	ck_assert_int_eq(verbs_target_find(runs, 3, 4, PB, &addr, &rkey), 0);
	ck_assert_uint_eq(addr, 0x200000 + PB);
	ck_assert_uint_eq(rkey, 8);
	ck_assert_int_eq(verbs_target_find(runs, 3, 21, PB, &addr, &rkey), 0);
	ck_assert_uint_eq(addr, 0x100000 + PB);
	ck_assert_uint_eq(rkey, 9);
	ck_assert_int_eq(verbs_target_find(runs, 3, 7, PB, &addr, &rkey), 0);
	ck_assert_uint_eq(addr, 0x900000);
	ck_assert_int_eq(verbs_target_find(runs, 3, 6, PB, &addr, &rkey), -ENOENT);
	ck_assert_int_eq(verbs_target_find(runs, 3, 22, PB, &addr, &rkey), -ENOENT);
}
END_TEST

static const struct bad {
	const char *what;
	struct proto_peer_run runs[3];
	uint32_t n;
	int want;
	const char *needle;
} bads[] = {
	{ "no runs", { { 0 } }, 0, VERBS_TARGET_E_EMPTY, "no runs" },
	{ "empty run", { { 3, 3, 0x1000, 1 }, { 7, 0, 0x9000, 1 }, { 20, 2, 0x20000, 1 } }, 3, VERBS_TARGET_E_EMPTY, "run 1 has no pages" },
	{ "a page beyond the request", { { 3, 3, 0x1000, 1 }, { 7, 1, 0x9000, 1 }, { 20, 3, 0x20000, 1 } }, 3, VERBS_TARGET_E_FOREIGN, "run 2" },
	{ "a gap page inside a run", { { 3, 5, 0x1000, 1 }, { 20, 2, 0x20000, 1 } }, 2, VERBS_TARGET_E_FOREIGN, "not the request's" },
	{ "overlapping runs", { { 3, 3, 0x1000, 1 }, { 5, 1, 0x9000, 1 }, { 20, 2, 0x20000, 1 } }, 3, VERBS_TARGET_E_OVERLAP, "runs 0 and 1" },
	{ "a page left out", { { 3, 3, 0x1000, 1 }, { 20, 2, 0x20000, 1 } }, 2, VERBS_TARGET_E_UNCOVERED, "cover 5 of the request's 6" },
	{ "page numbers wrap", { { 0xffffffffu, 2, 0x1000, 1 } }, 1, VERBS_TARGET_E_WRAP, "wraps" },
	{ "address wraps", { { 3, 3, UINT64_MAX - PB, 1 } }, 1, VERBS_TARGET_E_WRAP, "wraps" },
};

START_TEST(test_bad_scope)
{
	const struct bad *b = &bads[_i];
	char why[200];
	int r = check(b->runs, b->n, dst, N_DST, why);

	ck_assert_msg(r == b->want, "%s: %d, want %d (%s)", b->what, r, b->want, why);
	ck_assert_msg(strstr(why, b->needle) != NULL, "%s: '%s' lacks '%s'",
		      b->what, why, b->needle);
}
END_TEST

/* A request that names a page twice cannot be covered by a run that
 * counts the duplicate in place of a foreign page. */
START_TEST(test_duplicate_destination)
{
	const uint32_t d[] = { 5, 5 };
	const struct proto_peer_run run = { 5, 2, 0x1000, 1 };
	char why[200];

	ck_assert_int_eq(check(&run, 1, d, 2, why), VERBS_TARGET_E_FOREIGN);
	ck_assert(strstr(why, "page 5 twice") != NULL);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("verbs_target");
	TCase *tc = tcase_create("core");
	SRunner *sr;
	int failed;

	tcase_add_test(tc, test_good_scope);
	tcase_add_loop_test(tc, test_bad_scope, 0, (int)(sizeof(bads) / sizeof(bads[0])));
	tcase_add_test(tc, test_duplicate_destination);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
