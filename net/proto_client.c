/* proto_client.c - client API frames.
 *
 * Design. A request arrives from an untrusted client, so every field is
 * read through a typed, range-checked helper, and the first problem
 * becomes a FRAME_E_* code plus a sentence the server sends back as
 * INVALID_REQUEST. Nothing here trusts a count: arrays are bounded before
 * anything is allocated, strings are bounded before they are copied.
 *
 * Exactly one of `prompt` and `tokens` must be present; we never pick one
 * for the client (invariant 3: nothing is ever substituted for what the
 * client asked).
 *
 * Events are small and flat. Pieces of text are msgpack strings of at
 * most PROTO_CLIENT_PIECE_MAX bytes (the server cuts longer pieces).
 */
#include "net/proto_client.h"
#include "net/names.h"
#include "conf/util.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* A code's wire name is its enum name (PROTOCOL.md), so it is spelled
 * once: the name is made from the enumerator. */
#define ERR_NAME(x) [PROTO_ERR_##x] = #x

static const char *const proto_err_names[] = {
	ERR_NAME(NONE),
	ERR_NAME(PROMPT_TOO_LONG),
	ERR_NAME(INVALID_REQUEST),
	ERR_NAME(OVERLOADED),
	ERR_NAME(DRAINING),
	ERR_NAME(NO_PREFILL_PEER),
	ERR_NAME(INTEGRITY),
	ERR_NAME(TIMEOUT),
	ERR_NAME(INTERNAL),
};

const char *proto_err_name(int code)
{
	return NET_NAME(proto_err_names, code);
}

int proto_err_parse(const char *name)
{
	for (int i = 0; i < PROTO_ERR__N; i++)
		if (!strcmp(proto_err_names[i], name))
			return i;
	return -1;
}

/* ---- typed field helpers ----------------------------------------------- */

int proto__fail(struct frame_error *err, int code, const char *key,
		const char *fmt, ...)
{
	va_list ap;

	if (err) {
		err->code = code;
		snprintf(err->key, sizeof(err->key), "%s", key ? key : "");
		va_start(ap, fmt);
		vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
		va_end(ap);
	}
	return code;
}

static int proto_missing(struct frame_error *err, const char *key)
{
	return proto__fail(err, FRAME_E_MISSING, key, "missing key '%s'", key);
}

bool proto__type_is(const msgpack_object *map, const char *type)
{
	return frame_obj_streq(frame_map_get(map, "type"), type);
}

int proto__get_u64(const msgpack_object *map, const char *key, bool required,
		   uint64_t min, uint64_t max, uint64_t *v,
		   struct frame_error *err)
{
	const msgpack_object *o = frame_map_get(map, key);
	uint64_t x;
	int r;

	if (!o || o->type == MSGPACK_OBJECT_NIL)
		return required ? proto_missing(err, key) : 0;
	r = frame_obj_u64(o, &x);
	if (r)
		return proto__fail(err, r, key, "'%s' must be an unsigned integer",
				   key);
	if (x < min || x > max)
		return proto__fail(err, FRAME_E_RANGE, key,
				   "'%s'=%llu is outside [%llu, %llu]", key,
				   (unsigned long long)x,
				   (unsigned long long)min,
				   (unsigned long long)max);
	*v = x;
	return 0;
}

int proto__get_double(const msgpack_object *map, const char *key,
		      bool required, double min, double max, double *v,
		      struct frame_error *err)
{
	const msgpack_object *o = frame_map_get(map, key);
	double x;
	int r;

	if (!o || o->type == MSGPACK_OBJECT_NIL)
		return required ? proto_missing(err, key) : 0;
	r = frame_obj_double(o, &x);
	if (r)
		return proto__fail(err, r, key, "'%s' must be a number", key);
	if (!isfinite(x) || x < min || x > max)
		return proto__fail(err, FRAME_E_RANGE, key,
				   "'%s'=%g is outside [%g, %g]", key, x, min,
				   max);
	*v = x;
	return 0;
}

