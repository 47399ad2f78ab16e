/* proto_client.c - client API frames.
 *
 * Design. A request arrives from an untrusted client, so every field is
 * read through its message's field table (net/wire/proto_schema.h), typed and
 * range-checked, and the first problem becomes a FRAME_E_* code plus a
 * sentence the server sends back as INVALID_REQUEST. Nothing here trusts
 * a count: arrays are bounded before anything is allocated, strings are
 * bounded before they are copied. Events are read the same way; the
 * writers take their values as arguments and stay hand-written.
 *
 * Exactly one of `prompt` and `tokens` must be present; we never pick one
 * for the client (invariant 3: nothing is ever substituted for what the
 * client asked).
 *
 * Events are small and flat. Pieces of text are msgpack strings of at
 * most PROTO_CLIENT_PIECE_MAX bytes (the server cuts longer pieces).
 */
#include "net/wire/proto_client.h"
#include "net/wire/names.h"
#include "conf/util.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
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

int proto__read_err_code(const msgpack_object *o, const struct proto_field *f,
			 void *out, struct frame_error *err)
{
	char name[32];
	int code;
	int r;

	r = proto_schema_str(o, f->key, name, sizeof(name), err);
	if (r)
		return r;
	code = proto_err_parse(name);
	if (code <= 0)
		return proto_schema_fail(err, FRAME_E_RANGE, f->key,
					 "unknown error code '%s'", name);
	memcpy((char *)out + f->offset, &code, sizeof(code));
	return 0;
}

void proto__write_err_code(msgpack_packer *pk, const struct proto_field *f,
			   const void *in)
{
	int code;

	memcpy(&code, (const char *)in + f->offset, sizeof(code));
	frame_pack_kv_str(pk, f->key, proto_err_name(code));
}

/* ---- request ------------------------------------------------------------ */

void proto_client_request_deinit(struct proto_client_request *r)
{
	free(r->prompt);
	r->prompt = NULL;
	free(r->tokens);
	r->tokens = NULL;
	r->n_tokens = 0;
	free(r->bias);
	r->bias = NULL;
	r->n_bias = 0;
}

/* The prompt as text: a heap copy, bounded, without NUL. */
static int read_prompt(const msgpack_object *o, const struct proto_field *f,
		       void *out, struct frame_error *err)
{
	struct proto_client_request *r = out;

	if (o->type != MSGPACK_OBJECT_STR)
		return proto_schema_fail(err, FRAME_E_TYPE, f->key,
					 "'%s' must be a string", f->key);
	if (o->via.str.size > f->max)
		return proto_schema_fail(err, FRAME_E_RANGE, f->key,
					 "'%s' is longer than %llu bytes",
					 f->key, (unsigned long long)f->max);
	if (memchr(o->via.str.ptr, 0, o->via.str.size))
		return proto_schema_fail(err, FRAME_E_RANGE, f->key,
					 "'%s' holds a NUL byte", f->key);
	r->prompt = malloc(o->via.str.size + 1);
	if (!r->prompt)
		return -ENOMEM;
	memcpy(r->prompt, o->via.str.ptr, o->via.str.size);
	r->prompt[o->via.str.size] = 0;
	return 0;
}

/* ---- logit_bias and logprobs (HTTP's, net/wire/openai.h) ------------------- */

/* A msgpack number as a double; false when o is none. */
static bool num_of(const msgpack_object *o, double *v)
{
	switch (o->type) {
	case MSGPACK_OBJECT_POSITIVE_INTEGER: *v = (double)o->via.u64; return true;
	case MSGPACK_OBJECT_NEGATIVE_INTEGER: *v = (double)o->via.i64; return true;
	case MSGPACK_OBJECT_FLOAT32:
	case MSGPACK_OBJECT_FLOAT64: *v = o->via.f64; return true;
	default: return false;
	}
}

