/* test_ops.c - daemon operations without a socket: the drain state
 * machine, resize accounting under load, abort through the failure path,
 * with a real daemon (generated model, host pool) and its loop.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "conf/util.h"
#include "daemon/node/ops.h"
#include "daemon/node/request.h"
#include "gpu/model/gguf_gen.h"
#include "kvd_build.h"

static char tmpdir[64];
static char model[128];
static struct kvd_daemon d;
static struct kvd_ops o;
static bool ops_closed;

static void setup(void)
{
	struct gguf_llama_params p = GGUF_LLAMA_PARAMS_DEFAULT;
	struct kvd_config cfg;
	struct kvd_config_error err;
	char ini[512];

	snprintf(tmpdir, sizeof(tmpdir), "/tmp/kvd-ops.XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(tmpdir));
	snprintf(model, sizeof(model), "%s/m.gguf", tmpdir);
	ck_assert_int_eq(gguf_make_llama(model, &p), 0);
	/* 64 pages of 16 tokens; context 256 needs 16 pages */
	snprintf(ini, sizeof(ini),
		 "[node]\nname = t\nrole = standalone\n[model]\npath = %s\n"
		 "context_length = 256\n[kv]\npage_tokens = 16\n"
		 "pool_tokens = 1024\n[admin]\nsocket = none\n[log]\nlevel = error\n",
		 model);
	ck_assert_int_eq(kvd_config_load_string(&cfg, "test.ini", ini, &err), 0);
	ck_assert_int_eq(kvd_daemon_init(&d, &cfg), 0);
	ck_assert_int_eq(kvd_ops_init(&o, &d), 0);
	kvd_daemon_ready(&d);
	ops_closed = false;
}

static void ops_done(struct kvd_ops *x)
{
	(void)x;
	ops_closed = true;
}

static void teardown(void)
{
	kvd_ops_close(&o, ops_done);
	kvd_daemon_stop(&d);
	kvd_daemon_deinit(&d);
	ck_assert(ops_closed);
	unlink(model);
	rmdir(tmpdir);
}

/* Run the loop until cond() or 5 s. */
static void run_until(bool (*cond)(void))
{
	uint64_t end = kvd_now_ns() + 5000000000ull;

	/* NOWAIT: UV_RUN_ONCE would block until the next timer and run it,
	 * running past the state a test wants to look at */
	while (!cond() && kvd_now_ns() < end) {
		uv_run(&d.loop, UV_RUN_NOWAIT);
		if (!cond())
			usleep(500);
	}
	ck_assert_msg(cond(), "condition not reached in 5 s");
}

static bool is_drained(void)
{
	return d.state == KVD_STATE_DRAINED;
}

static bool idle(void)
{
	return d.in_flight == 0 && o.n_synth == 0;
}

static struct kvpool_stats stats(void)
{
	struct kvpool_stats st;

	kvpool_get_stats(d.pool, &st);
	return st;
}

static struct kvd_synth_result load(uint32_t count, uint32_t tokens,
				    uint32_t hold, uint32_t fence)
{
	struct kvd_synth_spec sp = { count, tokens, hold, fence };
	struct kvd_synth_result res;

	ck_assert_int_eq(kvd_ops_synth_start(&o, &sp, &res), 0);
	return res;
}

