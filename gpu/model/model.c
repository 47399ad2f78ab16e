/* model.c - binding GGUF tensors to the llama forward pass.
 *
 * The reader (gguf.c) already proved that every tensor's bytes lie inside
 * the file and that the shapes agree with the metadata; this module asks
 * the questions only compute cares about - can the kernels read this type,
 * is the data aligned for it, are the bytes enough for rows x row_bytes -
 * and refuses with the tensor's name rather than computing garbage. The
 * checks are repeated here on purpose: a model must be refused by the code
 * that would misuse it, whatever the reader checked.
 */
#include "gpu/model/model.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conf/util.h"


static const struct gguf_tensor *find_shaped(const struct gguf_file *f,
					     const char *name, uint64_t ne0,
					     uint64_t ne1, struct gguf_error *err,
					     int *rc)
{
	const struct gguf_tensor *t = gguf_tensor_find(f, name);

	*rc = 0;
	if (!t) {
		*rc = gguf_error_set(err, MODEL_E_TENSOR, 0, "tensor '%s' is missing", name);
		return NULL;
	}
	if (t->ne[0] != ne0 || t->ne[1] != ne1 || t->ne[2] != 1 || t->ne[3] != 1) {
		*rc = gguf_error_set(err, MODEL_E_TENSOR, t->info_offset,
				 "tensor '%s' has shape [%llu, %llu], want [%llu, %llu]",
				 name, (unsigned long long)t->ne[0],
				 (unsigned long long)t->ne[1],
				 (unsigned long long)ne0, (unsigned long long)ne1);
		return NULL;
	}
	return t;
}

/* A norm or bias vector: F32, n values. */
static int bind_vec(struct model *m, const char *name, uint32_t n,
		    const float **out, struct gguf_error *err)
{
	int rc;
	const struct gguf_tensor *t = find_shaped(m->file, name, n, 1, err, &rc);

	if (!t)
		return rc;
	if (t->type != GGML_TYPE_F32)
		return gguf_error_set(err, MODEL_E_TYPE, t->info_offset,
				  "tensor '%s' has type %s; norm weights and biases must be f32",
				  name, ggml_type_name(t->type));
	if ((uintptr_t)t->data % 4 || t->nbytes < (uint64_t)n * 4)
		return gguf_error_set(err, MODEL_E_ALIGN, t->info_offset,
				  "tensor '%s' data is misaligned or short", name);
	*out = t->data;
	m->decode_bytes += (uint64_t)n * 4;
	m->n_params += n;
	return 0;
}

/* A matrix of `rows` rows of `cols` elements; ne = [cols, rows]. */
static int bind_mat(struct model *m, const char *name, uint32_t rows,
		    uint32_t cols, struct ops_mat *out, bool count_all,
		    struct gguf_error *err)
{
	int rc;
	const struct gguf_tensor *t = find_shaped(m->file, name, cols, rows, err, &rc);
	uint64_t rb;

	if (!t)
		return rc;
	if (!ops_type_supported(t->type))
		return gguf_error_set(err, MODEL_E_TYPE, t->info_offset,
				  "tensor '%s' has type %s, which kvd cannot compute with (supported: f32, f16, q8_0, q4_0, q2_k, q3_k, q4_k, q5_k, q6_k)",
				  name, ggml_type_name(t->type));
	rb = ggml_type_nbytes(t->type, cols);
	if (rb == 0)
		return gguf_error_set(err, MODEL_E_TENSOR, t->info_offset,
				  "tensor '%s': row of %u elements is not a whole number of %s blocks",
				  name, cols, ggml_type_name(t->type));
	if (t->nbytes < rb * rows)
		return gguf_error_set(err, MODEL_E_TENSOR, t->info_offset,
				  "tensor '%s': %llu bytes, need %llu",
				  name, (unsigned long long)t->nbytes,
				  (unsigned long long)(rb * rows));
	if ((uintptr_t)t->data % (t->type == GGML_TYPE_F32 ? 4 : 2))
		return gguf_error_set(err, MODEL_E_ALIGN, t->info_offset,
				  "tensor '%s' data is misaligned for %s",
				  name, ggml_type_name(t->type));
	*out = (struct ops_mat){ .type = t->type, .rows = rows, .cols = cols,
				 .row_bytes = rb, .data = t->data };
	m->decode_bytes += count_all ? rb * rows : rb;
	m->n_params += (uint64_t)rows * cols;
	return 0;
}

static int32_t token_id(const struct gguf_file *f, const char *key)
{
	uint32_t v;

	if (gguf_get_u32(f, key, &v) != 0 || v > INT32_MAX)
		return -1;
	return (int32_t)v;
}

