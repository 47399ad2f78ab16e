/* test_pcache.c - the prefix cache index (gpu/kv/pcache.c) and the pool's
 * cached pages (kvpool_cache_*).
 *
 * Isolation: a prompt cached by one tenant is found by the same tenant and
 * salt only - another tenant, another salt, another model, or one earlier
 * token changed, all miss. Limits: LRU eviction order, leaves before their
 * roots, per-tenant quota, held entries never evicted, flush. Pool: a
 * cached page is read-only (not writable, not releasable by its former
 * owner), counted while mapped, never adopted while fenced, and a cached
 * page whose bytes or owner are swapped fails verification (mutation).
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/kv/kvpool.h"
#include "gpu/kv/pcache.h"

#define PT 4u

static const struct kvpool_geom geom = {
	.page_tokens = PT, .n_layer = 2, .kv_dim = 8, .dtype = KV_DTYPE_F16,
};
static const uint8_t fp_a[32] = { 1 };
static const uint8_t fp_b[32] = { 2 };

static struct kvmem host;

static struct kvpool *pool_new(uint32_t n)
{
	struct kvpool *p = NULL;

	kvmem_host_init(&host);
	ck_assert_int_eq(kvpool_new(&p, &host, &geom, n), 0);
	return p;
}

static uint32_t n_state(struct kvpool *p, enum kvpage_state s)
{
	struct kvpool_stats st;

	kvpool_get_stats(p, &st);
	return st.by_state[s];
}

/* What the engine does for a request computing `n_tok` prompt tokens on
 * fresh pages: reserve, fill, tag; then cache its full pages. Returns the
 * pages adopted; the rest are released. */
static uint32_t run_prompt(struct pcache *c, struct kvpool *p,
			   const struct pcache_key *k, uint64_t owner,
			   const int32_t *tok, uint32_t n_tok)
{
	uint32_t n = kvpool_pages_for(p, n_tok), kept = 0, got;
	struct kvpool_ref t[64];
	bool taken[64] = { 0 };

	ck_assert_int_eq(kvpool_reserve(p, owner, n, t), 0);
	ck_assert_int_eq(kvpool_fill_begin(p, owner, t, n), 0);
	ck_assert_int_eq(kvpool_tag_write(p, owner, t, n, n_tok), 0);
	got = pcache_insert(c, k, tok, owner, t, 0, n_tok / PT, taken);
	for (uint32_t i = 0; i < n; i++)
		if (!taken[i])
			t[kept++] = t[i];
	if (kept)
		ck_assert_int_eq(kvpool_release(p, owner, t, kept), 0);
	return got;
}

static uint32_t hit_pages(struct pcache *c, const struct pcache_key *k,
			  const int32_t *tok, uint32_t n_tok)
{
	struct pcache_map m;
	uint32_t n;

	ck_assert_int_eq(pcache_lookup(c, k, tok, n_tok, 64, &m), 0);
	n = m.n;
	pcache_release(c, &m, false);
	return n;
}

static void prompt_fill(int32_t *tok, uint32_t n, int32_t base)
{
	for (uint32_t i = 0; i < n; i++)
		tok[i] = base + (int32_t)i;
}

static struct pcache *cache_new(struct kvpool *p, uint32_t max,
				uint32_t quota)
{
	struct pcache_params pp = { .max_pages = max, .tenant_pages = quota };
	struct pcache *c = NULL;

	ck_assert_int_eq(pcache_new(&c, p, &pp), 0);
	return c;
}

