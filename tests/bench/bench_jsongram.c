/* bench_jsongram.c - what response_format json costs per generated token.
 *
 * For each model in $KVD_SHARED/models (stories260K: 512 tokens;
 * llama-2-tiny-random: 32,000) that is present: the vocabulary trie's
 * build time, then the engine decoding 512 tokens (temperature 1, one
 * request at a time, a new one when the last ended) unconstrained, under
 * json_object, under a schema and under a forced tool call (tool_choice
 * required, chatml: <tool_call> tags around a union of two tools, one
 * strict with the schema above; net/wire/openai_toolgram.c), the same
 * under tool_choice auto (tool_auto: the lazy grammar; these models
 * never write "<tool_call>", so it is the free-text mask), and under a
 * schema of checked strings (pattern, lengths, a format). Per token: the whole step, the mask
 * (jgram_run_mask, timed inside the constraint) and the mask's share of
 * the step; the unconstrained step is the reference. Medians of rounds.
 * Then one mask's cost inside a string: plain text (the precomputed
 * set), and strings with a pattern, lengths and a pattern, a format
 * (each byte walked).
 *
 * Then the lazy grammar's mask alone on the vocabularies of
 * $KVD_SHARED/vocab (llama-spm 32,000 tokens; qwen2 151,936, whose
 * "<tool_call>" is one token): in free text (the cheap case), with
 * "<tool_" pending (a trie walk), and after the trigger inside the
 * call (the grammar's mask, as a forced call's), us per mask.
 *
 *   bench_jsongram [ROUNDS]         (default 5)
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conf/util.h"
#include "gpu/engine.h"
#include "gpu/gguf/gguf.h"
#include "gpu/kv/kvmem.h"
#include "gpu/kv/kvpool.h"
#include "gpu/model/model.h"
#include "gpu/text/jsongram.h"
#include "gpu/text/tokenizer.h"
#include "net/wire/jschema.h"
#include "net/wire/openai.h"

#define N_TOKENS 512u

static const char schema[] =
	"{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
	"\"age\":{\"type\":\"integer\"},\"tags\":{\"type\":\"array\",\"items\":"
	"{\"enum\":[\"a\",\"b\",\"c\"]}},\"ok\":{\"type\":\"boolean\"}},"
	"\"required\":[\"name\",\"age\",\"ok\"]}";

/* strings under checks: a pattern, lengths with a pattern, a format */
static const char pattern_schema[] =
	"{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"string\","
	"\"pattern\":\"^[a-z]{3}-\\\\d{4}$\"},\"name\":{\"type\":\"string\",\"minLength\":1,"
	"\"maxLength\":40,\"pattern\":\"^[A-Za-z ]+$\"},\"when\":{\"type\":\"string\","
	"\"format\":\"date-time\"},\"bio\":{\"type\":\"string\",\"pattern\":\"^[A-Za-z ,.]+$\"}},"
	"\"required\":[\"id\",\"name\",\"when\"]}";

/* the constraint, timed */
struct timed {
	struct jgram_run *run;
	uint64_t mask_ns;
	uint64_t masks;
};

static uint32_t timed_mask(void *ctx, float *logits, uint32_t n)
{
	struct timed *t = ctx;
	uint64_t t0 = kvd_now_ns();
	uint32_t k = jgram_run_mask(t->run, logits, n);

	t->mask_ns += kvd_now_ns() - t0;
	t->masks++;
	return k;
}

static bool timed_accept(void *ctx, int32_t tok)
{
	return jgram_run_accept(((struct timed *)ctx)->run, tok);
}

struct bench {
	const struct model *m;
	const struct tokenizer *tok;
	const struct jgram_vocab *v;
	int32_t *prompt;
	size_t n_prompt;
};

/* One request (a new run when g): decode until it ends or *left runs out. */
static int one_request(struct engine *e, const struct bench *b, const struct jgram *g,
		       struct timed *t, uint64_t seed, uint32_t *left)
{
	struct engine_req_params rp = {
		.owner = seed, .prompt = b->prompt, .n_prompt = (uint32_t)b->n_prompt,
		.max_tokens = *left,
		.sampling = { .temperature = 1.0f, .top_p = 1.0f, .seed = seed },
		.ignore_eos = !g };
	const struct engine_event *ev;
	struct engine_req *r;
	size_t n_ev;
	int rc;

