/* test_xfer_check.c - the receive-side batch checks (net/xfer_check.h).
 *
 * Every refusal reason with its entry and sentence; accept paths (one
 * batch, several in any order, the last page partial); all or nothing (a
 * batch refused at entry k leaves the marks exactly as they were, for
 * every k and every reason); duplicates across and within batches;
 * coverage (pending, short, wrong done counts, extra batches, a page
 * counted twice). Then a reference-model test: random reservations and
 * random batches, valid or mutated, checked against a plain model written
 * from the protocol text (KVD_SEED replays, KVD_XFER_CHECK_OPS sizes it).
 */
#include <check.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "net/xfer_check.h"

#define PT 4                  /* page_tokens of the fixed tests */
#define NMAX 64               /* entries a test batch may hold */

static const struct kvpool_geom geom4 = {
	.page_tokens = PT, .n_layer = 1, .kv_dim = 2, .dtype = KV_DTYPE_F32,
};

/* A request of n_prompt tokens: page i of the prefix is (100 + 3i,
 * 1000 + i). */
struct fix {
	struct kvpool_ref table[NMAX];
	uint8_t got[NMAX];
	struct xfer_check_req q;
	struct xfer_check_marks m;
};

static void fix_init(struct fix *f, uint32_t n_prompt)
{
	memset(f, 0, sizeof(*f));
	f->q.n_prompt = n_prompt;
	f->q.page_tokens = PT;
	f->q.n_prefix = (n_prompt + PT - 1) / PT;
	f->q.table = f->table;
	f->q.kv = &geom4;
	for (uint32_t i = 0; i < f->q.n_prefix; i++)
		f->table[i] = (struct kvpool_ref){ 100 + 3 * i, 1000 + i };
	f->m.got = f->got;
	ck_assert(xfer_check_req_valid(&f->q));
}

/* The entry a correct sender writes for page index i. */
static struct xfer_entry good(const struct fix *f, uint32_t i)
{
	return (struct xfer_entry){
		.dst_page = f->table[i].page, .index = i,
		.dst_gen = f->table[i].gen,
		.tokens = xfer_check_page_tokens(&f->q, i),
	};
}

/* A built, verified batch of n entries with all-zero (finite) K/V. */
struct bat {
	struct xfer_batch b;
	struct xfer_hdr h;
	uint64_t pb;
};

static void bat_build(struct bat *x, const struct kvpool_geom *g,
		      const struct xfer_entry *e, uint32_t n, uint32_t seq)
{
	uint64_t bound;

	x->pb = kvpool_page_bytes(g);
	bound = xfer_batch_bytes(NMAX, x->pb);
	ck_assert_int_eq(xfer_batch_init(&x->b, x->pb, bound), 0);
	xfer_batch_reset(&x->b, 77, seq);
	for (uint32_t i = 0; i < n; i++) {
		uint8_t *slot;

		ck_assert_int_eq(xfer_batch_add(&x->b, &e[i], &slot), 0);
		memset(slot, 0, x->pb);
	}
	size_t len = xfer_batch_seal(&x->b, true);

	ck_assert_int_eq(xfer_batch_verify(x->b.buf, len, x->pb, bound, true,
					   &x->h), 0);
}

/* Payload of entry i, writable (the batch is ours). */
static uint8_t *bat_page(struct bat *x, uint32_t i)
{
	return (uint8_t *)xfer_batch_page(x->b.buf, &x->h, i);
}

static int check(struct fix *f, const struct xfer_entry *e, uint32_t n,
		 uint32_t seq, struct xfer_check_refusal *ref)
{
	struct bat x;
	int rc;

	bat_build(&x, &geom4, e, n, seq);
	rc = xfer_check_batch(&f->q, &f->m, &x.h, x.b.buf, ref);
	xfer_batch_deinit(&x.b);
	return rc;
}

static void assert_marks(const struct fix *f, const uint8_t *got,
			 uint32_t n_got, uint32_t batches)
{
	for (uint32_t i = 0; i < f->q.n_prefix; i++)
		ck_assert_msg(!f->got[i] == !got[i], "mark %u: %u, want %u", i,
			      f->got[i], got[i]);
	ck_assert_uint_eq(f->m.n_got, n_got);
	ck_assert_uint_eq(f->m.batches, batches);
}

