/* test_golden.c - greedy generation on stories260K must reproduce, token
 * for token, the output an independent llama implementation produced
 * ($KVD_SHARED/models/golden.json). Skips (77) when the files are absent.
 *
 * Every case of golden.json runs through the engine (F32 KV, as the
 * reference used), with 1 and 2 threads, three page sizes, and with the
 * scalar kernels as well as the SIMD ones.
 *
 * The oracle cases ($KVD_SHARED/models/oracle/cases.tsv and
 * cases-deq.tsv: random llama, qwen2 and qwen3 models, with
 * llama.cpp's greedy outputs) must match over their leading safe steps:
 * llama.cpp's quantized-activation outputs or its exact-dequantization
 * ones, whichever agrees (kvd quantizes activations to Q8_K with its own
 * rounding, so either may be the nearer). kvd stops at EOS where
 * llama.cpp's runs went on, so the steps compared end at a first EOS.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/engine.h"
#include "gpu/kv/kvmem.h"
#include "gpu/kv/kvpool.h"
#include "gpu/model/model.h"
#include "gpu/text/tokenizer.h"

static char models_dir[1024];
static char *golden_text;

static char *slurp(const char *path)
{
	FILE *f = fopen(path, "rb");
	char *buf;
	long n;

	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	fseek(f, 0, SEEK_SET);
	buf = calloc(1, (size_t)n + 1);
	if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
		free(buf);
		buf = NULL;
	}
	fclose(f);
	return buf;
}

/* Parse `"key": [1, 2, 3]` found after *pos into ids; returns count or -1. */
static int json_ids(const char *from, const char *key, int32_t *ids, int cap)
{
	const char *p = strstr(from, key);
	int n = 0;

	if (!p || !(p = strchr(p, '[')))
		return -1;
	p++;
	while (*p && *p != ']') {
		char *end;
		long v = strtol(p, &end, 10);

		if (end == p) {
			p++;
			continue;
		}
		if (n < cap)
			ids[n] = (int32_t)v;
		n++;
		p = end;
	}
	return n;
}

static int json_int(const char *from, const char *key)
{
	const char *p = strstr(from, key);

	return p ? atoi(strchr(p, ':') + 1) : -1;
}

static void greedy(struct model *m, const int32_t *prompt, uint32_t n_prompt,
		   uint32_t max_tokens, uint32_t threads, uint32_t page_tokens,
		   bool simd, int32_t *out, uint32_t *n_out)
{
	struct kvmem mem;
	struct kvpool *pool;
	struct kvpool_geom g = { .page_tokens = page_tokens,
				 .n_layer = m->hp.n_layer,
				 .kv_dim = m->hp.n_head_kv * m->hp.head_dim,
				 .dtype = KV_DTYPE_F32 };
	struct engine_params ep = ENGINE_PARAMS_DEFAULT;
	struct engine_req_params rp = {
		.owner = 42, .prompt = prompt, .n_prompt = n_prompt,
		.max_tokens = max_tokens, .sampling = SAMPLER_PARAMS_GREEDY };
	struct engine *e;
	struct engine_req *r;
	const struct engine_event *ev;
	size_t n_ev;

	kvmem_host_init(&mem);
	ck_assert_int_eq(kvpool_new(&pool, &mem, &g, (n_prompt + max_tokens) / page_tokens + 2), 0);
	ep.threads = threads;
	ep.simd = simd;
	ep.prefill_chunk = 3; /* several prompt chunks */
	ck_assert_int_eq(engine_new(&e, m, pool, &ep, NULL), 0);
	ck_assert_int_eq(engine_submit(e, &rp, &r), 0);
	*n_out = 0;
	while (!engine_idle(e)) {
		ck_assert_int_eq(engine_step(e, &ev, &n_ev), 0);
		for (size_t i = 0; i < n_ev; i++) {
			if (ev[i].kind == ENGINE_EV_TOKEN)
				out[(*n_out)++] = ev[i].token;
			else
				ck_assert_msg(ev[i].finish == ENGINE_FINISH_LENGTH ||
					      ev[i].finish == ENGINE_FINISH_STOP,
					      "finish %s error %d",
					      engine_finish_name(ev[i].finish), ev[i].error);
		}
	}
	engine_req_free(e, r);
	engine_free(e);
	{
		struct kvpool_stats st;

		kvpool_get_stats(pool, &st);
		ck_assert_uint_eq(st.by_state[KVPAGE_FREE], st.pages);
	}
	kvpool_free(pool);
	kvmem_deinit(&mem);
}

