/*
 * transfer.pml - Promela model of kvd's per-request KV transfer protocol
 * (net/PROTOCOL.md sections 2 and 3; MISSION.md invariants 2, 6, 7, 8).
 *
 * One decode node, one prefill node, one peer link (control connection
 * each way, data connection prefill -> decode), NREQ requests sharing a
 * decode pool of NPAGES pages, so the second request reuses the first
 * one's pages. The data path is modelled as RDMA WRITE: a batch lands in
 * decode's page memory by itself (process Nic), whatever decode thinks of
 * the request, at any time until it has landed or the connection is torn
 * down. Decode only hears of a landed batch afterwards (channel note: the
 * receive completion / per-batch report). A teardown moves decode's queue
 * pair to the error state: it refuses the writes the NIC has not started,
 * but the one it may be placing at that moment still lands, so decode
 * keeps the pages fenced until the QP's flush completion (channel note,
 * after every completion of a placed write) says the NIC is done.
 *
 * See tests/model/README.md for the abstraction, the mapping to the C
 * code, the properties and the broken variants. Run: tests/model/run.
 * Prefill here is honest; a lying one that holds the key - writes at any
 * time through a live write scope, a late write after decode checked
 * the batch included (issue 22) - is scope.pml's (BROKEN_CHECK_BEFORE_
 * REVOKE there is the check made before the revocation completed).
 *
 * The request machines of daemon/node/machine.c (dreq_machine, preq_machine,
 * drawn in daemon/README.md) are mirrored state for state where the model
 * has the state, with the C names; each transition below says which table
 * row(s) it is, as "dreq STATE --event / actions--> NEXT" (decode) or
 * "preq ..." (prefill). Merged or left out, on purpose:
 *   decode: SUBMIT, COMPUTE, FREEING are not modelled (after coverage the
 *     request reads its KV and ends: covered..freed collapsed into one
 *     step); everything else about them is engine-local.
 *   prefill: ADMITTED and ADMIT_ABORTED are merged into COMPUTE (admit +
 *     submitted in one step; an abort before SUBMITTED waits like one
 *     during compute); ABORT_DRAINING is SENDING with abreq set; FREEING
 *     is merged into DONE (the engine frees prefill's own pages, which
 *     nothing remote writes).
 *   The RDMA rule (batch counts on abort / abort_ack / prefill_done, and
 *     decode's fence held until they landed, or after a lost link until
 *     its QP's flush completion: DRS_FLUSH) goes beyond the C tables,
 *     which follow the TCP rule: C's "dreq TRANSFER --peer_abort-->
 *     DONE" unfences at once and "dreq ABORTING: prefill_done" is IGNORE;
 *     the model's DRS_ABORTING waits for the count in both cases
 *     (variants d and e are the C rows under RDMA semantics).
 *
 * Macros:
 *   NREQ (2), NPAGES (2), MAXLOSS (1)     sizes
 *   COMPLETION_AFTER_PLACEMENT            prefill's send completion implies
 *                                         the write has landed (RDMA RC);
 *                                         default: it does not (weaker,
 *                                         covers TCP and weakly ordered NICs)
 *   BROKEN_UNFENCE_ON_TIMEOUT             (a) decode's timeout releases the
 *                                         pages unfenced
 *   BROKEN_RELEASE_BEFORE_ACK             (b) abort_ack timeout releases the
 *                                         pages without tearing down
 *   BROKEN_COUNT_ENTRIES                  (c) coverage counts entries, not
 *                                         distinct pages
 *   BROKEN_NO_BATCH_COUNT                 (d) abort/abort_ack end the fence
 *                                         without waiting for the counted
 *                                         batches (the TCP rule under RDMA)
 *   BROKEN_IGNORE_DONE_WHILE_ABORTING     (e) prefill_done's batch count is
 *                                         dropped once decode is aborting
 *   BROKEN_KEEP_FENCE                     (f) the end of an abort forgets to
 *                                         unfence: pages leak (property 3)
 *   BROKEN_UNFENCE_ON_QP_ERROR            (g) teardown moves the QP to the
 *                                         error state and unfences at once,
 *                                         without draining its flush
 *                                         completions
 *   BROKEN_RETRY_AT_LOSS                  (h) failover: a transfer whose link
 *                                         is lost is placed again at once,
 *                                         its pages unfenced before the
 *                                         QP's flush completion
 *   MAXRETRY (1)                          failovers per request
 *                                         (peers.failover_retries)
 *   NO_ORPHAN, NO_FAULTS                  leave out client disconnects /
 *                                         prefill's fault points (dup_entry,
 *                                         short_transfer), for larger sizes
 */

#ifndef NREQ
#define NREQ 2
#endif
#ifndef NPAGES
#define NPAGES 2
#endif
#ifndef MAXLOSS
#define MAXLOSS 1
#endif
#ifndef MAXRETRY
#define MAXRETRY 1
#endif
#define NPFX 2          /* prefix pages per request (n_prefix == n_table) */
#define WINDOW 2        /* PREFILL_SEND_WINDOW: batches posted, not completed */

