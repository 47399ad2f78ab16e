/* link.c - one peer link, for both ends.
 *
 * Design. A link is a control connection (frames, sealed once both ends
 * proved the cluster key), the data connection bound to it (a transport:
 * tcp today, verbs next; this is the one place one is created), liveness
 * (heartbeats, three missed and it is lost), the bounds of invariant 11
 * (a bounded control write queue, a data backlog that stops sending and
 * then ends the link, handshake budgets (below) and at most 512 links, at
 * most peers.max_links proven links per decode node, and what one node
 * holds over all its links for prefill's caps), and the requests that
 * run on it. Decode dials (struct link_ops from
 * decode.c), prefill accepts (from prefill.c); what differs by side is
 * the handshake:
 *   dial:   connect; keyed: auth_hello -> challenge -> our proof -> its
 *           proof, then seal; hello -> its hello (must be a prefill node
 *           of the same model and layout) -> data connection presents the
 *           token -> data_bound: up.
 *   accept: the first frame decides: auth_hello (challenge, check the
 *           proof, prove, seal, then hello), hello (keyless, loopback), or
 *           data with a token, which binds this connection as an earlier
 *           control link's data connection (then this link closes);
 *           anything else is refused with one word.
 * Before the proof (keyless: the hello) a link reads only frames of
 * handshake size.
 *
 * Strangers cannot block pairing. An accepted connection that has not
 * finished its handshake (keyed: a good auth_proof, then the hello;
 * keyless: the hello; a data connection: its token) is unproven, and
 * what it can hold is budgeted:
 * at most LINK_PENDING_PER_SOURCE unproven handshakes per source address
 * and LINK_PENDING_MAX handshakes in all. A new connection never waits
 * for a stranger's slot to time out: past its source's budget the oldest
 * unproven handshake of that source gives way to it; past the total, the
 * oldest unproven one of the source holding the most (so a peer with one
 * handshake in flight is the last to go while strangers hold several).
 * One that gave way is no longer read and is closed on the next loop
 * iteration (accept_budget says why not at once). An unproven connection must
 * finish within LINK_PROOF_MS of its accept (or connect_timeout_ms when
 * shorter), judged at the tick, however much it keeps talking. A stranger
 * on the peer's own address shares that address's budget with it: the
 * budget protects a peer from strangers elsewhere, not from its own host.
 *
 * Teardown (link_lost_code) closes both connections first, then every
 * request on the link takes LINK_LOST through its role: once the data
 * connection is closed nothing can write for them any more, which is what
 * lets decode unfence (invariant 2). A dialled link reconnects once its
 * handles have closed; an accepted one is freed then.
 *
 * Calls only io.c and req.c among the serving files; the roles above it
 * are reached through struct link_ops.
 */
#include "daemon/node/serve_int.h"
#include "conf/util.h"

#include <errno.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define LINK_RETRY_MS 500

/* Connections that have not finished their handshake (each holds an fd
 * and a buffer), unproven ones per source address, and accepted links in
 * all. Past a handshake budget the oldest unproven handshake makes room
 * (see the top); past LINK_TOTAL_MAX, or when every pending handshake has
 * proved, one more is accepted and closed at once, so a flood of
 * strangers cannot use up the descriptors the admin socket and the real
 * peers need. */
#define LINK_PENDING_MAX 64u
#define LINK_PENDING_PER_SOURCE 8u
#define LINK_TOTAL_MAX 512u
/* Evicted handshakes waiting to close (next loop iteration): counted
 * apart from the 512, since one accept loop can evict up to the listen
 * backlog (511) plus what arrives meanwhile. */
#define LINK_EVICTED_MAX 1024u
/* An accepted connection proves the key within this (ms) of its accept:
 * one round trip after decode's auth_hello, so a second leaves room for
 * a distant, loaded peer and holds a stranger's slot briefly. */
#define LINK_PROOF_MS 1000u

static void link_connect(struct link *l);

/* ---- the link's state ----------------------------------------------------- */

#define ST(x) (1u << (x))

/* The edges a link's state may take (link.h says what each state is). */
static const unsigned link_edges[LINK_STATE__N] = {
	[LINK_IDLE] = ST(LINK_CONNECTING) | ST(LINK_FIRST),
	[LINK_CONNECTING] = ST(LINK_CHALLENGE) | ST(LINK_HELLO) | ST(LINK_CLOSING),
	/* keyless: the first frame is the hello */
	[LINK_FIRST] = ST(LINK_PROOF) | ST(LINK_BINDING) | ST(LINK_CLOSING),
	[LINK_CHALLENGE] = ST(LINK_PROOF) | ST(LINK_CLOSING),
	[LINK_PROOF] = ST(LINK_HELLO) | ST(LINK_CLOSING),
	[LINK_HELLO] = ST(LINK_BINDING) | ST(LINK_CLOSING),
	[LINK_BINDING] = ST(LINK_UP) | ST(LINK_CLOSING),
	[LINK_UP] = ST(LINK_CLOSING),
	/* dial: reconnect once every handle closed (accept: freed) */
	[LINK_CLOSING] = ST(LINK_IDLE),
};

static const char *const link_state_names[LINK_STATE__N] = {
	[LINK_IDLE] = "idle", [LINK_CONNECTING] = "connecting",
	[LINK_FIRST] = "first", [LINK_CHALLENGE] = "challenge",
	[LINK_PROOF] = "proof", [LINK_HELLO] = "hello",
	[LINK_BINDING] = "binding", [LINK_UP] = "up", [LINK_CLOSING] = "closing",
};

const char *serve__link_state_name(enum link_state st)
{
	return (unsigned)st < LINK_STATE__N ? link_state_names[st] : "?";
}

void serve__link_set_state(struct link *l, enum link_state to)
{
	KVD_ASSERT(l->s->log, (unsigned)l->state < LINK_STATE__N &&
		   (unsigned)to < LINK_STATE__N && (link_edges[l->state] & ST(to)) &&
		   (to != LINK_IDLE || l->side == LINK_DIAL),
		   "peer=%s side=%s from=%s to=%s msg=\"no such link transition\"",
		   KVLOG_Q(l->addr), l->side == LINK_DIAL ? "dial" : "accept",
		   serve__link_state_name(l->state), serve__link_state_name(to));
	KVLOG_DEBUG(l->s->log, "link_state", "peer=%s from=%s to=%s", KVLOG_Q(l->addr),
		    serve__link_state_name(l->state), serve__link_state_name(to));
	l->state = to;
}
static unsigned link_lost_code(struct link *l, const char *why, int code,
			       const char *msg);

void serve__link_lost(struct link *l, const char *why)
{
	(void)link_lost_code(l, why, PROTO_ERR_INTERNAL, NULL);
}

/* The peer's name in log lines: the address we dial, or the node name
 * an accepted peer gave in its hello. */
static const char *link_who(const struct link *l)
{
	if (l->side == LINK_DIAL)
		return l->addr;
	return l->hello.node[0] ? l->hello.node : "?";
}

/* ---- sending ----------------------------------------------------------------- */

/* Frame m (malloc'd *data, header included), sealed with `tx` unless
 * NULL. 0, -EMSGSIZE, -ENOMEM. */
static int link_frame(struct peer_aead *tx, const struct proto_peer_msg *m,
		      char **data, size_t *len)
{
	int r = proto_peer_frame(m, data, len);

	if (r)
		return r > 0 ? -EMSGSIZE : r;
	if (tx) {
		r = peer_frame_seal(tx, data, len);
		if (r) {
			free(*data);
			*data = NULL;
			return r;
		}
	}
	return 0;
}

/* Past listen.write_queue_soft we stop reading the peer (a peer that
 * does not read our answers cannot make us produce more); past
 * write_queue_hard nothing more is queued and reading stops: the tick
 * tears the link down. */
int serve__link_send(struct link *l, const struct proto_peer_msg *m)
{
	char *data;
	size_t len;
	int rc;

	if (!l || !link_is_open(l) || l->wb_dead)
		return -EPIPE;
	rc = link_frame(l->sealed ? &l->ss.tx : NULL, m, &data, &len);
	if (rc)
		return rc;
	rc = wbound_write(&l->wb, data, len);
	if (rc == WBOUND_E_HARD) {
		l->wb_dead = true;
		wbound_read_stop(&l->wb);
		return -EPIPE;
	}
	return rc;
}

void serve__link_post(struct link *l, const struct proto_peer_msg *m)
{
	int rc;

	if (l && m->type == PEER_MSG_ABORT &&
	    kvd_fault_fire(&l->s->fault, KVD_FAULT_ABORT_SEND_FAIL)) {
		KVLOG_WARN(l->s->log, "fault", "point=abort_send_fail id=%llu tenant=%s",
			   (unsigned long long)m->id,
			   KVLOG_Q(serve__req_tenant(l->s, m->id)));
		rc = -ENOMEM;
	} else {
		rc = serve__link_send(l, m);
	}

	if (!rc || !l || !link_is_open(l) || l->wb_dead || l->doom)
		return;
	l->doom = "a control frame could not be queued";
	wbound_read_stop(&l->wb);
	KVLOG_WARN(l->s->log, "peer_send_failed", "peer=%s type=%s code=%d",
		   KVLOG_Q(link_who(l)), proto_peer_type_name(m->type), rc);
}

/* The data connection's first frame (plain: it proves itself by token). */
static int link_send_data_hello(struct link *l, const struct proto_peer_msg *m)
{
	uv_stream_t *st = transport_tcp_stream(l->data);
	char *data;
	size_t len;
	int r;

	if (uv_is_closing((uv_handle_t *)st))
		return -EPIPE;
	r = link_frame(NULL, m, &data, &len);
	if (r)
		return r;
	return serve__write(st, data, len);
}

/* Heartbeat tick of the control write queue: true when l was torn down
 * (past the hard bound, or past the soft one for write_stall_timeout_ms). */
