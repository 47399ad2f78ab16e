/* test_vocab.c - llama.cpp's tokenizer test suite, run as its README says.
 *
 * Every ggml-vocab-NAME.gguf in $KVD_SHARED/vocab has NAME.gguf.inp (inputs
 * separated by "\n__ggml_vocab_test__\n", kept byte for byte) and
 * NAME.gguf.out (one line of expected ids per input). Each input is
 * encoded with no BOS and no special-token parsing and compared with its
 * line; then detokenize(tokenize(s)) must give s back (SentencePiece's
 * dummy-prefix space aside; skipped where the ids hold the unknown
 * token, which cannot round-trip).
 *
 * Per-file pass counts are printed. A file whose tokenizer family kvd
 * implements (expect_all) must pass every case; the rest are reported.
 * Exits 77 when the folder is absent.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conf/util.h"
#include "gpu/gguf/gguf.h"
#include "gpu/text/tokenizer.h"

#define SEP "\n__ggml_vocab_test__\n"

/* Files kvd must get fully right. */
static const char *const expect_all[] = {
	"llama-spm", "phi-3", "gpt-2", "llama-bpe", "qwen2", "deepseek-llm",
	"deepseek-coder", "starcoder", "refact", "falcon", "mpt",
};

static char *slurp(const char *path, size_t *len)
{
	FILE *fp = fopen(path, "rb");
	char *buf = NULL;
	size_t cap = 0, n = 0, r;

	if (!fp)
		return NULL;
	do {
		if (n + 65536 > cap) {
			cap = 2 * cap + 65536;
			buf = realloc(buf, cap + 1);
			if (!buf)
				abort();
		}
		r = fread(buf + n, 1, cap - n, fp);
		n += r;
	} while (r);
	fclose(fp);
	buf[n] = 0;
	*len = n;
	return buf;
}

static bool ids_match(const int32_t *ids, size_t n, const char *line)
{
	size_t k = 0;
	char *end;

	for (const char *p = line; *p;) {
		if (*p == ' ') {
			p++;
			continue;
		}
		long v = strtol(p, &end, 10);
		if (end == p || k >= n || ids[k] != v)
			return false;
		k++;
		p = end;
	}
	return k == n;
}

static void print_ids(const char *what, const int32_t *ids, size_t n)
{
	fprintf(stderr, "    %s:", what);
	for (size_t i = 0; i < n; i++)
		fprintf(stderr, " %d", ids[i]);
	fprintf(stderr, "\n");
}

static bool roundtrip_ok(const struct tokenizer *t, const char *s, size_t len,
			 const int32_t *ids, size_t n)
{
	char *out;
	size_t olen;
	bool ok;

	for (size_t i = 0; i < n; i++)
		if (ids[i] == tokenizer_unk(t))
			return true; /* the vocabulary cannot give it back */
	if (tokenizer_decode(t, ids, n, &out, &olen))
		return false;
	/* SentencePiece's dummy prefix: without BOS the space stays. */
	if (tokenizer_kind(t) == TOKENIZER_SPM && olen == len + 1 &&
	    out[0] == ' ')
		ok = !memcmp(out + 1, s, len);
	else
		ok = olen == len && !memcmp(out, s, len);
	free(out);
	return ok;
}

struct counts {
	unsigned n, pass, rt_pass;
};

/* Run one NAME.gguf; 0, or -1 when the file could not be read at all. */
static int vocab_run(const char *dir, const char *name, struct counts *c)
{
	char path[1200];
	struct gguf_file *f = NULL;
	struct tokenizer *t = NULL;
	struct gguf_error err;
	size_t in_len, out_len;
	char *in, *out;

	*c = (struct counts){ 0 };
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	if (gguf_open(&f, path, &err)) {
		fprintf(stderr, "%s: %s\n", name, err.msg);
		return -1;
	}
	if (tokenizer_new(&t, f, &err)) {
		fprintf(stderr, "%s: %s\n", name, err.msg);
		gguf_close(f);
		return -1;
	}
	snprintf(path, sizeof(path), "%s/%s.inp", dir, name);
	in = slurp(path, &in_len);
	snprintf(path, sizeof(path), "%s/%s.out", dir, name);
	out = slurp(path, &out_len);
	if (!in || !out) {
		fprintf(stderr, "%s: .inp or .out missing\n", name);
		free(in);
		free(out);
		tokenizer_free(t);
		gguf_close(f);
		return -1;
	}
	char *p = in, *line = out, *sep;
	while ((sep = memmem(p, (size_t)(in + in_len - p), SEP, strlen(SEP)))) {
		size_t len = (size_t)(sep - p);
		char *nl = strchr(line, '\n');
		int32_t *ids = NULL;
		size_t n = 0;

		if (nl)
			*nl = 0;
		c->n++;
		if (tokenizer_encode(t, p, len, false, &ids, &n) == 0) {
			if (ids_match(ids, n, line)) {
				c->pass++;
			} else if (getenv("KVD_VOCAB_VERBOSE")) {
				fprintf(stderr, "  %s case %u: '%.*s'\n    want: %s\n",
					name, c->n, (int)len, p, line);
				print_ids("got ", ids, n);
			}
			if (roundtrip_ok(t, p, len, ids, n))
				c->rt_pass++;
			else
				fprintf(stderr, "  %s case %u: round trip differs\n",
					name, c->n);
		}
		free(ids);
		p = sep + strlen(SEP);
		line = nl ? nl + 1 : line + strlen(line);
	}
	free(in);
	free(out);
	tokenizer_free(t);
	gguf_close(f);
	return 0;
}

static bool must_pass(const char *name)
{
	for (size_t i = 0; i < KVD_ARRAY_SIZE(expect_all); i++) {
		size_t l = strlen(expect_all[i]);
		if (!strncmp(name + strlen("ggml-vocab-"), expect_all[i], l) &&
		    !strcmp(name + strlen("ggml-vocab-") + l, ".gguf"))
			return true;
	}
	return false;
}

static int name_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(void)
{
	const char *sh = getenv("KVD_SHARED");
	char dir[1024];
	char *names[256];
	size_t n_names = 0;
	int failed = 0;
	struct dirent *de;
	DIR *d;

	snprintf(dir, sizeof(dir), "%s/vocab", sh ? sh : "../shared");
	if (!(d = opendir(dir))) {
		fprintf(stderr, "skip: %s absent\n", dir);
		return 77;
	}
	while ((de = readdir(d)) && n_names < KVD_ARRAY_SIZE(names)) {
		size_t l = strlen(de->d_name);
		if (!strncmp(de->d_name, "ggml-vocab-", 11) && l > 5 &&
		    !strcmp(de->d_name + l - 5, ".gguf"))
			names[n_names++] = strdup(de->d_name);
	}
	closedir(d);
	qsort(names, n_names, sizeof(*names), name_cmp);
	for (size_t i = 0; i < n_names; i++) {
		struct counts c;
		bool must = must_pass(names[i]);
		int rc = vocab_run(dir, names[i], &c);
		bool ok = !rc && c.pass == c.n && c.rt_pass == c.n;

		printf("%-34s %2u/%2u ids, %2u/%2u round trip%s\n", names[i],
		       c.pass, c.n, c.rt_pass, c.n,
		       ok ? "" : must ? "  FAIL" : "  (not yet required)");
		if (!ok && must)
			failed++;
		free(names[i]);
	}
	return failed ? 1 : 0;
}
