/* bench_engine.c - prefill and decode speed of the CPU engine, and decode
 * against the memory-bandwidth bound.
 *
 *   bench_engine [--quick] [--no-bound] [--runs N] [--threads 1|2]
 *                [--only f32|f16|q8_0|q4_k|q6_k|...] [--model FILE]
 *   bench_engine --model FILE --raw N [--threads T]
 *   bench_engine --batch [--model FILE] [--sizes 1,4,8,16,32] [--steps S]
 *                [--runs N] [--threads T] [--no-split]
 *
 * --raw N runs FILE N times at T threads (default 1), a 128-token prompt
 * and 64 decoded tokens each, and prints one line per run,
 * "prefill_tps decode_tps", for a script to take medians and spreads
 * (tests/bench/bench_types.sh).
 *
 * Models: stories260K ($KVD_SHARED/models, when present) and a generated
 * ~100M-parameter llama (12 layers, dim 768, 12 heads, 4 KV heads, ff
 * 2048, vocab 16000) in F32, F16, Q8_0, Q4_0 and Q2_K..Q6_K, written to a temporary
 * directory and deleted afterwards (never committed). For each model and
 * thread count (1, 2):
 *   prefill tok/s  a 128-token prompt in one chunk
 *   decode tok/s   32 greedy tokens after it, one request
 *   bound tok/s    copy bandwidth / weight bytes one decoded token reads,
 *                  the copy bandwidth measured in this run, just before,
 *                  with the same thread count (memcpy of 256 MiB, the
 *                  median of 5)
 * Each speed is the median of --runs runs (default 5) with the slowest and
 * fastest run in brackets: a best-of-N figure hides the spread a loaded
 * machine gives.
 *   ratio          decode / bound (target >= 0.70 at 2 threads, 100M)
 *   integrity      share of decode step time spent verifying and writing
 *                  the integrity tags (engine_timing; target < 1%)
 * Prints figures; never fails on speed.
 *
 * --batch: the cost of one decode-only step of D sequences (the serving
 * scheduler's inter-token latency). FILE, or the serving benchmark's
 * model (tests/bench/sched.sh: llama, 4 layers, dim 512, 8 heads / 4 KV
 * heads, ff 1536, vocab 16000, Q8_0, seed 5) generated into a temporary
 * directory; KV in F16 pages of 16 tokens, as a node's defaults. For
 * threads 1 and 2 (or T) and each D of --sizes: D requests with distinct
 * 128-token prompts are prefilled in one step (max_batch D, step_tokens
 * 128 D), then, after 2 untimed decode steps, S (default 32) decode-only
 * steps with all D decoding (contexts 130..130+S) are each timed; --runs
 * N (default 5) repeats that on a fresh engine and pools the step times.
 * Prints the median, fastest and slowest step (ms), the median per
 * sequence, the median CPU time of a step (this process, all threads:
 * at 1 thread the step's work without the time other processes took the
 * CPU, the steadier figure on a loaded machine) and per sequence, and
 * where the steps' time went (engine_prof, the mean over the timed
 * steps, in ms per step; at 1 thread the backend's parts in the thread's
 * CPU time, engine_params.prof_cpu, at 2 in wall time): layer matmuls,
 * attention, the per-token steps, the logits (final norm + output
 * matmul), the integrity checks, sampling (both wall time), and the rest
 * (the engine's own work; at 2 threads also waiting outside those).
 * The CPU-time split reads the thread's CPU clock, a system call, ~40
 * times a step (~0.05-0.1 ms a step here); --no-split keeps every
 * figure in wall time, for timing the steps themselves.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "conf/util.h"
#include "gpu/engine.h"
#include "gpu/model/gguf_gen.h"
#include "gpu/kv/kvmem.h"
#include "gpu/kv/kvpool.h"
#include "gpu/model/model.h"

/* ---- copy bandwidth ------------------------------------------------------ */

struct copy_part {
	uint8_t *dst;
	const uint8_t *src;
	size_t n;
};

static void *copy_main(void *p)
{
	struct copy_part *c = p;

	memcpy(c->dst, c->src, c->n);
	return NULL;
}

/* --no-bound: skip the copy-bandwidth measurement (bound and ratio 0);
 * --runs N: the median of N runs (default 5, at most MAX_RUNS);
 * --threads T: that count only */
