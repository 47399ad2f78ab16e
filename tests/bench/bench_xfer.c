/* bench_xfer.c - KV transfer throughput over the tcp transport, keyless
 * and sealed, against a raw TCP loopback copy of the same bytes, in the
 * same run, same loop.
 *
 * Both sides live in one libuv loop on one thread (as the two nodes' loops
 * would each do one side): the sender copies source pages out of a host
 * pool into batches (re-tagging each page for its destination), the
 * receiver verifies each batch and writes its pages into the destination
 * pool - exactly what prefill and decode do. Since one thread does both
 * sides, a run's wall time per batch is the sum of both sides' work, and
 * the difference between two modes is what one costs over the other per
 * batch, sender and receiver together.
 *
 * Modes (the table below): the transport with XXH3 checksums on and off
 * (keyless: zero-copy send), sealed (a keyed link authenticating only:
 * zero-copy, the ChaCha20-Poly1305 tag streamed over the pieces in place
 * of XXH3; from libcrypto, and from libsodium: sealed/sodium) and
 * encrypted (copy path, entries and payload encrypted), and the raw copy. Runs go round-robin,
 * each round starting one mode later, so drift in the machine hits every
 * mode alike instead of masquerading as the cost of one.
 *
 * Before the transport runs, a microbenchmark over one batch-sized buffer
 * gives the primitives alone - XXH3-64, peer_aead_seal authenticating
 * only, peer_aead_seal encrypting - so the transport figures can be read
 * against them (a sealed batch's extra cost is the primitive twice, seal
 * and open, plus the copy that zero-copy sending avoids).
 *
 *   bench_xfer [MiB per run, default 512] [runs per mode, default 3]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

#include "conf/util.h"
#include "gpu/kv/kvmem.h"
#include "gpu/kv/kvpool.h"
#include "net/chapoly.h"
#include "net/peer_auth.h"
#include "net/transport.h"

#define PAGES 64
#define PER_BATCH 4

/* One way of moving the bytes: a row per mode, run round-robin. */
struct bx_mode {
	const char *name;
	bool transport;     /* false: the raw TCP copy */
	bool checksum;      /* XXH3 over every batch */
	bool seal;          /* a keyed link: AEAD tag on every batch */
	bool encrypt;       /* ... and entries+payload encrypted */
	bool sodium;        /* the AEAD from libsodium (as before issue 22.9) */
};

enum { BX_CK_ON, BX_CK_OFF, BX_SEALED, BX_SEALED_SODIUM, BX_ENCRYPTED,
       BX_RAW, BX_MODES };

static const struct bx_mode bx_modes[BX_MODES] = {
	[BX_CK_ON]     = { "checksum=on",  true,  true,  false, false, false },
	[BX_CK_OFF]    = { "checksum=off", true,  false, false, false, false },
	[BX_SEALED]    = { "sealed",       true,  true,  true,  false, false },
	[BX_SEALED_SODIUM] = { "sealed/sodium", true, true, true, false, true },
	[BX_ENCRYPTED] = { "encrypted",    true,  true,  true,  true,  false },
	[BX_RAW]       = { "raw tcp copy", false, false, false, false, false },
};

struct bx {
	uv_loop_t loop;
	uv_tcp_t server;
	uv_connect_t conn;
	struct kvmem mem;
	struct kvpool *src, *dst;
	struct kvpool_ref st[PAGES], dt[PAGES];
	uint64_t page_bytes;
	struct transport *tx, *rx;
	uint64_t want_pages, got_pages, sent_pages;
	uint32_t inflight;
	/* sealed modes: the data key of one link as each side holds it
	 * (same key, own counter), fresh for every run */
	struct peer_aead seal_tx, seal_rx;
	/* raw copy */
	uv_tcp_t raw_srv, raw_tx, raw_rx;
	uv_connect_t raw_conn;
	uint8_t *raw_buf, *raw_dst;
	size_t raw_len, raw_got_total, raw_want, raw_off;
	uint64_t raw_sent;
	int closes;
	uint64_t cpu_ns;     /* the last run's CPU time */
};

