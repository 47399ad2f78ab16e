/* http_int.h - shared internals of the HTTP front (http.c, http_api.c).
 *
 * Layers: http_api.c (endpoints, JSON, SSE, keys; the sink ops) calls
 * http.c (listener, connections, parser, bounds, writes), which reaches
 * the endpoints only through hs->handler. Both sit beside client.c:
 * below the roles, above sink.c, req.c and io.c. Loop thread only.
 */
#pragma once

#include "daemon/front/front_int.h"
#include "daemon/front/prep.h"
#include "net/wire/http_wire.h"
#include "net/wire/openai.h"

struct kvd_apikeys;
struct http_conn;
struct api_prep;
struct http_tok_job;
struct json_t;

struct api_shape;

/* Pipelined input held while a request is answered (bytes); reading
 * stops while it is full. */
#define HTTP_IN_MAX 65536u
/* Tokens of logprobs a non-streamed answer holds until it is sent, over
 * all its choices (struct http_lp: about 190 bytes each with 20
 * alternatives, so at most about 3 MiB an exchange; a streamed answer
 * sends them as it goes). */
#define HTTP_LP_HELD_MAX 16384u
/* After a refusal that leaves a body unread (http__drain_after), what
 * the client still sends is dropped for at most this long, and at most
 * http.max_body_bytes + HTTP_IN_MAX bytes, before the connection closes. */
#define HTTP_DRAIN_MS 2000u
/* A loop iteration that used this much of the loop thread's CPU is
 * logged (event=loop_busy): every other connection waited that long. */
#define HTTP_LOOP_BUSY_MS 20u

/* One output token's logprobs, held with the text it produced: bytes
 * [start, end) of the answer's text (absolute, from its first byte) came
 * with it, so a chunk carries the logprobs of the text it carries. */
struct http_lp {
	int32_t id;
	size_t start, end;
	struct sampler_logprobs lp;
};

/* What each choice of an exchange has of its own (`n` > 1: one engine
 * request per choice, daemon/front/README.md): its request, its text
 * held back, its logprobs, its tool calls, its end. Listed once here
 * and used twice: struct http_choice (a choice put aside) and the
 * exchange's own fields (the choice being answered, reached as x->text
 * etc. by every writer), so putting one aside and taking another is a
 * struct copy (http_api.c choice_take). */
#define HTTP_CHOICE_FIELDS \
	struct serve_req *r;             /* NULL once answered */ \
	uint32_t index;                  /* choices[].index */ \
	char *text;                      /* (len, cap) generated text not yet \
					  * sent (stream: held back for stop \
					  * strings; else the whole answer) */ \
	size_t len, cap; \
	bool role_sent;                  /* chat stream: the role delta */ \
	uint32_t cached_tokens;          /* from the final: the usage's \
					  * prompt_tokens_details */ \
	size_t base;                     /* text bytes sent and dropped \
					  * before text[0] (stream) */ \
	struct http_lp *lps;             /* (n_lp, cap_lp) tokens whose text \
					  * was not sent yet; at most \
					  * max_tokens */ \
	uint32_t n_lp, cap_lp; \
	bool tool_plain;                 /* openai_calls_scan's state */ \
	uint32_t n_calls;                /* calls found */ \
	struct json_t *calls;            /* not streamed: their JSON array */ \
	/* n > 1: the choice's end (http_api.c choices_final) */ \
	bool done;                       /* answered (final or stop) */ \
	char finish[16];                 /* its finish_reason */ \
	uint32_t completion;             /* its output tokens */ \
	struct json_t *json;             /* not streamed: its choice object */

struct http_choice {
	HTTP_CHOICE_FIELDS
};

/* Most choices one exchange may ask for (http.max_n's upper bound). */
#define HTTP_N_MAX OPENAI_N_MAX

