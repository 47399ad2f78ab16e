/* kvpool.c - the KV page pool: ownership, integrity tags, deferred release.
 *
 * What the pool knows and where it keeps it. Page *metadata* (state, owner,
 * generation, fence count, retiring flag) lives here, in host memory, behind
 * one mutex. Page *bytes* live in chunks obtained from a kvmem backend
 * (host RAM or CUDA device memory); the pool touches them only to read and
 * write the 64-byte integrity tag at the start of each page, and always
 * through the backend's read/write (or its batched tags_compare), so the
 * same code guards device memory.
 *
 * Why both metadata and tags. Metadata says who may use a page *now*; the
 * tag says who *wrote* the bytes that are in it. Pages are never zeroed, so
 * a page reserved by request B still holds request A's KV until B's writer
 * overwrites it - and a writer can fail silently (a short transfer, a
 * lost batch, a remote writer replaying an old batch). Checking metadata
 * alone would let B read A's bytes; checking tags alone would accept a
 * replayed tag of a page that was since re-reserved. verify checks both:
 * the table entry against the metadata, then the bytes in the page against
 * the tag that B's own writer must have written (owner, generation, physical
 * page, index in the table, tokens). Generations come from one pool-wide
 * counter, so a tag can never match a different reservation, of this page
 * or of another.
 *
 * Free list. A stack of page indices with each FREE page's position in it
 * (free_pos), so reserve pops in O(1) and shrink can pull a given page out
 * in O(1) (swap with the top). Only FREE pages are ever on the stack; a
 * FENCED, QUARANTINED, RETIRED or retiring page is never FREE, which is how
 * "the pool never hands out such a page" holds by construction.
 *
 * All or nothing. Every call that takes a table validates every entry
 * first (range, duplicates, owner/generation, state, then coverage and
 * tags), and only then mutates. Duplicate entries are found in O(n) with a
 * per-page mark stamped with a per-call epoch.
 *
 * Chunks, grow and shrink. kvpool_new allocates one chunk; grow first
 * revives RETIRED slots (so page indices stay dense and a revived slot's
 * generations keep increasing), reallocating a chunk whose memory had been
 * returned, and only then adds a chunk. shrink retires FREE pages
 * highest-index first, so the newest chunks empty first; a chunk whose
 * pages are all RETIRED goes back to the backend at once. Pages in use are
 * marked retiring and retire when their last holder lets go.
 *
 * Counters (by_state, retiring, fences) are kept incrementally so stats are
 * O(1) and exact.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "conf/util.h"
#include "gpu/kv/kvpool.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
	       "kvtag is stored in host order, which must be little-endian");
_Static_assert(offsetof(struct kvtag, check) == 56, "check covers 56 bytes");

#define KVPOOL_MAX_SLOTS (UINT32_MAX - 1)

struct kvpage {
	uint64_t owner;     /* current or last owner */
	uint64_t gen;       /* current or last generation; 0 = never reserved */
	uint32_t fences;
	uint32_t maps;      /* CACHED: requests mapping it */
	uint32_t chunk;     /* index into kvpool.chunks */
	uint32_t free_pos;  /* position in free_stack while FREE */
	uint32_t mark;      /* duplicate detection: == epoch when seen */
	uint8_t state;      /* enum kvpage_state */
	bool retiring;
};

struct kvchunk {
	void *base;         /* backend memory, NULL once returned */
	uint32_t first;     /* first page index */
	uint32_t n;         /* pages in the chunk */
	uint32_t live;      /* pages not RETIRED */
};

struct kvpool {
	pthread_mutex_t lock;
	struct kvmem mem;
	struct kvpool_geom geom;
	uint64_t stride;            /* bytes per page, multiple of 64 */

	uint32_t slots;             /* pages[0..slots) exist */
	uint32_t cap;               /* allocated length of pages, free_stack */
	struct kvpage *pages;       /* (cap) */
	uint32_t *free_stack;       /* (cap); [0, n_free) are FREE pages */
	uint32_t n_free;

	struct kvchunk *chunks;     /* (cap_chunks) */
	uint32_t n_chunks;
	uint32_t cap_chunks;

	uint64_t next_gen;          /* last generation handed out */
	uint32_t epoch;             /* duplicate-detection stamp */

	uint32_t by_state[KVPAGE_N_STATES];
	uint32_t retiring;
	uint32_t fences;

	/* Batched tag checks (backends with tags_compare only). */
	struct kvtag *scratch_tags; /* (scratch_cap) expected tags */
	void **scratch_ptrs;        /* (scratch_cap) page addresses */
	uint32_t scratch_cap;
};

/* ---- tags ---------------------------------------------------------------- */

void kvtag_make(struct kvtag *t, uint64_t owner, uint64_t generation,
		uint32_t page, uint32_t index, uint32_t tokens)
{
	memset(t, 0, sizeof(*t));
	t->magic = KVTAG_MAGIC;
	t->owner = owner;
	t->generation = generation;
	t->page = page;
	t->index = index;
	t->tokens = tokens;
	t->check = XXH3_64bits(t, offsetof(struct kvtag, check));
}

int kvtag_check(const struct kvtag *t, uint64_t owner, uint64_t generation,
		uint32_t page, uint32_t index, uint32_t tokens)
{
	struct kvtag want;

	kvtag_make(&want, owner, generation, page, index, tokens);
	return memcmp(t, &want, sizeof(want)) ? KVPOOL_E_TAG : 0;
}

/* ---- geometry -------------------------------------------------------------- */

static size_t kvpool__dtype_size(enum kv_dtype dt)
{
	switch (dt) {
	case KV_DTYPE_F32:
		return 4;
	case KV_DTYPE_F16:
		return 2;
	}
	return 0;
}