START_TEST(test_same_tenant_hits)
{
	struct kvpool *p = pool_new(32);
	struct pcache *c = cache_new(p, 32, 0);
	struct pcache_key k;
	int32_t tok[18];

	prompt_fill(tok, 18, 100);
	pcache_key_make(&k, fp_a, "alice", "", 0);
	ck_assert_uint_eq(hit_pages(c, &k, tok, 18), 0);
	ck_assert_uint_eq(run_prompt(c, p, &k, 1, tok, 18), 4);
	ck_assert_uint_eq(n_state(p, KVPAGE_CACHED), 4);
	ck_assert_uint_eq(n_state(p, KVPAGE_FREE), 28);
	ck_assert_uint_eq(hit_pages(c, &k, tok, 18), 4);
	/* a longer prompt with the same start: its prefix pages */
	ck_assert_uint_eq(hit_pages(c, &k, tok, 9), 2);
	pcache_free(c);
	ck_assert_uint_eq(n_state(p, KVPAGE_FREE), 32);
	kvpool_free(p);
}
END_TEST

START_TEST(test_isolation)
{
	struct kvpool *p = pool_new(32);
	struct pcache *c = cache_new(p, 32, 0);
	struct pcache_key alice, bob, salted, other_model, empty_salt;
	struct pcache_tenant_stats ts[4];
	int32_t tok[16], changed[16];

	prompt_fill(tok, 16, 7);
	pcache_key_make(&alice, fp_a, "alice", "", 0);
	pcache_key_make(&bob, fp_a, "bob", "", 0);
	pcache_key_make(&salted, fp_a, "alice", "s1", 2);
	pcache_key_make(&other_model, fp_b, "alice", "", 0);
	ck_assert_uint_eq(run_prompt(c, p, &alice, 1, tok, 16), 4);
	ck_assert_uint_eq(hit_pages(c, &alice, tok, 16), 4);
	/* same prefix, other tenant / salt / model: miss */
	ck_assert_uint_eq(hit_pages(c, &bob, tok, 16), 0);
	ck_assert_uint_eq(hit_pages(c, &salted, tok, 16), 0);
	ck_assert_uint_eq(hit_pages(c, &other_model, tok, 16), 0);
	/* tenant and salt are length-prefixed: "alice"+"s1" is not "alices"+"1" */
	pcache_key_make(&empty_salt, fp_a, "alices", "1", 1);
	ck_assert(memcmp(empty_salt.seed, salted.seed, 32) != 0);
	/* one earlier token changed: nothing from that page on */
	memcpy(changed, tok, sizeof(tok));
	changed[5] = 999;
	ck_assert_uint_eq(hit_pages(c, &alice, changed, 16), 1);
	changed[0] = 998;
	ck_assert_uint_eq(hit_pages(c, &alice, changed, 16), 0);
	/* bob's lookups counted for bob only, with no hit */
	ck_assert_uint_eq(pcache_stats(c, NULL, NULL, ts, 4), 2);
	ck_assert_str_eq(ts[1].tenant, "bob");
	ck_assert_uint_eq(ts[1].lookups, 1);
	ck_assert_uint_eq(ts[1].hits, 0);
	ck_assert_uint_eq(ts[0].hits, 2);
	/* bob caching the same text gets his own pages, alice's stay hers */
	ck_assert_uint_eq(run_prompt(c, p, &bob, 2, tok, 16), 4);
	ck_assert_uint_eq(n_state(p, KVPAGE_CACHED), 8);
	pcache_free(c);
	kvpool_free(p);
}
END_TEST

/* Decode's path (cache.decode_reuse): pages received and marked READY
 * are cached when the request ends, and decode's placement asks
 * pcache_probe, which answers for the key's tenant and salt only and
 * maps, holds and counts nothing. */