int proto__get_bool(const msgpack_object *map, const char *key,
		    bool required, bool *v, struct frame_error *err)
{
	const msgpack_object *o = frame_map_get(map, key);

	if (!o || o->type == MSGPACK_OBJECT_NIL)
		return required ? proto_missing(err, key) : 0;
	if (frame_obj_bool(o, v))
		return proto__fail(err, FRAME_E_TYPE, key,
				   "'%s' must be a boolean", key);
	return 0;
}

int proto__get_str(const msgpack_object *map, const char *key, bool required,
		   char *buf, size_t size, struct frame_error *err)
{
	const msgpack_object *o = frame_map_get(map, key);
	int r;

	if (!o || o->type == MSGPACK_OBJECT_NIL)
		return required ? proto_missing(err, key) : 0;
	r = frame_obj_str(o, buf, size);
	if (r == FRAME_E_TYPE)
		return proto__fail(err, r, key, "'%s' must be a string", key);
	if (r)
		return proto__fail(err, r, key,
				   "'%s' is longer than %zu bytes or holds a NUL",
				   key, size - 1);
	return 0;
}

int proto__get_u32_array(const msgpack_object *map, const char *key,
			 bool required, uint32_t max_n, uint64_t limit,
			 uint32_t **out, uint32_t *n, struct frame_error *err)
{
	const msgpack_object *o = frame_map_get(map, key);
	uint32_t *a;

	if (!o || o->type == MSGPACK_OBJECT_NIL)
		return required ? proto_missing(err, key) : 0;
	if (o->type != MSGPACK_OBJECT_ARRAY)
		return proto__fail(err, FRAME_E_TYPE, key,
				   "'%s' must be an array", key);
	if (o->via.array.size == 0 || o->via.array.size > max_n)
		return proto__fail(err, FRAME_E_RANGE, key,
				   "'%s' must hold 1..%u entries, not %u", key,
				   max_n, o->via.array.size);
	a = malloc(sizeof(*a) * o->via.array.size);
	if (!a)
		return -ENOMEM;
	for (uint32_t i = 0; i < o->via.array.size; i++) {
		uint64_t x;

		if (frame_obj_u64(&o->via.array.ptr[i], &x) ||
		    x > UINT32_MAX || (limit && x >= limit)) {
			free(a);
			return proto__fail(err, FRAME_E_RANGE, key,
					   "'%s'[%u] is not an integer in [0, %llu)",
					   key, i,
					   (unsigned long long)(limit ? limit
							: (uint64_t)UINT32_MAX + 1));
		}
		a[i] = (uint32_t)x;
	}
	*out = a;
	*n = o->via.array.size;
	return 0;
}

/* ---- request ------------------------------------------------------------ */

void proto_client_request_deinit(struct proto_client_request *r)
{
	free(r->prompt);
	r->prompt = NULL;
	free(r->tokens);
	r->tokens = NULL;
	r->n_tokens = 0;
}

static int request_prompt(const msgpack_object *map,
			  struct proto_client_request *r,
			  struct frame_error *err)
{
	const msgpack_object *p = frame_map_get(map, "prompt");
	const msgpack_object *t = frame_map_get(map, "tokens");

	if (p && p->type == MSGPACK_OBJECT_NIL)
		p = NULL;
	if (t && t->type == MSGPACK_OBJECT_NIL)
		t = NULL;
	if (!!p == !!t)
		return proto__fail(err, FRAME_E_MISSING, "prompt",
				   "exactly one of 'prompt' and 'tokens' is required");
	if (t)
		return proto__get_u32_array(map, "tokens", true,
					    PROTO_CLIENT_TOKENS_MAX, 0,
					    &r->tokens, &r->n_tokens, err);
	if (p->type != MSGPACK_OBJECT_STR)
		return proto__fail(err, FRAME_E_TYPE, "prompt",
				   "'prompt' must be a string");
	if (p->via.str.size > PROTO_CLIENT_PROMPT_MAX)
		return proto__fail(err, FRAME_E_RANGE, "prompt",
				   "'prompt' is longer than %u bytes",
				   PROTO_CLIENT_PROMPT_MAX);
	if (memchr(p->via.str.ptr, 0, p->via.str.size))
		return proto__fail(err, FRAME_E_RANGE, "prompt",
				   "'prompt' holds a NUL byte");
	r->prompt = malloc(p->via.str.size + 1);
	if (!r->prompt)
		return -ENOMEM;
	memcpy(r->prompt, p->via.str.ptr, p->via.str.size);
	r->prompt[p->via.str.size] = 0;
	return 0;
}

