/* proto_peer.h - prefill <-> decode control messages (net/PROTOCOL.md s. 2).
 *
 * Pure encode/decode of the control frames; sockets live in daemon/. One
 * struct carries any message; `type` says which fields are meaningful.
 * proto_peer_parse() dispatches on the map's "type" through a table that
 * names each message's field table (net/wire/proto_schema.h), which
 * proto_peer_pack() writes from too.
 *
 * Ownership: a parsed prefill_request owns its token and page arrays, a
 * verbs_scope its runs;
 * proto_peer_msg_deinit() frees them (safe twice).
 *
 * Errors: 0; positive FRAME_E_* with err filled (a peer that sends a bad
 * frame is a protocol error: close the connection); -ENOMEM.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "net/wire/frame.h"
#include "net/wire/proto_client.h"

#define PROTO_PEER_VERSION 3
#define PROTO_PEER_NONCE_BYTES 32   /* auth nonces, proofs, data tokens */
/* The one integrity suite of this version: every sealed frame's and
 * batch's tag and the verbs batch MAC (PROTOCOL.md s. 3.1). Named in
 * auth_hello and auth_challenge so both ends agree before any key is
 * used; libcrypto or libsodium compute the same function. */
#define PROTO_PEER_SUITE "chacha20-poly1305"
#define PROTO_PEER_SUITE_MAX 64     /* room for a later name: refused as
				     * `suite`, not as a parse error */
#define PROTO_PEER_NAME_SEALED 80   /* auth_proof.name: 64 + 16 tag
				     * (PEER_AUTH_NAME_SEALED) */
#define PROTO_PEER_FRAME_MAX (4u << 20)
#define PROTO_PEER_PAGES_MAX (1u << 20)
#define PROTO_PEER_GID_BYTES 16
/* runs of one request's write scope (net/verbs/verbs_scope.h VERBS_SCOPE_RUNS_MAX) */
#define PROTO_PEER_RUNS_MAX 64
/* prefill_request "tenant": 1..63 of [A-Za-z0-9_.-] (the API keys
 * file's rule, conf/apikeys.h); absent reads as the default */
#define PROTO_PEER_TENANT_MAX 64    /* bytes, NUL included */
#define PROTO_PEER_TENANT_DEFAULT "default"

enum proto_peer_type {
	PEER_MSG_HELLO = 1,
	PEER_MSG_DATA,
	PEER_MSG_HEARTBEAT,
	PEER_MSG_PREFILL_REQUEST,
	PEER_MSG_PREFILL_REJECT,
	PEER_MSG_PREFILL_DONE,
	PEER_MSG_ABORT,
	PEER_MSG_ABORT_ACK,
	PEER_MSG_RELEASE_ACK,
	PEER_MSG_AUTH_HELLO,      /* d -> p: version, nonce (first frame, keyed) */
	PEER_MSG_AUTH_CHALLENGE,  /* p -> d: nonce */
	PEER_MSG_AUTH_PROOF,      /* both: proof over both nonces and both
				   * ends' names and addresses; the
				   * sender's name, encrypted */
	PEER_MSG_REFUSED,         /* either: a bare refusal, then close */
	PEER_MSG_DATA_BOUND,      /* p -> d: the data connection is bound */
	PEER_MSG_VERBS_QP,        /* both: this side's RC queue pair (verbs) */
	PEER_MSG_VERBS_SCOPE,     /* d -> p: where a request may be written */
	PEER_MSG_VERBS_CREDIT,    /* d -> p: mailbox batches consumed (verbs) */
	PEER_MSG__N,
};

const char *proto_peer_type_name(enum proto_peer_type t);

struct proto_peer_hello {
	uint32_t version;
	char role[16];
	char node[64];
	char model_sha256[65];
	char kv_dtype[8];
	uint32_t page_tokens;
	uint32_t n_layer;
	uint32_t kv_dim;
	uint64_t page_bytes;
	uint64_t pool_tokens;
	uint64_t context;
	uint64_t max_batch_bytes;
	bool checksum;
	/* prefill -> decode on keyless (loopback) links only: the random
	 * token that binds the data connection; keyed links derive it */
	uint8_t session[PROTO_PEER_NONCE_BYTES];
	bool has_session;
};

struct proto_peer_page {
	uint32_t page;
	uint64_t gen;
};

