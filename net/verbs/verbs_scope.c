/* verbs_scope.c - the decode pool as RDMA memory, and per-request scopes.
 *
 * Design. Invariant 2 over RDMA needs more than fences: a page must not be
 * writable by a peer for a request that no longer owns it, and the proof
 * has to come from the NIC, not from the peer's good behaviour. So the
 * pool's registrations grant no remote access at all (local write and
 * window binding only); each request gets remote write through windows
 * (or registrations) covering exactly its pages, and loses it at revoke.
 *
 * Chunks: a registration may not exceed max_mr_size, so the pool is cut
 * into chunks of floor(max_mr_size / page_bytes) pages; a page never
 * straddles two chunks, so every run of a scope lies in one registration.
 * The length the device reports for each registration is checked against
 * what was asked (a shorter one is refused: advertising a truncated region
 * at full length lets a peer's write fail - or land - beyond it).
 *
 * Runs: a request's pages are sorted and cut into runs of adjacent pages
 * within one chunk; each run is one window (one bind WR, one invalidate
 * WR) or one registration. A scope has at most VERBS_SCOPE_RUNS_MAX runs
 * and the region a bounded number of windows: past either bound the grant
 * is refused before anything is posted, and the caller refuses the request
 * (admission), never writes it some other way.
 *
 * Completions: a bind takes effect when the NIC executes it; its
 * completion tells us the key is live. An invalidation likewise: only its
 * completion proves that writes with that key are refused from then on,
 * so the scope is DEAD only when every one has completed. A failed bind
 * or invalidation leaves the scope BROKEN: the owner must move the QP to
 * the error state (which makes every window bound on it unusable) and
 * drain it, then call verbs_scope_qp_gone(); the windows are then freed
 * and replaced, since their state on the device is unknown.
 */
#include "net/verbs/verbs_scope.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "conf/util.h"

static struct verbs_mw *mw_take(struct verbs_region *r)
{
	struct verbs_mw *mw = r->free_mw[r->free_head];

	r->free_head = (r->free_head + 1) % r->cap_mw;
	r->n_free_mw--;
	return mw;
}

static void mw_put(struct verbs_region *r, struct verbs_mw *mw)
{
	r->free_mw[(r->free_head + r->n_free_mw) % r->cap_mw] = mw;
	r->n_free_mw++;
}

const char *verbs_scope_mode_name(enum verbs_scope_mode m)
{
	return m == VERBS_SCOPE_WINDOWS ? "memory_windows" : "per_request_mr";
}

void verbs_region_deinit(struct verbs_region *r)
{
	while (r->n_free_mw > 0)
		r->ops->dealloc_mw(mw_take(r));
	free(r->free_mw);
	r->free_mw = NULL;
	r->free_head = r->n_free_mw = r->cap_mw = r->n_mw = 0;
	for (uint32_t i = 0; i < r->n_chunks; i++)
		if (r->chunks[i].mr)
			r->ops->dereg_mr(r->chunks[i].mr);
	free(r->chunks);
	r->chunks = NULL;
	r->n_chunks = 0;
}

/* Register pages [first, first + n) at base as chunks of at most
 * max_mr_size, appended to r->chunks; on failure the ones this call
 * added are deregistered again. */
