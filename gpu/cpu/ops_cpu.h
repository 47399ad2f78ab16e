/* ops_cpu.h - CPU compute kernels: dot products per weight type, matmul on
 * a row range, RMSNorm, RoPE, softmax, SwiGLU, and attention that reads K
 * and V through a request's page table.
 *
 * Kernels come in tables (struct ops_kernels): one scalar table that runs
 * everywhere and, on x86-64, one AVX2+FMA+F16C table, one "avx512"
 * table (the AVX2 one with AVX-512 K-quant dots) and one "avx512vnni"
 * table (AVX-512 register-tile matmuls, VNNI int8 dots, VNNI K-quant dots).
 * ops_kernels_pick()
 * chooses at run time from what the CPU reports; nothing is chosen at
 * compile time and no global state is kept. Every kernel in a table is a
 * pure function of its inputs with a fixed reduction order, so a result
 * never depends on how a caller splits work across threads or tokens;
 * only the table (scalar vs SIMD) may change the last bits.
 *
 * Weights are used where they lie (the GGUF mapping), or in a copy a
 * table lays out for itself (ops_mat_pack: Q4_0/Q8_0 and the K-quants
 * for avx512vnni, same bits); activations are
 * "prepared" once per row for the weight type: F32/F16 weights take F32
 * rows as they are, Q8_0/Q4_0 weights take rows quantized to q8 blocks
 * (ops_act_prepare), and K-quant weights (Q2_K..Q6_K, ops_kq.h) take rows
 * quantized to Q8_K blocks, so a row shared by several matmuls (Q, K, V)
 * is quantized once per layout.
 *
 * Thread safety: all functions are reentrant; a caller splits a matmul by
 * output rows (ops_matmul_rows on disjoint ranges), never inside a dot.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpu/gguf/gguf.h"
#include "gpu/cpu/ops_kq.h"

#define OPS_QK 32 /* elements per Q8_0 / Q4_0 block */

/* GGUF Q8_0 weight block: 34 bytes. */
struct ops_block_q8_0 {
	uint16_t d;        /* scale, IEEE half */
	int8_t qs[OPS_QK]; /* value = qs[j] * d */
};

/* GGUF Q4_0 weight block: 18 bytes. */
struct ops_block_q4_0 {
	uint16_t d;             /* scale, IEEE half */
	uint8_t qs[OPS_QK / 2]; /* element j: low nibble of qs[j], element
				 * j+16: high nibble; value = (nib - 8) * d */
};

/* A prepared activation block (kvd's own layout, never stored in files). */
struct ops_block_q8_act {
	float d;           /* scale: value = qs[j] * d */
	int8_t qs[OPS_QK];
};

_Static_assert(sizeof(struct ops_block_q8_0) == 34, "q8_0 block");
_Static_assert(sizeof(struct ops_block_q4_0) == 18, "q4_0 block");
_Static_assert(sizeof(struct ops_block_q8_act) == 36, "q8 act block");

struct ops_mat;

struct ops_kernels {
	const char *name;  /* "scalar", "avx2", "avx512", "avx512vnni" */
	/* sum_j w[j] * x[j], n any length */
	float (*dot_f32)(const float *w, const float *x, uint32_t n);
	/* w in IEEE half */
	float (*dot_f16)(const uint16_t *w, const float *x, uint32_t n);
	/* out[t] = dot(w, x + t * x_stride) for t < 3, each bit-identical to
	 * the single-row dot above (prefill reuses each weight load) */
	void (*dot3_f32)(const float *w, const float *x, size_t x_stride,
			 uint32_t n, float *out);
	void (*dot3_f16)(const uint16_t *w, const float *x, size_t x_stride,
			 uint32_t n, float *out);
	/* x_stride in act blocks */
	void (*dot3_q8_0)(const struct ops_block_q8_0 *w,
			  const struct ops_block_q8_act *x, size_t x_stride,
			  uint32_t n, float *out);
	void (*dot3_q4_0)(const struct ops_block_q4_0 *w,
			  const struct ops_block_q8_act *x, size_t x_stride,
			  uint32_t n, float *out);
	/* n a multiple of OPS_QK; x prepared as q8 act blocks */
	float (*dot_q8_0)(const struct ops_block_q8_0 *w,
			  const struct ops_block_q8_act *x, uint32_t n);
	float (*dot_q4_0)(const struct ops_block_q4_0 *w,
			  const struct ops_block_q8_act *x, uint32_t n);
	/* K-quant rows x Q8_K activations, by ops_kq_index (ops_kq.h) */
	const ops_kq_dot_fn *dot_kq;
	/* y[j] += a * x[j] */
	void (*axpy_f32)(float *y, float a, const float *x, uint32_t n);
	void (*axpy_f16)(float *y, float a, const uint16_t *x, uint32_t n);
	/* half <-> float conversion of n values (round to nearest even) */
	void (*f32_to_f16)(uint16_t *dst, const float *src, uint32_t n);
	/* Optional (NULL: ops_matmul_rows loops over the dots above): the
	 * whole of ops_matmul_rows as cache-blocked register tiles for the
	 * types it knows, false for the others. Each value bit-identical to
	 * the table's own dot of that (row, token). */
	bool (*gemm)(const struct ops_mat *w, const void *act,
		     size_t act_stride, uint32_t n, float *y, size_t y_stride,
		     uint32_t r0, uint32_t r1);
	/* Optional (NULL: attention calls axpy per position): y (n) +=
	 * a[t] * row t for t < count in order, rows x_stride bytes apart
	 * (F32, or F16 when f16), n a multiple of 16; y held in registers
	 * over the rows, each element the same fmas as axpy's. */
	void (*axpy_rows)(float *y, const float *a, const void *x,
			  size_t x_stride, uint32_t count, uint32_t n, bool f16);
};

