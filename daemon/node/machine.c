/* machine.c - the two request machines' tables (see machine.h), and the
 * few pure functions that read them.
 *
 * Reading a row: GO(next, actions) - the actions run in bit order, after
 * the state changed to `next`; IGN - a late event, nothing changes; an
 * entry left out is a BUG step. Every row is drawn in daemon/README.md
 * and has its Promela twin in tests/model/transfer.pml.
 */
#include "daemon/node/machine.h"

#include <stdio.h>
#include <string.h>

#define GO(n, a) { MSTEP_GO, (n), (a) }
#define IGN { MSTEP_IGNORE, 0, 0 }

const struct machine_step *machine_step(const struct machine *m, unsigned state,
					unsigned event)
{
	static const struct machine_step bug = { MSTEP_BUG, 0, 0 };

	if (state >= m->n_states || event >= m->n_events)
		return &bug;
	return &m->table[state * m->n_events + event];
}

bool machine_edge(const struct machine *m, unsigned from, unsigned to)
{
	for (unsigned e = 0; e < m->n_events; e++) {
		const struct machine_step *st = machine_step(m, from, e);

		if (st->kind == MSTEP_GO && st->next == to)
			return true;
	}
	return false;
}

const char *machine_state_name(const struct machine *m, unsigned state)
{
	return state < m->n_states ? m->state_names[state] : "?";
}

const char *machine_event_name(const struct machine *m, unsigned event)
{
	return event < m->n_events ? m->event_names[event] : "?";
}

const char *machine_actions_str(const struct machine *m, uint32_t actions,
				char *buf, unsigned size)
{
	size_t o = 0;

	if (size)
		buf[0] = '\0';
	for (unsigned i = 0; i < 32 && size; i++) {
		const char *n;
		int w;

		if (!(actions & (1u << i)))
			continue;
		n = m->action_names[i] ? m->action_names[i] : "?";
		w = snprintf(buf + o, size - o, "%s%s", o ? "|" : "", n);
		if (w < 0 || (size_t)w >= size - o)
			break;
		o += (size_t)w;
	}
	return buf;
}

/* ---- decode ------------------------------------------------------------------ */

/* What a failed transfer does while the peer may still be writing: tell
 * it, answer the client, release the table (the prefix stays FENCED) and
 * wait for the ack - at most release_timeout_ms, then the link goes. */
#define D_ABORT (DA_ANSWER_ERR | DA_SEND_ABORT | DA_RELEASE | DA_TIMER_ABORT)
/* What a failed transfer does when nothing can write any more. */
#define D_GONE (DA_ANSWER_ERR | DA_UNFENCE | DA_RELEASE | DA_DETACH_PEER)
/* Failover: what a failed transfer does when nothing can write any more
 * and nothing reached the client yet - D_GONE without the answer, then
 * the request is placed again (DA_RETRY, from NEW). */
#define D_RETRY (DA_UNFENCE | DA_RELEASE | DA_DETACH_PEER | DA_RETRY)
/* The KV is complete: the peer is done with it. */
#define D_COVERED (DA_SEND_RELEASE_ACK | DA_UNFENCE | DA_DETACH_PEER)

/* What TRANSFER and SEALING (the same request, every batch in, the scope
 * being revoked) do alike: the final check's verdicts, and every failure
 * before it while the pages are still fenced. */
#define D_TRANSFER_COMMON(self)						\
	[DEV_BAD] = GO(DRS_ABORTING, D_ABORT),				\
	/* prefill's first token waits for the engine (SUBMITTED) */	\
	[DEV_COVERED] = GO(DRS_SUBMIT, D_COVERED | DA_SUBMIT),		\
	[DEV_COVERED_FINAL] = GO(DRS_DONE, D_COVERED | DA_STREAM_FIRST |	\
				 DA_ANSWER_FINAL | DA_RELEASE),		\
	[DEV_COVERED_ORPHAN] = GO(DRS_DONE, D_COVERED | DA_RELEASE),	\
	[DEV_COVERED_FAIL] = GO(DRS_DONE, D_COVERED | DA_ANSWER_ERR | DA_RELEASE), \
	[DEV_TAG_BAD] = GO(DRS_DONE, D_COVERED | DA_ANSWER_ERR | DA_QUARANTINE), \
	[DEV_REJECT] = GO(DRS_DONE, D_GONE),				\
	[DEV_PEER_ABORT] = GO(DRS_DONE, D_GONE | DA_SEND_ABORT_ACK),	\
	/* an ack decode never asked for (a lying peer): nothing */	\
	[DEV_ABORT_ACK] = IGN,						\
	[DEV_ABORT_ACK_EARLY] = IGN,					\
	[DEV_TIMEOUT] = GO(DRS_ABORTING, D_ABORT),			\
	[DEV_LINK_LOST] = GO(DRS_DONE, D_GONE),				\
	[DEV_REJECT_RETRY] = GO(DRS_NEW, D_RETRY),			\
	[DEV_LINK_LOST_RETRY] = GO(DRS_NEW, D_RETRY),			\
	[DEV_CLIENT_GONE] = GO(self, DA_DETACH_CLIENT),			\
	[DEV_OP_ABORT] = GO(DRS_ABORTING, D_ABORT)

