/* probe.c - does this RDMA device do what kvd's verbs transport needs?
 *
 *   verbs_probe [--port N] [--gid-index N] [--inline N] [DEVICE | --emu[=OPTS]]
 *
 * Design. A device check for machines that have RDMA (tests/verbs/run),
 * written over net/verbs/verbs_ops.h - the same table, and the same net/ pieces
 * (verbs_rc for the queue pairs, verbs_scope for the write scope), that
 * kvd's transport uses, so a pass here says those pieces work on this
 * device, not that some other program's verbs calls do. DEVICE is an
 * ibverbs device name (none: the first device) or `emu:DIR[,opts]`, the
 * emulated device (net/verbs/verbs_emu.h); `--emu[=OPTS]` makes a private
 * directory for it and removes it afterwards, which is how the unit suite
 * runs the probe in every build.
 *
 * Each check prints one line; the first that fails ends the probe:
 *   1. open the device, query it, its port and the GID at the index;
 *   2. a PD, a source and a destination registration, two RC QPs of the
 *      device (writer and owner, as prefill's and decode's would be),
 *      described and connected to each other through verbs_rc - the
 *      device's own loopback;
 *   3. one RDMA_WRITE of two pages and one WRITE_WITH_IMM (its small
 *      header inline when the QP allows, the source overwritten right
 *      after posting to show the copy was taken at post time): completions
 *      in order, the receive with the immediate and its length, the bytes
 *      equal, nothing written beside them;
 *   4. a pool registered through verbs_scope (type-2 windows where the
 *      device has them, else per-request registrations) and a scope over
 *      three of its pages: a write through the scope lands;
 *   5. the scope revoked (its invalidations completed): a write with the
 *      old key fails with a remote access error and changes nothing;
 *   6. on fresh QPs, a scope of one page: a write to the page beside it
 *      with the scope's key fails the same way.
 *
 * Exit: 0 every check passed; 1 a check failed (the line says which and
 * why); 2 usage; 77 no device (a build without libibverbs, no RDMA device
 * or no kernel support) - the caller decides whether that is a skip.
 * Nothing here is timed: tests/bench/bench_verbs.c measures.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "conf/log.h"
#include "conf/util.h"
#include "net/verbs/verbs_emu.h"
#include "net/verbs/verbs_rc.h"
#include "net/verbs/verbs_scope.h"

#define PB 16384u            /* bytes of one page here */
#define POOL_PAGES 8u        /* pages of the scoped pool */
#define SRC_PAGES 4u
#define DST_PAGES 4u
#define HDR_BYTES 48u        /* a batch header's size, inline when allowed */
#define SENTINEL 0xa5
#define WAIT_NS (5ull * 1000000000ull)

enum { PROBE_OK = 0, PROBE_FAIL = 1, PROBE_USAGE = 2, PROBE_SKIP = 77 };

struct probe {
	const struct verbs_ops *ops;
	bool emu;
	char dev[160];               /* empty: the first ibverbs device */
	char emu_dir[64];            /* --emu: ours to remove */
	uint8_t port;
	int gid_index;
	uint32_t inline_max;
	int checks;

	struct verbs_ctx *ctx;
	struct verbs_dev_attr attr;
	struct verbs_pd *pd;
	uint8_t *src;                /* (SRC_PAGES, PB) */
	struct verbs_mr *src_mr;
	struct verbs_mr_info src_mi;
	uint8_t *dst;                /* (DST_PAGES, PB), remote write */
	struct verbs_mr *dst_mr;
	struct verbs_mr_info dst_mi;
	uint8_t *pool;               /* (POOL_PAGES, PB), scoped */
	struct verbs_region region;
	bool region_up;
	struct verbs_rc w, o;        /* writer and owner, connected */
	bool pair_up;
	uint64_t next_wr;
};

static void probe_ok(struct probe *p, const char *check, const char *detail)
{
	p->checks++;
	printf("probe: ok %s%s%s\n", check, detail ? " " : "", detail ? detail : "");
	fflush(stdout);
}

