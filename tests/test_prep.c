/* test_prep.c - the request preparation pool (daemon/front/prep.h): every
 * accepted job's done comes exactly once on the loop, after run or
 * cancelled; the bounds refuse without queueing; a key's flood leaves a
 * worker to another key; stop hands back what never ran. */
#include <check.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#include "conf/util.h"
#include "daemon/front/prep.h"

struct tjob {
	struct prep_job job;
	int n_done;                      /* loop: done calls */
	bool cancelled;                  /* what done said */
	atomic_int ran;                  /* worker: run calls */
	atomic_bool *gate;               /* run waits while *gate is false */
	int order;                       /* loop: the done call's rank */
};

static int done_rank;

static void tjob_run(struct prep_job *j)
{
	struct tjob *t = kvd_container_of(j, struct tjob, job);

	while (t->gate && !atomic_load(t->gate))
		usleep(1000);
	atomic_fetch_add(&t->ran, 1);
}

static void tjob_done(struct prep_job *j, bool cancelled)
{
	struct tjob *t = kvd_container_of(j, struct tjob, job);

	t->n_done++;
	t->cancelled = cancelled;
	t->order = ++done_rank;
}

static void tjob_init(struct tjob *t, const char *key, size_t bytes,
		      atomic_bool *gate)
{
	memset(t, 0, sizeof(*t));
	t->job.run = tjob_run;
	t->job.done = tjob_done;
	snprintf(t->job.key, sizeof(t->job.key), "%s", key);
	t->job.bytes = bytes;
	t->gate = gate;
}

/* run the loop until every job of js has its done (or ~5 s) */
static void drain(uv_loop_t *loop, struct tjob *js, size_t n)
{
	for (int i = 0; i < 5000; i++) {
		size_t left = 0;

		for (size_t k = 0; k < n; k++)
			left += js[k].n_done == 0;
		if (!left)
			return;
		uv_run(loop, UV_RUN_NOWAIT);
		usleep(1000);
	}
}

static void closed(uv_handle_t *h)
{
	(void)h;
}

static void finish(uv_loop_t *loop, struct prep *p)
{
	prep_stop(p);
	prep_close(p, closed, NULL);
	uv_run(loop, UV_RUN_DEFAULT);
	ck_assert_int_eq(uv_loop_close(loop), 0);
}

START_TEST(test_run_and_done_once)
{
	uv_loop_t loop;
	struct prep p = { 0 };
	struct tjob js[10];

	uv_loop_init(&loop);
	ck_assert_int_eq(prep_start(&p, &loop), 0);
	for (int i = 0; i < 10; i++) {
		tjob_init(&js[i], i % 2 ? "a" : "b", 100, NULL);
		ck_assert_int_eq(prep_submit(&p, &js[i].job), 0);
	}
	ck_assert_uint_eq(prep_jobs(&p), 10);
	drain(&loop, js, 10);
	for (int i = 0; i < 10; i++) {
		ck_assert_int_eq(js[i].n_done, 1);
		ck_assert(!js[i].cancelled);
		ck_assert_int_eq(atomic_load(&js[i].ran), 1);
	}
	ck_assert_uint_eq(prep_jobs(&p), 0);
	finish(&loop, &p);
	for (int i = 0; i < 10; i++)
		ck_assert_int_eq(js[i].n_done, 1);   /* stop adds none */
}
END_TEST

/* Bounds: jobs per key, total bytes; a refusal queues nothing and its
 * done never comes. A cancelled queued job never runs. */
START_TEST(test_bounds_and_cancel)
{
	uv_loop_t loop;
	struct prep p = { 0 };
	atomic_bool gate = false;
	struct tjob js[PREP_KEY_JOBS_MAX + 3];
	struct tjob big, other;

	uv_loop_init(&loop);
	ck_assert_int_eq(prep_start(&p, &loop), 0);
	for (unsigned i = 0; i < PREP_KEY_JOBS_MAX; i++) {
		tjob_init(&js[i], "flood", 10, &gate);
		ck_assert_int_eq(prep_submit(&p, &js[i].job), 0);
	}
	tjob_init(&js[PREP_KEY_JOBS_MAX], "flood", 10, &gate);
	ck_assert_int_eq(prep_submit(&p, &js[PREP_KEY_JOBS_MAX].job), PREP_E_KEY_FULL);
	tjob_init(&big, "other", PREP_BYTES_MAX, NULL);
	ck_assert_int_eq(prep_submit(&p, &big.job), PREP_E_FULL);
	tjob_init(&other, "other", 10, NULL);
	ck_assert_int_eq(prep_submit(&p, &other.job), 0);
	/* the last flood job is still queued (two workers, all gated) */
	prep_cancel(&js[PREP_KEY_JOBS_MAX - 1].job);
	atomic_store(&gate, true);
	drain(&loop, js, PREP_KEY_JOBS_MAX);
	drain(&loop, &other, 1);
	ck_assert_int_eq(js[PREP_KEY_JOBS_MAX - 1].n_done, 1);
	ck_assert(js[PREP_KEY_JOBS_MAX - 1].cancelled);
	ck_assert_int_eq(atomic_load(&js[PREP_KEY_JOBS_MAX - 1].ran), 0);
	ck_assert_int_eq(js[PREP_KEY_JOBS_MAX].n_done, 0);
	ck_assert_int_eq(big.n_done, 0);
	ck_assert_int_eq(other.n_done, 1);
	ck_assert(!other.cancelled);
	finish(&loop, &p);
}
END_TEST

