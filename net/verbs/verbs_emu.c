/* verbs_emu.c - an RDMA device in userspace, with the RC rules kvd needs.
 *
 * Design. The transport's safety argument rests on what a reliable-
 * connected queue pair promises, not on a particular NIC, so the
 * emulation keeps exactly those promises and lets a test decide the one
 * thing a real NIC decides alone: *when* a write lands.
 *
 * - Each context is one process's NIC: a Unix datagram socket bound at
 *   DIR/emu-<id>, its GID naming that id. Registered memory belongs to
 *   the process that registered it; a remote write is a packet that the
 *   responder's process applies to its own memory. Two kvd processes
 *   (prefill and decode) thus use the emulation like two hosts.
 * - A write is cut into packets of at most EMU_SEG bytes, all queued at
 *   post time (the data is read then, as a NIC reads it by DMA before
 *   completing). Packets leave at every pump (non-blocking: a datagram
 *   queue that is full keeps them here); the receiver reads them at every
 *   pump into whole writes, in arrival order.
 * - A write lands when the responder delivers it (verbs_emu_deliver, or
 *   every pump in auto mode), with the responder's checks *at that
 *   moment*: the destination QP exists, is RTR/RTS and is connected to
 *   the sender (else dropped: the sender sees RETRY_EXC_ERR); the rkey
 *   names an MR with remote write access or a valid type-2 window bound
 *   for this QP, and [addr, addr + len) lies inside it (else the NIC
 *   refuses: nothing lands, REM_ACCESS_ERR, the responder QP goes to
 *   ERR); a WRITE_WITH_IMM consumes a posted receive (else nothing lands,
 *   RNR_RETRY_EXC_ERR). So a window invalidated, or a QP moved to ERR,
 *   before delivery refuses a write posted long before - and a write
 *   delivered after the *sender* gave up (timeout, flush) still lands,
 *   which is the late write the transport must fence against.
 * - Completions per QP come in posting order: a send WR completes when
 *   its acknowledgement arrives (writes) or at once (bind, invalidate),
 *   but leaves the send queue only behind every earlier one. An error
 *   completion moves the QP to ERR; ERR flushes every outstanding send
 *   and receive WR (WR_FLUSH_ERR) and drops its packets not yet sent.
 *   Late acknowledgements of flushed WRs are ignored.
 * - Limits: registrations past max_mr_size fail (-EINVAL); posting past
 *   max_send_wr outstanding fails (-ENOMEM); a QP asking for more inline
 *   bytes than the device's max_inline (default 256) is refused (-EINVAL),
 *   else granted the want rounded up to 64 bytes (at most max_inline) and
 *   told so, as a provider writes back cap.max_inline_data; inline data
 *   past the QP's grant fails (-EINVAL); a CQ that overflows reports
 *   -EOVERFLOW.
 * - The completion channel is an eventfd, written once per req_notify
 *   when a completion arrives, as ibv_req_notify_cq arms a CQ once.
 *
 * Choices where real devices differ: a write to a QP that is gone or not
 * ready is answered with RETRY_EXC_ERR at once (a real requester retries
 * until its timeout); a remote access error also moves the responder QP
 * to ERR (conservative: the transport tears the link down either way).
 * One thread uses a context. Nothing here is for production traffic.
 */
#include "net/verbs/verbs_emu.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "conf/list.h"
#include "conf/util.h"

#define EMU_MAGIC 0x6b76656du     /* "kvem" */
#define EMU_SEG (16u * 1024)      /* payload bytes per packet */
#define EMU_MAX_MSG (1u << 30)    /* largest write accepted from the wire */
#define EMU_INBOUND_MAX (512ull << 20) /* bytes read ahead, not yet applied */
#define EMU_INLINE_UNIT 64u       /* inline grants are multiples of it */

enum { PKT_WRITE = 1, PKT_ACK = 2 };
enum { PF_FIRST = 1, PF_LAST = 2, PF_IMM = 4 };

struct emu_pkt {
	uint32_t magic;
	uint8_t type;
	uint8_t flags;
	uint16_t pad;
	uint64_t src_id;          /* sender context */
	uint32_t src_qpn;
	uint32_t dst_qpn;
	uint64_t msn;             /* message number on the sending QP */
	uint64_t remote_addr;
	uint32_t rkey;
	uint32_t imm;
	uint32_t total_len;
	uint32_t offset;
	uint32_t seg_len;
	uint32_t status;          /* ACK: enum verbs_wc_status */
};

struct emu_out {                  /* a packet waiting to leave */
	struct kvd_list link;
	uint64_t dst_id;
	uint32_t src_qpn;         /* PKT_WRITE: dropped if the QP errs */
	uint64_t msn;
	uint8_t type;
	size_t len;
	uint8_t buf[];
};

struct emu_msg {                  /* a write arriving or arrived */
	struct kvd_list link;
	struct emu_pkt h;         /* of its first packet */
	uint32_t have;
	uint8_t *data;
	uint64_t t_arrived_ns;    /* complete (hold_ms counts from here) */
	bool held;                /* lands hold_ms after t_arrived_ns */
};


struct verbs_ctx {
	char dir[96];
	struct sockaddr_un addr;
	uint64_t id;
	int sock;
	struct verbs_dev_attr attr;
	uint32_t max_inline;
	uint64_t short_mr;        /* test: registrations past it are cut to it */
	uint64_t hold_ns;         /* test (auto mode): a write lands this long
				   * after it arrived - a slow fabric */
	uint32_t mtu;             /* the port's active MTU */
	bool autodeliver;
	bool no_flush;            /* test: the error state's flush completions
				   * are never delivered (a faulty device) */
	uint32_t next_qpn;
	uint32_t next_index;
	struct kvd_list qps, mrs, mws, out, partial, inbound;
	uint64_t inbound_bytes;
	struct verbs_emu_stats stats;
};

struct verbs_pd {
	struct verbs_ctx *ctx;
	unsigned users;
};

struct verbs_mr {
	struct kvd_list link;
	struct verbs_pd *pd;
	uint64_t addr, len;
	unsigned access;
	uint32_t lkey, rkey;
	unsigned windows;         /* type-2 windows bound to it */
};

