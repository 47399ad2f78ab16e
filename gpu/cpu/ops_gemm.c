/* ops_gemm.c - AVX-512 register tiles for prefill, and the decode dots
 * that share their arithmetic.
 *
 * Prefill multiplies a block of weight rows by a block of tokens. The
 * kernels here hold a tile of R weight rows x T tokens (up to 4 x 4) of
 * accumulators in zmm registers and walk the shared dimension once: every
 * weight vector loaded (and converted or unpacked) is used T times, every
 * activation vector R times, instead of the one weight row x three tokens
 * of the AVX2 `dot3` kernels. The driver (ops_gemm__matmul) walks the rows
 * four at a time, and within a row block all tokens four at a time, so a
 * block of weight rows (4 x cols) stays in L1 while the tokens' rows
 * stream from L2. F32/F16 prefill of 32 tokens or more runs in larger
 * panels instead (6 rows x 4 tokens, F16 converted once per panel, wide
 * rows in column chunks: "F32 / F16 prefill panels" below).
 *
 * Decode (one token) runs the same tile with T = 1: four rows' dot
 * products are four independent FMA chains, which hides the FMA latency
 * that a single accumulator per row would expose.
 *
 * Determinism (invariant 9). One (row, token) value is always computed
 * the same way, whatever tile it sits in: one 16-lane accumulator, the
 * shared dimension in steps of 16 (F32/F16) or two blocks (Q8_0/Q4_0),
 * the tail through a masked (zeroed) load into the same accumulator, then
 * one _mm512_reduce_add_ps. The tile shape only changes which values are
 * computed side by side, never a value's own order of operations, so a
 * token's logits have the same bits alone or in a batch, with any number
 * of threads and any row split.
 *
 * Q4_0 is no longer tiled here: it runs in groups of 16 interleaved rows
 * (ops_kq_gemm.c, as the K-quants), which needs no reduction across
 * lanes; what follows about Q4_0 describes the lane arrangement that
 * Q8_0 shares.
 *
 * Quantized weights (Q8_0, Q4_0) against q8 activation blocks use AVX-512
 * VNNI: vpdpbusd multiplies unsigned bytes by signed bytes and sums each
 * group of four into an int32 lane, exactly. The weight is made unsigned
 * by an offset (Q4_0: the nibble q = w + 8 as it is stored; Q8_0: w + 128,
 * an xor with 0x80), and the offset's contribution, o * sum(x), is
 * subtracted by starting the accumulation at -o * sum(x), itself computed
 * once per token block with vpdpbusd of the constant o. So the int32 lanes
 * hold exact partial sums of w * x; lanes 0..7 belong to block b and lanes
 * 8..15 to block b + 1, and each is converted to float and scaled by
 * d_w * d_x of its block. The scalar reference converts the whole block's
 * sum instead, so the two agree within float rounding, not bit for bit.
 */
#include "gpu/cpu/ops_gemm.h"

#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#define OPS_AVX512                                                          \
	__attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512dq,"    \
			      "avx512vl,avx512vnni")))
#define OPS_TILE OPS_AVX512 static inline __attribute__((always_inline))

/* Prefetch distance for weight streams (bytes ahead), as in ops_cpu.c;
 * each row stream of a tile runs on into the next row of its quarter
 * (GEMM_DRIVE), so a fixed distance ahead is that stream's own data. */
#define GEMM_PF 2048

/* Tile: rows x tokens. */
#define GEMM_R 4
#define GEMM_T 4

/* ---- F32 / F16 ------------------------------------------------------- */

OPS_TILE __m512 ldw_f32(const void *w, uint32_t j)
{
	return _mm512_loadu_ps((const float *)w + j);
}

OPS_TILE __m512 ldw_f32_tail(const void *w, uint32_t j, __mmask16 m)
{
	return _mm512_maskz_loadu_ps(m, (const float *)w + j);
}

OPS_TILE __m512 ldw_f16(const void *w, uint32_t j)
{
	return _mm512_cvtph_ps(_mm256_loadu_si256(
		(const __m256i *)((const uint16_t *)w + j)));
}

OPS_TILE __m512 ldw_f16_tail(const void *w, uint32_t j, __mmask16 m)
{
	return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)w + j));
}

/* The tile's values live in named variables (a<r><t>, x<t>), not
 * arrays: GCC keeps arrays of zmm accumulators on the stack. R and T are
 * constants after inlining, so the guards below cost nothing. */
#define GEMM_EACH_T(M, ...) M(0, __VA_ARGS__) M(1, __VA_ARGS__)              \
	M(2, __VA_ARGS__) M(3, __VA_ARGS__)
#define GEMM_EACH_R(M, ...) M(0, __VA_ARGS__) M(1, __VA_ARGS__)              \
	M(2, __VA_ARGS__) M(3, __VA_ARGS__)
#define GEMM_ACC_ROW(r, INIT) __m512 a##r##0 = INIT, a##r##1 = INIT,         \
	a##r##2 = INIT, a##r##3 = INIT;