static bool link_write_check(struct link *l, uint64_t now)
{
	struct serve *s = l->s;
	int rc = l->wb_dead ? WBOUND_E_HARD : wbound_poll(&l->wb, now);

	if (l->doom) {
		serve__link_lost(l, l->doom);
		return true;
	}
	if (!rc) {
		/* not reading it (past soft): its silence is ours, and the
		 * stall bound, not liveness, decides how long it may last */
		if (l->wb.paused)
			l->last_heard_ns = now;
		return false;
	}
	KVLOG_WARN(s->log, "write_bound",
		   "peer=%s conn=peer_control reason=%s queued=%zu peak=%llu soft=%llu hard=%llu stall_ms=%u",
		   KVLOG_Q(link_who(l)), rc == WBOUND_E_HARD ? "hard" : "stall",
		   wbound_queued(&l->wb), (unsigned long long)l->wb.peak,
		   (unsigned long long)l->wb.lim.soft,
		   (unsigned long long)l->wb.lim.hard, l->wb.lim.stall_ms);
	serve__link_lost(l, rc == WBOUND_E_HARD ? "control write queue past its hard bound" :
				"control write queue stalled past its soft bound");
	return true;
}

/* ---- requests on a link ------------------------------------------------------ */

void serve__link_attach(struct link *l, struct serve_req *r, uint32_t pages)
{
	r->link = l;
	r->link_pages = pages;
	kvd_list_add(&l->reqs, &r->link_node);
	l->n_reqs++;
	l->n_pages += pages;
}

void serve__link_detach(struct serve_req *r)
{
	struct link *l = r->link;

	if (!l)
		return;
	/* verbs: the request leaves the link, so does its write scope
	 * (decode: revoked - the NIC refuses the peer's writes from now;
	 * prefill: its runs forgotten) */
	if (l->data && transport_is_verbs(l->data)) {
		if (l->side == LINK_DIAL)
			transport_verbs_revoke(l->data, r->reg.id);
		else
			transport_verbs_forget(l->data, sreq_p(r)->remote_id);
	}
	kvd_list_del(&r->link_node);
	l->n_reqs--;
	l->n_pages -= r->link_pages;
	r->link = NULL;
	r->link_pages = 0;
}

/* Every request on l, each once, through the role: lost (with code and
 * msg) or resumed. A request may leave the link (or end) in its step, and
 * take others with it: each is moved aside before its step, and what is
 * still attached afterwards goes back, in its order. Resumed oldest first
 * (attach puts the newest at the head): the backlog's room goes to the
 * request that has waited longest, so a stream of new requests cannot
 * starve an old one past its send deadline (prefill.c). Returns how many
 * said true. */
static unsigned link_reqs_walk(struct link *l, bool lost, int code,
			       const char *msg)
{
	struct kvd_list seen = KVD_LIST_INIT(seen);
	unsigned n = 0;

	while (!kvd_list_empty(&l->reqs)) {
		struct kvd_list *e = lost ? l->reqs.next : l->reqs.prev;
		struct serve_req *r = kvd_list_entry(e, struct serve_req, link_node);

		kvd_list_del(e);
		if (lost)
			kvd_list_add_tail(&seen, e);
		else
			kvd_list_add(&seen, e);
		if (lost)
			n += l->ops->req_lost(r, code, msg);
		else if (l->ops->req_resume)
			l->ops->req_resume(r);
	}
	while (!kvd_list_empty(&seen)) {
		struct kvd_list *e = seen.next;

		kvd_list_del(e);
		kvd_list_add_tail(&l->reqs, e);
	}
	return n;
}

/* ---- figures ----------------------------------------------------------------- */

/* The daemon's view of the peers that completed a handshake (both
 * roles): how many, their smallest pool and context. */
static void link_figures_update(struct serve *s)
{
	struct kvd_peer_figures pf = { 0 };
	struct kvd_list *e;

	kvd_list_for_each(e, &s->links) {
		const struct link *q = kvd_list_entry(e, struct link, node);
		const struct proto_peer_hello *h = &q->hello;

		if (!link_is_matched(q))
			continue;
		pf.min_pool_tokens = pf.up ? KVD_MIN(pf.min_pool_tokens, h->pool_tokens)
					   : h->pool_tokens;
		pf.min_context = pf.up ? KVD_MIN(pf.min_context, (uint32_t)h->context)
				       : (uint32_t)h->context;
		pf.up++;
	}
	s->d->peers = pf;
}

/* ---- the data connection ----------------------------------------------------- */

static void link_rx_batch(void *arg, const struct xfer_hdr *h, const uint8_t *batch)
{
	struct link *l = arg;

	l->ops->rx_batch(l, h, batch);
}

/* A peer failed authentication (invariant 11): counted in all (kvctl
 * status peer_auth_failures) and by kind (kvd_peer_auth_failures_total). */
static void link_auth_failed(struct serve *s, enum kvd_peer_auth_kind kind)
{
	s->d->counters.peer_auth_failures++;
	kvd_metrics_peer_auth(&s->d->metrics, kind);
}

/* A batch failed its checksum (or came without one): its header is as
 * untrustworthy as its pages, so the id it names may be an innocent
 * request's and the real victim's pages may be anywhere in the stream.
 * The data stream as a whole is broken: every transfer on this link fails
 * with INTEGRITY and both connections are torn down, which also ends any
 * write into their pages (invariants 2, 7). */
static void link_rx_bad(void *arg, int code, const struct xfer_hdr *h)
{
	struct link *l = arg;
	bool auth = code == XFER_E_AUTH;

	KVLOG_WARN(l->s->log, "batch_checksum",
		   "peer=%s claimed_id=%llu seq=%u error=%s",
		   KVLOG_Q(l->addr),
		   (unsigned long long)h->request_id, h->seq, xfer_strerror(code));
	if (auth)
		link_auth_failed(l->s, KVD_PEER_AUTH_BATCH);
	/* what the requests failed below count their failure as */
	l->lost_kind = auth ? KVD_INTEGRITY_MAC : KVD_INTEGRITY_CHECKSUM;
	if (!link_lost_code(l, auth ? "a KV batch failed authentication" :
				      "a KV batch failed its checksum",
			    PROTO_ERR_INTEGRITY,
			    auth ? "a KV batch on the prefill peer's data connection failed authentication; no token was produced from it" :
				   "a KV batch on the prefill peer's data connection failed its checksum; no token was produced from it")) {
		l->s->d->counters.integrity_failures++;
		kvd_metrics_integrity(&l->s->d->metrics, l->lost_kind);
	}
}

/* verbs (decode): mailbox slots copied out; prefill may fill them again */
static void link_rx_credit(void *arg, uint64_t consumed)
{
	struct link *l = arg;
	struct proto_peer_msg m = { .type = PEER_MSG_VERBS_CREDIT, .consumed = consumed };

	if (kvd_fault_fire(&l->s->fault, KVD_FAULT_VERBS_LIE_CREDIT)) {
		/* a lying decode: credits for batches never posted */
		m.consumed += 100;
		KVLOG_WARN(l->s->log, "fault", "point=verbs_lie_credit consumed=%llu claimed=%llu",
			   (unsigned long long)consumed, (unsigned long long)m.consumed);
	}
	(void)serve__link_send(l, &m);
}

static void link_scope_live(void *arg, uint64_t id, const struct proto_peer_run *runs,
			    uint32_t n_runs, int status)
{
	struct link *l = arg;

	if (l->ops->scope_live)
		l->ops->scope_live(l, id, runs, n_runs, status);
}

static void link_scope_dead(void *arg, uint64_t id)
{
	struct link *l = arg;

	if (l->ops->scope_dead)
		l->ops->scope_dead(l, id);
}

static void link_data_closed(void *arg, int status)
{
	struct link *l = arg;

	if (l->data && transport_is_verbs(l->data) && status == -EPROTO &&
	    l->side == LINK_DIAL) {
		/* the prefill peer wrote a batch into a mailbox slot it held
		 * no credit for: what the slot held cannot be believed */
		l->lost_kind = KVD_INTEGRITY_TRANSFER;
		if (!link_lost_code(l, "the prefill peer broke the RDMA mailbox's credits",
				    PROTO_ERR_INTEGRITY,
				    "the prefill peer wrote a KV batch into a mailbox slot it held no credit for; no token was produced from it")) {
			l->s->d->counters.integrity_failures++;
			kvd_metrics_integrity(&l->s->d->metrics, l->lost_kind);
		}
		return;
	}
	if (l->data && transport_is_verbs(l->data))
		serve__link_lost(l, status == XFER_E_AUTH ? "a KV batch failed authentication"
							  : "RDMA queue pair error");
	else if (l->side == LINK_DIAL)
		serve__link_lost(l, status == -ECONNRESET ? "data connection cut mid-batch"
							  : "data connection closed");
	else
		serve__link_lost(l, status ? "data connection error" : "data connection closed");
}

/* The link's transport, on the negotiated terms: dial receives (batches
 * go to the role), accept sends. transfer.transport = verbs: an RDMA
 * transport on the configured device, whose QP the verbs_qp exchange on
 * this (authenticated) control link connects. 0, or l was lost. */
static int link_transport_new(struct link *l)
{
	struct serve *s = l->s;
	const struct kvd_config *c = &s->d->cfg;
	struct transport_cfg tc = { 0 };
	char why[400] = "";
	int rc;

	tc.pool = s->d->pool;
	tc.mem = &s->d->mem;
	tc.page_bytes = s->page_bytes;
	tc.checksum_ns = &s->d->counters.checksum_ns;
	tc.max_batch_bytes = l->max_batch_bytes;
	tc.checksum = l->checksum;
	tc.seal = l->sealed ? &l->ss.data : NULL;
	tc.fault = &s->fault;
	tc.log = s->log;
	tc.recv.closed = link_data_closed;
	if (l->side == LINK_DIAL) {
		tc.recv.batch = link_rx_batch;
		tc.recv.bad_batch = link_rx_bad;
		tc.recv.credit = link_rx_credit;
		tc.recv.scope_live = link_scope_live;
		tc.recv.scope_dead = link_scope_dead;
	}
	tc.recv_arg = l;
	if (c->transport == KVD_TRANSPORT_VERBS) {
		tc.verbs_device = c->verbs_device;
		tc.verbs_port = c->verbs_port;
		tc.verbs_gid_index = c->verbs_gid_index;
		tc.verbs_qp_depth = c->verbs_qp_depth;
		/* auto was resolved by the boot check (the configured batch
		 * bound; a link's negotiated one may be smaller and would ask
		 * less): every link's QP uses the size the boot line and
		 * kvctl status name */
		tc.verbs_inline = s->d->verbs_inline;
		tc.verbs_stats = &s->d->counters.verbs;
		tc.verbs_write_scope = (uint32_t)c->verbs_write_scope;
		tc.verbs_flush_timeout_ms = c->verbs_flush_timeout_ms;
		rc = transport_verbs_new(&l->data, &s->d->loop, &tc, why, sizeof(why));
		if (rc) {
			KVLOG_ERR(s->log, "transport_unavailable",
				  "peer=%s transport=verbs code=%d msg=%s",
				  KVLOG_Q(link_who(l)), rc, KVLOG_Q(why));
			l->data = NULL;
			return rc;
		}
		l->data->data = l;
		return 0;
	}
	rc = transport_tcp_new(&l->data, &s->d->loop, &tc);
	if (rc) {
		if (l->side == LINK_DIAL)
			KVLOG_ERR(s->log, "peer_refused",
				  "peer=%s field=max_batch_bytes msg=\"a %llu-byte page does not fit in a %llu-byte batch\"",
				  KVLOG_Q(l->addr), (unsigned long long)s->page_bytes,
				  (unsigned long long)l->max_batch_bytes);
		else
			KVLOG_ERR(s->log, "peer_refused",
				  "peer_node=%s field=max_batch_bytes msg=\"a %llu-byte page does not fit in a %llu-byte batch\"",
				  KVLOG_Q(l->hello.node),
				  (unsigned long long)s->page_bytes,
				  (unsigned long long)l->max_batch_bytes);
		l->data = NULL;
		return rc;
	}
	l->data->data = l;
	return 0;
}

