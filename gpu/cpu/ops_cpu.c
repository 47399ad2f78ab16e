/* ops_cpu.c - CPU kernels.
 *
 * The kernel tables live here: a scalar one written for clarity and a
 * reference, and an AVX2+FMA+F16C one compiled with per-function target
 * attributes, so the file builds for baseline x86-64 and the SIMD code is
 * entered only after __builtin_cpu_supports() said yes. The "avx512"
 * table swaps in AVX-512 K-quant dots (ops_kq.c), the "avx512vnni" table
 * the register-tile matmuls and their dots (ops_gemm.c). No global state:
 * the tables are const and the choice is the caller's (ops_kernels_pick).
 *
 * Determinism. Every dot product keeps a fixed accumulation order that
 * depends only on n (lanes, unroll, tail), never on where the data lies or
 * who calls; reductions in softmax and RMSNorm run in index order in
 * double. Callers parallelise by output rows, so a value is computed the
 * same way whatever the thread count or batch composition.
 *
 * Quantized weights. Q8_0 and Q4_0 rows are dotted against activations
 * quantized once per row to q8 blocks (scale in float): per block the
 * products are summed exactly in integers, then scaled by d_w * d_x and
 * accumulated in float. The AVX2 path uses the sign trick so that
 * maddubs (unsigned x signed) can multiply two signed vectors: |w| times
 * x * sign(w).
 *
 * Elementwise ops (RMSNorm, RoPE, softmax, SwiGLU) follow the order of
 * operations of the usual GGUF reference implementation (float products
 * summed in double for the norm; rotation tables built by repeated
 * multiplication of theta) so greedy decoding matches it token for token.
 */
#include "gpu/cpu/ops_cpu.h"
#include "gpu/cpu/ops_gemm.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define OPS_HAVE_X86 1
#else
#define OPS_HAVE_X86 0
#endif


/* ---- scalar table -------------------------------------------------------- */

static float dot_f32_scalar(const float *w, const float *x, uint32_t n)
{
	float s = 0.0f;

	for (uint32_t j = 0; j < n; j++)
		s += w[j] * x[j];
	return s;
}

static float dot_f16_scalar(const uint16_t *w, const float *x, uint32_t n)
{
	float s = 0.0f;

	for (uint32_t j = 0; j < n; j++)
		s += ops_f16_to_f32(w[j]) * x[j];
	return s;
}

static void dot3_f32_scalar(const float *w, const float *x, size_t xs,
			     uint32_t n, float *out)
{
	for (int t = 0; t < 3; t++)
		out[t] = dot_f32_scalar(w, x + (size_t)t * xs, n);
}

static void dot3_f16_scalar(const uint16_t *w, const float *x, size_t xs,
			     uint32_t n, float *out)
{
	for (int t = 0; t < 3; t++)
		out[t] = dot_f16_scalar(w, x + (size_t)t * xs, n);
}

static float dot_q8_0_scalar(const struct ops_block_q8_0 *w,
			     const struct ops_block_q8_act *x, uint32_t n);
static float dot_q4_0_scalar(const struct ops_block_q4_0 *w,
			     const struct ops_block_q8_act *x, uint32_t n);

static void dot3_q8_0_scalar(const struct ops_block_q8_0 *w,
			     const struct ops_block_q8_act *x, size_t xs,
			     uint32_t n, float *out)
{
	for (int t = 0; t < 3; t++)
		out[t] = dot_q8_0_scalar(w, x + (size_t)t * xs, n);
}

static void dot3_q4_0_scalar(const struct ops_block_q4_0 *w,
			     const struct ops_block_q8_act *x, size_t xs,
			     uint32_t n, float *out)
{
	for (int t = 0; t < 3; t++)
		out[t] = dot_q4_0_scalar(w, x + (size_t)t * xs, n);
}

static float dot_q8_0_scalar(const struct ops_block_q8_0 *w,
			     const struct ops_block_q8_act *x, uint32_t n)
{
	float s = 0.0f;

	for (uint32_t b = 0; b < n / OPS_QK; b++) {
		int32_t acc = 0;

		for (int j = 0; j < OPS_QK; j++)
			acc += (int32_t)w[b].qs[j] * x[b].qs[j];
		s += (float)acc * (ops_f16_to_f32(w[b].d) * x[b].d);
	}
	return s;
}

static float dot_q4_0_scalar(const struct ops_block_q4_0 *w,
			     const struct ops_block_q8_act *x, uint32_t n)
{
	float s = 0.0f;

	for (uint32_t b = 0; b < n / OPS_QK; b++) {
		int32_t acc = 0;

		for (int j = 0; j < OPS_QK / 2; j++) {
			acc += ((int32_t)(w[b].qs[j] & 0xf) - 8) * x[b].qs[j];
			acc += ((int32_t)(w[b].qs[j] >> 4) - 8) *
			       x[b].qs[j + OPS_QK / 2];
		}
		s += (float)acc * (ops_f16_to_f32(w[b].d) * x[b].d);
	}
	return s;
}

static void axpy_f32_scalar(float *y, float a, const float *x, uint32_t n)
{
	for (uint32_t j = 0; j < n; j++)
		y[j] += a * x[j];
}

static void axpy_f16_scalar(float *y, float a, const uint16_t *x, uint32_t n)
{
	for (uint32_t j = 0; j < n; j++)
		y[j] += a * ops_f16_to_f32(x[j]);
}

static void f32_to_f16_scalar(uint16_t *dst, const float *src, uint32_t n)
{
	for (uint32_t j = 0; j < n; j++)
		dst[j] = ops_f32_to_f16(src[j]);
}

