/* verbs_ops.h - the ibverbs calls kvd uses, behind one ops table.
 *
 * Two implementations share this contract: the real one over libibverbs
 * (net/verbs/verbs_real.c, built only when libibverbs is found) and a userspace
 * emulation (net/verbs/verbs_emu.c, always built) that keeps the RC rules the
 * transport depends on, so that the transport and its tests run without
 * RDMA hardware. The transport never includes <infiniband/verbs.h>: the
 * types below are kvd's own, and each implementation translates.
 *
 * Objects are opaque and owned by the caller once created; destroy them
 * in the reverse order (qp, mw, mr, cq, pd, context). Every call returns 0
 * or a negative errno (the real implementation passes libibverbs' errno
 * up unchanged); none of them blocks (the completion channel is
 * non-blocking: get_cq_event answers -EAGAIN when no event is pending).
 * Completions and their statuses are in struct verbs_wc. One thread (the
 * loop thread) uses a context and everything made from it.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct verbs_ctx;
struct verbs_pd;
struct verbs_mr;
struct verbs_mw;
struct verbs_cq;
struct verbs_qp;

struct verbs_dev_attr {
	uint64_t max_mr_size;       /* largest single registration, bytes */
	uint32_t max_qp_wr;         /* work requests per queue */
	uint32_t max_cqe;
	uint32_t max_sge;
	bool mw_type2;              /* type-2 memory windows supported */
	uint8_t phys_port_cnt;
};

struct verbs_port_attr {
	bool active;
	uint32_t active_mtu;        /* bytes: 256 .. 4096 */
	uint16_t lid;               /* 0 on RoCE */
	uint32_t gid_tbl_len;
};

struct verbs_gid {
	uint8_t raw[16];
};

enum verbs_access {
	VERBS_ACCESS_LOCAL_WRITE  = 1u << 0,
	VERBS_ACCESS_REMOTE_WRITE = 1u << 1,
	VERBS_ACCESS_REMOTE_READ  = 1u << 2,
	VERBS_ACCESS_MW_BIND      = 1u << 3,
};

/* What a registration gives: keys and the range actually registered. */
struct verbs_mr_info {
	uint32_t lkey;
	uint32_t rkey;
	uint64_t addr;
	uint64_t length;
};

struct verbs_qp_caps {
	uint32_t max_send_wr;       /* outstanding send WRs (the bound) */
	uint32_t max_recv_wr;
	uint32_t max_inline;        /* bytes a WR may carry inline */
};

/* The far end of an RC queue pair, exchanged out of band (the control
 * link). */
struct verbs_qp_dest {
	uint32_t qpn;
	uint32_t psn;               /* its first packet sequence number */
	uint16_t lid;
	struct verbs_gid gid;
	uint32_t mtu;               /* path MTU, bytes */
};

enum verbs_qp_state {
	VERBS_QPS_RESET,
	VERBS_QPS_INIT,
	VERBS_QPS_RTR,
	VERBS_QPS_RTS,
	VERBS_QPS_ERR,
};

struct verbs_sge {
	uint64_t addr;
	uint32_t length;
	uint32_t lkey;
};

enum verbs_wr_opcode {
	VERBS_WR_RDMA_WRITE,
	VERBS_WR_RDMA_WRITE_WITH_IMM,
};

struct verbs_send_wr {
	uint64_t wr_id;
	enum verbs_wr_opcode opcode;
	const struct verbs_sge *sg;
	uint32_t num_sge;
	uint64_t remote_addr;
	uint32_t rkey;
	uint32_t imm;               /* host order; WRITE_WITH_IMM only */
	bool inline_data;           /* copy the data at post time */
	bool signaled;              /* completion even on success */
};

enum verbs_wc_status {
	VERBS_WC_SUCCESS,
	VERBS_WC_LOC_LEN_ERR,
	VERBS_WC_LOC_PROT_ERR,
	VERBS_WC_WR_FLUSH_ERR,      /* the QP is in the error state */
	VERBS_WC_REM_ACCESS_ERR,    /* the remote NIC refused: nothing landed */
	VERBS_WC_REM_OP_ERR,
	VERBS_WC_RETRY_EXC_ERR,     /* no answer from the far QP */
	VERBS_WC_RNR_RETRY_EXC_ERR, /* the far end had no receive posted */
	VERBS_WC_MW_BIND_ERR,       /* bind or invalidate refused */
	VERBS_WC_GENERAL_ERR,
	VERBS_WC__COUNT
};

enum verbs_wc_opcode {
	VERBS_WC_RDMA_WRITE,
	VERBS_WC_RECV_RDMA_WITH_IMM,
	VERBS_WC_BIND_MW,
	VERBS_WC_LOCAL_INV,
	VERBS_WC_RECV,              /* a flushed receive: opcode unknown */
};

