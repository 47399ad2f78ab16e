/* frame.c - length-prefixed msgpack frames.
 *
 * Design. Every byte that reaches kvd from a socket goes through this
 * decoder, so it is written for hostile input first:
 *
 *  - Buffers are bounded. A decoder holds at most FRAME_HEADER_BYTES + max
 *    bytes; feed() takes only what fits and says so, and a complete frame
 *    always fits, so the caller's "feed, then drain next()" loop always
 *    makes progress. The buffer grows on demand, so an idle connection
 *    costs nothing.
 *  - The length is judged before the payload arrives: a header declaring
 *    more than max is FRAME_E_TOOBIG at once, and the decoder stays broken
 *    (without a trusted length there is no way to find the next frame).
 *  - msgpack-c sizes arrays and maps from their declared counts *before*
 *    reading the elements, so five bytes declaring a 4-billion element
 *    array would make it ask for ~100 GB. frame_msgpack_check() walks the
 *    payload first, without a stack or an allocation: it keeps the number
 *    of objects still to read and refuses as soon as that exceeds the bytes
 *    left (every object takes at least one byte). Only payloads that pass
 *    reach msgpack_unpack_next(), whose allocations are then bounded by a
 *    small multiple of the payload size. The walk also refuses nesting
 *    deeper than msgpack-c's parser stack (FRAME_DEPTH_MAX), which
 *    msgpack-c itself reports as an out-of-memory error.
 *  - A bad payload (not msgpack, trailing bytes, not a map) consumes its
 *    frame and the stream goes on: one client's typo never costs it the
 *    connection.
 *
 * msgpack-c's unpacker points strings into the input, so the frame last
 * handed out stays in the buffer until the next feed()/next() call, which
 * first drops it ("consumed").
 */
#include "net/wire/frame.h"
#include "net/wire/names.h"
#include "conf/util.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

static const char *const frame_error_names[] = {
	[FRAME_E_AGAIN] = "again",
	[FRAME_E_TOOBIG] = "too_big",
	[FRAME_E_MALFORMED] = "malformed",
	[FRAME_E_NOTMAP] = "not_a_map",
	[FRAME_E_TRUNCATED] = "truncated",
	[FRAME_E_MISSING] = "missing_key",
	[FRAME_E_TYPE] = "wrong_type",
	[FRAME_E_RANGE] = "out_of_range",
	[FRAME_E_UNKNOWN] = "unknown_key",
	[FRAME_E_DUPLICATE] = "duplicate_key",
	[FRAME_E_AUTH] = "auth_failed",
};

const char *frame_strerror(int code)
{
	return NET_NAME(frame_error_names, code);
}

