/* bench_verbs.c - RDMA transfer throughput of KV pages, and what the batch
 * MAC costs next to it.
 *
 *   bench_verbs [--device DEV] [--port N] [--gid-index N] [--rounds R]
 *               [--mib M] [--qp-depth D] [--batch-bytes B] [--inline N]
 *               [--geom tiny|8b|all]
 *
 * Design. The shape of kvd's verbs data path (issue 13), over
 * net/verbs/verbs_ops.h and the same net/ pieces the transport uses: a writer
 * QP and an owner QP of one device (its loopback; two verbs_rc, connected
 * to each other), full KV pages written one RDMA_WRITE each (the page's
 * one extent, net/verbs/verbs_extent.h: tag and K/V blocks, not the alignment
 * padding), each batch of N pages ended by a WRITE_WITH_IMM carrying a
 * small header (inline when the QP allows) whose immediate names the
 * batch. Only that last WR is signaled; outstanding WRs never exceed the
 * QP depth (transfer.verbs_qp_depth), and the writer also waits for the
 * owner to have taken a batch before it reuses its destination slot (a
 * ring of batches, as decode would grant pages), so the owner can check
 * bytes the NIC is no longer writing.
 *
 * Modes, run round-robin (each round starting with the other one, after
 * one warm-up round of each): `write`, the transfer alone; `write+mac`,
 * the writer seals each batch with verbs_mac before posting it and the
 * owner opens it over its own pool bytes when the immediate arrives, as
 * prefill and decode will. The owner checks every batch's header and
 * each page's stamp (the batch number the writer put in the page), and
 * after every round every byte of the ring against the source; a mismatch
 * ends the bench with exit 1. Then verbs_mac_open alone over one batch
 * (median of many) gives decode's integrity work per batch, put next to
 * a batch's transfer time, and a plain memcpy of the same bytes as a
 * reference that does not depend on the device.
 *
 * Geometries (kvd's defaults: 16 positions per page, f16 KV): `tiny`, the
 * 64-dim 2-layer model `kvctl model make` writes (kv_dim 64), and `8b`, a
 * realistic 4096-dim model (Llama 3 8B: 32 layers, 8 KV heads of 128,
 * kv_dim 1024). Pages per batch: as many as --batch-bytes
 * (transfer.max_batch_bytes, 4M) holds, at most half the QP depth less
 * one, at least one.
 *
 * The device defaults to the emulated one (a private directory, removed
 * at the end): its figures are those of a userspace emulation over Unix
 * datagram sockets, useful to compare the MAC with the copy, not a NIC's.
 * One thread does both sides; wall time per batch is the sum of both.
 * Prints GB/s (10^9 bytes of page payload per second) and WR/s, median
 * [min, max] over rounds, and one `bench_verbs: geom=...` summary line per
 * geometry for tests/verbs/run.
 */
#include <dirent.h>
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "conf/log.h"
#include "conf/util.h"
#include "gpu/kv/kvpool.h"
#include "net/peer_auth.h"
#include "net/verbs/verbs_emu.h"
#include "net/verbs/verbs_extent.h"
#include "net/verbs/verbs_mac.h"
#include "net/verbs/verbs_rc.h"

#define HDR_BYTES 64u
#define HDR_MAGIC 0x6b766268u   /* "kvbh" */
#define RING_BATCHES 8u
#define MAX_ROUNDS 64
#define STALL_NS (10ull * 1000000000ull)

struct bv_hdr {                  /* what the WRITE_WITH_IMM carries */
	uint32_t magic;
	uint32_t n_pages;
	uint64_t batch;
	uint8_t tag[PEER_AUTH_TAG_BYTES];
	uint8_t pad[HDR_BYTES - 16 - PEER_AUTH_TAG_BYTES];
};
_Static_assert(sizeof(struct bv_hdr) == HDR_BYTES, "header size");

