/* test_fairq.c - daemon/node/fairq.h: per-tenant queues, weighted fair
 * admission.
 *
 * The promises checked: an idle node admits at once; a request waits
 * when the node has no slot and leaves in FIFO order within its tenant;
 * a tenant that floods cannot keep another tenant's waiting request
 * behind its own (the next free slot goes to the least served tenant);
 * with shares 3:1 and both tenants flooding, admissions split 3:1; a
 * tenant's max_active, max_tokens and max_queued hold; a head that needs
 * more pages than are free blocks (no overtaking); an item that leaves
 * the queue or ends frees its tenant's record once the tenant is idle.
 */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>

#include "daemon/node/fairq.h"

#define PAGES 1000000u

static const struct fairq_limits L1 = { .share = 1, .max_queued = 1000 };

static struct fairq_item *pump_one(struct fairq *q)
{
	return fairq_next(q, PAGES);
}

START_TEST(test_idle_admits_at_once)
{
	struct fairq q;
	struct fairq_item a;
	struct fairq_tenant *t;

	fairq_init(&q, 2);
	t = fairq_tenant(&q, "a", &L1);
	ck_assert_ptr_nonnull(t);
	ck_assert_int_eq(fairq_offer(&q, t, &a, 10, 1), 0);
	ck_assert_ptr_eq(pump_one(&q), &a);
	ck_assert(a.active);
	ck_assert_ptr_null(pump_one(&q));
	fairq_done(&q, &a);
	ck_assert_uint_eq(q.n_tenants, 0);
	ck_assert_uint_eq(q.active, 0);
	fairq_deinit(&q);
}
END_TEST

/* A fills every slot and queues more; B's one request gets the first
 * slot that frees, ahead of A's older waiting requests. */
START_TEST(test_flood_does_not_starve)
{
	struct fairq q;
	struct fairq_item a[20], b;
	struct fairq_tenant *ta, *tb;
	int n = 0;

	fairq_init(&q, 4);
	for (int i = 0; i < 20; i++) {
		ta = fairq_tenant(&q, "a", &L1);
		ck_assert_int_eq(fairq_offer(&q, ta, &a[i], 10, 1), 0);
	}
	while (pump_one(&q))
		n++;
	ck_assert_int_eq(n, 4);
	for (int i = 0; i < 4; i++)
		ck_assert(a[i].active);   /* FIFO within the tenant */
	tb = fairq_tenant(&q, "b", &L1);
	ck_assert_int_eq(fairq_offer(&q, tb, &b, 10, 1), 0);
	ck_assert(b.waiting);
	ck_assert_ptr_null(pump_one(&q));   /* no slot */
	fairq_done(&q, &a[0]);
	ck_assert_ptr_eq(pump_one(&q), &b);
	fairq_done(&q, &a[1]);
	ck_assert_ptr_eq(pump_one(&q), &a[4]);
	for (int i = 0; i < 20; i++)
		fairq_done(&q, &a[i]);
	fairq_done(&q, &b);
	ck_assert_uint_eq(q.n_tenants, 0);
	ck_assert_uint_eq(q.queued, 0);
	fairq_deinit(&q);
}
END_TEST

/* Shares 3:1, both tenants always waiting: of the admissions while both
 * wait, A gets three quarters. The oldest admitted request ends first. */
