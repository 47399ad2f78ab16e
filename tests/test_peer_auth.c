/* test_peer_auth.c - the peer trust boundary's primitives (invariant 11):
 * proofs verify only for the right key, role, fresh nonces and both ends'
 * names and addresses (a relayed proof fails); names travel sealed; both sides
 * derive mirrored link keys; a sealed control frame or KV batch opens once,
 * in order, unmodified, and never otherwise (tampering, replay, reordering,
 * the other direction's key, an unsealed batch on a sealed stream); with
 * encryption the plaintext does not appear on the wire.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "conf/util.h"
#include "net/wire/frame.h"
#include "net/peer_auth.h"
#include "net/wire/proto_peer.h"
#include "net/xfer.h"

static const uint8_t material_a[] = "0123456789abcdef0123456789abcdef-cluster-a";
static const uint8_t material_b[] = "0123456789abcdef0123456789abcdef-cluster-b";

static void keys(struct peer_key *a, struct peer_key *b)
{
	ck_assert_int_eq(peer_auth_global_init(), 0);
	ck_assert_int_eq(peer_key_init(a, material_a, sizeof(material_a) - 1), 0);
	if (b)
		ck_assert_int_eq(peer_key_init(b, material_b, sizeof(material_b) - 1), 0);
}

START_TEST(test_key_material)
{
	struct peer_key a, a2, b;

	keys(&a, &b);
	ck_assert_int_eq(peer_key_init(&a2, material_a, sizeof(material_a) - 1), 0);
	ck_assert_mem_eq(a.k, a2.k, PEER_AUTH_BYTES);
	ck_assert_int_ne(memcmp(a.k, b.k, PEER_AUTH_BYTES), 0);
	/* too little material is refused */
	ck_assert_int_eq(peer_key_init(&a2, material_a, 31), -EINVAL);
	ck_assert(!a2.set);
	peer_key_wipe(&a);
	ck_assert(!a.set);
}
END_TEST

/* Decode's view of a direct link: its own end, prefill's listening end. */
static const struct peer_auth_ids direct_d = {
	.name_d = "d1", .name_p = "", .addr_d = "10.0.0.1:40000", .addr_p = "10.0.0.2:7000" };
static const struct peer_auth_ids direct_p = {
	.name_d = "d1", .name_p = "p1", .addr_d = "10.0.0.1:40000", .addr_p = "10.0.0.2:7000" };

START_TEST(test_proofs)
{
	struct peer_key k, other;
	uint8_t nd[PEER_AUTH_BYTES], np[PEER_AUTH_BYTES], pd[PEER_AUTH_BYTES],
		pp[PEER_AUTH_BYTES], x[PEER_AUTH_BYTES];

	keys(&k, &other);
	peer_auth_random(nd);
	peer_auth_random(np);
	peer_auth_proof(&k, PEER_SIDE_DECODE, nd, np, &direct_d, pd);
	peer_auth_proof(&k, PEER_SIDE_PREFILL, nd, np, &direct_p, pp);
	ck_assert_int_eq(peer_auth_check(&k, PEER_SIDE_DECODE, nd, np, &direct_d, pd), 0);
	ck_assert_int_eq(peer_auth_check(&k, PEER_SIDE_PREFILL, nd, np, &direct_p, pp), 0);
	/* reflection: one side's proof is never the other's */
	ck_assert_int_ne(memcmp(pd, pp, PEER_AUTH_BYTES), 0);
	ck_assert_int_eq(peer_auth_check(&k, PEER_SIDE_PREFILL, nd, np, &direct_d, pd), PEER_AUTH_E_PROOF);
	/* another cluster's key */
	ck_assert_int_eq(peer_auth_check(&other, PEER_SIDE_DECODE, nd, np, &direct_d, pd), PEER_AUTH_E_PROOF);
	/* replay against a fresh nonce, or nonces swapped */
	peer_auth_random(x);
	ck_assert_int_eq(peer_auth_check(&k, PEER_SIDE_DECODE, nd, x, &direct_d, pd), PEER_AUTH_E_PROOF);
	ck_assert_int_eq(peer_auth_check(&k, PEER_SIDE_DECODE, np, nd, &direct_d, pd), PEER_AUTH_E_PROOF);
	/* every single flipped bit */
	for (unsigned i = 0; i < PEER_AUTH_BYTES * 8; i++) {
		memcpy(x, pd, PEER_AUTH_BYTES);
		x[i / 8] ^= (uint8_t)(1u << (i % 8));
		ck_assert_int_eq(peer_auth_check(&k, PEER_SIDE_DECODE, nd, np, &direct_d, x),
				 PEER_AUTH_E_PROOF);
	}
	/* a peer echoing our own nonce (reflected handshake) never passes */
	peer_auth_proof(&k, PEER_SIDE_DECODE, nd, nd, &direct_d, x);
	ck_assert_int_eq(peer_auth_check(&k, PEER_SIDE_DECODE, nd, nd, &direct_d, x), PEER_AUTH_E_PROOF);
	/* no key, no proof */
	memset(&other, 0, sizeof(other));
	ck_assert_int_eq(peer_auth_check(&other, PEER_SIDE_DECODE, nd, np, &direct_d, pd), PEER_AUTH_E_PROOF);
}
END_TEST

