/* mailbox.pml - the RDMA batch mailbox and its credits (issue 13;
 * net/verbs/transport_verbs.c, net/PROTOCOL.md s. 4 "Mailbox credits").
 *
 * Prefill ends each batch with a WRITE_WITH_IMM of its header into one of
 * decode's N mailbox slots. Decode's NIC places it only while a receive
 * is posted (else: receiver-not-ready, which ends the link once the
 * retries run out), and decode copies a slot out some time after its
 * completion - as late as the scheduler likes: decode may fall behind
 * its NIC. The k-th batch goes to slot k mod N, and prefill may post it
 * only while fewer than N of its batches are unconsumed; decode, once it
 * copied a slot out, reposts its receive and returns a credit (the
 * running count of batches consumed). Decode checks each completion's
 * slot (k mod N, else a credit violation) and believes a batch only if
 * the slot still holds it (the batch MAC: its counter is the batch
 * number).
 *
 * Properties (assertions), for honest peers and any interleaving:
 *   - no WRITE_WITH_IMM meets a decode without a posted receive (RNR);
 *   - every batch decode copies out is the one it expects (no slot was
 *     overwritten before it was copied: the MAC never fails);
 *   - a credit never goes back nor passes the batches posted;
 *   - all K batches are consumed (a valid end state: no deadlock).
 * Broken variants (each must be caught):
 *   BROKEN_NO_CREDITS     prefill reuses a slot once its own WRITE_WITH_IMM
 *                         completed (the rule before credits): a slow
 *                         decode meets a batch without a receive;
 *   BROKEN_CREDIT_BEFORE_COPY decode reposts the receive and credits the
 *                         slot before it copied it out: the next batch
 *                         for that slot overwrites it first;
 *   BROKEN_ANY_SLOT       prefill may pick the slot after k mod N, and
 *                         decode does not check the slot: a slot not yet
 *                         copied out is overwritten (in kvd decode's
 *                         check ends the link at that completion, and
 *                         the MAC refuses the overwritten batch).
 */
#ifndef N
#define N 2          /* mailbox slots (kvd: 4) */
#endif
#ifndef K
#define K 5          /* batches on the link */
#endif

chan wire = [K] of { byte, byte };   /* WRITE_WITH_IMM in flight: batch, slot (RC: in order) */
chan cq = [N] of { byte, byte };     /* decode's receive completions */
chan credit = [K] of { byte };       /* verbs_credit: consumed so far */
chan acked = [K] of { byte };        /* the sender's send completions */

byte slot[N];                        /* the batch each slot holds (+1; 0: none) */
byte recv_posted = N;
byte consumed = 0;

active proctype Prefill()
{
	byte k = 0, credited = 0, done = 0, c, s;

	do
	:: k < K &&
#ifdef BROKEN_NO_CREDITS
	   k - done < N ->
#else
	   k - credited < N ->
#endif
#ifdef BROKEN_ANY_SLOT
		if
		:: s = k % N
		:: s = (k + 1) % N
		fi;
#else
		s = k % N;
#endif
		wire!k, s;
		k++
	:: credit?c ->
		assert(c >= credited && c <= k);
		credited = c
	:: acked?c -> done++
	:: k == K && credited == K -> break
	od
}

/* decode's NIC: places a WRITE_WITH_IMM into its slot if a receive is
 * posted, completes it at decode and acknowledges it to prefill */
active proctype Nic()
{
	byte b, s;

end:	do
	:: wire?b, s ->
		assert(recv_posted > 0);     /* else RNR: the link would end */
		slot[s] = b + 1;
		recv_posted--;
		cq!b, s;
		acked!b
	od
}

/* decode: completions in order, copied out whenever it gets to them */
active proctype Decode()
{
	byte b, s, want = 0, held;

	do
	:: cq?b, s ->
#ifndef BROKEN_ANY_SLOT
		assert(s == want % N);       /* the slot its credit gave */
#endif
#ifdef BROKEN_CREDIT_BEFORE_COPY
		recv_posted++;
		consumed++;
		credit!consumed;
		held = slot[s];              /* the copy, after the credit */
#else
		held = slot[s];              /* the copy */
		recv_posted++;
		consumed++;
		credit!consumed;
#endif
		assert(held == want + 1);    /* the MAC: this batch, not a later one */
		want++
	:: consumed == K -> break
	od
}
