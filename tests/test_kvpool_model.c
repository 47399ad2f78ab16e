/* test_kvpool_model.c - randomized model-based test of the KV page pool.
 *
 * A plain reference model (one struct per page slot, plain loops, no free
 * list, no chunks) is run side by side with the real pool through at least
 * 1,000,000 random operations: reserve, fill_begin, tag_write, mark_ready,
 * verify, fence, unfence, release (including "abort": release while
 * fenced), quarantine, grow, shrink, plus adversarial calls (stale tables
 * of finished requests, tables with a foreign, stale, out-of-range or
 * duplicate entry, the wrong owner, bad token counts) and a hostile writer
 * that puts another page's tag, a previous owner's tag or a flipped byte
 * into page memory.
 *
 * For every call the model predicts the exact return code; on success both
 * apply it. After EVERY step the pool's per-page metadata (one snapshot)
 * must equal the model's, its stats must equal the model's counts, and the
 * invariants are checked on the pool's own view: no page in two live
 * requests, no FREE or RETIRED page with fences or a retiring mark, every
 * FENCED page fenced, reserve only ever returning pages the model had FREE
 * (so never fenced, quarantined, retired or retiring), generations strictly
 * increasing (per page, and pool-wide).
 *
 * Quarantined pages never come back, so a pool slowly fills with them; the
 * test therefore restarts with a fresh pool (and model) every EPOCH_OPS
 * operations or when a quarter of the slots are quarantined, freeing the
 * old pool with pages in every state.
 *
 * Seed: KVD_SEED, else the time; printed at start and on failure.
 * KVD_POOL_OPS overrides the operation count (default 1,000,000).
 * Not a Check test: one long loop with its own exact failure report.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu/kv/kvpool.h"

#define MAX_SLOTS 320      /* grow never takes the pool past this */
#define MAX_REQ 40         /* requests tracked at once */
#define MAX_N 16           /* pages per request */
#define STALE_RING 32      /* finished tables kept for adversarial calls */
#define EPOCH_OPS 100000
#define PT 4               /* page_tokens */

static const struct kvpool_geom geom = {
	.page_tokens = PT, .n_layer = 1, .kv_dim = 4, .dtype = KV_DTYPE_F32,
};

/* ---- the reference model ---------------------------------------------------- */

/* What the model believes is in the first 64 bytes of a page. */
struct mtag {
	bool valid;              /* a well-formed tag with these fields */
	uint64_t owner, gen;
	uint32_t page, index, tokens;
};

struct mpage {
	enum kvpage_state state;
	bool retiring;
	uint64_t owner, gen;
	uint32_t fences;
	struct mtag tag;
};

struct model {
	uint32_t slots;
	struct mpage pg[MAX_SLOTS];
	uint64_t max_gen;        /* largest generation handed out so far */
};

struct req {
	bool used;
	uint64_t owner;
	uint32_t n;
	struct kvpool_ref t[MAX_N];
	uint32_t tokens;         /* tokens of the last successful tag_write */
};

struct run {
	uint64_t seed;
	uint64_t rng;
	uint64_t step;
	const char *op;
	struct kvpool *pool;
	struct kvmem mem;
	struct model m;
	struct req req[MAX_REQ];
	struct kvpool_ref stale[STALE_RING][MAX_N];
	uint32_t stale_n[STALE_RING];
	uint64_t stale_owner[STALE_RING];
	uint32_t n_stale;
	uint64_t next_owner;
	uint64_t epochs;
	struct req *focus;       /* guided step: the request to act on */
	struct kvpool_page_info snap[MAX_SLOTS];
	uint64_t calls[16];      /* successful calls per op kind */
	uint64_t errors[16];     /* predicted error returns per op kind */
};

static void fail(struct run *r, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "FAIL seed=%" PRIu64 " step=%" PRIu64 " op=%s: ",
		r->seed, r->step, r->op);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\nrerun with KVD_SEED=%" PRIu64 "\n", r->seed);
	exit(1);
}

