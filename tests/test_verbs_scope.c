/* test_verbs_scope.c - decode's pool as RDMA memory (net/verbs/verbs_scope.c),
 * over the emulated device: chunks no larger than max_mr_size with their
 * real lengths, no remote access through a chunk's own key, per-request
 * scopes (type-2 windows, or registrations where the device has none)
 * that let the peer write exactly the request's pages while granted and
 * nothing once revoked, a scope live only after its binds completed and
 * dead only after its invalidations completed, bounds refused before
 * anything is posted, and a broken scope recovered by the QP's teardown.
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "net/verbs/verbs_emu.h"
#include "net/verbs/verbs_scope.h"
#include "tests/verbs_testdir.h"

#define PB 4096u
#define NP 16u

static const struct verbs_ops *V;

struct ep {
	struct verbs_ctx *ctx;
	struct verbs_pd *pd;
	struct verbs_cq *cq;
	int fd;
	struct verbs_qp *qp;
	uint32_t qpn;
	uint8_t *mem;
	struct verbs_mr *mr;       /* prefill's source registration */
	struct verbs_mr_info mi;
	struct verbs_dev_attr attr;
};

static void ep_open(struct ep *e, const char *opts)
{
	char dev[160];
	struct verbs_qp_caps caps = { .max_send_wr = 256, .max_recv_wr = 16 };

	memset(e, 0, sizeof(*e));
	snprintf(dev, sizeof(dev), "emu:%s%s", dir, opts ? opts : "");
	ck_assert_int_eq(V->open(dev, &e->ctx), 0);
	ck_assert_int_eq(V->query_device(e->ctx, &e->attr), 0);
	ck_assert_int_eq(V->alloc_pd(e->ctx, &e->pd), 0);
	ck_assert_int_eq(V->create_cq(e->ctx, 512, &e->cq, &e->fd), 0);
	ck_assert_int_eq(V->create_qp(e->pd, e->cq, e->cq, &caps, &e->qp, &e->qpn), 0);
	e->mem = calloc(NP, PB);
	ck_assert_ptr_nonnull(e->mem);
}

static void ep_connect(struct ep *a, struct ep *b)
{
	struct verbs_qp_dest da = { .qpn = a->qpn, .mtu = 4096 };
	struct verbs_qp_dest db = { .qpn = b->qpn, .mtu = 4096 };

	ck_assert_int_eq(V->query_gid(a->ctx, 1, 0, &da.gid), 0);
	ck_assert_int_eq(V->query_gid(b->ctx, 1, 0, &db.gid), 0);
	ck_assert_int_eq(V->qp_init(a->qp, 1, VERBS_ACCESS_REMOTE_WRITE), 0);
	ck_assert_int_eq(V->qp_rtr(a->qp, 1, 0, &db), 0);
	ck_assert_int_eq(V->qp_rts(a->qp, 0), 0);
	ck_assert_int_eq(V->qp_init(b->qp, 1, VERBS_ACCESS_REMOTE_WRITE), 0);
	ck_assert_int_eq(V->qp_rtr(b->qp, 1, 0, &da), 0);
	ck_assert_int_eq(V->qp_rts(b->qp, 0), 0);
}

static void ep_close(struct ep *e)
{
	ck_assert_int_eq(V->destroy_qp(e->qp), 0);
	if (e->mr)
		ck_assert_int_eq(V->dereg_mr(e->mr), 0);
	ck_assert_int_eq(V->destroy_cq(e->cq), 0);
	ck_assert_int_eq(V->dealloc_pd(e->pd), 0);
	V->close(e->ctx);
	free(e->mem);
}

/* Nothing but the QP holds the PD: it can be deallocated (then both are
 * made again). */
