/* test_verbs_emu.c - the emulated RDMA device keeps the RC rules the
 * verbs transport relies on (net/verbs/verbs_emu.c): writes land only when the
 * responder delivers them (also after the sender gave up), completions in
 * posting order, flushes after the error state, remote access errors (the
 * write does not land) outside an MR or window, after invalidation, from
 * another QP; registration limits, queue bounds, inline bounds, receive
 * requirements, injected completion errors, the completion channel, big
 * writes cut in packets, garbage on the wire, and two processes.
 */
#include <check.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kvd_build.h"
#include "net/verbs/verbs_emu.h"
#include "tests/verbs_testdir.h"

#define MEM (64u * 1024)     /* bytes of each endpoint's memory */
#define PG 4096u             /* a "page" in these tests */

static const struct verbs_ops *V;

struct ep {
	struct verbs_ctx *ctx;
	struct verbs_pd *pd;
	struct verbs_cq *scq, *rcq;
	int sfd, rfd;
	struct verbs_qp *qp;
	uint32_t qpn;
	uint8_t *mem;
	struct verbs_mr *mr;
	struct verbs_mr_info mi;
};

static void dev_name(char *buf, size_t n, const char *opts)
{
	snprintf(buf, n, "emu:%s%s", dir, opts ? opts : "");
}

static void ep_open(struct ep *e, const char *opts, uint32_t sq_depth)
{
	char dev[160];
	struct verbs_qp_caps caps = { .max_send_wr = sq_depth, .max_recv_wr = 16,
				      .max_inline = 64 };
	struct verbs_dev_attr a;

	memset(e, 0, sizeof(*e));
	dev_name(dev, sizeof(dev), opts);
	ck_assert_int_eq(V->open(dev, &e->ctx), 0);
	ck_assert_int_eq(V->query_device(e->ctx, &a), 0);
	ck_assert_int_eq(V->alloc_pd(e->ctx, &e->pd), 0);
	ck_assert_int_eq(V->create_cq(e->ctx, 64, &e->scq, &e->sfd), 0);
	ck_assert_int_eq(V->create_cq(e->ctx, 64, &e->rcq, &e->rfd), 0);
	ck_assert_int_eq(V->create_qp(e->pd, e->scq, e->rcq, &caps, &e->qp, &e->qpn), 0);
	e->mem = calloc(1, MEM);
	ck_assert_ptr_nonnull(e->mem);
	ck_assert_int_eq(V->reg_mr(e->pd, e->mem, MEM,
				   VERBS_ACCESS_LOCAL_WRITE | VERBS_ACCESS_REMOTE_WRITE |
				   (a.mw_type2 ? VERBS_ACCESS_MW_BIND : 0),
				   &e->mr, &e->mi), 0);
	ck_assert_uint_eq(e->mi.length, MEM);
	ck_assert_uint_eq(e->mi.addr, (uintptr_t)e->mem);
}

static void ep_dest(struct ep *e, struct verbs_qp_dest *d)
{
	struct verbs_port_attr pa;

	ck_assert_int_eq(V->query_port(e->ctx, 1, &pa), 0);
	ck_assert(pa.active);
	memset(d, 0, sizeof(*d));
	d->qpn = e->qpn;
	d->lid = pa.lid;
	d->mtu = pa.active_mtu;
	ck_assert_int_eq(V->query_gid(e->ctx, 1, 0, &d->gid), 0);
}

static void ep_connect_to(struct ep *e, const struct verbs_qp_dest *d)
{
	ck_assert_int_eq(V->qp_init(e->qp, 1, VERBS_ACCESS_REMOTE_WRITE), 0);
	ck_assert_int_eq(V->qp_rtr(e->qp, 1, 0, d), 0);
	ck_assert_int_eq(V->qp_rts(e->qp, 0), 0);
}

static void connect_pair(struct ep *a, struct ep *b)
{
	struct verbs_qp_dest da, db;

	ep_dest(a, &da);
	ep_dest(b, &db);
	ep_connect_to(a, &db);
	ep_connect_to(b, &da);
}

static void ep_close(struct ep *e)
{
	ck_assert_int_eq(V->destroy_qp(e->qp), 0);
	ck_assert_int_eq(V->dereg_mr(e->mr), 0);
	ck_assert_int_eq(V->destroy_cq(e->scq), 0);
	ck_assert_int_eq(V->destroy_cq(e->rcq), 0);
	ck_assert_int_eq(V->dealloc_pd(e->pd), 0);
	V->close(e->ctx);
	free(e->mem);
}

/* Post a write of len bytes from tx's memory at src to rx's address. */
static int post_write(struct ep *tx, uint64_t wr_id, uint32_t src, uint32_t len,
		      uint64_t raddr, uint32_t rkey, bool imm, uint32_t immv)
{
	struct verbs_sge sg = { .addr = (uintptr_t)tx->mem + src, .length = len,
				.lkey = tx->mi.lkey };
	struct verbs_send_wr wr = {
		.wr_id = wr_id,
		.opcode = imm ? VERBS_WR_RDMA_WRITE_WITH_IMM : VERBS_WR_RDMA_WRITE,
		.sg = &sg, .num_sge = 1, .remote_addr = raddr, .rkey = rkey,
		.imm = immv, .signaled = true,
	};

	return V->post_send(tx->qp, &wr);
}

static int poll_all(struct verbs_cq *cq, struct verbs_wc *wc, int max)
{
	int n = V->poll_cq(cq, max, wc);

	ck_assert_int_ge(n, 0);
	return n;
}

/* Deliver everything that was posted, whatever the datagram queue holds. */
static int deliver_all(struct ep *tx, struct ep *rx)
{
	int total = 0;

	for (int i = 0; i < 10000; i++) {
		int n;

		ck_assert_int_eq(verbs_emu_pump(tx->ctx), 0);
		n = verbs_emu_deliver(rx->ctx, ~0u);
		ck_assert_int_ge(n, 0);
		total += n;
		if (n == 0 && verbs_emu_arrived(rx->ctx) == 0 && i > 2)
			break;
	}
	ck_assert_int_eq(verbs_emu_pump(tx->ctx), 0);
	return total;
}

static void fill(uint8_t *p, size_t n, uint8_t seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(seed + i * 7);
}