/* Issue 22: a proof is bound to both ends. A man in the middle M relays
 * decode d1's handshake (d1 dialed M at 10.0.0.9:7000) to prefill p1
 * (which sees M's own connection from 10.0.0.9:50000): neither decode's
 * proof nor prefill's verifies at the other end, and no proof verifies
 * for another node's name, nor for one string's bytes moved to the next. */
START_TEST(test_proofs_relayed)
{
	static const struct peer_auth_ids d_sees = {
		.name_d = "d1", .addr_d = "10.0.0.1:40000", .addr_p = "10.0.0.9:7000" };
	static const struct peer_auth_ids p_sees = {
		.name_d = "d1", .addr_d = "10.0.0.9:50000", .addr_p = "10.0.0.2:7000" };
	static const struct peer_auth_ids variants[] = {
		{ .name_d = "d2", .addr_d = "10.0.0.1:40000", .addr_p = "10.0.0.2:7000" },
		{ .name_d = "d1", .name_p = "p2", .addr_d = "10.0.0.1:40000", .addr_p = "10.0.0.2:7000" },
		{ .name_d = "d1", .addr_d = "10.0.0.1:40001", .addr_p = "10.0.0.2:7000" },
		{ .name_d = "d1", .addr_d = "10.0.0.1:40000", .addr_p = "10.0.0.3:7000" },
		/* the same bytes, split differently between the strings */
		{ .name_d = "d", .name_p = "1", .addr_d = "10.0.0.1:40000", .addr_p = "10.0.0.2:7000" },
		{ .name_d = "d1", .addr_d = "10.0.0.1:40000" "10.0.0.2:7000", .addr_p = "" },
	};
	struct peer_key k;
	uint8_t nd[PEER_AUTH_BYTES], np[PEER_AUTH_BYTES], pf[PEER_AUTH_BYTES];

	keys(&k, NULL);
	peer_auth_random(nd);
	peer_auth_random(np);
	/* decode's proof, made over what decode sees, checked by prefill */
	peer_auth_proof(&k, PEER_SIDE_DECODE, nd, np, &d_sees, pf);
	ck_assert_int_eq(peer_auth_check(&k, PEER_SIDE_DECODE, nd, np, &p_sees, pf),
			 PEER_AUTH_E_PROOF);
	/* prefill's, the other way */
	peer_auth_proof(&k, PEER_SIDE_PREFILL, nd, np, &p_sees, pf);
	ck_assert_int_eq(peer_auth_check(&k, PEER_SIDE_PREFILL, nd, np, &d_sees, pf),
			 PEER_AUTH_E_PROOF);
	/* a direct proof checked against any other identity */
	peer_auth_proof(&k, PEER_SIDE_DECODE, nd, np, &direct_d, pf);
	for (unsigned i = 0; i < sizeof(variants) / sizeof(variants[0]); i++)
		ck_assert_msg(peer_auth_check(&k, PEER_SIDE_DECODE, nd, np, &variants[i], pf) ==
			      PEER_AUTH_E_PROOF, "variant %u verified", i);
}
END_TEST