START_TEST(test_probe_ready_pages)
{
	struct kvpool *p = pool_new(32);
	struct pcache *c = cache_new(p, 32, 0);
	struct pcache_key alice, bob, salted;
	struct pcache_tenant_stats ts[4];
	struct kvpool_ref t[8];
	bool taken[8] = { 0 };
	uint32_t held = 9, kept = 0;
	int32_t tok[18];

	prompt_fill(tok, 18, 40);
	pcache_key_make(&alice, fp_a, "alice", "", 0);
	pcache_key_make(&bob, fp_a, "bob", "", 0);
	pcache_key_make(&salted, fp_a, "alice", "s", 1);
	ck_assert_uint_eq(pcache_probe(c, &alice, tok, 18, 64), 0);
	/* what a transfer leaves: reserved, filled, tagged, READY */
	ck_assert_int_eq(kvpool_reserve(p, 7, 5, t), 0);
	ck_assert_int_eq(kvpool_fill_begin(p, 7, t, 5), 0);
	ck_assert_int_eq(kvpool_tag_write(p, 7, t, 5, 18), 0);
	ck_assert_int_eq(kvpool_mark_ready(p, 7, t, 5, 18), 0);
	ck_assert_uint_eq(pcache_insert(c, &alice, tok, 7, t, 0, 18 / PT, taken), 4);
	for (uint32_t i = 0; i < 5; i++)
		if (!taken[i])
			t[kept++] = t[i];
	ck_assert_uint_eq(kept, 1);
	ck_assert_int_eq(kvpool_release(p, 7, t, kept), 0);
	ck_assert_uint_eq(n_state(p, KVPAGE_CACHED), 4);
	/* the probe: alice's pages, capped; never bob's or another salt's */
	ck_assert_uint_eq(pcache_probe(c, &alice, tok, 18, 64), 4);
	ck_assert_uint_eq(pcache_probe(c, &alice, tok, 18, 3), 3);
	ck_assert_uint_eq(pcache_probe(c, &alice, tok, 9, 64), 2);
	ck_assert_uint_eq(pcache_probe(c, &bob, tok, 18, 64), 0);
	ck_assert_uint_eq(pcache_probe(c, &salted, tok, 18, 64), 0);
	/* ... and it counted, mapped and held nothing */
	ck_assert_uint_eq(pcache_stats(c, NULL, &held, ts, 4), 1);
	ck_assert_uint_eq(held, 0);
	ck_assert_uint_eq(ts[0].lookups, 0);
	ck_assert_uint_eq(hit_pages(c, &alice, tok, 18), 4);
	pcache_free(c);
	ck_assert_uint_eq(n_state(p, KVPAGE_FREE), 32);
	kvpool_free(p);
}
END_TEST

/* A shrink marks pages in use retiring and waits for them: they are
 * never adopted by the cache, where a hot prefix would keep them from
 * retiring forever (the shrink timed out). */
START_TEST(test_retiring_never_cached)
{
	struct kvpool *p = pool_new(8);
	struct pcache *c = cache_new(p, 8, 0);
	struct pcache_key alice;
	struct kvpool_ref t[4];
	bool taken[4] = { 0 };
	uint32_t now = 0, got, kept = 0;
	struct kvpool_stats st;
	int32_t tok[16];

	prompt_fill(tok, 16, 3);
	pcache_key_make(&alice, fp_a, "alice", "", 0);
	ck_assert_int_eq(kvpool_reserve(p, 5, 4, t), 0);
	ck_assert_int_eq(kvpool_fill_begin(p, 5, t, 4), 0);
	ck_assert_int_eq(kvpool_tag_write(p, 5, t, 4, 16), 0);
	ck_assert_int_eq(kvpool_mark_ready(p, 5, t, 4, 16), 0);
	/* retire 6: the 4 free pages at once, 2 of ours when they go */
	ck_assert_int_eq(kvpool_shrink(p, 6, &now), 0);
	ck_assert_uint_eq(now, 4);
	got = pcache_insert(c, &alice, tok, 5, t, 0, 4, taken);
	ck_assert_uint_le(got, 2);
	ck_assert_uint_eq(n_state(p, KVPAGE_CACHED), got);
	for (uint32_t i = 0; i < 4; i++)
		if (!taken[i])
			t[kept++] = t[i];
	ck_assert_uint_eq(kept, 4 - got);
	ck_assert_int_eq(kvpool_release(p, 5, t, kept), 0);
	/* every retiring page retired: none waits in the cache */
	kvpool_get_stats(p, &st);
	ck_assert_uint_eq(st.retiring, 0);
	ck_assert_uint_eq(st.pages, 2);
	pcache_free(c);
	kvpool_free(p);
}
END_TEST