static bool all_zero(const uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (p[i])
			return false;
	return true;
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

/* ---- tests ----------------------------------------------------------- */

START_TEST(test_write_lands_when_delivered)
{
	struct ep p, d;
	struct verbs_wc wc[8];
	struct verbs_emu_stats st;

	ep_open(&p, NULL, 16);
	ep_open(&d, NULL, 16);
	connect_pair(&p, &d);
	fill(p.mem, 2 * PG, 3);
	ck_assert_int_eq(V->post_recv(d.qp, 77), 0);
	ck_assert_int_eq(post_write(&p, 1, 0, PG, (uintptr_t)d.mem + PG, d.mi.rkey, false, 0), 0);
	ck_assert_int_eq(post_write(&p, 2, PG, PG, (uintptr_t)d.mem + 2 * PG, d.mi.rkey, true, 0xabc), 0);
	/* nothing lands, nothing completes, until decode delivers */
	ck_assert_int_eq(poll_all(p.scq, wc, 8), 0);
	ck_assert_int_eq(poll_all(d.rcq, wc, 8), 0);
	ck_assert(all_zero(d.mem, MEM));
	ck_assert_uint_eq(verbs_emu_arrived(d.ctx), 2);
	/* the first one only */
	ck_assert_int_eq(verbs_emu_deliver(d.ctx, 1), 1);
	ck_assert_int_eq(memcmp(d.mem + PG, p.mem, PG), 0);
	ck_assert(all_zero(d.mem + 2 * PG, PG));
	ck_assert_int_eq(poll_all(d.rcq, wc, 8), 0);   /* a plain write: no CQE */
	ck_assert_int_eq(poll_all(p.scq, wc, 8), 1);
	ck_assert_uint_eq(wc[0].wr_id, 1);
	ck_assert_int_eq(wc[0].status, VERBS_WC_SUCCESS);
	/* then the one with the immediate: a receive completion names it */
	ck_assert_int_eq(verbs_emu_deliver(d.ctx, 5), 1);
	ck_assert_int_eq(memcmp(d.mem + 2 * PG, p.mem + PG, PG), 0);
	ck_assert_int_eq(poll_all(d.rcq, wc, 8), 1);
	ck_assert_uint_eq(wc[0].wr_id, 77);
	ck_assert_int_eq(wc[0].opcode, VERBS_WC_RECV_RDMA_WITH_IMM);
	ck_assert(wc[0].has_imm);
	ck_assert_uint_eq(wc[0].imm, 0xabc);
	ck_assert_uint_eq(wc[0].byte_len, PG);
	ck_assert_uint_eq(wc[0].qp_num, d.qpn);
	ck_assert_int_eq(poll_all(p.scq, wc, 8), 1);
	ck_assert_uint_eq(wc[0].wr_id, 2);
	verbs_emu_stats(d.ctx, &st);
	ck_assert_uint_eq(st.applied, 2);
	ck_assert_uint_eq(st.refused, 0);
	ep_close(&p);
	ep_close(&d);
}
END_TEST

/* The incident class: the sender times out and flushes its QP, yet the
 * write it posted still lands when the responder's NIC gets to it. */
START_TEST(test_late_write_after_sender_gave_up)
{
	struct ep p, d;
	struct verbs_wc wc[8];
	enum verbs_qp_state s;

	ep_open(&p, NULL, 16);
	ep_open(&d, NULL, 16);
	connect_pair(&p, &d);
	fill(p.mem, PG, 9);
	ck_assert_int_eq(post_write(&p, 5, 0, PG, (uintptr_t)d.mem, d.mi.rkey, false, 0), 0);
	ck_assert_int_eq(V->qp_err(p.qp), 0);
	ck_assert_int_eq(V->qp_state(p.qp, &s), 0);
	ck_assert_int_eq(s, VERBS_QPS_ERR);
	ck_assert_int_eq(poll_all(p.scq, wc, 8), 1);
	ck_assert_uint_eq(wc[0].wr_id, 5);
	ck_assert_int_eq(wc[0].status, VERBS_WC_WR_FLUSH_ERR);
	ck_assert(all_zero(d.mem, PG));
	/* long after: it lands all the same */
	ck_assert_int_eq(verbs_emu_deliver(d.ctx, 1), 1);
	ck_assert_int_eq(memcmp(d.mem, p.mem, PG), 0);
	/* the late acknowledgement is ignored: no second completion */
	ck_assert_int_eq(poll_all(p.scq, wc, 8), 0);
	ep_close(&p);
	ep_close(&d);
}
END_TEST

/* The fence's end: the responder's QP in ERR places nothing more. */
START_TEST(test_responder_err_places_nothing)
{
	struct ep p, d;
	struct verbs_wc wc[8];
	struct verbs_emu_stats st;

	ep_open(&p, NULL, 16);
	ep_open(&d, NULL, 16);
	connect_pair(&p, &d);
	fill(p.mem, 2 * PG, 1);
	ck_assert_int_eq(V->post_recv(d.qp, 10), 0);
	ck_assert_int_eq(V->post_recv(d.qp, 11), 0);
	ck_assert_int_eq(post_write(&p, 1, 0, PG, (uintptr_t)d.mem, d.mi.rkey, false, 0), 0);
	ck_assert_int_eq(post_write(&p, 2, PG, PG, (uintptr_t)d.mem + PG, d.mi.rkey, true, 1), 0);
	ck_assert_uint_eq(verbs_emu_arrived(d.ctx), 2);
	ck_assert_int_eq(V->qp_err(d.qp), 0);
	/* its posted receives come back flushed, in order */
	ck_assert_int_eq(poll_all(d.rcq, wc, 8), 2);
	ck_assert_uint_eq(wc[0].wr_id, 10);
	ck_assert_int_eq(wc[0].status, VERBS_WC_WR_FLUSH_ERR);
	ck_assert_uint_eq(wc[1].wr_id, 11);
	ck_assert_int_eq(wc[1].status, VERBS_WC_WR_FLUSH_ERR);
	ck_assert_int_eq(verbs_emu_deliver(d.ctx, 10), 2);
	ck_assert(all_zero(d.mem, MEM));
	verbs_emu_stats(d.ctx, &st);
	ck_assert_uint_eq(st.applied, 0);
	ck_assert_uint_eq(st.dropped, 2);
	/* the sender hears nothing good: its first write fails, the QP errs
	 * and the second is flushed */
	ck_assert_int_eq(poll_all(p.scq, wc, 8), 2);
	ck_assert_uint_eq(wc[0].wr_id, 1);
	ck_assert_int_eq(wc[0].status, VERBS_WC_RETRY_EXC_ERR);
	ck_assert_uint_eq(wc[1].wr_id, 2);
	ck_assert_int_eq(wc[1].status, VERBS_WC_WR_FLUSH_ERR);
	ep_close(&p);
	ep_close(&d);
}
END_TEST

/* Completions leave in posting order; unsignaled successes leave none. */
START_TEST(test_completion_order)
{
	struct ep p, d;
	struct verbs_wc wc[8];
	struct verbs_sge sg;
	struct verbs_send_wr wr;
	struct verbs_mw *mw;
	uint32_t key;

	ep_open(&p, NULL, 16);
	ep_open(&d, NULL, 16);
	connect_pair(&p, &d);
	ck_assert_int_eq(post_write(&p, 1, 0, 64, (uintptr_t)d.mem, d.mi.rkey, false, 0), 0);
	/* unsignaled */
	sg = (struct verbs_sge){ .addr = (uintptr_t)p.mem, .length = 64, .lkey = p.mi.lkey };
	wr = (struct verbs_send_wr){ .wr_id = 2, .opcode = VERBS_WR_RDMA_WRITE,
				     .sg = &sg, .num_sge = 1,
				     .remote_addr = (uintptr_t)d.mem + 64,
				     .rkey = d.mi.rkey, .signaled = false };
	ck_assert_int_eq(V->post_send(p.qp, &wr), 0);
	/* a bind completes at once locally but must wait behind the writes */
	ck_assert_int_eq(V->alloc_mw(p.pd, &mw), 0);
	ck_assert_int_eq(V->bind_mw(p.qp, mw, p.mr, (uintptr_t)p.mem, PG,
				    VERBS_ACCESS_REMOTE_WRITE, 3, &key), 0);
	ck_assert_int_eq(poll_all(p.scq, wc, 8), 0);
	deliver_all(&p, &d);
	ck_assert_int_eq(poll_all(p.scq, wc, 8), 2);
	ck_assert_uint_eq(wc[0].wr_id, 1);
	ck_assert_int_eq(wc[0].opcode, VERBS_WC_RDMA_WRITE);
	ck_assert_uint_eq(wc[1].wr_id, 3);
	ck_assert_int_eq(wc[1].opcode, VERBS_WC_BIND_MW);
	ck_assert_int_eq(wc[1].status, VERBS_WC_SUCCESS);
	ck_assert_int_eq(V->invalidate(p.qp, key, 4), 0);
	ck_assert_int_eq(poll_all(p.scq, wc, 8), 1);
	ck_assert_int_eq(wc[0].opcode, VERBS_WC_LOCAL_INV);
	ck_assert_int_eq(V->dealloc_mw(mw), 0);
	ep_close(&p);
	ep_close(&d);
}
END_TEST

/* The error state flushes every outstanding WR, in order, and every WR
 * posted after it. */
START_TEST(test_flush_after_error)
{
	struct ep p, d;
	struct verbs_wc wc[16];

	ep_open(&p, NULL, 16);
	ep_open(&d, NULL, 16);
	connect_pair(&p, &d);
	for (uint64_t i = 0; i < 5; i++)
		ck_assert_int_eq(post_write(&p, 100 + i, 0, 64, (uintptr_t)d.mem + 64 * i,
					    d.mi.rkey, false, 0), 0);
	ck_assert_int_eq(V->qp_err(p.qp), 0);
	ck_assert_int_eq(poll_all(p.scq, wc, 16), 5);
	for (int i = 0; i < 5; i++) {
		ck_assert_uint_eq(wc[i].wr_id, 100 + (uint64_t)i);
		ck_assert_int_eq(wc[i].status, VERBS_WC_WR_FLUSH_ERR);
	}
	ck_assert_int_eq(post_write(&p, 200, 0, 64, (uintptr_t)d.mem, d.mi.rkey, false, 0), 0);
	ck_assert_int_eq(V->post_recv(p.qp, 201), 0);
	ck_assert_int_eq(poll_all(p.scq, wc, 16), 1);
	ck_assert_uint_eq(wc[0].wr_id, 200);
	ck_assert_int_eq(wc[0].status, VERBS_WC_WR_FLUSH_ERR);
	ck_assert_int_eq(poll_all(p.rcq, wc, 16), 1);
	ck_assert_uint_eq(wc[0].wr_id, 201);
	ck_assert_int_eq(wc[0].status, VERBS_WC_WR_FLUSH_ERR);
	/* the flushed write never left (at most the ones already sent land) */
	deliver_all(&p, &d);
	ck_assert_int_eq(poll_all(p.scq, wc, 16), 0);
	ep_close(&p);
	ep_close(&d);
}
END_TEST

/* flush=0: a faulty device that never delivers the error state's flush
 * completions (sends, receives, WRs posted after it); good completions
 * before the error still come, and nothing flushed lands. */
START_TEST(test_flush_withheld)
{
	struct ep p, d;
	struct verbs_wc wc[16];

	ep_open(&p, ",flush=0", 16);
	ep_open(&d, NULL, 16);
	connect_pair(&p, &d);
	ck_assert_int_eq(post_write(&p, 99, 0, 64, (uintptr_t)d.mem, d.mi.rkey, false, 0), 0);
	deliver_all(&p, &d);
	ck_assert_int_eq(poll_all(p.scq, wc, 16), 1);
	ck_assert_int_eq(wc[0].status, VERBS_WC_SUCCESS);
	for (uint64_t i = 0; i < 3; i++)
		ck_assert_int_eq(post_write(&p, 100 + i, 0, 64, (uintptr_t)d.mem + 64 * (i + 1),
					    d.mi.rkey, false, 0), 0);
	ck_assert_int_eq(V->post_recv(p.qp, 150), 0);
	ck_assert_int_eq(V->qp_err(p.qp), 0);
	ck_assert_int_eq(V->post_recv(p.qp, 151), 0);
	ck_assert_int_eq(post_write(&p, 200, 0, 64, (uintptr_t)d.mem, d.mi.rkey, false, 0), 0);
	deliver_all(&p, &d);
	ck_assert_int_eq(poll_all(p.scq, wc, 16), 0);
	ck_assert_int_eq(poll_all(p.rcq, wc, 16), 0);
	ck_assert(all_zero(d.mem + 64, 3 * 64));
	ep_close(&p);
	ep_close(&d);
}
END_TEST

/* Decode binds a type-2 window to one request's pages: writes inside
 * land, a write outside is refused by the NIC and lands nothing. */
START_TEST(test_window_scope)
{
	struct ep p, d;
	struct verbs_wc wc[8];
	struct verbs_mw *mw;
	struct verbs_emu_stats st;
	enum verbs_qp_state s;
	uint32_t key;

	ep_open(&p, NULL, 16);
	ep_open(&d, NULL, 16);
	connect_pair(&p, &d);
	fill(p.mem, 4 * PG, 5);
	ck_assert_int_eq(V->alloc_mw(d.pd, &mw), 0);
	ck_assert_int_eq(V->bind_mw(d.qp, mw, d.mr, (uintptr_t)d.mem + 2 * PG, 2 * PG,
				    VERBS_ACCESS_REMOTE_WRITE, 9, &key), 0);
	ck_assert_int_eq(poll_all(d.scq, wc, 8), 1);
	ck_assert_int_eq(wc[0].status, VERBS_WC_SUCCESS);
	ck_assert_uint_ne(key, d.mi.rkey);
	/* the MR's own key cannot be revoked: windows give the per-request
	 * scope; inside the window */
	ck_assert_int_eq(post_write(&p, 1, 0, 2 * PG, (uintptr_t)d.mem + 2 * PG, key, false, 0), 0);
	ck_assert_int_eq(deliver_all(&p, &d), 1);
	ck_assert_int_eq(memcmp(d.mem + 2 * PG, p.mem, 2 * PG), 0);
	ck_assert_int_eq(poll_all(p.scq, wc, 8), 1);
	ck_assert_int_eq(wc[0].status, VERBS_WC_SUCCESS);
	/* one byte past it: refused whole, nothing of it lands */
	ck_assert_int_eq(post_write(&p, 2, 2 * PG, PG + 1, (uintptr_t)d.mem + 3 * PG, key, false, 0), 0);
	ck_assert_int_eq(post_write(&p, 3, 0, 64, (uintptr_t)d.mem + 2 * PG, key, false, 0), 0);
	deliver_all(&p, &d);
	ck_assert_int_eq(memcmp(d.mem + 3 * PG, p.mem + PG, PG), 0);   /* unchanged */
	ck_assert(all_zero(d.mem + 4 * PG, PG));
	ck_assert_int_eq(poll_all(p.scq, wc, 8), 2);
	ck_assert_uint_eq(wc[0].wr_id, 2);
	ck_assert_int_eq(wc[0].status, VERBS_WC_REM_ACCESS_ERR);
	ck_assert_uint_eq(wc[1].wr_id, 3);
	ck_assert_int_eq(wc[1].status, VERBS_WC_WR_FLUSH_ERR);
	ck_assert_int_eq(V->qp_state(p.qp, &s), 0);
	ck_assert_int_eq(s, VERBS_QPS_ERR);
	ck_assert_int_eq(V->qp_state(d.qp, &s), 0);
	ck_assert_int_eq(s, VERBS_QPS_ERR);
	verbs_emu_stats(d.ctx, &st);
	ck_assert_uint_eq(st.refused, 1);
	ck_assert_uint_eq(st.applied, 1);
	/* a window holds its MR */
	ck_assert_int_eq(V->dereg_mr(d.mr), -EBUSY);
	ck_assert_int_eq(V->dealloc_mw(mw), 0);
	ep_close(&p);
	ep_close(&d);
}
END_TEST

/* Release: the window is invalidated; a write already posted (in
 * flight) is refused when it arrives; a rebound window has a new key and
 * the old one stays dead. */
START_TEST(test_window_invalidated)
{
	struct ep p, d;
	struct verbs_wc wc[8];
	struct verbs_mw *mw;
	uint32_t key, key2;

	ep_open(&p, NULL, 16);
	ep_open(&d, NULL, 16);
	connect_pair(&p, &d);
	fill(p.mem, PG, 2);
	ck_assert_int_eq(V->alloc_mw(d.pd, &mw), 0);
	ck_assert_int_eq(V->bind_mw(d.qp, mw, d.mr, (uintptr_t)d.mem, PG,
				    VERBS_ACCESS_REMOTE_WRITE, 1, &key), 0);
	ck_assert_int_eq(post_write(&p, 1, 0, PG, (uintptr_t)d.mem, key, false, 0), 0);
	ck_assert_uint_eq(verbs_emu_arrived(d.ctx), 1);
	ck_assert_int_eq(V->invalidate(d.qp, key, 2), 0);
	ck_assert_int_eq(poll_all(d.scq, wc, 8), 2);
	ck_assert_int_eq(wc[1].opcode, VERBS_WC_LOCAL_INV);
	ck_assert_int_eq(wc[1].status, VERBS_WC_SUCCESS);
	ck_assert_int_eq(verbs_emu_deliver(d.ctx, 1), 1);
	ck_assert(all_zero(d.mem, MEM));
	ck_assert_int_eq(poll_all(p.scq, wc, 8), 1);
	ck_assert_int_eq(wc[0].status, VERBS_WC_REM_ACCESS_ERR);
	ck_assert_int_eq(V->dealloc_mw(mw), 0);
	ep_close(&p);
	ep_close(&d);

	/* a bound window cannot be bound again before invalidation */
	ep_open(&p, NULL, 16);
	ep_open(&d, NULL, 16);
	connect_pair(&p, &d);
	ck_assert_int_eq(V->alloc_mw(d.pd, &mw), 0);
	ck_assert_int_eq(V->bind_mw(d.qp, mw, d.mr, (uintptr_t)d.mem, PG,
				    VERBS_ACCESS_REMOTE_WRITE, 1, &key), 0);
	ck_assert_int_eq(V->bind_mw(d.qp, mw, d.mr, (uintptr_t)d.mem, PG,
				    VERBS_ACCESS_REMOTE_WRITE, 2, &key2), 0);
	ck_assert_int_eq(poll_all(d.scq, wc, 8), 2);
	ck_assert_int_eq(wc[0].status, VERBS_WC_SUCCESS);
	ck_assert_int_eq(wc[1].status, VERBS_WC_MW_BIND_ERR);
	ck_assert_int_eq(V->dealloc_mw(mw), 0);
	ep_close(&p);
	ep_close(&d);
}
END_TEST

START_TEST(test_window_rekeyed)
{
	struct ep p, d;
	struct verbs_wc wc[8];
	struct verbs_mw *mw;
	uint32_t key, key2;

	ep_open(&p, NULL, 16);
	ep_open(&d, NULL, 16);
	connect_pair(&p, &d);
	fill(p.mem, PG, 4);
	ck_assert_int_eq(V->alloc_mw(d.pd, &mw), 0);
	ck_assert_int_eq(V->bind_mw(d.qp, mw, d.mr, (uintptr_t)d.mem, PG,
				    VERBS_ACCESS_REMOTE_WRITE, 1, &key), 0);
	ck_assert_int_eq(V->invalidate(d.qp, key, 2), 0);
	ck_assert_int_eq(V->invalidate(d.qp, key, 3), 0);   /* dead key */
	ck_assert_int_eq(poll_all(d.scq, wc, 8), 3);
	ck_assert_int_eq(wc[2].status, VERBS_WC_MW_BIND_ERR);
	ck_assert_int_eq(V->dealloc_mw(mw), 0);
	ep_close(&d);
	ep_close(&p);

	ep_open(&p, NULL, 16);
	ep_open(&d, NULL, 16);
	connect_pair(&p, &d);
	fill(p.mem, PG, 4);
	ck_assert_int_eq(V->alloc_mw(d.pd, &mw), 0);
	ck_assert_int_eq(V->bind_mw(d.qp, mw, d.mr, (uintptr_t)d.mem, PG,
				    VERBS_ACCESS_REMOTE_WRITE, 1, &key), 0);
	ck_assert_int_eq(V->invalidate(d.qp, key, 2), 0);
	ck_assert_int_eq(V->bind_mw(d.qp, mw, d.mr, (uintptr_t)d.mem, PG,
				    VERBS_ACCESS_REMOTE_WRITE, 3, &key2), 0);
	ck_assert_int_eq(poll_all(d.scq, wc, 8), 3);
	ck_assert_int_eq(wc[2].status, VERBS_WC_SUCCESS);
	ck_assert_uint_ne(key, key2);
	ck_assert_uint_eq(key >> 8, key2 >> 8);
	/* the old key: refused */
	ck_assert_int_eq(post_write(&p, 1, 0, 64, (uintptr_t)d.mem, key, false, 0), 0);
	deliver_all(&p, &d);
	ck_assert(all_zero(d.mem, MEM));
	ck_assert_int_eq(poll_all(p.scq, wc, 8), 1);
	ck_assert_int_eq(wc[0].status, VERBS_WC_REM_ACCESS_ERR);
	ck_assert_int_eq(V->dealloc_mw(mw), 0);
	ep_close(&p);
	ep_close(&d);

	/* and the new key works on a pair that is not in error */
	ep_open(&p, NULL, 16);
	ep_open(&d, NULL, 16);
	connect_pair(&p, &d);
	fill(p.mem, PG, 4);
	ck_assert_int_eq(V->alloc_mw(d.pd, &mw), 0);
	ck_assert_int_eq(V->bind_mw(d.qp, mw, d.mr, (uintptr_t)d.mem, PG,
				    VERBS_ACCESS_REMOTE_WRITE, 1, &key), 0);
	ck_assert_int_eq(V->invalidate(d.qp, key, 2), 0);
	ck_assert_int_eq(V->bind_mw(d.qp, mw, d.mr, (uintptr_t)d.mem, PG,
				    VERBS_ACCESS_REMOTE_WRITE, 3, &key2), 0);
	ck_assert_int_eq(post_write(&p, 1, 0, 64, (uintptr_t)d.mem, key2, false, 0), 0);
	deliver_all(&p, &d);
	ck_assert_int_eq(memcmp(d.mem, p.mem, 64), 0);
	ck_assert_int_eq(poll_all(p.scq, wc, 8), 1);
	ck_assert_int_eq(wc[0].status, VERBS_WC_SUCCESS);
	ck_assert_int_eq(V->dealloc_mw(mw), 0);
	ep_close(&p);
	ep_close(&d);
}
END_TEST

/* A type-2 window serves only the QP it was bound for. */
START_TEST(test_window_other_qp)
{
	struct ep p, d, p2, d2;
	struct verbs_wc wc[8];
	struct verbs_mw *mw;
	uint32_t key;

	ep_open(&p, NULL, 16);
	ep_open(&d, NULL, 16);
	ep_open(&p2, NULL, 16);
	connect_pair(&p, &d);
	/* a second QP on decode's context, connected to p2 */
	{
		struct verbs_qp_caps caps = { .max_send_wr = 4, .max_recv_wr = 4 };
		struct verbs_qp_dest dd, dp2;

		d2 = d;
		ck_assert_int_eq(V->create_qp(d.pd, d.scq, d.rcq, &caps, &d2.qp, &d2.qpn), 0);
		ep_dest(&d2, &dd);
		ep_dest(&p2, &dp2);
		ep_connect_to(&d2, &dp2);
		ep_connect_to(&p2, &dd);
	}
	fill(p2.mem, PG, 6);
	ck_assert_int_eq(V->alloc_mw(d.pd, &mw), 0);
	ck_assert_int_eq(V->bind_mw(d.qp, mw, d.mr, (uintptr_t)d.mem, PG,
				    VERBS_ACCESS_REMOTE_WRITE, 1, &key), 0);
	ck_assert_int_eq(post_write(&p2, 1, 0, 64, (uintptr_t)d.mem, key, false, 0), 0);
	deliver_all(&p2, &d);
	ck_assert(all_zero(d.mem, MEM));
	ck_assert_int_eq(poll_all(p2.scq, wc, 8), 1);
	ck_assert_int_eq(wc[0].status, VERBS_WC_REM_ACCESS_ERR);
	ck_assert_int_eq(V->dealloc_mw(mw), 0);
	ck_assert_int_eq(V->destroy_qp(d2.qp), 0);
	ep_close(&p2);
	ep_close(&p);
	ep_close(&d);
}
END_TEST

/* max_mr_size, no windows, bad keys, writes past an MR. */
START_TEST(test_registration_limits)
{
	struct ep p, d;
	struct verbs_dev_attr a;
	struct verbs_mr *mr;
	struct verbs_mr_info mi;
	struct verbs_mw *mw;
	struct verbs_wc wc[8];
	uint8_t *buf = calloc(1, 8192);

	ck_assert_ptr_nonnull(buf);
	ep_open(&d, ",max_mr_size=65536,mw=0", 16);
	ck_assert_int_eq(V->query_device(d.ctx, &a), 0);
	ck_assert_uint_eq(a.max_mr_size, 65536);
	ck_assert(!a.mw_type2);
	ck_assert_int_eq(V->alloc_mw(d.pd, &mw), -EOPNOTSUPP);
	ep_close(&d);

	ep_open(&d, ",max_mr_size=65536", 16);
	ck_assert_int_eq(V->reg_mr(d.pd, buf, 8192, VERBS_ACCESS_LOCAL_WRITE, &mr, &mi), 0);
	ck_assert_int_eq(V->dereg_mr(mr), 0);
	ck_assert_int_eq(V->reg_mr(d.pd, d.mem, 65537, VERBS_ACCESS_LOCAL_WRITE, &mr, &mi), -EINVAL);
	ck_assert_int_eq(V->reg_mr(d.pd, buf, 0, VERBS_ACCESS_LOCAL_WRITE, &mr, &mi), -EINVAL);
	ck_assert_int_eq(V->reg_mr(d.pd, buf, 64, VERBS_ACCESS_REMOTE_WRITE, &mr, &mi), -EINVAL);
	/* a registration without remote write: a write to it is refused */
	ck_assert_int_eq(V->reg_mr(d.pd, buf, 8192, VERBS_ACCESS_LOCAL_WRITE, &mr, &mi), 0);
	ep_open(&p, NULL, 16);
	connect_pair(&p, &d);
	fill(p.mem, PG, 8);
	ck_assert_int_eq(post_write(&p, 1, 0, 64, (uintptr_t)buf, mi.rkey, false, 0), 0);
	deliver_all(&p, &d);
	ck_assert(all_zero(buf, 8192));
	ck_assert_int_eq(poll_all(p.scq, wc, 8), 1);
	ck_assert_int_eq(wc[0].status, VERBS_WC_REM_ACCESS_ERR);
	ck_assert_int_eq(V->dealloc_pd(d.pd), -EBUSY);
	ck_assert_int_eq(V->dereg_mr(mr), 0);
	ep_close(&p);
	ep_close(&d);

	/* past the end of an MR, and an unknown key */
	ep_open(&p, NULL, 16);
	ep_open(&d, NULL, 16);
	connect_pair(&p, &d);
	ck_assert_int_eq(post_write(&p, 1, 0, 128, (uintptr_t)d.mem + MEM - 64, d.mi.rkey, false, 0), 0);
	deliver_all(&p, &d);
	ck_assert_int_eq(poll_all(p.scq, wc, 8), 1);
	ck_assert_int_eq(wc[0].status, VERBS_WC_REM_ACCESS_ERR);
	ck_assert(all_zero(d.mem, MEM));
	ep_close(&p);
	ep_close(&d);
	ep_open(&p, NULL, 16);
	ep_open(&d, NULL, 16);
	connect_pair(&p, &d);
	ck_assert_int_eq(post_write(&p, 1, 0, 64, (uintptr_t)d.mem, d.mi.rkey ^ 0x100, false, 0), 0);
	deliver_all(&p, &d);
	ck_assert_int_eq(poll_all(p.scq, wc, 8), 1);
	ck_assert_int_eq(wc[0].status, VERBS_WC_REM_ACCESS_ERR);
	ck_assert(all_zero(d.mem, MEM));
	ep_close(&p);
	ep_close(&d);
	free(buf);
}
END_TEST

/* Bounded outstanding WRs, inline size, state rules, local keys. */
START_TEST(test_queue_bounds)
{
	struct ep p, d;
	struct verbs_wc wc[8];
	struct verbs_sge sg;
	struct verbs_send_wr wr;
	struct verbs_qp *qp;
	struct verbs_qp_caps big = { .max_send_wr = 100000, .max_recv_wr = 1 };
	uint32_t qpn;

	ep_open(&p, ",max_qp_wr=64", 4);
	ep_open(&d, NULL, 4);
	ck_assert_int_eq(V->create_qp(p.pd, p.scq, p.rcq, &big, &qp, &qpn), -EINVAL);
	/* before RTS: refused */
	ck_assert_int_eq(post_write(&p, 1, 0, 64, (uintptr_t)d.mem, d.mi.rkey, false, 0), -EINVAL);
	connect_pair(&p, &d);
	for (uint64_t i = 0; i < 4; i++)
		ck_assert_int_eq(post_write(&p, i, 0, 64, (uintptr_t)d.mem, d.mi.rkey, false, 0), 0);
	ck_assert_int_eq(post_write(&p, 9, 0, 64, (uintptr_t)d.mem, d.mi.rkey, false, 0), -ENOMEM);
	ck_assert_int_eq(verbs_emu_deliver(d.ctx, 1), 1);
	ck_assert_int_eq(poll_all(p.scq, wc, 8), 1);
	ck_assert_int_eq(post_write(&p, 9, 0, 64, (uintptr_t)d.mem, d.mi.rkey, false, 0), 0);
	/* inline: up to the QP's max_inline (64 here) */
	sg = (struct verbs_sge){ .addr = (uintptr_t)p.mem, .length = 65 };
	wr = (struct verbs_send_wr){ .wr_id = 20, .opcode = VERBS_WR_RDMA_WRITE,
				     .sg = &sg, .num_sge = 1, .inline_data = true,
				     .remote_addr = (uintptr_t)d.mem, .rkey = d.mi.rkey,
				     .signaled = true };
	deliver_all(&p, &d);
	ck_assert_int_eq(poll_all(p.scq, wc, 8), 4);
	ck_assert_int_eq(V->post_send(p.qp, &wr), -EINVAL);
	sg.length = 64;
	memset(p.mem, 0x5a, 64);
	ck_assert_int_eq(V->post_send(p.qp, &wr), 0);
	memset(p.mem, 0, 64);   /* inline: copied at post time */
	deliver_all(&p, &d);
	ck_assert_int_eq(d.mem[0], 0x5a);
	ck_assert_int_eq(d.mem[63], 0x5a);
	ck_assert_int_eq(poll_all(p.scq, wc, 8), 1);
	ck_assert_int_eq(wc[0].status, VERBS_WC_SUCCESS);
	/* a bad local key: a local protection error, nothing sent */
	sg = (struct verbs_sge){ .addr = (uintptr_t)p.mem, .length = 64, .lkey = p.mi.lkey + 0x100 };
	wr.inline_data = false;
	ck_assert_int_eq(V->post_send(p.qp, &wr), 0);
	ck_assert_int_eq(poll_all(p.scq, wc, 8), 1);
	ck_assert_int_eq(wc[0].status, VERBS_WC_LOC_PROT_ERR);
	ck_assert_uint_eq(verbs_emu_arrived(d.ctx), 0);
	ep_close(&p);
	ep_close(&d);
}
END_TEST

/* The device's inline limit (max_inline=N, default 256): a QP wanting
 * more is refused and its caps are left as asked; one wanting less is
 * granted its want rounded up to 64 bytes, never past the limit, and told
 * so in its caps (as a provider writes back cap.max_inline_data). */
START_TEST(test_inline_limit)
{
	static const struct {
		const char *opts;
		uint32_t want;
		int r;
		uint32_t granted;
	} cases[] = {
		{ NULL, 0, 0, 0 },
		{ NULL, 1, 0, 64 },
		{ NULL, 104, 0, 128 },
		{ NULL, 256, 0, 256 },
		{ NULL, 257, -EINVAL, 257 },
		{ ",max_inline=100", 64, 0, 64 },
		{ ",max_inline=100", 65, 0, 100 },
		{ ",max_inline=100", 100, 0, 100 },
		{ ",max_inline=100", 101, -EINVAL, 101 },
		{ ",max_inline=100", 104, -EINVAL, 104 },
		{ ",max_inline=0", 0, 0, 0 },
		{ ",max_inline=0", 1, -EINVAL, 1 },
		{ ",max_inline=4096", 4000, 0, 4032 },
	};
	static const char *const bad[] = {
		",max_inline=4097", ",max_inline=-1", ",max_inline=x", ",max_inline=",
	};
	char dev[160];

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct verbs_ctx *ctx;
		struct verbs_pd *pd;
		struct verbs_cq *cq;
		struct verbs_qp *qp = NULL;
		struct verbs_qp_caps caps = { .max_send_wr = 8, .max_recv_wr = 8,
					      .max_inline = cases[i].want };
		uint32_t qpn;
		int fd, r;

		dev_name(dev, sizeof(dev), cases[i].opts);
		ck_assert_int_eq(V->open(dev, &ctx), 0);
		ck_assert_int_eq(V->alloc_pd(ctx, &pd), 0);
		ck_assert_int_eq(V->create_cq(ctx, 16, &cq, &fd), 0);
		r = V->create_qp(pd, cq, cq, &caps, &qp, &qpn);
		ck_assert_msg(r == cases[i].r && caps.max_inline == cases[i].granted,
			      "%s want %u: %d granted %u, expected %d granted %u", dev,
			      cases[i].want, r, caps.max_inline, cases[i].r,
			      cases[i].granted);
		ck_assert_uint_eq(caps.max_send_wr, 8);
		ck_assert_uint_eq(caps.max_recv_wr, 8);
		if (r == 0)
			ck_assert_int_eq(V->destroy_qp(qp), 0);
		ck_assert_int_eq(V->destroy_cq(cq), 0);
		ck_assert_int_eq(V->dealloc_pd(pd), 0);
		V->close(ctx);
	}
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct verbs_ctx *ctx = (struct verbs_ctx *)1;

		dev_name(dev, sizeof(dev), bad[i]);
		ck_assert_int_eq(V->open(dev, &ctx), -EINVAL);
		ck_assert_ptr_null(ctx);
	}
}
END_TEST

