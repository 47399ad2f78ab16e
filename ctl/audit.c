/* audit.c - capacity audit of kvd logs.
 *
 * The incident this guards against: a node whose KV pool held 681,280
 * tokens served a 1,048,576-token context, and the operators inferred
 * safety from success statuses. The audit trusts only figures. For each
 * node it keeps the last two event=kv_capacity lines (boot, resize,
 * admin, peer all log one), recomputes the requirement from pool_tokens,
 * context_length, advertised_context and margin, and reports what changed
 * between the two lines, so "who shrank the pool" is one command away.
 *
 * Parsing follows conf/log.c: `key=value` words separated by spaces, a
 * value either bare or double-quoted with \" \\ and \xNN escapes. A line
 * is kept as its pairs, copied into one allocation (struct audit_rec).
 * Anything else is counted as unparseable and skipped: a log file is
 * evidence, and one torn line must not hide the rest. A line that
 * carries a key twice is unparseable too: kvd writes each key once, so a
 * second `event=` or `pool_tokens=` can only be an outside string that
 * escaped its quotes (an older kvd, or another program writing to the
 * same journal), and neither copy can be trusted.
 *
 * Many nodes at once: files of several nodes, or one journal stream that
 * interleaves them, are told apart by the node= every kvd line carries.
 * Besides the capacity lines each node's request end lines are counted
 * (audit_counts), so the report says, per node, what it served and what
 * failed; a node known only from such lines is listed but not judged.
 */
#include "ctl/audit.h"
#include "conf/util.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define AUDIT_PAIRS_MAX 48
#define AUDIT_LINE_MAX (64 * 1024)

/* One kv_capacity line: its pairs, pointing into text. */
struct audit_rec {
	uint64_t lineno;
	int n;
	const char *keys[AUDIT_PAIRS_MAX];
	const char *vals[AUDIT_PAIRS_MAX];
	char text[];                      /* unquoted pairs, NUL-separated */
};

struct audit_node {
	char name[128];
	struct audit_rec *latest;         /* NULL: no kv_capacity line yet */
	struct audit_rec *prev;
	uint64_t done, failed;            /* its request end lines */
};

/* The request end lines counted per node: one line per request that
 * ended answered or failed on that node (a client that left logs
 * client_gone instead; client-caused refusals past the log rate limit
 * are only summed in log_suppressed). */
static const struct audit_count {
	const char *event;
	bool failed;
} audit_counts[] = {
	{ "request_done", false },        /* decode, standalone */
	{ "request_failed", true },
	{ "prefill_served", false },      /* prefill: decode released it */
	{ "prefill_aborted", true },
};

/* The judgement of one node's latest line. */
struct audit_eval {
	uint64_t pool, context, served, required;
	double margin;
	bool ok;
	bool clamped;
	bool log_disagrees;               /* the verdict field says otherwise */
};

struct audit {
	struct audit_node *nodes;         /* (n_nodes) in order of appearance */
	uint32_t n_nodes, cap_nodes;
	struct audit_summary sum;
};

int audit_new(struct audit **out)
{
	*out = calloc(1, sizeof(**out));
	return *out ? 0 : -ENOMEM;
}

void audit_free(struct audit *a)
{
	if (!a)
		return;
	for (uint32_t i = 0; i < a->n_nodes; i++) {
		free(a->nodes[i].latest);
		free(a->nodes[i].prev);
	}
	free(a->nodes);
	free(a);
}

/* ---- splitting ------------------------------------------------------------- */

