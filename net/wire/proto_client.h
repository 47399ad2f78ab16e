/* proto_client.h - the client API frames (net/PROTOCOL.md section 1).
 *
 * Pure encode/decode between msgpack maps (net/wire/frame.h) and C structs; no
 * sockets. The server parses requests and packs events; kvctl generate
 * packs requests and parses events.
 *
 * Ownership: a parsed request owns its prompt text and token ids (heap);
 * proto_client_request_deinit() frees them (safe twice). A parsed event
 * copies everything it keeps into the struct.
 *
 * Errors: 0, or a positive FRAME_E_* with `err` filled (the server answers
 * INVALID_REQUEST with err->msg); -ENOMEM.
 *
 * Thread safety: none needed (no shared state).
 */
#pragma once

#include "gpu/sampler.h"
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "net/wire/frame.h"
#include "net/wire/proto_schema.h"

#define PROTO_CLIENT_FRAME_MAX (1u << 20)
#define PROTO_CLIENT_PROMPT_MAX (256u << 10)   /* prompt text bytes */
#define PROTO_CLIENT_TOKENS_MAX 131072u        /* prompt token ids */
#define PROTO_CLIENT_MAX_TOKENS 1048576u       /* max_tokens upper bound */
#define PROTO_CLIENT_PIECE_MAX 256u            /* text piece bytes */
#define PROTO_CLIENT_MSG_MAX 256u              /* error message bytes */

/* Typed errors a client can receive. */
enum proto_err {
	PROTO_ERR_NONE = 0,
	PROTO_ERR_PROMPT_TOO_LONG,
	PROTO_ERR_INVALID_REQUEST,
	PROTO_ERR_OVERLOADED,
	PROTO_ERR_DRAINING,
	PROTO_ERR_NO_PREFILL_PEER,
	PROTO_ERR_INTEGRITY,
	PROTO_ERR_TIMEOUT,
	PROTO_ERR_INTERNAL,
	PROTO_ERR__N,
};

/* "PROMPT_TOO_LONG", ...; "NONE" for 0, "?" outside the enum. */
const char *proto_err_name(int code);
/* The code of a name, or -1. */
int proto_err_parse(const char *name);

#define PROTO_CLIENT_SALT_MAX 256u
#define PROTO_CLIENT_BIAS_MAX 300u         /* logit_bias entries (HTTP's) */
#define PROTO_CLIENT_TOP_LOGPROBS_MAX 20u  /* logprobs' alternatives */

_Static_assert(PROTO_CLIENT_BIAS_MAX == SAMPLER_BIAS_MAX &&
	       PROTO_CLIENT_TOP_LOGPROBS_MAX == SAMPLER_TOP_LOGPROBS_MAX,
	       "the client API's bounds are the sampler's");

struct proto_client_request {
	uint64_t id;
	char *prompt;          /* (strlen+1) bytes, or NULL when tokens given */
	uint32_t *tokens;      /* (n_tokens) ids, or NULL when prompt given */
	uint32_t n_tokens;
	uint32_t max_tokens;   /* 1..PROTO_CLIENT_MAX_TOKENS */
	float temperature;     /* >= 0; 0 greedy */
	uint32_t top_k;        /* 0 off */
	float top_p;           /* (0, 1] */
	uint64_t seed;
	/* prefix-cache scope within the tenant (gpu/kv/pcache.h); "" = none */
	char cache_salt[PROTO_CLIENT_SALT_MAX + 1];
	/* logit processing (gpu/sampler.h); 0 = off */
	float presence_penalty;    /* [-2, 2] */
	float frequency_penalty;   /* [-2, 2] */
	float repetition_penalty;  /* (0, 10]; absent: off */
	float min_p;               /* [0, 1] */
	/* logit_bias: {id: bias in [-100, 100]}, at most PROTO_CLIENT_BIAS_MAX,
	 * ids increasing (whether in the vocabulary: the node's check) */
	struct sampler_bias *bias; /* (n_bias), owned */
	uint32_t n_bias;
	bool logprobs;             /* logprobs given: each token event
				    * carries its logprob ... */
	uint32_t top_logprobs;     /* ... and this many alternatives (0..20) */
};

#define PROTO_CLIENT_REQUEST_NULL \
	{ .max_tokens = 64, .temperature = 0.0f, .top_p = 1.0f }

int proto_client_request_parse(const msgpack_object *map,
			       struct proto_client_request *r,
			       struct frame_error *err);
void proto_client_request_deinit(struct proto_client_request *r);
/* One field of r from a command line (kvctl generate, kvd generate): name
 * is the field ("max_tokens", "temperature", "top_k", "top_p", "seed",
 * "presence_penalty", "frequency_penalty", "repetition_penalty", "min_p",
 * "id", "tokens" as ids separated by commas, "logit_bias" as ID:BIAS
 * pairs separated by commas, "logprobs" as the alternatives 0..20) or its option's name
 * ('-' for '_': "max-tokens"), text its value, read
 * with the bounds proto_client_request_parse() reads the field with, so a
 * command line takes what a node takes (proto_schema_read_text). A value
 * set before is replaced (tokens: the old array freed). 0; FRAME_E_RANGE
 * with err->msg saying what the value must be; FRAME_E_UNKNOWN or
 * FRAME_E_TYPE for a key that is not such a field; -ENOMEM. */
int proto_client_request_set(struct proto_client_request *r, const char *name,
			     const char *text, struct frame_error *err);
/* The getopt_long entries (<getopt.h>) of the request fields both
 * command lines take (kvctl generate, kvd generate), each with `code`:
 * the option's name is the field's (proto_client_request_set). */
