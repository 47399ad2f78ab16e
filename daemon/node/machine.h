/* machine.h - the request state machines of the serving layer, as data.
 *
 * Each role's request is one explicit machine: an enum of states, an
 * enum of events and one table [state][event] -> (what kind of step, the
 * next state, the actions). The serving code never sets a state by hand:
 * it computes *which* event happened (the data-dependent choices - was the
 * batch good, is the client still there - are separate events) and hands
 * it to its role's executor, which looks the step up here, changes the
 * state and performs the step's actions in one fixed order. So the table
 * is the protocol: tests/test_machine.c drives these same tables with
 * random events against a reference model of the pages, the fences, the
 * peer and the client, and tests/model/transfer.pml mirrors them state for
 * state (its comments name the row each Promela transition is).
 *
 * Three kinds of step:
 *   GO      the event is expected here: next state, actions;
 *   IGNORE  the event can legitimately arrive late here (a batch for a
 *           request that is aborting, a token queued before the free):
 *           nothing changes;
 *   BUG     the event cannot happen here unless kvd itself is wrong: the
 *           executor treats it as an invariant breach (logged, and the
 *           daemon aborts: a machine that lost track of its pages must not
 *           go on handing them out).
 *
 * Pure data and pure functions: no libuv, no pool, no sockets.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

enum machine_kind { MSTEP_BUG = 0, MSTEP_GO, MSTEP_IGNORE };

struct machine_step {
	uint8_t kind;                /* enum machine_kind */
	uint8_t next;                /* GO: the next state */
	uint32_t actions;            /* GO: the role's action bits */
};

struct machine {
	const char *name;            /* "decode", "prefill" */
	unsigned n_states, n_events;
	unsigned initial, terminal;
	const char *const *state_names;   /* (n_states) */
	const char *const *event_names;   /* (n_events) */
	const char *const *action_names;  /* (32) bit i's name, or NULL */
	const struct machine_step *table; /* (n_states * n_events) */
	uint32_t keep_timer;              /* the action bit of a step whose
					   * state change keeps the running
					   * phase timer (0: none) */
};

/* The step for `event` in `state` (out of range: a BUG step). */
const struct machine_step *machine_step(const struct machine *m, unsigned state,
					unsigned event);
/* Whether some event leads from `from` to `to` (what req_set_state
 * asserts: a state can only change along an edge of the table). */
bool machine_edge(const struct machine *m, unsigned from, unsigned to);
const char *machine_state_name(const struct machine *m, unsigned state);
const char *machine_event_name(const struct machine *m, unsigned event);
/* The names of the action bits in `actions`, '|'-separated, into buf. */
const char *machine_actions_str(const struct machine *m, uint32_t actions,
				char *buf, unsigned size);

/* ---- decode (and standalone) client requests ------------------------------- */

/* A decode request: reserve and fence pages, ask a prefill peer, receive
 * and check the KV, then compute and stream. A standalone node's request
 * is the same machine entered at SUBMIT (no transfer). */
enum dreq_state {
	DRS_NEW = 0,       /* parsed, or given back by a failed prefill
			    * (failover): admission runs synchronously */
	DRS_TRANSFER,      /* pages reserved and fenced, prefill_request sent */
	DRS_SEALING,       /* RDMA (memory windows): every batch in and
			    * covered; the write scope's revocation is in
			    * flight, and the final check of the pages waits
			    * for it (the transfer timer still runs) */
	DRS_ABORTING,      /* abort sent, pages released but fenced until the
			    * peer acknowledges or the link is gone */
	DRS_ABORT_LANDING, /* RDMA: prefill acknowledged the abort, but
			    * batches it posted have not all completed here:
			    * still fenced until they have (or the link is
			    * gone and its flush drained) */
	DRS_SUBMIT,        /* compute job queued, SUBMITTED not back yet */
	DRS_COMPUTE,       /* in the engine, streaming tokens */
	DRS_FREEING,       /* engine free job queued (it releases the pages) */
	DRS_DONE,          /* terminal */
	DRS__N
};

