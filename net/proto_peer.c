/* proto_peer.c - prefill <-> decode control messages.
 *
 * Design. A peer is another kvd, but a buggy or mismatched one must not be
 * able to crash us or make us write where we should not, so a peer frame
 * is read exactly like a client frame: typed, bounded, table-dispatched.
 * Each message type has one reader and one writer, side by side in the
 * table, so the two cannot drift apart.
 *
 * The destination page list of a prefill_request is an array of
 * [page, generation] pairs; prefill echoes them in every batch so that
 * decode can check that a batch writes only pages it reserved for that
 * request in that generation (invariant 1).
 */
#include "net/proto_peer.h"
#include "conf/util.h"

#include <errno.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>

typedef int (*peer_read_fn)(const msgpack_object *map, struct proto_peer_msg *m,
			    struct frame_error *err);
typedef void (*peer_write_fn)(msgpack_packer *pk, const struct proto_peer_msg *m);

struct peer_msg_desc {
	const char *name;
	bool has_id;
	peer_read_fn read;
	peer_write_fn write;
	uint32_t n_keys;        /* map entries the writer packs, id included */
};

void proto_peer_msg_deinit(struct proto_peer_msg *m)
{
	free(m->tokens);
	m->tokens = NULL;
	m->n_tokens = 0;
	free(m->pages);
	m->pages = NULL;
	m->n_pages = 0;
}

/* ---- 32-byte values as hex strings ------------------------------------------ */

/* A nonce, proof or token: exactly 64 hex digits. An optional one that
 * is absent or nil is not there (*present false), as proto__get_* read
 * every optional key. */
static int get_hex(const msgpack_object *map, const char *key, bool required,
		   uint8_t out[PROTO_PEER_NONCE_BYTES], bool *present,
		   struct frame_error *err)
{
	char hex[2 * PROTO_PEER_NONCE_BYTES + 1] = "";
	const msgpack_object *o = frame_map_get(map, key);
	size_t n = 0;
	int r;

	if (present)
		*present = false;
	if ((!o || o->type == MSGPACK_OBJECT_NIL) && !required)
		return 0;
	r = proto__get_str(map, key, required, hex, sizeof(hex), err);
	if (r)
		return r;
	if (strlen(hex) != 2 * PROTO_PEER_NONCE_BYTES ||
	    sodium_hex2bin(out, PROTO_PEER_NONCE_BYTES, hex, strlen(hex), NULL,
			   &n, NULL) != 0 || n != PROTO_PEER_NONCE_BYTES)
		return proto__fail(err, FRAME_E_RANGE, key,
				   "'%s' must be %u hex digits", key,
				   2 * PROTO_PEER_NONCE_BYTES);
	if (present)
		*present = true;
	return 0;
}

static void pack_hex(msgpack_packer *pk, const char *key,
		     const uint8_t v[PROTO_PEER_NONCE_BYTES])
{
	char hex[2 * PROTO_PEER_NONCE_BYTES + 1];

	sodium_bin2hex(hex, sizeof(hex), v, PROTO_PEER_NONCE_BYTES);
	frame_pack_kv_str(pk, key, hex);
}

/* ---- hello -------------------------------------------------------------- */

static int read_hello(const msgpack_object *map, struct proto_peer_msg *m,
		      struct frame_error *err)
{
	struct proto_peer_hello *h = &m->hello;
	uint64_t u = 0;
	int r;

