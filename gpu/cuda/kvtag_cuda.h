/* kvtag_cuda.h - batched integrity-tag check on the GPU (cuda/kvtag.cu).
 *
 * Built only when the build has CUDA. The pool builds the expected tags on
 * the host with kvtag_make (so the check value is computed in exactly one
 * place); the kernel compares them with the first 64 bytes of each page
 * in device memory, one thread block per page.
 */
#pragma once

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Compare the 64-byte tags at pages[0..n) (device addresses) with
 * expected[0..n) (host memory, 64 bytes each) on CUDA device `device`.
 * 0 when all match; 1 with *bad (if non-NULL) = the lowest mismatching
 * index; -ENOMEM or -EIO when a CUDA call fails. Synchronous; callable
 * from any host thread. */
int kvtag_cuda_compare(int device, void *const *pages, const void *expected,
		       uint32_t n, uint32_t *bad);

#ifdef __cplusplus
}
#endif
