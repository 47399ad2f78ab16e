/* test_metrics.c - the Prometheus renderer (daemon/node/metrics.c): label
 * escaping, the tenant bound, histogram arithmetic, outcome mapping, and
 * a text that a hostile tenant name cannot break (checked line by line,
 * and with promtool when it is installed).
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/node/daemon.h"
#include "daemon/node/metrics.h"
#include "net/wire/proto_client.h"

static struct kvd_daemon *new_daemon(void)
{
	struct kvd_daemon *d = calloc(1, sizeof(*d));

	ck_assert_ptr_nonnull(d);
	snprintf(d->cfg.node_name, sizeof(d->cfg.node_name), "n1");
	d->state = KVD_STATE_READY;
	d->chat_format = CHAT_LLAMA3;
	return d;
}

static char *render(struct kvd_daemon *d)
{
	char *text;
	size_t len;

	ck_assert_int_eq(kvd_metrics_render(d, &text, &len), 0);
	ck_assert_uint_eq(strlen(text), len);
	return text;
}

/* The value of the sample whose name-and-labels is exactly `key`; -1 when
 * absent. */
static double sample(const char *text, const char *key)
{
	size_t kl = strlen(key);

	for (const char *l = text; *l;) {
		const char *nl = strchr(l, '\n');
		if (!strncmp(l, key, kl) && l[kl] == ' ')
			return strtod(l + kl + 1, NULL);
		if (!nl)
			break;
		l = nl + 1;
	}
	return -1;
}

static size_t count_prefix(const char *text, const char *prefix)
{
	size_t n = 0, pl = strlen(prefix);

	for (const char *l = text; *l;) {
		const char *nl = strchr(l, '\n');
		n += !strncmp(l, prefix, pl);
		if (!nl)
			break;
		l = nl + 1;
	}
	return n;
}

START_TEST(test_escape)
{
	static const struct { const char *in, *out; } c[] = {
		{ "plain", "plain" },
		{ "a\"b", "a\\\"b" },
		{ "back\\slash", "back\\\\slash" },
		{ "two\nlines", "two\\nlines" },
		{ "tab\there", "tab\xEF\xBF\xBDhere" },          /* control byte */
		{ "bad\xff", "bad\xEF\xBF\xBD" },                  /* invalid UTF-8 */
		{ "\xc3\xa9t\xc3\xa9", "\xc3\xa9t\xc3\xa9" },      /* é kept */
		{ "\xed\xa0\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD" }, /* surrogate */
		{ "\xe2\x82", "\xEF\xBF\xBD\xEF\xBF\xBD" },        /* cut char */
		{ "", "" },
	};
	char out[64];

	for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
		size_t n = kvd_metrics_escape(c[i].in, out, sizeof(out));
		ck_assert_str_eq(out, c[i].out);
		ck_assert_uint_eq(n, strlen(c[i].out));
	}
	/* a short buffer holds whole escapes only: "ab\"" in 4 bytes is
	 * "ab" (the two-byte escape does not fit beside the NUL) */
	ck_assert_uint_eq(kvd_metrics_escape("ab\"c", out, 4), 5);
	ck_assert_str_eq(out, "ab");
	ck_assert_uint_eq(kvd_metrics_escape("ab\"c", out, 5), 5);
	ck_assert_str_eq(out, "ab\\\"");
	ck_assert_uint_eq(kvd_metrics_escape("x", NULL, 0), 1);
}
END_TEST