enum { MAX_RUNS = 101 };
static bool no_bound;
static bool no_split;  /* --batch --no-split: engine_prof in wall time only */
static int n_runs = 5;
static uint32_t only_threads;

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/* The median of v[n] (sorts v; n >= 1). */
static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Bytes copied per second with `threads` threads each copying its share:
 * the median of 5 copies. */
static double copy_bandwidth(uint32_t threads)
{
	size_t n = (size_t)256 << 20;
	uint8_t *src = malloc(n), *dst = malloc(n);
	double rate[5];
	double bw;

	if (!src || !dst) {
		free(src);
		free(dst);
		return 0;
	}
	memset(src, 1, n);
	memset(dst, 2, n);
	for (int rep = 0; rep < 5; rep++) {
		pthread_t th[16];
		struct copy_part parts[16];
		uint64_t t0 = kvd_now_ns();
		double s;

		for (uint32_t i = 0; i < threads; i++) {
			size_t b = n / threads * i, e = i + 1 == threads ? n : n / threads * (i + 1);

			parts[i] = (struct copy_part){ dst + b, src + b, e - b };
			if (i > 0)
				pthread_create(&th[i], NULL, copy_main, &parts[i]);
		}
		copy_main(&parts[0]);
		for (uint32_t i = 1; i < threads; i++)
			pthread_join(th[i], NULL);
		s = (double)(kvd_now_ns() - t0) / 1e9;
		rate[rep] = n / s;
	}
	free(src);
	free(dst);
	bw = median(rate, 5);
	return bw;
}

/* ---- one model, one thread count ------------------------------------------ */

struct result {
	double prefill_tps;
	double decode_tps;
	double integrity_frac;   /* decode steps: tag checks / step time */
};

static int run_model(const struct model *m, uint32_t threads, uint32_t n_prompt,
		     uint32_t n_decode, struct result *res)
{
	struct kvmem mem;
	struct kvpool *pool;
	struct kvpool_geom g = { .page_tokens = 16, .n_layer = m->hp.n_layer,
				 .kv_dim = m->hp.n_head_kv * m->hp.head_dim,
				 .dtype = KV_DTYPE_F16 };
	struct engine_params ep = ENGINE_PARAMS_DEFAULT;
	struct engine *e;
	struct engine_req *r;
	int32_t *prompt = calloc(n_prompt, sizeof(*prompt));
	struct engine_req_params rp = {
		.owner = 1, .prompt = prompt, .n_prompt = n_prompt,
		.max_tokens = n_decode + 1, .sampling = SAMPLER_PARAMS_GREEDY,
		.ignore_eos = true };
	const struct engine_event *ev;
	size_t n_ev;
	uint64_t t0, t1, ig0, ig1, st0, st1;
	uint32_t decoded = 0;
	int rc;

	for (uint32_t i = 0; i < n_prompt; i++)
		prompt[i] = (int32_t)(1 + (i * 37) % (m->hp.n_vocab - 1));
	kvmem_host_init(&mem);
	rc = kvpool_new(&pool, &mem, &g, (n_prompt + n_decode) / 16 + 4);
	if (rc)
		goto out_prompt;
	ep.threads = threads;
	ep.max_batch = 1;
	ep.prefill_chunk = n_prompt;
	ep.n_ctx = n_prompt + n_decode + 8;
	rc = engine_new(&e, m, pool, &ep, NULL);
	if (rc)
		goto out_pool;
	rc = engine_submit(e, &rp, &r);
	if (rc)
		goto out_engine;
	t0 = kvd_now_ns();
	rc = engine_step(e, &ev, &n_ev); /* the whole prompt, first token */
	t1 = kvd_now_ns();
	if (rc)
		goto out_req;
	res->prefill_tps = n_prompt / ((double)(t1 - t0) / 1e9);
	engine_timing(e, &ig0, &st0);
	t0 = kvd_now_ns();
	while (!engine_idle(e)) {
		rc = engine_step(e, &ev, &n_ev);
		if (rc)
			goto out_req;
		decoded++;
	}
	t1 = kvd_now_ns();
	res->decode_tps = decoded / ((double)(t1 - t0) / 1e9);
	engine_timing(e, &ig1, &st1);
	res->integrity_frac = st1 > st0 ? (double)(ig1 - ig0) / (double)(st1 - st0) : 0;
out_req:
	engine_req_free(e, r);
out_engine:
	engine_free(e);
out_pool:
	kvpool_free(pool);
out_prompt:
	kvmem_deinit(&mem);
	free(prompt);
	return rc;
}

