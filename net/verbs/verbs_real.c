/* verbs_real.c - net/verbs/verbs_ops.h over libibverbs (rdma-core).
 *
 * Design. A thin translation: kvd's types in, libibverbs' out, errno back
 * as a negative return. Each opaque handle wraps the ibv object and what
 * the ops need alongside it (the completion channel of a CQ, the PD of a
 * QP). Built only when libibverbs is found; it compiles and links, but
 * has not run on an RDMA device yet (none where kvd is developed: see
 * net/README.md).
 *
 * Choices: one completion channel per CQ, made non-blocking, so the loop
 * polls its fd; QPs are RC with remote write access only; type-2 windows
 * are bound and invalidated with IBV_WR_BIND_MW / IBV_WR_LOCAL_INV on the
 * QP whose peer will use them, always signaled so the owner knows when a
 * key is live or dead.
 */
#include "net/verbs/verbs_ops.h"

#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <stdlib.h>
#include <string.h>

struct verbs_ctx {
	struct ibv_context *ctx;
};

struct verbs_pd {
	struct ibv_pd *pd;
};

struct verbs_mr {
	struct ibv_mr *mr;
};

struct verbs_mw {
	struct ibv_mw *mw;
	uint32_t rkey;   /* the key of the last bind: a type-2 bind posted as a
			  * WR does not update mw->rkey, so each bind takes the
			  * next key byte from here, never an old key again
			  * (until the byte wraps) */
};

struct verbs_cq {
	struct ibv_cq *cq;
	struct ibv_comp_channel *ch;
};

struct verbs_qp {
	struct ibv_qp *qp;
};

static int neg_errno(int fallback)
{
	return errno ? -errno : -fallback;
}

static int real_open(const char *dev, struct verbs_ctx **out)
{
	struct ibv_device **list;
	struct ibv_device *pick = NULL;
	struct verbs_ctx *c;
	int n = 0, r = 0;

	*out = NULL;
	errno = 0;
	list = ibv_get_device_list(&n);
	if (!list)
		return neg_errno(ENODEV);
	for (int i = 0; i < n && !pick; i++)
		if (!dev || !*dev || !strcmp(ibv_get_device_name(list[i]), dev))
			pick = list[i];
	c = calloc(1, sizeof(*c));
	if (!pick)
		r = -ENODEV;
	else if (!c)
		r = -ENOMEM;
	else if (!(c->ctx = ibv_open_device(pick)))
		r = neg_errno(ENODEV);
	ibv_free_device_list(list);
	if (r < 0) {
		free(c);
		return r;
	}
	*out = c;
	return 0;
}

static void real_close(struct verbs_ctx *c)
{
	if (!c)
		return;
	ibv_close_device(c->ctx);
	free(c);
}

static int real_query_device(struct verbs_ctx *c, struct verbs_dev_attr *out)
{
	struct ibv_device_attr a;
	int r = ibv_query_device(c->ctx, &a);

	if (r)
		return -r;
	*out = (struct verbs_dev_attr){
		.max_mr_size = a.max_mr_size,
		.max_qp_wr = (uint32_t)a.max_qp_wr,
		.max_cqe = (uint32_t)a.max_cqe,
		.max_sge = (uint32_t)a.max_sge,
		.mw_type2 = (a.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B) ||
			    (a.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2A),
		.phys_port_cnt = a.phys_port_cnt,
	};
	return 0;
}

static int real_query_port(struct verbs_ctx *c, uint8_t port,
			   struct verbs_port_attr *out)
{
	struct ibv_port_attr a;
	int r = ibv_query_port(c->ctx, port, &a);

	if (r)
		return -r;
	*out = (struct verbs_port_attr){
		.active = a.state == IBV_PORT_ACTIVE,
		.active_mtu = 128u << a.active_mtu,   /* IBV_MTU_256 == 1 */
		.lid = a.lid,
		.gid_tbl_len = (uint32_t)a.gid_tbl_len,
	};
	return 0;
}

