/* serve_int.h - shared internals of the node's serving core.
 *
 * Not a contract for other modules: daemon/serve.h is. This header lets
 * the files of daemon/node/ that serve requests share their structs; the
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

struct serve;
struct serve_req;
struct client_conn;
struct link;
struct serve_sink;
struct http_server;
struct front;

/* ---- sinks (sink.c) ------------------------------------------------------ */

/* What a finished request tells its client. */
struct serve_final_info {
	const char *reason;              /* "stop" | "length" */
	uint32_t prompt_tokens, output_tokens;
	uint32_t cached_tokens;          /* of prompt_tokens, from the cache */
	uint64_t ttft_us, total_us;
	const char *text;                /* the detokenizer's tail, (text_len) */
	size_t text_len;
};

/* A sink is where a request's answer goes: a msgpack client connection
 * (client.c) or an HTTP exchange (http.c). The machines answer through
 * serve__sink_* only and never learn which it is. The ops run on the loop
 * thread inside a request's state change: they queue bytes and must not
 * close a connection or call back into a request (defer that). */
struct serve_sink_ops {
	void (*token)(struct serve_sink *k, struct serve_req *r, uint32_t index,
		      int32_t token, const char *piece, size_t len);
	void (*final)(struct serve_sink *k, struct serve_req *r,
		      const struct serve_final_info *f);
	void (*error)(struct serve_sink *k, struct serve_req *r, int code,
		      const char *msg);
	/* r left k (after its answer, or gone); NULL: nothing to do */
	void (*detached)(struct serve_sink *k, struct serve_req *r);
};

struct serve_sink {
	const struct serve_sink_ops *ops;
	struct kvd_list reqs;            /* serve_req.sink_node, attached */
	uint32_t n_reqs;
};

/* ---- requests ----------------------------------------------------------- */

enum serve_req_kind { SREQ_LOCAL = 1, SREQ_DECODE, SREQ_PREFILL };

/* What differs by kind, set by the role that admits the request, so the
 * files below the roles (req.c, client.c, serve.c's compute bridge) reach
 * it without calling up into them. */
struct serve_req_ops {
	struct kvd_request_ops reg;      /* registry name, kvctl abort */
	void (*engine_msg)(struct serve_req *r, const struct compute_msg *m);
	void (*client_gone)(struct serve_req *r);   /* NULL: no client */
};

struct serve_req {
	struct kvd_request reg;          /* registry link; reg.id is the owner */
	const struct serve_req_ops *rops;
	struct serve *s;
	enum serve_req_kind kind;
	uint8_t state;                   /* enum dreq_state or preq_state
					  * (daemon/node/machine.h); changed only
					  * by serve__req_step */
	struct kvd_list node;            /* on s->reqs (every live request) */
	bool registered;
	bool ended;

	/* what the client asked */
	struct serve_sink *sink;         /* where answers go; NULL once the
					  * client left (orphaned) */
	struct kvd_list sink_node;       /* on sink->reqs while attached */
	uint64_t client_id;              /* the client's id for it (msgpack
					  * id; HTTP: the exchange number) */
	int32_t *prompt;                 /* (n_prompt) */
	uint32_t n_prompt;
	uint32_t max_tokens;
	struct sampler_params sp;
	uint64_t t_arrive_ns, t_first_ns;
	uint64_t t_last_ns;              /* the latest token (inter-token latency) */
	uint64_t t_xfer_ns;              /* decode: prefill_request sent;
					  * prefill: first batch queued */
	char tenant[KVD_TENANT_MAX];     /* whose request: the API key's
					  * tenant (both fronts), "default"
					  * without keys; in its log lines
					  * and metric labels */
	char public_id[KVD_PUBLIC_ID_MAX];  /* the id its client sees
					  * (HTTP: "cmpl-" or "chatcmpl-" and
					  * 32 random hex digits); "" none */
	struct kvd_tenant_limits lim;    /* its key's limits (0: the config's) */
	struct fairq_item fq;            /* waiting for admission, or admitted
					  * (gate.c); released at its end */
	struct kvd_list computing;       /* serve.computing: admitted by the
					  * gate, prompt not yet computed (no
					  * first token): may hold same-prefix
					  * requests of its tenant (gate.c) */
	bool on_computing;
	uint32_t gate_unsettled;         /* pages admitted, not yet reserved
					  * by the engine (counted in
					  * serve.gate_unsettled) */
	char cache_salt[PROTO_CLIENT_SALT_MAX + 1]; /* "" = none (gpu/kv/pcache.h) */
	uint32_t cached_tokens;          /* prompt tokens the prefix cache gave */
	uint32_t n_out;
	struct detok dt;
	bool dt_init;
	bool answered;                   /* final or error sent (or client gone) */
	bool final_ok;                   /* the final event was the answer */
	char finish_reason[8];           /* "stop" | "length", for the final */
	int32_t last_token;              /* the engine's token being streamed */

