/* test_ops_kq.c - K-quant blocks (gpu/cpu/ops_kq.h).
 *
 * 1. Hand-built blocks of every type dequantize to values worked out by
 *    hand from the layout in gpu/README.md (comments give the arithmetic).
 * 2. Thousands of random blocks: pack(unpack(b)) gives b's bytes back.
 * 3. Dot products: against dequantize-then-dot in double over the same
 *    Q8_K activations, within 1e-5 of sum |w x| (the only error is float
 *    rounding of the per-block scale products); the AVX2, AVX-512 and
 *    AVX-512 VNNI tables equal the scalar one bit for bit, on random
 *    blocks and on the extremes (every quant and scale at its largest,
 *    activations at +-127, where a 16-bit intermediate would saturate).
 *    The SIMD tables this CPU lacks are named on stdout as not tested.
 * 4. The quantizer: relative RMS error per type under a stated bound, and
 *    a matmul through ops_matmul_rows.
 * 5. The avx512vnni table's K-quant tiles on repacked rows (every type,
 *    1..9 tokens, row ranges that cut groups of 16) equal the scalar dot
 *    bit for bit, and its Q8_K activation quantizer gives the scalar
 *    one's bytes (halves, zeros, NaN and Inf included).
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/cpu/ops_cpu.h"
#include "gpu/cpu/ops_kq.h"

static const enum ggml_type kq_types[OPS_KQ_N] = {
	GGML_TYPE_Q2_K, GGML_TYPE_Q3_K, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K,
	GGML_TYPE_Q6_K,
};

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng_next(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return rng_state;
}

static float rnd(void) /* [-1, 1) */
{
	return (float)((double)(rng_next() >> 11) / 4503599627370496.0 - 1.0);
}

/* A random half in [2^-14, 2^1): finite, normal, positive. */
static uint16_t rnd_half(void)
{
	return (uint16_t)(0x0400 + rng_next() % (0x4000 - 0x0400));
}

/* Random bytes with d (and dmin) set to random finite halves. */
static void rnd_block(enum ggml_type t, uint8_t *b)
{
	size_t n = ops_kq_block_bytes(t);
	uint16_t h0 = rnd_half(), h1 = rnd_half();

	for (size_t i = 0; i < n; i++)
		b[i] = (uint8_t)rng_next();
	switch (t) {
	case GGML_TYPE_Q2_K: /* d, dmin at the end */
		memcpy(b + 80, &h0, 2);
		memcpy(b + 82, &h1, 2);
		break;
	case GGML_TYPE_Q3_K:
		memcpy(b + 108, &h0, 2);
		break;
	case GGML_TYPE_Q4_K:
	case GGML_TYPE_Q5_K: /* d, dmin first */
		memcpy(b, &h0, 2);
		memcpy(b + 2, &h1, 2);
		break;
	default:
		memcpy(b + 208, &h0, 2);
		break;
	}
}

static float deq1(enum ggml_type t, const void *blk, int e)
{
	float out[OPS_QK_K];

	ops_kq_dequant_row(t, blk, out, OPS_QK_K);
	return out[e];
}

/* ---- 1. hand-built blocks ------------------------------------------------ */

START_TEST(test_hand_q2_k)
{
	struct ops_block_q2_k b = { .d = 0x3c00, .dmin = 0x3c00 }; /* 1.0, 1.0 */

	b.scales[0] = 0x52; /* group 0: sc 2, mn 5 */
	b.scales[2] = 0x13; /* group 2: sc 3, mn 1 */
	b.qs[0] = 0x0b;     /* e0: bits 0-1 = 3; e32: bits 2-3 = 2 */
	ck_assert_float_eq(deq1(GGML_TYPE_Q2_K, &b, 0), 1.0f);   /* 2*3 - 5 */
	ck_assert_float_eq(deq1(GGML_TYPE_Q2_K, &b, 1), -5.0f);  /* 2*0 - 5 */
	ck_assert_float_eq(deq1(GGML_TYPE_Q2_K, &b, 32), 5.0f);  /* 3*2 - 1 */
	ck_assert_float_eq(deq1(GGML_TYPE_Q2_K, &b, 200), 0.0f); /* group 12: 0 */
}
END_TEST