/* verbs: our QP (and, decode, the mailbox) for the peer. 0 or -errno. */
static int link_verbs_describe(struct link *l)
{
	struct proto_peer_msg m = { .type = PEER_MSG_VERBS_QP };
	struct proto_peer_run mbox;
	int rc;

	rc = transport_verbs_describe(l->data, &m.vqp,
				      l->side == LINK_DIAL ? &mbox : NULL);
	if (!rc)
		rc = serve__link_send(l, &m);
	if (!rc && l->side == LINK_DIAL) {
		struct proto_peer_msg sc = { .type = PEER_MSG_VERBS_SCOPE, .id = 0,
					     .runs = &mbox, .n_runs = 1 };

		rc = serve__link_send(l, &sc);
	}
	return rc;
}

/* Bytes a data connection may hold queued before new batches wait: the
 * configured soft bound, but never less than two batches, so a fast
 * reader always has the next batch in the pipe. */
static size_t link_data_soft(const struct link *l)
{
	return KVD_MAX((size_t)l->s->d->cfg.write_queue_soft,
		       2 * (size_t)l->max_batch_bytes);
}

static bool link_data_over(const struct link *l)
{
	return l->data && l->data->ops->queued &&
	       l->data->ops->queued(l->data) > link_data_soft(l);
}

/* A decode peer that does not read its data connection must not make
 * us hold batch after batch (sealed batches are copies): past the soft
 * bound no request of it sends more until the queue drains. */
bool serve__link_data_full(struct link *l)
{
	if (!link_data_over(l))
		return false;
	l->data_waiters = true;   /* resumed once it drains */
	return true;
}

void serve__link_data_resume(struct link *l)
{
	if (!l->data_waiters || link_data_over(l))
		return;
	l->data_waiters = false;
	(void)link_reqs_walk(l, false, 0, NULL);
}

/* Heartbeat tick for an accepted link's data connection: true when l
 * was torn down because decode stopped reading it (past the soft bound
 * for the stall timeout); else resume requests that waited for it. */
static bool link_data_check(struct link *l, uint64_t now)
{
	struct serve *s = l->s;

	if (l->side != LINK_ACCEPT || !l->data || !link_is_matched(l))
		return false;
	if (link_data_over(l)) {
		if (!l->data_over_since_ns)
			l->data_over_since_ns = now;
		if (now - l->data_over_since_ns <
		    (uint64_t)s->d->cfg.write_stall_timeout_ms * 1000000ull)
			return false;
		KVLOG_WARN(s->log, "write_bound",
			   "peer_node=%s conn=peer_data reason=stall queued=%zu soft=%zu stall_ms=%u",
			   KVLOG_Q(l->hello.node), l->data->ops->queued(l->data),
			   link_data_soft(l), s->d->cfg.write_stall_timeout_ms);
		serve__link_lost(l, "data connection stalled past its soft bound");
		return true;
	}
	l->data_over_since_ns = 0;
	serve__link_data_resume(l);
	return false;
}

/* Both hellos matched: the negotiated terms. */
static void link_hello_done(struct link *l, const struct proto_peer_hello *h)
{
	struct serve *s = l->s;

	l->hello = *h;
	serve__link_set_state(l, LINK_BINDING);
	frame_decoder_set_max(&l->dec, SERVE_PEER_FRAME_MAX);
	l->max_batch_bytes = KVD_MIN(s->d->cfg.max_batch_bytes, h->max_batch_bytes);
	l->checksum = s->d->cfg.checksum || h->checksum;
}

/* Both nonces known: the link's keys (the auth_proofs' names are sealed
 * with its control keys already). */
static void link_derive(struct link *l, enum peer_auth_side side)
{
	peer_session_derive(&l->ss, &l->s->key, side, l->nonce_d, l->nonce_p,
			    l->s->d->cfg.encrypt);
}

/* "ip:port" of one end of l's control connection (peer: the remote
 * one), as the socket says; "" when it cannot say. */
static void link_sock_addr(struct link *l, bool peer, char *out, size_t n)
{
	struct sockaddr_storage ss;
	int len = sizeof(ss);
	char ip[INET6_ADDRSTRLEN] = "?";
	int port = 0;

	out[0] = '\0';
	if ((peer ? uv_tcp_getpeername : uv_tcp_getsockname)(&l->ctl, (struct sockaddr *)&ss, &len))
		return;
	if (ss.ss_family == AF_INET6 &&
	    IN6_IS_ADDR_V4MAPPED(&((struct sockaddr_in6 *)&ss)->sin6_addr)) {
		/* a dual-stack listener sees an IPv4 peer as ::ffff:a.b.c.d,
		 * while the peer's own socket says a.b.c.d: one spelling for
		 * both, or the proofs (which bind the addresses) never match */
		struct sockaddr_in6 s6 = *(struct sockaddr_in6 *)&ss;
		struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;

		memset(&ss, 0, sizeof(ss));
		s4->sin_family = AF_INET;
		s4->sin_port = s6.sin6_port;
		memcpy(&s4->sin_addr, &s6.sin6_addr.s6_addr[12], 4);
	}
	if (ss.ss_family == AF_INET) {
		uv_ip4_name((struct sockaddr_in *)&ss, ip, sizeof(ip));
		port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
	} else if (ss.ss_family == AF_INET6) {
		uv_ip6_name((struct sockaddr_in6 *)&ss, ip, sizeof(ip));
		port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
	}
	snprintf(out, n, "%s:%d", ip, port);
}

/* What a proof binds (net/peer_auth.h): the names given, and the two
 * ends of the control connection as this side's socket sees them - a
 * relay in between makes the two sides see different pairs. */
static void link_ids(struct link *l, struct peer_auth_ids *ids, const char *name_d,
		     const char *name_p, char addr_d[PEER_AUTH_ADDR_MAX],
		     char addr_p[PEER_AUTH_ADDR_MAX])
{
	bool dial = l->side == LINK_DIAL;

	link_sock_addr(l, !dial, addr_d, PEER_AUTH_ADDR_MAX);
	link_sock_addr(l, dial, addr_p, PEER_AUTH_ADDR_MAX);
	*ids = (struct peer_auth_ids){ .name_d = name_d, .name_p = name_p,
				       .addr_d = addr_d, .addr_p = addr_p };
}

/* Both ends proved: every later control frame and batch is sealed. */
static void link_seal(struct link *l)
{
	frame_decoder_set_opener(&l->dec, peer_frame_open, &l->ss.rx);
	l->sealed = true;
	frame_decoder_set_max(&l->dec, SERVE_PEER_FRAME_MAX);
}

/* ---- dial: the handshake ----------------------------------------------------- */

static void dial_log_capacity(struct link *l)
{
	struct serve *s = l->s;
	uint64_t own = serve__own_limit(s);
	uint64_t path = KVD_MIN(own, KVD_MIN(l->hello.context, l->hello.pool_tokens));

	link_figures_update(s);
	kvd_daemon_capacity(s->d, "peer", NULL);
	KVLOG_INFO(s->log, "peer_capacity",
		   "peer=%s peer_node=%s peer_role=%s peer_pool_tokens=%llu peer_context=%llu own_context=%u own_pool_tokens=%llu path_limit=%llu verdict=%s",
		   KVLOG_Q(l->addr), KVLOG_Q(l->hello.node),
		   KVLOG_Q(l->hello.role),
		   (unsigned long long)l->hello.pool_tokens,
		   (unsigned long long)l->hello.context,
		   s->d->cap.advertised_context,
		   (unsigned long long)s->d->cap.pool_tokens,
		   (unsigned long long)path,
		   l->hello.pool_tokens >= l->hello.context ? "ok" : "peer_pool_smaller_than_context");
}

static void dial_data_connected(uv_connect_t *req, int status)
{
	struct link *l = req->data;
	struct proto_peer_msg m = { .type = PEER_MSG_DATA };
	int rc;

	if (status < 0 || link_is_closing(l) || !l->data) {
		if (!link_is_closing(l))
			serve__link_lost(l, "data connection failed");
		return;
	}
	/* the token: derived from the link's keys, or (keyless) the random
	 * one prefill sent in its hello */
	memcpy(m.token, l->sealed ? l->ss.token : l->hello.session, PEER_AUTH_BYTES);
	rc = link_send_data_hello(l, &m);
	if (!rc)
		rc = transport_tcp_start(l->data, true);
	if (rc) {
		serve__link_lost(l, "data connection setup failed");
		return;
	}
	/* up once prefill says it bound the data connection (data_bound) */
}

static void dial_data_bound(struct link *l)
{
	if (link_is_up(l) || !l->data)
		return;
	serve__link_set_state(l, LINK_UP);
	l->last_heard_ns = kvd_now_ns();
	/* the peer's figures are of this connection: what the last one
	 * reported (a killed peer's load, its drain) would steer placement
	 * away from it until its first heartbeat */
	l->load = 0;
	l->refused_draining_ns = 0;
	KVLOG_INFO(l->s->log, "peer_up",
		   "peer=%s node=%s max_batch_bytes=%llu checksum=%s transport=%s",
		   KVLOG_Q(l->addr), KVLOG_Q(l->hello.node),
		   (unsigned long long)l->max_batch_bytes,
		   l->checksum ? "on" : "off", l->data->ops->name);
	dial_log_capacity(l);
}

