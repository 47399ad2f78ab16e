/* test_machine.c - the request machines of daemon/node/machine.c against a
 * reference model of what they hold (MISSION.md invariants 2, 7, 8).
 *
 * Each role has a "world": the machine's state plus a small model of
 * everything around it - the request's pages (reserved, fenced, released,
 * quarantined), the peer (may it still write? is it attached?), the
 * client (attached, gone, answered), the engine (queued, running, holding
 * the pages, free job queued), the phase timer, the link, the sends in
 * flight. The world offers only the moves its environment can really make
 * in that situation (a FREED only after a free was queued, an ABORT_ACK
 * only after an abort went out, a TIMEOUT only while a timer runs, a
 * batch report only while a send is pending); the table answers each one
 * and the world performs the actions in bit order, checking every action
 * against what it holds. A BUG step for a move the world can make is a
 * violation too.
 *
 * Two drivers over the same worlds:
 *   - random runs (thousands, seeded: KVD_SEED, else the time; the seed,
 *     the run and the move sequence are printed on a failure);
 *   - an exhaustive search of the product (machine state x world): every
 *     reachable world is checked, every world with no move must be the
 *     terminal one, and from every reachable world some sequence of moves
 *     reaches the terminal state (backward search over the edges) - and
 *     one made only of moves the environment guarantees (timers, the
 *     engine, the transport's reports, decode's own verdicts, the
 *     LINK_LOST of our own teardown): a request ends without counting on
 *     a peer message, the client or the operator.
 * Mutated copies of the tables (one entry changed) must be caught by the
 * same checker. Named unit tests walk the paths of invariants 7 and 8.
 *
 * Assumptions about the executor (serving code) the worlds encode:
 *   - the phase timer belongs to the state: a step to another state that
 *     does not arm a timer stops it; TIMEOUT stops it too;
 *   - an answer (ANSWER_ERR / ANSWER_FINAL / STREAM*) to a client that was
 *     detached goes nowhere (the D_ABORT actions run also for an orphan);
 *   - derived events are computed from the request: SUBMITTED vs
 *     SUBMITTED_ORPHAN and COVERED* vs COVERED_ORPHAN by whether a client
 *     is still attached; COVERED* only while the request is in TRANSFER;
 *     DRAINED whenever prefill is in ABORT_DRAINING with nothing pending;
 *   - SEND_FAIL (decode), SUBMIT_FAIL (decode) and SEND_FAIL/ALL_SENT out
 *     of SEND_MORE (prefill) are synchronous: they come straight after the
 *     action that caused them, or not at all;
 *   - peer events reach a request only while it is attached to the peer
 *     (DETACH_PEER / DETACH_LINK unroute them), client events only while
 *     the client is attached.
 *
 *   test_machine --draw   prints both machines (daemon/README.md).
 */
#include <check.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon/node/machine.h"

#define MAX_MOVES 48
#define MAX_TRACE 512
#define RUN_STEPS 400

/* ---- common ------------------------------------------------------------------ */

/* A move of the environment: a machine event (ev >= 0, with an argument
 * the world uses, e.g. how many batches are still in flight), or an
 * internal step of the environment that the machine does not see. */
struct move {
	int ev;
	uint8_t arg;
};

enum {
	M_SEND_OK = -1,    /* decode: prefill_request queued (no SEND_FAIL) */
	M_SUBMIT_OK = -2,  /* decode: compute job queued (no SUBMIT_FAIL) */
	M_QUEUED = -3,     /* prefill: SEND_MORE queued what the window allows */
};

struct verdict {
	bool bad;
	char why[320];
};