START_TEST(test_lru_order)
{
	struct kvpool *p = pool_new(32);
	struct pcache *c = cache_new(p, 4, 0);
	struct pcache_key k;
	int32_t a[8], b[8], d[8];

	pcache_key_make(&k, fp_a, "t", "", 0);
	prompt_fill(a, 8, 0);
	prompt_fill(b, 8, 100);
	prompt_fill(d, 8, 200);
	ck_assert_uint_eq(run_prompt(c, p, &k, 1, a, 8), 2);
	ck_assert_uint_eq(run_prompt(c, p, &k, 2, b, 8), 2);
	ck_assert_uint_eq(hit_pages(c, &k, a, 8), 2); /* a is now the newest */
	/* full: d evicts b (least recent), leaf first then root */
	ck_assert_uint_eq(run_prompt(c, p, &k, 3, d, 8), 2);
	ck_assert_uint_eq(hit_pages(c, &k, b, 8), 0);
	ck_assert_uint_eq(hit_pages(c, &k, a, 8), 2);
	ck_assert_uint_eq(hit_pages(c, &k, d, 8), 2);
	ck_assert_uint_eq(n_state(p, KVPAGE_CACHED), 4);
	/* admission's eviction: a leaf goes before its root */
	ck_assert_uint_eq(pcache_evict(c, 1), 1);
	ck_assert_uint_eq(hit_pages(c, &k, a, 8), 1);
	ck_assert_uint_eq(n_state(p, KVPAGE_FREE), 29);
	pcache_free(c);
	kvpool_free(p);
}
END_TEST

START_TEST(test_quota)
{
	struct kvpool *p = pool_new(32);
	struct pcache *c = cache_new(p, 16, 3);
	struct pcache_key ka, kb;
	int32_t a[8], a2[8], b[8];

	pcache_key_make(&ka, fp_a, "a", "", 0);
	pcache_key_make(&kb, fp_a, "b", "", 0);
	prompt_fill(a, 8, 0);
	prompt_fill(a2, 8, 50);
	prompt_fill(b, 8, 100);
	ck_assert_uint_eq(run_prompt(c, p, &kb, 9, b, 8), 2);
	ck_assert_uint_eq(run_prompt(c, p, &ka, 1, a, 8), 2);
	/* a's quota is 3: a2 evicts a's own oldest leaf, never b's pages */
	ck_assert_uint_eq(run_prompt(c, p, &ka, 2, a2, 8), 2);
	ck_assert_uint_eq(hit_pages(c, &kb, b, 8), 2);
	ck_assert_uint_eq(hit_pages(c, &ka, a, 8), 1);
	ck_assert_uint_eq(hit_pages(c, &ka, a2, 8), 2);
	ck_assert_uint_eq(n_state(p, KVPAGE_CACHED), 5);
	pcache_free(c);
	kvpool_free(p);
}
END_TEST

/* A tenant's insert never evicts another tenant's entries, even past
 * max_pages: b learns nothing of a's cache from its own hits. With the
 * cache split between tenants (pcache_split) each keeps its share. */
