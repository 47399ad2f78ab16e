/* test_audit.c - the log capacity audit: the incident's figures, recovery,
 * clamping, fingerprint and dtype disagreement, garbage lines, quoting.
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conf/log.h"
#include "ctl/audit.h"

#define SHA_A "a897fb5d458ff6087ad099204cdcadb237c464989116b9bda7a517e3b308a2da"
#define SHA_B "0000000000000000000000000000000000000000000000000000000000000001"

/* One kv_capacity line as kvd logs it. */
static void cap_line(char *buf, size_t size, const char *node, const char *role,
		     unsigned long long pool, unsigned ctx, const char *margin,
		     const char *sha, const char *dtype, const char *verdict,
		     const char *policy, unsigned advertised, const char *reason)
{
	snprintf(buf, size,
		 "ts=2026-11-29T14:25:37.123Z level=info node=%s event=kv_capacity"
		 " role=%s pool_tokens=%llu pages=%llu page_tokens=16"
		 " page_bytes=2097216 kv_bytes_per_token=131072 context_length=%u"
		 " margin=%s required_tokens=%u model=\"/srv/models/big model.gguf\""
		 " model_sha256=%s kv_dtype=%s verdict=%s policy=%s"
		 " advertised_context=%u reason=%s",
		 node, role, pool, pool / 16, ctx, margin, ctx, sha, dtype,
		 verdict, policy, advertised, reason);
}

static int feed(struct audit *a, const char *line)
{
	return audit_feed_line(a, line, strlen(line));
}

/* Run the report into a memory buffer; returns the exit verdict. */
static int report(struct audit *a, char **text, int json)
{
	size_t len;
	FILE *f = open_memstream(text, &len);
	int r;

	ck_assert_ptr_nonnull(f);
	r = json ? audit_report_json(a, f) : audit_report(a, f);
	fclose(f);
	return r;
}

START_TEST(test_huge_context)
{
	struct audit *a;
	struct audit_summary s;
	char *out;

	/* context x margin beyond 2^64: insufficient, never undefined */
	ck_assert_int_eq(audit_new(&a), 0);
	ck_assert_int_eq(feed(a, "event=kv_capacity node=a role=prefill pool_tokens=1"
			      " context_length=18446744073709551615 margin=1e300\n"), 0);
	audit_get_summary(a, &s);
	ck_assert_uint_eq(s.insufficient, 1);
	ck_assert_int_eq(report(a, &out, 0), 1);
	free(out);
	audit_free(a);
}
END_TEST

START_TEST(test_incident_insufficient)
{
	struct audit *a;
	struct audit_summary s;
	char line[1024], *out;

	ck_assert_int_eq(audit_new(&a), 0);
	/* the incident: 1,048,576-token context, 681,280-token pool, and a
	 * line that (wrongly) claims ok: the figures decide */
	cap_line(line, sizeof(line), "prefill-0", "prefill", 681280, 1048576,
		 "1", SHA_A, "f16", "ok", "refuse", 1048576, "boot");
	ck_assert_int_eq(feed(a, line), 0);
	cap_line(line, sizeof(line), "decode-0", "decode", 2040000, 1048576,
		 "1", SHA_A, "f16", "ok", "refuse", 1048576, "boot");
	ck_assert_int_eq(feed(a, line), 0);
	audit_get_summary(a, &s);
	ck_assert_uint_eq(s.nodes, 2);
	ck_assert_uint_eq(s.insufficient, 1);
	ck_assert(!s.model_mismatch);
	ck_assert_int_eq(report(a, &out, 0), 1);
	ck_assert_ptr_nonnull(strstr(out, "FAIL prefill-0: pool of 681280 tokens"));
	ck_assert_ptr_nonnull(strstr(out, "disagrees"));
	ck_assert_ptr_null(strstr(out, "FAIL decode-0"));
	free(out);
	ck_assert_int_eq(report(a, &out, 1), 1);
	ck_assert_ptr_nonnull(strstr(out, "\"ok\":false"));
	free(out);
	audit_free(a);
}
END_TEST

