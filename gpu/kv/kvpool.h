/* kvpool.h - the KV page pool: ownership, integrity tags, deferred release.
 *
 * The pool owns a set of fixed-size pages. Each page holds the K and V of
 * `page_tokens` consecutive positions of one request, for every layer, and
 * starts with a 64-byte integrity tag *in the page's own memory*, so bytes
 * written by a remote writer (TCP batch, RDMA WRITE) carry their tag with
 * them. Page memory is never zeroed between owners.
 *
 * Page layout (bytes, elt = size of kv dtype, D = n_head_kv * head_dim):
 *   [0, 64)                          struct kvtag
 *   then for layer l in [0, n_layer):
 *     K(l): page_tokens x D elts      at KVTAG_BYTES + (2l)   * page_tokens*D*elt
 *     V(l): page_tokens x D elts      at KVTAG_BYTES + (2l+1) * page_tokens*D*elt
 *   token t of a block sits at t * D * elt inside it.
 *
 * Unfilled tails (invariant 10). A request's last page usually holds fewer
 * than page_tokens positions; the rest of each K/V block still holds
 * whatever an earlier owner wrote there. Nothing stale may leave a
 * request, so the rule is: zero the unfilled tail before the page leaves
 * its owner, and a receiver zero-fills what it did not receive.
 * Prefill calls kvpool_zero_tail() on each request's last page after
 * compute and before the first byte is sent; decode calls it on every
 * page it writes from a batch, from its own token count (it never relies
 * on the sender having done so). Zeroing once per request (one strided
 * memset) is cheaper than copying pages piecewise, and keeps the wire
 * format a whole page.
 *
 * Page states (host-side metadata, kept by the pool):
 *   FREE -reserve-> RESERVED -fill_begin-> FILLING -mark_ready-> READY
 *   any owned state -release-> FREE, or FENCED while fences > 0
 *   FENCED -last unfence-> FREE
 *   any owned state -quarantine-> QUARANTINED (never handed out again)
 *   a page marked retiring by shrink goes to RETIRED instead of FREE.
 *   FILLING|READY (full, unfenced) -cache_adopt-> CACHED (owner: a cache
 *   entry; read-only) -cache_evict (no mapping left)-> FREE or RETIRED;
 *   CACHED -quarantine-> QUARANTINED.
 * A page table entry is (page, generation); the generation is bumped at
 * every reservation, so a stale entry from an earlier owner never matches.
 * Every call that takes a table checks that each entry is owned by `owner`
 * in that generation, and changes nothing when any entry fails
 * (all-or-nothing). Generations come from one pool-wide counter, so they
 * never repeat, neither for one page nor across pages.
 *
 * Table checks, in order, entry by entry (the first failing entry decides):
 *   n == 0 or table NULL                      KVPOOL_E_RANGE
 *   page out of range, or listed twice        KVPOOL_E_RANGE
 *   owner or generation differ from the page  KVPOOL_E_STALE
 *   page state not accepted by the call       KVPOOL_E_STATE
 * then, for calls that take `tokens`: tokens == 0 or n != pages_for(tokens)
 * gives KVPOOL_E_COVERAGE; then tags (KVPOOL_E_TAG).
 * States each call accepts: fill_begin RESERVED; tag_write FILLING|READY;
 * mark_ready FILLING; verify FILLING|READY; fence and release
 * RESERVED|FILLING|READY; quarantine those and FENCED; unfence those,
 * FENCED and QUARANTINED, with a fence held on every page.
 * A quarantined page keeps its fences (unfence still drops them) and is
 * never retired or reused.
 *
 * Fences (invariant 2): a fence says "something may still write into this
 * page" - an in-flight transfer, a peer that has not acknowledged an abort.
 * A released page with fences stays FENCED and out of the free list until
 * its last fence is dropped.
 *
 * Errors: negative errno for system failures; positive KVPOOL_E_* for
 * conditions the caller must handle.
 *
 * Thread safety: every function takes the pool's mutex, so the loop thread
 * and compute threads may call it. Page *bytes* are not locked: only the
 * holder of a page (its request) touches them.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpu/gguf/gguf.h"
#include "gpu/kv/kvmem.h"

enum {
	KVPOOL_E_FULL = 1,   /* not enough free pages; nothing reserved */
	KVPOOL_E_STALE,      /* entry not owned by owner in that generation */
	KVPOOL_E_STATE,      /* page in the wrong state for this transition */
	KVPOOL_E_RANGE,      /* page index out of range or argument invalid */
	KVPOOL_E_TAG,        /* integrity tag in page memory does not match */
	KVPOOL_E_COVERAGE,   /* tokens do not match the pages of the table */
};