	/* engine */
	struct compute_job *free_job;      /* COMPUTE_JOB_FREE allocated at creation
					  * (with its reply), so ending never
					  * needs memory; NULL once queued */
	struct engine_req *ereq;         /* SUBMITTED .. FREE_ENGINE */
	bool engine_integrity;           /* the engine found a bad tag: its
					  * pages are quarantined at the free */
	bool local_prompt;               /* decode node computing the prompt
					  * itself (daemon/node/place.h): counted
					  * in s->local_prompt_tokens until its
					  * first token or its end */

	/* the peer link it runs on (decode: the prefill peer it asked;
	 * prefill: the decode node that asked), NULL once detached */
	struct link *link;
	struct kvd_list link_node;       /* link->reqs */
	uint32_t link_pages;             /* counted in link->n_pages */
	char peer_node[64];              /* prefill: the decode node it
					  * serves (link.node_addr), kept
					  * after its link is gone: it counts
					  * against that node's caps until it
					  * ends */

	/* decode: the transfer */
	struct kvpool_ref *table;        /* (n_table) reserved pages */
	uint32_t n_table;
	uint32_t n_prefix;               /* pages the transfer fills */
	bool fenced;
	bool fence_failed;               /* the breach that quarantines */
	bool pages_held;
	uint64_t t_abort_ns;             /* abort sent; pages fenced since */
	struct xfer_check_marks rx;      /* pages and batches accepted;
					  * rx.got (n_prefix) */
	bool done_seen;
	bool kv_ready;                   /* decode: the received prefix passed
					  * coverage and its tags (mark_ready):
					  * its full pages may be cached */
	bool sealing;                    /* verbs: covered, the scope's
					  * revocation in flight; the final
					  * check waits for it */
	uint32_t first_token;
	uint32_t done_tokens, done_batches, done_pages;
	uint32_t peer_batches;           /* the most batches prefill said it
					  * posted (abort, abort_ack): what a
					  * verbs fence must wait for; TCP
					  * only logs it */
	uint32_t batches_landed;         /* verbs: batches of it completed
					  * here (every write landed) */
	bool ack_deferred;               /* verbs: abort_ack came before
					  * batches_landed reached
					  * peer_batches: ABORT_ACK waits */

	/* prefill: the peer's request */
	uint64_t remote_id;              /* decode's request id */
	struct proto_peer_page *dst;     /* (n_dst) destination pages */
	uint32_t n_dst;
	struct kvpool_ref *src;          /* (n_dst) our computed pages */
	uint32_t n_kv;
	uint32_t sends_pending;          /* batches queued, not reported */
	uint32_t next_page;              /* next page index to send */
	uint32_t batches_sent;
	bool ack_owed;                   /* decode aborted: abort_ack once
					  * no batch is queued (PA_ACK_OWED) */
	bool released_by_peer;           /* release_ack seen: ends ok */
	uint64_t t_progress_ns;          /* its first batch queued, then its
					  * latest batch reported: the send
					  * deadline counts from here
					  * (transfer.send_timeout_ms) */
	bool short_fault;                /* fault point short_transfer */
	bool slow_waited;                /* fault point slow_batch */

	uv_timer_t timer;                /* phase timeout / slow_batch */
	int fail_code;                   /* enum proto_err, 0 while healthy */
	char fail_msg[PROTO_CLIENT_MSG_MAX + 1];
};

