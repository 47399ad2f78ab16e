/* pcache.c - the prefix cache index: hash chains, holds, LRU, quotas.
 *
 * Why a hash chain and nothing else. A key is SHA-256 over the previous
 * page's key (the seed for page 0) and this page's tokens, and the seed is
 * SHA-256 over the model fingerprint, the tenant and the salt, each
 * length-prefixed so no two (tenant, salt) pairs feed the same bytes. A
 * lookup walks the chain of *its own* seed from page 0 and stops at the
 * first key that is not indexed, so it can reach only pages stored under
 * the same model, tenant and salt, after exactly the same earlier tokens.
 * Whether another tenant cached the same text changes nothing a lookup
 * does (same hashing, same miss), which is what makes a cross-tenant guess
 * unmeasurable from the cache's side. SHA-256 keeps keys collision-free
 * in practice; a weak hash would let a crafted prompt alias another
 * prompt's page.
 *
 * Structures. Entries sit in a hash table (buckets of 2^k chains, indexed
 * by the key's first bytes) and in one LRU list (head: most recently
 * used). Each knows its parent (the entry of the page before it), how many
 * cached pages hang from it (children) and how many requests hold it
 * (holds, equal to its page's pool map count). Only leaves nobody holds are
 * evicted, scanning from the LRU tail; lookup and insert touch a chain
 * from its leaf to its root, so a root is always more recent than its
 * pages after it.
 *
 * Flush and poison take entries out of the index at once (no lookup finds
 * them again); an entry out of the index is freed as soon as nothing holds
 * it and nothing hangs from it (reap). A poisoned page (it failed a tag
 * check) is quarantined in the pool instead of freed.
 */
#include "gpu/kv/pcache.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conf/sha256.h"
#include "conf/util.h"

struct pcache_entry {
	uint8_t key[PCACHE_KEY_BYTES];
	uint64_t id;                    /* pool owner of the page */
	struct kvpool_ref ref;
	uint32_t tenant;                /* index into pcache.tenants */
	uint32_t holds;                 /* requests mapping it */
	uint32_t children;              /* entries whose parent it is */
	struct pcache_entry *parent;    /* the page before it, or NULL */
	struct pcache_entry *lru_prev, *lru_next;
	struct pcache_entry *hnext;     /* bucket chain */
	bool indexed;                   /* findable (not flushed/poisoned) */
	bool poisoned;                  /* quarantine instead of free */
};

struct pcache {
	pthread_mutex_t mu;
	struct kvpool *pool;
	struct pcache_params pp;
	uint32_t pt;                    /* tokens per page */
	struct pcache_entry **buckets;  /* (n_buckets) */
	uint32_t n_buckets;             /* power of two */
	struct pcache_entry *lru_head, *lru_tail;
	uint32_t pages;                 /* entries alive */
	uint32_t held;                  /* entries with holds > 0 */
	uint32_t unindexed;             /* entries waiting to be reaped */
	uint64_t next_id;
	struct pcache_tenant_stats *tenants; /* (PCACHE_TENANTS_MAX) */
	uint32_t n_tenants;
};

/* ---- keys ----------------------------------------------------------------- */

static void pcache__put_len(struct sha256 *h, uint64_t n)
{
	uint8_t b[8];

	for (int i = 0; i < 8; i++)
		b[i] = (uint8_t)(n >> (8 * i));
	sha256_update(h, b, sizeof(b));
}

void pcache_key_make(struct pcache_key *k, const uint8_t *model_fp,
		     const char *tenant, const void *salt, size_t salt_len)
{
	static const char dom[] = "kvd/pcache/v1";
	struct sha256 h;
	size_t tl;

	memset(k, 0, sizeof(*k));
	snprintf(k->tenant, sizeof(k->tenant), "%s", tenant ? tenant : "");
	tl = strlen(k->tenant);
	sha256_init(&h);
	sha256_update(&h, dom, sizeof(dom));
	sha256_update(&h, model_fp, SHA256_DIGEST_SIZE);
	pcache__put_len(&h, tl);
	sha256_update(&h, k->tenant, tl);
	pcache__put_len(&h, salt_len);
	if (salt_len)
		sha256_update(&h, salt, salt_len);
	sha256_final(&h, k->seed);
}

