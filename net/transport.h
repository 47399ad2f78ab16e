/* transport.h - the seam KV pages move through (tcp now, verbs later).
 *
 * A transport moves bounded batches of (source page, destination page)
 * from the prefill pool into the decode pool. The control protocol
 * (net/wire/proto_peer.h) never changes with the transport: prefill names the
 * batches it sent in prefill_done, decode checks tags and coverage in its
 * pool at mark_ready, whatever carried the bytes.
 *
 * Sender (prefill): ops->send() takes up to xfer_batch_pages_max() pages
 * of one request. The transport tags each page for its destination
 * (owner = decode's request id, destination page, generation, index,
 * tokens), checksums the batch and queues it. It may read the source
 * pages until the callback fires (tcp sends them zero-copy from the pool;
 * verbs lets the NIC read them): the sender must keep them allocated and
 * unchanged - out of the free list - until then (prefill holds its pages
 * while sends_pending > 0). The callback fires exactly once, on the loop
 * thread, when the batch has left (0: handed to the kernel or the NIC,
 * not necessarily received) or could not (negative errno, e.g.
 * -ECANCELED when the transport closed). If send() returns an error the
 * callback never fires.
 *
 * Receiver (decode): every verified batch is handed to recv.batch(); the
 * owner checks the entries against the request's reservation and writes
 * the pages (verbs: the NIC already did, the owner only checks). A batch
 * that fails its checksum goes to recv.bad_batch() (its header is not
 * trusted); so does a batch that fails to authenticate on a sealed link,
 * after which the stream is broken and recv.closed() follows.
 * recv.closed() fires once when the data path is gone.
 *
 * Lifetime: ops->close() starts closing; pending send callbacks fire
 * (with -ECANCELED if they had not left), then close's callback; only then
 * may the owner call ops->free(). Every callback runs on the loop thread.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "conf/log.h"
#include "gpu/kv/kvmem.h"
#include "gpu/kv/kvpool.h"
#include "net/fault.h"
#include "net/peer_auth.h"
#include "net/xfer.h"

enum {
	TRANSPORT_E_BOUND = 1,  /* more pages than one batch may carry */
	TRANSPORT_E_CLOSED,     /* the transport is closing */
};

/* transport_cfg.verbs_inline: ask the device (conf's
 * KVD_VERBS_INLINE_AUTO, the same value) */
#define TRANSPORT_VERBS_INLINE_AUTO UINT32_MAX

struct transport;
struct proto_peer_run;

typedef void (*transport_sent_cb)(void *arg, int status);

/* One page to move. */
struct transport_page {
	uint32_t src_page;          /* page in the sender's pool */
	struct xfer_entry dst;      /* where it goes, and its tag values */
};

/* What the verbs transport did, added up by the owner (daemon counters,
 * kvctl status). */
struct transport_verbs_stats {
	uint64_t header_inline;     /* sender: batch headers posted inline */
	uint64_t header_staged;     /* sender: ... from the staging buffer */
	uint64_t credit_waits;      /* sender: batches that waited for a
				     * mailbox credit */
	uint64_t credits_returned;  /* receiver: mailbox slots handed back */
	uint64_t credit_violations; /* a peer broke the credit rule (a batch
				     * in a slot it held no credit for, a
				     * credit for a batch never posted) */
};

struct transport_recv {
	void (*batch)(void *arg, const struct xfer_hdr *h, const uint8_t *batch);
	void (*bad_batch)(void *arg, int code, const struct xfer_hdr *h);
	/* status: 0 clean EOF, XFER_E_* broken stream, negative errno
	 * (verbs: -EPROTO, the peer broke the mailbox's credit rule) */
	void (*closed)(void *arg, int status);
	/* verbs receiver: `consumed` mailbox batches copied out so far on
	 * this link (a running count); the owner sends it as verbs_credit */
	void (*credit)(void *arg, uint64_t consumed);
	/* verbs receiver, memory windows: the binds of request id's scope
	 * completed (status 0: runs are what verbs_scope carries, send it
	 * now) or one failed (status < 0: the transport reports closed()
	 * right after; the request must not be written). Only for a grant
	 * that returned *live = false, at most once, never after a revoke. */
	void (*scope_live)(void *arg, uint64_t id, const struct proto_peer_run *runs,
			   uint32_t n_runs, int status);
	/* verbs receiver, memory windows: every invalidation of request
	 * id's scope completed - the NIC refuses the peer's writes to its
	 * pages from here on. Only after a revoke that returned false, at
	 * most once; never when the link closes first (closed() instead). */
	void (*scope_dead)(void *arg, uint64_t id);
};

