/* fuzz_gguf.c - GGUF reader (gpu/gguf/gguf.h): gguf_open_mem, the metadata
 * getters, gguf_llama_hparams, and tokenizer_new on whatever it accepts.
 *
 * A model file is operator input: a truncated download or a file that
 * lies about its counts must come back as a typed GGUF_E_* with a message,
 * never a crash. Properties checked on every input:
 *   - rejected: a code in 1..GGUF_E_UNSUPPORTED (or -ENOMEM), a
 *     non-empty NUL-terminated message, *out left NULL;
 *   - accepted: every key, value, string-array element and tensor lies
 *     inside the buffer; each tensor's nbytes is what its type and shape
 *     imply, its data starts at data_offset + offset, aligned; the typed
 *     getters agree with the kv's type and array bounds say -ERANGE;
 *   - gguf_llama_hparams: 0 with self-consistent figures, or a typed error;
 *   - tokenizer_new: 0 (and it then encodes/decodes a fixed text with ids
 *     inside the vocabulary), or a typed error.
 *
 * Seeds: a small GGUF with every metadata type and a few tensors, and two
 * tiny llama models (SentencePiece and byte-level BPE vocabularies), all
 * produced by gpu/gguf/gguf_write.h and gpu/model/gguf_gen.h at run time.
 */
#include <errno.h>
#include <string.h>

#include "gpu/gguf/gguf.h"
#include "gpu/model/gguf_gen.h"
#include "gpu/gguf/gguf_write.h"
#include "gpu/text/tokenizer.h"
#include "tests/fuzz/fuzz.h"

const char fuzz_target_name[] = "gguf";

#define IN(p, n) in_buf(data, size, (const uint8_t *)(p), (uint64_t)(n))

static bool in_buf(const uint8_t *data, size_t size, const uint8_t *p,
		   uint64_t n)
{
	return p >= data && (uint64_t)(p - data) <= size &&
	       n <= size - (uint64_t)(p - data);
}

static void check_error(int r, const struct gguf_error *err, const char *what)
{
	FUZZ_CHECK((r > 0 && r <= GGUF_E_UNSUPPORTED) || r == -ENOMEM,
		   "%s returned %d (%s)", what, r, gguf_strerror(r));
	FUZZ_CHECK(memchr(err->msg, 0, sizeof(err->msg)) && err->msg[0],
		   "%s returned %d without a message", what, r);
}

static void check_kv(const struct gguf_file *f, const struct gguf_kv *kv,
		     const uint8_t *data, size_t size)
{
	FUZZ_CHECK(IN(kv->key.ptr, kv->key.len), "key outside the buffer");
	/* offset: where the value starts (an array's type and length first) */
	FUZZ_CHECK(kv->value == data + kv->offset +
		   (kv->type == GGUF_VT_ARRAY ? 12 : 0), "value pointer != offset");
	if (kv->type == GGUF_VT_STRING) {
		struct gguf_str s;
		uint64_t n;

		FUZZ_CHECK(IN(kv->value, 8), "string length outside");
		memcpy(&n, kv->value, 8);
		FUZZ_CHECK(IN(kv->value + 8, n), "string outside the buffer");
		(void)s;
	} else if (kv->type == GGUF_VT_ARRAY) {
		size_t es = gguf_vtype_size(kv->arr_type);

		if (kv->arr_type == GGUF_VT_STRING) {
			FUZZ_CHECK(kv->arr_len == 0 || kv->arr_str,
				   "string array without its index");
			for (uint64_t i = 0; i < kv->arr_len; i++) {
				struct gguf_str s;

				FUZZ_CHECK(gguf_arr_str(f, kv, i, &s) == 0,
					   "gguf_arr_str(%llu) failed",
					   (unsigned long long)i);
				FUZZ_CHECK(IN(s.ptr, s.len),
					   "array string %llu outside the buffer",
					   (unsigned long long)i);
			}
			struct gguf_str s;

			FUZZ_CHECK(gguf_arr_str(f, kv, kv->arr_len, &s) == -ERANGE,
				   "gguf_arr_str past the end not -ERANGE");
		} else {
			int64_t iv;
			double dv;

			FUZZ_CHECK(es > 0, "array of type %d accepted",
				   kv->arr_type);
			FUZZ_CHECK(kv->arr_len <= size / es &&
				   IN(kv->value, kv->arr_len * es),
				   "array data outside the buffer");
			if (kv->arr_len) {
				int a = gguf_arr_i64(kv, kv->arr_len - 1, &iv);
				int b = gguf_arr_f64(kv, kv->arr_len - 1, &dv);

				FUZZ_CHECK(a == 0 || a == GGUF_E_TYPE, "arr_i64 %d", a);
				FUZZ_CHECK(b == 0 || b == GGUF_E_TYPE, "arr_f64 %d", b);
				FUZZ_CHECK(a == 0 || b == 0 ||
					   kv->arr_type == GGUF_VT_BOOL, "numeric array "
					   "readable neither as int nor float");
			}
			int a = gguf_arr_i64(kv, kv->arr_len, &iv);

			FUZZ_CHECK(a == -ERANGE || a == GGUF_E_TYPE,
				   "arr_i64 past the end: %d", a);
		}
	} else {
		size_t es = gguf_vtype_size(kv->type);

		FUZZ_CHECK(es > 0, "value of unknown type %d accepted", kv->type);
		FUZZ_CHECK(IN(kv->value, es), "value outside the buffer");
	}
}