/* "median [min..max]" of v[n] into buf (sorts v). */
static const char *spread(char *buf, size_t size, double *v, int n)
{
	double med = median(v, n);

	snprintf(buf, size, "%.1f [%.1f..%.1f]", med, v[0], v[n - 1]);
	return buf;
}

/* n_runs runs, with the copy bandwidth measured right before (same thread
 * count), so both sides of the ratio see the same machine load; the
 * ratio is the median decode speed over that bound. */
static void bench_model(const char *label, const struct model *m,
			uint32_t n_prompt, uint32_t n_decode)
{
	for (uint32_t th = 1; th <= 2; th++) {
		double pre[MAX_RUNS], dec[MAX_RUNS], integ[MAX_RUNS];
		char pbuf[64], dbuf[64];
		double bw, bound, dmed;
		int rc = 0, n = 0;

		if (only_threads && th != only_threads)
			continue;
		bw = no_bound ? 0 : copy_bandwidth(th);
		for (; n < n_runs && !rc; n++) {
			struct result r = { 0 };

			rc = run_model(m, th, n_prompt, n_decode, &r);
			pre[n] = r.prefill_tps;
			dec[n] = r.decode_tps;
			integ[n] = r.integrity_frac;
		}
		if (rc) {
			printf("%-22s threads=%u error %d\n", label, th, rc);
			continue;
		}
		bound = bw / (double)m->decode_bytes;
		spread(pbuf, sizeof(pbuf), pre, n);
		spread(dbuf, sizeof(dbuf), dec, n);
		dmed = median(dec, n);
		printf("%-22s %8.1fM %9.1f %7u %24s %24s %9.2f %10.2f %7.2f %9.3f%%\n",
		       label, m->n_params / 1e6, m->decode_bytes / 1048576.0, th,
		       pbuf, dbuf, bw / 1e9, bound, bound > 0 ? dmed / bound : 0,
		       100.0 * median(integ, n));
	}
}

/* ---- --batch: decode steps of D sequences --------------------------------- */

enum { BATCH_PROMPT = 128, BATCH_WARM = 2, MAX_STEPS = 1024 };

/* One engine at `threads` with D requests prefilled, then `steps` timed
 * decode-only steps: their times (ms) appended to ms[*n_ms], their
 * engine_prof added to *sum. 0 or an error (also when a step was not
 * all D decoding). */
/* This process's CPU time (all threads), ns. */
static uint64_t cpu_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int batch_run(const struct model *m, uint32_t threads, uint32_t D,
		     uint32_t steps, double *ms, double *cpu, int *n_ms,
		     struct engine_prof *sum)
{
	uint32_t n_ctx = BATCH_PROMPT + BATCH_WARM + steps + 8;
	struct kvpool_geom g = { .page_tokens = 16, .n_layer = m->hp.n_layer,
				 .kv_dim = m->hp.n_head_kv * m->hp.head_dim,
				 .dtype = KV_DTYPE_F16 };
	struct engine_params ep = ENGINE_PARAMS_DEFAULT;
	struct engine_req **r = calloc(D, sizeof(*r));
	int32_t *prompt = calloc(BATCH_PROMPT, sizeof(*prompt));
	struct engine_prof p0, p1;
	const struct engine_event *ev;
	struct kvmem mem;
	struct kvpool *pool = NULL;
	struct engine *e = NULL;
	size_t n_ev;
	uint32_t n_seq, n_tok, n_dec, guard;
	int rc = -ENOMEM;