/* A node name in an auth_proof: opens once with the right key and
 * counter, never shows on the wire, never opens altered. */
START_TEST(test_name_sealed)
{
	struct peer_key k;
	uint8_t nd[PEER_AUTH_BYTES], np[PEER_AUTH_BYTES];
	uint8_t box[PEER_AUTH_NAME_SEALED], bad[PEER_AUTH_NAME_SEALED];
	struct peer_session d, p;
	char name[PEER_AUTH_NAME_BYTES];

	keys(&k, NULL);
	peer_auth_random(nd);
	peer_auth_random(np);
	peer_session_derive(&d, &k, PEER_SIDE_DECODE, nd, np, false);
	peer_session_derive(&p, &k, PEER_SIDE_PREFILL, nd, np, false);
	peer_auth_name_seal(&d.tx, "decode-node-7", box);
	ck_assert_uint_eq(d.tx.seq, 1);
	ck_assert_ptr_null(memmem(box, sizeof(box), "decode-node-7", 13));
	for (unsigned i = 0; i < sizeof(box) * 8; i += 7) {
		memcpy(bad, box, sizeof(box));
		bad[i / 8] ^= (uint8_t)(1u << (i % 8));
		ck_assert_int_eq(peer_auth_name_open(&p.rx, bad, name), PEER_AUTH_E_OPEN);
		ck_assert_uint_eq(p.rx.seq, 0);
	}
	/* the other direction's key */
	ck_assert_int_eq(peer_auth_name_open(&d.rx, box, name), PEER_AUTH_E_OPEN);
	ck_assert_int_eq(peer_auth_name_open(&p.rx, box, name), 0);
	ck_assert_str_eq(name, "decode-node-7");
	ck_assert_uint_eq(p.rx.seq, 1);
	/* replayed: the counter moved on */
	ck_assert_int_eq(peer_auth_name_open(&p.rx, box, name), PEER_AUTH_E_OPEN);
}
END_TEST

static void link_pair(struct peer_session *d, struct peer_session *p, bool enc)
{
	struct peer_key k;
	uint8_t nd[PEER_AUTH_BYTES], np[PEER_AUTH_BYTES];

	keys(&k, NULL);
	peer_auth_random(nd);
	peer_auth_random(np);
	peer_session_derive(d, &k, PEER_SIDE_DECODE, nd, np, enc);
	peer_session_derive(p, &k, PEER_SIDE_PREFILL, nd, np, enc);
}

START_TEST(test_session_keys)
{
	struct peer_session d, p, d2, p2;

	link_pair(&d, &p, false);
	ck_assert_mem_eq(d.tx.key, p.rx.key, PEER_AUTH_BYTES);
	ck_assert_mem_eq(d.rx.key, p.tx.key, PEER_AUTH_BYTES);
	ck_assert_mem_eq(d.data.key, p.data.key, PEER_AUTH_BYTES);
	ck_assert_mem_eq(d.token, p.token, PEER_AUTH_BYTES);
	ck_assert_int_ne(memcmp(d.tx.key, d.rx.key, PEER_AUTH_BYTES), 0);
	ck_assert_int_ne(memcmp(d.tx.key, d.data.key, PEER_AUTH_BYTES), 0);
	ck_assert_int_ne(memcmp(d.token, d.data.key, PEER_AUTH_BYTES), 0);
	/* another link (other nonces): nothing in common */
	link_pair(&d2, &p2, false);
	ck_assert_int_ne(memcmp(d.tx.key, d2.tx.key, PEER_AUTH_BYTES), 0);
	ck_assert_int_ne(memcmp(d.token, d2.token, PEER_AUTH_BYTES), 0);
}
END_TEST

