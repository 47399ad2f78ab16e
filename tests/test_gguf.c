/* test_gguf.c - GGUF reader: real models, every truncation, flipped bytes,
 * huge counts, and files that lie about their tensors.
 *
 * Real models come from $KVD_SHARED/models (the whole test exits 77 when
 * they are absent and nothing else can run). Generated files come from
 * gpu/gguf_write so every byte of their layout is known.
 */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gpu/gguf/gguf.h"
#include "conf/util.h"
#include "gpu/model/gguf_gen.h"
#include "gpu/gguf/gguf_write.h"
#include "ctl/cmd_model.h"

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

/* What a failed open says: the sentence for a typed error, strerror
 * for a negative errno (model_from_gguf's -ENOMEM fills no sentence). */
START_TEST(test_error_msg)
{
	struct gguf_error err = { 0 };
	struct gguf_file *f = NULL;
	int rc = gguf_open(&f, "/nonexistent/kvd.gguf", &err);

	ck_assert_int_eq(rc, -ENOENT);
	ck_assert_str_eq(gguf_error_msg(rc, &err), strerror(ENOENT));
	err = (struct gguf_error){ 0 };
	ck_assert_str_eq(gguf_error_msg(-ENOMEM, &err), strerror(ENOMEM));
	gguf_error_set(&err, GGUF_E_MAGIC, 0, "not a GGUF file (magic %s)", "XXXX");
	ck_assert_str_eq(gguf_error_msg(GGUF_E_MAGIC, &err),
			 "not a GGUF file (magic XXXX)");
}
END_TEST

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

/* ---- generated files ----------------------------------------------------- */

/* Write a writer into a fresh heap buffer. */
static uint8_t *write_mem(struct gguf_writer *w, size_t *size)
{
	char *buf = NULL;
	FILE *fp = open_memstream(&buf, size);

	ck_assert_ptr_nonnull(fp);
	ck_assert_int_eq(gguf_writer_write_stream(w, fp), 0);
	ck_assert_int_eq(fclose(fp), 0);
	return (uint8_t *)buf;
}

static uint8_t *make_llama_mem(const struct gguf_llama_params *p, size_t *size)
{
	struct gguf_writer *w = NULL;
	uint8_t *buf;

	ck_assert_int_eq(gguf_make_llama_writer(&w, p), 0);
	buf = write_mem(w, size);
	gguf_writer_free(w);
	return buf;
}

/* The small model most generated-file tests use. */
static struct gguf_llama_params tiny_params(void)
{
	struct gguf_llama_params p = GGUF_LLAMA_PARAMS_DEFAULT;

	p.n_layer = 1;
	p.n_embd = 32;
	p.n_head = 2;
	p.n_head_kv = 1;
	p.n_ff = 32;
	p.n_vocab = 300;
	p.wtype = GGML_TYPE_Q8_0;
	return p;
}

