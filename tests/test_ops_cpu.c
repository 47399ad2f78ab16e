/* test_ops_cpu.c - every CPU kernel against a plain double-precision
 * reference on random inputs, for the scalar table and (when the CPU has
 * it) the AVX2 table; plus the invariances the engine relies on (a row's
 * result does not depend on how rows or tokens are grouped, attention does
 * not depend on the page layout).
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu/cpu/ops_cpu.h"
#include "gpu/sampler.h"
#include "gpu/cpu/threadpool.h"

/* xorshift for reproducible inputs */
static uint64_t rng_state = 0x1234567887654321ull;

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

static void fill(float *x, size_t n, float scale)
{
	for (size_t i = 0; i < n; i++)
		x[i] = rnd() * scale;
}

static const struct ops_kernels *tables[4];
static int n_tables;

static void setup_tables(void)
{
	n_tables = 0;
	tables[n_tables++] = ops_kernels_scalar();
	if (ops_kernels_avx2())
		tables[n_tables++] = ops_kernels_avx2();
	if (ops_kernels_avx512())
		tables[n_tables++] = ops_kernels_avx512();
	if (ops_kernels_avx512vnni())
		tables[n_tables++] = ops_kernels_avx512vnni();
}

/* ---- half precision ---------------------------------------------------- */

START_TEST(test_f16_roundtrip)
{
	for (uint32_t h = 0; h < 65536; h++) {
		float f = ops_f16_to_f32((uint16_t)h);

		if (isnan(f))
			continue;
		ck_assert_uint_eq(ops_f32_to_f16(f), h);
	}
	/* rounding: halfway cases go to even, overflow to inf */
	ck_assert_uint_eq(ops_f32_to_f16(1.0f + 1.0f / 2048), 0x3c00);
	ck_assert_uint_eq(ops_f32_to_f16(1.0f + 3.0f / 2048), 0x3c02);
	ck_assert_uint_eq(ops_f32_to_f16(65520.0f), 0x7c00);
	ck_assert_uint_eq(ops_f32_to_f16(65519.0f), 0x7bff);
	ck_assert_uint_eq(ops_f32_to_f16(-0.0f), 0x8000);
	ck_assert_uint_eq(ops_f32_to_f16(5.9604645e-08f), 0x0001);
}
END_TEST

START_TEST(test_f16_tables_agree)
{
	setup_tables();
	enum { N = 4099 };
	float *x = malloc(N * sizeof(float));
	uint16_t *a = malloc(N * 2), *b = malloc(N * 2);

	for (int i = 0; i < N; i++) {
		/* wide exponent range, subnormals included */
		x[i] = rnd() * ldexpf(1.0f, (int)(rng_next() % 40) - 26);
	}
	for (int t = 0; t < n_tables; t++) {
		tables[0]->f32_to_f16(a, x, N);
		tables[t]->f32_to_f16(b, x, N);
		ck_assert_int_eq(memcmp(a, b, N * 2), 0);
	}
	free(x);
	free(a);
	free(b);
}
END_TEST

/* ---- matmul per type ------------------------------------------------- */

/* Build a weight of `type` from f32 values; also return the dequantized
 * values the kernel should see. */
static void *make_weight(enum ggml_type type, const float *src, uint32_t rows,
			 uint32_t cols, float *deq, size_t *row_bytes)
{
	size_t rb;
	uint8_t *data;

	switch (type) {
	case GGML_TYPE_F32: rb = (size_t)cols * 4; break;
	case GGML_TYPE_F16: rb = (size_t)cols * 2; break;
	case GGML_TYPE_Q8_0: rb = (size_t)cols / 32 * 34; break;
	case GGML_TYPE_Q4_0: rb = (size_t)cols / 32 * 18; break;
	default: return NULL;
	}
	data = malloc(rb * rows);
	for (uint32_t r = 0; r < rows; r++) {
		const float *s = src + (size_t)r * cols;
		uint8_t *d = data + rb * r;

		if (type == GGML_TYPE_F32) {
			memcpy(d, s, rb);
		} else if (type == GGML_TYPE_F16) {
			for (uint32_t j = 0; j < cols; j++) {
				uint16_t h = ops_f32_to_f16(s[j]);

				memcpy(d + 2 * j, &h, 2);
			}
		} else {
			for (uint32_t b = 0; b < cols / 32; b++) {
				const float *sb = s + 32 * b;
				float amax = 0;

				for (int j = 0; j < 32; j++)
					amax = fmaxf(amax, fabsf(sb[j]));
				if (type == GGML_TYPE_Q8_0) {
					struct ops_block_q8_0 blk;
					float dd = amax / 127, id = dd ? 1 / dd : 0;

					blk.d = ops_f32_to_f16(dd);
					for (int j = 0; j < 32; j++)
						blk.qs[j] = (int8_t)roundf(sb[j] * id);
					memcpy(d + 34 * b, &blk, 34);
				} else {
					struct ops_block_q4_0 blk;
					float dd = amax / 7, id = dd ? 1 / dd : 0;

					blk.d = ops_f32_to_f16(dd);
					for (int j = 0; j < 16; j++) {
						int lo = (int)roundf(sb[j] * id) + 8;
						int hi = (int)roundf(sb[j + 16] * id) + 8;

						lo = lo < 0 ? 0 : lo > 15 ? 15 : lo;
						hi = hi < 0 ? 0 : hi > 15 ? 15 : hi;
						blk.qs[j] = (uint8_t)(lo | hi << 4);
					}
					memcpy(d + 18 * b, &blk, 18);
				}
			}
		}
	}
	{
		struct ops_mat m = { .type = type, .rows = rows, .cols = cols,
				     .row_bytes = rb, .data = data };

		for (uint32_t r = 0; r < rows; r++)
			ops_mat_row_f32(&m, r, deq + (size_t)r * cols);
	}
	*row_bytes = rb;
	return data;
}

