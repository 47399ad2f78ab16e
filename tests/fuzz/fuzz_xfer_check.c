/* fuzz_xfer_check.c - the receive-side batch checks (net/xfer_check.h).
 *
 * A batch that passed its checksum still says whatever its sender wants
 * about where its pages go; xfer_check_batch is what stands between that
 * and decode's pool. Input bytes drive a reservation, the marks of
 * earlier batches and one batch (built with xfer_batch, then verified):
 *   byte 0        page_tokens (1..8), K/V scan on or off
 *   byte 1        K/V layout: layers, kv_dim, dtype
 *   bytes 2-3     n_prompt (n_prefix follows from it, at most 32 pages)
 *   then          per prefix page: physical page, generation, earlier mark
 *   then          n_entries (1..16), per entry: a control byte (take the
 *                 reservation's page / generation / token count or the
 *                 raw byte), index, page, generation, tokens, and a
 *                 non-finite value's position (or none)
 * Missing bytes read as 0. Properties beyond "no crash":
 *   - the verdict is 0 or a batch code; a refusal names an entry of the
 *     batch that really fails that check (recomputed here from the
 *     protocol), and every entry before it passes every check; the
 *     sentence is one non-empty line;
 *   - refused: the marks, n_got and batches are exactly as before;
 *   - accepted: every entry is in the prefix, on the reserved page in
 *     its generation, not marked before, distinct within the batch, with
 *     the token count of its index, and no non-finite value among the
 *     positions it holds; the marks are the old ones plus its indices,
 *     n_got and batches grew by n_entries and one;
 *   - accepted, the same batch again is refused as DUPLICATE at entry 0,
 *     changing nothing;
 *   - coverage with prefill_done's counts right is OK exactly when every
 *     prefix page is marked; never OK with a batch missing.
 */
#include <string.h>

#include "net/xfer_check.h"
#include "tests/fuzz/fuzz.h"

const char fuzz_target_name[] = "xfer_check";

#define MAX_PREFIX 32
#define MAX_ENTRIES 16

/* Entry control bits: take the reservation's value, else the raw byte. */
#define C_PAGE 1
#define C_GEN 2
#define C_TOKENS 4
#define C_INDEX 8         /* index = raw % n_prefix (else raw, maybe out) */
#define C_POISON 16       /* a non-finite value at a raw position */

struct cursor {
	const uint8_t *p;
	size_t n, off;
};

static uint8_t take(struct cursor *c)
{
	return c->off < c->n ? c->p[c->off++] : 0;
}

struct input {
	struct kvpool_geom g;
	bool scan;
	struct xfer_check_req q;
	struct kvpool_ref table[MAX_PREFIX];
	uint8_t got[MAX_PREFIX];
	uint32_t n_got, batches;
	uint32_t n;
	struct xfer_entry e[MAX_ENTRIES];
	int32_t pos[MAX_ENTRIES];            /* poisoned position, -1 none */
	uint32_t blk[MAX_ENTRIES], dim[MAX_ENTRIES];
};

static void parse(struct input *in, const uint8_t *data, size_t size)
{
	struct cursor c = { data, size, 0 };
	uint8_t b0 = take(&c), b1 = take(&c);
	uint32_t raw;

	memset(in, 0, sizeof(*in));
	in->g.page_tokens = 1 + b0 % 8;
	in->scan = b0 & 8;
	in->g.n_layer = 1 + b1 % 2;
	in->g.kv_dim = 1 + (b1 >> 1) % 3;
	in->g.dtype = (b1 >> 3) & 1 ? KV_DTYPE_F16 : KV_DTYPE_F32;
	raw = take(&c);
	raw |= (uint32_t)take(&c) << 8;
	in->q.page_tokens = in->g.page_tokens;
	in->q.n_prompt = 1 + raw % (MAX_PREFIX * in->g.page_tokens);
	in->q.n_prefix = (in->q.n_prompt - 1) / in->g.page_tokens + 1;
	in->q.table = in->table;
	in->q.kv = in->scan ? &in->g : NULL;
	for (uint32_t i = 0; i < in->q.n_prefix; i++) {
		in->table[i].page = take(&c);
		in->table[i].gen = 1 + take(&c) % 4;
		in->got[i] = take(&c) >= 224;   /* an earlier batch had it */
		in->n_got += in->got[i];
	}
	in->batches = in->n_got ? 1 + in->n_got / 2 : 0;
	in->n = 1 + take(&c) % MAX_ENTRIES;
	for (uint32_t i = 0; i < in->n; i++) {
		struct xfer_entry *e = &in->e[i];
		uint8_t ctl = take(&c), idx = take(&c), pg = take(&c),
			gen = take(&c), tok = take(&c), ps = take(&c);

		/* mostly well-formed: the bits say what to take as is */
		ctl = (uint8_t)~ctl;
		e->index = ctl & C_INDEX ? idx % in->q.n_prefix : idx;
		const struct kvpool_ref *r =
			&in->table[e->index < in->q.n_prefix ? e->index : 0];

		e->dst_page = ctl & C_PAGE ? r->page : pg;
		e->dst_gen = ctl & C_GEN ? r->gen : gen % 6;
		e->tokens = ctl & C_TOKENS ? xfer_check_page_tokens(&in->q, e->index)
					   : tok % (in->g.page_tokens + 2);
		in->pos[i] = -1;
		if (!(ctl & C_POISON)) {
			in->pos[i] = (int32_t)(ps % in->g.page_tokens);
			in->blk[i] = (ps >> 3) % (2 * in->g.n_layer);
			in->dim[i] = (ps >> 5) % in->g.kv_dim;
		}
	}
}

