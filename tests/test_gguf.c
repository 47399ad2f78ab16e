/* test_gguf.c - GGUF reader: real models, every truncation, flipped bytes,
 * huge counts, and files that lie about their tensors.
 *
 * Real models come from $KVD_SHARED/models (the whole test exits 77 when
 * they are absent and nothing else can run). Generated files come from
 * gpu/gguf_write so every byte of their layout is known.
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gpu/gguf.h"
#include "conf/util.h"

static char shared_dir[1024];

static int model_path(char *buf, size_t size, const char *name)
{
	snprintf(buf, size, "%s/models/%s", shared_dir, name);
	return access(buf, R_OK) == 0 ? 0 : -ENOENT; /* callers skip the case */
}

static void *slurp(const char *path, size_t *size)
{
	FILE *fp = fopen(path, "rb");
	struct stat st;
	void *buf;

	ck_assert_ptr_nonnull(fp);
	ck_assert_int_eq(fstat(fileno(fp), &st), 0);
	buf = malloc((size_t)st.st_size);
	ck_assert_ptr_nonnull(buf);
	ck_assert_uint_eq(fread(buf, 1, (size_t)st.st_size, fp), (size_t)st.st_size);
	fclose(fp);
	*size = (size_t)st.st_size;
	return buf;
}

/* A typed error: a known GGUF_E_* code, an offset inside the file, and a
 * non-empty message. */
static void assert_typed(int rc, const struct gguf_error *err, size_t size)
{
	ck_assert_int_gt(rc, 0);
	ck_assert_int_le(rc, GGUF_E_UNSUPPORTED);
	ck_assert_int_eq(err->code, rc);
	ck_assert_uint_le(err->offset, size);
	ck_assert_uint_gt(strlen(err->msg), 0);
}

/* ---- real models ------------------------------------------------------- */

START_TEST(test_stories_hparams)
{
	char path[1200];
	struct gguf_file *f = NULL;
	struct gguf_error err;
	struct llama_hparams hp;

	if (model_path(path, sizeof(path), "stories260K.gguf"))
		return;
	ck_assert_int_eq(gguf_open(&f, path, &err), 0);
	ck_assert_uint_eq(f->version, 3);
	ck_assert_uint_eq(f->n_tensors, 48);
	ck_assert_uint_eq(f->alignment, 32);
	ck_assert_int_eq(gguf_llama_hparams(f, &hp, &err), 0);
	ck_assert_str_eq(hp.arch, "llama");
	ck_assert_uint_eq(hp.n_layer, 5);
	ck_assert_uint_eq(hp.n_embd, 64);
	ck_assert_uint_eq(hp.n_head, 8);
	ck_assert_uint_eq(hp.n_head_kv, 4);
	ck_assert_uint_eq(hp.head_dim, 8);
	ck_assert_uint_eq(hp.n_ff, 172);
	ck_assert_uint_eq(hp.n_vocab, 512);
	ck_assert_uint_eq(hp.n_ctx_train, 2048);
	ck_assert_uint_eq(hp.rope_dim, 8);
	ck_assert_float_eq(hp.rope_freq_base, 10000.0f);
	ck_assert_float_eq(hp.rope_freq_scale, 1.0f);
	ck_assert_float_eq_tol(hp.norm_eps, 1e-5f, 1e-9f);
	/* 2 * 5 layers * 4 kv heads * 8 dims * 4 bytes */
	ck_assert_uint_eq(llama_kv_bytes_per_token(&hp, KV_DTYPE_F32), 1280);
	ck_assert_uint_eq(llama_kv_bytes_per_token(&hp, KV_DTYPE_F16), 640);

	const struct gguf_tensor *t = gguf_tensor_find(f, "blk.4.ffn_down.weight");
	ck_assert_ptr_nonnull(t);
	ck_assert_int_eq(t->type, GGML_TYPE_F32);
	ck_assert_uint_eq(t->ne[0], 172);
	ck_assert_uint_eq(t->ne[1], 64);
	ck_assert_uint_eq(t->nbytes, 172 * 64 * 4);
	ck_assert_ptr_eq(t->data, f->map + f->data_offset + t->offset);

	const struct gguf_kv *tok = gguf_find(f, "tokenizer.ggml.tokens");
	struct gguf_str s;
	ck_assert_ptr_nonnull(tok);
	ck_assert_int_eq(gguf_arr_str(f, tok, 1, &s), 0);
	ck_assert(gguf_str_eq(s, "<s>"));
	ck_assert_int_eq(gguf_arr_str(f, tok, 3, &s), 0);
	ck_assert(gguf_str_eq(s, "<0x00>"));
	ck_assert_int_eq(gguf_arr_str(f, tok, 512, &s), -ERANGE);
	double score;
	const struct gguf_kv *sc = gguf_find(f, "tokenizer.ggml.scores");
	ck_assert_ptr_nonnull(sc);
	ck_assert_int_eq(gguf_arr_f64(sc, 511, &score), 0);
	ck_assert_int_eq(gguf_arr_str(f, sc, 0, &s), GGUF_E_TYPE);
	uint32_t u;
	ck_assert_int_eq(gguf_get_u32(f, "no.such.key", &u), -ENOENT);
	ck_assert_int_eq(gguf_get_u32(f, "general.architecture", &u), GGUF_E_TYPE);
	gguf_close(f);
}
END_TEST