static void rx_batch(void *arg, const struct xfer_hdr *h, const uint8_t *batch)
{
	struct bx *b = arg;

	for (uint32_t i = 0; i < h->n_entries; i++) {
		struct xfer_entry e;

		xfer_batch_entry(batch, i, &e);
		memcpy(kvpool_page_addr(b->dst, e.dst_page), xfer_batch_page(batch, h, i),
		       b->page_bytes);
	}
	b->got_pages += h->n_entries;
}

static void rx_bad(void *arg, int code, const struct xfer_hdr *h)
{
	fprintf(stderr, "bench_xfer: bad batch %d\n", code);
	exit(1);
}

static void send_more(struct bx *b);

static void sent_cb(void *arg, int status)
{
	struct bx *b = arg;

	if (status) {
		fprintf(stderr, "bench_xfer: send failed %d\n", status);
		exit(1);
	}
	b->inflight--;
	send_more(b);
}

static void send_more(struct bx *b)
{
	while (b->sent_pages < b->want_pages && b->inflight < 4) {
		struct transport_page pg[PER_BATCH];

		for (uint32_t i = 0; i < PER_BATCH; i++) {
			uint32_t k = (uint32_t)((b->sent_pages + i) % PAGES);

			pg[i].src_page = b->st[k].page;
			pg[i].dst = (struct xfer_entry){ .dst_page = b->dt[k].page,
							 .index = k, .dst_gen = b->dt[k].gen,
							 .tokens = 16 };
		}
		if (transport_send(b->tx, 7, (uint32_t)(b->sent_pages / PER_BATCH), pg,
				   PER_BATCH, sent_cb, b)) {
			fprintf(stderr, "bench_xfer: send refused\n");
			exit(1);
		}
		b->sent_pages += PER_BATCH;
		b->inflight++;
	}
}

static void on_connect(uv_connect_t *req, int status)
{
	struct bx *b = req->data;

	if (status || transport_tcp_start(b->tx, false))
		exit(1);
	send_more(b);
}

static void on_conn(uv_stream_t *s, int status)
{
	struct bx *b = s->data;

	if (status || uv_accept(s, transport_tcp_stream(b->rx)) ||
	    transport_tcp_start(b->rx, true))
		exit(1);
}

static void closed_t(struct transport *t)
{
	struct bx *b = t->data;

	b->closes++;
}

static void nop_close(uv_handle_t *h)
{
	(void)h;
}

/* The data keys of a fresh link, as prefill (tx) and decode (rx) derive
 * them after the handshake. */
static void bx_link_keys(struct bx *b, bool encrypt)
{
	static const uint8_t material[] = "bench_xfer cluster key material, 32+ bytes";
	struct peer_key k;
	struct peer_session d, p;
	uint8_t nd[PEER_AUTH_BYTES], np[PEER_AUTH_BYTES];

	if (peer_key_init(&k, material, sizeof(material) - 1)) {
		fprintf(stderr, "bench_xfer: key setup failed\n");
		exit(1);
	}
	peer_auth_random(nd);
	peer_auth_random(np);
	peer_session_derive(&d, &k, PEER_SIDE_DECODE, nd, np, encrypt);
	peer_session_derive(&p, &k, PEER_SIDE_PREFILL, nd, np, encrypt);
	b->seal_tx = p.data;
	b->seal_rx = d.data;
	peer_session_wipe(&d);
	peer_session_wipe(&p);
	peer_key_wipe(&k);
}

/* This process's CPU time (user + system: the loopback TCP work is done
 * in the two sockets' system calls) in ns: on a shared machine it is the
 * figure other load does not move. */
static uint64_t bx_cpu_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
	return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* Move `pages` pages through the transport in mode m; returns the wall
 * time in ns (b->cpu_ns: the CPU time). */