/* The tokens page i must hold, from the protocol: full pages, the rest. */
static uint32_t want_tokens(const struct input *in, uint32_t i)
{
	uint32_t pt = in->g.page_tokens, full = in->q.n_prompt / pt;

	return i < full ? pt : i == full && in->q.n_prompt % pt ? in->q.n_prompt % pt
								 : 0;
}

/* Whether entry i fails check `code`, given the marks before the batch. */
static bool fails(const struct input *in, uint32_t i, int code)
{
	const struct xfer_entry *e = &in->e[i];
	const struct kvpool_ref *r;

	if (code == XFER_CHECK_E_INDEX_RANGE)
		return e->index >= in->q.n_prefix;
	if (e->index >= in->q.n_prefix)
		return false;
	r = &in->table[e->index];
	switch (code) {
	case XFER_CHECK_E_WRONG_PAGE:
		return e->dst_page != r->page;
	case XFER_CHECK_E_WRONG_GEN:
		return e->dst_page == r->page && e->dst_gen != r->gen;
	case XFER_CHECK_E_DUPLICATE:
		return in->got[e->index];
	case XFER_CHECK_E_DUPLICATE_IN_BATCH:
		for (uint32_t j = 0; j < i; j++)
			if (in->e[j].index == e->index)
				return true;
		return false;
	case XFER_CHECK_E_TOKENS:
		return e->tokens != want_tokens(in, e->index);
	case XFER_CHECK_E_NONFINITE:
		return in->scan && in->pos[i] >= 0 &&
		       (uint32_t)in->pos[i] < e->tokens;
	default:
		return false;
	}
}

static void build(const struct input *in, struct xfer_batch *x,
		  struct xfer_hdr *h)
{
	uint64_t pb = kvpool_page_bytes(&in->g);
	uint32_t elt = in->g.dtype == KV_DTYPE_F32 ? 4 : 2;
	uint64_t block = (uint64_t)in->g.page_tokens * in->g.kv_dim * elt;
	uint64_t bound = xfer_batch_bytes(MAX_ENTRIES, pb);
	int r = xfer_batch_init(x, pb, bound);

	FUZZ_CHECK(r == 0, "builder: %d", r);
	xfer_batch_reset(x, 42, 7);
	for (uint32_t i = 0; i < in->n; i++) {
		uint8_t *slot;

		FUZZ_CHECK(xfer_batch_add(x, &in->e[i], &slot) == 0, "add %u", i);
		memset(slot, 0, pb);
		if (in->pos[i] < 0)
			continue;
		uint8_t *at = slot + KVTAG_BYTES + in->blk[i] * block +
			      ((uint64_t)in->pos[i] * in->g.kv_dim + in->dim[i]) * elt;

		if (elt == 4)
			memcpy(at, &(uint32_t){ 0x7fc00000u }, 4);
		else
			memcpy(at, &(uint16_t){ 0x7c00 }, 2);
	}
	size_t len = xfer_batch_seal(x, true);

	r = xfer_batch_verify(x->buf, len, pb, bound, true, h);
	FUZZ_CHECK(r == 0, "built batch refused: %s", xfer_strerror(r));
}

