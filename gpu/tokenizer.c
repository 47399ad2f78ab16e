/* tokenizer.c - SentencePiece-style and byte-level BPE tokenizers from GGUF.
 *
 * Load. Every token text is copied into one arena and indexed by an
 * open-addressing hash map (XXH3 of the bytes -> id; a later duplicate
 * wins, as in llama.cpp). For each token we also precompute its decoded
 * bytes (its "piece"), so decoding is a table lookup. BPE merges
 * ("left right") get a second map from text to rank.
 *
 * SentencePiece encode (llama.cpp / llama2.c approach). The text gets the
 * dummy-prefix space, spaces become U+2581, and it is split into UTF-8
 * characters, each a symbol in a doubly linked list. Every adjacent pair
 * whose concatenation is a vocabulary entry goes into a max-heap keyed by
 * (score, then leftmost). Popping the best pair merges it if both sides
 * are still what they were when the pair was pushed (their lengths still
 * add up), then the new symbol's pairs with its neighbours are pushed.
 * That is O(n log n) in the prompt length. Symbols that are not in the
 * vocabulary at the end fall back to <0xNN> byte tokens (or <unk>).
 *
 * BPE encode. A hand-written scanner approximates the GPT-2 regex (or the
 * Llama-3 one, or SmolLM's single-digit variant, by tokenizer.ggml.pre)
 * to split the text into words: contractions, letter runs with one
 * optional leading space, digit runs, punctuation runs, whitespace that
 * leaves its last space to the next word. Unicode classes are an
 * approximation: ASCII exactly, a table of non-ASCII spaces, digits and
 * punctuation/symbol ranges, every other code point a letter. Each word's
 * bytes are mapped through GPT-2's byte-to-unicode table and merged with
 * the same heap as above, keyed by (lowest merge rank, then leftmost).
 *
 * Decode. struct detok runs a strict UTF-8 state machine over the pieces'
 * bytes: complete characters are emitted, an incomplete tail is held for
 * the next token, impossible bytes become U+FFFD. So a stream chunk never
 * ends inside a character and never carries invalid UTF-8.
 */
#include "gpu/tokenizer.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "conf/util.h"

#define SP_SPACE "\xe2\x96\x81" /* U+2581 LOWER ONE EIGHTH BLOCK */
#define UTF8_REPLACEMENT "\xef\xbf\xbd"
#define TOK_MAX_TEXT (256u << 20) /* refuse to encode more than 256 MiB */

enum pre_kind { PRE_GPT2 = 0, PRE_LLAMA3, PRE_SMOLLM };

struct tstr {
	uint32_t off;  /* into the arena */
	uint32_t len;
};

struct strmap {
	uint32_t *slot;   /* (mask + 1) index + 1; 0 = empty */
	uint32_t mask;
};

struct tokenizer {
	enum tokenizer_kind kind;
	enum pre_kind pre;
	uint32_t n_vocab;
	char *arena;           /* token texts, merge texts, pieces */
	size_t arena_len, arena_cap;
	struct tstr *text;     /* (n_vocab) vocabulary entries */
	struct tstr *piece;    /* (n_vocab) decoded bytes */
	float *score;          /* (n_vocab) SentencePiece scores */
	uint8_t *type;         /* (n_vocab) TOKEN_TYPE_* */
	struct strmap vmap;    /* text -> id */
	uint32_t n_merges;
	struct tstr *merge;    /* (n_merges) "left right" */
	struct strmap mmap;    /* merge text -> rank */
	int32_t byte_tok[256]; /* SPM byte fallback: id of <0xNN>, or -1 */
	int32_t bos, eos, unk;
	bool add_bos;
	bool add_space_prefix;
	size_t max_piece;
};

/* ---- small helpers ------------------------------------------------------- */


static int arena_put(struct tokenizer *t, const void *p, size_t n,
		     struct tstr *out)
{
	if (n > UINT32_MAX || t->arena_len + n > UINT32_MAX)
		return -E2BIG;
	if (t->arena_len + n > t->arena_cap) {
		size_t cap = t->arena_cap ? t->arena_cap : 1 << 16;
		while (cap < t->arena_len + n)
			cap *= 2;
		char *a = realloc(t->arena, cap);
		if (!a)
			return -ENOMEM;
		t->arena = a;
		t->arena_cap = cap;
	}
	if (n)
		memcpy(t->arena + t->arena_len, p, n);
	out->off = (uint32_t)t->arena_len;
	out->len = (uint32_t)n;
	t->arena_len += n;
	return 0;
}

static int strmap_init(struct strmap *m, uint32_t n)
{
	uint64_t size = 64;

	while (size < 2ull * n)
		size *= 2;
	m->slot = calloc(size, sizeof(*m->slot));
	m->mask = (uint32_t)(size - 1);
	return m->slot ? 0 : -ENOMEM;
}

