/* xfer.c - KV batches.
 *
 * Design. A batch is the unit of three guarantees:
 *  - bounded (invariant 5): the builder never holds more pages than fit in
 *    max_batch_bytes, and the reader refuses a header that announces more
 *    before a single body byte is buffered, so neither side allocates or
 *    waits on more than the bound;
 *  - checksummed: XXH3-64 over header (checksum field as zero), entries
 *    and payload. The receiver verifies it before anyone looks at the
 *    entries, so a flipped bit in a destination page number cannot make
 *    decode write into the wrong page;
 *  - self-describing: every entry names its destination page, generation,
 *    index and token count, and each page's payload starts with the
 *    integrity tag for exactly those values. Decode checks the entries
 *    against its reservation; the pool checks the tags at mark_ready.
 *
 * The reader keeps one batch at a time in a buffer that grows to at most
 * the bound. feed() never takes bytes past the end of the current batch,
 * so the caller's "feed, next, feed the rest" loop always progresses.
 */
#include "net/xfer.h"
#include "net/wire/names.h"
#include "conf/util.h"

#include <endian.h>
#include <sys/uio.h>
#include <errno.h>
#include <string.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

/* Header field offsets. */
enum {
	XO_MAGIC = 0,
	XO_VERSION = 4,
	XO_FLAGS = 6,
	XO_REQ = 8,
	XO_SEQ = 16,
	XO_N = 20,
	XO_PAGE_BYTES = 24,
	XO_PAYLOAD = 32,
	XO_CHECKSUM = 40,
};

static const char *const xfer_error_names[] = {
	[XFER_E_AGAIN] = "again",
	[XFER_E_MAGIC] = "bad_magic",
	[XFER_E_VERSION] = "bad_version",
	[XFER_E_BOUND] = "over_bound",
	[XFER_E_GEOMETRY] = "bad_geometry",
	[XFER_E_CHECKSUM] = "checksum_mismatch",
	[XFER_E_NOCHECKSUM] = "checksum_missing",
	[XFER_E_FULL] = "full",
	[XFER_E_AUTH] = "auth_failed",
};

const char *xfer_strerror(int code)
{
	return NET_NAME(xfer_error_names, code);
}

static void put16(uint8_t *p, uint16_t v) { v = htole16(v); memcpy(p, &v, 2); }
static void put32(uint8_t *p, uint32_t v) { v = htole32(v); memcpy(p, &v, 4); }
static void put64(uint8_t *p, uint64_t v) { v = htole64(v); memcpy(p, &v, 8); }
static uint16_t get16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return le16toh(v); }
static uint32_t get32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return le32toh(v); }
static uint64_t get64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return le64toh(v); }

uint64_t xfer_batch_bytes(uint32_t n, uint64_t page_bytes)
{
	return XFER_HDR_BYTES + (uint64_t)n * (XFER_ENTRY_BYTES + page_bytes);
}

uint32_t xfer_batch_pages_max(uint64_t max_batch_bytes, uint64_t page_bytes)
{
	uint64_t n;

	if (!page_bytes || max_batch_bytes < XFER_HDR_BYTES)
		return 0;
	n = (max_batch_bytes - XFER_HDR_BYTES) / (XFER_ENTRY_BYTES + page_bytes);
	return n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
}

/* XXH3-64 of buf[0, len) with the checksum field read as zero. */
static uint64_t batch_checksum(const uint8_t *buf, size_t len)
{
	static const uint8_t zero[8];
	XXH3_state_t st;

	XXH3_64bits_reset(&st);
	XXH3_64bits_update(&st, buf, XO_CHECKSUM);
	XXH3_64bits_update(&st, zero, 8);
	XXH3_64bits_update(&st, buf + XO_CHECKSUM + 8, len - XO_CHECKSUM - 8);
	return XXH3_64bits_digest(&st);
}

/* ---- building ----------------------------------------------------------- */

int xfer_batch_init(struct xfer_batch *b, uint64_t page_bytes,
		    uint64_t max_batch_bytes)
{
	return xfer_batch_init_reuse(b, page_bytes, max_batch_bytes, NULL);
}

int xfer_batch_init_reuse(struct xfer_batch *b, uint64_t page_bytes,
			  uint64_t max_batch_bytes, uint8_t *buf)
{
	memset(b, 0, sizeof(*b));
	b->n_max = xfer_batch_pages_max(max_batch_bytes, page_bytes);
	if (!b->n_max) {
		free(buf);
		return XFER_E_BOUND;
	}
	b->page_bytes = page_bytes;
	b->buf = buf ? buf : aligned_alloc(64, (xfer_batch_bytes(b->n_max, page_bytes) +
						XFER_TRAILER_BYTES + 63) & ~63ull);
	if (!b->buf)
		return -ENOMEM;
	return 0;
}

