/* config.c - the configuration table and everything generated from it.
 *
 * Design: each key is one row of `conf_keys[]`: where it lives (section,
 * key), how to parse it (type, range, choices), its default as the string a
 * user would write, a help sentence, and the offset of its field in struct
 * kvd_config. Loading is then generic: defaults are applied by parsing each
 * row's default string through the same parser as the file, so a default
 * can never be a value the parser would reject. The reference text and the
 * example INI are printed from the same rows.
 *
 * inih does not hand line numbers to its handler in Debian's build, so we
 * feed it through ini_parse_stream() with our own line reader that counts
 * lines; the handler then knows the line of every key. The reader also
 * catches lines longer than the parser's buffer, which inih would otherwise
 * split silently.
 *
 * Only the first error is reported (with FILE:LINE and the key): the caller
 * exits 78 at once and the operator fixes one thing at a time. Cross-key
 * rules ("exactly one of", role-specific keys, the transfer bound against
 * the release timeout) run after the file is read and name the line of the
 * key that makes the set contradictory.
 */
#include "conf/config.h"
#include "conf/keyfile.h"
#include "conf/apikeys.h"
#include "conf/log.h"
#include "conf/util.h"
#include "kvd_build.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <ini.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Longest line inih's reader takes (its buffer is INI_MAX_LINE = 200,
 * less CR, LF and NUL). */
#define CONF_LINE_MAX 197

enum conf_type {
	CT_STR,     /* char[] field; max = buffer size */
	CT_NAME,    /* char[] of [A-Za-z0-9_.-] */
	CT_U32,
	CT_U32_AUTO, /* u32, or "auto" stored as UINT32_MAX (max < it) */
	CT_U64,
	CT_SIZE,    /* u64 with an optional unit (kvd_parse_size) */
	CT_DOUBLE,
	CT_BOOL,    /* on/off, true/false, yes/no, 1/0 */
	CT_ENUM,    /* int field; value is the index in choices */
	CT_LIST,    /* peers: comma-separated list of addresses */
	CT_MODE,    /* octal file mode */
	CT_ADDR,    /* comma list of host:port or unix:PATH (may be empty) */
};

struct conf_key {
	const char *section;
	const char *key;
	enum conf_type type;
	const char *def;
	double min, max;            /* numeric range, inclusive */
	const char *const *choices; /* CT_ENUM, NULL-terminated */
	size_t offset;
	size_t size;                /* field size for strings */
	const char *help;
};

static const char *const roles[] = { "prefill", "decode", "standalone", NULL };
static const char *const policies[] = { "refuse", "clamp", NULL };
static const char *const dtypes[] = { "f32", "f16", NULL };
static const char *const transports[] = { "tcp", "verbs", NULL };
/* In the order of enum kvd_verbs_scope. */
static const char *const verbs_scopes[] = { "auto", "mw", "mr", NULL };
static const char *const levels[] = { "error", "warn", "info", "debug", NULL };
static const char *const backends[] = { "host", "cuda", NULL };
/* In the order of enum chat_format (gpu/text/chat.h), "auto" at CHAT_NONE's
 * index: conf/ sits below gpu/, so test_chat checks the two agree. */
static const char *const chat_templates[] = {
	"auto", "llama2", "llama3", "chatml", "mistral", "gemma", "phi3",
	"deepseek", "mistral_v3", NULL
};

#define F(field) offsetof(struct kvd_config, field), \
	sizeof(((struct kvd_config *)0)->field)

