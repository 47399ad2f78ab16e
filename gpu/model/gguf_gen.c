/* gguf_gen.c - a generator of random llama GGUF models.
 *
 * gguf_make_llama_writer() lays out the llama.cpp tensor names and every
 * key a llama GGUF carries, and a vocabulary built so that every merged
 * piece is the concatenation of two earlier pieces (so a score-driven
 * SentencePiece merge, or a rank-driven BPE merge, can reach it). Weights
 * are uniform in [-a, a] with a = sqrt(3 / fan_in), i.e. standard
 * deviation 1/sqrt(fan_in), so activations keep unit scale through the
 * layers; the norm weights are F32 near 1.0. Each tensor has its own
 * splitmix64 stream seeded from (seed, tensor name), so the bytes of a
 * tensor do not depend on which other tensors exist or their order.
 *
 * Everything goes through gguf_write.h's public writer: the weights are
 * fill callbacks, so a large model is produced one tensor at a time.
 */
#include "gpu/model/gguf_gen.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conf/util.h"
#include "gpu/cpu/ops_kq.h"

/* ---- vocabulary ---------------------------------------------------------- */

struct vocab {
	char **tok;        /* (n) NUL-terminated pieces */
	float *score;      /* (n) */
	int32_t *type;     /* (n) llama.cpp token types */
	uint32_t n, cap;
	char **merges;     /* (n_merges) "left right" (gpt2) */
	uint32_t n_merges;
	uint32_t *set;     /* (set_mask + 1) token index + 1, 0 = empty */
	uint32_t set_mask;
};

enum { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_BYTE = 6 };

static void vocab_free(struct vocab *v)
{
	for (uint32_t i = 0; i < v->n; i++)
		free(v->tok[i]);
	for (uint32_t i = 0; i < v->n_merges; i++)
		free(v->merges[i]);
	free(v->tok);
	free(v->score);
	free(v->type);
	free(v->merges);
	free(v->set);
}

static uint64_t fnv1a(const char *s);

/* Open-addressing lookup: the slot holding s, or the empty slot where it
 * would go. */
static uint32_t *vocab_slot(const struct vocab *v, const char *s)
{
	for (uint64_t h = fnv1a(s);; h++) {
		uint32_t *e = &v->set[h & v->set_mask];
		if (!*e || !strcmp(v->tok[*e - 1], s))
			return e;
	}
}

static bool vocab_has(const struct vocab *v, const char *s)
{
	return *vocab_slot(v, s) != 0;
}

static int vocab_add(struct vocab *v, const char *s, float score, int32_t type)
{
	if (v->n == v->cap)
		return -ENOSPC;
	v->tok[v->n] = strdup(s);
	if (!v->tok[v->n])
		return -ENOMEM;
	uint32_t *e = vocab_slot(v, s);
	if (!*e)
		*e = v->n + 1; /* first occurrence wins, like a real vocab */
	v->score[v->n] = score;
	v->type[v->n] = type;
	v->n++;
	return 0;
}

static int vocab_add_merge(struct vocab *v, const char *l, const char *r)
{
	char *m;

	if (asprintf(&m, "%s %s", l, r) < 0)
		return -ENOMEM;
	v->merges[v->n_merges++] = m;
	return 0;
}

static const char *const vocab_words[] = {
	"the", "and", "was", "to", "a", "he", "she", "it", "of", "in", "they",
	"said", "day", "one", "her", "his", "with", "you", "that", "for", "on",
	"big", "little", "time", "once", "upon", "there", "happy", "play",
	"friend", "friends", "very", "saw", "mom", "dog", "cat", "tree", "sun",
	"what", "when", "where", "who", "how", "why", "is", "are", "be", "have",
	"had", "not", "but", "all", "can", "will", "do", "so", "out", "up",
	"go", "went", "make", "made", "like", "see", "look", "good", "new",
	"first", "last", "long", "great", "old", "right", "high", "small",
	"large", "next", "early", "young", "important", "few", "public", "bad",
	"same", "able", "model", "token", "cache", "page", "node", "request",
	"memory", "tenant", "prefill", "decode", "transfer", "kernel", "data",
	"hello", "world", "this", "from", "by", "at", "or", "an", "we", "my",
	"me", "if", "no", "yes", "about", "into", "than", "then", "them",
	"these", "some", "would", "could", "other", "which", "their", "time",
	"ing", "ed", "er", "ly", "tion",
};

