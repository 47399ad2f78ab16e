/* ops_gemm.h - AVX-512 register-tile matmul kernels (internal to gpu/:
 * ops_cpu.c builds its "avx512vnni" table from them; nothing else calls
 * them directly).
 *
 * Every function here is only valid after the CPU reported avx512f,
 * avx512bw, avx512dq, avx512vl and avx512vnni (ops_kernels_avx512vnni).
 * For each weight type the single-row dot, the three-token dot and the
 * tiled matmul compute every (weight row, token) value with the same
 * arithmetic in the same order, so a token's result has the same bits
 * whether it was computed alone (decode) or inside a tile (prefill).
 * Q4_0 and the K-quants: ops_kq_gemm.c (declared at the end).
 */
#pragma once

#include "gpu/cpu/ops_cpu.h"

float ops_gemm__dot_f32(const float *w, const float *x, uint32_t n);
float ops_gemm__dot_f16(const uint16_t *w, const float *x, uint32_t n);
float ops_gemm__dot_q8_0(const struct ops_block_q8_0 *w,
			 const struct ops_block_q8_act *x, uint32_t n);
void ops_gemm__dot3_f32(const float *w, const float *x, size_t xs,
			uint32_t n, float *out);
void ops_gemm__dot3_f16(const uint16_t *w, const float *x, size_t xs,
			uint32_t n, float *out);
void ops_gemm__dot3_q8_0(const struct ops_block_q8_0 *w,
			 const struct ops_block_q8_act *x, size_t xs,
			 uint32_t n, float *out);

/* ops_matmul_rows for F32, F16, Q8_0 and Q4_0 weights, and for K-quant
 * weights with a repacked copy (ops_kqg__matmul) (the table's `gemm`);
 * returns false otherwise (the caller falls back to the dots). */
bool ops_gemm__matmul(const struct ops_mat *w, const void *act,
		      size_t act_stride, uint32_t n, float *y, size_t y_stride,
		      uint32_t r0, uint32_t r1);

/* The table's axpy_rows (ops_cpu.h): attention's V sum over a page's run
 * of positions, n a multiple of 16. */
void ops_gemm__axpy_rows(float *y, const float *a, const void *x,
			 size_t x_stride, uint32_t count, uint32_t n, bool f16);

/* The repacked Q4_0 / Q8_0 layouts of the avx512vnni kernels (struct
 * ops_mat's `packed`): bytes per row (0 for other types), and the
 * repacking of all of w's rows into out (rows * that). */
size_t ops_gemm__packed_row_bytes(enum ggml_type t, uint32_t cols);
void ops_gemm__pack(const struct ops_mat *w, void *out);

/* Quantize one activation row to q8 blocks, bit-identical to the scalar
 * quantizer (amax / 127 scale, round half away from zero), no libm. */
void ops_gemm__quantize_q8_act(const float *x, uint32_t cols,
			       struct ops_block_q8_act *out);

/* K-quant tiles (ops_kq_gemm.c): Q4_K and Q6_K rows repacked in groups
 * of 16 (bytes of the copy of a rows x cols matrix; 0 for other types),
 * the repacking, and ops_matmul_rows over the copy in w->packed (false
 * without one or for another type). Same bits as the table's dot_kq. */
size_t ops_kqg__packed_bytes(enum ggml_type t, uint32_t rows, uint32_t cols);
void ops_kqg__pack(const struct ops_mat *w, void *out);
bool ops_kqg__matmul(const struct ops_mat *w, const void *act,
		     size_t act_stride, uint32_t n, float *y, size_t y_stride,
		     uint32_t r0, uint32_t r1);
/* ops_q8_k_quantize, byte for byte, in AVX-512 (no libm). */
void ops_kqg__quantize_q8_k(const float *x, uint32_t n,
			    struct ops_block_q8_k *out);
/* Q4_0 in the same groups of 16 rows (ops_kq_gemm.c): the copy's size
 * (the file's), the repacking (whole groups, then the other rows as they
 * are), matmul over [r0, r1) with or without a copy in w->packed, and
 * the one-row dots that give its bits (the avx512vnni table's dot_q4_0
 * and dot3_q4_0). */
size_t ops_kqg__q4_0_packed_bytes(uint32_t rows, uint32_t cols);
void ops_kqg__pack_q4_0(const struct ops_mat *w, void *out);
void ops_kqg__matmul_q4_0(const struct ops_mat *w, const void *act,
			  size_t act_stride, uint32_t n, float *y,
			  size_t y_stride, uint32_t r0, uint32_t r1);
float ops_kqg__dot_q4_0(const struct ops_block_q4_0 *w,
			const struct ops_block_q8_act *x, uint32_t n);
void ops_kqg__dot3_q4_0(const struct ops_block_q4_0 *w,
			const struct ops_block_q8_act *x, size_t xs,
			uint32_t n, float *out);
