/* test_transport.c - the tcp transport on loopback between two real pools:
 * pages arrive byte-exact with destination tags and pass mark_ready; a
 * corrupted batch is reported (never handed over) and the pool then
 * refuses the coverage; a connection cut mid-batch is reported as a reset;
 * the bound is enforced; verbs says "no RDMA device" instead of pretending;
 * over the emulated device the verbs terms are checked, and the mailbox
 * credits hold a sender at 4 unconsumed batches, refuse lying credits and
 * let the batch through on an honest one (test_verbs_credits);
 * transfer.verbs_inline=auto uses what the device grants and posts a
 * header inline exactly when it fits (test_verbs_inline_auto); pages
 * released while their windows' invalidations are in flight stay FENCED
 * - no other owner can reserve them - until the invalidations completed
 * (test_verbs_release_while_revoking).
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "conf/util.h"
#include "gpu/kv/kvmem.h"
#include "gpu/kv/kvpool.h"
#include "net/peer_auth.h"
#include "net/wire/proto_peer.h"
#include "net/transport.h"
#include "net/verbs/verbs_scope.h"

#define NPAGES 5
#define TOKENS 18          /* 4 full pages of 4 and one of 2 */
#define SRC_OWNER 1
#define DST_OWNER 777

struct fixture {
	uv_loop_t loop;
	uv_tcp_t server;
	uv_connect_t conn;
	struct kvmem mem;
	struct kvpool_geom geom;
	uint64_t page_bytes;
	struct kvpool *src, *dst;
	struct kvpool_ref src_tab[NPAGES], dst_tab[NPAGES];
	struct transport *tx, *rx;
	struct kvd_fault fault;
	int batches_ok, batches_bad, batches_written, sent_ok, sent_err;
	int rx_closed, rx_status, closes;
	uint32_t n_per_batch;
	uint64_t credit_last;           /* verbs: the receiver's running count */
	int credits;
	/* keyed links: the data key as prefill (tx) and decode (rx) hold it */
	bool sealed;
	struct peer_aead seal_tx, seal_rx;
	/* verbs windows: the scope's callbacks */
	int scope_live, scope_dead;
	struct proto_peer_run live_runs[VERBS_SCOPE_RUNS_MAX];
	uint32_t n_live_runs;
};

/* A keyed link's data direction: MAC only, or encrypting. */
static void fx_seal(struct fixture *f, bool encrypt)
{
	f->sealed = true;
	ck_assert_int_eq(peer_auth_global_init(), 0);
	memset(&f->seal_tx, 0, sizeof(f->seal_tx));
	memset(f->seal_tx.key, 0x3c, sizeof(f->seal_tx.key));
	f->seal_tx.encrypt = encrypt;
	f->seal_rx = f->seal_tx;
}

static void fx_pools(struct fixture *f)
{
	f->geom = (struct kvpool_geom){ .page_tokens = 4, .n_layer = 2,
					.kv_dim = 8, .dtype = KV_DTYPE_F32 };
	kvmem_host_init(&f->mem);
	f->page_bytes = kvpool_page_bytes(&f->geom);
	ck_assert_int_eq(kvpool_new(&f->src, &f->mem, &f->geom, 8), 0);
	ck_assert_int_eq(kvpool_new(&f->dst, &f->mem, &f->geom, 8), 0);
	/* burn a reservation so source and destination indices differ */
	{
		struct kvpool_ref x[2];

		ck_assert_int_eq(kvpool_reserve(f->dst, 5, 2, x), 0);
	}
	ck_assert_int_eq(kvpool_reserve(f->src, SRC_OWNER, NPAGES, f->src_tab), 0);
	ck_assert_int_eq(kvpool_fill_begin(f->src, SRC_OWNER, f->src_tab, NPAGES), 0);
	for (int i = 0; i < NPAGES; i++) {
		uint8_t *p = kvpool_page_addr(f->src, f->src_tab[i].page);

		for (uint64_t j = KVTAG_BYTES; j < f->page_bytes; j++)
			p[j] = (uint8_t)(i * 31 + j);
	}
	ck_assert_int_eq(kvpool_tag_write(f->src, SRC_OWNER, f->src_tab, NPAGES, TOKENS), 0);
	ck_assert_int_eq(kvpool_reserve(f->dst, DST_OWNER, NPAGES, f->dst_tab), 0);
	ck_assert_int_eq(kvpool_fill_begin(f->dst, DST_OWNER, f->dst_tab, NPAGES), 0);
}

/* The receiver's owner: check each entry against the reservation, then
 * write the page (what daemon/ does). */
static void rx_batch(void *arg, const struct xfer_hdr *h, const uint8_t *batch)
{
	struct fixture *f = arg;

	f->batches_ok++;
	ck_assert_uint_eq(h->request_id, DST_OWNER);
	/* keyed: the tag is the checksum, no XXH3 beside it */
	if (f->sealed)
		ck_assert_uint_eq(h->flags & XFER_FLAG_CHECKSUM, 0);
	for (uint32_t i = 0; i < h->n_entries; i++) {
		struct xfer_entry e;
		struct kvpool_page_info info;

		xfer_batch_entry(batch, i, &e);
		ck_assert_uint_lt(e.index, NPAGES);
		ck_assert_uint_eq(e.dst_page, f->dst_tab[e.index].page);
		ck_assert_int_eq(kvpool_page_info(f->dst, e.dst_page, &info), 0);
		ck_assert_uint_eq(info.owner, DST_OWNER);
		ck_assert_uint_eq(info.gen, e.dst_gen);
		memcpy(kvpool_page_addr(f->dst, e.dst_page),
		       xfer_batch_page(batch, h, i), f->page_bytes);
		f->batches_written++;
	}
}

