/* fuzz_proto_peer.c - prefill <-> decode control messages
 * (net/wire/proto_peer.h): proto_peer_parse through its type table, and
 * proto_peer_hello_match on what it accepts.
 *
 * A peer is another kvd, but a buggy or mismatched one must not crash us
 * or make us write where we should not. The input is a frame payload (the
 * target adds the header). Properties:
 *   - rejected: a FRAME_E_* (or -ENOMEM) with a message, and nothing
 *     left allocated;
 *   - accepted: a known type; a prefill_request has 1..TOKENS_MAX tokens,
 *     at most PROTO_PEER_PAGES_MAX pages, max_tokens in range, top_p in
 *     (0, 1] as a float; strings terminated; a hello matches itself;
 *   - pack -> parse -> pack is a fixed point (the table's reader and
 *     writer agree), and the frame fits PROTO_PEER_FRAME_MAX;
 *   - 32-byte values (data.token, auth_hello/auth_challenge.nonce,
 *     auth_proof.proof, hello.session) are accepted exactly when the map
 *     holds a string of exactly 64 hex digits (either case), and the
 *     value is what those digits say; a refusal naming such a key never
 *     comes with 64 hex digits there; hello.session is optional (absent
 *     or nil: has_session false); refused.reason is the map's string,
 *     shorter than its buffer; auth_hello.version is the map's;
 *   - prefill_request.tenant: accepted exactly when the map holds none
 *     (or nil: then "default") or a string of 1..63 of [A-Za-z0-9_.-],
 *     and then it is that string; a refusal naming it keeps the type and
 *     id (prefill answers that request); other messages carry no tenant;
 *   - verbs_qp: qpn 1..2^24-1, psn < 2^24, lid < 2^16, mtu 256..4096;
 *     verbs_scope: 1..PROTO_PEER_RUNS_MAX runs, each of >= 1 pages that
 *     do not wrap the page numbers; no other message carries runs;
 *   - verbs_credit: its consumed count is the map's; no other message
 *     carries one.
 */
#include <errno.h>
#include <string.h>

#include "conf/apikeys.h"
#include "net/wire/proto_peer.h"
#include "tests/fuzz/fuzz.h"

const char fuzz_target_name[] = "proto_peer";

static void pack_into(struct fuzz_bytes *b, const struct proto_peer_msg *m)
{
	msgpack_packer pk;

	b->n = 0;
	msgpack_packer_init(&pk, b, fuzz_bytes_write);
	proto_peer_pack(&pk, m);
}

/* The 32-byte field a message type carries as hex, or NULL. */
static const char *hex_key(enum proto_peer_type t)
{
	switch (t) {
	case PEER_MSG_DATA: return "token";
	case PEER_MSG_AUTH_HELLO:
	case PEER_MSG_AUTH_CHALLENGE: return "nonce";
	case PEER_MSG_AUTH_PROOF: return "proof";
	case PEER_MSG_HELLO: return "session";
	default: return NULL;
	}
}

static const uint8_t *hex_val(const struct proto_peer_msg *m)
{
	switch (m->type) {
	case PEER_MSG_DATA: return m->token;
	case PEER_MSG_AUTH_HELLO:
	case PEER_MSG_AUTH_CHALLENGE: return m->nonce;
	case PEER_MSG_AUTH_PROOF: return m->proof;
	case PEER_MSG_HELLO: return m->hello.session;
	default: return NULL;
	}
}