static void check_tensor(const struct gguf_file *f, const struct gguf_tensor *t,
			 const uint8_t *data, size_t size)
{
	uint64_t n = 1;
	bool overflow = false;

	FUZZ_CHECK(IN(t->name.ptr, t->name.len), "tensor name outside");
	FUZZ_CHECK(t->n_dims >= 1 && t->n_dims <= GGUF_MAX_DIMS,
		   "n_dims %u accepted", t->n_dims);
	for (uint32_t d = 0; d < t->n_dims; d++)
		overflow |= __builtin_mul_overflow(n, t->ne[d], &n);
	FUZZ_CHECK(!overflow, "element count overflows");
	FUZZ_CHECK(ggml_type_block(t->type) > 0, "unknown type %d accepted",
		   t->type);
	FUZZ_CHECK(t->nbytes == ggml_type_nbytes(t->type, n),
		   "nbytes %llu, type and shape say %llu",
		   (unsigned long long)t->nbytes,
		   (unsigned long long)ggml_type_nbytes(t->type, n));
	FUZZ_CHECK(t->offset % f->alignment == 0, "unaligned tensor offset");
	FUZZ_CHECK((const uint8_t *)t->data == data + f->data_offset + t->offset,
		   "data pointer != data_offset + offset");
	FUZZ_CHECK(IN(t->data, t->nbytes),
		   "tensor '%.*s' [%llu, +%llu) outside the %zu-byte buffer",
		   (int)(t->name.len > 64 ? 64 : t->name.len), t->name.ptr,
		   (unsigned long long)(f->data_offset + t->offset),
		   (unsigned long long)t->nbytes, size);
}

static void check_tokenizer(const struct gguf_file *f)
{
	static const char text[] = "Hello, world!\n  caf\xc3\xa9 \xe2\x96\x81x <s>";
	struct tokenizer *t = NULL;
	struct gguf_error err = { 0 };
	int32_t *ids = NULL;
	size_t n_ids = 0, len = 0;
	char *back = NULL;
	int r = tokenizer_new(&t, f, &err);

	if (r) {
		check_error(r, &err, "tokenizer_new");
		FUZZ_CHECK(t == NULL, "tokenizer_new failed but set *out");
		return;
	}
	uint32_t nv = tokenizer_n_vocab(t);

	r = tokenizer_encode(t, text, sizeof(text) - 1, true, &ids, &n_ids);
	FUZZ_CHECK(r == 0 || r == -ENOMEM, "encode: %d", r);
	for (size_t i = 0; !r && i < n_ids; i++)
		FUZZ_CHECK(ids[i] >= 0 && (uint32_t)ids[i] < nv,
			   "encode produced id %d, vocabulary %u", ids[i], nv);
	if (!r) {
		r = tokenizer_decode(t, ids, n_ids, &back, &len);
		FUZZ_CHECK(r == 0 || r == -ENOMEM, "decode: %d", r);
		if (!r)
			FUZZ_CHECK(tokenizer_utf8_valid(back, len),
				   "decode produced invalid UTF-8");
	}
	free(back);
	free(ids);
	tokenizer_free(t);
}

static void check_hparams(const struct gguf_file *f)
{
	struct llama_hparams hp;
	struct gguf_error err = { 0 };
	int r = gguf_llama_hparams(f, &hp, &err);

	if (r) {
		check_error(r, &err, "gguf_llama_hparams");
		return;
	}
	FUZZ_CHECK(hp.n_layer && hp.n_embd && hp.n_head && hp.n_head_kv &&
		   hp.n_vocab, "zero dimension accepted");
	FUZZ_CHECK((uint64_t)hp.head_dim * hp.n_head == hp.n_embd,
		   "head_dim %u x heads %u != embd %u", hp.head_dim, hp.n_head,
		   hp.n_embd);
	FUZZ_CHECK(hp.n_head % hp.n_head_kv == 0, "heads %u, kv heads %u",
		   hp.n_head, hp.n_head_kv);
	FUZZ_CHECK(memchr(hp.arch, 0, sizeof(hp.arch)), "arch not terminated");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct gguf_file *f = NULL;
	struct gguf_error err = { 0 };
	int r = gguf_open_mem(&f, data, size, &err);

	if (r) {
		check_error(r, &err, "gguf_open_mem");
		FUZZ_CHECK(err.code == r, "err.code %d, returned %d", err.code, r);
		FUZZ_CHECK(f == NULL, "failed open set *out");
		return 0;
	}
	FUZZ_CHECK(f && f->map == data && f->size == size, "mapping");
	FUZZ_CHECK(f->version == 2 || f->version == 3, "version %u", f->version);
	FUZZ_CHECK(f->alignment && !(f->alignment & (f->alignment - 1)),
		   "alignment %llu", (unsigned long long)f->alignment);
	/* without tensors the padding may be cut off by the end of the file */
	FUZZ_CHECK(f->data_offset <= size &&
		   (f->data_offset % f->alignment == 0 ||
		    (f->n_tensors == 0 && f->data_offset == size)),
		   "data_offset %llu", (unsigned long long)f->data_offset);
	for (uint64_t i = 0; i < f->n_kv; i++)
		check_kv(f, &f->kv[i], data, size);
	if (!gguf_find(f, "kvd.fuzz.absent")) {
		uint64_t u;

		FUZZ_CHECK(gguf_get_u64(f, "kvd.fuzz.absent", &u) == -ENOENT,
			   "absent key not -ENOENT");
	}
	for (uint64_t i = 0; i < f->n_tensors; i++)
		check_tensor(f, &f->tensors[i], data, size);
	for (uint64_t i = 0; i < f->n_tensors && i < 4; i++) {
		const struct gguf_tensor *t = &f->tensors[i];
		char name[64];

		if (t->name.len >= sizeof(name) || memchr(t->name.ptr, 0, t->name.len))
			continue;
		memcpy(name, t->name.ptr, t->name.len);
		name[t->name.len] = '\0';
		FUZZ_CHECK(gguf_tensor_find(f, name) != NULL,
			   "tensor '%s' not found by name", name);
	}
	check_hparams(f);
	check_tokenizer(f);
	gguf_close(f);
	return 0;
}