/* The slot holding key (p, n), or the empty slot where it would go. */
static uint32_t *strmap_slot(const struct strmap *m, const char *arena,
			     const struct tstr *keys, const char *p, size_t n)
{
	for (uint64_t h = XXH3_64bits(p, n);; h++) {
		uint32_t *s = &m->slot[h & m->mask];
		if (!*s)
			return s;
		const struct tstr *k = &keys[*s - 1];
		if (k->len == n && !memcmp(arena + k->off, p, n))
			return s;
	}
}

static int32_t vocab_find(const struct tokenizer *t, const char *p, size_t n)
{
	uint32_t s = *strmap_slot(&t->vmap, t->arena, t->text, p, n);

	return s ? (int32_t)(s - 1) : -1;
}

/* Length of the UTF-8 sequence a lead byte announces (1 for anything
 * that is not a lead byte), as llama.cpp splits text into symbols. */
static size_t utf8_len(uint8_t c)
{
	static const uint8_t lens[16] = { 1, 1, 1, 1, 1, 1, 1, 1,
					  1, 1, 1, 1, 2, 2, 3, 4 };
	return lens[c >> 4];
}

/* Strict decode of one code point at s[0..n): returns its length and the
 * code point, or length 1 and UINT32_MAX for an invalid sequence. */
static size_t utf8_decode(const uint8_t *s, size_t n, uint32_t *cp)
{
	uint8_t c = s[0];
	size_t len;
	uint32_t v, min;

	if (c < 0x80) {
		*cp = c;
		return 1;
	}
	if (c >= 0xc2 && c <= 0xdf) { len = 2; v = c & 0x1f; min = 0x80; }
	else if (c >= 0xe0 && c <= 0xef) { len = 3; v = c & 0x0f; min = 0x800; }
	else if (c >= 0xf0 && c <= 0xf4) { len = 4; v = c & 0x07; min = 0x10000; }
	else goto bad;
	if (len > n)
		goto bad;
	for (size_t i = 1; i < len; i++) {
		if ((s[i] & 0xc0) != 0x80)
			goto bad;
		v = (v << 6) | (s[i] & 0x3f);
	}
	if (v < min || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff))
		goto bad;
	*cp = v;
	return len;
bad:
	*cp = UINT32_MAX;
	return 1;
}

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

bool tokenizer_utf8_valid(const char *buf, size_t len)
{
	const uint8_t *s = (const uint8_t *)buf;
	uint32_t cp;

	for (size_t i = 0; i < len;) {
		i += utf8_decode(s + i, len - i, &cp);
		if (cp == UINT32_MAX)
			return false;
	}
	return true;
}

/* GPT-2's byte <-> char map: printable Latin-1 bytes stand for
 * themselves, the other 68 bytes for U+0100.. in byte order. */
static bool gpt2_byte_printable(unsigned b)
{
	return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) ||
	       (b >= 174 && b <= 255);
}

static void gpt2_byte_map(uint32_t cp_of[256])
{
	uint32_t n = 0;

	for (unsigned b = 0; b < 256; b++)
		cp_of[b] = gpt2_byte_printable(b) ? b : 256 + n++;
}

/* ---- load ------------------------------------------------------------------ */

static int tok_u32_key(const struct gguf_file *f, const char *key,
		       int32_t *out, uint32_t n_vocab, struct gguf_error *err)
{
	uint32_t v;
	int rc = gguf_get_u32(f, key, &v);
	const struct gguf_kv *kv = gguf_find(f, key);

	if (rc == -ENOENT)
		return 0;
	if (rc)
		return gguf_error_set(err, GGUF_E_TYPE, kv->offset,
				"key '%s' is not an unsigned integer (offset %llu)",
				key, (unsigned long long)kv->offset);
	if (v >= n_vocab)
		return gguf_error_set(err, GGUF_E_MALFORMED, kv->offset,
				"key '%s' = %u is not below the vocabulary size %u (offset %llu)",
				key, v, n_vocab, (unsigned long long)kv->offset);
	*out = (int32_t)v;
	return 0;
}

static int tok_bool_key(const struct gguf_file *f, const char *key, bool *out,
			struct gguf_error *err)
{
	int rc = gguf_get_bool(f, key, out);
	const struct gguf_kv *kv = gguf_find(f, key);

	if (rc == -ENOENT)
		return 0;
	if (rc)
		return gguf_error_set(err, GGUF_E_TYPE, kv->offset,
				"key '%s' is not a bool (offset %llu)", key,
				(unsigned long long)kv->offset);
	return 0;
}

/* An optional numeric array with exactly n_vocab entries. */
static const struct gguf_kv *tok_arr(const struct gguf_file *f, const char *key,
				     uint32_t n_vocab, bool want_float, int *rc,
				     struct gguf_error *err)
{
	const struct gguf_kv *kv = gguf_find(f, key);