static uint32_t be32_load(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 |
	       (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static uint64_t be_load(const uint8_t *p, unsigned bytes)
{
	uint64_t v = 0;

	for (unsigned i = 0; i < bytes; i++)
		v = v << 8 | p[i];
	return v;
}

/* ---- the structural check ----------------------------------------------- */

/* Describe the object whose first byte is b: how many bytes of header
 * follow the type byte (`lenbytes` of them hold a big-endian length),
 * fixed payload bytes, and whether the length counts bytes (str/bin/ext),
 * objects (array) or pairs (map). */
struct mp_shape {
	uint8_t lenbytes;   /* 0, 1, 2 or 4 */
	uint8_t fixed;      /* payload bytes besides the counted ones */
	uint8_t kind;       /* 0 scalar/bytes, 1 array, 2 map */
	int32_t inline_len; /* length held in the type byte, or -1 */
};

static int mp_shape_of(uint8_t b, struct mp_shape *s)
{
	*s = (struct mp_shape){ .inline_len = -1 };
	if (b <= 0x7f || b >= 0xe0)
		return 0;                               /* fixint */
	if (b <= 0x8f) {
		s->kind = 2, s->inline_len = b & 0x0f;  /* fixmap */
		return 0;
	}
	if (b <= 0x9f) {
		s->kind = 1, s->inline_len = b & 0x0f;  /* fixarray */
		return 0;
	}
	if (b <= 0xbf) {
		s->inline_len = b & 0x1f;               /* fixstr */
		return 0;
	}
	switch (b) {
	case 0xc0: case 0xc2: case 0xc3:                /* nil, bools */
		return 0;
	case 0xc4: s->lenbytes = 1; return 0;           /* bin 8/16/32 */
	case 0xc5: s->lenbytes = 2; return 0;
	case 0xc6: s->lenbytes = 4; return 0;
	case 0xc7: s->lenbytes = 1, s->fixed = 1; return 0; /* ext + type */
	case 0xc8: s->lenbytes = 2, s->fixed = 1; return 0;
	case 0xc9: s->lenbytes = 4, s->fixed = 1; return 0;
	case 0xca: s->fixed = 4; return 0;              /* float32 */
	case 0xcb: s->fixed = 8; return 0;              /* float64 */
	case 0xcc: case 0xd0: s->fixed = 1; return 0;
	case 0xcd: case 0xd1: s->fixed = 2; return 0;
	case 0xce: case 0xd2: s->fixed = 4; return 0;
	case 0xcf: case 0xd3: s->fixed = 8; return 0;
	case 0xd4: s->fixed = 2; return 0;              /* fixext 1..16 */
	case 0xd5: s->fixed = 3; return 0;
	case 0xd6: s->fixed = 5; return 0;
	case 0xd7: s->fixed = 9; return 0;
	case 0xd8: s->fixed = 17; return 0;
	case 0xd9: s->lenbytes = 1; return 0;           /* str 8/16/32 */
	case 0xda: s->lenbytes = 2; return 0;
	case 0xdb: s->lenbytes = 4; return 0;
	case 0xdc: s->kind = 1, s->lenbytes = 2; return 0;
	case 0xdd: s->kind = 1, s->lenbytes = 4; return 0;
	case 0xde: s->kind = 2, s->lenbytes = 2; return 0;
	case 0xdf: s->kind = 2, s->lenbytes = 4; return 0;
	default:
		return FRAME_E_MALFORMED;               /* 0xc1: never used */
	}
}

int frame_msgpack_check(const uint8_t *p, size_t n)
{
	/* left[k]: objects still to read in the open container at depth k
	 * (k = 0 is the top level, which holds exactly one object) */
	uint64_t left[FRAME_DEPTH_MAX + 1];
	uint64_t pending = 1;   /* objects still to read, all levels */
	size_t pos = 0;
	int top = 0;

	left[0] = 1;
	while (pending > 0) {
		struct mp_shape s;
		uint64_t len, body, items;

		if (left[top] == 0) {
			top--;
			continue;
		}
		if (pos >= n || pending > n - pos)
			return FRAME_E_MALFORMED;
		if (mp_shape_of(p[pos], &s))
			return FRAME_E_MALFORMED;
		pending--;
		left[top]--;
		if (s.inline_len >= 0) {
			len = (uint64_t)s.inline_len;
		} else if (s.lenbytes) {
			if (n - pos - 1 < s.lenbytes)
				return FRAME_E_MALFORMED;
			len = be_load(p + pos + 1, s.lenbytes);
		} else {
			len = 0;
		}
		pos += 1u + s.lenbytes;
		body = s.fixed;
		items = 0;
		if (s.kind == 0)
			body += len;
		else
			items = s.kind == 2 ? 2 * len : len;
		if (body > n - pos)
			return FRAME_E_MALFORMED;
		pos += (size_t)body;
		/* msgpack-c nests at most FRAME_DEPTH_MAX containers, and an
		 * empty one innermost still takes a stack slot: deeper is
		 * malformed here, not ENOMEM there */
		if (s.kind != 0 && top == FRAME_DEPTH_MAX)
			return FRAME_E_MALFORMED;
		if (items) {
			left[++top] = items;
			pending += items;
		}
	}
	return pos == n ? 0 : FRAME_E_MALFORMED;
}

/* Unpack a payload that passed the check. */
static int frame_unpack(const uint8_t *p, size_t n, msgpack_unpacked *msg,
			const msgpack_object **out)
{
	size_t off = 0;
	int r;

	if (frame_msgpack_check(p, n))
		return FRAME_E_MALFORMED;
	msgpack_unpacked_destroy(msg);
	msgpack_unpacked_init(msg);
	r = msgpack_unpack_next(msg, (const char *)p, n, &off);
	if (r == MSGPACK_UNPACK_NOMEM_ERROR)
		return -ENOMEM;
	if (r != MSGPACK_UNPACK_SUCCESS || off != n)
		return FRAME_E_MALFORMED;
	if (msg->data.type != MSGPACK_OBJECT_MAP)
		return FRAME_E_NOTMAP;
	*out = &msg->data;
	return 0;
}

int frame_decode(const uint8_t *buf, size_t n, size_t max,
		 msgpack_unpacked *msg, const msgpack_object **out)
{
	uint32_t plen;

	if (n < FRAME_HEADER_BYTES)
		return FRAME_E_TRUNCATED;
	plen = be32_load(buf);
	if (plen > max)
		return FRAME_E_TOOBIG;
	if (n - FRAME_HEADER_BYTES < plen)
		return FRAME_E_TRUNCATED;
	if (n - FRAME_HEADER_BYTES > plen)
		return FRAME_E_MALFORMED;
	return frame_unpack(buf + FRAME_HEADER_BYTES, plen, msg, out);
}

/* ---- the incremental decoder -------------------------------------------- */

void frame_decoder_init(struct frame_decoder *d, size_t max)
{
	*d = (struct frame_decoder){
		.max = KVD_MIN(KVD_MAX(max, (size_t)1), (size_t)FRAME_MAX_LIMIT),
	};
	msgpack_unpacked_init(&d->msg);
}

void frame_decoder_set_max(struct frame_decoder *d, size_t max)
{
	d->max = KVD_MIN(KVD_MAX(max, (size_t)1), (size_t)FRAME_MAX_LIMIT);
}

void frame_decoder_deinit(struct frame_decoder *d)
{
	free(d->buf);
	d->buf = NULL;
	d->len = d->cap = d->consumed = 0;
	msgpack_unpacked_destroy(&d->msg);
	msgpack_unpacked_init(&d->msg);
}

/* Drop the frame last handed out (and its objects). */
static void frame_decoder_drop(struct frame_decoder *d)
{
	if (!d->consumed)
		return;
	msgpack_unpacked_destroy(&d->msg);
	msgpack_unpacked_init(&d->msg);
	memmove(d->buf, d->buf + d->consumed, d->len - d->consumed);
	d->len -= d->consumed;
	d->consumed = 0;
}

int frame_decoder_feed(struct frame_decoder *d, const void *data, size_t n,
		       size_t *used)
{
	size_t limit = FRAME_HEADER_BYTES + d->max;
	size_t take;

	frame_decoder_drop(d);
	*used = 0;
	take = KVD_MIN(n, limit - d->len);
	if (take == 0)
		return 0;
	if (d->len + take > d->cap) {
		size_t cap = KVD_MAX(d->cap * 2, (size_t)256);
		uint8_t *nb;

		cap = KVD_MIN(KVD_MAX(cap, d->len + take), limit);
		nb = realloc(d->buf, cap);
		if (!nb)
			return -ENOMEM;
		d->buf = nb;
		d->cap = cap;
	}
	memcpy(d->buf + d->len, data, take);
	d->len += take;
	*used = take;
	return 0;
}

int frame_decoder_next(struct frame_decoder *d, const msgpack_object **out)
{
	uint32_t plen;
	int r;

	frame_decoder_drop(d);
	*out = NULL;
	if (d->broken)
		return d->broken_code ? d->broken_code : FRAME_E_TOOBIG;
	if (d->len < FRAME_HEADER_BYTES)
		return FRAME_E_AGAIN;
	plen = be32_load(d->buf);
	if (plen > d->max) {
		d->broken = true;
		return FRAME_E_TOOBIG;
	}
	if (d->len - FRAME_HEADER_BYTES < plen)
		return FRAME_E_AGAIN;
	d->consumed = FRAME_HEADER_BYTES + (size_t)plen;
	if (d->open) {
		size_t pn = 0;

		if (d->open(d->open_arg, d->buf + FRAME_HEADER_BYTES, plen, &pn) ||
		    pn > plen) {
			d->broken = true;
			d->broken_code = FRAME_E_AUTH;
			return FRAME_E_AUTH;
		}
		plen = (uint32_t)pn;
	}
	r = frame_unpack(d->buf + FRAME_HEADER_BYTES, plen, &d->msg, out);
	if (r)
		*out = NULL;
	return r;
}

void frame_decoder_set_opener(struct frame_decoder *d,
			      int (*open)(void *arg, uint8_t *payload, size_t n,
					  size_t *plain_n),
			      void *arg)
{
	d->open = open;
	d->open_arg = arg;
}

int frame_decoder_finish(const struct frame_decoder *d)
{
	return frame_decoder_pending(d) ? FRAME_E_TRUNCATED : 0;
}

size_t frame_decoder_pending(const struct frame_decoder *d)
{
	return d->len - d->consumed;
}

/* ---- the writer --------------------------------------------------------- */

static int frame_writer_write(void *data, const char *buf, size_t len)
{
	struct frame_writer *w = data;

	if (w->err)
		return -1;
	if (len > w->cap - w->len) {
		size_t cap = KVD_MAX(w->cap * 2, (size_t)256);
		char *nb;

		while (cap - w->len < len) {
			if (kvd_mul_size(cap, 2, &cap)) {
				w->err = -ENOMEM;
				return -1;
			}
		}
		nb = realloc(w->buf, cap);
		if (!nb) {
			w->err = -ENOMEM;
			return -1;
		}
		w->buf = nb;
		w->cap = cap;
	}
	memcpy(w->buf + w->len, buf, len);
	w->len += len;
	return 0;
}

static void frame_writer_reset(struct frame_writer *w)
{
	static const char zero[FRAME_HEADER_BYTES];

	w->len = 0;
	w->err = 0;
	msgpack_packer_init(&w->pk, w, frame_writer_write);
	frame_writer_write(w, zero, sizeof(zero));
}

void frame_writer_append(struct frame_writer *w, const void *data, size_t len)
{
	frame_writer_write(w, data, len);
}

void frame_writer_clear(struct frame_writer *w)
{
	frame_writer_reset(w);
}

void frame_writer_init(struct frame_writer *w)
{
	*w = (struct frame_writer){ 0 };
	frame_writer_reset(w);
}

void frame_writer_deinit(struct frame_writer *w)
{
	free(w->buf);
	w->buf = NULL;
	w->len = w->cap = 0;
}

int frame_writer_finish(struct frame_writer *w, size_t max, char **data,
			size_t *len)
{
	size_t plen;
	int r = w->err;

	*data = NULL;
	*len = 0;
	if (!r && w->len < FRAME_HEADER_BYTES)
		r = -ENOMEM;
	plen = w->len - FRAME_HEADER_BYTES;
	if (!r && (plen > max || plen > UINT32_MAX))
		r = FRAME_E_TOOBIG;
	if (r) {
		frame_writer_reset(w);
		return r;
	}
	w->buf[0] = (char)(plen >> 24);
	w->buf[1] = (char)(plen >> 16);
	w->buf[2] = (char)(plen >> 8);
	w->buf[3] = (char)plen;
	*data = w->buf;
	*len = w->len;
	w->buf = NULL;
	w->cap = 0;
	frame_writer_reset(w);
	return 0;
}

void frame_pack_str(msgpack_packer *pk, const char *s)
{
	size_t n = strlen(s);

	msgpack_pack_str(pk, n);
	msgpack_pack_str_body(pk, s, n);
}

void frame_pack_kv_str(msgpack_packer *pk, const char *k, const char *v)
{
	frame_pack_str(pk, k);
	frame_pack_str(pk, v);
}

void frame_pack_kv_u64(msgpack_packer *pk, const char *k, uint64_t v)
{
	frame_pack_str(pk, k);
	msgpack_pack_uint64(pk, v);
}

void frame_pack_kv_i64(msgpack_packer *pk, const char *k, int64_t v)
{
	frame_pack_str(pk, k);
	msgpack_pack_int64(pk, v);
}

void frame_pack_kv_bool(msgpack_packer *pk, const char *k, bool v)
{
	frame_pack_str(pk, k);
	if (v)
		msgpack_pack_true(pk);
	else
		msgpack_pack_false(pk);
}

void frame_pack_kv_double(msgpack_packer *pk, const char *k, double v)
{
	frame_pack_str(pk, k);
	msgpack_pack_double(pk, v);
}

/* ---- typed reads -------------------------------------------------------- */

bool frame_obj_streq(const msgpack_object *o, const char *s)
{
	size_t n = strlen(s);

	return o && o->type == MSGPACK_OBJECT_STR && o->via.str.size == n &&
	       memcmp(o->via.str.ptr, s, n) == 0;
}

const msgpack_object *frame_map_get(const msgpack_object *map, const char *key)
{
	if (!map || map->type != MSGPACK_OBJECT_MAP)
		return NULL;
	for (uint32_t i = 0; i < map->via.map.size; i++)
		if (frame_obj_streq(&map->via.map.ptr[i].key, key))
			return &map->via.map.ptr[i].val;
	return NULL;
}

int frame_obj_u64(const msgpack_object *o, uint64_t *v)
{
	if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
		*v = o->via.u64;
		return 0;
	}
	if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
		return FRAME_E_RANGE;
	return FRAME_E_TYPE;
}

int frame_obj_i64(const msgpack_object *o, int64_t *v)
{
	if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
		*v = o->via.i64;
		return 0;
	}
	if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
		if (o->via.u64 > INT64_MAX)
			return FRAME_E_RANGE;
		*v = (int64_t)o->via.u64;
		return 0;
	}
	return FRAME_E_TYPE;
}

