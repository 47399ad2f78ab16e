/* fuzz_frame.c - the frame codec and schema readers (net/wire/frame.h), and the
 * admin plane's argument decoding through them.
 *
 * Every socket kvd listens on (admin, client, peer) speaks these frames,
 * so the input is a hostile byte stream. Properties checked:
 *   - frame_decode (one shot): 0 with a map, or a FRAME_E_* it documents;
 *     a decoded map re-encodes (msgpack_pack_object) to a payload no
 *     longer than the original that decodes again and re-encodes to the
 *     same bytes (a fixed point: nothing is lost or invented); it agrees
 *     with frame_msgpack_check();
 *   - the incremental decoder gives the same transcript (codes and
 *     re-encoded maps) whether the stream arrives in one piece or in
 *     small chunks, never stalls (a feed that takes nothing while next()
 *     says AGAIN), keeps TOOBIG sticky and says TRUNCATED at the end
 *     exactly when bytes are pending;
 *   - frame_map_parse with a schema of every field type, strict and not:
 *     0 or a schema FRAME_E_* with key and message; strings terminated and
 *     short enough, ranged integers in range, required keys present, only
 *     known bits in *present; strict success implies lax success with the
 *     same values;
 *   - the admin command schemas (ctl/admin_args.h: the daemon's own
 *     drain/pool.resize/abort/fault.load tables, on which it runs exactly
 *     frame_map_parse(strict, ignore cmd/id));
 *   - frame_obj_* on every value: 0 or TYPE/RANGE.
 */
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#include "ctl/admin_args.h"
#include "net/wire/frame.h"
#include "tests/fuzz/fuzz.h"

const char fuzz_target_name[] = "frame";

#define FUZZ_FRAME_MAX 4096u   /* small, so TOOBIG is reachable */

/* msgpack_pack_object into a fresh buffer. */
static void pack(const msgpack_object *o, struct fuzz_bytes *out)
{
	msgpack_packer pk;

	out->n = 0;
	msgpack_packer_init(&pk, out, fuzz_bytes_write);
	msgpack_pack_object(&pk, *o);
}

/* ---- re-encoding ---------------------------------------------------------- */

static void check_reencode(const msgpack_object *o, size_t payload_len)
{
	struct fuzz_bytes a = { 0 }, b = { 0 }, fr = { 0 };
	msgpack_unpacked msg;
	const msgpack_object *o2;
	uint8_t hdr[4];
	int r;

	pack(o, &a);
	FUZZ_CHECK(a.n <= payload_len, "re-encoding grew %zu -> %zu",
		   payload_len, a.n);
	hdr[0] = (uint8_t)(a.n >> 24);
	hdr[1] = (uint8_t)(a.n >> 16);
	hdr[2] = (uint8_t)(a.n >> 8);
	hdr[3] = (uint8_t)a.n;
	fuzz_bytes_add(&fr, hdr, 4);
	fuzz_bytes_add(&fr, a.p, a.n);
	msgpack_unpacked_init(&msg);
	r = frame_decode(fr.p, fr.n, FUZZ_FRAME_MAX, &msg, &o2);
	FUZZ_CHECK(r == 0, "re-encoded frame does not decode: %s",
		   frame_strerror(r));
	pack(o2, &b);
	FUZZ_CHECK(a.n == b.n && !memcmp(a.p, b.p, a.n),
		   "re-encoding is not a fixed point (%zu vs %zu bytes)", a.n,
		   b.n);
	msgpack_unpacked_destroy(&msg);
	free(a.p);
	free(b.p);
	free(fr.p);
}

/* ---- schemas ---------------------------------------------------------------- */

struct all {
	bool b;
	uint64_t u;
	uint64_t ur;
	int64_t i;
	double d;
	char s[8];
	char cmd[32];
	const msgpack_object *m, *a, *any;
};

#define F(name, type, req, field, size, lo, hi) \
	{ name, type, req, offsetof(struct all, field), size, lo, hi }

