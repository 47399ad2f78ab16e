/* verbs_scope.h - decode's pool as RDMA memory, and per-request write scope.
 *
 * A region is the decode pool registered with one device: in chunks no
 * larger than the device's max_mr_size, each a whole number of pages, each
 * chunk's length the one the device actually registered (a device that
 * registers less than asked is refused, never advertised at full length).
 * The chunks themselves grant no remote access: a peer can write only
 * through a request's *scope*, which covers exactly that request's pages
 * for as long as it is granted:
 *
 *   VERBS_SCOPE_WINDOWS   type-2 memory windows, one per run of adjacent
 *                         pages in one chunk, bound on the QP of the peer
 *                         that will write (no other QP can use them) and
 *                         invalidated at revoke;
 *   VERBS_SCOPE_MR        where the device has no windows: one
 *                         registration with remote write per run, made at
 *                         grant and deregistered at revoke.
 *
 * A scope is live once every bind has completed (windows; MR scopes are
 * live at once) and dead once every invalidation has completed (MR
 * scopes: at once). Only a dead scope proves the NIC will refuse the
 * peer's writes to those pages: a page may leave its fence only then, or
 * once the QP is in the error state and its flush completions drained.
 *
 * Errors: negative errno from the device; positive VERBS_SCOPE_E_*.
 * One thread (the loop) uses a region and its scopes.
 */
#pragma once

#include "net/verbs/verbs_ops.h"

enum {
	VERBS_SCOPE_E_PAGE = 1,   /* max_mr_size is smaller than one page */
	VERBS_SCOPE_E_SHORT,      /* the device registered less than asked */
	VERBS_SCOPE_E_RUNS,       /* the request's pages need more runs
				   * (windows) than a scope or the region has */
	VERBS_SCOPE_E_RANGE,      /* a page outside the pool, or named twice */
	VERBS_SCOPE_E_STATE,      /* grant on a used scope, revoke twice ... */
	VERBS_SCOPE_E_FAILED,     /* a bind or invalidation failed: tear the
				   * QP down (error state) before reuse */
};

#define VERBS_SCOPE_RUNS_MAX 64   /* runs (windows) per request */

enum verbs_scope_mode {
	VERBS_SCOPE_WINDOWS,
	VERBS_SCOPE_MR,
};

struct verbs_chunk {
	struct verbs_mr *mr;
	uint32_t lkey, rkey;      /* (the rkey grants no remote access) */
	uint64_t addr;            /* first byte */
	uint64_t length;          /* registered length, whole pages */
	uint32_t first_page;
	uint32_t n_pages;
};

struct verbs_region {
	const struct verbs_ops *ops;
	struct verbs_pd *pd;
	enum verbs_scope_mode mode;
	uint8_t *base;            /* (n_pages, page_bytes) the pool's first range */
	uint64_t page_bytes;
	uint32_t n_pages;
	uint64_t max_mr_size;     /* the device's: no chunk is larger */
	struct verbs_chunk *chunks;
	uint32_t n_chunks;
	/* windows not bound to any scope: a FIFO ring of cap, so a window
	 * rebinds (and its key's low byte turns) as rarely as possible */
	struct verbs_mw **free_mw;
	uint32_t free_head, n_free_mw, cap_mw, n_mw;
};

struct verbs_scope_run {
	uint32_t first_page, n_pages;
	uint64_t addr, len;
	uint32_t rkey;
	struct verbs_mw *mw;      /* WINDOWS */
	struct verbs_mr *mr;      /* MR */
};

enum verbs_scope_state {
	VERBS_SCOPE_NONE,         /* nothing granted */
	VERBS_SCOPE_BINDING,      /* binds posted, not all completed */
	VERBS_SCOPE_LIVE,
	VERBS_SCOPE_REVOKING,     /* invalidations posted */
	VERBS_SCOPE_DEAD,         /* the NIC refuses writes through it */
	VERBS_SCOPE_BROKEN,       /* a bind / invalidation failed */
};

struct verbs_scope {
	enum verbs_scope_state state;
	uint32_t n_runs;
	uint32_t pending;         /* bind / invalidate completions awaited */
	uint64_t wr_id;           /* every WR of this scope carries it */
	struct verbs_scope_run runs[VERBS_SCOPE_RUNS_MAX];
};

/* Register base (n_pages of page_bytes) on pd. windows: use type-2
 * windows (attr->mw_type2 must say so), else per-request registrations;
 * max_windows: windows allocated for all scopes together (WINDOWS). */
int verbs_region_init(struct verbs_region *r, const struct verbs_ops *ops,
		      struct verbs_pd *pd, const struct verbs_dev_attr *attr,
		      void *base, uint64_t page_bytes, uint32_t n_pages,
		      bool windows, uint32_t max_windows);
/* Register pages [first_page, first_page + n_pages) of the pool at base
 * too (a range the pool added later, e.g. by a resize), in chunks as at
 * init, each chunk's real length checked. VERBS_SCOPE_E_RANGE when a page
 * is registered already (nothing added), else as init. */
int verbs_region_add(struct verbs_region *r, void *base, uint32_t first_page,
		     uint32_t n_pages);
/* Deregister the chunk holding page (the pool moved or freed its memory).
 * The caller makes sure no scope covers any page of it (a window bound
 * in it makes the device answer -EBUSY, and nothing changes). */
int verbs_region_drop(struct verbs_region *r, uint32_t page);
/* Where the region registered page (0: not registered). */
uint64_t verbs_region_page_addr(const struct verbs_region *r, uint32_t page);
/* Deregister; every scope must be dead or never granted. Safe twice. */
void verbs_region_deinit(struct verbs_region *r);
const char *verbs_scope_mode_name(enum verbs_scope_mode m);

/* Grant qp's peer write access to exactly pages[0..n) (any order, no
 * duplicates). Windows: binds are posted with wr_id (completions go to
 * verbs_scope_on_wc); nothing is posted when an error is returned. */
int verbs_scope_grant(struct verbs_region *r, struct verbs_qp *qp,
		      struct verbs_scope *sc, const uint32_t *pages, uint32_t n,
		      uint64_t wr_id);
/* Where the peer writes page p of the scope: remote address and key. */
int verbs_scope_page(const struct verbs_region *r, const struct verbs_scope *sc,
		     uint32_t page, uint64_t *addr, uint32_t *rkey);
/* Take the access back. Windows: invalidations are posted (dead when
 * their completions came); MR: deregistered now (dead at once). */
int verbs_scope_revoke(struct verbs_region *r, struct verbs_qp *qp,
		       struct verbs_scope *sc);
/* A send completion whose wr_id is sc->wr_id. */
void verbs_scope_on_wc(struct verbs_region *r, struct verbs_scope *sc,
		       const struct verbs_wc *wc);
/* The QP the windows were bound on went to the error state and its
 * flush completions were drained (or it was destroyed): whatever is
 * still pending, nothing can be written through the scope any more. */
void verbs_scope_qp_gone(struct verbs_region *r, struct verbs_scope *sc);