/* Keyed links: a hello must name the node its proof bound. */
static bool link_name_differs(const struct link *l, const struct proto_peer_hello *h)
{
	return l->sealed && strncmp(h->node, l->auth_name, sizeof(l->auth_name));
}

static void dial_on_hello(struct link *l, const struct proto_peer_msg *m)
{
	struct serve *s = l->s;
	struct sockaddr_storage ss;
	char field[32] = "", why[200] = "";
	int rc;

	if (proto_peer_hello_match(&s->my_hello, &m->hello, field, sizeof(field),
				   why, sizeof(why)) ||
	    strcmp(m->hello.role, "prefill") || (!l->sealed && !m->hello.has_session)) {
		if (!field[0] || strcmp(m->hello.role, "prefill"))
			snprintf(field, sizeof(field), "role");
		KVLOG_ERR(s->log, "peer_refused", "peer=%s field=%s msg=%s",
			  KVLOG_Q(l->addr), field,
			  KVLOG_Q(strcmp(m->hello.role, "prefill")
				  ? "the peer is not a prefill node" : why));
		serve__link_lost(l, "handshake refused");
		return;
	}
	if (link_name_differs(l, &m->hello)) {
		KVLOG_ERR(s->log, "peer_refused", "peer=%s field=node msg=%s", KVLOG_Q(l->addr),
			  KVLOG_Q("the hello names another node than the peer's proof"));
		serve__link_lost(l, "handshake refused");
		return;
	}
	link_hello_done(l, &m->hello);
	if (link_transport_new(l)) {
		serve__link_lost(l, "transport");
		return;
	}
	if (transport_is_verbs(l->data)) {
		/* no data connection: the QPs connect over this link, and
		 * it is up once prefill's verbs_qp connected ours */
		if (link_verbs_describe(l))
			serve__link_lost(l, "control setup");
		return;
	}
	serve__parse_hostport(l->addr, &ss);
	l->data_req.data = l;
	rc = uv_tcp_connect(&l->data_req, (uv_tcp_t *)transport_tcp_stream(l->data),
			    (struct sockaddr *)&ss, dial_data_connected);
	if (rc)
		serve__link_lost(l, "data connect");
}

/* A prefill peer refused us (bare: a reason word, maybe ":field"). */
static void dial_on_refused(struct link *l, const struct proto_peer_msg *m)
{
	char reason[sizeof(m->reason)];
	char *field;

	snprintf(reason, sizeof(reason), "%s", m->reason);
	field = strchr(reason, ':');
	if (field)
		*field++ = '\0';
	KVLOG_ERR(l->s->log, "peer_refused", "peer=%s by=peer reason=%s field=%s",
		  KVLOG_Q(l->addr),
		  KVLOG_Q(reason),
		  KVLOG_Q(field ? field : ""));
	serve__link_lost(l, "refused by the peer");
}

/* auth_challenge: prefill's nonce; prove we hold the key, bound to our
 * name and both addresses, and send our name sealed. */
static void dial_on_challenge(struct link *l, const struct proto_peer_msg *m)
{
	struct proto_peer_msg pr = { .type = PEER_MSG_AUTH_PROOF };
	char addr_d[PEER_AUTH_ADDR_MAX], addr_p[PEER_AUTH_ADDR_MAX];
	struct peer_auth_ids ids;

	if (strcmp(m->suite, PROTO_PEER_SUITE)) {
		KVLOG_RL_WARN(l->s->log, &l->s->rl[SERVE_RL_PEER_REFUSED], "peer_refused",
			      "peer=%s reason=suite ours=%s theirs=%s", KVLOG_Q(l->addr),
			      PROTO_PEER_SUITE, KVLOG_Q(m->suite));
		serve__link_lost(l, NULL);
		return;
	}
	memcpy(l->nonce_p, m->nonce, PEER_AUTH_BYTES);
	link_derive(l, PEER_SIDE_DECODE);
	link_ids(l, &ids, l->s->my_hello.node, "", addr_d, addr_p);
	peer_auth_proof(&l->s->key, PEER_SIDE_DECODE, l->nonce_d, l->nonce_p, &ids, pr.proof);
	peer_auth_name_seal(&l->ss.tx, l->s->my_hello.node, pr.name_sealed);
	serve__link_set_state(l, LINK_PROOF);
	if (serve__link_send(l, &pr))
		serve__link_lost(l, "control setup");
}

/* Prefill's proof: only now is it a peer. Derive the link's keys, seal
 * everything from here on, and say hello. */
static void dial_on_proof(struct link *l, const struct proto_peer_msg *m)
{
	struct serve *s = l->s;
	struct proto_peer_msg h = { .type = PEER_MSG_HELLO };
	char addr_d[PEER_AUTH_ADDR_MAX], addr_p[PEER_AUTH_ADDR_MAX];
	char name_p[PEER_AUTH_NAME_BYTES] = "";
	struct peer_auth_ids ids;

	link_ids(l, &ids, s->my_hello.node, name_p, addr_d, addr_p);
	if (peer_auth_name_open(&l->ss.rx, m->name_sealed, name_p) ||
	    peer_auth_check(&s->key, PEER_SIDE_PREFILL, l->nonce_d, l->nonce_p,
			    &ids, m->proof)) {
		link_auth_failed(s, KVD_PEER_AUTH_PROOF);
		KVLOG_ERR(s->log, "peer_refused",
			  "peer=%s reason=auth_failed msg=\"the prefill peer did not prove it holds the cluster key\"",
			  KVLOG_Q(l->addr));
		serve__link_lost(l, "authentication failed");
		return;
	}
	memcpy(l->auth_name, name_p, sizeof(l->auth_name));
	link_seal(l);
	serve__link_set_state(l, LINK_HELLO);
	h.hello = s->my_hello;
	if (serve__link_send(l, &h))
		serve__link_lost(l, "control setup");
}

/* ---- accept: the handshake ---------------------------------------------------- */

/* A bare refusal: one word (and, for a mismatch between proven peers or
 * on a keyless loopback link, the field), one escaped log line, close.
 * Nothing about this node is revealed to a peer that has not proved. */
static void accept_refuse(struct link *l, const char *reason, const char *field,
			  const char *why)
{
	struct proto_peer_msg m = { .type = PEER_MSG_REFUSED };

	if (field && field[0])
		snprintf(m.reason, sizeof(m.reason), "%s:%s", reason, field);
	else
		snprintf(m.reason, sizeof(m.reason), "%s", reason);
	KVLOG_RL_ERR(l->s->log, &l->s->rl[SERVE_RL_PEER_REFUSED], "peer_refused", "peer=%s peer_node=%s reason=%s msg=%s",
		  KVLOG_Q(l->addr),
		  KVLOG_Q(link_is_matched(l) || l->sealed ? l->hello.node : "?"),
		  m.reason, KVLOG_Q(why));
	serve__link_post(l, &m);
	serve__link_lost(l, NULL);
}

/* auth_hello: the first frame of a keyed control connection. Answer with
 * our nonce only: nothing else before decode has proved. */
static void accept_on_auth_hello(struct link *l, const struct proto_peer_msg *m)
{
	struct proto_peer_msg ch = { .type = PEER_MSG_AUTH_CHALLENGE };

	if (!l->s->key.set) {
		accept_refuse(l, "no_key", NULL,
			      "this node has no peers.key_file: it peers only without authentication, over loopback");
		return;
	}
	if (m->version != PROTO_PEER_VERSION) {
		accept_refuse(l, "version", NULL, "protocol version differs");
		return;
	}
	if (strcmp(m->suite, PROTO_PEER_SUITE)) {
		accept_refuse(l, "suite", NULL,
			      "the peer names another integrity suite than " PROTO_PEER_SUITE);
		return;
	}
	memcpy(l->nonce_d, m->nonce, PEER_AUTH_BYTES);
	peer_auth_random(l->nonce_p);
	memcpy(ch.nonce, l->nonce_p, PEER_AUTH_BYTES);
	snprintf(ch.suite, sizeof(ch.suite), "%s", PROTO_PEER_SUITE);
	serve__link_set_state(l, LINK_PROOF);
	serve__link_post(l, &ch);
}

/* Decode's proof: check it, prove ourselves, derive the link's keys;
 * every frame after our proof is sealed, both ways. */
static void accept_on_auth_proof(struct link *l, const struct proto_peer_msg *m)
{
	struct serve *s = l->s;
	struct proto_peer_msg pr = { .type = PEER_MSG_AUTH_PROOF };
	char addr_d[PEER_AUTH_ADDR_MAX], addr_p[PEER_AUTH_ADDR_MAX];
	char name_d[PEER_AUTH_NAME_BYTES] = "";
	struct peer_auth_ids ids;

	/* decode's proof binds its name, no name of ours, and both ends
	 * as our socket sees them: relayed from another link, it fails */
	link_derive(l, PEER_SIDE_PREFILL);
	link_ids(l, &ids, name_d, "", addr_d, addr_p);
	if (peer_auth_name_open(&l->ss.rx, m->name_sealed, name_d) ||
	    peer_auth_check(&s->key, PEER_SIDE_DECODE, l->nonce_d, l->nonce_p,
			    &ids, m->proof)) {
		link_auth_failed(s, KVD_PEER_AUTH_PROOF);
		accept_refuse(l, "auth_failed", NULL,
			      "the peer did not prove it holds the cluster key (for this node and these addresses)");
		return;
	}
	memcpy(l->auth_name, name_d, sizeof(l->auth_name));
	ids.name_p = s->my_hello.node;
	peer_auth_proof(&s->key, PEER_SIDE_PREFILL, l->nonce_d, l->nonce_p, &ids, pr.proof);
	peer_auth_name_seal(&l->ss.tx, s->my_hello.node, pr.name_sealed);
	if (serve__link_send(l, &pr)) {
		serve__link_lost(l, NULL);
		return;
	}
	link_seal(l);
	memcpy(l->token, l->ss.token, PEER_AUTH_BYTES);
	serve__link_set_state(l, LINK_HELLO);
}

/* peers.max_links: the node's proven links, this one not yet counted.
 * True when l was refused. */