/* ---- connections -------------------------------------------------------- */

/* A stream handle that is a TCP socket or a unix pipe (client listeners
 * and connections, a refused connection): one storage, seen as either. */
union serve_stream {
	uv_tcp_t tcp;
	uv_pipe_t pipe;
	uv_handle_t handle;
	uv_stream_t stream;
};

/* ---- peer links (link.c) ------------------------------------------------- */

/* Which end of a peer link this node holds. Both ends are one object;
 * only the handshake steps differ by side. */
enum link_side {
	LINK_DIAL = 1,   /* decode: connects to a peers.prefill address, proves
			  * first, opens the data connection, receives KV;
			  * reconnects for the node's life */
	LINK_ACCEPT,     /* prefill: one per accepted control connection;
			  * answers the proofs, binds the data connection by
			  * token, sends KV; freed once closed */
};

/* What a handshake phase waits for. */
enum link_phase {
	LINK_FIRST = 0,  /* accept: the first frame decides what the
			  * connection is (auth_hello, hello, data) */
	LINK_CHALLENGE,  /* dial: auth_challenge */
	LINK_PROOF,      /* the other end's auth_proof */
	LINK_HELLO,      /* the other end's hello */
};

/* What a role registers for its links: link.c reaches a role only
 * through these (it must not call decode.c or prefill.c). */
struct link_ops {
	/* A control message after the handshake; heartbeat and data_bound
	 * are the link's own. m may be taken from (its arrays). */
	void (*on_msg)(struct link *l, struct proto_peer_msg *m);
	/* A control message after the handshake that failed to parse with
	 * its type and id read (m->type, m->id; its arrays freed): true when
	 * the role answered it as that request's error and the link stays
	 * up; false (or NULL op): a protocol error, the link is torn down. */
	bool (*bad_request)(struct link *l, const struct proto_peer_msg *m,
			    const struct frame_error *err);
	/* The link is torn down: r, one of its requests, takes LINK_LOST
	 * (it must detach). code and msg (NULL: the role's own words) are
	 * its failure if it was mid-transfer; true when it failed one. */
	bool (*req_lost)(struct serve_req *r, int code, const char *msg);
	/* accept: the data connection drained below its soft bound; r may
	 * send again (NULL: nothing waits) */
	void (*req_resume)(struct serve_req *r);
	/* accept, from the heartbeat tick of a link that is up: the role's
	 * deadlines on l's requests (it may tear l down; NULL: none) */
	void (*tick)(struct link *l, uint64_t now_ns);
	/* dial: a batch that passed the transport's checks */
	void (*rx_batch)(struct link *l, const struct xfer_hdr *h,
			 const uint8_t *batch);
	/* dial, verbs with memory windows: request id's write scope is live
	 * (status 0: runs go to the peer in verbs_scope now) or its bind
	 * failed (status < 0; the link is lost right after) */
	void (*scope_live)(struct link *l, uint64_t id, const struct proto_peer_run *runs,
			   uint32_t n_runs, int status);
	/* dial, verbs with memory windows: request id's write scope is
	 * dead (its invalidations completed) after a revoke that said so */
	void (*scope_dead)(struct link *l, uint64_t id);
	/* dial, verbs: the link's flush completions never came within
	 * transfer.verbs_flush_timeout_ms: r, one of its requests, must
	 * quarantine the pages a peer could still write (before its
	 * LINK_LOST step, which then unfences nothing back to the pool) */
	void (*req_flush_lost)(struct serve_req *r);
};

/* One peer link: a control connection (framed, sealed once proved,
 * bounded write queue), its data connection (a transport), liveness, and
 * the requests that run on it. */
