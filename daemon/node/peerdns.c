/* peerdns.c - peers by name (peerdns.h).
 *
 * Design. A peers.prefill entry name:port is a struct peerdns_name. It
 * owns no link: the links of a name are the dialled links in s->links
 * whose `dns` points at it, so what the name "has" is always what is
 * there (a link that was retired is simply gone). Resolving is
 * uv_getaddrinfo on the node's loop (the lookup runs in libuv's thread
 * pool; its callback on the loop), at start, every
 * peers.resolve_interval_ms (a repeating timer) and whenever one of the
 * name's links reconnects (link_ops.redial); one lookup per name at a
 * time, a request meanwhile runs once it ends. Nothing else of kvd uses
 * libuv's thread pool, so a slow resolver delays only its own names'
 * next answers (at most KVD_MAX_PEERS lookups, one per name).
 *
 * An answer is read into text addresses (peerdns_answer: each address
 * once, at most PEERDNS_ANSWER_MAX, the walk bounded) and compared with
 * the addresses the name's live links dial (peerdns_diff, pure):
 *   - an address that left the answer is drained (serve__link_drain): no
 *     new request is placed on its link, the requests on it finish, then
 *     link.c's tick closes it for good; nothing is cut;
 *   - a new address gets a link, unless the node dials it already (then
 *     nothing), or dials KVD_MAX_PEERS links (then it is logged and left
 *     out until one goes), or it is off loopback while the node has no
 *     cluster key: the keyless loopback rule (conf/config.c) applies to
 *     what a name resolves to, so such an address is refused, logged;
 *   - an address that comes back while its link still drains takes that
 *     link back.
 * A failed lookup changes nothing: the name keeps its links and is
 * resolved again at the interval (a resolver that is briefly down must
 * not drain a cluster). Every change is one log line: peer_dns_add,
 * peer_dns_drain, peer_dns_error (name, addr, msg; link.c logs
 * peer_drained when a drained link closes).
 *
 * Teardown (serve__peerdns_stop, before link.c's): each name's timer
 * closes and a lookup in flight is cancelled (its callback still comes,
 * with UV_ECANCELED or its result, which is dropped); the name is freed
 * after both, counted in s->closes_pending so the loop closes clean. A
 * lookup already running cannot be stopped: the node's exit waits for it
 * (at most the resolver's own timeout, resolv.conf's timeout x attempts).
 *
 * Calls link.c; decode.c and serve.c call it.
 */
#include "daemon/node/serve_int.h"
#include "daemon/node/peerdns.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- pure parts ------------------------------------------------------------- */

/* sa as "ip:port" / "[ipv6]:port". 0, or -1 for another family. */
static int peerdns_addr_text(const struct sockaddr *sa, const char *port,
			     peerdns_addr out)
{
	char ip[INET6_ADDRSTRLEN];

	if (sa->sa_family == AF_INET &&
	    inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, ip, sizeof(ip))) {
		snprintf(out, PEERDNS_ADDR_LEN, "%s:%s", ip, port);
		return 0;
	}
	if (sa->sa_family == AF_INET6 &&
	    inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr, ip, sizeof(ip))) {
		snprintf(out, PEERDNS_ADDR_LEN, "[%s]:%s", ip, port);
		return 0;
	}
	return -1;
}

static bool peerdns_has(const peerdns_addr *set, uint32_t n, const char *a)
{
	for (uint32_t i = 0; i < n; i++)
		if (!strcmp(set[i], a))
			return true;
	return false;
}

uint32_t peerdns_answer(const struct addrinfo *ai, const char *port,
			peerdns_addr *out, uint32_t max, uint32_t *extra)
{
	/* the distinct addresses past max, remembered (and counted) up to
	 * PEERDNS_ANSWER_MAX: enough to say how many were left out, or
	 * that at least so many were */
	peerdns_addr seen[PEERDNS_ANSWER_MAX];
	uint32_t n = 0, n_seen = 0, walked = 0;
	peerdns_addr a;

	*extra = 0;
	for (; ai && walked < PEERDNS_WALK_MAX; ai = ai->ai_next, walked++) {
		if (!ai->ai_addr || peerdns_addr_text(ai->ai_addr, port, a))
			continue;
		if (peerdns_has(out, n, a) || peerdns_has(seen, n_seen, a))
			continue;
		if (n < max) {
			memcpy(out[n++], a, sizeof(a));
			continue;
		}
		if (n_seen < PEERDNS_ANSWER_MAX)
			memcpy(seen[n_seen++], a, sizeof(a));
	}
	*extra = n_seen;
	return n;
}

uint32_t peerdns_diff(const peerdns_addr *have, uint32_t n_have,
		      const peerdns_addr *want, uint32_t n_want,
		      bool *stays, bool *fresh)
{
	uint32_t changed = 0;

	for (uint32_t i = 0; i < n_have; i++) {
		stays[i] = peerdns_has(want, n_want, have[i]);
		changed += !stays[i];
	}
	for (uint32_t j = 0; j < n_want; j++) {
		fresh[j] = !peerdns_has(have, n_have, want[j]);
		changed += fresh[j];
	}
	return changed;
}