int frame_obj_double(const msgpack_object *o, double *v)
{
	switch (o->type) {
	case MSGPACK_OBJECT_FLOAT32:
	case MSGPACK_OBJECT_FLOAT64:
		if (!isfinite(o->via.f64))
			return FRAME_E_RANGE;
		*v = o->via.f64;
		return 0;
	case MSGPACK_OBJECT_POSITIVE_INTEGER:
		*v = (double)o->via.u64;
		return 0;
	case MSGPACK_OBJECT_NEGATIVE_INTEGER:
		*v = (double)o->via.i64;
		return 0;
	default:
		return FRAME_E_TYPE;
	}
}

int frame_obj_bool(const msgpack_object *o, bool *v)
{
	if (o->type != MSGPACK_OBJECT_BOOLEAN)
		return FRAME_E_TYPE;
	*v = o->via.boolean;
	return 0;
}

int frame_obj_str(const msgpack_object *o, char *buf, size_t size)
{
	if (o->type != MSGPACK_OBJECT_STR)
		return FRAME_E_TYPE;
	if (size == 0 || o->via.str.size >= size)
		return FRAME_E_RANGE;
	/* msgpack-c leaves ptr NULL for an empty string */
	if (o->via.str.size == 0) {
		buf[0] = '\0';
		return 0;
	}
	if (memchr(o->via.str.ptr, '\0', o->via.str.size))
		return FRAME_E_RANGE;
	memcpy(buf, o->via.str.ptr, o->via.str.size);
	buf[o->via.str.size] = '\0';
	return 0;
}

