/* test_engine.c - the engine's promises: a request's tokens do not depend
 * on thread count, batch company or page size (invariant 9); a corrupted
 * or stale page table stops the request before attention reads it
 * (invariant 1); over-long and unplaceable requests are refused with
 * nothing held (invariant 3); a prefill-only request's pages, moved to
 * another pool and lent to a second engine, continue into exactly the
 * tokens of the single-node run; every weight type runs; the sampler is a
 * pure function of (params, position, logits); a model with an unsupported
 * tensor type is refused naming the tensor and the type.
 *
 * Models are generated with gguf_make_llama into a temporary directory;
 * stories260K ($KVD_SHARED/models) is used in addition when present.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpu/backend.h"
#include "gpu/engine.h"
#include "gpu/kv/pcache.h"
#include "gpu/model/gguf_gen.h"
#include "gpu/gguf/gguf_write.h"
#include "gpu/kv/kvmem.h"
#include "gpu/kv/kvpool.h"
#include "gpu/model/model.h"
#include "gpu/text/tokenizer.h"
#include "conf/util.h"

static char tmpdir[256];

static void model_path(char *buf, size_t size, enum ggml_type t, bool tied)
{
	snprintf(buf, size, "%s/m_%s%s.gguf", tmpdir, ggml_type_name(t),
		 tied ? "_tied" : "");
}

static struct model *gen_model(enum ggml_type t, bool tied)
{
	struct gguf_llama_params p = GGUF_LLAMA_PARAMS_DEFAULT;
	char path[512];
	struct model *m;
	struct gguf_error err;

	p.n_layer = 2;
	p.n_embd = 64;
	p.n_head = 4;
	p.n_head_kv = 2;
	p.n_ff = 96;
	if (ops_kq_is(t)) /* K-quant rows are whole 256-weight blocks */
		p.n_embd = p.n_ff = 256;
	p.n_vocab = 320;
	p.n_ctx = 256;
	p.wtype = t;
	p.tied = tied;
	p.seed = 7;
	model_path(path, sizeof(path), t, tied);
	if (access(path, R_OK) != 0)
		ck_assert_int_eq(gguf_make_llama(path, &p), 0);
	ck_assert_msg(model_open(&m, path, &err) == 0, "%s", err.msg);
	return m;
}

static struct model *stories(void)
{
	const char *shared = getenv("KVD_SHARED");
	char path[1024];
	struct model *m;
	struct gguf_error err;

	snprintf(path, sizeof(path), "%s/models/stories260K.gguf",
		 shared ? shared : "../shared");
	if (access(path, R_OK) != 0)
		return NULL;
	ck_assert_msg(model_open(&m, path, &err) == 0, "%s", err.msg);
	return m;
}

/* ---- a small harness: a pool, an engine, run requests to the end ------ */

struct rig {
	struct kvmem mem;
	struct kvpool *pool;
	struct engine *e;
};

static void rig_init(struct rig *g, struct model *m, uint32_t threads,
		     uint32_t page_tokens, enum kv_dtype dt, uint32_t n_pages)
{
	struct kvpool_geom geom = { .page_tokens = page_tokens,
				    .n_layer = m->hp.n_layer,
				    .kv_dim = m->hp.n_head_kv * m->hp.head_dim,
				    .dtype = dt };
	struct engine_params ep = ENGINE_PARAMS_DEFAULT;

	kvmem_host_init(&g->mem);
	ck_assert_int_eq(kvpool_new(&g->pool, &g->mem, &geom, n_pages), 0);
	ep.threads = threads;
	ep.max_batch = 8;
	ep.prefill_chunk = 5;
	ep.n_ctx = 256;
	ck_assert_int_eq(engine_new(&g->e, m, g->pool, &ep, NULL), 0);
}

static void rig_deinit(struct rig *g)
{
	struct kvpool_stats st;

	engine_free(g->e);
	kvpool_get_stats(g->pool, &st);
	ck_assert_uint_eq(st.by_state[KVPAGE_FREE] + st.by_state[KVPAGE_QUARANTINED],
			  st.pages);
	kvpool_free(g->pool);
	kvmem_deinit(&g->mem);
}

struct job {
	int32_t prompt[32];
	uint32_t n_prompt;
	uint32_t max_tokens;
	struct sampler_params sp;
	uint32_t start_step;     /* submitted before this step */
	const struct pcache_key *key; /* prefix cache: whose (NULL: none) */
	/* results */
	uint32_t cached;         /* prompt tokens the cache gave */
	struct engine_req *req;
	int32_t out[64];
	uint32_t n_out;
	struct sampler_logprobs lp[64]; /* with sp.logprobs: each token's */
	uint32_t n_lp;
	enum engine_finish finish;
	int error;
};

static void job_make(struct job *j, uint32_t seed, uint32_t n_vocab,
		     bool sampled)
{
	memset(j, 0, sizeof(*j));
	j->n_prompt = 3 + seed % 11;
	j->prompt[0] = 1;
	for (uint32_t i = 1; i < j->n_prompt; i++)
		j->prompt[i] = (int32_t)(3 + (seed * 131 + i * 71) % (n_vocab - 3));
	j->max_tokens = 12 + seed % 9;
	j->sp = (struct sampler_params)SAMPLER_PARAMS_GREEDY;
	if (sampled) {
		j->sp.temperature = 0.9f;
		j->sp.top_k = 40;
		j->sp.top_p = 0.95f;
		j->sp.seed = 1000 + seed;
	}
}

/* Run jobs to completion; job i is submitted before step start_step. */
static void rig_run(struct rig *g, struct job *jobs, uint32_t n)
{
	uint32_t submitted = 0, step = 0;

	for (;;) {
		const struct engine_event *ev;
		size_t n_ev;

		for (uint32_t i = 0; i < n; i++)
			if (!jobs[i].req && jobs[i].start_step <= step) {
				struct engine_req_params rp = {
					.owner = 100 + i, .user = &jobs[i],
					.prompt = jobs[i].prompt,
					.n_prompt = jobs[i].n_prompt,
					.max_tokens = jobs[i].max_tokens,
					.sampling = jobs[i].sp, .ignore_eos = true,
					.cache_key = jobs[i].key };

				ck_assert_int_eq(engine_submit(g->e, &rp, &jobs[i].req), 0);
				submitted++;
			}
		if (submitted == n && engine_idle(g->e))
			break;
		ck_assert_int_eq(engine_step(g->e, &ev, &n_ev), 0);
		for (size_t k = 0; k < n_ev; k++) {
			struct job *j = &jobs[ev[k].owner - 100];

			ck_assert_ptr_eq(ev[k].req, j->req);
			ck_assert_ptr_eq(ev[k].user, j);
			if (ev[k].kind == ENGINE_EV_TOKEN) {
				ck_assert_uint_eq(ev[k].pos, j->n_prompt + j->n_out);
				/* logprobs only for a request that asked */
				ck_assert(!ev[k].lp == !j->sp.logprobs);
				if (ev[k].lp)
					j->lp[j->n_lp++] = *ev[k].lp;
				j->out[j->n_out++] = ev[k].token;
			} else {
				j->finish = ev[k].finish;
				j->error = ev[k].error;
			}
		}
		step++;
		ck_assert_uint_lt(step, 10000);
	}
	for (uint32_t i = 0; i < n; i++) {
		uint32_t nt;
		const int32_t *t = engine_req_tokens(jobs[i].req, &nt);

		/* the request's own record matches the events */
		ck_assert_uint_eq(nt, jobs[i].n_prompt + jobs[i].n_out);
		ck_assert_int_eq(memcmp(t + jobs[i].n_prompt, jobs[i].out,
					jobs[i].n_out * sizeof(int32_t)), 0);
		jobs[i].cached = engine_req_cached(jobs[i].req);
		engine_req_free(g->e, jobs[i].req);
		jobs[i].req = NULL;
	}
}

static void run_one(struct model *m, const struct job *tmpl, uint32_t threads,
		    uint32_t pt, enum kv_dtype dt, struct job *out)
{
	struct rig g;

	*out = *tmpl;
	out->req = NULL;
	out->n_out = 0;
	out->start_step = 0;
	rig_init(&g, m, threads, pt, dt, 64 / pt * 8 + 16);
	rig_run(&g, out, 1);
	rig_deinit(&g);
	ck_assert_int_eq(out->finish, ENGINE_FINISH_LENGTH);
	ck_assert_uint_eq(out->n_out, out->max_tokens);
}

static void assert_same(const struct job *a, const struct job *b, const char *what)
{
	ck_assert_msg(a->n_out == b->n_out, "%s: %u vs %u tokens", what,
		      a->n_out, b->n_out);
	for (uint32_t i = 0; i < a->n_out; i++)
		ck_assert_msg(a->out[i] == b->out[i], "%s: token %u: %d vs %d",
			      what, i, a->out[i], b->out[i]);
}

/* The target alone with (1 thread, 16-token pages) is the reference; it
 * must come out the same with 2 threads, with pages of 1 and 64 tokens,
 * and inside a batch of 8 whose members join at different steps. */
