/* tokenizer_bpe.c - byte-level BPE encode (tokenizer.ggml.model = gpt2).
 *
 * Pre-tokenizer. Each tokenizer.ggml.pre value names a list of split
 * rules (the regexes of the model's tokenizer.json, as llama.cpp applies
 * them): the first rule cuts the text into fragments, each later rule
 * cuts every fragment again, keeping both what it matched and the gaps
 * between matches. Every rule is a hand-written matcher: given a start
 * position it says where a match starting there ends (leftmost-first
 * alternation, with the regex's backtracking worked out by hand), or that
 * none starts there. Character classes come from the generated Unicode
 * table (tokenizer_unicode.c). Rules llama.cpp runs through std::regex
 * see "collapsed" classes: any non-ASCII code point that is not a
 * number, punctuation or space counts as a letter; rules it runs through
 * its own scanners (GPT-2's, Llama 3's) see the true classes. We follow
 * that, since the ids must match.
 *
 * Merges. Each word's bytes are mapped through GPT-2's byte-to-unicode
 * table; where the vocabulary asks for it (ignore_merges: Llama 3,
 * Tekken) a word that is itself a token is emitted whole, otherwise the
 * engine in tokenizer_merge.c merges it, keyed by (lowest merge rank,
 * then leftmost).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "conf/util.h"
#include "gpu/text/tokenizer_int.h"

static size_t utf8_encode(uint32_t cp, char *out)
{
	if (cp < 0x80) {
		out[0] = (char)cp;
		return 1;
	}
	if (cp < 0x800) {
		out[0] = (char)(0xc0 | (cp >> 6));
		out[1] = (char)(0x80 | (cp & 0x3f));
		return 2;
	}
	if (cp < 0x10000) {
		out[0] = (char)(0xe0 | (cp >> 12));
		out[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
		out[2] = (char)(0x80 | (cp & 0x3f));
		return 3;
	}
	out[0] = (char)(0xf0 | (cp >> 18));
	out[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
	out[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
	out[3] = (char)(0x80 | (cp & 0x3f));
	return 4;
}

/* ---- merges ---------------------------------------------------------------- */

/* A pair may merge when "left right" is a merge rule; the lower its rank,
 * the sooner. */
static int bpe_prio(struct merger *m, const struct sym *a, const struct sym *b,
		    double *prio)
{
	const struct tokenizer *t = m->t;
	size_t need = (size_t)a->n + b->n + 1;
	uint32_t rank;

	if (need > m->key_cap) {
		char *k = realloc(m->key, need);
		if (!k)
			return -ENOMEM;
		m->key = k;
		m->key_cap = need;
	}
	memcpy(m->key, m->s + a->off, a->n);
	m->key[a->n] = ' ';
	memcpy(m->key + a->n + 1, m->s + b->off, b->n);
	rank = *tokenizer__strmap_slot(&t->mmap, t->arena.p, t->merge, m->key,
				       need);
	if (!rank)
		return 0;
	*prio = -(double)(rank - 1);
	return 1;
}

/* A symbol the merges made but the vocabulary lacks: fall back to its
 * single mapped characters (or unk). */
static int bpe_fallback(struct merger *m, const struct sym *y, struct ids *out)
{
	const struct tokenizer *t = m->t;
	int rc;

	for (uint32_t k = 0; k < y->n;) {
		uint8_t lead = (uint8_t)m->s[y->off + k];
		size_t l = KVD_MIN(tokenizer__utf8_len(lead), y->n - k);
		int32_t id = tokenizer__vocab_find(t, m->s + y->off + k, l);

		if (id < 0)
			id = t->unk;
		if (id >= 0 && (rc = tokenizer__ids_push(out, id)))
			return rc;
		k += (uint32_t)l;
	}
	return 0;
}

static const struct merger_ops bpe_ops = { .prio = bpe_prio,
					   .fallback = bpe_fallback };

/* ---- character classes ------------------------------------------------------ */

static uint8_t ucat_of(uint32_t cp)
{
	size_t lo = 0, hi = tokenizer__n_ucat_runs;

	if (cp == UINT32_MAX) /* an invalid byte: neither letter, number nor space */
		return UC_P;
	while (hi - lo > 1) {
		size_t mid = (lo + hi) / 2;
		if (tokenizer__ucat_runs[mid].start <= cp)
			lo = mid;
		else
			hi = mid;
	}
	return tokenizer__ucat_runs[lo].cat;
}

