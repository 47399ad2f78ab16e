/* kvd_attack.c - a hostile "decode" peer for the peer-limit tests
 * (tests/integration/peer_limits.sh). Not installed.
 *
 * It speaks the peer control protocol (net/PROTOCOL.md s. 2) with the
 * project's own encoder and decoder, but breaks the rules a real decode
 * node keeps:
 *
 *   kvd_attack abort-flood HOST:PORT SECONDS
 *       handshake, then abort frames as fast as the socket takes them for
 *       SECONDS, never reading a byte; then report whether prefill closed
 *       the connection.
 *   kvd_attack hold HOST:PORT TOKENS COUNT SECONDS [--keep-sending]
 *       handshake, COUNT prefill_requests of TOKENS prompt tokens (one
 *       every 2 ms), never a release_ack; read and ignore everything
 *       prefill sends (control and data); heartbeats keep the connection
 *       alive for SECONDS. --keep-sending: a new request every 20 ms for
 *       the whole time; --no-read-data: never read the data connection
 *       (KV piles up on prefill's side); --links N: open N links (each a
 *       control and a data connection, all under the same node name) and
 *       spread the requests over them round robin, as one key holder
 *       trying to get N times the per-peer caps. Reports done/rejected
 *       counts per error code, and links=OK/N (handshakes that succeeded;
 *       the others were refused).
 *   kvd_attack junk-flood HOST:PORT COUNT
 *       handshake, then COUNT well-formed control frames prefill never
 *       expects from decode (prefill_reject), one after another; each is
 *       a line in prefill's log unless its log lines are rate limited.
 *       Reports how many went out and whether prefill kept the link.
 *   kvd_attack handshake-flood HOST:PORT SECONDS CONNS SOURCES
 *       a stranger (no key needed): keeps CONNS connections open for
 *       SECONDS, each sending auth_hello and never its proof, from the
 *       local addresses SOURCES (comma-separated IPv4, bound round-robin;
 *       "-": the system's choice). A connection prefill closes is opened
 *       again at once (after 10 ms when it was closed within 50 ms:
 *       refused at accept), so every handshake slot prefill frees goes to
 *       the flood first. Reports connections opened, closed at once and
 *       closed after being held (at the end, or at SIGTERM).
 *
 * Output: one line of key=value pairs on stdout; exit 0 unless the
 * handshake itself failed (exit 2) or the usage was wrong (exit 64).
 *
 * Options before the command: --log FILE (required) is the prefill
 * node's log, where the attacker reads the figures its hello must match
 * (model fingerprint, KV layout: an attacker on the same host or in the
 * cluster knows them; prefill itself reveals nothing before a proof);
 * --key FILE authenticates with the cluster key (an insider: a decode
 * node gone rogue) - without it the link is keyless, which prefill
 * accepts over loopback only when it has no key itself; --source IP
 * binds every connection to that local address (127.0.0.2: another
 * node than the real decode node on 127.0.0.1, for prefill's per-node
 * caps).
 *
 * Connection setup lives in attack_peer_connect() alone (connect, prove
 * the key, hello, read prefill's hello, open the data connection with the
 * token).
 */
#include "conf/keyfile.h"
#include "net/peer_auth.h"
#include "net/wire/frame.h"
#include "net/wire/proto_peer.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

struct attack_conn {
	int ctl;                       /* control connection */
	int data;                      /* data connection */
	struct proto_peer_hello theirs;/* prefill's hello */
	struct frame_decoder dec;      /* control reads */
	struct peer_session ss;        /* keyed links */
	bool sealed;
};

static int usage(void);

/* --log, --key and --source; hold's --no-read-data */
static const char *g_log;
static const char *g_source;
static int g_no_read_data;
static struct peer_key g_key;

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* --source: connect from that local address (IPv4 or IPv6). 0 or -1. */
static int tcp_bind_source(int fd, int family)
{
	struct sockaddr_storage ss = { 0 };
	socklen_t len;

	if (family == AF_INET) {
		struct sockaddr_in *a = (struct sockaddr_in *)&ss;

		a->sin_family = AF_INET;
		if (inet_pton(AF_INET, g_source, &a->sin_addr) != 1)
			return -1;
		len = sizeof(*a);
	} else {
		struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;

		a->sin6_family = AF_INET6;
		if (inet_pton(AF_INET6, g_source, &a->sin6_addr) != 1)
			return -1;
		len = sizeof(*a);
	}
	return bind(fd, (struct sockaddr *)&ss, len) ? -1 : 0;
}