/* key(i) from key(i-1) (or the seed) and page i's tokens (little-endian
 * int32, the host order kvpool asserts). */
static void pcache__chain(uint8_t key[PCACHE_KEY_BYTES], const int32_t *tok,
			  uint32_t pt)
{
	struct sha256 h;

	sha256_init(&h);
	sha256_update(&h, key, PCACHE_KEY_BYTES);
	sha256_update(&h, tok, (size_t)pt * sizeof(*tok));
	sha256_final(&h, key);
}

/* ---- index and LRU (lock held) ------------------------------------------- */

static uint32_t pcache__bucket(const struct pcache *c, const uint8_t *key)
{
	uint32_t b;

	memcpy(&b, key, sizeof(b));
	return b & (c->n_buckets - 1);
}

static struct pcache_entry *pcache__find(const struct pcache *c,
					 const uint8_t *key)
{
	struct pcache_entry *e = c->buckets[pcache__bucket(c, key)];

	while (e && memcmp(e->key, key, PCACHE_KEY_BYTES))
		e = e->hnext;
	return e;
}

static void pcache__unindex(struct pcache *c, struct pcache_entry *e)
{
	struct pcache_entry **pp = &c->buckets[pcache__bucket(c, e->key)];

	if (!e->indexed)
		return;
	while (*pp != e)
		pp = &(*pp)->hnext;
	*pp = e->hnext;
	e->indexed = false;
	c->unindexed++;
}

static void pcache__lru_unlink(struct pcache *c, struct pcache_entry *e)
{
	if (e->lru_prev)
		e->lru_prev->lru_next = e->lru_next;
	else
		c->lru_head = e->lru_next;
	if (e->lru_next)
		e->lru_next->lru_prev = e->lru_prev;
	else
		c->lru_tail = e->lru_prev;
	e->lru_prev = e->lru_next = NULL;
}

static void pcache__lru_push(struct pcache *c, struct pcache_entry *e)
{
	e->lru_prev = NULL;
	e->lru_next = c->lru_head;
	if (c->lru_head)
		c->lru_head->lru_prev = e;
	else
		c->lru_tail = e;
	c->lru_head = e;
}

/* Most recent: leaf first, root last, so the root ends at the head. */
static void pcache__touch_chain(struct pcache *c, struct pcache_entry *leaf)
{
	for (struct pcache_entry *e = leaf; e; e = e->parent) {
		pcache__lru_unlink(c, e);
		pcache__lru_push(c, e);
	}
}

/* The entry leaves the cache; its page goes back to the pool (or is
 * quarantined when poisoned). Nothing may hold it or hang from it. */
static void pcache__drop(struct pcache *c, struct pcache_entry *e)
{
	if (e->poisoned)
		kvpool_cache_quarantine(c->pool, e->id, &e->ref);
	else
		kvpool_cache_evict(c->pool, e->id, &e->ref);
	if (e->indexed)
		pcache__unindex(c, e);
	c->unindexed--;
	if (e->parent)
		e->parent->children--;
	pcache__lru_unlink(c, e);
	c->tenants[e->tenant].pages--;
	c->tenants[e->tenant].evictions++;
	c->pages--;
	free(e);
}

/* Evict the least recently used leaf nobody holds, of `tenant` (or anyone
 * when tenant == UINT32_MAX), never `keep`. false when there is none. */
static bool pcache__evict_one(struct pcache *c, uint32_t tenant,
			      const struct pcache_entry *keep)
{
	for (struct pcache_entry *e = c->lru_tail; e; e = e->lru_prev) {
		if (e->holds || e->children || e == keep ||
		    (tenant != UINT32_MAX && e->tenant != tenant))
			continue;
		pcache__drop(c, e);
		return true;
	}
	return false;
}

