/* bench_xfer.c - KV transfer throughput over the tcp transport against a
 * raw TCP loopback copy of the same bytes, in the same run, same loop.
 *
 * Both sides live in one libuv loop on one thread (as the two nodes' loops
 * would each do one side): the sender copies source pages out of a host
 * pool into batches (re-tagging each page for its destination), the
 * receiver verifies each batch and writes its pages into the destination
 * pool - exactly what prefill and decode do. The raw copy writes buffers
 * of the same size and copies what it reads into a destination buffer.
 * Checksums on and off are interleaved (on, off, on, off, ...) so that
 * drift in the machine does not masquerade as checksum cost.
 *
 *   bench_xfer [MiB per run, default 512] [runs per mode, default 3]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conf/util.h"
#include "gpu/kvmem.h"
#include "gpu/kvpool.h"
#include "net/transport.h"

#define PAGES 64
#define PER_BATCH 4

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
	bool checksum;
	/* raw copy */
	uv_tcp_t raw_srv, raw_tx, raw_rx;
	uv_connect_t raw_conn;
	uint8_t *raw_buf, *raw_dst;
	size_t raw_len, raw_got_total, raw_want, raw_off;
	uint64_t raw_sent;
	int closes;
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

static double run_xfer(struct bx *b, uint64_t pages, bool checksum)
{
	struct sockaddr_in addr;
	struct sockaddr_storage bound;
	int nl = sizeof(bound);
	struct transport_cfg c = {
		.mem = &b->mem, .page_bytes = b->page_bytes,
		.max_batch_bytes = xfer_batch_bytes(PER_BATCH, b->page_bytes),
		.checksum = checksum,
	};
	uint64_t t0, t1;

	uv_loop_init(&b->loop);
	uv_tcp_init(&b->loop, &b->server);
	b->server.data = b;
	uv_ip4_addr("127.0.0.1", 0, &addr);
	uv_tcp_bind(&b->server, (struct sockaddr *)&addr, 0);
	uv_listen((uv_stream_t *)&b->server, 4, on_conn);
	uv_tcp_getsockname(&b->server, (struct sockaddr *)&bound, &nl);
	c.pool = b->dst;
	c.recv = (struct transport_recv){ rx_batch, rx_bad, NULL };
	c.recv_arg = b;
	transport_tcp_new(&b->rx, &b->loop, &c);
	b->rx->data = b;
	c.pool = b->src;
	c.recv = (struct transport_recv){ 0 };
	transport_tcp_new(&b->tx, &b->loop, &c);
	b->tx->data = b;
	b->want_pages = pages;
	b->got_pages = b->sent_pages = 0;
	b->inflight = 0;
	b->conn.data = b;
	t0 = kvd_now_ns();
	uv_tcp_connect(&b->conn, (uv_tcp_t *)transport_tcp_stream(b->tx),
		       (struct sockaddr *)&bound, on_connect);
	while (b->got_pages < pages)
		uv_run(&b->loop, UV_RUN_ONCE);
	t1 = kvd_now_ns();
	b->closes = 0;
	transport_close(b->tx, closed_t);
	transport_close(b->rx, closed_t);
	uv_close((uv_handle_t *)&b->server, nop_close);
	uv_run(&b->loop, UV_RUN_DEFAULT);
	b->tx->ops->free(b->tx);
	b->rx->ops->free(b->rx);
	uv_loop_close(&b->loop);
	return (double)pages * b->page_bytes / ((double)(t1 - t0) / 1e9) / 1e9;
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

static double run_raw(struct bx *b, uint64_t bytes)
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
	t0 = kvd_now_ns();
	uv_tcp_connect(&b->raw_conn, &b->raw_tx, (struct sockaddr *)&bound, raw_on_connect);
	while (b->raw_got_total < bytes)
		uv_run(&b->loop, UV_RUN_ONCE);
	t1 = kvd_now_ns();
	uv_close((uv_handle_t *)&b->raw_tx, nop_close);
	uv_close((uv_handle_t *)&b->raw_rx, nop_close);
	uv_close((uv_handle_t *)&b->raw_srv, nop_close);
	uv_run(&b->loop, UV_RUN_DEFAULT);
	uv_loop_close(&b->loop);
	return (double)bytes / ((double)(t1 - t0) / 1e9) / 1e9;
}

int main(int argc, char **argv)
{
	uint64_t mib = argc > 1 ? strtoull(argv[1], NULL, 10) : 512;
	int runs = argc > 2 ? atoi(argv[2]) : 3;
	struct kvpool_geom g = { .page_tokens = 16, .n_layer = 16, .kv_dim = 1024,
				 .dtype = KV_DTYPE_F16 };
	struct bx *b = calloc(1, sizeof(*b));
	double on = 0, off = 0, raw = 0;
	uint64_t pages;

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
	b->raw_len = xfer_batch_bytes(PER_BATCH, b->page_bytes);
	b->raw_buf = malloc(b->raw_len);
	b->raw_dst = malloc(b->raw_len);
	memset(b->raw_buf, 3, b->raw_len);
	printf("bench_xfer: page %llu bytes, batch %u pages (%zu bytes), %llu MiB per run, %d runs per mode\n",
	       (unsigned long long)b->page_bytes, PER_BATCH, b->raw_len,
	       (unsigned long long)mib, runs);
	for (int r = 0; r < runs; r++) {
		double x = run_xfer(b, pages, true), y = run_xfer(b, pages, false),
		       z = run_raw(b, pages * b->page_bytes);

		printf("  run %d: transport checksum=on %.2f GB/s  checksum=off %.2f GB/s  raw tcp copy %.2f GB/s\n",
		       r, x, y, z);
		on += x;
		off += y;
		raw += z;
	}
	on /= runs;
	off /= runs;
	raw /= runs;
	printf("xfer_gbps_checksum_on=%.2f xfer_gbps_checksum_off=%.2f raw_tcp_gbps=%.2f ratio_on_vs_raw=%.3f checksum_cost=%.2f%%\n",
	       on, off, raw, on / raw, (off - on) / off * 100.0);
	kvpool_free(b->src);
	kvpool_free(b->dst);
	kvmem_deinit(&b->mem);
	free(b->raw_buf);
	free(b->raw_dst);
	free(b);
	return 0;
}
