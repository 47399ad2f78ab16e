/* test_config.c - the config table, parser and cross-key rules. */
#include "conf/config.h"
#include "conf/util.h"
#include "conf/log.h"
#include "kvd_build.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char model_path[64];

static void setup(void)
{
	int fd;

	snprintf(model_path, sizeof(model_path), "/tmp/kvd-test-model-XXXXXX");
	fd = mkstemp(model_path);
	ck_assert_int_ge(fd, 0);
	close(fd);
}

static void teardown(void)
{
	unlink(model_path);
}

/* A valid base config with `extra` appended (later sections may repeat
 * names: inih allows a section to reopen). */
static int load(struct kvd_config *c, struct kvd_config_error *e,
		const char *extra)
{
	char text[4096];

	snprintf(text, sizeof(text),
		 "[node]\nname = n1\n"
		 "[model]\npath = %s\n"
		 "%s", model_path, extra);
	return kvd_config_load_string(c, "test.ini", text, e);
}

START_TEST(test_defaults_parse)
{
	struct kvd_config c;
	struct kvd_config_error e;

	ck_assert_int_eq(load(&c, &e, "[kv]\npool_tokens = 4096\n"), 0);
	ck_assert_str_eq(c.node_name, "n1");
	ck_assert_int_eq(c.role, KVD_ROLE_STANDALONE);
	ck_assert_uint_eq(c.page_tokens, 16);
	ck_assert_uint_eq(c.pool_tokens, 4096);
	ck_assert_uint_eq(c.max_batch_bytes, 4u << 20);
	ck_assert(c.checksum);
	ck_assert_uint_eq(c.admin_mode, 0660);
	ck_assert_int_eq(c.log_level, KVLOG_INFO);
	ck_assert_int_eq(c.capacity_policy, KVD_CAP_REFUSE);
	ck_assert_str_eq(c.kv_backend, "host");
	ck_assert(c.admin_socket[0] == '/');
	ck_assert(c.pack_cache);
	ck_assert_uint_eq(c.pack_cache_keep_days, 7);
}
END_TEST

/* kvd serve's path: pairs through the same table and checks as a file */
START_TEST(test_pairs)
{
	struct kvd_config c;
	struct kvd_config_error e;
	const struct kvd_config_pair good[] = {
		{ "node.role", "standalone" }, { "model.path", model_path },
		{ "listen.http", "127.0.0.1:8080" }, { "kv.pool_tokens", "512" },
		{ "engine.threads", "2" }, { "admin.socket", "none" },
	};
	const struct kvd_config_pair bad_value[] = {
		{ "model.path", model_path }, { "kv.pool_tokens", "512" },
		{ "engine.threads", "lots" },
	};
	const struct kvd_config_pair bad_rule[] = {
		{ "model.path", model_path }, { "kv.pool_tokens", "512" },
		{ "listen.http", "0.0.0.0:8080" },
	};
	const struct kvd_config_pair unknown[] = { { "kv.pool_tokenz", "1" } };

	ck_assert_int_eq(kvd_config_load_pairs(&c, "kvd serve", good, 6, &e), 0);
	ck_assert_int_eq(c.role, KVD_ROLE_STANDALONE);
	ck_assert_uint_eq(c.pool_tokens, 512);
	ck_assert_uint_eq(c.threads, 2);
	ck_assert_str_eq(c.listen_http, "127.0.0.1:8080");
	ck_assert_str_eq(c.path, "kvd serve");
	ck_assert_int_eq(kvd_config_load_pairs(&c, "kvd serve", bad_value, 3, &e), -1);
	ck_assert_str_eq(e.key, "engine.threads");
	ck_assert(strstr(e.msg, "'lots'") != NULL);
	ck_assert_int_eq(e.line, 0);
	ck_assert_int_eq(kvd_config_load_pairs(&c, "kvd serve", bad_rule, 3, &e), -1);
	ck_assert_str_eq(e.key, "listen.http");
	ck_assert_int_eq(kvd_config_load_pairs(&c, "kvd serve", unknown, 1, &e), -1);
	ck_assert_str_eq(e.key, "kv.pool_tokenz");
}
END_TEST