static const struct conf_key conf_keys[] = {
	{ "node", "name", CT_NAME, "kvd0", 0, 0, NULL, F(node_name),
	  "Node name: in every log line, the capacity line and the admin socket name." },
	{ "node", "role", CT_ENUM, "standalone", 0, 0, roles, F(role),
	  "prefill computes prompt KV and ships it; decode reserves pages, asks a prefill peer, generates; standalone does both." },
	{ "node", "drain_timeout_ms", CT_U32, "60000", 100, 86400000, NULL, F(drain_timeout_ms),
	  "kvctl drain and SIGTERM wait this long for requests in flight, then abort the rest (each gets DRAINING or its abort path)." },

	{ "model", "path", CT_STR, "", 0, 0, NULL, F(model_path),
	  "GGUF model file (llama architecture). Required." },
	{ "model", "context_length", CT_U32, "0", 0, 16777216, NULL, F(context_length),
	  "Context length served, in tokens; 0 = the model's own context_length." },
	{ "model", "chat_template", CT_ENUM, "auto", 0, 0, chat_templates, F(chat_template),
	  "Prompt format of chat requests: auto recognizes the GGUF's tokenizer.chat_template (a template kvd does not know leaves chat off; completions still work), or force one of llama2, llama3, chatml (Qwen), mistral, gemma, phi3, deepseek, mistral_v3 (Mistral 7B Instruct v0.3, with tools)." },
	{ "model", "chat_template_unsafe", CT_BOOL, "off", 0, 0, NULL, F(chat_template_unsafe),
	  "Serve chat with a format whose control markers are not single control tokens of the model's vocabulary (Llama 2 and Mistral v0.1's [INST], DeepSeek's User:, a generated model's vocabulary): there a message can spell out a system turn that tokenizes exactly like the template's own. Off: such a format is refused at boot (chat stays off when recognized from the GGUF; the node does not start when model.chat_template forces it)." },
	{ "model", "fingerprint_cache", CT_STR, "", 0, 0, NULL, F(fingerprint_cache),
	  "Directory caching the model's SHA-256 by (device, inode, size, mtime, ctime) and content evidence (the first MiB and 65 sampled blocks, checked at every boot), so a boot does not read the whole file when it has not changed; a cached digest is verified in full off the loop after boot, and a mismatch stops the node (exit 65); an absolute path, \"off\", or empty = $CACHE_DIRECTORY (systemd's CacheDirectory=) when set, else off." },
	{ "model", "pack_cache", CT_BOOL, "on", 0, 0, NULL, F(pack_cache),
	  "Keep the CPU kernels' repacked weights (Q4_0, Q8_0, K-quants on AVX-512 VNNI) in a file of the fingerprint cache's directory, written at the first start and mapped read-only (shared page cache, under a read lease: truncating or writing the file turns the mapping into a private copy first) at later ones, instead of repacking the whole model at every start; off without a fingerprint cache directory." },
	/* the default is PREPACK_KEEP_DAYS_DEFAULT (gpu/model/prepack.h: conf/ sits below) */
	{ "model", "pack_cache_keep_days", CT_U32, "7", 0, 3650, NULL, F(pack_cache_keep_days),
	  "After each start that maps or stores its repack cache file, remove the directory's other pack-*.kvpack files (regular files of this user, never through a symlink) that no running kvd holds and that have a stale format or layout version, or were not used by any start for this many days (by mtime; each start touches its file); 0 = remove them at once. One event=pack_cache_removed line per file; kvd generate --cache-dir uses the default." },

	{ "kv", "page_tokens", CT_U32, "16", 1, 4096, NULL, F(page_tokens),
	  "Positions per KV page." },
	{ "kv", "pool_tokens", CT_U64, "0", 0, 1e12, NULL, F(pool_tokens),
	  "KV pool size in tokens (rounded up to whole pages). Exactly one of pool_tokens and memory_bytes." },
	{ "kv", "memory_bytes", CT_SIZE, "0", 0, 1e15, NULL, F(memory_bytes),
	  "KV pool size in bytes (4GiB = 4G = 4 x 2^30, 4GB = 4 x 10^9). Exactly one of pool_tokens and memory_bytes." },
	{ "kv", "capacity_margin", CT_DOUBLE, "1.0", 1.0, 64.0, NULL, F(capacity_margin),
	  "The pool must hold context_length x margin tokens." },
	{ "kv", "capacity_policy", CT_ENUM, "refuse", 0, 0, policies, F(capacity_policy),
	  "When the pool cannot hold the context: refuse to start (exit 78), or clamp the advertised context." },
	{ "kv", "dtype", CT_ENUM, "f16", 0, 0, dtypes, F(kv_dtype),
	  "Element type of K and V in the pool." },
	{ "kv", "backend", CT_ENUM, "host", 0, 0, backends, F(kv_backend_id),
	  "Where pages live: host memory, or CUDA device memory (needs a CUDA build)." },

	{ "engine", "threads", CT_U32, "0", 0, 256, NULL, F(threads),
	  "Compute worker threads; 0 = one per online CPU." },
	{ "engine", "max_batch", CT_U32, "32", 1, 4096, NULL, F(max_batch),
	  "Running requests per decode step (continuous batching)." },
	{ "engine", "prefill_chunk", CT_U32, "64", 1, 65536, NULL, F(prefill_chunk),
	  "Prompt tokens one request may compute per step (at most; the step's budget, engine.step_tokens, may leave less)." },
	{ "engine", "step_tokens", CT_U32, "0", 0, 1048576, NULL, F(step_tokens),
	  "Tokens one engine step computes, all requests together; 0 = max_batch + prefill_chunk. Decoding requests are served first (one token each, every step), then prompts oldest first, each by at most prefill_chunk: the time of one step of this many tokens bounds the inter-token latency of running requests while prompts are admitted, and what is left after the decoders is the prompt throughput that sets TTFT under load. Must be at least max_batch. On a prefill node (no decoders to protect) 0 means max(128, max_batch + prefill_chunk) with no per-prompt chunk limit: the oldest prompts whole, first come, first served." },
	{ "engine", "step_ms", CT_U32, "0", 0, 60000, NULL, F(step_ms),
	  "Target time of one engine step while requests are generating, in milliseconds; 0 = none (only step_tokens bounds a step). With a target, a step that carries decoders admits prompt tokens only as far as the step time the engine has measured (time per token, logits rows weighted by their multiply-adds: gpu/cpu/stepcost.h) predicts the step stays within it, and never fewer than 4 (or prefill_chunk when smaller) while a prompt waits, so prompts always progress. It bounds the inter-token latency of running requests by time rather than by token count; prompts then take the time the decoders leave. Steps without decoders are not limited by it." },

	{ "cache", "enabled", CT_BOOL, "on", 0, 0, NULL, F(cache_enabled),
	  "Prefix cache: full KV pages of finished prompts stay in the pool, read-only, and a later request of the same tenant and cache_salt whose prompt starts with them computes only the rest. Keyed by a SHA-256 chain over (model, tenant, cache_salt, every token up to the page's last): never shared between tenants or salts. Cached pages are evicted (LRU) whenever admission needs the room." },
	{ "cache", "max_pages", CT_U32, "0", 0, 4294967295.0, NULL, F(cache_max_pages),
	  "Most pages the prefix cache keeps, all tenants together; 0 = half of the pool." },
	{ "cache", "decode_reuse", CT_BOOL, "on", 0, 0, NULL, F(cache_decode_reuse),
	  "Decode in a pair: the full prompt pages a request received from its prefill peer stay in this node's prefix cache when it ends (same key rule as everywhere: model, tenant, cache_salt, tokens), and a later request of that tenant and salt at least half of whose prompt this node holds so is computed here on those pages, the rest of its prompt locally, instead of being received again. Off: every request of a pair is prefilled by the peer (whose own cache still spares it the compute)." },
	{ "cache", "tenant_pages", CT_U32, "0", 0, 4294967295.0, NULL, F(cache_tenant_pages),
	  "Most cached pages of one tenant (its quota: beyond it, its own least recently used pages go; an insert never evicts another tenant's pages). 0 = max_pages split evenly between the tenants of http.api_keys_file (decode and standalone; one tenant without a keys file), or in 4 on a prefill node, which does not know its tenants: set it there to max_pages / tenants." },

	{ "listen", "client", CT_ADDR, "", 0, 0, NULL, F(listen_client),
	  "Client API listeners: comma list of host:port and unix:PATH (decode and standalone)." },
	{ "listen", "peer", CT_ADDR, "", 0, 0, NULL, F(listen_peer),
	  "Peer listener, one host:port (prefill). Without peers.key_file it must be a loopback address." },
	{ "listen", "max_clients", CT_U32, "256", 1, 65536, NULL, F(max_clients),
	  "Client connections at once; one more is answered with an OVERLOADED frame_error and closed. Clamped (warn line) so that it fits RLIMIT_NOFILE beside a reserve for the admin socket, peers and the node itself." },
	{ "listen", "client_idle_timeout_ms", CT_U32, "300000", 100, 86400000, NULL, F(client_idle_timeout_ms),
	  "A client connection with no request in flight and no byte received for this long is closed." },
	{ "listen", "client_read_timeout_ms", CT_U32, "10000", 100, 3600000, NULL, F(client_read_timeout_ms),
	  "A frame that has begun to arrive, and the first frame of a new connection, must be complete within this (slow senders are closed)." },
	{ "listen", "write_queue_soft", CT_SIZE, "1M", 4096, 1073741824.0, NULL, F(write_queue_soft),
	  "Bytes queued to one connection (client, peer control) past which kvd stops reading from it; the admin socket has fixed limits." },
	{ "listen", "write_queue_hard", CT_SIZE, "16M", 4096, 1073741824.0, NULL, F(write_queue_hard),
	  "Bytes queued to one connection past which kvd closes it." },
	{ "listen", "write_stall_timeout_ms", CT_U32, "10000", 100, 3600000, NULL, F(write_stall_timeout_ms),
	  "A connection whose write queue stays past write_queue_soft this long is closed." },
	{ "listen", "http", CT_ADDR, "", 0, 0, NULL, F(listen_http),
	  "OpenAI-compatible HTTP/1.1 API, one host:port; empty = off. On a prefill node it serves only GET /livez, /readyz, /health and /metrics (the rest 404: prefill serves no clients). Without http.api_keys_file it must be a loopback address. Its connections count against max_clients and share the write_queue_* bounds." },

	{ "http", "api_keys_file", CT_STR, "", 0, 0, NULL, F(http_api_keys_file),
	  "API keys: one `KEY TENANT [ROLE] [NAME=N ...]` per line (# comments; keys of 32..256 characters, not one or a few repeated), a regular file of kvd's user (or root) readable by its owner only. ROLE: user (default) or admin (only admin keys read /metrics); NAME=N: the tenant's share, max_active, max_queued, max_tokens (the tenants.* keys' meaning, for this tenant). HTTP requests send `Authorization: Bearer KEY`, msgpack clients an auth frame first; the tenant names them in logs. Empty: no keys, and listen.http and listen.client must be loopback." },
	{ "http", "max_header_bytes", CT_SIZE, "16K", 1024, 1048576, NULL, F(http_max_header_bytes),
	  "Largest request line plus headers; past it the answer is 431 and the connection closes." },
	{ "http", "max_body_bytes", CT_SIZE, "1M", 1024, 67108864, NULL, F(http_max_body_bytes),
	  "Largest request body; past it the answer is 413 and the connection closes." },
	{ "http", "header_timeout_ms", CT_U32, "10000", 100, 3600000, NULL, F(http_header_timeout_ms),
	  "A request's line and headers must arrive within this from its first byte (and a new connection's first request from accept): slow senders get 408 and are closed." },
	{ "http", "read_timeout_ms", CT_U32, "30000", 100, 3600000, NULL, F(http_read_timeout_ms),
	  "A whole request (headers and body) must arrive within this from its first byte." },
	{ "http", "idle_timeout_ms", CT_U32, "60000", 100, 86400000, NULL, F(http_idle_timeout_ms),
	  "A keep-alive connection with no request in flight that sends nothing for this long is closed." },
	{ "http", "model_name", CT_STR, "", 0, 0, NULL, F(http_model_name),
	  "The model id /v1/models lists and requests may name; empty = the model file's name without .gguf." },
	{ "http", "default_max_tokens", CT_U32, "0", 0, 1048576, NULL, F(http_default_max_tokens),
	  "max_tokens of an HTTP request that gives none: at most this many; 0 = the rest of the context (prompt + max_tokens = the smallest context and pool on the path, and at most the tenant's max_tokens). A request reserves the pages of prompt + max_tokens when admitted, so a request without max_tokens holds a whole context's pages: set this (or tenants.max_tokens) to admit more of them at once." },
	{ "http", "max_n", CT_U32, "8", 1, 128, NULL, F(http_max_n),
	  "Most choices (`n`) one /v1/completions or /v1/chat/completions request may ask for; more is a 400 naming n. Each choice is a request of its own to the tenant's bounds (max_active, max_queued, max_tokens, the fair queue) and reserves its own pages; with the prefix cache on, the prompt's full pages are computed once and shared (daemon/front/README.md)." },
	{ "http", "chat_page", CT_BOOL, "on", 0, 0, NULL, F(http_chat_page),
	  "Serve the built-in chat page at / (with /chat.js and /chat.css; daemon/front/README.md): static files compiled into kvd that hold no data and call the API with the key the user types. Off: / is 404." },

	{ "http", "cors_origins", CT_STR, "", 0, 0, NULL, F(http_cors_origins),
	  "Browser origins allowed to call the HTTP API (CORS), comma-separated (`https://app.example.com,http://localhost:5173`), or `*` for any; empty = off. A request whose Origin is listed gets Access-Control-Allow-Origin (its origin echoed) and Vary: Origin on every answer, and an OPTIONS preflight 204 without a key; another origin gets no CORS headers and 403 on preflight. The API key is still required: CORS only lets a browser page read the answers. `kill -HUP` reads the INI again for this key (the whole file through the start's checks: one that fails them keeps the list in use, logged)." },
	{ "http", "parse_special", CT_BOOL, "on", 0, 0, NULL, F(http_parse_special),
	  "A /v1/completions prompt's text naming a control token (`<|im_start|>`, `<s>`) becomes that token, as llama-server does; off = it is ordinary text. Chat message content never becomes a control token (refused: forged_control_token)." },
	{ "http", "metrics_vllm_names", CT_BOOL, "on", 0, 0, NULL, F(http_metrics_vllm_names),
	  "/metrics (and kvctl metrics) also carries the series vLLM dashboards query (vllm:num_requests_running, vllm:time_to_first_token_seconds, ... with model_name = http.model_name), summed over tenants; off = only the kvd_ names." },

	{ "tenants", "share", CT_U32, "1", 1, 1000000, NULL, F(tenant_share),
	  "A tenant's weight when tenants with waiting requests share the node's admission slots (and so the decode batch): a waiting request of the tenant with the fewest admitted requests per share goes first. The keys file's share=N overrides it per tenant." },
	{ "tenants", "max_active", CT_U32, "0", 0, 1048576, NULL, F(tenant_max_active),
	  "Requests of one tenant admitted (holding pages, computing) at once; 0 = only the node's bound (tenants.node_max_active). Keys file: max_active=N." },
	{ "tenants", "max_queued", CT_U32, "64", 0, 1048576, NULL, F(tenant_max_queued),
	  "Requests of one tenant waiting for admission while the node or the tenant is at its bound; one more is refused with 429 (HTTP, Retry-After) or OVERLOADED. 0 = no waiting. Keys file: max_queued=N." },
	{ "tenants", "max_tokens", CT_U32, "0", 0, 4294967295.0, NULL, F(tenant_max_tokens),
	  "Tokens one tenant may hold admitted at once, each request counting prompt + max_tokens (the pages it reserves); 0 = no bound beyond the pool. A request larger than this alone is refused. Keys file: max_tokens=N." },
	{ "tenants", "queue_timeout_ms", CT_U32, "30000", 100, 3600000, NULL, F(tenant_queue_timeout_ms),
	  "A request waits for admission at most this long, then is refused with 429 (HTTP, Retry-After) or OVERLOADED." },
	{ "tenants", "node_max_active", CT_U32, "0", 0, 1048576, NULL, F(node_max_active),
	  "Requests the node admits at once, all tenants together; past it (or when the pool cannot reserve a request's pages) requests wait in their tenant's queue. 0 = engine.max_batch, so every admitted request is in the decode batch." },

	{ "peers", "prefill", CT_LIST, "", 0, 0, NULL, F(peers_prefill),
	  "Prefill peers host:port, comma-separated (decode; required there). host is an IP address, localhost, or a DNS name (RFC 1123, at most 200 characters): a name is resolved on the loop, again every resolve_interval_ms and whenever one of its links reconnects, and every address it returns (all with the entry's port) becomes a peer; an address that leaves the answer is drained (no new requests, those on it complete, then its link closes). Without peers.key_file they must be loopback addresses (a name's: each address it resolves to)." },
	{ "peers", "resolve_interval_ms", CT_U32, "5000", 100, 3600000, NULL, F(peers_resolve_interval_ms),
	  "Decode: how often a peers.prefill name is resolved again (also at every reconnect of one of its links). A failed resolution keeps the links the name has and is retried at this interval." },
	{ "peers", "key_file", CT_STR, "", 0, 0, NULL, F(key_file),
	  "Cluster secret shared by every node (at least 32 random bytes, 8 or more distinct; `kvctl keygen FILE`), a regular file of kvd's user (or root) readable by its owner only. Peers prove they hold it before anything else; without it a node peers only over loopback." },
	{ "peers", "max_requests", CT_U32, "256", 1, 1048576, NULL, F(peer_max_requests),
	  "Requests one decode node may have in flight on this prefill node, over all its links; one more is refused with OVERLOADED. A node is the source address its links come from (every key holder can prove the key and name itself as it likes; daemon/README.md)." },
	{ "peers", "max_pages", CT_U32, "0", 0, 4294967295.0, NULL, F(peer_max_pages),
	  "Pages one decode node's requests may hold in this prefill node's pool, over all its links (a node as for max_requests); 0 = half the pool, at least one full-context request." },
	{ "peers", "max_links", CT_U32, "4", 1, 512, NULL, F(peer_max_links),
	  "Control links one decode node (a source address) may hold on this prefill node once proven; one more is refused (too_many_links). A decode node needs one, and one more while a lost one is torn down; decode nodes that share an address share this and the caps above." },
	{ "peers", "failover_retries", CT_U32, "1", 0, 8, NULL, F(failover_retries),
	  "Decode: how many times one request is placed again when its prefill peer is lost (link down) or refuses it for a cause another prefill may not share (DRAINING, OVERLOADED) before anything reached its client: its pages are released (fenced until nothing can write them, as on any failure), then fresh ones go to another prefill peer that takes requests, or to this node when peers.local_prefill places it here, with every check again. 0 = never: the client gets the error. A refusal for the request itself (PROMPT_TOO_LONG, INVALID_REQUEST) or an integrity failure is never retried (daemon/README.md, failover)." },
	{ "peers", "local_prefill", CT_U32, "0", 0, 100, NULL, F(local_prefill),
	  "Decode: how fast this node computes prompts itself when it generates nothing, in percent of one prefill peer (0 = never: every prompt goes to a prefill peer). A new prompt is computed here when its expected wait is shorter: (prompt tokens this node is computing + its prompt) / speed < prompt tokens of this node's requests the chosen peer has not finished + its prompt, where speed = local_prefill / 100 x the share of a step the decoders to expect leave (every other request of this node, a token and a logits row each), until both speeds are measured. An idle peer always wins. Local prompts share this node's steps under engine.step_tokens, engine.prefill_chunk and engine.step_ms, which keep bounding the inter-token latency; with 100, prefill_chunk 32 and a step_ms target a pair pays under load (daemon/README.md, conditional disaggregation)." },

	{ "transfer", "transport", CT_ENUM, "tcp", 0, 0, transports, F(transport),
	  "How KV pages move: tcp, or verbs (RDMA: an ibverbs build for a real device; the emulated device emu:DIR in test builds, -Dverbs_emu=true)." },
	{ "transfer", "max_batch_bytes", CT_SIZE, "4M", 4096, 1073741824.0, NULL, F(max_batch_bytes),
	  "Largest KV transfer batch. Must move within release_timeout_ms at link_gbps." },
	{ "transfer", "release_timeout_ms", CT_U32, "5000", 10, 3600000, NULL, F(release_timeout_ms),
	  "How long a side waits for its peer before it gives up on a transfer and fences the pages." },
	{ "transfer", "send_timeout_ms", CT_U32, "0", 0, 3600000, NULL, F(send_timeout_ms),
	  "Prefill: a request whose KV batches make no progress on the data link this long (none of its batches reported sent, from its first batch queued until prefill_done) ends with TIMEOUT; a batch still queued means the data connection is stuck, so it is closed (which also ends the peer's other requests on it) and the pages return once nothing of the request is in flight. 0 = release_timeout_ms. At most release_timeout_ms, and a batch of max_batch_bytes must move within it at link_gbps." },
	{ "transfer", "link_gbps", CT_DOUBLE, "10", 0.001, 100000, NULL, F(link_gbps),
	  "Slowest link rate a batch may cross, in Gbit/s (used to bound batches)." },
	{ "transfer", "checksum", CT_BOOL, "on", 0, 0, NULL, F(checksum),
	  "XXH3 checksum on every batch, verified before the KV is used." },
	{ "transfer", "connect_timeout_ms", CT_U32, "2000", 10, 600000, NULL, F(connect_timeout_ms),
	  "Peer connect and handshake timeout." },
	{ "transfer", "prefill_timeout_ms", CT_U32, "60000", 10, 3600000, NULL, F(prefill_timeout_ms),
	  "Longest a decode node waits for a prefill to complete." },
	{ "transfer", "transfer_timeout_ms", CT_U32, "30000", 10, 3600000, NULL, F(transfer_timeout_ms),
	  "Longest gap between two batches of one transfer." },
	{ "transfer", "heartbeat_ms", CT_U32, "1000", 10, 600000, NULL, F(heartbeat_ms),
	  "Peer heartbeat interval; three missed beats mark the peer down." },
	{ "transfer", "encrypt", CT_BOOL, "off", 0, 0, NULL, F(encrypt),
	  "Encrypt control messages and KV batches between peers (AEAD; needs peers.key_file). Off: they are authenticated, not secret." },
	{ "transfer", "verbs_device", CT_STR, "", 0, 0, NULL, F(verbs_device),
	  "transport=verbs: the RDMA device (an ibverbs name such as mlx5_0; empty = the first device), or emu:DIR[,opts] for the userspace emulated device (test builds, -Dverbs_emu=true; DIR an existing absolute directory both peers reach, opts as in net/verbs/verbs_emu.h). The verbs_* keys keep their defaults unless transport=verbs." },
	{ "transfer", "verbs_port", CT_U32, "1", 1, 255, NULL, F(verbs_port),
	  "transport=verbs: the device port the queue pairs use." },
	{ "transfer", "verbs_gid_index", CT_U32, "0", 0, 255, NULL, F(verbs_gid_index),
	  "transport=verbs: the GID table index of the port's address (RoCE: pick the RoCEv2 entry; `show_gids`)." },
	{ "transfer", "verbs_qp_depth", CT_U32, "128", 4, 16384, NULL, F(verbs_qp_depth),
	  "transport=verbs: send work requests outstanding on one queue pair at most (page writes plus each batch's closing write); posting waits past it. The device's max_qp_wr must allow it." },
	{ "transfer", "verbs_inline", CT_U32_AUTO, "auto", 0, 4096, NULL, F(verbs_inline),
	  "transport=verbs: the largest write posted inline (copied into the work request by the CPU, so the NIC need not read it from memory: each batch's closing write of header, entries and MAC, 80 + 24 bytes per page). auto: ask the device for an inline size that fits the largest header transfer.max_batch_bytes allows (at most 256), stepping down (128, 64, 0) while it refuses, and use what it grants; a number: exactly that, and a device that cannot grant it refuses to start; 0 = never. The boot line event=transport and kvctl status (capacity.verbs_inline) give the size in use." },
	{ "transfer", "verbs_write_scope", CT_ENUM, "auto", 0, 0, verbs_scopes, F(verbs_write_scope),
	  "transport=verbs, decode: how a request's pages are opened to its prefill peer's writes. mw: type-2 memory windows bound over the request's pages on the peer's queue pair, live once the bind completed, invalidated at release (the pages stay fenced until the invalidation completed); mr: a registration per request, made at admission and deregistered at release; auto: mw where the device supports type-2 windows, else mr. mw on a device without windows refuses to start. The boot line event=transport says which is in use (write_scope=)." },
	{ "transfer", "verbs_flush_timeout_ms", CT_U32, "5000", 10, 3600000, NULL, F(verbs_flush_timeout_ms),
	  "transport=verbs: after a link is lost, how long to wait for the queue pair's flush completions (the proof that nothing more can land) before the QP is destroyed without them (event=verbs_flush_timeout, counted in verbs_flush_timeouts). On decode the pages of that link's requests are then quarantined until restart, never freed; prefill only stops waiting (nothing writes into its pages)." },

	{ "admin", "socket", CT_STR, "", 0, 0, NULL, F(admin_socket),
	  "Admin Unix socket; empty = $RUNTIME_DIRECTORY (or /run/kvd) / NODE.sock; 'none' disables it. Its directory must exist and be writable by kvd's user (--check-config checks)." },
	{ "admin", "mode", CT_MODE, "0660", 0, 0777, NULL, F(admin_mode),
	  "File mode of the admin socket (octal)." },
	{ "admin", "group", CT_NAME, "kvd", 0, 0, NULL, F(admin_group),
	  "Group whose members may use the admin socket (root always may)." },

	{ "log", "level", CT_ENUM, "info", 0, 0, levels, F(log_level),
	  "error, warn, info or debug." },
};

