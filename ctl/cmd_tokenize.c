/* cmd_tokenize.c - `kvctl model tokenize` and `kvctl model detokenize`.
 *
 * Both open the GGUF and build only its tokenizer, so vocabulary-only
 * files (no tensors) work. tokenize reads the text from the command line
 * or, with --file, byte for byte from a file (no newline stripped; a
 * file that cannot be read to its end is an error naming it, exit 1);
 * --special lets control tokens written in the text ("<|im_start|>")
 * become those tokens, which chat templates need and tenant prompts must
 * not get. Output: ids separated by spaces, or with --json
 * {"ids":[...],"pieces":[...]} where each piece is the token's decoded
 * bytes (JSON-escaped; a piece that is part of a UTF-8 character comes
 * out as \u00XX per byte).
 */
#include "ctl/cmd_model.h"

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conf/util.h"
#include "gpu/text/chat.h"
#include "gpu/gguf/gguf.h"
#include "gpu/text/tokenizer.h"
#include "net/wire/openai.h"

#define EXIT_OK 0
#define EXIT_BAD_FILE 1
#define EXIT_USAGE 2

static const char usage[] =
	"usage: kvctl model tokenize MODEL.gguf [--no-bos] [--special] [--json]\n"
	"                            (TEXT | --file PATH)\n"
	"       kvctl model detokenize MODEL.gguf IDS...\n"
	"       kvctl model chat MODEL.gguf [--format NAME|auto] [--no-gen] [--ids] [--tools FILE] ROLE=CONTENT...\n";

struct tok_open {
	struct gguf_file *f;
	struct tokenizer *t;
};

static int tok_open(struct tok_open *o, const char *cmd, const char *path)
{
	struct gguf_error err;
	int rc;

	*o = (struct tok_open){ 0 };
	rc = gguf_open(&o->f, path, &err);
	if (!rc)
		rc = tokenizer_new(&o->t, o->f, &err);
	if (rc) {
		fprintf(stderr, "kvctl model %s: %s: %s\n", cmd, path, err.msg);
		gguf_close(o->f);
		return -1;
	}
	return 0;
}

static void tok_close(struct tok_open *o)
{
	tokenizer_free(o->t);
	gguf_close(o->f);
}

/* The whole file at path into *buf (malloc'd, never shorter than *len,
 * which may be 0). 0, or a negative errno when the file cannot be opened
 * or read to its end: then nothing is handed on, not even the bytes read
 * before the failure. */
static int read_file(const char *path, char **buf, size_t *len)
{
	FILE *fp = fopen(path, "rb");
	char *b = NULL;
	size_t cap = 0, n = 0, r;
	int rc = 0;

	if (!fp)
		return -errno;
	do {
		if (n == cap) {
			char *nb;

			cap = cap ? 2 * cap : 65536;
			nb = realloc(b, cap);
			if (!nb) {
				rc = -ENOMEM;
				break;
			}
			b = nb;
		}
		errno = 0;
		r = fread(b + n, 1, cap - n, fp);
		n += r;
	} while (r && !ferror(fp));
	if (!rc && ferror(fp))
		rc = errno ? -errno : -EIO;
	fclose(fp);
	if (rc) {
		free(b);
		return rc;
	}
	*buf = b;
	*len = n;
	return 0;
}

/* tokenize's command line */
struct tok_args {
	const char *path, *text, *file;
	bool no_bos, special, json;
};

/* argv[2..] into a: the model, then the text (or --file PATH; "--" before
 * a text that starts with '-'). 0, or -1 for a usage error (not printed). */
static int tokenize_args(int argc, char **argv, struct tok_args *a)
{
	*a = (struct tok_args){ 0 };
	for (int i = 2; i < argc; i++) {
		const char *s = argv[i];
		if (!strcmp(s, "--no-bos"))
			a->no_bos = true;
		else if (!strcmp(s, "--special"))
			a->special = true;
		else if (!strcmp(s, "--json"))
			a->json = true;
		else if (!strcmp(s, "--file") && i + 1 < argc)
			a->file = argv[++i];
		else if (!strcmp(s, "--") && i + 1 < argc && !a->text && a->path)
			a->text = argv[++i];
		else if (s[0] == '-' && s[1] && strcmp(s, "-"))
			return -1;
		else if (!a->path)
			a->path = s;
		else if (!a->text)
			a->text = s;
		else
			return -1;
	}
	if (!a->path || !!a->text == !!a->file)
		return -1;
	return 0;
}

/* The ids on stdout: separated by spaces, or with json
 * {"ids":[...],"pieces":[...]} (each piece's bytes from t). */
static void tokenize_print(const struct tokenizer *t, const int32_t *ids,
			   size_t n_ids, bool json)
{
	if (json) {
		fputs("{\"ids\":[", stdout);
		for (size_t i = 0; i < n_ids; i++)
			printf("%s%" PRId32, i ? "," : "", ids[i]);
		fputs("],\"pieces\":[", stdout);
		for (size_t i = 0; i < n_ids; i++) {
			const char *p;
			size_t pl;
			tokenizer_piece(t, ids[i], &p, &pl);
			if (i)
				putchar(',');
			kvd_json_str(stdout, p, pl);
		}
		fputs("]}\n", stdout);
	} else {
		for (size_t i = 0; i < n_ids; i++)
			printf("%s%" PRId32, i ? " " : "", ids[i]);
		putchar('\n');
	}
}