/* One (row, token) through the table's dot for the type. */
static float dot_one(const struct ops_kernels *k, enum ggml_type type,
		     const void *w, const void *x, uint32_t cols)
{
	switch (type) {
	case GGML_TYPE_F32: return k->dot_f32(w, x, cols);
	case GGML_TYPE_F16: return k->dot_f16(w, x, cols);
	case GGML_TYPE_Q8_0: return k->dot_q8_0(w, x, cols);
	case GGML_TYPE_Q4_0: return k->dot_q4_0(w, x, cols);
	default: return NAN;
	}
}

/* Three tokens x, x + ab bytes, x + 2 ab bytes through the dot3 kernel. */
static void dot_three(const struct ops_kernels *k, enum ggml_type type,
		      const void *w, const void *x, size_t ab, uint32_t cols,
		      float *o)
{
	switch (type) {
	case GGML_TYPE_F32: k->dot3_f32(w, x, ab / 4, cols, o); break;
	case GGML_TYPE_F16: k->dot3_f16(w, x, ab / 4, cols, o); break;
	case GGML_TYPE_Q8_0: k->dot3_q8_0(w, x, ab / sizeof(struct ops_block_q8_act), cols, o); break;
	case GGML_TYPE_Q4_0: k->dot3_q4_0(w, x, ab / sizeof(struct ops_block_q8_act), cols, o); break;
	default: o[0] = o[1] = o[2] = NAN; break;
	}
}

static void check_matmul(enum ggml_type type, uint32_t rows, uint32_t cols,
			 uint32_t n)
{
	float *src = malloc(sizeof(float) * rows * cols);
	float *deq = malloc(sizeof(float) * rows * cols);
	float *x = malloc(sizeof(float) * n * cols);
	float *xd = malloc(sizeof(float) * n * cols); /* activations as the kernel sees them */
	size_t ab = ops_act_row_bytes(type, cols), rb = 0;
	uint8_t *act = malloc(ab * n);
	float *y = malloc(sizeof(float) * n * rows);
	float *y2 = malloc(sizeof(float) * n * rows);
	void *w;
	struct ops_mat m;

	fill(src, (size_t)rows * cols, 0.5f);
	fill(x, (size_t)n * cols, 2.0f);
	w = make_weight(type, src, rows, cols, deq, &rb);
	m = (struct ops_mat){ .type = type, .rows = rows, .cols = cols,
			      .row_bytes = rb, .data = w };
	for (uint32_t i = 0; i < n; i++) {
		ops_act_prepare(type, x + (size_t)i * cols, cols, act + ab * i);
		if (ops_act_class(type) == 1) {
			const struct ops_block_q8_act *qb = (const void *)(act + ab * i);

			for (uint32_t j = 0; j < cols; j++)
				xd[(size_t)i * cols + j] = qb[j / 32].qs[j % 32] * qb[j / 32].d;
		} else {
			memcpy(xd + (size_t)i * cols, x + (size_t)i * cols, cols * 4);
		}
	}
	for (int t = 0; t < n_tables; t++) {
		const struct ops_kernels *k = tables[t];

		ops_matmul_rows(k, &m, act, ab, n, y, rows, 0, rows);
		for (uint32_t i = 0; i < n; i++)
			for (uint32_t r = 0; r < rows; r++) {
				double ref = 0, mag = 0;

				for (uint32_t j = 0; j < cols; j++) {
					double p = (double)deq[(size_t)r * cols + j] *
						   xd[(size_t)i * cols + j];
					ref += p;
					mag += fabs(p);
				}
				ck_assert_msg(fabs(y[(size_t)i * rows + r] - ref) <=
						      1e-5 * mag + 1e-6,
					      "%s type %s r %u i %u: %g vs %g",
					      k->name, ggml_type_name(type), r, i,
					      y[(size_t)i * rows + r], ref);
			}
		/* grouping invariance: rows in uneven pieces, tokens one by
		 * one, must give the same bits */
		for (uint32_t i = 0; i < n; i++) {
			uint32_t r0 = 0;

			while (r0 < rows) {
				uint32_t r1 = r0 + 1 + (uint32_t)(rng_next() % 7);

				if (r1 > rows)
					r1 = rows;
				ops_matmul_rows(k, &m, act + ab * i, ab, 1,
						y2 + (size_t)i * rows, rows, r0, r1);
				r0 = r1;
			}
		}
		ck_assert_int_eq(memcmp(y, y2, sizeof(float) * n * rows), 0);
		/* the table's own weight layout (ops_mat_pack), when it has
		 * one: same bits, whole and in uneven row pieces one token at
		 * a time */
		{
			void *pk = NULL;
			struct ops_mat mp = m;

			ck_assert_int_eq(ops_mat_pack(k, &m, &pk), 0);
			if (!strcmp(k->name, "avx512vnni") &&
			    (type == GGML_TYPE_Q4_0 || type == GGML_TYPE_Q8_0))
				ck_assert_ptr_nonnull(pk);
			if (pk) {
				mp.packed = pk;
				memset(y2, 0xff, sizeof(float) * n * rows);
				ops_matmul_rows(k, &mp, act, ab, n, y2, rows, 0, rows);
				ck_assert_int_eq(memcmp(y, y2, sizeof(float) * n * rows), 0);
				memset(y2, 0xff, sizeof(float) * n * rows);
				for (uint32_t i = 0; i < n; i++)
					for (uint32_t r0 = 0, r1; r0 < rows; r0 = r1) {
						r1 = r0 + 1 + (uint32_t)(rng_next() % 6);
						if (r1 > rows)
							r1 = rows;
						ops_matmul_rows(k, &mp, act + ab * i, ab, 1,
								y2 + (size_t)i * rows, rows, r0, r1);
					}
				ck_assert_int_eq(memcmp(y, y2, sizeof(float) * n * rows), 0);
				/* the packed copy is read, not the file layout */
				mp.data = NULL;
				ops_matmul_rows(k, &mp, act, ab, n, y2, rows, 0, rows);
				ck_assert_int_eq(memcmp(y, y2, sizeof(float) * n * rows), 0);
				free(pk);
			}
		}
		/* the table's single-row dot and three-token dot (decode,
		 * attention) give the matmul's bits for every (row, token) */
		for (uint32_t r = 0; r < rows; r++) {
			const void *wr = (const uint8_t *)w + (size_t)r * rb;

			for (uint32_t i = 0; i < n; i++) {
				float v = dot_one(k, type, wr, act + ab * i, cols);

				ck_assert_msg(memcmp(&v, &y[(size_t)i * rows + r], 4) == 0,
					      "%s %s dot r %u i %u: %a vs %a", k->name,
					      ggml_type_name(type), r, i, v,
					      y[(size_t)i * rows + r]);
			}
			for (uint32_t i = 0; i + 3 <= n; i++) {
				float o[3];

				dot_three(k, type, wr, act + ab * i, ab, cols, o);
				for (int u = 0; u < 3; u++)
					ck_assert(memcmp(&o[u], &y[(size_t)(i + u) * rows + r], 4) == 0);
			}
		}
	}
	free(src);
	free(deq);
	free(x);
	free(xd);
	free(act);
	free(y);
	free(y2);
	free(w);
}