static int real_query_gid(struct verbs_ctx *c, uint8_t port, int index,
			  struct verbs_gid *out)
{
	union ibv_gid g;
	int r = ibv_query_gid(c->ctx, port, index, &g);

	if (r)
		return r < 0 ? r : -r;
	memcpy(out->raw, g.raw, sizeof(out->raw));
	return 0;
}

static int real_alloc_pd(struct verbs_ctx *c, struct verbs_pd **out)
{
	struct verbs_pd *p = calloc(1, sizeof(*p));

	if (!p)
		return -ENOMEM;
	errno = 0;
	if (!(p->pd = ibv_alloc_pd(c->ctx))) {
		free(p);
		return neg_errno(ENOMEM);
	}
	*out = p;
	return 0;
}

static int real_dealloc_pd(struct verbs_pd *p)
{
	int r = ibv_dealloc_pd(p->pd);

	if (r)
		return -r;
	free(p);
	return 0;
}

static int access_of(unsigned a)
{
	return ((a & VERBS_ACCESS_LOCAL_WRITE) ? IBV_ACCESS_LOCAL_WRITE : 0) |
	       ((a & VERBS_ACCESS_REMOTE_WRITE) ? IBV_ACCESS_REMOTE_WRITE : 0) |
	       ((a & VERBS_ACCESS_REMOTE_READ) ? IBV_ACCESS_REMOTE_READ : 0) |
	       ((a & VERBS_ACCESS_MW_BIND) ? IBV_ACCESS_MW_BIND : 0);
}

static int real_reg_mr(struct verbs_pd *p, void *addr, size_t len,
		       unsigned access, struct verbs_mr **out,
		       struct verbs_mr_info *info)
{
	struct verbs_mr *m = calloc(1, sizeof(*m));

	if (!m)
		return -ENOMEM;
	errno = 0;
	if (!(m->mr = ibv_reg_mr(p->pd, addr, len, access_of(access)))) {
		free(m);
		return neg_errno(EINVAL);
	}
	*info = (struct verbs_mr_info){ .lkey = m->mr->lkey, .rkey = m->mr->rkey,
					.addr = (uintptr_t)m->mr->addr,
					.length = m->mr->length };
	*out = m;
	return 0;
}

static int real_dereg_mr(struct verbs_mr *m)
{
	int r = ibv_dereg_mr(m->mr);

	if (r)
		return -r;
	free(m);
	return 0;
}

static int real_alloc_mw(struct verbs_pd *p, struct verbs_mw **out)
{
	struct verbs_mw *w = calloc(1, sizeof(*w));

	if (!w)
		return -ENOMEM;
	errno = 0;
	if (!(w->mw = ibv_alloc_mw(p->pd, IBV_MW_TYPE_2))) {
		free(w);
		return neg_errno(EOPNOTSUPP);
	}
	w->rkey = w->mw->rkey;
	*out = w;
	return 0;
}

static int real_dealloc_mw(struct verbs_mw *w)
{
	int r = ibv_dealloc_mw(w->mw);

	if (r)
		return -r;
	free(w);
	return 0;
}

static int real_create_cq(struct verbs_ctx *c, uint32_t depth,
			  struct verbs_cq **out, int *fd)
{
	struct verbs_cq *q = calloc(1, sizeof(*q));
	int fl, r;

	if (!q)
		return -ENOMEM;
	errno = 0;
	if (!(q->ch = ibv_create_comp_channel(c->ctx))) {
		r = neg_errno(ENOMEM);
		goto fail;
	}
	fl = fcntl(q->ch->fd, F_GETFL);
	if (fl < 0 || fcntl(q->ch->fd, F_SETFL, fl | O_NONBLOCK) < 0) {
		r = -errno;
		goto fail;
	}
	errno = 0;
	if (!(q->cq = ibv_create_cq(c->ctx, (int)depth, q, q->ch, 0))) {
		r = neg_errno(ENOMEM);
		goto fail;
	}
	*fd = q->ch->fd;
	*out = q;
	return 0;
fail:
	if (q->ch)
		ibv_destroy_comp_channel(q->ch);
	free(q);
	return r;
}

