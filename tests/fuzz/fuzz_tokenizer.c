/* fuzz_tokenizer.c - text <-> ids (gpu/text/tokenizer.h) on the two vocabulary
 * kinds, built once from tiny models that gpu/model/gguf_gen.h generates in
 * memory (SentencePiece "llama" and byte-level BPE "gpt2").
 *
 * Prompts are tenant input; ids come from the model (or a peer). Input:
 * byte 0 picks the tokenizer (bit 0), the mode (bit 1: text or ids) and
 * add_bos (bit 2); the rest is the text, or little-endian int32 ids mapped
 * into [-4, n_vocab + 4) so out-of-range ids are common. Properties:
 *   - encode: every id inside the vocabulary, BOS first exactly when
 *     asked (and the vocabulary has one); for valid UTF-8 text,
 *     decode(encode(text)) == text (SentencePiece without BOS keeps its
 *     dummy-prefix space), and the incremental decoder's chunks add up
 *     to the same text;
 *   - decode of arbitrary ids: -ERANGE when any id is outside, else valid
 *     UTF-8; detok_push gives -ERANGE for the same ids without changing
 *     state, every chunk is valid UTF-8 and ends on a character boundary,
 *     and when the whole decode holds no U+FFFD the chunks add up to it;
 *   - no leak, no state shared between inputs (the tokenizers are
 *     immutable after tokenizer_new()).
 */
#include <errno.h>
#include <string.h>

#include "gpu/gguf/gguf.h"
#include "gpu/model/gguf_gen.h"
#include "gpu/gguf/gguf_write.h"
#include "gpu/text/tokenizer.h"
#include "tests/fuzz/fuzz.h"

const char fuzz_target_name[] = "tokenizer";

#define FUZZ_TEXT_MAX 4096   /* encode is superlinear; keep inputs short */

/* Built on first use, read-only afterwards (see fuzz.h). */
static struct tokenizer *toks[2];

static struct tokenizer *build(enum gguf_vocab_kind v)
{
	struct gguf_llama_params p = GGUF_LLAMA_PARAMS_DEFAULT;
	struct gguf_writer *w = NULL;
	struct gguf_file *f = NULL;
	struct gguf_error err;
	struct tokenizer *t = NULL;
	char *buf = NULL;
	size_t len = 0;
	FILE *fp;

	p.n_layer = 1;
	p.n_embd = 8;
	p.n_head = 2;
	p.n_head_kv = 1;
	p.n_ff = 8;
	p.n_vocab = 600;
	p.wtype = GGML_TYPE_F16;
	p.tied = true;
	p.vocab = v;
	fp = open_memstream(&buf, &len);
	if (!fp || gguf_make_llama_writer(&w, &p) ||
	    gguf_writer_write_stream(w, fp) || fflush(fp))
		abort();
	if (gguf_open_mem(&f, buf, len, &err) || tokenizer_new(&t, f, &err)) {
		fprintf(stderr, "fuzz_tokenizer: setup: %s\n", err.msg);
		abort();
	}
	gguf_close(f);
	gguf_writer_free(w);
	fclose(fp);
	free(buf);
	return t;
}

static void setup(void)
{
	if (!toks[0]) {
		toks[0] = build(GGUF_VOCAB_LLAMA);
		toks[1] = build(GGUF_VOCAB_GPT2);
		FUZZ_CHECK(tokenizer_kind(toks[0]) == TOKENIZER_SPM &&
			   tokenizer_kind(toks[1]) == TOKENIZER_BPE, "kinds");
	}
}

static bool has_fffd(const char *s, size_t n)
{
	for (size_t i = 0; i + 2 < n; i++)
		if ((uint8_t)s[i] == 0xef && (uint8_t)s[i + 1] == 0xbf &&
		    (uint8_t)s[i + 2] == 0xbd)
			return true;
	return false;
}

/* Stream ids through a detok into `out`; returns the count of -ERANGE. */
static size_t stream(const struct tokenizer *t, const int32_t *ids, size_t n,
		     struct fuzz_bytes *out)
{
	struct detok d;
	const char *c;
	size_t cl, bad = 0;
	uint32_t nv = tokenizer_n_vocab(t);