START_TEST(test_hand_q3_k)
{
	struct ops_block_q3_k b = { .d = 0x3400 }; /* 0.25 */

	/* scale 0: low 4 bits 1 (scales[0]), high 2 bits 2 (scales[8] bits
	 * 0-1): stored 33, sc = 1. Every other scale stored 0: sc = -32. */
	b.scales[0] = 0x01;
	b.scales[8] = 0x02;
	b.qs[0] = 0x03;     /* e0: low 3, hmask[0] bit 0 clear: q = 3 - 4 = -1 */
	b.qs[48] = 0x02;    /* e144 = 128 + 16: qs[32 + 16] bits 0-1 = 2 */
	b.hmask[16] = 0x10; /* its high bit: bit 4n + j = 4 of hmask[16]: q = 2 */
	ck_assert_float_eq(deq1(GGML_TYPE_Q3_K, &b, 0), -0.25f);  /* .25*1*-1 */
	ck_assert_float_eq(deq1(GGML_TYPE_Q3_K, &b, 1), -1.0f);   /* .25*1*-4 */
	ck_assert_float_eq(deq1(GGML_TYPE_Q3_K, &b, 144), -16.0f); /* .25*-32*2 */
}
END_TEST

/* Shared by Q4_K and Q5_K: d 1.0, dmin 0.5; sub-block 0: sc 2, mn 3;
 * sub-block 5: sc 17 = 1 | 1 << 4 (low nibble of scales[9], top bits of
 * scales[1]), mn 33 = 1 | 2 << 4 (high nibble of scales[9], top bits of
 * scales[5]); every other sub-block 0. */
static void hand_k4_scales(uint8_t *s)
{
	s[0] = 2;
	s[4] = 3;
	s[9] = 0x11;
	s[1] = 0x40;
	s[5] = 0x80;
}

START_TEST(test_hand_q4_k)
{
	struct ops_block_q4_k b = { .d = 0x3c00, .dmin = 0x3800 };

	hand_k4_scales(b.scales);
	b.qs[0] = 0x5a;  /* e0 = 0xa (sub-block 0), e32 = 5 (sub-block 1) */
	b.qs[64] = 0x70; /* e128 = 0 (sub-block 4), e160 = 7 (sub-block 5) */
	ck_assert_float_eq(deq1(GGML_TYPE_Q4_K, &b, 0), 18.5f);   /* 2*10 - .5*3 */
	ck_assert_float_eq(deq1(GGML_TYPE_Q4_K, &b, 1), -1.5f);   /* 2*0 - .5*3 */
	ck_assert_float_eq(deq1(GGML_TYPE_Q4_K, &b, 32), 0.0f);   /* sc 0, mn 0 */
	ck_assert_float_eq(deq1(GGML_TYPE_Q4_K, &b, 128), 0.0f);
	ck_assert_float_eq(deq1(GGML_TYPE_Q4_K, &b, 160), 102.5f); /* 17*7 - .5*33 */
	ck_assert_float_eq(deq1(GGML_TYPE_Q4_K, &b, 161), -16.5f);
}
END_TEST

START_TEST(test_hand_q5_k)
{
	struct ops_block_q5_k b = { .d = 0x3c00, .dmin = 0x3800 };

	hand_k4_scales(b.scales);
	b.qs[0] = 0x5a;
	b.qs[64] = 0x70;
	/* qh[0]: bit 0 -> e0 + 16, bit 1 -> e32 + 16, bit 5 (2c + h, c = 2,
	 * h = 1) -> e160 + 16 */
	b.qh[0] = 0x23;
	ck_assert_float_eq(deq1(GGML_TYPE_Q5_K, &b, 0), 50.5f);   /* 2*26 - 1.5 */
	ck_assert_float_eq(deq1(GGML_TYPE_Q5_K, &b, 32), 0.0f);
	ck_assert_float_eq(deq1(GGML_TYPE_Q5_K, &b, 160), 374.5f); /* 17*23 - 16.5 */
	ck_assert_float_eq(deq1(GGML_TYPE_Q5_K, &b, 128), 0.0f);
}
END_TEST

