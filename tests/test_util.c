/* test_util.c - conf/util's parsers: kvd_parse_u64 (digits only),
 * kvd_parse_double (a decimal number, no sign, space, hex, inf or nan)
 * and kvd_parse_u32_list (numbers separated by single commas),
 * kvd_parse_size (units: bare and IEC binary, SI decimal); its UTF-8
 * and JSON: kvd_utf8_len (every class of invalid sequence) and
 * kvd_json_str (each escape; invalid bytes as \u00XX, never raw),
 * kvd_json_u32s; kvd_buf (text and fixed-size entries, always
 * NUL-terminated, growth, deinit twice).
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conf/util.h"

START_TEST(test_parse_u64)
{
	static const struct { const char *s; int rc; uint64_t v; } cases[] = {
		{ "0", 0, 0 }, { "42", 0, 42 }, { "007", 0, 7 },
		{ "18446744073709551615", 0, UINT64_MAX },
		{ "18446744073709551616", -ERANGE, 0 },
		{ "99999999999999999999", -ERANGE, 0 },
		{ "", -EINVAL, 0 }, { "-1", -EINVAL, 0 }, { "+1", -EINVAL, 0 },
		{ " 1", -EINVAL, 0 }, { "1 ", -EINVAL, 0 }, { "0x10", -EINVAL, 0 },
		{ "1.5", -EINVAL, 0 }, { "1e3", -EINVAL, 0 }, { "abc", -EINVAL, 0 },
	};
	uint64_t v;

	ck_assert_int_eq(kvd_parse_u64(NULL, &v), -EINVAL);
	for (size_t i = 0; i < KVD_ARRAY_SIZE(cases); i++) {
		int rc = kvd_parse_u64(cases[i].s, &v);

		ck_assert_msg(rc == cases[i].rc, "'%s': %d", cases[i].s, rc);
		if (!rc)
			ck_assert_uint_eq(v, cases[i].v);
	}
}
END_TEST

START_TEST(test_parse_size)
{
	static const struct { const char *s; int rc; uint64_t v; } cases[] = {
		{ "0", 0, 0 }, { "4096", 0, 4096 }, { "4096B", 0, 4096 },
		{ "4K", 0, 4096 }, { "4KiB", 0, 4096 }, { "4KB", 0, 4000 },
		{ "4kb", 0, 4000 }, { "4kB", 0, 4000 }, { "512MiB", 0, 512ull << 20 },
		{ "512M", 0, 512ull << 20 }, { "512MB", 0, 512000000 },
		{ "4G", 0, 4ull << 30 }, { "4GiB", 0, 4ull << 30 },
		{ "4gib", 0, 4ull << 30 }, { "4GB", 0, 4000000000ull },
		{ "2T", 0, 2ull << 40 }, { "2TB", 0, 2000000000000ull },
		{ "1.5GiB", 0, 3ull << 29 }, { "1.5GB", 0, 1500000000 },
		{ "0.1K", 0, 102 }, { "1.0000000001K", 0, 1024 },
		{ "16777215T", 0, 16777215ull << 40 },
		{ "16777216T", -ERANGE, 0 }, { "18446744073709551616", -ERANGE, 0 },
		{ "18446744073709551615", 0, UINT64_MAX },
		{ "", -EINVAL, 0 }, { "G", -EINVAL, 0 }, { "4X", -EINVAL, 0 },
		{ "4 GB", -EINVAL, 0 }, { "-4G", -EINVAL, 0 }, { "4GBB", -EINVAL, 0 },
		{ "1.5", -EINVAL, 0 }, { "1.5B", -EINVAL, 0 }, { "1.G", -EINVAL, 0 },
		{ ".5G", -EINVAL, 0 }, { "4Gi", -EINVAL, 0 }, { "0x10K", -EINVAL, 0 },
	};
	uint64_t v;

	ck_assert_int_eq(kvd_parse_size(NULL, &v), -EINVAL);
	for (size_t i = 0; i < KVD_ARRAY_SIZE(cases); i++) {
		int rc = kvd_parse_size(cases[i].s, &v);

		ck_assert_msg(rc == cases[i].rc, "'%s': %d", cases[i].s, rc);
		if (!rc)
			ck_assert_msg(v == cases[i].v, "'%s': %llu", cases[i].s,
				      (unsigned long long)v);
	}
}
END_TEST

START_TEST(test_parse_double)
{
	static const struct { const char *s; int rc; double v; } cases[] = {
		{ "0", 0, 0.0 }, { "0.7", 0, 0.7 }, { ".5", 0, 0.5 }, { "5.", 0, 5.0 },
		{ "100", 0, 100.0 }, { "1e-3", 0, 1e-3 }, { "2E+2", 0, 200.0 },
		{ "1e-50", 0, 1e-50 },
		{ "1e999", -ERANGE, 0 }, { "1e-999", -ERANGE, 0 },
		{ "", -EINVAL, 0 }, { ".", -EINVAL, 0 }, { "-1", -EINVAL, 0 },
		{ "+1", -EINVAL, 0 }, { " 1", -EINVAL, 0 }, { "1 ", -EINVAL, 0 },
		{ "nan", -EINVAL, 0 }, { "inf", -EINVAL, 0 }, { "0x1p3", -EINVAL, 0 },
		{ "1e", -EINVAL, 0 }, { "1e+", -EINVAL, 0 }, { "1.2.3", -EINVAL, 0 },
		{ "1,5", -EINVAL, 0 }, { "e3", -EINVAL, 0 },
	};
	double v;

	ck_assert_int_eq(kvd_parse_double(NULL, &v), -EINVAL);
	for (size_t i = 0; i < KVD_ARRAY_SIZE(cases); i++) {
		int rc = kvd_parse_double(cases[i].s, &v);

		ck_assert_msg(rc == cases[i].rc, "'%s': %d", cases[i].s, rc);
		if (!rc)
			ck_assert_msg(v == cases[i].v, "'%s': %g", cases[i].s, v);
	}
}
END_TEST

START_TEST(test_parse_u32_list)
{
	static const char *const bad[] = {
		"", ",", "1,", ",1", "1,,2", "1, 2", " 1", "x", "-1", "1;2",
		"101", "1,101", "99999999999999999999",
	};
	uint32_t *a = NULL;
	size_t n = 0;

	ck_assert_int_eq(kvd_parse_u32_list("7", 100, &a, &n), 0);
	ck_assert_uint_eq(n, 1);
	ck_assert_uint_eq(a[0], 7);
	free(a);
	ck_assert_int_eq(kvd_parse_u32_list("0,100,3", 100, &a, &n), 0);
	ck_assert_uint_eq(n, 3);
	ck_assert_uint_eq(a[0], 0);
	ck_assert_uint_eq(a[1], 100);
	ck_assert_uint_eq(a[2], 3);
	free(a);
	ck_assert_int_eq(kvd_parse_u32_list("4294967295", UINT32_MAX, &a, &n), 0);
	ck_assert_uint_eq(a[0], UINT32_MAX);
	free(a);
	for (size_t i = 0; i < KVD_ARRAY_SIZE(bad); i++) {
		a = NULL;
		ck_assert_msg(kvd_parse_u32_list(bad[i], 100, &a, &n) == -EINVAL,
			      "'%s' taken", bad[i]);
		ck_assert_ptr_null(a);
	}
}
END_TEST

START_TEST(test_utf8_len)
{
	static const struct { const char *s; size_t n, want; } cases[] = {
		{ "a", 1, 1 }, { "", 1, 1 },                   /* NUL is ASCII */
		{ "\xc3\xbc", 2, 2 }, { "\xe2\x82\xac", 3, 3 },
		{ "\xf0\x9f\x98\x80", 4, 4 }, { "\xf4\x8f\xbf\xbf", 4, 4 },
		{ "\xc3\xbc", 1, 0 },                          /* cut by n */
		{ "\xe2\x82", 2, 0 }, { "\xe2\x82", 3, 0 },   /* cut by NUL */
		{ "\x80", 1, 0 }, { "\xbf", 1, 0 },            /* lone continuation */
		{ "\xc0\x80", 2, 0 }, { "\xc1\xbf", 2, 0 },   /* overlong */
		{ "\xe0\x9f\xbf", 3, 0 }, { "\xf0\x8f\xbf\xbf", 4, 0 },
		{ "\xed\xa0\x80", 3, 0 },                      /* surrogate */
		{ "\xf4\x90\x80\x80", 4, 0 }, { "\xf5\x80\x80\x80", 4, 0 },
		{ "\xff", 1, 0 }, { "\xc3\x28", 2, 0 },
	};

	ck_assert_uint_eq(kvd_utf8_len("a", 0), 0);
	for (size_t i = 0; i < KVD_ARRAY_SIZE(cases); i++)
		ck_assert_msg(kvd_utf8_len(cases[i].s, cases[i].n) == cases[i].want,
			      "case %zu", i);
}
END_TEST