static int model_bind(struct model *m, struct gguf_error *err)
{
	const struct llama_hparams *hp = &m->hp;
	uint32_t e = hp->n_embd, qd = hp->n_head * hp->head_dim;
	uint32_t kvd = hp->n_head_kv * hp->head_dim;
	char nm[96];
	int rc;

	if ((rc = bind_mat(m, "token_embd.weight", hp->n_vocab, e, &m->tok_embd,
			   false, err)) ||
	    (rc = bind_vec(m, "output_norm.weight", e, &m->output_norm, err)))
		return rc;
	if (gguf_tensor_find(m->file, "output.weight")) {
		if ((rc = bind_mat(m, "output.weight", hp->n_vocab, e, &m->output,
				   true, err)))
			return rc;
	} else {
		m->tied = true;
		m->output = m->tok_embd;
		m->decode_bytes += m->tok_embd.row_bytes * hp->n_vocab;
	}
	m->layers = calloc(hp->n_layer, sizeof(*m->layers));
	if (!m->layers)
		return gguf_error_set(err, -ENOMEM, 0, "out of memory");
	for (uint32_t l = 0; l < hp->n_layer; l++) {
		struct model_layer *L = &m->layers[l];
		/* want: bound only when the architecture has the tensor */
		const struct {
			const char *name;
			uint32_t rows, cols;
			struct ops_mat *mat;
			const float **vec;
			bool want;
		} b[] = {
			{ "attn_norm.weight", 0, e, NULL, &L->attn_norm, true },
			{ "attn_q.weight", qd, e, &L->wq, NULL, true },
			{ "attn_k.weight", kvd, e, &L->wk, NULL, true },
			{ "attn_v.weight", kvd, e, &L->wv, NULL, true },
			{ "attn_q.bias", 0, qd, NULL, &L->bq, hp->qkv_bias },
			{ "attn_k.bias", 0, kvd, NULL, &L->bk, hp->qkv_bias },
			{ "attn_v.bias", 0, kvd, NULL, &L->bv, hp->qkv_bias },
			{ "attn_q_norm.weight", 0, hp->head_dim, NULL, &L->q_norm, hp->qk_norm },
			{ "attn_k_norm.weight", 0, hp->head_dim, NULL, &L->k_norm, hp->qk_norm },
			{ "attn_output.weight", e, qd, &L->wo, NULL, true },
			{ "ffn_norm.weight", 0, e, NULL, &L->ffn_norm, true },
			{ "ffn_gate.weight", hp->n_ff, e, &L->w_gate, NULL, true },
			{ "ffn_up.weight", hp->n_ff, e, &L->w_up, NULL, true },
			{ "ffn_down.weight", e, hp->n_ff, &L->w_down, NULL, true },
		};

		for (size_t i = 0; i < KVD_ARRAY_SIZE(b); i++) {
			if (!b[i].want)
				continue;
			snprintf(nm, sizeof(nm), "blk.%u.%s", l, b[i].name);
			rc = b[i].mat ? bind_mat(m, nm, b[i].rows, b[i].cols,
						 b[i].mat, true, err)
				      : bind_vec(m, nm, b[i].cols, b[i].vec, err);
			if (rc)
				return rc;
		}
	}
	m->bos_id = token_id(m->file, "tokenizer.ggml.bos_token_id");
	m->eos_id = token_id(m->file, "tokenizer.ggml.eos_token_id");
	if (m->bos_id >= (int32_t)hp->n_vocab)
		m->bos_id = -1;
	if (m->eos_id >= (int32_t)hp->n_vocab)
		m->eos_id = -1;
	return 0;
}

int model_from_gguf(struct model **out, struct gguf_file *f,
		    struct gguf_error *err)
{
	struct model *m;
	int rc;

	if (err)
		*err = (struct gguf_error){ 0 };
	m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->file = f;
	rc = gguf_llama_hparams(f, &m->hp, err);
	if (!rc)
		rc = model_bind(m, err);
	if (rc) {
		model_free(m);
		return rc;
	}
	*out = m;
	return 0;
}

int model_open(struct model **out, const char *path, struct gguf_error *err)
{
	struct gguf_file *f;
	int rc;

	rc = gguf_open(&f, path, err);
	if (rc)
		return rc;
	rc = model_from_gguf(out, f, err);
	if (rc) {
		gguf_close(f);
		return rc;
	}
	(*out)->owns_file = true;
	return 0;
}

void model_free(struct model *m)
{
	if (!m)
		return;
	if (m->owns_file)
		gguf_close(m->file);
	free(m->layers);
	free(m);
}
