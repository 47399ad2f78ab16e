/* bench_tok.c - tokenizer throughput on a large mixed text.
 *
 *   bench_tok VOCAB.gguf [--mib N] [--runs R] [--text-out F] [--ids-out F]
 *             [--json-out F]
 *
 * Builds N MiB (default 4) of text from a fixed seed, mixing English
 * prose, C code, digit runs of 1-40 digits, Chinese and Japanese, Cyrillic
 * and accented Latin, emoji (single, skin tones, ZWJ families, flags) and
 * whitespace runs (spaces, tabs, newlines), then encodes it R times
 * (default 5) without BOS and prints the median MB/s with the min-max, the
 * token count and bytes per token. --text-out writes the text,
 * --ids-out the ids (one line, space-separated), --json-out a llama-server
 * /tokenize request body for the same text, so bench_tok.sh can time
 * llama.cpp on it and compare ids.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu/gguf/gguf.h"
#include "gpu/text/tokenizer.h"

static const char *const prose[] = {
	"The quick brown fox jumps over the lazy dog. ",
	"It was the best of times, it was the worst of times; ",
	"She said: \"I'll be there by 5 o'clock, won't you?\" ",
	"Tokenizers split text into pieces that a model has seen before. ",
	"Mr. O'Neil's co-worker didn't re-read the well-known README. ",
};
static const char *const code[] = {
	"int main(int argc, char **argv)\n{\n\treturn argc > 1 ? atoi(argv[1]) : 0;\n}\n",
	"for (size_t i = 0; i < n; i++)\n\tsum += a[i] * b[i];\n",
	"def f(x):\n    return {k: v ** 2 for k, v in x.items() if v != None}\n",
	"if (rc < 0 && errno == EINTR) { /* retry */ continue; }\n",
};
static const char *const other[] = {
	"今天天气很好，我们去公园散步吧。", "東京は日本の首都です。ひらがなとカタカナ。",
	"Привет, как дела? Всё хорошо. ", "Ça coûte 12,50 € — déjà vu, naïve café. ",
	"😀 👍🏽 👨‍👩‍👧‍👦 🇩🇪🇯🇵 ❤️ ✨ ", "한국어 문장도 있습니다. ",
};
static const char *const spaces[] = {
	" ", "  ", "    ", "\t", "\t\t", "\n", "\n\n", " \n ", "        \n\t  ",
};

static uint64_t rng = 0x2545f4914f6cdd1dull;

static uint32_t next(uint32_t n)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (uint32_t)(rng % n);
}

#define PICK(a) (a)[next(sizeof(a) / sizeof((a)[0]))]

/* Append s to buf (cap bytes), whole or not at all. */
static size_t put(char *buf, size_t len, size_t cap, const char *s)
{
	size_t n = strlen(s);

	if (len + n > cap)
		return len;
	memcpy(buf + len, s, n);
	return len + n;
}

static size_t make_text(char *buf, size_t cap)
{
	size_t len = 0, last = (size_t)-1;

	while (len != last) {
		char digits[48];
		uint32_t nd;

		last = len;
		switch (next(5)) {
		case 0: len = put(buf, len, cap, PICK(prose)); break;
		case 1: len = put(buf, len, cap, PICK(code)); break;
		case 2:
			nd = 1 + next(40);
			for (uint32_t i = 0; i < nd; i++)
				digits[i] = (char)('0' + next(10));
			digits[nd] = ' ';
			digits[nd + 1] = 0;
			len = put(buf, len, cap, digits);
			break;
		case 3: len = put(buf, len, cap, PICK(other)); break;
		default: len = put(buf, len, cap, PICK(spaces)); break;
		}
		if (len == last && cap - len > 64)
			last = (size_t)-1; /* that piece did not fit; try another */
	}
	return len;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static int write_json(const char *path, const char *text, size_t len)
{
	FILE *fp = fopen(path, "w");

	if (!fp)
		return -1;
	fputs("{\"add_special\":false,\"parse_special\":false,\"content\":\"", fp);
	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)text[i];

		if (c == '"' || c == '\\')
			fprintf(fp, "\\%c", c);
		else if (c < 0x20)
			fprintf(fp, "\\u%04x", c);
		else
			fputc(c, fp);
	}
	fputs("\"}", fp);
	return fclose(fp);
}