	FUZZ_CHECK(detok_init(&d, t) == 0, "detok_init");
	for (size_t i = 0; i <= n; i++) {
		int r;

		if (i < n) {
			struct detok before = d;

			r = detok_push(&d, ids[i], &c, &cl);
			if (ids[i] < 0 || (uint32_t)ids[i] >= nv) {
				FUZZ_CHECK(r == -ERANGE, "id %d: %d", ids[i], r);
				FUZZ_CHECK(d.n_pend == before.n_pend &&
					   !memcmp(d.pend, before.pend, 4) &&
					   d.after_bos == before.after_bos,
					   "-ERANGE changed the state");
				bad++;
				continue;
			}
		} else {
			r = detok_flush(&d, &c, &cl);
		}
		FUZZ_CHECK(r == 0 || r == -ENOMEM, "detok: %d", r);
		if (r)
			break;
		FUZZ_CHECK(tokenizer_utf8_valid(c, cl),
			   "detok chunk of %zu bytes is not valid UTF-8", cl);
		fuzz_bytes_add(out, c, cl);
	}
	FUZZ_CHECK(d.n_pend == 0, "bytes held after flush");
	detok_deinit(&d);
	detok_deinit(&d);   /* safe twice */
	return bad;
}

static void fuzz_text(const struct tokenizer *t, const char *text, size_t len,
		      bool bos)
{
	int32_t *ids = NULL;
	size_t n = 0, dl = 0;
	char *dec = NULL;
	uint32_t nv = tokenizer_n_vocab(t);
	int r = tokenizer_encode(t, text, len, bos, &ids, &n);

	FUZZ_CHECK(r == 0 || r == -ENOMEM, "encode: %d", r);
	if (r)
		return;
	for (size_t i = 0; i < n; i++)
		FUZZ_CHECK(ids[i] >= 0 && (uint32_t)ids[i] < nv,
			   "encode produced id %d (vocabulary %u)", ids[i], nv);
	if (bos && tokenizer_bos(t) >= 0)
		FUZZ_CHECK(n >= 1 && ids[0] == tokenizer_bos(t), "no BOS first");
	if (!bos && tokenizer_bos(t) >= 0)
		for (size_t i = 0; i < n; i++)
			FUZZ_CHECK(ids[i] != tokenizer_bos(t),
				   "text \"<s>\" became a control token");
	r = tokenizer_decode(t, ids, n, &dec, &dl);
	FUZZ_CHECK(r == 0, "decode of encode: %d", r);
	FUZZ_CHECK(tokenizer_utf8_valid(dec, dl), "decode: invalid UTF-8");
	if (tokenizer_utf8_valid(text, len)) {
		bool spm = tokenizer_kind(t) == TOKENIZER_SPM;
		bool prefix = !bos && spm && len;
		struct fuzz_bytes s = { 0 }, want = { 0 };

		/* SentencePiece writes spaces as U+2581, so a U+2581 in the
		 * text comes back as a space (as in SentencePiece itself) */
		if (prefix)
			fuzz_bytes_add(&want, " ", 1);
		for (size_t i = 0; i < len; i++) {
			if (spm && i + 2 < len && !memcmp(text + i, "\xe2\x96\x81", 3)) {
				fuzz_bytes_add(&want, " ", 1);
				i += 2;
			} else {
				fuzz_bytes_add(&want, text + i, 1);
			}
		}
		FUZZ_CHECK(fuzz_bytes_eq(&want, &(struct fuzz_bytes){
				(uint8_t *)dec, dl, dl }),
			   "round trip of %zu bytes gave %zu bytes, want %zu",
			   len, dl, want.n);
		free(want.p);
		stream(t, ids, n, &s);
		FUZZ_CHECK(fuzz_bytes_eq(&s, &(struct fuzz_bytes){
				(uint8_t *)dec, dl, dl }),
			   "detok chunks (%zu bytes) != decode (%zu bytes)",
			   s.n, dl);
		free(s.p);
	}
	free(dec);
	free(ids);
}

