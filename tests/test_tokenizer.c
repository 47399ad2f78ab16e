/* test_tokenizer.c - SentencePiece and BPE encoding, incremental decoding.
 *
 * Golden ids come from ../shared/models/golden.json (stories260K, computed
 * by llama.cpp); the Llama-2 vocabulary comes from llama-2-tiny-random.gguf.
 * Cases needing a shared model skip themselves when it is absent; the
 * BPE cases use a model written by gguf_make_llama().
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "conf/util.h"
#include "gpu/gguf/gguf.h"
#include "gpu/model/gguf_gen.h"
#include "gpu/gguf/gguf_write.h"
#include "gpu/text/tokenizer.h"

static char shared_dir[1024];

struct tk {
	struct gguf_file *f;
	struct tokenizer *t;
	uint8_t *mem;  /* generated file bytes, or NULL */
};

static bool tk_open_shared(struct tk *k, const char *name)
{
	char path[1200];
	struct gguf_error err;

	snprintf(path, sizeof(path), "%s/models/%s", shared_dir, name);
	*k = (struct tk){ 0 };
	if (access(path, R_OK)) {
		fprintf(stderr, "skip: %s absent\n", path);
		return false;
	}
	ck_assert_int_eq(gguf_open(&k->f, path, &err), 0);
	ck_assert_msg(tokenizer_new(&k->t, k->f, &err) == 0, "%s", err.msg);
	return true;
}

static uint8_t *writer_mem(struct gguf_writer *w, size_t *size)
{
	char *buf = NULL;
	FILE *fp = open_memstream(&buf, size);

	ck_assert_int_eq(gguf_writer_write_stream(w, fp), 0);
	fclose(fp);
	return (uint8_t *)buf;
}

static void tk_open_gen(struct tk *k, enum gguf_vocab_kind kind, uint32_t n_vocab)
{
	struct gguf_llama_params p = GGUF_LLAMA_PARAMS_DEFAULT;
	struct gguf_writer *w = NULL;
	struct gguf_error err;
	size_t size;

	*k = (struct tk){ 0 };
	p.n_layer = 1;
	p.n_embd = 32;
	p.n_head = 2;
	p.n_ff = 32;
	p.n_vocab = n_vocab;
	p.vocab = kind;
	ck_assert_int_eq(gguf_make_llama_writer(&w, &p), 0);
	k->mem = writer_mem(w, &size);
	gguf_writer_free(w);
	ck_assert_int_eq(gguf_open_mem(&k->f, k->mem, size, &err), 0);
	ck_assert_msg(tokenizer_new(&k->t, k->f, &err) == 0, "%s", err.msg);
}

static void tk_close(struct tk *k)
{
	tokenizer_free(k->t);
	gguf_close(k->f);
	free(k->mem);
}

static void assert_ids(const struct tokenizer *t, const char *text, bool bos,
		       const int32_t *want, size_t n_want)
{
	int32_t *ids;
	size_t n;

	ck_assert_int_eq(tokenizer_encode(t, text, strlen(text), bos, &ids, &n), 0);
	ck_assert_msg(n == n_want, "'%s': %zu ids, want %zu", text, n, n_want);
	for (size_t i = 0; i < n; i++)
		ck_assert_msg(ids[i] == want[i], "'%s': id[%zu] = %d, want %d",
			      text, i, ids[i], want[i]);
	free(ids);
}

/* decode(encode(text)) == text, and every chunk is valid UTF-8. Without
 * BOS, SentencePiece's dummy-prefix space stays (the stream is read as a
 * continuation), so the expected text gains a leading space. */
static void assert_roundtrip(const struct tokenizer *t, const char *text0,
			     size_t len0, bool bos)
{
	bool prefix = !bos && tokenizer_kind(t) == TOKENIZER_SPM && len0;
	size_t len = len0 + prefix;
	char *text = malloc(len + 1);
	int32_t *ids;
	size_t n, dl;
	char *dec;
	struct detok d;
	const char *c;
	size_t cl, sl = 0;
	char *stream = malloc(len + 64);

	text[0] = ' ';
	memcpy(text + prefix, text0, len0);
	ck_assert_int_eq(tokenizer_encode(t, text0, len0, bos, &ids, &n), 0);
	ck_assert_int_eq(tokenizer_decode(t, ids, n, &dec, &dl), 0);
	ck_assert_msg(dl == len && !memcmp(dec, text, len),
		      "round trip of %zu bytes gave %zu bytes", len, dl);
	ck_assert_int_eq(detok_init(&d, t), 0);
	for (size_t i = 0; i <= n; i++) {
		if (i < n)
			ck_assert_int_eq(detok_push(&d, ids[i], &c, &cl), 0);
		else
			ck_assert_int_eq(detok_flush(&d, &c, &cl), 0);
		ck_assert(tokenizer_utf8_valid(c, cl));
		ck_assert_uint_le(sl + cl, len + 64);
		memcpy(stream + sl, c, cl);
		sl += cl;
	}
	ck_assert_uint_eq(sl, len);
	ck_assert(!memcmp(stream, text, len));
	detok_deinit(&d);
	detok_deinit(&d);
	free(stream);
	free(dec);
	free(ids);
	free(text);
}

