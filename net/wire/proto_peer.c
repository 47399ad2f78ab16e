/* proto_peer.c - prefill <-> decode control messages.
 *
 * Design. A peer is another kvd, but a buggy or mismatched one must not be
 * able to crash us or make us write where we should not, so a peer frame
 * is read exactly like a client frame: typed, bounded, table-dispatched.
 * Each message type is one field table (net/wire/proto_schema.h) that both
 * reads and writes it, so the reader and the writer cannot drift apart:
 * the keys, their order on the wire and the map's size all come from it.
 *
 * The destination page list of a prefill_request is an array of
 * [page, generation] pairs; prefill echoes them in every batch so that
 * decode can check that a batch writes only pages it reserved for that
 * request in that generation (invariant 1).
 */
#include "net/wire/proto_peer.h"
#include "conf/apikeys.h"
#include "conf/util.h"

#include <errno.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>

/* A message: its "type", whether an "id" follows, and the table that
 * reads and writes the rest (in this order on the wire). */
struct peer_msg_desc {
	const char *name;
	bool has_id;
	const struct proto_field *fields;  /* (n_fields) */
	size_t n_fields;
};

void proto_peer_msg_deinit(struct proto_peer_msg *m)
{
	free(m->tokens);
	m->tokens = NULL;
	m->n_tokens = 0;
	free(m->pages);
	m->pages = NULL;
	m->n_pages = 0;
	free(m->runs);
	m->runs = NULL;
	m->n_runs = 0;
}

/* ---- 32-byte values as hex strings ------------------------------------------ */

/* Exactly 2 * bytes hex digits, into the `bytes` at f->offset. */
static int read_hex_n(const msgpack_object *o, const struct proto_field *f,
		      void *out, struct frame_error *err, size_t bytes)
{
	char hex[2 * PROTO_PEER_NAME_SEALED + 1] = "";   /* the longest */
	size_t n = 0;
	int r;

	r = proto_schema_str(o, f->key, hex, sizeof(hex), err);
	if (r)
		return r;
	if (strlen(hex) != 2 * bytes ||
	    sodium_hex2bin((uint8_t *)out + f->offset, bytes,
			   hex, strlen(hex), NULL, &n, NULL) != 0 ||
	    n != bytes)
		return proto_schema_fail(err, FRAME_E_RANGE, f->key,
					 "'%s' must be %u hex digits", f->key,
					 (unsigned)(2 * bytes));
	return 0;
}

/* A nonce, proof or token: exactly 64 hex digits, into the
 * PROTO_PEER_NONCE_BYTES at f->offset. */
static int read_hex(const msgpack_object *o, const struct proto_field *f,
		    void *out, struct frame_error *err)
{
	return read_hex_n(o, f, out, err, PROTO_PEER_NONCE_BYTES);
}

/* A GID: exactly 32 hex digits. */
static int read_gid(const msgpack_object *o, const struct proto_field *f,
		    void *out, struct frame_error *err)
{
	return read_hex_n(o, f, out, err, PROTO_PEER_GID_BYTES);
}

/* The `bytes` at f->offset as 2 * bytes hex digits. */
static void write_hex_n(msgpack_packer *pk, const struct proto_field *f,
			const void *in, size_t bytes)
{
	char hex[2 * PROTO_PEER_NAME_SEALED + 1];   /* the longest */

	sodium_bin2hex(hex, 2 * bytes + 1, (const uint8_t *)in + f->offset, bytes);
	frame_pack_kv_str(pk, f->key, hex);
}

static void write_gid(msgpack_packer *pk, const struct proto_field *f,
		      const void *in)
{
	write_hex_n(pk, f, in, PROTO_PEER_GID_BYTES);
}

/* auth_proof.name: exactly 160 hex digits (a sealed node name). */
static int read_name_sealed(const msgpack_object *o, const struct proto_field *f,
			    void *out, struct frame_error *err)
{
	return read_hex_n(o, f, out, err, PROTO_PEER_NAME_SEALED);
}

static void write_name_sealed(msgpack_packer *pk, const struct proto_field *f,
			      const void *in)
{
	write_hex_n(pk, f, in, PROTO_PEER_NAME_SEALED);
}

