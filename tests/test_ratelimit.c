/* test_ratelimit.c - the log lines' token bucket (conf/ratelimit.h) and
 * KVLOG_RL: a burst passes, a flood does not, refill is one line per
 * period whatever the flood, every dropped line is counted and reported
 * exactly once (before the next line let through, or at a flush), and
 * nothing wraps at the ends of the u64 clock. The simulated flood is
 * checked against a reference count computed independently.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "conf/log.h"
#include "conf/ratelimit.h"

#define MS 1000000ull

START_TEST(test_burst_then_refused)
{
	struct kvd_ratelimit rl;
	uint64_t rep = 99;
	uint64_t t0 = 5000 * MS;

	kvd_ratelimit_init(&rl, "t", 8, 500);
	for (int i = 0; i < 8; i++) {
		ck_assert(kvd_ratelimit_take(&rl, t0, &rep));
		ck_assert_uint_eq(rep, 0);
	}
	for (int i = 0; i < 100; i++)
		ck_assert(!kvd_ratelimit_take(&rl, t0, &rep));
	ck_assert_uint_eq(rl.suppressed, 100);
	ck_assert_uint_eq(rl.dropped, 100);
	/* half a period later: still nothing */
	ck_assert(!kvd_ratelimit_take(&rl, t0 + 499 * MS, &rep));
	/* one period: one line, carrying the 101 held back */
	ck_assert(kvd_ratelimit_take(&rl, t0 + 500 * MS, &rep));
	ck_assert_uint_eq(rep, 101);
	ck_assert_uint_eq(rl.suppressed, 0);
	ck_assert(!kvd_ratelimit_take(&rl, t0 + 500 * MS, &rep));
	ck_assert_uint_eq(rep, 0);
	/* a long rest refills the whole burst, not more */
	for (int i = 0; i < 8; i++)
		ck_assert(kvd_ratelimit_take(&rl, t0 + 3600000 * MS, &rep));
	ck_assert(!kvd_ratelimit_take(&rl, t0 + 3600000 * MS, &rep));
}
END_TEST

/* A flood of 50 attempts per ms for 20 s: the lines let through are the
 * burst plus one per elapsed period, and every attempt is either let
 * through or reported once. */
START_TEST(test_flood_bounded_and_counted)
{
	struct kvd_ratelimit rl;
	uint64_t t0 = 1000 * MS, passed = 0, reported = 0, attempts = 0;
	const uint32_t burst = 32, period_ms = 500;

	kvd_ratelimit_init(&rl, "flood", burst, period_ms);
	for (uint64_t ms = 0; ms < 20000; ms++)
		for (int k = 0; k < 50; k++) {
			uint64_t rep;

			attempts++;
			if (kvd_ratelimit_take(&rl, t0 + ms * MS, &rep))
				passed++;
			reported += rep;
		}
	/* reference: the burst at t0, then one at each period after the
	 * first (500 ms, 1000 ms, ... 19500 ms) */
	ck_assert_uint_eq(passed, burst + 20000 / period_ms - 1);
	ck_assert_uint_eq(passed + reported + rl.suppressed, attempts);
	ck_assert_uint_eq(rl.dropped, attempts - passed);
}
END_TEST

START_TEST(test_flush)
{
	struct kvd_ratelimit rl;
	uint64_t rep, t0 = 77 * MS;

	kvd_ratelimit_init(&rl, "f", 2, 1000);
	ck_assert_uint_eq(kvd_ratelimit_flush(&rl, t0), 0);   /* nothing held */
	ck_assert(kvd_ratelimit_take(&rl, t0, &rep));
	ck_assert(kvd_ratelimit_take(&rl, t0, &rep));
	for (int i = 0; i < 5; i++)
		ck_assert(!kvd_ratelimit_take(&rl, t0, &rep));
	/* still flooded: the summary waits */
	ck_assert_uint_eq(kvd_ratelimit_flush(&rl, t0 + 10 * MS), 0);
	ck_assert_uint_eq(rl.suppressed, 5);
	/* room again: said once, without taking the token */
	ck_assert_uint_eq(kvd_ratelimit_flush(&rl, t0 + 1000 * MS), 5);
	ck_assert_uint_eq(kvd_ratelimit_flush(&rl, t0 + 1000 * MS), 0);
	ck_assert(kvd_ratelimit_take(&rl, t0 + 1000 * MS, &rep));
	ck_assert_uint_eq(rep, 0);
}
END_TEST