/* ---- SentencePiece ------------------------------------------------------------ */

START_TEST(test_stories_golden)
{
	struct tk k;
	static const int32_t prompt[] = { 1, 403, 407, 261, 378 };
	static const int32_t out[] = { 432, 383, 286, 261, 376, 298, 315, 421,
		395, 317, 426, 338, 401, 396, 267, 337, 410, 408, 419, 292, 411,
		322, 265, 282, 295, 433, 426, 385, 328, 432, 358, 394 };
	const char *out_text = ", there was a little girl named Lily. She loved to "
			       "play outside in the park. One day, she saw";
	char *txt;
	size_t len;

	if (!tk_open_shared(&k, "stories260K.gguf"))
		return;
	ck_assert_int_eq(tokenizer_kind(k.t), TOKENIZER_SPM);
	ck_assert_uint_eq(tokenizer_n_vocab(k.t), 512);
	ck_assert_int_eq(tokenizer_bos(k.t), 1);
	ck_assert_int_eq(tokenizer_eos(k.t), 2);
	ck_assert(tokenizer_add_bos(k.t));
	assert_ids(k.t, "Once upon a time", true, prompt, 5);
	assert_ids(k.t, "Once upon a time", false, prompt + 1, 4);
	/* the output alone (a continuation: no BOS, leading text kept) */
	ck_assert_int_eq(tokenizer_decode(k.t, out, KVD_ARRAY_SIZE(out), &txt, &len), 0);
	ck_assert_str_eq(txt, out_text);
	free(txt);
	/* prompt + output: the dummy-prefix space after BOS is dropped */
	int32_t all[5 + 32];
	memcpy(all, prompt, sizeof(prompt));
	memcpy(all + 5, out, sizeof(out));
	ck_assert_int_eq(tokenizer_decode(k.t, all, 37, &txt, &len), 0);
	ck_assert_int_eq(strncmp(txt, "Once upon a time, there was", 27), 0);
	free(txt);
	/* a streamed decode gives the same text, chunk by chunk */
	struct detok d;
	const char *c;
	size_t cl;
	char acc[256] = "";
	ck_assert_int_eq(detok_init(&d, k.t), 0);
	for (size_t i = 0; i < KVD_ARRAY_SIZE(out); i++) {
		ck_assert_int_eq(detok_push(&d, out[i], &c, &cl), 0);
		strncat(acc, c, cl);
	}
	ck_assert_int_eq(detok_push(&d, 512, &c, &cl), -ERANGE);
	ck_assert_int_eq(detok_push(&d, -1, &c, &cl), -ERANGE);
	ck_assert_str_eq(acc, out_text);
	detok_deinit(&d);
	/* pieces */
	const char *p;
	size_t pl;
	ck_assert_int_eq(tokenizer_piece(k.t, 403, &p, &pl), 0);
	ck_assert_uint_eq(pl, 5);
	ck_assert_int_eq(memcmp(p, " Once", 5), 0);
	ck_assert_int_eq(tokenizer_piece(k.t, 1, &p, &pl), 0);
	ck_assert_uint_eq(pl, 0);
	ck_assert_int_eq(tokenizer_piece(k.t, 3 + '\n', &p, &pl), 0);
	ck_assert_uint_eq(pl, 1);
	ck_assert_int_eq(p[0], '\n');
	ck_assert_int_eq(tokenizer_token_type(k.t, 3), TOKEN_TYPE_BYTE);
	/* byte fallback for what the 512-token vocabulary lacks */
	assert_roundtrip(k.t, "Z\xc3\xa9\xf0\x9f\x98\x80\n\tx", 10, true);
	tk_close(&k);
}
END_TEST