START_TEST(test_drain)
{
	struct kvd_synth_result r;

	if (!KVD_FAULT_POINTS)
		return;
	/* idle: drained at once; twice is fine; resume */
	ck_assert_int_eq(kvd_ops_drain(&o), 0);
	ck_assert_int_eq(d.state, KVD_STATE_DRAINED);
	ck_assert_int_eq(kvd_ops_drain(&o), 0);
	ck_assert_int_eq(kvd_ops_resume(&o), 0);
	ck_assert_int_eq(d.state, KVD_STATE_READY);
	ck_assert_int_eq(kvd_ops_resume(&o), 0);

	/* under load: nothing new admitted, nothing in flight lost */
	r = load(5, 40, 50, 20);
	ck_assert_uint_eq(r.admitted, 5);
	ck_assert_uint_eq(stats().by_state[KVPAGE_READY], 15);
	ck_assert_int_eq(kvd_ops_drain(&o), 0);
	ck_assert_int_eq(d.state, KVD_STATE_DRAINING);
	r = load(4, 16, 1, 0);
	ck_assert_uint_eq(r.admitted, 0);
	ck_assert_uint_eq(r.rejected_draining, 4);
	ck_assert_uint_eq(d.counters.rejected[KVD_REJECT_DRAINING], 4);
	ck_assert_uint_eq(d.in_flight, 5);
	run_until(is_drained);
	ck_assert_uint_eq(d.counters.admitted, 5);
	ck_assert_uint_eq(d.counters.completed, 5);
	ck_assert_uint_eq(d.counters.failed, 0);
	ck_assert_uint_eq(stats().by_state[KVPAGE_FREE], 64);
	ck_assert_int_eq(kvd_ops_resume(&o), 0);
	ck_assert_uint_eq(load(1, 1, 0, 0).admitted, 1);
	run_until(idle);
}
END_TEST

static struct kvd_resize_result last;
static int resize_calls;

static void resize_cb(void *arg, const struct kvd_resize_result *res)
{
	ck_assert_ptr_eq(arg, &last);
	last = *res;
	resize_calls++;
}

static bool resized(void)
{
	return !o.resizing;
}

START_TEST(test_resize_under_load)
{
	struct kvpool_stats st;

	if (!KVD_FAULT_POINTS)
		return;
	resize_calls = 0;
	/* 8 requests x 4 pages, released at 40 ms, fenced until 80 ms */
	ck_assert_uint_eq(load(8, 64, 40, 80).admitted, 8);
	/* below the requirement: refused, nothing changes */
	ck_assert_int_eq(kvd_ops_resize(&o, 15, false, 1000, resize_cb, &last),
			 KVD_E_CAPACITY);
	ck_assert_uint_eq(stats().pages, 64);
	/* shrink to 20: 32 free pages retire at once, 12 wait */
	ck_assert_int_eq(kvd_ops_resize(&o, 20, false, 5000, resize_cb, &last), 0);
	ck_assert_int_eq(resize_calls, 0);       /* never from within the call */
	ck_assert_int_eq(kvd_ops_resize(&o, 30, false, 5000, resize_cb, &last),
			 KVD_E_BUSY);
	st = stats();
	ck_assert_uint_eq(st.retiring, 12);
	ck_assert_uint_eq(st.by_state[KVPAGE_RETIRED], 32);
	run_until(resized);
	ck_assert_int_eq(resize_calls, 1);
	ck_assert_int_eq(last.code, 0);
	ck_assert_uint_eq(last.pages_before, 64);
	ck_assert_uint_eq(last.pages_after, 20);
	ck_assert_uint_eq(last.retired_now, 32);
	ck_assert_uint_eq(last.retiring_left, 0);
	ck_assert(last.cap.ok);
	ck_assert_uint_eq(d.cap.pool_tokens, 320);
	run_until(idle);
	st = stats();
	ck_assert_uint_eq(st.pages, 20);
	ck_assert_uint_eq(st.by_state[KVPAGE_FREE], 20);
	ck_assert_uint_eq(st.by_state[KVPAGE_RETIRED], 44);
	ck_assert_uint_eq(st.fences, 0);

	/* grow under load: at once, pages in use untouched */
	ck_assert_uint_eq(load(4, 64, 600, 0).admitted, 4);
	ck_assert_int_eq(kvd_ops_resize(&o, 100, false, 1000, resize_cb, &last), 0);
	run_until(resized);
	ck_assert_uint_eq(last.pages_after, 100);
	ck_assert_uint_eq(stats().by_state[KVPAGE_READY], 16);
	run_until(idle);
	ck_assert_uint_eq(stats().by_state[KVPAGE_FREE], 100);

	/* timeout: pages held past the wait retire later */
	ck_assert_uint_eq(load(2, 512, 1000, 0).admitted, 2);  /* 64 pages */
	ck_assert_int_eq(kvd_ops_resize(&o, 16, false, 10, resize_cb, &last), 0);
	run_until(resized);
	ck_assert_int_eq(last.code, KVD_OPS_E_TIMEOUT);
	ck_assert_uint_eq(last.retiring_left, 48);
	ck_assert_uint_eq(d.cap.pages, 16);      /* staying pages only */
	run_until(idle);
	st = stats();
	ck_assert_uint_eq(st.pages, 16);
	ck_assert_uint_eq(st.retiring, 0);
	ck_assert_uint_eq(st.by_state[KVPAGE_FREE], 16);

	/* forced below the requirement: allowed, verdict insufficient */
	ck_assert_int_eq(kvd_ops_resize(&o, 8, true, 10, resize_cb, &last), 0);
	run_until(resized);
	ck_assert(!last.cap.ok);
	ck_assert_int_eq(kvd_ops_resize(&o, 0, true, 10, resize_cb, &last),
			 KVD_OPS_E_RANGE);
	ck_assert_uint_eq(kvd_ops_pages_for_tokens(&o, 17), 2);
	ck_assert_uint_eq(kvd_ops_pages_for_bytes(&o, stats().page_bytes * 3 - 1), 2);
}
END_TEST

