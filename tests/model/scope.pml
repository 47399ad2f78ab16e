/*
 * scope.pml - Promela model of decode's RDMA write scope with type-2
 * memory windows (net/verbs/verbs_scope.c, net/verbs/transport_verbs.c; issue 13),
 * against a prefill peer that lies: it may post writes for any request it
 * was ever granted, at any time, also long after decode released it (the
 * batch counts of transfer.pml do not help against that; only the NIC's
 * window check does).
 *
 * One decode pool of NPAGES pages, NREQ requests of one page each, so a
 * later request reuses an earlier one's page. Decode's queue pair has a
 * send queue (bind and invalidate WRs, executed by the NIC in order, each
 * with a completion) and a receive side (prefill's writes, placed by the
 * NIC only through a window that is valid at that moment). One link loss
 * at most: the QP goes to the error state (no later write lands, but one
 * the NIC was already placing still does), and the flush completion comes
 * once that placement is done - or never, on a faulty device (nondeter-
 * ministic), when transfer.verbs_flush_timeout_ms fires.
 *
 * Property (invariant 2): a write of request r lands only in a page that
 * r still owns or holds fenced (or that is quarantined) - never in a free
 * page or another request's page.
 * Property (no write after the check, issue 22): a write may carry poison
 * (NaN: the lying prefill holds the key, so nothing but decode's value
 * check tells it apart); when decode's engine reads a request's page, the
 * page holds no poison - every byte it reads is a byte decode checked.
 *
 * Rules modelled (correct):
 *   - the scope is sent to prefill only once the bind completed;
 *   - revoke posts the invalidation and takes a fence that is dropped
 *     only when the invalidation *completed* (or the flush came);
 *   - a lost link keeps the pages fenced until the flush completion; if
 *     the flush timer fires first, they are quarantined, never unfenced;
 *   - at coverage decode revokes the scope and checks the page only once
 *     the invalidation completed (a poisoned page is quarantined); then
 *     the engine reads it (daemon/node/decode.c decode_sealed).
 * Broken variants (each must be caught):
 *   BROKEN_UNFENCE_ON_INV_POSTED    the fence drops when the invalidation
 *                                   is posted, not when it completed
 *   BROKEN_UNFENCE_ON_FLUSH_TIMEOUT the flush timer unfences
 *   BROKEN_NO_WINDOW                no window at all: prefill's writes are
 *                                   not checked (a registration left with
 *                                   remote write over the pool)
 *   BROKEN_CHECK_BEFORE_REVOKE      at coverage decode checks the page
 *                                   first, then revokes (and even waits
 *                                   for the invalidation) before reading:
 *                                   a write between the check and the
 *                                   invalidation is read unchecked
 */

#ifndef NREQ
#define NREQ 2
#endif
#ifndef NPAGES
#define NPAGES 1
#endif
#define MAXW 2          /* writes prefill may post per request */
#define NONE 255

#define PG_FREE   0
#define PG_OWNED  1
#define PG_FENCED 2     /* released, fences > 0 */
#define PG_QUAR   3     /* quarantined: never handed out again */

#define R_NEW      0
#define R_BINDING  1    /* bind posted */
#define R_LIVE     2    /* bind completed, scope sent to prefill */
#define R_WAITINV  3    /* released, invalidation posted, fence held */
#define R_LOST     4    /* link lost: fence held until the flush */
#define R_DONE     5
#define R_SEALING  6    /* covered: invalidation posted, the check waits */
#define R_READING  7    /* checked after the revoke: the engine reads */

#define OP_BIND  1
#define OP_INV   2
#define OP_FLUSH 3

byte ps[NPAGES], po[NPAGES], pf[NPAGES];
byte rst[NREQ], rp[NREQ];
bool bad[NPAGES];       /* ghost: the page holds a poisoned write */
bool win[NREQ];         /* the NIC's window for r is valid */
bool scope[NREQ];       /* prefill has r's scope (keeps it forever) */
byte nw[NREQ];