/* Printable ASCII pieces every vocabulary starts with. */
static const char vocab_chars[] =
	"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	".,!?'\"-:;()";

#define SP_SPACE "\xe2\x96\x81" /* U+2581, SentencePiece's space */

/* SentencePiece vocabulary: specials, 256 byte tokens, then pieces whose
 * scores fall with their index; every multi-char piece is an earlier piece
 * plus one char, so score-driven merging can build it. */
static int vocab_build_llama(struct vocab *v)
{
	char buf[64];
	float score = 0;
	int rc;

	if ((rc = vocab_add(v, "<unk>", 0, TT_UNKNOWN)) ||
	    (rc = vocab_add(v, "<s>", 0, TT_CONTROL)) ||
	    (rc = vocab_add(v, "</s>", 0, TT_CONTROL)))
		return rc;
	for (int b = 0; b < 256; b++) {
		snprintf(buf, sizeof(buf), "<0x%02X>", b);
		if ((rc = vocab_add(v, buf, 0, TT_BYTE)))
			return rc;
	}
	if ((rc = vocab_add(v, SP_SPACE, --score, TT_NORMAL)))
		return rc;
	for (const char *c = vocab_chars; *c; c++) {
		buf[0] = *c;
		buf[1] = 0;
		if ((rc = vocab_add(v, buf, --score, TT_NORMAL)))
			return rc;
	}
	/* "▁w", "▁wo", "▁wor", ... for each word. */
	for (size_t i = 0; i < KVD_ARRAY_SIZE(vocab_words); i++) {
		const char *wd = vocab_words[i];
		for (size_t k = 1; k <= strlen(wd); k++) {
			snprintf(buf, sizeof(buf), SP_SPACE "%.*s", (int)k, wd);
			if (vocab_has(v, buf))
				continue;
			if ((rc = vocab_add(v, buf, --score, TT_NORMAL)))
				return rc;
		}
	}
	/* Lower-case letter n-grams, shortest first: each is an (n-1)-gram
	 * plus a letter. */
	for (int len = 2; len <= 4; len++) {
		uint64_t count = 1;
		for (int i = 0; i < len; i++)
			count *= 26;
		for (uint64_t g = 0; g < count; g++) {
			uint64_t x = g;
			for (int i = len - 1; i >= 0; i--, x /= 26)
				buf[i] = (char)('a' + x % 26);
			buf[len] = 0;
			if (vocab_has(v, buf))
				continue;
			if ((rc = vocab_add(v, buf, --score, TT_NORMAL)))
				return rc;
		}
	}
	return 0;
}

/* GPT-2's byte-to-char map: printable bytes map to themselves, the rest
 * to U+0100 + n in byte order. Writes the UTF-8 of byte b's char. */
static void gpt2_byte_char(int b, char out[3])
{
	int n = 0, cp;

	if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) {
		cp = b;
	} else {
		for (int i = 0; i < b; i++)
			if (!((i >= 33 && i <= 126) || (i >= 161 && i <= 172) ||
			      (i >= 174 && i <= 255)))
				n++;
		cp = 256 + n;
	}
	if (cp < 0x80) {
		out[0] = (char)cp;
		out[1] = 0;
	} else {
		out[0] = (char)(0xc0 | (cp >> 6));
		out[1] = (char)(0x80 | (cp & 0x3f));
		out[2] = 0;
	}
}

/* Byte-level BPE vocabulary: the 256 byte chars, then merged pieces (one
 * merge each, rank = order), then <|endoftext|> last as BOS/EOS. */
