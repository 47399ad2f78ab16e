/* test_frame.c - the msgpack frame codec: round trips, incremental feeding,
 * every typed error, schemas, and a seeded fuzz loop that must never crash.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "conf/util.h"
#include "net/wire/frame.h"

/* Build one frame holding {"cmd": cmd, "n": n, "flag": true, "x": 1.5}. */
static char *make_frame(const char *cmd, uint64_t n, size_t *len)
{
	struct frame_writer w;
	msgpack_packer *pk;
	char *data;

	frame_writer_init(&w);
	pk = frame_writer_packer(&w);
	msgpack_pack_map(pk, 4);
	frame_pack_kv_str(pk, "cmd", cmd);
	frame_pack_kv_u64(pk, "n", n);
	frame_pack_kv_bool(pk, "flag", true);
	frame_pack_kv_double(pk, "x", 1.5);
	ck_assert_int_eq(frame_writer_finish(&w, FRAME_MAX_DEFAULT, &data, len), 0);
	frame_writer_deinit(&w);
	return data;
}

/* A frame around raw payload bytes. */
static size_t raw_frame(uint8_t *out, const void *payload, uint32_t n)
{
	out[0] = (uint8_t)(n >> 24);
	out[1] = (uint8_t)(n >> 16);
	out[2] = (uint8_t)(n >> 8);
	out[3] = (uint8_t)n;
	memcpy(out + 4, payload, n);
	return 4 + (size_t)n;
}

struct args {
	char cmd[16];
	uint64_t n;
	bool flag;
	double x;
	const msgpack_object *extra;
};

static const struct frame_field args_schema[] = {
	{ "cmd", FRAME_T_STR, true, offsetof(struct args, cmd), 16, 0, 0 },
	{ "n", FRAME_T_U64, true, offsetof(struct args, n), 0, 1, 1000 },
	{ "flag", FRAME_T_BOOL, false, offsetof(struct args, flag), 0, 0, 0 },
	{ "x", FRAME_T_DOUBLE, false, offsetof(struct args, x), 0, 0, 0 },
	{ "extra", FRAME_T_MAP, false, offsetof(struct args, extra), 0, 0, 0 },
};

START_TEST(test_roundtrip)
{
	size_t len;
	char *f = make_frame("status", 42, &len);
	msgpack_unpacked msg;
	const msgpack_object *m;
	struct args a = { 0 };
	uint64_t present;
	struct frame_error err;

	ck_assert_uint_eq((uint8_t)f[0] << 24 | (uint8_t)f[1] << 16 |
			  (uint8_t)f[2] << 8 | (uint8_t)f[3], len - 4);
	msgpack_unpacked_init(&msg);
	ck_assert_int_eq(frame_decode((uint8_t *)f, len, 1024, &msg, &m), 0);
	ck_assert_int_eq(frame_map_parse(m, args_schema, 5, FRAME_SCHEMA_STRICT,
					 NULL, &a, &present, &err), 0);
	ck_assert_str_eq(a.cmd, "status");
	ck_assert_uint_eq(a.n, 42);
	ck_assert(a.flag);
	ck_assert(a.x == 1.5);
	ck_assert_uint_eq(present, 0xf);
	ck_assert(frame_obj_streq(frame_map_get(m, "cmd"), "status"));
	ck_assert_ptr_null(frame_map_get(m, "nope"));
	/* trailing byte after the frame, and a short buffer */
	ck_assert_int_eq(frame_decode((uint8_t *)f, len - 1, 1024, &msg, &m),
			 FRAME_E_TRUNCATED);
	ck_assert_int_eq(frame_decode((uint8_t *)f, len, 8, &msg, &m),
			 FRAME_E_TOOBIG);
	msgpack_unpacked_destroy(&msg);
	free(f);
}
END_TEST