#define GEMM_STORE1(t, r)                                                    \
	if (T > t)                                                           \
		y[(size_t)t * ys + (size_t)r * yr] = _mm512_reduce_add_ps(a##r##t);
#define GEMM_STORE_ROW(r, _)                                                 \
	if (R > r) {                                                         \
		GEMM_EACH_T(GEMM_STORE1, r)                                  \
	}

/* F32/F16: one weight vector of row r against the tokens' x<t>. */
#define GEMM_F_FMA1(t, r)                                                    \
	if (T > t)                                                           \
		a##r##t = _mm512_fmadd_ps(wv, x##t, a##r##t);
#define GEMM_F_X(t, LOAD) __m512 x##t = T > t ? LOAD(t) : _mm512_setzero_ps();
#define GEMM_F_ROW(r, WLOAD, PF)                                             \
	if (R > r) {                                                         \
		const uint8_t *wr = w + (size_t)r * wb;                      \
		__m512 wv;                                                   \
                                                                             \
		PF;                                                          \
		wv = WLOAD;                                                  \
		GEMM_EACH_T(GEMM_F_FMA1, r)                                  \
	}

/* y[t * ys + r] = dot(w row r, x row t) for r < R, t < T: rows at
 * w + r * wb bytes, tokens at x + t * xs floats; ESZ bytes per weight. */
#define GEMM_TILE_F(NAME, LD, LDT, ESZ)                                        \
OPS_TILE void NAME(const uint8_t *w, size_t wb, const float *x, size_t xs,    \
		   uint32_t n, float *y, size_t ys, size_t yr, const int R,    \
		   const int T)                                                \
{                                                                              \
	GEMM_EACH_R(GEMM_ACC_ROW, _mm512_setzero_ps())                         \
	uint32_t j = 0;                                                        \
	const size_t pf = GEMM_PF;                                             \
                                                                               \
	for (; j + 16 <= n; j += 16) {                                         \
		GEMM_EACH_T(GEMM_F_X, GEMM_XLOAD)                              \
		GEMM_EACH_R(GEMM_F_ROW, LD(wr, j),                             \
			    if ((j * ESZ) % 64 == 0)                           \
				    _mm_prefetch((const char *)wr + j * ESZ + pf, \
						 _MM_HINT_T0))                 \
	}                                                                      \
	if (j < n) {                                                           \
		__mmask16 m = (__mmask16)((1u << (n - j)) - 1);                \
                                                                               \
		GEMM_EACH_T(GEMM_F_X, GEMM_XLOAD_TAIL)                         \
		GEMM_EACH_R(GEMM_F_ROW, LDT(wr, j, m), (void)0)                \
	}                                                                      \
	GEMM_EACH_R(GEMM_STORE_ROW, _)                                         \
}
#define GEMM_XLOAD(t) _mm512_loadu_ps(x + (size_t)t * xs + j)
#define GEMM_XLOAD_TAIL(t) _mm512_maskz_loadu_ps(m, x + (size_t)t * xs + j)

GEMM_TILE_F(tile_f32, ldw_f32, ldw_f32_tail, 4)
GEMM_TILE_F(tile_f16, ldw_f16, ldw_f16_tail, 2)

/* ---- F32 / F16 prefill panels ------------------------------------------ */

/* Prefill (n >= PF_MIN_TOKENS) for F32 and F16 weights. The rows go in
 * panels of PF_R adjacent rows; a panel meets every token, PF_T tokens
 * at a time, in a register tile of PF_R x PF_T accumulators (24 zmm: 24
 * FMAs per 10 loads, against 16 per 8 in the 4 x 4 GEMM_TILE_F; the
 * full tile's 24 reductions done four at a time, pf_reduce4). F16 rows
 * are converted to F32 once per panel into a small buffer that all
 * token groups then read from L1 (convert once, use many times), instead
 * of once per token group; F32 rows are copied there too. Wide rows (cols > PF_KC) go in column chunks of
 * at most PF_KC, so the panel's chunk and the tokens' chunks stay in L1;
 * between chunks each tile's 16-lane accumulators are parked in a
 * buffer (tokens PF_NB at a time), which keeps every lane's sum in the
 * same order. No prefetch in the tile loop (the panel is in L1 after its
 * first token group); the next panel is fetched a slice per tile
 * (gemm_prefetch_next).
 *
 * Same arithmetic per (row, token) as GEMM_TILE_F, hence as the dots:
 * one 16-lane accumulator over the columns in steps of 16 (chunk edges
 * are multiples of 16), the tail with x masked to zero and w zero, one
 * _mm512_reduce_add_ps. Bit-identical to decode and to any tiling. */
#ifndef PF_R
#define PF_R 6
#endif
_Static_assert(PF_R >= 2 && PF_R <= 6, "ptile_f32_shape's short panels");
#ifndef PF_T
#define PF_T 4
#endif
#ifndef PF_KC
#define PF_KC 1024
#endif
#define PF_NB 64 /* tokens per accumulator block when chunked */
/* Fewer tokens (decode, small decode batches) keep GEMM_DRIVE's 4 x 4
 * tiles over row quarters: with weights streaming from memory and few
 * token groups per panel, the panels' prefetch has too little time
 * (F16 at 2-8 tokens ran at half the rate; even at ~24). */
#define PF_MIN_TOKENS 32

#define PF_EACH_R(M, ...) M(0, __VA_ARGS__) M(1, __VA_ARGS__)                \
	M(2, __VA_ARGS__) M(3, __VA_ARGS__) M(4, __VA_ARGS__)                \
	M(5, __VA_ARGS__) M(6, __VA_ARGS__) M(7, __VA_ARGS__)
#define PF_ACC_ROW(r, _) __m512 a##r##0 = zero, a##r##1 = zero,             \
	a##r##2 = zero, a##r##3 = zero;
#define PF_ROW(r, LOAD)                                                      \
	if (R > r) {                                                         \
		__m512 wv = LOAD(r);                                         \
                                                                             \
		PF_IN_REG(wv);                                               \
		GEMM_EACH_T(GEMM_F_FMA1, r)                                  \
	}
/* An empty asm that takes v in a register: GCC would otherwise fold the
 * weight load into each of the T FMAs that use it (T loads of the same
 * vector per step, which makes the tile load-bound). */
#define PF_IN_REG(v) __asm__("" : "+v"(v))
#define PF_WLOAD(r) _mm512_loadu_ps(w + (size_t)r * ws + j)
#define PF_WLOAD_TAIL(r) _mm512_maskz_loadu_ps(m, w + (size_t)r * ws + j)
#define PF_ACC(r, t) (acc + ((r) * PF_T + (t)) * 16)
#define PF_PARK1(t, r) if (T > t) _mm512_store_ps(PF_ACC(r, t), a##r##t);
#define PF_PARK(r, _) if (R > r) { GEMM_EACH_T(PF_PARK1, r) }
#define PF_UNPARK1(t, r) if (T > t) a##r##t = _mm512_load_ps(PF_ACC(r, t));
#define PF_UNPARK(r, _) if (R > r) { GEMM_EACH_T(PF_UNPARK1, r) }

/* _mm512_reduce_add_ps of a, b, c and d, in lanes 0..3, with its
 * additions (GCC's: upper 256 + lower 256, upper 128 + lower 128, then
 * [0] + [2] and [1] + [3], then those two) done four at a time, so each
 * result has the same bits as the single reduction. */
OPS_TILE __m128 pf_reduce4(__m512 a, __m512 b, __m512 c, __m512 d)
{
	/* lanes 0..7: a's 8 pair sums, 8..15: b's (likewise c, d) */
	__m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0xee),
				  _mm512_shuffle_f32x4(a, b, 0x44));
	__m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0xee),
				  _mm512_shuffle_f32x4(c, d, 0x44));
	/* 128-bit lane k: the 4 quad sums of a, b, c, d in turn */
	__m512 v = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0xdd),
				 _mm512_shuffle_f32x4(ab, cd, 0x88));

	v = _mm512_add_ps(v, _mm512_permute_ps(v, 0x4e));   /* [0]+[2], [1]+[3] */
	v = _mm512_add_ps(v, _mm512_permute_ps(v, 0xb1));   /* + each other */
	return _mm512_castps512_ps128(_mm512_permutexvar_ps(
		_mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 8, 4, 0), v));
}