struct transport_cfg {
	struct kvpool *pool;        /* local pool: sources or destinations */
	const struct kvmem *mem;    /* the pool's backend (page byte access) */
	uint64_t page_bytes;
	uint64_t max_batch_bytes;   /* negotiated bound */
	bool checksum;              /* sender: checksum batches; receiver:
				     * require checksums */
	struct kvd_fault *fault;    /* may be NULL */
	struct kvlog *log;
	struct transport_recv recv; /* receiver callbacks (may be zero) */
	void *recv_arg;
	/* authenticated links: the data key (net/peer_auth.h) that seals
	 * every batch (sender) and must open every batch (receiver); NULL
	 * on keyless loopback links. The owner keeps it alive as long as
	 * the transport. */
	struct peer_aead *seal;
	/* where to add the time spent checksumming and verifying batches,
	 * in ns (may be NULL; loop thread): the cost of invariant 5, measured */
	uint64_t *checksum_ns;
	/* verbs only (transfer.verbs_*): the device - an ibverbs name ("" or
	 * NULL: the first device) or emu:/DIR[,opts] - the port, the GID
	 * index, send WRs outstanding per QP and the inline bound. */
	const char *verbs_device;
	uint32_t verbs_port;
	uint32_t verbs_gid_index;
	uint32_t verbs_qp_depth;
	uint32_t verbs_inline;      /* or TRANSPORT_VERBS_INLINE_AUTO */
	struct transport_verbs_stats *verbs_stats;  /* may be NULL */
	/* receiver: 0 auto (windows where the device has them), 1 windows,
	 * 2 per-request registrations (enum kvd_verbs_scope's order); how
	 * long close waits for the flush completions (0: 5000 ms) */
	uint32_t verbs_write_scope;
	uint32_t verbs_flush_timeout_ms;
};

struct transport_ops {
	const char *name;
	int (*send)(struct transport *t, uint64_t request_id, uint32_t seq,
		    const struct transport_page *pages, uint32_t n,
		    transport_sent_cb cb, void *arg);
	/* Batches queued whose callback has not fired. */
	uint32_t (*pending)(const struct transport *t);
	/* Bytes queued and not yet handed to the kernel or the NIC: what a
	 * receiver that stops reading makes the sender hold. */
	size_t (*queued)(const struct transport *t);
	void (*close)(struct transport *t, void (*closed)(struct transport *t));
	void (*free)(struct transport *t);
};

struct transport {
	const struct transport_ops *ops;
	struct transport_cfg cfg;
	void *data;                 /* owner's pointer */
};

static inline int transport_send(struct transport *t, uint64_t request_id,
				 uint32_t seq, const struct transport_page *pages,
				 uint32_t n, transport_sent_cb cb, void *arg)
{
	return t->ops->send(t, request_id, seq, pages, n, cb, arg);
}

static inline void transport_close(struct transport *t,
				   void (*closed)(struct transport *t))
{
	t->ops->close(t, closed);
}

/* ---- tcp (net/transport_tcp.c) ------------------------------------------ */

/* A transport on its own TCP data connection. The handle is initialised
 * here; the owner connects or accepts on transport_tcp_stream() and
 * exchanges the data hello, then calls transport_tcp_start(). */
int transport_tcp_new(struct transport **out, uv_loop_t *loop,
		      const struct transport_cfg *cfg);
uv_stream_t *transport_tcp_stream(struct transport *t);
/* The transport whose handle is `st` (the handle's data field is the
 * transport's; owners keep their own pointer in transport.data). */
struct transport *transport_tcp_from_stream(uv_stream_t *st);
/* receiver: read batches; sender: watch for EOF (any byte is an error). */
int transport_tcp_start(struct transport *t, bool receiver);

/* ---- verbs (net/verbs/transport_verbs.c) ---------------------------------------- */

/* Open an RDMA transport on cfg->verbs_device (emu:/DIR: the emulated
 * device, in every build): -ENOTSUP for a real device in a build without
 * ibverbs; -ENODEV when the device cannot be opened ("no RDMA device");
 * -EINVAL when it refuses a configured term (port, GID index, QP depth,
 * inline size; why names the key) or the pool cannot be registered.
 * cfg->recv.batch set: the receiver (decode), else the sender. With
 * cfg->pool NULL (the boot check) only the device and its terms are
 * checked: free it with ops->free. The RC QP is connected by the owner
 * after the verbs_qp exchange on the control link (describe, connect).
 * Close moves the QP to the error state and calls back only once its
 * flush completions are drained: after that nothing can land. */
