/* config.h - kvd's configuration: one table, one struct.
 *
 * Every key is declared once, in the table in config.c (section, key, type,
 * default, range, help). The INI parser, `kvd --config-reference` and
 * conf/kvd.example.ini all come from that table, so they cannot drift.
 *
 * kvd_config_load() reads an INI file with inih. Unknown sections or keys,
 * bad types, out-of-range values and contradictory settings are errors
 * naming FILE:LINE and the key; the caller exits 78 (EX_CONFIG).
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#define KVD_EX_CONFIG 78
#define KVD_MAX_PEERS 16
/* The longest host name a peers.prefill entry may hold (name:port fits
 * in an entry's 256 bytes). */
#define KVD_PEER_NAME_MAX 200

enum kvd_role { KVD_ROLE_PREFILL, KVD_ROLE_DECODE, KVD_ROLE_STANDALONE };
enum kvd_cap_policy { KVD_CAP_REFUSE, KVD_CAP_CLAMP };
enum kvd_transport { KVD_TRANSPORT_TCP, KVD_TRANSPORT_VERBS };
/* transfer.verbs_write_scope */
enum kvd_verbs_scope { KVD_VERBS_SCOPE_AUTO, KVD_VERBS_SCOPE_MW, KVD_VERBS_SCOPE_MR };
/* transfer.verbs_inline = auto: the transport asks the device (never a
 * size: the largest number the key takes is 4096) */
#define KVD_VERBS_INLINE_AUTO UINT32_MAX

struct kvd_config {
	/* [node] */
	char node_name[64];
	enum kvd_role role;
	uint32_t drain_timeout_ms;    /* drain aborts what is left after this */
	/* [model] */
	char model_path[1024];
	uint32_t context_length;      /* 0 = the model's */
	int chat_template;            /* 0 auto, else enum chat_format
				       * (gpu/text/chat.h) by the same index */
	bool chat_template_unsafe;    /* accept a format whose markers are text */
	char fingerprint_cache[1024]; /* "", "off" or an absolute directory */
	bool pack_cache;              /* repack cache in that directory (gpu/model/prepack.h) */
	uint32_t pack_cache_keep_days; /* cleanup: other pack files unused this long go */
	/* [kv] */
	uint32_t page_tokens;
	uint64_t pool_tokens;         /* exactly one of pool_tokens, memory_bytes */
	uint64_t memory_bytes;
	double capacity_margin;       /* >= 1.0 */
	enum kvd_cap_policy capacity_policy;
	int kv_dtype;                 /* enum kv_dtype */
	int kv_backend_id;            /* index: host, cuda */
	char kv_backend[16];          /* "host" | "cuda" (derived) */
	/* [engine] */
	uint32_t threads;
	uint32_t max_batch;           /* running requests per decode step */
	uint32_t prefill_chunk;       /* prompt tokens per request per step */
	uint32_t step_tokens;         /* tokens per step; 0 = max_batch + chunk */
	uint32_t step_ms;             /* step time target with decoders; 0 = none */
	/* [cache] */
	bool cache_enabled;           /* the prefix cache (gpu/kv/pcache.h) */
	uint32_t cache_max_pages;     /* 0 = half the pool */
	uint32_t cache_tenant_pages;  /* per tenant; 0 = cache_max_pages */
	bool cache_decode_reuse;      /* decode: keep received prompt pages,
				       * compute on cached ones locally */
	/* [listen] */
	char listen_client[256];      /* host:port and/or unix:PATH, comma list */
	char listen_peer[256];
	uint32_t max_clients;         /* client connections at once */
	uint32_t client_idle_timeout_ms;
	uint32_t client_read_timeout_ms;
	uint64_t write_queue_soft;    /* bytes queued: stop reading past this */
	uint64_t write_queue_hard;    /* bytes queued: close past this */
	uint32_t write_stall_timeout_ms;
	char listen_http[256];        /* OpenAI-compatible HTTP: host:port; "" off */
	/* [http] */
	char http_api_keys_file[1024]; /* KEY TENANT lines; "" = loopback only */
	uint64_t http_max_header_bytes;  /* request line + headers */
	uint64_t http_max_body_bytes;    /* one request body */
	uint32_t http_header_timeout_ms; /* head complete within, from its first byte */
	uint32_t http_read_timeout_ms;   /* whole request within, from its first byte */
	uint32_t http_idle_timeout_ms;   /* keep-alive: idle connection closed after */
	char http_model_name[128];     /* /v1/models id; "" = the model file's name */
	uint32_t http_default_max_tokens; /* max_tokens not given: cap; 0 = rest of context */
	uint32_t http_max_n;            /* most choices (n) of one request */
	bool http_chat_page;          /* GET / serves the chat page (http_page.c) */
	char http_cors_origins[1024];  /* CORS allow-list, comma-separated; "" = off */
	bool http_parse_special;       /* /v1/completions: "<|...|>" text -> control tokens */
	bool http_metrics_vllm_names;  /* /metrics also under vLLM's names */
	/* [tenants] admission (daemon/node/fairq.h); the keys file may override
	 * share and the max_* per tenant */
	uint32_t tenant_share;        /* weight in the batch */
	uint32_t tenant_max_active;   /* admitted at once; 0 = the node's */
	uint32_t tenant_max_queued;   /* waiting; 0 = none (429 when busy) */
	uint32_t tenant_max_tokens;   /* prompt + max_tokens admitted; 0 = any */
	uint32_t tenant_queue_timeout_ms; /* a queued request waits at most */
	uint32_t node_max_active;     /* requests admitted at once; 0 = max_batch */
	/* [peers] */
	char peers_prefill[KVD_MAX_PEERS][256];
	uint32_t n_peers_prefill;
	uint32_t peers_resolve_interval_ms; /* decode: a name's re-resolve period */
	char key_file[1024];          /* cluster secret; "" = loopback only */
	uint32_t peer_max_requests;   /* in flight per peer (prefill) */
	uint32_t peer_max_pages;      /* pages per peer; 0 = automatic */
	uint32_t peer_max_links;      /* control links per peer node (prefill) */
	uint32_t failover_retries;    /* decode: placements again after a
				       * lost or refusing prefill; 0 = off */
	uint32_t local_prefill;       /* decode: local prompt speed, % of a
				       * prefill peer; 0 = never local */
	/* [transfer] */
	enum kvd_transport transport;
	uint64_t max_batch_bytes;
	uint32_t release_timeout_ms;
	uint32_t send_timeout_ms;     /* prefill: a request's batches without
				       * progress this long end it; 0 =
				       * release_timeout_ms */
	double link_gbps;
	bool checksum;
	uint32_t connect_timeout_ms;
	uint32_t prefill_timeout_ms;
	uint32_t transfer_timeout_ms;
	uint32_t heartbeat_ms;
	bool encrypt;                 /* AEAD on control frames and KV batches */
	char verbs_device[256];       /* RDMA device name or emu:DIR[,opts];
				       * "" = the first device */
	uint32_t verbs_port;          /* port number on the device (1..) */
	uint32_t verbs_gid_index;     /* GID table index (RoCE) */
	uint32_t verbs_qp_depth;      /* outstanding send WRs per QP */
	uint32_t verbs_inline;        /* bytes a WR may carry inline, or
				       * KVD_VERBS_INLINE_AUTO */
	enum kvd_verbs_scope verbs_write_scope;
	uint32_t verbs_flush_timeout_ms; /* flush drain bound after a lost link */
	/* [admin] */
	char admin_socket[256];
	uint32_t admin_mode;          /* octal file mode of the socket */
	char admin_group[64];         /* empty = root only */
	/* [log] */
	int log_level;                /* enum kvlog_level */
	/* where the file came from */
	char path[1024];
	bool path_is_file;            /* path names the INI read (kvd_config_load);
				       * false for a string or kvd serve's flags */
};