static const struct frame_field all_fields[] = {
	F("b", FRAME_T_BOOL, false, b, 0, 0, 0),
	F("u", FRAME_T_U64, false, u, 0, 0, 0),
	F("ur", FRAME_T_U64, false, ur, 0, 1, 100),
	F("i", FRAME_T_I64, false, i, 0, 0, 0),
	F("d", FRAME_T_DOUBLE, false, d, 0, 0, 0),
	F("s", FRAME_T_STR, false, s, 8, 0, 0),
	F("cmd", FRAME_T_STR, true, cmd, 32, 0, 0),
	F("m", FRAME_T_MAP, false, m, 0, 0, 0),
	F("a", FRAME_T_ARRAY, false, a, 0, 0, 0),
	F("x", FRAME_T_ANY, false, any, 0, 0, 0),
};
#undef F

static void check_schema_result(int r, const struct frame_error *err,
				const struct frame_field *fields, size_t n,
				const void *out, uint64_t present)
{
	if (r) {
		FUZZ_CHECK(r >= FRAME_E_MISSING && r <= FRAME_E_DUPLICATE,
			   "frame_map_parse: %d (%s)", r, frame_strerror(r));
		FUZZ_CHECK(err->code == r, "err.code %d vs %d", err->code, r);
		FUZZ_CHECK(memchr(err->msg, 0, sizeof(err->msg)) && err->msg[0],
			   "error without a message");
		FUZZ_CHECK(memchr(err->key, 0, sizeof(err->key)),
			   "error key not terminated");
		return;
	}
	FUZZ_CHECK(n == 64 || present >> n == 0, "unknown bits in present");
	for (size_t i = 0; i < n; i++) {
		const struct frame_field *f = &fields[i];
		const uint8_t *p = (const uint8_t *)out + f->offset;
		bool here = present >> i & 1;

		FUZZ_CHECK(here || !f->required, "required '%s' absent", f->name);
		if (!here)
			continue;
		if (f->type == FRAME_T_STR) {
			FUZZ_CHECK(memchr(p, 0, f->size), "'%s' not terminated",
				   f->name);
		} else if (f->type == FRAME_T_U64 && (f->min || f->max)) {
			uint64_t v;

			memcpy(&v, p, sizeof(v));
			FUZZ_CHECK(v >= f->min && v <= f->max,
				   "'%s' = %llu outside [%llu, %llu]", f->name,
				   (unsigned long long)v,
				   (unsigned long long)f->min,
				   (unsigned long long)f->max);
		} else if (f->type == FRAME_T_MAP || f->type == FRAME_T_ARRAY) {
			const msgpack_object *o;

			memcpy(&o, p, sizeof(o));
			FUZZ_CHECK(o && o->type == (f->type == FRAME_T_MAP ?
						    MSGPACK_OBJECT_MAP :
						    MSGPACK_OBJECT_ARRAY),
				   "'%s' has the wrong type", f->name);
		}
	}
}

/* KNOWN BUG empty-str-null (net/wire/frame.c frame_obj_str, the memchr and
 * memcpy at lines 539/541): msgpack-c leaves via.str.ptr NULL for an empty
 * string that is the first variable-length item of a payload ({1: ""}),
 * and frame_obj_str passes it to memchr/memcpy with length 0: undefined
 * behaviour (glibc declares them nonnull; UBSan aborts). The same bug in
 * frame_error_set (an empty key, {"": 1}) was found here and fixed in
 * ad31dee. Until it is fixed, such strings skip frame_obj_str
 * (KVD_FUZZ_STRICT=1 runs them). */

