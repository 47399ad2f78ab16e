/* daemon.h - one kvd node: its loop, configuration, model, pool and state.
 *
 * main() builds exactly one struct kvd_daemon and runs it; there is no
 * global state. Everything here is owned by the loop thread: other threads
 * (compute workers) reach the daemon only through a queue and a uv_async_t.
 *
 * Lifecycle: kvd_daemon_init() loads the config'd model, builds the pool,
 * runs the boot capacity check (logging event=kv_capacity) and, if the
 * verdict allows, opens listeners; kvd_daemon_run() runs the loop until
 * SIGTERM/SIGINT or kvd_daemon_stop(); kvd_daemon_deinit() closes every
 * handle and frees the pool (safe twice).
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "conf/config.h"
#include "conf/fingerprint.h"
#include "conf/log.h"
#include "gpu/text/chat.h"
#include "gpu/gguf/gguf.h"
#include "gpu/kv/kvmem.h"
#include "gpu/kv/kvpool.h"
#include "daemon/node/metrics.h"
#include "net/transport.h"
#include "daemon/node/request.h"

/* Exit status of a node whose model bytes are not what the fingerprint
 * cache named (EX_DATAERR; systemd's Restart=on-failure restarts it, and
 * that start hashes the file in full). */
#define KVD_EX_FINGERPRINT 65

enum {
	KVD_E_CAPACITY = 1,  /* pool cannot hold the context (policy refuse) */
	KVD_E_MODEL,         /* model file cannot be used */
	KVD_E_DRAINING,      /* node is draining: admits nothing new */
	KVD_E_BUSY,          /* an operation of that kind is already running */
	KVD_E_NOTFOUND,      /* no such request */
};

enum kvd_state {
	KVD_STATE_STARTING = 0,
	KVD_STATE_READY,
	KVD_STATE_DRAINING,
	KVD_STATE_DRAINED,
	KVD_STATE_STOPPING,
};

/* Typed reasons a request is refused at admission (counted per reason). */
enum kvd_reject {
	KVD_REJECT_PROMPT_TOO_LONG = 0,
	KVD_REJECT_INVALID,
	KVD_REJECT_OVERLOADED,
	KVD_REJECT_DRAINING,
	KVD_REJECT_NO_PEER,
	KVD_REJECT__N,
};

struct kvd_counters {
	uint64_t admitted;
	uint64_t rejected[KVD_REJECT__N];
	uint64_t completed;
	uint64_t failed;
	uint64_t integrity_failures;
	uint64_t peer_auth_failures;  /* proofs, tokens, sealed frames refused */
	uint64_t verbs_flush_timeouts; /* verbs links whose flush never came
					* (their pages quarantined) */
	uint64_t checksum_ns;         /* time spent checksumming KV batches */
	uint64_t release_timeouts;    /* prefill: pages released without ack */
	uint64_t send_timeouts;       /* prefill: requests ended at the send
				       * deadline (transfer.send_timeout_ms) */
	uint64_t drain_aborts;        /* requests aborted at the drain deadline */
	uint64_t failovers;           /* decode: requests placed again after
				       * their prefill was lost or refused
				       * (peers.failover_retries) */
	struct transport_verbs_stats verbs;  /* RDMA: inline headers, credits */
};

/* What the serving layer knows of its peers (handshake figures), kept
 * here so every kv_capacity line carries them. */
struct kvd_peer_figures {
	uint32_t up;                  /* peers with a completed handshake */
	uint64_t min_pool_tokens;     /* smallest peer pool; 0 when none */
	uint32_t min_context;         /* smallest peer advertised context */
};

/* The result of one capacity check (invariant 4). */
struct kvd_capacity {
	uint64_t pool_tokens;         /* pages * page_tokens */
	uint32_t pages;
	uint32_t page_tokens;
	uint64_t page_bytes;
	uint64_t kv_bytes_per_token;
	uint32_t context_length;      /* configured (or the model's) */
	double margin;
	uint64_t required_tokens;     /* ceil(context_length * margin) */
	bool ok;                      /* pool_tokens >= required_tokens */
	uint32_t advertised_context;  /* context admitted; clamped if so */
	/* the path through the peers: admission never exceeds this */
	uint32_t peers;
	uint64_t peer_min_pool_tokens;
	uint32_t path_context;        /* min(advertised, peers' context, pool) */
};

struct pcache;

/* A request waiting at the tenant gate (daemon/node/gate.c), as admin sees it. */
struct kvd_waiting {
	uint64_t id;                  /* its registry id (kept at admission) */
	char public_id[48];           /* what its client was given; "" none */
	char tenant[64];
	uint32_t prompt_tokens, max_tokens;
	uint64_t waited_ms;
	bool held;                    /* held back for a same-prefix request */
};

/* The serving layer's admission queues, which admin and metrics (below
 * it) read through this hook; all NULL until serving starts and after it
 * stops. Loop thread only. */
struct kvd_queue_hook {
	void *arg;
	/* Requests waiting now: fills up to max (oldest first), returns how
	 * many wait. */
	uint32_t (*waiting)(void *arg, struct kvd_waiting *out, uint32_t max);
	/* Take the waiting request with registry id `id` (pid non-NULL: with
	 * that public id) out of its queue; its client is answered that the
	 * operator aborted it. 0 (*id set) or KVD_E_NOTFOUND. */
	int (*abort)(void *arg, uint64_t *id, const char *pid);
};

struct kvd_daemon {
	uv_loop_t loop;
	struct kvlog log;
	struct kvd_config cfg;