START_TEST(test_no_cross_tenant_eviction)
{
	struct kvpool *p = pool_new(32);
	struct pcache *c = cache_new(p, 4, 0);   /* quota = max: a can fill it */
	struct pcache_key ka, kb;
	int32_t a[8], a2[8], b[8];

	pcache_key_make(&ka, fp_a, "a", "", 0);
	pcache_key_make(&kb, fp_a, "b", "", 0);
	prompt_fill(a, 8, 0);
	prompt_fill(a2, 8, 50);
	prompt_fill(b, 8, 100);
	ck_assert_uint_eq(run_prompt(c, p, &ka, 1, a, 8), 2);
	ck_assert_uint_eq(run_prompt(c, p, &ka, 2, a2, 8), 2);   /* full: 4 of 4 */
	/* b's prompt finds no room of its own: not cached, a's pages stay */
	ck_assert_uint_eq(run_prompt(c, p, &kb, 3, b, 8), 0);
	ck_assert_uint_eq(hit_pages(c, &ka, a, 8), 2);
	ck_assert_uint_eq(hit_pages(c, &ka, a2, 8), 2);
	ck_assert_uint_eq(hit_pages(c, &kb, b, 8), 0);
	/* split in two: a's next insert makes room in a's own entries */
	pcache_split(c, 2);
	ck_assert_uint_eq(pcache_tenant_pages(c), 2);
	ck_assert_uint_eq(pcache_flush(c, "a"), 4);
	ck_assert_uint_eq(run_prompt(c, p, &ka, 4, a, 8), 2);
	ck_assert_uint_eq(run_prompt(c, p, &kb, 5, b, 8), 2);
	ck_assert_uint_eq(run_prompt(c, p, &ka, 6, a2, 8), 2);   /* evicts a's a */
	ck_assert_uint_eq(hit_pages(c, &kb, b, 8), 2);
	ck_assert_uint_eq(hit_pages(c, &ka, a, 8), 0);
	ck_assert_uint_eq(n_state(p, KVPAGE_CACHED), 4);
	pcache_free(c);
	kvpool_free(p);
}
END_TEST

START_TEST(test_held_not_evicted)
{
	struct kvpool *p = pool_new(16);
	struct pcache *c = cache_new(p, 16, 0);
	struct pcache_key k;
	struct pcache_map m;
	uint32_t pages, held;
	int32_t a[8];

	pcache_key_make(&k, fp_a, "t", "", 0);
	prompt_fill(a, 8, 0);
	ck_assert_uint_eq(run_prompt(c, p, &k, 1, a, 8), 2);
	ck_assert_int_eq(pcache_lookup(c, &k, a, 8, 8, &m), 0);
	ck_assert_uint_eq(m.n, 2);
	ck_assert_uint_eq(pcache_evict(c, 2), 0);
	/* the pool refuses to evict a mapped page */
	ck_assert_int_eq(kvpool_cache_evict(p, m.ids[1], &m.refs[1]),
			 KVPOOL_E_STATE);
	/* flush takes them out of the index, frees them at release */
	ck_assert_uint_eq(pcache_flush(c, NULL), 0);
	ck_assert_uint_eq(hit_pages(c, &k, a, 8), 0);
	pcache_stats(c, &pages, &held, NULL, 0);
	ck_assert_uint_eq(pages, 2);
	ck_assert_uint_eq(held, 2);
	ck_assert_uint_eq(n_state(p, KVPAGE_CACHED), 2);
	pcache_release(c, &m, false);
	pcache_stats(c, &pages, &held, NULL, 0);
	ck_assert_uint_eq(pages, 0);
	ck_assert_uint_eq(n_state(p, KVPAGE_FREE), 16);
	pcache_free(c);
	kvpool_free(p);
}
END_TEST

START_TEST(test_flush_tenant)
{
	struct kvpool *p = pool_new(16);
	struct pcache *c = cache_new(p, 16, 0);
	struct pcache_key ka, kb;
	int32_t a[8];

	pcache_key_make(&ka, fp_a, "a", "", 0);
	pcache_key_make(&kb, fp_a, "b", "", 0);
	prompt_fill(a, 8, 0);
	ck_assert_uint_eq(run_prompt(c, p, &ka, 1, a, 8), 2);
	ck_assert_uint_eq(run_prompt(c, p, &kb, 2, a, 8), 2);
	ck_assert_uint_eq(pcache_flush(c, "a"), 2);
	ck_assert_uint_eq(hit_pages(c, &ka, a, 8), 0);
	ck_assert_uint_eq(hit_pages(c, &kb, a, 8), 2);
	pcache_free(c);
	kvpool_free(p);
}
END_TEST