#if NREQ == 2
#define FOR_REQ(M) M(0) M(1)
#elif NREQ == 3
#define FOR_REQ(M) M(0) M(1) M(2)
#else
#error "NREQ must be 2 or 3"
#endif

#if NPAGES == 2
#define FOR_PAGE(M) M(0) M(1)
#elif NPAGES == 3
#define FOR_PAGE(M) M(0) M(1) M(2)
#elif NPAGES == 4
#define FOR_PAGE(M) M(0) M(1) M(2) M(3)
#else
#error "NPAGES must be 2, 3 or 4"
#endif
#define FREE_P(P) + (ps[P] == PG_FREE)
#define NFREE (0 FOR_PAGE(FREE_P))

/* control messages: {type, request id, batches} */
mtype = { PREQ, RELACK, ABORT, ABORT_ACK, REJECT, DONE };

chan c2p = [3 * NREQ] of { mtype, byte, byte };  /* decode -> prefill control */
chan p2c = [3 * NREQ] of { mtype, byte, byte };  /* prefill -> decode control */
/* data connection: posted RDMA WRITEs, {request, index, page, gen} */
chan data = [NPFX * NREQ] of { byte, byte, byte, byte };
/* decode's receive completions: a write that has landed, or (request
 * FLUSHR) the flush completion of decode's QP after the error state */
chan note = [NPFX * NREQ + 1] of { byte, byte, byte, byte };
#define FLUSHR 255

/* ---- decode pool (gpu/kv/kvpool.h) ---- */
#define PG_FREE    0
#define PG_FILLING 1    /* RESERVED -fill_begin-> FILLING, merged */
#define PG_READY   2
#define PG_FENCED  3    /* released, fences > 0 */

byte ps[NPAGES];        /* state */
byte po[NPAGES];        /* owner (request id), kept after release */
byte pgen[NPAGES];      /* generation; from one pool-wide counter */
byte pf[NPAGES];        /* fence count */
byte wr[NPAGES];        /* ghost: landed writes in the current generation */
byte infl[NPAGES];      /* ghost: writes to this page posted, not landed or flushed */
byte gcount;            /* kvpool's generation counter */

/* ---- decode's queue pair and NIC ---- */
bool qerr;              /* decode's QP is in the error state (teardown), its
			 * flush completion not yet consumed */
bool flushed;           /* the NIC has reported the flush */
bool placing;           /* at the teardown the NIC had started placing write
			 * (nr, ni, np, ng): it lands all the same */
byte nr, ni, np, ng;

/* ---- decode requests (daemon/node/machine.h enum dreq_state) ---- */
#define DRS_NEW      0
#define DRS_TRANSFER 1    /* pages reserved and fenced, prefill_request sent */
#define DRS_ABORTING 2    /* pages released, fence held until the handshake ends */
#define DRS_DONE     3    /* terminal (SUBMIT..FREEING collapsed into it) */
#define DRS_FLUSH    4    /* link lost: pages released, fence held until the
			   * QP's flush completion (verbs; no C row yet) */

byte dst[NREQ];
byte pg[NREQ * NPFX];   /* r->table[i].page */
byte gn[NREQ * NPFX];   /* r->table[i].gen */
byte got[NREQ];         /* r->got[] as a bit mask */
byte ngot[NREQ];        /* r->n_got */
byte bgot[NREQ];        /* batches of r that landed (counted also while aborting) */
bool dseen[NREQ];       /* r->done_seen */
byte dn[NREQ];          /* r->done_batches */
bool ackd[NREQ];        /* abort handshake ended (abort_ack, prefill abort/reject) */
byte tgt[NREQ];         /* batches that must land before the fence drops */
bool fenced[NREQ];      /* r->fenced */
bool orph[NREQ];        /* client gone: orphaned (invariant 8) */
byte retr[NREQ];        /* r->failovers: times placed again (NEW with
			 * retr > 0: waiting to be placed again) */
bool lostx[NREQ];       /* in DRS_FLUSH from TRANSFER: a failover may
			 * follow the flush */
byte nxt;               /* next request to admit */
byte losses;            /* peer losses injected so far */

/* ---- prefill requests (daemon/node/machine.h enum preq_state) ---- */
#define PRS_NEW          0  /* never seen */
#define PRS_COMPUTE      1  /* (and ADMITTED, ADMIT_ABORTED) own pages held */
#define PRS_SENDING      2  /* (and ABORT_DRAINING: abreq set) */
#define PRS_WAIT_RELEASE 3  /* prefill_done sent, pages kept */
#define PRS_DONE         4  /* (and FREEING) terminal */

#define M_OK    0
#define M_DUP   1       /* fault point dup_entry: second entry repeats the first */
#define M_SHORT 2       /* fault point short_transfer: one page fewer */