/* The ends of the clock and of the parameters: nothing wraps. */
START_TEST(test_saturation)
{
	struct kvd_ratelimit rl;
	uint64_t rep, top = UINT64_MAX - 5;

	kvd_ratelimit_init(&rl, "sat", UINT32_MAX, UINT32_MAX);
	for (int i = 0; i < 1000; i++)
		ck_assert(kvd_ratelimit_take(&rl, top, &rep));
	ck_assert_uint_eq(rl.tat_ns, UINT64_MAX);
	/* a zero burst is one line at a time, a zero period never limits */
	kvd_ratelimit_init(&rl, "one", 0, 1000);
	ck_assert(kvd_ratelimit_take(&rl, 0, &rep));
	ck_assert(!kvd_ratelimit_take(&rl, 0, &rep));
	kvd_ratelimit_init(&rl, "free", 1, 0);
	for (int i = 0; i < 1000; i++)
		ck_assert(kvd_ratelimit_take(&rl, top, &rep));
	/* a clock going backwards does not reopen the bucket */
	kvd_ratelimit_init(&rl, "back", 1, 1000);
	ck_assert(kvd_ratelimit_take(&rl, 10000 * MS, &rep));
	ck_assert(!kvd_ratelimit_take(&rl, 0, &rep));
}
END_TEST

static char *capture(FILE *f, size_t *len)
{
	long n;
	char *text;

	fflush(f);
	n = lseek(fileno(f), 0, SEEK_END);
	ck_assert_int_ge(n, 0);
	text = malloc((size_t)n + 1);
	ck_assert_ptr_nonnull(text);
	ck_assert_int_eq(pread(fileno(f), text, (size_t)n, 0), n);
	text[n] = '\0';
	*len = (size_t)n;
	return text;
}

static size_t count(const char *text, const char *needle)
{
	size_t n = 0;

	for (const char *p = text; (p = strstr(p, needle)) != NULL; p++)
		n++;
	return n;
}

/* KVLOG_RL through a real log: a flood of 1000 hostile lines writes the
 * burst, then one summary with the exact count; filtered lines take no
 * token. */
START_TEST(test_kvlog_rl)
{
	struct kvlog lg;
	struct kvd_ratelimit rl;
	FILE *f = tmpfile();
	char *text;
	size_t len;

	ck_assert_ptr_nonnull(f);
	kvlog_init(&lg, KVLOG_WARN, fileno(f), "n");
	kvd_ratelimit_init(&rl, "peer_protocol", 4, 3600000);   /* 1 h */
	for (int i = 0; i < 50; i++)   /* below the level: no token */
		KVLOG_RL_INFO(&lg, &rl, "noise", "i=%d", i);
	for (int i = 0; i < 1000; i++)
		KVLOG_RL_WARN(&lg, &rl, "peer_protocol", "msg=%s i=%d",
			      KVLOG_Q("unexpected\n event=kv_capacity"), i);
	kvlog_ratelimit_flush(&lg, KVLOG_WARN, &rl);   /* still closed */
	text = capture(f, &len);
	ck_assert_uint_eq(count(text, "event=peer_protocol "), 4);
	ck_assert_uint_eq(count(text, "event=noise"), 0);
	ck_assert_uint_eq(count(text, "event=log_suppressed"), 0);
	ck_assert_uint_eq(count(text, "\n"), 4);
	free(text);
	/* an hour later (the bucket's clock moved back by the test) */
	rl.tat_ns = 0;
	kvlog_ratelimit_flush(&lg, KVLOG_WARN, &rl);
	kvlog_ratelimit_flush(&lg, KVLOG_WARN, &rl);
	text = capture(f, &len);
	ck_assert_uint_eq(count(text, "event=log_suppressed kind=peer_protocol suppressed=996\n"), 1);
	ck_assert_uint_eq(count(text, "event=log_suppressed"), 1);
	free(text);
	/* flooded again, then a line let through says the count first */
	for (int i = 0; i < 10; i++)
		KVLOG_RL_WARN(&lg, &rl, "peer_protocol", "i=%d", i);
	rl.tat_ns = 0;
	KVLOG_RL_WARN(&lg, &rl, "peer_protocol", "i=last");
	text = capture(f, &len);
	ck_assert_uint_eq(count(text, "event=log_suppressed kind=peer_protocol suppressed=6\n"), 1);
	ck_assert_ptr_nonnull(strstr(text, "suppressed=6\n"));
	ck_assert(strstr(text, "suppressed=6\n") < strstr(text, "i=last"));
	ck_assert_uint_eq(count(text, "event=peer_protocol "), 4 + 4 + 1);
	free(text);
	fclose(f);
}
END_TEST

static Suite *ratelimit_suite(void)
{
	Suite *s = suite_create("ratelimit");
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, test_burst_then_refused);
	tcase_add_test(tc, test_flood_bounded_and_counted);
	tcase_add_test(tc, test_flush);
	tcase_add_test(tc, test_saturation);
	tcase_add_test(tc, test_kvlog_rl);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(ratelimit_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