/* A hello frame, sealed by `tx`. */
static char *sealed_frame(struct peer_aead *tx, size_t *len, const char *node)
{
	struct proto_peer_msg m = { .type = PEER_MSG_HEARTBEAT, .load = 7 };
	char *data;

	(void)node;
	ck_assert_int_eq(proto_peer_frame(&m, &data, len), 0);
	ck_assert_int_eq(peer_frame_seal(tx, &data, len), 0);
	return data;
}

static int feed_one(struct frame_decoder *dec, const char *data, size_t len,
		    struct proto_peer_msg *out)
{
	const msgpack_object *map;
	struct frame_error err;
	size_t used;
	int r;

	ck_assert_int_eq(frame_decoder_feed(dec, data, len, &used), 0);
	ck_assert_uint_eq(used, len);
	r = frame_decoder_next(dec, &map);
	if (r)
		return r;
	return proto_peer_parse(map, out, &err);
}

static void check_frames(bool enc)
{
	struct peer_session d, p;
	struct frame_decoder dec;
	struct proto_peer_msg o;
	char *f1, *f2, *f3;
	size_t l1, l2, l3;

	link_pair(&d, &p, enc);
	frame_decoder_init(&dec, PROTO_PEER_FRAME_MAX + PEER_AUTH_TAG_BYTES);
	frame_decoder_set_opener(&dec, peer_frame_open, &p.rx);
	f1 = sealed_frame(&d.tx, &l1, "a");
	f2 = sealed_frame(&d.tx, &l2, "b");
	f3 = sealed_frame(&d.tx, &l3, "c");
	/* encrypted: the map's text is not on the wire; plain: it is */
	ck_assert(enc == !memmem(f1, l1, "heartbeat", 9));
	ck_assert_int_eq(feed_one(&dec, f1, l1, &o), 0);
	ck_assert_int_eq(o.type, PEER_MSG_HEARTBEAT);
	ck_assert_uint_eq(o.load, 7);
	/* f1 again (replay): refused, and the stream stays broken */
	ck_assert_int_eq(feed_one(&dec, f1, l1, &o), FRAME_E_AUTH);
	ck_assert_int_eq(feed_one(&dec, f2, l2, &o), FRAME_E_AUTH);
	frame_decoder_deinit(&dec);

	/* reordering: f3 before f2 */
	link_pair(&d, &p, enc);
	frame_decoder_init(&dec, PROTO_PEER_FRAME_MAX + PEER_AUTH_TAG_BYTES);
	frame_decoder_set_opener(&dec, peer_frame_open, &p.rx);
	free(f1); free(f2); free(f3);
	f1 = sealed_frame(&d.tx, &l1, "a");
	f2 = sealed_frame(&d.tx, &l2, "b");
	f3 = sealed_frame(&d.tx, &l3, "c");
	ck_assert_int_eq(feed_one(&dec, f1, l1, &o), 0);
	ck_assert_int_eq(feed_one(&dec, f3, l3, &o), FRAME_E_AUTH);
	frame_decoder_deinit(&dec);

	/* every flipped byte of a frame's payload or tag, and the wrong
	 * direction's key: refused */
	for (size_t i = FRAME_HEADER_BYTES; i < l2; i++) {
		struct peer_aead rx = p.rx;
		char *c = malloc(l2);

		memcpy(c, f2, l2);
		c[i] ^= 0x40;
		rx.seq = 1;   /* f2 was the second frame */
		frame_decoder_init(&dec, PROTO_PEER_FRAME_MAX + PEER_AUTH_TAG_BYTES);
		frame_decoder_set_opener(&dec, peer_frame_open, &rx);
		ck_assert_int_eq(feed_one(&dec, c, l2, &o), FRAME_E_AUTH);
		frame_decoder_deinit(&dec);
		free(c);
	}
	{
		struct peer_aead wrong = p.tx;

		wrong.seq = 1;
		frame_decoder_init(&dec, PROTO_PEER_FRAME_MAX + PEER_AUTH_TAG_BYTES);
		frame_decoder_set_opener(&dec, peer_frame_open, &wrong);
		ck_assert_int_eq(feed_one(&dec, f2, l2, &o), FRAME_E_AUTH);
		frame_decoder_deinit(&dec);
	}
	/* too short to hold a tag */
	{
		struct peer_aead rx = p.rx;
		size_t pn;
		uint8_t tiny[4] = { 1, 2, 3, 4 };

		ck_assert_int_eq(peer_frame_open(&rx, tiny, sizeof(tiny), &pn), PEER_AUTH_E_SIZE);
	}
	free(f1); free(f2); free(f3);
}