/* ---- the pool's cached pages ---------------------------------------------- */

/* One cached page (index 0 of owner 1's table), mapped by nobody. */
static void cache_one(struct kvpool *p, uint64_t entry, struct kvpool_ref *out,
		      struct kvpool_ref *old)
{
	ck_assert_int_eq(kvpool_reserve(p, 1, 1, old), 0);
	ck_assert_int_eq(kvpool_fill_begin(p, 1, old, 1), 0);
	ck_assert_int_eq(kvpool_tag_write(p, 1, old, 1, PT), 0);
	ck_assert_int_eq(kvpool_cache_adopt(p, 1, old, 0, 1, &entry, out), 0);
}

START_TEST(test_pool_cached_read_only)
{
	struct kvpool *p = pool_new(4);
	uint64_t entry = PCACHE_ID_BIT | 1;
	struct kvpool_ref ref, old;

	cache_one(p, entry, &ref, &old);
	ck_assert_uint_ne(ref.gen, old.gen);
	/* the former owner holds nothing any more */
	ck_assert_int_eq(kvpool_release(p, 1, &old, 1), KVPOOL_E_STALE);
	ck_assert_int_eq(kvpool_tag_write(p, 1, &old, 1, PT), KVPOOL_E_STALE);
	/* not writable, not releasable, under the entry's own name either */
	ck_assert_int_eq(kvpool_tag_write(p, entry, &ref, 1, PT), KVPOOL_E_STATE);
	ck_assert_int_eq(kvpool_release(p, entry, &ref, 1), KVPOOL_E_STATE);
	ck_assert_int_eq(kvpool_fence(p, entry, &ref, 1), KVPOOL_E_STATE);
	/* map counts; evict only when unmapped */
	ck_assert_int_eq(kvpool_cache_map(p, &entry, &ref, 1), 0);
	ck_assert_int_eq(kvpool_cache_evict(p, entry, &ref), KVPOOL_E_STATE);
	ck_assert_int_eq(kvpool_cache_unmap(p, &entry, &ref, 1), 0);
	ck_assert_int_eq(kvpool_cache_unmap(p, &entry, &ref, 1), KVPOOL_E_STATE);
	ck_assert_int_eq(kvpool_cache_evict(p, entry, &ref), 0);
	ck_assert_uint_eq(n_state(p, KVPAGE_FREE), 4);
	kvpool_free(p);
}
END_TEST

START_TEST(test_pool_fenced_never_cached)
{
	struct kvpool *p = pool_new(4);
	uint64_t entry = PCACHE_ID_BIT | 1;
	struct kvpool_ref t[2], out[2];
	uint64_t ents[2] = { entry, entry + 1 };

	ck_assert_int_eq(kvpool_reserve(p, 1, 2, t), 0);
	ck_assert_int_eq(kvpool_fill_begin(p, 1, t, 2), 0);
	ck_assert_int_eq(kvpool_tag_write(p, 1, t, 2, 2 * PT), 0);
	ck_assert_int_eq(kvpool_fence(p, 1, &t[1], 1), 0);
	/* deferred release: a page something may still write is never
	 * cached, and all or nothing: neither page changed */
	ck_assert_int_eq(kvpool_cache_adopt(p, 1, t, 0, 2, ents, out),
			 KVPOOL_E_STATE);
	ck_assert_uint_eq(n_state(p, KVPAGE_CACHED), 0);
	/* a partial page (tag says fewer tokens) is never cached */
	ck_assert_int_eq(kvpool_tag_write(p, 1, t, 2, 2 * PT - 1), 0);
	ck_assert_int_eq(kvpool_cache_adopt(p, 1, t, 1, 1, ents, out),
			 KVPOOL_E_STATE);
	ck_assert_int_eq(kvpool_unfence(p, 1, &t[1], 1), 0);
	ck_assert_int_eq(kvpool_cache_adopt(p, 1, t, 1, 1, ents, out),
			 KVPOOL_E_TAG);
	ck_assert_uint_eq(n_state(p, KVPAGE_CACHED), 0);
	kvpool_free(p);
}
END_TEST