static int region_register(struct verbs_region *r, uint8_t *base, uint32_t first,
			   uint32_t n)
{
	uint64_t per_chunk = r->max_mr_size / r->page_bytes;
	unsigned access = VERBS_ACCESS_LOCAL_WRITE;
	uint32_t n_new, had = r->n_chunks;
	struct verbs_chunk *cs;
	int rc;

	if (per_chunk == 0)
		return VERBS_SCOPE_E_PAGE;
	if (n == 0 || (uint64_t)first + n > UINT32_MAX)
		return VERBS_SCOPE_E_RANGE;
	per_chunk = KVD_MIN(per_chunk, (uint64_t)n);
	n_new = (uint32_t)((n + per_chunk - 1) / per_chunk);
	cs = realloc(r->chunks, (had + n_new) * sizeof(*cs));
	if (!cs)
		return -ENOMEM;
	r->chunks = cs;
	memset(cs + had, 0, n_new * sizeof(*cs));
	if (r->mode == VERBS_SCOPE_WINDOWS)
		access |= VERBS_ACCESS_MW_BIND;
	for (uint32_t i = 0; i < n_new; i++) {
		struct verbs_chunk *c = &cs[had + i];
		struct verbs_mr_info mi;
		uint32_t off = (uint32_t)(i * per_chunk);

		c->first_page = first + off;
		c->n_pages = (uint32_t)KVD_MIN(per_chunk, (uint64_t)(n - off));
		c->addr = (uintptr_t)base + (uint64_t)off * r->page_bytes;
		r->n_chunks = had + i + 1;
		rc = r->ops->reg_mr(r->pd, (void *)(uintptr_t)c->addr,
				    c->n_pages * r->page_bytes, access, &c->mr, &mi);
		if (rc) {
			c->mr = NULL;
			goto fail;
		}
		if (mi.addr != c->addr || mi.length < c->n_pages * r->page_bytes) {
			rc = VERBS_SCOPE_E_SHORT;
			goto fail;
		}
		c->length = c->n_pages * r->page_bytes;
		c->lkey = mi.lkey;
		c->rkey = mi.rkey;
	}
	return 0;
fail:
	while (r->n_chunks > had) {
		struct verbs_chunk *c = &r->chunks[--r->n_chunks];

		if (c->mr)
			r->ops->dereg_mr(c->mr);
	}
	return rc;
}

/* The chunk holding page, or UINT32_MAX. */
static uint32_t chunk_of(const struct verbs_region *r, uint32_t page)
{
	for (uint32_t i = 0; i < r->n_chunks; i++)
		if (page >= r->chunks[i].first_page &&
		    page - r->chunks[i].first_page < r->chunks[i].n_pages)
			return i;
	return UINT32_MAX;
}

uint64_t verbs_region_page_addr(const struct verbs_region *r, uint32_t page)
{
	uint32_t c = chunk_of(r, page);

	if (c == UINT32_MAX)
		return 0;
	return r->chunks[c].addr + (uint64_t)(page - r->chunks[c].first_page) * r->page_bytes;
}

int verbs_region_add(struct verbs_region *r, void *base, uint32_t first_page,
		     uint32_t n_pages)
{
	if (!base)
		return -EINVAL;
	for (uint32_t p = first_page; p - first_page < n_pages; p++)
		if (chunk_of(r, p) != UINT32_MAX)
			return VERBS_SCOPE_E_RANGE;
	return region_register(r, base, first_page, n_pages);
}

int verbs_region_drop(struct verbs_region *r, uint32_t page)
{
	uint32_t c = chunk_of(r, page);

	if (c == UINT32_MAX)
		return VERBS_SCOPE_E_RANGE;
	if (r->chunks[c].mr) {
		int rc = r->ops->dereg_mr(r->chunks[c].mr);

		if (rc)
			return rc;   /* -EBUSY: a window is still bound in it */
	}
	r->chunks[c] = r->chunks[--r->n_chunks];
	return 0;
}

int verbs_region_init(struct verbs_region *r, const struct verbs_ops *ops,
		      struct verbs_pd *pd, const struct verbs_dev_attr *attr,
		      void *base, uint64_t page_bytes, uint32_t n_pages,
		      bool windows, uint32_t max_windows)
{
	int rc;

	memset(r, 0, sizeof(*r));
	r->ops = ops;
	r->pd = pd;
	r->base = base;
	r->page_bytes = page_bytes;
	r->n_pages = n_pages;
	r->mode = windows ? VERBS_SCOPE_WINDOWS : VERBS_SCOPE_MR;
	r->max_mr_size = attr->max_mr_size;
	if (!base || page_bytes == 0 || n_pages == 0 ||
	    (windows && (!attr->mw_type2 || max_windows == 0)))
		return -EINVAL;
	rc = region_register(r, base, 0, n_pages);
	if (rc)
		goto fail;
	if (windows) {
		r->free_mw = calloc(max_windows, sizeof(*r->free_mw));
		if (!r->free_mw) {
			rc = -ENOMEM;
			goto fail;
		}
		r->cap_mw = max_windows;
		for (; r->n_free_mw < max_windows; r->n_free_mw++) {
			rc = ops->alloc_mw(pd, &r->free_mw[r->n_free_mw]);
			if (rc)
				goto fail;
		}
		r->n_mw = max_windows;
	}
	return 0;
fail:
	verbs_region_deinit(r);
	return rc;
}

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return x < y ? -1 : x > y;
}