START_TEST(test_matmul_f32)
{
	setup_tables();
	check_matmul(GGML_TYPE_F32, 37, 96, 3);
	check_matmul(GGML_TYPE_F32, 5, 67, 2);   /* tails */
	check_matmul(GGML_TYPE_F32, 64, 8, 4);
	check_matmul(GGML_TYPE_F32, 7, 75, 7);   /* triples with every tail */
	/* register tiles: 4-row blocks and single rows, token blocks of
	 * 4 with remainders 1..3, every 16-lane tail */
	check_matmul(GGML_TYPE_F32, 11, 768, 6);
	check_matmul(GGML_TYPE_F32, 9, 33, 9);
	check_matmul(GGML_TYPE_F32, 6, 15, 10);
	/* prefill panels (ops_gemm.c, from 32 tokens: 6 rows x 4
	 * tokens, short last panel row by row; columns in chunks of at
	 * most 1024 with the accumulators parked, tokens 64 at a time,
	 * every row, token and column tail) */
	check_matmul(GGML_TYPE_F32, 13, 1049, 70);
	check_matmul(GGML_TYPE_F32, 20, 2064, 33);
	check_matmul(GGML_TYPE_F32, 17, 3001, 67);
	check_matmul(GGML_TYPE_F32, 11, 768, 34);
	check_matmul(GGML_TYPE_F32, 7, 75, 35);
	check_matmul(GGML_TYPE_F32, 12, 16, 32);
	check_matmul(GGML_TYPE_F32, 10, 40, 36);   /* last panels of 4 */
	check_matmul(GGML_TYPE_F32, 9, 130, 40);   /* and 3 rows */
}
END_TEST

START_TEST(test_matmul_f16)
{
	setup_tables();
	check_matmul(GGML_TYPE_F16, 37, 96, 3);
	check_matmul(GGML_TYPE_F16, 5, 67, 2);
	check_matmul(GGML_TYPE_F16, 16, 8, 1);
	check_matmul(GGML_TYPE_F16, 7, 75, 7);
	check_matmul(GGML_TYPE_F16, 11, 768, 6);
	check_matmul(GGML_TYPE_F16, 9, 33, 9);
	check_matmul(GGML_TYPE_F16, 6, 15, 10);
	check_matmul(GGML_TYPE_F16, 13, 1049, 70);
	check_matmul(GGML_TYPE_F16, 20, 2064, 33);
	check_matmul(GGML_TYPE_F16, 17, 3001, 67);
	check_matmul(GGML_TYPE_F16, 11, 768, 34);
	check_matmul(GGML_TYPE_F16, 7, 75, 35);
	check_matmul(GGML_TYPE_F16, 12, 16, 32);
	check_matmul(GGML_TYPE_F16, 10, 40, 36);   /* last panels of 4 */
	check_matmul(GGML_TYPE_F16, 9, 130, 40);   /* and 3 rows */
}
END_TEST

START_TEST(test_matmul_q8_0)
{
	setup_tables();
	check_matmul(GGML_TYPE_Q8_0, 37, 96, 3);
	check_matmul(GGML_TYPE_Q8_0, 9, 32, 2);   /* odd block count */
	check_matmul(GGML_TYPE_Q8_0, 11, 256, 5);
	/* register tiles: odd and even block counts, token remainders */
	check_matmul(GGML_TYPE_Q8_0, 13, 96, 6);
	check_matmul(GGML_TYPE_Q8_0, 9, 768, 9);
	check_matmul(GGML_TYPE_Q8_0, 5, 160, 10);
}
END_TEST

START_TEST(test_matmul_q4_0)
{
	setup_tables();
	check_matmul(GGML_TYPE_Q4_0, 37, 96, 3);
	check_matmul(GGML_TYPE_Q4_0, 9, 32, 2);
	check_matmul(GGML_TYPE_Q4_0, 11, 256, 5);
	check_matmul(GGML_TYPE_Q4_0, 13, 96, 6);
	check_matmul(GGML_TYPE_Q4_0, 9, 768, 9);
	check_matmul(GGML_TYPE_Q4_0, 5, 160, 10);
	/* avx512vnni: token passes with the block sums kept (cols 4096: 64
	 * tokens a pass), and none kept (cols 9216: the tiles sum them) */
	check_matmul(GGML_TYPE_Q4_0, 35, 4096, 70);
	check_matmul(GGML_TYPE_Q4_0, 17, 9216, 40);
}
END_TEST