	kvmem_host_init(&mem);
	if (!r || !prompt)
		goto out;
	rc = kvpool_new(&pool, &mem, &g, D * (n_ctx / 16 + 1) + 4);
	if (rc)
		goto out;
	ep.threads = threads;
	ep.prof_cpu = threads == 1 && !no_split;
	ep.max_batch = D;
	ep.prefill_chunk = BATCH_PROMPT;
	/* every prompt in the first step, so all D have the same context */
	ep.step_tokens = D * BATCH_PROMPT;
	ep.n_ctx = n_ctx;
	rc = engine_new(&e, m, pool, &ep, NULL);
	if (rc)
		goto out;
	for (uint32_t i = 0; i < D && !rc; i++) {
		struct engine_req_params rp = {
			.owner = i + 1, .prompt = prompt, .n_prompt = BATCH_PROMPT,
			.max_tokens = BATCH_WARM + steps + 4,
			.sampling = SAMPLER_PARAMS_GREEDY, .ignore_eos = true };

		for (uint32_t t = 0; t < BATCH_PROMPT; t++)
			prompt[t] = (int32_t)(1 + (t * 37 + i * 101) % (m->hp.n_vocab - 1));
		rc = engine_submit(e, &rp, &r[i]);
	}
	/* prefill: until a step is all D decoding, then the warm-up steps */
	for (guard = 0, n_dec = 0; !rc && n_dec < D && guard < 4; guard++) {
		rc = engine_step(e, &ev, &n_ev);
		engine_last_step(e, &n_seq, &n_tok, &n_dec);
	}
	for (uint32_t i = 0; i < BATCH_WARM && !rc; i++)
		rc = engine_step(e, &ev, &n_ev);
	if (!rc && n_dec < D)
		rc = -EAGAIN;
	engine_prof(e, &p0);
	for (uint32_t i = 0; i < steps && !rc; i++) {
		uint64_t t0 = kvd_now_ns(), c0 = cpu_ns();

		rc = engine_step(e, &ev, &n_ev);
		ms[*n_ms] = (double)(kvd_now_ns() - t0) / 1e6;
		cpu[(*n_ms)++] = (double)(cpu_ns() - c0) / 1e6;
		engine_last_step(e, &n_seq, &n_tok, &n_dec);
		if (!rc && (n_dec != D || n_tok != D))
			rc = -EAGAIN;
	}
	engine_prof(e, &p1);
#define PROF_ADD(f) sum->f += p1.f - p0.f
	PROF_ADD(step_ns);
	PROF_ADD(integrity_ns);
	PROF_ADD(sample_ns);
	PROF_ADD(forward_ns);
	PROF_ADD(mm_ns);
	PROF_ADD(att_ns);
	PROF_ADD(tok_ns);
	PROF_ADD(logits_ns);
#undef PROF_ADD
out:
	for (uint32_t i = 0; e && r && i < D; i++)
		if (r[i])
			engine_req_free(e, r[i]);
	engine_free(e);
	kvpool_free(pool);
	kvmem_deinit(&mem);
	free(prompt);
	free(r);
	return rc;
}

static int bench_batch(const struct model *m, const uint32_t *sizes,
		       int n_sizes, uint32_t steps)
{
	printf("decode-only steps: %u timed per run, %d runs, contexts %u..%u; "
	       "step ms median [fastest..slowest]; split in ms per step (mean), "
	       "%s\n", steps, n_runs, BATCH_PROMPT + BATCH_WARM, BATCH_PROMPT + BATCH_WARM + steps,
	       no_split ? "wall time" : "CPU time at 1 thread, wall time at 2");
	printf("%7s %4s %24s %8s %8s %8s | %7s %7s %7s %7s %7s %7s %7s\n", "threads", "D",
	       "step ms", "ms/seq", "cpu ms", "cpu/seq", "matmul", "attn", "tok", "logits", "integ",
	       "sample", "rest");
	for (uint32_t th = 1; th <= 2; th++) {
		if (only_threads && th != only_threads)
			continue;
		for (int si = 0; si < n_sizes; si++) {
			uint32_t D = sizes[si];
			double *ms = calloc((size_t)n_runs * steps, sizeof(*ms));
			double *cpu = calloc((size_t)n_runs * steps, sizeof(*cpu));
			struct engine_prof sum = { 0 };
			int n_ms = 0, rc = ms && cpu ? 0 : -ENOMEM;
			double med, per, k, cmed, csum = 0, rest;
			char buf[64];

			for (int run = 0; run < n_runs && !rc; run++)
				rc = batch_run(m, th, D, steps, ms, cpu, &n_ms, &sum);
			if (rc) {
				printf("%7u %4u error %d\n", th, D, rc);
				free(ms);
				free(cpu);
				return 1;
			}
			for (int i = 0; i < n_ms; i++)
				csum += cpu[i];
			cmed = median(cpu, n_ms);
			med = median(ms, n_ms);
			per = med / D;
			k = 1e-6 / n_ms;   /* ns summed over the steps -> ms per step */
			snprintf(buf, sizeof(buf), "%.3f [%.3f..%.3f]", med, ms[0], ms[n_ms - 1]);
			/* 1 thread: the parts in CPU time, the rest what the
			 * steps' CPU time leaves; 2: all wall time */
			if (th == 1 && !no_split)
				rest = csum / n_ms - (double)(sum.mm_ns + sum.att_ns + sum.tok_ns +
							      sum.logits_ns + sum.integrity_ns +
							      sum.sample_ns) * k;
			else
				rest = ((double)sum.step_ns - sum.mm_ns - sum.att_ns - sum.tok_ns -
					sum.logits_ns - sum.integrity_ns - sum.sample_ns) * k;
			printf("%7u %4u %24s %8.4f %8.3f %8.4f | %7.3f %7.3f %7.3f %7.3f %7.3f %7.3f %7.3f\n",
			       th, D, buf, per, cmed, cmed / D, sum.mm_ns * k, sum.att_ns * k,
			       sum.tok_ns * k, sum.logits_ns * k, sum.integrity_ns * k,
			       sum.sample_ns * k, rest);
			fflush(stdout);
			free(ms);
			free(cpu);
		}
	}
	return 0;
}