static void fuzz_ids(const struct tokenizer *t, const uint8_t *p, size_t len)
{
	uint32_t nv = tokenizer_n_vocab(t);
	size_t n = len / 4, bad = 0, dl = 0;
	int32_t *ids = malloc((n ? n : 1) * sizeof(*ids));   /* (n) ids */
	struct fuzz_bytes s = { 0 };
	char *dec = NULL;

	if (!ids)
		return;
	for (size_t i = 0; i < n; i++) {
		uint32_t u = (uint32_t)p[4 * i] | (uint32_t)p[4 * i + 1] << 8 |
			     (uint32_t)p[4 * i + 2] << 16 |
			     (uint32_t)p[4 * i + 3] << 24;

		ids[i] = (int32_t)(u % (nv + 8)) - 4;
		bad += ids[i] < 0 || (uint32_t)ids[i] >= nv;
	}
	int r = tokenizer_decode(t, ids, n, &dec, &dl);

	if (bad) {
		FUZZ_CHECK(r == -ERANGE, "decode with bad ids: %d", r);
	} else {
		FUZZ_CHECK(r == 0, "decode: %d", r);
		FUZZ_CHECK(tokenizer_utf8_valid(dec, dl) && strlen(dec) <= dl,
			   "decode: invalid UTF-8 or unterminated");
	}
	FUZZ_CHECK(stream(t, ids, n, &s) == bad, "detok -ERANGE count");
	if (!bad && !has_fffd(dec, dl))
		FUZZ_CHECK(fuzz_bytes_eq(&s, &(struct fuzz_bytes){
				(uint8_t *)dec, dl, dl }),
			   "detok chunks (%zu bytes) != decode (%zu bytes)",
			   s.n, dl);
	for (size_t i = 0; i < n && i < 8; i++) {
		const char *pp;
		size_t pl;

		r = tokenizer_piece(t, ids[i], &pp, &pl);
		FUZZ_CHECK(r == ((ids[i] < 0 || (uint32_t)ids[i] >= nv) ? -ERANGE : 0),
			   "piece(%d): %d", ids[i], r);
	}
	free(dec);
	free(s.p);
	free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1 || size > FUZZ_TEXT_MAX + 1)
		return 0;
	setup();
	const struct tokenizer *t = toks[data[0] & 1];

	if (data[0] & 2)
		fuzz_ids(t, data + 1, size - 1);
	else
		fuzz_text(t, (const char *)data + 1, size - 1, data[0] & 4);
	return 0;
}

void fuzz_target_seeds(fuzz_emit_fn emit, void *ctx)
{
	static const char *const texts[] = {
		"Once upon a time, there was a little dog.",
		"  two  spaces\tand a tab\nnew line",
		"caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80 <s></s><|endoftext|>",
		"\xe2\x96\x81" "already\xe2\x96\x81" "marked \xc4\xa0the",
		"bad \xff\xfe utf8 \xc3 \x80 end",
		"1234567890 it's don't we'll",
	};
	struct fuzz_bytes b = { 0 };

	for (unsigned sel = 0; sel < 8; sel++) {
		if (sel & 2)
			continue;
		for (size_t i = 0; i < sizeof(texts) / sizeof(texts[0]); i++) {
			b.n = 0;
			uint8_t s8 = (uint8_t)sel;

			fuzz_bytes_add(&b, &s8, 1);
			fuzz_bytes_add(&b, texts[i], strlen(texts[i]));
			emit(ctx, b.p, b.n);
		}
	}
	/* ids: the encoding of a text, and a run of byte tokens that split a
	 * character, for both vocabularies */
	setup();
	for (unsigned k = 0; k < 2; k++) {
		int32_t *ids;
		size_t n;

		if (tokenizer_encode(toks[k], texts[2], strlen(texts[2]), true,
				     &ids, &n))
			abort();
		b.n = 0;
		uint8_t s8 = (uint8_t)(k | 2);

		fuzz_bytes_add(&b, &s8, 1);
		for (size_t i = 0; i < n; i++) {
			/* inverse of the mapping in fuzz_ids */
			uint32_t u = (uint32_t)ids[i] + 4;

			fuzz_bytes_add(&b, &u, 4);
		}
		emit(ctx, b.p, b.n);
		free(ids);
	}
	free(b.p);
}