byte pst[NREQ];
byte pmode[NREQ];
byte posted[NREQ];      /* batches handed to the transport (batches_sent + sends_pending) */
byte pend[NREQ];        /* r->sends_pending: posted, completion not yet seen */
byte sent[NREQ];        /* r->batches_sent: completions seen */
#ifdef COMPLETION_AFTER_PLACEMENT
byte landed[NREQ];      /* batches of r that landed (for CAN_COMPLETE) */
#define LANDED(r) landed[r]++
#define LANDED_RESET(r) landed[r] = 0
#else
#define LANDED(r) skip
#define LANDED_RESET(r) skip
#endif
bool abreq[NREQ];       /* r->abort_requested */
bool acked[NREQ];       /* r->abort_acked */

bool finished;          /* Check saw every request terminal and the pool clean */

#define ACTIVE(r) (pst[r] == PRS_COMPUTE || pst[r] == PRS_SENDING || pst[r] == PRS_WAIT_RELEASE)
#define DONE_R(R) && dst[R] == DRS_DONE && !ACTIVE(R)
#define ALLDONE   (nxt == NREQ FOR_REQ(DONE_R))

/* A request ends (serve__req_end()). Its record is zeroed so that ended
 * requests do not split states by their history (not a protocol step). */
inline dec_end(r) {
	dst[r] = DRS_DONE;
	got[r] = 0; ngot[r] = 0; bgot[r] = 0; dseen[r] = false; dn[r] = 0;
	ackd[r] = false; tgt[r] = 0; orph[r] = false; retr[r] = 0; lostx[r] = false;
	pg[r * NPFX] = 0; pg[r * NPFX + 1] = 0; gn[r * NPFX] = 0; gn[r * NPFX + 1] = 0
}

/* Failover (dreq_retry()): the request's pages are released and
 * unfenced, it is detached; it forgets the old transfer and goes back to
 * NEW to be placed again, with fresh pages and a new prefill_request
 * (the option in DEC_REQ). The model has one prefill, so the new
 * request goes to the same one, under the same id: stricter than C,
 * which picks another peer. */
inline dec_retry(r) {
	assert(!fenced[r] && !orph[r]);
	got[r] = 0; ngot[r] = 0; bgot[r] = 0; dseen[r] = false; dn[r] = 0;
	ackd[r] = false; tgt[r] = 0; lostx[r] = false;
	pg[r * NPFX] = 0; pg[r * NPFX + 1] = 0; gn[r * NPFX] = 0; gn[r * NPFX + 1] = 0;
	retr[r]++;
	dst[r] = DRS_NEW
}

inline pf_end(r) {
	pst[r] = PRS_DONE;
	pmode[r] = M_OK; posted[r] = 0; pend[r] = 0; sent[r] = 0;
	abreq[r] = false; acked[r] = false;
	LANDED_RESET(r)
}

/* ======================================================================
 * Pool operations (gpu/kv/kvpool.c). Use the caller's k, p.
 * ====================================================================== */

/* A page goes back to the free list. Property 1 (invariant 2): no write
 * for its owner may still land. */
inline to_free(pp) {
	assert(infl[pp] == 0);
	ps[pp] = PG_FREE;
	po[pp] = 0; pgen[pp] = 0; wr[pp] = 0   /* (state-space hygiene: gens start at 1) */
}

/* serve__decode_admit(): kvpool_reserve() (fresh generation per page),
 * kvpool_fill_begin(), kvpool_fence() over the prefix. Lowest free first. */
inline pool_reserve(r) {
	k = 0;
	for (p : 0 .. NPAGES - 1) {
		if
		:: k < NPFX && ps[p] == PG_FREE ->
			gcount++;
			ps[p] = PG_FILLING; po[p] = r; pgen[p] = gcount;
			pf[p] = 1; wr[p] = 0;
			pg[r * NPFX + k] = p; gn[r * NPFX + k] = gcount;
			k++
		:: else
		fi
	}
	assert(k == NPFX);
	fenced[r] = true
}

/* kvpool_release(): pages without fences go FREE, fenced ones FENCED. */
inline pool_release(r) {
	for (k : 0 .. NPFX - 1) {
		p = pg[r * NPFX + k];
		assert(pgen[p] == gn[r * NPFX + k] && po[p] == r &&
		       (ps[p] == PG_FILLING || ps[p] == PG_READY));
		if
		:: pf[p] > 0 -> ps[p] = PG_FENCED
		:: else -> to_free(p)
		fi
	}
}

/* kvpool_unfence(): drop one fence per page; a FENCED page at 0 is freed. */
inline pool_unfence(r) {
	if
	:: fenced[r] ->
		for (k : 0 .. NPFX - 1) {
			p = pg[r * NPFX + k];
			assert(pgen[p] == gn[r * NPFX + k] && pf[p] > 0);
			pf[p]--;
			if
			:: pf[p] == 0 && ps[p] == PG_FENCED -> to_free(p)
			:: else
			fi
		}
		fenced[r] = false
	:: else
	fi
}