START_TEST(test_values)
{
	struct kvd_config c;
	struct kvd_config_error e;

	ck_assert_int_eq(load(&c, &e,
			      "[node]\nrole = decode\n"
			      "[kv]\nmemory_bytes = 2G\ncapacity_margin = 1.5\n"
			      "capacity_policy = clamp\ndtype = f32\n"
			      "[peers]\nprefill = 127.0.0.1:7100, [::1]:7101\n"
			      "[transfer]\nchecksum = off\n"
			      "[admin]\nsocket = /tmp/x.sock\nmode = 0600\n"
			      "[log]\nlevel = debug\n"
			      "[model]\npack_cache_keep_days = 0\n"), 0);
	ck_assert_uint_eq(c.pack_cache_keep_days, 0);
	ck_assert_int_eq(c.role, KVD_ROLE_DECODE);
	ck_assert_uint_eq(c.memory_bytes, 2ull << 30);
	ck_assert(c.capacity_margin == 1.5);
	ck_assert_int_eq(c.capacity_policy, KVD_CAP_CLAMP);
	ck_assert_int_eq(c.kv_dtype, 0);
	ck_assert_uint_eq(c.n_peers_prefill, 2);
	ck_assert_str_eq(c.peers_prefill[1], "[::1]:7101");
	ck_assert(!c.checksum);
	ck_assert_str_eq(c.admin_socket, "/tmp/x.sock");
	ck_assert_uint_eq(c.admin_mode, 0600);
	ck_assert_int_eq(c.log_level, KVLOG_DEBUG);

	/* units: a bare G and GiB binary, GB decimal */
	ck_assert_int_eq(load(&c, &e, "[kv]\nmemory_bytes = 4GB\n"
			      "[http]\nmax_body_bytes = 64MB\nmax_header_bytes = 1.5KiB\n"), 0);
	ck_assert_uint_eq(c.memory_bytes, 4000000000ull);
	ck_assert_uint_eq(c.http_max_body_bytes, 64000000);
	ck_assert_uint_eq(c.http_max_header_bytes, 1536);
	ck_assert_int_eq(load(&c, &e, "[kv]\nmemory_bytes = 4GiB\n"), 0);
	ck_assert_uint_eq(c.memory_bytes, 4ull << 30);

	/* a prefill node may listen for HTTP: its probes and /metrics */
	ck_assert_int_eq(load(&c, &e, "[kv]\npool_tokens = 64\n[node]\nrole = prefill\n"
			      "[listen]\npeer = 127.0.0.1:1\nhttp = 127.0.0.1:2\n"), 0);
	ck_assert_int_eq(c.role, KVD_ROLE_PREFILL);
	ck_assert_str_eq(c.listen_http, "127.0.0.1:2");
}
END_TEST

/* Each bad config: the text, the line and key the error must name. The
 * base config takes 4 lines, so the first extra line is line 5. */