/* The scalar table (always available). */
const struct ops_kernels *ops_kernels_scalar(void);
/* The AVX2+FMA+F16C table, or NULL when the CPU (or the build target)
 * lacks it. */
const struct ops_kernels *ops_kernels_avx2(void);
/* The AVX2 table with AVX-512 (F+BW) K-quant dot kernels, or NULL. */
const struct ops_kernels *ops_kernels_avx512(void);
/* The avx512 table with AVX-512 register-tile matmuls and AVX-512 dots
 * for F32/F16/Q8_0/Q4_0 (VNNI for the int8 ones) and VNNI K-quant dots, or NULL when the CPU
 * lacks avx512f/bw/dq/vl/vnni (ops_gemm.c). */
const struct ops_kernels *ops_kernels_avx512vnni(void);
/* The fastest table this CPU runs; the scalar one when simd is false. */
const struct ops_kernels *ops_kernels_pick(bool simd);

/* ---- scalar helpers -------------------------------------------------- */
float ops_f16_to_f32(uint16_t h);
uint16_t ops_f32_to_f16(float f);

/* ---- weights ---------------------------------------------------------- */

/* A 2-D weight in its file layout: `rows` rows of `cols` elements. */
struct ops_mat {
	enum ggml_type type;   /* F32, F16, Q8_0, Q4_0, Q2_K..Q6_K */
	uint32_t rows;
	uint32_t cols;
	size_t row_bytes;
	const void *data;      /* (rows, row_bytes) */
	/* NULL, or the same weights in a layout of one kernel table
	 * (ops_mat_pack): that table's matmul reads it instead of data,
	 * with the same bits; every other table ignores it. */
	const void *packed;
};

/* A copy of w in table k's preferred layout, for w->packed (allocated;
 * the caller frees it after the last matmul), or *out = NULL when k has
 * none for w's type (today only avx512vnni: Q4_0 and Q8_0 blocks paired
 * with their lanes interleaved, the same size as the file's; Q2_K..Q6_K
 * matrices of at least 16 rows in groups of 16 interleaved rows, about
 * the file's size, ops_kq_gemm.c). 0 or -ENOMEM. */
int ops_mat_pack(const struct ops_kernels *k, const struct ops_mat *w,
		 void **out);
/* The two halves of ops_mat_pack, for a caller that places the copy
 * itself (gpu/model/prepack.c, the repack cache): the copy's size in bytes (0
 * when k has no layout of its own for w), and the packing into dst (that
 * many bytes, 64-byte aligned at least; nothing when the size is 0). */
size_t ops_mat_packed_bytes(const struct ops_kernels *k, const struct ops_mat *w);
void ops_mat_pack_into(const struct ops_kernels *k, const struct ops_mat *w,
		       void *dst);
/* The packed layouts' version, part of the repack cache's key
 * (gpu/model/prepack.c): whoever changes what ops_mat_pack_into writes for any
 * type - a layout, a new packed type - must bump it, or daemons would
 * read copies made by the old code from their caches. */
#define OPS_PACK_LAYOUT 1

/* true when matmul supports the type */
bool ops_type_supported(enum ggml_type t);
/* Bytes of one prepared activation row of `cols` values for weight type t
 * (F32/F16: cols * 4; Q8_0/Q4_0: cols / 32 act blocks; K-quants:
 * cols / 256 Q8_K blocks). */
size_t ops_act_row_bytes(enum ggml_type t, uint32_t cols);
/* Prepare one activation row x (cols) for weight type t into out
 * (ops_act_row_bytes). For F32/F16 this is a copy. */
void ops_act_prepare(enum ggml_type t, const float *x, uint32_t cols,
		     void *out);
/* The plain C q8 quantizer ops_act_prepare uses without AVX-512 (the
 * reference the vector one is tested against, byte for byte). */
void ops_act_prepare_q8_scalar(const float *x, uint32_t cols,
			       struct ops_block_q8_act *out);