struct bv_geom {
	const char *name;
	const char *what;
	struct kvpool_geom g;
};

static const struct bv_geom bv_geoms[] = {
	{ "tiny", "64-dim 2-layer (kvctl model make)",
	  { .page_tokens = 16, .n_layer = 2, .kv_dim = 64, .dtype = KV_DTYPE_F16 } },
	{ "8b", "4096-dim 32-layer, 8 KV heads of 128 (Llama 3 8B)",
	  { .page_tokens = 16, .n_layer = 32, .kv_dim = 1024, .dtype = KV_DTYPE_F16 } },
};

enum { BV_WRITE, BV_MAC, BV_MODES };
static const char *const bv_mode_names[BV_MODES] = { "write", "write+mac" };

struct bv_opts {
	char dev[160];
	char emu_dir[64];
	uint8_t port;
	int gid_index;
	uint32_t rounds;
	uint64_t mib;
	uint32_t qp_depth;
	uint64_t batch_bytes;
	uint32_t inline_max;
	int geom;                    /* -1: all */
};

struct bv {
	const struct bv_opts *o;
	const struct verbs_ops *ops;
	bool emu;
	struct verbs_ctx *ctx;
	struct verbs_pd *pd;
	struct verbs_rc w, d;        /* writer (prefill), owner (decode) */
	bool pair_up;

	/* per geometry */
	const struct kvpool_geom *g;
	uint64_t page_bytes;         /* stride of a page in memory */
	uint64_t write_len;          /* bytes one page's WRITE carries */
	uint32_t batch_pages;        /* N */
	uint32_t ring;               /* batches in the ring */
	uint8_t *src, *dst;          /* (ring * N pages, then ring headers) */
	struct verbs_mr *src_mr, *dst_mr;
	struct verbs_mr_info src_mi, dst_mi;
	struct peer_aead mac_tx, mac_rx;
};

/* The emulated device's private directory: removed at exit, also when a
 * failure ends the bench with a context still open (its socket in it). */
static char bv_emu_dir[64];

static void bv_emu_dir_remove(void)
{
	DIR *d;
	struct dirent *e;

	if (!bv_emu_dir[0] || !(d = opendir(bv_emu_dir)))
		return;
	while ((e = readdir(d)))
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
			unlinkat(dirfd(d), e->d_name, 0);
	closedir(d);
	rmdir(bv_emu_dir);
}

static void bv_die(const char *what, int r)
{
	fprintf(stderr, "bench_verbs: %s: %s (%d)\n", what, r < 0 ? strerror(-r) : "refused", r);
	exit(1);
}

static uint8_t *bv_page(uint8_t *base, const struct bv *b, uint32_t slot, uint32_t i)
{
	return base + ((uint64_t)slot * b->batch_pages + i) * b->page_bytes;
}

static uint8_t *bv_hdr(uint8_t *base, const struct bv *b, uint32_t slot)
{
	return base + (uint64_t)b->ring * b->batch_pages * b->page_bytes + slot * HDR_BYTES;
}

static void bv_pair_open(struct bv *b)
{
	struct verbs_qp_caps caps = { .max_send_wr = b->o->qp_depth,
				      .max_recv_wr = b->o->qp_depth,
				      .max_inline = b->o->inline_max };
	struct proto_peer_verbs_qp dw, dd;
	char why[160] = "";
	int r;

	r = verbs_rc_open(&b->w, b->ops, b->ctx, b->pd, b->o->port, b->o->gid_index, &caps,
			  2 * b->o->qp_depth);
	if (r)
		bv_die("verbs_rc_open (writer)", r);
	r = verbs_rc_open(&b->d, b->ops, b->ctx, b->pd, b->o->port, b->o->gid_index, &caps,
			  2 * b->o->qp_depth);
	if (r)
		bv_die("verbs_rc_open (owner)", r);
	verbs_rc_describe(&b->w, &dw);
	verbs_rc_describe(&b->d, &dd);
	r = verbs_rc_connect(&b->w, &dd, why, sizeof(why));
	if (r == 0)
		r = verbs_rc_connect(&b->d, &dw, why, sizeof(why));
	if (r > 0) {
		fprintf(stderr, "bench_verbs: connect: %s\n", why);
		exit(1);
	}
	if (r)
		bv_die("verbs_rc_connect", r);
	b->pair_up = true;
}