struct verbs_mw {
	struct kvd_list link;
	struct verbs_pd *pd;
	uint32_t rkey;
	bool valid;
	struct verbs_mr *mr;
	uint64_t addr, len;
	unsigned access;
	uint32_t qpn;             /* the QP whose peer may use it */
};

struct verbs_cq {
	struct verbs_ctx *ctx;
	uint32_t depth, head, count;
	struct verbs_wc *ring;
	bool armed, overflow;
	int efd;
	unsigned users;
};

struct emu_swr {
	uint64_t wr_id;
	uint64_t msn;
	enum verbs_wc_opcode opcode;
	enum verbs_wc_status status;
	bool done, signaled;
};

struct verbs_qp {
	struct kvd_list link;
	struct verbs_ctx *ctx;
	struct verbs_pd *pd;
	struct verbs_cq *scq, *rcq;
	struct verbs_qp_caps caps;
	uint32_t qpn;
	enum verbs_qp_state state;
	unsigned access;          /* remote access allowed (INIT) */
	struct verbs_qp_dest dest;
	uint64_t dest_id;
	uint64_t next_msn;
	struct emu_swr *sq;       /* ring of caps.max_send_wr */
	uint32_t sq_head, sq_count;
	uint64_t *rq;             /* ring of caps.max_recv_wr wr_ids */
	uint32_t rq_head, rq_count;
};

/* ---- addresses ---------------------------------------------------------- */

static int emu_addr(const char *dir, uint64_t id, struct sockaddr_un *sa)
{
	int n;

	memset(sa, 0, sizeof(*sa));
	sa->sun_family = AF_UNIX;
	n = snprintf(sa->sun_path, sizeof(sa->sun_path), "%s/emu-%016llx",
		     dir, (unsigned long long)id);
	return n < 0 || (size_t)n >= sizeof(sa->sun_path) ? -ENAMETOOLONG : 0;
}

static void gid_of(uint64_t id, struct verbs_gid *g)
{
	static const uint8_t prefix[8] = { 'k', 'v', 'd', 'e', 'm', 'u', 0, 0 };

	memcpy(g->raw, prefix, 8);
	for (int i = 0; i < 8; i++)
		g->raw[8 + i] = (uint8_t)(id >> (56 - 8 * i));
}

static int id_of(const struct verbs_gid *g, uint64_t *id)
{
	struct verbs_gid ref;

	gid_of(0, &ref);
	if (memcmp(g->raw, ref.raw, 8) != 0)
		return -EINVAL;
	*id = 0;
	for (int i = 0; i < 8; i++)
		*id = (*id << 8) | g->raw[8 + i];
	return 0;
}

/* ---- completion queues -------------------------------------------------- */

static void cq_push(struct verbs_cq *cq, const struct verbs_wc *wc)
{
	if (cq->count == cq->depth) {
		cq->overflow = true;
		return;
	}
	cq->ring[(cq->head + cq->count) % cq->depth] = *wc;
	cq->count++;
	if (cq->armed) {
		uint64_t one = 1;

		cq->armed = false;
		if (write(cq->efd, &one, sizeof(one)) < 0) {
			/* an eventfd at its maximum is still readable */
		}
	}
}

/* ---- queue pairs: send queue order, errors, flushes ---------------------- */

static struct emu_swr *sq_at(struct verbs_qp *qp, uint32_t i)
{
	return &qp->sq[(qp->sq_head + i) % qp->caps.max_send_wr];
}

/* Completed WRs leave the send queue in posting order. */
static void sq_retire(struct verbs_qp *qp)
{
	while (qp->sq_count > 0 && sq_at(qp, 0)->done) {
		struct emu_swr *w = sq_at(qp, 0);

		if ((w->signaled || w->status != VERBS_WC_SUCCESS) &&
		    !(w->status == VERBS_WC_WR_FLUSH_ERR && qp->ctx->no_flush)) {
			struct verbs_wc wc = { .wr_id = w->wr_id,
					       .status = w->status,
					       .opcode = w->opcode,
					       .qp_num = qp->qpn };
			cq_push(qp->scq, &wc);
		}
		qp->sq_head = (qp->sq_head + 1) % qp->caps.max_send_wr;
		qp->sq_count--;
	}
}

static void out_drop_qp(struct verbs_ctx *ctx, uint32_t qpn)
{
	struct kvd_list *pos, *nxt;

	kvd_list_for_each_safe(pos, nxt, &ctx->out) {
		struct emu_out *o = kvd_list_entry(pos, struct emu_out, link);

		if (o->type == PKT_WRITE && o->src_qpn == qpn) {
			kvd_list_del(&o->link);
			free(o);
		}
	}
}

/* The error state: every outstanding WR is flushed, and the packets of
 * this QP that have not left are dropped (a QP in error sends nothing). */
static void qp_set_err(struct verbs_qp *qp)
{
	qp->state = VERBS_QPS_ERR;
	for (uint32_t i = 0; i < qp->sq_count; i++) {
		struct emu_swr *w = sq_at(qp, i);

		if (!w->done) {
			w->done = true;
			w->status = VERBS_WC_WR_FLUSH_ERR;
		}
	}
	sq_retire(qp);
	while (qp->rq_count > 0) {
		struct verbs_wc wc = { .wr_id = qp->rq[qp->rq_head],
				       .status = VERBS_WC_WR_FLUSH_ERR,
				       .opcode = VERBS_WC_RECV,
				       .qp_num = qp->qpn };

		if (!qp->ctx->no_flush)
			cq_push(qp->rcq, &wc);
		qp->rq_head = (qp->rq_head + 1) % qp->caps.max_recv_wr;
		qp->rq_count--;
	}
	out_drop_qp(qp->ctx, qp->qpn);
}

/* A send WR ends with status; an error takes the QP to ERR. */
static void swr_finish(struct verbs_qp *qp, struct emu_swr *w,
		       enum verbs_wc_status st)
{
	w->done = true;
	w->status = st;
	if (st != VERBS_WC_SUCCESS)
		qp_set_err(qp);
	else
		sq_retire(qp);
}

static struct verbs_qp *qp_find(struct verbs_ctx *ctx, uint32_t qpn)
{
	struct kvd_list *pos;

	kvd_list_for_each(pos, &ctx->qps) {
		struct verbs_qp *qp = kvd_list_entry(pos, struct verbs_qp, link);

		if (qp->qpn == qpn)
			return qp;
	}
	return NULL;
}