START_TEST(test_accept_one_batch)
{
	struct fix f;
	struct xfer_entry e[3];
	struct xfer_check_done d = { 10, 3, 1 };
	char why[XFER_CHECK_WHY_MAX];

	fix_init(&f, 10);         /* 3 pages: 4, 4, 2 tokens */
	ck_assert_uint_eq(f.q.n_prefix, 3);
	for (uint32_t i = 0; i < 3; i++)
		e[i] = good(&f, i);
	ck_assert_uint_eq(e[2].tokens, 2);
	ck_assert_int_eq(check(&f, e, 3, 0, NULL), XFER_CHECK_OK);
	assert_marks(&f, (const uint8_t[]){ 1, 1, 1 }, 3, 1);
	ck_assert_int_eq(xfer_check_coverage(&f.q, &f.m, &d, why, sizeof(why)),
			 XFER_CHECK_OK);
	/* the same batch again is a duplicate, whole or in part */
	ck_assert_int_eq(check(&f, e, 3, 1, NULL), XFER_CHECK_E_DUPLICATE);
	ck_assert_int_eq(check(&f, &e[2], 1, 1, NULL), XFER_CHECK_E_DUPLICATE);
	assert_marks(&f, (const uint8_t[]){ 1, 1, 1 }, 3, 1);
}
END_TEST

START_TEST(test_accept_multi_batch)
{
	struct fix f;
	struct xfer_entry e[2];
	struct xfer_check_done d = { 13, 4, 3 };

	fix_init(&f, 13);         /* 4 pages, the last holds 1 token */
	ck_assert_uint_eq(good(&f, 3).tokens, 1);
	/* any order: 3, then (1, 0), then 2 */
	e[0] = good(&f, 3);
	ck_assert_int_eq(check(&f, e, 1, 0, NULL), XFER_CHECK_OK);
	ck_assert_int_eq(xfer_check_coverage(&f.q, &f.m, &d, NULL, 0),
			 XFER_CHECK_PENDING);
	e[0] = good(&f, 1);
	e[1] = good(&f, 0);
	ck_assert_int_eq(check(&f, e, 2, 1, NULL), XFER_CHECK_OK);
	assert_marks(&f, (const uint8_t[]){ 1, 1, 0, 1 }, 3, 2);
	ck_assert_int_eq(xfer_check_coverage(&f.q, &f.m, &d, NULL, 0),
			 XFER_CHECK_PENDING);
	e[0] = good(&f, 2);
	ck_assert_int_eq(check(&f, e, 1, 2, NULL), XFER_CHECK_OK);
	assert_marks(&f, (const uint8_t[]){ 1, 1, 1, 1 }, 4, 3);
	ck_assert_int_eq(xfer_check_coverage(&f.q, &f.m, &d, NULL, 0),
			 XFER_CHECK_OK);
}
END_TEST

/* One mutation of an entry: the verdict and sentence it must give. */
struct bad_case {
	int code;
	const char *sentence;     /* for page index 1 in batch 5 */
};

enum { MUT_INDEX, MUT_PAGE, MUT_GEN, MUT_DUP_EARLIER, MUT_DUP_IN_BATCH,
       MUT_TOKENS, MUT_TOKENS0, MUT_NAN, MUT_INF16, MUT_GEOMETRY, MUT_N };

static const struct bad_case bad_cases[MUT_N] = {
	[MUT_INDEX] = { XFER_CHECK_E_INDEX_RANGE,
			"batch 5 names page index 3 beyond the 3 prefix pages" },
	[MUT_PAGE] = { XFER_CHECK_E_WRONG_PAGE,
		       "batch 5 names page 104 gen 1001, not the request's page 103 gen 1001" },
	[MUT_GEN] = { XFER_CHECK_E_WRONG_GEN,
		      "batch 5 names page 103 gen 1002, not the request's page 103 gen 1001" },
	[MUT_DUP_EARLIER] = { XFER_CHECK_E_DUPLICATE,
			      "batch 5 writes page index 1 twice" },
	[MUT_DUP_IN_BATCH] = { XFER_CHECK_E_DUPLICATE_IN_BATCH,
			       "batch 5 writes page index 1 twice (in one batch)" },
	[MUT_TOKENS] = { XFER_CHECK_E_TOKENS,
			 "batch 5 page index 1 holds 3 tokens, expected 4" },
	[MUT_TOKENS0] = { XFER_CHECK_E_TOKENS,
			  "batch 5 page index 1 holds 0 tokens, expected 4" },
	[MUT_NAN] = { XFER_CHECK_E_NONFINITE,
		      "batch 5 page index 1 holds non-finite K/V" },
	[MUT_INF16] = { XFER_CHECK_E_NONFINITE,
			"batch 5 page index 1 holds non-finite K/V" },
	[MUT_GEOMETRY] = { XFER_CHECK_E_GEOMETRY,
			   "batch 5 carries pages of 128 bytes, the pool's hold 192" },
};