static int probe_fail(const char *check, const char *why)
{
	printf("probe: FAIL %s: %s\n", check, why);
	fflush(stdout);
	return PROBE_FAIL;
}

static int probe_fail_errno(const char *check, const char *call, int r)
{
	char why[160];

	snprintf(why, sizeof(why), "%s: %s (%d)", call, strerror(-r), r);
	return probe_fail(check, why);
}

/* One completion from cq within WAIT_NS; the emulated device places the
 * writes that arrived at every turn (a real NIC does it alone). */
static int probe_wait(struct probe *p, struct verbs_cq *cq, struct verbs_wc *wc,
		      const char *check)
{
	uint64_t end = kvd_now_ns() + WAIT_NS;

	for (;;) {
		int n;

		if (p->emu) {
			n = verbs_emu_deliver(p->ctx, ~0u);
			if (n < 0)
				return probe_fail_errno(check, "verbs_emu_deliver", n);
		}
		n = p->ops->poll_cq(cq, 1, wc);
		if (n < 0)
			return probe_fail_errno(check, "poll_cq", n);
		if (n == 1)
			return 0;
		if (kvd_now_ns() > end)
			return probe_fail(check, "no completion within 5 s");
		if (p->emu)
			usleep(100);
	}
}

/* The next completion of cq is wr_id with status. */
static int probe_expect(struct probe *p, struct verbs_cq *cq, uint64_t wr_id,
			enum verbs_wc_status status, struct verbs_wc *wc,
			const char *check)
{
	char why[200];

	if (probe_wait(p, cq, wc, check))
		return PROBE_FAIL;
	if (wc->wr_id == wr_id && wc->status == status)
		return 0;
	snprintf(why, sizeof(why), "completion wr_id=%llu status=%s, expected wr_id=%llu status=%s",
		 (unsigned long long)wc->wr_id, verbs_wc_status_name(wc->status),
		 (unsigned long long)wr_id, verbs_wc_status_name(status));
	return probe_fail(check, why);
}

static bool all_byte(const uint8_t *b, size_t n, uint8_t v)
{
	for (size_t i = 0; i < n; i++)
		if (b[i] != v)
			return false;
	return true;
}

static int fill_random(uint8_t *b, size_t n)
{
	size_t off = 0;

	while (off < n) {
		ssize_t k = getrandom(b + off, n - off, 0);

		if (k < 0)
			return -errno;
		off += (size_t)k;
	}
	return 0;
}

static void gid_text(const struct verbs_gid *g, char *out, size_t n)
{
	size_t o = 0;

	for (int i = 0; i < 16 && o + 3 < n; i += 2)
		o += (size_t)snprintf(out + o, n - o, "%s%02x%02x", i ? ":" : "",
				      g->raw[i], g->raw[i + 1]);
}