START_TEST(test_abort)
{
	struct kvd_synth_result r;

	if (!KVD_FAULT_POINTS)
		return;
	/* fenced for longer than the test: abort must not free fenced pages */
	r = load(3, 32, 60000, 60000);
	ck_assert_uint_eq(r.admitted, 3);
	ck_assert_int_eq(kvd_ops_abort(&o, r.first_id), 0);
	ck_assert_uint_eq(d.counters.failed, 1);
	ck_assert_uint_eq(d.in_flight, 2);
	ck_assert_uint_eq(stats().by_state[KVPAGE_FENCED], 2);   /* deferred */
	ck_assert_uint_eq(stats().by_state[KVPAGE_FREE], 64 - 6);
	ck_assert_int_eq(kvd_ops_abort(&o, r.first_id), KVD_E_NOTFOUND);
	ck_assert_int_eq(kvd_ops_abort(&o, 424242), KVD_E_NOTFOUND);
	/* drain completes when the others are aborted too */
	ck_assert_int_eq(kvd_ops_drain(&o), 0);
	ck_assert_int_eq(kvd_ops_abort(&o, r.first_id + 1), 0);
	ck_assert_int_eq(d.state, KVD_STATE_DRAINING);
	ck_assert_int_eq(kvd_ops_abort(&o, r.last_id), 0);
	ck_assert_int_eq(d.state, KVD_STATE_DRAINED);
	ck_assert_uint_eq(d.counters.failed, 3);
	/* the pages stay fenced; close (teardown) unfences and releases */
}
END_TEST

START_TEST(test_full_and_status)
{
	struct kvd_synth_result r;
	struct kvd_status st;

	if (!KVD_FAULT_POINTS) {
		struct kvd_synth_spec sp = { 1, 1, 1, 0 };

		ck_assert_int_eq(kvd_ops_synth_start(&o, &sp, &r),
				 KVD_OPS_E_UNSUPPORTED);
		return;
	}
	r = load(5, 16 * 20, 50, 0);        /* 20 pages each: 3 fit */
	ck_assert_uint_eq(r.admitted, 3);
	ck_assert_uint_eq(r.rejected_full, 2);
	ck_assert_uint_eq(d.counters.rejected[KVD_REJECT_OVERLOADED], 2);
	kvd_ops_status(&o, &st);
	ck_assert_uint_eq(st.in_flight, 3);
	ck_assert_uint_eq(st.requests, 3);
	ck_assert_uint_eq(st.synthetic, 3);
	ck_assert_uint_eq(st.pool.by_state[KVPAGE_READY], 60);
	ck_assert_int_eq(st.state, KVD_STATE_READY);
	{
		struct kvd_synth_spec bad = { 0, 1, 1, 0 };

		ck_assert_int_eq(kvd_ops_synth_start(&o, &bad, &r), KVD_OPS_E_RANGE);
	}
	run_until(idle);
	ck_assert_str_eq(kvd_ops_strerror(KVD_E_DRAINING), "draining");
	ck_assert_str_eq(kvd_ops_strerror(KVD_OPS_E_TIMEOUT), "timeout");
}
END_TEST