/* ---- the wire ------------------------------------------------------------ */

static int out_queue(struct verbs_ctx *ctx, uint64_t dst_id,
		     const struct emu_pkt *h, const void *payload)
{
	struct emu_out *o = malloc(sizeof(*o) + sizeof(*h) + h->seg_len);

	if (!o)
		return -ENOMEM;
	o->dst_id = dst_id;
	o->src_qpn = h->src_qpn;
	o->msn = h->msn;
	o->type = h->type;
	o->len = sizeof(*h) + h->seg_len;
	memcpy(o->buf, h, sizeof(*h));
	if (payload && h->seg_len)
		memcpy(o->buf + sizeof(*h), payload, h->seg_len);
	kvd_list_add_tail(&ctx->out, &o->link);
	return 0;
}

/* A write whose far end is gone (no socket): it can never be answered. */
static void out_unreachable(struct verbs_ctx *ctx, const struct emu_out *o)
{
	struct verbs_qp *qp;

	if (o->type != PKT_WRITE)
		return;
	qp = qp_find(ctx, o->src_qpn);
	if (!qp || qp->state == VERBS_QPS_ERR)
		return;
	for (uint32_t i = 0; i < qp->sq_count; i++) {
		struct emu_swr *w = sq_at(qp, i);

		if (!w->done && w->msn == o->msn) {
			swr_finish(qp, w, VERBS_WC_RETRY_EXC_ERR);
			return;
		}
	}
}

static void out_flush(struct verbs_ctx *ctx)
{
	while (!kvd_list_empty(&ctx->out)) {
		struct emu_out *o = kvd_list_entry(ctx->out.next, struct emu_out, link);
		struct sockaddr_un sa;
		ssize_t n;

		if (emu_addr(ctx->dir, o->dst_id, &sa) < 0)
			n = -1, errno = ENOENT;
		else
			n = sendto(ctx->sock, o->buf, o->len, MSG_DONTWAIT,
				   (struct sockaddr *)&sa, sizeof(sa));
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
			return;
		kvd_list_del(&o->link);
		if (n < 0)
			out_unreachable(ctx, o);   /* may drop other packets */
		free(o);
	}
}

static void ack_send(struct verbs_ctx *ctx, const struct emu_pkt *w,
		     enum verbs_wc_status st)
{
	struct emu_pkt a = { .magic = EMU_MAGIC, .type = PKT_ACK,
			     .src_id = ctx->id, .src_qpn = w->dst_qpn,
			     .dst_qpn = w->src_qpn, .msn = w->msn,
			     .status = (uint32_t)st };

	if (out_queue(ctx, w->src_id, &a, NULL) < 0) {
		/* out of memory: the ack is lost, the sender's WR stays
		 * outstanding until its QP goes to ERR (a lost ack) */
	}
}

static void ack_recv(struct verbs_ctx *ctx, const struct emu_pkt *a)
{
	struct verbs_qp *qp = qp_find(ctx, a->dst_qpn);

	if (!qp || qp->state == VERBS_QPS_ERR || a->status >= VERBS_WC__COUNT ||
	    a->src_id != qp->dest_id || a->src_qpn != qp->dest.qpn)
		return;            /* late (flushed), foreign or malformed */
	for (uint32_t i = 0; i < qp->sq_count; i++) {
		struct emu_swr *w = sq_at(qp, i);

		if (!w->done && w->opcode == VERBS_WC_RDMA_WRITE && w->msn == a->msn) {
			swr_finish(qp, w, (enum verbs_wc_status)a->status);
			return;
		}
	}
}

static struct emu_msg *partial_find(struct verbs_ctx *ctx, const struct emu_pkt *h)
{
	struct kvd_list *pos;

	kvd_list_for_each(pos, &ctx->partial) {
		struct emu_msg *m = kvd_list_entry(pos, struct emu_msg, link);

		if (m->h.src_id == h->src_id && m->h.src_qpn == h->src_qpn &&
		    m->h.msn == h->msn)
			return m;
	}
	return NULL;
}

/* What a write being assembled holds. */
static uint64_t partial_cost(const struct emu_pkt *h)
{
	return (uint64_t)h->total_len + sizeof(struct emu_msg);
}

static void msg_free(struct emu_msg *m)
{
	kvd_list_del(&m->link);
	free(m->data);
	free(m);
}

/* hold_ms: a write is held when DIR/hold exists as it arrives - the
 * test turns the slow fabric on and off by creating and removing that
 * file (a node whose link a late write tore down then serves its next
 * request on a new link at full speed). */
static bool emu_hold_on(const struct verbs_ctx *ctx)
{
	char path[sizeof(ctx->dir) + 8];

	snprintf(path, sizeof(path), "%s/hold", ctx->dir);
	return access(path, F_OK) == 0;
}

/* One write packet read: assemble; a whole write joins the inbound queue.
 * Malformed packets are dropped (the wire is local, but never trusted). */
static void write_recv(struct verbs_ctx *ctx, const struct emu_pkt *h,
		       const uint8_t *payload)
{
	struct emu_msg *m;

	if (h->total_len > EMU_MAX_MSG || h->seg_len > EMU_SEG ||
	    h->offset > h->total_len || h->seg_len > h->total_len - h->offset)
		return;
	if (h->flags & PF_FIRST) {
		struct verbs_qp *qp = qp_find(ctx, h->dst_qpn);
		uint64_t cost = partial_cost(h);

		if (h->offset != 0)
			return;
		/* only the connected peer of an existing QP may make this
		 * NIC hold a write in assembly, and all of them together at
		 * most VERBS_EMU_PARTIAL_MAX: anyone who can reach the socket
		 * could otherwise make it allocate without bound */
		if (!qp || h->src_id != qp->dest_id || h->src_qpn != qp->dest.qpn ||
		    cost > VERBS_EMU_PARTIAL_MAX - ctx->stats.partial_bytes) {
			ctx->stats.dropped++;
			return;
		}
		m = calloc(1, sizeof(*m));
		if (!m)
			return;
		m->h = *h;
		kvd_list_init(&m->link);
		if (h->total_len && !(m->data = malloc(h->total_len))) {
			free(m);
			return;
		}
		kvd_list_add_tail(&ctx->partial, &m->link);
		ctx->stats.partial_bytes += cost;
	} else {
		m = partial_find(ctx, h);
		if (!m || h->offset != m->have)
			return;
	}
	if (h->seg_len)
		memcpy(m->data + h->offset, payload, h->seg_len);
	m->have += h->seg_len;
	if (h->flags & PF_LAST) {
		kvd_list_del(&m->link);
		ctx->stats.partial_bytes -= partial_cost(&m->h);
		if (m->have != m->h.total_len) {
			free(m->data);
			free(m);
			return;
		}
		m->t_arrived_ns = kvd_now_ns();
		if (ctx->hold_ns && emu_hold_on(ctx))
			m->held = true;
		kvd_list_add_tail(&ctx->inbound, &m->link);
		ctx->inbound_bytes += m->h.total_len;
	}
}