START_TEST(test_writer_roundtrip)
{
	struct gguf_writer *w = NULL;
	struct gguf_file *f = NULL;
	struct gguf_error err;
	size_t size;
	const char *strs[] = { "alpha", "", "g\xc3\xa4mma", "<0x0A>" };
	int32_t ints[5] = { -1, 0, 1, INT32_MAX, INT32_MIN };
	float f32[4] = { 0.5f, -2.0f, 1e-30f, 3.25f };
	uint64_t ne2[2] = { 64, 3 }, ne1[1] = { 96 }, ne4[4] = { 32, 2, 2, 2 };
	static float data_f32[64 * 3];
	static uint8_t data_q8[34 * 3], data_q4[18 * 8];
	uint16_t data_f16[96];

	for (int i = 0; i < 64 * 3; i++)
		data_f32[i] = (float)i * 0.25f - 7.0f;
	for (size_t i = 0; i < sizeof(data_q8); i++)
		data_q8[i] = (uint8_t)(i * 7);
	for (size_t i = 0; i < sizeof(data_q4); i++)
		data_q4[i] = (uint8_t)(i * 13);
	for (int i = 0; i < 96; i++)
		data_f16[i] = gguf_f32_to_f16((float)i / 8.0f);

	ck_assert_int_eq(gguf_writer_new(&w, 64), 0);
	ck_assert_int_eq(gguf_writer_add_u8(w, "t.u8", 200), 0);
	ck_assert_int_eq(gguf_writer_add_i8(w, "t.i8", -100), 0);
	ck_assert_int_eq(gguf_writer_add_u16(w, "t.u16", 60000), 0);
	ck_assert_int_eq(gguf_writer_add_i16(w, "t.i16", -30000), 0);
	ck_assert_int_eq(gguf_writer_add_u32(w, "t.u32", 4000000000u), 0);
	ck_assert_int_eq(gguf_writer_add_i32(w, "t.i32", -5), 0);
	ck_assert_int_eq(gguf_writer_add_u64(w, "t.u64", 1ull << 40), 0);
	ck_assert_int_eq(gguf_writer_add_i64(w, "t.i64", 7), 0);
	ck_assert_int_eq(gguf_writer_add_f32(w, "t.f32", 1.5f), 0);
	ck_assert_int_eq(gguf_writer_add_f64(w, "t.f64", -0.125), 0);
	ck_assert_int_eq(gguf_writer_add_bool(w, "t.bool", true), 0);
	ck_assert_int_eq(gguf_writer_add_str(w, "t.str", "hello world"), 0);
	ck_assert_int_eq(gguf_writer_add_str(w, "t.str", "again"), -EEXIST);
	ck_assert_int_eq(gguf_writer_add_arr_str(w, "t.strs", strs, 4), 0);
	ck_assert_int_eq(gguf_writer_add_arr(w, "t.ints", GGUF_VT_INT32, ints, 5), 0);
	ck_assert_int_eq(gguf_writer_add_arr(w, "t.f32s", GGUF_VT_FLOAT32, f32, 4), 0);
	/* a uint64 past INT64_MAX has no int64 value, but a double (the
	 * mutation fuzzer found it readable as neither) */
	uint64_t u64s[2] = { 5, 0x87c3000000000000ull };
	ck_assert_int_eq(gguf_writer_add_arr(w, "t.u64s", GGUF_VT_UINT64, u64s, 2), 0);
	ck_assert_int_eq(gguf_writer_add_arr(w, "t.bad", GGUF_VT_STRING, f32, 4), -EINVAL);
	ck_assert_int_eq(gguf_writer_add_tensor(w, "a", GGML_TYPE_F32, 2, ne2, data_f32, NULL, NULL), 0);
	ck_assert_int_eq(gguf_writer_add_tensor(w, "a", GGML_TYPE_F32, 2, ne2, data_f32, NULL, NULL), -EEXIST);
	ck_assert_int_eq(gguf_writer_add_tensor(w, "b", GGML_TYPE_F16, 1, ne1, data_f16, NULL, NULL), 0);
	uint64_t ne_q8[2] = { 32, 3 };
	ck_assert_int_eq(gguf_writer_add_tensor(w, "c", GGML_TYPE_Q8_0, 2, ne_q8, data_q8, NULL, NULL), 0);
	ck_assert_int_eq(gguf_writer_add_tensor(w, "d", GGML_TYPE_Q4_0, 4, ne4, data_q4, NULL, NULL), 0);
	uint64_t ne_bad[2] = { 33, 1 };
	ck_assert_int_eq(gguf_writer_add_tensor(w, "e", GGML_TYPE_Q8_0, 2, ne_bad, data_q8, NULL, NULL), -EINVAL);
	uint8_t *buf = write_mem(w, &size);
	gguf_writer_free(w);

	ck_assert_int_eq(gguf_open_mem(&f, buf, size, &err), 0);
	ck_assert_uint_eq(f->version, 3);
	ck_assert_uint_eq(f->alignment, 64);
	ck_assert_uint_eq(f->data_offset % 64, 0);
	ck_assert_uint_eq(f->n_kv, 17); /* + general.alignment */
	uint32_t u32; uint64_t u64; float fl; bool b; struct gguf_str st;
	ck_assert_int_eq(gguf_get_u32(f, "t.u8", &u32), 0); ck_assert_uint_eq(u32, 200);
	ck_assert_int_eq(gguf_get_u32(f, "t.i8", &u32), GGUF_E_TYPE); /* negative */
	ck_assert_int_eq(gguf_get_u32(f, "t.u16", &u32), 0); ck_assert_uint_eq(u32, 60000);
	ck_assert_int_eq(gguf_get_u32(f, "t.u32", &u32), 0); ck_assert_uint_eq(u32, 4000000000u);
	ck_assert_int_eq(gguf_get_u32(f, "t.u64", &u32), GGUF_E_TYPE); /* > u32 */
	ck_assert_int_eq(gguf_get_u64(f, "t.u64", &u64), 0); ck_assert_uint_eq(u64, 1ull << 40);
	ck_assert_int_eq(gguf_get_u64(f, "t.i64", &u64), 0); ck_assert_uint_eq(u64, 7);
	ck_assert_int_eq(gguf_get_f32(f, "t.f32", &fl), 0); ck_assert_float_eq(fl, 1.5f);
	ck_assert_int_eq(gguf_get_f32(f, "t.f64", &fl), 0); ck_assert_float_eq(fl, -0.125f);
	ck_assert_int_eq(gguf_get_f32(f, "t.i16", &fl), 0); ck_assert_float_eq(fl, -30000.0f);
	ck_assert_int_eq(gguf_get_bool(f, "t.bool", &b), 0); ck_assert(b);
	ck_assert_int_eq(gguf_get_bool(f, "t.u8", &b), GGUF_E_TYPE);
	ck_assert_int_eq(gguf_get_str(f, "t.str", &st), 0); ck_assert(gguf_str_eq(st, "hello world"));
	ck_assert_int_eq(gguf_get_str(f, "t.u8", &st), GGUF_E_TYPE);
	const struct gguf_kv *kv = gguf_find(f, "t.strs");
	ck_assert_ptr_nonnull(kv);
	ck_assert_uint_eq(kv->arr_len, 4);
	for (int i = 0; i < 4; i++) {
		ck_assert_int_eq(gguf_arr_str(f, kv, (uint64_t)i, &st), 0);
		ck_assert(gguf_str_eq(st, strs[i]));
	}
	int64_t i64; double d;
	kv = gguf_find(f, "t.ints");
	for (int i = 0; i < 5; i++) {
		ck_assert_int_eq(gguf_arr_i64(kv, (uint64_t)i, &i64), 0);
		ck_assert_int_eq(i64, ints[i]);
	}
	ck_assert_int_eq(gguf_arr_i64(kv, 5, &i64), -ERANGE);
	kv = gguf_find(f, "t.f32s");
	ck_assert_int_eq(gguf_arr_f64(kv, 3, &d), 0);
	ck_assert_double_eq(d, 3.25);
	ck_assert_int_eq(gguf_arr_i64(kv, 0, &i64), GGUF_E_TYPE);
	kv = gguf_find(f, "t.u64s");
	ck_assert_int_eq(gguf_arr_i64(kv, 0, &i64), 0);
	ck_assert_int_eq(i64, 5);
	ck_assert_int_eq(gguf_arr_i64(kv, 1, &i64), GGUF_E_TYPE);
	ck_assert_int_eq(gguf_arr_f64(kv, 1, &d), 0);
	ck_assert_double_eq(d, (double)0x87c3000000000000ull);

	const struct gguf_tensor *t = gguf_tensor_find(f, "a");
	ck_assert_ptr_nonnull(t);
	ck_assert_uint_eq(t->n_dims, 2);
	ck_assert_uint_eq(t->ne[1], 3);
	ck_assert_mem_eq(t->data, data_f32, sizeof(data_f32));
	t = gguf_tensor_find(f, "b");
	ck_assert_uint_eq(t->offset % 64, 0);
	ck_assert_mem_eq(t->data, data_f16, sizeof(data_f16));
	t = gguf_tensor_find(f, "c");
	ck_assert_mem_eq(t->data, data_q8, sizeof(data_q8));
	t = gguf_tensor_find(f, "d");
	ck_assert_uint_eq(t->n_dims, 4);
	ck_assert_uint_eq(t->nbytes, sizeof(data_q4));
	ck_assert_mem_eq(t->data, data_q4, sizeof(data_q4));
	ck_assert_ptr_null(gguf_tensor_find(f, "e"));
	struct llama_hparams hp;
	ck_assert_int_eq(gguf_llama_hparams(f, &hp, &err), GGUF_E_MISSING);
	ck_assert_ptr_nonnull(strstr(err.msg, "general.architecture"));
	gguf_close(f);
	free(buf);
}
END_TEST