enum dreq_event {
	DEV_ADMIT = 0,      /* pages reserved and fenced, request sent */
	DEV_ADMIT_LOCAL,    /* standalone: straight to compute */
	DEV_REFUSE,         /* admission refused (nothing reserved, or all of
			     * it already given back by the admission code) */
	DEV_BATCH,          /* a batch passed every check and was written */
	DEV_BAD,            /* a batch or prefill_done failed a check, or a
			     * page could not be written: abort */
	DEV_PREFILL_DONE,   /* prefill_done arrived (coverage may be pending) */
	DEV_SEAL,           /* RDMA: coverage holds; the scope is being
			     * revoked before the final check */
	DEV_COVERED,        /* coverage and tags hold: compute */
	DEV_COVERED_FINAL,  /* ... and the first token ends it (eos or
			     * max_tokens 1): answer, release */
	DEV_COVERED_ORPHAN, /* ... but the client is gone: release */
	DEV_COVERED_FAIL,   /* ... but no memory to stream: fail, release */
	DEV_TAG_BAD,        /* every batch in, yet a tag is wrong: quarantine */
	DEV_REJECT,         /* prefill_reject: it computed and sent nothing */
	DEV_PEER_ABORT,     /* prefill gave the request up */
	DEV_ABORT_ACK,      /* prefill: nothing more will be written for it,
			     * and every batch it posted has landed here */
	DEV_ABORT_ACK_EARLY, /* RDMA: prefill acknowledged, but batches it
			     * posted are still landing (abort_ack.batches >
			     * the batches completed here) */
	DEV_LANDED,         /* RDMA: the last batch prefill posted completed */
	DEV_TIMEOUT,        /* the phase timer fired */
	DEV_SEND_FAIL,      /* the prefill_request could not be queued */
	DEV_BREACH,         /* a pool call on our own pages failed (a fence):
			     * an invariant breach, quarantine */
	DEV_LINK_LOST,      /* both connections to the peer are torn down */
	DEV_CLIENT_GONE,    /* the client disconnected (invariant 8) */
	DEV_OP_ABORT,       /* kvctl abort, drain deadline */
	DEV_SUBMITTED,      /* the engine took it */
	DEV_SUBMITTED_ORPHAN, /* the engine took it, but the client is gone */
	DEV_SUBMIT_ERR,     /* the engine refused it */
	DEV_SUBMIT_FAIL,    /* the job could not be queued (no memory) */
	DEV_TOKEN,          /* a generated token */
	DEV_FINISH,         /* the engine ended it: stop or length */
	DEV_ENGINE_FAIL,    /* the engine ended it with an error */
	DEV_FREED,          /* the engine request and its pages are gone */
	DEV_REJECT_RETRY,   /* REJECT for a cause another prefill may not
			     * share (draining, overloaded), nothing streamed,
			     * a failover left and a place to go: place it again */
	DEV_LINK_LOST_RETRY, /* LINK_LOST, likewise (the link's flush has
			     * drained: nothing lands any more) */
	DEV__N
};

/* Actions, performed in this bit order. */
enum dreq_action {
	DA_ANSWER_ERR   = 1u << 0,  /* client: the error (r->fail_*) */
	DA_STREAM_FIRST = 1u << 1,  /* client: prefill's first token */
	DA_STREAM       = 1u << 2,  /* client: an engine token */
	DA_ANSWER_FINAL = 1u << 3,  /* client: the final event */
	DA_DETACH_CLIENT = 1u << 4, /* forget the client (it left) */
	DA_SEND_ABORT   = 1u << 5,  /* peer: abort */
	DA_SEND_ABORT_ACK = 1u << 6, /* peer: abort_ack */
	DA_SEND_RELEASE_ACK = 1u << 7, /* peer: release_ack */
	DA_RELEASE      = 1u << 8,  /* pool: release the table (fenced pages
				     * stay FENCED, out of the free list) */
	DA_UNFENCE      = 1u << 9,  /* pool: drop the transfer fence */
	DA_QUARANTINE   = 1u << 10, /* pool: quarantine the prefix, release
				     * the rest (a writer we cannot trust) */
	DA_DETACH_PEER  = 1u << 11, /* the peer holds nothing of it any more */
	DA_TIMER_PREFILL = 1u << 12, /* phase timer: prefill_timeout_ms */
	DA_TIMER_TRANSFER = 1u << 13, /* phase timer: transfer_timeout_ms */
	DA_TIMER_ABORT  = 1u << 14, /* phase timer: release_timeout_ms */
	DA_FREE_ENGINE  = 1u << 15, /* compute: free the engine request and
				     * release (or quarantine) the lent table */
	DA_SUBMIT       = 1u << 16, /* compute: submit (may fire SUBMIT_FAIL) */
	DA_TEARDOWN     = 1u << 17, /* tear the peer link down (fires
				     * LINK_LOST on every request of it) */
	DA_KEEP_TIMER   = 1u << 18, /* the running phase timer carries on
				     * into the next state (no action: read
				     * by the state setter) */
	DA_RETRY        = 1u << 19, /* place it again from NEW: fresh pages,
				     * a new transfer on another peer (or
				     * here), every check again; last, so
				     * the new placement's own step follows
				     * a finished one */
};
#define DA__BITS 20