int transport_verbs_new(struct transport **out, uv_loop_t *loop,
			const struct transport_cfg *cfg, char *why,
			size_t why_size);
bool transport_is_verbs(const struct transport *t);
/* The device's figures for a log line ("device=... max_mr_size=...
 * inline=N inline_granted=N"). */
void transport_verbs_figures(struct transport *t, char *buf, size_t n);
/* The inline size in use: a batch header (WRITE_WITH_IMM) this long or
 * shorter is posted inline - transfer.verbs_inline, or with auto what the
 * device granted. */
uint32_t transport_verbs_inline(const struct transport *t);

struct proto_peer_verbs_qp;
struct proto_peer_run;
/* Our QP for a verbs_qp message; receiver: also its mailbox, the one run
 * a verbs_scope with id 0 names (mailbox may be NULL). */
int transport_verbs_describe(struct transport *t, struct proto_peer_verbs_qp *qp,
			     struct proto_peer_run *mailbox);
/* The peer's verbs_qp: RTR, RTS (receiver: its receives are posted).
 * 0, VERBS_RC_E_* or -errno with a sentence in why. */
int transport_verbs_connect(struct transport *t, const struct proto_peer_verbs_qp *peer,
			    char *why, size_t why_size);
/* Sender: the receiver's mailbox (verbs_scope id 0), once. */
int transport_verbs_set_mailbox(struct transport *t, const struct proto_peer_run *runs,
				uint32_t n_runs, char *why, size_t why_size);
/* Receiver: grant the peer write access to exactly table[0..n) (pages
 * request id owns in the pool) for request id. *live true (per-request
 * registrations): runs (room for VERBS_SCOPE_RUNS_MAX) and *n_runs are
 * what verbs_scope carries, send it now. *live false (windows): binds
 * are posted; recv.scope_live says when they completed - verbs_scope
 * must not be sent before. VERBS_SCOPE_E_* (net/verbs/verbs_scope.h) or
 * -errno: nothing granted. */
int transport_verbs_grant(struct transport *t, uint64_t id,
			  const struct kvpool_ref *table, uint32_t n,
			  struct proto_peer_run *runs, uint32_t *n_runs, bool *live);
/* Receiver: take request id's scope back, before its pages change hands
 * (called while id still owns them). Registrations: the NIC refuses the
 * peer's writes once it returns. Windows: the invalidations are posted
 * and the transport holds one fence on each page of the scope
 * (kvpool_fence) until their completions came - or, after a lost link,
 * until the flush completions were drained - so a page leaves for the
 * free list only once the NIC refuses writes to it. Nothing granted:
 * nothing to do. True when the NIC refuses the peer's writes to the
 * scope now (registrations, nothing granted, nothing left to invalidate);
 * false while invalidations are in flight: recv.scope_dead(id) follows
 * when they completed, or the link closes first. A check of the pages'
 * bytes that must hold for their reader runs only after that (no byte
 * can change between the check and the read). */
bool transport_verbs_revoke(struct transport *t, uint64_t id);
/* After close's callback: whether the flush completions never came
 * within verbs_flush_timeout_ms (the QP was destroyed without them and
 * the pages the transport fenced were quarantined, not unfenced): the
 * owner must quarantine, never unfence, what that link's requests
 * hold. */
bool transport_verbs_flush_timed_out(const struct transport *t);
/* Receiver: the write scope in use ("memory_windows" or
 * "per_request_mr"). */
const char *transport_verbs_scope_mode(const struct transport *t);
/* Sender: the runs decode granted for request id, already checked by
 * the owner against the request's pages (net/verbs/verbs_target.h); batches
 * of id wait for them. */
int transport_verbs_scope(struct transport *t, uint64_t id,
			  const struct proto_peer_run *runs, uint32_t n_runs);
/* Sender: the receiver's verbs_credit: `consumed` of our batches have
 * been copied out of its mailbox (a running count); staged batches wait
 * for a credit (at most one mailbox of them unconsumed). 0, or -EPROTO
 * with a sentence in why when the count goes back or passes the batches
 * posted (a lying receiver: the owner tears the link down). */
int transport_verbs_credit(struct transport *t, uint64_t consumed, char *why,
			   size_t why_size);
/* Sender: request id ends here: its batches not yet staged are
 * cancelled (callback -ECANCELED), its runs forgotten. */
void transport_verbs_forget(struct transport *t, uint64_t id);
