/* req.h - one serving request: a core every kind shares
 * (client, prompt, tenant, engine, link, timer, failure) and a per-kind
 * part (decode or local: the pages and the transfer; prefill: the peer's
 * request and the sending), and its life (req.c).
 *
 * Private to the node's serving core (daemon/node/serve_int.h includes
 * it with the other objects' headers). Loop thread only.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "conf/apikeys.h"
#include "conf/list.h"
#include "daemon/node/compute.h"
#include "daemon/node/fairq.h"
#include "daemon/node/machine.h"
#include "daemon/node/metrics.h"
#include "daemon/node/request.h"
#include "gpu/kv/kvpool.h"
#include "gpu/sampler.h"
#include "gpu/text/jsongram.h"
#include "gpu/text/tokenizer.h"
#include "net/wire/proto_client.h"
#include "net/wire/proto_peer.h"
#include "net/xfer_check.h"

struct serve;
struct serve_req;
struct serve_sink;
struct link;

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

/* The part of a decode request (and of a local one, which uses only its
 * page table): the pages it reads and the transfer that fills them. */
struct sreq_decode {
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
	uint32_t first_token;
	uint32_t done_tokens, done_batches, done_pages;
	uint64_t prefill_id;             /* prefill's id for it (prefill_done;
					  * 0: none yet, or an older prefill) */
	char prefill_node[64];           /* ... and its node name (hello) */
	uint32_t peer_batches;           /* the most batches prefill said it
					  * posted (abort, abort_ack): what a
					  * verbs fence must wait for; TCP
					  * only logs it */
	uint32_t batches_landed;         /* verbs: batches of it completed
					  * here (every write landed) */
};

/* The part of a prefill request: the peer's request and the sending. */
struct sreq_prefill {
	uint64_t remote_id;              /* decode's request id */
	char decode_node[64];            /* its node name (hello), for the
					  * end line (prefill_served) */
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
	uint32_t first_token;            /* what prefill_done reports */
	uint32_t done_tokens, done_pages;
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
	struct sampler_params sp;        /* sp.logit_bias: bias */
	struct sampler_bias *bias;       /* (sp.n_logit_bias) owned, or NULL */
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
	bool shares_prompt;              /* a later choice of an HTTP n > 1
					  * request: choice 0 computes the
					  * prompt, this one maps its cached
					  * pages, so it holds nobody (gate.c) */
	uint32_t gate_unsettled;         /* pages admitted, not yet reserved
					  * by the engine (counted in
					  * serve.gate_unsettled) */
	char cache_salt[PROTO_CLIENT_SALT_MAX + 1]; /* "" = none (gpu/kv/pcache.h) */
	uint32_t cached_tokens;          /* prompt tokens the prefix cache gave */
	uint32_t n_out;
	struct detok dt;
	bool dt_init;
	bool answered;                   /* final or error sent (or client gone) */
	bool client_left;                /* its client went away mid-way
					  * (serve__sink_leave): nobody to
					  * answer, not a failure */
	bool final_ok;                   /* the final event was the answer */
	char finish_reason[8];           /* "stop" | "length", for the final */
	int32_t last_token;              /* the engine's token being streamed */
	const struct sampler_logprobs *last_lp; /* ... its logprobs (asked
					  * for), valid while it streams */
	/* response_format json: the grammar and the run the engine masks
	 * with (gpu/text/jsongram.h), NULL for text; the compute thread uses
	 * the run until the engine request is freed, so both go with r */
	struct jgram *gram;
	struct jgram_run *jrun;

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
	uint64_t peer_serial;            /* decode: the serial of the link it
					  * was last placed on (0: none), kept
					  * after it is detached: where a later
					  * choice of its exchange goes
					  * (decode.c decode_sibling_peer) */
	uint32_t link_pages;             /* counted in link->n_pages */
	/* decode failover (peers.failover_retries): how often it was placed
	 * again; while its retry step runs, the link it leaves (never
	 * dereferenced after that step) and why ("link_lost", "reject") */
	uint8_t failovers;
	const struct link *fo_from;
	const char *fo_why;
	char peer_node[64];              /* prefill: the decode node it
					  * serves (link.node_addr), kept
					  * after its link is gone: it counts
					  * against that node's caps until it
					  * ends */

	/* what differs by kind: sreq_d() and sreq_p() reach it, asserting
	 * the kind */
	union {
		struct sreq_decode d;    /* SREQ_DECODE, SREQ_LOCAL */
		struct sreq_prefill p;   /* SREQ_PREFILL */
	} part;

	uv_timer_t timer;                /* phase timeout / slow_batch */
	int fail_code;                   /* enum proto_err, 0 while healthy */
	char fail_msg[PROTO_CLIENT_MSG_MAX + 1];
};

/* A request's per-kind part (req.c); asking for the wrong kind's is a
 * bug (the node stops, naming it). */
struct sreq_decode *sreq_d(struct serve_req *r);
struct sreq_prefill *sreq_p(struct serve_req *r);
const struct sreq_decode *sreq_dc(const struct serve_req *r);
const struct sreq_prefill *sreq_pc(const struct serve_req *r);

/* req.c */
struct serve_req *serve__req_new(struct serve *s, enum serve_req_kind kind);
/* Choice i (> 0) of an HTTP n > 1 request whose choice 0 is `first`: a
 * request of its own with first's prompt, parameters (seed + i),
 * tenant, cache_salt, public and client ids, shares_prompt, the role's
 * kind (never first's), and with first's grammar a reference to it and
 * `run` (taken on success; NULL without a grammar). No sink. NULL
 * without memory (run still the caller's). Loop thread. */
struct serve_req *serve__req_choice_new(const struct serve_req *first, uint32_t i,
					struct jgram_run *run);
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
