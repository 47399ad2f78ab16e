/* test_verbs_rc.c - an RC queue pair described as a verbs_qp message,
 * carried through proto_peer's writer and reader, and connected
 * (net/verbs/verbs_rc.c), over the emulated device: both sides connect and a
 * WRITE_WITH_IMM lands; a peer's MTU that is not a power of two, a GID the
 * device cannot route, out-of-range numbers and a second connect are
 * refused with a sentence and leave the QP unconnected; the path MTU is
 * the smaller side's.
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "net/verbs/verbs_emu.h"
#include "net/verbs/verbs_rc.h"
#include "tests/verbs_testdir.h"

static const struct verbs_ops *V;

struct side {
	struct verbs_ctx *ctx;
	struct verbs_pd *pd;
	struct verbs_rc rc;
	uint8_t mem[4096];
	struct verbs_mr *mr;
	struct verbs_mr_info mi;
};

static void side_open_opts(struct side *s, const char *opts)
{
	char dev[128];
	struct verbs_qp_caps caps = { .max_send_wr = 8, .max_recv_wr = 8 };

	memset(s, 0, sizeof(*s));
	snprintf(dev, sizeof(dev), "emu:%s%s", dir, opts);
	ck_assert_int_eq(V->open(dev, &s->ctx), 0);
	ck_assert_int_eq(V->alloc_pd(s->ctx, &s->pd), 0);
	ck_assert_int_eq(verbs_rc_open(&s->rc, V, s->ctx, s->pd, 1, 0, &caps, 32), 0);
	ck_assert_int_ge(s->rc.cq_fd, 0);
	ck_assert_uint_le(s->rc.psn, 0xffffff);
	ck_assert_int_eq(V->reg_mr(s->pd, s->mem, sizeof(s->mem),
				   VERBS_ACCESS_LOCAL_WRITE | VERBS_ACCESS_REMOTE_WRITE,
				   &s->mr, &s->mi), 0);
}

static void side_open(struct side *s)
{
	side_open_opts(s, "");
}

static void side_close(struct side *s)
{
	ck_assert_int_eq(V->dereg_mr(s->mr), 0);
	verbs_rc_close(&s->rc);
	verbs_rc_close(&s->rc);   /* safe twice */
	ck_assert_int_eq(V->dealloc_pd(s->pd), 0);
	V->close(s->ctx);
}