START_TEST(test_tiny_random_hparams)
{
	char path[1200];
	struct gguf_file *f = NULL;
	struct gguf_error err;
	struct llama_hparams hp;
	uint32_t ft;

	if (model_path(path, sizeof(path), "llama-2-tiny-random.gguf"))
		return;
	ck_assert_int_eq(gguf_open(&f, path, &err), 0);
	ck_assert_int_eq(gguf_llama_hparams(f, &hp, &err), 0);
	ck_assert_uint_eq(hp.n_layer, 1);
	ck_assert_uint_eq(hp.n_embd, 8);
	ck_assert_uint_eq(hp.n_head, 2);
	ck_assert_uint_eq(hp.n_head_kv, 2);
	ck_assert_uint_eq(hp.head_dim, 4);
	ck_assert_uint_eq(hp.n_ff, 32);
	ck_assert_uint_eq(hp.n_vocab, 32000);
	ck_assert_uint_eq(hp.n_ctx_train, 4096);
	ck_assert_uint_eq(hp.rope_dim, 4);
	ck_assert_int_eq(gguf_get_u32(f, "general.file_type", &ft), 0);
	ck_assert_uint_eq(ft, 1);
	ck_assert_int_eq(gguf_tensor_find(f, "token_embd.weight")->type, GGML_TYPE_F16);
	ck_assert_int_eq(gguf_tensor_find(f, "output_norm.weight")->type, GGML_TYPE_F32);
	gguf_close(f);
}
END_TEST

/* Every prefix of the real model's header and metadata gives a typed
 * error; so do a few cuts inside the data section. */
START_TEST(test_stories_truncations)
{
	char path[1200];
	size_t size;
	struct gguf_file *f = NULL;
	struct gguf_error err;
	uint8_t *buf;

	if (model_path(path, sizeof(path), "stories260K.gguf"))
		return;
	buf = slurp(path, &size);
	ck_assert_int_eq(gguf_open_mem(&f, buf, size, &err), 0);
	size_t hdr = f->data_offset;
	gguf_close(f);
	for (size_t n = 0; n <= hdr + 64; n++) {
		/* A fresh heap copy of exactly n bytes so ASan sees any read past
		 * the prefix. */
		uint8_t *p = malloc(n ? n : 1);
		memcpy(p, buf, n);
		f = NULL;
		int rc = gguf_open_mem(&f, p, n, &err);
		assert_typed(rc, &err, n);
		ck_assert_ptr_null(f);
		free(p);
	}
	for (size_t n = hdr + 64; n < size; n += 4099) {
		f = NULL;
		int rc = gguf_open_mem(&f, buf, n, &err);
		assert_typed(rc, &err, n);
		ck_assert_int_eq(rc, GGUF_E_TRUNCATED);
	}
	free(buf);
}
END_TEST

