/* verbs_extent.c - the filled bytes of a page, as RDMA WRITE extents. */
#include "net/verbs/verbs_extent.h"

#include <errno.h>

#include "gpu/gguf/gguf.h"

uint32_t verbs_extent_count(const struct kvpool_geom *g, uint32_t tokens)
{
	if (tokens == 0 || tokens > g->page_tokens)
		return 0;
	return tokens == g->page_tokens ? 1 : 2 * g->n_layer;
}

int verbs_extent_page(const struct kvpool_geom *g, uint32_t tokens,
		      struct verbs_extent *out, uint32_t max)
{
	uint64_t tok_bytes = (uint64_t)g->kv_dim * kv_dtype_size(g->dtype);
	uint64_t block = (uint64_t)g->page_tokens * tok_bytes;
	uint32_t n = 0;

	if (tokens == 0 || tokens > g->page_tokens || !kvpool_page_bytes(g))
		return -EINVAL;
	if (max < verbs_extent_count(g, tokens))
		return -ENOSPC;
	if (tokens == g->page_tokens) {
		/* the tag and every block, not the page's alignment padding:
		 * nothing the request did not write leaves */
		out[0] = (struct verbs_extent){ 0, KVTAG_BYTES + 2 * (uint64_t)g->n_layer * block };
		return 1;
	}
	for (uint32_t b = 0; b < 2 * g->n_layer; b++) {
		uint64_t off = KVTAG_BYTES + (uint64_t)b * block;

		if (b == 0)   /* the tag sits right before the first block */
			out[n++] = (struct verbs_extent){ 0, KVTAG_BYTES + tokens * tok_bytes };
		else
			out[n++] = (struct verbs_extent){ off, tokens * tok_bytes };
	}
	return (int)n;
}
