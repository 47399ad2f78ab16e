/* bench_threads.c - how the CPU engine scales with its thread count, with
 * the engines of every count side by side in one process.
 *
 *   bench_threads --model FILE [--rounds N] [--threads 1,2] [--prompt P]
 *                 [--decode D]
 *
 * One engine per thread count is made once (weights packed once each),
 * warmed with one untimed prompt + decode, then N rounds (default 7): in
 * each round every engine, in an order that rotates per round, prefills
 * a P-token prompt (default 128) in one step and decodes D tokens
 * (default 64) greedily. Because the engines take turns within seconds,
 * load from other processes hits every count alike: the per-round ratio
 * to the first count is the figure to read on a shared machine. Prints,
 * per count, prefill and decode tok/s as "median [min..max]" over the
 * rounds, the per-round ratios' median and range, and the engine's
 * thread-pool counters (runs per token, runs that had to wake a sleeping
 * worker, time the caller waited for workers after its own share).
 *
 * Prints figures; never fails on speed (exit 1 on an engine error).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conf/util.h"
#include "gpu/engine.h"
#include "gpu/kv/kvmem.h"
#include "gpu/kv/kvpool.h"
#include "gpu/model/model.h"

enum { MAX_COUNTS = 4, MAX_ROUNDS = 51 };

struct rig {
	uint32_t threads;
	struct kvmem mem;
	struct kvpool *pool;
	struct engine *e;
	double pre[MAX_ROUNDS], dec[MAX_ROUNDS];
	struct engine_pool_stats st0, st1;
};

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/* "median [min..max]" of v[n] (a sorted copy; v is left as it is). */
static const char *spread(char *buf, size_t size, const double *v, int n)
{
	double s[MAX_ROUNDS];

	memcpy(s, v, (size_t)n * sizeof(*v));
	qsort(s, (size_t)n, sizeof(*s), cmp_double);
	snprintf(buf, size, "%.1f [%.1f..%.1f]",
		 n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2, s[0], s[n - 1]);
	return buf;
}

/* One prompt of n_prompt tokens in one step, then n_decode tokens. */
static int run_once(struct rig *g, const struct model *m, uint32_t n_prompt,
		    uint32_t n_decode, double *pre, double *dec)
{
	int32_t *prompt = calloc(n_prompt, sizeof(*prompt));
	struct engine_req_params rp = {
		.owner = 1, .prompt = prompt, .n_prompt = n_prompt,
		.max_tokens = n_decode + 1, .sampling = SAMPLER_PARAMS_GREEDY,
		.ignore_eos = true };
	const struct engine_event *ev;
	struct engine_req *r;
	size_t n_ev;
	uint64_t t0, t1;
	uint32_t decoded = 0;
	int rc;

	if (!prompt)
		return -1;
	for (uint32_t i = 0; i < n_prompt; i++)
		prompt[i] = (int32_t)(1 + (i * 37) % (m->hp.n_vocab - 1));
	rc = engine_submit(g->e, &rp, &r);
	if (rc) {
		free(prompt);
		return rc;
	}
	t0 = kvd_now_ns();
	rc = engine_step(g->e, &ev, &n_ev);
	t1 = kvd_now_ns();
	*pre = n_prompt / ((double)(t1 - t0) / 1e9);
	t0 = kvd_now_ns();
	while (!rc && !engine_idle(g->e)) {
		rc = engine_step(g->e, &ev, &n_ev);
		decoded++;
	}
	t1 = kvd_now_ns();
	*dec = decoded / ((double)(t1 - t0) / 1e9);
	engine_req_free(g->e, r);
	free(prompt);
	return rc;
}

