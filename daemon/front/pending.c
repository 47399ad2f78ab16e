/* pending.c - the connections of either client front that hold one of
 * listen.max_clients without having shown a key (or, keyless, a request)
 * yet: oldest first on s->front->pending, the first to be closed when a
 * new connection needs their place.
 */
#include "daemon/front/front_int.h"

void serve__pending_add(struct serve *s, struct serve_pending *p,
			void (*evict)(struct serve_pending *p))
{
	p->evict = evict;
	p->on = true;
	kvd_list_add_tail(&s->front->pending, &p->node);
}

void serve__pending_del(struct serve_pending *p)
{
	if (!p->on)
		return;
	p->on = false;
	kvd_list_del(&p->node);
}

bool serve__pending_evict(struct serve *s)
{
	struct serve_pending *p;

	if (kvd_list_empty(&s->front->pending))
		return false;
	p = kvd_list_entry(s->front->pending.next, struct serve_pending, node);
	serve__pending_del(p);
	p->evict(p);
	return true;
}