/* Free entries out of the index that nobody holds, leaves first. */
static uint32_t pcache__reap(struct pcache *c)
{
	uint32_t n = 0;
	bool more = c->unindexed > 0;

	while (more) {
		more = false;
		for (struct pcache_entry *e = c->lru_tail, *prev; e; e = prev) {
			prev = e->lru_prev;
			if (e->indexed || e->holds || e->children)
				continue;
			pcache__drop(c, e);
			n++;
			more = true;
		}
	}
	return n;
}

/* The tenant's counters, created on first use; UINT32_MAX when the table
 * is full (that tenant then neither finds nor stores pages). */
static uint32_t pcache__tenant(struct pcache *c, const char *name)
{
	for (uint32_t i = 0; i < c->n_tenants; i++)
		if (!strcmp(c->tenants[i].tenant, name))
			return i;
	if (c->n_tenants == PCACHE_TENANTS_MAX)
		return UINT32_MAX;
	memset(&c->tenants[c->n_tenants], 0, sizeof(c->tenants[0]));
	snprintf(c->tenants[c->n_tenants].tenant, PCACHE_TENANT_MAX, "%s",
		 name);
	return c->n_tenants++;
}

/* ---- lifecycle ------------------------------------------------------------- */

int pcache_new(struct pcache **out, struct kvpool *pool,
	       const struct pcache_params *pp)
{
	struct pcache *c;
	uint32_t nb = 16;

	if (!pool || !pp || pp->max_pages == 0)
		return KVPOOL_E_RANGE;
	while (nb < pp->max_pages && nb < (1u << 24))
		nb <<= 1;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->buckets = calloc(nb, sizeof(*c->buckets));
	c->tenants = calloc(PCACHE_TENANTS_MAX, sizeof(*c->tenants));
	if (!c->buckets || !c->tenants || pthread_mutex_init(&c->mu, NULL)) {
		free(c->buckets);
		free(c->tenants);
		free(c);
		return -ENOMEM;
	}
	c->pool = pool;
	c->pp = *pp;
	if (!c->pp.tenant_pages || c->pp.tenant_pages > c->pp.max_pages)
		c->pp.tenant_pages = c->pp.max_pages;
	c->pt = kvpool_geom(pool)->page_tokens;
	c->n_buckets = nb;
	*out = c;
	return 0;
}

void pcache_free(struct pcache *c)
{
	if (!c)
		return;
	pcache_flush(c, NULL);
	free(c->buckets);
	free(c->tenants);
	pthread_mutex_destroy(&c->mu);
	free(c);
}

uint32_t pcache_page_tokens(const struct pcache *c)
{
	return c->pt;
}

/* ---- lookup and release -------------------------------------------------- */

static int pcache__map_alloc(struct pcache_map *m, uint32_t n)
{
	memset(m, 0, sizeof(*m));
	if (n == 0)
		return 0;
	m->ids = calloc(n, sizeof(*m->ids));
	m->refs = calloc(n, sizeof(*m->refs));
	m->ents = calloc(n, sizeof(*m->ents));
	if (m->ids && m->refs && m->ents)
		return 0;
	free(m->ids);
	free(m->refs);
	free(m->ents);
	memset(m, 0, sizeof(*m));
	return -ENOMEM;
}

static void pcache__map_free(struct pcache_map *m)
{
	free(m->ids);
	free(m->refs);
	free(m->ents);
	memset(m, 0, sizeof(*m));
}

/* Walk k's chain over prompt while entries are indexed; fills m. */
static void pcache__walk(struct pcache *c, const struct pcache_key *k,
			 const int32_t *prompt, uint32_t max,
			 struct pcache_map *m)
{
	uint8_t key[PCACHE_KEY_BYTES];

	memcpy(key, k->seed, sizeof(key));
	for (uint32_t i = 0; i < max; i++) {
		struct pcache_entry *e;

		pcache__chain(key, prompt + (size_t)i * c->pt, c->pt);
		e = pcache__find(c, key);
		if (!e)
			break;
		m->ids[i] = e->id;
		m->refs[i] = e->ref;
		m->ents[i] = e;
		m->n = i + 1;
	}
}