/* Bytes of one K (or V) block: page_tokens x kv_dim elements. 0 on
 * overflow or a bad geometry. */
static uint64_t kvpool__block_bytes(const struct kvpool_geom *g)
{
	uint64_t elt = kvpool__dtype_size(g->dtype);
	uint64_t b;

	if (!elt || !g->page_tokens || !g->n_layer || !g->kv_dim)
		return 0;
	b = (uint64_t)g->page_tokens * g->kv_dim; /* < 2^64: both 32-bit */
	if (b > UINT64_MAX / elt)
		return 0;
	return b * elt;
}

uint64_t kvpool_page_bytes(const struct kvpool_geom *g)
{
	uint64_t block = kvpool__block_bytes(g);
	uint64_t kv;

	if (!block || block > (UINT64_MAX / 4) / g->n_layer)
		return 0;
	kv = 2 * (uint64_t)g->n_layer * block;
	if (kv > UINT64_MAX - KVTAG_BYTES - 63)
		return 0;
	return (KVTAG_BYTES + kv + 63) & ~(uint64_t)63;
}

const struct kvpool_geom *kvpool_geom(const struct kvpool *p)
{
	return &p->geom;
}

uint32_t kvpool_pages_for(const struct kvpool *p, uint64_t tokens)
{
	uint64_t n = tokens / p->geom.page_tokens +
		     (tokens % p->geom.page_tokens != 0);

	return n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
}

uint64_t kvpool_block_offset(const struct kvpool *p, uint32_t layer, int kv)
{
	return KVTAG_BYTES +
	       (2 * (uint64_t)layer + (kv ? 1 : 0)) *
		       kvpool__block_bytes(&p->geom);
}

const char *kvpage_state_name(enum kvpage_state s)
{
	static const char *const names[KVPAGE_N_STATES] = {
		[KVPAGE_FREE] = "free",
		[KVPAGE_RESERVED] = "reserved",
		[KVPAGE_FILLING] = "filling",
		[KVPAGE_READY] = "ready",
		[KVPAGE_FENCED] = "fenced",
		[KVPAGE_QUARANTINED] = "quarantined",
		[KVPAGE_RETIRED] = "retired",
		[KVPAGE_CACHED] = "cached",
	};

	if ((unsigned)s >= KVPAGE_N_STATES)
		return "invalid";
	return names[s];
}

/* ---- internal helpers (lock held) ----------------------------------------- */

static void *kvpool__addr(const struct kvpool *p, uint32_t page)
{
	const struct kvchunk *c = &p->chunks[p->pages[page].chunk];

	if (!c->base)
		return NULL;
	return (char *)c->base + (uint64_t)(page - c->first) * p->stride;
}

static void kvpool__set_state(struct kvpool *p, struct kvpage *pg,
			      enum kvpage_state s)
{
	p->by_state[pg->state]--;
	p->by_state[s]++;
	pg->state = (uint8_t)s;
}

static void kvpool__free_push(struct kvpool *p, uint32_t page)
{
	p->pages[page].free_pos = p->n_free;
	p->free_stack[p->n_free++] = page;
}

/* Take a FREE page off the stack, wherever it sits. */
static void kvpool__free_remove(struct kvpool *p, uint32_t page)
{
	uint32_t pos = p->pages[page].free_pos;
	uint32_t last = p->free_stack[--p->n_free];

	p->free_stack[pos] = last;
	p->pages[last].free_pos = pos;
}

static void kvpool__retire(struct kvpool *p, uint32_t page)
{
	struct kvpage *pg = &p->pages[page];
	struct kvchunk *c = &p->chunks[pg->chunk];

	kvpool__set_state(p, pg, KVPAGE_RETIRED);
	if (--c->live == 0 && c->base) {
		p->mem.ops->free(p->mem.ctx, c->base,
				 (size_t)((uint64_t)c->n * p->stride));
		c->base = NULL;
	}
}

/* The last holder let go of a page with no fence left: back to the free
 * list, or out of the pool if shrink asked for it. */
static void kvpool__put(struct kvpool *p, uint32_t page)
{
	struct kvpage *pg = &p->pages[page];

	if (pg->retiring) {
		pg->retiring = false;
		p->retiring--;
		kvpool__retire(p, page);
		return;
	}
	kvpool__set_state(p, pg, KVPAGE_FREE);
	kvpool__free_push(p, page);
}

/* Out of circulation for good. Quarantine wins over a pending
 * retirement: the page never leaves the pool's view again. */
static void kvpool__quarantine_page(struct kvpool *p, struct kvpage *pg)
{
	if (pg->retiring) {
		pg->retiring = false;
		p->retiring--;
	}
	kvpool__set_state(p, pg, KVPAGE_QUARANTINED);
}

static uint32_t kvpool__epoch_next(struct kvpool *p)
{
	if (++p->epoch == 0) {
		for (uint32_t i = 0; i < p->slots; i++)
			p->pages[i].mark = 0;
		p->epoch = 1;
	}
	return p->epoch;
}

#define ST(s) (1u << (s))
#define ST_OWNED (ST(KVPAGE_RESERVED) | ST(KVPAGE_FILLING) | ST(KVPAGE_READY))

/* One entry against the metadata: range, duplicate (mark), owner and
 * generation, state. */
