/* cmd_model.c - `kvctl model make` and `kvctl model inspect`.
 *
 * Both subcommands are thin: options are parsed from two small tables
 * (name, kind, destination) so usage errors are uniform, `make` hands the
 * numbers to gguf_make_llama() and `inspect` prints what gguf_open() and
 * gguf_llama_hparams() found, plus the two figures an operator sizes a
 * node with: KV bytes per token and how many tokens of KV fit in a given
 * amount of memory. The SHA-256 printed is the fingerprint kvd logs as
 * model_sha256 and that peers compare at handshake.
 *
 * No getopt: it keeps global state (optind), and kvctl's dispatcher may
 * call more than one command in a process (tests do).
 */
#include "ctl/cmd_model.h"

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conf/sha256.h"
#include "conf/util.h"
#include "gpu/text/chat.h"
#include "gpu/gguf/gguf.h"
#include "gpu/model/gguf_gen.h"

#define EXIT_OK 0
#define EXIT_BAD_FILE 1
#define EXIT_USAGE 2

static void model_usage(FILE *fp)
{
	fputs("usage: kvctl model make OUT.gguf [--arch llama|qwen2|qwen3] [--layers N]\n"
	      "                  [--dim N] [--heads N] [--kv-heads N] [--head-dim N]\n"
	      "                  [--ff N] [--vocab N] [--ctx N]\n"
	      "                  [--dtype f32|f16|q8_0|q4_0|q2_k|q3_k|q4_k|q5_k|q6_k|\n"
	      "                           q3_k_m|q4_k_m|q5_k_m] [--seed S] [--tied]\n"
	      "                  [--tokenizer llama|gpt2 | --vocab-from VOCAB.gguf]\n"
	      "                  [--chat-template llama2|llama3|chatml|\n"
	      "                   mistral|gemma|phi3|deepseek|\n"
	      "                   mistral_v3]\n"
	      "       kvctl model inspect FILE [--memory BYTES] [--kv-dtype f32|f16] [--json]\n"
	      "       kvctl model tokenize MODEL.gguf [--no-bos] [--special] [--json]\n"
	      "                            (TEXT | --file PATH)\n"
	      "       kvctl model detokenize MODEL.gguf IDS...\n"
	      "       kvctl model chat MODEL.gguf [--format NAME|auto] [--no-gen] [--ids] [--tools FILE]\n"
	      "                        ROLE=CONTENT...\n"
	      "BYTES takes a K, M, G or T suffix (powers of 1024; KiB, GB... also read as such).\n",
	      fp);
}

/* ---- option table ---------------------------------------------------------- */

enum opt_kind { OPT_U32, OPT_U64, OPT_BYTES, OPT_FLAG, OPT_WORD, OPT_PATH };

struct opt {
	const char *name;
	enum opt_kind kind;
	void *dst;                 /* uint32_t*, uint64_t*, bool*, const char** */
	const char *const *words;  /* OPT_WORD: NULL-terminated choices */
};

/* Parse argv[first..] against the table; positional arguments go to
 * pos[] (up to n_pos). Returns 0 or prints the problem and returns -1. */
