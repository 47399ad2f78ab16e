/* gguf_gen.h - a generator of random llama, qwen2 and qwen3 GGUF models.
 *
 * gguf_make_llama() writes a complete, valid GGUF of the architecture in
 * params.arch (llama; qwen2 with Q/K/V biases; qwen3 with per-head Q/K
 * norms and attention.key_length) with deterministic
 * random weights and a SentencePiece or byte-level BPE vocabulary: the
 * quick start, tests and benchmarks use it instead of shipping model
 * files. gguf_make_llama_writer() stops before the write, so a test can
 * add or change keys first.
 *
 * Errors: negative errno only (-EINVAL for params that make no model, or
 * the writer's errors). Thread safety: none needed, no shared state.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpu/gguf/gguf.h"
#include "gpu/gguf/gguf_write.h"

enum gguf_vocab_kind {
	GGUF_VOCAB_LLAMA = 0,  /* SentencePiece: <unk> <s> </s>, bytes, pieces */
	GGUF_VOCAB_GPT2 = 1,   /* byte-level BPE: 256 byte chars, merges */
};

struct gguf_llama_params {
	const char *name;         /* general.name */
	enum llama_arch arch;     /* general.architecture and key prefix */
	uint32_t n_layer;
	uint32_t n_embd;
	uint32_t n_head;
	uint32_t n_head_kv;
	uint32_t head_dim;        /* 0: n_embd / n_head; else written as
				   * attention.key_length (= value_length) */
	uint32_t n_ff;
	uint32_t n_vocab;         /* >= 259 for llama, >= 259 for gpt2 */
	uint32_t n_ctx;           /* llama.context_length */
	float rope_freq_base;
	float norm_eps;
	enum ggml_type wtype;     /* F32, F16, Q8_0, Q4_0 or Q2_K..Q6_K for the
				   * 2-D weights (K-quants: dim, ff % 256) */
	/* attn_v, ffn_down and output in Q6_K, the rest in wtype (llama.cpp's
	 * _M mixes, simplified: every layer); needs dim, ff % 256 */
	bool mix_q6_k;
	uint64_t seed;
	bool tied;                /* no output.weight: the head reuses token_embd */
	enum gguf_vocab_kind vocab;
	/* When set: a GGUF (a vocab-only file will do) whose tokenizer.* keys
	 * are copied as they are instead of generating a vocabulary; n_vocab
	 * must equal its token count. Kept open by the caller until written. */
	const struct gguf_file *vocab_from;
	const char *chat_template;  /* tokenizer.chat_template; NULL: none */
};

#define GGUF_LLAMA_PARAMS_DEFAULT {                                   \
	.name = "kvd-random", .arch = LLAMA_ARCH_LLAMA, .n_layer = 2, .n_embd = 64, .n_head = 4,  \
	.n_head_kv = 2, .n_ff = 128, .n_vocab = 512, .n_ctx = 2048,    \
	.rope_freq_base = 10000.0f, .norm_eps = 1e-5f,                 \
	.wtype = GGML_TYPE_F32, .seed = 1, .tied = false,              \
	.vocab = GGUF_VOCAB_LLAMA }

/* "llama", "qwen2", "qwen3"; NULL for another value. */
const char *gguf_arch_name(enum llama_arch a);

/* Token count of a GGUF's tokenizer.ggml.tokens (for vocab_from); 0 when
 * it has none. */
uint32_t gguf_vocab_size(const struct gguf_file *f);

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