/* kvpool_mark_ready(): FILLING -> READY. (Its tag check is not modelled:
 * see README, "defence in depth".) */
inline pool_mark_ready(r) {
	for (k : 0 .. NPFX - 1) {
		p = pg[r * NPFX + k];
		assert(ps[p] == PG_FILLING && pgen[p] == gn[r * NPFX + k]);
		ps[p] = PG_READY
	}
}

/* ======================================================================
 * Decode (daemon/node/decode.c)
 * ====================================================================== */

/* decode_pages_free_now(): unfence, release, now. */
inline dec_free_now(r) {
	pool_unfence(r);
	pool_release(r)
}

/* decode_fail(with_abort = true): send abort, release the pages but keep
 * the transfer fence (FENCED) until the handshake ends.
 * dreq TRANSFER --bad|timeout|op_abort / answer_err|send_abort|release|
 * timer_abort--> ABORTING (machine.c D_ABORT) */
inline dec_fail_abort(r) {
	c2p!ABORT, r, 0;
	pool_release(r);
	dst[r] = DRS_ABORTING;
	ackd[r] = false;
	if
	:: dseen[r] -> tgt[r] = dn[r]
	:: else -> tgt[r] = 0
	fi
}

/* decode_abort_done(): the peer will not write for r again: unfence, end.
 * dreq ABORTING --abort_ack|peer_abort|reject|link_lost / unfence|
 * detach_peer--> DONE */
inline dec_abort_done(r) {
#ifndef BROKEN_KEEP_FENCE
	pool_unfence(r);
#endif
	dec_end(r)
}

/* The RDMA rule: the handshake ended (ackd) and every batch prefill said
 * it posted (tgt, from abort/abort_ack/prefill_done) has landed. In the
 * C table an ack that comes before the count is "dreq ABORTING
 * --abort_ack_early--> ABORT_LANDING", then "ABORT_LANDING --landed /
 * unfence|detach_peer--> DONE"; the model keeps both in DRS_ABORTING
 * (ackd set: ABORT_LANDING). */
#ifdef BROKEN_NO_BATCH_COUNT
#define DRAINED(r) (ackd[r])
#else
#define DRAINED(r) (ackd[r] && bgot[r] >= tgt[r])
#endif

inline dec_abort_check(r) {
	if
	:: dst[r] == DRS_ABORTING && DRAINED(r) -> dec_abort_done(r)
	:: else
	fi
}

/* A count from prefill (abort / abort_ack / prefill_done) raises the
 * number of batches to wait for. */
inline raise_tgt(r, nb) {
	if
	:: nb > tgt[r] -> tgt[r] = nb
	:: else
	fi
}

/* Property 2 (invariants 1, 6): decode reads the KV only when every
 * prefix page is READY, its own in this generation, and was written
 * exactly once by this request's transfer in this generation. */
inline dec_read(r) {
	for (k : 0 .. NPFX - 1) {
		p = pg[r * NPFX + k];
		assert(ps[p] == PG_READY && po[p] == r &&
		       pgen[p] == gn[r * NPFX + k] && wr[p] == 1)
	}
}

/* decode_try_complete(): all announced batches in and prefill_done seen:
 * coverage, unfence, mark_ready, release_ack, read (or, orphaned, just
 * release), release. */
inline dec_try_complete(r) {
	if
	:: dst[r] == DRS_TRANSFER && dseen[r] && bgot[r] >= dn[r] ->
		if
		:: ngot[r] == NPFX ->
			/* dreq TRANSFER --covered / send_release_ack|
			 * unfence|detach_peer|submit--> SUBMIT (then compute,
			 * freeing, done: collapsed), or --covered_orphan /
			 * send_release_ack|release|unfence|detach_peer--> DONE */
			pool_unfence(r);
			pool_mark_ready(r);
			c2p!RELACK, r, 0;
			if
			:: !orph[r] -> dec_read(r)   /* serve__compute_submit(): attention reads */
			:: else                      /* orphaned: complete cleanly, no reader */
			fi;
			pool_release(r);             /* request ends: decode_pages_free_now() */
			dec_end(r)
		:: else ->                           /* short transfer: INTEGRITY */
			/* dreq TRANSFER --bad / D_ABORT--> ABORTING */
			dec_fail_abort(r)
		fi
	:: else
	fi
}

/* Teardown of both connections to the peer (link_lost_code() in
 * daemon/node/link.c, both ends): decode moves its queue pair to the error
 * state, so no posted write that the NIC has not started lands any more
 * (the one being placed still does); every control message in flight is
 * lost. Aborting and transferring requests keep their fences until the
 * flush completion (DRS_FLUSH; then decode_abort_done()); prefill ends its
 * requests (their sends complete with an error). Decode reconnects
 * (peer_connect(), a new QP) once the flush is in. */
#ifdef BROKEN_UNFENCE_ON_QP_ERROR
/* (g) the C rows of link_lost (unfence now), under RDMA */
#define LINK_FENCE(r) dec_abort_done(r)
#else
#define LINK_FENCE(r) dst[r] = DRS_FLUSH
#endif