/* Flip every byte of the header region (one at a time, several values):
 * the reader either accepts the file or gives a typed error, and the
 * llama check on an accepted file never crashes. */
START_TEST(test_stories_flips)
{
	char path[1200];
	size_t size;
	struct gguf_file *f = NULL;
	struct gguf_error err;
	struct llama_hparams hp;
	uint8_t *buf;
	static const uint8_t xors[] = { 0x01, 0x80, 0xff };
	uint64_t seed = 0x9e3779b97f4a7c15ull;

	if (model_path(path, sizeof(path), "stories260K.gguf"))
		return;
	buf = slurp(path, &size);
	ck_assert_int_eq(gguf_open_mem(&f, buf, size, &err), 0);
	size_t hdr = f->data_offset;
	gguf_close(f);
	/* All of the first 1 KiB, then a sample of the rest of the header. */
	for (size_t i = 0; i < hdr; i += i < 1024 ? 1 : 1 + (seed >> 60)) {
		seed ^= seed << 13; seed ^= seed >> 7; seed ^= seed << 17;
		for (size_t x = 0; x < KVD_ARRAY_SIZE(xors); x++) {
			buf[i] ^= xors[x];
			f = NULL;
			int rc = gguf_open_mem(&f, buf, size, &err);
			if (rc == 0) {
				rc = gguf_llama_hparams(f, &hp, &err);
				if (rc)
					assert_typed(rc, &err, size);
				gguf_close(f);
			} else {
				assert_typed(rc, &err, size);
			}
			buf[i] ^= xors[x];
		}
	}
	free(buf);
}
END_TEST

/* ---- hand-made headers -------------------------------------------------- */

struct hb {
	uint8_t b[4096];
	size_t n;
};

static void hb_raw(struct hb *h, const void *p, size_t n)
{
	ck_assert_uint_le(h->n + n, sizeof(h->b));
	memcpy(h->b + h->n, p, n);
	h->n += n;
}
static void hb_u32(struct hb *h, uint32_t v) { hb_raw(h, &v, 4); }
static void hb_u64(struct hb *h, uint64_t v) { hb_raw(h, &v, 8); }
static void hb_str(struct hb *h, const char *s)
{
	hb_u64(h, strlen(s));
	hb_raw(h, s, strlen(s));
}

static int open_hb(struct hb *h, struct gguf_error *err)
{
	struct gguf_file *f = NULL;
	uint8_t *p = malloc(h->n);
	int rc;

	memcpy(p, h->b, h->n);
	rc = gguf_open_mem(&f, p, h->n, err);
	gguf_close(f);
	free(p);
	return rc;
}