START_TEST(test_incremental)
{
	/* Three frames in one stream, fed 1..7 bytes at a time. */
	uint8_t stream[512];
	size_t total = 0, len, off = 0;
	int got = 0;
	struct frame_decoder d;
	unsigned step = 1;

	for (int i = 0; i < 3; i++) {
		char *f = make_frame(i == 1 ? "drain" : "status", (uint64_t)i + 1, &len);

		memcpy(stream + total, f, len);
		total += len;
		free(f);
	}
	frame_decoder_init(&d, 1024);
	while (off < total) {
		size_t n = KVD_MIN(step, total - off), used;
		const msgpack_object *m;
		int r;

		ck_assert_int_eq(frame_decoder_feed(&d, stream + off, n, &used), 0);
		ck_assert_uint_eq(used, n);
		off += used;
		while ((r = frame_decoder_next(&d, &m)) == 0) {
			uint64_t v;

			ck_assert_int_eq(frame_obj_u64(frame_map_get(m, "n"), &v), 0);
			ck_assert_uint_eq(v, (uint64_t)got + 1);
			ck_assert(frame_obj_streq(frame_map_get(m, "cmd"),
						  got == 1 ? "drain" : "status"));
			got++;
		}
		ck_assert_int_eq(r, FRAME_E_AGAIN);
		step = step % 7 + 1;
	}
	ck_assert_int_eq(got, 3);
	ck_assert_int_eq(frame_decoder_finish(&d), 0);
	/* half a frame, then end of stream */
	{
		size_t used;
		const msgpack_object *m;

		frame_decoder_feed(&d, stream, 10, &used);
		ck_assert_int_eq(frame_decoder_next(&d, &m), FRAME_E_AGAIN);
		ck_assert_int_eq(frame_decoder_finish(&d), FRAME_E_TRUNCATED);
	}
	frame_decoder_deinit(&d);
	frame_decoder_deinit(&d);
}
END_TEST

START_TEST(test_toobig)
{
	struct frame_decoder d;
	const msgpack_object *m;
	uint8_t hdr[4] = { 0x7f, 0xff, 0xff, 0xff };
	size_t used;

	frame_decoder_init(&d, 1024);
	ck_assert_int_eq(frame_decoder_feed(&d, hdr, 4, &used), 0);
	ck_assert_int_eq(frame_decoder_next(&d, &m), FRAME_E_TOOBIG);
	ck_assert_ptr_null(m);
	/* broken for good */
	ck_assert_int_eq(frame_decoder_next(&d, &m), FRAME_E_TOOBIG);
	frame_decoder_deinit(&d);

	/* exactly max is accepted, max + 1 is not */
	{
		uint8_t buf[4 + 16];
		uint8_t payload[16];

		payload[0] = 0x81;
		payload[1] = 0xa1;
		payload[2] = 'k';
		payload[3] = 0xac;     /* str of 12 */
		memset(payload + 4, 'v', 12);
		frame_decoder_init(&d, 16);
		raw_frame(buf, payload, 16);
		frame_decoder_feed(&d, buf, sizeof(buf), &used);
		ck_assert_int_eq(frame_decoder_next(&d, &m), 0);
		frame_decoder_deinit(&d);
		frame_decoder_init(&d, 15);
		frame_decoder_feed(&d, buf, sizeof(buf), &used);
		ck_assert_uint_eq(used, 19);      /* bounded buffer: 4 + max */
		ck_assert_int_eq(frame_decoder_next(&d, &m), FRAME_E_TOOBIG);
		frame_decoder_deinit(&d);
	}
}
END_TEST

/* Bad payloads consume their frame; the next good frame still decodes. */
static void check_bad_then_good(const void *payload, uint32_t n, int want)
{
	uint8_t buf[4096];
	size_t len = raw_frame(buf, payload, n), flen, used;
	char *good = make_frame("status", 7, &flen);
	struct frame_decoder d;
	const msgpack_object *m;

	memcpy(buf + len, good, flen);
	free(good);
	frame_decoder_init(&d, 2048);
	ck_assert_int_eq(frame_decoder_feed(&d, buf, len + flen, &used), 0);
	ck_assert_int_eq(frame_decoder_next(&d, &m), want);
	ck_assert_int_eq(frame_decoder_next(&d, &m), 0);
	ck_assert(frame_obj_streq(frame_map_get(m, "cmd"), "status"));
	ck_assert_int_eq(frame_decoder_next(&d, &m), FRAME_E_AGAIN);
	frame_decoder_deinit(&d);
}

