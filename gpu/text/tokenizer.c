/* tokenizer.c - vocabulary load, getters and the encode entry point.
 *
 * Load. Every token text is copied into one arena and indexed by an
 * open-addressing hash map (XXH3 of the bytes -> id; a later duplicate
 * wins, as in llama.cpp). For each token we also precompute its decoded
 * bytes (its "piece"), so decoding is a table lookup. BPE merges
 * ("left right") get a second map from text to rank.
 *
 * The rest of the tokenizer lives beside this file (tokenizer_int.h says
 * which file holds what): both encoders split their text into symbols
 * and merge pairs with the engine in tokenizer_merge.c, SentencePiece
 * (tokenizer_spm.c) by score, byte-level BPE (tokenizer_bpe.c) by merge
 * rank after its pre-tokenizer; detok.c decodes. This file holds what
 * they share: the arena and maps, the UTF-8 reader, GPT-2's byte map,
 * and the growable id vector.
 */
#include "gpu/text/tokenizer.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "conf/util.h"
#include "gpu/text/tokenizer_int.h"

#define TOK_MAX_TEXT (256u << 20) /* refuse to encode more than 256 MiB */

/* ---- small helpers ------------------------------------------------------- */

static int arena_put(struct tokenizer *t, const void *p, size_t n,
		     struct tstr *out)
{
	size_t off = t->arena.len;
	int rc;

	if (n > UINT32_MAX || off + n > UINT32_MAX)
		return -E2BIG;
	/* allocated on the first put, empty or not: a token's text is
	 * t->arena.p + off, never an offset from NULL */
	rc = kvd_buf_add(&t->arena, p, n);
	if (rc)
		return rc;
	out->off = (uint32_t)off;
	out->len = (uint32_t)n;
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

uint32_t *tokenizer__strmap_slot(const struct strmap *m, const char *arena,
				 const struct tstr *keys, const char *p,
				 size_t n)
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

int32_t tokenizer__vocab_find(const struct tokenizer *t, const char *p,
			      size_t n)
{
	uint32_t s = *tokenizer__strmap_slot(&t->vmap, t->arena.p, t->text, p, n);

	return s ? (int32_t)(s - 1) : -1;
}

size_t tokenizer__utf8_decode(const uint8_t *s, size_t n, uint32_t *cp)
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

bool tokenizer_utf8_valid(const char *buf, size_t len)
{
	const uint8_t *s = (const uint8_t *)buf;
	uint32_t cp;

	for (size_t i = 0; i < len;) {
		i += tokenizer__utf8_decode(s + i, len - i, &cp);
		if (cp == UINT32_MAX)
			return false;
	}
	return true;
}

/* GPT-2's byte <-> char map: is byte b one that stands for itself? */
static bool gpt2_byte_printable(unsigned b)
{
	return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) ||
	       (b >= 174 && b <= 255);
}

void tokenizer__gpt2_byte_map(uint32_t cp_of[256])
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

	tokenizer__gpt2_byte_map(cp_of);
	memset(byte_of, 0xff, sizeof(byte_of));
	for (unsigned b = 0; b < 256; b++)
		byte_of[cp_of[b]] = (int16_t)b;
	for (uint32_t id = 0; id < t->n_vocab; id++) {
		struct tstr tx = t->text[id];
		const char *s;
		size_t start = t->arena.len;
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
			s = t->arena.p + tx.off;
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
					s = t->arena.p + tx.off; /* arena may move */
					size_t l = tokenizer__utf8_decode(
						(const uint8_t *)s + i, tx.len - i, &cp);
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
					s = t->arena.p + tx.off;
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
		t->piece[id].len = (uint32_t)(t->arena.len - start);
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
		uint32_t *slot = tokenizer__strmap_slot(&t->mmap, t->arena.p,
				t->merge, t->arena.p + t->merge[i].off, s.len);
		if (!*slot) /* the first (lowest) rank of a duplicate wins */
			*slot = i + 1;
	}
	return 0;
}

/* tokenizer.ggml.pre picks the pre-tokenizer. A file without the key
 * (written before llama.cpp had it) gets GPT-2's; a value kvd does not
 * know is refused by name: a wrong split tokenizes silently wrong. */
static int tok_pre(struct tokenizer *t, const struct gguf_file *f,
		   struct gguf_error *err)
{
	const struct gguf_kv *kv = gguf_find(f, "tokenizer.ggml.pre");
	struct gguf_str s;
	int rc = gguf_get_str(f, "tokenizer.ggml.pre", &s);

	if (rc == -ENOENT) {
		t->pre = tokenizer__bpe_pre_find("gpt-2", 5);
		return 0;
	}
	if (rc)
		return gguf_error_set(err, GGUF_E_TYPE, kv->offset,
				"key 'tokenizer.ggml.pre' is not a string (offset %llu)",
				(unsigned long long)kv->offset);
	t->pre = tokenizer__bpe_pre_find(s.ptr, s.len);
	if (t->pre < 0)
		return gguf_error_set(err, GGUF_E_UNSUPPORTED, kv->offset,
				"pre-tokenizer '%.*s' is not supported (key 'tokenizer.ggml.pre', offset %llu)",
				(int)KVD_MIN(s.len, 64), s.ptr,
				(unsigned long long)kv->offset);
	return 0;
}