START_TEST(test_frames_mac) { check_frames(false); }
END_TEST
START_TEST(test_frames_aead) { check_frames(true); }
END_TEST

#define PB 256u

static size_t sealed_batch(struct xfer_batch *b, struct peer_aead *a, uint8_t fill)
{
	size_t len;

	xfer_batch_reset(b, 99, 0);
	for (uint32_t i = 0; i < 3; i++) {
		struct xfer_entry e = { .dst_page = i, .index = i, .dst_gen = 5, .tokens = 4 };
		uint8_t *slot;

		ck_assert_int_eq(xfer_batch_add(b, &e, &slot), 0);
		memset(slot, fill + (int)i, PB);
	}
	len = xfer_batch_seal_flags(b, true, XFER_FLAG_SEALED |
				    (a->encrypt ? XFER_FLAG_ENCRYPTED : 0));
	peer_aead_seal(a, b->buf, len, XFER_HDR_BYTES, b->buf + len);
	return len + XFER_TRAILER_BYTES;
}

static int open_cb(void *arg, uint8_t *batch, size_t n, const uint8_t *tag)
{
	return peer_aead_open(arg, batch, n, XFER_HDR_BYTES, tag);
}

static void check_batches(bool enc)
{
	struct peer_session d, p;
	struct xfer_batch b;
	struct xfer_reader r;
	struct xfer_hdr h;
	const uint8_t *batch;
	uint64_t bound = xfer_batch_bytes(3, PB);
	size_t len, used;
	uint8_t *img;

	link_pair(&d, &p, enc);
	ck_assert_int_eq(xfer_batch_init(&b, PB, bound), 0);
	/* two batches in order: both open, pages intact */
	xfer_reader_init(&r, PB, bound, true);
	xfer_reader_set_opener(&r, open_cb, &d.data);
	for (int k = 0; k < 2; k++) {
		len = sealed_batch(&b, &p.data, (uint8_t)(0x30 + k));
		ck_assert(enc == !memmem(b.buf, len, (uint8_t[]){ 0x30 + k, 0x30 + k, 0x30 + k, 0x30 + k }, 4));
		ck_assert_int_eq(xfer_reader_feed(&r, b.buf, len, &used), 0);
		ck_assert_uint_eq(used, len);
		ck_assert_int_eq(xfer_reader_next(&r, &h, &batch), 0);
		ck_assert_uint_eq(h.request_id, 99);
		ck_assert_uint_eq(xfer_batch_page(batch, &h, 2)[17], (uint8_t)(0x30 + k + 2));
	}
	xfer_reader_deinit(&r);

	/* a flipped byte anywhere after the header: XFER_E_AUTH, sticky */
	img = malloc(len + 1);
	for (size_t i = XFER_HDR_BYTES; i < len; i += 97) {
		struct peer_aead rx = d.data;

		rx.seq = 2;
		len = sealed_batch(&b, &p.data, 1);
		p.data.seq--;   /* reuse the counter for the next image */
		memcpy(img, b.buf, len);
		img[i] ^= 0x01;
		xfer_reader_init(&r, PB, bound, true);
		xfer_reader_set_opener(&r, open_cb, &rx);
		ck_assert_int_eq(xfer_reader_feed(&r, img, len, &used), 0);
		ck_assert_int_eq(xfer_reader_next(&r, &h, &batch), XFER_E_AUTH);
		ck_assert_int_eq(xfer_reader_next(&r, &h, &batch), XFER_E_AUTH);
		xfer_reader_deinit(&r);
	}
	free(img);

	/* an unsealed batch on a sealed stream: refused at its header */
	xfer_reader_init(&r, PB, bound, true);
	xfer_reader_set_opener(&r, open_cb, &d.data);
	xfer_batch_reset(&b, 1, 0);
	{
		uint8_t *slot;
		struct xfer_entry e = { .dst_page = 0, .index = 0, .dst_gen = 1, .tokens = 1 };

		ck_assert_int_eq(xfer_batch_add(&b, &e, &slot), 0);
		memset(slot, 0, PB);
	}
	len = xfer_batch_seal(&b, true);
	ck_assert_int_eq(xfer_reader_feed(&r, b.buf, len, &used), XFER_E_AUTH);
	xfer_reader_deinit(&r);
	/* and a sealed batch where none is expected */
	xfer_reader_init(&r, PB, bound, true);
	len = sealed_batch(&b, &p.data, 3);
	ck_assert_int_eq(xfer_reader_feed(&r, b.buf, len, &used), XFER_E_VERSION);
	xfer_reader_deinit(&r);
	xfer_batch_deinit(&b);
}

