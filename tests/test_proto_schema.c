/* test_proto_schema.c - the field-table reader and writer behind the client
 * and peer frames (net/wire/proto_schema.h): each built-in type, wrong types,
 * missing and nil keys, bounds, unknown and duplicate keys, table order of
 * errors, custom fields, and writing back what was read.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conf/util.h"
#include "net/wire/frame.h"
#include "net/wire/proto_schema.h"

struct rec {
	uint32_t small;      /* required, [1, 10] */
	uint64_t big;        /* optional */
	float ratio;         /* optional, (0, 1] as a float */
	bool on;             /* optional */
	char name[8];        /* optional, up to 7 bytes */
	uint32_t *ids;       /* (n_ids), optional, 1..3 entries */
	uint32_t n_ids;
	int tag;             /* custom, keep_nil: nil reads as -1 */
	int tag_calls;
};

static int read_tag(const msgpack_object *o, const struct proto_field *f,
		    void *out, struct frame_error *err)
{
	struct rec *r = out;

	r->tag_calls++;
	if (o->type == MSGPACK_OBJECT_NIL) {
		r->tag = -1;
		return 0;
	}
	if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER || o->via.u64 > 100)
		return proto_schema_fail(err, FRAME_E_RANGE, f->key,
					 "'%s' is no tag", f->key);
	r->tag = (int)o->via.u64;
	return 0;
}

static void write_tag(msgpack_packer *pk, const struct proto_field *f,
		      const void *in)
{
	frame_pack_kv_u64(pk, f->key, (uint64_t)((const struct rec *)in)->tag);
}

static bool has_tag(const void *in)
{
	return ((const struct rec *)in)->tag > 0;
}

static const struct proto_field rec_fields[] = {
	PROTO_FIELD_U32(struct rec, "small", true, small, 1, 10),
	PROTO_FIELD_U64(struct rec, "big", false, big, 0, UINT64_MAX),
	PROTO_FIELD_FLOAT(struct rec, "ratio", false, ratio, 0.0, 1.0, true),
	PROTO_FIELD_BOOL(struct rec, "on", false, on),
	PROTO_FIELD_STR(struct rec, "name", false, name),
	PROTO_FIELD_U32_ARRAY(struct rec, "ids", false, ids, n_ids, 3),
	{ .key = "tag", .type = PROTO_F_CUSTOM, .keep_nil = true,
	  .offset = offsetof(struct rec, tag), .read = read_tag,
	  .write = write_tag, .present = has_tag },
};

/* ---- building maps ------------------------------------------------------ */

/* A map from a spec: "k=u:5", "k=i:-1", "k=d:0.5", "k=s:text", "k=b:1",
 * "k=nil", "k=a:1,2,3" (u32 array), "k=a:" (empty), "k=m" (empty map). */
static void pack_value(msgpack_packer *pk, const char *v)
{
	if (!strcmp(v, "nil")) {
		msgpack_pack_nil(pk);
	} else if (!strncmp(v, "u:", 2)) {
		msgpack_pack_uint64(pk, strtoull(v + 2, NULL, 0));
	} else if (!strncmp(v, "i:", 2)) {
		msgpack_pack_int64(pk, strtoll(v + 2, NULL, 0));
	} else if (!strncmp(v, "d:", 2)) {
		msgpack_pack_double(pk, strtod(v + 2, NULL));
	} else if (!strncmp(v, "s:", 2)) {
		frame_pack_str(pk, v + 2);
	} else if (!strncmp(v, "b:", 2)) {
		if (v[2] == '1')
			msgpack_pack_true(pk);
		else
			msgpack_pack_false(pk);
	} else if (!strncmp(v, "a:", 2)) {
		uint32_t n = 0;
		const char *p = v + 2;

		for (const char *q = p; *q; q++)
			n += *q == ',';
		n += *p != 0;
		msgpack_pack_array(pk, n);
		while (*p) {
			char *end;

			msgpack_pack_uint64(pk, strtoull(p, &end, 0));
			p = *end ? end + 1 : end;
		}
	} else {
		msgpack_pack_map(pk, 0);
	}
}

struct built {
	char *buf;
	msgpack_unpacked msg;
	const msgpack_object *map;
};