static void check_refused(const struct input *in, int rc,
			  const struct xfer_check_refusal *ref)
{
	FUZZ_CHECK(rc >= XFER_CHECK_E_INDEX_RANGE && rc <= XFER_CHECK_E_NONFINITE &&
		   rc != XFER_CHECK_E_GEOMETRY, "verdict %d", rc);
	FUZZ_CHECK(ref->entry < in->n, "refused entry %u of %u", ref->entry, in->n);
	FUZZ_CHECK(fails(in, ref->entry, rc), "entry %u does not fail %s",
		   ref->entry, xfer_check_name(rc));
	for (int c = XFER_CHECK_E_INDEX_RANGE; c < rc; c++)
		FUZZ_CHECK(!fails(in, ref->entry, c),
			   "entry %u fails %s before %s", ref->entry,
			   xfer_check_name(c), xfer_check_name(rc));
	for (uint32_t i = 0; i < ref->entry; i++)
		for (int c = XFER_CHECK_E_INDEX_RANGE; c <= XFER_CHECK_E_NONFINITE; c++)
			FUZZ_CHECK(!fails(in, i, c), "entry %u before the refused "
				   "one fails %s", i, xfer_check_name(c));
	size_t l = strnlen(ref->why, sizeof(ref->why));

	FUZZ_CHECK(l > 0 && l < sizeof(ref->why) && !strchr(ref->why, '\n'),
		   "sentence of %zu bytes", l);
}

static void check_accepted(const struct input *in,
			   const struct xfer_check_marks *m)
{
	for (uint32_t i = 0; i < in->n; i++) {
		const struct xfer_entry *e = &in->e[i];

		for (int c = XFER_CHECK_E_INDEX_RANGE; c <= XFER_CHECK_E_NONFINITE; c++)
			FUZZ_CHECK(!fails(in, i, c), "accepted entry %u fails %s",
				   i, xfer_check_name(c));
		FUZZ_CHECK(e->tokens >= 1 && e->tokens <= in->g.page_tokens,
			   "accepted %u tokens", e->tokens);
	}
	for (uint32_t k = 0; k < in->q.n_prefix; k++) {
		bool named = false;

		for (uint32_t i = 0; i < in->n; i++)
			named |= in->e[i].index == k;
		FUZZ_CHECK(!m->got[k] == !(in->got[k] || named),
			   "mark %u is %u after accept", k, m->got[k]);
	}
	FUZZ_CHECK(m->n_got == in->n_got + in->n && m->batches == in->batches + 1,
		   "n_got %u batches %u after accept", m->n_got, m->batches);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct input in;
	struct xfer_check_marks m;
	struct xfer_check_refusal ref;
	struct xfer_batch x;
	struct xfer_hdr h;
	uint8_t got[MAX_PREFIX];
	int rc;

	parse(&in, data, size);
	FUZZ_CHECK(xfer_check_req_valid(&in.q), "generated reservation invalid");
	memcpy(got, in.got, sizeof(got));
	m = (struct xfer_check_marks){ got, in.n_got, in.batches };
	build(&in, &x, &h);
	memset(&ref, 0, sizeof(ref));
	rc = xfer_check_batch(&in.q, &m, &h, x.buf, &ref);
	if (rc) {
		check_refused(&in, rc, &ref);
		FUZZ_CHECK(!memcmp(got, in.got, sizeof(got)) &&
			   m.n_got == in.n_got && m.batches == in.batches,
			   "a refusal (%s) changed the marks", xfer_check_name(rc));
	} else {
		uint8_t after[MAX_PREFIX];
		struct xfer_check_marks m2;

		check_accepted(&in, &m);
		memcpy(after, got, sizeof(after));
		m2 = m;
		rc = xfer_check_batch(&in.q, &m, &h, x.buf, &ref);
		FUZZ_CHECK(rc == XFER_CHECK_E_DUPLICATE && ref.entry == 0,
			   "the same batch again: %s at %u", xfer_check_name(rc),
			   ref.entry);
		FUZZ_CHECK(!memcmp(got, after, sizeof(after)) &&
			   m.n_got == m2.n_got && m.batches == m2.batches,
			   "a refused replay changed the marks");
	}
	/* coverage with prefill_done's counts right */
	struct xfer_check_done d = { in.q.n_prompt, in.q.n_prefix, m.batches };
	bool all = true;

	for (uint32_t k = 0; k < in.q.n_prefix; k++)
		all &= got[k] != 0;
	rc = xfer_check_coverage(&in.q, &m, &d, NULL, 0);
	FUZZ_CHECK((rc == XFER_CHECK_OK) == all, "coverage %s with%s every page",
		   xfer_check_name(rc), all ? "" : "out");
	FUZZ_CHECK(rc == XFER_CHECK_OK || rc == XFER_CHECK_E_SHORT,
		   "coverage %s", xfer_check_name(rc));
	d.batches++;
	rc = xfer_check_coverage(&in.q, &m, &d, NULL, 0);
	FUZZ_CHECK(rc == XFER_CHECK_PENDING, "coverage %s with a batch due",
		   xfer_check_name(rc));
	xfer_batch_deinit(&x);
	return 0;
}

