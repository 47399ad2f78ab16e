/* bench_kvpool.c - what the KV pool's bookkeeping and integrity tags cost.
 *
 * 1. reserve + release of 1,000,000 requests of random sizes (1..64
 *    pages) on a pool kept half full by a FIFO of live requests, so the
 *    free list is scrambled as in service: requests/s, and p50/p99/max ns
 *    of one request's reserve + release.
 * 2. verify cost per page for a realistic page (default: 16 tokens x 22
 *    layers x kv_dim 256 x f16 = 352 KiB), on a pool larger than the last
 *    level cache, cold (right after streaming over the whole pool) and
 *    warm (repeated), in tables of 64 pages; tag_write cost per page.
 * 3. the cost of reading one page's KV once at memory bandwidth, measured
 *    in the same run by summing the pool's bytes (a vectorizable 64-bit
 *    sum over the same > LLC memory), and verify as a fraction of it.
 *    Target: verify < 2% of one read of the pages it checks.
 *
 * Usage: bench_kvpool [page_tokens n_layer kv_dim f16|f32 [pool_MiB]]
 * KVD_BENCH_REQUESTS overrides the request count. Prints figures; never
 * fails on speed (exit 1 only when a pool call fails).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu/kv/kvpool.h"

#define MAX_REQ_PAGES 64

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static double min_d(double a, double b)
{
	return a < b ? a : b;
}

static uint64_t rng_state = 0x853c49e6748fea9bull;

static uint32_t rnd(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return (uint32_t)(rng_state >> 11);
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static void die(const char *what, int r)
{
	fprintf(stderr, "bench_kvpool: %s failed: %d\n", what, r);
	exit(1);
}

/* ---- 1. reserve + release ------------------------------------------------- */

struct live {
	uint64_t owner;
	uint32_t n;
	struct kvpool_ref t[MAX_REQ_PAGES];
};

static void bench_reserve(uint64_t requests)
{
	const struct kvpool_geom g = {
		.page_tokens = 16, .n_layer = 1, .kv_dim = 8,
		.dtype = KV_DTYPE_F16,
	};
	const uint32_t pool_pages = 8192, ring = 1024;
	struct kvmem mem;
	struct kvpool *p = NULL;
	struct live *fifo = calloc(ring, sizeof(*fifo));
	uint64_t *lat = calloc(requests, sizeof(*lat));
	uint64_t *lat_idx = calloc(ring, sizeof(*lat_idx));
	uint32_t head = 0, tail = 0, live_pages = 0;
	uint64_t t0, t1, total_pages = 0;
	int r;

	if (!fifo || !lat || !lat_idx)
		die("calloc", -1);
	kvmem_host_init(&mem);
	r = kvpool_new(&p, &mem, &g, pool_pages);
	if (r)
		die("kvpool_new", r);
	t0 = now_ns();
	for (uint64_t i = 0; i < requests; i++) {
		uint32_t n = 1 + rnd() % MAX_REQ_PAGES;
		struct live *l;
		uint64_t a, b;

		/* keep the pool at most half full: release the oldest */
		while (live_pages + n > pool_pages / 2 || tail - head == ring) {
			struct live *o = &fifo[head % ring];

			a = now_ns();
			r = kvpool_release(p, o->owner, o->t, o->n);
			b = now_ns();
			if (r)
				die("kvpool_release", r);
			lat[lat_idx[head % ring]] += b - a;
			live_pages -= o->n;
			head++;
		}
		l = &fifo[tail % ring];
		l->owner = i + 1;
		l->n = n;
		a = now_ns();
		r = kvpool_reserve(p, l->owner, n, l->t);
		b = now_ns();
		if (r)
			die("kvpool_reserve", r);
		lat[i] = b - a;
		lat_idx[tail % ring] = i;
		live_pages += n;
		total_pages += n;
		tail++;
	}
	while (head != tail) {
		struct live *o = &fifo[head % ring];
		uint64_t a = now_ns();

		r = kvpool_release(p, o->owner, o->t, o->n);
		lat[lat_idx[head % ring]] += now_ns() - a;
		if (r)
			die("kvpool_release", r);
		head++;
	}
	t1 = now_ns();
	qsort(lat, requests, sizeof(*lat), cmp_u64);
	printf("reserve+release: %" PRIu64 " requests of 1..%d pages "
	       "(mean %.1f) on a %u-page pool kept <= half full\n",
	       requests, MAX_REQ_PAGES, (double)total_pages / requests,
	       pool_pages);
	printf("  throughput      %.2f M requests/s (%.1f ns per request, "
	       "%.1f ns per page)\n",
	       requests * 1e3 / (double)(t1 - t0),
	       (double)(t1 - t0) / requests,
	       (double)(t1 - t0) / total_pages);
	printf("  reserve+release p50 %" PRIu64 " ns  p99 %" PRIu64
	       " ns  max %" PRIu64 " ns\n",
	       lat[requests / 2], lat[requests * 99 / 100],
	       lat[requests - 1]);
	kvpool_free(p);
	kvmem_deinit(&mem);
	free(fifo);
	free(lat);
	free(lat_idx);
}

/* ---- 2 and 3. verify vs one read ------------------------------------------- */

/* Sum every 64-bit word of pages[0..n): one read of the KV at memory
 * bandwidth (4 accumulators so the compiler vectorizes). */
