/* fuzz_config.c - the INI configuration (conf/config.h):
 * kvd_config_load_string on arbitrary text.
 *
 * A bad config must be refused with FILE:LINE, the key and a sentence
 * (kvd exits 78), never crash or half-apply. Properties:
 *   - rejected: -1 (or -ENOMEM) with a non-empty, terminated message,
 *     a line number within the text, a terminated key;
 *   - accepted: the struct's invariants (known enums, one of pool_tokens
 *     and memory_bytes, margin >= 1, page_tokens > 0, peers counted within
 *     KVD_MAX_PEERS, every string terminated), validate() agrees, and the
 *     resolved configuration kvd_config_print() writes loads again and
 *     prints the same text (what `kvd --check-config` shows is what the
 *     daemon would run).
 *
 *   - every address the config accepts (listen.client items split the
 *     way the daemon splits them, listen.peer, peers.prefill) is one the
 *     daemon's parser, serve__parse_hostport(), can use: otherwise
 *     `kvd --check-config` passes and the node fails at run time.
 *     (Built against daemon/ only in the meson build; tests/fuzz/run
 *     compiles the decoders alone and defines KVD_FUZZ_NO_DAEMON.)
 *
 * model.path must name a readable file: seeds use /dev/null. The text is
 * the input up to its first NUL (inih reads C strings).
 */
#include <errno.h>
#include <string.h>

#include "conf/config.h"
#ifndef KVD_FUZZ_NO_DAEMON
#include "daemon/node/serve_int.h"
#endif
#include "tests/fuzz/fuzz.h"

const char fuzz_target_name[] = "config";

static bool terminated(const char *s, size_t size)
{
	return memchr(s, 0, size) != NULL;
}

static void check_struct(const struct kvd_config *c)
{
	FUZZ_CHECK(c->role <= KVD_ROLE_STANDALONE, "role %d", c->role);
	FUZZ_CHECK(c->capacity_policy <= KVD_CAP_CLAMP, "policy %d",
		   c->capacity_policy);
	FUZZ_CHECK(c->transport <= KVD_TRANSPORT_VERBS, "transport %d",
		   c->transport);
	FUZZ_CHECK(!!c->pool_tokens != !!c->memory_bytes,
		   "pool_tokens %llu and memory_bytes %llu",
		   (unsigned long long)c->pool_tokens,
		   (unsigned long long)c->memory_bytes);
	FUZZ_CHECK(c->capacity_margin >= 1.0, "margin %g", c->capacity_margin);
	FUZZ_CHECK(c->page_tokens > 0, "page_tokens 0");
	FUZZ_CHECK(c->n_peers_prefill <= KVD_MAX_PEERS, "%u peers",
		   c->n_peers_prefill);
	FUZZ_CHECK(terminated(c->node_name, sizeof(c->node_name)) &&
		   terminated(c->model_path, sizeof(c->model_path)) &&
		   terminated(c->kv_backend, sizeof(c->kv_backend)) &&
		   terminated(c->listen_client, sizeof(c->listen_client)) &&
		   terminated(c->listen_peer, sizeof(c->listen_peer)) &&
		   terminated(c->admin_socket, sizeof(c->admin_socket)) &&
		   terminated(c->admin_group, sizeof(c->admin_group)) &&
		   terminated(c->path, sizeof(c->path)),
		   "a string field is not terminated");
	for (uint32_t i = 0; i < c->n_peers_prefill; i++)
		FUZZ_CHECK(terminated(c->peers_prefill[i],
				      sizeof(c->peers_prefill[i])) &&
			   c->peers_prefill[i][0], "peer %u empty", i);
	FUZZ_CHECK(c->model_path[0], "accepted without model.path");
}

#ifndef KVD_FUZZ_NO_DAEMON
/* Every address the config accepts, the daemon parses the same way
 * (conf/config.c is_hostport and for_each_item against daemon/node/io.c
 * serve__parse_hostport and serve__client_listen; once a known bug: a
 * config that passed --check-config and failed at start). A
 * peers.prefill name:port is the exception the daemon resolves. */
static void check_addr(const char *what, const char *spec)
{
	struct sockaddr_storage ss;

	FUZZ_CHECK(serve__parse_hostport(spec, &ss) == 0,
		   "config accepts %s '%s', the daemon cannot parse it", what,
		   spec);
}