static const struct ops_kernels kernels_scalar = {
	.name = "scalar",
	.dot_f32 = dot_f32_scalar,
	.dot_f16 = dot_f16_scalar,
	.dot3_f32 = dot3_f32_scalar,
	.dot3_f16 = dot3_f16_scalar,
	.dot3_q8_0 = dot3_q8_0_scalar,
	.dot3_q4_0 = dot3_q4_0_scalar,
	.dot_q8_0 = dot_q8_0_scalar,
	.dot_q4_0 = dot_q4_0_scalar,
	.dot_kq = ops_kq_dot_scalar,
	.axpy_f32 = axpy_f32_scalar,
	.axpy_f16 = axpy_f16_scalar,
	.f32_to_f16 = f32_to_f16_scalar,
};

const struct ops_kernels *ops_kernels_scalar(void)
{
	return &kernels_scalar;
}

/* ---- AVX2 + FMA + F16C table --------------------------------------------- */

#if OPS_HAVE_X86
#define OPS_AVX2 __attribute__((target("avx2,fma,f16c")))

/* Software prefetch distance for weight streams (bytes ahead). Decode
 * reads every weight once per token from memory; the hardware prefetcher
 * alone left a single thread latency-bound at about half the bandwidth.
 * Prefetches never fault, so running past a row's end is harmless. */
#define OPS_PF_DIST 2048

OPS_AVX2 static inline float hsum256(__m256 v)
{
	__m128 lo = _mm256_castps256_ps128(v);
	__m128 hi = _mm256_extractf128_ps(v, 1);
	__m128 s, sh;

	lo = _mm_add_ps(lo, hi);
	sh = _mm_movehdup_ps(lo);
	s = _mm_add_ps(lo, sh);
	sh = _mm_movehl_ps(sh, s);
	s = _mm_add_ss(s, sh);
	return _mm_cvtss_f32(s);
}

/* Four 8-lane accumulators over 32-element steps, then 8-element steps
 * into the first, then a scalar tail: the order depends on n only. */
OPS_AVX2 static float dot_f32_avx2(const float *w, const float *x, uint32_t n)
{
	__m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
	__m256 a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
	uint32_t j = 0;
	float s;

	for (; j + 32 <= n; j += 32) {
		_mm_prefetch((const char *)(w + j) + OPS_PF_DIST, _MM_HINT_T0);
		_mm_prefetch((const char *)(w + j) + OPS_PF_DIST + 64, _MM_HINT_T0);
		a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + j), _mm256_loadu_ps(x + j), a0);
		a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + j + 8), _mm256_loadu_ps(x + j + 8), a1);
		a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w + j + 16), _mm256_loadu_ps(x + j + 16), a2);
		a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w + j + 24), _mm256_loadu_ps(x + j + 24), a3);
	}
	for (; j + 8 <= n; j += 8)
		a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + j), _mm256_loadu_ps(x + j), a0);
	a0 = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
	s = hsum256(a0);
	for (; j < n; j++)
		s = fmaf(w[j], x[j], s);
	return s;
}

OPS_AVX2 static inline __m256 load_f16x8(const uint16_t *p)
{
	return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

OPS_AVX2 static float dot_f16_avx2(const uint16_t *w, const float *x, uint32_t n)
{
	__m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
	__m256 a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
	uint32_t j = 0;
	float s;

	for (; j + 32 <= n; j += 32) {
		_mm_prefetch((const char *)(w + j) + OPS_PF_DIST, _MM_HINT_T0);
		a0 = _mm256_fmadd_ps(load_f16x8(w + j), _mm256_loadu_ps(x + j), a0);
		a1 = _mm256_fmadd_ps(load_f16x8(w + j + 8), _mm256_loadu_ps(x + j + 8), a1);
		a2 = _mm256_fmadd_ps(load_f16x8(w + j + 16), _mm256_loadu_ps(x + j + 16), a2);
		a3 = _mm256_fmadd_ps(load_f16x8(w + j + 24), _mm256_loadu_ps(x + j + 24), a3);
	}
	for (; j + 8 <= n; j += 8)
		a0 = _mm256_fmadd_ps(load_f16x8(w + j), _mm256_loadu_ps(x + j), a0);
	a0 = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
	s = hsum256(a0);
	for (; j < n; j++)
		s = fmaf(_cvtsh_ss(w[j]), x[j], s);
	return s;
}

/* Three activation rows against one weight row, for prefill: each weight
 * vector is loaded (and for F16 converted) once and used three times.
 * Per (w, x) pair the arithmetic is exactly that of the single-row kernel
 * above - four accumulators over 32-element steps, 8-element steps into
 * the first, the same combine, the same fused scalar tail - so a token's
 * result is bit-identical whether its row was computed alone or in a
 * triple (the batch-invariance the engine promises). */
#define OPS_DOT3(NAME, WT, LOADW, WSCALAR)                                      \
OPS_AVX2 static void NAME(const WT *w, const float *x, size_t xs, uint32_t n,  \
			  float *out)                                           \
{                                                                               \
	const float *x0 = x, *x1 = x + xs, *x2 = x + 2 * xs;                    \
	__m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a03 = a00;     \
	__m256 a10 = a00, a11 = a00, a12 = a00, a13 = a00;                      \
	__m256 a20 = a00, a21 = a00, a22 = a00, a23 = a00;                      \
	uint32_t j = 0;                                                         \
	float s0, s1, s2;                                                       \
	__m256 wv;                                                              \
                                                                                \
	for (; j + 32 <= n; j += 32) {                                          \
		_mm_prefetch((const char *)(w + j) + OPS_PF_DIST, _MM_HINT_T0); \
		wv = LOADW(w + j);                                              \
		a00 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x0 + j), a00);        \
		a10 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x1 + j), a10);        \
		a20 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x2 + j), a20);        \
		wv = LOADW(w + j + 8);                                          \
		a01 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x0 + j + 8), a01);    \
		a11 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x1 + j + 8), a11);    \
		a21 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x2 + j + 8), a21);    \
		wv = LOADW(w + j + 16);                                         \
		a02 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x0 + j + 16), a02);   \
		a12 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x1 + j + 16), a12);   \
		a22 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x2 + j + 16), a22);   \
		wv = LOADW(w + j + 24);                                         \
		a03 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x0 + j + 24), a03);   \
		a13 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x1 + j + 24), a13);   \
		a23 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x2 + j + 24), a23);   \
	}                                                                       \
	for (; j + 8 <= n; j += 8) {                                            \
		wv = LOADW(w + j);                                              \
		a00 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x0 + j), a00);        \
		a10 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x1 + j), a10);        \
		a20 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x2 + j), a20);        \
	}                                                                       \
	s0 = hsum256(_mm256_add_ps(_mm256_add_ps(a00, a01), _mm256_add_ps(a02, a03))); \
	s1 = hsum256(_mm256_add_ps(_mm256_add_ps(a10, a11), _mm256_add_ps(a12, a13))); \
	s2 = hsum256(_mm256_add_ps(_mm256_add_ps(a20, a21), _mm256_add_ps(a22, a23))); \
	for (; j < n; j++) {                                                    \
		float wj = WSCALAR(w[j]);                                       \
                                                                                \
		s0 = fmaf(wj, x0[j], s0);                                       \
		s1 = fmaf(wj, x1[j], s1);                                       \
		s2 = fmaf(wj, x2[j], s2);                                       \
	}                                                                       \
	out[0] = s0;                                                            \
	out[1] = s1;                                                            \
	out[2] = s2;                                                            \
}