/* std::regex's view (llama.cpp collapses the text before matching):
 * non-ASCII symbols, marks and the rest count as letters. */
static uint8_t ucat_collapse(uint32_t cp, uint8_t c)
{
	uint8_t major = c & UC_MAJOR;

	if (cp < 0x80 || (c & UC_WS) || major == UC_L || major == UC_N ||
	    major == UC_P)
		return c;
	return UC_L;
}

/* The decoded text: one entry per code point. */
struct ptext {
	const uint32_t *cp;   /* (n) code points, UINT32_MAX for a bad byte */
	const uint8_t *cat;   /* (n) classes, true or collapsed per rule */
	size_t end;           /* end of the fragment being matched */
};

static bool is_ws(uint8_t c) { return c & UC_WS; }
static bool is_l(uint8_t c) { return !(c & UC_WS) && (c & UC_MAJOR) == UC_L; }
static bool is_n(uint8_t c) { return !(c & UC_WS) && (c & UC_MAJOR) == UC_N; }
static bool is_p(uint8_t c) { return !(c & UC_WS) && (c & UC_MAJOR) == UC_P; }
static bool is_s(uint8_t c) { return !(c & UC_WS) && (c & UC_MAJOR) == UC_S; }
static bool is_m(uint8_t c) { return !(c & UC_WS) && (c & UC_MAJOR) == UC_M; }
static bool is_other(uint8_t c) { return !is_ws(c) && !is_l(c) && !is_n(c); }
static bool is_nl(uint32_t cp) { return cp == '\n' || cp == '\r'; }

/* The code point std::wregex sees: non-ASCII spaces became U+000B. */
static uint32_t eff_cp(const struct ptext *p, size_t i)
{
	return p->cp[i] > 0x7f && is_ws(p->cat[i]) ? 0x0b : p->cp[i];
}

typedef bool (*cls_fn)(const struct ptext *p, size_t i);

static size_t run(const struct ptext *p, size_t i, cls_fn in, size_t max)
{
	size_t k = 0;

	while (i < p->end && k < max && in(p, i)) {
		i++;
		k++;
	}
	return i;
}

static bool c_l(const struct ptext *p, size_t i) { return is_l(p->cat[i]); }
static bool c_n(const struct ptext *p, size_t i) { return is_n(p->cat[i]); }
static bool c_p(const struct ptext *p, size_t i) { return is_p(p->cat[i]); }
static bool c_other(const struct ptext *p, size_t i) { return is_other(p->cat[i]); }
static bool c_ws(const struct ptext *p, size_t i) { return is_ws(p->cat[i]); }
static bool c_nl(const struct ptext *p, size_t i) { return is_nl(p->cp[i]); }
static bool c_ps(const struct ptext *p, size_t i)
{
	return is_p(p->cat[i]) || is_s(p->cat[i]);
}
static bool c_lm(const struct ptext *p, size_t i)
{
	return is_l(p->cat[i]) || is_m(p->cat[i]);
}
static bool c_ascii_alpha(const struct ptext *p, size_t i)
{
	uint32_t c = p->cp[i] | 0x20;
	return c >= 'a' && c <= 'z';
}
static bool c_nl_or_slash(const struct ptext *p, size_t i)
{
	return is_nl(p->cp[i]) || p->cp[i] == '/';
}
/* Tekken's case classes: a letter that is not ASCII lower (upper-ish),
 * a letter that is not ASCII upper (lower-ish). */
static bool c_up(const struct ptext *p, size_t i)
{
	return is_l(p->cat[i]) && !(p->cp[i] >= 'a' && p->cp[i] <= 'z');
}
static bool c_lo(const struct ptext *p, size_t i)
{
	return is_l(p->cat[i]) && !(p->cp[i] >= 'A' && p->cp[i] <= 'Z');
}

static bool in_ranges(uint32_t cp, const uint32_t (*r)[2], size_t n)
{
	for (size_t k = 0; k < n; k++)
		if (cp >= r[k][0] && cp <= r[k][1])
			return true;
	return false;
}