	*rc = 0;
	if (!kv)
		return NULL;
	bool is_float = kv->type == GGUF_VT_ARRAY &&
			(kv->arr_type == GGUF_VT_FLOAT32 || kv->arr_type == GGUF_VT_FLOAT64);
	bool is_int = kv->type == GGUF_VT_ARRAY && gguf_vtype_size(kv->arr_type) &&
		      !is_float && kv->arr_type != GGUF_VT_BOOL;
	if (want_float ? !is_float : !is_int) {
		*rc = gguf_error_set(err, GGUF_E_TYPE, kv->offset,
			       "key '%s' is not an array of %s (offset %llu)", key,
			       want_float ? "floats" : "integers",
			       (unsigned long long)kv->offset);
		return NULL;
	}
	if (kv->arr_len != n_vocab) {
		*rc = gguf_error_set(err, GGUF_E_MALFORMED, kv->offset,
			       "key '%s' has %llu entries for %u tokens (offset %llu)",
			       key, (unsigned long long)kv->arr_len, n_vocab,
			       (unsigned long long)kv->offset);
		return NULL;
	}
	return kv;
}

static bool parse_byte_token(const char *s, size_t n, uint8_t *b)
{
	unsigned v = 0;

	if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>')
		return false;
	for (int i = 3; i < 5; i++) {
		char c = s[i];
		v <<= 4;
		if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
		else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
		else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
		else return false;
	}
	*b = (uint8_t)v;
	return true;
}

/* Decoded bytes of every token, appended to the arena. */
static int tok_build_pieces(struct tokenizer *t)
{
	uint32_t cp_of[256];
	int16_t byte_of[324]; /* code point -> byte for the BPE map, or -1 */
	char buf[4];
	int rc;

	gpt2_byte_map(cp_of);
	memset(byte_of, 0xff, sizeof(byte_of));
	for (unsigned b = 0; b < 256; b++)
		byte_of[cp_of[b]] = (int16_t)b;
	for (uint32_t id = 0; id < t->n_vocab; id++) {
		struct tstr tx = t->text[id];
		const char *s;
		size_t start = t->arena_len;
		uint8_t b;

		rc = 0;
		switch (t->type[id]) {
		case TOKEN_TYPE_CONTROL:
		case TOKEN_TYPE_UNUSED:
			break;
		case TOKEN_TYPE_UNKNOWN:
			rc = arena_put(t, " \xe2\x81\x87 ", 5, &t->piece[id]);
			break;
		case TOKEN_TYPE_BYTE:
			s = t->arena + tx.off;
			if (parse_byte_token(s, tx.len, &b)) {
				rc = arena_put(t, &b, 1, &t->piece[id]);
				break;
			}
			/* not <0xNN>: decode it like a normal piece */
			__attribute__((fallthrough));
		default:
			if (t->kind == TOKENIZER_BPE &&
			    t->type[id] != TOKEN_TYPE_USER_DEFINED) {
				for (uint32_t i = 0; i < tx.len && !rc;) {
					uint32_t cp;
					struct tstr dummy;
					s = t->arena + tx.off; /* arena may move */
					size_t l = utf8_decode((const uint8_t *)s + i,
							       tx.len - i, &cp);
					if (cp < KVD_ARRAY_SIZE(byte_of) && byte_of[cp] >= 0) {
						b = (uint8_t)byte_of[cp];
						rc = arena_put(t, &b, 1, &dummy);
					} else {
						memcpy(buf, s + i, l);
						rc = arena_put(t, buf, l, &dummy);
					}
					i += (uint32_t)l;
				}
			} else {
				for (uint32_t i = 0; i < tx.len && !rc;) {
					struct tstr dummy;
					s = t->arena + tx.off;
					if (t->kind == TOKENIZER_SPM && tx.len - i >= 3 &&
					    !memcmp(s + i, SP_SPACE, 3)) {
						rc = arena_put(t, " ", 1, &dummy);
						i += 3;
					} else {
						char c = s[i]; /* arena_put may move s */
						rc = arena_put(t, &c, 1, &dummy);
						i++;
					}
				}
			}
			break;
		}
		if (rc)
			return rc;
		t->piece[id].off = (uint32_t)start;
		t->piece[id].len = (uint32_t)(t->arena_len - start);
		t->max_piece = KVD_MAX(t->max_piece, t->piece[id].len);
	}
	return 0;
}

static int tok_load_merges(struct tokenizer *t, const struct gguf_file *f,
			   struct gguf_error *err)
{
	const struct gguf_kv *kv = gguf_find(f, "tokenizer.ggml.merges");
	struct gguf_str s;
	int rc;