#define OPS_ID(v) (v)
OPS_DOT3(dot3_f32_avx2, float, _mm256_loadu_ps, OPS_ID)
OPS_DOT3(dot3_f16_avx2, uint16_t, load_f16x8, _cvtsh_ss)

/* 32 signed bytes w and x -> 8 int32 partial sums of w*x. */
OPS_AVX2 static inline __m256i dot_i8x32(__m256i w, __m256i x)
{
	__m256i aw = _mm256_sign_epi8(w, w);
	__m256i sx = _mm256_sign_epi8(x, w);
	__m256i p16 = _mm256_maddubs_epi16(aw, sx);

	return _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
}

/* Two blocks per iteration into two accumulators (hides FMA latency);
 * an odd last block goes into the first. */
OPS_AVX2 static float dot_q8_0_avx2(const struct ops_block_q8_0 *w,
				    const struct ops_block_q8_act *x, uint32_t n)
{
	__m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
	uint32_t nb = n / OPS_QK, b = 0;

	for (; b + 2 <= nb; b += 2) {
		_mm_prefetch((const char *)(w + b) + OPS_PF_DIST, _MM_HINT_T0);
		__m256i p0 = dot_i8x32(_mm256_loadu_si256((const __m256i *)w[b].qs),
				       _mm256_loadu_si256((const __m256i *)x[b].qs));
		__m256i p1 = dot_i8x32(_mm256_loadu_si256((const __m256i *)w[b + 1].qs),
				       _mm256_loadu_si256((const __m256i *)x[b + 1].qs));
		__m256 d0 = _mm256_set1_ps(_cvtsh_ss(w[b].d) * x[b].d);
		__m256 d1 = _mm256_set1_ps(_cvtsh_ss(w[b + 1].d) * x[b + 1].d);

		a0 = _mm256_fmadd_ps(d0, _mm256_cvtepi32_ps(p0), a0);
		a1 = _mm256_fmadd_ps(d1, _mm256_cvtepi32_ps(p1), a1);
	}
	if (b < nb) {
		__m256i p0 = dot_i8x32(_mm256_loadu_si256((const __m256i *)w[b].qs),
				       _mm256_loadu_si256((const __m256i *)x[b].qs));
		__m256 d0 = _mm256_set1_ps(_cvtsh_ss(w[b].d) * x[b].d);

		a0 = _mm256_fmadd_ps(d0, _mm256_cvtepi32_ps(p0), a0);
	}
	return hsum256(_mm256_add_ps(a0, a1));
}

OPS_AVX2 static inline __m256i unpack_q4(const uint8_t *qs)
{
	__m128i raw = _mm_loadu_si128((const __m128i *)qs);
	__m128i m = _mm_set1_epi8(0x0f);
	__m128i lo = _mm_and_si128(raw, m);
	__m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), m);
	__m256i v = _mm256_set_m128i(hi, lo);

	return _mm256_sub_epi8(v, _mm256_set1_epi8(8));
}

OPS_AVX2 static float dot_q4_0_avx2(const struct ops_block_q4_0 *w,
				    const struct ops_block_q8_act *x, uint32_t n)
{
	__m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
	uint32_t nb = n / OPS_QK, b = 0;

	for (; b + 2 <= nb; b += 2) {
		_mm_prefetch((const char *)(w + b) + OPS_PF_DIST, _MM_HINT_T0);
		__m256i p0 = dot_i8x32(unpack_q4(w[b].qs),
				       _mm256_loadu_si256((const __m256i *)x[b].qs));
		__m256i p1 = dot_i8x32(unpack_q4(w[b + 1].qs),
				       _mm256_loadu_si256((const __m256i *)x[b + 1].qs));
		__m256 d0 = _mm256_set1_ps(_cvtsh_ss(w[b].d) * x[b].d);
		__m256 d1 = _mm256_set1_ps(_cvtsh_ss(w[b + 1].d) * x[b + 1].d);

		a0 = _mm256_fmadd_ps(d0, _mm256_cvtepi32_ps(p0), a0);
		a1 = _mm256_fmadd_ps(d1, _mm256_cvtepi32_ps(p1), a1);
	}
	if (b < nb) {
		__m256i p0 = dot_i8x32(unpack_q4(w[b].qs),
				       _mm256_loadu_si256((const __m256i *)x[b].qs));
		__m256 d0 = _mm256_set1_ps(_cvtsh_ss(w[b].d) * x[b].d);

		a0 = _mm256_fmadd_ps(d0, _mm256_cvtepi32_ps(p0), a0);
	}
	return hsum256(_mm256_add_ps(a0, a1));
}

/* Three activation rows against one quantized weight row (prefill): each
 * weight block is loaded, unpacked and made absolute once. Per (w, x) pair
 * the order is the single-row kernel's: block b into accumulator b % 2
 * (an odd last block into the first), then a0 + a1. */