struct link {
	struct serve *s;
	const struct link_ops *ops;
	enum link_side side;
	struct kvd_list node;            /* s->links */
	char addr[256];                  /* dial: the configured address;
					  * accept: the remote "ip:port" */
	char node_addr[64];              /* accept: the remote ip, which is
					  * what a decode node is to the
					  * per-node caps (link_node_usage) */
	uint8_t src[8];                  /* accept: its source to the
					  * handshake budgets: the IPv4
					  * address, or an IPv6 one's /64 */
	uint8_t src_len;                 /* 4, 8, or 0 (unreadable) */
	uint64_t conn_id;                /* accept: local, never on the wire */
	uv_tcp_t ctl;                    /* the control connection */
	bool ctl_open;
	bool closing;                    /* its handles are closing */
	bool retired;                    /* freed when they have closed
					  * (accept: always; dial: at stop) */
	uint32_t pending_closes;
	struct frame_decoder dec;
	/* control writes are bounded (net/wbound.h): a peer that stops
	 * reading cannot grow this node; past hard the link is torn down
	 * at the next heartbeat tick (senders are mid-change of a request
	 * and must not see it vanish) */
	struct wbound wb;
	bool wb_dead;
	/* a frame the protocol needed could not be queued (no memory, a
	 * write error): the link can no longer keep its side of the
	 * protocol, so the tick tears it down for this reason */
	const char *doom;

	/* handshake. Keyed links prove the cluster key before anything
	 * else (net/peer_auth.h); every later control frame and batch is
	 * sealed with the session's keys */
	enum link_phase phase;
	uint8_t nonce_d[PEER_AUTH_BYTES], nonce_p[PEER_AUTH_BYTES];
	char auth_name[PEER_AUTH_NAME_BYTES];  /* keyed: the peer's node
					  * name, as its proof bound it */
	struct peer_session ss;          /* valid while `sealed`; the keys
					  * outlive it until the transport
					  * (which holds ss.data) closed */
	bool sealed;
	uint8_t token[PEER_AUTH_BYTES];  /* accept: binds the data connection */
	bool has_token;                  /* accept: not used yet */
	bool hello_done;                 /* hellos exchanged and matched */
	bool up;                         /* dial: data connection bound
					  * (data_bound); accept: hello_done */
	bool is_data;                    /* accept: a data connection before
					  * its hand-over to the control link */
	bool evicted;                    /* accept: an unproven handshake that
					  * made room for a newer one: reads
					  * stopped, closed at the next tick */
	struct proto_peer_hello hello;   /* the peer's */
	uint64_t max_batch_bytes;        /* negotiated */
	bool checksum;                   /* negotiated */
	uint64_t t_start_ns;             /* connect/accept: the handshake
					  * deadline counts from here */
	uint64_t last_heard_ns;
	uint32_t load;                   /* the peer's, from its heartbeat */
	/* an INTEGRITY loss of the link: what caught it (checksum or MAC),
	 * for the metrics of the requests it fails */
	enum kvd_integrity_kind lost_kind;

	/* the data connection: dial receives, accept sends */
	struct transport *data;
	uv_connect_t conn_req, data_req; /* dial */
	/* accept: the data backlog. Batches wait while it holds more than
	 * the soft bound; stuck past it this long, the link is lost */
	uint64_t data_over_since_ns;
	bool data_waiters;               /* a request waits for it to drain */
	/* dial, verbs: lost, and its requests take LINK_LOST once the
	 * transport's flush completions are drained (code, msg for them) */
	bool walk_deferred;
	bool walk_count_integrity;       /* count it if no request does */
	int walk_code;
	char walk_msg[PROTO_CLIENT_MSG_MAX + 1];

	/* the requests on this link (serve_req.link_node) */
	struct kvd_list reqs;
	uint32_t n_reqs;                 /* dial: ours in flight; accept: the
					  * peer's (peers.max_requests) */
	uint32_t n_pages;                /* accept: pages its requests hold
					  * (peers.max_pages) */

	uv_timer_t retry;                /* dial: reconnect */
	bool retry_open;
	char rbuf[65536];                /* (65536) bytes: control reads */
};

/* accept: what one decode node - every proven link from the same source
 * address - holds of this node (peers.max_requests, max_pages,
 * max_links). */
