/* kvmem_host.c - KV page memory in ordinary host RAM.
 *
 * The host backend is the reference backend: page bytes are plain memory,
 * so read and write are memcpy and the pool may also dereference pages
 * directly (host_visible). Large regions are page aligned (4096) so a chunk
 * can later be registered for RDMA without straddling a partial page; small
 * ones only need the 64-byte alignment every kvmem backend promises (a
 * page's tag and its K/V blocks start on a cache line).
 *
 * Memory is never zeroed: that is the contract (pages are overwritten by
 * their next owner, and tags tell readers whether they were). The backend
 * keeps no state, so ctx is NULL.
 *
 * kvmem_deinit lives here because this file is built in every
 * configuration; the CUDA backend keeps its device number in ctx itself
 * and owns nothing to free either.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/kv/kvmem.h"

static int kvmem_host_alloc(void *ctx, size_t bytes, void **out)
{
	size_t align = bytes >= 4096 ? 4096 : 64;
	void *ptr = NULL;
	int r;

	if (bytes == 0)
		return -EINVAL;
	r = posix_memalign(&ptr, align, bytes);
	if (r)
		return -r;
	*out = ptr;
	return 0;
}

static void kvmem_host_free(void *ctx, void *ptr, size_t bytes)
{
	free(ptr);
}

static int kvmem_host_read(void *ctx, void *host_dst, const void *src,
			   size_t n)
{
	memcpy(host_dst, src, n);
	return 0;
}

static int kvmem_host_write(void *ctx, void *dst, const void *host_src,
			    size_t n)
{
	memcpy(dst, host_src, n);
	return 0;
}

static int kvmem_host_zero2d(void *ctx, void *dst, size_t pitch,
			     size_t width, size_t rows)
{
	for (size_t i = 0; i < rows; i++)
		memset((char *)dst + i * pitch, 0, width);
	return 0;
}

static const struct kvmem_ops kvmem_host_ops = {
	.name = "host",
	.host_visible = true,
	.alloc = kvmem_host_alloc,
	.free = kvmem_host_free,
	.read = kvmem_host_read,
	.write = kvmem_host_write,
	.tags_compare = NULL,
	.zero2d = kvmem_host_zero2d,
};

void kvmem_host_init(struct kvmem *m)
{
	m->ops = &kvmem_host_ops;
	m->ctx = NULL;
}

void kvmem_deinit(struct kvmem *m)
{
	m->ops = NULL;
	m->ctx = NULL;
}