static int real_destroy_cq(struct verbs_cq *q)
{
	int r = ibv_destroy_cq(q->cq);

	if (r)
		return -r;
	ibv_destroy_comp_channel(q->ch);
	free(q);
	return 0;
}

static int real_req_notify(struct verbs_cq *q)
{
	int r = ibv_req_notify_cq(q->cq, 0);

	return r ? -r : 0;
}

static int real_get_cq_event(struct verbs_cq *q)
{
	struct ibv_cq *cq;
	void *ctx;

	if (ibv_get_cq_event(q->ch, &cq, &ctx) < 0)
		return errno == EAGAIN || errno == EWOULDBLOCK ? -EAGAIN : neg_errno(EIO);
	ibv_ack_cq_events(cq, 1);
	return 0;
}

static enum verbs_wc_status status_of(enum ibv_wc_status s)
{
	switch (s) {
	case IBV_WC_SUCCESS: return VERBS_WC_SUCCESS;
	case IBV_WC_LOC_LEN_ERR: return VERBS_WC_LOC_LEN_ERR;
	case IBV_WC_LOC_PROT_ERR: return VERBS_WC_LOC_PROT_ERR;
	case IBV_WC_WR_FLUSH_ERR: return VERBS_WC_WR_FLUSH_ERR;
	case IBV_WC_REM_ACCESS_ERR: return VERBS_WC_REM_ACCESS_ERR;
	case IBV_WC_REM_OP_ERR: return VERBS_WC_REM_OP_ERR;
	case IBV_WC_RETRY_EXC_ERR: return VERBS_WC_RETRY_EXC_ERR;
	case IBV_WC_RNR_RETRY_EXC_ERR: return VERBS_WC_RNR_RETRY_EXC_ERR;
	case IBV_WC_MW_BIND_ERR: return VERBS_WC_MW_BIND_ERR;
	default: return VERBS_WC_GENERAL_ERR;
	}
}

static enum verbs_wc_opcode opcode_of(const struct ibv_wc *w)
{
	if (w->status != IBV_WC_SUCCESS && w->opcode >= IBV_WC_RECV)
		return VERBS_WC_RECV;
	switch (w->opcode) {
	case IBV_WC_RECV_RDMA_WITH_IMM: return VERBS_WC_RECV_RDMA_WITH_IMM;
	case IBV_WC_BIND_MW: return VERBS_WC_BIND_MW;
	case IBV_WC_LOCAL_INV: return VERBS_WC_LOCAL_INV;
	case IBV_WC_RECV: return VERBS_WC_RECV;
	default: return VERBS_WC_RDMA_WRITE;
	}
}

static int real_poll_cq(struct verbs_cq *q, int n, struct verbs_wc *wc)
{
	struct ibv_wc w[16];
	int got = 0;

	while (got < n) {
		int k = ibv_poll_cq(q->cq, n - got < 16 ? n - got : 16, w);

		if (k < 0)
			return got ? got : -EIO;
		for (int i = 0; i < k; i++)
			wc[got + i] = (struct verbs_wc){
				.wr_id = w[i].wr_id,
				.status = status_of(w[i].status),
				.opcode = opcode_of(&w[i]),
				.qp_num = w[i].qp_num,
				.byte_len = w[i].byte_len,
				.imm = be32toh(w[i].imm_data),
				.has_imm = (w[i].wc_flags & IBV_WC_WITH_IMM) != 0,
			};
		got += k;
		if (k < 16)
			break;
	}
	return got;
}