static void check_invariance(struct model *m, bool sampled, enum kv_dtype dt)
{
	struct job target, ref, v;
	struct job batch[8];
	struct rig g;

	job_make(&target, 5, m->hp.n_vocab, sampled);
	target.max_tokens = 20;
	run_one(m, &target, 1, 16, dt, &ref);
	run_one(m, &target, 2, 16, dt, &v);
	assert_same(&ref, &v, "threads 2");
	run_one(m, &target, 1, 1, dt, &v);
	assert_same(&ref, &v, "page_tokens 1");
	run_one(m, &target, 2, 64, dt, &v);
	assert_same(&ref, &v, "page_tokens 64");

	for (uint32_t threads = 1; threads <= 2; threads++) {
		for (uint32_t i = 0; i < 8; i++) {
			job_make(&batch[i], 20 + i, m->hp.n_vocab, i % 2 == 1);
			batch[i].start_step = (i * 3) % 7;
		}
		batch[3] = target;          /* the target joins at step 2 */
		batch[3].start_step = 2;
		rig_init(&g, m, threads, threads == 1 ? 4 : 16, dt, 200);
		rig_run(&g, batch, 8);
		rig_deinit(&g);
		assert_same(&ref, &batch[3], "batched with 7 others");
		/* and every member equals its own solo run */
		for (uint32_t i = 0; i < 8; i++) {
			struct job solo;

			batch[i].start_step = 0;
			run_one(m, &batch[i], 1, 16, dt, &solo);
			assert_same(&solo, &batch[i], "member solo vs batched");
		}
	}
}

/* The sampling controls (gpu/sampler.h) keep invariant 9: a request with
 * penalties, logit_bias, min_p and logprobs gives the same tokens and
 * logprobs alone and batched with others joining at other steps; only it
 * gets logprobs (rig_run checks); its logit_bias is the engine's own copy
 * (the caller's array is overwritten after submit); and the processing
 * changes the output (the same request without it differs). */
START_TEST(test_sampling_controls)
{
	struct model *m = gen_model(GGML_TYPE_F32, false);
	struct sampler_bias bias[2] = { { 4, -100.0f }, { 9, 3.0f } };
	struct job target, ref, plain, batch[6];
	struct rig g;
	bool differs = false;

	job_make(&target, 7, m->hp.n_vocab, true);
	target.max_tokens = 24;
	target.sp.frequency_penalty = 0.8f;
	target.sp.presence_penalty = 0.3f;
	target.sp.repetition_penalty = 1.3f;
	target.sp.min_p = 0.05f;
	target.sp.logit_bias = bias;
	target.sp.n_logit_bias = 2;
	target.sp.logprobs = true;
	target.sp.top_logprobs = 5;
	run_one(m, &target, 1, 16, KV_DTYPE_F32, &ref);
	ck_assert_uint_eq(ref.n_lp, ref.n_out);
	for (uint32_t i = 0; i < ref.n_out; i++) {
		ck_assert_int_ne(ref.out[i], 4);   /* banned */
		ck_assert_uint_eq(ref.lp[i].n_top, 5);
		ck_assert(ref.lp[i].logprob <= 0.0f);
	}
	plain = target;
	plain.sp = (struct sampler_params){ .temperature = target.sp.temperature,
		.top_k = target.sp.top_k, .top_p = target.sp.top_p, .seed = target.sp.seed };
	run_one(m, &plain, 1, 16, KV_DTYPE_F32, &plain);
	for (uint32_t i = 0; i < plain.n_out; i++)
		differs |= plain.out[i] != ref.out[i];
	ck_assert_msg(differs, "the processing changed nothing");
	for (uint32_t i = 0; i < 6; i++) {
		job_make(&batch[i], 40 + i, m->hp.n_vocab, i % 2 == 1);
		batch[i].start_step = (i * 5) % 7;
	}
	batch[2] = target;
	batch[2].start_step = 3;
	rig_init(&g, m, 2, 4, KV_DTYPE_F32, 200);
	rig_run(&g, batch, 6);
	rig_deinit(&g);
	assert_same(&ref, &batch[2], "extended, batched with 5 others");
	ck_assert_int_eq(memcmp(ref.lp, batch[2].lp, ref.n_lp * sizeof(ref.lp[0])), 0);
	/* the engine copied the bias: overwriting ours after submit changes nothing */
	{
		struct engine_req_params rp = { .owner = 7, .prompt = target.prompt,
			.n_prompt = target.n_prompt, .max_tokens = target.max_tokens,
			.sampling = target.sp, .ignore_eos = true };
		const struct engine_event *ev;
		struct engine_req *r;
		size_t n_ev;
		uint32_t n = 0;

		rig_init(&g, m, 1, 16, KV_DTYPE_F32, 64);
		ck_assert_int_eq(engine_submit(g.e, &rp, &r), 0);
		bias[0].bias = 100.0f;   /* would force token 4 */
		while (!engine_idle(g.e)) {
			ck_assert_int_eq(engine_step(g.e, &ev, &n_ev), 0);
			for (size_t k = 0; k < n_ev; k++)
				if (ev[k].kind == ENGINE_EV_TOKEN)
					ck_assert_int_eq(ev[k].token, ref.out[n++]);
		}
		ck_assert_uint_eq(n, ref.n_out);
		engine_req_free(g.e, r);
		rig_deinit(&g);
	}
	model_free(m);
}
END_TEST

START_TEST(test_invariance_generated)
{
	struct model *m = gen_model(GGML_TYPE_F32, false);

	check_invariance(m, false, KV_DTYPE_F32);
	check_invariance(m, true, KV_DTYPE_F16);
	model_free(m);
}
END_TEST

/* Each architecture, generated: llama; qwen2 (Q/K/V biases, NEOX RoPE,
 * tied); qwen3 (per-head Q/K norms, head dim 32 where dim / heads is
 * 16). Loads with the right options and head size and is invariant to
 * threads, page size and batching. */
START_TEST(test_invariance_arch)
{
	static const struct {
		enum llama_arch arch;
		uint32_t head_dim;
		bool tied;
	} cases[] = {
		{ LLAMA_ARCH_LLAMA, 0, false },
		{ LLAMA_ARCH_QWEN2, 0, true },
		{ LLAMA_ARCH_QWEN3, 32, false },
	};

	for (size_t i = 0; i < KVD_ARRAY_SIZE(cases); i++) {
		struct gguf_llama_params p = GGUF_LLAMA_PARAMS_DEFAULT;
		char path[512];
		struct model *m;
		struct gguf_error err;

		p.arch = cases[i].arch;
		p.head_dim = cases[i].head_dim;
		p.tied = cases[i].tied;
		p.n_embd = 64;
		p.n_head = 4;
		p.n_head_kv = 2;
		p.n_ff = 96;
		p.n_vocab = 320;
		p.n_ctx = 256;
		p.seed = 13;
		snprintf(path, sizeof(path), "%s/m_arch_%s.gguf", tmpdir,
			 gguf_arch_name(p.arch));
		ck_assert_int_eq(gguf_make_llama(path, &p), 0);
		ck_assert_msg(model_open(&m, path, &err) == 0, "%s", err.msg);
		ck_assert_int_eq(m->hp.arch_id, cases[i].arch);
		ck_assert_str_eq(m->hp.arch, gguf_arch_name(cases[i].arch));
		ck_assert_uint_eq(m->hp.head_dim, cases[i].head_dim ? cases[i].head_dim : 16);
		ck_assert_int_eq(m->hp.rope_mode, cases[i].arch == LLAMA_ARCH_LLAMA ?
				 LLAMA_ROPE_NORMAL : LLAMA_ROPE_NEOX);
		ck_assert(m->tied == cases[i].tied);
		ck_assert((m->layers[1].bq != NULL) == (cases[i].arch == LLAMA_ARCH_QWEN2));
		ck_assert((m->layers[1].k_norm != NULL) == (cases[i].arch == LLAMA_ARCH_QWEN3));
		ck_assert_uint_eq(llama_kv_bytes_per_token(&m->hp, KV_DTYPE_F32),
				  2ull * 2 * 2 * m->hp.head_dim * 4);
		check_invariance(m, false, KV_DTYPE_F32);
		check_invariance(m, true, KV_DTYPE_F16);
		model_free(m);
	}
}
END_TEST

/* A Mistral-style llama file: architecture llama, 32 query heads over 8
 * KV heads, SentencePiece vocabulary, rope.freq_base 1e6, Q4_K_M-style
 * mix and llama.attention.sliding_window 4096 next to a 32768 context.
 * It loads with those values (the context cut to the window, kvd's full
 * attention being the same computation below it), tokenizes and round
 * trips text, generates invariantly; the window key does not change a
 * token below the window, the rope base does, and a window of 0 is
 * refused naming the key. */