static const struct bad {
	const char *what;
	const char *text;
	int line;
	const char *key;
	const char *needle;
} bads[] = {
	{ "unknown section", "[kv]\npool_tokens = 64\n[nosuch]\nx = 1\n", 8, "nosuch.x", "unknown section" },
	{ "unknown key", "[kv]\npool_tokens = 64\npool_tokenz = 1\n", 7, "kv.pool_tokenz", "unknown key" },
	{ "bad integer", "[kv]\npool_tokens = lots\n", 6, "kv.pool_tokens", "not a" },
	{ "negative integer", "[kv]\npool_tokens = -5\n", 6, "kv.pool_tokens", "not a" },
	{ "out of range", "[kv]\npool_tokens = 64\npage_tokens = 0\n", 7, "kv.page_tokens", "out of range" },
	{ "bad size suffix", "[kv]\nmemory_bytes = 4X\n", 6, "kv.memory_bytes", "size" },
	{ "bad size unit names the value", "[kv]\nmemory_bytes = 4GiBs\n", 6, "kv.memory_bytes", "'4GiBs' is not a size" },
	{ "size out of range names the value", "[kv]\nmemory_bytes = 2000TB\n", 6, "kv.memory_bytes", "2000TB is out of range" },
	{ "size past the range", "[http]\nmax_body_bytes = 65MiB\n[kv]\npool_tokens = 64\n", 6, "http.max_body_bytes", "out of range" },
	{ "bad enum", "[kv]\npool_tokens = 64\n[node]\nrole = both\n", 8, "node.role", "not one of" },
	{ "bad bool", "[kv]\npool_tokens = 64\n[transfer]\nchecksum = maybe\n", 8, "transfer.checksum", "boolean" },
	{ "bad number", "[kv]\npool_tokens = 64\ncapacity_margin = 1.2x\n", 7, "kv.capacity_margin", "not a number" },
	{ "margin below 1", "[kv]\npool_tokens = 64\ncapacity_margin = 0.9\n", 7, "kv.capacity_margin", "out of range" },
	{ "duplicate key", "[kv]\npool_tokens = 64\npool_tokens = 65\n", 7, "kv.pool_tokens", "set twice" },
	{ "both pool sizes", "[kv]\npool_tokens = 64\nmemory_bytes = 1M\n", 7, "kv.memory_bytes", "exactly one" },
	{ "no pool size", "[kv]\npage_tokens = 8\n", 0, "kv.pool_tokens", "neither" },
	{ "decode without peers", "[kv]\npool_tokens = 64\n[node]\nrole = decode\n", 8, "peers.prefill", "prefill peer" },
	{ "prefill with peers", "[kv]\npool_tokens = 64\n[node]\nrole = prefill\n[peers]\nprefill = 127.0.0.1:1\n", 10, "peers.prefill", "only decode" },
	{ "bad peer address", "[kv]\npool_tokens = 64\n[node]\nrole = decode\n[peers]\nprefill = hostonly\n", 10, "peers.prefill", "host:port" },
	{ "bad listen address", "[kv]\npool_tokens = 64\n[listen]\nclient = unix:relative\n", 8, "listen.client", "host:port or unix" },
	{ "batch exceeds release timeout", "[kv]\npool_tokens = 64\n[transfer]\nmax_batch_bytes = 1G\nlink_gbps = 1\nrelease_timeout_ms = 1000\n", 10, "transfer.max_batch_bytes", "release_timeout_ms" },
	{ "zero prefill chunk", "[kv]\npool_tokens = 64\n[engine]\nprefill_chunk = 0\n", 8, "engine.prefill_chunk", "out of range" },
	{ "step below max_batch", "[kv]\npool_tokens = 64\n[engine]\nmax_batch = 8\nstep_tokens = 4\n", 9, "engine.step_tokens", "below engine.max_batch" },
	{ "bad octal mode", "[kv]\npool_tokens = 64\n[admin]\nmode = 0999\n", 8, "admin.mode", "octal" },
	{ "keyless http off loopback", "[kv]\npool_tokens = 64\n[listen]\nhttp = 0.0.0.0:8000\n", 8, "listen.http", "not a loopback address" },
	{ "keyless http on prefill off loopback", "[kv]\npool_tokens = 64\n[node]\nrole = prefill\n[listen]\npeer = 127.0.0.1:1\nhttp = 0.0.0.0:2\n", 11, "listen.http", "not a loopback address" },
	{ "client listener on prefill", "[kv]\npool_tokens = 64\n[node]\nrole = prefill\n[listen]\npeer = 127.0.0.1:1\nclient = 127.0.0.1:2\n", 11, "listen.client", "prefill nodes serve no clients" },
	{ "http not host:port", "[kv]\npool_tokens = 64\n[listen]\nhttp = unix:/tmp/x\n", 8, "listen.http", "IPv4:port" },
	{ "api keys without http", "[kv]\npool_tokens = 64\n[http]\napi_keys_file = /nonexistent\n", 8, "http.api_keys_file", "listen.http and listen.client are off" },
	{ "keyless client off loopback", "[kv]\npool_tokens = 64\n[listen]\nclient = 127.0.0.1:1,0.0.0.0:7600\n", 8, "listen.client", "not loopback" },
	{ "api keys file missing", "[kv]\npool_tokens = 64\n[listen]\nhttp = 0.0.0.0:8000\n[http]\napi_keys_file = /nonexistent/keys\n", 10, "http.api_keys_file", "cannot open" },
	{ "key outside section", "", 1, "", "" }, /* handled below */
	{ "bad node name", "", 1, "node.name", "not a name" }, /* handled below */
	{ "relative admin socket", "[kv]\npool_tokens = 64\n[admin]\nsocket = x.sock\n", 8, "admin.socket", "absolute" },
	{ "send timeout above release", "[kv]\npool_tokens = 64\n[transfer]\nrelease_timeout_ms = 2000\nsend_timeout_ms = 3000\n", 9, "transfer.send_timeout_ms", "above transfer.release_timeout_ms" },
	{ "batch exceeds send timeout", "[kv]\npool_tokens = 64\n[transfer]\nmax_batch_bytes = 64M\nlink_gbps = 1\nsend_timeout_ms = 100\n", 10, "transfer.send_timeout_ms", "not within send_timeout_ms=100" },
	{ "heartbeat vs release", "[kv]\npool_tokens = 64\n[transfer]\nheartbeat_ms = 3000\nrelease_timeout_ms = 5000\n", 8, "transfer.heartbeat_ms", "heartbeats" },
	{ "host name with an underscore in peers", "[kv]\npool_tokens = 64\n[node]\nrole = decode\n[peers]\nprefill = prefill_1.internal:7001\n", 10, "peers.prefill", "name:port (an RFC 1123 host name" },
	{ "host name without a port in peers", "[kv]\npool_tokens = 64\n[node]\nrole = decode\n[peers]\nprefill = 127.0.0.1:1,prefill.internal\n", 10, "peers.prefill", "'prefill.internal' is not" },
	{ "resolve interval too short", "[kv]\npool_tokens = 64\n[peers]\nresolve_interval_ms = 10\n", 8, "peers.resolve_interval_ms", "out of range" },
	{ "value too long to print back", "", 8, "listen.client", "too long" }, /* handled below */
	{ "syntax error", "[kv]\npool_tokens = 64\nthis is not ini\n", 7, "", "syntax" },
	{ "verbs key with tcp", "[kv]\npool_tokens = 64\n[transfer]\nverbs_qp_depth = 64\n", 8, "transfer.verbs_qp_depth", "only with transfer.transport=verbs" },
	{ "verbs device with tcp", "[kv]\npool_tokens = 64\n[transfer]\nverbs_device = emu:/tmp\n", 8, "transfer.verbs_device", "transport is tcp" },
	{ "emu relative dir", "[kv]\npool_tokens = 64\n[transfer]\ntransport = verbs\nverbs_device = emu:tmp\n", 9, "transfer.verbs_device", "absolute" },
	{ "emu empty dir", "[kv]\npool_tokens = 64\n[transfer]\ntransport = verbs\nverbs_device = emu:,auto=1\n", 9, "transfer.verbs_device", "absolute" },
	{ "emu missing dir", "[kv]\npool_tokens = 64\n[transfer]\ntransport = verbs\nverbs_device = emu:/nonexistent-kvd-dir,auto=1\n", 9, "transfer.verbs_device", "not a directory" },
	{ "bad verbs device name", "[kv]\npool_tokens = 64\n[transfer]\ntransport = verbs\nverbs_device = mlx5 0\n", 9, "transfer.verbs_device", "not a device name" },
	{ "qp depth too small", "[kv]\npool_tokens = 64\n[transfer]\ntransport = verbs\nverbs_qp_depth = 2\n", 9, "transfer.verbs_qp_depth", "out of range" },
	{ "write scope unknown", "[kv]\npool_tokens = 64\n[transfer]\ntransport = verbs\nverbs_write_scope = windows\n", 9, "transfer.verbs_write_scope", "auto, mw, mr" },
	{ "write scope with tcp", "[kv]\npool_tokens = 64\n[transfer]\nverbs_write_scope = mr\n", 8, "transfer.verbs_write_scope", "only with transfer.transport=verbs" },
	{ "flush timeout too small", "[kv]\npool_tokens = 64\n[transfer]\ntransport = verbs\nverbs_flush_timeout_ms = 1\n", 9, "transfer.verbs_flush_timeout_ms", "out of range" },
	{ "inline too large", "[kv]\npool_tokens = 64\n[transfer]\ntransport = verbs\nverbs_inline = 5000\n", 9, "transfer.verbs_inline", "out of range" },
	{ "inline not a size", "[kv]\npool_tokens = 64\n[transfer]\ntransport = verbs\nverbs_inline = big\n", 9, "transfer.verbs_inline", "'big' is not auto or a non-negative integer" },
	{ "inline negative", "[kv]\npool_tokens = 64\n[transfer]\ntransport = verbs\nverbs_inline = -1\n", 9, "transfer.verbs_inline", "not auto or a non-negative integer" },
	{ "inline Auto", "[kv]\npool_tokens = 64\n[transfer]\ntransport = verbs\nverbs_inline = Auto\n", 9, "transfer.verbs_inline", "'Auto' is not auto" },
	{ "inline past u32", "[kv]\npool_tokens = 64\n[transfer]\ntransport = verbs\nverbs_inline = 4294967295\n", 9, "transfer.verbs_inline", "out of range [0, 4096]" },
	{ "inline number with tcp", "[kv]\npool_tokens = 64\n[transfer]\nverbs_inline = 64\n", 8, "transfer.verbs_inline", "only with transfer.transport=verbs" },
	{ "verbs with encrypt", "", 0, "transfer.encrypt", "in the clear" }, /* handled below */
	{ "keep days negative", "[kv]\npool_tokens = 64\n[model]\npack_cache_keep_days = -1\n", 8, "model.pack_cache_keep_days", "not a" },
	{ "keep days not a number", "[kv]\npool_tokens = 64\n[model]\npack_cache_keep_days = week\n", 8, "model.pack_cache_keep_days", "not a" },
	{ "keep days too large", "[kv]\npool_tokens = 64\n[model]\npack_cache_keep_days = 3651\n", 8, "model.pack_cache_keep_days", "out of range" },
	{ "port zero", "[kv]\npool_tokens = 64\n[transfer]\ntransport = verbs\nverbs_port = 0\n", 9, "transfer.verbs_port", "out of range" },
};

