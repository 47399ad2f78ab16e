/* metrics.c - Prometheus metrics: recording and the text exposition.
 *
 * Design. Every figure is a plain integer or a fixed-bucket histogram in
 * struct kvd_metrics (or one the node already keeps: pool stats,
 * capacity, counters), updated on the loop thread where the event
 * happens; rendering walks them once and prints text. No registry, no
 * allocation per event, no locks.
 *
 * Names follow vLLM's (vllm:time_to_first_token_seconds,
 * vllm:inter_token_latency_seconds, vllm:prompt_tokens_total, ...) with
 * the prefix kvd_ instead of vllm: - a colon is reserved for recording
 * rules and promtool's linter refuses it in exported names - so a vLLM
 * dashboard ports by renaming the prefix. Units are base units
 * (seconds, bytes), counters end in _total.
 *
 * vLLM's own names too (render_vllm, http.metrics_vllm_names, on by
 * default): dashboards and autoscalers built for vLLM query
 * vllm:num_requests_running{model_name=...} and the like verbatim, and
 * a scrape is their only interface - recording rules that rename
 * kvd_ series would have to be installed in every Prometheus that
 * scrapes a node. So the same figures are also printed under vLLM's
 * names, summed over tenants, labelled model_name (http.model_name):
 * one more set of series (about 80 lines), no second bookkeeping. The
 * exposition format allows the colon (promtool's lint only warns); an
 * operator whose pipeline refuses it turns the switch off.
 *
 * Cardinality is bounded by construction: tenants (32 slots, the rest
 * folded into "other"), outcomes, integrity kinds, page states, reasons
 * and directions are fixed sets. Tenant names are the only outside
 * strings in the text; they are escaped as the format requires (\\ \"
 * \n) and anything that is not printable UTF-8 becomes U+FFFD, so a
 * tenant name cannot end a label value or forge a line.
 */
#include "daemon/node/metrics.h"
#include "conf/util.h"
#include "daemon/node/daemon.h"
#include "gpu/kv/pcache.h"
#include "kvd_build.h"
#include "net/wire/proto_client.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(KVD_OUTCOME__N == KVD_OUTCOME_ERR0 + PROTO_ERR__N - 1,
	       "one outcome per error code");

/* ---- histograms ------------------------------------------------------------ */

struct hist_def {
	const double *b;    /* (n) upper bounds, increasing */
	unsigned n;
};

static const double ttft_b[] = { 0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08,
	0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0 };
static const double itl_b[] = { 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
	0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0 };
static const double e2e_b[] = { 0.01, 0.025, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0,
	1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0 };
static const double xfer_b[] = { 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
	0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0 };

#define HDEF(a) { a, sizeof(a) / sizeof(a[0]) }
static const struct hist_def h_ttft = HDEF(ttft_b), h_itl = HDEF(itl_b),
	h_e2e = HDEF(e2e_b), h_xfer = HDEF(xfer_b);

static void hist_observe(struct kvd_hist *h, const struct hist_def *d,
			 uint64_t ns)
{
	double v = (double)ns / 1e9;
	unsigned i = 0;

	while (i < d->n && v > d->b[i])
		i++;
	h->counts[i]++;      /* i == n: +Inf */
	h->count++;
	h->sum += v;
}

/* ---- recording ------------------------------------------------------------- */

static const char *const outcome_names[KVD_OUTCOME__N] = {
	"stop", "length", "abandoned",
	[KVD_OUTCOME_ERR0 + PROTO_ERR_PROMPT_TOO_LONG - 1] = "prompt_too_long",
	[KVD_OUTCOME_ERR0 + PROTO_ERR_INVALID_REQUEST - 1] = "invalid_request",
	[KVD_OUTCOME_ERR0 + PROTO_ERR_OVERLOADED - 1] = "overloaded",
	[KVD_OUTCOME_ERR0 + PROTO_ERR_DRAINING - 1] = "draining",
	[KVD_OUTCOME_ERR0 + PROTO_ERR_NO_PREFILL_PEER - 1] = "no_prefill_peer",
	[KVD_OUTCOME_ERR0 + PROTO_ERR_INTEGRITY - 1] = "integrity",
	[KVD_OUTCOME_ERR0 + PROTO_ERR_TIMEOUT - 1] = "timeout",
	[KVD_OUTCOME_ERR0 + PROTO_ERR_INTERNAL - 1] = "internal",
};

const char *kvd_metrics_outcome_name(unsigned i)
{
	return i < KVD_OUTCOME__N && outcome_names[i] ? outcome_names[i] : "?";
}

static const char *const integrity_names[KVD_INTEGRITY__N] = {
	[KVD_INTEGRITY_TAG] = "tag", [KVD_INTEGRITY_CHECKSUM] = "checksum",
	[KVD_INTEGRITY_MAC] = "mac", [KVD_INTEGRITY_TRANSFER] = "transfer",
	[KVD_INTEGRITY_PEER] = "peer",
};

