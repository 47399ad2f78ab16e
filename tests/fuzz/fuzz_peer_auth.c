/* fuzz_peer_auth.c - the peer trust boundary (net/peer_auth.h): sealed
 * control frames through a frame decoder whose opener is peer_frame_open,
 * and sealed KV batches through an xfer_reader whose opener is
 * peer_aead_open, both over one fixed link key.
 *
 * Everything a peer sends after the handshake is sealed; a node must act
 * on nothing it did not seal itself (invariant 11). Input: byte 0 picks
 *   bit 0     encryption on (else authenticated only),
 *   bits 1-2  how many plaintext frames (the handshake) precede the
 *             opener, which is set from the handler of the last one, as
 *             the daemons do,
 *   bit 3     checksum required on batches,
 *   bit 4     the batch geometry;
 * the rest is one byte stream, fed both to the frame decoder and to the
 * xfer reader. Properties:
 *   - opener (both): on a refusal the counter does not move and the bytes
 *     are untouched; on success the counter moves by one and the
 *     plaintext, sealed again by the sender's key at that counter, gives
 *     exactly the bytes received (length header included for frames), so
 *     nothing but a genuinely sealed frame or batch is ever accepted;
 *   - frames: no frame is parsed unopened once the opener is set;
 *     FRAME_E_AUTH (and TOOBIG) are sticky, the opener is never called
 *     again and the counter stays; accepted frames parse or are refused
 *     with a typed error, with nothing left allocated;
 *   - batches: every handed-out batch is SEALED, verifies alone, carries
 *     a checksum when one is required; an unsealed header is XFER_E_AUTH;
 *     XFER_E_AUTH and header errors are sticky for next, feed and space;
 *   - whole feeding (frame_decoder_feed / xfer_reader_feed) and small
 *     chunks (xfer_reader_space + commit for batches) give the same
 *     transcript;
 *   - auth_proof names (the first PEER_AUTH_NAME_SEALED bytes of the
 *     stream): peer_auth_name_open accepts only what the sender's key
 *     seals to exactly those bytes, NUL-terminated; a refusal leaves the
 *     counter; and the proof over the names and addresses read from the
 *     input verifies for exactly those ids, not for the ids with one
 *     byte moved from one string to the next (issue 22: proofs bind
 *     both ends' names and addresses);
 *   - seeds (real sealed frames of every peer message type, with and
 *     without a plaintext handshake, and real sealed batch streams, built
 *     at run time): every frame and batch is accepted, in order.
 */
#include <errno.h>
#include <string.h>

#include "net/wire/frame.h"
#include "net/peer_auth.h"
#include "net/wire/proto_peer.h"
#include "net/xfer.h"
#include "tests/fuzz/fuzz.h"

const char fuzz_target_name[] = "peer_auth";

/* The daemons' peer decoder bound (daemon/node/serve_int.h). */
#define FRAME_MAX (PROTO_PEER_FRAME_MAX + PEER_AUTH_TAG_BYTES)
#define TAG PEER_AUTH_TAG_BYTES

struct geom {
	uint64_t page_bytes;
	uint64_t max_batch_bytes;
};

static const struct geom geoms[2] = {
	{ 64, XFER_HDR_BYTES + 3 * (XFER_ENTRY_BYTES + 64) },   /* 3 pages */
	{ 16, 1024 },
};

struct cfg {
	bool enc;
	unsigned nplain;
	bool req;
	const struct geom *g;
};

static struct cfg cfg_of(uint8_t b)
{
	return (struct cfg){ .enc = b & 1, .nplain = (b >> 1) & 3,
			     .req = b & 8, .g = &geoms[(b >> 4) & 1] };
}

/* ---- the fixed link (read-only once built) ------------------------------ */

/* [enc]: decode's and prefill's view of one link; prefill seals control
 * frames (p.tx -> d.rx) and batches (p.data -> d.data). */
static struct peer_session link_d[2], link_p[2];