START_TEST(test_f16_q8)
{
	/* exact values, rounding to even, overflow, subnormals */
	ck_assert_uint_eq(gguf_f32_to_f16(1.0f), 0x3c00);
	ck_assert_uint_eq(gguf_f32_to_f16(-2.0f), 0xc000);
	ck_assert_uint_eq(gguf_f32_to_f16(65504.0f), 0x7bff);
	ck_assert_uint_eq(gguf_f32_to_f16(1e6f), 0x7c00);
	ck_assert_uint_eq(gguf_f32_to_f16(1.0f + 1.0f / 2048), 0x3c00); /* tie -> even */
	ck_assert_uint_eq(gguf_f32_to_f16(1.0f + 3.0f / 2048), 0x3c02); /* tie -> even */
	ck_assert_uint_eq(gguf_f32_to_f16(5.9604645e-8f), 0x0001);
	ck_assert_uint_eq(gguf_f32_to_f16(0.0f), 0);
	for (uint32_t h = 0; h < 0x7c00; h++) {
		float x = gguf_f16_to_f32((uint16_t)h);
		ck_assert_uint_eq(gguf_f32_to_f16(x), h);
		ck_assert_uint_eq(gguf_f32_to_f16(-x), h | 0x8000);
	}
	float x[64];
	uint8_t q[68];
	for (int i = 0; i < 64; i++)
		x[i] = (float)(i - 20) / 10.0f;
	gguf_quantize_q8_0(x, 64, q);
	for (int b = 0; b < 2; b++) {
		uint16_t dh;
		memcpy(&dh, q + 34 * b, 2);
		float dd = gguf_f16_to_f32(dh);
		for (int i = 0; i < 32; i++) {
			float y = dd * (float)(int8_t)q[34 * b + 2 + i];
			ck_assert_float_eq_tol(y, x[32 * b + i], dd * 0.51f + 1e-3f);
		}
	}
	/* Q4_0: 16 levels, error at most half a step (plus f16 rounding) */
	uint8_t q4[36];
	gguf_quantize_q4_0(x, 64, q4);
	for (int b = 0; b < 2; b++) {
		uint16_t dh;
		memcpy(&dh, q4 + 18 * b, 2);
		float dd = gguf_f16_to_f32(dh);
		for (int i = 0; i < 32; i++) {
			uint8_t byte = q4[18 * b + 2 + (i % 16)];
			int nib = i < 16 ? (byte & 0xf) : (byte >> 4);
			float y = dd * (float)(nib - 8);
			ck_assert_float_eq_tol(y, x[32 * b + i], fabsf(dd) * 0.51f + 1e-3f);
		}
	}
}
END_TEST