static int tcp_connect(const char *hostport)
{
	char host[256];
	const char *colon = strrchr(hostport, ':');
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM };
	struct addrinfo *ai = NULL;
	int fd = -1, one = 1, small = 4096;

	if (!colon || (size_t)(colon - hostport) >= sizeof(host))
		return -1;
	memcpy(host, hostport, (size_t)(colon - hostport));
	host[colon - hostport] = '\0';
	if (getaddrinfo(host, colon + 1, &hints, &ai) || !ai)
		return -1;
	fd = socket(ai->ai_family, SOCK_STREAM, 0);
	if (fd >= 0 && g_source && tcp_bind_source(fd, ai->ai_family)) {
		close(fd);
		fd = -1;
	}
	/* a small receive window: what we do not read piles up on the
	 * sender's side, not in our kernel */
	if (fd >= 0)
		setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
	if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen)) {
		close(fd);
		fd = -1;
	}
	freeaddrinfo(ai);
	if (fd >= 0)
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	return fd;
}

/* One frame of m, sealed on a keyed link (malloc'd). 0 or -1. */
static int frame_for(struct attack_conn *c, const struct proto_peer_msg *m,
		     char **data, size_t *len)
{
	if (proto_peer_frame(m, data, len))
		return -1;
	if (c && c->sealed && peer_frame_seal(&c->ss.tx, data, len)) {
		free(*data);
		return -1;
	}
	return 0;
}

/* Write all of a frame (blocking). 0 or -1. */
static int send_on(struct attack_conn *c, int fd, const struct proto_peer_msg *m)
{
	char *data;
	size_t len, off = 0;

	if (frame_for(c, m, &data, &len))
		return -1;
	while (off < len) {
		ssize_t n = send(fd, data + off, len - off, MSG_NOSIGNAL);

		if (n <= 0) {
			free(data);
			return -1;
		}
		off += (size_t)n;
	}
	free(data);
	return 0;
}

/* Read until one message parses (blocking, up to timeout_ms). 0 or -1. */
static int recv_msg(int fd, struct frame_decoder *dec, struct proto_peer_msg *m,
		    int timeout_ms)
{
	uint64_t end = now_ms() + (uint64_t)timeout_ms;

	for (;;) {
		const msgpack_object *map;
		struct frame_error err = { 0 };
		struct pollfd p = { .fd = fd, .events = POLLIN };
		char buf[4096];
		size_t used;
		ssize_t n;
		int rc = frame_decoder_next(dec, &map);

		if (rc == 0)
			return proto_peer_parse(map, m, &err) ? -1 : 0;
		if (rc != FRAME_E_AGAIN)
			return -1;
		if (now_ms() >= end || poll(&p, 1, (int)(end - now_ms())) <= 0)
			return -1;
		n = recv(fd, buf, sizeof(buf), 0);
		if (n <= 0 || frame_decoder_feed(dec, buf, (size_t)n, &used) ||
		    used != (size_t)n)
			return -1;
	}
}

/* The value of " key=" on the last line of `log` holding " event=NAME ",
 * into out[size]. 0 or -1. Values read here are bare words. */
static int log_value(const char *event, const char *key, char *out, size_t size)
{
	char line[4096], ev[96], k[64], last[4096] = "";
	FILE *f = fopen(g_log, "r");
	const char *v;
	size_t n;

	if (!f)
		return -1;
	snprintf(ev, sizeof(ev), " event=%s ", event);
	while (fgets(line, sizeof(line), f))
		if (strstr(line, ev))
			snprintf(last, sizeof(last), "%s", line);
	fclose(f);
	snprintf(k, sizeof(k), " %s=", key);
	v = strstr(last, k);
	if (!v)
		return -1;
	v += strlen(k);
	n = strcspn(v, " \n");
	if (n >= size)
		return -1;
	memcpy(out, v, n);
	out[n] = '\0';
	return 0;
}

static uint64_t log_u64(const char *event, const char *key)
{
	char v[64];

	return log_value(event, key, v, sizeof(v)) ? 0 : strtoull(v, NULL, 10);
}

