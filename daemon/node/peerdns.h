/* peerdns.h - peers by name: a peers.prefill entry name:port (peerdns.c).
 *
 * A decode node resolves each name on its loop (uv_getaddrinfo: the
 * system resolver in libuv's thread pool, never the loop thread), again
 * every peers.resolve_interval_ms and whenever one of the name's links
 * reconnects; every address of the answer becomes a dialled link
 * (link.c), an address that leaves it is drained. The struct is private
 * to peerdns.c; the pure parts below are what the unit test reaches.
 * Loop thread only.
 */
#pragma once

#include <netdb.h>
#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "conf/config.h"
#include "conf/list.h"

struct serve;
struct link_ops;

/* "ip:port" or "[ipv6]:port", the form link.c dials: an IPv6 address
 * (45) in brackets, a colon and 5 digits fit. */
#define PEERDNS_ADDR_LEN 56
/* Addresses one answer may give (more are logged and ignored): at most
 * the peers a node dials in all. */
#define PEERDNS_ANSWER_MAX KVD_MAX_PEERS
/* getaddrinfo entries read from one answer (one per address and socket
 * kind; duplicates are common): the walk is bounded even for a resolver
 * that returns thousands. */
#define PEERDNS_WALK_MAX 1024u

typedef char peerdns_addr[PEERDNS_ADDR_LEN];

/* One peers.prefill name. Freed once its timer has closed and no
 * resolution is in flight (pending). */
struct peerdns_name {
	struct serve *s;
	const struct link_ops *ops;      /* its links' (decode's) */
	struct kvd_list node;            /* s->dns_names */
	char name[KVD_PEER_NAME_MAX + 1];
	char port[6];                    /* decimal: every address's port */
	uv_timer_t timer;                /* peers.resolve_interval_ms */
	uv_getaddrinfo_t req;
	bool resolving;                  /* req is in flight */
	bool again;                      /* asked again meanwhile */
	bool stopped;
	uint32_t pending;                /* timer open + req in flight */
	int last_error;                  /* the last failure logged (0: the
					  * last resolution succeeded) */
};

/* An answer as text: each address of ai (bounded walk) with `port`,
 * each once, in the answer's order, at most max into out; *extra counts
 * the distinct ones past max, up to PEERDNS_ANSWER_MAX (more: at least
 * that many). Returns how many went to out. Pure. */
uint32_t peerdns_answer(const struct addrinfo *ai, const char *port,
			peerdns_addr *out, uint32_t max, uint32_t *extra);

/* The change from `have` (the addresses a name's live links dial) to
 * `want` (its new answer): stays[i] when have[i] is in want (else it is
 * drained), fresh[j] when want[j] is not in have (it gets a link).
 * Returns how many changed (drained + fresh). Pure. */
uint32_t peerdns_diff(const peerdns_addr *have, uint32_t n_have,
		      const peerdns_addr *want, uint32_t n_want,
		      bool *stays, bool *fresh);