static void bv_pair_close(struct bv *b)
{
	verbs_rc_close(&b->w);
	verbs_rc_close(&b->d);
	b->pair_up = false;
}

/* Buffers and registrations for one geometry. */
static void bv_geom_open(struct bv *b, const struct kvpool_geom *g)
{
	struct verbs_extent ex;
	uint64_t bytes, cap;
	int r;

	b->g = g;
	b->page_bytes = kvpool_page_bytes(g);
	if (verbs_extent_page(g, g->page_tokens, &ex, 1) != 1)
		bv_die("verbs_extent_page", -EINVAL);
	b->write_len = ex.length;
	cap = KVD_MAX(1u, b->o->qp_depth / 2 - 1);
	b->batch_pages = (uint32_t)KVD_MAX(1u, KVD_MIN(b->o->batch_bytes / b->page_bytes, cap));
	b->ring = RING_BATCHES;
	bytes = (uint64_t)b->ring * b->batch_pages * b->page_bytes + b->ring * HDR_BYTES;
	b->src = aligned_alloc(4096, (bytes + 4095) & ~4095ull);
	b->dst = aligned_alloc(4096, (bytes + 4095) & ~4095ull);
	if (!b->src || !b->dst)
		bv_die("aligned_alloc", -ENOMEM);
	if (getrandom(b->src, KVD_MIN(bytes, 1u << 20), 0) < 0)
		bv_die("getrandom", -errno);
	for (uint64_t off = 1u << 20; off < bytes; off += 1u << 20)
		memcpy(b->src + off, b->src, KVD_MIN(bytes - off, 1u << 20));
	memset(b->dst, 0, bytes);
	r = b->ops->reg_mr(b->pd, b->src, bytes, VERBS_ACCESS_LOCAL_WRITE, &b->src_mr, &b->src_mi);
	if (r)
		bv_die("reg_mr (source)", r);
	r = b->ops->reg_mr(b->pd, b->dst, bytes,
			   VERBS_ACCESS_LOCAL_WRITE | VERBS_ACCESS_REMOTE_WRITE,
			   &b->dst_mr, &b->dst_mi);
	if (r)
		bv_die("reg_mr (destination)", r);
	if (b->src_mi.length != bytes || b->dst_mi.length != bytes)
		bv_die("the device registered less than asked", 1);
}

static void bv_geom_close(struct bv *b)
{
	b->ops->dereg_mr(b->src_mr);
	b->ops->dereg_mr(b->dst_mr);
	free(b->src);
	free(b->dst);
	b->src = b->dst = NULL;
}

static void bv_mac_pages(const struct bv *b, uint8_t *base, uint32_t slot,
			 struct verbs_mac_page *pages)
{
	for (uint32_t i = 0; i < b->batch_pages; i++)
		pages[i] = (struct verbs_mac_page){ .base = bv_page(base, b, slot, i),
						    .tokens = b->g->page_tokens };
}

/* Post batch `batch`: N page writes, then the header with the immediate. */
static void bv_post_batch(struct bv *b, uint64_t batch, bool mac,
			  struct verbs_mac_page *pages)
{
	uint32_t slot = (uint32_t)(batch % b->ring);
	struct bv_hdr h = { .magic = HDR_MAGIC, .n_pages = b->batch_pages, .batch = batch };
	uint8_t *hs = bv_hdr(b->src, b, slot);
	bool inl = b->o->inline_max >= HDR_BYTES;
	int r;