/* ---- seeds --------------------------------------------------------------- */

/* A reservation of n_prompt tokens, pages marked earlier as in `pre`,
 * and a batch of the given indices, all well-formed unless ctl says. */
static void seed(fuzz_emit_fn emit, void *ctx, uint8_t b0, uint8_t b1,
		 uint16_t n_prompt, uint32_t pre, const uint8_t *idx, uint32_t n,
		 uint8_t ctl_clear, uint8_t tok)
{
	struct fuzz_bytes b = { 0 };
	uint32_t pt = 1 + b0 % 8;
	/* parse() takes 1 + raw % (32 pt): raw = n_prompt - 1 */
	uint16_t raw = (uint16_t)(n_prompt - 1);
	uint32_t n_prefix = (n_prompt - 1u) / pt + 1;
	uint8_t v;

	fuzz_bytes_add(&b, &b0, 1);
	fuzz_bytes_add(&b, &b1, 1);
	fuzz_bytes_add(&b, &raw, 2);   /* little-endian hosts */
	for (uint32_t i = 0; i < n_prefix; i++) {
		uint8_t pg[3] = { (uint8_t)(3 * i + 1), (uint8_t)i,
				  pre >> i & 1 ? 255 : 0 };

		fuzz_bytes_add(&b, pg, 3);
	}
	v = (uint8_t)(n - 1);
	fuzz_bytes_add(&b, &v, 1);
	for (uint32_t i = 0; i < n; i++) {
		/* control bits are inverted: 0 takes everything as reserved */
		uint8_t ent[6] = { ctl_clear, idx[i], 9, 5, tok, 0 };

		fuzz_bytes_add(&b, ent, 6);
	}
	emit(ctx, b.p, b.n);
	free(b.p);
}

void fuzz_target_seeds(fuzz_emit_fn emit, void *ctx)
{
	static const uint8_t all[8] = { 0, 1, 2, 3, 4, 5, 6, 7 };
	static const uint8_t rev[3] = { 2, 1, 0 };
	static const uint8_t dup[3] = { 0, 1, 0 };

	/* accepted: the whole prefix (last page partial), K/V scanned */
	seed(emit, ctx, 3 | 8, 0, 14, 0, all, 4, 0, 0);
	seed(emit, ctx, 3 | 8, 8 | 2, 14, 0, rev, 3, 0, 0);      /* f16 */
	/* accepted: the rest after earlier batches; then coverage OK */
	seed(emit, ctx, 1, 0, 5, 0x5, (const uint8_t[]){ 1 }, 1, 0, 0);
	/* refused: duplicates, within and across batches */
	seed(emit, ctx, 3, 0, 14, 0, dup, 3, 0, 0);
	seed(emit, ctx, 3, 0, 14, 0x2, all, 2, 0, 0);
	/* refused: raw page, raw generation, raw tokens, raw index */
	seed(emit, ctx, 3, 0, 14, 0, all, 2, C_PAGE, 0);
	seed(emit, ctx, 3, 0, 14, 0, all, 2, C_GEN, 0);
	seed(emit, ctx, 3, 0, 14, 0, all, 2, C_TOKENS, 3);
	seed(emit, ctx, 3, 0, 14, 0, (const uint8_t[]){ 9 }, 1, C_INDEX, 0);
	/* refused: a NaN in a held position */
	seed(emit, ctx, 7 | 8, 1, 60, 0, all, 8, C_POISON, 0);
	/* one token, one page; a long prompt of one-token pages */
	seed(emit, ctx, 0, 0, 1, 0, all, 1, 0, 0);
	seed(emit, ctx, 0 | 8, 4, 32, 0, all, 8, 0, 0);
}