#define OPS_QDOT3(NAME, WBLK, LOADQ)                                            \
OPS_AVX2 static void NAME(const WBLK *w, const struct ops_block_q8_act *x,     \
			  size_t xs, uint32_t n, float *out)                    \
{                                                                               \
	const struct ops_block_q8_act *xr[3] = { x, x + xs, x + 2 * xs };       \
	__m256 acc[3][2];                                                       \
	uint32_t nb = n / OPS_QK;                                               \
                                                                                \
	for (int t = 0; t < 3; t++)                                             \
		acc[t][0] = acc[t][1] = _mm256_setzero_ps();                    \
	for (uint32_t b = 0; b < nb; b++) {                                     \
		__m256i q = LOADQ(w, b);                                        \
		__m256i aw = _mm256_sign_epi8(q, q);                            \
		float dw = _cvtsh_ss(w[b].d);                                   \
		int k = (b % 2 == 1) ? 1 : 0;                                   \
                                                                                \
		if (b % 2 == 0)                                                 \
			_mm_prefetch((const char *)(w + b) + OPS_PF_DIST, _MM_HINT_T0); \
		for (int t = 0; t < 3; t++) {                                   \
			__m256i sx = _mm256_sign_epi8(                          \
				_mm256_loadu_si256((const __m256i *)xr[t][b].qs), q); \
			__m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sx), \
						      _mm256_set1_epi16(1));    \
			__m256 d = _mm256_set1_ps(dw * xr[t][b].d);             \
                                                                                \
			acc[t][k] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc[t][k]); \
		}                                                                       \
	}                                                                       \
	for (int t = 0; t < 3; t++)                                             \
		out[t] = hsum256(_mm256_add_ps(acc[t][0], acc[t][1]));          \
}

#define OPS_LOAD_Q8(w, b) _mm256_loadu_si256((const __m256i *)(w)[b].qs)
#define OPS_LOAD_Q4(w, b) unpack_q4((w)[b].qs)
OPS_QDOT3(dot3_q8_0_avx2, struct ops_block_q8_0, OPS_LOAD_Q8)
OPS_QDOT3(dot3_q4_0_avx2, struct ops_block_q4_0, OPS_LOAD_Q4)

OPS_AVX2 static void axpy_f32_avx2(float *y, float a, const float *x, uint32_t n)
{
	__m256 va = _mm256_set1_ps(a);
	uint32_t j = 0;

	for (; j + 8 <= n; j += 8)
		_mm256_storeu_ps(y + j, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + j),
							_mm256_loadu_ps(y + j)));
	for (; j < n; j++)
		y[j] += a * x[j];
}

OPS_AVX2 static void axpy_f16_avx2(float *y, float a, const uint16_t *x, uint32_t n)
{
	__m256 va = _mm256_set1_ps(a);
	uint32_t j = 0;

	for (; j + 8 <= n; j += 8)
		_mm256_storeu_ps(y + j, _mm256_fmadd_ps(va, load_f16x8(x + j),
							_mm256_loadu_ps(y + j)));
	for (; j < n; j++)
		y[j] += a * _cvtsh_ss(x[j]);
}

OPS_AVX2 static void f32_to_f16_avx2(uint16_t *dst, const float *src, uint32_t n)
{
	uint32_t j = 0;

	for (; j + 8 <= n; j += 8)
		_mm_storeu_si128((__m128i *)(dst + j),
				 _mm256_cvtps_ph(_mm256_loadu_ps(src + j),
						 _MM_FROUND_TO_NEAREST_INT));
	for (; j < n; j++)
		dst[j] = ops_f32_to_f16(src[j]);
}

/* Every kernel but the K-quant dots, shared by the avx2 and avx512 tables. */
#define OPS_AVX2_KERNELS                                                     \
	.dot_f32 = dot_f32_avx2, .dot_f16 = dot_f16_avx2,                    \
	.dot3_f32 = dot3_f32_avx2, .dot3_f16 = dot3_f16_avx2,                \
	.dot3_q8_0 = dot3_q8_0_avx2, .dot3_q4_0 = dot3_q4_0_avx2,            \
	.dot_q8_0 = dot_q8_0_avx2, .dot_q4_0 = dot_q4_0_avx2,                \
	.axpy_f32 = axpy_f32_avx2, .axpy_f16 = axpy_f16_avx2,                \
	.f32_to_f16 = f32_to_f16_avx2

static const struct ops_kernels kernels_avx2 = {
	.name = "avx2",
	OPS_AVX2_KERNELS,
	.dot_kq = ops_kq_dot_avx2,
};

const struct ops_kernels *ops_kernels_avx2(void)
{
	if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
	    __builtin_cpu_supports("f16c"))
		return &kernels_avx2;
	return NULL;
}

/* The AVX2 table with AVX-512 K-quant kernels (ops_kq.c). */
static const struct ops_kernels kernels_avx512 = {
	.name = "avx512",
	OPS_AVX2_KERNELS,
	.dot_kq = ops_kq_dot_avx512,
};

const struct ops_kernels *ops_kernels_avx512(void)
{
	if (ops_kernels_avx2() && __builtin_cpu_supports("avx512f") &&
	    __builtin_cpu_supports("avx512bw"))
		return &kernels_avx512;
	return NULL;
}

/* AVX-512 everywhere it pays (ops_gemm.c): register-tile matmuls, and the
 * dots that share their arithmetic (decode, attention). */