START_TEST(test_incident_fixed)
{
	struct audit *a;
	char line[1024], *out;

	ck_assert_int_eq(audit_new(&a), 0);
	cap_line(line, sizeof(line), "prefill-0", "prefill", 681280, 1048576,
		 "1", SHA_A, "f16", "insufficient", "refuse", 0, "boot");
	feed(a, line);
	/* the pool grown to ~2,040,000 tokens: the latest line decides */
	cap_line(line, sizeof(line), "prefill-0", "prefill", 2040000, 1048576,
		 "1", SHA_A, "f16", "ok", "refuse", 1048576, "resize");
	feed(a, line);
	cap_line(line, sizeof(line), "decode-0", "decode", 2040000, 1048576,
		 "1", SHA_A, "f16", "ok", "refuse", 1048576, "boot");
	feed(a, line);
	ck_assert_int_eq(report(a, &out, 0), 0);
	/* what changed since the previous line */
	ck_assert_ptr_nonnull(strstr(out, "pool_tokens 681280->2040000"));
	ck_assert_ptr_nonnull(strstr(out, "verdict insufficient->ok"));
	ck_assert_ptr_nonnull(strstr(out, "(resize)"));
	ck_assert_ptr_nonnull(strstr(out, "first line"));
	ck_assert_ptr_nonnull(strstr(out, "audit: ok"));
	free(out);
	/* every node judged, none failed: the only clean verdict */
	ck_assert_int_eq(report(a, &out, 1), AUDIT_OK);
	ck_assert_ptr_nonnull(strstr(out, "{\"ok\":true,\"all_judged\":true,"));
	free(out);
	audit_free(a);
}
END_TEST

START_TEST(test_margin_and_clamp)
{
	struct audit *a;
	struct audit_summary s;
	char line[1024], *out;

	ck_assert_int_eq(audit_new(&a), 0);
	/* 2,040,000 >= 1,048,576 but not >= 1,048,576 x 2 */
	cap_line(line, sizeof(line), "p1", "prefill", 2040000, 1048576, "2",
		 SHA_A, "f16", "ok", "refuse", 1048576, "boot");
	feed(a, line);
	audit_get_summary(a, &s);
	ck_assert_uint_eq(s.insufficient, 1);
	audit_free(a);

	/* clamped to what fits: served context 600,000 <= 681,280 */
	ck_assert_int_eq(audit_new(&a), 0);
	cap_line(line, sizeof(line), "p1", "prefill", 681280, 1048576, "1",
		 SHA_A, "f16", "insufficient", "clamp", 600000, "boot");
	feed(a, line);
	ck_assert_int_eq(report(a, &out, 0), 0);
	ck_assert_ptr_nonnull(strstr(out, "ok-clamped"));
	free(out);
	audit_free(a);
}
END_TEST

START_TEST(test_fingerprint_mismatch)
{
	struct audit *a;
	struct audit_summary s;
	char line[1024], *out;

	ck_assert_int_eq(audit_new(&a), 0);
	cap_line(line, sizeof(line), "prefill-0", "prefill", 2040000, 1048576,
		 "1", SHA_A, "f16", "ok", "refuse", 1048576, "boot");
	feed(a, line);
	cap_line(line, sizeof(line), "decode-0", "decode", 2040000, 1048576,
		 "1", SHA_B, "f16", "ok", "refuse", 1048576, "boot");
	feed(a, line);
	/* a standalone node with another model is its own business */
	cap_line(line, sizeof(line), "dev", "standalone", 4096, 1024, "1",
		 SHA_B, "f32", "ok", "refuse", 1024, "boot");
	feed(a, line);
	audit_get_summary(a, &s);
	ck_assert(s.model_mismatch);
	ck_assert(!s.dtype_mismatch);
	ck_assert_uint_eq(s.insufficient, 0);
	ck_assert_int_eq(report(a, &out, 0), 1);
	ck_assert_ptr_nonnull(strstr(out, "FAIL model fingerprint differs"));
	free(out);
	audit_free(a);

	ck_assert_int_eq(audit_new(&a), 0);
	cap_line(line, sizeof(line), "prefill-0", "prefill", 2040000, 1048576,
		 "1", SHA_A, "f16", "ok", "refuse", 1048576, "boot");
	feed(a, line);
	cap_line(line, sizeof(line), "decode-0", "decode", 2040000, 1048576,
		 "1", SHA_A, "f32", "ok", "refuse", 1048576, "boot");
	feed(a, line);
	audit_get_summary(a, &s);
	ck_assert(s.dtype_mismatch);
	ck_assert_int_eq(report(a, &out, 1), 1);
	ck_assert_ptr_nonnull(strstr(out, "\"dtype_mismatch\":true"));
	free(out);
	audit_free(a);
}
END_TEST

