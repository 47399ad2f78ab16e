/* fuzz_xfer.c - KV batches (net/xfer.h): xfer_batch_verify on a whole
 * buffer and xfer_reader on a byte stream.
 *
 * The KV data path: a corrupt or lying batch must be refused before any
 * page is written (invariant 5), and a broken header must break the
 * stream, never make us read or write outside the batch. Input: byte 0
 * picks the negotiated geometry (page_bytes, max_batch_bytes,
 * require_checksum); the rest is the stream. Properties:
 *   - verify: 0, or an XFER_E_* it documents; an accepted batch is
 *     exactly xfer_batch_bytes(n) long, within the bound, with n >= 1,
 *     and every entry and page lies inside it; rebuilt with xfer_batch
 *     (same entries, pages, ids, checksum flag) it verifies again and
 *     decodes to the same header, entries and pages;
 *   - reader: the same transcript (codes, headers, batch bytes) whether
 *     the stream arrives at once or in small chunks; every batch it
 *     hands out passes verify on its own; header errors are sticky; it
 *     never stalls (takes nothing while next() says AGAIN); with a
 *     checksum required, no batch without one is ever handed out.
 */
#include <errno.h>
#include <string.h>

#include "net/xfer.h"
#include "tests/fuzz/fuzz.h"

const char fuzz_target_name[] = "xfer";

struct geom {
	uint64_t page_bytes;
	uint64_t max_batch_bytes;
};

/* 8 geometries x checksum required or not = byte 0's low 4 bits. */
static const struct geom geoms[8] = {
	{ 8, 64 + 32 },                 /* exactly one page */
	{ 8, 64 + 3 * 32 },
	{ 32, 1024 },
	{ 64, 64 + 4 * 88 + 1 },
	{ 16, 64 + 40 - 1 },            /* not even one page */
	{ 1, 1 << 16 },
	{ 128, 4096 },
	{ 24, 64 + 48 * 5 },
};

static void check_batch(const uint8_t *b, size_t len, const struct xfer_hdr *h,
			const struct geom *g)
{
	FUZZ_CHECK(h->n_entries >= 1, "empty batch accepted");
	FUZZ_CHECK(len == xfer_batch_bytes(h->n_entries, g->page_bytes) &&
		   len <= g->max_batch_bytes, "batch of %zu bytes, n %u", len,
		   h->n_entries);
	FUZZ_CHECK(h->n_entries <= xfer_batch_pages_max(g->max_batch_bytes,
							g->page_bytes),
		   "n %u above the bound", h->n_entries);
	for (uint32_t i = 0; i < h->n_entries; i++) {
		const uint8_t *p = xfer_batch_page(b, h, i);
		struct xfer_entry e;

		xfer_batch_entry(b, i, &e);
		FUZZ_CHECK(p >= b + XFER_HDR_BYTES && p + h->page_bytes <= b + len,
			   "page %u outside the batch", i);
	}
}