/* 1. Device, port, GID. */
static int step_open(struct probe *p)
{
	struct verbs_port_attr pa;
	struct verbs_gid gid;
	char line[320], g[48];
	int r = p->ops->open(p->dev[0] ? p->dev : NULL, &p->ctx);

	if (!p->emu && (r == -ENODEV || r == -ENOSYS)) {
		printf("probe: no RDMA device%s%s (%s)\n", p->dev[0] ? " named " : "",
		       p->dev[0] ? KVLOG_Q(p->dev) : "", strerror(-r));
		p->ctx = NULL;
		return PROBE_SKIP;
	}
	if (r) {
		p->ctx = NULL;
		return probe_fail_errno("open", "open", r);
	}
	r = p->ops->query_device(p->ctx, &p->attr);
	if (r)
		return probe_fail_errno("open", "query_device", r);
	snprintf(line, sizeof(line),
		 "device=%s ops=%s max_mr_size=%llu max_qp_wr=%u max_cqe=%u mw_type2=%d ports=%u",
		 KVLOG_Q(p->dev[0] ? p->dev : "(first)"), p->ops->name,
		 (unsigned long long)p->attr.max_mr_size, p->attr.max_qp_wr,
		 p->attr.max_cqe, p->attr.mw_type2, p->attr.phys_port_cnt);
	probe_ok(p, "open", line);
	if (p->port == 0 || p->port > p->attr.phys_port_cnt)
		return probe_fail("port", "the device has no such port");
	r = p->ops->query_port(p->ctx, p->port, &pa);
	if (r)
		return probe_fail_errno("port", "query_port", r);
	if (!pa.active)
		return probe_fail("port", "the port is not active (link down?)");
	if ((uint32_t)p->gid_index >= pa.gid_tbl_len)
		return probe_fail("port", "the GID index is past the port's GID table");
	r = p->ops->query_gid(p->ctx, p->port, p->gid_index, &gid);
	if (r)
		return probe_fail_errno("port", "query_gid", r);
	if (pa.lid == 0 && all_byte(gid.raw, sizeof(gid.raw), 0))
		return probe_fail("port", "RoCE port with an empty GID at that index "
				  "(try another --gid-index: `rdma link`, show_gids)");
	gid_text(&gid, g, sizeof(g));
	snprintf(line, sizeof(line), "port=%u mtu=%u lid=%u gid_tbl_len=%u gid[%d]=%s",
		 p->port, pa.active_mtu, pa.lid, pa.gid_tbl_len, p->gid_index, g);
	probe_ok(p, "port", line);
	return 0;
}

static void pair_close(struct probe *p)
{
	verbs_rc_close(&p->w);
	verbs_rc_close(&p->o);
	p->pair_up = false;
}

/* Two RC QPs of this device, each connected to the other. */
static int pair_open(struct probe *p)
{
	struct verbs_qp_caps caps = { .max_send_wr = 16, .max_recv_wr = 16,
				      .max_inline = p->inline_max };
	struct proto_peer_verbs_qp dw, dx;
	char why[160];
	int r;

	r = verbs_rc_open(&p->w, p->ops, p->ctx, p->pd, p->port, p->gid_index, &caps, 64);
	if (r)
		return r < 0 ? probe_fail_errno("qp", "verbs_rc_open (writer)", r)
			     : probe_fail("qp", "the port is not active");
	r = verbs_rc_open(&p->o, p->ops, p->ctx, p->pd, p->port, p->gid_index, &caps, 64);
	if (r) {
		verbs_rc_close(&p->w);
		return r < 0 ? probe_fail_errno("qp", "verbs_rc_open (owner)", r)
			     : probe_fail("qp", "the port is not active");
	}
	p->pair_up = true;
	verbs_rc_describe(&p->w, &dw);
	verbs_rc_describe(&p->o, &dx);
	why[0] = 0;
	r = verbs_rc_connect(&p->w, &dx, why, sizeof(why));
	if (r == 0)
		r = verbs_rc_connect(&p->o, &dw, why, sizeof(why));
	if (r > 0)
		return probe_fail("qp", why);
	if (r < 0)
		return probe_fail_errno("qp", "verbs_rc_connect", r);
	return 0;
}

/* Move both QPs to the error state and take every flush completion, so
 * nothing the device holds refers to them; then destroy them. */
static int pair_teardown(struct probe *p, const char *check)
{
	struct verbs_wc wc[16];
	int r = p->ops->qp_err(p->w.qp);

	if (r == 0)
		r = p->ops->qp_err(p->o.qp);
	if (r)
		return probe_fail_errno(check, "qp_err", r);
	for (int i = 0; i < 100; i++) {
		if (p->emu)
			verbs_emu_pump(p->ctx);
		if (p->ops->poll_cq(p->w.cq, 16, wc) < 0 || p->ops->poll_cq(p->o.cq, 16, wc) < 0)
			return probe_fail(check, "poll_cq failed while draining");
	}
	pair_close(p);
	return 0;
}

