/* xfer_check.h - the receive-side checks of KV batches (invariants 5, 6).
 *
 * Pure: plain structs in, a typed verdict and a sentence out; no loop, no
 * pool, no locking. Decode keeps one reservation and one set of marks per
 * request and asks two questions:
 *   xfer_check_batch     may this verified batch (net/xfer.h) be written?
 *                        Every entry must name a page of the prefix, in
 *                        the generation it was reserved in, not accepted
 *                        before (in an earlier batch or earlier in this
 *                        one), with the token count that page must hold,
 *                        and - when a K/V geometry is given - finite K/V
 *                        in the positions it holds. All or nothing: on
 *                        refusal the marks are as they were; on accept
 *                        every entry is marked and the batch counted.
 *   xfer_check_coverage  prefill_done arrived: is the transfer complete?
 *                        Its counts must be the ones asked for, exactly
 *                        the batches it announced arrived, and every
 *                        prefix page was accepted once.
 * The tags in page memory are checked afterwards by kvpool_mark_ready.
 *
 * Precondition on the reservation (xfer_check_req_valid): page_tokens >=
 * 1, n_prompt >= 1, n_prefix == ceil(n_prompt / page_tokens), table holds
 * n_prefix entries, and kv (if any) has the same page_tokens.
 * Thread safety: none needed beyond one owner per marks.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpu/kv/kvpool.h"
#include "net/xfer.h"

/* Verdicts: 0 accepts; each positive code names the first failing check.
 * Batch checks run entry by entry, in this order (the first failing entry
 * decides). */
enum {
	XFER_CHECK_OK = 0,
	XFER_CHECK_E_INDEX_RANGE = 1,   /* index >= n_prefix */
	XFER_CHECK_E_WRONG_PAGE,        /* dst_page is not table[index].page */
	XFER_CHECK_E_WRONG_GEN,         /* the right page, another generation */
	XFER_CHECK_E_DUPLICATE,         /* index accepted in an earlier batch */
	XFER_CHECK_E_DUPLICATE_IN_BATCH,/* index named earlier in this batch */
	XFER_CHECK_E_TOKENS,            /* tokens != what the page must hold */
	XFER_CHECK_E_GEOMETRY,          /* batch pages smaller than kv's pages */
	XFER_CHECK_E_NONFINITE,         /* NaN or Inf in the positions held */
	/* coverage, checked in this order */
	XFER_CHECK_PENDING,             /* not an error: batches still due */
	XFER_CHECK_E_DONE_TOKENS,       /* done's tokens != n_prompt */
	XFER_CHECK_E_DONE_PAGES,        /* done's pages != n_prefix */
	XFER_CHECK_E_SHORT,             /* a prefix page never arrived */
	XFER_CHECK_E_EXTRA_BATCHES,     /* more batches than done announced */
	XFER_CHECK_N_CODES,
};

/* Stable name of a code ("wrong_gen"), "?" if unknown. */
const char *xfer_check_name(int code);

/* One request's reservation, as decode made it. */
struct xfer_check_req {
	const struct kvpool_ref *table;  /* (n_prefix) (page, gen) by index */
	uint32_t n_prefix;               /* pages the transfer fills */
	uint32_t n_prompt;               /* prompt tokens the prefix holds */
	uint32_t page_tokens;            /* positions per page */
	const struct kvpool_geom *kv;    /* K/V layout of a page for the
					  * finiteness check; NULL skips it */
};

/* What arrived for one request. Zeroed with got[] all 0 at reservation;
 * the caller allocates and frees got. */
struct xfer_check_marks {
	uint8_t *got;       /* (n_prefix) nonzero: page accepted */
	uint32_t n_got;     /* pages accepted (distinct indices) */
	uint32_t batches;   /* batches accepted */
};

/* prefill_done's counts. */
struct xfer_check_done {
	uint32_t tokens;
	uint32_t pages;
	uint32_t batches;
};

#define XFER_CHECK_WHY_MAX 200

/* Why a batch was refused. */
struct xfer_check_refusal {
	uint32_t entry;                  /* position in the batch */
	struct xfer_entry e;             /* that entry */
	char why[XFER_CHECK_WHY_MAX];    /* one sentence, for logs and client */
};

/* Whether q meets the precondition above. */
bool xfer_check_req_valid(const struct xfer_check_req *q);

/* The tokens page `index` of the prefix must hold (0: index out of range). */
uint32_t xfer_check_page_tokens(const struct xfer_check_req *q, uint32_t index);

/* Check batch (h, batch: verified by xfer_batch_verify / xfer_reader)
 * against q and m. XFER_CHECK_OK: every entry is now marked in m->got,
 * m->n_got grew by h->n_entries and m->batches by one. Else the first
 * failing XFER_CHECK_E_* (batch group), m unchanged, and *ref (if
 * non-NULL) says which entry and why. */
int xfer_check_batch(const struct xfer_check_req *q,
		     struct xfer_check_marks *m, const struct xfer_hdr *h,
		     const uint8_t *batch, struct xfer_check_refusal *ref);

/* Completion: XFER_CHECK_OK when done's counts are n_prompt and
 * n_prefix, exactly done->batches batches were accepted and every
 * prefix page is marked once; XFER_CHECK_PENDING while fewer batches
 * than announced arrived; else the first failing XFER_CHECK_E_*
 * (coverage group) with a sentence in why (if non-NULL). */
int xfer_check_coverage(const struct xfer_check_req *q,
			const struct xfer_check_marks *m,
			const struct xfer_check_done *d, char *why,
			size_t why_size);