START_TEST(test_bad)
{
	const struct bad *b = &bads[_i];
	struct kvd_config c;
	struct kvd_config_error e;

	if (strcmp(b->what, "key outside section") == 0) {
		ck_assert_int_eq(kvd_config_load_string(&c, "t.ini", "x = 1\n", &e), -1);
		ck_assert_int_eq(e.line, 1);
		ck_assert_str_eq(e.key, "x");
		return;
	}
	if (strcmp(b->what, "value too long to print back") == 0) {
		/* fits the reader as "client=...", not printed as
		 * "client = ...": refused, so --check-config output reloads */
		char text[512], path[256];

		memset(path, 'p', 184);
		path[184] = '\0';
		snprintf(text, sizeof(text),
			 "[kv]\npool_tokens = 64\n[listen]\nclient=unix:/%s\n", path);
		ck_assert_int_eq(load(&c, &e, text), -1);
		ck_assert_int_eq(e.line, b->line);
		ck_assert_str_eq(e.key, b->key);
		ck_assert(strstr(e.msg, b->needle) != NULL);
		return;
	}
	if (strcmp(b->what, "verbs with encrypt") == 0) {
		/* encrypt needs a key file: a private one, so the refusal
		 * is the transport's */
		char kf[64], text[512];
		int fd;

		snprintf(kf, sizeof(kf), "/tmp/kvd-test-key-XXXXXX");
		fd = mkstemp(kf);
		ck_assert_int_ge(fd, 0);
		ck_assert_int_eq(write(fd, "0123456789abcdef0123456789abcdef!", 33), 33);
		close(fd);
		snprintf(text, sizeof(text),
			 "[kv]\npool_tokens = 64\n[peers]\nkey_file = %s\n"
			 "[transfer]\nencrypt = on\ntransport = verbs\n"
			 "verbs_device = emu:/tmp\n", kf);
		ck_assert_int_eq(load(&c, &e, text), -1);
		ck_assert_int_eq(e.line, 11);
		ck_assert_str_eq(e.key, b->key);
		ck_assert(strstr(e.msg, b->needle) != NULL);
		/* the same with tcp loads */
		snprintf(text, sizeof(text),
			 "[kv]\npool_tokens = 64\n[peers]\nkey_file = %s\n"
			 "[transfer]\nencrypt = on\n", kf);
		ck_assert_int_eq(load(&c, &e, text), 0);
		unlink(kf);
		return;
	}
	if (strcmp(b->what, "bad node name") == 0) {
		ck_assert_int_eq(kvd_config_load_string(&c, "t.ini",
			"[node]\nname = a b\n", &e), -1);
		ck_assert_int_eq(e.line, 2);
		ck_assert_str_eq(e.key, "node.name");
		ck_assert(strstr(e.msg, "not a name") != NULL);
		return;
	}
	ck_assert_msg(load(&c, &e, b->text) == -1, "%s: accepted", b->what);
	ck_assert_msg(e.line == b->line, "%s: line %d, want %d (%s)", b->what,
		      e.line, b->line, e.msg);
	ck_assert_msg(strcmp(e.key, b->key) == 0, "%s: key '%s', want '%s'",
		      b->what, e.key, b->key);
	ck_assert_msg(strstr(e.msg, b->needle) != NULL, "%s: msg '%s'",
		      b->what, e.msg);
	ck_assert_str_eq(e.file, "test.ini");
}
END_TEST