/* 2. PD, registrations, the connected pair. */
static int step_setup(struct probe *p)
{
	char line[200];
	int r = p->ops->alloc_pd(p->ctx, &p->pd);

	if (r) {
		p->pd = NULL;
		return probe_fail_errno("setup", "alloc_pd", r);
	}
	p->src = aligned_alloc(4096, SRC_PAGES * PB);
	p->dst = aligned_alloc(4096, DST_PAGES * PB);
	p->pool = aligned_alloc(4096, POOL_PAGES * PB);
	if (!p->src || !p->dst || !p->pool)
		return probe_fail("setup", "out of memory");
	r = fill_random(p->src, SRC_PAGES * PB);
	if (r)
		return probe_fail_errno("setup", "getrandom", r);
	memset(p->dst, SENTINEL, DST_PAGES * PB);
	memset(p->pool, SENTINEL, POOL_PAGES * PB);
	r = p->ops->reg_mr(p->pd, p->src, SRC_PAGES * PB, VERBS_ACCESS_LOCAL_WRITE,
			   &p->src_mr, &p->src_mi);
	if (r) {
		p->src_mr = NULL;
		return probe_fail_errno("setup", "reg_mr (source)", r);
	}
	r = p->ops->reg_mr(p->pd, p->dst, DST_PAGES * PB,
			   VERBS_ACCESS_LOCAL_WRITE | VERBS_ACCESS_REMOTE_WRITE,
			   &p->dst_mr, &p->dst_mi);
	if (r) {
		p->dst_mr = NULL;
		return probe_fail_errno("setup", "reg_mr (destination)", r);
	}
	if (p->src_mi.length != SRC_PAGES * PB || p->dst_mi.length != DST_PAGES * PB)
		return probe_fail("setup", "the device registered less than asked");
	r = pair_open(p);
	if (r)
		return r;
	snprintf(line, sizeof(line), "qpn_writer=%u qpn_owner=%u path_mtu=%u inline=%u",
		 p->w.qpn, p->o.qpn, p->w.path_mtu, p->inline_max);
	probe_ok(p, "setup", line);
	return 0;
}

static int post_write(struct probe *p, uint64_t wr_id, const uint8_t *src, uint32_t len,
		      uint64_t raddr, uint32_t rkey, bool imm, uint32_t immv, bool inl)
{
	struct verbs_sge sg = { .addr = (uintptr_t)src, .length = len,
				.lkey = p->src_mi.lkey };
	struct verbs_send_wr wr = {
		.wr_id = wr_id,
		.opcode = imm ? VERBS_WR_RDMA_WRITE_WITH_IMM : VERBS_WR_RDMA_WRITE,
		.sg = &sg, .num_sge = 1, .remote_addr = raddr, .rkey = rkey,
		.imm = immv, .inline_data = inl, .signaled = true,
	};

	return p->ops->post_send(p->w.qp, &wr);
}