START_TEST(test_hand_q6_k)
{
	struct ops_block_q6_k b = { .d = 0x3800 }; /* 0.5 */

	b.scales[0] = 3;
	b.scales[4] = 1;
	b.scales[7] = -2;
	b.ql[0] = 0x21;  /* e0 low 4 bits 1; e64 low 4 bits 2 */
	b.qh[0] = 0x02;  /* e0 high bits (0-1) 2: 1 | 32 = 33, q = 1 */
	b.ql[48] = 0xf0; /* e112 = 96 + 16: high nibble of ql[32 + 16] = 15 */
	b.qh[16] = 0xc0; /* its high bits (6-7) 3: 63, q = 31 */
	ck_assert_float_eq(deq1(GGML_TYPE_Q6_K, &b, 0), 1.5f);    /* .5*3*1 */
	ck_assert_float_eq(deq1(GGML_TYPE_Q6_K, &b, 1), -48.0f);  /* .5*3*-32 */
	ck_assert_float_eq(deq1(GGML_TYPE_Q6_K, &b, 64), -15.0f); /* .5*1*(2-32) */
	ck_assert_float_eq(deq1(GGML_TYPE_Q6_K, &b, 112), -31.0f); /* .5*-2*31 */
}
END_TEST

/* ---- 2. random blocks round trip ----------------------------------------- */

START_TEST(test_pack_roundtrip)
{
	for (int ti = 0; ti < OPS_KQ_N; ti++) {
		enum ggml_type t = kq_types[ti];
		size_t n = ops_kq_block_bytes(t);

		for (int i = 0; i < 4000; i++) {
			uint8_t b[256], b2[256];
			struct ops_kq_unpacked u;

			rnd_block(t, b);
			ops_kq_unpack(t, b, &u);
			ops_kq_pack(t, &u, b2);
			ck_assert_msg(!memcmp(b, b2, n), "%s block %d", ggml_type_name(t), i);
		}
	}
}
END_TEST

/* ---- 3. dot products ------------------------------------------------------ */

static void check_dots(enum ggml_type t, uint32_t n_blocks, int iters)
{
	size_t bb = ops_kq_block_bytes(t);
	uint32_t n = n_blocks * OPS_QK_K;
	uint8_t *w = malloc(bb * n_blocks);
	float *x = malloc(n * sizeof(float)), *wf = malloc(n * sizeof(float));
	struct ops_block_q8_k *xq = malloc(n_blocks * sizeof(*xq));
	const struct ops_kernels *simd[3] = { ops_kernels_avx2(), ops_kernels_avx512(),
					      ops_kernels_avx512vnni() };
	int ti = ops_kq_index(t);

	for (int it = 0; it < iters; it++) {
		double ref = 0.0, mag = 0.0;
		float s;

		for (uint32_t b = 0; b < n_blocks; b++)
			rnd_block(t, w + b * bb);
		for (uint32_t j = 0; j < n; j++)
			x[j] = rnd() * (it % 3 ? 1.0f : 50.0f);
		ops_q8_k_quantize(x, n, xq);
		ops_kq_dequant_row(t, w, wf, n);
		for (uint32_t j = 0; j < n; j++) {
			double xv = (double)xq[j / OPS_QK_K].qs[j % OPS_QK_K] *
				    xq[j / OPS_QK_K].d;

			ref += (double)wf[j] * xv;
			mag += fabs((double)wf[j] * xv);
		}
		s = ops_kq_dot_scalar[ti](w, xq, n);
		ck_assert_msg(fabs(s - ref) <= 1e-5 * mag + 1e-30,
			      "%s: dot %g ref %g (sum |wx| %g)", ggml_type_name(t),
			      (double)s, ref, mag);
		for (int k = 0; k < 3; k++) {
			float v;

			if (!simd[k])
				continue;
			v = simd[k]->dot_kq[ti](w, xq, n);
			ck_assert_msg(memcmp(&s, &v, sizeof(s)) == 0,
				      "%s: %s %a scalar %a", ggml_type_name(t),
				      simd[k]->name, (double)v, (double)s);
		}
	}
	free(w);
	free(x);
	free(wf);
	free(xq);
}

START_TEST(test_dot_vs_dequant)
{
	for (int ti = 0; ti < OPS_KQ_N; ti++) {
		check_dots(kq_types[ti], 1, 3000);
		check_dots(kq_types[ti], 11, 200);
	}
}
END_TEST

/* The SIMD tables the CPU reports are there, and each avx512 table has
 * its own kernel for every type (not a fallback to the AVX2 one), so the
 * bit-for-bit checks above really ran the AVX-512 code. */