/* Bytes under one key: past its first job at most PREP_KEY_BYTES_MAX,
 * so one tenant's large bodies leave room for the others. */
START_TEST(test_key_bytes)
{
	uv_loop_t loop;
	struct prep p = { 0 };
	atomic_bool gate = false;
	struct tjob a[3], b, c;

	uv_loop_init(&loop);
	ck_assert_int_eq(prep_start(&p, &loop), 0);
	tjob_init(&a[0], "a", PREP_KEY_BYTES_MAX / 2, &gate);
	tjob_init(&a[1], "a", PREP_KEY_BYTES_MAX / 2, &gate);
	tjob_init(&a[2], "a", 1, &gate);
	ck_assert_int_eq(prep_submit(&p, &a[0].job), 0);
	ck_assert_int_eq(prep_submit(&p, &a[1].job), 0);
	ck_assert_int_eq(prep_submit(&p, &a[2].job), PREP_E_KEY_FULL);
	tjob_init(&b, "b", 10, &gate);
	ck_assert_int_eq(prep_submit(&p, &b.job), 0);
	/* one job alone may be larger than the key's bytes */
	tjob_init(&c, "c", PREP_KEY_BYTES_MAX + 1, &gate);
	ck_assert_int_eq(prep_submit(&p, &c.job), 0);
	atomic_store(&gate, true);
	drain(&loop, a, 2);
	drain(&loop, &b, 1);
	drain(&loop, &c, 1);
	ck_assert_int_eq(a[2].n_done, 0);
	finish(&loop, &p);
}
END_TEST

/* A key that fills both workers' queue: another key's job is taken by
 * the first worker that frees, before the flood's later jobs. */
START_TEST(test_fair_pick)
{
	uv_loop_t loop;
	struct prep p = { 0 };
	atomic_bool gate = false;
	struct tjob flood[6], other;

	uv_loop_init(&loop);
	ck_assert_int_eq(prep_start(&p, &loop), 0);
	for (int i = 0; i < 6; i++) {
		tjob_init(&flood[i], "flood", 1, &gate);
		ck_assert_int_eq(prep_submit(&p, &flood[i].job), 0);
	}
	usleep(50000);   /* both workers hold a gated flood job */
	tjob_init(&other, "other", 1, NULL);
	ck_assert_int_eq(prep_submit(&p, &other.job), 0);
	atomic_store(&gate, true);
	drain(&loop, flood, 6);
	drain(&loop, &other, 1);
	/* done in the order the workers finished: other after at most the
	 * two running flood jobs and the one the other worker took next */
	ck_assert_int_le(other.order, 4);
	finish(&loop, &p);
}
END_TEST

/* Stop with jobs queued: the running ones finish, the rest come back
 * cancelled, each once. */
START_TEST(test_stop_hands_back)
{
	uv_loop_t loop;
	struct prep p = { 0 };
	atomic_bool gate = false;
	struct tjob js[6];

	uv_loop_init(&loop);
	ck_assert_int_eq(prep_start(&p, &loop), 0);
	for (int i = 0; i < 6; i++) {
		tjob_init(&js[i], "k", 1, &gate);
		ck_assert_int_eq(prep_submit(&p, &js[i].job), 0);
	}
	usleep(20000);
	atomic_store(&gate, true);
	prep_stop(&p);
	for (int i = 0; i < 6; i++) {
		ck_assert_int_eq(js[i].n_done, 1);
		ck_assert(js[i].cancelled == (atomic_load(&js[i].ran) == 0));
	}
	ck_assert_uint_eq(prep_jobs(&p), 0);
	ck_assert_int_eq(prep_submit(&p, &js[0].job), PREP_E_FULL);
	prep_stop(&p);   /* twice */
	prep_close(&p, closed, NULL);
	uv_run(&loop, UV_RUN_DEFAULT);
	ck_assert_int_eq(uv_loop_close(&loop), 0);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("prep");
	TCase *tc = tcase_create("core");
	SRunner *sr;
	int failed;

	tcase_add_test(tc, test_run_and_done_once);
	tcase_add_test(tc, test_bounds_and_cancel);
	tcase_add_test(tc, test_key_bytes);
	tcase_add_test(tc, test_fair_pick);
	tcase_add_test(tc, test_stop_hands_back);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
