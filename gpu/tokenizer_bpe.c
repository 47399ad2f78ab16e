/* tokenizer_bpe.c - byte-level BPE encode (tokenizer.ggml.model = gpt2).
 *
 * A hand-written scanner approximates the GPT-2 regex (or the Llama-3
 * one, or SmolLM's single-digit variant, by tokenizer.ggml.pre) to split
 * the text into words: contractions, letter runs with one optional
 * leading space, digit runs, punctuation runs, whitespace that leaves its
 * last space to the next word. Unicode classes are an approximation:
 * ASCII exactly, a table of non-ASCII spaces, digits and
 * punctuation/symbol ranges, every other code point a letter. Each word's
 * bytes are mapped through GPT-2's byte-to-unicode table and merged by
 * the engine in tokenizer_merge.c, keyed by (lowest merge rank, then
 * leftmost).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "conf/util.h"
#include "gpu/tokenizer_int.h"

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
	rank = *tokenizer__strmap_slot(&t->mmap, t->arena, t->merge, m->key,
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

/* ---- pre-tokenizer ---------------------------------------------------------- */

enum cclass { C_L, C_N, C_S, C_P };

static bool in_ranges(uint32_t cp, const uint32_t (*r)[2], size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (cp >= r[i][0] && cp <= r[i][1])
			return true;
	return false;
}

/* Approximate Unicode general category: letter, number, space, other. */
static enum cclass cp_class(uint32_t cp)
{
	static const uint32_t space[][2] = {
		{ 0x85, 0x85 }, { 0xa0, 0xa0 }, { 0x1680, 0x1680 },
		{ 0x2000, 0x200a }, { 0x2028, 0x2029 }, { 0x202f, 0x202f },
		{ 0x205f, 0x205f }, { 0x3000, 0x3000 },
	};
	static const uint32_t number[][2] = {
		{ 0xb2, 0xb3 }, { 0xb9, 0xb9 }, { 0xbc, 0xbe }, { 0x660, 0x669 },
		{ 0x6f0, 0x6f9 }, { 0x966, 0x96f }, { 0x2070, 0x2070 },
		{ 0x2074, 0x2079 }, { 0x2080, 0x2089 }, { 0x2150, 0x2189 },
		{ 0x2460, 0x249b }, { 0x3007, 0x3007 }, { 0xff10, 0xff19 },
	};
	static const uint32_t other[][2] = {
		{ 0x80, 0xa9 }, { 0xab, 0xb4 }, { 0xb6, 0xb9 }, { 0xbb, 0xbf },
		{ 0xd7, 0xd7 }, { 0xf7, 0xf7 }, { 0x2010, 0x2027 },
		{ 0x2030, 0x205e }, { 0x20a0, 0x20cf }, { 0x2100, 0x214f },
		{ 0x2190, 0x245f }, { 0x2500, 0x2bff }, { 0x2e00, 0x2e7f },
		{ 0x3001, 0x3006 }, { 0x3008, 0x3020 }, { 0x30fb, 0x30fb },
		{ 0xe000, 0xf8ff }, { 0xfe30, 0xfe4f }, { 0xff01, 0xff0f },
		{ 0xff1a, 0xff20 }, { 0xff3b, 0xff40 }, { 0xff5b, 0xff65 },
		{ 0x1f000, 0x1faff },
	};

	if (cp < 0x80) {
		if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z')
			return C_L;
		if (cp >= '0' && cp <= '9')
			return C_N;
		if (cp == ' ' || (cp >= '\t' && cp <= '\r'))
			return C_S;
		return C_P;
	}
	if (cp == UINT32_MAX)
		return C_P;
	if (in_ranges(cp, space, KVD_ARRAY_SIZE(space)))
		return C_S;
	if (in_ranges(cp, number, KVD_ARRAY_SIZE(number)))
		return C_N;
	if (in_ranges(cp, other, KVD_ARRAY_SIZE(other)))
		return C_P;
	return C_L;
}

struct scan {
	const uint8_t *s;
	size_t n;
};

static enum cclass scan_class(const struct scan *sc, size_t i, size_t *len,
			      uint32_t *cpo)
{
	uint32_t cp;

	*len = tokenizer__utf8_decode(sc->s + i, sc->n - i, &cp);
	if (cpo)
		*cpo = cp;
	return cp_class(cp);
}

/* End of the run of class c starting at i (at most max chars). */
static size_t scan_run(const struct scan *sc, size_t i, enum cclass c,
		       size_t max)
{
	size_t l, k = 0;

	while (i < sc->n && k < max && scan_class(sc, i, &l, NULL) == c) {
		i += l;
		k++;
	}
	return i;
}