START_TEST(test_golden_stories)
{
	char path[1200];
	struct model *m;
	struct gguf_error err;
	const char *c = golden_text;
	int cases = 0;

	snprintf(path, sizeof(path), "%s/stories260K.gguf", models_dir);
	ck_assert_msg(model_open(&m, path, &err) == 0, "%s", err.msg);
	while ((c = strstr(c, "\"model\""))) {
		int32_t prompt[256], want[1024], got[1024];
		int np = json_ids(c, "\"prompt_ids\"", prompt, 256);
		int nw = json_ids(c, "\"output_ids\"", want, 1024);
		int max_tokens = json_int(c, "\"max_tokens\"");
		/* the AVX2 kernels (when the CPU has them) and the scalar ones */
		const uint32_t threads[] = { 1, 2, 1, 2 };
		const uint32_t pts[] = { 16, 1, 64, 16 };
		const bool simd[] = { true, true, true, false };

		ck_assert(np > 0 && np <= 256 && nw > 0 && nw <= 1024 && max_tokens > 0);
		if (!strstr(c, "stories260K")) {
			c++;
			continue;
		}
		for (int v = 0; v < 4; v++) {
			uint32_t n_got;

			greedy(m, prompt, (uint32_t)np, (uint32_t)max_tokens,
			       threads[v], pts[v], simd[v], got, &n_got);
			ck_assert_uint_eq(n_got, (uint32_t)nw);
			for (int i = 0; i < nw; i++)
				ck_assert_msg(got[i] == want[i],
					      "token %d: got %d want %d (threads %u page_tokens %u simd %d)",
					      i, got[i], want[i], threads[v], pts[v], simd[v]);
		}
		cases++;
		c++;
	}
	ck_assert_int_gt(cases, 0);
	model_free(m);
}
END_TEST

/* One oracle line: model, prompt, n_safe, 16 ids. 0 on a parse error. */
struct oracle_case {
	char model[128];
	char prompt[128];
	int n_safe;
	int32_t ids[16];
};

static int oracle_parse(char *line, struct oracle_case *oc)
{
	char *f[4], *save = NULL, *p;

	if (line[0] == '#')
		return 0;
	for (int i = 0; i < 4; i++)
		if (!(f[i] = strtok_r(i ? NULL : line, "\t\n", &save)))
			return 0;
	snprintf(oc->model, sizeof(oc->model), "%s", f[0]);
	snprintf(oc->prompt, sizeof(oc->prompt), "%s", f[1]);
	oc->n_safe = atoi(f[2]);
	p = f[3];
	for (int i = 0; i < 16; i++)
		oc->ids[i] = (int32_t)strtol(p, &p, 10);
	return 1;
}

/* The oracle models of the architectures kvd runs. */
static int oracle_runs(const char *model)
{
	static const char *const archs[] = { "random-llama-", "random-qwen2-",
					       "random-qwen3-" };

	for (size_t i = 0; i < sizeof(archs) / sizeof(archs[0]); i++)
		if (!strncmp(model, archs[i], strlen(archs[i])))
			return 1;
	return 0;
}

/* Steps to compare: the safe ones, cut at kvd's stop on EOS. */
static int oracle_steps(int n_safe, uint32_t n_got)
{
	return n_safe < (int)n_got ? n_safe : (int)n_got;
}

/* Leading steps where got equals want (at most n). */
static int prefix_match(const int32_t *got, const int32_t *want, int n)
{
	int i = 0;

	while (i < n && got[i] == want[i])
		i++;
	return i;
}