static const struct ops_kernels kernels_avx512vnni = {
	.name = "avx512vnni",
	.dot_f32 = ops_gemm__dot_f32, .dot_f16 = ops_gemm__dot_f16,
	.dot3_f32 = ops_gemm__dot3_f32, .dot3_f16 = ops_gemm__dot3_f16,
	.dot3_q8_0 = ops_gemm__dot3_q8_0, .dot3_q4_0 = ops_kqg__dot3_q4_0,
	.dot_q8_0 = ops_gemm__dot_q8_0, .dot_q4_0 = ops_kqg__dot_q4_0,
	.dot_kq = ops_kq_dot_avx512vnni,
	.axpy_f32 = axpy_f32_avx2, .axpy_f16 = axpy_f16_avx2,
	.f32_to_f16 = f32_to_f16_avx2,
	.gemm = ops_gemm__matmul,
	.axpy_rows = ops_gemm__axpy_rows,
};

const struct ops_kernels *ops_kernels_avx512vnni(void)
{
	if (ops_kernels_avx512() && __builtin_cpu_supports("avx512dq") &&
	    __builtin_cpu_supports("avx512vl") &&
	    __builtin_cpu_supports("avx512vnni"))
		return &kernels_avx512vnni;
	return NULL;
}
#else
const struct ops_kernels *ops_kernels_avx2(void)
{
	return NULL;
}

const struct ops_kernels *ops_kernels_avx512(void)
{
	return NULL;
}

const struct ops_kernels *ops_kernels_avx512vnni(void)
{
	return NULL;
}
#endif

const struct ops_kernels *ops_kernels_pick(bool simd)
{
	const struct ops_kernels *k = simd ? ops_kernels_avx512vnni() : NULL;

	if (simd && !k)
		k = ops_kernels_avx512();
	if (simd && !k)
		k = ops_kernels_avx2();
	return k ? k : &kernels_scalar;
}

/* ---- weights and activations --------------------------------------------- */

size_t ops_mat_packed_bytes(const struct ops_kernels *k, const struct ops_mat *w)
{
#if OPS_HAVE_X86
	bool kq = ops_kqg__packed_bytes(w->type, 16, OPS_QK_K) > 0;

	if (k != &kernels_avx512vnni)
		return 0;
	if (kq)
		return w->rows >= 16 ? ops_kqg__packed_bytes(w->type, w->rows, w->cols) : 0;
	if (w->type == GGML_TYPE_Q4_0)
		return ops_kqg__q4_0_packed_bytes(w->rows, w->cols);
	if (w->type == GGML_TYPE_Q8_0)
		return (size_t)w->rows * ops_gemm__packed_row_bytes(w->type, w->cols);
#else
	(void)k;
	(void)w;
#endif
	return 0;
}

void ops_mat_pack_into(const struct ops_kernels *k, const struct ops_mat *w,
		       void *dst)
{
#if OPS_HAVE_X86
	if (!ops_mat_packed_bytes(k, w))
		return;
	if (ops_kqg__packed_bytes(w->type, 16, OPS_QK_K) > 0)
		ops_kqg__pack(w, dst);
	else if (w->type == GGML_TYPE_Q4_0)
		ops_kqg__pack_q4_0(w, dst);
	else
		ops_gemm__pack(w, dst);
#else
	(void)k;
	(void)w;
	(void)dst;
#endif
}

int ops_mat_pack(const struct ops_kernels *k, const struct ops_mat *w,
		 void **out)
{
	size_t n = ops_mat_packed_bytes(k, w);
	void *p = NULL;

	*out = NULL;
	if (!n)
		return 0;
	/* 2 MiB aligned and huge pages asked for (advice only): one
	 * fault per 2 MiB instead of per 4 KiB while packing, and
	 * fewer TLB misses while decoding streams it */
	if (posix_memalign(&p, (size_t)2 << 20, n))
		return -ENOMEM;
#ifdef MADV_HUGEPAGE
	(void)madvise(p, n, MADV_HUGEPAGE);
#endif
#ifdef MADV_POPULATE_WRITE
	/* fault the copy in with one call (advice too: EINVAL before
	 * Linux 5.14): on this VM first touches one page at a time
	 * ran at 150-300 MB/s, 57 MB in 0.15-0.3 s, populated 5 ms */
	(void)madvise(p, n, MADV_POPULATE_WRITE);
#endif
	ops_mat_pack_into(k, w, p);
	*out = p;
	return 0;
}

bool ops_type_supported(enum ggml_type t)
{
	return t == GGML_TYPE_F32 || t == GGML_TYPE_F16 ||
	       t == GGML_TYPE_Q8_0 || t == GGML_TYPE_Q4_0 || ops_kq_is(t);
}

int ops_act_class(enum ggml_type t)
{
	if (ops_kq_is(t))
		return 2;
	return (t == GGML_TYPE_Q8_0 || t == GGML_TYPE_Q4_0) ? 1 : 0;
}

size_t ops_act_row_bytes(enum ggml_type t, uint32_t cols)
{
	if (ops_act_class(t) == 1)
		return (size_t)(cols / OPS_QK) * sizeof(struct ops_block_q8_act);
	if (ops_act_class(t) == 2)
		return (size_t)(cols / OPS_QK_K) * sizeof(struct ops_block_q8_k);
	return (size_t)cols * sizeof(float);
}

/* Per block d = amax / 127, q = x / d rounded half away from zero (as
 * roundf, written out: truncate, then step away from zero when the
 * dropped fraction is at least one half; no libm call). The AVX-512
 * version (ops_gemm__quantize_q8_act) gives the same bytes. */
static void quantize_row_q8_act(const float *x, uint32_t cols,
				struct ops_block_q8_act *out)
{
	for (uint32_t b = 0; b < cols / OPS_QK; b++) {
		const float *xb = x + (size_t)b * OPS_QK;
		float amax = 0.0f, d, id;

		for (int j = 0; j < OPS_QK; j++) {
			float a = fabsf(xb[j]);

			amax = a > amax ? a : amax;
		}
		d = amax / 127.0f;
		id = d != 0.0f ? 1.0f / d : 0.0f;
		out[b].d = d;
		for (int j = 0; j < OPS_QK; j++) {
			float v = xb[j] * id;
			int32_t q = (int32_t)v;
			float f = v - (float)q;

			q += f >= 0.5f ? 1 : f <= -0.5f ? -1 : 0;
			out[b].qs[j] = (int8_t)q;
		}
	}
}