/* Rebuild the batch with the builder; it must decode to the same thing. */
static void check_rebuild(const uint8_t *b, size_t len, const struct xfer_hdr *h,
			  const struct geom *g)
{
	struct xfer_batch x;
	struct xfer_hdr h2;
	int r = xfer_batch_init(&x, g->page_bytes, g->max_batch_bytes);

	FUZZ_CHECK(r == 0, "builder refuses a geometry the reader accepted: %d", r);
	xfer_batch_reset(&x, h->request_id, h->seq);
	for (uint32_t i = 0; i < h->n_entries; i++) {
		struct xfer_entry e;
		uint8_t *slot;

		xfer_batch_entry(b, i, &e);
		r = xfer_batch_add(&x, &e, &slot);
		FUZZ_CHECK(r == 0, "builder full at %u of %u", i, h->n_entries);
		memcpy(slot, xfer_batch_page(b, h, i), g->page_bytes);
	}
	/* a sealed batch's plaintext (what an opener leaves) verifies too:
	 * rebuild it with the same sealing flags */
	size_t l2 = xfer_batch_seal_flags(&x, h->flags & XFER_FLAG_CHECKSUM,
					  h->flags & (XFER_FLAG_SEALED |
						      XFER_FLAG_ENCRYPTED));

	FUZZ_CHECK(l2 == len, "rebuilt %zu bytes, was %zu", l2, len);
	r = xfer_batch_verify(x.buf, l2, g->page_bytes, g->max_batch_bytes,
			      (h->flags & XFER_FLAG_CHECKSUM) != 0, &h2);
	FUZZ_CHECK(r == 0, "rebuilt batch refused: %s", xfer_strerror(r));
	FUZZ_CHECK(h2.request_id == h->request_id && h2.seq == h->seq &&
		   h2.n_entries == h->n_entries && h2.flags == h->flags,
		   "rebuilt header differs");
	for (uint32_t i = 0; i < h->n_entries; i++) {
		struct xfer_entry e1, e2;

		xfer_batch_entry(b, i, &e1);
		xfer_batch_entry(x.buf, i, &e2);
		FUZZ_CHECK(e1.dst_page == e2.dst_page && e1.index == e2.index &&
			   e1.dst_gen == e2.dst_gen && e1.tokens == e2.tokens,
			   "entry %u differs", i);
		FUZZ_CHECK(!memcmp(xfer_batch_page(b, h, i),
				   xfer_batch_page(x.buf, &h2, i), g->page_bytes),
			   "page %u differs", i);
	}
	xfer_batch_deinit(&x);
	xfer_batch_deinit(&x);   /* safe twice */
}

static void stream(const uint8_t *data, size_t size, const struct geom *g,
		   bool req, uint32_t cs, struct fuzz_bytes *t)
{
	struct xfer_reader rd;
	size_t off = 0, used;
	int r, sticky = 0;

	xfer_reader_init(&rd, g->page_bytes, g->max_batch_bytes, req);
	for (;;) {
		struct xfer_hdr h;
		const uint8_t *b;

		for (;;) {
			r = xfer_reader_next(&rd, &h, &b);
			if (r == XFER_E_AGAIN)
				break;
			int8_t code = (int8_t)r;

			fuzz_bytes_add(t, &code, 1);
			if (r == 0) {
				size_t len = xfer_batch_bytes(h.n_entries,
							      g->page_bytes);
				struct xfer_hdr h2;

				FUZZ_CHECK(!req || (h.flags & XFER_FLAG_CHECKSUM),
					   "batch without checksum handed out");
				FUZZ_CHECK(xfer_batch_verify(b, len, g->page_bytes,
							     g->max_batch_bytes,
							     req, &h2) == 0,
					   "handed-out batch fails verify");
				check_batch(b, len, &h, g);
				fuzz_bytes_add(t, b, len);
			} else if (r == XFER_E_CHECKSUM || r == XFER_E_NOCHECKSUM) {
				fuzz_bytes_add(t, &h.seq, sizeof(h.seq));
			} else {
				FUZZ_CHECK(r == XFER_E_MAGIC || r == XFER_E_VERSION ||
					   r == XFER_E_BOUND ||
					   r == XFER_E_GEOMETRY || r == -ENOMEM,
					   "next: %d", r);
				sticky = r;
				break;
			}
		}
		if (sticky) {
			struct xfer_hdr h3;
			const uint8_t *b3;

			FUZZ_CHECK(xfer_reader_next(&rd, &h3, &b3) == sticky &&
				   xfer_reader_feed(&rd, data, size, &used) == sticky,
				   "header error %s is not sticky",
				   xfer_strerror(sticky));
			break;
		}
		if (off == size)
			break;
		size_t n = size - off;

		if (cs) {
			cs = cs * 1103515245u + 12345u;
			n = FUZZ_MIN(n, 1 + (cs >> 16) % 61);
		}
		r = xfer_reader_feed(&rd, data + off, n, &used);
		FUZZ_CHECK(used <= n, "feed took %zu of %zu", used, n);
		off += used;
		if (r) {
			FUZZ_CHECK(r > XFER_E_AGAIN && r < XFER_E_CHECKSUM,
				   "feed: %d", r);
			int8_t code = (int8_t)r;

			fuzz_bytes_add(t, &code, 1);
			sticky = r;
			break;
		}
		FUZZ_CHECK(used > 0, "reader stalled with %zu pending",
			   xfer_reader_pending(&rd));
	}
	int8_t end = sticky ? 100 : (int8_t)(xfer_reader_pending(&rd) > 0);

	fuzz_bytes_add(t, &end, 1);
	xfer_reader_deinit(&rd);
	xfer_reader_deinit(&rd);   /* safe twice */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fuzz_bytes whole = { 0 }, chunked = { 0 };
	struct xfer_hdr h;
	uint32_t cs = 7;

	if (size < 1)
		return 0;
	const struct geom *g = &geoms[data[0] & 7];
	bool req = data[0] & 8;

	data++;
	size--;
	int r = xfer_batch_verify(data, size, g->page_bytes, g->max_batch_bytes,
				  req, &h);

	FUZZ_CHECK(r >= 0 && r <= XFER_E_NOCHECKSUM && r != XFER_E_AGAIN,
		   "verify: %d", r);
	if (r == 0) {
		check_batch(data, size, &h, g);
		check_rebuild(data, size, &h, g);
	}
	/* Coverage of the stream path: a header split reaches every
	 * combination of feed boundaries. The one-shot transcript wins a
	 * boundary disagreement. */
	for (size_t i = 0; i < size && i < 16; i++)
		cs = cs * 31 + data[i];
	stream(data, size, g, req, 0, &whole);
	stream(data, size, g, req, cs | 1, &chunked);
	FUZZ_CHECK(fuzz_bytes_eq(&whole, &chunked),
		   "chunking changed the batches read");
	free(whole.p);
	free(chunked.p);
	return 0;
}