/* An injected completion error: the QP errs, the rest flush; the write
 * that was already on the wire may still land. */
START_TEST(test_injected_error)
{
	struct ep p, d;
	struct verbs_wc wc[8];

	ep_open(&p, NULL, 16);
	ep_open(&d, NULL, 16);
	connect_pair(&p, &d);
	fill(p.mem, PG, 11);
	ck_assert_int_eq(post_write(&p, 1, 0, 64, (uintptr_t)d.mem, d.mi.rkey, false, 0), 0);
	ck_assert_int_eq(post_write(&p, 2, 0, 64, (uintptr_t)d.mem + 64, d.mi.rkey, false, 0), 0);
	ck_assert_int_eq(verbs_emu_inject(p.qp, VERBS_WC_SUCCESS), -EINVAL);
	ck_assert_int_eq(verbs_emu_inject(p.qp, VERBS_WC_RETRY_EXC_ERR), 0);
	ck_assert_int_eq(poll_all(p.scq, wc, 8), 2);
	ck_assert_uint_eq(wc[0].wr_id, 1);
	ck_assert_int_eq(wc[0].status, VERBS_WC_RETRY_EXC_ERR);
	ck_assert_uint_eq(wc[1].wr_id, 2);
	ck_assert_int_eq(wc[1].status, VERBS_WC_WR_FLUSH_ERR);
	ck_assert_int_eq(verbs_emu_inject(p.qp, VERBS_WC_RETRY_EXC_ERR), -ENOENT);
	deliver_all(&p, &d);
	ck_assert_int_eq(memcmp(d.mem, p.mem, 64), 0);   /* landed anyway */
	ck_assert_int_eq(poll_all(p.scq, wc, 8), 0);
	ep_close(&p);
	ep_close(&d);
}
END_TEST