static size_t scan_contraction(const struct scan *sc, size_t i, bool fold)
{
	static const char *const sfx[] = { "s", "t", "re", "ve", "m", "ll", "d" };

	if (sc->s[i] != '\'')
		return 0;
	for (size_t k = 0; k < KVD_ARRAY_SIZE(sfx); k++) {
		size_t l = strlen(sfx[k]);
		if (i + 1 + l > sc->n)
			continue;
		bool ok = true;
		for (size_t j = 0; j < l && ok; j++) {
			char c = (char)sc->s[i + 1 + j];
			if (fold && c >= 'A' && c <= 'Z')
				c = (char)(c + 32);
			ok = c == sfx[k][j];
		}
		if (ok)
			return i + 1 + l;
	}
	return 0;
}

static bool is_nl(uint32_t cp)
{
	return cp == '\n' || cp == '\r';
}

/* Whitespace rules: \s+(?!\S) then \s+, with Llama-3's \s*[\r\n]+ first.
 * A run followed by a non-space leaves its last char to the next word. */
static size_t scan_space(const struct scan *sc, size_t i, enum pre_kind pre)
{
	size_t e = i, last = i, l, last_nl = 0, k = 0;
	uint32_t cp;

	while (e < sc->n && scan_class(sc, e, &l, &cp) == C_S) {
		if (is_nl(cp))
			last_nl = e + l;
		last = e;
		e += l;
		k++;
	}
	if (pre == PRE_LLAMA3 && last_nl)
		return last_nl;
	if (e == sc->n || k < 2)
		return e;
	if (pre == PRE_SMOLLM && scan_class(sc, e, &l, NULL) == C_N)
		return e; /* digits are split off first: the run ends here */
	return last;
}

/* End of the pre-tokenizer word starting at i. */
static size_t scan_word(const struct scan *sc, size_t i, enum pre_kind pre)
{
	size_t l, l2, j, e;
	uint32_t cp;
	enum cclass c = scan_class(sc, i, &l, &cp), c2;

	if ((e = scan_contraction(sc, i, pre == PRE_LLAMA3)))
		return e;
	if (pre == PRE_LLAMA3) {
		if (c == C_L)
			return scan_run(sc, i, C_L, SIZE_MAX);
		if ((c == C_S || c == C_P) && !is_nl(cp) && i + l < sc->n &&
		    scan_class(sc, i + l, &l2, NULL) == C_L)
			return scan_run(sc, i + l, C_L, SIZE_MAX);
		if (c == C_N)
			return scan_run(sc, i, C_N, 3);
		j = sc->s[i] == ' ' ? i + 1 : i;
		if (j < sc->n && scan_class(sc, j, &l2, NULL) == C_P) {
			e = scan_run(sc, j, C_P, SIZE_MAX);
			while (e < sc->n && (sc->s[e] == '\n' || sc->s[e] == '\r'))
				e++;
			return e;
		}
		if (c == C_S)
			return scan_space(sc, i, pre);
		return i + l;
	}
	/* GPT-2 (and SmolLM, whose digits stand alone) */
	if (pre == PRE_SMOLLM && c == C_N)
		return i + l;
	j = sc->s[i] == ' ' ? i + 1 : i;
	if (j < sc->n) {
		c2 = scan_class(sc, j, &l2, NULL);
		if (c2 == C_L)
			return scan_run(sc, j, C_L, SIZE_MAX);
		if (c2 == C_N && pre != PRE_SMOLLM)
			return scan_run(sc, j, C_N, SIZE_MAX);
		if (c2 == C_P)
			return scan_run(sc, j, C_P, SIZE_MAX);
	}
	if (c == C_S)
		return scan_space(sc, i, pre);
	return i + l;
}

/* ---- encode ----------------------------------------------------------------- */

int tokenizer__bpe_encode(const struct tokenizer *t, const char *text,
			  size_t len, struct ids *out)
{
	struct merger m = { .t = t, .ops = &bpe_ops };
	struct scan sc = { .s = (const uint8_t *)text, .n = len };
	uint32_t cp_of[256];
	char *word = NULL;     /* (2 * word bytes) byte-mapped word */
	size_t word_cap = 0;
	int rc = 0;

	tokenizer__gpt2_byte_map(cp_of);
	for (size_t i = 0; i < len && !rc;) {
		size_t e = scan_word(&sc, i, t->pre), n = 0;
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
		rc = tokenizer__merger_encode(&m, word, n, out);
		i = e;
	}
	free(word);
	tokenizer__merger_deinit(&m);
	return rc;
}