/* --batch without --model: the serving benchmark's model, generated. */
static int bench_batch_main(const char *file, const uint32_t *sizes, int n_sizes,
			    uint32_t steps)
{
	struct gguf_llama_params p = GGUF_LLAMA_PARAMS_DEFAULT;
	struct gguf_error err;
	char dir[64], path[128];
	struct model *m;
	int rc;

	if (file) {
		if (model_open(&m, file, &err)) {
			fprintf(stderr, "open %s: %s\n", file, err.msg);
			return 1;
		}
		rc = bench_batch(m, sizes, n_sizes, steps);
		model_free(m);
		return rc;
	}
	snprintf(dir, sizeof(dir), "/tmp/kvd-bench-XXXXXX");
	if (!mkdtemp(dir))
		return 1;
	snprintf(path, sizeof(path), "%s/serve.gguf", dir);
	p.n_layer = 4;
	p.n_embd = 512;
	p.n_head = 8;
	p.n_head_kv = 4;
	p.n_ff = 1536;
	p.n_vocab = 16000;
	p.n_ctx = 2048;
	p.wtype = GGML_TYPE_Q8_0;
	p.seed = 5;
	rc = gguf_make_llama(path, &p);
	if (!rc && model_open(&m, path, &err) == 0) {
		printf("model: generated llama 4 layers, dim 512, 8/4 heads, ff 1536, "
		       "vocab 16000, q8_0\n");
		rc = bench_batch(m, sizes, n_sizes, steps);
		model_free(m);
	} else {
		fprintf(stderr, "generate %s: error %d\n", path, rc);
		rc = 1;
	}
	unlink(path);
	rmdir(dir);
	return rc;
}

/* --raw: n runs of file at `threads`, "prefill_tps decode_tps" each. */
static int bench_raw(const char *file, int n, uint32_t threads)
{
	struct gguf_error err;
	struct model *m;

	if (model_open(&m, file, &err)) {
		fprintf(stderr, "open %s: %s\n", file, err.msg);
		return 1;
	}
	for (int i = 0; i < n; i++) {
		struct result r = { 0 };
		int rc = run_model(m, threads, 128, 64, &r);

		if (rc) {
			fprintf(stderr, "%s: run error %d\n", file, rc);
			model_free(m);
			return 1;
		}
		printf("%.2f %.2f\n", r.prefill_tps, r.decode_tps);
		fflush(stdout);
	}
	model_free(m);
	return 0;
}