static const struct kvpool_geom geom4_f16 = {
	.page_tokens = PT, .n_layer = 1, .kv_dim = 2, .dtype = KV_DTYPE_F16,
};
static const struct kvpool_geom geom4_big = {
	.page_tokens = PT, .n_layer = 2, .kv_dim = 2, .dtype = KV_DTYPE_F32,
};

/* Insert e at position k of a[0, n). */
static void insert(struct xfer_entry *a, uint32_t *n, uint32_t k,
		   struct xfer_entry e)
{
	memmove(&a[k + 1], &a[k], (*n - k) * sizeof(a[0]));
	a[k] = e;
	(*n)++;
}

/* Mutation `mut` of page 1's entry at position k of a batch of a
 * 10-token request (3 pages), after `pre` (bit i: page i accepted in an
 * earlier batch; never page 1). The batch holds the other pages still
 * due, in order. Checks code, entry, sentence, and that the marks are
 * exactly as before. */
static void run_bad(int mut, uint32_t k, unsigned pre)
{
	const struct bad_case *bc = &bad_cases[mut];
	struct fix f;
	struct xfer_entry e[5], one;
	struct xfer_check_refusal ref;
	struct bat x;
	uint8_t before[NMAX];
	uint32_t n_got0, batches0, n = 0;
	int rc;

	fix_init(&f, 10);
	for (uint32_t i = 0; i < 3; i++) {
		if (!(pre >> i & 1))
			continue;
		one = good(&f, i);
		ck_assert_int_eq(check(&f, &one, 1, i, NULL), XFER_CHECK_OK);
	}
	if (mut == MUT_DUP_EARLIER) {
		one = good(&f, 1);
		ck_assert_int_eq(check(&f, &one, 1, 9, NULL), XFER_CHECK_OK);
	}
	for (uint32_t i = 0; i < 3; i++)
		if (i != 1 && !(pre >> i & 1))
			e[n++] = good(&f, i);
	if (mut == MUT_DUP_IN_BATCH)
		insert(e, &n, 0, good(&f, 1));
	k = k < n ? k : n;
	insert(e, &n, k, good(&f, 1));
	switch (mut) {
	case MUT_INDEX: e[k].index = 3; break;
	case MUT_PAGE: e[k].dst_page++; break;
	case MUT_GEN: e[k].dst_gen++; break;
	case MUT_TOKENS: e[k].tokens--; break;
	case MUT_TOKENS0: e[k].tokens = 0; break;
	case MUT_INF16: f.q.kv = &geom4_f16; break;
	case MUT_GEOMETRY: f.q.kv = &geom4_big; break;
	default: break;
	}
	memcpy(before, f.got, sizeof(before));
	n_got0 = f.m.n_got;
	batches0 = f.m.batches;
	bat_build(&x, mut == MUT_INF16 ? &geom4_f16 : &geom4, e, n, 5);
	if (mut == MUT_NAN) {
		/* V of layer 0 (block 1, 32 bytes a block), position 3 (held:
		 * the page holds 4), second element */
		float nan = __builtin_nanf("");

		memcpy(bat_page(&x, k) + KVTAG_BYTES + 32 + 3 * 8 + 4, &nan, 4);
	}
	if (mut == MUT_INF16)   /* K, position 3 (2-byte elements) */
		memcpy(bat_page(&x, k) + KVTAG_BYTES + 3 * 4,
		       &(uint16_t){ 0x7c00 }, 2);
	memset(&ref, 0, sizeof(ref));
	rc = xfer_check_batch(&f.q, &f.m, &x.h, x.b.buf, &ref);
	ck_assert_msg(rc == bc->code, "mutation %d k %u pre %u: %s, want %s",
		      mut, k, pre, xfer_check_name(rc), xfer_check_name(bc->code));
	/* a geometry mismatch is the batch's, seen at its first entry */
	if (mut == MUT_GEOMETRY)
		k = 0;
	ck_assert_uint_eq(ref.entry, k);
	ck_assert_uint_eq(ref.e.index, e[k].index);
	ck_assert_str_eq(ref.why, bc->sentence);
	/* all or nothing */
	ck_assert(memcmp(before, f.got, sizeof(before)) == 0);
	ck_assert_uint_eq(f.m.n_got, n_got0);
	ck_assert_uint_eq(f.m.batches, batches0);
	/* and every page not accepted before still is acceptable */
	f.q.kv = &geom4;
	for (uint32_t i = 0; i < 3; i++) {
		if (f.got[i])
			continue;
		one = good(&f, i);
		ck_assert_int_eq(check(&f, &one, 1, 20 + i, NULL), XFER_CHECK_OK);
	}
	ck_assert_uint_eq(f.m.n_got, 3);
	xfer_batch_deinit(&x.b);
}

