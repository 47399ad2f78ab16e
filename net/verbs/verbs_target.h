/* verbs_target.h - the writing side's view of a request's write scope.
 *
 * Decode grants a request's pages as runs (net/wire/proto_peer.h
 * PEER_MSG_VERBS_SCOPE: first_page, n_pages, remote addr, rkey); prefill
 * pushes each destination page with an RDMA WRITE to the address its run
 * gives. The runs come from the peer: before prefill writes anything
 * through them they are checked against the request's destination pages
 * (the ones decode itself named in prefill_request), so a confused or
 * hostile decode cannot make prefill aim a write at a page of another
 * request, and address arithmetic cannot wrap. The NIC would refuse a
 * write outside the scope anyway (net/verbs/verbs_scope.h); this check makes
 * the sender refuse first, with a sentence. Pure: no device, no loop.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "net/wire/proto_peer.h"

enum {
	VERBS_TARGET_E_EMPTY = 1, /* no runs, or a run of 0 pages */
	VERBS_TARGET_E_WRAP,      /* first_page + n_pages or the run's
				   * address range wraps */
	VERBS_TARGET_E_FOREIGN,   /* a run names a page that is not one of
				   * the request's destination pages (or the
				   * request names a page twice) */
	VERBS_TARGET_E_OVERLAP,   /* a page in two runs */
	VERBS_TARGET_E_UNCOVERED, /* a destination page in no run */
};

/* Check runs[n_runs] against the request's destination pages
 * dst_pages[n_dst] (any order; a page named twice is refused): every run's pages
 * are destination pages, no page is in two runs, every destination page
 * is in one, and no run's pages or bytes (n_pages x page_bytes from addr)
 * wrap. 0, or VERBS_TARGET_E_* with a sentence in why. */
int verbs_target_check(const struct proto_peer_run *runs, uint32_t n_runs,
		       const uint32_t *dst_pages, uint32_t n_dst,
		       uint64_t page_bytes, char *why, size_t why_size);

/* Where destination page `page` is written: its run's addr plus its
 * offset in the run, and the run's rkey. 0, or -ENOENT when no run holds
 * it. Only for runs that passed verbs_target_check. */
int verbs_target_find(const struct proto_peer_run *runs, uint32_t n_runs,
		      uint32_t page, uint64_t page_bytes, uint64_t *addr,
		      uint32_t *rkey);
