/* test_verbs_poller.c - completions reach the libuv loop through the
 * completion channel fd (net/verbs/verbs_poller.c), over the emulated device in
 * auto mode with its wire fd watched: writes posted by prefill land in
 * decode's memory and both sides see their completions in order from
 * uv_run alone; a completion that was there before the poller started is
 * delivered; after decode's QP goes to error the next write fails on
 * prefill's side; closing calls back once, with every handle closed.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#include "conf/util.h"
#include "net/verbs/verbs_emu.h"
#include "net/verbs/verbs_poller.h"
#include "net/verbs/verbs_rc.h"
#include "tests/verbs_testdir.h"

static const struct verbs_ops *V;

struct side {
	struct verbs_ctx *ctx;
	struct verbs_pd *pd;
	struct verbs_rc rc;
	uint8_t mem[8192];
	struct verbs_mr *mr;
	struct verbs_mr_info mi;
	struct verbs_poller poller;
	struct verbs_wc seen[32];
	unsigned n_seen;
	int closed;
};

static void on_wc(void *arg, const struct verbs_wc *wc)
{
	struct side *s = arg;

	ck_assert_uint_lt(s->n_seen, 32);
	s->seen[s->n_seen++] = *wc;
}

static void on_closed(struct verbs_poller *p)
{
	struct side *s = kvd_container_of(p, struct side, poller);

	s->closed++;
}

static void side_open(struct side *s, const char *opts)
{
	char dev[128];
	struct verbs_qp_caps caps = { .max_send_wr = 16, .max_recv_wr = 16 };

	memset(s, 0, sizeof(*s));
	snprintf(dev, sizeof(dev), "emu:%s%s", dir, opts);
	ck_assert_int_eq(V->open(dev, &s->ctx), 0);
	ck_assert_int_eq(V->alloc_pd(s->ctx, &s->pd), 0);
	ck_assert_int_eq(verbs_rc_open(&s->rc, V, s->ctx, s->pd, 1, 0, &caps, 64), 0);
	ck_assert_int_eq(V->reg_mr(s->pd, s->mem, sizeof(s->mem),
				   VERBS_ACCESS_LOCAL_WRITE | VERBS_ACCESS_REMOTE_WRITE,
				   &s->mr, &s->mi), 0);
}

static void side_close(struct side *s)
{
	ck_assert_int_eq(V->dereg_mr(s->mr), 0);
	verbs_rc_close(&s->rc);
	ck_assert_int_eq(V->dealloc_pd(s->pd), 0);
	V->close(s->ctx);
}

static void connect_sides(struct side *a, struct side *b)
{
	struct proto_peer_verbs_qp da, db;
	char why[128];

	verbs_rc_describe(&a->rc, &da);
	verbs_rc_describe(&b->rc, &db);
	ck_assert_int_eq(verbs_rc_connect(&a->rc, &db, why, sizeof(why)), 0);
	ck_assert_int_eq(verbs_rc_connect(&b->rc, &da, why, sizeof(why)), 0);
}

static void post_write(struct side *p, struct side *d, uint64_t id, uint32_t off)
{
	struct verbs_sge sg = { .addr = (uintptr_t)p->mem + off, .length = 1024,
				.lkey = p->mi.lkey };
	struct verbs_send_wr wr = { .wr_id = id, .opcode = VERBS_WR_RDMA_WRITE_WITH_IMM,
				    .sg = &sg, .num_sge = 1,
				    .remote_addr = (uintptr_t)d->mem + off,
				    .rkey = d->mi.rkey, .imm = (uint32_t)id,
				    .signaled = true };

	ck_assert_int_eq(V->post_send(p->rc.qp, &wr), 0);
}

/* Run the loop until both sides saw what they expect (or 5 s). */
static void run_until(uv_loop_t *loop, struct side *p, unsigned np,
		      struct side *d, unsigned nd)
{
	for (int i = 0; i < 5000 && (p->n_seen < np || d->n_seen < nd); i++) {
		uv_run(loop, UV_RUN_NOWAIT);
		if (p->n_seen < np || d->n_seen < nd)
			usleep(1000);
	}
	ck_assert_uint_eq(p->n_seen, np);
	ck_assert_uint_eq(d->n_seen, nd);
}