/* ---- seeds: batches built by xfer_batch, for several geometries -------- */

static void seed_batch(fuzz_emit_fn emit, void *ctx, struct fuzz_bytes *b,
		       unsigned gi, bool checksum, uint32_t n, uint32_t seq)
{
	const struct geom *g = &geoms[gi];
	struct xfer_batch x;

	if (xfer_batch_init(&x, g->page_bytes, g->max_batch_bytes))
		return;
	xfer_batch_reset(&x, 1000 + seq, seq);
	for (uint32_t i = 0; i < n; i++) {
		struct xfer_entry e = { .dst_page = 3 * i + 1, .index = i,
					.dst_gen = 5 + i, .tokens = 16 };
		uint8_t *slot;

		if (xfer_batch_add(&x, &e, &slot))
			break;
		for (uint64_t k = 0; k < g->page_bytes; k++)
			slot[k] = (uint8_t)(i * 31 + k);
	}
	size_t len = xfer_batch_seal(&x, checksum);

	fuzz_bytes_add(b, x.buf, len);
	if (emit) {
		uint8_t sel = (uint8_t)(gi | (checksum ? 8 : 0));
		struct fuzz_bytes one = { 0 };

		fuzz_bytes_add(&one, &sel, 1);
		fuzz_bytes_add(&one, x.buf, len);
		emit(ctx, one.p, one.n);
		free(one.p);
	}
	xfer_batch_deinit(&x);
}

void fuzz_target_seeds(fuzz_emit_fn emit, void *ctx)
{
	struct fuzz_bytes b = { 0 };
	uint8_t sel;

	for (unsigned gi = 0; gi < 8; gi++) {
		b.n = 0;
		seed_batch(emit, ctx, &b, gi, true, 3, 0);
		seed_batch(emit, ctx, &b, gi, false, 1, 1);
	}
	/* a stream of three batches, checksum required */
	b.n = 0;
	sel = 2 | 8;
	fuzz_bytes_add(&b, &sel, 1);
	seed_batch(NULL, ctx, &b, 2, true, 2, 0);
	seed_batch(NULL, ctx, &b, 2, true, 1, 1);
	seed_batch(NULL, ctx, &b, 2, true, 3, 2);
	emit(ctx, b.p, b.n);
	free(b.p);
}