static void build(struct built *b, const char *const *kv, size_t n)
{
	struct frame_writer w;
	msgpack_packer *pk;
	size_t len;

	frame_writer_init(&w);
	pk = frame_writer_packer(&w);
	msgpack_pack_map(pk, (uint32_t)n);
	for (size_t i = 0; i < n; i++) {
		char key[32];
		const char *eq = strchr(kv[i], '=');

		ck_assert_ptr_nonnull(eq);
		snprintf(key, sizeof(key), "%.*s", (int)(eq - kv[i]), kv[i]);
		frame_pack_str(pk, key);
		pack_value(pk, eq + 1);
	}
	ck_assert_int_eq(frame_writer_finish(&w, FRAME_MAX_DEFAULT, &b->buf, &len), 0);
	frame_writer_deinit(&w);
	msgpack_unpacked_init(&b->msg);
	ck_assert_int_eq(frame_decode((const uint8_t *)b->buf, len,
				      FRAME_MAX_DEFAULT, &b->msg, &b->map), 0);
}

static void built_free(struct built *b)
{
	msgpack_unpacked_destroy(&b->msg);
	free(b->buf);
}

/* Read the map of `kv` into *r (zeroed first, ratio 1 as default). */
static int read_kv(struct rec *r, struct frame_error *err,
		   const char *const *kv, size_t n)
{
	struct built b;
	int ret;

	memset(r, 0, sizeof(*r));
	r->ratio = 1.0f;
	memset(err, 0, sizeof(*err));
	build(&b, kv, n);
	ret = proto_schema_read(b.map, rec_fields, KVD_ARRAY_SIZE(rec_fields),
				r, err);
	built_free(&b);
	return ret;
}

#define READ(r, err, ...) \
	read_kv(r, err, (const char *const[]){ __VA_ARGS__ }, \
		KVD_ARRAY_SIZE(((const char *const[]){ __VA_ARGS__ })))

/* ---- reading ------------------------------------------------------------ */

START_TEST(test_read_all_types)
{
	struct rec r;
	struct frame_error err;

	ck_assert_int_eq(READ(&r, &err, "small=u:7", "big=u:18446744073709551615",
			      "ratio=d:0.25", "on=b:1", "name=s:abc",
			      "ids=a:1,2,4294967295", "tag=u:9"), 0);
	ck_assert_uint_eq(r.small, 7);
	ck_assert_uint_eq(r.big, UINT64_MAX);
	ck_assert_float_eq(r.ratio, 0.25f);
	ck_assert(r.on);
	ck_assert_str_eq(r.name, "abc");
	ck_assert_uint_eq(r.n_ids, 3);
	ck_assert_uint_eq(r.ids[2], UINT32_MAX);
	ck_assert_int_eq(r.tag, 9);
	free(r.ids);
	/* integers are numbers too */
	ck_assert_int_eq(READ(&r, &err, "small=u:1", "ratio=u:1"), 0);
	ck_assert_float_eq(r.ratio, 1.0f);
}
END_TEST

/* Refusals: the map, then the code, the key and (when given) the exact
 * sentence. Every sentence names its key. */
