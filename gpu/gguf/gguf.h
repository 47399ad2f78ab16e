/* gguf.h - read-only view of a GGUF v2/v3 model file.
 *
 * gguf_open() mmaps the file and parses the header, the metadata key/values
 * and the tensor infos. Nothing is computed and no tensor data is touched
 * (beyond bounds checks). All strings and tensor data point into the
 * mapping and live until gguf_close().
 *
 * Errors: a negative errno for system failures (open, mmap, ENOMEM); a
 * positive GGUF_E_* for a file that is not a valid GGUF, with `err`
 * naming the byte offset where the problem was found. A malformed file
 * never crashes the reader: every length and count is checked against the
 * mapping before it is used.
 *
 * Thread safety: a gguf_file is immutable after gguf_open(); any thread may
 * read it.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum {
	GGUF_E_MAGIC = 1,     /* not a GGUF file */
	GGUF_E_VERSION,       /* version other than 2 or 3 */
	GGUF_E_TRUNCATED,     /* a field runs past the end of the file */
	GGUF_E_MALFORMED,     /* a field holds an impossible value */
	GGUF_E_TENSOR,        /* tensor info inconsistent (shape, type, offset) */
	GGUF_E_MISSING,       /* a required metadata key is absent */
	GGUF_E_TYPE,          /* a metadata key has the wrong type */
	GGUF_E_ARCH,          /* architecture kvd cannot run */
	GGUF_E_UNSUPPORTED,   /* a tensor type kvd cannot compute with */
};

/* Metadata value types (GGUF spec). */
enum gguf_vtype {
	GGUF_VT_UINT8 = 0, GGUF_VT_INT8 = 1, GGUF_VT_UINT16 = 2,
	GGUF_VT_INT16 = 3, GGUF_VT_UINT32 = 4, GGUF_VT_INT32 = 5,
	GGUF_VT_FLOAT32 = 6, GGUF_VT_BOOL = 7, GGUF_VT_STRING = 8,
	GGUF_VT_ARRAY = 9, GGUF_VT_UINT64 = 10, GGUF_VT_INT64 = 11,
	GGUF_VT_FLOAT64 = 12,
};

/* Tensor element types (ggml numbering). */
enum ggml_type {
	GGML_TYPE_F32 = 0,
	GGML_TYPE_F16 = 1,
	GGML_TYPE_Q4_0 = 2,
	GGML_TYPE_Q4_1 = 3,
	GGML_TYPE_Q5_0 = 6,
	GGML_TYPE_Q5_1 = 7,
	GGML_TYPE_Q8_0 = 8,
	GGML_TYPE_Q8_1 = 9,
	GGML_TYPE_Q2_K = 10,
	GGML_TYPE_Q3_K = 11,
	GGML_TYPE_Q4_K = 12,
	GGML_TYPE_Q5_K = 13,
	GGML_TYPE_Q6_K = 14,
	GGML_TYPE_Q8_K = 15,
	GGML_TYPE_I8 = 24,
	GGML_TYPE_I16 = 25,
	GGML_TYPE_I32 = 26,
	GGML_TYPE_I64 = 27,
	GGML_TYPE_F64 = 28,
	GGML_TYPE_BF16 = 30,
};

struct gguf_error {
	int code;          /* GGUF_E_* or negative errno; 0 = no error */
	uint64_t offset;   /* byte offset in the file the error refers to */
	char msg[256];     /* human sentence, e.g. "tensor 'output.weight' ..." */
};

/* A string inside the mapping: not NUL-terminated. */
struct gguf_str {
	const char *ptr;
	uint64_t len;
};

struct gguf_kv {
	struct gguf_str key;
	enum gguf_vtype type;
	enum gguf_vtype arr_type;  /* when type == ARRAY */
	uint64_t arr_len;          /* when type == ARRAY */
	const uint8_t *value;      /* first byte of the value (or array data) */
	uint64_t offset;           /* file offset of the value */
	uint64_t key_offset;       /* file offset of the key (error messages) */
	/* String arrays only: (arr_len) views into the mapping, built at open
	 * so gguf_arr_str() is O(1). NULL for every other type. */
	const struct gguf_str *arr_str;
};

