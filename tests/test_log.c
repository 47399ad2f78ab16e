/* test_log.c - log lines cannot be forged: hostile values (newlines, a
 * forged ` event=kv_capacity ...` tail, quotes, backslashes, control bytes,
 * invalid UTF-8) stay inside one line and come back intact through the
 * audit's parser; a raw value that skipped quoting still yields one line.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "conf/log.h"
#include "ctl/audit.h"

#define FORGED "\nts=2026-11-29T14:25:37.123Z level=info node=x event=kv_capacity" \
	       " role=prefill pool_tokens=99999999 context_length=1 margin=1" \
	       " verdict=ok reason=boot\n"

static const char *const hostile[] = {
	"plain",
	"with space",
	FORGED,
	"\" event=kv_capacity pool_tokens=99999999 ",
	"x\" event=kv_capacity node=x pool_tokens=99999999 \"",
	"back\\slash\\",
	"\\\" trailing backslash quote",
	"ctl\x01\x02\x1b[31m\x7f\r\t",
	"bad utf8 \xff\xfe \xc3 \xe2\x82 \xed\xa0\x80 \xf4\x90\x80\x80",
	"ok utf8 gr\xc3\xbc\xc3\x9f \xe2\x82\xac \xf0\x9f\x98\x80",
	"",
};

/* Log through a temporary file and return what was written. */
static void capture_begin(struct kvlog *lg, FILE **f)
{
	*f = tmpfile();
	ck_assert_ptr_nonnull(*f);
	kvlog_init(lg, KVLOG_DEBUG, fileno(*f), "node-0");
}

static char *capture_end(FILE *f, size_t *len)
{
	long n;
	char *text;

	fflush(f);
	n = lseek(fileno(f), 0, SEEK_END);
	ck_assert_int_ge(n, 0);
	text = malloc((size_t)n + 1);
	ck_assert_ptr_nonnull(text);
	ck_assert_int_eq(pread(fileno(f), text, (size_t)n, 0), n);
	text[n] = '\0';
	fclose(f);
	*len = (size_t)n;
	return text;
}

static size_t count_lines(const char *text, size_t len)
{
	size_t n = 0;

	for (size_t i = 0; i < len; i++)
		n += text[i] == '\n';
	return n;
}

/* The one value of `key` in a line, unquoted; NULL when absent or the
 * line does not parse. Fails the test on a duplicate key. */
static const char *value_of(const char *line, size_t len, const char *key,
			    char *buf, const char **keys, const char **vals)
{
	int n = audit_split(line, len, buf, keys, vals, 32);
	const char *v = NULL;

	for (int i = 0; i < n; i++) {
		if (strcmp(keys[i], key))
			continue;
		ck_assert_msg(!v, "duplicate key %s in %.*s", key, (int)len, line);
		v = vals[i];
	}
	return v;
}

START_TEST(test_quote_round_trip)
{
	char q[KVLOG_QUOTE_MAX], line[1200], buf[1200];
	const char *keys[32], *vals[32];

	for (size_t i = 0; i < sizeof(hostile) / sizeof(hostile[0]); i++) {
		const char *s = hostile[i], *v;

		kvlog_quote(q, sizeof(q), s);
		for (const char *p = q; *p; p++)
			ck_assert_msg((unsigned char)*p >= 0x20 && *p != 0x7f,
				      "control byte left in %s", q);
		snprintf(line, sizeof(line), "event=peer_refused v=%s end=1", q);
		v = value_of(line, strlen(line), "v", buf, keys, vals);
		ck_assert_ptr_nonnull(v);
		ck_assert_str_eq(v, s);
		ck_assert_str_eq(value_of(line, strlen(line), "event", buf, keys,
					  vals), "peer_refused");
	}
	/* valid UTF-8 stays readable; invalid bytes are escaped */
	ck_assert_str_eq(kvlog_quote(q, sizeof(q), "gr\xc3\xbc\xc3\x9f"),
			 "gr\xc3\xbc\xc3\x9f");
	ck_assert_str_eq(kvlog_quote(q, sizeof(q), "a\xff"), "\"a\\xff\"");
	ck_assert_str_eq(kvlog_quote(q, sizeof(q), "\xc3("), "\"\\xc3(\"");
	ck_assert_str_eq(kvlog_quote(q, sizeof(q), NULL), "\"\"");
}
END_TEST