	if (!kv)
		return gguf_error_set(err, GGUF_E_MISSING, 0,
				"key 'tokenizer.ggml.merges' is missing (required by a gpt2 tokenizer)");
	if (kv->type != GGUF_VT_ARRAY || kv->arr_type != GGUF_VT_STRING)
		return gguf_error_set(err, GGUF_E_TYPE, kv->offset,
				"key 'tokenizer.ggml.merges' is not an array of strings (offset %llu)",
				(unsigned long long)kv->offset);
	if (kv->arr_len > INT32_MAX)
		return gguf_error_set(err, GGUF_E_MALFORMED, kv->offset, "too many merges");
	t->n_merges = (uint32_t)kv->arr_len;
	t->merge = calloc(t->n_merges ? t->n_merges : 1, sizeof(*t->merge));
	if (!t->merge || strmap_init(&t->mmap, t->n_merges))
		return -ENOMEM;
	for (uint32_t i = 0; i < t->n_merges; i++) {
		gguf_arr_str(f, kv, i, &s);
		const char *sp = s.len ? memchr(s.ptr, ' ', s.len) : NULL;
		if (!sp || sp == s.ptr || sp == s.ptr + s.len - 1)
			return gguf_error_set(err, GGUF_E_MALFORMED, kv->offset,
					"merge %u is not 'left right' (key 'tokenizer.ggml.merges', offset %llu)",
					i, (unsigned long long)kv->offset);
		if ((rc = arena_put(t, s.ptr, s.len, &t->merge[i])))
			return rc;
		uint32_t *slot = strmap_slot(&t->mmap, t->arena, t->merge,
					     t->arena + t->merge[i].off, s.len);
		if (!*slot) /* the first (lowest) rank of a duplicate wins */
			*slot = i + 1;
	}
	return 0;
}

static enum pre_kind tok_pre_kind(const struct gguf_file *f)
{
	struct gguf_str s;
	static const char *const llama3[] = { "llama-bpe", "llama3", "llama-v3",
					      "smaug-bpe", "dbrx", "tekken" };

	if (gguf_get_str(f, "tokenizer.ggml.pre", &s))
		return PRE_GPT2;
	if (gguf_str_eq(s, "smollm"))
		return PRE_SMOLLM;
	for (size_t i = 0; i < KVD_ARRAY_SIZE(llama3); i++)
		if (gguf_str_eq(s, llama3[i]))
			return PRE_LLAMA3;
	return PRE_GPT2;
}

static int tok_load(struct tokenizer *t, const struct gguf_file *f,
		    struct gguf_error *err)
{
	const struct gguf_kv *kv, *sc, *ty;
	struct gguf_str model, s;
	int rc;

	rc = gguf_get_str(f, "tokenizer.ggml.model", &model);
	kv = gguf_find(f, "tokenizer.ggml.model");
	if (rc == -ENOENT)
		return gguf_error_set(err, GGUF_E_MISSING, 0,
				"key 'tokenizer.ggml.model' is missing: the file has no tokenizer");
	if (rc)
		return gguf_error_set(err, GGUF_E_TYPE, kv->offset,
				"key 'tokenizer.ggml.model' is not a string (offset %llu)",
				(unsigned long long)kv->offset);
	if (gguf_str_eq(model, "llama")) {
		t->kind = TOKENIZER_SPM;
	} else if (gguf_str_eq(model, "gpt2")) {
		t->kind = TOKENIZER_BPE;
	} else {
		char m[48];
		snprintf(m, sizeof(m), "%.*s", (int)KVD_MIN(model.len, 40), model.ptr);
		return gguf_error_set(err, GGUF_E_UNSUPPORTED, kv->offset,
				"tokenizer model '%s' is not supported (llama, gpt2) (offset %llu)",
				m, (unsigned long long)kv->offset);
	}
	kv = gguf_find(f, "tokenizer.ggml.tokens");
	if (!kv)
		return gguf_error_set(err, GGUF_E_MISSING, 0,
				"key 'tokenizer.ggml.tokens' is missing");
	if (kv->type != GGUF_VT_ARRAY || kv->arr_type != GGUF_VT_STRING)
		return gguf_error_set(err, GGUF_E_TYPE, kv->offset,
				"key 'tokenizer.ggml.tokens' is not an array of strings (offset %llu)",
				(unsigned long long)kv->offset);
	if (kv->arr_len == 0 || kv->arr_len > (1u << 24))
		return gguf_error_set(err, GGUF_E_MALFORMED, kv->offset,
				"tokenizer.ggml.tokens has %llu tokens (offset %llu)",
				(unsigned long long)kv->arr_len,
				(unsigned long long)kv->offset);
	t->n_vocab = (uint32_t)kv->arr_len;
	if (!(sc = tok_arr(f, "tokenizer.ggml.scores", t->n_vocab, true, &rc, err)) && rc)
		return rc;
	if (!(ty = tok_arr(f, "tokenizer.ggml.token_type", t->n_vocab, false, &rc, err)) && rc)
		return rc;

	t->text = calloc(t->n_vocab, sizeof(*t->text));
	t->piece = calloc(t->n_vocab, sizeof(*t->piece));
	t->score = calloc(t->n_vocab, sizeof(*t->score));
	t->type = calloc(t->n_vocab, sizeof(*t->type));
	if (!t->text || !t->piece || !t->score || !t->type ||
	    strmap_init(&t->vmap, t->n_vocab))
		return -ENOMEM;
	for (uint32_t id = 0; id < t->n_vocab; id++) {
		gguf_arr_str(f, kv, id, &s);
		if ((rc = arena_put(t, s.ptr, s.len, &t->text[id])))
			return rc;
		uint32_t *slot = strmap_slot(&t->vmap, t->arena, t->text,
					     t->arena + t->text[id].off, s.len);
		*slot = id + 1; /* a later duplicate wins, as in llama.cpp */
		double d = 0;
		int64_t v = TOKEN_TYPE_NORMAL;
		if (sc)
			gguf_arr_f64(sc, id, &d);
		if (ty)
			gguf_arr_i64(ty, id, &v);
		t->score[id] = (float)d;
		t->type[id] = (v >= 0 && v <= TOKEN_TYPE_BYTE) ? (uint8_t)v
							      : TOKEN_TYPE_NORMAL;
	}