START_TEST(test_llama2_vocab)
{
	struct tk k;
	static const int32_t hello[] = { 1, 15043, 3186 };
	static const int32_t nl[] = { 1, 29871, 13 };

	if (!tk_open_shared(&k, "llama-2-tiny-random.gguf"))
		return;
	ck_assert_uint_eq(tokenizer_n_vocab(k.t), 32000);
	assert_ids(k.t, "Hello world", true, hello, 3);
	assert_ids(k.t, "\n", true, nl, 3);
	assert_ids(k.t, "", true, hello, 1);
	const char *samples[] = {
		"Hello world", " leading space", "two  spaces\nand\r\nnewlines\n\n",
		"caf\xc3\xa9 na\xc3\xafve \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e",
		"emoji \xf0\x9f\x98\x80\xf0\x9f\x91\x8d\xf0\x9d\x84\x9e end",
		"<s> is text, not BOS </s>", "tabs\tand\x01control\x7f",
	};
	for (size_t i = 0; i < KVD_ARRAY_SIZE(samples); i++)
		assert_roundtrip(k.t, samples[i], strlen(samples[i]), true);
	/* "<s>" in the text never becomes the BOS id */
	int32_t *ids;
	size_t n;
	ck_assert_int_eq(tokenizer_encode(k.t, "<s></s>", 7, false, &ids, &n), 0);
	for (size_t i = 0; i < n; i++)
		ck_assert(ids[i] != 1 && ids[i] != 2);
	free(ids);
	tk_close(&k);
}
END_TEST

/* Random valid UTF-8: ASCII, 2-, 3- and 4-byte chars, spaces, newlines. */
static size_t random_utf8(uint64_t *s, char *buf, size_t max)
{
	size_t n = 0;

	while (n + 4 < max) {
		*s ^= *s << 13; *s ^= *s >> 7; *s ^= *s << 17;
		uint64_t r = *s;
		switch (r % 8) {
		case 0: buf[n++] = ' '; break;
		case 1: buf[n++] = (r >> 8) % 5 ? 'a' + (char)((r >> 16) % 26) : '\n'; break;
		case 2: buf[n++] = (char)(0x20 + (r >> 8) % 95); break;
		case 3: { /* U+0080..U+07FF */
			uint32_t cp = 0x80 + (uint32_t)((r >> 8) % 0x780);
			buf[n++] = (char)(0xc0 | (cp >> 6));
			buf[n++] = (char)(0x80 | (cp & 0x3f));
			break; }
		case 4: { /* U+0800..U+FFFF minus surrogates */
			uint32_t cp = 0x800 + (uint32_t)((r >> 8) % 0xf800);
			if (cp >= 0xd800 && cp <= 0xdfff)
				cp = 0x4e2d;
			buf[n++] = (char)(0xe0 | (cp >> 12));
			buf[n++] = (char)(0x80 | ((cp >> 6) & 0x3f));
			buf[n++] = (char)(0x80 | (cp & 0x3f));
			break; }
		case 5: { /* U+10000..U+10FFFF */
			uint32_t cp = 0x10000 + (uint32_t)((r >> 8) % 0x100000);
			buf[n++] = (char)(0xf0 | (cp >> 18));
			buf[n++] = (char)(0x80 | ((cp >> 12) & 0x3f));
			buf[n++] = (char)(0x80 | ((cp >> 6) & 0x3f));
			buf[n++] = (char)(0x80 | (cp & 0x3f));
			break; }
		default: {
			static const char *const w[] = { "the ", "time ", "Hello ", "world", "ing", "\n\n" };
			const char *x = w[(r >> 8) % 6];
			size_t l = strlen(x);
			if (n + l + 4 >= max)
				return n;
			memcpy(buf + n, x, l);
			n += l;
			break; }
		}
		if ((r >> 40) % 23 == 0)
			break;
	}
	return n;
}

START_TEST(test_llama2_random_roundtrip)
{
	struct tk k;
	char buf[512];
	uint64_t s = 0x1234567;

	if (!tk_open_shared(&k, "llama-2-tiny-random.gguf"))
		return;
	for (int i = 0; i < 300; i++) {
		size_t n = random_utf8(&s, buf, sizeof(buf));
		assert_roundtrip(k.t, buf, n, true);
		assert_roundtrip(k.t, buf, n, false);
		ck_assert(tokenizer_utf8_valid(buf, n));
	}
	tk_close(&k);
}
END_TEST

/* A long prompt encodes in O(n log n): 200 KB well within a second or so
 * (generous bound for ASan on a slow machine). */
START_TEST(test_llama2_long_prompt)
{
	struct tk k;
	size_t len = 200000, n;
	char *text = malloc(len);
	uint64_t s = 99;
	int32_t *ids;

	if (!tk_open_shared(&k, "llama-2-tiny-random.gguf")) {
		free(text);
		return;
	}
	for (size_t i = 0; i < len;) {
		size_t m = random_utf8(&s, text + i, KVD_MIN(len - i, 200));
		i += m ? m : 1;
		if (!m)
			text[i - 1] = 'x';
	}
	/* one long "word" too: no spaces to bound the merges */
	memset(text + len / 2, 'a', 20000);
	struct timespec a, b;
	clock_gettime(CLOCK_MONOTONIC, &a);
	ck_assert_int_eq(tokenizer_encode(k.t, text, len, true, &ids, &n), 0);
	clock_gettime(CLOCK_MONOTONIC, &b);
	double sec = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) / 1e9;
	fprintf(stderr, "encode 200 KB -> %zu tokens in %.3f s\n", n, sec);
	ck_assert_double_lt(sec, 20.0);
	ck_assert_uint_gt(n, 20000);
	char *dec;
	size_t dl;
	ck_assert_int_eq(tokenizer_decode(k.t, ids, n, &dec, &dl), 0);
	ck_assert_uint_eq(dl, len);
	ck_assert(!memcmp(dec, text, len));
	free(dec);
	free(ids);
	free(text);
	tk_close(&k);
}
END_TEST