/* Which activation layout a weight type reads: two types with the same
 * class share prepared rows. 0 = f32 rows, 1 = q8 act blocks, 2 = Q8_K
 * blocks (OPS_ACT_CLASSES in all). */
#define OPS_ACT_CLASSES 3
int ops_act_class(enum ggml_type t);

/* y[i][r] = dot(w row r, act row i) for r in [r0, r1), i in [0, n).
 *   act: (n, act_stride bytes), prepared for w->type; act_stride a
 *        multiple of the prepared element (4 bytes, a q8 act block or a
 *        Q8_K block)
 *   y:   (n, y_stride floats) */
void ops_matmul_rows(const struct ops_kernels *k, const struct ops_mat *w,
		     const void *act, size_t act_stride, uint32_t n,
		     float *y, size_t y_stride, uint32_t r0, uint32_t r1);

/* Dequantize row r of w into out (cols floats): embeddings lookup. */
void ops_mat_row_f32(const struct ops_mat *w, uint32_t r, float *out);

/* ---- elementwise and normalization ------------------------------------ */

/* out (n) = x (n) / sqrt(mean(x^2) + eps) * g (n); out may alias x. */
void ops_rmsnorm(float *out, const float *x, const float *g, uint32_t n,
		 float eps);
/* In place softmax over x (n); sums in index order. */
void ops_softmax(float *x, uint32_t n);
/* a (n) = silu(a) * b */
void ops_swiglu(float *a, const float *b, uint32_t n);

/* RoPE, "normal" mode (GGUF llama): within each head the adjacent pairs
 * (x[2i], x[2i+1]) for 2i < rope_dim rotate by theta_i = pos * freq_scale
 * * base^(-2i / rope_dim); dims past rope_dim pass through.
 * cs: (rope_dim / 2, 2) cos/sin table for pos from ops_rope_table. */
void ops_rope_table(float *cs, uint32_t pos, uint32_t rope_dim,
		    float freq_base, float freq_scale);
/* x: (n_heads, head_dim) */
void ops_rope_apply(float *x, uint32_t n_heads, uint32_t head_dim,
		    uint32_t rope_dim, const float *cs);
/* RoPE, NEOX mode (GGUF qwen2, qwen3): the pairs are (x[i],
 * x[i + rope_dim / 2]) for i < rope_dim / 2, with the same theta_i and
 * the same table. */
void ops_rope_apply_neox(float *x, uint32_t n_heads, uint32_t head_dim,
			 uint32_t rope_dim, const float *cs);

/* ---- KV through pages -------------------------------------------------- */

/* One layer of one request's KV as the pages lay it out (kvpool.h):
 * position t lives in pages[t / page_tokens], slot t % page_tokens, at
 * k_off (resp. v_off) + slot * kv_dim * elt. */
struct ops_kv_view {
	uint8_t *const *pages;  /* (n_pages) base address of each page, table order */
	uint32_t page_tokens;
	uint32_t kv_dim;        /* n_head_kv * head_dim */
	enum kv_dtype dtype;
	uint64_t k_off;         /* byte offset of this layer's K block in a page */
	uint64_t v_off;         /* byte offset of this layer's V block */
};

/* Write k (kv_dim) and v (kv_dim) for position pos. */
void ops_kv_store(const struct ops_kernels *k, const struct ops_kv_view *kv,
		  uint32_t pos, const float *kf, const float *vf);

/* One query head over positions [0, n_pos):
 *   q: (head_dim), the K/V head `kv_head`, scores: (n_pos) scratch,
 *   out: (head_dim) = sum_t softmax(q.k_t * scale)_t v_t */
void ops_attention_head(const struct ops_kernels *k,
			const struct ops_kv_view *kv, const float *q,
			uint32_t kv_head, uint32_t head_dim, uint32_t n_pos,
			float scale, float *scores, float *out);
/* The unit a caller will compute next (K/V head kv_head of view kv over
 * n_pos positions): ops_attention_group prefetches its K/V rows. */
struct ops_att_next {
	const struct ops_kv_view *kv;
	uint32_t kv_head;
	uint32_t n_pos;
};

/* The `group` query heads that share K/V head kv_head (a GQA group), at
 * once: q and out (group, head_dim), scores: group rows of score_stride
 * (>= n_pos) floats of scratch. Each head's out has the bits
 * ops_attention_head gives it; the tables with a gemm read each K row
 * once for the whole group. `next` (or NULL): the unit the caller
 * computes after this one, whose K/V rows are prefetched meanwhile (it
 * changes no value). */
void ops_attention_group(const struct ops_kernels *k,
			 const struct ops_kv_view *kv, const float *q,
			 uint32_t kv_head, uint32_t group, uint32_t head_dim,
			 uint32_t n_pos, float scale, float *scores,
			 size_t score_stride, float *out,
			 const struct ops_att_next *next);
