/* serve_int.h - shared internals of the node's serving core.
 *
 * Not a contract for other modules: daemon/serve.h is. This header holds
 * struct serve (the node's serving state) and the roles' entry points,
 * and brings in each object's private header: req.h (a request: its core
 * and its per-kind part), link.h (a peer link), sink.h (where an answer
 * goes). The files of daemon/node/ that serve requests share them; the
 * client fronts (daemon/front/front_int.h) build on it, never the other
 * way (tests/layers/includes.py). The files form layers, and a file calls
 * only the files below it (tests/layers/check.py checks this on the
 * objects); what a lower file needs from a role comes through function
 * pointers the role sets (struct serve_req_ops, serve->admit, struct
 * link_ops):
 *   ../serve.c  top: setup, teardown, timers, the compute bridge
 *   gate.c      admission between tenants: per-tenant queues, fair
 *               slots (fairq.h), then the role's admission
 *   decode.c    decode and standalone requests (the dreq machine),
 *               admission, receiving KV; dials its peers through link.c
 *   prefill.c   prefill requests (the preq machine), admission, sending
 *               KV; accepts its peers through link.c
 *   peerdns.c   decode: peers.prefill names resolved on the loop, each
 *               address a dialled link, one that left the answer drained
 *   link.c      one peer link for both ends (struct link): connect or
 *               accept, authenticate, hello, data connection (the one
 *               place a transport is created), heartbeat, liveness,
 *               bounds, close; the requests on each link
 *   sink.c      where a request's answer goes (struct serve_sink): the
 *               one seam between the machines and a client of either
 *               front; answer-once streaming, detokenizing, logs
 *   req.c       request life: registry, phase timer, state setter, end
 *   io.c        writes, accept-and-drop, handle closes, host:port
 *   compute.c   the engine's thread (knows requests only by id)
 *
 * Everything here is loop-thread state, except the struct compute that
 * struct serve embeds, whose queues compute.c shares with its thread.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "conf/list.h"
#include "daemon/node/place.h"
#include "daemon/node/fairq.h"
#include "conf/apikeys.h"
#include "daemon/node/compute.h"
#include "daemon/node/daemon.h"
#include "daemon/node/machine.h"
#include "daemon/node/request.h"
#include "gpu/engine.h"
#include "gpu/model/model.h"
#include "gpu/text/tokenizer.h"
#include "net/fault.h"
#include "net/wire/frame.h"
#include "net/peer_auth.h"
#include "net/wire/proto_client.h"
#include "net/wire/proto_peer.h"
#include "net/transport.h"
#include "net/wbound.h"
#include "net/xfer_check.h"
#include "daemon/node/link.h"
#include "daemon/node/req.h"
#include "daemon/node/sink.h"

struct serve;
struct serve_req;
struct client_conn;
struct link;
struct serve_sink;
struct http_server;
struct front;

/* ---- connections -------------------------------------------------------- */

/* A stream handle that is a TCP socket or a unix pipe (client listeners
 * and connections, a refused connection): one storage, seen as either. */
union serve_stream {
	uv_tcp_t tcp;
	uv_pipe_t pipe;
	uv_handle_t handle;
	uv_stream_t stream;
};

/* ---- the serving layer ---------------------------------------------------- */

/* Log lines a remote party can trigger at will, one token bucket per
 * kind (conf/ratelimit.h, KVLOG_RL_*): a peer or a client cannot fill the
 * disk. Each kind lets SERVE_RL_BURST lines through at once and one more
 * every SERVE_RL_PERIOD_MS; the rest are counted in one
 * `event=log_suppressed kind=K suppressed=N` line (the sweep timer says
 * it once the flood ends). Lines an operator must see once per event
 * (kv_capacity, integrity failures, a link going down after it was up)
 * are not limited: their rate is bounded by the work behind them. */
enum serve_rl {
	SERVE_RL_PEER_PROTOCOL = 0,  /* unexpected or malformed peer messages */
	SERVE_RL_PEER_ACK,           /* abort_acked: an ack for a request */
	SERVE_RL_PEER_REFUSED,       /* handshake refusals (strangers) */
	SERVE_RL_PEER_DOWN,          /* accepted links that went down */
	SERVE_RL_PEER_REQUEST,       /* a peer's refused prefill_requests */
	SERVE_RL_CLIENT_REFUSED,     /* refused client requests and frames */
	SERVE_RL_CLIENT_FULL,        /* connections refused at max_clients */
	SERVE_RL_CLIENT_CONN,        /* client connections closed for a bound */
	SERVE_RL_HTTP_REFUSED,       /* HTTP refusals before a request */
	SERVE_RL_LOOP_BUSY,          /* loop iterations past HTTP_LOOP_BUSY_MS */
	SERVE_RL__N,
};

