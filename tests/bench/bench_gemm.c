/* bench_gemm.c - one matmul per weight type through every kernel table
 * the CPU runs, interleaved, on one thread.
 *
 *   bench_gemm [--rounds N] [--rows R] [--cols C] [--tokens T]
 *              [--type NAME] [--table NAME]
 *
 * For F32, F16, Q8_0, Q4_0 and (when C is a multiple of 256) Q2_K..Q6_K
 * weights of R x C (default 2048 x 768, the 100M model's gate/up shape)
 * it times ops_matmul_rows over
 *   prefill  64 tokens (--tokens; GFLOP/s, 2 flops per multiply-add)
 *   decode    1 token  (GB/s of weight bytes read)
 * and the q8 activation quantization of 64 rows (M values/s). Each round
 * runs every table once in turn (so a noisy neighbour hits all of them
 * alike); the figure printed is the median over rounds with the min-max
 * range. A table with a weight layout of its own (ops_mat_pack: Q4_0 on
 * avx512vnni) runs on its packed copy, as the engine does. Prints
 * figures; never fails on speed. --type (e.g. f16) and --table (e.g.
 * avx512vnni) keep only that weight type / that table (and the scalar
 * one, which is always run on 4 tokens), for profiling one kernel.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conf/util.h"
#include "gpu/cpu/ops_cpu.h"

#define MAX_ROUNDS 64

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static float rnd(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* The weight in `type`, rows x cols, from random values. */
static void *make_weight(enum ggml_type type, uint32_t rows, uint32_t cols,
			 size_t *row_bytes)
{
	size_t rb = type == GGML_TYPE_F32 ? cols * 4u
		  : type == GGML_TYPE_F16 ? cols * 2u
		  : type == GGML_TYPE_Q8_0 ? cols / 32 * 34u
		  : type == GGML_TYPE_Q4_0 ? cols / 32 * 18u
		  : ggml_type_nbytes(type, cols);
	uint8_t *d = malloc(rb * rows);

	if (ops_kq_is(type)) { /* K-quants: kvd's quantizer on random rows */
		float *src = malloc(sizeof(float) * cols);

		for (uint32_t r = 0; r < rows; r++) {
			for (uint32_t j = 0; j < cols; j++)
				src[j] = rnd();
			ops_kq_quantize_row(type, src, cols, d + (size_t)r * rb);
		}
		free(src);
		*row_bytes = rb;
		return d;
	}

	for (size_t i = 0; i < rb * rows; i++)
		d[i] = (uint8_t)(int)(rnd() * 127.0f);
	/* scales (every block's first two bytes for Q8_0/Q4_0; any half
	 * for F16) kept small and finite */
	if (type == GGML_TYPE_F16) {
		for (size_t i = 0; i < rb * rows / 2; i++) {
			uint16_t h = ops_f32_to_f16(rnd());

			memcpy(d + 2 * i, &h, 2);
		}
	} else if (type == GGML_TYPE_F32) {
		for (size_t i = 0; i < rb * rows / 4; i++) {
			float f = rnd();

			memcpy(d + 4 * i, &f, 4);
		}
	} else {
		size_t bs = type == GGML_TYPE_Q8_0 ? 34 : 18;

		for (size_t i = 0; i < rb * rows / bs; i++) {
			uint16_t h = ops_f32_to_f16(0.01f);

			memcpy(d + bs * i, &h, 2);
		}
	}
	*row_bytes = rb;
	return d;
}

struct stat3 {
	double v[MAX_ROUNDS];
	int n;
};

static void stat_print(const char *what, const struct stat3 *s, const char *unit)
{
	double v[MAX_ROUNDS];

	memcpy(v, s->v, sizeof(double) * s->n);
	qsort(v, s->n, sizeof(double), cmp_d);
	printf("  %-8s %8.1f %s  [%.1f .. %.1f]", what, v[s->n / 2], unit, v[0],
	       v[s->n - 1]);
}

