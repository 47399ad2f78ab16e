/* kvctl.c - the admin command.
 *
 *   kvctl [--socket PATH | --node NAME] [--json] [--timeout SEC] COMMAND ...
 *   kvctl --version | --help
 *     status                           node, state, pool, capacity, counters
 *     drain [--no-wait] [--wait-ms N]  stop admitting; wait until drained
 *     resume                           admit again
 *     pool resize --tokens N | --bytes SIZE [--force] [--wait-ms N]
 *     capacity                         the boot capacity check, now
 *     metrics                          Prometheus text (daemon/node/metrics.h)
 *     abort ID                         abort one request (normal failure path),
 *                                      running or waiting; ID: the registry's
 *                                      number or the client's cmpl-... /
 *                                      chatcmpl-... id
 *     queue                            requests waiting at the tenant gate
 *     cache status | flush [--tenant T] the prefix cache: pages, hit rates;
 *                                      drop a tenant's (or every) entry
 *     audit [FILE...]                  capacity audit of kvd logs (stdin: -)
 *     model make|inspect ...           GGUF models (ctl/cmd_model.c)
 *     generate --server ADDR ...       client API client (ctl/cmd_generate.c)
 *     fault load --count N --tokens N --hold-ms N [--fence-ms N]
 *                                      synthetic requests (test builds)
 *
 * Exit codes: 0 ok; 1 a check failed (capacity insufficient, an audit
 * finding) or the daemon answered with an error; 2 usage; 3 audit: no
 * finding, but some node could not be judged (request lines, no
 * kv_capacity line); 69 the daemon is unavailable (no socket, connection
 * refused or dropped).
 *
 * Design: one table of subcommands; each builds one request map, sends it
 * as a frame (net/wire/frame.h) over a blocking Unix socket, reads one reply
 * frame and prints it as a table, or as JSON with --json. All protocol
 * knowledge beyond the frame is the command names and argument keys in
 * ctl/README.md.
 */
#include "conf/util.h"
#include "ctl/admin.h"
#include "ctl/audit.h"
#include "ctl/cmd_model.h"
#include "ctl/cmd_generate.h"
#include "net/wire/frame.h"
#include "net/peer_auth.h"
#include "kvd_build.h"

#include <dirent.h>
#include <fcntl.h>
#include <sodium.h>
#include <sys/stat.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define EXIT_CHECK 1
#define EXIT_USAGE 2
#define EXIT_UNJUDGED 3   /* audit: no finding, but a node not judged */
#define EXIT_UNAVAILABLE 69
#define KVCTL_RUNDIR "/run/kvd"

struct kvctl {
	const char *socket;    /* resolved socket path */
	char sockbuf[256];
	bool json;
	int timeout_ms;        /* reply timeout; -1 = wait forever */
	int fd;
	struct frame_decoder dec;  /* replies; *result points into it */
};

struct kvctl_cmd {
	const char *name;
	int (*fn)(struct kvctl *k, int argc, char **argv);
	bool daemon;           /* talks to the socket */
	bool options_after;    /* kvctl's options may follow its name */
	const char *help;
};

static void print_json_line(const msgpack_object *o);

/* ---- talking to the daemon ------------------------------------------------- */

/* The *.sock files in dir: how many; the last one's path in k->sockbuf. */
static int kvctl_scan_dir(struct kvctl *k, const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int n = 0;

	if (!d)
		return 0;
	while ((e = readdir(d))) {
		size_t len = strlen(e->d_name);

		if (len > 5 && !strcmp(e->d_name + len - 5, ".sock")) {
			n++;
			snprintf(k->sockbuf, sizeof(k->sockbuf), "%.127s/%.127s", dir,
				 e->d_name);
		}
	}
	closedir(d);
	return n;
}

/* --socket, $KVCTL_SOCKET, else the only socket under /run/kvd, else
 * under $XDG_RUNTIME_DIR/kvd (where `kvd serve` puts it for a user who
 * cannot write /run/kvd). */
static int kvctl_find_socket(struct kvctl *k)
{
	const char *env = getenv("KVCTL_SOCKET");
	const char *xdg = getenv("XDG_RUNTIME_DIR");
	char dirs[2][200] = { KVCTL_RUNDIR, "" };
	int n = 0, i;

	if (k->socket)
		return 0;
	if (env && *env) {
		k->socket = env;
		return 0;
	}
	if (xdg && xdg[0] == '/')
		snprintf(dirs[1], sizeof(dirs[1]), "%.190s/kvd", xdg);
	for (i = 0; i < 2 && !n; i++)
		if (dirs[i][0])
			n = kvctl_scan_dir(k, dirs[i]);
	if (n == 1) {
		k->socket = k->sockbuf;
		return 0;
	}
	fprintf(stderr, n ? "kvctl: several nodes under %s: use --node NAME or --socket PATH\n"
			  : "kvctl: no kvd socket under %s%s%s: is kvd running? (--socket PATH)\n",
		dirs[n ? i - 1 : 0], !n && dirs[1][0] ? " or " : "", n ? "" : dirs[1]);
	return n ? EXIT_USAGE : EXIT_UNAVAILABLE;
}