START_TEST(test_simd_tables)
{
	const struct ops_kernels *a2 = ops_kernels_avx2();
	const struct ops_kernels *a5 = ops_kernels_avx512();
	const struct ops_kernels *vn = ops_kernels_avx512vnni();
	bool has512 = false, hasvnni = false;

#if defined(__x86_64__)
	has512 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
		 __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx512f") &&
		 __builtin_cpu_supports("avx512bw");
	hasvnni = has512 && __builtin_cpu_supports("avx512vnni");
#endif
	ck_assert(!has512 || (a2 && a5));
	ck_assert(!hasvnni || vn);
	ck_assert(has512 || !a5);
	ck_assert(hasvnni || !vn);
	for (int ti = 0; ti < OPS_KQ_N; ti++) {
		if (a5) {
			ck_assert(a5->dot_kq[ti] != a2->dot_kq[ti]);
			ck_assert(a5->dot_kq[ti] != ops_kq_dot_scalar[ti]);
		}
		if (vn)
			ck_assert(vn->dot_kq[ti] != a5->dot_kq[ti]);
	}
	ck_assert_str_eq(ops_kernels_pick(true)->name,
			 vn ? "avx512vnni" : a5 ? "avx512" : a2 ? "avx2" : "scalar");
	printf("test_ops_kq: K-quant tables tested: scalar%s%s%s\n", a2 ? " avx2" : "",
	       a5 ? " avx512" : "", vn ? " avx512vnni" : "");
	if (!a5 || !vn)
		printf("test_ops_kq: not on this CPU, so not tested here:%s%s\n",
		       a5 ? "" : " avx512", vn ? "" : " avx512vnni");
}
END_TEST

/* Every quant and scale byte all ones (largest quants; Q3_K scale 31,
 * Q6_K scale -1) against activations all +127, all -127, and alternating:
 * maddubs pairs reach 2 * 63 * 127 (Q6_K), the sums their extremes. */
START_TEST(test_dot_extremes)
{
	enum { NB = 3 };
	const struct ops_kernels *tabs[3] = { ops_kernels_avx2(), ops_kernels_avx512(),
					      ops_kernels_avx512vnni() };
	static uint8_t w[NB * 210];
	static struct ops_block_q8_k xq[NB];

	for (int ti = 0; ti < OPS_KQ_N; ti++) {
		enum ggml_type t = kq_types[ti];
		size_t bb = ops_kq_block_bytes(t);

		for (int b = 0; b < NB; b++) {
			rnd_block(t, w + b * bb); /* for d, dmin */
			for (size_t i = 0; i < bb; i++) {
				bool is_d = (t == GGML_TYPE_Q4_K || t == GGML_TYPE_Q5_K)
						    ? i < 4 : i >= bb - (t == GGML_TYPE_Q2_K ? 4 : 2);

				if (!is_d)
					w[b * bb + i] = 0xff;
			}
		}
		for (int mode = 0; mode < 3; mode++) {
			float s;

			for (int b = 0; b < NB; b++) {
				int sum[16] = { 0 };

				xq[b].d = 0.01f * (float)(b + 1);
				for (int j = 0; j < OPS_QK_K; j++) {
					int v = mode == 0 ? 127 : mode == 1 ? -127
							 : (j % 2 ? 127 : -127);

					xq[b].qs[j] = (int8_t)v;
					sum[j / 16] += v;
				}
				for (int g = 0; g < 16; g++)
					xq[b].bsums[g] = (int16_t)sum[g];
			}
			s = ops_kq_dot_scalar[ti](w, xq, NB * OPS_QK_K);
			ck_assert(s != 0.0f || mode == 2);
			for (int k = 0; k < 3; k++) {
				float v;

				if (!tabs[k])
					continue;
				v = tabs[k]->dot_kq[ti](w, xq, NB * OPS_QK_K);
				ck_assert_msg(memcmp(&s, &v, sizeof(s)) == 0,
					      "%s mode %d: %s %a scalar %a",
					      ggml_type_name(t), mode, tabs[k]->name,
					      (double)v, (double)s);
			}
		}
	}
}
END_TEST