static int real_create_qp(struct verbs_pd *p, struct verbs_cq *scq,
			  struct verbs_cq *rcq, struct verbs_qp_caps *caps,
			  struct verbs_qp **out, uint32_t *qpn)
{
	struct ibv_qp_init_attr a = {
		.send_cq = scq->cq,
		.recv_cq = rcq->cq,
		.cap = { .max_send_wr = caps->max_send_wr,
			 .max_recv_wr = caps->max_recv_wr,
			 .max_send_sge = 4, .max_recv_sge = 1,
			 .max_inline_data = caps->max_inline },
		.qp_type = IBV_QPT_RC,
		.sq_sig_all = 0,
	};
	struct verbs_qp *q = calloc(1, sizeof(*q));

	if (!q)
		return -ENOMEM;
	errno = 0;
	if (!(q->qp = ibv_create_qp(p->pd, &a))) {
		free(q);
		return neg_errno(EINVAL);
	}
	/* the provider wrote back what it granted (never less than asked) */
	caps->max_send_wr = a.cap.max_send_wr;
	caps->max_recv_wr = a.cap.max_recv_wr;
	caps->max_inline = a.cap.max_inline_data;
	*qpn = q->qp->qp_num;
	*out = q;
	return 0;
}

static int real_destroy_qp(struct verbs_qp *q)
{
	int r = ibv_destroy_qp(q->qp);

	if (r)
		return -r;
	free(q);
	return 0;
}

static int real_qp_init(struct verbs_qp *q, uint8_t port, unsigned access)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .pkey_index = 0,
				 .port_num = port,
				 .qp_access_flags = access_of(access) };
	int r = ibv_modify_qp(q->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
			      IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);

	return r ? -r : 0;
}

static enum ibv_mtu mtu_of(uint32_t bytes)
{
	return bytes >= 4096 ? IBV_MTU_4096 : bytes >= 2048 ? IBV_MTU_2048 :
	       bytes >= 1024 ? IBV_MTU_1024 : bytes >= 512 ? IBV_MTU_512 :
	       IBV_MTU_256;
}

static int real_qp_rtr(struct verbs_qp *q, uint8_t port, int gid_index,
		       const struct verbs_qp_dest *d)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_RTR,
		.path_mtu = mtu_of(d->mtu),
		.dest_qp_num = d->qpn,
		.rq_psn = d->psn,
		.max_dest_rd_atomic = 1,
		.min_rnr_timer = 12,
		.ah_attr = { .dlid = d->lid, .sl = 0, .src_path_bits = 0,
			     .port_num = port, .is_global = 1,
			     .grh = { .sgid_index = (uint8_t)gid_index,
				      .hop_limit = 64 } },
	};
	int r;

	memcpy(a.ah_attr.grh.dgid.raw, d->gid.raw, 16);
	r = ibv_modify_qp(q->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
			  IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
			  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
	return r ? -r : 0;
}

static int real_qp_rts(struct verbs_qp *q, uint32_t psn)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_RTS, .timeout = 14,
				 .retry_cnt = 7, .rnr_retry = 7,
				 .sq_psn = psn, .max_rd_atomic = 1 };
	int r = ibv_modify_qp(q->qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT |
			      IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
			      IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);

	return r ? -r : 0;
}

static int real_qp_err(struct verbs_qp *q)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_ERR };
	int r = ibv_modify_qp(q->qp, &a, IBV_QP_STATE);

	return r ? -r : 0;
}

static int real_qp_state(struct verbs_qp *q, enum verbs_qp_state *out)
{
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;
	int r = ibv_query_qp(q->qp, &a, IBV_QP_STATE, &ia);

	if (r)
		return -r;
	switch (a.qp_state) {
	case IBV_QPS_RESET: *out = VERBS_QPS_RESET; break;
	case IBV_QPS_INIT: *out = VERBS_QPS_INIT; break;
	case IBV_QPS_RTR: *out = VERBS_QPS_RTR; break;
	case IBV_QPS_RTS: *out = VERBS_QPS_RTS; break;
	default: *out = VERBS_QPS_ERR; break;
	}
	return 0;
}