#define GGUF_MAX_DIMS 4

struct gguf_tensor {
	struct gguf_str name;
	uint32_t n_dims;
	uint64_t ne[GGUF_MAX_DIMS]; /* ne[0] is the contiguous dimension */
	enum ggml_type type;
	uint64_t offset;            /* relative to the data section */
	uint64_t nbytes;
	const void *data;           /* into the mapping */
	uint64_t info_offset;       /* file offset of the tensor info */
};

struct gguf_file {
	const uint8_t *map;
	size_t size;
	uint32_t version;
	uint64_t alignment;
	uint64_t data_offset;       /* file offset of the tensor data section */
	uint64_t n_kv;
	struct gguf_kv *kv;
	uint64_t n_tensors;
	struct gguf_tensor *tensors;
	bool owns_map;              /* munmap on close (false for _open_mem) */
};

int gguf_open(struct gguf_file **out, const char *path, struct gguf_error *err);
/* Parse a buffer the caller keeps alive (tests, fuzzing). */
int gguf_open_mem(struct gguf_file **out, const void *buf, size_t size,
		  struct gguf_error *err);
void gguf_close(struct gguf_file *f);
/* For _cleanup_(gguf_closep); NULL is fine. */
static inline void gguf_closep(struct gguf_file **f)
{
	if (*f)
		gguf_close(*f);
}

/* ---- metadata ---------------------------------------------------------- */
const struct gguf_kv *gguf_find(const struct gguf_file *f, const char *key);
/* Typed getters: 0, -ENOENT when absent, GGUF_E_TYPE on a type that does
 * not convert (any integer type converts to u32/u64 when in range). */
int gguf_get_u32(const struct gguf_file *f, const char *key, uint32_t *out);
int gguf_get_u64(const struct gguf_file *f, const char *key, uint64_t *out);
int gguf_get_f32(const struct gguf_file *f, const char *key, float *out);
int gguf_get_bool(const struct gguf_file *f, const char *key, bool *out);
int gguf_get_str(const struct gguf_file *f, const char *key,
		 struct gguf_str *out);
/* Array element access for string arrays (tokens, merges): walks the
 * array once at open to build an index, so this is O(1). GGUF_E_TYPE when
 * kv is not an array of strings, -ERANGE when i >= arr_len. */
int gguf_arr_str(const struct gguf_file *f, const struct gguf_kv *kv,
		 uint64_t i, struct gguf_str *out);
/* Numeric array element access (scores, token types): element i of an
 * array of any integer type (as i64; a uint64 past INT64_MAX only as
 * f64) or float type (as f64).
 * GGUF_E_TYPE for other arrays, -ERANGE when i >= arr_len. */
int gguf_arr_i64(const struct gguf_kv *kv, uint64_t i, int64_t *out);
int gguf_arr_f64(const struct gguf_kv *kv, uint64_t i, double *out);
/* Size in bytes of one value of a fixed-size type; 0 for STRING/ARRAY. */
size_t gguf_vtype_size(enum gguf_vtype t);
const char *gguf_vtype_name(enum gguf_vtype t);
/* Compare a mapping string with a C string. */
bool gguf_str_eq(struct gguf_str s, const char *c);
/* Human name of a GGUF_E_* code or negative errno. */
const char *gguf_strerror(int code);
/* What a failed call that filled err says, for a message: err->msg for
 * a typed error (rc > 0), strerror(-rc) for a negative errno (some, such
 * as model_from_gguf's -ENOMEM, fill no sentence). */
const char *gguf_error_msg(int rc, const struct gguf_error *err);
/* Fill `err` (if non-NULL) and return `code`: the one way modules that
 * read GGUF files (reader, tokenizer, model binding) report a problem. */