/* ---- the name's links ------------------------------------------------------- */

bool serve__peerdns_is_name(const char *entry)
{
	char host[KVD_PEER_NAME_MAX + 1];
	uint16_t port;

	return kvd_peer_name_split(entry, host, &port) == 0;
}

/* The name's live (not draining) links and their addresses, at most
 * KVD_MAX_PEERS (what the node dials in all). */
static uint32_t peerdns_have(struct peerdns_name *n, struct link **links,
			     peerdns_addr *addrs)
{
	struct kvd_list *e;
	uint32_t k = 0;

	kvd_list_for_each(e, &n->s->links) {
		struct link *l = kvd_list_entry(e, struct link, node);

		size_t len = strlen(l->addr);

		/* a name's link dials an address of peerdns_answer's form */
		if (l->side != LINK_DIAL || l->dns != n || l->draining || k == KVD_MAX_PEERS ||
		    len >= PEERDNS_ADDR_LEN)
			continue;
		links[k] = l;
		memcpy(addrs[k++], l->addr, len + 1);
	}
	return k;
}

/* A dialled link to addr: one of this name's that drains (want_drain),
 * or any live one (a configured address, or another name's). */
static struct link *peerdns_find(struct peerdns_name *n, const char *addr, bool want_drain)
{
	struct kvd_list *e;

	kvd_list_for_each(e, &n->s->links) {
		struct link *l = kvd_list_entry(e, struct link, node);

		if (l->side != LINK_DIAL || strcmp(l->addr, addr))
			continue;
		if (want_drain ? (l->dns == n && l->draining) : !l->draining)
			return l;
	}
	return NULL;
}

static uint32_t peerdns_dials(struct serve *s)
{
	struct kvd_list *e;
	uint32_t k = 0;

	kvd_list_for_each(e, &s->links)
		k += kvd_list_entry(e, struct link, node)->side == LINK_DIAL;
	return k;
}

/* A new address of the name's answer: its draining link back, or a new
 * link, unless the rules above leave it out. */
static void peerdns_fresh(struct peerdns_name *n, const char *addr)
{
	struct serve *s = n->s;
	struct link *l = peerdns_find(n, addr, true);

	if (l) {
		serve__link_drain(l, false);
		KVLOG_INFO(s->log, "peer_dns_add", "name=%s addr=%s undrained=1",
			   KVLOG_Q(n->name), KVLOG_Q(addr));
		return;
	}
	if (peerdns_find(n, addr, false))
		return;         /* dialled already: one link per address */
	if (!s->key.set && !kvd_hostport_is_loopback(addr)) {
		KVLOG_RL_WARN(s->log, &s->rl[SERVE_RL_PEER_PROTOCOL], "peer_dns_error",
			      "name=%s addr=%s msg=\"not a loopback address: set peers.key_file so peers must prove they hold the cluster secret\"",
			      KVLOG_Q(n->name), KVLOG_Q(addr));
		return;
	}
	if (peerdns_dials(s) >= KVD_MAX_PEERS) {
		KVLOG_RL_WARN(s->log, &s->rl[SERVE_RL_PEER_PROTOCOL], "peer_dns_error",
			      "name=%s addr=%s msg=\"left out: the node dials %d peers already\"",
			      KVLOG_Q(n->name), KVLOG_Q(addr), KVD_MAX_PEERS);
		return;
	}
	if (serve__link_dial(s, addr, n->ops, n)) {
		KVLOG_WARN(s->log, "peer_dns_error", "name=%s addr=%s msg=\"out of memory\"",
			   KVLOG_Q(n->name), KVLOG_Q(addr));
		return;
	}
	KVLOG_INFO(s->log, "peer_dns_add", "name=%s addr=%s", KVLOG_Q(n->name), KVLOG_Q(addr));
}

/* The name's links follow its answer (want, n_want addresses). */
static void peerdns_apply(struct peerdns_name *n, const peerdns_addr *want, uint32_t n_want)
{
	struct link *links[KVD_MAX_PEERS];
	peerdns_addr have[KVD_MAX_PEERS];
	bool stays[KVD_MAX_PEERS], fresh[PEERDNS_ANSWER_MAX];
	uint32_t n_have = peerdns_have(n, links, have);

	if (!peerdns_diff(have, n_have, want, n_want, stays, fresh))
		return;
	for (uint32_t i = 0; i < n_have; i++) {
		if (stays[i])
			continue;
		serve__link_drain(links[i], true);
		KVLOG_INFO(n->s->log, "peer_dns_drain", "name=%s addr=%s requests=%u",
			   KVLOG_Q(n->name), KVLOG_Q(have[i]), links[i]->n_reqs);
	}
	for (uint32_t j = 0; j < n_want; j++)
		if (fresh[j])
			peerdns_fresh(n, want[j]);
}