static char *json_of(const char *s, size_t n)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);

	ck_assert_ptr_nonnull(f);
	kvd_json_str(f, s, n);
	fclose(f);
	return buf;
}

START_TEST(test_json_str)
{
	static const struct { const char *s; size_t n; const char *want; } cases[] = {
		{ "plain", 5, "\"plain\"" },
		{ "q\"b\\", 4, "\"q\\\"b\\\\\"" },
		{ "\n\t\r", 3, "\"\\n\\t\\r\"" },
		{ "\x01\x1f\x7f", 3, "\"\\u0001\\u001f\\u007f\"" },
		{ "a\0b", 3, "\"a\\u0000b\"" },
		{ "gr\xc3\xbc\xc3\x9f \xe2\x82\xac \xf0\x9f\x98\x80", 15,
		  "\"gr\xc3\xbc\xc3\x9f \xe2\x82\xac \xf0\x9f\x98\x80\"" },
		/* bytes of no valid character: each as \u00XX */
		{ "\xff\xfe", 2, "\"\\u00ff\\u00fe\"" },
		{ "\xe2\x82", 2, "\"\\u00e2\\u0082\"" },      /* a cut character */
		{ "\xed\xa0\x80", 3, "\"\\u00ed\\u00a0\\u0080\"" },
		{ "\xc0\x80x", 3, "\"\\u00c0\\u0080x\"" },
		{ "", 0, "\"\"" },
	};

	for (size_t i = 0; i < KVD_ARRAY_SIZE(cases); i++) {
		char *got = json_of(cases[i].s, cases[i].n);

		ck_assert_msg(!strcmp(got, cases[i].want), "case %zu: %s", i, got);
		free(got);
	}
}
END_TEST