static int model_tokenize(int argc, char **argv)
{
	struct tok_args a;
	const char *text;
	struct tok_open o;
	int32_t *ids = NULL;
	size_t n_ids = 0, len = 0;
	char *buf = NULL;
	unsigned flags;
	int rc;

	if (tokenize_args(argc, argv, &a)) {
		fputs(usage, stderr);
		return EXIT_USAGE;
	}
	if (tok_open(&o, "tokenize", a.path))
		return EXIT_BAD_FILE;
	if (a.file) {
		rc = read_file(a.file, &buf, &len);
		if (rc) {
			fprintf(stderr, "kvctl model tokenize: %s: %s\n", a.file,
				strerror(-rc));
			tok_close(&o);
			return EXIT_BAD_FILE;
		}
		text = buf;
	} else {
		text = a.text;
		len = strlen(text);
	}
	flags = (a.no_bos || !tokenizer_add_bos(o.t) ? 0 : TOKENIZER_ADD_BOS) |
		(a.special ? TOKENIZER_PARSE_SPECIAL : 0);
	rc = tokenizer_encode_ex(o.t, text, len, flags, &ids, &n_ids);
	if (rc) {
		fprintf(stderr, "kvctl model tokenize: %s\n", strerror(-rc));
		free(buf);
		tok_close(&o);
		return EXIT_BAD_FILE;
	}
	tokenize_print(o.t, ids, n_ids, a.json);
	free(ids);
	free(buf);
	tok_close(&o);
	return EXIT_OK;
}

static int model_detokenize(int argc, char **argv)
{
	struct tok_open o;
	int32_t *ids;
	size_t n = 0, len;
	char *text;
	int rc;

	if (argc < 3 || argv[2][0] == '-') {
		fputs(usage, stderr);
		return EXIT_USAGE;
	}
	ids = calloc((size_t)argc, sizeof(*ids));
	if (!ids)
		return EXIT_BAD_FILE;
	for (int i = 3; i < argc; i++) {
		char *end;
		errno = 0;
		long v = strtol(argv[i], &end, 10);
		if (errno || *end || end == argv[i] || v < 0 || v > INT32_MAX) {
			fprintf(stderr, "kvctl model detokenize: bad id '%s'\n", argv[i]);
			free(ids);
			return EXIT_USAGE;
		}
		ids[n++] = (int32_t)v;
	}
	if (tok_open(&o, "detokenize", argv[2])) {
		free(ids);
		return EXIT_BAD_FILE;
	}
	rc = tokenizer_decode(o.t, ids, n, &text, &len);
	if (rc) {
		fprintf(stderr, "kvctl model detokenize: %s\n",
			rc == -ERANGE ? "an id is outside the vocabulary" : strerror(-rc));
		free(ids);
		tok_close(&o);
		return EXIT_BAD_FILE;
	}
	fwrite(text, 1, len, stdout);
	putchar('\n');
	free(text);
	free(ids);
	tok_close(&o);
	return EXIT_OK;
}

/* The chat format: --format NAME, or the file's template recognized. */
static int chat_pick(const struct tok_open *o, const char *name,
		     enum chat_format *f)
{
	struct gguf_str src;
	char *copy;
	int rc;

	if (name && strcmp(name, "auto")) {
		if (chat_format_by_name(name, f) == 0 && *f != CHAT_NONE)
			return 0;
		fprintf(stderr, "kvctl model chat: unknown format '%s' (llama2, llama3, chatml, mistral, gemma, phi3, deepseek, mistral_v3, auto)\n",
			name);
		return EXIT_USAGE;
	}
	if (gguf_get_str(o->f, "tokenizer.chat_template", &src)) {
		fprintf(stderr, "kvctl model chat: the file has no tokenizer.chat_template (use --format)\n");
		return EXIT_BAD_FILE;
	}
	copy = malloc(src.len + 1);
	if (!copy)
		return EXIT_BAD_FILE;
	memcpy(copy, src.ptr, src.len);
	copy[src.len] = '\0';
	rc = chat_format_detect(copy, f);
	free(copy);
	if (rc) {
		fprintf(stderr, "kvctl model chat: the file's chat template (%llu bytes) is not one kvd knows (use --format)\n",
			(unsigned long long)src.len);
		return EXIT_BAD_FILE;
	}
	return 0;
}

/* --tools FILE: a JSON array of OpenAI tools, read as a chat request's
 * (net/wire/openai.h) so that they render as the HTTP front renders
 * them. 0; EXIT_BAD_FILE after a message. */
static int chat_tools_load(const char *path, struct openai_req *q,
			   struct chat_tool **tools)
{
	static const char head[] = "{\"messages\":[{\"role\":\"user\",\"content\":\"-\"}],\"tools\":";
	struct kvd_buf b = KVD_BUF_NULL;
	struct openai_error e;
	char chunk[4096];
	size_t n;
	FILE *f = fopen(path, "rb");
	int rc = EXIT_BAD_FILE;