static void rx_bad(void *arg, int code, const struct xfer_hdr *h)
{
	struct fixture *f = arg;

	ck_assert_int_eq(code, f->sealed ? XFER_E_AUTH : XFER_E_CHECKSUM);
	f->batches_bad++;
}

static void rx_closed(void *arg, int status)
{
	struct fixture *f = arg;

	f->rx_closed++;
	f->rx_status = status;
}

static void sent_cb(void *arg, int status)
{
	struct fixture *f = arg;

	if (status == 0)
		f->sent_ok++;
	else
		f->sent_err++;
}

static void send_all(struct fixture *f)
{
	struct transport_page pages[NPAGES];
	uint32_t seq = 0;

	for (int i = 0; i < NPAGES; i++) {
		uint32_t toks = KVD_MIN(4, TOKENS - 4 * i);

		pages[i].src_page = f->src_tab[i].page;
		pages[i].dst = (struct xfer_entry){ .dst_page = f->dst_tab[i].page,
						    .index = (uint32_t)i,
						    .dst_gen = f->dst_tab[i].gen,
						    .tokens = toks };
	}
	for (uint32_t i = 0; i < NPAGES; i += f->n_per_batch) {
		uint32_t n = KVD_MIN(f->n_per_batch, NPAGES - i);
		int r = transport_send(f->tx, DST_OWNER, seq++, pages + i, n,
				       sent_cb, f);

		if (r == TRANSPORT_E_CLOSED)
			break;
		ck_assert_int_eq(r, 0);
	}
}

static void on_connect(uv_connect_t *req, int status)
{
	struct fixture *f = req->data;

	ck_assert_int_eq(status, 0);
	ck_assert_int_eq(transport_tcp_start(f->tx, false), 0);
	send_all(f);
}

static void on_connection(uv_stream_t *server, int status)
{
	struct fixture *f = server->data;

	ck_assert_int_eq(status, 0);
	ck_assert_int_eq(uv_accept(server, transport_tcp_stream(f->rx)), 0);
	ck_assert_int_eq(transport_tcp_start(f->rx, true), 0);
}

static void on_closed(struct transport *t)
{
	struct fixture *f = t->data;

	f->closes++;
}

static void on_server_closed(uv_handle_t *h)
{
	(void)h;
}

static void fx_run(struct fixture *f, uint32_t n_per_batch)
{
	struct sockaddr_in addr;
	struct sockaddr_storage bound;
	int namelen = sizeof(bound);
	struct transport_cfg c = {
		.mem = &f->mem, .page_bytes = f->page_bytes,
		.max_batch_bytes = xfer_batch_bytes(3, f->page_bytes),
		.checksum = true, .fault = &f->fault,
	};

	f->n_per_batch = n_per_batch;
	ck_assert_int_eq(uv_loop_init(&f->loop), 0);
	ck_assert_int_eq(uv_tcp_init(&f->loop, &f->server), 0);
	f->server.data = f;
	uv_ip4_addr("127.0.0.1", 0, &addr);
	ck_assert_int_eq(uv_tcp_bind(&f->server, (struct sockaddr *)&addr, 0), 0);
	ck_assert_int_eq(uv_listen((uv_stream_t *)&f->server, 4, on_connection), 0);
	uv_tcp_getsockname(&f->server, (struct sockaddr *)&bound, &namelen);

	c.pool = f->dst;
	c.recv = (struct transport_recv){ .batch = rx_batch, .bad_batch = rx_bad,
					  .closed = rx_closed };
	c.recv_arg = f;
	c.seal = f->sealed ? &f->seal_rx : NULL;
	ck_assert_int_eq(transport_tcp_new(&f->rx, &f->loop, &c), 0);
	f->rx->data = f;
	c.pool = f->src;
	c.recv = (struct transport_recv){ 0 };
	c.seal = f->sealed ? &f->seal_tx : NULL;
	ck_assert_int_eq(transport_tcp_new(&f->tx, &f->loop, &c), 0);
	f->tx->data = f;
	f->conn.data = f;
	ck_assert_int_eq(uv_tcp_connect(&f->conn, (uv_tcp_t *)transport_tcp_stream(f->tx),
					(struct sockaddr *)&bound, on_connect), 0);
	/* run until the receiver has seen every batch or the stream ended */
	while (f->batches_ok + f->batches_bad < (int)((NPAGES + n_per_batch - 1) / n_per_batch) &&
	       !f->rx_closed)
		uv_run(&f->loop, UV_RUN_ONCE);
	while (f->sent_ok + f->sent_err < 1)
		uv_run(&f->loop, UV_RUN_ONCE);
	transport_close(f->tx, on_closed);
	transport_close(f->rx, on_closed);
	uv_close((uv_handle_t *)&f->server, on_server_closed);
	uv_run(&f->loop, UV_RUN_DEFAULT);
	ck_assert_int_eq(f->closes, 2);
	f->tx->ops->free(f->tx);
	f->rx->ops->free(f->rx);
	ck_assert_int_eq(uv_loop_close(&f->loop), 0);
}

static void fx_free(struct fixture *f)
{
	kvpool_free(f->src);
	kvpool_free(f->dst);
	kvmem_deinit(&f->mem);
}

