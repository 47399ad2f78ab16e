/* transport_verbs.c - KV batches over an RDMA RC queue pair (ibverbs or
 * the emulated device).
 *
 * Design. Built in every build: it uses the verbs calls only through the
 * ops table (net/verbs/verbs_ops.h), so the emulated device (emu:/DIR[,opts],
 * net/verbs/verbs_emu.c) works where libibverbs is absent and a real device
 * (any other name, or the first device for an empty name) needs the
 * libibverbs table (verbs_real_ops(): NULL without it).
 *
 * Opening checks the configured terms against the device (port active,
 * GID index in its table, an RC QP with transfer.verbs_qp_depth WRs and
 * transfer.verbs_inline inline bytes), so a node is told at boot which key
 * its device cannot meet; then one RC QP is made (INIT) and its CQ's
 * completions come on the loop (net/verbs/verbs_poller.h). The owner (daemon/
 * link.c) exchanges verbs_qp messages on the authenticated control link
 * and calls transport_verbs_connect() with the peer's.
 *
 * Decode (the receiver) registers its pool once (net/verbs/verbs_scope.h;
 * ranges a resize added on their first use) and a *mailbox* of VT_SLOTS slots, each room for one
 * batch's header, entries and MAC, the only memory prefill may write
 * outside a request's scope; it posts one receive per slot and names the
 * mailbox in a verbs_scope with id 0. Per request, grant() returns the
 * runs decode sends in verbs_scope and revoke() takes them back. The
 * write scope (transfer.verbs_write_scope) is per-request registrations
 * (live at grant, dead at revoke, both synchronous) or type-2 memory
 * windows bound on our QP: live when the binds completed (recv.scope_live
 * says so; decode's only send WRs are binds and invalidations, wr_id the
 * request id), dead when the invalidations completed - until then the
 * transport holds a fence on each page of the scope (kvpool_fence), so
 * no page reaches the free list while the NIC could still place a write
 * in it. A failed bind or invalidation ends the data path; the drain
 * (below) then ends every scope.
 *
 * Prefill (the sender) copies a batch's source pages into a registered
 * staging slot, writes each page's destination tag there, builds the
 * xfer header and entries (net/xfer.h) and the batch MAC
 * (net/verbs/verbs_mac.h) over exactly the bytes the stale-tail rule lets a
 * write carry (net/verbs/verbs_extent.h), then posts one RDMA WRITE per extent
 * into the runs decode granted for the request (checked by the owner
 * with verbs_target_check before scope()), and last a WRITE_WITH_IMM of
 * the header, entries and MAC into mailbox slot `imm`. At most
 * transfer.verbs_qp_depth WRs are outstanding (the rest wait here), and
 * at most VT_SLOTS batches are staged at once. A batch's send callback
 * fires when its WRITE_WITH_IMM completed (decode's NIC acknowledged it).
 *
 * On RECV_RDMA_WITH_IMM decode copies the slot's header and entries, and
 * each named page's bytes from its pool, into one batch image (what a TCP
 * batch would have been), verifies the MAC over that copy, reposts the
 * receive and hands the image to recv.batch(): the owner's checks
 * (entries, tags, coverage) are those of the TCP path, and what it
 * believes is the copy, not pool memory the peer could still change.
 * RC ordering means every WRITE of a batch landed before its
 * WRITE_WITH_IMM completed at decode. A MAC failure goes to
 * recv.bad_batch(XFER_E_AUTH); any completion error ends the data path
 * (recv.closed).
 *
 * Keyless links have no data key: their MAC is computed with an all-zero
 * key, an integrity check like the TCP checksum, not authentication.
 *
 * Close moves the QP to the error state and waits until the flush
 * completions of every outstanding WR (sends and posted receives) have
 * been drained: only then does close's callback fire, so the owner may
 * treat it as "nothing more can land" (the Spin model's rule); pending
 * send callbacks fire with -ECANCELED first. The wait is bounded by
 * transfer.verbs_flush_timeout_ms: past it the QP is destroyed, the
 * scope pages still fenced are quarantined (a timer never unfences), and
 * transport_verbs_flush_timed_out() tells the owner to quarantine too.
 *
 * Flow: mailbox credits. The k-th batch on a link (from 0) goes into
 * mailbox slot k mod VT_SLOTS, and prefill may stage it only while fewer
 * than VT_SLOTS of its batches are unconsumed: decode, once it copied a
 * slot out and reposted its receive, returns a credit (the running count
 * of batches consumed, a verbs_credit message through recv.credit; the
 * owner calls transport_verbs_credit on prefill). Batches without a
 * credit wait in prefill's queue (bounded by the owner: a few per
 * request, requests per peer), counted in credit_waits, so a decode that
 * falls behind its NIC slows prefill down instead of meeting a fifth
 * WRITE_WITH_IMM without a posted receive or an overwritten slot. A batch
 * whose immediate names another slot than k mod VT_SLOTS was written
 * without its credit: decode ends the data path with -EPROTO (the owner
 * fails the link's transfers with INTEGRITY; the close drains the flush
 * before the pages are unfenced); a credit for more batches than prefill
 * posted, or one that goes back, is refused likewise on prefill. A plain
 * RDMA WRITE into the mailbox (the peer can aim one there: the mailbox is
 * one registration) fails the batch's MAC, or the next one's.
 *
 * Inline headers: a batch's WRITE_WITH_IMM (header, entries, MAC) is
 * posted inline when it fits the QP's inline size; else the NIC reads it
 * from the registered staging slot. Both are counted
 * (transport_verbs_stats). A number in transfer.verbs_inline is that size
 * (the QP is made with it: a device that cannot grant it refuses the
 * node at boot). auto asks for room for the largest header the batch
 * bound allows (80 + 24 bytes per page), at most VT_INLINE_AUTO_MAX,
 * then 128, 64 and 0 while the device refuses, and takes what the device
 * wrote back (cap.max_inline_data: a provider may grant more than asked)
 * - a header that is larger goes staged, and a device without inline
 * support still gets a QP. The owner resolves auto once (the boot check,
 * transport_verbs_inline) and hands each link's transport that number, so
 * all of a node's QPs use one size.
 */
#include "net/transport.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conf/list.h"
#include "conf/util.h"
#include "net/verbs/verbs_emu.h"
#include "net/verbs/verbs_extent.h"
#include "net/verbs/verbs_mac.h"
#include "net/verbs/verbs_ops.h"
#include "net/verbs/verbs_poller.h"
#include "net/verbs/verbs_rc.h"
#include "net/verbs/verbs_scope.h"
#include "net/verbs/verbs_target.h"

#define VT_SLOTS 4u                 /* mailbox / staging slots */
#define VT_RECV_BIT (1ull << 63)    /* wr_id of a receive */
#define VT_WINDOWS_MAX 4096u        /* type-2 windows per link (decode) */
#define VT_INLINE_AUTO_MAX 256u     /* transfer.verbs_inline=auto asks at most */

struct vt_wr {
	uint64_t laddr;
	uint32_t len;
	uint64_t raddr;
	uint32_t rkey;
	bool imm;
};

/* prefill: one batch, queued (slot < 0) or staged and posting */
struct vt_batch {
	struct kvd_list node;
	uint64_t id;
	uint32_t seq;
	struct transport_page *pages;   /* (n) */
	uint32_t n;
	transport_sent_cb cb;
	void *arg;
	int slot;
	struct vt_wr *wrs;              /* (n_wr) */
	uint32_t n_wr, posted, done;
	uint32_t mslot;                 /* its mailbox slot (the immediate) */
	bool failed;
	bool waited;                    /* counted in credit_waits */
	uint64_t mord;                  /* its place among the link's batches */
	uint8_t late;                   /* fault point verbs_late_write: 1
					 * waits for decode's credit, 2 posted */
};

/* decode: a granted scope; prefill: the runs decode sent */
struct vt_scope {
	struct kvd_list node;
	uint64_t id;
	struct verbs_scope sc;          /* decode */
	struct kvpool_ref *refs;        /* decode: the pages (n_refs), owner id */
	uint32_t n_refs;
	bool revoked;                   /* decode: the owner let go of it */
	bool fenced;                    /* decode: we hold a fence on refs */
	uint64_t t_revoke_ns;           /* decode, windows: invalidations posted */
	bool live_told;                 /* decode: scope_live was called */
	struct proto_peer_run *runs;    /* prefill (n_runs) */
	uint32_t n_runs;
};

struct vt {
	struct transport base;
	const struct verbs_ops *v;
	bool emu;
	bool receiver;
	struct verbs_ctx *ctx;
	struct verbs_pd *pd;
	struct verbs_dev_attr attr;
	struct verbs_rc rc;
	bool rc_open;
	struct verbs_poller poller;
	bool poller_on;
	uv_loop_t *loop;
	unsigned closes_left;           /* handles closing at the end */
	/* fault point verbs_slow_completion: receive completions held (at
	 * most one per mailbox slot: the receives posted) */
	uv_timer_t hold_timer;
	bool hold_timer_on, holding;
	struct verbs_wc held_wc[VT_SLOTS];
	uint32_t n_held;
	struct transport_verbs_stats stats_local;
	struct transport_verbs_stats *stats;
	/* close: the bound on the wait for the flush completions */
	uv_timer_t flush_timer;
	bool flush_timer_on;
	bool flush_timed_out;           /* never drained: quarantine, never unfence */
	uint32_t depth;                 /* send WRs outstanding at most */
	uint32_t inline_max;            /* a write this long or shorter goes
					 * inline: transfer.verbs_inline, or
					 * (auto) what the device granted */
	uint32_t outstanding;           /* send WRs posted, not completed */
	uint32_t recv_posted;
	bool connected;
	bool dead;                      /* a completion error: no more sends */
	bool closing, finished;
	bool closed_reported;
	void (*closed_cb)(struct transport *t);
	struct peer_aead keyless;       /* zero key (keyless links) */
	size_t slot_bytes;              /* header + entries + MAC, rounded */
	uint32_t n_max;                 /* pages per batch */
	struct kvd_list scopes;
	/* decode */
	struct verbs_region region;
	bool region_on;
	uint8_t *mbox;                  /* (VT_SLOTS * slot_bytes) */
	struct verbs_mr *mbox_mr;
	struct verbs_mr_info mbox_mi;
	uint8_t *rxbuf;                 /* (xfer_batch_bytes(n_max)) */
	uint64_t mb_received;           /* WRITE_WITH_IMMs completed, in order */
	uint64_t mb_consumed;           /* ... copied out (credits returned) */
	/* prefill */
	uint8_t *stage;                 /* (VT_SLOTS * (slot_bytes + n_max *
					 * page_bytes)) meta slots, then pages */
	size_t stage_bytes;
	struct verbs_mr *stage_mr;
	struct verbs_mr_info stage_mi;
	struct proto_peer_run mbox_run;
	bool have_mbox;
	bool slot_busy[VT_SLOTS];
	uint32_t next_slot;
	uint64_t mb_posted;             /* batches given a mailbox slot */
	uint64_t mb_credited;           /* ... that decode consumed */
	struct kvd_list queued;         /* vt_batch, slot < 0 */
	struct kvd_list inflight;       /* vt_batch, staged, in post order */
	uint32_t pending;               /* batches whose callback has not fired */
};