static int bias_cmp(const void *a, const void *b)
{
	const struct sampler_bias *x = a, *y = b;

	return x->id < y->id ? -1 : x->id > y->id;
}

/* b[0, n) sorted by id and kept in r (the old array freed); a token
 * named twice is FRAME_E_RANGE (b freed). */
static int bias_keep(struct proto_client_request *r, struct sampler_bias *b,
		     uint32_t n, struct frame_error *err)
{
	qsort(b, n, sizeof(*b), bias_cmp);
	for (uint32_t i = 1; i < n; i++) {
		if (b[i].id == b[i - 1].id) {
			uint32_t id = b[i].id;

			free(b);
			return proto_schema_fail(err, FRAME_E_RANGE, "logit_bias",
						 "'logit_bias' names token %u twice", id);
		}
	}
	free(r->bias);
	r->bias = b;
	r->n_bias = n;
	return 0;
}

/* logit_bias: a map of token ids (u32) to biases in [-100, 100]. */
static int read_logit_bias(const msgpack_object *o, const struct proto_field *f,
			   void *out, struct frame_error *err)
{
	const msgpack_object_map *m = &o->via.map;
	struct sampler_bias *b;
	double v;

	(void)f;
	if (o->type != MSGPACK_OBJECT_MAP || m->size > PROTO_CLIENT_BIAS_MAX)
		return proto_schema_fail(err, o->type != MSGPACK_OBJECT_MAP ? FRAME_E_TYPE : FRAME_E_RANGE,
					 "logit_bias", "'logit_bias' must be a map of at most %u token ids to biases",
					 PROTO_CLIENT_BIAS_MAX);
	if (!(b = calloc(m->size ? m->size : 1, sizeof(*b))))
		return -ENOMEM;
	for (uint32_t i = 0; i < m->size; i++) {
		const msgpack_object_kv *kv = &m->ptr[i];

		if (kv->key.type != MSGPACK_OBJECT_POSITIVE_INTEGER || kv->key.via.u64 > UINT32_MAX ||
		    !num_of(&kv->val, &v) || !(v >= -100.0 && v <= 100.0)) {
			free(b);
			return proto_schema_fail(err, FRAME_E_RANGE, "logit_bias",
						 "'logit_bias' maps token ids (u32) to numbers in [-100, 100]");
		}
		b[i] = (struct sampler_bias){ .id = (uint32_t)kv->key.via.u64, .bias = (float)v };
	}
	return bias_keep(out, b, m->size, err);
}

/* logprobs: the alternatives per token, 0..20 (given: on). */
static int read_logprobs(const msgpack_object *o, const struct proto_field *f,
			 void *out, struct frame_error *err)
{
	struct proto_client_request *r = out;

	(void)f;
	if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER ||
	    o->via.u64 > PROTO_CLIENT_TOP_LOGPROBS_MAX)
		return proto_schema_fail(err, FRAME_E_RANGE, "logprobs",
					 "'logprobs' must be an integer in 0..%u (the alternatives per token)",
					 PROTO_CLIENT_TOP_LOGPROBS_MAX);
	r->logprobs = true;
	r->top_logprobs = (uint32_t)o->via.u64;
	return 0;
}

/* The command line's forms: logit_bias "ID:BIAS,ID:BIAS", logprobs "N".
 * FRAME_E_UNKNOWN for another key. */