inline teardown() {
	qerr = true;
	/* the NIC may have started placing the oldest posted write: that one
	 * still lands (Nic), the others are refused by the QP in error */
	if
	:: nempty(data) -> data?nr, ni, np, ng; placing = true
	:: true
	fi;
	do
	:: data?tr, ti, tp, tg -> infl[tp]--
	:: empty(data) -> break
	od;
	do
	:: note?tr, ti, tp, tg
	:: empty(note) -> break
	od;
	do
	:: c2p?m, tr, tg
	:: empty(c2p) -> break
	od;
	do
	:: p2c?m, tr, tg
	:: empty(p2c) -> break
	od;
	for (tr : 0 .. NREQ - 1) {
		if
		/* dreq ABORTING --link_lost / unfence|detach_peer--> DONE in
		 * C; under RDMA the unfence waits for the flush (FLUSH) */
		:: dst[tr] == DRS_ABORTING -> LINK_FENCE(tr)
		/* dreq TRANSFER --link_lost / answer_err|release|unfence|
		 * detach_peer--> DONE in C; the same wait here (and its
		 * failover, --link_lost_retry--> NEW, after it) */
#ifdef BROKEN_RETRY_AT_LOSS
		/* (h) placed again at once: unfenced before the flush */
		:: dst[tr] == DRS_TRANSFER && retr[tr] < MAXRETRY && !orph[tr] ->
			pool_release(tr); pool_unfence(tr); dec_retry(tr)
#endif
		:: dst[tr] == DRS_TRANSFER -> pool_release(tr); lostx[tr] = true; LINK_FENCE(tr)
		:: else
		fi;
		if
		/* preq COMPUTE --link_lost / detach_link|free_engine--> FREEING;
		 * preq SENDING --link_lost / detach_link--> ABORT_DRAINING
		 * --send_fail..--> --drained--> FREEING (sends flushed);
		 * preq WAIT_RELEASE --link_lost / detach_link|free_engine-->
		 * FREEING; then --freed--> DONE */
		:: ACTIVE(tr) -> pf_end(tr); pend[tr] = 0
		:: else
		fi
	}
}

/* Per-request decode transitions, one option each in Decode's loop. */
#define DEC_REQ(R) \
	/* decode_prefill_timeout(): prefill_timeout_ms / transfer_timeout_ms \
	 * (also operator abort, drain: serve__decode_abort()) \
	 * dreq TRANSFER --timeout|op_abort / D_ABORT--> ABORTING */ \
	:: atomic { dst[R] == DRS_TRANSFER -> DEC_TIMEOUT(R) } \
	/* serve__decode_client_gone(): the request is orphaned, the transfer \
	 * goes on (invariant 8) \
	 * dreq TRANSFER --client_gone / detach_client--> TRANSFER */ \
	DEC_ORPHAN(R) \
	DEC_ABORT_TIMEOUT(R) \
	/* failover: placed again (serve__decode_admit()'s placement from \
	 * dreq_retry()), waiting for pages like a new request \
	 * dreq NEW --admit / timer_prefill--> TRANSFER */ \
	:: atomic { dst[R] == DRS_NEW && retr[R] > 0 && NFREE >= NPFX && !qerr -> \
		pool_reserve(R); dst[R] = DRS_TRANSFER; c2p!PREQ, R, 0 }

#ifdef NO_ORPHAN
#define DEC_ORPHAN(R)
#else
#define DEC_ORPHAN(R) :: atomic { dst[R] == DRS_TRANSFER && !orph[R] -> orph[R] = true }
#endif

#ifdef BROKEN_UNFENCE_ON_TIMEOUT
/* (a) the timeout sends abort but frees the pages at once */
#define DEC_TIMEOUT(R) c2p!ABORT, R, 0; dec_free_now(R); dst[R] = DRS_ABORTING; \
	ackd[R] = false; tgt[R] = 0
#else
#define DEC_TIMEOUT(R) dec_fail_abort(R)
#endif

/* decode_abort_timeout(): no end of the abort handshake within
 * release_timeout_ms: tear the peer connections down (the teardown
 * option of Decode's loop, so that it is expanded once).
 * dreq ABORTING --timeout / teardown--> ABORTING, then teardown() delivers
 * dreq ABORTING --link_lost / unfence|detach_peer--> DONE */
#define ABORTING_R(R) || dst[R] == DRS_ABORTING
#ifdef BROKEN_RELEASE_BEFORE_ACK
/* (b) give up waiting for the ack: release without a teardown */
#define DEC_ABORT_TIMEOUT(R) :: atomic { dst[R] == DRS_ABORTING -> dec_abort_done(R) }
#define ABORT_TIMEOUT false
#else
#define DEC_ABORT_TIMEOUT(R)
#define ABORT_TIMEOUT (false FOR_REQ(ABORTING_R))
#endif