/* The verbs keys: defaults, the emulated device in every build, a real
 * device name only in a build with libibverbs. */
START_TEST(test_verbs_keys)
{
	struct kvd_config c;
	struct kvd_config_error e;

	ck_assert_int_eq(load(&c, &e, "[kv]\npool_tokens = 64\n"), 0);
	ck_assert_int_eq(c.transport, KVD_TRANSPORT_TCP);
	ck_assert_str_eq(kvd_transport_name(c.transport), "tcp");
	ck_assert_str_eq(c.verbs_device, "");
	ck_assert_uint_eq(c.verbs_port, 1);
	ck_assert_uint_eq(c.verbs_gid_index, 0);
	ck_assert_uint_eq(c.verbs_qp_depth, 128);
	ck_assert_uint_eq(c.verbs_inline, KVD_VERBS_INLINE_AUTO);
	ck_assert_int_eq(c.verbs_write_scope, KVD_VERBS_SCOPE_AUTO);
	ck_assert_uint_eq(c.verbs_flush_timeout_ms, 5000);
	/* the defaults written out load with tcp (kvd --check-config
	 * prints every key) */
	ck_assert_int_eq(load(&c, &e, "[kv]\npool_tokens = 64\n[transfer]\n"
			      "verbs_device = \nverbs_port = 1\nverbs_gid_index = 0\n"
			      "verbs_qp_depth = 128\nverbs_inline = auto\n"
			      "verbs_write_scope = auto\nverbs_flush_timeout_ms = 5000\n"), 0);
	ck_assert_uint_eq(c.verbs_inline, KVD_VERBS_INLINE_AUTO);
	ck_assert_int_eq(load(&c, &e, "[kv]\npool_tokens = 64\n[transfer]\n"
			      "transport = verbs\nverbs_device = emu:/tmp,auto=1,mw=0\n"
			      "verbs_port = 2\nverbs_gid_index = 3\n"
			      "verbs_qp_depth = 32\nverbs_inline = 0\n"
			      "verbs_write_scope = mr\nverbs_flush_timeout_ms = 250\n"), 0);
	ck_assert_int_eq(c.verbs_write_scope, KVD_VERBS_SCOPE_MR);
	ck_assert_uint_eq(c.verbs_flush_timeout_ms, 250);
	ck_assert_int_eq(c.transport, KVD_TRANSPORT_VERBS);
	ck_assert_str_eq(kvd_transport_name(c.transport), "verbs");
	ck_assert_str_eq(c.verbs_device, "emu:/tmp,auto=1,mw=0");
	ck_assert_uint_eq(c.verbs_port, 2);
	ck_assert_uint_eq(c.verbs_gid_index, 3);
	ck_assert_uint_eq(c.verbs_qp_depth, 32);
	ck_assert_uint_eq(c.verbs_inline, 0);
	/* a number keeps its meaning, at both ends of the range */
	for (uint32_t n = 0; n <= 4096; n += 4096) {
		char text[160];

		snprintf(text, sizeof(text), "[kv]\npool_tokens = 64\n[transfer]\n"
			 "transport = verbs\nverbs_device = emu:/tmp\nverbs_inline = %u\n", n);
		ck_assert_int_eq(load(&c, &e, text), 0);
		ck_assert_uint_eq(c.verbs_inline, n);
	}
	ck_assert_int_eq(load(&c, &e, "[kv]\npool_tokens = 64\n[transfer]\n"
			      "transport = verbs\nverbs_device = emu:/tmp\nverbs_inline = 104\n"), 0);
	ck_assert_uint_eq(c.verbs_inline, 104);
	/* auto prints back as auto, a number as itself (kvd --check-config
	 * output is a config that loads to the same values) */
	{
		char *buf = NULL;
		size_t len = 0;
		FILE *m = open_memstream(&buf, &len);

		ck_assert_ptr_nonnull(m);
		kvd_config_print(m, &c);
		ck_assert_int_eq(load(&c, &e, "[kv]\npool_tokens = 64\n[transfer]\n"
				      "transport = verbs\nverbs_device = emu:/tmp\nverbs_inline = auto\n"), 0);
		ck_assert_uint_eq(c.verbs_inline, KVD_VERBS_INLINE_AUTO);
		kvd_config_print(m, &c);
		ck_assert_int_eq(fclose(m), 0);
		ck_assert_ptr_nonnull(strstr(buf, "\nverbs_inline = 104\n"));
		ck_assert_ptr_nonnull(strstr(buf, "\nverbs_inline = auto\n"));
		free(buf);
	}
	ck_assert_int_eq(load(&c, &e, "[kv]\npool_tokens = 64\n[transfer]\n"
			      "transport = verbs\nverbs_device = emu:/tmp\n"
			      "verbs_write_scope = mw\n"), 0);
	ck_assert_int_eq(c.verbs_write_scope, KVD_VERBS_SCOPE_MW);
	/* a real device (or the first one) needs libibverbs */
	ck_assert_int_eq(load(&c, &e, "[kv]\npool_tokens = 64\n[transfer]\n"
			      "transport = verbs\nverbs_device = mlx5_0\n"),
			 KVD_HAVE_VERBS ? 0 : -1);
	if (!KVD_HAVE_VERBS) {
		ck_assert_str_eq(e.key, "transfer.transport");
		ck_assert(strstr(e.msg, "without libibverbs") != NULL);
	}
}
END_TEST

