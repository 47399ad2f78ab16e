/* pcache.h - the prefix cache: finished prompts' full pages, by tenant.
 *
 * An entry is one full KV page of a finished prompt, kept in the pool as a
 * CACHED page (gpu/kv/kvpool.h) that the entry owns. Its key is a hash chain:
 *   seed   = SHA-256("kvd/pcache/v1", model fingerprint, tenant, salt)
 *   key(i) = SHA-256(key(i-1) or seed, the page_tokens token ids of page i)
 * so a key names the page's tokens, every token before it, the model, the
 * tenant and the cache_salt at once, and a lookup can only ever find what
 * the same tenant stored under the same salt for the same tokens from
 * position 0 on. Nothing else is compared: there is no way to ask the
 * index about another tenant's entries.
 *
 * Reference counts: a request that maps an entry holds it (and its page's
 * pool map count) until it releases the map; a held entry is never
 * evicted, flushed pages held by a request go when the last holder lets
 * go. Eviction is LRU among entries no request holds and no later page
 * of a cached prompt hangs from (leaves first, so a chain shrinks from
 * its end and never leaves an unreachable tail).
 *
 * Limits: max_pages in all; tenant_pages per tenant (0: max_pages). An
 * insert beyond either limit evicts only the tenant's own LRU entries,
 * never another tenant's (whose timing would then show it how much
 * others cache); it stops, caching nothing more, where none may go. Only
 * the pool's need (pcache_evict, pcache_pool_reserve) evicts across
 * tenants.
 *
 * Entry ids are the pool owners of cached pages: PCACHE_ID_BIT is set in
 * every one, so they never equal a request id (request ids stay below it).
 *
 * Thread safety: every call takes the cache's mutex (compute thread:
 * lookup, insert, release, evict; loop thread: stats, flush). Lock order:
 * cache, then pool.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpu/kv/kvpool.h"

#define PCACHE_KEY_BYTES 32
#define PCACHE_TENANT_MAX 64          /* bytes with the NUL */
#define PCACHE_ID_BIT (1ull << 63)
#define PCACHE_TENANTS_MAX 1024u      /* tenants with counters */
/* cache.tenant_pages unset on a node that does not know its tenants (a
 * prefill node): max_pages split this many ways */
#define PCACHE_DEFAULT_TENANTS 4u

struct pcache;

struct pcache_params {
	uint32_t max_pages;    /* cached pages in all, >= 1 */
	uint32_t tenant_pages; /* per tenant; 0 = max_pages */
};

/* Who may find a prompt's pages: the seed of its chain, and the tenant
 * whose quota and counters it uses. */
struct pcache_key {
	uint8_t seed[PCACHE_KEY_BYTES];
	char tenant[PCACHE_TENANT_MAX];
};

/* The pages one request maps: entries' ids and pool refs, index i = page i
 * of its prompt. Filled by pcache_lookup, given back by pcache_release. */
struct pcache_map {
	uint32_t n;
	uint64_t *ids;             /* (n) */
	struct kvpool_ref *refs;   /* (n) */
	void **ents;               /* (n) the entries, for release */
};

struct pcache_tenant_stats {
	char tenant[PCACHE_TENANT_MAX];
	uint32_t pages;            /* cached pages now (= entries) */
	uint64_t lookups;          /* requests that looked */
	uint64_t hits;             /* ... and reused at least one page */
	uint64_t hit_tokens;       /* prompt tokens reused */
	uint64_t inserted;         /* pages cached */
	uint64_t evictions;        /* pages evicted (LRU, quota or flush) */
};

/* seed from the model fingerprint (32 bytes), the tenant (NUL-ended,
 * truncated to fit) and the salt (salt_len bytes, may be 0). */
void pcache_key_make(struct pcache_key *k, const uint8_t *model_fp,
		     const char *tenant, const void *salt, size_t salt_len);

/* pool must outlive the cache. 0, KVPOOL_E_RANGE (bad params), -ENOMEM. */
int pcache_new(struct pcache **out, struct kvpool *pool,
	       const struct pcache_params *pp);
/* Evicts every entry; every map must have been released. */
void pcache_free(struct pcache *c);

/* Map the longest run of cached pages from page 0 of prompt (n_prompt
 * tokens), at most max_pages. m->n = 0 on a miss. 0 or -ENOMEM (then
 * nothing is mapped). Counts a lookup (and a hit) for k->tenant. */
int pcache_lookup(struct pcache *c, const struct pcache_key *k,
		  const int32_t *prompt, uint32_t n_prompt, uint32_t max_pages,
		  struct pcache_map *m);
/* How many leading full pages of prompt k's tenant and salt has cached
 * (at most max_pages): a question only - nothing is mapped, held or
 * counted, and the answer may be stale by the time a lookup maps. */
uint32_t pcache_probe(struct pcache *c, const struct pcache_key *k,
		      const int32_t *prompt, uint32_t n_prompt, uint32_t max_pages);

/* Unmap and drop the holds (m is emptied; safe on an empty map). With
 * poison, the pages failed a check: their entries go, their pages are
 * quarantined. */
void pcache_release(struct pcache *c, struct pcache_map *m, bool poison);

/* Cache pages [first, n_full) of owner's table (pages of prompt, whose
 * first `first` pages are the ones it mapped): each page whose key is not
 * cached yet is adopted (kvpool_cache_adopt) and taken[i] set; the caller
 * still holds the others. Stops at the first page that cannot be cached
 * (limits, pool refusal). Returns the pages adopted. */
uint32_t pcache_insert(struct pcache *c, const struct pcache_key *k,
		       const int32_t *prompt, uint64_t owner,
		       const struct kvpool_ref *table, uint32_t first,
		       uint32_t n_full, bool *taken);

/* The same as soon as a prompt is computed, while its request runs: pages
 * [m->n, n_full) of owner's table are adopted in order, stopping at the
 * first one already cached (or that cannot be), and held by the request
 * as if it had mapped them: m grows, table[i] becomes the entry's ref.
 * Returns the pages adopted; 0 or -ENOMEM changes nothing. */
int pcache_adopt_held(struct pcache *c, const struct pcache_key *k,
		      const int32_t *prompt, uint64_t owner,
		      struct kvpool_ref *table, struct pcache_map *m,
		      uint32_t n_full);

/* Evict up to n LRU pages no one holds (admission needs room). Returns
 * how many went back to the pool. */
uint32_t pcache_evict(struct pcache *c, uint32_t n);
/* kvpool_reserve for any owner of pool pages, where cached pages never
 * make admission fail: when the pool is short, unmapped cached pages are
 * evicted and the reserve tried once more. c may be NULL (no cache). */
int pcache_pool_reserve(struct pcache *c, struct kvpool *pool, uint64_t owner,
			uint32_t n, struct kvpool_ref *table);
/* Drop every entry of tenant (NULL: all); held ones go at their release.
 * Returns the pages evicted now. */
uint32_t pcache_flush(struct pcache *c, const char *tenant);

/* From now on a tenant's quota is max_pages / tenants (at least 1);
 * entries already over it stay until they are evicted. Any thread. */
void pcache_split(struct pcache *c, uint32_t tenants);
uint32_t pcache_tenant_pages(struct pcache *c);
/* Totals, and up to cap tenants' counters (sorted by name); returns the
 * number of tenants with counters. */
uint32_t pcache_stats(struct pcache *c, uint32_t *pages, uint32_t *held,
		      struct pcache_tenant_stats *out, uint32_t cap);
uint32_t pcache_page_tokens(const struct pcache *c);