/* ---- schemas ------------------------------------------------------------ */

static void frame_error_set(struct frame_error *err, int code,
			    const msgpack_object *key, const char *msg)
{
	size_t n = 0;

	if (!err)
		return;
	err->code = code;
	if (key && key->type == MSGPACK_OBJECT_STR) {
		n = KVD_MIN((size_t)key->via.str.size, sizeof(err->key) - 1);
		/* msgpack-c leaves ptr NULL for an empty string */
		if (n)
			memcpy(err->key, key->via.str.ptr, n);
		/* a key from the wire may hold anything: keep it printable */
		for (size_t i = 0; i < n; i++)
			if ((unsigned char)err->key[i] < 0x20 ||
			    (unsigned char)err->key[i] >= 0x7f)
				err->key[i] = '?';
	}
	err->key[n] = '\0';
	snprintf(err->msg, sizeof(err->msg), "%s", msg);
}

static int frame_field_store(const struct frame_field *f,
			     const msgpack_object *v, void *out,
			     struct frame_error *err, const msgpack_object *key)
{
	char *dst = (char *)out + f->offset;
	int r = 0;

	switch (f->type) {
	case FRAME_T_BOOL:
		r = frame_obj_bool(v, (bool *)dst);
		break;
	case FRAME_T_U64: {
		uint64_t u;

		r = frame_obj_u64(v, &u);
		if (!r && (f->min || f->max) && (u < f->min || u > f->max))
			r = FRAME_E_RANGE;
		if (!r)
			memcpy(dst, &u, sizeof(u));
		break;
	}
	case FRAME_T_I64:
		r = frame_obj_i64(v, (int64_t *)dst);
		break;
	case FRAME_T_DOUBLE:
		r = frame_obj_double(v, (double *)dst);
		break;
	case FRAME_T_STR:
		r = frame_obj_str(v, dst, f->size);
		break;
	case FRAME_T_MAP:
		if (v->type != MSGPACK_OBJECT_MAP)
			r = FRAME_E_TYPE;
		break;
	case FRAME_T_ARRAY:
		if (v->type != MSGPACK_OBJECT_ARRAY)
			r = FRAME_E_TYPE;
		break;
	case FRAME_T_ANY:
		break;
	}
	if (!r && (f->type == FRAME_T_MAP || f->type == FRAME_T_ARRAY ||
		   f->type == FRAME_T_ANY))
		memcpy(dst, &v, sizeof(v));
	if (r)
		frame_error_set(err, r, key,
				r == FRAME_E_TYPE ? "value has the wrong type"
						  : "value out of range");
	return r;
}