/* WRITE_WITH_IMM needs a posted receive; without one nothing lands. */
START_TEST(test_imm_needs_receive)
{
	struct ep p, d;
	struct verbs_wc wc[8];
	struct verbs_emu_stats st;

	ep_open(&p, NULL, 16);
	ep_open(&d, NULL, 16);
	connect_pair(&p, &d);
	fill(p.mem, PG, 12);
	ck_assert_int_eq(post_write(&p, 1, 0, 64, (uintptr_t)d.mem, d.mi.rkey, true, 7), 0);
	deliver_all(&p, &d);
	ck_assert(all_zero(d.mem, MEM));
	ck_assert_int_eq(poll_all(p.scq, wc, 8), 1);
	ck_assert_int_eq(wc[0].status, VERBS_WC_RNR_RETRY_EXC_ERR);
	verbs_emu_stats(d.ctx, &st);
	ck_assert_uint_eq(st.rnr, 1);
	/* zero-length WRITE_WITH_IMM: a batch's end marker, no memory */
	ep_close(&p);
	ep_close(&d);
	ep_open(&p, NULL, 16);
	ep_open(&d, NULL, 16);
	connect_pair(&p, &d);
	ck_assert_int_eq(V->post_recv(d.qp, 4), 0);
	ck_assert_int_eq(post_write(&p, 1, 0, 0, 0, 0, true, 42), 0);
	deliver_all(&p, &d);
	ck_assert_int_eq(poll_all(d.rcq, wc, 8), 1);
	ck_assert_uint_eq(wc[0].imm, 42);
	ck_assert_uint_eq(wc[0].byte_len, 0);
	ck_assert_int_eq(poll_all(p.scq, wc, 8), 1);
	ck_assert_int_eq(wc[0].status, VERBS_WC_SUCCESS);
	ep_close(&p);
	ep_close(&d);
}
END_TEST

