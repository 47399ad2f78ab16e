/* test_golden.c - greedy generation on stories260K must reproduce, token
 * for token, the output an independent llama implementation produced
 * ($KVD_SHARED/models/golden.json). Skips (77) when the files are absent.
 *
 * Every case of golden.json runs through the engine (F32 KV, as the
 * reference used), with 1 and 2 threads, three page sizes, and with the
 * scalar kernels as well as the SIMD ones.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/engine.h"
#include "gpu/kvmem.h"
#include "gpu/kvpool.h"
#include "gpu/model.h"

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
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	free(golden_text);
	return failed ? 1 : 0;
}