static const char *const peer_auth_names[KVD_PEER_AUTH__N] = {
	[KVD_PEER_AUTH_PROOF] = "proof", [KVD_PEER_AUTH_TOKEN] = "token",
	[KVD_PEER_AUTH_FRAME] = "frame", [KVD_PEER_AUTH_BATCH] = "batch",
};

/* The slot of a tenant: found, newly registered while there is room
 * (the last slot is kept for "other"), else "other". Every call counts
 * one event of a request, so `fold` says whether to count it folded. */
static struct kvd_metrics_tenant *tenant_slot(struct kvd_metrics *m,
					      const char *name, bool fold)
{
	if (!name || !name[0])
		name = KVD_TENANT_DEFAULT;
	/* names are kept cut to KVD_TENANT_MAX - 1 bytes: compare that much
	 * (a longer name matches its cut), copy only to register */
	for (uint32_t i = 0; i < m->n_tenants; i++)
		if (strncmp(m->tenants[i].name, name, KVD_TENANT_MAX - 1) == 0)
			return &m->tenants[i];
	bool is_other = strncmp(name, KVD_TENANT_OTHER, KVD_TENANT_MAX - 1) == 0;
	if (m->n_tenants < KVD_METRICS_TENANTS - 1 && !is_other) {
		struct kvd_metrics_tenant *t = &m->tenants[m->n_tenants++];

		memset(t, 0, sizeof(*t));
		snprintf(t->name, sizeof(t->name), "%s", name);
		return t;
	}
	/* "other": the last slot, named on first use */
	struct kvd_metrics_tenant *o = &m->tenants[KVD_METRICS_TENANTS - 1];
	if (!o->name[0])
		snprintf(o->name, sizeof(o->name), "%s", KVD_TENANT_OTHER);
	if (fold && !is_other)
		m->tenants_folded++;
	return o;
}

void kvd_metrics_request_end(struct kvd_metrics *m, const char *tenant,
			     const char *finish, int code, uint64_t e2e_ns)
{
	struct kvd_metrics_tenant *t = tenant_slot(m, tenant, true);
	unsigned o;

	if (finish && !strcmp(finish, "stop"))
		o = KVD_OUTCOME_STOP;
	else if (finish && !strcmp(finish, "length"))
		o = KVD_OUTCOME_LENGTH;
	else if (code > 0 && code < PROTO_ERR__N)
		o = KVD_OUTCOME_ERR0 + (unsigned)code - 1;
	else if (code == 0)
		o = KVD_OUTCOME_ABANDONED;
	else
		o = KVD_OUTCOME_ERR0 + PROTO_ERR_INTERNAL - 1;
	t->requests[o]++;
	if (e2e_ns)
		hist_observe(&t->e2e, &h_e2e, e2e_ns);
}

void kvd_metrics_token(struct kvd_metrics *m, const char *tenant, bool first,
		       uint32_t prompt_tokens, uint64_t ns)
{
	struct kvd_metrics_tenant *t = tenant_slot(m, tenant, false);

	t->generation_tokens++;
	if (first) {
		t->prompt_tokens += prompt_tokens;
		hist_observe(&t->ttft, &h_ttft, ns);
	} else {
		hist_observe(&t->itl, &h_itl, ns);
	}
}

void kvd_metrics_integrity(struct kvd_metrics *m, enum kvd_integrity_kind k)
{
	if ((unsigned)k < KVD_INTEGRITY__N)
		m->integrity[k]++;
}

void kvd_metrics_peer_auth(struct kvd_metrics *m, enum kvd_peer_auth_kind k)
{
	if ((unsigned)k < KVD_PEER_AUTH__N)
		m->peer_auth[k]++;
}

void kvd_metrics_xfer_batch(struct kvd_metrics *m, int dir, uint64_t bytes)
{
	dir = dir == KVD_XFER_RECV;
	m->xfer_bytes[dir] += bytes;
	m->xfer_batches[dir]++;
}

void kvd_metrics_xfer_time(struct kvd_metrics *m, int dir, uint64_t ns)
{
	hist_observe(&m->xfer_time[dir == KVD_XFER_RECV], &h_xfer, ns);
}

/* ---- escaping -------------------------------------------------------------- */