/* Mutation: a request's table = cached page 0 (entry) + its own page 1. */
static void mapped_table(struct kvpool *p, uint64_t entry,
			 struct kvpool_ref *t)
{
	struct kvpool_ref old;

	cache_one(p, entry, &t[0], &old);
	ck_assert_int_eq(kvpool_cache_map(p, &entry, &t[0], 1), 0);
	ck_assert_int_eq(kvpool_reserve(p, 7, 1, &t[1]), 0);
	ck_assert_int_eq(kvpool_fill_begin(p, 7, &t[1], 1), 0);
	ck_assert_int_eq(kvpool_tag_write_from(p, 7, t, 1, 2, PT + 2), 0);
}

START_TEST(test_pool_mapped_verify_mutations)
{
	struct kvpool *p = pool_new(6);
	uint64_t entry = PCACHE_ID_BIT | 5, wrong = PCACHE_ID_BIT | 6;
	struct kvpool_ref t[2], old2, ref2;
	uint32_t bad = 99;
	uint8_t *a, *b, save[64];

	mapped_table(p, entry, t);
	ck_assert_int_eq(kvpool_verify_mapped(p, 7, &entry, 1, t, 2, PT + 2, &bad), 0);
	/* plain verify (one owner) refuses the mapped page */
	ck_assert_int_eq(kvpool_verify(p, 7, t, 2, PT + 2, NULL), KVPOOL_E_STALE);
	/* owner swapped: another entry's name */
	ck_assert_int_eq(kvpool_verify_mapped(p, 7, &wrong, 1, t, 2, PT + 2, &bad),
			 KVPOOL_E_STALE);
	/* the mapped prefix must be covered */
	ck_assert_int_eq(kvpool_verify_mapped(p, 7, &entry, 1, t, 1, PT - 1, &bad),
			 KVPOOL_E_COVERAGE);
	/* content swapped: page 0's bytes replaced by another cached page's */
	cache_one(p, wrong, &ref2, &old2);
	a = kvpool_page_addr(p, t[0].page);
	b = kvpool_page_addr(p, ref2.page);
	memcpy(save, a, 64);
	memcpy(a, b, 64);
	ck_assert_int_eq(kvpool_verify_mapped(p, 7, &entry, 1, t, 2, PT + 2, &bad),
			 KVPOOL_E_TAG);
	ck_assert_uint_eq(bad, 0);
	/* a tag naming the old owner (the request that computed it) */
	kvtag_make((struct kvtag *)a, 1, t[0].gen, t[0].page, 0, PT);
	ck_assert_int_eq(kvpool_verify_mapped(p, 7, &entry, 1, t, 2, PT + 2, &bad),
			 KVPOOL_E_TAG);
	memcpy(a, save, 64);
	ck_assert_int_eq(kvpool_verify_mapped(p, 7, &entry, 1, t, 2, PT + 2, &bad), 0);
	/* a quarantined cached page fails its readers, unmap still works */
	ck_assert_int_eq(kvpool_cache_quarantine(p, entry, &t[0]), 0);
	ck_assert_int_eq(kvpool_verify_mapped(p, 7, &entry, 1, t, 2, PT + 2, &bad),
			 KVPOOL_E_STATE);
	ck_assert_int_eq(kvpool_cache_unmap(p, &entry, &t[0], 1), 0);
	ck_assert_uint_eq(n_state(p, KVPAGE_QUARANTINED), 1);
	kvpool_free(p);
}
END_TEST