static int hex_digit(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* o is a string of exactly 64 hex digits: decode it into v. */
static bool hex64(const msgpack_object *o, uint8_t v[PROTO_PEER_NONCE_BYTES])
{
	if (!o || o->type != MSGPACK_OBJECT_STR ||
	    o->via.str.size != 2 * PROTO_PEER_NONCE_BYTES)
		return false;
	for (int i = 0; i < PROTO_PEER_NONCE_BYTES; i++) {
		int hi = hex_digit(o->via.str.ptr[2 * i]);
		int lo = hex_digit(o->via.str.ptr[2 * i + 1]);

		if (hi < 0 || lo < 0)
			return false;
		v[i] = (uint8_t)(hi << 4 | lo);
	}
	return true;
}

/* prefill_request "tenant" against the map. */
static void check_tenant(const msgpack_object *map,
			 const struct proto_peer_msg *m, int r,
			 const struct frame_error *err)
{
	const msgpack_object *o = frame_map_get(map, "tenant");
	bool absent = !o || o->type == MSGPACK_OBJECT_NIL;
	bool ok = !absent && o->type == MSGPACK_OBJECT_STR &&
		  kvd_apikeys_tenant_ok(o->via.str.ptr, o->via.str.size);

	if (r) {
		if (r > 0 && !strcmp(err->key, "tenant")) {
			FUZZ_CHECK(m->type == PEER_MSG_PREFILL_REQUEST,
				   "'tenant' refused on a %s",
				   proto_peer_type_name(m->type));
			FUZZ_CHECK(!absent && !ok, "a valid or absent tenant refused: %s",
				   err->msg);
			uint64_t id;

			FUZZ_CHECK(frame_obj_u64(frame_map_get(map, "id"), &id) == 0 &&
				   id == m->id, "'tenant' refused without the id read");
		}
		return;
	}
	if (m->type != PEER_MSG_PREFILL_REQUEST) {
		FUZZ_CHECK(!m->tenant[0], "a tenant on a %s",
			   proto_peer_type_name(m->type));
		return;
	}
	FUZZ_CHECK(absent || ok, "an invalid tenant accepted");
	if (absent)
		FUZZ_CHECK(!strcmp(m->tenant, PROTO_PEER_TENANT_DEFAULT),
			   "absent tenant read as '%s'", m->tenant);
	else
		FUZZ_CHECK(strlen(m->tenant) == o->via.str.size &&
			   !memcmp(m->tenant, o->via.str.ptr, o->via.str.size),
			   "tenant is not the map's string");
}

/* The parse of `map` against the map itself (the fields the auth
 * messages added). */
static void check_raw(const msgpack_object *map, const struct proto_peer_msg *m,
		      int r, const struct frame_error *err)
{
	const char *key = hex_key(m->type);
	const msgpack_object *o = key ? frame_map_get(map, key) : NULL;
	uint8_t v[PROTO_PEER_NONCE_BYTES];

	check_tenant(map, m, r, err);
	if (r) {
		/* a refusal at a hex key: what is there is not 64 digits */
		if (key && r > 0 && !strcmp(err->key, key)) {
			FUZZ_CHECK(!hex64(o, v), "'%s' refused with 64 hex "
				   "digits: %s", key, err->msg);
			/* optional and nil: absent, like every optional key */
			FUZZ_CHECK(m->type != PEER_MSG_HELLO || !o ||
				   o->type != MSGPACK_OBJECT_NIL,
				   "hello with \"session\": nil refused: %s",
				   err->msg);
		}
		return;
	}
	if (m->type == PEER_MSG_HELLO) {
		bool absent = !o || o->type == MSGPACK_OBJECT_NIL;

		FUZZ_CHECK(m->hello.has_session == !absent,
			   "has_session %d with session %s", m->hello.has_session,
			   absent ? "absent" : "present");
		if (absent)
			return;
	}
	if (key) {
		FUZZ_CHECK(hex64(o, v), "'%s' accepted without 64 hex digits", key);
		FUZZ_CHECK(!memcmp(v, hex_val(m), sizeof(v)),
			   "'%s' decoded to another value", key);
	}
	if (m->type == PEER_MSG_REFUSED) {
		o = frame_map_get(map, "reason");
		FUZZ_CHECK(o && o->type == MSGPACK_OBJECT_STR &&
			   o->via.str.size < sizeof(m->reason) &&
			   strlen(m->reason) == o->via.str.size &&
			   !memcmp(m->reason, o->via.str.ptr, o->via.str.size),
			   "reason is not the map's string");
	}
	if (m->type == PEER_MSG_AUTH_HELLO) {
		uint64_t u;

		FUZZ_CHECK(frame_obj_u64(frame_map_get(map, "version"), &u) == 0 &&
			   u == m->version, "auth_hello version");
	}
}

static int parse_payload(const uint8_t *data, size_t size,
			 struct proto_peer_msg *m, struct frame_error *err,
			 bool *framed)
{
	msgpack_unpacked msg;
	const msgpack_object *map;
	uint8_t *fr = malloc(size + 4);   /* (4 + size) header, payload */
	int r;

	if (!fr)
		abort();
	fr[0] = (uint8_t)(size >> 24);
	fr[1] = (uint8_t)(size >> 16);
	fr[2] = (uint8_t)(size >> 8);
	fr[3] = (uint8_t)size;
	memcpy(fr + 4, data, size);
	msgpack_unpacked_init(&msg);
	r = frame_decode(fr, size + 4, PROTO_PEER_FRAME_MAX, &msg, &map);
	*framed = r == 0;
	if (r == 0) {
		r = proto_peer_parse(map, m, err);
		check_raw(map, m, r, err);
	}
	msgpack_unpacked_destroy(&msg);
	free(fr);
	return r;
}

static void check_msg(const struct proto_peer_msg *m)
{
	FUZZ_CHECK(m->type >= PEER_MSG_HELLO && m->type < PEER_MSG__N,
		   "type %d", m->type);
	FUZZ_CHECK(memchr(m->message, 0, sizeof(m->message)), "message");
	if (m->type == PEER_MSG_HELLO) {
		const struct proto_peer_hello *h = &m->hello;
		char field[32], msg[256];

		FUZZ_CHECK(memchr(h->role, 0, sizeof(h->role)) &&
			   memchr(h->node, 0, sizeof(h->node)) &&
			   memchr(h->model_sha256, 0, sizeof(h->model_sha256)) &&
			   memchr(h->kv_dtype, 0, sizeof(h->kv_dtype)),
			   "hello string not terminated");
		FUZZ_CHECK(h->page_tokens && h->n_layer && h->kv_dim &&
			   h->page_bytes && h->max_batch_bytes,
			   "zero geometry accepted");
		FUZZ_CHECK(proto_peer_hello_match(h, h, field, sizeof(field),
						  msg, sizeof(msg)) == 0,
			   "a hello does not match itself: %s", msg);
	}
	if (m->type == PEER_MSG_PREFILL_REQUEST) {
		FUZZ_CHECK(m->tokens && m->n_tokens >= 1 &&
			   m->n_tokens <= PROTO_CLIENT_TOKENS_MAX,
			   "%u tokens", m->n_tokens);
		FUZZ_CHECK(m->n_pages <= PROTO_PEER_PAGES_MAX &&
			   (!m->n_pages || m->pages), "%u pages", m->n_pages);
		FUZZ_CHECK(m->max_tokens >= 1 &&
			   m->max_tokens <= PROTO_CLIENT_MAX_TOKENS,
			   "max_tokens %u", m->max_tokens);
		FUZZ_CHECK(m->temperature >= 0.0f && m->temperature <= 100.0f,
			   "temperature %g", (double)m->temperature);
		/* 1e-300 once passed as 0.0f (fixed in a744ff0) */
		FUZZ_CHECK(m->top_p > 0.0f && m->top_p <= 1.0f,
			   "top_p %g (float) accepted", (double)m->top_p);
	} else {
		FUZZ_CHECK(!m->tokens && !m->pages, "arrays on a %s",
			   proto_peer_type_name(m->type));
	}
	if (m->type == PEER_MSG_VERBS_QP)
		FUZZ_CHECK(m->vqp.qpn >= 1 && m->vqp.qpn <= 0xffffff &&
			   m->vqp.psn <= 0xffffff && m->vqp.lid <= 0xffff &&
			   m->vqp.mtu >= 256 && m->vqp.mtu <= 4096,
			   "verbs_qp qpn %u psn %u lid %u mtu %u", m->vqp.qpn,
			   m->vqp.psn, m->vqp.lid, m->vqp.mtu);
	if (m->type == PEER_MSG_VERBS_SCOPE) {
		FUZZ_CHECK(m->runs && m->n_runs >= 1 &&
			   m->n_runs <= PROTO_PEER_RUNS_MAX, "%u runs", m->n_runs);
		for (uint32_t i = 0; i < m->n_runs; i++)
			FUZZ_CHECK(m->runs[i].n_pages >= 1 &&
				   (uint64_t)m->runs[i].first_page + m->runs[i].n_pages <=
				   (uint64_t)UINT32_MAX + 1, "run %u", i);
	} else {
		FUZZ_CHECK(!m->runs && !m->n_runs, "runs on a %s",
			   proto_peer_type_name(m->type));
	}
	if (m->type != PEER_MSG_VERBS_CREDIT)
		FUZZ_CHECK(m->consumed == 0, "a consumed count on a %s",
			   proto_peer_type_name(m->type));
	if (m->type == PEER_MSG_REFUSED)
		FUZZ_CHECK(memchr(m->reason, 0, sizeof(m->reason)),
			   "reason not terminated");
	if (m->type == PEER_MSG_AUTH_HELLO)
		FUZZ_CHECK(m->version <= UINT32_MAX, "version");
	if (m->type == PEER_MSG_PREFILL_REJECT || m->type == PEER_MSG_ABORT)
		FUZZ_CHECK(m->code > 0 && m->code < PROTO_ERR__N, "code %d",
			   m->code);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct proto_peer_msg m, m2;
	struct frame_error err;
	struct fuzz_bytes a = { 0 }, b = { 0 };
	bool framed;
	int r;

	if (size > PROTO_PEER_FRAME_MAX)
		return 0;
	r = parse_payload(data, size, &m, &err, &framed);
	if (!framed)
		return 0;
	if (r) {
		FUZZ_CHECK((r >= FRAME_E_MALFORMED && r <= FRAME_E_DUPLICATE) ||
			   r == -ENOMEM, "parse: %d", r);
		FUZZ_CHECK(r < 0 || (memchr(err.msg, 0, sizeof(err.msg)) &&
				     err.msg[0]), "refused without a message");
		FUZZ_CHECK(!m.tokens && !m.pages && !m.runs, "failed parse kept arrays");
		return 0;
	}
	check_msg(&m);
	pack_into(&a, &m);
	FUZZ_CHECK(a.n <= PROTO_PEER_FRAME_MAX, "packed to %zu bytes", a.n);
	r = parse_payload(a.p, a.n, &m2, &err, &framed);
	FUZZ_CHECK(r == 0, "packed message refused: %s: %s", err.key, err.msg);
	pack_into(&b, &m2);
	FUZZ_CHECK(fuzz_bytes_eq(&a, &b), "pack -> parse -> pack differs (%s)",
		   proto_peer_type_name(m.type));
	proto_peer_msg_deinit(&m);
	proto_peer_msg_deinit(&m);   /* safe twice */
	proto_peer_msg_deinit(&m2);
	free(a.p);
	free(b.p);
	return 0;
}

/* ---- seeds: one of each message, packed by proto_peer_pack ------------- */

void fuzz_target_seeds(fuzz_emit_fn emit, void *ctx)
{
	static uint32_t toks[] = { 1, 2, 3, 300 };
	static struct proto_peer_page pages[] = { { 5, 1 }, { 9, 77 } };
	static struct proto_peer_run runs[] = { { 5, 3, 0x7f0000001000, 0x1234 },
						{ 9, 1, 0x7f0000009000, 0x1301 } };
	struct fuzz_bytes b = { 0 };

	for (int t = PEER_MSG_HELLO; t < PEER_MSG__N; t++) {
		struct proto_peer_msg m;

		memset(&m, 0, sizeof(m));
		m.type = (enum proto_peer_type)t;
		m.id = 42;
		m.hello = (struct proto_peer_hello){
			.version = PROTO_PEER_VERSION, .role = "prefill",
			.node = "p0", .kv_dtype = "f16", .page_tokens = 16,
			.n_layer = 2, .kv_dim = 128, .page_bytes = 16384,
			.pool_tokens = 65536, .context = 2048,
			.max_batch_bytes = 1 << 20, .checksum = true,
			.session = { 7 }, .has_session = true,
		};
		memset(m.hello.model_sha256, 'a', 64);
		memset(m.token, 7, sizeof(m.token));
		memset(m.nonce, 9, sizeof(m.nonce));
		memset(m.proof, 11, sizeof(m.proof));
		m.version = PROTO_PEER_VERSION;
		snprintf(m.reason, sizeof(m.reason), "auth_failed");
		m.load = 3;
		m.free_tokens = 1000;
		m.tokens = toks;
		m.n_tokens = 4;
		m.pages = pages;
		m.n_pages = 2;
		m.max_tokens = 16;
		m.temperature = 0.5f;
		m.top_k = 10;
		m.top_p = 0.95f;
		m.seed = 99;
		snprintf(m.tenant, sizeof(m.tenant), "alice");
		m.code = PROTO_ERR_PROMPT_TOO_LONG;
		snprintf(m.message, sizeof(m.message), "too long");
		m.first_token = 17;
		m.done_tokens = 4;
		m.batches = 1;
		m.done_pages = 2;
		m.vqp = (struct proto_peer_verbs_qp){ .qpn = 0x123, .psn = 7,
						      .lid = 0, .mtu = 4096,
						      .gid = { 0xfe, 0x80, 1 } };
		m.runs = runs;
		m.n_runs = 2;
		m.consumed = 0x100000004ull;
		pack_into(&b, &m);
		emit(ctx, b.p, b.n);
	}
	/* regression: top_p = 1e-300 (fixed in a744ff0) */
	msgpack_packer pk;

	b.n = 0;
	msgpack_packer_init(&pk, &b, fuzz_bytes_write);
	msgpack_pack_map(&pk, 9);
	frame_pack_kv_str(&pk, "type", "prefill_request");
	frame_pack_kv_u64(&pk, "id", 1);
	frame_pack_str(&pk, "tokens");
	msgpack_pack_array(&pk, 1);
	msgpack_pack_uint32(&pk, 1);
	frame_pack_str(&pk, "pages");
	msgpack_pack_array(&pk, 0);
	frame_pack_kv_u64(&pk, "max_tokens", 1);
	frame_pack_kv_double(&pk, "temperature", 0);
	frame_pack_kv_u64(&pk, "top_k", 0);
	frame_pack_kv_double(&pk, "top_p", 1e-300);
	frame_pack_kv_u64(&pk, "seed", 0);
	emit(ctx, b.p, b.n);

	/* tenants: the longest, one too long, empty, a space, a quote, nil,
	 * a number (issue 12) */
	{
		char t63[64], t64[65];

		memset(t63, 't', 63);
		t63[63] = 0;
		memset(t64, 'u', 64);
		t64[64] = 0;
		const char *const tenants[] = { t63, t64, "", "a b", "x\"y",
						"bob_2.c-d", NULL, NULL };
		for (size_t i = 0; i < sizeof(tenants) / sizeof(tenants[0]); i++) {
			b.n = 0;
			msgpack_pack_map(&pk, 10);
			frame_pack_kv_str(&pk, "type", "prefill_request");
			frame_pack_kv_u64(&pk, "id", 2 + i);
			frame_pack_str(&pk, "tokens");
			msgpack_pack_array(&pk, 1);
			msgpack_pack_uint32(&pk, 1);
			frame_pack_str(&pk, "pages");
			msgpack_pack_array(&pk, 1);
			msgpack_pack_array(&pk, 2);
			msgpack_pack_uint32(&pk, 3);
			msgpack_pack_uint32(&pk, 1);
			frame_pack_kv_u64(&pk, "max_tokens", 1);
			frame_pack_kv_double(&pk, "temperature", 0);
			frame_pack_kv_u64(&pk, "top_k", 0);
			frame_pack_kv_double(&pk, "top_p", 1);
			frame_pack_kv_u64(&pk, "seed", 0);
			if (tenants[i]) {
				frame_pack_kv_str(&pk, "tenant", tenants[i]);
			} else {
				frame_pack_str(&pk, "tenant");
				if (i == 6)
					msgpack_pack_nil(&pk);
				else
					msgpack_pack_uint32(&pk, 7);
			}
			emit(ctx, b.p, b.n);
		}
	}

	/* a hello without a session (keyed links derive the token) */
	{
		struct proto_peer_msg m = { .type = PEER_MSG_HELLO };

		m.hello = (struct proto_peer_hello){
			.version = PROTO_PEER_VERSION, .role = "decode",
			.node = "d0", .kv_dtype = "f16", .page_tokens = 16,
			.n_layer = 2, .kv_dim = 128, .page_bytes = 16384,
			.pool_tokens = 65536, .context = 2048,
			.max_batch_bytes = 1 << 20, .checksum = false,
		};
		memset(m.hello.model_sha256, 'c', 64);
		pack_into(&b, &m);
		emit(ctx, b.p, b.n);
		/* the same with "session": nil (absent, as for every optional
		 * field) */
		FUZZ_CHECK(b.p[0] == 0x8e, "hello is not a 14-key fixmap");
		b.p[0] = 0x8f;              /* 15 keys: append one */
		frame_pack_str(&pk, "session");
		msgpack_pack_nil(&pk);
		emit(ctx, b.p, b.n);
	}
	/* 32-byte values in upper case, and one digit short or long */
	static const char *const hexes[] = {
		"00112233445566778899AABBCCDDEEFF00112233445566778899aabbccddeeff",
		"00112233445566778899aabbccddeeff00112233445566778899aabbccddeef",
		"00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff0",
		"00112233445566778899aabbccddeeff00112233445566778899aabbccddeefg",
	};
	for (size_t i = 0; i < sizeof(hexes) / sizeof(hexes[0]); i++) {
		b.n = 0;
		msgpack_pack_map(&pk, 3);
		frame_pack_kv_str(&pk, "type", "auth_hello");
		frame_pack_kv_u64(&pk, "version", PROTO_PEER_VERSION);
		frame_pack_kv_str(&pk, "nonce", hexes[i]);
		emit(ctx, b.p, b.n);
		b.n = 0;
		msgpack_pack_map(&pk, 2);
		frame_pack_kv_str(&pk, "type", "data");
		frame_pack_kv_str(&pk, "token", hexes[i]);
		emit(ctx, b.p, b.n);
	}
	/* refused: the longest reason that fits, and one byte more */
	for (int n = 31; n <= 32; n++) {
		char reason[40];

		memset(reason, 'r', sizeof(reason));
		reason[n] = 0;
		b.n = 0;
		msgpack_pack_map(&pk, 2);
		frame_pack_kv_str(&pk, "type", "refused");
		frame_pack_kv_str(&pk, "reason", reason);
		emit(ctx, b.p, b.n);
	}
	free(b.p);
}