#define SERVE_RL_BURST 32u
#define SERVE_RL_PERIOD_MS 500u


struct serve {
	struct kvd_daemon *d;
	struct kvlog *log;
	struct kvd_fault fault;
	struct kvd_reqtab *reqtab;         /* the daemon's registry */
	struct model *model;
	struct tokenizer *tok;
	/* its pieces as a byte trie for response_format json (gpu/text/
	 * jsongram.h); NULL when it could not be built (then refused) */
	struct jgram_vocab *jvocab;
	struct compute comp;             /* the engine's thread */
	uint64_t page_bytes;
	struct proto_peer_hello my_hello;
	bool stopping;

	struct kvd_list reqs;            /* every live request (serve_req.node),
					  * for teardown; lookups go by id
					  * through the registry */
	uint32_t n_reqs;

	struct front *front;             /* the client fronts (daemon/front/
					  * front_int.h): decode and
					  * standalone; NULL on prefill */

	struct kvd_list links;           /* every peer link (struct link):
					  * dialled ones for life (or until
					  * drained), accepted ones until
					  * they are lost */
	struct kvd_list dns_names;       /* decode: peers.prefill names
					  * (struct peerdns_name, peerdns.c) */
	const struct link_ops *accept_ops;  /* for accepted links */
	uv_tcp_t peer_listener;
	bool peer_listener_open;
	uv_timer_t peer_reap_timer;      /* 0 ms: closes evicted handshakes
					  * on the next loop iteration */
	bool peer_reap_open;
	struct peer_key key;             /* the cluster key; key.set = keyed */
	uint64_t next_conn_id;           /* client and peer connections, for logs */
	uint64_t next_link_serial;       /* struct link.serial */
	uint64_t peer_refused_conns;     /* dropped at accept since the last log */
	uint64_t peer_evicted_conns;     /* unproven handshakes closed to make
					  * room for a new one (link.c) ... */
	uint64_t peer_proof_timeouts;    /* ... or past the proof deadline */
	/* a parsed client request goes to the role's admission: decode's
	 * (serve__decode_admit) or a standalone node's (serve__local_admit) */
	void (*admit)(struct serve_req *r);
	uint32_t peer_max_pages;         /* per decode node: peers.max_pages or
					  * the automatic value (prefill start) */
	uint32_t send_timeout_ms;        /* prefill: transfer.send_timeout_ms or
					  * release_timeout_ms (prefill start) */
	uint64_t local_prompt_tokens;    /* decode: prompt tokens this node
					  * computes itself, not yet done
					  * (peers.local_prefill) */
	struct place_speed place_here;   /* decode: how fast those finish */
	struct place_speed place_peers;  /* ... and this node's prompts on its
					  * prefill peers, all together */

	uv_timer_t hb_timer;             /* heartbeats and liveness */
	bool hb_open;
	uv_timer_t sweep_timer;          /* client timeouts, write bounds */
	bool sweep_open;
	/* admission between tenants (gate.c) */
	struct fairq fq;
	struct kvd_list computing;       /* serve_req.computing (gate.c) */
	uint32_t gate_unsettled;         /* pages admitted requests will
					  * reserve (the engine's, async) */
	uv_timer_t gate_timer;           /* pumps the queues after an end */
	bool gate_open;
	uv_timer_cb gate_cb;             /* gate.c's pump, for req.c */
	struct kvd_apikeys *keys;        /* http.api_keys_file; NULL: none */
	uint32_t closes_pending;         /* handles still closing at stop */
	struct kvd_ratelimit rl[SERVE_RL__N];  /* see enum serve_rl */
};

/* io.c */
int serve__write(uv_stream_t *st, char *data, size_t len);
/* Accept the connection a listener reports and close it at once
 * (refused, or no memory for its owner): never leave it unaccepted. */
void serve__accept_drop(struct serve *s, uv_stream_t *server);
void serve__close_handle(struct serve *s, uv_handle_t *h);
/* The close callback serve__close_handle uses (h->data: the serve). */
void serve__handle_closed(uv_handle_t *h);
int serve__parse_hostport(const char *spec, struct sockaddr_storage *ss);