	/* Specials and flags. */
	t->bos = t->kind == TOKENIZER_SPM ? 1 : -1;
	t->eos = t->kind == TOKENIZER_SPM ? 2 : -1;
	t->unk = t->kind == TOKENIZER_SPM ? 0 : -1;
	if (t->kind == TOKENIZER_SPM && t->n_vocab < 3)
		t->bos = t->eos = t->unk = -1;
	t->add_bos = t->kind == TOKENIZER_SPM;
	t->add_space_prefix = t->kind == TOKENIZER_SPM;
	if ((rc = tok_u32_key(f, "tokenizer.ggml.bos_token_id", &t->bos, t->n_vocab, err)) ||
	    (rc = tok_u32_key(f, "tokenizer.ggml.eos_token_id", &t->eos, t->n_vocab, err)) ||
	    (rc = tok_u32_key(f, "tokenizer.ggml.unknown_token_id", &t->unk, t->n_vocab, err)) ||
	    (rc = tok_bool_key(f, "tokenizer.ggml.add_bos_token", &t->add_bos, err)) ||
	    (rc = tok_bool_key(f, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix, err)))
		return rc;
	if (t->bos < 0)
		t->add_bos = false;
	/* Without a token_type array, infer what decoding needs. */
	if (!ty) {
		for (uint32_t id = 0; id < t->n_vocab; id++) {
			uint8_t b;
			if (t->kind == TOKENIZER_SPM &&
			    parse_byte_token(t->arena + t->text[id].off, t->text[id].len, &b))
				t->type[id] = TOKEN_TYPE_BYTE;
		}
		if (t->bos >= 0) t->type[t->bos] = TOKEN_TYPE_CONTROL;
		if (t->eos >= 0) t->type[t->eos] = TOKEN_TYPE_CONTROL;
		if (t->unk >= 0 && t->kind == TOKENIZER_SPM)
			t->type[t->unk] = TOKEN_TYPE_UNKNOWN;
	}

	/* SentencePiece byte fallback: <0xNN>, else the raw byte, else unk. */
	for (unsigned b = 0; b < 256; b++) {
		char name[8];
		uint8_t raw = (uint8_t)b;
		snprintf(name, sizeof(name), "<0x%02X>", b);
		t->byte_tok[b] = vocab_find(t, name, 6);
		if (t->byte_tok[b] < 0)
			t->byte_tok[b] = vocab_find(t, (const char *)&raw, 1);
		if (t->byte_tok[b] < 0)
			t->byte_tok[b] = t->unk;
	}
	if (t->kind == TOKENIZER_BPE) {
		t->pre = tok_pre_kind(f);
		if ((rc = tok_load_merges(t, f, err)))
			return rc;
	}
	return tok_build_pieces(t);
}

void tokenizer_free(struct tokenizer *t)
{
	if (!t)
		return;
	free(t->arena);
	free(t->text);
	free(t->piece);
	free(t->score);
	free(t->type);
	free(t->vmap.slot);
	free(t->merge);
	free(t->mmap.slot);
	free(t);
}

static void tokenizer_freep(struct tokenizer **t)
{
	tokenizer_free(*t);
}

int tokenizer_new(struct tokenizer **out, const struct gguf_file *f,
		  struct gguf_error *err)
{
	_cleanup_(tokenizer_freep) struct tokenizer *t = NULL;
	int rc;

	if (err)
		*err = (struct gguf_error){ 0 };
	t = calloc(1, sizeof(*t));
	if (!t)
		return gguf_error_set(err, -ENOMEM, 0, "out of memory");
	rc = tok_load(t, f, err);
	if (rc < 0 && err && !err->code)
		gguf_error_set(err, rc, 0, "tokenizer: %s", strerror(-rc));
	if (rc)
		return rc;
	*out = kvd_steal(&t);
	return 0;
}

enum tokenizer_kind tokenizer_kind(const struct tokenizer *t) { return t->kind; }
uint32_t tokenizer_n_vocab(const struct tokenizer *t) { return t->n_vocab; }
int32_t tokenizer_bos(const struct tokenizer *t) { return t->bos; }
int32_t tokenizer_eos(const struct tokenizer *t) { return t->eos; }
int32_t tokenizer_unk(const struct tokenizer *t) { return t->unk; }
bool tokenizer_add_bos(const struct tokenizer *t) { return t->add_bos; }

enum tokenizer_type tokenizer_token_type(const struct tokenizer *t, int32_t id)
{
	if (id < 0 || (uint32_t)id >= t->n_vocab)
		return TOKEN_TYPE_UNDEFINED;
	return t->type[id];
}