/* [一-龥ࠀ-一가-퟿] (DeepSeek LLM and Coder) */
static bool c_cjk(const struct ptext *p, size_t i)
{
	static const uint32_t r[][2] = { { 0x4e00, 0x9fa5 }, { 0x800, 0x4e00 },
					 { 0xac00, 0xd7ff } };
	return in_ranges(eff_cp(p, i), r, KVD_ARRAY_SIZE(r));
}
/* [一-龥぀-ゟ゠-ヿ] (DeepSeek V3) */
static bool c_cjk_kana(const struct ptext *p, size_t i)
{
	static const uint32_t r[][2] = { { 0x4e00, 0x9fa5 }, { 0x3040, 0x309f },
					 { 0x30a0, 0x30ff } };
	return in_ranges(eff_cp(p, i), r, KVD_ARRAY_SIZE(r));
}
static bool c_dsllm_letter(const struct ptext *p, size_t i)
{
	return in_ranges(eff_cp(p, i), tokenizer__dsllm_letters,
			 tokenizer__n_dsllm_letters);
}
/* [!-/:-~！-／：-～‘-‟　-。] */
static bool c_dsllm_punct(const struct ptext *p, size_t i)
{
	static const uint32_t r[][2] = {
		{ 0x21, 0x2f }, { 0x3a, 0x7e }, { 0xff01, 0xff0f },
		{ 0xff1a, 0xff5e }, { 0x2018, 0x201f }, { 0x3000, 0x3002 },
	};
	return in_ranges(eff_cp(p, i), r, KVD_ARRAY_SIZE(r));
}
/* [\p{P}\$\+<=>\^~\|`] (Falcon) and the same without ` (default) */
static bool c_p_sym(const struct ptext *p, size_t i)
{
	return is_p(p->cat[i]) || (p->cp[i] < 0x80 && strchr("$+<=>^~|`", (int)p->cp[i]) &&
				   p->cp[i]);
}
static bool c_p_sym_nobq(const struct ptext *p, size_t i)
{
	return p->cp[i] != '`' && c_p_sym(p, i);
}
static bool c_digit(const struct ptext *p, size_t i)
{
	return p->cp[i] >= '0' && p->cp[i] <= '9';
}

/* ---- matchers ----------------------------------------------------------------- */

/* A matcher returns the end of the match starting at i, or i for none. */
struct rule;
typedef size_t (*match_fn)(const struct rule *r, const struct ptext *p, size_t i);

struct rule {
	match_fn match;
	bool collapse;        /* see the classes as std::regex does */
	cls_fn cls;           /* m_run: the class */
	size_t max;           /* m_run, m_llama3: longest run (SIZE_MAX) */
	bool ws_prefix;       /* m_run: \s?X+ */
};

/* 's|'t|'re|'ve|'m|'ll|'d, case-folded when fold */
static size_t contraction(const struct ptext *p, size_t i, bool fold)
{
	static const char *const sfx[] = { "s", "t", "re", "ve", "m", "ll", "d" };

	if (p->cp[i] != '\'')
		return i;
	for (size_t k = 0; k < KVD_ARRAY_SIZE(sfx); k++) {
		size_t l = strlen(sfx[k]), j;
		if (i + 1 + l > p->end)
			continue;
		for (j = 0; j < l; j++) {
			uint32_t c = p->cp[i + 1 + j];
			if (fold && c >= 'A' && c <= 'Z')
				c += 32;
			if (c != (uint32_t)sfx[k][j])
				break;
		}
		if (j == l)
			return i + 1 + l;
	}
	return i;
}

/* \s+(?!\S)|\s+ : a run followed by a non-space leaves its last char to
 * the next word (unless it is the only one). */
static size_t ws_tail(const struct ptext *p, size_t i)
{
	size_t e = run(p, i, c_ws, SIZE_MAX);

	if (e == i)
		return i;
	return e < p->end && e - i >= 2 ? e - 1 : e;
}

/* \s*[\r\n]+ : up to the last newline of the space run. */
static size_t ws_newline(const struct ptext *p, size_t i)
{
	size_t e = run(p, i, c_ws, SIZE_MAX);

	while (e > i && !is_nl(p->cp[e - 1]))
		e--;
	return e;
}

/* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static size_t m_gpt2(const struct rule *r, const struct ptext *p, size_t i)
{
	size_t e, j = p->cp[i] == ' ' && i + 1 < p->end ? i + 1 : i;

	(void)r; /* one shape, no parameters */
	if ((e = contraction(p, i, false)) > i)
		return e;
	if (c_l(p, j))
		return run(p, j, c_l, SIZE_MAX);
	if (c_n(p, j))
		return run(p, j, c_n, SIZE_MAX);
	if (c_other(p, j))
		return run(p, j, c_other, SIZE_MAX);
	return ws_tail(p, i);
}

/* (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max}|
 *  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+        (Llama 3, Qwen2) */
static size_t m_llama3(const struct rule *r, const struct ptext *p, size_t i)
{
	size_t e, j;

	if ((e = contraction(p, i, true)) > i)
		return e;
	if (!is_nl(p->cp[i]) && !c_l(p, i) && !c_n(p, i) && i + 1 < p->end &&
	    c_l(p, i + 1))
		return run(p, i + 1, c_l, SIZE_MAX);
	if (c_l(p, i))
		return run(p, i, c_l, SIZE_MAX);
	if (c_n(p, i))
		return run(p, i, c_n, r->max);
	j = p->cp[i] == ' ' && i + 1 < p->end ? i + 1 : i;
	if (c_other(p, j))
		return run(p, run(p, j, c_other, SIZE_MAX), c_nl, SIZE_MAX);
	if ((e = ws_newline(p, i)) > i)
		return e;
	return ws_tail(p, i);
}

/* Tekken: [^\r\n\p{L}\p{N}]?UP*LO+|[^\r\n\p{L}\p{N}]?UP+LO*|\p{N}|
 *  ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
static size_t tekken_word(const struct ptext *p, size_t k)
{
	size_t u = run(p, k, c_up, SIZE_MAX), l = run(p, u, c_lo, SIZE_MAX);

	if (l > u)
		return l;
	/* UP* gives back characters until LO+ can start (one that is both) */
	for (size_t v = u; v > k; v--)
		if (c_lo(p, v - 1))
			return run(p, v - 1, c_lo, SIZE_MAX);
	return u; /* UP+LO* (k when nothing matched) */
}

static size_t m_tekken(const struct rule *r, const struct ptext *p, size_t i)
{
	size_t e, j;

	(void)r;
	if (!is_nl(p->cp[i]) && !c_l(p, i) && !c_n(p, i) && i + 1 < p->end &&
	    (e = tekken_word(p, i + 1)) > i + 1)
		return e;
	if ((e = tekken_word(p, i)) > i)
		return e;
	if (c_n(p, i))
		return i + 1;
	j = p->cp[i] == ' ' && i + 1 < p->end ? i + 1 : i;
	if (c_other(p, j))
		return run(p, run(p, j, c_other, SIZE_MAX), c_nl_or_slash, SIZE_MAX);
	if ((e = ws_newline(p, i)) > i)
		return e;
	return ws_tail(p, i);
}

/* DeepSeek V3's main rule: [!-/:-@[-`{-~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?
 * [\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
static size_t m_dsv3(const struct rule *r, const struct ptext *p, size_t i)
{
	uint32_t c = p->cp[i];
	size_t e, j;

	(void)r;
	if (c > 0x20 && c < 0x7f && !c_ascii_alpha(p, i) && !c_digit(p, i) &&
	    i + 1 < p->end && c_ascii_alpha(p, i + 1))
		return run(p, i + 1, c_ascii_alpha, SIZE_MAX);
	if (!is_nl(c) && !c_l(p, i) && !c_ps(p, i) && i + 1 < p->end &&
	    c_lm(p, i + 1))
		return run(p, i + 1, c_lm, SIZE_MAX);
	if (c_lm(p, i))
		return run(p, i, c_lm, SIZE_MAX);
	j = c == ' ' && i + 1 < p->end ? i + 1 : i;
	if (c_ps(p, j))
		return run(p, run(p, j, c_ps, SIZE_MAX), c_nl, SIZE_MAX);
	if ((e = ws_newline(p, i)) > i)
		return e;
	return ws_tail(p, i);
}

/* X+, X{1,max}, \s?X+ for a class X */
static size_t m_run(const struct rule *r, const struct ptext *p, size_t i)
{
	if (r->ws_prefix && c_ws(p, i) && i + 1 < p->end && r->cls(p, i + 1))
		return run(p, i + 1, r->cls, r->max);
	return run(p, i, r->cls, r->max);
}