/* Our hello: the decode role with prefill's own figures, from its log. */
static int attack_hello(struct proto_peer_hello *h)
{
	uint64_t heads = log_u64("model_loaded", "heads");

	memset(h, 0, sizeof(*h));
	h->version = PROTO_PEER_VERSION;
	snprintf(h->role, sizeof(h->role), "decode");
	snprintf(h->node, sizeof(h->node), "attacker");
	if (!g_log || !heads ||
	    log_value("kv_capacity", "model_sha256", h->model_sha256, sizeof(h->model_sha256)) ||
	    log_value("kv_capacity", "kv_dtype", h->kv_dtype, sizeof(h->kv_dtype)))
		return -1;
	h->page_tokens = (uint32_t)log_u64("kv_capacity", "page_tokens");
	h->page_bytes = log_u64("kv_capacity", "page_bytes");
	h->n_layer = (uint32_t)log_u64("model_loaded", "layers");
	h->kv_dim = (uint32_t)(log_u64("model_loaded", "kv_heads") *
			       (log_u64("model_loaded", "embd") / heads));
	h->pool_tokens = h->context = 1u << 20;
	h->max_batch_bytes = 64u << 20;
	return 0;
}

/* "ip:port" of one end of socket fd (peer: the remote one), as kvd's
 * link reads it (net/peer_auth.h: a proof binds both). */
static void fd_addr(int fd, bool peer, char *out, size_t n)
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);
	char ip[INET6_ADDRSTRLEN] = "?";
	int port = 0;

	out[0] = '\0';
	if ((peer ? getpeername : getsockname)(fd, (struct sockaddr *)&ss, &len))
		return;
	if (ss.ss_family == AF_INET) {
		inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, ip, sizeof(ip));
		port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
	} else if (ss.ss_family == AF_INET6) {
		inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr, ip, sizeof(ip));
		port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
	}
	snprintf(out, n, "%s:%d", ip, port);
}

/* Keyed links: prove the key, check prefill's proof, derive the keys. */
static int attack_auth(struct attack_conn *c)
{
	struct proto_peer_msg m = { .type = PEER_MSG_AUTH_HELLO }, r;
	uint8_t nd[PEER_AUTH_BYTES], np[PEER_AUTH_BYTES];
	char addr_d[PEER_AUTH_ADDR_MAX], addr_p[PEER_AUTH_ADDR_MAX];
	char name_p[PEER_AUTH_NAME_BYTES] = "";
	struct peer_auth_ids ids = { .name_d = "attacker", .name_p = "",
				     .addr_d = addr_d, .addr_p = addr_p };

	m.version = PROTO_PEER_VERSION;
	snprintf(m.suite, sizeof(m.suite), "%s", PROTO_PEER_SUITE);
	peer_auth_random(nd);
	memcpy(m.nonce, nd, sizeof(nd));
	if (send_on(NULL, c->ctl, &m) || recv_msg(c->ctl, &c->dec, &r, 5000) ||
	    r.type != PEER_MSG_AUTH_CHALLENGE)
		return -1;
	memcpy(np, r.nonce, sizeof(np));
	fd_addr(c->ctl, false, addr_d, sizeof(addr_d));
	fd_addr(c->ctl, true, addr_p, sizeof(addr_p));
	peer_session_derive(&c->ss, &g_key, PEER_SIDE_DECODE, nd, np, false);
	m = (struct proto_peer_msg){ .type = PEER_MSG_AUTH_PROOF };
	peer_auth_proof(&g_key, PEER_SIDE_DECODE, nd, np, &ids, m.proof);
	peer_auth_name_seal(&c->ss.tx, "attacker", m.name_sealed);
	if (send_on(NULL, c->ctl, &m) || recv_msg(c->ctl, &c->dec, &r, 5000) ||
	    r.type != PEER_MSG_AUTH_PROOF)
		return -1;
	ids.name_p = name_p;
	if (peer_auth_name_open(&c->ss.rx, r.name_sealed, name_p) ||
	    peer_auth_check(&g_key, PEER_SIDE_PREFILL, nd, np, &ids, r.proof))
		return -1;
	frame_decoder_set_opener(&c->dec, peer_frame_open, &c->ss.rx);
	c->sealed = true;
	return 0;
}