START_TEST(test_q8_act_quantization)
{
	float x[64];
	struct ops_block_q8_act q[2];

	fill(x, 64, 3.0f);
	memset(x + 32, 0, 32 * sizeof(float)); /* an all-zero block */
	ops_act_prepare(GGML_TYPE_Q8_0, x, 64, q);
	for (int j = 0; j < 32; j++)
		ck_assert(fabsf(q[0].qs[j] * q[0].d - x[j]) <= q[0].d * 0.5f + 1e-6f);
	ck_assert(q[1].d == 0.0f);
	for (int j = 0; j < 32; j++)
		ck_assert_int_eq(q[1].qs[j], 0);
}
END_TEST

/* The q8 activation quantizer (vector on AVX-512, plain C otherwise)
 * against roundf/fmaxf byte for byte: random rows at many scales, exact
 * halves (which round away from zero), zeros and denormal-sized blocks. */
static void q8_reference(const float *x, uint32_t cols, struct ops_block_q8_act *o)
{
	for (uint32_t b = 0; b < cols / 32; b++) {
		float amax = 0.0f, d, id;

		for (int j = 0; j < 32; j++)
			amax = fmaxf(amax, fabsf(x[b * 32 + j]));
		d = amax / 127.0f;
		id = d != 0.0f ? 1.0f / d : 0.0f;
		o[b].d = d;
		for (int j = 0; j < 32; j++)
			o[b].qs[j] = (int8_t)roundf(x[b * 32 + j] * id);
	}
}

START_TEST(test_q8_act_quantization_exact)
{
	enum { COLS = 256, NB = COLS / 32 };
	float x[COLS];
	struct ops_block_q8_act ref[NB], vec[NB], sca[NB];
	static const float halves[] = { 0.5f, -0.5f, 1.5f, -1.5f, 2.5f, -2.5f,
					 126.5f, -126.5f, 63.5f, -0.49999997f };

	for (int rep = 0; rep < 2000; rep++) {
		float scale = ldexpf(1.0f, (int)(rng_next() % 60) - 40);

		fill(x, COLS, scale);
		if (rep % 5 == 0) {
			/* a block whose scale is exactly 1: x * id = x */
			for (int j = 0; j < 32; j++)
				x[j] = halves[j % 10] + (float)(int)(rng_next() % 3);
			x[31] = 127.0f;
		}
		if (rep % 7 == 0)
			memset(x + 32, 0, 32 * sizeof(float));
		if (rep % 11 == 0)
			x[70] = ldexpf(1.0f, -140); /* denormal among normals */
		q8_reference(x, COLS, ref);
		ops_act_prepare(GGML_TYPE_Q8_0, x, COLS, vec);
		ops_act_prepare_q8_scalar(x, COLS, sca);
		ck_assert_int_eq(memcmp(ref, vec, sizeof(ref)), 0);
		ck_assert_int_eq(memcmp(ref, sca, sizeof(ref)), 0);
	}
	/* the halves themselves: amax 127 gives d = 1 */
	for (int j = 0; j < 32; j++)
		x[j] = j < 10 ? halves[j] : 127.0f;
	ops_act_prepare(GGML_TYPE_Q4_0, x, 32, vec);
	ck_assert(vec[0].d == 1.0f);
	ck_assert_int_eq(vec[0].qs[0], 1);
	ck_assert_int_eq(vec[0].qs[1], -1);
	ck_assert_int_eq(vec[0].qs[2], 2);
	ck_assert_int_eq(vec[0].qs[3], -2);
	ck_assert_int_eq(vec[0].qs[4], 3);
	ck_assert_int_eq(vec[0].qs[5], -3);
	ck_assert_int_eq(vec[0].qs[6], 127);
	ck_assert_int_eq(vec[0].qs[7], -127);
	ck_assert_int_eq(vec[0].qs[8], 64);
	ck_assert_int_eq(vec[0].qs[9], 0);
}
END_TEST

/* The tables ops_kernels_pick chooses from: the fastest the CPU runs. */
START_TEST(test_pick_prefers_widest)
{
	const struct ops_kernels *k = ops_kernels_pick(true);

	ck_assert_ptr_eq(ops_kernels_pick(false), ops_kernels_scalar());
	if (ops_kernels_avx512vnni())
		ck_assert_str_eq(k->name, "avx512vnni");
	else if (ops_kernels_avx512())
		ck_assert_str_eq(k->name, "avx512");
	else if (ops_kernels_avx2())
		ck_assert_str_eq(k->name, "avx2");
	else
		ck_assert_str_eq(k->name, "scalar");
}
END_TEST

/* ---- elementwise ------------------------------------------------------- */

START_TEST(test_rmsnorm)
{
	enum { N = 77 };
	float x[N], g[N], y[N];
	double ss = 0;

	fill(x, N, 4.0f);
	fill(g, N, 1.0f);
	for (int j = 0; j < N; j++)
		ss += (double)x[j] * x[j];
	ops_rmsnorm(y, x, g, N, 1e-5f);
	for (int j = 0; j < N; j++) {
		double ref = x[j] / sqrt(ss / N + 1e-5) * g[j];

		ck_assert(fabs(y[j] - ref) <= 1e-5 * fabs(ref) + 1e-7);
	}
	/* in place */
	ops_rmsnorm(x, x, g, N, 1e-5f);
	ck_assert_int_eq(memcmp(x, y, sizeof(y)), 0);
}
END_TEST

START_TEST(test_softmax)
{
	enum { N = 300 };
	float x[N], y[N];
	double max = -1e30, sum = 0, tot = 0;

	fill(x, N, 30.0f);
	memcpy(y, x, sizeof(x));
	ops_softmax(y, N);
	for (int j = 0; j < N; j++)
		max = fmax(max, x[j]);
	for (int j = 0; j < N; j++)
		sum += exp(x[j] - max);
	for (int j = 0; j < N; j++) {
		double ref = exp(x[j] - max) / sum;

		ck_assert(fabs(y[j] - ref) <= 1e-5 * ref + 1e-9);
		tot += y[j];
	}
	ck_assert(fabs(tot - 1.0) < 1e-5);
	/* a single element and extreme values */
	x[0] = 1e30f;
	ops_softmax(x, 1);
	ck_assert(x[0] == 1.0f);
}
END_TEST