int proto_client_request_parse(const msgpack_object *map,
			       struct proto_client_request *r,
			       struct frame_error *err)
{
	struct proto_client_request x = PROTO_CLIENT_REQUEST_NULL;
	uint64_t u;
	double d;
	int ret;

	*r = x;
	if (!map || map->type != MSGPACK_OBJECT_MAP)
		return proto__fail(err, FRAME_E_NOTMAP, "", "frame is not a map");
	if (!proto__type_is(map, "request"))
		return proto__fail(err, FRAME_E_TYPE, "type",
				   "'type' must be \"request\"");
	ret = proto__get_u64(map, "id", true, 0, UINT64_MAX, &x.id, err);
	if (ret)
		return ret;
	u = x.max_tokens;
	ret = proto__get_u64(map, "max_tokens", false, 1,
			     PROTO_CLIENT_MAX_TOKENS, &u, err);
	if (ret)
		return ret;
	x.max_tokens = (uint32_t)u;
	d = x.temperature;
	ret = proto__get_double(map, "temperature", false, 0.0, 100.0, &d, err);
	if (ret)
		return ret;
	x.temperature = (float)d;
	u = 0;
	ret = proto__get_u64(map, "top_k", false, 0, UINT32_MAX, &u, err);
	if (ret)
		return ret;
	x.top_k = (uint32_t)u;
	d = x.top_p;
	ret = proto__get_double(map, "top_p", false, 0.0, 1.0, &d, err);
	if (ret)
		return ret;
	/* Judge the value the sampler will see: a tiny positive double
	 * narrows to 0.0f, which would mean "nucleus off". */
	if ((float)d <= 0.0f)
		return proto__fail(err, FRAME_E_RANGE, "top_p",
				   "'top_p' must be in (0, 1]");
	x.top_p = (float)d;
	ret = proto__get_u64(map, "seed", false, 0, UINT64_MAX, &x.seed, err);
	if (ret)
		return ret;
	ret = request_prompt(map, &x, err);
	if (ret) {
		proto_client_request_deinit(&x);
		return ret;
	}
	*r = x;
	return 0;
}

void proto_client_request_pack(msgpack_packer *pk,
			       const struct proto_client_request *r)
{
	msgpack_pack_map(pk, 8);
	frame_pack_kv_str(pk, "type", "request");
	frame_pack_kv_u64(pk, "id", r->id);
	if (r->prompt) {
		frame_pack_kv_str(pk, "prompt", r->prompt);
	} else {
		frame_pack_str(pk, "tokens");
		msgpack_pack_array(pk, r->n_tokens);
		for (uint32_t i = 0; i < r->n_tokens; i++)
			msgpack_pack_uint32(pk, r->tokens[i]);
	}
	frame_pack_kv_u64(pk, "max_tokens", r->max_tokens);
	frame_pack_kv_double(pk, "temperature", r->temperature);
	frame_pack_kv_u64(pk, "top_k", r->top_k);
	frame_pack_kv_double(pk, "top_p", r->top_p);
	frame_pack_kv_u64(pk, "seed", r->seed);
}

/* ---- events ------------------------------------------------------------- */