START_TEST(test_outcomes_and_tokens)
{
	struct kvd_daemon *d = new_daemon();
	struct kvd_metrics *m = &d->metrics;
	char *t;

	kvd_metrics_request_end(m, "acme", "stop", 0, 1000000);
	kvd_metrics_request_end(m, "acme", "length", 0, 1000000);
	kvd_metrics_request_end(m, "acme", "length", 0, 1000000);
	kvd_metrics_request_end(m, "acme", NULL, PROTO_ERR_INTEGRITY, 1000000);
	kvd_metrics_request_end(m, "acme", NULL, 0, 1000000);       /* abandoned */
	kvd_metrics_request_end(m, "acme", NULL, 99, 1000000);      /* unknown: internal */
	kvd_metrics_request_end(m, NULL, NULL, PROTO_ERR_DRAINING, 0); /* default, no e2e */
	kvd_metrics_token(m, "acme", true, 40, 2000000);
	kvd_metrics_token(m, "acme", false, 40, 3000000);
	kvd_metrics_token(m, "acme", false, 40, 4000000);
	t = render(d);
	ck_assert_double_eq(sample(t, "kvd_requests_total{tenant=\"acme\",outcome=\"stop\"}"), 1);
	ck_assert_double_eq(sample(t, "kvd_requests_total{tenant=\"acme\",outcome=\"length\"}"), 2);
	ck_assert_double_eq(sample(t, "kvd_requests_total{tenant=\"acme\",outcome=\"integrity\"}"), 1);
	ck_assert_double_eq(sample(t, "kvd_requests_total{tenant=\"acme\",outcome=\"abandoned\"}"), 1);
	ck_assert_double_eq(sample(t, "kvd_requests_total{tenant=\"acme\",outcome=\"internal\"}"), 1);
	ck_assert_double_eq(sample(t, "kvd_requests_total{tenant=\"default\",outcome=\"draining\"}"), 1);
	/* every outcome is listed for every tenant: 11 outcomes x 2 tenants */
	ck_assert_uint_eq(count_prefix(t, "kvd_requests_total{"), 2 * KVD_OUTCOME__N);
	ck_assert_double_eq(sample(t, "kvd_prompt_tokens_total{tenant=\"acme\"}"), 40);
	ck_assert_double_eq(sample(t, "kvd_generation_tokens_total{tenant=\"acme\"}"), 3);
	ck_assert_double_eq(sample(t, "kvd_time_to_first_token_seconds_count{tenant=\"acme\"}"), 1);
	ck_assert_double_eq(sample(t, "kvd_inter_token_latency_seconds_count{tenant=\"acme\"}"), 2);
	/* 3 ms and 4 ms: sum 0.007 s */
	ck_assert_double_eq_tol(sample(t, "kvd_inter_token_latency_seconds_sum{tenant=\"acme\"}"),
				0.007, 1e-12);
	/* the refused request has no latency: six e2e observations, on acme */
	ck_assert_double_eq(sample(t, "kvd_e2e_request_latency_seconds_count{tenant=\"acme\"}"), 6);
	ck_assert_double_eq(sample(t, "kvd_e2e_request_latency_seconds_count{tenant=\"default\"}"), 0);
	ck_assert_ptr_nonnull(strstr(t, "chat_template=\"llama3\""));
	ck_assert_double_eq(sample(t, "kvd_node_state{state=\"ready\"}"), 1);
	ck_assert_double_eq(sample(t, "kvd_node_state{state=\"draining\"}"), 0);
	free(t);
	free(d);
}
END_TEST

/* Buckets are cumulative, +Inf equals _count, an observation on a bound
 * falls in that bound's bucket (le means <=). */
