/* verbs_extent.h - which bytes of a page an RDMA WRITE may carry.
 *
 * The stale-tail rule (invariant 10, gpu/kv/kvpool.h "Unfilled tails") over
 * RDMA: a page that holds fewer than page_tokens positions is written as
 * its tag and positions [0, tokens) of every layer's K and V block, never
 * the rest of a block - bytes a request did not fill never leave the
 * sender, whatever they hold. A full page is one extent (the tag and every
 * block, not the alignment padding after them). Adjacent extents are
 * merged, so the count is what the writes cost: 1 for a full page, else
 * 2 x n_layer (the tag is merged with the first K block's filled
 * positions). Pure: geometry in, (offset, length) list out.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "gpu/kv/kvpool.h"

struct verbs_extent {
	uint64_t offset;   /* from the page's first byte */
	uint64_t length;
};

/* Extents a page needs for `tokens` positions (1..page_tokens; 0 for
 * any other count). */
uint32_t verbs_extent_count(const struct kvpool_geom *g, uint32_t tokens);

/* Fill out[0..max) with the page's extents for `tokens` positions, in
 * ascending offset order: the count (<= max), or -EINVAL for tokens 0 or
 * past page_tokens, or -ENOSPC when max is too small (nothing written
 * past max). */
int verbs_extent_page(const struct kvpool_geom *g, uint32_t tokens,
		      struct verbs_extent *out, uint32_t max);