uint32_t pcache_probe(struct pcache *c, const struct pcache_key *k,
		      const int32_t *prompt, uint32_t n_prompt, uint32_t max_pages)
{
	uint32_t max = KVD_MIN(max_pages, n_prompt / c->pt), n = 0;
	uint8_t (*keys)[PCACHE_KEY_BYTES];

	if (!max)
		return 0;
	/* the chain is hashed before the lock is taken: the compute
	 * thread's lookups and inserts never wait for it */
	keys = malloc((size_t)max * sizeof(*keys));
	if (!keys)
		return 0;
	memcpy(keys[0], k->seed, sizeof(keys[0]));
	pcache__chain(keys[0], prompt, c->pt);
	for (uint32_t i = 1; i < max; i++) {
		memcpy(keys[i], keys[i - 1], sizeof(keys[i]));
		pcache__chain(keys[i], prompt + (size_t)i * c->pt, c->pt);
	}
	pthread_mutex_lock(&c->mu);
	while (n < max && pcache__find(c, keys[n]))
		n++;
	pthread_mutex_unlock(&c->mu);
	free(keys);
	return n;
}

int pcache_lookup(struct pcache *c, const struct pcache_key *k,
		  const int32_t *prompt, uint32_t n_prompt, uint32_t max_pages,
		  struct pcache_map *m)
{
	uint32_t max = KVD_MIN(max_pages, n_prompt / c->pt), t;
	int r;

	r = pcache__map_alloc(m, max);
	if (r)
		return r;
	pthread_mutex_lock(&c->mu);
	t = pcache__tenant(c, k->tenant);
	if (t != UINT32_MAX) {
		c->tenants[t].lookups++;
		pcache__walk(c, k, prompt, max, m);
	}
	if (m->n && kvpool_cache_map(c->pool, m->ids, m->refs, m->n))
		m->n = 0;   /* the pool disagrees: reuse nothing */
	for (uint32_t i = 0; i < m->n; i++) {
		struct pcache_entry *e = m->ents[i];

		if (e->holds++ == 0)
			c->held++;
	}
	if (m->n) {
		pcache__touch_chain(c, m->ents[m->n - 1]);
		c->tenants[t].hits++;
		c->tenants[t].hit_tokens += (uint64_t)m->n * c->pt;
	}
	pthread_mutex_unlock(&c->mu);
	if (!m->n)
		pcache__map_free(m);
	return 0;
}

void pcache_release(struct pcache *c, struct pcache_map *m, bool poison)
{
	if (!m->n) {
		pcache__map_free(m);
		return;
	}
	pthread_mutex_lock(&c->mu);
	kvpool_cache_unmap(c->pool, m->ids, m->refs, m->n);
	for (uint32_t i = 0; i < m->n; i++) {
		struct pcache_entry *e = m->ents[i];

		if (--e->holds == 0)
			c->held--;
		if (poison && !e->poisoned) {
			e->poisoned = true;
			pcache__unindex(c, e);
		}
	}
	/* entries after a poisoned page can no longer be reached: the
	 * tenant's whole cache goes (an integrity failure is rare and
	 * means the pages cannot be trusted) */
	if (poison) {
		for (struct pcache_entry *e = c->lru_head; e; e = e->lru_next)
			if (e->tenant == ((struct pcache_entry *)m->ents[0])->tenant)
				pcache__unindex(c, e);
	}
	pcache__reap(c);
	pthread_mutex_unlock(&c->mu);
	pcache__map_free(m);
}

/* ---- insert ---------------------------------------------------------------- */

/* Room for one more page of tenant t, never evicting keep, and never
 * another tenant's page: an insert that evicted others' entries would
 * let a tenant time its own re-sent prompts and learn how much the
 * others cache (prime and probe). Past the whole cache's bound t makes
 * room in its own entries or caches nothing; quotas that sum to at most
 * max_pages (the daemon's default) keep that bound from binding. Only
 * the pool's own need (pcache_evict, pcache_pool_reserve) evicts across
 * tenants. */