uint8_t *xfer_batch_take_buf(struct xfer_batch *b)
{
	uint8_t *buf = b->buf;

	b->buf = NULL;
	xfer_batch_deinit(b);
	return buf;
}

void xfer_batch_deinit(struct xfer_batch *b)
{
	free(b->buf);
	b->buf = NULL;
	b->n = b->n_max = 0;
}

void xfer_batch_reset(struct xfer_batch *b, uint64_t request_id, uint32_t seq)
{
	b->n = 0;
	b->request_id = request_id;
	b->seq = seq;
}

/* The payload of a batch being built sits after the n_max entry slots;
 * seal() closes the gap so the wire image is contiguous. Building into
 * fixed slots lets add() hand out a payload pointer before n is known. */
static uint8_t *build_payload(struct xfer_batch *b, uint32_t i)
{
	return b->buf + XFER_HDR_BYTES + (size_t)b->n_max * XFER_ENTRY_BYTES +
	       (size_t)i * b->page_bytes;
}

int xfer_batch_add(struct xfer_batch *b, const struct xfer_entry *e,
		   uint8_t **slot)
{
	uint8_t *p;

	if (b->n >= b->n_max)
		return XFER_E_FULL;
	p = b->buf + XFER_HDR_BYTES + (size_t)b->n * XFER_ENTRY_BYTES;
	put32(p, e->dst_page);
	put32(p + 4, e->index);
	put64(p + 8, e->dst_gen);
	put32(p + 16, e->tokens);
	put32(p + 20, 0);
	*slot = build_payload(b, b->n);
	b->n++;
	return 0;
}

size_t xfer_batch_seal(struct xfer_batch *b, bool checksum)
{
	return xfer_batch_seal_flags(b, checksum, 0);
}

size_t xfer_batch_seal_flags(struct xfer_batch *b, bool checksum,
			     uint16_t flags)
{
	uint8_t *h = b->buf;
	size_t len = xfer_batch_bytes(b->n, b->page_bytes);
	uint8_t *dst = b->buf + XFER_HDR_BYTES + (size_t)b->n * XFER_ENTRY_BYTES;

	if (b->n < b->n_max)
		memmove(dst, build_payload(b, 0), (size_t)b->n * b->page_bytes);
	memset(h, 0, XFER_HDR_BYTES);
	put32(h + XO_MAGIC, XFER_MAGIC);
	put16(h + XO_VERSION, XFER_VERSION);
	put16(h + XO_FLAGS, (uint16_t)((checksum ? XFER_FLAG_CHECKSUM : 0) |
				       (flags & (XFER_FLAG_SEALED | XFER_FLAG_ENCRYPTED))));
	put64(h + XO_REQ, b->request_id);
	put32(h + XO_SEQ, b->seq);
	put32(h + XO_N, b->n);
	put64(h + XO_PAGE_BYTES, b->page_bytes);
	put64(h + XO_PAYLOAD, (uint64_t)b->n * b->page_bytes);
	if (checksum)
		put64(h + XO_CHECKSUM, batch_checksum(b->buf, len));
	return len;
}

void xfer_hdr_write(uint8_t *h, uint64_t request_id, uint32_t seq,
		    uint32_t n, uint64_t page_bytes, bool checksum)
{
	memset(h, 0, XFER_HDR_BYTES);
	put32(h + XO_MAGIC, XFER_MAGIC);
	put16(h + XO_VERSION, XFER_VERSION);
	put16(h + XO_FLAGS, checksum ? XFER_FLAG_CHECKSUM : 0);
	put64(h + XO_REQ, request_id);
	put32(h + XO_SEQ, seq);
	put32(h + XO_N, n);
	put64(h + XO_PAGE_BYTES, page_bytes);
	put64(h + XO_PAYLOAD, (uint64_t)n * page_bytes);
}

void xfer_entry_write(uint8_t *p, const struct xfer_entry *e)
{
	put32(p, e->dst_page);
	put32(p + 4, e->index);
	put64(p + 8, e->dst_gen);
	put32(p + 16, e->tokens);
	put32(p + 20, 0);
}