/* 3. RDMA_WRITE then WRITE_WITH_IMM into the plain destination. */
static int step_write(struct probe *p)
{
	const char *ck = "write";
	uint8_t hdr[HDR_BYTES];
	uint8_t *hsrc = p->src + 2 * PB;   /* the header's source bytes */
	uint64_t wa = p->next_wr++, wb = p->next_wr++, wr = p->next_wr++;
	bool inl = p->inline_max >= HDR_BYTES;
	struct verbs_wc wc;
	uint32_t immv;
	char line[160];
	int r;

	if (getrandom(&immv, sizeof(immv), 0) != sizeof(immv))
		return probe_fail_errno(ck, "getrandom", -errno);
	memcpy(hdr, hsrc, HDR_BYTES);
	r = p->ops->post_recv(p->o.qp, wr);
	if (r)
		return probe_fail_errno(ck, "post_recv", r);
	r = post_write(p, wa, p->src, 2 * PB, p->dst_mi.addr, p->dst_mi.rkey, false, 0, false);
	if (r)
		return probe_fail_errno(ck, "post_send (RDMA_WRITE)", r);
	r = post_write(p, wb, hsrc, HDR_BYTES, p->dst_mi.addr + 3 * PB, p->dst_mi.rkey,
		       true, immv, inl);
	if (r)
		return probe_fail_errno(ck, "post_send (WRITE_WITH_IMM)", r);
	if (inl)   /* inline: the device copied the bytes when we posted */
		memset(hsrc, 0, HDR_BYTES);
	if (probe_expect(p, p->w.cq, wa, VERBS_WC_SUCCESS, &wc, ck) ||
	    probe_expect(p, p->w.cq, wb, VERBS_WC_SUCCESS, &wc, ck) ||
	    probe_expect(p, p->o.cq, wr, VERBS_WC_SUCCESS, &wc, ck))
		return PROBE_FAIL;
	if (wc.opcode != VERBS_WC_RECV_RDMA_WITH_IMM || !wc.has_imm || wc.imm != immv)
		return probe_fail(ck, "the receive did not carry the write's immediate");
	if (wc.byte_len != HDR_BYTES)
		return probe_fail(ck, "the receive's byte_len is not the write's length");
	if (memcmp(p->dst, p->src, 2 * PB) != 0)
		return probe_fail(ck, "the RDMA_WRITE's bytes differ from the source");
	if (memcmp(p->dst + 3 * PB, hdr, HDR_BYTES) != 0)
		return probe_fail(ck, inl ? "the inline WRITE_WITH_IMM's bytes are not those at post time"
				      : "the WRITE_WITH_IMM's bytes differ from the source");
	if (!all_byte(p->dst + 2 * PB, PB, SENTINEL) ||
	    !all_byte(p->dst + 3 * PB + HDR_BYTES, PB - HDR_BYTES, SENTINEL))
		return probe_fail(ck, "bytes beside the writes changed");
	memcpy(hsrc, hdr, HDR_BYTES);
	snprintf(line, sizeof(line), "rdma_write=%u write_with_imm=%u imm=0x%08x inline=%s",
		 2 * PB, HDR_BYTES, immv, inl ? "yes" : "no");
	probe_ok(p, ck, line);
	return 0;
}

/* Feed the owner's completions to the scope until it reaches want (binds
 * and invalidations complete on the owner's QP). */
static int scope_settle(struct probe *p, struct verbs_scope *sc,
			enum verbs_scope_state want, const char *ck)
{
	struct verbs_wc wc;

	while (sc->state != want) {
		if (sc->state == VERBS_SCOPE_BROKEN)
			return probe_fail(ck, "a bind or invalidation failed");
		if (probe_wait(p, p->o.cq, &wc, ck))
			return PROBE_FAIL;
		if (wc.wr_id != sc->wr_id)
			return probe_fail(ck, "an unexpected completion on the owner's QP");
		verbs_scope_on_wc(&p->region, sc, &wc);
	}
	return 0;
}

static int scope_grant(struct probe *p, struct verbs_scope *sc, const uint32_t *pages,
		       uint32_t n, const char *ck)
{
	int r;

	memset(sc, 0, sizeof(*sc));
	r = verbs_scope_grant(&p->region, p->o.qp, sc, pages, n, p->next_wr++);
	if (r < 0)
		return probe_fail_errno(ck, "verbs_scope_grant", r);
	if (r > 0)
		return probe_fail(ck, "verbs_scope_grant refused the pages");
	return scope_settle(p, sc, VERBS_SCOPE_LIVE, ck);
}

/* A write of one source page through (addr, rkey): its completion status. */
static int scope_write(struct probe *p, uint32_t src_page, uint64_t addr, uint32_t rkey,
		       enum verbs_wc_status want, const char *ck)
{
	struct verbs_wc wc;
	uint64_t id = p->next_wr++;
	int r = post_write(p, id, p->src + (uint64_t)src_page * PB, PB, addr, rkey,
			   false, 0, false);

	if (r)
		return probe_fail_errno(ck, "post_send", r);
	return probe_expect(p, p->w.cq, id, want, &wc, ck);
}