int main(int argc, char **argv)
{
	const char *shared = getenv("KVD_SHARED");
	char path[1024], dir[256];
	bool quick = false;
	const char *only = NULL;     /* --only f32|f16|q8_0|q4_k...: one generated type */
	const char *file = NULL;     /* --model FILE: bench that file alone */
	int raw = 0;                 /* --raw N: N runs, one line each */
	uint32_t raw_threads = 1;
	bool batch = false;          /* --batch: decode steps of D sequences */
	uint32_t sizes[16] = { 1, 4, 8, 16, 32 }, steps = 32;
	int n_sizes = 5;
	struct model *m;
	struct gguf_error err;
	const enum ggml_type types[] = { GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0,
					 GGML_TYPE_Q2_K, GGML_TYPE_Q3_K, GGML_TYPE_Q4_K,
					 GGML_TYPE_Q5_K, GGML_TYPE_Q6_K };

	for (int i = 1; i < argc; i++)
		if (!strcmp(argv[i], "--quick"))
			quick = true;
		else if (!strcmp(argv[i], "--only") && i + 1 < argc)
			only = argv[++i];
		else if (!strcmp(argv[i], "--no-bound"))
			no_bound = true;
		else if (!strcmp(argv[i], "--runs") && i + 1 < argc) {
			n_runs = atoi(argv[++i]);
			if (n_runs < 1 || n_runs > MAX_RUNS) {
				fprintf(stderr, "bench_engine: --runs 1..%d\n", MAX_RUNS);
				return 2;
			}
		}
		else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
			only_threads = (uint32_t)atoi(argv[++i]);
		else if (!strcmp(argv[i], "--model") && i + 1 < argc)
			file = argv[++i];
		else if (!strcmp(argv[i], "--raw") && i + 1 < argc)
			raw = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--batch"))
			batch = true;
		else if (!strcmp(argv[i], "--no-split"))
			no_split = true;
		else if (!strcmp(argv[i], "--steps") && i + 1 < argc) {
			steps = (uint32_t)atoi(argv[++i]);
			if (steps < 1 || steps > MAX_STEPS) {
				fprintf(stderr, "bench_engine: --steps 1..%d\n", MAX_STEPS);
				return 2;
			}
		} else if (!strcmp(argv[i], "--sizes") && i + 1 < argc) {
			char *s = argv[++i], *end;

			for (n_sizes = 0; *s && n_sizes < 16; n_sizes++) {
				unsigned long v = strtoul(s, &end, 10);

				if (end == s || v < 1 || v > 256 || (*end && *end != ',')) {
					fprintf(stderr, "bench_engine: --sizes D,D,... (1..256, at most 16)\n");
					return 2;
				}
				sizes[n_sizes] = (uint32_t)v;
				s = *end ? end + 1 : end;
			}
		}
		else {
			fprintf(stderr, "bench_engine: unknown argument '%s'\n", argv[i]);
			return 2;
		}
	if (batch)
		return bench_batch_main(file, sizes, n_sizes, steps);
	if (raw) {
		raw_threads = only_threads ? only_threads : 1;
		if (!file || raw < 1 || raw > 1000 || raw_threads < 1 || raw_threads > 16) {
			fprintf(stderr, "bench_engine: --raw N (1..1000) needs --model FILE, "
					"--threads 1..16\n");
			return 2;
		}
		return bench_raw(file, raw, raw_threads);
	}
	printf("speeds: median [slowest..fastest] of %d runs\n", n_runs);
	printf("%-22s %9s %9s %7s %24s %24s %9s %10s %7s %10s\n", "model", "params",
	       "MiB/tok", "threads", "prefill t/s", "decode t/s", "copy GB/s",
	       "bound t/s", "ratio", "integrity");

	if (file) {
		if (model_open(&m, file, &err)) {
			printf("open %s: %s\n", file, err.msg);
			return 1;
		}
		bench_model(file, m, 128, 64);
		model_free(m);
		return 0;
	}
	snprintf(path, sizeof(path), "%s/models/stories260K.gguf",
		 shared ? shared : "../shared");
	if (model_open(&m, path, &err) == 0) {
		bench_model("stories260K f32", m, 128, 64);
		model_free(m);
	}

	snprintf(dir, sizeof(dir), "/tmp/kvd-bench-XXXXXX");
	if (!mkdtemp(dir))
		return 1;
	for (size_t t = 0; t < KVD_ARRAY_SIZE(types); t++) {
		struct gguf_llama_params p = GGUF_LLAMA_PARAMS_DEFAULT;
		char label[64];
		int rc;

		if (only && strcmp(only, ggml_type_name(types[t])))
			continue;
		p.n_layer = quick ? 2 : 12;
		p.n_embd = 768;
		p.n_head = 12;
		p.n_head_kv = 4;
		p.n_ff = 2048;
		p.n_vocab = 16000;
		p.n_ctx = 2048;
		p.wtype = types[t];
		snprintf(path, sizeof(path), "%s/llama100m_%s.gguf", dir,
			 ggml_type_name(types[t]));
		rc = gguf_make_llama(path, &p);
		if (rc) {
			printf("generate %s: error %d\n", path, rc);
			continue;
		}
		rc = model_open(&m, path, &err);
		if (rc) {
			printf("open %s: %s\n", path, err.msg);
			unlink(path);
			continue;
		}
		snprintf(label, sizeof(label), "gen-100M %s", ggml_type_name(types[t]));
		bench_model(label, m, 128, 32);
		model_free(m);
		unlink(path);
	}
	rmdir(dir);
	return 0;
}