void xfer_hdr_add_flags(uint8_t *hdr, uint16_t flags)
{
	uint16_t f = get16(hdr + XO_FLAGS);

	put16(hdr + XO_FLAGS, (uint16_t)(f | (flags & XFER_FLAG_SEALED)));
}

void xfer_hdr_checksum_iov(uint8_t *hdr, const struct iovec *iov, int n_iov)
{
	XXH3_state_t st;

	put64(hdr + XO_CHECKSUM, 0);
	XXH3_64bits_reset(&st);
	for (int i = 0; i < n_iov; i++)
		XXH3_64bits_update(&st, iov[i].iov_base, iov[i].iov_len);
	put64(hdr + XO_CHECKSUM, XXH3_64bits_digest(&st));
}

/* ---- reading ------------------------------------------------------------ */

int xfer_hdr_parse(const uint8_t *p, uint64_t page_bytes,
		   uint64_t max_batch_bytes, struct xfer_hdr *h)
{
	memset(h, 0, sizeof(*h));
	if (get32(p + XO_MAGIC) != XFER_MAGIC)
		return XFER_E_MAGIC;
	h->version = get16(p + XO_VERSION);
	h->flags = get16(p + XO_FLAGS);
	h->request_id = get64(p + XO_REQ);
	h->seq = get32(p + XO_SEQ);
	h->n_entries = get32(p + XO_N);
	h->page_bytes = get64(p + XO_PAGE_BYTES);
	h->payload_bytes = get64(p + XO_PAYLOAD);
	h->checksum = get64(p + XO_CHECKSUM);
	if (h->version != XFER_VERSION ||
	    (h->flags & ~(XFER_FLAG_CHECKSUM | XFER_FLAG_SEALED | XFER_FLAG_ENCRYPTED)) ||
	    ((h->flags & XFER_FLAG_ENCRYPTED) && !(h->flags & XFER_FLAG_SEALED)))
		return XFER_E_VERSION;
	if (h->page_bytes != page_bytes)
		return XFER_E_GEOMETRY;
	if (h->n_entries == 0 ||
	    h->n_entries > xfer_batch_pages_max(max_batch_bytes, page_bytes))
		return XFER_E_BOUND;
	if (h->payload_bytes != (uint64_t)h->n_entries * page_bytes)
		return XFER_E_GEOMETRY;
	return 0;
}

int xfer_batch_verify(const uint8_t *buf, size_t len, uint64_t page_bytes,
		      uint64_t max_batch_bytes, bool require_checksum,
		      struct xfer_hdr *h)
{
	int r;

	if (len < XFER_HDR_BYTES)
		return XFER_E_MAGIC;
	r = xfer_hdr_parse(buf, page_bytes, max_batch_bytes, h);
	if (r)
		return r;
	if (len != xfer_batch_bytes(h->n_entries, page_bytes))
		return XFER_E_GEOMETRY;
	if (!(h->flags & XFER_FLAG_CHECKSUM))
		return require_checksum ? XFER_E_NOCHECKSUM : 0;
	return batch_checksum(buf, len) == h->checksum ? 0 : XFER_E_CHECKSUM;
}

void xfer_batch_entry(const uint8_t *batch, uint32_t i, struct xfer_entry *e)
{
	const uint8_t *p = batch + XFER_HDR_BYTES + (size_t)i * XFER_ENTRY_BYTES;

	e->dst_page = get32(p);
	e->index = get32(p + 4);
	e->dst_gen = get64(p + 8);
	e->tokens = get32(p + 16);
}

const uint8_t *xfer_batch_page(const uint8_t *batch, const struct xfer_hdr *h,
			       uint32_t i)
{
	return batch + XFER_HDR_BYTES + (size_t)h->n_entries * XFER_ENTRY_BYTES +
	       (size_t)i * h->page_bytes;
}

void xfer_reader_init(struct xfer_reader *r, uint64_t page_bytes,
		      uint64_t max_batch_bytes, bool require_checksum)
{
	memset(r, 0, sizeof(*r));
	r->need = XFER_HDR_BYTES;
	r->page_bytes = page_bytes;
	r->max_batch_bytes = max_batch_bytes;
	r->require_checksum = require_checksum;
}

void xfer_reader_set_opener(struct xfer_reader *r,
			    int (*open)(void *arg, uint8_t *batch, size_t n,
					const uint8_t *tag),
			    void *arg)
{
	r->open = open;
	r->open_arg = arg;
}