proctype Decode()
{
	byte r, i, p, k, n, g;
	byte tr, ti, tp, tg;
	mtype m;

end_loop:
	do
	/* serve__decode_admit(): admit, reserve, fence, prefill_request.
	 * Waits for free pages (C rejects OVERLOADED; waiting forces reuse
	 * and turns a leaked page into a deadlock Spin reports). */
	/* dreq NEW --admit / timer_prefill--> TRANSFER */
	:: atomic { nxt < NREQ && NFREE >= NPFX && !qerr ->
		r = nxt; nxt++;
		pool_reserve(r);
		dst[r] = DRS_TRANSFER;
		c2p!PREQ, r, 0 }

	FOR_REQ(DEC_REQ)

	/* teardown: peer loss (three missed heartbeats, checksum failure,
	 * write bound, TCP reset; at most MAXLOSS), or decode_abort_timeout() */
	:: atomic { !qerr && ((losses < MAXLOSS && nxt > 0) || ABORT_TIMEOUT) ->
		if
		:: losses < MAXLOSS && nxt > 0 -> losses++
		:: ABORT_TIMEOUT
		fi;
		teardown() }

	/* decode_rx_batch(): a landed batch is reported; or the flush
	 * completion of the QP in error: the NIC places nothing more, the
	 * fences of the requests of the lost link drop, a new QP follows */
	:: atomic { note?r, i, p, g ->
		if
		:: r == FLUSHR ->
			assert(qerr);
			for (tr : 0 .. NREQ - 1) {
				if
				/* C's link walk runs here (verbs: after the
				 * flush): a transfer may fail over,
				 * dreq TRANSFER --link_lost_retry / release|
				 * unfence|detach_peer|retry--> NEW */
				:: dst[tr] == DRS_FLUSH && lostx[tr] && retr[tr] < MAXRETRY &&
				   !orph[tr] ->
					pool_unfence(tr); dec_retry(tr)
				:: dst[tr] == DRS_FLUSH -> dec_abort_done(tr)
				:: else
				fi
			}
			qerr = false; flushed = false
		:: r != FLUSHR && dst[r] == DRS_TRANSFER ->
			/* dreq TRANSFER --batch--> TRANSFER (checks pass),
			 * or --bad / D_ABORT--> ABORTING */
			bgot[r]++;
			/* decode_check_entry(): page of this request, this
			 * generation, not written before */
			if
			:: i < NPFX && pg[r * NPFX + i] == p && gn[r * NPFX + i] == g &&
#ifdef BROKEN_COUNT_ENTRIES
			   true ->
				got[r] = got[r] | (1 << i);
				ngot[r]++;
#else
			   (got[r] & (1 << i)) == 0 ->
				got[r] = got[r] | (1 << i);
				ngot[r]++;
#endif
				dec_try_complete(r)
			:: else ->   /* INTEGRITY: decode_fail(with_abort) */
				dec_fail_abort(r)
			fi
		:: r != FLUSHR && dst[r] == DRS_ABORTING ->
			/* dreq ABORTING: batch is IGNORE in C; the write
			 * landed: one fewer to wait for (RDMA rule) */
			bgot[r]++;
			dec_abort_check(r)
		:: else      /* batch_discarded: request gone (unrouted) */
		fi }

	/* decode_on_msg(): control messages from prefill */
	:: atomic { p2c?m, r, n ->
		if
		:: m == DONE ->
			if
			:: dst[r] == DRS_TRANSFER ->
				/* dreq TRANSFER --prefill_done / timer_transfer-->
				 * TRANSFER */
				dseen[r] = true; dn[r] = n;
				dec_try_complete(r)
			:: dst[r] == DRS_ABORTING ->
				/* dreq ABORTING: prefill_done is IGNORE in C
				 * (TCP); variant (e) is that row under RDMA */
#ifndef BROKEN_IGNORE_DONE_WHILE_ABORTING
				/* its count still bounds what may land */
				raise_tgt(r, n);
				dec_abort_check(r)
#else
				skip
#endif
			:: else
			fi
		:: m == REJECT ->
			if
			:: dst[r] == DRS_TRANSFER ->
				/* dreq TRANSFER --reject / answer_err|release|
				 * unfence|detach_peer--> DONE: nothing computed or
				 * sent, release at once; or (draining, overloaded)
				 * --reject_retry / release|unfence|detach_peer|
				 * retry--> NEW: placed again */
				dec_free_now(r);
				if
				:: retr[r] < MAXRETRY && !orph[r] -> dec_retry(r)
				:: true -> dec_end(r)
				fi
			:: dst[r] == DRS_ABORTING ->
				/* dreq ABORTING --reject / unfence|detach_peer-->
				 * DONE: our abort crossed the refusal, like an ack,
				 * 0 batches */
				ackd[r] = true; dec_abort_check(r)
			:: else
			fi
		:: m == ABORT ->
			if
			:: dst[r] == DRS_TRANSFER ->
				/* dreq TRANSFER --peer_abort / answer_err|
				 * send_abort_ack|release|unfence|detach_peer--> DONE
				 * in C (TCP rule: unfence now); here: fail without
				 * our own abort, keep the fence until its n posted
				 * batches have landed (RDMA rule; variant d is the
				 * C row) */
				pool_release(r);
				dst[r] = DRS_ABORTING;
				if
				:: dseen[r] -> tgt[r] = dn[r]
				:: else -> tgt[r] = 0
				fi;
				raise_tgt(r, n);
				ackd[r] = true;
				dec_abort_check(r)
			:: dst[r] == DRS_ABORTING ->
				/* dreq ABORTING --peer_abort / send_abort_ack|
				 * unfence|detach_peer--> DONE: crossed our abort,
				 * ends the handshake like an ack */
				raise_tgt(r, n);
				ackd[r] = true;
				dec_abort_check(r)
			:: else
			fi;
			c2p!ABORT_ACK, r, 0   /* the send_abort_ack action */
		:: m == ABORT_ACK ->
			if
			:: dst[r] == DRS_ABORTING ->
				/* dreq ABORTING --abort_ack / unfence|
				 * detach_peer--> DONE (once the count landed) */
				raise_tgt(r, n);
				ackd[r] = true;
				dec_abort_check(r)
			:: else  /* late ack: dreq TRANSFER IGNORE, or unrouted */
			fi
		fi }
	od
}