/* connect + (proof) + hello + prefill's hello + data connection. */
static int attack_peer_connect(struct attack_conn *c, const char *hostport)
{
	struct proto_peer_msg hello = { .type = PEER_MSG_HELLO };
	struct proto_peer_msg data = { .type = PEER_MSG_DATA };
	struct proto_peer_msg m;

	memset(c, 0, sizeof(*c));
	c->ctl = c->data = -1;
	frame_decoder_init(&c->dec, PROTO_PEER_FRAME_MAX + PEER_AUTH_TAG_BYTES);
	if (attack_hello(&hello.hello))
		return -1;
	c->ctl = tcp_connect(hostport);
	if (c->ctl < 0 || (g_key.set && attack_auth(c)) ||
	    send_on(c, c->ctl, &hello) || recv_msg(c->ctl, &c->dec, &m, 5000))
		return -1;
	if (m.type != PEER_MSG_HELLO || (!c->sealed && !m.hello.has_session)) {
		proto_peer_msg_deinit(&m);
		return -1;
	}
	c->theirs = m.hello;
	proto_peer_msg_deinit(&m);
	memcpy(data.token, c->sealed ? c->ss.token : c->theirs.session, PEER_AUTH_BYTES);
	c->data = tcp_connect(hostport);
	if (c->data < 0 || send_on(NULL, c->data, &data))
		return -1;
	/* no request before prefill says the data connection is bound */
	do {
		if (recv_msg(c->ctl, &c->dec, &m, 5000))
			return -1;
		proto_peer_msg_deinit(&m);
	} while (m.type == PEER_MSG_HEARTBEAT);
	return m.type == PEER_MSG_DATA_BOUND ? 0 : -1;
}

static void attack_close(struct attack_conn *c)
{
	if (c->ctl >= 0)
		close(c->ctl);
	if (c->data >= 0)
		close(c->data);
	frame_decoder_deinit(&c->dec);
}

/* ---- abort-flood ------------------------------------------------------------ */

/* Wait up to ms for the peer to close fd (reading whatever it still
 * sends). 1 when it did. */
static int wait_closed(int fd, int ms)
{
	uint64_t end = now_ms() + (uint64_t)ms;
	char buf[65536];

	while (now_ms() < end) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		ssize_t n;

		if (poll(&p, 1, 100) <= 0)
			continue;
		n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
		if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
			return 1;
	}
	return 0;
}

/* Aborts go out in 64 KiB bursts of frames (one send() each), so the
 * flood is limited by how fast prefill reads, not by system calls. */
static int cmd_abort_flood(const char *hostport, int seconds)
{
	struct attack_conn c;
	uint64_t t0, end, sent = 0, bytes = 0, closed_ms = 0;
	int closed = 0;
	char burst[65536];
	size_t fill = 0;
	struct proto_peer_msg m = { .type = PEER_MSG_ABORT, .code = PROTO_ERR_INTERNAL };
	char *held = NULL;
	size_t held_len = 0;

	if (attack_peer_connect(&c, hostport)) {
		printf("handshake=failed\n");
		attack_close(&c);
		return 2;
	}
	snprintf(m.message, sizeof(m.message), "flood");
	t0 = now_ms();
	end = t0 + (uint64_t)seconds * 1000u;
	while (now_ms() < end && !closed) {
		struct pollfd p = { .fd = c.ctl, .events = POLLOUT };
		size_t off = 0;

		fill = 0;
		for (;;) {    /* one burst of whole frames */
			/* a sealed frame spends a counter: the one that does
			 * not fit is kept for the next burst, never dropped */
			if (!held) {
				m.id = 1000000 + sent;
				if (frame_for(&c, &m, &held, &held_len))
					return 2;
			}
			if (fill + held_len > sizeof(burst))
				break;
			memcpy(burst + fill, held, held_len);
			free(held);
			held = NULL;
			fill += held_len;
			sent++;
		}
		while (off < fill && now_ms() < end) {
			ssize_t n;

			if (poll(&p, 1, 50) <= 0)
				continue;
			n = send(c.ctl, burst + off, fill - off,
				 MSG_NOSIGNAL | MSG_DONTWAIT);
			if (n > 0) {
				off += (size_t)n;
				bytes += (size_t)n;
			} else if (n < 0 && errno != EAGAIN && errno != EINTR) {
				closed = 1;
				closed_ms = now_ms() - t0;
				break;
			}
		}
	}
	/* closed=during: prefill closed while we were still sending;
	 * closed=after: only once we went quiet (liveness) */
	printf("handshake=ok aborts=%llu bytes=%llu closed=%s closed_ms=%llu\n",
	       (unsigned long long)sent, (unsigned long long)bytes,
	       closed ? "during" : wait_closed(c.ctl, 10000) ? "after" : "no",
	       (unsigned long long)closed_ms);
	free(held);
	attack_close(&c);
	return 0;
}

