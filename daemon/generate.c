/* generate.c - `kvd generate`, the engine without a daemon around it.
 *
 * The command wires the same pieces the daemon wires - model, tokenizer,
 * KV pool on host memory, engine - and drives engine_step() on the main
 * thread (there is no event loop here, so computing on this thread is
 * right). The pool holds exactly pages_for(prompt + max_tokens) pages: a
 * prompt that does not fit the model's context is refused with the typed
 * error, never truncated or replaced.
 *
 * Output: text chunks from the incremental detokenizer go to stdout and
 * are flushed per token; --json collects them and prints one object at
 * the end. JSON strings escape quotes, backslashes and control bytes; the
 * detokenizer guarantees valid UTF-8, which passes through as is.
 * With --logprobs, --json carries the tokens' logprobs after output_ids
 * in kvctl generate's form (proto_client_logprobs_json). The sampling
 * options are a client request's fields, read by the parser kvctl
 * generate and the node use (proto_client_request_set) and handed to the
 * engine as the node hands them (proto_client_request_sampling).
 *
 * Timings (--json's "timings" object), on the monotonic clock:
 *   ttft_ms            engine_submit() to the first token event: the whole
 *                      prompt's forward pass plus the first sampling;
 *   prompt_tokens_per_s  prompt tokens / ttft;
 *   gen_tokens_per_s   tokens after the first / time from the first token
 *                      to the last (the first token belongs to the prompt
 *                      pass, as llama.cpp counts it), null under 2 tokens;
 *   kernels            the kernel variant per weight type the model's
 *                      matmuls use, as the engine chose it (ops_info.h).
 *   pack_cache         where the packed weight copies came from
 *                      (gpu/model/prepack.h): lookup, store, and how many
 *                      matrices were mapped from the cache or packed;
 *                      removed / freed: the other pack files of the
 *                      directory the cleanup removed (prepack_clean,
 *                      retention PREPACK_KEEP_DAYS_DEFAULT) and their bytes.
 * Model loading, tokenizing and pool allocation are outside all of them.
 * --prompt-ids, --ignore-eos and --warmup make runs comparable with
 * llama-bench (a prompt of exactly N tokens, exactly max-tokens generated,
 * and an untimed run of the whole prompt and one token first, as
 * llama-bench's warm-up run does: the weights - mapped, not read, at
 * open - are paged in and the buffers and threads are warm at the
 * prompt's size before the clock starts).
 */
#include "daemon/generate.h"

#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "conf/fingerprint.h"
#include "conf/util.h"
#include "gpu/engine.h"
#include "gpu/kv/kvmem.h"
#include "gpu/kv/kvpool.h"
#include "gpu/model/model.h"
#include "gpu/model/prepack.h"
#include "gpu/text/tokenizer.h"
#include "net/wire/proto_client.h"

struct gen_opts {
	const char *model;
	const char *prompt;
	/* the request fields, as a node reads them (set_field): owns
	 * req.bias; max_tokens and sp are taken from it after the options */
	struct proto_client_request req;
	uint32_t max_tokens;
	struct sampler_params sp;   /* sp.logit_bias borrows req.bias */
	uint32_t threads;
	uint32_t page_tokens;
	enum kv_dtype kv_dtype;
	bool json;
	const char *prompt_ids; /* --prompt-ids: comma list, instead of --prompt */
	bool ignore_eos;
	bool warmup;            /* the prompt and one token first, untimed (as llama-bench) */
	const char *cache_dir;  /* --cache-dir: fingerprint and repack cache */
};

static void usage(FILE *out)
{
	fprintf(out,
		"usage: kvd generate --model FILE --prompt TEXT [--max-tokens N]\n"
		"                    [--temperature T] [--top-k K] [--top-p P] [--seed S]\n"
		"                    [--presence-penalty X] [--frequency-penalty X]\n"
		"                    [--repetition-penalty X] [--min-p X]\n"
		"                    [--logit-bias ID:BIAS,...] [--logprobs N (alternatives, 0..20)]\n"
		"                    [--threads N] [--page-tokens N] [--kv-dtype f32|f16]\n"
		"                    [--json] [--ignore-eos] [--warmup] [--cache-dir DIR]\n"
		"       kvd generate --model FILE --prompt-ids ID,ID,... [options]\n"
		"Offline generation with the kvd engine; greedy unless --temperature > 0.\n"
		"--json adds a timings object (ttft, prompt and generation tok/s, kernels),\n"
		"and with --logprobs the tokens' logprobs as kvctl generate --json prints them.\n"
		"Sampling values are checked with a node's bounds (a bad one: exit 64).\n"
		"--cache-dir keeps the model's fingerprint and repacked weights in DIR\n"
		"(as the daemon's model.fingerprint_cache), so later runs do not repack.\n");
}