/* Bytes of the batch whose header is h, on this stream; or a sticky
 * error when the header's sealing is not what the stream requires. */
static int reader_need(struct xfer_reader *r, const struct xfer_hdr *h)
{
	bool sealed = h->flags & XFER_FLAG_SEALED;

	if (sealed != !!r->open) {
		r->broken = sealed ? XFER_E_VERSION : XFER_E_AUTH;
		return r->broken;
	}
	r->need = xfer_batch_bytes(h->n_entries, r->page_bytes) +
		  (sealed ? XFER_TRAILER_BYTES : 0);
	return 0;
}

/* Once the header is complete it decides how much more we accept; a bad
 * header breaks the stream for good. 0 or the sticky error. */
static int reader_header(struct xfer_reader *r)
{
	struct xfer_hdr h;
	int ret;

	if (r->len != XFER_HDR_BYTES || r->need != XFER_HDR_BYTES)
		return 0;
	ret = xfer_hdr_parse(r->buf, r->page_bytes, r->max_batch_bytes, &h);
	if (ret) {
		r->broken = ret;
		return ret;
	}
	return reader_need(r, &h);
}

void xfer_reader_deinit(struct xfer_reader *r)
{
	free(r->buf);
	r->buf = NULL;
	r->len = r->cap = 0;
}

static void reader_drop(struct xfer_reader *r)
{
	if (r->consumed) {
		r->consumed = false;
		r->len = 0;
		r->need = XFER_HDR_BYTES;
	}
}

static int reader_reserve(struct xfer_reader *r, size_t n)
{
	uint8_t *p;

	if (r->cap >= n)
		return 0;
	p = realloc(r->buf, n);
	if (!p)
		return -ENOMEM;
	r->buf = p;
	r->cap = n;
	return 0;
}

int xfer_reader_feed(struct xfer_reader *r, const void *data, size_t n,
		     size_t *used)
{
	size_t take;
	int ret;

	*used = 0;
	if (r->broken)
		return r->broken;
	reader_drop(r);
	while (n > 0 && r->len < r->need) {
		ret = reader_reserve(r, r->need);
		if (ret)
			return ret;
		take = KVD_MIN(n, r->need - r->len);
		memcpy(r->buf + r->len, data, take);
		r->len += take;
		*used += take;
		data = (const uint8_t *)data + take;
		n -= take;
		ret = reader_header(r);
		if (ret)
			return ret;
	}
	return 0;
}

int xfer_reader_space(struct xfer_reader *r, uint8_t **p, size_t *n)
{
	int ret;

	if (r->broken)
		return r->broken;
	reader_drop(r);
	ret = reader_reserve(r, r->need);
	if (ret)
		return ret;
	*p = r->buf + r->len;
	*n = r->need - r->len;
	return 0;
}

int xfer_reader_commit(struct xfer_reader *r, size_t k)
{
	if (r->broken)
		return r->broken;
	if (k > r->need - r->len)
		return -EINVAL;
	r->len += k;
	return reader_header(r);
}

int xfer_reader_next(struct xfer_reader *r, struct xfer_hdr *h,
		     const uint8_t **batch)
{
	int ret;

	if (r->broken)
		return r->broken;
	reader_drop(r);
	if (r->len < r->need || r->need == XFER_HDR_BYTES)
		return XFER_E_AGAIN;
	r->consumed = true;
	if (r->open) {
		size_t n = r->len - XFER_TRAILER_BYTES;

		/* a forged or replayed batch: nothing of it is trusted, and the
		 * counter cannot resynchronise - the stream is broken */
		if (r->open(r->open_arg, r->buf, n, r->buf + n)) {
			r->broken = XFER_E_AUTH;
			xfer_hdr_parse(r->buf, r->page_bytes, r->max_batch_bytes, h);
			return XFER_E_AUTH;
		}
		/* it opened: the tag authenticated every byte, so it stands in
		 * for the checksum (senders leave XXH3 out of sealed batches;
		 * one that is there is still checked) */
		ret = xfer_batch_verify(r->buf, n, r->page_bytes,
					r->max_batch_bytes, false, h);
		if (ret == 0)
			*batch = r->buf;
		return ret;
	}
	ret = xfer_batch_verify(r->buf, r->len, r->page_bytes,
				r->max_batch_bytes, r->require_checksum, h);
	if (ret == 0)
		*batch = r->buf;
	return ret;
}

size_t xfer_reader_pending(const struct xfer_reader *r)
{
	return r->consumed ? 0 : r->len;
}