static int vocab_build_gpt2(struct vocab *v, uint32_t n_vocab)
{
	char buf[64], prev[64], ch[3], sp[3];
	int rc;

	for (int b = 0; b < 256; b++) {
		gpt2_byte_char(b, ch);
		if ((rc = vocab_add(v, ch, 0, TT_NORMAL)))
			return rc;
	}
	gpt2_byte_char(' ', sp); /* "Ġ" */
	v->cap = n_vocab - 1; /* keep the last slot for <|endoftext|> */
	for (size_t i = 0; i < KVD_ARRAY_SIZE(vocab_words) && v->n < v->cap; i++) {
		const char *wd = vocab_words[i];
		/* " word" -> "Ġw", "Ġwo", ...; and the bare word "w", "wo"... */
		for (int pass = 0; pass < 2 && v->n < v->cap; pass++) {
			snprintf(prev, sizeof(prev), "%s", pass ? "" : sp);
			for (size_t k = 0; k < strlen(wd) && v->n < v->cap; k++) {
				snprintf(buf, sizeof(buf), "%.48s%c", prev, wd[k]);
				if (strlen(prev) && !vocab_has(v, buf)) {
					char c1[2] = { wd[k], 0 };
					if ((rc = vocab_add_merge(v, prev, c1)) ||
					    (rc = vocab_add(v, buf, 0, TT_NORMAL)))
						return rc;
				}
				snprintf(prev, sizeof(prev), "%s", buf);
			}
		}
	}
	/* Letter bigrams fill what is left. */
	for (int a = 0; a < 26 && v->n < v->cap; a++)
		for (int b = 0; b < 26 && v->n < v->cap; b++) {
			char l[2] = { (char)('a' + a), 0 }, r[2] = { (char)('a' + b), 0 };
			snprintf(buf, sizeof(buf), "%s%s", l, r);
			if (vocab_has(v, buf))
				continue;
			if ((rc = vocab_add_merge(v, l, r)) ||
			    (rc = vocab_add(v, buf, 0, TT_NORMAL)))
				return rc;
		}
	v->cap = n_vocab;
	while (v->n < n_vocab - 1) {
		/* Unreachable filler so the vocabulary has exactly n_vocab. */
		snprintf(buf, sizeof(buf), "<|unused%u|>", v->n);
		if ((rc = vocab_add(v, buf, 0, TT_CONTROL)))
			return rc;
	}
	return vocab_add(v, "<|endoftext|>", 0, TT_CONTROL);
}

static int vocab_build(struct vocab *v, const struct gguf_llama_params *p)
{
	int rc;

	*v = (struct vocab){ 0 };
	v->cap = p->n_vocab;
	v->tok = calloc(p->n_vocab, sizeof(*v->tok));
	v->score = calloc(p->n_vocab, sizeof(*v->score));
	v->type = calloc(p->n_vocab, sizeof(*v->type));
	v->merges = calloc(p->n_vocab, sizeof(*v->merges));
	v->set_mask = 1023;
	while (v->set_mask < 2 * p->n_vocab)
		v->set_mask = v->set_mask * 2 + 1;
	v->set = calloc((size_t)v->set_mask + 1, sizeof(*v->set));
	if (!v->tok || !v->score || !v->type || !v->merges || !v->set)
		return -ENOMEM;
	if (p->vocab == GGUF_VOCAB_GPT2)
		return vocab_build_gpt2(v, p->n_vocab);
	rc = vocab_build_llama(v);
	if (rc == -ENOSPC)
		rc = 0; /* full: the vocabulary is exactly n_vocab */
	if (!rc && v->n < p->n_vocab)
		rc = -EINVAL; /* more than the generator can make */
	return rc;
}

/* ---- weights --------------------------------------------------------------- */

enum gen_kind { GEN_WEIGHT = 0, GEN_NORM = 1 };

struct gen_tensor {
	uint64_t stream;      /* splitmix64 seed of this tensor */
	uint64_t ne0, ne1;
	enum ggml_type type;
	enum gen_kind kind;
};

struct gen_ctx {
	uint64_t n;
	struct gen_tensor t[]; /* (n) by writer tensor index */
};

