/* xfer_check.c - the receive-side checks of KV batches.
 *
 * Design. Decode reads KV it did not compute, so everything a batch says
 * about where its pages go is a claim to check against decode's own
 * reservation before a byte is written: the checksum (net/xfer.c) only
 * says the batch is what the sender built, not that the sender is right.
 * These checks used to live in the decode loop and were reachable only
 * through fault points; here they are a pure function of plain structs,
 * so unit tests, a reference model and a fuzz target can drive them.
 *
 * Why a page may be accepted only once per request, within one batch
 * too: coverage counts accepted pages. If an index could be accepted
 * twice, a transfer that never sent page k but sent page j twice would
 * count n_prefix pages and pass. So a batch is checked in full before any
 * mark changes: each accepted entry takes a temporary IN_BATCH mark (which
 * is how a second entry for the same index is seen), and a refusal undoes
 * exactly the IN_BATCH marks of the entries before it. Only when every
 * entry passed do they become ACCEPTED. No allocation: a batch may hold
 * as many entries as the bound allows.
 *
 * The token count each page must hold comes from decode's own n_prompt,
 * never from the sender: decode zero-fills the rest of each page from it
 * (invariant 10), and the tags are checked against it later.
 *
 * Non-finite K/V is refused like a bad entry (one NaN poisons every
 * attention score that reads it); the scan itself is the pool's
 * kvpool_page_kv_finite, which knows the page layout. It runs per entry,
 * after that entry's other checks, so the first bad entry decides the
 * verdict whichever way it is bad.
 *
 * The sentences are the ones decode has always logged and sent to the
 * client (operators and tests grep them): keep them stable.
 */
#include "net/xfer_check.h"
#include "net/wire/names.h"
#include "conf/util.h"

#include <stdio.h>

#define MARK_ACCEPTED 1
#define MARK_IN_BATCH 2

static const char *const xfer_check_names[XFER_CHECK_N_CODES] = {
	[XFER_CHECK_OK] = "ok",
	[XFER_CHECK_E_INDEX_RANGE] = "index_range",
	[XFER_CHECK_E_WRONG_PAGE] = "wrong_page",
	[XFER_CHECK_E_WRONG_GEN] = "wrong_gen",
	[XFER_CHECK_E_DUPLICATE] = "duplicate",
	[XFER_CHECK_E_DUPLICATE_IN_BATCH] = "duplicate_in_batch",
	[XFER_CHECK_E_TOKENS] = "tokens",
	[XFER_CHECK_E_GEOMETRY] = "geometry",
	[XFER_CHECK_E_NONFINITE] = "nonfinite",
	[XFER_CHECK_PENDING] = "pending",
	[XFER_CHECK_E_DONE_TOKENS] = "done_tokens",
	[XFER_CHECK_E_DONE_PAGES] = "done_pages",
	[XFER_CHECK_E_SHORT] = "short",
	[XFER_CHECK_E_EXTRA_BATCHES] = "extra_batches",
};

const char *xfer_check_name(int code)
{
	return NET_NAME(xfer_check_names, code);
}

bool xfer_check_req_valid(const struct xfer_check_req *q)
{
	if (!q->table || q->page_tokens == 0 || q->n_prompt == 0)
		return false;
	if (q->n_prefix != (q->n_prompt - 1) / q->page_tokens + 1)
		return false;
	return !q->kv || q->kv->page_tokens == q->page_tokens;
}

uint32_t xfer_check_page_tokens(const struct xfer_check_req *q, uint32_t index)
{
	uint64_t start = (uint64_t)index * q->page_tokens;

	if (index >= q->n_prefix || start >= q->n_prompt)
		return 0;
	return (uint32_t)KVD_MIN((uint64_t)q->page_tokens, q->n_prompt - start);
}