START_TEST(test_garbage_lines)
{
	struct audit *a;
	struct audit_summary s;
	char line[1024], *out;
	static const char *const junk[] = {
		"hello world",
		"ts=1 level=info node=x event=kv_capacity pool_tokens=\"unterminated",
		"\x01\x02\x03 binary \xff\xfe",
		"key=value but=no event",
		"ts=1 event=kv_capacity node=n1 pool_tokens=12 stray-word",
		"=novalue",
		"ts=1 event=x a=b\"c",
	};

	ck_assert_int_eq(audit_new(&a), 0);
	for (size_t i = 0; i < sizeof(junk) / sizeof(junk[0]); i++)
		ck_assert_int_eq(feed(a, junk[i]), 0);
	feed(a, "");
	/* a kv_capacity line missing figures is counted apart */
	feed(a, "ts=1 level=info node=n1 event=kv_capacity role=prefill pool_tokens=abc");
	/* other events are fine and ignored */
	feed(a, "ts=1 level=info node=n1 event=ready role=prefill");
	/* journal prefix before the pairs is skipped */
	cap_line(line, sizeof(line), "n1", "prefill", 4096, 1024, "1.25", SHA_A,
		 "f16", "ok", "refuse", 1024, "boot");
	{
		char prefixed[1200];

		snprintf(prefixed, sizeof(prefixed),
			 "Nov 29 14:25:37 host kvd[123]: %s\n", line);
		feed(a, prefixed);
	}
	audit_get_summary(a, &s);
	ck_assert_uint_eq(s.lines, 11);
	ck_assert_uint_eq(s.unparseable, 7);
	ck_assert_uint_eq(s.incomplete, 1);
	ck_assert_uint_eq(s.kvd_lines, 3);
	ck_assert_uint_eq(s.capacity_lines, 1);
	ck_assert_uint_eq(s.nodes, 1);
	ck_assert_int_eq(report(a, &out, 0), 0);
	ck_assert_ptr_nonnull(strstr(out, "7 unparseable"));
	free(out);
	audit_free(a);

	/* only garbage: nothing to judge, not a failure */
	ck_assert_int_eq(audit_new(&a), 0);
	feed(a, "garbage");
	ck_assert_int_eq(report(a, &out, 0), 0);
	ck_assert_ptr_nonnull(strstr(out, "no event=kv_capacity line"));
	free(out);
	audit_free(a);
}
END_TEST

/* Three nodes' logs, interleaved as one journal stream shows them: each
 * node's role, model and verdict, and its requests done and failed from
 * their end lines; forged end lines are not counted; a node with request
 * lines but no kv_capacity line is listed, not judged, not a failure. */