static int set_text_extra(struct proto_client_request *r, const char *key,
			  const char *text, struct frame_error *err)
{
	struct sampler_bias *b;
	uint32_t n = 0;
	const char *p = text;
	char *end;

	if (!strcmp(key, "logprobs")) {
		unsigned long v = strtoul(text, &end, 10);

		if (!*text || *end || text[0] == '-' || v > PROTO_CLIENT_TOP_LOGPROBS_MAX)
			return proto_schema_fail(err, FRAME_E_RANGE, "logprobs",
						 "'logprobs' must be an integer in 0..%u", PROTO_CLIENT_TOP_LOGPROBS_MAX);
		r->logprobs = true;
		r->top_logprobs = (uint32_t)v;
		return 0;
	}
	if (strcmp(key, "logit_bias"))
		return FRAME_E_UNKNOWN;
	if (!(b = calloc(PROTO_CLIENT_BIAS_MAX, sizeof(*b))))
		return -ENOMEM;
	while (*p) {
		unsigned long id = strtoul(p, &end, 10);
		const char *vs = end + 1;   /* the bias: at least one digit read */
		double v;

		if (n == PROTO_CLIENT_BIAS_MAX || end == p || *p == '-' || *end != ':' ||
		    id > UINT32_MAX || (v = strtod(vs, &end), end == vs) ||
		    !(v >= -100.0 && v <= 100.0) || (*end && *end != ',') ||
		    (*end == ',' && !end[1])) {   /* "5:1,": a pair cut off */
			free(b);
			return proto_schema_fail(err, FRAME_E_RANGE, "logit_bias",
						 "'logit_bias' must be ID:BIAS pairs (BIAS in [-100, 100]) separated by commas, at most %u",
						 PROTO_CLIENT_BIAS_MAX);
		}
		b[n++] = (struct sampler_bias){ .id = (uint32_t)id, .bias = (float)v };
		p = *end ? end + 1 : end;
	}
	return bias_keep(r, b, n, err);
}

#define REQ_U32(k, m, lo, hi) \
	PROTO_FIELD_U32(struct proto_client_request, k, false, m, lo, hi)
#define REQ_FLOAT(k, m, lo, hi, open) \
	PROTO_FIELD_FLOAT(struct proto_client_request, k, false, m, lo, hi, open)

/* Absent optional fields keep PROTO_CLIENT_REQUEST_NULL's values. */
static const struct proto_field request_fields[] = {
	PROTO_FIELD_U64(struct proto_client_request, "id", true, id,
			0, UINT64_MAX),
	REQ_U32("max_tokens", max_tokens, 1, PROTO_CLIENT_MAX_TOKENS),
	REQ_FLOAT("temperature", temperature, 0.0, 100.0, false),
	REQ_U32("top_k", top_k, 0, UINT32_MAX),
	REQ_FLOAT("top_p", top_p, 0.0, 1.0, true),
	PROTO_FIELD_U64(struct proto_client_request, "seed", false, seed,
			0, UINT64_MAX),
	PROTO_FIELD_STR(struct proto_client_request, "cache_salt", false,
			cache_salt),
	REQ_FLOAT("presence_penalty", presence_penalty, -2.0, 2.0, false),
	REQ_FLOAT("frequency_penalty", frequency_penalty, -2.0, 2.0, false),
	REQ_FLOAT("repetition_penalty", repetition_penalty, 0.0, 10.0, true),
	REQ_FLOAT("min_p", min_p, 0.0, 1.0, false),
	{ .key = "logit_bias", .type = PROTO_F_CUSTOM, .read = read_logit_bias },
	{ .key = "logprobs", .type = PROTO_F_CUSTOM, .read = read_logprobs },
};

/* Exactly one of these is there (checked first, so that a request with
 * both or neither says so whatever their values). */
static const struct proto_field request_text_fields[] = {
	{ .key = "prompt", .type = PROTO_F_CUSTOM, .read = read_prompt,
	  .max = PROTO_CLIENT_PROMPT_MAX },
	PROTO_FIELD_U32_ARRAY(struct proto_client_request, "tokens", false,
			      tokens, n_tokens, PROTO_CLIENT_TOKENS_MAX),
};

static bool has_value(const msgpack_object *map, const char *key)
{
	const msgpack_object *o = frame_map_get(map, key);

	return o && o->type != MSGPACK_OBJECT_NIL;
}

int proto_client_request_parse(const msgpack_object *map,
			       struct proto_client_request *r,
			       struct frame_error *err)
{
	struct proto_client_request x = PROTO_CLIENT_REQUEST_NULL;
	int ret;