	for (uint32_t i = 0; i < b->batch_pages; i++)   /* the page's stamp */
		memcpy(bv_page(b->src, b, slot, i), &batch, sizeof(batch));
	if (mac) {
		bv_mac_pages(b, b->src, slot, pages);
		r = verbs_mac_seal(&b->mac_tx, b->g, &h, offsetof(struct bv_hdr, tag), pages,
				   b->batch_pages, h.tag);
		if (r)
			bv_die("verbs_mac_seal", r);
	}
	memcpy(hs, &h, HDR_BYTES);
	for (uint32_t i = 0; i <= b->batch_pages; i++) {
		bool last = i == b->batch_pages;
		struct verbs_sge sg = {
			.addr = (uintptr_t)(last ? hs : bv_page(b->src, b, slot, i)),
			.length = last ? HDR_BYTES : (uint32_t)b->write_len,
			.lkey = b->src_mi.lkey,
		};
		struct verbs_send_wr wr = {
			.wr_id = batch,
			.opcode = last ? VERBS_WR_RDMA_WRITE_WITH_IMM : VERBS_WR_RDMA_WRITE,
			.sg = &sg, .num_sge = 1,
			.remote_addr = (uintptr_t)(last ? bv_hdr(b->dst, b, slot)
						   : bv_page(b->dst, b, slot, i)),
			.rkey = b->dst_mi.rkey,
			.imm = (uint32_t)batch, .inline_data = last && inl, .signaled = last,
		};

		r = b->ops->post_send(b->w.qp, &wr);
		if (r)
			bv_die("post_send", r);
	}
}

/* The owner took batch `batch`: header, stamps and (mac) the MAC. */
static void bv_take_batch(struct bv *b, uint64_t batch, bool mac,
			  struct verbs_mac_page *pages)
{
	uint32_t slot = (uint32_t)(batch % b->ring);
	struct bv_hdr h;

	memcpy(&h, bv_hdr(b->dst, b, slot), HDR_BYTES);
	if (h.magic != HDR_MAGIC || h.batch != batch || h.n_pages != b->batch_pages) {
		fprintf(stderr, "bench_verbs: batch %llu: wrong header\n", (unsigned long long)batch);
		exit(1);
	}
	for (uint32_t i = 0; i < b->batch_pages; i++)
		if (memcmp(bv_page(b->dst, b, slot, i), &batch, sizeof(batch))) {
			fprintf(stderr, "bench_verbs: batch %llu page %u: not written\n",
				(unsigned long long)batch, i);
			exit(1);
		}
	if (mac) {
		int r;

		bv_mac_pages(b, b->dst, slot, pages);
		r = verbs_mac_open(&b->mac_rx, b->g, &h, offsetof(struct bv_hdr, tag), pages,
				   b->batch_pages, h.tag);
		if (r) {
			fprintf(stderr, "bench_verbs: batch %llu: MAC refused (%d)\n",
				(unsigned long long)batch, r);
			exit(1);
		}
	}
}