int main(int argc, char **argv)
{
	uint32_t rounds = 11, rows = 2048, cols = 768, ntok = 64;
	const char *only_type = NULL, *only_table = NULL;
	const struct ops_kernels *tabs[4];
	int nt = 0;
	const enum ggml_type types[] = { GGML_TYPE_F32, GGML_TYPE_F16,
					 GGML_TYPE_Q8_0, GGML_TYPE_Q4_0,
					 GGML_TYPE_Q2_K, GGML_TYPE_Q3_K,
					 GGML_TYPE_Q4_K, GGML_TYPE_Q5_K,
					 GGML_TYPE_Q6_K };

	for (int i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--rounds"))
			rounds = (uint32_t)atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--rows"))
			rows = (uint32_t)atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--cols"))
			cols = (uint32_t)atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--tokens"))
			ntok = (uint32_t)atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--type"))
			only_type = argv[i + 1];
		else if (!strcmp(argv[i], "--table"))
			only_table = argv[i + 1];
	}
	if (rounds < 1 || rounds > MAX_ROUNDS || rows < 1 || cols < 32 ||
	    cols % 32 || ntok < 4 || ntok > 4096) {
		fprintf(stderr, "bench_gemm: rounds 1..%d, rows >= 1, cols a multiple of 32, tokens 4..4096\n",
			MAX_ROUNDS);
		return 2;
	}
	tabs[nt++] = ops_kernels_scalar();
	{
		const struct ops_kernels *more[] = { ops_kernels_avx2(),
						     ops_kernels_avx512(),
						     ops_kernels_avx512vnni() };

		for (size_t i = 0; i < KVD_ARRAY_SIZE(more); i++)
			if (more[i] && (!only_table || !strcmp(only_table, more[i]->name)))
				tabs[nt++] = more[i];
	}
	printf("matmul %u x %u, %u tokens (prefill) and 1 (decode), %u rounds, median [min .. max]\n",
	       rows, cols, ntok, rounds);
	for (size_t ti = 0; ti < KVD_ARRAY_SIZE(types); ti++) {
		enum ggml_type type = types[ti];

		if (ops_kq_is(type) && cols % OPS_QK_K) /* K-quants: cols % 256 */
			continue;
		if (only_type && strcmp(only_type, ggml_type_name(type)))
			continue;
		size_t rb, ab = ops_act_row_bytes(type, cols);
		void *w = make_weight(type, rows, cols, &rb);
		float *x = malloc(sizeof(float) * ntok * cols);
		uint8_t *act = malloc(ab * ntok);
		float *y = malloc(sizeof(float) * ntok * rows);
		struct ops_mat m = { .type = type, .rows = rows, .cols = cols,
				     .row_bytes = rb, .data = w };
		struct stat3 pf[4] = { 0 }, dc[4] = { 0 };

		for (size_t i = 0; i < (size_t)ntok * cols; i++)
			x[i] = rnd();
		for (uint32_t i = 0; i < ntok; i++)
			ops_act_prepare(type, x + (size_t)i * cols, cols, act + ab * i);
		for (uint32_t r = 0; r < rounds; r++) {
			for (int k = 0; k < nt; k++) {
				/* the scalar table is slow: fewer tokens */
				uint32_t n = k == 0 ? 4 : ntok;
				uint64_t t0, t1, t2;
				struct ops_mat mk = m;
				void *pk = NULL;

				/* the table's own layout, as the engine binds it */
				if (ops_mat_pack(tabs[k], &m, &pk))
					return 1;
				mk.packed = pk;
				t0 = kvd_now_ns();
				ops_matmul_rows(tabs[k], &mk, act, ab, n, y, rows, 0, rows);
				t1 = kvd_now_ns();
				for (int rep = 0; rep < 8; rep++)
					ops_matmul_rows(tabs[k], &mk, act, ab, 1, y, rows, 0, rows);
				t2 = kvd_now_ns();
				free(pk);
				pf[k].v[pf[k].n++] = 2.0 * rows * cols * n / (double)(t1 - t0);
				dc[k].v[dc[k].n++] = 8.0 * rb * rows / (double)(t2 - t1);
			}
		}
		printf("%s (%.1f MiB)\n", ggml_type_name(type), rb * rows / 1048576.0);
		for (int k = 0; k < nt; k++) {
			printf(" %-11s", tabs[k]->name);
			stat_print("prefill", &pf[k], "GFLOP/s");
			stat_print("decode", &dc[k], "GB/s");
			printf("\n");
		}
		free(w);
		free(x);
		free(act);
		free(y);
	}
	{
		/* activation quantization: ops_act_prepare (vector where the
		 * CPU has AVX-512) vs the plain C quantizer */
		float *x = malloc(sizeof(float) * ntok * cols);
		struct ops_block_q8_act *q = malloc(sizeof(*q) * (cols / 32) * ntok);
		struct stat3 sv = { 0 }, ss = { 0 };

		for (size_t i = 0; i < (size_t)ntok * cols; i++)
			x[i] = rnd();
		for (uint32_t r = 0; r < rounds; r++) {
			uint64_t t0 = kvd_now_ns(), t1, t2;

			for (uint32_t i = 0; i < ntok; i++)
				ops_act_prepare(GGML_TYPE_Q8_0, x + (size_t)i * cols, cols,
						q + (size_t)i * (cols / 32));
			t1 = kvd_now_ns();
			for (uint32_t i = 0; i < ntok; i++)
				ops_act_prepare_q8_scalar(x + (size_t)i * cols, cols,
							  q + (size_t)i * (cols / 32));
			t2 = kvd_now_ns();
			sv.v[sv.n++] = 1e3 * ntok * cols / (double)(t1 - t0);
			ss.v[ss.n++] = 1e3 * ntok * cols / (double)(t2 - t1);
		}
		printf("q8 activation quantization\n");
		stat_print("prepare", &sv, "Mvalues/s");
		stat_print("plain C", &ss, "Mvalues/s");
		printf("\n");
		free(x);
		free(q);
	}
	return 0;
}