START_TEST(test_bad_payloads)
{
	static const uint8_t reserved[] = { 0xc1 };
	static const uint8_t array[] = { 0x92, 0x01, 0x02 };
	static const uint8_t trailing[] = { 0x80, 0x00 };
	static const uint8_t huge_array[] = { 0xdd, 0xff, 0xff, 0xff, 0xff };
	static const uint8_t huge_map[] = { 0x81, 0xa1, 'a', 0xdf, 0x7f, 0xff, 0xff, 0xff };
	static const uint8_t huge_str[] = { 0x81, 0xa1, 'a', 0xdb, 0xff, 0xff, 0xff, 0xf0 };
	static const uint8_t short_int[] = { 0x81, 0xa1, 'a', 0xcf, 0x01 };
	static const uint8_t nil[] = { 0xc0 };
	uint8_t deep[600];

	check_bad_then_good(reserved, sizeof(reserved), FRAME_E_MALFORMED);
	check_bad_then_good(array, sizeof(array), FRAME_E_NOTMAP);
	check_bad_then_good(nil, sizeof(nil), FRAME_E_NOTMAP);
	check_bad_then_good(trailing, sizeof(trailing), FRAME_E_MALFORMED);
	check_bad_then_good(huge_array, sizeof(huge_array), FRAME_E_MALFORMED);
	check_bad_then_good(huge_map, sizeof(huge_map), FRAME_E_MALFORMED);
	check_bad_then_good(huge_str, sizeof(huge_str), FRAME_E_MALFORMED);
	check_bad_then_good(short_int, sizeof(short_int), FRAME_E_MALFORMED);
	check_bad_then_good("", 0, FRAME_E_MALFORMED);
	/* 199 nested maps {"a": {"a": ... nil}}: deeper than msgpack-c's
	 * stack, structurally fine */
	for (int i = 0; i < 199; i++) {
		deep[3 * i] = 0x81;
		deep[3 * i + 1] = 0xa1;
		deep[3 * i + 2] = 'a';
	}
	deep[597] = 0xc0;
	check_bad_then_good(deep, 598, FRAME_E_MALFORMED);
	/* exactly FRAME_DEPTH_MAX levels is fine */
	deep[3 * FRAME_DEPTH_MAX] = 0xc0;
	check_bad_then_good(deep, 3 * FRAME_DEPTH_MAX + 1, 0);
	deep[3 * FRAME_DEPTH_MAX] = 0x81;
	deep[3 * (FRAME_DEPTH_MAX + 1)] = 0xc0;
	check_bad_then_good(deep, 3 * (FRAME_DEPTH_MAX + 1) + 1, FRAME_E_MALFORMED);
	/* FRAME_DEPTH_MAX levels around an empty map: msgpack-c would need
	 * one more stack slot (it said ENOMEM): malformed, never ENOMEM */
	deep[3 * FRAME_DEPTH_MAX] = 0x80;
	check_bad_then_good(deep, 3 * FRAME_DEPTH_MAX + 1, FRAME_E_MALFORMED);
	ck_assert_int_eq(frame_msgpack_check(array, sizeof(array)), 0);
	ck_assert_int_eq(frame_msgpack_check(huge_array, sizeof(huge_array)),
			 FRAME_E_MALFORMED);
}
END_TEST

/* Pack a map from a list of key, type, value triples for schema tests. */
static const msgpack_object *decode_into(msgpack_unpacked *msg,
					 struct frame_writer *w)
{
	char *data;
	size_t len;
	const msgpack_object *m = NULL;
	static char keep[4096];