	if (g) {
		if ((rc = jgram_run_new(&t->run, g, b->v)))
			return rc;
		rp.constraint = (struct engine_constraint){ .ctx = t, .mask = timed_mask,
							    .accept = timed_accept };
	}
	rc = engine_submit(e, &rp, &r);
	while (!rc && !engine_idle(e))
		rc = engine_step(e, &ev, &n_ev);
	*left -= engine_req_n_output(r) < *left ? engine_req_n_output(r) : *left;
	if (engine_req_n_output(r) == 0 && *left)
		(*left)--;   /* an answer of EOS alone still counts a step */
	engine_req_free(e, r);
	jgram_run_free(t->run);
	t->run = NULL;
	return rc;
}

/* ns per token of the steps and of the mask, over N_TOKENS tokens */
static int run_mode(const struct bench *b, const struct jgram *g, double *step_ns,
		    double *mask_ns)
{
	struct kvpool_geom geom = { .page_tokens = 16, .n_layer = b->m->hp.n_layer,
		.kv_dim = b->m->hp.n_head_kv * b->m->hp.head_dim, .dtype = KV_DTYPE_F32 };
	struct engine_params ep = ENGINE_PARAMS_DEFAULT;
	uint32_t left = N_TOKENS, ctx = (uint32_t)b->n_prompt + N_TOKENS + 8;
	struct timed t = { 0 };
	struct kvpool *pool = NULL;
	struct engine *e;
	struct kvmem mem;
	uint64_t t0, seed = 1;
	int rc;

	kvmem_host_init(&mem);
	rc = kvpool_new(&pool, &mem, &geom, ctx / 16 + 4);
	ep.max_batch = 1;
	ep.n_ctx = ctx;
	if (!rc && (rc = engine_new(&e, b->m, pool, &ep, NULL)) == 0) {
		t0 = kvd_now_ns();
		while (!rc && left)
			rc = one_request(e, b, g, &t, seed++, &left);
		*step_ns = (double)(kvd_now_ns() - t0) / N_TOKENS;
		*mask_ns = t.masks ? (double)t.mask_ns / (double)t.masks : 0;
		engine_free(e);
	}
	if (pool)
		kvpool_free(pool);
	kvmem_deinit(&mem);
	return rc;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_d);
	return v[n / 2];
}

/* The call's grammar (chatml): forced (tool_choice required) or lazy
 * (auto). */
static int tool_grammar_choice(struct jgram **out, const char *choice)
{
	char body[1024];
	struct openai_req q;
	struct openai_error e;
	int rc;

	snprintf(body, sizeof(body), "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
		 "\"tool_choice\":\"%s\",\"tools\":[{\"type\":\"function\",\"function\":"
		 "{\"name\":\"add_person\",\"strict\":true,\"parameters\":%s}},"
		 "{\"type\":\"function\",\"function\":{\"name\":\"search\"}}]}", choice, schema);
	rc = openai_req_parse(&q, true, body, strlen(body), &e);
	if (rc)
		return rc < 0 ? rc : -EINVAL;
	rc = openai_tools_grammar(&q, CHAT_CHATML, &e);
	*out = q.gram;
	q.gram = NULL;
	openai_req_deinit(&q);
	return rc < 0 ? rc : rc ? -EINVAL : 0;
}

static int tool_grammar(struct jgram **out)
{
	return tool_grammar_choice(out, "required");
}

/* One mask's cost after prefix (ns, median of 101 calls). */
static int mask_at(const struct bench *b, const struct jgram *g, const char *prefix,
		   double *ns)
{
	uint32_t nv = tokenizer_n_vocab(b->tok);
	float *logits = calloc(nv, sizeof(float));
	struct jgram_run *r = NULL;
	double v[101];
	int rc = logits ? jgram_run_new(&r, g, b->v) : -ENOMEM;

	if (!rc && !jgram_run_feed(r, prefix, strlen(prefix)))
		rc = -EINVAL;
	for (int i = 0; i < 101 && !rc; i++) {
		uint64_t t0 = kvd_now_ns();

		jgram_run_mask(r, logits, nv);
		v[i] = (double)(kvd_now_ns() - t0);
	}
	if (!rc)
		*ns = median(v, 101);
	jgram_run_free(r);
	free(logits);
	return rc;
}

