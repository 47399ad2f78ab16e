/* backend.h - the compute seam: run the llama forward pass over a batch of
 * tokens whose K and V live in KV pool pages.
 *
 * The engine (gpu/engine.h) decides what to run: which requests, which
 * positions, which pages; it checks the page tables (kvpool_verify) before
 * handing their addresses here. A backend only computes. The CPU backend
 * (backend_cpu.c) is always built; a CUDA backend implements the same ops
 * on device memory (pages from the cuda kvmem) and drops in beside it.
 *
 * Batch rules the caller guarantees: the tokens of one sequence occupy
 * consecutive positions ending at that sequence's n_kv - 1, in increasing
 * order; every position < n_kv that is not in the batch already holds K
 * and V in the pages. The backend writes K and V of each batch token into
 * its slot (page pos / page_tokens, slot pos % page_tokens; layout in
 * gpu/kv/kvpool.h) and then attends causally over [0, pos].
 *
 * Determinism: a backend must give bit-identical logits for a token
 * whatever else is in the batch and however many threads it uses.
 *
 * Errors: forward returns 0 or a negative errno.
 * Thread safety: one caller thread at a time per backend instance.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "gpu/gguf/gguf.h"

struct kvlog;
struct ops_kernels;
struct prepack_info;

struct model;

/* One sequence (request) of a batch. */
struct backend_seq {
	uint8_t *const *pages;  /* (n_pages) page base addresses (the tag), table order */
	uint32_t n_pages;
	uint32_t n_kv;          /* positions with KV once this batch ran */
};

struct backend_batch {
	uint32_t n_tokens;
	const int32_t *tokens;  /* (n_tokens) token ids */
	const uint32_t *pos;    /* (n_tokens) position of each token in its sequence */
	const uint32_t *seq;    /* (n_tokens) index into seqs */
	const struct backend_seq *seqs; /* (n_seqs) */
	uint32_t n_seqs;
	const uint32_t *out;    /* (n_out) batch indices whose logits are wanted */
	uint32_t n_out;
};

struct backend_ops {
	const char *name;
	/* logits: (n_out, n_vocab), row j for token out[j]. */
	int (*forward)(void *ctx, const struct backend_batch *b, float *logits);
	void (*free)(void *ctx);
};

struct backend {
	const struct backend_ops *ops;
	void *ctx;
};

#define BACKEND_NULL { .ops = NULL, .ctx = NULL }

/* KV page geometry as the backend needs it (from kvpool_geom and
 * kvpool_block_offset). */
struct backend_kv_layout {
	uint32_t page_tokens;
	enum kv_dtype dtype;
	const uint64_t *k_off;  /* (n_layer) byte offset of layer l's K block in a page */
	const uint64_t *v_off;  /* (n_layer) */
};

struct backend_cpu_params {
	uint32_t threads;       /* worker threads, >= 1 */
	uint32_t max_tokens;    /* largest batch (n_tokens) forward will get */
	uint32_t max_ctx;       /* largest n_kv */
	bool simd;              /* use AVX2 kernels when the CPU has them */
	/* The repack cache (gpu/model/prepack.h): a directory, or NULL / "" for
	 * none (the copies are then packed into private memory at every
	 * start); with a directory, the model's SHA-256 (64 hex digits). */
	const char *pack_dir;
	const char *model_sha256;
	bool pack_clean;          /* prepack_key.clean, .keep_days, .log */
	uint32_t pack_keep_days;
	struct kvlog *pack_log;
	/* backend_cpu_prof in the calling thread's CPU time, not wall time */
	bool prof_cpu;
};

/* The CPU backend. The model must outlive it. 0 or negative errno. */
int backend_cpu_new(struct backend *out, const struct model *m,
		    const struct backend_kv_layout *kv,
		    const struct backend_cpu_params *p);
/* Name of the kernel table in use ("avx2", "scalar"). */
const char *backend_cpu_kernels(const struct backend *b);
/* The kernel table itself (NULL for another backend). */
const struct ops_kernels *backend_cpu_kernel_table(const struct backend *b);
/* Where the packed weight copies came from (NULL for another backend). */
const struct prepack_info *backend_cpu_pack_info(const struct backend *b);
struct threadpool_stats;
/* The CPU backend's thread-pool counters (gpu/cpu/threadpool.h); zeros for
 * another backend. */
void backend_cpu_pool_stats(const struct backend *b, struct threadpool_stats *out);
/* Where the CPU backend's forward() time went, summed over every call
 * since it was made: wall time on the calling thread (which waits for
 * the workers), or with prof_cpu that thread's CPU time, in ns. A
 * handful of clock reads per layer. */
struct backend_cpu_prof {
	uint64_t forward_ns;    /* all of forward() */
	uint64_t mm_ns;         /* the layers' matmuls (Q/K/V, O, gate/up, down) */
	uint64_t att_ns;        /* attention (scores, softmax, V sum) */
	uint64_t tok_ns;        /* the per-token steps: embedding, residual adds,
				 * norms, SwiGLU, activation quantization,
				 * biases, RoPE, K/V store */
	uint64_t logits_ns;     /* final norm, its quantization, output matmul */
};
/* Zeros for another backend. */
void backend_cpu_prof(const struct backend *b, struct backend_cpu_prof *out);

static inline int backend_forward(struct backend *b,
				  const struct backend_batch *batch,
				  float *logits)
{
	return b->ops->forward(b->ctx, batch, logits);
}

static inline void backend_deinit(struct backend *b)
{
	if (b->ops)
		b->ops->free(b->ctx);
	b->ops = NULL;
	b->ctx = NULL;
}
