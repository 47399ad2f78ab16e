/* kvmem_cuda.c - KV page memory in CUDA device memory.
 *
 * Built instead of kvmem_nocuda.c when the build has CUDA. Page bytes live
 * on device `device`; the CPU cannot dereference them (host_visible false),
 * so the pool reads and writes tags through cudaMemcpy, and checks a whole
 * table's tags with one kernel launch (tags_compare, cuda/kvtag.cu).
 *
 * The backend keeps no heap state: ctx *is* the device number, so
 * kvmem_deinit (in kvmem_host.c) has nothing to free. Every call selects
 * its device first because the calling thread may have another current.
 * CUDA errors map to -ENOMEM (allocation) or -EIO (anything else); no
 * CUDA error code escapes this file.
 */
#include <errno.h>
#include <stdint.h>
#include <cuda_runtime_api.h>

#include "gpu/cuda/kvtag_cuda.h"
#include "gpu/kv/kvmem.h"

static int kvmem_cuda_device(void *ctx)
{
	return (int)(intptr_t)ctx;
}

static int kvmem_cuda_errno(cudaError_t e)
{
	return e == cudaErrorMemoryAllocation ? -ENOMEM : -EIO;
}

static int kvmem_cuda_alloc(void *ctx, size_t bytes, void **out)
{
	cudaError_t e = cudaSetDevice(kvmem_cuda_device(ctx));

	if (bytes == 0)
		return -EINVAL;
	if (e == cudaSuccess)
		e = cudaMalloc(out, bytes);
	return e == cudaSuccess ? 0 : kvmem_cuda_errno(e);
}

static void kvmem_cuda_free(void *ctx, void *ptr, size_t bytes)
{
	if (cudaSetDevice(kvmem_cuda_device(ctx)) == cudaSuccess)
		cudaFree(ptr);
}

static int kvmem_cuda_read(void *ctx, void *host_dst, const void *src,
			   size_t n)
{
	cudaError_t e = cudaSetDevice(kvmem_cuda_device(ctx));

	if (e == cudaSuccess)
		e = cudaMemcpy(host_dst, src, n, cudaMemcpyDeviceToHost);
	return e == cudaSuccess ? 0 : kvmem_cuda_errno(e);
}

static int kvmem_cuda_write(void *ctx, void *dst, const void *host_src,
			    size_t n)
{
	cudaError_t e = cudaSetDevice(kvmem_cuda_device(ctx));

	if (e == cudaSuccess)
		e = cudaMemcpy(dst, host_src, n, cudaMemcpyHostToDevice);
	return e == cudaSuccess ? 0 : kvmem_cuda_errno(e);
}

static int kvmem_cuda_tags_compare(void *ctx, void *const *pages,
				   const void *expected, uint32_t n,
				   uint32_t *bad)
{
	return kvtag_cuda_compare(kvmem_cuda_device(ctx), pages, expected, n,
				  bad);
}

/* One strided memset for all 2 x n_layer block tails of a page; it runs
 * on the default stream and is waited for, like the copies above, so the
 * tail is zero before any later read or transfer of the page. */
static int kvmem_cuda_zero2d(void *ctx, void *dst, size_t pitch, size_t width,
			     size_t rows)
{
	cudaError_t e = cudaSetDevice(kvmem_cuda_device(ctx));

	if (e == cudaSuccess)
		e = cudaMemset2D(dst, pitch, 0, width, rows);
	if (e == cudaSuccess)
		e = cudaDeviceSynchronize();
	return e == cudaSuccess ? 0 : kvmem_cuda_errno(e);
}

static const struct kvmem_ops kvmem_cuda_ops = {
	.name = "cuda",
	.host_visible = false,
	.alloc = kvmem_cuda_alloc,
	.free = kvmem_cuda_free,
	.read = kvmem_cuda_read,
	.write = kvmem_cuda_write,
	.tags_compare = kvmem_cuda_tags_compare,
	.zero2d = kvmem_cuda_zero2d,
};

int kvmem_cuda_init(struct kvmem *m, int device)
{
	int count = 0;

	m->ops = NULL;
	m->ctx = NULL;
	if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0)
		return -ENODEV;
	if (device < 0 || device >= count)
		return -ENODEV;
	m->ops = &kvmem_cuda_ops;
	m->ctx = (void *)(intptr_t)device;
	return 0;
}