static bool accept_node_full(struct link *l, const struct proto_peer_msg *m)
{
	struct link_node_usage u;
	char why[200];

	serve__link_node_usage(l, &u);
	if (u.links < l->s->d->cfg.peer_max_links)
		return false;
	snprintf(why, sizeof(why), "decode node %s already holds %u links (peers.max_links=%u)",
		 l->node_addr, u.links, l->s->d->cfg.peer_max_links);
	l->hello = m->hello;   /* for the log line (escaped there) */
	accept_refuse(l, "too_many_links", NULL, why);
	return true;
}

static void accept_on_hello(struct link *l, const struct proto_peer_msg *m)
{
	struct serve *s = l->s;
	struct proto_peer_msg reply = { .type = PEER_MSG_HELLO };
	char field[32] = "", why[200] = "";

	if (accept_node_full(l, m))
		return;
	if (proto_peer_hello_match(&s->my_hello, &m->hello, field, sizeof(field),
				   why, sizeof(why)) ||
	    !strcmp(m->hello.role, "prefill")) {
		if (!field[0]) {
			snprintf(field, sizeof(field), "role");
			snprintf(why, sizeof(why), "a prefill node cannot be a decode peer");
		}
		l->hello = m->hello;   /* for the log line (escaped there) */
		accept_refuse(l, "mismatch", field, why);
		return;
	}
	if (link_name_differs(l, &m->hello)) {
		l->hello = m->hello;
		accept_refuse(l, "mismatch", "node",
			      "the hello names another node than the peer's proof");
		return;
	}
	link_hello_done(l, &m->hello);
	if (s->d->cfg.transport == KVD_TRANSPORT_VERBS && link_transport_new(l)) {
		serve__link_lost(l, "transport");
		return;
	}
	serve__link_set_state(l, LINK_UP);
	reply.hello = s->my_hello;
	if (!l->sealed) {
		/* keyless (loopback) link: a random token binds the data
		 * connection; a keyed link derived one from its keys */
		peer_auth_random(l->token);
		memcpy(reply.hello.session, l->token, PEER_AUTH_BYTES);
		reply.hello.has_session = true;
	}
	/* verbs: no data connection to bind */
	l->has_token = !l->data;
	serve__link_post(l, &reply);
	link_figures_update(s);
	kvd_daemon_capacity(s->d, "peer", NULL);
	KVLOG_INFO(s->log, "peer_capacity",
		   "peer_node=%s peer_role=%s peer_pool_tokens=%llu peer_context=%llu own_context=%u own_pool_tokens=%llu authenticated=%s",
		   KVLOG_Q(m->hello.node),
		   KVLOG_Q(m->hello.role),
		   (unsigned long long)m->hello.pool_tokens,
		   (unsigned long long)m->hello.context,
		   s->d->cap.advertised_context,
		   (unsigned long long)s->d->cap.pool_tokens,
		   l->sealed ? "yes" : "no");
}

/* The control link a data token belongs to: compared in constant time,
 * and usable once (has_token drops when the data connection binds), so a
 * racing process can neither guess nor reuse one. */
static struct link *accept_by_token(struct serve *s, const uint8_t *token)
{
	struct kvd_list *e;

	kvd_list_for_each(e, &s->links) {
		struct link *l = kvd_list_entry(e, struct link, node);

		if (l->side == LINK_ACCEPT && link_is_matched(l) && l->has_token &&
		    !l->data &&
		    !sodium_memcmp(l->token, token, PEER_AUTH_BYTES))
			return l;
	}
	return NULL;
}

/* "data" with a token: tmp's socket becomes the data connection of the
 * control link the token names (dup + uv_tcp_open, so libuv handles never
 * change owner), and tmp closes. */
static void accept_on_data(struct link *tmp, const struct proto_peer_msg *m)
{
	struct serve *s = tmp->s;
	struct link *l;
	uv_os_fd_t fd;
	int nfd, rc;
	bool opened;

	l = accept_by_token(s, m->token);
	if (!l) {
		link_auth_failed(s, KVD_PEER_AUTH_TOKEN);
		accept_refuse(tmp, "bad_token", NULL,
			      "a data connection presented an unknown or used token");
		return;
	}
	l->has_token = false;
	if (link_transport_new(l)) {
		serve__link_lost(tmp, NULL);
		serve__link_lost(l, "transport");
		return;
	}
	rc = uv_fileno((uv_handle_t *)&tmp->ctl, &fd);
	nfd = rc ? -1 : dup(fd);
	opened = nfd >= 0 && !uv_tcp_open((uv_tcp_t *)transport_tcp_stream(l->data), nfd);
	if (!opened || transport_tcp_start(l->data, false)) {
		if (nfd >= 0 && !opened)
			close(nfd);   /* once opened, the transport's handle owns it */
		serve__link_lost(tmp, NULL);
		serve__link_lost(l, "data connection setup");
		return;
	}
	uv_tcp_nodelay((uv_tcp_t *)transport_tcp_stream(l->data), 1);
	serve__link_lost(tmp, NULL);
	/* decode sends no request before this: a request that overtook the
	 * data connection would find nothing to send its KV on */
	serve__link_post(l, &(struct proto_peer_msg){ .type = PEER_MSG_DATA_BOUND });
	KVLOG_INFO(s->log, "peer_up", "peer=%s peer_node=%s max_batch_bytes=%llu checksum=%s authenticated=%s encrypt=%s transport=tcp",
		   KVLOG_Q(l->addr),
		   KVLOG_Q(l->hello.node),
		   (unsigned long long)l->max_batch_bytes,
		   l->checksum ? "on" : "off", l->sealed ? "yes" : "no",
		   l->sealed && l->ss.data.encrypt ? "on" : "off");
}

/* hello as the first frame: a keyless (loopback) link. A keyed node
 * accepts no plaintext hello (a keyless one refuses auth_hello). */
static void accept_on_first_hello(struct link *l, const struct proto_peer_msg *m)
{
	if (l->s->key.set)
		accept_refuse(l, "auth_required", NULL,
			      "this node requires peers to prove the cluster key first");
	else
		accept_on_hello(l, m);
}

/* ---- the handshake as data ---------------------------------------------------- */

#define PH(p) (1u << (p))

/* Before the hello (net/PROTOCOL.md s. 2.1), a link in one of `states`
 * takes a message of `type` to `on`; each state accepts only its rows. */
struct link_step {
	enum link_side side;
	unsigned states;                 /* PH(enum link_state) bits */
	enum proto_peer_type type;
	void (*on)(struct link *l, const struct proto_peer_msg *m);
};

static const struct link_step link_steps[] = {
	/* dial: the proofs (keyed links), then the hello; a refusal may
	 * come at any point */
	{ LINK_DIAL, PH(LINK_CHALLENGE), PEER_MSG_AUTH_CHALLENGE, dial_on_challenge },
	{ LINK_DIAL, PH(LINK_PROOF), PEER_MSG_AUTH_PROOF, dial_on_proof },
	{ LINK_DIAL, PH(LINK_HELLO), PEER_MSG_HELLO, dial_on_hello },
	{ LINK_DIAL, PH(LINK_CHALLENGE) | PH(LINK_PROOF) | PH(LINK_HELLO),
	  PEER_MSG_REFUSED, dial_on_refused },
	/* accept: the first frame decides what the connection is */
	{ LINK_ACCEPT, PH(LINK_FIRST), PEER_MSG_AUTH_HELLO, accept_on_auth_hello },
	{ LINK_ACCEPT, PH(LINK_FIRST), PEER_MSG_DATA, accept_on_data },
	{ LINK_ACCEPT, PH(LINK_FIRST), PEER_MSG_HELLO, accept_on_first_hello },
	{ LINK_ACCEPT, PH(LINK_PROOF), PEER_MSG_AUTH_PROOF, accept_on_auth_proof },
	{ LINK_ACCEPT, PH(LINK_HELLO), PEER_MSG_HELLO, accept_on_hello },
};

/* A message no row takes: dial gives up, accept refuses with one word. */
static void link_unexpected(struct link *l)
{
	static const char *const expected[] = {
		[LINK_FIRST] = "unexpected first message",
		[LINK_PROOF] = "expected auth_proof",
		[LINK_HELLO] = "expected hello",
	};

	if (l->side == LINK_DIAL) {
		serve__link_lost(l, "unexpected message during the handshake");
		return;
	}
	accept_refuse(l, "protocol", NULL,
		      l->state < KVD_ARRAY_SIZE(expected) && expected[l->state] ?
		      expected[l->state] : "unexpected message");
}

static void link_handshake(struct link *l, const struct proto_peer_msg *m)
{
	for (size_t i = 0; i < KVD_ARRAY_SIZE(link_steps); i++) {
		const struct link_step *st = &link_steps[i];

		if (st->side == l->side && (st->states & PH(l->state)) &&
		    st->type == m->type) {
			st->on(l, m);
			return;
		}
	}
	link_unexpected(l);
}

/* ---- the RDMA exchange (transfer.transport = verbs) -------------------------- */

/* verbs_qp (both sides) and the mailbox (verbs_scope id 0, to prefill):
 * the link's own. Prefill connects its QP to decode's and answers with
 * its own; decode connects to prefill's and is up. Anything out of
 * place - a verbs message on a tcp link, twice, the mailbox to decode -
 * tears the link down, naming it. */
static void link_on_verbs(struct link *l, const struct proto_peer_msg *m)
{
	char why[200] = "";
	int rc;

	if (!l->data || !transport_is_verbs(l->data)) {
		KVLOG_ERR(l->s->log, "peer_refused",
			  "peer=%s field=transfer.transport msg=\"the peer uses transfer.transport=verbs, this node tcp\"",
			  KVLOG_Q(link_who(l)));
		serve__link_lost(l, "transport mismatch");
		return;
	}
	if (m->type == PEER_MSG_VERBS_SCOPE) {
		rc = l->side == LINK_ACCEPT ?
		     transport_verbs_set_mailbox(l->data, m->runs, m->n_runs, why, sizeof(why)) :
		     (snprintf(why, sizeof(why), "a prefill peer sent a mailbox"), -EPROTO);
	} else {
		rc = transport_verbs_connect(l->data, &m->vqp, why, sizeof(why));
		if (!rc && l->side == LINK_ACCEPT) {
			struct proto_peer_msg q = { .type = PEER_MSG_VERBS_QP };

			transport_verbs_describe(l->data, &q.vqp, NULL);
			rc = serve__link_send(l, &q);
			if (!rc) {
				char fig[300];

				transport_verbs_figures(l->data, fig, sizeof(fig));
				KVLOG_INFO(l->s->log, "peer_up",
					   "peer=%s peer_node=%s max_batch_bytes=%llu checksum=%s authenticated=%s encrypt=off transport=verbs %s",
					   KVLOG_Q(l->addr), KVLOG_Q(l->hello.node),
					   (unsigned long long)l->max_batch_bytes,
					   l->checksum ? "on" : "off",
					   l->sealed ? "yes" : "no", fig);
			}
		} else if (!rc) {
			dial_data_bound(l);
		}
	}
	if (rc) {
		KVLOG_ERR(l->s->log, "peer_refused", "peer=%s field=verbs_qp code=%d msg=%s",
			  KVLOG_Q(link_who(l)), rc, KVLOG_Q(why));
		serve__link_lost(l, "verbs exchange");
	}
}

