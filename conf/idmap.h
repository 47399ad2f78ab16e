/* idmap.h - an intrusive hash map keyed by uint64 id.
 *
 * A struct kvd_idmap_node lives inside its owner (a request); the map
 * only links it, like conf/list.h. Insert, find and remove are O(1) on
 * average; none allocates, so none can fail. Only the bucket array
 * grows (doubling when the map holds more entries than buckets); a
 * growth that finds no memory leaves the map working with longer chains
 * and is counted in grow_failed. The first KVD_IDMAP_INLINE buckets live
 * in the map itself, so init cannot fail either.
 *
 * The map points into itself (inline buckets): it must not be moved or
 * copied after kvd_idmap_init. Owners come back with kvd_container_of.
 *
 * Thread: none of its own; the caller serialises.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

struct kvd_idmap_node {
	uint64_t id;
	struct kvd_idmap_node *next;     /* the chain of its bucket */
	struct kvd_idmap_node **pprev;   /* the pointer that points here */
};

#define KVD_IDMAP_INLINE 16u

struct kvd_idmap {
	struct kvd_idmap_node **b;       /* (1 << bits) chain heads: inline_b
					  * or a heap array */
	unsigned bits;
	size_t n;                        /* entries */
	size_t max_buckets;              /* growth stops at the largest power
					  * of two not above it (0: no limit) */
	uint64_t grow_failed;            /* growths that found no memory */
	struct kvd_idmap_node *inline_b[KVD_IDMAP_INLINE];
};

/* Empty map of KVD_IDMAP_INLINE buckets. Cannot fail. */
void kvd_idmap_init(struct kvd_idmap *m);
/* Free the bucket array (the nodes are their owners'). Safe twice. */
void kvd_idmap_deinit(struct kvd_idmap *m);

/* Link n under id, which must not be in the map (asserted). Cannot fail;
 * may grow the bucket array (see above). */
void kvd_idmap_insert(struct kvd_idmap *m, struct kvd_idmap_node *n,
		      uint64_t id);
/* The node of id, or NULL. Never allocates. */
struct kvd_idmap_node *kvd_idmap_find(const struct kvd_idmap *m, uint64_t id);
/* Unlink n, which must be in m. O(1). */
void kvd_idmap_remove(struct kvd_idmap *m, struct kvd_idmap_node *n);

/* Grow to at least n_buckets buckets (a power of two; never shrinks,
 * max_buckets caps it). 0, or -ENOMEM with the map unchanged. */
int kvd_idmap_grow(struct kvd_idmap *m, size_t n_buckets);