/* ---- seeds ------------------------------------------------------------- */

static void emit_writer(struct gguf_writer *w, fuzz_emit_fn emit, void *ctx)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *fp = open_memstream(&buf, &len);

	if (!fp)
		abort();
	if (gguf_writer_write_stream(w, fp) == 0 && fflush(fp) == 0)
		emit(ctx, buf, len);
	fclose(fp);
	free(buf);
	gguf_writer_free(w);
}

static void seed_generic(fuzz_emit_fn emit, void *ctx)
{
	static const uint32_t u32s[] = { 1, 2, 0xffffffffu };
	static const float f32s[] = { 0.5f, -1.0f };
	static const char *const strs[] = { "a", "", "\xe2\x96\x81the" };
	static const float w[64] = { 1.0f, 2.0f };
	static const uint16_t h[32] = { 0x3c00 };
	static uint8_t q[34 * 2];
	struct gguf_writer *g = NULL;
	uint64_t ne2[2] = { 8, 2 }, ne1[1] = { 32 }, neq[1] = { 64 };

	if (gguf_writer_new(&g, 32))
		abort();
	gguf_writer_add_str(g, "general.architecture", "test");
	gguf_writer_add_u8(g, "t.u8", 7);
	gguf_writer_add_i8(g, "t.i8", -7);
	gguf_writer_add_u16(g, "t.u16", 65535);
	gguf_writer_add_i16(g, "t.i16", -2);
	gguf_writer_add_u32(g, "t.u32", 123456);
	gguf_writer_add_i32(g, "t.i32", -123456);
	gguf_writer_add_u64(g, "t.u64", 1ull << 40);
	gguf_writer_add_i64(g, "t.i64", -1);
	gguf_writer_add_f32(g, "t.f32", 1.5f);
	gguf_writer_add_f64(g, "t.f64", 2.25);
	gguf_writer_add_bool(g, "t.bool", true);
	gguf_writer_add_arr(g, "t.arr_u32", GGUF_VT_UINT32, u32s, 3);
	gguf_writer_add_arr(g, "t.arr_f32", GGUF_VT_FLOAT32, f32s, 2);
	gguf_writer_add_arr_str(g, "t.arr_str", strs, 3);
	gguf_writer_add_tensor(g, "w.f32", GGML_TYPE_F32, 2, ne2, w, NULL, NULL);
	gguf_writer_add_tensor(g, "w.f16", GGML_TYPE_F16, 1, ne1, h, NULL, NULL);
	gguf_writer_add_tensor(g, "w.q8", GGML_TYPE_Q8_0, 1, neq, q, NULL, NULL);
	emit_writer(g, emit, ctx);
}

static void seed_llama(fuzz_emit_fn emit, void *ctx, enum gguf_vocab_kind v)
{
	struct gguf_llama_params p = GGUF_LLAMA_PARAMS_DEFAULT;
	struct gguf_writer *g = NULL;

	p.n_layer = 1;
	p.n_embd = 8;
	p.n_head = 2;
	p.n_head_kv = 1;
	p.n_ff = 8;
	p.n_vocab = 260;
	p.n_ctx = 64;
	p.wtype = GGML_TYPE_F16;
	p.tied = true;
	p.vocab = v;
	if (gguf_make_llama_writer(&g, &p))
		abort();
	emit_writer(g, emit, ctx);
}

void fuzz_target_seeds(fuzz_emit_fn emit, void *ctx)
{
	seed_generic(emit, ctx);
	seed_llama(emit, ctx, GGUF_VOCAB_LLAMA);
	seed_llama(emit, ctx, GGUF_VOCAB_GPT2);
}