/* One column chunk [0, len) of rows w + r * ws against tokens x + t * xs
 * (both already at the chunk's first column), r < R, t < T. Accumulators
 * from acc when `resume`, else zero; at the end to y[t * ys + r] when
 * `last` (the matrix's last chunk, which holds the tail), else to acc. */
OPS_TILE void ptile_f32(const float *w, size_t ws, const float *x, size_t xs,
			uint32_t len, float *y, size_t ys, float *acc,
			bool resume, bool last, const int R, const int T)
{
	const __m512 zero = _mm512_setzero_ps();
	PF_EACH_R(PF_ACC_ROW, _)
	uint32_t j = 0;

	if (resume) {
		PF_EACH_R(PF_UNPARK, _)
	}
	for (; j + 16 <= len; j += 16) {
		GEMM_EACH_T(GEMM_F_X, GEMM_XLOAD)
		PF_EACH_R(PF_ROW, PF_WLOAD)
	}
	if (j < len) {
		__mmask16 m = (__mmask16)((1u << (len - j)) - 1);

		GEMM_EACH_T(GEMM_F_X, GEMM_XLOAD_TAIL)
		PF_EACH_R(PF_ROW, PF_WLOAD_TAIL)
	}
	if (last && R == 6 && T == 4) {
		/* rows 0..3 of each token: one 4-float store; rows 4, 5 of
		 * two tokens: two 2-float stores */
		_mm_storeu_ps(y, pf_reduce4(a00, a10, a20, a30));
		_mm_storeu_ps(y + ys, pf_reduce4(a01, a11, a21, a31));
		_mm_storeu_ps(y + 2 * ys, pf_reduce4(a02, a12, a22, a32));
		_mm_storeu_ps(y + 3 * ys, pf_reduce4(a03, a13, a23, a33));
		__m128 q = pf_reduce4(a40, a50, a41, a51);

		_mm_storel_pi((__m64 *)(void *)(y + 4), q);
		_mm_storeh_pi((__m64 *)(void *)(y + ys + 4), q);
		q = pf_reduce4(a42, a52, a43, a53);
		_mm_storel_pi((__m64 *)(void *)(y + 2 * ys + 4), q);
		_mm_storeh_pi((__m64 *)(void *)(y + 3 * ys + 4), q);
	} else if (last) {
		const size_t yr = 1;

		PF_EACH_R(GEMM_STORE_ROW, _)
	} else {
		PF_EACH_R(PF_PARK, _)
	}
}

#define PF_CALL(RR, TT) ptile_f32(w, ws, x, xs, len, y, ys, acc, resume, last, RR, TT)
#define PF_CALL1(TT) ptile_f32(w + (size_t)r * ws, 0, x, xs, len, y + r, ys, \
			       acc + r * PF_T * 16, resume, last, 1, TT)

