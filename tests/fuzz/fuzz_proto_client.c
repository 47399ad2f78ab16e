/* fuzz_proto_client.c - the client API frames (net/wire/proto_client.h):
 * proto_client_request_parse (server side, hostile tenants) and
 * proto_client_event_parse (kvctl generate, a hostile or broken server),
 * on whatever frame_decode makes of the input: the input is the frame's
 * payload (the target adds the 4-byte header, so length-changing
 * mutations still reach the message readers; fuzz_frame covers headers).
 *
 * Properties:
 *   - rejected: a FRAME_E_* (or -ENOMEM) with a non-empty message; the
 *     server answers INVALID_REQUEST with it;
 *   - accepted request: exactly one of prompt and tokens, bounded
 *     (prompt without NUL, 1..PROTO_CLIENT_TOKENS_MAX ids), max_tokens in
 *     1..PROTO_CLIENT_MAX_TOKENS, temperature in [0, 100], top_p in (0, 1]
 *     as the sampler sees it (the float), and pack -> parse -> pack is a
 *     fixed point;
 *   - accepted event: a known type, text_len within PROTO_CLIENT_PIECE_MAX
 *     and terminated, a known error code, and the same fixed point;
 *   - no leak on any path (deinit after success and failure).
 */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "net/wire/proto_client.h"
#include "tests/fuzz/fuzz.h"

const char fuzz_target_name[] = "proto_client";

typedef void (*pack_fn)(msgpack_packer *pk, const void *x);

static void pack_into(struct fuzz_bytes *b, pack_fn fn, const void *x)
{
	msgpack_packer pk;
	uint8_t hdr[4] = { 0 };

	b->n = 0;
	fuzz_bytes_add(b, hdr, 4);
	msgpack_packer_init(&pk, b, fuzz_bytes_write);
	fn(&pk, x);
	size_t n = b->n - 4;

	b->p[0] = (uint8_t)(n >> 24);
	b->p[1] = (uint8_t)(n >> 16);
	b->p[2] = (uint8_t)(n >> 8);
	b->p[3] = (uint8_t)n;
}

static void check_err(int r, const struct frame_error *err, const char *what)
{
	FUZZ_CHECK((r >= FRAME_E_MALFORMED && r <= FRAME_E_DUPLICATE) ||
		   r == -ENOMEM, "%s: %d (%s)", what, r, frame_strerror(r));
	FUZZ_CHECK(r < 0 || (memchr(err->msg, 0, sizeof(err->msg)) &&
			     err->msg[0]), "%s: %s without a message", what,
		   frame_strerror(r));
}

/* ---- request ------------------------------------------------------------ */

static void pack_request(msgpack_packer *pk, const void *x)
{
	proto_client_request_pack(pk, x);
}

static void check_request(const struct proto_client_request *r)
{
	FUZZ_CHECK(!r->prompt != !r->tokens, "prompt %p tokens %p",
		   (void *)r->prompt, (void *)r->tokens);
	if (r->prompt)
		FUZZ_CHECK(strlen(r->prompt) <= PROTO_CLIENT_PROMPT_MAX,
			   "prompt of %zu bytes", strlen(r->prompt));
	else
		FUZZ_CHECK(r->n_tokens >= 1 && r->n_tokens <= PROTO_CLIENT_TOKENS_MAX,
			   "%u tokens", r->n_tokens);
	FUZZ_CHECK(r->max_tokens >= 1 && r->max_tokens <= PROTO_CLIENT_MAX_TOKENS,
		   "max_tokens %u", r->max_tokens);
	FUZZ_CHECK(r->temperature >= 0.0f && r->temperature <= 100.0f,
		   "temperature %g", (double)r->temperature);
	/* top_p is judged after narrowing to float: 1e-300 once passed as
	 * 0.0f, "nucleus off" (found here, fixed in a744ff0) */
	FUZZ_CHECK(r->top_p > 0.0f && r->top_p <= 1.0f,
		   "top_p %g (float) accepted: the contract says (0, 1]",
		   (double)r->top_p);
}