START_TEST(test_make_llama)
{
	static const enum ggml_type types[] = { GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_Q8_0,
						GGML_TYPE_Q4_0 };

	for (int ti = 0; ti < 4; ti++)
		for (int tied = 0; tied < 2; tied++)
			for (int gpt2 = 0; gpt2 < 2; gpt2++) {
				struct gguf_llama_params p = GGUF_LLAMA_PARAMS_DEFAULT;
				struct gguf_file *f = NULL;
				struct gguf_error err;
				struct llama_hparams hp;
				size_t size;

				p.n_layer = 3;
				p.n_embd = 64;
				p.n_head = 4;
				p.n_head_kv = 2;
				p.n_ff = 96;
				p.n_vocab = gpt2 ? 700 : 1000;
				p.n_ctx = 512;
				p.wtype = types[ti];
				p.tied = tied;
				p.vocab = gpt2 ? GGUF_VOCAB_GPT2 : GGUF_VOCAB_LLAMA;
				uint8_t *buf = make_llama_mem(&p, &size);
				ck_assert_int_eq(gguf_open_mem(&f, buf, size, &err), 0);
				ck_assert_msg(gguf_llama_hparams(f, &hp, &err) == 0, "%s", err.msg);
				ck_assert_uint_eq(hp.n_layer, 3);
				ck_assert_uint_eq(hp.n_head_kv, 2);
				ck_assert_uint_eq(hp.n_ff, 96);
				ck_assert_uint_eq(hp.n_vocab, p.n_vocab);
				ck_assert_uint_eq(hp.n_ctx_train, 512);
				ck_assert_uint_eq(hp.rope_dim, 16);
				ck_assert_uint_eq(f->n_tensors, 3 * 9 + 3 - (unsigned)tied);
				ck_assert_int_eq(gguf_tensor_find(f, "output.weight") == NULL, tied);
				ck_assert_int_eq(gguf_tensor_find(f, "blk.2.ffn_down.weight")->type, types[ti]);
				ck_assert_int_eq(gguf_tensor_find(f, "blk.2.ffn_norm.weight")->type, GGML_TYPE_F32);
				const float *nw = gguf_tensor_find(f, "output_norm.weight")->data;
				for (int i = 0; i < 64; i++)
					ck_assert(nw[i] > 0.9f && nw[i] < 1.1f);
				const char *keys[] = { "general.architecture", "general.name",
					"general.file_type", "general.alignment",
					"llama.context_length", "llama.embedding_length",
					"llama.block_count", "llama.feed_forward_length",
					"llama.rope.dimension_count", "llama.rope.freq_base",
					"llama.attention.head_count", "llama.attention.head_count_kv",
					"llama.attention.layer_norm_rms_epsilon", "llama.vocab_size",
					"tokenizer.ggml.model", "tokenizer.ggml.tokens",
					"tokenizer.ggml.token_type", "tokenizer.ggml.bos_token_id",
					"tokenizer.ggml.eos_token_id", "tokenizer.ggml.add_bos_token" };
				for (size_t k = 0; k < KVD_ARRAY_SIZE(keys); k++)
					ck_assert_msg(gguf_find(f, keys[k]), "missing %s", keys[k]);
				ck_assert_int_eq(gguf_find(f, "tokenizer.ggml.merges") != NULL, gpt2);
				ck_assert_int_eq(gguf_find(f, "tokenizer.ggml.scores") != NULL, !gpt2);
				uint32_t ft;
				gguf_get_u32(f, "general.file_type", &ft);
				ck_assert_uint_eq(ft, ti == 0 ? 0 : ti == 1 ? 1 : ti == 2 ? 7 : 2);
				gguf_close(f);
				free(buf);
			}
}
END_TEST

/* Same seed, same bytes; another seed, other weights; the weights keep
 * unit-ish scale (std ~ 1/sqrt(fan_in)). */
START_TEST(test_make_deterministic)
{
	struct gguf_llama_params p = tiny_params();
	size_t s1, s2, s3;

	p.wtype = GGML_TYPE_F32;
	uint8_t *a = make_llama_mem(&p, &s1);
	uint8_t *b = make_llama_mem(&p, &s2);
	p.seed = 2;
	uint8_t *c = make_llama_mem(&p, &s3);
	ck_assert_uint_eq(s1, s2);
	ck_assert_mem_eq(a, b, s1);
	ck_assert_uint_eq(s1, s3);
	ck_assert(memcmp(a, c, s1) != 0);

	struct gguf_file *f = NULL;
	struct gguf_error err;
	ck_assert_int_eq(gguf_open_mem(&f, a, s1, &err), 0);
	const struct gguf_tensor *t = gguf_tensor_find(f, "blk.0.ffn_down.weight");
	const float *x = t->data;
	double ss = 0;
	for (uint64_t i = 0; i < 32 * 32; i++)
		ss += x[i] * x[i];
	double sd = sqrt(ss / (32 * 32));
	ck_assert_double_gt(sd, 0.8 / sqrt(32));
	ck_assert_double_lt(sd, 1.2 / sqrt(32));
	gguf_close(f);
	free(a);
	free(b);
	free(c);
}
END_TEST

