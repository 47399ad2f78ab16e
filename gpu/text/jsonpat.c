/* jsonpat.c - a regular expression's subset as a Glushkov automaton
 * (jsonpat.h).
 *
 * Design. A recursive-descent parser that builds the automaton as it
 * reads: each subexpression is a fragment (its first positions, its last
 * positions, whether it matches the empty string), and concatenation,
 * alternation and the quantifiers are operations on fragments that add
 * follow edges. A counted repetition X{m,n} parses X again for each copy
 * (fresh positions), so there is no syntax tree. An unanchored end is a
 * position of any character repeated, before or after the pattern. Then
 * reach[] (jsonpat.h) is iterated until an entry repeats, and kept as
 * a sparse table of ORs so that a length window is a few lookups.
 */
#include "gpu/text/jsonpat.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct cls {
	uint64_t w[2];                   /* ASCII 0..63, 64..127 */
	bool other;                      /* non-ASCII code points */
};

struct frag {
	uint64_t first, last;
	bool nullable;
};

struct pp {
	struct jpat *p;
	const char *re;
	size_t len, i;
	unsigned depth;
	uint32_t atoms;                  /* parse_atom calls (JPAT_ATOMS_MAX) */
	bool top_alt;                    /* a | outside any group */
	int err;
	char *msg;
	size_t msg_len;
};