/* Tokens matched in text before encoding: user-defined always, control
 * and unknown on request; longest first so "<|a|>x" beats "<|a|>". */
static int special_cmp(const void *a, const void *b, void *ctx)
{
	const struct tokenizer *t = ctx;
	uint32_t la = t->text[*(const int32_t *)a].len;
	uint32_t lb = t->text[*(const int32_t *)b].len;

	if (la != lb)
		return la > lb ? -1 : 1;
	return *(const int32_t *)a - *(const int32_t *)b;
}

static int tok_specials(struct tokenizer *t)
{
	uint32_t n = 0;

	t->special = malloc(t->n_vocab * sizeof(*t->special));
	if (!t->special)
		return -ENOMEM;
	for (uint32_t id = 0; id < t->n_vocab; id++) {
		uint8_t ty = t->type[id];
		if (t->text[id].len && (ty == TOKEN_TYPE_USER_DEFINED ||
		    ty == TOKEN_TYPE_CONTROL || ty == TOKEN_TYPE_UNKNOWN))
			t->special[n++] = (int32_t)id;
	}
	t->n_special = n;
	qsort_r(t->special, n, sizeof(*t->special), special_cmp, t);
	return 0;
}

/* tokenizer.ggml.model: "llama" (SentencePiece) or "gpt2" (byte-level
 * BPE) into t->kind. 0, or the error's code. */
static int tok_kind(struct tokenizer *t, const struct gguf_file *f,
		    struct gguf_error *err)
{
	const struct gguf_kv *kv;
	struct gguf_str model;
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
	return 0;
}

/* The vocabulary: tokenizer.ggml.tokens (1 .. 2^24 strings) into t's
 * arena, text and vmap, with tokenizer.ggml.scores and token_type when
 * present (score 0, type NORMAL when not; a type out of range reads as
 * NORMAL). *typed: the file has a token_type array. 0, or the error's
 * code (-ENOMEM). */
static int tok_vocab(struct tokenizer *t, const struct gguf_file *f,
		     bool *typed, struct gguf_error *err)
{
	const struct gguf_kv *kv, *sc, *ty;
	struct gguf_str s;
	int rc;

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
	*typed = ty != NULL;

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
		uint32_t *slot = tokenizer__strmap_slot(&t->vmap, t->arena.p,
				t->text, t->arena.p + t->text[id].off, s.len);
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
	return 0;
}

/* The special tokens (bos, eos, unk) and flags (add_bos,
 * add_space_prefix): the kind's defaults, then the file's keys; without
 * a token_type array (!typed) the types decoding needs are inferred.
 * 0, or the error's code. */
static int tok_specials_flags(struct tokenizer *t, const struct gguf_file *f,
			      bool typed, struct gguf_error *err)
{
	int rc;

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
	if (!typed) {
		for (uint32_t id = 0; id < t->n_vocab; id++) {
			uint8_t b;
			if (t->kind == TOKENIZER_SPM &&
			    parse_byte_token(t->arena.p + t->text[id].off, t->text[id].len, &b))
				t->type[id] = TOKEN_TYPE_BYTE;
		}
		if (t->bos >= 0) t->type[t->bos] = TOKEN_TYPE_CONTROL;
		if (t->eos >= 0) t->type[t->eos] = TOKEN_TYPE_CONTROL;
		if (t->unk >= 0 && t->kind == TOKENIZER_SPM)
			t->type[t->unk] = TOKEN_TYPE_UNKNOWN;
	}
	return 0;
}

/* SentencePiece byte fallback: each byte's token is <0xNN>, else the
 * raw byte, else unk. */
static void tok_byte_fallback(struct tokenizer *t)
{
	for (unsigned b = 0; b < 256; b++) {
		char name[8];
		uint8_t raw = (uint8_t)b;
		snprintf(name, sizeof(name), "<0x%02X>", b);
		t->byte_tok[b] = tokenizer__vocab_find(t, name, 6);
		if (t->byte_tok[b] < 0)
			t->byte_tok[b] = tokenizer__vocab_find(t,
						(const char *)&raw, 1);
		if (t->byte_tok[b] < 0)
			t->byte_tok[b] = t->unk;
	}
}

static int tok_load(struct tokenizer *t, const struct gguf_file *f,
		    struct gguf_error *err)
{
	bool typed = false;
	int rc;

	if ((rc = tok_kind(t, f, err)) || (rc = tok_vocab(t, f, &typed, err)) ||
	    (rc = tok_specials_flags(t, f, typed, err)))
		return rc;
	tok_byte_fallback(t);
	if (t->kind == TOKENIZER_BPE) {
		if ((rc = tok_pre(t, f, err)) || (rc = tok_load_merges(t, f, err)))
			return rc;
	}
	if ((rc = tok_build_pieces(t)))
		return rc;
	return tok_specials(t);
}

