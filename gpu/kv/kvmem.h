/* kvmem.h - where KV page memory comes from.
 *
 * The page pool never calls malloc or cudaMalloc itself: it asks a kvmem
 * backend. The host backend hands out ordinary (64-byte aligned) memory; the
 * CUDA backend hands out device memory, which the CPU cannot dereference,
 * so every host access to page bytes (integrity tags, TCP transfer staging)
 * goes through read/write. An RDMA transport registers the same regions.
 *
 * Backends are plain ops tables; which file implements `cuda` is chosen by
 * the build (kvmem_cuda.c with CUDA, kvmem_nocuda.c without).
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct kvmem_ops {
	const char *name;        /* "host", "cuda" */
	bool host_visible;       /* page bytes may be dereferenced by the CPU */
	/* Allocate `bytes` (64-byte aligned at least). Not zeroed: pages are
	 * never zeroed between owners, which is why tags exist. */
	int (*alloc)(void *ctx, size_t bytes, void **out);
	void (*free)(void *ctx, void *ptr, size_t bytes);
	/* Copy between backend memory and host memory. 0 or negative errno. */
	int (*read)(void *ctx, void *host_dst, const void *src, size_t n);
	int (*write)(void *ctx, void *dst, const void *host_src, size_t n);
	/* Optional (NULL: the pool reads each tag with `read`). Compare the
	 * first 64 bytes of each of pages[0..n) (backend addresses) with
	 * expected[0..n) (host memory, 64 bytes each) in one batch.
	 * 0 when all match; 1 with *bad = the first mismatching index;
	 * negative errno on failure. */
	int (*tags_compare)(void *ctx, void *const *pages,
			    const void *expected, uint32_t n, uint32_t *bad);
	/* Optional (NULL: the pool writes zeros with `write`). Zero `width`
	 * bytes in each of `rows` rows, `pitch` bytes apart, from dst (a
	 * backend address; pitch >= width). Used to clear the unfilled tail
	 * of a page in every K/V block at once. 0 or negative errno. */
	int (*zero2d)(void *ctx, void *dst, size_t pitch, size_t width,
		      size_t rows);
};

struct kvmem {
	const struct kvmem_ops *ops;
	void *ctx;
};

#define KVMEM_NULL { .ops = NULL, .ctx = NULL }

/* Host memory: always available. */
void kvmem_host_init(struct kvmem *m);

/* Device memory on CUDA device `device`. -ENOTSUP in a build without CUDA,
 * -ENODEV when no device is present. */
int kvmem_cuda_init(struct kvmem *m, int device);
/* Safe twice; frees nothing the pool allocated (free pools first). */
void kvmem_deinit(struct kvmem *m);