static bool pcache__room(struct pcache *c, uint32_t t,
			 const struct pcache_entry *keep)
{
	while (c->tenants[t].pages >= c->pp.tenant_pages)
		if (!pcache__evict_one(c, t, keep))
			return false;
	while (c->pages >= c->pp.max_pages)
		if (!pcache__evict_one(c, t, keep))
			return false;
	return true;
}

/* Adopt table[i] as a new entry under parent; NULL when the pool refuses. */
static struct pcache_entry *pcache__adopt(struct pcache *c, uint32_t t,
					  const uint8_t *key, uint64_t owner,
					  const struct kvpool_ref *table,
					  uint32_t i,
					  struct pcache_entry *parent)
{
	struct pcache_entry *e = calloc(1, sizeof(*e));
	uint32_t b;

	if (!e)
		return NULL;
	memcpy(e->key, key, PCACHE_KEY_BYTES);
	e->id = PCACHE_ID_BIT | ++c->next_id;
	if (kvpool_cache_adopt(c->pool, owner, table, i, 1, &e->id, &e->ref)) {
		free(e);
		return NULL;
	}
	e->tenant = t;
	e->parent = parent;
	if (parent)
		parent->children++;
	e->indexed = true;
	b = pcache__bucket(c, key);
	e->hnext = c->buckets[b];
	c->buckets[b] = e;
	pcache__lru_push(c, e);
	c->pages++;
	c->tenants[t].pages++;
	c->tenants[t].inserted++;
	return e;
}

uint32_t pcache_insert(struct pcache *c, const struct pcache_key *k,
		       const int32_t *prompt, uint64_t owner,
		       const struct kvpool_ref *table, uint32_t first,
		       uint32_t n_full, bool *taken)
{
	uint8_t key[PCACHE_KEY_BYTES];
	struct pcache_entry *parent = NULL;
	uint32_t n = 0, t;

	memcpy(key, k->seed, sizeof(key));
	pthread_mutex_lock(&c->mu);
	t = pcache__tenant(c, k->tenant);
	for (uint32_t i = 0; t != UINT32_MAX && i < n_full; i++) {
		struct pcache_entry *e;

		pcache__chain(key, prompt + (size_t)i * c->pt, c->pt);
		e = pcache__find(c, key);
		if (!e && i >= first && pcache__room(c, t, parent))
			e = pcache__adopt(c, t, key, owner, table, i, parent);
		if (!e || e->parent != parent)
			break;   /* not cached, or a chain that changed under us */
		if (i >= first && e->ref.page == table[i].page) {
			taken[i] = true;
			n++;
		}
		parent = e;
	}
	if (parent)
		pcache__touch_chain(c, parent);
	pthread_mutex_unlock(&c->mu);
	return n;
}

static int pcache__map_grow(struct pcache_map *m, uint32_t cap)
{
	uint64_t *ids = realloc(m->ids, cap * sizeof(*ids));
	struct kvpool_ref *refs;
	void **ents;

	if (!ids)
		return -ENOMEM;
	m->ids = ids;
	refs = realloc(m->refs, cap * sizeof(*refs));
	if (!refs)
		return -ENOMEM;
	m->refs = refs;
	ents = realloc(m->ents, cap * sizeof(*ents));
	if (!ents)
		return -ENOMEM;
	m->ents = ents;
	return 0;
}

/* Hold e for the map's owner: page i of its table from now on. */
static bool pcache__hold_new(struct pcache *c, struct pcache_entry *e,
			     struct kvpool_ref *table, struct pcache_map *m,
			     uint32_t i)
{
	if (kvpool_cache_map(c->pool, &e->id, &e->ref, 1))
		return false;
	e->holds = 1;
	c->held++;
	m->ids[i] = e->id;
	m->refs[i] = e->ref;
	m->ents[i] = e;
	m->n = i + 1;
	table[i] = e->ref;
	return true;
}