/* VERBS_QP: an RC queue pair's address, for the far end's RTR. */
struct proto_peer_verbs_qp {
	uint32_t qpn;                    /* 24 bits */
	uint32_t psn;                    /* 24 bits: its first send PSN */
	uint32_t lid;                    /* 16 bits; 0 on RoCE */
	uint32_t mtu;                    /* bytes, 256..4096 */
	uint8_t gid[PROTO_PEER_GID_BYTES];
};

/* VERBS_SCOPE: n_pages adjacent decode pages from first_page, writable at
 * remote address addr.. with rkey while the request holds them. */
struct proto_peer_run {
	uint32_t first_page;
	uint32_t n_pages;                /* >= 1 */
	uint64_t addr;
	uint32_t rkey;
};

struct proto_peer_msg {
	enum proto_peer_type type;
	uint64_t id;                     /* request id (most messages) */
	struct proto_peer_hello hello;   /* HELLO */
	uint8_t token[PROTO_PEER_NONCE_BYTES];  /* DATA: binds the data conn */
	uint8_t nonce[PROTO_PEER_NONCE_BYTES];  /* AUTH_HELLO, AUTH_CHALLENGE */
	uint8_t proof[PROTO_PEER_NONCE_BYTES];  /* AUTH_PROOF */
	uint8_t name_sealed[PROTO_PEER_NAME_SEALED];  /* AUTH_PROOF: the
					 * sender's node name, encrypted */
	uint32_t version;                /* AUTH_HELLO */
	char suite[PROTO_PEER_SUITE_MAX]; /* AUTH_HELLO, AUTH_CHALLENGE:
					 * "" when absent (refused) */
	char reason[32];                 /* REFUSED: a fixed word */
	uint32_t load;                   /* HEARTBEAT */
	uint64_t free_tokens;            /* HEARTBEAT */
	/* PREFILL_REQUEST */
	uint32_t *tokens;                /* (n_tokens) prompt ids */
	uint32_t n_tokens;
	struct proto_peer_page *pages;   /* (n_pages) destination pages */
	uint32_t n_pages;
	uint32_t max_tokens;
	float temperature;
	uint32_t top_k;
	float top_p;
	uint64_t seed;
	char tenant[PROTO_PEER_TENANT_MAX];  /* whose request; parsed: valid,
					  * PROTO_PEER_TENANT_DEFAULT when
					  * absent; packed: omitted when ""
					  * or the default */
	char cache_salt[PROTO_CLIENT_SALT_MAX + 1]; /* the client's; ""
					  * = none (omitted when packed) */
	/* PREFILL_REJECT, ABORT */
	int code;                        /* enum proto_err */
	char message[PROTO_CLIENT_MSG_MAX + 1];
	/* PREFILL_DONE */
	uint32_t first_token;
	uint32_t done_tokens;            /* prompt positions written */
	uint32_t batches;                /* PREFILL_DONE; ABORT, ABORT_ACK:
					  * batches the sender posted */
	uint32_t done_pages;
	uint32_t cached_tokens;          /* PREFILL_DONE: of done_tokens, read
					  * from prefill's prefix cache
					  * (optional, 0 when absent) */
	uint64_t prefill_id;             /* PREFILL_DONE: prefill's own id for
					  * the request, the id= of its log
					  * lines (optional, 0 when absent) */
	struct proto_peer_verbs_qp vqp;  /* VERBS_QP */
	struct proto_peer_run *runs;     /* VERBS_SCOPE (n_runs), owned */
	uint32_t n_runs;
	uint64_t consumed;               /* VERBS_CREDIT: batches decode has
					  * copied out of its mailbox on this
					  * link, in all (cumulative) */
};

void proto_peer_msg_deinit(struct proto_peer_msg *m);

int proto_peer_parse(const msgpack_object *map, struct proto_peer_msg *m,
		     struct frame_error *err);

/* Pack m (by m->type) as one map. */
void proto_peer_pack(msgpack_packer *pk, const struct proto_peer_msg *m);

/* Pack m into a whole frame (malloc'd *data, header included). */
int proto_peer_frame(const struct proto_peer_msg *m, char **data, size_t *len);

/* Compare two hellos for pairing: 0 when compatible, else 1 with `field`
 * (the first differing key) and a sentence in msg. */
int proto_peer_hello_match(const struct proto_peer_hello *a,
			   const struct proto_peer_hello *b,
			   char *field, size_t field_size,
			   char *msg, size_t msg_size);