START_TEST(test_swiglu)
{
	float a[40], b[40], c[40];

	fill(a, 40, 6.0f);
	fill(b, 40, 2.0f);
	memcpy(c, a, sizeof(a));
	ops_swiglu(c, b, 40);
	for (int j = 0; j < 40; j++) {
		double ref = a[j] / (1.0 + exp(-(double)a[j])) * b[j];

		ck_assert(fabs(c[j] - ref) <= 1e-5 * fabs(ref) + 1e-6);
	}
}
END_TEST

START_TEST(test_rope)
{
	enum { H = 3, D = 16 };
	const uint32_t rope_dims[] = { 16, 8 };
	const uint32_t positions[] = { 0, 1, 7, 100, 511 };

	for (size_t a = 0; a < 2; a++)
		for (size_t b = 0; b < 5; b++) {
			uint32_t rd = rope_dims[a], pos = positions[b];
			float x[H * D], y[H * D], cs[D];

			fill(x, H * D, 1.0f);
			memcpy(y, x, sizeof(x));
			ops_rope_table(cs, pos, rd, 10000.0f, 0.5f);
			ops_rope_apply(y, H, D, rd, cs);
			for (int h = 0; h < H; h++)
				for (uint32_t i = 0; i < D / 2; i++) {
					float *xh = x + h * D, *yh = y + h * D;
					double th = pos * 0.5 * pow(10000.0, -2.0 * i / rd);
					double r0 = xh[2 * i], r1 = xh[2 * i + 1];

					if (2 * i < rd) {
						r0 = xh[2 * i] * cos(th) - xh[2 * i + 1] * sin(th);
						r1 = xh[2 * i] * sin(th) + xh[2 * i + 1] * cos(th);
					}
					ck_assert_msg(fabs(yh[2 * i] - r0) < 2e-4 &&
						      fabs(yh[2 * i + 1] - r1) < 2e-4,
						      "rope pos %u rd %u i %u", pos, rd, i);
				}
		}
}
END_TEST

/* NEOX mode rotates (x[i], x[i + rd/2]): the normal mode applied to the
 * head with those pairs moved next to each other. */
START_TEST(test_rope_neox)
{
	enum { H = 2, D = 16 };
	const uint32_t rope_dims[] = { 16, 8 };

	for (size_t a = 0; a < 2; a++) {
		uint32_t rd = rope_dims[a], half = rd / 2;
		float x[H * D], y[H * D], p[H * D], cs[D];

		fill(x, H * D, 1.0f);
		memcpy(y, x, sizeof(x));
		memcpy(p, x, sizeof(x));
		for (int h = 0; h < H; h++)
			for (uint32_t i = 0; i < half; i++) {
				p[h * D + 2 * i] = x[h * D + i];
				p[h * D + 2 * i + 1] = x[h * D + i + half];
			}
		ops_rope_table(cs, 37, rd, 10000.0f, 1.0f);
		ops_rope_apply_neox(y, H, D, rd, cs);
		ops_rope_apply(p, H, D, rd, cs);
		for (int h = 0; h < H; h++) {
			for (uint32_t i = 0; i < half; i++) {
				ck_assert(y[h * D + i] == p[h * D + 2 * i]);
				ck_assert(y[h * D + i + half] == p[h * D + 2 * i + 1]);
			}
			for (uint32_t i = rd; i < D; i++)
				ck_assert(y[h * D + i] == x[h * D + i]);
		}
	}
}
END_TEST

/* ---- attention over pages --------------------------------------------- */

/* Lay out n_pos positions of one layer (K and V, KVH kv heads x head_dim)
 * in pages of `pt` tokens, pages allocated in a shuffled order, with
 * garbage in between; run every query head (NH of them), one by one
 * (ops_attention_head) or a GQA group at a time (ops_attention_group,
 * `grouped`, its scores in rows longer than n_pos); compare with a
 * contiguous reference. */
static void run_attention_kv(const struct ops_kernels *k, enum kv_dtype dt,
			     uint32_t pt, uint32_t n_pos, const float *kk,
			     const float *vv, const float *q, float *out,
			     const uint32_t HD, const uint32_t KVH,
			     const uint32_t NH, bool grouped)
{
	enum { LAYERS = 2, LAYER = 1 };
	uint32_t kv_dim = KVH * HD, n_pages = (n_pos + pt - 1) / pt;
	uint32_t group = NH / KVH, stride = n_pos + 3;
	size_t elt = dt == KV_DTYPE_F16 ? 2 : 4;
	size_t block = (size_t)pt * kv_dim * elt;
	size_t page_bytes = 64 + 2 * LAYERS * block;
	uint8_t *arena = malloc(page_bytes * (n_pages + 3));
	uint8_t **pages = malloc(sizeof(*pages) * n_pages);
	uint32_t *perm = malloc(sizeof(*perm) * (n_pages + 3));
	float *scores = malloc(sizeof(*scores) * group * stride);
	struct ops_kv_view v;
	struct ops_att_next next;

	ck_assert_ptr_nonnull(arena);
	ck_assert_ptr_nonnull(scores);
	for (size_t i = 0; i < page_bytes * (n_pages + 3); i++)
		arena[i] = (uint8_t)rng_next(); /* stale bytes */
	for (uint32_t i = 0; i < group * stride; i++)
		scores[i] = NAN;
	for (uint32_t i = 0; i < n_pages + 3; i++)
		perm[i] = i;
	for (uint32_t i = n_pages + 2; i > 0; i--) {
		uint32_t j = (uint32_t)(rng_next() % (i + 1)), t = perm[i];

		perm[i] = perm[j];
		perm[j] = t;
	}
	for (uint32_t i = 0; i < n_pages; i++)
		pages[i] = arena + page_bytes * perm[i];
	v = (struct ops_kv_view){ .pages = pages, .page_tokens = pt,
				  .kv_dim = kv_dim, .dtype = dt,
				  .k_off = 64 + (2 * LAYER) * block,
				  .v_off = 64 + (2 * LAYER + 1) * block };
	for (uint32_t t = 0; t < n_pos; t++)
		ops_kv_store(k, &v, t, kk + t * kv_dim, vv + t * kv_dim);
	/* the next group's K/V prefetched while one is computed */
	next = (struct ops_att_next){ .kv = &v, .kv_head = 1, .n_pos = n_pos };
	if (grouped)
		for (uint32_t g = 0; g < KVH; g++, next.kv_head = g + 1)
			ops_attention_group(k, &v, q + g * group * HD, g, group, HD,
					    n_pos, 1.0f / sqrtf(HD), scores, stride,
					    out + g * group * HD,
					    g + 1 < KVH ? &next : NULL);
	else
		for (uint32_t h = 0; h < NH; h++)
			ops_attention_head(k, &v, q + h * HD, h / group, HD, n_pos,
					   1.0f / sqrtf(HD), scores, out + h * HD);
	free(arena);
	free(pages);
	free(perm);
	free(scores);
}