void ops_act_prepare_q8_scalar(const float *x, uint32_t cols,
			       struct ops_block_q8_act *out)
{
	quantize_row_q8_act(x, cols, out);
}

void ops_act_prepare(enum ggml_type t, const float *x, uint32_t cols,
		     void *out)
{
#if OPS_HAVE_X86
	if (ops_act_class(t) == 1 && ops_kernels_avx512vnni()) {
		ops_gemm__quantize_q8_act(x, cols, out);
		return;
	}
	if (ops_act_class(t) == 2 && ops_kernels_avx512vnni()) {
		ops_kqg__quantize_q8_k(x, cols, out);
		return;
	}
#endif
	if (ops_act_class(t) == 1)
		quantize_row_q8_act(x, cols, out);
	else if (ops_act_class(t) == 2)
		ops_q8_k_quantize(x, cols, out);
	else
		memcpy(out, x, (size_t)cols * sizeof(float));
}

/* K-quant rows without a table tile (every table but avx512vnni, whose
 * gemm takes repacked K-quant matrices: ops_kq_gemm.c): one dot per
 * (row, token). */
static void matmul_rows_kq(ops_kq_dot_fn dot, const struct ops_mat *w,
			   const uint8_t *a, size_t act_stride, uint32_t n,
			   float *y, size_t y_stride, uint32_t r0, uint32_t r1)
{
	for (uint32_t r = r0; r < r1; r++) {
		const void *wr = (const uint8_t *)w->data + (size_t)r * w->row_bytes;

		for (uint32_t i = 0; i < n; i++)
			y[(size_t)i * y_stride + r] =
				dot(wr, (const void *)(a + (size_t)i * act_stride), w->cols);
	}
}

void ops_matmul_rows(const struct ops_kernels *k, const struct ops_mat *w,
		     const void *act, size_t act_stride, uint32_t n,
		     float *y, size_t y_stride, uint32_t r0, uint32_t r1)
{
	const uint8_t *a = act;
	size_t xs = act_stride / sizeof(float); /* f32 rows: stride in floats */
	size_t qs = act_stride / sizeof(struct ops_block_q8_act); /* q8 rows: in blocks */

	if (k->gemm && k->gemm(w, act, act_stride, n, y, y_stride, r0, r1))
		return;
	if (ops_kq_is(w->type)) {
		matmul_rows_kq(k->dot_kq[ops_kq_index(w->type)], w, a,
			       act_stride, n, y, y_stride, r0, r1);
		return;
	}
	for (uint32_t r = r0; r < r1; r++) {
		const void *wr = (const uint8_t *)w->data + (size_t)r * w->row_bytes;
		uint32_t i = 0;

		/* prefill: tokens three at a time, same bits as one at a time */
		for (; i + 3 <= n; i += 3) {
			const void *ai = a + (size_t)i * act_stride;
			float o[3];

			switch (w->type) {
			case GGML_TYPE_F32:
				k->dot3_f32(wr, ai, xs, w->cols, o);
				break;
			case GGML_TYPE_F16:
				k->dot3_f16(wr, ai, xs, w->cols, o);
				break;
			case GGML_TYPE_Q8_0:
				k->dot3_q8_0(wr, ai, qs, w->cols, o);
				break;
			case GGML_TYPE_Q4_0:
				k->dot3_q4_0(wr, ai, qs, w->cols, o);
				break;
			default:
				o[0] = o[1] = o[2] = NAN;
				break;
			}
			for (int t = 0; t < 3; t++)
				y[(size_t)(i + t) * y_stride + r] = o[t];
		}
		for (; i < n; i++) {
			const void *ai = a + (size_t)i * act_stride;
			float v;

			switch (w->type) {
			case GGML_TYPE_F32:
				v = k->dot_f32(wr, ai, w->cols);
				break;
			case GGML_TYPE_F16:
				v = k->dot_f16(wr, ai, w->cols);
				break;
			case GGML_TYPE_Q8_0:
				v = k->dot_q8_0(wr, ai, w->cols);
				break;
			case GGML_TYPE_Q4_0:
				v = k->dot_q4_0(wr, ai, w->cols);
				break;
			default:
				v = NAN; /* model load refuses other types */
				break;
			}
			y[(size_t)i * y_stride + r] = v;
		}
	}
}

void ops_mat_row_f32(const struct ops_mat *w, uint32_t r, float *out)
{
	const uint8_t *wr = (const uint8_t *)w->data + (size_t)r * w->row_bytes;

	switch (w->type) {
	case GGML_TYPE_F32:
		memcpy(out, wr, (size_t)w->cols * sizeof(float));
		break;
	case GGML_TYPE_F16:
		for (uint32_t j = 0; j < w->cols; j++) {
			uint16_t h;

			memcpy(&h, wr + 2 * (size_t)j, 2);
			out[j] = ops_f16_to_f32(h);
		}
		break;
	case GGML_TYPE_Q8_0: {
		const struct ops_block_q8_0 *b = (const void *)wr;

		for (uint32_t j = 0; j < w->cols; j++)
			out[j] = b[j / OPS_QK].qs[j % OPS_QK] *
				 ops_f16_to_f32(b[j / OPS_QK].d);
		break;
	}
	case GGML_TYPE_Q4_0: {
		const struct ops_block_q4_0 *b = (const void *)wr;

		for (uint32_t j = 0; j < w->cols; j++) {
			const struct ops_block_q4_0 *bb = &b[j / OPS_QK];
			uint32_t e = j % OPS_QK;
			int q = e < OPS_QK / 2 ? (bb->qs[e] & 0xf)
					       : (bb->qs[e - OPS_QK / 2] >> 4);

			out[j] = (float)(q - 8) * ops_f16_to_f32(bb->d);
		}
		break;
	}
	default:
		if (ops_kq_is(w->type)) {
			ops_kq_dequant_row(w->type, wr, out, w->cols);
			break;
		}
		for (uint32_t j = 0; j < w->cols; j++)
			out[j] = NAN;
		break;
	}
}

