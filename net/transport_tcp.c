/* transport_tcp.c - KV batches over a dedicated TCP data connection.
 *
 * Design. The control connection carries small msgpack frames that must
 * never wait behind megabytes of KV (an abort, a heartbeat), so KV moves
 * on a second connection that carries nothing but batches, one way:
 * prefill writes, decode reads. Decode's only bytes on it are the data
 * hello, which the owner exchanges before calling transport_tcp_start().
 *
 * Sending, from a host-visible pool, writes the pages zero-copy: one
 * small buffer (header, entries, destination tags) and each page's K/V
 * straight from the pool as iovecs, so the source pages are read until
 * the write callback fires - the sender must hold them until then
 * (transport.h; prefill keeps its pages while sends_pending > 0). Sealed
 * links that only authenticate go the same way: the MAC is streamed over
 * the same iovecs (peer_aead_mac_iov, the tag a one-buffer seal would
 * give) and the tag is one more piece, so a keyed link costs its MAC and
 * nothing else (issue 22.9). Other pools and encrypting links take the
 * copy path: the pages are copied into a batch buffer during send()
 * through the kvmem backend, tags rewritten, checksummed (and encrypted),
 * and the buffer lives until the write callback.
 *
 * Receiving feeds the bytes into an xfer_reader, which bounds what it
 * buffers by the negotiated batch size and verifies each batch's checksum
 * before the owner sees it. A stream whose header is nonsense cannot be
 * resynchronised: the transport reports it closed.
 *
 * Fault points (tests only): corrupt_batch flips one payload byte after the
 * checksum is computed; cut_peer_mid_batch writes half a batch and shuts
 * the connection down; bad_tag writes one page's tag for another owner;
 * bad_entry_index and bad_entry_tokens misstate the first entry of a
 * batch. Each fires on whichever send path the batch takes, so the tests
 * reach the zero-copy path (keyless links) as well as the copy path, and
 * each fault line says which (path=copy|zero_copy).
 */
#include "net/transport.h"
#include "conf/util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#define TCP_SPARE_BATCHES 2

struct tcp_transport {
	struct transport base;
	uv_tcp_t tcp;
	struct xfer_reader reader;
	bool receiver;
	bool started;
	bool closing;
	bool closed_reported;
	bool dead;                 /* cut by a fault: refuse further sends */
	uint32_t pending;          /* sends whose callback has not fired */
	/* copy path: batch buffers sized for the negotiated bound, kept for
	 * reuse - a fresh multi-MB allocation per batch page-faults on every
	 * fill and cost more than sealing it */
	struct { uint8_t *buf; size_t cap; } spare[TCP_SPARE_BATCHES];
	unsigned n_spare;
	void (*closed_cb)(struct transport *t);
	uv_shutdown_t shutdown_req;
	char rbuf[65536];          /* (65536) bytes: socket read buffer */
};

struct tcp_send {
	uv_write_t req;
	struct tcp_transport *tt;
	struct xfer_batch batch;   /* copy path: owns the wire image */
	size_t buf_cap;            /* copy path: bytes of batch.buf */
	uint8_t *head;             /* zero-copy path: (64 + 24 n + 64 n) bytes:
				    * header, entries, then each page's tag */
	uv_buf_t *bufs;            /* zero-copy path: (1 + 2 n) pieces */
	transport_sent_cb cb;
	void *arg;
	bool cut;
};

static struct tcp_transport *to_tcp(struct transport *t)
{
	return kvd_container_of(t, struct tcp_transport, base);
}

static void tcp_report_closed(struct tcp_transport *tt, int status)
{
	if (tt->closed_reported)
		return;
	tt->closed_reported = true;
	if (tt->base.cfg.recv.closed)
		tt->base.cfg.recv.closed(tt->base.cfg.recv_arg, status);
}

/* ---- sending ------------------------------------------------------------ */

static void tcp_shutdown_cb(uv_shutdown_t *req, int status)
{
	(void)req;
	(void)status;
}