static void in_read(struct verbs_ctx *ctx)
{
	static _Thread_local uint8_t buf[sizeof(struct emu_pkt) + EMU_SEG];

	while (ctx->inbound_bytes < EMU_INBOUND_MAX) {
		ssize_t n = recv(ctx->sock, buf, sizeof(buf), MSG_DONTWAIT);
		struct emu_pkt h;

		if (n < 0)
			return;    /* EAGAIN: nothing more for now */
		if ((size_t)n < sizeof(h))
			continue;
		memcpy(&h, buf, sizeof(h));
		if (h.magic != EMU_MAGIC || (size_t)n != sizeof(h) + h.seg_len)
			continue;
		if (h.type == PKT_ACK)
			ack_recv(ctx, &h);
		else if (h.type == PKT_WRITE)
			write_recv(ctx, &h, buf + sizeof(h));
	}
}

/* The responder's NIC: may this write land now? */
static bool write_allowed(struct verbs_ctx *ctx, struct verbs_qp *qp,
			  const struct emu_pkt *h)
{
	uint64_t a = h->remote_addr, len = h->total_len;
	struct kvd_list *pos;

	if (len == 0)
		return true;       /* a zero-length write touches no memory */
	if (!(qp->access & VERBS_ACCESS_REMOTE_WRITE) || a + len < a)
		return false;
	kvd_list_for_each(pos, &ctx->mrs) {
		struct verbs_mr *mr = kvd_list_entry(pos, struct verbs_mr, link);

		if (mr->rkey == h->rkey && mr->pd == qp->pd)
			return (mr->access & VERBS_ACCESS_REMOTE_WRITE) &&
			       a >= mr->addr && a + len <= mr->addr + mr->len;
	}
	kvd_list_for_each(pos, &ctx->mws) {
		struct verbs_mw *mw = kvd_list_entry(pos, struct verbs_mw, link);

		if (mw->rkey == h->rkey)
			return mw->valid && mw->qpn == qp->qpn &&
			       (mw->access & VERBS_ACCESS_REMOTE_WRITE) &&
			       a >= mw->addr && a + len <= mw->addr + mw->len;
	}
	return false;
}

static void write_apply(struct verbs_ctx *ctx, struct emu_msg *m)
{
	const struct emu_pkt *h = &m->h;
	struct verbs_qp *qp = qp_find(ctx, h->dst_qpn);

	if (!qp || (qp->state != VERBS_QPS_RTR && qp->state != VERBS_QPS_RTS) ||
	    qp->dest_id != h->src_id || qp->dest.qpn != h->src_qpn) {
		ctx->stats.dropped++;
		ack_send(ctx, h, VERBS_WC_RETRY_EXC_ERR);
		return;
	}
	if (!write_allowed(ctx, qp, h)) {
		ctx->stats.refused++;
		qp_set_err(qp);
		ack_send(ctx, h, VERBS_WC_REM_ACCESS_ERR);
		return;
	}
	if ((h->flags & PF_IMM) && qp->rq_count == 0) {
		ctx->stats.rnr++;
		ack_send(ctx, h, VERBS_WC_RNR_RETRY_EXC_ERR);
		return;
	}
	if (h->total_len)
		memcpy((void *)(uintptr_t)h->remote_addr, m->data, h->total_len);
	ctx->stats.applied++;
	if (h->flags & PF_IMM) {
		struct verbs_wc wc = { .wr_id = qp->rq[qp->rq_head],
				       .status = VERBS_WC_SUCCESS,
				       .opcode = VERBS_WC_RECV_RDMA_WITH_IMM,
				       .qp_num = qp->qpn,
				       .byte_len = h->total_len,
				       .imm = h->imm, .has_imm = true };

		qp->rq_head = (qp->rq_head + 1) % qp->caps.max_recv_wr;
		qp->rq_count--;
		cq_push(qp->rcq, &wc);
	}
	ack_send(ctx, h, VERBS_WC_SUCCESS);
}

static int deliver(struct verbs_ctx *ctx, unsigned n, bool held)
{
	unsigned done = 0;
	uint64_t now = held && ctx->hold_ns ? kvd_now_ns() : 0;

	while (done < n && !kvd_list_empty(&ctx->inbound)) {
		struct emu_msg *m = kvd_list_entry(ctx->inbound.next, struct emu_msg, link);

		/* in order: nothing overtakes a write still held */
		if (now && m->held && now - m->t_arrived_ns < ctx->hold_ns)
			break;
		ctx->inbound_bytes -= m->h.total_len;
		kvd_list_del(&m->link);
		write_apply(ctx, m);
		msg_free(m);
		done++;
	}
	out_flush(ctx);
	return (int)done;
}

bool verbs_emu_out_pending(struct verbs_ctx *ctx)
{
	return ctx && (!kvd_list_empty(&ctx->out) ||
		       (ctx->autodeliver && ctx->hold_ns &&
			!kvd_list_empty(&ctx->inbound)));
}

int verbs_emu_pump(struct verbs_ctx *ctx)
{
	out_flush(ctx);
	in_read(ctx);
	if (ctx->autodeliver)
		deliver(ctx, ~0u, true);
	out_flush(ctx);
	return 0;
}

int verbs_emu_deliver(struct verbs_ctx *ctx, unsigned n)
{
	out_flush(ctx);
	in_read(ctx);
	return deliver(ctx, n, false);
}

unsigned verbs_emu_arrived(struct verbs_ctx *ctx)
{
	struct kvd_list *pos;
	unsigned n = 0;

	out_flush(ctx);
	in_read(ctx);
	kvd_list_for_each(pos, &ctx->inbound)
		n++;
	return n;
}