/* The completion channel: one event per arming, fd readable then. */
START_TEST(test_completion_channel)
{
	struct ep p, d;
	struct verbs_wc wc[8];
	struct pollfd pfd;

	ep_open(&p, NULL, 16);
	ep_open(&d, NULL, 16);
	connect_pair(&p, &d);
	ck_assert_int_eq(V->get_cq_event(p.scq), -EAGAIN);
	ck_assert_int_eq(V->req_notify(p.scq), 0);
	ck_assert_int_eq(post_write(&p, 1, 0, 64, (uintptr_t)d.mem, d.mi.rkey, false, 0), 0);
	ck_assert_int_eq(post_write(&p, 2, 0, 64, (uintptr_t)d.mem, d.mi.rkey, false, 0), 0);
	pfd = (struct pollfd){ .fd = p.sfd, .events = POLLIN };
	ck_assert_int_eq(poll(&pfd, 1, 0), 0);
	deliver_all(&p, &d);
	ck_assert_int_eq(poll(&pfd, 1, 0), 1);
	ck_assert_int_eq(V->get_cq_event(p.scq), 0);
	ck_assert_int_eq(V->get_cq_event(p.scq), -EAGAIN);   /* once per arming */
	ck_assert_int_eq(poll(&pfd, 1, 0), 0);
	ck_assert_int_eq(poll_all(p.scq, wc, 8), 2);
	/* not armed: a completion writes no event */
	ck_assert_int_eq(post_write(&p, 3, 0, 64, (uintptr_t)d.mem, d.mi.rkey, false, 0), 0);
	deliver_all(&p, &d);
	ck_assert_int_eq(V->get_cq_event(p.scq), -EAGAIN);
	ck_assert_int_eq(poll_all(p.scq, wc, 8), 1);
	ep_close(&p);
	ep_close(&d);
}
END_TEST

