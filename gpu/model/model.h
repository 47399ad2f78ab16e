/* model.h - a llama, qwen2 or qwen3 model's weights, used in place from a GGUF mapping.
 *
 * model_open() opens the file (gpu/gguf/gguf.h), reads the hyperparameters
 * (gguf_llama_hparams, which checks keys and tensor shapes) and binds
 * every tensor the forward pass reads: presence, shape and type are
 * checked again here against the hparams, and every weight must have a
 * type the CPU kernels compute with (F32, F16, Q8_0, Q4_0; norms F32).
 * Nothing is copied: struct ops_mat points into the mapping. When
 * output.weight is absent the output head is the token embedding (tied).
 *
 * Errors: negative errno (open, mmap, ENOMEM); GGUF_E_* from the reader
 * for a malformed file; MODEL_E_* below. `err->msg` names the tensor and,
 * for MODEL_E_TYPE, its type ("tensor 'blk.0.attn_q.weight' has type q4_k,
 * which kvd cannot compute with").
 *
 * Thread safety: immutable after model_open(); any thread may read it.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "gpu/gguf/gguf.h"
#include "gpu/cpu/ops_cpu.h"

enum {
	MODEL_E_TENSOR = 100, /* a tensor is missing or has the wrong shape */
	MODEL_E_TYPE,         /* a tensor's type cannot be computed with */
	MODEL_E_ALIGN,        /* tensor data not aligned for its type */
};

struct model_layer {
	const float *attn_norm;   /* (n_embd) */
	struct ops_mat wq;        /* (n_head * head_dim, n_embd) */
	struct ops_mat wk;        /* (n_head_kv * head_dim, n_embd) */
	struct ops_mat wv;        /* (n_head_kv * head_dim, n_embd) */
	struct ops_mat wo;        /* (n_embd, n_head * head_dim) */
	const float *bq;          /* (n_head * head_dim) qwen2, else NULL */
	const float *bk;          /* (n_head_kv * head_dim) qwen2, else NULL */
	const float *bv;          /* (n_head_kv * head_dim) qwen2, else NULL */
	const float *q_norm;      /* (head_dim) qwen3, else NULL */
	const float *k_norm;      /* (head_dim) qwen3, else NULL */
	const float *ffn_norm;    /* (n_embd) */
	struct ops_mat w_gate;    /* (n_ff, n_embd) */
	struct ops_mat w_up;      /* (n_ff, n_embd) */
	struct ops_mat w_down;    /* (n_embd, n_ff) */
};

struct model {
	struct gguf_file *file;    /* owned when owns_file */
	bool owns_file;
	struct llama_hparams hp;
	struct ops_mat tok_embd;   /* (n_vocab, n_embd) */
	const float *output_norm;  /* (n_embd) */
	struct ops_mat output;     /* (n_vocab, n_embd); tok_embd when tied */
	bool tied;
	struct model_layer *layers; /* (n_layer) */
	int32_t bos_id;            /* tokenizer.ggml.bos_token_id, -1 absent */
	int32_t eos_id;            /* tokenizer.ggml.eos_token_id, -1 absent */
	/* Bytes of weights one decoded token reads: every matmul weight, the
	 * norms and one embedding row (the decode memory-bandwidth bound). */
	uint64_t decode_bytes;
	uint64_t n_params;         /* elements of all bound tensors */
};

int model_open(struct model **out, const char *path, struct gguf_error *err);
/* Bind a file the caller keeps open (and closes after model_free). */
int model_from_gguf(struct model **out, struct gguf_file *f,
		    struct gguf_error *err);
void model_free(struct model *m);