/* A refused open leaves the counter, the additional data and the tag as
 * they were, and the encrypted part either untouched (authenticated only)
 * or wiped (encrypted). fuzz_peer_auth found that an encrypted refusal
 * zeroes the ciphertext in place although peer_auth.h said "nothing
 * changed". */
static void check_refusal(bool enc)
{
	struct peer_session d, p;
	uint8_t buf[64 + 40], orig[sizeof(buf)], tag[PEER_AUTH_TAG_BYTES];
	uint8_t zero[sizeof(buf)] = { 0 };

	link_pair(&d, &p, enc);
	for (size_t i = 0; i < sizeof(buf); i++)
		buf[i] = (uint8_t)(i + 1);
	peer_aead_seal(&p.data, buf, sizeof(buf), 64, tag);
	buf[70] ^= 0x20;   /* forged */
	memcpy(orig, buf, sizeof(buf));
	ck_assert_int_eq(peer_aead_open(&d.data, buf, sizeof(buf), 64, tag),
			 PEER_AUTH_E_OPEN);
	ck_assert_uint_eq(d.data.seq, 0);
	ck_assert_mem_eq(buf, orig, 64);
	if (enc)
		ck_assert_mem_eq(buf + 64, zero, sizeof(buf) - 64);
	else
		ck_assert_mem_eq(buf + 64, orig + 64, sizeof(buf) - 64);
	/* the genuine image still opens at the same counter */
	orig[70] ^= 0x20;
	memcpy(buf, orig, sizeof(buf));
	ck_assert_int_eq(peer_aead_open(&d.data, buf, sizeof(buf), 64, tag), 0);
	ck_assert_uint_eq(d.data.seq, 1);
	for (size_t i = 0; i < sizeof(buf); i++)
		ck_assert_uint_eq(buf[i], (uint8_t)(i + 1));
}

START_TEST(test_refusal_mac) { check_refusal(false); }
END_TEST
START_TEST(test_refusal_aead) { check_refusal(true); }
END_TEST

START_TEST(test_batches_mac) { check_batches(false); }
END_TEST
START_TEST(test_batches_aead) { check_batches(true); }
END_TEST