/* _i: 0 keyless (zero-copy), 1 keyed MAC-only (zero-copy, the MAC
 * streamed over the pieces), 2 keyed encrypting (copy path) */
START_TEST(test_loopback)
{
	struct fixture f = { 0 };
	uint32_t bad = 99;

	if (_i)
		fx_seal(&f, _i == 2);
	fx_pools(&f);
	fx_run(&f, 3);
	ck_assert_int_eq(f.batches_ok, 2);
	ck_assert_int_eq(f.batches_bad, 0);
	ck_assert_int_eq(f.batches_written, NPAGES);
	ck_assert_int_eq(f.sent_ok, 2);
	if (_i)   /* both batches opened, in order */
		ck_assert_uint_eq(f.seal_rx.seq, 2);
	/* tags were rewritten for the destination: coverage and tags pass */
	ck_assert_int_eq(kvpool_mark_ready(f.dst, DST_OWNER, f.dst_tab, NPAGES, TOKENS), 0);
	ck_assert_int_eq(kvpool_verify(f.dst, DST_OWNER, f.dst_tab, NPAGES, TOKENS, &bad), 0);
	for (int i = 0; i < NPAGES; i++)
		ck_assert_int_eq(memcmp((uint8_t *)kvpool_page_addr(f.src, f.src_tab[i].page) + KVTAG_BYTES,
					(uint8_t *)kvpool_page_addr(f.dst, f.dst_tab[i].page) + KVTAG_BYTES,
					f.page_bytes - KVTAG_BYTES), 0);
	fx_free(&f);
}
END_TEST

/* One flipped byte after the checksum (and MAC) was computed: keyless,
 * the checksum refuses that batch; keyed (_i 1: MAC-only zero-copy, 2:
 * encrypting), the tag refuses it and the stream ends there. */
START_TEST(test_corrupt_batch)
{
	struct fixture f = { 0 };
	const char *bad_name = NULL;

	ck_assert_int_eq(kvd_fault_parse(&f.fault, "corrupt_batch:1", &bad_name), 0);
	if (_i)
		fx_seal(&f, _i == 2);
	fx_pools(&f);
	fx_run(&f, 3);
	if (!KVD_FAULT_POINTS)
		return;
	if (_i) {
		ck_assert_int_eq(f.batches_bad, 1);
		ck_assert_int_eq(f.batches_ok, 0);
		ck_assert_int_eq(f.batches_written, 0);
		ck_assert_uint_eq(f.seal_rx.seq, 0);
		fx_free(&f);
		return;
	}
	ck_assert_int_eq(f.batches_bad, 1);
	ck_assert_int_eq(f.batches_ok, 1);
	/* only the second batch was written: coverage must fail */
	ck_assert_int_eq(kvpool_mark_ready(f.dst, DST_OWNER, f.dst_tab, NPAGES, TOKENS),
			 KVPOOL_E_TAG);
	fx_free(&f);
}
END_TEST

START_TEST(test_cut_mid_batch)
{
	struct fixture f = { 0 };
	const char *bad_name = NULL;

	ck_assert_int_eq(kvd_fault_parse(&f.fault, "cut_peer_mid_batch:1", &bad_name), 0);
	fx_pools(&f);
	fx_run(&f, 3);
	if (!KVD_FAULT_POINTS)
		return;
	ck_assert_int_eq(f.rx_closed, 1);
	ck_assert_int_eq(f.rx_status, -ECONNRESET);
	ck_assert_int_eq(f.batches_ok, 0);
	ck_assert_int_eq(f.batches_written, 0);
	ck_assert_int_ge(f.sent_err, 1);
	fx_free(&f);
}
END_TEST

START_TEST(test_bound_and_faults)
{
	struct kvd_fault flt;
	const char *bad = NULL;
	struct transport *t = NULL;
	struct transport_cfg c = { .page_bytes = 4096, .max_batch_bytes = 4096 };
	uv_loop_t loop;
	char why[160];
	int r;

	/* not even one page fits the bound */
	ck_assert_int_eq(uv_loop_init(&loop), 0);
	ck_assert_int_eq(transport_tcp_new(&t, &loop, &c), TRANSPORT_E_BOUND);
	ck_assert_int_eq(uv_loop_close(&loop), 0);

	ck_assert_int_eq(kvd_fault_parse(&flt, "slow_batch,corrupt_batch:2", &bad), 0);
	ck_assert_int_eq(kvd_fault_parse(&flt, "nope", &bad), -EINVAL);
	ck_assert_str_eq(bad, "nope");
	ck_assert_int_eq(kvd_fault_parse(&flt, "corrupt_batch:x", &bad), -EINVAL);
	ck_assert_int_eq(kvd_fault_parse(&flt, "corrupt_batch:2", &bad), 0);
	ck_assert_int_eq(kvd_fault_fire(&flt, KVD_FAULT_CORRUPT_BATCH), KVD_FAULT_POINTS);
	ck_assert_int_eq(kvd_fault_fire(&flt, KVD_FAULT_CORRUPT_BATCH), KVD_FAULT_POINTS);
	ck_assert_int_eq(kvd_fault_fire(&flt, KVD_FAULT_CORRUPT_BATCH), 0);
	ck_assert_int_eq(kvd_fault_fire(&flt, KVD_FAULT_SHORT_TRANSFER), 0);

	c.verbs_port = 1;
	c.verbs_qp_depth = 16;
	c.verbs_inline = 64;
	r = transport_verbs_new(&t, NULL, &c, why, sizeof(why));
	ck_assert_ptr_null(t);
	ck_assert(r == -ENODEV || r == -ENOTSUP);
	ck_assert(strlen(why) > 0);
	fprintf(stderr, "verbs: %d %s\n", r, why);
}
END_TEST