static void write_mistral(const char *path, float theta, int64_t window)
{
	struct gguf_llama_params p = GGUF_LLAMA_PARAMS_DEFAULT;
	struct gguf_writer *w;

	p.name = "Mistral-7B-style";
	p.n_layer = 2;
	p.n_embd = 256;
	p.n_head = 32;
	p.n_head_kv = 8;
	p.n_ff = 512;
	p.n_vocab = 320;
	p.n_ctx = 32768;
	p.rope_freq_base = theta;
	p.wtype = GGML_TYPE_Q4_K;
	p.mix_q6_k = true;
	p.vocab = GGUF_VOCAB_LLAMA;
	p.seed = 17;
	ck_assert_int_eq(gguf_make_llama_writer(&w, &p), 0);
	if (window >= 0)
		ck_assert_int_eq(gguf_writer_add_u32(w, "llama.attention.sliding_window",
						     (uint32_t)window), 0);
	ck_assert_int_eq(gguf_writer_write(w, path), 0);
	gguf_writer_free(w);
}

START_TEST(test_mistral_style)
{
	static const char text[] = "Hello world, the quick brown fox 42!";
	char path[512];
	struct model *m, *m2;
	struct gguf_error err;
	struct tokenizer *tk;
	int32_t *ids;
	size_t n_ids, len;
	char *back;
	struct job target, a, b;

	snprintf(path, sizeof(path), "%s/m_mistral.gguf", tmpdir);
	write_mistral(path, 1e6f, 4096);
	ck_assert_msg(model_open(&m, path, &err) == 0, "%s", err.msg);
	ck_assert_int_eq(m->hp.arch_id, LLAMA_ARCH_LLAMA);
	ck_assert_int_eq(m->hp.rope_mode, LLAMA_ROPE_NORMAL);
	ck_assert_uint_eq(m->hp.n_head, 32);
	ck_assert_uint_eq(m->hp.n_head_kv, 8);
	ck_assert_uint_eq(m->hp.head_dim, 8);
	ck_assert(m->hp.rope_freq_base == 1e6f);
	ck_assert_uint_eq(m->hp.n_swa, 4096);
	ck_assert_uint_eq(m->hp.n_ctx_train, 4096);
	ck_assert_int_eq(m->layers[0].wv.type, GGML_TYPE_Q6_K);
	ck_assert_int_eq(m->layers[0].wq.type, GGML_TYPE_Q4_K);
	ck_assert_uint_eq(llama_kv_bytes_per_token(&m->hp, KV_DTYPE_F16),
			  2ull * 2 * 8 * 8 * 2);

	ck_assert_int_eq(tokenizer_new(&tk, m->file, &err), 0);
	ck_assert_int_eq(tokenizer_kind(tk), TOKENIZER_SPM);
	ck_assert_int_eq(tokenizer_encode(tk, text, strlen(text), true, &ids, &n_ids), 0);
	ck_assert_uint_gt(n_ids, 1);
	ck_assert_int_eq(ids[0], tokenizer_bos(tk));
	ck_assert_int_eq(tokenizer_decode(tk, ids, n_ids, &back, &len), 0);
	ck_assert_str_eq(back, text);
	free(back);
	free(ids);
	tokenizer_free(tk);

	check_invariance(m, false, KV_DTYPE_F32);
	check_invariance(m, true, KV_DTYPE_F16);

	/* no window key: the same tokens (positions far below 4096) */
	job_make(&target, 9, m->hp.n_vocab, false);
	target.max_tokens = 24;
	run_one(m, &target, 1, 16, KV_DTYPE_F32, &a);
	snprintf(path, sizeof(path), "%s/m_mistral_nowin.gguf", tmpdir);
	write_mistral(path, 1e6f, -1);
	ck_assert_msg(model_open(&m2, path, &err) == 0, "%s", err.msg);
	ck_assert_uint_eq(m2->hp.n_swa, 0);
	ck_assert_uint_eq(m2->hp.n_ctx_train, 32768);
	run_one(m2, &target, 1, 16, KV_DTYPE_F32, &b);
	assert_same(&a, &b, "sliding_window key vs none");
	model_free(m2);

	/* rope base 1e4 instead of 1e6: the tokens change */
	snprintf(path, sizeof(path), "%s/m_mistral_theta.gguf", tmpdir);
	write_mistral(path, 1e4f, 4096);
	ck_assert_msg(model_open(&m2, path, &err) == 0, "%s", err.msg);
	run_one(m2, &target, 1, 16, KV_DTYPE_F32, &b);
	ck_assert_msg(memcmp(a.out, b.out, a.n_out * sizeof(int32_t)) != 0,
		      "rope.freq_base 1e4 and 1e6 gave the same %u tokens", a.n_out);
	model_free(m2);
	model_free(m);

	/* a window of 0 is malformed, named */
	snprintf(path, sizeof(path), "%s/m_mistral_bad.gguf", tmpdir);
	write_mistral(path, 1e6f, 0);
	ck_assert_int_ne(model_open(&m2, path, &err), 0);
	ck_assert_int_eq(err.code, GGUF_E_MALFORMED);
	ck_assert_ptr_nonnull(strstr(err.msg, "sliding_window"));
}
END_TEST

START_TEST(test_invariance_stories)
{
	struct model *m = stories();

	if (!m)
		return; /* the golden test reports the skip */
	check_invariance(m, false, KV_DTYPE_F32);
	check_invariance(m, true, KV_DTYPE_F32);
	check_invariance(m, false, KV_DTYPE_F16);
	model_free(m);
}
END_TEST

START_TEST(test_weight_types)
{
	const enum ggml_type types[] = { GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_Q8_0,
					 GGML_TYPE_Q4_0, GGML_TYPE_Q2_K, GGML_TYPE_Q3_K,
					 GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K };

	for (size_t t = 0; t < KVD_ARRAY_SIZE(types); t++)
		for (int tied = 0; tied < 2; tied++) {
			struct model *m = gen_model(types[t], tied);
			struct job j, a, b;

			ck_assert(m->tied == (bool)tied);
			ck_assert(m->layers[0].wq.type == types[t]);
			job_make(&j, 3, m->hp.n_vocab, false);
			run_one(m, &j, 1, 16, KV_DTYPE_F32, &a);
			run_one(m, &j, 2, 16, KV_DTYPE_F16, &b);
			for (uint32_t i = 0; i < a.n_out; i++)
				ck_assert(a.out[i] >= 0 &&
					  a.out[i] < (int32_t)m->hp.n_vocab);
			model_free(m);
		}
}
END_TEST

/* A Q4_0 model whose attn_v, ffn_down and output are Q6_K (as
 * llama-quantize's files carry a Q6_K output): the Q/K/V job mixes q8 and
 * Q8_K activation rows (one prepared buffer per class). It loads, runs,
 * and gives the same tokens with 1 or 2 threads and pages of 16 or 1. */
START_TEST(test_mixed_activation_classes)
{
	struct gguf_llama_params p = GGUF_LLAMA_PARAMS_DEFAULT;
	char path[512];
	struct model *m;
	struct gguf_error err;
	struct job j, a, b;

	p.n_embd = p.n_ff = 256;
	p.n_head = 4;
	p.n_head_kv = 2;
	p.n_vocab = 320;
	p.n_ctx = 256;
	p.wtype = GGML_TYPE_Q4_0;
	p.mix_q6_k = true;
	p.seed = 11;
	snprintf(path, sizeof(path), "%s/m_q4_0_mix.gguf", tmpdir);
	ck_assert_int_eq(gguf_make_llama(path, &p), 0);
	ck_assert_msg(model_open(&m, path, &err) == 0, "%s", err.msg);
	ck_assert_int_eq(m->layers[0].wq.type, GGML_TYPE_Q4_0);
	ck_assert_int_eq(m->layers[0].wv.type, GGML_TYPE_Q6_K);
	ck_assert_int_eq(m->layers[0].w_down.type, GGML_TYPE_Q6_K);
	ck_assert_int_eq(m->output.type, GGML_TYPE_Q6_K);
	job_make(&j, 3, m->hp.n_vocab, false);
	run_one(m, &j, 1, 16, KV_DTYPE_F32, &a);
	run_one(m, &j, 2, 1, KV_DTYPE_F32, &b);
	ck_assert_uint_eq(a.n_out, b.n_out);
	ck_assert_mem_eq(a.out, b.out, a.n_out * sizeof(a.out[0]));
	model_free(m);
}
END_TEST

/* ---- integrity ---------------------------------------------------------- */

/* ---- the prefix cache ----------------------------------------------------- */

struct crig {
	struct kvmem mem;
	struct kvpool *pool;
	struct pcache *cache;
	struct engine *e;
};

static void crig_init(struct crig *g, struct model *m, uint32_t n_pages)
{
	struct kvpool_geom geom = { .page_tokens = 4, .n_layer = m->hp.n_layer,
				    .kv_dim = m->hp.n_head_kv * m->hp.head_dim,
				    .dtype = KV_DTYPE_F32 };
	struct pcache_params pp = { .max_pages = n_pages };
	struct engine_params ep = ENGINE_PARAMS_DEFAULT;
	struct rig r;

	kvmem_host_init(&g->mem);
	ck_assert_int_eq(kvpool_new(&g->pool, &g->mem, &geom, n_pages), 0);
	ck_assert_int_eq(pcache_new(&g->cache, g->pool, &pp), 0);
	ep.threads = 2;
	ep.max_batch = 8;
	ep.prefill_chunk = 5;
	ep.n_ctx = 256;
	ep.cache = g->cache;
	ck_assert_int_eq(engine_new(&g->e, m, g->pool, &ep, NULL), 0);
	(void)r;
}