START_TEST(test_histogram)
{
	struct kvd_daemon *d = new_daemon();
	char *t;

	/* ttft bounds start 0.001, 0.005, 0.01 ... 160 */
	kvd_metrics_token(&d->metrics, "h", true, 1, 500000);      /* 0.0005 */
	kvd_metrics_token(&d->metrics, "h", true, 1, 1000000);     /* 0.001, on the bound */
	kvd_metrics_token(&d->metrics, "h", true, 1, 7000000);     /* 0.007 */
	kvd_metrics_token(&d->metrics, "h", true, 1, 200000000000ull); /* 200 s: +Inf */
	t = render(d);
	ck_assert_double_eq(sample(t, "kvd_time_to_first_token_seconds_bucket{tenant=\"h\",le=\"0.001\"}"), 2);
	ck_assert_double_eq(sample(t, "kvd_time_to_first_token_seconds_bucket{tenant=\"h\",le=\"0.005\"}"), 2);
	ck_assert_double_eq(sample(t, "kvd_time_to_first_token_seconds_bucket{tenant=\"h\",le=\"0.01\"}"), 3);
	ck_assert_double_eq(sample(t, "kvd_time_to_first_token_seconds_bucket{tenant=\"h\",le=\"160\"}"), 3);
	ck_assert_double_eq(sample(t, "kvd_time_to_first_token_seconds_bucket{tenant=\"h\",le=\"+Inf\"}"), 4);
	ck_assert_double_eq(sample(t, "kvd_time_to_first_token_seconds_count{tenant=\"h\"}"), 4);
	ck_assert_double_eq_tol(sample(t, "kvd_time_to_first_token_seconds_sum{tenant=\"h\"}"),
				200.0085, 1e-9);
	/* 20 bounds + Inf, one tenant */
	ck_assert_uint_eq(count_prefix(t, "kvd_time_to_first_token_seconds_bucket{"), 21);

	kvd_metrics_xfer_time(&d->metrics, KVD_XFER_RECV, 2000000);  /* 0.002 */
	kvd_metrics_xfer_batch(&d->metrics, KVD_XFER_RECV, 4096);
	kvd_metrics_xfer_batch(&d->metrics, KVD_XFER_RECV, 4096);
	kvd_metrics_xfer_batch(&d->metrics, KVD_XFER_SEND, 100);
	kvd_metrics_integrity(&d->metrics, KVD_INTEGRITY_MAC);
	kvd_metrics_integrity(&d->metrics, KVD_INTEGRITY_TAG);
	kvd_metrics_integrity(&d->metrics, KVD_INTEGRITY_TAG);
	kvd_metrics_integrity(&d->metrics, (enum kvd_integrity_kind)77);   /* ignored */
	free(t);
	t = render(d);
	ck_assert_double_eq(sample(t, "kvd_kv_transfer_seconds_bucket{direction=\"receive\",le=\"0.001\"}"), 0);
	ck_assert_double_eq(sample(t, "kvd_kv_transfer_seconds_bucket{direction=\"receive\",le=\"0.0025\"}"), 1);
	ck_assert_double_eq(sample(t, "kvd_kv_transfer_seconds_count{direction=\"send\"}"), 0);
	ck_assert_double_eq(sample(t, "kvd_kv_transfer_bytes_total{direction=\"receive\"}"), 8192);
	ck_assert_double_eq(sample(t, "kvd_kv_transfer_batches_total{direction=\"receive\"}"), 2);
	ck_assert_double_eq(sample(t, "kvd_kv_transfer_bytes_total{direction=\"send\"}"), 100);
	ck_assert_double_eq(sample(t, "kvd_integrity_failures_total{kind=\"tag\"}"), 2);
	ck_assert_double_eq(sample(t, "kvd_integrity_failures_total{kind=\"mac\"}"), 1);
	ck_assert_double_eq(sample(t, "kvd_integrity_failures_total{kind=\"checksum\"}"), 0);
	free(t);
	free(d);
}
END_TEST

/* 40 tenants: 31 get their own series, the rest fold into "other"; the
 * label sets never exceed KVD_METRICS_TENANTS. A tenant called "other"
 * shares that series without counting as folded. */