START_TEST(test_weighted_shares)
{
	enum { N = 800, SLOTS = 8 };
	struct fairq q;
	struct fairq_item *it = calloc(2 * N, sizeof(*it));
	struct fairq_item *run[2 * N];
	struct fairq_limits la = { .share = 3, .max_queued = N };
	struct fairq_limits lb = { .share = 1, .max_queued = N };
	unsigned got[2] = { 0, 0 };
	size_t head = 0, tail = 0;

	ck_assert_ptr_nonnull(it);
	fairq_init(&q, SLOTS);
	for (int i = 0; i < N; i++) {
		ck_assert_int_eq(fairq_offer(&q, fairq_tenant(&q, "a", &la), &it[i], 1, 1), 0);
		ck_assert_int_eq(fairq_offer(&q, fairq_tenant(&q, "b", &lb), &it[N + i], 1, 1), 0);
	}
	while (got[0] < N / 2 && got[1] < N / 2) {
		struct fairq_item *x;

		while ((x = pump_one(&q)) != NULL) {
			got[x >= &it[N]]++;
			run[tail++] = x;
		}
		fairq_done(&q, run[head++]);
	}
	/* 3:1 within one slot's rounding */
	ck_assert_uint_ge(got[0] * 4, (got[0] + got[1]) * 3 - 16);
	ck_assert_uint_le(got[0] * 4, (got[0] + got[1]) * 3 + 16);
	fairq_deinit(&q);
	free(it);
}
END_TEST

START_TEST(test_tenant_limits)
{
	struct fairq q;
	struct fairq_item a[5], big, c[3];
	struct fairq_limits la = { .share = 1, .max_active = 2, .max_queued = 10 };
	struct fairq_limits lc = { .share = 1, .max_tokens = 100, .max_queued = 1 };
	struct fairq_tenant *t;
	int n = 0;

	fairq_init(&q, 8);
	for (int i = 0; i < 5; i++)
		ck_assert_int_eq(fairq_offer(&q, fairq_tenant(&q, "a", &la), &a[i], 1, 1), 0);
	while (pump_one(&q))
		n++;
	ck_assert_int_eq(n, 2);   /* max_active */
	t = fairq_tenant(&q, "c", &lc);
	ck_assert_int_eq(fairq_offer(&q, t, &big, 101, 1), FAIRQ_E_TOO_BIG);
	t = fairq_tenant(&q, "c", &lc);
	ck_assert_int_eq(fairq_offer(&q, t, &c[0], 60, 1), 0);
	ck_assert_ptr_eq(pump_one(&q), &c[0]);
	ck_assert_int_eq(fairq_offer(&q, t, &c[1], 60, 1), 0);   /* waits: tokens */
	ck_assert_ptr_null(pump_one(&q));
	/* max_queued 1: one more is taken, cannot run, so it is over */
	ck_assert_int_eq(fairq_offer(&q, t, &c[2], 1, 1), 0);
	ck_assert_ptr_null(pump_one(&q));
	ck_assert(fairq_overfull(t));
	ck_assert_int_eq(fairq_offer(&q, t, &big, 1, 1), FAIRQ_E_FULL);   /* two past */
	fairq_done(&q, &c[2]);
	ck_assert(!fairq_overfull(t));
	fairq_done(&q, &c[0]);
	ck_assert_ptr_eq(pump_one(&q), &c[1]);
	fairq_done(&q, &c[1]);
	for (int i = 0; i < 5; i++)
		fairq_done(&q, &a[i]);
	ck_assert_uint_eq(q.n_tenants, 0);
	fairq_deinit(&q);
}
END_TEST

/* A head that needs more pages than are free blocks everyone: a later,
 * smaller request does not overtake it. With max_queued 0 a request is
 * admitted at once or refused. */
START_TEST(test_pages_and_no_queue)
{
	struct fairq q;
	struct fairq_item a, b, c, d;
	struct fairq_limits l0 = { .share = 1, .max_queued = 0 };
	struct fairq_tenant *t;

	fairq_init(&q, 8);
	t = fairq_tenant(&q, "a", &L1);
	ck_assert_int_eq(fairq_offer(&q, t, &a, 1, 50), 0);
	ck_assert_ptr_null(fairq_next(&q, 10));
	t = fairq_tenant(&q, "b", &L1);
	ck_assert_int_eq(fairq_offer(&q, t, &b, 1, 5), 0);
	ck_assert_ptr_null(fairq_next(&q, 10));
	ck_assert_ptr_eq(fairq_next(&q, 60), &a);
	ck_assert_ptr_eq(fairq_next(&q, 10), &b);
	t = fairq_tenant(&q, "z", &l0);
	ck_assert_int_eq(fairq_offer(&q, t, &c, 1, 1), 0);   /* idle: admitted */
	ck_assert_ptr_eq(fairq_next(&q, 10), &c);
	t = fairq_tenant(&q, "z", &l0);
	ck_assert_int_eq(fairq_offer(&q, t, &d, 1, 100), 0);
	ck_assert_ptr_null(fairq_next(&q, 10));   /* cannot run now: over */
	ck_assert(fairq_overfull(t));
	fairq_done(&q, &d);
	fairq_done(&q, &a);
	fairq_done(&q, &b);
	fairq_done(&q, &c);
	fairq_done(&q, &d);   /* left already: nothing */
	ck_assert_uint_eq(q.n_tenants, 0);
	ck_assert_uint_eq(q.active, 0);
	fairq_deinit(&q);
}
END_TEST