/* Entry i of the batch, every check but the marks' bookkeeping. */
static int check_entry(const struct xfer_check_req *q, const uint8_t *got,
		       const struct xfer_hdr *h, const uint8_t *batch,
		       const struct xfer_entry *e, uint32_t i, char *why,
		       size_t why_size)
{
	const struct kvpool_ref *ref;
	uint32_t want;

	if (e->index >= q->n_prefix) {
		snprintf(why, why_size, "batch %u names page index %u beyond the %u prefix pages",
			 h->seq, e->index, q->n_prefix);
		return XFER_CHECK_E_INDEX_RANGE;
	}
	ref = &q->table[e->index];
	if (e->dst_page != ref->page || e->dst_gen != ref->gen) {
		snprintf(why, why_size, "batch %u names page %u gen %llu, not the request's page %u gen %llu",
			 h->seq, e->dst_page, (unsigned long long)e->dst_gen,
			 ref->page, (unsigned long long)ref->gen);
		return e->dst_page != ref->page ? XFER_CHECK_E_WRONG_PAGE
						: XFER_CHECK_E_WRONG_GEN;
	}
	if (got[e->index]) {
		bool in_batch = got[e->index] == MARK_IN_BATCH;

		snprintf(why, why_size, "batch %u writes page index %u twice%s",
			 h->seq, e->index, in_batch ? " (in one batch)" : "");
		return in_batch ? XFER_CHECK_E_DUPLICATE_IN_BATCH
				: XFER_CHECK_E_DUPLICATE;
	}
	want = xfer_check_page_tokens(q, e->index);
	if (e->tokens != want) {
		snprintf(why, why_size, "batch %u page index %u holds %u tokens, expected %u",
			 h->seq, e->index, e->tokens, want);
		return XFER_CHECK_E_TOKENS;
	}
	if (!q->kv)
		return XFER_CHECK_OK;
	/* the scan reads a whole page of kv's layout: never past the batch */
	if (h->page_bytes < kvpool_page_bytes(q->kv)) {
		snprintf(why, why_size, "batch %u carries pages of %llu bytes, the pool's hold %llu",
			 h->seq, (unsigned long long)h->page_bytes,
			 (unsigned long long)kvpool_page_bytes(q->kv));
		return XFER_CHECK_E_GEOMETRY;
	}
	if (!kvpool_page_kv_finite(q->kv, xfer_batch_page(batch, h, i), want)) {
		snprintf(why, why_size, "batch %u page index %u holds non-finite K/V",
			 h->seq, e->index);
		return XFER_CHECK_E_NONFINITE;
	}
	return XFER_CHECK_OK;
}

/* Drop the IN_BATCH marks of entries [0, n) of a refused batch. Entries
 * that failed before marking named an index in range whose mark is not
 * IN_BATCH, or none at all, so only this batch's marks go. */
static void unmark(const struct xfer_check_req *q, uint8_t *got,
		   const uint8_t *batch, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++) {
		struct xfer_entry e;

		xfer_batch_entry(batch, i, &e);
		if (e.index < q->n_prefix && got[e.index] == MARK_IN_BATCH)
			got[e.index] = 0;
	}
}

int xfer_check_batch(const struct xfer_check_req *q,
		     struct xfer_check_marks *m, const struct xfer_hdr *h,
		     const uint8_t *batch, struct xfer_check_refusal *ref)
{
	struct xfer_check_refusal scratch;
	struct xfer_check_refusal *out = ref ? ref : &scratch;

	for (uint32_t i = 0; i < h->n_entries; i++) {
		struct xfer_entry e;
		int rc;

		xfer_batch_entry(batch, i, &e);
		rc = check_entry(q, m->got, h, batch, &e, i, out->why,
				 sizeof(out->why));
		if (rc) {
			unmark(q, m->got, batch, i);
			out->entry = i;
			out->e = e;
			return rc;
		}
		m->got[e.index] = MARK_IN_BATCH;
	}
	for (uint32_t i = 0; i < h->n_entries; i++) {
		struct xfer_entry e;

		xfer_batch_entry(batch, i, &e);
		m->got[e.index] = MARK_ACCEPTED;
	}
	m->n_got += h->n_entries;
	m->batches++;
	return XFER_CHECK_OK;
}

int xfer_check_coverage(const struct xfer_check_req *q,
			const struct xfer_check_marks *m,
			const struct xfer_check_done *d, char *why,
			size_t why_size)
{
	char scratch[XFER_CHECK_WHY_MAX];
	uint32_t seen = 0;
	int rc = XFER_CHECK_OK;

	if (!why) {
		why = scratch;
		why_size = sizeof(scratch);
	}
	if (m->batches < d->batches)
		return XFER_CHECK_PENDING;
	/* count the marks themselves: n_got is what the pages claim */
	for (uint32_t i = 0; i < q->n_prefix; i++)
		seen += m->got[i] != 0;
	if (d->tokens != q->n_prompt)
		rc = XFER_CHECK_E_DONE_TOKENS;
	else if (d->pages != q->n_prefix)
		rc = XFER_CHECK_E_DONE_PAGES;
	else if (seen != q->n_prefix || m->n_got != q->n_prefix)
		rc = XFER_CHECK_E_SHORT;
	if (rc) {
		snprintf(why, why_size,
			 "short transfer: %u of %u pages and %u of %u prompt tokens arrived",
			 seen, q->n_prefix, d->tokens, q->n_prompt);
		return rc;
	}
	if (m->batches > d->batches) {
		snprintf(why, why_size,
			 "prefill announced %u batches but %u arrived",
			 d->batches, m->batches);
		return XFER_CHECK_E_EXTRA_BATCHES;
	}
	return XFER_CHECK_OK;
}