static void pd_unused(struct ep *e)
{
	struct verbs_qp_caps caps = { .max_send_wr = 256, .max_recv_wr = 16 };

	ck_assert_int_eq(V->destroy_qp(e->qp), 0);
	ck_assert_int_eq(V->dealloc_pd(e->pd), 0);
	ck_assert_int_eq(V->alloc_pd(e->ctx, &e->pd), 0);
	ck_assert_int_eq(V->create_qp(e->pd, e->cq, e->cq, &caps, &e->qp, &e->qpn), 0);
}

/* A prefill with its source pages registered, a decode with its pool. */
static void pair_open(struct ep *p, struct ep *d, const char *dopts)
{
	ep_open(p, NULL);
	ep_open(d, dopts);
	ep_connect(p, d);
	ck_assert_int_eq(V->reg_mr(p->pd, p->mem, NP * PB, VERBS_ACCESS_LOCAL_WRITE,
				   &p->mr, &p->mi), 0);
	for (uint32_t i = 0; i < NP * PB; i++)
		p->mem[i] = (uint8_t)(i * 13 + 1);
}

/* Prefill writes its page `src` to (addr, rkey); decode delivers. Returns
 * the status of the write's completion. */
static enum verbs_wc_status write_page(struct ep *p, struct ep *d, uint32_t src,
				       uint64_t addr, uint32_t rkey)
{
	struct verbs_sge sg = { .addr = (uintptr_t)p->mem + (uint64_t)src * PB,
				.length = PB, .lkey = p->mi.lkey };
	struct verbs_send_wr wr = { .wr_id = 1000 + src, .opcode = VERBS_WR_RDMA_WRITE,
				    .sg = &sg, .num_sge = 1, .remote_addr = addr,
				    .rkey = rkey, .signaled = true };
	struct verbs_wc wc;
	int n = 0;

	ck_assert_int_eq(V->post_send(p->qp, &wr), 0);
	for (int i = 0; i < 1000 && n == 0; i++) {
		ck_assert_int_ge(verbs_emu_deliver(d->ctx, ~0u), 0);
		n = V->poll_cq(p->cq, 1, &wc);
		ck_assert_int_ge(n, 0);
	}
	ck_assert_int_eq(n, 1);
	ck_assert_uint_eq(wc.wr_id, 1000 + src);
	return wc.status;
}

static bool page_is(const struct ep *d, uint32_t dst, const struct ep *p, uint32_t src)
{
	return memcmp(d->mem + (uint64_t)dst * PB, p->mem + (uint64_t)src * PB, PB) == 0;
}

static bool page_zero(const struct ep *d, uint32_t dst)
{
	for (uint32_t i = 0; i < PB; i++)
		if (d->mem[(uint64_t)dst * PB + i])
			return false;
	return true;
}