START_TEST(test_oracle_kquant)
{
	char path[1200], line[2048];
	FILE *fq, *fd;
	int checked = 0;

	snprintf(path, sizeof(path), "%s/oracle/cases.tsv", models_dir);
	fq = fopen(path, "r");
	snprintf(path, sizeof(path), "%s/oracle/cases-deq.tsv", models_dir);
	fd = fopen(path, "r");
	ck_assert(fq && fd);
	while (fgets(line, sizeof(line), fq)) {
		struct oracle_case q, d = { .n_safe = -1 };
		char dline[2048];
		struct model *m;
		struct tokenizer *tok;
		struct gguf_error err;
		int32_t *ids, got[16];
		size_t n_ids;
		uint32_t n_got;

		if (!oracle_parse(line, &q) || !oracle_runs(q.model))
			continue;
		rewind(fd);
		while (fgets(dline, sizeof(dline), fd)) {
			struct oracle_case c;

			if (oracle_parse(dline, &c) && !strcmp(c.model, q.model) &&
			    !strcmp(c.prompt, q.prompt))
				d = c;
		}
		snprintf(path, sizeof(path), "%s/oracle/%s", models_dir, q.model);
		ck_assert_msg(model_open(&m, path, &err) == 0, "%s: %s", q.model, err.msg);
		ck_assert_int_eq(tokenizer_new(&tok, m->file, &err), 0);
		ck_assert_int_eq(tokenizer_encode(tok, q.prompt, strlen(q.prompt),
						  true, &ids, &n_ids), 0);
		for (int v = 0; v < 2; v++) {
			int a, b;

			greedy(m, ids, (uint32_t)n_ids, 16, 1 + v, 16, v == 0,
			       got, &n_got);
			/* kvd stops at EOS without emitting it, llama.cpp's
			 * runs went on: a short run is the EOS step, and the
			 * steps compared end there. */
			if (n_got < 16)
				got[n_got++] = m->eos_id;
			a = prefix_match(got, q.ids, oracle_steps(q.n_safe, n_got));
			b = d.n_safe >= 0 ? prefix_match(got, d.ids, oracle_steps(d.n_safe, n_got)) : -1;
			ck_assert_msg(a == oracle_steps(q.n_safe, n_got) ||
				      b == oracle_steps(d.n_safe, n_got),
				      "%s \"%s\" simd %d: matches %d of %d quantized-path steps, %d of %d dequantized-path",
				      q.model, q.prompt, v == 0, a, q.n_safe, b, d.n_safe);
			if (v == 0)
				printf("oracle %s \"%s\": %d leading steps match (n_safe %d, cut at EOS; %s path)\n", q.model,
				       q.prompt, a == oracle_steps(q.n_safe, n_got) ? a : b,
				       a == oracle_steps(q.n_safe, n_got) ? q.n_safe : d.n_safe,
				       a == oracle_steps(q.n_safe, n_got) ? "llama.cpp" : "dequantized");
		}
		free(ids);
		tokenizer_free(tok);
		model_free(m);
		checked++;
	}
	fclose(fq);
	fclose(fd);
	ck_assert_int_gt(checked, 0);
}
END_TEST

int main(void)
{
	const char *shared = getenv("KVD_SHARED");
	char path[1200];
	Suite *s;
	TCase *tc;
	SRunner *sr;
	int failed;
	FILE *f;

	snprintf(models_dir, sizeof(models_dir), "%s/models",
		 shared ? shared : "../shared");
	snprintf(path, sizeof(path), "%s/stories260K.gguf", models_dir);
	f = fopen(path, "rb");
	if (!f)
		return 77;
	fclose(f);
	snprintf(path, sizeof(path), "%s/golden.json", models_dir);
	golden_text = slurp(path);
	if (!golden_text)
		return 77;
	s = suite_create("golden");
	tc = tcase_create("stories260K");
	tcase_set_timeout(tc, 300);
	tcase_add_test(tc, test_golden_stories);
	suite_add_tcase(s, tc);
	snprintf(path, sizeof(path), "%s/oracle/cases.tsv", models_dir);
	f = fopen(path, "rb");
	if (f) {
		fclose(f);
		tc = tcase_create("oracle");
		tcase_set_timeout(tc, 300);
		tcase_add_test(tc, test_oracle_kquant);
		suite_add_tcase(s, tc);
	}
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	free(golden_text);
	return failed ? 1 : 0;
}
