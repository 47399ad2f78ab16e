/* proto_schema.c - one reader for every client and peer message.
 *
 * Design. Client requests come from untrusted tenants and peer frames
 * from nodes that may be buggy or mismatched, so every field is read
 * through one typed, range-checked path: the table says what a field is,
 * this file is the only code that turns a msgpack value into it. A new
 * message is a new table, not new parsing code, and every refusal has
 * the same shape: a FRAME_E_* code, the key, and a sentence the server
 * can send back as it is (INVALID_REQUEST) or log (peer protocol error).
 *
 * The table is walked, not the map: each key is looked up (first
 * occurrence), so unknown keys cost nothing and the first error is the
 * first field of the table that is wrong, whatever order the sender chose.
 * Bounds come before allocation: an array's count is judged before
 * anything is allocated for it.
 */
#include "net/wire/proto_schema.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int proto_schema_fail(struct frame_error *err, int code, const char *key,
		      const char *fmt, ...)
{
	va_list ap;

	if (err) {
		err->code = code;
		snprintf(err->key, sizeof(err->key), "%s", key ? key : "");
		va_start(ap, fmt);
		vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
		va_end(ap);
	}
	return code;
}

bool proto_schema_type_is(const msgpack_object *map, const char *type)
{
	return frame_obj_streq(frame_map_get(map, "type"), type);
}

int proto_schema_str(const msgpack_object *o, const char *key, char *buf,
		     size_t size, struct frame_error *err)
{
	int r = frame_obj_str(o, buf, size);

	if (r == FRAME_E_TYPE)
		return proto_schema_fail(err, r, key, "'%s' must be a string",
					 key);
	if (r)
		return proto_schema_fail(err, r, key,
					 "'%s' is longer than %zu bytes or holds a NUL",
					 key, size - 1);
	return 0;
}

/* ---- the built-in types --------------------------------------------------- */

/* The bounds, judged the same for a msgpack value and for text. */
static bool uint_in_range(const struct proto_field *f, uint64_t v)
{
	return v >= f->min && v <= f->max;
}

/* x as the consumer will see it: with lo_open, a tiny positive double
 * that narrows to lo (0.0f: "nucleus off" for top_p) is out. */
static bool float_in_range(const struct proto_field *f, double x)
{
	return isfinite(x) && x >= f->lo && x <= f->hi &&
	       !(f->lo_open && (float)x <= (float)f->lo);
}

static int read_uint(const msgpack_object *o, const struct proto_field *f,
		     uint64_t *v, struct frame_error *err)
{
	int r = frame_obj_u64(o, v);

	if (r)
		return proto_schema_fail(err, r, f->key,
					 "'%s' must be an unsigned integer",
					 f->key);
	if (!uint_in_range(f, *v))
		return proto_schema_fail(err, FRAME_E_RANGE, f->key,
					 "'%s'=%llu is outside [%llu, %llu]",
					 f->key, (unsigned long long)*v,
					 (unsigned long long)f->min,
					 (unsigned long long)f->max);
	return 0;
}

static int read_float(const msgpack_object *o, const struct proto_field *f,
		      float *v, struct frame_error *err)
{
	double x;
	int r = frame_obj_double(o, &x);

	if (r)
		return proto_schema_fail(err, r, f->key, "'%s' must be a number",
					 f->key);
	if (!isfinite(x) || x < f->lo || x > f->hi)
		return proto_schema_fail(err, FRAME_E_RANGE, f->key,
					 "'%s'=%g is outside [%g, %g]", f->key,
					 x, f->lo, f->hi);
	if (!float_in_range(f, x))
		return proto_schema_fail(err, FRAME_E_RANGE, f->key,
					 "'%s' must be in (%g, %g]", f->key,
					 f->lo, f->hi);
	*v = (float)x;
	return 0;
}

/* 1..f->max u32 entries into a malloc'd array, stored only when all are
 * good (the count is judged before the allocation). */