static void feed_three(struct audit *a, unsigned long long prefill_pool)
{
	char line[1024];

	cap_line(line, sizeof(line), "prefill-0", "prefill", prefill_pool, 4096,
		 "1", SHA_A, "f16", "ok", "refuse", 4096, "boot");
	feed(a, line);
	cap_line(line, sizeof(line), "decode-0", "decode", 8192, 4096, "1",
		 SHA_A, "f16", "ok", "refuse", 4096, "boot");
	feed(a, line);
	cap_line(line, sizeof(line), "decode-1", "decode", 8192, 4096, "1",
		 SHA_A, "f16", "ok", "refuse", 4096, "boot");
	feed(a, line);
	for (int i = 0; i < 3; i++) {
		feed(a, "ts=1 level=info node=decode-0 event=request_done id=4294967301"
		     " client_id=1 tenant=alice kind=decode finish=length prompt_tokens=5"
		     " prefill_node=prefill-0 prefill_id=8000000000");
		feed(a, "ts=1 level=info node=prefill-0 event=prefill_served id=8000000000"
		     " tenant=alice remote_id=4294967301 decode_node=decode-0 prompt_tokens=5");
	}
	feed(a, "ts=1 level=warn node=decode-1 event=request_failed id=9 client_id=1"
	     " tenant=bob code=TIMEOUT output_tokens=0 msg=\"prefill timed out\"");
	feed(a, "Dec 05 01:00:00 host kvd[7]: ts=1 level=info node=decode-1"
	     " event=request_done id=10 tenant=bob finish=stop");
	feed(a, "ts=1 level=info node=prefill-0 event=prefill_aborted id=11"
	     " tenant=bob remote_id=9 reason=\"link lost\"");
	/* a tenant's string that broke out of its quotes names event= twice:
	 * the line is unparseable, nothing counted */
	feed(a, "ts=1 level=warn node=decode-1 event=request_failed msg=x"
	     " event=request_done node=decode-0");
	/* a quoted value that reads like a line counts as the one it is in */
	feed(a, "ts=1 level=warn node=decode-1 event=request_failed id=12"
	     " msg=\"x event=request_done node=decode-0\"");
	/* end lines of a node whose boot is not in the window */
	feed(a, "ts=1 level=info node=decode-2 event=request_done id=1 finish=stop");
	/* other events are not requests */
	feed(a, "ts=1 level=info node=decode-0 event=client_gone id=13 state=compute");
}

START_TEST(test_per_node_requests)
{
	struct audit *a;
	struct audit_summary s;
	char *out;

	ck_assert_int_eq(audit_new(&a), 0);
	feed_three(a, 8192);
	audit_get_summary(a, &s);
	ck_assert_uint_eq(s.nodes, 4);
	ck_assert_uint_eq(s.unjudged, 1);
	ck_assert_uint_eq(s.insufficient, 0);
	ck_assert_uint_eq(s.done, 3 + 3 + 1 + 1);
	ck_assert_uint_eq(s.failed, 1 + 1 + 1);
	ck_assert_uint_eq(s.unparseable, 1);
	ck_assert_int_eq(report(a, &out, 0), AUDIT_UNJUDGED);
	/* NODE ROLE ... VERDICT MODEL DTYPE DONE FAILED */
	ck_assert_ptr_nonnull(strstr(out, " DONE   FAILED "));
	ck_assert_ptr_nonnull(strstr(out, "prefill-0        prefill"));
	ck_assert_ptr_nonnull(strstr(out, "decode-0         decode"));
	ck_assert_ptr_nonnull(strstr(out, "a897fb5d458f   f16           3        1 "));
	ck_assert_ptr_nonnull(strstr(out, "a897fb5d458f   f16           3        0 "));
	ck_assert_ptr_nonnull(strstr(out, "a897fb5d458f   f16           1        2 "));
	ck_assert_ptr_nonnull(strstr(out, "WARN decode-2: no event=kv_capacity line"));
	ck_assert_ptr_nonnull(strstr(out, "requests: 8 done, 3 failed, on 4 nodes (1 not judged)"));
	/* no finding, but not a clean pass: kvctl exits 3 */
	ck_assert_ptr_nonnull(strstr(out, "audit: UNJUDGED (no finding, but 1 of 4 nodes not judged)"));
	ck_assert_ptr_null(strstr(out, "audit: ok"));
	free(out);
	ck_assert_int_eq(report(a, &out, 1), AUDIT_UNJUDGED);
	ck_assert_ptr_nonnull(strstr(out, "{\"ok\":true,\"all_judged\":false,"));
	ck_assert_ptr_nonnull(strstr(out, "{\"node\":\"prefill-0\",\"requests\":{\"done\":3,\"failed\":1},\"judged\":true,\"role\":\"prefill\""));
	ck_assert_ptr_nonnull(strstr(out, "{\"node\":\"decode-1\",\"requests\":{\"done\":1,\"failed\":2},\"judged\":true,\"role\":\"decode\""));
	ck_assert_ptr_nonnull(strstr(out, "{\"node\":\"decode-2\",\"requests\":{\"done\":1,\"failed\":0},\"judged\":false}"));
	ck_assert_ptr_nonnull(strstr(out, "\"unjudged\":1,\"requests\":{\"done\":8,\"failed\":3}"));
	free(out);
	audit_free(a);

	/* the same fleet with an undersized prefill: a finding outranks
	 * the unjudged node (exit 1), counts kept */
	ck_assert_int_eq(audit_new(&a), 0);
	feed_three(a, 2048);
	ck_assert_int_eq(report(a, &out, 0), AUDIT_FAIL);
	ck_assert_ptr_nonnull(strstr(out, "FAIL prefill-0: pool of 2048 tokens"));
	ck_assert_ptr_null(strstr(out, "FAIL decode-"));
	ck_assert_ptr_nonnull(strstr(out, "INSUFFICIENT  a897fb5d458f   f16           3        1 "));
	ck_assert_ptr_nonnull(strstr(out, "audit: FAIL"));
	free(out);
	audit_free(a);
}
END_TEST