START_TEST(test_make_file)
{
	struct gguf_llama_params p = tiny_params();
	char dir[] = "/tmp/kvd-gguf-XXXXXX", path[64];
	struct gguf_file *f = NULL;
	struct gguf_error err;
	struct llama_hparams hp;

	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/m.gguf", dir);
	ck_assert_int_eq(gguf_make_llama(path, &p), 0);
	ck_assert_int_eq(gguf_open(&f, path, &err), 0);
	ck_assert_int_eq(gguf_llama_hparams(f, &hp, &err), 0);
	ck_assert_uint_eq(hp.n_vocab, 300);
	gguf_close(f);
	p.n_embd = 33; /* not a multiple of heads, nor of the q8_0 block */
	ck_assert_int_eq(gguf_make_llama(path, &p), -EINVAL);
	unlink(path);
	rmdir(dir);
}
END_TEST

/* vocab_from (kvctl model make --vocab-from): a model made from another
 * file's vocabulary carries every tokenizer.* key of it, same type, same
 * values, in the same order; its own dims; a token count that differs
 * from n_vocab is refused. The source here is a generated BPE model with
 * merges (string arrays), token types (int32 array), ids and a bool. */
START_TEST(test_make_vocab_from)
{
	struct gguf_llama_params p = tiny_params();
	char dir[] = "/tmp/kvd-gguf-XXXXXX", src[64], dst[64], why[160];
	struct gguf_file *fs = NULL, *fd = NULL;
	struct gguf_error err;
	struct llama_hparams hp;
	uint64_t n_tok_keys = 0;

	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(src, sizeof(src), "%s/src.gguf", dir);
	snprintf(dst, sizeof(dst), "%s/dst.gguf", dir);
	p.vocab = GGUF_VOCAB_GPT2;
	p.n_vocab = 400;
	ck_assert_int_eq(gguf_make_llama(src, &p), 0);
	ck_assert_int_eq(gguf_open(&fs, src, &err), 0);
	ck_assert_uint_eq(gguf_vocab_size(fs), 400);

	p = tiny_params(); /* an SPM model of other dims, taking fs's vocab */
	p.n_layer = 1;
	p.vocab_from = fs;
	p.n_vocab = 399;
	ck_assert_int_eq(gguf_llama_params_check(&p, why, sizeof(why)), -EINVAL);
	ck_assert_ptr_nonnull(strstr(why, "400"));
	p.n_vocab = 400;
	ck_assert_int_eq(gguf_make_llama(dst, &p), 0);
	ck_assert_int_eq(gguf_open(&fd, dst, &err), 0);
	ck_assert_int_eq(gguf_llama_hparams(fd, &hp, &err), 0);
	ck_assert_uint_eq(hp.n_vocab, 400);
	ck_assert_uint_eq(hp.n_layer, 1);
	for (uint64_t i = 0; i < fs->n_kv; i++) {
		const struct gguf_kv *a = &fs->kv[i], *b;
		char key[128];

		if (a->key.len < 10 || memcmp(a->key.ptr, "tokenizer.", 10))
			continue;
		n_tok_keys++;
		snprintf(key, sizeof(key), "%.*s", (int)a->key.len, a->key.ptr);
		b = gguf_find(fd, key);
		ck_assert_msg(b != NULL, "%s not copied", key);
		ck_assert_int_eq(a->type, b->type);
		if (a->type == GGUF_VT_ARRAY) {
			ck_assert_int_eq(a->arr_type, b->arr_type);
			ck_assert_uint_eq(a->arr_len, b->arr_len);
			for (uint64_t k = 0; k < a->arr_len; k++) {
				struct gguf_str x, y;

				if (a->arr_type != GGUF_VT_STRING) {
					size_t es = gguf_vtype_size(a->arr_type);

					ck_assert(memcmp(a->value + k * es, b->value + k * es, es) == 0);
					continue;
				}
				ck_assert_int_eq(gguf_arr_str(fs, a, k, &x), 0);
				ck_assert_int_eq(gguf_arr_str(fd, b, k, &y), 0);
				ck_assert_uint_eq(x.len, y.len);
				ck_assert(memcmp(x.ptr, y.ptr, x.len) == 0);
			}
		} else if (a->type == GGUF_VT_STRING) {
			struct gguf_str x, y;

			ck_assert_int_eq(gguf_get_str(fs, key, &x), 0);
			ck_assert_int_eq(gguf_get_str(fd, key, &y), 0);
			ck_assert(x.len == y.len && memcmp(x.ptr, y.ptr, x.len) == 0);
		} else {
			ck_assert(memcmp(a->value, b->value, gguf_vtype_size(a->type)) == 0);
		}
	}
	ck_assert_uint_ge(n_tok_keys, 6); /* model, tokens, types, merges, ids, bos flag */
	ck_assert_ptr_nonnull(gguf_find(fd, "tokenizer.ggml.merges"));
	ck_assert_ptr_null(gguf_find(fd, "tokenizer.ggml.scores")); /* not SPM's */
	gguf_close(fd);
	gguf_close(fs);
	unlink(src);
	unlink(dst);
	rmdir(dir);
}
END_TEST