static int parse_u32(const char *s, uint32_t min, uint32_t max, uint32_t *out)
{
	uint64_t v;

	if (kvd_parse_u64(s, &v) || v < min || v > max)
		return -1;
	*out = (uint32_t)v;
	return 0;
}

/* A request field's option (--max-tokens --temperature ... --logit-bias
 * --logprobs): read into o->req as a node reads that field from a client
 * and kvctl generate from its command line (proto_client_request_set),
 * so kvd generate takes the values a node takes, no more, no fewer. 0,
 * or 1 with err->msg saying why. */
static int set_field(struct gen_opts *o, const char *name, const char *arg,
		     struct frame_error *err)
{
	int rc = proto_client_request_set(&o->req, name, arg, err);

	if (rc < 0)
		snprintf(err->msg, sizeof(err->msg), "%s", strerror(-rc));
	return rc ? 1 : 0;
}

/* One option's value into o (c: getopt_long's code, name: the option's
 * long name, arg: its optarg). 0, or 1 with err->msg saying what the
 * value must be. */
static int set_opt(struct gen_opts *o, int c, const char *name,
		   const char *arg, struct frame_error *err)
{
	const char *why = NULL;

	switch (c) {
	case 'F': return set_field(o, name, arg, err);
	case 'm': o->model = arg; break;
	case 'p': o->prompt = arg; break;
	case 'T':
		if (parse_u32(arg, 1, 256, &o->threads))
			why = "not an integer in 1..256";
		break;
	case 'g':
		if (parse_u32(arg, 1, 1u << 16, &o->page_tokens))
			why = "not an integer in 1..65536";
		break;
	case 'd':
		if (!strcmp(arg, "f32"))
			o->kv_dtype = KV_DTYPE_F32;
		else if (!strcmp(arg, "f16"))
			o->kv_dtype = KV_DTYPE_F16;
		else
			why = "not f32 or f16";
		break;
	case 'j': o->json = true; break;
	case 'I': o->prompt_ids = arg; break;
	case 'E': o->ignore_eos = true; break;
	case 'W': o->warmup = true; break;
	case 'C':
		o->cache_dir = arg;
		if (arg[0] != '/')
			why = "not an absolute path";
		break;
	}
	if (why)
		snprintf(err->msg, sizeof(err->msg), "%s", why);
	return why ? 1 : 0;
}

/* The command line into o, defaults first. 0, 1 after --help (usage on
 * stdout), or -1 after saying what is wrong on stderr; o->req.bias may
 * be set either way (gen_opts_deinit frees it). */