static const struct refusal {
	const char *kv[3];
	int code;
	const char *key;
	const char *msg;
} refusals[] = {
	/* missing; nil is absence, so a required nil is missing */
	{ { "big=u:1" }, FRAME_E_MISSING, "small", "missing key 'small'" },
	{ { "small=nil" }, FRAME_E_MISSING, "small", NULL },
	/* wrong types */
	{ { "small=s:7" }, FRAME_E_TYPE, "small",
	  "'small' must be an unsigned integer" },
	{ { "small=u:1", "big=d:1.0" }, FRAME_E_TYPE, "big", NULL },
	{ { "small=u:1", "ratio=s:x" }, FRAME_E_TYPE, "ratio",
	  "'ratio' must be a number" },
	{ { "small=u:1", "on=u:1" }, FRAME_E_TYPE, "on",
	  "'on' must be a boolean" },
	{ { "small=u:1", "name=u:1" }, FRAME_E_TYPE, "name",
	  "'name' must be a string" },
	{ { "small=u:1", "ids=u:1" }, FRAME_E_TYPE, "ids",
	  "'ids' must be an array" },
	{ { "small=u:1", "ids=m" }, FRAME_E_TYPE, "ids", NULL },
	/* bounds; a negative integer is out of range, not of a wrong type */
	{ { "small=u:11" }, FRAME_E_RANGE, "small",
	  "'small'=11 is outside [1, 10]" },
	{ { "small=u:0" }, FRAME_E_RANGE, "small", NULL },
	{ { "small=i:-1" }, FRAME_E_RANGE, "small", NULL },
	{ { "small=u:1", "ratio=d:1.5" }, FRAME_E_RANGE, "ratio",
	  "'ratio'=1.5 is outside [0, 1]" },
	{ { "small=u:1", "ratio=d:-0.5" }, FRAME_E_RANGE, "ratio", NULL },
	{ { "small=u:1", "ratio=d:nan" }, FRAME_E_RANGE, "ratio", NULL },
	/* (0, 1]: 0 is out, and so is what narrows to 0.0f */
	{ { "small=u:1", "ratio=d:0" }, FRAME_E_RANGE, "ratio",
	  "'ratio' must be in (0, 1]" },
	{ { "small=u:1", "ratio=d:1e-300" }, FRAME_E_RANGE, "ratio", NULL },
	{ { "small=u:1", "name=s:12345678" }, FRAME_E_RANGE, "name",
	  "'name' is longer than 7 bytes or holds a NUL" },
	{ { "small=u:1", "ids=a:" }, FRAME_E_RANGE, "ids",
	  "'ids' must hold 1..3 entries, not 0" },
	{ { "small=u:1", "ids=a:1,2,3,4" }, FRAME_E_RANGE, "ids", NULL },
	{ { "small=u:1", "ids=a:1,4294967296" }, FRAME_E_RANGE, "ids",
	  "'ids'[1] is not an integer in [0, 4294967296)" },
	{ { "small=u:1", "tag=u:101" }, FRAME_E_RANGE, "tag", "'tag' is no tag" },
	/* a key given twice is read from its first occurrence; a nil first
	 * occurrence is absence (the later one is not read) */
	{ { "small=s:bad", "small=u:3" }, FRAME_E_TYPE, "small", NULL },
	{ { "small=nil", "small=u:3" }, FRAME_E_MISSING, "small", NULL },
	/* the first wrong field of the table is the error, not of the map */
	{ { "name=u:1", "on=u:1", "small=u:1" }, FRAME_E_TYPE, "on", NULL },
	{ { "name=u:1", "on=b:0" }, FRAME_E_MISSING, "small", NULL },
};

START_TEST(test_read_refusals)
{
	const struct refusal *c = &refusals[_i];
	struct frame_error err;
	struct rec r;
	size_t n = 0;
	int ret;

	while (n < KVD_ARRAY_SIZE(c->kv) && c->kv[n])
		n++;
	ret = read_kv(&r, &err, c->kv, n);
	ck_assert_msg(ret == c->code, "case %d: %d, not %d", _i, ret, c->code);
	ck_assert_int_eq(err.code, c->code);
	ck_assert_str_eq(err.key, c->key);
	ck_assert_ptr_nonnull(strstr(err.msg, c->key));
	if (c->msg)
		ck_assert_str_eq(err.msg, c->msg);
	/* an array is stored only whole */
	ck_assert_ptr_null(r.ids);
}
END_TEST

START_TEST(test_read_absent_nil_unknown_duplicate)
{
	struct rec r;
	struct frame_error err;

	/* optional absent or nil: the default stays, nothing allocated */
	ck_assert_int_eq(READ(&r, &err, "small=u:2", "ratio=nil", "name=nil",
			      "ids=nil"), 0);
	ck_assert_float_eq(r.ratio, 1.0f);
	ck_assert_str_eq(r.name, "");
	ck_assert_ptr_null(r.ids);
	ck_assert_int_eq(r.tag_calls, 0);
	/* keep_nil: the reader sees the nil */
	ck_assert_int_eq(READ(&r, &err, "small=u:2", "tag=nil"), 0);
	ck_assert_int_eq(r.tag_calls, 1);
	ck_assert_int_eq(r.tag, -1);
	/* unknown keys are ignored, whatever they hold */
	ck_assert_int_eq(READ(&r, &err, "zzz=m", "small=u:3", "type=s:x"), 0);
	ck_assert_uint_eq(r.small, 3);
	/* a key given twice is read from its first occurrence */
	ck_assert_int_eq(READ(&r, &err, "small=u:3", "small=u:5"), 0);
	ck_assert_uint_eq(r.small, 3);
	ck_assert_int_eq(READ(&r, &err, "small=u:3", "small=s:bad"), 0);
	/* the longest string that fits */
	ck_assert_int_eq(READ(&r, &err, "small=u:1", "name=s:1234567"), 0);
	ck_assert_str_eq(r.name, "1234567");
}
END_TEST