static void violation(struct verdict *v, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
static void violation(struct verdict *v, const char *fmt, ...)
{
	va_list ap;

	if (v->bad)
		return;
	v->bad = true;
	va_start(ap, fmt);
	vsnprintf(v->why, sizeof(v->why), fmt, ap);
	va_end(ap);
}

struct world_ops {
	size_t size;
	void (*init)(void *w);
	unsigned (*moves)(const void *w, const struct machine *m, struct move *out);
	/* the world's own effect of the event, before the machine's step */
	void (*env)(void *w, struct move mv);
	/* one action bit, performed after the state changed */
	void (*action)(void *w, const struct machine *m, unsigned bit,
		       struct verdict *v);
	/* invariants of a world (and, in the terminal state, its end) */
	void (*check)(const void *w, const struct machine *m, struct verdict *v);
	/* whether the environment guarantees this move will come (a timer,
	 * the engine, the transport, decode's own verdict), as opposed to one
	 * it may or may not make (a peer message, the client, the operator,
	 * a spontaneous link loss) */
	bool (*guaranteed)(const void *w, struct move mv);
	/* the event that stops the phase timer when it arrives */
	int timeout_event;
	uint32_t timer_bits;
};

/* Every world begins with these two bytes. */
struct world_head {
	uint8_t ms;        /* the machine's state */
	uint8_t timer;     /* the phase timer runs */
};

static const char *move_name(const struct machine *m, struct move mv, char *buf,
			     size_t n)
{
	const char *s = mv.ev == M_SEND_OK ? "(request queued)" :
			mv.ev == M_SUBMIT_OK ? "(job queued)" :
			mv.ev == M_QUEUED ? "(batches queued)" :
			machine_event_name(m, (unsigned)mv.ev);

	if (mv.arg)
		snprintf(buf, n, "%s(%u)", s, mv.arg);
	else
		snprintf(buf, n, "%s", s);
	return buf;
}

/* Which table entries the last searches stepped through ([state][event]). */
static uint8_t entry_hit[32][64];

/* One move: the environment's effect, the table's step, the actions in
 * bit order, then the world's invariants. */
static void world_step(const struct world_ops *ops, void *w,
		       const struct machine *m, struct move mv, struct verdict *v)
{
	struct world_head *h = w;
	const struct machine_step *st;
	unsigned from = h->ms;

	ops->env(w, mv);
	if (mv.ev < 0) {
		ops->check(w, m, v);
		return;
	}
	if (mv.ev == ops->timeout_event)
		h->timer = 0;
	st = machine_step(m, from, (unsigned)mv.ev);
	if (from < 32 && mv.ev < 64)
		entry_hit[from][mv.ev] = 1;
	if (st->kind == MSTEP_BUG) {
		violation(v, "BUG step for an event the environment can produce: %s + %s",
			  machine_state_name(m, from),
			  machine_event_name(m, (unsigned)mv.ev));
		return;
	}
	if (st->kind == MSTEP_IGNORE) {
		ops->check(w, m, v);
		return;
	}
	h->ms = st->next;
	if (st->next != from && !(st->actions & ops->timer_bits))
		h->timer = 0;
	for (unsigned b = 0; b < 32; b++)
		if (st->actions & (1u << b))
			ops->action(w, m, 1u << b, v);
	ops->check(w, m, v);
}

/* ---- decode (and standalone) -------------------------------------------------- */

enum { PG_NONE = 0, PG_HELD, PG_RELEASED };
enum { PEER_NONE = 0, PEER_ACTIVE, PEER_DONE_SENT, PEER_ENDED };
enum { ENG_NONE = 0, ENG_QUEUED, ENG_RUNNING, ENG_ENDED, ENG_REFUSED };

struct dworld {
	struct world_head h;
	uint8_t admitted;     /* admission ran */
	uint8_t pages;        /* PG_*: the request's table */
	uint8_t fence;        /* transfer fence on the prefix */
	uint8_t quar;         /* the prefix is quarantined (never reused) */
	uint8_t may_write;    /* the peer may still write into the prefix */
	uint8_t attached;     /* the request is attached to a peer link */
	uint8_t peer;         /* PEER_*: what the prefill side does */
	uint8_t sent_any;     /* the peer sent a batch or prefill_done */
	uint8_t late;         /* batches still on the wire after prefill_done */
	uint8_t done_seen;    /* prefill_done arrived */
	uint8_t abort_sent;   /* our abort went out: an ack will come */
	uint8_t ack_came;
	uint8_t landing;      /* RDMA: acknowledged, posted batches still
			       * landing (the peer may still write) */
	uint8_t link_down;    /* torn down: only LINK_LOST is left */
	uint8_t lost;         /* LINK_LOST was delivered */
	uint8_t sync_send;    /* just admitted: SEND_FAIL may fire now */
	uint8_t sync_submit;  /* DA_SUBMIT just ran: SUBMIT_FAIL may fire */
	uint8_t client;       /* the client is attached */
	uint8_t gone;         /* the client disconnected */
	uint8_t answered;     /* answers the client got (at most 1) */
	uint8_t eng;          /* ENG_* */
	uint8_t holds;        /* the engine holds the request (and its table) */
	uint8_t free_queued;  /* a free job is queued, FREED to come */
	uint8_t retries;      /* failovers taken (REJECT_RETRY,
			       * LINK_LOST_RETRY: at most D_RETRIES) */
};

/* peers.failover_retries in the world: the executor offers a retry
 * event only while one is left (and the client is there) */
#define D_RETRIES 1

static void d_init(void *p)
{
	struct dworld *w = p;

	memset(w, 0, sizeof(*w));
	w->h.ms = DRS_NEW;
	w->client = 1;
}

static unsigned d_moves(const void *p, const struct machine *m, struct move *o)
{
	const struct dworld *w = p;
	unsigned n = 0;

#define MV(e, a) (o[n++] = (struct move){ (e), (a) })
	if (w->h.ms == m->terminal)
		return 0;
	if (w->sync_send) {
		MV(DEV_SEND_FAIL, 0);
		MV(M_SEND_OK, 0);
		return n;
	}
	if (w->sync_submit) {
		MV(DEV_SUBMIT_FAIL, 0);
		MV(M_SUBMIT_OK, 0);
		return n;
	}
	if (!w->admitted) {
		MV(DEV_ADMIT, 0);
		MV(DEV_ADMIT_LOCAL, 0);
		MV(DEV_REFUSE, 0);
		MV(DEV_BREACH, 0);
		return n;
	}
	if (w->client)
		MV(DEV_CLIENT_GONE, 0);
	MV(DEV_OP_ABORT, 0);
	if (w->h.timer)
		MV(DEV_TIMEOUT, 0);
	if (w->attached && !w->lost)
		MV(DEV_LINK_LOST, 0);
	/* failover: the executor's choice, only before anything streamed
	 * (TRANSFER, SEALING) and while its client waits */
	bool retry = (w->h.ms == DRS_TRANSFER || w->h.ms == DRS_SEALING) &&
		     w->client && w->retries < D_RETRIES;
	if (retry && w->attached && !w->lost)
		MV(DEV_LINK_LOST_RETRY, 0);
	if (w->attached && !w->link_down && !w->lost) {
		if (w->peer == PEER_ACTIVE) {
			MV(DEV_BATCH, 0);
			MV(DEV_BAD, 0);
			MV(DEV_PREFILL_DONE, 0);
			MV(DEV_PREFILL_DONE, 1);
			if (!w->sent_any)
				MV(DEV_REJECT, 0);
			if (!w->sent_any && retry)
				MV(DEV_REJECT_RETRY, 0);
		}
		if (w->peer == PEER_DONE_SENT && w->late) {
			MV(DEV_BATCH, 0);
			MV(DEV_BAD, 0);
		}
		if (w->peer == PEER_ACTIVE || w->peer == PEER_DONE_SENT)
			MV(DEV_PEER_ABORT, 0);
		if (w->abort_sent && !w->ack_came) {
			MV(DEV_ABORT_ACK, 0);
			MV(DEV_ABORT_ACK_EARLY, 0);
		}
		/* a lying peer: an ack decode never asked for (arg 1), with
		 * any count, changes nothing it does */
		if (!w->abort_sent) {
			MV(DEV_ABORT_ACK, 1);
			MV(DEV_ABORT_ACK_EARLY, 1);
		}
		if (w->landing)
			MV(DEV_LANDED, 0);
		/* decode's own verdict once every batch is in */
		if ((w->h.ms == DRS_TRANSFER || w->h.ms == DRS_SEALING) &&
		    w->done_seen && !w->late) {
			/* RDMA windows: revoke the scope first, check after */
			if (w->h.ms == DRS_TRANSFER)
				MV(DEV_SEAL, 0);
			/* while it seals, a lying peer's extra batch (refused)
			 * or a refusal after its prefill_done */
			if (w->h.ms == DRS_SEALING) {
				MV(DEV_BAD, 0);
				MV(DEV_REJECT, 0);
				if (retry)
					MV(DEV_REJECT_RETRY, 0);
			}
			if (w->client) {
				MV(DEV_COVERED, 0);
				MV(DEV_COVERED_FINAL, 0);
				MV(DEV_COVERED_FAIL, 0);
			} else {
				MV(DEV_COVERED_ORPHAN, 0);
			}
			MV(DEV_TAG_BAD, 0);
		}
	}
	if (w->eng == ENG_QUEUED) {
		MV(w->client ? DEV_SUBMITTED : DEV_SUBMITTED_ORPHAN, 0);
		MV(DEV_SUBMIT_ERR, 0);
	}
	if (w->eng == ENG_RUNNING) {
		MV(DEV_TOKEN, 0);
		MV(DEV_FINISH, 0);
		MV(DEV_ENGINE_FAIL, 0);
	}
	if (w->free_queued)
		MV(DEV_FREED, 0);
#undef MV
	return n;
}

static void d_env(void *p, struct move mv)
{
	struct dworld *w = p;

	switch (mv.ev) {
	case M_SEND_OK:
		w->sync_send = 0;
		break;
	case M_SUBMIT_OK:
		w->sync_submit = 0;
		w->eng = ENG_QUEUED;
		w->holds = 1;
		break;
	case DEV_ADMIT:
		w->admitted = 1;
		w->pages = PG_HELD;
		w->fence = 1;
		w->may_write = 1;
		w->attached = 1;
		w->peer = PEER_ACTIVE;
		w->sync_send = 1;
		break;
	case DEV_ADMIT_LOCAL:
	case DEV_REFUSE:
		w->admitted = 1;
		break;
	case DEV_BREACH:
		/* reserved, but the fence failed */
		w->admitted = 1;
		w->pages = PG_HELD;
		break;
	case DEV_SEND_FAIL:
		w->sync_send = 0;
		w->may_write = 0;
		w->peer = PEER_ENDED;
		break;
	case DEV_BATCH:
	case DEV_BAD:
		w->sent_any = 1;
		if (w->peer == PEER_DONE_SENT && w->late)
			w->late--;
		break;
	case DEV_PREFILL_DONE:
		w->sent_any = 1;
		w->peer = PEER_DONE_SENT;
		w->late = mv.arg;
		w->done_seen = 1;
		break;
	case DEV_COVERED:
	case DEV_COVERED_FINAL:
	case DEV_COVERED_ORPHAN:
	case DEV_COVERED_FAIL:
	case DEV_TAG_BAD:
		/* prefill sent prefill_done and every batch is in */
		w->may_write = 0;
		break;
	case DEV_REJECT:
	case DEV_REJECT_RETRY:
	case DEV_PEER_ABORT:
		w->may_write = 0;
		w->peer = PEER_ENDED;
		break;
	case DEV_ABORT_ACK:
		if (mv.arg)
			break;   /* unrequested: a lie, nothing stops */
		w->may_write = 0;
		w->ack_came = 1;
		w->peer = PEER_ENDED;
		break;
	case DEV_ABORT_ACK_EARLY:
		if (mv.arg)
			break;
		/* prefill posts nothing more, but what it posted may land */
		w->ack_came = 1;
		w->peer = PEER_ENDED;
		w->landing = 1;
		break;
	case DEV_LANDED:
		w->may_write = 0;
		w->landing = 0;
		break;
	case DEV_LINK_LOST:
	case DEV_LINK_LOST_RETRY:
		/* the link's flush drained: nothing lands any more */
		w->may_write = 0;
		w->landing = 0;
		w->lost = 1;
		w->link_down = 1;
		break;
	case DEV_CLIENT_GONE:
		w->client = 0;
		w->gone = 1;
		break;
	case DEV_SUBMITTED:
	case DEV_SUBMITTED_ORPHAN:
		w->eng = ENG_RUNNING;
		break;
	case DEV_SUBMIT_ERR:
		w->eng = ENG_REFUSED;
		break;
	case DEV_SUBMIT_FAIL:
		w->sync_submit = 0;
		break;
	case DEV_FINISH:
	case DEV_ENGINE_FAIL:
		w->eng = ENG_ENDED;
		break;
	case DEV_FREED:
		/* the free job released the lent table */
		w->free_queued = 0;
		w->holds = 0;
		w->eng = ENG_NONE;
		if (w->pages == PG_HELD)
			w->pages = PG_RELEASED;
		break;
	default:
		break;
	}
}

static void d_answer(struct dworld *w, struct verdict *v, const char *what)
{
	if (!w->client)
		return;  /* nobody to answer: goes nowhere */
	if (w->answered)
		violation(v, "invariant 8: client answered twice (%s)", what);
	w->answered = 1;
}

/* DA_RETRY: the request is placed again from NEW with fresh pages and
 * a new transfer. Only a request that holds nothing (its pages released
 * and unfenced, no peer, no engine) and told its client nothing may
 * start over; then the world forgets the old transfer (the new one is
 * another peer's, or here). */
static void d_retry(struct dworld *w, struct verdict *v)
{
	if (w->h.ms != DRS_NEW)
		violation(v, "failover: a retry that does not go back to new");
	if (w->pages == PG_HELD || w->fence || w->quar)
		violation(v, "failover: retried holding its pages (held %u, fence %u, "
			  "quarantined %u)", w->pages == PG_HELD, w->fence, w->quar);
	if (w->attached || w->may_write)
		violation(v, "failover: retried while the old peer is attached or may "
			  "write (%u, %u)", w->attached, w->may_write);
	if (w->holds || w->eng != ENG_NONE)
		violation(v, "failover: retried while the engine has it");
	if (w->answered || !w->client)
		violation(v, "failover: retried after the client was answered or left "
			  "(invariant 9: it may have seen the first attempt)");
	w->admitted = 0;
	w->pages = PG_NONE;
	w->peer = PEER_NONE;
	w->sent_any = w->late = w->done_seen = 0;
	w->abort_sent = w->ack_came = w->landing = 0;
	w->link_down = w->lost = 0;
	w->retries++;
}

static void d_action(void *p, const struct machine *m, unsigned bit,
		     struct verdict *v)
{
	struct dworld *w = p;

	(void)m;
	switch (bit) {
	case DA_ANSWER_ERR:
		d_answer(w, v, "answer_err");
		break;
	case DA_ANSWER_FINAL:
		d_answer(w, v, "answer_final");
		break;
	case DA_STREAM_FIRST:
		/* prefill's first token goes out as the engine's first step
		 * for the request starts (SUBMITTED), so the gap to the
		 * second is one step; or with the final answer */
		if (w->eng != ENG_RUNNING && w->h.ms != DRS_DONE)
			violation(v, "prefill's first token streamed before the engine took the request");
		/* fall through */
	case DA_STREAM:
		if (w->client && w->answered)
			violation(v, "invariant 8: token streamed after the answer");
		break;
	case DA_DETACH_CLIENT:
		if (w->client && !w->answered && !w->gone)
			violation(v, "invariant 8: client forgotten unanswered");
		w->client = 0;
		break;
	case DA_SEND_ABORT:
		if (w->abort_sent)
			violation(v, "abort sent twice");
		if (!w->attached)
			violation(v, "abort sent on a detached request");
		if (w->attached && !w->link_down && !w->lost)
			w->abort_sent = 1;
		break;
	case DA_SEND_ABORT_ACK:
	case DA_SEND_RELEASE_ACK:
		if (!w->attached)
			violation(v, "message to a peer the request is detached from");
		break;
	case DA_RELEASE:
	case DA_QUARANTINE:
		if (w->holds)
			violation(v, "invariant 2: %s while the engine holds the table",
				  bit == DA_RELEASE ? "release" : "quarantine");
		if (w->pages == PG_RELEASED)
			violation(v, "pages released twice");
		if (w->pages == PG_HELD)
			w->pages = PG_RELEASED;
		if (bit == DA_QUARANTINE)
			w->quar = 1;
		break;
	case DA_UNFENCE:
		if (!w->fence)
			violation(v, "unfence without a fence");
		w->fence = 0;
		break;
	case DA_DETACH_PEER:
		w->attached = 0;
		break;
	case DA_TIMER_PREFILL:
	case DA_TIMER_TRANSFER:
	case DA_TIMER_ABORT:
		w->h.timer = 1;
		break;
	case DA_FREE_ENGINE:
		if (!w->holds)
			violation(v, "free_engine with nothing in the engine");
		if (w->free_queued)
			violation(v, "free_engine twice");
		w->free_queued = 1;
		break;
	case DA_SUBMIT:
		if (w->eng != ENG_NONE || w->holds)
			violation(v, "submitted twice");
		if (w->may_write || w->fence)
			violation(v, "invariant 6: compute submitted while the peer may "
				  "still write (fence %u, may_write %u)", w->fence,
				  w->may_write);
		w->sync_submit = 1;
		break;
	case DA_TEARDOWN:
		if (w->attached && !w->lost)
			w->link_down = 1;
		break;
	case DA_KEEP_TIMER:
		break;   /* the harness keeps the timer (timer_bits) */
	case DA_RETRY:
		d_retry(w, v);
		break;
	default:
		violation(v, "unknown action bit %#x", bit);
	}
}

static void d_check(const void *p, const struct machine *m, struct verdict *v)
{
	const struct dworld *w = p;
	bool on_free_list = w->pages == PG_RELEASED && !w->fence && !w->quar;

	if (on_free_list && w->may_write)
		violation(v, "invariant 2/7: pages back on the free list while the "
			  "peer may still write into them");
	if (w->may_write && !w->fence)
		violation(v, "invariant 7: the peer may write into an unfenced prefix");
	if (w->h.ms != m->terminal)
		return;
	if (w->pages == PG_HELD)
		violation(v, "done with pages reserved and not released");
	if (w->fence)
		violation(v, "done with the fence held (the pages leak)");
	if (w->holds || w->free_queued)
		violation(v, "done while the engine holds the request");
	if (w->attached || w->may_write)
		violation(v, "done while attached to the peer (may write %u)",
			  w->may_write);
	if (!w->answered && !w->gone)
		violation(v, "invariant 8: done and the client was never answered");
	if (w->h.timer)
		violation(v, "done with the timer running");
}

static bool d_guaranteed(const void *p, struct move mv)
{
	const struct dworld *w = p;

	switch (mv.ev) {
	case DEV_OP_ABORT: case DEV_CLIENT_GONE: case DEV_REJECT_RETRY:
	case DEV_BATCH: case DEV_BAD: case DEV_PREFILL_DONE: case DEV_REJECT:
	case DEV_PEER_ABORT: case DEV_ABORT_ACK: case DEV_ABORT_ACK_EARLY:
		return false;
	case DEV_LINK_LOST:
	case DEV_LINK_LOST_RETRY:
		return w->link_down;   /* after our own teardown */
	default:
		return true;
	}
}

static const struct world_ops dworld_ops = {
	.size = sizeof(struct dworld),
	.init = d_init, .moves = d_moves, .env = d_env, .action = d_action,
	.check = d_check, .guaranteed = d_guaranteed,
	.timeout_event = DEV_TIMEOUT,
	.timer_bits = DA_TIMER_PREFILL | DA_TIMER_TRANSFER | DA_TIMER_ABORT |
		      DA_KEEP_TIMER,
};

/* ---- prefill ------------------------------------------------------------------ */

#define P_WINDOW 2   /* batches queued at once (PREFILL_SEND_WINDOW) */

struct pworld {
	struct world_head h;
	uint8_t admitted;
	uint8_t eng;          /* ENG_* */
	uint8_t token;        /* the first token came */
	uint8_t holds;        /* the engine holds the request and our pages */
	uint8_t free_queued;
	uint8_t attached;     /* the request knows its link */
	uint8_t lost;         /* LINK_LOST delivered */
	uint8_t to_send;      /* batches not queued yet */
	uint8_t pending;      /* batches queued, not reported */
	uint8_t send_failed;
	uint8_t sync_more;    /* SEND_MORE ran: it queues now or fails */
	uint8_t sync_all;     /* ... and every batch was sent: ALL_SENT now */
	uint8_t done_sent;    /* prefill_done went out */
	uint8_t asked;        /* decode's abort arrived */
	uint8_t relack;       /* decode's release_ack arrived */
	uint8_t owed;         /* OWE_ACK: an ack once drained */
	uint8_t acks;         /* abort_acks sent */
	uint8_t told;         /* decode heard how it ended */
};

static void p_init(void *p)
{
	struct pworld *w = p;

	memset(w, 0, sizeof(*w));
	w->h.ms = PRS_NEW;
	w->attached = 1;
}

static unsigned p_moves(const void *p, const struct machine *m, struct move *o)
{
	const struct pworld *w = p;
	unsigned n = 0;

#define MV(e, a) (o[n++] = (struct move){ (e), (a) })
	if (w->h.ms == m->terminal)
		return 0;
	if (w->sync_all) {
		MV(PEV_ALL_SENT, 0);
		return n;
	}
	if (w->sync_more) {
		MV(M_QUEUED, 0);
		MV(PEV_SEND_FAIL, 0);   /* nothing queued */
		if (w->to_send && w->pending + 1 < P_WINDOW && w->to_send > 1)
			MV(PEV_SEND_FAIL, 1);   /* one queued, the next failed */
		return n;
	}
	if (!w->admitted) {
		MV(PEV_ADMIT, 0);
		MV(PEV_REFUSE, 0);
		return n;
	}
	MV(PEV_OP_ABORT, 0);
	if (w->h.timer)
		MV(PEV_TIMEOUT, 0);
	if (!w->lost) {
		MV(PEV_LINK_LOST, 0);
		if (!w->asked && !w->relack)
			MV(PEV_PEER_ABORT, 0);
		if (w->done_sent && !w->asked && !w->relack)
			MV(PEV_RELEASE_ACK, 0);
	}
	if (w->eng == ENG_QUEUED) {
		MV(PEV_SUBMITTED, 0);
		MV(PEV_SUBMIT_ERR, 0);
	}
	if (w->eng == ENG_RUNNING) {
		if (!w->token)
			MV(PEV_TOKEN, 0);
		MV(PEV_COMPUTED, 1);
		MV(PEV_COMPUTED, 3);
		MV(PEV_COMPUTE_FAIL, 0);
	}
	if (w->pending) {
		MV(PEV_BATCH_SENT, 0);
		MV(PEV_SEND_FAIL, 0);
	}
	if (w->h.ms == PRS_ABORT_DRAINING && !w->pending)
		MV(PEV_DRAINED, 0);
	if (w->free_queued)
		MV(PEV_FREED, 0);
#undef MV
	return n;
}

static void p_env(void *p, struct move mv)
{
	struct pworld *w = p;

	switch (mv.ev) {
	case M_QUEUED: {
		unsigned room = P_WINDOW - w->pending;
		unsigned q = w->to_send < room ? w->to_send : room;

		w->sync_more = 0;
		w->pending += q;
		w->to_send -= q;
		if (!w->to_send && !w->pending)
			w->sync_all = 1;
		break;
	}
	case PEV_ALL_SENT:
		w->sync_all = 0;
		break;
	case PEV_ADMIT:
		w->admitted = 1;
		w->eng = ENG_QUEUED;
		w->holds = 1;
		break;
	case PEV_REFUSE:
		w->admitted = 1;
		break;
	case PEV_SUBMITTED:
		w->eng = ENG_RUNNING;
		break;
	case PEV_SUBMIT_ERR:
		/* the engine refused it and holds nothing */
		w->eng = ENG_REFUSED;
		w->holds = 0;
		break;
	case PEV_TOKEN:
		w->token = 1;
		break;
	case PEV_COMPUTED:
		w->eng = ENG_ENDED;
		w->to_send = mv.arg;
		break;
	case PEV_COMPUTE_FAIL:
		w->eng = ENG_ENDED;
		break;
	case PEV_BATCH_SENT:
		w->pending--;
		break;
	case PEV_SEND_FAIL:
		if (w->sync_more) {
			w->sync_more = 0;
			w->pending += mv.arg;
			w->to_send -= mv.arg;
		} else {
			w->pending--;
		}
		w->send_failed = 1;
		w->to_send = 0;
		break;
	case PEV_RELEASE_ACK:
		w->relack = 1;
		break;
	case PEV_PEER_ABORT:
		w->asked = 1;
		break;
	case PEV_LINK_LOST:
		w->lost = 1;
		break;
	case PEV_FREED:
		w->free_queued = 0;
		w->holds = 0;
		w->eng = ENG_NONE;
		break;
	default:
		break;
	}
}

static void p_send_ack(struct pworld *w, struct verdict *v)
{
	if (!w->attached || w->lost)
		return;
	if (!w->asked)
		violation(v, "abort_ack sent unasked");
	if (w->pending)
		violation(v, "invariant 7: abort_ack while %u send(s) pending",
			  w->pending);
	if (w->acks)
		violation(v, "invariant 7: abort_ack sent twice");
	w->acks++;
	w->told = 1;
}

static void p_action(void *p, const struct machine *m, unsigned bit,
		     struct verdict *v)
{
	struct pworld *w = p;

	(void)m;
	switch (bit) {
	case PA_SEND_REJECT:
	case PA_SEND_ABORT:
		if (w->attached && !w->lost)
			w->told = 1;
		break;
	case PA_OWE_ACK:
		w->owed = 1;
		break;
	case PA_SEND_ABORT_ACK:
		p_send_ack(w, v);
		break;
	case PA_ACK_OWED:
		if (w->owed)
			p_send_ack(w, v);
		w->owed = 0;
		break;
	case PA_DETACH_LINK:
		w->attached = 0;
		break;
	case PA_SEND_MORE:
		if (!w->attached || w->lost)
			violation(v, "send_more without a link");
		w->sync_more = 1;
		break;
	case PA_SEND_DONE:
		if (w->to_send || w->pending || w->send_failed)
			violation(v, "invariant 6: prefill_done before every batch "
				  "was sent (%u queued, %u to send)", w->pending,
				  w->to_send);
		w->done_sent = 1;
		w->told = 1;
		break;
	case PA_TIMER_RELEASE:
		w->h.timer = 1;
		break;
	case PA_RELEASED:
	case PA_COUNT_TIMEOUT:
		break;
	case PA_FREE_ENGINE:
		if (!w->holds || w->eng == ENG_QUEUED)
			violation(v, "free_engine before the engine took the request");
		if (w->free_queued)
			violation(v, "free_engine twice");
		if (w->pending)
			violation(v, "invariant 2: the engine frees our pages while "
				  "%u send(s) still read them", w->pending);
		w->free_queued = 1;
		break;
	default:
		violation(v, "unknown action bit %#x", bit);
	}
}

static void p_check(const void *p, const struct machine *m, struct verdict *v)
{
	const struct pworld *w = p;

	if (w->h.ms != m->terminal)
		return;
	if (w->holds || w->free_queued)
		violation(v, "done while the engine holds our pages");
	if (w->attached)
		violation(v, "done with the link still attached");
	if (w->pending)
		violation(v, "done with sends pending");
	if (w->h.timer)
		violation(v, "done with the timer running");
	if (w->asked && !w->lost && w->acks != 1)
		violation(v, "invariant 7: decode asked and got %u abort_ack(s)",
			  w->acks);
	if (!w->told && !w->lost && !w->asked)
		violation(v, "done and decode was never told (reject, abort, "
			  "prefill_done)");
}

static bool p_guaranteed(const void *p, struct move mv)
{
	(void)p;
	switch (mv.ev) {
	case PEV_OP_ABORT: case PEV_LINK_LOST: case PEV_PEER_ABORT:
	case PEV_RELEASE_ACK:
		return false;
	default:
		return true;
	}
}

static const struct world_ops pworld_ops = {
	.size = sizeof(struct pworld),
	.init = p_init, .moves = p_moves, .env = p_env, .action = p_action,
	.check = p_check, .guaranteed = p_guaranteed,
	.timeout_event = PEV_TIMEOUT,
	.timer_bits = PA_TIMER_RELEASE,
};

/* ---- random runs -------------------------------------------------------------- */

static uint64_t rng_next(uint64_t *s)
{
	/* splitmix64 */
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static uint64_t test_seed(void)
{
	const char *e = getenv("KVD_SEED");

	return e ? strtoull(e, NULL, 0) : (uint64_t)time(NULL);
}

static void print_trace(const struct machine *m, const struct move *t, unsigned n)
{
	char buf[64];

	fprintf(stderr, "  moves:");
	for (unsigned i = 0; i < n; i++)
		fprintf(stderr, " %s", move_name(m, t[i], buf, sizeof(buf)));
	fprintf(stderr, "\n");
}

/* Runs `runs` random walks; returns true when one found a violation (it
 * is printed unless quiet). */
static bool check_random(const struct world_ops *ops, const struct machine *m,
			 uint64_t seed, unsigned runs, bool quiet)
{
	uint8_t w[64];
	struct move mv[MAX_MOVES], trace[MAX_TRACE];

	ck_assert(ops->size <= sizeof(w));
	for (unsigned r = 0; r < runs; r++) {
		uint64_t s = seed ^ ((uint64_t)r * 0x2545f4914f6cdd1dull);
		struct verdict v = { 0 };
		unsigned n = 0;

		ops->init(w);
		while (n < RUN_STEPS) {
			unsigned k = ops->moves(w, m, mv);

			if (!k) {
				if (((struct world_head *)w)->ms != m->terminal)
					violation(&v, "stuck: no move can come in %s",
						  machine_state_name(m, ((struct world_head *)w)->ms));
				break;
			}
			trace[n % MAX_TRACE] = mv[rng_next(&s) % k];
			world_step(ops, w, m, trace[n % MAX_TRACE], &v);
			n++;
			if (v.bad)
				break;
		}
		if (v.bad) {
			if (!quiet) {
				fprintf(stderr, "%s: %s\n  seed=%" PRIu64 " (KVD_SEED) run=%u "
					"state=%s\n", m->name, v.why, seed, r,
					machine_state_name(m, ((struct world_head *)w)->ms));
				print_trace(m, trace, n < MAX_TRACE ? n : MAX_TRACE);
			}
			return true;
		}
	}
	return false;
}

/* ---- exhaustive search of the product ----------------------------------------- */

struct search {
	const struct world_ops *ops;
	const struct machine *m;
	size_t n, cap;
	uint8_t *worlds;        /* (cap, ops->size) */
	int32_t *parent;        /* (cap) index of the world it was found from */
	struct move *via;       /* (cap) the move that found it */
	uint32_t *slot;         /* (hcap) open addressing: index + 1, 0 empty */
	size_t hcap;
	uint32_t *efrom, *eto;  /* edges */
	uint8_t *esure;         /* the edge's move is guaranteed to come */
	size_t ne, ecap;
};

static uint64_t world_hash(const uint8_t *p, size_t n)
{
	uint64_t h = 0xcbf29ce484222325ull;

	for (size_t i = 0; i < n; i++)
		h = (h ^ p[i]) * 0x100000001b3ull;
	return h;
}

static void search_grow(struct search *s)
{
	size_t sz = s->ops->size;

	s->cap = s->cap ? s->cap * 2 : 4096;
	s->worlds = realloc(s->worlds, s->cap * sz);
	s->parent = realloc(s->parent, s->cap * sizeof(*s->parent));
	s->via = realloc(s->via, s->cap * sizeof(*s->via));
	ck_assert(s->worlds && s->parent && s->via);
	free(s->slot);
	s->hcap = s->cap * 4;
	s->slot = calloc(s->hcap, sizeof(*s->slot));
	ck_assert(s->slot);
	for (size_t i = 0; i < s->n; i++) {
		size_t h = world_hash(s->worlds + i * sz, sz) & (s->hcap - 1);

		while (s->slot[h])
			h = (h + 1) & (s->hcap - 1);
		s->slot[h] = (uint32_t)i + 1;
	}
}

/* The index of world w, added (with its parent and move) if new. */
static uint32_t search_add(struct search *s, const uint8_t *w, int32_t parent,
			   struct move via, bool *added)
{
	size_t sz = s->ops->size, h;

	*added = false;
	if (s->n + 1 >= s->cap)
		search_grow(s);
	h = world_hash(w, sz) & (s->hcap - 1);
	while (s->slot[h]) {
		uint32_t i = s->slot[h] - 1;

		if (!memcmp(s->worlds + (size_t)i * sz, w, sz))
			return i;
		h = (h + 1) & (s->hcap - 1);
	}
	memcpy(s->worlds + s->n * sz, w, sz);
	s->parent[s->n] = parent;
	s->via[s->n] = via;
	s->slot[h] = (uint32_t)s->n + 1;
	*added = true;
	return (uint32_t)s->n++;
}

static void search_edge(struct search *s, uint32_t from, uint32_t to, bool sure)
{
	if (s->ne == s->ecap) {
		s->ecap = s->ecap ? s->ecap * 2 : 8192;
		s->efrom = realloc(s->efrom, s->ecap * sizeof(*s->efrom));
		s->eto = realloc(s->eto, s->ecap * sizeof(*s->eto));
		s->esure = realloc(s->esure, s->ecap);
		ck_assert(s->efrom && s->eto && s->esure);
	}
	s->efrom[s->ne] = from;
	s->esure[s->ne] = sure;
	s->eto[s->ne++] = to;
}

static void search_free(struct search *s)
{
	free(s->worlds);
	free(s->parent);
	free(s->via);
	free(s->slot);
	free(s->efrom);
	free(s->eto);
	free(s->esure);
}

static void print_path(const struct search *s, uint32_t i, const struct move *last)
{
	struct move t[MAX_TRACE];
	unsigned n = 0;

	if (last)
		t[n++] = *last;
	for (int32_t j = (int32_t)i; j > 0 && n < MAX_TRACE; j = s->parent[j])
		t[n++] = s->via[j];
	for (unsigned a = 0; a < n / 2; a++) {
		struct move x = t[a];

		t[a] = t[n - 1 - a];
		t[n - 1 - a] = x;
	}
	print_trace(s->m, t, n);
}

/* Explores every world reachable from the initial one (breadth first, so
 * a printed path is a shortest one), checks every step, then checks that
 * every world can still reach the terminal state. Returns true on a
 * violation (printed unless quiet); *n_worlds: how many were explored. */
static bool check_search(const struct world_ops *ops, const struct machine *m,
			 bool quiet, size_t *n_worlds)
{
	struct search s = { .ops = ops, .m = m };
	uint8_t w[64], x[64];
	struct move mv[MAX_MOVES];
	struct verdict v = { 0 };
	bool added, bad = false;
	uint32_t *rq = NULL;
	uint8_t *live = NULL;
	size_t *first = NULL, *next_e = NULL;

	ops->init(w);
	search_add(&s, w, -1, (struct move){ 0, 0 }, &added);
	for (size_t i = 0; i < s.n && !bad; i++) {
		unsigned k;

		memcpy(w, s.worlds + i * ops->size, ops->size);
		k = ops->moves(w, m, mv);
		if (!k && ((struct world_head *)w)->ms != m->terminal) {
			violation(&v, "stuck: no move can come in %s",
				  machine_state_name(m, ((struct world_head *)w)->ms));
			if (!quiet) {
				fprintf(stderr, "%s: %s\n", m->name, v.why);
				print_path(&s, (uint32_t)i, NULL);
			}
			bad = true;
			break;
		}
		for (unsigned j = 0; j < k; j++) {
			uint32_t to;

			memcpy(x, w, ops->size);
			world_step(ops, x, m, mv[j], &v);
			if (v.bad) {
				if (!quiet) {
					fprintf(stderr, "%s: %s\n", m->name, v.why);
					print_path(&s, (uint32_t)i, &mv[j]);
				}
				bad = true;
				break;
			}
			to = search_add(&s, x, (int32_t)i, mv[j], &added);
			search_edge(&s, (uint32_t)i, to, ops->guaranteed(w, mv[j]));
		}
	}
	*n_worlds = s.n;
	if (!bad) {
		/* backward search from the terminal worlds over the reversed
		 * edges of guaranteed moves: every world must reach the end
		 * without help from the peer, the client or the operator */
		size_t head = 0, tail = 0;

		live = calloc(s.n, 1);
		rq = malloc(s.n * sizeof(*rq));
		first = malloc(s.n * sizeof(*first));
		next_e = malloc((s.ne + 1) * sizeof(*next_e));
		ck_assert(live && rq && first && next_e);
		for (size_t i = 0; i < s.n; i++)
			first[i] = SIZE_MAX;
		for (size_t e = 0; e < s.ne; e++) {
			next_e[e] = first[s.eto[e]];
			first[s.eto[e]] = e;
		}
		for (size_t i = 0; i < s.n; i++)
			if (((struct world_head *)(s.worlds + i * ops->size))->ms ==
			    m->terminal) {
				live[i] = 1;
				rq[tail++] = (uint32_t)i;
			}
		while (head < tail) {
			uint32_t t = rq[head++];

			for (size_t e = first[t]; e != SIZE_MAX; e = next_e[e])
				if (s.esure[e] && !live[s.efrom[e]]) {
					live[s.efrom[e]] = 1;
					rq[tail++] = s.efrom[e];
				}
		}
		for (size_t i = 0; i < s.n; i++)
			if (!live[i]) {
				if (!quiet) {
					fprintf(stderr, "%s: no guaranteed continuation "
						"reaches %s from %s\n", m->name,
						machine_state_name(m, m->terminal),
						machine_state_name(m, ((struct world_head *)
						(s.worlds + i * ops->size))->ms));
					print_path(&s, (uint32_t)i, NULL);
				}
				bad = true;
				break;
			}
	}
	free(rq);
	free(live);
	free(first);
	free(next_e);
	search_free(&s);
	return bad;
}

/* ---- the table alone ---------------------------------------------------------- */

/* Over the table's GO edges only: the terminal state has no way out, and
 * every state reachable from the initial one can reach the terminal. */
static bool check_table_graph(const struct machine *m)
{
	bool reach[32] = { false }, live[32] = { false }, changed;

	ck_assert(m->n_states <= 32);
	for (unsigned e = 0; e < m->n_events; e++)
		if (machine_step(m, m->terminal, e)->kind == MSTEP_GO)
			return false;
	reach[m->initial] = true;
	live[m->terminal] = true;
	do {
		changed = false;
		for (unsigned a = 0; a < m->n_states; a++)
			for (unsigned b = 0; b < m->n_states; b++) {
				if (!machine_edge(m, a, b))
					continue;
				if (reach[a] && !reach[b])
					reach[b] = changed = true;
				if (live[b] && !live[a])
					live[a] = changed = true;
			}
	} while (changed);
	for (unsigned a = 0; a < m->n_states; a++)
		if (reach[a] && !live[a])
			return false;
	return true;
}

/* ---- scripted walks ----------------------------------------------------------- */

/* Applies move (ev, arg) to w, which must offer it; no violation allowed. */
static void drive(const struct world_ops *ops, void *w, const struct machine *m,
		  int ev, uint8_t arg)
{
	struct move mv[MAX_MOVES];
	unsigned k = ops->moves(w, m, mv);
	struct verdict v = { 0 };
	bool offered = false;
	char buf[64];

	for (unsigned i = 0; i < k; i++)
		if (mv[i].ev == ev && mv[i].arg == arg)
			offered = true;
	ck_assert_msg(offered, "%s: %s cannot happen in %s", m->name,
		      move_name(m, (struct move){ ev, arg }, buf, sizeof(buf)),
		      machine_state_name(m, ((struct world_head *)w)->ms));
	world_step(ops, w, m, (struct move){ ev, arg }, &v);
	ck_assert_msg(!v.bad, "%s: %s", m->name, v.why);
}

#define DRIVE_D(w, ev) drive(&dworld_ops, &(w), &dreq_machine, (ev), 0)
#define DRIVE_P(w, ev) drive(&pworld_ops, &(w), &preq_machine, (ev), 0)

static bool d_free_list(const struct dworld *w)
{
	return w->pages == PG_RELEASED && !w->fence && !w->quar;
}

/* ---- tests: the checker on the real tables ------------------------------------- */

START_TEST(test_tables_well_formed)
{
	const struct machine *ms[] = { &dreq_machine, &preq_machine };
	unsigned bits[] = { DA__BITS, PA__BITS };

	for (unsigned i = 0; i < 2; i++) {
		const struct machine *m = ms[i];

		for (unsigned s = 0; s < m->n_states; s++)
			ck_assert_ptr_nonnull(m->state_names[s]);
		for (unsigned e = 0; e < m->n_events; e++)
			ck_assert_ptr_nonnull(m->event_names[e]);
		for (unsigned b = 0; b < bits[i]; b++)
			ck_assert_ptr_nonnull(m->action_names[b]);
		for (unsigned s = 0; s < m->n_states; s++)
			for (unsigned e = 0; e < m->n_events; e++) {
				const struct machine_step *st = machine_step(m, s, e);

				if (st->kind != MSTEP_GO)
					continue;
				ck_assert_uint_lt(st->next, m->n_states);
				ck_assert_uint_eq(st->actions >> bits[i], 0);
			}
		ck_assert_msg(check_table_graph(m), "%s: a state cannot reach %s",
			      m->name, machine_state_name(m, m->terminal));
		ck_assert_int_eq(machine_step(m, m->n_states, 0)->kind, MSTEP_BUG);
	}
}
END_TEST

START_TEST(test_decode_random)
{
	uint64_t seed = test_seed();

	fprintf(stderr, "machine decode random: seed=%" PRIu64 "\n", seed);
	ck_assert_msg(!check_random(&dworld_ops, &dreq_machine, seed, 20000, false),
		      "decode: violation (seed %" PRIu64 ")", seed);
}
END_TEST

START_TEST(test_prefill_random)
{
	uint64_t seed = test_seed();

	fprintf(stderr, "machine prefill random: seed=%" PRIu64 "\n", seed);
	ck_assert_msg(!check_random(&pworld_ops, &preq_machine, seed, 20000, false),
		      "prefill: violation (seed %" PRIu64 ")", seed);
}
END_TEST

/* Every GO entry of the table must be exercised by the search (else the
 * world is too narrow to judge it); IGNORE entries the world never
 * produces are listed (they are defensive). */
static void check_coverage(const struct machine *m)
{
	unsigned missed = 0;

	for (unsigned s = 0; s < m->n_states; s++)
		for (unsigned e = 0; e < m->n_events; e++) {
			unsigned k = machine_step(m, s, e)->kind;

			if (k == MSTEP_BUG || entry_hit[s][e])
				continue;
			fprintf(stderr, "machine %s: %s entry %s + %s never exercised\n",
				m->name, k == MSTEP_GO ? "GO" : "IGNORE",
				machine_state_name(m, s), machine_event_name(m, e));
			missed += k == MSTEP_GO;
		}
	ck_assert_msg(!missed, "%s: %u GO entries not exercised", m->name, missed);
}

START_TEST(test_decode_exhaustive)
{
	size_t n;

	memset(entry_hit, 0, sizeof(entry_hit));
	ck_assert_msg(!check_search(&dworld_ops, &dreq_machine, false, &n),
		      "decode: violation in the exhaustive search");
	fprintf(stderr, "machine decode: %zu worlds explored\n", n);
	check_coverage(&dreq_machine);
}
END_TEST

START_TEST(test_prefill_exhaustive)
{
	size_t n;

	memset(entry_hit, 0, sizeof(entry_hit));
	ck_assert_msg(!check_search(&pworld_ops, &preq_machine, false, &n),
		      "prefill: violation in the exhaustive search");
	fprintf(stderr, "machine prefill: %zu worlds explored\n", n);
	check_coverage(&preq_machine);
}
END_TEST

/* ---- tests: mutations must be caught ------------------------------------------- */

struct mutation {
	const char *what;
	unsigned state, event;
	struct machine_step step;
};

#define GOM(n, a) { MSTEP_GO, (n), (a) }

static const struct mutation d_mutations[] = {
	{ "aborting+timeout unfences and ends without the ack",
	  DRS_ABORTING, DEV_TIMEOUT, GOM(DRS_DONE, DA_UNFENCE | DA_DETACH_PEER) },
	{ "transfer+timeout releases unfenced (no abort handshake)",
	  DRS_TRANSFER, DEV_TIMEOUT, GOM(DRS_ABORTING, DA_ANSWER_ERR | DA_SEND_ABORT |
					 DA_RELEASE | DA_UNFENCE | DA_TIMER_ABORT) },
	{ "aborting+abort_ack forgets to unfence (leak)",
	  DRS_ABORTING, DEV_ABORT_ACK, GOM(DRS_DONE, DA_DETACH_PEER) },
	{ "compute+finish never answers the client",
	  DRS_COMPUTE, DEV_FINISH, GOM(DRS_FREEING, DA_FREE_ENGINE) },
	{ "transfer+client_gone aborts the transfer",
	  DRS_TRANSFER, DEV_CLIENT_GONE, GOM(DRS_DONE, DA_DETACH_CLIENT | DA_RELEASE |
					     DA_UNFENCE | DA_DETACH_PEER) },
	{ "freeing+freed never ends",
	  DRS_FREEING, DEV_FREED, GOM(DRS_FREEING, 0) },
	{ "submit+op_abort answers twice",
	  DRS_SUBMIT, DEV_OP_ABORT, GOM(DRS_SUBMIT, DA_ANSWER_ERR) },
	{ "aborting+abort_ack_early unfences while batches still land",
	  DRS_ABORTING, DEV_ABORT_ACK_EARLY, GOM(DRS_DONE, DA_UNFENCE | DA_DETACH_PEER) },
	{ "abort_landing+timeout unfences without the landing",
	  DRS_ABORT_LANDING, DEV_TIMEOUT, GOM(DRS_DONE, DA_UNFENCE | DA_DETACH_PEER) },
	{ "transfer+seal unfences while the scope is still live",
	  DRS_TRANSFER, DEV_SEAL, GOM(DRS_SEALING, DA_UNFENCE) },
	{ "sealing+link_lost keeps the fence (the pages leak)",
	  DRS_SEALING, DEV_LINK_LOST, GOM(DRS_DONE, DA_ANSWER_ERR | DA_RELEASE |
					 DA_DETACH_PEER) },
	{ "aborting+batch is a bug",
	  DRS_ABORTING, DEV_BATCH, { MSTEP_BUG, 0, 0 } },
	{ "compute+client_gone releases under the engine",
	  DRS_COMPUTE, DEV_CLIENT_GONE, GOM(DRS_DONE, DA_DETACH_CLIENT | DA_RELEASE) },
	{ "transfer+link_lost_retry keeps the fence (the pages leak)",
	  DRS_TRANSFER, DEV_LINK_LOST_RETRY, GOM(DRS_NEW, DA_RELEASE | DA_DETACH_PEER |
						 DA_RETRY) },
	{ "transfer+reject_retry retries holding the pages",
	  DRS_TRANSFER, DEV_REJECT_RETRY, GOM(DRS_NEW, DA_UNFENCE | DA_DETACH_PEER |
					      DA_RETRY) },
	{ "sealing+reject_retry answers the client, then retries",
	  DRS_SEALING, DEV_REJECT_RETRY, GOM(DRS_NEW, DA_ANSWER_ERR | DA_RELEASE |
					     DA_UNFENCE | DA_DETACH_PEER | DA_RETRY) },
	{ "sealing+link_lost_retry retries still attached to the old peer",
	  DRS_SEALING, DEV_LINK_LOST_RETRY, GOM(DRS_NEW, DA_RELEASE | DA_UNFENCE |
						DA_RETRY) },
};

static const struct mutation p_mutations[] = {
	{ "abort_draining+peer_abort acks at once",
	  PRS_ABORT_DRAINING, PEV_PEER_ABORT, GOM(PRS_ABORT_DRAINING, PA_SEND_ABORT_ACK) },
	{ "sending+peer_abort acks at once",
	  PRS_SENDING, PEV_PEER_ABORT, GOM(PRS_ABORT_DRAINING, PA_SEND_ABORT_ACK) },
	{ "abort_draining+drained forgets the owed ack",
	  PRS_ABORT_DRAINING, PEV_DRAINED, GOM(PRS_FREEING, PA_FREE_ENGINE) },
	{ "sending+link_lost frees with sends pending",
	  PRS_SENDING, PEV_LINK_LOST, GOM(PRS_FREEING, PA_DETACH_LINK | PA_FREE_ENGINE) },
	{ "freeing+freed keeps the link",
	  PRS_FREEING, PEV_FREED, GOM(PRS_DONE, 0) },
	{ "admit_aborted+submitted ends without freeing",
	  PRS_ADMIT_ABORTED, PEV_SUBMITTED, GOM(PRS_DONE, PA_DETACH_LINK) },
	{ "wait_release+timeout waits for ever",
	  PRS_WAIT_RELEASE, PEV_TIMEOUT, GOM(PRS_WAIT_RELEASE, 0) },
	{ "sending+batch_sent sends prefill_done early",
	  PRS_SENDING, PEV_BATCH_SENT, GOM(PRS_WAIT_RELEASE, PA_SEND_DONE |
					   PA_TIMER_RELEASE) },
};

/* A copy of m whose table has one entry replaced. */
static struct machine mutate(const struct machine *m, struct machine_step *buf,
			     const struct mutation *mu)
{
	struct machine c = *m;

	memcpy(buf, m->table, sizeof(*buf) * m->n_states * m->n_events);
	buf[mu->state * m->n_events + mu->event] = mu->step;
	c.table = buf;
	return c;
}

static void check_mutations(const struct world_ops *ops, const struct machine *m,
			    const struct mutation *mus, unsigned n)
{
	struct machine_step buf[DRS__N * DEV__N + PRS__N * PEV__N];
	uint64_t seed = test_seed();

	for (unsigned i = 0; i < n; i++) {
		struct machine c = mutate(m, buf, &mus[i]);
		size_t nw;
		bool by_search = check_search(ops, &c, true, &nw);
		bool by_random = check_random(ops, &c, seed, 20000, true);

		ck_assert_msg(by_search, "%s: mutation '%s' not caught by the search",
			      m->name, mus[i].what);
		fprintf(stderr, "machine %s mutation '%s': caught (search%s)\n",
			m->name, mus[i].what, by_random ? ", random" : "");
	}
}

START_TEST(test_decode_mutations)
{
	check_mutations(&dworld_ops, &dreq_machine, d_mutations,
			sizeof(d_mutations) / sizeof(d_mutations[0]));
}
END_TEST

START_TEST(test_prefill_mutations)
{
	check_mutations(&pworld_ops, &preq_machine, p_mutations,
			sizeof(p_mutations) / sizeof(p_mutations[0]));
}
END_TEST

/* The mutation of the brief, by name: the random runs catch it too. */
START_TEST(test_mutation_aborting_timeout_done)
{
	struct machine_step buf[DRS__N * DEV__N];
	struct machine c = mutate(&dreq_machine, buf, &d_mutations[0]);
	size_t nw;

	ck_assert(check_search(&dworld_ops, &c, true, &nw));
	ck_assert(check_random(&dworld_ops, &c, test_seed(), 20000, true));
}
END_TEST

/* ---- tests: invariant 7 -------------------------------------------------------- */

START_TEST(test_inv7_abort_fence_until_ack)
{
	/* invariant 7 - abort: no page leaves the fence before abort_ack or
	 * link loss, whatever else happens meanwhile */
	const int abort_by[] = { DEV_TIMEOUT, DEV_OP_ABORT, DEV_BAD };

	for (unsigned i = 0; i < 3; i++) {
		struct dworld w;

		d_init(&w);
		DRIVE_D(w, DEV_ADMIT);
		drive(&dworld_ops, &w, &dreq_machine, M_SEND_OK, 0);
		DRIVE_D(w, DEV_BATCH);
		DRIVE_D(w, abort_by[i]);
		ck_assert_uint_eq(w.h.ms, DRS_ABORTING);
		ck_assert_uint_eq(w.pages, PG_RELEASED);
		ck_assert(w.fence && w.abort_sent && w.answered);
		/* late batches, a late prefill_done, the client leaving, an
		 * operator abort: the fence stays */
		DRIVE_D(w, DEV_BATCH);
		DRIVE_D(w, DEV_PREFILL_DONE);
		DRIVE_D(w, DEV_CLIENT_GONE);
		DRIVE_D(w, DEV_OP_ABORT);
		ck_assert(w.fence && !d_free_list(&w));
		DRIVE_D(w, DEV_ABORT_ACK);
		ck_assert_uint_eq(w.h.ms, DRS_DONE);
		ck_assert(d_free_list(&w) && !w.attached);
	}
}
END_TEST

START_TEST(test_inv7_abort_timeout_teardown)
{
	/* invariant 7 - no ack within release_timeout: the link is torn
	 * down, and the pages stay fenced until LINK_LOST says it is gone */
	struct dworld w;

	d_init(&w);
	DRIVE_D(w, DEV_ADMIT);
	drive(&dworld_ops, &w, &dreq_machine, M_SEND_OK, 0);
	DRIVE_D(w, DEV_TIMEOUT);
	ck_assert_uint_eq(w.h.ms, DRS_ABORTING);
	DRIVE_D(w, DEV_TIMEOUT);
	ck_assert_uint_eq(w.h.ms, DRS_ABORTING);
	ck_assert(w.link_down && w.fence && !d_free_list(&w));
	DRIVE_D(w, DEV_LINK_LOST);
	ck_assert_uint_eq(w.h.ms, DRS_DONE);
	ck_assert(d_free_list(&w));
}
END_TEST

START_TEST(test_inv7_crossing_aborts)
{
	/* invariant 7 - our abort crosses prefill's abort (or refusal):
	 * prefill gave the request up, which is all its ack would say */
	const int cross[] = { DEV_PEER_ABORT, DEV_REJECT };

	for (unsigned i = 0; i < 2; i++) {
		struct dworld w;

		d_init(&w);
		DRIVE_D(w, DEV_ADMIT);
		drive(&dworld_ops, &w, &dreq_machine, M_SEND_OK, 0);
		DRIVE_D(w, DEV_OP_ABORT);
		ck_assert(w.fence);
		DRIVE_D(w, cross[i]);
		ck_assert_uint_eq(w.h.ms, DRS_DONE);
		ck_assert(d_free_list(&w));
	}
}
END_TEST

START_TEST(test_inv7_prefill_ack_after_drain)
{
	/* invariant 7 - prefill: decode's abort is acknowledged once, and only
	 * when no batch of the request is queued any more */
	struct pworld w;

	p_init(&w);
	DRIVE_P(w, PEV_ADMIT);
	DRIVE_P(w, PEV_SUBMITTED);
	drive(&pworld_ops, &w, &preq_machine, PEV_COMPUTED, 3);
	drive(&pworld_ops, &w, &preq_machine, M_QUEUED, 0);
	ck_assert_uint_eq(w.pending, 2);
	DRIVE_P(w, PEV_PEER_ABORT);
	ck_assert_uint_eq(w.h.ms, PRS_ABORT_DRAINING);
	ck_assert_uint_eq(w.acks, 0);
	DRIVE_P(w, PEV_BATCH_SENT);
	ck_assert_uint_eq(w.acks, 0);
	DRIVE_P(w, PEV_SEND_FAIL);
	ck_assert_uint_eq(w.acks, 0);
	ck_assert(!w.free_queued);  /* a send still read our pages until now */
	DRIVE_P(w, PEV_DRAINED);
	ck_assert_uint_eq(w.acks, 1);
	ck_assert_uint_eq(w.h.ms, PRS_FREEING);
	DRIVE_P(w, PEV_FREED);
	ck_assert_uint_eq(w.h.ms, PRS_DONE);
	ck_assert(!w.attached && !w.holds);
}
END_TEST

START_TEST(test_inv7_prefill_link_lost_no_ack)
{
	/* invariant 7 - prefill: with the link gone nothing can write, so no
	 * ack is owed; the pages wait for the pending sends all the same */
	struct pworld w;

	p_init(&w);
	DRIVE_P(w, PEV_ADMIT);
	DRIVE_P(w, PEV_SUBMITTED);
	drive(&pworld_ops, &w, &preq_machine, PEV_COMPUTED, 1);
	drive(&pworld_ops, &w, &preq_machine, M_QUEUED, 0);
	DRIVE_P(w, PEV_PEER_ABORT);
	DRIVE_P(w, PEV_LINK_LOST);
	ck_assert(!w.free_queued && w.pending == 1);
	DRIVE_P(w, PEV_SEND_FAIL);
	DRIVE_P(w, PEV_DRAINED);
	ck_assert_uint_eq(w.acks, 0);
	DRIVE_P(w, PEV_FREED);
	ck_assert_uint_eq(w.h.ms, PRS_DONE);
}
END_TEST

/* ---- tests: invariant 8 -------------------------------------------------------- */

START_TEST(test_inv8_client_gone_mid_transfer)
{
	/* invariant 8 - client gone mid-transfer: the transfer still
	 * completes, then the pages are released */
	struct dworld w;

	d_init(&w);
	DRIVE_D(w, DEV_ADMIT);
	drive(&dworld_ops, &w, &dreq_machine, M_SEND_OK, 0);
	DRIVE_D(w, DEV_BATCH);
	DRIVE_D(w, DEV_CLIENT_GONE);
	/* nothing aborted: still transferring, pages reserved and fenced */
	ck_assert_uint_eq(w.h.ms, DRS_TRANSFER);
	ck_assert(!w.abort_sent && w.fence && w.pages == PG_HELD && w.may_write);
	drive(&dworld_ops, &w, &dreq_machine, DEV_PREFILL_DONE, 1);
	DRIVE_D(w, DEV_BATCH);
	DRIVE_D(w, DEV_COVERED_ORPHAN);
	ck_assert_uint_eq(w.h.ms, DRS_DONE);
	ck_assert(d_free_list(&w) && !w.attached && !w.abort_sent);
}
END_TEST

START_TEST(test_inv8_client_gone_then_abort)
{
	/* invariant 8 - an orphan whose transfer then fails still runs the
	 * whole abort handshake (and answers nobody) */
	struct dworld w;

	d_init(&w);
	DRIVE_D(w, DEV_ADMIT);
	drive(&dworld_ops, &w, &dreq_machine, M_SEND_OK, 0);
	DRIVE_D(w, DEV_CLIENT_GONE);
	DRIVE_D(w, DEV_TIMEOUT);
	ck_assert_uint_eq(w.h.ms, DRS_ABORTING);
	ck_assert(w.abort_sent && w.fence && !w.answered);
	DRIVE_D(w, DEV_ABORT_ACK);
	ck_assert_uint_eq(w.h.ms, DRS_DONE);
	ck_assert(d_free_list(&w));
}
END_TEST

START_TEST(test_inv8_client_gone_in_compute)
{
	/* invariant 8 - client gone while generating: the engine request is
	 * freed, its pages released only when FREED says so */
	struct dworld w;

	d_init(&w);
	DRIVE_D(w, DEV_ADMIT);
	drive(&dworld_ops, &w, &dreq_machine, M_SEND_OK, 0);
	DRIVE_D(w, DEV_PREFILL_DONE);
	DRIVE_D(w, DEV_COVERED);
	drive(&dworld_ops, &w, &dreq_machine, M_SUBMIT_OK, 0);
	DRIVE_D(w, DEV_SUBMITTED);
	DRIVE_D(w, DEV_TOKEN);
	DRIVE_D(w, DEV_CLIENT_GONE);
	ck_assert_uint_eq(w.h.ms, DRS_FREEING);
	ck_assert(w.holds && w.pages == PG_HELD);
	DRIVE_D(w, DEV_TOKEN);   /* queued before the free: ignored */
	DRIVE_D(w, DEV_FREED);
	ck_assert_uint_eq(w.h.ms, DRS_DONE);
	ck_assert(d_free_list(&w) && !w.answered);
}
END_TEST

START_TEST(test_inv8_answered_once)
{
	/* invariant 8 - operator abort while queued for compute: one error
	 * answer, and the engine's later verdict answers nobody */
	struct dworld w;

	d_init(&w);
	DRIVE_D(w, DEV_ADMIT_LOCAL);
	drive(&dworld_ops, &w, &dreq_machine, M_SUBMIT_OK, 0);
	DRIVE_D(w, DEV_OP_ABORT);
	ck_assert(w.answered && !w.client);
	DRIVE_D(w, DEV_SUBMITTED_ORPHAN);
	ck_assert_uint_eq(w.h.ms, DRS_FREEING);
	DRIVE_D(w, DEV_FREED);
	ck_assert_uint_eq(w.h.ms, DRS_DONE);
}
END_TEST

START_TEST(test_failover_link_lost)
{
	/* a transfer whose peer is lost part-way starts over from NEW with
	 * nothing of the first attempt (pages back, unfenced, detached),
	 * then completes on the next peer; a second loss, with no failover
	 * left, is the client's error */
	struct dworld w;
	struct move mv[MAX_MOVES];
	unsigned n;

	d_init(&w);
	DRIVE_D(w, DEV_ADMIT);
	drive(&dworld_ops, &w, &dreq_machine, M_SEND_OK, 0);
	DRIVE_D(w, DEV_BATCH);
	DRIVE_D(w, DEV_LINK_LOST_RETRY);
	ck_assert_uint_eq(w.h.ms, DRS_NEW);
	ck_assert(!w.fence && !w.attached && !w.answered && !w.h.timer);
	ck_assert_uint_eq(w.retries, 1);
	DRIVE_D(w, DEV_ADMIT);
	drive(&dworld_ops, &w, &dreq_machine, M_SEND_OK, 0);
	ck_assert(w.fence && w.attached && w.h.timer);
	n = dworld_ops.moves(&w, &dreq_machine, mv);
	for (unsigned i = 0; i < n; i++)
		ck_assert_int_ne(mv[i].ev, DEV_LINK_LOST_RETRY);
	DRIVE_D(w, DEV_LINK_LOST);
	ck_assert_uint_eq(w.h.ms, DRS_DONE);
	ck_assert(w.answered && d_free_list(&w));
}
END_TEST

START_TEST(test_failover_reject_local)
{
	/* a draining prefill's refusal while sealing (nothing streamed):
	 * placed again, this time here */
	struct dworld w;

	d_init(&w);
	DRIVE_D(w, DEV_ADMIT);
	drive(&dworld_ops, &w, &dreq_machine, M_SEND_OK, 0);
	DRIVE_D(w, DEV_REJECT_RETRY);
	ck_assert_uint_eq(w.h.ms, DRS_NEW);
	ck_assert(!w.fence && w.pages == PG_NONE && !w.answered);
	DRIVE_D(w, DEV_ADMIT_LOCAL);
	ck_assert_uint_eq(w.h.ms, DRS_SUBMIT);
	drive(&dworld_ops, &w, &dreq_machine, M_SUBMIT_OK, 0);
	DRIVE_D(w, DEV_SUBMITTED);
	DRIVE_D(w, DEV_FINISH);
	DRIVE_D(w, DEV_FREED);
	ck_assert_uint_eq(w.h.ms, DRS_DONE);
	ck_assert(w.answered);
	/* the table: no retry once the engine has it */
	ck_assert_int_eq(machine_step(&dreq_machine, DRS_SUBMIT, DEV_REJECT_RETRY)->kind,
			 MSTEP_BUG);
	ck_assert_int_eq(machine_step(&dreq_machine, DRS_ABORTING,
				      DEV_LINK_LOST_RETRY)->kind, MSTEP_BUG);
}
END_TEST

START_TEST(test_late_events_in_done)
{
	/* a terminal request ignores what may still race in */
	ck_assert_int_eq(machine_step(&dreq_machine, DRS_DONE, DEV_CLIENT_GONE)->kind,
			 MSTEP_IGNORE);
	ck_assert_int_eq(machine_step(&dreq_machine, DRS_DONE, DEV_OP_ABORT)->kind,
			 MSTEP_IGNORE);
	ck_assert_int_eq(machine_step(&preq_machine, PRS_DONE, PEV_PEER_ABORT)->kind,
			 MSTEP_IGNORE);
	ck_assert_int_eq(machine_step(&preq_machine, PRS_DONE, PEV_RELEASE_ACK)->kind,
			 MSTEP_IGNORE);
	ck_assert_int_eq(machine_step(&preq_machine, PRS_DONE, PEV_LINK_LOST)->kind,
			 MSTEP_IGNORE);
}
END_TEST

/* ---- the drawing (daemon/README.md) ------------------------------------------- */

static void draw(const struct machine *m)
{
	char buf[256];

	printf("%s: %s -> ... -> %s\n", m->name, machine_state_name(m, m->initial),
	       machine_state_name(m, m->terminal));
	for (unsigned s = 0; s < m->n_states; s++) {
		bool any = false;

		printf("\n  %s\n", machine_state_name(m, s));
		for (unsigned e = 0; e < m->n_events; e++) {
			const struct machine_step *st = machine_step(m, s, e);

			if (st->kind != MSTEP_GO)
				continue;
			any = true;
			machine_actions_str(m, st->actions, buf, sizeof(buf));
			printf("    --%s%s%s--> %s\n", machine_event_name(m, e),
			       buf[0] ? " / " : "", buf,
			       st->next == s ? "(same)" : machine_state_name(m, st->next));
		}
		buf[0] = '\0';
		for (unsigned e = 0; e < m->n_events; e++)
			if (machine_step(m, s, e)->kind == MSTEP_IGNORE) {
				size_t o = strlen(buf);

				snprintf(buf + o, sizeof(buf) - o, "%s%s", o ? " " : "",
					 machine_event_name(m, e));
			}
		if (buf[0])
			printf("    ignores: %s\n", buf);
		if (!any)
			printf("    (terminal)\n");
	}
}

static Suite *machine_suite(void)
{
	Suite *s = suite_create("machine");
	TCase *tc = tcase_create("core");

	tcase_set_timeout(tc, 600);
	tcase_add_test(tc, test_tables_well_formed);
	tcase_add_test(tc, test_decode_random);
	tcase_add_test(tc, test_prefill_random);
	tcase_add_test(tc, test_decode_exhaustive);
	tcase_add_test(tc, test_prefill_exhaustive);
	tcase_add_test(tc, test_decode_mutations);
	tcase_add_test(tc, test_prefill_mutations);
	tcase_add_test(tc, test_mutation_aborting_timeout_done);
	tcase_add_test(tc, test_inv7_abort_fence_until_ack);
	tcase_add_test(tc, test_inv7_abort_timeout_teardown);
	tcase_add_test(tc, test_inv7_crossing_aborts);
	tcase_add_test(tc, test_inv7_prefill_ack_after_drain);
	tcase_add_test(tc, test_inv7_prefill_link_lost_no_ack);
	tcase_add_test(tc, test_inv8_client_gone_mid_transfer);
	tcase_add_test(tc, test_inv8_client_gone_then_abort);
	tcase_add_test(tc, test_inv8_client_gone_in_compute);
	tcase_add_test(tc, test_inv8_answered_once);
	tcase_add_test(tc, test_failover_link_lost);
	tcase_add_test(tc, test_failover_reject_local);
	tcase_add_test(tc, test_late_events_in_done);
	suite_add_tcase(s, tc);
	return s;
}

int main(int argc, char **argv)
{
	SRunner *sr;
	int failed;

	if (argc > 1 && !strcmp(argv[1], "--draw")) {
		draw(&dreq_machine);
		printf("\n");
		draw(&preq_machine);
		return 0;
	}
	sr = srunner_create(machine_suite());
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