/* Cut sorted pages into runs; VERBS_SCOPE_E_* when they do not fit. */
static int runs_make(const struct verbs_region *r, uint32_t *sorted, uint32_t n,
		     struct verbs_scope *sc)
{
	sc->n_runs = 0;
	for (uint32_t i = 0; i < n; i++) {
		uint32_t p = sorted[i];
		struct verbs_scope_run *run = sc->n_runs ? &sc->runs[sc->n_runs - 1] : NULL;

		if (chunk_of(r, p) == UINT32_MAX || (i && sorted[i - 1] == p))
			return VERBS_SCOPE_E_RANGE;
		if (run && run->first_page + run->n_pages == p &&
		    chunk_of(r, run->first_page) == chunk_of(r, p)) {
			run->n_pages++;
			run->len += r->page_bytes;
			continue;
		}
		if (sc->n_runs == VERBS_SCOPE_RUNS_MAX)
			return VERBS_SCOPE_E_RUNS;
		run = &sc->runs[sc->n_runs++];
		memset(run, 0, sizeof(*run));
		run->first_page = p;
		run->n_pages = 1;
		run->addr = verbs_region_page_addr(r, p);
		run->len = r->page_bytes;
	}
	return 0;
}

static void scope_unwind_mr(struct verbs_region *r, struct verbs_scope *sc)
{
	for (uint32_t i = 0; i < sc->n_runs; i++)
		if (sc->runs[i].mr) {
			r->ops->dereg_mr(sc->runs[i].mr);
			sc->runs[i].mr = NULL;
		}
}

int verbs_scope_grant(struct verbs_region *r, struct verbs_qp *qp,
		      struct verbs_scope *sc, const uint32_t *pages, uint32_t n,
		      uint64_t wr_id)
{
	uint32_t *sorted;
	int rc;

	if (sc->state != VERBS_SCOPE_NONE && sc->state != VERBS_SCOPE_DEAD)
		return VERBS_SCOPE_E_STATE;
	if (n == 0)
		return VERBS_SCOPE_E_RANGE;
	sorted = malloc(n * sizeof(*sorted));
	if (!sorted)
		return -ENOMEM;
	memcpy(sorted, pages, n * sizeof(*sorted));
	qsort(sorted, n, sizeof(*sorted), cmp_u32);
	memset(sc, 0, sizeof(*sc));
	rc = runs_make(r, sorted, n, sc);
	free(sorted);
	if (rc)
		goto refuse;
	sc->wr_id = wr_id;
	if (r->mode == VERBS_SCOPE_MR) {
		for (uint32_t i = 0; i < sc->n_runs; i++) {
			struct verbs_scope_run *run = &sc->runs[i];
			struct verbs_mr_info mi;

			rc = r->ops->reg_mr(r->pd, (void *)(uintptr_t)run->addr, run->len,
					    VERBS_ACCESS_LOCAL_WRITE |
					    VERBS_ACCESS_REMOTE_WRITE, &run->mr, &mi);
			if (rc == 0 && mi.length < run->len)
				rc = VERBS_SCOPE_E_SHORT;
			if (rc) {
				if (rc > 0)
					r->ops->dereg_mr(run->mr);
				run->mr = NULL;
				scope_unwind_mr(r, sc);
				goto refuse;
			}
			run->rkey = mi.rkey;
		}
		sc->state = VERBS_SCOPE_LIVE;
		return 0;
	}
	if (sc->n_runs > r->n_free_mw) {
		rc = VERBS_SCOPE_E_RUNS;
		goto refuse;
	}
	for (uint32_t i = 0; i < sc->n_runs; i++) {
		struct verbs_scope_run *run = &sc->runs[i];
		struct verbs_chunk *c = &r->chunks[chunk_of(r, run->first_page)];

		run->mw = mw_take(r);
		rc = r->ops->bind_mw(qp, run->mw, c->mr, run->addr, run->len,
				     VERBS_ACCESS_REMOTE_WRITE, wr_id, &run->rkey);
		if (rc) {
			/* the binds posted so far will complete: the scope is
			 * broken, the QP must be torn down */
			mw_put(r, run->mw);
			run->mw = NULL;
			sc->n_runs = i;
			sc->state = i ? VERBS_SCOPE_BROKEN : VERBS_SCOPE_NONE;
			return rc;
		}
		sc->pending++;
	}
	sc->state = VERBS_SCOPE_BINDING;
	return 0;
refuse:
	memset(sc, 0, sizeof(*sc));
	return rc;
}