int tokenizer_token_text(const struct tokenizer *t, int32_t id,
			 const char **ptr, size_t *len)
{
	if (id < 0 || (uint32_t)id >= t->n_vocab)
		return -ERANGE;
	*ptr = t->arena + t->text[id].off;
	*len = t->text[id].len;
	return 0;
}

int tokenizer_piece(const struct tokenizer *t, int32_t id, const char **ptr,
		    size_t *len)
{
	if (id < 0 || (uint32_t)id >= t->n_vocab)
		return -ERANGE;
	*ptr = t->arena + t->piece[id].off;
	*len = t->piece[id].len;
	return 0;
}

/* ---- output vector ----------------------------------------------------------- */

struct ids {
	int32_t *v;     /* (cap) */
	size_t n, cap;
};

static int ids_push(struct ids *o, int32_t id)
{
	if (o->n == o->cap) {
		size_t cap = o->cap ? o->cap * 2 : 64;
		int32_t *v = realloc(o->v, cap * sizeof(*v));
		if (!v)
			return -ENOMEM;
		o->v = v;
		o->cap = cap;
	}
	o->v[o->n++] = id;
	return 0;
}

/* ---- merge engine (shared by SPM and BPE) ------------------------------------ */

struct sym {
	int32_t prev, next;   /* neighbours in the list, -1 at the ends */
	uint32_t off;         /* into the symbol text */
	uint32_t n;           /* bytes; 0 once merged into its left neighbour */
};

struct pair {
	double prio;          /* higher first: SPM score, or -BPE rank */
	int32_t left, right;
	uint32_t size;        /* left.n + right.n when pushed */
};

struct heap {
	struct pair *v;       /* (cap) binary max-heap on (prio, -left) */
	size_t n, cap;
};

static bool pair_before(const struct pair *a, const struct pair *b)
{
	return a->prio > b->prio || (a->prio == b->prio && a->left < b->left);
}

static int heap_push(struct heap *h, struct pair p)
{
	if (h->n == h->cap) {
		size_t cap = h->cap ? h->cap * 2 : 64;
		struct pair *v = realloc(h->v, cap * sizeof(*v));
		if (!v)
			return -ENOMEM;
		h->v = v;
		h->cap = cap;
	}
	size_t i = h->n++;
	while (i > 0) {
		size_t up = (i - 1) / 2;
		if (!pair_before(&p, &h->v[up]))
			break;
		h->v[i] = h->v[up];
		i = up;
	}
	h->v[i] = p;
	return 0;
}

static struct pair heap_pop(struct heap *h)
{
	struct pair top = h->v[0], last = h->v[--h->n];
	size_t i = 0;

	for (;;) {
		size_t c = 2 * i + 1;
		if (c >= h->n)
			break;
		if (c + 1 < h->n && pair_before(&h->v[c + 1], &h->v[c]))
			c++;
		if (!pair_before(&h->v[c], &last))
			break;
		h->v[i] = h->v[c];
		i = c;
	}
	if (h->n)
		h->v[i] = last;
	return top;
}

/* One merge session over a symbol text (normalized prompt, or one mapped
 * BPE word). */
struct merger {
	const struct tokenizer *t;
	const char *s;        /* symbol text */
	struct sym *sym;      /* (n_sym) */
	size_t n_sym, cap_sym;
	struct heap heap;
	char *key;            /* (key_cap) BPE "left right" scratch */
	size_t key_cap;
};

static void merger_deinit(struct merger *m)
{
	free(m->sym);
	free(m->heap.v);
	free(m->key);
}

/* Split s[0..n) into symbols: one UTF-8 character each (llama.cpp's lead
 * byte rule, clipped at the end). */
static int merger_split(struct merger *m, const char *s, size_t n)
{
	m->s = s;
	m->n_sym = 0;
	m->heap.n = 0;
	if (n > m->cap_sym) {
		struct sym *v = realloc(m->sym, n * sizeof(*v));
		if (!v)
			return -ENOMEM;
		m->sym = v;
		m->cap_sym = n;
	}
	for (size_t off = 0; off < n;) {
		size_t l = KVD_MIN(utf8_len((uint8_t)s[off]), n - off);
		struct sym *y = &m->sym[m->n_sym];
		y->off = (uint32_t)off;
		y->n = (uint32_t)l;
		y->prev = (int32_t)m->n_sym - 1;
		off += l;
		y->next = off < n ? (int32_t)m->n_sym + 1 : -1;
		m->n_sym++;
	}
	return 0;
}

/* Priority of merging left and right, or false when they cannot merge. */
static int merger_prio(struct merger *m, int32_t l, int32_t r, double *prio)
{
	const struct sym *a = &m->sym[l], *b = &m->sym[r];
	const struct tokenizer *t = m->t;

	if (t->kind == TOKENIZER_SPM) {
		int32_t id = vocab_find(t, m->s + a->off, a->n + b->n);
		if (id < 0)
			return 0;
		*prio = t->score[id];
		return 1;
	}
	size_t need = (size_t)a->n + b->n + 1;
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
	uint32_t rank = *strmap_slot(&t->mmap, t->arena, t->merge, m->key, need);
	if (!rank)
		return 0;
	*prio = -(double)(rank - 1);
	return 1;
}