static uint64_t splitmix64(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Uniform in [-1, 1). */
static float gen_unit(uint64_t *s)
{
	return (float)((int64_t)(splitmix64(s) >> 40) - (1 << 23)) * (1.0f / (1 << 23));
}

static uint64_t fnv1a(const char *s)
{
	uint64_t h = 0xcbf29ce484222325ull;

	for (; *s; s++)
		h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
	return h;
}

static int gen_fill(void *vctx, uint64_t index, void *dst, uint64_t nbytes)
{
	struct gen_ctx *ctx = vctx;
	const struct gen_tensor *t = &ctx->t[index];
	uint64_t s = t->stream;
	float a = sqrtf(3.0f / (float)t->ne0);
	float row[1024]; /* one chunk of a row, converted in place */

	(void)nbytes;
	uint8_t *out = dst;
	for (uint64_t r = 0; r < t->ne1; r++) {
		for (uint64_t c0 = 0; c0 < t->ne0; c0 += KVD_ARRAY_SIZE(row)) {
			uint64_t n = KVD_MIN(KVD_ARRAY_SIZE(row), t->ne0 - c0);
			for (uint64_t i = 0; i < n; i++)
				row[i] = t->kind == GEN_NORM ? 1.0f + 0.05f * gen_unit(&s)
							     : a * gen_unit(&s);
			switch (t->type) {
			case GGML_TYPE_F32:
				memcpy(out, row, n * 4);
				out += n * 4;
				break;
			case GGML_TYPE_F16:
				for (uint64_t i = 0; i < n; i++, out += 2) {
					uint16_t h = gguf_f32_to_f16(row[i]);
					memcpy(out, &h, 2);
				}
				break;
			case GGML_TYPE_Q8_0:
				/* chunks are multiples of 32 because ne0 is */
				gguf_quantize_q8_0(row, n, out);
				out += n / 32 * 34;
				break;
			case GGML_TYPE_Q4_0:
				gguf_quantize_q4_0(row, n, out);
				out += n / 32 * 18;
				break;
			default:
				/* chunks are multiples of 256 because ne0 is */
				if (!ops_kq_is(t->type))
					return -EINVAL;
				ops_kq_quantize_row(t->type, row, (uint32_t)n, out);
				out += n / OPS_QK_K * ops_kq_block_bytes(t->type);
				break;
			}
		}
	}
	return 0;
}

/* ---- llama layout ---------------------------------------------------------- */

struct llama_tensor_spec {
	const char *name;     /* printf pattern with the layer */
	int r0, r1;           /* dims: 0 embd, 1 q, 2 kv, 3 ff, 4 vocab, 5 one,
			       * 6 head */
	enum gen_kind kind;
	bool mix;             /* Q6_K under mix_q6_k */
	int only;             /* 0 every arch; else the one arch + 1 */
};

#define ONLY_QWEN2 (LLAMA_ARCH_QWEN2 + 1)
#define ONLY_QWEN3 (LLAMA_ARCH_QWEN3 + 1)

static const struct llama_tensor_spec llama_layer_tensors[] = {
	{ "blk.%u.attn_norm.weight", 0, 5, GEN_NORM, false, 0 },
	{ "blk.%u.attn_q.weight", 0, 1, GEN_WEIGHT, false, 0 },
	{ "blk.%u.attn_q.bias", 1, 5, GEN_WEIGHT, false, ONLY_QWEN2 },
	{ "blk.%u.attn_q_norm.weight", 6, 5, GEN_NORM, false, ONLY_QWEN3 },
	{ "blk.%u.attn_k.weight", 0, 2, GEN_WEIGHT, false, 0 },
	{ "blk.%u.attn_k.bias", 2, 5, GEN_WEIGHT, false, ONLY_QWEN2 },
	{ "blk.%u.attn_k_norm.weight", 6, 5, GEN_NORM, false, ONLY_QWEN3 },
	{ "blk.%u.attn_v.weight", 0, 2, GEN_WEIGHT, true, 0 },
	{ "blk.%u.attn_v.bias", 2, 5, GEN_WEIGHT, false, ONLY_QWEN2 },
	{ "blk.%u.attn_output.weight", 1, 0, GEN_WEIGHT, false, 0 },
	{ "blk.%u.ffn_norm.weight", 0, 5, GEN_NORM, false, 0 },
	{ "blk.%u.ffn_gate.weight", 0, 3, GEN_WEIGHT, false, 0 },
	{ "blk.%u.ffn_down.weight", 3, 0, GEN_WEIGHT, true, 0 },
	{ "blk.%u.ffn_up.weight", 0, 3, GEN_WEIGHT, false, 0 },
};

static bool llama_has(const struct gguf_llama_params *p,
		      const struct llama_tensor_spec *s)
{
	return !s->only || s->only == (int)p->arch + 1;
}

static uint32_t llama_head_dim(const struct gguf_llama_params *p)
{
	return p->head_dim ? p->head_dim : p->n_head ? p->n_embd / p->n_head : 0;
}

static void llama_dims(const struct gguf_llama_params *p, uint64_t d[7])
{
	uint64_t hd = llama_head_dim(p);

	d[0] = p->n_embd;
	d[1] = hd * p->n_head;
	d[2] = hd * p->n_head_kv;
	d[3] = p->n_ff;
	d[4] = p->n_vocab;
	d[5] = 1;
	d[6] = hd;
}

const char *gguf_arch_name(enum llama_arch a)
{
	static const char *const names[] = {
		[LLAMA_ARCH_LLAMA] = "llama",
		[LLAMA_ARCH_QWEN2] = "qwen2",
		[LLAMA_ARCH_QWEN3] = "qwen3",
	};

	return (unsigned)a < KVD_ARRAY_SIZE(names) ? names[a] : NULL;
}

uint64_t gguf_llama_n_params(const struct gguf_llama_params *p)
{
	uint64_t d[7], n;

	llama_dims(p, d);
	n = d[0] * d[4] * (p->tied ? 1 : 2) + d[0];
	for (size_t i = 0; i < KVD_ARRAY_SIZE(llama_layer_tensors); i++)
		if (llama_has(p, &llama_layer_tensors[i]))
			n += (uint64_t)p->n_layer * d[llama_layer_tensors[i].r0] *
			     d[llama_layer_tensors[i].r1];
	return n;
}

int gguf_llama_params_check(const struct gguf_llama_params *p, char *why,
			    size_t size)
{
#define BAD(...) do { snprintf(why, size, __VA_ARGS__); return -EINVAL; } while (0)
	if (!p->n_layer || !p->n_embd || !p->n_head || !p->n_head_kv ||
	    !p->n_ff || !p->n_ctx)
		BAD("every dimension must be positive");
	if (p->n_layer > 4096 || p->n_embd > 65536 || p->n_ff > 1 << 20 ||
	    p->n_vocab > 1 << 20)
		BAD("dimensions too large");
	if (!gguf_arch_name(p->arch))
		BAD("unknown architecture %d", (int)p->arch);
	if (!p->head_dim && p->n_embd % p->n_head)
		BAD("dim %u is not a multiple of heads %u", p->n_embd, p->n_head);
	if (p->head_dim && p->arch == LLAMA_ARCH_LLAMA)
		BAD("a head dim other than dim / heads needs --arch qwen3 or qwen2");
	if (p->head_dim > 4096)
		BAD("head dim %u too large", p->head_dim);
	if (p->n_head % p->n_head_kv)
		BAD("heads %u is not a multiple of kv-heads %u", p->n_head,
		    p->n_head_kv);
	if (llama_head_dim(p) % 2 || !llama_head_dim(p))
		BAD("head dim %u must be even (RoPE rotates pairs)",
		    llama_head_dim(p));
	if (p->n_vocab < 259)
		BAD("vocab %u is below 259 (3 specials + 256 bytes)", p->n_vocab);
	if (p->wtype != GGML_TYPE_F32 && p->wtype != GGML_TYPE_F16 &&
	    p->wtype != GGML_TYPE_Q8_0 && p->wtype != GGML_TYPE_Q4_0 &&
	    !ops_kq_is(p->wtype))
		BAD("weight type %s not supported (f32, f16, q8_0, q4_0, q2_k..q6_k)",
		    ggml_type_name(p->wtype));
	/* attn_output's rows are heads * head dim long */
	uint32_t qd = p->n_head * llama_head_dim(p);
	if ((ops_kq_is(p->wtype) || p->mix_q6_k) &&
	    (p->n_embd % OPS_QK_K || p->n_ff % OPS_QK_K || qd % OPS_QK_K))
		BAD("%s needs dim, ff and heads * head dim to be multiples of 256",
		    ggml_type_name(p->mix_q6_k ? GGML_TYPE_Q6_K : p->wtype));
	if ((p->wtype == GGML_TYPE_Q8_0 || p->wtype == GGML_TYPE_Q4_0) &&
	    (p->n_embd % 32 || p->n_ff % 32 || qd % 32))
		BAD("%s needs dim, ff and heads * head dim to be multiples of 32",
		    ggml_type_name(p->wtype));
	if (!(p->norm_eps > 0) || !(p->rope_freq_base > 0))
		BAD("norm eps and rope base must be positive");
	if (p->vocab_from && gguf_vocab_size(p->vocab_from) != p->n_vocab)
		BAD("vocab %u differs from the vocabulary file's %u tokens",
		    p->n_vocab, gguf_vocab_size(p->vocab_from));
	return 0;
#undef BAD
}

static int llama_add_tensor(struct gguf_writer *w, struct gen_ctx *ctx,
			    const char *name, uint64_t ne0, uint64_t ne1,
			    enum ggml_type type, enum gen_kind kind,
			    uint64_t seed)
{
	uint64_t ne[2] = { ne0, ne1 };
	struct gen_tensor *t = &ctx->t[ctx->n];
	int rc;

	*t = (struct gen_tensor){ .stream = seed ^ fnv1a(name), .ne0 = ne0,
				  .ne1 = ne1, .type = type, .kind = kind };
	rc = gguf_writer_add_tensor(w, name, type, ne1 == 1 ? 1 : 2, ne, NULL,
				    gen_fill, ctx);
	if (!rc)
		ctx->n++;
	return rc;
}

static int llama_add_vocab(struct gguf_writer *w,
			   const struct gguf_llama_params *p)
{
	struct vocab v;
	int rc;

	rc = vocab_build(&v, p);
	if (!rc)
		rc = gguf_writer_add_str(w, "tokenizer.ggml.model",
					 p->vocab == GGUF_VOCAB_GPT2 ? "gpt2" : "llama");
	if (!rc)
		rc = gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens",
					     (const char *const *)v.tok, v.n);
	if (!rc && p->vocab == GGUF_VOCAB_LLAMA)
		rc = gguf_writer_add_arr(w, "tokenizer.ggml.scores",
					 GGUF_VT_FLOAT32, v.score, v.n);
	if (!rc)
		rc = gguf_writer_add_arr(w, "tokenizer.ggml.token_type",
					 GGUF_VT_INT32, v.type, v.n);
	if (!rc && p->vocab == GGUF_VOCAB_GPT2)
		rc = gguf_writer_add_arr_str(w, "tokenizer.ggml.merges",
					     (const char *const *)v.merges,
					     v.n_merges);
	if (p->vocab == GGUF_VOCAB_GPT2) {
		if (!rc) rc = gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", v.n - 1);
		if (!rc) rc = gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", v.n - 1);
		if (!rc) rc = gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token", false);
	} else {
		if (!rc) rc = gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", 1);
		if (!rc) rc = gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", 2);
		if (!rc) rc = gguf_writer_add_u32(w, "tokenizer.ggml.unknown_token_id", 0);
		if (!rc) rc = gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token", true);
		if (!rc) rc = gguf_writer_add_bool(w, "tokenizer.ggml.add_eos_token", false);
	}
	if (!rc && p->chat_template)
		rc = gguf_writer_add_str(w, "tokenizer.chat_template", p->chat_template);
	vocab_free(&v);
	return rc;
}