static void setup(void)
{
	V = verbs_emu_ops();
	verbs_test_dir_make();
}

static void teardown_dir(void)
{
	verbs_test_dir_remove();
}

START_TEST(test_loop_completions)
{
	uv_loop_t loop;
	struct side *p = calloc(1, sizeof(*p)), *d = calloc(1, sizeof(*d));

	ck_assert_int_eq(uv_loop_init(&loop), 0);
	side_open(p, "");
	side_open(d, ",auto=1");
	connect_sides(p, d);
	for (uint64_t i = 0; i < 4; i++)
		ck_assert_int_eq(V->post_recv(d->rc.qp, 100 + i), 0);
	for (uint32_t i = 0; i < sizeof(p->mem); i++)
		p->mem[i] = (uint8_t)(i * 3 + 1);
	/* one write before the pollers exist: its completions must still come */
	post_write(p, d, 1, 0);
	ck_assert_int_eq(verbs_poller_start(&p->poller, &loop, V, p->rc.cq, p->rc.cq_fd,
					    p->ctx, verbs_emu_wire_fd(p->ctx), on_wc, p), 0);
	ck_assert_int_eq(verbs_poller_start(&d->poller, &loop, V, d->rc.cq, d->rc.cq_fd,
					    d->ctx, verbs_emu_wire_fd(d->ctx), on_wc, d), 0);
	post_write(p, d, 2, 1024);
	post_write(p, d, 3, 2048);
	run_until(&loop, p, 3, d, 3);
	for (unsigned i = 0; i < 3; i++) {
		ck_assert_uint_eq(p->seen[i].wr_id, i + 1);
		ck_assert_int_eq(p->seen[i].status, VERBS_WC_SUCCESS);
		ck_assert_uint_eq(d->seen[i].wr_id, 100 + i);
		ck_assert_int_eq(d->seen[i].opcode, VERBS_WC_RECV_RDMA_WITH_IMM);
		ck_assert_uint_eq(d->seen[i].imm, i + 1);
	}
	ck_assert_int_eq(memcmp(d->mem, p->mem, 3072), 0);
	ck_assert_uint_gt(p->poller.events, 0);
	/* decode's QP goes to error: its last receive is flushed, and the
	 * next write fails on prefill's side, on the loop */
	ck_assert_int_eq(V->qp_err(d->rc.qp), 0);
	post_write(p, d, 4, 3072);
	run_until(&loop, p, 4, d, 4);
	ck_assert_int_eq(d->seen[3].status, VERBS_WC_WR_FLUSH_ERR);
	ck_assert_uint_eq(d->seen[3].wr_id, 103);
	ck_assert_int_eq(p->seen[3].status, VERBS_WC_RETRY_EXC_ERR);
	ck_assert_uint_eq(p->seen[3].wr_id, 4);
	ck_assert(d->mem[3072] == 0);
	verbs_poller_close(&p->poller, on_closed);
	verbs_poller_close(&d->poller, on_closed);
	ck_assert_int_eq(uv_run(&loop, UV_RUN_DEFAULT), 0);
	ck_assert_int_eq(p->closed, 1);
	ck_assert_int_eq(d->closed, 1);
	ck_assert_int_eq(uv_loop_close(&loop), 0);
	side_close(p);
	side_close(d);
	free(p);
	free(d);
}
END_TEST

static Suite *verbs_poller_suite(void)
{
	Suite *s = suite_create("verbs_poller");
	TCase *tc = tcase_create("loop");

	verbs_test_fixtures(tc, setup, teardown_dir);
	tcase_add_test(tc, test_loop_completions);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(verbs_poller_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
