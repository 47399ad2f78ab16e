/* gguf_write.h - a small GGUF v3 writer, and a generator of llama models.
 *
 * struct gguf_writer collects metadata key/values (every GGUF type,
 * including string arrays) and tensor infos in memory, then
 * gguf_writer_write*() emits the header, the metadata, the tensor infos,
 * and each tensor's data aligned to the writer's alignment. Tensor data
 * is either borrowed from the caller (it must stay alive until the write)
 * or produced by a fill callback at write time, so a 100M-parameter model
 * never needs to sit in memory as a whole.
 *
 * gguf_make_llama() writes a complete, valid llama GGUF with deterministic
 * random weights and a byte-level vocabulary: the quick start, tests and
 * benchmarks use it instead of shipping model files.
 *
 * Errors: negative errno only (-EINVAL for bad arguments, -EEXIST for a
 * duplicate key or tensor name, -ENOMEM, or the errno of a failed write).
 * Thread safety: a writer belongs to one thread.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "gpu/gguf.h"

struct gguf_writer;

/* Produce tensor `index`'s nbytes of data into dst (writer-owned scratch,
 * already zeroed). Return 0 or a negative errno, which aborts the write. */
typedef int (*gguf_fill_fn)(void *ctx, uint64_t index, void *dst,
			    uint64_t nbytes);

/* alignment: power of two (0 = the GGUF default of 32); it is always
 * recorded as the key general.alignment (u32), written first. */
int gguf_writer_new(struct gguf_writer **out, uint32_t alignment);
void gguf_writer_free(struct gguf_writer *w);

/* ---- metadata (keys are copied; order is kept) ------------------------ */
int gguf_writer_add_u8(struct gguf_writer *w, const char *key, uint8_t v);
int gguf_writer_add_i8(struct gguf_writer *w, const char *key, int8_t v);
int gguf_writer_add_u16(struct gguf_writer *w, const char *key, uint16_t v);
int gguf_writer_add_i16(struct gguf_writer *w, const char *key, int16_t v);
int gguf_writer_add_u32(struct gguf_writer *w, const char *key, uint32_t v);
int gguf_writer_add_i32(struct gguf_writer *w, const char *key, int32_t v);
int gguf_writer_add_u64(struct gguf_writer *w, const char *key, uint64_t v);
int gguf_writer_add_i64(struct gguf_writer *w, const char *key, int64_t v);
int gguf_writer_add_f32(struct gguf_writer *w, const char *key, float v);
int gguf_writer_add_f64(struct gguf_writer *w, const char *key, double v);
int gguf_writer_add_bool(struct gguf_writer *w, const char *key, bool v);
int gguf_writer_add_str(struct gguf_writer *w, const char *key,
			const char *v);
/* An array of n fixed-size elements of type t (not STRING or ARRAY),
 * `data` holding n * gguf_vtype_size(t) little-endian bytes. */
int gguf_writer_add_arr(struct gguf_writer *w, const char *key,
			enum gguf_vtype t, const void *data, uint64_t n);
/* An array of n NUL-terminated strings. */
int gguf_writer_add_arr_str(struct gguf_writer *w, const char *key,
			    const char *const *strs, uint64_t n);

/* Hand `p` (malloc'd) to the writer: freed by gguf_writer_free(). For fill
 * contexts that must live until the write. */
int gguf_writer_attach(struct gguf_writer *w, void *p);

/* ---- tensors ------------------------------------------------------------ */
/* ne[0] is the contiguous dimension; ne[0] must be a multiple of the
 * type's block. `data` (nbytes, borrowed until the write) or `fill` (with
 * ctx) provides the bytes; exactly one of them must be non-NULL. */
int gguf_writer_add_tensor(struct gguf_writer *w, const char *name,
			   enum ggml_type type, uint32_t n_dims,
			   const uint64_t *ne, const void *data,
			   gguf_fill_fn fill, void *ctx);

/* Write the whole file to a stream / to `path` (through path.tmp and a
 * rename, so a reader never sees half a file). */
int gguf_writer_write_stream(struct gguf_writer *w, FILE *fp);
int gguf_writer_write(struct gguf_writer *w, const char *path);

/* ---- conversions (shared with tests and the engine's references) ------- */
uint16_t gguf_f32_to_f16(float f);      /* round to nearest even */
float gguf_f16_to_f32(uint16_t h);
/* Quantize n (multiple of 32) floats to Q8_0 blocks: per block an f16
 * scale d = max|x| / 127 then 32 int8 q = round(x / d). */
void gguf_quantize_q8_0(const float *x, uint64_t n, void *dst);
/* Same for Q4_0: (n / 32) blocks of 18 bytes. */
void gguf_quantize_q4_0(const float *x, uint64_t n, void *dst);

/* ---- llama model generator --------------------------------------------- */
enum gguf_vocab_kind {
	GGUF_VOCAB_LLAMA = 0,  /* SentencePiece: <unk> <s> </s>, bytes, pieces */
	GGUF_VOCAB_GPT2 = 1,   /* byte-level BPE: 256 byte chars, merges */
};

struct gguf_llama_params {
	const char *name;         /* general.name */
	uint32_t n_layer;
	uint32_t n_embd;
	uint32_t n_head;
	uint32_t n_head_kv;
	uint32_t n_ff;
	uint32_t n_vocab;         /* >= 259 for llama, >= 259 for gpt2 */
	uint32_t n_ctx;           /* llama.context_length */
	float rope_freq_base;
	float norm_eps;
	enum ggml_type wtype;     /* F32, F16 or Q8_0 for the 2-D weights */
	uint64_t seed;
	bool tied;                /* no output.weight: the head reuses token_embd */
	enum gguf_vocab_kind vocab;
};

#define GGUF_LLAMA_PARAMS_DEFAULT {                                   \
	.name = "kvd-random", .n_layer = 2, .n_embd = 64, .n_head = 4,  \
	.n_head_kv = 2, .n_ff = 128, .n_vocab = 512, .n_ctx = 2048,    \
	.rope_freq_base = 10000.0f, .norm_eps = 1e-5f,                 \
	.wtype = GGML_TYPE_F32, .seed = 1, .tied = false,              \
	.vocab = GGUF_VOCAB_LLAMA }

/* Parameter count of the model gguf_make_llama() would write. */
uint64_t gguf_llama_n_params(const struct gguf_llama_params *p);
/* Check the params (dims divisible, Q8_0 rows multiple of 32, ...);
 * -EINVAL with a reason in why[size] when they do not make a model. */
int gguf_llama_params_check(const struct gguf_llama_params *p, char *why,
			    size_t size);
/* Build the writer for a llama model (metadata, vocabulary and tensors
 * with deterministic random weights); the caller writes and frees it.
 * Lets tests add or change keys before writing. */
int gguf_make_llama_writer(struct gguf_writer **out,
			   const struct gguf_llama_params *p);
int gguf_make_llama(const char *path, const struct gguf_llama_params *p);