static void check_schemas(const msgpack_object *map)
{
	static const char *const envelope[] = { "cmd", "id", NULL };
	struct frame_error err;
	struct all strict, lax;
	uint64_t ps = 0, pl = 0;
	size_t n = sizeof(all_fields) / sizeof(all_fields[0]);
	int rs, rl;

	memset(&strict, 0, sizeof(strict));
	memset(&lax, 0, sizeof(lax));
	rs = frame_map_parse(map, all_fields, n, FRAME_SCHEMA_STRICT,
			     envelope + 1, &strict, &ps, &err);
	check_schema_result(rs, &err, all_fields, n, &strict, ps);
	rl = frame_map_parse(map, all_fields, n, 0, NULL, &lax, &pl, &err);
	check_schema_result(rl, &err, all_fields, n, &lax, pl);
	if (rs == 0) {
		FUZZ_CHECK(rl == 0, "strict accepted, lax said %s",
			   frame_strerror(rl));
		FUZZ_CHECK(ps == pl && !strcmp(strict.s, lax.s) &&
			   !strcmp(strict.cmd, lax.cmd) && strict.u == lax.u &&
			   strict.i == lax.i && strict.b == lax.b,
			   "strict and lax disagree");
	}

	for (size_t t = 0; t < ADMIN_ARGS__N; t++) {
		const struct admin_args_schema *sc = &admin_args_schemas[t];
		struct admin_args a;
		uint64_t present = 0;
		int r;

		memset(&a, 0, sizeof(a));
		r = frame_map_parse(map, sc->fields, sc->n, FRAME_SCHEMA_STRICT,
				    envelope, &a, &present, &err);
		check_schema_result(r, &err, sc->fields, sc->n, &a, present);
	}

	/* every value through every typed read */
	for (uint32_t i = 0; i < map->via.map.size; i++) {
		const msgpack_object *v = &map->via.map.ptr[i].val;
		uint64_t u;
		int64_t s;
		double d;
		bool b;
		char buf[16];
		int r;

		r = frame_obj_u64(v, &u);
		FUZZ_CHECK(r == 0 || r == FRAME_E_TYPE || r == FRAME_E_RANGE, "u64 %d", r);
		r = frame_obj_i64(v, &s);
		FUZZ_CHECK(r == 0 || r == FRAME_E_TYPE || r == FRAME_E_RANGE, "i64 %d", r);
		r = frame_obj_double(v, &d);
		FUZZ_CHECK(r == 0 || r == FRAME_E_TYPE || r == FRAME_E_RANGE, "dbl %d", r);
		r = frame_obj_bool(v, &b);
		FUZZ_CHECK(r == 0 || r == FRAME_E_TYPE, "bool %d", r);
		r = frame_obj_str(v, buf, sizeof(buf));
		FUZZ_CHECK(r == 0 || r == FRAME_E_TYPE || r == FRAME_E_RANGE, "str %d", r);
		if (r == 0)
			FUZZ_CHECK(strlen(buf) < sizeof(buf) &&
				   strlen(buf) == v->via.str.size,
				   "frame_obj_str kept %zu of %u bytes",
				   strlen(buf), v->via.str.size);
		const msgpack_object *k = &map->via.map.ptr[i].key;

		if (k->type == MSGPACK_OBJECT_STR && k->via.str.size &&
		    k->via.str.size < 64) {
			char key[64];

			memcpy(key, k->via.str.ptr, k->via.str.size);
			key[k->via.str.size] = '\0';
			if (strlen(key) == k->via.str.size)
				FUZZ_CHECK(frame_map_get(map, key) != NULL,
					   "frame_map_get misses '%s'", key);
		}
	}
}

/* ---- one shot ------------------------------------------------------------- */

static void check_one_shot(const uint8_t *data, size_t size)
{
	msgpack_unpacked msg;
	const msgpack_object *o = NULL;
	int r;

	msgpack_unpacked_init(&msg);
	r = frame_decode(data, size, FUZZ_FRAME_MAX, &msg, &o);
	FUZZ_CHECK(r == 0 || r == FRAME_E_TRUNCATED || r == FRAME_E_TOOBIG ||
		   r == FRAME_E_MALFORMED || r == FRAME_E_NOTMAP || r == -ENOMEM,
		   "frame_decode: %d (%s)", r, frame_strerror(r));
	/* msgpack-c takes a stack slot for an empty innermost container
	 * too; the structural check refuses that depth first (was a bug:
	 * -ENOMEM for a 37-byte frame) */
	FUZZ_CHECK(r != -ENOMEM, "frame_decode of %zu bytes says -ENOMEM", size);
	if (size > FRAME_HEADER_BYTES && r != FRAME_E_TOOBIG &&
	    r != FRAME_E_TRUNCATED) {
		int c = frame_msgpack_check(data + 4, size - 4);

		FUZZ_CHECK(c == 0 || c == FRAME_E_MALFORMED, "check: %d", c);
		if (r == 0 || r == FRAME_E_NOTMAP)
			FUZZ_CHECK(c == 0, "decoded, yet the check says malformed");
	}
	if (r == 0) {
		FUZZ_CHECK(o && o->type == MSGPACK_OBJECT_MAP, "not a map");
		check_reencode(o, size - FRAME_HEADER_BYTES);
		check_schemas(o);
	}
	msgpack_unpacked_destroy(&msg);
}