/* A tenant whose queue is 0 (no waiting) still runs at once when the
 * node has a slot, even while another tenant's head waits on its own
 * limit. */
START_TEST(test_no_queue_beside_blocked)
{
	struct fairq q;
	struct fairq_item x[3], y;
	struct fairq_limits lx = { .share = 1, .max_active = 1, .max_queued = 5 };
	struct fairq_limits ly = { .share = 1, .max_queued = 0 };
	struct fairq_tenant *t;

	fairq_init(&q, 4);
	for (int i = 0; i < 3; i++)
		ck_assert_int_eq(fairq_offer(&q, fairq_tenant(&q, "x", &lx), &x[i], 1, 1), 0);
	ck_assert_ptr_eq(pump_one(&q), &x[0]);
	ck_assert_ptr_null(pump_one(&q));          /* x's head waits on max_active */
	t = fairq_tenant(&q, "y", &ly);
	ck_assert_int_eq(fairq_offer(&q, t, &y, 1, 1), 0);
	ck_assert_ptr_eq(pump_one(&q), &y);        /* a slot: runs at once */
	ck_assert(!fairq_overfull(t));
	fairq_done(&q, &y);
	for (int i = 0; i < 3; i++)
		fairq_done(&q, &x[i]);
	ck_assert_uint_eq(q.n_tenants, 0);
	fairq_deinit(&q);
}
END_TEST

/* A held head (the gate's prefix hold-back) makes its tenant ineligible
 * without blocking another tenant, and goes once released. */
START_TEST(test_held_head_skipped)
{
	struct fairq q;
	struct fairq_item a[2], b;

	fairq_init(&q, 4);
	for (int i = 0; i < 2; i++)
		ck_assert_int_eq(fairq_offer(&q, fairq_tenant(&q, "a", &L1), &a[i], 1, 1), 0);
	ck_assert_int_eq(fairq_offer(&q, fairq_tenant(&q, "b", &L1), &b, 1, 1), 0);
	ck_assert(!a[0].held);
	a[0].held = true;
	ck_assert_ptr_eq(pump_one(&q), &b);        /* a's head held: b goes */
	ck_assert_ptr_null(pump_one(&q));          /* and nothing overtakes a's head */
	ck_assert(a[1].waiting);
	a[0].held = false;
	ck_assert_ptr_eq(pump_one(&q), &a[0]);
	ck_assert_ptr_eq(pump_one(&q), &a[1]);
	fairq_done(&q, &b);
	for (int i = 0; i < 2; i++)
		fairq_done(&q, &a[i]);
	ck_assert_uint_eq(q.n_tenants, 0);
	fairq_deinit(&q);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("fairq");
	TCase *tc = tcase_create("core");
	SRunner *sr;
	int failed;

	tcase_add_test(tc, test_idle_admits_at_once);
	tcase_add_test(tc, test_flood_does_not_starve);
	tcase_add_test(tc, test_weighted_shares);
	tcase_add_test(tc, test_tenant_limits);
	tcase_add_test(tc, test_pages_and_no_queue);
	tcase_add_test(tc, test_no_queue_beside_blocked);
	tcase_add_test(tc, test_held_head_skipped);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