static const struct machine_step dreq_table[DRS__N][DEV__N] = {
	[DRS_NEW] = {
		[DEV_ADMIT] = GO(DRS_TRANSFER, DA_TIMER_PREFILL),
		[DEV_ADMIT_LOCAL] = GO(DRS_SUBMIT, DA_SUBMIT),
		[DEV_REFUSE] = GO(DRS_DONE, DA_ANSWER_ERR),
		[DEV_BREACH] = GO(DRS_DONE, DA_ANSWER_ERR | DA_QUARANTINE),
	},
	[DRS_TRANSFER] = {
		D_TRANSFER_COMMON(DRS_TRANSFER),
		[DEV_BATCH] = GO(DRS_TRANSFER, 0),
		[DEV_PREFILL_DONE] = GO(DRS_TRANSFER, DA_TIMER_TRANSFER),
		[DEV_SEND_FAIL] = GO(DRS_DONE, D_GONE),
		[DEV_SEAL] = GO(DRS_SEALING, DA_KEEP_TIMER),
	},
	/* a batch that passed its checks cannot come (every page is in):
	 * a BUG; a late prefill_done changes nothing */
	[DRS_SEALING] = {
		D_TRANSFER_COMMON(DRS_SEALING),
		[DEV_PREFILL_DONE] = IGN,
	},
	[DRS_ABORTING] = {
		[DEV_BATCH] = IGN,
		[DEV_BAD] = IGN,
		[DEV_PREFILL_DONE] = IGN,
		[DEV_ABORT_ACK] = GO(DRS_DONE, DA_UNFENCE | DA_DETACH_PEER),
		/* RDMA: prefill has stopped, but what it posted may still be
		 * landing in our pages: the fence waits for the count, under
		 * the abort's deadline */
		[DEV_ABORT_ACK_EARLY] = GO(DRS_ABORT_LANDING, DA_KEEP_TIMER),
		/* our abort crossed prefill's abort or refusal: it gave the
		 * request up, which is all its ack would say */
		[DEV_PEER_ABORT] = GO(DRS_DONE, DA_SEND_ABORT_ACK | DA_UNFENCE |
				      DA_DETACH_PEER),
		[DEV_REJECT] = GO(DRS_DONE, DA_UNFENCE | DA_DETACH_PEER),
		/* no ack in time: the link goes, which ends every write */
		[DEV_TIMEOUT] = GO(DRS_ABORTING, DA_TEARDOWN),
		[DEV_LINK_LOST] = GO(DRS_DONE, DA_UNFENCE | DA_DETACH_PEER),
		[DEV_CLIENT_GONE] = GO(DRS_ABORTING, DA_DETACH_CLIENT),
		[DEV_OP_ABORT] = IGN,
	},
	[DRS_ABORT_LANDING] = {
		/* completions of batches prefill posted: counted, not written */
		[DEV_BATCH] = IGN,
		[DEV_BAD] = IGN,
		[DEV_PREFILL_DONE] = IGN,
		[DEV_LANDED] = GO(DRS_DONE, DA_UNFENCE | DA_DETACH_PEER),
		/* a repeated ack cannot lower the count (the largest one
		 * said is kept): LANDED still decides */
		[DEV_ABORT_ACK] = IGN,
		[DEV_ABORT_ACK_EARLY] = IGN,
		[DEV_PEER_ABORT] = IGN,
		[DEV_REJECT] = IGN,
		/* the batches never landed in time: the link goes, and its
		 * flush ends every write */
		[DEV_TIMEOUT] = GO(DRS_ABORT_LANDING, DA_TEARDOWN),
		[DEV_LINK_LOST] = GO(DRS_DONE, DA_UNFENCE | DA_DETACH_PEER),
		[DEV_CLIENT_GONE] = GO(DRS_ABORT_LANDING, DA_DETACH_CLIENT),
		[DEV_OP_ABORT] = IGN,
	},
	[DRS_SUBMIT] = {
		/* a decode request's first token (prefill's) goes out as the
		 * step that computes its second starts (daemon/README.md) */
		[DEV_SUBMITTED] = GO(DRS_COMPUTE, DA_STREAM_FIRST),
		[DEV_SUBMITTED_ORPHAN] = GO(DRS_FREEING, DA_FREE_ENGINE),
		[DEV_SUBMIT_ERR] = GO(DRS_FREEING, DA_ANSWER_ERR | DA_FREE_ENGINE),
		[DEV_SUBMIT_FAIL] = GO(DRS_DONE, DA_ANSWER_ERR | DA_RELEASE),
		[DEV_CLIENT_GONE] = GO(DRS_SUBMIT, DA_DETACH_CLIENT),
		[DEV_OP_ABORT] = GO(DRS_SUBMIT, DA_ANSWER_ERR | DA_DETACH_CLIENT),
	},
	[DRS_COMPUTE] = {
		[DEV_TOKEN] = GO(DRS_COMPUTE, DA_STREAM),
		[DEV_FINISH] = GO(DRS_FREEING, DA_ANSWER_FINAL | DA_FREE_ENGINE),
		[DEV_ENGINE_FAIL] = GO(DRS_FREEING, DA_ANSWER_ERR | DA_FREE_ENGINE),
		[DEV_CLIENT_GONE] = GO(DRS_FREEING, DA_DETACH_CLIENT | DA_FREE_ENGINE),
		[DEV_OP_ABORT] = GO(DRS_FREEING, DA_ANSWER_ERR | DA_DETACH_CLIENT |
				    DA_FREE_ENGINE),
	},
	[DRS_FREEING] = {
		[DEV_TOKEN] = IGN,
		[DEV_FINISH] = IGN,
		[DEV_ENGINE_FAIL] = IGN,
		[DEV_CLIENT_GONE] = GO(DRS_FREEING, DA_DETACH_CLIENT),
		[DEV_OP_ABORT] = IGN,
		[DEV_FREED] = GO(DRS_DONE, 0),
	},
	[DRS_DONE] = {
		[DEV_CLIENT_GONE] = IGN,
		[DEV_OP_ABORT] = IGN,
	},
};