void proto_client_pack_token(msgpack_packer *pk, uint64_t id, uint32_t index,
			     uint32_t token, const char *piece, uint32_t len)
{
	if (len > PROTO_CLIENT_PIECE_MAX)
		len = PROTO_CLIENT_PIECE_MAX;
	msgpack_pack_map(pk, 5);
	frame_pack_kv_str(pk, "type", "token");
	frame_pack_kv_u64(pk, "id", id);
	frame_pack_kv_u64(pk, "index", index);
	frame_pack_kv_u64(pk, "token", token);
	frame_pack_str(pk, "text");
	msgpack_pack_str(pk, len);
	msgpack_pack_str_body(pk, piece, len);
}

void proto_client_pack_final(msgpack_packer *pk, uint64_t id,
			     const struct proto_client_final *f)
{
	msgpack_pack_map(pk, 8);
	frame_pack_kv_str(pk, "type", "final");
	frame_pack_kv_u64(pk, "id", id);
	frame_pack_kv_str(pk, "finish_reason", f->finish_reason);
	frame_pack_kv_u64(pk, "prompt_tokens", f->prompt_tokens);
	frame_pack_kv_u64(pk, "output_tokens", f->output_tokens);
	frame_pack_kv_u64(pk, "ttft_us", f->ttft_us);
	frame_pack_kv_u64(pk, "total_us", f->total_us);
	frame_pack_str(pk, "text");
	msgpack_pack_str(pk, KVD_MIN(f->text_len, sizeof(f->text)));
	msgpack_pack_str_body(pk, f->text, KVD_MIN(f->text_len, sizeof(f->text)));
}

void proto_client_pack_error(msgpack_packer *pk, uint64_t id, int code,
			     const char *message)
{
	char msg[PROTO_CLIENT_MSG_MAX + 1];

	snprintf(msg, sizeof(msg), "%s", message ? message : "");
	msgpack_pack_map(pk, 4);
	frame_pack_kv_str(pk, "type", "error");
	frame_pack_kv_u64(pk, "id", id);
	frame_pack_kv_str(pk, "code", proto_err_name(code));
	frame_pack_kv_str(pk, "message", msg);
}

void proto_client_pack_conn_error(msgpack_packer *pk, int code,
				  const char *message)
{
	char msg[PROTO_CLIENT_MSG_MAX + 1];

	snprintf(msg, sizeof(msg), "%s", message ? message : "");
	msgpack_pack_map(pk, 3);
	frame_pack_kv_str(pk, "type", "frame_error");
	frame_pack_kv_str(pk, "code", proto_err_name(code));
	frame_pack_kv_str(pk, "message", msg);
}

int proto_client_frame_conn_error(int code, const char *message,
				  char **data, size_t *len)
{
	struct frame_writer w;
	int r;

	frame_writer_init(&w);
	proto_client_pack_conn_error(frame_writer_packer(&w), code, message);
	r = frame_writer_finish(&w, PROTO_CLIENT_FRAME_MAX, data, len);
	frame_writer_deinit(&w);
	return r;
}

int proto_client_frame_error(uint64_t id, int code, const char *message,
			     char **data, size_t *len)
{
	struct frame_writer w;
	int r;

	frame_writer_init(&w);
	proto_client_pack_error(frame_writer_packer(&w), id, code, message);
	r = frame_writer_finish(&w, PROTO_CLIENT_FRAME_MAX, data, len);
	frame_writer_deinit(&w);
	return r;
}

static int event_token(const msgpack_object *map, struct proto_client_event *ev,
		       struct frame_error *err)
{
	const msgpack_object *t;
	uint64_t u = 0;
	int r;