/* Our description, as the peer reads it off the control link. */
static void over_the_wire(const struct verbs_rc *rc, struct proto_peer_verbs_qp *out)
{
	struct proto_peer_msg m = { .type = PEER_MSG_VERBS_QP }, o;
	struct frame_error err;
	msgpack_unpacked msg;
	const msgpack_object *map = NULL;
	char *buf;
	size_t len;

	verbs_rc_describe(rc, &m.vqp);
	ck_assert_int_eq(proto_peer_frame(&m, &buf, &len), 0);
	msgpack_unpacked_init(&msg);
	ck_assert_int_eq(frame_decode((const uint8_t *)buf, len, PROTO_PEER_FRAME_MAX,
				      &msg, &map), 0);
	ck_assert_int_eq(proto_peer_parse(map, &o, &err), 0);
	ck_assert_int_eq(o.type, PEER_MSG_VERBS_QP);
	*out = o.vqp;
	proto_peer_msg_deinit(&o);
	msgpack_unpacked_destroy(&msg);
	free(buf);
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

START_TEST(test_connect_and_write)
{
	struct side p, d;
	struct proto_peer_verbs_qp pd, dd;
	struct verbs_wc wc[4];
	char why[160];
	enum verbs_qp_state st;

	side_open(&p);
	side_open(&d);
	ck_assert_int_eq(V->qp_state(p.rc.qp, &st), 0);
	ck_assert_int_eq(st, VERBS_QPS_INIT);
	over_the_wire(&p.rc, &pd);
	over_the_wire(&d.rc, &dd);
	ck_assert_uint_eq(pd.qpn, p.rc.qpn);
	ck_assert_uint_eq(pd.psn, p.rc.psn);
	ck_assert_int_eq(verbs_rc_connect(&p.rc, &dd, why, sizeof(why)), 0);
	ck_assert_int_eq(verbs_rc_connect(&d.rc, &pd, why, sizeof(why)), 0);
	ck_assert_uint_eq(p.rc.path_mtu, 4096);
	ck_assert_int_eq(V->qp_state(p.rc.qp, &st), 0);
	ck_assert_int_eq(st, VERBS_QPS_RTS);
	/* a second connect is refused, the QP unchanged */
	ck_assert_int_eq(verbs_rc_connect(&p.rc, &dd, why, sizeof(why)), VERBS_RC_E_STATE);
	ck_assert_ptr_nonnull(strstr(why, "connected already"));
	/* prefill writes into decode's memory, announced by an immediate */
	memset(p.mem, 0x6b, 512);
	ck_assert_int_eq(V->post_recv(d.rc.qp, 5), 0);
	{
		struct verbs_sge sg = { .addr = (uintptr_t)p.mem, .length = 512,
					.lkey = p.mi.lkey };
		struct verbs_send_wr wr = { .wr_id = 1, .opcode = VERBS_WR_RDMA_WRITE_WITH_IMM,
					    .sg = &sg, .num_sge = 1,
					    .remote_addr = (uintptr_t)d.mem + 1024,
					    .rkey = d.mi.rkey, .imm = 3, .signaled = true };

		ck_assert_int_eq(V->post_send(p.rc.qp, &wr), 0);
	}
	ck_assert_int_eq(verbs_emu_deliver(d.ctx, 1), 1);
	ck_assert_int_eq(V->poll_cq(d.rc.cq, 4, wc), 1);
	ck_assert_uint_eq(wc[0].imm, 3);
	ck_assert_int_eq(d.mem[1024], 0x6b);
	ck_assert_int_eq(d.mem[1024 + 511], 0x6b);
	ck_assert_int_eq(d.mem[1024 + 512], 0);
	ck_assert_int_eq(V->poll_cq(p.rc.cq, 4, wc), 1);
	ck_assert_int_eq(wc[0].status, VERBS_WC_SUCCESS);
	side_close(&p);
	side_close(&d);
}
END_TEST

START_TEST(test_refusals)
{
	struct side p, d;
	struct proto_peer_verbs_qp dd, bad;
	char why[160];
	enum verbs_qp_state st;

	side_open(&p);
	side_open(&d);
	over_the_wire(&d.rc, &dd);
	bad = dd;
	bad.mtu = 1500;
	ck_assert_int_eq(verbs_rc_connect(&p.rc, &bad, why, sizeof(why)), VERBS_RC_E_PEER);
	ck_assert_ptr_nonnull(strstr(why, "1500"));
	bad = dd;
	bad.mtu = 8192;
	ck_assert_int_eq(verbs_rc_connect(&p.rc, &bad, why, sizeof(why)), VERBS_RC_E_PEER);
	bad = dd;
	bad.qpn = 0x1000000;
	ck_assert_int_eq(verbs_rc_connect(&p.rc, &bad, why, sizeof(why)), VERBS_RC_E_PEER);
	bad = dd;
	bad.qpn = 0;
	ck_assert_int_eq(verbs_rc_connect(&p.rc, &bad, why, sizeof(why)), VERBS_RC_E_PEER);
	/* a GID the (emulated) fabric cannot route */
	bad = dd;
	memset(bad.gid, 0xfe, sizeof(bad.gid));
	ck_assert_int_eq(verbs_rc_connect(&p.rc, &bad, why, sizeof(why)), VERBS_RC_E_PEER);
	ck_assert_ptr_nonnull(strstr(why, "refused"));
	/* nothing of that stuck: still INIT, and the real one connects */
	ck_assert_int_eq(V->qp_state(p.rc.qp, &st), 0);
	ck_assert_int_eq(st, VERBS_QPS_INIT);
	ck_assert(!p.rc.connected);
	bad = dd;
	bad.mtu = 1024;   /* the smaller side's MTU is the path's */
	ck_assert_int_eq(verbs_rc_connect(&p.rc, &bad, why, sizeof(why)), 0);
	ck_assert_uint_eq(p.rc.path_mtu, 1024);
	side_close(&p);
	side_close(&d);

	/* our port is the smaller one: its MTU is the path's */
	side_open_opts(&p, ",mtu=512");
	side_open(&d);
	over_the_wire(&d.rc, &dd);
	ck_assert_uint_eq(dd.mtu, 4096);
	ck_assert_int_eq(verbs_rc_connect(&p.rc, &dd, why, sizeof(why)), 0);
	ck_assert_uint_eq(p.rc.path_mtu, 512);
	side_close(&p);
	side_close(&d);
}
END_TEST

static Suite *verbs_rc_suite(void)
{
	Suite *s = suite_create("verbs_rc");
	TCase *tc = tcase_create("rc");

	verbs_test_fixtures(tc, setup, teardown_dir);
	tcase_add_test(tc, test_connect_and_write);
	tcase_add_test(tc, test_refusals);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(verbs_rc_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