/* Every prefix of a generated model is refused with a typed error. */
START_TEST(test_gen_truncations)
{
	struct gguf_llama_params p = tiny_params();
	struct gguf_file *f = NULL;
	struct gguf_error err;
	size_t size;
	uint8_t *buf = make_llama_mem(&p, &size);

	ck_assert_int_eq(gguf_open_mem(&f, buf, size, &err), 0);
	size_t hdr = f->data_offset, end = 0;
	for (uint64_t i = 0; i < f->n_tensors; i++)
		end = KVD_MAX(end, hdr + f->tensors[i].offset + f->tensors[i].nbytes);
	gguf_close(f);
	/* Only the padding after the last tensor may be cut. */
	ck_assert_uint_le(size - end, 31);
	for (size_t n = end; n <= size; n++) {
		ck_assert_int_eq(gguf_open_mem(&f, buf, n, &err), 0);
		gguf_close(f);
	}
	for (size_t n = 0; n < end; n++) {
		uint8_t *cp = buf;
		if (n <= hdr) { /* exact-size copy: ASan catches any overread */
			cp = malloc(n ? n : 1);
			memcpy(cp, buf, n);
		}
		f = NULL;
		int rc = gguf_open_mem(&f, cp, n, &err);
		assert_typed(rc, &err, n);
		ck_assert_ptr_null(f);
		if (cp != buf)
			free(cp);
	}
	free(buf);
}
END_TEST

/* Flip each header byte of a generated model, and scribble random 8-byte
 * values over random places: typed errors or a valid file, never a crash. */
START_TEST(test_gen_corruptions)
{
	struct gguf_llama_params p = tiny_params();
	struct gguf_file *f = NULL;
	struct gguf_error err;
	struct llama_hparams hp;
	size_t size;
	uint8_t *buf = make_llama_mem(&p, &size);
	uint64_t s = 12345;
	int accepted = 0, refused = 0;

	ck_assert_int_eq(gguf_open_mem(&f, buf, size, &err), 0);
	size_t hdr = f->data_offset;
	gguf_close(f);
	for (size_t i = 0; i < hdr + 2000 * 8; i++) {
		size_t at;
		uint8_t save[8];
		uint64_t r;
		s ^= s << 13; s ^= s >> 7; s ^= s << 17;
		if (i < hdr) {
			at = i;
		} else {
			at = (size_t)(s % (hdr - 8));
		}
		memcpy(save, buf + at, 8);
		if (i < hdr) {
			buf[at] ^= (uint8_t)(1u << (s % 8)) | (uint8_t)(i & 0x80);
		} else {
			/* huge lengths/counts/offsets: all-ones, top bits, random */
			r = (i % 3 == 0) ? UINT64_MAX : (i % 3 == 1) ? (s | (1ull << 62)) : s;
			memcpy(buf + at, &r, 8);
		}
		f = NULL;
		int rc = gguf_open_mem(&f, buf, size, &err);
		if (rc == 0) {
			rc = gguf_llama_hparams(f, &hp, &err);
			gguf_close(f);
		}
		if (rc) {
			assert_typed(rc, &err, size);
			refused++;
		} else {
			accepted++;
		}
		memcpy(buf + at, save, 8);
	}
	/* Most corruptions of structure must be noticed. */
	ck_assert_int_gt(refused, accepted / 4);
	free(buf);
}
END_TEST

/* ---- lying files ----------------------------------------------------------- */

/* File offset of a tensor info's type and data-offset fields. */
static size_t tinfo_type_at(const struct gguf_tensor *t)
{
	return t->info_offset + 8 + t->name.len + 4 + 8 * t->n_dims;
}

static int reopen(uint8_t *buf, size_t size, struct gguf_error *err)
{
	struct gguf_file *f = NULL;
	struct llama_hparams hp;
	int rc = gguf_open_mem(&f, buf, size, err);

	if (!rc)
		rc = gguf_llama_hparams(f, &hp, err);
	gguf_close(f);
	return rc;
}

static void put_u32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put_u64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