static bool audit_key_char(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
	       (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-';
}

static int audit_hex(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

int audit_split(const char *line, size_t len, char *buf, const char **keys,
		const char **vals, int max)
{
	size_t i = 0, o = 0;
	int n = 0;

	while (i < len) {
		size_t k0;

		while (i < len && line[i] == ' ')
			i++;
		if (i == len)
			break;
		k0 = i;
		while (i < len && audit_key_char(line[i]))
			i++;
		if (i == len || line[i] != '=' || i == k0) {
			/* a word without '=': allowed only before the pairs */
			if (n > 0)
				return -1;
			while (i < len && line[i] != ' ')
				i++;
			continue;
		}
		if (n == max)
			return -1;
		keys[n] = buf + o;
		memcpy(buf + o, line + k0, i - k0);
		o += i - k0;
		buf[o++] = '\0';
		for (int j = 0; j < n; j++)
			if (!strcmp(keys[j], keys[n]))
				return -1;        /* a key twice: forged */
		i++;                              /* '=' */
		vals[n] = buf + o;
		if (i < len && line[i] == '"') {
			i++;
			for (;;) {
				if (i == len)
					return -1;        /* unterminated quote */
				if (line[i] == '"') {
					i++;
					break;
				}
				if (line[i] == '\\') {
					int h, l;

					if (i + 1 == len)
						return -1;
					if (line[i + 1] == '"' || line[i + 1] == '\\') {
						buf[o++] = line[i + 1];
						i += 2;
						continue;
					}
					if (line[i + 1] != 'x' || i + 3 >= len ||
					    (h = audit_hex(line[i + 2])) < 0 ||
					    (l = audit_hex(line[i + 3])) < 0)
						return -1;
					buf[o++] = (char)(h << 4 | l);
					i += 4;
					continue;
				}
				buf[o++] = line[i++];
			}
			if (i < len && line[i] != ' ')
				return -1;
		} else {
			while (i < len && line[i] != ' ') {
				if (line[i] == '"')
					return -1;
				buf[o++] = line[i++];
			}
		}
		buf[o++] = '\0';
		n++;
	}
	return n > 0 ? n : -1;
}

static const char *rec_get(const struct audit_rec *r, const char *key)
{
	if (!r)
		return NULL;
	for (int i = r->n - 1; i >= 0; i--)   /* last one wins */
		if (!strcmp(r->keys[i], key))
			return r->vals[i];
	return NULL;
}

static int parse_double(const char *s, double *v)
{
	char *end;

	if (!s || !*s)
		return -1;
	errno = 0;
	*v = strtod(s, &end);
	return errno || *end || !isfinite(*v) ? -1 : 0;
}

/* ---- feeding ----------------------------------------------------------------- */

static struct audit_node *audit_node_get(struct audit *a, const char *name)
{
	struct audit_node *nn;

	for (uint32_t i = 0; i < a->n_nodes; i++)
		if (!strcmp(a->nodes[i].name, name))
			return &a->nodes[i];
	if (a->n_nodes == a->cap_nodes) {
		uint32_t cap = a->cap_nodes ? a->cap_nodes * 2 : 8;

		nn = realloc(a->nodes, cap * sizeof(*nn));
		if (!nn)
			return NULL;
		a->nodes = nn;
		a->cap_nodes = cap;
	}
	nn = &a->nodes[a->n_nodes++];
	memset(nn, 0, sizeof(*nn));
	snprintf(nn->name, sizeof(nn->name), "%s", name);
	return nn;
}

/* The figures a capacity line must carry to be judged. */
static bool rec_complete(const struct audit_rec *r)
{
	uint64_t u;
	double m;

	return rec_get(r, "node") && !kvd_parse_u64(rec_get(r, "pool_tokens"), &u) &&
	       !kvd_parse_u64(rec_get(r, "context_length"), &u) &&
	       !parse_double(rec_get(r, "margin"), &m);
}

/* A request end line (audit_counts) of the node it names: counted.
 * False when event is not one. 0 or -ENOMEM in *rc. */
static bool audit_count_line(struct audit *a, const struct audit_rec *r,
			     const char *event, int *rc)
{
	const char *name = rec_get(r, "node");
	struct audit_node *node;

	*rc = 0;
	for (size_t i = 0; i < KVD_ARRAY_SIZE(audit_counts); i++) {
		if (strcmp(event, audit_counts[i].event))
			continue;
		if (!name)
			return true;          /* no node to count it for */
		node = audit_node_get(a, name);
		if (!node) {
			*rc = -ENOMEM;
			return true;
		}
		if (audit_counts[i].failed)
			node->failed++;
		else
			node->done++;
		return true;
	}
	return false;
}

int audit_feed_line(struct audit *a, const char *line, size_t len)
{
	struct audit_rec *r;
	struct audit_node *node;
	const char *event;
	int n, rc;

	a->sum.lines++;
	while (len && (line[len - 1] == '\n' || line[len - 1] == '\r'))
		len--;
	if (len == 0)
		return 0;
	if (len > AUDIT_LINE_MAX) {
		a->sum.unparseable++;
		return 0;
	}
	r = malloc(sizeof(*r) + len + 1);
	if (!r)
		return -ENOMEM;
	r->lineno = a->sum.lines;
	n = audit_split(line, len, r->text, r->keys, r->vals, AUDIT_PAIRS_MAX);
	r->n = n;
	event = n > 0 ? rec_get(r, "event") : NULL;
	if (!event) {
		a->sum.unparseable++;
		free(r);
		return 0;
	}
	a->sum.kvd_lines++;
	if (strcmp(event, "kv_capacity")) {
		(void)audit_count_line(a, r, event, &rc);
		free(r);
		return rc;
	}
	if (!rec_complete(r)) {
		a->sum.incomplete++;
		free(r);
		return 0;
	}
	node = audit_node_get(a, rec_get(r, "node"));
	if (!node) {
		free(r);
		return -ENOMEM;
	}
	a->sum.capacity_lines++;
	free(node->prev);
	node->prev = node->latest;
	node->latest = r;
	return 0;
}

int audit_feed_file(struct audit *a, FILE *f)
{
	char *line = NULL;
	size_t cap = 0;
	ssize_t n;
	int r = 0;

	errno = 0;
	while ((n = getline(&line, &cap, f)) >= 0) {
		r = audit_feed_line(a, line, (size_t)n);
		if (r)
			break;
		errno = 0;
	}
	if (!r && ferror(f))
		r = errno ? -errno : -EIO;   /* the read's own errno */
	free(line);
	return r;
}

/* ---- judging ------------------------------------------------------------------- */

static void audit_eval(const struct audit_rec *r, struct audit_eval *e)
{
	uint64_t adv = 0;
	const char *verdict = rec_get(r, "verdict");
	double need;

	memset(e, 0, sizeof(*e));
	kvd_parse_u64(rec_get(r, "pool_tokens"), &e->pool);
	kvd_parse_u64(rec_get(r, "context_length"), &e->context);
	parse_double(rec_get(r, "margin"), &e->margin);
	if (e->margin < 1.0)
		e->margin = 1.0;    /* kvd refuses < 1; never judge laxer */
	/* A clamped node serves its advertised context; a refused one
	 * (advertised 0) serves nothing but was configured for the full
	 * context, which its pool cannot hold. */
	if (!kvd_parse_u64(rec_get(r, "advertised_context"), &adv) && adv > 0 &&
	    adv < e->context) {
		e->served = adv;
		e->clamped = true;
	} else {
		e->served = e->context;
	}
	/* In double first: context x margin may exceed 2^64, and converting
	 * an out-of-range double to an integer is undefined. Anything that
	 * large cannot fit any pool. */
	need = ceil((double)e->served * e->margin);
	e->required = !(need < 18446744073709551615.0) ? UINT64_MAX
						       : (uint64_t)need;
	e->ok = e->pool >= e->required;
	if (verdict) {
		bool log_ok = !strcmp(verdict, "ok");

		/* a clamped node logs insufficient for the configured
		 * context; that is not a disagreement */
		e->log_disagrees = e->clamped ? (log_ok && !e->ok)
					      : (log_ok != e->ok);
	}
}

static bool role_paired(const char *role)
{
	return role && (!strcmp(role, "prefill") || !strcmp(role, "decode"));
}

/* Fill summary findings; first_* name the first differing pair. */
static void audit_judge(struct audit *a, int *model_a, int *model_b,
			int *dtype_a, int *dtype_b)
{
	int ref_m = -1, ref_d = -1;

	a->sum.nodes = a->n_nodes;
	a->sum.unjudged = a->sum.insufficient = 0;
	a->sum.done = a->sum.failed = 0;
	a->sum.model_mismatch = a->sum.dtype_mismatch = false;
	*model_a = *model_b = *dtype_a = *dtype_b = -1;
	for (uint32_t i = 0; i < a->n_nodes; i++) {
		const struct audit_rec *r = a->nodes[i].latest;
		struct audit_eval e;
		const char *m, *d;

		a->sum.done += a->nodes[i].done;
		a->sum.failed += a->nodes[i].failed;
		if (!r) {
			a->sum.unjudged++;
			continue;
		}
		audit_eval(r, &e);
		if (!e.ok)
			a->sum.insufficient++;
		if (!role_paired(rec_get(r, "role")))
			continue;
		m = rec_get(r, "model_sha256");
		d = rec_get(r, "kv_dtype");
		if (m && ref_m < 0)
			ref_m = (int)i;
		else if (m && strcmp(m, rec_get(a->nodes[ref_m].latest,
						 "model_sha256")) &&
			 !a->sum.model_mismatch) {
			a->sum.model_mismatch = true;
			*model_a = ref_m;
			*model_b = (int)i;
		}
		if (d && ref_d < 0)
			ref_d = (int)i;
		else if (d && strcmp(d, rec_get(a->nodes[ref_d].latest,
						"kv_dtype")) &&
			 !a->sum.dtype_mismatch) {
			a->sum.dtype_mismatch = true;
			*dtype_a = ref_d;
			*dtype_b = (int)i;
		}
	}
}

void audit_get_summary(struct audit *a, struct audit_summary *s)
{
	int x, y, z, w;

	audit_judge(a, &x, &y, &z, &w);
	*s = a->sum;
}

static bool audit_failed(const struct audit *a)
{
	return a->sum.insufficient || a->sum.model_mismatch ||
	       a->sum.dtype_mismatch;
}

/* After audit_judge: a finding first, then an unjudged node. */
static enum audit_verdict audit_verdict(const struct audit *a)
{
	return audit_failed(a) ? AUDIT_FAIL : a->sum.unjudged ? AUDIT_UNJUDGED : AUDIT_OK;
}

/* Keys whose change is noise. */
static bool audit_key_volatile(const char *k)
{
	return !strcmp(k, "ts") || !strcmp(k, "level") || !strcmp(k, "event") ||
	       !strcmp(k, "node");
}

/* "key old->new, ..." between a node's two lines; "first line" if none. */
static void audit_changes(const struct audit_node *n, char *buf, size_t size,
			  bool *any)
{
	size_t o = 0;

	*any = false;
	buf[0] = '\0';
	if (!n->prev) {
		snprintf(buf, size, "first line");
		return;
	}
	for (int i = 0; i < n->latest->n && o + 1 < size; i++) {
		const char *k = n->latest->keys[i];
		const char *now = n->latest->vals[i];
		const char *was = rec_get(n->prev, k);
		int w;

		if (audit_key_volatile(k) || !strcmp(k, "reason") ||
		    (was && !strcmp(was, now)))
			continue;
		w = snprintf(buf + o, size - o, "%s%s %s->%s", *any ? ", " : "",
			     k, was ? was : "(none)", now);
		if (w < 0)
			break;
		o = KVD_MIN(o + (size_t)w, size - 1);
		*any = true;
	}
	for (int i = 0; i < n->prev->n && o + 1 < size; i++) {
		const char *k = n->prev->keys[i];
		int w;

		if (audit_key_volatile(k) || rec_get(n->latest, k))
			continue;
		w = snprintf(buf + o, size - o, "%s%s %s->(none)",
			     *any ? ", " : "", k, n->prev->vals[i]);
		if (w < 0)
			break;
		o = KVD_MIN(o + (size_t)w, size - 1);
		*any = true;
	}
	if (!*any)
		snprintf(buf, size, "no change");
}

static const char *or_q(const char *s)
{
	return s ? s : "?";
}

/* One node's row of the table: its latest capacity line's figures and
 * what changed, its request counts; a node without a capacity line
 * shows only its counts. */
static void audit_row(const struct audit_node *n, FILE *out)
{
	struct audit_eval e;
	char model[16], changes[1024];
	bool any;

	if (!n->latest) {
		fprintf(out, "%-16s %-10s %12s %10s %6s %12s %-13s %-14s %-6s %8" PRIu64
			" %8" PRIu64 " %s\n", n->name, "?", "-", "-", "-", "-",
			"UNJUDGED", "-", "-", n->done, n->failed,
			"no kv_capacity line");
		return;
	}
	audit_eval(n->latest, &e);
	audit_changes(n, changes, sizeof(changes), &any);
	snprintf(model, sizeof(model), "%.12s",
		 or_q(rec_get(n->latest, "model_sha256")));
	fprintf(out, "%-16s %-10s %12" PRIu64 " %10" PRIu64 " %6g %12" PRIu64
		" %-13s %-14s %-6s %8" PRIu64 " %8" PRIu64 " %s (%s)\n", n->name,
		or_q(rec_get(n->latest, "role")), e.pool, e.served,
		e.margin, e.required,
		e.ok ? (e.clamped ? "ok-clamped" : "ok") : "INSUFFICIENT",
		model, or_q(rec_get(n->latest, "kv_dtype")), n->done, n->failed,
		changes, or_q(rec_get(n->latest, "reason")));
}

/* One node's findings: FAIL (its pool), WARN (a verdict its figures
 * contradict, or no capacity line to judge), NOTE (clamped). */
static void audit_findings(const struct audit_node *n, FILE *out)
{
	struct audit_eval e;

	if (!n->latest) {
		fprintf(out, "WARN %s: no event=kv_capacity line, its pool is not"
			" judged (%" PRIu64 " done, %" PRIu64 " failed)\n",
			n->name, n->done, n->failed);
		return;
	}
	audit_eval(n->latest, &e);
	if (!e.ok)
		fprintf(out, "FAIL %s: pool of %" PRIu64 " tokens cannot hold"
			" context %" PRIu64 " x margin %g = %" PRIu64
			" tokens (line %" PRIu64 ")\n", n->name, e.pool,
			e.served, e.margin, e.required, n->latest->lineno);
	if (e.log_disagrees)
		fprintf(out, "WARN %s: the line's verdict=%s disagrees with"
			" its own figures\n", n->name,
			or_q(rec_get(n->latest, "verdict")));
	if (e.clamped)
		fprintf(out, "NOTE %s: context clamped from %" PRIu64
			" to %" PRIu64 "\n", n->name, e.context, e.served);
}

enum audit_verdict audit_report(struct audit *a, FILE *out)
{
	int ma, mb, da, db;

	audit_judge(a, &ma, &mb, &da, &db);
	fprintf(out, "%-16s %-10s %12s %10s %6s %12s %-13s %-14s %-6s %8s %8s %s\n",
		"NODE", "ROLE", "POOL_TOKENS", "CONTEXT", "MARGIN", "REQUIRED",
		"VERDICT", "MODEL", "DTYPE", "DONE", "FAILED", "CHANGED (reason)");
	for (uint32_t i = 0; i < a->n_nodes; i++)
		audit_row(&a->nodes[i], out);
	for (uint32_t i = 0; i < a->n_nodes; i++)
		audit_findings(&a->nodes[i], out);
	if (a->sum.model_mismatch)
		fprintf(out, "FAIL model fingerprint differs: %s has %s, %s has %s\n",
			a->nodes[ma].name,
			rec_get(a->nodes[ma].latest, "model_sha256"),
			a->nodes[mb].name,
			rec_get(a->nodes[mb].latest, "model_sha256"));
	if (a->sum.dtype_mismatch)
		fprintf(out, "FAIL kv dtype differs: %s has %s, %s has %s\n",
			a->nodes[da].name, rec_get(a->nodes[da].latest, "kv_dtype"),
			a->nodes[db].name, rec_get(a->nodes[db].latest, "kv_dtype"));
	if (a->sum.capacity_lines == 0)
		fprintf(out, "no event=kv_capacity line found\n");
	fprintf(out, "lines: %" PRIu64 " read, %" PRIu64 " kvd, %" PRIu64
		" capacity, %" PRIu64 " unparseable, %" PRIu64
		" incomplete capacity\n", a->sum.lines, a->sum.kvd_lines,
		a->sum.capacity_lines, a->sum.unparseable, a->sum.incomplete);
	fprintf(out, "requests: %" PRIu64 " done, %" PRIu64 " failed, on %u"
		" nodes (%u not judged)\n", a->sum.done, a->sum.failed,
		a->sum.nodes, a->sum.unjudged);
	if (audit_verdict(a) == AUDIT_UNJUDGED)
		fprintf(out, "audit: UNJUDGED (no finding, but %u of %u nodes not judged)\n",
			a->sum.unjudged, a->sum.nodes);
	else
		fprintf(out, "audit: %s\n", audit_failed(a) ? "FAIL" : "ok");
	return audit_verdict(a);
}

/* a NUL-ended string (NULL: "") as JSON */
static void json_s(FILE *out, const char *s)
{
	s = s ? s : "";
	kvd_json_str(out, s, strlen(s));
}

/* One node as a JSON object: its figures and verdict (judged: true), or
 * only its name and counts (judged: false, no capacity line). */
static void audit_node_json(const struct audit_node *n, FILE *out)
{
	struct audit_eval e;
	char changes[1024];
	bool any;

	fprintf(out, "{\"node\":");
	json_s(out, n->name);
	fprintf(out, ",\"requests\":{\"done\":%" PRIu64 ",\"failed\":%" PRIu64
		"},\"judged\":%s", n->done, n->failed, n->latest ? "true" : "false");
	if (!n->latest) {
		fprintf(out, "}");
		return;
	}
	audit_eval(n->latest, &e);
	audit_changes(n, changes, sizeof(changes), &any);
	fprintf(out, ",\"role\":");
	json_s(out, or_q(rec_get(n->latest, "role")));
	fprintf(out, ",\"pool_tokens\":%" PRIu64 ",\"context_length\":%"
		PRIu64 ",\"served_context\":%" PRIu64 ",\"margin\":%g,"
		"\"required_tokens\":%" PRIu64 ",\"ok\":%s,\"clamped\":%s,"
		"\"log_verdict\":", e.pool, e.context, e.served, e.margin,
		e.required, e.ok ? "true" : "false",
		e.clamped ? "true" : "false");
	json_s(out, or_q(rec_get(n->latest, "verdict")));
	fprintf(out, ",\"model_sha256\":");
	json_s(out, or_q(rec_get(n->latest, "model_sha256")));
	fprintf(out, ",\"kv_dtype\":");
	json_s(out, or_q(rec_get(n->latest, "kv_dtype")));
	fprintf(out, ",\"reason\":");
	json_s(out, or_q(rec_get(n->latest, "reason")));
	fprintf(out, ",\"changed\":");
	json_s(out, any ? changes : "");
	fprintf(out, ",\"line\":%" PRIu64 "}", n->latest->lineno);
}

enum audit_verdict audit_report_json(struct audit *a, FILE *out)
{
	int ma, mb, da, db;

	audit_judge(a, &ma, &mb, &da, &db);
	fprintf(out, "{\"ok\":%s,\"all_judged\":%s,\"nodes\":[", audit_failed(a) ? "false" : "true",
		a->sum.unjudged ? "false" : "true");
	for (uint32_t i = 0; i < a->n_nodes; i++) {
		fprintf(out, "%s", i ? "," : "");
		audit_node_json(&a->nodes[i], out);
	}
	fprintf(out, "],\"model_mismatch\":%s,\"dtype_mismatch\":%s,"
		"\"insufficient\":%u,\"unjudged\":%u,\"requests\":{\"done\":%"
		PRIu64 ",\"failed\":%" PRIu64 "},\"lines\":{\"read\":%" PRIu64
		",\"kvd\":%" PRIu64 ",\"capacity\":%" PRIu64 ",\"unparseable\":%"
		PRIu64 ",\"incomplete\":%" PRIu64 "}}\n",
		a->sum.model_mismatch ? "true" : "false",
		a->sum.dtype_mismatch ? "true" : "false", a->sum.insufficient,
		a->sum.unjudged, a->sum.done, a->sum.failed,
		a->sum.lines, a->sum.kvd_lines, a->sum.capacity_lines,
		a->sum.unparseable, a->sum.incomplete);
	return audit_verdict(a);
}