	r = proto__get_u64(map, "version", true, 0, UINT32_MAX, &u, err);
	h->version = (uint32_t)u;
	if (!r)
		r = proto__get_str(map, "role", true, h->role, sizeof(h->role), err);
	if (!r)
		r = proto__get_str(map, "node", false, h->node, sizeof(h->node), err);
	if (!r)
		r = proto__get_str(map, "model_sha256", true, h->model_sha256,
				   sizeof(h->model_sha256), err);
	if (!r)
		r = proto__get_str(map, "kv_dtype", true, h->kv_dtype,
				   sizeof(h->kv_dtype), err);
	if (!r)
		r = proto__get_u64(map, "page_tokens", true, 1, UINT32_MAX, &u, err);
	h->page_tokens = (uint32_t)u;
	if (!r)
		r = proto__get_u64(map, "n_layer", true, 1, UINT32_MAX, &u, err);
	h->n_layer = (uint32_t)u;
	if (!r)
		r = proto__get_u64(map, "kv_dim", true, 1, UINT32_MAX, &u, err);
	h->kv_dim = (uint32_t)u;
	if (!r)
		r = proto__get_u64(map, "page_bytes", true, 1, UINT64_MAX,
				   &h->page_bytes, err);
	if (!r)
		r = proto__get_u64(map, "pool_tokens", true, 0, UINT64_MAX,
				   &h->pool_tokens, err);
	if (!r)
		r = proto__get_u64(map, "context", true, 0, UINT64_MAX,
				   &h->context, err);
	if (!r)
		r = proto__get_u64(map, "max_batch_bytes", true, 1, UINT64_MAX,
				   &h->max_batch_bytes, err);
	if (!r)
		r = proto__get_bool(map, "checksum", true, &h->checksum, err);
	if (!r)
		r = get_hex(map, "session", false, h->session, &h->has_session, err);
	return r;
}

static void write_hello(msgpack_packer *pk, const struct proto_peer_msg *m)
{
	const struct proto_peer_hello *h = &m->hello;

	frame_pack_kv_u64(pk, "version", h->version);
	frame_pack_kv_str(pk, "role", h->role);
	frame_pack_kv_str(pk, "node", h->node);
	frame_pack_kv_str(pk, "model_sha256", h->model_sha256);
	frame_pack_kv_str(pk, "kv_dtype", h->kv_dtype);
	frame_pack_kv_u64(pk, "page_tokens", h->page_tokens);
	frame_pack_kv_u64(pk, "n_layer", h->n_layer);
	frame_pack_kv_u64(pk, "kv_dim", h->kv_dim);
	frame_pack_kv_u64(pk, "page_bytes", h->page_bytes);
	frame_pack_kv_u64(pk, "pool_tokens", h->pool_tokens);
	frame_pack_kv_u64(pk, "context", h->context);
	frame_pack_kv_u64(pk, "max_batch_bytes", h->max_batch_bytes);
	frame_pack_kv_bool(pk, "checksum", h->checksum);
	if (h->has_session)
		pack_hex(pk, "session", h->session);
}

