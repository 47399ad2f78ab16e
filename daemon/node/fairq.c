/* fairq.c - per-tenant queues and weighted fair admission.
 *
 * Design. What is shared fairly is the node's admission slots: with
 * tenants.node_max_active = engine.max_batch every admitted request is
 * in the decode batch, so slots are batch places. A flood by one tenant
 * fills its own queue; the next free slot goes to the tenant with the
 * fewest admitted requests per share among those waiting, so another
 * tenant waits for at most one slot to free, not for the flood.
 *
 * Deciding "least served" compares active_a * share_b < active_b *
 * share_a in 64 bits (exact, no division). Tenant records are found by
 * a walk of the tenants with work: at most the requests admitted or
 * waiting, each bounded by the caller.
 */
#include "daemon/node/fairq.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void fairq_init(struct fairq *q, uint32_t max_active)
{
	memset(q, 0, sizeof(*q));
	kvd_list_init(&q->tenants);
	q->max_active = max_active ? max_active : 1;
}

void fairq_deinit(struct fairq *q)
{
	if (!q->tenants.next)
		return;   /* never initialized */
	while (!kvd_list_empty(&q->tenants)) {
		struct fairq_tenant *t = kvd_list_entry(q->tenants.next,
							struct fairq_tenant, node);

		kvd_list_del(&t->node);
		free(t);
	}
	q->n_tenants = 0;
}

struct fairq_tenant *fairq_tenant(struct fairq *q, const char *name,
				  const struct fairq_limits *lim)
{
	struct kvd_list *e;
	struct fairq_tenant *t;

	kvd_list_for_each(e, &q->tenants) {
		t = kvd_list_entry(e, struct fairq_tenant, node);
		if (!strcmp(t->name, name))
			return t;
	}
	t = calloc(1, sizeof(*t));
	if (!t)
		return NULL;
	snprintf(t->name, sizeof(t->name), "%s", name);
	t->lim = *lim;
	if (!t->lim.share)
		t->lim.share = 1;
	kvd_list_init(&t->waiting);
	kvd_list_add_tail(&q->tenants, &t->node);
	q->n_tenants++;
	return t;
}

static void fairq_tenant_idle(struct fairq *q, struct fairq_tenant *t)
{
	if (t->active || t->queued)
		return;
	kvd_list_del(&t->node);
	q->n_tenants--;
	free(t);
}

/* The tenant's own limits let its head in. */
static bool fairq_tenant_may(const struct fairq_tenant *t, uint32_t tokens)
{
	if (t->lim.max_active && t->active >= t->lim.max_active)
		return false;
	if (t->lim.max_tokens && t->tokens + tokens > t->lim.max_tokens)
		return false;
	return true;
}

int fairq_offer(struct fairq *q, struct fairq_tenant *t, struct fairq_item *it,
		uint32_t tokens, uint32_t pages)
{
	memset(it, 0, sizeof(*it));
	if (t->lim.max_tokens && tokens > t->lim.max_tokens) {
		fairq_tenant_idle(q, t);
		return FAIRQ_E_TOO_BIG;
	}
	/* one past max_queued may wait until the caller's next fairq_next
	 * decided whether it runs now (fairq_overfull) */
	if (t->queued > t->lim.max_queued) {
		fairq_tenant_idle(q, t);
		return FAIRQ_E_FULL;
	}
	it->t = t;
	it->tokens = tokens;
	it->pages = pages;
	it->seq = ++q->seq;
	it->waiting = true;
	it->held = false;
	kvd_list_add_tail(&t->waiting, &it->node);
	t->queued++;
	q->queued++;
	return 0;
}

/* True when a is less served than b: active per share, then the older head. */
static bool fairq_before(const struct fairq_tenant *a, const struct fairq_tenant *b)
{
	uint64_t x = (uint64_t)a->active * b->lim.share;
	uint64_t y = (uint64_t)b->active * a->lim.share;
	const struct fairq_item *ha, *hb;

	if (x != y)
		return x < y;
	ha = kvd_list_entry(a->waiting.next, struct fairq_item, node);
	hb = kvd_list_entry(b->waiting.next, struct fairq_item, node);
	return ha->seq < hb->seq;
}

bool fairq_overfull(const struct fairq_tenant *t)
{
	return t->queued > t->lim.max_queued;
}

struct fairq_item *fairq_next(struct fairq *q, uint32_t free_pages)
{
	struct fairq_tenant *best = NULL;
	struct fairq_item *it;
	struct kvd_list *e;

	if (q->active >= q->max_active || !q->queued)
		return NULL;
	kvd_list_for_each(e, &q->tenants) {
		struct fairq_tenant *t = kvd_list_entry(e, struct fairq_tenant, node);

		if (!t->queued)
			continue;
		it = kvd_list_entry(t->waiting.next, struct fairq_item, node);
		if (it->held || !fairq_tenant_may(t, it->tokens))
			continue;
		if (!best || fairq_before(t, best))
			best = t;
	}
	if (!best)
		return NULL;
	it = kvd_list_entry(best->waiting.next, struct fairq_item, node);
	if (it->pages > free_pages)
		return NULL;
	kvd_list_del(&it->node);
	it->waiting = false;
	it->active = true;
	best->queued--;
	q->queued--;
	best->active++;
	best->tokens += it->tokens;
	q->active++;
	return it;
}

void fairq_done(struct fairq *q, struct fairq_item *it)
{
	struct fairq_tenant *t = it->t;

	if (!t)
		return;
	if (it->waiting) {
		kvd_list_del(&it->node);
		t->queued--;
		q->queued--;
	} else if (it->active) {
		t->active--;
		t->tokens -= it->tokens;
		q->active--;
	}
	it->waiting = it->active = false;
	it->t = NULL;
	fairq_tenant_idle(q, t);
}