static int opts_parse(int argc, char **argv, int first, const struct opt *opts,
		      size_t n_opts, const char **pos, int n_pos)
{
	int got = 0;

	for (int i = first; i < argc; i++) {
		const char *a = argv[i];
		if (a[0] != '-' || !a[1]) {
			if (got == n_pos) {
				fprintf(stderr, "kvctl model: unexpected argument '%s'\n", a);
				return -1;
			}
			pos[got++] = a;
			continue;
		}
		const struct opt *o = NULL;
		for (size_t k = 0; k < n_opts; k++)
			if (!strcmp(a, opts[k].name))
				o = &opts[k];
		if (!o) {
			fprintf(stderr, "kvctl model: unknown option '%s'\n", a);
			return -1;
		}
		if (o->kind == OPT_FLAG) {
			*(bool *)o->dst = true;
			continue;
		}
		if (i + 1 >= argc) {
			fprintf(stderr, "kvctl model: %s needs a value\n", a);
			return -1;
		}
		const char *v = argv[++i];
		uint64_t u;
		switch (o->kind) {
		case OPT_U32:
			if (kvd_parse_u64(v, &u) || u > UINT32_MAX)
				goto bad;
			*(uint32_t *)o->dst = (uint32_t)u;
			break;
		case OPT_U64:
			if (kvd_parse_u64(v, &u))
				goto bad;
			*(uint64_t *)o->dst = u;
			break;
		case OPT_BYTES:    /* "64G", "1.5GiB", "512MB", "4096" */
			if (kvd_parse_size(v, &u))
				goto bad;
			*(uint64_t *)o->dst = u;
			break;
		case OPT_PATH:
			*(const char **)o->dst = v;
			break;
		case OPT_WORD: {
			bool ok = false;
			for (const char *const *w = o->words; *w; w++)
				if (!strcmp(*w, v))
					ok = true;
			if (!ok)
				goto bad;
			*(const char **)o->dst = v;
			break;
		}
		case OPT_FLAG:
			break;
		}
		continue;
bad:
		fprintf(stderr, "kvctl model: bad value '%s' for %s\n", v, a);
		return -1;
	}
	if (got != n_pos) {
		fprintf(stderr, "kvctl model: missing file argument\n");
		return -1;
	}
	return 0;
}

/* ---- make ------------------------------------------------------------------ */

static const char *const dtype_words[] = { "f32", "f16", "q8_0", "q4_0", "q2_k",
					   "q3_k", "q4_k", "q5_k", "q6_k", "q3_k_m",
					   "q4_k_m", "q5_k_m", NULL };
/* the weight type of each dtype word, in dtype_words order; the _m words
 * put attn_v, ffn_down and output in Q6_K */
static const enum ggml_type dtype_types[] = {
	GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, GGML_TYPE_Q2_K,
	GGML_TYPE_Q3_K, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K,
	GGML_TYPE_Q3_K, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K,
};
static const char *const tok_words[] = { "llama", "gpt2", NULL };
/* in enum llama_arch order */
static const char *const arch_words[] = { "llama", "qwen2", "qwen3", NULL };
static const char *const chat_words[] = { "none", "llama2", "llama3", "chatml",
	"mistral", "gemma", "phi3", "deepseek", "mistral_v3", NULL };
static const char *const kv_words[] = { "f32", "f16", NULL };

/* The words of make's options into p: --kv-heads defaults to --heads,
 * the weight type (and the _m mix) from dtype, the vocabulary kind from
 * tok. */
static void make_words(struct gguf_llama_params *p, const char *dtype,
		       const char *tok)
{
	if (!p->n_head_kv)
		p->n_head_kv = p->n_head;
	for (size_t i = 0; i < KVD_ARRAY_SIZE(dtype_types); i++)
		if (!strcmp(dtype, dtype_words[i])) {
			p->wtype = dtype_types[i];
			p->mix_q6_k = strstr(dtype, "_m") != NULL;
		}
	p->vocab = !strcmp(tok, "gpt2") ? GGUF_VOCAB_GPT2 : GGUF_VOCAB_LLAMA;
}

/* --vocab-from: the file's tokenizer as it is, opened into *vf (the
 * caller closes it after the model is written); --vocab and --tokenizer
 * follow it (*tok becomes the path). EXIT_OK, or EXIT_BAD_FILE after
 * saying why. */
static int make_vocab_from(struct gguf_llama_params *p, const char *vocab_from,
			   struct gguf_file **vf, const char **tok)
{
	struct gguf_error err;

	if (gguf_open(vf, vocab_from, &err)) {
		fprintf(stderr, "kvctl model make: %s: %s\n", vocab_from, err.msg);
		return EXIT_BAD_FILE;
	}
	p->n_vocab = gguf_vocab_size(*vf);
	if (!p->n_vocab) {
		fprintf(stderr, "kvctl model make: %s: no tokenizer.ggml.tokens "
				"string array\n", vocab_from);
		return EXIT_BAD_FILE;
	}
	p->vocab_from = *vf;
	*tok = vocab_from;
	return EXIT_OK;
}