START_TEST(test_q8_k_activations)
{
	float x[2 * OPS_QK_K];
	struct ops_block_q8_k q[2];

	for (int j = 0; j < 2 * OPS_QK_K; j++)
		x[j] = rnd() * 3.0f;
	x[7] = -4.0f; /* the block's largest magnitude maps to -127 */
	ops_q8_k_quantize(x, 2 * OPS_QK_K, q);
	ck_assert_int_eq(q[0].qs[7], -127);
	for (int b = 0; b < 2; b++)
		for (int g = 0; g < 16; g++) {
			int s = 0;

			for (int j = 0; j < 16; j++)
				s += q[b].qs[16 * g + j];
			ck_assert_int_eq(q[b].bsums[g], s);
		}
	for (int j = 0; j < 2 * OPS_QK_K; j++)
		ck_assert(fabsf(q[j / OPS_QK_K].qs[j % OPS_QK_K] * q[j / OPS_QK_K].d - x[j]) <=
			  q[j / OPS_QK_K].d * 0.5001f);
}
END_TEST

/* ops_act_prepare for K-quant weights (the AVX-512 quantizer where the
 * CPU has avx512vnni) gives ops_q8_k_quantize's bytes: random rows of
 * several magnitudes, exact halves (amax 127 so x * id = x: +-k.5 round
 * away from zero), a zero block, and NaN / Inf lanes. */
START_TEST(test_q8_k_prepare_exact)
{
	enum { NB = 4, N = NB * OPS_QK_K };
	static float x[N];
	static struct ops_block_q8_k a[NB], b[NB];

	for (int it = 0; it < 400; it++) {
		float scale = it % 4 == 0 ? 1e-3f : it % 4 == 1 ? 1.0f : it % 4 == 2 ? 30.0f : 1e4f;

		for (int j = 0; j < N; j++)
			x[j] = rnd() * scale;
		if (it % 5 == 0) /* block 0: exact halves */
			for (int j = 0; j < OPS_QK_K; j++)
				x[j] = j == 0 ? 127.0f : (float)((int)(rnd() * 126.0f)) + (j % 2 ? 0.5f : -0.5f);
		if (it % 7 == 0) /* block 1 zero */
			memset(x + OPS_QK_K, 0, OPS_QK_K * sizeof(float));
		if (it % 11 == 0) { /* block 2 a NaN, block 3 an Inf */
			x[2 * OPS_QK_K + (it % 256)] = NAN;
			x[3 * OPS_QK_K + (it % 256)] = it % 2 ? INFINITY : -INFINITY;
		}
		memset(a, 0x5a, sizeof(a));
		memset(b, 0xa5, sizeof(b));
		ops_q8_k_quantize(x, N, a);
		ops_act_prepare(GGML_TYPE_Q4_K, x, N, b);
		ck_assert_msg(memcmp(a, b, sizeof(a)) == 0, "iteration %d", it);
	}
}
END_TEST

/* ---- 4. quantizer and matmul ----------------------------------------------- */

START_TEST(test_quantizer_error)
{
	/* relative RMS error bounds for uniform random weights */
	static const double bound[OPS_KQ_N] = { 0.30, 0.20, 0.08, 0.04, 0.03 };
	enum { N = 16 * OPS_QK_K };
	static float x[N], y[N];
	static uint8_t q[N];

	for (int j = 0; j < N; j++)
		x[j] = rnd() * 0.1f;
	for (int ti = 0; ti < OPS_KQ_N; ti++) {
		double e2 = 0.0, x2 = 0.0;

		ops_kq_quantize_row(kq_types[ti], x, N, q);
		ops_kq_dequant_row(kq_types[ti], q, y, N);
		for (int j = 0; j < N; j++) {
			e2 += (double)(y[j] - x[j]) * (y[j] - x[j]);
			x2 += (double)x[j] * x[j];
		}
		ck_assert_msg(sqrt(e2 / x2) < bound[ti], "%s: rel rms %g",
			      ggml_type_name(kq_types[ti]), sqrt(e2 / x2));
	}
}
END_TEST