static void tcp_write_cb(uv_write_t *req, int status)
{
	struct tcp_send *s = kvd_container_of(req, struct tcp_send, req);
	struct tcp_transport *tt = s->tt;
	transport_sent_cb cb = s->cb;
	void *arg = s->arg;

	if (s->cut && status == 0) {
		/* Half a batch went out: end the stream there. */
		if (!tt->closing &&
		    uv_shutdown(&tt->shutdown_req, (uv_stream_t *)&tt->tcp,
				tcp_shutdown_cb) != 0)
			tt->dead = true;
		status = -ECONNRESET;
	}
	{
		uint8_t *buf = xfer_batch_take_buf(&s->batch);

		unsigned k = tt->n_spare;

		/* keep the largest buffers: a short last batch must not
		 * crowd out the full-size ones */
		if (k == TCP_SPARE_BATCHES)
			for (unsigned i = k = 0; i < TCP_SPARE_BATCHES; i++)
				if (tt->spare[i].cap < tt->spare[k].cap)
					k = i;
		if (!buf || tt->closing ||
		    (k < tt->n_spare && tt->spare[k].cap >= s->buf_cap)) {
			free(buf);
		} else {
			if (k < tt->n_spare)
				free(tt->spare[k].buf);
			else
				tt->n_spare++;
			tt->spare[k].buf = buf;
			tt->spare[k].cap = s->buf_cap;
		}
	}
	free(s->head);
	free(s->bufs);
	free(s);
	tt->pending--;
	cb(arg, status);
}

/* Fault points on a batch's first entry: *e is the sender's own copy,
 * so the tag written from it agrees with the lie (decode's entry check,
 * not its tag check, must catch it). */
static void tcp_fault_entry(const struct transport_cfg *c, struct xfer_entry *e,
			    uint64_t request_id, const char *path)
{
	if (kvd_fault_fire(c->fault, KVD_FAULT_BAD_ENTRY_INDEX)) {
		KVLOG_WARN(c->log, "fault",
			   "point=bad_entry_index request=%llu index=%u claimed=65535 path=%s",
			   (unsigned long long)request_id, e->index, path);
		e->index = 0xffff;
	}
	if (kvd_fault_fire(c->fault, KVD_FAULT_BAD_ENTRY_TOKENS)) {
		KVLOG_WARN(c->log, "fault",
			   "point=bad_entry_tokens request=%llu index=%u tokens=%u claimed=%u path=%s",
			   (unsigned long long)request_id, e->index, e->tokens,
			   e->tokens + 1, path);
		e->tokens++;
	}
}

/* The tag of the page an entry names; bad_tag (first entry only) names
 * another owner. */
static void tcp_tag(const struct transport_cfg *c, struct kvtag *tag,
		    const struct xfer_entry *e, uint64_t request_id, uint32_t i,
		    const char *path)
{
	uint64_t owner = request_id;

	if (i == 0 && kvd_fault_fire(c->fault, KVD_FAULT_BAD_TAG)) {
		KVLOG_WARN(c->log, "fault", "point=bad_tag request=%llu page=%u path=%s",
			   (unsigned long long)request_id, e->dst_page, path);
		owner = request_id + 1;
	}
	kvtag_make(tag, owner, e->dst_gen, e->dst_page, e->index, e->tokens);
}

/* Copy pages[0..n) into b, each with its destination tag. */
static int tcp_fill_batch(struct tcp_transport *tt, struct xfer_batch *b,
			  const struct transport_page *pages, uint32_t n,
			  uint64_t request_id)
{
	const struct transport_cfg *c = &tt->base.cfg;

	for (uint32_t i = 0; i < n; i++) {
		struct xfer_entry e = pages[i].dst;
		void *src = kvpool_page_addr(c->pool, pages[i].src_page);
		struct kvtag tag;
		uint8_t *slot;
		int r;

		if (!src)
			return -EINVAL;
		if (i == 0)
			tcp_fault_entry(c, &e, request_id, "copy");
		r = xfer_batch_add(b, &e, &slot);
		if (r)
			return -E2BIG;
		r = c->mem->ops->read(c->mem->ctx, slot, src, c->page_bytes);
		if (r)
			return r;
		tcp_tag(c, &tag, &e, request_id, i, "copy");
		memcpy(slot, &tag, sizeof(tag));
	}
	return 0;
}

/* cut_peer_mid_batch on the zero-copy path: keep the first half of the
 * batch's bytes (iov[0..k) trimmed in place); returns the pieces left. */