/* The configured verbs terms against the emulated device (every build):
 * each term the device cannot meet is refused naming its key; terms it
 * meets open (the boot check: no pool) and give the device's figures;
 * nothing is left in the socket directory. */
#define AUTO TRANSPORT_VERBS_INLINE_AUTO
START_TEST(test_verbs_terms_emu)
{
	static const struct {
		const char *opts;
		uint32_t port, gid, depth, inl;
		int want;
		const char *needle;
		uint32_t scope;   /* transfer.verbs_write_scope: 0 auto, 1 mw, 2 mr */
	} cases[] = {
		{ "", 1, 0, 16, 64, 0, "windows_supported=yes", 0 },
		{ ",mw=0,max_mr_size=65536", 1, 0, 16, 64, 0, "max_mr_size=65536", 0 },
		/* the write scope: auto takes windows where the device has them */
		{ "", 1, 0, 16, 64, 0, "write_scope=memory_windows windows_supported=yes", 0 },
		{ ",mw=0", 1, 0, 16, 64, 0, "write_scope=per_request_mr windows_supported=no", 0 },
		{ "", 1, 0, 16, 64, 0, "write_scope=per_request_mr windows_supported=yes", 2 },
		{ "", 1, 0, 16, 64, 0, "write_scope=memory_windows", 1 },
		{ ",mw=0", 1, 0, 16, 64, -EINVAL,
		  "transfer.verbs_write_scope=mw: the device has no type-2 memory windows", 1 },
		{ ",mtu=1024", 1, 0, 16, 0, 0, "mtu=1024", 0 },
		{ "", 1, 0, 4, 64, -EINVAL, "transfer.verbs_qp_depth must be at least", 0 },
		{ ",max_qp_wr=8", 1, 0, 16, 64, -EINVAL, "transfer.verbs_qp_depth=16 is above the device's max_qp_wr=8", 0 },
		{ ",max_inline=32", 1, 0, 16, 64, -EINVAL, "transfer.verbs_inline=64", 0 },
		{ ",max_inline=100", 1, 0, 16, 128, -EINVAL,
		  "the device refuses an RC queue pair with transfer.verbs_qp_depth=16 and transfer.verbs_inline=128", 0 },
		/* a number is used as given (the device may grant more) */
		{ "", 1, 0, 16, 104, 0, " inline=104 inline_granted=128", 0 },
		{ "", 1, 0, 16, 0, 0, " inline=0 inline_granted=0", 0 },
		/* auto: the largest header of a 1 MiB batch of 4 KiB pages is
		 * past 256, so 256 is asked, then 128, 64, 0 */
		{ "", 1, 0, 16, AUTO, 0, " inline=256 inline_granted=256", 0 },
		{ ",max_inline=255", 1, 0, 16, AUTO, 0, " inline=128 inline_granted=128", 0 },
		{ ",max_inline=127", 1, 0, 16, AUTO, 0, " inline=64 inline_granted=64", 0 },
		{ ",max_inline=63", 1, 0, 16, AUTO, 0, " inline=0 inline_granted=0", 0 },
		{ ",max_inline=4096", 1, 0, 16, AUTO, 0, " inline=256 inline_granted=256", 0 },
		{ "", 2, 0, 16, 64, -EINVAL, "transfer.verbs_port=2: the device has no such port", 0 },
		{ "", 1, 1, 16, 64, -EINVAL, "transfer.verbs_gid_index=1 is outside", 0 },
		{ ",nosuch=1", 1, 0, 16, 64, -ENODEV, "cannot open the emulated RDMA device", 0 },
	};
	char base[64], dev[160], why[400];
	struct transport *t = (struct transport *)1;
	struct transport_cfg c = { .page_bytes = 4096, .max_batch_bytes = 1 << 20 };
	int r;

	snprintf(base, sizeof(base), "/tmp/kvd-tverbs-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(base));
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		snprintf(dev, sizeof(dev), "emu:%s%s", base, cases[i].opts);
		c.verbs_device = dev;
		c.verbs_port = cases[i].port;
		c.verbs_gid_index = cases[i].gid;
		c.verbs_qp_depth = cases[i].depth;
		c.verbs_inline = cases[i].inl;
		c.verbs_write_scope = cases[i].scope;
		why[0] = '\0';
		t = (struct transport *)1;
		r = transport_verbs_new(&t, NULL, &c, why, sizeof(why));
		ck_assert_msg(r == cases[i].want, "%s: %d, want %d (%s)", dev, r,
			      cases[i].want, why);
		if (r == 0) {
			ck_assert_ptr_nonnull(t);
			ck_assert(transport_is_verbs(t));
			transport_verbs_figures(t, why, sizeof(why));
			ck_assert(strstr(why, "device=emulated") != NULL);
			t->ops->free(t);
		} else {
			ck_assert_ptr_null(t);
		}
		ck_assert_msg(strstr(why, cases[i].needle) != NULL,
			      "%s: '%s' lacks '%s'", dev, why, cases[i].needle);
	}
	/* every context unlinked its socket */
	ck_assert_int_eq(rmdir(base), 0);
}
END_TEST

static void rx_credit(void *arg, uint64_t consumed)
{
	struct fixture *f = arg;

	ck_assert_uint_eq(consumed, f->credit_last + 1);
	f->credit_last = consumed;
	f->credits++;
}