void tokenizer_free(struct tokenizer *t)
{
	if (!t)
		return;
	kvd_buf_deinit(&t->arena);
	free(t->text);
	free(t->piece);
	free(t->score);
	free(t->type);
	free(t->vmap.slot);
	free(t->merge);
	free(t->mmap.slot);
	free(t->special);
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
	*ptr = t->arena.p + t->text[id].off;
	*len = t->text[id].len;
	return 0;
}

int tokenizer_piece(const struct tokenizer *t, int32_t id, const char **ptr,
		    size_t *len)
{
	if (id < 0 || (uint32_t)id >= t->n_vocab)
		return -ERANGE;
	*ptr = t->arena.p + t->piece[id].off;
	*len = t->piece[id].len;
	return 0;
}

/* ---- output vector ----------------------------------------------------------- */

int tokenizer__ids_push(struct ids *o, int32_t id)
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

/* A piece of the text: raw bytes still to encode, or a matched token. */
struct frag {
	size_t off, len;
	int32_t id;            /* -1 for raw text */
};

struct frags {
	struct frag *v;        /* (cap) */
	size_t n, cap;
};

static int frags_push(struct frags *f, struct frag x)
{
	if (f->n == f->cap) {
		size_t cap = f->cap ? 2 * f->cap : 16;
		struct frag *v = realloc(f->v, cap * sizeof(*v));
		if (!v)
			return -ENOMEM;
		f->v = v;
		f->cap = cap;
	}
	f->v[f->n++] = x;
	return 0;
}

/* Cut the raw fragments at every occurrence of each special token, in
 * the order of t->special (longest first). */
static int tok_partition(const struct tokenizer *t, const char *text,
			 size_t len, bool parse_special, struct frags *out)
{
	struct frags cur = { 0 }, nxt = { 0 };
	int rc = frags_push(&cur, (struct frag){ 0, len, -1 });

	for (uint32_t k = 0; k < t->n_special && !rc; k++) {
		int32_t id = t->special[k];
		const char *tx = t->arena.p + t->text[id].off;
		size_t tl = t->text[id].len;
		if (!parse_special && t->type[id] != TOKEN_TYPE_USER_DEFINED)
			continue;
		nxt.n = 0;
		for (size_t f = 0; f < cur.n && !rc; f++) {
			struct frag x = cur.v[f];
			const char *p = text + x.off, *e = p + x.len, *hit;
			if (x.id >= 0) {
				rc = frags_push(&nxt, x);
				continue;
			}
			while (!rc && (hit = memmem(p, (size_t)(e - p), tx, tl))) {
				if (hit > p)
					rc = frags_push(&nxt, (struct frag){
						(size_t)(p - text), (size_t)(hit - p), -1 });
				if (!rc)
					rc = frags_push(&nxt, (struct frag){
						(size_t)(hit - text), tl, id });
				p = hit + tl;
			}
			if (!rc && p < e)
				rc = frags_push(&nxt, (struct frag){
					(size_t)(p - text), (size_t)(e - p), -1 });
		}
		struct frags tmp = cur;
		cur = nxt;
		nxt = tmp;
	}
	free(nxt.v);
	if (rc) {
		free(cur.v);
		return rc;
	}
	*out = cur;
	return 0;
}

int tokenizer_encode_ex(const struct tokenizer *t, const char *text, size_t len,
			unsigned flags, int32_t **ids, size_t *n_ids)
{
	struct ids out = { 0 };
	struct frags fr = { 0 };
	bool prev_special = true; /* SentencePiece: a dummy space follows */
	int rc = 0;

	if (len > TOK_MAX_TEXT)
		return -E2BIG;
	if ((flags & TOKENIZER_ADD_BOS) && t->bos >= 0)
		rc = tokenizer__ids_push(&out, t->bos);
	if (!rc)
		rc = tok_partition(t, text, len, flags & TOKENIZER_PARSE_SPECIAL, &fr);
	for (size_t f = 0; f < fr.n && !rc; f++) {
		const struct frag *x = &fr.v[f];
		if (x->id >= 0) {
			rc = tokenizer__ids_push(&out, x->id);
			prev_special = true;
			continue;
		}
		rc = t->kind == TOKENIZER_SPM
			? tokenizer__spm_encode(t, text + x->off, x->len,
						prev_special, &out)
			: tokenizer__bpe_encode(t, text + x->off, x->len, &out);
		prev_special = false;
	}
	free(fr.v);
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

int tokenizer_encode(const struct tokenizer *t, const char *text, size_t len,
		     bool add_bos, int32_t **ids, size_t *n_ids)
{
	return tokenizer_encode_ex(t, text, len, add_bos ? TOKENIZER_ADD_BOS : 0,
				   ids, n_ids);
}