#undef F

#define N_KEYS KVD_ARRAY_SIZE(conf_keys)

struct conf_ctx {
	struct kvd_config *c;
	struct kvd_config_error *err;
	const char *name;
	int line;                  /* line the reader last returned */
	int key_line[N_KEYS];      /* where each key was set; 0 = default */
	int failed;
	/* string source */
	const char *text;
	size_t text_pos;
	FILE *file;
};

/* ---- errors ------------------------------------------------------------- */

static int conf_fail(struct conf_ctx *x, int line, const char *key,
		     const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static int conf_fail(struct conf_ctx *x, int line, const char *key,
		     const char *fmt, ...)
{
	va_list ap;

	if (x->failed++)
		return -1;
	snprintf(x->err->file, sizeof(x->err->file), "%s", x->name);
	x->err->line = line;
	snprintf(x->err->key, sizeof(x->err->key), "%s", key ? key : "");
	va_start(ap, fmt);
	vsnprintf(x->err->msg, sizeof(x->err->msg), fmt, ap);
	va_end(ap);
	return -1;
}

void kvd_config_error_format(const struct kvd_config_error *err, char *buf, size_t size)
{
	char line[16] = "";

	if (!size)
		return;
	if (err->line > 0)
		snprintf(line, sizeof(line), ":%d", err->line);
	snprintf(buf, size, "%s%s: %s%s%s", err->file, line, err->key,
		 err->key[0] ? ": " : "", err->msg);
}

void kvd_config_error_print(FILE *out, const struct kvd_config_error *err)
{
	char buf[sizeof(err->file) + sizeof(err->key) + sizeof(err->msg) + 32];

	kvd_config_error_format(err, buf, sizeof(buf));
	fprintf(out, "%s\n", buf);
}

/* ---- value parsers ------------------------------------------------------ */

static void *field(struct kvd_config *c, const struct conf_key *k)
{
	return (char *)c + k->offset;
}

static int parse_bool(const char *s, bool *out)
{
	static const char *const yes[] = { "on", "true", "yes", "1" };
	static const char *const no[] = { "off", "false", "no", "0" };

	for (size_t i = 0; i < KVD_ARRAY_SIZE(yes); i++) {
		if (strcasecmp(s, yes[i]) == 0) {
			*out = true;
			return 0;
		}
		if (strcasecmp(s, no[i]) == 0) {
			*out = false;
			return 0;
		}
	}
	return -EINVAL;
}

static bool is_name(const char *s)
{
	if (!*s)
		return false;
	for (; *s; s++)
		if (!isalnum((unsigned char)*s) && *s != '_' && *s != '-' &&
		    *s != '.')
			return false;
	return true;
}

/* host:port with port 1..65535, where host is a numeric IPv4 address,
 * [IPv6], or localhost: what passes here is what the listeners and peer
 * connections can use as written (peers.prefill also takes name:port,
 * kvd_peer_name_split, resolved on the loop by daemon/node/peerdns.c). */
/* Split host:port into its address (af 0 for "localhost") and port.
 * 0, or -1 when it is not one. */
static int hostport_split(const char *s, int *af, unsigned char addr[16],
			  uint64_t *port)
{
	const char *colon = strrchr(s, ':');
	char host[64];
	size_t n;

	if (!colon || colon == s || (size_t)(colon - s) >= sizeof(host))
		return -1;
	if (kvd_parse_u64(colon + 1, port) < 0 || *port == 0 || *port > 65535)
		return -1;
	n = (size_t)(colon - s);
	memcpy(host, s, n);
	host[n] = '\0';
	*af = 0;
	if (!strcmp(host, "localhost"))
		return 0;
	if (host[0] == '[' && n > 2 && host[n - 1] == ']') {
		host[n - 1] = '\0';
		*af = AF_INET6;
		return inet_pton(AF_INET6, host + 1, addr) == 1 ? 0 : -1;
	}
	*af = AF_INET;
	return inet_pton(AF_INET, host, addr) == 1 ? 0 : -1;
}

static bool is_hostport(const char *s)
{
	unsigned char addr[16];
	uint64_t port = 0;
	int af;

	return hostport_split(s, &af, addr, &port) == 0;
}

/* One label of an RFC 1123 host name: 1..63 letters, digits and hyphens,
 * neither first nor last a hyphen. */
static bool name_label_ok(const char *l, size_t n)
{
	if (n == 0 || n > 63 || l[0] == '-' || l[n - 1] == '-')
		return false;
	for (size_t i = 0; i < n; i++)
		if (!isalnum((unsigned char)l[i]) && l[i] != '-')
			return false;
	return true;
}

/* An RFC 1123 host name of n characters: labels joined by dots, at most
 * KVD_PEER_NAME_MAX in all, the last one not all digits (so a mistyped
 * IPv4 address is not taken for a name). */
static bool is_host_name(const char *h, size_t n)
{
	const char *l = h, *dot;
	bool digits = true;

	if (n == 0 || n > KVD_PEER_NAME_MAX)
		return false;
	for (;;) {
		dot = memchr(l, '.', n - (size_t)(l - h));
		if (!name_label_ok(l, dot ? (size_t)(dot - l) : n - (size_t)(l - h)))
			return false;
		if (!dot)
			break;
		l = dot + 1;
	}
	for (; l < h + n; l++)
		digits &= isdigit((unsigned char)*l) != 0;
	return !digits;
}

int kvd_peer_name_split(const char *s, char host[KVD_PEER_NAME_MAX + 1], uint16_t *port)
{
	const char *colon = strrchr(s, ':');
	uint64_t p;
	size_t n;

	if (!colon || is_hostport(s))
		return -1;
	n = (size_t)(colon - s);
	if (!is_host_name(s, n) || kvd_parse_u64(colon + 1, &p) < 0 || p == 0 ||
	    p > 65535)
		return -1;
	memcpy(host, s, n);
	host[n] = '\0';
	*port = (uint16_t)p;
	return 0;
}

bool kvd_hostport_is_loopback(const char *s)
{
	static const unsigned char v6_loop[16] = { [15] = 1 };
	static const unsigned char v4_mapped[12] = { [10] = 0xff, [11] = 0xff };
	unsigned char a[16];
	uint64_t port = 0;
	int af;

	if (hostport_split(s, &af, a, &port))
		return false;
	if (af == 0)
		return true;   /* localhost */
	if (af == AF_INET)
		return a[0] == 127;
	/* ::1, or an IPv4-mapped 127.x.y.z */
	return !memcmp(a, v6_loop, 16) || (!memcmp(a, v4_mapped, 12) && a[12] == 127);
}

static bool is_addr(const char *s)
{
	if (strncmp(s, "unix:", 5) == 0)
		return s[5] == '/' && strlen(s + 5) < 108;
	return is_hostport(s);
}

/* Split a comma list into trimmed items; calls fn for each. */
static int for_each_item(const char *v, char items[][256], uint32_t max,
			 uint32_t *n)
{
	char buf[4096];
	char *save = NULL;

	*n = 0;
	if (snprintf(buf, sizeof(buf), "%s", v) >= (int)sizeof(buf))
		return -E2BIG;
	for (char *tok = strtok_r(buf, ",", &save); tok;
	     tok = strtok_r(NULL, ",", &save)) {
		while (isspace((unsigned char)*tok))
			tok++;
		for (char *e = tok + strlen(tok);
		     e > tok && isspace((unsigned char)e[-1]); e--)
			e[-1] = '\0';
		if (!*tok)
			return -EINVAL;
		if (*n == max)
			return -E2BIG;
		if (strlen(tok) >= 256)
			return -ENAMETOOLONG;
		snprintf(items[(*n)++], 256, "%s", tok);
	}
	return 0;
}

/* One value being set: the key, its field in the config, the value as
 * written, and where it came from (line, "section.key") for messages. */
struct conf_set {
	struct conf_ctx *x;
	const struct conf_key *k;
	void *f;
	const char *v;
	int line;
	const char *full;
};

/* Each setter below checks s->v against its key's type and range and
 * stores it in s->f; 0, or -1 with the error recorded (conf_fail). */

/* CT_STR: any string that fits the field. */
static int set_str(const struct conf_set *s)
{
	if (strlen(s->v) >= s->k->size)
		return conf_fail(s->x, s->line, s->full,
				 "value too long (at most %zu bytes)",
				 s->k->size - 1);
	memcpy(s->f, s->v, strlen(s->v) + 1);
	return 0;
}

/* CT_NAME: a string of letters, digits, '_', '-' and '.'. */
static int set_name(const struct conf_set *s)
{
	if (!is_name(s->v))
		return conf_fail(s->x, s->line, s->full,
				 "'%s' is not a name (letters, digits, '_', '-', '.')", s->v);
	return set_str(s);
}

/* CT_U32, CT_U64, CT_SIZE (and CT_U32_AUTO's numbers): an integer in
 * [min, max], a size with its unit (kvd_parse_size). */
static int set_uint(const struct conf_set *s)
{
	const struct conf_key *k = s->k;
	uint64_t u = 0;
	int r;

	r = k->type == CT_SIZE ? kvd_parse_size(s->v, &u) : kvd_parse_u64(s->v, &u);
	if (r == -EINVAL && k->type == CT_SIZE)
		return conf_fail(s->x, s->line, s->full,
				 "'%s' is not a size (a number and an optional unit: "
				 KVD_SIZE_UNITS ")", s->v);
	if (r == -EINVAL)
		return conf_fail(s->x, s->line, s->full,
				 "'%s' is not %sa non-negative integer", s->v,
				 k->type == CT_U32_AUTO ? "auto or " : "");
	if (r < 0 || (double)u < k->min || (double)u > k->max)
		return conf_fail(s->x, s->line, s->full,
				 "%s is out of range [%.0f, %.0f]", s->v,
				 k->min, k->max);
	if (k->type == CT_U32 || k->type == CT_U32_AUTO)
		*(uint32_t *)s->f = (uint32_t)u;
	else
		*(uint64_t *)s->f = u;
	return 0;
}

/* CT_U32_AUTO: "auto" (stored as UINT32_MAX) or a u32. */
static int set_u32_auto(const struct conf_set *s)
{
	if (strcmp(s->v, "auto") == 0) {
		*(uint32_t *)s->f = UINT32_MAX;
		return 0;
	}
	return set_uint(s);
}

/* CT_DOUBLE: a finite number in [min, max]. */
static int set_double(const struct conf_set *s)
{
	char *end;
	double d;

	errno = 0;
	d = strtod(s->v, &end);
	if (!*s->v || *end || errno || !isfinite(d))
		return conf_fail(s->x, s->line, s->full, "'%s' is not a number", s->v);
	if (d < s->k->min || d > s->k->max)
		return conf_fail(s->x, s->line, s->full,
				 "%s is out of range [%g, %g]", s->v, s->k->min,
				 s->k->max);
	*(double *)s->f = d;
	return 0;
}

/* CT_BOOL: on/off, true/false, yes/no, 1/0. */
static int set_bool(const struct conf_set *s)
{
	if (parse_bool(s->v, (bool *)s->f) < 0)
		return conf_fail(s->x, s->line, s->full,
				 "'%s' is not a boolean (on/off, true/false, yes/no, 1/0)", s->v);
	return 0;
}

/* CT_ENUM: one of the key's choices, stored as its index; the message
 * of a wrong one lists them. */
static int set_enum(const struct conf_set *s)
{
	const char *const *choices = s->k->choices;
	char list[256] = "";
	size_t o = 0;

	for (int i = 0; choices[i]; i++) {
		if (strcmp(s->v, choices[i]) == 0) {
			*(int *)s->f = i;
			return 0;
		}
	}
	for (int i = 0; choices[i]; i++)
		o += (size_t)snprintf(list + o, sizeof(list) - o,
				      "%s%s", i ? ", " : "", choices[i]);
	return conf_fail(s->x, s->line, s->full,
			 "'%s' is not one of: %s", s->v, list);
}

/* CT_MODE: an octal file mode up to max. */
static int set_mode(const struct conf_set *s)
{
	uint64_t u;
	char *end;

	errno = 0;
	u = strtoull(s->v, &end, 8);
	if (!*s->v || *end || errno || u > (uint64_t)s->k->max)
		return conf_fail(s->x, s->line, s->full,
				 "'%s' is not an octal file mode (e.g. 0660)", s->v);
	*(uint32_t *)s->f = (uint32_t)u;
	return 0;
}

/* CT_ADDR: a comma list (maybe empty) of host:port and unix:/PATH,
 * stored with its items trimmed, so the listeners see them as checked
 * here. */
static int set_addr(const struct conf_set *s)
{
	const char *v = s->v;
	char items[8][256];
	char *dst = s->f;
	size_t o = 0;
	uint32_t n;

	if (*v && (for_each_item(v, items, 8, &n) < 0))
		return conf_fail(s->x, s->line, s->full,
				 "'%s' is not a comma list of addresses", v);
	for (uint32_t i = 0; *v && i < n; i++)
		if (!is_addr(items[i]))
			return conf_fail(s->x, s->line, s->full,
					 "'%s' is not IPv4:port, [IPv6]:port, localhost:port or unix:/PATH",
					 items[i]);
	dst[0] = '\0';
	for (uint32_t i = 0; *v && i < n; i++) {
		size_t len = strlen(items[i]);

		if (o + len + 2 > s->k->size)
			return conf_fail(s->x, s->line, s->full, "value too long");
		if (i)
			dst[o++] = ',';
		memcpy(dst + o, items[i], len + 1);
		o += len;
	}
	return 0;
}

/* CT_LIST: peers.prefill, a comma list (maybe empty) of host:port into
 * peers_prefill[] and n_peers_prefill. */
static int set_list(const struct conf_set *s)
{
	struct kvd_config *c = s->x->c;
	uint32_t n = 0;
	int r;

	if (*s->v) {
		r = for_each_item(s->v, c->peers_prefill, KVD_MAX_PEERS, &n);
		if (r == -E2BIG)
			return conf_fail(s->x, s->line, s->full,
					 "more than %d peers", KVD_MAX_PEERS);
		if (r < 0)
			return conf_fail(s->x, s->line, s->full,
					 "'%s' is not a comma list of host:port", s->v);
		for (uint32_t i = 0; i < n; i++) {
			char host[KVD_PEER_NAME_MAX + 1];
			uint16_t port;

			if (!is_hostport(c->peers_prefill[i]) &&
			    kvd_peer_name_split(c->peers_prefill[i], host, &port))
				return conf_fail(s->x, s->line, s->full,
						 "'%s' is not IPv4:port, [IPv6]:port, localhost:port or name:port (an RFC 1123 host name of at most %d characters)",
						 c->peers_prefill[i], KVD_PEER_NAME_MAX);
		}
	}
	c->n_peers_prefill = n;
	return 0;
}

/* The setter of each key type, indexed by enum conf_type. */
static int (*const setters[])(const struct conf_set *) = {
	[CT_STR] = set_str,
	[CT_NAME] = set_name,
	[CT_U32] = set_uint,
	[CT_U32_AUTO] = set_u32_auto,
	[CT_U64] = set_uint,
	[CT_SIZE] = set_uint,
	[CT_DOUBLE] = set_double,
	[CT_BOOL] = set_bool,
	[CT_ENUM] = set_enum,
	[CT_LIST] = set_list,
	[CT_MODE] = set_mode,
	[CT_ADDR] = set_addr,
};
/* CT_ADDR is the last type: a type added after it needs its row above */
_Static_assert(KVD_ARRAY_SIZE(setters) == CT_ADDR + 1, "a setter per conf_type");

/* Parse v as the value of key k (read at line; 0 for a default) into
 * its field of x->c; 0, or -1 with the error recorded (conf_fail). */
static int set_value(struct conf_ctx *x, const struct conf_key *k,
		     const char *v, int line)
{
	char full[96];
	struct conf_set s = { .x = x, .k = k, .f = field(x->c, k), .v = v,
			      .line = line, .full = full };

	snprintf(full, sizeof(full), "%s.%s", k->section, k->key);
	/* Whatever is accepted must print back as one line the parser reads
	 * (kvd --check-config output is a valid config). */
	if (strlen(k->key) + 3 + strlen(v) > CONF_LINE_MAX)
		return conf_fail(x, line, full,
				 "value too long: 'key = value' must fit in %d bytes",
				 CONF_LINE_MAX);
	if ((size_t)k->type >= KVD_ARRAY_SIZE(setters) || !setters[k->type])
		return conf_fail(x, line, full, "internal: unknown key type");
	return setters[k->type](&s);
}

/* ---- inih glue ---------------------------------------------------------- */

static bool section_known(const char *s)
{
	for (size_t i = 0; i < N_KEYS; i++)
		if (strcmp(conf_keys[i].section, s) == 0)
			return true;
	return false;
}

static int conf_handler(void *user, const char *section, const char *name,
			const char *value)
{
	struct conf_ctx *x = user;
	char full[256];

	snprintf(full, sizeof(full), "%s.%s", section, name);
	if (!*section)
		return conf_fail(x, x->line, name,
				 "key outside any [section]"), 0;
	if (!section_known(section))
		return conf_fail(x, x->line, full,
				 "unknown section [%s]", section), 0;
	for (size_t i = 0; i < N_KEYS; i++) {
		const struct conf_key *k = &conf_keys[i];

		if (strcmp(k->section, section) || strcmp(k->key, name))
			continue;
		if (x->key_line[i])
			return conf_fail(x, x->line, full,
					 "set twice (first at line %d)",
					 x->key_line[i]), 0;
		x->key_line[i] = x->line;
		return set_value(x, k, value, x->line) == 0;
	}
	return conf_fail(x, x->line, full, "unknown key in [%s]", section), 0;
}

/* fgets-style reader that counts lines and rejects over-long ones. */
static char *conf_reader(char *str, int num, void *stream)
{
	struct conf_ctx *x = stream;
	size_t n = 0;
	int ch;

	if (x->file) {
		if (!fgets(str, num, x->file))
			return NULL;
		n = strlen(str);
	} else {
		if (!x->text[x->text_pos])
			return NULL;
		while (n + 1 < (size_t)num && (ch = x->text[x->text_pos])) {
			x->text_pos++;
			str[n++] = (char)ch;
			if (ch == '\n')
				break;
		}
		str[n] = '\0';
	}
	x->line++;
	if (n && str[n - 1] != '\n' && n + 1 == (size_t)num) {
		conf_fail(x, x->line, NULL,
			  "line longer than %d bytes", num - 3);
		/* swallow the rest of the line so counting stays right */
		if (x->file)
			while ((ch = fgetc(x->file)) != EOF && ch != '\n')
				;
		else
			while (x->text[x->text_pos] &&
			       x->text[x->text_pos++] != '\n')
				;
		str[0] = '\0';
	}
	return str;
}

/* ---- defaults, validation ----------------------------------------------- */

void kvd_config_defaults(struct kvd_config *c)
{
	struct kvd_config_error err;
	struct conf_ctx x = { .c = c, .err = &err, .name = "(defaults)" };

	memset(c, 0, sizeof(*c));
	for (size_t i = 0; i < N_KEYS; i++)
		set_value(&x, &conf_keys[i], conf_keys[i].def, 0);
	/* A default the parser rejects is a bug in the table; tests check
	 * that x.failed stays 0 through kvd_config_load_string(""). */
	snprintf(c->kv_backend, sizeof(c->kv_backend), "%s",
		 backends[c->kv_backend_id]);
}

static int key_index(const char *section, const char *key)
{
	for (size_t i = 0; i < N_KEYS; i++)
		if (!strcmp(conf_keys[i].section, section) &&
		    !strcmp(conf_keys[i].key, key))
			return (int)i;
	return -1;
}

static int line_of(const struct conf_ctx *x, const char *section,
		   const char *key)
{
	int i = key_index(section, key);

	return i < 0 ? 0 : x->key_line[i];
}

/* Seconds a batch takes on the slowest link. */
static double batch_ms(uint64_t bytes, double gbps)
{
	return (double)bytes * 8.0 / (gbps * 1e9) * 1e3;
}

/* Peering safety (invariant 11): a node without the cluster secret may
 * peer only over loopback, where every peer is a process of this host;
 * with one, the file must be private and long enough. */
static int conf_validate_peering(struct conf_ctx *x)
{
	struct kvd_config *c = x->c;
	uint8_t buf[KVD_KEYFILE_MAX];
	char why[600];
	size_t len;

	if (c->key_file[0]) {
		int rc = kvd_keyfile_read(c->key_file, buf, &len, why, sizeof(why));

		memset(buf, 0, sizeof(buf));
		if (rc)
			return conf_fail(x, line_of(x, "peers", "key_file"),
					 "peers.key_file", "%s", why);
		return 0;
	}
	if (c->encrypt)
		return conf_fail(x, line_of(x, "transfer", "encrypt"), "transfer.encrypt",
				 "encryption needs the cluster secret: set peers.key_file");
	if (c->listen_peer[0] && !kvd_hostport_is_loopback(c->listen_peer))
		return conf_fail(x, line_of(x, "listen", "peer"), "listen.peer",
				 "'%s' is not a loopback address: set peers.key_file (kvctl keygen FILE) so peers must prove they hold the cluster secret",
				 c->listen_peer);
	/* a name:port entry is checked on what it resolves to (each address
	 * must be loopback then, daemon/node/peerdns.c) */
	for (uint32_t i = 0; i < c->n_peers_prefill; i++)
		if (is_hostport(c->peers_prefill[i]) &&
		    !kvd_hostport_is_loopback(c->peers_prefill[i]))
			return conf_fail(x, line_of(x, "peers", "prefill"), "peers.prefill",
					 "'%s' is not a loopback address: set peers.key_file (kvctl keygen FILE) so peers must prove they hold the cluster secret",
					 c->peers_prefill[i]);
	return 0;
}

/* True when every address of a listen.client list is loopback or unix:. */
static bool conf_client_loopback(const char *list)
{
	char buf[256], *save = NULL;

	snprintf(buf, sizeof(buf), "%s", list);
	for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		while (*t == ' ')
			t++;
		if (strncmp(t, "unix:", 5) && !kvd_hostport_is_loopback(t))
			return false;
	}
	return true;
}