static int parse_opts(int argc, char **argv, struct gen_opts *o)
{
	static const struct option longopts[] = {
		{ "model", required_argument, NULL, 'm' },
		{ "prompt", required_argument, NULL, 'p' },
		/* 'F': named after a request field (set_field), as
		 * kvctl generate's */
		PROTO_CLIENT_OPTIONS('F'),
		{ "threads", required_argument, NULL, 'T' },
		{ "page-tokens", required_argument, NULL, 'g' },
		{ "kv-dtype", required_argument, NULL, 'd' },
		{ "json", no_argument, NULL, 'j' },
		{ "prompt-ids", required_argument, NULL, 'I' },
		{ "ignore-eos", no_argument, NULL, 'E' },
		{ "warmup", no_argument, NULL, 'W' },
		{ "cache-dir", required_argument, NULL, 'C' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	struct frame_error err;
	int c, li = 0;

	*o = (struct gen_opts){ .req = PROTO_CLIENT_REQUEST_NULL,
				.threads = ncpu > 0 ? (uint32_t)KVD_MIN(ncpu, 8) : 1,
				.page_tokens = 16, .kv_dtype = KV_DTYPE_F32 };
	o->req.max_tokens = 128;
	optind = 0; /* glibc: full rescan, argv[0] is the command name */
	while ((c = getopt_long(argc, argv, "", longopts, &li)) != -1) {
		if (c == 'h') {
			usage(stdout);
			return 1;
		}
		if (c == '?') {
			usage(stderr);
			return -1;
		}
		if (set_opt(o, c, longopts[li].name, optarg, &err)) {
			fprintf(stderr, "kvd generate: --%s '%s': %s\n",
				longopts[li].name, optarg, err.msg);
			return -1;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "kvd generate: unexpected argument '%s'\n", argv[optind]);
		return -1;
	}
	if (!o->model || !o->prompt == !o->prompt_ids) {
		usage(stderr);
		return -1;
	}
	o->max_tokens = o->req.max_tokens;
	o->sp = proto_client_request_sampling(&o->req);
	return 0;
}

static void gen_opts_deinit(struct gen_opts *o)
{
	proto_client_request_deinit(&o->req);
	o->sp.logit_bias = NULL;
	o->sp.n_logit_bias = 0;
}

/* Everything the run holds; generate_cleanup() frees what is set. */
struct gen_run;
static void json_timings(FILE *out, const struct gen_run *g,
			 const struct gen_opts *o);
struct gen_run {
	struct model *model;
	struct tokenizer *tok;
	struct detok dt;
	bool dt_init;
	struct kvmem mem;
	struct kvpool *pool;
	struct engine *eng;
	struct engine_req *req;
	int32_t *prompt;
	size_t n_prompt;
	struct kvd_buf text;    /* --json's text */
	struct kvd_buf lps;     /* --json --logprobs: struct sampler_logprobs per token */
	uint64_t t_submit, t_first, t_last; /* kvd_now_ns() */
	uint32_t n_gen;
};

static void gen_cleanup(struct gen_run *g)
{
	if (g->req)
		engine_req_free(g->eng, g->req);
	engine_free(g->eng);
	kvpool_free(g->pool);
	if (g->mem.ops)
		kvmem_deinit(&g->mem);
	if (g->dt_init)
		detok_deinit(&g->dt);
	tokenizer_free(g->tok);
	model_free(g->model);
	free(g->prompt);
	kvd_buf_deinit(&g->text);
	kvd_buf_deinit(&g->lps);
}

static int emit(struct gen_run *g, const struct gen_opts *o, const char *s,
		size_t n)
{
	if (!n)
		return 0;
	if (o->json)
		return kvd_buf_add(&g->text, s, n);
	if (fwrite(s, 1, n, stdout) != n)
		return -EIO;
	fflush(stdout);
	return 0;
}

/* The whole prompt and one generated token through the model, untimed,
 * then freed - what llama-bench does before it measures: every weight
 * page is touched, the thread pool, the activation buffers and the
 * packed weights are warm at the size the timed prompt uses. The pool
 * holds it (the prompt and one token, at most what the timed request
 * takes) because it is freed before the timed request is submitted. */
static int gen_warmup(struct gen_run *g)
{
	struct engine_req_params rp = {
		.owner = 2, .prompt = g->prompt, .n_prompt = g->n_prompt, .max_tokens = 1,
		.sampling = SAMPLER_PARAMS_GREEDY };
	struct engine_req *r;
	int rc = engine_submit(g->eng, &rp, &r);

	if (rc)
		return rc;
	while (!rc && !engine_idle(g->eng)) {
		const struct engine_event *ev;
		size_t n_ev;

		rc = engine_step(g->eng, &ev, &n_ev);
	}
	if (!rc) {
		enum engine_finish f = engine_req_finish(r, &rc);

		if (f != ENGINE_FINISH_ERROR)
			rc = 0;
	}
	engine_req_free(g->eng, r);
	return rc;
}

/* The model and its tokenizer, from o->model. 0, or 66 (the file
 * cannot be used) after saying why on stderr. */
static int gen_open_model(struct gen_run *g, const struct gen_opts *o)
{
	struct gguf_error err;
	int rc;

	rc = model_open(&g->model, o->model, &err);
	if (rc) {
		fprintf(stderr, "kvd generate: %s: %s\n", o->model,
			gguf_error_msg(rc, &err));
		return 66;
	}
	rc = tokenizer_new(&g->tok, g->model->file, &err);
	if (rc) {
		fprintf(stderr, "kvd generate: %s: tokenizer: %s\n", o->model,
			gguf_error_msg(rc, &err));
		return 66;
	}
	return 0;
}

/* --logit-bias against the model's vocabulary, as a node checks it (the
 * same message). 0, or 1 after saying why on stderr. */
static int gen_bias_check(const struct gen_run *g, const struct gen_opts *o)
{
	char msg[128];

	if (!proto_client_bias_outside(&o->req, tokenizer_n_vocab(g->tok), msg, sizeof(msg)))
		return 0;
	fprintf(stderr, "kvd generate: --logit-bias: %s\n", msg);
	return 1;
}

/* The prompt's ids, from --prompt-ids or the tokenizer: not empty, and
 * with max_tokens inside the model's context (never truncated). 0, or 1
 * after saying why on stderr. */
static int gen_prompt(struct gen_run *g, const struct gen_opts *o)
{
	int rc;

	if (o->prompt_ids) {
		uint32_t *ids;

		/* each <= INT32_MAX: the same values as int32_t (the engine
		 * checks them against the vocabulary) */
		rc = kvd_parse_u32_list(o->prompt_ids, INT32_MAX, &ids, &g->n_prompt);
		if (!rc)
			g->prompt = (int32_t *)ids;
		if (rc) {
			fprintf(stderr, "kvd generate: --prompt-ids: %s\n",
				rc == -EINVAL ? "expected token ids 0..2147483647 separated by commas"
					      : strerror(-rc));
			return 1;
		}
	} else {
		rc = tokenizer_encode(g->tok, o->prompt, strlen(o->prompt),
				      tokenizer_add_bos(g->tok), &g->prompt,
				      &g->n_prompt);
	}
	if (rc || g->n_prompt == 0) {
		fprintf(stderr, "kvd generate: cannot tokenize the prompt: %s\n",
			rc ? strerror(-rc) : "empty prompt");
		return 1;
	}
	if (g->n_prompt + (uint64_t)o->max_tokens > g->model->hp.n_ctx_train) {
		fprintf(stderr, "kvd generate: prompt too long: %zu prompt tokens + %u max tokens exceed the context length %u\n",
			g->n_prompt, o->max_tokens, g->model->hp.n_ctx_train);
		return 1;
	}
	return gen_bias_check(g, o);
}

/* The detokenizer, and the KV pool on host memory with exactly
 * pages_for(prompt + max_tokens) pages. 0, or 1 after saying why. */
static int gen_pool(struct gen_run *g, const struct gen_opts *o)
{
	struct kvpool_geom geom;
	int rc;

	rc = detok_init(&g->dt, g->tok);
	if (rc) {
		fprintf(stderr, "kvd generate: %s\n", strerror(-rc));
		return 1;
	}
	g->dt_init = true;
	geom = (struct kvpool_geom){
		.page_tokens = o->page_tokens, .n_layer = g->model->hp.n_layer,
		.kv_dim = g->model->hp.n_head_kv * g->model->hp.head_dim,
		.dtype = o->kv_dtype };
	kvmem_host_init(&g->mem);
	rc = kvpool_new(&g->pool, &g->mem, &geom,
			(uint32_t)((g->n_prompt + o->max_tokens + o->page_tokens - 1) /
				   o->page_tokens));
	if (rc) {
		fprintf(stderr, "kvd generate: KV pool: error %d\n", rc);
		return 1;
	}
	return 0;
}

/* The engine on g's model and pool: one request, o->threads, and with
 * --cache-dir the repack cache keyed by the model's fingerprint (which
 * engine_new only reads while it binds the weights). 0, or 1 after
 * saying why. */
static int gen_engine(struct gen_run *g, const struct gen_opts *o)
{
	struct engine_params ep = ENGINE_PARAMS_DEFAULT;
	char sha[SHA256_HEX_SIZE];
	int rc;

	ep.threads = o->threads;
	ep.max_batch = 1;
	ep.prefill_chunk = 256;
	if (o->cache_dir) {
		/* the repack cache is keyed by the fingerprint, which comes
		 * from the fingerprint cache in the same directory (hashed the
		 * first time only) */
		rc = kvd_fingerprint(o->model, o->cache_dir, sha, NULL);
		if (rc) {
			fprintf(stderr, "kvd generate: %s: fingerprint: %s\n", o->model,
				strerror(-rc));
			return 1;
		}
		ep.pack_dir = o->cache_dir;
		ep.model_sha256 = sha;
		ep.pack_clean = true;
		ep.pack_keep_days = PREPACK_KEEP_DAYS_DEFAULT;
	}
	rc = engine_new(&g->eng, g->model, g->pool, &ep, NULL);
	if (rc) {
		fprintf(stderr, "kvd generate: engine: %s\n", engine_strerror(rc));
		return 1;
	}
	return 0;
}

/* The untimed warm-up when asked, then the timed request (g->req; the
 * clock starts here, g->t_submit). 0, or 1 after saying why. */
static int gen_submit(struct gen_run *g, const struct gen_opts *o)
{
	struct engine_req_params rp;
	int rc;

	if (o->warmup) {
		rc = gen_warmup(g);
		if (rc) {
			fprintf(stderr, "kvd generate: warm-up: %s\n", engine_strerror(rc));
			return 1;
		}
	}
	rp = (struct engine_req_params){
		.owner = 1, .prompt = g->prompt, .n_prompt = (uint32_t)g->n_prompt,
		.max_tokens = o->max_tokens, .sampling = o->sp,
		.ignore_eos = o->ignore_eos };
	g->t_submit = kvd_now_ns();
	rc = engine_submit(g->eng, &rp, &g->req);
	if (rc) {
		fprintf(stderr, "kvd generate: %s\n", engine_strerror(rc));
		return 1;
	}
	return 0;
}

/* engine_step() until the engine is idle: each token timed, detokenized
 * and emitted; *fin is the request's finish. 0, or 1 after saying why. */
static int gen_steps(struct gen_run *g, const struct gen_opts *o,
		     enum engine_finish *fin)
{
	const char *chunk;
	size_t len;
	int rc;

	while (!engine_idle(g->eng)) {
		const struct engine_event *ev;
		size_t n_ev;

		rc = engine_step(g->eng, &ev, &n_ev);
		if (rc) {
			fprintf(stderr, "kvd generate: %s\n", engine_strerror(rc));
			return 1;
		}
		for (size_t i = 0; i < n_ev; i++) {
			if (ev[i].kind == ENGINE_EV_DONE) {
				*fin = ev[i].finish;
				if (*fin == ENGINE_FINISH_ERROR) {
					fprintf(stderr, "kvd generate: %s\n",
						engine_strerror(ev[i].error));
					return 1;
				}
				continue;
			}
			g->t_last = kvd_now_ns();
			if (!g->n_gen++)
				g->t_first = g->t_last;
			rc = detok_push(&g->dt, ev[i].token, &chunk, &len);
			if (!rc)
				rc = emit(g, o, chunk, len);
			if (!rc && o->json && ev[i].lp)
				rc = kvd_buf_add(&g->lps, ev[i].lp, sizeof(*ev[i].lp));
			if (rc) {
				fprintf(stderr, "kvd generate: output: %s\n", strerror(-rc));
				return 1;
			}
		}
	}
	return 0;
}

/* The prompt's ids through the detokenizer, their text dropped: the
 * prompt's BOS sets the leading-space rule of the output's first piece.
 * 0, or 1 after saying why on stderr. */
static int gen_detok_prompt(struct gen_run *g)
{
	const char *chunk;
	size_t len;

	for (size_t i = 0; i < g->n_prompt; i++) {
		int rc = detok_push(&g->dt, g->prompt[i], &chunk, &len);

		if (rc) {
			fprintf(stderr, "kvd generate: prompt id %d: %s\n", g->prompt[i],
				rc == -ERANGE ? "outside the tokenizer's vocabulary"
					      : strerror(-rc));
			return 1;
		}
	}
	return 0;
}

/* --json's one object: the ids, the text, the finish reason, timings. */
static void gen_json(const struct gen_run *g, const struct gen_opts *o,
		     enum engine_finish fin)
{
	uint32_t n;
	const int32_t *ids = engine_req_tokens(g->req, &n);

	/* ids the engine took: none is negative */
	fputs("{\"prompt_ids\":", stdout);
	kvd_json_u32s(stdout, (const uint32_t *)ids, g->n_prompt);
	fputs(",\"output_ids\":", stdout);
	kvd_json_u32s(stdout, (const uint32_t *)ids + g->n_prompt, n - g->n_prompt);
	proto_client_logprobs_json(stdout, (const void *)g->lps.p,
				   g->lps.len / sizeof(struct sampler_logprobs));
	fputs(",\"text\":", stdout);
	kvd_json_str(stdout, g->text.p ? g->text.p : "", g->text.len);
	fprintf(stdout, ",\"finish_reason\":\"%s\",\"timings\":",
		fin == ENGINE_FINISH_STOP ? "stop" : "length");
	json_timings(stdout, g, o);
	fputs("}\n", stdout);
}

/* The whole command after the options; what it opened stays in g for
 * gen_cleanup(). The exit status: 0, 66 (the model file), or 1. */
static int gen_run(struct gen_run *g, const struct gen_opts *o)
{
	enum engine_finish fin = ENGINE_FINISH_NONE;
	const char *chunk;
	size_t len;
	int rc;

	rc = gen_open_model(g, o);
	if (!rc)
		rc = gen_prompt(g, o);
	if (!rc)
		rc = gen_pool(g, o);
	if (!rc)
		rc = gen_engine(g, o);
	if (!rc)
		rc = gen_submit(g, o);
	if (!rc)
		rc = gen_detok_prompt(g);
	if (!rc)
		rc = gen_steps(g, o, &fin);
	if (rc)
		return rc;
	rc = detok_flush(&g->dt, &chunk, &len);
	if (!rc)
		rc = emit(g, o, chunk, len);
	if (rc) {
		fprintf(stderr, "kvd generate: output: %s\n", strerror(-rc));
		return 1;
	}
	if (o->json)
		gen_json(g, o, fin);
	else
		fputc('\n', stdout);
	return fflush(stdout) ? 1 : 0;
}

int kvd_cmd_generate(int argc, char **argv)
{
	struct gen_opts o;
	struct gen_run g = { 0 };
	int rc;

	rc = parse_opts(argc, argv, &o);
	if (rc) {
		gen_opts_deinit(&o);
		return rc > 0 ? 0 : 64;
	}
	rc = gen_run(&g, &o);
	gen_cleanup(&g);
	gen_opts_deinit(&o);
	return rc;
}

/* The weight types the model's matmuls read, each once, in first-use
 * order: "kernels":{"q8_0":"avx2",...}. */
static void json_kernels(FILE *out, const struct gen_run *g)
{
	const struct model *m = g->model;
	enum ggml_type seen[16];
	size_t n_seen = 0;

	fputc('{', out);
	for (uint32_t l = 0; l <= m->hp.n_layer; l++) {
		const struct model_layer *ly = l < m->hp.n_layer ? &m->layers[l] : NULL;
		const struct ops_mat *mats[7] = { &m->output };
		size_t n_mats = 1;

		if (ly) {
			const struct ops_mat *lm[7] = { &ly->wq, &ly->wk, &ly->wv, &ly->wo,
							&ly->w_gate, &ly->w_up, &ly->w_down };

			memcpy(mats, lm, sizeof(lm));
			n_mats = 7;
		}
		for (size_t i = 0; i < n_mats; i++) {
			enum ggml_type t = mats[i]->type;
			size_t j;

			for (j = 0; j < n_seen && seen[j] != t; j++)
				;
			if (j < n_seen || n_seen == KVD_ARRAY_SIZE(seen))
				continue;
			seen[n_seen++] = t;
			fprintf(out, "%s\"%s\":\"%s\"", n_seen > 1 ? "," : "",
				ggml_type_name(t), engine_kernel_variant(g->eng, t));
		}
	}
	fputc('}', out);
}

static void json_timings(FILE *out, const struct gen_run *g,
			 const struct gen_opts *o)
{
	double ttft = g->n_gen ? (double)(g->t_first - g->t_submit) / 1e9 : 0;
	double gen = (double)(g->t_last - g->t_first) / 1e9;
	const struct prepack_info *pi;

	fprintf(out, "{\"prompt_tokens\":%zu,\"prompt_tokens_per_s\":", g->n_prompt);
	if (ttft > 0)
		fprintf(out, "%.3f", (double)g->n_prompt / ttft);
	else
		fputs("null", out);
	fprintf(out, ",\"gen_tokens\":%u,\"gen_tokens_per_s\":", g->n_gen);
	if (g->n_gen > 1 && gen > 0)
		fprintf(out, "%.3f", (double)(g->n_gen - 1) / gen);
	else
		fputs("null", out);
	fputs(",\"ttft_ms\":", out);
	if (g->n_gen)
		fprintf(out, "%.3f", ttft * 1e3);
	else
		fputs("null", out);
	fprintf(out, ",\"threads\":%u,\"kernels\":", o->threads);
	json_kernels(out, g);
	pi = engine_pack_info(g->eng);
	fprintf(out, ",\"pack_cache\":{\"lookup\":\"%s\",\"store\":\"%s\",\"mapped\":%u,\"packed\":%u,\"removed\":%u,\"freed\":%llu}",
		pi->lookup, pi->store, pi->mapped, pi->packed, pi->clean.removed,
		(unsigned long long)pi->clean.freed);
	fputc('}', out);
}