/* Address lists are stored trimmed: what the listeners get is what was
 * checked. */
START_TEST(test_addr_normalized)
{
	struct kvd_config c;
	struct kvd_config_error e;

	ck_assert_int_eq(load(&c, &e, "[kv]\npool_tokens = 64\n[listen]\n"
			      "client = 127.0.0.1:7000 , unix:/tmp/x.sock\n"), 0);
	ck_assert_str_eq(c.listen_client, "127.0.0.1:7000,unix:/tmp/x.sock");
	ck_assert_int_eq(load(&c, &e, "[kv]\npool_tokens = 64\n[listen]\n"
			      "client = localhost:7000,[::1]:7001\n"), 0);
}
END_TEST

START_TEST(test_missing_model)
{
	struct kvd_config c;
	struct kvd_config_error e;

	ck_assert_int_eq(kvd_config_load_string(&c, "t.ini",
		"[model]\npath = /nonexistent/m.gguf\n[kv]\npool_tokens = 1\n", &e), -1);
	ck_assert_str_eq(e.key, "model.path");
	ck_assert_int_eq(e.line, 2);
	ck_assert_int_eq(kvd_config_load_string(&c, "t.ini",
		"[kv]\npool_tokens = 1\n", &e), -1);
	ck_assert_str_eq(e.key, "model.path");
}
END_TEST

START_TEST(test_long_line)
{
	struct kvd_config c;
	struct kvd_config_error e;
	char text[2048];

	snprintf(text, sizeof(text), "[model]\npath = /%0600d\n", 7);
	ck_assert_int_eq(kvd_config_load_string(&c, "t.ini", text, &e), -1);
	ck_assert_int_eq(e.line, 2);
	ck_assert(strstr(e.msg, "longer") != NULL);
}
END_TEST