static int conf_keys_check(struct conf_ctx *x)
{
	struct kvd_apikeys *keys = NULL;
	char why[600];

	if (kvd_apikeys_load(&keys, x->c->http_api_keys_file, why, sizeof(why)))
		return conf_fail(x, line_of(x, "http", "api_keys_file"),
				 "http.api_keys_file", "%s", why);
	kvd_apikeys_free(keys);
	return 0;
}

/* The client fronts (HTTP and msgpack): decode and standalone; a
 * prefill node's HTTP listener serves only the probes and /metrics
 * (daemon/front/README.md). Without API keys every local process is a
 * client, so they stay on loopback. */
static int conf_validate_http(struct conf_ctx *x)
{
	struct kvd_config *c = x->c;
	struct kvd_origins origins;
	const char *why = NULL;
	char bad[KVD_ORIGIN_MAX + 1];

	if (kvd_origins_parse(&origins, c->http_cors_origins, &why, bad, sizeof(bad)))
		return conf_fail(x, line_of(x, "http", "cors_origins"), "http.cors_origins",
				 "'%.64s': %s", bad, why);

	if (!c->http_api_keys_file[0] && c->listen_client[0] &&
	    !conf_client_loopback(c->listen_client))
		return conf_fail(x, line_of(x, "listen", "client"), "listen.client",
				 "'%s' is not loopback or unix: set http.api_keys_file so clients must present a key",
				 c->listen_client);
	if (!c->listen_http[0]) {
		if (c->http_api_keys_file[0] && !c->listen_client[0])
			return conf_fail(x, line_of(x, "http", "api_keys_file"),
					 "http.api_keys_file", "set, but listen.http and listen.client are off");
		if (c->http_api_keys_file[0])
			return conf_keys_check(x);
		return 0;
	}
	if (!is_hostport(c->listen_http))
		return conf_fail(x, line_of(x, "listen", "http"), "listen.http",
				 "one IPv4:port, [IPv6]:port or localhost:port");
	if (!c->http_api_keys_file[0]) {
		if (!kvd_hostport_is_loopback(c->listen_http))
			return conf_fail(x, line_of(x, "listen", "http"), "listen.http",
					 "'%s' is not a loopback address: set http.api_keys_file so clients must present a key",
					 c->listen_http);
		return 0;
	}
	return conf_keys_check(x);
}