static uint8_t *pool_page(struct probe *p, uint32_t page)
{
	return p->pool + (uint64_t)page * PB;
}

/* 4 and 5. A scope over pages 1, 2, 5: a write lands; revoked, a write
 * with its old key is refused by the NIC and lands nothing. */
static int step_scope(struct probe *p)
{
	static const uint32_t pages[] = { 5, 1, 2 };
	struct verbs_scope sc;
	uint64_t addr;
	uint32_t rkey;
	char line[160];
	int r;

	r = verbs_region_init(&p->region, p->ops, p->pd, &p->attr, p->pool, PB, POOL_PAGES,
			      p->attr.mw_type2, 8);
	if (r < 0)
		return probe_fail_errno("scope", "verbs_region_init", r);
	if (r > 0)
		return probe_fail("scope", r == VERBS_SCOPE_E_SHORT
				  ? "the device registered less than asked"
				  : "verbs_region_init refused the pool");
	p->region_up = true;
	if (scope_grant(p, &sc, pages, KVD_ARRAY_SIZE(pages), "scope"))
		return PROBE_FAIL;
	if (verbs_scope_page(&p->region, &sc, 2, &addr, &rkey))
		return probe_fail("scope", "verbs_scope_page has no page 2");
	if (scope_write(p, 0, addr, rkey, VERBS_WC_SUCCESS, "scope"))
		return PROBE_FAIL;
	if (memcmp(pool_page(p, 2), p->src, PB) != 0)
		return probe_fail("scope", "the write through the scope did not land");
	if (!all_byte(pool_page(p, 3), PB, SENTINEL) || !all_byte(pool_page(p, 1), PB, SENTINEL))
		return probe_fail("scope", "pages beside the write changed");
	snprintf(line, sizeof(line), "mode=%s runs=%u", verbs_scope_mode_name(p->region.mode),
		 sc.n_runs);
	probe_ok(p, "scope", line);

	r = verbs_scope_revoke(&p->region, p->o.qp, &sc);
	if (r < 0)
		return probe_fail_errno("revoked", "verbs_scope_revoke", r);
	if (r > 0)
		return probe_fail("revoked", "verbs_scope_revoke refused");
	if (scope_settle(p, &sc, VERBS_SCOPE_DEAD, "revoked"))
		return PROBE_FAIL;
	if (scope_write(p, 1, addr, rkey, VERBS_WC_REM_ACCESS_ERR, "revoked"))
		return PROBE_FAIL;
	if (memcmp(pool_page(p, 2), p->src, PB) != 0)
		return probe_fail("revoked", "a write through the revoked scope changed the page");
	probe_ok(p, "revoked", "status=remote_access_error page_unchanged=yes");
	return pair_teardown(p, "revoked");
}

/* 6. Fresh QPs, a scope of page 1: the page beside it is out of reach. */
static int step_beside(struct probe *p)
{
	static const uint32_t pages[] = { 1 };
	static uint8_t before[PB];
	struct verbs_scope sc;
	uint64_t addr;
	uint32_t rkey;
	int r = pair_open(p);

	if (r)
		return r;
	memset(pool_page(p, 1), SENTINEL, PB);
	if (scope_grant(p, &sc, pages, 1, "beside"))
		return PROBE_FAIL;
	if (verbs_scope_page(&p->region, &sc, 1, &addr, &rkey))
		return probe_fail("beside", "verbs_scope_page has no page 1");
	if (scope_write(p, 3, addr, rkey, VERBS_WC_SUCCESS, "beside"))
		return PROBE_FAIL;
	if (memcmp(pool_page(p, 1), p->src + 3 * PB, PB) != 0)
		return probe_fail("beside", "the write through the fresh scope did not land");
	memcpy(before, pool_page(p, 2), PB);
	if (scope_write(p, 2, addr + PB, rkey, VERBS_WC_REM_ACCESS_ERR, "beside"))
		return PROBE_FAIL;
	if (memcmp(pool_page(p, 2), before, PB) != 0)
		return probe_fail("beside", "a write beside the scope changed the page");
	probe_ok(p, "beside", "status=remote_access_error page_unchanged=yes");
	r = pair_teardown(p, "beside");
	verbs_scope_qp_gone(&p->region, &sc);
	return r;
}