static uint32_t tcp_iov_cut(const struct transport_cfg *c, struct iovec *iov,
			    uint32_t k, uint64_t request_id, uint32_t seq)
{
	size_t total = 0, keep;
	uint32_t i;

	for (i = 0; i < k; i++)
		total += iov[i].iov_len;
	keep = total / 2;
	KVLOG_WARN(c->log, "fault",
		   "point=cut_peer_mid_batch request=%llu seq=%u bytes=%zu path=zero_copy",
		   (unsigned long long)request_id, seq, keep);
	for (i = 0; i < k && keep > 0; i++) {
		if (iov[i].iov_len >= keep) {
			iov[i].iov_len = keep;
			return i + 1;
		}
		keep -= iov[i].iov_len;
	}
	return i ? i : 1;
}

/* Zero-copy: the batch goes out as (header + entries), then per page its
 * destination tag and the page's K/V straight from the pool. Safe because
 * a sender holds its source pages until every send callback has fired
 * (daemon/node/prefill.c frees only with no send pending). Host-visible
 * pools only. The fault points never touch the pool: corrupt_batch flips
 * a byte of the first tag (in s->head), cut_peer_mid_batch trims the
 * iovecs to half the batch. */
static int tcp_send_iov(struct tcp_transport *tt, struct tcp_send *s,
			uint64_t request_id, uint32_t seq,
			const struct transport_page *pages, uint32_t n)
{
	const struct transport_cfg *c = &tt->base.cfg;
	size_t meta = XFER_HDR_BYTES + (size_t)n * XFER_ENTRY_BYTES;
	uint8_t *mac = NULL;      /* sealed: the tag, after the page tags */
	struct iovec *iov;
	uint32_t k = 0;

	s->head = malloc(meta + (size_t)n * KVTAG_BYTES + PEER_AUTH_TAG_BYTES);
	s->bufs = calloc(2 + 2 * (size_t)n, sizeof(*s->bufs));
	iov = calloc(2 + 2 * (size_t)n, sizeof(*iov));
	if (!s->head || !s->bufs || !iov) {
		free(iov);
		return -ENOMEM;
	}
	/* sealed: the tag is the batch's checksum (XXH3 would add a pass
	 * over the pages and nothing an attacker could not recompute) */
	xfer_hdr_write(s->head, request_id, seq, n, c->page_bytes,
		       c->checksum && !c->seal);
	if (c->seal) {
		xfer_hdr_add_flags(s->head, XFER_FLAG_SEALED);
		mac = s->head + meta + (size_t)n * KVTAG_BYTES;
	}
	iov[k++] = (struct iovec){ s->head, meta };
	for (uint32_t i = 0; i < n; i++) {
		struct xfer_entry e = pages[i].dst;
		uint8_t *src = kvpool_page_addr(c->pool, pages[i].src_page);
		uint8_t *tag = s->head + meta + (size_t)i * KVTAG_BYTES;
		struct kvtag tg;

		if (!src) {
			free(iov);
			return -EINVAL;
		}
		if (i == 0)
			tcp_fault_entry(c, &e, request_id, "zero_copy");
		xfer_entry_write(s->head + XFER_HDR_BYTES + (size_t)i * XFER_ENTRY_BYTES, &e);
		tcp_tag(c, &tg, &e, request_id, i, "zero_copy");
		memcpy(tag, &tg, KVTAG_BYTES);
		iov[k++] = (struct iovec){ tag, KVTAG_BYTES };
		iov[k++] = (struct iovec){ src + KVTAG_BYTES, c->page_bytes - KVTAG_BYTES };
	}
	if (c->checksum || mac) {
		uint64_t t0 = kvd_now_ns();

		if (mac) {
			peer_aead_mac_iov(c->seal, iov, (int)k, mac);
			iov[k++] = (struct iovec){ mac, PEER_AUTH_TAG_BYTES };
		} else {
			xfer_hdr_checksum_iov(s->head, iov, (int)k);
		}
		if (c->checksum_ns)
			*c->checksum_ns += kvd_now_ns() - t0;
	}
	if (kvd_fault_fire(c->fault, KVD_FAULT_CORRUPT_BATCH)) {
		s->head[meta] ^= 0x01;
		KVLOG_WARN(c->log, "fault", "point=corrupt_batch request=%llu seq=%u path=zero_copy",
			   (unsigned long long)request_id, seq);
	}
	if (kvd_fault_fire(c->fault, KVD_FAULT_CUT_PEER_MID_BATCH)) {
		k = tcp_iov_cut(c, iov, k, request_id, seq);
		s->cut = true;
	}
	for (uint32_t i = 0; i < k; i++)
		s->bufs[i] = uv_buf_init(iov[i].iov_base, (unsigned)iov[i].iov_len);
	free(iov);
	return uv_write(&s->req, (uv_stream_t *)&tt->tcp, s->bufs, k, tcp_write_cb);
}

