/* request.c - the registry of admitted requests.
 *
 * A doubly linked list of requests embedded in their owners, newest first.
 * Lookups by id walk the list: the admin plane looks up one request per
 * operator command, and a node holds at most a few thousand requests, so a
 * hash would buy nothing but code. The registry is the single place where
 * admission and termination are counted, so `status` and drain agree with
 * the owners by construction.
 */
#include "daemon/request.h"
#include "daemon/daemon.h"
#include "conf/util.h"

void kvd_reqtab_init(struct kvd_reqtab *t, struct kvd_daemon *d)
{
	*t = (struct kvd_reqtab){ .d = d, .next_id = 1 };
}

struct kvd_reqtab *kvd_daemon_requests(struct kvd_daemon *d)
{
	if (!d->requests.d)
		kvd_reqtab_init(&d->requests, d);
	return &d->requests;
}

int kvd_request_gate(const struct kvd_reqtab *t)
{
	return t->d->state == KVD_STATE_READY ? 0 : KVD_E_DRAINING;
}

void kvd_request_register(struct kvd_reqtab *t, struct kvd_request *r,
			  const struct kvd_request_ops *ops)
{
	r->id = t->next_id++;
	r->ops = ops;
	r->admitted_ns = kvd_now_ns();
	r->aborting = false;
	r->prev = NULL;
	r->next = t->head;
	if (t->head)
		t->head->prev = r;
	t->head = r;
	t->n++;
	t->d->counters.admitted++;
	t->d->in_flight++;
}

void kvd_request_end(struct kvd_reqtab *t, struct kvd_request *r, bool ok)
{
	if (r->prev)
		r->prev->next = r->next;
	else
		t->head = r->next;
	if (r->next)
		r->next->prev = r->prev;
	r->prev = r->next = NULL;
	t->n--;
	if (ok)
		t->d->counters.completed++;
	else
		t->d->counters.failed++;
	t->d->in_flight--;
	kvd_daemon_in_flight_changed(t->d);
}

struct kvd_request *kvd_reqtab_find(struct kvd_reqtab *t, uint64_t id)
{
	for (struct kvd_request *r = t->head; r; r = r->next)
		if (r->id == id)
			return r;
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
		struct kvd_request *r = t->head;

		while (r && r->aborting)
			r = r->next;
		if (!r)
			return n;
		r->aborting = true;
		if (r->ops->abort(r, reason) == 0)
			n++;
	}
}