	*r = x;
	if (!map || map->type != MSGPACK_OBJECT_MAP)
		return proto_schema_fail(err, FRAME_E_NOTMAP, "",
					 "frame is not a map");
	if (!proto_schema_type_is(map, "request"))
		return proto_schema_fail(err, FRAME_E_TYPE, "type",
					 "'type' must be \"request\"");
	ret = proto_schema_read(map, PROTO_FIELDS(request_fields), &x, err);
	if (!ret && has_value(map, "prompt") == has_value(map, "tokens"))
		ret = proto_schema_fail(err, FRAME_E_MISSING, "prompt",
					"exactly one of 'prompt' and 'tokens' is required");
	if (ret) {
		proto_client_request_deinit(&x);   /* logit_bias may be read */
		return ret;
	}
	ret = proto_schema_read(map, PROTO_FIELDS(request_text_fields), &x,
				err);
	if (ret) {
		proto_client_request_deinit(&x);
		return ret;
	}
	*r = x;
	return 0;
}

int proto_client_request_set(struct proto_client_request *r, const char *name,
			     const char *text, struct frame_error *err)
{
	char key[32];
	size_t i;
	int ret;

	for (i = 0; name[i] && i + 1 < sizeof(key); i++)
		key[i] = name[i] == '-' ? '_' : name[i];
	key[i] = '\0';
	ret = set_text_extra(r, key, text, err);
	if (ret == FRAME_E_UNKNOWN)
		ret = proto_schema_read_text(PROTO_FIELDS(request_fields), key, text,
					     r, err);
	if (ret == FRAME_E_UNKNOWN)
		ret = proto_schema_read_text(PROTO_FIELDS(request_text_fields),
					     key, text, r, err);
	return ret;
}

struct sampler_params proto_client_request_sampling(const struct proto_client_request *r)
{
	return (struct sampler_params){
		.temperature = r->temperature, .top_k = r->top_k, .top_p = r->top_p,
		.seed = r->seed, .presence_penalty = r->presence_penalty,
		.frequency_penalty = r->frequency_penalty,
		.repetition_penalty = r->repetition_penalty, .min_p = r->min_p,
		.logit_bias = r->bias, .n_logit_bias = r->n_bias,
		.logprobs = r->logprobs, .top_logprobs = (uint8_t)r->top_logprobs };
}

bool proto_client_bias_outside(const struct proto_client_request *r, uint32_t n_vocab,
			       char *msg, size_t size)
{
	if (!r->n_bias || r->bias[r->n_bias - 1].id < n_vocab)
		return false;
	snprintf(msg, size, "'logit_bias' names token %u; the vocabulary has %u tokens",
		 r->bias[r->n_bias - 1].id, n_vocab);
	return true;
}

void proto_client_logprobs_json(FILE *out, const struct sampler_logprobs *lp, size_t n)
{
	if (!n)
		return;
	fputs(",\"logprobs\":[", out);
	for (size_t i = 0; i < n; i++)
		fprintf(out, "%s%.6g", i ? "," : "", (double)lp[i].logprob);
	fputs("],\"top_logprobs\":[", out);
	for (size_t i = 0; i < n; i++) {
		fputs(i ? ",[" : "[", out);
		for (uint32_t k = 0; k < lp[i].n_top; k++)
			fprintf(out, "%s[%d,%.6g]", k ? "," : "", lp[i].top[k].id,
				(double)lp[i].top[k].logprob);
		fputc(']', out);
	}
	fputc(']', out);
}