/* gate.c: admission between tenants. Loop thread. */
int serve__gate_init(struct serve *s);
void serve__gate_stop(struct serve *s);
/* A parsed request (prompt, max_tokens, tenant, lim set, sink attached)
 * to the tenant's queue, admitted by the role (serve->admit) now or when
 * its turn comes; refused with OVERLOADED when the tenant's queue is
 * full, DRAINING while draining. */
void serve__gate_admit(struct serve_req *r);
/* The largest prompt + max_tokens the role could admit now: this node's
 * limit, and on decode the largest context and pool of an up prefill
 * peer (0: no peer is up). */
uint64_t serve__gate_path_limit(struct serve *s);
/* From the sweep timer: queued requests past tenants.queue_timeout_ms,
 * or a drain: refused; then a pump (pages freed by fences). */
void serve__gate_sweep(struct serve *s);
/* r's pages are reserved now (or never will be): no longer counted as
 * pages to come. Inline: the roles call it without a call edge. */
static inline void serve__gate_kick(struct serve *s)
{
	if (s->fq.queued && s->gate_open)
		uv_timer_start(&s->gate_timer, s->gate_cb, 0, 0);
}
/* r will reserve `pages` again (a failover placing it anew): the gate
 * counts them as taken until r settles (reserves, or ends). */
static inline void serve__gate_unsettle(struct serve_req *r, uint32_t pages)
{
	r->gate_unsettled += pages;
	r->s->gate_unsettled += pages;
}
static inline void serve__gate_settle(struct serve_req *r)
{
	uint32_t pages = r->gate_unsettled;

	r->s->gate_unsettled -= pages;
	r->gate_unsettled = 0;
	if (pages)
		serve__gate_kick(r->s);   /* it may have reserved fewer (a hit) */
}
/* r's prompt is computed (its first token, or its end): its full pages
 * are cached now, so a request the prefix hold-back keeps (gate.c) may
 * go; pumped from the gate timer. Inline, as above. */
static inline void serve__gate_first_token(struct serve_req *r)
{
	if (!r->on_computing)
		return;
	r->on_computing = false;
	kvd_list_del(&r->computing);
	serve__gate_kick(r->s);
}

/* decode.c */
int serve__decode_start(struct serve *s);
void serve__decode_admit(struct serve_req *r);
/* The prefill peer r's prompt goes to (not `avoid`), NULL when none
 * takes requests: a later choice of an n > 1 request where a choice of
 * its exchange runs, else the least loaded. Loop thread. */
struct link *serve__decode_pick_peer(struct serve *s, const struct serve_req *r,
				     const struct link *avoid);
void serve__local_admit(struct serve_req *r);
/* The dreq machine (standalone and decode client requests): take event
 * `ev` and run its actions; entering DONE ends r. */
void serve__dreq_event(struct serve_req *r, enum dreq_event ev);
/* engine messages for LOCAL and DECODE requests */
void serve__dreq_engine_msg(struct serve_req *r, const struct compute_msg *m);
/* kvctl abort of a client request (any state): OP_ABORT. */
void serve__decode_abort(struct serve_req *r, const char *reason);

/* peerdns.c: peers.prefill names (decode). Loop thread. */
/* entry is name:port (kvd_peer_name_split), not an address. */
bool serve__peerdns_is_name(const char *entry);
/* Resolve entry now and every peers.resolve_interval_ms; each address
 * it returns gets a dialled link with ops. 0, -ENOMEM, or a libuv error
 * starting its timer. */
int serve__peerdns_add(struct serve *s, const char *entry, const struct link_ops *ops);
/* link_ops.redial: l's name (if any) is resolved again. */
void serve__peerdns_redial(struct link *l);
/* Stop resolving: timers closed, a resolution in flight cancelled; each
 * name is freed once both are done (s->closes_pending). */
void serve__peerdns_stop(struct serve *s);

/* prefill.c */
int serve__prefill_start(struct serve *s);
void serve__prefill_engine_msg(struct serve_req *r, const struct compute_msg *m);
/* The preq machine: take event `ev` and run its actions; entering DONE
 * ends r. */
void serve__preq_event(struct serve_req *r, enum preq_event ev);
/* Fail a prefill request (kvctl abort): abort to decode, pages back once
 * nothing of it is queued. */
void serve__prefill_abort(struct serve_req *r, const char *reason);