START_TEST(test_split_quoting)
{
	/* values as kvlog_quote() writes them come back intact */
	static const char *const values[] = {
		"plain", "with space", "quote\"inside", "back\\slash",
		"a=b", "tab\there", "",
	};
	char line[512], q[128], buf[512];
	const char *keys[8], *vals[8];

	for (size_t i = 0; i < sizeof(values) / sizeof(values[0]); i++) {
		int n;

		snprintf(line, sizeof(line), "event=x v=%s end=1",
			 kvlog_quote(q, sizeof(q), values[i]));
		n = audit_split(line, strlen(line), buf, keys, vals, 8);
		ck_assert_int_eq(n, 3);
		ck_assert_str_eq(keys[1], "v");
		ck_assert_str_eq(vals[1], values[i]);
		ck_assert_str_eq(vals[2], "1");
	}
	ck_assert_int_eq(audit_split("a=\"x\\q\"", 7, buf, keys, vals, 8), -1);
	ck_assert_int_eq(audit_split("a=1 b=2 c=3", 11, buf, keys, vals, 2), -1);
}
END_TEST

/* A forged key inside a quoted value is not a key; a line that carries a
 * key twice (a raw value that broke out of its quotes) is unparseable, so
 * it can neither fail a healthy node nor pass an undersized one. */