static void crig_run(struct crig *g, struct job *j, uint32_t n)
{
	struct rig r = { .mem = g->mem, .pool = g->pool, .e = g->e };

	for (uint32_t i = 0; i < n; i++) {
		j[i].req = NULL;
		j[i].n_out = 0;
	}
	rig_run(&r, j, n);
}

static void crig_deinit(struct crig *g)
{
	struct kvpool_stats st;

	engine_free(g->e);
	pcache_free(g->cache);
	kvpool_get_stats(g->pool, &st);
	ck_assert_uint_eq(st.by_state[KVPAGE_FREE] + st.by_state[KVPAGE_QUARANTINED],
			  st.pages);
	kvpool_free(g->pool);
	kvmem_deinit(&g->mem);
}

static void long_job(struct job *j, uint32_t seed, uint32_t n_vocab,
		     bool sampled, const struct pcache_key *k)
{
	job_make(j, seed, n_vocab, sampled);
	j->n_prompt = 30;
	for (uint32_t i = 1; i < j->n_prompt; i++)
		j->prompt[i] = (int32_t)(3 + (seed * 37 + i * 13) % (n_vocab - 3));
	j->max_tokens = 16;
	j->key = k;
}

/* Invariant 9 with the cache: a prompt that maps cached pages gives the
 * bytes it gives computed from scratch; another tenant (or salt) reuses
 * nothing; the reuse is reported. */
START_TEST(test_prefix_cache_purity)
{
	struct model *m = gen_model(GGML_TYPE_F32, false);
	static const uint8_t fp[32] = { 9 };
	struct pcache_key ka, kb, ks;
	struct job ref, j[3], batch[4];
	struct crig g;

	pcache_key_make(&ka, fp, "a", "", 0);
	pcache_key_make(&kb, fp, "b", "", 0);
	pcache_key_make(&ks, fp, "a", "salt", 4);
	for (int sampled = 0; sampled < 2; sampled++) {
		long_job(&j[0], 3, m->hp.n_vocab, sampled, NULL);
		run_one(m, &j[0], 1, 16, KV_DTYPE_F32, &ref);
		crig_init(&g, m, 96);
		for (int i = 0; i < 3; i++)
			long_job(&j[i], 3, m->hp.n_vocab, sampled, &ka);
		crig_run(&g, &j[0], 1);
		crig_run(&g, &j[1], 1);
		ck_assert_uint_eq(j[0].cached, 0);
		ck_assert_uint_eq(j[1].cached, 28); /* 7 full pages of 29 */
		assert_same(&ref, &j[0], "first, cache empty");
		assert_same(&ref, &j[1], "second, prefix from the cache");
		j[2].key = &kb;
		crig_run(&g, &j[2], 1);
		ck_assert_uint_eq(j[2].cached, 0);
		j[2].key = &ks;
		crig_run(&g, &j[2], 1);
		ck_assert_uint_eq(j[2].cached, 0);
		/* a batch: cached and uncached members, same prefix, one
		 * longer (one page past the cached part) */
		for (int i = 0; i < 4; i++) {
			long_job(&batch[i], 3, m->hp.n_vocab, sampled,
				 i % 2 ? &ka : &kb);
			batch[i].start_step = (uint32_t)i;
		}
		crig_run(&g, batch, 4);
		for (int i = 0; i < 4; i++)
			assert_same(&ref, &batch[i], "batched, cache or not");
		ck_assert_uint_eq(batch[1].cached, 28);
		crig_deinit(&g);
	}
	model_free(m);
}
END_TEST

/* A prompt's pages are cached as soon as it is computed: a request of the
 * same tenant that arrives while the first still generates maps them, and
 * both answer as they would alone. */
START_TEST(test_prefix_cache_while_running)
{
	struct model *m = gen_model(GGML_TYPE_F32, false);
	static const uint8_t fp[32] = { 9 };
	struct pcache_key ka;
	struct job ref, j[2];
	struct kvpool_stats st;
	struct crig g;

	pcache_key_make(&ka, fp, "a", "", 0);
	long_job(&j[0], 4, m->hp.n_vocab, false, NULL);
	run_one(m, &j[0], 1, 16, KV_DTYPE_F32, &ref);
	crig_init(&g, m, 96);
	for (int i = 0; i < 2; i++)
		long_job(&j[i], 4, m->hp.n_vocab, false, &ka);
	j[1].start_step = 12;   /* 30 prompt tokens in chunks of 5: done at 6 */
	crig_run(&g, j, 2);
	ck_assert_uint_eq(j[0].cached, 0);
	ck_assert_uint_eq(j[1].cached, 28);
	assert_same(&ref, &j[0], "first, cached while it ran");
	assert_same(&ref, &j[1], "second, mapped while the first ran");
	kvpool_get_stats(g.pool, &st);
	ck_assert_uint_eq(st.by_state[KVPAGE_CACHED], 7);
	crig_deinit(&g);
	model_free(m);
}
END_TEST

/* Admission never fails because of cached pages: they are evicted. */
START_TEST(test_prefix_cache_evicted_for_admission)
{
	struct model *m = gen_model(GGML_TYPE_F32, false);
	static const uint8_t fp[32] = { 9 };
	struct pcache_key ka;
	struct job j[4], big;
	struct kvpool_stats st;
	struct crig g;

	pcache_key_make(&ka, fp, "a", "", 0);
	crig_init(&g, m, 40);
	for (uint32_t i = 0; i < 4; i++) {
		long_job(&j[i], 10 + i, m->hp.n_vocab, false, &ka);
		crig_run(&g, &j[i], 1);
	}
	kvpool_get_stats(g.pool, &st);
	ck_assert_uint_eq(st.by_state[KVPAGE_CACHED], 28);
	long_job(&big, 50, m->hp.n_vocab, false, &ka);
	big.max_tokens = 60;   /* 89 positions: 23 pages, 12 free */
	crig_run(&g, &big, 1);
	ck_assert_int_eq(big.finish, ENGINE_FINISH_LENGTH);
	crig_deinit(&g);
	model_free(m);
}
END_TEST

/* Mutation: a cached page whose tag no longer names its entry (another
 * page's bytes, or the owner changed) fails the request that maps it as
 * an integrity error, never an answer; the cached pages are quarantined. */
START_TEST(test_prefix_cache_mutation)
{
	struct model *m = gen_model(GGML_TYPE_F32, false);
	static const uint8_t fp[32] = { 9 };
	struct pcache_key ka;
	struct kvpool_page_info info[64];
	struct kvpool_stats st;
	struct job j[2];
	struct crig g;
	uint32_t n, victim = UINT32_MAX;

	for (int how = 0; how < 2; how++) {
		pcache_key_make(&ka, fp, "a", "", 0);
		crig_init(&g, m, 64);
		long_job(&j[0], 3, m->hp.n_vocab, false, &ka);
		crig_run(&g, &j[0], 1);
		n = kvpool_snapshot(g.pool, info, 64);
		for (uint32_t i = 0; i < n; i++)
			if (info[i].state == KVPAGE_CACHED)
				victim = i;
		ck_assert_uint_ne(victim, UINT32_MAX);
		{
			struct kvtag *t = kvpool_page_addr(g.pool, victim);

			if (how == 0)
				t->owner ^= 1;
			else
				t->page ^= 1;
		}
		long_job(&j[1], 3, m->hp.n_vocab, false, &ka);
		crig_run(&g, &j[1], 1);
		ck_assert_int_eq(j[1].finish, ENGINE_FINISH_ERROR);
		ck_assert_int_eq(j[1].error, ENGINE_E_INTEGRITY);
		ck_assert_uint_eq(j[1].n_out, 0);
		kvpool_get_stats(g.pool, &st);
		ck_assert_uint_eq(st.by_state[KVPAGE_CACHED], 0);
		ck_assert_uint_ge(st.by_state[KVPAGE_QUARANTINED], 7);
		crig_deinit(&g);
	}
	model_free(m);
}
END_TEST