START_TEST(test_matmul_kq)
{
	enum { ROWS = 7, COLS = 512, TOK = 4 };
	static float wsrc[ROWS * COLS], x[TOK * COLS], wrow[COLS];
	static uint8_t wq[ROWS * 2 * 210];
	static struct ops_block_q8_k act[TOK * 2];
	float y[4][TOK * ROWS];
	const struct ops_kernels *tabs[4] = { ops_kernels_scalar(), ops_kernels_avx2(),
					      ops_kernels_avx512(), ops_kernels_avx512vnni() };

	for (int j = 0; j < ROWS * COLS; j++)
		wsrc[j] = rnd();
	for (int j = 0; j < TOK * COLS; j++)
		x[j] = rnd();
	for (int ti = 0; ti < OPS_KQ_N; ti++) {
		enum ggml_type t = kq_types[ti];
		struct ops_mat m = { .type = t, .rows = ROWS, .cols = COLS,
				     .row_bytes = ggml_type_nbytes(t, COLS), .data = wq };

		ck_assert(ops_type_supported(t));
		ck_assert_int_eq(ops_act_class(t), 2);
		ck_assert_uint_eq(ops_act_row_bytes(t, COLS), 2 * sizeof(struct ops_block_q8_k));
		ck_assert_uint_eq(m.row_bytes, 2 * ops_kq_block_bytes(t));
		for (int r = 0; r < ROWS; r++)
			ops_kq_quantize_row(t, wsrc + r * COLS, COLS, wq + r * m.row_bytes);
		for (int i = 0; i < TOK; i++)
			ops_act_prepare(t, x + i * COLS, COLS, act + 2 * i);
		for (int k = 0; k < 4 && tabs[k]; k++)
			ops_matmul_rows(tabs[k], &m, act, 2 * sizeof(struct ops_block_q8_k),
					TOK, y[k], ROWS, 0, ROWS);
		for (int r = 0; r < ROWS; r++) {
			ops_mat_row_f32(&m, (uint32_t)r, wrow);
			for (int i = 0; i < TOK; i++) {
				float d = tabs[0]->dot_kq[ti](wq + r * m.row_bytes, act + 2 * i, COLS);

				ck_assert(d == y[0][i * ROWS + r]);
				for (int k = 1; k < 4 && tabs[k]; k++)
					ck_assert(d == y[k][i * ROWS + r]);
				/* dequantized row . x: within the activation rounding */
				double ref = 0.0, mag = 0.0;

				for (int j = 0; j < COLS; j++) {
					ref += (double)wrow[j] * x[i * COLS + j];
					mag += fabs((double)wrow[j]);
				}
				ck_assert(fabs(d - ref) <= mag * fmaxf(act[2 * i].d, act[2 * i + 1].d) + 1e-6);
			}
		}
	}
}
END_TEST

/* The avx512vnni table's K-quant tiles (gpu/cpu/ops_kq_gemm.c): Q4_K and Q6_K
 * matrices repacked in groups of 16 rows (ops_mat_pack), multiplied by
 * 1..9 tokens over the whole row range and over ranges that cut groups,
 * equal the scalar dot of every (row, token) bit for bit, on random
 * blocks and on the extremes (all quant and scale bits set, activations
 * +-127). Afterwards the file data is zeroed: the rows of whole groups
 * still give the same values, so they came from the repacked copy, and
 * the rest (outside whole groups) give zero, so they came from the file
 * through the dot. Skips (printing why) without avx512vnni. */