static bool frame_key_ignored(const msgpack_object *key,
			      const char *const *ignore)
{
	for (; ignore && *ignore; ignore++)
		if (frame_obj_streq(key, *ignore))
			return true;
	return false;
}

int frame_map_parse(const msgpack_object *map, const struct frame_field *fields,
		    size_t n, unsigned flags, const char *const *ignore,
		    void *out, uint64_t *present, struct frame_error *err)
{
	uint64_t seen = 0;
	int r;

	if (present)
		*present = 0;
	if (err)
		*err = (struct frame_error){ 0 };
	if (!map || map->type != MSGPACK_OBJECT_MAP) {
		frame_error_set(err, FRAME_E_NOTMAP, NULL, "not a map");
		return FRAME_E_NOTMAP;
	}
	if (n > FRAME_FIELDS_MAX) {
		frame_error_set(err, FRAME_E_RANGE, NULL, "schema too large");
		return FRAME_E_RANGE;
	}
	for (uint32_t i = 0; i < map->via.map.size; i++) {
		const msgpack_object *k = &map->via.map.ptr[i].key;
		const msgpack_object *v = &map->via.map.ptr[i].val;
		size_t j;

		for (j = 0; j < n; j++)
			if (frame_obj_streq(k, fields[j].name))
				break;
		if (j == n) {
			if (frame_key_ignored(k, ignore) ||
			    !(flags & FRAME_SCHEMA_STRICT))
				continue;
			frame_error_set(err, FRAME_E_UNKNOWN, k, "unknown key");
			return FRAME_E_UNKNOWN;
		}
		if (seen & (1ull << j)) {
			frame_error_set(err, FRAME_E_DUPLICATE, k,
					"key appears twice");
			return FRAME_E_DUPLICATE;
		}
		seen |= 1ull << j;
		r = frame_field_store(&fields[j], v, out, err, k);
		if (r)
			return r;
	}
	for (size_t j = 0; j < n; j++) {
		if (fields[j].required && !(seen & (1ull << j))) {
			msgpack_object k = {
				.type = MSGPACK_OBJECT_STR,
				.via.str = { .size = (uint32_t)strlen(fields[j].name),
					     .ptr = fields[j].name },
			};

			frame_error_set(err, FRAME_E_MISSING, &k,
					"required key missing");
			return FRAME_E_MISSING;
		}
	}
	if (present)
		*present = seen;
	return 0;
}