/* A CQ that overflows reports it instead of losing completions quietly. */
START_TEST(test_cq_overflow)
{
	struct ep p, d;
	struct verbs_wc wc[8];
	struct verbs_cq *small;
	struct verbs_qp *qp;
	struct verbs_qp_caps caps = { .max_send_wr = 8, .max_recv_wr = 1 };
	struct verbs_qp_dest dd;
	uint32_t qpn;
	int fd;

	ep_open(&p, NULL, 16);
	ep_open(&d, NULL, 16);
	ck_assert_int_eq(V->create_cq(p.ctx, 2, &small, &fd), 0);
	ck_assert_int_eq(V->create_qp(p.pd, small, p.rcq, &caps, &qp, &qpn), 0);
	ep_dest(&d, &dd);
	ck_assert_int_eq(V->qp_init(qp, 1, 0), 0);
	ck_assert_int_eq(V->qp_rtr(qp, 1, 0, &dd), 0);
	ck_assert_int_eq(V->qp_rts(qp, 0), 0);
	for (uint64_t i = 0; i < 3; i++) {
		struct verbs_sge sg = { .addr = (uintptr_t)p.mem, .length = 8, .lkey = p.mi.lkey };
		struct verbs_send_wr wr = { .wr_id = i, .opcode = VERBS_WR_RDMA_WRITE,
					    .sg = &sg, .num_sge = 1, .signaled = true,
					    .remote_addr = (uintptr_t)d.mem, .rkey = d.mi.rkey };

		ck_assert_int_eq(V->post_send(qp, &wr), 0);
	}
	ck_assert_int_eq(V->qp_err(qp), 0);
	ck_assert_int_eq(V->poll_cq(small, 8, wc), -EOVERFLOW);
	ck_assert_int_eq(V->destroy_cq(small), -EBUSY);
	ck_assert_int_eq(V->destroy_qp(qp), 0);
	ck_assert_int_eq(V->destroy_cq(small), 0);
	ep_close(&p);
	ep_close(&d);
}
END_TEST