START_TEST(test_file_errors)
{
	struct kvd_config c;
	struct kvd_config_error e;
	char path[64] = "/tmp/kvd-test-ini-XXXXXX";
	int fd = mkstemp(path);
	FILE *f;

	ck_assert_int_lt(kvd_config_load(&c, "/nonexistent/kvd.ini", &e), 0);
	ck_assert(strstr(e.msg, "cannot open") != NULL);
	ck_assert_int_ge(fd, 0);
	f = fdopen(fd, "w");
	fprintf(f, "[model]\npath = %s\n[kv]\npool_tokens = 64\n\n[kv]\nbogus = 1\n",
		model_path);
	fclose(f);
	ck_assert_int_eq(kvd_config_load(&c, path, &e), -1);
	ck_assert_str_eq(e.file, path);
	ck_assert_int_eq(e.line, 7);
	ck_assert_str_eq(e.key, "kv.bogus");
	unlink(path);
}
END_TEST

/* Peering without a key is allowed over loopback only: exactly these. */
START_TEST(test_loopback_addresses)
{
	static const char *const yes[] = { "127.0.0.1:7000", "127.9.9.9:1", "localhost:80",
					   "[::1]:7", "[::ffff:127.0.0.2]:7" };
	static const char *const no[] = { "10.77.0.1:7000", "128.0.0.1:1", "0.0.0.0:1",
					  "[::2]:7", "[::]:7", "[::ffff:10.0.0.1]:7",
					  "localhost", "127.0.0.1", ":7", "[::1:7",
					  "127.0.0.1:0", "127.0.0.1:70000", "example.com:1" };

	for (size_t i = 0; i < KVD_ARRAY_SIZE(yes); i++)
		ck_assert_msg(kvd_hostport_is_loopback(yes[i]), "%s is loopback", yes[i]);
	for (size_t i = 0; i < KVD_ARRAY_SIZE(no); i++)
		ck_assert_msg(!kvd_hostport_is_loopback(no[i]), "%s is not loopback", no[i]);
}
END_TEST

/* peers.prefill names (RFC 1123, bounded): exactly these are names; IP
 * literals and localhost stay addresses. */
START_TEST(test_peer_names)
{
	static const char *const yes[] = { "prefill.kvd.test:7000", "a:1", "p-1.svc.cluster.local:65535",
					   "X9:2", "1a.example:3", "prefill.10.example:4" };
	static const char *const no[] = { "127.0.0.1:7000", "localhost:7", "[::1]:7", "10.0.0.300:7",
					  "1.2.3:7", "prefill.kvd.test", "prefill.kvd.test:0",
					  "prefill.kvd.test:65536", "prefill.kvd.test:x", ":7",
					  "-a.test:7", "a-.test:7", "a..test:7", ".a.test:7", "a.test.:7",
					  "a_b.test:7", "a b.test:7", "a.test:7:8", "\x1b[31m.test:7" };
	char host[KVD_PEER_NAME_MAX + 1], lab[80], big[400];
	uint16_t port = 0;

	for (size_t i = 0; i < KVD_ARRAY_SIZE(yes); i++)
		ck_assert_msg(kvd_peer_name_split(yes[i], host, &port) == 0, "%s is a name", yes[i]);
	ck_assert_int_eq(kvd_peer_name_split("prefill.kvd.test:7000", host, &port), 0);
	ck_assert_str_eq(host, "prefill.kvd.test");
	ck_assert_uint_eq(port, 7000);
	for (size_t i = 0; i < KVD_ARRAY_SIZE(no); i++)
		ck_assert_msg(kvd_peer_name_split(no[i], host, &port) != 0, "%s is not a name", no[i]);
	/* a label of 63 is one, of 64 not */
	memset(lab, 'a', 64);
	snprintf(lab + 63, sizeof(lab) - 63, ".t:1");
	ck_assert_int_eq(kvd_peer_name_split(lab, host, &port), 0);
	memset(lab, 'a', 64);
	snprintf(lab + 64, sizeof(lab) - 64, ".t:1");
	ck_assert_int_ne(kvd_peer_name_split(lab, host, &port), 0);
	/* KVD_PEER_NAME_MAX characters are a name, one more not */
	for (size_t i = 0; i < KVD_PEER_NAME_MAX; i++)
		big[i] = i % 10 == 5 ? '.' : 'b';
	snprintf(big + KVD_PEER_NAME_MAX, sizeof(big) - KVD_PEER_NAME_MAX, ":9");
	ck_assert_int_eq(kvd_peer_name_split(big, host, &port), 0);
	ck_assert_uint_eq(strlen(host), KVD_PEER_NAME_MAX);
	big[KVD_PEER_NAME_MAX] = 'b';
	snprintf(big + KVD_PEER_NAME_MAX + 1, sizeof(big) - KVD_PEER_NAME_MAX - 1, ":9");
	ck_assert_int_ne(kvd_peer_name_split(big, host, &port), 0);
}
END_TEST

