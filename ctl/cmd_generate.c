/* cmd_generate.c - `kvctl generate`: the command-line client of the
 * client API (net/PROTOCOL.md section 1).
 *
 *   kvctl generate --server ADDR (--prompt TEXT | --tokens ID,ID,...)
 *                  [--max-tokens N] [--temperature T] [--top-k K]
 *                  [--top-p P] [--seed S] [--id N] [--json]
 *                  [--presence-penalty X] [--frequency-penalty X]
 *                  [--repetition-penalty X] [--min-p X]
 *                  [--logit-bias ID:BIAS,...] [--logprobs N]
 *
 * ADDR is host:port or unix:PATH. With KVD_API_KEY set in the
 * environment (a node with http.api_keys_file), the request is preceded
 * by {type:auth, key} (never on the command line: ps shows it). Text streams to stdout as token events
 * arrive; with --json one object is printed at the end:
 *   {"id":N,"output_ids":[..],"text":"..","finish_reason":"..",
 *    "prompt_tokens":N,"output_tokens":N,"ttft_us":N,"total_us":N}
 * (with --logprobs, "logprobs":[the chosen tokens' logprobs] and
 * "top_logprobs":[[[id, logprob], ...] per token] after output_ids)
 * or, for a typed error, {"id":N,"error":"CODE","message":"..",
 * "output_ids":[..]} (tokens received before the error, if any).
 *
 * Every value of an option named after a request field is read with the
 * bounds the server reads the request with (proto_client_request_set): a
 * bad one is a usage error naming the option and the value.
 *
 * Exit: 0 final event received, 1 typed error from the server or out of
 * memory, 2 usage, 69 server unavailable or connection lost. A command,
 * so it prints; the blocking socket code lives here because kvctl has no
 * event loop.
 */
#include "ctl/cmd_generate.h"
#include "conf/util.h"
#include "net/wire/frame.h"
#include "net/wire/proto_client.h"

#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netdb.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define EX_USAGE_ 2
#define EX_UNAVAILABLE_ 69

struct gen_out {
	struct kvd_buf ids;    /* uint32_t output token ids, (len / 4) */
	struct kvd_buf text;   /* the text, NUL-terminated */
	struct kvd_buf lps;    /* struct sampler_logprobs per token, when sent */
};

static int gen_connect(const char *addr)
{
	int fd;

	if (!strncmp(addr, "unix:", 5))
		return kvd_unix_connect(addr + 5);
	{
		char host[256];
		const char *colon = strrchr(addr, ':');
		struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *ai, *p;
		int rc, e = ECONNREFUSED;

		if (!colon || (size_t)(colon - addr) >= sizeof(host))
			return -EINVAL;
		memcpy(host, addr, (size_t)(colon - addr));
		host[colon - addr] = 0;
		if (host[0] == '[' && host[strlen(host) - 1] == ']') {
			memmove(host, host + 1, strlen(host));
			host[strlen(host) - 1] = 0;
		}
		rc = getaddrinfo(host, colon + 1, &hints, &ai);
		if (rc)
			return -EHOSTUNREACH;
		fd = -1;
		for (p = ai; p; p = p->ai_next) {
			fd = socket(p->ai_family, p->ai_socktype | SOCK_CLOEXEC, 0);
			if (fd < 0)
				continue;
			if (connect(fd, p->ai_addr, p->ai_addrlen) == 0)
				break;
			e = errno;
			close(fd);
			fd = -1;
		}
		freeaddrinfo(ai);
		return fd >= 0 ? fd : -e;
	}
}