/* The gate only answers: the caller that turns a request away counts the
 * rejection, once, where it sends it. Asking twice, or asking and then
 * admitting, changes no counter. */
START_TEST(test_gate_counts_nothing)
{
	struct kvd_reqtab *t = kvd_daemon_requests(&d);
	struct kvd_counters before = d.counters;

	ck_assert_int_eq(kvd_request_gate(t), 0);
	ck_assert_int_eq(kvd_request_gate(t), 0);
	ck_assert_mem_eq(&d.counters, &before, sizeof(before));
	ck_assert_int_eq(kvd_ops_drain(&o), 0);
	ck_assert_int_eq(d.state, KVD_STATE_DRAINED);
	ck_assert_int_eq(kvd_request_gate(t), KVD_E_DRAINING);
	ck_assert_int_eq(kvd_request_gate(t), KVD_E_DRAINING);
	ck_assert_mem_eq(&d.counters, &before, sizeof(before));
	ck_assert_uint_eq(d.in_flight, 0);
	ck_assert_int_eq(kvd_ops_resume(&o), 0);
	ck_assert_int_eq(kvd_request_gate(t), 0);
}
END_TEST

/* The registry by id, at the size where a lookup table matters: 3,000
 * requests registered, found by id (O(1) through conf/idmap), ended out of
 * order, never found again; abort_all reaches every one still in, through
 * owners that end themselves inside abort (the walk restarts each time). */
struct reg_req {
	struct kvd_request req;
	unsigned aborts;
};

static int reg_abort(struct kvd_request *r, const char *reason)
{
	(void)reason;
	kvd_container_of(r, struct reg_req, req)->aborts++;
	kvd_request_end(kvd_daemon_requests(&d), r, false);
	return 0;
}

static const struct kvd_request_ops reg_ops = { "test", KVD_REQ_SYNTHETIC, reg_abort };

START_TEST(test_registry_by_id)
{
	enum { N = 3000 };
	struct kvd_reqtab *t = kvd_daemon_requests(&d);
	struct reg_req *q = calloc(N, sizeof(*q));
	uint32_t n_in = N;

	ck_assert_ptr_nonnull(q);
	for (int i = 0; i < N; i++)
		kvd_request_register(t, &q[i].req, &reg_ops);
	ck_assert_uint_eq(t->n, N);
	ck_assert_uint_eq(d.in_flight, N);
	for (int i = 0; i < N; i++) {
		ck_assert_ptr_eq(kvd_reqtab_find(t, q[i].req.id), &q[i].req);
		if (i)
			ck_assert_uint_gt(q[i].req.id, q[i - 1].req.id);
	}
	/* end every third, from the middle out */
	for (int i = N / 2; i < N; i += 3, n_in--)
		kvd_request_end(t, &q[i].req, true);
	for (int i = N / 2 - 3; i >= 0; i -= 3, n_in--)
		kvd_request_end(t, &q[i].req, true);
	ck_assert_uint_eq(t->n, n_in);
	for (int i = 0; i < N; i++) {
		bool ended = (i - N / 2) % 3 == 0;

		ck_assert_ptr_eq(kvd_reqtab_find(t, q[i].req.id),
				 ended ? NULL : &q[i].req);
	}
	ck_assert_ptr_null(kvd_reqtab_find(t, 0));
	ck_assert_ptr_null(kvd_reqtab_find(t, t->next_id));
	ck_assert_int_eq(kvd_reqtab_abort(t, q[N / 2].req.id, "x"), KVD_E_NOTFOUND);
	ck_assert_int_eq(kvd_reqtab_abort(t, q[1].req.id, "x"), 0);
	ck_assert_ptr_null(kvd_reqtab_find(t, q[1].req.id));
	n_in--;
	ck_assert_uint_eq(kvd_reqtab_abort_all(t, "drain"), n_in);
	ck_assert_uint_eq(t->n, 0);
	ck_assert_uint_eq(d.in_flight, 0);
	for (int i = 0; i < N; i++) {
		bool ended = (i - N / 2) % 3 == 0;

		ck_assert_uint_eq(q[i].aborts, ended ? 0 : 1);
		ck_assert_ptr_null(kvd_reqtab_find(t, q[i].req.id));
	}
	ck_assert_uint_eq(t->byid.grow_failed, 0);
	free(q);
}
END_TEST