static int model_make(int argc, char **argv)
{
	struct gguf_llama_params p = GGUF_LLAMA_PARAMS_DEFAULT;
	const char *dtype = "f32", *tok = "llama", *arch = "llama", *out = NULL;
	const char *vocab_from = NULL;
	_cleanup_(gguf_closep) struct gguf_file *vf = NULL;
	const char *chat = "none";
	enum chat_format cf = CHAT_NONE;
	char why[160];
	int rc;

	p.n_head_kv = 0; /* default: = heads */
	const struct opt opts[] = {
		{ "--arch", OPT_WORD, &arch, arch_words },
		{ "--layers", OPT_U32, &p.n_layer, NULL },
		{ "--dim", OPT_U32, &p.n_embd, NULL },
		{ "--heads", OPT_U32, &p.n_head, NULL },
		{ "--kv-heads", OPT_U32, &p.n_head_kv, NULL },
		{ "--head-dim", OPT_U32, &p.head_dim, NULL },
		{ "--ff", OPT_U32, &p.n_ff, NULL },
		{ "--vocab", OPT_U32, &p.n_vocab, NULL },
		{ "--ctx", OPT_U32, &p.n_ctx, NULL },
		{ "--seed", OPT_U64, &p.seed, NULL },
		{ "--dtype", OPT_WORD, &dtype, dtype_words },
		{ "--tokenizer", OPT_WORD, &tok, tok_words },
		{ "--tied", OPT_FLAG, &p.tied, NULL },
		{ "--vocab-from", OPT_PATH, &vocab_from, NULL },
		{ "--chat-template", OPT_WORD, &chat, chat_words },
	};
	if (opts_parse(argc, argv, 2, opts, KVD_ARRAY_SIZE(opts), &out, 1)) {
		model_usage(stderr);
		return EXIT_USAGE;
	}
	make_words(&p, dtype, tok);
	if (vocab_from) {
		rc = make_vocab_from(&p, vocab_from, &vf, &tok);
		if (rc)
			return rc;
	}
	for (size_t i = 0; arch_words[i]; i++)
		if (!strcmp(arch, arch_words[i]))
			p.arch = (enum llama_arch)i;
	if (chat_format_by_name(chat, &cf) == 0)
		p.chat_template = chat_format_template(cf);
	if (gguf_llama_params_check(&p, why, sizeof(why))) {
		fprintf(stderr, "kvctl model make: %s\n", why);
		return EXIT_USAGE;
	}
	uint64_t t0 = kvd_now_ns();
	rc = gguf_make_llama(out, &p);
	if (rc) {
		fprintf(stderr, "kvctl model make: %s: %s\n", out,
			rc == -EINVAL ? (vocab_from ? "the vocabulary file has a key the writer cannot copy"
						    : "the vocabulary generator cannot make that many tokens")
				      : strerror(-rc));
		return EXIT_BAD_FILE;
	}
	printf("wrote %s: %s, %u layers, dim %u, %u heads (%u kv, head dim %u), ff %u, vocab %u (%s), %s, %.1fM params%s, %.2f s\n",
	       out, arch, p.n_layer, p.n_embd, p.n_head, p.n_head_kv,
	       p.head_dim ? p.head_dim : p.n_embd / p.n_head, p.n_ff,
	       p.n_vocab, tok, dtype, (double)gguf_llama_n_params(&p) / 1e6,
	       p.tied ? ", tied embeddings" : "",
	       (double)(kvd_now_ns() - t0) / 1e9);
	return EXIT_OK;
}

/* ---- inspect --------------------------------------------------------------- */

