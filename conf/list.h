/* list.h - one intrusive doubly linked list for every module.
 *
 * A struct kvd_list lives inside its owner (a connection, a request); a
 * head is a struct kvd_list of its own, initialised to point at itself.
 * Insert and unlink are O(1) and never allocate; an unlinked node points
 * at itself, so unlinking twice is harmless and kvd_list_linked() tells
 * whether a node is on a list. Owners come back with kvd_container_of.
 *
 * Iterating while the loop body may unlink the current node: use
 * kvd_list_for_each_safe, which has read the next node first. A body that
 * may unlink *other* nodes must restart from the head instead.
 *
 * Header-only, no state: the bottom layer stays dependency-free.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "conf/util.h"

struct kvd_list {
	struct kvd_list *prev, *next;
};

#define KVD_LIST_INIT(name) { &(name), &(name) }

static inline void kvd_list_init(struct kvd_list *l)
{
	l->prev = l->next = l;
}

static inline bool kvd_list_empty(const struct kvd_list *head)
{
	return head->next == head;
}

/* Whether n is on a list (false after kvd_list_init or kvd_list_del). */
static inline bool kvd_list_linked(const struct kvd_list *n)
{
	return n->next != n;
}

static inline void kvd_list__insert(struct kvd_list *n, struct kvd_list *prev,
				    struct kvd_list *next)
{
	n->prev = prev;
	n->next = next;
	prev->next = n;
	next->prev = n;
}

/* Insert n first (newest first when used for every insert). */
static inline void kvd_list_add(struct kvd_list *head, struct kvd_list *n)
{
	kvd_list__insert(n, head, head->next);
}

/* Insert n last. */
static inline void kvd_list_add_tail(struct kvd_list *head, struct kvd_list *n)
{
	kvd_list__insert(n, head->prev, head);
}

/* Unlink n (a no-op when it is not linked); n points at itself after. */
static inline void kvd_list_del(struct kvd_list *n)
{
	n->prev->next = n->next;
	n->next->prev = n->prev;
	kvd_list_init(n);
}

#define kvd_list_entry(node, type, member) kvd_container_of(node, type, member)

/* for (pos over the nodes of head) */
#define kvd_list_for_each(pos, head) \
	for ((pos) = (head)->next; (pos) != (head); (pos) = (pos)->next)

/* the same, with nxt read before the body runs: the body may unlink pos */
#define kvd_list_for_each_safe(pos, nxt, head) \
	for ((pos) = (head)->next, (nxt) = (pos)->next; (pos) != (head); \
	     (pos) = (nxt), (nxt) = (pos)->next)