/* One run: `batches` batches; returns the wall time in ns. */
static uint64_t bv_run(struct bv *b, uint64_t batches, bool mac)
{
	struct verbs_mac_page *pages = calloc(b->batch_pages, sizeof(*pages));
	uint64_t posted = 0, sent = 0, taken = 0, t0, last_progress;
	uint32_t per = b->batch_pages + 1;    /* WRs per batch */
	struct verbs_wc wc[32];
	uint8_t key[PEER_AUTH_BYTES];

	if (!pages)
		bv_die("calloc", -ENOMEM);
	if (getrandom(key, sizeof(key), 0) != sizeof(key))
		bv_die("getrandom", -errno);
	memset(&b->mac_tx, 0, sizeof(b->mac_tx));
	memcpy(b->mac_tx.key, key, sizeof(key));
	b->mac_rx = b->mac_tx;
	for (uint32_t i = 0; i < b->o->qp_depth; i++) {
		int r = b->ops->post_recv(b->d.qp, i);

		if (r)
			bv_die("post_recv", r);
	}
	t0 = last_progress = kvd_now_ns();
	while (taken < batches || sent < batches) {
		uint64_t before = sent + taken;
		int n;

		while (posted < batches && (posted - sent + 1) * per <= b->o->qp_depth &&
		       posted < taken + b->ring)
			bv_post_batch(b, posted++, mac, pages);
		if (b->emu && (n = verbs_emu_deliver(b->ctx, ~0u)) < 0)
			bv_die("verbs_emu_deliver", n);
		n = b->ops->poll_cq(b->w.cq, 32, wc);
		if (n < 0)
			bv_die("poll_cq (writer)", n);
		for (int i = 0; i < n; i++) {
			if (wc[i].status != VERBS_WC_SUCCESS || wc[i].wr_id != sent) {
				fprintf(stderr, "bench_verbs: batch %llu: %s\n",
					(unsigned long long)wc[i].wr_id,
					verbs_wc_status_name(wc[i].status));
				exit(1);
			}
			sent++;
		}
		n = b->ops->poll_cq(b->d.cq, 32, wc);
		if (n < 0)
			bv_die("poll_cq (owner)", n);
		for (int i = 0; i < n; i++) {
			int r;

			if (wc[i].status != VERBS_WC_SUCCESS || !wc[i].has_imm ||
			    wc[i].imm != (uint32_t)taken) {
				fprintf(stderr, "bench_verbs: receive %llu: %s\n",
					(unsigned long long)taken, verbs_wc_status_name(wc[i].status));
				exit(1);
			}
			bv_take_batch(b, taken++, mac, pages);
			r = b->ops->post_recv(b->d.qp, wc[i].wr_id);
			if (r)
				bv_die("post_recv", r);
		}
		if (sent + taken != before) {
			last_progress = kvd_now_ns();
		} else if (kvd_now_ns() - last_progress > STALL_NS) {
			fprintf(stderr, "bench_verbs: no completion for 10 s (posted %llu, sent %llu, taken %llu)\n",
				(unsigned long long)posted, (unsigned long long)sent,
				(unsigned long long)taken);
			exit(1);
		}
	}
	t0 = kvd_now_ns() - t0;
	free(pages);
	/* the receives left posted are flushed with the pair: a fresh pair
	 * per run keeps each run's queues empty at its start */
	return t0;
}

