/* fault.h - test fault points (compiled in only when KVD_FAULT_POINTS).
 *
 * A node reads KVD_FAULT from its environment once at start, e.g.
 *   KVD_FAULT=corrupt_batch:1,slow_batch
 * Each point may carry a count (fire that many times, then stop); without
 * a count it fires every time. The state lives in a struct the node owns
 * (no globals) and is only touched from the loop thread.
 *
 * Points:
 *   corrupt_batch        prefill flips one payload byte after checksumming
 *   short_transfer       prefill sends one page fewer than it was asked
 *   cut_peer_mid_batch   prefill writes half a batch, then closes the data
 *                        connection
 *   slow_batch           prefill waits 300 ms before each batch
 *   stale_generation     prefill names the first page of a request with a
 *                        generation decode did not reserve it in
 *   bad_tag              the sender writes one page's integrity tag for
 *                        another owner (checksum and entries still fine:
 *                        only decode's tag check at mark_ready sees it)
 *   slow_abort_ack       prefill waits 1 s before each abort_ack (decode's
 *                        pages must stay fenced meanwhile)
 *   skip_decode_admission decode skips its own capacity admission check
 *                        (prefill's own admission must then reject)
 *   dup_entry            prefill names the first page of a multi-page
 *                        batch twice (the second entry repeats the first)
 *   stuck_submit         prefill holds a request's engine submit for 2.5 s,
 *                        then the engine refuses it as busy
 *   nan_kv               prefill writes a NaN into position 0 of the first
 *                        page's layer-0 K block before sending (checksum
 *                        still fine: decode's finite check must refuse it)
 *   retag_ready          decode overwrites the first prefix page's tag with
 *                        another owner's after mark_ready, so the engine's
 *                        own tag check fails with ENGINE_E_INTEGRITY
 *   compute_nomem        the compute thread finds no memory for the
 *                        messages of the next request submitted (its
 *                        tokens cannot be reported): the request must
 *                        still end, with an error, and free its pages
 *   bad_entry_index      the sender names page index 0xffff (beyond any
 *                        request's prefix) in a batch's first entry
 *   bad_entry_tokens     the sender claims one token more than the first
 *                        entry of a batch holds
 *   abort_send_fail      an abort frame cannot be queued on its link (as
 *                        without memory): the link must be torn down, so
 *                        that its requests still end (daemon/node/link.c
 *                        serve__link_post)
 *   verbs_qp_error       RDMA: prefill moves its queue pair to the error
 *                        state right after posting a batch's first write
 *                        (a QP error mid-batch: the rest is flushed)
 *   verbs_completion_error RDMA: right after a batch's first write is
 *                        posted, the emulated NIC completes the oldest
 *                        outstanding WR with an error (a real device:
 *                        the QP goes to error as for verbs_qp_error)
 *   verbs_slow_completion RDMA: decode handles the next batch completion
 *                        500 ms late (its NIC placed the batch already),
 *                        so prefill's abort_ack can overtake it; every
 *                        batch completion that comes meanwhile waits
 *                        behind it (decode falls behind its NIC: its
 *                        mailbox receives are not reposted meanwhile)
 *   lie_unasked_ack      a lying prefill: with a request's first batch it
 *                        also sends an abort_ack decode never asked for,
 *                        claiming 1000 batches (decode ignores it: the
 *                        request goes on and is served)
 *   lie_abort_batches    a lying prefill: abort and abort_ack claim 1000
 *                        batches more than it posted (decode's fence
 *                        must hold until release_timeout_ms tears the
 *                        link down and the flush drained)
 *   lie_done_batches     a lying prefill: prefill_done claims 3 batches
 *                        more than it posted (transfer_timeout_ms)
 *   verbs_wrong_slot     RDMA, a lying prefill: a batch's WRITE_WITH_IMM
 *                        goes to the mailbox slot after the one its
 *                        credit names (a slot it was not granted)
 *   verbs_flood          RDMA, a lying prefill: batches are posted
 *                        without waiting for mailbox credits
 *   verbs_lie_credit     RDMA, a lying decode: a verbs_credit claims 100
 *                        batches more consumed than prefill posted
 *   verbs_late_write     RDMA, a lying prefill: once a batch's
 *                        WRITE_WITH_IMM completed (decode has checked
 *                        the batch), one more RDMA WRITE puts NaN over
 *                        position 0 of its first page's layer-0 K block
 *                        through the still-live scope; the batch counts
 *                        as sent (and prefill_done follows) only after
 *                        it landed
 *
 * The transport's points (corrupt_batch, cut_peer_mid_batch, bad_tag,
 * bad_entry_index, bad_entry_tokens) fire on both send paths: the copy
 * path (encrypting links, device pools) and the zero-copy path (keyless
 * and MAC-only keyed links from a host pool); each fault line names the
 * path it took.
 *
 * In a build without fault points kvd_fault_fire() is constant false and
 * the compiler removes every fault branch.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "kvd_build.h"

enum kvd_fault_point {
	KVD_FAULT_CORRUPT_BATCH = 0,
	KVD_FAULT_SHORT_TRANSFER,
	KVD_FAULT_CUT_PEER_MID_BATCH,
	KVD_FAULT_SLOW_BATCH,
	KVD_FAULT_STALE_GENERATION,
	KVD_FAULT_SLOW_ABORT_ACK,
	KVD_FAULT_BAD_TAG,
	KVD_FAULT_SKIP_DECODE_ADMISSION,
	KVD_FAULT_DUP_ENTRY,
	KVD_FAULT_RETAG_READY,
	KVD_FAULT_STUCK_SUBMIT,
	KVD_FAULT_NAN_KV,
	KVD_FAULT_COMPUTE_NOMEM,
	KVD_FAULT_BAD_ENTRY_INDEX,
	KVD_FAULT_BAD_ENTRY_TOKENS,
	KVD_FAULT_ABORT_SEND_FAIL,
	KVD_FAULT_VERBS_QP_ERROR,
	KVD_FAULT_VERBS_COMPLETION_ERROR,
	KVD_FAULT_VERBS_SLOW_COMPLETION,
	KVD_FAULT_LIE_ABORT_BATCHES,
	KVD_FAULT_LIE_DONE_BATCHES,
	KVD_FAULT_VERBS_WRONG_SLOT,
	KVD_FAULT_VERBS_FLOOD,
	KVD_FAULT_VERBS_LIE_CREDIT,
	KVD_FAULT_VERBS_WRITE_BESIDE,
	KVD_FAULT_VERBS_BIND_FAIL,
	KVD_FAULT_VERBS_LATE_WRITE,
	KVD_FAULT_LIE_UNASKED_ACK,
	KVD_FAULT__N,
};

#define KVD_FAULT_FOREVER UINT32_MAX

struct kvd_fault {
	uint32_t left[KVD_FAULT__N];   /* remaining firings; 0 = off */
};

/* Parse a spec ("name[:count],..."); unknown names: -EINVAL with *bad
 * pointing at the name. NULL or "" leaves every point off. */
int kvd_fault_parse(struct kvd_fault *f, const char *spec, const char **bad);
const char *kvd_fault_name(enum kvd_fault_point p);

/* True when point p is armed (consumes nothing). */
static inline bool kvd_fault_armed(const struct kvd_fault *f,
				   enum kvd_fault_point p)
{
#if KVD_FAULT_POINTS
	return f && f->left[p];
#else
	(void)f;
	(void)p;
	return false;
#endif
}

/* True when point p fires now (consumes one count). */
static inline bool kvd_fault_fire(struct kvd_fault *f, enum kvd_fault_point p)
{
#if KVD_FAULT_POINTS
	if (!f || !f->left[p])
		return false;
	if (f->left[p] != KVD_FAULT_FOREVER)
		f->left[p]--;
	return true;
#else
	(void)f;
	(void)p;
	return false;
#endif
}