struct inspect {
	const char *path;
	struct gguf_file *f;
	struct llama_hparams hp;
	uint64_t n_type[64];       /* tensors per ggml type id (< 64) */
	uint64_t weight_bytes;
	uint64_t n_params;
	struct gguf_str name;
	struct gguf_str tok_model;
	enum kv_dtype kv;
	uint64_t memory;           /* 0 = not given */
	char sha[SHA256_HEX_SIZE];
};

static void inspect_text(const struct inspect *in)
{
	const struct llama_hparams *hp = &in->hp;
	uint64_t kvb = llama_kv_bytes_per_token(hp, in->kv);

	printf("file          %s\n", in->path);
	printf("format        GGUF v%u, %zu bytes, %" PRIu64 " keys, %" PRIu64 " tensors, alignment %" PRIu64 "\n",
	       in->f->version, in->f->size, in->f->n_kv, in->f->n_tensors,
	       in->f->alignment);
	printf("name          %.*s\n", (int)in->name.len, in->name.ptr);
	printf("architecture  %s\n", hp->arch);
	printf("layers        %u\n", hp->n_layer);
	printf("embedding     %u\n", hp->n_embd);
	printf("heads         %u (kv %u, head dim %u)\n", hp->n_head,
	       hp->n_head_kv, hp->head_dim);
	printf("feed forward  %u\n", hp->n_ff);
	printf("vocab         %u (tokenizer %.*s)\n", hp->n_vocab,
	       (int)in->tok_model.len, in->tok_model.ptr);
	if (hp->n_swa)
		printf("context       %u (sliding window %u: kvd attends to the "
		       "whole context, the same below the window)\n",
		       hp->n_ctx_train, hp->n_swa);
	else
		printf("context       %u\n", hp->n_ctx_train);
	printf("rope          dim %u, base %g, scale %g\n", hp->rope_dim,
	       hp->rope_freq_base, hp->rope_freq_scale);
	printf("norm eps      %g\n", hp->norm_eps);
	printf("parameters    %" PRIu64 " (%.1fM), %" PRIu64 " weight bytes\n",
	       in->n_params, (double)in->n_params / 1e6, in->weight_bytes);
	printf("tensor types ");
	for (int t = 0; t < 64; t++)
		if (in->n_type[t])
			printf(" %s:%" PRIu64, ggml_type_name(t), in->n_type[t]);
	printf("\n");
	printf("kv per token  %" PRIu64 " bytes (%s)\n", kvb, kv_dtype_name(in->kv));
	if (in->memory)
		printf("kv capacity   %" PRIu64 " tokens in %" PRIu64 " bytes (%.2f x context)\n",
		       in->memory / kvb, in->memory,
		       (double)(in->memory / kvb) / hp->n_ctx_train);
	printf("sha256        %s\n", in->sha);
}

static void inspect_json(const struct inspect *in)
{
	const struct llama_hparams *hp = &in->hp;
	uint64_t kvb = llama_kv_bytes_per_token(hp, in->kv);
	bool first = true;

	printf("{\"file\":");
	kvd_json_str(stdout, in->path, strlen(in->path));
	printf(",\"version\":%u,\"size\":%zu,\"n_kv\":%" PRIu64 ",\"n_tensors\":%" PRIu64
	       ",\"alignment\":%" PRIu64 ",\"name\":",
	       in->f->version, in->f->size, in->f->n_kv, in->f->n_tensors,
	       in->f->alignment);
	kvd_json_str(stdout, in->name.ptr ? in->name.ptr : "", in->name.len);
	printf(",\"architecture\":");
	kvd_json_str(stdout, hp->arch, strlen(hp->arch));
	printf(",\"n_layer\":%u,\"n_embd\":%u,\"n_head\":%u,\"n_head_kv\":%u,"
	       "\"head_dim\":%u,\"n_ff\":%u,\"n_vocab\":%u,\"n_ctx_train\":%u,"
	       "\"rope_dim\":%u,\"rope_freq_base\":%g,\"rope_freq_scale\":%g,"
	       "\"norm_eps\":%g,\"tokenizer\":",
	       hp->n_layer, hp->n_embd, hp->n_head, hp->n_head_kv, hp->head_dim,
	       hp->n_ff, hp->n_vocab, hp->n_ctx_train, hp->rope_dim,
	       hp->rope_freq_base, hp->rope_freq_scale, hp->norm_eps);
	kvd_json_str(stdout, in->tok_model.ptr ? in->tok_model.ptr : "", in->tok_model.len);
	printf(",\"n_params\":%" PRIu64 ",\"weight_bytes\":%" PRIu64 ",\"tensor_types\":{",
	       in->n_params, in->weight_bytes);
	for (int t = 0; t < 64; t++) {
		if (!in->n_type[t])
			continue;
		printf("%s\"%s\":%" PRIu64, first ? "" : ",", ggml_type_name(t),
		       in->n_type[t]);
		first = false;
	}
	printf("},\"kv_dtype\":\"%s\",\"kv_bytes_per_token\":%" PRIu64,
	       kv_dtype_name(in->kv), kvb);
	if (in->memory)
		printf(",\"memory_bytes\":%" PRIu64 ",\"kv_tokens\":%" PRIu64,
		       in->memory, in->memory / kvb);
	printf(",\"sha256\":\"%s\"}\n", in->sha);
}