static int merger_try(struct merger *m, int32_t l, int32_t r)
{
	double prio;
	int rc;

	if (l < 0 || r < 0)
		return 0;
	rc = merger_prio(m, l, r, &prio);
	if (rc <= 0)
		return rc;
	return heap_push(&m->heap, (struct pair){
		.prio = prio, .left = l, .right = r,
		.size = m->sym[l].n + m->sym[r].n });
}

static int merger_run(struct merger *m)
{
	int rc;

	for (size_t i = 1; i < m->n_sym; i++)
		if ((rc = merger_try(m, (int32_t)i - 1, (int32_t)i)))
			return rc;
	while (m->heap.n) {
		struct pair p = heap_pop(&m->heap);
		struct sym *a = &m->sym[p.left], *b = &m->sym[p.right];
		/* Stale: one side was merged since the pair was pushed. */
		if (!a->n || !b->n || a->n + b->n != p.size || a->next != p.right)
			continue;
		a->n += b->n;
		b->n = 0;
		a->next = b->next;
		if (b->next >= 0)
			m->sym[b->next].prev = p.left;
		if ((rc = merger_try(m, a->prev, p.left)) ||
		    (rc = merger_try(m, p.left, a->next)))
			return rc;
	}
	return 0;
}

/* Emit the final symbols as ids. */
static int merger_emit(struct merger *m, struct ids *out)
{
	const struct tokenizer *t = m->t;
	int rc;

	for (int32_t i = m->n_sym ? 0 : -1; i >= 0; i = m->sym[i].next) {
		const struct sym *y = &m->sym[i];
		int32_t id = vocab_find(t, m->s + y->off, y->n);
		if (id >= 0) {
			if ((rc = ids_push(out, id)))
				return rc;
			continue;
		}
		if (t->kind == TOKENIZER_SPM) {
			for (uint32_t k = 0; k < y->n; k++) {
				int32_t bt = t->byte_tok[(uint8_t)m->s[y->off + k]];
				if (bt >= 0 && (rc = ids_push(out, bt)))
					return rc;
			}
			continue;
		}
		/* BPE: a symbol the merges made but the vocabulary lacks; fall
		 * back to its single mapped characters. */
		for (uint32_t k = 0; k < y->n;) {
			size_t l = KVD_MIN(utf8_len((uint8_t)m->s[y->off + k]), y->n - k);
			id = vocab_find(t, m->s + y->off + k, l);
			if (id < 0)
				id = t->unk;
			if (id >= 0 && (rc = ids_push(out, id)))
				return rc;
			k += (uint32_t)l;
		}
	}
	return 0;
}

/* ---- SentencePiece ------------------------------------------------------------ */

static int spm_encode(const struct tokenizer *t, const char *text, size_t len,
		      struct ids *out)
{
	struct merger m = { .t = t };
	_cleanup_free_ char *norm = NULL; /* (3 * len + 3) escaped text */
	size_t n = 0;
	int rc;

	if (!len)
		return 0;
	norm = malloc(3 * len + 3);
	if (!norm)
		return -ENOMEM;
	if (t->add_space_prefix) {
		memcpy(norm, SP_SPACE, 3);
		n = 3;
	}
	for (size_t i = 0; i < len; i++) {
		if (text[i] == ' ') {
			memcpy(norm + n, SP_SPACE, 3);
			n += 3;
		} else {
			norm[n++] = text[i];
		}
	}
	rc = merger_split(&m, norm, n);
	if (!rc)
		rc = merger_run(&m);
	if (!rc)
		rc = merger_emit(&m, out);
	merger_deinit(&m);
	return rc;
}

/* ---- byte-level BPE --------------------------------------------------------- */

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

	*len = utf8_decode(sc->s + i, sc->n - i, &cp);
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

static int bpe_encode(const struct tokenizer *t, const char *text, size_t len,
		      struct ids *out)
{
	struct merger m = { .t = t };
	struct scan sc = { .s = (const uint8_t *)text, .n = len };
	uint32_t cp_of[256];
	char *word = NULL;     /* (2 * word bytes) byte-mapped word */
	size_t word_cap = 0;
	int rc = 0;

	gpt2_byte_map(cp_of);
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
		rc = merger_split(&m, word, n);
		if (!rc)
			rc = merger_run(&m);
		if (!rc)
			rc = merger_emit(&m, out);
		i = e;
	}
	free(word);
	merger_deinit(&m);
	return rc;
}