/* ptile_f32 for R == PF_R; a short last panel (a thread's row range
 * need not be a multiple of PF_R) in one tile of its R rows for full
 * token groups (R x 4 accumulators still hide the FMA latency), else
 * row by row. */
OPS_AVX512 static void ptile_f32_shape(const float *w, size_t ws,
				       const float *x, size_t xs, uint32_t len,
				       float *y, size_t ys, float *acc,
				       bool resume, bool last, int R, int T)
{
	if (R == PF_R) {
		switch (T) {
		case 4: PF_CALL(PF_R, 4); break;
		case 3: PF_CALL(PF_R, 3); break;
		case 2: PF_CALL(PF_R, 2); break;
		default: PF_CALL(PF_R, 1); break;
		}
		return;
	}
	if (T == 4 && R >= 2) {
		switch (R) {
		case 5: PF_CALL(5, 4); break;
		case 4: PF_CALL(4, 4); break;
		case 3: PF_CALL(3, 4); break;
		default: PF_CALL(2, 4); break;
		}
		return;
	}
	for (int r = 0; r < R; r++)
		switch (T) {
		case 4: PF_CALL1(4); break;
		case 3: PF_CALL1(3); break;
		case 2: PF_CALL1(2); break;
		default: PF_CALL1(1); break;
		}
}

/* Columns [j0, j1) of F32 or F16 rows r0 .. r0 + R - 1 as F32 into out
 * (row stride ws floats); the last vector of a row zero beyond j1. F32
 * is copied too: the tile then reads one aligned, contiguous panel
 * (measured ~10% faster than reading the rows in place, whose stride
 * of a power of two KiB puts a step's loads in one L1 set). */
OPS_AVX512 static void pf_load(const uint8_t *data, size_t rb, bool f16,
			       uint32_t r0, int R, uint32_t j0, uint32_t j1,
			       float *out, size_t ws)
{
	uint32_t len = j1 - j0;
	__mmask16 m = (__mmask16)((1u << (len % 16)) - 1);

	for (int r = 0; r < R; r++) {
		const uint8_t *row = data + (size_t)(r0 + (uint32_t)r) * rb;
		float *dst = out + (size_t)r * ws;
		uint32_t j = 0;

		if (f16) {
			const uint16_t *src = (const uint16_t *)(const void *)row + j0;

			for (; j + 16 <= len; j += 16)
				_mm512_store_ps(dst + j, ldw_f16(src, j));
			if (j < len)
				_mm512_store_ps(dst + j, ldw_f16_tail(src, j, m));
		} else {
			const float *src = (const float *)(const void *)row + j0;

			for (; j + 16 <= len; j += 16)
				_mm512_store_ps(dst + j, ldw_f32(src, j));
			if (j < len)
				_mm512_store_ps(dst + j, ldw_f32_tail(src, j, m));
		}
	}
}

static void gemm_prefetch_next(const uint8_t *data, size_t rb, uint32_t nr,
			       uint32_t q, int count, uint32_t blk,
			       uint32_t n_blk);

/* F32/F16 rows [r0, r1) x n tokens (n >= PF_MIN_TOKENS): panel by
 * panel; within a panel, token blocks (all n when the rows fit one
 * chunk), column chunks, then token groups. */
OPS_AVX512 static void gemm_f_prefill(const struct ops_mat *w, const float *act,
				      size_t xs, uint32_t n, float *y,
				      size_t y_stride, uint32_t r0, uint32_t r1)
{
	bool f16 = w->type == GGML_TYPE_F16;
	uint32_t cols = w->cols, nck = (cols + PF_KC - 1) / PF_KC;
	uint32_t kc = ((cols + nck - 1) / nck + 15) & ~15u; /* <= PF_KC */
	uint32_t nb = nck > 1 ? PF_NB : n;
	uint32_t n_blk = ((n + PF_T - 1) / PF_T) * nck, blk;
	float buf[PF_R * PF_KC] __attribute__((aligned(64)));
	float acc[PF_NB / PF_T * PF_R * PF_T * 16] __attribute__((aligned(64)));

	for (uint32_t r = r0; r < r1; r += PF_R) {
		int R = r1 - r >= PF_R ? PF_R : (int)(r1 - r);
		/* rows of the next panel (0: none) */
		int next = r1 - r <= PF_R ? 0 : r1 - r - PF_R >= PF_R ?
			   PF_R : (int)(r1 - r - PF_R);

		blk = 0;
		for (uint32_t i0 = 0; i0 < n; i0 += nb) {
			uint32_t i1 = n - i0 > nb ? i0 + nb : n;

			for (uint32_t c = 0; c < nck; c++) {
				uint32_t j0 = c * kc, j1 = j0 + kc < cols ? j0 + kc : cols;

				pf_load(w->data, w->row_bytes, f16, r, R, j0, j1, buf, kc);
				for (uint32_t i = i0; i < i1; i += PF_T) {
					int T = i1 - i >= PF_T ? PF_T : (int)(i1 - i);
					/* this group's parked accumulators */
					float *ta = acc + (nck > 1 ? (size_t)((i - i0) / PF_T) *
								   PF_R * PF_T * 16 : 0);

					if (next)
						gemm_prefetch_next(w->data, w->row_bytes, r + PF_R,
								   1, next, blk++, n_blk);
					ptile_f32_shape(buf, kc, act + (size_t)i * xs + j0, xs,
							j1 - j0, y + (size_t)i * y_stride + r,
							y_stride, ta, c > 0, c + 1 == nck, R, T);
				}
			}
		}
	}
}