static struct vt *to_vt(struct transport *t)
{
	return kvd_container_of(t, struct vt, base);
}

static struct peer_aead *vt_aead(struct vt *vt)
{
	return vt->base.cfg.seal ? vt->base.cfg.seal : &vt->keyless;
}

static void vt_report_closed(struct vt *vt, int status)
{
	if (vt->closed_reported)
		return;
	vt->closed_reported = true;
	if (vt->base.cfg.recv.closed)
		vt->base.cfg.recv.closed(vt->base.cfg.recv_arg, status);
}

static struct vt_scope *vt_scope_find(struct vt *vt, uint64_t id)
{
	struct kvd_list *e;

	kvd_list_for_each(e, &vt->scopes) {
		struct vt_scope *s = kvd_list_entry(e, struct vt_scope, node);

		if (s->id == id)
			return s;
	}
	return NULL;
}

/* ---- the device and its terms ------------------------------------------- */

static int verbs_check_terms(const struct verbs_ops *v, struct verbs_ctx *ctx,
			     const struct transport_cfg *cfg,
			     const struct verbs_dev_attr *a, char *why,
			     size_t why_size)
{
	struct verbs_port_attr pa;

	if (cfg->verbs_qp_depth > a->max_qp_wr) {
		snprintf(why, why_size,
			 "transfer.verbs_qp_depth=%u is above the device's max_qp_wr=%u",
			 cfg->verbs_qp_depth, a->max_qp_wr);
		return -EINVAL;
	}
	if (cfg->verbs_port == 0 || cfg->verbs_port > a->phys_port_cnt ||
	    v->query_port(ctx, (uint8_t)cfg->verbs_port, &pa) < 0) {
		snprintf(why, why_size,
			 "transfer.verbs_port=%u: the device has no such port (%u port%s)",
			 cfg->verbs_port, a->phys_port_cnt,
			 a->phys_port_cnt == 1 ? "" : "s");
		return -EINVAL;
	}
	if (!pa.active) {
		snprintf(why, why_size, "transfer.verbs_port=%u is not active",
			 cfg->verbs_port);
		return -EINVAL;
	}
	if (cfg->verbs_gid_index >= pa.gid_tbl_len) {
		snprintf(why, why_size,
			 "transfer.verbs_gid_index=%u is outside the port's GID table (%u entr%s)",
			 cfg->verbs_gid_index, pa.gid_tbl_len,
			 pa.gid_tbl_len == 1 ? "y" : "ies");
		return -EINVAL;
	}
	return 0;
}

/* ---- sending (prefill) ---------------------------------------------------- */

static uint8_t *vt_stage_meta(struct vt *vt, int slot)
{
	return vt->stage + (size_t)slot * vt->slot_bytes;
}

static uint8_t *vt_stage_page(struct vt *vt, int slot, uint32_t i)
{
	const struct transport_cfg *c = &vt->base.cfg;

	return vt->stage + (size_t)VT_SLOTS * vt->slot_bytes +
	       ((size_t)slot * vt->n_max + i) * c->page_bytes;
}

static void vt_batch_free(struct vt_batch *b)
{
	free(b->pages);
	free(b->wrs);
	free(b);
}

/* The batch's callback, once; the batch leaves every list. */
static void vt_batch_end(struct vt *vt, struct vt_batch *b, int status)
{
	transport_sent_cb cb = b->cb;
	void *arg = b->arg;

	kvd_list_del(&b->node);
	if (b->slot >= 0)
		vt->slot_busy[b->slot] = false;
	vt_batch_free(b);
	vt->pending--;
	cb(arg, status);
}

/* Fault points on a batch's first entry (the sender's own copy: the tag
 * agrees with the lie, decode's entry check must catch it). */
static void vt_fault_entry(const struct transport_cfg *c, struct xfer_entry *e,
			   uint64_t request_id)
{
	if (kvd_fault_fire(c->fault, KVD_FAULT_BAD_ENTRY_INDEX)) {
		KVLOG_WARN(c->log, "fault",
			   "point=bad_entry_index request=%llu index=%u claimed=65535 path=verbs",
			   (unsigned long long)request_id, e->index);
		e->index = 0xffff;
	}
}

/* Mailbox credits (sender): may b take a mailbox slot now? At most
 * VT_SLOTS batches unconsumed by decode; a batch that has to wait is
 * counted once. Fault point verbs_flood: a lying prefill posts anyway. */
static bool vt_credit_ok(struct vt *vt, struct vt_batch *b)
{
	const struct transport_cfg *c = &vt->base.cfg;

	if (vt->mb_posted - vt->mb_credited < VT_SLOTS)
		return true;
	if (kvd_fault_fire(c->fault, KVD_FAULT_VERBS_FLOOD)) {
		KVLOG_WARN(c->log, "fault", "point=verbs_flood request=%llu seq=%u unconsumed=%llu",
			   (unsigned long long)b->id, b->seq,
			   (unsigned long long)(vt->mb_posted - vt->mb_credited));
		return true;
	}
	if (!b->waited) {
		b->waited = true;
		vt->stats->credit_waits++;
	}
	return false;
}

/* The next batch's mailbox slot: the link's batch count mod VT_SLOTS.
 * Fault point verbs_wrong_slot: the slot after it (one decode has not
 * handed back for this batch). */
static uint32_t vt_mailbox_slot(struct vt *vt, const struct vt_batch *b)
{
	const struct transport_cfg *c = &vt->base.cfg;
	uint32_t s = (uint32_t)(vt->mb_posted++ % VT_SLOTS);

	if (kvd_fault_fire(c->fault, KVD_FAULT_VERBS_WRONG_SLOT)) {
		KVLOG_WARN(c->log, "fault", "point=verbs_wrong_slot request=%llu seq=%u slot=%u credited_slot=%u",
			   (unsigned long long)b->id, b->seq, (s + 1) % VT_SLOTS, s);
		s = (s + 1) % VT_SLOTS;
	}
	return s;
}

/* Fault point verbs_write_beside (a lying prefill): the batch's first
 * page goes to the page just past the granted run that holds it, with
 * that run's key - a page of decode's pool this request was not given.
 * Decode's NIC must refuse it (remote access error): nothing lands. */
static void vt_fault_beside(struct vt *vt, const struct vt_scope *sc, uint32_t page,
			    uint64_t *addr, uint64_t request_id)
{
	const struct transport_cfg *c = &vt->base.cfg;

	for (uint32_t i = 0; i < sc->n_runs; i++) {
		const struct proto_peer_run *run = &sc->runs[i];

		if (page < run->first_page || page - run->first_page >= run->n_pages)
			continue;
		if (!kvd_fault_fire(c->fault, KVD_FAULT_VERBS_WRITE_BESIDE))
			return;
		*addr = run->addr + (uint64_t)run->n_pages * c->page_bytes;
		KVLOG_WARN(c->log, "fault", "point=verbs_write_beside request=%llu page=%u beside=%u",
			   (unsigned long long)request_id, page, run->first_page + run->n_pages);
		return;
	}
}

/* A free staging slot, looking from vt->next_slot on: its index, or -1
 * when all VT_SLOTS are busy. */
static int vt_free_slot(const struct vt *vt)
{
	for (uint32_t k = 0; k < VT_SLOTS; k++) {
		uint32_t s = (vt->next_slot + k) % VT_SLOTS;

		if (!vt->slot_busy[s])
			return (int)s;
	}
	return -1;
}

/* b's source pages copied into staging slot `slot`, each with its
 * destination tag, and the header and entries written at m (the slot's
 * meta); mp[i] names staged page i for the MAC. Fault points bad_entry_index
 * and bad_tag on the first page. 0 or -errno. */
static int vt_stage_pages(struct vt *vt, struct vt_batch *b, int slot,
			  uint8_t *m, struct verbs_mac_page *mp)
{
	const struct transport_cfg *c = &vt->base.cfg;
	int r;

	xfer_hdr_write(m, b->id, b->seq, b->n, c->page_bytes, false);
	for (uint32_t i = 0; i < b->n; i++) {
		struct xfer_entry e = b->pages[i].dst;
		uint8_t *dst = vt_stage_page(vt, slot, i);
		void *src = kvpool_page_addr(c->pool, b->pages[i].src_page);
		uint64_t owner = b->id;
		struct kvtag tag;

		if (!src)
			return -EINVAL;
		if (i == 0)
			vt_fault_entry(c, &e, b->id);
		xfer_entry_write(m + XFER_HDR_BYTES + (size_t)i * XFER_ENTRY_BYTES, &e);
		r = c->mem->ops->read(c->mem->ctx, dst, src, c->page_bytes);
		if (r)
			return r;
		if (i == 0 && kvd_fault_fire(c->fault, KVD_FAULT_BAD_TAG)) {
			KVLOG_WARN(c->log, "fault", "point=bad_tag request=%llu page=%u path=verbs",
				   (unsigned long long)b->id, e.dst_page);
			owner = b->id + 1;
		}
		kvtag_make(&tag, owner, e.dst_gen, e.dst_page, e.index, e.tokens);
		memcpy(dst, &tag, sizeof(tag));
		mp[i] = (struct verbs_mac_page){ dst, e.tokens };
	}
	return 0;
}

/* The batch MAC over the meta bytes at m and the staged pages mp, written
 * right after the meta (timed as the checksum is on tcp); then fault
 * point corrupt_batch. 0 or -EINVAL. */
static int vt_stage_seal(struct vt *vt, struct vt_batch *b, int slot, uint8_t *m,
			 size_t meta, const struct verbs_mac_page *mp)
{
	const struct transport_cfg *c = &vt->base.cfg;
	uint64_t t0 = kvd_now_ns();
	int r;

	/* the batch MAC is what the checksum is on tcp: timed alike */
	r = verbs_mac_seal(vt_aead(vt), kvpool_geom(c->pool), m, meta, mp, b->n,
			   m + meta);
	if (c->checksum_ns)
		*c->checksum_ns += kvd_now_ns() - t0;
	if (r)
		return -EINVAL;
	if (kvd_fault_fire(c->fault, KVD_FAULT_CORRUPT_BATCH)) {
		/* after the MAC: position 0 of the first page's first block */
		vt_stage_page(vt, slot, 0)[KVTAG_BYTES] ^= 0x01;
		KVLOG_WARN(c->log, "fault", "point=corrupt_batch request=%llu seq=%u path=verbs",
			   (unsigned long long)b->id, b->seq);
	}
	return 0;
}