static uint64_t run_xfer(struct bx *b, uint64_t pages, const struct bx_mode *m)
{
	struct sockaddr_in addr;
	struct sockaddr_storage bound;
	int nl = sizeof(bound);
	struct transport_cfg c = {
		.mem = &b->mem, .page_bytes = b->page_bytes,
		.max_batch_bytes = xfer_batch_bytes(PER_BATCH, b->page_bytes),
		.checksum = m->checksum,
	};
	uint64_t t0, t1;

	if (m->seal)
		bx_link_keys(b, m->encrypt);
	chapoly_impl_set(m->sodium ? CHAPOLY_LIBSODIUM : CHAPOLY_LIBCRYPTO);

	uv_loop_init(&b->loop);
	uv_tcp_init(&b->loop, &b->server);
	b->server.data = b;
	uv_ip4_addr("127.0.0.1", 0, &addr);
	uv_tcp_bind(&b->server, (struct sockaddr *)&addr, 0);
	uv_listen((uv_stream_t *)&b->server, 4, on_conn);
	uv_tcp_getsockname(&b->server, (struct sockaddr *)&bound, &nl);
	c.pool = b->dst;
	c.recv = (struct transport_recv){ .batch = rx_batch, .bad_batch = rx_bad };
	c.recv_arg = b;
	c.seal = m->seal ? &b->seal_rx : NULL;
	transport_tcp_new(&b->rx, &b->loop, &c);
	b->rx->data = b;
	c.pool = b->src;
	c.recv = (struct transport_recv){ 0 };
	c.seal = m->seal ? &b->seal_tx : NULL;
	transport_tcp_new(&b->tx, &b->loop, &c);
	b->tx->data = b;
	b->want_pages = pages;
	b->got_pages = b->sent_pages = 0;
	b->inflight = 0;
	b->conn.data = b;
	b->cpu_ns = bx_cpu_ns();
	t0 = kvd_now_ns();
	uv_tcp_connect(&b->conn, (uv_tcp_t *)transport_tcp_stream(b->tx),
		       (struct sockaddr *)&bound, on_connect);
	while (b->got_pages < pages)
		uv_run(&b->loop, UV_RUN_ONCE);
	t1 = kvd_now_ns();
	b->cpu_ns = bx_cpu_ns() - b->cpu_ns;
	b->closes = 0;
	transport_close(b->tx, closed_t);
	transport_close(b->rx, closed_t);
	uv_close((uv_handle_t *)&b->server, nop_close);
	uv_run(&b->loop, UV_RUN_DEFAULT);
	b->tx->ops->free(b->tx);
	b->rx->ops->free(b->rx);
	uv_loop_close(&b->loop);
	return t1 - t0;
}

/* ---- raw TCP copy ------------------------------------------------------------ */

static void raw_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf)
{
	static char rb[65536];

	(void)h;
	(void)hint;
	*buf = uv_buf_init(rb, sizeof(rb));
}

static void raw_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
	struct bx *b = s->data;

	if (n <= 0)
		return;
	/* copy into the destination, wrapping like the pool's pages do */
	for (ssize_t done = 0; done < n;) {
		size_t k = KVD_MIN((size_t)(n - done), b->raw_len - b->raw_off);

		memcpy(b->raw_dst + b->raw_off, buf->base + done, k);
		b->raw_off = (b->raw_off + k) % b->raw_len;
		done += (ssize_t)k;
	}
	b->raw_got_total += (size_t)n;
}

static void raw_write_more(struct bx *b);

static void raw_written(uv_write_t *req, int status)
{
	struct bx *b = req->data;

	free(req);
	if (status)
		exit(1);
	b->raw_sent--;
	raw_write_more(b);
}

static uint64_t raw_queued;

static void raw_write_more(struct bx *b)
{
	while (raw_queued < b->raw_want && b->raw_sent < 4) {
		uv_write_t *req = malloc(sizeof(*req));
		uv_buf_t buf = uv_buf_init((char *)b->raw_buf, (unsigned)b->raw_len);

		req->data = b;
		if (uv_write(req, (uv_stream_t *)&b->raw_tx, &buf, 1, raw_written))
			exit(1);
		raw_queued += b->raw_len;
		b->raw_sent++;
	}
}