static const char *const dreq_state_names[DRS__N] = {
	"new", "transfer", "sealing", "aborting", "abort_landing", "submit", "compute",
	"freeing", "done",
};

static const char *const dreq_event_names[DEV__N] = {
	[DEV_ADMIT] = "admit", [DEV_ADMIT_LOCAL] = "admit_local",
	[DEV_REFUSE] = "refuse", [DEV_BATCH] = "batch", [DEV_BAD] = "bad",
	[DEV_PREFILL_DONE] = "prefill_done", [DEV_SEAL] = "seal",
	[DEV_COVERED] = "covered",
	[DEV_COVERED_FINAL] = "covered_final",
	[DEV_COVERED_ORPHAN] = "covered_orphan",
	[DEV_COVERED_FAIL] = "covered_fail", [DEV_TAG_BAD] = "tag_bad",
	[DEV_REJECT] = "reject", [DEV_PEER_ABORT] = "peer_abort",
	[DEV_ABORT_ACK] = "abort_ack", [DEV_ABORT_ACK_EARLY] = "abort_ack_early",
	[DEV_LANDED] = "landed", [DEV_TIMEOUT] = "timeout",
	[DEV_SEND_FAIL] = "send_fail", [DEV_BREACH] = "breach",
	[DEV_LINK_LOST] = "link_lost", [DEV_CLIENT_GONE] = "client_gone",
	[DEV_OP_ABORT] = "op_abort", [DEV_SUBMITTED] = "submitted",
	[DEV_SUBMITTED_ORPHAN] = "submitted_orphan",
	[DEV_SUBMIT_ERR] = "submit_err", [DEV_SUBMIT_FAIL] = "submit_fail",
	[DEV_TOKEN] = "token", [DEV_FINISH] = "finish",
	[DEV_ENGINE_FAIL] = "engine_fail", [DEV_FREED] = "freed",
	[DEV_REJECT_RETRY] = "reject_retry",
	[DEV_LINK_LOST_RETRY] = "link_lost_retry",
};