static int kvpool__check_entry(struct kvpool *p, uint64_t owner,
			       const struct kvpool_ref *ref, unsigned states,
			       uint32_t epoch)
{
	struct kvpage *pg;

	if (ref->page >= p->slots)
		return KVPOOL_E_RANGE;
	pg = &p->pages[ref->page];
	if (pg->mark == epoch)
		return KVPOOL_E_RANGE;
	pg->mark = epoch;
	if (pg->gen == 0 || pg->owner != owner || pg->gen != ref->gen)
		return KVPOOL_E_STALE;
	if (!(states & ST(pg->state)))
		return KVPOOL_E_STATE;
	return 0;
}

/* Validate a table against the metadata; mutates nothing but marks.
 * Entries [0, n_mapped) are owned by entries[i] (cached pages), the
 * others by owner. */
static int kvpool__check_mixed(struct kvpool *p, uint64_t owner,
			       const uint64_t *entries, uint32_t n_mapped,
			       const struct kvpool_ref *table, uint32_t n,
			       unsigned states, bool need_fence)
{
	uint32_t epoch;

	if (!table || n == 0 || n_mapped > n || (n_mapped && !entries))
		return KVPOOL_E_RANGE;
	epoch = kvpool__epoch_next(p);
	for (uint32_t i = 0; i < n; i++) {
		bool mapped = i < n_mapped;
		int r = kvpool__check_entry(p, mapped ? entries[i] : owner,
					    &table[i],
					    mapped ? ST(KVPAGE_CACHED) : states,
					    epoch);

		if (r)
			return r;
		if (need_fence && p->pages[table[i].page].fences == 0)
			return KVPOOL_E_STATE;
	}
	return 0;
}

static int kvpool__check_table(struct kvpool *p, uint64_t owner,
			       const struct kvpool_ref *table, uint32_t n,
			       unsigned states, bool need_fence)
{
	return kvpool__check_mixed(p, owner, NULL, 0, table, n, states,
				   need_fence);
}

static int kvpool__check_coverage(const struct kvpool *p, uint32_t n,
				  uint32_t tokens)
{
	if (tokens == 0 || kvpool_pages_for(p, tokens) != n)
		return KVPOOL_E_COVERAGE;
	return 0;
}

static uint32_t kvpool__page_tokens(const struct kvpool *p, uint32_t i,
				    uint32_t tokens)
{
	uint64_t before = (uint64_t)i * p->geom.page_tokens;

	return (uint32_t)KVD_MIN((uint64_t)p->geom.page_tokens,
				 tokens - before);
}

static int kvpool__scratch_reserve(struct kvpool *p, uint32_t n)
{
	struct kvtag *t;
	void **v;

	if (n <= p->scratch_cap)
		return 0;
	t = realloc(p->scratch_tags, (size_t)n * sizeof(*t));
	if (!t)
		return -ENOMEM;
	p->scratch_tags = t;
	v = realloc(p->scratch_ptrs, (size_t)n * sizeof(*v));
	if (!v)
		return -ENOMEM;
	p->scratch_ptrs = v;
	p->scratch_cap = n;
	return 0;
}

/* The tag entry i of a table must hold: owner's, or for the first
 * n_mapped entries their cache entry's. */
static void kvpool__want_tag(const struct kvpool *p, struct kvtag *t,
			     uint64_t owner, const uint64_t *entries,
			     uint32_t n_mapped, const struct kvpool_ref *table,
			     uint32_t i, uint32_t tokens)
{
	kvtag_make(t, i < n_mapped ? entries[i] : owner, table[i].gen,
		   table[i].page, i, kvpool__page_tokens(p, i, tokens));
}

/* Compare the tags in page memory with what their writers must have
 * written. 0, KVPOOL_E_TAG (with *bad), or negative errno. */
static int kvpool__check_tags_mixed(struct kvpool *p, uint64_t owner,
				    const uint64_t *entries, uint32_t n_mapped,
				    const struct kvpool_ref *table, uint32_t n,
				    uint32_t tokens, uint32_t *bad)
{
	const struct kvmem_ops *ops = p->mem.ops;
	int r;

	if (ops->tags_compare) {
		r = kvpool__scratch_reserve(p, n);
		if (r)
			return r;
		for (uint32_t i = 0; i < n; i++) {
			kvpool__want_tag(p, &p->scratch_tags[i], owner, entries,
					 n_mapped, table, i, tokens);
			p->scratch_ptrs[i] = kvpool__addr(p, table[i].page);
		}
		r = ops->tags_compare(p->mem.ctx, p->scratch_ptrs,
				      p->scratch_tags, n, bad);
		return r > 0 ? KVPOOL_E_TAG : r;
	}
	for (uint32_t i = 0; i < n; i++) {
		const void *addr = kvpool__addr(p, table[i].page);
		struct kvtag copy, want;
		const struct kvtag *t = addr;

		if (!ops->host_visible) {
			r = ops->read(p->mem.ctx, &copy, addr, sizeof(copy));
			if (r)
				return r;
			t = &copy;
		}
		kvpool__want_tag(p, &want, owner, entries, n_mapped, table, i,
				 tokens);
		if (memcmp(t, &want, sizeof(want))) {
			if (bad)
				*bad = i;
			return KVPOOL_E_TAG;
		}
	}
	return 0;
}

static int kvpool__check_tags(struct kvpool *p, uint64_t owner,
			      const struct kvpool_ref *table, uint32_t n,
			      uint32_t tokens, uint32_t *bad)
{
	return kvpool__check_tags_mixed(p, owner, NULL, 0, table, n, tokens,
					bad);
}

/* ---- lifecycle --------------------------------------------------------------- */

/* Make room for `slots` pages and `chunks` chunks; contents are kept, so a
 * failure leaves the pool as it was. */