static uint64_t rnd(struct run *r)
{
	/* splitmix64 */
	uint64_t z = (r->rng += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static uint32_t rnd_below(struct run *r, uint32_t n)
{
	return n ? (uint32_t)(rnd(r) % n) : 0;
}

static bool chance(struct run *r, uint32_t percent)
{
	return rnd_below(r, 100) < percent;
}

#define BIT(s) (1u << (s))
#define OWNED (BIT(KVPAGE_RESERVED) | BIT(KVPAGE_FILLING) | BIT(KVPAGE_READY))

/* The spec of table validation, written out plainly. */
static int m_check_table(const struct model *m, uint64_t owner,
			 const struct kvpool_ref *t, uint32_t n,
			 unsigned states, bool need_fence)
{
	if (n == 0)
		return KVPOOL_E_RANGE;
	for (uint32_t i = 0; i < n; i++) {
		const struct mpage *pg;

		if (t[i].page >= m->slots)
			return KVPOOL_E_RANGE;
		for (uint32_t j = 0; j < i; j++)
			if (t[j].page == t[i].page)
				return KVPOOL_E_RANGE;
		pg = &m->pg[t[i].page];
		if (pg->gen == 0 || pg->owner != owner || pg->gen != t[i].gen)
			return KVPOOL_E_STALE;
		if (!(states & BIT(pg->state)))
			return KVPOOL_E_STATE;
		if (need_fence && pg->fences == 0)
			return KVPOOL_E_STATE;
	}
	return 0;
}

static uint32_t m_page_tokens(uint32_t i, uint32_t tokens)
{
	uint32_t before = i * PT;

	return tokens - before < PT ? tokens - before : PT;
}

static int m_check_coverage(uint32_t n, uint32_t tokens)
{
	if (tokens == 0 || (tokens + PT - 1) / PT != n)
		return KVPOOL_E_COVERAGE;
	return 0;
}

static int m_check_tags(const struct model *m, uint64_t owner,
			const struct kvpool_ref *t, uint32_t n,
			uint32_t tokens, uint32_t *bad)
{
	for (uint32_t i = 0; i < n; i++) {
		const struct mtag *g = &m->pg[t[i].page].tag;

		if (!g->valid || g->owner != owner || g->gen != t[i].gen ||
		    g->page != t[i].page || g->index != i ||
		    g->tokens != m_page_tokens(i, tokens)) {
			*bad = i;
			return KVPOOL_E_TAG;
		}
	}
	return 0;
}

static void m_set_state(struct mpage *pg, enum kvpage_state s)
{
	pg->state = s;
}

/* The last holder let go of a page with no fence left. */
static void m_put(struct mpage *pg)
{
	if (pg->retiring) {
		pg->retiring = false;
		m_set_state(pg, KVPAGE_RETIRED);
	} else {
		m_set_state(pg, KVPAGE_FREE);
	}
}

static uint32_t m_count(const struct model *m, enum kvpage_state s)
{
	uint32_t c = 0;

	for (uint32_t i = 0; i < m->slots; i++)
		c += m->pg[i].state == s;
	return c;
}

/* ---- checks after every step ------------------------------------------------ */

static void check_all(struct run *r)
{
	struct model *m = &r->m;
	struct kvpool_stats st;
	uint32_t slots = kvpool_snapshot(r->pool, r->snap, MAX_SLOTS);
	uint32_t by_state[KVPAGE_N_STATES] = { 0 }, retiring = 0, fences = 0;
	static int holder[MAX_SLOTS];

	if (slots != m->slots)
		fail(r, "slots %u, model %u", slots, m->slots);
	for (uint32_t i = 0; i < slots; i++) {
		const struct kvpool_page_info *pi = &r->snap[i];
		const struct mpage *pg = &m->pg[i];

		if (pi->state != pg->state || pi->owner != pg->owner ||
		    pi->gen != pg->gen || pi->fences != pg->fences ||
		    pi->retiring != pg->retiring)
			fail(r,
			     "page %u: pool %s owner=%" PRIu64 " gen=%" PRIu64
			     " fences=%u retiring=%d; model %s owner=%" PRIu64
			     " gen=%" PRIu64 " fences=%u retiring=%d",
			     i, kvpage_state_name(pi->state), pi->owner, pi->gen,
			     pi->fences, pi->retiring,
			     kvpage_state_name(pg->state), pg->owner, pg->gen,
			     pg->fences, pg->retiring);
		/* invariants, on the pool's own view */
		if ((pi->state == KVPAGE_FREE || pi->state == KVPAGE_RETIRED) &&
		    (pi->fences || pi->retiring))
			fail(r, "page %u %s with fences=%u retiring=%d", i,
			     kvpage_state_name(pi->state), pi->fences,
			     pi->retiring);
		if (pi->state == KVPAGE_FENCED && pi->fences == 0)
			fail(r, "page %u FENCED without a fence", i);
		if (pi->state == KVPAGE_QUARANTINED && pi->retiring)
			fail(r, "page %u quarantined and retiring", i);
		if (pi->state != KVPAGE_RETIRED && !pi->has_memory)
			fail(r, "live page %u without memory", i);
		if (pi->gen > m->max_gen)
			fail(r, "page %u gen %" PRIu64 " never handed out", i,
			     pi->gen);
		by_state[pi->state]++;
		retiring += pi->retiring;
		fences += pi->fences;
		holder[i] = -1;
	}
	/* no page held by two live requests */
	for (int q = 0; q < MAX_REQ; q++) {
		const struct req *rq = &r->req[q];

		if (!rq->used)
			continue;
		for (uint32_t i = 0; i < rq->n; i++) {
			const struct kvpool_page_info *pi =
				&r->snap[rq->t[i].page];

			if (pi->gen != rq->t[i].gen ||
			    !(OWNED & BIT(pi->state)))
				continue;
			if (holder[rq->t[i].page] >= 0 &&
			    holder[rq->t[i].page] != q)
				fail(r, "page %u held by requests %d and %d",
				     rq->t[i].page, holder[rq->t[i].page], q);
			holder[rq->t[i].page] = q;
		}
	}
	kvpool_get_stats(r->pool, &st);
	if (st.slots != slots || st.pages != slots - by_state[KVPAGE_RETIRED] ||
	    st.retiring != retiring || st.fences != fences ||
	    st.tokens != (uint64_t)st.pages * PT || st.page_tokens != PT ||
	    memcmp(st.by_state, by_state, sizeof(by_state)))
		fail(r, "stats differ from the pages");
	for (int s = 0; s < KVPAGE_N_STATES; s++)
		if (st.by_state[s] != m_count(m, (enum kvpage_state)s))
			fail(r, "stats %s=%u, model %u",
			     kvpage_state_name((enum kvpage_state)s),
			     st.by_state[s], m_count(m, (enum kvpage_state)s));
}

static void expect(struct run *r, int kind, int got, int want)
{
	if (got != want)
		fail(r, "returned %d, model predicts %d", got, want);
	if (got)
		r->errors[kind]++;
	else
		r->calls[kind]++;
}

/* ---- table choice ------------------------------------------------------------ */

enum op_kind {
	OP_RESERVE, OP_FILL, OP_TAG, OP_READY, OP_VERIFY, OP_FENCE,
	OP_UNFENCE, OP_RELEASE, OP_QUARANTINE, OP_GROW, OP_SHRINK,
	OP_HOSTILE, OP_N
};

static const char *const op_names[OP_N] = {
	"reserve", "fill_begin", "tag_write", "mark_ready", "verify",
	"fence", "unfence", "release", "quarantine", "grow", "shrink",
	"hostile_write",
};

static struct req *pick_req(struct run *r)
{
	uint32_t start = rnd_below(r, MAX_REQ);

	for (uint32_t k = 0; k < MAX_REQ; k++) {
		struct req *q = &r->req[(start + k) % MAX_REQ];

		if (q->used)
			return q;
	}
	return NULL;
}

/* A table to call with: usually a request's own table (whole, or a range
 * [a, b) of it, or a prefix), sometimes an adversarial one. *owner is the
 * owner to call as. Returns n. */
static uint32_t pick_table(struct run *r, struct kvpool_ref *t,
			   uint64_t *owner, bool prefix)
{
	struct req *q = r->focus ? r->focus : pick_req(r);
	uint32_t a = 0, b, adv = rnd_below(r, r->focus ? 400 : 100);

	if (!q || (adv < 4 && r->n_stale)) {
		uint32_t s = rnd_below(r, r->n_stale ? r->n_stale : 1);

		if (!r->n_stale) {
			t[0].page = rnd_below(r, r->m.slots + 2);
			t[0].gen = rnd_below(r, 1000);
			*owner = rnd(r) % 7;
			return 1;
		}
		memcpy(t, r->stale[s], sizeof(r->stale[s]));
		*owner = r->stale_owner[s];
		return r->stale_n[s];
	}
	b = q->n;
	if (r->focus) {
		/* whole table */
	} else if (prefix) {
		b = 1 + rnd_below(r, q->n);
		if (chance(r, 60))
			b = q->n;
	} else if (chance(r, 25)) {
		a = rnd_below(r, q->n);
		b = a + 1 + rnd_below(r, q->n - a);
	}
	memcpy(t, q->t + a, (b - a) * sizeof(*t));
	*owner = q->owner;
	if (adv >= 4 && adv < 10) {
		uint32_t i = rnd_below(r, b - a);
		struct req *o = pick_req(r);

		switch (rnd_below(r, 5)) {
		case 0: /* stale generation */
			t[i].gen -= 1 + rnd_below(r, 3);
			break;
		case 1: /* another request's page */
			if (o && o != q)
				t[i] = o->t[rnd_below(r, o->n)];
			break;
		case 2: /* out of range */
			t[i].page = r->m.slots + rnd_below(r, 5);
			break;
		case 3: /* duplicate */
			if (b - a > 1)
				t[i] = t[(i + 1) % (b - a)];
			break;
		default: /* wrong owner */
			*owner = o ? o->owner : *owner + 1;
			break;
		}
	}
	return b - a;
}

/* Guided calls act, like the daemon, on the entries the request still
 * holds in a state the call accepts (a range release or quarantine may
 * have let go of some). Unguided calls keep the table as picked. */
static void focus_filter(struct run *r, struct kvpool_ref *t, uint32_t *n,
			 unsigned states, bool need_fence)
{
	uint32_t k = 0;

	if (!r->focus)
		return;
	for (uint32_t i = 0; i < *n; i++) {
		const struct mpage *pg;

		/* an unguided pick may name a page past the pool: look only
		 * at pages that exist */
		if (t[i].page >= r->m.slots)
			continue;
		pg = &r->m.pg[t[i].page];
		if (pg->gen == t[i].gen && (states & BIT(pg->state)) &&
		    (!need_fence || pg->fences))
			t[k++] = t[i];
	}
	if (k)
		*n = k;
}

/* The request no longer holds anything: its table becomes a stale one. */
static bool req_done(const struct run *r, const struct req *q)
{
	for (uint32_t i = 0; i < q->n; i++) {
		const struct mpage *pg = &r->m.pg[q->t[i].page];

		if (pg->gen != q->t[i].gen)
			continue;
		if ((OWNED | BIT(KVPAGE_FENCED)) & BIT(pg->state))
			return false;
		if (pg->state == KVPAGE_QUARANTINED && pg->fences)
			return false;
	}
	return true;
}

static void req_retire(struct run *r, struct req *q)
{
	uint32_t s = r->n_stale < STALE_RING ? r->n_stale++ :
					       rnd_below(r, STALE_RING);

	memcpy(r->stale[s], q->t, sizeof(q->t));
	r->stale_n[s] = q->n;
	r->stale_owner[s] = q->owner;
	q->used = false;
}

/* ---- operations ----------------------------------------------------------------- */

static void op_reserve(struct run *r)
{
	struct model *m = &r->m;
	struct req *q = NULL;
	uint32_t n = 1 + rnd_below(r, chance(r, 10) ? MAX_N : 6);
	uint32_t free_pages = m_count(m, KVPAGE_FREE);
	struct kvpool_ref t[MAX_N];
	uint64_t owner;
	int want, got;

	for (int k = 0; k < MAX_REQ; k++) {
		struct req *c = &r->req[k];

		if (c->used && req_done(r, c))
			req_retire(r, c);
		if (!c->used && !q)
			q = c;
	}
	if (!q)
		return;
	owner = r->next_owner++;
	want = n > free_pages ? KVPOOL_E_FULL : 0;
	got = kvpool_reserve(r->pool, owner, n, t);
	expect(r, OP_RESERVE, got, want);
	if (got)
		return;
	for (uint32_t i = 0; i < n; i++) {
		struct mpage *pg;

		if (t[i].page >= m->slots)
			fail(r, "reserve returned page %u of %u", t[i].page,
			     m->slots);
		pg = &m->pg[t[i].page];
		if (pg->state != KVPAGE_FREE || pg->retiring || pg->fences)
			fail(r, "reserve returned page %u that is %s%s", t[i].page,
			     kvpage_state_name(pg->state),
			     pg->retiring ? " (retiring)" : "");
		if (t[i].gen <= pg->gen || t[i].gen <= m->max_gen)
			fail(r, "generation %" PRIu64 " of page %u not new "
			     "(page had %" PRIu64 ", pool max %" PRIu64 ")",
			     t[i].gen, t[i].page, pg->gen, m->max_gen);
		m->max_gen = t[i].gen;
		pg->state = KVPAGE_RESERVED;
		pg->owner = owner;
		pg->gen = t[i].gen;
	}
	q->used = true;
	q->owner = owner;
	q->n = n;
	q->tokens = 0;
	memcpy(q->t, t, n * sizeof(*t));
}

static void op_fill(struct run *r)
{
	struct kvpool_ref t[MAX_N];
	uint64_t owner;
	uint32_t n = pick_table(r, t, &owner, false);
	int want;

	focus_filter(r, t, &n, BIT(KVPAGE_RESERVED), false);
	want = m_check_table(&r->m, owner, t, n, BIT(KVPAGE_RESERVED), false);

	expect(r, OP_FILL, kvpool_fill_begin(r->pool, owner, t, n), want);
	if (!want)
		for (uint32_t i = 0; i < n; i++)
			r->m.pg[t[i].page].state = KVPAGE_FILLING;
}

/* Tokens for an n-page prefix: mostly right, sometimes off by a page. */
static uint32_t pick_tokens(struct run *r, uint32_t n, uint32_t last)
{
	if (last && (last + PT - 1) / PT == n &&
	    chance(r, r->focus ? 90 : 60))
		return last;
	if (chance(r, 8))
		return rnd_below(r, (n + 2) * PT);
	return (n - 1) * PT + 1 + rnd_below(r, PT);
}

static struct req *req_of(struct run *r, uint64_t owner)
{
	for (int k = 0; k < MAX_REQ; k++)
		if (r->req[k].used && r->req[k].owner == owner)
			return &r->req[k];
	return NULL;
}

static void op_tag(struct run *r)
{
	struct kvpool_ref t[MAX_N];
	uint64_t owner;
	uint32_t n = pick_table(r, t, &owner, true);
	struct req *q = req_of(r, owner);
	uint32_t tokens = pick_tokens(r, n, q ? q->tokens : 0);
	int want = m_check_table(&r->m, owner, t, n,
				 BIT(KVPAGE_FILLING) | BIT(KVPAGE_READY), false);

	if (!want)
		want = m_check_coverage(n, tokens);
	expect(r, OP_TAG, kvpool_tag_write(r->pool, owner, t, n, tokens), want);
	if (want)
		return;
	for (uint32_t i = 0; i < n; i++)
		r->m.pg[t[i].page].tag = (struct mtag){
			.valid = true, .owner = owner, .gen = t[i].gen,
			.page = t[i].page, .index = i,
			.tokens = m_page_tokens(i, tokens),
		};
	if (q)
		q->tokens = tokens;
}

static void op_ready_or_verify(struct run *r, bool ready)
{
	struct kvpool_ref t[MAX_N];
	uint64_t owner;
	uint32_t n = pick_table(r, t, &owner, true);
	struct req *q = req_of(r, owner);
	uint32_t tokens = pick_tokens(r, n, q ? q->tokens : 0);
	unsigned states = ready ? BIT(KVPAGE_FILLING) :
				  BIT(KVPAGE_FILLING) | BIT(KVPAGE_READY);
	uint32_t want_bad = UINT32_MAX, bad = UINT32_MAX;
	int want = m_check_table(&r->m, owner, t, n, states, false), got;

	if (!want)
		want = m_check_coverage(n, tokens);
	if (!want)
		want = m_check_tags(&r->m, owner, t, n, tokens, &want_bad);
	if (ready) {
		got = kvpool_mark_ready(r->pool, owner, t, n, tokens);
	} else {
		got = kvpool_verify(r->pool, owner, t, n, tokens, &bad);
		if (want == KVPOOL_E_TAG && bad != want_bad)
			fail(r, "verify bad index %u, model %u", bad, want_bad);
	}
	expect(r, ready ? OP_READY : OP_VERIFY, got, want);
	if (ready && !want)
		for (uint32_t i = 0; i < n; i++)
			r->m.pg[t[i].page].state = KVPAGE_READY;
}

static void op_fence(struct run *r)
{
	struct kvpool_ref t[MAX_N];
	uint64_t owner;
	uint32_t n = pick_table(r, t, &owner, false);
	int want;

	focus_filter(r, t, &n, OWNED, false);
	want = m_check_table(&r->m, owner, t, n, OWNED, false);
	expect(r, OP_FENCE, kvpool_fence(r->pool, owner, t, n), want);
	if (!want)
		for (uint32_t i = 0; i < n; i++)
			r->m.pg[t[i].page].fences++;
}

static void op_unfence(struct run *r)
{
	struct kvpool_ref t[MAX_N];
	uint64_t owner;
	uint32_t n = pick_table(r, t, &owner, false);
	unsigned states = OWNED | BIT(KVPAGE_FENCED) | BIT(KVPAGE_QUARANTINED);
	int want;

	focus_filter(r, t, &n, states, true);
	want = m_check_table(&r->m, owner, t, n, states, true);

	expect(r, OP_UNFENCE, kvpool_unfence(r->pool, owner, t, n), want);
	if (want)
		return;
	for (uint32_t i = 0; i < n; i++) {
		struct mpage *pg = &r->m.pg[t[i].page];

		if (--pg->fences == 0 && pg->state == KVPAGE_FENCED)
			m_put(pg);
	}
}

static void op_release(struct run *r)
{
	struct kvpool_ref t[MAX_N];
	uint64_t owner;
	uint32_t n = pick_table(r, t, &owner, false);
	int want;

	focus_filter(r, t, &n, OWNED, false);
	want = m_check_table(&r->m, owner, t, n, OWNED, false);
	expect(r, OP_RELEASE, kvpool_release(r->pool, owner, t, n), want);
	if (want)
		return;
	for (uint32_t i = 0; i < n; i++) {
		struct mpage *pg = &r->m.pg[t[i].page];

		if (pg->fences)
			pg->state = KVPAGE_FENCED; /* abort with a writer out */
		else
			m_put(pg);
	}
}

static void op_quarantine(struct run *r)
{
	struct kvpool_ref t[MAX_N];
	uint64_t owner;
	uint32_t n = pick_table(r, t, &owner, false);
	int want;

	focus_filter(r, t, &n, OWNED | BIT(KVPAGE_FENCED), false);
	want = m_check_table(&r->m, owner, t, n, OWNED | BIT(KVPAGE_FENCED),
			     false);

	expect(r, OP_QUARANTINE, kvpool_quarantine(r->pool, owner, t, n),
	       want);
	if (want)
		return;
	for (uint32_t i = 0; i < n; i++) {
		struct mpage *pg = &r->m.pg[t[i].page];

		pg->retiring = false;
		pg->state = KVPAGE_QUARANTINED;
	}
}

static void op_grow(struct run *r)
{
	struct model *m = &r->m;
	uint32_t retired = m_count(m, KVPAGE_RETIRED);
	uint32_t n = rnd_below(r, 9), revived, fresh, seen = 0;
	uint32_t slots;

	if (m->slots + n - (n < retired ? n : retired) > MAX_SLOTS)
		n = retired;
	revived = n < retired ? n : retired;
	fresh = n - revived;
	expect(r, OP_GROW, kvpool_grow(r->pool, n), 0);
	/* Which retired slots come back is the pool's choice; how many is
	 * not. Revived slots keep their generation. */
	slots = kvpool_snapshot(r->pool, r->snap, MAX_SLOTS);
	if (slots != m->slots + fresh)
		fail(r, "grow %u: %u slots, model %u", n, slots,
		     m->slots + fresh);
	for (uint32_t i = 0; i < m->slots; i++)
		if (m->pg[i].state == KVPAGE_RETIRED &&
		    r->snap[i].state == KVPAGE_FREE) {
			if (r->snap[i].gen != m->pg[i].gen)
				fail(r, "revived page %u changed generation", i);
			m->pg[i].state = KVPAGE_FREE;
			m->pg[i].tag.valid = false; /* memory may be new */
			seen++;
		}
	if (seen != revived)
		fail(r, "grow %u revived %u, model %u", n, seen, revived);
	for (uint32_t i = m->slots; i < slots; i++)
		m->pg[i] = (struct mpage){ .state = KVPAGE_FREE };
	m->slots = slots;
}

static void op_shrink(struct run *r)
{
	struct model *m = &r->m;
	uint32_t shrinkable = 0, n, now = 0, want_now = 0, left;
	int want;

	for (uint32_t i = 0; i < m->slots; i++)
		shrinkable += m->pg[i].state != KVPAGE_RETIRED &&
			      m->pg[i].state != KVPAGE_QUARANTINED &&
			      !m->pg[i].retiring;
	n = rnd_below(r, chance(r, 10) ? shrinkable + 3 : 9);
	want = n > shrinkable ? KVPOOL_E_RANGE : 0;
	expect(r, OP_SHRINK, kvpool_shrink(r->pool, n, &now), want);
	if (want)
		return;
	/* free pages retire now, highest index first; then pages in use,
	 * highest index first, are marked retiring */
	left = n;
	for (uint32_t i = m->slots; i-- > 0 && left;)
		if (m->pg[i].state == KVPAGE_FREE) {
			m->pg[i].state = KVPAGE_RETIRED;
			want_now++;
			left--;
		}
	for (uint32_t i = m->slots; i-- > 0 && left;)
		if (((OWNED | BIT(KVPAGE_FENCED)) & BIT(m->pg[i].state)) &&
		    !m->pg[i].retiring) {
			m->pg[i].retiring = true;
			left--;
		}
	if (now != want_now)
		fail(r, "shrink %u retired %u now, model %u", n, now, want_now);
}

/* A writer nobody controls puts bytes into a page: another page's tag, a
 * previous owner's tag, or a flipped byte in the current tag. */
static void op_hostile(struct run *r)
{
	struct model *m = &r->m;
	uint32_t dst = rnd_below(r, m->slots), src = rnd_below(r, m->slots);
	unsigned char *d = kvpool_page_addr(r->pool, dst);
	const unsigned char *s = kvpool_page_addr(r->pool, src);
	struct kvtag t;

	r->calls[OP_HOSTILE]++;
	if (!d)
		return;
	switch (rnd_below(r, 3)) {
	case 0: /* copy of another page's tag */
		if (!s)
			return;
		memcpy(d, s, KVTAG_BYTES);
		m->pg[dst].tag = m->pg[src].tag;
		break;
	case 1: /* the tag of an earlier reservation of this page */
		if (m->pg[dst].gen < 2)
			return;
		kvtag_make(&t, m->pg[dst].owner, m->pg[dst].gen - 1, dst, 0,
			   1 + rnd_below(r, PT));
		memcpy(d, &t, sizeof(t));
		m->pg[dst].tag = (struct mtag){
			.valid = true, .owner = t.owner, .gen = t.generation,
			.page = dst, .index = 0, .tokens = t.tokens,
		};
		break;
	default: /* a flipped bit */
		d[rnd_below(r, KVTAG_BYTES)] ^=
			(unsigned char)(1u << rnd_below(r, 8));
		m->pg[dst].tag.valid = false;
		break;
	}
}

/* ---- driver ------------------------------------------------------------------------ */

static void epoch_start(struct run *r)
{
	uint32_t n = 64 + rnd_below(r, 129);

	kvpool_free(r->pool);
	r->pool = NULL;
	r->epochs++;
	if (kvpool_new(&r->pool, &r->mem, &geom, n))
		fail(r, "kvpool_new(%u) failed", n);
	memset(&r->m, 0, sizeof(r->m));
	r->m.slots = n;
	for (uint32_t i = 0; i < n; i++)
		r->m.pg[i].state = KVPAGE_FREE;
	memset(r->req, 0, sizeof(r->req));
	r->n_stale = 0;
	check_all(r);
}

/* A guided step: pick a live request and the operation its state calls
 * for, so that whole lifecycles (reserve, fill, tag, ready, verify,
 * release; fence, abort, unfence) happen often, not only refusals. */
static enum op_kind guided_op(struct run *r)
{
	struct req *q = pick_req(r);
	const struct mpage *pg;
	uint32_t x = rnd_below(r, 100);

	if (!q)
		return OP_RESERVE;
	if (req_done(r, q) && chance(r, 50)) {
		req_retire(r, q);
		return OP_RESERVE;
	}
	r->focus = q;
	pg = NULL;
	for (uint32_t i = 0; i < q->n && !pg; i++)
		if (r->m.pg[q->t[i].page].gen == q->t[i].gen &&
		    r->m.pg[q->t[i].page].state != KVPAGE_FREE &&
		    r->m.pg[q->t[i].page].state != KVPAGE_RETIRED)
			pg = &r->m.pg[q->t[i].page];
	if (!pg)
		return OP_RELEASE; /* nothing held: a stale call */
	switch (pg->state) {
	case KVPAGE_RESERVED:
		return x < 70 ? OP_FILL : x < 85 ? OP_FENCE : OP_RELEASE;
	case KVPAGE_FILLING:
		if (!q->tokens)
			return x < 80 ? OP_TAG : x < 90 ? OP_FENCE : OP_RELEASE;
		return x < 50 ? OP_READY : x < 70 ? OP_VERIFY :
		       x < 85 ? OP_UNFENCE : OP_RELEASE;
	case KVPAGE_READY:
		return x < 35 ? OP_VERIFY : x < 55 ? OP_TAG :
		       x < 65 ? OP_UNFENCE : x < 70 ? OP_FENCE : OP_RELEASE;
	case KVPAGE_FENCED:
	case KVPAGE_QUARANTINED:
		return x < 98 ? OP_UNFENCE : OP_QUARANTINE;
	default:
		return OP_RESERVE;
	}
}

static void step(struct run *r)
{
	/* weights out of 1000 */
	static const struct {
		enum op_kind op;
		int weight;
	} mix[] = {
		{ OP_RESERVE, 150 }, { OP_FILL, 110 }, { OP_TAG, 120 },
		{ OP_READY, 110 }, { OP_VERIFY, 130 }, { OP_FENCE, 70 },
		{ OP_UNFENCE, 90 }, { OP_RELEASE, 152 }, { OP_QUARANTINE, 2 },
		{ OP_GROW, 20 }, { OP_SHRINK, 16 }, { OP_HOSTILE, 30 },
	};
	int x = (int)rnd_below(r, 1000);
	enum op_kind op = OP_RESERVE;

	r->focus = NULL;
	if (chance(r, 60)) {
		op = guided_op(r);
		x = 1000;
	}
	for (size_t i = 0; i < sizeof(mix) / sizeof(mix[0]) && x < 1000; i++) {
		if (x < mix[i].weight) {
			op = mix[i].op;
			break;
		}
		x -= mix[i].weight;
	}
	r->op = op_names[op];
	switch (op) {
	case OP_RESERVE: op_reserve(r); break;
	case OP_FILL: op_fill(r); break;
	case OP_TAG: op_tag(r); break;
	case OP_READY: op_ready_or_verify(r, true); break;
	case OP_VERIFY: op_ready_or_verify(r, false); break;
	case OP_FENCE: op_fence(r); break;
	case OP_UNFENCE: op_unfence(r); break;
	case OP_RELEASE: op_release(r); break;
	case OP_QUARANTINE: op_quarantine(r); break;
	case OP_GROW: op_grow(r); break;
	case OP_SHRINK: op_shrink(r); break;
	default: op_hostile(r); break;
	}
	check_all(r);
}

static uint64_t env_u64(const char *name, uint64_t dflt)
{
	const char *s = getenv(name);

	return s && *s ? strtoull(s, NULL, 0) : dflt;
}

int main(void)
{
	static struct run run;
	struct run *r = &run;
	uint64_t ops = env_u64("KVD_POOL_OPS", 1000000);

	r->seed = env_u64("KVD_SEED", (uint64_t)time(NULL));
	r->rng = r->seed;
	r->next_owner = 1;
	printf("kvpool model test: seed=%" PRIu64 " ops=%" PRIu64
	       " (set KVD_SEED to replay)\n", r->seed, ops);
	fflush(stdout);
	kvmem_host_init(&r->mem);
	r->op = "new";
	epoch_start(r);
	for (r->step = 1; r->step <= ops; r->step++) {
		if (r->step % EPOCH_OPS == 0 ||
		    m_count(&r->m, KVPAGE_QUARANTINED) > r->m.slots / 4) {
			r->op = "epoch";
			epoch_start(r);
		}
		step(r);
	}
	kvpool_free(r->pool);
	kvmem_deinit(&r->mem);
	printf("%" PRIu64 " pools\n", r->epochs);
	printf("%-14s %10s %10s\n", "op", "ok", "refused");
	for (int i = 0; i < OP_N; i++)
		printf("%-14s %10" PRIu64 " %10" PRIu64 "\n", op_names[i],
		       r->calls[i], r->errors[i]);
	/* the run must have exercised every kind of outcome */
	for (int i = 0; i < OP_N; i++)
		if (r->calls[i] == 0 && ops >= 100000)
			fail(r, "op %s never succeeded", op_names[i]);
	printf("ok: %" PRIu64 " operations, every invariant held after each\n",
	       ops);
	return 0;
}