static const char *const dreq_action_names[32] = {
	"answer_err", "stream_first", "stream", "answer_final", "detach_client",
	"send_abort", "send_abort_ack", "send_release_ack", "release", "unfence",
	"quarantine", "detach_peer", "timer_prefill", "timer_transfer",
	"timer_abort", "free_engine", "submit", "teardown", "keep_timer",
	"retry",
};

const struct machine dreq_machine = {
	.name = "decode",
	.n_states = DRS__N, .n_events = DEV__N,
	.initial = DRS_NEW, .terminal = DRS_DONE,
	.state_names = dreq_state_names, .event_names = dreq_event_names,
	.action_names = dreq_action_names,
	.table = &dreq_table[0][0],
	.keep_timer = DA_KEEP_TIMER,
};

/* ---- prefill ----------------------------------------------------------------- */

static const struct machine_step preq_table[PRS__N][PEV__N] = {
	[PRS_NEW] = {
		[PEV_ADMIT] = GO(PRS_ADMITTED, 0),
		[PEV_REFUSE] = GO(PRS_DONE, PA_SEND_REJECT | PA_DETACH_LINK),
	},
	[PRS_ADMITTED] = {
		[PEV_SUBMITTED] = GO(PRS_COMPUTE, 0),
		[PEV_SUBMIT_ERR] = GO(PRS_DONE, PA_SEND_REJECT | PA_DETACH_LINK),
		/* decode holds its pages fenced until this ack: answer now,
		 * nothing of the request is queued for sending */
		[PEV_PEER_ABORT] = GO(PRS_ADMIT_ABORTED, PA_SEND_ABORT_ACK),
		[PEV_OP_ABORT] = GO(PRS_ADMIT_ABORTED, PA_SEND_ABORT),
		[PEV_LINK_LOST] = GO(PRS_ADMIT_ABORTED, PA_DETACH_LINK),
		[PEV_RELEASE_ACK] = IGN,
	},
	[PRS_ADMIT_ABORTED] = {
		[PEV_SUBMITTED] = GO(PRS_FREEING, PA_FREE_ENGINE),
		/* the refusal still goes out (decode ignores it: it holds
		 * nothing of the request any more) */
		[PEV_SUBMIT_ERR] = GO(PRS_DONE, PA_SEND_REJECT | PA_DETACH_LINK),
		[PEV_PEER_ABORT] = GO(PRS_ADMIT_ABORTED, PA_SEND_ABORT_ACK),
		[PEV_OP_ABORT] = IGN,
		[PEV_LINK_LOST] = GO(PRS_ADMIT_ABORTED, PA_DETACH_LINK),
		[PEV_RELEASE_ACK] = IGN,
	},
	[PRS_COMPUTE] = {
		[PEV_TOKEN] = GO(PRS_COMPUTE, 0),
		[PEV_COMPUTED] = GO(PRS_SENDING, PA_SEND_MORE),
		[PEV_COMPUTE_FAIL] = GO(PRS_FREEING, PA_SEND_ABORT | PA_FREE_ENGINE),
		/* nothing was queued for it: cancel the compute */
		[PEV_PEER_ABORT] = GO(PRS_FREEING, PA_SEND_ABORT_ACK | PA_FREE_ENGINE),
		[PEV_OP_ABORT] = GO(PRS_FREEING, PA_SEND_ABORT | PA_FREE_ENGINE),
		[PEV_LINK_LOST] = GO(PRS_FREEING, PA_DETACH_LINK | PA_FREE_ENGINE),
		[PEV_RELEASE_ACK] = IGN,
	},
	[PRS_SENDING] = {
		[PEV_BATCH_SENT] = GO(PRS_SENDING, PA_SEND_MORE),
		[PEV_SEND_FAIL] = GO(PRS_ABORT_DRAINING, PA_SEND_ABORT),
		[PEV_ALL_SENT] = GO(PRS_WAIT_RELEASE, PA_SEND_DONE | PA_TIMER_RELEASE),
		/* batches may be queued: the ack waits until none is */
		[PEV_PEER_ABORT] = GO(PRS_ABORT_DRAINING, PA_OWE_ACK),
		[PEV_OP_ABORT] = GO(PRS_ABORT_DRAINING, PA_SEND_ABORT),
		[PEV_LINK_LOST] = GO(PRS_ABORT_DRAINING, PA_DETACH_LINK),
		[PEV_RELEASE_ACK] = IGN,
	},
	[PRS_ABORT_DRAINING] = {
		[PEV_BATCH_SENT] = GO(PRS_ABORT_DRAINING, 0),
		[PEV_SEND_FAIL] = GO(PRS_ABORT_DRAINING, 0),
		[PEV_DRAINED] = GO(PRS_FREEING, PA_ACK_OWED | PA_FREE_ENGINE),
		[PEV_PEER_ABORT] = GO(PRS_ABORT_DRAINING, PA_OWE_ACK),
		[PEV_OP_ABORT] = IGN,
		[PEV_LINK_LOST] = GO(PRS_ABORT_DRAINING, PA_DETACH_LINK),
		[PEV_RELEASE_ACK] = IGN,
	},
	[PRS_WAIT_RELEASE] = {
		[PEV_RELEASE_ACK] = GO(PRS_FREEING, PA_RELEASED | PA_FREE_ENGINE),
		[PEV_TIMEOUT] = GO(PRS_FREEING, PA_COUNT_TIMEOUT | PA_FREE_ENGINE),
		[PEV_PEER_ABORT] = GO(PRS_FREEING, PA_SEND_ABORT_ACK | PA_FREE_ENGINE),
		[PEV_OP_ABORT] = GO(PRS_FREEING, PA_SEND_ABORT | PA_FREE_ENGINE),
		[PEV_LINK_LOST] = GO(PRS_FREEING, PA_DETACH_LINK | PA_FREE_ENGINE),
	},
	[PRS_FREEING] = {
		[PEV_TOKEN] = IGN,
		[PEV_COMPUTED] = IGN,
		[PEV_COMPUTE_FAIL] = IGN,
		[PEV_RELEASE_ACK] = IGN,
		/* our own abort crossed decode's: decode still waits */
		[PEV_PEER_ABORT] = GO(PRS_FREEING, PA_SEND_ABORT_ACK),
		[PEV_OP_ABORT] = IGN,
		[PEV_LINK_LOST] = GO(PRS_FREEING, PA_DETACH_LINK),
		[PEV_FREED] = GO(PRS_DONE, PA_DETACH_LINK),
	},
	[PRS_DONE] = {
		[PEV_PEER_ABORT] = IGN,
		[PEV_OP_ABORT] = IGN,
		[PEV_LINK_LOST] = IGN,
		[PEV_RELEASE_ACK] = IGN,
	},
};

