/* test_peerdns.c - the pure parts of peers by name (daemon/node/peerdns.h):
 * an answer read into addresses (each once, bounded, the walk bounded)
 * and the change from the addresses a name's links dial to a new answer.
 * The resolver, the links and the drain run against real processes and a
 * real DNS server in tests/integration/peer_dns.sh. */
#include <arpa/inet.h>
#include <check.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/node/peerdns.h"

/* A getaddrinfo-like list built by hand: n entries, kept in arrays the
 * test owns. */
struct fake_answer {
	struct addrinfo ai[2048];
	struct sockaddr_storage sa[2048];
	unsigned n;
};

static void fa_add(struct fake_answer *f, int family, const char *ip)
{
	struct addrinfo *a = &f->ai[f->n];
	struct sockaddr_storage *ss = &f->sa[f->n];

	ck_assert_uint_lt(f->n, 2048);
	memset(a, 0, sizeof(*a));
	memset(ss, 0, sizeof(*ss));
	a->ai_family = family;
	a->ai_socktype = SOCK_STREAM;
	a->ai_addr = (struct sockaddr *)ss;
	ss->ss_family = (sa_family_t)family;
	if (family == AF_INET) {
		ck_assert_int_eq(inet_pton(AF_INET, ip, &((struct sockaddr_in *)ss)->sin_addr), 1);
		a->ai_addrlen = sizeof(struct sockaddr_in);
	} else if (family == AF_INET6) {
		ck_assert_int_eq(inet_pton(AF_INET6, ip, &((struct sockaddr_in6 *)ss)->sin6_addr), 1);
		a->ai_addrlen = sizeof(struct sockaddr_in6);
	}
	if (f->n)
		f->ai[f->n - 1].ai_next = a;
	f->n++;
}

START_TEST(test_answer_dedup_and_form)
{
	static struct fake_answer f;
	peerdns_addr out[PEERDNS_ANSWER_MAX];
	uint32_t extra = 99, n;

	memset(&f, 0, sizeof(f));
	fa_add(&f, AF_INET, "127.0.0.2");
	fa_add(&f, AF_INET, "127.0.0.2");      /* one per socket kind: once */
	fa_add(&f, AF_INET6, "::1");
	fa_add(&f, AF_UNIX, "");               /* another family: skipped */
	fa_add(&f, AF_INET, "10.1.2.3");
	fa_add(&f, AF_INET6, "::1");
	n = peerdns_answer(&f.ai[0], "7001", out, PEERDNS_ANSWER_MAX, &extra);
	ck_assert_uint_eq(n, 3);
	ck_assert_uint_eq(extra, 0);
	ck_assert_str_eq(out[0], "127.0.0.2:7001");
	ck_assert_str_eq(out[1], "[::1]:7001");
	ck_assert_str_eq(out[2], "10.1.2.3:7001");
	/* nothing at all */
	ck_assert_uint_eq(peerdns_answer(NULL, "1", out, PEERDNS_ANSWER_MAX, &extra), 0);
	ck_assert_uint_eq(extra, 0);
}
END_TEST

/* More distinct addresses than a node dials: the first kept, the rest
 * counted; the longest IPv6 text fits. */
START_TEST(test_answer_bounded)
{
	static struct fake_answer f;
	peerdns_addr out[PEERDNS_ANSWER_MAX];
	char ip[32];
	uint32_t extra = 0, n;

	memset(&f, 0, sizeof(f));
	for (unsigned i = 0; i < PEERDNS_ANSWER_MAX + 5; i++) {
		snprintf(ip, sizeof(ip), "127.0.1.%u", i);
		fa_add(&f, AF_INET, ip);
		fa_add(&f, AF_INET, ip);
	}
	n = peerdns_answer(&f.ai[0], "65535", out, PEERDNS_ANSWER_MAX, &extra);
	ck_assert_uint_eq(n, PEERDNS_ANSWER_MAX);
	ck_assert_uint_eq(extra, 5);
	ck_assert_str_eq(out[PEERDNS_ANSWER_MAX - 1], "127.0.1.15:65535");
	/* a smaller bound is the caller's; the count of those left out
	 * saturates (19 distinct, each twice: "at least 16") */
	ck_assert_uint_eq(peerdns_answer(&f.ai[0], "1", out, 2, &extra), 2);
	ck_assert_uint_eq(extra, PEERDNS_ANSWER_MAX);

	memset(&f, 0, sizeof(f));
	fa_add(&f, AF_INET6, "ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255");
	n = peerdns_answer(&f.ai[0], "65535", out, PEERDNS_ANSWER_MAX, &extra);
	ck_assert_uint_eq(n, 1);
	ck_assert_str_eq(out[0], "[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff]:65535");
}
END_TEST

/* The walk stops after PEERDNS_WALK_MAX entries, whatever follows. */
START_TEST(test_answer_walk_bounded)
{
	static struct fake_answer f;
	peerdns_addr out[PEERDNS_ANSWER_MAX];
	uint32_t extra = 0;

	memset(&f, 0, sizeof(f));
	for (unsigned i = 0; i < PEERDNS_WALK_MAX; i++)
		fa_add(&f, AF_INET, "127.0.0.9");
	fa_add(&f, AF_INET, "127.0.0.10");      /* entry WALK_MAX + 1 */
	ck_assert_uint_eq(peerdns_answer(&f.ai[0], "1", out, PEERDNS_ANSWER_MAX, &extra), 1);
	ck_assert_str_eq(out[0], "127.0.0.9:1");
}
END_TEST

START_TEST(test_diff)
{
	const peerdns_addr have[] = { "127.0.0.2:1", "127.0.0.3:1", "127.0.0.4:1" };
	const peerdns_addr want[] = { "127.0.0.4:1", "127.0.0.5:1", "127.0.0.2:1" };
	bool stays[3], fresh[3];

	ck_assert_uint_eq(peerdns_diff(have, 3, want, 3, stays, fresh), 2);
	ck_assert(stays[0] && !stays[1] && stays[2]);
	ck_assert(!fresh[0] && fresh[1] && !fresh[2]);
	/* the same set in another order: nothing changes */
	ck_assert_uint_eq(peerdns_diff(have, 3, (const peerdns_addr[]){ "127.0.0.4:1",
			  "127.0.0.2:1", "127.0.0.3:1" }, 3, stays, fresh), 0);
	ck_assert(stays[0] && stays[1] && stays[2]);
	/* from nothing: all fresh; to nothing: all drained */
	ck_assert_uint_eq(peerdns_diff(have, 0, want, 3, stays, fresh), 3);
	ck_assert(fresh[0] && fresh[1] && fresh[2]);
	ck_assert_uint_eq(peerdns_diff(have, 3, want, 0, stays, fresh), 3);
	ck_assert(!stays[0] && !stays[1] && !stays[2]);
	/* a port is part of the address */
	ck_assert_uint_eq(peerdns_diff(have, 1, (const peerdns_addr[]){ "127.0.0.2:2" }, 1,
				       stays, fresh), 2);
	ck_assert(!stays[0] && fresh[0]);
}
END_TEST

static Suite *peerdns_suite(void)
{
	Suite *s = suite_create("peerdns");
	TCase *tc = tcase_create("pure");

	tcase_add_test(tc, test_answer_dedup_and_form);
	tcase_add_test(tc, test_answer_bounded);
	tcase_add_test(tc, test_answer_walk_bounded);
	tcase_add_test(tc, test_diff);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(peerdns_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