chan wire = [2] of { byte, byte, bool };  /* prefill's posted writes: r, page, poison */
chan sq = [NREQ * 2] of { byte, byte };  /* decode's send queue: op, r */
chan cq = [NREQ * 2 + 1] of { byte, byte };

bool qerr, flushed, timed_out, noflush;
bool placing;
byte pr, pp;
bool pv;

inline to_free(p) {
	ps[p] = PG_FREE; po[p] = NONE
}

inline unfence(p) {
	pf[p]--;
	if
	:: pf[p] == 0 && ps[p] == PG_FENCED -> to_free(p)
	:: else
	fi
}

/* the page is released: fenced pages wait, others go free */
inline release(p) {
	if
	:: pf[p] > 0 -> ps[p] = PG_FENCED
	:: else -> to_free(p)
	fi
}

/* a write of request wr lands in page wp (poisoned: wv) */
inline land(wr, wp, wv) {
	assert(po[wp] == wr && ps[wp] != PG_FREE);
	if
	:: wv -> bad[wp] = true
	:: else
	fi
}

proctype Prefill() {
	byte r;
end:	do
	:: atomic {
		r = 0;
		do
		:: r < NREQ - 1 -> r++
		:: break
		od;
		if
		:: scope[r] && nw[r] < MAXW && nfull(wire) -> wire!r, rp[r], false; nw[r]++
		:: scope[r] && nw[r] < MAXW && nfull(wire) -> wire!r, rp[r], true; nw[r]++
		:: else
		fi
	   }
	od
}

proctype NicRx() {
	byte r, p;
	bool v;
end:	do
	:: atomic { wire?r, p, v ->
		if
#ifdef BROKEN_NO_WINDOW
		:: !qerr -> land(r, p, v)
#else
		:: !qerr && win[r] -> land(r, p, v)
#endif
		:: else   /* refused: remote access error, or the QP is in error */
		fi }
	/* the write the NIC was placing at the teardown lands */
	:: atomic { placing -> land(pr, pp, pv); placing = false }
	od
}

proctype NicSq() {
	byte op, r;
end:	do
	:: atomic { !qerr && nempty(sq) -> sq?op, r;
		if
		:: op == OP_BIND -> win[r] = true
		:: op == OP_INV -> win[r] = false
		fi;
		cq!op, r }
	/* the error state: every WR not executed is flushed, and the flush
	 * completion comes once the placement in progress is done - unless
	 * the device never delivers it */
	:: atomic { qerr && !placing && !flushed && !noflush ->
		do
		:: sq?op, r
		:: empty(sq) -> break
		od;
		flushed = true;
		cq!OP_FLUSH, 0 }
	od
}