/* ======================================================================
 * The data path as RDMA WRITE: a posted write places its page in decode's
 * memory with no CPU involved and no check, then decode gets a receive
 * completion (note). In-order within the data connection; arbitrarily
 * late relative to both control connections.
 * ====================================================================== */
/* The bytes of write (nr, ni, np, ng) are in decode's memory. */
inline NIC_PLACE() {
	/* Property 1: the page is still the writer's (its generation) and
	 * nobody reads it (FILLING, or released but FENCED) */
	assert(pgen[np] == ng && (ps[np] == PG_FILLING || ps[np] == PG_FENCED));
	wr[np]++;
	infl[np]--;
	/* a write placed once the QP is in error is the old connection's:
	 * its prefill request ended at the teardown, and the request id may
	 * be in a new transfer by now (failover): not counted there */
	if
	:: !qerr -> LANDED(nr)
	:: else
	fi;
	note!nr, ni, np, ng;
	placing = false; nr = 0; ni = 0; np = 0; ng = 0
}

proctype Nic()
{
end_nic:
	do
	/* the NIC places the next write (a QP in error starts none) */
	:: atomic { !placing && !qerr && nempty(data) ->
		data?nr, ni, np, ng;
		NIC_PLACE() }
	/* the write it had started when the QP went to error lands */
	:: atomic { placing -> NIC_PLACE() }
	/* the QP in error has finished what it started: its flush
	 * completion comes after every completion of a placed write */
	:: atomic { qerr && !placing && !flushed ->
		flushed = true;
		note!FLUSHR, 0, 0, 0 }
	od
}

/* ======================================================================
 * Prefill (daemon/node/prefill.c)
 * ====================================================================== */

/* prefill_abort_maybe_finish() + prefill_ack_abort(): once nothing of r
 * is queued, answer with the number of batches posted (final: nothing
 * more is posted after abort_requested), then free.
 * preq ABORT_DRAINING --drained / ack_owed|free_engine--> FREEING
 * --freed / detach_link--> DONE; from COMPUTE (pend 0):
 * preq COMPUTE --peer_abort / send_abort_ack|free_engine--> FREEING;
 * from WAIT_RELEASE: preq WAIT_RELEASE --peer_abort / send_abort_ack|
 * free_engine--> FREEING */
inline pf_maybe_finish(r) {
	if
	:: abreq[r] && pend[r] == 0 ->
		if
		:: !acked[r] -> acked[r] = true; p2c!ABORT_ACK, r, posted[r]
		:: else
		fi;
		pf_end(r)
	:: else
	fi
}

/* prefill_fail(): abort to decode with the number of batches posted.
 * preq COMPUTE --compute_fail|op_abort / send_abort|free_engine--> FREEING;
 * preq SENDING --op_abort|send_fail / send_abort--> ABORT_DRAINING (pend
 * > 0), then --drained / ack_owed|free_engine--> FREEING */
inline pf_fail(r) {
	abreq[r] = true;
	p2c!ABORT, r, posted[r];
	if
	:: pend[r] == 0 -> pf_end(r)    /* prefill_free() */
	:: else
	fi
}

#define LIMIT(r) (pmode[r] == M_SHORT -> NPFX - 1 : NPFX)