static void fixed_point(struct fuzz_bytes *a, int (*reparse)(const msgpack_object *,
			void *, struct frame_error *), void *y, pack_fn fn)
{
	msgpack_unpacked msg;
	const msgpack_object *o;
	struct frame_error err;
	struct fuzz_bytes b = { 0 };
	int r;

	msgpack_unpacked_init(&msg);
	r = frame_decode(a->p, a->n, FRAME_MAX_LIMIT, &msg, &o);
	FUZZ_CHECK(r == 0, "packed frame does not decode: %s", frame_strerror(r));
	r = reparse(o, y, &err);
	FUZZ_CHECK(r == 0, "packed message refused: %s: %s", err.key, err.msg);
	pack_into(&b, fn, y);
	FUZZ_CHECK(fuzz_bytes_eq(a, &b), "pack -> parse -> pack differs");
	msgpack_unpacked_destroy(&msg);
	free(b.p);
}

static int reparse_request(const msgpack_object *o, void *y,
			   struct frame_error *err)
{
	return proto_client_request_parse(o, y, err);
}

static void fuzz_request(const msgpack_object *map)
{
	struct proto_client_request r, r2 = PROTO_CLIENT_REQUEST_NULL;
	struct frame_error err;
	struct fuzz_bytes a = { 0 };
	int ret = proto_client_request_parse(map, &r, &err);

	if (ret) {
		check_err(ret, &err, "request");
		proto_client_request_deinit(&r);
		return;
	}
	check_request(&r);
	pack_into(&a, pack_request, &r);
	fixed_point(&a, reparse_request, &r2, pack_request);
	proto_client_request_deinit(&r);
	proto_client_request_deinit(&r);   /* safe twice */
	proto_client_request_deinit(&r2);
	free(a.p);
}

/* ---- events ------------------------------------------------------------- */

static void pack_event(msgpack_packer *pk, const void *x)
{
	const struct proto_client_event *e = x;

	switch (e->type) {
	case PROTO_EV_TOKEN:
		proto_client_pack_token(pk, e->id, e->index, e->token, e->text,
					e->text_len, e->has_lp ? &e->lp : NULL);
		break;
	case PROTO_EV_FINAL:
		proto_client_pack_final(pk, e->id, &e->fin);
		break;
	case PROTO_EV_ERROR:
		proto_client_pack_error(pk, e->id, e->code, e->message);
		break;
	case PROTO_EV_FRAME_ERROR:
		proto_client_pack_conn_error(pk, e->code, e->message);
		break;
	}
}

static int reparse_event(const msgpack_object *o, void *y,
			 struct frame_error *err)
{
	return proto_client_event_parse(o, y, err);
}