static int read_u32_array(const msgpack_object *o, const struct proto_field *f,
			  char *out, struct frame_error *err)
{
	uint32_t n;
	uint32_t *a;

	if (o->type != MSGPACK_OBJECT_ARRAY)
		return proto_schema_fail(err, FRAME_E_TYPE, f->key,
					 "'%s' must be an array", f->key);
	n = o->via.array.size;
	if (n == 0 || n > f->max)
		return proto_schema_fail(err, FRAME_E_RANGE, f->key,
					 "'%s' must hold 1..%llu entries, not %u",
					 f->key, (unsigned long long)f->max, n);
	a = malloc(sizeof(*a) * n);
	if (!a)
		return -ENOMEM;
	for (uint32_t i = 0; i < n; i++) {
		uint64_t x;

		if (frame_obj_u64(&o->via.array.ptr[i], &x) || x > UINT32_MAX) {
			free(a);
			return proto_schema_fail(err, FRAME_E_RANGE, f->key,
						 "'%s'[%u] is not an integer in [0, %llu)",
						 f->key, i,
						 (unsigned long long)UINT32_MAX + 1);
		}
		a[i] = (uint32_t)x;
	}
	memcpy(out + f->offset, &a, sizeof(a));
	memcpy(out + f->count_offset, &n, sizeof(n));
	return 0;
}

static int read_value(const msgpack_object *o, const struct proto_field *f,
		      void *out, struct frame_error *err)
{
	char *dst = (char *)out + f->offset;
	uint64_t u;
	uint32_t u32;
	int r;

	switch (f->type) {
	case PROTO_F_U32:
		r = read_uint(o, f, &u, err);
		u32 = (uint32_t)u;
		if (!r)
			memcpy(dst, &u32, sizeof(u32));
		return r;
	case PROTO_F_U64:
		r = read_uint(o, f, &u, err);
		if (!r)
			memcpy(dst, &u, sizeof(u));
		return r;
	case PROTO_F_FLOAT:
		return read_float(o, f, (float *)dst, err);
	case PROTO_F_BOOL:
		if (frame_obj_bool(o, (bool *)dst))
			return proto_schema_fail(err, FRAME_E_TYPE, f->key,
						 "'%s' must be a boolean",
						 f->key);
		return 0;
	case PROTO_F_STR:
		return proto_schema_str(o, f->key, dst, f->size, err);
	case PROTO_F_U32_ARRAY:
		return read_u32_array(o, f, out, err);
	case PROTO_F_CUSTOM:
		return f->read(o, f, out, err);
	}
	return proto_schema_fail(err, FRAME_E_TYPE, f->key,
				 "'%s' has no reader", f->key);
}

/* ---- values written out (command lines) ------------------------------------ */

/* "1,2,3" into the array at f->offset and its count, replacing (and
 * freeing) the array there. */
static int text_u32_array(const struct proto_field *f, const char *text,
			  char *out, struct frame_error *err)
{
	uint32_t *a, *old;
	uint32_t n32;
	size_t n;
	int r = kvd_parse_u32_list(text, UINT32_MAX, &a, &n);

	if (r == -ENOMEM)
		return r;
	if (!r && n > f->max)
		free(a);
	if (r || n > f->max)
		return proto_schema_fail(err, FRAME_E_RANGE, f->key,
					 "not 1..%llu integers in 0..%u separated by commas",
					 (unsigned long long)f->max, UINT32_MAX);
	memcpy(&old, out + f->offset, sizeof(old));
	free(old);
	n32 = (uint32_t)n;
	memcpy(out + f->offset, &a, sizeof(a));
	memcpy(out + f->count_offset, &n32, sizeof(n32));
	return 0;
}

/* A number: kvd_parse_u64 or kvd_parse_double, then the field's bounds. */
static int text_number(const struct proto_field *f, const char *text,
		       char *dst, struct frame_error *err)
{
	uint64_t u;
	uint32_t u32;
	double x;
	float v;

	if (f->type == PROTO_F_FLOAT) {
		/* kvd_parse_double takes no sign: a field whose range goes
		 * below zero (the penalties) takes a leading '-' here, so a
		 * command line can give what a msgpack request can */
		bool neg = f->lo < 0 && text[0] == '-';

		if (kvd_parse_double(text + neg, &x) || !float_in_range(f, neg ? -x : x))
			return proto_schema_fail(err, FRAME_E_RANGE, f->key,
						 "not a number in %c%g, %g]",
						 f->lo_open ? '(' : '[', f->lo, f->hi);
		v = (float)(neg ? -x : x);
		memcpy(dst, &v, sizeof(v));
		return 0;
	}
	if (kvd_parse_u64(text, &u) || !uint_in_range(f, u))
		return proto_schema_fail(err, FRAME_E_RANGE, f->key,
					 "not an integer in %llu..%llu",
					 (unsigned long long)f->min,
					 (unsigned long long)f->max);
	u32 = (uint32_t)u;
	if (f->type == PROTO_F_U32)
		memcpy(dst, &u32, sizeof(u32));
	else
		memcpy(dst, &u, sizeof(u));
	return 0;
}