/* ---- elementwise --------------------------------------------------------- */

void ops_rmsnorm(float *out, const float *x, const float *g, uint32_t n,
		 float eps)
{
	double sum = 0.0;
	float mean, scale;

	for (uint32_t j = 0; j < n; j++)
		sum += (double)(x[j] * x[j]);
	mean = (float)(sum / n);
	scale = 1.0f / sqrtf(mean + eps);
	for (uint32_t j = 0; j < n; j++)
		out[j] = (x[j] * scale) * g[j];
}

void ops_softmax(float *x, uint32_t n)
{
	float max = -INFINITY;
	double sum = 0.0;
	float inv;

	/* fmaxf's value (NaNs passed over; only the sign of a zero maximum
	 * may differ, and x - (+0) and x - (-0) have the same expf), inline:
	 * the libm call was ~1% of a batched decode step */
	for (uint32_t j = 0; j < n; j++)
		max = x[j] > max ? x[j] : max;
	for (uint32_t j = 0; j < n; j++) {
		x[j] = expf(x[j] - max);
		sum += x[j];
	}
	inv = (float)(1.0 / sum);
	for (uint32_t j = 0; j < n; j++)
		x[j] *= inv;
}

void ops_swiglu(float *a, const float *b, uint32_t n)
{
	for (uint32_t j = 0; j < n; j++)
		a[j] = a[j] / (1.0f + expf(-a[j])) * b[j];
}

void ops_rope_table(float *cs, uint32_t pos, uint32_t rope_dim,
		    float freq_base, float freq_scale)
{
	float theta_scale = powf(freq_base, -2.0f / (float)rope_dim);
	float theta = (float)pos;

	for (uint32_t i = 0; i < rope_dim / 2; i++) {
		float t = theta * freq_scale;

		cs[2 * i] = cosf(t);
		cs[2 * i + 1] = sinf(t);
		theta *= theta_scale;
	}
}

void ops_rope_apply(float *x, uint32_t n_heads, uint32_t head_dim,
		    uint32_t rope_dim, const float *cs)
{
	for (uint32_t h = 0; h < n_heads; h++) {
		float *xh = x + (size_t)h * head_dim;

		for (uint32_t i = 0; i < rope_dim / 2; i++) {
			float c = cs[2 * i], s = cs[2 * i + 1];
			float x0 = xh[2 * i], x1 = xh[2 * i + 1];

			xh[2 * i] = x0 * c - x1 * s;
			xh[2 * i + 1] = x0 * s + x1 * c;
		}
	}
}

void ops_rope_apply_neox(float *x, uint32_t n_heads, uint32_t head_dim,
			 uint32_t rope_dim, const float *cs)
{
	uint32_t half = rope_dim / 2;

	for (uint32_t h = 0; h < n_heads; h++) {
		float *xh = x + (size_t)h * head_dim;

		for (uint32_t i = 0; i < half; i++) {
			float c = cs[2 * i], s = cs[2 * i + 1];
			float x0 = xh[i], x1 = xh[i + half];

			xh[i] = x0 * c - x1 * s;
			xh[i + half] = x0 * s + x1 * c;
		}
	}
}

/* ---- KV through pages ---------------------------------------------------- */

static inline size_t kv_elt(enum kv_dtype dt)
{
	return dt == KV_DTYPE_F16 ? 2 : 4;
}

static inline uint8_t *kv_slot(const struct ops_kv_view *kv, uint32_t pos,
			       uint64_t block_off)
{
	uint8_t *page = kv->pages[pos / kv->page_tokens];
	uint32_t slot = pos % kv->page_tokens;

	return page + block_off + (size_t)slot * kv->kv_dim * kv_elt(kv->dtype);
}

void ops_kv_store(const struct ops_kernels *k, const struct ops_kv_view *kv,
		  uint32_t pos, const float *kf, const float *vf)
{
	uint8_t *kd = kv_slot(kv, pos, kv->k_off);
	uint8_t *vd = kv_slot(kv, pos, kv->v_off);

	if (kv->dtype == KV_DTYPE_F16) {
		k->f32_to_f16((uint16_t *)(void *)kd, kf, kv->kv_dim);
		k->f32_to_f16((uint16_t *)(void *)vd, vf, kv->kv_dim);
	} else {
		memcpy(kd, kf, (size_t)kv->kv_dim * sizeof(float));
		memcpy(vd, vf, (size_t)kv->kv_dim * sizeof(float));
	}
}

/* Prefetch bytes [head_off, head_off + bytes) of the rows of positions
 * [p0, p1) of block `off` (K or V). */
static void kv_prefetch(const struct ops_kv_view *kv, uint32_t p0, uint32_t p1,
			uint64_t off, size_t head_off, size_t bytes)
{
	size_t rs = (size_t)kv->kv_dim * kv_elt(kv->dtype);

	while (p0 < p1) {
		const uint8_t *p = kv_slot(kv, p0, off) + head_off;
		uint32_t end = p0 - p0 % kv->page_tokens + kv->page_tokens;

		end = end < p1 ? end : p1;
		for (; p0 < end; p0++, p += rs)
			for (size_t o = 0; o < bytes; o += 64)
				__builtin_prefetch(p + o, 0, 3);
	}
}

/* Positions in the run starting at t (to the end of its page). */
static inline uint32_t kv_run(const struct ops_kv_view *kv, uint32_t t,
			      uint32_t n_pos)
{
	uint32_t cnt = kv->page_tokens - t % kv->page_tokens;

	return cnt < n_pos - t ? cnt : n_pos - t;
}