#define PROTO_CLIENT_OPTIONS(code) \
	{ "max-tokens", required_argument, NULL, code }, \
	{ "temperature", required_argument, NULL, code }, \
	{ "top-k", required_argument, NULL, code }, \
	{ "top-p", required_argument, NULL, code }, \
	{ "seed", required_argument, NULL, code }, \
	{ "presence-penalty", required_argument, NULL, code }, \
	{ "frequency-penalty", required_argument, NULL, code }, \
	{ "repetition-penalty", required_argument, NULL, code }, \
	{ "min-p", required_argument, NULL, code }, \
	{ "logit-bias", required_argument, NULL, code }, \
	{ "logprobs", required_argument, NULL, code }
/* r's sampling fields as the engine takes them; logit_bias borrows
 * r->bias (keep r's array alive until engine_submit, which copies it). */
struct sampler_params proto_client_request_sampling(const struct proto_client_request *r);
/* Whether r's logit_bias names a token outside a vocabulary of n_vocab
 * (the ids are sorted: the last is the largest): true with msg[size]
 * saying so, the request's INVALID_REQUEST (the node and kvd generate
 * say the same). */
bool proto_client_bias_outside(const struct proto_client_request *r, uint32_t n_vocab,
			       char *msg, size_t size);
/* The command lines' --json form (kvctl generate, kvd generate) of n
 * tokens' logprobs, after "output_ids": ,"logprobs":[the chosen tokens'],
 * "top_logprobs":[[[id, logprob], ...] per token]; nothing when n is 0. */
void proto_client_logprobs_json(FILE *out, const struct sampler_logprobs *lp, size_t n);
/* Pack r as one request map into w's packer (exactly one of prompt or
 * tokens must be set). */
void proto_client_request_pack(msgpack_packer *pk,
			       const struct proto_client_request *r);

/* ---- events (server -> client) --------------------------------------- */

enum proto_client_event_type {
	PROTO_EV_TOKEN = 1,
	PROTO_EV_FINAL,
	PROTO_EV_ERROR,
	PROTO_EV_FRAME_ERROR,   /* {type:"frame_error"}: no id, belongs to no
				 * request (bad frame, connection refused) */
};

struct proto_client_final {
	char finish_reason[16];   /* "stop" | "length" */
	uint32_t prompt_tokens;
	uint32_t cached_tokens;   /* of prompt_tokens, from the prefix cache */
	uint32_t output_tokens;
	uint64_t ttft_us;
	uint64_t total_us;
	/* bytes the detokenizer held back for an incomplete UTF-8 character
	 * at the end of the stream, flushed (as U+FFFD); usually empty */
	char text[16];
	uint32_t text_len;
};

struct proto_client_event {
	enum proto_client_event_type type;
	uint64_t id;                             /* 0 for FRAME_ERROR */
	/* token */
	uint32_t index;
	uint32_t token;
	char text[PROTO_CLIENT_PIECE_MAX + 1];  /* NUL-terminated piece */
	uint32_t text_len;
	bool has_lp;                             /* the request asked: */
	struct sampler_logprobs lp;              /* logprob, top (id, logprob) */
	/* final */
	struct proto_client_final fin;
	/* error, frame_error */
	int code;                                /* enum proto_err */
	char message[PROTO_CLIENT_MSG_MAX + 1];
};

int proto_client_event_parse(const msgpack_object *map,
			     struct proto_client_event *ev,
			     struct frame_error *err);

/* piece: len bytes (len <= PROTO_CLIENT_PIECE_MAX), need not be NUL-ended;
 * lp: NULL, or the token's logprobs (logprob, top: [[id, logprob], ...]). */
void proto_client_pack_token(msgpack_packer *pk, uint64_t id, uint32_t index,
			     uint32_t token, const char *piece, uint32_t len,
			     const struct sampler_logprobs *lp);
void proto_client_pack_final(msgpack_packer *pk, uint64_t id,
			     const struct proto_client_final *f);
void proto_client_pack_error(msgpack_packer *pk, uint64_t id, int code,
			     const char *message);
/* {type:"frame_error", code, message}: an error of the connection or of a
 * frame that names no request; never confused with request id 0's. */
void proto_client_pack_conn_error(msgpack_packer *pk, int code,
				  const char *message);

/* Convenience: one whole frame (header included) for each event, into a
 * malloc'd buffer. 0 or -ENOMEM / FRAME_E_TOOBIG. */
int proto_client_frame_error(uint64_t id, int code, const char *message,
			     char **data, size_t *len);
int proto_client_frame_conn_error(int code, const char *message,
				  char **data, size_t *len);

/* ---- authentication (a keys file is set: the connection's first frame)
 * {type:"auth", key} -> {type:"auth_ok", tenant}; a wrong key or another
 * first frame is a frame_error and the connection closes. */
#define PROTO_CLIENT_KEY_MAX 256u
/* The key of an auth frame into key[PROTO_CLIENT_KEY_MAX + 1]: 0, or 1
 * with err->msg set (not an auth frame, no key string). */
int proto_client_auth_parse(const msgpack_object *map, char *key,
			    struct frame_error *err);
void proto_client_pack_auth(msgpack_packer *pk, const char *key);
int proto_client_frame_auth_ok(const char *tenant, char **data, size_t *len);

/* ---- internal helpers shared with proto_peer.c ------------------------ */

/* A custom field (net/wire/proto_schema.h): the int at f->offset as the name
 * of a PROTO_ERR_* (reading: not NONE; unknown names are FRAME_E_RANGE). */
int proto__read_err_code(const msgpack_object *o, const struct proto_field *f,
			 void *out, struct frame_error *err);
void proto__write_err_code(msgpack_packer *pk, const struct proto_field *f,
			   const void *in);