	ck_assert_int_eq(frame_writer_finish(w, 4096, &data, &len), 0);
	memcpy(keep, data, len);
	free(data);
	ck_assert_int_eq(frame_decode((uint8_t *)keep, len, 4096, msg, &m), 0);
	return m;
}

START_TEST(test_schema_errors)
{
	struct frame_writer w;
	msgpack_packer *pk;
	msgpack_unpacked msg;
	const msgpack_object *m;
	struct args a;
	struct frame_error err;
	uint64_t present;
	static const char *const ignore[] = { "id", NULL };

	msgpack_unpacked_init(&msg);
	frame_writer_init(&w);
	pk = frame_writer_packer(&w);

	/* missing required */
	msgpack_pack_map(pk, 1);
	frame_pack_kv_str(pk, "cmd", "x");
	m = decode_into(&msg, &w);
	ck_assert_int_eq(frame_map_parse(m, args_schema, 5, 0, NULL, &a, NULL, &err),
			 FRAME_E_MISSING);
	ck_assert_str_eq(err.key, "n");

	/* wrong type */
	msgpack_pack_map(pk, 2);
	frame_pack_kv_str(pk, "cmd", "x");
	frame_pack_kv_str(pk, "n", "12");
	m = decode_into(&msg, &w);
	ck_assert_int_eq(frame_map_parse(m, args_schema, 5, 0, NULL, &a, NULL, &err),
			 FRAME_E_TYPE);
	ck_assert_str_eq(err.key, "n");

	/* out of range (n in 1..1000), negative, string too long */
	msgpack_pack_map(pk, 2);
	frame_pack_kv_str(pk, "cmd", "x");
	frame_pack_kv_u64(pk, "n", 1001);
	m = decode_into(&msg, &w);
	ck_assert_int_eq(frame_map_parse(m, args_schema, 5, 0, NULL, &a, NULL, &err),
			 FRAME_E_RANGE);
	msgpack_pack_map(pk, 2);
	frame_pack_kv_str(pk, "cmd", "x");
	frame_pack_kv_i64(pk, "n", -3);
	m = decode_into(&msg, &w);
	ck_assert_int_eq(frame_map_parse(m, args_schema, 5, 0, NULL, &a, NULL, &err),
			 FRAME_E_RANGE);
	msgpack_pack_map(pk, 2);
	frame_pack_kv_str(pk, "cmd", "a-very-long-command-name");
	frame_pack_kv_u64(pk, "n", 1);
	m = decode_into(&msg, &w);
	ck_assert_int_eq(frame_map_parse(m, args_schema, 5, 0, NULL, &a, NULL, &err),
			 FRAME_E_RANGE);
	ck_assert_str_eq(err.key, "cmd");

	/* embedded NUL */
	msgpack_pack_map(pk, 2);
	frame_pack_str(pk, "cmd");
	msgpack_pack_str(pk, 3);
	msgpack_pack_str_body(pk, "a\0b", 3);
	frame_pack_kv_u64(pk, "n", 1);
	m = decode_into(&msg, &w);
	ck_assert_int_eq(frame_map_parse(m, args_schema, 5, 0, NULL, &a, NULL, &err),
			 FRAME_E_RANGE);

	/* unknown key: fine when lax or ignored, an error when strict */
	msgpack_pack_map(pk, 4);
	frame_pack_kv_str(pk, "cmd", "x");
	frame_pack_kv_u64(pk, "n", 5);
	frame_pack_kv_u64(pk, "id", 5);
	frame_pack_kv_u64(pk, "bogus", 5);
	m = decode_into(&msg, &w);
	ck_assert_int_eq(frame_map_parse(m, args_schema, 5, 0, NULL, &a, &present, &err), 0);
	ck_assert_uint_eq(present, 0x3);
	ck_assert_int_eq(frame_map_parse(m, args_schema, 5, FRAME_SCHEMA_STRICT,
					 ignore, &a, NULL, &err), FRAME_E_UNKNOWN);
	ck_assert_str_eq(err.key, "bogus");

	/* an empty key (msgpack-c gives it a NULL pointer) is unknown too */
	msgpack_pack_map(pk, 3);
	frame_pack_kv_str(pk, "cmd", "x");
	frame_pack_kv_u64(pk, "n", 5);
	frame_pack_kv_u64(pk, "", 1);
	m = decode_into(&msg, &w);
	ck_assert_int_eq(frame_map_parse(m, args_schema, 5, FRAME_SCHEMA_STRICT,
					 NULL, &a, NULL, &err), FRAME_E_UNKNOWN);
	ck_assert_str_eq(err.key, "");

	/* duplicate key; non-string key when strict */
	msgpack_pack_map(pk, 3);
	frame_pack_kv_str(pk, "cmd", "x");
	frame_pack_kv_u64(pk, "n", 5);
	frame_pack_kv_u64(pk, "n", 6);
	m = decode_into(&msg, &w);
	ck_assert_int_eq(frame_map_parse(m, args_schema, 5, 0, NULL, &a, NULL, &err),
			 FRAME_E_DUPLICATE);
	msgpack_pack_map(pk, 3);
	frame_pack_kv_str(pk, "cmd", "x");
	frame_pack_kv_u64(pk, "n", 5);
	msgpack_pack_int(pk, 1);
	msgpack_pack_int(pk, 2);
	m = decode_into(&msg, &w);
	ck_assert_int_eq(frame_map_parse(m, args_schema, 5, FRAME_SCHEMA_STRICT,
					 NULL, &a, NULL, &err), FRAME_E_UNKNOWN);

	/* nested map is handed out as an object; wrong container type refused */
	msgpack_pack_map(pk, 3);
	frame_pack_kv_str(pk, "cmd", "x");
	frame_pack_kv_u64(pk, "n", 5);
	frame_pack_str(pk, "extra");
	msgpack_pack_map(pk, 1);
	frame_pack_kv_u64(pk, "deep", 9);
	m = decode_into(&msg, &w);
	ck_assert_int_eq(frame_map_parse(m, args_schema, 5, FRAME_SCHEMA_STRICT,
					 NULL, &a, NULL, &err), 0);
	{
		uint64_t v;

		ck_assert_int_eq(frame_obj_u64(frame_map_get(a.extra, "deep"), &v), 0);
		ck_assert_uint_eq(v, 9);
	}
	msgpack_pack_map(pk, 3);
	frame_pack_kv_str(pk, "cmd", "x");
	frame_pack_kv_u64(pk, "n", 5);
	frame_pack_kv_u64(pk, "extra", 1);
	m = decode_into(&msg, &w);
	ck_assert_int_eq(frame_map_parse(m, args_schema, 5, 0, NULL, &a, NULL, &err),
			 FRAME_E_TYPE);

	frame_writer_deinit(&w);
	msgpack_unpacked_destroy(&msg);
	ck_assert_str_eq(frame_strerror(FRAME_E_TOOBIG), "too_big");
	ck_assert_str_eq(frame_strerror(999), "?");
}
END_TEST

