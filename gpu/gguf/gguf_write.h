/* gguf_write.h - a small GGUF v3 writer.
 *
 * struct gguf_writer collects metadata key/values (every GGUF type,
 * including string arrays) and tensor infos in memory, then
 * gguf_writer_write*() emits the header, the metadata, the tensor infos,
 * and each tensor's data aligned to the writer's alignment. Tensor data
 * is either borrowed from the caller (it must stay alive until the write)
 * or produced by a fill callback at write time, so a 100M-parameter model
 * never needs to sit in memory as a whole.
 *
 * The generator of random llama models on top of it is gpu/model/gguf_gen.h.
 *
 * Errors: negative errno only (-EINVAL for bad arguments, -EEXIST for a
 * duplicate key or tensor name, -ENOMEM, or the errno of a failed write).
 * Thread safety: a writer belongs to one thread.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "gpu/gguf/gguf.h"

struct gguf_writer;

/* Produce tensor `index`'s nbytes of data into dst (writer-owned scratch,
 * already zeroed). Return 0 or a negative errno, which aborts the write. */
typedef int (*gguf_fill_fn)(void *ctx, uint64_t index, void *dst,
			    uint64_t nbytes);

/* alignment: power of two (0 = the GGUF default of 32); it is always
 * recorded as the key general.alignment (u32), written first. */
int gguf_writer_new(struct gguf_writer **out, uint32_t alignment);
void gguf_writer_free(struct gguf_writer *w);

/* For _cleanup_(gguf_writer_freep). */
static inline void gguf_writer_freep(struct gguf_writer **w)
{
	gguf_writer_free(*w);
}

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