/* The mask inside a string: plain (the precomputed set), with lengths
 * and a pattern, with a format. */
static int bench_in_string(const struct bench *b, const struct jgram *pg)
{
	static const char *const where[][2] = {
		{ "plain string", "{\"id\":\"abc-1234\",\"name\":\"Ab" },
		{ "pattern+lengths", "{\"name\":\"Ab" },
		{ "pattern, no max", "{\"bio\":\"Ab" },
		{ "pattern", "{\"id\":\"ab" },
		{ "format date-time", "{\"when\":\"2024-0" },
	};
	struct jgram *obj = NULL;
	int rc = jgram_new_object(&obj);

	for (size_t i = 0; i < sizeof(where) / sizeof(where[0]) && !rc; i++) {
		double ns = 0;

		rc = mask_at(b, i ? pg : obj, where[i][1], &ns);
		if (!rc)
			printf("  mask in a %-17s %8.1f us\n", where[i][0], ns / 1e3);
	}
	jgram_free(obj);
	return rc;
}

#define MODES 6

static int bench_modes(const struct bench *b, int rounds)
{
	static const char *const names[MODES] = { "none", "json_object", "json_schema",
						  "tool_call", "tool_auto", "pattern" };
	struct jgram *g[MODES] = { NULL };
	double step[MODES][16], mask[MODES][16], base;
	char msg[200];
	int rc = jgram_new_object(&g[1]);

	if (!rc)
		rc = jschema_compile_text(schema, strlen(schema), &g[2], msg, sizeof(msg));
	if (!rc)
		rc = tool_grammar(&g[3]);
	if (!rc)
		rc = tool_grammar_choice(&g[4], "auto");
	if (!rc)
		rc = jschema_compile_text(pattern_schema, strlen(pattern_schema), &g[5], msg,
					  sizeof(msg));
	for (int r = 0; r < rounds && !rc; r++)
		for (int k = 0; k < MODES && !rc; k++)
			rc = run_mode(b, g[k], &step[k][r], &mask[k][r]);
	base = rc ? 0 : median(step[0], rounds);
	for (int k = 0; k < MODES && !rc; k++) {
		double s = median(step[k], rounds), mk = median(mask[k], rounds);

		printf("  %-12s step %8.1f us/token (x%.2f)   mask %8.1f us/token (%4.1f%% of the step)\n",
		       names[k], s / 1e3, s / base, mk / 1e3, 100.0 * mk / s);
	}
	if (!rc)
		rc = bench_in_string(b, g[5]);
	for (int k = 1; k < MODES; k++)
		jgram_free(g[k]);
	return rc;
}

static int bench_file(const char *path, int rounds)
{
	struct gguf_error err = { 0 };
	struct gguf_file *f;
	struct model *m = NULL;
	struct tokenizer *t = NULL;
	struct jgram_vocab *v = NULL;
	struct bench b = { 0 };
	uint64_t t0;
	int rc;

	if (gguf_open(&f, path, &err)) {
		printf("%s: absent, skipped\n", path);
		return 0;
	}
	rc = model_from_gguf(&m, f, &err);
	if (!rc)
		rc = tokenizer_new(&t, f, &err);
	t0 = kvd_now_ns();
	if (!rc)
		rc = jgram_vocab_new(&v, t);
	if (!rc) {
		printf("%s: vocabulary %u tokens, trie built in %.2f ms, every byte a token: %s\n",
		       path, tokenizer_n_vocab(t), (double)(kvd_now_ns() - t0) / 1e6,
		       jgram_vocab_bytes_covered(v) ? "yes" : "no");
		rc = tokenizer_encode(t, "Once upon a time", 16, true, &b.prompt, &b.n_prompt);
	}
	b = (struct bench){ .m = m, .tok = t, .v = v, .prompt = b.prompt, .n_prompt = b.n_prompt };
	if (!rc)
		rc = bench_modes(&b, rounds);
	free(b.prompt);
	jgram_vocab_free(v);
	tokenizer_free(t);
	if (m)
		model_free(m);
	gguf_close(f);
	return rc;
}