START_TEST(test_refusals)
{
	for (int mut = 0; mut < MUT_N; mut++)
		for (uint32_t k = mut == MUT_DUP_IN_BATCH; k < 3; k++)
			for (unsigned pre = 0; pre < 8; pre++)
				if (!(pre & 2))
					run_bad(mut, k, pre);
}
END_TEST

/* The tail of a page (positions >= tokens) is not checked: decode
 * zero-fills it, whatever the sender left there. */
START_TEST(test_nonfinite_tail_accepted)
{
	struct fix f;
	struct xfer_entry e;
	struct bat x;
	float nan = __builtin_nanf("");

	fix_init(&f, 10);
	e = good(&f, 2);          /* holds 2 of 4 positions */
	bat_build(&x, &geom4, &e, 1, 0);
	/* K and V of position 2 and 3 */
	for (uint32_t blk = 0; blk < 2; blk++)
		for (uint32_t p = 2; p < 4; p++)
			memcpy(bat_page(&x, 0) + KVTAG_BYTES + blk * 32 + p * 8,
			       &nan, 4);
	/* garbage in the tag is not K/V either (the pool checks tags) */
	memset(bat_page(&x, 0), 0xff, KVTAG_BYTES);
	ck_assert_int_eq(xfer_check_batch(&f.q, &f.m, &x.h, x.b.buf, NULL),
			 XFER_CHECK_OK);
	/* without a geometry nothing is scanned */
	fix_init(&f, 10);
	f.q.kv = NULL;
	memcpy(bat_page(&x, 0) + KVTAG_BYTES, &nan, 4);
	ck_assert_int_eq(xfer_check_batch(&f.q, &f.m, &x.h, x.b.buf, NULL),
			 XFER_CHECK_OK);
	xfer_batch_deinit(&x.b);
}
END_TEST

/* Duplicates: several copies, both kinds in one batch, the first decides. */
START_TEST(test_duplicates)
{
	struct fix f;
	struct xfer_entry e[4];
	struct xfer_check_refusal ref;

	fix_init(&f, 16);          /* 4 full pages */
	e[0] = good(&f, 0);
	ck_assert_int_eq(check(&f, e, 1, 0, NULL), XFER_CHECK_OK);
	/* (1, 1, 0): in-batch duplicate at 1 comes before the earlier one */
	e[0] = good(&f, 1);
	e[1] = good(&f, 1);
	e[2] = good(&f, 0);
	ck_assert_int_eq(check(&f, e, 3, 1, &ref), XFER_CHECK_E_DUPLICATE_IN_BATCH);
	ck_assert_uint_eq(ref.entry, 1);
	/* (1, 0, 1): the earlier-batch duplicate at 1 decides */
	e[1] = good(&f, 0);
	e[2] = good(&f, 1);
	ck_assert_int_eq(check(&f, e, 3, 1, &ref), XFER_CHECK_E_DUPLICATE);
	ck_assert_uint_eq(ref.entry, 1);
	/* four copies of page 3 */
	for (int i = 0; i < 4; i++)
		e[i] = good(&f, 3);
	ck_assert_int_eq(check(&f, e, 4, 2, &ref), XFER_CHECK_E_DUPLICATE_IN_BATCH);
	ck_assert_uint_eq(ref.entry, 1);
	assert_marks(&f, (const uint8_t[]){ 1, 0, 0, 0 }, 1, 1);
	/* coverage can never be fooled into 4 of 4 */
	e[0] = good(&f, 1);
	e[1] = good(&f, 2);
	e[2] = good(&f, 3);
	ck_assert_int_eq(check(&f, e, 3, 3, NULL), XFER_CHECK_OK);
	assert_marks(&f, (const uint8_t[]){ 1, 1, 1, 1 }, 4, 2);
}
END_TEST