/* A transport other than verbs: a verbs key set to a value other than
 * its default would be silently unused; the default itself is fine (kvd
 * --check-config prints every key, and what it prints must load). 0, or
 * -1 naming the first such key. */
static int conf_verbs_unused(struct conf_ctx *x)
{
	struct kvd_config *c = x->c;
	static const char *const keys[] = {
		"verbs_device", "verbs_port", "verbs_gid_index",
		"verbs_qp_depth", "verbs_inline", "verbs_write_scope",
		"verbs_flush_timeout_ms",
	};
	struct kvd_config *d = malloc(sizeof(*d));
	bool differs[KVD_ARRAY_SIZE(keys)];

	if (!d)
		return conf_fail(x, 0, "", "out of memory");
	kvd_config_defaults(d);
	differs[0] = strcmp(c->verbs_device, d->verbs_device) != 0;
	differs[1] = c->verbs_port != d->verbs_port;
	differs[2] = c->verbs_gid_index != d->verbs_gid_index;
	differs[3] = c->verbs_qp_depth != d->verbs_qp_depth;
	differs[4] = c->verbs_inline != d->verbs_inline;
	differs[5] = c->verbs_write_scope != d->verbs_write_scope;
	differs[6] = c->verbs_flush_timeout_ms != d->verbs_flush_timeout_ms;
	free(d);
	for (size_t i = 0; i < KVD_ARRAY_SIZE(keys); i++) {
		int l = line_of(x, "transfer", keys[i]);
		char full[64];

		if (!differs[i])
			continue;
		snprintf(full, sizeof(full), "transfer.%s", keys[i]);
		return conf_fail(x, l, full,
				 "only with transfer.transport=verbs (transport is %s)",
				 kvd_transport_name(c->transport));
	}
	return 0;
}