/* A write bigger than the datagram queue: cut in packets, reassembled. */
START_TEST(test_big_write)
{
	struct ep p, d;
	struct verbs_wc wc[8];

	ep_open(&p, NULL, 16);
	ep_open(&d, NULL, 16);
	connect_pair(&p, &d);
	fill(p.mem, MEM, 13);
	ck_assert_int_eq(V->post_recv(d.qp, 1), 0);
	ck_assert_int_eq(post_write(&p, 1, 0, MEM, (uintptr_t)d.mem, d.mi.rkey, true, 5), 0);
	ck_assert_int_eq(deliver_all(&p, &d), 1);
	ck_assert_int_eq(memcmp(d.mem, p.mem, MEM), 0);
	ck_assert_int_eq(poll_all(d.rcq, wc, 8), 1);
	ck_assert_uint_eq(wc[0].byte_len, MEM);
	ck_assert_int_eq(poll_all(p.scq, wc, 8), 1);
	ck_assert_int_eq(wc[0].status, VERBS_WC_SUCCESS);
	ep_close(&p);
	ep_close(&d);
}
END_TEST

/* Garbage datagrams on the wire are dropped; bad device names refused. */
/* Anyone who can reach a NIC's socket sends first packets of writes that
 * never finish, each a new message number, to a QP that exists, claiming
 * a sender that is not its peer: the NIC must hold nothing for them (it
 * held each one's length, up to 1 GiB, until the context closed). The
 * packet is struct emu_pkt's layout (net/verbs/verbs_emu.c). */
START_TEST(test_forged_first_packets)
{
	struct ep p, d;
	struct verbs_qp_dest dd;
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct verbs_emu_stats st;
	uint64_t id = 0;
	int s;

	ep_open(&p, NULL, 16);
	ep_open(&d, NULL, 16);
	connect_pair(&p, &d);
	ep_dest(&d, &dd);
	for (int i = 0; i < 8; i++)
		id = (id << 8) | dd.gid.raw[8 + i];
	ck_assert_int_lt(snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/emu-%016llx",
				  dir, (unsigned long long)id), (int)sizeof(sa.sun_path));
	s = socket(AF_UNIX, SOCK_DGRAM, 0);
	ck_assert_int_ge(s, 0);
	for (uint32_t i = 0; i < 2000; i++) {
		uint8_t pkt[64] = { 0 };
		uint32_t magic = 0x6b76656du, len = 16u << 20, qpn = dd.qpn;
		uint64_t src = 0x1234, msn = i;

		memcpy(pkt, &magic, 4);
		pkt[4] = 1;                     /* PKT_WRITE */
		pkt[5] = 1;                     /* PF_FIRST, never PF_LAST */
		memcpy(pkt + 8, &src, 8);       /* src_id: nobody's */
		memcpy(pkt + 20, &qpn, 4);      /* dst_qpn: d's QP */
		memcpy(pkt + 24, &msn, 8);
		memcpy(pkt + 48, &len, 4);      /* total_len */
		ck_assert_int_ge(sendto(s, pkt, sizeof(pkt), 0,
					(struct sockaddr *)&sa, sizeof(sa)), 0);
		if (i % 8 == 0)
			verbs_emu_pump(d.ctx);
	}
	close(s);
	verbs_emu_pump(d.ctx);
	verbs_emu_stats(d.ctx, &st);
	ck_assert_uint_eq(st.partial_bytes, 0);
	ck_assert_uint_ge(st.dropped, 2000);
	/* the link still works */
	fill(p.mem, 64, 3);
	ck_assert_int_eq(post_write(&p, 1, 0, 64, (uintptr_t)d.mem, d.mi.rkey, false, 0), 0);
	ck_assert_int_eq(deliver_all(&p, &d), 1);
	ck_assert_int_eq(memcmp(d.mem, p.mem, 64), 0);
	verbs_emu_stats(d.ctx, &st);
	ck_assert_uint_eq(st.partial_bytes, 0);
	ep_close(&p);
	ep_close(&d);
}
END_TEST

/* Issue 22 item 5: the emulated NIC binds its socket in DIR, and any user
 * who may write DIR may unlink it and bind their own under its name (or
 * plant one for a peer to send to): a directory not owned by this user or
 * writable by group or others is refused (-EPERM), before any socket. */
START_TEST(test_private_dir)
{
	static const mode_t bad[] = { 0777, 01777, 0770, 0720, 0702 };
	struct verbs_ctx *c = NULL;
	char dev[160], sub[128];
	struct stat st;

	snprintf(sub, sizeof(sub), "%s/open", dir);
	ck_assert_int_eq(mkdir(sub, 0700), 0);
	snprintf(dev, sizeof(dev), "emu:%s,auto=1", sub);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		ck_assert_int_eq(chmod(sub, bad[i]), 0);
		ck_assert_msg(V->open(dev, &c) == -EPERM, "mode %04o accepted",
			      (unsigned)bad[i]);
		ck_assert_ptr_null(c);
	}
	/* another user's directory, even a private one */
	ck_assert_int_eq(chmod(sub, 0700), 0);
	if (geteuid() == 0) {
		ck_assert_int_eq(chown(sub, 65534, 65534), 0);
		ck_assert_int_eq(V->open(dev, &c), -EPERM);
		ck_assert_int_eq(chown(sub, 0, 0), 0);
	} else {
		ck_assert_int_eq(stat("/", &st), 0);
		ck_assert_int_ne(st.st_uid, geteuid());
		ck_assert_int_eq(V->open("emu:/,auto=1", &c), -EPERM);
	}
	/* nothing was bound in the refused directory */
	ck_assert_int_eq(rmdir(sub), 0);
	ck_assert_int_eq(mkdir(sub, 0755), 0);
	ck_assert_int_eq(V->open(dev, &c), 0);   /* ours, 0755: fine */
	V->close(c);
	ck_assert_int_eq(rmdir(sub), 0);
}
END_TEST

START_TEST(test_garbage_and_names)
{
	struct ep p, d;
	struct verbs_ctx *c;
	struct verbs_qp_dest dd;
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct verbs_emu_stats st;
	uint8_t junk[200];
	int s;

	ck_assert_int_eq(V->open("emu:", &c), -EINVAL);
	ck_assert_int_eq(V->open("rxe0", &c), -EINVAL);
	ck_assert_int_eq(V->open("emu:/tmp,max_mr_size=x", &c), -EINVAL);
	ck_assert_int_eq(V->open("emu:/tmp,bogus=1", &c), -EINVAL);
	ck_assert_int_eq(V->open("emu:/nonexistent-dir-kvd", &c), -ENOENT);
	ep_open(&p, NULL, 16);
	ep_open(&d, NULL, 16);
	connect_pair(&p, &d);
	ep_dest(&d, &dd);
	{
		char path[128];
		uint64_t id = 0;

		for (int i = 0; i < 8; i++)
			id = (id << 8) | dd.gid.raw[8 + i];
		snprintf(path, sizeof(path), "%s/emu-%016llx", dir, (unsigned long long)id);
		strcpy(sa.sun_path, path);
	}
	s = socket(AF_UNIX, SOCK_DGRAM, 0);
	ck_assert_int_ge(s, 0);
	srand(7);
	for (int i = 0; i < 200; i++) {
		size_t n = (size_t)(rand() % (int)sizeof(junk));

		for (size_t j = 0; j < n; j++)
			junk[j] = (uint8_t)rand();
		if (i % 2 && n >= 4)
			memcpy(junk, "mevk", 4);   /* the magic, little-endian */
		ck_assert_int_ge(sendto(s, junk, n, 0, (struct sockaddr *)&sa, sizeof(sa)), 0);
		if (i % 8 == 0)
			verbs_emu_pump(d.ctx);
	}
	close(s);
	ck_assert_int_eq(verbs_emu_deliver(d.ctx, ~0u), 0);
	verbs_emu_stats(d.ctx, &st);
	ck_assert_uint_eq(st.applied + st.refused, 0);
	ck_assert(all_zero(d.mem, MEM));
	/* the link still works */
	fill(p.mem, 64, 1);
	ck_assert_int_eq(post_write(&p, 1, 0, 64, (uintptr_t)d.mem, d.mi.rkey, false, 0), 0);
	ck_assert_int_eq(deliver_all(&p, &d), 1);
	ck_assert_int_eq(memcmp(d.mem, p.mem, 64), 0);
	ep_close(&p);
	ep_close(&d);
}
END_TEST