/* Encrypting links take the copy path: encryption is in place and must
 * not touch the pool. Authenticating ones need no copy (the MAC reads
 * the pages where they are). */
static bool tcp_zero_copy(const struct transport_cfg *c)
{
	return c->mem->ops->host_visible && (!c->seal || !c->seal->encrypt);
}

/* A kept batch buffer large enough for n pages, or NULL (then the batch
 * allocates its own, exactly sized). *cap: the buffer's size. */
static uint8_t *tcp_spare_take(struct tcp_transport *tt, uint32_t n, size_t *cap)
{
	const struct transport_cfg *c = &tt->base.cfg;
	size_t want = xfer_batch_bytes(n, c->page_bytes) + XFER_TRAILER_BYTES;

	*cap = (want + 63) & ~(size_t)63;   /* what xfer_batch allocates */
	for (unsigned i = 0; i < tt->n_spare; i++) {
		if (tt->spare[i].cap >= want) {
			uint8_t *buf = tt->spare[i].buf;

			*cap = tt->spare[i].cap;
			tt->spare[i] = tt->spare[--tt->n_spare];
			return buf;
		}
	}
	return NULL;
}

static void tcp_send_free(struct tcp_send *s)
{
	xfer_batch_deinit(&s->batch);
	free(s->head);
	free(s->bufs);
	free(s);
}

/* Copy path: the batch is built (and sealed) in a buffer of its own, a
 * spare one when the transport kept one. 0, or an error with s's parts
 * left for tcp_send_free. */
static int tcp_send_copy(struct tcp_transport *tt, struct tcp_send *s,
			 uint64_t request_id, uint32_t seq,
			 const struct transport_page *pages, uint32_t n)
{
	const struct transport_cfg *c = &tt->base.cfg;
	uint64_t t0;
	uv_buf_t buf;
	size_t len;
	int r;

	r = xfer_batch_init_reuse(&s->batch, c->page_bytes,
				  xfer_batch_bytes(n, c->page_bytes),
				  tcp_spare_take(tt, n, &s->buf_cap));
	if (r)
		return r > 0 ? -ENOMEM : r;
	xfer_batch_reset(&s->batch, request_id, seq);
	r = tcp_fill_batch(tt, &s->batch, pages, n, request_id);
	if (r)
		return r;
	t0 = kvd_now_ns();
	if (c->seal) {
		uint16_t fl = XFER_FLAG_SEALED |
			      (c->seal->encrypt ? XFER_FLAG_ENCRYPTED : 0);

		len = xfer_batch_seal_flags(&s->batch, false, fl);   /* the tag */
		peer_aead_seal(c->seal, s->batch.buf, len, XFER_HDR_BYTES,
			       s->batch.buf + len);
		len += XFER_TRAILER_BYTES;
	} else {
		len = xfer_batch_seal(&s->batch, c->checksum);
	}
	if ((c->checksum || c->seal) && c->checksum_ns)
		*c->checksum_ns += kvd_now_ns() - t0;
	if (kvd_fault_fire(c->fault, KVD_FAULT_CORRUPT_BATCH)) {
		s->batch.buf[len - 1] ^= 0x01;
		KVLOG_WARN(c->log, "fault", "point=corrupt_batch request=%llu seq=%u path=copy",
			   (unsigned long long)request_id, seq);
	}
	if (kvd_fault_fire(c->fault, KVD_FAULT_CUT_PEER_MID_BATCH)) {
		s->cut = true;
		len /= 2;
		KVLOG_WARN(c->log, "fault",
			   "point=cut_peer_mid_batch request=%llu seq=%u bytes=%zu path=copy",
			   (unsigned long long)request_id, seq, len);
	}
	buf = uv_buf_init((char *)s->batch.buf, (unsigned)len);
	return uv_write(&s->req, (uv_stream_t *)&tt->tcp, &buf, 1, tcp_write_cb);
}