static int write_all(int fd, const char *p, size_t n)
{
	while (n) {
		ssize_t w = write(fd, p, n);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -errno;
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

/* A token's id and text kept: 0 or -ENOMEM. */
static int out_token(struct gen_out *o, uint32_t id, const char *t, size_t n)
{
	int rc = kvd_buf_add(&o->ids, &id, sizeof(id));

	return rc ? rc : kvd_buf_add(&o->text, t, n);
}

static void gen_usage(FILE *f)
{
	fprintf(f, "usage: kvctl generate --server ADDR (--prompt TEXT | --tokens ID,ID,...)\n"
		   "       [--max-tokens N] [--temperature T] [--top-k K] [--top-p P]\n"
		   "       [--presence-penalty X] [--frequency-penalty X]\n"
		   "       [--repetition-penalty X] [--min-p X]\n"
		   "       [--logit-bias ID:BIAS,...] [--logprobs N (alternatives, 0..20)]\n"
		   "       [--seed S] [--id N] [--json]\n"
		   "ADDR: host:port or unix:PATH. KVD_API_KEY=KEY: authenticate first (a node with keys).\n"
		   "Values are checked with the server's bounds (a bad one: exit 2).\n"
		   "Exit: 0 ok, 1 server error or out of memory, 2 usage, 69 unavailable\n");
}

/* Read events until the request's final or error: 0 (final), 1 (typed
 * error), EX_UNAVAILABLE_, or -ENOMEM when what came could not be kept. */
static int gen_loop(int fd, uint64_t id, bool json, struct gen_out *o,
		    struct proto_client_event *last)
{
	struct frame_decoder dec;
	char buf[65536];
	int rc = EX_UNAVAILABLE_;

	frame_decoder_init(&dec, PROTO_CLIENT_FRAME_MAX);
	for (;;) {
		ssize_t n = read(fd, buf, sizeof(buf));
		size_t off = 0;

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			fprintf(stderr, "kvctl generate: the server closed the connection\n");
			goto out;
		}
		while (off < (size_t)n) {
			size_t used;
			const msgpack_object *map;
			struct frame_error err;
			int r;

			if (frame_decoder_feed(&dec, buf + off, (size_t)n - off, &used))
				goto out;
			off += used;
			while ((r = frame_decoder_next(&dec, &map)) != FRAME_E_AGAIN) {
				if (!r && frame_obj_streq(frame_map_get(map, "type"), "auth_ok"))
					continue;   /* KVD_API_KEY was good */
				if (r || proto_client_event_parse(map, last, &err)) {
					fprintf(stderr, "kvctl generate: bad frame from the server\n");
					goto out;
				}
				/* a frame_error names no request: it is the
				 * connection's (limit, bad frame) and ours too */
				if (last->type != PROTO_EV_FRAME_ERROR &&
				    last->id != id)
					continue;
				if (last->type == PROTO_EV_TOKEN) {
					if (out_token(o, last->token, last->text, last->text_len) ||
					    (last->has_lp &&
					     kvd_buf_add(&o->lps, &last->lp, sizeof(last->lp)))) {
						rc = -ENOMEM;
						goto out;
					}
					if (!json) {
						fwrite(last->text, 1, last->text_len, stdout);
						fflush(stdout);
					}
					continue;
				}
				rc = last->type == PROTO_EV_FINAL ? 0 : 1;
				if (rc == 0 && last->fin.text_len) {
					/* text only, not a token */
					if (kvd_buf_add(&o->text, last->fin.text, last->fin.text_len)) {
						rc = -ENOMEM;
						goto out;
					}
					if (!json)
						fwrite(last->fin.text, 1, last->fin.text_len, stdout);
				}
				goto out;
			}
		}
	}
out:
	frame_decoder_deinit(&dec);
	return rc;
}

/* The bytes to send: an auth frame when KVD_API_KEY is set, then the
 * request. 0 or a frame_writer error. */
static int gen_frames(const struct proto_client_request *q, char **data, size_t *len)
{
	const char *key = getenv("KVD_API_KEY");
	struct frame_writer w;
	char *a = NULL, *b = NULL;
	size_t na = 0, nb = 0;
	int rc = 0;

	if (key && *key) {
		frame_writer_init(&w);
		proto_client_pack_auth(frame_writer_packer(&w), key);
		rc = frame_writer_finish(&w, PROTO_CLIENT_FRAME_MAX, &a, &na);
		frame_writer_deinit(&w);
	}
	if (!rc) {
		frame_writer_init(&w);
		proto_client_request_pack(frame_writer_packer(&w), q);
		rc = frame_writer_finish(&w, PROTO_CLIENT_FRAME_MAX, &b, &nb);
		frame_writer_deinit(&w);
	}
	if (!rc && na) {
		char *p = realloc(a, na + nb);

		if (!p) {
			rc = -ENOMEM;
		} else {
			memcpy(p + na, b, nb);
			free(b);
			b = p;
			a = NULL;
			nb += na;
		}
	}
	free(a);
	if (rc) {
		free(b);
		return rc;
	}
	*data = b;
	*len = nb;
	return 0;
}

/* --NAME VALUE for the request field NAME ('_' written '-'), with the
 * server's bounds (proto_client_request_set). 0, or -1 after saying what
 * is wrong on stderr. */
static int gen_field(struct proto_client_request *q, const char *name,
		     const char *value)
{
	struct frame_error err;
	int rc = proto_client_request_set(q, name, value, &err);

	if (rc == -ENOMEM)
		fprintf(stderr, "kvctl generate: out of memory\n");
	else if (rc)
		fprintf(stderr, "kvctl generate: --%s '%s': %s\n", name, value,
			err.msg);
	return rc ? -1 : 0;
}

/* The command line into q, *server and *json: an option named after a
 * request field (net/PROTOCOL.md s. 1) is that field (gen_field; given
 * twice, the last counts). 0, 1 after --help (usage on stdout), or -1
 * after saying what is wrong on stderr; q->tokens may be set either way
 * (the caller frees it). */
static int gen_args(int argc, char **argv, struct proto_client_request *q,
		    const char **server, bool *json)
{
	static const struct option opts[] = {
		{ "server", required_argument, NULL, 'S' },
		{ "prompt", required_argument, NULL, 'p' },
		{ "tokens", required_argument, NULL, 'F' },
		PROTO_CLIENT_OPTIONS('F'),
		{ "id", required_argument, NULL, 'F' },
		{ "json", no_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	int c, li = 0;

	optind = 1;
	while ((c = getopt_long(argc, argv, "h", opts, &li)) != -1) {
		switch (c) {
		case 'S': *server = optarg; break;
		case 'p': q->prompt = optarg; break;
		case 'F':
			if (gen_field(q, opts[li].name, optarg))
				return -1;
			break;
		case 'j': *json = true; break;
		case 'h': gen_usage(stdout); return 1;
		default: gen_usage(stderr); return -1;
		}
	}
	if (!*server || !!q->prompt == !!q->tokens || optind != argc) {
		gen_usage(stderr);
		return -1;
	}
	return 0;
}

/* The outcome: with --json one object (the final's figures, or the typed
 * error) unless the server was unavailable; else the closing newline
 * after streamed text, or the typed error on stderr. rc is gen_loop's. */
static void gen_report(int rc, bool json, uint64_t id, const struct gen_out *o,
		       const struct proto_client_event *last)
{
	if (json && rc != EX_UNAVAILABLE_) {
		printf("{\"id\":%llu,\"output_ids\":", (unsigned long long)id);
		kvd_json_u32s(stdout, (const uint32_t *)o->ids.p,
			      o->ids.len / sizeof(uint32_t));
		proto_client_logprobs_json(stdout, (const void *)o->lps.p,
					   o->lps.len / sizeof(struct sampler_logprobs));
		printf(",\"text\":");
		kvd_json_str(stdout, o->text.p ? o->text.p : "", o->text.len);
		if (rc == 0)
			printf(",\"finish_reason\":\"%s\",\"prompt_tokens\":%u,\"output_tokens\":%u,\"ttft_us\":%llu,\"total_us\":%llu}\n",
			       last->fin.finish_reason, last->fin.prompt_tokens,
			       last->fin.output_tokens,
			       (unsigned long long)last->fin.ttft_us,
			       (unsigned long long)last->fin.total_us);
		else {
			printf(",\"error\":\"%s\",\"message\":", proto_err_name(last->code));
			kvd_json_str(stdout, last->message, strlen(last->message));
			printf("}\n");
		}
	} else if (rc == 0) {
		printf("\n");
	} else if (rc == 1) {
		fprintf(stderr, "kvctl generate: %s: %s\n", proto_err_name(last->code),
			last->message);
	}
}

int kvctl_cmd_generate(int argc, char **argv)
{
	struct proto_client_request q = PROTO_CLIENT_REQUEST_NULL;
	struct proto_client_event last;
	struct gen_out o = { KVD_BUF_NULL, KVD_BUF_NULL, KVD_BUF_NULL };
	const char *server = NULL;
	bool json = false;
	char *data = NULL;
	size_t len;
	int fd, rc;

	q.id = 1;
	rc = gen_args(argc, argv, &q, &server, &json);
	if (rc) {
		free(q.tokens);
		free(q.bias);
		return rc > 0 ? 0 : EX_USAGE_;
	}
	rc = gen_frames(&q, &data, &len);
	free(q.tokens);   /* (q.prompt is argv's) */
	free(q.bias);
	if (rc) {
		fprintf(stderr, "kvctl generate: the request is too large\n");
		return EX_USAGE_;
	}
	fd = gen_connect(server);
	if (fd < 0) {
		fprintf(stderr, "kvctl generate: %s: %s\n", server, strerror(-fd));
		free(data);
		return EX_UNAVAILABLE_;
	}
	rc = write_all(fd, data, len) ? EX_UNAVAILABLE_ : gen_loop(fd, q.id, json, &o, &last);
	free(data);
	close(fd);
	if (rc == -ENOMEM) {
		fprintf(stderr, "kvctl generate: out of memory\n");
		rc = 1;
	} else {
		gen_report(rc, json, q.id, &o, &last);
	}
	kvd_buf_deinit(&o.ids);
	kvd_buf_deinit(&o.text);
	kvd_buf_deinit(&o.lps);
	return rc;
}