static void check_kq_tiles(enum ggml_type t, bool extreme)
{
	enum { ROWS = 53, NB = 3, COLS = NB * OPS_QK_K, TOK = 9 };
	const struct ops_kernels *vn = ops_kernels_avx512vnni();
	int ti = ops_kq_index(t);
	size_t bb = ops_kq_block_bytes(t), rb = bb * NB;
	uint8_t *w = malloc(rb * ROWS), *zero = calloc(rb, ROWS);
	struct ops_block_q8_k *xq = malloc(TOK * NB * sizeof(*xq));
	float *x = malloc(COLS * sizeof(float));
	float *ref = malloc(TOK * ROWS * sizeof(float));
	float *y = malloc(TOK * ROWS * sizeof(float));
	struct ops_mat m = { .type = t, .rows = ROWS, .cols = COLS,
			     .row_bytes = rb, .data = w };
	static const uint32_t cuts[][2] = { { 0, ROWS }, { 0, 7 }, { 7, 40 },
					    { 40, ROWS }, { 16, 32 }, { 3, 12 } };
	void *pk = NULL;

	for (uint32_t b = 0; b < ROWS * NB; b++) {
		rnd_block(t, w + b * bb);
		if (extreme)
			for (size_t i = 0; i < bb; i++) {
				bool is_d = (t == GGML_TYPE_Q4_K || t == GGML_TYPE_Q5_K)
						    ? i < 4 : i >= bb - (t == GGML_TYPE_Q2_K ? 4 : 2);

				if (!is_d)
					w[b * bb + i] = 0xff;
			}
	}
	for (int i = 0; i < TOK; i++) {
		for (int j = 0; j < COLS; j++)
			x[j] = extreme ? (j % (i + 2) ? 1.0f : -1.0f) : rnd() * (i % 3 ? 1.0f : 40.0f);
		ops_q8_k_quantize(x, COLS, xq + i * NB);
	}
	for (int r = 0; r < ROWS; r++)
		for (int i = 0; i < TOK; i++)
			ref[i * ROWS + r] = ops_kq_dot_scalar[ti](w + r * rb, xq + i * NB, COLS);
	ck_assert_int_eq(ops_mat_pack(vn, &m, &pk), 0);
	ck_assert_msg(pk != NULL, "%s: no repacked copy", ggml_type_name(t));
	m.packed = pk;
	for (uint32_t n = 1; n <= TOK; n++)
		for (size_t c = 0; c < sizeof(cuts) / sizeof(cuts[0]); c++) {
			for (int k = 0; k < TOK * ROWS; k++)
				y[k] = NAN;
			ops_matmul_rows(vn, &m, xq, NB * sizeof(*xq), n, y, ROWS,
					cuts[c][0], cuts[c][1]);
			for (uint32_t i = 0; i < TOK; i++)
				for (uint32_t r = 0; r < ROWS; r++) {
					bool in = i < n && r >= cuts[c][0] && r < cuts[c][1];
					float v = y[i * ROWS + r], e = ref[i * ROWS + r];

					if (!in) {
						ck_assert_msg(isnan(v), "%s: wrote outside", ggml_type_name(t));
						continue;
					}
					ck_assert_msg(memcmp(&v, &e, sizeof(v)) == 0,
						      "%s%s: n %u rows [%u,%u) row %u token %u: %a, dot %a",
						      ggml_type_name(t), extreme ? " (extreme)" : "", n,
						      cuts[c][0], cuts[c][1], r, i, (double)v, (double)e);
				}
		}
	/* which copy each row came from */
	m.data = zero;
	ops_matmul_rows(vn, &m, xq, NB * sizeof(*xq), TOK, y, ROWS, 0, ROWS);
	for (uint32_t i = 0; i < TOK; i++)
		for (uint32_t r = 0; r < ROWS; r++) {
			float v = y[i * ROWS + r];

			if (r < ROWS / 16 * 16)
				ck_assert(memcmp(&v, &ref[i * ROWS + r], sizeof(v)) == 0);
			else
				ck_assert(v == 0.0f);
		}
	free(pk);
	free(w);
	free(zero);
	free(xq);
	free(x);
	free(ref);
	free(y);
}

START_TEST(test_kq_tiles)
{
	if (!ops_kernels_avx512vnni()) {
		printf("test_ops_kq: no avx512vnni: K-quant tiles not tested here\n");
		return;
	}
	for (int it = 0; it < 4; it++) {
		for (int ti = 0; ti < OPS_KQ_N; ti++)
			check_kq_tiles(kq_types[ti], false);
	}
	for (int ti = 0; ti < OPS_KQ_N; ti++)
		check_kq_tiles(kq_types[ti], true);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("ops_kq");
	TCase *tc = tcase_create("kquant");
	SRunner *sr;
	int failed;

	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_hand_q2_k);
	tcase_add_test(tc, test_hand_q3_k);
	tcase_add_test(tc, test_hand_q4_k);
	tcase_add_test(tc, test_hand_q5_k);
	tcase_add_test(tc, test_hand_q6_k);
	tcase_add_test(tc, test_pack_roundtrip);
	tcase_add_test(tc, test_dot_vs_dequant);
	tcase_add_test(tc, test_simd_tables);
	tcase_add_test(tc, test_dot_extremes);
	tcase_add_test(tc, test_q8_k_activations);
	tcase_add_test(tc, test_quantizer_error);
	tcase_add_test(tc, test_matmul_kq);
	tcase_add_test(tc, test_kq_tiles);
	tcase_add_test(tc, test_q8_k_prepare_exact);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