size_t kvd_metrics_escape(const char *in, char *out, size_t outsz)
{
	const unsigned char *s = (const unsigned char *)in;
	size_t n = strlen(in), need = 0, wrote = 0;
	bool full = outsz == 0;

	for (size_t i = 0; i < n;) {
		size_t l = kvd_utf8_len(in + i, n - i);
		const char *piece = (const char *)s + i;
		size_t pl = l;

		if (s[i] == '\\')
			piece = "\\\\", pl = 2;
		else if (s[i] == '"')
			piece = "\\\"", pl = 2;
		else if (s[i] == '\n')
			piece = "\\n", pl = 2;
		else if (l == 0 || s[i] < 0x20 || s[i] == 0x7F)
			piece = "\xEF\xBF\xBD", pl = 3;
		/* whole pieces only: a cut never splits an escape or a char */
		if (!full && wrote + pl < outsz) {
			memcpy(out + wrote, piece, pl);
			wrote += pl;
		} else {
			full = true;
		}
		need += pl;
		i += l ? l : 1;
	}
	if (outsz)
		out[wrote] = '\0';
	return need;
}

/* ---- the text ------------------------------------------------------------ */

struct text {
	char *p;
	size_t len, cap;
	bool oom;
};

static void tx(struct text *t, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
static void tx(struct text *t, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (t->oom)
		return;
	for (;;) {
		va_start(ap, fmt);
		n = vsnprintf(t->p + t->len, t->cap - t->len, fmt, ap);
		va_end(ap);
		if (n < 0) {
			t->oom = true;
			return;
		}
		if ((size_t)n < t->cap - t->len) {
			t->len += (size_t)n;
			return;
		}
		size_t cap = t->cap * 2 + (size_t)n;
		char *np = realloc(t->p, cap);
		if (!np) {
			t->oom = true;
			return;
		}
		t->p = np;
		t->cap = cap;
	}
}

static void family(struct text *t, const char *name, const char *type,
		   const char *help)
{
	tx(t, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void one(struct text *t, const char *name, const char *type,
		const char *help, double v)
{
	family(t, name, type, help);
	tx(t, "%s %.17g\n", name, v);
}

static void one_u(struct text *t, const char *name, const char *type,
		  const char *help, uint64_t v)
{
	family(t, name, type, help);
	tx(t, "%s %" PRIu64 "\n", name, v);
}

/* name_bucket{labels,le=".."} for each bound and +Inf, _sum, _count.
 * labels: "" or `key="escaped",` (with the trailing comma). */
static void hist_samples(struct text *t, const char *name, const char *labels,
			 const struct kvd_hist *h, const struct hist_def *d)
{
	uint64_t cum = 0;
	size_t ll = strlen(labels);

	for (unsigned i = 0; i < d->n; i++) {
		cum += h->counts[i];
		tx(t, "%s_bucket{%sle=\"%g\"} %" PRIu64 "\n", name, labels,
		   d->b[i], cum);
	}
	cum += h->counts[d->n];
	tx(t, "%s_bucket{%sle=\"+Inf\"} %" PRIu64 "\n", name, labels, cum);
	/* _sum and _count carry the labels without the trailing comma */
	if (ll)
		tx(t, "%s_sum{%.*s} %.17g\n%s_count{%.*s} %" PRIu64 "\n", name,
		   (int)(ll - 1), labels, h->sum, name, (int)(ll - 1), labels,
		   h->count);
	else
		tx(t, "%s_sum %.17g\n%s_count %" PRIu64 "\n", name, h->sum,
		   name, h->count);
}

enum tenant_hist { TH_TTFT, TH_ITL, TH_E2E };

static void tenant_hist(struct text *t, const struct kvd_metrics *m,
			const char *name, const char *help, enum tenant_hist which)
{
	const struct hist_def *d = which == TH_TTFT ? &h_ttft
				   : which == TH_ITL ? &h_itl : &h_e2e;

	family(t, name, "histogram", help);
	for (uint32_t i = 0; i < KVD_METRICS_TENANTS; i++) {
		const struct kvd_metrics_tenant *tn = &m->tenants[i];
		char esc[KVD_TENANT_MAX * 3 + 1], labels[sizeof(esc) + 16];

		if (!tn->name[0])
			continue;
		kvd_metrics_escape(tn->name, esc, sizeof(esc));
		snprintf(labels, sizeof(labels), "tenant=\"%s\",", esc);
		hist_samples(t, name, labels,
			     which == TH_TTFT ? &tn->ttft
			     : which == TH_ITL ? &tn->itl : &tn->e2e, d);
	}
}

static void render_tenants(struct text *t, const struct kvd_metrics *m)
{
	family(t, "kvd_requests_total", "counter",
	       "Client requests that ended, by tenant and outcome (stop, length, abandoned: the client left first, or the error code).");
	for (uint32_t i = 0; i < KVD_METRICS_TENANTS; i++) {
		const struct kvd_metrics_tenant *tn = &m->tenants[i];
		char esc[KVD_TENANT_MAX * 3 + 1];

		if (!tn->name[0])
			continue;
		kvd_metrics_escape(tn->name, esc, sizeof(esc));
		for (unsigned o = 0; o < KVD_OUTCOME__N; o++)
			tx(t, "kvd_requests_total{tenant=\"%s\",outcome=\"%s\"} %" PRIu64 "\n",
			   esc, outcome_names[o], tn->requests[o]);
	}
	static const struct { const char *name, *help; size_t off; } tok[] = {
		{ "kvd_prompt_tokens_total", "Prompt tokens prefilled, by tenant.",
		  offsetof(struct kvd_metrics_tenant, prompt_tokens) },
		{ "kvd_generation_tokens_total", "Tokens generated, by tenant.",
		  offsetof(struct kvd_metrics_tenant, generation_tokens) },
	};
	for (size_t k = 0; k < 2; k++) {
		family(t, tok[k].name, "counter", tok[k].help);
		for (uint32_t i = 0; i < KVD_METRICS_TENANTS; i++) {
			const struct kvd_metrics_tenant *tn = &m->tenants[i];
			char esc[KVD_TENANT_MAX * 3 + 1];
			uint64_t v;

			if (!tn->name[0])
				continue;
			memcpy(&v, (const char *)tn + tok[k].off, sizeof(v));
			kvd_metrics_escape(tn->name, esc, sizeof(esc));
			tx(t, "%s{tenant=\"%s\"} %" PRIu64 "\n", tok[k].name, esc, v);
		}
	}
	tenant_hist(t, m, "kvd_time_to_first_token_seconds",
		    "Time from a request's arrival to its first token, by tenant.", TH_TTFT);
	tenant_hist(t, m, "kvd_inter_token_latency_seconds",
		    "Time between two tokens of a request, by tenant.", TH_ITL);
	tenant_hist(t, m, "kvd_e2e_request_latency_seconds",
		    "Time from a request's arrival to its end, by tenant.", TH_E2E);
	one_u(t, "kvd_metrics_tenants_folded_total", "counter",
	      "Requests counted under tenant=\"other\" because the tenant label sets were full.",
	      m->tenants_folded);
}

static void render_node(struct text *t, struct kvd_daemon *d)
{
	char node[sizeof(d->cfg.node_name) * 3 + 1];
	static const char *const states[] = { "starting", "ready", "draining",
					      "drained", "stopping" };

	kvd_metrics_escape(d->cfg.node_name, node, sizeof(node));
	family(t, "kvd_info", "gauge", "The node: name, role, version, model, chat format (value 1).");
	tx(t, "kvd_info{node=\"%s\",role=\"%s\",version=\"%s\",model_sha256=\"%s\",chat_template=\"%s\"} 1\n",
	   node, kvd_role_name(d->cfg.role), KVD_VERSION, d->model_sha256,
	   chat_format_name(d->chat_format));
	family(t, "kvd_node_state", "gauge", "1 for the node's state, 0 for the others.");
	for (int i = 0; i < 5; i++)
		tx(t, "kvd_node_state{state=\"%s\"} %d\n", states[i],
		   (int)d->state == i);
	one_u(t, "kvd_num_requests_running", "gauge",
	      "Admitted requests not yet ended.", d->in_flight);
	one_u(t, "kvd_peers_up", "gauge",
	      "Peers with a completed handshake.", d->peers.up);
}

/* Fraction of the live KV pages not free (0-1). */
static double pool_usage(const struct kvpool_stats *st)
{
	return st->pages ? 1.0 - (double)st->by_state[KVPAGE_FREE] / st->pages : 0.0;
}

static void render_pool(struct text *t, struct kvd_daemon *d)
{
	static const char *const names[KVPAGE_N_STATES] = {
		[KVPAGE_FREE] = "free", [KVPAGE_RESERVED] = "reserved",
		[KVPAGE_FILLING] = "filling", [KVPAGE_READY] = "ready",
		[KVPAGE_FENCED] = "fenced", [KVPAGE_QUARANTINED] = "quarantined",
		[KVPAGE_RETIRED] = "retired",
		[KVPAGE_CACHED] = "cached",
	};
	struct kvpool_stats st = { 0 };
	const struct kvd_capacity *c = &d->cap;

	if (d->pool)
		kvpool_get_stats(d->pool, &st);
	family(t, "kvd_kv_pages", "gauge", "KV pool pages by state.");
	for (int i = 0; i < KVPAGE_N_STATES; i++)
		tx(t, "kvd_kv_pages{state=\"%s\"} %u\n", names[i], st.by_state[i]);
	one_u(t, "kvd_kv_pages_retiring", "gauge",
	      "Pages in use that retire when released (a shrink).", st.retiring);
	one(t, "kvd_kv_cache_usage_perc", "gauge",
	    "Fraction of live KV pages not free (0-1).", pool_usage(&st));
	one_u(t, "kvd_kv_pool_pages", "gauge", "Live KV pages.", st.pages);
	one_u(t, "kvd_kv_pool_tokens", "gauge", "KV positions the pool holds.",
	      c->pool_tokens);
	one_u(t, "kvd_kv_page_tokens", "gauge", "Positions per KV page.",
	      c->page_tokens);
	one_u(t, "kvd_kv_page_bytes", "gauge", "Bytes per KV page.", c->page_bytes);
	one_u(t, "kvd_context_length_tokens", "gauge",
	      "Configured context length (or the model's).", c->context_length);
	one_u(t, "kvd_kv_required_tokens", "gauge",
	      "Pool positions the capacity check requires (context x margin).",
	      c->required_tokens);
	one_u(t, "kvd_advertised_context_tokens", "gauge",
	      "Context this node admits (clamped when the pool is short and the policy clamps).",
	      c->advertised_context);
	one_u(t, "kvd_path_context_tokens", "gauge",
	      "Context admitted on the path through the peers.", c->path_context);
	one_u(t, "kvd_capacity_ok", "gauge",
	      "1 when the pool holds the context x margin (the last capacity check).",
	      c->ok ? 1 : 0);
	one_u(t, "kvd_peer_min_pool_tokens", "gauge",
	      "The smallest peer's KV pool in positions (0: no peer).",
	      d->peers.min_pool_tokens);
}

/* The tenant gate's queues (struct kvd_queue_hook): how many wait, in
 * all and by tenant (past the request series' bound: "other"). */
static void render_waiting(struct text *t, struct kvd_daemon *d)
{
	const struct kvd_queue_hook *h = &d->queue;
	struct { char name[KVD_TENANT_MAX]; uint64_t n; } by[KVD_METRICS_TENANTS];
	struct kvd_waiting *w = NULL;
	uint32_t n = h->waiting ? h->waiting(h->arg, NULL, 0) : 0, nt = 0;

	one_u(t, "kvd_num_requests_waiting", "gauge",
	      "Requests waiting at the tenant gate for admission.", n);
	if (n)
		w = calloc(n, sizeof(*w));
	if (n && !w) {
		t->oom = true;
		return;
	}
	n = w ? KVD_MIN(n, h->waiting(h->arg, w, n)) : 0;
	for (uint32_t i = 0; i < n; i++) {
		uint32_t k = 0;

		while (k < nt && strcmp(by[k].name, w[i].tenant))
			k++;
		if (k == nt && nt == KVD_METRICS_TENANTS - 1) {
			k = nt++;
			snprintf(by[k].name, sizeof(by[k].name), "%s", KVD_TENANT_OTHER);
			by[k].n = 0;
		} else if (k == nt && nt < KVD_METRICS_TENANTS - 1) {
			k = nt++;
			snprintf(by[k].name, sizeof(by[k].name), "%s", w[i].tenant);
			by[k].n = 0;
		} else if (k == nt) {
			k = nt - 1;   /* "other" */
		}
		by[k].n++;
	}
	free(w);
	family(t, "kvd_requests_waiting", "gauge",
	       "Requests waiting at the tenant gate, by tenant.");
	for (uint32_t k = 0; k < nt; k++) {
		char esc[KVD_TENANT_MAX * 3 + 1];

		kvd_metrics_escape(by[k].name, esc, sizeof(esc));
		tx(t, "kvd_requests_waiting{tenant=\"%s\"} %" PRIu64 "\n", esc, by[k].n);
	}
}

/* The prefix cache, by tenant (gpu/kv/pcache.h): its own tenants' counters,
 * labelled as the request series are. */
static void render_cache(struct text *t, struct kvd_daemon *d)
{
	static const struct { const char *name, *type, *help; size_t off; } f[] = {
		{ "kvd_prefix_cache_pages", "gauge", "KV pages the prefix cache holds, by tenant.",
		  offsetof(struct pcache_tenant_stats, pages) },
		{ "kvd_prefix_cache_lookups_total", "counter", "Requests that looked in their tenant's prefix cache.",
		  offsetof(struct pcache_tenant_stats, lookups) },
		{ "kvd_prefix_cache_hits_total", "counter", "Lookups that reused at least one cached page.",
		  offsetof(struct pcache_tenant_stats, hits) },
		{ "kvd_prefix_cache_misses_total", "counter", "Lookups that reused nothing.",
		  SIZE_MAX },
		{ "kvd_prefix_cache_hit_tokens_total", "counter", "Prompt tokens read from the prefix cache.",
		  offsetof(struct pcache_tenant_stats, hit_tokens) },
		{ "kvd_prefix_cache_evictions_total", "counter", "Cached pages evicted (LRU, quota or flush).",
		  offsetof(struct pcache_tenant_stats, evictions) },
	};
	struct pcache_tenant_stats *ts;
	uint32_t n;

	if (!d->cache)
		return;
	ts = calloc(PCACHE_TENANTS_MAX, sizeof(*ts));
	if (!ts) {
		t->oom = true;
		return;
	}
	n = pcache_stats(d->cache, NULL, NULL, ts, PCACHE_TENANTS_MAX);
	/* the request series' bound: past it, tenants fold into "other" */
	if (n > KVD_METRICS_TENANTS) {
		struct pcache_tenant_stats *o = &ts[KVD_METRICS_TENANTS - 1];

		for (uint32_t i = KVD_METRICS_TENANTS; i < n; i++) {
			o->pages += ts[i].pages;
			o->lookups += ts[i].lookups;
			o->hits += ts[i].hits;
			o->hit_tokens += ts[i].hit_tokens;
			o->evictions += ts[i].evictions;
		}
		snprintf(o->tenant, sizeof(o->tenant), "other");
		n = KVD_METRICS_TENANTS;
	}
	for (size_t k = 0; k < KVD_ARRAY_SIZE(f); k++) {
		family(t, f[k].name, f[k].type, f[k].help);
		for (uint32_t i = 0; i < n; i++) {
			char esc[PCACHE_TENANT_MAX * 3 + 1];
			uint64_t v;

			if (f[k].off == SIZE_MAX) {
				v = ts[i].lookups - ts[i].hits;
			} else if (f[k].off == offsetof(struct pcache_tenant_stats, pages)) {
				v = ts[i].pages;
			} else {
				memcpy(&v, (const char *)&ts[i] + f[k].off, sizeof(v));
			}
			kvd_metrics_escape(ts[i].tenant, esc, sizeof(esc));
			tx(t, "%s{tenant=\"%s\"} %" PRIu64 "\n", f[k].name, esc, v);
		}
	}
	free(ts);
}

/* The label set is the fixed names of net/wire/openai.h. */
static void render_http(struct text *t, const struct kvd_metrics *m)
{
	family(t, "kvd_http_ignored_fields_total", "counter",
	       "HTTP request fields accepted and ignored because they cannot change the output (OpenAI's user, metadata, store, service_tier, ...), by field.");
	for (unsigned i = 0; i < OPENAI_IGNORED__N; i++)
		tx(t, "kvd_http_ignored_fields_total{field=\"%s\"} %" PRIu64 "\n",
		   openai_ignored_name(i), m->http_ignored[i]);
}

static void render_counters(struct text *t, struct kvd_daemon *d)
{
	const struct kvd_counters *k = &d->counters;
	const struct kvd_metrics *m = &d->metrics;

	family(t, "kvd_admission_rejections_total", "counter",
	       "Requests refused at admission, by reason.");
	for (int i = 0; i < KVD_REJECT__N; i++)
		tx(t, "kvd_admission_rejections_total{reason=\"%s\"} %" PRIu64 "\n",
		   kvd_reject_name((enum kvd_reject)i), k->rejected[i]);
	one_u(t, "kvd_requests_admitted_total", "counter",
	      "Requests admitted (registered) on this node.", k->admitted);
	one_u(t, "kvd_requests_completed_total", "counter",
	      "Admitted requests that ended well.", k->completed);
	one_u(t, "kvd_requests_failed_total", "counter",
	      "Admitted requests that failed.", k->failed);
	family(t, "kvd_integrity_failures_total", "counter",
	       "Integrity failures by what caught them: tag (page tags, owners, coverage in the pool), checksum and mac (a KV batch), transfer (a batch's entries, coverage, non-finite KV), peer (reported by the prefill peer).");
	for (int i = 0; i < KVD_INTEGRITY__N; i++)
		tx(t, "kvd_integrity_failures_total{kind=\"%s\"} %" PRIu64 "\n",
		   integrity_names[i], m->integrity[i]);
	family(t, "kvd_peer_auth_failures_total", "counter",
	       "Peers that failed authentication, by what failed: proof (a handshake proof, also one relayed from another link), token (a data connection's), frame (a sealed control frame that did not open: the link is closed), batch (a KV batch's seal or MAC); the kinds sum to kvctl status peer_auth_failures.");
	for (int i = 0; i < KVD_PEER_AUTH__N; i++)
		tx(t, "kvd_peer_auth_failures_total{kind=\"%s\"} %" PRIu64 "\n",
		   peer_auth_names[i], m->peer_auth[i]);
	one_u(t, "kvd_verbs_flush_timeouts_total", "counter",
	      "Decode, RDMA: links whose queue pair never delivered its flush completions within transfer.verbs_flush_timeout_ms (their requests' pages quarantined until restart).",
	      k->verbs_flush_timeouts);
	one_u(t, "kvd_kv_release_timeouts_total", "counter",
	      "Prefill: pages released without the peer's acknowledgement.",
	      k->release_timeouts);
	one_u(t, "kvd_kv_send_timeouts_total", "counter",
	      "Prefill: requests whose KV batches made no progress within transfer.send_timeout_ms.",
	      k->send_timeouts);
	one_u(t, "kvd_drain_aborts_total", "counter",
	      "Requests aborted at a drain's deadline.", k->drain_aborts);
	one_u(t, "kvd_failovers_total", "counter",
	      "Decode: requests placed again (another prefill peer, or here) after their prefill peer was lost or refused them (DRAINING, OVERLOADED) before anything reached the client (peers.failover_retries).",
	      k->failovers);
	family(t, "kvd_verbs_batch_headers_total", "counter",
	       "RDMA: batch headers (WRITE_WITH_IMM) posted inline or from the staging buffer.");
	tx(t, "kvd_verbs_batch_headers_total{how=\"inline\"} %" PRIu64 "\n",
	   k->verbs.header_inline);
	tx(t, "kvd_verbs_batch_headers_total{how=\"staged\"} %" PRIu64 "\n",
	   k->verbs.header_staged);
	one_u(t, "kvd_verbs_credit_waits_total", "counter",
	      "RDMA, prefill: batches that waited for a mailbox credit.",
	      k->verbs.credit_waits);
	one_u(t, "kvd_verbs_credits_returned_total", "counter",
	      "RDMA, decode: mailbox slots copied out and credited back.",
	      k->verbs.credits_returned);
	one_u(t, "kvd_verbs_credit_violations_total", "counter",
	      "RDMA: peers that broke the mailbox credit rule.",
	      k->verbs.credit_violations);
	one(t, "kvd_kv_checksum_seconds_total", "counter",
	    "Time spent checksumming (and sealing/opening) KV batches.",
	    (double)k->checksum_ns / 1e9);
	static const char *const dirs[2] = { "send", "receive" };
	family(t, "kvd_kv_transfer_bytes_total", "counter",
	       "KV payload bytes moved between prefill and decode.");
	for (int i = 0; i < 2; i++)
		tx(t, "kvd_kv_transfer_bytes_total{direction=\"%s\"} %" PRIu64 "\n",
		   dirs[i], m->xfer_bytes[i]);
	family(t, "kvd_kv_transfer_batches_total", "counter",
	       "KV batches moved between prefill and decode.");
	for (int i = 0; i < 2; i++)
		tx(t, "kvd_kv_transfer_batches_total{direction=\"%s\"} %" PRIu64 "\n",
		   dirs[i], m->xfer_batches[i]);
	family(t, "kvd_kv_transfer_seconds", "histogram",
	       "A request's KV transfer: send (prefill) from its first batch queued to the last sent; receive (decode) from the prefill request to the KV received and checked, prefill's compute included.");
	hist_samples(t, "kvd_kv_transfer_seconds", "direction=\"send\",",
		     &m->xfer_time[0], &h_xfer);
	hist_samples(t, "kvd_kv_transfer_seconds", "direction=\"receive\",",
		     &m->xfer_time[1], &h_xfer);
}

/* ---- vLLM's names ---------------------------------------------------------- */

/* The tenants' histograms of one kind summed. */
static void hist_sum(const struct kvd_metrics *m, enum tenant_hist which,
		     struct kvd_hist *out)
{
	memset(out, 0, sizeof(*out));
	for (uint32_t i = 0; i < KVD_METRICS_TENANTS; i++) {
		const struct kvd_metrics_tenant *tn = &m->tenants[i];
		const struct kvd_hist *h = which == TH_TTFT ? &tn->ttft
					   : which == TH_ITL ? &tn->itl : &tn->e2e;

		for (unsigned b = 0; b <= KVD_HIST_BUCKETS; b++)
			out->counts[b] += h->counts[b];
		out->count += h->count;
		out->sum += h->sum;
	}
}

static uint64_t tenants_sum(const struct kvd_metrics *m, size_t off)
{
	uint64_t sum = 0, v;

	for (uint32_t i = 0; i < KVD_METRICS_TENANTS; i++) {
		memcpy(&v, (const char *)&m->tenants[i] + off, sizeof(v));
		sum += v;
	}
	return sum;
}

/* name{model_name="..."} v, with its family lines. */
static void vllm_one(struct text *t, const char *name, const char *type,
		     const char *help, const char *model, double v)
{
	family(t, name, type, help);
	tx(t, "%s{model_name=\"%s\"} %.17g\n", name, model, v);
}

/* vLLM's finished_reason values: stop, length, abort (the client left). */
static void vllm_success(struct text *t, const struct kvd_metrics *m,
			 const char *model)
{
	static const struct { const char *reason; unsigned outcome; } r[] = {
		{ "stop", KVD_OUTCOME_STOP }, { "length", KVD_OUTCOME_LENGTH },
		{ "abort", KVD_OUTCOME_ABANDONED },
	};

	family(t, "vllm:request_success_total", "counter",
	       "Requests finished, by finished_reason (kvd_requests_total summed over tenants; abort: the client left).");
	for (size_t k = 0; k < KVD_ARRAY_SIZE(r); k++) {
		uint64_t n = 0;

		for (uint32_t i = 0; i < KVD_METRICS_TENANTS; i++)
			n += m->tenants[i].requests[r[k].outcome];
		tx(t, "vllm:request_success_total{model_name=\"%s\",finished_reason=\"%s\"} %" PRIu64 "\n",
		   model, r[k].reason, n);
	}
}

static void vllm_hists(struct text *t, const struct kvd_metrics *m,
		       const char *labels)
{
	static const struct { const char *name, *help; enum tenant_hist which; } h[] = {
		{ "vllm:time_to_first_token_seconds", "Time to the first token (kvd_time_to_first_token_seconds summed over tenants).", TH_TTFT },
		{ "vllm:time_per_output_token_seconds", "Time between two output tokens (kvd_inter_token_latency_seconds summed over tenants).", TH_ITL },
		{ "vllm:inter_token_latency_seconds", "Time between two output tokens (kvd_inter_token_latency_seconds summed over tenants).", TH_ITL },
		{ "vllm:e2e_request_latency_seconds", "Time from arrival to the end (kvd_e2e_request_latency_seconds summed over tenants).", TH_E2E },
	};
	struct kvd_hist sum;

	for (size_t k = 0; k < KVD_ARRAY_SIZE(h); k++) {
		hist_sum(m, h[k].which, &sum);
		family(t, h[k].name, "histogram", h[k].help);
		hist_samples(t, h[k].name, labels, &sum,
			     h[k].which == TH_TTFT ? &h_ttft :
			     h[k].which == TH_ITL ? &h_itl : &h_e2e);
	}
}

static void render_vllm(struct text *t, struct kvd_daemon *d)
{
	const struct kvd_metrics *m = &d->metrics;
	const struct kvd_queue_hook *q = &d->queue;
	char name[sizeof(d->cfg.http_model_name) + 256];
	char model[sizeof(name) * 3 + 1], labels[sizeof(model) + 16];
	struct kvpool_stats st = { 0 };
	double usage;

	kvd_config_model_name(&d->cfg, name, sizeof(name));
	kvd_metrics_escape(name, model, sizeof(model));
	snprintf(labels, sizeof(labels), "model_name=\"%s\",", model);
	if (d->pool)
		kvpool_get_stats(d->pool, &st);
	usage = pool_usage(&st);
	vllm_one(t, "vllm:num_requests_running", "gauge",
		 "Admitted requests not yet ended (kvd_num_requests_running).", model,
		 (double)d->in_flight);
	vllm_one(t, "vllm:num_requests_waiting", "gauge",
		 "Requests waiting for admission (kvd_num_requests_waiting).", model,
		 (double)(q->waiting ? q->waiting(q->arg, NULL, 0) : 0));
	vllm_one(t, "vllm:gpu_cache_usage_perc", "gauge",
		 "Fraction of live KV pages not free, 0-1 (kvd_kv_cache_usage_perc).", model, usage);
	vllm_one(t, "vllm:kv_cache_usage_perc", "gauge",
		 "Fraction of live KV pages not free, 0-1 (kvd_kv_cache_usage_perc).", model, usage);
	vllm_one(t, "vllm:prompt_tokens_total", "counter",
		 "Prompt tokens prefilled (kvd_prompt_tokens_total summed over tenants).", model,
		 (double)tenants_sum(m, offsetof(struct kvd_metrics_tenant, prompt_tokens)));
	vllm_one(t, "vllm:generation_tokens_total", "counter",
		 "Tokens generated (kvd_generation_tokens_total summed over tenants).", model,
		 (double)tenants_sum(m, offsetof(struct kvd_metrics_tenant, generation_tokens)));
	vllm_success(t, m, model);
	vllm_hists(t, m, labels);
}

int kvd_metrics_render(struct kvd_daemon *d, char **out, size_t *len)
{
	struct text t = { .cap = 16384 };

	*out = NULL;
	*len = 0;
	t.p = malloc(t.cap);
	if (!t.p)
		return -ENOMEM;
	t.p[0] = '\0';
	render_node(&t, d);
	render_tenants(&t, &d->metrics);
	render_pool(&t, d);
	render_cache(&t, d);
	render_waiting(&t, d);
	render_counters(&t, d);
	render_http(&t, &d->metrics);
	if (d->cfg.http_metrics_vllm_names)
		render_vllm(&t, d);
	if (t.oom) {
		free(t.p);
		return -ENOMEM;
	}
	*out = t.p;
	*len = t.len;
	return 0;
}
