/* front_int.h - shared internals of the client fronts (daemon/front/):
 * the msgpack client listeners and connections (client.c), the HTTP
 * front (http.c, http_api.c) and the request preparation both share
 * (prep.c).
 *
 * The fronts sit on the node (daemon/node/serve_int.h): they parse a
 * client's request, make it a struct serve_req and hand it to the gate;
 * answers come back through the struct serve_sink each front embeds. The
 * node never reaches in here: struct serve holds the fronts' state only
 * as the opaque pointer s->front, which serve.c (above both) sets up.
 * Loop thread only, except what prep.h says runs on its workers.
 */
#pragma once

#include "daemon/node/serve_int.h"
#include "daemon/front/prep.h"

#include <errno.h>
#include <string.h>

/* A client connection (msgpack or HTTP) that holds one of max_clients
 * but has not shown a key yet (keyless: a request): on serve->pending,
 * oldest first, and closed by `evict` when a new connection needs its
 * place. */
struct serve_pending {
	struct kvd_list node;            /* serve->pending */
	void (*evict)(struct serve_pending *p);
	bool on;
};

struct client_conn {
	struct serve *s;
	union serve_stream h;
	struct frame_decoder dec;
	struct kvd_list node;            /* on serve->clients */
	struct serve_sink sink;          /* its requests (sink.reqs, n_reqs) */
	bool closing;
	/* bounds (invariant 11), judged by serve__client_sweep */
	struct wbound wb;                /* every frame to the client */
	uint64_t conn_id;                /* for log lines */
	uint64_t t_rx_ns;                /* last byte received (or accept) */
	uint64_t t_frame_ns;             /* a frame began and is not complete
					  * (accept: the first frame); 0 none */
	const char *doom;                /* close at the next sweep: reason */
	bool counted;                    /* holds one of max_clients */
	struct serve_pending pend;       /* not authenticated (keys) or no
					  * frame yet (keyless): the first to
					  * go at max_clients */
	bool refusing;                   /* refused (max_clients): its
					  * frame_error and FIN are out, what
					  * it still sends is read and dropped
					  * for CLIENT_REFUSE_DRAIN_MS */
	bool authed;                     /* keys off, or its auth frame held
					  * a good key */
	char tenant[KVD_TENANT_MAX];     /* its key's; "default" keyless */
	struct kvd_tenant_limits lim;    /* its key's limits */
	struct kvd_list preps;           /* client_prep.node: text prompts
					  * being tokenized (prep pool) */
	bool eof;                        /* client half-closed: answer, close */
	bool shutting;                   /* uv_shutdown queued: close after */
	uv_shutdown_t shut;
	char rbuf[65536];                /* (65536) bytes: socket reads */
};

struct client_listener {
	struct serve *s;
	union serve_stream h;
	bool is_pipe;
	char path[256];                  /* unix: socket path to unlink */
};

/* The fronts' state, one per node that serves clients (s->front). */
struct front {
	struct client_listener listeners[4];
	unsigned n_listeners;
	struct kvd_list clients;         /* client connections (client_conn.node) */
	struct kvd_list pending;         /* serve_pending.node: connections of
					  * either front without a key yet,
					  * oldest first */
	struct http_server *http;        /* listen.http (http.c); NULL off */
	struct prep prep;                /* both fronts' request preparation
					  * off the loop (HTTP bodies, msgpack
					  * text prompts) */
	uint32_t n_clients;              /* connections held (max_clients) */
	uint32_t n_client_refusing;      /* msgpack refusals still draining */
	uint32_t max_clients;            /* cfg, clamped to the fd limit */
};

/* Why a write to a client failed: a reset or a closed pipe is the client
 * gone (its own doing: client_closed at info, reason=client_gone), any
 * other error write_failed (a warning). uv's codes are -errno here. */
#define SERVE_CLIENT_GONE "client_gone"
static inline const char *serve__write_failed(int status)
{
	return status == -EPIPE || status == -ECONNRESET ? SERVE_CLIENT_GONE
							 : "write_failed";
}

/* client_closed's level for a close reason: info for the client's own
 * leaving, a warning for a bound or a failure. */
static inline int serve__closed_level(const char *reason)
{
	return strcmp(reason, SERVE_CLIENT_GONE) ? KVLOG_WARN : KVLOG_INFO;
}

/* pending.c */
/* Put p on s->pending / take it off (nothing when it is not on). */
void serve__pending_add(struct serve *s, struct serve_pending *p,
			void (*evict)(struct serve_pending *p));
void serve__pending_del(struct serve_pending *p);
/* Close the oldest pending connection (its evict): false when none. */
bool serve__pending_evict(struct serve *s);

/* client.c */
/* listen.max_clients, clamped to the file descriptors left (both fronts'
 * bound; serve__client_listen sets it, a prefill node's probe listener
 * too). */
void serve__client_limits(struct serve *s);
int serve__client_listen(struct serve *s);
void serve__client_close_all(struct serve *s);
/* Periodic (SERVE_SWEEP_MS, daemon/node/serve_int.h): close client connections past a timeout or
 * a write bound. Loop thread, from the sweep timer only. */
#define SERVE_SWEEP_MS 250
/* A refused msgpack connection (listen.max_clients) is drained, not
 * reset: at most this many at once, each for at most this long. */
#define CLIENT_REFUSING_MAX 32u
#define CLIENT_REFUSE_DRAIN_MS 2000u
void serve__client_sweep(struct serve *s);

/* http.c / http_api.c: the OpenAI-compatible HTTP front (listen.http) */
int serve__http_listen(struct serve *s);
void serve__http_close_all(struct serve *s);
/* From the sweep timer: timeouts and write bounds of HTTP connections. */
void serve__http_sweep(struct serve *s);
/* http_cors.c: the HTTP front's origin allow-list (http.cors_origins),
 * NULL without an HTTP front. Loop thread: SIGHUP's reload (serve.c)
 * parses a new list into it; each request's head is judged by the list
 * of the moment (a request already judged keeps its answer). */
struct kvd_origins *serve__http_cors(struct serve *s);