static uint64_t read_pages(struct kvpool *p, uint32_t n, uint64_t bytes)
{
	uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;

	for (uint32_t i = 0; i < n; i++) {
		const uint64_t *w = kvpool_page_addr(p, i);

		for (uint64_t k = 0; k + 4 <= bytes / 8; k += 4) {
			s0 += w[k];
			s1 += w[k + 1];
			s2 += w[k + 2];
			s3 += w[k + 3];
		}
	}
	return s0 + s1 + s2 + s3;
}

static double verify_all(struct kvpool *p, struct kvpool_ref *t, uint32_t n,
			 uint32_t per_table, uint32_t page_tokens)
{
	uint64_t a = now_ns();

	for (uint32_t off = 0; off < n; off += per_table) {
		uint32_t k = n - off < per_table ? n - off : per_table;
		int r = kvpool_verify(p, 1, t + off, k, k * page_tokens, NULL);

		if (r)
			die("kvpool_verify", r);
	}
	return (double)(now_ns() - a) / n;
}

static void bench_verify(const struct kvpool_geom *g, uint64_t pool_mib)
{
	uint64_t page_bytes = kvpool_page_bytes(g);
	uint32_t n = (uint32_t)((pool_mib << 20) / page_bytes);
	const uint32_t per_table = 64;
	struct kvmem mem;
	struct kvpool *p = NULL;
	struct kvpool_ref *t = calloc(n, sizeof(*t));
	volatile uint64_t sink;
	double read_ns = 1e30, cold_ns = 1e30, warm_ns = 1e30, tag_ns;
	uint64_t a;
	int r;

	if (!t)
		die("calloc", -1);
	kvmem_host_init(&mem);
	r = kvpool_new(&p, &mem, g, n);
	if (r)
		die("kvpool_new", r);
	/* One request of n pages: tables of 64 are ranges of it, so each
	 * verify call checks its own slice with index = position in it. */
	for (uint32_t off = 0; off < n; off += per_table) {
		uint32_t k = n - off < per_table ? n - off : per_table;

		r = kvpool_reserve(p, 1, k, t + off);
		if (r)
			die("kvpool_reserve", r);
	}
	for (uint32_t i = 0; i < n; i++)
		memset(kvpool_page_addr(p, t[i].page), (int)(i & 0xff),
		       page_bytes);
	a = now_ns();
	for (uint32_t off = 0; off < n; off += per_table) {
		uint32_t k = n - off < per_table ? n - off : per_table;

		if ((r = kvpool_fill_begin(p, 1, t + off, k)) ||
		    (r = kvpool_tag_write(p, 1, t + off, k, k * g->page_tokens)) ||
		    (r = kvpool_mark_ready(p, 1, t + off, k, k * g->page_tokens)))
			die("fill", r);
	}
	tag_ns = (double)(now_ns() - a) / n;

	for (int rep = 0; rep < 3; rep++) {
		a = now_ns();
		sink = read_pages(p, n, page_bytes);
		read_ns = min_d(read_ns, (double)(now_ns() - a) / n);
		/* right after a full pass the first pages are out of cache */
		cold_ns = min_d(cold_ns,
				    verify_all(p, t, n, per_table, g->page_tokens));
		warm_ns = min_d(warm_ns,
				    verify_all(p, t, n, per_table, g->page_tokens));
	}
	(void)sink;
	printf("verify: %u pages of %" PRIu64 " bytes (%u tokens x %u layers x "
	       "kv_dim %u x %s), pool %.0f MiB, tables of %u pages\n",
	       n, page_bytes, g->page_tokens, g->n_layer, g->kv_dim,
	       g->dtype == KV_DTYPE_F32 ? "f32" : "f16", (double)n * page_bytes / 1048576.0,
	       per_table);
	printf("  one read of a page   %10.0f ns  (%.2f GB/s, best of 3)\n",
	       read_ns, page_bytes / read_ns);
	printf("  verify, cold         %10.1f ns per page = %.3f%% of one read\n",
	       cold_ns, 100.0 * cold_ns / read_ns);
	printf("  verify, warm         %10.1f ns per page = %.3f%% of one read\n",
	       warm_ns, 100.0 * warm_ns / read_ns);
	printf("  fill+tag_write+mark_ready %5.1f ns per page (first touch)\n",
	       tag_ns);
	printf("  target verify < 2%% of one read: %s\n",
	       cold_ns < 0.02 * read_ns ? "met" : "NOT met");
	kvpool_free(p);
	kvmem_deinit(&mem);
	free(t);
}

int main(int argc, char **argv)
{
	struct kvpool_geom g = {
		.page_tokens = 16, .n_layer = 22, .kv_dim = 256,
		.dtype = KV_DTYPE_F16,
	};
	uint64_t pool_mib = 1024;
	const char *req = getenv("KVD_BENCH_REQUESTS");
	uint64_t requests = req && *req ? strtoull(req, NULL, 0) : 1000000;

	if (argc >= 5) {
		g.page_tokens = (uint32_t)strtoul(argv[1], NULL, 0);
		g.n_layer = (uint32_t)strtoul(argv[2], NULL, 0);
		g.kv_dim = (uint32_t)strtoul(argv[3], NULL, 0);
		g.dtype = strcmp(argv[4], "f32") ? KV_DTYPE_F16 : KV_DTYPE_F32;
	}
	if (argc >= 6)
		pool_mib = strtoull(argv[5], NULL, 0);
	if (!kvpool_page_bytes(&g) || requests == 0) {
		fprintf(stderr, "usage: bench_kvpool [page_tokens n_layer kv_dim "
				"f16|f32 [pool_MiB]]\n");
		return 2;
	}
	bench_reserve(requests);
	bench_verify(&g, pool_mib);
	return 0;
}