/* Fields before the error are written; an array read before a later
 * error stays for the caller to free. */
START_TEST(test_read_partial)
{
	struct rec r;
	struct frame_error err;

	ck_assert_int_eq(READ(&r, &err, "small=u:4", "ids=a:5", "tag=s:x"),
			 FRAME_E_RANGE);
	ck_assert_str_eq(err.key, "tag");
	ck_assert_uint_eq(r.small, 4);
	ck_assert_uint_eq(r.n_ids, 1);
	free(r.ids);
}
END_TEST

START_TEST(test_read_not_a_map)
{
	msgpack_object o = { .type = MSGPACK_OBJECT_POSITIVE_INTEGER };
	struct frame_error err;
	struct rec r = { 0 };

	ck_assert_int_eq(proto_schema_read(&o, rec_fields,
					   KVD_ARRAY_SIZE(rec_fields), &r, &err),
			 FRAME_E_NOTMAP);
	/* no err to fill: the code alone */
	ck_assert_int_eq(proto_schema_read(NULL, rec_fields,
					   KVD_ARRAY_SIZE(rec_fields), &r, NULL),
			 FRAME_E_NOTMAP);
}
END_TEST

/* Text (command lines): the same bounds as the msgpack reader, every
 * value kvd_parse_u64 / kvd_parse_double / kvd_parse_u32_list refuses
 * refused, an array replaced (the old one freed: ASan, valgrind), and
 * the field left alone on error. */
START_TEST(test_read_text)
{
	static const struct { const char *key, *text; int want; } cases[] = {
		{ "small", "1", 0 }, { "small", "10", 0 }, { "small", "0", FRAME_E_RANGE },
		{ "small", "11", FRAME_E_RANGE }, { "small", "5x", FRAME_E_RANGE },
		{ "small", " 5", FRAME_E_RANGE }, { "small", "", FRAME_E_RANGE },
		{ "big", "18446744073709551615", 0 },
		{ "big", "18446744073709551616", FRAME_E_RANGE },
		{ "ratio", "1", 0 }, { "ratio", "0.5", 0 }, { "ratio", "0", FRAME_E_RANGE },
		{ "ratio", "1e-50", FRAME_E_RANGE }, { "ratio", "1.01", FRAME_E_RANGE },
		{ "ratio", "nan", FRAME_E_RANGE }, { "ratio", "-0.5", FRAME_E_RANGE },
		{ "ids", "1,2,3", 0 }, { "ids", "1,2,3,4", FRAME_E_RANGE },
		{ "ids", "1,2,", FRAME_E_RANGE }, { "ids", "4294967296", FRAME_E_RANGE },
		{ "name", "x", FRAME_E_TYPE }, { "nope", "1", FRAME_E_UNKNOWN },
	};
	struct frame_error err;
	struct rec r = { .small = 7 };

	for (size_t i = 0; i < KVD_ARRAY_SIZE(cases); i++) {
		uint32_t small = r.small;
		int got = proto_schema_read_text(PROTO_FIELDS(rec_fields), cases[i].key,
						 cases[i].text, &r, &err);

		ck_assert_msg(got == cases[i].want, "%s '%s': %d, want %d",
			      cases[i].key, cases[i].text, got, cases[i].want);
		if (got && !strcmp(cases[i].key, "small"))
			ck_assert_uint_eq(r.small, small);
	}
	ck_assert_uint_eq(r.small, 10);
	ck_assert_uint_eq(r.big, UINT64_MAX);
	ck_assert(r.ratio == 0.5f);
	ck_assert_uint_eq(r.n_ids, 3);
	ck_assert_int_eq(proto_schema_read_text(PROTO_FIELDS(rec_fields), "small",
						"0", &r, &err), FRAME_E_RANGE);
	ck_assert_str_eq(err.msg, "not an integer in 1..10");
	ck_assert_int_eq(proto_schema_read_text(PROTO_FIELDS(rec_fields), "ratio",
						"2", &r, &err), FRAME_E_RANGE);
	ck_assert_str_eq(err.msg, "not a number in (0, 1]");
	ck_assert_int_eq(proto_schema_read_text(PROTO_FIELDS(rec_fields), "ids",
						"9", &r, &err), 0);
	ck_assert_uint_eq(r.n_ids, 1);
	ck_assert_uint_eq(r.ids[0], 9);
	free(r.ids);
}
END_TEST