int gguf_error_set(struct gguf_error *err, int code, uint64_t offset,
		   const char *fmt, ...) __attribute__((format(printf, 4, 5)));

const struct gguf_tensor *gguf_tensor_find(const struct gguf_file *f,
					   const char *name);

const char *ggml_type_name(enum ggml_type t);
/* Bytes for `n` elements of type t (n must be a multiple of the block
 * size); 0 for an unknown type. */
uint64_t ggml_type_nbytes(enum ggml_type t, uint64_t n);
uint32_t ggml_type_block(enum ggml_type t);

/* ---- llama hyperparameters --------------------------------------------- */
enum kv_dtype {
	KV_DTYPE_F32 = 0,
	KV_DTYPE_F16 = 1,
};

/* The architectures kvd runs: one graph (pre-norm, GQA attention, SwiGLU
 * FFN) with per-architecture options, read from a table in gguf.c. */
enum llama_arch {
	LLAMA_ARCH_LLAMA = 0,   /* "llama": normal RoPE */
	LLAMA_ARCH_QWEN2,       /* "qwen2": Q/K/V biases, NEOX RoPE */
	LLAMA_ARCH_QWEN3,       /* "qwen3": per-head Q/K RMSNorm, NEOX RoPE */
};

enum llama_rope_mode {
	LLAMA_ROPE_NORMAL = 0,  /* pairs (2i, 2i + 1) */
	LLAMA_ROPE_NEOX,        /* pairs (i, i + rope_dim / 2) */
};

struct llama_hparams {
	char arch[32];          /* general.architecture ("llama", "qwen2", ...) */
	enum llama_arch arch_id;
	enum llama_rope_mode rope_mode;
	bool qkv_bias;          /* blk.N.attn_{q,k,v}.bias present (qwen2) */
	bool qk_norm;           /* blk.N.attn_{q,k}_norm.weight (qwen3) */
	uint32_t n_layer;       /* {arch}.block_count */
	uint32_t n_embd;        /* {arch}.embedding_length */
	uint32_t n_head;        /* {arch}.attention.head_count */
	uint32_t n_head_kv;     /* {arch}.attention.head_count_kv (= n_head) */
	uint32_t head_dim;      /* {arch}.attention.key_length (= value_length),
				 * else n_embd / n_head */
	uint32_t n_ff;          /* {arch}.feed_forward_length */
	uint32_t n_vocab;       /* rows of token_embd.weight */
	uint32_t n_ctx_train;   /* {arch}.context_length, cut to n_swa when
				 * that is smaller */
	uint32_t n_swa;         /* {arch}.attention.sliding_window (0: none);
				 * kvd attends to the whole context */
	uint32_t rope_dim;      /* {arch}.rope.dimension_count (= head_dim) */
	float rope_freq_base;   /* {arch}.rope.freq_base (10000) */
	float rope_freq_scale;  /* 1 / {arch}.rope.scale_linear (1) */
	float norm_eps;         /* {arch}.attention.layer_norm_rms_epsilon */
};

/* Read and check the hyperparameters of a llama, qwen2 or qwen3 file
 * (any other general.architecture is GGUF_E_ARCH, naming it). Besides the keys, it checks every tensor the llama graph uses exists
 * with the shape the metadata implies (output.weight may be absent: tied
 * embeddings), that the tokenizer's token count equals n_vocab, and
 * that {arch}.vocab_size, when present, agrees. Errors name the key or
 * tensor and its offset. */
int gguf_llama_hparams(const struct gguf_file *f, struct llama_hparams *hp,
		       struct gguf_error *err);

/* Bytes of K and V for one token across all layers:
 * 2 * n_layer * n_head_kv * head_dim * sizeof(dtype). */
uint64_t llama_kv_bytes_per_token(const struct llama_hparams *hp,
				  enum kv_dtype dt);
size_t kv_dtype_size(enum kv_dtype dt);
const char *kv_dtype_name(enum kv_dtype dt);