	memset(q, 0, sizeof(*q));
	if (!f) {
		fprintf(stderr, "kvctl model chat: %s: %s\n", path, strerror(errno));
		return EXIT_BAD_FILE;
	}
	if (kvd_buf_add(&b, head, sizeof(head) - 1))
		goto out;
	while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0)
		if (b.len > 2 * OPENAI_TOOLS_BYTES || kvd_buf_add(&b, chunk, n))
			goto out;
	if (kvd_buf_add(&b, "}", 1))
		goto out;
	if (openai_req_parse(q, true, b.p, b.len, &e)) {
		fprintf(stderr, "kvctl model chat: %s: %s\n", path, e.msg);
		goto out;
	}
	*tools = calloc(q->n_tools ? q->n_tools : 1, sizeof(**tools));
	for (size_t i = 0; *tools && i < q->n_tools; i++)
		(*tools)[i] = (struct chat_tool){ q->tools[i].json, q->tools[i].json_indent,
						  q->tools[i].function_json };
	rc = *tools ? EXIT_OK : EXIT_BAD_FILE;
out:
	fclose(f);
	kvd_buf_deinit(&b);
	return rc;
}

/* The prompt of msgs (and tt's tools), as text or ids, on stdout. */
static int chat_print(enum chat_format f, const struct tokenizer *t,
		      const struct chat_msg *msgs, size_t n,
		      const struct chat_tools *tt, bool gen, bool want_ids)
{
	char err[256];

	if (!want_ids) {
		char *text;
		size_t len;

		if (chat_render_tools(f, msgs, n, tt, gen, &text, &len, err, sizeof(err))) {
			fprintf(stderr, "kvctl model chat: %s\n", err);
			return EXIT_BAD_FILE;
		}
		fwrite(text, 1, len, stdout);
		putchar('\n');
		free(text);
	} else {
		int32_t *ids;
		size_t n_ids;

		if (chat_encode_tools(f, t, msgs, n, tt, gen, &ids, &n_ids, err, sizeof(err))) {
			fprintf(stderr, "kvctl model chat: %s\n", err);
			return EXIT_BAD_FILE;
		}
		for (size_t i = 0; i < n_ids; i++)
			printf("%s%" PRId32, i ? " " : "", ids[i]);
		putchar('\n');
		free(ids);
	}
	return EXIT_OK;
}

/* kvctl model chat MODEL.gguf [--format NAME|auto] [--no-gen] [--ids]
 * [--tools FILE] ROLE=CONTENT...: the prompt a chat request would get,
 * as text or ids (with FILE's tools offered). */
static int model_chat(int argc, char **argv)
{
	const char *path = NULL, *fmt = NULL, *tools_path = NULL;
	bool gen = true, want_ids = false;
	struct chat_msg *msgs = calloc((size_t)argc, sizeof(*msgs));
	struct chat_tool *tools = NULL;
	struct openai_req q = { 0 };
	size_t n = 0;
	enum chat_format f;
	struct tok_open o;
	int rc;

	if (!msgs)
		return EXIT_BAD_FILE;
	for (int i = 2; i < argc; i++) {
		char *eq = strchr(argv[i], '=');

		if (!strcmp(argv[i], "--format") && i + 1 < argc) {
			fmt = argv[++i];
		} else if (!strcmp(argv[i], "--tools") && i + 1 < argc) {
			tools_path = argv[++i];
		} else if (!strcmp(argv[i], "--no-gen")) {
			gen = false;
		} else if (!strcmp(argv[i], "--ids")) {
			want_ids = true;
		} else if (!path && argv[i][0] != '-') {
			path = argv[i];
		} else if (eq && argv[i][0] != '-') {
			*eq = '\0';
			msgs[n++] = (struct chat_msg){ argv[i], eq + 1 };
		} else {
			path = NULL;
			break;
		}
	}
	if (!path || n == 0) {
		fprintf(stderr, "usage: kvctl model chat MODEL.gguf [--format NAME|auto] [--no-gen] [--ids] [--tools FILE] ROLE=CONTENT...\n");
		free(msgs);
		return EXIT_USAGE;
	}
	if (tok_open(&o, "chat", path)) {
		free(msgs);
		return EXIT_BAD_FILE;
	}
	rc = chat_pick(&o, fmt, &f);
	if (rc == 0 && tools_path)
		rc = chat_tools_load(tools_path, &q, &tools);
	if (rc == 0)
		rc = chat_print(f, o.t, msgs, n,
				&(struct chat_tools){ tools, q.n_tools, NULL, NULL, NULL },
				gen, want_ids);
	tok_close(&o);
	free(tools);
	openai_req_deinit(&q);
	free(msgs);
	return rc;
}

int kvctl_cmd_model_tok(int argc, char **argv)
{
	if (!strcmp(argv[1], "chat"))
		return model_chat(argc, argv);
	if (!strcmp(argv[1], "tokenize"))
		return model_tokenize(argc, argv);
	return model_detokenize(argc, argv);
}