START_TEST(test_json_u32s)
{
	static const uint32_t ids[] = { 0, 7, UINT32_MAX };
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);

	kvd_json_u32s(f, ids, 0);
	kvd_json_u32s(f, ids, 1);
	kvd_json_u32s(f, ids, 3);
	fclose(f);
	ck_assert_str_eq(buf, "[][0][0,7,4294967295]");
	free(buf);
}
END_TEST

START_TEST(test_buf)
{
	struct kvd_buf t = KVD_BUF_NULL, a = KVD_BUF_NULL;

	ck_assert_int_eq(kvd_buf_add(&t, "", 0), 0);
	ck_assert_str_eq(t.p, "");
	for (int i = 0; i < 1000; i++)
		ck_assert_int_eq(kvd_buf_add(&t, "abc", 3), 0);
	ck_assert_uint_eq(t.len, 3000);
	ck_assert_uint_eq(strlen(t.p), 3000);
	ck_assert(t.cap > t.len);
	ck_assert_int_eq(memcmp(t.p + 2997, "abc", 4), 0);   /* and the NUL */
	for (uint32_t i = 0; i < 1000; i++)
		ck_assert_int_eq(kvd_buf_add(&a, &i, sizeof(i)), 0);
	ck_assert_uint_eq(a.len, 1000 * sizeof(uint32_t));
	for (uint32_t i = 0; i < 1000; i++)
		ck_assert_uint_eq(((const uint32_t *)a.p)[i], i);
	ck_assert_int_eq(kvd_buf_add(&a, "x", SIZE_MAX), -ENOMEM);
	ck_assert_uint_eq(a.len, 1000 * sizeof(uint32_t));
	kvd_buf_deinit(&t);
	kvd_buf_deinit(&t);
	ck_assert_ptr_null(t.p);
	ck_assert_uint_eq(t.len, 0);
	kvd_buf_deinit(&a);
}
END_TEST

static Suite *util_suite(void)
{
	Suite *s = suite_create("util");
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, test_parse_u64);
	tcase_add_test(tc, test_parse_size);
	tcase_add_test(tc, test_parse_double);
	tcase_add_test(tc, test_parse_u32_list);
	tcase_add_test(tc, test_utf8_len);
	tcase_add_test(tc, test_json_str);
	tcase_add_test(tc, test_json_u32s);
	tcase_add_test(tc, test_buf);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(util_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
