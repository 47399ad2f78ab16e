/* fuzz_audit.c - `kvctl audit`'s log reader (ctl/audit.h): audit_split,
 * audit_feed_line/_file and the reports, plus the kvlog_quote ->
 * audit_split round trip that the audit's correctness rests on.
 *
 * Logs are text anyone with a journal can shape (a node name, a model
 * path, a client's string quoted into a line). Properties:
 *   - audit_split: -1 or 0..max pairs; every key and value lies inside
 *     the caller's buffer, is NUL-terminated there, keys are non-empty;
 *   - feeding the input line by line and as a FILE gives the same
 *     summary (when it holds no NUL); the summary's counts are
 *     consistent (lines fed, kvd <= lines, capacity <= kvd,
 *     insufficient <= nodes); both reports return the same verdict,
 *     and it is AUDIT_FAIL exactly when a node is insufficient or the
 *     fleet disagrees, else AUDIT_UNJUDGED exactly when a node could
 *     not be judged, else AUDIT_OK;
 *   - any string (up to its first NUL) that kvlog_quote() writes as a
 *     value comes back byte for byte from audit_split.
 */
#include <errno.h>
#include <string.h>

#include "conf/log.h"
#include "ctl/audit.h"
#include "tests/fuzz/fuzz.h"

const char fuzz_target_name[] = "audit";

#define PAIRS 16

static void check_split(const char *line, size_t len)
{
	char *buf = malloc(len + 1);   /* (len + 1): the unquoted text */
	const char *keys[PAIRS], *vals[PAIRS];
	int n;

	if (!buf)
		abort();
	n = audit_split(line, len, buf, keys, vals, PAIRS);
	FUZZ_CHECK(n >= -1 && n <= PAIRS, "split: %d", n);
	for (int i = 0; i < n; i++) {
		FUZZ_CHECK(keys[i] >= buf && keys[i] < buf + len + 1 &&
			   vals[i] >= buf && vals[i] < buf + len + 1,
			   "pair %d outside the buffer", i);
		FUZZ_CHECK(memchr(keys[i], 0, (size_t)(buf + len + 1 - keys[i])) &&
			   memchr(vals[i], 0, (size_t)(buf + len + 1 - vals[i])),
			   "pair %d not terminated inside the buffer", i);
		FUZZ_CHECK(keys[i][0], "empty key %d", i);
	}
	free(buf);
}

static int report(struct audit *a, bool json, char **text)
{
	size_t len;
	FILE *fp = open_memstream(text, &len);
	int r;

	if (!fp)
		abort();
	r = json ? audit_report_json(a, fp) : audit_report(a, fp);
	fclose(fp);
	return r;
}