uint32_t gguf_vocab_size(const struct gguf_file *f)
{
	const struct gguf_kv *kv = gguf_find(f, "tokenizer.ggml.tokens");

	if (!kv || kv->type != GGUF_VT_ARRAY || kv->arr_type != GGUF_VT_STRING ||
	    kv->arr_len > UINT32_MAX)
		return 0;
	return (uint32_t)kv->arr_len;
}

/* One string array, each element copied NUL-terminated; -EINVAL when an
 * element holds a NUL byte (the writer takes C strings). */
static int copy_arr_str(struct gguf_writer *w, const struct gguf_file *f,
			const struct gguf_kv *kv, const char *key)
{
	char **v = calloc(kv->arr_len ? kv->arr_len : 1, sizeof(*v));
	int rc = v ? 0 : -ENOMEM;

	for (uint64_t i = 0; i < kv->arr_len && !rc; i++) {
		struct gguf_str e;

		rc = gguf_arr_str(f, kv, i, &e);
		if (!rc && memchr(e.ptr, 0, e.len))
			rc = -EINVAL;
		if (!rc && !(v[i] = strndup(e.ptr, e.len)))
			rc = -ENOMEM;
	}
	if (!rc)
		rc = gguf_writer_add_arr_str(w, key, (const char *const *)v, kv->arr_len);
	for (uint64_t i = 0; v && i < kv->arr_len; i++)
		free(v[i]);
	free(v);
	return rc;
}