/* A MAC-only batch (issue 22.9): every bit of header, entries, payload
 * and tag matters; a batch replayed (the counter moved on) or sealed
 * twice under one counter is refused; the zero-copy sender's tag over the
 * batch in pieces, cut anywhere, is the one-buffer tag. */
START_TEST(test_batch_mac_bits_and_counter)
{
	struct peer_session d, p;
	uint8_t buf[XFER_HDR_BYTES + 24 + 96], tag[PEER_AUTH_TAG_BYTES];
	uint8_t tag2[PEER_AUTH_TAG_BYTES];
	const size_t n = sizeof(buf);

	link_pair(&d, &p, false);
	for (size_t i = 0; i < n; i++)
		buf[i] = (uint8_t)(i * 7 + 1);
	peer_aead_seal(&p.data, buf, n, XFER_HDR_BYTES, tag);
	for (size_t bit = 0; bit < 8 * (n + sizeof(tag)); bit++) {
		uint8_t *at = bit / 8 < n ? buf + bit / 8 : tag + bit / 8 - n;

		*at ^= (uint8_t)(1u << (bit % 8));
		ck_assert_int_eq(peer_aead_open(&d.data, buf, n, XFER_HDR_BYTES, tag),
				 PEER_AUTH_E_OPEN);
		*at ^= (uint8_t)(1u << (bit % 8));
	}
	ck_assert_uint_eq(d.data.seq, 0);
	ck_assert_int_eq(peer_aead_open(&d.data, buf, n, XFER_HDR_BYTES, tag), 0);
	/* replayed: decode's counter is 1 now */
	ck_assert_int_eq(peer_aead_open(&d.data, buf, n, XFER_HDR_BYTES, tag),
			 PEER_AUTH_E_OPEN);
	/* a sender that reused counter 0 for another batch is refused too */
	buf[n - 1] ^= 0x40;
	p.data.seq = 0;
	peer_aead_seal(&p.data, buf, n, XFER_HDR_BYTES, tag2);
	ck_assert_int_eq(peer_aead_open(&d.data, buf, n, XFER_HDR_BYTES, tag2),
			 PEER_AUTH_E_OPEN);
	ck_assert_uint_eq(d.data.seq, 1);
	/* pieces, cut anywhere: the one-buffer tag (counter 1) */
	p.data.seq = 1;
	peer_aead_seal(&p.data, buf, n, XFER_HDR_BYTES, tag);
	for (size_t cut1 = 0; cut1 <= n; cut1 += 13) {
		size_t cut2 = cut1 + (n - cut1) / 2;
		struct iovec iov[3] = { { buf, cut1 }, { buf + cut1, cut2 - cut1 },
					{ buf + cut2, n - cut2 } };

		p.data.seq = 1;
		peer_aead_mac_iov(&p.data, iov, 3, tag2);
		ck_assert_mem_eq(tag2, tag, sizeof(tag));
		ck_assert_uint_eq(p.data.seq, 2);
	}
	ck_assert_int_eq(peer_aead_open(&d.data, buf, n, XFER_HDR_BYTES, tag2), 0);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("peer_auth");
	TCase *tc = tcase_create("core");
	SRunner *sr;
	int nf;

	tcase_add_test(tc, test_key_material);
	tcase_add_test(tc, test_proofs);
	tcase_add_test(tc, test_proofs_relayed);
	tcase_add_test(tc, test_name_sealed);
	tcase_add_test(tc, test_session_keys);
	tcase_add_test(tc, test_frames_mac);
	tcase_add_test(tc, test_frames_aead);
	tcase_add_test(tc, test_batches_mac);
	tcase_add_test(tc, test_batches_aead);
	tcase_add_test(tc, test_refusal_mac);
	tcase_add_test(tc, test_refusal_aead);
	tcase_add_test(tc, test_batch_mac_bits_and_counter);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	nf = srunner_ntests_failed(sr);
	srunner_free(sr);
	return nf ? 1 : 0;
}
