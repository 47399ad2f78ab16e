/* link.h - one peer link, for both ends (link.c).
 *
 * Private to the node's serving core (daemon/node/serve_int.h includes
 * it with the other objects' headers). Loop thread only.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "conf/list.h"
#include "daemon/node/metrics.h"
#include "net/peer_auth.h"
#include "net/transport.h"
#include "net/wbound.h"
#include "net/wire/frame.h"
#include "net/wire/proto_peer.h"

struct serve;
struct serve_req;
struct serve_sink;
struct link;
struct peerdns_name;

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

/* Where a link is in its life. Only link_set_state (link.c) changes it,
 * along the edges of link.c's table, and asserts it; the predicates below
 * read it. A dialled link goes idle -> connecting -> (challenge -> proof
 * ->) hello -> binding -> up, and from any open state to closing, then
 * back to idle to reconnect; an accepted one starts at first and is freed
 * once closed.
 *
 *   idle        dial: no control connection (before the first, between
 *               retries)
 *   connecting  dial: the control connection is being made
 *   first       accept: the first frame decides what the connection is
 *               (auth_hello, hello, data)
 *   challenge   dial, keyed: auth_challenge awaited
 *   proof       the other end's auth_proof awaited
 *   hello       the other end's hello awaited
 *   binding     hellos matched; dial: the data connection (or the queue
 *               pair) binds; accept: the transport is being made
 *   up          carries requests
 *   closing     its handles are closing */
enum link_state {
	LINK_IDLE = 0,
	LINK_CONNECTING,
	LINK_FIRST,
	LINK_CHALLENGE,
	LINK_PROOF,
	LINK_HELLO,
	LINK_BINDING,
	LINK_UP,
	LINK_CLOSING,
	LINK_STATE__N
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
	/* dial: l reconnects after a loss (its retry timer fired), before
	 * connecting: a name's links have it resolved again (peerdns.c;
	 * NULL: nothing) */
	void (*redial)(struct link *l);
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
	uint64_t serial;                 /* this node's, from 1: names the
					  * link where a pointer could dangle
					  * (serve_req.peer_serial) */
	uv_tcp_t ctl;                    /* the control connection */
	enum link_state state;           /* link_set_state only */
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
	uint8_t nonce_d[PEER_AUTH_BYTES], nonce_p[PEER_AUTH_BYTES];
	char auth_name[PEER_AUTH_NAME_BYTES];  /* keyed: the peer's node
					  * name, as its proof bound it */
	struct peer_session ss;          /* valid while `sealed`; the keys
					  * outlive it until the transport
					  * (which holds ss.data) closed */
	bool sealed;
	uint8_t token[PEER_AUTH_BYTES];  /* accept: binds the data connection */
	bool has_token;                  /* accept: not used yet */
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
	/* dial: the peers.prefill name whose answer l's address came from
	 * (peerdns.c; NULL: a configured address). Draining: the address
	 * left the answer: no new request is placed on l
	 * (link_takes_requests), it does not reconnect, and once none of
	 * its requests is left the tick closes it for good */
	struct peerdns_name *dns;
	bool draining;
	/* dial: when the peer last refused a request as DRAINING (ns,
	 * 0 never). Placement passes it over for three heartbeats while
	 * another peer takes requests (decode_pick_peer): a draining
	 * prefill refuses at once, so its reported load stays low */
	uint64_t refused_draining_ns;
	char rbuf[65536];                /* (65536) bytes: control reads */
};

/* accept: what one decode node - every proven link from the same source
 * address - holds of this node (peers.max_requests, max_pages,
 * max_links). */
struct link_node_usage {
	uint32_t links, reqs, pages;
};

/* The link carries requests (dial: its data connection is bound). */
static inline bool link_is_up(const struct link *l)
{
	return l->state == LINK_UP;
}

/* Both hellos were exchanged and matched (binding or up). */
static inline bool link_is_matched(const struct link *l)
{
	return l->state == LINK_BINDING || l->state == LINK_UP;
}

/* A new request may be placed on l: up, and not draining. */
static inline bool link_takes_requests(const struct link *l)
{
	return link_is_up(l) && !l->draining;
}

static inline bool link_is_closing(const struct link *l)
{
	return l->state == LINK_CLOSING;
}

/* Its control connection is open: neither idle nor closing. */
static inline bool link_is_open(const struct link *l)
{
	return l->state != LINK_IDLE && l->state != LINK_CLOSING;
}

/* Move l to `to` (an edge of the table in link.c; anything else stops the
 * node: a link that lost track of its state must not carry requests). */
void serve__link_set_state(struct link *l, enum link_state to);
/* "idle", "up", ... */
const char *serve__link_state_name(enum link_state st);

/* link.c: one peer link for both ends. Loop thread only. */
/* Dial peers.prefill address `addr` (an IP literal or localhost with
 * its port) and keep it connected (reconnecting after a loss) for the
 * node's life, or until it is drained; dns: the name it came from (NULL:
 * configured as an address). 0, -ENOMEM. */
int serve__link_dial(struct serve *s, const char *addr,
		     const struct link_ops *ops, struct peerdns_name *dns);
/* dial: drain l (on) - no new requests, no reconnect, closed for good by
 * the tick once its requests are gone - or take it back (off: it carries
 * requests again, reconnecting if it was down). */
void serve__link_drain(struct link *l, bool on);
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