/* Every byte of the ring's pages equals the source (after a run). */
static void bv_check_ring(struct bv *b)
{
	for (uint32_t s = 0; s < b->ring; s++)
		for (uint32_t i = 0; i < b->batch_pages; i++)
			if (memcmp(bv_page(b->dst, b, s, i), bv_page(b->src, b, s, i), b->write_len)) {
				fprintf(stderr, "bench_verbs: slot %u page %u differs from its source\n",
					s, i);
				exit(1);
			}
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

struct bv_stat {
	double med, min, max;
};

static struct bv_stat bv_stat(double *v, uint32_t n)
{
	qsort(v, n, sizeof(*v), cmp_d);
	return (struct bv_stat){ .med = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2,
				 .min = v[0], .max = v[n - 1] };
}

/* verbs_mac over one batch alone: ns per call, median of 15 samples of
 * enough calls to fill about 0.2 s in all. open_side: verbs_mac_open over
 * the destination (decode's work), else verbs_mac_seal over the source. */
static double bv_mac_alone(struct bv *b, bool open_side)
{
	struct verbs_mac_page *pages = calloc(b->batch_pages, sizeof(*pages));
	struct bv_hdr h = { .magic = HDR_MAGIC, .n_pages = b->batch_pages };
	struct peer_aead a = b->mac_tx;
	double v[15];
	uint32_t reps = 1;
	int r;

	if (!pages)
		bv_die("calloc", -ENOMEM);
	bv_mac_pages(b, open_side ? b->dst : b->src, 0, pages);
	r = verbs_mac_seal(&a, b->g, &h, offsetof(struct bv_hdr, tag), pages,
			   b->batch_pages, h.tag);
	if (r)
		bv_die("verbs_mac_seal", r);
	for (int k = -1; k < 15; k++) {
		uint64_t t = kvd_now_ns();

		for (uint32_t i = 0; i < reps; i++) {
			uint8_t tag[PEER_AUTH_TAG_BYTES];

			a = b->mac_tx;   /* the counter the tag was made with */
			r = open_side ? verbs_mac_open(&a, b->g, &h, offsetof(struct bv_hdr, tag),
						       pages, b->batch_pages, h.tag)
				      : verbs_mac_seal(&a, b->g, &h, offsetof(struct bv_hdr, tag),
						       pages, b->batch_pages, tag);
			if (r)
				bv_die(open_side ? "verbs_mac_open" : "verbs_mac_seal", r);
		}
		t = kvd_now_ns() - t;
		if (k < 0)        /* calibration */
			reps = (uint32_t)KVD_MAX(1u, KVD_MIN(100000u, 200000000ull / (t + 1) / 15));
		else
			v[k] = (double)t / reps;
	}
	free(pages);
	return bv_stat(v, 15).med;
}

/* One batch's page bytes copied by the CPU (memcpy, source ring slot 0 to
 * slot 1 of the destination): ns, median as bv_mac_alone - a reference
 * that does not depend on the device, for reading the MAC's figure. */
static double bv_memcpy_alone(struct bv *b)
{
	double v[15];
	uint32_t reps = 1;

	for (int k = -1; k < 15; k++) {
		uint64_t t = kvd_now_ns();

		for (uint32_t i = 0; i < reps; i++)
			for (uint32_t p = 0; p < b->batch_pages; p++)
				memcpy(bv_page(b->dst, b, 1, p), bv_page(b->src, b, 0, p),
				       b->write_len);
		t = kvd_now_ns() - t;
		if (k < 0)
			reps = (uint32_t)KVD_MAX(1u, KVD_MIN(100000u, 200000000ull / (t + 1) / 15));
		else
			v[k] = (double)t / reps;
	}
	return bv_stat(v, 15).med;
}

static void bv_geom_run(struct bv *b, const struct bv_geom *gm)
{
	double gbps[BV_MODES][MAX_ROUNDS], wrps[BV_MODES][MAX_ROUNDS], usb[BV_MODES][MAX_ROUNDS];
	struct bv_stat sg[BV_MODES], sw[BV_MODES], su[BV_MODES];
	uint64_t batch_bytes, batches;
	double mac_open, mac_seal, copy;

	bv_geom_open(b, &gm->g);
	batch_bytes = (uint64_t)b->batch_pages * b->write_len;
	batches = KVD_MAX((uint64_t)b->ring, (b->o->mib << 20) / batch_bytes);
	printf("\ngeometry %s: %s, %u positions per page, f16\n", gm->name, gm->what,
	       gm->g.page_tokens);
	printf("  page %llu B (write %llu B), %u pages per batch (%llu B) + one %u B header "
	       "(WRITE_WITH_IMM%s), %llu batches per run, ring of %u batches\n",
	       (unsigned long long)b->page_bytes, (unsigned long long)b->write_len,
	       b->batch_pages, (unsigned long long)batch_bytes, HDR_BYTES,
	       b->o->inline_max >= HDR_BYTES ? ", inline" : "",
	       (unsigned long long)batches, b->ring);
	for (int32_t r = -1; r < (int32_t)b->o->rounds; r++) {     /* -1: warm-up */
		for (int k = 0; k < BV_MODES; k++) {
			int m = (k + (r < 0 ? 0 : r)) % BV_MODES;
			uint64_t ns;

			bv_pair_open(b);
			ns = bv_run(b, batches, m == BV_MAC);
			bv_pair_close(b);
			bv_check_ring(b);
			if (r < 0)
				continue;
			gbps[m][r] = (double)(batches * batch_bytes) / (double)ns;
			wrps[m][r] = (double)(batches * (b->batch_pages + 1)) * 1e9 / (double)ns;
			usb[m][r] = (double)ns / 1e3 / (double)batches;
		}
	}
	for (int m = 0; m < BV_MODES; m++) {
		sg[m] = bv_stat(gbps[m], b->o->rounds);
		sw[m] = bv_stat(wrps[m], b->o->rounds);
		su[m] = bv_stat(usb[m], b->o->rounds);
		printf("  %-10s %7.3f GB/s [%.3f, %.3f]  %9.0f WR/s [%.0f, %.0f]  "
		       "%9.1f us/batch [%.1f, %.1f]\n", bv_mode_names[m],
		       sg[m].med, sg[m].min, sg[m].max, sw[m].med, sw[m].min, sw[m].max,
		       su[m].med, su[m].min, su[m].max);
	}
	mac_seal = bv_mac_alone(b, false) / 1e3;
	mac_open = bv_mac_alone(b, true) / 1e3;
	copy = bv_memcpy_alone(b) / 1e3;
	printf("  verbs_mac over one batch: open (decode) %.1f us = %.1f%% of a batch's write "
	       "time, %.2f GB/s; seal (prefill) %.1f us; write+mac - write = %+.1f us/batch\n",
	       mac_open, 100.0 * mac_open / su[BV_WRITE].med,
	       (double)batch_bytes / (mac_open * 1e3), mac_seal,
	       su[BV_MAC].med - su[BV_WRITE].med);
	printf("  memcpy of one batch's pages on this CPU: %.1f us, %.2f GB/s (the MAC open is "
	       "%.1fx that)\n", copy, (double)batch_bytes / (copy * 1e3), mac_open / copy);
	printf("bench_verbs: geom=%s page_bytes=%llu write_bytes=%llu batch_pages=%u "
	       "write_gbps=%.3f write_wrps=%.0f mac_gbps=%.3f mac_open_us=%.1f "
	       "mac_share_pct=%.1f memcpy_gbps=%.3f\n", gm->name,
	       (unsigned long long)b->page_bytes, (unsigned long long)b->write_len,
	       b->batch_pages, sg[BV_WRITE].med, sw[BV_WRITE].med, sg[BV_MAC].med, mac_open,
	       100.0 * mac_open / su[BV_WRITE].med, (double)batch_bytes / (copy * 1e3));
	fflush(stdout);
	bv_geom_close(b);
}

static int usage(void)
{
	fprintf(stderr, "usage: bench_verbs [--device DEV] [--port N] [--gid-index N] "
		"[--rounds R] [--mib M] [--qp-depth D] [--batch-bytes B] [--inline N] "
		"[--geom tiny|8b|all]\n");
	return 2;
}

static bool arg_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out)
{
	char *end;
	unsigned long long v;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi)
		return false;
	*out = v;
	return true;
}

