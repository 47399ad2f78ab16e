/* ops.h - what an operator can do to a running node.
 *
 * The admin commands (ctl/admin.c) call these; nothing here knows about
 * sockets or frames. A struct kvd_ops is embedded by its owner (the admin
 * server) and holds:
 *
 *  - a pointer to the node's request registry (d->requests, see
 *    daemon/node/request.h), shared with every other request owner;
 *  - the drain state machine on d->state: READY -> DRAINING -> DRAINED
 *    (when in_flight reaches 0, see kvd_daemon_in_flight_changed) and back
 *    to READY on resume;
 *  - at most one pool resize at a time;
 *  - with fault points compiled in (KVD_FAULT_POINTS), synthetic requests
 *    that reserve pages, hold them (fenced part of the time) and release
 *    them, so drain and resize can be tested under load before real
 *    serving exists.
 *
 * Errors: positive KVD_E_* (daemon.h) or KVD_OPS_E_* for conditions the
 * operator must see; negative errno for system failures.
 *
 * Thread: loop thread only.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "conf/list.h"
#include "daemon/node/daemon.h"
#include "daemon/node/request.h"

enum {
	KVD_OPS_E_STATE = 32,   /* the node is in the wrong state for this */
	KVD_OPS_E_RANGE,        /* argument out of range (size 0, too big) */
	KVD_OPS_E_TIMEOUT,      /* waited and gave up; the work goes on */
	KVD_OPS_E_FULL,         /* pool cannot hold it */
	KVD_OPS_E_UNSUPPORTED,  /* built without fault points */
};

/* Name of a KVD_E_* / KVD_OPS_E_* code for the wire ("draining", ...). */
const char *kvd_ops_strerror(int code);

struct kvd_status {
	enum kvd_role role;
	enum kvd_state state;
	uint64_t uptime_ms;
	struct kvpool_stats pool;
	uint32_t cached_held;         /* cached pages a running request maps
				       * (the rest are the cache's, evictable) */
	struct kvd_capacity cap;      /* the last capacity check */
	uint32_t in_flight;
	uint32_t requests;            /* registered requests */
	uint32_t waiting;             /* waiting at the tenant gate (not
				       * registered, not in_flight) */
	uint32_t peers;               /* peers with a completed handshake */
	struct kvd_counters counters;
	bool resizing;
	uint32_t synthetic;           /* synthetic requests alive */
};

struct kvd_resize_result {
	int code;                     /* 0 or KVD_OPS_E_TIMEOUT */
	uint32_t pages_before;        /* live pages not retiring, before */
	uint32_t pages_after;         /* same, after */
	uint32_t retired_now;         /* free pages retired at once */
	uint32_t retiring_left;       /* still in use at completion */
	uint64_t waited_ms;
	struct kvd_capacity cap;      /* the check logged for this resize */
};

typedef void (*kvd_resize_cb)(void *arg, const struct kvd_resize_result *res);

struct kvd_synth;

struct kvd_ops {
	struct kvd_daemon *d;
	struct kvd_reqtab *requests;  /* kvd_daemon_requests(d) */

	/* the resize in progress */
	uv_timer_t resize_timer;
	bool resizing;
	struct kvd_resize_result resize;
	uint64_t resize_start_ns;
	uint64_t resize_deadline_ns;
	kvd_resize_cb resize_cb;
	void *resize_arg;

	struct kvd_list synth;        /* synthetic requests alive (struct
				       * kvd_synth.link), newest first */
	uint32_t n_synth;
	bool open;
	void (*close_done)(struct kvd_ops *o);
};

/* Embed and init; 0 or negative errno. The daemon's loop must exist. */
int kvd_ops_init(struct kvd_ops *o, struct kvd_daemon *d);
/* Close handles: pending resize callbacks never fire, synthetic requests
 * are ended and their pages released. `done` runs once every handle is
 * closed (the owner frees its memory there). */
