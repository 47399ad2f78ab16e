/* kvmem_nocuda.c - the CUDA kvmem backend in a build without CUDA.
 *
 * The build picks this file instead of kvmem_cuda.c when nvcc or cudart is
 * missing, so callers never need an #ifdef: asking for device memory
 * simply answers "not supported by this build".
 */
#include <errno.h>

#include "gpu/kv/kvmem.h"

int kvmem_cuda_init(struct kvmem *m, int device)
{
	m->ops = NULL;
	m->ctx = NULL;
	return -ENOTSUP;
}