/* verbs_credit (prefill): decode copied batches out of its mailbox. A
 * credit on a tcp link, to decode, or for batches never posted (or fewer
 * than before) is a lying peer: the link ends. */
static void link_on_credit(struct link *l, const struct proto_peer_msg *m)
{
	char why[200] = "a verbs_credit on a link that sends no RDMA batches";

	if (l->side == LINK_ACCEPT && l->data && transport_is_verbs(l->data) &&
	    transport_verbs_credit(l->data, m->consumed, why, sizeof(why)) == 0)
		return;
	KVLOG_ERR(l->s->log, "peer_refused", "peer=%s field=verbs_credit msg=%s",
		  KVLOG_Q(link_who(l)), KVLOG_Q(why));
	serve__link_lost(l, "verbs credit");
}

/* ---- reading ----------------------------------------------------------------- */

/* One control message: the handshake by side, then the link's own
 * (heartbeat, data_bound), then the role's. */
static void link_dispatch(struct link *l, struct proto_peer_msg *m)
{
	if (!link_is_matched(l)) {
		link_handshake(l, m);
		return;
	}
	if (m->type == PEER_MSG_HEARTBEAT) {
		l->load = m->load;
		return;
	}
	if (m->type == PEER_MSG_DATA_BOUND && l->side == LINK_DIAL) {
		dial_data_bound(l);
		return;
	}
	if (m->type == PEER_MSG_VERBS_QP ||
	    (m->type == PEER_MSG_VERBS_SCOPE && m->id == 0)) {
		link_on_verbs(l, m);
		return;
	}
	if (m->type == PEER_MSG_VERBS_CREDIT) {
		link_on_credit(l, m);
		return;
	}
	l->ops->on_msg(l, m);
}

/* A parse error that the role may answer as one request's error: only
 * after the hello (the handshake's frames are the link's own), for a
 * known type whose id was read. */
static bool link_bad_request(struct link *l, const struct proto_peer_msg *m,
			     const struct frame_error *err)
{
	return link_is_matched(l) && l->ops->bad_request && m->type != 0 &&
	       strcmp(err->key, "type") && strcmp(err->key, "id") &&
	       l->ops->bad_request(l, m, err);
}

/* Feed read bytes through the frame decoder and dispatch every parsed
 * message, until the bytes run out or l starts closing. NULL, or why l
 * must be torn down. */
static const char *link_feed(struct link *l, const char *q, size_t n)
{
	struct serve *s = l->s;

	while (n > 0 && !link_is_closing(l)) {
		size_t used;
		int rc = frame_decoder_feed(&l->dec, q, n, &used);

		if (rc)
			return "control stream error";
		q += used;
		n -= used;
		for (;;) {
			const msgpack_object *map;
			struct proto_peer_msg m;
			struct frame_error err = { 0 };

			rc = frame_decoder_next(&l->dec, &map);
			if (rc == FRAME_E_AGAIN)
				break;
			if (rc == FRAME_E_AUTH) {
				/* forged, replayed, reordered or damaged: the
				 * stream is broken, the link closes */
				link_auth_failed(s, KVD_PEER_AUTH_FRAME);
				KVLOG_RL_ERR(s->log, &s->rl[SERVE_RL_PEER_PROTOCOL], "peer_auth_failed",
					     "peer=%s kind=frame msg=\"a sealed control frame failed authentication: the link is closed\"",
					     KVLOG_Q(link_who(l)));
				return "a sealed control frame failed authentication";
			}
			if (rc == 0) {
				rc = proto_peer_parse(map, &m, &err);
				if (rc > 0 && link_bad_request(l, &m, &err))
					continue;
			}
			if (rc) {
				KVLOG_RL_ERR(s->log, &s->rl[SERVE_RL_PEER_PROTOCOL], "peer_protocol", "peer=%s code=%s msg=%s",
					  KVLOG_Q(link_who(l)), frame_strerror(rc),
					  KVLOG_Q(err.msg));
				return "protocol error";
			}
			link_dispatch(l, &m);
			proto_peer_msg_deinit(&m);
			if (link_is_closing(l))
				return NULL;
		}
	}
	return NULL;
}

static void link_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf)
{
	struct link *l = h->data;

	(void)hint;
	*buf = uv_buf_init(l->rbuf, sizeof(l->rbuf));
}

static void link_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
	struct link *l = st->data;
	const char *why;

	if (nread < 0) {
		/* an accepted connection that never said hello goes quietly */
		serve__link_lost(l, l->side == LINK_DIAL || link_is_matched(l) ?
				    "control connection closed" : NULL);
		return;
	}
	l->last_heard_ns = kvd_now_ns();
	why = link_feed(l, buf->base, nread > 0 ? (size_t)nread : 0);
	if (why)
		serve__link_lost(l, why);
}

/* The control connection's handle is open: bounded writes, reads, the
 * handshake's frame limit, the deadline. */
static void link_ctl_init(struct link *l)
{
	struct serve *s = l->s;

	l->ctl.data = l;
	serve__link_set_state(l, l->side == LINK_DIAL ? LINK_CONNECTING : LINK_FIRST);
	l->wb_dead = false;
	l->doom = NULL;
	wbound_init(&l->wb, (uv_stream_t *)&l->ctl, &(struct wbound_limits){
			    .soft = s->d->cfg.write_queue_soft,
			    .hard = s->d->cfg.write_queue_hard,
			    .stall_ms = s->d->cfg.write_stall_timeout_ms },
		    link_alloc, link_read);
	frame_decoder_init(&l->dec, SERVE_PEER_HANDSHAKE_FRAME_MAX);
	l->last_heard_ns = l->t_start_ns = kvd_now_ns();
}

/* ---- teardown ---------------------------------------------------------------- */

static void link_retry_cb(uv_timer_t *t)
{
	struct link *l = t->data;

	if (l->s->stopping || l->state != LINK_IDLE || l->draining)
		return;
	if (l->ops->redial)
		l->ops->redial(l);
	link_connect(l);
}

/* One of l's handles has closed; after the last, a dialled link may
 * reconnect, a retired one is freed. */
static void link_closed_one(struct link *l)
{
	struct serve *s = l->s;

	s->closes_pending--;
	if (--l->pending_closes)
		return;
	frame_decoder_deinit(&l->dec);
	/* the link's keys (derived even for a stranger whose proof then
	 * failed) leave no copy in freed memory */
	peer_session_wipe(&l->ss);
	sodium_memzero(l->token, sizeof(l->token));
	if (l->retired) {
		free(l);
		return;
	}
	serve__link_set_state(l, LINK_IDLE);
	if (!s->stopping && l->retry_open && !l->draining)
		uv_timer_start(&l->retry, link_retry_cb, LINK_RETRY_MS, 0);
}

static void link_handle_closed(uv_handle_t *h)
{
	link_closed_one(h->data);
}

/* verbs: the flush never came: every request's pages a peer could still
 * write are quarantined before the walk (which then unfences nothing
 * back to the free list). Counted once per link. */
static void link_flush_lost(struct link *l)
{
	struct kvd_list *e;

	l->s->d->counters.verbs_flush_timeouts++;
	if (!l->ops->req_flush_lost)
		return;
	kvd_list_for_each(e, &l->reqs)
		l->ops->req_flush_lost(kvd_list_entry(e, struct serve_req, link_node));
}

static void link_transport_closed(struct transport *t)
{
	struct link *l = t->data;

	if (transport_verbs_flush_timed_out(t))
		link_flush_lost(l);
	t->ops->free(t);
	if (l->walk_deferred) {
		l->walk_deferred = false;
		if (!link_reqs_walk(l, true, l->walk_code,
				    l->walk_msg[0] ? l->walk_msg : NULL) &&
		    l->walk_count_integrity) {
			l->s->d->counters.integrity_failures++;
			kvd_metrics_integrity(&l->s->d->metrics, l->lost_kind);
		}
		l->walk_count_integrity = false;
	}
	link_closed_one(l);
}

static void link_log_down(struct link *l, const char *why)
{
	if (l->side == LINK_DIAL)
		KVLOG_WARN(l->s->log, "peer_down", "peer=%s msg=%s was_up=%d",
			   KVLOG_Q(l->addr), KVLOG_Q(why), link_is_up(l));
	else
		KVLOG_RL_WARN(l->s->log, &l->s->rl[SERVE_RL_PEER_DOWN], "peer_down", "peer_node=%s msg=%s",
			   KVLOG_Q(link_who(l)), KVLOG_Q(why));
}

/* Tear both connections down, then every request on l takes LINK_LOST
 * (a transfer fails with `code` and `msg`, NULL: the role's words); since
 * nothing can write for them any more, decode unfences. An accepted link
 * leaves s->links at once. Returns how many transfers failed. */
static unsigned link_lost_code(struct link *l, const char *why, int code,
			       const char *msg)
{
	struct serve *s = l->s;

	if (!link_is_open(l))
		return 0;
	if (why)
		link_log_down(l, why);
	serve__link_set_state(l, LINK_CLOSING);
	/* the keys stay until the transport (which holds ss.data) has
	 * closed; the next connect derives new ones */
	l->sealed = false;
	if (l->side == LINK_ACCEPT)
		kvd_list_del(&l->node);
	link_figures_update(s);
	l->pending_closes = 1;
	s->closes_pending++;
	uv_close((uv_handle_t *)&l->ctl, link_handle_closed);
	if (l->data) {
		bool drain = l->side == LINK_DIAL && transport_is_verbs(l->data);

		l->pending_closes++;
		s->closes_pending++;
		transport_close(l->data, link_transport_closed);
		l->data = NULL;
		if (drain && !kvd_list_empty(&l->reqs)) {
			/* RDMA: a write being placed when the QP went to error
			 * still lands; the requests take LINK_LOST (and unfence)
			 * only once its flush completions are drained, when the
			 * transport reports closed (the Spin model's rule) */
			l->walk_deferred = true;
			l->walk_code = code;
			snprintf(l->walk_msg, sizeof(l->walk_msg), "%s", msg ? msg : "");
			/* an integrity loss is counted once then: by the requests
			 * it fails, or by the link if it fails none */
			l->walk_count_integrity = code == PROTO_ERR_INTEGRITY;
			return 1;
		}
	}
	return link_reqs_walk(l, true, code, msg);
}