static void check_quote(const uint8_t *data, size_t size)
{
	size_t n = size < 256 ? size : 256;
	char s[257], q[256 * 4 + 8], line[256 * 4 + 64];
	char buf[sizeof(line)];
	const char *keys[PAIRS], *vals[PAIRS];

	memcpy(s, data, n);
	s[n] = '\0';
	kvlog_quote(q, sizeof(q), s);
	int ll = snprintf(line, sizeof(line), "ts=1 level=info event=fuzz v=%s x=1", q);
	int k = audit_split(line, (size_t)ll, buf, keys, vals, PAIRS);

	FUZZ_CHECK(k == 5, "quoted line split into %d pairs: %s", k, line);
	FUZZ_CHECK(!strcmp(keys[3], "v") && !strcmp(vals[3], s),
		   "kvlog_quote -> audit_split changed the value: %s", line);
	FUZZ_CHECK(!strcmp(vals[4], "1"), "the pair after the value broke");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct audit *a = NULL, *b = NULL;
	struct audit_summary sa, sb;
	const char *p = (const char *)data, *end = p + size;
	uint64_t fed = 0;
	char *t1 = NULL, *t2 = NULL;

	FUZZ_CHECK(audit_new(&a) == 0 && audit_new(&b) == 0, "audit_new");
	while (p < end) {
		const char *nl = memchr(p, '\n', (size_t)(end - p));
		size_t len = nl ? (size_t)(nl - p) : (size_t)(end - p);

		check_split(p, len);
		FUZZ_CHECK(audit_feed_line(a, p, len) == 0, "feed_line");
		fed++;
		p += len + (nl != NULL);
	}
	audit_get_summary(a, &sa);
	FUZZ_CHECK(sa.lines == fed, "%llu lines counted, %llu fed",
		   (unsigned long long)sa.lines, (unsigned long long)fed);
	FUZZ_CHECK(sa.kvd_lines + sa.unparseable <= sa.lines &&
		   sa.capacity_lines + sa.incomplete <= sa.kvd_lines &&
		   sa.unjudged <= sa.nodes &&
		   sa.insufficient <= sa.nodes - sa.unjudged &&
		   sa.nodes - sa.unjudged <= sa.capacity_lines,
		   "inconsistent summary");
	int v1 = report(a, false, &t1), v2 = report(a, true, &t2);

	FUZZ_CHECK(v1 == v2, "text verdict %d, json verdict %d", v1, v2);
	FUZZ_CHECK(v1 == (sa.insufficient || sa.model_mismatch || sa.dtype_mismatch ? AUDIT_FAIL
			  : sa.unjudged ? AUDIT_UNJUDGED : AUDIT_OK),
		   "verdict %d, insufficient %u, mismatch %d/%d, unjudged %u", v1,
		   sa.insufficient, sa.model_mismatch, sa.dtype_mismatch, sa.unjudged);
	free(t1);
	free(t2);

	if (!memchr(data, 0, size)) {
		FILE *fp = fmemopen((void *)data, size, "r");

		if (size && fp) {
			FUZZ_CHECK(audit_feed_file(b, fp) == 0, "feed_file");
			fclose(fp);
			audit_get_summary(b, &sb);
			FUZZ_CHECK(sb.kvd_lines == sa.kvd_lines &&
				   sb.capacity_lines == sa.capacity_lines &&
				   sb.unparseable == sa.unparseable &&
				   sb.nodes == sa.nodes &&
				   sb.insufficient == sa.insufficient,
				   "file and line feeding disagree");
		} else if (fp) {
			fclose(fp);
		}
	}
	check_quote(data, size);
	audit_free(a);
	audit_free(b);
	return 0;
}

/* More seeds are committed as text in tests/fuzz/corpus/audit/. */
void fuzz_target_seeds(fuzz_emit_fn emit, void *ctx)
{
	static const char log[] =
		"ts=2026-11-29T14:25:37.123Z level=info node=p0 event=kv_capacity"
		" role=prefill pool_tokens=681280 pages=42580 page_tokens=16"
		" page_bytes=2097216 kv_bytes_per_token=131072"
		" context_length=1048576 margin=1.0 required_tokens=1048576"
		" model=\"/srv/models/big model.gguf\" model_sha256=abc"
		" kv_dtype=f16 verdict=insufficient policy=refuse"
		" advertised_context=0 reason=pool\n"
		"Nov 29 14:25:38 host kvd[12]: ts=2 level=info node=d0"
		" event=kv_capacity role=decode pool_tokens=2000000 pages=125000"
		" page_tokens=16 page_bytes=1 kv_bytes_per_token=1"
		" context_length=1048576 margin=1.25 required_tokens=1310720"
		" model=m model_sha256=abd kv_dtype=f32 verdict=ok policy=clamp"
		" advertised_context=1048576 reason=\"a \\\"quoted\\\" \\x01\"\n"
		"garbage line without pairs\n\n"
		"ts=3 level=warn node=d0 event=admin_denied uid=1000\r\n";

	emit(ctx, log, sizeof(log) - 1);
	/* regression: context x margin >= 2^64 converted a double out of
	 * range (found here by libFuzzer, fixed in ad31dee) */
	static const char big[] = "event=kv_capacity node=a pool_tokens=1"
				  " context_length=18446744073709551615 margin=1";

	emit(ctx, big, sizeof(big) - 1);
}
