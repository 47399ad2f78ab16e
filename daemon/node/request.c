/* request.c - the registry of admitted requests.
 *
 * Each request embeds two links: one on a list, newest first, for the
 * walks (abort_all, counts), and one in a hash map by id (conf/idmap.h)
 * for lookups, which the serving layer makes for every token and every
 * batch it routes. Both are intrusive and never allocate per request,
 * so registration cannot fail; the map's bucket array grows as the node
 * holds more requests, and a growth without memory only lengthens its
 * chains. The registry is the single place where admission and
 * termination are counted, so `status` and drain agree with the owners
 * by construction.
 *
 * Ids are unique across a fleet, not only within a node: the logs of
 * many nodes are read together (kvctl audit, journald), and one grep for
 * a request must find it on both sides of a transfer (decode's id
 * travels in prefill_request; prefill logs it as remote_id). So a
 * registry does not count from 1 - every node would log the same ids -
 * but from a random point of [KVD_REQ_ID_MIN, KVD_REQ_ID_MAX) drawn at
 * start, one up per request: never reused within a boot (a late peer
 * message for an ended request finds nothing), never 0, bit 63 clear (the
 * prefix cache's entries own pages as PCACHE_ID_BIT | n) and, for the
 * first 2^32 requests of a boot, below 2^53, so JSON readers that hold
 * numbers as doubles (jq 1.6, JavaScript) keep them exact. Two nodes'
 * ids meet only when their starts fall within the requests one of them
 * serves of each other's: about 2N / 2^53 for N requests a boot.
 *
 * The ids are not secrets and need not be: no tenant sees one (an HTTP
 * client gets its own 128 random bits, a msgpack client names its
 * requests itself), and the only way to act on one is the admin socket
 * (`kvctl abort`, root or the node's user). The random start also keeps
 * a node's request count out of its logs and its peers' view.
 */
#include "daemon/node/request.h"
#include "daemon/node/daemon.h"
#include "conf/util.h"

#include <string.h>
#include <sys/random.h>
#include <unistd.h>

uint64_t kvd_reqtab_first_id(void)
{
	uint64_t rnd;

	if (getrandom(&rnd, sizeof(rnd), GRND_NONBLOCK) != sizeof(rnd)) {
		/* no entropy yet (early boot) or no getrandom: still
		 * distinct between nodes and restarts, if not unpredictable */
		rnd = kvd_now_ns() ^ ((uint64_t)getpid() << 40);
		rnd *= 0x9e3779b97f4a7c15ull;
	}
	return KVD_REQ_ID_MIN + rnd % (KVD_REQ_ID_MAX - KVD_REQ_ID_MIN);
}

void kvd_reqtab_init(struct kvd_reqtab *t, struct kvd_daemon *d)
{
	*t = (struct kvd_reqtab){ .d = d, .next_id = kvd_reqtab_first_id() };
	kvd_list_init(&t->all);
	kvd_idmap_init(&t->byid);
}

void kvd_reqtab_deinit(struct kvd_reqtab *t)
{
	if (!t->d)
		return;
	kvd_idmap_deinit(&t->byid);
	t->d = NULL;   /* kvd_daemon_requests would initialise it again */
}

int kvd_request_gate(const struct kvd_reqtab *t)
{
	return t->d->state == KVD_STATE_READY ? 0 : KVD_E_DRAINING;
}

uint64_t kvd_reqtab_new_id(struct kvd_reqtab *t)
{
	return t->next_id++;
}

void kvd_request_register(struct kvd_reqtab *t, struct kvd_request *r,
			  const struct kvd_request_ops *ops)
{
	if (!r->id)
		r->id = t->next_id++;
	r->ops = ops;
	r->admitted_ns = kvd_now_ns();
	r->aborting = false;
	kvd_list_add(&t->all, &r->link);
	kvd_idmap_insert(&t->byid, &r->node, r->id);
	t->n++;
	t->d->counters.admitted++;
	t->d->in_flight++;
}

void kvd_request_end(struct kvd_reqtab *t, struct kvd_request *r, bool ok)
{
	kvd_list_del(&r->link);
	kvd_idmap_remove(&t->byid, &r->node);
	t->n--;
	if (ok)
		t->d->counters.completed++;
	else
		t->d->counters.failed++;
	t->d->in_flight--;
	if (t->on_end)
		t->on_end(t->d);   /* last: may complete a drain, stop the node */
}

struct kvd_request *kvd_reqtab_find(struct kvd_reqtab *t, uint64_t id)
{
	struct kvd_idmap_node *n = kvd_idmap_find(&t->byid, id);

	return n ? kvd_container_of(n, struct kvd_request, node) : NULL;
}

struct kvd_request *kvd_reqtab_find_public(struct kvd_reqtab *t,
					   const char *pid)
{
	struct kvd_list *e;

	if (!pid || !*pid)
		return NULL;
	kvd_list_for_each(e, &t->all) {
		struct kvd_request *r = kvd_list_entry(e, struct kvd_request, link);

		if (r->public_id && !strcmp(r->public_id, pid))
			return r;
	}
	return NULL;
}

int kvd_reqtab_abort(struct kvd_reqtab *t, uint64_t id, const char *reason)
{
	struct kvd_request *r = kvd_reqtab_find(t, id);

	if (!r)
		return KVD_E_NOTFOUND;
	if (r->aborting)
		return KVD_E_BUSY;
	r->aborting = true;
	return r->ops->abort(r, reason);
}

uint32_t kvd_reqtab_abort_all(struct kvd_reqtab *t, const char *reason)
{
	uint32_t n = 0;

	/* An abort may end requests (this one, or through a SIGTERM drain
	 * the whole node): rescan from the head after each, taking the
	 * first not yet aborting. Each pass marks one, so this ends. */
	for (;;) {
		struct kvd_list *pos;
		struct kvd_request *r = NULL;

		kvd_list_for_each(pos, &t->all) {
			r = kvd_list_entry(pos, struct kvd_request, link);
			if (!r->aborting)
				break;
			r = NULL;
		}
		if (!r)
			return n;
		r->aborting = true;
		if (r->ops->abort(r, reason) == 0)
			n++;
	}
}