int verbs_emu_inject(struct verbs_qp *qp, enum verbs_wc_status status)
{
	if (status == VERBS_WC_SUCCESS || status >= VERBS_WC__COUNT)
		return -EINVAL;
	for (uint32_t i = 0; i < qp->sq_count; i++) {
		struct emu_swr *w = sq_at(qp, i);

		if (!w->done) {
			swr_finish(qp, w, status);
			return 0;
		}
	}
	return -ENOENT;
}

int verbs_emu_wire_fd(struct verbs_ctx *ctx)
{
	return ctx->sock;
}

void verbs_emu_stats(struct verbs_ctx *ctx, struct verbs_emu_stats *out)
{
	*out = ctx->stats;
}

/* ---- device -------------------------------------------------------------- */

/* "emu:DIR[,key=value...]" */
static int parse_dev(struct verbs_ctx *ctx, const char *dev)
{
	char buf[256], *save = NULL, *tok;

	if (!dev || strncmp(dev, "emu:", 4) != 0 || strlen(dev + 4) >= sizeof(buf))
		return -EINVAL;
	strcpy(buf, dev + 4);
	tok = strtok_r(buf, ",", &save);
	if (!tok || strlen(tok) >= sizeof(ctx->dir))
		return -EINVAL;
	strcpy(ctx->dir, tok);
	while ((tok = strtok_r(NULL, ",", &save))) {
		char *eq = strchr(tok, '=');
		uint64_t v;

		if (!eq || kvd_parse_u64(eq + 1, &v) < 0)
			return -EINVAL;
		*eq = 0;
		if (!strcmp(tok, "max_mr_size") && v > 0)
			ctx->attr.max_mr_size = v;
		else if (!strcmp(tok, "mw") && v <= 1)
			ctx->attr.mw_type2 = v;
		else if (!strcmp(tok, "max_qp_wr") && v > 0 && v <= 65536)
			ctx->attr.max_qp_wr = (uint32_t)v;
		else if (!strcmp(tok, "max_inline") && v <= 4096)
			ctx->max_inline = (uint32_t)v;
		else if (!strcmp(tok, "mtu") && v >= 256 && v <= 4096 && !(v & (v - 1)))
			ctx->mtu = (uint32_t)v;
		else if (!strcmp(tok, "short_mr") && v > 0)
			ctx->short_mr = v;
		else if (!strcmp(tok, "auto") && v <= 1)
			ctx->autodeliver = v;
		else if (!strcmp(tok, "hold_ms") && v <= 60000)
			ctx->hold_ns = v * 1000000ull;
		else if (!strcmp(tok, "flush") && v <= 1)
			ctx->no_flush = !v;

		else
			return -EINVAL;
	}
	return 0;
}

static void emu_close(struct verbs_ctx *ctx);

/* DIR is the wire: whoever may write it may unlink a context's socket and
 * bind one of their own under its name, or plant the name a peer sends
 * to. So it must be this user's own directory, writable by nobody else
 * (not even a sticky world-writable one, where a stranger can still take
 * a name first). The check is on the directory the path names now; its
 * parents are the operator's (a private directory inside one others may
 * rename things in is not private). -EPERM, or the errno of opening it. */
static int emu_dir_private(const char *dir)
{
	struct stat st;
	bool ok;
	int fd;

	fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	ok = !fstat(fd, &st) && st.st_uid == geteuid() && kvd_dir_owner_only(fd);
	close(fd);
	return ok ? 0 : -EPERM;
}

static int emu_open(const char *dev, struct verbs_ctx **out)
{
	struct verbs_ctx *ctx = calloc(1, sizeof(*ctx));
	int r;

	*out = NULL;
	if (!ctx)
		return -ENOMEM;
	ctx->sock = -1;
	kvd_list_init(&ctx->qps);
	kvd_list_init(&ctx->mrs);
	kvd_list_init(&ctx->mws);
	kvd_list_init(&ctx->out);
	kvd_list_init(&ctx->partial);
	kvd_list_init(&ctx->inbound);
	ctx->attr = (struct verbs_dev_attr){ .max_mr_size = 1ull << 40,
					     .max_qp_wr = 1024, .max_cqe = 65536,
					     .max_sge = 4, .mw_type2 = true,
					     .phys_port_cnt = 1 };
	ctx->max_inline = 256;
	ctx->mtu = 4096;
	ctx->next_qpn = 0x100;
	ctx->next_index = 1;
	r = parse_dev(ctx, dev);
	if (r < 0)
		goto fail;
	r = emu_dir_private(ctx->dir);
	if (r < 0)
		goto fail;
	if (getrandom(&ctx->id, sizeof(ctx->id), 0) != sizeof(ctx->id)) {
		r = -errno;
		goto fail;
	}
	r = emu_addr(ctx->dir, ctx->id, &ctx->addr);
	if (r < 0)
		goto fail;
	ctx->sock = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (ctx->sock < 0 ||
	    bind(ctx->sock, (struct sockaddr *)&ctx->addr, sizeof(ctx->addr)) < 0) {
		r = -errno;
		if (ctx->sock >= 0)
			close(ctx->sock);
		ctx->sock = -1;
		goto fail;
	}
	*out = ctx;
	return 0;
fail:
	free(ctx);
	return r;
}

static void emu_close(struct verbs_ctx *ctx)
{
	if (!ctx)
		return;
	while (!kvd_list_empty(&ctx->out)) {
		struct emu_out *o = kvd_list_entry(ctx->out.next, struct emu_out, link);

		kvd_list_del(&o->link);
		free(o);
	}
	while (!kvd_list_empty(&ctx->partial))
		msg_free(kvd_list_entry(ctx->partial.next, struct emu_msg, link));
	while (!kvd_list_empty(&ctx->inbound))
		msg_free(kvd_list_entry(ctx->inbound.next, struct emu_msg, link));
	if (ctx->sock >= 0) {
		close(ctx->sock);
		unlink(ctx->addr.sun_path);
	}
	free(ctx);
}

static int emu_query_device(struct verbs_ctx *ctx, struct verbs_dev_attr *out)
{
	verbs_emu_pump(ctx);
	*out = ctx->attr;
	return 0;
}

