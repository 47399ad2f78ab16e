/* jsongram.c - the JSON recognizer, the schema node tree and the token
 * mask (jsongram.h).
 *
 * Design. The recognizer is a pushdown automaton over bytes. Its state
 * is a stack of container frames (object or array: node, phase, items
 * counted, properties used) and one scalar in progress above them (a
 * free string, a number, or a literal: enum values, property names,
 * true/false/null, matched byte for byte against candidate texts with a
 * bitmask of those still possible). A literal or a number ends lazily:
 * the byte that cannot extend it is handed to the container, so `1` and
 * `12` may both be enum values. Each phase accepts only bytes that leave
 * a way to finish (the no-dead-end rule of the header), so the mask is
 * never empty when every byte is a token.
 *
 * The mask. The vocabulary is a byte trie in preorder (each node: its
 * byte, its depth, where its subtree ends, the tokens whose piece ends
 * there). One walk per step: a node's state is its parent's after one
 * byte; a rejected byte skips the whole subtree. States are copied only
 * as deep as the stack is used, and a byte inside a plain string that
 * changes nothing (most of them) is not copied at all: the child shares
 * its parent's state. So a step costs about one pass over the trie's
 * nodes that can still follow, not one per token per byte. Inside string
 * text, where most of a JSON answer's tokens fall, the tokens made only
 * of plain text bytes are allowed as one precomputed set and only the
 * others (quotes, backslashes, control and non-ASCII bytes: a second,
 * smaller trie) are walked - also in a string with lengths only while
 * any piece fits. In a string with a pattern the plain tokens allowed
 * depend on the pattern's state (and, near its length bounds, on the
 * length): far from the bounds they are kept for the last state seen
 * (run_pat; a repeated class stays in one state), else all is walked.
 *
 * Tool calls. A tagged union is one object frame whose node changes
 * under it: it starts on the union node (only the tag key, then one of
 * the tag's values), and the value chosen switches the frame to its
 * variant, an ordinary object node, with no property used yet. A wrap
 * is a segment above the JSON state: matching pre (tpos bytes so far),
 * the value, matching post; the JSON state is reset for each
 * repetition.
 *
 * A lead token (jgram_lead; Mistral's [TOOL_CALLS]) is a control token,
 * which the trie never holds and which decodes to no bytes: it cannot be
 * a byte segment. The run resolves it to its id in the vocabulary's
 * tokenizer and, until it is drawn, masks every other token; it then
 * feeds nothing and the byte grammar starts. A run fed bytes only (no
 * vocabulary) has no lead: its bytes are those after it.
 *
 * Sharing. A sealed grammar is only read, so one may serve several
 * runs at once (the n choices of one request: each its own run, all of
 * one grammar). Whoever holds a run holds a reference to its grammar
 * (jgram_ref); jgram_free drops one, and the last frees it. The count
 * is atomic: a reference may be dropped on a worker thread (a request
 * refused while its body was prepared) as well as on the loop.
 *
 * Lazy grammars (tool_choice "auto"). Free text is three more segments
 * of the same state (SEG_FREE: KMP over pre, tpos its bytes pending;
 * SEG_START; SEG_OFF), so a token straddling the trigger is judged by
 * the one state_step: its bytes after the trigger run in the value
 * segment. Its mask starts from all allowed and clears what fails:
 * with nothing pending only the vocabulary's tokens holding the whole
 * trigger can fail (struct vtrig, listed on a trigger's first use and
 * kept; the vocabulary's one mutable part, under a lock); with a part
 * pending the trie walk stops at every prefix that drops the match
 * (free text again, nothing pending: the same list covers the rest).
 * A lazy lead (JGRAM_LAZY_LEAD, Mistral v0.3) needs none of that: until
 * the lead token is drawn every token is allowed and no byte is fed.
 */
#include "gpu/text/jsongram.h"
#include "gpu/text/jsonpat.h"

#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- grammar -------------------------------------------------------------- */

/* A string's checks (jgram_str_add). */
struct gstr {
	uint32_t min_len, max_len;       /* code points */
	struct jpat *pat;                /* NULL: none */
};

/* A number's range (jgram_range_add). A real's (not an integer-only
 * number's) bounds are glo <= v <= ghi on v in units of 10^-17 (every
 * real the grammar writes is a whole number of them): an exclusive
 * bound moved past the reals a double parser reads as the bound itself
 * (bound_pad), so the exact test is the double one. */
struct grange {
	int64_t lo, hi;
	bool lo_excl, hi_excl;
	__int128 glo, ghi;
};

struct jgram {
	struct jgram_node *nodes;        /* (n_nodes) */
	struct grange *ranges;           /* (n_ranges) [0] unused */
	uint32_t n_ranges, cap_ranges;
	struct gstr *strs;               /* (n_strs) [0] unused */
	uint32_t n_strs, cap_strs;
	uint32_t n_nodes, cap_nodes;
	struct jgram_lit *lits;          /* (n_lits) */
	uint32_t n_lits, cap_lits;
	char *bytes;                     /* (n_bytes) literal texts */
	uint32_t n_bytes, cap_bytes;
	uint16_t root;
	bool sealed;
	/* the wrap (jgram_wrap): post_len 0 when none */
	char pre[JGRAM_WRAP_MAX], post[JGRAM_WRAP_MAX];
	uint8_t pre_len, post_len;
	uint16_t max_rep;
	/* the lead control token's text (jgram_lead): lead_len 0 when none */
	char lead[JGRAM_WRAP_MAX];
	uint8_t lead_len;
	atomic_uint refs;                /* holders (jgram_ref); 1 when made */
	/* jgram_lazy: enum jgram_lazy; fail[k] the trigger's (pre's) KMP
	 * fallback after a mismatch with k + 1 bytes matched */
	uint8_t lazy;
	uint8_t fail[JGRAM_WRAP_MAX];
};

/* literals every grammar has, first: true, false, null */
enum { LIT_TRUE, LIT_FALSE, LIT_NULL, LIT_BUILTIN };

static int grow(void **p, uint32_t *cap, uint32_t need, size_t elem)
{
	uint32_t nc = *cap ? *cap : 16;
	void *np;

	if (need <= *cap)
		return 0;
	while (nc < need)
		nc *= 2;
	np = realloc(*p, (size_t)nc * elem);
	if (!np)
		return -ENOMEM;
	*p = np;
	*cap = nc;
	return 0;
}

int jgram_node_add(struct jgram *g, uint16_t *id, struct jgram_node **node)
{
	int rc;

	if (g->sealed || g->n_nodes >= JGRAM_NODES_MAX)
		return JGRAM_E_INVALID;
	rc = grow((void **)&g->nodes, &g->cap_nodes, g->n_nodes + 1, sizeof(*g->nodes));
	if (rc)
		return rc;
	g->nodes[g->n_nodes] = (struct jgram_node){ .max_items = JGRAM_ITEMS_MAX };
	*id = (uint16_t)g->n_nodes;
	if (node)
		*node = &g->nodes[g->n_nodes];
	g->n_nodes++;
	return 0;
}

struct jgram_node *jgram_node(struct jgram *g, uint16_t id)
{
	return id < g->n_nodes ? &g->nodes[id] : NULL;
}

uint32_t jgram_n_nodes(const struct jgram *g)
{
	return g->n_nodes;
}

int jgram_lit_add(struct jgram *g, const char *text, size_t len, uint16_t node,
		  uint32_t *idx)
{
	int rc;

	if (g->sealed || len == 0 || len > JGRAM_LIT_BYTES_MAX ||
	    g->n_bytes + len > JGRAM_LIT_BYTES_MAX)
		return JGRAM_E_INVALID;
	rc = grow((void **)&g->lits, &g->cap_lits, g->n_lits + 1, sizeof(*g->lits));
	if (!rc)
		rc = grow((void **)&g->bytes, &g->cap_bytes, g->n_bytes + (uint32_t)len, 1);
	if (rc)
		return rc;
	memcpy(g->bytes + g->n_bytes, text, len);
	g->lits[g->n_lits] = (struct jgram_lit){ .off = g->n_bytes,
						 .len = (uint32_t)len, .node = node };
	g->n_bytes += (uint32_t)len;
	if (idx)
		*idx = g->n_lits;
	g->n_lits++;
	return 0;
}

struct jgram *jgram_ref(struct jgram *g)
{
	atomic_fetch_add_explicit(&g->refs, 1, memory_order_relaxed);
	return g;
}

static int str_bad(char *msg, size_t n, const char *what)
{
	if (msg && n)
		snprintf(msg, n, "%s", what);
	return JGRAM_E_INVALID;
}

/* The pattern compiled into k (k->pat NULL without one). */
static int str_pattern(struct gstr *k, const char *pattern, size_t len, char *msg,
		       size_t msg_len)
{
	int rc;

	if (!pattern)
		return 0;
	if (!(k->pat = calloc(1, sizeof(*k->pat))))
		return -ENOMEM;
	rc = jpat_compile(k->pat, pattern, len, msg, msg_len);
	if (rc) {
		jpat_free(k->pat);
		free(k->pat);
		k->pat = NULL;
	}
	return rc == JPAT_E_INVALID ? JGRAM_E_INVALID : rc;
}

static bool str_fits(const struct gstr *k, uint64_t set, uint32_t n);

int jgram_str_add(struct jgram *g, uint32_t min_len, uint32_t max_len,
		  const char *pattern, size_t pattern_len, uint16_t *idx,
		  char *msg, size_t msg_len)
{
	struct gstr k = { .min_len = min_len, .max_len = max_len };
	uint32_t at = g->n_strs ? g->n_strs : 1;
	int rc;

	if (g->sealed || at >= JGRAM_STRS_MAX)
		return str_bad(msg, msg_len, "too many string checks");
	if (min_len > max_len || (max_len != UINT32_MAX && max_len > JGRAM_LEN_MAX) ||
	    min_len > JGRAM_LEN_MAX)
		return str_bad(msg, msg_len, "string lengths out of order or too large");
	if ((rc = grow((void **)&g->strs, &g->cap_strs, at + 1, sizeof(*g->strs))) ||
	    (rc = str_pattern(&k, pattern, pattern_len, msg, msg_len)))
		return rc;
	if (!str_fits(&k, 1, 0)) {
		jpat_free(k.pat);
		free(k.pat);
		return str_bad(msg, msg_len, "no string of the lengths matches the pattern");
	}
	g->strs[0] = (struct gstr){ .max_len = UINT32_MAX };
	g->strs[at] = k;
	g->n_strs = at + 1;
	*idx = (uint16_t)at;
	return 0;
}