/* ---- junk-flood ---------------------------------------------------------------- */

static int cmd_junk_flood(const char *hostport, unsigned count)
{
	struct attack_conn c;
	struct proto_peer_msg m = { .type = PEER_MSG_PREFILL_REJECT,
				    .code = PROTO_ERR_INTERNAL };
	unsigned sent = 0;

	if (attack_peer_connect(&c, hostport)) {
		printf("handshake=failed\n");
		attack_close(&c);
		return 2;
	}
	snprintf(m.message, sizeof(m.message), "junk");
	while (sent < count) {
		m.id = 5000000 + sent;
		if (send_on(&c, c.ctl, &m))
			break;
		sent++;
	}
	/* prefill keeps an unexpected message's link: it is still there
	 * when we stop (closed=0) */
	printf("handshake=ok junk=%u closed=%d\n", sent, wait_closed(c.ctl, 1000));
	attack_close(&c);
	return 0;
}

/* ---- hold ------------------------------------------------------------------- */

struct hold_counts {
	unsigned done, rejected[PROTO_ERR__N], aborts, other;
};

static void hold_on_msg(struct hold_counts *k, const struct proto_peer_msg *m)
{
	if (m->type == PEER_MSG_PREFILL_DONE)
		k->done++;
	else if (m->type == PEER_MSG_PREFILL_REJECT)
		k->rejected[(unsigned)m->code < PROTO_ERR__N ? m->code : 0]++;
	else if (m->type == PEER_MSG_ABORT)
		k->aborts++;
	else if (m->type != PEER_MSG_HEARTBEAT && m->type != PEER_MSG_ABORT_ACK)
		k->other++;
}

/* Read what is there on both connections; -1 when the control one closed. */
static int hold_pump(struct attack_conn *c, struct hold_counts *k, int wait_ms)
{
	struct pollfd p[2] = { { .fd = c->ctl, .events = POLLIN },
			       { .fd = g_no_read_data ? -1 : c->data, .events = POLLIN } };
	char buf[65536];

	if (poll(p, 2, wait_ms) <= 0)
		return 0;
	if (p[1].revents) {
		ssize_t n = recv(c->data, buf, sizeof(buf), MSG_DONTWAIT);

		if (n == 0)
			p[1].fd = -1;   /* data gone: control will follow */
	}
	if (p[0].revents) {
		ssize_t n = recv(c->ctl, buf, sizeof(buf), MSG_DONTWAIT);
		size_t used;

		if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
			return -1;
		if (n < 0)
			return 0;
		if (frame_decoder_feed(&c->dec, buf, (size_t)n, &used))
			return -1;
		for (;;) {
			const msgpack_object *map;
			struct frame_error err = { 0 };
			struct proto_peer_msg m;

			if (frame_decoder_next(&c->dec, &map))
				break;
			if (proto_peer_parse(map, &m, &err) == 0) {
				hold_on_msg(k, &m);
				proto_peer_msg_deinit(&m);
			}
		}
	}
	return 0;
}

static int hold_request(struct attack_conn *c, uint64_t id, uint32_t tokens)
{
	uint32_t pt = c->theirs.page_tokens ? c->theirs.page_tokens : 16;
	uint32_t n_pages = (tokens + pt - 1) / pt;
	struct proto_peer_msg m = { .type = PEER_MSG_PREFILL_REQUEST, .id = id,
				    .n_tokens = tokens, .n_pages = n_pages,
				    .max_tokens = 1, .temperature = 0,
				    .top_k = 1, .top_p = 1, .seed = id };
	int rc;

	m.tokens = calloc(tokens, sizeof(*m.tokens));
	m.pages = calloc(n_pages, sizeof(*m.pages));
	if (!m.tokens || !m.pages) {
		free(m.tokens);
		free(m.pages);
		return -1;
	}
	for (uint32_t i = 0; i < tokens; i++)
		m.tokens[i] = 10 + (uint32_t)((id * 7 + i) % 200);
	for (uint32_t i = 0; i < n_pages; i++)
		m.pages[i] = (struct proto_peer_page){ .page = i, .gen = 1 };
	rc = send_on(c, c->ctl, &m);
	free(m.tokens);
	free(m.pages);
	return rc;
}