static int tcp_send(struct transport *t, uint64_t request_id, uint32_t seq,
		    const struct transport_page *pages, uint32_t n,
		    transport_sent_cb cb, void *arg)
{
	struct tcp_transport *tt = to_tcp(t);
	const struct transport_cfg *c = &t->cfg;
	struct tcp_send *s;
	int r;

	if (tt->closing || tt->dead || !tt->started)
		return TRANSPORT_E_CLOSED;
	if (n == 0 || n > xfer_batch_pages_max(c->max_batch_bytes, c->page_bytes))
		return TRANSPORT_E_BOUND;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->tt = tt;
	s->cb = cb;
	s->arg = arg;
	r = tcp_zero_copy(c) ? tcp_send_iov(tt, s, request_id, seq, pages, n)
			     : tcp_send_copy(tt, s, request_id, seq, pages, n);
	if (r) {
		tcp_send_free(s);
		return r;
	}
	if (s->cut)
		tt->dead = true;   /* half a batch went out: nothing more */
	tt->pending++;
	return 0;
}

/* ---- receiving ---------------------------------------------------------- */

/* A receiver reads straight into the batch being assembled (one copy
 * less than going through rbuf); rbuf serves the sender's EOF watch and
 * any reader error, which tcp_read_cb then reports. */
static void tcp_alloc_cb(uv_handle_t *h, size_t hint, uv_buf_t *buf)
{
	struct tcp_transport *tt = h->data;
	uint8_t *p;
	size_t n;

	(void)hint;
	if (tt->receiver && !tt->closing &&
	    xfer_reader_space(&tt->reader, &p, &n) == 0 && n > 0) {
		*buf = uv_buf_init((char *)p, (unsigned)KVD_MIN(n, (size_t)UINT32_MAX));
		return;
	}
	*buf = uv_buf_init(tt->rbuf, sizeof(tt->rbuf));
}

/* Hand out every complete batch; returns a broken-stream code or 0. */
static int tcp_drain_batches(struct tcp_transport *tt)
{
	const struct transport_cfg *c = &tt->base.cfg;
	const uint8_t *batch;
	struct xfer_hdr h;
	int r;

	while (!tt->closing) {
		uint64_t t0 = kvd_now_ns();

		/* header checks and, with checksums on, XXH3 over the batch */
		r = xfer_reader_next(&tt->reader, &h, &batch);
		if ((c->checksum || c->seal) && c->checksum_ns)
			*c->checksum_ns += kvd_now_ns() - t0;
		if (r == XFER_E_AGAIN)
			return 0;
		if (r == 0) {
			if (c->recv.batch)
				c->recv.batch(c->recv_arg, &h, batch);
		} else if (r == XFER_E_AUTH) {
			/* forged, replayed or corrupted on a sealed link: report
			 * it like a bad checksum, then the stream is over */
			if (c->recv.bad_batch)
				c->recv.bad_batch(c->recv_arg, r, &h);
			return r;
		} else if (r == XFER_E_CHECKSUM || r == XFER_E_NOCHECKSUM) {
			if (c->recv.bad_batch)
				c->recv.bad_batch(c->recv_arg, r, &h);
		} else {
			return r;
		}
	}
	return 0;
}

static int tcp_feed(struct tcp_transport *tt, const char *p, size_t n)
{
	size_t used;
	int r;

	while (n > 0 && !tt->closing) {
		r = xfer_reader_feed(&tt->reader, p, n, &used);
		if (r)
			return r;
		p += used;
		n -= used;
		r = tcp_drain_batches(tt);
		if (r)
			return r;
	}
	return 0;
}