/* One key of the vocabulary file, any type but nested arrays. */
static int copy_kv(struct gguf_writer *w, const struct gguf_file *f,
		   const struct gguf_kv *kv, const char *key)
{
	const uint8_t *b = kv->value;
	union { uint8_t u8; uint16_t u16; uint32_t u32; uint64_t u64; float f32;
		double f64; } v;
	struct gguf_str st;
	char *str;
	int rc;

	memcpy(&v, b, kv->type == GGUF_VT_STRING || kv->type == GGUF_VT_ARRAY ? 0 :
			      gguf_vtype_size(kv->type));
	switch (kv->type) {
	case GGUF_VT_UINT8: return gguf_writer_add_u8(w, key, v.u8);
	case GGUF_VT_INT8: return gguf_writer_add_i8(w, key, (int8_t)v.u8);
	case GGUF_VT_UINT16: return gguf_writer_add_u16(w, key, v.u16);
	case GGUF_VT_INT16: return gguf_writer_add_i16(w, key, (int16_t)v.u16);
	case GGUF_VT_UINT32: return gguf_writer_add_u32(w, key, v.u32);
	case GGUF_VT_INT32: return gguf_writer_add_i32(w, key, (int32_t)v.u32);
	case GGUF_VT_UINT64: return gguf_writer_add_u64(w, key, v.u64);
	case GGUF_VT_INT64: return gguf_writer_add_i64(w, key, (int64_t)v.u64);
	case GGUF_VT_FLOAT32: return gguf_writer_add_f32(w, key, v.f32);
	case GGUF_VT_FLOAT64: return gguf_writer_add_f64(w, key, v.f64);
	case GGUF_VT_BOOL: return gguf_writer_add_bool(w, key, v.u8 != 0);
	case GGUF_VT_STRING:
		if ((rc = gguf_get_str(f, key, &st)))
			return rc;
		if (memchr(st.ptr, 0, st.len))
			return -EINVAL;
		if (!(str = strndup(st.ptr, st.len)))
			return -ENOMEM;
		rc = gguf_writer_add_str(w, key, str);
		free(str);
		return rc;
	case GGUF_VT_ARRAY:
		if (kv->arr_type == GGUF_VT_STRING)
			return copy_arr_str(w, f, kv, key);
		if (kv->arr_type == GGUF_VT_ARRAY)
			return -EINVAL;
		return gguf_writer_add_arr(w, key, kv->arr_type, kv->value, kv->arr_len);
	}
	return -EINVAL;
}