int proto_peer_hello_match(const struct proto_peer_hello *a,
			   const struct proto_peer_hello *b,
			   char *field, size_t field_size,
			   char *msg, size_t msg_size)
{
#define HELLO_NUM(f)                                                        \
	if (a->f != b->f) {                                                 \
		snprintf(field, field_size, "%s", #f);                      \
		snprintf(msg, msg_size, "%s differs: %llu here, %llu there", \
			 #f, (unsigned long long)a->f,                      \
			 (unsigned long long)b->f);                         \
		return 1;                                                   \
	}
#define HELLO_STR(f)                                                        \
	if (strcmp(a->f, b->f)) {                                           \
		snprintf(field, field_size, "%s", #f);                      \
		snprintf(msg, msg_size, "%s differs: %s here, %s there",    \
			 #f, a->f, b->f);                                   \
		return 1;                                                   \
	}
	HELLO_NUM(version)
	HELLO_STR(model_sha256)
	HELLO_STR(kv_dtype)
	HELLO_NUM(page_tokens)
	HELLO_NUM(n_layer)
	HELLO_NUM(kv_dim)
	HELLO_NUM(page_bytes)
#undef HELLO_NUM
#undef HELLO_STR
	return 0;
}

/* ---- small messages ----------------------------------------------------- */

static int read_data(const msgpack_object *map, struct proto_peer_msg *m,
		     struct frame_error *err)
{
	return get_hex(map, "token", true, m->token, NULL, err);
}

static void write_data(msgpack_packer *pk, const struct proto_peer_msg *m)
{
	pack_hex(pk, "token", m->token);
}

/* ---- authentication (before anything else; net/peer_auth.h) ---------------- */

static int read_auth_hello(const msgpack_object *map, struct proto_peer_msg *m,
			   struct frame_error *err)
{
	uint64_t u = 0;
	int r;

	r = proto__get_u64(map, "version", true, 0, UINT32_MAX, &u, err);
	m->version = (uint32_t)u;
	if (!r)
		r = get_hex(map, "nonce", true, m->nonce, NULL, err);
	return r;
}

static void write_auth_hello(msgpack_packer *pk, const struct proto_peer_msg *m)
{
	frame_pack_kv_u64(pk, "version", m->version);
	pack_hex(pk, "nonce", m->nonce);
}

static int read_auth_challenge(const msgpack_object *map,
			       struct proto_peer_msg *m, struct frame_error *err)
{
	return get_hex(map, "nonce", true, m->nonce, NULL, err);
}

static void write_auth_challenge(msgpack_packer *pk,
				 const struct proto_peer_msg *m)
{
	pack_hex(pk, "nonce", m->nonce);
}

static int read_auth_proof(const msgpack_object *map, struct proto_peer_msg *m,
			   struct frame_error *err)
{
	return get_hex(map, "proof", true, m->proof, NULL, err);
}

static void write_auth_proof(msgpack_packer *pk, const struct proto_peer_msg *m)
{
	pack_hex(pk, "proof", m->proof);
}

static int read_refused(const msgpack_object *map, struct proto_peer_msg *m,
			struct frame_error *err)
{
	return proto__get_str(map, "reason", true, m->reason, sizeof(m->reason),
			      err);
}

static void write_refused(msgpack_packer *pk, const struct proto_peer_msg *m)
{
	frame_pack_kv_str(pk, "reason", m->reason);
}

static int read_heartbeat(const msgpack_object *map, struct proto_peer_msg *m,
			  struct frame_error *err)
{
	uint64_t u = 0;
	int r;

	r = proto__get_u64(map, "load", true, 0, UINT32_MAX, &u, err);
	m->load = (uint32_t)u;
	if (!r)
		r = proto__get_u64(map, "free_tokens", false, 0, UINT64_MAX,
				   &m->free_tokens, err);
	return r;
}

static void write_heartbeat(msgpack_packer *pk, const struct proto_peer_msg *m)
{
	frame_pack_kv_u64(pk, "load", m->load);
	frame_pack_kv_u64(pk, "free_tokens", m->free_tokens);
}

static int read_code(const msgpack_object *map, struct proto_peer_msg *m,
		     struct frame_error *err)
{
	return proto__get_error(map, &m->code, m->message, sizeof(m->message),
				err);
}

static void write_code(msgpack_packer *pk, const struct proto_peer_msg *m)
{
	char msg[PROTO_CLIENT_MSG_MAX + 1];

	snprintf(msg, sizeof(msg), "%s", m->message);
	frame_pack_kv_str(pk, "code", proto_err_name(m->code));
	frame_pack_kv_str(pk, "message", msg);
}

static int read_none(const msgpack_object *map, struct proto_peer_msg *m,
		     struct frame_error *err)
{
	return 0;
}

static void write_none(msgpack_packer *pk, const struct proto_peer_msg *m)
{
}

static int read_done(const msgpack_object *map, struct proto_peer_msg *m,
		     struct frame_error *err)
{
	uint64_t u = 0;
	int r;

	r = proto__get_u64(map, "first_token", true, 0, UINT32_MAX, &u, err);
	m->first_token = (uint32_t)u;
	if (!r)
		r = proto__get_u64(map, "tokens", true, 1, UINT32_MAX, &u, err);
	m->done_tokens = (uint32_t)u;
	if (!r)
		r = proto__get_u64(map, "batches", true, 0, UINT32_MAX, &u, err);
	m->batches = (uint32_t)u;
	if (!r)
		r = proto__get_u64(map, "pages", true, 0, UINT32_MAX, &u, err);
	m->done_pages = (uint32_t)u;
	return r;
}

static void write_done(msgpack_packer *pk, const struct proto_peer_msg *m)
{
	frame_pack_kv_u64(pk, "first_token", m->first_token);
	frame_pack_kv_u64(pk, "tokens", m->done_tokens);
	frame_pack_kv_u64(pk, "batches", m->batches);
	frame_pack_kv_u64(pk, "pages", m->done_pages);
}

/* ---- prefill_request ---------------------------------------------------- */

static int read_pages(const msgpack_object *map, struct proto_peer_msg *m,
		      struct frame_error *err)
{
	const msgpack_object *o = frame_map_get(map, "pages");

	if (!o)
		return proto__fail(err, FRAME_E_MISSING, "pages",
				   "missing key 'pages'");
	if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size == 0 ||
	    o->via.array.size > PROTO_PEER_PAGES_MAX)
		return proto__fail(err, FRAME_E_RANGE, "pages",
				   "'pages' must be an array of 1..%u pairs",
				   PROTO_PEER_PAGES_MAX);
	m->pages = calloc(o->via.array.size, sizeof(*m->pages));
	if (!m->pages)
		return -ENOMEM;
	m->n_pages = o->via.array.size;
	for (uint32_t i = 0; i < m->n_pages; i++) {
		const msgpack_object *e = &o->via.array.ptr[i];
		uint64_t page, gen;

		if (e->type != MSGPACK_OBJECT_ARRAY || e->via.array.size != 2 ||
		    frame_obj_u64(&e->via.array.ptr[0], &page) ||
		    frame_obj_u64(&e->via.array.ptr[1], &gen) ||
		    page > UINT32_MAX || gen == 0)
			return proto__fail(err, FRAME_E_RANGE, "pages",
					   "'pages'[%u] must be [page, generation>0]",
					   i);
		m->pages[i].page = (uint32_t)page;
		m->pages[i].gen = gen;
	}
	return 0;
}

static int read_prefill_request(const msgpack_object *map,
				struct proto_peer_msg *m,
				struct frame_error *err)
{
	uint64_t u = 64;
	double d;
	int r;

	r = proto__get_u32_array(map, "tokens", true, PROTO_CLIENT_TOKENS_MAX, 0,
				 &m->tokens, &m->n_tokens, err);
	if (!r)
		r = read_pages(map, m, err);
	if (!r)
		r = proto__get_u64(map, "max_tokens", true, 1,
				   PROTO_CLIENT_MAX_TOKENS, &u, err);
	m->max_tokens = (uint32_t)u;
	d = 0;
	if (!r)
		r = proto__get_double(map, "temperature", true, 0, 100, &d, err);
	m->temperature = (float)d;
	u = 0;
	if (!r)
		r = proto__get_u64(map, "top_k", true, 0, UINT32_MAX, &u, err);
	m->top_k = (uint32_t)u;
	d = 1;
	if (!r)
		r = proto__get_double(map, "top_p", true, 0, 1, &d, err);
	m->top_p = (float)d;
	if (!r && m->top_p <= 0.0f)   /* after narrowing: see proto_client.c */
		r = proto__fail(err, FRAME_E_RANGE, "top_p",
				"'top_p' must be in (0, 1]");
	if (!r)
		r = proto__get_u64(map, "seed", true, 0, UINT64_MAX, &m->seed,
				   err);
	return r;
}

static void write_prefill_request(msgpack_packer *pk,
				  const struct proto_peer_msg *m)
{
	frame_pack_str(pk, "tokens");
	msgpack_pack_array(pk, m->n_tokens);
	for (uint32_t i = 0; i < m->n_tokens; i++)
		msgpack_pack_uint32(pk, m->tokens[i]);
	frame_pack_str(pk, "pages");
	msgpack_pack_array(pk, m->n_pages);
	for (uint32_t i = 0; i < m->n_pages; i++) {
		msgpack_pack_array(pk, 2);
		msgpack_pack_uint32(pk, m->pages[i].page);
		msgpack_pack_uint64(pk, m->pages[i].gen);
	}
	frame_pack_kv_u64(pk, "max_tokens", m->max_tokens);
	frame_pack_kv_double(pk, "temperature", m->temperature);
	frame_pack_kv_u64(pk, "top_k", m->top_k);
	frame_pack_kv_double(pk, "top_p", m->top_p);
	frame_pack_kv_u64(pk, "seed", m->seed);
}

/* ---- the table ---------------------------------------------------------- */

/* n_keys counts "type" and, when has_id, "id". */
static const struct peer_msg_desc peer_msgs[PEER_MSG__N] = {
	[PEER_MSG_HELLO] = { "hello", false, read_hello, write_hello, 14 },
	[PEER_MSG_DATA] = { "data", false, read_data, write_data, 2 },
	[PEER_MSG_HEARTBEAT] = { "heartbeat", false, read_heartbeat,
				 write_heartbeat, 3 },
	[PEER_MSG_PREFILL_REQUEST] = { "prefill_request", true,
				       read_prefill_request,
				       write_prefill_request, 9 },
	[PEER_MSG_PREFILL_REJECT] = { "prefill_reject", true, read_code,
				      write_code, 4 },
	[PEER_MSG_PREFILL_DONE] = { "prefill_done", true, read_done,
				    write_done, 6 },
	[PEER_MSG_ABORT] = { "abort", true, read_code, write_code, 4 },
	[PEER_MSG_ABORT_ACK] = { "abort_ack", true, read_none, write_none, 2 },
	[PEER_MSG_RELEASE_ACK] = { "release_ack", true, read_none, write_none,
				   2 },
	[PEER_MSG_AUTH_HELLO] = { "auth_hello", false, read_auth_hello,
				  write_auth_hello, 3 },
	[PEER_MSG_AUTH_CHALLENGE] = { "auth_challenge", false,
				      read_auth_challenge,
				      write_auth_challenge, 2 },
	[PEER_MSG_AUTH_PROOF] = { "auth_proof", false, read_auth_proof,
				  write_auth_proof, 2 },
	[PEER_MSG_REFUSED] = { "refused", false, read_refused, write_refused, 2 },
	[PEER_MSG_DATA_BOUND] = { "data_bound", false, read_none, write_none, 1 },
};

const char *proto_peer_type_name(enum proto_peer_type t)
{
	if ((unsigned)t >= PEER_MSG__N || !peer_msgs[t].name)
		return "?";
	return peer_msgs[t].name;
}

int proto_peer_parse(const msgpack_object *map, struct proto_peer_msg *m,
		     struct frame_error *err)
{
	int r;

	memset(m, 0, sizeof(*m));
	if (!map || map->type != MSGPACK_OBJECT_MAP)
		return proto__fail(err, FRAME_E_NOTMAP, "", "frame is not a map");
	for (int t = 1; t < PEER_MSG__N; t++) {
		const struct peer_msg_desc *d = &peer_msgs[t];

		if (!proto__type_is(map, d->name))
			continue;
		m->type = (enum proto_peer_type)t;
		if (d->has_id) {
			r = proto__get_u64(map, "id", true, 0, UINT64_MAX,
					   &m->id, err);
			if (r)
				return r;
		}
		r = d->read(map, m, err);
		if (r)
			proto_peer_msg_deinit(m);
		return r;
	}
	return proto__fail(err, FRAME_E_TYPE, "type", "unknown peer message type");
}

void proto_peer_pack(msgpack_packer *pk, const struct proto_peer_msg *m)
{
	const struct peer_msg_desc *d = &peer_msgs[m->type];

	msgpack_pack_map(pk, d->n_keys +
			 (m->type == PEER_MSG_HELLO && m->hello.has_session));
	frame_pack_kv_str(pk, "type", d->name);
	if (d->has_id)
		frame_pack_kv_u64(pk, "id", m->id);
	d->write(pk, m);
}

int proto_peer_frame(const struct proto_peer_msg *m, char **data, size_t *len)
{
	struct frame_writer w;
	int r;

	if ((unsigned)m->type >= PEER_MSG__N || !peer_msgs[m->type].name)
		return -EINVAL;
	frame_writer_init(&w);
	proto_peer_pack(frame_writer_packer(&w), m);
	r = frame_writer_finish(&w, PROTO_PEER_FRAME_MAX, data, len);
	frame_writer_deinit(&w);
	return r;
}