static int bv_args(struct bv_opts *o, int argc, char **argv)
{
	uint64_t v;

	*o = (struct bv_opts){ .port = 1, .rounds = 5, .mib = 256, .qp_depth = 128,
			       .batch_bytes = 4u << 20, .inline_max = 64, .geom = -1 };
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;

		if (!val)
			return usage();
		i++;
		if (!strcmp(a, "--device") && strlen(val) < sizeof(o->dev))
			snprintf(o->dev, sizeof(o->dev), "%s", val);
		else if (!strcmp(a, "--port") && arg_u64(val, 1, 255, &v))
			o->port = (uint8_t)v;
		else if (!strcmp(a, "--gid-index") && arg_u64(val, 0, 255, &v))
			o->gid_index = (int)v;
		else if (!strcmp(a, "--rounds") && arg_u64(val, 1, MAX_ROUNDS, &v))
			o->rounds = (uint32_t)v;
		else if (!strcmp(a, "--mib") && arg_u64(val, 1, 1u << 20, &v))
			o->mib = v;
		else if (!strcmp(a, "--qp-depth") && arg_u64(val, 4, 16384, &v))
			o->qp_depth = (uint32_t)v;
		else if (!strcmp(a, "--batch-bytes") && arg_u64(val, 4096, 1u << 30, &v))
			o->batch_bytes = v;
		else if (!strcmp(a, "--inline") && arg_u64(val, 0, 4096, &v))
			o->inline_max = (uint32_t)v;
		else if (!strcmp(a, "--geom") && !strcmp(val, "all"))
			o->geom = -1;
		else if (!strcmp(a, "--geom") && !strcmp(val, "tiny"))
			o->geom = 0;
		else if (!strcmp(a, "--geom") && !strcmp(val, "8b"))
			o->geom = 1;
		else
			return usage();
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct bv_opts o;
	struct bv b = { .o = &o };
	struct verbs_dev_attr attr;
	int r = bv_args(&o, argc, argv);

	if (r)
		return r;
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (peer_auth_global_init())
		bv_die("libsodium", -EIO);
	if (!o.dev[0]) {
		snprintf(o.emu_dir, sizeof(o.emu_dir), "/tmp/kvd-bench-verbs-XXXXXX");
		if (!mkdtemp(o.emu_dir))
			bv_die("mkdtemp", -errno);
		snprintf(o.dev, sizeof(o.dev), "emu:%s", o.emu_dir);
		memcpy(bv_emu_dir, o.emu_dir, sizeof(bv_emu_dir));
		atexit(bv_emu_dir_remove);
	}
	b.emu = !strncmp(o.dev, "emu:", 4);
	b.ops = b.emu ? verbs_emu_ops() : verbs_real_ops();
	if (!b.ops) {
		printf("bench_verbs: this build has no libibverbs (only emu: devices)\n");
		return 77;
	}
	r = b.ops->open(o.dev, &b.ctx);
	if (r == -ENODEV || r == -ENOSYS) {
		printf("bench_verbs: no RDMA device %s (%s)\n", KVLOG_Q(o.dev), strerror(-r));
		return 77;
	}
	if (r)
		bv_die("open", r);
	r = b.ops->query_device(b.ctx, &attr);
	if (r)
		bv_die("query_device", r);
	if (o.qp_depth > attr.max_qp_wr)
		bv_die("--qp-depth is past the device's max_qp_wr", -EINVAL);
	r = b.ops->alloc_pd(b.ctx, &b.pd);
	if (r)
		bv_die("alloc_pd", r);
	printf("bench_verbs: device=%s (%s) qp_depth=%u inline=%u rounds=%u mib=%llu "
	       "batch_bytes=%llu; medians [min, max] over rounds, modes interleaved\n",
	       KVLOG_Q(o.dev), b.emu ? "emulated: a userspace copy over Unix sockets, not a NIC"
				   : "ibverbs", o.qp_depth, o.inline_max, o.rounds,
	       (unsigned long long)o.mib, (unsigned long long)o.batch_bytes);
	for (int i = 0; i < (int)KVD_ARRAY_SIZE(bv_geoms); i++)
		if (o.geom < 0 || o.geom == i)
			bv_geom_run(&b, &bv_geoms[i]);
	b.ops->dealloc_pd(b.pd);
	b.ops->close(b.ctx);
	if (o.emu_dir[0] && rmdir(o.emu_dir)) {   /* every socket unlinked */
		fprintf(stderr, "bench_verbs: %s: %s\n", o.emu_dir, strerror(errno));
		return 1;
	}
	bv_emu_dir[0] = 0;
	return 0;
}