/* A parse or validation problem. */
struct kvd_config_error {
	char file[1024];
	int line;             /* 0 when the problem is not on one line */
	char key[96];         /* "section.key" or "" */
	char msg[512];
};

/* Fill `c` with every key's default. */
void kvd_config_defaults(struct kvd_config *c);
/* Load and validate `path`. 0, or -1 with `err` filled (EX_CONFIG case), or
 * a negative errno when the file cannot be read (err filled too). */
int kvd_config_load(struct kvd_config *c, const char *path,
		    struct kvd_config_error *err);
/* Same, from a string (tests); `name` is used in error messages. */
int kvd_config_load_string(struct kvd_config *c, const char *name,
			   const char *text, struct kvd_config_error *err);
/* What the start needs of this machine beyond the file, checked as the
 * start will meet it, so --check-config fails exactly when the start
 * would: the admin socket's directory (admin.socket, resolved) exists, is
 * a directory, and this user may create the socket in it. 0, or -1 with
 * err naming admin.socket, the directory, the cause and the ways out. */
int kvd_config_check_host(const struct kvd_config *c,
			  struct kvd_config_error *err);
/* A config without a file (kvd serve's flags): the defaults, then each
 * pair's "section.key" = value through the same key table, setters and
 * checks as a file's lines; `name` stands for the file in errors, which
 * name the key. 0, or -1 with err filled. */
struct kvd_config_pair {
	const char *key;           /* "section.key" */
	const char *value;
};
int kvd_config_load_pairs(struct kvd_config *c, const char *name,
			  const struct kvd_config_pair *pairs, size_t n,
			  struct kvd_config_error *err);
/* Cross-key checks; also run by kvd_config_load. */
int kvd_config_validate(struct kvd_config *c, struct kvd_config_error *err);

/* Print "FILE:LINE: key: message". */
void kvd_config_error_print(FILE *out, const struct kvd_config_error *err);
/* The same line, without the newline, into buf (NUL-ended, cut to fit). */
void kvd_config_error_format(const struct kvd_config_error *err, char *buf, size_t size);
/* Print the documented reference (every key, type, default, range, help). */
void kvd_config_reference(FILE *out);
/* Print an example INI (every key at its default, commented). */
void kvd_config_example(FILE *out);
/* Print the resolved configuration as INI. */
void kvd_config_print(FILE *out, const struct kvd_config *c);

const char *kvd_role_name(enum kvd_role r);
/* The model id clients see (/v1/models, metrics' model_name):
 * http.model_name, or the model file's name without .gguf. */
void kvd_config_model_name(const struct kvd_config *c, char *out, size_t size);
/* True when host:port names a loopback address (127/8, ::1, localhost). */
bool kvd_hostport_is_loopback(const char *hostport);
/* s is name:port, name an RFC 1123 host name (not an IP address nor
 * localhost, which is_hostport takes): 0 with host and *port set, else
 * -1. */
int kvd_peer_name_split(const char *s, char host[KVD_PEER_NAME_MAX + 1], uint16_t *port);
const char *kvd_cap_policy_name(enum kvd_cap_policy p);
/* "tcp" or "verbs" */
const char *kvd_transport_name(enum kvd_transport t);