/* ---- resolving ---------------------------------------------------------------- */

static void peerdns_resolve(struct peerdns_name *n);

/* One of a stopped name's handles is done; after the last it goes. */
static void peerdns_release(struct peerdns_name *n)
{
	n->s->closes_pending--;
	if (--n->pending == 0)
		free(n);
}

/* A lookup failed (status, a libuv error): logged when it is a new
 * failure (a resolver that stays down says so once, not every retry). */
static void peerdns_failed(struct peerdns_name *n, int status)
{
	if (status != n->last_error)
		KVLOG_WARN(n->s->log, "peer_dns_error", "name=%s msg=%s links_kept=1",
			   KVLOG_Q(n->name), KVLOG_Q(uv_strerror(status)));
	else
		KVLOG_DEBUG(n->s->log, "peer_dns_error", "name=%s msg=%s links_kept=1",
			    KVLOG_Q(n->name), KVLOG_Q(uv_strerror(status)));
	n->last_error = status;
}

static void peerdns_resolved(uv_getaddrinfo_t *req, int status, struct addrinfo *res)
{
	struct peerdns_name *n = kvd_container_of(req, struct peerdns_name, req);
	peerdns_addr want[PEERDNS_ANSWER_MAX];
	uint32_t n_want, extra = 0;

	n->resolving = false;
	if (n->stopped) {
		uv_freeaddrinfo(res);
		peerdns_release(n);
		return;
	}
	if (status < 0) {
		peerdns_failed(n, status);
	} else {
		n_want = peerdns_answer(res, n->port, want, PEERDNS_ANSWER_MAX, &extra);
		if (extra)
			KVLOG_RL_WARN(n->s->log, &n->s->rl[SERVE_RL_PEER_PROTOCOL], "peer_dns_error",
				      "name=%s msg=\"more addresses than a node dials: the first kept\" kept=%u ignored_at_least=%u",
				      KVLOG_Q(n->name), n_want, extra);
		n->last_error = 0;
		peerdns_apply(n, want, n_want);
	}
	uv_freeaddrinfo(res);
	if (n->again) {
		n->again = false;
		peerdns_resolve(n);
	}
}

static void peerdns_resolve(struct peerdns_name *n)
{
	const struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
					.ai_flags = AI_NUMERICSERV };
	int rc;

	if (n->stopped)
		return;
	if (n->resolving) {
		n->again = true;
		return;
	}
	rc = uv_getaddrinfo(&n->s->d->loop, &n->req, peerdns_resolved, n->name, n->port,
			    &hints);
	if (rc) {
		/* its callback never comes: retried at the interval */
		peerdns_failed(n, rc);
		return;
	}
	n->resolving = true;
}

static void peerdns_timer_cb(uv_timer_t *t)
{
	peerdns_resolve(kvd_container_of(t, struct peerdns_name, timer));
}

static void peerdns_timer_closed(uv_handle_t *h)
{
	peerdns_release(kvd_container_of((uv_timer_t *)h, struct peerdns_name, timer));
}

int serve__peerdns_add(struct serve *s, const char *entry, const struct link_ops *ops)
{
	struct peerdns_name *n = calloc(1, sizeof(*n));
	uint32_t every = s->d->cfg.peers_resolve_interval_ms;
	uint16_t port;
	int rc;

	if (!n)
		return -ENOMEM;
	if (kvd_peer_name_split(entry, n->name, &port)) {
		free(n);
		return -EINVAL;
	}
	snprintf(n->port, sizeof(n->port), "%u", port);
	n->s = s;
	n->ops = ops;
	rc = uv_timer_init(&s->d->loop, &n->timer);
	if (rc) {
		free(n);
		return rc;
	}
	kvd_list_add_tail(&s->dns_names, &n->node);
	uv_timer_start(&n->timer, peerdns_timer_cb, every, every);
	KVLOG_INFO(s->log, "peer_dns_name", "name=%s port=%s resolve_interval_ms=%u",
		   KVLOG_Q(n->name), n->port, every);
	peerdns_resolve(n);
	return 0;
}

void serve__peerdns_redial(struct link *l)
{
	if (l->dns)
		peerdns_resolve(l->dns);
}

void serve__peerdns_stop(struct serve *s)
{
	while (!kvd_list_empty(&s->dns_names)) {
		struct peerdns_name *n = kvd_list_entry(s->dns_names.next,
							struct peerdns_name, node);

		kvd_list_del(&n->node);
		n->stopped = true;
		n->pending = 1 + n->resolving;
		s->closes_pending += n->pending;
		/* queued: its callback comes with UV_ECANCELED; running: with
		 * its answer, dropped */
		if (n->resolving)
			(void)uv_cancel((uv_req_t *)&n->req);
		uv_close((uv_handle_t *)&n->timer, peerdns_timer_closed);
	}
}