static void pp_bad(struct pp *x, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void pp_bad(struct pp *x, const char *fmt, ...)
{
	va_list ap;

	if (x->err)
		return;
	x->err = JPAT_E_INVALID;
	if (x->msg && x->msg_len) {
		va_start(ap, fmt);
		vsnprintf(x->msg, x->msg_len, fmt, ap);
		va_end(ap);
	}
}

/* ---- classes ------------------------------------------------------------ */

static void cls_add(struct cls *c, unsigned ch)
{
	c->w[ch / 64] |= UINT64_C(1) << (ch % 64);
}

static bool cls_has(const struct cls *c, unsigned ch)
{
	return c->w[ch / 64] >> (ch % 64) & 1;
}

static void cls_range(struct cls *c, unsigned a, unsigned b)
{
	for (unsigned ch = a; ch <= b; ch++)
		cls_add(c, ch);
}

/* Symbols a JSON string can write without \u: printable ASCII (quote
 * and backslash escaped), DEL, \b \t \n \f \r, and non-ASCII. */
static bool writable(unsigned sym)
{
	return sym >= 0x20 || sym == 8 || sym == 9 || sym == 10 || sym == 12 || sym == 13;
}

/* \d \w \s and their negations (ASCII only: see the header). */
static bool cls_escape(uint8_t e, struct cls *c)
{
	struct cls s = { .w = { 0, 0 } };

	switch (e | 0x20) {
	case 'd': cls_range(&s, '0', '9'); break;
	case 'w': cls_range(&s, '0', '9'); cls_range(&s, 'a', 'z');
		  cls_range(&s, 'A', 'Z'); cls_add(&s, '_'); break;
	case 's': cls_range(&s, 9, 13); cls_add(&s, ' '); break;
	default: return false;
	}
	if (e >= 'a') {
		c->w[0] |= s.w[0];
		c->w[1] |= s.w[1];
	} else {
		c->w[0] |= ~s.w[0];
		c->w[1] |= ~s.w[1];
	}
	return true;
}

/* '.': ASCII but the line terminators \n and \r (see the header). */
static int cls_dot(struct cls *c)
{
	cls_range(c, 0, 127);
	c->w[0] &= ~(UINT64_C(1) << '\n' | UINT64_C(1) << '\r');
	return -2;
}

static int hexval(uint8_t c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f')
		return (c | 0x20) - 'a' + 10;
	return -1;
}

/* \xHH or \uHHHH at x->i (after the letter): an ASCII code, -1. */
static int esc_hex(struct pp *x, unsigned digits)
{
	int v = 0;

	for (unsigned k = 0; k < digits; k++) {
		int h = x->i < x->len ? hexval((uint8_t)x->re[x->i]) : -1;

		if (h < 0)
			return pp_bad(x, "a \\x or \\u escape needs %u hex digits", digits), -1;
		v = v * 16 + h;
		x->i++;
	}
	if (v >= 0x80)
		return pp_bad(x, "non-ASCII characters are not supported"), -1;
	return v;
}

/* One escaped character after '\' (x->i at the letter): its code, or -1
 * (refused, or a class when cls is given and the escape is one). */
static int esc_char(struct pp *x, struct cls *cls, bool in_class)
{
	uint8_t e = x->i < x->len ? (uint8_t)x->re[x->i] : 0;
	const char *plain = "tnrfv";
	const char *p = e ? strchr(plain, e) : NULL;

	x->i++;
	if (cls && cls_escape(e, cls))
		return -2;
	if (p)
		return "\t\n\r\f\v"[p - plain];
	if (e == 'b' && in_class)
		return 8;
	if (e == '0' && !(x->i < x->len && x->re[x->i] >= '0' && x->re[x->i] <= '9'))
		return 0;
	if (e == 'x' || e == 'u')
		return esc_hex(x, e == 'x' ? 2 : 4);
	if (e >= 0x21 && e < 0x7f && !(e >= '0' && e <= '9') && !((e | 0x20) >= 'a' && (e | 0x20) <= 'z'))
		return e;
	if (e >= '1' && e <= '9')
		return pp_bad(x, "backreferences are not supported"), -1;
	return pp_bad(x, "the escape \\%c is not supported", e >= 0x21 && e < 0x7f ? e : '?'), -1;
}

/* One member of a bracket class (a character), -2 for a class escape
 * (added to c), -1 refused. */
static int class_char(struct pp *x, struct cls *c)
{
	uint8_t ch = (uint8_t)x->re[x->i];

	if (ch >= 0x80)
		return pp_bad(x, "non-ASCII characters are not supported"), -1;
	if (ch == '[')
		return pp_bad(x, "'[' inside a class must be escaped"), -1;
	if (ch != '\\') {
		x->i++;
		return ch;
	}
	x->i++;
	return esc_char(x, c, true);
}

/* [...] after its '['. */
static bool parse_class(struct pp *x, struct cls *c)
{
	bool neg = x->i < x->len && x->re[x->i] == '^', esc = false;

	x->i += neg;
	if (x->i < x->len && x->re[x->i] == ']')
		return pp_bad(x, "an empty class or ']' first in it is not supported"), false;
	while (x->i < x->len && x->re[x->i] != ']' && !x->err) {
		int a = class_char(x, c), b;

		if (a == -2) {
			esc = true;
			continue;
		}
		if (a < 0 || x->i + 1 >= x->len || x->re[x->i] != '-' || x->re[x->i + 1] == ']') {
			if (a >= 0)
				cls_add(c, (unsigned)a);
			continue;
		}
		x->i++;
		b = class_char(x, c);
		if (b == -2 || (b >= 0 && b < a))
			pp_bad(x, "a class range is out of order or names a class");
		else if (b >= 0)
			cls_range(c, (unsigned)a, (unsigned)b);
	}
	if (x->err || x->i >= x->len)
		return pp_bad(x, "a class is not closed"), false;
	x->i++;
	if (neg) {
		c->w[0] = ~c->w[0];
		c->w[1] = ~c->w[1];
		c->other = !esc;
	}
	return true;
}

/* ---- fragments -------------------------------------------------------------- */

/* A position of class c: a fragment of one character. */
static struct frag frag_pos(struct pp *x, const struct cls *c)
{
	struct jpat *p = x->p;
	uint64_t bit;

	if (p->n >= JPAT_POS_MAX) {
		pp_bad(x, "the pattern needs more than %u states", JPAT_POS_MAX - 1);
		return (struct frag){ .nullable = true };
	}
	bit = UINT64_C(1) << p->n++;
	for (unsigned s = 0; s < 128; s++)
		if (cls_has(c, s) && writable(s))
			p->match[s] |= bit;
	if (c->other)
		p->match[JPAT_OTHER] |= bit;
	return (struct frag){ .first = bit, .last = bit };
}

static void follow_add(struct jpat *p, uint64_t from, uint64_t to)
{
	for (; from; from &= from - 1)
		p->follow[__builtin_ctzll(from)] |= to;
}

static struct frag frag_cat(struct jpat *p, struct frag a, struct frag b)
{
	follow_add(p, a.last, b.first);
	return (struct frag){ .first = a.first | (a.nullable ? b.first : 0),
			      .last = b.last | (b.nullable ? a.last : 0),
			      .nullable = a.nullable && b.nullable };
}

static struct frag frag_star(struct jpat *p, struct frag a, bool plus)
{
	follow_add(p, a.last, a.first);
	a.nullable = a.nullable || !plus;
	return a;
}

/* ---- the parser ---------------------------------------------------------- */

static struct frag parse_alt(struct pp *x);

static struct frag parse_group(struct pp *x)
{
	struct frag f;

	if (x->i < x->len && x->re[x->i] == '?') {
		if (x->i + 1 >= x->len || x->re[x->i + 1] != ':') {
			pp_bad(x, "lookaround and named groups are not supported");
			return (struct frag){ .nullable = true };
		}
		x->i += 2;
	}
	x->depth++;
	f = parse_alt(x);
	x->depth--;
	if (x->i >= x->len || x->re[x->i] != ')')
		pp_bad(x, "a group is not closed");
	x->i++;
	return f;
}

static struct frag parse_atom(struct pp *x)
{
	uint8_t c = (uint8_t)x->re[x->i++];
	struct cls k = { .w = { 0, 0 } };
	int ch = c;

	if (++x->atoms > JPAT_ATOMS_MAX) {
		pp_bad(x, "the pattern takes more than %u steps to expand", JPAT_ATOMS_MAX);
		return (struct frag){ .nullable = true };
	}
	if (c == '(')
		return parse_group(x);
	if (c == '[')
		ch = parse_class(x, &k) ? -2 : -1;
	else if (c == '.')
		ch = cls_dot(&k);
	else if (c == '\\')
		ch = esc_char(x, &k, false);
	else if (c >= 0x80)
		ch = (pp_bad(x, "non-ASCII characters are not supported"), -1);
	else if (strchr("^$", c))
		ch = (pp_bad(x, "'^' and '$' are supported only at the pattern's ends"), -1);
	else if (strchr("*+?{}])", c))
		ch = (pp_bad(x, "'%c' has nothing to repeat or is unbalanced", c), -1);
	if (ch == -1)
		return (struct frag){ .nullable = true };
	if (ch >= 0)
		cls_add(&k, (unsigned)ch);
	return frag_pos(x, &k);
}

/* Decimal digits at x->i: false when none or above JPAT_REP_MAX. */
static bool parse_num(struct pp *x, uint32_t *v)
{
	size_t start = x->i;

	*v = 0;
	while (x->i < x->len && x->re[x->i] >= '0' && x->re[x->i] <= '9' && *v <= JPAT_REP_MAX)
		*v = *v * 10 + (uint32_t)(x->re[x->i++] - '0');
	return x->i > start && *v <= JPAT_REP_MAX;
}

/* {m}, {m,}, {m,n} after '{': false when malformed (n UINT32_MAX: none). */
static bool parse_count(struct pp *x, uint32_t *m, uint32_t *n)
{
	if (!parse_num(x, m))
		return false;
	*n = *m;
	if (x->i < x->len && x->re[x->i] == ',') {
		x->i++;
		*n = UINT32_MAX;
		if (x->i < x->len && x->re[x->i] != '}' && (!parse_num(x, n) || *n < *m))
			return false;
	}
	if (x->i >= x->len || x->re[x->i] != '}')
		return false;
	x->i++;
	return true;
}

/* The atom at start (a fresh copy of it; x->i is kept). */
static struct frag atom_copy(struct pp *x, size_t start)
{
	size_t i = x->i;
	struct frag f;

	x->i = start;
	f = parse_atom(x);
	x->i = i;
	return f;
}

/* X{m,n}: m copies, then n - m optional ones (or one repeated). */
static struct frag repeat(struct pp *x, struct frag a, size_t start, uint32_t m, uint32_t n)
{
	struct frag f = { .nullable = true };

	for (uint32_t k = 0; k < m && !x->err; k++)
		f = frag_cat(x->p, f, k ? atom_copy(x, start) : a);
	if (n == UINT32_MAX)
		return frag_cat(x->p, f, frag_star(x->p, m ? atom_copy(x, start) : a, false));
	for (uint32_t k = m; k < n && !x->err; k++) {
		struct frag o = k ? atom_copy(x, start) : a;

		o.nullable = true;
		f = frag_cat(x->p, f, o);
	}
	return f;
}

/* An atom that added no position (an empty group: `()`, `(?:)`, `(|)`)
 * matches only the empty string, so its repetitions are the atom once,
 * not copies (which would multiply a nesting's work by n per level). */
static struct frag parse_piece(struct pp *x)
{
	size_t start = x->i;
	uint32_t n0 = x->p->n;
	struct frag a = parse_atom(x);
	uint32_t m, n;
	char q = x->i < x->len ? x->re[x->i] : 0;

	if (x->err || !q || !strchr("?*+{", q))
		return a;
	x->i++;
	if (q == '?')
		a.nullable = true;
	else if (q == '*' || q == '+')
		a = frag_star(x->p, a, q == '+');
	else if (!parse_count(x, &m, &n))
		pp_bad(x, "a {m,n} is malformed or above %u", JPAT_REP_MAX);
	else if (x->p->n == n0)
		a.nullable = true;
	else
		a = repeat(x, a, start, m, n);
	if (x->i < x->len && x->re[x->i] == '?')
		x->i++;   /* lazy: the same strings */
	if (x->i < x->len && strchr("?*+{", x->re[x->i]))
		pp_bad(x, "a quantifier follows a quantifier");
	return a;
}

static struct frag parse_seq(struct pp *x)
{
	struct frag f = { .nullable = true };

	while (x->i < x->len && x->re[x->i] != '|' && x->re[x->i] != ')' && !x->err)
		f = frag_cat(x->p, f, parse_piece(x));
	return f;
}

static struct frag parse_alt(struct pp *x)
{
	struct frag f = parse_seq(x);

	while (x->i < x->len && x->re[x->i] == '|' && !x->err) {
		struct frag b;

		x->top_alt |= x->depth == 0;
		x->i++;
		b = parse_seq(x);
		f = (struct frag){ .first = f.first | b.first, .last = f.last | b.last,
				   .nullable = f.nullable || b.nullable };
	}
	return f;
}

/* ---- reach and the whole ------------------------------------------------ */

/* reach_or[j]: the ORs of 2^j entries of reach[] from each index (a
 * sparse table: any run of entries is two lookups). */
static int reach_or_build(struct jpat *p, const uint64_t *r)
{
	uint32_t n = p->pre + p->period, levels = 32 - (uint32_t)__builtin_clz(n);
	uint64_t *t = malloc(sizeof(uint64_t) * n * levels);

	if (!t)
		return -ENOMEM;
	memcpy(t, r, sizeof(uint64_t) * n);
	for (uint32_t j = 1; j < levels; j++)
		for (uint32_t k = 0; k + (1u << j) <= n; k++)
			t[j * n + k] = t[(j - 1) * n + k] | t[(j - 1) * n + k + (1u << (j - 1))];
	p->reach_or = t;
	p->levels = levels;
	return 0;
}

static int reach_build(struct jpat *p)
{
	uint64_t enter = 0, r[JPAT_REACH_MAX];

	for (unsigned s = 0; s < JPAT_SYMS; s++)
		enter |= p->match[s];
	r[0] = p->final;
	for (uint32_t l = 1; l < JPAT_REACH_MAX; l++) {
		r[l] = 0;
		for (uint32_t q = 0; q < p->n; q++)
			if (p->follow[q] & enter & r[l - 1])
				r[l] |= UINT64_C(1) << q;
		for (uint32_t k = 0; k < l; k++) {
			if (r[k] == r[l]) {
				p->pre = k;
				p->period = l - k;
				return reach_or_build(p, r);
			}
		}
	}
	return JPAT_E_INVALID;
}

/* A last '$' is the end anchor unless an odd run of backslashes
 * escapes it (a\\$ is a backslash, then the end). */
static bool end_anchor(const struct pp *x, bool head)
{
	size_t k;

	if (x->len <= (size_t)head || x->re[x->len - 1] != '$')
		return false;
	for (k = x->len - 1; k > 0 && x->re[k - 1] == '\\'; k--)
		;
	return (x->len - 1 - k) % 2 == 0;
}

/* The pattern proper, its anchors and the any-character ends. */
static struct frag parse_whole(struct pp *x)
{
	struct cls any = { .w = { ~UINT64_C(0), ~UINT64_C(0) }, .other = true };
	bool head = x->len && x->re[0] == '^';
	bool tail = end_anchor(x, head);
	struct frag f;

	x->i = head;
	x->len -= tail;
	f = parse_alt(x);
	if (!x->err && x->i < x->len)
		pp_bad(x, "a ')' is unbalanced");
	if (!x->err && x->top_alt && (head || tail))
		pp_bad(x, "'^' or '$' with a top-level '|' is not supported (group it: ^(a|b)$)");
	if (!head)
		f = frag_cat(x->p, frag_star(x->p, frag_pos(x, &any), false), f);
	if (!tail)
		f = frag_cat(x->p, f, frag_star(x->p, frag_pos(x, &any), false));
	return f;
}

int jpat_compile(struct jpat *p, const char *re, size_t len, char *msg, size_t msg_len)
{
	struct pp x = { .p = p, .re = re, .len = len, .msg = msg, .msg_len = msg_len };
	struct frag f;
	int rc;

	*p = (struct jpat){ .n = 1 };
	if (len > JPAT_BYTES_MAX || memchr(re, 0, len)) {
		pp_bad(&x, "a pattern is over %u bytes or holds NUL", JPAT_BYTES_MAX);
		return x.err;
	}
	f = parse_whole(&x);
	if (x.err)
		return x.err;
	p->follow[0] = f.first;
	p->final = f.last | (f.nullable ? 1u : 0u);
	rc = reach_build(p);
	if (rc == JPAT_E_INVALID)
		pp_bad(&x, "the pattern's lengths do not repeat within %u", JPAT_REACH_MAX);
	return rc;
}

void jpat_free(struct jpat *p)
{
	if (p) {
		free(p->reach_or);
		p->reach_or = NULL;
	}
}

uint64_t jpat_step(const struct jpat *p, uint64_t set, unsigned sym)
{
	uint64_t next = 0;

	for (; set; set &= set - 1)
		next |= p->follow[__builtin_ctzll(set)];
	return next & p->match[sym];
}

/* The OR of reach[a..b] (a <= b < pre + period): two lookups. */
static uint64_t reach_run(const struct jpat *p, uint32_t a, uint32_t b)
{
	uint32_t n = p->pre + p->period, j = 31 - (uint32_t)__builtin_clz(b - a + 1);
	const uint64_t *t = p->reach_or + (size_t)j * n;

	return t[a] | t[b + 1 - (1u << j)];
}

bool jpat_can_end(const struct jpat *p, uint64_t set, uint32_t lo, uint32_t hi)
{
	uint32_t pre = p->pre, per = p->period, end = pre + per - 1, a, b;
	uint64_t ok = 0;

	if (!set || lo > hi)
		return false;
	if (lo < pre)   /* the lengths before the period: their own entries */
		ok |= reach_run(p, lo, hi < pre ? hi : pre - 1);
	if (hi < pre)
		return set & ok;
	lo = lo > pre ? lo : pre;
	if ((uint64_t)hi - lo + 1 >= per)   /* a whole period */
		return set & (ok | reach_run(p, pre, end));
	a = pre + (lo - pre) % per;
	b = a + (hi - lo);   /* < a + per: wraps at most once */
	if (b <= end)
		return set & (ok | reach_run(p, a, b));
	return set & (ok | reach_run(p, a, end) | reach_run(p, pre, b - per));
}