/* ---- Q8_0 / Q4_0 against q8 activation blocks ------------------------ */

/* Two activation blocks' quants (one when `two` is false: the upper
 * half zero). */
OPS_TILE __m512i ldx2(const struct ops_block_q8_act *x, bool two)
{
	__m256i lo = _mm256_loadu_si256((const __m256i *)x[0].qs);

	if (!two)
		return _mm512_inserti64x4(_mm512_setzero_si512(), lo, 0);
	return _mm512_inserti64x4(_mm512_castsi256_si512(lo),
				  _mm256_loadu_si256((const __m256i *)x[1].qs), 1);
}

/* Q8_0: w + 128 as unsigned bytes (offset 128), two blocks in the
 * alternating-lane arrangement of Q4_0 below (q4_interleave). */
OPS_TILE __m512i q4_interleave(__m512i v);

OPS_TILE __m512i ldw2_q8_0(const void *wp, uint32_t b, bool two)
{
	const struct ops_block_q8_0 *w = (const struct ops_block_q8_0 *)wp + b;
	__m256i lo = _mm256_loadu_si256((const __m256i *)w[0].qs);
	__m512i v;

	if (!two)
		v = _mm512_inserti64x4(_mm512_setzero_si512(), lo, 0);
	else
		v = _mm512_inserti64x4(_mm512_castsi256_si512(lo),
				       _mm256_loadu_si256((const __m256i *)w[1].qs), 1);
	return q4_interleave(_mm512_xor_si512(v, _mm512_set1_epi8((char)0x80)));
}

/* Q4_0 lane arrangement. int32 lane L holds elements 4 (L / 2) .. +3 of
 * block b + L % 2: the blocks alternate lane by lane, so that both scale
 * vectors are one broadcast of a pair (no per-half inserts) and the
 * repacked layout below expands with one shift. The activation pair is
 * permuted the same way (x_perm). */
OPS_TILE __m512i q4_interleave(__m512i v)
{
	/* from [blk b: dwords 0..7 | blk b+1: 8..15] to alternating */
	const __m512i idx = _mm512_set_epi32(15, 7, 14, 6, 13, 5, 12, 4,
					     11, 3, 10, 2, 9, 1, 8, 0);

	return _mm512_permutexvar_epi32(idx, v);
}

/* lanes alternate a, b, a, b, ... */
OPS_TILE __m512 alt_ps(float a, float b)
{
	uint32_t ua, ub;

	memcpy(&ua, &a, 4);
	memcpy(&ub, &b, 4);
	return _mm512_castsi512_ps(_mm512_set1_epi64((long long)(((uint64_t)ub << 32) | ua)));
}

OPS_TILE __m512 wd2_q8_0(const void *wp, uint32_t b, bool two)
{
	const struct ops_block_q8_0 *w = (const struct ops_block_q8_0 *)wp + b;

	return alt_ps(_cvtsh_ss(w[0].d), two ? _cvtsh_ss(w[1].d) : 0.0f);
}