/* The emulated device emu:DIR[,opts] (dev): a build that has it, and a
 * DIR that is an absolute path to a directory. 0, or -1. */
static int conf_validate_verbs_emu(struct conf_ctx *x, const char *dev)
{
	char dir[256];
	size_t n = strcspn(dev + 4, ",");
	struct stat sb;

	if (!KVD_VERBS_EMU)
		return conf_fail(x, line_of(x, "transfer", "verbs_device"),
				 "transfer.verbs_device",
				 "emu: this kvd was built without the emulated RDMA device, a test device (meson -Dverbs_emu=true)");

	if (n == 0 || dev[4] != '/' || n >= sizeof(dir))
		return conf_fail(x, line_of(x, "transfer", "verbs_device"),
				 "transfer.verbs_device",
				 "emu: needs an absolute directory: emu:/DIR[,opts]");
	memcpy(dir, dev + 4, n);
	dir[n] = '\0';
	if (stat(dir, &sb) < 0 || !S_ISDIR(sb.st_mode))
		return conf_fail(x, line_of(x, "transfer", "verbs_device"),
				 "transfer.verbs_device",
				 "emu: '%s' is not a directory", dir);
	return 0;
}

/* The verbs keys: a device is an ibverbs name, or the emulated device
 * emu:DIR[,opts] whose DIR exists (its options are checked when it
 * opens: net/verbs/verbs_emu.c, the one parser of them). A real device needs
 * a build with libibverbs; the emulation one built with -Dverbs_emu=true
 * (test builds). */
static int conf_validate_verbs(struct conf_ctx *x)
{
	struct kvd_config *c = x->c;
	const char *dev = c->verbs_device;

	if (c->transport != KVD_TRANSPORT_VERBS)
		return conf_verbs_unused(x);
	/* the NIC places the pages in decode's memory as they are: a
	 * batch can be authenticated (its MAC), never encrypted */
	if (c->encrypt)
		return conf_fail(x, KVD_MAX(line_of(x, "transfer", "encrypt"),
					    line_of(x, "transfer", "transport")),
				 "transfer.encrypt",
				 "RDMA writes KV pages in the clear (batches are authenticated, not encrypted): transfer.encrypt needs transfer.transport=tcp");
	if (!strncmp(dev, "emu:", 4))
		return conf_validate_verbs_emu(x, dev);
	if (dev[0] && !is_name(dev))
		return conf_fail(x, line_of(x, "transfer", "verbs_device"),
				 "transfer.verbs_device",
				 "'%s' is not a device name (letters, digits, '_', '-', '.') nor emu:/DIR[,opts]",
				 dev);
	if (!KVD_HAVE_VERBS)
		return conf_fail(x, line_of(x, "transfer", "transport"),
				 "transfer.transport",
				 KVD_VERBS_EMU ? "verbs: this kvd was built without libibverbs (only the emulated device, verbs_device=emu:/DIR, is available)"
						: "verbs: this kvd was built without libibverbs");
	return 0;
}

/* transfer.send_timeout_ms (0: release_timeout_ms): within the release
 * timeout, and long enough for one batch at link_gbps. */
static int conf_validate_send_timeout(struct conf_ctx *x)
{
	const struct kvd_config *c = x->c;
	int l = line_of(x, "transfer", "send_timeout_ms");

	if (!c->send_timeout_ms)
		return 0;
	if (c->send_timeout_ms > c->release_timeout_ms)
		return conf_fail(x, KVD_MAX(l, line_of(x, "transfer", "release_timeout_ms")),
				 "transfer.send_timeout_ms",
				 "%u is above transfer.release_timeout_ms=%u",
				 c->send_timeout_ms, c->release_timeout_ms);
	if (batch_ms(c->max_batch_bytes, c->link_gbps) >= c->send_timeout_ms)
		return conf_fail(x, KVD_MAX(l, KVD_MAX(line_of(x, "transfer", "max_batch_bytes"),
						      line_of(x, "transfer", "link_gbps"))),
				 "transfer.send_timeout_ms",
				 "a %llu-byte batch takes %.1f ms at %g Gbit/s, not within send_timeout_ms=%u",
				 (unsigned long long)c->max_batch_bytes,
				 batch_ms(c->max_batch_bytes, c->link_gbps),
				 c->link_gbps, c->send_timeout_ms);
	return 0;
}