static void verbs_closed_cb(struct transport *t)
{
	struct fixture *f = t->data;

	f->closes++;
}

/* Run the loop until *v reaches want or ms pass; true when it did. */
static bool run_until(struct fixture *f, const int *v, int want, int ms)
{
	uint64_t end = kvd_now_ns() + (uint64_t)ms * 1000000ull;

	while (*v < want && kvd_now_ns() < end) {
		uv_run(&f->loop, UV_RUN_NOWAIT);
		usleep(1000);
	}
	return *v >= want;
}

/* Mailbox credits between two emulated endpoints on one loop: with no
 * credit returned to it the sender stops at 4 unconsumed batches (the
 * fifth waits, counted, its bytes in queued()); a credit that goes back,
 * passes the batches posted or reaches the receiver is refused naming
 * the counts and counted; the honest credit lets the fifth batch through,
 * its header inline. */
START_TEST(test_verbs_credits)
{
	struct fixture fx = { .n_per_batch = 1 }, *f = &fx;
	struct transport_verbs_stats txs = { 0 }, rxs = { 0 };
	struct transport_cfg c = { 0 };
	struct proto_peer_verbs_qp qtx, qrx;
	struct proto_peer_run mbox, runs[VERBS_SCOPE_RUNS_MAX];
	uint32_t n_runs = 0;
	char base[64], dev[160], why[200];
	bool live = false;
	int r;

	fx_pools(f);
	ck_assert_int_eq(uv_loop_init(&f->loop), 0);
	snprintf(base, sizeof(base), "/tmp/kvd-tcredit-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(base));
	snprintf(dev, sizeof(dev), "emu:%s,auto=1", base);
	c.mem = &f->mem;
	c.page_bytes = f->page_bytes;
	c.max_batch_bytes = XFER_HDR_BYTES + XFER_ENTRY_BYTES + f->page_bytes;  /* 1 page */
	c.verbs_device = dev;
	c.verbs_port = 1;
	c.verbs_qp_depth = 16;
	c.verbs_inline = 256;
	c.verbs_write_scope = 2;   /* per-request registration: no bind to wait for */
	/* decode: keeps its credits (the test hands them over) */
	c.pool = f->dst;
	c.recv = (struct transport_recv){ .batch = rx_batch, .closed = rx_closed,
					  .credit = rx_credit };
	c.recv_arg = f;
	c.verbs_stats = &rxs;
	ck_assert_int_eq(transport_verbs_new(&f->rx, &f->loop, &c, why, sizeof(why)), 0);
	f->rx->data = f;
	/* prefill */
	c.pool = f->src;
	c.recv = (struct transport_recv){ 0 };
	c.verbs_stats = &txs;
	ck_assert_int_eq(transport_verbs_new(&f->tx, &f->loop, &c, why, sizeof(why)), 0);
	f->tx->data = f;
	ck_assert_int_eq(transport_verbs_describe(f->rx, &qrx, &mbox), 0);
	ck_assert_int_eq(transport_verbs_describe(f->tx, &qtx, NULL), 0);
	ck_assert_int_eq(transport_verbs_connect(f->rx, &qtx, why, sizeof(why)), 0);
	ck_assert_int_eq(transport_verbs_connect(f->tx, &qrx, why, sizeof(why)), 0);
	ck_assert_int_eq(transport_verbs_set_mailbox(f->tx, &mbox, 1, why, sizeof(why)), 0);
	ck_assert_int_eq(transport_verbs_grant(f->rx, DST_OWNER, f->dst_tab, NPAGES, runs,
					       &n_runs, &live), 0);
	ck_assert(live);   /* a registration: live at once */
	ck_assert_int_eq(transport_verbs_scope(f->tx, DST_OWNER, runs, n_runs), 0);
	send_all(f);   /* 5 batches of one page */

	/* no credit comes back: four land, the fifth waits */
	ck_assert(run_until(f, &f->batches_ok, 4, 5000));
	ck_assert(run_until(f, &f->sent_ok, 4, 5000));
	ck_assert(!run_until(f, &f->batches_ok, 5, 200));
	ck_assert_int_eq(f->batches_ok, 4);
	ck_assert_int_eq(f->credits, 4);
	ck_assert_uint_eq(txs.credit_waits, 1);
	ck_assert_uint_eq(f->tx->ops->queued(f->tx), f->page_bytes);
	ck_assert_uint_eq(f->tx->ops->pending(f->tx), 1);

	/* lies: more than posted, going back, to the receiver */
	r = transport_verbs_credit(f->tx, 5, why, sizeof(why));
	ck_assert_int_eq(r, -EPROTO);
	ck_assert_msg(strstr(why, "for 5 batches consumed; 0 were credited before and 4 posted"), "%s", why);
	ck_assert_int_eq(transport_verbs_credit(f->tx, 2, why, sizeof(why)), 0);
	ck_assert_int_eq(transport_verbs_credit(f->tx, 1, why, sizeof(why)), -EPROTO);
	ck_assert_msg(strstr(why, "for 1 batches consumed; 2 were credited before"), "%s", why);
	ck_assert_int_eq(transport_verbs_credit(f->rx, 1, why, sizeof(why)), -EPROTO);
	ck_assert_uint_eq(txs.credit_violations, 2);
	ck_assert_uint_eq(rxs.credit_violations, 1);

	/* the honest credit: the fifth batch goes, into slot 0 again */
	ck_assert_int_eq(transport_verbs_credit(f->tx, f->credit_last, why, sizeof(why)), 0);
	ck_assert(run_until(f, &f->batches_ok, 5, 5000));
	ck_assert(run_until(f, &f->sent_ok, 5, 5000));
	ck_assert_int_eq(f->sent_err, 0);
	ck_assert_int_eq(f->batches_written, NPAGES);
	ck_assert_uint_eq(f->credit_last, 5);
	ck_assert_uint_eq(rxs.credits_returned, 5);
	ck_assert_uint_eq(txs.header_inline, 5);
	ck_assert_uint_eq(txs.header_staged, 0);
	ck_assert_uint_eq(f->tx->ops->queued(f->tx), 0);
	ck_assert_int_eq(f->rx_closed, 0);
	/* the full pages byte for byte (the last one's tail never leaves:
	 * net/verbs/verbs_extent.h, tested by test_verbs_extent) */
	for (int i = 0; i < TOKENS / 4; i++)
		ck_assert_mem_eq((uint8_t *)kvpool_page_addr(f->dst, f->dst_tab[i].page) + KVTAG_BYTES,
				 (uint8_t *)kvpool_page_addr(f->src, f->src_tab[i].page) + KVTAG_BYTES,
				 f->page_bytes - KVTAG_BYTES);

	transport_close(f->tx, verbs_closed_cb);
	transport_close(f->rx, verbs_closed_cb);
	ck_assert(run_until(f, &f->closes, 2, 5000));
	f->tx->ops->free(f->tx);
	f->rx->ops->free(f->rx);
	ck_assert_int_eq(uv_run(&f->loop, UV_RUN_DEFAULT), 0);
	ck_assert_int_eq(uv_loop_close(&f->loop), 0);
	kvpool_free(f->src);
	kvpool_free(f->dst);
	ck_assert_int_eq(rmdir(base), 0);
}
END_TEST

/* The receiver's owner returns every credit at once (daemon/node/link.c sends
 * a verbs_credit message; here both ends share the loop). */
static void rx_credit_fwd(void *arg, uint64_t consumed)
{
	struct fixture *f = arg;
	char why[200];

	rx_credit(arg, consumed);
	ck_assert_int_eq(transport_verbs_credit(f->tx, consumed, why, sizeof(why)), 0);
}

/* transfer.verbs_inline=auto against the emulated device's inline limit:
 * the size in use is what the device granted for the largest header the
 * batch bound allows (80 + 24 bytes per page, at most 256, stepping down
 * 128, 64, 0 while refused); a batch header goes inline exactly when it
 * fits it (counted), and the pages arrive byte for byte either way. */
START_TEST(test_verbs_inline_auto)
{
	static const struct {
		const char *opts;      /* the device's limit (default 256) */
		uint32_t batch_pages;  /* transfer.max_batch_bytes, in pages */
		uint32_t inl;          /* what the transport must use */
		uint64_t n_inline, n_staged;
	} cases[] = {
		/* one page: a 104-byte header, 128 granted: all 5 inline */
		{ "", 1, 128, 5, 0 },
		/* the device refuses 104: 64 granted, every header staged */
		{ ",max_inline=100", 1, 64, 0, 5 },
		/* three pages: 152 asked, 192 granted; headers of 152 and 128 */
		{ "", 3, 192, 2, 0 },
		/* 152 refused, 128 granted: the 3-page header is staged, the
		 * 2-page one (128 bytes) inline */
		{ ",max_inline=150", 3, 128, 1, 1 },
		/* a device without inline data: none, and still a QP */
		{ ",max_inline=0", 1, 0, 0, 5 },
	};

	for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
		struct fixture fx = { .n_per_batch = cases[k].batch_pages }, *f = &fx;
		struct transport_verbs_stats txs = { 0 }, rxs = { 0 };
		struct transport_cfg c = { 0 };
		struct proto_peer_verbs_qp qtx, qrx;
		struct proto_peer_run mbox, runs[VERBS_SCOPE_RUNS_MAX];
		uint32_t n_runs = 0;
		uint64_t n_batches = (NPAGES + cases[k].batch_pages - 1) / cases[k].batch_pages;
		char base[64], dev[160], why[300];
		bool live = false;

		fx_pools(f);
		ck_assert_int_eq(uv_loop_init(&f->loop), 0);
		snprintf(base, sizeof(base), "/tmp/kvd-tinline-XXXXXX");
		ck_assert_ptr_nonnull(mkdtemp(base));
		snprintf(dev, sizeof(dev), "emu:%s,auto=1%s", base, cases[k].opts);
		c.mem = &f->mem;
		c.page_bytes = f->page_bytes;
		c.max_batch_bytes = XFER_HDR_BYTES + cases[k].batch_pages *
				    (XFER_ENTRY_BYTES + f->page_bytes);
		c.verbs_device = dev;
		c.verbs_port = 1;
		c.verbs_qp_depth = 16;
		c.verbs_inline = TRANSPORT_VERBS_INLINE_AUTO;
		c.verbs_write_scope = 2;
		c.pool = f->dst;
		c.recv = (struct transport_recv){ .batch = rx_batch, .closed = rx_closed,
						  .credit = rx_credit_fwd };
		c.recv_arg = f;
		c.verbs_stats = &rxs;
		ck_assert_int_eq(transport_verbs_new(&f->rx, &f->loop, &c, why, sizeof(why)), 0);
		f->rx->data = f;
		c.pool = f->src;
		c.recv = (struct transport_recv){ 0 };
		c.verbs_stats = &txs;
		ck_assert_int_eq(transport_verbs_new(&f->tx, &f->loop, &c, why, sizeof(why)), 0);
		f->tx->data = f;
		ck_assert_uint_eq(transport_verbs_inline(f->tx), cases[k].inl);
		ck_assert_uint_eq(transport_verbs_inline(f->rx), cases[k].inl);
		transport_verbs_figures(f->tx, why, sizeof(why));
		{
			char want[32];

			snprintf(want, sizeof(want), " inline=%u ", cases[k].inl);
			ck_assert_msg(strstr(why, want), "%s lacks%s", why, want);
		}
		ck_assert_int_eq(transport_verbs_describe(f->rx, &qrx, &mbox), 0);
		ck_assert_int_eq(transport_verbs_describe(f->tx, &qtx, NULL), 0);
		ck_assert_int_eq(transport_verbs_connect(f->rx, &qtx, why, sizeof(why)), 0);
		ck_assert_int_eq(transport_verbs_connect(f->tx, &qrx, why, sizeof(why)), 0);
		ck_assert_int_eq(transport_verbs_set_mailbox(f->tx, &mbox, 1, why, sizeof(why)), 0);
		ck_assert_int_eq(transport_verbs_grant(f->rx, DST_OWNER, f->dst_tab, NPAGES, runs,
						       &n_runs, &live), 0);
		ck_assert(live);
		ck_assert_int_eq(transport_verbs_scope(f->tx, DST_OWNER, runs, n_runs), 0);
		send_all(f);
		ck_assert(run_until(f, &f->sent_ok, (int)n_batches, 5000));
		ck_assert(run_until(f, &f->batches_ok, (int)n_batches, 5000));
		ck_assert_int_eq(f->sent_err, 0);
		ck_assert_int_eq(f->batches_written, NPAGES);
		ck_assert_msg(txs.header_inline == cases[k].n_inline &&
			      txs.header_staged == cases[k].n_staged,
			      "%s: %llu inline, %llu staged", dev,
			      (unsigned long long)txs.header_inline,
			      (unsigned long long)txs.header_staged);
		for (int i = 0; i < TOKENS / 4; i++)
			ck_assert_mem_eq((uint8_t *)kvpool_page_addr(f->dst, f->dst_tab[i].page) + KVTAG_BYTES,
					 (uint8_t *)kvpool_page_addr(f->src, f->src_tab[i].page) + KVTAG_BYTES,
					 f->page_bytes - KVTAG_BYTES);
		ck_assert_int_eq(f->rx_closed, 0);
		transport_close(f->tx, verbs_closed_cb);
		transport_close(f->rx, verbs_closed_cb);
		ck_assert(run_until(f, &f->closes, 2, 5000));
		f->tx->ops->free(f->tx);
		f->rx->ops->free(f->rx);
		ck_assert_int_eq(uv_run(&f->loop, UV_RUN_DEFAULT), 0);
		ck_assert_int_eq(uv_loop_close(&f->loop), 0);
		kvpool_free(f->src);
		kvpool_free(f->dst);
		ck_assert_int_eq(rmdir(base), 0);
	}
}
END_TEST