#define NUM_UNIT ((__int128)100000000000000000)   /* 10^JGRAM_NUM_FRAC_MAX */
_Static_assert(JGRAM_NUM_FRAC_MAX == 17, "NUM_UNIT is 10^JGRAM_NUM_FRAC_MAX");

/* Half the gap from b to the next double above it (up) or below, in
 * units of 10^-17, rounded down (|b| <= 2^53: b is a double): a real
 * between b and b +- that is read as b by a parser that rounds to
 * nearest (an exact tie too, for half-even). */
static __int128 bound_pad(int64_t b, bool up)
{
	uint64_t m = b < 0 ? -(uint64_t)b : (uint64_t)b;
	bool inward = b > 0 ? !up : up;   /* toward 0: a power of two's gap is half */
	int k;

	if (!m)
		return 0;   /* the subnormals' gap: under 10^-17 */
	k = 63 - __builtin_clzll(m) - 53 - (inward && !(m & (m - 1)));
	return k >= 0 ? NUM_UNIT << k : NUM_UNIT >> -k;
}

int jgram_range_add(struct jgram *g, int64_t lo, bool lo_excl, int64_t hi, bool hi_excl,
		    bool integer, uint16_t *idx)
{
	uint32_t at = g->n_ranges ? g->n_ranges : 1;
	int rc;

	if (g->sealed || at >= JGRAM_RANGES_MAX || lo < -JGRAM_RANGE_ABS ||
	    hi > JGRAM_RANGE_ABS || lo > JGRAM_RANGE_ABS || hi < -JGRAM_RANGE_ABS)
		return JGRAM_E_INVALID;
	/* empty: after the bounds check, so lo + 1 and hi - 1 cannot overflow */
	if (integer ? lo + lo_excl > hi - hi_excl : lo > hi || (lo == hi && (lo_excl || hi_excl)))
		return JGRAM_E_INVALID;
	if (!integer && ((lo_excl && (lo > JGRAM_EXCL_ABS || lo < -JGRAM_EXCL_ABS)) ||
			 (hi_excl && (hi > JGRAM_EXCL_ABS || hi < -JGRAM_EXCL_ABS))))
		return JGRAM_E_INVALID;
	if ((rc = grow((void **)&g->ranges, &g->cap_ranges, at + 1, sizeof(*g->ranges))))
		return rc;
	g->ranges[0] = (struct grange){ 0 };
	g->ranges[at] = (struct grange){
		.lo = lo, .hi = hi, .lo_excl = lo_excl, .hi_excl = hi_excl,
		.glo = (__int128)lo * NUM_UNIT + (lo_excl ? bound_pad(lo, true) + 1 : 0),
		.ghi = (__int128)hi * NUM_UNIT - (hi_excl ? bound_pad(hi, false) + 1 : 0) };
	g->n_ranges = at + 1;
	*idx = (uint16_t)at;
	return 0;
}

void jgram_free(struct jgram *g)
{
	/* acq_rel: the last holder sees every other holder's reads done */
	if (!g || atomic_fetch_sub_explicit(&g->refs, 1, memory_order_acq_rel) != 1)
		return;
	for (uint32_t i = 1; i < g->n_strs; i++) {
		jpat_free(g->strs[i].pat);
		free(g->strs[i].pat);
	}
	free(g->strs);
	free(g->ranges);
	free(g->nodes);
	free(g->lits);
	free(g->bytes);
	free(g);
}

int jgram_new(struct jgram **out)
{
	static const char *const builtin[LIT_BUILTIN] = { "true", "false", "null" };
	struct jgram *g = calloc(1, sizeof(*g));
	struct jgram_node *any;
	uint16_t id;
	int rc;

	if (!g)
		return -ENOMEM;
	atomic_init(&g->refs, 1);
	rc = jgram_node_add(g, &id, &any);
	for (unsigned i = 0; !rc && i < LIT_BUILTIN; i++)
		rc = jgram_lit_add(g, builtin[i], strlen(builtin[i]), 0, NULL);
	if (rc) {
		jgram_free(g);
		return rc;
	}
	g->nodes[JGRAM_ANY] = (struct jgram_node){ .types = JGRAM_T_ALL,
		.items = JGRAM_ANY, .free_keys = true, .max_items = JGRAM_ITEMS_MAX };
	*out = g;
	return 0;
}

int jgram_new_object(struct jgram **out)
{
	struct jgram_node *n;
	uint16_t id;
	int rc = jgram_new(out);

	if (!rc)
		rc = jgram_node_add(*out, &id, &n);
	if (!rc) {
		n->types = JGRAM_T_OBJECT;
		n->free_keys = true;
		rc = jgram_seal(*out, id, NULL, 0);
	}
	if (rc) {
		jgram_free(*out);
		*out = NULL;
	}
	return rc == JGRAM_E_INVALID ? -EINVAL : rc;
}

/* ---- recognizer state ----------------------------------------------------- */

enum frame_kind { K_OBJ = 1, K_ARR };
enum frame_phase {
	P_OPEN = 1,       /* object after '{': a key or '}' */
	P_KEY,            /* object after ',': a key */
	P_COLON,          /* object after a key: ':' */
	P_VALUE,          /* object after ':', array after ',': a value */
	P_FIRST,          /* array after '[': a value or ']' */
	P_AFTER,          /* after a value: ',' or the close */
};
enum scalar_kind { S_NONE = 0, S_LIT, S_STR, S_NUM };
enum num_phase { N_MINUS = 1, N_ZERO, N_INT, N_DOT, N_FRAC, N_EXP, N_ESIGN, N_EDIG };
enum str_flag {
	F_KEY = 1 << 0,       /* the scalar is a property name */
	F_INT = 1 << 1,       /* number: integer only */
	F_D = 1 << 2,         /* \u escape: its first digit was d/D */
	F_HIGH = 1 << 3,      /* \u escape: a high surrogate */
	F_LOW_DUE = 1 << 4,   /* a low surrogate escape must come next */
	F_IN_LOW = 1 << 5,    /* \u escape: the low surrogate */
	F_TAG = 1 << 6,       /* the scalar is a union's tag value */
};
#define PROP_FREE 0xffu
#define PROP_TAG 0xfeu    /* a union's frame: the tag's value is due */

/* Where a wrapped run is (SEG_VALUE for a grammar without a wrap);
 * a lazy run (jgram_lazy) starts in one of the free segments, the last
 * three: the grammar holds from the segment it leaves them for. */
enum seg {
	SEG_VALUE = 0, SEG_PRE, SEG_POST,
	SEG_FREE,         /* JGRAM_LAZY_PRE: free text, tpos bytes of pre matched */
	SEG_START,        /* JGRAM_LAZY_START: only whitespace so far */
	SEG_OFF,          /* JGRAM_LAZY_START: text, free to the end */
};

struct frame {
	uint64_t used;                   /* object: properties given (bit i) */
	uint16_t node;
	uint16_t count;                  /* array: items so far (saturates) */
	uint8_t kind, phase;
	uint8_t prop;                    /* object: the value's property, PROP_FREE */
};

struct scalar {
	uint64_t cand;                   /* literal: candidates still matching */
	uint64_t nfa;                    /* string with a pattern: its state */
	uint32_t cps;                    /* string with checks: code points so far */
	uint16_t str;                    /* string: its checks, 0 none */
	uint16_t rng;                    /* number: its range, 0 none */
	bool neg;                        /* number with a range: '-' came */
	uint64_t mag, frac;              /* number with a range: the digits
					  * before '.', after it */
	uint32_t first;                  /* literal: cand bit 0's literal */
	uint16_t pos;                    /* literal, number: bytes so far */
	uint8_t kind;                    /* enum scalar_kind */
	uint8_t sub;                     /* string: escape phase; number: phase */
	uint8_t u8_need, u8_lo, u8_hi;   /* string: UTF-8 continuation due */
	uint8_t flags;                   /* enum str_flag */
};

struct state {
	struct scalar s;
	uint8_t depth;                   /* frames in use */
	uint8_t ws;                      /* whitespace bytes in a row */
	bool done;                       /* the top value is complete */
	bool lax;                        /* numbers unbounded (checking literals) */
	uint8_t seg;                     /* enum seg */
	uint8_t tpos;                    /* SEG_PRE, SEG_POST: bytes matched */
	uint8_t reps;                    /* wrap: repetitions complete */
	struct frame f[JGRAM_DEPTH_MAX];
};

/* Copy only the frames in use: most states are shallow. */
static void state_copy(struct state *dst, const struct state *src)
{
	memcpy(dst, src, offsetof(struct state, f) + src->depth * sizeof(src->f[0]));
}