/* Request ids are unique across nodes (request.c): each registry starts
 * at its own random point, in range (bit 63 clear, exact in JSON), and
 * counts up from it. Two registries stand for two nodes. */
START_TEST(test_ids_across_nodes)
{
	struct kvd_daemon d2 = { 0 };
	struct kvd_reqtab t2, *t = kvd_daemon_requests(&d);
	struct reg_req a[2] = { 0 }, b = { 0 };
	uint64_t firsts[64];

	kvd_reqtab_init(&t2, &d2);
	ck_assert_uint_ge(t->next_id, KVD_REQ_ID_MIN);
	ck_assert_uint_lt(t->next_id, KVD_REQ_ID_MAX);
	ck_assert_uint_ge(t2.next_id, KVD_REQ_ID_MIN);
	ck_assert_uint_lt(t2.next_id, KVD_REQ_ID_MAX);
	kvd_request_register(t, &a[0].req, &reg_ops);
	kvd_request_register(t, &a[1].req, &reg_ops);
	kvd_request_register(&t2, &b.req, &reg_ops);
	ck_assert_uint_eq(a[1].req.id, a[0].req.id + 1);
	/* the first request of each node: not 1, not the same */
	ck_assert_uint_ne(a[0].req.id, 1);
	ck_assert_uint_ne(b.req.id, 1);
	ck_assert_uint_ne(a[0].req.id, b.req.id);
	ck_assert_uint_ne(a[1].req.id, b.req.id);
	ck_assert_uint_eq(a[0].req.id >> 63, 0);
	ck_assert_uint_lt(b.req.id, 1ull << 53);
	kvd_request_end(t, &a[0].req, true);
	kvd_request_end(t, &a[1].req, true);
	kvd_request_end(&t2, &b.req, true);
	kvd_reqtab_deinit(&t2);
	/* 64 starts, all different (equal ones: about 64^2 / 2^54) */
	for (int i = 0; i < 64; i++) {
		firsts[i] = kvd_reqtab_first_id();
		ck_assert_uint_ge(firsts[i], KVD_REQ_ID_MIN);
		ck_assert_uint_lt(firsts[i], KVD_REQ_ID_MAX);
		for (int j = 0; j < i; j++)
			ck_assert_uint_ne(firsts[i], firsts[j]);
	}
}
END_TEST

static Suite *ops_suite(void)
{
	Suite *s = suite_create("ops");
	TCase *tc = tcase_create("core");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_drain);
	tcase_add_test(tc, test_resize_under_load);
	tcase_add_test(tc, test_abort);
	tcase_add_test(tc, test_full_and_status);
	tcase_add_test(tc, test_gate_counts_nothing);
	tcase_add_test(tc, test_registry_by_id);
	tcase_add_test(tc, test_ids_across_nodes);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(ops_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