/* The RDMA WRITEs of the staged pages: one per extent the stale-tail rule
 * lets a page's write carry (ex: room for ex_max), into the run of sc that
 * decode granted for the entry's destination page. Written to b->wrs from
 * 0; *n_wr is how many. Fault point verbs_write_beside on the first page.
 * 0 or -EINVAL (a page outside the scope is logged). */
static int vt_stage_writes(struct vt *vt, struct vt_batch *b,
			   const struct vt_scope *sc, int slot, const uint8_t *m,
			   struct verbs_extent *ex, uint32_t ex_max, uint32_t *n_wr)
{
	const struct transport_cfg *c = &vt->base.cfg;

	for (uint32_t i = 0; i < b->n; i++) {
		uint32_t dst_page, tokens;
		uint64_t addr;
		uint32_t rkey;
		struct xfer_entry e;
		int k;

		xfer_batch_entry(m, i, &e);
		dst_page = e.dst_page;
		tokens = e.tokens;
		if (verbs_target_find(sc->runs, sc->n_runs, dst_page, c->page_bytes,
				      &addr, &rkey)) {
			KVLOG_WARN(c->log, "verbs_batch_refused",
				   "request=%llu page=%u msg=\"the page is outside the scope decode granted\"",
				   (unsigned long long)b->id, dst_page);
			return -EINVAL;
		}
		if (i == 0)
			vt_fault_beside(vt, sc, dst_page, &addr, b->id);
		k = verbs_extent_page(kvpool_geom(c->pool), tokens, ex, ex_max);
		if (k <= 0)
			return -EINVAL;
		for (int j = 0; j < k; j++)
			b->wrs[(*n_wr)++] = (struct vt_wr){
				.laddr = (uint64_t)(uintptr_t)(vt_stage_page(vt, slot, i) + ex[j].offset),
				.len = (uint32_t)ex[j].length,
				.raddr = addr + ex[j].offset, .rkey = rkey };
	}
	return 0;
}

/* Stage b in a free slot: pages copied, destination tags, header,
 * entries, MAC; then its WR list. 0, 1 (must wait), or -errno (b failed). */
static int vt_stage(struct vt *vt, struct vt_batch *b)
{
	const struct transport_cfg *c = &vt->base.cfg;
	const struct kvpool_geom *g = kvpool_geom(c->pool);
	struct vt_scope *sc = vt_scope_find(vt, b->id);
	struct verbs_mac_page *mp;
	struct verbs_extent *ex;
	uint32_t ex_max = 2 * g->n_layer + 1, n_wr = 0;
	size_t meta;
	uint8_t *m;
	int slot, r;

	if (!vt->connected || !vt->have_mbox || !sc)
		return 1;
	slot = vt_free_slot(vt);
	if (slot < 0)
		return 1;
	if (!vt_credit_ok(vt, b))
		return 1;
	meta = XFER_HDR_BYTES + (size_t)b->n * XFER_ENTRY_BYTES;
	mp = calloc(b->n, sizeof(*mp));
	ex = calloc(ex_max, sizeof(*ex));
	b->wrs = calloc((size_t)b->n * ex_max + 1, sizeof(*b->wrs));
	if (!mp || !ex || !b->wrs) {
		free(mp);
		free(ex);
		return -ENOMEM;
	}
	m = vt_stage_meta(vt, slot);
	r = vt_stage_pages(vt, b, slot, m, mp);
	if (!r)
		r = vt_stage_seal(vt, b, slot, m, meta, mp);
	if (!r)
		r = vt_stage_writes(vt, b, sc, slot, m, ex, ex_max, &n_wr);
	if (r)
		goto fail;
	b->mord = vt->mb_posted;
	b->mslot = vt_mailbox_slot(vt, b);
	b->wrs[n_wr++] = (struct vt_wr){
		.laddr = (uint64_t)(uintptr_t)m, .len = (uint32_t)(meta + XFER_TRAILER_BYTES),
		.raddr = vt->mbox_run.addr + (uint64_t)b->mslot * vt->slot_bytes,
		.rkey = vt->mbox_run.rkey, .imm = true };
	b->n_wr = n_wr;
	b->slot = slot;
	vt->slot_busy[slot] = true;
	vt->next_slot = ((uint32_t)slot + 1) % VT_SLOTS;
	free(mp);
	free(ex);
	return 0;
fail:
	free(mp);
	free(ex);
	free(b->wrs);
	b->wrs = NULL;
	return r;
}

/* Fault points right after a batch's first write was posted: the QP
 * goes to error (or the emulated NIC fails the oldest WR); the flush
 * completions end the data path. True when one fired. */
static bool vt_fault_mid_batch(struct vt *vt, struct vt_batch *b)
{
	const struct transport_cfg *c = &vt->base.cfg;
	bool qp = kvd_fault_fire(c->fault, KVD_FAULT_VERBS_QP_ERROR);
	bool wc = !qp && kvd_fault_fire(c->fault, KVD_FAULT_VERBS_COMPLETION_ERROR);

	if (!qp && !wc)
		return false;
	KVLOG_WARN(c->log, "fault", "point=%s request=%llu seq=%u posted=1 of=%u",
		   qp ? "verbs_qp_error" : "verbs_completion_error",
		   (unsigned long long)b->id, b->seq, b->n_wr);
	if (wc && vt->emu)
		(void)verbs_emu_inject(vt->rc.qp, VERBS_WC_GENERAL_ERR);
	else
		(void)vt->v->qp_err(vt->rc.qp);
	return true;
}

/* A batch's WRITE_WITH_IMM (header, entries, MAC) goes inline when it
 * fits the QP's inline size; counted either way. */
static bool vt_header_inline(struct vt *vt, uint32_t len)
{
	if (len <= vt->inline_max) {
		vt->stats->header_inline++;
		return true;
	}
	vt->stats->header_staged++;
	return false;
}

/* Stage what can be staged, then post WRs in order while the QP has
 * room. */
static void vt_push(struct vt *vt)
{
	struct kvd_list *e, *nxt;

	if (vt->closing || vt->dead)
		return;
	kvd_list_for_each_safe(e, nxt, &vt->queued) {
		struct vt_batch *b = kvd_list_entry(e, struct vt_batch, node);
		int r = vt_stage(vt, b);

		if (r > 0)
			continue;   /* no scope yet, or no slot: later */
		if (r < 0) {
			vt_batch_end(vt, b, r);
			continue;
		}
		kvd_list_del(&b->node);
		kvd_list_add_tail(&vt->inflight, &b->node);
	}
	kvd_list_for_each(e, &vt->inflight) {
		struct vt_batch *b = kvd_list_entry(e, struct vt_batch, node);

		while (b->posted < b->n_wr && vt->outstanding < vt->depth) {
			const struct vt_wr *w = &b->wrs[b->posted];
			struct verbs_sge sge = { .addr = w->laddr, .length = w->len,
						 .lkey = vt->stage_mi.lkey };
			struct verbs_send_wr wr = {
				.wr_id = (uint64_t)(uintptr_t)b,
				.opcode = w->imm ? VERBS_WR_RDMA_WRITE_WITH_IMM
						 : VERBS_WR_RDMA_WRITE,
				.sg = &sge, .num_sge = 1, .remote_addr = w->raddr,
				.rkey = w->rkey, .imm = b->mslot,
				.signaled = true,
				.inline_data = w->imm && vt_header_inline(vt, w->len) };
			int r = vt->v->post_send(vt->rc.qp, &wr);

			if (r) {
				KVLOG_WARN(vt->base.cfg.log, "verbs_post_failed",
					   "request=%llu code=%d", (unsigned long long)b->id, r);
				vt->dead = true;
				vt_report_closed(vt, r);
				return;
			}
			b->posted++;
			vt->outstanding++;
			if (b->posted == 1 && b->n_wr > 1 && vt_fault_mid_batch(vt, b))
				return;
		}
		if (vt->outstanding >= vt->depth)
			break;
	}
	if (vt->poller_on)
		verbs_poller_kick(&vt->poller);
}

static int vt_send(struct transport *t, uint64_t request_id, uint32_t seq,
		   const struct transport_page *pages, uint32_t n,
		   transport_sent_cb cb, void *arg)
{
	struct vt *vt = to_vt(t);
	struct vt_batch *b;

	if (vt->closing || vt->dead || vt->receiver || !vt->connected)
		return TRANSPORT_E_CLOSED;
	if (n == 0 || n > vt->n_max)
		return TRANSPORT_E_BOUND;
	b = calloc(1, sizeof(*b));
	if (!b)
		return -ENOMEM;
	b->pages = malloc(sizeof(*pages) * n);
	if (!b->pages) {
		free(b);
		return -ENOMEM;
	}
	memcpy(b->pages, pages, sizeof(*pages) * n);
	b->n = n;
	b->id = request_id;
	b->seq = seq;
	b->cb = cb;
	b->arg = arg;
	b->slot = -1;
	kvd_list_add_tail(&vt->queued, &b->node);
	vt->pending++;
	vt_push(vt);
	return 0;
}

/* Fault point verbs_late_write (a lying prefill that holds the key):
 * b's WRITE_WITH_IMM completed; once decode's credit says it copied b
 * out of its mailbox - it has checked the batch - one more RDMA WRITE
 * puts NaN (0xff bytes: NaN as f32 and as f16) over position 0 of b's
 * first page's layer-0 K block, through the run the first write used,
 * while decode's scope is still live. b ends (and prefill_done may
 * follow) only once that write completed: it has landed. */
static void vt_fault_late_post(struct vt *vt)
{
	const struct transport_cfg *c = &vt->base.cfg;
	struct kvd_list *e, *nxt;

	kvd_list_for_each_safe(e, nxt, &vt->inflight) {
		struct vt_batch *b = kvd_list_entry(e, struct vt_batch, node);
		const struct vt_wr *w = &b->wrs[0];
		uint32_t len = KVD_MIN(w->len - KVTAG_BYTES, 64u);
		struct verbs_sge sge = { .addr = w->laddr + KVTAG_BYTES, .length = len,
					 .lkey = vt->stage_mi.lkey };
		struct verbs_send_wr wr = {
			.wr_id = (uint64_t)(uintptr_t)b, .opcode = VERBS_WR_RDMA_WRITE,
			.sg = &sge, .num_sge = 1, .remote_addr = w->raddr + KVTAG_BYTES,
			.rkey = w->rkey, .signaled = true };

		if (b->late != 1 || b->mord >= vt->mb_credited || vt->outstanding >= vt->depth)
			continue;
		b->late = 2;
		memset((uint8_t *)(uintptr_t)w->laddr + KVTAG_BYTES, 0xff, len);
		if (vt->v->post_send(vt->rc.qp, &wr)) {
			vt_batch_end(vt, b, 0);
			continue;
		}
		KVLOG_WARN(c->log, "fault", "point=verbs_late_write request=%llu seq=%u bytes=%u",
			   (unsigned long long)b->id, b->seq, len);
		b->n_wr++;
		b->posted++;
		vt->outstanding++;
		if (vt->poller_on)
			verbs_poller_kick(&vt->poller);
	}
}