static int kvpool__reserve_arrays(struct kvpool *p, uint32_t slots,
				  uint32_t chunks)
{
	if (slots > p->cap) {
		uint32_t cap = KVD_MAX(slots, p->cap * 2);
		struct kvpage *pg;
		uint32_t *fs;

		if (cap < slots || cap > KVPOOL_MAX_SLOTS)
			cap = slots;
		pg = realloc(p->pages, (size_t)cap * sizeof(*pg));
		if (!pg)
			return -ENOMEM;
		p->pages = pg;
		fs = realloc(p->free_stack, (size_t)cap * sizeof(*fs));
		if (!fs)
			return -ENOMEM;
		p->free_stack = fs;
		p->cap = cap;
	}
	if (chunks > p->cap_chunks) {
		uint32_t cap = KVD_MAX(chunks, p->cap_chunks * 2);
		struct kvchunk *c = realloc(p->chunks, (size_t)cap * sizeof(*c));

		if (!c)
			return -ENOMEM;
		p->chunks = c;
		p->cap_chunks = cap;
	}
	return 0;
}

static int kvpool__chunk_alloc(struct kvpool *p, uint32_t n, void **out)
{
	uint64_t bytes = (uint64_t)n * p->stride;

	if (bytes / p->stride != n || bytes > SIZE_MAX)
		return -ENOMEM;
	return p->mem.ops->alloc(p->mem.ctx, (size_t)bytes, out);
}

/* Append a chunk of n FREE pages on memory `base` (arrays already sized). */
static void kvpool__chunk_add(struct kvpool *p, void *base, uint32_t n)
{
	struct kvchunk *c = &p->chunks[p->n_chunks];

	c->base = base;
	c->first = p->slots;
	c->n = n;
	c->live = n;
	for (uint32_t i = 0; i < n; i++) {
		uint32_t page = p->slots + i;
		struct kvpage *pg = &p->pages[page];

		memset(pg, 0, sizeof(*pg));
		pg->chunk = p->n_chunks;
		pg->state = KVPAGE_FREE;
		kvpool__free_push(p, page);
	}
	p->by_state[KVPAGE_FREE] += n;
	p->slots += n;
	p->n_chunks++;
}

bool kvpool_host_visible(const struct kvpool *p)
{
	return p->mem.ops->host_visible;
}

int kvpool_new(struct kvpool **out, const struct kvmem *mem,
	       const struct kvpool_geom *g, uint32_t n_pages)
{
	struct kvpool *p;
	void *base = NULL;
	int r;

	if (!mem || !mem->ops || !g || !kvpool_page_bytes(g) ||
	    n_pages > KVPOOL_MAX_SLOTS)
		return KVPOOL_E_RANGE;
	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->mem = *mem;
	p->geom = *g;
	p->stride = kvpool_page_bytes(g);
	p->epoch = 1;
	r = pthread_mutex_init(&p->lock, NULL);
	if (r) {
		free(p);
		return -r;
	}
	if (n_pages) {
		r = kvpool__reserve_arrays(p, n_pages, 1);
		if (!r)
			r = kvpool__chunk_alloc(p, n_pages, &base);
		if (r) {
			kvpool_free(p);
			return r;
		}
		kvpool__chunk_add(p, base, n_pages);
	}
	*out = p;
	return 0;
}

void kvpool_free(struct kvpool *p)
{
	if (!p)
		return;
	for (uint32_t i = 0; i < p->n_chunks; i++) {
		struct kvchunk *c = &p->chunks[i];

		if (c->base)
			p->mem.ops->free(p->mem.ctx, c->base,
					 (size_t)((uint64_t)c->n * p->stride));
	}
	free(p->chunks);
	free(p->pages);
	free(p->free_stack);
	free(p->scratch_tags);
	free(p->scratch_ptrs);
	pthread_mutex_destroy(&p->lock);
	free(p);
}

void kvpool_get_stats(struct kvpool *p, struct kvpool_stats *st)
{
	pthread_mutex_lock(&p->lock);
	memset(st, 0, sizeof(*st));
	st->slots = p->slots;
	st->pages = p->slots - p->by_state[KVPAGE_RETIRED];
	memcpy(st->by_state, p->by_state, sizeof(st->by_state));
	st->retiring = p->retiring;
	st->fences = p->fences;
	st->page_bytes = p->stride;
	st->page_tokens = p->geom.page_tokens;
	st->tokens = (uint64_t)st->pages * p->geom.page_tokens;
	pthread_mutex_unlock(&p->lock);
}

static void kvpool__info(const struct kvpool *p, uint32_t page,
			 struct kvpool_page_info *out)
{
	const struct kvpage *pg = &p->pages[page];

	out->state = (enum kvpage_state)pg->state;
	out->owner = pg->owner;
	out->gen = pg->gen;
	out->fences = pg->fences;
	out->maps = pg->maps;
	out->retiring = pg->retiring;
	out->has_memory = kvpool__addr(p, page) != NULL;
}

int kvpool_page_info(struct kvpool *p, uint32_t page,
		     struct kvpool_page_info *out)
{
	int r = KVPOOL_E_RANGE;

	pthread_mutex_lock(&p->lock);
	if (page < p->slots) {
		kvpool__info(p, page, out);
		r = 0;
	}
	pthread_mutex_unlock(&p->lock);
	return r;
}

uint32_t kvpool_snapshot(struct kvpool *p, struct kvpool_page_info *out,
			 uint32_t cap)
{
	uint32_t slots;

	pthread_mutex_lock(&p->lock);
	slots = p->slots;
	for (uint32_t i = 0; i < KVD_MIN(slots, cap); i++)
		kvpool__info(p, i, &out[i]);
	pthread_mutex_unlock(&p->lock);
	return slots;
}