int pcache_adopt_held(struct pcache *c, const struct pcache_key *k,
		      const int32_t *prompt, uint64_t owner,
		      struct kvpool_ref *table, struct pcache_map *m,
		      uint32_t n_full)
{
	uint8_t key[PCACHE_KEY_BYTES];
	struct pcache_entry *parent;
	uint32_t first = m->n, t;

	if (n_full <= first || pcache__map_grow(m, n_full))
		return n_full <= first ? 0 : -ENOMEM;
	memcpy(key, k->seed, sizeof(key));
	for (uint32_t i = 0; i < first; i++)
		pcache__chain(key, prompt + (size_t)i * c->pt, c->pt);
	pthread_mutex_lock(&c->mu);
	parent = first ? m->ents[first - 1] : NULL;
	t = pcache__tenant(c, k->tenant);
	for (uint32_t i = first; t != UINT32_MAX && i < n_full; i++) {
		struct pcache_entry *e;

		if (parent && !parent->indexed)
			break;   /* flushed under us: nothing hangs from it */
		pcache__chain(key, prompt + (size_t)i * c->pt, c->pt);
		if (pcache__find(c, key) || !pcache__room(c, t, parent))
			break;
		e = pcache__adopt(c, t, key, owner, table, i, parent);
		if (!e)
			break;
		if (!pcache__hold_new(c, e, table, m, i)) {
			/* cannot happen (we just adopted it); leave it cached */
			break;
		}
		parent = e;
	}
	if (parent)
		pcache__touch_chain(c, parent);
	pthread_mutex_unlock(&c->mu);
	return (int)(m->n - first);
}

/* ---- eviction, flush, stats ---------------------------------------------- */

uint32_t pcache_evict(struct pcache *c, uint32_t n)
{
	uint32_t done = 0;

	pthread_mutex_lock(&c->mu);
	while (done < n && pcache__evict_one(c, UINT32_MAX, NULL))
		done++;
	pthread_mutex_unlock(&c->mu);
	return done;
}

int pcache_pool_reserve(struct pcache *c, struct kvpool *pool, uint64_t owner,
			uint32_t n, struct kvpool_ref *table)
{
	struct kvpool_stats st;
	int rc = kvpool_reserve(pool, owner, n, table);

	if (rc != KVPOOL_E_FULL || !c)
		return rc;
	kvpool_get_stats(pool, &st);
	if (n > st.by_state[KVPAGE_FREE])
		pcache_evict(c, n - st.by_state[KVPAGE_FREE]);
	return kvpool_reserve(pool, owner, n, table);
}

uint32_t pcache_flush(struct pcache *c, const char *tenant)
{
	uint32_t n;

	pthread_mutex_lock(&c->mu);
	for (struct pcache_entry *e = c->lru_head; e; e = e->lru_next)
		if (!tenant || !strcmp(c->tenants[e->tenant].tenant, tenant))
			pcache__unindex(c, e);
	n = pcache__reap(c);
	pthread_mutex_unlock(&c->mu);
	return n;
}

void pcache_split(struct pcache *c, uint32_t tenants)
{
	pthread_mutex_lock(&c->mu);
	c->pp.tenant_pages = KVD_MAX(c->pp.max_pages / KVD_MAX(tenants, 1u), 1u);
	pthread_mutex_unlock(&c->mu);
}

uint32_t pcache_tenant_pages(struct pcache *c)
{
	uint32_t n;

	pthread_mutex_lock(&c->mu);
	n = c->pp.tenant_pages;
	pthread_mutex_unlock(&c->mu);
	return n;
}

uint32_t pcache_stats(struct pcache *c, uint32_t *pages, uint32_t *held,
		      struct pcache_tenant_stats *out, uint32_t cap)
{
	uint32_t n;

	pthread_mutex_lock(&c->mu);
	if (pages)
		*pages = c->pages;
	if (held)
		*held = c->held;
	n = c->n_tenants;
	if (out)
		memcpy(out, c->tenants, (size_t)KVD_MIN(n, cap) * sizeof(*out));
	pthread_mutex_unlock(&c->mu);
	return n;
}
