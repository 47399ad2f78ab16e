/* idmap.c - an intrusive hash map keyed by uint64 id.
 *
 * Separate chaining with the chain links in the owners' nodes
 * (hlist-style: next plus a pointer to whatever points at the node, so
 * removal needs no walk). Chaining rather than open addressing because
 * it lets insert never fail: an entry needs no slot of its own, only the
 * bucket array is allocated, and a bucket array that cannot grow still
 * holds every entry (with longer chains). The registry of requests
 * relies on that: registering an admitted request must not fail.
 *
 * Ids are hashed with Fibonacci hashing (multiply by 2^64 / phi, keep
 * the top bits): sequential ids, the common case, spread evenly, and so
 * do ids that differ only in their high bits.
 */
#include "conf/idmap.h"

#include <assert.h>
#include <errno.h>
#include <stdlib.h>

#define IDMAP_INLINE_BITS 4
_Static_assert(KVD_IDMAP_INLINE == 1u << IDMAP_INLINE_BITS,
	       "KVD_IDMAP_INLINE is 1 << IDMAP_INLINE_BITS");

static size_t idmap_buckets(const struct kvd_idmap *m)
{
	return (size_t)1 << m->bits;
}

static size_t idmap_slot(uint64_t id, unsigned bits)
{
	return (size_t)((id * 0x9E3779B97F4A7C15ull) >> (64 - bits));
}

static void idmap_link(struct kvd_idmap_node **head, struct kvd_idmap_node *n)
{
	n->next = *head;
	if (n->next)
		n->next->pprev = &n->next;
	n->pprev = head;
	*head = n;
}

void kvd_idmap_init(struct kvd_idmap *m)
{
	*m = (struct kvd_idmap){ .bits = IDMAP_INLINE_BITS };
	m->b = m->inline_b;
}

void kvd_idmap_deinit(struct kvd_idmap *m)
{
	if (m->b && m->b != m->inline_b)
		free(m->b);
	m->b = NULL;
	m->n = 0;
}

int kvd_idmap_grow(struct kvd_idmap *m, size_t n_buckets)
{
	struct kvd_idmap_node **nb, **old = m->b;
	size_t n_old = idmap_buckets(m);
	unsigned bits = m->bits;

	while (((size_t)1 << bits) < n_buckets && bits < 8 * sizeof(size_t) - 2)
		bits++;
	while (m->max_buckets && bits > m->bits &&
	       ((size_t)1 << bits) > m->max_buckets)
		bits--;
	if (bits == m->bits)
		return 0;
	nb = calloc((size_t)1 << bits, sizeof(*nb));
	if (!nb)
		return -ENOMEM;
	for (size_t i = 0; i < n_old; i++) {
		while (old[i]) {
			struct kvd_idmap_node *n = old[i];

			old[i] = n->next;
			idmap_link(&nb[idmap_slot(n->id, bits)], n);
		}
	}
	if (old != m->inline_b)
		free(old);
	m->b = nb;
	m->bits = bits;
	return 0;
}

void kvd_idmap_insert(struct kvd_idmap *m, struct kvd_idmap_node *n,
		      uint64_t id)
{
	assert(!kvd_idmap_find(m, id));
	/* load factor 1: keep chains short while memory allows */
	if (m->n >= idmap_buckets(m) &&
	    (!m->max_buckets || 2 * idmap_buckets(m) <= m->max_buckets) &&
	    kvd_idmap_grow(m, 2 * idmap_buckets(m)))
		m->grow_failed++;
	n->id = id;
	idmap_link(&m->b[idmap_slot(id, m->bits)], n);
	m->n++;
}

struct kvd_idmap_node *kvd_idmap_find(const struct kvd_idmap *m, uint64_t id)
{
	struct kvd_idmap_node *n = m->b[idmap_slot(id, m->bits)];

	while (n && n->id != id)
		n = n->next;
	return n;
}

void kvd_idmap_remove(struct kvd_idmap *m, struct kvd_idmap_node *n)
{
	assert(n->pprev && *n->pprev == n);
	*n->pprev = n->next;
	if (n->next)
		n->next->pprev = n->pprev;
	n->next = NULL;
	n->pprev = NULL;
	m->n--;
}