/* One request being answered on a connection (one at a time). */
struct http_exchange {
	bool active;                     /* answering; the next request waits */
	struct api_prep *prep;           /* its body being prepared off the
					  * loop (http_api.c); NULL none */
	struct http_tok_job *tok;        /* /tokenize, /detokenize being
					  * answered off the loop (http_tok.c);
					  * NULL none */
	bool stream;                     /* SSE */
	bool chat;                       /* chat.completion shapes */
	const struct api_shape *shape;   /* the answer's writers: completions,
					  * chat or responses (http_api.c) */
	bool head_sent;                  /* status line and headers queued */
	/* the choice being answered (of n_choices: the others wait in
	 * choices[], choices[cur] being stale while it is here) */
	union {
		struct { HTTP_CHOICE_FIELDS };
		struct http_choice ch;
	};
	struct http_choice *choices;     /* (n_choices) when n > 1, else NULL */
	uint32_t n_choices;              /* 1 .. HTTP_N_MAX */
	uint32_t cur;                    /* whose fields are above */
	uint32_t n_done;                 /* choices answered */
	/* requests whose answer is complete but which may still run (a stop
	 * string, or the exchange ended): orphaned by the kick (http.c) */
	struct serve_req *cancel[HTTP_N_MAX];
	uint32_t n_cancel;
	uint64_t num;                    /* exchange number (client_id) */
	uint64_t req_id;                 /* its request's registry id, the
					  * id= of every line naming it, on
					  * this node and (remote_id=) on its
					  * prefill peer */
	char id[KVD_PUBLIC_ID_MAX];      /* the answers' id: "cmpl-",
					  * "chatcmpl-" or "resp_" and 128
					  * random bits in hex (api_public_id) */
	int64_t created;                 /* unix seconds */
	char model[OPENAI_MODEL_MAX + 1];
	char *stop[OPENAI_STOP_MAX];     /* owned */
	size_t stop_len[OPENAI_STOP_MAX];
	uint32_t n_stop;
	uint32_t prompt_tokens;
	uint32_t allocs;                 /* allocations made (KVD_HTTP_NOMEM) */
	uint64_t t_start_ns;
	char method[16];
	char path[64];
	char tenant[64];
	uint64_t seed;                   /* the sampler's: the request's or
					  * drawn; in the answer (kvd's
					  * extension field "seed"); choice i
					  * samples with seed + i */
	/* responses: the request's sampling (echoed in the response
	 * object), the SSE events' sequence_number and the text already
	 * streamed (the text stays: the done events carry all of it) */
	float temperature, top_p;
	uint32_t max_tokens;
	uint32_t seq;
	size_t sent;
	bool lp_on;                      /* the request asked for logprobs */
	/* tool calls (net/wire/openai_tools.h): read from the text in
	 * tool_fmt (CHAT_NONE: the request offered none, or "none") */
	enum chat_format tool_fmt;
	struct openai_tool *tools;       /* owned (n_tools): names only */
	size_t n_tools;
	int32_t tool_token;              /* the control token that opens the
					  * format's calls (its mark,
					  * OPENAI_CALLS_MARK, goes into the
					  * answer: detok drops it), or -1;
					  * tool_fmt set only */
};

struct http_conn {
	struct http_server *hs;
	struct serve *s;
	uv_tcp_t tcp;
	struct kvd_list node;            /* hs->conns */
	struct serve_sink sink;          /* its requests */
	struct http_wire wire;
	struct wbound wb;
	uint64_t conn_id;
	uint64_t t_accept_ns, t_rx_ns;
	uint64_t t_idle_ns;              /* the last answer ended: idle counts
					  * from it, not from the last byte
					  * (a CRLF trickle starts no request) */
	uint64_t t_req_ns;               /* a request began arriving; 0 none */
	uint64_t n_requests;             /* requests parsed on it */
	const char *doom;                /* close at the next sweep: reason */
	bool closing, counted, shutting, eof;
	struct serve_pending pend;       /* counted, but no head with a good
					  * key yet: the first to go when the
					  * node is at listen.max_clients */
	bool refusing;                   /* over listen.max_clients: its
					  * request is read, then 503 */