int main(int argc, char **argv)
{
	const char *file = NULL;
	uint32_t counts[MAX_COUNTS] = { 1, 2 }, n_counts = 2;
	uint32_t n_prompt = 128, n_decode = 64;
	int rounds = 7, rc = 0;
	uint32_t n_made = 0;
	struct rig rigs[MAX_COUNTS] = { 0 };
	struct gguf_error err;
	struct model *m;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--model") && i + 1 < argc) {
			file = argv[++i];
		} else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) {
			rounds = atoi(argv[++i]);
		} else if (!strcmp(argv[i], "--prompt") && i + 1 < argc) {
			n_prompt = (uint32_t)atoi(argv[++i]);
		} else if (!strcmp(argv[i], "--decode") && i + 1 < argc) {
			n_decode = (uint32_t)atoi(argv[++i]);
		} else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
			char *s = argv[++i], *end;

			n_counts = 0;
			while (*s && n_counts < MAX_COUNTS) {
				unsigned long v = strtoul(s, &end, 10);

				if (end == s || v < 1 || v > 64)
					break;
				counts[n_counts++] = (uint32_t)v;
				s = *end == ',' ? end + 1 : end;
			}
			if (*s || n_counts == 0) {
				fprintf(stderr, "bench_threads: --threads N[,N...] (1..64, at most %d)\n",
					MAX_COUNTS);
				return 2;
			}
		} else {
			fprintf(stderr, "bench_threads: unknown argument '%s'\n", argv[i]);
			return 2;
		}
	}
	if (!file || rounds < 1 || rounds > MAX_ROUNDS || n_prompt < 1 ||
	    n_prompt > 4096 || n_decode < 1 || n_decode > 4096) {
		fprintf(stderr, "usage: bench_threads --model FILE [--rounds 1..%d] "
				"[--threads 1,2] [--prompt 1..4096] [--decode 1..4096]\n",
			MAX_ROUNDS);
		return 2;
	}
	if (model_open(&m, file, &err)) {
		fprintf(stderr, "open %s: %s\n", file, err.msg);
		return 1;
	}
	for (uint32_t c = 0; c < n_counts && !rc; c++) {
		struct rig *g = &rigs[c];
		struct kvpool_geom geom = {
			.page_tokens = 16, .n_layer = m->hp.n_layer,
			.kv_dim = m->hp.n_head_kv * m->hp.head_dim,
			.dtype = KV_DTYPE_F16 };
		struct engine_params ep = ENGINE_PARAMS_DEFAULT;
		double p, d;

		g->threads = counts[c];
		kvmem_host_init(&g->mem);
		n_made++;
		rc = kvpool_new(&g->pool, &g->mem, &geom, (n_prompt + n_decode) / 16 + 4);
		if (rc)
			break;
		ep.threads = g->threads;
		ep.max_batch = 1;
		ep.prefill_chunk = n_prompt;
		ep.n_ctx = n_prompt + n_decode + 8;
		rc = engine_new(&g->e, m, g->pool, &ep, NULL);
		if (!rc)
			rc = run_once(g, m, n_prompt, n_decode, &p, &d); /* warm-up */
	}
	for (int r = 0; r < rounds && !rc; r++)
		for (uint32_t k = 0; k < n_counts && !rc; k++) {
			struct rig *g = &rigs[(k + (uint32_t)r) % n_counts];

			engine_pool_stats(g->e, &g->st0);
			rc = run_once(g, m, n_prompt, n_decode, &g->pre[r], &g->dec[r]);
			engine_pool_stats(g->e, &g->st1);
			g->st1.runs -= g->st0.runs;
			g->st1.wakes -= g->st0.wakes;
			g->st1.wait_ns -= g->st0.wait_ns;
		}
	if (rc) {
		fprintf(stderr, "bench_threads: engine error %d\n", rc);
	} else {
		char la[64] = "?";
		FILE *f = fopen("/proc/loadavg", "r");

		if (f) {
			if (!fgets(la, sizeof(la), f))
				snprintf(la, sizeof(la), "?");
			la[strcspn(la, "\n")] = 0;
			fclose(f);
		}
		printf("# %s, %d rounds, prompt %u, decode %u; loadavg after: %s\n",
		       file, rounds, n_prompt, n_decode, la);
		printf("%-7s %26s %26s %20s %20s  %s\n", "threads", "prefill tok/s",
		       "decode tok/s", "prefill ratio", "decode ratio",
		       "last round: runs/tok, wakes, caller wait ms");
		for (uint32_t c = 0; c < n_counts; c++) {
			struct rig *g = &rigs[c];
			double pr[MAX_ROUNDS], dr[MAX_ROUNDS];
			char b1[64], b2[64], b3[64], b4[64];

			for (int r = 0; r < rounds; r++) {
				pr[r] = g->pre[r] / rigs[0].pre[r];
				dr[r] = g->dec[r] / rigs[0].dec[r];
			}
			printf("%-7u %26s %26s %20s %20s  %.1f, %llu, %.2f\n", g->threads,
			       spread(b1, sizeof(b1), g->pre, rounds),
			       spread(b2, sizeof(b2), g->dec, rounds),
			       spread(b3, sizeof(b3), pr, rounds),
			       spread(b4, sizeof(b4), dr, rounds),
			       (double)g->st1.runs / (n_prompt + n_decode),
			       (unsigned long long)g->st1.wakes, g->st1.wait_ns / 1e6);
		}
	}
	for (uint32_t c = 0; c < n_made; c++) {
		engine_free(rigs[c].e);
		kvpool_free(rigs[c].pool);
		kvmem_deinit(&rigs[c].mem);
	}
	model_free(m);
	return rc ? 1 : 0;
}