/* model.path: set and readable; model.fingerprint_cache: absolute,
 * "off" or empty. 0, or -1. */
static int conf_validate_model(struct conf_ctx *x)
{
	const struct kvd_config *c = x->c;

	if (!c->model_path[0])
		return conf_fail(x, 0, "model.path",
				 "required: the GGUF model this node serves");
	if (access(c->model_path, R_OK) < 0)
		return conf_fail(x, line_of(x, "model", "path"), "model.path",
				 "cannot read '%s': %s", c->model_path,
				 strerror(errno));
	if (c->fingerprint_cache[0] && strcmp(c->fingerprint_cache, "off") &&
	    c->fingerprint_cache[0] != '/')
		return conf_fail(x, line_of(x, "model", "fingerprint_cache"),
				 "model.fingerprint_cache",
				 "'%s' must be an absolute directory path, \"off\", or empty",
				 c->fingerprint_cache);
	return 0;
}

/* The step and the pool: engine.step_tokens holds max_batch requests,
 * the KV pool is sized by exactly one of its two keys. 0, or -1. */
static int conf_validate_capacity(struct conf_ctx *x)
{
	const struct kvd_config *c = x->c;
	int l;

	if (c->step_tokens && c->step_tokens < c->max_batch)
		return conf_fail(x, line_of(x, "engine", "step_tokens"), "engine.step_tokens",
				 "%u is below engine.max_batch (%u): every running request must fit in every step",
				 c->step_tokens, c->max_batch);
	if (!!c->pool_tokens == !!c->memory_bytes) {
		l = KVD_MAX(line_of(x, "kv", "pool_tokens"),
			    line_of(x, "kv", "memory_bytes"));
		return conf_fail(x, l, c->pool_tokens ? "kv.memory_bytes" : "kv.pool_tokens",
				 "set exactly one of kv.pool_tokens and kv.memory_bytes (%s)",
				 c->pool_tokens ? "both are set" : "neither is set");
	}
	return 0;
}

/* What each role has: prefill peers only on decode nodes (and there at
 * least one), a peer listener not on decode nodes, a client listener
 * not on prefill ones; the peer listener is TCP. 0, or -1. */
static int conf_validate_roles(struct conf_ctx *x)
{
	const struct kvd_config *c = x->c;

	if (c->role == KVD_ROLE_DECODE && c->n_peers_prefill == 0)
		return conf_fail(x, line_of(x, "node", "role"), "peers.prefill",
				 "a decode node needs at least one prefill peer");
	if (c->role != KVD_ROLE_DECODE && c->n_peers_prefill)
		return conf_fail(x, line_of(x, "peers", "prefill"), "peers.prefill",
				 "only decode nodes have prefill peers (role is %s)",
				 kvd_role_name(c->role));
	if (c->role == KVD_ROLE_DECODE && c->listen_peer[0])
		return conf_fail(x, line_of(x, "listen", "peer"), "listen.peer",
				 "decode nodes do not accept peers; listen.peer is for prefill nodes");
	if (c->role == KVD_ROLE_PREFILL && c->listen_client[0])
		return conf_fail(x, line_of(x, "listen", "client"), "listen.client",
				 "prefill nodes serve no clients; listen.client is for decode and standalone nodes");
	if (c->listen_peer[0] && !is_hostport(c->listen_peer))
		return conf_fail(x, line_of(x, "listen", "peer"), "listen.peer",
				 "peers connect over TCP: one IPv4:port, [IPv6]:port or localhost:port");
	return 0;
}

/* The transfer timeouts against each other: a batch at link_gbps within
 * the release timeout, the send timeout (conf_validate_send_timeout),
 * prefill not shorter than transfer, three heartbeats within release.
 * 0, or -1. */
static int conf_validate_timeouts(struct conf_ctx *x)
{
	const struct kvd_config *c = x->c;
	int l;

	if (batch_ms(c->max_batch_bytes, c->link_gbps) >= c->release_timeout_ms) {
		l = KVD_MAX(line_of(x, "transfer", "max_batch_bytes"),
			    KVD_MAX(line_of(x, "transfer", "link_gbps"),
				    line_of(x, "transfer", "release_timeout_ms")));
		return conf_fail(x, l, "transfer.max_batch_bytes",
				 "a %llu-byte batch takes %.1f ms at %g Gbit/s, not within release_timeout_ms=%u",
				 (unsigned long long)c->max_batch_bytes,
				 batch_ms(c->max_batch_bytes, c->link_gbps),
				 c->link_gbps, c->release_timeout_ms);
	}
	l = conf_validate_send_timeout(x);
	if (l)
		return l;
	if (c->prefill_timeout_ms < c->transfer_timeout_ms)
		return conf_fail(x, line_of(x, "transfer", "prefill_timeout_ms"),
				 "transfer.prefill_timeout_ms",
				 "%u is shorter than transfer.transfer_timeout_ms=%u",
				 c->prefill_timeout_ms, c->transfer_timeout_ms);
	if (c->heartbeat_ms * 3 > c->release_timeout_ms)
		return conf_fail(x, line_of(x, "transfer", "heartbeat_ms"),
				 "transfer.heartbeat_ms",
				 "three heartbeats (%u ms) must fit in release_timeout_ms=%u",
				 c->heartbeat_ms * 3, c->release_timeout_ms);
	return 0;
}

/* The cross-key rules, in order; the first that fails is the error
 * (conf_fail keeps only the first). 0, or -1. */
static int conf_validate(struct conf_ctx *x)
{
	struct kvd_config *c = x->c;
	int l;

	if ((l = conf_validate_model(x)) || (l = conf_validate_capacity(x)) ||
	    (l = conf_validate_roles(x)) || (l = conf_validate_peering(x)) ||
	    (l = conf_validate_http(x)))
		return l;
	if (c->write_queue_soft > c->write_queue_hard)
		return conf_fail(x, line_of(x, "listen", "write_queue_soft"),
				 "listen.write_queue_soft",
				 "%llu is above listen.write_queue_hard=%llu",
				 (unsigned long long)c->write_queue_soft,
				 (unsigned long long)c->write_queue_hard);
	l = conf_validate_verbs(x);
	if (l)
		return l;
	if (!strcmp(c->kv_backend, "cuda") && !KVD_HAVE_CUDA)
		return conf_fail(x, line_of(x, "kv", "backend"), "kv.backend",
				 "cuda: this kvd was built without CUDA");
	return conf_validate_timeouts(x);
}

/* Resolve defaults that depend on other keys or the environment. */
static int conf_resolve(struct conf_ctx *x)
{
	struct kvd_config *c = x->c;
	const char *rt;
	int n;

	snprintf(c->kv_backend, sizeof(c->kv_backend), "%s",
		 backends[c->kv_backend_id]);
	if (!c->admin_socket[0]) {
		rt = getenv("RUNTIME_DIRECTORY");
		if (!rt || !*rt || strchr(rt, ':'))
			rt = "/run/kvd";
		n = snprintf(c->admin_socket, sizeof(c->admin_socket),
			     "%s/%s.sock", rt, c->node_name);
		if (n >= (int)sizeof(c->admin_socket))
			return conf_fail(x, 0, "admin.socket",
					 "derived path too long");
	}
	if (strcmp(c->admin_socket, "none") != 0 &&
	    (c->admin_socket[0] != '/' || strlen(c->admin_socket) >= 108))
		return conf_fail(x, line_of(x, "admin", "socket"), "admin.socket",
				 "'%s' must be an absolute path under 108 bytes, or 'none'",
				 c->admin_socket);
	return 0;
}

int kvd_config_check_host(const struct kvd_config *c,
			  struct kvd_config_error *err)
{
	char dir[sizeof(c->admin_socket)];
	const char *cause = NULL;
	char *slash;
	struct stat st;

	memset(err, 0, sizeof(*err));
	if (!strcmp(c->admin_socket, "none"))
		return 0;
	snprintf(dir, sizeof(dir), "%s", c->admin_socket);
	slash = strrchr(dir, '/');    /* absolute: conf_resolve made sure */
	slash[slash == dir] = '\0';
	if (stat(dir, &st) < 0)
		cause = strerror(errno);
	else if (!S_ISDIR(st.st_mode))
		cause = "not a directory";
	else if (faccessat(AT_FDCWD, dir, W_OK | X_OK, AT_EACCESS) < 0)
		cause = strerror(errno);
	if (!cause)
		return 0;
	snprintf(err->file, sizeof(err->file), "%s", c->path);
	snprintf(err->key, sizeof(err->key), "admin.socket");
	snprintf(err->msg, sizeof(err->msg),
		 "the socket's directory %.240s: %.60s (uid %u); create it, or set"
		 " admin.socket (or $RUNTIME_DIRECTORY for the default) to a"
		 " directory this user may write, or 'none'", dir, cause,
		 (unsigned)geteuid());
	return -1;
}

static int conf_parse(struct kvd_config *c, struct conf_ctx *x)
{
	int r;

	kvd_config_defaults(c);
	r = ini_parse_stream(conf_reader, x, conf_handler, x);
	if (r > 0 && !x->failed)
		conf_fail(x, r, NULL, "syntax error (expected [section] or key = value)");
	if (x->failed)
		return -1;
	if (conf_resolve(x) < 0 || conf_validate(x) < 0)
		return -1;
	return 0;
}

int kvd_config_load(struct kvd_config *c, const char *path,
		    struct kvd_config_error *err)
{
	struct conf_ctx x = { .c = c, .err = err, .name = path };
	struct stat st;
	int r;