START_TEST(test_writer_limit)
{
	struct frame_writer w;
	char *data;
	size_t len;
	char big[200];

	memset(big, 'x', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	frame_writer_init(&w);
	msgpack_pack_map(frame_writer_packer(&w), 1);
	frame_pack_kv_str(frame_writer_packer(&w), "k", big);
	ck_assert_int_eq(frame_writer_finish(&w, 100, &data, &len), FRAME_E_TOOBIG);
	ck_assert_ptr_null(data);
	/* the writer was reset and is reusable */
	msgpack_pack_map(frame_writer_packer(&w), 0);
	ck_assert_int_eq(frame_writer_finish(&w, 100, &data, &len), 0);
	ck_assert_uint_eq(len, 5);
	ck_assert_uint_eq((uint8_t)data[3], 1);
	ck_assert_uint_eq((uint8_t)data[4], 0x80);
	free(data);
	frame_writer_deinit(&w);
}
END_TEST

/* xorshift64*: the fuzz loop's only randomness, seeded and printed. */
static uint64_t rng_next(uint64_t *s)
{
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * 0x2545F4914F6CDD1Dull;
}

START_TEST(test_fuzz)
{
	const char *env = getenv("KVD_FRAME_SEED");
	uint64_t seed = env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL) | 1;
	uint64_t s = seed;
	size_t flen;
	char *good = make_frame("pool.resize", 77, &flen);
	uint8_t buf[512];
	const char *it_env = getenv("KVD_FRAME_FUZZ_ITERS");
	int iters = it_env ? atoi(it_env) : 30000, ok = 0;

	fprintf(stderr, "test_fuzz seed=%llu (KVD_FRAME_SEED to replay,"
		" KVD_FRAME_FUZZ_ITERS for a longer run)\n",
		(unsigned long long)seed);
	for (int it = 0; it < iters; it++) {
		struct frame_decoder d;
		size_t n, off = 0;
		int mode = (int)(rng_next(&s) % 3);

		/* mutate a good frame, splice two, or pure random bytes */
		if (mode == 0) {
			n = flen;
			memcpy(buf, good, n);
			for (int k = (int)(rng_next(&s) % 6) + 1; k > 0; k--)
				buf[rng_next(&s) % n] = (uint8_t)rng_next(&s);
		} else if (mode == 1) {
			n = flen * 2;
			memcpy(buf, good, flen);
			memcpy(buf + flen, good, flen);
			buf[4 + rng_next(&s) % (flen - 4)] = (uint8_t)rng_next(&s);
			/* sometimes claim a payload length that fits in the buffer */
			if (rng_next(&s) & 1)
				buf[3] = (uint8_t)(rng_next(&s) % 64);
		} else {
			n = rng_next(&s) % sizeof(buf);
			for (size_t i = 0; i < n; i++)
				buf[i] = (uint8_t)rng_next(&s);
			if (n >= 4 && (rng_next(&s) & 1)) {
				buf[0] = buf[1] = 0;
				buf[2] = (uint8_t)((n - 4) >> 8);
				buf[3] = (uint8_t)(n - 4);
			}
		}
		frame_decoder_init(&d, 256);
		while (off < n) {
			size_t chunk = 1 + rng_next(&s) % 64, used;
			const msgpack_object *m;
			int r;

			chunk = KVD_MIN(chunk, n - off);
			ck_assert_int_eq(frame_decoder_feed(&d, buf + off, chunk, &used), 0);
			off += used;
			while ((r = frame_decoder_next(&d, &m)) != FRAME_E_AGAIN) {
				if (r == FRAME_E_TOOBIG)
					break;
				ck_assert_msg(r == 0 || r == FRAME_E_MALFORMED ||
					      r == FRAME_E_NOTMAP,
					      "seed %llu: r=%d",
					      (unsigned long long)seed, r);
				if (r == 0) {
					struct args a;

					ck_assert_int_eq(m->type, MSGPACK_OBJECT_MAP);
					frame_map_parse(m, args_schema, 5,
							FRAME_SCHEMA_STRICT, NULL,
							&a, NULL, NULL);
					ok++;
				}
			}
			if (r == FRAME_E_TOOBIG)
				break;
			ck_assert_uint_le(frame_decoder_pending(&d), 4 + 256);
		}
		frame_decoder_deinit(&d);
	}
	fprintf(stderr, "test_fuzz: %d inputs, %d decoded maps\n", iters, ok);
	ck_assert_int_gt(ok, 0);
	free(good);
}
END_TEST

static Suite *frame_suite(void)
{
	Suite *s = suite_create("frame");
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, test_roundtrip);
	tcase_add_test(tc, test_incremental);
	tcase_add_test(tc, test_toobig);
	tcase_add_test(tc, test_bad_payloads);
	tcase_add_test(tc, test_schema_errors);
	tcase_add_test(tc, test_writer_limit);
	tcase_add_test(tc, test_fuzz);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(frame_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