int verbs_scope_page(const struct verbs_region *r, const struct verbs_scope *sc,
		     uint32_t page, uint64_t *addr, uint32_t *rkey)
{
	(void)r;
	if (sc->state != VERBS_SCOPE_LIVE)
		return VERBS_SCOPE_E_STATE;
	for (uint32_t i = 0; i < sc->n_runs; i++) {
		const struct verbs_scope_run *run = &sc->runs[i];

		if (page >= run->first_page && page - run->first_page < run->n_pages) {
			*addr = run->addr + (uint64_t)(page - run->first_page) * r->page_bytes;
			*rkey = run->rkey;
			return 0;
		}
	}
	return VERBS_SCOPE_E_RANGE;
}

static void scope_windows_home(struct verbs_region *r, struct verbs_scope *sc)
{
	for (uint32_t i = 0; i < sc->n_runs; i++)
		if (sc->runs[i].mw) {
			mw_put(r, sc->runs[i].mw);
			sc->runs[i].mw = NULL;
		}
}

int verbs_scope_revoke(struct verbs_region *r, struct verbs_qp *qp,
		       struct verbs_scope *sc)
{
	if (sc->state != VERBS_SCOPE_LIVE && sc->state != VERBS_SCOPE_BINDING)
		return VERBS_SCOPE_E_STATE;
	if (r->mode == VERBS_SCOPE_MR) {
		scope_unwind_mr(r, sc);
		sc->state = VERBS_SCOPE_DEAD;
		return 0;
	}
	for (uint32_t i = 0; i < sc->n_runs; i++) {
		int rc = r->ops->invalidate(qp, sc->runs[i].rkey, sc->wr_id);

		if (rc) {
			sc->state = VERBS_SCOPE_BROKEN;
			return rc;
		}
		sc->pending++;
	}
	sc->state = VERBS_SCOPE_REVOKING;
	return 0;
}

void verbs_scope_on_wc(struct verbs_region *r, struct verbs_scope *sc,
		       const struct verbs_wc *wc)
{
	if (sc->pending == 0)
		return;
	sc->pending--;
	if (wc->status != VERBS_WC_SUCCESS) {
		sc->state = VERBS_SCOPE_BROKEN;
		return;
	}
	if (sc->pending > 0)
		return;
	if (sc->state == VERBS_SCOPE_BINDING) {
		sc->state = VERBS_SCOPE_LIVE;
	} else if (sc->state == VERBS_SCOPE_REVOKING) {
		scope_windows_home(r, sc);
		sc->state = VERBS_SCOPE_DEAD;
	}
}

void verbs_scope_qp_gone(struct verbs_region *r, struct verbs_scope *sc)
{
	if (r->mode == VERBS_SCOPE_MR) {
		scope_unwind_mr(r, sc);
	} else {
		/* their state on the device is unknown: replace them */
		for (uint32_t i = 0; i < sc->n_runs; i++) {
			struct verbs_mw *mw = sc->runs[i].mw;

			if (!mw)
				continue;
			sc->runs[i].mw = NULL;
			r->ops->dealloc_mw(mw);
			if (r->ops->alloc_mw(r->pd, &mw) == 0)
				mw_put(r, mw);
			else
				r->n_mw--;
		}
	}
	sc->pending = 0;
	sc->state = VERBS_SCOPE_DEAD;
}