/* ---- streaming -------------------------------------------------------------- */

/* Feed data in chunks of sizes drawn from `cs` (0: all at once) and write
 * every next() result (code, then the re-encoded map) to `t`. */
static void stream(const uint8_t *data, size_t size, uint32_t cs,
		   struct fuzz_bytes *t)
{
	struct frame_decoder d;
	struct fuzz_bytes enc = { 0 };
	size_t off = 0, used;
	bool broken = false;
	int r;

	frame_decoder_init(&d, FUZZ_FRAME_MAX);
	for (;;) {
		const msgpack_object *o;

		for (;;) {
			r = frame_decoder_next(&d, &o);
			FUZZ_CHECK(r == 0 || r == FRAME_E_AGAIN || r == FRAME_E_TOOBIG ||
				   r == FRAME_E_MALFORMED || r == FRAME_E_NOTMAP ||
				   r == -ENOMEM, "next: %d", r);
			if (r == FRAME_E_AGAIN || r == FRAME_E_TOOBIG)
				break;
			/* -ENOMEM: KNOWN BUG depth-enomem (see check_one_shot);
			 * the frame was consumed, the stream goes on */
			int8_t code = (int8_t)r;

			fuzz_bytes_add(t, &code, 1);
			if (r == 0) {
				FUZZ_CHECK(o->type == MSGPACK_OBJECT_MAP, "not a map");
				pack(o, &enc);
				fuzz_bytes_add(t, &enc.n, sizeof(enc.n));
				fuzz_bytes_add(t, enc.p, enc.n);
			}
		}
		if (r == FRAME_E_TOOBIG) {
			const msgpack_object *o2;

			FUZZ_CHECK(frame_decoder_next(&d, &o2) == FRAME_E_TOOBIG,
				   "TOOBIG is not sticky");
			broken = true;
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
		FUZZ_CHECK(used <= n, "feed took %zu of %zu", used, n);
		FUZZ_CHECK(used > 0, "decoder stalled: AGAIN and took nothing "
			   "(pending %zu)", frame_decoder_pending(&d));
		off += used;
	}
	int8_t end = broken ? 100 : (int8_t)frame_decoder_finish(&d);

	if (!broken)
		FUZZ_CHECK((end == FRAME_E_TRUNCATED) ==
			   (frame_decoder_pending(&d) > 0),
			   "finish %d with %zu pending", end,
			   frame_decoder_pending(&d));
	fuzz_bytes_add(t, &end, 1);
	frame_decoder_deinit(&d);
	frame_decoder_deinit(&d);   /* safe twice */
	free(enc.p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fuzz_bytes whole = { 0 }, chunked = { 0 };
	uint32_t cs = 1;

	check_one_shot(data, size);
	for (size_t i = 0; i < size && i < 16; i++)
		cs = cs * 31 + data[i];
	stream(data, size, 0, &whole);
	stream(data, size, cs | 1, &chunked);
	FUZZ_CHECK(whole.n == chunked.n && !memcmp(whole.p, chunked.p, whole.n),
		   "chunking changed the decoded stream");
	free(whole.p);
	free(chunked.p);
	return 0;
}

/* ---- seeds ------------------------------------------------------------------ */

static void emit_writer(struct frame_writer *w, fuzz_emit_fn emit, void *ctx,
			struct fuzz_bytes *also)
{
	char *data;
	size_t len;

	if (frame_writer_finish(w, FRAME_MAX_LIMIT, &data, &len))
		abort();
	emit(ctx, data, len);
	if (also)
		fuzz_bytes_add(also, data, len);
	free(data);
}

void fuzz_target_seeds(fuzz_emit_fn emit, void *ctx)
{
	struct frame_writer w;
	struct fuzz_bytes two = { 0 };
	msgpack_packer *pk;

	frame_writer_init(&w);
	pk = frame_writer_packer(&w);

	msgpack_pack_map(pk, 5);
	frame_pack_kv_str(pk, "cmd", "pool.resize");
	frame_pack_kv_u64(pk, "id", 7);
	frame_pack_kv_u64(pk, "tokens", 4096);
	frame_pack_kv_bool(pk, "force", true);
	frame_pack_kv_u64(pk, "timeout_ms", 1000);
	emit_writer(&w, emit, ctx, &two);

	msgpack_pack_map(pk, 4);
	frame_pack_kv_str(pk, "cmd", "fault.load");
	frame_pack_kv_u64(pk, "count", 10);
	frame_pack_kv_u64(pk, "tokens", 100);
	frame_pack_kv_u64(pk, "hold_ms", 5);
	emit_writer(&w, emit, ctx, &two);
	emit(ctx, two.p, two.n);      /* two frames in one stream */

	msgpack_pack_map(pk, 11);
	frame_pack_kv_bool(pk, "b", true);
	frame_pack_kv_u64(pk, "u", UINT64_MAX);
	frame_pack_kv_u64(pk, "ur", 100);
	frame_pack_kv_i64(pk, "i", INT64_MIN);
	frame_pack_kv_double(pk, "d", -0.5);
	frame_pack_kv_str(pk, "s", "abcdefg");
	frame_pack_kv_str(pk, "cmd", "status");
	frame_pack_str(pk, "m");
	msgpack_pack_map(pk, 1);
	frame_pack_str(pk, "k");
	msgpack_pack_array(pk, 2);
	msgpack_pack_nil(pk);
	msgpack_pack_float(pk, 1.25f);
	frame_pack_str(pk, "a");
	msgpack_pack_array(pk, 3);
	msgpack_pack_bin(pk, 3);
	msgpack_pack_bin_body(pk, "\x00\x01\x02", 3);
	msgpack_pack_ext(pk, 2, 1);
	msgpack_pack_ext_body(pk, "\xff\xfe", 2);
	msgpack_pack_int8(pk, -3);
	frame_pack_str(pk, "x");
	msgpack_pack_false(pk);
	frame_pack_kv_u64(pk, "id", 1);
	emit_writer(&w, emit, ctx, NULL);

	/* not a map; deep nesting; a header claiming too much */
	msgpack_pack_array(pk, 2);
	msgpack_pack_uint8(pk, 1);
	msgpack_pack_uint8(pk, 2);
	emit_writer(&w, emit, ctx, NULL);
	msgpack_pack_map(pk, 1);
	frame_pack_str(pk, "m");
	for (int i = 0; i < FRAME_DEPTH_MAX + 1; i++)
		msgpack_pack_array(pk, 1);
	msgpack_pack_nil(pk);
	emit_writer(&w, emit, ctx, NULL);
	static const uint8_t big[] = { 0x00, 0x00, 0x10, 0x01, 0x80 };

	emit(ctx, big, sizeof(big));
	/* regression: KNOWN BUG depth-enomem, {"m": [[...[{}]...]]} */
	msgpack_pack_map(pk, 1);
	frame_pack_str(pk, "m");
	for (int i = 0; i < FRAME_DEPTH_MAX - 1; i++)
		msgpack_pack_array(pk, 1);
	msgpack_pack_map(pk, 0);
	emit_writer(&w, emit, ctx, NULL);
	/* regressions: empty strings with a NULL pointer, {"": 1} (fixed in
	 * ad31dee) and {1: ""} (KNOWN BUG empty-str-null) */
	static const uint8_t empty_key[] = { 0, 0, 0, 3, 0x81, 0xa0, 0x01 };
	static const uint8_t empty_val[] = { 0, 0, 0, 3, 0x81, 0x01, 0xa0 };

	emit(ctx, empty_key, sizeof(empty_key));
	emit(ctx, empty_val, sizeof(empty_val));
	frame_writer_deinit(&w);
	free(two.p);
}