/* Q8_0/Q4_0: token t's quants xq<t>, offset start xo<t>, scales xd<t>. */
#define GEMM_Q_X(t, XPERM, XPAIR)                                            \
	__m512i xq##t = _mm512_setzero_si512(), xo##t = xq##t;               \
	__m512 xd##t = _mm512_setzero_ps();                                  \
	if (T > t) {                                                         \
		const struct ops_block_q8_act *xb = x + (size_t)t * xs + b;  \
                                                                             \
		xq##t = XPERM(ldx2(xb, two));                                \
		xo##t = _mm512_sub_epi32(_mm512_setzero_si512(),             \
			_mm512_dpbusd_epi32(_mm512_setzero_si512(), off, xq##t)); \
		xd##t = XPAIR(xb[0].d, two ? xb[1].d : 0.0f);                \
	}
#define GEMM_Q_FMA1(t, r)                                                    \
	if (T > t)                                                           \
		a##r##t = _mm512_fmadd_ps(                                   \
			_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(xo##t, wq, xq##t)), \
			_mm512_mul_ps(wd, xd##t), a##r##t);
#define GEMM_Q_ROW(r, LDW, WD, BSZ)                                          \
	if (R > r) {                                                         \
		const uint8_t *wr = w + (size_t)r * wb;                      \
		__m512i wq;                                                  \
		__m512 wd;                                                   \
                                                                             \
		if ((b * BSZ) % 64 < 2 * BSZ)                                \
			_mm_prefetch((const char *)wr + b * BSZ + pf,        \
				     _MM_HINT_T0);                           \
		wq = LDW(wr, b, two);                                        \
		wd = WD(wr, b, two);                                         \
		GEMM_EACH_T(GEMM_Q_FMA1, r)                                  \
	}

/* Repacked Q8_0 (ops_gemm__pack): per pair of blocks the 64 lane bytes
 * (w + 128, interleaved), then the two half scales: 68 bytes, the size
 * of the file's two blocks. One load. */
#define Q8P_PAIR 68

OPS_TILE __m512i ldw2_q8p(const void *wp, uint32_t b, bool two)
{
	(void)two;
	return _mm512_loadu_si512((const uint8_t *)wp + (size_t)(b / 2) * Q8P_PAIR);
}

OPS_TILE __m512 wd2_q8p(const void *wp, uint32_t b, bool two)
{
	const uint8_t *p = (const uint8_t *)wp + (size_t)(b / 2) * Q8P_PAIR + 64;
	int32_t d2;

	(void)two;
	memcpy(&d2, p, 4);
	return _mm512_cvtph_ps(_mm256_set1_epi32(d2));
}

/* Same contract as GEMM_TILE_F; x rows at x + t * xs act blocks; BSZ the
 * weight block's bytes, OFF the unsigned offset of its quants. When the
 * block count is odd the last step holds one block and zeros (scale 0). */
#define GEMM_TILE_Q(NAME, LDW, WD, BSZ, OFF, XPERM, XPAIR)                     \
OPS_TILE void NAME(const uint8_t *w, size_t wb,                               \
		   const struct ops_block_q8_act *x, size_t xs, uint32_t n,    \
		   float *y, size_t ys, size_t yr, const int R, const int T)   \
{                                                                              \
	GEMM_EACH_R(GEMM_ACC_ROW, _mm512_setzero_ps())                         \
	uint32_t nb = n / OPS_QK;                                              \
	const size_t pf = GEMM_PF;                                             \
	const __m512i off = _mm512_set1_epi8((char)(OFF));                     \
                                                                               \
	for (uint32_t b = 0; b < nb; b += 2) {                                 \
		bool two = b + 1 < nb;                                         \
                                                                               \
		GEMM_EACH_T(GEMM_Q_X, XPERM, XPAIR)                            \
		GEMM_EACH_R(GEMM_Q_ROW, LDW, WD, BSZ)                          \
	}                                                                      \
	GEMM_EACH_R(GEMM_STORE_ROW, _)                                         \
}

GEMM_TILE_Q(tile_q8_0, ldw2_q8_0, wd2_q8_0, 34, 0x80, q4_interleave, alt_ps)
GEMM_TILE_Q(tile_q8p, ldw2_q8p, wd2_q8p, 34, 0x80, q4_interleave, alt_ps)

/* ---- instantiations ---------------------------------------------------- */

/* One function per tile shape (R in {1, 4}, T in 1..4), so every loop
 * above unrolls and the accumulators live in registers. */
#define GEMM_SHAPES(TILE, XT)                                                  \
OPS_AVX512 static void TILE##_shape(const uint8_t *w, size_t wb, const XT *x, \
				    size_t xs, uint32_t n, float *y,           \
				    size_t ys, size_t yr, int R, int T)        \
{                                                                              \
	switch (R * 8 + T) {                                                   \
	case 4 * 8 + 4: TILE(w, wb, x, xs, n, y, ys, yr, 4, 4); break;             \
	case 4 * 8 + 3: TILE(w, wb, x, xs, n, y, ys, yr, 4, 3); break;             \
	case 4 * 8 + 2: TILE(w, wb, x, xs, n, y, ys, yr, 4, 2); break;             \
	case 4 * 8 + 1: TILE(w, wb, x, xs, n, y, ys, yr, 4, 1); break;             \
	case 1 * 8 + 4: TILE(w, wb, x, xs, n, y, ys, yr, 1, 4); break;             \
	case 1 * 8 + 3: TILE(w, wb, x, xs, n, y, ys, yr, 1, 3); break;             \
	case 1 * 8 + 2: TILE(w, wb, x, xs, n, y, ys, yr, 1, 2); break;             \
	default: TILE(w, wb, x, xs, n, y, ys, yr, 1, 1); break;                    \
	}                                                                      \
}

GEMM_SHAPES(tile_f32, float)
GEMM_SHAPES(tile_f16, float)
GEMM_SHAPES(tile_q8_0, struct ops_block_q8_act)
GEMM_SHAPES(tile_q8p, struct ops_block_q8_act)

float ops_gemm__dot_f32(const float *w, const float *x, uint32_t n)
{
	float y;

	tile_f32_shape((const uint8_t *)w, 0, x, 0, n, &y, 1, 1, 1, 1);
	return y;
}

float ops_gemm__dot_f16(const uint16_t *w, const float *x, uint32_t n)
{
	float y;

	tile_f16_shape((const uint8_t *)w, 0, x, 0, n, &y, 1, 1, 1, 1);
	return y;
}

float ops_gemm__dot_q8_0(const struct ops_block_q8_0 *w,
			 const struct ops_block_q8_act *x, uint32_t n)
{
	float y;

	tile_q8_0_shape((const uint8_t *)w, 0, x, 0, n, &y, 1, 1, 1, 1);
	return y;
}

void ops_gemm__dot3_f32(const float *w, const float *x, size_t xs,
			uint32_t n, float *out)
{
	tile_f32_shape((const uint8_t *)w, 0, x, xs, n, out, 1, 1, 1, 3);
}

void ops_gemm__dot3_f16(const uint16_t *w, const float *x, size_t xs,
			uint32_t n, float *out)
{
	tile_f16_shape((const uint8_t *)w, 0, x, xs, n, out, 1, 1, 1, 3);
}

void ops_gemm__dot3_q8_0(const struct ops_block_q8_0 *w,
			 const struct ops_block_q8_act *x, size_t xs,
			 uint32_t n, float *out)
{
	tile_q8_0_shape((const uint8_t *)w, 0, x, xs, n, out, 1, 1, 1, 3);
}

/* Prefill: while a row tile works through its token blocks (in L1), the
 * next tile's rows (row nr of each quarter, q apart) are fetched from
 * memory a slice per token block, so the next tile finds them in cache
 * and the weight stream overlaps the arithmetic. */
/* Slice blk of n_blk of the next tile's `count` rows (nr, nr + q, ...). */
static void gemm_prefetch_next(const uint8_t *data, size_t rb, uint32_t nr,
			       uint32_t q, int count, uint32_t blk,
			       uint32_t n_blk)
{
	size_t sl = ((rb + n_blk - 1) / n_blk + 63) & ~(size_t)63;
	size_t lo = (size_t)blk * sl, hi = lo + sl < rb ? lo + sl : rb;

	for (int m = 0; m < count; m++) {
		const uint8_t *row = data + (size_t)(nr + (uint32_t)m * q) * rb;

		for (size_t o = lo; o < hi; o += 64)
			__builtin_prefetch(row + o, 0, 3);
	}
}

/* Rows [r0, r1): a tile takes one row from each quarter of the range
 * (rows r0 + k + m q, m < 4, q = (r1 - r0) / 4), so that each of its four
 * row streams runs on through consecutive rows, tile after tile - one
 * long sequential stream per quarter, which the hardware prefetchers
 * follow and the software prefetch runs ahead in (adjacent rows would
 * start four short streams at every tile). The last (r1 - r0) % 4 rows
 * go alone. For each row tile, all n tokens four at a time. */
#define GEMM_DRIVE(SHAPE, XT, XSTRIDE, DATA, RB)                               \
	do {                                                                   \
		uint32_t q = (r1 - r0) / GEMM_R;                               \
                                                                               \
		for (uint32_t r = r0; r < r1;) {                               \
			bool tile = r < r0 + q;                                \
			const uint8_t *wr = (const uint8_t *)(DATA) +          \
					    (size_t)r * (RB);                  \
                                                                               \
			for (uint32_t i = 0; i < n; i += GEMM_T) {             \
				int T = n - i >= GEMM_T ? GEMM_T : (int)(n - i); \
				const XT *xi = (const XT *)(const void *)      \
					((const uint8_t *)act + (size_t)i * act_stride); \
                                                                               \
				if (tile && n > GEMM_T && r + 1 < r0 + q)      \
					gemm_prefetch_next((const uint8_t *)(DATA), (RB), \
							   r + 1, q, GEMM_R, i / GEMM_T, \
							   (n + GEMM_T - 1) / GEMM_T); \
				SHAPE(wr, tile ? (size_t)q * (RB) : (RB), xi,  \
				      XSTRIDE, w->cols,                        \
				      y + (size_t)i * y_stride + r, y_stride,  \
				      tile ? q : 1, tile ? GEMM_R : 1, T);     \
			}                                                      \
			r = r + 1 == r0 + q ? r0 + q * GEMM_R : r + 1;         \
		}                                                              \
	} while (0)

bool ops_gemm__matmul(const struct ops_mat *w, const void *act,
		      size_t act_stride, uint32_t n, float *y, size_t y_stride,
		      uint32_t r0, uint32_t r1)
{
	size_t fs = act_stride / sizeof(float);
	size_t qs = act_stride / sizeof(struct ops_block_q8_act);

	if ((w->type == GGML_TYPE_F32 || w->type == GGML_TYPE_F16) &&
	    n >= PF_MIN_TOKENS && w->cols > 0) {
		gemm_f_prefill(w, act, fs, n, y, y_stride, r0, r1);
		return true;
	}
	switch (w->type) {
	case GGML_TYPE_F32:
		GEMM_DRIVE(tile_f32_shape, float, fs, w->data, w->row_bytes);
		return true;
	case GGML_TYPE_F16:
		GEMM_DRIVE(tile_f16_shape, float, fs, w->data, w->row_bytes);
		return true;
	case GGML_TYPE_Q8_0:
		if (w->packed)
			GEMM_DRIVE(tile_q8p_shape, struct ops_block_q8_act, qs,
				   w->packed, ops_gemm__packed_row_bytes(w->type, w->cols));
		else
			GEMM_DRIVE(tile_q8_0_shape, struct ops_block_q8_act, qs,
				   w->data, w->row_bytes);
		return true;
	case GGML_TYPE_Q4_0: /* sixteen rows per tile (ops_kq_gemm.c) */
		ops_kqg__matmul_q4_0(w, act, act_stride, n, y, y_stride, r0, r1);
		return true;
	default:
		return ops_kqg__matmul(w, act, act_stride, n, y, y_stride, r0, r1);
	}
}

/* ---- attention's V sum ------------------------------------------------- */

OPS_TILE __m512 ldx_kv(const uint8_t *p, uint32_t j, bool f16)
{
	return f16 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + j)))
		   : _mm512_loadu_ps((const float *)p + j);
}

