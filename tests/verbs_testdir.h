/* verbs_testdir.h - socket directories for the emulated RDMA device tests.
 *
 * Each test gets its own directory (the emulated contexts bind their
 * sockets there) inside one base directory per test case. The checked
 * teardown asserts the test's directory is empty (every context unlinked
 * its socket); the unchecked teardown, in the parent process, removes the
 * base with whatever a failed test left behind, so failures leak nothing
 * into /tmp.
 */
#pragma once

#include <check.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static char verbs_test_base[64];
static char dir[96];

static int verbs_test_rm(const char *path, const struct stat *st, int flag,
			 struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	return remove(path);
}

static void verbs_test_base_make(void)
{
	snprintf(verbs_test_base, sizeof(verbs_test_base), "/tmp/kvd-verbs-XXXXXX");
	if (!mkdtemp(verbs_test_base)) {
		perror("mkdtemp");
		abort();
	}
}

static void verbs_test_base_remove(void)
{
	nftw(verbs_test_base, verbs_test_rm, 8, FTW_DEPTH | FTW_PHYS);
}

static void verbs_test_dir_make(void)
{
	static unsigned n;

	snprintf(dir, sizeof(dir), "%s/t%u-%d", verbs_test_base, n++, (int)getpid());
	ck_assert_int_eq(mkdir(dir, 0700), 0);
}

static void verbs_test_dir_remove(void)
{
	ck_assert_int_eq(rmdir(dir), 0);   /* every socket was unlinked */
}

static inline void verbs_test_fixtures(TCase *tc, void (*setup)(void),
				       void (*teardown)(void))
{
	tcase_add_unchecked_fixture(tc, verbs_test_base_make, verbs_test_base_remove);
	tcase_add_checked_fixture(tc, setup, teardown);
}