/* hello.session: optional, so its presence is part of the value. */
static int read_session(const msgpack_object *o, const struct proto_field *f,
			void *out, struct frame_error *err)
{
	int r = read_hex(o, f, out, err);

	if (!r)
		((struct proto_peer_msg *)out)->hello.has_session = true;
	return r;
}

static void write_hex(msgpack_packer *pk, const struct proto_field *f,
		      const void *in)
{
	write_hex_n(pk, f, in, PROTO_PEER_NONCE_BYTES);
}

/* Keyed links derive the session token: their hellos carry none. */
static bool has_session(const void *in)
{
	return ((const struct proto_peer_msg *)in)->hello.has_session;
}

/* ---- hello -------------------------------------------------------------- */

#define MSG_U32(k, m, lo) \
	PROTO_FIELD_U32(struct proto_peer_msg, k, true, m, lo, UINT32_MAX)
#define MSG_U64(k, req, m, lo) \
	PROTO_FIELD_U64(struct proto_peer_msg, k, req, m, lo, UINT64_MAX)
#define MSG_STR(k, req, m) PROTO_FIELD_STR(struct proto_peer_msg, k, req, m)
#define MSG_HEX(k, m) \
	PROTO_FIELD_CUSTOM(struct proto_peer_msg, k, true, m, read_hex, \
			   write_hex)

static const struct proto_field hello_fields[] = {
	MSG_U32("version", hello.version, 0),
	MSG_STR("role", true, hello.role),
	MSG_STR("node", false, hello.node),
	MSG_STR("model_sha256", true, hello.model_sha256),
	MSG_STR("kv_dtype", true, hello.kv_dtype),
	MSG_U32("page_tokens", hello.page_tokens, 1),
	MSG_U32("n_layer", hello.n_layer, 1),
	MSG_U32("kv_dim", hello.kv_dim, 1),
	MSG_U64("page_bytes", true, hello.page_bytes, 1),
	MSG_U64("pool_tokens", true, hello.pool_tokens, 0),
	MSG_U64("context", true, hello.context, 0),
	MSG_U64("max_batch_bytes", true, hello.max_batch_bytes, 1),
	PROTO_FIELD_BOOL(struct proto_peer_msg, "checksum", true,
			 hello.checksum),
	{ .key = "session", .type = PROTO_F_CUSTOM,
	  .offset = offsetof(struct proto_peer_msg, hello.session),
	  .read = read_session, .write = write_hex, .present = has_session },
};

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

static const struct proto_field data_fields[] = {
	MSG_HEX("token", token),
};

/* ---- authentication (before anything else; net/peer_auth.h) ---------------- */

static const struct proto_field auth_hello_fields[] = {
	MSG_U32("version", version, 0),
	MSG_HEX("nonce", nonce),
	MSG_STR("suite", false, suite),
};

static const struct proto_field auth_challenge_fields[] = {
	MSG_HEX("nonce", nonce),
	MSG_STR("suite", false, suite),
};

static const struct proto_field auth_proof_fields[] = {
	MSG_HEX("proof", proof),
	PROTO_FIELD_CUSTOM(struct proto_peer_msg, "name", true, name_sealed,
			   read_name_sealed, write_name_sealed),
};

static const struct proto_field refused_fields[] = {
	MSG_STR("reason", true, reason),
};

static const struct proto_field heartbeat_fields[] = {
	MSG_U32("load", load, 0),
	MSG_U64("free_tokens", false, free_tokens, 0),
};

/* prefill_reject, abort */
static const struct proto_field code_fields[] = {
	PROTO_FIELD_CUSTOM(struct proto_peer_msg, "code", true, code,
			   proto__read_err_code, proto__write_err_code),
	MSG_STR("message", false, message),
};

/* abort / abort_ack: the sender's count of batches it posted for the
 * request (prefill; decode posts none and sends 0), optional on the wire:
 * absent reads as 0 (PROTOCOL.md s. 3). */
static const struct proto_field abort_fields[] = {
	PROTO_FIELD_CUSTOM(struct proto_peer_msg, "code", true, code,
			   proto__read_err_code, proto__write_err_code),
	MSG_STR("message", false, message),
	PROTO_FIELD_U32(struct proto_peer_msg, "batches", false, batches, 0,
			UINT32_MAX),
};

static const struct proto_field abort_ack_fields[] = {
	PROTO_FIELD_U32(struct proto_peer_msg, "batches", false, batches, 0,
			UINT32_MAX),
};