void kvd_ops_close(struct kvd_ops *o, void (*done)(struct kvd_ops *o));

void kvd_ops_status(struct kvd_ops *o, struct kvd_status *st);

/* READY -> DRAINING (-> DRAINED at once when idle). Idempotent while
 * draining or drained; KVD_OPS_E_STATE when starting or stopping. */
int kvd_ops_drain(struct kvd_ops *o);
/* DRAINING/DRAINED -> READY. KVD_OPS_E_STATE when the node is stopping
 * (SIGTERM drain) or starting. Idempotent when ready. */
int kvd_ops_resume(struct kvd_ops *o);

/* Resize to `pages` live pages. Growing happens at once; shrinking retires
 * free pages at once and marks pages in use, then waits up to timeout_ms
 * for them. Refused with KVD_E_CAPACITY when the result cannot hold the
 * required tokens (context x margin) unless `force`; KVD_E_BUSY while
 * another resize runs; KVD_OPS_E_RANGE for 0 pages or a pool error. On 0,
 * cb fires exactly once from the loop (never from within this call) after
 * the capacity check was re-run and logged (reason=resize). */
int kvd_ops_resize(struct kvd_ops *o, uint64_t pages, bool force,
		   uint32_t timeout_ms, kvd_resize_cb cb, void *arg);
/* Forget the callback of the resize in progress (its requester left). */
void kvd_ops_resize_detach(struct kvd_ops *o, void *arg);
/* Pages for a target in tokens (rounded up) or bytes (rounded down). */
uint64_t kvd_ops_pages_for_tokens(struct kvd_ops *o, uint64_t tokens);
uint64_t kvd_ops_pages_for_bytes(struct kvd_ops *o, uint64_t bytes);

/* The boot capacity check again (reason=admin). */
void kvd_ops_capacity(struct kvd_ops *o, struct kvd_capacity *cap);

/* Abort request id (normal failure path), admitted or waiting at the
 * tenant gate (then it leaves its queue, answered as aborted). 0,
 * KVD_E_NOTFOUND, KVD_E_BUSY. */
int kvd_ops_abort(struct kvd_ops *o, uint64_t id);
/* The same for the id the request's client was given ("cmpl-...",
 * struct kvd_request.public_id); *id is the registry's id (0 when none
 * has it: KVD_E_NOTFOUND). */
int kvd_ops_abort_public(struct kvd_ops *o, const char *pid, uint64_t *id);

/* The requests waiting at the tenant gate (struct kvd_waiting), up to
 * max; returns how many wait (0 before serving starts). */
uint32_t kvd_ops_waiting(struct kvd_ops *o, struct kvd_waiting *out,
			 uint32_t max);

/* The prefix cache (gpu/kv/pcache.h): drop every entry of tenant (NULL or
 * "": all); held ones go when their requests end. *evicted: pages freed
 * now. KVD_OPS_E_STATE when cache.enabled is off. Logs event=cache_flush. */
int kvd_ops_cache_flush(struct kvd_ops *o, const char *tenant,
			uint32_t *evicted);

/* ---- fault points: synthetic load --------------------------------------- */

struct kvd_synth_spec {
	uint32_t count;        /* requests to try to admit */
	uint32_t tokens;       /* positions each reserves (>= 1) */
	uint32_t hold_ms;      /* release this long after admission */
	uint32_t fence_ms;     /* hold a fence this long after admission */
};

struct kvd_synth_result {
	uint32_t admitted;
	uint32_t rejected_draining;
	uint32_t rejected_full;
	uint64_t first_id, last_id;   /* ids of the admitted (contiguous) */
};

/* Admit up to spec->count synthetic requests through the normal gate.
 * KVD_OPS_E_UNSUPPORTED without fault points; KVD_OPS_E_RANGE for bad
 * figures. */
int kvd_ops_synth_start(struct kvd_ops *o, const struct kvd_synth_spec *spec,
			struct kvd_synth_result *res);