int main(int argc, char **argv)
{
	const char *vocab = NULL, *text_out = NULL, *ids_out = NULL, *json_out = NULL;
	unsigned mib = 4, runs = 5;
	struct gguf_error err;
	struct gguf_file *f;
	struct tokenizer *t;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--mib") && i + 1 < argc)
			mib = (unsigned)atoi(argv[++i]);
		else if (!strcmp(argv[i], "--runs") && i + 1 < argc)
			runs = (unsigned)atoi(argv[++i]);
		else if (!strcmp(argv[i], "--text-out") && i + 1 < argc)
			text_out = argv[++i];
		else if (!strcmp(argv[i], "--ids-out") && i + 1 < argc)
			ids_out = argv[++i];
		else if (!strcmp(argv[i], "--json-out") && i + 1 < argc)
			json_out = argv[++i];
		else if (argv[i][0] != '-' && !vocab)
			vocab = argv[i];
		else {
			vocab = NULL;
			break;
		}
	}
	if (!vocab || mib < 1 || mib > 256 || runs < 1 || runs > 100) {
		fprintf(stderr, "usage: bench_tok VOCAB.gguf [--mib 1..256] [--runs 1..100] "
				"[--text-out F] [--ids-out F] [--json-out F]\n");
		return 2;
	}
	if (gguf_open(&f, vocab, &err)) {
		fprintf(stderr, "bench_tok: %s: %s\n", vocab, err.msg);
		return 1;
	}
	if (tokenizer_new(&t, f, &err)) {
		fprintf(stderr, "bench_tok: %s: %s\n", vocab, err.msg);
		gguf_close(f);
		return 1;
	}

	size_t cap = (size_t)mib << 20, len;
	char *text = malloc(cap);
	double *sec = calloc(runs, sizeof(double));
	int32_t *ids = NULL;
	size_t n_ids = 0;
	int rc = 0;

	if (!text || !sec) {
		fprintf(stderr, "bench_tok: out of memory\n");
		return 1;
	}
	len = make_text(text, cap);
	for (unsigned r = 0; r < runs && !rc; r++) {
		double t0 = now_s();

		free(ids);
		ids = NULL;
		rc = tokenizer_encode(t, text, len, false, &ids, &n_ids);
		sec[r] = now_s() - t0;
	}
	if (rc) {
		fprintf(stderr, "bench_tok: encode: error %d\n", rc);
		return 1;
	}
	qsort(sec, runs, sizeof(double), cmp_double);
	printf("%.2f MB/s (%.2f-%.2f), %zu bytes, %zu tokens, %.2f bytes/token\n",
	       (double)len / 1e6 / sec[runs / 2], (double)len / 1e6 / sec[runs - 1],
	       (double)len / 1e6 / sec[0], len, n_ids, (double)len / (double)n_ids);
	if (text_out) {
		FILE *fp = fopen(text_out, "w");

		if (!fp || fwrite(text, 1, len, fp) != len || fclose(fp))
			rc = 1;
	}
	if (ids_out) {
		FILE *fp = fopen(ids_out, "w");

		for (size_t i = 0; fp && i < n_ids; i++)
			fprintf(fp, i ? " %d" : "%d", ids[i]);
		if (!fp || fputc('\n', fp) == EOF || fclose(fp))
			rc = 1;
	}
	if (json_out && write_json(json_out, text, len))
		rc = 1;
	if (rc)
		fprintf(stderr, "bench_tok: could not write an output file\n");
	free(ids);
	free(sec);
	free(text);
	tokenizer_free(t);
	gguf_close(f);
	return rc;
}