	r = proto__get_u64(map, "index", true, 0, UINT32_MAX, &u, err);
	if (r)
		return r;
	ev->index = (uint32_t)u;
	r = proto__get_u64(map, "token", true, 0, UINT32_MAX, &u, err);
	if (r)
		return r;
	ev->token = (uint32_t)u;
	t = frame_map_get(map, "text");
	if (!t)
		return proto_missing(err, "text");
	if (t->type != MSGPACK_OBJECT_STR && t->type != MSGPACK_OBJECT_BIN)
		return proto__fail(err, FRAME_E_TYPE, "text",
				   "'text' must be a string");
	if (t->via.str.size > PROTO_CLIENT_PIECE_MAX)
		return proto__fail(err, FRAME_E_RANGE, "text",
				   "'text' is longer than %u bytes",
				   PROTO_CLIENT_PIECE_MAX);
	memcpy(ev->text, t->via.str.ptr, t->via.str.size);
	ev->text[t->via.str.size] = 0;
	ev->text_len = t->via.str.size;
	return 0;
}

static int event_final(const msgpack_object *map, struct proto_client_event *ev,
		       struct frame_error *err)
{
	struct proto_client_final *f = &ev->fin;
	uint64_t u = 0;
	int r;

	r = proto__get_str(map, "finish_reason", true, f->finish_reason,
			   sizeof(f->finish_reason), err);
	if (!r)
		r = proto__get_u64(map, "prompt_tokens", true, 0, UINT32_MAX,
				   &u, err);
	f->prompt_tokens = (uint32_t)u;
	if (!r)
		r = proto__get_u64(map, "output_tokens", true, 0, UINT32_MAX,
				   &u, err);
	f->output_tokens = (uint32_t)u;
	if (!r)
		r = proto__get_u64(map, "ttft_us", false, 0, UINT64_MAX,
				   &f->ttft_us, err);
	if (!r)
		r = proto__get_u64(map, "total_us", false, 0, UINT64_MAX,
				   &f->total_us, err);
	if (!r) {
		const msgpack_object *t = frame_map_get(map, "text");

		if (t && (t->type != MSGPACK_OBJECT_STR ||
			  t->via.str.size > sizeof(f->text)))
			return proto__fail(err, FRAME_E_RANGE, "text",
					   "'text' of a final event holds at most %zu bytes",
					   sizeof(f->text));
		if (t) {
			memcpy(f->text, t->via.str.ptr, t->via.str.size);
			f->text_len = t->via.str.size;
		}
	}
	return r;
}

int proto__get_error(const msgpack_object *map, int *code, char *message,
		     size_t size, struct frame_error *err)
{
	char name[32];
	int r;

	r = proto__get_str(map, "code", true, name, sizeof(name), err);
	if (r)
		return r;
	*code = proto_err_parse(name);
	if (*code <= 0)
		return proto__fail(err, FRAME_E_RANGE, "code",
				   "unknown error code '%s'", name);
	message[0] = 0;
	return proto__get_str(map, "message", false, message, size, err);
}

static int event_error(const msgpack_object *map, struct proto_client_event *ev,
		       struct frame_error *err)
{
	return proto__get_error(map, &ev->code, ev->message,
				sizeof(ev->message), err);
}

int proto_client_event_parse(const msgpack_object *map,
			     struct proto_client_event *ev,
			     struct frame_error *err)
{
	int r;

	memset(ev, 0, sizeof(*ev));
	if (!map || map->type != MSGPACK_OBJECT_MAP)
		return proto__fail(err, FRAME_E_NOTMAP, "", "frame is not a map");
	if (proto__type_is(map, "frame_error")) {
		ev->type = PROTO_EV_FRAME_ERROR;
		return event_error(map, ev, err);
	}
	r = proto__get_u64(map, "id", true, 0, UINT64_MAX, &ev->id, err);
	if (r)
		return r;
	if (proto__type_is(map, "token")) {
		ev->type = PROTO_EV_TOKEN;
		return event_token(map, ev, err);
	}
	if (proto__type_is(map, "final")) {
		ev->type = PROTO_EV_FINAL;
		return event_final(map, ev, err);
	}
	if (proto__type_is(map, "error")) {
		ev->type = PROTO_EV_ERROR;
		return event_error(map, ev, err);
	}
	return proto__fail(err, FRAME_E_TYPE, "type", "unknown event type");
}