static void tcp_read_cb(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
	struct tcp_transport *tt = st->data;
	int r;

	if (nread == 0)
		return;
	if (nread < 0) {
		uv_read_stop(st);
		r = 0;
		if (nread != UV_EOF)
			r = (int)nread;
		else if (tt->receiver && xfer_reader_pending(&tt->reader))
			r = -ECONNRESET;   /* the stream ended inside a batch */
		tcp_report_closed(tt, r);
		return;
	}
	if (!tt->receiver) {
		/* Decode sends nothing after the data hello. */
		uv_read_stop(st);
		tcp_report_closed(tt, -EPROTO);
		return;
	}
	if (buf->base != tt->rbuf) {
		r = xfer_reader_commit(&tt->reader, (size_t)nread);
		if (r == 0)
			r = tcp_drain_batches(tt);
	} else {
		r = tcp_feed(tt, buf->base, (size_t)nread);
	}
	if (r) {
		uv_read_stop(st);
		tcp_report_closed(tt, r);
	}
}

int transport_tcp_start(struct transport *t, bool receiver)
{
	struct tcp_transport *tt = to_tcp(t);
	int r;

	tt->receiver = receiver;
	r = uv_read_start((uv_stream_t *)&tt->tcp, tcp_alloc_cb, tcp_read_cb);
	if (r == 0)
		tt->started = true;
	return r;
}

/* ---- lifetime ----------------------------------------------------------- */

static void tcp_close_cb(uv_handle_t *h)
{
	struct tcp_transport *tt = h->data;

	if (tt->closed_cb)
		tt->closed_cb(&tt->base);
}

static void tcp_close(struct transport *t, void (*closed)(struct transport *t))
{
	struct tcp_transport *tt = to_tcp(t);

	if (tt->closing)
		return;
	tt->closing = true;
	tt->closed_reported = true;   /* the owner asked: no closed() call */
	tt->closed_cb = closed;
	uv_close((uv_handle_t *)&tt->tcp, tcp_close_cb);
}

static uint32_t tcp_pending(const struct transport *t)
{
	const struct tcp_transport *tt =
		kvd_container_of(t, struct tcp_transport, base);

	return tt->pending;
}

static size_t tcp_queued(const struct transport *t)
{
	const struct tcp_transport *tt =
		kvd_container_of(t, struct tcp_transport, base);

	return uv_stream_get_write_queue_size((const uv_stream_t *)&tt->tcp);
}

static void tcp_free(struct transport *t)
{
	struct tcp_transport *tt;

	if (!t)
		return;
	tt = to_tcp(t);
	xfer_reader_deinit(&tt->reader);
	while (tt->n_spare)
		free(tt->spare[--tt->n_spare].buf);
	free(tt);
}

static const struct transport_ops tcp_ops = {
	.name = "tcp",
	.send = tcp_send,
	.pending = tcp_pending,
	.queued = tcp_queued,
	.close = tcp_close,
	.free = tcp_free,
};

static int tcp_open(void *arg, uint8_t *batch, size_t n, const uint8_t *tag)
{
	struct tcp_transport *tt = arg;

	return peer_aead_open(tt->base.cfg.seal, batch, n, XFER_HDR_BYTES, tag);
}

int transport_tcp_new(struct transport **out, uv_loop_t *loop,
		      const struct transport_cfg *cfg)
{
	struct tcp_transport *tt;
	int r;

	if (!xfer_batch_pages_max(cfg->max_batch_bytes, cfg->page_bytes))
		return TRANSPORT_E_BOUND;
	tt = calloc(1, sizeof(*tt));
	if (!tt)
		return -ENOMEM;
	r = uv_tcp_init(loop, &tt->tcp);
	if (r) {
		free(tt);
		return r;
	}
	tt->tcp.data = tt;
	tt->base.ops = &tcp_ops;
	tt->base.cfg = *cfg;
	xfer_reader_init(&tt->reader, cfg->page_bytes, cfg->max_batch_bytes,
			 cfg->checksum);
	if (cfg->seal)
		xfer_reader_set_opener(&tt->reader, tcp_open, tt);
	uv_tcp_nodelay(&tt->tcp, 1);
	*out = &tt->base;
	return 0;
}

uv_stream_t *transport_tcp_stream(struct transport *t)
{
	return (uv_stream_t *)&to_tcp(t)->tcp;
}

struct transport *transport_tcp_from_stream(uv_stream_t *st)
{
	struct tcp_transport *tt = st->data;

	return &tt->base;
}