static void run_attention_hd(const struct ops_kernels *k, enum kv_dtype dt,
			     uint32_t pt, uint32_t n_pos, const float *kk,
			     const float *vv, const float *q, float *out,
			     const uint32_t HD)
{
	run_attention_kv(k, dt, pt, n_pos, kk, vv, q, out, HD, 2, 4, false);
}

static void run_attention(const struct ops_kernels *k, enum kv_dtype dt,
			  uint32_t pt, uint32_t n_pos, const float *kk,
			  const float *vv, const float *q, float *out)
{
	run_attention_hd(k, dt, pt, n_pos, kk, vv, q, out, 8);
}

/* The avx512vnni table's attention by page runs (its gemm for the
 * scores, axpy_rows for the V sum) gives the bits of the same table's
 * per-position dots and axpys (the table with both hooks removed), for
 * head dims that take it (multiples of 16) and one that does not, f32
 * and f16 KV, pages of 1, 3, 16 and 64 tokens. */
START_TEST(test_attention_runs)
{
	enum { KVH = 2, NH = 4, NPOS = 45, HDMAX = 128 };
	const uint32_t pts[] = { 1, 3, 16, 64 }, hds[] = { 16, 64, 80, 128, 24 };
	const struct ops_kernels *vn = ops_kernels_avx512vnni();
	static float kk[NPOS * KVH * HDMAX], vv[NPOS * KVH * HDMAX], q[NH * HDMAX];
	static float out[NH * HDMAX], ref[NH * HDMAX];
	struct ops_kernels plain;

	if (!vn) {
		printf("test_ops_cpu: no avx512vnni: attention runs not tested here\n");
		return;
	}
	ck_assert_ptr_nonnull(vn->axpy_rows);
	plain = *vn;
	plain.gemm = NULL;
	plain.axpy_rows = NULL;
	fill(kk, NPOS * KVH * HDMAX, 1.5f);
	fill(vv, NPOS * KVH * HDMAX, 1.0f);
	fill(q, NH * HDMAX, 1.5f);
	for (size_t h = 0; h < sizeof(hds) / sizeof(hds[0]); h++)
		for (int d = 0; d < 2; d++)
			for (size_t p = 0; p < 4; p++) {
				enum kv_dtype dt = d ? KV_DTYPE_F16 : KV_DTYPE_F32;

				memset(out, 0, sizeof(out));
				memset(ref, 0x7f, sizeof(ref));
				run_attention_hd(vn, dt, pts[p], NPOS, kk, vv, q, out, hds[h]);
				run_attention_hd(&plain, dt, pts[p], NPOS, kk, vv, q, ref, hds[h]);
				ck_assert_msg(memcmp(out, ref, sizeof(float) * NH * hds[h]) == 0,
					      "head dim %u %s pages of %u", hds[h],
					      d ? "f16" : "f32", pts[p]);
			}
}
END_TEST

/* A GQA group at a time (ops_attention_group: on the tables with a gemm,
 * one K row load for all the group's heads, its scores as one matmul of
 * group "tokens") gives every head the bits of ops_attention_head, on
 * every table: groups of 1, 2, 4 and 8 heads, head dims 16, 64, 128 and
 * 24 (no runs), f32 and f16 KV, pages of 1, 3, 16 and 64 tokens,
 * contexts across page edges. */
START_TEST(test_attention_group)
{
	enum { NPOS = 70, HDMAX = 128, NHMAX = 16 };
	const uint32_t pts[] = { 1, 3, 16, 64 }, hds[] = { 16, 64, 128, 24 };
	const uint32_t kvhs[] = { 4, 2, 2, 1 }, nhs[] = { 4, 4, 8, 8 };
	const uint32_t npos[] = { 1, 17, NPOS };
	static float kk[NPOS * NHMAX * HDMAX], vv[NPOS * NHMAX * HDMAX];
	static float q[NHMAX * HDMAX], out[NHMAX * HDMAX], ref[NHMAX * HDMAX];
	int checked = 0;

	setup_tables();
	fill(kk, NPOS * NHMAX * HDMAX, 1.5f);
	fill(vv, NPOS * NHMAX * HDMAX, 1.0f);
	fill(q, NHMAX * HDMAX, 1.5f);
	for (int t = 0; t < n_tables; t++)
		for (size_t h = 0; h < sizeof(hds) / sizeof(hds[0]); h++)
			for (size_t g = 0; g < sizeof(kvhs) / sizeof(kvhs[0]); g++)
				for (int d = 0; d < 2; d++)
					for (size_t p = 0; p < 4; p++)
						for (size_t n = 0; n < 3; n++) {
							enum kv_dtype dt = d ? KV_DTYPE_F16 : KV_DTYPE_F32;
							size_t bytes = sizeof(float) * nhs[g] * hds[h];

							memset(out, 0x7f, sizeof(out));
							memset(ref, 0, sizeof(ref));
							run_attention_kv(tables[t], dt, pts[p], npos[n], kk,
									 vv, q, out, hds[h], kvhs[g], nhs[g], true);
							run_attention_kv(tables[t], dt, pts[p], npos[n], kk,
									 vv, q, ref, hds[h], kvhs[g], nhs[g], false);
							ck_assert_msg(memcmp(out, ref, bytes) == 0,
								      "%s head dim %u group %u %s pages of %u n_pos %u",
								      tables[t]->name, hds[h], nhs[g] / kvhs[g],
								      d ? "f16" : "f32", pts[p], npos[n]);
							checked++;
						}
	ck_assert_int_eq(checked, n_tables * 4 * 4 * 2 * 4 * 3);
}
END_TEST

