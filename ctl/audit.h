/* audit.h - capacity audit of kvd logs (`kvctl audit`).
 *
 * Feed it log lines (files, or `journalctl -u 'kvd@*' -o cat`); it keeps,
 * per node, the latest event=kv_capacity line and the one before, and
 * judges each node from the figures in the line, not from its verdict
 * field: a node fails when pool_tokens < ceil(context x margin), where
 * context is the advertised (clamped) context when the node clamped, else
 * context_length. It also fails the fleet when prefill and decode nodes
 * disagree on model_sha256 or kv_dtype. Lines that are not key=value log
 * lines are counted, never fatal.
 *
 * It also counts each node's requests from their end lines: done
 * (request_done on decode and standalone nodes, prefill_served on
 * prefill ones) and failed (request_failed, prefill_aborted). A node
 * that logged requests but no kv_capacity line (a journal window that
 * starts after its boot) is listed unjudged: a warning, not a failure,
 * but not a clean pass either (AUDIT_UNJUDGED: kvctl exits 3), so a
 * script cannot take an unjudged pool for a judged one.
 *
 * Errors: negative errno (ENOMEM, read errors). Thread: one owner.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

struct audit;

struct audit_summary {
	uint64_t lines;          /* lines read (empty ones included) */
	uint64_t kvd_lines;      /* key=value lines with an event */
	uint64_t capacity_lines; /* usable event=kv_capacity lines */
	uint64_t unparseable;    /* not key=value, or no event */
	uint64_t incomplete;     /* kv_capacity lines missing a figure */
	uint32_t nodes;          /* every node named, judged or not */
	uint32_t unjudged;       /* nodes without a usable kv_capacity line */
	uint32_t insufficient;   /* nodes whose pool cannot hold the context */
	uint64_t done, failed;   /* request end lines, all nodes */
	bool model_mismatch;     /* prefill/decode model_sha256 differ */
	bool dtype_mismatch;     /* prefill/decode kv_dtype differ */
};

int audit_new(struct audit **out);
void audit_free(struct audit *a);

/* One line, without its newline (a trailing '\n' or '\r' is ignored). */
int audit_feed_line(struct audit *a, const char *line, size_t len);
/* Every line of f. Lines longer than 64 KiB count as unparseable. 0,
 * the negative errno of a failed read (EISDIR for a directory), or
 * -ENOMEM. */
int audit_feed_file(struct audit *a, FILE *f);

void audit_get_summary(struct audit *a, struct audit_summary *s);

/* The verdict: a finding (a node insufficient, the fleet disagreeing)
 * outranks an unjudged node. */
enum audit_verdict {
	AUDIT_OK = 0,            /* every node judged, none failed */
	AUDIT_FAIL = 1,          /* a finding */
	AUDIT_UNJUDGED = 2,      /* no finding, but a node could not be judged */
};

/* Print the table and the findings; the verdict. */
enum audit_verdict audit_report(struct audit *a, FILE *out);
/* Same verdict; one JSON object ("ok": no finding, "all_judged"). */
enum audit_verdict audit_report_json(struct audit *a, FILE *out);

/* Split one log line into key=value pairs (values unquoted as
 * kvlog_quote() writes them). Leading words without '=' (a syslog or
 * journal prefix) are skipped. Returns the number of pairs (<= max), or
 * -1 when the line is not a key=value line or names a key twice. keys/vals point into `buf`
 * (size >= len + 1), which receives the unquoted text. */
int audit_split(const char *line, size_t len, char *buf, const char **keys,
		const char **vals, int max);