/* y[j] = fma(a[t], x_t[j], y[j]) for t in order: axpy_f32/f16's
 * arithmetic per element, with 64 (or 16) values of y in registers over
 * all rows. */
OPS_AVX512 void ops_gemm__axpy_rows(float *y, const float *a, const void *x,
				    size_t x_stride, uint32_t count, uint32_t n,
				    bool f16)
{
	const uint8_t *xb = x;
	uint32_t j = 0;

	for (; j + 64 <= n; j += 64) {
		__m512 y0 = _mm512_loadu_ps(y + j), y1 = _mm512_loadu_ps(y + j + 16);
		__m512 y2 = _mm512_loadu_ps(y + j + 32), y3 = _mm512_loadu_ps(y + j + 48);

		for (uint32_t t = 0; t < count; t++) {
			const uint8_t *xt = xb + (size_t)t * x_stride;
			__m512 va = _mm512_set1_ps(a[t]);

			y0 = _mm512_fmadd_ps(va, ldx_kv(xt, j, f16), y0);
			y1 = _mm512_fmadd_ps(va, ldx_kv(xt, j + 16, f16), y1);
			y2 = _mm512_fmadd_ps(va, ldx_kv(xt, j + 32, f16), y2);
			y3 = _mm512_fmadd_ps(va, ldx_kv(xt, j + 48, f16), y3);
		}
		_mm512_storeu_ps(y + j, y0);
		_mm512_storeu_ps(y + j + 16, y1);
		_mm512_storeu_ps(y + j + 32, y2);
		_mm512_storeu_ps(y + j + 48, y3);
	}
	for (; j + 16 <= n; j += 16) {
		__m512 y0 = _mm512_loadu_ps(y + j);

		for (uint32_t t = 0; t < count; t++)
			y0 = _mm512_fmadd_ps(_mm512_set1_ps(a[t]),
					     ldx_kv(xb + (size_t)t * x_stride, j, f16), y0);
		_mm512_storeu_ps(y + j, y0);
	}
}