/* Random byte tokens (and others) never make the stream carry invalid
 * UTF-8, and the stream equals the whole-sequence decode. */
START_TEST(test_detok_random_bytes)
{
	struct tk k;
	uint64_t s = 424242;
	struct detok d;

	tk_open_gen(&k, GGUF_VOCAB_LLAMA, 400);
	ck_assert_int_eq(detok_init(&d, k.t), 0);
	for (int round = 0; round < 2000; round++) {
		int32_t ids[24];
		size_t n = 1 + round % 24, tl, sl = 0;
		char stream[24 * 64], *whole;
		const char *c;
		size_t cl;
		for (size_t i = 0; i < n; i++) {
			s ^= s << 13; s ^= s >> 7; s ^= s << 17;
			/* mostly byte tokens 3..258, leaning on 0x80..0xff */
			ids[i] = (s % 8) ? 3 + (int32_t)(0x80 + (s >> 8) % 0x80)
					 : (int32_t)((s >> 8) % 400);
			if ((s >> 20) % 5 == 0)
				ids[i] = 3 + (int32_t)((s >> 24) % 0x100);
		}
		for (size_t i = 0; i <= n; i++) {
			if (i < n)
				ck_assert_int_eq(detok_push(&d, ids[i], &c, &cl), 0);
			else
				ck_assert_int_eq(detok_flush(&d, &c, &cl), 0);
			ck_assert(tokenizer_utf8_valid(c, cl));
			memcpy(stream + sl, c, cl);
			sl += cl;
		}
		ck_assert_int_eq(tokenizer_decode(k.t, ids, n, &whole, &tl), 0);
		ck_assert(tokenizer_utf8_valid(whole, tl));
		ck_assert_uint_eq(tl, sl);
		ck_assert(!memcmp(whole, stream, sl));
		free(whole);
	}
	detok_deinit(&d);
	tk_close(&k);
}
END_TEST

/* A 4-byte char split over four byte tokens comes out whole, once. */
START_TEST(test_detok_split_char)
{
	struct tk k;
	struct detok d;
	const char *c;
	size_t cl;
	static const uint8_t g[4] = { 0xf0, 0x9f, 0x98, 0x80 };

	tk_open_gen(&k, GGUF_VOCAB_LLAMA, 400);
	ck_assert_int_eq(detok_init(&d, k.t), 0);
	for (int i = 0; i < 4; i++) {
		ck_assert_int_eq(detok_push(&d, 3 + g[i], &c, &cl), 0);
		ck_assert_uint_eq(cl, i == 3 ? 4 : 0);
	}
	ck_assert_int_eq(memcmp(c, g, 4), 0);
	/* an interrupted sequence: U+FFFD, then the ASCII that broke it */
	ck_assert_int_eq(detok_push(&d, 3 + 0xe6, &c, &cl), 0);
	ck_assert_uint_eq(cl, 0);
	ck_assert_int_eq(detok_push(&d, 3 + 'A', &c, &cl), 0);
	ck_assert_uint_eq(cl, 4);
	ck_assert_int_eq(memcmp(c, "\xef\xbf\xbd" "A", 4), 0);
	/* overlong and surrogate leads are refused */
	ck_assert_int_eq(detok_push(&d, 3 + 0xc0, &c, &cl), 0);
	ck_assert_uint_eq(cl, 3);
	ck_assert_int_eq(detok_push(&d, 3 + 0xed, &c, &cl), 0);
	ck_assert_int_eq(detok_push(&d, 3 + 0xa0, &c, &cl), 0);
	ck_assert(tokenizer_utf8_valid(c, cl));
	ck_assert_int_eq(detok_push(&d, 3 + 0xf0, &c, &cl), 0);
	ck_assert_int_eq(detok_flush(&d, &c, &cl), 0);
	ck_assert_uint_eq(cl, 3);
	/* BOS then "▁x": the first piece after BOS loses its space */
	ck_assert_int_eq(detok_push(&d, 1, &c, &cl), 0);
	ck_assert_uint_eq(cl, 0);
	int32_t sp = -1;
	for (uint32_t id = 259; id < tokenizer_n_vocab(k.t) && sp < 0; id++) {
		const char *p;
		size_t pl;
		tokenizer_piece(k.t, (int32_t)id, &p, &pl);
		if (pl == 2 && p[0] == ' ' && p[1] == 't')
			sp = (int32_t)id;
	}
	ck_assert_int_ge(sp, 0);
	ck_assert_int_eq(detok_push(&d, sp, &c, &cl), 0);
	ck_assert_uint_eq(cl, 1);
	ck_assert_int_eq(c[0], 't');
	ck_assert_int_eq(detok_push(&d, sp, &c, &cl), 0);
	ck_assert_uint_eq(cl, 2);
	detok_deinit(&d);
	ck_assert(!tokenizer_utf8_valid("\xc0\x80", 2));
	ck_assert(!tokenizer_utf8_valid("\xed\xa0\x80", 3));
	ck_assert(!tokenizer_utf8_valid("\xf4\x90\x80\x80", 4));
	ck_assert(!tokenizer_utf8_valid("\xe6\x97", 2));
	ck_assert(tokenizer_utf8_valid("\xf4\x8f\xbf\xbf", 4));
	tk_close(&k);
}
END_TEST