START_TEST(test_header_errors)
{
	struct hb h;
	struct gguf_error err;

	/* bad magic */
	h.n = 0;
	hb_raw(&h, "GGML", 4); hb_u32(&h, 3); hb_u64(&h, 0); hb_u64(&h, 0);
	ck_assert_int_eq(open_hb(&h, &err), GGUF_E_MAGIC);
	/* v1 and v4 */
	for (uint32_t v = 0; v < 6; v++) {
		h.n = 0;
		hb_raw(&h, "GGUF", 4); hb_u32(&h, v); hb_u64(&h, 0); hb_u64(&h, 0);
		ck_assert_int_eq(open_hb(&h, &err), v == 2 || v == 3 ? 0 : GGUF_E_VERSION);
	}
	ck_assert_uint_eq(err.offset, 4);
	/* huge counts */
	h.n = 0;
	hb_raw(&h, "GGUF", 4); hb_u32(&h, 3); hb_u64(&h, UINT64_MAX); hb_u64(&h, 0);
	ck_assert_int_eq(open_hb(&h, &err), GGUF_E_MALFORMED);
	ck_assert_uint_eq(err.offset, 8);
	h.n = 0;
	hb_raw(&h, "GGUF", 4); hb_u32(&h, 3); hb_u64(&h, 0); hb_u64(&h, 1ull << 62);
	ck_assert_int_eq(open_hb(&h, &err), GGUF_E_MALFORMED);
	ck_assert_uint_eq(err.offset, 16);
	/* huge key length */
	h.n = 0;
	hb_raw(&h, "GGUF", 4); hb_u32(&h, 3); hb_u64(&h, 0); hb_u64(&h, 1);
	hb_u64(&h, UINT64_MAX - 3); hb_raw(&h, "abcdefgh", 8);
	ck_assert_int_eq(open_hb(&h, &err), GGUF_E_TRUNCATED);
	ck_assert_uint_eq(err.offset, 24);
	/* unknown value type */
	h.n = 0;
	hb_raw(&h, "GGUF", 4); hb_u32(&h, 3); hb_u64(&h, 0); hb_u64(&h, 1);
	hb_str(&h, "k"); hb_u32(&h, 13); hb_u64(&h, 0);
	ck_assert_int_eq(open_hb(&h, &err), GGUF_E_MALFORMED);
	ck_assert_uint_eq(err.offset, 33);
	/* huge array of u32 */
	h.n = 0;
	hb_raw(&h, "GGUF", 4); hb_u32(&h, 3); hb_u64(&h, 0); hb_u64(&h, 1);
	hb_str(&h, "k"); hb_u32(&h, GGUF_VT_ARRAY); hb_u32(&h, GGUF_VT_UINT32);
	hb_u64(&h, 1ull << 62); hb_u64(&h, 0);
	ck_assert_int_eq(open_hb(&h, &err), GGUF_E_TRUNCATED);
	ck_assert_uint_eq(err.offset, 41);
	/* huge array of strings */
	h.n = 0;
	hb_raw(&h, "GGUF", 4); hb_u32(&h, 3); hb_u64(&h, 0); hb_u64(&h, 1);
	hb_str(&h, "k"); hb_u32(&h, GGUF_VT_ARRAY); hb_u32(&h, GGUF_VT_STRING);
	hb_u64(&h, UINT64_MAX); hb_u64(&h, 0);
	ck_assert_int_eq(open_hb(&h, &err), GGUF_E_TRUNCATED);
	/* nested array */
	h.n = 0;
	hb_raw(&h, "GGUF", 4); hb_u32(&h, 3); hb_u64(&h, 0); hb_u64(&h, 1);
	hb_str(&h, "k"); hb_u32(&h, GGUF_VT_ARRAY); hb_u32(&h, GGUF_VT_ARRAY);
	hb_u64(&h, 0);
	ck_assert_int_eq(open_hb(&h, &err), GGUF_E_MALFORMED);
	/* duplicate key */
	h.n = 0;
	hb_raw(&h, "GGUF", 4); hb_u32(&h, 3); hb_u64(&h, 0); hb_u64(&h, 2);
	hb_str(&h, "k"); hb_u32(&h, GGUF_VT_UINT32); hb_u32(&h, 1);
	hb_str(&h, "k"); hb_u32(&h, GGUF_VT_UINT32); hb_u32(&h, 2);
	ck_assert_int_eq(open_hb(&h, &err), GGUF_E_MALFORMED);
	ck_assert_uint_eq(err.offset, 41); /* the second "k" */
	/* bad bool */
	h.n = 0;
	hb_raw(&h, "GGUF", 4); hb_u32(&h, 3); hb_u64(&h, 0); hb_u64(&h, 1);
	hb_str(&h, "k"); hb_u32(&h, GGUF_VT_BOOL); hb_raw(&h, "\x02", 1);
	ck_assert_int_eq(open_hb(&h, &err), GGUF_E_MALFORMED);
	/* alignment not a power of two, and of the wrong type */
	h.n = 0;
	hb_raw(&h, "GGUF", 4); hb_u32(&h, 3); hb_u64(&h, 0); hb_u64(&h, 1);
	hb_str(&h, "general.alignment"); hb_u32(&h, GGUF_VT_UINT32); hb_u32(&h, 48);
	ck_assert_int_eq(open_hb(&h, &err), GGUF_E_MALFORMED);
	h.n = 0;
	hb_raw(&h, "GGUF", 4); hb_u32(&h, 3); hb_u64(&h, 0); hb_u64(&h, 1);
	hb_str(&h, "general.alignment"); hb_u32(&h, GGUF_VT_STRING); hb_str(&h, "32");
	ck_assert_int_eq(open_hb(&h, &err), GGUF_E_TYPE);
}
END_TEST