static int emu_query_port(struct verbs_ctx *ctx, uint8_t port,
			  struct verbs_port_attr *out)
{
	if (port != 1)
		return -EINVAL;
	*out = (struct verbs_port_attr){ .active = true, .active_mtu = ctx->mtu,
					 .lid = 0, .gid_tbl_len = 1 };
	return 0;
}

static int emu_query_gid(struct verbs_ctx *ctx, uint8_t port, int index,
			 struct verbs_gid *out)
{
	if (port != 1 || index != 0)
		return -EINVAL;
	gid_of(ctx->id, out);
	return 0;
}

static int emu_alloc_pd(struct verbs_ctx *ctx, struct verbs_pd **out)
{
	struct verbs_pd *pd = calloc(1, sizeof(*pd));

	if (!pd)
		return -ENOMEM;
	pd->ctx = ctx;
	*out = pd;
	return 0;
}

static int emu_dealloc_pd(struct verbs_pd *pd)
{
	if (pd->users)
		return -EBUSY;
	free(pd);
	return 0;
}

static uint32_t next_key(struct verbs_ctx *ctx)
{
	return (ctx->next_index++ << 8) & 0xffffff00u;
}

static int emu_reg_mr(struct verbs_pd *pd, void *addr, size_t len,
		      unsigned access, struct verbs_mr **out,
		      struct verbs_mr_info *info)
{
	struct verbs_ctx *ctx = pd->ctx;
	struct verbs_mr *mr;

	if (!addr || len == 0 || len > ctx->attr.max_mr_size ||
	    (uintptr_t)addr + len < (uintptr_t)addr)
		return -EINVAL;
	/* remote write needs local write, as in ibv_reg_mr */
	if ((access & VERBS_ACCESS_REMOTE_WRITE) && !(access & VERBS_ACCESS_LOCAL_WRITE))
		return -EINVAL;
	if ((access & VERBS_ACCESS_MW_BIND) && !ctx->attr.mw_type2)
		return -EINVAL;
	mr = calloc(1, sizeof(*mr));
	if (!mr)
		return -ENOMEM;
	mr->pd = pd;
	mr->addr = (uintptr_t)addr;
	/* a faulty device that registers less than asked (and says so in
	 * the length it reports): for the callers' checks */
	mr->len = ctx->short_mr && len > ctx->short_mr ? ctx->short_mr : len;
	mr->access = access;
	mr->lkey = mr->rkey = next_key(ctx);
	kvd_list_add_tail(&ctx->mrs, &mr->link);
	pd->users++;
	*out = mr;
	*info = (struct verbs_mr_info){ .lkey = mr->lkey, .rkey = mr->rkey,
					.addr = mr->addr, .length = mr->len };
	return 0;
}

static int emu_dereg_mr(struct verbs_mr *mr)
{
	if (mr->windows)
		return -EBUSY;
	kvd_list_del(&mr->link);
	mr->pd->users--;
	free(mr);
	return 0;
}

static int emu_alloc_mw(struct verbs_pd *pd, struct verbs_mw **out)
{
	struct verbs_mw *mw;

	if (!pd->ctx->attr.mw_type2)
		return -EOPNOTSUPP;
	mw = calloc(1, sizeof(*mw));
	if (!mw)
		return -ENOMEM;
	mw->pd = pd;
	mw->rkey = next_key(pd->ctx);
	kvd_list_add_tail(&pd->ctx->mws, &mw->link);
	pd->users++;
	*out = mw;
	return 0;
}

static void mw_unbind(struct verbs_mw *mw)
{
	if (mw->valid) {
		mw->valid = false;
		mw->mr->windows--;
		mw->mr = NULL;
	}
}

static int emu_dealloc_mw(struct verbs_mw *mw)
{
	mw_unbind(mw);
	kvd_list_del(&mw->link);
	mw->pd->users--;
	free(mw);
	return 0;
}

static int emu_create_cq(struct verbs_ctx *ctx, uint32_t depth,
			 struct verbs_cq **out, int *fd)
{
	struct verbs_cq *cq;

	if (depth == 0 || depth > ctx->attr.max_cqe)
		return -EINVAL;
	cq = calloc(1, sizeof(*cq));
	if (!cq)
		return -ENOMEM;
	cq->ring = calloc(depth, sizeof(*cq->ring));
	cq->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (!cq->ring || cq->efd < 0) {
		int r = cq->efd < 0 ? -errno : -ENOMEM;

		if (cq->efd >= 0)
			close(cq->efd);
		free(cq->ring);
		free(cq);
		return r;
	}
	cq->ctx = ctx;
	cq->depth = depth;
	*out = cq;
	*fd = cq->efd;
	return 0;
}

static int emu_destroy_cq(struct verbs_cq *cq)
{
	if (cq->users)
		return -EBUSY;
	close(cq->efd);
	free(cq->ring);
	free(cq);
	return 0;
}

static int emu_req_notify(struct verbs_cq *cq)
{
	cq->armed = true;
	return 0;
}

static int emu_get_cq_event(struct verbs_cq *cq)
{
	uint64_t v;

	if (read(cq->efd, &v, sizeof(v)) != sizeof(v))
		return errno == EAGAIN ? -EAGAIN : -errno;
	return 0;
}

static int emu_poll_cq(struct verbs_cq *cq, int n, struct verbs_wc *wc)
{
	int k = 0;

	verbs_emu_pump(cq->ctx);
	if (cq->overflow)
		return -EOVERFLOW;
	while (k < n && cq->count > 0) {
		wc[k++] = cq->ring[cq->head];
		cq->head = (cq->head + 1) % cq->depth;
		cq->count--;
	}
	return k;
}

static int emu_create_qp(struct verbs_pd *pd, struct verbs_cq *scq,
			 struct verbs_cq *rcq, struct verbs_qp_caps *caps,
			 struct verbs_qp **out, uint32_t *qpn)
{
	struct verbs_ctx *ctx = pd->ctx;
	struct verbs_qp *qp;