/* Decode's own completions for the scope (binds, invalidations). */
static void scope_drain(struct verbs_region *r, struct ep *d, struct verbs_scope *sc)
{
	struct verbs_wc wc[16];
	int n;

	while ((n = V->poll_cq(d->cq, 16, wc)) > 0)
		for (int i = 0; i < n; i++) {
			ck_assert_uint_eq(wc[i].wr_id, sc->wr_id);
			verbs_scope_on_wc(r, sc, &wc[i]);
		}
	ck_assert_int_ge(n, 0);
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

START_TEST(test_chunks)
{
	struct ep d;
	struct verbs_region r;
	struct verbs_dev_attr a;

	/* max_mr_size of 3.5 pages: chunks of 3 pages, the last one 1 */
	ep_open(&d, ",max_mr_size=14336");
	ck_assert_int_eq(verbs_region_init(&r, V, d.pd, &d.attr, d.mem, PB, NP, true, 8), 0);
	ck_assert_uint_eq(r.n_chunks, 6);
	for (uint32_t i = 0; i < r.n_chunks; i++) {
		ck_assert_uint_eq(r.chunks[i].first_page, 3 * i);
		ck_assert_uint_eq(r.chunks[i].n_pages, i < 5 ? 3 : 1);
		ck_assert_uint_eq(r.chunks[i].length, r.chunks[i].n_pages * PB);
		ck_assert_uint_le(r.chunks[i].length, d.attr.max_mr_size);
		ck_assert_uint_eq(r.chunks[i].addr, (uintptr_t)d.mem + 3ull * i * PB);
	}
	ck_assert_str_eq(verbs_scope_mode_name(r.mode), "memory_windows");
	/* the PD is held by the region */
	ck_assert_int_eq(V->dealloc_pd(d.pd), -EBUSY);
	verbs_region_deinit(&r);
	verbs_region_deinit(&r);   /* safe twice */
	/* not one page fits */
	a = d.attr;
	a.max_mr_size = PB - 1;
	ck_assert_int_eq(verbs_region_init(&r, V, d.pd, &a, d.mem, PB, NP, true, 8),
			 VERBS_SCOPE_E_PAGE);
	/* windows asked of a device without them */
	a = d.attr;
	a.mw_type2 = false;
	ck_assert_int_eq(verbs_region_init(&r, V, d.pd, &a, d.mem, PB, NP, true, 8), -EINVAL);
	ep_close(&d);
}
END_TEST

/* A device that fails a registration its max_mr_size allows, or
 * registers less than asked (reports a shorter length): refused, nothing
 * left registered, never advertised at full length. */
START_TEST(test_chunk_short)
{
	struct ep d;
	struct verbs_region r;
	struct verbs_dev_attr a;

	ep_open(&d, ",max_mr_size=8192");
	a = d.attr;
	a.max_mr_size = 4 * PB;   /* a lie: the registration fails */
	ck_assert_int_eq(verbs_region_init(&r, V, d.pd, &a, d.mem, PB, NP, true, 8), -EINVAL);
	ck_assert_uint_eq(r.n_chunks, 0);
	pd_unused(&d);   /* nothing left registered */
	ep_close(&d);

	ep_open(&d, ",short_mr=12288");   /* truncates past 3 pages */
	ck_assert_int_eq(verbs_region_init(&r, V, d.pd, &d.attr, d.mem, PB, 3, true, 2), 0);
	ck_assert_uint_eq(r.n_chunks, 1);
	verbs_region_deinit(&r);
	ck_assert_int_eq(verbs_region_init(&r, V, d.pd, &d.attr, d.mem, PB, 4, true, 2),
			 VERBS_SCOPE_E_SHORT);
	ck_assert_uint_eq(r.n_chunks, 0);
	pd_unused(&d);
	ep_close(&d);
}
END_TEST

static void scope_rules(const char *dopts, bool windows)
{
	struct ep p, d;
	struct verbs_region r;
	struct verbs_scope sc = { 0 }, sc2 = { 0 };
	static const uint32_t pages[] = { 9, 5, 6, 7 };   /* runs 5-7 | 9 */
	uint64_t addr, a8;
	uint32_t key, k8;


	pair_open(&p, &d, dopts);
	ck_assert_int_eq(verbs_region_init(&r, V, d.pd, &d.attr, d.mem, PB, NP, windows, 8), 0);
	ck_assert_uint_eq(r.n_chunks, 2);   /* max_mr_size = 8 pages */
	ck_assert_int_eq(verbs_scope_grant(&r, d.qp, &sc, pages, 4, 77), 0);
	ck_assert_uint_eq(sc.n_runs, 2);
	if (windows) {
		/* not live before the binds completed */
		ck_assert_int_eq(sc.state, VERBS_SCOPE_BINDING);
		ck_assert_int_eq(verbs_scope_page(&r, &sc, 5, &addr, &key), VERBS_SCOPE_E_STATE);
		scope_drain(&r, &d, &sc);
	}
	ck_assert_int_eq(sc.state, VERBS_SCOPE_LIVE);
	/* every page of the scope can be written */
	for (uint32_t i = 0; i < 4; i++) {
		ck_assert_int_eq(verbs_scope_page(&r, &sc, pages[i], &addr, &key), 0);
		ck_assert_uint_eq(addr, (uintptr_t)d.mem + (uint64_t)pages[i] * PB);
		ck_assert_int_eq(write_page(&p, &d, i, addr, key), VERBS_WC_SUCCESS);
		ck_assert(page_is(&d, pages[i], &p, i));
	}
	ck_assert_int_eq(verbs_scope_page(&r, &sc, 8, &addr, &key), VERBS_SCOPE_E_RANGE);
	/* page 8, adjacent to the 5-7 run, with that run's key: refused, and
	 * nothing lands (the QP pair is then in error: a new pair follows) */
	ck_assert_int_eq(verbs_scope_page(&r, &sc, 7, &addr, &key), 0);
	ck_assert_int_eq(write_page(&p, &d, 8, addr + PB, key), VERBS_WC_REM_ACCESS_ERR);
	ck_assert(page_zero(&d, 8));
	verbs_scope_qp_gone(&r, &sc);
	ck_assert_int_eq(sc.state, VERBS_SCOPE_DEAD);
	ck_assert_int_eq(V->destroy_qp(p.qp), 0);
	ck_assert_int_eq(V->destroy_qp(d.qp), 0);
	{
		struct verbs_qp_caps caps = { .max_send_wr = 256, .max_recv_wr = 16 };

		ck_assert_int_eq(V->create_qp(p.pd, p.cq, p.cq, &caps, &p.qp, &p.qpn), 0);
		ck_assert_int_eq(V->create_qp(d.pd, d.cq, d.cq, &caps, &d.qp, &d.qpn), 0);
		ep_connect(&p, &d);
	}
	/* a fresh scope on the new QP; revoked, its keys write nothing */
	ck_assert_int_eq(verbs_scope_grant(&r, d.qp, &sc2, pages, 4, 78), 0);
	scope_drain(&r, &d, &sc2);
	ck_assert_int_eq(sc2.state, VERBS_SCOPE_LIVE);
	ck_assert_int_eq(verbs_scope_page(&r, &sc2, 9, &a8, &k8), 0);
	ck_assert_int_eq(verbs_scope_revoke(&r, d.qp, &sc2), 0);
	if (windows) {
		ck_assert_int_eq(sc2.state, VERBS_SCOPE_REVOKING);
		scope_drain(&r, &d, &sc2);
	}
	ck_assert_int_eq(sc2.state, VERBS_SCOPE_DEAD);
	ck_assert_int_eq(verbs_scope_revoke(&r, d.qp, &sc2), VERBS_SCOPE_E_STATE);
	memset(d.mem + 9ull * PB, 0, PB);
	ck_assert_int_eq(write_page(&p, &d, 3, a8, k8), VERBS_WC_REM_ACCESS_ERR);
	ck_assert(page_zero(&d, 9));
	ck_assert_int_eq(V->destroy_qp(p.qp), 0);
	ck_assert_int_eq(V->destroy_qp(d.qp), 0);
	{
		struct verbs_qp_caps caps = { .max_send_wr = 256, .max_recv_wr = 16 };

		ck_assert_int_eq(V->create_qp(p.pd, p.cq, p.cq, &caps, &p.qp, &p.qpn), 0);
		ck_assert_int_eq(V->create_qp(d.pd, d.cq, d.cq, &caps, &d.qp, &d.qpn), 0);
		ep_connect(&p, &d);
	}
	/* the chunks' own keys give no remote write */
	ck_assert_int_eq(write_page(&p, &d, 2, r.chunks[1].addr, r.chunks[1].rkey),
			 VERBS_WC_REM_ACCESS_ERR);
	ck_assert(page_zero(&d, 8));
	verbs_region_deinit(&r);
	ep_close(&p);
	ep_close(&d);
}

START_TEST(test_scope_windows)
{
	scope_rules(",max_mr_size=32768", true);
}
END_TEST

START_TEST(test_scope_mr)
{
	scope_rules(",max_mr_size=32768,mw=0", false);
}
END_TEST

/* Bounds: runs per scope, windows per region, pages outside or twice -
 * refused with nothing posted, nothing taken. */
START_TEST(test_scope_bounds)
{
	struct ep p, d;
	struct verbs_region r;
	struct verbs_scope sc = { 0 }, sc2 = { 0 };
	static const uint32_t three[] = { 1, 3, 5 };     /* three runs */
	static const uint32_t two[] = { 10, 12 };
	static const uint32_t dup[] = { 2, 2 };
	static const uint32_t out[] = { 2, NP };
	struct verbs_wc wc[4];

	pair_open(&p, &d, NULL);
	ck_assert_int_eq(verbs_region_init(&r, V, d.pd, &d.attr, d.mem, PB, NP, true, 4), 0);
	ck_assert_int_eq(verbs_scope_grant(&r, d.qp, &sc, dup, 2, 1), VERBS_SCOPE_E_RANGE);
	ck_assert_int_eq(verbs_scope_grant(&r, d.qp, &sc, out, 2, 1), VERBS_SCOPE_E_RANGE);
	ck_assert_int_eq(verbs_scope_grant(&r, d.qp, &sc, out, 0, 1), VERBS_SCOPE_E_RANGE);
	ck_assert_int_eq(sc.state, VERBS_SCOPE_NONE);
	ck_assert_int_eq(verbs_scope_grant(&r, d.qp, &sc, three, 3, 1), 0);
	ck_assert_uint_eq(r.n_free_mw, 1);
	/* two more windows than are left: refused, nothing posted */
	ck_assert_int_eq(verbs_scope_grant(&r, d.qp, &sc2, two, 2, 2), VERBS_SCOPE_E_RUNS);
	ck_assert_uint_eq(r.n_free_mw, 1);
	ck_assert_int_eq(sc2.state, VERBS_SCOPE_NONE);
	/* a used scope cannot be granted again */
	ck_assert_int_eq(verbs_scope_grant(&r, d.qp, &sc, two, 2, 3), VERBS_SCOPE_E_STATE);
	scope_drain(&r, &d, &sc);
	ck_assert_int_eq(sc.state, VERBS_SCOPE_LIVE);
	ck_assert_int_eq(V->poll_cq(d.cq, 4, wc), 0);
	ck_assert_int_eq(verbs_scope_revoke(&r, d.qp, &sc), 0);
	scope_drain(&r, &d, &sc);
	ck_assert_int_eq(sc.state, VERBS_SCOPE_DEAD);
	ck_assert_uint_eq(r.n_free_mw, 4);
	/* now it fits; and a dead scope may be granted again */
	ck_assert_int_eq(verbs_scope_grant(&r, d.qp, &sc2, two, 2, 2), 0);
	scope_drain(&r, &d, &sc2);
	ck_assert_int_eq(sc2.state, VERBS_SCOPE_LIVE);
	ck_assert_int_eq(verbs_scope_grant(&r, d.qp, &sc, three, 2, 4), 0);
	ck_assert_int_eq(V->qp_err(d.qp), 0);
	verbs_scope_qp_gone(&r, &sc);
	verbs_scope_qp_gone(&r, &sc2);
	ck_assert_uint_eq(r.n_free_mw, 4);
	verbs_region_deinit(&r);
	ep_close(&p);
	ep_close(&d);
}
END_TEST

/* Adjacent pages in two chunks are two runs: one window never spans two
 * registrations. Both pages are writable, their neighbours are not. */
START_TEST(test_scope_chunk_boundary)
{
	struct ep p, d;
	struct verbs_region r;
	struct verbs_scope sc = { 0 };
	static const uint32_t pages[] = { 8, 7 };
	uint64_t addr;
	uint32_t key;

	pair_open(&p, &d, ",max_mr_size=32768");
	ck_assert_int_eq(verbs_region_init(&r, V, d.pd, &d.attr, d.mem, PB, NP, true, 4), 0);
	ck_assert_int_eq(verbs_scope_grant(&r, d.qp, &sc, pages, 2, 9), 0);
	ck_assert_uint_eq(sc.n_runs, 2);
	ck_assert_uint_eq(sc.runs[0].first_page, 7);
	ck_assert_uint_eq(sc.runs[1].first_page, 8);
	scope_drain(&r, &d, &sc);
	for (uint32_t i = 0; i < 2; i++) {
		ck_assert_int_eq(verbs_scope_page(&r, &sc, pages[i], &addr, &key), 0);
		ck_assert_int_eq(write_page(&p, &d, i, addr, key), VERBS_WC_SUCCESS);
		ck_assert(page_is(&d, pages[i], &p, i));
	}
	ck_assert_int_eq(verbs_scope_page(&r, &sc, 8, &addr, &key), 0);
	ck_assert_int_eq(write_page(&p, &d, 5, addr + PB, key), VERBS_WC_REM_ACCESS_ERR);
	ck_assert(page_zero(&d, 9));
	ck_assert_int_eq(V->qp_err(d.qp), 0);
	verbs_scope_qp_gone(&r, &sc);
	verbs_region_deinit(&r);
	ep_close(&p);
	ep_close(&d);
}
END_TEST

/* A range the pool added later (kvctl pool resize: its own memory) is
 * registered too, in max_mr_size chunks: a scope over pages of both
 * ranges writes exactly them, a page beside the new range is refused; a
 * chunk is dropped only while no window is bound in it. */
static void added_range(bool windows)
{
	struct ep p, d;
	struct verbs_region r;
	struct verbs_scope sc = { 0 };
	static const uint32_t pages[] = { 3, 16, 17, 20 };
	uint8_t *more = calloc(8, PB);   /* pages 16..23 */
	uint64_t addr;
	uint32_t key;

	ck_assert_ptr_nonnull(more);
	pair_open(&p, &d, ",max_mr_size=16384");
	ck_assert_int_eq(verbs_region_init(&r, V, d.pd, &d.attr, d.mem, PB, NP, windows,
					   windows ? 8 : 0), 0);
	/* not registered yet: refused before anything is posted */
	ck_assert_int_eq(verbs_scope_grant(&r, d.qp, &sc, pages, 4, 5), VERBS_SCOPE_E_RANGE);
	ck_assert_uint_eq(verbs_region_page_addr(&r, 16), 0);
	ck_assert_int_eq(verbs_region_add(&r, more, 16, 8), 0);
	ck_assert_uint_eq(r.n_chunks, 4 + 2);      /* 16 + 8 pages in 4-page chunks */
	ck_assert_uint_eq(verbs_region_page_addr(&r, 17), (uintptr_t)more + PB);
	ck_assert_uint_eq(verbs_region_page_addr(&r, 3), (uintptr_t)d.mem + 3 * PB);
	/* a page registered twice is refused, nothing added */
	ck_assert_int_eq(verbs_region_add(&r, more, 20, 1), VERBS_SCOPE_E_RANGE);
	ck_assert_uint_eq(r.n_chunks, 6);
	ck_assert_int_eq(verbs_scope_grant(&r, d.qp, &sc, pages, 4, 5), 0);
	ck_assert_uint_eq(sc.n_runs, 3);   /* 3 | 16-17 | 20 (another chunk) */
	scope_drain(&r, &d, &sc);
	ck_assert_int_eq(sc.state, VERBS_SCOPE_LIVE);
	for (uint32_t i = 0; i < 4; i++) {
		ck_assert_int_eq(verbs_scope_page(&r, &sc, pages[i], &addr, &key), 0);
		ck_assert_int_eq(write_page(&p, &d, i, addr, key), VERBS_WC_SUCCESS);
	}
	ck_assert(page_is(&d, 3, &p, 0));
	ck_assert(memcmp(more, p.mem + 1 * PB, PB) == 0);
	ck_assert(memcmp(more + PB, p.mem + 2 * PB, PB) == 0);
	ck_assert(memcmp(more + 4 * PB, p.mem + 3 * PB, PB) == 0);
	if (windows) {
		/* a window is bound in page 16's chunk: it cannot go */
		ck_assert_int_eq(verbs_region_drop(&r, 16), -EBUSY);
		ck_assert_uint_eq(verbs_region_page_addr(&r, 16), (uintptr_t)more);
	}
	/* the page beside the run 16-17, in the new range: refused */
	ck_assert_int_eq(verbs_scope_page(&r, &sc, 17, &addr, &key), 0);
	ck_assert_int_eq(write_page(&p, &d, 9, addr + PB, key), VERBS_WC_REM_ACCESS_ERR);
	for (uint32_t i = 0; i < PB; i++)
		ck_assert_uint_eq(more[2 * PB + i], 0);
	ck_assert_int_eq(V->qp_err(d.qp), 0);
	verbs_scope_qp_gone(&r, &sc);
	/* no scope left: the chunk goes, its pages are unregistered */
	ck_assert_int_eq(verbs_region_drop(&r, 16), 0);
	ck_assert_uint_eq(verbs_region_page_addr(&r, 17), 0);
	ck_assert_uint_eq(verbs_region_page_addr(&r, 20), (uintptr_t)more + 4 * PB);
	ck_assert_int_eq(verbs_region_drop(&r, 16), VERBS_SCOPE_E_RANGE);
	verbs_region_deinit(&r);
	ep_close(&p);
	ep_close(&d);
	free(more);
}

START_TEST(test_added_range_windows)
{
	added_range(true);
}
END_TEST

START_TEST(test_added_range_mr)
{
	added_range(false);
}
END_TEST

/* Windows rotate (FIFO): a revoked scope's window is the last to be
 * bound again, and then with a new key - an old key is never live again
 * soon after its revoke. */
START_TEST(test_window_rotation)
{
	struct ep p, d;
	struct verbs_region r;
	struct verbs_scope sc = { 0 };
	static const uint32_t page[] = { 3 };
	uint32_t keys[5];
	uint64_t addr;

	pair_open(&p, &d, NULL);
	ck_assert_int_eq(verbs_region_init(&r, V, d.pd, &d.attr, d.mem, PB, NP, true, 4), 0);
	for (int i = 0; i < 5; i++) {
		ck_assert_int_eq(verbs_scope_grant(&r, d.qp, &sc, page, 1, 10 + (uint64_t)i), 0);
		scope_drain(&r, &d, &sc);
		ck_assert_int_eq(verbs_scope_page(&r, &sc, 3, &addr, &keys[i]), 0);
		ck_assert_int_eq(verbs_scope_revoke(&r, d.qp, &sc), 0);
		scope_drain(&r, &d, &sc);
		ck_assert_int_eq(sc.state, VERBS_SCOPE_DEAD);
	}
	for (int i = 1; i < 4; i++)
		for (int j = 0; j < i; j++)
			ck_assert_uint_ne(keys[i] >> 8, keys[j] >> 8);   /* other windows */
	ck_assert_uint_eq(keys[4] >> 8, keys[0] >> 8);            /* back to the first */
	ck_assert_uint_ne(keys[4], keys[0]);                      /* with a new key */
	/* every old key writes nothing */
	for (int i = 0; i < 4; i++) {
		ck_assert_int_eq(verbs_scope_grant(&r, d.qp, &sc, page, 1, 20), 0);
		scope_drain(&r, &d, &sc);
		ck_assert_int_eq(verbs_scope_revoke(&r, d.qp, &sc), 0);
		scope_drain(&r, &d, &sc);
	}
	ck_assert_int_eq(write_page(&p, &d, 1, addr, keys[0]), VERBS_WC_REM_ACCESS_ERR);
	ck_assert(page_zero(&d, 3));
	verbs_region_deinit(&r);
	ep_close(&p);
	ep_close(&d);
}
END_TEST

/* More runs than one scope may have. */
START_TEST(test_scope_runs_max)
{
	struct ep d;
	struct verbs_region r;
	struct verbs_scope sc = { 0 };
	uint32_t *pages = calloc(VERBS_SCOPE_RUNS_MAX + 1, sizeof(*pages));
	uint8_t *pool = calloc(2 * (VERBS_SCOPE_RUNS_MAX + 1), PB);

	ck_assert_ptr_nonnull(pages);
	ck_assert_ptr_nonnull(pool);
	ep_open(&d, ",mw=0");
	ck_assert_int_eq(verbs_region_init(&r, V, d.pd, &d.attr, pool, PB,
					   2 * (VERBS_SCOPE_RUNS_MAX + 1), false, 0), 0);
	ck_assert_str_eq(verbs_scope_mode_name(r.mode), "per_request_mr");
	for (uint32_t i = 0; i <= VERBS_SCOPE_RUNS_MAX; i++)
		pages[i] = 2 * i;   /* none adjacent */
	ck_assert_int_eq(verbs_scope_grant(&r, d.qp, &sc, pages, VERBS_SCOPE_RUNS_MAX + 1, 1),
			 VERBS_SCOPE_E_RUNS);
	ck_assert_int_eq(verbs_scope_grant(&r, d.qp, &sc, pages, VERBS_SCOPE_RUNS_MAX, 1), 0);
	ck_assert_uint_eq(sc.n_runs, VERBS_SCOPE_RUNS_MAX);
	ck_assert_int_eq(verbs_scope_revoke(&r, d.qp, &sc), 0);
	verbs_region_deinit(&r);
	ep_close(&d);
	free(pages);
	free(pool);
}
END_TEST

/* The QP goes to error while binds are pending: the flushed binds break
 * the scope; after the drain, qp_gone makes it dead and the windows are
 * replaced. */
START_TEST(test_scope_broken)
{
	struct ep p, d;
	struct verbs_region r;
	struct verbs_scope sc = { 0 };
	static const uint32_t pages[] = { 0, 1, 4 };

	pair_open(&p, &d, NULL);
	ck_assert_int_eq(verbs_region_init(&r, V, d.pd, &d.attr, d.mem, PB, NP, true, 4), 0);
	/* a bind that fails: the window cannot bind on a QP in error */
	ck_assert_int_eq(V->qp_err(d.qp), 0);
	ck_assert_int_eq(verbs_scope_grant(&r, d.qp, &sc, pages, 3, 5), 0);
	scope_drain(&r, &d, &sc);
	ck_assert_int_eq(sc.state, VERBS_SCOPE_BROKEN);
	ck_assert_int_eq(verbs_scope_revoke(&r, d.qp, &sc), VERBS_SCOPE_E_STATE);
	verbs_scope_qp_gone(&r, &sc);
	ck_assert_int_eq(sc.state, VERBS_SCOPE_DEAD);
	ck_assert_uint_eq(r.n_free_mw, 4);
	ck_assert_uint_eq(r.n_mw, 4);
	verbs_region_deinit(&r);
	ep_close(&p);
	ep_close(&d);
}
END_TEST

static Suite *verbs_scope_suite(void)
{
	Suite *s = suite_create("verbs_scope");
	TCase *tc = tcase_create("scope");

	verbs_test_fixtures(tc, setup, teardown_dir);
	tcase_add_test(tc, test_chunks);
	tcase_add_test(tc, test_chunk_short);
	tcase_add_test(tc, test_scope_windows);
	tcase_add_test(tc, test_scope_mr);
	tcase_add_test(tc, test_scope_bounds);
	tcase_add_test(tc, test_scope_chunk_boundary);
	tcase_add_test(tc, test_added_range_windows);
	tcase_add_test(tc, test_added_range_mr);
	tcase_add_test(tc, test_window_rotation);
	tcase_add_test(tc, test_scope_runs_max);
	tcase_add_test(tc, test_scope_broken);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(verbs_scope_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