/* One tensor with the given fields after a minimal header. */
static int one_tensor(uint32_t n_dims, const uint64_t *ne, uint32_t type,
		      uint64_t off, size_t data_bytes, struct gguf_error *err)
{
	struct hb h = { .n = 0 };

	hb_raw(&h, "GGUF", 4); hb_u32(&h, 3); hb_u64(&h, 1); hb_u64(&h, 0);
	hb_str(&h, "t");
	hb_u32(&h, n_dims);
	for (uint32_t d = 0; d < n_dims && d < 8; d++)
		hb_u64(&h, ne[d]);
	hb_u32(&h, type);
	hb_u64(&h, off);
	while (h.n % 32)
		hb_raw(&h, "", 1);
	for (size_t i = 0; i < data_bytes; i++)
		hb_raw(&h, "\0", 1);
	return open_hb(&h, err);
}

START_TEST(test_tensor_errors)
{
	struct gguf_error err;
	uint64_t ne[8] = { 32, 2, 1, 1, 1, 1, 1, 1 };

	ck_assert_int_eq(one_tensor(2, ne, GGML_TYPE_F32, 0, 256, &err), 0);
	ck_assert_int_eq(one_tensor(2, ne, GGML_TYPE_F32, 0, 255, &err), GGUF_E_TRUNCATED);
	ck_assert_int_eq(one_tensor(2, ne, GGML_TYPE_Q8_0, 0, 68, &err), 0);
	ck_assert_int_eq(one_tensor(2, ne, GGML_TYPE_Q4_0, 0, 36, &err), 0);
	ck_assert_int_eq(one_tensor(2, ne, GGML_TYPE_BF16, 0, 128, &err), 0);
	ck_assert_int_eq(one_tensor(0, ne, GGML_TYPE_F32, 0, 256, &err), GGUF_E_TENSOR);
	ck_assert_int_eq(one_tensor(5, ne, GGML_TYPE_F32, 0, 256, &err), GGUF_E_TENSOR);
	ck_assert_uint_eq(err.offset, 33);
	ck_assert_int_eq(one_tensor(2, ne, 99, 0, 256, &err), GGUF_E_UNSUPPORTED);
	ck_assert_ptr_nonnull(strstr(err.msg, "'t'"));
	ck_assert_int_eq(one_tensor(2, ne, GGML_TYPE_F32, 16, 512, &err), GGUF_E_TENSOR);
	ck_assert_ptr_nonnull(strstr(err.msg, "alignment"));
	ck_assert_int_eq(one_tensor(2, ne, GGML_TYPE_F32, 1ull << 62, 256, &err), GGUF_E_TRUNCATED);
	ck_assert_int_eq(one_tensor(2, ne, GGML_TYPE_F32, UINT64_MAX - 31, 256, &err), GGUF_E_TRUNCATED);
	uint64_t odd[2] = { 33, 1 };
	ck_assert_int_eq(one_tensor(2, odd, GGML_TYPE_Q8_0, 0, 256, &err), GGUF_E_TENSOR);
	ck_assert_ptr_nonnull(strstr(err.msg, "block"));
	uint64_t huge[4] = { 1ull << 40, 1ull << 40, 1, 1 };
	ck_assert_int_eq(one_tensor(2, huge, GGML_TYPE_F32, 0, 256, &err), GGUF_E_TENSOR);
	uint64_t zero[2] = { 0, 1 };
	ck_assert_int_eq(one_tensor(2, zero, GGML_TYPE_F32, 0, 256, &err), GGUF_E_TENSOR);
	uint64_t neg[2] = { 32, UINT64_MAX };
	ck_assert_int_eq(one_tensor(2, neg, GGML_TYPE_F32, 0, 256, &err), GGUF_E_TENSOR);
}
END_TEST