	if (caps->max_send_wr == 0 || caps->max_recv_wr == 0 ||
	    caps->max_send_wr > ctx->attr.max_qp_wr ||
	    caps->max_recv_wr > ctx->attr.max_qp_wr ||
	    caps->max_inline > ctx->max_inline || scq->ctx != ctx || rcq->ctx != ctx)
		return -EINVAL;
	qp = calloc(1, sizeof(*qp));
	if (!qp)
		return -ENOMEM;
	qp->sq = calloc(caps->max_send_wr, sizeof(*qp->sq));
	qp->rq = calloc(caps->max_recv_wr, sizeof(*qp->rq));
	if (!qp->sq || !qp->rq) {
		free(qp->sq);
		free(qp->rq);
		free(qp);
		return -ENOMEM;
	}
	qp->ctx = ctx;
	qp->pd = pd;
	qp->scq = scq;
	qp->rcq = rcq;
	/* granted: the inline size rounded up to the send queue's 64-byte
	 * units, within the device's limit (a real provider rounds up to its
	 * WQE layout, so the grant may exceed the want) */
	caps->max_inline = KVD_MIN((caps->max_inline + EMU_INLINE_UNIT - 1) /
				   EMU_INLINE_UNIT * EMU_INLINE_UNIT, ctx->max_inline);
	qp->caps = *caps;
	qp->qpn = ctx->next_qpn++ & 0xffffff;
	qp->state = VERBS_QPS_RESET;
	pd->users++;
	scq->users++;
	rcq->users++;
	kvd_list_add_tail(&ctx->qps, &qp->link);
	*out = qp;
	*qpn = qp->qpn;
	return 0;
}

static int emu_destroy_qp(struct verbs_qp *qp)
{
	struct kvd_list *pos;

	/* windows bound for this QP die with it */
	kvd_list_for_each(pos, &qp->ctx->mws) {
		struct verbs_mw *mw = kvd_list_entry(pos, struct verbs_mw, link);

		if (mw->valid && mw->qpn == qp->qpn)
			mw_unbind(mw);
	}
	out_drop_qp(qp->ctx, qp->qpn);
	kvd_list_del(&qp->link);
	qp->pd->users--;
	qp->scq->users--;
	qp->rcq->users--;
	free(qp->sq);
	free(qp->rq);
	free(qp);
	return 0;
}

static int emu_qp_init(struct verbs_qp *qp, uint8_t port, unsigned access)
{
	if (qp->state != VERBS_QPS_RESET || port != 1)
		return -EINVAL;
	qp->access = access;
	qp->state = VERBS_QPS_INIT;
	return 0;
}

static int emu_qp_rtr(struct verbs_qp *qp, uint8_t port, int gid_index,
		      const struct verbs_qp_dest *dest)
{
	uint64_t id;

	if (qp->state != VERBS_QPS_INIT || port != 1 || gid_index != 0 ||
	    id_of(&dest->gid, &id) < 0 || dest->mtu < 256 || dest->mtu > 4096)
		return -EINVAL;
	qp->dest = *dest;
	qp->dest_id = id;
	qp->state = VERBS_QPS_RTR;
	return 0;
}

static int emu_qp_rts(struct verbs_qp *qp, uint32_t psn)
{
	(void)psn;
	if (qp->state != VERBS_QPS_RTR)
		return -EINVAL;
	qp->state = VERBS_QPS_RTS;
	return 0;
}

static int emu_qp_err(struct verbs_qp *qp)
{
	verbs_emu_pump(qp->ctx);   /* acknowledgements already here count */
	qp_set_err(qp);
	return 0;
}

static int emu_qp_state(struct verbs_qp *qp, enum verbs_qp_state *out)
{
	verbs_emu_pump(qp->ctx);
	*out = qp->state;
	return 0;
}

static struct emu_swr *sq_push(struct verbs_qp *qp, uint64_t wr_id,
			       enum verbs_wc_opcode op, bool signaled)
{
	struct emu_swr *w = sq_at(qp, qp->sq_count);

	*w = (struct emu_swr){ .wr_id = wr_id, .opcode = op, .signaled = signaled };
	qp->sq_count++;
	return w;
}

/* Local key check of a gather list: every byte inside an MR of this PD. */
static bool sge_ok(struct verbs_qp *qp, const struct verbs_sge *sg)
{
	struct kvd_list *pos;

	kvd_list_for_each(pos, &qp->ctx->mrs) {
		struct verbs_mr *mr = kvd_list_entry(pos, struct verbs_mr, link);

		if (mr->lkey == sg->lkey && mr->pd == qp->pd)
			return sg->addr >= mr->addr &&
			       sg->addr + sg->length >= sg->addr &&
			       sg->addr + sg->length <= mr->addr + mr->len;
	}
	return false;
}

static int emu_post_send(struct verbs_qp *qp, const struct verbs_send_wr *wr)
{
	struct verbs_ctx *ctx = qp->ctx;
	struct emu_swr *w;
	uint64_t total = 0;
	uint8_t *data = NULL;
	bool prot_ok = true;
	int r = 0;

	if (qp->state != VERBS_QPS_RTS && qp->state != VERBS_QPS_ERR)
		return -EINVAL;
	if (qp->sq_count == qp->caps.max_send_wr)
		return -ENOMEM;
	if (wr->num_sge > ctx->attr.max_sge ||
	    (wr->opcode != VERBS_WR_RDMA_WRITE &&
	     wr->opcode != VERBS_WR_RDMA_WRITE_WITH_IMM))
		return -EINVAL;
	for (uint32_t i = 0; i < wr->num_sge; i++) {
		total += wr->sg[i].length;
		if (!wr->inline_data && !sge_ok(qp, &wr->sg[i]))
			prot_ok = false;
	}
	if (total > EMU_MAX_MSG || (wr->inline_data && total > qp->caps.max_inline))
		return -EINVAL;
	/* the NIC reads the data now (inline: the CPU copies it) */
	if (qp->state == VERBS_QPS_RTS && prot_ok && total &&
	    !(data = malloc(total)))
		return -ENOMEM;
	w = sq_push(qp, wr->wr_id, VERBS_WC_RDMA_WRITE, wr->signaled);
	w->msn = qp->next_msn++;
	if (qp->state == VERBS_QPS_ERR) {
		swr_finish(qp, w, VERBS_WC_WR_FLUSH_ERR);
		return 0;
	}
	if (!prot_ok) {
		swr_finish(qp, w, VERBS_WC_LOC_PROT_ERR);
		return 0;
	}
	for (uint64_t i = 0, off = 0; i < wr->num_sge; i++) {
		if (wr->sg[i].length)
			memcpy(data + off, (const void *)(uintptr_t)wr->sg[i].addr,
			       wr->sg[i].length);
		off += wr->sg[i].length;
	}
	for (uint64_t off = 0;;) {
		uint32_t seg = (uint32_t)KVD_MIN(total - off, (uint64_t)EMU_SEG);
		struct emu_pkt h = {
			.magic = EMU_MAGIC, .type = PKT_WRITE,
			.flags = (uint8_t)((off == 0 ? PF_FIRST : 0) |
				 (off + seg == total ? PF_LAST : 0) |
				 (wr->opcode == VERBS_WR_RDMA_WRITE_WITH_IMM ? PF_IMM : 0)),
			.src_id = ctx->id, .src_qpn = qp->qpn,
			.dst_qpn = qp->dest.qpn, .msn = w->msn,
			.remote_addr = wr->remote_addr, .rkey = wr->rkey,
			.imm = wr->imm, .total_len = (uint32_t)total,
			.offset = (uint32_t)off, .seg_len = seg,
		};

		r = out_queue(ctx, qp->dest_id, &h, data ? data + off : NULL);
		if (r < 0)
			break;
		off += seg;
		if (off == total)
			break;
	}
	free(data);
	if (r < 0) {
		/* a write half queued must not half land: err the QP */
		qp_set_err(qp);
		return 0;
	}
	out_flush(ctx);
	return 0;
}