START_TEST(test_generated_spm)
{
	struct tk k;
	int32_t *ids;
	size_t n;
	const char *p;
	size_t pl;

	tk_open_gen(&k, GGUF_VOCAB_LLAMA, 1000);
	/* "the" is one piece of the generated vocabulary: "▁the" */
	ck_assert_int_eq(tokenizer_encode(k.t, "the", 3, true, &ids, &n), 0);
	ck_assert_uint_eq(n, 2);
	ck_assert_int_eq(ids[0], 1);
	ck_assert_int_eq(tokenizer_token_text(k.t, ids[1], &p, &pl), 0);
	ck_assert_uint_eq(pl, 6);
	ck_assert_int_eq(memcmp(p, "\xe2\x96\x81the", 6), 0);
	free(ids);
	uint64_t s = 77;
	char buf[400];
	for (int i = 0; i < 100; i++) {
		size_t m = random_utf8(&s, buf, sizeof(buf));
		assert_roundtrip(k.t, buf, m, true);
	}
	tk_close(&k);
}
END_TEST

/* ---- byte-level BPE ----------------------------------------------------------- */

/* Encode and return the pieces joined by '|'. */
static char *bpe_pieces(const struct tokenizer *t, const char *text)
{
	int32_t *ids;
	size_t n, o = 0;
	char *out = malloc(4096);

	ck_assert_int_eq(tokenizer_encode(t, text, strlen(text), false, &ids, &n), 0);
	for (size_t i = 0; i < n; i++) {
		const char *p;
		size_t pl;
		ck_assert_int_eq(tokenizer_piece(t, ids[i], &p, &pl), 0);
		if (i)
			out[o++] = '|';
		memcpy(out + o, p, pl);
		o += pl;
	}
	out[o] = 0;
	free(ids);
	return out;
}

START_TEST(test_gpt2)
{
	struct tk k;
	char *s;

	tk_open_gen(&k, GGUF_VOCAB_GPT2, 1500);
	ck_assert_int_eq(tokenizer_kind(k.t), TOKENIZER_BPE);
	ck_assert(!tokenizer_add_bos(k.t));
	ck_assert_int_eq(tokenizer_bos(k.t), 1499);
	/* whole words are single tokens; the space belongs to the word after */
	s = bpe_pieces(k.t, "the cat said big");
	ck_assert_str_eq(s, "the| cat| said| big");
	free(s);
	/* two spaces: the run leaves its last space to the next word */
	s = bpe_pieces(k.t, "the  cat");
	ck_assert_str_eq(s, "the| | cat");
	free(s);
	/* a contraction is its own word; punctuation runs; digit runs */
	s = bpe_pieces(k.t, "it's  big!!");
	ck_assert_str_eq(s, "it|'|s| | big|!|!");
	free(s);
	/* the merges never cross a word boundary: "dog" merges inside
	 * " dog" only with the space in front of it */
	s = bpe_pieces(k.t, "mydog");
	ck_assert(strstr(s, " dog") == NULL);
	free(s);
	/* BOS only when asked */
	int32_t *ids;
	size_t n;
	ck_assert_int_eq(tokenizer_encode(k.t, "the", 3, true, &ids, &n), 0);
	ck_assert_uint_eq(n, 2);
	ck_assert_int_eq(ids[0], 1499);
	free(ids);
	/* any bytes round-trip (all 256 byte chars are tokens) */
	uint64_t r = 5;
	char buf[300];
	for (int i = 0; i < 200; i++) {
		size_t m = random_utf8(&r, buf, sizeof(buf));
		assert_roundtrip(k.t, buf, m, false);
	}
	const char raw[] = "\xff\xfe bad \xc3 utf8 \x80";
	ck_assert_int_eq(tokenizer_encode(k.t, raw, sizeof(raw) - 1, false, &ids, &n), 0);
	char *dec;
	size_t dl;
	ck_assert_int_eq(tokenizer_decode(k.t, ids, n, &dec, &dl), 0);
	ck_assert(tokenizer_utf8_valid(dec, dl)); /* replaced, never raw */
	free(dec);
	free(ids);
	tk_close(&k);
}
END_TEST