/* Two processes: decode (the child) registers its memory and delivers in
 * auto mode; prefill (this process) writes into it. */
START_TEST(test_two_processes)
{
	int to_child[2], to_parent[2], status;
	pid_t pid;
	struct verbs_qp_dest dd, dp;
	struct {
		struct verbs_qp_dest dest;
		uint64_t addr;
		uint32_t rkey;
	} adv;

	ck_assert_int_eq(pipe(to_child), 0);
	ck_assert_int_eq(pipe(to_parent), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		struct ep d;
		struct verbs_wc wc[4];
		int ok = 0, n = 0;
		uint8_t expect[PG];

		ep_open(&d, ",auto=1", 16);
		ep_dest(&d, &adv.dest);
		adv.addr = (uintptr_t)d.mem;
		adv.rkey = d.mi.rkey;
		if (write(to_parent[1], &adv, sizeof(adv)) != sizeof(adv) ||
		    read(to_child[0], &dp, sizeof(dp)) != sizeof(dp))
			_exit(2);
		ep_connect_to(&d, &dp);
		V->post_recv(d.qp, 1);
		if (write(to_parent[1], "r", 1) != 1)
			_exit(2);
		for (int i = 0; i < 5000 && n == 0; i++) {
			n = V->poll_cq(d.rcq, 4, wc);
			if (n == 0)
				usleep(1000);
		}
		fill(expect, PG, 21);
		if (n == 1 && wc[0].status == VERBS_WC_SUCCESS && wc[0].imm == 99 &&
		    memcmp(d.mem, expect, PG) == 0 && all_zero(d.mem + PG, MEM - PG))
			ok = 1;
		/* let the ack leave before the socket goes */
		verbs_emu_pump(d.ctx);
		ep_close(&d);
		_exit(ok ? 0 : 1);
	}
	{
		struct ep p;
		struct verbs_wc wc[4];
		char c;
		int n = 0;

		ck_assert_int_eq(read(to_parent[0], &adv, sizeof(adv)), sizeof(adv));
		ep_open(&p, NULL, 16);
		ep_dest(&p, &dp);
		ck_assert_int_eq(write(to_child[1], &dp, sizeof(dp)), sizeof(dp));
		dd = adv.dest;
		ep_connect_to(&p, &dd);
		ck_assert_int_eq(read(to_parent[0], &c, 1), 1);
		fill(p.mem, PG, 21);
		ck_assert_int_eq(post_write(&p, 1, 0, PG, adv.addr, adv.rkey, true, 99), 0);
		for (int i = 0; i < 5000 && n == 0; i++) {
			n = poll_all(p.scq, wc, 4);
			if (n == 0)
				usleep(1000);
		}
		ck_assert_int_eq(n, 1);
		ck_assert_int_eq(wc[0].status, VERBS_WC_SUCCESS);
		ck_assert_int_eq(waitpid(pid, &status, 0), pid);
		ck_assert(WIFEXITED(status));
		ck_assert_int_eq(WEXITSTATUS(status), 0);
		ep_close(&p);
	}
	close(to_child[0]);
	close(to_child[1]);
	close(to_parent[0]);
	close(to_parent[1]);
}
END_TEST

/* A write to a peer whose context is gone: retry exceeded, not a hang. */
START_TEST(test_peer_gone)
{
	struct ep p, d;
	struct verbs_wc wc[8];

	ep_open(&p, NULL, 16);
	ep_open(&d, NULL, 16);
	connect_pair(&p, &d);
	ep_close(&d);
	ck_assert_int_eq(post_write(&p, 1, 0, 64, 4096, 256, false, 0), 0);
	ck_assert_int_eq(poll_all(p.scq, wc, 8), 1);
	ck_assert_int_eq(wc[0].status, VERBS_WC_RETRY_EXC_ERR);
	ck_assert_str_eq(verbs_wc_status_name(wc[0].status), "retry_exceeded");
	ck_assert_str_eq(verbs_wc_status_name(VERBS_WC__COUNT), "?");
	ep_close(&p);
}
END_TEST

/* The real table: NULL without libibverbs; with it, here (no device) a
 * clear negative errno and no context, or, on a machine with a device,
 * a context that answers a device query. */
START_TEST(test_real_ops_probe)
{
	const struct verbs_ops *R = verbs_real_ops();
	struct verbs_ctx *c = (struct verbs_ctx *)&c;
	struct verbs_dev_attr a;
	int r;

	if (!R) {
		ck_assert_int_eq(KVD_HAVE_VERBS, 0);
		return;
	}
	ck_assert_int_eq(KVD_HAVE_VERBS, 1);
	ck_assert_str_eq(R->name, "ibverbs");
	/* -ENOSYS: no RDMA in the kernel (ibv_get_device_list fails) */
	r = R->open("kvd-no-such-device", &c);
	ck_assert_msg(r == -ENODEV || r == -ENOSYS, "open: %d", r);
	ck_assert_ptr_null(c);
	r = R->open(NULL, &c);
	if (r < 0) {
		ck_assert_ptr_null(c);
		return;
	}
	ck_assert_int_eq(R->query_device(c, &a), 0);
	ck_assert_uint_gt(a.max_mr_size, 0);
	R->close(c);
}
END_TEST

static Suite *verbs_emu_suite(void)
{
	Suite *s = suite_create("verbs_emu");
	TCase *tc = tcase_create("rc");

	verbs_test_fixtures(tc, setup, teardown_dir);
	tcase_add_test(tc, test_write_lands_when_delivered);
	tcase_add_test(tc, test_late_write_after_sender_gave_up);
	tcase_add_test(tc, test_responder_err_places_nothing);
	tcase_add_test(tc, test_completion_order);
	tcase_add_test(tc, test_flush_after_error);
	tcase_add_test(tc, test_flush_withheld);
	tcase_add_test(tc, test_window_scope);
	tcase_add_test(tc, test_window_invalidated);
	tcase_add_test(tc, test_window_rekeyed);
	tcase_add_test(tc, test_window_other_qp);
	tcase_add_test(tc, test_registration_limits);
	tcase_add_test(tc, test_queue_bounds);
	tcase_add_test(tc, test_inline_limit);
	tcase_add_test(tc, test_injected_error);
	tcase_add_test(tc, test_imm_needs_receive);
	tcase_add_test(tc, test_completion_channel);
	tcase_add_test(tc, test_cq_overflow);
	tcase_add_test(tc, test_big_write);
	tcase_add_test(tc, test_garbage_and_names);
	tcase_add_test(tc, test_private_dir);
	tcase_add_test(tc, test_forged_first_packets);
	tcase_add_test(tc, test_two_processes);
	tcase_add_test(tc, test_peer_gone);
	tcase_add_test(tc, test_real_ops_probe);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(verbs_emu_suite());
	int failed;

	signal(SIGPIPE, SIG_IGN);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
