/* request.h - the registry of admitted requests, and the admission gate.
 *
 * Every request the node admits (client generation, prefill for a peer,
 * decode of a transfer, synthetic load from a fault point) is embedded by
 * its owner and registered here between admission and its terminal state.
 * The registry is how `kvctl abort ID` finds a request, how status counts
 * them, and how drain knows when the node is idle: registration bumps
 * d->in_flight, the end drops it and calls t->on_end (the daemon's
 * kvd_daemon_in_flight_changed())
 * (DRAINING -> DRAINED when it reaches 0).
 *
 * The owner keeps the memory; the registry only links it. Abort goes
 * through the owner's ops->abort, i.e. the request's normal failure path
 * (deferred release applies: fenced pages stay out of the free list until
 * the fence is dropped), and the owner calls kvd_request_end() when the
 * request is terminal.
 *
 * Thread: loop thread only.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "conf/idmap.h"
#include "conf/list.h"

struct kvd_daemon;
struct kvd_request;

/* The range a registry's first id is drawn from (request.c: unique
 * across nodes, exact in JSON for the first 2^32 requests of a boot,
 * bit 63 clear). */
#define KVD_REQ_ID_MIN (1ull << 32)
#define KVD_REQ_ID_MAX ((1ull << 53) - (1ull << 32))

/* A public request id's bytes, NUL included ("chatcmpl-" + 32 hex). */
#define KVD_PUBLIC_ID_MAX 48

/* Who embeds a registered request: an owner finds its own requests by id
 * (kvd_reqtab_find) and converts only those of its family. */
enum kvd_request_family { KVD_REQ_SYNTHETIC = 0, KVD_REQ_SERVE };

struct kvd_request_ops {
	const char *kind;   /* "synthetic", "generate", "prefill", "decode" */
	enum kvd_request_family family;
	/* Fail the request through its normal failure path. 0 when the abort
	 * was started (the owner ends the request, now or later); a positive
	 * KVD_E_* when it cannot be aborted. Called at most once. */
	int (*abort)(struct kvd_request *r, const char *reason);
};

struct kvd_request {
	uint64_t id;                 /* registry-assigned, never reused
				      * (a random start: request.c) */
	const struct kvd_request_ops *ops;
	uint32_t tokens;             /* positions reserved */
	uint32_t pages;              /* pages reserved */
	uint64_t admitted_ns;        /* kvd_now_ns() at admission */
	bool aborting;               /* ops->abort called */
	const char *tenant;          /* whose request, for log lines (the
				      * owner's string; NULL: no tenant,
				      * e.g. synthetic load) */
	const char *public_id;       /* the id its client was given
				      * ("cmpl-..."; the owner's string;
				      * NULL: none), for kvctl abort */
	struct kvd_list link;        /* t->all */
	struct kvd_idmap_node node;  /* t->byid, under id */
};

struct kvd_reqtab {
	struct kvd_daemon *d;
	struct kvd_list all;         /* every registered request, newest first */
	struct kvd_idmap byid;       /* the same, by id */
	uint32_t n;
	uint64_t next_id;
	/* called after every end (the daemon's in-flight count changed:
	 * a drain may complete); set by kvd_daemon_requests */
	void (*on_end)(struct kvd_daemon *d);
};

/* t must not move after it (it points into itself). Its ids start at
 * kvd_reqtab_first_id(). */
void kvd_reqtab_init(struct kvd_reqtab *t, struct kvd_daemon *d);
/* A random first id in [KVD_REQ_ID_MIN, KVD_REQ_ID_MAX). */
uint64_t kvd_reqtab_first_id(void);
/* Free the lookup table's memory; the requests are their owners'. */
void kvd_reqtab_deinit(struct kvd_reqtab *t);

/* The node's one registry (d->requests), initialised on first use. Every
 * request owner registers here, so `kvctl abort ID` finds any request and
 * ids are unique across the node. */
struct kvd_reqtab *kvd_daemon_requests(struct kvd_daemon *d);

/* The admission gate every request passes before any page is allocated:
 * 0 when the node admits new work, KVD_E_DRAINING when it is draining,
 * drained, starting or stopping. A question only: it changes nothing.
 * The caller that turns the request away counts it under
 * KVD_REJECT_DRAINING where it sends the refusal; an admitted request is
 * counted by kvd_request_register. */
int kvd_request_gate(const struct kvd_reqtab *t);

/* A new id, never given before, for a request that waits before its
 * admission (daemon/node/gate.c): set it in r->id and registration keeps it,
 * so the request has one id from arrival to end. */
uint64_t kvd_reqtab_new_id(struct kvd_reqtab *t);

/* Register an admitted request: assigns r->id (unless it holds one from
 * kvd_reqtab_new_id), counts it admitted, bumps in_flight. Cannot fail (the gate has been passed): the registry links
 * r's own nodes and allocates nothing that registration depends on. */
void kvd_request_register(struct kvd_reqtab *t, struct kvd_request *r,
			  const struct kvd_request_ops *ops);

/* The request is terminal: unlink it, count it completed or failed, drop
 * in_flight (may complete a drain, and a SIGTERM drain may then stop the
 * daemon: callers must not rely on anything the stop hooks close). */
void kvd_request_end(struct kvd_reqtab *t, struct kvd_request *r, bool ok);

/* The registered request `id`, or NULL. O(1); never allocates. */
struct kvd_request *kvd_reqtab_find(struct kvd_reqtab *t, uint64_t id);

/* The registered request whose public_id is `pid`, or NULL. A walk of
 * the registry (admin calls only); never allocates. */
struct kvd_request *kvd_reqtab_find_public(struct kvd_reqtab *t,
					   const char *pid);

/* Abort request `id` through its owner: 0, KVD_E_NOTFOUND, KVD_E_BUSY
 * (already aborting) or the owner's code. */
int kvd_reqtab_abort(struct kvd_reqtab *t, uint64_t id, const char *reason);

/* Abort every request not already aborting, through its owner (the
 * drain deadline). Returns how many aborts were started. */
uint32_t kvd_reqtab_abort_all(struct kvd_reqtab *t, const char *reason);