/* b's writes all completed: hold it for the late write? (once) */
static bool vt_fault_late_hold(struct vt *vt, struct vt_batch *b)
{
	if (b->late || b->n_wr < 2 || b->wrs[0].imm || b->wrs[0].len <= KVTAG_BYTES ||
	    !kvd_fault_fire(vt->base.cfg.fault, KVD_FAULT_VERBS_LATE_WRITE))
		return false;
	b->late = 1;
	vt_fault_late_post(vt);
	return true;
}

/* A send completion: completions come in posting order, so it is the
 * oldest posted-and-not-completed WR, of the batch its wr_id names. */
static void vt_send_wc(struct vt *vt, const struct verbs_wc *wc)
{
	struct vt_batch *b = (struct vt_batch *)(uintptr_t)wc->wr_id;

	if (vt->outstanding)
		vt->outstanding--;
	if (!b)
		return;
	b->done++;
	if (wc->status != VERBS_WC_SUCCESS) {
		if (!b->failed && wc->status != VERBS_WC_WR_FLUSH_ERR)
			KVLOG_WARN(vt->base.cfg.log, "verbs_completion_error",
				   "request=%llu seq=%u status=%s",
				   (unsigned long long)b->id, b->seq,
				   verbs_wc_status_name(wc->status));
		b->failed = true;
		if (!vt->dead) {
			vt->dead = true;
			vt_report_closed(vt, -EIO);
		}
	}
	if (vt->closing)
		return;   /* callbacks fire at the end of the close */
	if (b->done == b->n_wr && !b->failed && vt_fault_late_hold(vt, b))
		return;
	if (b->done == b->n_wr || (b->failed && b->done == b->posted))
		vt_batch_end(vt, b, b->failed ? -EIO : 0);
	vt_push(vt);
}

/* ---- receiving (decode) --------------------------------------------------- */

static int vt_post_recv(struct vt *vt, uint32_t slot)
{
	int r = vt->v->post_recv(vt->rc.qp, VT_RECV_BIT | slot);

	if (r == 0)
		vt->recv_posted++;
	return r;
}

/* One batch's WRITE_WITH_IMM completed: its slot holds the header,
 * entries and MAC; its pages are in the pool. */
static void vt_recv_batch(struct vt *vt, const struct verbs_wc *wc)
{
	const struct transport_cfg *c = &vt->base.cfg;
	const struct kvpool_geom *g = kvpool_geom(c->pool);
	struct verbs_mac_page *mp = NULL;
	uint8_t tag[XFER_TRAILER_BYTES];
	const uint8_t *slot;
	struct xfer_hdr h = { 0 };
	size_t meta;
	int r;

	if (!wc->has_imm || wc->imm >= VT_SLOTS) {
		vt_report_closed(vt, -EPROTO);
		return;
	}
	slot = vt->mbox + (size_t)wc->imm * vt->slot_bytes;
	memcpy(vt->rxbuf, slot, XFER_HDR_BYTES);
	r = xfer_hdr_parse(vt->rxbuf, c->page_bytes, c->max_batch_bytes, &h);
	if (r || h.n_entries > vt->n_max) {
		vt_report_closed(vt, r ? r : XFER_E_BOUND);
		return;
	}
	meta = XFER_HDR_BYTES + (size_t)h.n_entries * XFER_ENTRY_BYTES;
	memcpy(vt->rxbuf + XFER_HDR_BYTES, slot + XFER_HDR_BYTES, meta - XFER_HDR_BYTES);
	memcpy(tag, slot + meta, sizeof(tag));
	/* the slot is copied: its receive goes back at once, and its
	 * credit to prefill */
	if (vt_post_recv(vt, wc->imm)) {
		vt_report_closed(vt, -EIO);
		return;
	}
	vt->mb_consumed++;
	vt->stats->credits_returned++;
	if (c->recv.credit)
		c->recv.credit(c->recv_arg, vt->mb_consumed);
	mp = calloc(h.n_entries, sizeof(*mp));
	if (!mp) {
		vt_report_closed(vt, -ENOMEM);
		return;
	}
	for (uint32_t i = 0; i < h.n_entries; i++) {
		struct xfer_entry e;
		uint8_t *dst = (uint8_t *)xfer_batch_page(vt->rxbuf, &h, i);
		void *src;

		xfer_batch_entry(vt->rxbuf, i, &e);
		src = kvpool_page_addr(c->pool, e.dst_page);
		if (!src || c->mem->ops->read(c->mem->ctx, dst, src, c->page_bytes)) {
			/* a page this pool does not have: the batch cannot be
			 * believed, as if it failed its MAC */
			free(mp);
			if (c->recv.bad_batch)
				c->recv.bad_batch(c->recv_arg, XFER_E_AUTH, &h);
			vt_report_closed(vt, XFER_E_AUTH);
			return;
		}
		mp[i] = (struct verbs_mac_page){ dst, e.tokens };
	}
	{
		uint64_t t0 = kvd_now_ns();

		r = verbs_mac_open(vt_aead(vt), g, vt->rxbuf, meta, mp, h.n_entries, tag);
		if (c->checksum_ns)
			*c->checksum_ns += kvd_now_ns() - t0;
	}
	free(mp);
	if (r) {
		if (c->recv.bad_batch)
			c->recv.bad_batch(c->recv_arg, XFER_E_AUTH, &h);
		vt_report_closed(vt, XFER_E_AUTH);
		return;
	}
	if (vt->poller_on)
		verbs_poller_kick(&vt->poller);
	if (c->recv.batch)
		c->recv.batch(c->recv_arg, &h, vt->rxbuf);
}

/* ---- completions and close ------------------------------------------------ */

/* The peer broke the mailbox's credit rule: the data path ends (-EPROTO:
 * the owner fails the link's transfers with INTEGRITY). */
static void vt_violation(struct vt *vt, const char *why)
{
	KVLOG_WARN(vt->base.cfg.log, "verbs_credit_violation",
		   "side=%s batches_received=%llu batches_consumed=%llu batches_posted=%llu batches_credited=%llu msg=%s",
		   vt->receiver ? "receiver" : "sender",
		   (unsigned long long)vt->mb_received, (unsigned long long)vt->mb_consumed,
		   (unsigned long long)vt->mb_posted, (unsigned long long)vt->mb_credited,
		   KVLOG_Q(why));
	vt->stats->credit_violations++;
	vt->dead = true;
	vt_report_closed(vt, -EPROTO);
}

/* Decode: a batch's WRITE_WITH_IMM completed. The k-th on the link must
 * name mailbox slot k mod VT_SLOTS - the one its credit gave; any other
 * was written without a credit (maybe over a batch not copied out yet). */
static bool vt_slot_credited(struct vt *vt, const struct verbs_wc *wc)
{
	uint32_t want = (uint32_t)(vt->mb_received % VT_SLOTS);
	char why[120];

	if (vt->dead)
		return false;
	if (wc->has_imm && wc->imm == want) {
		vt->mb_received++;
		return true;
	}
	if (wc->has_imm)
		snprintf(why, sizeof(why), "batch %llu written into mailbox slot %u; its credit is for slot %u",
			 (unsigned long long)vt->mb_received, wc->imm, want);
	else
		snprintf(why, sizeof(why), "batch %llu without a mailbox slot",
			 (unsigned long long)vt->mb_received);
	vt_violation(vt, why);
	return false;
}

static void vt_release(struct vt *vt);
static void vt_scope_wc(struct vt *vt, const struct verbs_wc *wc);
static void vt_scope_free(struct vt_scope *s);
static void vt_scope_unfence(struct vt *vt, struct vt_scope *s);
static void vt_scope_quarantine(struct vt *vt, struct vt_scope *s);
static void vt_scope_dead_log(struct vt *vt, const struct vt_scope *s, const char *by);

static void vt_one_closed(struct vt *vt)
{
	if (--vt->closes_left == 0)
		vt_release(vt);
}

static void vt_poller_closed(struct verbs_poller *p)
{
	vt_one_closed(kvd_container_of(p, struct vt, poller));
}

static void vt_timer_closed(uv_handle_t *h)
{
	vt_one_closed(h->data);
}

/* Every flush drained (or nothing was outstanding): free the device
 * objects, fire what is left, then close's callback (after the poller's
 * and the hold timer's handles closed). */
static void vt_finish(struct vt *vt)
{
	if (vt->finished)
		return;
	vt->finished = true;
	vt->closes_left = 1 + vt->poller_on + vt->hold_timer_on + vt->flush_timer_on;
	if (vt->poller_on)
		verbs_poller_close(&vt->poller, vt_poller_closed);
	if (vt->hold_timer_on)
		uv_close((uv_handle_t *)&vt->hold_timer, vt_timer_closed);
	if (vt->flush_timer_on)
		uv_close((uv_handle_t *)&vt->flush_timer, vt_timer_closed);
	vt_one_closed(vt);
}

/* Fault point verbs_slow_completion (decode): the NIC placed a batch,
 * but its completion is handled HOLD_MS later, so that prefill's
 * abort_ack can overtake it - the fence must wait for it. The batch
 * completions that come meanwhile wait behind it, in order (decode
 * falls behind its NIC: no receive is reposted, no credit returned);
 * at most VT_SLOTS of them, the receives posted. */
#define VT_HOLD_MS 500

static void vt_hold_cb(uv_timer_t *t)
{
	struct vt *vt = t->data;

	if (!vt->holding || vt->closing || vt->finished || vt->dead)
		return;
	vt->holding = false;
	for (uint32_t i = 0; i < vt->n_held && !vt->dead && !vt->closing; i++)
		vt_recv_batch(vt, &vt->held_wc[i]);
	vt->n_held = 0;
}

static bool vt_fault_slow_completion(struct vt *vt, const struct verbs_wc *wc)
{
	const struct transport_cfg *c = &vt->base.cfg;

	if (!vt->loop || !kvd_fault_fire(c->fault, KVD_FAULT_VERBS_SLOW_COMPLETION))
		return false;
	if (!vt->hold_timer_on) {
		if (uv_timer_init(vt->loop, &vt->hold_timer))
			return false;
		vt->hold_timer.data = vt;
		vt->hold_timer_on = true;
	}
	KVLOG_WARN(c->log, "fault", "point=verbs_slow_completion slot=%u delay_ms=%u",
		   wc->imm, VT_HOLD_MS);
	vt->held_wc[0] = *wc;
	vt->n_held = 1;
	vt->holding = true;
	uv_timer_start(&vt->hold_timer, vt_hold_cb, VT_HOLD_MS, 0);
	return true;
}