static const struct proto_field done_fields[] = {
	MSG_U32("first_token", first_token, 0),
	MSG_U32("tokens", done_tokens, 1),
	MSG_U32("batches", batches, 0),
	MSG_U32("pages", done_pages, 0),
	PROTO_FIELD_U32(struct proto_peer_msg, "cached_tokens", false,
			cached_tokens, 0, UINT32_MAX),
	MSG_U64("prefill_id", false, prefill_id, 0),
};

/* ---- prefill_request ---------------------------------------------------- */

/* [[page, generation > 0], ...]: 1..f->max pairs into a calloc'd array
 * (freed by proto_peer_msg_deinit, also after a refusal); nil is not
 * absence here. */
static int read_pages(const msgpack_object *o, const struct proto_field *f,
		      void *out, struct frame_error *err)
{
	struct proto_peer_msg *m = out;

	if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size == 0 ||
	    o->via.array.size > f->max)
		return proto_schema_fail(err, FRAME_E_RANGE, f->key,
					 "'%s' must be an array of 1..%llu pairs",
					 f->key, (unsigned long long)f->max);
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
			return proto_schema_fail(err, FRAME_E_RANGE, f->key,
						 "'%s'[%u] must be [page, generation>0]",
						 f->key, i);
		m->pages[i].page = (uint32_t)page;
		m->pages[i].gen = gen;
	}
	return 0;
}

static void write_pages(msgpack_packer *pk, const struct proto_field *f,
			const void *in)
{
	const struct proto_peer_msg *m = in;

	frame_pack_str(pk, f->key);
	msgpack_pack_array(pk, m->n_pages);
	for (uint32_t i = 0; i < m->n_pages; i++) {
		msgpack_pack_array(pk, 2);
		msgpack_pack_uint32(pk, m->pages[i].page);
		msgpack_pack_uint64(pk, m->pages[i].gen);
	}
}

/* "tenant": the API keys file's rule; a value that breaks it is named by
 * key only (never echoed: it came from a peer). */
static int read_tenant(const msgpack_object *o, const struct proto_field *f,
		       void *out, struct frame_error *err)
{
	struct proto_peer_msg *m = out;

	_Static_assert(KVD_APIKEY_TENANT_MAX < PROTO_PEER_TENANT_MAX,
		       "a tenant and its NUL fit");
	if (o->type != MSGPACK_OBJECT_STR ||
	    !kvd_apikeys_tenant_ok(o->via.str.ptr, o->via.str.size))
		return proto_schema_fail(err, FRAME_E_RANGE, f->key,
					 "'%s' must be a string of 1..%u characters of A-Z a-z 0-9 _ . -",
					 f->key, KVD_APIKEY_TENANT_MAX);
	memcpy(m->tenant, o->via.str.ptr, o->via.str.size);
	m->tenant[o->via.str.size] = 0;
	return 0;
}

static void write_tenant(msgpack_packer *pk, const struct proto_field *f,
			 const void *in)
{
	frame_pack_kv_str(pk, f->key, ((const struct proto_peer_msg *)in)->tenant);
}

static bool tenant_present(const void *in)
{
	const struct proto_peer_msg *m = in;

	return m->tenant[0] && strcmp(m->tenant, PROTO_PEER_TENANT_DEFAULT) != 0;
}

static bool salt_present(const void *in)
{
	return ((const struct proto_peer_msg *)in)->cache_salt[0] != 0;
}

/* Unlike a client request, every sampling field is spelled out. The
 * tenant is last: a bad one is then the request's only problem, which
 * prefill answers with a prefill_reject (the link stays up). */