	bool http10;                     /* the current request's version */
	bool close_after;                /* close once the answer is out */
	bool kicked;                     /* on hs->kick_list */
	bool head_judged;                /* head_check ran for this request */
	bool cors;                       /* the current request's Origin is
					  * allowed: its answers carry the
					  * CORS headers (http_cors.c) */
	char cors_origin[HTTP_WIRE_ORIGIN_MAX + 1];
	bool draining;                   /* answered and half-closed: reads
					  * are dropped (http__drain_after) */
	uint64_t drain_left;             /* bytes still dropped before closing */
	uint64_t t_drain_ns;             /* draining since */
	struct kvd_list kick_node;
	uv_shutdown_t shut;
	struct http_exchange x;
	size_t in_len;                   /* bytes of in[] not parsed yet */
	char in[HTTP_IN_MAX];
};

/* The endpoints: one complete request in hc->wire.msg (valid during the
 * call). The handler answers now or starts an exchange. */
typedef void (*http_handler_fn)(struct http_conn *hc, const struct http_msg *m);
/* The head of a request whose body has not been read yet (method, path
 * and headers in m): true to read the body; false when the endpoint
 * refused it - answered, and the connection set to close (the body that
 * may follow is never read). */
typedef bool (*http_head_fn)(struct http_conn *hc, const struct http_msg *m);
/* True when the head carries a good key (or the front has no keys): the
 * connection then holds its slot for good. */
typedef bool (*http_auth_fn)(const struct http_conn *hc, const struct http_msg *m);

struct http_server {
	struct serve *s;
	uv_tcp_t listener;
	bool listener_open;
	uv_idle_t kick;                  /* deferred work: parse pipelined
					  * input, orphan a stopped request */
	bool kick_open, kick_on;
	struct kvd_list kick_list;       /* http_conn.kick_node */
	struct kvd_list conns;           /* http_conn.node */
	uint32_t n_refusing;             /* connections reading toward a 503 */
	http_handler_fn handler;
	http_head_fn head_check;         /* NULL: every body is read */
	http_auth_fn head_auth;
	const struct serve_sink_ops *sink_ops;
	void (*exchange_free)(struct http_exchange *x);
	char model_name[128];
	struct kvd_origins cors;         /* http.cors_origins */
	enum chat_format chat_format;    /* the daemon's, resolved at boot
					  * (CHAT_NONE: chat is refused) */
	uint64_t next_exchange;
	uint32_t nomem_at;               /* fault-point builds: the allocation
					  * of each exchange that fails
					  * (KVD_HTTP_NOMEM); 0 none */
	uv_prepare_t watch;              /* the loop's CPU per iteration */
	bool watch_open;
	uint64_t watch_cpu_ns;           /* the loop thread's CPU time at the
					  * last iteration's prepare; 0 none */
	bool stopping;
	unsigned handles_open;            /* at close: callbacks to come */
};

/* Connections over listen.max_clients that are read and answered 503
 * at once; past this many more, a new one is closed unread. */
#define HTTP_REFUSING_MAX 32u

/* http.c */
/* Listen on listen.http with `handler`; hs is s->front->http. 0 or an error
 * (logged). */
int http__listen(struct http_server *hs);
/* Queue bytes (malloc'd, consumed) through the connection's bound. */
void http__write(struct http_conn *hc, char *data, size_t len);
/* Queue a copy. */
void http__write_copy(struct http_conn *hc, const char *data, size_t len);
/* Status line and headers. content_length < 0: chunked (HTTP/1.1) or,
 * for HTTP/1.0, until close. */
void http__head(struct http_conn *hc, int status, const char *ctype,
		long long content_length);
/* The same with `extra`: more header lines, each ending "\r\n" (a
 * constant of ours, under 512 bytes). */
void http__head_ext(struct http_conn *hc, int status, const char *ctype,
		    long long content_length, const char *extra);