static int real_post_send(struct verbs_qp *q, const struct verbs_send_wr *wr)
{
	struct ibv_sge sg[4];
	struct ibv_send_wr w = { 0 }, *bad = NULL;

	if (wr->num_sge > 4)
		return -EINVAL;
	for (uint32_t i = 0; i < wr->num_sge; i++)
		sg[i] = (struct ibv_sge){ .addr = wr->sg[i].addr,
					  .length = wr->sg[i].length,
					  .lkey = wr->sg[i].lkey };
	w.wr_id = wr->wr_id;
	w.sg_list = sg;
	w.num_sge = (int)wr->num_sge;
	w.opcode = wr->opcode == VERBS_WR_RDMA_WRITE_WITH_IMM ?
		   IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
	w.send_flags = (wr->signaled ? IBV_SEND_SIGNALED : 0) |
		       (wr->inline_data ? IBV_SEND_INLINE : 0);
	w.imm_data = htobe32(wr->imm);
	w.wr.rdma.remote_addr = wr->remote_addr;
	w.wr.rdma.rkey = wr->rkey;
	return -ibv_post_send(q->qp, &w, &bad);
}

static int real_post_recv(struct verbs_qp *q, uint64_t wr_id)
{
	struct ibv_recv_wr w = { .wr_id = wr_id, .sg_list = NULL, .num_sge = 0 };
	struct ibv_recv_wr *bad = NULL;

	return -ibv_post_recv(q->qp, &w, &bad);
}

static int real_bind_mw(struct verbs_qp *q, struct verbs_mw *mw,
			struct verbs_mr *mr, uint64_t addr, uint64_t len,
			unsigned access, uint64_t wr_id, uint32_t *rkey)
{
	struct ibv_send_wr w = { 0 }, *bad = NULL;
	uint32_t key = ibv_inc_rkey(mw->rkey);
	int r;

	w.wr_id = wr_id;
	w.opcode = IBV_WR_BIND_MW;
	w.send_flags = IBV_SEND_SIGNALED;
	w.bind_mw.mw = mw->mw;
	w.bind_mw.rkey = key;
	w.bind_mw.bind_info.mr = mr->mr;
	w.bind_mw.bind_info.addr = addr;
	w.bind_mw.bind_info.length = len;
	w.bind_mw.bind_info.mw_access_flags = (unsigned)access_of(access);
	r = ibv_post_send(q->qp, &w, &bad);
	if (r)
		return -r;
	mw->rkey = key;
	*rkey = key;
	return 0;
}

static int real_invalidate(struct verbs_qp *q, uint32_t rkey, uint64_t wr_id)
{
	struct ibv_send_wr w = { 0 }, *bad = NULL;

	w.wr_id = wr_id;
	w.opcode = IBV_WR_LOCAL_INV;
	w.send_flags = IBV_SEND_SIGNALED;
	w.invalidate_rkey = rkey;
	return -ibv_post_send(q->qp, &w, &bad);
}

static const struct verbs_ops real_ops = {
	.name = "ibverbs",
	.open = real_open,
	.close = real_close,
	.query_device = real_query_device,
	.query_port = real_query_port,
	.query_gid = real_query_gid,
	.alloc_pd = real_alloc_pd,
	.dealloc_pd = real_dealloc_pd,
	.reg_mr = real_reg_mr,
	.dereg_mr = real_dereg_mr,
	.alloc_mw = real_alloc_mw,
	.dealloc_mw = real_dealloc_mw,
	.create_cq = real_create_cq,
	.destroy_cq = real_destroy_cq,
	.req_notify = real_req_notify,
	.get_cq_event = real_get_cq_event,
	.poll_cq = real_poll_cq,
	.create_qp = real_create_qp,
	.destroy_qp = real_destroy_qp,
	.qp_init = real_qp_init,
	.qp_rtr = real_qp_rtr,
	.qp_rts = real_qp_rts,
	.qp_err = real_qp_err,
	.qp_state = real_qp_state,
	.post_send = real_post_send,
	.post_recv = real_post_recv,
	.bind_mw = real_bind_mw,
	.invalidate = real_invalidate,
};

const struct verbs_ops *verbs_real_ops(void)
{
	return &real_ops;
}