	memset(err, 0, sizeof(*err));
	x.file = fopen(path, "re");
	if (!x.file) {
		r = -errno;
		snprintf(err->file, sizeof(err->file), "%s", path);
		snprintf(err->msg, sizeof(err->msg), "cannot open: %s",
			 strerror(-r));
		return r;
	}
	if (fstat(fileno(x.file), &st) == 0 && !S_ISREG(st.st_mode)) {
		fclose(x.file);
		snprintf(err->file, sizeof(err->file), "%s", path);
		snprintf(err->msg, sizeof(err->msg), "not a regular file");
		return -EINVAL;
	}
	r = conf_parse(c, &x);
	fclose(x.file);
	if (r == 0) {
		snprintf(c->path, sizeof(c->path), "%s", path);
		c->path_is_file = true;
	}
	return r;
}

int kvd_config_load_string(struct kvd_config *c, const char *name,
			   const char *text, struct kvd_config_error *err)
{
	struct conf_ctx x = { .c = c, .err = err, .name = name, .text = text };
	int r;

	memset(err, 0, sizeof(*err));
	r = conf_parse(c, &x);
	if (r == 0)
		snprintf(c->path, sizeof(c->path), "%s", name);
	return r;
}

int kvd_config_load_pairs(struct kvd_config *c, const char *name,
			  const struct kvd_config_pair *pairs, size_t n,
			  struct kvd_config_error *err)
{
	struct conf_ctx x = { .c = c, .err = err, .name = name };
	char sec[64];

	memset(err, 0, sizeof(*err));
	kvd_config_defaults(c);
	for (size_t i = 0; i < n && !x.failed; i++) {
		const char *dot = strchr(pairs[i].key, '.');

		if (!dot || (size_t)(dot - pairs[i].key) >= sizeof(sec)) {
			conf_fail(&x, 0, pairs[i].key, "not a section.key");
			break;
		}
		snprintf(sec, sizeof(sec), "%.*s", (int)(dot - pairs[i].key),
			 pairs[i].key);
		conf_handler(&x, sec, dot + 1, pairs[i].value);
	}
	if (x.failed || conf_resolve(&x) < 0 || conf_validate(&x) < 0)
		return -1;
	snprintf(c->path, sizeof(c->path), "%s", name);
	return 0;
}

int kvd_config_validate(struct kvd_config *c, struct kvd_config_error *err)
{
	struct conf_ctx x = { .c = c, .err = err, .name = c->path };

	memset(err, 0, sizeof(*err));
	return conf_validate(&x);
}

/* ---- printing ------------------------------------------------------------ */

static const char *type_doc(const struct conf_key *k, char *buf, size_t size)
{
	size_t o = 0;

	switch (k->type) {
	case CT_STR: return "string";
	case CT_NAME: return "name";
	case CT_U32:
	case CT_U64:
		snprintf(buf, size, "integer, %.0f..%.0f", k->min, k->max);
		return buf;
	case CT_U32_AUTO:
		snprintf(buf, size, "auto | integer, %.0f..%.0f", k->min, k->max);
		return buf;
	case CT_SIZE:
		snprintf(buf, size, "size (B, K/KiB.. x1024, KB.. x1000), %.0f..%.0f",
			 k->min, k->max);
		return buf;
	case CT_DOUBLE:
		snprintf(buf, size, "number, %g..%g", k->min, k->max);
		return buf;
	case CT_BOOL: return "boolean (on/off)";
	case CT_ENUM:
		for (int i = 0; k->choices[i]; i++)
			o += (size_t)snprintf(buf + o, size - o, "%s%s",
					      i ? " | " : "", k->choices[i]);
		return buf;
	case CT_LIST: return "comma list of host:port";
	case CT_MODE: return "octal file mode";
	case CT_ADDR: return "comma list of host:port | unix:/PATH";
	}
	return "?";
}

void kvd_config_reference(FILE *out)
{
	const char *sec = "";
	char buf[256];

	fprintf(out, "kvd configuration reference (INI; every key below, no others).\n"
		     "Errors name FILE:LINE and the key; kvd then exits 78.\n");
	for (size_t i = 0; i < N_KEYS; i++) {
		const struct conf_key *k = &conf_keys[i];

		if (strcmp(sec, k->section)) {
			sec = k->section;
			fprintf(out, "\n[%s]\n", sec);
		}
		fprintf(out, "  %s.%s\n    type: %s\n    default: %s\n    %s\n",
			k->section, k->key, type_doc(k, buf, sizeof(buf)),
			k->def[0] ? k->def : "(empty)", k->help);
	}
	fprintf(out, "\nRules across keys:\n"
		"  - exactly one of kv.pool_tokens and kv.memory_bytes;\n"
		"  - decode nodes need peers.prefill and have no listen.peer;\n"
		"    prefill nodes have no peers.prefill and no listen.client;\n"
		"  - transfer.max_batch_bytes must move within transfer.release_timeout_ms\n"
		"    at transfer.link_gbps;\n"
		"  - three transfer.heartbeat_ms fit in transfer.release_timeout_ms;\n"
		"  - transfer.send_timeout_ms (when not 0) is at most\n"
		"    transfer.release_timeout_ms, and a max_batch_bytes batch moves\n"
		"    within it at transfer.link_gbps;\n"
		"  - transfer.prefill_timeout_ms >= transfer.transfer_timeout_ms;\n"
		"  - without peers.key_file, listen.peer and peers.prefill are loopback\n"
		"    addresses and transfer.encrypt is off; with it, the file is mode\n"
		"    0600 (or stricter) and holds at least 32 bytes;\n"
		"  - listen.write_queue_soft <= listen.write_queue_hard;\n"
		"  - transfer.transport=verbs and kv.backend=cuda need a build with them\n"
		"    (verbs with transfer.verbs_device=emu:/DIR, the emulated device,\n"
		"    runs in every build); the verbs_* keys keep their defaults unless\n"
		"    transfer.transport=verbs; transfer.encrypt needs transport=tcp;\n"
		"  - model.path must be readable.\n");
}

static void print_wrapped_comment(FILE *out, const char *text)
{
	const char *p = text;

	while (*p) {
		size_t n = strlen(p);

		if (n > 74) {
			n = 74;
			while (n > 20 && p[n] != ' ')
				n--;
		}
		fprintf(out, "; %.*s\n", (int)n, p);
		p += n;
		while (*p == ' ')
			p++;
	}
}

void kvd_config_example(FILE *out)
{
	const char *sec = "";

	fprintf(out, "; kvd example configuration - generated by `kvd --config-example`\n"
		     "; from the key table in conf/config.c. Every key is shown at its\n"
		     "; default; uncomment and change what you need.\n");
	for (size_t i = 0; i < N_KEYS; i++) {
		const struct conf_key *k = &conf_keys[i];

		if (strcmp(sec, k->section)) {
			sec = k->section;
			fprintf(out, "\n[%s]\n", sec);
		}
		print_wrapped_comment(out, k->help);
		fprintf(out, ";%s = %s\n", k->key, k->def);
	}
}

static void print_value(FILE *out, const struct kvd_config *c,
			const struct conf_key *k)
{
	const void *f = (const char *)c + k->offset;

	switch (k->type) {
	case CT_STR:
	case CT_NAME:
	case CT_ADDR:
		fprintf(out, "%s", (const char *)f);
		break;
	case CT_U32:
		fprintf(out, "%u", *(const uint32_t *)f);
		break;
	case CT_U32_AUTO:
		if (*(const uint32_t *)f == UINT32_MAX)
			fprintf(out, "auto");
		else
			fprintf(out, "%u", *(const uint32_t *)f);
		break;
	case CT_U64:
	case CT_SIZE:
		fprintf(out, "%llu", (unsigned long long)*(const uint64_t *)f);
		break;
	case CT_DOUBLE:
		fprintf(out, "%g", *(const double *)f);
		break;
	case CT_BOOL:
		fprintf(out, "%s", *(const bool *)f ? "on" : "off");
		break;
	case CT_ENUM:
		fprintf(out, "%s", k->choices[*(const int *)f]);
		break;
	case CT_MODE:
		fprintf(out, "0%03o", *(const uint32_t *)f);
		break;
	case CT_LIST:
		for (uint32_t i = 0; i < c->n_peers_prefill; i++)
			fprintf(out, "%s%s", i ? "," : "", c->peers_prefill[i]);
		break;
	}
}

void kvd_config_print(FILE *out, const struct kvd_config *c)
{
	const char *sec = "";

	fprintf(out, "; resolved configuration of %s\n", c->path);
	for (size_t i = 0; i < N_KEYS; i++) {
		const struct conf_key *k = &conf_keys[i];

		if (strcmp(sec, k->section)) {
			sec = k->section;
			fprintf(out, "%s[%s]\n", i ? "\n" : "", sec);
		}
		fprintf(out, "%s = ", k->key);
		print_value(out, c, k);
		fputc('\n', out);
	}
}

const char *kvd_role_name(enum kvd_role r)
{
	return r <= KVD_ROLE_STANDALONE ? roles[r] : "?";
}

void kvd_config_model_name(const struct kvd_config *c, char *out, size_t size)
{
	const char *base;
	size_t n;

	if (c->http_model_name[0]) {
		snprintf(out, size, "%s", c->http_model_name);
		return;
	}
	base = strrchr(c->model_path, '/');
	base = base ? base + 1 : c->model_path;
	n = strlen(base);
	if (n > 5 && !strcmp(base + n - 5, ".gguf"))
		n -= 5;
	snprintf(out, size, "%.*s", (int)(n < size ? n : size - 1), base);
}

const char *kvd_transport_name(enum kvd_transport t)
{
	return t <= KVD_TRANSPORT_VERBS ? transports[t] : "?";
}

const char *kvd_cap_policy_name(enum kvd_cap_policy p)
{
	return p <= KVD_CAP_CLAMP ? policies[p] : "?";
}