START_TEST(test_integrity_corrupt_tag)
{
	struct model *m = gen_model(GGML_TYPE_F32, false);
	struct rig g;
	struct job j[2], solo;
	struct engine_req_params rp[2];
	const struct engine_event *ev;
	size_t n_ev;
	bool victim_done = false;
	uint32_t n_table, n_kv, steps = 0;
	const struct kvpool_ref *table;
	struct kvpool_stats st;

	rig_init(&g, m, 2, 4, KV_DTYPE_F32, 64);
	for (int i = 0; i < 2; i++) {
		job_make(&j[i], 9 + i, m->hp.n_vocab, false);
		rp[i] = (struct engine_req_params){
			.owner = 100 + i, .prompt = j[i].prompt,
			.n_prompt = j[i].n_prompt, .max_tokens = j[i].max_tokens,
			.sampling = j[i].sp, .ignore_eos = true };
		ck_assert_int_eq(engine_submit(g.e, &rp[i], &j[i].req), 0);
	}
	/* run until the victim decodes, then let another owner's bytes land on
	 * its first page: the tag no longer names it */
	while (engine_req_n_output(j[0].req) < 3) {
		ck_assert_int_eq(engine_step(g.e, &ev, &n_ev), 0);
		for (size_t k = 0; k < n_ev; k++)
			if (ev[k].owner == 101 && ev[k].kind == ENGINE_EV_TOKEN)
				j[1].out[j[1].n_out++] = ev[k].token;
	}
	table = engine_req_table(j[0].req, &n_table, &n_kv);
	ck_assert_uint_gt(n_kv, 0);
	{
		struct kvtag *t = kvpool_page_addr(g.pool, table[0].page);

		t->owner = 999;
	}
	while (!engine_idle(g.e)) {
		ck_assert_int_eq(engine_step(g.e, &ev, &n_ev), 0);
		for (size_t k = 0; k < n_ev; k++) {
			if (ev[k].owner == 100) {
				/* no token after the corruption: only the error */
				ck_assert_int_eq(ev[k].kind, ENGINE_EV_DONE);
				ck_assert_int_eq(ev[k].finish, ENGINE_FINISH_ERROR);
				ck_assert_int_eq(ev[k].error, ENGINE_E_INTEGRITY);
				victim_done = true;
			} else if (ev[k].kind == ENGINE_EV_TOKEN) {
				j[1].out[j[1].n_out++] = ev[k].token;
			}
		}
		ck_assert_uint_lt(++steps, 1000);
	}
	ck_assert(victim_done);
	ck_assert_uint_eq(engine_req_n_output(j[0].req), 3);
	/* the neighbour is untouched: same tokens as alone */
	run_one(m, &j[1], 1, 16, KV_DTYPE_F32, &solo);
	assert_same(&solo, &j[1], "neighbour of a failed request");
	engine_req_free(g.e, j[0].req);
	engine_req_free(g.e, j[1].req);
	kvpool_get_stats(g.pool, &st);
	ck_assert_uint_eq(st.by_state[KVPAGE_QUARANTINED], n_table);
	rig_deinit(&g);
	model_free(m);
}
END_TEST

START_TEST(test_integrity_stale_table)
{
	struct model *m = gen_model(GGML_TYPE_F32, false);
	struct rig g;
	struct kvpool_ref table[4], stale[4];
	int32_t prompt[6] = { 1, 5, 6, 7, 8, 9 };
	struct engine_req_params rp = {
		.owner = 7, .prompt = prompt, .n_prompt = 6, .max_tokens = 4,
		.sampling = SAMPLER_PARAMS_GREEDY, .table = stale, .n_table = 4,
		.n_cached = 4 };
	struct engine_req *r;
	const struct engine_event *ev;
	size_t n_ev;

	rig_init(&g, m, 1, 4, KV_DTYPE_F32, 8);
	/* owner 7 held these pages once; they were released and reserved
	 * again: the old table's generations are stale */
	ck_assert_int_eq(kvpool_reserve(g.pool, 7, 4, table), 0);
	memcpy(stale, table, sizeof(table));
	ck_assert_int_eq(kvpool_release(g.pool, 7, table, 4), 0);
	ck_assert_int_eq(kvpool_reserve(g.pool, 8, 4, table), 0);
	ck_assert_int_eq(engine_submit(g.e, &rp, &r), 0);
	ck_assert_int_eq(engine_step(g.e, &ev, &n_ev), 0);
	ck_assert_uint_eq(n_ev, 1);
	ck_assert_int_eq(ev[0].kind, ENGINE_EV_DONE);
	ck_assert_int_eq(ev[0].error, ENGINE_E_INTEGRITY);
	engine_req_free(g.e, r);
	ck_assert_int_eq(kvpool_release(g.pool, 8, table, 4), 0);
	rig_deinit(&g);
	model_free(m);
}
END_TEST

/* ---- admission ------------------------------------------------------------ */

/* The step budget (engine.step_tokens) and the scheduling policy: with
 * decoders running and prompts arriving, every step stays within the
 * budget, every decoding request gets a token in every step (the
 * inter-token bound), prompts advance oldest first by at most
 * prefill_chunk each, and several prompts share a step when they fit.
 * A budget below max_batch is refused. With a step time target
 * (engine.step_ms) far below what a step takes, once the step cost is
 * learned every step with decoders carries only the floor of prompt
 * tokens that keeps prompts going (ENGINE_STEP_MIN_PROMPT). The tokens
 * do not depend on the budget or the target (purity). */
START_TEST(test_step_budget)
{
	struct model *m = gen_model(GGML_TYPE_F32, false);
	const uint32_t budgets[] = { 0, 6, 9, 40, 0 };
	const uint32_t step_us[] = { 0, 0, 0, 0, 1 };
	int32_t outs[5][6][8];

	for (size_t bi = 0; bi < KVD_ARRAY_SIZE(budgets); bi++) {
		struct engine_params ep = ENGINE_PARAMS_DEFAULT;
		struct kvpool_geom geom = { .page_tokens = 4, .n_layer = m->hp.n_layer,
					    .kv_dim = m->hp.n_head_kv * m->hp.head_dim,
					    .dtype = KV_DTYPE_F32 };
		struct kvmem mem;
		struct kvpool *pool;
		struct engine *e;
		struct engine_req *r[6];
		int32_t prompt[6][20];
		uint32_t budget, steps = 0, target_steps = 0;

		ep.max_batch = 6;
		ep.prefill_chunk = 7;
		ep.step_tokens = budgets[bi];
		ep.step_us = step_us[bi];
		budget = budgets[bi] ? budgets[bi] : ep.max_batch + ep.prefill_chunk;
		kvmem_host_init(&mem);
		ck_assert_int_eq(kvpool_new(&pool, &mem, &geom, 64), 0);
		ck_assert_int_eq(engine_new(&e, m, pool, &ep, NULL), 0);
		/* two short prompts first (they become decoders), then four
		 * 20-token prompts arrive while those decode */
		for (int i = 0; i < 6; i++) {
			struct engine_req_params rp = {
				.owner = (uint64_t)i + 1, .prompt = prompt[i],
				.n_prompt = i < 2 ? 2 : 20, .max_tokens = 8,
				.sampling = SAMPLER_PARAMS_GREEDY, .ignore_eos = true };

			for (int j = 0; j < 20; j++)
				prompt[i][j] = 1 + (i * 31 + j * 7) % 300;
			if (i == 2) { /* let the first two reach decoding */
				const struct engine_event *ev;
				size_t n_ev;

				ck_assert_int_eq(engine_step(e, &ev, &n_ev), 0);
			}
			ck_assert_int_eq(engine_submit(e, &rp, &r[i]), 0);
		}
		while (!engine_idle(e)) {
			uint32_t before[6], kv_before[6], n_seq, n_tok, n_dec, dec_before = 0;
			bool younger_moved = false;
			bool was_decoding[6];
			const struct engine_event *ev;
			size_t n_ev;
			uint32_t pbudget;
			double unit_ns;

			/* learned before this step: the target applies */
			engine_last_budget(e, &pbudget, &unit_ns);

			for (int i = 0; i < 6; i++) {
				uint32_t n, n_table, n_kv;

				(void)engine_req_tokens(r[i], &n);
				(void)engine_req_table(r[i], &n_table, &n_kv);
				before[i] = n;
				kv_before[i] = n_kv;
				/* one token ahead of its KV: the last sampled
				 * token (or a prompt's last one) */
				was_decoding[i] = engine_req_finish(r[i], NULL) == ENGINE_FINISH_NONE &&
						  n - n_kv == 1;
				dec_before += was_decoding[i];
			}
			ck_assert_int_eq(engine_step(e, &ev, &n_ev), 0);
			steps++;
			engine_last_step(e, &n_seq, &n_tok, &n_dec);
			ck_assert_uint_le(n_tok, budget);
			if (step_us[bi] && unit_ns > 0 && n_dec > 0) {
				engine_last_budget(e, &pbudget, &unit_ns);
				ck_assert_uint_eq(pbudget, KVD_MIN(ENGINE_STEP_MIN_PROMPT,
								   ep.prefill_chunk));
				ck_assert_uint_le(n_tok - n_dec, pbudget);
				target_steps++;
			}
			/* every decoder of this step got its token */
			ck_assert_uint_eq(n_dec, dec_before);
			for (int i = 0; i < 6; i++) {
				uint32_t n;

				(void)engine_req_tokens(r[i], &n);
				if (was_decoding[i])
					ck_assert_msg(n == before[i] + 1 ||
						      engine_req_finish(r[i], NULL) != ENGINE_FINISH_NONE,
						      "budget %u: decoder %d skipped a step", budget, i);
			}
			/* prompts oldest first: a prompt reader short of its
			 * full chunk means no younger one moved */
			for (int i = 5; i >= 0; i--) {
				uint32_t n, n_table, n_kv, ahead = before[i] - kv_before[i];

				if (was_decoding[i] || ahead < 2)
					continue;
				(void)engine_req_tokens(r[i], &n);
				(void)engine_req_table(r[i], &n_table, &n_kv);
				if (n_kv < kv_before[i] + KVD_MIN(ahead, ep.prefill_chunk))
					ck_assert_msg(!younger_moved,
						      "budget %u: a younger prompt ran before prompt %d's chunk",
						      budget, i);
				if (n_kv > kv_before[i])
					younger_moved = true;
			}
			if (budgets[bi] == 40 && steps == 2)
				ck_assert_uint_ge(n_seq, 4); /* several prompts in one step */
			ck_assert_uint_lt(steps, 200);
		}
		/* the target limited steps that had prompts beside decoders */
		if (step_us[bi])
			ck_assert_uint_ge(target_steps, 5);
		for (int i = 0; i < 6; i++) {
			const int32_t *t;
			uint32_t n;

			t = engine_req_tokens(r[i], &n);
			ck_assert_uint_eq(engine_req_n_output(r[i]), 8);
			memcpy(outs[bi][i], t + n - 8, sizeof(outs[bi][i]));
			if (bi)
				ck_assert_mem_eq(outs[bi][i], outs[0][i], sizeof(outs[0][i]));
			engine_req_free(e, r[i]);
		}
		engine_free(e);
		kvpool_free(pool);
		kvmem_deinit(&mem);
	}
	{
		struct engine_params ep = ENGINE_PARAMS_DEFAULT;
		struct kvpool_geom geom = { .page_tokens = 4, .n_layer = m->hp.n_layer,
					    .kv_dim = m->hp.n_head_kv * m->hp.head_dim,
					    .dtype = KV_DTYPE_F32 };
		struct kvmem mem;
		struct kvpool *pool;
		struct engine *e = NULL;

		kvmem_host_init(&mem);
		ck_assert_int_eq(kvpool_new(&pool, &mem, &geom, 4), 0);
		ep.max_batch = 6;
		ep.step_tokens = 5;
		ck_assert_int_eq(engine_new(&e, m, pool, &ep, NULL), ENGINE_E_INVALID);
		ck_assert_ptr_null(e);
		kvpool_free(pool);
		kvmem_deinit(&mem);
	}
	model_free(m);
}
END_TEST