START_TEST(test_coverage)
{
	struct fix f;
	struct xfer_entry e[3];
	char why[XFER_CHECK_WHY_MAX];
	struct xfer_check_done d;

	fix_init(&f, 10);
	e[0] = good(&f, 0);
	e[1] = good(&f, 2);
	ck_assert_int_eq(check(&f, e, 2, 0, NULL), XFER_CHECK_OK);
	/* short: page 1 never came, prefill claims all of it in 1 batch */
	d = (struct xfer_check_done){ 10, 3, 1 };
	ck_assert_int_eq(xfer_check_coverage(&f.q, &f.m, &d, why, sizeof(why)),
			 XFER_CHECK_E_SHORT);
	ck_assert_str_eq(why, "short transfer: 2 of 3 pages and 10 of 10 prompt tokens arrived");
	/* prefill's own counts wrong */
	d = (struct xfer_check_done){ 9, 3, 1 };
	ck_assert_int_eq(xfer_check_coverage(&f.q, &f.m, &d, why, sizeof(why)),
			 XFER_CHECK_E_DONE_TOKENS);
	ck_assert_str_eq(why, "short transfer: 2 of 3 pages and 9 of 10 prompt tokens arrived");
	d = (struct xfer_check_done){ 10, 2, 1 };
	ck_assert_int_eq(xfer_check_coverage(&f.q, &f.m, &d, why, sizeof(why)),
			 XFER_CHECK_E_DONE_PAGES);
	/* more batches announced than arrived: wait */
	d = (struct xfer_check_done){ 10, 3, 2 };
	ck_assert_int_eq(xfer_check_coverage(&f.q, &f.m, &d, why, sizeof(why)),
			 XFER_CHECK_PENDING);
	e[0] = good(&f, 1);
	ck_assert_int_eq(check(&f, e, 1, 1, NULL), XFER_CHECK_OK);
	ck_assert_int_eq(xfer_check_coverage(&f.q, &f.m, &d, why, sizeof(why)),
			 XFER_CHECK_OK);
	/* fewer announced than arrived: extra batches */
	d = (struct xfer_check_done){ 10, 3, 1 };
	ck_assert_int_eq(xfer_check_coverage(&f.q, &f.m, &d, why, sizeof(why)),
			 XFER_CHECK_E_EXTRA_BATCHES);
	ck_assert_str_eq(why, "prefill announced 1 batches but 2 arrived");
	/* a page counted twice (n_got says 3, a mark is missing) does not
	 * cover: the marks are counted, not n_got */
	f.got[1] = 0;
	d = (struct xfer_check_done){ 10, 3, 2 };
	ck_assert_uint_eq(f.m.n_got, 3);
	ck_assert_int_eq(xfer_check_coverage(&f.q, &f.m, &d, why, sizeof(why)),
			 XFER_CHECK_E_SHORT);
	/* and n_got short of the marks does not cover either */
	f.got[1] = 1;
	f.m.n_got = 2;
	ck_assert_int_eq(xfer_check_coverage(&f.q, &f.m, &d, NULL, 0),
			 XFER_CHECK_E_SHORT);
}
END_TEST

START_TEST(test_names_valid)
{
	struct fix f;

	for (int c = 0; c < XFER_CHECK_N_CODES; c++) {
		ck_assert_str_ne(xfer_check_name(c), "?");
		for (int d = 0; d < c; d++)
			ck_assert_str_ne(xfer_check_name(c), xfer_check_name(d));
	}
	ck_assert_str_eq(xfer_check_name(-1), "?");
	ck_assert_str_eq(xfer_check_name(XFER_CHECK_N_CODES), "?");
	fix_init(&f, 8);
	ck_assert(xfer_check_req_valid(&f.q));
	f.q.n_prefix = 3;
	ck_assert(!xfer_check_req_valid(&f.q));
	f.q.n_prefix = 2;
	f.q.n_prompt = 0;
	ck_assert(!xfer_check_req_valid(&f.q));
	f.q.n_prompt = 8;
	f.q.kv = &(struct kvpool_geom){ .page_tokens = 8, .n_layer = 1,
					.kv_dim = 1 };
	ck_assert(!xfer_check_req_valid(&f.q));
	ck_assert_uint_eq(xfer_check_page_tokens(&f.q, 1), 4);
	ck_assert_uint_eq(xfer_check_page_tokens(&f.q, 2), 0);
}
END_TEST