void *kvpool_page_addr(struct kvpool *p, uint32_t page)
{
	void *addr = NULL;

	pthread_mutex_lock(&p->lock);
	if (page < p->slots)
		addr = kvpool__addr(p, page);
	pthread_mutex_unlock(&p->lock);
	return addr;
}

/* ---- unfilled tails and received KV ---------------------------------------- */

/* Fallback for backends without zero2d: write zeros row by row. */
static int kvpool__zero_rows(const struct kvmem *mem, char *dst, size_t pitch,
			     size_t width, size_t rows)
{
	void *zero = calloc(1, width);
	int r = 0;

	if (!zero)
		return -ENOMEM;
	for (size_t i = 0; i < rows && !r; i++)
		r = mem->ops->write(mem->ctx, dst + i * pitch, zero, width);
	free(zero);
	return r;
}

int kvpool_zero_tail(struct kvpool *p, uint64_t owner,
		     const struct kvpool_ref *ref, uint32_t tokens)
{
	uint64_t row = kvpool__dtype_size(p->geom.dtype) * p->geom.kv_dim;
	uint64_t block = kvpool__block_bytes(&p->geom);
	char *addr = NULL;
	int r;

	if (tokens > p->geom.page_tokens)
		return KVPOOL_E_RANGE;
	pthread_mutex_lock(&p->lock);
	r = kvpool__check_table(p, owner, ref, 1, ST_OWNED, false);
	if (!r)
		addr = kvpool__addr(p, ref->page);
	pthread_mutex_unlock(&p->lock);
	if (r)
		return r;
	if (!addr)
		return KVPOOL_E_RANGE;
	if (tokens == p->geom.page_tokens)
		return 0;
	/* The 2 x n_layer blocks follow the tag back to back: the tails are
	 * one strided region (row = block, width = the unfilled part). The
	 * holder owns the page bytes, so this runs outside the lock. */
	addr += KVTAG_BYTES + tokens * row;
	if (p->mem.ops->zero2d)
		return p->mem.ops->zero2d(p->mem.ctx, addr, block,
					  block - tokens * row,
					  2 * (size_t)p->geom.n_layer);
	return kvpool__zero_rows(&p->mem, addr, block, block - tokens * row,
				 2 * (size_t)p->geom.n_layer);
}

/* Non-finite means all exponent bits set (Inf or NaN). OR-reduced over a
 * whole row so the loop has no branch and vectorises. */
static bool kvpool__f32_finite(const uint8_t *b, size_t n)
{
	uint32_t bad = 0;

	for (size_t i = 0; i < n; i++) {
		uint32_t u;

		memcpy(&u, b + 4 * i, 4);
		bad |= (u & 0x7f800000u) == 0x7f800000u;
	}
	return !bad;
}

static bool kvpool__f16_finite(const uint8_t *b, size_t n)
{
	uint32_t bad = 0;

	for (size_t i = 0; i < n; i++) {
		uint16_t h;

		memcpy(&h, b + 2 * i, 2);
		bad |= (h & 0x7c00u) == 0x7c00u;
	}
	return !bad;
}

bool kvpool_page_kv_finite(const struct kvpool_geom *g, const void *page,
			   uint32_t tokens)
{
	uint64_t block = kvpool__block_bytes(g);
	size_t n = (size_t)KVD_MIN(tokens, g->page_tokens) * g->kv_dim;
	const uint8_t *b = (const uint8_t *)page + KVTAG_BYTES;

	for (uint32_t i = 0; i < 2 * g->n_layer; i++, b += block) {
		bool ok = g->dtype == KV_DTYPE_F32 ? kvpool__f32_finite(b, n)
						   : kvpool__f16_finite(b, n);
		if (!ok)
			return false;
	}
	return true;
}

/* ---- page table operations ------------------------------------------------ */

int kvpool_reserve(struct kvpool *p, uint64_t owner, uint32_t n,
		   struct kvpool_ref *table)
{
	int r = 0;

	if (!table || n == 0)
		return KVPOOL_E_RANGE;
	pthread_mutex_lock(&p->lock);
	if (n > p->n_free) {
		r = KVPOOL_E_FULL;
		goto out;
	}
	for (uint32_t i = 0; i < n; i++) {
		uint32_t page = p->free_stack[--p->n_free];
		struct kvpage *pg = &p->pages[page];

		pg->owner = owner;
		pg->gen = ++p->next_gen;
		pg->state = KVPAGE_RESERVED;
		table[i].page = page;
		table[i].gen = pg->gen;
	}
	p->by_state[KVPAGE_FREE] -= n;
	p->by_state[KVPAGE_RESERVED] += n;
out:
	pthread_mutex_unlock(&p->lock);
	return r;
}

int kvpool_fill_begin(struct kvpool *p, uint64_t owner,
		      const struct kvpool_ref *table, uint32_t n)
{
	int r;

	pthread_mutex_lock(&p->lock);
	r = kvpool__check_table(p, owner, table, n, ST(KVPAGE_RESERVED), false);
	if (!r)
		for (uint32_t i = 0; i < n; i++)
			kvpool__set_state(p, &p->pages[table[i].page],
					  KVPAGE_FILLING);
	pthread_mutex_unlock(&p->lock);
	return r;
}

int kvpool_tag_write(struct kvpool *p, uint64_t owner,
		     const struct kvpool_ref *table, uint32_t n,
		     uint32_t tokens)
{
	return kvpool_tag_write_from(p, owner, table, 0, n, tokens);
}