/* A decode node takes a name in peers.prefill, keyless too (its
 * addresses are checked once resolved), with the re-resolve period. */
START_TEST(test_peer_name_config)
{
	struct kvd_config c;
	struct kvd_config_error e;

	ck_assert_int_eq(load(&c, &e, "[kv]\npool_tokens = 64\n[node]\nrole = decode\n[peers]\n"
			      "prefill = prefill.kvd.test:7000, 127.0.0.1:7001\n"
			      "resolve_interval_ms = 250\n"), 0);
	ck_assert_uint_eq(c.n_peers_prefill, 2);
	ck_assert_str_eq(c.peers_prefill[0], "prefill.kvd.test:7000");
	ck_assert_uint_eq(c.peers_resolve_interval_ms, 250);
	ck_assert_int_eq(load(&c, &e, "[kv]\npool_tokens = 64\n[node]\nrole = decode\n[peers]\n"
			      "prefill = prefill.kvd.test:7000\n"), 0);
	ck_assert_uint_eq(c.peers_resolve_interval_ms, 5000);
	/* an IP literal off loopback is still refused without a key */
	ck_assert_int_eq(load(&c, &e, "[kv]\npool_tokens = 64\n[node]\nrole = decode\n[peers]\n"
			      "prefill = prefill.kvd.test:7000,10.0.0.1:7000\n"), -1);
	ck_assert_str_eq(e.key, "peers.prefill");
	ck_assert(strstr(e.msg, "not a loopback address") != NULL);
}
END_TEST

/* The committed example is what the table prints: they cannot drift. */
START_TEST(test_example_matches_table)
{
	const char *src = getenv("KVD_SRC");
	char path[1024], *want = NULL, *got = NULL;
	size_t want_n = 0, got_n = 0;
	FILE *f, *mem;
	long n;

	if (!src)
		return;
	snprintf(path, sizeof(path), "%s/conf/kvd.example.ini", src);
	f = fopen(path, "r");
	ck_assert_msg(f != NULL, "missing %s", path);
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	rewind(f);
	want = malloc((size_t)n + 1);
	want_n = fread(want, 1, (size_t)n, f);
	want[want_n] = '\0';
	fclose(f);
	mem = open_memstream(&got, &got_n);
	kvd_config_example(mem);
	fclose(mem);
	ck_assert_msg(strcmp(want, got) == 0,
		      "conf/kvd.example.ini is stale: regenerate with kvd --config-example");
	free(want);
	free(got);
}
END_TEST

/* Every key in the reference; the example parses back to the defaults. */
START_TEST(test_reference_and_example_parse)
{
	struct kvd_config c, d;
	struct kvd_config_error e;
	char *ex = NULL, *ref = NULL, text[32768];
	size_t n = 0, rn = 0;
	FILE *mem = open_memstream(&ex, &n);

	kvd_config_example(mem);
	fclose(mem);
	mem = open_memstream(&ref, &rn);
	kvd_config_reference(mem);
	fclose(mem);
	ck_assert(strstr(ref, "transfer.max_batch_bytes") != NULL);
	ck_assert(strstr(ref, "kv.capacity_policy") != NULL);
	ck_assert(strstr(ref, "transfer.verbs_inline\n    type: auto | integer, 0..4096\n    default: auto\n") != NULL);
	/* the example is all comments: with the two required keys it loads
	 * to exactly the defaults. */
	ck_assert_int_lt(snprintf(text, sizeof(text), "%s\n[model]\npath = %s\n[kv]\npool_tokens = 64\n",
				  ex, model_path), (int)sizeof(text));
	ck_assert_int_eq(kvd_config_load_string(&c, "ex.ini", text, &e), 0);
	ck_assert_int_eq(load(&d, &e, "[kv]\npool_tokens = 64\n"), 0);
	ck_assert_uint_eq(c.page_tokens, d.page_tokens);
	ck_assert_uint_eq(c.max_batch_bytes, d.max_batch_bytes);
	free(ex);
	free(ref);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("config");
	TCase *tc = tcase_create("config");
	SRunner *sr;
	int failed;

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_defaults_parse);
	tcase_add_test(tc, test_values);
	tcase_add_test(tc, test_pairs);
	tcase_add_loop_test(tc, test_bad, 0, (int)(sizeof(bads) / sizeof(bads[0])));
	tcase_add_test(tc, test_addr_normalized);
	tcase_add_test(tc, test_verbs_keys);
	tcase_add_test(tc, test_missing_model);
	tcase_add_test(tc, test_long_line);
	tcase_add_test(tc, test_file_errors);
	tcase_add_test(tc, test_example_matches_table);
	tcase_add_test(tc, test_loopback_addresses);
	tcase_add_test(tc, test_peer_names);
	tcase_add_test(tc, test_peer_name_config);
	tcase_add_test(tc, test_reference_and_example_parse);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