enum kvpage_state {
	KVPAGE_FREE = 0,
	KVPAGE_RESERVED,
	KVPAGE_FILLING,
	KVPAGE_READY,
	KVPAGE_FENCED,
	KVPAGE_QUARANTINED,
	KVPAGE_RETIRED,
	KVPAGE_CACHED,
	KVPAGE_N_STATES,
};

#define KVTAG_BYTES 64
#define KVTAG_MAGIC 0x3147415456444b56ull /* "VKDVTAG1" little-endian */

/* The tag as it sits in page memory (little-endian, 64 bytes). */
struct kvtag {
	uint64_t magic;       /* KVTAG_MAGIC */
	uint64_t owner;       /* request id */
	uint64_t generation;  /* the page's generation for this owner */
	uint32_t page;        /* physical page index in the destination pool */
	uint32_t index;       /* index of the page in the request's table */
	uint32_t tokens;      /* positions held, 1..page_tokens */
	uint32_t reserved0;
	uint64_t reserved1[2];
	uint64_t check;       /* XXH3-64 of the 56 bytes above */
};

_Static_assert(sizeof(struct kvtag) == KVTAG_BYTES, "kvtag is 64 bytes");

/* Build a tag (used by local writers and by senders of remote batches). */
void kvtag_make(struct kvtag *t, uint64_t owner, uint64_t generation,
		uint32_t page, uint32_t index, uint32_t tokens);
/* 0 if `t` is a well-formed tag for exactly these values, else KVPOOL_E_TAG. */
int kvtag_check(const struct kvtag *t, uint64_t owner, uint64_t generation,
		uint32_t page, uint32_t index, uint32_t tokens);

struct kvpool_geom {
	uint32_t page_tokens;  /* positions per page, >= 1 */
	uint32_t n_layer;
	uint32_t kv_dim;       /* n_head_kv * head_dim */
	enum kv_dtype dtype;
};

/* One page table entry. */
struct kvpool_ref {
	uint32_t page;
	uint64_t gen;
};

struct kvpool_stats {
	uint32_t slots;        /* page indices ever created (RETIRED included) */
	uint32_t pages;        /* live pages: all but RETIRED */
	uint32_t by_state[KVPAGE_N_STATES];
	uint32_t retiring;     /* in use, will retire when released */
	uint32_t fences;       /* total fences held */
	uint64_t page_bytes;
	uint32_t page_tokens;
	uint64_t tokens;       /* pages * page_tokens */
};

struct kvpool;

/* Bytes of one page for a geometry: the tag plus the K/V blocks, rounded
 * up to a multiple of 64 so every page starts on a cache line. This is
 * the page stride in memory. 0 for an invalid geometry or overflow. */
uint64_t kvpool_page_bytes(const struct kvpool_geom *g);

/* The pool keeps a copy of *mem (the backend must outlive the pool) and
 * allocates n_pages (may be 0) in one chunk. KVPOOL_E_RANGE for a bad
 * geometry, -ENOMEM or the backend's error otherwise. */
int kvpool_new(struct kvpool **out, const struct kvmem *mem,
	       const struct kvpool_geom *g, uint32_t n_pages);
void kvpool_free(struct kvpool *p);

const struct kvpool_geom *kvpool_geom(const struct kvpool *p);
/* Whether the CPU may dereference page bytes (kvmem backend says so). */
bool kvpool_host_visible(const struct kvpool *p);
uint32_t kvpool_pages_for(const struct kvpool *p, uint64_t tokens);
void kvpool_get_stats(struct kvpool *p, struct kvpool_stats *st);

/* Reserve n pages for owner, all or nothing; fills table[0..n). Bumps each
 * page's generation. KVPOOL_E_FULL when fewer than n pages are free. */
int kvpool_reserve(struct kvpool *p, uint64_t owner, uint32_t n,
		   struct kvpool_ref *table);
