/* kvtag.cu - batched integrity-tag check for KV pages in device memory.
 *
 * Why on the GPU: decode verifies every page of a request's table before
 * attention reads it. With pages in device memory, reading each 64-byte
 * tag back with its own cudaMemcpy costs a round trip per page; one kernel
 * checks a whole table in one launch and returns a single index.
 *
 * What is compared: the expected tags are built on the host with
 * kvtag_make (owner, generation, page, index, tokens, XXH3 check), so the
 * device never computes the check value and cannot disagree with the host
 * about it. The kernel compares bytes; a page passes only when all 64
 * bytes are identical.
 *
 * Grid/block mapping: grid.x = n (one block per table entry), block = one
 * warp of 32 threads. Lanes 0..7 each load one 8-byte word of the page's
 * tag and of the expected tag; the warp votes (__all_sync) and lane 0 of a
 * failing block lowers *first_bad with atomicMin, so the host copies back
 * one uint32 whatever n is.
 *
 * Buffers (one device allocation per call, stream-ordered):
 *   ptrs      (n)        device addresses of the pages, 8 bytes each
 *   expected  (n, 64)    expected tags
 *   first_bad (1)        uint32, UINT32_MAX when every tag matches
 */
#include <cerrno>
#include <cstdint>
#include <cuda_runtime.h>

#include "gpu/cuda/kvtag_cuda.h"

#define KVTAG_WORDS 8 /* 64 bytes as uint64 */

__global__ void kvtag_compare_kernel(const uint64_t *const *ptrs,
				     const uint64_t *expected, uint32_t n,
				     uint32_t *first_bad)
{
	uint32_t page = blockIdx.x;
	unsigned lane = threadIdx.x;
	bool same = true;

	if (page >= n)
		return;
	if (lane < KVTAG_WORDS)
		same = ptrs[page][lane] ==
		       expected[(uint64_t)page * KVTAG_WORDS + lane];
	if (!__all_sync(0xffffffffu, same) && lane == 0)
		atomicMin(first_bad, page);
}

static int kvtag_cuda_errno(cudaError_t e)
{
	return e == cudaErrorMemoryAllocation ? -ENOMEM : -EIO;
}

extern "C" int kvtag_cuda_compare(int device, void *const *pages,
				  const void *expected, uint32_t n,
				  uint32_t *bad)
{
	size_t ptr_bytes = (size_t)n * sizeof(void *);
	size_t tag_bytes = (size_t)n * KVTAG_WORDS * sizeof(uint64_t);
	char *buf = NULL;
	uint32_t first = UINT32_MAX;
	cudaStream_t s = 0;
	cudaError_t e;

	if (n == 0)
		return 0;
	e = cudaSetDevice(device);
	if (e != cudaSuccess)
		return kvtag_cuda_errno(e);
	/* ptrs | expected | first_bad; both arrays are 8-byte aligned. */
	e = cudaMallocAsync((void **)&buf, ptr_bytes + tag_bytes +
				   sizeof(uint32_t), s);
	if (e != cudaSuccess)
		return kvtag_cuda_errno(e);
	e = cudaMemcpyAsync(buf, pages, ptr_bytes, cudaMemcpyHostToDevice, s);
	if (e == cudaSuccess)
		e = cudaMemcpyAsync(buf + ptr_bytes, expected, tag_bytes,
				    cudaMemcpyHostToDevice, s);
	if (e == cudaSuccess)
		e = cudaMemsetAsync(buf + ptr_bytes + tag_bytes, 0xff,
				    sizeof(uint32_t), s);
	if (e == cudaSuccess) {
		kvtag_compare_kernel<<<n, 32, 0, s>>>(
			(const uint64_t *const *)buf,
			(const uint64_t *)(buf + ptr_bytes), n,
			(uint32_t *)(buf + ptr_bytes + tag_bytes));
		e = cudaGetLastError();
	}
	if (e == cudaSuccess)
		e = cudaMemcpyAsync(&first, buf + ptr_bytes + tag_bytes,
				    sizeof(first), cudaMemcpyDeviceToHost, s);
	cudaFreeAsync(buf, s);
	if (e == cudaSuccess)
		e = cudaStreamSynchronize(s);
	if (e != cudaSuccess)
		return kvtag_cuda_errno(e);
	if (first == UINT32_MAX)
		return 0;
	if (bad)
		*bad = first;
	return 1;
}