static void fuzz_event(const msgpack_object *map)
{
	struct proto_client_event e, e2;
	struct frame_error err;
	struct fuzz_bytes a = { 0 };
	int ret = proto_client_event_parse(map, &e, &err);

	if (ret) {
		check_err(ret, &err, "event");
		return;
	}
	FUZZ_CHECK(e.type >= PROTO_EV_TOKEN && e.type <= PROTO_EV_FRAME_ERROR,
		   "event type %d", e.type);
	FUZZ_CHECK(e.text_len <= PROTO_CLIENT_PIECE_MAX &&
		   e.text[e.text_len] == '\0', "text_len %u", e.text_len);
	FUZZ_CHECK(memchr(e.message, 0, sizeof(e.message)) &&
		   memchr(e.fin.finish_reason, 0, sizeof(e.fin.finish_reason)),
		   "unterminated string");
	if (e.type == PROTO_EV_ERROR) {
		FUZZ_CHECK(e.code > 0 && e.code < PROTO_ERR__N, "code %d", e.code);
		FUZZ_CHECK(proto_err_parse(proto_err_name(e.code)) == e.code,
			   "error name does not round-trip");
	}
	pack_into(&a, pack_event, &e);
	fixed_point(&a, reparse_event, &e2, pack_event);
	free(a.p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	msgpack_unpacked msg;
	const msgpack_object *map;
	uint8_t *fr;
	int r;

	if (size > PROTO_CLIENT_FRAME_MAX)
		return 0;
	fr = malloc(size + 4);   /* (4 + size): header, then the payload */
	if (!fr)
		return 0;
	fr[0] = (uint8_t)(size >> 24);
	fr[1] = (uint8_t)(size >> 16);
	fr[2] = (uint8_t)(size >> 8);
	fr[3] = (uint8_t)size;
	memcpy(fr + 4, data, size);
	msgpack_unpacked_init(&msg);
	r = frame_decode(fr, size + 4, PROTO_CLIENT_FRAME_MAX, &msg, &map);
	if (r == 0) {
		fuzz_request(map);
		fuzz_event(map);
	}
	msgpack_unpacked_destroy(&msg);
	free(fr);
	return 0;
}

/* Seeds are payloads: the frame without its header. */
static void emit_payload(fuzz_emit_fn emit, void *ctx,
			 const struct fuzz_bytes *b)
{
	emit(ctx, b->p + 4, b->n - 4);
}

/* ---- seeds -------------------------------------------------------------- */

void fuzz_target_seeds(fuzz_emit_fn emit, void *ctx)
{
	static const uint32_t toks[] = { 1, 15043, 3186, 0xffffffffu };
	struct proto_client_request r = PROTO_CLIENT_REQUEST_NULL;
	struct proto_client_event e = { .type = PROTO_EV_TOKEN, .id = 9,
					.index = 3, .token = 42,
					.text = " w\xc3\xb6rld", .text_len = 7 };
	struct fuzz_bytes b = { 0 };

	r.id = 1;
	r.prompt = "Once upon a time";
	r.max_tokens = 16;
	r.temperature = 0.7f;
	r.top_k = 40;
	r.top_p = 0.9f;
	r.seed = 1234;
	pack_into(&b, pack_request, &r);
	emit_payload(emit, ctx, &b);
	r.prompt = NULL;
	r.tokens = (uint32_t *)toks;
	r.n_tokens = 4;
	pack_into(&b, pack_request, &r);
	emit_payload(emit, ctx, &b);
	/* regression: top_p = 1e-300 (fixed in a744ff0) */
	{
		msgpack_packer pk;
		uint8_t hdr[4] = { 0 };

		b.n = 0;
		fuzz_bytes_add(&b, hdr, 4);
		msgpack_packer_init(&pk, &b, fuzz_bytes_write);
		msgpack_pack_map(&pk, 4);
		frame_pack_kv_str(&pk, "type", "request");
		frame_pack_kv_u64(&pk, "id", 1);
		frame_pack_kv_str(&pk, "prompt", "a");
		frame_pack_kv_double(&pk, "top_p", 1e-300);
		b.p[3] = (uint8_t)(b.n - 4);
		emit_payload(emit, ctx, &b);
	}

	pack_into(&b, pack_event, &e);
	emit_payload(emit, ctx, &b);
	e.type = PROTO_EV_FINAL;
	snprintf(e.fin.finish_reason, sizeof(e.fin.finish_reason), "length");
	e.fin.prompt_tokens = 5;
	e.fin.output_tokens = 16;
	e.fin.ttft_us = 1000;
	e.fin.total_us = 90000;
	pack_into(&b, pack_event, &e);
	emit_payload(emit, ctx, &b);
	e.type = PROTO_EV_ERROR;
	e.code = PROTO_ERR_PROMPT_TOO_LONG;
	snprintf(e.message, sizeof(e.message), "prompt of 9 tokens + 16 > 8");
	pack_into(&b, pack_event, &e);
	emit_payload(emit, ctx, &b);
	free(b.p);
}
