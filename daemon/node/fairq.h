/* fairq.h - fair admission between tenants: per-tenant bounded queues,
 * weighted shares of the node's admission slots.
 *
 * A request is offered to its tenant's queue (FIFO within a tenant) and
 * leaves it only through fairq_next, which picks among the tenants whose
 * head request fits the tenant's own limits the one with the fewest
 * admitted requests per share (ties: the oldest head), and gives it a
 * slot when the node has one (max_active) and the pages the head needs
 * are available. A head that does not fit the pages blocks the others
 * (no overtaking: a large request is never starved by small ones).
 * Admitted requests hold their tenant's counts until fairq_done.
 *
 * Pure: no I/O, no clock, no allocation but a tenant's record (freed
 * when it has nothing admitted and nothing waiting). One thread.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "conf/list.h"

#define FAIRQ_NAME_MAX 64u

/* A tenant's limits, resolved (0 = no bound for max_active and
 * max_tokens; share >= 1). */
struct fairq_limits {
	uint32_t share;
	uint32_t max_active;             /* admitted at once */
	uint32_t max_queued;             /* waiting */
	uint32_t max_tokens;             /* tokens of its admitted requests */
};

struct fairq_tenant {
	char name[FAIRQ_NAME_MAX];
	struct fairq_limits lim;
	uint32_t active;                 /* admitted, not done */
	uint32_t queued;                 /* on waiting */
	uint64_t tokens;                 /* of the admitted */
	struct kvd_list waiting;         /* fairq_item.node, oldest first */
	struct kvd_list node;            /* fairq.tenants */
};

/* Embedded in the caller's request. */
struct fairq_item {
	struct kvd_list node;            /* its tenant's waiting list */
	struct fairq_tenant *t;          /* NULL: not in the queue */
	uint32_t tokens, pages;
	uint64_t seq;                    /* arrival order */
	bool waiting, active;
	bool held;                       /* set by the caller on a head that
					  * must not go yet: its tenant is
					  * skipped (never blocks the others) */
};

struct fairq {
	struct kvd_list tenants;         /* with something admitted or waiting */
	uint32_t n_tenants;
	uint32_t max_active;             /* the node's slots */
	uint32_t active, queued;
	uint64_t seq;
};

enum {
	FAIRQ_E_TOO_BIG = 1,             /* tokens > the tenant's max_tokens:
					  * could never be admitted */
	FAIRQ_E_FULL,                    /* the tenant's queue is full */
};

void fairq_init(struct fairq *q, uint32_t max_active);
/* Frees the tenant records; items still in it are forgotten. */
void fairq_deinit(struct fairq *q);
/* The tenant `name`, created with `lim` when it has no record (an
 * existing one keeps its limits). NULL: out of memory. */
struct fairq_tenant *fairq_tenant(struct fairq *q, const char *name,
				  const struct fairq_limits *lim);
/* Queue it for t: 0, FAIRQ_E_TOO_BIG or FAIRQ_E_FULL (nothing queued;
 * the tenant's record is let go if idle). One request past max_queued
 * is taken, so that the caller's next fairq_next may admit it at once;
 * if it still waits then, fairq_overfull(t) is true and the caller
 * takes it out (fairq_done) and refuses it: a request is refused for a
 * full queue only when it cannot run now. */
int fairq_offer(struct fairq *q, struct fairq_tenant *t, struct fairq_item *it,
		uint32_t tokens, uint32_t pages);
/* More than max_queued of t's requests wait. */
bool fairq_overfull(const struct fairq_tenant *t);
/* The next request to admit, counted admitted, or NULL (no slot, nothing
 * eligible, or the chosen head needs more than free_pages). A tenant
 * whose head is held is not eligible. */
struct fairq_item *fairq_next(struct fairq *q, uint32_t free_pages);
/* An admitted item ends / a waiting one leaves the queue; nothing for an
 * item that is neither. */
void fairq_done(struct fairq *q, struct fairq_item *it);