proctype Decode() {
	byte r, p, op;
end:	do
	/* admission: a free page, bind a window over it */
	:: atomic {
		!qerr ->
		r = 0;
		do
		:: r < NREQ && rst[r] != R_NEW -> r++
		:: else -> break
		od;
		p = 0;
		do
		:: p < NPAGES && ps[p] != PG_FREE -> p++
		:: else -> break
		od;
		if
		:: r < NREQ && p < NPAGES ->
			ps[p] = PG_OWNED; po[p] = r; rp[r] = p; bad[p] = false;
			rst[r] = R_BINDING;
			sq!OP_BIND, r
		:: else
		fi }
	/* release (done, timeout, quarantine...): revoke first */
	:: atomic {
		!qerr ->
		r = 0;
		do
		:: r < NREQ - 1 -> r++
		:: break
		od;
		if
		:: rst[r] == R_LIVE || rst[r] == R_BINDING ->
			p = rp[r];
			sq!OP_INV, r;
#ifndef BROKEN_UNFENCE_ON_INV_POSTED
			pf[p]++;
#endif
			release(p);
			rst[r] = R_WAITINV
		/* failed while sealing (timeout): the invalidation is posted
		 * and its fence held already */
		:: rst[r] == R_SEALING -> release(rp[r]); rst[r] = R_WAITINV
		:: else
		fi }
	/* coverage: every batch is in (prefill_done); the final check of
	 * the page must see every byte the engine will read */
	:: atomic {
		!qerr ->
		r = 0;
		do
		:: r < NREQ - 1 -> r++
		:: break
		od;
		if
		:: rst[r] == R_LIVE ->
			p = rp[r];
#ifdef BROKEN_CHECK_BEFORE_REVOKE
			if
			:: bad[p] -> ps[p] = PG_QUAR; sq!OP_INV, r; pf[p]++; rst[r] = R_WAITINV
			:: else -> sq!OP_INV, r; pf[p]++; rst[r] = R_SEALING
			fi
#else
			sq!OP_INV, r; pf[p]++; rst[r] = R_SEALING
#endif
		:: else
		fi }
	/* the engine reads a checked page, then the request ends */
	:: atomic {
		r = 0;
		do
		:: r < NREQ - 1 -> r++
		:: break
		od;
		if
		:: rst[r] == R_READING ->
			assert(!bad[rp[r]]);
			release(rp[r]); rst[r] = R_DONE
		:: else
		fi }
	/* completions, in order */
	:: atomic { cq?op, r ->
		if
		:: op == OP_BIND && rst[r] == R_BINDING ->
			rst[r] = R_LIVE; scope[r] = true
		:: op == OP_BIND   /* released while binding: nothing sent */
		:: op == OP_INV && rst[r] == R_WAITINV ->
#ifndef BROKEN_UNFENCE_ON_INV_POSTED
			unfence(rp[r]);
#endif
			rst[r] = R_DONE
		/* the scope is dead: nothing can write the page any more, the
		 * final check runs now (decode_sealed) */
		:: op == OP_INV && rst[r] == R_SEALING ->
			unfence(rp[r]);
#ifdef BROKEN_CHECK_BEFORE_REVOKE
			rst[r] = R_READING
#else
			if
			:: bad[rp[r]] -> ps[rp[r]] = PG_QUAR; rst[r] = R_DONE
			:: else -> rst[r] = R_READING
			fi
#endif
		:: op == OP_FLUSH && !timed_out ->
			for (r : 0 .. NREQ - 1) {
				if
				:: rst[r] == R_WAITINV || rst[r] == R_LOST ->
#ifdef BROKEN_UNFENCE_ON_INV_POSTED
					if
					:: rst[r] == R_LOST -> unfence(rp[r])
					:: else
					fi;
#else
					unfence(rp[r]);
#endif
					rst[r] = R_DONE
				:: else
				fi
			}
		:: else
		fi }
	/* the link is lost (once): the QP goes to error; requests still
	 * holding pages release them fenced until the flush */
	:: atomic { !qerr ->
		qerr = true;
		if
		:: nempty(wire) -> wire?pr, pp, pv;
			if
			:: win[pr] -> placing = true
			:: else
			fi
		:: true
		fi;
		for (r : 0 .. NREQ - 1) {
			if
			:: rst[r] == R_LIVE || rst[r] == R_BINDING ->
				p = rp[r]; pf[p]++; release(p); rst[r] = R_LOST
			/* the invalidation may be flushed: its fence waits
			 * for the flush like any other */
			:: rst[r] == R_SEALING -> release(rp[r]); rst[r] = R_WAITINV
			:: else
			fi
		} }
	/* transfer.verbs_flush_timeout_ms: the flush did not come */
	:: atomic { qerr && !flushed && !timed_out ->
		timed_out = true;
		for (r : 0 .. NREQ - 1) {
			if
			:: rst[r] == R_WAITINV || rst[r] == R_LOST ->
				p = rp[r];
#ifdef BROKEN_UNFENCE_ON_FLUSH_TIMEOUT
				unfence(p);
#else
				ps[p] = PG_QUAR;
#endif
				rst[r] = R_DONE
			:: else
			fi
		} }
	od
}

init {
	byte i;
	atomic {
		for (i : 0 .. NPAGES - 1) { po[i] = NONE }
		if
		:: noflush = false
		:: noflush = true
		fi;
		run Prefill(); run NicRx(); run NicSq(); run Decode()
	}
}