extern const struct machine dreq_machine;

/* ---- prefill requests (a decode peer's prefill_request) -------------------- */

enum preq_state {
	PRS_NEW = 0,        /* admitted by prefill's own checks, not queued */
	PRS_ADMITTED,       /* compute job queued, SUBMITTED not back yet */
	PRS_ADMIT_ABORTED,  /* ... and aborted: free once SUBMITTED is back */
	PRS_COMPUTE,        /* prefill computing in the engine */
	PRS_SENDING,        /* batches going out */
	PRS_ABORT_DRAINING, /* aborted with batches still queued: wait for
			     * every send to be reported (DRAINED) */
	PRS_WAIT_RELEASE,   /* prefill_done sent: wait for release_ack */
	PRS_FREEING,        /* engine free job queued (it releases our pages) */
	PRS_DONE,           /* terminal */
	PRS__N
};

enum preq_event {
	PEV_ADMIT = 0,      /* compute job queued */
	PEV_REFUSE,         /* could not be queued (no memory) */
	PEV_SUBMITTED,
	PEV_SUBMIT_ERR,     /* the engine refused it */
	PEV_TOKEN,          /* the first sampled token */
	PEV_COMPUTED,       /* prompt computed and our own pages verified */
	PEV_COMPUTE_FAIL,   /* the engine failed, or our pages did not verify */
	PEV_BATCH_SENT,     /* the transport reported a batch sent */
	PEV_SEND_FAIL,      /* a batch could not be queued or sent */
	PEV_ALL_SENT,       /* every batch reported sent */
	PEV_DRAINED,        /* aborting, and no batch is queued any more */
	PEV_RELEASE_ACK,    /* decode holds its copy: release ours */
	PEV_TIMEOUT,        /* release_timeout_ms without release_ack */
	PEV_PEER_ABORT,     /* decode aborted the request */
	PEV_OP_ABORT,       /* kvctl abort, drain deadline, local failure */
	PEV_LINK_LOST,      /* the decode peer's connections are gone */
	PEV_FREED,          /* the engine request and its pages are gone */
	PEV__N
};

enum preq_action {
	PA_SEND_REJECT  = 1u << 0,  /* peer: prefill_reject (r->fail_*) */
	PA_SEND_ABORT   = 1u << 1,  /* peer: abort (r->fail_*) */
	PA_OWE_ACK      = 1u << 2,  /* decode asked: ack once drained */
	PA_SEND_ABORT_ACK = 1u << 3, /* peer: abort_ack, now */
	PA_ACK_OWED     = 1u << 4,  /* peer: abort_ack, if decode asked */
	PA_DETACH_LINK  = 1u << 5,  /* forget the link (and its caps) */
	PA_SEND_MORE    = 1u << 6,  /* queue batches (may fire ALL_SENT or
				     * SEND_FAIL) */
	PA_SEND_DONE    = 1u << 7,  /* peer: prefill_done */
	PA_TIMER_RELEASE = 1u << 8, /* phase timer: release_timeout_ms */
	PA_RELEASED     = 1u << 9,  /* decode acknowledged: ends ok */
	PA_COUNT_TIMEOUT = 1u << 10, /* count and log a release timeout */
	PA_FREE_ENGINE  = 1u << 11, /* compute: free (releases our pages) */
};
#define PA__BITS 12

extern const struct machine preq_machine;