static int emu_post_recv(struct verbs_qp *qp, uint64_t wr_id)
{
	if (qp->state == VERBS_QPS_RESET)
		return -EINVAL;
	if (qp->rq_count == qp->caps.max_recv_wr)
		return -ENOMEM;
	if (qp->state == VERBS_QPS_ERR) {
		struct verbs_wc wc = { .wr_id = wr_id, .status = VERBS_WC_WR_FLUSH_ERR,
				       .opcode = VERBS_WC_RECV, .qp_num = qp->qpn };

		if (!qp->ctx->no_flush)
			cq_push(qp->rcq, &wc);
		return 0;
	}
	qp->rq[(qp->rq_head + qp->rq_count) % qp->caps.max_recv_wr] = wr_id;
	qp->rq_count++;
	return 0;
}

static int emu_bind_mw(struct verbs_qp *qp, struct verbs_mw *mw,
		       struct verbs_mr *mr, uint64_t addr, uint64_t len,
		       unsigned access, uint64_t wr_id, uint32_t *rkey)
{
	struct emu_swr *w;

	if (qp->state != VERBS_QPS_RTS && qp->state != VERBS_QPS_ERR)
		return -EINVAL;
	if (qp->sq_count == qp->caps.max_send_wr)
		return -ENOMEM;
	w = sq_push(qp, wr_id, VERBS_WC_BIND_MW, true);
	if (qp->state == VERBS_QPS_ERR) {
		swr_finish(qp, w, VERBS_WC_WR_FLUSH_ERR);
		return 0;
	}
	/* a type-2 window binds only when free (invalidated), inside an MR
	 * of the same PD that allows binding */
	if (mw->valid || mw->pd != qp->pd || mr->pd != qp->pd ||
	    !(mr->access & VERBS_ACCESS_MW_BIND) || len == 0 ||
	    addr < mr->addr || addr + len < addr || addr + len > mr->addr + mr->len ||
	    ((access & VERBS_ACCESS_REMOTE_WRITE) &&
	     !(mr->access & VERBS_ACCESS_LOCAL_WRITE))) {
		swr_finish(qp, w, VERBS_WC_MW_BIND_ERR);
		return 0;
	}
	mw->rkey = (mw->rkey & 0xffffff00u) | ((mw->rkey + 1) & 0xffu);
	mw->valid = true;
	mw->mr = mr;
	mr->windows++;
	mw->addr = addr;
	mw->len = len;
	mw->access = access;
	mw->qpn = qp->qpn;
	*rkey = mw->rkey;
	swr_finish(qp, w, VERBS_WC_SUCCESS);
	return 0;
}

static int emu_invalidate(struct verbs_qp *qp, uint32_t rkey, uint64_t wr_id)
{
	struct kvd_list *pos;
	struct emu_swr *w;

	if (qp->state != VERBS_QPS_RTS && qp->state != VERBS_QPS_ERR)
		return -EINVAL;
	if (qp->sq_count == qp->caps.max_send_wr)
		return -ENOMEM;
	w = sq_push(qp, wr_id, VERBS_WC_LOCAL_INV, true);
	if (qp->state == VERBS_QPS_ERR) {
		swr_finish(qp, w, VERBS_WC_WR_FLUSH_ERR);
		return 0;
	}
	kvd_list_for_each(pos, &qp->ctx->mws) {
		struct verbs_mw *mw = kvd_list_entry(pos, struct verbs_mw, link);

		if (mw->valid && mw->rkey == rkey && mw->pd == qp->pd) {
			mw_unbind(mw);
			swr_finish(qp, w, VERBS_WC_SUCCESS);
			return 0;
		}
	}
	swr_finish(qp, w, VERBS_WC_MW_BIND_ERR);
	return 0;
}

static const struct verbs_ops emu_ops = {
	.name = "emu",
	.open = emu_open,
	.close = emu_close,
	.query_device = emu_query_device,
	.query_port = emu_query_port,
	.query_gid = emu_query_gid,
	.alloc_pd = emu_alloc_pd,
	.dealloc_pd = emu_dealloc_pd,
	.reg_mr = emu_reg_mr,
	.dereg_mr = emu_dereg_mr,
	.alloc_mw = emu_alloc_mw,
	.dealloc_mw = emu_dealloc_mw,
	.create_cq = emu_create_cq,
	.destroy_cq = emu_destroy_cq,
	.req_notify = emu_req_notify,
	.get_cq_event = emu_get_cq_event,
	.poll_cq = emu_poll_cq,
	.create_qp = emu_create_qp,
	.destroy_qp = emu_destroy_qp,
	.qp_init = emu_qp_init,
	.qp_rtr = emu_qp_rtr,
	.qp_rts = emu_qp_rts,
	.qp_err = emu_qp_err,
	.qp_state = emu_qp_state,
	.post_send = emu_post_send,
	.post_recv = emu_post_recv,
	.bind_mw = emu_bind_mw,
	.invalidate = emu_invalidate,
};

const struct verbs_ops *verbs_emu_ops(void)
{
	return &emu_ops;
}