#define HOLD_LINKS_MAX 16

/* Heartbeats, the next request, reads, on every link still open.
 * Returns how many links are still open. */
static unsigned hold_round(struct attack_conn *cs, int *closed, unsigned n,
			   struct hold_counts *k, uint64_t *next_hb)
{
	struct proto_peer_msg hb = { .type = PEER_MSG_HEARTBEAT };
	uint64_t t = now_ms();
	unsigned open = 0;

	for (unsigned i = 0; i < n; i++) {
		if (closed[i])
			continue;
		if (t >= *next_hb && send_on(&cs[i], cs[i].ctl, &hb))
			closed[i] = 1;
		if (!closed[i] && hold_pump(&cs[i], k, n > 1 ? 1 : 2) < 0)
			closed[i] = 1;
		open += !closed[i];
	}
	if (t >= *next_hb)
		*next_hb = t + 100;
	return open;
}

static int cmd_hold(const char *hostport, uint32_t tokens, unsigned count,
		    int seconds, int keep_sending, unsigned n_links)
{
	struct attack_conn cs[HOLD_LINKS_MAX];
	int closed[HOLD_LINKS_MAX] = { 0 };
	struct hold_counts k = { 0 };
	uint64_t end, next_hb = 0, next_req = 0, id = 1;
	unsigned ok = 0, open = 0, i;
	int said = 0;

	/* the links that completed the handshake come first */
	for (i = 0; i < n_links; i++) {
		if (attack_peer_connect(&cs[ok], hostport)) {
			attack_close(&cs[ok]);
			continue;
		}
		ok++;
	}
	if (!ok) {
		printf("handshake=failed links=0/%u\n", n_links);
		return 2;
	}
	open = ok;
	end = now_ms() + (uint64_t)seconds * 1000u;
	while (now_ms() < end && open) {
		uint64_t t = now_ms();

		if (t >= next_req && (id <= count || keep_sending)) {
			unsigned j = (unsigned)((id - 1) % ok);

			/* round robin over the links still open */
			while (closed[j])
				j = (j + 1) % ok;
			if (hold_request(&cs[j], id++, tokens))
				closed[j] = 1;
			next_req = t + (id <= count ? 2 : 20);
		}
		open = hold_round(cs, closed, ok, &k, &next_hb);
		if (id > count && !keep_sending && !said &&
		    k.done + k.rejected[PROTO_ERR_OVERLOADED] +
		    k.rejected[PROTO_ERR_INTERNAL] >= count) {
			/* the requests are out: report progress once */
			printf("sent=%u done=%u overloaded=%u links=%u/%u\n", count,
			       k.done, k.rejected[PROTO_ERR_OVERLOADED], ok, n_links);
			fflush(stdout);
			said = 1;
		}
	}
	printf("handshake=ok sent=%llu done=%u overloaded=%u draining=%u other_rejects=%u aborts=%u closed=%d links=%u/%u\n",
	       (unsigned long long)(id - 1), k.done,
	       k.rejected[PROTO_ERR_OVERLOADED], k.rejected[PROTO_ERR_DRAINING],
	       k.rejected[PROTO_ERR_PROMPT_TOO_LONG] + k.rejected[PROTO_ERR_INVALID_REQUEST] +
	       k.rejected[PROTO_ERR_INTERNAL], k.aborts, open < ok, ok, n_links);
	for (i = 0; i < ok; i++)
		attack_close(&cs[i]);
	return 0;
}

/* ---- handshake-flood ------------------------------------------------------------ */

#define FLOOD_MAX 1024
#define FLOOD_SOURCES 64

struct flood_slot {
	int fd;                        /* -1: waiting to reopen */
	bool sent;                     /* auth_hello written */
	uint64_t t_open, t_reopen;     /* ms */
};

struct flood {
	struct sockaddr_in dst;
	struct in_addr src[FLOOD_SOURCES];
	unsigned n_src, next_src;
	unsigned long long opened, closed_at_once, closed_held, challenges;
	char hello[256];               /* the auth_hello frame */
	size_t hello_len;
};