/* Per-request prefill transitions. */
#define PF_REQ(R) \
	/* serve__prefill_engine_msg(SMSG_DONE): computed (prefill_computed(), \
	 * maybe a fault point), or failed (prefill_fail()) */ \
	/* preq COMPUTE --computed / send_more--> SENDING, or \
	 * --compute_fail / send_abort|free_engine--> FREEING */ \
	:: atomic { pst[R] == PRS_COMPUTE && !abreq[R] -> \
		if \
		:: pst[R] = PRS_SENDING; pmode[R] = M_OK \
		PF_FAULT_MODES(R) \
		:: pf_fail(R) \
		fi } \
	/* serve__prefill_abort(): operator, drain, a send that failed \
	 * preq SENDING --op_abort|send_fail / send_abort--> ABORT_DRAINING */ \
	:: atomic { pst[R] == PRS_SENDING && !abreq[R] -> pf_fail(R) } \
	/* prefill_send_more(): post a batch (one page) within the window \
	 * (the send_more action of preq COMPUTE --computed--> and \
	 * SENDING --batch_sent-->) */ \
	:: atomic { pst[R] == PRS_SENDING && !abreq[R] && posted[R] < LIMIT(R) && \
		    pend[R] < WINDOW -> \
		i = posted[R]; \
		if \
		:: pmode[R] == M_DUP && i == 1 -> i = 0 \
		:: else \
		fi; \
		p = pg[R * NPFX + i]; \
		data!R, i, p, gn[R * NPFX + i]; \
		infl[p]++; posted[R]++; pend[R]++ } \
	/* prefill_sent_cb(): a send completion \
	 * preq SENDING --batch_sent / send_more--> SENDING; \
	 * ABORT_DRAINING --batch_sent--> ABORT_DRAINING (then drained); \
	 * SENDING --all_sent / send_done|timer_release--> WAIT_RELEASE */ \
	:: atomic { pend[R] > 0 && CAN_COMPLETE(R) -> \
		pend[R]--; sent[R]++; \
		if \
		:: abreq[R] -> pf_maybe_finish(R) \
		:: !abreq[R] && posted[R] == LIMIT(R) && pend[R] == 0 -> \
			/* prefill_done_send(): every batch reported sent */ \
			p2c!DONE, R, sent[R]; pst[R] = PRS_WAIT_RELEASE \
		:: else \
		fi } \
	/* prefill_release_timeout(): release own pages without the ack \
	 * preq WAIT_RELEASE --timeout / count_timeout|free_engine--> FREEING \
	 * --freed--> DONE */ \
	:: atomic { pst[R] == PRS_WAIT_RELEASE -> pf_end(R) }

#ifdef NO_FAULTS
#define PF_FAULT_MODES(R)
#else
#define PF_FAULT_MODES(R) \
		:: pst[R] = PRS_SENDING; pmode[R] = M_DUP \
		:: pst[R] = PRS_SENDING; pmode[R] = M_SHORT
#endif

#ifdef COMPLETION_AFTER_PLACEMENT
#define CAN_COMPLETE(R) (landed[R] > sent[R])
#else
#define CAN_COMPLETE(R) true
#endif

proctype Prefill()
{
	byte r, i, p, n;
	mtype m;

end_loop:
	do
	/* prefill_on_msg() */
	:: atomic { c2p?m, r, n ->
		if
		:: m == PREQ ->
			if
			/* preq NEW --refuse / send_reject|detach_link--> DONE
			 * (or ADMITTED --submit_err--> DONE, the same) */
			:: pf_end(r); p2c!REJECT, r, 0
			/* preq NEW --admit--> ADMITTED --submitted--> COMPUTE */
			:: pst[r] = PRS_COMPUTE
			fi
		:: m == ABORT ->
			if
			:: ACTIVE(r) ->
				/* preq COMPUTE|WAIT_RELEASE --peer_abort--> (see
				 * pf_maybe_finish); preq SENDING --peer_abort /
				 * owe_ack--> ABORT_DRAINING */
				abreq[r] = true;
				/* answer once nothing is queued; cancel a compute */
				pf_maybe_finish(r)
			:: else ->
				/* prefill_find() fails: ended (or refused);
				 * preq DONE: peer_abort IGNORE, acked outside */
				p2c!ABORT_ACK, r, 0
			fi
		:: m == RELACK ->
			if
			/* preq WAIT_RELEASE --release_ack / released|
			 * free_engine--> FREEING --freed--> DONE */
			:: pst[r] == PRS_WAIT_RELEASE -> pf_end(r)
			:: else     /* late: IGNORE (FREEING, DONE) */
			fi
		:: m == ABORT_ACK -> skip   /* our aborts need no ack */
		fi }

	FOR_REQ(PF_REQ)
	od
}

/* Property 3: every request terminal, both sides, and then the pool is
 * clean (all pages FREE, no fences, nothing in flight). Blocks forever,
 * outside an end state, if that never happens: Spin reports it. */
active proctype Check()
{
	byte k;

	ALLDONE;
	atomic {
		for (k : 0 .. NPAGES - 1) {
			assert(ps[k] == PG_FREE && pf[k] == 0 && infl[k] == 0)
		}
		finished = true
	}
}

init {
	atomic {
		run Decode();
		run Prefill();
		run Nic()
	}
}

/* Property 3 as liveness: on every path every request ends. */
ltl terminates { <> finished }
