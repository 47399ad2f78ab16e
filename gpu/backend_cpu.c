/* backend_cpu.c - the llama / qwen2 / qwen3 forward pass on the CPU.
 *
 * One forward() runs a batch of tokens from any number of sequences
 * (prompt chunks and decode steps mixed) through the model, reading the
 * weights in place and K/V through each sequence's pages. It reads like
 * the model diagram:
 *
 *   x = embed(tokens)
 *   for each layer:
 *     xb = rmsnorm(x) * attn_norm
 *     q, k, v = xb Wq, xb Wk, xb Wv         one threadpool run, rows split
 *     q, k, v += bq, bk, bv                 qwen2
 *     q, k = rmsnorm per head * q_norm, k_norm   qwen3
 *     rope(q, k); store k, v in the pages at each token's position
 *                                           (normal RoPE for llama, NEOX
 *                                           for qwen2 and qwen3)
 *     att = softmax(q k^T / sqrt(d)) v      per (token, head), split
 *     x += att Wo
 *     xb = rmsnorm(x) * ffn_norm
 *     hb, hb2 = xb Wgate, xb Wup
 *     x += (silu(hb) * hb2) Wdown
 *   logits = (rmsnorm(x) * output_norm) Wout   for the rows asked for
 *
 * Threads: matmuls are spread over the pool by output rows, attention by
 * (token, head) units, and the per-token steps between them (residual
 * adds, norms, SwiGLU, activation quantization, biases, RoPE and the K/V
 * store) by tokens, so every value is computed by one thread in one
 * fixed order: results do not depend on the thread count or on what else
 * is in the batch. A step too small to pay for waking the workers (a
 * decode step's per-token work) runs on the calling thread.
 *
 * Activations for quantized weights are quantized once per row per
 * sublayer input (shared by Q, K, V and by gate, up), right after the
 * step that produced the row, in the same per-token pass.
 */
#include "gpu/backend.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu/model/model.h"
#include "gpu/cpu/ops_cpu.h"
#include "gpu/model/prepack.h"
#include "gpu/cpu/threadpool.h"
#include "conf/util.h"

/* Multiply-adds below which a matmul runs on the calling thread alone. */
#define MM_INLINE_WORK (1u << 16)

struct cpu_ctx {
	const struct model *m;
	const struct ops_kernels *k;
	/* the model's layers and output head as this backend multiplies
	 * them: the same weights, with `packed` set where the kernel table
	 * has a layout of its own (the copies: `pack`, gpu/model/prepack.h) */
	struct model_layer *layers; /* (n_layer) */
	struct ops_mat output;
	struct prepack *pack;
	struct prepack_info pack_info;
	struct threadpool *tp;
	uint32_t max_tokens;
	uint32_t max_ctx;
	uint32_t page_tokens;
	enum kv_dtype dtype;
	uint64_t *k_off;          /* (n_layer) */
	uint64_t *v_off;          /* (n_layer) */

	/* run state; rows are batch tokens */
	float *x;                 /* (max_tokens, n_embd) residual stream */
	float *xb;                /* (max_tokens, n_embd) sublayer input/output */
	float *q;                 /* (max_tokens, n_head * head_dim) */
	float *kb;                /* (max_tokens, kv_dim) */
	float *vb;                /* (max_tokens, kv_dim) */
	float *att;               /* (max_tokens, n_head * head_dim) */
	float *hb;                /* (max_tokens, n_ff) gate, then swiglu */
	float *hb2;               /* (max_tokens, n_ff) up */
	/* by activation class (ops_act_class; [0] unused): (max_tokens,
	 * aq_stride[c]) prepared rows, q8 blocks ([1]) or Q8_K blocks ([2])
	 * of max(n_embd, n_ff, q dim) values */
	uint8_t *aq[OPS_ACT_CLASSES];
	size_t aq_stride[OPS_ACT_CLASSES];
	float *scores;            /* (threads, n_head / n_head_kv, max_ctx)
				   * attention scratch */
	float *cs;                /* (max_tokens, rope_dim) each token's RoPE
				   * cos/sin table, made in layer 0, read by all */
	struct ops_kv_view *views; /* (max_tokens) per sequence, current layer */
	struct backend_cpu_prof prof; /* time by part (backend_cpu_prof) */
	bool prof_cpu;            /* ... in thread CPU time */
};