/* "a.b.c.d:port" and "a,b,c" (or "-"). 0 or -1. */
static int flood_parse(struct flood *f, const char *hostport, const char *sources)
{
	char host[64], list[1024], *tok, *save = NULL;
	const char *colon = strrchr(hostport, ':');

	if (!colon || (size_t)(colon - hostport) >= sizeof(host))
		return -1;
	memcpy(host, hostport, (size_t)(colon - hostport));
	host[colon - hostport] = '\0';
	f->dst.sin_family = AF_INET;
	f->dst.sin_port = htons((uint16_t)atoi(colon + 1));
	if (inet_pton(AF_INET, host, &f->dst.sin_addr) != 1)
		return -1;
	if (!strcmp(sources, "-"))
		return 0;
	snprintf(list, sizeof(list), "%s", sources);
	for (tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		if (f->n_src == FLOOD_SOURCES || inet_pton(AF_INET, tok, &f->src[f->n_src]) != 1)
			return -1;
		f->n_src++;
	}
	return 0;
}

/* A non-blocking connect from the next source address. */
static void flood_open(struct flood *f, struct flood_slot *sl)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);

	sl->sent = false;
	sl->t_open = now_ms();
	if (fd < 0) {
		sl->t_reopen = sl->t_open + 10;
		return;
	}
	if (f->n_src) {
		struct sockaddr_in a = { .sin_family = AF_INET,
					 .sin_addr = f->src[f->next_src++ % f->n_src] };

		if (bind(fd, (struct sockaddr *)&a, sizeof(a))) {
			close(fd);
			sl->t_reopen = sl->t_open + 10;
			return;
		}
	}
	if (connect(fd, (struct sockaddr *)&f->dst, sizeof(f->dst)) && errno != EINPROGRESS) {
		close(fd);
		sl->t_reopen = sl->t_open + 10;
		return;
	}
	sl->fd = fd;
	f->opened++;
}

/* prefill closed sl (or the connect failed): count it, reopen soon. */
static void flood_closed(struct flood *f, struct flood_slot *sl)
{
	uint64_t t = now_ms();
	bool at_once = t - sl->t_open < 50;

	close(sl->fd);
	sl->fd = -1;
	if (at_once)
		f->closed_at_once++;
	else
		f->closed_held++;
	sl->t_reopen = at_once ? t + 10 : t;
}

/* One poll event of an open slot. */
static void flood_event(struct flood *f, struct flood_slot *sl, short rev)
{
	char buf[4096];

	if (!sl->sent && (rev & POLLOUT) && !(rev & (POLLERR | POLLHUP))) {
		if (send(sl->fd, f->hello, f->hello_len, MSG_NOSIGNAL) != (ssize_t)f->hello_len) {
			flood_closed(f, sl);
			return;
		}
		sl->sent = true;
	}
	if (rev & (POLLIN | POLLERR | POLLHUP)) {
		ssize_t n = recv(sl->fd, buf, sizeof(buf), MSG_DONTWAIT);

		if (n > 0)
			f->challenges++;   /* the challenge: never answered */
		else if (n == 0 || (errno != EAGAIN && errno != EINTR))
			flood_closed(f, sl);
	}
}

static volatile sig_atomic_t g_flood_stop;

static void flood_on_term(int sig)
{
	(void)sig;
	g_flood_stop = 1;
}