/* ---- writing ------------------------------------------------------------ */

START_TEST(test_write_roundtrip)
{
	uint32_t ids[] = { 3, 0, UINT32_MAX };
	struct rec in = { .small = 9, .big = 1ull << 40, .ratio = 0.5f,
			  .on = true, .name = "seven77", .ids = ids, .n_ids = 3,
			  .tag = 0 };
	struct rec out;
	struct frame_error err;
	struct frame_writer w;
	msgpack_packer *pk;
	msgpack_unpacked msg;
	const msgpack_object *map;
	size_t len;
	char *buf;

	for (int pass = 0; pass < 2; pass++) {
		in.tag = pass ? 42 : 0;   /* tag is written only when > 0 */
		ck_assert_uint_eq(proto_schema_count(rec_fields,
						     KVD_ARRAY_SIZE(rec_fields), &in),
				  6 + pass);
		frame_writer_init(&w);
		pk = frame_writer_packer(&w);
		msgpack_pack_map(pk, proto_schema_count(rec_fields,
							KVD_ARRAY_SIZE(rec_fields), &in));
		proto_schema_write(pk, rec_fields, KVD_ARRAY_SIZE(rec_fields), &in);
		ck_assert_int_eq(frame_writer_finish(&w, FRAME_MAX_DEFAULT, &buf,
						     &len), 0);
		frame_writer_deinit(&w);
		msgpack_unpacked_init(&msg);
		ck_assert_int_eq(frame_decode((const uint8_t *)buf, len,
					      FRAME_MAX_DEFAULT, &msg, &map), 0);
		ck_assert_uint_eq(map->via.map.size, 6 + pass);
		memset(&out, 0, sizeof(out));
		ck_assert_int_eq(proto_schema_read(map, rec_fields,
						   KVD_ARRAY_SIZE(rec_fields),
						   &out, &err), 0);
		ck_assert_uint_eq(out.small, 9);
		ck_assert_uint_eq(out.big, 1ull << 40);
		ck_assert_float_eq(out.ratio, 0.5f);
		ck_assert(out.on);
		ck_assert_str_eq(out.name, "seven77");
		ck_assert_uint_eq(out.n_ids, 3);
		ck_assert_mem_eq(out.ids, ids, sizeof(ids));
		ck_assert_int_eq(out.tag, pass ? 42 : 0);
		free(out.ids);
		msgpack_unpacked_destroy(&msg);
		free(buf);
	}
}
END_TEST

/* A string buffer without its NUL is written up to size - 1 bytes, never
 * past the buffer. */
START_TEST(test_write_unterminated_str)
{
	struct rec in = { .small = 1 };
	struct frame_writer w;
	msgpack_unpacked msg;
	const msgpack_object *map, *name;
	size_t len;
	char *buf;

	memset(in.name, 'z', sizeof(in.name));
	frame_writer_init(&w);
	msgpack_pack_map(frame_writer_packer(&w), 6);
	proto_schema_write(frame_writer_packer(&w), rec_fields,
			   KVD_ARRAY_SIZE(rec_fields), &in);
	ck_assert_int_eq(frame_writer_finish(&w, FRAME_MAX_DEFAULT, &buf, &len), 0);
	frame_writer_deinit(&w);
	msgpack_unpacked_init(&msg);
	/* ids is packed as an empty array: still one map */
	ck_assert_int_eq(frame_decode((const uint8_t *)buf, len,
				      FRAME_MAX_DEFAULT, &msg, &map), 0);
	name = frame_map_get(map, "name");
	ck_assert_ptr_nonnull(name);
	ck_assert_uint_eq(name->via.str.size, sizeof(in.name) - 1);
	msgpack_unpacked_destroy(&msg);
	free(buf);
}
END_TEST

static Suite *schema_suite(void)
{
	Suite *s = suite_create("proto_schema");
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, test_read_all_types);
	tcase_add_loop_test(tc, test_read_refusals, 0,
			    (int)KVD_ARRAY_SIZE(refusals));
	tcase_add_test(tc, test_read_absent_nil_unknown_duplicate);
	tcase_add_test(tc, test_read_partial);
	tcase_add_test(tc, test_read_not_a_map);
	tcase_add_test(tc, test_read_text);
	tcase_add_test(tc, test_write_roundtrip);
	tcase_add_test(tc, test_write_unterminated_str);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(schema_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