static int kvctl_connect(struct kvctl *k)
{
	int r = kvctl_find_socket(k);

	if (r)
		return r;
	k->fd = kvd_unix_connect(k->socket);
	if (k->fd == -ENAMETOOLONG) {
		fprintf(stderr, "kvctl: socket path too long: %s\n", k->socket);
		return EXIT_USAGE;
	}
	if (k->fd < 0) {
		fprintf(stderr, "kvctl: %s: %s\n", k->socket, strerror(-k->fd));
		return EXIT_UNAVAILABLE;
	}
	return 0;
}

static int kvctl_write_all(int fd, const char *p, size_t n)
{
	while (n > 0) {
		ssize_t w = send(fd, p, n, MSG_NOSIGNAL);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

/* Read one reply frame into k->dec; *out valid until the next call. */
static int kvctl_read_reply(struct kvctl *k, const msgpack_object **out)
{
	char buf[4096];

	for (;;) {
		struct pollfd pfd = { .fd = k->fd, .events = POLLIN };
		ssize_t n;
		size_t used, off = 0;
		int r = frame_decoder_next(&k->dec, out);

		if (r == 0)
			return 0;
		if (r != FRAME_E_AGAIN) {
			fprintf(stderr, "kvctl: bad reply from daemon: %s\n",
				frame_strerror(r));
			return EXIT_UNAVAILABLE;
		}
		r = poll(&pfd, 1, k->timeout_ms);
		if (r == 0) {
			fprintf(stderr, "kvctl: no reply within %d ms\n",
				k->timeout_ms);
			return EXIT_UNAVAILABLE;
		}
		if (r < 0 && errno == EINTR)
			continue;
		n = r < 0 ? -1 : recv(k->fd, buf, sizeof(buf), 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			fprintf(stderr, "kvctl: daemon closed the connection\n");
			return EXIT_UNAVAILABLE;
		}
		while (off < (size_t)n) {
			if (frame_decoder_feed(&k->dec, buf + off, (size_t)n - off,
					       &used) < 0)
				return EXIT_UNAVAILABLE;
			off += used;
			if (off < (size_t)n) {
				/* buffer full without a frame: cannot happen
				 * with a sane daemon */
				fprintf(stderr, "kvctl: reply too large\n");
				return EXIT_UNAVAILABLE;
			}
		}
	}
}

/* Send the request packed in w (one map) and wait for the reply's
 * result. Prints error replies; returns 0 with *result set, or an exit
 * code. */
static int kvctl_call(struct kvctl *k, struct frame_writer *w,
		      const msgpack_object **result)
{
	const msgpack_object *reply, *ok;
	char *data;
	size_t len;
	bool okv = false;
	int r, werr;

	r = frame_writer_finish(w, ADMIN_FRAME_MAX, &data, &len);
	frame_writer_deinit(w);
	if (r) {
		fprintf(stderr, "kvctl: request too large\n");
		return EXIT_USAGE;
	}
	r = kvctl_connect(k);
	if (r) {
		free(data);
		return r;
	}
	/* A write error (the daemon refused us and hung up) still leaves
	 * its error frame to read: try, and report the write error only if
	 * there is none. */
	werr = kvctl_write_all(k->fd, data, len) < 0 ? errno : 0;
	free(data);
	r = kvctl_read_reply(k, &reply);
	if (r && werr)
		fprintf(stderr, "kvctl: %s: %s\n", k->socket, strerror(werr));
	if (r)
		return r;
	ok = frame_map_get(reply, "ok");
	if (!ok || frame_obj_bool(ok, &okv)) {
		fprintf(stderr, "kvctl: reply without 'ok'\n");
		return EXIT_UNAVAILABLE;
	}
	if (!okv) {
		char e[64] = "?", m[256] = "", key[64] = "";
		const msgpack_object *o;

		if ((o = frame_map_get(reply, "error")))
			frame_obj_str(o, e, sizeof(e));
		if ((o = frame_map_get(reply, "message")))
			frame_obj_str(o, m, sizeof(m));
		if ((o = frame_map_get(reply, "key")))
			frame_obj_str(o, key, sizeof(key));
		fprintf(stderr, "kvctl: %s%s%s: %s\n", e, key[0] ? " " : "", key, m);
		if (k->json)
			print_json_line(reply);    /* machines get the error too */
		*result = reply;
		return EXIT_CHECK;
	}
	*result = frame_map_get(reply, "result");
	if (!*result || (*result)->type != MSGPACK_OBJECT_MAP) {
		fprintf(stderr, "kvctl: reply without a result map\n");
		return EXIT_UNAVAILABLE;
	}
	return 0;
}

/* Start a request map of n_args arguments for cmd. */
static msgpack_packer *kvctl_request(struct frame_writer *w, const char *cmd,
				     uint32_t n_args)
{
	msgpack_packer *pk;

	frame_writer_init(w);
	pk = frame_writer_packer(w);
	msgpack_pack_map(pk, 1 + n_args);
	frame_pack_kv_str(pk, "cmd", cmd);
	return pk;
}

/* ---- output ----------------------------------------------------------------- */

static void json_print(FILE *out, const msgpack_object *o)
{
	switch (o->type) {
	case MSGPACK_OBJECT_NIL:
		fputs("null", out);
		break;
	case MSGPACK_OBJECT_BOOLEAN:
		fputs(o->via.boolean ? "true" : "false", out);
		break;
	case MSGPACK_OBJECT_POSITIVE_INTEGER:
		fprintf(out, "%" PRIu64, o->via.u64);
		break;
	case MSGPACK_OBJECT_NEGATIVE_INTEGER:
		fprintf(out, "%" PRId64, o->via.i64);
		break;
	case MSGPACK_OBJECT_FLOAT32:
	case MSGPACK_OBJECT_FLOAT64:
		fprintf(out, "%.17g", o->via.f64);
		break;
	case MSGPACK_OBJECT_STR:
		kvd_json_str(out, o->via.str.ptr, o->via.str.size);
		break;
	case MSGPACK_OBJECT_ARRAY:
		fputc('[', out);
		for (uint32_t i = 0; i < o->via.array.size; i++) {
			if (i)
				fputc(',', out);
			json_print(out, &o->via.array.ptr[i]);
		}
		fputc(']', out);
		break;
	case MSGPACK_OBJECT_MAP:
		fputc('{', out);
		for (uint32_t i = 0; i < o->via.map.size; i++) {
			const msgpack_object *key = &o->via.map.ptr[i].key;

			if (i)
				fputc(',', out);
			if (key->type == MSGPACK_OBJECT_STR)
				kvd_json_str(out, key->via.str.ptr, key->via.str.size);
			else
				fputs("\"?\"", out);
			fputc(':', out);
			json_print(out, &o->via.map.ptr[i].val);
		}
		fputc('}', out);
		break;
	default:
		fputs("null", out);
		break;
	}
}

/* Look up "a.b.c" in nested maps. */
static const msgpack_object *field(const msgpack_object *m, const char *path)
{
	char key[64];
	const char *dot;

	while ((dot = strchr(path, '.'))) {
		snprintf(key, sizeof(key), "%.*s", (int)(dot - path), path);
		m = frame_map_get(m, key);
		path = dot + 1;
	}
	return frame_map_get(m, path);
}

static uint64_t fu(const msgpack_object *m, const char *path)
{
	const msgpack_object *o = field(m, path);
	uint64_t v = 0;

	if (o)
		frame_obj_u64(o, &v);
	return v;
}

static double fd(const msgpack_object *m, const char *path)
{
	const msgpack_object *o = field(m, path);
	double v = 0;

	if (o)
		frame_obj_double(o, &v);
	return v;
}

static const char *fs(const msgpack_object *m, const char *path, char *buf,
		      size_t size)
{
	const msgpack_object *o = field(m, path);

	if (!o || frame_obj_str(o, buf, size))
		snprintf(buf, size, "?");
	return buf;
}

static bool fb(const msgpack_object *m, const char *path)
{
	const msgpack_object *o = field(m, path);
	bool v = false;

	if (o)
		frame_obj_bool(o, &v);
	return v;
}

static void print_json_line(const msgpack_object *o)
{
	json_print(stdout, o);
	fputc('\n', stdout);
}

static void print_capacity(const msgpack_object *c, const char *indent)
{
	char v[32], pol[16], sha[80], dt[16], tr[16], dev[256], ws[32];

	printf("%sverdict     %s (policy %s)\n", indent,
	       fs(c, "verdict", v, sizeof(v)), fs(c, "policy", pol, sizeof(pol)));
	printf("%spool        %" PRIu64 " tokens (%" PRIu64 " pages x %" PRIu64
	       " tokens, %" PRIu64 " bytes/page)\n", indent,
	       fu(c, "pool_tokens"), fu(c, "pages"), fu(c, "page_tokens"),
	       fu(c, "page_bytes"));
	printf("%srequired    %" PRIu64 " tokens = context %" PRIu64
	       " x margin %g\n", indent, fu(c, "required_tokens"),
	       fu(c, "context_length"), fd(c, "margin"));
	printf("%sadvertised  %" PRIu64 " tokens of context\n", indent,
	       fu(c, "advertised_context"));
	printf("%smodel       sha256 %s, kv %s (%" PRIu64 " bytes/token)\n",
	       indent, fs(c, "model_sha256", sha, sizeof(sha)),
	       fs(c, "kv_dtype", dt, sizeof(dt)), fu(c, "kv_bytes_per_token"));
	fs(c, "transport", tr, sizeof(tr));
	fs(c, "verbs_device", dev, sizeof(dev));
	if (!strcmp(dev, "?"))
		dev[0] = '\0';
	fs(c, "verbs_write_scope", ws, sizeof(ws));
	if (!strcmp(ws, "?"))
		ws[0] = '\0';
	printf("%stransport   %s%s%s%s%s", indent, tr, dev[0] ? " on " : "", dev,
	       ws[0] ? ", write scope " : "", ws);
	if (!strcmp(tr, "verbs"))
		printf(", inline %" PRIu64 " bytes", fu(c, "verbs_inline"));
	printf("\n");
}

/* A command without arguments (argc 1): *res is its reply. 0; -1 when
 * --json printed the reply (the caller is done: exit 0); or an exit code. */
static int kvctl_call_plain(struct kvctl *k, int argc, const char *cmd,
			    const msgpack_object **res)
{
	struct frame_writer w;
	int r;

	if (argc != 1)
		return EXIT_USAGE;
	kvctl_request(&w, cmd, 0);
	r = kvctl_call(k, &w, res);
	if (r)
		return r;
	if (k->json) {
		print_json_line(*res);
		return -1;
	}
	return 0;
}

/* ---- subcommands ------------------------------------------------------------- */

static int sub_status(struct kvctl *k, int argc, char **argv)
{
	const msgpack_object *res;
	char a[64], b[16], c[16];
	const msgpack_object *rej;
	int r;

	(void)argv;
	r = kvctl_call_plain(k, argc, "status", &res);
	if (r)
		return r < 0 ? 0 : r;
	printf("node        %s (%s), %s, up %.1f s, kvd %s\n",
	       fs(res, "node", a, sizeof(a)), fs(res, "role", b, sizeof(b)),
	       fs(res, "state", c, sizeof(c)), fu(res, "uptime_ms") / 1000.0,
	       fs(res, "version", a + 32, 32));
	printf("pool        %" PRIu64 " pages x %" PRIu64 " tokens = %" PRIu64
	       " tokens%s\n", fu(res, "pool.pages"), fu(res, "pool.page_tokens"),
	       fu(res, "pool.tokens"), fb(res, "resizing") ? " (resizing)" : "");
	printf("  pages     free %" PRIu64 "  reserved %" PRIu64 "  filling %" PRIu64
	       "  ready %" PRIu64 "  fenced %" PRIu64 "  quarantined %" PRIu64
	       "  retiring %" PRIu64 "  retired %" PRIu64 "\n",
	       fu(res, "pool.free"), fu(res, "pool.reserved"),
	       fu(res, "pool.filling"), fu(res, "pool.ready"),
	       fu(res, "pool.fenced"), fu(res, "pool.quarantined"),
	       fu(res, "pool.retiring"), fu(res, "pool.retired"));
	printf("capacity\n");
	print_capacity(field(res, "capacity"), "  ");
	printf("requests    in flight %" PRIu64 ", waiting %" PRIu64 ", peers %"
	       PRIu64 ", admin clients %" PRIu64 "\n", fu(res, "in_flight"),
	       fu(res, "waiting"), fu(res, "peers"), fu(res, "admin_clients"));
	printf("counters    admitted %" PRIu64 "  completed %" PRIu64
	       "  failed %" PRIu64 "  integrity failures %" PRIu64 "\n",
	       fu(res, "counters.admitted"), fu(res, "counters.completed"),
	       fu(res, "counters.failed"),
	       fu(res, "counters.integrity_failures"));
	printf("rejected   ");
	rej = field(res, "counters.rejected");
	for (uint32_t i = 0; rej && rej->type == MSGPACK_OBJECT_MAP &&
			     i < rej->via.map.size; i++) {
		uint64_t v = 0;

		frame_obj_str(&rej->via.map.ptr[i].key, a, sizeof(a));
		frame_obj_u64(&rej->via.map.ptr[i].val, &v);
		printf(" %s %" PRIu64, a, v);
	}
	printf("\n");
	return 0;
}

static int print_state(struct kvctl *k, const msgpack_object *res)
{
	char s[32];

	if (k->json)
		print_json_line(res);
	else
		printf("state %s, %" PRIu64 " in flight\n",
		       fs(res, "state", s, sizeof(s)), fu(res, "in_flight"));
	return 0;
}

static int sub_drain(struct kvctl *k, int argc, char **argv)
{
	static const struct option opts[] = {
		{ "no-wait", no_argument, NULL, 'n' },
		{ "wait-ms", required_argument, NULL, 'w' },
		{ NULL, 0, NULL, 0 },
	};
	struct frame_writer w;
	msgpack_packer *pk;
	const msgpack_object *res;
	bool wait = true;
	uint64_t wait_ms = 0;
	int c, r;

	optind = 0;
	while ((c = getopt_long(argc, argv, "+", opts, NULL)) != -1) {
		if (c == 'n')
			wait = false;
		else if (c == 'w')
			wait_ms = strtoull(optarg, NULL, 10);
		else
			return EXIT_USAGE;
	}
	if (optind != argc)
		return EXIT_USAGE;
	pk = kvctl_request(&w, "drain", 1 + (wait_ms > 0));
	frame_pack_kv_bool(pk, "wait", wait);
	if (wait_ms)
		frame_pack_kv_u64(pk, "timeout_ms", wait_ms);
	r = kvctl_call(k, &w, &res);
	return r ? r : print_state(k, res);
}

static int sub_resume(struct kvctl *k, int argc, char **argv)
{
	struct frame_writer w;
	const msgpack_object *res;
	int r;

	if (argc != 1)
		return EXIT_USAGE;
	kvctl_request(&w, "resume", 0);
	r = kvctl_call(k, &w, &res);
	return r ? r : print_state(k, res);
}

static int sub_pool(struct kvctl *k, int argc, char **argv)
{
	static const struct option opts[] = {
		{ "tokens", required_argument, NULL, 't' },
		{ "bytes", required_argument, NULL, 'b' },
		{ "force", no_argument, NULL, 'f' },
		{ "wait-ms", required_argument, NULL, 'w' },
		{ NULL, 0, NULL, 0 },
	};
	struct frame_writer w;
	msgpack_packer *pk;
	const msgpack_object *res;
	uint64_t tokens = 0, bytes = 0, wait_ms = 0;
	bool force = false, have_wait = false;
	int c, r;

	if (argc < 2 || strcmp(argv[1], "resize"))
		return EXIT_USAGE;
	argc--, argv++;
	optind = 0;
	while ((c = getopt_long(argc, argv, "+", opts, NULL)) != -1) {
		if (c == 't' && !kvd_parse_u64(optarg, &tokens) && tokens)
			continue;
		if (c == 'b' && !kvd_parse_size(optarg, &bytes) && bytes)
			continue;
		if (c == 'b') {
			fprintf(stderr, "kvctl pool resize: --bytes '%s': not a size"
				" above 0 (" KVD_SIZE_UNITS ")\n", optarg);
			return EXIT_USAGE;
		}
		if (c == 'f') {
			force = true;
			continue;
		}
		if (c == 'w' && !kvd_parse_u64(optarg, &wait_ms)) {
			have_wait = true;
			continue;
		}
		return EXIT_USAGE;
	}
	if (optind != argc || !tokens == !bytes)
		return EXIT_USAGE;
	pk = kvctl_request(&w, "pool.resize", 1 + force + have_wait);
	if (tokens)
		frame_pack_kv_u64(pk, "tokens", tokens);
	else
		frame_pack_kv_u64(pk, "bytes", bytes);
	if (force)
		frame_pack_kv_bool(pk, "force", true);
	if (have_wait)
		frame_pack_kv_u64(pk, "timeout_ms", wait_ms);
	r = kvctl_call(k, &w, &res);
	if (r)
		return r;
	if (k->json) {
		print_json_line(res);
	} else {
		printf("pool        %" PRIu64 " -> %" PRIu64 " pages (%" PRIu64
		       " retired at once, waited %" PRIu64 " ms)\n",
		       fu(res, "pages_before"), fu(res, "pages_after"),
		       fu(res, "retired_now"), fu(res, "waited_ms"));
		print_capacity(field(res, "capacity"), "");
	}
	return fb(res, "capacity.ok") ? 0 : EXIT_CHECK;
}

static int sub_capacity(struct kvctl *k, int argc, char **argv)
{
	struct frame_writer w;
	const msgpack_object *res;
	int r;

	if (argc != 1)
		return EXIT_USAGE;
	kvctl_request(&w, "capacity", 0);
	r = kvctl_call(k, &w, &res);
	if (r)
		return r;
	if (k->json)
		print_json_line(res);
	else
		print_capacity(res, "");
	return fb(res, "ok") ? 0 : EXIT_CHECK;
}

static int sub_abort(struct kvctl *k, int argc, char **argv)
{
	struct frame_writer w;
	msgpack_packer *pk;
	const msgpack_object *res;
	uint64_t id = 0;
	bool pub;
	int r;

	if (argc != 2)
		return EXIT_USAGE;
	/* the registry's number, or the id the client was given */
	pub = !strncmp(argv[1], "cmpl-", 5) || !strncmp(argv[1], "chatcmpl-", 9);
	if (pub ? strlen(argv[1]) >= 48 : kvd_parse_u64(argv[1], &id) || id == 0)
		return EXIT_USAGE;
	pk = kvctl_request(&w, "abort", 1);
	if (pub)
		frame_pack_kv_str(pk, "public_id", argv[1]);
	else
		frame_pack_kv_u64(pk, "request", id);
	r = kvctl_call(k, &w, &res);
	if (r)
		return r;
	if (k->json)
		print_json_line(res);
	else if (pub)
		printf("%s: aborting\n", argv[1]);
	else
		printf("request %" PRIu64 ": aborting\n", id);
	return 0;
}

static void print_cache(const msgpack_object *res)
{
	const msgpack_object *ts = field(res, "tenants");
	char name[64];

	if (!fb(res, "enabled")) {
		printf("prefix cache off (cache.enabled)\n");
		return;
	}
	printf("prefix cache  %" PRIu64 " pages, %" PRIu64 " held by requests\n",
	       fu(res, "pages"), fu(res, "held"));
	printf("%-24s %8s %10s %10s %8s %10s\n", "tenant", "pages", "lookups",
	       "hits", "hit_rate", "evictions");
	for (uint32_t i = 0; ts && ts->type == MSGPACK_OBJECT_ARRAY &&
			     i < ts->via.array.size; i++) {
		const msgpack_object *t = &ts->via.array.ptr[i];

		printf("%-24s %8" PRIu64 " %10" PRIu64 " %10" PRIu64 " %8.3f %10"
		       PRIu64 "\n", fs(t, "tenant", name, sizeof(name)),
		       fu(t, "pages"), fu(t, "lookups"), fu(t, "hits"),
		       fd(t, "hit_rate"), fu(t, "evictions"));
	}
}

/* queue: the requests waiting at the tenant gate */
static int sub_queue(struct kvctl *k, int argc, char **argv)
{
	const msgpack_object *res, *rq;
	char id[48], tenant[64];
	int r;

	(void)argv;
	r = kvctl_call_plain(k, argc, "queue", &res);
	if (r)
		return r < 0 ? 0 : r;
	rq = field(res, "requests");
	printf("%" PRIu64 " waiting\n", fu(res, "waiting"));
	printf("%-10s %-42s %-20s %8s %8s %10s\n", "request", "public_id",
	       "tenant", "prompt", "max_tok", "waited_ms");
	for (uint32_t i = 0; rq && rq->type == MSGPACK_OBJECT_ARRAY &&
			     i < rq->via.array.size; i++) {
		const msgpack_object *q = &rq->via.array.ptr[i];

		printf("%-10" PRIu64 " %-42s %-20s %8" PRIu64 " %8" PRIu64 " %10"
		       PRIu64 "%s\n", fu(q, "request"),
		       fs(q, "public_id", id, sizeof(id))[0] ? id : "-",
		       fs(q, "tenant", tenant, sizeof(tenant)),
		       fu(q, "prompt_tokens"), fu(q, "max_tokens"),
		       fu(q, "waited_ms"), fb(q, "held") ? " (held)" : "");
	}
	return 0;
}

/* cache status | cache flush [--tenant T] */
static int sub_cache(struct kvctl *k, int argc, char **argv)
{
	const char *tenant = NULL;
	struct frame_writer w;
	msgpack_packer *pk;
	const msgpack_object *res;
	int r;

	if (argc == 2 && !strcmp(argv[1], "status")) {
		kvctl_request(&w, "cache.status", 0);
	} else if (argc >= 2 && !strcmp(argv[1], "flush")) {
		if (argc == 4 && !strcmp(argv[2], "--tenant") && argv[3][0] &&
		    strlen(argv[3]) < 64)
			tenant = argv[3];
		else if (argc != 2)
			return EXIT_USAGE;
		pk = kvctl_request(&w, "cache.flush", tenant ? 1 : 0);
		if (tenant)
			frame_pack_kv_str(pk, "tenant", tenant);
	} else {
		return EXIT_USAGE;
	}
	r = kvctl_call(k, &w, &res);
	if (r)
		return r;
	if (k->json)
		print_json_line(res);
	else if (!strcmp(argv[1], "status"))
		print_cache(res);
	else
		printf("flushed %s: %" PRIu64 " pages freed now\n",
		       tenant ? tenant : "every tenant", fu(res, "evicted"));
	return 0;
}

static int sub_fault(struct kvctl *k, int argc, char **argv)
{
	static const struct option opts[] = {
		{ "count", required_argument, NULL, 'c' },
		{ "tokens", required_argument, NULL, 't' },
		{ "hold-ms", required_argument, NULL, 'h' },
		{ "fence-ms", required_argument, NULL, 'f' },
		{ NULL, 0, NULL, 0 },
	};
	static const char *const keys[] = { "count", "tokens", "hold_ms", "fence_ms" };
	uint64_t v[4] = { 0 };
	bool have[4] = { false };
	struct frame_writer w;
	msgpack_packer *pk;
	const msgpack_object *res;
	int c, r;

	if (argc < 2 || strcmp(argv[1], "load"))
		return EXIT_USAGE;
	argc--, argv++;
	optind = 0;
	while ((c = getopt_long(argc, argv, "+", opts, NULL)) != -1) {
		int i = c == 'c' ? 0 : c == 't' ? 1 : c == 'h' ? 2 : c == 'f' ? 3 : -1;

		if (i < 0 || kvd_parse_u64(optarg, &v[i]))
			return EXIT_USAGE;
		have[i] = true;
	}
	if (optind != argc || !have[0] || !have[1] || !have[2])
		return EXIT_USAGE;
	pk = kvctl_request(&w, "fault.load", 3 + have[3]);
	for (int i = 0; i < 4; i++)
		if (have[i])
			frame_pack_kv_u64(pk, keys[i], v[i]);
	r = kvctl_call(k, &w, &res);
	if (r)
		return r;
	if (k->json)
		print_json_line(res);
	else if (fu(res, "admitted"))
		printf("admitted %" PRIu64 " (ids %" PRIu64 "..%" PRIu64
		       "), rejected: draining %" PRIu64 ", pool full %" PRIu64 "\n",
		       fu(res, "admitted"), fu(res, "first_id"),
		       fu(res, "last_id"), fu(res, "rejected_draining"),
		       fu(res, "rejected_full"));
	else
		printf("admitted 0, rejected: draining %" PRIu64 ", pool full %"
		       PRIu64 "\n", fu(res, "rejected_draining"),
		       fu(res, "rejected_full"));
	return 0;
}

static int sub_audit(struct kvctl *k, int argc, char **argv)
{
	struct audit *a = NULL;
	enum audit_verdict v;
	int r = audit_new(&a);

	if (r < 0) {
		fprintf(stderr, "kvctl audit: %s\n", strerror(-r));
		return EXIT_CHECK;
	}
	for (int i = argc == 1 ? 0 : 1; i < argc && r == 0; i++) {
		bool std = i == 0 || !strcmp(argv[i], "-");
		const char *name = std ? "stdin" : argv[i];
		FILE *f = std ? stdin : fopen(argv[i], "r");

		if (!f) {
			fprintf(stderr, "kvctl audit: %s: %s\n", name, strerror(errno));
			audit_free(a);
			return EXIT_USAGE;
		}
		r = audit_feed_file(a, f);
		if (f != stdin)
			fclose(f);
		if (r < 0) {
			fprintf(stderr, "kvctl audit: %s: %s\n", name, strerror(-r));
			audit_free(a);
			return EXIT_CHECK;
		}
	}
	v = k->json ? audit_report_json(a, stdout) : audit_report(a, stdout);
	audit_free(a);
	return v == AUDIT_FAIL ? EXIT_CHECK : v == AUDIT_UNJUDGED ? EXIT_UNJUDGED : 0;
}

/* kvctl keygen FILE [--force]: a new cluster secret - 32 random bytes
 * as 64 hex digits and a newline - created mode 0600 (never over an
 * existing file unless --force). Every node of a cluster gets a copy. */
static int sub_keygen(struct kvctl *k, int argc, char **argv)
{
	uint8_t key[PEER_AUTH_BYTES];
	char hex[2 * PEER_AUTH_BYTES + 2];
	bool force = argc == 3 && !strcmp(argv[2], "--force");
	const char *path = argc >= 2 ? argv[1] : NULL;
	int fd, flags = O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW;
	size_t n;

	(void)k;
	if (!path || path[0] == '-' || (argc == 3 && !force) || argc > 3) {
		fprintf(stderr, "usage: kvctl keygen FILE [--force]\n");
		return EXIT_USAGE;
	}
	if (peer_auth_global_init()) {
		fprintf(stderr, "kvctl keygen: libsodium failed to initialise\n");
		return EXIT_CHECK;
	}
	flags |= force ? O_TRUNC : O_EXCL;
	fd = open(path, flags, 0600);
	if (fd < 0) {
		fprintf(stderr, "kvctl keygen: %s: %s%s\n", path, strerror(errno),
			errno == EEXIST ? " (use --force to replace it)" : "");
		return EXIT_CHECK;
	}
	peer_auth_random(key);
	sodium_bin2hex(hex, sizeof(hex) - 1, key, sizeof(key));
	sodium_memzero(key, sizeof(key));
	n = strlen(hex);
	hex[n++] = '\n';
	/* an existing file kept its mode under --force: make it private */
	if (fchmod(fd, 0600) < 0 || write(fd, hex, n) != (ssize_t)n || fsync(fd) < 0) {
		fprintf(stderr, "kvctl keygen: %s: %s\n", path, strerror(errno));
		sodium_memzero(hex, sizeof(hex));
		close(fd);
		return EXIT_CHECK;
	}
	sodium_memzero(hex, sizeof(hex));
	close(fd);
	return 0;
}

static int sub_model(struct kvctl *k, int argc, char **argv)
{
	(void)k;
	return kvctl_cmd_model(argc, argv);
}

static int sub_generate(struct kvctl *k, int argc, char **argv)
{
	(void)k;
	return kvctl_cmd_generate(argc, argv);
}

/* The node's Prometheus text, as its HTTP /metrics serves it. */
static int sub_metrics(struct kvctl *k, int argc, char **argv)
{
	const msgpack_object *res, *o;
	int r;

	(void)argv;
	r = kvctl_call_plain(k, argc, "metrics", &res);
	if (r)
		return r < 0 ? 0 : r;
	o = field(res, "text");
	if (!o || o->type != MSGPACK_OBJECT_STR) {
		fprintf(stderr, "kvctl: the reply has no metrics text\n");
		return 1;
	}
	fwrite(o->via.str.ptr, 1, o->via.str.size, stdout);
	return 0;
}

static const struct kvctl_cmd kvctl_cmds[] = {
	{ "status", sub_status, true, true, "status" },
	{ "drain", sub_drain, true, true, "drain [--no-wait] [--wait-ms N]" },
	{ "resume", sub_resume, true, true, "resume" },
	{ "pool", sub_pool, true, true,
	  "pool resize --tokens N | --bytes SIZE (8G, 512MiB, 4GB) [--force] [--wait-ms N]" },
	{ "capacity", sub_capacity, true, true, "capacity" },
	{ "metrics", sub_metrics, true, true, "metrics   (Prometheus text format 0.0.4)" },
	{ "abort", sub_abort, true, true, "abort ID|cmpl-...|chatcmpl-..." },
	{ "queue", sub_queue, true, true, "queue   (requests waiting at the tenant gate)" },
	{ "cache", sub_cache, true, true, "cache status | cache flush [--tenant T]   (the prefix cache)" },
	{ "audit", sub_audit, false, true, "audit [FILE...]  (exit 1 a finding, 3 a node not judged)" },
	{ "keygen", sub_keygen, false, false, "keygen FILE [--force]   (a new cluster secret for peers.key_file)" },
	{ "model", sub_model, false, false, "model make|inspect ... (kvctl model --help)" },
	{ "generate", sub_generate, false, false,
	  "generate --server ADDR --prompt TEXT [--max-tokens N --temperature T --seed S] [--json]" },
	{ "fault", sub_fault, true, true,
	  "fault load --count N --tokens N --hold-ms N [--fence-ms N]" },
};

static void usage(FILE *out)
{
	fprintf(out, "usage: kvctl [--socket PATH | --node NAME] [--json]"
		     " [--timeout SEC] COMMAND\n");
	for (size_t i = 0; i < KVD_ARRAY_SIZE(kvctl_cmds); i++)
		fprintf(out, "  %s\n", kvctl_cmds[i].help);
	fprintf(out, "kvctl's options may also follow a command that talks to"
		     " the daemon, or audit (kvctl status --json)\n"
		     "exit: 0 ok, 1 check failed or daemon error, 2 usage,"
		     " 3 audit: some nodes could not be judged (no finding),"
		     " 69 daemon unavailable\n");
}

/* kvctl's own options; short forms only before the command. */
static const struct option kvctl_opts[] = {
	{ "socket", required_argument, NULL, 's' },
	{ "node", required_argument, NULL, 'n' },
	{ "json", no_argument, NULL, 'j' },
	{ "timeout", required_argument, NULL, 't' },
	{ "help", no_argument, NULL, 'h' },
	{ "version", no_argument, NULL, 'V' },
	{ NULL, 0, NULL, 0 },
};

/* One of kvctl_opts (c, its value arg): 0, EXIT_USAGE, or -1 when it
 * printed what was asked (--help, --version) and kvctl is done. */
static int kvctl_opt(struct kvctl *k, int c, const char *arg)
{
	uint64_t secs;

	switch (c) {
	case 's':
		k->socket = arg;
		return 0;
	case 'n':
		snprintf(k->sockbuf, sizeof(k->sockbuf), "%s/%s.sock",
			 KVCTL_RUNDIR, arg);
		k->socket = k->sockbuf;
		return 0;
	case 'j':
		k->json = true;
		return 0;
	case 't':
		if (kvd_parse_u64(arg, &secs) || secs > 86400)
			return EXIT_USAGE;
		k->timeout_ms = (int)secs * 1000;
		return 0;
	case 'h':
		usage(stdout);
		return -1;
	case 'V':
		printf("kvctl %s\n", KVD_VERSION);
		return -1;
	default:
		return EXIT_USAGE;
	}
}

/* kvctl's long options after the command (`kvctl status --json`,
 * `--socket=PATH` or `--socket PATH`), up to a `--`: applied and taken
 * out of argv[1..*argc), so the command sees only its own. 0, EXIT_USAGE
 * (an option without its value, a bad value) or -1 (--help printed). */
static int kvctl_opts_after(struct kvctl *k, const struct kvctl_cmd *cmd,
			    int *argc, char **argv)
{
	int out = 1, i;

	for (i = 1; i < *argc && strcmp(argv[i], "--"); i++) {
		const struct option *o = kvctl_opts;
		const char *a = argv[i], *eq = strchr(a, '='), *val = NULL;
		size_t n = eq ? (size_t)(eq - a) : strlen(a);
		int r;

		while (o->name && (strncmp(a, "--", 2) || n - 2 != strlen(o->name) ||
				   strncmp(a + 2, o->name, n - 2)))
			o++;
		if (!o->name || (eq && o->has_arg == no_argument)) {
			argv[out++] = argv[i];
			continue;
		}
		if (o->has_arg == required_argument && !(val = eq ? eq + 1 : argv[++i]))
			return EXIT_USAGE;
		if (o->val == 'h') {
			printf("usage: kvctl %s\n", cmd->help);
			return -1;
		}
		r = kvctl_opt(k, o->val, val);
		if (r)
			return r;
	}
	while (i < *argc)
		argv[out++] = argv[i++];
	argv[out] = NULL;
	*argc = out;
	return 0;
}

/* Run cmd on argv[0..argc) (argv[0]: its name). */
static int kvctl_run(struct kvctl *k, const struct kvctl_cmd *cmd, int argc,
		     char **argv)
{
	int r = 0;

	if (cmd->options_after)
		r = kvctl_opts_after(k, cmd, &argc, argv);
	if (r < 0)
		return 0;
	if (r == 0)
		r = cmd->fn(k, argc, argv);
	/* model and generate print their own usage */
	if (r == EXIT_USAGE && cmd->daemon)
		fprintf(stderr, "usage: kvctl %s\n", cmd->help);
	return r;
}

int main(int argc, char **argv)
{
	struct kvctl k = { .timeout_ms = -1, .fd = -1 };
	int c, r = EXIT_USAGE;

	while ((c = getopt_long(argc, argv, "+s:n:jt:hV", kvctl_opts, NULL)) != -1) {
		r = kvctl_opt(&k, c, optarg);
		if (r < 0)
			return 0;
		if (r) {
			usage(stderr);
			return EXIT_USAGE;
		}
	}
	if (optind >= argc) {
		usage(stderr);
		return EXIT_USAGE;
	}
	frame_decoder_init(&k.dec, ADMIN_REPLY_MAX);
	r = EXIT_USAGE;
	for (size_t i = 0; i < KVD_ARRAY_SIZE(kvctl_cmds); i++) {
		if (strcmp(argv[optind], kvctl_cmds[i].name))
			continue;
		r = kvctl_run(&k, &kvctl_cmds[i], argc - optind, argv + optind);
		goto out;
	}
	fprintf(stderr, "kvctl: unknown command '%s'\n", argv[optind]);
	usage(stderr);
out:
	if (k.fd >= 0)
		close(k.fd);
	frame_decoder_deinit(&k.dec);
	return r;
}