void proto_client_request_pack(msgpack_packer *pk,
			       const struct proto_client_request *r)
{
	/* the processing fields only when set (0 is their default) */
	const struct { const char *k; float v; } proc[] = {
		{ "presence_penalty", r->presence_penalty },
		{ "frequency_penalty", r->frequency_penalty },
		{ "repetition_penalty", r->repetition_penalty },
		{ "min_p", r->min_p },
	};
	uint32_t n = 8 + !!r->cache_salt[0] + !!r->n_bias + r->logprobs;

	for (size_t i = 0; i < sizeof(proc) / sizeof(proc[0]); i++)
		n += proc[i].v != 0.0f;
	msgpack_pack_map(pk, n);
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
	if (r->cache_salt[0])
		frame_pack_kv_str(pk, "cache_salt", r->cache_salt);
	for (size_t i = 0; i < sizeof(proc) / sizeof(proc[0]); i++)
		if (proc[i].v != 0.0f)
			frame_pack_kv_double(pk, proc[i].k, proc[i].v);
	if (r->n_bias) {
		frame_pack_str(pk, "logit_bias");
		msgpack_pack_map(pk, r->n_bias);
		for (uint32_t i = 0; i < r->n_bias; i++) {
			msgpack_pack_uint32(pk, r->bias[i].id);
			msgpack_pack_double(pk, r->bias[i].bias);
		}
	}
	if (r->logprobs)
		frame_pack_kv_u64(pk, "logprobs", r->top_logprobs);
}

/* ---- events ------------------------------------------------------------- */

void proto_client_pack_token(msgpack_packer *pk, uint64_t id, uint32_t index,
			     uint32_t token, const char *piece, uint32_t len,
			     const struct sampler_logprobs *lp)
{
	if (len > PROTO_CLIENT_PIECE_MAX)
		len = PROTO_CLIENT_PIECE_MAX;
	msgpack_pack_map(pk, lp ? 7 : 5);
	frame_pack_kv_str(pk, "type", "token");
	frame_pack_kv_u64(pk, "id", id);
	frame_pack_kv_u64(pk, "index", index);
	frame_pack_kv_u64(pk, "token", token);
	frame_pack_str(pk, "text");
	msgpack_pack_str(pk, len);
	msgpack_pack_str_body(pk, piece, len);
	if (!lp)
		return;
	frame_pack_kv_double(pk, "logprob", lp->logprob);
	frame_pack_str(pk, "top");
	msgpack_pack_array(pk, KVD_MIN(lp->n_top, PROTO_CLIENT_TOP_LOGPROBS_MAX));
	for (uint32_t i = 0; i < lp->n_top && i < PROTO_CLIENT_TOP_LOGPROBS_MAX; i++) {
		msgpack_pack_array(pk, 2);
		msgpack_pack_uint32(pk, (uint32_t)lp->top[i].id);
		msgpack_pack_double(pk, lp->top[i].logprob);
	}
}