struct verbs_wc {
	uint64_t wr_id;
	enum verbs_wc_status status;
	enum verbs_wc_opcode opcode;
	uint32_t qp_num;
	uint32_t byte_len;          /* received: bytes the write placed */
	uint32_t imm;               /* host order, if has_imm */
	bool has_imm;
};

struct verbs_ops {
	const char *name;

	/* dev: the implementation's device name (NULL: the first device). */
	int (*open)(const char *dev, struct verbs_ctx **out);
	void (*close)(struct verbs_ctx *ctx);
	int (*query_device)(struct verbs_ctx *ctx, struct verbs_dev_attr *out);
	int (*query_port)(struct verbs_ctx *ctx, uint8_t port,
			  struct verbs_port_attr *out);
	int (*query_gid)(struct verbs_ctx *ctx, uint8_t port, int index,
			 struct verbs_gid *out);

	int (*alloc_pd)(struct verbs_ctx *ctx, struct verbs_pd **out);
	int (*dealloc_pd)(struct verbs_pd *pd);
	/* -EINVAL past max_mr_size; info gives the registered range. */
	int (*reg_mr)(struct verbs_pd *pd, void *addr, size_t len,
		      unsigned access, struct verbs_mr **out,
		      struct verbs_mr_info *info);
	int (*dereg_mr)(struct verbs_mr *mr);   /* -EBUSY: windows bound */
	/* Type-2 windows: -EOPNOTSUPP where the device has none. */
	int (*alloc_mw)(struct verbs_pd *pd, struct verbs_mw **out);
	int (*dealloc_mw)(struct verbs_mw *mw);

	/* One completion channel per CQ; fd is non-blocking, readable when
	 * an event is pending (after req_notify and a new completion). */
	int (*create_cq)(struct verbs_ctx *ctx, uint32_t depth,
			 struct verbs_cq **out, int *fd);
	int (*destroy_cq)(struct verbs_cq *cq);
	int (*req_notify)(struct verbs_cq *cq);
	/* Consume (and acknowledge) one event: 0, or -EAGAIN. */
	int (*get_cq_event)(struct verbs_cq *cq);
	/* Up to n completions, oldest first: the count, or -errno. */
	int (*poll_cq)(struct verbs_cq *cq, int n, struct verbs_wc *wc);

	/* caps in: what is wanted; out (on success): what the device
	 * granted, each at least what was wanted (ibv_create_qp's write-back
	 * of cap: a provider may round max_inline up). A want the device
	 * cannot meet is refused (-EINVAL, or the provider's errno). */
	int (*create_qp)(struct verbs_pd *pd, struct verbs_cq *send_cq,
			 struct verbs_cq *recv_cq, struct verbs_qp_caps *caps,
			 struct verbs_qp **out, uint32_t *qpn);
	int (*destroy_qp)(struct verbs_qp *qp);
	/* RESET -> INIT (port, remote access) -> RTR (dest, gid index) ->
	 * RTS (our psn); any -> ERR (outstanding WRs complete as
	 * VERBS_WC_WR_FLUSH_ERR). */
	int (*qp_init)(struct verbs_qp *qp, uint8_t port, unsigned access);
	int (*qp_rtr)(struct verbs_qp *qp, uint8_t port, int gid_index,
		      const struct verbs_qp_dest *dest);
	int (*qp_rts)(struct verbs_qp *qp, uint32_t psn);
	int (*qp_err)(struct verbs_qp *qp);
	int (*qp_state)(struct verbs_qp *qp, enum verbs_qp_state *out);

	/* One WR. -ENOMEM past max_send_wr outstanding, -EINVAL for inline
	 * data past max_inline. */
	int (*post_send)(struct verbs_qp *qp, const struct verbs_send_wr *wr);
	/* A zero-length receive, consumed by a WRITE_WITH_IMM. */
	int (*post_recv)(struct verbs_qp *qp, uint64_t wr_id);
	/* Bind a type-2 window to [addr, addr + len) of mr, for the QP's
	 * peer only; *rkey is the window's new key (valid once the bind's
	 * completion, opcode VERBS_WC_BIND_MW, is seen; always signaled). */
	int (*bind_mw)(struct verbs_qp *qp, struct verbs_mw *mw,
		       struct verbs_mr *mr, uint64_t addr, uint64_t len,
		       unsigned access, uint64_t wr_id, uint32_t *rkey);
	/* Invalidate the window whose key is rkey (a LOCAL_INV WR; always
	 * signaled): writes that arrive after it are refused. */
	int (*invalidate)(struct verbs_qp *qp, uint32_t rkey, uint64_t wr_id);
};

/* The real implementation, or NULL in a build without libibverbs. */
const struct verbs_ops *verbs_real_ops(void);
/* The emulation (net/verbs/verbs_emu.h for its test controls). */
const struct verbs_ops *verbs_emu_ops(void);

/* "success", "flushed", ... (verbs_rc.c) */
const char *verbs_wc_status_name(enum verbs_wc_status s);