START_TEST(test_admission)
{
	struct model *m = gen_model(GGML_TYPE_F32, false);
	struct rig g;
	int32_t prompt[200];
	struct engine_req_params rp = { .owner = 1, .prompt = prompt,
					.n_prompt = 200, .max_tokens = 57,
					.sampling = SAMPLER_PARAMS_GREEDY };
	struct engine_req *r = NULL, *r2;
	struct kvpool_stats st;

	for (int i = 0; i < 200; i++)
		prompt[i] = 1 + i % 100;
	rig_init(&g, m, 1, 16, KV_DTYPE_F32, 10);
	/* 200 + 57 > n_ctx 256: refused, nothing held */
	ck_assert_int_eq(engine_submit(g.e, &rp, &r), ENGINE_E_TOO_LONG);
	/* fits the context, not the pool of 10 x 16 tokens */
	rp.max_tokens = 56;
	ck_assert_int_eq(engine_submit(g.e, &rp, &r), ENGINE_E_FULL);
	kvpool_get_stats(g.pool, &st);
	ck_assert_uint_eq(st.by_state[KVPAGE_FREE], 10);
	/* bad token, empty prompt, zero max_tokens */
	rp.n_prompt = 5;
	rp.max_tokens = 5;
	prompt[2] = (int32_t)m->hp.n_vocab;
	ck_assert_int_eq(engine_submit(g.e, &rp, &r), ENGINE_E_INVALID);
	prompt[2] = -1;
	ck_assert_int_eq(engine_submit(g.e, &rp, &r), ENGINE_E_INVALID);
	prompt[2] = 3;
	rp.n_prompt = 0;
	ck_assert_int_eq(engine_submit(g.e, &rp, &r), ENGINE_E_INVALID);
	rp.n_prompt = 5;
	rp.max_tokens = 0;
	ck_assert_int_eq(engine_submit(g.e, &rp, &r), ENGINE_E_INVALID);
	ck_assert_ptr_null(r);
	/* a good one holds exactly pages_for(5 + 5 - 1) pages; cancel frees */
	rp.max_tokens = 5;
	ck_assert_int_eq(engine_submit(g.e, &rp, &r), 0);
	rp.owner = 2;
	ck_assert_int_eq(engine_submit(g.e, &rp, &r2), 0);
	kvpool_get_stats(g.pool, &st);
	ck_assert_uint_eq(st.by_state[KVPAGE_FILLING], 2);
	engine_req_cancel(g.e, r);
	ck_assert_uint_eq(engine_running(g.e), 1);
	engine_req_free(g.e, r);
	engine_req_free(g.e, r2);
	ck_assert(engine_idle(g.e));
	rig_deinit(&g);

	/* a pool whose geometry is not the model's is refused */
	{
		struct kvmem mem;
		struct kvpool *pool;
		struct engine *e;
		struct engine_params ep = ENGINE_PARAMS_DEFAULT;
		struct kvpool_geom geom = { .page_tokens = 16, .n_layer = m->hp.n_layer + 1,
					    .kv_dim = m->hp.n_head_kv * m->hp.head_dim,
					    .dtype = KV_DTYPE_F32 };

		kvmem_host_init(&mem);
		ck_assert_int_eq(kvpool_new(&pool, &mem, &geom, 4), 0);
		ck_assert_int_eq(engine_new(&e, m, pool, &ep, NULL), ENGINE_E_GEOMETRY);
		kvpool_free(pool);
		geom.n_layer = m->hp.n_layer;
		geom.kv_dim *= 2;
		ck_assert_int_eq(kvpool_new(&pool, &mem, &geom, 4), 0);
		ck_assert_int_eq(engine_new(&e, m, pool, &ep, NULL), ENGINE_E_GEOMETRY);
		kvpool_free(pool);
		/* max_requests bounds what is held at once */
		geom.kv_dim /= 2;
		ck_assert_int_eq(kvpool_new(&pool, &mem, &geom, 8), 0);
		ep.max_requests = 1;
		ck_assert_int_eq(engine_new(&e, m, pool, &ep, NULL), 0);
		rp.owner = 3;
		ck_assert_int_eq(engine_submit(e, &rp, &r), 0);
		rp.owner = 4;
		ck_assert_int_eq(engine_submit(e, &rp, &r2), ENGINE_E_BUSY);
		engine_free(e); /* frees r and releases its pages */
		{
			struct kvpool_stats st2;

			kvpool_get_stats(pool, &st2);
			ck_assert_uint_eq(st2.by_state[KVPAGE_FREE], 8);
		}
		kvpool_free(pool);
		kvmem_deinit(&mem);
	}
	model_free(m);
}
END_TEST

/* ---- prefill on one pool, decode on another --------------------------------- */

START_TEST(test_prefill_handoff)
{
	struct model *m = gen_model(GGML_TYPE_Q8_0, false);
	struct rig a, b;
	struct job j, ref;
	struct engine_req *r;
	const struct engine_event *ev;
	size_t n_ev;
	int32_t first = -1, cont[40];
	uint32_t n_table_a, n_kv, n_pre, n_need;
	const struct kvpool_ref *ta;
	struct kvpool_ref tb[64];

	job_make(&j, 11, m->hp.n_vocab, true);
	run_one(m, &j, 1, 4, KV_DTYPE_F16, &ref);

	rig_init(&a, m, 2, 4, KV_DTYPE_F16, 32);
	rig_init(&b, m, 1, 4, KV_DTYPE_F16, 32);
	{
		struct engine_req_params rp = {
			.owner = 55, .prompt = j.prompt, .n_prompt = j.n_prompt,
			.max_tokens = j.max_tokens, .sampling = j.sp,
			.prefill_only = true, .ignore_eos = true };

		ck_assert_int_eq(engine_submit(a.e, &rp, &r), 0);
	}
	while (!engine_idle(a.e)) {
		ck_assert_int_eq(engine_step(a.e, &ev, &n_ev), 0);
		for (size_t k = 0; k < n_ev; k++)
			if (ev[k].kind == ENGINE_EV_TOKEN)
				first = ev[k].token;
			else
				ck_assert_int_eq(ev[k].finish, ENGINE_FINISH_PREFILLED);
	}
	ck_assert_int_eq(first, ref.out[0]);
	ta = engine_req_table(r, &n_table_a, &n_kv);
	ck_assert_uint_eq(n_kv, j.n_prompt);
	n_pre = kvpool_pages_for(a.pool, n_kv);
	/* the decode side reserves room for everything, receives the prompt's
	 * pages (bytes after the tag), writes and checks tags, marks ready */
	n_need = kvpool_pages_for(b.pool, j.n_prompt + j.max_tokens - 1);
	ck_assert_int_eq(kvpool_reserve(b.pool, 55, n_need, tb), 0);
	ck_assert_int_eq(kvpool_fill_begin(b.pool, 55, tb, n_need), 0);
	{
		struct kvpool_geom gg = *kvpool_geom(a.pool);
		uint64_t pb = kvpool_page_bytes(&gg);

		for (uint32_t i = 0; i < n_pre; i++)
			memcpy((uint8_t *)kvpool_page_addr(b.pool, tb[i].page) + KVTAG_BYTES,
			       (uint8_t *)kvpool_page_addr(a.pool, ta[i].page) + KVTAG_BYTES,
			       pb - KVTAG_BYTES);
	}
	ck_assert_int_eq(kvpool_tag_write(b.pool, 55, tb, n_pre, n_kv), 0);
	ck_assert_int_eq(kvpool_mark_ready(b.pool, 55, tb, n_pre, n_kv), 0);
	engine_req_free(a.e, r);
	{
		int32_t toks[64];
		struct engine_req_params rp = {
			.owner = 55, .prompt = toks, .n_prompt = j.n_prompt + 1,
			.max_tokens = j.max_tokens - 1, .sampling = j.sp,
			.ignore_eos = true, .table = tb, .n_table = n_need,
			.n_cached = n_kv };
		uint32_t n = 0;

		memcpy(toks, j.prompt, j.n_prompt * sizeof(int32_t));
		toks[j.n_prompt] = first;
		ck_assert_int_eq(engine_submit(b.e, &rp, &r), 0);
		while (!engine_idle(b.e)) {
			ck_assert_int_eq(engine_step(b.e, &ev, &n_ev), 0);
			for (size_t k = 0; k < n_ev; k++)
				if (ev[k].kind == ENGINE_EV_TOKEN)
					cont[n++] = ev[k].token;
		}
		ck_assert_uint_eq(n + 1, ref.n_out);
		for (uint32_t i = 0; i < n; i++)
			ck_assert_int_eq(cont[i], ref.out[i + 1]);
		engine_req_free(b.e, r);
	}
	/* lent pages stay the caller's */
	ck_assert_int_eq(kvpool_release(b.pool, 55, tb, n_need), 0);
	rig_deinit(&a);
	rig_deinit(&b);
	model_free(m);
}
END_TEST