static void probe_close(struct probe *p)
{
	if (p->pair_up)
		pair_close(p);
	if (p->region_up)
		verbs_region_deinit(&p->region);
	if (p->dst_mr)
		p->ops->dereg_mr(p->dst_mr);
	if (p->src_mr)
		p->ops->dereg_mr(p->src_mr);
	if (p->pd)
		p->ops->dealloc_pd(p->pd);
	if (p->ctx)
		p->ops->close(p->ctx);
	free(p->src);
	free(p->dst);
	free(p->pool);
}

static int usage(void)
{
	fprintf(stderr, "usage: verbs_probe [--port N] [--gid-index N] [--inline N] "
		"[DEVICE | emu:DIR[,opts] | --emu[=OPTS]]\n");
	return PROBE_USAGE;
}

static bool arg_u32(const char *s, uint32_t max, uint32_t *out)
{
	char *end;
	unsigned long v;

	errno = 0;
	v = strtoul(s, &end, 10);
	if (errno || end == s || *end || v > max)
		return false;
	*out = (uint32_t)v;
	return true;
}

static int probe_args(struct probe *p, int argc, char **argv)
{
	const char *emu_opts = NULL;
	bool want_emu = false;
	uint32_t v;

	p->port = 1;
	p->inline_max = 64;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];

		if (!strcmp(a, "--port") && i + 1 < argc && arg_u32(argv[++i], 255, &v) && v)
			p->port = (uint8_t)v;
		else if (!strcmp(a, "--gid-index") && i + 1 < argc && arg_u32(argv[++i], 255, &v))
			p->gid_index = (int)v;
		else if (!strcmp(a, "--inline") && i + 1 < argc && arg_u32(argv[++i], 4096, &v))
			p->inline_max = v;
		else if (!strcmp(a, "--emu") || !strncmp(a, "--emu=", 6)) {
			want_emu = true;
			emu_opts = a[5] == '=' ? a + 6 : NULL;
		} else if (a[0] != '-' && !p->dev[0] && strlen(a) < sizeof(p->dev))
			snprintf(p->dev, sizeof(p->dev), "%s", a);
		else
			return usage();
	}
	if (want_emu) {
		if (p->dev[0])
			return usage();
		snprintf(p->emu_dir, sizeof(p->emu_dir), "/tmp/kvd-probe-XXXXXX");
		if (!mkdtemp(p->emu_dir)) {
			perror("verbs_probe: mkdtemp");
			return PROBE_FAIL;
		}
		snprintf(p->dev, sizeof(p->dev), "emu:%s%s%s", p->emu_dir,
			 emu_opts && *emu_opts ? "," : "", emu_opts ? emu_opts : "");
	}
	p->emu = !strncmp(p->dev, "emu:", 4);
	p->ops = p->emu ? verbs_emu_ops() : verbs_real_ops();
	if (!p->ops) {
		printf("probe: this build has no libibverbs (only emu: devices)\n");
		return PROBE_SKIP;
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct probe p = { .next_wr = 1 };
	int r = probe_args(&p, argc, argv);

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (r == 0)
		r = step_open(&p);
	if (r == 0)
		r = step_setup(&p);
	if (r == 0)
		r = step_write(&p);
	if (r == 0)
		r = step_scope(&p);
	if (r == 0)
		r = step_beside(&p);
	probe_close(&p);
	if (p.emu_dir[0] && rmdir(p.emu_dir) != 0) {
		/* a socket left behind: a context was not closed */
		printf("probe: FAIL cleanup: %s not empty\n", p.emu_dir);
		r = r ? r : PROBE_FAIL;
	}
	if (r == 0)
		printf("probe: PASS %d checks\n", p.checks);
	return r;
}