/* ---- dial: connecting -------------------------------------------------------- */

static void dial_connected(uv_connect_t *req, int status)
{
	struct link *l = req->data;
	struct proto_peer_msg m = { .type = PEER_MSG_HELLO };

	if (link_is_closing(l))
		return;
	if (status < 0) {
		KVLOG_DEBUG(l->s->log, "peer_connect", "peer=%s msg=%s",
			    KVLOG_Q(l->addr), KVLOG_Q(uv_strerror(status)));
		serve__link_lost(l, NULL);
		return;
	}
	if (l->s->key.set) {
		/* keyed: prove first; nothing about us before the peer has */
		m.type = PEER_MSG_AUTH_HELLO;
		m.version = PROTO_PEER_VERSION;
		snprintf(m.suite, sizeof(m.suite), "%s", PROTO_PEER_SUITE);
		peer_auth_random(l->nonce_d);
		memcpy(m.nonce, l->nonce_d, PEER_AUTH_BYTES);
		serve__link_set_state(l, LINK_CHALLENGE);
	} else {
		m.hello = l->s->my_hello;
		serve__link_set_state(l, LINK_HELLO);
	}
	if (wbound_read_start(&l->wb) || serve__link_send(l, &m))
		serve__link_lost(l, "control setup");
}

static void link_connect(struct link *l)
{
	struct serve *s = l->s;
	struct sockaddr_storage ss;
	int rc;

	if (serve__parse_hostport(l->addr, &ss)) {
		KVLOG_ERR(s->log, "peer_address", "peer=%s msg=\"bad address\"",
			  KVLOG_Q(l->addr));
		return;
	}
	if (uv_tcp_init(&s->d->loop, &l->ctl)) {
		/* nothing to close: try again later, or never reconnect */
		if (!s->stopping && l->retry_open)
			uv_timer_start(&l->retry, link_retry_cb, LINK_RETRY_MS, 0);
		return;
	}
	link_ctl_init(l);
	uv_tcp_nodelay(&l->ctl, 1);
	l->conn_req.data = l;
	rc = uv_tcp_connect(&l->conn_req, &l->ctl, (struct sockaddr *)&ss,
			    dial_connected);
	if (rc)
		serve__link_lost(l, NULL);
}

static struct link *link_new(struct serve *s, enum link_side side,
			     const struct link_ops *ops)
{
	struct link *l = calloc(1, sizeof(*l));

	if (!l)
		return NULL;
	l->s = s;
	l->ops = ops;
	l->side = side;
	l->serial = ++s->next_link_serial;
	l->retired = side == LINK_ACCEPT;
	kvd_list_init(&l->node);
	kvd_list_init(&l->reqs);
	return l;
}

int serve__link_dial(struct serve *s, const char *addr, const struct link_ops *ops,
		     struct peerdns_name *dns)
{
	struct link *l = link_new(s, LINK_DIAL, ops);

	if (!l)
		return -ENOMEM;
	snprintf(l->addr, sizeof(l->addr), "%s", addr);
	l->dns = dns;
	if (uv_timer_init(&s->d->loop, &l->retry)) {
		free(l);
		return -ENOMEM;
	}
	l->retry.data = l;
	l->retry_open = true;
	/* in the configured order: the first of equally loaded peers wins */
	kvd_list_add_tail(&s->links, &l->node);
	link_connect(l);
	return 0;
}

void serve__link_drain(struct link *l, bool on)
{
	KVD_ASSERT(l->s->log, l->side == LINK_DIAL, "peer=%s msg=\"drain of an accepted link\"",
		   KVLOG_Q(l->addr));
	l->draining = on;
	/* back from a drain while down: it reconnects (its retry timer was
	 * not restarted when it closed) */
	if (!on && l->state == LINK_IDLE && l->retry_open && !l->s->stopping)
		uv_timer_start(&l->retry, link_retry_cb, 0, 0);
}

/* dial: l never reconnects: torn down (silently), out of s->links, freed
 * once its handles have closed (its retry timer too). */
static void link_retire(struct link *l)
{
	struct serve *s = l->s;

	serve__link_lost(l, NULL);
	kvd_list_del(&l->node);
	l->retired = true;
	if (l->retry_open) {
		l->retry_open = false;
		l->pending_closes++;
		s->closes_pending++;
		uv_close((uv_handle_t *)&l->retry, link_handle_closed);
	}
}

/* ---- accept: the listener ---------------------------------------------------- */

/* "ip:port" of the remote end, for log lines. */
static void accept_addr(struct link *l)
{
	const char *colon;
	size_t n;

	link_sock_addr(l, true, l->addr, sizeof(l->addr));
	colon = strrchr(l->addr, ':');
	n = KVD_MIN(colon ? (size_t)(colon - l->addr) : strlen(l->addr),
		    sizeof(l->node_addr) - 1);
	memcpy(l->node_addr, l->addr, n);
	l->node_addr[n] = '\0';
	l->src_len = 0;
	if (inet_pton(AF_INET, l->node_addr, l->src) == 1) {
		l->src_len = 4;
	} else {
		uint8_t a6[16];

		/* one host commonly holds a whole /64: a source is that */
		if (inet_pton(AF_INET6, l->node_addr, a6) == 1) {
			memcpy(l->src, a6, 8);
			l->src_len = 8;
		}
	}
}

/* A decode node, to the per-node bounds, is the address its links come
 * from. The cluster key is shared: a proof says only that the peer holds
 * it, and a key holder can name itself as it likes in its hello, so a
 * name (proven or not) would give one key holder a fresh set of caps per
 * name; its source address it cannot choose (TCP's handshake). Decode
 * nodes behind one address share the caps. A link whose address could
 * not be read is a node of its own. */
static bool link_same_node(const struct link *a, const struct link *b)
{
	if (a->side != LINK_ACCEPT || b->side != LINK_ACCEPT)
		return false;
	return a == b || (a->node_addr[0] && !strcmp(a->node_addr, b->node_addr));
}

void serve__link_node_usage(const struct link *l, struct link_node_usage *u)
{
	struct kvd_list *e;

	*u = (struct link_node_usage){ 0 };
	kvd_list_for_each(e, &l->s->links) {
		const struct link *q = kvd_list_entry(e, struct link, node);

		if (!link_is_matched(q) || !link_same_node(l, q))
			continue;
		u->links++;
		u->reqs += q->n_reqs;
		u->pages += q->n_pages;
	}
}

/* Room for one more accepted connection: fewer than LINK_TOTAL_MAX live
 * ones, and fewer than LINK_EVICTED_MAX evicted ones waiting for the
 * next loop iteration to close. Counted apart, so that one source that
 * churns connections (each evicting one of its own) cannot fill the 512
 * with its evicted handshakes within one accept loop and keep every
 * other connection out until they close. */
static bool accept_room(struct serve *s)
{
	unsigned live = 0, evicted = 0;
	struct kvd_list *e;

	kvd_list_for_each(e, &s->links) {
		const struct link *q = kvd_list_entry(e, struct link, node);

		if (q->side != LINK_ACCEPT)
			continue;
		if (q->evicted)
			evicted++;
		else
			live++;
	}
	return live < LINK_TOTAL_MAX && evicted < LINK_EVICTED_MAX;
}

/* An accepted connection that has not finished its handshake (proved
 * the cluster key and said its hello; keyless: said its hello) and is not
 * closing. A key holder that proved and then stays silent is one too: it
 * takes its source's budget and has the same deadline, so a node holding
 * the key cannot fill the pending handshakes with proven, mute links. */
static bool link_unproven(const struct link *q)
{
	return q->side == LINK_ACCEPT && link_is_open(q) && !q->evicted &&
	       !link_is_matched(q);
}

/* Two accepted links from one source (link.src: an IPv4 address, an
 * IPv6 /64). */
static bool link_same_source(const struct link *a, const struct link *b)
{
	return a->src_len == b->src_len && !memcmp(a->src, b->src, a->src_len);
}

/* An unproven handshake (its source: l->src). */
struct accept_src {
	struct link *l;
};

/* By source, then oldest first. */
static int accept_src_cmp(const void *pa, const void *pb)
{
	const struct link *a = ((const struct accept_src *)pa)->l;
	const struct link *b = ((const struct accept_src *)pb)->l;
	int c = a->src_len != b->src_len ? (a->src_len < b->src_len ? -1 : 1)
					 : memcmp(a->src, b->src, a->src_len);

	if (c)
		return c;
	return (a->t_start_ns > b->t_start_ns) - (a->t_start_ns < b->t_start_ns);
}

/* The oldest of the source holding the most among the n unproven
 * handshakes u[] (ties: the oldest), or NULL. Sorted by source, each
 * source is one run, oldest first: a flood of accepts costs n log n
 * each, not n * n. */
static struct link *accept_heaviest(struct accept_src *u, unsigned n)
{
	struct link *heavy = NULL;
	unsigned n_heavy = 0;

	qsort(u, n, sizeof(*u), accept_src_cmp);
	for (unsigned i = 0, j; i < n; i = j) {
		for (j = i + 1; j < n && link_same_source(u[j].l, u[i].l); j++)
			;
		if (!heavy || j - i > n_heavy ||
		    (j - i == n_heavy && u[i].l->t_start_ns < heavy->t_start_ns)) {
			heavy = u[i].l;
			n_heavy = j - i;
		}
	}
	return heavy;
}

/* Which handshake makes room for the new one, l: past its source's
 * budget the oldest unproven one of that source; past the total the
 * oldest unproven one of the source holding the most; NULL when l fits.
 * *full: l does not fit and no unproven handshake can make room. */