/* sampler_argmax (vector passes on AVX2) = the plain scan `best = i when
 * x[i] > x[best]`: random logits of many lengths, with ties (the first
 * wins), -0 next to +0, NaNs anywhere (x[0] included: nothing beats it),
 * infinities, the maximum in the tail and in the first and last lanes. */
static uint32_t argmax_ref(const float *x, uint32_t n)
{
	uint32_t best = 0;
	float m = x[0];   /* the best value so far: a NaN here stays */

	for (uint32_t i = 1; i < n; i++) {
		if (!(x[i] > m))
			continue;
		m = x[i];
		best = i;
	}
	return best;
}

START_TEST(test_sampler_argmax)
{
	enum { NMAX = 16000 };
	static float x[NMAX];
	const uint32_t lens[] = { 1, 2, 7, 63, 64, 65, 79, 80, 95, 127, 1000, 15999, NMAX };
	int checked = 0;

	for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++)
		for (int kind = 0; kind < 9; kind++)
			for (int rep = 0; rep < 6; rep++) {
				uint32_t n = lens[li], at = (uint32_t)(rng_next() % n);

				for (uint32_t i = 0; i < n; i++)
					x[i] = kind == 1 ? (float)(rng_next() % 4) - 2.0f : /* ties */
					       rnd() * 30.0f;
				switch (kind) {
				case 2: x[at] = NAN; break;
				case 3: x[0] = NAN; break;
				case 4: x[at] = INFINITY; x[(at * 7) % n] = INFINITY; break;
				case 5: /* all zeros, signs mixed: the first index */
					for (uint32_t i = 0; i < n; i++)
						x[i] = rng_next() & 1 ? 0.0f : -0.0f;
					break;
				case 6: x[n - 1] = 1e30f; break;          /* in the tail */
				case 7: x[n - 1 - (n - 1) % 16] = 1e30f; x[0] = 1e30f; break;
				case 8: /* NaNs everywhere but a few values */
					for (uint32_t i = 0; i < n; i++)
						x[i] = i % 5 ? NAN : x[i];
					x[0] = -INFINITY;
					break;
				}
				ck_assert_msg(sampler_argmax(x, n) == argmax_ref(x, n),
					      "n %u kind %d: %u != %u", n, kind,
					      sampler_argmax(x, n), argmax_ref(x, n));
				checked++;
			}
	ck_assert_int_eq(checked, 13 * 9 * 6);
}
END_TEST

START_TEST(test_attention_pages)
{
	enum { KVH = 2, HD = 8, NH = 4, NPOS = 45 };
	const uint32_t pts[] = { 1, 3, 16, 64 };
	float kk[NPOS * KVH * HD], vv[NPOS * KVH * HD], q[NH * HD];
	float out[NH * HD], first[NH * HD];

	setup_tables();
	fill(kk, NPOS * KVH * HD, 1.5f);
	fill(vv, NPOS * KVH * HD, 1.0f);
	fill(q, NH * HD, 1.5f);
	for (int t = 0; t < n_tables; t++)
		for (int d = 0; d < 2; d++) {
			enum kv_dtype dt = d ? KV_DTYPE_F16 : KV_DTYPE_F32;
			float kr[NPOS * KVH * HD], vr[NPOS * KVH * HD];

			/* the reference sees what the pages hold */
			for (int i = 0; i < NPOS * KVH * HD; i++) {
				kr[i] = dt == KV_DTYPE_F16 ? ops_f16_to_f32(ops_f32_to_f16(kk[i])) : kk[i];
				vr[i] = dt == KV_DTYPE_F16 ? ops_f16_to_f32(ops_f32_to_f16(vv[i])) : vv[i];
			}
			for (size_t p = 0; p < 4; p++) {
				run_attention(tables[t], dt, pts[p], NPOS, kk, vv, q, out);
				if (p == 0)
					memcpy(first, out, sizeof(out));
				else /* page layout never changes a bit */
					ck_assert_int_eq(memcmp(first, out, sizeof(out)), 0);
				for (int h = 0; h < NH; h++) {
					int kh = h / (NH / KVH);
					double s[NPOS], max = -1e30, sum = 0;

					for (int tt = 0; tt < NPOS; tt++) {
						s[tt] = 0;
						for (int j = 0; j < HD; j++)
							s[tt] += (double)q[h * HD + j] *
								 kr[(tt * KVH + kh) * HD + j];
						s[tt] /= sqrt(HD);
						max = fmax(max, s[tt]);
					}
					for (int tt = 0; tt < NPOS; tt++)
						sum += s[tt] = exp(s[tt] - max);
					for (int j = 0; j < HD; j++) {
						double ref = 0;

						for (int tt = 0; tt < NPOS; tt++)
							ref += s[tt] / sum * vr[(tt * KVH + kh) * HD + j];
						ck_assert_msg(fabs(out[h * HD + j] - ref) < 1e-5,
							      "%s dt %d pt %u h %d j %d: %g vs %g",
							      tables[t]->name, d, pts[p], h, j,
							      out[h * HD + j], ref);
					}
				}
			}
		}
}
END_TEST