/* ---- Q8_0 repacking ------------------------------------------------------ */

size_t ops_gemm__packed_row_bytes(enum ggml_type t, uint32_t cols)
{
	size_t pairs = (size_t)(cols / OPS_QK + 1) / 2;

	if (t == GGML_TYPE_Q8_0)
		return pairs * Q8P_PAIR;
	return 0;
}

/* Each block pair through the kernel's own file-layout loader (which
 * already offsets and interleaves), stored as the 64 lane bytes, then the
 * two half scales (0 for an absent block). */
OPS_AVX512 void ops_gemm__pack(const struct ops_mat *w, void *out)
{
	uint32_t nb = w->cols / OPS_QK;
	size_t prb = ops_gemm__packed_row_bytes(w->type, w->cols);
	size_t bsz = sizeof(struct ops_block_q8_0);

	for (uint32_t r = 0; r < w->rows; r++) {
		const uint8_t *src = (const uint8_t *)w->data + (size_t)r * w->row_bytes;
		uint8_t *dst = (uint8_t *)out + (size_t)r * prb;

		for (uint32_t b = 0; b < nb; b += 2) {
			uint8_t *p = dst + (size_t)(b / 2) * Q8P_PAIR;
			bool two = b + 1 < nb;
			uint16_t d[2] = { 0, 0 };

			memcpy(&d[0], src + b * bsz, 2);
			if (two)
				memcpy(&d[1], src + (b + 1) * bsz, 2);
			_mm512_storeu_si512(p, ldw2_q8_0(src, b, two));
			memcpy(p + 64, d, 4);
		}
	}
}

/* ---- activation quantization ------------------------------------------- */

/* Per block: amax over |x| (max is exact, so the order does not matter),
 * d = amax / 127, id = 1 / d, q = round half away from zero of x * id,
 * done as truncation plus one where the dropped fraction is >= 0.5 -
 * exactly roundf, without the libm call. */
OPS_AVX512 void ops_gemm__quantize_q8_act(const float *x, uint32_t cols,
					  struct ops_block_q8_act *out)
{
	const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
	const __m512 half = _mm512_set1_ps(0.5f);

	for (uint32_t b = 0; b < cols / OPS_QK; b++) {
		const float *xb = x + (size_t)b * OPS_QK;
		__m512 v0 = _mm512_loadu_ps(xb), v1 = _mm512_loadu_ps(xb + 16);
		__m512 a = _mm512_max_ps(_mm512_and_ps(v0, absmask),
					 _mm512_and_ps(v1, absmask));
		float amax = _mm512_reduce_max_ps(a);
		float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
		__m512 vid = _mm512_set1_ps(id);
		__m512i q[2];

		out[b].d = d;
		for (int h = 0; h < 2; h++) {
			__m512 v = _mm512_mul_ps(h ? v1 : v0, vid);
			__m512 t = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
			__m512 f = _mm512_and_ps(_mm512_sub_ps(v, t), absmask);
			__mmask16 up = _mm512_cmp_ps_mask(f, half, _CMP_GE_OQ);
			__m512i ti = _mm512_cvttps_epi32(t);
			/* +1 or -1 with the sign of v */
			__m512i s = _mm512_or_si512(_mm512_srai_epi32(_mm512_castps_si512(v), 31),
						    _mm512_set1_epi32(1));

			q[h] = _mm512_mask_add_epi32(ti, up, ti, s);
		}
		_mm_storeu_si128((__m128i *)out[b].qs, _mm512_cvtepi32_epi8(q[0]));
		_mm_storeu_si128((__m128i *)(out[b].qs + 16), _mm512_cvtepi32_epi8(q[1]));
	}
}

#endif