START_TEST(test_lying_files)
{
	struct gguf_llama_params p = tiny_params();
	struct gguf_file *f = NULL;
	struct gguf_error err;
	size_t size;
	uint8_t *buf = make_llama_mem(&p, &size), *orig = malloc(size);

	memcpy(orig, buf, size);
	ck_assert_int_eq(gguf_open_mem(&f, orig, size, &err), 0);
	const struct gguf_tensor *out = gguf_tensor_find(f, "output.weight");
	const struct gguf_tensor *emb = gguf_tensor_find(f, "token_embd.weight");
	const struct gguf_tensor *q = gguf_tensor_find(f, "blk.0.attn_q.weight");
	const struct gguf_kv *ff = gguf_find(f, "llama.feed_forward_length");
	const struct gguf_kv *vs = gguf_find(f, "llama.vocab_size");
	const struct gguf_kv *arch = gguf_find(f, "general.architecture");
	const struct gguf_kv *heads = gguf_find(f, "llama.attention.head_count");

	/* tensor offset past the end of the file */
	put_u64(buf + tinfo_type_at(out) + 4, size);
	ck_assert_int_eq(reopen(buf, size, &err), GGUF_E_TRUNCATED);
	ck_assert_ptr_nonnull(strstr(err.msg, "output.weight"));
	ck_assert_uint_eq(err.offset, out->info_offset);
	memcpy(buf, orig, size);

	/* a tensor whose data overlaps another's */
	put_u64(buf + tinfo_type_at(q) + 4, emb->offset);
	ck_assert_int_eq(reopen(buf, size, &err), GGUF_E_TENSOR);
	ck_assert_ptr_nonnull(strstr(err.msg, "overlap"));
	memcpy(buf, orig, size);

	/* misaligned data offset */
	put_u64(buf + tinfo_type_at(out) + 4, out->offset + 2);
	ck_assert_int_eq(reopen(buf, size, &err), GGUF_E_TENSOR);
	memcpy(buf, orig, size);

	/* unknown / unsupported tensor type */
	put_u32(buf + tinfo_type_at(q), 77);
	ck_assert_int_eq(reopen(buf, size, &err), GGUF_E_UNSUPPORTED);
	ck_assert_ptr_nonnull(strstr(err.msg, "blk.0.attn_q.weight"));
	memcpy(buf, orig, size);

	/* metadata says ff 64, tensors hold 32: the shape check names one */
	put_u32((uint8_t *)ff->value - f->map + buf, 64);
	ck_assert_int_eq(reopen(buf, size, &err), GGUF_E_TENSOR);
	ck_assert_ptr_nonnull(strstr(err.msg, "blk.0.ffn_gate.weight"));
	memcpy(buf, orig, size);

	/* heads 3: the embedding (32) does not split into 3 heads */
	put_u32((uint8_t *)heads->value - f->map + buf, 3);
	ck_assert_int_eq(reopen(buf, size, &err), GGUF_E_MALFORMED);
	memcpy(buf, orig, size);

	/* vocab_size disagrees with token_embd */
	put_u32((uint8_t *)vs->value - f->map + buf, 301);
	ck_assert_int_eq(reopen(buf, size, &err), GGUF_E_MALFORMED);
	ck_assert_ptr_nonnull(strstr(err.msg, "vocab_size"));
	memcpy(buf, orig, size);

	/* token_embd and output claim 299 rows (and vocab_size too), the
	 * tokenizer has 300 tokens */
	put_u64(buf + emb->info_offset + 8 + emb->name.len + 4 + 8, 299);
	put_u64(buf + out->info_offset + 8 + out->name.len + 4 + 8, 299);
	put_u32((uint8_t *)vs->value - f->map + buf, 299);
	ck_assert_int_eq(reopen(buf, size, &err), GGUF_E_MALFORMED);
	ck_assert_ptr_nonnull(strstr(err.msg, "tokenizer.ggml.tokens"));
	memcpy(buf, orig, size);

	/* another architecture */
	memcpy((uint8_t *)arch->value - f->map + buf + 8, "gemma", 5);
	ck_assert_int_eq(reopen(buf, size, &err), GGUF_E_ARCH);
	ck_assert_ptr_nonnull(strstr(err.msg, "gemma"));
	memcpy(buf, orig, size);

	/* a required key with the wrong type: block_count as a string-ish
	 * type id (f32) */
	const struct gguf_kv *bc = gguf_find(f, "llama.block_count");
	put_u32((uint8_t *)bc->value - f->map + buf - 4, GGUF_VT_FLOAT32);
	ck_assert_int_eq(reopen(buf, size, &err), GGUF_E_TYPE);
	ck_assert_ptr_nonnull(strstr(err.msg, "block_count"));
	memcpy(buf, orig, size);

	/* a required key renamed away */
	memcpy((uint8_t *)bc->key.ptr - f->map + buf, "xxxxx", 5);
	ck_assert_int_eq(reopen(buf, size, &err), GGUF_E_MISSING);
	ck_assert_ptr_nonnull(strstr(err.msg, "block_count"));
	memcpy(buf, orig, size);

	/* a layer tensor renamed: missing */
	memcpy((uint8_t *)q->name.ptr - f->map + buf, "blk.9", 5);
	ck_assert_int_eq(reopen(buf, size, &err), GGUF_E_TENSOR);
	ck_assert_ptr_nonnull(strstr(err.msg, "blk.0.attn_q.weight"));
	memcpy(buf, orig, size);

	ck_assert_int_eq(reopen(buf, size, &err), 0);
	gguf_close(f);
	free(orig);
	free(buf);
}
END_TEST

/* ---- kvctl model ----------------------------------------------------------- */

