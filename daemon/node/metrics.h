/* metrics.h - the node's Prometheus metrics (text exposition format 0.0.4).
 *
 * struct kvd_metrics is embedded in struct kvd_daemon (zeroed with it)
 * and holds what the daemon's other figures do not: per-tenant request
 * outcomes, token counts and latency histograms, integrity failures by
 * kind, transfer bytes and times. Serving code records events with the
 * kvd_metrics_* calls where they happen; kvd_metrics_render() adds the
 * figures the node already keeps (pool pages by state, capacity,
 * counters, peers) and prints the whole text.
 *
 * Tenants: label sets are bounded. The first KVD_METRICS_TENANTS - 1
 * distinct tenant names get their own series; every later one is folded
 * into tenant="other" (kvd_metrics_tenants_folded_total counts requests
 * so folded). Names are cut to KVD_TENANT_MAX - 1 bytes and escaped at
 * render time; an empty name is "default".
 *
 * Loop thread only (every recording call and the render).
 */
#pragma once

#include "conf/apikeys.h"
#include "net/wire/openai.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct kvd_daemon;

#define KVD_TENANT_MAX 64              /* bytes, NUL included */
#define KVD_METRICS_TENANTS 32         /* series per tenant-labelled metric */
#define KVD_TENANT_DEFAULT "default"   /* msgpack-socket requests */
#define KVD_TENANT_OTHER "other"       /* tenants past the bound */
_Static_assert(KVD_TENANT_MAX > KVD_APIKEY_TENANT_MAX,
	       "a keys file's tenant fits a request's tenant uncut");

/* How a client request ended: stop, length, abandoned (the client left
 * before an answer), or the error code's name (net/wire/proto_client.h). */
#define KVD_OUTCOME_STOP 0
#define KVD_OUTCOME_LENGTH 1
#define KVD_OUTCOME_ABANDONED 2
#define KVD_OUTCOME_ERR0 3             /* + PROTO_ERR_* - 1 */
#define KVD_OUTCOME__N (KVD_OUTCOME_ERR0 + 8)

/* Integrity failures by what caught them. */
enum kvd_integrity_kind {
	KVD_INTEGRITY_TAG = 0,    /* a page's tag, owner or coverage in the pool */
	KVD_INTEGRITY_CHECKSUM,   /* a KV batch's checksum */
	KVD_INTEGRITY_MAC,        /* a KV batch's authentication (keyed links) */
	KVD_INTEGRITY_TRANSFER,   /* a batch's entries, coverage, non-finite KV,
				   * a first token out of the vocabulary */
	KVD_INTEGRITY_PEER,       /* the prefill peer reported one */
	KVD_INTEGRITY__N,
};

/* Peer authentication failures (invariant 11) by what failed. */
enum kvd_peer_auth_kind {
	KVD_PEER_AUTH_PROOF = 0,  /* a handshake proof did not verify */
	KVD_PEER_AUTH_TOKEN,      /* a data connection's token */
	KVD_PEER_AUTH_FRAME,      /* a sealed control frame did not open */
	KVD_PEER_AUTH_BATCH,      /* a KV batch's seal or MAC */
	KVD_PEER_AUTH__N,
};

#define KVD_HIST_BUCKETS 20            /* upper bounds; +Inf is one more */

struct kvd_hist {
	uint64_t counts[KVD_HIST_BUCKETS + 1];  /* per bucket (not cumulative);
						 * [n_bounds] is +Inf */
	uint64_t count;
	double sum;
};

struct kvd_metrics_tenant {
	char name[KVD_TENANT_MAX];
	uint64_t requests[KVD_OUTCOME__N];
	uint64_t prompt_tokens;
	uint64_t generation_tokens;
	struct kvd_hist ttft;            /* seconds, arrival to first token */
	struct kvd_hist itl;             /* seconds between two tokens */
	struct kvd_hist e2e;             /* seconds, arrival to the end */
};

enum { KVD_XFER_SEND = 0, KVD_XFER_RECV = 1 };

struct kvd_metrics {
	struct kvd_metrics_tenant tenants[KVD_METRICS_TENANTS];
	uint32_t n_tenants;              /* slots in use */
	uint64_t tenants_folded;         /* requests counted under "other" */
	uint64_t integrity[KVD_INTEGRITY__N];
	uint64_t peer_auth[KVD_PEER_AUTH__N];
	/* HTTP request fields accepted and ignored (net/wire/openai.h):
	 * labelled by the known names only, never a client's string */
	uint64_t http_ignored[OPENAI_IGNORED__N];
	uint64_t xfer_bytes[2];          /* [KVD_XFER_SEND/RECV] KV payload */
	uint64_t xfer_batches[2];
	struct kvd_hist xfer_time[2];    /* send: first batch queued -> last
					  * reported sent (prefill); recv:
					  * prefill_request sent -> KV received
					  * and checked (decode; includes
					  * prefill's compute) */
};

/* ---- recording -------------------------------------------------------------- */

/* A client request ended: `finish` ("stop"/"length") when it was
 * answered, else `code` (a PROTO_ERR_*; 0 with no finish: abandoned).
 * e2e_ns: arrival to end, or 0 for a request refused before it had one
 * (not observed). */
void kvd_metrics_request_end(struct kvd_metrics *m, const char *tenant,
			     const char *finish, int code, uint64_t e2e_ns);
/* A token went out. first: the request's first (its prompt_tokens are
 * counted now and ttft observed); otherwise gap_ns since the previous one
 * is an inter-token latency. */
void kvd_metrics_token(struct kvd_metrics *m, const char *tenant, bool first,
		       uint32_t prompt_tokens, uint64_t ns);
void kvd_metrics_integrity(struct kvd_metrics *m, enum kvd_integrity_kind k);
void kvd_metrics_peer_auth(struct kvd_metrics *m, enum kvd_peer_auth_kind k);
/* A KV batch of `bytes` payload sent or received. */
void kvd_metrics_xfer_batch(struct kvd_metrics *m, int dir, uint64_t bytes);
/* A request's transfer took ns (see xfer_time). */
void kvd_metrics_xfer_time(struct kvd_metrics *m, int dir, uint64_t ns);

/* ---- exposition ----------------------------------------------------------- */

/* The whole text (format 0.0.4), malloc'd in *out (the caller frees it),
 * *len bytes. 0 or -ENOMEM. */
int kvd_metrics_render(struct kvd_daemon *d, char **out, size_t *len);
/* Escape a label value for the text format (\\ \" \n; control bytes and
 * invalid UTF-8 become U+FFFD). Writes at most outsz bytes with the NUL;
 * returns the length it needed (like snprintf). */
size_t kvd_metrics_escape(const char *in, char *out, size_t outsz);
/* The outcome label of a KVD_OUTCOME_* index ("?" out of range). */
const char *kvd_metrics_outcome_name(unsigned i);