/* Windows' scope callbacks (verbs, memory windows). */
static void rx_scope_live(void *arg, uint64_t id, const struct proto_peer_run *runs,
			  uint32_t n_runs, int status)
{
	struct fixture *f = arg;

	ck_assert_uint_eq(id, DST_OWNER);
	ck_assert_int_eq(status, 0);
	ck_assert_uint_le(n_runs, VERBS_SCOPE_RUNS_MAX);
	memcpy(f->live_runs, runs, sizeof(*runs) * n_runs);
	f->n_live_runs = n_runs;
	f->scope_live++;
}

static void rx_scope_dead(void *arg, uint64_t id)
{
	struct fixture *f = arg;

	ck_assert_uint_eq(id, DST_OWNER);
	f->scope_dead++;
}

/* Every page of the request's table is in `state`. */
static void dst_pages_are(struct fixture *f, enum kvpage_state state)
{
	for (int i = 0; i < NPAGES; i++) {
		struct kvpool_page_info pi;

		ck_assert_int_eq(kvpool_page_info(f->dst, f->dst_tab[i].page, &pi), 0);
		ck_assert_msg(pi.state == state, "page %u: state %d, want %d",
			      f->dst_tab[i].page, (int)pi.state, (int)state);
	}
}

/* A release while the windows' invalidations are in flight (decode's
 * failure paths: a prefill_reject, a peer abort, a timeout after the
 * seal - release, quarantine, failover): the peer wrote the request's
 * pages through its windows, decode revokes the scope (false: the
 * invalidations are posted, their completions not seen) and releases the
 * table at once. The pages must not reach the free list - no other
 * owner can reserve them - until the invalidations completed
 * (scope_dead); then they are free. The transport's fence holds them
 * (net/transport.h, transport_verbs_revoke). */
