/* main.c - kvd: parse arguments, build one daemon, run it.
 *
 *   kvd --config FILE                 run the node
 *   kvd --check-config --config FILE  validate, print the resolved config
 *                                     and the capacity verdict; exit 0/78
 *   kvd --config-reference            every key, documented
 *   kvd --config-example              an example INI (conf/kvd.example.ini)
 *   kvd generate ...                  offline generation (daemon/generate.c)
 *   kvd serve -m FILE [--host H] [--port P] [--threads N] [--ctx N]
 *       [--api-key-file F]            a standalone node without an INI
 *                                     (daemon/serve_cli.c)
 *
 * Exit codes: 0 ok, 64 usage, 78 configuration (EX_CONFIG: bad config, an
 * unusable model, or a pool that cannot hold the context with
 * capacity_policy=refuse), 65 the model's bytes are not what its cached
 * fingerprint named (daemon/node/fpcheck.c), 1 any other failure.
 */
#include "conf/config.h"
#include "ctl/admin.h"
#include "daemon/generate.h"
#include "daemon/node/daemon.h"
#include "daemon/serve.h"
#include "daemon/serve_cli.h"
#include "kvd_build.h"

#include <getopt.h>
#include <stdio.h>
#include <string.h>

#define EX_USAGE_ KVD_EX_USAGE

static void usage(FILE *out)
{
	fprintf(out,
		"usage: kvd --config FILE\n"
		"       kvd --check-config --config FILE\n"
		"       kvd --config-reference | --config-example | --version\n"
		"       kvd generate --model FILE --prompt TEXT [options]  (kvd generate --help)\n"
		"       kvd serve -m FILE [--host H] [--port P] [--threads N] [--ctx N]\n"
		"                 [--api-key-file F]  (a standalone node, no INI)\n");
}

static int check_config(const struct kvd_config *cfg)
{
	struct gguf_file *f = NULL;
	struct gguf_error gerr = { 0 };
	struct llama_hparams hp;
	struct kvd_capacity cap;
	uint32_t pages;
	int r;

	kvd_config_print(stdout, cfg);
	r = gguf_open(&f, cfg->model_path, &gerr);
	if (r == 0)
		r = gguf_llama_hparams(f, &hp, &gerr);
	if (f)
		gguf_close(f);
	if (r) {
		fprintf(stderr, "%s: model.path: %s: %s (at byte %llu)\n",
			cfg->path, cfg->model_path, gerr.msg,
			(unsigned long long)gerr.offset);
		return KVD_EX_CONFIG;
	}
	if (kvd_capacity_pages(cfg, &hp, &pages) < 0) {
		fprintf(stderr, "%s: kv: pool size out of range\n", cfg->path);
		return KVD_EX_CONFIG;
	}
	kvd_capacity_compute(cfg, &hp, pages, &cap);
	printf("\n; capacity: pool_tokens=%llu pages=%u context_length=%u margin=%g"
	       " required_tokens=%llu verdict=%s policy=%s advertised_context=%u\n",
	       (unsigned long long)cap.pool_tokens, cap.pages,
	       cap.context_length, cap.margin,
	       (unsigned long long)cap.required_tokens,
	       cap.ok ? "ok" : "insufficient",
	       kvd_cap_policy_name(cfg->capacity_policy),
	       cap.advertised_context);
	if (!cap.ok && (cfg->capacity_policy == KVD_CAP_REFUSE ||
			cap.advertised_context == 0)) {
		fprintf(stderr, "%s: kv: pool holds %llu tokens, context %u x margin %g needs %llu\n",
			cfg->path, (unsigned long long)cap.pool_tokens,
			cap.context_length, cap.margin,
			(unsigned long long)cap.required_tokens);
		return KVD_EX_CONFIG;
	}
	return 0;
}

static int run_node(const struct kvd_config *cfg)
{
	struct kvd_daemon d;
	int r, code;

	r = kvd_daemon_init(&d, cfg);
	if (r == 0)
		r = admin_server_attach(&d);
	if (r == 0)
		r = serve_start(&d);
	if (r == 0) {
		kvd_daemon_ready(&d);
		r = kvd_daemon_run(&d);
	}
	if (r == KVD_E_CAPACITY || r == KVD_E_MODEL)
		code = KVD_EX_CONFIG;
	else
		code = r ? 1 : d.exit_code;
	if (r && r != KVD_E_CAPACITY && r != KVD_E_MODEL)
		KVLOG_ERR(&d.log, "fatal", "code=%d msg=%s", r,
			  KVLOG_Q(r < 0 ? strerror(-r) : "see previous lines"));
	kvd_daemon_deinit(&d);
	return code;
}

int main(int argc, char **argv)
{
	enum { OPT_CHECK = 256, OPT_REF, OPT_EXAMPLE, OPT_VERSION };
	static const struct option opts[] = {
		{ "config", required_argument, NULL, 'c' },
		{ "check-config", no_argument, NULL, OPT_CHECK },
		{ "config-reference", no_argument, NULL, OPT_REF },
		{ "config-example", no_argument, NULL, OPT_EXAMPLE },
		{ "version", no_argument, NULL, OPT_VERSION },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct kvd_config cfg;
	struct kvd_config_error err;
	const char *path = NULL;
	int check = 0, c, r;

	if (argc > 1 && strcmp(argv[1], "generate") == 0)
		return kvd_cmd_generate(argc - 1, argv + 1);
	if (argc > 1 && strcmp(argv[1], "serve") == 0) {
		r = kvd_serve_config(argc - 1, argv + 1, &cfg);
		return r ? (r < 0 ? 0 : r) : run_node(&cfg);
	}
	while ((c = getopt_long(argc, argv, "c:h", opts, NULL)) != -1) {
		switch (c) {
		case 'c':
			path = optarg;
			break;
		case OPT_CHECK:
			check = 1;
			break;
		case OPT_REF:
			kvd_config_reference(stdout);
			return 0;
		case OPT_EXAMPLE:
			kvd_config_example(stdout);
			return 0;
		case OPT_VERSION:
			printf("kvd %s (cuda %s, verbs %s, systemd %s)\n",
			       KVD_VERSION, KVD_HAVE_CUDA ? "yes" : "no",
			       KVD_HAVE_VERBS ? "yes" : "no",
			       KVD_HAVE_SYSTEMD ? "yes" : "no");
			return 0;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return EX_USAGE_;
		}
	}
	if (!path || optind != argc) {
		usage(stderr);
		return EX_USAGE_;
	}
	r = kvd_config_load(&cfg, path, &err);
	/* what the start needs of the machine: --check-config says it too */
	if (r == 0)
		r = kvd_config_check_host(&cfg, &err);
	if (r) {
		kvd_config_error_print(stderr, &err);
		return KVD_EX_CONFIG;
	}
	if (check)
		return check_config(&cfg);
	return run_node(&cfg);
}
