/* proto_schema.h - the field tables of the client and peer frame readers.
 *
 * Each message type of net/wire/proto_client.c and net/wire/proto_peer.c describes
 * its fields once, in a table of struct proto_field (key, type, where the
 * value goes, required, bounds); proto_schema_read() walks a msgpack map
 * against that table. Pure: no state, no sockets.
 *
 * Semantics (the wire contract of PROTOCOL.md, which these readers have
 * always had; the admin plane's frame_map_parse is stricter):
 *  - fields are read in table order, the first problem is the error;
 *  - a key absent or nil is not there: FRAME_E_MISSING when required,
 *    else the output is left untouched (its default stays) - except for a
 *    field with keep_nil, whose reader sees the nil;
 *  - keys the table does not name are ignored; a key given twice is read
 *    from its first occurrence.
 *
 * Errors: 0; a positive FRAME_E_* with err (may be NULL) naming the key
 * and saying what is wrong in a sentence; -ENOMEM. `out` may be partly
 * written on error (arrays allocated so far stay for the caller's deinit).
 *
 * Thread safety: none needed.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "conf/util.h"
#include "net/wire/frame.h"

struct proto_field;

/* A reader for what the built-in types do not cover: `o` is the value
 * (never NULL; nil only with keep_nil), `out` the whole output struct. */
typedef int (*proto_field_read_fn)(const msgpack_object *o,
				   const struct proto_field *f, void *out,
				   struct frame_error *err);
/* Its writer: pack key and value from the whole input struct `in`. */
typedef void (*proto_field_write_fn)(msgpack_packer *pk,
				     const struct proto_field *f,
				     const void *in);

enum proto_field_type {
	PROTO_F_U32,        /* uint32_t in [min, max] (max <= UINT32_MAX) */
	PROTO_F_U64,        /* uint64_t in [min, max] */
	PROTO_F_FLOAT,      /* float; the number in [lo, hi], and above lo
			     * once narrowed to float when lo_open */
	PROTO_F_BOOL,       /* bool */
	PROTO_F_STR,        /* char[size], NUL-terminated, no NUL inside */
	PROTO_F_U32_ARRAY,  /* uint32_t * (malloc'd) at offset, its count
			     * (uint32_t) at count_offset: 1..max entries */
	PROTO_F_CUSTOM,     /* read(o, f, out, err), write(pk, f, in) */
};

struct proto_field {
	const char *key;
	enum proto_field_type type;
	bool required;
	bool keep_nil;             /* nil is a value for read(), not absence */
	bool lo_open;              /* PROTO_F_FLOAT: (lo, hi] as a float */
	size_t offset;             /* of the value in the output struct */
	size_t count_offset;       /* PROTO_F_U32_ARRAY: of the count */
	size_t size;               /* PROTO_F_STR: buffer bytes, NUL included */
	uint64_t min, max;         /* integers; arrays: max entries */
	double lo, hi;             /* PROTO_F_FLOAT */
	proto_field_read_fn read;  /* PROTO_F_CUSTOM */
	proto_field_write_fn write;/* PROTO_F_CUSTOM */
	/* writing: the field is packed only when this says so (NULL:
	 * always); reading knows no such thing, absence is absence */
	bool (*present)(const void *in);
};

/* Table rows. T is the output struct, m a member designator in it. */
#define PROTO_FIELD_U32(T, k, req, m, mn, mx) \
	{ .key = k, .type = PROTO_F_U32, .required = req, \
	  .offset = offsetof(T, m), .min = mn, .max = mx }
#define PROTO_FIELD_U64(T, k, req, m, mn, mx) \
	{ .key = k, .type = PROTO_F_U64, .required = req, \
	  .offset = offsetof(T, m), .min = mn, .max = mx }
#define PROTO_FIELD_FLOAT(T, k, req, m, l, h, open) \
	{ .key = k, .type = PROTO_F_FLOAT, .required = req, \
	  .offset = offsetof(T, m), .lo = l, .hi = h, .lo_open = open }
#define PROTO_FIELD_BOOL(T, k, req, m) \
	{ .key = k, .type = PROTO_F_BOOL, .required = req, \
	  .offset = offsetof(T, m) }
#define PROTO_FIELD_STR(T, k, req, m) \
	{ .key = k, .type = PROTO_F_STR, .required = req, \
	  .offset = offsetof(T, m), .size = sizeof(((T *)0)->m) }
#define PROTO_FIELD_U32_ARRAY(T, k, req, m, count, max_n) \
	{ .key = k, .type = PROTO_F_U32_ARRAY, .required = req, \
	  .offset = offsetof(T, m), .count_offset = offsetof(T, count), \
	  .max = max_n }
#define PROTO_FIELD_CUSTOM(T, k, req, m, rd, wr) \
	{ .key = k, .type = PROTO_F_CUSTOM, .required = req, \
	  .offset = offsetof(T, m), .size = sizeof(((T *)0)->m), \
	  .read = rd, .write = wr }

/* A table and its length, for the calls below. */
#define PROTO_FIELDS(table) (table), KVD_ARRAY_SIZE(table)

/* Read map's fields[0..n) into out (see the semantics above). */
int proto_schema_read(const msgpack_object *map,
		      const struct proto_field *fields, size_t n, void *out,
		      struct frame_error *err);

/* One field written out as on a command line: the field `key` of
 * fields[0..n) from text, with the bounds the msgpack reader takes it
 * with (kvd_parse_u64 for U32 and U64, kvd_parse_double for FLOAT,
 * kvd_parse_u32_list "1,2,3" for U32_ARRAY, which replaces and frees the
 * array there). 0; FRAME_E_RANGE with err->msg saying what the value must
 * be ("not an integer in 1..1048576"), which the caller prints after the
 * option and the value; FRAME_E_TYPE for a type not read from text,
 * FRAME_E_UNKNOWN for a key not in the table; -ENOMEM. */
int proto_schema_read_text(const struct proto_field *fields, size_t n,
			   const char *key, const char *text, void *out,
			   struct frame_error *err);

/* The other direction, for messages whose writer is their table: how
 * many map entries proto_schema_write() packs for `in`, and the packing
 * (key, value; in table order; STR as the bytes before the first NUL,
 * at most size - 1). The caller packs the map header and any keys of
 * its own (type, id) first. */
uint32_t proto_schema_count(const struct proto_field *fields, size_t n,
			    const void *in);
void proto_schema_write(msgpack_packer *pk, const struct proto_field *fields,
			size_t n, const void *in);

/* Fill err (may be NULL): code, key, a printf sentence; returns code. */
int proto_schema_fail(struct frame_error *err, int code, const char *key,
		      const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* A string value into buf[size] with the schema's own errors (for custom
 * readers that read a string first). */
int proto_schema_str(const msgpack_object *o, const char *key, char *buf,
		     size_t size, struct frame_error *err);

/* map["type"] equals `type`. */
bool proto_schema_type_is(const msgpack_object *map, const char *type);