int kvpool_mark_ready(struct kvpool *p, uint64_t owner,
		      const struct kvpool_ref *table, uint32_t n,
		      uint32_t tokens)
{
	int r;

	pthread_mutex_lock(&p->lock);
	r = kvpool__check_table(p, owner, table, n, ST(KVPAGE_FILLING), false);
	if (!r)
		r = kvpool__check_coverage(p, n, tokens);
	if (!r)
		r = kvpool__check_tags(p, owner, table, n, tokens, NULL);
	if (!r)
		for (uint32_t i = 0; i < n; i++)
			kvpool__set_state(p, &p->pages[table[i].page],
					  KVPAGE_READY);
	pthread_mutex_unlock(&p->lock);
	return r;
}

int kvpool_verify(struct kvpool *p, uint64_t owner,
		  const struct kvpool_ref *table, uint32_t n, uint32_t tokens,
		  uint32_t *bad)
{
	int r;

	pthread_mutex_lock(&p->lock);
	r = kvpool__check_table(p, owner, table, n,
				ST(KVPAGE_FILLING) | ST(KVPAGE_READY), false);
	if (!r)
		r = kvpool__check_coverage(p, n, tokens);
	if (!r)
		r = kvpool__check_tags(p, owner, table, n, tokens, bad);
	pthread_mutex_unlock(&p->lock);
	return r;
}

int kvpool_fence(struct kvpool *p, uint64_t owner,
		 const struct kvpool_ref *table, uint32_t n)
{
	int r;

	pthread_mutex_lock(&p->lock);
	r = kvpool__check_table(p, owner, table, n, ST_OWNED, false);
	if (!r && p->fences > UINT32_MAX - n)
		r = -EOVERFLOW;
	for (uint32_t i = 0; !r && i < n; i++)
		if (p->pages[table[i].page].fences == UINT32_MAX)
			r = -EOVERFLOW;
	if (!r) {
		for (uint32_t i = 0; i < n; i++)
			p->pages[table[i].page].fences++;
		p->fences += n;
	}
	pthread_mutex_unlock(&p->lock);
	return r;
}

int kvpool_unfence(struct kvpool *p, uint64_t owner,
		   const struct kvpool_ref *table, uint32_t n)
{
	int r;

	pthread_mutex_lock(&p->lock);
	r = kvpool__check_table(p, owner, table, n,
				ST_OWNED | ST(KVPAGE_FENCED) |
					ST(KVPAGE_QUARANTINED),
				true);
	if (!r) {
		for (uint32_t i = 0; i < n; i++) {
			struct kvpage *pg = &p->pages[table[i].page];

			if (--pg->fences == 0 && pg->state == KVPAGE_FENCED)
				kvpool__put(p, table[i].page);
		}
		p->fences -= n;
	}
	pthread_mutex_unlock(&p->lock);
	return r;
}

int kvpool_release(struct kvpool *p, uint64_t owner,
		   const struct kvpool_ref *table, uint32_t n)
{
	int r;

	pthread_mutex_lock(&p->lock);
	r = kvpool__check_table(p, owner, table, n, ST_OWNED, false);
	if (!r) {
		for (uint32_t i = 0; i < n; i++) {
			struct kvpage *pg = &p->pages[table[i].page];

			if (pg->fences)
				kvpool__set_state(p, pg, KVPAGE_FENCED);
			else
				kvpool__put(p, table[i].page);
		}
	}
	pthread_mutex_unlock(&p->lock);
	return r;
}

int kvpool_quarantine(struct kvpool *p, uint64_t owner,
		      const struct kvpool_ref *table, uint32_t n)
{
	int r;

	pthread_mutex_lock(&p->lock);
	r = kvpool__check_table(p, owner, table, n,
				ST_OWNED | ST(KVPAGE_FENCED), false);
	if (!r) {
		for (uint32_t i = 0; i < n; i++)
			kvpool__quarantine_page(p, &p->pages[table[i].page]);
	}
	pthread_mutex_unlock(&p->lock);
	return r;
}

/* ---- cached pages ---------------------------------------------------------- */

/* Adopt: every page full, unfenced, owner's, with the tag owner's writer
 * wrote at its table index; then retag under the entry. The old tag is
 * checked first so a page whose bytes a writer got wrong never becomes
 * a prefix every later request reads. */
static int kvpool__adopt_check(struct kvpool *p, uint64_t owner,
			       const struct kvpool_ref *table, uint32_t first,
			       uint32_t n, const uint64_t *entries)
{
	uint32_t pt = p->geom.page_tokens;
	uint32_t epoch = kvpool__epoch_next(p);
	int r;

	if (!table || !entries || n == 0 || first > UINT32_MAX - n)
		return KVPOOL_E_RANGE;
	for (uint32_t i = first; i < first + n; i++) {
		struct kvtag want, copy;
		const struct kvtag *t;

		r = kvpool__check_entry(p, owner, &table[i],
					ST(KVPAGE_FILLING) | ST(KVPAGE_READY),
					epoch);
		if (r)
			return r;
		/* fenced: something may still write it; retiring: a shrink
		 * waits for it to come back (cached, it might never) */
		if (p->pages[table[i].page].fences || p->pages[table[i].page].retiring ||
		    entries[i - first] == owner)
			return KVPOOL_E_STATE;
		t = kvpool__addr(p, table[i].page);
		if (!p->mem.ops->host_visible) {
			r = p->mem.ops->read(p->mem.ctx, &copy, t, sizeof(copy));
			if (r)
				return r;
			t = &copy;
		}
		kvtag_make(&want, owner, table[i].gen, table[i].page, i, pt);
		if (memcmp(t, &want, sizeof(want)))
			return KVPOOL_E_TAG;
	}
	return 0;
}