static void raw_on_connect(uv_connect_t *req, int status)
{
	struct bx *b = req->data;

	if (status)
		exit(1);
	raw_write_more(b);
}

static void raw_on_conn(uv_stream_t *s, int status)
{
	struct bx *b = s->data;

	uv_tcp_init(&b->loop, &b->raw_rx);
	b->raw_rx.data = b;
	if (status || uv_accept(s, (uv_stream_t *)&b->raw_rx))
		exit(1);
	uv_read_start((uv_stream_t *)&b->raw_rx, raw_alloc, raw_read);
}

static uint64_t run_raw(struct bx *b, uint64_t bytes)
{
	struct sockaddr_in addr;
	struct sockaddr_storage bound;
	int nl = sizeof(bound);
	uint64_t t0, t1;

	uv_loop_init(&b->loop);
	uv_tcp_init(&b->loop, &b->raw_srv);
	b->raw_srv.data = b;
	uv_ip4_addr("127.0.0.1", 0, &addr);
	uv_tcp_bind(&b->raw_srv, (struct sockaddr *)&addr, 0);
	uv_listen((uv_stream_t *)&b->raw_srv, 4, raw_on_conn);
	uv_tcp_getsockname(&b->raw_srv, (struct sockaddr *)&bound, &nl);
	uv_tcp_init(&b->loop, &b->raw_tx);
	uv_tcp_nodelay(&b->raw_tx, 1);
	b->raw_want = bytes;
	b->raw_got_total = 0;
	b->raw_sent = 0;
	raw_queued = 0;
	b->raw_conn.data = b;
	b->cpu_ns = bx_cpu_ns();
	t0 = kvd_now_ns();
	uv_tcp_connect(&b->raw_conn, &b->raw_tx, (struct sockaddr *)&bound, raw_on_connect);
	while (b->raw_got_total < bytes)
		uv_run(&b->loop, UV_RUN_ONCE);
	t1 = kvd_now_ns();
	b->cpu_ns = bx_cpu_ns() - b->cpu_ns;
	uv_close((uv_handle_t *)&b->raw_tx, nop_close);
	uv_close((uv_handle_t *)&b->raw_rx, nop_close);
	uv_close((uv_handle_t *)&b->raw_srv, nop_close);
	uv_run(&b->loop, UV_RUN_DEFAULT);
	uv_loop_close(&b->loop);
	return t1 - t0;
}

/* ---- primitives alone ------------------------------------------------------ */

enum { PRIM_XXH3, PRIM_MAC, PRIM_ENCRYPT, PRIMS };

static const char *const prim_names[PRIMS] = {
	[PRIM_XXH3] = "xxh3-64", [PRIM_MAC] = "seal mac-only", [PRIM_ENCRYPT] = "seal encrypt",
};

/* Run primitive `p` over buf[0, n) for at least min_ns; returns ns per
 * pass. The AEAD covers the whole batch the way the transport does: the
 * header as additional data, the rest encrypted or authenticated. */
static double prim_run(int p, struct peer_aead *a, uint8_t *buf, size_t n, uint64_t min_ns)
{
	uint8_t tag[PEER_AUTH_TAG_BYTES];
	volatile uint64_t sink = 0;
	uint64_t t0 = kvd_now_ns(), t;
	unsigned passes = 0;

	do {
		for (int i = 0; i < 4; i++, passes++) {
			if (p == PRIM_XXH3) {
				sink ^= XXH3_64bits(buf, n);
			} else {
				a->encrypt = p == PRIM_ENCRYPT;
				peer_aead_seal(a, buf, n, XFER_HDR_BYTES, tag);
				sink ^= tag[0];
			}
		}
		t = kvd_now_ns() - t0;
	} while (t < min_ns);
	(void)sink;
	return (double)t / passes;
}

/* The primitives over one batch-sized buffer, interleaved in rounds;
 * fills ns[] with ns per batch (mean over rounds). */