static void vt_drained_check(struct vt *vt)
{
	if (vt->closing && !vt->finished && vt->outstanding == 0 &&
	    vt->recv_posted == 0)
		vt_finish(vt);
}

static void vt_on_wc(void *arg, const struct verbs_wc *wc)
{
	struct vt *vt = arg;

	if (vt->finished)
		return;
	if (wc->wr_id & VT_RECV_BIT) {
		if (vt->recv_posted)
			vt->recv_posted--;
		if (vt->closing) {
			vt_drained_check(vt);
			return;
		}
		if (wc->status != VERBS_WC_SUCCESS) {
			KVLOG_WARN(vt->base.cfg.log, "verbs_completion_error",
				   "side=receive status=%s",
				   verbs_wc_status_name(wc->status));
			vt->dead = true;
			vt_report_closed(vt, -EIO);
			return;
		}
		if (vt->dead)
			return;
		if (!vt_slot_credited(vt, wc))
			return;
		if (vt->holding) {
			/* in order: behind the held batches */
			if (vt->n_held == VT_SLOTS) {
				vt_violation(vt, "more batch completions than receives posted");
				return;
			}
			vt->held_wc[vt->n_held++] = *wc;
			return;
		}
		if (vt_fault_slow_completion(vt, wc))
			return;
		vt_recv_batch(vt, wc);
		return;
	}
	if (wc->wr_id == 0 && wc->status != VERBS_WC_SUCCESS) {
		/* a poll error (CQ overflow): nothing can be trusted now */
		vt->dead = true;
		if (vt->closing) {
			vt->outstanding = vt->recv_posted = 0;
			vt_drained_check(vt);
			return;
		}
		vt_report_closed(vt, -EIO);
		return;
	}
	if (vt->receiver)
		vt_scope_wc(vt, wc);    /* a bind or an invalidation */
	else
		vt_send_wc(vt, wc);
	vt_drained_check(vt);
}

static void vt_release(struct vt *vt)
{
	struct kvd_list *e, *nxt;

	kvd_list_for_each_safe(e, nxt, &vt->inflight)
		vt_batch_end(vt, kvd_list_entry(e, struct vt_batch, node), -ECANCELED);
	kvd_list_for_each_safe(e, nxt, &vt->queued)
		vt_batch_end(vt, kvd_list_entry(e, struct vt_batch, node), -ECANCELED);
	kvd_list_for_each_safe(e, nxt, &vt->scopes) {
		struct vt_scope *s = kvd_list_entry(e, struct vt_scope, node);

		if (vt->region_on)
			verbs_scope_qp_gone(&vt->region, &s->sc);
		/* the flush is drained: nothing more lands through it - unless
		 * it never came, and then the pages stay quarantined */
		if (!vt->flush_timed_out && s->fenced)
			vt_scope_dead_log(vt, s, "flush");
		if (!vt->flush_timed_out)
			vt_scope_unfence(vt, s);
		kvd_list_del(&s->node);
		vt_scope_free(s);
	}
	if (vt->emu && vt->ctx && vt->poller_on) {
		struct verbs_emu_stats st;

		/* what the emulated NIC placed and refused over the link's
		 * life (tests read it: a late write lands nowhere) */
		verbs_emu_stats(vt->ctx, &st);
		KVLOG_INFO(vt->base.cfg.log, "verbs_closed",
			   "side=%s writes_applied=%llu writes_refused=%llu writes_dropped=%llu",
			   vt->receiver ? "receiver" : "sender",
			   (unsigned long long)st.applied, (unsigned long long)st.refused,
			   (unsigned long long)st.dropped);
	}
	if (vt->rc_open)
		verbs_rc_close(&vt->rc);
	vt->rc_open = false;
	if (vt->region_on)
		verbs_region_deinit(&vt->region);
	vt->region_on = false;
	if (vt->mbox_mr)
		vt->v->dereg_mr(vt->mbox_mr);
	vt->mbox_mr = NULL;
	if (vt->stage_mr)
		vt->v->dereg_mr(vt->stage_mr);
	vt->stage_mr = NULL;
	if (vt->pd)
		vt->v->dealloc_pd(vt->pd);
	vt->pd = NULL;
	if (vt->ctx)
		vt->v->close(vt->ctx);
	vt->ctx = NULL;
	if (vt->closed_cb)
		vt->closed_cb(&vt->base);
}

/* The flush completions did not come (or cannot): nothing proves the
 * NIC will not place a write any more, so the pages the transport holds
 * fenced are quarantined (never freed before a restart), the owner is
 * told (transport_verbs_flush_timed_out) to do the same with its
 * requests' pages, and the QP is destroyed. A timer never unfences. */
static void vt_flush_give_up(struct vt *vt, const char *why)
{
	struct kvd_list *e;
	uint32_t pages = 0;

	if (vt->finished)
		return;
	vt->flush_timed_out = true;
	kvd_list_for_each(e, &vt->scopes) {
		struct vt_scope *s = kvd_list_entry(e, struct vt_scope, node);

		if (s->fenced) {
			vt_scope_quarantine(vt, s);
			pages += s->n_refs;
		}
	}
	KVLOG_ERR(vt->base.cfg.log, "verbs_flush_timeout",
		  "side=%s sends_unflushed=%u receives_unflushed=%u timeout_ms=%u scope_pages_quarantined=%u msg=%s",
		  vt->receiver ? "receiver" : "sender", vt->outstanding, vt->recv_posted,
		  vt->base.cfg.verbs_flush_timeout_ms ? vt->base.cfg.verbs_flush_timeout_ms : 5000,
		  pages, KVLOG_Q(why));
	vt->outstanding = vt->recv_posted = 0;
	vt_finish(vt);
}

static void vt_flush_timer_cb(uv_timer_t *t)
{
	vt_flush_give_up(t->data, "the queue pair's flush completions did not come within transfer.verbs_flush_timeout_ms");
}

static void vt_flush_timer_start(struct vt *vt)
{
	uint32_t ms = vt->base.cfg.verbs_flush_timeout_ms ? vt->base.cfg.verbs_flush_timeout_ms
							  : 5000;

	if (vt->finished || vt->flush_timer_on || !vt->loop)
		return;
	if (uv_timer_init(vt->loop, &vt->flush_timer)) {
		vt_flush_give_up(vt, "no timer to bound the flush wait");
		return;
	}
	vt->flush_timer.data = vt;
	vt->flush_timer_on = true;
	uv_timer_start(&vt->flush_timer, vt_flush_timer_cb, ms, 0);
}

static void vt_close(struct transport *t, void (*closed)(struct transport *t))
{
	struct vt *vt = to_vt(t);

	if (vt->closing)
		return;
	vt->closing = true;
	vt->closed_reported = true;   /* the owner asked: no closed() call */
	vt->closed_cb = closed;
	/* Every registration scope is revoked first (dead at once; windows
	 * die with the QP's error state); then the QP goes to the error
	 * state, and close completes once every WR it held has flushed: a
	 * write being placed when it went to error has landed by then. */
	{
		struct kvd_list *e;

		kvd_list_for_each(e, &vt->scopes) {
			struct vt_scope *s = kvd_list_entry(e, struct vt_scope, node);

			if (vt->region_on && vt->region.mode == VERBS_SCOPE_MR &&
			    s->sc.state == VERBS_SCOPE_LIVE)
				(void)verbs_scope_revoke(&vt->region, vt->rc.qp, &s->sc);
		}
	}
	if (!vt->rc_open || !vt->poller_on) {
		vt->outstanding = vt->recv_posted = 0;
		vt_finish(vt);
		return;
	}
	if (vt->v->qp_err(vt->rc.qp)) {
		/* no error state, so no proof that nothing lands: as if the
		 * flush never came */
		vt_flush_give_up(vt, "the device refused the error state");
		return;
	}
	if (vt->emu)
		verbs_emu_pump(vt->ctx);
	vt_drained_check(vt);
	vt_flush_timer_start(vt);
}

static uint32_t vt_pending(const struct transport *t)
{
	const struct vt *vt = kvd_container_of(t, struct vt, base);

	return vt->pending;
}

/* Bytes of the batches not staged yet (waiting for their scope, a
 * staging slot or a mailbox credit): what a decode that withholds
 * credits makes us hold (the owner's data bound applies to it). */
static size_t vt_queued(const struct transport *t)
{
	const struct vt *vt = kvd_container_of(t, struct vt, base);
	const struct kvd_list *e;
	size_t n = 0;

	kvd_list_for_each(e, &vt->queued)
		n += (size_t)kvd_list_entry(e, struct vt_batch, node)->n *
		     vt->base.cfg.page_bytes;
	return n;
}

static void vt_free(struct transport *t)
{
	struct vt *vt;

	if (!t)
		return;
	vt = to_vt(t);
	if (!vt->finished && !vt->poller_on) {
		/* never started on a loop (the boot check): free the device
		 * objects here */
		vt->finished = true;
		vt->closed_cb = NULL;
		vt_release(vt);
	}
	free(vt->mbox);
	free(vt->rxbuf);
	free(vt->stage);
	free(vt);
}

static const struct transport_ops verbs_ops = {
	.name = "verbs",
	.send = vt_send,
	.pending = vt_pending,
	.queued = vt_queued,
	.close = vt_close,
	.free = vt_free,
};

bool transport_is_verbs(const struct transport *t)
{
	return t && t->ops == &verbs_ops;
}

/* ---- the exchange on the control link ------------------------------------- */

int transport_verbs_describe(struct transport *t, struct proto_peer_verbs_qp *qp,
			     struct proto_peer_run *mailbox)
{
	struct vt *vt = to_vt(t);

	verbs_rc_describe(&vt->rc, qp);
	if (mailbox) {
		if (!vt->receiver)
			return -EINVAL;
		*mailbox = (struct proto_peer_run){ .first_page = 0,
						    .n_pages = VT_SLOTS,
						    .addr = vt->mbox_mi.addr,
						    .rkey = vt->mbox_mi.rkey };
	}
	return 0;
}

int transport_verbs_connect(struct transport *t, const struct proto_peer_verbs_qp *peer,
			    char *why, size_t why_size)
{
	struct vt *vt = to_vt(t);
	int r;

	if (vt->closing || vt->connected) {
		snprintf(why, why_size, "the queue pair is connected already");
		return VERBS_RC_E_STATE;
	}
	r = verbs_rc_connect(&vt->rc, peer, why, why_size);
	if (r) {
		if (r < 0)
			snprintf(why, why_size, "the device refused to connect the queue pair (%s)",
				 strerror(-r));
		return r;
	}
	if (vt->receiver)
		for (uint32_t s = 0; s < VT_SLOTS; s++) {
			r = vt_post_recv(vt, s);
			if (r) {
				snprintf(why, why_size, "cannot post a receive (%s)",
					 strerror(-r));
				return r;
			}
		}
	vt->connected = true;
	vt_push(vt);
	return 0;
}