START_TEST(test_poison_drops_tenant)
{
	struct kvpool *p = pool_new(16);
	struct pcache *c = cache_new(p, 16, 0);
	struct pcache_key k;
	struct pcache_map m;
	int32_t a[8], b[8];

	pcache_key_make(&k, fp_a, "t", "", 0);
	prompt_fill(a, 8, 0);
	prompt_fill(b, 8, 100);
	ck_assert_uint_eq(run_prompt(c, p, &k, 1, a, 8), 2);
	ck_assert_uint_eq(run_prompt(c, p, &k, 2, b, 8), 2);
	ck_assert_int_eq(pcache_lookup(c, &k, a, 8, 8, &m), 0);
	ck_assert_uint_eq(m.n, 2);
	pcache_release(c, &m, true);
	ck_assert_uint_eq(n_state(p, KVPAGE_QUARANTINED), 2);
	ck_assert_uint_eq(hit_pages(c, &k, b, 8), 0);
	ck_assert_uint_eq(n_state(p, KVPAGE_FREE), 14);
	pcache_free(c);
	kvpool_free(p);
}
END_TEST

/* Any reserve (decode's transfer pages, the engine's) evicts unmapped
 * cached pages before it says the pool is full; mapped ones stay. */
START_TEST(test_pool_reserve_evicts)
{
	struct kvpool *p = pool_new(8);
	struct pcache *c = cache_new(p, 8, 0);
	struct pcache_key k;
	struct pcache_map m;
	struct kvpool_ref t[8];
	int32_t a[24];

	pcache_key_make(&k, fp_a, "t", "", 0);
	prompt_fill(a, 24, 0);
	ck_assert_uint_eq(run_prompt(c, p, &k, 1, a, 24), 6);
	ck_assert_int_eq(kvpool_reserve(p, 2, 5, t), KVPOOL_E_FULL);
	ck_assert_int_eq(pcache_pool_reserve(NULL, p, 2, 5, t), KVPOOL_E_FULL);
	ck_assert_int_eq(pcache_lookup(c, &k, a, 24, 2, &m), 0);
	ck_assert_uint_eq(m.n, 2);
	/* 2 free + 4 evictable: 7 cannot be had, 6 can */
	ck_assert_int_eq(pcache_pool_reserve(c, p, 2, 7, t), KVPOOL_E_FULL);
	ck_assert_int_eq(pcache_pool_reserve(c, p, 2, 6, t), 0);
	ck_assert_uint_eq(n_state(p, KVPAGE_CACHED), 2);
	ck_assert_uint_eq(hit_pages(c, &k, a, 24), 2);
	ck_assert_int_eq(kvpool_release(p, 2, t, 6), 0);
	pcache_release(c, &m, false);
	pcache_free(c);
	kvpool_free(p);
}
END_TEST

static Suite *pcache_suite(void)
{
	Suite *s = suite_create("pcache");
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, test_same_tenant_hits);
	tcase_add_test(tc, test_isolation);
	tcase_add_test(tc, test_probe_ready_pages);
	tcase_add_test(tc, test_retiring_never_cached);
	tcase_add_test(tc, test_lru_order);
	tcase_add_test(tc, test_quota);
	tcase_add_test(tc, test_no_cross_tenant_eviction);
	tcase_add_test(tc, test_held_not_evicted);
	tcase_add_test(tc, test_flush_tenant);
	tcase_add_test(tc, test_pool_cached_read_only);
	tcase_add_test(tc, test_pool_fenced_never_cached);
	tcase_add_test(tc, test_pool_mapped_verify_mutations);
	tcase_add_test(tc, test_poison_drops_tenant);
	tcase_add_test(tc, test_pool_reserve_evicts);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(pcache_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