static const struct proto_field prefill_request_fields[] = {
	PROTO_FIELD_U32_ARRAY(struct proto_peer_msg, "tokens", true, tokens,
			      n_tokens, PROTO_CLIENT_TOKENS_MAX),
	{ .key = "pages", .type = PROTO_F_CUSTOM, .required = true,
	  .keep_nil = true, .read = read_pages, .write = write_pages,
	  .max = PROTO_PEER_PAGES_MAX },
	PROTO_FIELD_U32(struct proto_peer_msg, "max_tokens", true, max_tokens,
			1, PROTO_CLIENT_MAX_TOKENS),
	PROTO_FIELD_FLOAT(struct proto_peer_msg, "temperature", true,
			  temperature, 0.0, 100.0, false),
	MSG_U32("top_k", top_k, 0),
	PROTO_FIELD_FLOAT(struct proto_peer_msg, "top_p", true, top_p,
			  0.0, 1.0, true),
	MSG_U64("seed", true, seed, 0),
	{ .key = "cache_salt", .type = PROTO_F_STR, .required = false,
	  .offset = offsetof(struct proto_peer_msg, cache_salt),
	  .size = sizeof(((struct proto_peer_msg *)0)->cache_salt),
	  .present = salt_present },
	{ .key = "tenant", .type = PROTO_F_CUSTOM, .required = false,
	  .read = read_tenant, .write = write_tenant,
	  .present = tenant_present },
};

/* ---- verbs (net/verbs/verbs_ops.h): the RC exchange ----------------------------- */

static const struct proto_field verbs_qp_fields[] = {
	PROTO_FIELD_U32(struct proto_peer_msg, "qpn", true, vqp.qpn, 1, 0xffffff),
	PROTO_FIELD_U32(struct proto_peer_msg, "psn", true, vqp.psn, 0, 0xffffff),
	PROTO_FIELD_U32(struct proto_peer_msg, "lid", true, vqp.lid, 0, 0xffff),
	PROTO_FIELD_U32(struct proto_peer_msg, "mtu", true, vqp.mtu, 256, 4096),
	PROTO_FIELD_CUSTOM(struct proto_peer_msg, "gid", true, vqp.gid, read_gid,
			   write_gid),
};

/* [[first_page, n_pages >= 1, addr, rkey], ...]: 1..f->max runs into a
 * calloc'd array (freed by proto_peer_msg_deinit, also after a refusal);
 * a run may not wrap the page numbers or the address space (the pages'
 * size is checked by the receiver, which knows it). */
static int read_runs(const msgpack_object *o, const struct proto_field *f,
		     void *out, struct frame_error *err)
{
	struct proto_peer_msg *m = out;

	if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size == 0 ||
	    o->via.array.size > f->max)
		return proto_schema_fail(err, FRAME_E_RANGE, f->key,
					 "'%s' must be an array of 1..%llu runs",
					 f->key, (unsigned long long)f->max);
	m->runs = calloc(o->via.array.size, sizeof(*m->runs));
	if (!m->runs)
		return -ENOMEM;
	m->n_runs = o->via.array.size;
	for (uint32_t i = 0; i < m->n_runs; i++) {
		const msgpack_object *e = &o->via.array.ptr[i];
		uint64_t v[4];
		bool ok = e->type == MSGPACK_OBJECT_ARRAY && e->via.array.size == 4;

		for (uint32_t k = 0; ok && k < 4; k++)
			ok = frame_obj_u64(&e->via.array.ptr[k], &v[k]) == 0;
		if (!ok || v[0] > UINT32_MAX || v[1] == 0 || v[1] > UINT32_MAX ||
		    v[0] + v[1] > (uint64_t)UINT32_MAX + 1 || v[3] > UINT32_MAX)
			return proto_schema_fail(err, FRAME_E_RANGE, f->key,
						 "'%s'[%u] must be [first_page, n_pages>0, addr, rkey]",
						 f->key, i);
		m->runs[i] = (struct proto_peer_run){
			.first_page = (uint32_t)v[0], .n_pages = (uint32_t)v[1],
			.addr = v[2], .rkey = (uint32_t)v[3] };
	}
	return 0;
}

static void write_runs(msgpack_packer *pk, const struct proto_field *f,
		       const void *in)
{
	const struct proto_peer_msg *m = in;

	frame_pack_str(pk, f->key);
	msgpack_pack_array(pk, m->n_runs);
	for (uint32_t i = 0; i < m->n_runs; i++) {
		msgpack_pack_array(pk, 4);
		msgpack_pack_uint32(pk, m->runs[i].first_page);
		msgpack_pack_uint32(pk, m->runs[i].n_pages);
		msgpack_pack_uint64(pk, m->runs[i].addr);
		msgpack_pack_uint32(pk, m->runs[i].rkey);
	}
}