int transport_verbs_set_mailbox(struct transport *t, const struct proto_peer_run *runs,
				uint32_t n_runs, char *why, size_t why_size)
{
	struct vt *vt = to_vt(t);
	const struct proto_peer_run *m = runs;

	if (vt->receiver || vt->have_mbox || n_runs != 1 || m->n_pages != VT_SLOTS ||
	    m->addr + (uint64_t)VT_SLOTS * vt->slot_bytes < m->addr) {
		snprintf(why, why_size,
			 "the peer's mailbox must be one run of %u slots, once", VT_SLOTS);
		return -EINVAL;
	}
	vt->mbox_run = *m;
	vt->have_mbox = true;
	vt_push(vt);
	return 0;
}

int transport_verbs_credit(struct transport *t, uint64_t consumed, char *why,
			   size_t why_size)
{
	struct vt *vt = to_vt(t);

	if (vt->receiver || consumed < vt->mb_credited || consumed > vt->mb_posted) {
		snprintf(why, why_size,
			 "verbs_credit for %llu batches consumed; %llu were credited before and %llu posted",
			 (unsigned long long)consumed, (unsigned long long)vt->mb_credited,
			 (unsigned long long)vt->mb_posted);
		vt->stats->credit_violations++;
		return -EPROTO;
	}
	vt->mb_credited = consumed;
	vt_fault_late_post(vt);
	vt_push(vt);
	return 0;
}

/* ---- decode's write scopes ------------------------------------------------- */

/* transfer.verbs_write_scope against what the device has: auto takes
 * windows where it supports them. */
static enum verbs_scope_mode vt_scope_mode(const struct vt *vt)
{
	switch (vt->base.cfg.verbs_write_scope) {
	case 1:
		return VERBS_SCOPE_WINDOWS;
	case 2:
		return VERBS_SCOPE_MR;
	default:
		return vt->attr.mw_type2 ? VERBS_SCOPE_WINDOWS : VERBS_SCOPE_MR;
	}
}

static void vt_scope_free(struct vt_scope *s)
{
	free(s->refs);
	free(s->runs);
	free(s);
}

static void vt_scope_runs(const struct vt_scope *s, struct proto_peer_run *runs,
			  uint32_t *n_runs)
{
	*n_runs = s->sc.n_runs;
	for (uint32_t i = 0; i < s->sc.n_runs; i++)
		runs[i] = (struct proto_peer_run){
			.first_page = s->sc.runs[i].first_page,
			.n_pages = s->sc.runs[i].n_pages,
			.addr = s->sc.runs[i].addr, .rkey = s->sc.runs[i].rkey };
}

/* The NIC refuses writes through s now (its invalidations completed, or
 * the QP's flush was drained): the fence revoke took goes. */
static void vt_scope_unfence(struct vt *vt, struct vt_scope *s)
{
	int rc;

	if (!s->fenced)
		return;
	s->fenced = false;
	rc = kvpool_unfence(vt->base.cfg.pool, s->id, s->refs, s->n_refs);
	if (rc)
		KVLOG_ERR(vt->base.cfg.log, "invariant_breach",
			  "id=%llu op=scope_unfence code=%d pages=%u",
			  (unsigned long long)s->id, rc, s->n_refs);
}

/* The NIC refuses writes through s now: its invalidations completed
 * (by "invalidate") or the QP's flush was drained ("flush"). When the
 * owner let its pages go meanwhile (a failed transfer releases or
 * quarantines at once, while the revoke is in flight), it is the fence
 * revoke took that kept them out of the free list until now: say so,
 * with the wait. */
static void vt_scope_dead_log(struct vt *vt, const struct vt_scope *s, const char *by)
{
	struct kvpool_page_info pi;
	uint64_t ms = (kvd_now_ns() - s->t_revoke_ns) / 1000000u;

	if (!s->n_refs || kvpool_page_info(vt->base.cfg.pool, s->refs[0].page, &pi) ||
	    pi.owner != s->id || pi.gen != s->refs[0].gen ||
	    (pi.state != KVPAGE_FENCED && pi.state != KVPAGE_QUARANTINED)) {
		KVLOG_DEBUG(vt->base.cfg.log, "verbs_scope_dead", "id=%llu pages=%u waited_ms=%llu by=%s",
			    (unsigned long long)s->id, s->n_refs, (unsigned long long)ms, by);
		return;
	}
	KVLOG_INFO(vt->base.cfg.log, "release_waited_revoke",
		   "id=%llu pages=%u waited_ms=%llu by=%s state=%s",
		   (unsigned long long)s->id, s->n_refs, (unsigned long long)ms, by,
		   pi.state == KVPAGE_FENCED ? "released" : "quarantined");
}

/* The flush never came: s's pages never go back to the free list (the
 * fence stays too). */
static void vt_scope_quarantine(struct vt *vt, struct vt_scope *s)
{
	int rc = kvpool_quarantine(vt->base.cfg.pool, s->id, s->refs, s->n_refs);

	if (rc)
		KVLOG_ERR(vt->base.cfg.log, "invariant_breach",
			  "id=%llu op=scope_quarantine code=%d pages=%u msg=\"left fenced\"",
			  (unsigned long long)s->id, rc, s->n_refs);
	else
		KVLOG_WARN(vt->base.cfg.log, "pages_quarantined",
			   "id=%llu pages=%u reason=verbs_flush_timeout",
			   (unsigned long long)s->id, s->n_refs);
}

/* A bind or an invalidation failed: the windows' state on the device is
 * unknown, so the QP goes (the owner sees closed(); the pages revoke
 * fenced stay so until the flush is drained). */
static void vt_scope_broken(struct vt *vt, struct vt_scope *s, const char *op,
			    int code)
{
	KVLOG_WARN(vt->base.cfg.log, "verbs_scope_failed", "id=%llu op=%s code=%d",
		   (unsigned long long)s->id, op, code);
	if (!s->revoked && !s->live_told && vt->base.cfg.recv.scope_live) {
		s->live_told = true;
		vt->base.cfg.recv.scope_live(vt->base.cfg.recv_arg, s->id, NULL, 0, -EIO);
	}
	vt->dead = true;
	vt_report_closed(vt, -EIO);
}

/* A send completion on the receiver: a bind or an invalidation of the
 * scope whose id is its wr_id. */
static void vt_scope_wc(struct vt *vt, const struct verbs_wc *wc)
{
	struct vt_scope *s = vt_scope_find(vt, wc->wr_id);
	enum verbs_scope_state before;
	struct verbs_wc bad;

	if (vt->outstanding)
		vt->outstanding--;
	if (!s || !vt->region_on)
		return;
	before = s->sc.state;
	if (before == VERBS_SCOPE_BINDING && wc->status == VERBS_WC_SUCCESS &&
	    kvd_fault_fire(vt->base.cfg.fault, KVD_FAULT_VERBS_BIND_FAIL)) {
		/* fault point verbs_bind_fail: the device reports a bind
		 * failed (its window's state unknown) */
		KVLOG_WARN(vt->base.cfg.log, "fault", "point=verbs_bind_fail id=%llu",
			   (unsigned long long)s->id);
		bad = *wc;
		bad.status = VERBS_WC_MW_BIND_ERR;
		wc = &bad;
	}
	verbs_scope_on_wc(&vt->region, &s->sc, wc);
	if (vt->closing)
		return;   /* the drain ends every scope (vt_release) */
	if (before == VERBS_SCOPE_BINDING && s->sc.state == VERBS_SCOPE_LIVE) {
		struct proto_peer_run runs[VERBS_SCOPE_RUNS_MAX];
		uint32_t n;

		if (s->revoked || s->live_told || !vt->base.cfg.recv.scope_live)
			return;
		s->live_told = true;
		vt_scope_runs(s, runs, &n);
		vt->base.cfg.recv.scope_live(vt->base.cfg.recv_arg, s->id, runs, n, 0);
	} else if (before == VERBS_SCOPE_REVOKING && s->sc.state == VERBS_SCOPE_DEAD) {
		/* every invalidation completed: the NIC refuses the peer's
		 * writes to these pages from here on (the owner's final
		 * check of them may run now) */
		uint64_t id = s->id;

		vt_scope_dead_log(vt, s, "invalidate");
		vt_scope_unfence(vt, s);
		kvd_list_del(&s->node);
		vt_scope_free(s);
		if (vt->base.cfg.recv.scope_dead)
			vt->base.cfg.recv.scope_dead(vt->base.cfg.recv_arg, id);
	} else if (before != VERBS_SCOPE_BROKEN && s->sc.state == VERBS_SCOPE_BROKEN) {
		vt_scope_broken(vt, s, before == VERBS_SCOPE_BINDING ? "bind" : "invalidate",
				(int)wc->status);
	}
}

/* Whether a scope of this link may still let a write into a page of the
 * region's chunk that holds page. */
static bool vt_chunk_in_use(struct vt *vt, uint32_t page)
{
	uint64_t lo = verbs_region_page_addr(&vt->region, page);
	struct kvd_list *e;
	uint32_t c_first = page, c_last = page;

	/* the chunk's page span: pages whose registered address is
	 * contiguous with page's (one chunk is one registration) */
	while (c_first > 0 &&
	       verbs_region_page_addr(&vt->region, c_first - 1) ==
	       lo - (uint64_t)(page - c_first + 1) * vt->region.page_bytes)
		c_first--;
	while (c_last < UINT32_MAX - 1 &&
	       verbs_region_page_addr(&vt->region, c_last + 1) ==
	       lo + (uint64_t)(c_last + 1 - page) * vt->region.page_bytes)
		c_last++;
	kvd_list_for_each(e, &vt->scopes) {
		const struct vt_scope *s = kvd_list_entry(e, struct vt_scope, node);

		if (s->sc.state == VERBS_SCOPE_NONE || s->sc.state == VERBS_SCOPE_DEAD)
			continue;
		for (uint32_t i = 0; i < s->n_refs; i++)
			if (s->refs[i].page >= c_first && s->refs[i].page <= c_last)
				return true;
	}
	return false;
}

/* Make sure page is registered where the pool has it now: a range the
 * pool added (kvctl pool resize) is registered on first use, its
 * contiguous pages together; a chunk whose memory the pool moved (shrunk,
 * then grown again) is deregistered first - only once no scope covers
 * it. 0, or VERBS_SCOPE_E_RANGE / the device's error (the request is
 * refused, nothing changed). */