/* Run kvctl_cmd_model with stdout captured into out[size]. */
static int run_cli(char *out, size_t size, int argc, const char **argv)
{
	char path[] = "/tmp/kvd-cli-XXXXXX";
	int fd = mkstemp(path), saved, rc;
	ssize_t n;

	ck_assert_int_ge(fd, 0);
	fflush(stdout);
	saved = dup(1);
	dup2(fd, 1);
	rc = kvctl_cmd_model(argc, (char **)argv);
	fflush(stdout);
	dup2(saved, 1);
	close(saved);
	n = pread(fd, out, size - 1, 0);
	out[n > 0 ? n : 0] = 0;
	close(fd);
	unlink(path);
	return rc;
}

START_TEST(test_cli)
{
	char dir[] = "/tmp/kvd-cli-XXXXXX", path[64], out[8192];

	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/m.gguf", dir);
	const char *mk[] = { "model", "make", path, "--layers", "2", "--dim", "64",
			     "--heads", "4", "--kv-heads", "2", "--ff", "96",
			     "--vocab", "600", "--ctx", "1024", "--dtype", "q8_0",
			     "--seed", "7" };
	ck_assert_int_eq(run_cli(out, sizeof(out), KVD_ARRAY_SIZE(mk), mk), 0);
	const char *in[] = { "model", "inspect", path, "--memory", "1MiB",
			     "--kv-dtype", "f16", "--json" };
	ck_assert_int_eq(run_cli(out, sizeof(out), KVD_ARRAY_SIZE(in), in), 0);
	/* 2 * 2 layers * 2 kv heads * 16 dims * 2 bytes = 256 bytes/token */
	ck_assert_ptr_nonnull(strstr(out, "\"kv_bytes_per_token\":256"));
	ck_assert_ptr_nonnull(strstr(out, "\"kv_tokens\":4096"));
	ck_assert_ptr_nonnull(strstr(out, "\"n_vocab\":600"));
	ck_assert_ptr_nonnull(strstr(out, "\"n_ctx_train\":1024"));
	ck_assert_ptr_nonnull(strstr(out, "\"tensor_types\":{\"f32\":5,\"q8_0\":16}"));
	ck_assert_ptr_nonnull(strstr(out, "\"sha256\":\""));
	const char *txt[] = { "model", "inspect", path };
	ck_assert_int_eq(run_cli(out, sizeof(out), 3, txt), 0);
	ck_assert_ptr_nonnull(strstr(out, "kv per token  512 bytes (f32)"));

	/* usage errors: 2 */
	const char *u1[] = { "model" };
	const char *u2[] = { "model", "make" };
	const char *u3[] = { "model", "make", path, "--dim", "65" };
	const char *u4[] = { "model", "make", path, "--dtype", "q4_k" };
	const char *u5[] = { "model", "inspect", path, "--memory", "lots" };
	const char *u6[] = { "model", "inspect", path, "--bogus" };
	ck_assert_int_eq(run_cli(out, sizeof(out), 1, u1), 2);
	ck_assert_int_eq(run_cli(out, sizeof(out), 2, u2), 2);
	ck_assert_int_eq(run_cli(out, sizeof(out), 5, u3), 2);
	ck_assert_int_eq(run_cli(out, sizeof(out), 5, u4), 2);
	ck_assert_int_eq(run_cli(out, sizeof(out), 5, u5), 2);
	ck_assert_int_eq(run_cli(out, sizeof(out), 4, u6), 2);

	/* a bad file: 1 */
	FILE *fp = fopen(path, "r+b");
	ck_assert_ptr_nonnull(fp);
	ck_assert_int_eq(ftruncate(fileno(fp), 700), 0);
	fclose(fp);
	ck_assert_int_eq(run_cli(out, sizeof(out), 3, txt), 1);
	const char *missing[] = { "model", "inspect", "/nonexistent.gguf" };
	ck_assert_int_eq(run_cli(out, sizeof(out), 3, missing), 1);
	unlink(path);
	rmdir(dir);
}
END_TEST

static void gguf_gen_tests(TCase *tc)
{
	tcase_add_test(tc, test_writer_roundtrip);
	tcase_add_test(tc, test_f16_q8);
	tcase_add_test(tc, test_make_llama);
	tcase_add_test(tc, test_make_deterministic);
	tcase_add_test(tc, test_make_file);
	tcase_add_test(tc, test_make_vocab_from);
	tcase_add_test(tc, test_gen_truncations);
	tcase_add_test(tc, test_gen_corruptions);
	tcase_add_test(tc, test_lying_files);
	tcase_add_test(tc, test_cli);
}

static Suite *gguf_suite(void)
{
	Suite *s = suite_create("gguf");
	TCase *tc = tcase_create("core");

	tcase_set_timeout(tc, 600);
	tcase_add_test(tc, test_type_sizes);
	tcase_add_test(tc, test_open_errors);
	tcase_add_test(tc, test_header_errors);
	tcase_add_test(tc, test_tensor_errors);
	tcase_add_test(tc, test_error_msg);
	tcase_add_test(tc, test_stories_hparams);
	tcase_add_test(tc, test_tiny_random_hparams);
	tcase_add_test(tc, test_stories_truncations);
	tcase_add_test(tc, test_stories_flips);
	gguf_gen_tests(tc);
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