/* Every tokenizer.* key of f, in its order. */
/* The tokenizer.* keys of p->vocab_from, with p->chat_template (when set)
 * in place of the file's own template. */
static int llama_copy_vocab(struct gguf_writer *w, const struct gguf_llama_params *p)
{
	static const char pfx[] = "tokenizer.";
	const struct gguf_file *f = p->vocab_from;
	char key[256];
	int rc = 0;

	for (uint64_t i = 0; i < f->n_kv && !rc; i++) {
		const struct gguf_kv *kv = &f->kv[i];

		if (kv->key.len < sizeof(pfx) - 1 || kv->key.len >= sizeof(key) ||
		    memcmp(kv->key.ptr, pfx, sizeof(pfx) - 1))
			continue;
		memcpy(key, kv->key.ptr, kv->key.len);
		key[kv->key.len] = 0;
		if (p->chat_template && !strcmp(key, "tokenizer.chat_template"))
			continue;
		rc = copy_kv(w, f, kv, key);
	}
	if (!rc && p->chat_template)
		rc = gguf_writer_add_str(w, "tokenizer.chat_template", p->chat_template);
	return rc;
}

static uint32_t llama_file_type(enum ggml_type t, bool mix)
{
	/* the _M mixes: Q3_K_M 12, Q4_K_M 15, Q5_K_M 17 */
	if (mix && (t == GGML_TYPE_Q3_K || t == GGML_TYPE_Q4_K || t == GGML_TYPE_Q5_K))
		return t == GGML_TYPE_Q3_K ? 12 : t == GGML_TYPE_Q4_K ? 15 : 17;
	/* llama.cpp's LLAMA_FTYPE_*: ALL_F32 0, MOSTLY_F16 1, MOSTLY_Q4_0 2,
	 * MOSTLY_Q8_0 7; one K-quant type throughout is the _S mix (Q2_K 10,
	 * Q3_K_S 11, Q4_K_S 14, Q5_K_S 16, Q6_K 18) */
	switch (t) {
	case GGML_TYPE_F16: return 1;
	case GGML_TYPE_Q8_0: return 7;
	case GGML_TYPE_Q4_0: return 2;
	case GGML_TYPE_Q2_K: return 10;
	case GGML_TYPE_Q3_K: return 11;
	case GGML_TYPE_Q4_K: return 14;
	case GGML_TYPE_Q5_K: return 16;
	case GGML_TYPE_Q6_K: return 18;
	default: return 0;
	}
}