/* us per jgram_run_mask of g's run after text, over n masks */
static double mask_us(const struct jgram *g, const struct jgram_vocab *v, const char *text,
		      unsigned n, float *logits)
{
	struct jgram_run *r;
	uint64_t t0, ns = 0;

	if (jgram_run_new(&r, g, v) || !jgram_run_feed(r, text, strlen(text))) {
		jgram_run_free(r);
		return -1;
	}
	for (unsigned i = 0; i < n; i++) {
		t0 = kvd_now_ns();
		jgram_run_mask(r, logits, jgram_vocab_n_vocab(v));
		ns += kvd_now_ns() - t0;
	}
	jgram_run_free(r);
	return (double)ns / n / 1e3;
}

static int bench_lazy_vocab(const char *path)
{
	static const char inside[] = "Sure.<tool_call>\n{\"name\": \"add_person\", \"arguments\": {\"name\": \"Jo";
	struct gguf_error err = { 0 };
	struct gguf_file *f;
	struct tokenizer *t = NULL;
	struct jgram_vocab *v = NULL;
	struct jgram *lazy = NULL, *forced = NULL;
	struct jgram_run *r = NULL;
	float *logits = NULL;
	uint64_t t0;
	double trig_ms = 0;
	int rc;

	if (gguf_open(&f, path, &err)) {
		printf("%s: absent, skipped\n", path);
		return 0;
	}
	rc = tokenizer_new(&t, f, &err);
	if (!rc)
		rc = jgram_vocab_new(&v, t);
	if (!rc)
		rc = tool_grammar_choice(&lazy, "auto");
	if (!rc)
		rc = tool_grammar(&forced);
	if (!rc && !(logits = calloc(tokenizer_n_vocab(t), sizeof(float))))
		rc = -ENOMEM;
	if (!rc) {
		t0 = kvd_now_ns();   /* the first run lists the trigger's tokens */
		rc = jgram_run_new(&r, lazy, v);
		trig_ms = (double)(kvd_now_ns() - t0) / 1e6;
		jgram_run_free(r);
	}
	if (!rc) {
		printf("%s: %u tokens; the trigger's tokens listed in %.2f ms (once per vocabulary)\n",
		       path, tokenizer_n_vocab(t), trig_ms);
		printf("  lazy, free text            mask %8.2f us\n",
		       mask_us(lazy, v, "Hello there", 2000, logits));
		printf("  lazy, \"<tool_\" pending     mask %8.2f us\n",
		       mask_us(lazy, v, "Hello <tool_", 20, logits));
		printf("  lazy, after the trigger    mask %8.2f us (in a string)   %8.2f us (before a key)\n",
		       mask_us(lazy, v, inside, 200, logits), mask_us(lazy, v, "<tool_call>{", 20, logits));
		printf("  forced, the same places    mask %8.2f us (in a string)   %8.2f us (before a key)\n",
		       mask_us(forced, v, inside + 5, 200, logits), mask_us(forced, v, "<tool_call>{", 20, logits));
	}
	free(logits);
	jgram_free(lazy);
	jgram_free(forced);
	jgram_vocab_free(v);
	tokenizer_free(t);
	gguf_close(f);
	return rc;
}

int main(int argc, char **argv)
{
	static const char *const files[] = { "stories260K.gguf", "llama-2-tiny-random.gguf" };
	const char *shared = getenv("KVD_SHARED") ? getenv("KVD_SHARED") : "../shared";
	int rounds = argc > 1 ? atoi(argv[1]) : 5;
	char path[1024];
	int rc = 0;

	if (rounds < 1 || rounds > 16)
		rounds = 5;
	printf("bench_jsongram: %u tokens per mode, temperature 1, 1 thread, median of %d rounds\n",
	       N_TOKENS, rounds);
	for (size_t i = 0; i < sizeof(files) / sizeof(files[0]) && !rc; i++) {
		snprintf(path, sizeof(path), "%s/models/%s", shared, files[i]);
		rc = bench_file(path, rounds);
	}
	for (size_t i = 0; i < 2 && !rc; i++) {
		snprintf(path, sizeof(path), "%s/vocab/ggml-vocab-%s.gguf", shared,
			 i ? "qwen2" : "llama-spm");
		rc = bench_lazy_vocab(path);
	}
	if (rc)
		fprintf(stderr, "bench_jsongram: failed (%d)\n", rc);
	return rc ? 1 : 0;
}