START_TEST(test_type_sizes)
{
	ck_assert_uint_eq(ggml_type_nbytes(GGML_TYPE_F32, 10), 40);
	ck_assert_uint_eq(ggml_type_nbytes(GGML_TYPE_F16, 10), 20);
	ck_assert_uint_eq(ggml_type_nbytes(GGML_TYPE_BF16, 10), 20);
	ck_assert_uint_eq(ggml_type_nbytes(GGML_TYPE_Q8_0, 64), 68);
	ck_assert_uint_eq(ggml_type_nbytes(GGML_TYPE_Q4_0, 64), 36);
	ck_assert_uint_eq(ggml_type_nbytes(GGML_TYPE_Q4_1, 64), 40);
	ck_assert_uint_eq(ggml_type_nbytes(GGML_TYPE_Q5_0, 64), 44);
	ck_assert_uint_eq(ggml_type_nbytes(GGML_TYPE_Q5_1, 64), 48);
	ck_assert_uint_eq(ggml_type_nbytes(GGML_TYPE_Q6_K, 256), 210);
	ck_assert_uint_eq(ggml_type_nbytes(GGML_TYPE_Q4_K, 256), 144);
	ck_assert_uint_eq(ggml_type_nbytes(GGML_TYPE_Q8_0, 33), 0);
	ck_assert_uint_eq(ggml_type_nbytes((enum ggml_type)5, 32), 0);
	ck_assert_uint_eq(ggml_type_nbytes(GGML_TYPE_F32, UINT64_MAX / 2), 0);
	ck_assert_uint_eq(ggml_type_block(GGML_TYPE_Q8_0), 32);
	ck_assert_str_eq(ggml_type_name(GGML_TYPE_Q8_0), "q8_0");
}
END_TEST

START_TEST(test_open_errors)
{
	struct gguf_file *f = NULL;
	struct gguf_error err;
	char path[] = "/tmp/kvd-gguf-XXXXXX";
	int fd;

	ck_assert_int_eq(gguf_open(&f, "/nonexistent/x.gguf", &err), -ENOENT);
	ck_assert_int_eq(err.code, -ENOENT);
	ck_assert_int_lt(gguf_open(&f, "/tmp", &err), 0);
	fd = mkstemp(path);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(gguf_open(&f, path, &err), GGUF_E_TRUNCATED);
	ck_assert_int_eq(write(fd, "GGUF\x01\0\0\0", 8), 8);
	ck_assert_int_eq(gguf_open(&f, path, &err), GGUF_E_VERSION);
	close(fd);
	unlink(path);
	ck_assert_ptr_null(f);
}
END_TEST

static Suite *gguf_suite(void)
{
	Suite *s = suite_create("gguf");
	TCase *tc = tcase_create("core");

	tcase_set_timeout(tc, 600);
	tcase_add_test(tc, test_type_sizes);
	tcase_add_test(tc, test_open_errors);
	tcase_add_test(tc, test_header_errors);
	tcase_add_test(tc, test_tensor_errors);
	tcase_add_test(tc, test_stories_hparams);
	tcase_add_test(tc, test_tiny_random_hparams);
	tcase_add_test(tc, test_stories_truncations);
	tcase_add_test(tc, test_stories_flips);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	const char *sh = getenv("KVD_SHARED");
	char probe[1200];
	SRunner *sr;
	int failed;

	snprintf(shared_dir, sizeof(shared_dir), "%s", sh ? sh : "../shared");
	if (model_path(probe, sizeof(probe), "stories260K.gguf"))
		fprintf(stderr, "note: %s absent; real-model cases skipped\n", probe);
	sr = srunner_create(gguf_suite());
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