/* The same attention a page's run of positions at a time, for the
 * `group` query heads of one K/V head (q and out: group x head_dim,
 * scores: group rows of score_stride): the scores of a run are one
 * matmul of its K rows by the group's queries (the table's gemm: 4-row
 * tiles, each value the table's dot bit for bit whatever the tile, so
 * each K row is loaded once for the whole group), the V sum one
 * axpy_rows per head over the run's V rows (the output in registers,
 * each element the axpy's fmas in position order). Same bits as the
 * per-head, per-position loop (ops_attention_head's), fewer calls, loads
 * and stores.
 *
 * Memory: the K/V rows of a head are 64-256 byte pieces of rows
 * kv_dim wide, in pages scattered through the pool, which no hardware
 * prefetcher follows, and a decode batch's KV (~0.6 MB per sequence of
 * 150 positions for the serving benchmark's model) does not stay in
 * cache from one step to the next: the loads waited on memory. So while
 * a unit computes its scores, run by run, the K and V rows of the next
 * unit (`next`, the caller's) are prefetched a share per run, a whole
 * unit ahead; without one, the next run's K rows and this run's V rows. */
static void attention_runs(const struct ops_kernels *k,
			   const struct ops_kv_view *kv, const float *q,
			   size_t head_off, uint32_t group, uint32_t head_dim,
			   uint32_t n_pos, float scale, float *scores,
			   size_t score_stride, float *out,
			   const struct ops_att_next *next)
{
	bool f16 = kv->dtype == KV_DTYPE_F16;
	size_t rs = (size_t)kv->kv_dim * kv_elt(kv->dtype);
	size_t hb = (size_t)head_dim * kv_elt(kv->dtype);
	uint32_t n_runs = 0, run = 0;
	size_t nhoff = 0;

	if (next) {
		for (uint32_t t = 0; t < n_pos; t += kv_run(kv, t, n_pos))
			n_runs++;
		nhoff = (size_t)next->kv_head * hb;
	} else if (n_pos > 0) {
		kv_prefetch(kv, 0, kv_run(kv, 0, n_pos), kv->k_off, head_off, hb);
	}
	for (uint32_t t = 0, cnt; t < n_pos; t += cnt, run++) {
		struct ops_mat m = { .type = f16 ? GGML_TYPE_F16 : GGML_TYPE_F32,
				     .cols = head_dim, .row_bytes = rs,
				     .data = kv_slot(kv, t, kv->k_off) + head_off };

		cnt = kv_run(kv, t, n_pos);
		if (next) {
			/* share `run` of n_runs of the next unit's positions */
			uint32_t p0 = (uint32_t)((uint64_t)next->n_pos * run / n_runs);
			uint32_t p1 = (uint32_t)((uint64_t)next->n_pos * (run + 1) / n_runs);

			kv_prefetch(next->kv, p0, p1, next->kv->k_off, nhoff, hb);
			kv_prefetch(next->kv, p0, p1, next->kv->v_off, nhoff, hb);
		} else {
			if (t + cnt < n_pos)
				kv_prefetch(kv, t + cnt, t + cnt + kv_run(kv, t + cnt, n_pos),
					    kv->k_off, head_off, hb);
			kv_prefetch(kv, t, t + cnt, kv->v_off, head_off, hb);
		}
		m.rows = cnt;
		k->gemm(&m, q, (size_t)head_dim * sizeof(float), group, scores + t,
			score_stride, 0, cnt);
	}
	for (uint32_t g = 0; g < group; g++) {
		float *sg = scores + g * score_stride;

		for (uint32_t t = 0; t < n_pos; t++)
			sg[t] *= scale;
		ops_softmax(sg, n_pos);
	}
	memset(out, 0, (size_t)group * head_dim * sizeof(float));
	for (uint32_t t = 0, cnt; t < n_pos; t += cnt) {
		cnt = kv_run(kv, t, n_pos);
		for (uint32_t g = 0; g < group; g++)
			k->axpy_rows(out + (size_t)g * head_dim, scores + g * score_stride + t,
				     kv_slot(kv, t, kv->v_off) + head_off, rs, cnt,
				     head_dim, f16);
	}
}

void ops_attention_head(const struct ops_kernels *k,
			const struct ops_kv_view *kv, const float *q,
			uint32_t kv_head, uint32_t head_dim, uint32_t n_pos,
			float scale, float *scores, float *out)
{
	size_t head_off = (size_t)kv_head * head_dim * kv_elt(kv->dtype);
	bool f16 = kv->dtype == KV_DTYPE_F16;

	if (k->gemm && k->axpy_rows && head_dim % 16 == 0) {
		attention_runs(k, kv, q, head_off, 1, head_dim, n_pos, scale,
			       scores, n_pos, out, NULL);
		return;
	}
	for (uint32_t t = 0; t < n_pos; t++) {
		const void *kp = kv_slot(kv, t, kv->k_off) + head_off;

		scores[t] = (f16 ? k->dot_f16(kp, q, head_dim)
				 : k->dot_f32(kp, q, head_dim)) * scale;
	}
	ops_softmax(scores, n_pos);
	memset(out, 0, (size_t)head_dim * sizeof(float));
	for (uint32_t t = 0; t < n_pos; t++) {
		const void *vp = kv_slot(kv, t, kv->v_off) + head_off;

		if (f16)
			k->axpy_f16(out, scores[t], vp, head_dim);
		else
			k->axpy_f32(out, scores[t], vp, head_dim);
	}
}

void ops_attention_group(const struct ops_kernels *k,
			 const struct ops_kv_view *kv, const float *q,
			 uint32_t kv_head, uint32_t group, uint32_t head_dim,
			 uint32_t n_pos, float scale, float *scores,
			 size_t score_stride, float *out,
			 const struct ops_att_next *next)
{
	if (k->gemm && k->axpy_rows && head_dim % 16 == 0) {
		attention_runs(k, kv, q, (size_t)kv_head * head_dim * kv_elt(kv->dtype),
			       group, head_dim, n_pos, scale, scores, score_stride, out,
			       next);
		return;
	}
	for (uint32_t g = 0; g < group; g++)
		ops_attention_head(k, kv, q + (size_t)g * head_dim, kv_head, head_dim,
				   n_pos, scale, scores + g * score_stride,
				   out + (size_t)g * head_dim);
}
