/* verbs_target.c - check a peer's write-scope runs, find a page's target.
 *
 * Design. Runs are at most PROTO_PEER_RUNS_MAX (the parser bounds them),
 * so the pairwise overlap check is cheap; a request may have many
 * destination pages, so membership is a binary search in a sorted copy.
 * With runs inside the destination set and pairwise disjoint, the runs
 * cover every destination page exactly when their page counts add up to
 * the number of destination pages.
 */
#include "net/verbs/verbs_target.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return x < y ? -1 : x > y;
}

/* Destination pages in [first, first + n) of the sorted set. */
static uint64_t count_in(const uint32_t *sorted, uint32_t n_dst,
			 uint64_t first, uint64_t n)
{
	uint32_t lo = 0, hi = n_dst, a, b;

	while (lo < hi) {   /* first index with page >= first */
		uint32_t mid = lo + (hi - lo) / 2;

		if (sorted[mid] < first)
			lo = mid + 1;
		else
			hi = mid;
	}
	a = lo;
	hi = n_dst;
	while (lo < hi) {   /* first index with page >= first + n */
		uint32_t mid = lo + (hi - lo) / 2;

		if (sorted[mid] < first + n)
			lo = mid + 1;
		else
			hi = mid;
	}
	b = lo;
	return b - a;
}

int verbs_target_check(const struct proto_peer_run *runs, uint32_t n_runs,
		       const uint32_t *dst_pages, uint32_t n_dst,
		       uint64_t page_bytes, char *why, size_t why_size)
{
	uint32_t *sorted;
	uint64_t total = 0;
	int rc = 0;

	if (n_runs == 0 || n_dst == 0) {
		snprintf(why, why_size, "the scope has no runs");
		return VERBS_TARGET_E_EMPTY;
	}
	for (uint32_t i = 0; i < n_runs; i++) {
		const struct proto_peer_run *r = &runs[i];

		if (r->n_pages == 0) {
			snprintf(why, why_size, "run %u has no pages", i);
			return VERBS_TARGET_E_EMPTY;
		}
		if ((uint64_t)r->first_page + r->n_pages - 1 > UINT32_MAX ||
		    page_bytes == 0 ||
		    r->n_pages > (UINT64_MAX - r->addr) / page_bytes) {
			snprintf(why, why_size,
				 "run %u (pages %u+%u at 0x%llx) wraps", i,
				 r->first_page, r->n_pages,
				 (unsigned long long)r->addr);
			return VERBS_TARGET_E_WRAP;
		}
		for (uint32_t j = 0; j < i; j++) {
			const struct proto_peer_run *o = &runs[j];
			uint64_t a0 = r->first_page, a1 = a0 + r->n_pages;
			uint64_t b0 = o->first_page, b1 = b0 + o->n_pages;

			if (a0 < b1 && b0 < a1) {
				snprintf(why, why_size,
					 "runs %u and %u name the same pages", j, i);
				return VERBS_TARGET_E_OVERLAP;
			}
		}
		total += r->n_pages;
	}
	sorted = malloc((size_t)n_dst * sizeof(*sorted));
	if (!sorted) {
		snprintf(why, why_size, "out of memory");
		return -ENOMEM;
	}
	memcpy(sorted, dst_pages, (size_t)n_dst * sizeof(*sorted));
	qsort(sorted, n_dst, sizeof(*sorted), cmp_u32);
	for (uint32_t i = 1; i < n_dst && !rc; i++)
		if (sorted[i] == sorted[i - 1]) {
			snprintf(why, why_size, "the request names page %u twice",
				 sorted[i]);
			rc = VERBS_TARGET_E_FOREIGN;
		}
	for (uint32_t i = 0; i < n_runs && !rc; i++) {
		const struct proto_peer_run *r = &runs[i];

		if (count_in(sorted, n_dst, r->first_page, r->n_pages) != r->n_pages) {
			snprintf(why, why_size,
				 "run %u (pages %u+%u) names a page that is not the request's",
				 i, r->first_page, r->n_pages);
			rc = VERBS_TARGET_E_FOREIGN;
		}
	}
	free(sorted);
	if (!rc && total != n_dst) {
		snprintf(why, why_size,
			 "the runs cover %llu of the request's %u pages",
			 (unsigned long long)total, n_dst);
		rc = VERBS_TARGET_E_UNCOVERED;
	}
	return rc;
}

int verbs_target_find(const struct proto_peer_run *runs, uint32_t n_runs,
		      uint32_t page, uint64_t page_bytes, uint64_t *addr,
		      uint32_t *rkey)
{
	for (uint32_t i = 0; i < n_runs; i++) {
		const struct proto_peer_run *r = &runs[i];

		if (page >= r->first_page && page - r->first_page < r->n_pages) {
			*addr = r->addr + (uint64_t)(page - r->first_page) * page_bytes;
			*rkey = r->rkey;
			return 0;
		}
	}
	return -ENOENT;
}