static const struct proto_field verbs_scope_fields[] = {
	{ .key = "runs", .type = PROTO_F_CUSTOM, .required = true,
	  .keep_nil = true, .read = read_runs, .write = write_runs,
	  .max = PROTO_PEER_RUNS_MAX },
};

/* verbs_credit: decode's running count of mailbox batches copied out
 * (PROTOCOL.md s. 4, credits) */
static const struct proto_field verbs_credit_fields[] = {
	MSG_U64("consumed", true, consumed, 0),
};

/* ---- the table ---------------------------------------------------------- */

#define NO_FIELDS NULL, 0

static const struct peer_msg_desc peer_msgs[PEER_MSG__N] = {
	[PEER_MSG_HELLO] = { "hello", false, PROTO_FIELDS(hello_fields) },
	[PEER_MSG_DATA] = { "data", false, PROTO_FIELDS(data_fields) },
	[PEER_MSG_HEARTBEAT] = { "heartbeat", false,
				 PROTO_FIELDS(heartbeat_fields) },
	[PEER_MSG_PREFILL_REQUEST] = { "prefill_request", true,
				       PROTO_FIELDS(prefill_request_fields) },
	[PEER_MSG_PREFILL_REJECT] = { "prefill_reject", true,
				      PROTO_FIELDS(code_fields) },
	[PEER_MSG_PREFILL_DONE] = { "prefill_done", true,
				    PROTO_FIELDS(done_fields) },
	[PEER_MSG_ABORT] = { "abort", true, PROTO_FIELDS(abort_fields) },
	[PEER_MSG_ABORT_ACK] = { "abort_ack", true,
				 PROTO_FIELDS(abort_ack_fields) },
	[PEER_MSG_RELEASE_ACK] = { "release_ack", true, NO_FIELDS },
	[PEER_MSG_AUTH_HELLO] = { "auth_hello", false,
				  PROTO_FIELDS(auth_hello_fields) },
	[PEER_MSG_AUTH_CHALLENGE] = { "auth_challenge", false,
				      PROTO_FIELDS(auth_challenge_fields) },
	[PEER_MSG_AUTH_PROOF] = { "auth_proof", false,
				  PROTO_FIELDS(auth_proof_fields) },
	[PEER_MSG_REFUSED] = { "refused", false,
			       PROTO_FIELDS(refused_fields) },
	[PEER_MSG_DATA_BOUND] = { "data_bound", false, NO_FIELDS },
	[PEER_MSG_VERBS_QP] = { "verbs_qp", false, PROTO_FIELDS(verbs_qp_fields) },
	[PEER_MSG_VERBS_SCOPE] = { "verbs_scope", true,
				   PROTO_FIELDS(verbs_scope_fields) },
	[PEER_MSG_VERBS_CREDIT] = { "verbs_credit", false,
				    PROTO_FIELDS(verbs_credit_fields) },
};

static const struct proto_field id_fields[] = {
	MSG_U64("id", true, id, 0),
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
		return proto_schema_fail(err, FRAME_E_NOTMAP, "",
					 "frame is not a map");
	for (int t = 1; t < PEER_MSG__N; t++) {
		const struct peer_msg_desc *d = &peer_msgs[t];

		if (!proto_schema_type_is(map, d->name))
			continue;
		m->type = (enum proto_peer_type)t;
		if (d->has_id) {
			r = proto_schema_read(map, PROTO_FIELDS(id_fields), m, err);
			if (r)
				return r;
		}
		if (m->type == PEER_MSG_PREFILL_REQUEST)
			snprintf(m->tenant, sizeof(m->tenant), "%s",
				 PROTO_PEER_TENANT_DEFAULT);
		r = proto_schema_read(map, d->fields, d->n_fields, m, err);
		if (r)
			proto_peer_msg_deinit(m);
		return r;
	}
	return proto_schema_fail(err, FRAME_E_TYPE, "type",
				 "unknown peer message type");
}

void proto_peer_pack(msgpack_packer *pk, const struct proto_peer_msg *m)
{
	const struct peer_msg_desc *d = &peer_msgs[m->type];

	msgpack_pack_map(pk, 1 + d->has_id +
			 proto_schema_count(d->fields, d->n_fields, m));
	frame_pack_kv_str(pk, "type", d->name);
	if (d->has_id)
		frame_pack_kv_u64(pk, "id", m->id);
	proto_schema_write(pk, d->fields, d->n_fields, m);
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