int kvpool_cache_adopt(struct kvpool *p, uint64_t owner,
		       const struct kvpool_ref *table, uint32_t first,
		       uint32_t n, const uint64_t *entries,
		       struct kvpool_ref *out)
{
	int r;

	pthread_mutex_lock(&p->lock);
	r = kvpool__adopt_check(p, owner, table, first, n, entries);
	/* The new tags first, then the pages change hands: a tag write that
	 * fails leaves every page its owner's (the tags already written then
	 * fail the owner's next check - an integrity error, never a read of
	 * another owner's page) and nothing half adopted. Each page gets a
	 * fresh generation: owner's entry for it is stale from here on,
	 * whatever the caller still keeps. */
	for (uint32_t i = 0; !r && i < n; i++) {
		uint32_t page = table[first + i].page;
		struct kvtag t;

		kvtag_make(&t, entries[i], p->next_gen + 1 + i, page, first + i,
			   p->geom.page_tokens);
		r = p->mem.ops->write(p->mem.ctx, kvpool__addr(p, page), &t,
				      sizeof(t));
	}
	for (uint32_t i = 0; !r && i < n; i++) {
		uint32_t page = table[first + i].page;
		struct kvpage *pg = &p->pages[page];

		pg->owner = entries[i];
		pg->gen = ++p->next_gen;
		pg->maps = 0;
		kvpool__set_state(p, pg, KVPAGE_CACHED);
		out[i].page = page;
		out[i].gen = pg->gen;
	}
	pthread_mutex_unlock(&p->lock);
	return r;
}

static int kvpool__cache_count(struct kvpool *p, const uint64_t *entries,
			       const struct kvpool_ref *refs, uint32_t n,
			       int delta)
{
	unsigned states = ST(KVPAGE_CACHED) |
			  (delta < 0 ? ST(KVPAGE_QUARANTINED) : 0);
	uint32_t epoch;
	int r = 0;

	if (!refs || !entries || n == 0)
		return KVPOOL_E_RANGE;
	pthread_mutex_lock(&p->lock);
	epoch = kvpool__epoch_next(p);
	for (uint32_t i = 0; !r && i < n; i++) {
		r = kvpool__check_entry(p, entries[i], &refs[i], states, epoch);
		if (!r && delta < 0 && p->pages[refs[i].page].maps == 0)
			r = KVPOOL_E_STATE;
		if (!r && delta > 0 && p->pages[refs[i].page].maps == UINT32_MAX)
			r = -EOVERFLOW;
	}
	for (uint32_t i = 0; !r && i < n; i++)
		p->pages[refs[i].page].maps += (uint32_t)delta;
	pthread_mutex_unlock(&p->lock);
	return r;
}

int kvpool_cache_map(struct kvpool *p, const uint64_t *entries,
		     const struct kvpool_ref *refs, uint32_t n)
{
	return kvpool__cache_count(p, entries, refs, n, 1);
}

int kvpool_cache_unmap(struct kvpool *p, const uint64_t *entries,
		       const struct kvpool_ref *refs, uint32_t n)
{
	return kvpool__cache_count(p, entries, refs, n, -1);
}

int kvpool_cache_evict(struct kvpool *p, uint64_t entry,
		       const struct kvpool_ref *ref)
{
	int r;

	pthread_mutex_lock(&p->lock);
	r = kvpool__check_table(p, entry, ref, 1, ST(KVPAGE_CACHED), false);
	if (!r && p->pages[ref->page].maps)
		r = KVPOOL_E_STATE;
	if (!r)
		kvpool__put(p, ref->page);
	pthread_mutex_unlock(&p->lock);
	return r;
}

int kvpool_cache_quarantine(struct kvpool *p, uint64_t entry,
			    const struct kvpool_ref *ref)
{
	int r;

	pthread_mutex_lock(&p->lock);
	r = kvpool__check_table(p, entry, ref, 1, ST(KVPAGE_CACHED), false);
	if (!r)
		kvpool__quarantine_page(p, &p->pages[ref->page]);
	pthread_mutex_unlock(&p->lock);
	return r;
}

int kvpool_verify_mapped(struct kvpool *p, uint64_t owner,
			 const uint64_t *entries, uint32_t n_mapped,
			 const struct kvpool_ref *table, uint32_t n,
			 uint32_t tokens, uint32_t *bad)
{
	int r;

	pthread_mutex_lock(&p->lock);
	r = kvpool__check_mixed(p, owner, entries, n_mapped, table, n,
				ST(KVPAGE_FILLING) | ST(KVPAGE_READY), false);
	if (!r)
		r = kvpool__check_coverage(p, n, tokens);
	/* a mapped page holds page_tokens positions: the table must cover
	 * more than the mapped prefix */
	if (!r && n_mapped && (uint64_t)n_mapped * p->geom.page_tokens > tokens)
		r = KVPOOL_E_COVERAGE;
	if (!r)
		r = kvpool__check_tags_mixed(p, owner, entries, n_mapped, table,
					     n, tokens, bad);
	pthread_mutex_unlock(&p->lock);
	return r;
}

int kvpool_tag_write_from(struct kvpool *p, uint64_t owner,
			  const struct kvpool_ref *table, uint32_t first,
			  uint32_t n, uint32_t tokens)
{
	int r;

	if (first >= n)
		return KVPOOL_E_RANGE;
	pthread_mutex_lock(&p->lock);
	r = kvpool__check_table(p, owner, table + first, n - first,
				ST(KVPAGE_FILLING) | ST(KVPAGE_READY), false);
	if (!r)
		r = kvpool__check_coverage(p, n, tokens);
	for (uint32_t i = first; !r && i < n; i++) {
		struct kvtag t;

		kvtag_make(&t, owner, table[i].gen, table[i].page, i,
			   kvpool__page_tokens(p, i, tokens));
		r = p->mem.ops->write(p->mem.ctx,
				      kvpool__addr(p, table[i].page), &t,
				      sizeof(t));
	}
	pthread_mutex_unlock(&p->lock);
	return r;
}