/* A 204 answer (no body) with `extra` header lines ("Name: v\r\n"). */
void http__no_content(struct http_conn *hc, const char *extra);
/* One body piece of a chunked (or until-close) answer; len 0 ends it. */
void http__chunk(struct http_conn *hc, const char *data, size_t len);
/* A whole answer with a body. */
void http__respond(struct http_conn *hc, int status, const char *ctype,
		   const char *body, size_t len);
/* The answer about to be queued is the connection's last, and the body
 * the client may still send is unread: once the answer is out, kvd
 * half-closes and drops what comes (bounded in bytes and by
 * HTTP_DRAIN_MS), then closes - so the client reads the answer instead of
 * a reset. */
void http__drain_after(struct http_conn *hc);
/* The answer of the current request is complete: the next may parse
 * (deferred), or the connection closes if it must. */
void http__exchange_done(struct http_conn *hc);
/* An HTTP refusal before any request existed (a parse error, a key, the
 * body, draining at the door, max_clients): counted once in
 * kvd_requests_total under `tenant` (NULL or "-": the default tenant)
 * with the outcome its status maps to (400-class: invalid_request, 408:
 * timeout, 429: overloaded, 503: `code_503`, 5xx: internal). */
void http__refusal_count(struct serve *s, int status, const char *tenant,
			 int code_503);
/* Run deferred work for hc soon (from the loop, not inside a caller). */
void http__kick(struct http_conn *hc);
const char *http__status_text(int status);

/* http_reply.c: answers that belong to no request, and the keys. */
struct kvd_apikey_info;
/* The refusal line (event=http_request, rate-limited) of a request. */
void http__log(struct http_conn *hc, int status, const char *tenant,
	       const char *what);
/* {"error": {message, type, param, code}} (malloc'd, *len its length);
 * NULL without memory. */
char *http__error_json(const char *msg, const char *type, const char *code,
		       const char *param, size_t *len);
/* j as the whole answer (j's reference taken; a 500 "{}" when NULL or
 * it cannot be written out). */
void http__respond_json(struct http_conn *hc, int status, struct json_t *j);
/* An error in OpenAI's shape that belongs to no request (logged, counted
 * in kvd_requests_total); the exchange is done after it. msg must be
 * safe to echo. */
void http__error(struct http_conn *hc, int status, const char *type,
		 const char *code, const char *param, const char *msg,
		 const char *tenant);
/* The request's key: its tenant, role and limits (a keyless "default"
 * without keys); NULL for a missing or wrong key (nothing answered). */
const struct kvd_apikey_info *http__key_info(const struct http_server *hs,
					     const struct http_msg *m);
/* The same, answering 401 when NULL. */
const struct kvd_apikey_info *http__auth_key(struct http_conn *hc,
					     const struct http_msg *m);
/* The tenant of the request's key; NULL after answering 401. */
const char *http__auth(struct http_conn *hc, const struct http_msg *m);

/* http_tok.c: POST /tokenize and /detokenize (llama-server's). */
void http__tokenize(struct http_conn *hc, const struct http_msg *m);
void http__detokenize(struct http_conn *hc, const struct http_msg *m);
/* The connection closes while the job runs: it answers nobody and frees
 * itself when it comes back. */
void http__tok_detach(struct http_tok_job *t);

/* http_cors.c */
/* The request's head is complete: hc->cors says whether its Origin is
 * allowed (and hc->cors_origin holds it for the answers). */
void http__cors_judge(struct http_conn *hc, const struct http_msg *m);
/* The CORS header lines of hc's answers into buf (NUL-ended; "" when its
 * origin is not allowed); the bytes written. */
size_t http__cors_headers(const struct http_conn *hc, char *buf, size_t size);
/* http_reply.c: OPTIONS on a known path whose methods are `methods` ("GET, POST"):
 * 204 with the preflight headers to an allowed origin, 204 with Allow
 * when no Origin came (not a preflight), 403 to another origin. The
 * exchange is done after it. */
void http__cors_preflight(struct http_conn *hc, const struct http_msg *m,
			  const char *methods);
