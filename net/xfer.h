/* xfer.h - KV batches: bounded, checksummed groups of pages (invariant 5).
 *
 * Wire layout (net/PROTOCOL.md section 3), little-endian:
 *   [0, 64)                         header (magic, version, flags,
 *                                   request_id, seq, n_entries, page_bytes,
 *                                   payload_bytes, checksum)
 *   [64, 64 + 24 n)                 entries (dst_page, index, dst_gen, tokens)
 *   [64 + 24 n, + n * page_bytes)   payload: the pages, tag first
 * The checksum is XXH3-64 of the whole batch with the checksum field read
 * as zero. A batch is never larger than the negotiated max_batch_bytes.
 * On authenticated links a batch is *sealed*: flag SEALED, and a 16-byte
 * AEAD tag (net/peer_auth.h) follows the payload, over the header as
 * additional data and entries + payload (encrypted with flag ENCRYPTED);
 * the checksum is of the plaintext. The tag is not counted in the bound.
 *
 * Building: struct xfer_batch owns one buffer sized for the largest batch
 * the bound allows; add() hands out each page's payload slot, seal() writes
 * the header and checksum.
 * Receiving: struct xfer_reader takes any chunk of a byte stream and hands
 * out whole, verified batches. Header problems (magic, version, sizes
 * beyond the bound or the negotiated page size) break the stream: there is
 * no way to find the next batch. A checksum mismatch consumes the batch
 * and the stream goes on (the header's sizes were plausible).
 *
 * Errors: positive XFER_E_* for conditions of the input; negative errno.
 * Thread safety: none; one owner per object.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define XFER_MAGIC 0x3158564bu      /* "KVX1" */
#define XFER_VERSION 1
#define XFER_HDR_BYTES 64u
#define XFER_ENTRY_BYTES 24u
#define XFER_FLAG_CHECKSUM 1u
#define XFER_FLAG_SEALED 2u        /* an AEAD tag follows the payload */
#define XFER_FLAG_ENCRYPTED 4u     /* entries and payload are encrypted */
#define XFER_TRAILER_BYTES 16u     /* the tag of a sealed batch */

enum {
	XFER_E_AGAIN = 1,   /* no complete batch yet */
	XFER_E_MAGIC,       /* not a batch header (stream broken) */
	XFER_E_VERSION,     /* unknown version or flags (stream broken) */
	XFER_E_BOUND,       /* larger than max_batch_bytes, or n_entries 0 */
	XFER_E_GEOMETRY,    /* page_bytes/payload_bytes disagree */
	XFER_E_CHECKSUM,    /* checksum mismatch (batch consumed) */
	XFER_E_NOCHECKSUM,  /* checksum required, batch has none (consumed) */
	XFER_E_FULL,        /* builder: the batch holds the bound already */
	XFER_E_AUTH,        /* a sealed batch failed to authenticate, or an
			     * unsealed one came where seals are required
			     * (stream broken: the counter cannot resync) */
};

const char *xfer_strerror(int code);

struct xfer_entry {
	uint32_t dst_page;   /* physical page in the destination pool */
	uint32_t index;      /* index of the page in the request's table */
	uint64_t dst_gen;    /* generation of dst_page for this request */
	uint32_t tokens;     /* positions the page holds */
};

struct xfer_hdr {
	uint16_t version;
	uint16_t flags;
	uint64_t request_id;
	uint32_t seq;
	uint32_t n_entries;
	uint64_t page_bytes;
	uint64_t payload_bytes;
	uint64_t checksum;
};

/* Total bytes of a batch of n pages. */
uint64_t xfer_batch_bytes(uint32_t n, uint64_t page_bytes);
/* Most pages one batch may carry under the bound (0: not even one). */
uint32_t xfer_batch_pages_max(uint64_t max_batch_bytes, uint64_t page_bytes);

/* ---- building ----------------------------------------------------------- */

struct xfer_batch {
	uint8_t *buf;          /* (xfer_batch_bytes(n_max)) header|entries|payload */
	uint64_t page_bytes;
	uint32_t n_max;
	uint32_t n;
	uint64_t request_id;
	uint32_t seq;
};

/* XFER_E_BOUND when not one page fits in max_batch_bytes; -ENOMEM. */
int xfer_batch_init(struct xfer_batch *b, uint64_t page_bytes,
		    uint64_t max_batch_bytes);
void xfer_batch_deinit(struct xfer_batch *b);
/* Same as init, reusing `buf` when not NULL: a buffer handed out by
 * xfer_batch_take_buf() of a batch initialised with the same page_bytes
 * and max_batch_bytes (senders keep a few to avoid a large allocation
 * per batch). */
int xfer_batch_init_reuse(struct xfer_batch *b, uint64_t page_bytes,
			  uint64_t max_batch_bytes, uint8_t *buf);