/* ---- sampler ---------------------------------------------------------------- */

START_TEST(test_sampler)
{
	struct sampler s;
	float logits[4] = { 0.0f, logf(3.0f), -30.0f, -30.0f };
	struct sampler_params p = { .temperature = 1.0f, .top_k = 0, .top_p = 1.0f,
				    .seed = 5 };
	uint32_t ones = 0, N = 20000;

	ck_assert_int_eq(sampler_init(&s, 4), 0);
	for (uint32_t pos = 0; pos < N; pos++) {
		uint32_t t = sampler_sample(&s, &p, pos, logits);
		double u = sampler_uniform(p.seed, pos);

		ck_assert(u >= 0.0 && u < 1.0);
		ck_assert_uint_lt(t, 2);
		ones += t == 1;
		/* pure: the same inputs give the same token */
		ck_assert_uint_eq(sampler_sample(&s, &p, pos, logits), t);
	}
	ck_assert_msg(fabs(ones / (double)N - 0.75) < 0.02, "p(1) = %g", ones / (double)N);
	/* top-p 0.5 keeps only the 0.75 token; top-k 1 is the arg max */
	p.top_p = 0.5f;
	for (uint32_t pos = 0; pos < 500; pos++)
		ck_assert_uint_eq(sampler_sample(&s, &p, pos, logits), 1);
	p.top_p = 1.0f;
	p.top_k = 1;
	for (uint32_t pos = 0; pos < 500; pos++)
		ck_assert_uint_eq(sampler_sample(&s, &p, pos, logits), 1);
	/* greedy: lowest id on ties */
	p.temperature = 0.0f;
	logits[2] = logf(3.0f);
	ck_assert_uint_eq(sampler_sample(&s, &p, 0, logits), 1);
	/* different seeds draw differently */
	ck_assert(sampler_uniform(1, 10) != sampler_uniform(2, 10));
	sampler_deinit(&s);

	/* top-k selection over a large vocabulary picks the k best */
	{
		enum { V = 5000 };
		float *lg = malloc(V * sizeof(float));
		struct sampler s2;
		struct sampler_params q = { .temperature = 100.0f, .top_k = 3,
					    .top_p = 1.0f, .seed = 1 };
		bool seen[3] = { false, false, false };

		for (int i = 0; i < V; i++)
			lg[i] = (float)((i * 7919) % V) / V;
		lg[4000] = 2.0f;
		lg[17] = 2.5f;
		lg[2222] = 3.0f;
		ck_assert_int_eq(sampler_init(&s2, V), 0);
		for (uint32_t pos = 0; pos < 300; pos++) {
			uint32_t t = sampler_sample(&s2, &q, pos, lg);

			ck_assert(t == 4000 || t == 17 || t == 2222);
			seen[t == 4000 ? 0 : t == 17 ? 1 : 2] = true;
		}
		ck_assert(seen[0] && seen[1] && seen[2]);
		sampler_deinit(&s2);
		free(lg);
	}
}
END_TEST

/* ---- model checks ------------------------------------------------------------- */

static uint8_t *file_bytes(const char *path, size_t *n)
{
	FILE *f = fopen(path, "rb");
	uint8_t *b;

	ck_assert_ptr_nonnull(f);
	fseek(f, 0, SEEK_END);
	*n = (size_t)ftell(f);
	fseek(f, 0, SEEK_SET);
	b = malloc(*n);
	ck_assert_uint_eq(fread(b, 1, *n, f), *n);
	fclose(f);
	return b;
}

/* Pool memory the CPU cannot dereference (device memory) is refused by
 * the CPU backend, never read. */
START_TEST(test_device_memory_refused)
{
	struct model *m = gen_model(GGML_TYPE_F32, false);
	struct kvpool_geom geom = { .page_tokens = 16, .n_layer = m->hp.n_layer,
				    .kv_dim = m->hp.n_head_kv * m->hp.head_dim,
				    .dtype = KV_DTYPE_F32 };
	struct engine_params ep = ENGINE_PARAMS_DEFAULT;
	struct kvmem_ops dev_ops;
	struct kvmem mem;
	struct kvpool *pool;
	struct engine *e = NULL;

	kvmem_host_init(&mem);
	dev_ops = *mem.ops;
	dev_ops.host_visible = false;
	mem.ops = &dev_ops;
	ck_assert_int_eq(kvpool_new(&pool, &mem, &geom, 8), 0);
	ck_assert(!kvpool_host_visible(pool));
	ck_assert_int_eq(engine_new(&e, m, pool, &ep, NULL), ENGINE_E_MEMORY);
	ck_assert_ptr_null(e);
	kvpool_free(pool);
	kvmem_deinit(&mem);
	model_free(m);
}
END_TEST

START_TEST(test_model_unsupported_type)
{
	struct model *m = gen_model(GGML_TYPE_F32, false);
	char path[512];
	size_t n;
	uint8_t *b, *p;
	const char *name = "blk.1.ffn_up.weight";
	struct gguf_file *f;
	struct gguf_error err;
	struct model *m2;
	uint32_t bf16 = GGML_TYPE_BF16;

	ck_assert_uint_gt(m->decode_bytes, 0);
	model_free(m);
	model_path(path, sizeof(path), GGML_TYPE_F32, false);
	b = file_bytes(path, &n);
	/* tensor info: name, n_dims (u32), ne (n_dims x u64), type (u32) */
	p = memmem(b, n, name, strlen(name));
	ck_assert_ptr_nonnull(p);
	p += strlen(name);
	{
		uint32_t nd;

		memcpy(&nd, p, 4);
		ck_assert_uint_eq(nd, 2);
		memcpy(p + 4 + 8 * nd, &bf16, 4);
	}
	ck_assert_int_eq(gguf_open_mem(&f, b, n, &err), 0);
	ck_assert_int_eq(model_from_gguf(&m2, f, &err), MODEL_E_TYPE);
	ck_assert_msg(strstr(err.msg, name) && strstr(err.msg, "bf16"), "%s", err.msg);
	gguf_close(f);
	free(b);
}
END_TEST

/* ---- thread split of a long prompt: bit-identical logits -------------- */

/* One backend at `threads` over pages of its own: a 200-token prompt in
 * one batch (logits of every position), then 3 decode steps; all logits
 * into out (203 rows). Sized so that every parallel path runs split:
 * the per-token steps, the matmuls and attention (dealt round-robin). */