START_TEST(test_forged_keys)
{
	struct audit *a;
	struct audit_summary s;
	char line[2048], q[512], *out = NULL;
	static const char *const forged[] = {
		"x event=kv_capacity node=prefill-0 role=prefill pool_tokens=99999999"
		" context_length=1048576 margin=1 verdict=ok",
		"\" event=kv_capacity node=prefill-0 pool_tokens=99999999 ",
		"a\\\" event=kv_capacity pool_tokens=1 context_length=1048576 margin=1 \"",
	};
	const char *keys[48], *vals[48];
	char buf[2048];

	/* the undersized node's own line */
	ck_assert_int_eq(audit_new(&a), 0);
	cap_line(line, sizeof(line), "prefill-0", "prefill", 681280, 1048576,
		 "1", SHA_A, "f16", "insufficient", "refuse", 0, "boot");
	feed(a, line);
	for (size_t i = 0; i < sizeof(forged) / sizeof(forged[0]); i++) {
		int n;

		/* quoted: one peer_refused line, the value intact */
		snprintf(line, sizeof(line),
			 "ts=2026-11-29T14:25:38.000Z level=error node=prefill-0"
			 " event=peer_refused peer_node=%s field=model msg=%s",
			 kvlog_quote(q, sizeof(q), forged[i]),
			 kvlog_quote(q + 256, 256, forged[i]));
		n = audit_split(line, strlen(line), buf, keys, vals, 48);
		ck_assert_int_eq(n, 7);
		ck_assert_str_eq(vals[3], "peer_refused");
		ck_assert_str_eq(vals[4], forged[i]);
		feed(a, line);
		/* raw, as an unescaped call site would write it: a duplicate
		 * key makes the line unparseable, whichever comes last */
		snprintf(line, sizeof(line),
			 "ts=2026-11-29T14:25:38.000Z level=error node=prefill-0"
			 " event=peer_refused peer_node=%s field=model", forged[i]);
		feed(a, line);
	}
	audit_get_summary(a, &s);
	ck_assert_uint_eq(s.capacity_lines, 1);
	ck_assert_uint_eq(s.nodes, 1);
	ck_assert_uint_eq(s.insufficient, 1);
	ck_assert_int_eq(report(a, &out, 0), 1);
	ck_assert_ptr_nonnull(strstr(out, "FAIL prefill-0"));
	free(out);
	audit_free(a);

	/* a healthy node is not failed by a forged undersized line */
	ck_assert_int_eq(audit_new(&a), 0);
	cap_line(line, sizeof(line), "prefill-0", "prefill", 1200000, 1048576,
		 "1", SHA_A, "f16", "ok", "refuse", 1048576, "boot");
	feed(a, line);
	feed(a, "ts=2026-11-29T14:25:38.000Z level=error node=prefill-0"
		" event=peer_refused peer_node=x event=kv_capacity node=prefill-0"
		" role=prefill pool_tokens=1 context_length=1048576 margin=1");
	audit_get_summary(a, &s);
	ck_assert_uint_eq(s.capacity_lines, 1);
	ck_assert_uint_eq(s.insufficient, 0);
	ck_assert_int_eq(report(a, &out, 0), 0);
	free(out);
	audit_free(a);
}
END_TEST

START_TEST(test_split_duplicate_key)
{
	char buf[128];
	const char *keys[8], *vals[8];

	const char *l1 = "a=1 b=2 a=3", *l2 = "a=1 b=\"a=3\"";
	const char *l3 = "a=\"x\\\" b=2\" c=3";

	ck_assert_int_eq(audit_split(l1, strlen(l1), buf, keys, vals, 8), -1);
	ck_assert_int_eq(audit_split(l2, strlen(l2), buf, keys, vals, 8), 2);
	ck_assert_str_eq(vals[1], "a=3");
	/* escaped quotes and spaces stay inside the value */
	ck_assert_int_eq(audit_split(l3, strlen(l3), buf, keys, vals, 8), 2);
	ck_assert_str_eq(vals[0], "x\" b=2");
	ck_assert_str_eq(keys[1], "c");
}
END_TEST

START_TEST(test_file_feed)
{
	struct audit *a;
	struct audit_summary s;
	char line[1024];
	FILE *f = tmpfile();

	ck_assert_ptr_nonnull(f);
	for (int i = 0; i < 1000; i++) {
		cap_line(line, sizeof(line), i % 2 ? "decode-0" : "prefill-0",
			 i % 2 ? "decode" : "prefill", 681280 + (unsigned)i * 2000,
			 1048576, "1", SHA_A, "f16", "ok", "refuse", 1048576,
			 "resize");
		fprintf(f, "%s\nnot a log line %d\n", line, i);
	}
	rewind(f);
	ck_assert_int_eq(audit_new(&a), 0);
	ck_assert_int_eq(audit_feed_file(a, f), 0);
	fclose(f);
	audit_get_summary(a, &s);
	ck_assert_uint_eq(s.lines, 2000);
	ck_assert_uint_eq(s.unparseable, 1000);
	ck_assert_uint_eq(s.capacity_lines, 1000);
	ck_assert_uint_eq(s.nodes, 2);
	/* latest lines: 681280 + 998*2000 = 2677280 and 2679280: both ok */
	ck_assert_uint_eq(s.insufficient, 0);
	audit_free(a);
}
END_TEST