int tokenizer_encode(const struct tokenizer *t, const char *text, size_t len,
		     bool add_bos, int32_t **ids, size_t *n_ids)
{
	struct ids out = { 0 };
	int rc = 0;

	if (len > TOK_MAX_TEXT)
		return -E2BIG;
	if (add_bos && t->bos >= 0)
		rc = ids_push(&out, t->bos);
	if (!rc)
		rc = t->kind == TOKENIZER_SPM ? spm_encode(t, text, len, &out)
					      : bpe_encode(t, text, len, &out);
	if (rc) {
		free(out.v);
		return rc;
	}
	*ids = out.v ? out.v : malloc(sizeof(int32_t));
	if (!*ids)
		return -ENOMEM;
	*n_ids = out.n;
	return 0;
}

/* ---- incremental decoding --------------------------------------------------- */

int detok_init(struct detok *d, const struct tokenizer *t)
{
	*d = (struct detok){ .tok = t };
	/* Worst case per push: every byte of the piece and the held bytes
	 * becomes a 3-byte U+FFFD. */
	d->cap = 3 * (t->max_piece + 4) + 4;
	d->out = malloc(d->cap);
	return d->out ? 0 : -ENOMEM;
}

void detok_deinit(struct detok *d)
{
	free(d->out);
	d->out = NULL;
	d->cap = 0;
}

/* Bytes a lead byte needs, 0 when it can never start a character. */
static uint32_t utf8_need(uint8_t c)
{
	if (c >= 0xc2 && c <= 0xdf)
		return 2;
	if (c >= 0xe0 && c <= 0xef)
		return 3;
	if (c >= 0xf0 && c <= 0xf4)
		return 4;
	return 0;
}

/* Can byte c follow the held bytes? (second-byte limits exclude overlongs,
 * surrogates and code points above U+10FFFF) */
static bool utf8_cont_ok(const uint8_t *pend, uint32_t n_pend, uint8_t c)
{
	uint8_t lo = 0x80, hi = 0xbf;

	if (n_pend == 1) {
		switch (pend[0]) {
		case 0xe0: lo = 0xa0; break;
		case 0xed: hi = 0x9f; break;
		case 0xf0: lo = 0x90; break;
		case 0xf4: hi = 0x8f; break;
		}
	}
	return c >= lo && c <= hi;
}

static size_t detok_byte(struct detok *d, uint8_t c, char *o)
{
	size_t n = 0;

	if (d->n_pend) {
		if (utf8_cont_ok(d->pend, d->n_pend, c)) {
			d->pend[d->n_pend++] = c;
			if (d->n_pend == utf8_need(d->pend[0])) {
				memcpy(o, d->pend, d->n_pend);
				n = d->n_pend;
				d->n_pend = 0;
			}
			return n;
		}
		/* The held sequence can never complete. */
		memcpy(o, UTF8_REPLACEMENT, 3);
		n = 3;
		d->n_pend = 0;
	}
	if (c < 0x80) {
		o[n++] = (char)c;
	} else if (utf8_need(c)) {
		d->pend[0] = c;
		d->n_pend = 1;
	} else {
		memcpy(o + n, UTF8_REPLACEMENT, 3);
		n += 3;
	}
	return n;
}

int detok_push(struct detok *d, int32_t id, const char **chunk, size_t *len)
{
	const struct tokenizer *t = d->tok;
	const char *p;
	size_t n, o = 0;

	if (tokenizer_piece(t, id, &p, &n))
		return -ERANGE;
	if (id == t->bos) {
		d->after_bos = t->kind == TOKENIZER_SPM && t->add_space_prefix;
	} else if (n) {
		if (d->after_bos && p[0] == ' ') {
			p++;
			n--;
		}
		d->after_bos = false;
	}
	for (size_t i = 0; i < n; i++)
		o += detok_byte(d, (uint8_t)p[i], d->out + o);
	*chunk = d->out;
	*len = o;
	return 0;
}

int detok_flush(struct detok *d, const char **chunk, size_t *len)
{
	size_t o = 0;

	if (d->n_pend) {
		memcpy(d->out, UTF8_REPLACEMENT, 3);
		o = 3;
		d->n_pend = 0;
	}
	*chunk = d->out;
	*len = o;
	return 0;
}

int tokenizer_decode(const struct tokenizer *t, const int32_t *ids, size_t n,
		     char **text, size_t *len)
{
	struct detok d;
	char *buf = NULL;
	size_t used = 0, cap = 0;
	const char *c;
	size_t cl;
	int rc = detok_init(&d, t);

	for (size_t i = 0; i <= n && !rc; i++) {
		rc = i < n ? detok_push(&d, ids[i], &c, &cl) : detok_flush(&d, &c, &cl);
		if (rc)
			break;
		if (used + cl + 1 > cap) {
			size_t nc = cap ? cap : 256;
			while (nc < used + cl + 1)
				nc *= 2;
			char *nb = realloc(buf, nc);
			if (!nb) {
				rc = -ENOMEM;
				break;
			}
			buf = nb;
			cap = nc;
		}
		memcpy(buf + used, c, cl);
		used += cl;
	}
	detok_deinit(&d);
	if (rc) {
		free(buf);
		return rc;
	}
	if (!buf && !(buf = malloc(1)))
		return -ENOMEM;
	buf[used] = '\0';
	*text = buf;
	*len = used;
	return 0;
}