static void prim_bench(struct bx *b, size_t n, double ns[PRIMS])
{
	uint8_t *buf = aligned_alloc(64, (n + 63) & ~(size_t)63);
	const int rounds = 3;

	if (!buf) {
		fprintf(stderr, "bench_xfer: out of memory\n");
		exit(1);
	}
	memset(buf, 5, n);
	bx_link_keys(b, false);
	for (int p = 0; p < PRIMS; p++)
		ns[p] = 0;
	for (int r = 0; r < rounds; r++)
		for (int k = 0; k < PRIMS; k++) {
			int p = (r + k) % PRIMS;

			ns[p] += prim_run(p, &b->seal_tx, buf, n, 100000000ull) / rounds;
		}
	free(buf);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/* Median of v[0, n) (sorts v). */
static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static double gbps(double bytes, double ns)
{
	return ns > 0 ? bytes / ns : 0;
}

int main(int argc, char **argv)
{
	uint64_t mib = argc > 1 ? strtoull(argv[1], NULL, 10) : 512;
	int runs = argc > 2 ? atoi(argv[2]) : 3;
	struct kvpool_geom g = { .page_tokens = 16, .n_layer = 16, .kv_dim = 1024,
				 .dtype = KV_DTYPE_F16 };
	struct bx *b = calloc(1, sizeof(*b));
	double ns[BX_MODES], prim[PRIMS], batch_ns[BX_MODES], per_b, payload;
	double *t_runs[BX_MODES];    /* (mode, run) wall ns */
	double *c_runs[BX_MODES];    /* (mode, run) CPU ns */
	double cpu[BX_MODES];
	uint64_t pages, batches;

	if (runs < 1)
		runs = 1;
	for (int i = 0; i < BX_MODES; i++)
		t_runs[i] = calloc((size_t)runs, sizeof(double)),
		c_runs[i] = calloc((size_t)runs, sizeof(double));
	if (!b || peer_auth_global_init()) {
		fprintf(stderr, "bench_xfer: init failed\n");
		return 1;
	}
	kvmem_host_init(&b->mem);
	b->page_bytes = kvpool_page_bytes(&g);
	if (kvpool_new(&b->src, &b->mem, &g, PAGES) || kvpool_new(&b->dst, &b->mem, &g, PAGES) ||
	    kvpool_reserve(b->src, 1, PAGES, b->st) || kvpool_reserve(b->dst, 7, PAGES, b->dt)) {
		fprintf(stderr, "bench_xfer: pool setup failed\n");
		return 1;
	}
	for (uint32_t i = 0; i < PAGES; i++)
		memset(kvpool_page_addr(b->src, b->st[i].page), (int)i, b->page_bytes);
	pages = (mib << 20) / b->page_bytes;
	pages -= pages % PER_BATCH;
	batches = pages / PER_BATCH;
	payload = (double)pages * b->page_bytes;
	b->raw_len = xfer_batch_bytes(PER_BATCH, b->page_bytes);
	b->raw_buf = malloc(b->raw_len);
	b->raw_dst = malloc(b->raw_len);
	memset(b->raw_buf, 3, b->raw_len);
	printf("bench_xfer: page %llu bytes, batch %u pages (%zu bytes), %llu MiB per run, %d runs per mode\n",
	       (unsigned long long)b->page_bytes, PER_BATCH, b->raw_len,
	       (unsigned long long)mib, runs);

	prim_bench(b, b->raw_len, prim);
	printf("primitives over one batch (%zu bytes, one core):", b->raw_len);
	for (int p = 0; p < PRIMS; p++)
		printf("  %s %.2f GB/s (%.0f us)", prim_names[p], gbps((double)b->raw_len, prim[p]),
		       prim[p] / 1e3);
	printf("\n");

	/* unmeasured warm-up: every mode once over the pools (first touch of
	 * the destination pages, the allocator's arenas, the key path) */
	for (int i = 0; i < BX_MODES; i++)
		(void)(bx_modes[i].transport ? run_xfer(b, PAGES, &bx_modes[i])
					     : run_raw(b, PAGES * b->page_bytes));
	for (int r = 0; r < runs; r++) {
		/* round-robin, each round starting one mode later */
		for (int k = 0; k < BX_MODES; k++) {
			int i = (r + k) % BX_MODES;
			const struct bx_mode *m = &bx_modes[i];

			t_runs[i][r] = (double)(m->transport ? run_xfer(b, pages, m)
							   : run_raw(b, pages * b->page_bytes));
			c_runs[i][r] = (double)b->cpu_ns;
		}
		printf("  run %d (from %s):", r, bx_modes[r % BX_MODES].name);
		for (int i = 0; i < BX_MODES; i++)
			printf("  %s %.2f", bx_modes[i].name, gbps(payload, t_runs[i][r]));
		printf(" GB/s\n");
	}
	for (int i = 0; i < BX_MODES; i++) {
		ns[i] = median(t_runs[i], runs);
		cpu[i] = median(c_runs[i], runs);
		free(t_runs[i]);
		free(c_runs[i]);
	}

	/* one thread does both sides: wall time per batch is sender plus
	 * receiver work, so differences are per-batch costs of both */
	printf("median of %d runs per mode; cost per batch is sender + receiver\n", runs);
	printf("%-14s %8s %10s %16s %16s %12s %14s\n", "mode", "GB/s", "us/batch",
	       "vs xxh3 us/batch", "vs xxh3 %", "GB/s of CPU", "CPU vs xxh3 %");
	for (int i = 0; i < BX_MODES; i++) {
		batch_ns[i] = ns[i] / (double)batches;
		per_b = (batch_ns[i] - batch_ns[BX_CK_ON]) / 1e3;
		printf("%-14s %8.2f %10.1f %+16.1f %+15.1f%% %12.2f %+13.1f%%\n", bx_modes[i].name,
		       gbps(payload, ns[i]), batch_ns[i] / 1e3, per_b,
		       100.0 * (batch_ns[i] - batch_ns[BX_CK_ON]) / batch_ns[BX_CK_ON],
		       gbps(payload, cpu[i]), 100.0 * (cpu[i] - cpu[BX_CK_ON]) / cpu[BX_CK_ON]);
	}
	printf("xfer_gbps_checksum_on=%.2f xfer_gbps_checksum_off=%.2f xfer_gbps_sealed=%.2f xfer_gbps_sealed_sodium=%.2f seal_cost=%.2f%% seal_cpu_cost=%.2f%% xfer_gbps_encrypted=%.2f raw_tcp_gbps=%.2f ratio_on_vs_raw=%.3f checksum_cost=%.2f%% seal_cost_us_per_batch=%.1f encrypt_cost_us_per_batch=%.1f prim_gbps_xxh3=%.2f prim_gbps_mac=%.2f prim_gbps_encrypt=%.2f\n",
	       gbps(payload, ns[BX_CK_ON]), gbps(payload, ns[BX_CK_OFF]),
	       gbps(payload, ns[BX_SEALED]), gbps(payload, ns[BX_SEALED_SODIUM]),
	       (ns[BX_SEALED] - ns[BX_CK_ON]) / ns[BX_CK_ON] * 100.0,
	       (cpu[BX_SEALED] - cpu[BX_CK_ON]) / cpu[BX_CK_ON] * 100.0,
	       gbps(payload, ns[BX_ENCRYPTED]),
	       gbps(payload, ns[BX_RAW]), ns[BX_RAW] / ns[BX_CK_ON],
	       (ns[BX_CK_ON] - ns[BX_CK_OFF]) / ns[BX_CK_ON] * 100.0,
	       (batch_ns[BX_SEALED] - batch_ns[BX_CK_ON]) / 1e3,
	       (batch_ns[BX_ENCRYPTED] - batch_ns[BX_CK_ON]) / 1e3,
	       gbps((double)b->raw_len, prim[PRIM_XXH3]), gbps((double)b->raw_len, prim[PRIM_MAC]),
	       gbps((double)b->raw_len, prim[PRIM_ENCRYPT]));
	kvpool_free(b->src);
	kvpool_free(b->dst);
	kvmem_deinit(&b->mem);
	free(b->raw_buf);
	free(b->raw_dst);
	free(b);
	return 0;
}