/* ---- reference model ------------------------------------------------------ */

#define MPAGES 40

struct mrun {
	uint64_t seed, rng, step;
	uint64_t codes[XFER_CHECK_N_CODES];
};

static uint64_t rnd(struct mrun *r)
{
	/* splitmix64 */
	uint64_t z = (r->rng += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static uint32_t below(struct mrun *r, uint32_t n)
{
	return (uint32_t)(rnd(r) % n);
}

/* A batch as the model sees it: entries, and at most one non-finite
 * value per entry, at position pos (-1: none). */
struct mbatch {
	uint32_t n;
	struct xfer_entry e[NMAX];
	int32_t pos[NMAX];
	uint32_t blk[NMAX], dim[NMAX];
};

/* Tokens page index i of a prompt of n tokens holds, from the protocol:
 * full pages, then the rest. */
static uint32_t m_tokens(uint32_t n, uint32_t pt, uint32_t i)
{
	uint32_t full = n / pt;

	if (i < full)
		return pt;
	if (i == full && n % pt)
		return n % pt;
	return 0;
}

static int m_check(const struct xfer_check_req *q, const bool *mgot,
		   const struct mbatch *b, uint32_t *bad)
{
	for (uint32_t i = 0; i < b->n; i++) {
		const struct xfer_entry *e = &b->e[i];
		int code = 0;

		*bad = i;
		if (e->index >= q->n_prefix)
			return XFER_CHECK_E_INDEX_RANGE;
		if (e->dst_page != q->table[e->index].page)
			return XFER_CHECK_E_WRONG_PAGE;
		if (e->dst_gen != q->table[e->index].gen)
			return XFER_CHECK_E_WRONG_GEN;
		if (mgot[e->index])
			return XFER_CHECK_E_DUPLICATE;
		for (uint32_t j = 0; j < i && !code; j++)
			if (b->e[j].index == e->index)
				code = XFER_CHECK_E_DUPLICATE_IN_BATCH;
		if (code)
			return code;
		if (e->tokens != m_tokens(q->n_prompt, q->page_tokens, e->index))
			return XFER_CHECK_E_TOKENS;
		if (b->pos[i] >= 0 && (uint32_t)b->pos[i] < e->tokens)
			return XFER_CHECK_E_NONFINITE;
	}
	return XFER_CHECK_OK;
}

#define MFAIL(r, ...)                                                        \
	ck_abort_msg("seed=%" PRIu64 " step=%" PRIu64 ": %s (rerun with "    \
		     "KVD_SEED=%" PRIu64 ")", (r)->seed, (r)->step,         \
		     (snprintf(msg, sizeof(msg), __VA_ARGS__), msg), (r)->seed)

static void m_build(struct mrun *r, const struct kvpool_geom *g,
		    const struct mbatch *mb, struct bat *x)
{
	uint32_t elt = g->dtype == KV_DTYPE_F32 ? 4 : 2;
	uint64_t block = (uint64_t)g->page_tokens * g->kv_dim * elt;

	bat_build(x, g, mb->e, mb->n, (uint32_t)r->step);
	for (uint32_t i = 0; i < mb->n; i++) {
		uint8_t *p = bat_page(x, i);

		/* zero (finite) K/V, a random tag (not K/V, not checked) */
		for (uint64_t k = 0; k < x->pb; k++)
			p[k] = k < KVTAG_BYTES ? (uint8_t)rnd(r) : 0;
		if (mb->pos[i] < 0)
			continue;
		uint8_t *at = p + KVTAG_BYTES + mb->blk[i] * block +
			      ((uint64_t)mb->pos[i] * g->kv_dim + mb->dim[i]) * elt;

		if (elt == 4)
			memcpy(at, &(uint32_t){ below(r, 2) ? 0x7fc00000u
							    : 0xff800000u }, 4);
		else
			memcpy(at, &(uint16_t){ below(r, 2) ? 0x7e00 : 0x7c00 }, 2);
	}
}

/* Coverage with done counts right or off by a little, against the
 * model's counts. */
static void m_coverage(struct mrun *r, const struct xfer_check_req *q,
		       const struct xfer_check_marks *m, uint32_t m_n_got,
		       uint32_t m_batches)
{
	char msg[256];
	struct xfer_check_done d = { q->n_prompt, q->n_prefix, m_batches };
	int want, rc;

	switch (below(r, 5)) {
	case 0: d.tokens += below(r, 2) ? 1 : -1; break;
	case 1: d.pages += below(r, 2) ? 1 : -1; break;
	case 2: d.batches += below(r, 3) - 1u; break;
	default: break;
	}
	if (m_batches < d.batches)
		want = XFER_CHECK_PENDING;
	else if (d.tokens != q->n_prompt)
		want = XFER_CHECK_E_DONE_TOKENS;
	else if (d.pages != q->n_prefix)
		want = XFER_CHECK_E_DONE_PAGES;
	else if (m_n_got != q->n_prefix)
		want = XFER_CHECK_E_SHORT;
	else if (m_batches != d.batches)
		want = XFER_CHECK_E_EXTRA_BATCHES;
	else
		want = XFER_CHECK_OK;
	rc = xfer_check_coverage(q, m, &d, NULL, 0);
	r->codes[rc]++;
	if (rc != want)
		MFAIL(r, "coverage %s, model says %s", xfer_check_name(rc),
		      xfer_check_name(want));
}

/* One random request: a reservation, batches until all pages came (or
 * a budget ran out), mutated ones mixed in, then coverage. */
static void m_request(struct mrun *r)
{
	struct kvpool_ref table[MPAGES];
	uint8_t got[MPAGES] = { 0 };
	bool mgot[MPAGES] = { false };
	uint32_t m_n_got = 0, m_batches = 0;
	struct kvpool_geom g = {
		.page_tokens = 1 + below(r, 8), .n_layer = 1 + below(r, 2),
		.kv_dim = 1 + below(r, 3),
		.dtype = below(r, 2) ? KV_DTYPE_F32 : KV_DTYPE_F16,
	};
	struct xfer_check_req q = { .table = table, .page_tokens = g.page_tokens,
				    .kv = &g };
	struct xfer_check_marks m = { .got = got };
	struct mbatch mb, last = { 0 };
	char msg[256];

	q.n_prefix = 1 + below(r, MPAGES);
	q.n_prompt = (q.n_prefix - 1) * g.page_tokens + 1 + below(r, g.page_tokens);
	for (uint32_t i = 0; i < q.n_prefix; i++)
		table[i] = (struct kvpool_ref){ below(r, 4 * MPAGES),
						rnd(r) % 1000 + 1 };
	if (!xfer_check_req_valid(&q))
		MFAIL(r, "generated an invalid reservation");
	for (int t = 0; t < 60 && m_n_got < q.n_prefix; t++, r->step++) {
		uint32_t todo[MPAGES], n_todo = 0;

		for (uint32_t i = 0; i < q.n_prefix; i++)
			if (!mgot[i])
				todo[n_todo++] = i;
		if (last.n && below(r, 8) == 0) {
			mb = last;            /* a replay */
		} else {
			/* a valid batch of some pages still due, shuffled */
			mb.n = 1 + below(r, n_todo < 8 ? n_todo : 8);
			for (uint32_t i = 0; i < mb.n; i++) {
				uint32_t j = i + below(r, n_todo - i), tmp = todo[i];

				todo[i] = todo[j];
				todo[j] = tmp;
				mb.e[i] = (struct xfer_entry){
					.dst_page = table[todo[i]].page,
					.index = todo[i], .dst_gen = table[todo[i]].gen,
					.tokens = m_tokens(q.n_prompt, g.page_tokens, todo[i]),
				};
				mb.pos[i] = -1;
			}
		}
		/* half of them mutated, some several times */
		for (uint32_t k = below(r, 2) ? 1 + below(r, 3) : 0; k; k--) {
			uint32_t i = below(r, mb.n);

			switch (below(r, 9)) {
			case 0: mb.e[i].index = below(r, q.n_prefix + 3); break;
			case 1: mb.e[i].dst_page = below(r, 4 * MPAGES); break;
			case 2: mb.e[i].dst_gen += below(r, 2) ? 1 : -1; break;
			case 3: mb.e[i].tokens = below(r, g.page_tokens + 2); break;
			case 4:       /* an accepted page again */
				if (m_n_got) {
					uint32_t j;

					do
						j = below(r, q.n_prefix);
					while (!mgot[j]);
					mb.e[i] = (struct xfer_entry){
						table[j].page, j, table[j].gen,
						m_tokens(q.n_prompt, g.page_tokens, j) };
					mb.pos[i] = -1;
				}
				break;
			case 5:       /* an entry copied within the batch */
				if (mb.n < NMAX) {
					uint32_t at = below(r, mb.n + 1);

					memmove(&mb.e[at + 1], &mb.e[at],
						(mb.n - at) * sizeof(mb.e[0]));
					memmove(&mb.pos[at + 1], &mb.pos[at],
						(mb.n - at) * sizeof(mb.pos[0]));
					memmove(&mb.blk[at + 1], &mb.blk[at],
						(mb.n - at) * sizeof(mb.blk[0]));
					memmove(&mb.dim[at + 1], &mb.dim[at],
						(mb.n - at) * sizeof(mb.dim[0]));
					mb.n++;
					uint32_t src = below(r, mb.n);

					mb.e[at] = mb.e[src];
					mb.pos[at] = -1;
				}
				break;
			default:      /* a non-finite value, held or tail */
				mb.pos[i] = (int32_t)below(r, g.page_tokens);
				mb.blk[i] = below(r, 2 * g.n_layer);
				mb.dim[i] = below(r, g.kv_dim);
				break;
			}
		}
		struct bat x;
		struct xfer_check_refusal ref;
		uint32_t bad = 0;
		int want = m_check(&q, mgot, &mb, &bad);
		int rc;

		m_build(r, &g, &mb, &x);
		rc = xfer_check_batch(&q, &m, &x.h, x.b.buf, &ref);
		xfer_batch_deinit(&x.b);
		r->codes[rc]++;
		if (rc != want)
			MFAIL(r, "batch of %u: %s, model says %s (entry %u)", mb.n,
			      xfer_check_name(rc), xfer_check_name(want), bad);
		if (rc && ref.entry != bad)
			MFAIL(r, "refused at entry %u, model says %u", ref.entry, bad);
		if (!rc) {
			for (uint32_t i = 0; i < mb.n; i++)
				mgot[mb.e[i].index] = true;
			m_n_got += mb.n;
			m_batches++;
			last = mb;
		}
		for (uint32_t i = 0; i < q.n_prefix; i++)
			if (!got[i] != !mgot[i])
				MFAIL(r, "mark %u is %u, model %d", i, got[i], mgot[i]);
		if (m.n_got != m_n_got || m.batches != m_batches)
			MFAIL(r, "n_got %u batches %u, model %u %u", m.n_got,
			      m.batches, m_n_got, m_batches);
		/* prefill_done may come at any time; a transfer may stop */
		if (below(r, 4) == 0)
			m_coverage(r, &q, &m, m_n_got, m_batches);
		if (below(r, 16) == 0)
			break;
	}
	for (int t = 0; t < 4; t++)
		m_coverage(r, &q, &m, m_n_got, m_batches);
}

START_TEST(test_model)
{
	struct mrun r = { 0 };
	const char *s = getenv("KVD_SEED");
	const char *o = getenv("KVD_XFER_CHECK_OPS");
	uint64_t reqs = o && *o ? strtoull(o, NULL, 0) : 10000;

	r.seed = s && *s ? strtoull(s, NULL, 0) : (uint64_t)time(NULL);
	r.rng = r.seed;
	printf("xfer_check model test: seed=%" PRIu64 " requests=%" PRIu64
	       " (set KVD_SEED to replay)\n", r.seed, reqs);
	fflush(stdout);
	for (uint64_t i = 0; i < reqs; i++)
		m_request(&r);
	/* every verdict was reached */
	for (int c = 0; c < XFER_CHECK_N_CODES; c++) {
		printf("  %-20s %" PRIu64 "\n", xfer_check_name(c), r.codes[c]);
		if (c != XFER_CHECK_E_GEOMETRY)
			ck_assert_msg(r.codes[c] > 0, "%s never reached (seed %" PRIu64 ")",
				      xfer_check_name(c), r.seed);
	}
}
END_TEST

static Suite *xfer_check_suite(void)
{
	Suite *s = suite_create("xfer_check");
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, test_accept_one_batch);
	tcase_add_test(tc, test_accept_multi_batch);
	tcase_add_test(tc, test_refusals);
	tcase_add_test(tc, test_nonfinite_tail_accepted);
	tcase_add_test(tc, test_duplicates);
	tcase_add_test(tc, test_coverage);
	tcase_add_test(tc, test_names_valid);
	tcase_add_test(tc, test_model);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(xfer_check_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