struct link_node_usage {
	uint32_t links, reqs, pages;
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
					  * dialled ones for life, accepted
					  * ones until they are lost */
	const struct link_ops *accept_ops;  /* for accepted links */
	uv_tcp_t peer_listener;
	bool peer_listener_open;
	uv_timer_t peer_reap_timer;      /* 0 ms: closes evicted handshakes
					  * on the next loop iteration */
	bool peer_reap_open;
	struct peer_key key;             /* the cluster key; key.set = keyed */
	uint64_t next_conn_id;           /* client and peer connections, for logs */
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

/* link.c: one peer link for both ends. Loop thread only. */
/* Dial peers.prefill address `addr` and keep it connected for the
 * node's life (reconnecting after a loss). 0, -ENOMEM. */
int serve__link_dial(struct serve *s, const char *addr,
		     const struct link_ops *ops);
/* Listen on listen.peer; accepted links get `ops`. 0 or an error
 * (logged). */
int serve__link_listen(struct serve *s, const struct link_ops *ops);
/* Stop: close the listener, tear every link down, stop reconnecting. */
void serve__link_stop(struct serve *s);
/* Heartbeat tick: write and data bounds, handshake deadline, three
 * missed heartbeats, then our heartbeat on every link that is up. */
void serve__link_tick(struct serve *s);
/* A control frame on l (sealed once proved) through its bounded write
 * queue; never tears l down (the tick does). 0 or a negative errno. */
int serve__link_send(struct link *l, const struct proto_peer_msg *m);
/* The same for a frame the protocol needs (an abort, an ack, a reply):
 * one that cannot be queued dooms l (torn down at the next tick, which
 * ends or fails every request on it), so no failure goes unhandled. A
 * link already going (closing, past its hard bound) or none: nothing. */
void serve__link_post(struct link *l, const struct proto_peer_msg *m);
/* Tear l down (why NULL: silently): both connections close and every
 * request on it takes req_lost (code INTERNAL, the role's words). */
void serve__link_lost(struct link *l, const char *why);
/* Put r on l (counted: one request, `pages` pages) / take it off. */
void serve__link_attach(struct link *l, struct serve_req *r, uint32_t pages);
void serve__link_detach(struct serve_req *r);
/* accept: l's data connection holds more than its soft bound. When
 * true, l resumes its requests (req_resume) once it drained. */
bool serve__link_data_full(struct link *l);
/* accept: a batch was reported: resume waiting requests if it drained. */
void serve__link_data_resume(struct link *l);
/* accept: what l's decode node holds over all its proven links (l
 * included once proven). */
void serve__link_node_usage(const struct link *l, struct link_node_usage *u);
/* The accepted link with local id conn_id, NULL when it is gone. */
struct link *serve__link_by_conn(struct serve *s, uint64_t conn_id);
/* Before a peer has proved the key (keyless: before its hello), a node
 * reads only frames of handshake size: a stranger cannot make it buffer
 * megabytes (64 pending handshakes x 4 MiB). */
#define SERVE_PEER_HANDSHAKE_FRAME_MAX 4096u
/* The largest frame a peer control decoder accepts (a sealed frame). */
#define SERVE_PEER_FRAME_MAX (PROTO_PEER_FRAME_MAX + PEER_AUTH_TAG_BYTES)

/* req.c */
struct serve_req *serve__req_new(struct serve *s, enum serve_req_kind kind);
struct serve_req *serve__req_find(struct serve *s, uint64_t id);
/* The tenant of live request `id` for a log line that has only the id,
 * SERVE_TENANT_UNKNOWN when there is none (any more). */
const char *serve__req_tenant(struct serve *s, uint64_t id);
#define SERVE_TENANT_UNKNOWN "-"
/* Look the step for `event` up in `m` (r's machine) and take it: GO
 * changes r->state (the phase timer stops when the state changes; the
 * change is logged at debug level) and returns the step, whose actions
 * the caller runs; IGNORE returns NULL; BUG is an invariant breach
 * (logged, abort). The one place a request's state changes. */
const struct machine_step *serve__req_step(struct serve_req *r,
					   const struct machine *m,
					   unsigned event);
/* Record why r failed: the first failure is the one its client (or its
 * peer) hears about. True when this one was recorded. */
bool serve__req_fail(struct serve_req *r, int code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* Register in the registry (after admission). */
void serve__req_register(struct serve_req *r);
/* Terminal: unregister, close the timer, free the memory later. */
void serve__req_end(struct serve_req *r, bool ok);
void serve__timer_start(struct serve_req *r, uint64_t ms, uv_timer_cb cb);
void serve__timer_stop(struct serve_req *r);
int serve__compute_submit(struct serve *s, struct serve_req *r,
			  const int32_t *prompt, uint32_t n_prompt,
			  uint32_t max_tokens, bool prefill_only,
			  const struct kvpool_ref *table, uint32_t n_table,
			  uint32_t n_cached);
/* Free r's engine request through r's preallocated free job (cannot
 * fail; once per request), then, `release_table`, release the pages of
 * r->table (the job takes the array: r->table becomes NULL), or with
 * `quarantine` take them out of circulation for good. COMPUTE_MSG_FREED follows. */
void serve__compute_free(struct serve *s, struct serve_req *r,
			 bool release_table, bool quarantine);
/* The largest prompt + max_tokens this node itself can serve. */
uint64_t serve__own_limit(struct serve *s);

/* sink.c: answering a request, whatever its client speaks. Each answer
 * goes at most once (final or error); tokens only before it; nothing goes
 * to a request whose sink left. */
void serve__sink_attach(struct serve_req *r, struct serve_sink *k);
void serve__sink_token(struct serve_req *r, int32_t token);
void serve__sink_final(struct serve_req *r, const char *reason);
void serve__sink_error(struct serve_req *r, int code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* r leaves its sink (DA_DETACH_CLIENT, the end of r); none: nothing. */
void serve__sink_detach(struct serve_req *r);
/* The client of k left: every request on it takes client_gone (orphaned,
 * invariant 8) and detaches. Not from inside a sink op. */
void serve__sink_gone(struct serve *s, struct serve_sink *k);
/* The same for one request (its client stopped wanting it: an HTTP stop
 * string matched). Not from inside a sink op. */
void serve__sink_leave(struct serve_req *r);
/* Start streaming: the detokenizer learns the prompt. */
int serve__sink_stream_begin(struct serve_req *r);
/* A client's prompt as ids for the model's tokenizer (s->tok), the same
 * for every front: the given ids (each inside the vocabulary) when
 * tokens is not NULL, else text tokenized (BOS as the vocabulary asks;
 * 1..PROTO_CLIENT_TOKENS_MAX ids). 0 with *out malloc'd; 1 with a
 * sentence in msg (the client's error); -ENOMEM. Any thread (the
 * tokenizer is immutable): HTTP runs it on its preparation workers. */
int serve__sink_prompt_ids(const struct tokenizer *tok, const uint32_t *tokens,
			   uint32_t n_tokens, const char *text, size_t text_len,
			   int32_t **out, uint32_t *n, char *msg, size_t msg_size);

/* gate.c: admission between tenants. Loop thread. */
int serve__gate_init(struct serve *s);
void serve__gate_stop(struct serve *s);
/* A parsed request (prompt, max_tokens, tenant, lim set, sink attached)
 * to the tenant's queue, admitted by the role (serve->admit) now or when
 * its turn comes; refused with OVERLOADED when the tenant's queue is
 * full, DRAINING while draining. */
void serve__gate_admit(struct serve_req *r);
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
void serve__local_admit(struct serve_req *r);
/* The dreq machine (standalone and decode client requests): take event
 * `ev` and run its actions; entering DONE ends r. */
void serve__dreq_event(struct serve_req *r, enum dreq_event ev);
/* engine messages for LOCAL and DECODE requests */
void serve__dreq_engine_msg(struct serve_req *r, const struct compute_msg *m);
/* kvctl abort of a client request (any state): OP_ABORT. */
void serve__decode_abort(struct serve_req *r, const char *reason);

/* prefill.c */
int serve__prefill_start(struct serve *s);
void serve__prefill_engine_msg(struct serve_req *r, const struct compute_msg *m);
/* The preq machine: take event `ev` and run its actions; entering DONE
 * ends r. */
void serve__preq_event(struct serve_req *r, enum preq_event ev);
/* Fail a prefill request (kvctl abort): abort to decode, pages back once
 * nothing of it is queued. */
void serve__prefill_abort(struct serve_req *r, const char *reason);