	/* model */
	struct gguf_file *model;
	struct llama_hparams hp;
	char model_sha256[65];
	/* transfer.transport = verbs: the write scope decode uses
	 * (memory_windows, per_request_mr), resolved at boot; "" on tcp */
	char verbs_write_scope[24];
	/* ... and the inline size its QPs use for batch headers
	 * (transfer.verbs_inline, or what the device granted with auto),
	 * resolved at boot; 0 on tcp */
	uint32_t verbs_inline;
	/* The chat prompt format, resolved once at boot (model.chat_template,
	 * or the GGUF's tokenizer.chat_template recognized by gpu/text/chat.h):
	 * CHAT_NONE when neither gives one; chat requests are then refused
	 * and completions still served. */
	enum chat_format chat_format;

	/* KV pool */
	struct kvmem mem;
	struct kvpool *pool;
	struct kvd_capacity cap;
	/* the prefix cache on that pool (cache.enabled; NULL: off), and the
	 * fingerprint its keys start from: SHA-256 of the model's and the
	 * page layout's (gpu/kv/pcache.h) */
	struct pcache *cache;
	uint8_t cache_fp[32];

	enum kvd_state state;
	uint64_t start_ns;
	struct kvd_counters counters;
	struct kvd_metrics metrics;   /* daemon/node/metrics.h: per tenant, by kind */
	uint32_t in_flight;           /* admitted requests not yet terminal */
	struct kvd_peer_figures peers; /* set by the serving layer */

	uv_signal_t sigterm;
	uv_signal_t sigint;
	uv_signal_t sighup;           /* reload: the reload hook */
	bool signals_open;
	/* SIGHUP: the serving layer's reload (its API keys); fn NULL before
	 * it started and once it stopped (the daemon cannot call up). */
	struct kvd_reload_hook {
		void (*fn)(struct kvd_daemon *d, void *arg);
		void *arg;
	} reload;

	struct admin_server *admin;   /* ctl/admin.h; NULL without a socket */
	/* Every admitted request, whoever owns it: reach it through
	 * kvd_daemon_requests() (daemon/node/request.h), which initialises it on
	 * first use, so admin abort/status and drain see all of them. */
	struct kvd_reqtab requests;
	struct kvd_queue_hook queue;  /* set by the serving layer */
	int exit_code;
	/* How the model's fingerprint was found at boot; a cache hit is
	 * verified in full off the loop (daemon/node/fpcheck.h), NULL when none
	 * runs. */
	struct kvd_fp_info fp;
	struct fpcheck *fpcheck;

	/* Upper layers (ctl/, later net/ listeners) register a hook that
	 * closes their handles when the node stops; the daemon layer cannot
	 * call up into them. Run in reverse order of registration. */
	struct kvd_stop_hook {
		void (*fn)(struct kvd_daemon *d, void *arg);
		void *arg;
	} stop_hooks[8];
	unsigned n_stop_hooks;

	uv_timer_t drain_timer;       /* drain deadline (kvctl drain, SIGTERM) */
	bool stop_after_drain;        /* SIGTERM drain: stop when drained */
	uv_timer_t watchdog_timer;    /* sd_notify WATCHDOG=1 */
	bool timers_open;
};

#define KVD_DAEMON_NULL { .exit_code = 0 }

const char *kvd_state_name(enum kvd_state s);
const char *kvd_reject_name(enum kvd_reject r);

/* Build the node from a loaded, validated config. Returns 0; KVD_E_CAPACITY
 * (exit 78) or KVD_E_MODEL when the node must not start; negative errno on
 * system failure. On any error the daemon is left deinit-able. */
int kvd_daemon_init(struct kvd_daemon *d, const struct kvd_config *cfg);
/* Every listener is up: become READY (sd_notify READY=1). */
void kvd_daemon_ready(struct kvd_daemon *d);
/* Register a stop hook (see stop_hooks). -ENOSPC when full. */
int kvd_daemon_on_stop(struct kvd_daemon *d,
		       void (*fn)(struct kvd_daemon *d, void *arg), void *arg);
int kvd_daemon_run(struct kvd_daemon *d);
/* Stop now: run the stop hooks, close every daemon handle; uv_run then
 * returns once the close callbacks have run. Safe twice. */
void kvd_daemon_stop(struct kvd_daemon *d);
/* SIGTERM path: stop admitting (DRAINING), stop when in_flight reaches 0;
 * in-flight work is aborted after node.drain_timeout_ms, and the node
 * stops anyway two release timeouts later. */
void kvd_daemon_drain_and_stop(struct kvd_daemon *d);
/* A drain began (DRAINING): after node.drain_timeout_ms abort what is
 * still in flight (see daemon.c). Disarm: the drain ended or resumed. */
void kvd_daemon_drain_arm(struct kvd_daemon *d);
void kvd_daemon_drain_disarm(struct kvd_daemon *d);
/* Tell systemd (no-op without libsystemd or NOTIFY_SOCKET). */
void kvd_daemon_notify_status(struct kvd_daemon *d, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
/* Called by request owners when in_flight drops; completes a drain. */
void kvd_daemon_in_flight_changed(struct kvd_daemon *d);
void kvd_daemon_deinit(struct kvd_daemon *d);

/* Compute the capacity figures for the current pool and config, log one
 * event=kv_capacity line (reason: "boot", "resize", "peer", "admin"). */
void kvd_daemon_capacity(struct kvd_daemon *d, const char *reason,
			 struct kvd_capacity *out);

/* Pure capacity arithmetic (no logging): for a pool of `pages` pages. */
void kvd_capacity_compute(const struct kvd_config *cfg,
			  const struct llama_hparams *hp, uint32_t pages,
			  struct kvd_capacity *out);
/* Pages the configured kv.pool_tokens / kv.memory_bytes give. */
int kvd_capacity_pages(const struct kvd_config *cfg,
		       const struct llama_hparams *hp, uint32_t *pages);