/* Hand-made BPE vocabularies exercising the Llama-3 pre-tokenizer and
 * merge ranks. */
static void tk_open_bpe(struct tk *k, const char *pre, const char *const *toks,
			size_t n_tok, const char *const *merges, size_t n_merge)
{
	struct gguf_writer *w = NULL;
	struct gguf_error err;
	size_t size;

	*k = (struct tk){ 0 };
	ck_assert_int_eq(gguf_writer_new(&w, 32), 0);
	ck_assert_int_eq(gguf_writer_add_str(w, "tokenizer.ggml.model", "gpt2"), 0);
	if (pre)
		ck_assert_int_eq(gguf_writer_add_str(w, "tokenizer.ggml.pre", pre), 0);
	ck_assert_int_eq(gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", toks, n_tok), 0);
	ck_assert_int_eq(gguf_writer_add_arr_str(w, "tokenizer.ggml.merges", merges, n_merge), 0);
	k->mem = writer_mem(w, &size);
	gguf_writer_free(w);
	ck_assert_int_eq(gguf_open_mem(&k->f, k->mem, size, &err), 0);
	ck_assert_msg(tokenizer_new(&k->t, k->f, &err) == 0, "%s", err.msg);
}

START_TEST(test_bpe_ranks_and_pre)
{
	/* byte chars for the letters used, plus merged pieces */
	const char *toks[] = { "a", "b", "c", "1", "2", "3", "4", "\xc4\xa0",
			       "\xc4\x8a", "!", "(", "ab", "bc", "abc",
			       "\xc4\xa0" "a", "12", "123", "1234", "(a" };
	/* "b c" outranks "a b": "abc" must merge as a + bc -> no "a bc"
	 * merge, so it stays a|bc */
	const char *merges[] = { "b c", "a b", "1 2", "12 3", "123 4",
				 "\xc4\xa0 a", "( a" };
	struct tk k;
	char *s;

	tk_open_bpe(&k, NULL, toks, KVD_ARRAY_SIZE(toks), merges, KVD_ARRAY_SIZE(merges));
	s = bpe_pieces(k.t, "abc");
	ck_assert_str_eq(s, "a|bc");
	free(s);
	s = bpe_pieces(k.t, "1234"); /* GPT-2: one digit run */
	ck_assert_str_eq(s, "1234");
	free(s);
	s = bpe_pieces(k.t, "(a");   /* GPT-2: punctuation and letters split */
	ck_assert_str_eq(s, "(|a");
	free(s);
	tk_close(&k);

	tk_open_bpe(&k, "llama-bpe", toks, KVD_ARRAY_SIZE(toks), merges, KVD_ARRAY_SIZE(merges));
	s = bpe_pieces(k.t, "1234"); /* Llama-3: digits in threes */
	ck_assert_str_eq(s, "123|4");
	free(s);
	s = bpe_pieces(k.t, "(a");   /* Llama-3: one leading non-letter joins */
	ck_assert_str_eq(s, "(a");
	free(s);
	s = bpe_pieces(k.t, "a \n\n a");
	ck_assert_str_eq(s, "a| |\n|\n| a");
	free(s);
	tk_close(&k);

	tk_open_bpe(&k, "smollm", toks, KVD_ARRAY_SIZE(toks), merges, KVD_ARRAY_SIZE(merges));
	s = bpe_pieces(k.t, "1234"); /* SmolLM: every digit alone */
	ck_assert_str_eq(s, "1|2|3|4");
	free(s);
	tk_close(&k);
}
END_TEST

/* Rule-derived cases on a tiny vocabulary whose merges only join
 * characters inside one pre-tokenizer word, so the pieces show the split:
 * "Ġ Ġ" joins spaces, "Ġ b" a space to a letter, "1 2"/"12 3" digits,
 * "Ù £" the two bytes of U+0663 ARABIC-INDIC DIGIT THREE (D9 A3),
 * "ĠĠ Ċ" two spaces to a newline, "a A" and "A b" letters (the first
 * outranks), "Â ¿" the two bytes of U+00BF (C2 BF) and "Â¿ a" that to a
 * letter. */
START_TEST(test_bpe_rules)
{
	const char *toks[] = { "a", "b", "1", "2", "3", "\xc4\xa0", "\xc4\x8a",
			       "\xc3\x99", "\xc2\xa3", "\xc4\xa0\xc4\xa0",
			       "\xc4\xa0" "b", "12", "123", "\xc3\x99\xc2\xa3",
			       "\xc3\x99\xc2\xa3\xc3\x99\xc2\xa3",
			       "\xc4\xa0\xc4\xa0\xc4\x8a", "A", "aA", "Ab",
			       "\xc3\x82", "\xc2\xbf", "\xc3\x82\xc2\xbf",
			       "\xc3\x82\xc2\xbf" "a" };
	const char *merges[] = { "\xc4\xa0 \xc4\xa0", "\xc4\xa0 b", "1 2", "12 3",
				 "\xc3\x99 \xc2\xa3",
				 "\xc3\x99\xc2\xa3 \xc3\x99\xc2\xa3",
				 "\xc4\xa0\xc4\xa0 \xc4\x8a", "a A", "A b",
				 "\xc3\x82 \xc2\xbf", "\xc3\x82\xc2\xbf a" };
	struct {
		const char *pre, *text, *want;
	} cases[] = {
		/* \p{N}{1,3}: a long digit run in threes */
		{ "llama-bpe", "1231231", "123|123|1" },
		/* \p{N}: every digit alone */
		{ "qwen2", "123", "1|2|3" },
		/* \s+(?!\S): the run leaves its last space to the word */
		{ "llama-bpe", "a   b", "a|  | b" },
		{ "gpt-2", "a   b", "a|  | b" },
		/* U+0663 is a number (Nd), not a letter: split from "a",
		 * and one per word under qwen2 */
		{ "gpt-2", "a\xd9\xa3\xd9\xa3", "a|\xd9\xa3\xd9\xa3" },
		{ "qwen2", "a\xd9\xa3\xd9\xa3", "a|\xd9\xa3|\xd9\xa3" },
		/* starcoder: digits alone first, then GPT-2's rule */
		{ "starcoder", " 123", " |1|2|3" },
		/* falcon: [0-9]{3} groups after GPT-2's digit runs */
		{ "falcon", "1231", "123|1" },
		/* Llama 3: \s*[\r\n]+ keeps spaces before a newline with it;
		 * GPT-2 leaves them apart (its \s+(?!\S) ends at the run) */
		{ "llama-bpe", "a  \n", "a|  \n" },
		{ "gpt-2", "a  \nb", "a|  |\n|b" },
		/* "aAb": one \p{L}+ word for Llama 3, where "a A" outranks
		 * "A b"; Tekken's words are UP*LO+ ("a", then "Ab") */
		{ "llama-bpe", "aAb", "aA|b" },
		{ "tekken", "aAb", "a|Ab" },
		/* Tekken: \p{N} one digit a word */
		{ "tekken", "123", "1|2|3" },
		/* GLM-4 and ChatGLM: Llama 3's rule, digits in threes */
		{ "glm4", "1231231", "123|123|1" },
		{ "chatglm-bpe", "a   b", "a|  | b" },
		/* Command-R: StarCoder's, every digit alone */
		{ "command-r", " 123", " |1|2|3" },
		/* U+00BF (C2 BF, Po) may lead a word in Llama 3
		 * ([^\r\n\p{L}\p{N}]?\p{L}+) but not in DeepSeek V3, whose
		 * prefix excludes \p{P} and whose ASCII rule is [!-~] only */
		{ "llama-bpe", "\xc2\xbf" "a", "\xc2\xbf" "a" },
		{ "deepseek-v3", "\xc2\xbf" "a", "\xc2\xbf|a" },
		/* DeepSeek V3: \p{N}{1,3} first */
		{ "deepseek-v3", "1231", "123|1" },
	};

	for (size_t i = 0; i < KVD_ARRAY_SIZE(cases); i++) {
		struct tk k;
		char *s;

		tk_open_bpe(&k, cases[i].pre, toks, KVD_ARRAY_SIZE(toks), merges,
			    KVD_ARRAY_SIZE(merges));
		s = bpe_pieces(k.t, cases[i].text);
		ck_assert_msg(!strcmp(s, cases[i].want), "%s '%s': got '%s' want '%s'",
			      cases[i].pre, cases[i].text, s, cases[i].want);
		free(s);
		tk_close(&k);
	}
}
END_TEST

/* ---- refused vocabularies ------------------------------------------------------- */

static int tok_from(struct gguf_writer *w, struct gguf_error *err)
{
	size_t size;
	uint8_t *mem = writer_mem(w, &size);
	struct gguf_file *f = NULL;
	struct tokenizer *t = NULL;
	int rc;

	gguf_writer_free(w);
	ck_assert_int_eq(gguf_open_mem(&f, mem, size, err), 0);
	rc = tokenizer_new(&t, f, err);
	ck_assert(rc != 0 || t != NULL);
	tokenizer_free(t);
	gguf_close(f);
	free(mem);
	return rc;
}

START_TEST(test_bad_vocab)
{
	struct gguf_writer *w;
	struct gguf_error err;
	const char *toks[] = { "<unk>", "<s>", "</s>", "a" };
	float scores[3] = { 0, 0, 0 };

	gguf_writer_new(&w, 0);
	ck_assert_int_eq(tok_from(w, &err), GGUF_E_MISSING);
	ck_assert_ptr_nonnull(strstr(err.msg, "tokenizer.ggml.model"));

	gguf_writer_new(&w, 0);
	gguf_writer_add_str(w, "tokenizer.ggml.model", "bert");
	gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", toks, 4);
	ck_assert_int_eq(tok_from(w, &err), GGUF_E_UNSUPPORTED);
	ck_assert_ptr_nonnull(strstr(err.msg, "bert"));

	gguf_writer_new(&w, 0);
	gguf_writer_add_str(w, "tokenizer.ggml.model", "llama");
	ck_assert_int_eq(tok_from(w, &err), GGUF_E_MISSING);
	ck_assert_ptr_nonnull(strstr(err.msg, "tokenizer.ggml.tokens"));

	gguf_writer_new(&w, 0);
	gguf_writer_add_str(w, "tokenizer.ggml.model", "llama");
	gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", toks, 4);
	gguf_writer_add_arr(w, "tokenizer.ggml.scores", GGUF_VT_FLOAT32, scores, 3);
	ck_assert_int_eq(tok_from(w, &err), GGUF_E_MALFORMED);
	ck_assert_ptr_nonnull(strstr(err.msg, "scores"));

	gguf_writer_new(&w, 0);
	gguf_writer_add_str(w, "tokenizer.ggml.model", "llama");
	gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", toks, 4);
	gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", 4);
	ck_assert_int_eq(tok_from(w, &err), GGUF_E_MALFORMED);
	ck_assert_ptr_nonnull(strstr(err.msg, "bos_token_id"));

	gguf_writer_new(&w, 0);
	gguf_writer_add_str(w, "tokenizer.ggml.model", "llama");
	gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", toks, 4);
	gguf_writer_add_str(w, "tokenizer.ggml.add_bos_token", "yes");
	ck_assert_int_eq(tok_from(w, &err), GGUF_E_TYPE);

	const char *bad_merges[] = { "a b", "ab" };
	gguf_writer_new(&w, 0);
	gguf_writer_add_str(w, "tokenizer.ggml.model", "gpt2");
	gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", toks, 4);
	gguf_writer_add_arr_str(w, "tokenizer.ggml.merges", bad_merges, 2);
	ck_assert_int_eq(tok_from(w, &err), GGUF_E_MALFORMED);
	ck_assert_ptr_nonnull(strstr(err.msg, "merge 1"));

	gguf_writer_new(&w, 0);
	gguf_writer_add_str(w, "tokenizer.ggml.model", "gpt2");
	gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", toks, 4);
	ck_assert_int_eq(tok_from(w, &err), GGUF_E_MISSING);

	/* an unknown pre-tokenizer is refused by name, never guessed */
	const char *merges[] = { "a b" };
	gguf_writer_new(&w, 0);
	gguf_writer_add_str(w, "tokenizer.ggml.model", "gpt2");
	gguf_writer_add_str(w, "tokenizer.ggml.pre", "no-such-pre");
	gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", toks, 4);
	gguf_writer_add_arr_str(w, "tokenizer.ggml.merges", merges, 1);
	ck_assert_int_eq(tok_from(w, &err), GGUF_E_UNSUPPORTED);
	ck_assert_ptr_nonnull(strstr(err.msg, "no-such-pre"));

	/* a minimal SPM vocabulary without scores or types still works */
	gguf_writer_new(&w, 0);
	gguf_writer_add_str(w, "tokenizer.ggml.model", "llama");
	gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", toks, 4);
	ck_assert_int_eq(tok_from(w, &err), 0);
}
END_TEST

int main(void)
{
	const char *sh = getenv("KVD_SHARED");
	Suite *s = suite_create("tokenizer");
	TCase *tc = tcase_create("core");
	SRunner *sr;
	int failed;

	snprintf(shared_dir, sizeof(shared_dir), "%s", sh ? sh : "../shared");
	tcase_set_timeout(tc, 600);
	tcase_add_test(tc, test_stories_golden);
	tcase_add_test(tc, test_llama2_vocab);
	tcase_add_test(tc, test_llama2_random_roundtrip);
	tcase_add_test(tc, test_llama2_long_prompt);
	tcase_add_test(tc, test_detok_random_bytes);
	tcase_add_test(tc, test_detok_split_char);
	tcase_add_test(tc, test_generated_spm);
	tcase_add_test(tc, test_gpt2);
	tcase_add_test(tc, test_bpe_ranks_and_pre);
	tcase_add_test(tc, test_bpe_rules);
	tcase_add_test(tc, test_bad_vocab);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