static bool is_ws(uint8_t c)
{
	return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static bool is_digit(uint8_t c)
{
	return c >= '0' && c <= '9';
}

static bool is_hex(uint8_t c)
{
	return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* A value ended: the container goes on (or the top is complete). */
static void value_done(const struct jgram *g, struct state *st, uint32_t key_lit)
{
	struct frame *f;
	bool key = st->s.flags & F_KEY, tag = st->s.flags & F_TAG;

	st->s.kind = S_NONE;
	st->s.flags = 0;
	if (!st->depth) {
		st->done = true;
		return;
	}
	f = &st->f[st->depth - 1];
	if (tag) {   /* the union's frame becomes its variant's */
		f->node = g->lits[key_lit].node;
		f->used = 0;
		f->prop = PROP_FREE;
		f->phase = P_AFTER;
		return;
	}
	if (key) {
		f->phase = P_COLON;
		f->prop = PROP_FREE;
		if (g->nodes[f->node].is_union) {
			f->prop = PROP_TAG;
		} else if (key_lit != UINT32_MAX) {
			f->prop = (uint8_t)(key_lit - g->nodes[f->node].lit);
			f->used |= UINT64_C(1) << f->prop;
		}
		return;
	}
	if (f->kind == K_ARR && f->count < UINT16_MAX)
		f->count++;
	f->phase = P_AFTER;
}

/* ---- scalars ---------------------------------------------------------- */

enum { R_REJECT = 0, R_OK, R_END };

static uint32_t lit_complete(const struct jgram *g, const struct scalar *s)
{
	for (uint64_t m = s->cand; m; m &= m - 1) {
		uint32_t i = s->first + (uint32_t)__builtin_ctzll(m);

		if (g->lits[i].len == s->pos)
			return i;
	}
	return UINT32_MAX;
}

static int lit_step(const struct jgram *g, struct scalar *s, uint8_t c)
{
	uint64_t next = 0;

	for (uint64_t m = s->cand; m; m &= m - 1) {
		unsigned b = (unsigned)__builtin_ctzll(m);
		const struct jgram_lit *l = &g->lits[s->first + b];

		if (l->len > s->pos && (uint8_t)g->bytes[l->off + s->pos] == c)
			next |= UINT64_C(1) << b;
	}
	if (next) {
		s->cand = next;
		s->pos++;
		return R_OK;
	}
	return lit_complete(g, s) != UINT32_MAX ? R_END : R_REJECT;
}

static bool num_complete(const struct scalar *s)
{
	return s->sub == N_ZERO || s->sub == N_INT || s->sub == N_FRAC ||
	       s->sub == N_EDIG;
}

/* The digits a number part may have (its digit phase). */
static unsigned num_part_max(uint8_t phase)
{
	return phase == N_INT ? JGRAM_NUM_INT_MAX : phase == N_FRAC ? JGRAM_NUM_FRAC_MAX
								    : JGRAM_NUM_EXP_MAX;
}

/* The number's next phase after c, 0 when c cannot continue it. The
 * part's digits so far are in u8_need; lax: no bound on them. */
static uint8_t num_next(const struct scalar *s, uint8_t c, bool lax)
{
	bool more = lax || s->u8_need < num_part_max(s->sub);
	bool real = !(s->flags & F_INT);
	bool e = (c == 'e' || c == 'E') && !s->rng;

	switch (s->sub) {
	case N_MINUS:
		return c == '0' ? N_ZERO : is_digit(c) ? N_INT : 0;
	case N_ZERO:
	case N_INT:
		if (is_digit(c))
			return s->sub == N_INT && more ? N_INT : 0;
		if (real && c == '.')
			return N_DOT;
		return real && e ? N_EXP : 0;
	case N_DOT:
		return is_digit(c) ? N_FRAC : 0;
	case N_FRAC:
		if (is_digit(c))
			return more ? N_FRAC : 0;
		return e ? N_EXP : 0;
	case N_EXP:
		if (c == '+' || c == '-')
			return N_ESIGN;
		return is_digit(c) ? N_EDIG : 0;
	case N_ESIGN:
		return is_digit(c) ? N_EDIG : 0;
	case N_EDIG:
		return is_digit(c) && more ? N_EDIG : 0;
	}
	return 0;
}

/* ---- number ranges (jgram_range_add) ---- */

typedef __int128 i128;

static i128 pow10i(unsigned n)
{
	i128 p = 1;

	while (n--)
		p *= 10;
	return p;
}

/* Some value whose magnitude lies in [a, b) (units of 1/scale, a power
 * of ten) is in range r (its sign neg): integers (scale 1) against the
 * bounds made inclusive, reals on the 10^-17 grid against glo, ghi. */
static bool rng_fits(const struct grange *r, bool integer, bool neg, i128 a, i128 b,
		     i128 scale)
{
	i128 lo = r->lo * scale + r->lo_excl, hi = r->hi * scale - r->hi_excl, t;

	if (!integer) {
		lo = r->glo;
		hi = r->ghi;
		a *= NUM_UNIT / scale;
		b *= NUM_UNIT / scale;
	}
	b--;   /* [a, b] on the grid */
	if (neg)
		t = a, a = -b, b = -t;
	return a <= hi && b >= lo;
}

/* The number is complete and in its range. */
static bool num_done(const struct jgram *g, const struct scalar *s)
{
	const struct grange *r = s->rng ? &g->ranges[s->rng] : NULL;
	unsigned n = s->sub == N_FRAC ? s->u8_need : 0;
	i128 v = (i128)s->mag * pow10i(n) + (i128)(n ? s->frac : 0), sc = pow10i(n);
	i128 lo, hi;

	if (!num_complete(s) || !r)
		return num_complete(s);
	if (s->neg)
		v = -v;
	if (!(s->flags & F_INT))
		return v * (NUM_UNIT / sc) >= r->glo && v * (NUM_UNIT / sc) <= r->ghi;
	lo = r->lo * sc;
	hi = r->hi * sc;
	return (r->lo_excl ? v > lo : v >= lo) && (r->hi_excl ? v < hi : v <= hi);
}

/* The number so far can still end in its range. */
static bool num_feasible(const struct jgram *g, const struct scalar *s)
{
	const struct grange *r = &g->ranges[s->rng];
	bool in = s->flags & F_INT;
	i128 m = (i128)s->mag;

	switch (s->sub) {
	case N_MINUS:
		return rng_fits(r, in, true, 0, pow10i(JGRAM_NUM_INT_MAX), 1);
	case N_ZERO:
	case N_DOT:
		return rng_fits(r, in, s->neg, m, m + 1, 1);
	case N_INT:
		for (unsigned j = 0; j + s->u8_need <= JGRAM_NUM_INT_MAX; j++)
			if (rng_fits(r, in, s->neg, m * pow10i(j), (m + 1) * pow10i(j), 1))
				return true;
		return false;
	case N_FRAC:
		if (s->u8_need >= JGRAM_NUM_FRAC_MAX)   /* no digit may follow */
			return num_done(g, s);
		m = m * pow10i(s->u8_need) + (i128)s->frac;
		return rng_fits(r, in, s->neg, m, m + 1, pow10i(s->u8_need));
	}
	return false;
}

/* Phase n after byte c: the digits counted, a range's value read. */
static void num_apply(struct scalar *s, uint8_t n, uint8_t c)
{
	s->u8_need = n == s->sub ? (uint8_t)(s->u8_need + 1) : 1;
	s->sub = n;
	s->pos++;
	if (is_digit(c) && (n == N_INT || n == N_ZERO))
		s->mag = s->mag * 10 + (uint64_t)(c - '0');
	else if (is_digit(c) && n == N_FRAC)
		s->frac = s->frac * 10 + (uint64_t)(c - '0');
}

static int num_step(const struct jgram *g, struct scalar *s, uint8_t c, bool lax)
{
	uint8_t n = num_next(s, c, lax);

	if (n) {
		struct scalar t = *s;

		num_apply(&t, n, c);
		if (!t.rng || num_feasible(g, &t)) {
			*s = t;
			return R_OK;
		}
	}
	return num_done(g, s) ? R_END : R_REJECT;
}

/* A UTF-8 lead byte: continuation bytes due and the first one's range
 * (no overlongs, surrogates, or code points above U+10FFFF). */
static bool utf8_lead(struct scalar *s, uint8_t c)
{
	s->u8_lo = 0x80;
	s->u8_hi = 0xbf;
	if (c >= 0xc2 && c <= 0xdf)
		s->u8_need = 1;
	else if (c >= 0xe0 && c <= 0xef)
		s->u8_need = 2;
	else if (c >= 0xf0 && c <= 0xf4)
		s->u8_need = 3;
	else
		return false;
	if (c == 0xe0)
		s->u8_lo = 0xa0;
	else if (c == 0xed)
		s->u8_hi = 0x9f;
	else if (c == 0xf0)
		s->u8_lo = 0x90;
	else if (c == 0xf4)
		s->u8_hi = 0x8f;
	return true;
}

/* \uXXXX: digit k (0..3) of the escape; surrogates must pair. */
static bool str_hex(struct scalar *s, uint8_t c)
{
	unsigned k = s->sub - 2u;
	bool d = c == 'd' || c == 'D';

	if (!is_hex(c))
		return false;
	if (k == 0) {
		if (s->flags & F_LOW_DUE) {
			if (!d)
				return false;
			s->flags = (uint8_t)((s->flags & ~F_LOW_DUE) | F_IN_LOW);
		}
		if (d)
			s->flags |= F_D;
	} else if (k == 1 && (s->flags & F_D)) {
		bool low = (c >= 'c' && c <= 'f') || (c >= 'C' && c <= 'F');
		bool high = (c >= '8' && c <= '9') || (c >= 'a' && c <= 'b') ||
			    (c >= 'A' && c <= 'B');

		if ((s->flags & F_IN_LOW) ? !low : low)
			return false;
		if (high && !(s->flags & F_IN_LOW))
			s->flags |= F_HIGH;
	} else if (k == 1 && (s->flags & F_IN_LOW)) {
		return false;
	}
	if (k == 3) {
		s->flags &= (uint8_t)~(F_D | F_IN_LOW);
		if (s->flags & F_HIGH)
			s->flags = (uint8_t)((s->flags & ~F_HIGH) | F_LOW_DUE);
		s->sub = 0;
		return true;
	}
	s->sub++;
	return true;
}

/* ---- string checks (jgram_str_add) ---- */

/* n code points written, the pattern in state set: some string of the
 * lengths can still follow. */
static bool str_fits(const struct gstr *k, uint64_t set, uint32_t n)
{
	if (n > k->max_len)
		return false;
	if (!k->pat)
		return true;
	return jpat_can_end(k->pat, set, n < k->min_len ? k->min_len - n : 0, k->max_len - n);
}

/* The escapes a patterned string may use and the characters they write. */
static const char esc_letter[] = "\"\\/bfnrt";
static const uint8_t esc_char[] = { '"', '\\', '/', 8, 12, 10, 13, 9 };

/* A character starts: symbol sym (JPAT_OTHER for non-ASCII), or -1 for
 * a '\' whose character comes next (one of esc_letter must fit). */
static bool str_char(const struct jgram *g, struct scalar *s, int sym)
{
	const struct gstr *k = s->str ? &g->strs[s->str] : NULL;
	uint64_t set = s->nfa;
	bool ok = false;

	if (!k)
		return true;
	if (!k->pat) {
		ok = s->cps < k->max_len;
	} else if (sym >= 0) {
		set = jpat_step(k->pat, s->nfa, (unsigned)sym);
		ok = str_fits(k, set, s->cps + 1);
	} else {
		for (size_t i = 0; i < sizeof(esc_char) && !ok; i++)
			ok = str_fits(k, jpat_step(k->pat, s->nfa, esc_char[i]), s->cps + 1);
	}
	if (!ok)
		return false;
	s->nfa = set;
	s->cps++;
	return true;
}

/* An escape's letter c (not 'u'): the pattern reads its character. */
static bool str_esc(const struct jgram *g, struct scalar *s, uint8_t c)
{
	const struct gstr *k = s->str ? &g->strs[s->str] : NULL;
	uint64_t set;

	if (!k || !k->pat)
		return true;
	set = jpat_step(k->pat, s->nfa, esc_char[strchr(esc_letter, c) - esc_letter]);
	if (!str_fits(k, set, s->cps))
		return false;
	s->nfa = set;
	return true;
}

/* '"' may end the string now. */
static bool str_end(const struct jgram *g, const struct scalar *s)
{
	const struct gstr *k = s->str ? &g->strs[s->str] : NULL;

	return !k || (s->cps >= k->min_len && (!k->pat || (s->nfa & k->pat->final)));
}

static int str_step(const struct jgram *g, struct state *st, uint8_t c)
{
	struct scalar *s = &st->s;

	if (s->u8_need) {
		if (c < s->u8_lo || c > s->u8_hi)
			return R_REJECT;
		s->u8_need--;
		s->u8_lo = 0x80;
		s->u8_hi = 0xbf;
		return R_OK;
	}
	if (s->sub == 1) {
		if (c == 'u' && (!s->str || !g->strs[s->str].pat)) {
			s->sub = 2;
			return R_OK;
		}
		if ((s->flags & F_LOW_DUE) || !c || !strchr(esc_letter, c) || !str_esc(g, s, c))
			return R_REJECT;
		s->sub = 0;
		return R_OK;
	}
	if (s->sub >= 2)
		return str_hex(s, c) ? R_OK : R_REJECT;
	if (s->flags & F_LOW_DUE)
		return c == '\\' ? (s->sub = 1, R_OK) : R_REJECT;
	if (c == '"') {
		if (!str_end(g, s))
			return R_REJECT;
		value_done(g, st, UINT32_MAX);
		return R_OK;
	}
	if (c == '\\') {
		s->sub = 1;
		return str_char(g, s, -1) ? R_OK : R_REJECT;
	}
	if (c < 0x20)
		return R_REJECT;
	if (c < 0x80)
		return str_char(g, s, c) ? R_OK : R_REJECT;
	return utf8_lead(s, c) && str_char(g, s, JPAT_OTHER) ? R_OK : R_REJECT;
}

/* ---- containers -------------------------------------------------------- */

static bool push(struct state *st, uint16_t node, uint8_t kind, uint8_t phase)
{
	if (st->depth >= JGRAM_DEPTH_MAX)
		return false;
	st->f[st->depth++] = (struct frame){ .node = node, .kind = kind,
					     .phase = phase, .prop = PROP_FREE };
	return true;
}

static void close_frame(const struct jgram *g, struct state *st)
{
	st->depth--;
	st->s.flags = 0;
	value_done(g, st, UINT32_MAX);
}

/* Literals [first, first + n) whose first byte is c, as a mask (bit i
 * = first + i), limited to allow. */
static uint64_t lit_start(const struct jgram *g, uint32_t first, uint32_t n,
			  uint64_t allow, uint8_t c)
{
	uint64_t m = 0;

	for (uint32_t i = 0; i < n; i++)
		if ((allow >> i & 1) && (uint8_t)g->bytes[g->lits[first + i].off] == c)
			m |= UINT64_C(1) << i;
	return m;
}

static bool lit_begin(struct state *st, uint32_t first, uint64_t cand, uint8_t flags)
{
	if (!cand)
		return false;
	st->s = (struct scalar){ .kind = S_LIT, .first = first, .cand = cand,
				 .pos = 1, .flags = flags };
	return true;
}

static bool node_begin(const struct jgram *g, struct state *st, uint16_t id,
		       uint8_t c)
{
	const struct jgram_node *n = &g->nodes[id];
	unsigned t = n->types;

	if (n->is_union)
		return c == '{' && push(st, id, K_OBJ, P_OPEN);
	if (n->is_enum)
		return lit_begin(st, n->lit, lit_start(g, n->lit, n->n_lit, ~UINT64_C(0), c), 0);
	if (c == '{' && (t & JGRAM_T_OBJECT))
		return push(st, id, K_OBJ, P_OPEN);
	if (c == '[' && (t & JGRAM_T_ARRAY))
		return push(st, id, K_ARR, P_FIRST);
	if (c == '"' && (t & JGRAM_T_STRING)) {
		st->s = (struct scalar){ .kind = S_STR, .str = n->str, .nfa = 1 };
		return true;
	}
	if ((c == '-' || is_digit(c)) && (t & (JGRAM_T_NUMBER | JGRAM_T_INTEGER))) {
		struct scalar num = { .kind = S_NUM, .pos = 1,
			.sub = c == '-' ? N_MINUS : c == '0' ? N_ZERO : N_INT,
			.flags = (t & JGRAM_T_NUMBER) ? 0 : F_INT, .u8_need = 1,
			.rng = n->range, .neg = c == '-',
			.mag = is_digit(c) ? (uint64_t)(c - '0') : 0 };

		if (num.rng && !num_feasible(g, &num))
			return false;
		st->s = num;
		return true;
	}
	uint64_t allow = ((t & JGRAM_T_BOOLEAN) ? 3u : 0u) | ((t & JGRAM_T_NULL) ? 4u : 0u);

	return lit_begin(st, LIT_TRUE, lit_start(g, LIT_TRUE, LIT_BUILTIN, allow, c), 0);
}

/* A value of node id or of its alternatives (they start on disjoint
 * bytes; a refused start changes nothing; alt is always earlier). */
static bool value_begin(const struct jgram *g, struct state *st, uint16_t id,
			uint8_t c)
{
	for (;;) {
		if (node_begin(g, st, id, c))
			return true;
		if (!g->nodes[id].alt)
			return false;
		id = g->nodes[id].alt;
	}
}

static uint64_t props_left(const struct jgram_node *n, const struct frame *f)
{
	uint64_t all = n->n_lit >= 64 ? ~UINT64_C(0) : (UINT64_C(1) << n->n_lit) - 1;

	return all & ~f->used;
}

static bool key_begin(const struct jgram *g, struct state *st, struct frame *f)
{
	const struct jgram_node *n = &g->nodes[f->node];

	if (n->is_union)
		return lit_begin(st, n->tag, 1, F_KEY);
	if (n->free_keys) {
		st->s = (struct scalar){ .kind = S_STR, .flags = F_KEY };
		return true;
	}
	return lit_begin(st, n->lit, lit_start(g, n->lit, n->n_lit, props_left(n, f), '"'),
			 F_KEY);
}

static bool obj_step(const struct jgram *g, struct state *st, struct frame *f,
		     uint8_t c)
{
	const struct jgram_node *n = &g->nodes[f->node];

	switch (f->phase) {
	case P_OPEN:
		if (c == '}' && !n->required && !n->is_union) {
			close_frame(g, st);
			return true;
		}
		return c == '"' && key_begin(g, st, f);
	case P_KEY:
		return c == '"' && key_begin(g, st, f);
	case P_COLON:
		if (c != ':')
			return false;
		f->phase = P_VALUE;
		return true;
	case P_VALUE:
		if (f->prop == PROP_TAG)
			return lit_begin(st, n->lit, lit_start(g, n->lit, n->n_lit,
							      ~UINT64_C(0), c), F_TAG);
		return value_begin(g, st, f->prop == PROP_FREE ? JGRAM_ANY
					  : g->lits[n->lit + f->prop].node, c);
	case P_AFTER:
		if (c == ',' && (n->free_keys || props_left(n, f))) {
			f->phase = P_KEY;
			return true;
		}
		if (c == '}' && (f->used & n->required) == n->required) {
			close_frame(g, st);
			return true;
		}
		return false;
	}
	return false;
}

static bool arr_step(const struct jgram *g, struct state *st, struct frame *f,
		     uint8_t c)
{
	const struct jgram_node *n = &g->nodes[f->node];

	if ((f->phase == P_FIRST || f->phase == P_AFTER) && c == ']' &&
	    f->count >= n->min_items) {
		close_frame(g, st);
		return true;
	}
	if (f->phase == P_AFTER) {
		if (c != ',' || f->count >= n->max_items)
			return false;
		f->phase = P_VALUE;
		return true;
	}
	if (f->phase == P_FIRST && n->max_items == 0)
		return false;
	return value_begin(g, st, n->items, c);
}

/* ---- the wrap --------------------------------------------------------- */

/* The value is done and post's first byte came: post is being matched
 * (a one-byte post ends the repetition at once). */
static bool wrap_post(const struct jgram *g, struct state *st)
{
	st->seg = SEG_POST;
	st->tpos = 1;
	if (st->tpos == g->post_len) {
		st->seg = SEG_PRE;
		st->tpos = 0;
		st->reps++;
	}
	return true;
}

/* A byte of pre or post, or whitespace between repetitions. */
static bool wrap_step(const struct jgram *g, struct state *st, uint8_t c)
{
	if (st->seg == SEG_POST) {
		if (c != (uint8_t)g->post[st->tpos])
			return false;
		if (++st->tpos == g->post_len) {
			st->seg = SEG_PRE;
			st->tpos = 0;
			st->ws = 0;
			st->reps++;
		}
		return true;
	}
	if (st->tpos == 0 && is_ws(c)) {
		if (st->ws >= JGRAM_WS_MAX)
			return false;
		st->ws++;
		return true;
	}
	if (st->tpos == 0 && (st->reps >= g->max_rep || !g->pre_len))
		return false;
	if (c != (uint8_t)g->pre[st->tpos])
		return false;
	st->ws = 0;
	if (++st->tpos == g->pre_len) {   /* a fresh value */
		st->seg = SEG_VALUE;
		st->tpos = 0;
		st->depth = 0;
		st->done = false;
		st->s = (struct scalar){ .kind = S_NONE };
	}
	return true;
}

/* A byte outside any scalar: whitespace, or the containers' syntax. */
static bool struct_step(const struct jgram *g, struct state *st, uint8_t c,
			uint16_t root)
{
	struct frame *f;

	if (is_ws(c)) {
		if (st->ws >= JGRAM_WS_MAX)
			return false;
		st->ws++;
		return true;
	}
	st->ws = 0;
	if (st->done)
		return g->post_len && c == (uint8_t)g->post[0] && wrap_post(g, st);
	if (!st->depth)
		return value_begin(g, st, root, c);
	f = &st->f[st->depth - 1];
	return f->kind == K_OBJ ? obj_step(g, st, f, c) : arr_step(g, st, f, c);
}

static bool state_step(const struct jgram *g, struct state *st, uint8_t c);

/* The run leaves a free segment: a fresh value (after pre, or from its
 * first byte), as wrap_step begins one. */
static void lazy_fire(struct state *st, uint8_t seg)
{
	st->seg = seg;
	st->tpos = 0;
	st->ws = 0;
	st->depth = 0;
	st->done = false;
	st->s = (struct scalar){ .kind = S_NONE };
}

/* A byte in a free segment: always accepted. SEG_FREE matches the
 * trigger (pre) anywhere, KMP-style; SEG_START hands the first
 * non-whitespace byte to the grammar when it takes it, or turns free
 * for good. */
static bool lazy_step(const struct jgram *g, struct state *st, uint8_t c)
{
	uint8_t k = st->tpos;
	struct state t;

	if (st->seg == SEG_OFF || (st->seg == SEG_START && is_ws(c)))
		return true;
	if (st->seg == SEG_START) {
		state_copy(&t, st);
		lazy_fire(&t, g->pre_len ? SEG_PRE : SEG_VALUE);
		if (state_step(g, &t, c))
			state_copy(st, &t);
		else
			st->seg = SEG_OFF;
		return true;
	}
	while (k && c != (uint8_t)g->pre[k])
		k = g->fail[k - 1];
	if (c == (uint8_t)g->pre[k])
		k++;
	st->tpos = k;
	if (k == g->pre_len)
		lazy_fire(st, SEG_VALUE);
	return true;
}

static bool state_step(const struct jgram *g, struct state *st, uint8_t c)
{
	int r = R_END;

	if (st->seg >= SEG_FREE)
		return lazy_step(g, st, c);
	if (st->seg != SEG_VALUE)
		return wrap_step(g, st, c);
	switch (st->s.kind) {
	case S_STR:
		return str_step(g, st, c) == R_OK && (st->ws = 0, true);
	case S_NUM:
		r = num_step(g, &st->s, c, st->lax);
		if (r == R_END)
			value_done(g, st, UINT32_MAX);
		break;
	case S_LIT:
		r = lit_step(g, &st->s, c);
		if (r == R_END)
			value_done(g, st, (st->s.flags & (F_KEY | F_TAG))
					  ? lit_complete(g, &st->s) : UINT32_MAX);
		break;
	}
	if (r == R_REJECT)
		return false;
	if (r == R_OK) {
		st->ws = 0;
		return true;
	}
	return struct_step(g, st, c, g->root);
}

/* The JSON value is complete (a literal's check, a value in a wrap). */
static bool value_complete(const struct jgram *g, const struct state *st)
{
	if (st->done)
		return true;
	if (st->depth)
		return false;
	if (st->s.kind == S_NUM)
		return num_done(g, &st->s);
	return st->s.kind == S_LIT && lit_complete(g, &st->s) != UINT32_MAX;
}

/* The output is complete: the value, or with a wrap a whole repetition. */
static bool state_complete(const struct jgram *g, const struct state *st)
{
	if (st->seg >= SEG_FREE)
		return true;   /* free text may end anywhere */
	if (g->post_len)
		return st->seg == SEG_PRE && st->tpos == 0 && st->reps > 0;
	return value_complete(g, st);
}

/* Inside plain string text: no escape or character pending. */
static bool in_plain_string(const struct state *st)
{
	return st->seg == SEG_VALUE && st->s.kind == S_STR && !st->s.sub &&
	       !st->s.u8_need && !st->s.str && !(st->s.flags & F_LOW_DUE);
}

/* A byte that changes nothing: plain text inside a string, or a byte
 * of free text that starts no trigger. */
static bool state_same(const struct jgram *g, const struct state *st, uint8_t c)
{
	switch (st->seg) {
	case SEG_OFF:
		return true;
	case SEG_START:
		return is_ws(c);
	case SEG_FREE:
		return st->tpos == 0 && c != (uint8_t)g->pre[0];
	}
	return in_plain_string(st) && c >= 0x20 && c < 0x80 && c != '"' && c != '\\';
}

/* ---- sealing: the tree can be written -------------------------------------- */

/* A literal is one complete JSON scalar the free grammar accepts. */
static bool lit_valid(const struct jgram *g, const struct jgram_lit *l, bool key)
{
	struct state st = { .lax = true };

	for (uint32_t i = 0; i < l->len; i++)
		if (!state_step(g, &st, (uint8_t)g->bytes[l->off + i]))
			return false;
	if (key && g->bytes[l->off] != '"')
		return false;
	return value_complete(g, &st) && !is_ws((uint8_t)g->bytes[l->off + l->len - 1]) &&
	       !is_ws((uint8_t)g->bytes[l->off]);
}

static int seal_bad(char *msg, size_t n, const char *fmt, unsigned id)
{
	if (msg && n)
		snprintf(msg, n, fmt, id);
	return JGRAM_E_INVALID;
}

/* A first byte's kind (JGRAM_T_*, integer as number), 0 for none. */
static unsigned first_kind(uint8_t c)
{
	switch (c) {
	case '{': return JGRAM_T_OBJECT;
	case '[': return JGRAM_T_ARRAY;
	case '"': return JGRAM_T_STRING;
	case 'n': return JGRAM_T_NULL;
	case 't':
	case 'f': return JGRAM_T_BOOLEAN;
	default: return c == '-' || is_digit(c) ? JGRAM_T_NUMBER : 0;
	}
}

/* One node's kinds, its alternatives left out. */
static unsigned node_firsts(const struct jgram *g, const struct jgram_node *x)
{
	unsigned k = 0;

	if (x->is_union)
		return JGRAM_T_OBJECT;
	if (x->is_enum) {
		for (uint32_t i = 0; i < x->n_lit && x->lit + i < g->n_lits; i++)
			k |= first_kind((uint8_t)g->bytes[g->lits[x->lit + i].off]);
		return k;
	}
	k = x->types & ~(unsigned)JGRAM_T_INTEGER;
	return (x->types & JGRAM_T_INTEGER) ? k | JGRAM_T_NUMBER : k;
}

unsigned jgram_node_firsts(const struct jgram *g, uint16_t id)
{
	unsigned k = 0;

	for (; id < g->n_nodes; id = g->nodes[id].alt) {
		k |= node_firsts(g, &g->nodes[id]);
		if (!g->nodes[id].alt || g->nodes[id].alt >= id)
			break;
	}
	return k;
}

/* Whether literal a's text is literal b's. */
static bool lit_same(const struct jgram *g, uint32_t a, uint32_t b)
{
	return g->lits[a].len == g->lits[b].len &&
	       !memcmp(g->bytes + g->lits[a].off, g->bytes + g->lits[b].off, g->lits[a].len);
}

/* A union: its tag a key, its values strings, each naming an earlier
 * plain object node that does not take the tag's key again. Its depth
 * is its deepest variant's (they share its frame). */
static int union_check(const struct jgram *g, uint16_t id, const uint8_t *depth,
		       char *msg, size_t n)
{
	const struct jgram_node *x = &g->nodes[id];
	int d = 1;

	if (!x->n_lit || x->tag < LIT_BUILTIN || x->tag >= g->n_lits ||
	    !lit_valid(g, &g->lits[x->tag], true))
		return seal_bad(msg, n, "node %u: a union without values or a tag key", id), -1;
	for (uint32_t i = 0; i < x->n_lit; i++) {
		const struct jgram_lit *l = &g->lits[x->lit + i];
		const struct jgram_node *v = &g->nodes[l->node];

		if (l->node >= id || !lit_valid(g, l, true) || v->is_union || v->is_enum ||
		    v->types != JGRAM_T_OBJECT || v->alt)
			return seal_bad(msg, n, "node %u: a union's value is not a string naming an object node", id), -1;
		for (uint32_t k = 0; k < v->n_lit; k++)
			if (lit_same(g, v->lit + k, x->tag))
				return seal_bad(msg, n, "node %u: a variant takes the tag's key again", id), -1;
		d = d > depth[l->node] ? d : depth[l->node];
	}
	return d;
}

/* Node id's own checks, and how deep its containers nest (1 for a
 * container of scalars, 0 for a scalar) from its children's depths
 * (depth[], children come before their parents); -1 when malformed.
 * ANY counts 0: it falls back to scalars at the bound. */
static int node_check(const struct jgram *g, uint16_t id, const uint8_t *depth,
		      char *msg, size_t n)
{
	const struct jgram_node *x = &g->nodes[id];
	uint64_t all = x->n_lit >= 64 ? ~UINT64_C(0) : (UINT64_C(1) << x->n_lit) - 1;
	int d = 0;

	if (x->lit > g->n_lits || x->n_lit > JGRAM_LITS_MAX || x->lit + x->n_lit > g->n_lits ||
	    (x->lit < LIT_BUILTIN && x->n_lit))
		return seal_bad(msg, n, "node %u: its literals are out of range", id), -1;
	if (x->range && x->range >= g->n_ranges)
		return seal_bad(msg, n, "node %u: its range is out of range", id), -1;
	if (x->str && x->str >= g->n_strs)
		return seal_bad(msg, n, "node %u: its string checks are out of range", id), -1;
	if (x->is_union)
		return union_check(g, id, depth, msg, n);
	if (x->is_enum) {
		for (uint32_t i = 0; i < x->n_lit; i++)
			if (!lit_valid(g, &g->lits[x->lit + i], false))
				return seal_bad(msg, n, "node %u: an enum value is not a JSON scalar", id), -1;
		return x->n_lit ? 0 : (seal_bad(msg, n, "node %u: an empty enum", id), -1);
	}
	if (!x->types || (x->types & ~JGRAM_T_ALL))
		return seal_bad(msg, n, "node %u: no type", id), -1;
	if (x->types & JGRAM_T_ARRAY) {
		if (x->items >= id && x->items != JGRAM_ANY)
			return seal_bad(msg, n, "node %u: items refer forward", id), -1;
		if (x->min_items > x->max_items || x->max_items > JGRAM_ITEMS_MAX)
			return seal_bad(msg, n, "node %u: minItems > maxItems or too large", id), -1;
		d = depth[x->items] + 1;
	}
	if (!(x->types & JGRAM_T_OBJECT))
		return d;
	if ((x->free_keys && x->n_lit) || (x->required & ~all))
		return seal_bad(msg, n, "node %u: required names no property", id), -1;
	for (uint32_t i = 0; i < x->n_lit; i++) {
		const struct jgram_lit *l = &g->lits[x->lit + i];

		if ((l->node >= id && l->node != JGRAM_ANY) || !lit_valid(g, l, true))
			return seal_bad(msg, n, "node %u: a property is malformed", id), -1;
		d = d > depth[l->node] + 1 ? d : depth[l->node] + 1;
	}
	return d > 1 ? d : 1;
}

int jgram_wrap(struct jgram *g, const char *pre, size_t pre_len,
	       const char *post, size_t post_len, uint32_t max_rep)
{
	/* not after jgram_lazy: its KMP table (fail) is the pre's */
	if (g->sealed || g->lazy || pre_len > JGRAM_WRAP_MAX || post_len > JGRAM_WRAP_MAX ||
	    !post_len || !max_rep || max_rep > JGRAM_REPS_MAX || (max_rep > 1 && !pre_len))
		return JGRAM_E_INVALID;
	memcpy(g->pre, pre, pre_len);
	memcpy(g->post, post, post_len);
	g->pre_len = (uint8_t)pre_len;
	g->post_len = (uint8_t)post_len;
	g->max_rep = (uint16_t)max_rep;
	return 0;
}

int jgram_lead(struct jgram *g, const char *text, size_t len)
{
	if (g->sealed || g->lazy || !len || len > JGRAM_WRAP_MAX)
		return JGRAM_E_INVALID;
	memcpy(g->lead, text, len);
	g->lead_len = (uint8_t)len;
	return 0;
}

int jgram_lazy(struct jgram *g, enum jgram_lazy how)
{
	if (g->sealed || (how != JGRAM_LAZY_PRE && how != JGRAM_LAZY_START &&
			  how != JGRAM_LAZY_LEAD) ||
	    (how == JGRAM_LAZY_PRE && !g->pre_len) ||
	    (how == JGRAM_LAZY_LEAD) != (g->lead_len > 0) ||
	    (how == JGRAM_LAZY_LEAD && g->pre_len))
		return JGRAM_E_INVALID;
	g->lazy = (uint8_t)how;
	g->fail[0] = 0;
	for (uint8_t i = 1, k = 0; i < g->pre_len; i++) {
		while (k && g->pre[i] != g->pre[k])
			k = g->fail[k - 1];
		if (g->pre[i] == g->pre[k])
			k++;
		g->fail[i] = k;
	}
	return 0;
}

/* Every node is checked, in order (children first); the root's depth
 * must fit the stack. */
/* A node's alternative: earlier, and starting on other bytes. Its depth
 * counts with the node's. */
static int alt_check(const struct jgram *g, uint16_t id, const uint8_t *depth, int d,
		     char *msg, size_t n)
{
	const struct jgram_node *x = &g->nodes[id];

	if (!x->alt)
		return d;
	if (x->alt >= id)
		return seal_bad(msg, n, "node %u: its alternative refers forward", id), -1;
	if (node_firsts(g, x) & jgram_node_firsts(g, x->alt))
		return seal_bad(msg, n, "node %u: its alternatives start alike", id), -1;
	return d > depth[x->alt] ? d : depth[x->alt];
}

int jgram_seal(struct jgram *g, uint16_t root, char *msg, size_t msg_len)
{
	uint8_t depth[JGRAM_NODES_MAX] = { 0 };

	if (g->sealed || root >= g->n_nodes || root == JGRAM_ANY)
		return seal_bad(msg, msg_len, "root node %u is not a schema node", root);
	if (g->nodes[JGRAM_ANY].alt)
		return seal_bad(msg, msg_len, "node %u: ANY has an alternative", JGRAM_ANY);
	for (uint16_t id = 1; id < g->n_nodes; id++) {
		int d = node_check(g, id, depth, msg, msg_len);

		if (d >= 0)
			d = alt_check(g, id, depth, d, msg, msg_len);
		if (d < 0)
			return JGRAM_E_INVALID;
		depth[id] = (uint8_t)(d > (int)JGRAM_DEPTH_MAX ? (int)JGRAM_DEPTH_MAX + 1 : d);
	}
	if (depth[root] > JGRAM_DEPTH_MAX)
		return seal_bad(msg, msg_len, "nesting deeper than %u levels", JGRAM_DEPTH_MAX);
	g->root = root;
	g->sealed = true;
	return 0;
}

/* ---- the vocabulary trie ------------------------------------------------------ */

struct tnode {
	uint32_t end;                    /* the index after its subtree */
	uint32_t tok;                    /* its tokens: toks[tok, tok + n_tok) */
	uint16_t n_tok;
	uint8_t byte;
	uint8_t depth;                   /* 1 .. JGRAM_PIECE_MAX */
};

/* A byte trie in preorder. */
struct trie {
	struct tnode *nodes;             /* (n_nodes) */
	uint32_t n_nodes;
	int32_t *toks;                   /* (n_toks) by piece, bytewise */
	uint32_t n_toks;
};

/* The text tokens whose piece holds a trigger (a lazy grammar's pre)
 * whole: from a free state with nothing of the trigger pending, only
 * these can leave it (jgram_run_mask's cheap case). */
struct vtrig {
	char text[JGRAM_WRAP_MAX];
	uint8_t len;
	int32_t *toks;                   /* (n) */
	uint32_t n;
};

#define JGRAM_TRIG_CACHE 8u          /* triggers a vocabulary keeps */

/* Built on a trigger's first use, kept until the vocabulary is freed;
 * an entry once made is never changed (runs read it unlocked). */
struct vtrigs {
	pthread_mutex_t lock;
	struct vtrig e[JGRAM_TRIG_CACHE];
	uint32_t n;
};

struct jgram_vocab {
	const struct tokenizer *t;
	uint32_t n_vocab;
	int32_t eos;
	struct trie all;                 /* every token the mask may allow */
	struct trie special;             /* those not plain (below) */
	uint64_t *plain;                 /* ((n_vocab + 63) / 64) tokens whose
					  * bytes are all plain string text
					  * (0x20..0x7f but '"' and '\\'):
					  * allowed inside a string, whatever
					  * follows it */
	bool covered_bytes[256];         /* the byte is a token alone */
	/* for lazy runs' free text: */
	int32_t *longs;                  /* (n_longs) text tokens longer than
					  * JGRAM_PIECE_MAX bytes */
	uint32_t n_longs;
	struct vtrigs *trigs;            /* the one mutable part, locked */
};

struct vpiece {
	const uint8_t *p;
	uint32_t len;
	int32_t id;
};

static int vpiece_cmp(const void *a, const void *b)
{
	const struct vpiece *x = a, *y = b;
	uint32_t n = x->len < y->len ? x->len : y->len;
	int c = memcmp(x->p, y->p, n);

	if (c)
		return c;
	if (x->len != y->len)
		return x->len < y->len ? -1 : 1;
	return x->id < y->id ? -1 : x->id > y->id;
}

/* The token writes text (its piece): not a control token, BOS or EOS.
 * Such a token's bytes are what a lazy run's free text reads. */
static bool token_text(const struct tokenizer *t, int32_t id, const char **p, size_t *len)
{
	enum tokenizer_type ty = tokenizer_token_type(t, id);

	if (id == tokenizer_eos(t) || id == tokenizer_bos(t) ||
	    ty == TOKEN_TYPE_CONTROL || ty == TOKEN_TYPE_UNKNOWN || ty == TOKEN_TYPE_UNUSED)
		return false;
	return !tokenizer_piece(t, id, p, len) && *len > 0;
}

static bool vocab_token_ok(const struct tokenizer *t, int32_t id, size_t len)
{
	enum tokenizer_type ty = tokenizer_token_type(t, id);

	if (id == tokenizer_eos(t) || id == tokenizer_bos(t))
		return false;
	if (ty == TOKEN_TYPE_CONTROL || ty == TOKEN_TYPE_UNKNOWN || ty == TOKEN_TYPE_UNUSED)
		return false;
	return len > 0 && len <= JGRAM_PIECE_MAX;
}

static bool plain_byte(uint8_t c)
{
	return c >= 0x20 && c < 0x80 && c != '"' && c != '\\';
}

static bool piece_plain(const struct vpiece *pc)
{
	for (uint32_t i = 0; i < pc->len; i++)
		if (!plain_byte(pc->p[i]))
			return false;
	return true;
}

/* The sorted pieces as a preorder trie: each piece shares its prefix
 * with the one before it; nodes deeper than the shared part close. */
static int trie_build(struct trie *tr, const struct vpiece *pc, uint32_t n)
{
	uint32_t path[JGRAM_PIECE_MAX];  /* node index at each depth - 1 */
	uint32_t plen = 0, cap = 0;
	const struct vpiece *prev = NULL;

	if (!(tr->toks = malloc(sizeof(*tr->toks) * (n ? n : 1))))
		return -ENOMEM;
	for (uint32_t i = 0; i < n; i++) {
		uint32_t k = 0;

		if (prev)
			while (k < prev->len && k < pc[i].len && prev->p[k] == pc[i].p[k])
				k++;
		k = k < plen ? k : plen;
		while (plen > k)
			tr->nodes[path[--plen]].end = tr->n_nodes;
		for (; plen < pc[i].len; plen++) {
			if (grow((void **)&tr->nodes, &cap, tr->n_nodes + 1, sizeof(*tr->nodes)))
				return -ENOMEM;
			tr->nodes[tr->n_nodes] = (struct tnode){ .byte = pc[i].p[plen],
				.depth = (uint8_t)(plen + 1), .tok = i };
			path[plen] = tr->n_nodes++;
		}
		if (!tr->nodes[path[plen - 1]].n_tok)
			tr->nodes[path[plen - 1]].tok = i;
		tr->nodes[path[plen - 1]].n_tok++;
		tr->toks[i] = pc[i].id;
		prev = &pc[i];
	}
	while (plen > 0)
		tr->nodes[path[--plen]].end = tr->n_nodes;
	tr->n_toks = n;
	return 0;
}

/* Both tries and the plain set from the sorted pieces (pc is reused:
 * the special pieces are moved to its front, in order). */
static int vocab_build(struct jgram_vocab *v, struct vpiece *pc, uint32_t n)
{
	uint32_t n_special = 0;
	int rc = trie_build(&v->all, pc, n);

	for (uint32_t i = 0; i < n && !rc; i++) {
		if (pc[i].len == 1)
			v->covered_bytes[pc[i].p[0]] = true;
		if (piece_plain(&pc[i]))
			v->plain[(uint32_t)pc[i].id / 64] |= UINT64_C(1) << ((uint32_t)pc[i].id % 64);
		else
			pc[n_special++] = pc[i];
	}
	return rc ? rc : trie_build(&v->special, pc, n_special);
}

int jgram_vocab_new(struct jgram_vocab **out, const struct tokenizer *t)
{
	uint32_t nv = tokenizer_n_vocab(t), n = 0;
	struct jgram_vocab *v = calloc(1, sizeof(*v));
	struct vpiece *pc = malloc(sizeof(*pc) * (nv ? nv : 1));
	int rc = -ENOMEM;

	if (v && (v->trigs = calloc(1, sizeof(*v->trigs))))
		pthread_mutex_init(&v->trigs->lock, NULL);
	if (v && v->trigs && pc && (v->plain = calloc((nv + 63) / 64 + 1, sizeof(uint64_t))) &&
	    (v->longs = malloc(sizeof(*v->longs) * (nv ? nv : 1)))) {
		v->t = t;
		v->n_vocab = nv;
		v->eos = tokenizer_eos(t);
		for (uint32_t id = 0; id < nv; id++) {
			const char *p;
			size_t len;

			if (tokenizer_piece(t, (int32_t)id, &p, &len) ||
			    !vocab_token_ok(t, (int32_t)id, len)) {
				if (token_text(t, (int32_t)id, &p, &len))
					v->longs[v->n_longs++] = (int32_t)id;
				continue;
			}
			pc[n++] = (struct vpiece){ .p = (const uint8_t *)p,
						   .len = (uint32_t)len, .id = (int32_t)id };
		}
		qsort(pc, n, sizeof(*pc), vpiece_cmp);
		rc = vocab_build(v, pc, n);
	}
	free(pc);
	if (rc) {
		jgram_vocab_free(v);
		return rc;
	}
	*out = v;
	return 0;
}

void jgram_vocab_free(struct jgram_vocab *v)
{
	if (!v)
		return;
	free(v->all.nodes);
	free(v->all.toks);
	free(v->special.nodes);
	free(v->special.toks);
	free(v->plain);
	free(v->longs);
	if (v->trigs) {
		for (uint32_t i = 0; i < v->trigs->n; i++)
			free(v->trigs->e[i].toks);
		pthread_mutex_destroy(&v->trigs->lock);
		free(v->trigs);
	}
	free(v);
}

bool jgram_vocab_bytes_covered(const struct jgram_vocab *v)
{
	for (unsigned c = 0; c < 256; c++)
		if (!v->covered_bytes[c])
			return false;
	return true;
}

uint32_t jgram_vocab_n_vocab(const struct jgram_vocab *v)
{
	return v->n_vocab;
}

static bool holds(const char *p, size_t len, const char *text, size_t tlen)
{
	for (size_t i = 0; i + tlen <= len; i++)
		if (p[i] == text[0] && !memcmp(p + i, text, tlen))
			return true;
	return false;
}

/* The text tokens whose piece holds text (tlen bytes) whole. */
static int trig_scan(const struct jgram_vocab *v, const char *text, uint8_t tlen,
		     struct vtrig *out)
{
	uint32_t cap = 0;

	*out = (struct vtrig){ .len = tlen };
	memcpy(out->text, text, tlen);
	for (uint32_t id = 0; id < v->n_vocab; id++) {
		const char *p;
		size_t len;

		if (!token_text(v->t, (int32_t)id, &p, &len) || !holds(p, len, text, tlen))
			continue;
		if (grow((void **)&out->toks, &cap, out->n + 1, sizeof(*out->toks))) {
			free(out->toks);
			return -ENOMEM;
		}
		out->toks[out->n++] = (int32_t)id;
	}
	return 0;
}

/* The trigger's tokens, from the vocabulary's cache (built now on a
 * first use). *own set when the cache was full: the caller frees it. */
static int vocab_trig(const struct jgram_vocab *v, const char *text, uint8_t tlen,
		      const struct vtrig **out, struct vtrig **own)
{
	struct vtrigs *c = v->trigs;
	int rc = 0;

	*own = NULL;
	*out = NULL;
	pthread_mutex_lock(&c->lock);
	for (uint32_t i = 0; i < c->n; i++)
		if (c->e[i].len == tlen && !memcmp(c->e[i].text, text, tlen)) {
			*out = &c->e[i];
			pthread_mutex_unlock(&c->lock);
			return 0;
		}
	if (c->n < JGRAM_TRIG_CACHE) {
		rc = trig_scan(v, text, tlen, &c->e[c->n]);
		if (!rc)
			*out = &c->e[c->n++];
	}
	pthread_mutex_unlock(&c->lock);
	if (rc || *out)
		return rc;
	if (!(*own = malloc(sizeof(**own))))
		return -ENOMEM;
	rc = trig_scan(v, text, tlen, *own);
	if (rc) {
		free(*own);
		*own = NULL;
	}
	*out = *own;
	return rc;
}

/* ---- a request's run ------------------------------------------------------ */

struct jgram_run {
	const struct jgram *g;
	const struct jgram_vocab *v;
	struct state st;
	int32_t lead;                    /* the lead token still to come, or -1 */
	bool lead_free;                  /* JGRAM_LAZY_LEAD: free text until it */
	uint64_t *allow;                 /* ((n_vocab + 63) / 64) the last mask */
	struct state buf[JGRAM_PIECE_MAX + 1];  /* the walk's states by depth */
	const struct state *at[JGRAM_PIECE_MAX + 1];
	/* lazy (JGRAM_LAZY_PRE): the tokens holding the trigger */
	const struct vtrig *trig;
	struct vtrig *trig_own;          /* when the vocabulary's cache was full */
	bool allow_all;                  /* allow is all ones (a free mask) */
	uint64_t *pat_plain;             /* ((n_vocab + 63) / 64) the plain tokens
					  * allowed in string pat_str from
					  * pattern state pat_set (pat_stable) */
	uint64_t pat_set;
	uint16_t pat_str;                /* 0: none kept */
};

/* The grammar's lead as one control token of t: its id, or -1. */
static int32_t lead_id(const struct tokenizer *t, const struct jgram *g)
{
	int32_t *ids = NULL, id = -1;
	size_t n = 0;

	if (!tokenizer_encode_ex(t, g->lead, g->lead_len, TOKENIZER_PARSE_SPECIAL,
				 &ids, &n) &&
	    n == 1 && tokenizer_token_type(t, ids[0]) == TOKEN_TYPE_CONTROL)
		id = ids[0];
	free(ids);
	return id;
}

int jgram_run_new(struct jgram_run **out, const struct jgram *g,
		  const struct jgram_vocab *v)
{
	struct jgram_run *r;

	if (!g->sealed)
		return -EINVAL;
	r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	r->allow = v ? calloc((v->n_vocab + 63) / 64 + 1, sizeof(uint64_t)) : NULL;
	if (v && !r->allow) {
		free(r);
		return -ENOMEM;
	}
	r->g = g;
	r->v = v;
	r->st.seg = g->lazy == JGRAM_LAZY_PRE ? SEG_FREE
		  : g->lazy == JGRAM_LAZY_START ? SEG_START
		  : g->pre_len ? SEG_PRE : SEG_VALUE;
	r->lead = -1;
	r->lead_free = g->lazy == JGRAM_LAZY_LEAD;
	if (v && g->lead_len && (r->lead = lead_id(v->t, g)) < 0) {
		jgram_run_free(r);
		return -ENOENT;
	}
	if (v && g->lazy == JGRAM_LAZY_PRE) {
		int rc = vocab_trig(v, g->pre, g->pre_len, &r->trig, &r->trig_own);

		if (rc) {
			jgram_run_free(r);
			return rc;
		}
	}
	*out = r;
	return 0;
}

void jgram_run_free(struct jgram_run *r)
{
	if (!r)
		return;
	if (r->trig_own)
		free(r->trig_own->toks);
	free(r->trig_own);
	free(r->allow);
	free(r->pat_plain);
	free(r);
}

bool jgram_run_feed(struct jgram_run *r, const char *bytes, size_t len)
{
	struct state st;

	if (r->lead >= 0)
		return r->lead_free || len == 0;   /* free text, or nothing before it */
	state_copy(&st, &r->st);
	for (size_t i = 0; i < len; i++)
		if (!state_step(r->g, &st, (uint8_t)bytes[i]))
			return false;
	state_copy(&r->st, &st);
	return true;
}

bool jgram_run_complete(const struct jgram_run *r)
{
	if (r->lead >= 0)
		return r->lead_free;   /* free text may end anywhere */
	return state_complete(r->g, &r->st);
}

bool jgram_run_can(const struct jgram_run *r, uint8_t c)
{
	struct state st;

	if (r->lead >= 0)
		return r->lead_free;
	state_copy(&st, &r->st);
	return state_step(r->g, &st, c);
}

const uint64_t *jgram_run_allowed(const struct jgram_run *r)
{
	return r->allow;
}

bool jgram_run_free_text(const struct jgram_run *r)
{
	return r->st.seg >= SEG_FREE || (r->lead >= 0 && r->lead_free);
}

bool jgram_run_triggered(const struct jgram_run *r)
{
	return r->g->lazy && r->st.seg < SEG_FREE && r->lead < 0;
}

/* One pass over trie tr from the current state: r->allow gets every
 * token whose whole piece is accepted. Returns how many. */
static uint32_t run_walk(struct jgram_run *r, const struct trie *tr)
{
	uint32_t n = 0, i = 0;

	r->at[0] = &r->st;
	while (i < tr->n_nodes) {
		const struct tnode *t = &tr->nodes[i];
		const struct state *up = r->at[t->depth - 1];

		if (state_same(r->g, up, t->byte)) {
			r->at[t->depth] = up;
		} else {
			struct state *s = &r->buf[t->depth];

			state_copy(s, up);
			if (!state_step(r->g, s, t->byte)) {
				i = t->end;
				continue;
			}
			r->at[t->depth] = s;
		}
		for (uint32_t k = 0; k < t->n_tok; k++) {
			int32_t id = tr->toks[t->tok + k];

			r->allow[(uint32_t)id / 64] |= UINT64_C(1) << ((uint32_t)id % 64);
		}
		n += t->n_tok;
		i++;
	}
	return n;
}

/* Every plain token may come now: plain string text (no escape or
 * character pending), in a string without checks or with lengths only
 * and room for a whole piece before max_len. */
static bool plain_all(const struct jgram *g, const struct state *st)
{
	const struct scalar *s = &st->s;
	const struct gstr *k = s->str ? &g->strs[s->str] : NULL;

	if (s->kind != S_STR || s->sub || s->u8_need || (s->flags & F_LOW_DUE))
		return false;
	return !k || (!k->pat && k->max_len >= JGRAM_PIECE_MAX &&
		      s->cps <= k->max_len - JGRAM_PIECE_MAX);
}

/* In a patterned string past min_len and far enough from max_len that
 * every check of a piece's characters sees a whole period of lengths
 * (jpat_can_end's answer does not depend on the length), whether a
 * plain token (no quote, backslash, control or non-ASCII byte: it stays
 * in the string) is allowed depends on the pattern's state alone. */
static bool pat_stable(const struct jgram *g, const struct state *st)
{
	const struct scalar *s = &st->s;
	const struct gstr *k = s->str ? &g->strs[s->str] : NULL;

	if (!k || !k->pat || st->seg != SEG_VALUE || s->kind != S_STR || s->sub ||
	    s->u8_need || (s->flags & F_LOW_DUE))
		return false;
	return s->cps >= k->min_len &&
	       (uint64_t)k->max_len >= (uint64_t)s->cps + JGRAM_PIECE_MAX + k->pat->pre +
					  k->pat->period;
}

/* pat_stable: the plain tokens allowed are kept for the last pattern
 * state (a repeated class stays in one), so a step in the same state
 * walks only the special trie. */
static uint32_t run_pat(struct jgram_run *r)
{
	const struct jgram_vocab *v = r->v;
	size_t words = (v->n_vocab + 63) / 64;
	uint32_t n = 0;

	if (r->pat_str != r->st.s.str || r->pat_set != r->st.s.nfa) {
		memset(r->allow, 0, words * sizeof(uint64_t));
		n = run_walk(r, &v->all);
		if (!r->pat_plain && !(r->pat_plain = malloc(words * sizeof(uint64_t))))
			return n;   /* nothing kept: walked whole again next time */
		for (size_t w = 0; w < words; w++)
			r->pat_plain[w] = r->allow[w] & v->plain[w];
		r->pat_str = r->st.s.str;
		r->pat_set = r->st.s.nfa;
		return n;
	}
	memcpy(r->allow, r->pat_plain, words * sizeof(uint64_t));
	for (size_t w = 0; w < words; w++)
		n += (uint32_t)__builtin_popcountll(r->pat_plain[w]);
	return n + run_walk(r, &v->special);
}

/* Inside plain string text (plain_all) every plain token is allowed as
 * it is: only the others are walked. */
static uint32_t run_allowed(struct jgram_run *r)
{
	const struct jgram_vocab *v = r->v;
	size_t words = (v->n_vocab + 63) / 64;
	uint32_t n = 0;

	if (pat_stable(r->g, &r->st))
		return run_pat(r);
	if (r->st.seg != SEG_VALUE || !plain_all(r->g, &r->st)) {
		memset(r->allow, 0, words * sizeof(uint64_t));
		return run_walk(r, &v->all);
	}
	memcpy(r->allow, v->plain, words * sizeof(uint64_t));
	for (size_t w = 0; w < words; w++)
		n += (uint32_t)__builtin_popcountll(v->plain[w]);
	return n + run_walk(r, &v->special);
}

/* Before the lead token: it alone. */
static uint32_t run_lead(struct jgram_run *r)
{
	memset(r->allow, 0, (r->v->n_vocab + 63) / 64 * sizeof(uint64_t));
	if ((uint32_t)r->lead >= r->v->n_vocab)
		return 0;
	r->allow[(uint32_t)r->lead / 64] |= UINT64_C(1) << ((uint32_t)r->lead % 64);
	return 1;
}

/* A free segment: token id (a text token) is allowed when the run
 * takes all its bytes (it may fire the trigger, and what follows it in
 * the piece must then be the grammar's). */
static bool free_token_ok(const struct jgram_run *r, int32_t id)
{
	struct state st;
	const char *p;
	size_t len;

	if (!token_text(r->v->t, id, &p, &len))
		return true;
	state_copy(&st, &r->st);
	for (size_t i = 0; i < len; i++)
		if (!state_step(r->g, &st, (uint8_t)p[i]))
			return false;
	return true;
}

/* The cheap free mask: with nothing of the trigger pending (or none to
 * wait for) only the tokens holding the whole trigger can leave free
 * text; every other token is allowed as it is. */
static uint32_t free_mask_cheap(struct jgram_run *r, float *logits, uint32_t n_vocab)
{
	size_t words = (r->v->n_vocab + 63) / 64;
	uint32_t bad = 0;

	if (!r->allow_all)
		memset(r->allow, 0xff, words * sizeof(uint64_t));
	r->allow_all = true;
	for (uint32_t i = 0; r->st.seg == SEG_FREE && r->trig && i < r->trig->n; i++) {
		int32_t id = r->trig->toks[i];

		if (free_token_ok(r, id))
			continue;
		r->allow[(uint32_t)id / 64] &= ~(UINT64_C(1) << ((uint32_t)id % 64));
		r->allow_all = false;
		if ((uint32_t)id < n_vocab)
			logits[id] = -INFINITY;
		bad++;
	}
	return n_vocab - bad;
}

/* The tokens of trie node i's subtree: toks[nodes[i].tok, that). The
 * pieces are sorted, so a subtree's are contiguous. */
static uint32_t subtree_toks_end(const struct trie *tr, uint32_t i)
{
	uint32_t e = tr->nodes[i].end;

	return e < tr->n_nodes ? tr->nodes[e].tok : tr->n_toks;
}

static void disallow(uint64_t *allow, int32_t id)
{
	allow[(uint32_t)id / 64] &= ~(UINT64_C(1) << ((uint32_t)id % 64));
}

/* From a free state, clear in r->allow (all ones) the trie's tokens the
 * run refuses. A subtree is skipped, left allowed, where its prefix
 * leaves the run free with nothing pending (SEG_FREE at tpos 0, SEG_OFF):
 * only a token holding the whole trigger could still fail in it, and
 * those are checked apart (free_mask_walk). So from "<tool_" only the
 * prefixes that go on matching are walked, not the trie. */
static void free_walk(struct jgram_run *r, const struct trie *tr)
{
	uint32_t i = 0;

	r->at[0] = &r->st;
	while (i < tr->n_nodes) {
		const struct tnode *t = &tr->nodes[i];
		const struct state *up = r->at[t->depth - 1];
		struct state *s = &r->buf[t->depth];

		if (state_same(r->g, up, t->byte)) {
			r->at[t->depth] = up;
			i++;
			continue;
		}
		state_copy(s, up);
		if (!state_step(r->g, s, t->byte)) {
			for (uint32_t k = t->tok, e = subtree_toks_end(tr, i); k < e; k++)
				disallow(r->allow, tr->toks[k]);
			i = t->end;
			continue;
		}
		if (s->seg == SEG_OFF || (s->seg == SEG_FREE && s->tpos == 0)) {
			i = t->end;
			continue;
		}
		r->at[t->depth] = s;
		i++;
	}
}

/* A free mask with part of the trigger pending, or before the first
 * non-whitespace byte (SEG_START): the trie is walked from the state,
 * pruned where free text goes on (free_walk); the tokens holding the
 * whole trigger, and those outside the trie with text (pieces longer
 * than its), are checked one by one; the rest (control tokens, EOS)
 * write nothing and are allowed. */
static uint32_t free_mask_walk(struct jgram_run *r, float *logits, uint32_t n_vocab)
{
	const struct jgram_vocab *v = r->v;
	size_t words = (v->n_vocab + 63) / 64;
	uint32_t bad = 0;

	memset(r->allow, 0xff, words * sizeof(uint64_t));
	r->allow_all = false;
	free_walk(r, &v->all);
	for (uint32_t i = 0; r->st.seg == SEG_FREE && r->trig && i < r->trig->n; i++)
		if (!free_token_ok(r, r->trig->toks[i]))
			disallow(r->allow, r->trig->toks[i]);
	for (uint32_t i = 0; i < v->n_longs; i++)
		if (!free_token_ok(r, v->longs[i]))
			disallow(r->allow, v->longs[i]);
	for (uint32_t w = 0; w < words && w * 64 < n_vocab; w++) {
		uint64_t a = r->allow[w];

		if (a == ~UINT64_C(0))
			continue;
		for (uint32_t b = 0; b < 64 && w * 64 + b < n_vocab && w * 64 + b < v->n_vocab; b++)
			if (!(a >> b & 1)) {
				logits[w * 64 + b] = -INFINITY;
				bad++;
			}
	}
	return n_vocab - bad;
}

uint32_t jgram_run_mask(void *run, float *logits, uint32_t n_vocab)
{
	struct jgram_run *r = run;
	const struct jgram_vocab *v = r->v;
	uint32_t n;

	if (r->lead >= 0 && r->lead_free) {
		return free_mask_cheap(r, logits, n_vocab);   /* every token */
	} else if (r->lead >= 0) {
		r->allow_all = false;
		n = run_lead(r);
	} else if (r->st.seg == SEG_OFF || (r->st.seg == SEG_FREE && r->st.tpos == 0)) {
		return free_mask_cheap(r, logits, n_vocab);
	} else if (r->st.seg >= SEG_FREE) {
		return free_mask_walk(r, logits, n_vocab);
	} else {
		r->allow_all = false;
		n = run_allowed(r);
	}

	if (v->eos >= 0 && (uint32_t)v->eos < v->n_vocab && jgram_run_complete(r)) {
		r->allow[(uint32_t)v->eos / 64] |= UINT64_C(1) << ((uint32_t)v->eos % 64);
		n++;
	}
	for (uint32_t w = 0; w * 64 < n_vocab; w++) {
		uint64_t a = w * 64 < v->n_vocab ? r->allow[w] : 0;

		if (a == ~UINT64_C(0))
			continue;
		for (uint32_t b = 0; b < 64 && w * 64 + b < n_vocab; b++)
			if (!(a >> b & 1))
				logits[w * 64 + b] = -INFINITY;
	}
	return n;
}

bool jgram_run_accept(void *run, int32_t token)
{
	struct jgram_run *r = run;
	const char *p;
	size_t len;

	if (r->lead >= 0) {
		if (token != r->lead)
			return r->lead_free;   /* free text goes on */
		r->lead = -1;   /* the byte grammar from here */
		return true;
	}
	if (token == r->v->eos)
		return state_complete(r->g, &r->st);
	if (r->st.seg >= SEG_FREE) {   /* free text: any token its bytes allow */
		if (token < 0 || (uint32_t)token >= r->v->n_vocab ||
		    !token_text(r->v->t, token, &p, &len))
			return true;
		return jgram_run_feed(r, p, len);
	}
	if (token < 0 || (uint32_t)token >= r->v->n_vocab ||
	    !(r->allow[(uint32_t)token / 64] >> ((uint32_t)token % 64) & 1) ||
	    tokenizer_piece(r->v->t, token, &p, &len))
		return false;
	return jgram_run_feed(r, p, len);
}