int proto_schema_read_text(const struct proto_field *fields, size_t n,
			   const char *key, const char *text, void *out,
			   struct frame_error *err)
{
	for (size_t i = 0; i < n; i++) {
		const struct proto_field *f = &fields[i];

		if (strcmp(f->key, key))
			continue;
		switch (f->type) {
		case PROTO_F_U32:
		case PROTO_F_U64:
		case PROTO_F_FLOAT:
			return text_number(f, text, (char *)out + f->offset, err);
		case PROTO_F_U32_ARRAY:
			return text_u32_array(f, text, out, err);
		default:
			return proto_schema_fail(err, FRAME_E_TYPE, key,
						 "'%s' is not read from text", key);
		}
	}
	return proto_schema_fail(err, FRAME_E_UNKNOWN, key, "no field '%s'", key);
}

/* ---- the walk ------------------------------------------------------------- */

int proto_schema_read(const msgpack_object *map,
		      const struct proto_field *fields, size_t n, void *out,
		      struct frame_error *err)
{
	if (!map || map->type != MSGPACK_OBJECT_MAP)
		return proto_schema_fail(err, FRAME_E_NOTMAP, "",
					 "frame is not a map");
	for (size_t i = 0; i < n; i++) {
		const struct proto_field *f = &fields[i];
		const msgpack_object *o = frame_map_get(map, f->key);
		int r;

		if (o && o->type == MSGPACK_OBJECT_NIL && !f->keep_nil)
			o = NULL;
		if (!o) {
			if (!f->required)
				continue;
			return proto_schema_fail(err, FRAME_E_MISSING, f->key,
						 "missing key '%s'", f->key);
		}
		r = read_value(o, f, out, err);
		if (r)
			return r;
	}
	return 0;
}

/* ---- writing ---------------------------------------------------------------- */

uint32_t proto_schema_count(const struct proto_field *fields, size_t n,
			    const void *in)
{
	uint32_t k = 0;

	for (size_t i = 0; i < n; i++)
		k += !fields[i].present || fields[i].present(in);
	return k;
}

/* Offsets are of real members of `in`: plain typed loads are aligned. */
static void write_value(msgpack_packer *pk, const struct proto_field *f,
			const void *in)
{
	const char *src = (const char *)in + f->offset;
	const uint32_t *a;
	uint32_t n;

	switch (f->type) {
	case PROTO_F_U32:
	case PROTO_F_U64:   /* one integer format on the wire */
		frame_pack_kv_u64(pk, f->key, f->type == PROTO_F_U32 ?
				  *(const uint32_t *)src : *(const uint64_t *)src);
		break;
	case PROTO_F_FLOAT:
		frame_pack_kv_double(pk, f->key, *(const float *)src);
		break;
	case PROTO_F_BOOL:
		frame_pack_kv_bool(pk, f->key, *(const bool *)src);
		break;
	case PROTO_F_STR:
		n = (uint32_t)strnlen(src, f->size - 1);
		frame_pack_str(pk, f->key);
		msgpack_pack_str(pk, n);
		msgpack_pack_str_body(pk, src, n);
		break;
	case PROTO_F_U32_ARRAY:
		a = *(const uint32_t *const *)src;
		n = *(const uint32_t *)((const char *)in + f->count_offset);
		frame_pack_str(pk, f->key);
		msgpack_pack_array(pk, n);
		for (uint32_t i = 0; i < n; i++)
			msgpack_pack_uint32(pk, a[i]);
		break;
	case PROTO_F_CUSTOM:
		f->write(pk, f, in);
		break;
	}
}

void proto_schema_write(msgpack_packer *pk, const struct proto_field *fields,
			size_t n, const void *in)
{
	for (size_t i = 0; i < n; i++)
		if (!fields[i].present || fields[i].present(in))
			write_value(pk, &fields[i], in);
}