static void check_addrs(const struct kvd_config *c)
{
	char list[sizeof(c->listen_client)], *save = NULL, *tok;

	/* exactly as serve__client_listen() splits the list */
	snprintf(list, sizeof(list), "%s", c->listen_client);
	for (tok = strtok_r(list, ",", &save); tok;
	     tok = strtok_r(NULL, ",", &save)) {
		while (*tok == ' ')
			tok++;
		if (*tok && strncmp(tok, "unix:", 5))
			check_addr("listen.client item", tok);
	}
	if (c->listen_peer[0])
		check_addr("listen.peer", c->listen_peer);
	for (uint32_t i = 0; i < c->n_peers_prefill; i++) {
		char host[KVD_PEER_NAME_MAX + 1];
		uint16_t port;

		/* a name:port the daemon resolves (daemon/node/peerdns.c) */
		if (kvd_peer_name_split(c->peers_prefill[i], host, &port) == 0)
			continue;
		check_addr("peers.prefill item", c->peers_prefill[i]);
	}
}
#else
static void check_addrs(const struct kvd_config *c)
{
	(void)c;
}
#endif

static char *print(const struct kvd_config *c, size_t *len)
{
	char *buf = NULL;
	FILE *fp = open_memstream(&buf, len);

	if (!fp)
		abort();
	kvd_config_print(fp, c);
	fclose(fp);
	return buf;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct kvd_config c, c2;
	struct kvd_config_error err;
	char *text = malloc(size + 1);
	int r;

	if (!text)
		return 0;
	memcpy(text, data, size);
	text[size] = '\0';
	memset(&err, 0x5a, sizeof(err));   /* the loader must fill it */
	r = kvd_config_load_string(&c, "fuzz.ini", text, &err);
	if (r) {
		size_t lines = 1;

		for (const char *p = text; *p; p++)
			lines += *p == '\n';
		FUZZ_CHECK(r == -1 || r == -ENOMEM, "load returned %d", r);
		FUZZ_CHECK(terminated(err.msg, sizeof(err.msg)) && err.msg[0],
			   "refused without a message");
		FUZZ_CHECK(terminated(err.key, sizeof(err.key)) &&
			   terminated(err.file, sizeof(err.file)),
			   "error fields not terminated");
		FUZZ_CHECK(err.line >= 0 && (size_t)err.line <= lines,
			   "error on line %d of a %zu-line text", err.line, lines);
		free(text);
		return 0;
	}
	check_struct(&c);
	check_addrs(&c);
	FUZZ_CHECK(kvd_config_validate(&c, &err) == 0,
		   "loaded, then validate() says: %s", err.msg);

	/* the resolved configuration is itself a valid configuration */
	size_t l1, l2;
	char *p1 = print(&c, &l1);

	r = kvd_config_load_string(&c2, "fuzz.ini", p1, &err);
	FUZZ_CHECK(r == 0, "printed configuration refused: line %d: %s: %s\n%s",
		   err.line, err.key, err.msg, p1);
	char *p2 = print(&c2, &l2);

	FUZZ_CHECK(l1 == l2 && !memcmp(p1, p2, l1),
		   "print -> load -> print differs:\n%s\n---\n%s", p1, p2);
	free(p1);
	free(p2);
	free(text);
	return 0;
}

/* Seeds are committed text (tests/fuzz/corpus/config/); these add the
 * resolved forms of the smallest valid configs. */
void fuzz_target_seeds(fuzz_emit_fn emit, void *ctx)
{
	static const char *const seeds[] = {
		"[model]\npath = /dev/null\n[kv]\npool_tokens = 4096\n",
		"[node]\nname = p0\nrole = prefill\n[model]\npath = /dev/null\n"
		"context_length = 2048\n[kv]\nmemory_bytes = 64M\n"
		"capacity_policy = clamp\ndtype = f32\n[listen]\n"
		"peer = 127.0.0.1:7001\n[transfer]\nmax_batch_bytes = 1M\n"
		"checksum = off\n",
		"[node]\nrole = decode\n[model]\npath = /dev/null\n[kv]\n"
		"pool_tokens = 100000\ncapacity_margin = 1.25\n[listen]\n"
		"client = 127.0.0.1:7000,unix:/tmp/kvd.sock\n[peers]\n"
		"prefill = 10.0.0.1:7001, 10.0.0.2:7001\n[admin]\n"
		"socket = none\nmode = 0660\n[log]\nlevel = debug\n",
		/* regression: KNOWN BUG addr-parse-mismatch */
		"[node]\nrole = decode\n[model]\npath = /dev/null\n[kv]\n"
		"pool_tokens = 4096\n[listen]\n"
		"client = 127.0.0.1:7000 ,unix:/tmp/k.sock\n[peers]\n"
		"prefill = prefill-1.internal:7001\n",
	};

	for (size_t i = 0; i < sizeof(seeds) / sizeof(seeds[0]); i++) {
		struct kvd_config c;
		struct kvd_config_error err;
		size_t len;

		emit(ctx, seeds[i], strlen(seeds[i]));
		if (kvd_config_load_string(&c, "seed.ini", seeds[i], &err) == 0) {
			char *p = print(&c, &len);

			emit(ctx, p, len);
			free(p);
		}
	}
}