int gguf_make_llama_writer(struct gguf_writer **out,
			   const struct gguf_llama_params *p)
{
	_cleanup_(gguf_writer_freep) struct gguf_writer *w = NULL;
	struct gen_ctx *ctx;
	uint64_t d[7];
	char why[128], name[96], k[96];
	const char *a;
	int rc;

	if (gguf_llama_params_check(p, why, sizeof(why)))
		return -EINVAL;
	llama_dims(p, d);
	a = gguf_arch_name(p->arch);
#define KEY(suffix) (snprintf(k, sizeof(k), "%s.%s", a, suffix), k)
	if ((rc = gguf_writer_new(&w, 32)))
		return rc;
	rc = gguf_writer_add_str(w, "general.architecture", a);
	if (!rc) rc = gguf_writer_add_str(w, "general.name", p->name ? p->name : "kvd-random");
	if (!rc) rc = gguf_writer_add_u32(w, "general.file_type", llama_file_type(p->wtype, p->mix_q6_k));
	if (!rc) rc = gguf_writer_add_u32(w, "general.quantization_version", 2);
	if (!rc) rc = gguf_writer_add_u32(w, KEY("context_length"), p->n_ctx);
	if (!rc) rc = gguf_writer_add_u32(w, KEY("embedding_length"), p->n_embd);
	if (!rc) rc = gguf_writer_add_u32(w, KEY("block_count"), p->n_layer);
	if (!rc) rc = gguf_writer_add_u32(w, KEY("feed_forward_length"), p->n_ff);
	/* qwen files carry no rope.dimension_count: RoPE spans the head */
	if (!rc && p->arch == LLAMA_ARCH_LLAMA)
		rc = gguf_writer_add_u32(w, KEY("rope.dimension_count"), (uint32_t)d[6]);
	if (!rc) rc = gguf_writer_add_f32(w, KEY("rope.freq_base"), p->rope_freq_base);
	if (!rc) rc = gguf_writer_add_u32(w, KEY("attention.head_count"), p->n_head);
	if (!rc) rc = gguf_writer_add_u32(w, KEY("attention.head_count_kv"), p->n_head_kv);
	if (!rc) rc = gguf_writer_add_f32(w, KEY("attention.layer_norm_rms_epsilon"), p->norm_eps);
	/* llama.cpp's qwen3 converter always writes the head size */
	if (!rc && (p->head_dim || p->arch == LLAMA_ARCH_QWEN3)) {
		rc = gguf_writer_add_u32(w, KEY("attention.key_length"), (uint32_t)d[6]);
		if (!rc) rc = gguf_writer_add_u32(w, KEY("attention.value_length"), (uint32_t)d[6]);
	}
	if (!rc) rc = gguf_writer_add_u32(w, KEY("vocab_size"), p->n_vocab);
#undef KEY
	if (!rc) rc = p->vocab_from ? llama_copy_vocab(w, p)
				    : llama_add_vocab(w, p);
	if (rc)
		return rc;

	uint64_t n_tensors = 3 + (uint64_t)p->n_layer * KVD_ARRAY_SIZE(llama_layer_tensors);
	ctx = calloc(1, sizeof(*ctx) + n_tensors * sizeof(ctx->t[0]));
	if (!ctx)
		return -ENOMEM;
	if ((rc = gguf_writer_attach(w, ctx)))
		return rc;
	rc = llama_add_tensor(w, ctx, "token_embd.weight", d[0], d[4], p->wtype,
			      GEN_WEIGHT, p->seed);
	for (uint32_t l = 0; l < p->n_layer && !rc; l++)
		for (size_t i = 0; i < KVD_ARRAY_SIZE(llama_layer_tensors) && !rc; i++) {
			const struct llama_tensor_spec *s = &llama_layer_tensors[i];
			if (!llama_has(p, s))
				continue;
			snprintf(name, sizeof(name), s->name, l);
			rc = llama_add_tensor(w, ctx, name, d[s->r0], d[s->r1],
					      s->kind == GEN_NORM || s->r1 == 5 ? GGML_TYPE_F32 :
					      p->mix_q6_k && s->mix ? GGML_TYPE_Q6_K : p->wtype,
					      s->kind, p->seed);
		}
	if (!rc)
		rc = llama_add_tensor(w, ctx, "output_norm.weight", d[0], 1,
				      GGML_TYPE_F32, GEN_NORM, p->seed);
	if (!rc && !p->tied)
		rc = llama_add_tensor(w, ctx, "output.weight", d[0], d[4],
				      p->mix_q6_k ? GGML_TYPE_Q6_K : p->wtype,
				      GEN_WEIGHT, p->seed);
	if (rc)
		return rc;
	*out = kvd_steal(&w);
	return 0;
}

int gguf_make_llama(const char *path, const struct gguf_llama_params *p)
{
	_cleanup_(gguf_writer_freep) struct gguf_writer *w = NULL;
	int rc = gguf_make_llama_writer(&w, p);

	return rc ? rc : gguf_writer_write(w, path);
}