static struct link *accept_victim(struct serve *s, struct link *l, bool *full)
{
	struct accept_src u[LINK_PENDING_MAX + 1];
	struct link *mine = NULL, *heavy;
	unsigned pending = 0, n_u = 0, n_mine = 0;
	struct kvd_list *e;

	*full = false;
	kvd_list_for_each(e, &s->links) {
		struct link *q = kvd_list_entry(e, struct link, node);

		if (q == l || q->side != LINK_ACCEPT || link_is_closing(q) || q->evicted ||
		    link_is_matched(q))
			continue;
		pending++;
		if (!link_unproven(q) || n_u == KVD_ARRAY_SIZE(u))
			continue;
		u[n_u++] = (struct accept_src){ q };
		if (link_same_source(q, l)) {
			n_mine++;
			if (!mine || q->t_start_ns < mine->t_start_ns)
				mine = q;
		}
	}
	if (n_mine >= LINK_PENDING_PER_SOURCE)
		return mine;
	if (pending < LINK_PENDING_MAX)
		return NULL;
	heavy = accept_heaviest(u, n_u);
	*full = !heavy;
	return heavy;
}

/* Evicted handshakes close here, on the loop iteration after the accept
 * loop that evicted them: until they close they count against
 * LINK_TOTAL_MAX, so waiting for the heartbeat tick would let one source
 * that churns connections fill the table with them and keep every other
 * connection out until then. */
static void link_reap_cb(uv_timer_t *t)
{
	struct serve *s = t->data;
	struct kvd_list *e, *nxt;

	kvd_list_for_each_safe(e, nxt, &s->links) {
		struct link *l = kvd_list_entry(e, struct link, node);

		if (l->evicted && !link_is_closing(l))
			serve__link_lost(l, NULL);
	}
}

/* The new connection l takes its place in the handshake budgets: an
 * older unproven handshake gives up its place (counted for the tick's
 * line), or, when every pending one has finished its handshake, l is
 * closed. The one evicted stops being read and is closed on the next
 * loop iteration (link_reap_cb), quietly (a stranger learns nothing):
 * closed now, its owner could connect again at once, within this very
 * accept loop - libuv accepts until the backlog is empty - and a flood
 * that reconnects as fast as it is evicted would hold the loop there for
 * ever. */
static void accept_budget(struct serve *s, struct link *l)
{
	bool full;
	struct link *v = accept_victim(s, l, &full);

	if (full) {
		s->peer_refused_conns++;
		serve__link_lost(l, NULL);
	} else if (v) {
		s->peer_evicted_conns++;
		v->evicted = true;
		wbound_read_stop(&v->wb);
		if (s->peer_reap_open)
			uv_timer_start(&s->peer_reap_timer, link_reap_cb, 0, 0);
	}
}

static void link_accept(uv_stream_t *server, int status)
{
	struct serve *s = server->data;
	struct link *l;

	if (status < 0) {
		KVLOG_WARN(s->log, "peer_accept_failed", "error=%s", uv_err_name(status));
		return;
	}
	l = s->stopping || !accept_room(s) ? NULL :
	    link_new(s, LINK_ACCEPT, s->accept_ops);
	if (!l) {
		s->peer_refused_conns++;
		serve__accept_drop(s, server);
		return;
	}
	if (uv_tcp_init(&s->d->loop, &l->ctl)) {
		free(l);
		s->peer_refused_conns++;
		serve__accept_drop(s, server);
		return;
	}
	l->conn_id = ++s->next_conn_id;
	snprintf(l->addr, sizeof(l->addr), "?");
	kvd_list_add(&s->links, &l->node);
	link_ctl_init(l);
	if (uv_accept(server, (uv_stream_t *)&l->ctl) ||
	    wbound_read_start(&l->wb)) {
		serve__link_lost(l, NULL);
		return;
	}
	uv_tcp_nodelay(&l->ctl, 1);
	accept_addr(l);
	accept_budget(s, l);
}

int serve__link_listen(struct serve *s, const struct link_ops *ops)
{
	struct sockaddr_storage ss;
	int rc;

	s->accept_ops = ops;
	if (!s->d->cfg.listen_peer[0]) {
		KVLOG_ERR(s->log, "listen_peer", "msg=\"a prefill node needs listen.peer\"");
		return -EINVAL;
	}
	rc = serve__parse_hostport(s->d->cfg.listen_peer, &ss);
	if (rc) {
		KVLOG_ERR(s->log, "listen_peer", "addr=%s msg=\"bad address\"",
			  KVLOG_Q(s->d->cfg.listen_peer));
		return rc;
	}
	rc = uv_timer_init(&s->d->loop, &s->peer_reap_timer);
	if (rc)
		return rc;
	s->peer_reap_timer.data = s;
	s->peer_reap_open = true;
	rc = uv_tcp_init(&s->d->loop, &s->peer_listener);
	if (rc)
		return rc;
	s->peer_listener.data = s;
	s->peer_listener_open = true;
	rc = uv_tcp_bind(&s->peer_listener, (struct sockaddr *)&ss, 0);
	if (!rc)
		rc = uv_listen((uv_stream_t *)&s->peer_listener, 511, link_accept);
	if (rc)
		KVLOG_ERR(s->log, "listen_peer", "addr=%s msg=%s",
			  KVLOG_Q(s->d->cfg.listen_peer), KVLOG_Q(uv_strerror(rc)));
	else
		KVLOG_INFO(s->log, "listen_peer", "addr=%s",
			   KVLOG_Q(s->d->cfg.listen_peer));
	return rc;
}

struct link *serve__link_by_conn(struct serve *s, uint64_t conn_id)
{
	struct kvd_list *e;

	kvd_list_for_each(e, &s->links) {
		struct link *l = kvd_list_entry(e, struct link, node);

		if (l->side == LINK_ACCEPT && l->conn_id == conn_id && !link_is_closing(l))
			return l;
	}
	return NULL;
}

/* ---- liveness ---------------------------------------------------------------- */

/* One line per tick for what the handshake bounds did, not one per
 * connection (a stranger chooses how many). */
static void link_tick_log(struct serve *s)
{
	if (s->peer_refused_conns)
		KVLOG_WARN(s->log, "peer_conn_refused",
			   "count=%llu reason=too_many_connections pending_max=%u total_max=%u",
			   (unsigned long long)s->peer_refused_conns,
			   LINK_PENDING_MAX, LINK_TOTAL_MAX);
	if (s->peer_evicted_conns || s->peer_proof_timeouts)
		KVLOG_WARN(s->log, "peer_handshakes_evicted",
			   "count=%llu proof_timeouts=%llu per_source_max=%u pending_max=%u proof_ms=%u",
			   (unsigned long long)s->peer_evicted_conns,
			   (unsigned long long)s->peer_proof_timeouts,
			   LINK_PENDING_PER_SOURCE, LINK_PENDING_MAX, LINK_PROOF_MS);
	s->peer_refused_conns = s->peer_evicted_conns = s->peer_proof_timeouts = 0;
}

/* A draining link none of our requests is on any more (nothing of
 * theirs can be written for them): closed for good. True when it went. */
static bool link_drain_done(struct link *l)
{
	if (l->side != LINK_DIAL || !l->draining || l->n_reqs)
		return false;
	KVLOG_INFO(l->s->log, "peer_drained", "peer=%s was_up=%d", KVLOG_Q(l->addr),
		   link_is_up(l));
	link_retire(l);
	return true;
}

void serve__link_tick(struct serve *s)
{
	uint64_t now = kvd_now_ns();
	uint64_t dead_ns = 3ull * s->d->cfg.heartbeat_ms * 1000000ull;
	uint64_t connect_ns = (uint64_t)s->d->cfg.connect_timeout_ms * 1000000ull;
	uint64_t proof_ns = KVD_MIN((uint64_t)LINK_PROOF_MS * 1000000ull, connect_ns);
	struct kvd_list *e, *nxt;

	link_tick_log(s);
	/* a lost link leaves the list only itself (accepted ones), a
	 * drained one here */
	kvd_list_for_each_safe(e, nxt, &s->links) {
		struct link *l = kvd_list_entry(e, struct link, node);
		struct proto_peer_msg m = { .type = PEER_MSG_HEARTBEAT };
		struct kvpool_stats st;

		if (link_drain_done(l))
			continue;
		if (l->evicted && !link_is_closing(l))
			serve__link_lost(l, NULL);
		if (!link_is_open(l) || link_write_check(l, now) ||
		    link_data_check(l, now))
			continue;
		if (link_unproven(l) && now - l->t_start_ns > proof_ns) {
			/* talking or not, a stranger's slot is brief */
			s->peer_proof_timeouts++;
			serve__link_lost(l, NULL);
			continue;
		}
		if (!link_is_up(l) && now - l->t_start_ns > connect_ns) {
			/* a connection that has not finished its handshake in
			 * time holds nothing more of ours (accepted: silently) */
			serve__link_lost(l, l->side == LINK_DIAL ? "connect timeout" : NULL);
			continue;
		}
		/* a dialled link's handshake has only its deadline; an
		 * accepted one must also keep talking */
		if ((link_is_up(l) || l->side == LINK_ACCEPT) && now - l->last_heard_ns > dead_ns) {
			serve__link_lost(l, link_is_up(l) ? "three heartbeats missed" : NULL);
			continue;
		}
		if (!link_is_up(l))
			continue;
		if (l->side == LINK_ACCEPT && l->ops->tick) {
			l->ops->tick(l, now);
			if (link_is_closing(l))
				continue;
		}
		kvpool_get_stats(s->d->pool, &st);
		m.load = l->n_reqs;
		/* cached pages nobody maps go whenever admission needs them */
		m.free_tokens = ((uint64_t)st.by_state[KVPAGE_FREE] +
				 st.by_state[KVPAGE_CACHED]) * st.page_tokens;
		serve__link_post(l, &m);
	}
}

void serve__link_stop(struct serve *s)
{
	struct kvd_list *e, *nxt;

	if (s->peer_listener_open) {
		s->peer_listener_open = false;
		serve__close_handle(s, (uv_handle_t *)&s->peer_listener);
	}
	if (s->peer_reap_open) {
		s->peer_reap_open = false;
		serve__close_handle(s, (uv_handle_t *)&s->peer_reap_timer);
	}
	kvd_list_for_each_safe(e, nxt, &s->links) {
		struct link *l = kvd_list_entry(e, struct link, node);

		if (l->side == LINK_DIAL)
			link_retire(l);
		else
			serve__link_lost(l, NULL);
	}
}