static uint64_t prof_now(const struct cpu_ctx *c)
{
	struct timespec ts;

	if (!c->prof_cpu)
		return kvd_now_ns();
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Time `stmt` into c->prof.field. */
#define PROF(c, field, stmt)                                                 \
	do {                                                                 \
		uint64_t prof_t0_ = prof_now(c);                            \
                                                                             \
		stmt;                                                        \
		(c)->prof.field += prof_now(c) - prof_t0_;                  \
	} while (0)

/* Multiply-adds below which a run is "small" (a decode step's matmuls
 * and attention) and gets two chunks per thread instead of four. */
#define SMALL_RUN_WORK (1u << 24)

/* Chunks for `units` independent units of `work` multiply-adds in all: a
 * few per thread, so a thread the OS has parked does not hold the others
 * up (never fewer than 1). Every chunk costs a claim and a done count on
 * lines the threads pass back and forth (~0.1-0.2 us each): a decode
 * step's ~60 runs of 10-50 us take two chunks per thread, prompts four. */
static uint32_t tp_chunks(const struct cpu_ctx *c, uint32_t units, uint64_t work)
{
	uint32_t n = threadpool_size(c->tp) * (work < SMALL_RUN_WORK ? 2 : 4);

	return units < n ? (units ? units : 1) : n;
}

/* ---- matmul job: up to three matrices sharing one input, rows split ---- */

struct mm_part {
	const struct ops_mat *w;
	const void *act;          /* (n, act_stride) prepared for w->type */
	size_t act_stride;
	float *y;                 /* (n, y_stride) */
	size_t y_stride;
};

struct mm_job {
	const struct ops_kernels *k;
	uint32_t n;               /* tokens */
	uint32_t n_parts;
	uint32_t rows;            /* sum of the parts' rows */
	struct mm_part p[3];
};

static void mm_run(void *arg, uint32_t chunk, uint32_t n_chunks, uint32_t thread)
{
	struct mm_job *j = arg;
	uint32_t b, e, base = 0;

	threadpool_split(j->rows, chunk, n_chunks, &b, &e);
	/* chunk edges on multiples of 16 rows: the K-quant tiles take whole
	 * groups of 16 (ops_kq_gemm.c) and leave the rest to the slower
	 * dot; the chunks still cover every row once */
	b &= ~15u;
	e = chunk + 1 == n_chunks ? j->rows : e & ~15u;
	for (uint32_t i = 0; i < j->n_parts; i++) {
		const struct mm_part *p = &j->p[i];
		uint32_t lo = b > base ? b : base;
		uint32_t hi = e < base + p->w->rows ? e : base + p->w->rows;

		if (lo < hi)
			ops_matmul_rows(j->k, p->w, p->act, p->act_stride, j->n,
					p->y, p->y_stride, lo - base, hi - base);
		base += p->w->rows;
	}
}

/* The input rows x (cols wide) as weight w reads them: the f32 rows
 * themselves, or their quantization for w's activation class in
 * ctx->aq[class], which the caller then makes once per class with a
 * tok_job (bit `class` of *need set, the type noted in qtype; parts of one
 * job may mix classes, e.g. Q4_0 next to Q6_K). */
static void mm_bind(struct cpu_ctx *c, struct mm_part *p,
		    const struct ops_mat *w, const float *x, uint32_t cols,
		    unsigned *need, enum ggml_type *qtype, float *y,
		    size_t y_stride)
{
	int cls = ops_act_class(w->type);

	p->w = w;
	p->y = y;
	p->y_stride = y_stride;
	if (cls == 0) {
		p->act = x;
		p->act_stride = (size_t)cols * sizeof(float);
		return;
	}
	*need |= 1u << cls;
	qtype[cls] = w->type;
	p->act = c->aq[cls];
	p->act_stride = c->aq_stride[cls];
}

static void mm_go(struct cpu_ctx *c, struct mm_job *j)
{
	uint64_t work = 0, t0 = prof_now(c);

	j->k = c->k;
	j->rows = 0;
	for (uint32_t i = 0; i < j->n_parts; i++) {
		j->rows += j->p[i].w->rows;
		work += (uint64_t)j->p[i].w->rows * j->p[i].w->cols * j->n;
	}
	/* Tiny matmuls cost less than waking the workers. Running every part
	 * on this thread gives the same bits: rows are independent. */
	if (work < MM_INLINE_WORK)
		mm_run(j, 0, 1, 0);
	else
		threadpool_run(c->tp, mm_run, j, tp_chunks(c, j->rows, work));
	c->prof.mm_ns += prof_now(c) - t0;
}

/* ---- per-token job: the elementwise steps, tokens split --------------- */

/* For each token i, in this order, each step only when its field is set:
 *   add_to[i] += add_from[i]                    (add_cols)
 *   norm_out[i] = rmsnorm(norm_x[i]) * g        (cols)
 *   glu_a[i] = silu(glu_a[i]) * glu_b[i]        (glu_cols)
 *   aq[class][i] = prepare(q_src[i]) for each class in q_mask (q_cols)
 *   biases, head norms, RoPE, K/V store         (qkv: layer L of batch b)
 * Rows are (n, their cols) with the cols as strides. */
struct tok_job {
	struct cpu_ctx *c;
	uint32_t n;
	float *add_to;
	const float *add_from;
	uint32_t add_cols;
	const float *norm_x;
	float *norm_out;
	const float *g;
	uint32_t cols;
	float *glu_a;
	const float *glu_b;
	uint32_t glu_cols;
	const float *q_src;
	uint32_t q_cols;
	unsigned q_mask;
	enum ggml_type qtype[OPS_ACT_CLASSES];
	const struct backend_batch *qkv_b;
	const struct model_layer *qkv_L;
	bool qkv_table;           /* layer 0: make the RoPE tables */
};

static void cpu_qkv_finish(struct cpu_ctx *c, const struct backend_batch *b,
			   const struct model_layer *L, uint32_t i, bool table);

static void tok_run(void *arg, uint32_t chunk, uint32_t n_chunks, uint32_t thread)
{
	struct tok_job *j = arg;
	struct cpu_ctx *c = j->c;
	float eps = c->m->hp.norm_eps;
	uint32_t b, e;

	threadpool_split(j->n, chunk, n_chunks, &b, &e);
	for (uint32_t i = b; i < e; i++) {
		if (j->add_to) {
			float *y = j->add_to + (size_t)i * j->add_cols;
			const float *x = j->add_from + (size_t)i * j->add_cols;

			for (uint32_t k = 0; k < j->add_cols; k++)
				y[k] += x[k];
		}
		if (j->g)
			ops_rmsnorm(j->norm_out + (size_t)i * j->cols,
				    j->norm_x + (size_t)i * j->cols, j->g, j->cols, eps);
		if (j->glu_a)
			ops_swiglu(j->glu_a + (size_t)i * j->glu_cols,
				   j->glu_b + (size_t)i * j->glu_cols, j->glu_cols);
		for (int cls = 1; cls < OPS_ACT_CLASSES; cls++)
			if (j->q_mask & (1u << cls))
				ops_act_prepare(j->qtype[cls], j->q_src + (size_t)i * j->q_cols,
						j->q_cols, c->aq[cls] + c->aq_stride[cls] * i);
		if (j->qkv_L)
			cpu_qkv_finish(c, j->qkv_b, j->qkv_L, i, j->qkv_table);
	}
}

/* Values touched per token below which the steps run on this thread. */
#define TOK_INLINE_WORK (1u << 14)

static void tok_go(struct cpu_ctx *c, struct tok_job *j, uint32_t per_token)
{
	uint64_t t0 = prof_now(c);

	j->c = c;
	if ((uint64_t)j->n * per_token < TOK_INLINE_WORK || j->n == 1)
		tok_run(j, 0, 1, 0);
	else
		threadpool_run(c->tp, tok_run, j, tp_chunks(c, j->n, UINT64_MAX));
	c->prof.tok_ns += prof_now(c) - t0;
}

/* ---- attention job: (token, head) units split across threads -------- */

struct att_job {
	struct cpu_ctx *c;
	const struct backend_batch *b;
};

static void att_run(void *arg, uint32_t chunk, uint32_t n_chunks, uint32_t thread)
{
	struct att_job *j = arg;
	struct cpu_ctx *c = j->c;
	const struct llama_hparams *hp = &c->m->hp;
	uint32_t qd = hp->n_head * hp->head_dim, group = hp->n_head / hp->n_head_kv;
	float scale = 1.0f / sqrtf((float)hp->head_dim);
	/* (group, max_ctx) */
	float *scores = c->scores + (size_t)thread * group * c->max_ctx;
	uint32_t n_units = j->b->n_tokens * hp->n_head_kv;

	/* A unit is a token's GQA group: the query heads that share one K/V
	 * head, so each K/V row is read once for all of them. Units dealt
	 * out round-robin, not in runs: a prompt's later tokens attend to
	 * more positions, so contiguous runs of units gave the last chunk
	 * ~15x the first one's work and left one thread waiting on it;
	 * dealt out, every chunk gets early and late tokens alike */
	for (uint32_t u = chunk; u < n_units; u += n_chunks) {
		uint32_t i = u / hp->n_head_kv, kvh = u % hp->n_head_kv;
		uint32_t un = u + n_chunks, in = un / hp->n_head_kv;
		size_t off = (size_t)i * qd + (size_t)kvh * group * hp->head_dim;
		struct ops_att_next next;

		/* the next unit this thread takes: its K/V rows prefetched */
		if (un < n_units)
			next = (struct ops_att_next){
				.kv = &c->views[j->b->seq[in]],
				.kv_head = un % hp->n_head_kv, .n_pos = j->b->pos[in] + 1 };
		ops_attention_group(c->k, &c->views[j->b->seq[i]], c->q + off, kvh,
				    group, hp->head_dim, j->b->pos[i] + 1, scale,
				    scores, c->max_ctx, c->att + off,
				    un < n_units ? &next : NULL);
	}
}

/* ---- the forward pass ------------------------------------------------ */

static int cpu_check_batch(struct cpu_ctx *c, const struct backend_batch *b)
{
	if (b->n_tokens == 0 || b->n_tokens > c->max_tokens || b->n_seqs == 0 ||
	    b->n_seqs > c->max_tokens || b->n_out > b->n_tokens)
		return -EINVAL;
	for (uint32_t s = 0; s < b->n_seqs; s++) {
		const struct backend_seq *q = &b->seqs[s];

		if (q->n_kv > c->max_ctx ||
		    (q->n_kv + c->page_tokens - 1) / c->page_tokens > q->n_pages)
			return -EINVAL;
	}
	for (uint32_t i = 0; i < b->n_tokens; i++) {
		if (b->seq[i] >= b->n_seqs ||
		    b->pos[i] >= b->seqs[b->seq[i]].n_kv ||
		    b->tokens[i] < 0 ||
		    (uint32_t)b->tokens[i] >= c->m->hp.n_vocab)
			return -EINVAL;
	}
	for (uint32_t j = 0; j < b->n_out; j++)
		if (b->out[j] >= b->n_tokens)
			return -EINVAL;
	return 0;
}

static void add_bias(float *y, const float *bias, uint32_t n)
{
	for (uint32_t j = 0; j < n; j++)
		y[j] += bias[j];
}

/* qwen3: each head's vector normed on its own, before RoPE. */
static void norm_heads(float *x, const float *g, uint32_t n_heads,
		       uint32_t head_dim, float eps)
{
	for (uint32_t h = 0; h < n_heads; h++)
		ops_rmsnorm(x + (size_t)h * head_dim, x + (size_t)h * head_dim,
			    g, head_dim, eps);
}

/* The per-token steps between the Q/K/V matmuls and attention: biases,
 * head norms, RoPE (token i's cos/sin table, made when `table`: the
 * first layer's pass; the later layers' passes come after it), and the K/V
 * store. */
static void cpu_qkv_finish(struct cpu_ctx *c, const struct backend_batch *b,
			   const struct model_layer *L, uint32_t i, bool table)
{
	const struct llama_hparams *hp = &c->m->hp;
	uint32_t qd = hp->n_head * hp->head_dim, kvd = hp->n_head_kv * hp->head_dim;
	float *qi = c->q + (size_t)i * qd, *ki = c->kb + (size_t)i * kvd;
	float *vi = c->vb + (size_t)i * kvd;
	float *cs = c->cs + (size_t)i * hp->rope_dim;

	if (L->bq) {
		add_bias(qi, L->bq, qd);
		add_bias(ki, L->bk, kvd);
		add_bias(vi, L->bv, kvd);
	}
	if (L->q_norm) {
		norm_heads(qi, L->q_norm, hp->n_head, hp->head_dim, hp->norm_eps);
		norm_heads(ki, L->k_norm, hp->n_head_kv, hp->head_dim, hp->norm_eps);
	}
	if (table)
		ops_rope_table(cs, b->pos[i], hp->rope_dim, hp->rope_freq_base,
			       hp->rope_freq_scale);
	if (hp->rope_mode == LLAMA_ROPE_NEOX) {
		ops_rope_apply_neox(qi, hp->n_head, hp->head_dim, hp->rope_dim, cs);
		ops_rope_apply_neox(ki, hp->n_head_kv, hp->head_dim, hp->rope_dim, cs);
	} else {
		ops_rope_apply(qi, hp->n_head, hp->head_dim, hp->rope_dim, cs);
		ops_rope_apply(ki, hp->n_head_kv, hp->head_dim, hp->rope_dim, cs);
	}
	ops_kv_store(c->k, &c->views[b->seq[i]], b->pos[i], ki, vi);
}

/* One layer. The residual add that ends the layer is left to the next
 * per-token pass (the next layer's attention norm, or the final norm):
 * on return x is missing + xb. */
static void cpu_layer(struct cpu_ctx *c, const struct backend_batch *b,
		      uint32_t l)
{
	const struct llama_hparams *hp = &c->m->hp;
	const struct model_layer *L = &c->layers[l];
	uint32_t n = b->n_tokens, e = hp->n_embd;
	uint32_t qd = hp->n_head * hp->head_dim, kvd = hp->n_head_kv * hp->head_dim;
	struct mm_job mm;
	struct att_job aj = { .c = c, .b = b };
	struct tok_job tj;
	uint64_t att_work;

	/* attention block (first: the previous layer's residual) */
	mm = (struct mm_job){ .n = n, .n_parts = 3 };
	tj = (struct tok_job){ .n = n, .norm_x = c->x, .norm_out = c->xb,
			       .g = L->attn_norm, .cols = e, .q_src = c->xb, .q_cols = e };
	if (l > 0)
		tj.add_to = c->x, tj.add_from = c->xb, tj.add_cols = e;
	mm_bind(c, &mm.p[0], &L->wq, c->xb, e, &tj.q_mask, tj.qtype, c->q, qd);
	mm_bind(c, &mm.p[1], &L->wk, c->xb, e, &tj.q_mask, tj.qtype, c->kb, kvd);
	mm_bind(c, &mm.p[2], &L->wv, c->xb, e, &tj.q_mask, tj.qtype, c->vb, kvd);
	tok_go(c, &tj, 3 * e);
	mm_go(c, &mm);

	for (uint32_t s = 0; s < b->n_seqs; s++)
		c->views[s] = (struct ops_kv_view){
			.pages = b->seqs[s].pages, .page_tokens = c->page_tokens,
			.kv_dim = kvd, .dtype = c->dtype,
			.k_off = c->k_off[l], .v_off = c->v_off[l] };
	tj = (struct tok_job){ .n = n, .qkv_b = b, .qkv_L = L, .qkv_table = l == 0 };
	tok_go(c, &tj, qd + 2 * kvd);
	att_work = (uint64_t)n * hp->n_head * (b->pos[n - 1] + 1) * hp->head_dim;
	PROF(c, att_ns,
	     if (att_work < MM_INLINE_WORK)
		     att_run(&aj, 0, 1, 0);
	     else
		     threadpool_run(c->tp, att_run, &aj,
				    tp_chunks(c, n * hp->n_head_kv, att_work)));

	mm = (struct mm_job){ .n = n, .n_parts = 1 };
	tj = (struct tok_job){ .n = n, .q_src = c->att, .q_cols = qd };
	mm_bind(c, &mm.p[0], &L->wo, c->att, qd, &tj.q_mask, tj.qtype, c->xb, e);
	if (tj.q_mask)
		tok_go(c, &tj, qd);
	mm_go(c, &mm);

	/* feed-forward block */
	mm = (struct mm_job){ .n = n, .n_parts = 2 };
	tj = (struct tok_job){ .n = n, .add_to = c->x, .add_from = c->xb,
			       .add_cols = e, .norm_x = c->x, .norm_out = c->xb,
			       .g = L->ffn_norm, .cols = e, .q_src = c->xb, .q_cols = e };
	mm_bind(c, &mm.p[0], &L->w_gate, c->xb, e, &tj.q_mask, tj.qtype, c->hb, hp->n_ff);
	mm_bind(c, &mm.p[1], &L->w_up, c->xb, e, &tj.q_mask, tj.qtype, c->hb2, hp->n_ff);
	tok_go(c, &tj, 4 * e);
	mm_go(c, &mm);

	mm = (struct mm_job){ .n = n, .n_parts = 1 };
	tj = (struct tok_job){ .n = n, .glu_a = c->hb, .glu_b = c->hb2,
			       .glu_cols = hp->n_ff, .q_src = c->hb, .q_cols = hp->n_ff };
	mm_bind(c, &mm.p[0], &L->w_down, c->hb, hp->n_ff, &tj.q_mask, tj.qtype, c->xb, e);
	tok_go(c, &tj, 8 * hp->n_ff);
	mm_go(c, &mm);
}

/* The logits of the rows b->out asks for: final norm, quantization and
 * the output matmul (timed apart: logits_ns). */
static void cpu_logits(struct cpu_ctx *c, const struct backend_batch *b,
		       float *logits)
{
	const struct llama_hparams *hp = &c->m->hp;
	uint32_t e = hp->n_embd;
	uint64_t t0 = prof_now(c), mm0 = c->prof.mm_ns, tok0 = c->prof.tok_ns;
	struct mm_job mm;
	struct tok_job tj;

	/* xb: (n_out, n_embd) final-normed rows that want logits */
	for (uint32_t j = 0; j < b->n_out; j++)
		ops_rmsnorm(c->xb + (size_t)j * e, c->x + (size_t)b->out[j] * e,
			    c->m->output_norm, e, hp->norm_eps);
	mm = (struct mm_job){ .n = b->n_out, .n_parts = 1 };
	tj = (struct tok_job){ .n = b->n_out, .q_src = c->xb, .q_cols = e };
	mm_bind(c, &mm.p[0], &c->output, c->xb, e, &tj.q_mask, tj.qtype,
		logits, hp->n_vocab);
	if (tj.q_mask)
		tok_go(c, &tj, e);
	mm_go(c, &mm);
	c->prof.mm_ns = mm0;
	c->prof.tok_ns = tok0;
	c->prof.logits_ns += prof_now(c) - t0;
}

static int cpu_forward(void *ctx, const struct backend_batch *b, float *logits)
{
	struct cpu_ctx *c = ctx;
	const struct llama_hparams *hp = &c->m->hp;
	uint32_t e = hp->n_embd;
	struct tok_job tj;
	uint64_t t0 = prof_now(c);
	int rc;

	rc = cpu_check_batch(c, b);
	if (rc)
		return rc;
	for (uint32_t i = 0; i < b->n_tokens; i++)
		ops_mat_row_f32(&c->m->tok_embd, (uint32_t)b->tokens[i],
				c->x + (size_t)i * e);
	c->prof.tok_ns += prof_now(c) - t0;
	for (uint32_t l = 0; l < hp->n_layer; l++)
		cpu_layer(c, b, l);
	/* the last layer's residual */
	if (hp->n_layer > 0) {
		tj = (struct tok_job){ .n = b->n_tokens, .add_to = c->x,
				       .add_from = c->xb, .add_cols = e };
		tok_go(c, &tj, e);
	}
	if (b->n_out > 0)
		cpu_logits(c, b, logits);
	c->prof.forward_ns += prof_now(c) - t0;
	return 0;
}

static void cpu_free(void *ctx)
{
	struct cpu_ctx *c = ctx;

	if (!c)
		return;
	threadpool_free(c->tp);
	prepack_free(c->pack);
	free(c->layers);
	free(c->k_off);
	free(c->v_off);
	free(c->x);
	free(c->xb);
	free(c->q);
	free(c->kb);
	free(c->vb);
	free(c->att);
	free(c->hb);
	free(c->hb2);
	for (int i = 0; i < OPS_ACT_CLASSES; i++)
		free(c->aq[i]);
	free(c->scores);
	free(c->cs);
	free(c->views);
	free(c);
}

static const struct backend_ops cpu_ops = {
	.name = "cpu",
	.forward = cpu_forward,
	.free = cpu_free,
};

/* c->layers and c->output: the model's, each matrix packed for the
 * kernel table where it has a layout of its own, from the repack cache
 * when p names one (gpu/model/prepack.h). */
static int cpu_bind_weights(struct cpu_ctx *c, const struct backend_cpu_params *p)
{
	const struct model *m = c->m;
	const struct prepack_key key = { .dir = p->pack_dir, .sha256 = p->model_sha256,
					 .clean = p->pack_clean,
					 .keep_days = p->pack_keep_days,
					 .log = p->pack_log };
	struct ops_mat **all;
	uint32_t n = 0;
	int rc;

	c->layers = calloc(m->hp.n_layer ? m->hp.n_layer : 1, sizeof(*c->layers));
	all = calloc((size_t)m->hp.n_layer * 7 + 1, sizeof(*all));
	if (!c->layers || !all) {
		free(all);
		return -ENOMEM;
	}
	c->output = m->output;
	for (uint32_t l = 0; l < m->hp.n_layer; l++) {
		struct model_layer *L = &c->layers[l];

		*L = m->layers[l];
		all[n++] = &L->wq;
		all[n++] = &L->wk;
		all[n++] = &L->wv;
		all[n++] = &L->wo;
		all[n++] = &L->w_gate;
		all[n++] = &L->w_up;
		all[n++] = &L->w_down;
	}
	all[n++] = &c->output;
	rc = prepack_bind(&c->pack, c->k, all, n, &key, &c->pack_info);
	free(all);
	return rc;
}

/* A zeroed buffer on whole cache lines, its pages touched now: threads
 * writing neighbouring rows or heads do not share a line at the buffer's
 * start, and the first prompt does not take the page faults (a 128-token
 * prompt first touches ~4 MB of activations, ~1000 faults, which the two
 * threads take one at a time on the address space; page-fault handling
 * was a few percent of the samples of a whole `kvd generate` run).
 * NULL when out of memory or when the size overflows. */
static void *alloc_lines(size_t bytes)
{
	void *p;

	if (bytes > SIZE_MAX - 64)
		return NULL;
	bytes = (bytes ? bytes + 63 : 64) / 64 * 64;
	p = aligned_alloc(64, bytes);
	if (p)
		memset(p, 0, bytes);
	return p;
}

static void *alloc_f32(size_t rows, size_t cols)
{
	if (cols && rows > SIZE_MAX / sizeof(float) / cols)
		return NULL;
	return alloc_lines(rows * cols * sizeof(float));
}

int backend_cpu_new(struct backend *out, const struct model *m,
		    const struct backend_kv_layout *kv,
		    const struct backend_cpu_params *p)
{
	const struct llama_hparams *hp = &m->hp;
	uint32_t T = p->max_tokens, qd = hp->n_head * hp->head_dim;
	uint32_t kvd = hp->n_head_kv * hp->head_dim, widest;
	struct cpu_ctx *c;
	int rc;

	if (p->threads < 1 || T < 1 || p->max_ctx < 1 || kv->page_tokens < 1)
		return -EINVAL;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->m = m;
	c->prof_cpu = p->prof_cpu;
	c->k = ops_kernels_pick(p->simd);
	c->max_tokens = T;
	c->max_ctx = p->max_ctx;
	c->page_tokens = kv->page_tokens;
	c->dtype = kv->dtype;
	widest = KVD_MAX(KVD_MAX(hp->n_embd, hp->n_ff), qd);
	c->aq_stride[1] = (size_t)(widest / OPS_QK + 1) * sizeof(struct ops_block_q8_act);
	c->aq_stride[2] = (size_t)(widest / OPS_QK_K + 1) * sizeof(struct ops_block_q8_k);
	c->k_off = calloc(hp->n_layer, sizeof(*c->k_off));
	c->v_off = calloc(hp->n_layer, sizeof(*c->v_off));
	c->x = alloc_f32(T, hp->n_embd);
	c->xb = alloc_f32(T, hp->n_embd);
	c->q = alloc_f32(T, qd);
	c->kb = alloc_f32(T, kvd);
	c->vb = alloc_f32(T, kvd);
	c->att = alloc_f32(T, qd);
	c->hb = alloc_f32(T, hp->n_ff);
	c->hb2 = alloc_f32(T, hp->n_ff);
	c->aq[1] = alloc_f32(T, c->aq_stride[1] / sizeof(float));
	c->aq[2] = alloc_f32(T, c->aq_stride[2] / sizeof(float));
	c->scores = alloc_f32((size_t)p->threads * (hp->n_head / hp->n_head_kv),
			      p->max_ctx);
	c->cs = alloc_f32(T, hp->rope_dim);
	c->views = calloc(T, sizeof(*c->views));
	if (!c->k_off || !c->v_off || !c->x || !c->xb || !c->q || !c->kb ||
	    !c->vb || !c->att || !c->hb || !c->hb2 || !c->aq[1] || !c->aq[2] || !c->scores ||
	    !c->cs || !c->views) {
		cpu_free(c);
		return -ENOMEM;
	}
	rc = cpu_bind_weights(c, p);
	if (rc) {
		cpu_free(c);
		return rc;
	}
	memcpy(c->k_off, kv->k_off, hp->n_layer * sizeof(*c->k_off));
	memcpy(c->v_off, kv->v_off, hp->n_layer * sizeof(*c->v_off));
	rc = threadpool_new(&c->tp, p->threads);
	if (rc) {
		cpu_free(c);
		return rc;
	}
	out->ops = &cpu_ops;
	out->ctx = c;
	return 0;
}

const char *backend_cpu_kernels(const struct backend *b)
{
	const struct cpu_ctx *c = b->ctx;

	return b->ops == &cpu_ops ? c->k->name : "";
}

const struct ops_kernels *backend_cpu_kernel_table(const struct backend *b)
{
	const struct cpu_ctx *c = b->ctx;

	return b->ops == &cpu_ops ? c->k : NULL;
}

const struct prepack_info *backend_cpu_pack_info(const struct backend *b)
{
	const struct cpu_ctx *c = b->ctx;

	return b->ops == &cpu_ops ? &c->pack_info : NULL;
}

void backend_cpu_pool_stats(const struct backend *b, struct threadpool_stats *out)
{
	const struct cpu_ctx *c = b->ctx;

	if (b->ops == &cpu_ops)
		threadpool_stats(c->tp, out);
	else
		*out = (struct threadpool_stats){ 0 };
}

void backend_cpu_prof(const struct backend *b, struct backend_cpu_prof *out)
{
	const struct cpu_ctx *c = b->ctx;

	if (b->ops == &cpu_ops)
		*out = c->prof;
	else
		*out = (struct backend_cpu_prof){ 0 };
}