START_TEST(test_tenant_bound)
{
	struct kvd_daemon *d = new_daemon();
	char name[80], *t;

	for (int i = 0; i < 40; i++) {
		snprintf(name, sizeof(name), "t%02d", i);
		kvd_metrics_request_end(&d->metrics, name, "stop", 0, 1000);
		kvd_metrics_request_end(&d->metrics, name, "stop", 0, 1000);
	}
	kvd_metrics_request_end(&d->metrics, "other", "stop", 0, 1000);
	/* a very long name is cut to 63 bytes: both spellings are one tenant */
	memset(name, 'x', 79);
	name[79] = 0;
	t = render(d);
	ck_assert_uint_eq(count_prefix(t, "kvd_requests_total{tenant=\"t"), 31 * KVD_OUTCOME__N);
	ck_assert_double_eq(sample(t, "kvd_requests_total{tenant=\"t30\",outcome=\"stop\"}"), 2);
	ck_assert_double_eq(sample(t, "kvd_requests_total{tenant=\"t31\",outcome=\"stop\"}"), -1);
	ck_assert_double_eq(sample(t, "kvd_requests_total{tenant=\"other\",outcome=\"stop\"}"), 9 * 2 + 1);
	ck_assert_double_eq(sample(t, "kvd_metrics_tenants_folded_total"), 18);
	ck_assert_uint_eq(count_prefix(t, "kvd_generation_tokens_total{"), KVD_METRICS_TENANTS);
	free(t);
	free(d);

	d = new_daemon();
	kvd_metrics_request_end(&d->metrics, name, "stop", 0, 1000);
	name[63] = 0;
	kvd_metrics_request_end(&d->metrics, name, "stop", 0, 1000);
	t = render(d);
	char key[200];
	snprintf(key, sizeof(key), "kvd_requests_total{tenant=\"%s\",outcome=\"stop\"}", name);
	ck_assert_double_eq(sample(t, key), 2);
	free(t);
	free(d);
}
END_TEST

/* A tenant name written to break the format (close the label, start a
 * line of its own) stays inside its label value: every line of the text
 * is a comment or a kvd_ sample, no line is the forged one, and promtool
 * accepts the text when it is installed. */
START_TEST(test_hostile_tenant)
{
	struct kvd_daemon *d = new_daemon();
	static const char *const evil[] = {
		"evil\"} 1\nkvd_forged_total 1\n#",
		"back\\\"slash",
		"nul\x01\x7f\xff",
		"{le=\"+Inf\"}",
	};
	char *t;

	for (size_t i = 0; i < 4; i++) {
		kvd_metrics_request_end(&d->metrics, evil[i], "length", 0, 5000000);
		kvd_metrics_token(&d->metrics, evil[i], true, 3, 1000000);
		kvd_metrics_token(&d->metrics, evil[i], false, 3, 1000000);
	}
	t = render(d);
	ck_assert_uint_eq(count_prefix(t, "kvd_forged"), 0);
	for (const char *l = t; *l;) {
		const char *nl = strchr(l, '\n');
		ck_assert_msg(l[0] == '#' || !strncmp(l, "kvd_", 4), "stray line: %.60s", l);
		ck_assert_ptr_nonnull(nl);   /* the text ends with a newline */
		l = nl + 1;
	}
	ck_assert_ptr_nonnull(strstr(t, "tenant=\"evil\\\"} 1\\nkvd_forged_total 1\\n#\""));
	ck_assert_ptr_nonnull(strstr(t, "tenant=\"back\\\\\\\"slash\""));
	ck_assert_ptr_nonnull(strstr(t, "tenant=\"nul\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\""));

	if (system("command -v promtool >/dev/null 2>&1") == 0) {
		char path[] = "/tmp/kvd_test_metrics_XXXXXX", cmd[128];
		int fd = mkstemp(path);
		ck_assert_int_ge(fd, 0);
		ck_assert_int_eq(write(fd, t, strlen(t)), (ssize_t)strlen(t));
		close(fd);
		snprintf(cmd, sizeof(cmd), "promtool check metrics < %s", path);
		int rc = system(cmd);
		unlink(path);
		ck_assert_msg(rc == 0, "promtool check metrics refused the text (%d)", rc);
	} else {
		fprintf(stderr, "promtool absent (Debian package prometheus): format check skipped\n");
	}
	free(t);
	free(d);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("metrics");
	TCase *tc = tcase_create("core");
	SRunner *sr;
	int failed;

	tcase_add_test(tc, test_escape);
	tcase_add_test(tc, test_outcomes_and_tokens);
	tcase_add_test(tc, test_histogram);
	tcase_add_test(tc, test_tenant_bound);
	tcase_add_test(tc, test_hostile_tenant);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