static const char *const preq_state_names[PRS__N] = {
	"new", "admitted", "admit_aborted", "compute", "sending",
	"abort_draining", "wait_release", "freeing", "done",
};

static const char *const preq_event_names[PEV__N] = {
	[PEV_ADMIT] = "admit", [PEV_REFUSE] = "refuse",
	[PEV_SUBMITTED] = "submitted", [PEV_SUBMIT_ERR] = "submit_err",
	[PEV_TOKEN] = "token", [PEV_COMPUTED] = "computed",
	[PEV_COMPUTE_FAIL] = "compute_fail", [PEV_BATCH_SENT] = "batch_sent",
	[PEV_SEND_FAIL] = "send_fail", [PEV_ALL_SENT] = "all_sent",
	[PEV_DRAINED] = "drained", [PEV_RELEASE_ACK] = "release_ack",
	[PEV_TIMEOUT] = "timeout", [PEV_PEER_ABORT] = "peer_abort",
	[PEV_OP_ABORT] = "op_abort", [PEV_LINK_LOST] = "link_lost",
	[PEV_FREED] = "freed",
};

static const char *const preq_action_names[32] = {
	"send_reject", "send_abort", "owe_ack", "send_abort_ack", "ack_owed",
	"detach_link", "send_more", "send_done", "timer_release", "released",
	"count_timeout", "free_engine",
};

const struct machine preq_machine = {
	.name = "prefill",
	.n_states = PRS__N, .n_events = PEV__N,
	.initial = PRS_NEW, .terminal = PRS_DONE,
	.state_names = preq_state_names, .event_names = preq_event_names,
	.action_names = preq_action_names,
	.table = &preq_table[0][0],
};