/* [0-9][0-9][0-9] */
static size_t m_digits3(const struct rule *r, const struct ptext *p, size_t i)
{
	(void)r;
	return i + 3 <= p->end && c_digit(p, i) && c_digit(p, i + 1) &&
	       c_digit(p, i + 2) ? i + 3 : i;
}

/* \s+$ has no matcher: split_ws_end cuts the fragment's space tail. */
static size_t m_ws_end(const struct rule *r, const struct ptext *p, size_t i)
{
	(void)r;
	(void)p;
	return i;
}

/* ---- pre-tokenizer table ------------------------------------------------------- */

#define R_GPT2 { .match = m_gpt2 }
#define R_LLAMA3(n, coll) { .match = m_llama3, .max = (n), .collapse = (coll) }
#define R_RUN(c, n, wsp, coll) { .match = m_run, .cls = (c), .max = (n), \
				 .ws_prefix = (wsp), .collapse = (coll) }
#define R_MAX 6

struct pre_def {
	const char *names;    /* "|name|name|" */
	bool ignore_merges;   /* a word that is a token is not merged */
	struct rule rules[R_MAX];
	size_t n_rules;
};

static const struct pre_def pre_defs[] = {
	{ "|gpt-2|mpt|olmo|jais|phi-2|", false, { R_GPT2 }, 1 },
	{ "|llama-bpe|llama3|llama-v3|dbrx|smaug-bpe|falcon3|pixtral|",
	  true, { R_LLAMA3(3, false) }, 1 },
	{ "|chatglm-bpe|glm4|", false, { R_LLAMA3(3, false) }, 1 },
	{ "|qwen2|stablelm2|deepseek-r1-qwen|megrez|", false,
	  { R_LLAMA3(1, false) }, 1 },
	{ "|starcoder|refact|command-r|smollm|codeshell|exaone|", false,
	  { R_RUN(c_n, 1, false, true), R_GPT2 }, 2 },
	{ "|falcon|", false,
	  { R_RUN(c_p_sym, SIZE_MAX, false, true), R_GPT2,
	    { .match = m_digits3 } }, 3 },
	{ "|default|", false,
	  { R_RUN(c_p_sym_nobq, SIZE_MAX, false, true), R_GPT2,
	    R_RUN(c_n, SIZE_MAX, false, true), { .match = m_digits3 } }, 4 },
	{ "|deepseek-llm|", false,
	  { R_RUN(c_nl, 1, false, false),
	    R_RUN(c_dsllm_letter, SIZE_MAX, true, false),
	    R_RUN(c_dsllm_punct, SIZE_MAX, true, false),
	    { .match = m_ws_end },
	    R_RUN(c_cjk, SIZE_MAX, false, false),
	    R_RUN(c_n, SIZE_MAX, false, true) }, 6 },
	{ "|deepseek-coder|", false,
	  { R_RUN(c_nl, 1, false, false), R_RUN(c_l, SIZE_MAX, true, true),
	    R_RUN(c_p, SIZE_MAX, true, true), R_RUN(c_cjk, SIZE_MAX, false, false),
	    R_RUN(c_n, 1, false, true) }, 5 },
	{ "|deepseek-v3|", false,
	  { R_RUN(c_n, 3, false, true), R_RUN(c_cjk_kana, SIZE_MAX, false, false),
	    { .match = m_dsv3 } }, 3 },
	{ "|tekken|", true, { { .match = m_tekken, .collapse = true } }, 1 },
};

int tokenizer__bpe_pre_find(const char *name, size_t len)
{
	char key[72];

	if (len + 2 >= sizeof(key) || memchr(name, '|', len))
		return -1;
	key[0] = '|';
	memcpy(key + 1, name, len);
	key[len + 1] = '|';
	key[len + 2] = 0;
	for (size_t k = 0; k < KVD_ARRAY_SIZE(pre_defs); k++)
		if (strstr(pre_defs[k].names, key))
			return (int)k;
	return -1;
}

/* ---- splitting ------------------------------------------------------------------ */

/* Working buffers of one encode call. */
struct pre_state {
	uint32_t *cp;         /* (n) code points */
	uint32_t *off;        /* (n + 1) byte offset of each code point */
	uint8_t *cat;         /* (n) true classes */
	uint8_t *ccat;        /* (n) collapsed classes */
	size_t n;
	size_t *cut, *cut2;   /* (n + 1) fragment boundaries, in code points */
	size_t n_cut;
};