START_TEST(test_verbs_release_while_revoking)
{
	struct fixture fx = { .n_per_batch = 1 }, *f = &fx;
	struct transport_cfg c = { 0 };
	struct proto_peer_verbs_qp qtx, qrx;
	struct proto_peer_run mbox, runs[VERBS_SCOPE_RUNS_MAX];
	struct kvpool_ref other[NPAGES + 1];
	struct kvpool_stats st;
	uint32_t n_runs = 0, free_before;
	char base[64], dev[160], why[300];
	bool live = true;

	fx_pools(f);
	ck_assert_int_eq(uv_loop_init(&f->loop), 0);
	snprintf(base, sizeof(base), "/tmp/kvd-trevoke-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(base));
	snprintf(dev, sizeof(dev), "emu:%s,auto=1", base);
	c.mem = &f->mem;
	c.page_bytes = f->page_bytes;
	c.max_batch_bytes = XFER_HDR_BYTES + XFER_ENTRY_BYTES + f->page_bytes;
	c.verbs_device = dev;
	c.verbs_port = 1;
	c.verbs_qp_depth = 16;
	c.verbs_inline = 256;
	c.verbs_write_scope = 1;   /* type-2 memory windows */
	c.pool = f->dst;
	c.recv = (struct transport_recv){ .batch = rx_batch, .closed = rx_closed,
					  .credit = rx_credit_fwd,
					  .scope_live = rx_scope_live,
					  .scope_dead = rx_scope_dead };
	c.recv_arg = f;
	ck_assert_int_eq(transport_verbs_new(&f->rx, &f->loop, &c, why, sizeof(why)), 0);
	f->rx->data = f;
	c.pool = f->src;
	c.recv = (struct transport_recv){ 0 };
	ck_assert_int_eq(transport_verbs_new(&f->tx, &f->loop, &c, why, sizeof(why)), 0);
	f->tx->data = f;
	ck_assert_int_eq(transport_verbs_describe(f->rx, &qrx, &mbox), 0);
	ck_assert_int_eq(transport_verbs_describe(f->tx, &qtx, NULL), 0);
	ck_assert_int_eq(transport_verbs_connect(f->rx, &qtx, why, sizeof(why)), 0);
	ck_assert_int_eq(transport_verbs_connect(f->tx, &qrx, why, sizeof(why)), 0);
	ck_assert_int_eq(transport_verbs_set_mailbox(f->tx, &mbox, 1, why, sizeof(why)), 0);
	ck_assert_int_eq(transport_verbs_grant(f->rx, DST_OWNER, f->dst_tab, NPAGES, runs,
					       &n_runs, &live), 0);
	ck_assert(!live);   /* windows: live once the binds completed */
	ck_assert(run_until(f, &f->scope_live, 1, 5000));
	ck_assert_int_eq(transport_verbs_scope(f->tx, DST_OWNER, f->live_runs,
					       f->n_live_runs), 0);
	/* prefill writes part of the KV through the windows */
	send_all(f);
	ck_assert(run_until(f, &f->batches_ok, 2, 5000));
	kvpool_get_stats(f->dst, &st);
	free_before = st.by_state[KVPAGE_FREE];

	/* the failure: revoke (invalidations posted, not completed: the
	 * seal's, or the release's own), revoke again (a failure while
	 * sealing: it changes nothing), then release the table at once, as
	 * dreq_release does */
	ck_assert(!transport_verbs_revoke(f->rx, DST_OWNER));
	ck_assert(!transport_verbs_revoke(f->rx, DST_OWNER));
	ck_assert_int_eq(f->scope_dead, 0);
	ck_assert_int_eq(kvpool_release(f->dst, DST_OWNER, f->dst_tab, NPAGES), 0);
	dst_pages_are(f, KVPAGE_FENCED);
	kvpool_get_stats(f->dst, &st);
	ck_assert_uint_eq(st.by_state[KVPAGE_FREE], free_before);
	/* another request cannot get them: only what was free before */
	ck_assert_int_eq(kvpool_reserve(f->dst, DST_OWNER + 1, free_before + 1, other),
			 KVPOOL_E_FULL);

	/* the invalidations complete: the NIC refuses the peer, the pages
	 * go free */
	ck_assert(run_until(f, &f->scope_dead, 1, 5000));
	dst_pages_are(f, KVPAGE_FREE);
	kvpool_get_stats(f->dst, &st);
	ck_assert_uint_eq(st.by_state[KVPAGE_FREE], free_before + NPAGES);
	ck_assert_int_eq(kvpool_reserve(f->dst, DST_OWNER + 1, free_before + NPAGES, other), 0);
	ck_assert_int_eq(f->rx_closed, 0);

	transport_close(f->tx, verbs_closed_cb);
	transport_close(f->rx, verbs_closed_cb);
	ck_assert(run_until(f, &f->closes, 2, 5000));
	f->tx->ops->free(f->tx);
	f->rx->ops->free(f->rx);
	ck_assert_int_eq(uv_run(&f->loop, UV_RUN_DEFAULT), 0);
	ck_assert_int_eq(uv_loop_close(&f->loop), 0);
	kvpool_free(f->src);
	kvpool_free(f->dst);
	ck_assert_int_eq(rmdir(base), 0);
}
END_TEST

static Suite *transport_suite(void)
{
	Suite *s = suite_create("transport");
	TCase *tc = tcase_create("core");

	tcase_set_timeout(tc, 60);
	tcase_add_loop_test(tc, test_loopback, 0, 3);
	tcase_add_loop_test(tc, test_corrupt_batch, 0, 3);
	tcase_add_test(tc, test_cut_mid_batch);
	tcase_add_test(tc, test_bound_and_faults);
	tcase_add_test(tc, test_verbs_terms_emu);
	tcase_add_test(tc, test_verbs_release_while_revoking);
	tcase_add_test(tc, test_verbs_credits);
	tcase_add_test(tc, test_verbs_inline_auto);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(transport_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