/* ---- threadpool -------------------------------------------------------- */

struct tp_check {
	uint32_t n;
	uint32_t threads;
	uint32_t *hits; /* (n) */
};

static void tp_part(void *arg, uint32_t chunk, uint32_t n_chunks, uint32_t thread)
{
	struct tp_check *c = arg;
	uint32_t b, e;

	ck_assert_uint_lt(thread, c->threads);
	threadpool_split(c->n, chunk, n_chunks, &b, &e);
	for (uint32_t i = b; i < e; i++)
		__atomic_fetch_add(&c->hits[i], 1, __ATOMIC_RELAXED);
}

START_TEST(test_threadpool)
{
	for (uint32_t th = 1; th <= 4; th++) {
		struct threadpool *tp;
		uint32_t hits[1000] = { 0 };
		struct tp_check c = { .n = 1000, .threads = th, .hits = hits };

		ck_assert_int_eq(threadpool_new(&tp, th), 0);
		ck_assert_uint_eq(threadpool_size(tp), th);
		for (int r = 0; r < 500; r++)
			threadpool_run(tp, tp_part, &c, 1 + r % 13);
		for (int i = 0; i < 1000; i++)
			ck_assert_uint_eq(hits[i], 500);
		threadpool_free(tp);
	}
}
END_TEST

/* Chunks that take a while (so both threads get some) and count, per
 * thread, how many each ran. */
struct tp_slow {
	uint32_t threads;
	uint32_t ran[4];
};

static void tp_slow_part(void *arg, uint32_t chunk, uint32_t n_chunks, uint32_t thread)
{
	struct tp_slow *c = arg;
	volatile uint32_t sink = 0;

	(void)chunk;
	(void)n_chunks;
	ck_assert_uint_lt(thread, c->threads);
	for (uint32_t i = 0; i < 200000; i++)
		sink += i;
	__atomic_fetch_add(&c->ran[thread], 1, __ATOMIC_RELAXED);
}

static void sleep_us(long us)
{
	struct timespec ts = { .tv_sec = us / 1000000, .tv_nsec = us % 1000000 * 1000 };

	nanosleep(&ts, NULL);
}

/* Workers that went to sleep between runs are woken for the next one (the
 * caller counts a wake), none is lost when runs come around the moment a
 * worker gives up spinning, and a woken worker takes chunks again. */
START_TEST(test_threadpool_sleep_wake)
{
	struct threadpool *tp;
	struct threadpool_stats st0, st1;
	struct tp_slow c = { .threads = 2 };
	uint32_t hits[1000] = { 0 };
	struct tp_check chk = { .n = 1000, .threads = 2, .hits = hits };
	bool woke = false, helped = false;
	uint32_t n_part = 0;

	ck_assert_int_eq(threadpool_new(&tp, 2), 0);
	threadpool_stats(tp, &st0);
	ck_assert_uint_eq(st0.runs, 0);
	/* long pauses: the worker sleeps, the next run must wake it (tries,
	 * because on a loaded machine it may not have run at all meanwhile) */
	for (int t = 0; t < 200 && !woke; t++) {
		threadpool_run(tp, tp_part, &chk, 4);
		sleep_us(5000);
		threadpool_stats(tp, &st0);
		threadpool_run(tp, tp_part, &chk, 4);
		threadpool_stats(tp, &st1);
		n_part += 2;
		ck_assert_uint_eq(st1.runs, st0.runs + 1);
		woke = st1.wakes > st0.wakes;
	}
	ck_assert_msg(woke, "no run ever found the worker asleep");
	/* pauses around the spin limit (0.1 .. 1.5 ms): every run completes */
	for (int r = 0; r < 300; r++) {
		threadpool_run(tp, tp_part, &chk, 1 + r % 7);
		n_part++;
		sleep_us(100 + (r * 37) % 1400);
	}
	/* the worker still answers: slow chunks, and it runs some of them */
	for (int t = 0; t < 500 && !helped; t++) {
		sleep_us(t % 2 ? 2000 : 0);
		threadpool_run(tp, tp_slow_part, &c, 16);
		helped = c.ran[1] > 0;
	}
	ck_assert_msg(helped, "the worker never ran a chunk after sleeping");
	for (int i = 0; i < 1000; i++)
		ck_assert_uint_eq(hits[i], n_part);
	threadpool_free(tp);
}
END_TEST

static Suite *ops_suite(void)
{
	Suite *s = suite_create("ops_cpu");
	TCase *tc = tcase_create("kernels");

	tcase_add_test(tc, test_f16_roundtrip);
	tcase_add_test(tc, test_f16_tables_agree);
	tcase_add_test(tc, test_matmul_f32);
	tcase_add_test(tc, test_matmul_f16);
	tcase_add_test(tc, test_matmul_q8_0);
	tcase_add_test(tc, test_matmul_q4_0);
	tcase_add_test(tc, test_q8_act_quantization);
	tcase_add_test(tc, test_q8_act_quantization_exact);
	tcase_add_test(tc, test_pick_prefers_widest);
	tcase_add_test(tc, test_rmsnorm);
	tcase_add_test(tc, test_softmax);
	tcase_add_test(tc, test_swiglu);
	tcase_add_test(tc, test_rope);
	tcase_add_test(tc, test_rope_neox);
	tcase_add_test(tc, test_attention_pages);
	tcase_add_test(tc, test_attention_runs);
	tcase_add_test(tc, test_attention_group);
	tcase_add_test(tc, test_sampler_argmax);
	tcase_add_test(tc, test_threadpool);
	tcase_add_test(tc, test_threadpool_sleep_wake);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(ops_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