static void link_init(void)
{
	static bool ready;
	static const uint8_t material[] =
		"kvd fuzz_peer_auth fixed cluster key material, 32+ bytes";
	struct peer_key k;
	uint8_t nd[PEER_AUTH_BYTES], np[PEER_AUTH_BYTES];

	if (ready)
		return;
	FUZZ_CHECK(peer_auth_global_init() == 0, "libsodium init");
	FUZZ_CHECK(peer_key_init(&k, material, sizeof(material) - 1) == 0, "key");
	for (int i = 0; i < PEER_AUTH_BYTES; i++) {
		nd[i] = (uint8_t)(0x10 + i);
		np[i] = (uint8_t)(0xa0 + i);
	}
	for (int e = 0; e < 2; e++) {
		peer_session_derive(&link_d[e], &k, PEER_SIDE_DECODE, nd, np, e);
		peer_session_derive(&link_p[e], &k, PEER_SIDE_PREFILL, nd, np, e);
	}
	peer_key_wipe(&k);
	ready = true;
}

static uint32_t be32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 |
	       (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static uint8_t *dup_bytes(const void *p, size_t n)
{
	uint8_t *c = malloc(n ? n : 1);

	if (!c)
		abort();
	if (n)
		memcpy(c, p, n);
	return c;
}

/* After a refusal (peer_aead_open): the additional data and the tag
 * (got/now [0, ad) and [n, n + TAG)) are untouched; the encrypted part
 * [ad, n) is untouched, or wiped to zeros when the link encrypts
 * (libsodium clears its output), so no unauthenticated plaintext ever
 * shows. */
static void check_refused(const uint8_t *got, const uint8_t *now, size_t n,
			  size_t ad, bool encrypt)
{
	size_t a = encrypt ? ad : n;

	FUZZ_CHECK(!memcmp(got, now, a) && !memcmp(got + n, now + n, TAG),
		   "refusal changed authenticated bytes or the tag");
	if (a < n && memcmp(got + a, now + a, n - a))
		for (size_t i = a; i < n; i++)
			FUZZ_CHECK(now[i] == 0, "refusal left byte %zu changed "
				   "but not wiped", i);
}

/* What a run saw, for the seeds' "accepted in order" check. */
struct stats {
	unsigned plain, sealed;          /* frames handed out with code 0 */
	int types[64];                   /* parsed type of each, in order */
	unsigned n_types;
	unsigned batches;                /* batches handed out */
	int frame_err, batch_err;        /* first non-zero code, else 0 */
};

/* ---- frames ------------------------------------------------------------- */

struct fopener {
	struct peer_aead rx;             /* the decoder's receive direction */
	const struct peer_aead *tx;      /* the sender's (key, mode) */
	bool broken;                     /* FRAME_E_AUTH seen */
	unsigned calls, opened;
};

static int frame_opener(void *arg, uint8_t *p, size_t n, size_t *plain_n)
{
	struct fopener *o = arg;
	uint64_t seq = o->rx.seq;
	uint8_t *got = dup_bytes(p, n);
	int r;

	FUZZ_CHECK(!o->broken, "opener called on a broken stream");
	o->calls++;
	r = peer_frame_open(&o->rx, p, n, plain_n);
	if (r) {
		FUZZ_CHECK(r == (n < TAG ? PEER_AUTH_E_SIZE : PEER_AUTH_E_OPEN),
			   "open of %zu bytes: %d", n, r);
		FUZZ_CHECK(o->rx.seq == seq, "counter moved on a refusal");
		if (n >= TAG)
			check_refused(got, p, n - TAG, 0, o->rx.encrypt);
		else
			FUZZ_CHECK(!n || !memcmp(got, p, n), "refused frame changed");
	} else {
		size_t pn = *plain_n, len = FRAME_HEADER_BYTES + pn;
		struct peer_aead tx = *o->tx;
		char *fr;

		FUZZ_CHECK(o->rx.seq == seq + 1, "counter %llu after %llu",
			   (unsigned long long)o->rx.seq, (unsigned long long)seq);
		FUZZ_CHECK(n >= TAG && pn == n - TAG, "plaintext %zu of %zu", pn, n);
		/* the same plaintext sealed by the sender at this counter */
		fr = malloc(len);
		if (!fr)
			abort();
		memset(fr, 0, FRAME_HEADER_BYTES);
		if (pn)
			memcpy(fr + FRAME_HEADER_BYTES, p, pn);
		tx.seq = seq;
		FUZZ_CHECK(peer_frame_seal(&tx, &fr, &len) == 0, "seal");
		FUZZ_CHECK(len == FRAME_HEADER_BYTES + n &&
			   be32((uint8_t *)fr) == n &&
			   !memcmp(fr + FRAME_HEADER_BYTES, got, n),
			   "an accepted frame is not what the sender seals "
			   "(counter %llu, %zu bytes)", (unsigned long long)seq, n);
		free(fr);
		/* replayed right after (a copy of the receiver): refused */
		struct peer_aead again = o->rx;
		size_t pn2;

		memcpy(p, got, n);
		FUZZ_CHECK(peer_frame_open(&again, p, n, &pn2) == PEER_AUTH_E_OPEN &&
			   again.seq == o->rx.seq, "a replayed frame opens");
		/* put the plaintext back for the decoder */
		memcpy(p, got, n);
		again = o->rx;
		again.seq = seq;
		FUZZ_CHECK(peer_frame_open(&again, p, n, &pn2) == 0 && pn2 == pn,
			   "the frame does not open twice at its counter");
		o->opened++;
	}
	free(got);
	return r;
}

static void frames(const uint8_t *data, size_t size, const struct cfg *c,
		   uint32_t cs, struct fuzz_bytes *t, struct stats *st)
{
	struct frame_decoder d;
	struct fopener o = { .rx = link_d[c->enc].rx, .tx = &link_p[c->enc].tx };
	unsigned handed = 0;
	bool sealed = false;
	size_t off = 0, used;
	int r, broken = 0;

	frame_decoder_init(&d, FRAME_MAX);
	for (;;) {
		const msgpack_object *map;

		for (;;) {
			unsigned calls = o.calls, opened = o.opened;

			/* the handler of the last handshake frame seals */
			if (!sealed && handed == c->nplain) {
				frame_decoder_set_opener(&d, frame_opener, &o);
				sealed = true;
			}
			r = frame_decoder_next(&d, &map);
			FUZZ_CHECK(r == 0 || r == FRAME_E_AGAIN ||
				   r == FRAME_E_TOOBIG || r == FRAME_E_MALFORMED ||
				   r == FRAME_E_NOTMAP || r == FRAME_E_AUTH ||
				   r == -ENOMEM, "next: %d", r);
			if (r == FRAME_E_AGAIN) {
				FUZZ_CHECK(o.calls == calls, "opened a partial frame");
				break;
			}
			int8_t code = (int8_t)r;

			fuzz_bytes_add(t, &code, 1);
			if (r && !st->frame_err)
				st->frame_err = r;
			if (r == FRAME_E_TOOBIG || r == FRAME_E_AUTH) {
				FUZZ_CHECK(r == FRAME_E_TOOBIG ||
					   (sealed && o.calls == calls + 1 &&
					    o.opened == opened),
					   "AUTH without a refusal");
				broken = r;
				break;
			}
			if (sealed && r != -ENOMEM)
				FUZZ_CHECK(o.calls == calls + 1 &&
					   o.opened == opened + 1,
					   "a frame passed without being opened");
			else if (!sealed)
				FUZZ_CHECK(o.calls == 0, "opened before it was set");
			handed++;
			if (r == 0) {
				struct proto_peer_msg m;
				struct frame_error err;
				int pr = proto_peer_parse(map, &m, &err);
				int8_t pc = (int8_t)pr;

				FUZZ_CHECK(pr == 0 || pr == -ENOMEM ||
					   (pr >= FRAME_E_MALFORMED &&
					    pr <= FRAME_E_DUPLICATE),
					   "parse: %d", pr);
				fuzz_bytes_add(t, &pc, 1);
				if (pr == 0) {
					int8_t ty = (int8_t)m.type;

					fuzz_bytes_add(t, &ty, 1);
					if (st->n_types < 64)
						st->types[st->n_types++] = m.type;
				} else if (!st->frame_err) {
					st->frame_err = 1000 + pr;
				}
				if (sealed)
					st->sealed++;
				else
					st->plain++;
				proto_peer_msg_deinit(&m);
			}
		}
		if (broken) {
			const msgpack_object *m2;
			uint64_t seq = o.rx.seq;

			o.broken = broken == FRAME_E_AUTH;
			r = frame_decoder_feed(&d, data + off, size - off, &used);
			FUZZ_CHECK(r == 0 || r == -ENOMEM, "feed: %d", r);
			FUZZ_CHECK(frame_decoder_next(&d, &m2) == broken &&
				   frame_decoder_next(&d, &m2) == broken && !m2,
				   "%s is not sticky", frame_strerror(broken));
			FUZZ_CHECK(o.rx.seq == seq, "counter moved after %s",
				   frame_strerror(broken));
			break;
		}
		if (off == size)
			break;
		size_t n = size - off;

		if (cs) {
			cs = cs * 1103515245u + 12345u;
			n = FUZZ_MIN(n, 1 + (cs >> 16) % 97);
		}
		r = frame_decoder_feed(&d, data + off, n, &used);
		FUZZ_CHECK(r == 0 || r == -ENOMEM, "feed: %d", r);
		if (r < 0)
			break;
		FUZZ_CHECK(used > 0 && used <= n, "feed took %zu of %zu", used, n);
		off += used;
	}
	int8_t end = broken ? 100 : (int8_t)frame_decoder_finish(&d);

	fuzz_bytes_add(t, &end, 1);
	fuzz_bytes_add(t, &o.rx.seq, sizeof(o.rx.seq));
	frame_decoder_deinit(&d);
}

/* ---- batches ------------------------------------------------------------ */

struct bopener {
	struct peer_aead rx;
	const struct peer_aead *tx;
	bool broken;
	unsigned calls, opened;
};

static int batch_opener(void *arg, uint8_t *b, size_t n, const uint8_t *tag)
{
	struct bopener *o = arg;
	uint64_t seq = o->rx.seq;
	uint8_t *got = malloc(n + TAG);
	int r;

	FUZZ_CHECK(!o->broken, "opener called on a broken stream");
	FUZZ_CHECK(n > XFER_HDR_BYTES && tag == b + n, "opener given %zu bytes", n);
	if (!got)
		abort();
	memcpy(got, b, n);
	memcpy(got + n, tag, TAG);
	o->calls++;
	r = peer_aead_open(&o->rx, b, n, XFER_HDR_BYTES, tag);
	if (r) {
		FUZZ_CHECK(r == PEER_AUTH_E_OPEN, "open: %d", r);
		FUZZ_CHECK(o->rx.seq == seq, "counter moved on a refusal");
		check_refused(got, b, n, XFER_HDR_BYTES, o->rx.encrypt);
	} else {
		struct peer_aead tx = *o->tx;
		uint8_t *re = malloc(n + TAG);

		if (!re)
			abort();
		FUZZ_CHECK(o->rx.seq == seq + 1, "counter %llu after %llu",
			   (unsigned long long)o->rx.seq, (unsigned long long)seq);
		FUZZ_CHECK(!memcmp(got, b, o->rx.encrypt ? XFER_HDR_BYTES : n),
			   "authenticated-only bytes changed by opening");
		memcpy(re, b, n);
		tx.seq = seq;
		peer_aead_seal(&tx, re, n, XFER_HDR_BYTES, re + n);
		FUZZ_CHECK(!memcmp(re, got, n + TAG),
			   "an accepted batch is not what the sender seals "
			   "(counter %llu, %zu bytes)", (unsigned long long)seq, n);
		/* replayed right after (a copy of the receiver): refused */
		struct peer_aead again = o->rx;

		memcpy(re, got, n + TAG);
		FUZZ_CHECK(peer_aead_open(&again, re, n, XFER_HDR_BYTES,
					  re + n) == PEER_AUTH_E_OPEN &&
			   again.seq == o->rx.seq, "a replayed batch opens");
		free(re);
		o->opened++;
	}
	free(got);
	return r;
}

static bool stream_error(int r)
{
	return r == XFER_E_MAGIC || r == XFER_E_VERSION || r == XFER_E_BOUND ||
	       r == XFER_E_GEOMETRY || r == XFER_E_AUTH;
}

/* cs == 0: xfer_reader_feed with all that is left; else chunks through
 * xfer_reader_space + commit (the transport's zero-copy path). */
static void batches(const uint8_t *data, size_t size, const struct cfg *c,
		    uint32_t cs, struct fuzz_bytes *t, struct stats *st)
{
	const struct geom *g = c->g;
	struct xfer_reader rd;
	struct bopener o = { .rx = link_d[c->enc].data,
			     .tx = &link_p[c->enc].data };
	size_t off = 0, used;
	int r, sticky = 0;

	xfer_reader_init(&rd, g->page_bytes, g->max_batch_bytes, c->req);
	xfer_reader_set_opener(&rd, batch_opener, &o);
	for (;;) {
		struct xfer_hdr h;
		const uint8_t *b;

		for (;;) {
			unsigned calls = o.calls, opened = o.opened;

			r = xfer_reader_next(&rd, &h, &b);
			if (r == XFER_E_AGAIN) {
				FUZZ_CHECK(o.calls == calls, "opened a partial batch");
				break;
			}
			int8_t code = (int8_t)r;

			fuzz_bytes_add(t, &code, 1);
			if (r && !st->batch_err)
				st->batch_err = r;
			if (r == XFER_E_AUTH) {
				FUZZ_CHECK(o.calls == calls + 1 && o.opened == opened,
					   "AUTH from next without a refusal");
				sticky = r;
				break;
			}
			FUZZ_CHECK(r == 0 || r == XFER_E_CHECKSUM ||
				   r == XFER_E_NOCHECKSUM, "next: %d", r);
			FUZZ_CHECK(o.calls == calls + 1 && o.opened == opened + 1,
				   "a batch passed without being opened");
			if (r == 0) {
				size_t len = xfer_batch_bytes(h.n_entries,
							      g->page_bytes);
				struct xfer_hdr h2;

				FUZZ_CHECK(h.flags & XFER_FLAG_SEALED,
					   "unsealed batch handed out");
				/* a sealed batch that opened needs no XXH3 (its
				 * tag is the checksum, issue 22.9); one it
				 * carries must still be right */
				FUZZ_CHECK(len <= g->max_batch_bytes &&
					   xfer_batch_verify(b, len, g->page_bytes,
							     g->max_batch_bytes,
							     false, &h2) == 0,
					   "handed-out batch fails verify");
				fuzz_bytes_add(t, b, len);
				st->batches++;
			} else {
				fuzz_bytes_add(t, &h.seq, sizeof(h.seq));
			}
		}
		if (sticky || off == size)
			break;
		size_t n = size - off;

		if (!cs) {
			r = xfer_reader_feed(&rd, data + off, n, &used);
		} else {
			uint8_t *p;
			size_t room;

			cs = cs * 1103515245u + 12345u;
			n = FUZZ_MIN(n, 1 + (cs >> 16) % 61);
			r = xfer_reader_space(&rd, &p, &room);
			FUZZ_CHECK(r == 0 || r == -ENOMEM, "space: %d", r);
			if (r)
				break;
			FUZZ_CHECK(room > 0, "reader stalled with %zu pending",
				   xfer_reader_pending(&rd));
			used = FUZZ_MIN(n, room);
			memcpy(p, data + off, used);
			r = xfer_reader_commit(&rd, used);
		}
		if (r == -ENOMEM)
			break;
		FUZZ_CHECK(used <= n, "took %zu of %zu", used, n);
		off += used;
		if (r) {
			FUZZ_CHECK(stream_error(r), "feed: %d", r);
			int8_t code = (int8_t)r;

			fuzz_bytes_add(t, &code, 1);
			if (!st->batch_err)
				st->batch_err = r;
			sticky = r;
			break;
		}
		FUZZ_CHECK(used > 0, "reader stalled with %zu pending",
			   xfer_reader_pending(&rd));
	}
	if (sticky) {
		struct xfer_hdr h3;
		const uint8_t *b3;
		uint8_t *p3;
		size_t n3;
		uint64_t seq = o.rx.seq;

		o.broken = true;
		FUZZ_CHECK(xfer_reader_next(&rd, &h3, &b3) == sticky &&
			   xfer_reader_feed(&rd, data, size, &used) == sticky &&
			   used == 0 &&
			   xfer_reader_space(&rd, &p3, &n3) == sticky &&
			   xfer_reader_next(&rd, &h3, &b3) == sticky,
			   "%s is not sticky", xfer_strerror(sticky));
		FUZZ_CHECK(o.rx.seq == seq, "counter moved after %s",
			   xfer_strerror(sticky));
	}
	int8_t end = sticky ? 100 : (int8_t)(xfer_reader_pending(&rd) > 0);

	fuzz_bytes_add(t, &end, 1);
	fuzz_bytes_add(t, &o.rx.seq, sizeof(o.rx.seq));
	xfer_reader_deinit(&rd);
}

/* The auth_proof's sealed name and the proof's identities (see the
 * head). */
static void names(const uint8_t *data, size_t size, const struct cfg *c)
{
	struct peer_aead rx = link_d[c->enc].rx, tx = link_p[c->enc].tx;
	uint8_t again[PEER_AUTH_NAME_SEALED], nd[PEER_AUTH_BYTES] = { 1 },
		np[PEER_AUTH_BYTES] = { 2 }, pf[PEER_AUTH_BYTES];
	char name[PEER_AUTH_NAME_BYTES], s[4][PEER_AUTH_NAME_BYTES] = { "" };
	struct peer_auth_ids ids, moved;
	struct peer_key k = { .set = true };
	size_t at = 0;

	if (size >= PEER_AUTH_NAME_SEALED) {
		if (peer_auth_name_open(&rx, data, name)) {
			FUZZ_CHECK(rx.seq == link_d[c->enc].rx.seq, "a refused name moved the counter");
		} else {
			FUZZ_CHECK(memchr(name, '\0', sizeof(name)), "an opened name without a NUL");
			peer_auth_name_seal(&tx, name, again);
			FUZZ_CHECK(!memcmp(again, data, sizeof(again)),
				   "a name opened that its key did not seal");
		}
	}
	/* four strings of up to 15 bytes, cut from the input */
	for (int i = 0; i < 4 && at < size; i++) {
		size_t n = data[at++] % 16;

		n = n < size - at ? n : size - at;
		memcpy(s[i], data + at, n);
		s[i][n] = '\0';
		at += n;
	}
	memcpy(k.k, data, size < PEER_AUTH_BYTES ? size : PEER_AUTH_BYTES);
	ids = (struct peer_auth_ids){ s[0], s[1], s[2], s[3] };
	peer_auth_proof(&k, PEER_SIDE_DECODE, nd, np, &ids, pf);
	FUZZ_CHECK(!peer_auth_check(&k, PEER_SIDE_DECODE, nd, np, &ids, pf),
		   "a proof did not verify for its own ids");
	if (s[0][0]) {
		char a[2 * PEER_AUTH_NAME_BYTES], b[2 * PEER_AUTH_NAME_BYTES];
		size_t n0 = strlen(s[0]);

		/* the last byte of name_d moved to the front of name_p */
		snprintf(a, sizeof(a), "%.*s", (int)(n0 - 1), s[0]);
		snprintf(b, sizeof(b), "%c%s", s[0][n0 - 1], s[1]);
		moved = (struct peer_auth_ids){ a, b, s[2], s[3] };
		FUZZ_CHECK(peer_auth_check(&k, PEER_SIDE_DECODE, nd, np, &moved, pf) ==
			   PEER_AUTH_E_PROOF, "a proof verified for other ids");
	}
}

static void run(const uint8_t *data, size_t size, struct stats *st)
{
	struct fuzz_bytes whole = { 0 }, chunked = { 0 };
	struct stats st2;
	uint32_t cs = 3;

	link_init();
	memset(st, 0, sizeof(*st));
	memset(&st2, 0, sizeof(st2));
	if (size < 1)
		return;
	struct cfg c = cfg_of(data[0]);

	data++;
	size--;
	for (size_t i = 0; i < size && i < 16; i++)
		cs = cs * 31 + data[i];
	names(data, size, &c);
	frames(data, size, &c, 0, &whole, st);
	frames(data, size, &c, cs | 1, &chunked, &st2);
	FUZZ_CHECK(fuzz_bytes_eq(&whole, &chunked),
		   "chunking changed the frames read");
	whole.n = chunked.n = 0;
	batches(data, size, &c, 0, &whole, st);
	batches(data, size, &c, cs | 1, &chunked, &st2);
	FUZZ_CHECK(fuzz_bytes_eq(&whole, &chunked),
		   "chunking changed the batches read");
	free(whole.p);
	free(chunked.p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct stats st;

	run(data, size, &st);
	return 0;
}

/* ---- seeds: sealed with kvd's own packers and the fixed key ------------- */

static void fill_msg(struct proto_peer_msg *m, int type)
{
	static uint32_t toks[] = { 1, 2, 3, 300 };
	static struct proto_peer_page pages[] = { { 5, 1 }, { 9, 77 } };
	static struct proto_peer_run runs[] = { { 5, 3, 0x7f0000001000ull, 0x1234 } };

	memset(m, 0, sizeof(*m));
	m->type = (enum proto_peer_type)type;
	m->id = 42;
	m->hello = (struct proto_peer_hello){
		.version = PROTO_PEER_VERSION, .role = "prefill", .node = "p0",
		.kv_dtype = "f16", .page_tokens = 16, .n_layer = 2,
		.kv_dim = 128, .page_bytes = 16384, .pool_tokens = 65536,
		.context = 2048, .max_batch_bytes = 1 << 20, .checksum = true,
	};
	memset(m->hello.model_sha256, 'b', 64);
	for (int i = 0; i < PROTO_PEER_NONCE_BYTES; i++) {
		m->token[i] = (uint8_t)(3 * i);
		m->nonce[i] = (uint8_t)(5 * i + 1);
		m->proof[i] = (uint8_t)(7 * i + 2);
	}
	m->version = PROTO_PEER_VERSION;
	snprintf(m->suite, sizeof(m->suite), "%s", PROTO_PEER_SUITE);
	snprintf(m->reason, sizeof(m->reason), "auth_failed");
	m->load = 3;
	m->free_tokens = 1000;
	m->tokens = toks;
	m->n_tokens = 4;
	m->pages = pages;
	m->n_pages = 2;
	m->max_tokens = 16;
	m->temperature = 0.5f;
	m->top_k = 10;
	m->top_p = 0.95f;
	m->seed = 99;
	snprintf(m->tenant, sizeof(m->tenant), "alice");  /* prefill_request only */
	m->code = PROTO_ERR_PROMPT_TOO_LONG;
	snprintf(m->message, sizeof(m->message), "too long");
	m->first_token = 17;
	m->done_tokens = 4;
	m->batches = 1;
	m->done_pages = 2;
	m->vqp = (struct proto_peer_verbs_qp){ .qpn = 0x12, .psn = 0x345, .lid = 0,
					       .mtu = 1024 };
	m->runs = runs;
	m->n_runs = 1;
	m->consumed = 5;
}

/* Append one frame of `type`, sealed by tx (NULL: plaintext). */
static void add_frame(struct fuzz_bytes *b, int type, struct peer_aead *tx)
{
	struct proto_peer_msg m;
	char *fr = NULL;
	size_t len = 0;

	fill_msg(&m, type);
	FUZZ_CHECK(proto_peer_frame(&m, &fr, &len) == 0, "pack %d", type);
	if (tx)
		FUZZ_CHECK(peer_frame_seal(tx, &fr, &len) == 0, "seal");
	fuzz_bytes_add(b, fr, len);
	free(fr);
}

/* Append one batch of n pages, sealed by tx. */
static void add_batch(struct fuzz_bytes *b, const struct geom *g, bool checksum,
		      uint32_t n, uint32_t seq, struct peer_aead *tx)
{
	struct xfer_batch x;

	FUZZ_CHECK(xfer_batch_init(&x, g->page_bytes, g->max_batch_bytes) == 0,
		   "batch init");
	xfer_batch_reset(&x, 500 + seq, seq);
	for (uint32_t i = 0; i < n; i++) {
		struct xfer_entry e = { .dst_page = 2 * i + 1, .index = i,
					.dst_gen = 9, .tokens = 16 };
		uint8_t *slot;

		if (xfer_batch_add(&x, &e, &slot))
			break;
		for (uint64_t k = 0; k < g->page_bytes; k++)
			slot[k] = (uint8_t)(seq * 17 + i * 31 + k);
	}
	size_t len = xfer_batch_seal_flags(&x, checksum, XFER_FLAG_SEALED |
					   (tx->encrypt ? XFER_FLAG_ENCRYPTED : 0));

	peer_aead_seal(tx, x.buf, len, XFER_HDR_BYTES, x.buf + len);
	fuzz_bytes_add(b, x.buf, len + XFER_TRAILER_BYTES);
	xfer_batch_deinit(&x);
}

/* Emit a seed after checking that the target accepts all of it, in order. */
static void emit_checked(fuzz_emit_fn emit, void *ctx, struct fuzz_bytes *b,
			 unsigned plain, const int *types, unsigned n_sealed,
			 unsigned n_batches)
{
	struct stats st;

	run(b->p, b->n, &st);
	if (types) {
		FUZZ_CHECK(st.frame_err == 0 && st.plain == plain &&
			   st.sealed == n_sealed && st.n_types == plain + n_sealed,
			   "seed frames: %u plain %u sealed, error %d",
			   st.plain, st.sealed, st.frame_err);
		for (unsigned i = 0; i < st.n_types; i++)
			FUZZ_CHECK(st.types[i] == types[i], "seed frame %u is a %s",
				   i, proto_peer_type_name(st.types[i]));
	}
	if (n_batches)
		FUZZ_CHECK(st.batch_err == 0 && st.batches == n_batches,
			   "seed batches: %u, error %d", st.batches, st.batch_err);
	emit(ctx, b->p, b->n);
}

void fuzz_target_seeds(fuzz_emit_fn emit, void *ctx)
{
	static const int handshake[] = { PEER_MSG_AUTH_HELLO,
					 PEER_MSG_AUTH_CHALLENGE,
					 PEER_MSG_AUTH_PROOF };
	struct fuzz_bytes b = { 0 };
	int types[64];

	link_init();
	for (uint8_t enc = 0; enc < 2; enc++) {
		struct peer_aead tx;
		unsigned n = 0;

		/* every message type, sealed, in one stream */
		tx = link_p[enc].tx;
		b.n = 0;
		fuzz_bytes_add(&b, &enc, 1);
		for (int t = PEER_MSG_HELLO; t < PEER_MSG__N; t++) {
			add_frame(&b, t, &tx);
			types[n++] = t;
		}
		emit_checked(emit, ctx, &b, 0, types, n, 0);
		/* the handshake in plaintext, then sealed frames */
		for (unsigned np = 1; np <= 3; np++) {
			uint8_t sel = (uint8_t)(enc | np << 1);

			tx = link_p[enc].tx;
			b.n = 0;
			n = 0;
			fuzz_bytes_add(&b, &sel, 1);
			for (unsigned i = 0; i < np; i++) {
				add_frame(&b, handshake[i], NULL);
				types[n++] = handshake[i];
			}
			static const int after[] = { PEER_MSG_HELLO, PEER_MSG_DATA,
						     PEER_MSG_HEARTBEAT,
						     PEER_MSG_PREFILL_REQUEST,
						     PEER_MSG_PREFILL_DONE };
			for (unsigned i = 0; i < 5; i++) {
				add_frame(&b, after[i], &tx);
				types[n++] = after[i];
			}
			emit_checked(emit, ctx, &b, np, types, 5, 0);
		}
		/* each type alone at counter 0 (material for cross-over) */
		for (int t = PEER_MSG_HELLO; t < PEER_MSG__N; t++) {
			tx = link_p[enc].tx;
			b.n = 0;
			fuzz_bytes_add(&b, &enc, 1);
			add_frame(&b, t, &tx);
			emit_checked(emit, ctx, &b, 0, &t, 1, 0);
		}
		/* batch streams: both geometries, checksum required or not */
		for (uint8_t gi = 0; gi < 2; gi++) {
			for (uint8_t req = 0; req < 2; req++) {
				uint8_t sel = (uint8_t)(enc | req << 3 | gi << 4);
				struct peer_aead dtx = link_p[enc].data;

				b.n = 0;
				fuzz_bytes_add(&b, &sel, 1);
				add_batch(&b, &geoms[gi], true, 2, 0, &dtx);
				add_batch(&b, &geoms[gi], req ? true : false, 1, 1, &dtx);
				add_batch(&b, &geoms[gi], true, 3, 2, &dtx);
				emit_checked(emit, ctx, &b, 0, NULL, 0, 3);
			}
		}
	}
	free(b.p);
}