static int model_inspect(int argc, char **argv)
{
	struct inspect in = { 0 };
	struct gguf_error err;
	const char *kv = "f32";
	bool json = false;
	int rc;

	const struct opt opts[] = {
		{ "--memory", OPT_BYTES, &in.memory, NULL },
		{ "--kv-dtype", OPT_WORD, &kv, kv_words },
		{ "--json", OPT_FLAG, &json, NULL },
	};
	if (opts_parse(argc, argv, 2, opts, KVD_ARRAY_SIZE(opts), &in.path, 1)) {
		model_usage(stderr);
		return EXIT_USAGE;
	}
	in.kv = !strcmp(kv, "f16") ? KV_DTYPE_F16 : KV_DTYPE_F32;
	rc = gguf_open(&in.f, in.path, &err);
	if (!rc)
		rc = gguf_llama_hparams(in.f, &in.hp, &err);
	if (rc) {
		if (rc > 0)
			fprintf(stderr, "kvctl model inspect: %s: %s at offset %" PRIu64 ": %s\n",
				in.path, gguf_strerror(rc), err.offset, err.msg);
		else
			fprintf(stderr, "kvctl model inspect: %s\n", err.msg);
		gguf_close(in.f);
		return EXIT_BAD_FILE;
	}
	for (uint64_t i = 0; i < in.f->n_tensors; i++) {
		const struct gguf_tensor *t = &in.f->tensors[i];
		uint64_t n = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
		if ((unsigned)t->type < KVD_ARRAY_SIZE(in.n_type))
			in.n_type[t->type]++;
		in.n_params += n;
		in.weight_bytes += t->nbytes;
	}
	gguf_get_str(in.f, "general.name", &in.name);
	gguf_get_str(in.f, "tokenizer.ggml.model", &in.tok_model);
	rc = sha256_file(in.path, in.sha);
	if (rc) {
		fprintf(stderr, "kvctl model inspect: %s: %s\n", in.path, strerror(-rc));
		gguf_close(in.f);
		return EXIT_BAD_FILE;
	}
	if (json)
		inspect_json(&in);
	else
		inspect_text(&in);
	gguf_close(in.f);
	return EXIT_OK;
}

int kvctl_cmd_model(int argc, char **argv)
{
	if (argc >= 2 && !strcmp(argv[1], "make"))
		return model_make(argc, argv);
	if (argc >= 2 && !strcmp(argv[1], "inspect"))
		return model_inspect(argc, argv);
	if (argc >= 2 && (!strcmp(argv[1], "tokenize") ||
			  !strcmp(argv[1], "detokenize") || !strcmp(argv[1], "chat")))
		return kvctl_cmd_model_tok(argc, argv);
	if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "help"))) {
		model_usage(stdout);
		return EXIT_OK;
	}
	model_usage(stderr);
	return EXIT_USAGE;
}