static int vt_region_cover(struct vt *vt, uint32_t page)
{
	struct kvpool *pool = vt->base.cfg.pool;
	uint64_t pb = vt->region.page_bytes;
	uint8_t *a = kvpool_page_addr(pool, page), *lo;
	uint64_t reg = verbs_region_page_addr(&vt->region, page);
	struct kvpool_stats st;
	uint32_t first = page, last = page;
	int r;

	if (!a)
		return VERBS_SCOPE_E_RANGE;
	if (reg == (uintptr_t)a)
		return 0;
	if (reg) {
		if (vt_chunk_in_use(vt, page))
			return VERBS_SCOPE_E_RANGE;
		r = verbs_region_drop(&vt->region, page);
		if (r)
			return r;
		KVLOG_INFO(vt->base.cfg.log, "verbs_pool_chunk",
			   "op=deregister page=%u msg=\"the pool moved its memory\"", page);
	}
	kvpool_get_stats(pool, &st);
	lo = a;
	while (first > 0 && (uint8_t *)kvpool_page_addr(pool, first - 1) == lo - pb &&
	       !verbs_region_page_addr(&vt->region, first - 1)) {
		first--;
		lo -= pb;
	}
	while (last + 1 < st.slots &&
	       (uint8_t *)kvpool_page_addr(pool, last + 1) == a + (uint64_t)(last + 1 - page) * pb &&
	       !verbs_region_page_addr(&vt->region, last + 1))
		last++;
	r = verbs_region_add(&vt->region, lo, first, last - first + 1);
	KVLOG_INFO(vt->base.cfg.log, "verbs_pool_chunk",
		   "op=register first_page=%u pages=%u code=%d", first, last - first + 1, r);
	return r;
}

int transport_verbs_grant(struct transport *t, uint64_t id,
			  const struct kvpool_ref *table, uint32_t n,
			  struct proto_peer_run *runs, uint32_t *n_runs, bool *live)
{
	struct vt *vt = to_vt(t);
	struct vt_scope *s;
	uint32_t *pages;
	int r;

	*live = false;
	*n_runs = 0;
	if (!vt->receiver || !vt->connected || vt->closing || vt->dead)
		return TRANSPORT_E_CLOSED;
	if (vt_scope_find(vt, id))
		return VERBS_SCOPE_E_STATE;
	/* every page registered where the pool has it now */
	for (uint32_t i = 0; i < n; i++) {
		r = vt_region_cover(vt, table[i].page);
		if (r)
			return r;
	}
	s = calloc(1, sizeof(*s));
	pages = malloc(sizeof(*pages) * (n ? n : 1));
	if (s)
		s->refs = malloc(sizeof(*table) * (n ? n : 1));
	if (!s || !pages || !s->refs) {
		free(pages);
		if (s)
			vt_scope_free(s);
		return -ENOMEM;
	}
	for (uint32_t i = 0; i < n; i++)
		pages[i] = table[i].page;
	memcpy(s->refs, table, sizeof(*table) * n);
	s->n_refs = n;
	s->id = id;
	r = verbs_scope_grant(&vt->region, vt->rc.qp, &s->sc, pages, n, id);
	free(pages);
	if (r && s->sc.state == VERBS_SCOPE_BROKEN) {
		/* some binds were posted, then one could not be: they may
		 * complete, so the pages stay fenced here until the QP's
		 * flush is drained, whatever the owner does with them */
		vt->outstanding += s->sc.n_runs;
		s->revoked = true;
		if (!kvpool_fence(vt->base.cfg.pool, id, s->refs, n))
			s->fenced = true;
		s->t_revoke_ns = kvd_now_ns();
		kvd_list_add_tail(&vt->scopes, &s->node);
		vt_scope_broken(vt, s, "bind", r);
		return r;
	}
	if (r) {
		vt_scope_free(s);
		return r;
	}
	vt->outstanding += s->sc.pending;
	kvd_list_add_tail(&vt->scopes, &s->node);
	if (s->sc.state == VERBS_SCOPE_LIVE) {
		*live = true;
		vt_scope_runs(s, runs, n_runs);
	}
	if (vt->poller_on)
		verbs_poller_kick(&vt->poller);
	return 0;
}

/* Windows: fence the pages, post the invalidations; the fence goes when
 * they completed (vt_scope_wc) or the flush is drained (vt_release).
 * True when nothing was left to invalidate (the NIC refuses already). */
static bool vt_scope_revoke_windows(struct vt *vt, struct vt_scope *s)
{
	enum verbs_scope_state st = s->sc.state;
	uint32_t before = s->sc.pending;
	int rc;

	if (st == VERBS_SCOPE_NONE || st == VERBS_SCOPE_DEAD) {
		kvd_list_del(&s->node);
		vt_scope_free(s);
		return true;
	}
	rc = kvpool_fence(vt->base.cfg.pool, s->id, s->refs, s->n_refs);
	if (rc) {
		/* the pages cannot be held: end every write now */
		KVLOG_ERR(vt->base.cfg.log, "invariant_breach",
			  "id=%llu op=scope_fence code=%d pages=%u msg=\"the queue pair goes\"",
			  (unsigned long long)s->id, rc, s->n_refs);
		vt->dead = true;
		vt_report_closed(vt, -EIO);
		return false;
	}
	s->fenced = true;
	s->t_revoke_ns = kvd_now_ns();
	if (vt->closing || vt->dead || st == VERBS_SCOPE_BROKEN)
		return false;   /* the QP is going: its drain ends the scope */
	rc = verbs_scope_revoke(&vt->region, vt->rc.qp, &s->sc);
	vt->outstanding += s->sc.pending - before;
	if (rc)
		vt_scope_broken(vt, s, "invalidate", rc);
	else if (vt->poller_on)
		verbs_poller_kick(&vt->poller);
	return false;
}

bool transport_verbs_revoke(struct transport *t, uint64_t id)
{
	struct vt *vt = to_vt(t);
	struct vt_scope *s = vt->receiver ? vt_scope_find(vt, id) : NULL;

	if (!s)
		return true;
	if (s->revoked)
		return false;   /* windows still being invalidated */
	s->revoked = true;
	if (vt->region_on && vt->region.mode == VERBS_SCOPE_WINDOWS)
		return vt_scope_revoke_windows(vt, s);
	if (vt->region_on && s->sc.state == VERBS_SCOPE_LIVE)
		(void)verbs_scope_revoke(&vt->region, vt->rc.qp, &s->sc);
	kvd_list_del(&s->node);
	vt_scope_free(s);
	return true;
}

bool transport_verbs_flush_timed_out(const struct transport *t)
{
	return transport_is_verbs(t) &&
	       ((const struct vt *)((const char *)t - offsetof(struct vt, base)))->flush_timed_out;
}

const char *transport_verbs_scope_mode(const struct transport *t)
{
	const struct vt *vt = (const struct vt *)((const char *)t - offsetof(struct vt, base));

	return verbs_scope_mode_name(vt->region_on ? vt->region.mode : vt_scope_mode(vt));
}

int transport_verbs_scope(struct transport *t, uint64_t id,
			  const struct proto_peer_run *runs, uint32_t n_runs)
{
	struct vt *vt = to_vt(t);
	struct vt_scope *s;

	if (vt->receiver || vt->closing)
		return TRANSPORT_E_CLOSED;
	if (vt_scope_find(vt, id))
		return VERBS_SCOPE_E_STATE;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->runs = malloc(sizeof(*runs) * n_runs);
	if (!s->runs) {
		free(s);
		return -ENOMEM;
	}
	memcpy(s->runs, runs, sizeof(*runs) * n_runs);
	s->n_runs = n_runs;
	s->id = id;
	kvd_list_add_tail(&vt->scopes, &s->node);
	vt_push(vt);
	return 0;
}

void transport_verbs_forget(struct transport *t, uint64_t id)
{
	struct vt *vt = to_vt(t);
	struct vt_scope *s;
	struct kvd_list *e, *nxt;

	if (vt->receiver)
		return;
	/* batches not staged yet never leave */
	if (!vt->closing)
		kvd_list_for_each_safe(e, nxt, &vt->queued) {
			struct vt_batch *b = kvd_list_entry(e, struct vt_batch, node);

			if (b->id == id)
				vt_batch_end(vt, b, -ECANCELED);
		}
	s = vt_scope_find(vt, id);
	if (!s)
		return;
	kvd_list_del(&s->node);
	vt_scope_free(s);
}

/* ---- opening -------------------------------------------------------------- */

/* decode: the pool's first contiguous range of pages, registered once
 * (later ranges: vt_region_cover) */
static int vt_open_receiver(struct vt *vt, char *why, size_t why_size)
{
	const struct transport_cfg *c = &vt->base.cfg;
	struct kvpool_stats st;
	uint8_t *base;
	uint32_t n = 1;
	bool windows;
	int r;

	kvpool_get_stats(c->pool, &st);
	base = kvpool_page_addr(c->pool, 0);
	if (!base || !st.slots) {
		snprintf(why, why_size, "the KV pool has no pages to register");
		return -EINVAL;
	}
	while (n < st.slots &&
	       (uint8_t *)kvpool_page_addr(c->pool, n) == base + (uint64_t)n * c->page_bytes)
		n++;
	windows = vt_scope_mode(vt) == VERBS_SCOPE_WINDOWS;
	r = verbs_region_init(&vt->region, vt->v, vt->pd, &vt->attr, base,
			      c->page_bytes, n, windows, windows ? KVD_MIN(n, VT_WINDOWS_MAX) : 0);
	if (r) {
		snprintf(why, why_size,
			 "cannot register the KV pool with the device (%s)",
			 r < 0 ? strerror(-r) :
			 r == VERBS_SCOPE_E_SHORT ? "the device registered less than asked" :
			 r == VERBS_SCOPE_E_PAGE ? "max_mr_size is smaller than one page" :
			 "refused");
		return -EINVAL;
	}
	vt->region_on = true;
	vt->mbox = calloc(VT_SLOTS, vt->slot_bytes);
	vt->rxbuf = malloc(xfer_batch_bytes(vt->n_max, c->page_bytes));
	if (!vt->mbox || !vt->rxbuf)
		return -ENOMEM;
	r = vt->v->reg_mr(vt->pd, vt->mbox, VT_SLOTS * vt->slot_bytes,
			  VERBS_ACCESS_LOCAL_WRITE | VERBS_ACCESS_REMOTE_WRITE,
			  &vt->mbox_mr, &vt->mbox_mi);
	if (r) {
		vt->mbox_mr = NULL;
		snprintf(why, why_size, "cannot register the batch mailbox (%s)",
			 strerror(-r));
		return -EINVAL;
	}
	return 0;
}

/* The next inline size auto asks for after the device refused `want`:
 * 128, 64, then 0 (no inline at all). */