/* Hand the buffer over (the caller frees it, or reuses it) and deinit. */
uint8_t *xfer_batch_take_buf(struct xfer_batch *b);
void xfer_batch_reset(struct xfer_batch *b, uint64_t request_id, uint32_t seq);
/* Append an entry; *slot receives the page's payload slot (page_bytes) to
 * fill. XFER_E_FULL when the batch holds n_max pages. */
int xfer_batch_add(struct xfer_batch *b, const struct xfer_entry *e,
		   uint8_t **slot);
/* Write the header (and checksum when `checksum`); returns the batch's
 * length in bytes (the wire image is b->buf[0, len)). */
size_t xfer_batch_seal(struct xfer_batch *b, bool checksum);
/* Same, with extra header flags (XFER_FLAG_SEALED | ENCRYPTED): the
 * caller then seals the image and appends the XFER_TRAILER_BYTES tag;
 * the buffer always has room for it. */
size_t xfer_batch_seal_flags(struct xfer_batch *b, bool checksum,
			     uint16_t flags);

/* Scatter-gather building (zero-copy senders): write the header of a
 * batch of n entries (checksum field zero) and each entry; then hash the
 * whole wire image, given in order as iov (header first), and store the
 * checksum. The receiver sees exactly what xfer_batch_seal would build. */
void xfer_hdr_write(uint8_t *hdr, uint64_t request_id, uint32_t seq,
		    uint32_t n, uint64_t page_bytes, bool checksum);
void xfer_entry_write(uint8_t *p, const struct xfer_entry *e);
/* Add header flags (XFER_FLAG_SEALED; others ignored) to a header
 * xfer_hdr_write made, before its checksum is computed. */
void xfer_hdr_add_flags(uint8_t *hdr, uint16_t flags);
struct iovec;
void xfer_hdr_checksum_iov(uint8_t *hdr, const struct iovec *iov, int n_iov);

/* ---- reading ------------------------------------------------------------ */

/* Parse and check a header (64 bytes) against the negotiated geometry. */
int xfer_hdr_parse(const uint8_t *p, uint64_t page_bytes,
		   uint64_t max_batch_bytes, struct xfer_hdr *h);
/* Verify a whole in-memory batch: header, then checksum (required when
 * require_checksum, verified whenever present). */
int xfer_batch_verify(const uint8_t *buf, size_t len, uint64_t page_bytes,
		      uint64_t max_batch_bytes, bool require_checksum,
		      struct xfer_hdr *h);
void xfer_batch_entry(const uint8_t *batch, uint32_t i, struct xfer_entry *e);
const uint8_t *xfer_batch_page(const uint8_t *batch, const struct xfer_hdr *h,
			       uint32_t i);

struct xfer_reader {
	uint8_t *buf;          /* (cap) bytes: [0, len) of the current batch */
	size_t len;
	size_t cap;            /* grows up to max_batch_bytes */
	size_t need;           /* bytes of the current batch; 64 until known */
	bool consumed;         /* batch last handed out: drop at next call */
	int broken;            /* sticky XFER_E_* of a header failure */
	uint64_t page_bytes;
	uint64_t max_batch_bytes;
	bool require_checksum;
	/* sealed streams: every batch is SEALED and opened (authenticated,
	 * decrypted in place) by open(arg, batch, len_without_tag, tag)
	 * before its checksum and entries are looked at */
	int (*open)(void *arg, uint8_t *batch, size_t n, const uint8_t *tag);
	void *open_arg;
};

void xfer_reader_init(struct xfer_reader *r, uint64_t page_bytes,
		      uint64_t max_batch_bytes, bool require_checksum);
void xfer_reader_deinit(struct xfer_reader *r);
/* Require sealed batches from now on (before the first byte). */
void xfer_reader_set_opener(struct xfer_reader *r,
			    int (*open)(void *arg, uint8_t *batch, size_t n,
					const uint8_t *tag),
			    void *arg);
/* Take up to n bytes (at most the rest of the current batch); *used says
 * how many. 0, a sticky header error, or -ENOMEM. */
int xfer_reader_feed(struct xfer_reader *r, const void *data, size_t n,
		     size_t *used);
/* Zero-copy alternative to feed(): *p is where the next bytes of the
 * stream go, at most *n of them (the rest of the current batch); after
 * writing k bytes there, commit(k). Same errors as feed(). */
int xfer_reader_space(struct xfer_reader *r, uint8_t **p, size_t *n);
int xfer_reader_commit(struct xfer_reader *r, size_t k);
/* 0: *batch (valid until the next feed/next) is a verified batch and *h
 * its header. XFER_E_AGAIN. XFER_E_CHECKSUM / XFER_E_NOCHECKSUM: the batch
 * was consumed, *h filled (untrusted). Other XFER_E_*: stream broken. */
int xfer_reader_next(struct xfer_reader *r, struct xfer_hdr *h,
		     const uint8_t **batch);
/* Bytes of a partial batch buffered (0 at a clean boundary). */
size_t xfer_reader_pending(const struct xfer_reader *r);