void proto_client_pack_final(msgpack_packer *pk, uint64_t id,
			     const struct proto_client_final *f)
{
	msgpack_pack_map(pk, 9);
	frame_pack_kv_str(pk, "type", "final");
	frame_pack_kv_u64(pk, "id", id);
	frame_pack_kv_str(pk, "finish_reason", f->finish_reason);
	frame_pack_kv_u64(pk, "prompt_tokens", f->prompt_tokens);
	frame_pack_kv_u64(pk, "cached_tokens", f->cached_tokens);
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

int proto_client_auth_parse(const msgpack_object *map, char *key,
			    struct frame_error *err)
{
	const msgpack_object *t = frame_map_get(map, "type");
	const msgpack_object *k = frame_map_get(map, "key");

	if (!t || !frame_obj_streq(t, "auth")) {
		snprintf(err->msg, sizeof(err->msg), "authenticate first: the first frame is {type:\"auth\", key}");
		return 1;
	}
	if (!k || frame_obj_str(k, key, PROTO_CLIENT_KEY_MAX + 1)) {
		snprintf(err->msg, sizeof(err->msg), "auth: key must be a string of at most %u bytes",
			 PROTO_CLIENT_KEY_MAX);
		return 1;
	}
	return 0;
}

void proto_client_pack_auth(msgpack_packer *pk, const char *key)
{
	msgpack_pack_map(pk, 2);
	frame_pack_kv_str(pk, "type", "auth");
	frame_pack_kv_str(pk, "key", key);
}

int proto_client_frame_auth_ok(const char *tenant, char **data, size_t *len)
{
	struct frame_writer w;
	msgpack_packer *pk;
	int r;

	frame_writer_init(&w);
	pk = frame_writer_packer(&w);
	msgpack_pack_map(pk, 2);
	frame_pack_kv_str(pk, "type", "auth_ok");
	frame_pack_kv_str(pk, "tenant", tenant);
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

/* A token's piece: a string (or bin) of at most f->max bytes, NUL
 * bytes allowed (text_len says how many); nil is not absence here. */
static int read_piece(const msgpack_object *o, const struct proto_field *f,
		      void *out, struct frame_error *err)
{
	struct proto_client_event *ev = out;

	if (o->type != MSGPACK_OBJECT_STR && o->type != MSGPACK_OBJECT_BIN)
		return proto_schema_fail(err, FRAME_E_TYPE, f->key,
					 "'%s' must be a string", f->key);
	if (o->via.str.size > f->max)
		return proto_schema_fail(err, FRAME_E_RANGE, f->key,
					 "'%s' is longer than %llu bytes", f->key,
					 (unsigned long long)f->max);
	memcpy(ev->text, o->via.str.ptr, o->via.str.size);
	ev->text[o->via.str.size] = 0;
	ev->text_len = o->via.str.size;
	return 0;
}

/* The flushed tail of a final event: a string of at most sizeof(text)
 * bytes; anything else there, nil included, is out of range. */
static int read_tail(const msgpack_object *o, const struct proto_field *f,
		     void *out, struct frame_error *err)
{
	struct proto_client_final *fin = &((struct proto_client_event *)out)->fin;

	if (o->type != MSGPACK_OBJECT_STR || o->via.str.size > sizeof(fin->text))
		return proto_schema_fail(err, FRAME_E_RANGE, f->key,
					 "'%s' of a final event holds at most %zu bytes",
					 f->key, sizeof(fin->text));
	memcpy(fin->text, o->via.str.ptr, o->via.str.size);
	fin->text_len = o->via.str.size;
	return 0;
}

#define EV_U32(k, m) \
	PROTO_FIELD_U32(struct proto_client_event, k, true, m, 0, UINT32_MAX)
#define EV_U64(k, m) \
	PROTO_FIELD_U64(struct proto_client_event, k, false, m, 0, UINT64_MAX)

static const struct proto_field event_id_fields[] = {
	PROTO_FIELD_U64(struct proto_client_event, "id", true, id,
			0, UINT64_MAX),
};

/* A token's logprob (given: the request asked) and its alternatives. */
static int read_ev_logprob(const msgpack_object *o, const struct proto_field *f,
			   void *out, struct frame_error *err)
{
	struct proto_client_event *ev = out;
	double v;

	(void)f;
	if (!num_of(o, &v))
		return proto_schema_fail(err, FRAME_E_TYPE, "logprob", "'logprob' must be a number");
	ev->has_lp = true;
	ev->lp.logprob = (float)v;
	return 0;
}

static int read_ev_top(const msgpack_object *o, const struct proto_field *f,
		       void *out, struct frame_error *err)
{
	struct proto_client_event *ev = out;
	const msgpack_object_array *a = &o->via.array;
	double v;

	(void)f;
	if (o->type != MSGPACK_OBJECT_ARRAY || a->size > PROTO_CLIENT_TOP_LOGPROBS_MAX)
		return proto_schema_fail(err, FRAME_E_RANGE, "top", "'top' must be at most %u [id, logprob] pairs",
					 PROTO_CLIENT_TOP_LOGPROBS_MAX);
	for (uint32_t i = 0; i < a->size; i++) {
		const msgpack_object *p = &a->ptr[i];

		if (p->type != MSGPACK_OBJECT_ARRAY || p->via.array.size != 2 ||
		    p->via.array.ptr[0].type != MSGPACK_OBJECT_POSITIVE_INTEGER ||
		    p->via.array.ptr[0].via.u64 > INT32_MAX || !num_of(&p->via.array.ptr[1], &v))
			return proto_schema_fail(err, FRAME_E_TYPE, "top", "'top' must hold [id, logprob] pairs");
		ev->lp.top[i].id = (int32_t)p->via.array.ptr[0].via.u64;
		ev->lp.top[i].logprob = (float)v;
	}
	ev->lp.n_top = a->size;
	return 0;
}

static const struct proto_field token_fields[] = {
	EV_U32("index", index),
	EV_U32("token", token),
	{ .key = "logprob", .type = PROTO_F_CUSTOM, .read = read_ev_logprob },
	{ .key = "top", .type = PROTO_F_CUSTOM, .read = read_ev_top },
	{ .key = "text", .type = PROTO_F_CUSTOM, .required = true,
	  .keep_nil = true, .read = read_piece,
	  .max = PROTO_CLIENT_PIECE_MAX },
};

static const struct proto_field final_fields[] = {
	PROTO_FIELD_STR(struct proto_client_event, "finish_reason", true,
			fin.finish_reason),
	EV_U32("prompt_tokens", fin.prompt_tokens),
	PROTO_FIELD_U32(struct proto_client_event, "cached_tokens", false,
			fin.cached_tokens, 0, UINT32_MAX),
	EV_U32("output_tokens", fin.output_tokens),
	EV_U64("ttft_us", fin.ttft_us),
	EV_U64("total_us", fin.total_us),
	{ .key = "text", .type = PROTO_F_CUSTOM, .keep_nil = true,
	  .read = read_tail },
};

static const struct proto_field error_fields[] = {
	PROTO_FIELD_CUSTOM(struct proto_client_event, "code", true, code,
			   proto__read_err_code, proto__write_err_code),
	PROTO_FIELD_STR(struct proto_client_event, "message", false, message),
};


static const struct {
	const char *name;
	enum proto_client_event_type type;
	bool has_id;
	const struct proto_field *fields;
	size_t n_fields;
} events[] = {
	{ "frame_error", PROTO_EV_FRAME_ERROR, false,
	  PROTO_FIELDS(error_fields) },
	{ "token", PROTO_EV_TOKEN, true, PROTO_FIELDS(token_fields) },
	{ "final", PROTO_EV_FINAL, true, PROTO_FIELDS(final_fields) },
	{ "error", PROTO_EV_ERROR, true, PROTO_FIELDS(error_fields) },
};

/* Every event but a frame_error names its request, and the id is read
 * before the type is judged: an event of an unknown type without an id
 * is refused for the missing id, as it always was. */
int proto_client_event_parse(const msgpack_object *map,
			     struct proto_client_event *ev,
			     struct frame_error *err)
{
	size_t i;
	int r;

	memset(ev, 0, sizeof(*ev));
	if (!map || map->type != MSGPACK_OBJECT_MAP)
		return proto_schema_fail(err, FRAME_E_NOTMAP, "",
					 "frame is not a map");
	for (i = 0; i < KVD_ARRAY_SIZE(events); i++)
		if (proto_schema_type_is(map, events[i].name))
			break;
	if (i == KVD_ARRAY_SIZE(events) || events[i].has_id) {
		r = proto_schema_read(map, PROTO_FIELDS(event_id_fields), ev,
				      err);
		if (r)
			return r;
	}
	if (i == KVD_ARRAY_SIZE(events))
		return proto_schema_fail(err, FRAME_E_TYPE, "type",
					 "unknown event type");
	ev->type = events[i].type;
	return proto_schema_read(map, events[i].fields, events[i].n_fields,
				 ev, err);
}