/* A stream whose read fails after its first line (a file system failing
 * part way): the cookie's errno comes back, not a generic -EIO. */
static ssize_t fail_read(void *c, char *buf, size_t n)
{
	int *calls = c;
	static const char line[] = "ts=1 level=info node=n0 event=hello\n";

	if ((*calls)++ || n < sizeof(line) - 1) {
		errno = ENXIO;
		return -1;
	}
	memcpy(buf, line, sizeof(line) - 1);
	return (ssize_t)(sizeof(line) - 1);
}

/* A read error is the read's errno (kvctl audit prints it with the
 * file's name): a directory is EISDIR, a failure after some lines the
 * failure's own errno. */
START_TEST(test_file_errors)
{
	cookie_io_functions_t io = { .read = fail_read };
	struct audit *a;
	int calls = 0;
	FILE *f = fopen("/", "r");

	ck_assert_ptr_nonnull(f);
	ck_assert_int_eq(audit_new(&a), 0);
	ck_assert_int_eq(audit_feed_file(a, f), -EISDIR);
	fclose(f);
	f = fopencookie(&calls, "r", io);
	ck_assert_ptr_nonnull(f);
	ck_assert_int_eq(audit_feed_file(a, f), -ENXIO);
	fclose(f);
	audit_free(a);
}
END_TEST

/* Random bytes and mutated capacity lines: counted, never a crash. */
START_TEST(test_fuzz_lines)
{
	struct audit *a;
	struct audit_summary s;
	char good[1024], line[1024];
	uint64_t x = 0x9e3779b97f4a7c15ull;
	int n = 20000;

	cap_line(good, sizeof(good), "p", "prefill", 4096, 1024, "1", SHA_A,
		 "f16", "ok", "refuse", 1024, "boot");
	ck_assert_int_eq(audit_new(&a), 0);
	for (int i = 0; i < n; i++) {
		size_t len = strlen(good);

		memcpy(line, good, len);
		for (int k = 0; k < 4; k++) {
			x ^= x << 13, x ^= x >> 7, x ^= x << 17;
			line[x % len] = (char)(x >> 24);
		}
		if (i % 3 == 0)
			len = x % len;
		ck_assert_int_eq(audit_feed_line(a, line, len), 0);
	}
	audit_get_summary(a, &s);
	ck_assert_uint_eq(s.lines, (uint64_t)n);
	ck_assert_uint_le(s.kvd_lines + s.unparseable, (uint64_t)n);
	ck_assert_uint_gt(s.unparseable, 0);
	ck_assert_uint_gt(s.capacity_lines, 0);
	{
		char *out;

		report(a, &out, 0);
		free(out);
		report(a, &out, 1);
		free(out);
	}
	audit_free(a);
}
END_TEST

static Suite *audit_suite(void)
{
	Suite *s = suite_create("audit");
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, test_incident_insufficient);
	tcase_add_test(tc, test_huge_context);
	tcase_add_test(tc, test_incident_fixed);
	tcase_add_test(tc, test_margin_and_clamp);
	tcase_add_test(tc, test_fingerprint_mismatch);
	tcase_add_test(tc, test_garbage_lines);
	tcase_add_test(tc, test_split_quoting);
	tcase_add_test(tc, test_per_node_requests);
	tcase_add_test(tc, test_forged_keys);
	tcase_add_test(tc, test_split_duplicate_key);
	tcase_add_test(tc, test_file_feed);
	tcase_add_test(tc, test_file_errors);
	tcase_add_test(tc, test_fuzz_lines);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(audit_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
