/* serve_cli.c - `kvd serve -m FILE ...`: a standalone node without an INI.
 *
 * The flags become config pairs ("section.key" = value) that go through
 * the key table, its setters and every check an INI file's lines go
 * through (kvd_config_load_pairs), so nothing a file could not set, and
 * nothing a file's checks would refuse, reaches the node. What only the
 * flags decide, on top of the defaults:
 *   - role standalone, HTTP on --host (127.0.0.1) : --port (8080);
 *   - the context: --ctx, else the model's trained context capped at
 *     SERVE_CLI_CTX_DEFAULT (llama-server's -c 4096), and a KV pool of
 *     exactly that many tokens (one full context, shared by the requests
 *     in flight, as llama-server's -c is);
 *   - the admin socket: the config's default ($RUNTIME_DIRECTORY, else
 *     /run/kvd) when this user may write there, else
 *     $XDG_RUNTIME_DIR/kvd/ (made 0700), else the working directory, else
 *     none - so a first start as an ordinary user works.
 */
#include "daemon/serve_cli.h"
#include "conf/util.h"
#include "gpu/gguf/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SERVE_CLI_CTX_DEFAULT 4096u

struct serve_cli {
	const char *model, *host, *port, *threads, *ctx, *keys;
	char listen[300];
	char ctx_buf[16];
	char admin[108];           /* sun_path's bound */
};

static void serve_cli_usage(FILE *out)
{
	fprintf(out,
		"usage: kvd serve -m FILE [--host H (127.0.0.1)] [--port P (8080)]\n"
		"                 [--threads N] [--ctx N] [--api-key-file F]\n"
		"A standalone node from these flags and the config defaults (no INI):\n"
		"OpenAI API on http://H:P, a KV pool of one --ctx (default: the\n"
		"model's context, at most %u tokens). Exit 64 usage, 78 config.\n",
		SERVE_CLI_CTX_DEFAULT);
}

static bool serve_cli_dir_ok(const char *dir)
{
	struct stat st;

	return stat(dir, &st) == 0 && S_ISDIR(st.st_mode) &&
	       faccessat(AT_FDCWD, dir, W_OK | X_OK, AT_EACCESS) == 0;
}

/* The admin socket (the file's comment); "" keeps the config's default. */
static void serve_cli_admin(struct serve_cli *sc)
{
	const char *rt = getenv("RUNTIME_DIRECTORY");
	const char *xdg = getenv("XDG_RUNTIME_DIR");
	char dir[96], cwd[96];

	sc->admin[0] = '\0';
	if (rt && *rt && !strchr(rt, ':') ? serve_cli_dir_ok(rt)
					   : serve_cli_dir_ok("/run/kvd"))
		return;
	if (xdg && xdg[0] == '/' &&
	    snprintf(dir, sizeof(dir), "%s/kvd", xdg) < (int)sizeof(dir) &&
	    (mkdir(dir, 0700) == 0 || errno == EEXIST) && serve_cli_dir_ok(dir)) {
		snprintf(sc->admin, sizeof(sc->admin), "%s/kvd0.sock", dir);
		return;
	}
	if (getcwd(cwd, sizeof(cwd)) && serve_cli_dir_ok(cwd)) {
		snprintf(sc->admin, sizeof(sc->admin), "%s/kvd0.sock", cwd);
		return;
	}
	snprintf(sc->admin, sizeof(sc->admin), "none");
}

/* --ctx, else the model's trained context capped: 0, or 78 (named). */
static int serve_cli_ctx(struct serve_cli *sc)
{
	struct gguf_file *f = NULL;
	struct gguf_error gerr = { 0 };
	struct llama_hparams hp;
	int r;

	if (sc->ctx)
		return 0;
	r = gguf_open(&f, sc->model, &gerr);
	if (r == 0)
		r = gguf_llama_hparams(f, &hp, &gerr);
	if (f)
		gguf_close(f);
	if (r) {
		fprintf(stderr, "kvd serve: -m %s: %s\n", sc->model,
			gguf_error_msg(r, &gerr));
		return KVD_EX_CONFIG;
	}
	snprintf(sc->ctx_buf, sizeof(sc->ctx_buf), "%u",
		 hp.n_ctx_train && hp.n_ctx_train < SERVE_CLI_CTX_DEFAULT ?
		 hp.n_ctx_train : SERVE_CLI_CTX_DEFAULT);
	sc->ctx = sc->ctx_buf;
	return 0;
}

/* argv into sc: 0, 64 (usage) or -1 (--help printed). */
static int serve_cli_args(struct serve_cli *sc, int argc, char **argv)
{
	static const struct option opts[] = {
		{ "model", required_argument, NULL, 'm' },
		{ "host", required_argument, NULL, 'H' },
		{ "port", required_argument, NULL, 'p' },
		{ "threads", required_argument, NULL, 't' },
		{ "ctx", required_argument, NULL, 'c' },
		{ "api-key-file", required_argument, NULL, 'k' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	int c;

	optind = 0;
	while ((c = getopt_long(argc, argv, "m:h", opts, NULL)) != -1) {
		switch (c) {
		case 'm': sc->model = optarg; break;
		case 'H': sc->host = optarg; break;
		case 'p': sc->port = optarg; break;
		case 't': sc->threads = optarg; break;
		case 'c': sc->ctx = optarg; break;
		case 'k': sc->keys = optarg; break;
		case 'h':
			serve_cli_usage(stdout);
			return -1;
		default:
			serve_cli_usage(stderr);
			return KVD_EX_USAGE;
		}
	}
	if (!sc->model || optind != argc) {
		serve_cli_usage(stderr);
		return KVD_EX_USAGE;
	}
	/* an IPv6 host goes in brackets, as listen.http writes it */
	snprintf(sc->listen, sizeof(sc->listen),
		 strchr(sc->host, ':') ? "[%s]:%s" : "%s:%s", sc->host, sc->port);
	return 0;
}

int kvd_serve_config(int argc, char **argv, struct kvd_config *cfg)
{
	struct serve_cli sc = { .host = "127.0.0.1", .port = "8080" };
	struct kvd_config_pair p[8];
	struct kvd_config_error err;
	size_t n = 0;
	int r = serve_cli_args(&sc, argc, argv);

	if (!r)
		r = serve_cli_ctx(&sc);
	if (r)
		return r;
	serve_cli_admin(&sc);
	p[n++] = (struct kvd_config_pair){ "node.role", "standalone" };
	p[n++] = (struct kvd_config_pair){ "model.path", sc.model };
	p[n++] = (struct kvd_config_pair){ "listen.http", sc.listen };
	p[n++] = (struct kvd_config_pair){ "model.context_length", sc.ctx };
	p[n++] = (struct kvd_config_pair){ "kv.pool_tokens", sc.ctx };
	if (sc.threads)
		p[n++] = (struct kvd_config_pair){ "engine.threads", sc.threads };
	if (sc.keys)
		p[n++] = (struct kvd_config_pair){ "http.api_keys_file", sc.keys };
	if (sc.admin[0])
		p[n++] = (struct kvd_config_pair){ "admin.socket", sc.admin };
	if (kvd_config_load_pairs(cfg, "kvd serve", p, n, &err) == 0 &&
	    kvd_config_check_host(cfg, &err) == 0)
		return 0;
	kvd_config_error_print(stderr, &err);
	return KVD_EX_CONFIG;
}