static uint32_t vt_inline_step_down(uint32_t want)
{
	return want > 128 ? 128 : want > 64 ? 64 : 0;
}

/* The RC QP, with the inline size transfer.verbs_inline asks for (see
 * "Inline headers" above); caps->max_inline is the last size asked on
 * failure. Sets vt->inline_max. */
static int vt_open_qp(struct vt *vt, struct verbs_qp_caps *caps)
{
	const struct transport_cfg *c = &vt->base.cfg;
	bool autosize = c->verbs_inline == TRANSPORT_VERBS_INLINE_AUTO;
	uint32_t want;
	int r;

	if (autosize)
		want = (uint32_t)KVD_MIN((uint64_t)XFER_HDR_BYTES + XFER_TRAILER_BYTES +
					 (uint64_t)vt->n_max * XFER_ENTRY_BYTES,
					 VT_INLINE_AUTO_MAX);
	else
		want = c->verbs_inline;
	for (;;) {
		caps->max_inline = want;
		r = verbs_rc_open(&vt->rc, vt->v, vt->ctx, vt->pd, (uint8_t)c->verbs_port,
				  (int)c->verbs_gid_index, caps, 2 * c->verbs_qp_depth);
		/* only the device's refusal is worth another try; a port
		 * that is not active stays so */
		if (r >= 0 || !autosize || want == 0)
			break;
		want = vt_inline_step_down(want);
	}
	if (r)
		return r;
	vt->inline_max = autosize ? vt->rc.caps.max_inline : c->verbs_inline;
	return 0;
}

/* prefill: the staging slots */
static int vt_open_sender(struct vt *vt, char *why, size_t why_size)
{
	const struct transport_cfg *c = &vt->base.cfg;
	int r;

	vt->stage_bytes = (size_t)VT_SLOTS * (vt->slot_bytes + (size_t)vt->n_max * c->page_bytes);
	vt->stage = malloc(vt->stage_bytes);
	if (!vt->stage)
		return -ENOMEM;
	r = vt->v->reg_mr(vt->pd, vt->stage, vt->stage_bytes, VERBS_ACCESS_LOCAL_WRITE,
			  &vt->stage_mr, &vt->stage_mi);
	if (r) {
		vt->stage_mr = NULL;
		snprintf(why, why_size, "cannot register the staging buffer (%s)",
			 strerror(-r));
		return -EINVAL;
	}
	return 0;
}

/* What is refused before any device is opened: no verbs table for the
 * kind of device named (v NULL; emu: the emulated one), a QP depth that
 * cannot hold the mailbox's slots and one more WR, a page that does not
 * fit in a batch. 0, or -ENOTSUP, -EINVAL or TRANSPORT_E_BOUND with why
 * set. */
static int vt_check_cfg(const struct verbs_ops *v, bool emu,
			const struct transport_cfg *cfg, char *why, size_t why_size)
{
	if (!v) {
		snprintf(why, why_size, emu ?
			 "kvd was built without the emulated RDMA device (a test device: meson -Dverbs_emu=true)" :
			 "kvd was built without libibverbs");
		return -ENOTSUP;
	}
	if (cfg->verbs_qp_depth < VT_SLOTS + 1) {
		snprintf(why, why_size, "transfer.verbs_qp_depth must be at least %u",
			 VT_SLOTS + 1);
		return -EINVAL;
	}
	if (cfg->pool && !xfer_batch_pages_max(cfg->max_batch_bytes, cfg->page_bytes)) {
		snprintf(why, why_size, "a %llu-byte page does not fit in a %llu-byte batch",
			 (unsigned long long)cfg->page_bytes,
			 (unsigned long long)cfg->max_batch_bytes);
		return TRANSPORT_E_BOUND;
	}
	return 0;
}

/* A new vt's fields from cfg (vt zeroed, nothing opened yet). */
static void vt_init(struct vt *vt, const struct verbs_ops *v, bool emu,
		    uv_loop_t *loop, const struct transport_cfg *cfg)
{
	vt->base.ops = &verbs_ops;
	vt->base.cfg = *cfg;
	vt->v = v;
	vt->emu = emu;
	vt->receiver = cfg->recv.batch != NULL;
	vt->loop = loop;
	vt->depth = cfg->verbs_qp_depth;
	vt->stats = cfg->verbs_stats ? cfg->verbs_stats : &vt->stats_local;
	vt->n_max = xfer_batch_pages_max(cfg->max_batch_bytes, cfg->page_bytes);
	vt->slot_bytes = (XFER_HDR_BYTES + (size_t)vt->n_max * XFER_ENTRY_BYTES +
			  XFER_TRAILER_BYTES + 63) & ~(size_t)63;
	kvd_list_init(&vt->scopes);
	kvd_list_init(&vt->queued);
	kvd_list_init(&vt->inflight);
}

/* The device named dev ("": the first one) opened and queried, the
 * configured terms checked against it (verbs_check_terms; type-2 windows
 * for verbs_write_scope=mw), and a protection domain allocated. 0, or
 * -ENODEV, -EINVAL or verbs_check_terms's error with why set; what opened
 * stays in vt for vt_free(). */
static int vt_open_device(struct vt *vt, const char *dev, char *why,
			  size_t why_size)
{
	const struct transport_cfg *cfg = &vt->base.cfg;
	const struct verbs_ops *v = vt->v;
	bool emu = vt->emu;
	int r;

	r = v->open(dev[0] ? dev : NULL, &vt->ctx);
	if (r < 0) {
		vt->ctx = NULL;
		if (emu && r == -EPERM)
			snprintf(why, why_size,
				 "cannot open the emulated RDMA device: its directory must be owned by this user and writable by nobody else (chmod 700)");
		else if (emu)
			snprintf(why, why_size,
				 "cannot open the emulated RDMA device (%s): check emu:/DIR[,opts] (net/verbs/verbs_emu.h)",
				 strerror(-r));
		else if (dev[0])
			snprintf(why, why_size, "cannot open RDMA device '%.64s' (%s)",
				 dev, strerror(-r));
		else
			snprintf(why, why_size, "no RDMA device (%s)", strerror(-r));
		return -ENODEV;
	}
	r = v->query_device(vt->ctx, &vt->attr);
	if (r < 0) {
		snprintf(why, why_size, "RDMA device query failed (%s)", strerror(-r));
		return -ENODEV;
	}
	r = verbs_check_terms(v, vt->ctx, cfg, &vt->attr, why, why_size);
	if (r)
		return r;
	if (cfg->verbs_write_scope == 1 && !vt->attr.mw_type2) {
		snprintf(why, why_size,
			 "transfer.verbs_write_scope=mw: the device has no type-2 memory windows (use auto or mr)");
		return -EINVAL;
	}
	r = v->alloc_pd(vt->ctx, &vt->pd);
	if (r) {
		vt->pd = NULL;
		snprintf(why, why_size, "cannot allocate a protection domain (%s)",
			 strerror(-r));
		return -ENODEV;
	}
	return 0;
}

/* The RC QP with transfer.verbs_qp_depth send and receive WRs
 * (vt_open_qp). 0, or -EINVAL with why naming the terms the device
 * refused. */
static int vt_open_rc(struct vt *vt, char *why, size_t why_size)
{
	const struct transport_cfg *cfg = &vt->base.cfg;
	struct verbs_qp_caps caps = { .max_send_wr = cfg->verbs_qp_depth,
				      .max_recv_wr = cfg->verbs_qp_depth };
	char inl[48];
	int r;

	r = vt_open_qp(vt, &caps);
	if (!r)
		return 0;
	if (cfg->verbs_inline == TRANSPORT_VERBS_INLINE_AUTO)
		snprintf(inl, sizeof(inl), "auto (down to %u)", caps.max_inline);
	else
		snprintf(inl, sizeof(inl), "%u", cfg->verbs_inline);
	snprintf(why, why_size,
		 "the device refuses an RC queue pair with transfer.verbs_qp_depth=%u and transfer.verbs_inline=%s on port %u, GID index %u (%s)",
		 cfg->verbs_qp_depth, inl, cfg->verbs_port,
		 cfg->verbs_gid_index,
		 r < 0 ? strerror(-r) : "port not active");
	return -EINVAL;
}

int transport_verbs_new(struct transport **out, uv_loop_t *loop,
			const struct transport_cfg *cfg, char *why,
			size_t why_size)
{
	const char *dev = cfg->verbs_device ? cfg->verbs_device : "";
	bool emu = !strncmp(dev, "emu:", 4);
	const struct verbs_ops *v = emu ? verbs_emu_ops() : verbs_real_ops();
	struct vt *vt;
	int r;

	*out = NULL;
	r = vt_check_cfg(v, emu, cfg, why, why_size);
	if (r)
		return r;
	vt = calloc(1, sizeof(*vt));
	if (!vt)
		return -ENOMEM;
	vt_init(vt, v, emu, loop, cfg);
	r = vt_open_device(vt, dev, why, why_size);
	if (!r)
		r = vt_open_rc(vt, why, why_size);
	if (r)
		goto fail;
	vt->rc_open = true;
	if (!cfg->pool) {
		/* the boot check: the device and its terms only */
		*out = &vt->base;
		return 0;
	}
	r = vt->receiver ? vt_open_receiver(vt, why, why_size)
			 : vt_open_sender(vt, why, why_size);
	if (r)
		goto fail;
	if (loop) {
		r = verbs_poller_start(&vt->poller, loop, v, vt->rc.cq, vt->rc.cq_fd,
				       vt->ctx, emu ? verbs_emu_wire_fd(vt->ctx) : -1,
				       vt_on_wc, vt);
		if (r) {
			snprintf(why, why_size, "cannot watch the completion channel (%s)",
				 uv_strerror(r));
			/* the poller's handles are closing: keep vt (leak it
			 * rather than free memory libuv still refers to) */
			return -EIO;
		}
		vt->poller_on = true;
	}
	*out = &vt->base;
	return 0;
fail:
	vt_free(&vt->base);
	return r;
}

/* What the device offers, for the boot line. */
void transport_verbs_figures(struct transport *t, char *buf, size_t n)
{
	struct vt *vt = to_vt(t);

	snprintf(buf, n, "device=%s max_mr_size=%llu max_qp_wr=%u write_scope=%s windows_supported=%s mtu=%u inline=%u inline_granted=%u",
		 vt->emu ? "emulated" : "ibverbs",
		 (unsigned long long)vt->attr.max_mr_size, vt->attr.max_qp_wr,
		 transport_verbs_scope_mode(t),
		 vt->attr.mw_type2 ? "yes" : "no", vt->rc.port_attr.active_mtu,
		 vt->inline_max, vt->rc.caps.max_inline);
}

uint32_t transport_verbs_inline(const struct transport *t)
{
	const struct vt *vt = (const struct vt *)((const char *)t - offsetof(struct vt, base));

	return vt->inline_max;
}
