/* bench_kq.c - speed of the K-quant dot kernels alone, GB/s of weights.
 *
 *   bench_kq [--runs N] [--rows R] [--cols C] [--only q2_k|q3_k|...]
 *
 * For each K-quant type and each kernel table this CPU runs (scalar only
 * with --scalar, it is ~50x slower), one thread dots every row of an R x C
 * matrix (default 4096 x 4096, random weights through kvd's quantizer)
 * with one prepared activation row, N times (default 15). It prints the
 * median GB/s (weight bytes read per second) with the fastest and slowest
 * run, and checks that every table's sums equal the scalar kernel's bit
 * for bit (a mismatch is reported and makes the exit status 1). The
 * 4096 x 4096 matrices are 5-13 MiB, so they are read mostly from L3: the
 * figure is the kernel's compute speed, not DRAM bandwidth.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu/cpu/ops_cpu.h"
#include "gpu/cpu/ops_kq.h"

static const enum ggml_type kq_types[OPS_KQ_N] = {
	GGML_TYPE_Q2_K, GGML_TYPE_Q3_K, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K,
};

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static float rnd(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (float)((rng >> 40) & 0xffffff) / (float)0x800000 - 1.0f;
}

/* Dots of all rows into out (rows); returns the seconds it took. */
static double pass(ops_kq_dot_fn dot, const uint8_t *w, size_t row_bytes,
		   uint32_t rows, uint32_t cols, const struct ops_block_q8_k *xq,
		   float *out)
{
	double t0 = now_s();

	for (uint32_t r = 0; r < rows; r++)
		out[r] = dot(w + (size_t)r * row_bytes, xq, cols);
	return now_s() - t0;
}

static void usage(void)
{
	fprintf(stderr, "usage: bench_kq [--runs N] [--rows R] [--cols C] "
			"[--only TYPE] [--scalar]\n");
}

int main(int argc, char **argv)
{
	uint32_t rows = 4096, cols = 4096;
	int runs = 15, scalar = 0, bad = 0;
	const char *only = NULL;
	const struct ops_kernels *tabs[4];
	int n_tabs = 0;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--runs") && i + 1 < argc)
			runs = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--rows") && i + 1 < argc)
			rows = (uint32_t)strtoul(argv[++i], NULL, 10);
		else if (!strcmp(argv[i], "--cols") && i + 1 < argc)
			cols = (uint32_t)strtoul(argv[++i], NULL, 10);
		else if (!strcmp(argv[i], "--only") && i + 1 < argc)
			only = argv[++i];
		else if (!strcmp(argv[i], "--scalar"))
			scalar = 1;
		else {
			usage();
			return 2;
		}
	}
	if (runs < 1 || runs > 1000 || rows < 1 || rows > 65536 || cols < OPS_QK_K ||
	    cols % OPS_QK_K || cols > (1u << 20)) {
		fprintf(stderr, "bench_kq: runs 1..1000, rows 1..65536, cols a multiple "
				"of 256 up to 2^20\n");
		return 2;
	}
	if (scalar)
		tabs[n_tabs++] = ops_kernels_scalar();
	if (ops_kernels_avx2())
		tabs[n_tabs++] = ops_kernels_avx2();
	if (ops_kernels_avx512())
		tabs[n_tabs++] = ops_kernels_avx512();
	if (ops_kernels_avx512vnni())
		tabs[n_tabs++] = ops_kernels_avx512vnni();

	float *src = malloc((size_t)cols * sizeof(float));
	float *x = malloc((size_t)cols * sizeof(float));
	float *ref = malloc((size_t)rows * sizeof(float));
	float *got = malloc((size_t)rows * sizeof(float));
	struct ops_block_q8_k *xq = malloc((size_t)cols / OPS_QK_K * sizeof(*xq));
	double *sec = malloc((size_t)runs * sizeof(double));

	if (!src || !x || !ref || !got || !xq || !sec) {
		fprintf(stderr, "bench_kq: out of memory\n");
		return 1;
	}
	for (uint32_t j = 0; j < cols; j++)
		x[j] = rnd();
	ops_q8_k_quantize(x, cols, xq);
	printf("K-quant dot kernels: %u x %u, 1 thread, %d runs; GB/s of weights, "
	       "median [min, max]\n", rows, cols, runs);
	for (int ti = 0; ti < OPS_KQ_N; ti++) {
		enum ggml_type t = kq_types[ti];
		size_t row_bytes = ggml_type_nbytes(t, cols);
		uint8_t *w;

		if (only && strcmp(only, ggml_type_name(t)))
			continue;
		w = malloc(row_bytes * rows);
		if (!w) {
			fprintf(stderr, "bench_kq: out of memory\n");
			return 1;
		}
		/* one random source row reused with a per-row twist keeps setup
		 * short; the quantizer still sees different values per row */
		for (uint32_t r = 0; r < rows; r++) {
			for (uint32_t j = 0; j < cols; j++)
				src[j] = rnd() * (1.0f + (float)(r % 7));
			ops_kq_quantize_row(t, src, cols, w + (size_t)r * row_bytes);
		}
		pass(ops_kq_dot_scalar[ti], w, row_bytes, rows, cols, xq, ref);
		printf("%-5s", ggml_type_name(t));
		for (int k = 0; k < n_tabs; k++) {
			double gb = (double)row_bytes * rows * 1e-9;

			pass(tabs[k]->dot_kq[ti], w, row_bytes, rows, cols, xq, got);
			if (memcmp(ref, got, rows * sizeof(float))) {
				printf("  %s: MISMATCH vs scalar", tabs[k]->name);
				bad = 1;
				continue;
			}
			for (int r = 0; r < runs; r++)
				sec[r] = pass(tabs[k]->dot_kq[ti], w, row_bytes, rows, cols,
					      xq, got);
			qsort(sec, (size_t)runs, sizeof(double), cmp_double);
			printf("  %s %6.2f [%.2f, %.2f]", tabs[k]->name,
			       gb / sec[runs / 2], gb / sec[runs - 1], gb / sec[0]);
		}
		printf("\n");
		fflush(stdout);
		free(w);
	}
	free(src);
	free(x);
	free(ref);
	free(got);
	free(xq);
	free(sec);
	return bad;
}
