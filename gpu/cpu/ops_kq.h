/* ops_kq.h - K-quant weights (GGUF Q2_K, Q3_K, Q4_K, Q5_K, Q6_K): block
 * layouts, dequantization, dot products against Q8_K activations, and a
 * quantizer for kvctl model make.
 *
 * Every K-quant block holds 256 weights (OPS_QK_K). The byte layouts are
 * documented in gpu/README.md ("K-quant blocks"). Each type reduces, by
 * ops_kq_unpack(), to one reference form (struct ops_kq_unpacked):
 *
 *     w[e] = (d * sc[e / 16]) * q[e] - (dmin * mn[e / 16])
 *
 * with integer q, sc and mn, so dequantization, the scalar dot products
 * and the packer share one definition per type.
 *
 * Dot products read activations prepared as Q8_K blocks (kvd's own
 * layout, never stored in a file): per block the weight x activation
 * products are summed exactly in integers, then scaled once in float
 * (ops_kq_combine), so the scalar and SIMD kernels give identical bits.
 *
 * Thread safety: all functions are pure and reentrant.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpu/gguf/gguf.h"

#define OPS_QK_K 256 /* weights per K-quant block */

/* GGUF Q2_K: 84 bytes, 2.625 bits per weight. */
struct ops_block_q2_k {
	uint8_t scales[16];  /* group g of 16: low nibble scale, high nibble min */
	uint8_t qs[64];      /* 2-bit quants, see README */
	uint16_t d, dmin;    /* IEEE half */
};

/* GGUF Q3_K: 110 bytes, 3.4375 bits per weight. */
struct ops_block_q3_k {
	uint8_t hmask[32];   /* third (high) bit of each quant */
	uint8_t qs[64];      /* low 2 bits */
	uint8_t scales[12];  /* 16 6-bit scales, stored + 32 */
	uint16_t d;
};

/* GGUF Q4_K: 144 bytes, 4.5 bits per weight. */
struct ops_block_q4_k {
	uint16_t d, dmin;
	uint8_t scales[12];  /* 8 6-bit scales and 8 6-bit mins */
	uint8_t qs[128];     /* 4-bit quants */
};

/* GGUF Q5_K: 176 bytes, 5.5 bits per weight. */
struct ops_block_q5_k {
	uint16_t d, dmin;
	uint8_t scales[12];
	uint8_t qh[32];      /* fifth bit */
	uint8_t qs[128];     /* low 4 bits */
};

/* GGUF Q6_K: 210 bytes, 6.5625 bits per weight. */
struct ops_block_q6_k {
	uint8_t ql[128];     /* low 4 bits */
	uint8_t qh[64];      /* high 2 bits */
	int8_t scales[16];   /* one per group of 16 */
	uint16_t d;
};

/* A prepared activation block: value = qs[j] * d; bsums[g] = sum of
 * qs[16g .. 16g+15]. 292 bytes, the size of GGUF's Q8_K. */
struct ops_block_q8_k {
	float d;
	int8_t qs[OPS_QK_K];
	int16_t bsums[OPS_QK_K / 16];
};

_Static_assert(sizeof(struct ops_block_q2_k) == 84, "q2_k block");
_Static_assert(sizeof(struct ops_block_q3_k) == 110, "q3_k block");
_Static_assert(sizeof(struct ops_block_q4_k) == 144, "q4_k block");
_Static_assert(sizeof(struct ops_block_q5_k) == 176, "q5_k block");
_Static_assert(sizeof(struct ops_block_q6_k) == 210, "q6_k block");
_Static_assert(sizeof(struct ops_block_q8_k) == 292, "q8_k block");

/* The reference form of one block (see top). */
struct ops_kq_unpacked {
	float d, dmin;
	int16_t sc[16];          /* per group of 16 weights */
	int16_t mn[16];          /* per group; 0 for Q3_K and Q6_K */
	int8_t q[OPS_QK_K];
};

/* Index of a K-quant weight type in per-type tables (OPS_KQ_N of them). */
enum { OPS_KQ_N = 5 };
/* 0..4 for Q2_K..Q6_K, -1 for any other type. */
int ops_kq_index(enum ggml_type t);
static inline bool ops_kq_is(enum ggml_type t) { return ops_kq_index(t) >= 0; }
/* Bytes of one block of type t (a K-quant type). */
size_t ops_kq_block_bytes(enum ggml_type t);

/* Block <-> reference form. pack is unpack's inverse for values in range
 * (q, sc, mn within the type's bit widths; d, dmin rounded to half). */
void ops_kq_unpack(enum ggml_type t, const void *blk, struct ops_kq_unpacked *u);
void ops_kq_pack(enum ggml_type t, const struct ops_kq_unpacked *u, void *blk);

/* out (n) = the n weights of row (n a multiple of 256). */
void ops_kq_dequant_row(enum ggml_type t, const void *row, float *out,
			uint32_t n);
/* Quantize x (n, a multiple of 256) to type t into out
 * (n / 256 blocks). Simple per-group scales; not tuned for quality. */
void ops_kq_quantize_row(enum ggml_type t, const float *x, uint32_t n,
			 void *out);
/* Prepare activations: x (n, a multiple of 256) to n / 256 Q8_K blocks. */
void ops_q8_k_quantize(const float *x, uint32_t n, struct ops_block_q8_k *out);

/* One dot kernel: sum_j w[j] * x[j] over n (a multiple of 256). */
typedef float (*ops_kq_dot_fn)(const void *w, const struct ops_block_q8_k *x,
			       uint32_t n);

/* The scalar reference kernels, by ops_kq_index. */
extern const ops_kq_dot_fn ops_kq_dot_scalar[OPS_KQ_N];
/* AVX2 kernels by ops_kq_index: a type without an AVX2 kernel holds its
 * scalar one. Only valid after the CPU reported avx2 (ops_kernels_avx2). */
extern const ops_kq_dot_fn ops_kq_dot_avx2[OPS_KQ_N];
/* AVX-512 (F+BW) kernels for every K-quant type. Only valid after
 * ops_kernels_avx512() said yes. */
extern const ops_kq_dot_fn ops_kq_dot_avx512[OPS_KQ_N];
/* The same with VNNI (vpdpwssd). Only valid after
 * ops_kernels_avx512vnni() said yes. */
extern const ops_kq_dot_fn ops_kq_dot_avx512vnni[OPS_KQ_N];

/* One block's contribution from its exact integer sums:
 * (dx * d) * isum - (dx * dmin) * msum. Out of line so that no kernel's
 * compile flags (FMA contraction) change its bits. */
float ops_kq_combine(float dx, float d, float dmin, int32_t isum,
		     int32_t msum);