static void long_prompt_logits(const struct model *m, uint32_t threads, float *out)
{
	const struct llama_hparams *hp = &m->hp;
	enum { N = 200, DEC = 3, PT = 16, NP = (N + DEC + PT - 1) / PT };
	uint32_t kvd = hp->n_head_kv * hp->head_dim;
	size_t blk = (size_t)PT * kvd * 2; /* f16 */
	uint64_t k_off[8], v_off[8];
	struct backend_kv_layout kv = { .page_tokens = PT, .dtype = KV_DTYPE_F16,
					.k_off = k_off, .v_off = v_off };
	struct backend_cpu_params bp = { .threads = threads, .max_tokens = N,
					 .max_ctx = N + DEC, .simd = true };
	struct backend be;
	uint8_t *pages[NP];
	int32_t tok[N];
	uint32_t pos[N], seq[N] = { 0 }, outi[N];

	ck_assert_uint_le(hp->n_layer, 8);
	for (uint32_t l = 0; l < hp->n_layer; l++) {
		k_off[l] = 64 + 2 * l * blk;
		v_off[l] = k_off[l] + blk;
	}
	for (uint32_t p = 0; p < NP; p++) {
		pages[p] = calloc(1, 64 + 2 * hp->n_layer * blk);
		ck_assert_ptr_nonnull(pages[p]);
	}
	ck_assert_int_eq(backend_cpu_new(&be, m, &kv, &bp), 0);
	for (uint32_t i = 0; i < N; i++) {
		tok[i] = (int32_t)(3 + (i * 97) % (hp->n_vocab - 3));
		pos[i] = i;
		outi[i] = i;
	}
	{
		struct backend_seq sq = { .pages = pages, .n_pages = NP, .n_kv = N };
		struct backend_batch b = { .n_tokens = N, .tokens = tok, .pos = pos,
					   .seq = seq, .seqs = &sq, .n_seqs = 1,
					   .out = outi, .n_out = N };

		ck_assert_int_eq(backend_forward(&be, &b, out), 0);
	}
	for (uint32_t d = 0; d < DEC; d++) {
		uint32_t p1 = N + d, s0 = 0, o0 = 0;
		int32_t t1 = (int32_t)(5 + d);
		struct backend_seq sq = { .pages = pages, .n_pages = NP, .n_kv = p1 + 1 };
		struct backend_batch b = { .n_tokens = 1, .tokens = &t1, .pos = &p1,
					   .seq = &s0, .seqs = &sq, .n_seqs = 1,
					   .out = &o0, .n_out = 1 };

		ck_assert_int_eq(backend_forward(&be, &b,
						 out + (size_t)(N + d) * hp->n_vocab), 0);
	}
	be.ops->free(be.ctx);
	for (uint32_t p = 0; p < NP; p++)
		free(pages[p]);
}

/* 1 and 2 threads give the same bits for every logit of a long prompt and
 * the decode steps after it, for float and quantized weights. */
START_TEST(test_threads_long_prompt_bits)
{
	const enum ggml_type types[] = { GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_Q8_0,
					 GGML_TYPE_Q4_0, GGML_TYPE_Q4_K };

	for (size_t t = 0; t < KVD_ARRAY_SIZE(types); t++) {
		struct gguf_llama_params p = GGUF_LLAMA_PARAMS_DEFAULT;
		char path[512];
		struct model *m;
		struct gguf_error err;
		float *a, *b;
		size_t n;

		p.n_layer = 2;
		p.n_embd = 256;
		p.n_head = 8;
		p.n_head_kv = 4;
		p.n_ff = 512;
		p.n_vocab = 320;
		p.n_ctx = 512;
		p.wtype = types[t];
		p.seed = 11;
		snprintf(path, sizeof(path), "%s/long_%s.gguf", tmpdir,
			 ggml_type_name(types[t]));
		ck_assert_int_eq(gguf_make_llama(path, &p), 0);
		ck_assert_msg(model_open(&m, path, &err) == 0, "%s", err.msg);
		n = (size_t)203 * m->hp.n_vocab;
		a = malloc(n * sizeof(float));
		b = malloc(n * sizeof(float));
		ck_assert_ptr_nonnull(a);
		ck_assert_ptr_nonnull(b);
		long_prompt_logits(m, 1, a);
		long_prompt_logits(m, 2, b);
		for (size_t i = 0; i < n; i++)
			ck_assert_msg(memcmp(&a[i], &b[i], sizeof(float)) == 0,
				      "%s: logit %zu (row %zu): %a with 1 thread, %a with 2",
				      ggml_type_name(types[t]), i, i / m->hp.n_vocab,
				      (double)a[i], (double)b[i]);
		/* and the logits are not degenerate */
		ck_assert_msg(isfinite(a[0]) && a[0] != a[1], "%s: logits",
			      ggml_type_name(types[t]));
		free(a);
		free(b);
		model_free(m);
		unlink(path);
	}
}
END_TEST

static void rm_tmpdir(void)
{
	char cmd[400];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
	if (system(cmd) != 0)
		return;
}

/* ---- a constraint (engine_constraint: response_format's grammar) ------ */

struct fake_cons {
	uint32_t masks, accepts;
	uint32_t stop_mask_at;   /* mask call that leaves nothing (0: never) */
	uint32_t refuse_at;      /* accept call that says no (0: never) */
	int32_t seen[64];
};

/* only tokens 7 and 9 may come */
static uint32_t fake_mask(void *ctx, float *logits, uint32_t n)
{
	struct fake_cons *c = ctx;

	c->masks++;
	for (uint32_t i = 0; i < n; i++)
		if ((i != 7 && i != 9) || c->masks == c->stop_mask_at)
			logits[i] = -INFINITY;
	return c->masks == c->stop_mask_at ? 0 : 2;
}

static bool fake_accept(void *ctx, int32_t tok)
{
	struct fake_cons *c = ctx;

	c->seen[c->accepts++ % 64] = tok;
	return c->accepts != c->refuse_at;
}

static void run_constrained(struct model *m, struct fake_cons *c, struct job *j)
{
	struct rig g;
	struct engine_req_params rp = {
		.owner = 3, .prompt = j->prompt, .n_prompt = j->n_prompt,
		.max_tokens = 20, .sampling = { .temperature = 1.0f, .top_p = 1.0f, .seed = 5 },
		.constraint = { .ctx = c, .mask = fake_mask, .accept = fake_accept } };
	const struct engine_event *ev;
	size_t n_ev;

	rig_init(&g, m, 1, 4, KV_DTYPE_F16, 32);
	ck_assert_int_eq(engine_submit(g.e, &rp, &j->req), 0);
	while (!engine_idle(g.e)) {
		ck_assert_int_eq(engine_step(g.e, &ev, &n_ev), 0);
		for (size_t k = 0; k < n_ev; k++)
			if (ev[k].kind == ENGINE_EV_TOKEN)
				j->out[j->n_out++] = ev[k].token;
	}
	j->finish = engine_req_finish(j->req, &j->error);
	engine_req_free(g.e, j->req);
	rig_deinit(&g);
}

START_TEST(test_constraint)
{
	struct model *m = gen_model(GGML_TYPE_F32, false);
	struct fake_cons c = { 0 };
	struct job j;

	/* every token is an allowed one, and accept sees each in order */
	job_make(&j, 3, m->hp.n_vocab, true);
	run_constrained(m, &c, &j);
	ck_assert_uint_eq(j.n_out, 20);
	ck_assert_int_eq(j.finish, ENGINE_FINISH_LENGTH);
	ck_assert_uint_eq(c.masks, 20);
	ck_assert_uint_eq(c.accepts, 20);
	for (uint32_t i = 0; i < j.n_out; i++) {
		ck_assert_msg(j.out[i] == 7 || j.out[i] == 9, "token %d", j.out[i]);
		ck_assert_int_eq(c.seen[i], j.out[i]);
	}
	/* a mask that leaves nothing ends the request as EOS would */
	c = (struct fake_cons){ .stop_mask_at = 5 };
	job_make(&j, 3, m->hp.n_vocab, true);
	run_constrained(m, &c, &j);
	ck_assert_uint_eq(j.n_out, 4);
	ck_assert_int_eq(j.finish, ENGINE_FINISH_STOP);
	/* a token the constraint refuses is not emitted: the request stops */
	c = (struct fake_cons){ .refuse_at = 3 };
	job_make(&j, 3, m->hp.n_vocab, true);
	run_constrained(m, &c, &j);
	ck_assert_uint_eq(j.n_out, 2);
	ck_assert_int_eq(j.finish, ENGINE_FINISH_STOP);
	model_free(m);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("engine");
	TCase *tc = tcase_create("engine");
	SRunner *sr;
	int failed;

	snprintf(tmpdir, sizeof(tmpdir), "/tmp/kvd-test-engine-XXXXXX");
	if (!mkdtemp(tmpdir))
		return 1;
	tcase_set_timeout(tc, 600);
	tcase_add_test(tc, test_sampler);
	tcase_add_test(tc, test_constraint);
	tcase_add_test(tc, test_admission);
	tcase_add_test(tc, test_weight_types);
	tcase_add_test(tc, test_mixed_activation_classes);
	tcase_add_test(tc, test_invariance_generated);
	tcase_add_test(tc, test_sampling_controls);
	tcase_add_test(tc, test_invariance_arch);
	tcase_add_test(tc, test_mistral_style);
	tcase_add_test(tc, test_invariance_stories);
	tcase_add_test(tc, test_threads_long_prompt_bits);
	tcase_add_test(tc, test_prefix_cache_purity);
	tcase_add_test(tc, test_prefix_cache_evicted_for_admission);
	tcase_add_test(tc, test_prefix_cache_while_running);
	tcase_add_test(tc, test_prefix_cache_mutation);
	tcase_add_test(tc, test_integrity_corrupt_tag);
	tcase_add_test(tc, test_integrity_stale_table);
	tcase_add_test(tc, test_prefill_handoff);
	tcase_add_test(tc, test_step_budget);
	tcase_add_test(tc, test_model_unsupported_type);
	tcase_add_test(tc, test_device_memory_refused);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_set_fork_status(sr, CK_NOFORK);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	rm_tmpdir();
	return failed ? 1 : 0;
}