static int cmd_handshake_flood(const char *hostport, int seconds, unsigned conns,
			       const char *sources)
{
	static struct flood_slot sl[FLOOD_MAX];
	static struct pollfd p[FLOOD_MAX];
	static struct flood f;
	struct proto_peer_msg m = { .type = PEER_MSG_AUTH_HELLO, .version = PROTO_PEER_VERSION,
				    .suite = PROTO_PEER_SUITE };
	uint64_t end = now_ms() + (uint64_t)seconds * 1000u;
	char *data;
	size_t len;

	if (conns == 0 || conns > FLOOD_MAX || flood_parse(&f, hostport, sources))
		return usage();
	peer_auth_random(m.nonce);
	if (proto_peer_frame(&m, &data, &len) || len > sizeof(f.hello))
		return 2;
	memcpy(f.hello, data, len);
	f.hello_len = len;
	free(data);
	for (unsigned i = 0; i < conns; i++) {
		sl[i].fd = -1;
		sl[i].t_reopen = 0;
	}
	signal(SIGTERM, flood_on_term);   /* SIGTERM ends it early, reporting */
	while (now_ms() < end && !g_flood_stop) {
		uint64_t t = now_ms();

		for (unsigned i = 0; i < conns; i++) {
			if (sl[i].fd < 0 && t >= sl[i].t_reopen)
				flood_open(&f, &sl[i]);
			p[i] = (struct pollfd){ .fd = sl[i].fd,
						.events = POLLIN | (sl[i].sent ? 0 : POLLOUT) };
		}
		if (poll(p, conns, 5) <= 0)
			continue;
		for (unsigned i = 0; i < conns; i++)
			if (sl[i].fd >= 0 && p[i].revents)
				flood_event(&f, &sl[i], p[i].revents);
	}
	printf("opened=%llu closed_at_once=%llu closed_held=%llu challenges=%llu\n",
	       f.opened, f.closed_at_once, f.closed_held, f.challenges);
	for (unsigned i = 0; i < conns; i++)
		if (sl[i].fd >= 0)
			close(sl[i].fd);
	return 0;
}

static int usage(void)
{
	fprintf(stderr,
		"usage: kvd_attack --log PREFILL_LOG [--key FILE] abort-flood HOST:PORT SECONDS\n"
		"       kvd_attack --log PREFILL_LOG [--key FILE] [--source IP] hold HOST:PORT TOKENS COUNT SECONDS\n"
		"                  [--keep-sending] [--no-read-data] [--links N]\n"
		"       kvd_attack --log PREFILL_LOG [--key FILE] junk-flood HOST:PORT COUNT\n"
		"       kvd_attack handshake-flood HOST:PORT SECONDS CONNS SOURCES\n");
	return 64;
}

/* hold HOST:PORT TOKENS COUNT SECONDS [--keep-sending] [--no-read-data]
 * [--links N] */
static int hold_main(int argc, char **argv)
{
	int keep_sending = 0;
	unsigned links = 1;

	for (int i = 6; i < argc; i++) {
		if (!strcmp(argv[i], "--keep-sending"))
			keep_sending = 1;
		else if (!strcmp(argv[i], "--no-read-data"))
			g_no_read_data = 1;
		else if (!strcmp(argv[i], "--links") && i + 1 < argc)
			links = (unsigned)strtoul(argv[++i], NULL, 10);
		else
			return usage();
	}
	if (links < 1 || links > HOLD_LINKS_MAX)
		return usage();
	return cmd_hold(argv[2], (uint32_t)strtoul(argv[3], NULL, 10),
			(unsigned)strtoul(argv[4], NULL, 10), atoi(argv[5]),
			keep_sending, links);
}

int main(int argc, char **argv)
{
	signal(SIGPIPE, SIG_IGN);
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (peer_auth_global_init())
		return 2;
	while (argc > 2 && (!strcmp(argv[1], "--log") || !strcmp(argv[1], "--key") ||
			    !strcmp(argv[1], "--source"))) {
		if (!strcmp(argv[1], "--log")) {
			g_log = argv[2];
		} else if (!strcmp(argv[1], "--source")) {
			g_source = argv[2];
		} else {
			uint8_t buf[KVD_KEYFILE_MAX];
			char why[600];
			size_t len;

			if (kvd_keyfile_read(argv[2], buf, &len, why, sizeof(why)) ||
			    peer_key_init(&g_key, buf, len)) {
				fprintf(stderr, "kvd_attack: %s\n", why);
				return 2;
			}
		}
		argc -= 2;
		argv += 2;
	}
	if (argc == 4 && !strcmp(argv[1], "abort-flood"))
		return cmd_abort_flood(argv[2], atoi(argv[3]));
	if (argc == 4 && !strcmp(argv[1], "junk-flood"))
		return cmd_junk_flood(argv[2], (unsigned)strtoul(argv[3], NULL, 10));
	if (argc == 6 && !strcmp(argv[1], "handshake-flood"))
		return cmd_handshake_flood(argv[2], atoi(argv[3]),
					   (unsigned)strtoul(argv[4], NULL, 10), argv[5]);
	if (argc >= 6 && !strcmp(argv[1], "hold"))
		return hold_main(argc, argv);
	return usage();
}