static void pre_state_free(struct pre_state *s)
{
	free(s->cp);
	free(s->off);
	free(s->cat);
	free(s->ccat);
	free(s->cut);
	free(s->cut2);
}

static int pre_state_fill(struct pre_state *s, const uint8_t *text, size_t len)
{
	size_t n = 0;

	s->cp = malloc((len + 1) * sizeof(*s->cp));
	s->off = malloc((len + 1) * sizeof(*s->off));
	s->cat = malloc(len + 1);
	s->ccat = malloc(len + 1);
	s->cut = malloc((len + 2) * sizeof(*s->cut));
	s->cut2 = malloc((len + 2) * sizeof(*s->cut2));
	if (!s->cp || !s->off || !s->cat || !s->ccat || !s->cut || !s->cut2)
		return -ENOMEM;
	for (size_t i = 0; i < len; n++) {
		uint32_t cp;
		size_t l = tokenizer__utf8_decode(text + i, len - i, &cp);
		s->cp[n] = cp;
		s->off[n] = (uint32_t)i;
		s->cat[n] = ucat_of(cp);
		s->ccat[n] = ucat_collapse(cp, s->cat[n]);
		i += l;
	}
	s->off[n] = (uint32_t)len;
	s->n = n;
	s->cut[0] = 0;
	s->cut[1] = n;
	s->n_cut = n ? 2 : 1;
	return 0;
}

/* Cut every fragment by one rule: matches and the gaps between them. */
static void pre_split(struct pre_state *s, const struct rule *r)
{
	struct ptext p = { .cp = s->cp, .cat = r->collapse ? s->ccat : s->cat };
	size_t n = 0;

	s->cut2[n++] = 0;
	for (size_t f = 0; f + 1 < s->n_cut; f++) {
		size_t a = s->cut[f], b = s->cut[f + 1], gap = a;
		p.end = b;
		if (r->match == m_ws_end) {
			size_t t = b;
			while (t > a && is_ws(p.cat[t - 1]))
				t--;
			if (t > a && t < b)
				s->cut2[n++] = t;
			s->cut2[n++] = b;
			continue;
		}
		for (size_t i = a; i < b;) {
			size_t e = r->match(r, &p, i);
			if (e == i) {
				i++;
				continue;
			}
			if (gap < i)
				s->cut2[n++] = i;
			s->cut2[n++] = e;
			i = gap = e;
		}
		if (gap < b)
			s->cut2[n++] = b;
	}
	size_t *t = s->cut;
	s->cut = s->cut2;
	s->cut2 = t;
	s->n_cut = n;
}

/* ---- encode ----------------------------------------------------------------- */

int tokenizer__bpe_encode(const struct tokenizer *t, const char *text,
			  size_t len, struct ids *out)
{
	const struct pre_def *pd = &pre_defs[t->pre];
	struct merger m = { .t = t, .ops = &bpe_ops };
	struct pre_state s = { 0 };
	uint32_t cp_of[256];
	char *word = NULL;     /* (2 * word bytes) byte-mapped word */
	size_t word_cap = 0;
	int rc;

	if (!len)
		return 0;
	if ((rc = pre_state_fill(&s, (const uint8_t *)text, len)))
		goto out;
	for (size_t k = 0; k < pd->n_rules; k++)
		pre_split(&s, &pd->rules[k]);
	tokenizer__gpt2_byte_map(cp_of);
	for (size_t f = 0; f + 1 < s.n_cut && !rc; f++) {
		size_t i = s.off[s.cut[f]], e = s.off[s.cut[f + 1]], n = 0;
		if (2 * (e - i) > word_cap) {
			word_cap = 2 * (e - i);
			char *w = realloc(word, word_cap);
			if (!w) {
				rc = -ENOMEM;
				break;
			}
			word = w;
		}
		for (size_t k = i; k < e; k++)
			n += utf8_encode(cp_of[(uint8_t)text[k]], word + n);
		int32_t id;
		if (pd->ignore_merges && (id = tokenizer__vocab_find(t, word, n)) >= 0)
			rc = tokenizer__ids_push(out, id);
		else
			rc = tokenizer__merger_encode(&m, word, n, out);
	}
out:
	free(word);
	pre_state_free(&s);
	tokenizer__merger_deinit(&m);
	return rc;
}