START_TEST(test_quote_truncates_whole)
{
	char big[4000], q[64], line[128], buf[128];
	const char *keys[4], *vals[4];

	memset(big, '\n', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	kvlog_quote(q, sizeof(q), big);
	ck_assert_uint_lt(strlen(q), sizeof(q));
	ck_assert_int_eq(q[0], '"');
	ck_assert_int_eq(q[strlen(q) - 1], '"');
	ck_assert_ptr_null(strchr(q, '\n'));
	/* cut between escapes, never inside one: it still parses */
	snprintf(line, sizeof(line), "event=x v=%s", q);
	ck_assert_int_eq(audit_split(line, strlen(line), buf, keys, vals, 4), 2);
}
END_TEST

START_TEST(test_emit_quoted_one_line)
{
	const char *keys[32], *vals[32];
	char buf[8192];

	for (size_t i = 0; i < sizeof(hostile) / sizeof(hostile[0]); i++) {
		struct kvlog lg;
		FILE *f;
		size_t len;
		char *text;

		capture_begin(&lg, &f);
		KVLOG_WARN(&lg, "peer_refused", "peer_node=%s field=model msg=%s",
			   KVLOG_Q(hostile[i]), KVLOG_Q(hostile[i]));
		text = capture_end(f, &len);
		ck_assert_uint_eq(count_lines(text, len), 1);
		ck_assert_int_eq(text[len - 1], '\n');
		ck_assert_str_eq(value_of(text, len - 1, "peer_node", buf, keys,
					  vals), hostile[i]);
		ck_assert_str_eq(value_of(text, len - 1, "msg", buf, keys, vals),
				 hostile[i]);
		ck_assert_str_eq(value_of(text, len - 1, "event", buf, keys, vals),
				 "peer_refused");
		ck_assert_str_eq(value_of(text, len - 1, "node", buf, keys, vals),
				 "node-0");
		free(text);
	}
}
END_TEST

/* Defence in depth: a call site that forgot to quote still emits exactly
 * one line, and no control byte reaches the file. */
START_TEST(test_emit_raw_one_line)
{
	for (size_t i = 0; i < sizeof(hostile) / sizeof(hostile[0]); i++) {
		struct kvlog lg;
		FILE *f;
		size_t len;
		char *text;

		capture_begin(&lg, &f);
		KVLOG_WARN(&lg, "peer_refused", "peer_node=%s msg=\"%s\"",
			   hostile[i], hostile[i]);
		text = capture_end(f, &len);
		ck_assert_uint_eq(count_lines(text, len), 1);
		ck_assert_int_eq(text[len - 1], '\n');
		for (size_t j = 0; j + 1 < len; j++)
			ck_assert_msg((unsigned char)text[j] >= 0x20 &&
				      text[j] != 0x7f, "control byte at %zu", j);
		free(text);
	}
}
END_TEST

/* A node name from the config with a space or newline cannot split the
 * line either. */
START_TEST(test_node_name_quoted)
{
	const char *keys[32], *vals[32];
	char buf[1024];
	struct kvlog lg;
	FILE *f;
	size_t len;
	char *text;

	f = tmpfile();
	ck_assert_ptr_nonnull(f);
	kvlog_init(&lg, KVLOG_INFO, fileno(f), "a b\nevent=kv_capacity");
	KVLOG_INFO(&lg, "ready", "role=prefill");
	text = capture_end(f, &len);
	ck_assert_uint_eq(count_lines(text, len), 1);
	ck_assert_str_eq(value_of(text, len - 1, "node", buf, keys, vals),
			 "a b\nevent=kv_capacity");
	ck_assert_str_eq(value_of(text, len - 1, "event", buf, keys, vals),
			 "ready");
	free(text);
}
END_TEST

/* A line longer than the buffer is cut, still one line. */
START_TEST(test_emit_long_line)
{
	static char big[10000];
	struct kvlog lg;
	FILE *f;
	size_t len;
	char *text;

	memset(big, '\n', sizeof(big) - 1);
	capture_begin(&lg, &f);
	KVLOG_INFO(&lg, "x", "v=%s w=%s", big, KVLOG_Q(big));
	text = capture_end(f, &len);
	ck_assert_uint_eq(count_lines(text, len), 1);
	ck_assert_uint_le(len, 4096);
	free(text);
}
END_TEST

static Suite *log_suite(void)
{
	Suite *s = suite_create("log");
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, test_quote_round_trip);
	tcase_add_test(tc, test_quote_truncates_whole);
	tcase_add_test(tc, test_emit_quoted_one_line);
	tcase_add_test(tc, test_emit_raw_one_line);
	tcase_add_test(tc, test_node_name_quoted);
	tcase_add_test(tc, test_emit_long_line);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(log_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