/* ---- grow and shrink ----------------------------------------------------- */

static void kvpool__revive(struct kvpool *p, uint32_t page)
{
	struct kvpage *pg = &p->pages[page];

	p->chunks[pg->chunk].live++;
	kvpool__set_state(p, pg, KVPAGE_FREE);
	kvpool__free_push(p, page);
}

/* Give back the memory a failed grow had allocated. */
static void kvpool__grow_undo(struct kvpool *p, void **mem, uint32_t fresh)
{
	for (uint32_t c = 0; c <= p->n_chunks; c++) {
		uint64_t pages = c < p->n_chunks ? p->chunks[c].n : fresh;

		if (mem[c])
			p->mem.ops->free(p->mem.ctx, mem[c],
					 (size_t)(pages * p->stride));
	}
}

/* Everything a grow of n pages must allocate before it may change
 * anything. Retired slots whose chunk still has memory cost nothing;
 * chunks that went back get their memory again (mem[c]); what is still
 * missing becomes a new chunk of *fresh pages (mem[n_chunks]), with the
 * arrays sized for it. mem has n_chunks + 1 entries, all NULL on entry
 * and on failure. */
static int kvpool__grow_alloc(struct kvpool *p, uint32_t n, void **mem,
			      uint32_t *fresh)
{
	uint32_t revivable = 0, need;
	int r = 0;

	for (uint32_t c = 0; c < p->n_chunks; c++)
		if (p->chunks[c].base)
			revivable += p->chunks[c].n - p->chunks[c].live;
	need = n - KVD_MIN(n, revivable);
	for (uint32_t c = 0; c < p->n_chunks && need && !r; c++) {
		if (p->chunks[c].base)
			continue;
		r = kvpool__chunk_alloc(p, p->chunks[c].n, &mem[c]);
		need -= KVD_MIN(need, p->chunks[c].n);
	}
	*fresh = r ? 0 : need;
	if (!r && need > KVPOOL_MAX_SLOTS - p->slots)
		r = KVPOOL_E_RANGE;
	if (!r && need)
		r = kvpool__reserve_arrays(p, p->slots + need, p->n_chunks + 1);
	if (!r && need)
		r = kvpool__chunk_alloc(p, need, &mem[p->n_chunks]);
	if (r)
		kvpool__grow_undo(p, mem, *fresh);
	return r;
}

/* Revive n - fresh retired slots, lowest index first: those that cost
 * nothing before those of reallocated chunks (so every reallocated chunk
 * gets live pages), then add the new chunk. Cannot fail. */
static void kvpool__grow_apply(struct kvpool *p, uint32_t n, void **mem,
			       uint32_t fresh)
{
	uint32_t need = n - fresh;

	for (int pass = 0; pass < 2; pass++) {
		for (uint32_t c = 0; c < p->n_chunks && need; c++) {
			struct kvchunk *ch = &p->chunks[c];

			if (pass == 0 ? !ch->base : !mem[c])
				continue;
			if (pass == 1)
				ch->base = mem[c];
			for (uint32_t i = ch->first;
			     i < ch->first + ch->n && need; i++)
				if (p->pages[i].state == KVPAGE_RETIRED) {
					kvpool__revive(p, i);
					need--;
				}
		}
	}
	if (fresh)
		kvpool__chunk_add(p, mem[p->n_chunks], fresh);
}

int kvpool_grow(struct kvpool *p, uint32_t n)
{
	void **mem;       /* (n_chunks + 1) memory for returned/new chunks */
	uint32_t fresh = 0;
	int r;

	if (n == 0)
		return 0;
	pthread_mutex_lock(&p->lock);
	mem = calloc((size_t)p->n_chunks + 1, sizeof(*mem));
	r = mem ? kvpool__grow_alloc(p, n, mem, &fresh) : -ENOMEM;
	if (!r)
		kvpool__grow_apply(p, n, mem, fresh);
	free(mem);
	pthread_mutex_unlock(&p->lock);
	return r;
}

int kvpool_shrink(struct kvpool *p, uint32_t n, uint32_t *retired_now)
{
	uint32_t shrinkable, now = 0;
	int r = 0;

	pthread_mutex_lock(&p->lock);
	shrinkable = p->slots - p->by_state[KVPAGE_RETIRED] -
		     p->by_state[KVPAGE_QUARANTINED] - p->retiring;
	if (n > shrinkable) {
		r = KVPOOL_E_RANGE;
		goto out;
	}
	for (uint32_t i = p->slots; i-- > 0 && now < n;) {
		if (p->pages[i].state != KVPAGE_FREE)
			continue;
		kvpool__free_remove(p, i);
		kvpool__retire(p, i);
		now++;
	}
	n -= now;
	for (uint32_t i = p->slots; i-- > 0 && n;) {
		struct kvpage *pg = &p->pages[i];

		if (pg->retiring ||
		    !((ST_OWNED | ST(KVPAGE_FENCED) | ST(KVPAGE_CACHED)) &
		      ST(pg->state)))
			continue;
		pg->retiring = true;
		p->retiring++;
		n--;
	}
out:
	pthread_mutex_unlock(&p->lock);
	if (retired_now)
		*retired_now = now;
	return r;
}