/* RESERVED -> FILLING: a writer starts. */
int kvpool_fill_begin(struct kvpool *p, uint64_t owner,
		      const struct kvpool_ref *table, uint32_t n);
/* Write the integrity tags of table[0..n) for `tokens` positions (page i
 * holds min(page_tokens, tokens - i*page_tokens)); used by local writers
 * and after decode appends a token. Pages must be FILLING or READY. */
int kvpool_tag_write(struct kvpool *p, uint64_t owner,
		     const struct kvpool_ref *table, uint32_t n,
		     uint32_t tokens);
/* FILLING -> READY after checking coverage (n == pages_for(tokens)) and
 * every tag in page memory (invariant 6). On failure nothing changes. */
int kvpool_mark_ready(struct kvpool *p, uint64_t owner,
		      const struct kvpool_ref *table, uint32_t n,
		      uint32_t tokens);
/* Check a page table before a reader uses it (invariant 1): every entry
 * owned by owner in its generation, READY or FILLING, n ==
 * pages_for(tokens), and every tag in page memory matches (owner,
 * generation, page, index, tokens). On KVPOOL_E_TAG, *bad (if non-NULL)
 * is the failing table index. */
int kvpool_verify(struct kvpool *p, uint64_t owner,
		  const struct kvpool_ref *table, uint32_t n, uint32_t tokens,
		  uint32_t *bad);

int kvpool_fence(struct kvpool *p, uint64_t owner,
		 const struct kvpool_ref *table, uint32_t n);
/* Drop one fence per page; a FENCED page whose count reaches 0 is freed. */
int kvpool_unfence(struct kvpool *p, uint64_t owner,
		   const struct kvpool_ref *table, uint32_t n);
/* The owner is done with the pages (success or any failure). Pages without
 * fences go FREE (or RETIRED); fenced pages go FENCED until unfenced. */
int kvpool_release(struct kvpool *p, uint64_t owner,
		   const struct kvpool_ref *table, uint32_t n);
/* Take the pages out of circulation for good (their contents or writers
 * cannot be trusted). */
int kvpool_quarantine(struct kvpool *p, uint64_t owner,
		      const struct kvpool_ref *table, uint32_t n);

/* ---- cached pages (the prefix cache, gpu/kv/pcache.h) ------------------------
 *
 * A CACHED page is a full page of a finished prompt that a cache entry
 * owns: its owner is the entry's id (never a request id: the caller keeps
 * the two spaces apart), its generation is fresh from adopt on, and its
 * tag says (entry, generation, page, index, page_tokens), where index is
 * the page's place in every prompt that maps it (a prefix page sits at the
 * same index in every prompt that starts with it). Nobody writes it again:
 * requests map it (a count), read it through kvpool_verify_mapped, and
 * unmap it; the entry evicts it only once no mapping is left. Deferred
 * release holds by construction: a fenced page (something may still write
 * into it) is never adopted. */

/* Hand pages table[first..first+n) of owner's table (FILLING or READY, no
 * fence, each holding page_tokens positions whose tags say so at their
 * table index) to the cache entries entries[0..n): each becomes CACHED,
 * owned by entries[i], with a new generation written to out[i] and a
 * retagged page. All or nothing; the owner no longer holds them. */
int kvpool_cache_adopt(struct kvpool *p, uint64_t owner,
		       const struct kvpool_ref *table, uint32_t first,
		       uint32_t n, const uint64_t *entries,
		       struct kvpool_ref *out);
/* Count one more (map) or one fewer (unmap) reader of each CACHED page
 * refs[i] owned by entries[i]. unmap also accepts a page quarantined while
 * mapped. All or nothing. */
int kvpool_cache_map(struct kvpool *p, const uint64_t *entries,
		     const struct kvpool_ref *refs, uint32_t n);
int kvpool_cache_unmap(struct kvpool *p, const uint64_t *entries,
		       const struct kvpool_ref *refs, uint32_t n);
/* CACHED -> FREE (or RETIRED) for entry's page; KVPOOL_E_STATE, changing
 * nothing, while a request maps it. */
int kvpool_cache_evict(struct kvpool *p, uint64_t entry,
		       const struct kvpool_ref *ref);
/* A cached page that failed a check: out of circulation for good, mapped
 * or not (its readers' next verify fails). */
int kvpool_cache_quarantine(struct kvpool *p, uint64_t entry,
			    const struct kvpool_ref *ref);
/* kvpool_verify for a table whose first n_mapped entries are CACHED pages
 * of entries[0..n_mapped) (tag index i, page_tokens positions) and whose
 * others are owner's, as kvpool_verify checks them. */
int kvpool_verify_mapped(struct kvpool *p, uint64_t owner,
			 const uint64_t *entries, uint32_t n_mapped,
			 const struct kvpool_ref *table, uint32_t n,
			 uint32_t tokens, uint32_t *bad);
/* kvpool_tag_write of table[first..n) only (the entries before first are
 * mapped cached pages, never written); coverage is of the whole table. */
int kvpool_tag_write_from(struct kvpool *p, uint64_t owner,
			  const struct kvpool_ref *table, uint32_t first,
			  uint32_t n, uint32_t tokens);

/* Add n live FREE pages: first revive RETIRED slots (lowest index first,
 * reallocating a chunk whose memory was returned), then allocate a new
 * chunk. A revived slot keeps its index and its next reservation gets a
 * fresh generation. Retiring pages stay retiring. All or nothing: -ENOMEM
 * (or the backend's error) changes nothing; KVPOOL_E_RANGE if the pool
 * would exceed UINT32_MAX - 1 slots. */
int kvpool_grow(struct kvpool *p, uint32_t n);
/* Retire n pages: FREE pages retire at once (highest index first, so whole
 * chunks empty and go back to the backend), then in-use pages (RESERVED,
 * FILLING, READY, FENCED; highest index first) are marked retiring and
 * retire when released or unfenced. Quarantined and already retiring pages
 * do not count. *retired_now (if non-NULL) is how many retired at once.
 * KVPOOL_E_RANGE, changing nothing, when n exceeds the live pages that are
 * neither quarantined nor retiring. */
int kvpool_shrink(struct kvpool *p, uint32_t n, uint32_t *retired_now);

/* One page's metadata, for status output and tests. */
struct kvpool_page_info {
	enum kvpage_state state;
	uint64_t owner;        /* last owner (kept after release) */
	uint64_t gen;          /* last generation (0: never reserved) */
	uint32_t fences;
	uint32_t maps;         /* CACHED: requests mapping it */
	bool retiring;
	bool has_memory;       /* false once its chunk went back to kvmem */
};
/* KVPOOL_E_RANGE when page >= slots. */
int kvpool_page_info(struct kvpool *p, uint32_t page,
		     struct kvpool_page_info *out);
/* Metadata of pages [0, min(slots, cap)) under one lock (status dumps,
 * invariant checks). Returns the pool's slot count. */
uint32_t kvpool_snapshot(struct kvpool *p, struct kvpool_page_info *out,
			 uint32_t cap);

/* Backend address of page `page`'s first byte (the tag); the KV blocks
 * follow at KVTAG_BYTES. Host-visible only if the kvmem backend says so.
 * NULL for an index out of range or a slot whose memory was returned.
 * The address of a page stays valid while the caller holds the page. */
void *kvpool_page_addr(struct kvpool *p, uint32_t page);
/* Byte offset of K (kv=0) or V (kv=1) of `layer` inside a page. */
uint64_t kvpool_block_offset(const struct kvpool *p, uint32_t layer, int kv);

/* Zero positions [tokens, page_tokens) of ref's page in every layer's K
 * and V block; the tag and positions < tokens are untouched (see
 * "Unfilled tails" above). ref must be owned by owner in its generation
 * (RESERVED, FILLING or READY). tokens == page_tokens does nothing.
 * KVPOOL_E_RANGE for tokens > page_tokens; KVPOOL_E_STALE /
 * KVPOOL_E_STATE as for tables; negative errno from the backend. */
int kvpool_zero_tail(struct kvpool *p, uint64_t owner,
		     const struct kvpool_ref *ref, uint32_t tokens);

/* Whether positions [0, tokens) of every K/V block of `page` (a page in
 * host memory, laid out as above: a received batch) are all finite, in
 * the geometry's dtype. Non-finite KV from a peer is refused: one NaN
 * poisons every attention score that reads it. */
bool kvpool_page_kv_finite(const struct kvpool_geom *g, const void *page,
			   uint32_t tokens);

const char *kvpage_state_name(enum kvpage_state s);
