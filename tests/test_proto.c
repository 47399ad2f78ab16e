/* test_proto.c - client API and peer control frames: round trips, every
 * typed rejection, and decoders fed random, truncated and corrupted bytes
 * (they must return an error or a value, never crash or leak).
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "conf/util.h"
#include "net/wire/frame.h"
#include "net/wire/proto_client.h"
#include "net/wire/proto_peer.h"

/* Decode a whole frame buffer to its map (msg must be destroyed). */
static const msgpack_object *decode(const char *buf, size_t len,
				    msgpack_unpacked *msg)
{
	const msgpack_object *o = NULL;

	msgpack_unpacked_init(msg);
	ck_assert_int_eq(frame_decode((const uint8_t *)buf, len, PROTO_PEER_FRAME_MAX,
				      msg, &o), 0);
	return o;
}

static char *pack_request(const struct proto_client_request *r, size_t *len)
{
	struct frame_writer w;
	char *data;

	frame_writer_init(&w);
	proto_client_request_pack(frame_writer_packer(&w), r);
	ck_assert_int_eq(frame_writer_finish(&w, PROTO_CLIENT_FRAME_MAX, &data, len), 0);
	frame_writer_deinit(&w);
	return data;
}

START_TEST(test_request_roundtrip)
{
	struct proto_client_request r = PROTO_CLIENT_REQUEST_NULL, q;
	uint32_t toks[] = { 1, 5, 99 };
	struct frame_error err;
	msgpack_unpacked msg;
	size_t len;
	char *buf;

	r.id = 42;
	r.prompt = (char *)"Once upon a time";
	r.max_tokens = 17;
	r.temperature = 0.5f;
	r.top_k = 40;
	r.top_p = 0.9f;
	r.seed = 12345678901ull;
	buf = pack_request(&r, &len);
	ck_assert_int_eq(proto_client_request_parse(decode(buf, len, &msg), &q, &err), 0);
	ck_assert_uint_eq(q.id, 42);
	ck_assert_str_eq(q.prompt, "Once upon a time");
	ck_assert_ptr_null(q.tokens);
	ck_assert_uint_eq(q.max_tokens, 17);
	ck_assert_float_eq_tol(q.temperature, 0.5f, 1e-6);
	ck_assert_uint_eq(q.top_k, 40);
	ck_assert_float_eq_tol(q.top_p, 0.9f, 1e-6);
	ck_assert_uint_eq(q.seed, 12345678901ull);
	proto_client_request_deinit(&q);
	proto_client_request_deinit(&q);
	msgpack_unpacked_destroy(&msg);
	free(buf);

	r.prompt = NULL;
	r.tokens = toks;
	r.n_tokens = 3;
	snprintf(r.cache_salt, sizeof(r.cache_salt), "salt-1");
	buf = pack_request(&r, &len);
	ck_assert_int_eq(proto_client_request_parse(decode(buf, len, &msg), &q, &err), 0);
	ck_assert_ptr_null(q.prompt);
	ck_assert_uint_eq(q.n_tokens, 3);
	ck_assert_uint_eq(q.tokens[2], 99);
	ck_assert_str_eq(q.cache_salt, "salt-1");
	/* absent processing fields: off */
	ck_assert(q.presence_penalty == 0.0f && q.frequency_penalty == 0.0f &&
		  q.repetition_penalty == 0.0f && q.min_p == 0.0f);
	proto_client_request_deinit(&q);
	msgpack_unpacked_destroy(&msg);
	free(buf);

	/* the processing fields travel (issue 24.1) */
	r.presence_penalty = -1.5f;
	r.frequency_penalty = 2.0f;
	r.repetition_penalty = 1.25f;
	r.min_p = 0.1f;
	buf = pack_request(&r, &len);
	ck_assert_int_eq(proto_client_request_parse(decode(buf, len, &msg), &q, &err), 0);
	ck_assert_float_eq_tol(q.presence_penalty, -1.5f, 1e-6);
	ck_assert_float_eq_tol(q.frequency_penalty, 2.0f, 1e-6);
	ck_assert_float_eq_tol(q.repetition_penalty, 1.25f, 1e-6);
	ck_assert_float_eq_tol(q.min_p, 0.1f, 1e-6);
	proto_client_request_deinit(&q);
	msgpack_unpacked_destroy(&msg);
	free(buf);
	/* and are read with their bounds (kvctl generate's options too) */
	{
		static const char *const badv[][2] = {
			{ "presence-penalty", "2.5" }, { "frequency_penalty", "-3" },
			{ "repetition-penalty", "0" }, { "repetition_penalty", "11" },
			{ "min-p", "1.1" }, { "min-p", "-0.1" }, { "min-p", "-0" },
			{ "presence-penalty", "-" }, { "presence-penalty", "--1" },
			{ "presence-penalty", "-x" }, { "presence-penalty", "- 1" },
			{ "presence-penalty", "+1" }, { "temperature", "-1" },
		};

		for (size_t i = 0; i < sizeof(badv) / sizeof(badv[0]); i++)
			ck_assert_int_eq(proto_client_request_set(&r, badv[i][0], badv[i][1], &err),
					 FRAME_E_RANGE);
		ck_assert_int_eq(proto_client_request_set(&r, "min-p", "0.5", &err), 0);
		ck_assert_float_eq_tol(r.min_p, 0.5f, 1e-6);
		/* a field whose range goes below zero takes a sign from text */
		ck_assert_int_eq(proto_client_request_set(&r, "presence-penalty", "-1.5", &err), 0);
		ck_assert_float_eq_tol(r.presence_penalty, -1.5f, 1e-6);
		ck_assert_int_eq(proto_client_request_set(&r, "frequency_penalty", "-2", &err), 0);
		ck_assert_float_eq_tol(r.frequency_penalty, -2.0f, 1e-6);
		r.presence_penalty = r.frequency_penalty = 0;
	}
	/* logit_bias and logprobs travel, HTTP's bounds (kvctl's forms too) */
	{
		static const char *const badb[] = {
			"5:101", "5:-100.5", "x:1", "-1:2", "5", "5:1,5:2", "5:1;6:2", "4294967296:1",
			"5:", "5:,6:1", "5: ", "5:1,", "5:1,,6:2", ",5:1",
		};

		ck_assert_int_eq(proto_client_request_set(&r, "logit-bias", "7:-100,3:2.5", &err), 0);
		ck_assert_int_eq(proto_client_request_set(&r, "logprobs", "4", &err), 0);
		buf = pack_request(&r, &len);
		ck_assert_int_eq(proto_client_request_parse(decode(buf, len, &msg), &q, &err), 0);
		ck_assert_uint_eq(q.n_bias, 2);
		ck_assert_uint_eq(q.bias[0].id, 3);   /* sorted */
		ck_assert_float_eq_tol(q.bias[0].bias, 2.5f, 1e-6);
		ck_assert_uint_eq(q.bias[1].id, 7);
		ck_assert_float_eq_tol(q.bias[1].bias, -100.0f, 1e-6);
		ck_assert(q.logprobs);
		ck_assert_uint_eq(q.top_logprobs, 4);
		proto_client_request_deinit(&q);
		msgpack_unpacked_destroy(&msg);
		free(buf);
		for (size_t i = 0; i < sizeof(badb) / sizeof(badb[0]); i++)
			ck_assert_msg(proto_client_request_set(&r, "logit_bias", badb[i], &err) == FRAME_E_RANGE,
				      "logit_bias '%s' taken", badb[i]);
		ck_assert_int_eq(proto_client_request_set(&r, "logprobs", "21", &err), FRAME_E_RANGE);
		ck_assert_int_eq(proto_client_request_set(&r, "logprobs", "-1", &err), FRAME_E_RANGE);
		free(r.bias);   /* the array kvctl's form made */
	}
}
END_TEST

/* Build a request map from a tiny spec: keys to drop or replace. */
static int parse_custom(void (*fill)(msgpack_packer *pk), struct frame_error *err)
{
	struct proto_client_request q;
	struct frame_writer w;
	msgpack_unpacked msg;
	size_t len;
	char *buf;
	int r;

	frame_writer_init(&w);
	fill(frame_writer_packer(&w));
	ck_assert_int_eq(frame_writer_finish(&w, PROTO_CLIENT_FRAME_MAX, &buf, &len), 0);
	frame_writer_deinit(&w);
	r = proto_client_request_parse(decode(buf, len, &msg), &q, err);
	if (r == 0)
		proto_client_request_deinit(&q);
	msgpack_unpacked_destroy(&msg);
	free(buf);
	return r;
}

static void fill_both(msgpack_packer *pk)
{
	msgpack_pack_map(pk, 4);
	frame_pack_kv_str(pk, "type", "request");
	frame_pack_kv_u64(pk, "id", 1);
	frame_pack_kv_str(pk, "prompt", "x");
	frame_pack_str(pk, "tokens");
	msgpack_pack_array(pk, 1);
	msgpack_pack_uint32(pk, 1);
}

static void fill_neither(msgpack_packer *pk)
{
	msgpack_pack_map(pk, 2);
	frame_pack_kv_str(pk, "type", "request");
	frame_pack_kv_u64(pk, "id", 1);
}

static void fill_no_id(msgpack_packer *pk)
{
	msgpack_pack_map(pk, 2);
	frame_pack_kv_str(pk, "type", "request");
	frame_pack_kv_str(pk, "prompt", "x");
}

static void fill_zero_max(msgpack_packer *pk)
{
	msgpack_pack_map(pk, 4);
	frame_pack_kv_str(pk, "type", "request");
	frame_pack_kv_u64(pk, "id", 1);
	frame_pack_kv_str(pk, "prompt", "x");
	frame_pack_kv_u64(pk, "max_tokens", 0);
}

static void fill_neg_temp(msgpack_packer *pk)
{
	msgpack_pack_map(pk, 4);
	frame_pack_kv_str(pk, "type", "request");
	frame_pack_kv_u64(pk, "id", 1);
	frame_pack_kv_str(pk, "prompt", "x");
	frame_pack_kv_double(pk, "temperature", -1.0);
}

static void fill_top_p_zero(msgpack_packer *pk)
{
	msgpack_pack_map(pk, 4);
	frame_pack_kv_str(pk, "type", "request");
	frame_pack_kv_u64(pk, "id", 1);
	frame_pack_kv_str(pk, "prompt", "x");
	frame_pack_kv_double(pk, "top_p", 0.0);
}

/* positive as a double, 0.0f once narrowed: must be refused too */
static void fill_top_p_tiny(msgpack_packer *pk)
{
	msgpack_pack_map(pk, 4);
	frame_pack_kv_str(pk, "type", "request");
	frame_pack_kv_u64(pk, "id", 1);
	frame_pack_kv_str(pk, "prompt", "x");
	frame_pack_kv_double(pk, "top_p", 1e-300);
}

static void fill_prompt_int(msgpack_packer *pk)
{
	msgpack_pack_map(pk, 3);
	frame_pack_kv_str(pk, "type", "request");
	frame_pack_kv_u64(pk, "id", 1);
	frame_pack_kv_u64(pk, "prompt", 7);
}

static void fill_prompt_nul(msgpack_packer *pk)
{
	msgpack_pack_map(pk, 3);
	frame_pack_kv_str(pk, "type", "request");
	frame_pack_kv_u64(pk, "id", 1);
	frame_pack_str(pk, "prompt");
	msgpack_pack_str(pk, 3);
	msgpack_pack_str_body(pk, "a\0b", 3);
}

static void fill_bad_token(msgpack_packer *pk)
{
	msgpack_pack_map(pk, 3);
	frame_pack_kv_str(pk, "type", "request");
	frame_pack_kv_u64(pk, "id", 1);
	frame_pack_str(pk, "tokens");
	msgpack_pack_array(pk, 2);
	msgpack_pack_uint32(pk, 1);
	msgpack_pack_str(pk, 1);
	msgpack_pack_str_body(pk, "z", 1);
}

static void fill_empty_tokens(msgpack_packer *pk)
{
	msgpack_pack_map(pk, 3);
	frame_pack_kv_str(pk, "type", "request");
	frame_pack_kv_u64(pk, "id", 1);
	frame_pack_str(pk, "tokens");
	msgpack_pack_array(pk, 0);
}

static void fill_wrong_type(msgpack_packer *pk)
{
	msgpack_pack_map(pk, 3);
	frame_pack_kv_str(pk, "type", "hello");
	frame_pack_kv_u64(pk, "id", 1);
	frame_pack_kv_str(pk, "prompt", "x");
}

/* a request with logit_bias of n entries from id 0 (value v; dup: one id twice) */
static void fill_bias(msgpack_packer *pk, uint32_t n, double v, bool dup, bool both)
{
	msgpack_pack_map(pk, 4 + both);
	frame_pack_kv_str(pk, "type", "request");
	frame_pack_kv_u64(pk, "id", 1);
	frame_pack_kv_str(pk, "prompt", "x");
	if (both) {
		frame_pack_str(pk, "tokens");
		msgpack_pack_array(pk, 1);
		msgpack_pack_uint32(pk, 1);
	}
	frame_pack_str(pk, "logit_bias");
	msgpack_pack_map(pk, n);
	for (uint32_t i = 0; i < n; i++) {
		msgpack_pack_uint32(pk, dup && i ? 0 : i);
		msgpack_pack_double(pk, v);
	}
}
static void fill_bias_many(msgpack_packer *pk) { fill_bias(pk, PROTO_CLIENT_BIAS_MAX + 1, 1, false, false); }
static void fill_bias_max(msgpack_packer *pk) { fill_bias(pk, PROTO_CLIENT_BIAS_MAX, 1, false, false); }
static void fill_bias_big(msgpack_packer *pk) { fill_bias(pk, 2, 100.5, false, false); }
static void fill_bias_dup(msgpack_packer *pk) { fill_bias(pk, 2, 1, true, false); }
static void fill_bias_both(msgpack_packer *pk) { fill_bias(pk, 3, 1, false, true); }
static void fill_bias_key(msgpack_packer *pk)
{
	msgpack_pack_map(pk, 4);
	frame_pack_kv_str(pk, "type", "request");
	frame_pack_kv_u64(pk, "id", 1);
	frame_pack_kv_str(pk, "prompt", "x");
	frame_pack_str(pk, "logit_bias");
	msgpack_pack_map(pk, 1);
	frame_pack_str(pk, "5");   /* ids are integers here */
	msgpack_pack_double(pk, 1);
}
static void fill_logprobs_21(msgpack_packer *pk)
{
	msgpack_pack_map(pk, 4);
	frame_pack_kv_str(pk, "type", "request");
	frame_pack_kv_u64(pk, "id", 1);
	frame_pack_kv_str(pk, "prompt", "x");
	frame_pack_kv_u64(pk, "logprobs", 21);
}

START_TEST(test_request_rejects)
{
	struct frame_error err;

	ck_assert_int_eq(parse_custom(fill_bias_many, &err), FRAME_E_RANGE);
	ck_assert_str_eq(err.key, "logit_bias");
	ck_assert_int_eq(parse_custom(fill_bias_max, &err), 0);
	ck_assert_int_eq(parse_custom(fill_bias_big, &err), FRAME_E_RANGE);
	ck_assert_int_eq(parse_custom(fill_bias_dup, &err), FRAME_E_RANGE);
	ck_assert_msg(strstr(err.msg, "twice"), "%s", err.msg);
	ck_assert_int_eq(parse_custom(fill_bias_key, &err), FRAME_E_RANGE);
	ck_assert_int_eq(parse_custom(fill_bias_both, &err), FRAME_E_MISSING);   /* no leak */
	ck_assert_int_eq(parse_custom(fill_logprobs_21, &err), FRAME_E_RANGE);
	ck_assert_str_eq(err.key, "logprobs");

	ck_assert_int_eq(parse_custom(fill_both, &err), FRAME_E_MISSING);
	ck_assert_int_eq(parse_custom(fill_neither, &err), FRAME_E_MISSING);
	ck_assert_int_eq(parse_custom(fill_no_id, &err), FRAME_E_MISSING);
	ck_assert_str_eq(err.key, "id");
	ck_assert_int_eq(parse_custom(fill_zero_max, &err), FRAME_E_RANGE);
	ck_assert_str_eq(err.key, "max_tokens");
	ck_assert_int_eq(parse_custom(fill_neg_temp, &err), FRAME_E_RANGE);
	ck_assert_int_eq(parse_custom(fill_top_p_zero, &err), FRAME_E_RANGE);
	ck_assert_int_eq(parse_custom(fill_top_p_tiny, &err), FRAME_E_RANGE);
	ck_assert_int_eq(parse_custom(fill_prompt_int, &err), FRAME_E_TYPE);
	ck_assert_int_eq(parse_custom(fill_prompt_nul, &err), FRAME_E_RANGE);
	ck_assert_int_eq(parse_custom(fill_bad_token, &err), FRAME_E_RANGE);
	ck_assert_int_eq(parse_custom(fill_empty_tokens, &err), FRAME_E_RANGE);
	ck_assert_int_eq(parse_custom(fill_wrong_type, &err), FRAME_E_TYPE);
	ck_assert(strlen(err.msg) > 0);
}
END_TEST

START_TEST(test_events_roundtrip)
{
	struct proto_client_final f = { .finish_reason = "length",
					.prompt_tokens = 9, .output_tokens = 3,
					.cached_tokens = 32,
					.ttft_us = 1234, .total_us = 5678 };
	struct proto_client_event ev;
	struct frame_error err;
	struct frame_writer w;
	msgpack_unpacked msg;
	size_t len;
	char *buf;

	frame_writer_init(&w);
	proto_client_pack_token(frame_writer_packer(&w), 7, 2, 300, "h\xc3\xa9", 3, NULL);
	ck_assert_int_eq(frame_writer_finish(&w, PROTO_CLIENT_FRAME_MAX, &buf, &len), 0);
	ck_assert_int_eq(proto_client_event_parse(decode(buf, len, &msg), &ev, &err), 0);
	ck_assert_int_eq(ev.type, PROTO_EV_TOKEN);
	ck_assert_uint_eq(ev.id, 7);
	ck_assert_uint_eq(ev.index, 2);
	ck_assert_uint_eq(ev.token, 300);
	ck_assert_uint_eq(ev.text_len, 3);
	ck_assert_str_eq(ev.text, "h\xc3\xa9");
	ck_assert(!ev.has_lp);
	msgpack_unpacked_destroy(&msg);
	free(buf);
	/* with logprobs (the request asked): the chosen one's and the top */
	{
		struct sampler_logprobs lp = { .logprob = -0.25f, .n_top = 2,
					       .top = { { 300, -0.25f }, { 12, -1.5f } } };

		proto_client_pack_token(frame_writer_packer(&w), 7, 3, 300, "x", 1, &lp);
		ck_assert_int_eq(frame_writer_finish(&w, PROTO_CLIENT_FRAME_MAX, &buf, &len), 0);
		ck_assert_int_eq(proto_client_event_parse(decode(buf, len, &msg), &ev, &err), 0);
		ck_assert(ev.has_lp);
		ck_assert_float_eq_tol(ev.lp.logprob, -0.25f, 1e-6);
		ck_assert_uint_eq(ev.lp.n_top, 2);
		ck_assert_int_eq(ev.lp.top[1].id, 12);
		ck_assert_float_eq_tol(ev.lp.top[1].logprob, -1.5f, 1e-6);
		msgpack_unpacked_destroy(&msg);
		free(buf);
	}

	proto_client_pack_final(frame_writer_packer(&w), 7, &f);
	ck_assert_int_eq(frame_writer_finish(&w, PROTO_CLIENT_FRAME_MAX, &buf, &len), 0);
	ck_assert_int_eq(proto_client_event_parse(decode(buf, len, &msg), &ev, &err), 0);
	ck_assert_int_eq(ev.type, PROTO_EV_FINAL);
	ck_assert_str_eq(ev.fin.finish_reason, "length");
	ck_assert_uint_eq(ev.fin.output_tokens, 3);
	ck_assert_uint_eq(ev.fin.cached_tokens, 32);
	ck_assert_uint_eq(ev.fin.ttft_us, 1234);
	msgpack_unpacked_destroy(&msg);
	free(buf);
	frame_writer_deinit(&w);

	for (int code = 1; code < PROTO_ERR__N; code++) {
		ck_assert_int_eq(proto_client_frame_error(9, code, "why", &buf, &len), 0);
		ck_assert_int_eq(proto_client_event_parse(decode(buf, len, &msg), &ev, &err), 0);
		ck_assert_int_eq(ev.type, PROTO_EV_ERROR);
		ck_assert_int_eq(ev.code, code);
		ck_assert_str_eq(ev.message, "why");
		ck_assert_int_eq(proto_err_parse(proto_err_name(code)), code);
		msgpack_unpacked_destroy(&msg);
		free(buf);
	}
	/* a frame_error carries no id: it cannot be read as request 0's */
	ck_assert_int_eq(proto_client_frame_conn_error(PROTO_ERR_OVERLOADED, "full",
						       &buf, &len), 0);
	{
		const msgpack_object *m = decode(buf, len, &msg);

		ck_assert_ptr_null(frame_map_get(m, "id"));
		ck_assert_int_eq(proto_client_event_parse(m, &ev, &err), 0);
		ck_assert_int_eq(ev.type, PROTO_EV_FRAME_ERROR);
		ck_assert_int_eq(ev.code, PROTO_ERR_OVERLOADED);
		ck_assert_str_eq(ev.message, "full");
	}
	msgpack_unpacked_destroy(&msg);
	free(buf);
	ck_assert_int_eq(proto_client_frame_error(0, PROTO_ERR_INTERNAL, "id 0",
						  &buf, &len), 0);
	ck_assert_int_eq(proto_client_event_parse(decode(buf, len, &msg), &ev, &err), 0);
	ck_assert_int_eq(ev.type, PROTO_EV_ERROR);
	ck_assert_uint_eq(ev.id, 0);
	msgpack_unpacked_destroy(&msg);
	free(buf);
	ck_assert_str_eq(proto_err_name(PROTO_ERR_PROMPT_TOO_LONG), "PROMPT_TOO_LONG");
	ck_assert_str_eq(proto_err_name(99), "?");
	ck_assert_int_eq(proto_err_parse("NOPE"), -1);
}
END_TEST

static void hello_fill(struct proto_peer_hello *h)
{
	memset(h, 0, sizeof(*h));
	h->version = PROTO_PEER_VERSION;
	strcpy(h->role, "prefill");
	strcpy(h->node, "p1");
	memset(h->model_sha256, 'a', 64);
	strcpy(h->kv_dtype, "f32");
	h->page_tokens = 16;
	h->n_layer = 5;
	h->kv_dim = 64;
	h->page_bytes = 41024;
	h->pool_tokens = 4096;
	h->context = 512;
	h->max_batch_bytes = 4 << 20;
	h->checksum = true;
	memset(h->session, 0x77, sizeof(h->session));
	h->has_session = true;
}

static void peer_roundtrip(const struct proto_peer_msg *m, struct proto_peer_msg *out)
{
	struct frame_error err;
	msgpack_unpacked msg;
	size_t len;
	char *buf;

	ck_assert_int_eq(proto_peer_frame(m, &buf, &len), 0);
	ck_assert_int_eq(proto_peer_parse(decode(buf, len, &msg), out, &err), 0);
	ck_assert_int_eq(out->type, m->type);
	msgpack_unpacked_destroy(&msg);
	free(buf);
}

START_TEST(test_peer_roundtrip)
{
	struct proto_peer_msg m = { 0 }, o;
	struct proto_peer_page pages[] = { { 3, 11 }, { 9, 12 } };
	uint32_t toks[] = { 1, 2, 3, 4, 5 };
	char field[32], why[128];

	m.type = PEER_MSG_HELLO;
	hello_fill(&m.hello);
	peer_roundtrip(&m, &o);
	ck_assert_int_eq(memcmp(&o.hello, &m.hello, sizeof(m.hello)), 0);
	ck_assert_int_eq(proto_peer_hello_match(&m.hello, &o.hello, field,
						sizeof(field), why, sizeof(why)), 0);
	o.hello.page_bytes++;
	ck_assert_int_eq(proto_peer_hello_match(&m.hello, &o.hello, field,
						sizeof(field), why, sizeof(why)), 1);
	ck_assert_str_eq(field, "page_bytes");
	o.hello = m.hello;
	o.hello.model_sha256[3] = 'b';
	ck_assert_int_eq(proto_peer_hello_match(&m.hello, &o.hello, field,
						sizeof(field), why, sizeof(why)), 1);
	ck_assert_str_eq(field, "model_sha256");

	memset(&m, 0, sizeof(m));
	m.type = PEER_MSG_PREFILL_REQUEST;
	m.id = 5;
	m.tokens = toks;
	m.n_tokens = 5;
	m.pages = pages;
	m.n_pages = 2;
	m.max_tokens = 8;
	m.temperature = 0.7f;
	m.top_k = 3;
	m.top_p = 0.5f;
	m.seed = 99;
	peer_roundtrip(&m, &o);
	ck_assert_uint_eq(o.id, 5);
	ck_assert_uint_eq(o.n_tokens, 5);
	ck_assert_uint_eq(o.tokens[4], 5);
	ck_assert_uint_eq(o.n_pages, 2);
	ck_assert_uint_eq(o.pages[1].page, 9);
	ck_assert_uint_eq(o.pages[1].gen, 12);
	ck_assert_uint_eq(o.seed, 99);
	proto_peer_msg_deinit(&o);
	proto_peer_msg_deinit(&o);

	memset(&m, 0, sizeof(m));
	m.type = PEER_MSG_PREFILL_DONE;
	m.id = 5;
	m.first_token = 42;
	m.done_tokens = 17;
	m.batches = 2;
	m.done_pages = 2;
	peer_roundtrip(&m, &o);
	ck_assert_uint_eq(o.first_token, 42);
	ck_assert_uint_eq(o.done_tokens, 17);
	ck_assert_uint_eq(o.batches, 2);

	memset(&m, 0, sizeof(m));
	m.type = PEER_MSG_PREFILL_REJECT;
	m.id = 6;
	m.code = PROTO_ERR_PROMPT_TOO_LONG;
	strcpy(m.message, "prompt 600 + max 10 > pool 512");
	peer_roundtrip(&m, &o);
	ck_assert_int_eq(o.code, PROTO_ERR_PROMPT_TOO_LONG);
	ck_assert_str_eq(o.message, m.message);

	for (int t = PEER_MSG_ABORT; t <= PEER_MSG_RELEASE_ACK; t++) {
		memset(&m, 0, sizeof(m));
		m.type = (enum proto_peer_type)t;
		m.id = 1000 + t;
		m.code = PROTO_ERR_INTERNAL;
		m.batches = 7u + (unsigned)t;
		peer_roundtrip(&m, &o);
		ck_assert_uint_eq(o.id, 1000 + t);
		/* abort and abort_ack carry the batches posted; the
		 * others have no such key */
		ck_assert_uint_eq(o.batches, t == PEER_MSG_ABORT ||
				  t == PEER_MSG_ABORT_ACK ? 7u + (unsigned)t : 0);
	}
	memset(&m, 0, sizeof(m));
	m.type = PEER_MSG_HEARTBEAT;
	m.load = 3;
	m.free_tokens = 100;
	peer_roundtrip(&m, &o);
	ck_assert_uint_eq(o.load, 3);
	m.type = PEER_MSG_DATA;
	for (unsigned i = 0; i < sizeof(m.token); i++)
		m.token[i] = (uint8_t)(i * 7 + 1);
	peer_roundtrip(&m, &o);
	ck_assert_mem_eq(o.token, m.token, sizeof(m.token));
	/* the authentication messages: nonces and proofs survive exactly */
	m.type = PEER_MSG_AUTH_HELLO;
	m.version = PROTO_PEER_VERSION;
	memset(m.nonce, 0xa5, sizeof(m.nonce));
	m.nonce[31] = 0x01;
	snprintf(m.suite, sizeof(m.suite), "%s", PROTO_PEER_SUITE);
	peer_roundtrip(&m, &o);
	ck_assert_uint_eq(o.version, PROTO_PEER_VERSION);
	ck_assert_mem_eq(o.nonce, m.nonce, sizeof(m.nonce));
	ck_assert_str_eq(o.suite, PROTO_PEER_SUITE);
	m.type = PEER_MSG_AUTH_CHALLENGE;
	m.nonce[0] = 0x00;
	peer_roundtrip(&m, &o);
	ck_assert_mem_eq(o.nonce, m.nonce, sizeof(m.nonce));
	ck_assert_str_eq(o.suite, PROTO_PEER_SUITE);
	m.suite[0] = '\0';                 /* absent: parsed as "" (the link refuses it) */
	peer_roundtrip(&m, &o);
	ck_assert_str_eq(o.suite, "");
	m.type = PEER_MSG_AUTH_PROOF;
	memset(m.proof, 0xff, sizeof(m.proof));
	peer_roundtrip(&m, &o);
	ck_assert_mem_eq(o.proof, m.proof, sizeof(m.proof));
	m.type = PEER_MSG_REFUSED;
	snprintf(m.reason, sizeof(m.reason), "mismatch:model_sha256");
	peer_roundtrip(&m, &o);
	ck_assert_str_eq(o.reason, "mismatch:model_sha256");
}
END_TEST

/* The verbs exchange: a queue pair's address, a request's write scope. */
START_TEST(test_peer_verbs)
{
	struct proto_peer_msg m = { 0 }, o;
	struct proto_peer_run runs[] = { { 5, 3, 0x7f12345000ull, 0xabcd01 },
					 { 0xfffffffe, 2, UINT64_MAX - 8191, 7 } };
	struct frame_error err;
	msgpack_unpacked msg;
	char *buf;
	size_t len;

	m.type = PEER_MSG_VERBS_QP;
	m.vqp = (struct proto_peer_verbs_qp){ .qpn = 0xffffff, .psn = 0x123456,
					      .lid = 0xffff, .mtu = 1024 };
	for (int i = 0; i < PROTO_PEER_GID_BYTES; i++)
		m.vqp.gid[i] = (uint8_t)(0xf0 + i);
	peer_roundtrip(&m, &o);
	ck_assert_uint_eq(o.vqp.qpn, 0xffffff);
	ck_assert_uint_eq(o.vqp.psn, 0x123456);
	ck_assert_uint_eq(o.vqp.lid, 0xffff);
	ck_assert_uint_eq(o.vqp.mtu, 1024);
	ck_assert_mem_eq(o.vqp.gid, m.vqp.gid, PROTO_PEER_GID_BYTES);
	ck_assert_str_eq(proto_peer_type_name(PEER_MSG_VERBS_QP), "verbs_qp");

	memset(&m, 0, sizeof(m));
	m.type = PEER_MSG_VERBS_SCOPE;
	m.id = 77;
	m.runs = runs;
	m.n_runs = 2;
	peer_roundtrip(&m, &o);
	ck_assert_uint_eq(o.id, 77);
	ck_assert_uint_eq(o.n_runs, 2);
	for (int i = 0; i < 2; i++) {
		ck_assert_uint_eq(o.runs[i].first_page, runs[i].first_page);
		ck_assert_uint_eq(o.runs[i].n_pages, runs[i].n_pages);
		ck_assert_uint_eq(o.runs[i].addr, runs[i].addr);
		ck_assert_uint_eq(o.runs[i].rkey, runs[i].rkey);
	}
	proto_peer_msg_deinit(&o);
	ck_assert_ptr_null(o.runs);

	/* refusals: each names its key, nothing stays allocated */
	static const char *const qp_keys[] = { "qpn", "mtu", "gid", "gid" };
	for (unsigned c = 0; c < 10; c++) {
		msgpack_sbuffer sb;
		msgpack_packer pk;
		int r;

		msgpack_sbuffer_init(&sb);
		msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
		if (c < 4) {
			/* verbs_qp with one bad field */
			msgpack_pack_map(&pk, 6);
			frame_pack_kv_str(&pk, "type", "verbs_qp");
			frame_pack_kv_u64(&pk, "qpn", c == 0 ? 0x1000000 : 5);
			frame_pack_kv_u64(&pk, "psn", 1);
			frame_pack_kv_u64(&pk, "lid", 0);
			frame_pack_kv_u64(&pk, "mtu", c == 1 ? 8192 : 4096);
			frame_pack_kv_str(&pk, "gid", c == 2 ? "fe80" :
					  c == 3 ? "fe800000000000000000000000000000zz" :
						   "fe800000000000000000000000000001");
		} else {
			/* verbs_scope with bad runs */
			msgpack_pack_map(&pk, 3);
			frame_pack_kv_str(&pk, "type", "verbs_scope");
			frame_pack_kv_u64(&pk, "id", 1);
			frame_pack_str(&pk, "runs");
			switch (c) {
			case 4: msgpack_pack_array(&pk, 0); break;   /* none */
			case 5:                                       /* too many */
				msgpack_pack_array(&pk, PROTO_PEER_RUNS_MAX + 1);
				for (int i = 0; i <= PROTO_PEER_RUNS_MAX; i++) {
					msgpack_pack_array(&pk, 4);
					for (int k = 0; k < 4; k++)
						msgpack_pack_uint32(&pk, 1);
				}
				break;
			case 6:                                       /* 0 pages */
			case 7:                                       /* wraps */
			case 8:                                       /* 3 items */
			case 9:                                       /* rkey > 32 bits */
				msgpack_pack_array(&pk, 2);
				msgpack_pack_array(&pk, 4);
				for (int k = 0; k < 4; k++)
					msgpack_pack_uint32(&pk, 1);
				msgpack_pack_array(&pk, c == 8 ? 3 : 4);
				msgpack_pack_uint32(&pk, c == 7 ? 0xffffffffu : 1);
				msgpack_pack_uint32(&pk, c == 6 ? 0 : 2);
				msgpack_pack_uint64(&pk, 4096);
				if (c != 8)
					msgpack_pack_uint64(&pk, c == 9 ? (1ull << 32) : 9);
				break;
			}
		}
		{
			uint8_t hdr[4] = { (uint8_t)(sb.size >> 24), (uint8_t)(sb.size >> 16),
					   (uint8_t)(sb.size >> 8), (uint8_t)sb.size };

			buf = malloc(sb.size + 4);
			ck_assert_ptr_nonnull(buf);
			memcpy(buf, hdr, 4);
			memcpy(buf + 4, sb.data, sb.size);
			len = sb.size + 4;
		}
		r = proto_peer_parse(decode(buf, len, &msg), &o, &err);
		ck_assert_msg(r == FRAME_E_RANGE, "case %u: %d", c, r);
		ck_assert_str_eq(err.key, c < 4 ? qp_keys[c] : "runs");
		ck_assert_ptr_null(o.runs);
		msgpack_unpacked_destroy(&msg);
		free(buf);
		msgpack_sbuffer_destroy(&sb);
	}

	/* verbs_credit: a running count, 64 bits; required, unsigned */
	memset(&m, 0, sizeof(m));
	m.type = PEER_MSG_VERBS_CREDIT;
	m.consumed = 0x100000003ull;
	peer_roundtrip(&m, &o);
	ck_assert_uint_eq(o.consumed, 0x100000003ull);
	ck_assert_str_eq(proto_peer_type_name(PEER_MSG_VERBS_CREDIT), "verbs_credit");
	for (unsigned c = 0; c < 3; c++) {
		msgpack_sbuffer sb;
		msgpack_packer pk;
		int r;

		msgpack_sbuffer_init(&sb);
		msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
		msgpack_pack_map(&pk, c == 0 ? 1 : 2);
		frame_pack_kv_str(&pk, "type", "verbs_credit");
		if (c == 1)
			frame_pack_kv_str(&pk, "consumed", "4");
		else if (c == 2)
			frame_pack_kv_i64(&pk, "consumed", -1);
		buf = malloc(sb.size + 4);
		ck_assert_ptr_nonnull(buf);
		buf[0] = (char)(sb.size >> 24);
		buf[1] = (char)(sb.size >> 16);
		buf[2] = (char)(sb.size >> 8);
		buf[3] = (char)sb.size;
		memcpy(buf + 4, sb.data, sb.size);
		len = sb.size + 4;
		r = proto_peer_parse(decode(buf, len, &msg), &o, &err);
		ck_assert_msg(r == (c == 0 ? FRAME_E_MISSING : c == 1 ? FRAME_E_TYPE : FRAME_E_RANGE),
			      "verbs_credit case %u: %d", c, r);
		ck_assert_str_eq(err.key, "consumed");
		msgpack_unpacked_destroy(&msg);
		free(buf);
		msgpack_sbuffer_destroy(&sb);
	}
}
END_TEST

START_TEST(test_peer_rejects)
{
	struct proto_peer_msg m, o;
	struct proto_peer_page pages[] = { { 3, 0 } };  /* generation 0: invalid */
	uint32_t toks[] = { 1 };
	struct frame_error err;
	msgpack_unpacked msg;
	size_t len;
	char *buf;
	int r;

	memset(&m, 0, sizeof(m));
	m.type = PEER_MSG_PREFILL_REQUEST;
	m.tokens = toks;
	m.n_tokens = 1;
	m.pages = pages;
	m.n_pages = 1;
	m.max_tokens = 1;
	m.top_p = 1;
	ck_assert_int_eq(proto_peer_frame(&m, &buf, &len), 0);
	ck_assert_int_eq(proto_peer_parse(decode(buf, len, &msg), &o, &err), FRAME_E_RANGE);
	ck_assert_str_eq(err.key, "pages");
	ck_assert_ptr_null(o.tokens);
	msgpack_unpacked_destroy(&msg);
	free(buf);

	/* unknown type */
	{
		struct frame_writer w;

		frame_writer_init(&w);
		msgpack_pack_map(frame_writer_packer(&w), 1);
		frame_pack_kv_str(frame_writer_packer(&w), "type", "bogus");
		ck_assert_int_eq(frame_writer_finish(&w, 1024, &buf, &len), 0);
		frame_writer_deinit(&w);
		ck_assert_int_eq(proto_peer_parse(decode(buf, len, &msg), &o, &err),
				 FRAME_E_TYPE);
		msgpack_unpacked_destroy(&msg);
		free(buf);
	}
	/* abort_ack: batches absent reads as 0 (an older peer); a string or
	 * a negative count is refused naming the key */
	for (int how = 0; how < 3; how++) {
		struct frame_writer w;
		msgpack_packer *pk;

		frame_writer_init(&w);
		pk = frame_writer_packer(&w);
		msgpack_pack_map(pk, how ? 3 : 2);
		frame_pack_kv_str(pk, "type", "abort_ack");
		frame_pack_kv_u64(pk, "id", 5);
		if (how == 1)
			frame_pack_kv_str(pk, "batches", "3");
		if (how == 2) {
			frame_pack_str(pk, "batches");
			msgpack_pack_int64(pk, -1);
		}
		ck_assert_int_eq(frame_writer_finish(&w, 1024, &buf, &len), 0);
		frame_writer_deinit(&w);
		o.batches = 99;
		r = proto_peer_parse(decode(buf, len, &msg), &o, &err);
		if (how == 0) {
			ck_assert_int_eq(r, 0);
			ck_assert_uint_eq(o.batches, 0);
		} else {
			ck_assert_int_ne(r, 0);
			ck_assert_str_eq(err.key, "batches");
		}
		msgpack_unpacked_destroy(&msg);
		free(buf);
	}
}
END_TEST

/* hello.session is optional: absent or nil reads as no session; a value
 * must be exactly 64 hex digits. fuzz_proto_peer found "session": nil
 * refused ("must be 64 hex digits") while every other optional key takes
 * nil as absent. */
static int hello_with_session(const struct proto_peer_hello *h, int how,
			      struct proto_peer_msg *o, struct frame_error *err)
{
	struct proto_peer_msg m = { .type = PEER_MSG_HELLO, .hello = *h };
	struct frame_writer w;
	msgpack_packer *pk;
	msgpack_unpacked msg;
	size_t len;
	char *buf;
	int r;

	m.hello.has_session = false;
	frame_writer_init(&w);
	pk = frame_writer_packer(&w);
	/* the 14 keys of a session-less hello, then "session" */
	msgpack_pack_map(pk, 15);
	{
		struct frame_writer w2;

		frame_writer_init(&w2);
		proto_peer_pack(frame_writer_packer(&w2), &m);
		/* drop w2's own one-byte fixmap header */
		frame_writer_append(&w, w2.buf + FRAME_HEADER_BYTES + 1,
				    w2.len - FRAME_HEADER_BYTES - 1);
		frame_writer_deinit(&w2);
	}
	frame_pack_str(pk, "session");
	if (how == 0)
		msgpack_pack_nil(pk);
	else if (how == 1)
		frame_pack_str(pk, "77777777777777777777777777777777"
				   "77777777777777777777777777777777");
	else
		frame_pack_str(pk, "7777");
	ck_assert_int_eq(frame_writer_finish(&w, 1 << 16, &buf, &len), 0);
	frame_writer_deinit(&w);
	r = proto_peer_parse(decode(buf, len, &msg), o, err);
	msgpack_unpacked_destroy(&msg);
	free(buf);
	return r;
}

START_TEST(test_peer_session_optional)
{
	struct proto_peer_hello h;
	struct proto_peer_msg o;
	struct frame_error err;

	hello_fill(&h);
	ck_assert_int_eq(hello_with_session(&h, 0, &o, &err), 0);
	ck_assert(!o.hello.has_session);
	ck_assert_int_eq(hello_with_session(&h, 1, &o, &err), 0);
	ck_assert(o.hello.has_session);
	ck_assert_uint_eq(o.hello.session[0], 0x77);
	ck_assert_uint_eq(o.hello.session[31], 0x77);
	ck_assert_int_eq(hello_with_session(&h, 2, &o, &err), FRAME_E_RANGE);
	ck_assert_str_eq(err.key, "session");
}
END_TEST

/* Feed every truncation and many random corruptions of valid frames to
 * both decoders. */
START_TEST(test_fuzz)
{
	struct proto_peer_msg pm = { 0 }, po;
	struct proto_peer_page pages[] = { { 3, 11 }, { 9, 12 } };
	uint32_t toks[] = { 1, 2, 3 };
	struct proto_client_request r = PROTO_CLIENT_REQUEST_NULL, q;
	struct proto_client_event ev;
	struct frame_error err;
	char *frames[3];
	size_t lens[3];
	unsigned seed = (unsigned)time(NULL);
	int decoded = 0;

	fprintf(stderr, "test_fuzz seed=%u\n", seed);
	srand(seed);
	pm.type = PEER_MSG_PREFILL_REQUEST;
	pm.tokens = toks;
	pm.n_tokens = 3;
	pm.pages = pages;
	pm.n_pages = 2;
	pm.max_tokens = 4;
	pm.top_p = 1;
	ck_assert_int_eq(proto_peer_frame(&pm, &frames[0], &lens[0]), 0);
	pm.type = PEER_MSG_HELLO;
	hello_fill(&pm.hello);
	ck_assert_int_eq(proto_peer_frame(&pm, &frames[1], &lens[1]), 0);
	r.id = 1;
	r.prompt = (char *)"hello world";
	frames[2] = pack_request(&r, &lens[2]);

	for (int it = 0; it < 30000; it++) {
		int k = rand() % 3;
		size_t n = lens[k];
		uint8_t *b = malloc(n);
		const msgpack_object *o = NULL;
		msgpack_unpacked msg;
		int mode = rand() % 3;

		memcpy(b, frames[k], n);
		if (mode == 0) {
			n = (size_t)rand() % n;        /* truncated */
		} else if (mode == 1) {
			int flips = 1 + rand() % 4;     /* corrupted */

			for (int f = 0; f < flips; f++)
				b[4 + (size_t)rand() % (n - 4)] = (uint8_t)rand();
		} else {
			for (size_t i = 4; i < n; i++)  /* random body */
				b[i] = (uint8_t)rand();
		}
		msgpack_unpacked_init(&msg);
		if (frame_decode(b, n, PROTO_PEER_FRAME_MAX, &msg, &o) == 0) {
			if (proto_peer_parse(o, &po, &err) == 0) {
				decoded++;
				proto_peer_msg_deinit(&po);
			}
			if (proto_client_request_parse(o, &q, &err) == 0) {
				decoded++;
				proto_client_request_deinit(&q);
			}
			(void)proto_client_event_parse(o, &ev, &err);
		}
		msgpack_unpacked_destroy(&msg);
		free(b);
	}
	fprintf(stderr, "test_fuzz: %d inputs decoded to a message\n", decoded);
	for (int k = 0; k < 3; k++)
		free(frames[k]);
}
END_TEST

/* prefill_request "tenant" (issue 12): how the value is packed. */
enum tenant_kind { TEN_ABSENT, TEN_STR, TEN_INT, TEN_NIL, TEN_BIN };

/* A prefill_request (id 77, otherwise valid) packed by hand, with its
 * tenant as `kind` (TEN_STR: the len bytes at s, NULs and all). */
static char *pack_prefill_tenant(enum tenant_kind kind, const char *s,
				 size_t len, size_t *out_len)
{
	struct frame_writer w;
	msgpack_packer *pk;
	char *data;

	frame_writer_init(&w);
	pk = frame_writer_packer(&w);
	msgpack_pack_map(pk, kind == TEN_ABSENT ? 9 : 10);
	frame_pack_kv_str(pk, "type", "prefill_request");
	frame_pack_kv_u64(pk, "id", 77);
	frame_pack_str(pk, "tokens");
	msgpack_pack_array(pk, 2);
	msgpack_pack_uint32(pk, 1);
	msgpack_pack_uint32(pk, 2);
	frame_pack_str(pk, "pages");
	msgpack_pack_array(pk, 1);
	msgpack_pack_array(pk, 2);
	msgpack_pack_uint32(pk, 4);
	msgpack_pack_uint32(pk, 1);
	frame_pack_kv_u64(pk, "max_tokens", 3);
	frame_pack_str(pk, "temperature");
	msgpack_pack_double(pk, 0.0);
	frame_pack_kv_u64(pk, "top_k", 0);
	frame_pack_str(pk, "top_p");
	msgpack_pack_double(pk, 1.0);
	frame_pack_kv_u64(pk, "seed", 5);
	if (kind != TEN_ABSENT)
		frame_pack_str(pk, "tenant");
	switch (kind) {
	case TEN_ABSENT:
		break;
	case TEN_STR:
		msgpack_pack_str_with_body(pk, s, len);
		break;
	case TEN_INT:
		msgpack_pack_uint32(pk, 12);
		break;
	case TEN_NIL:
		msgpack_pack_nil(pk);
		break;
	case TEN_BIN:
		msgpack_pack_bin_with_body(pk, s, len);
		break;
	}
	ck_assert_int_eq(frame_writer_finish(&w, PROTO_PEER_FRAME_MAX, &data,
					     out_len), 0);
	frame_writer_deinit(&w);
	return data;
}

START_TEST(test_peer_tenant)
{
	struct proto_peer_msg m = { 0 }, o;
	struct proto_peer_page pages[] = { { 3, 11 } };
	uint32_t toks[] = { 1, 2 };
	struct frame_error err;
	msgpack_unpacked msg;
	const msgpack_object *map;
	char long63[64], long64[65];
	size_t len;
	char *buf;

	/* the writer: a tenant goes on the wire, and reads back */
	m.type = PEER_MSG_PREFILL_REQUEST;
	m.id = 5;
	m.tokens = toks;
	m.n_tokens = 2;
	m.pages = pages;
	m.n_pages = 1;
	m.max_tokens = 4;
	m.top_p = 1;
	strcpy(m.tenant, "alice.team-2_x");
	peer_roundtrip(&m, &o);
	ck_assert_str_eq(o.tenant, "alice.team-2_x");
	proto_peer_msg_deinit(&o);
	/* "" and the default are left off the wire; both read as default */
	for (int k = 0; k < 2; k++) {
		strcpy(m.tenant, k ? PROTO_PEER_TENANT_DEFAULT : "");
		ck_assert_int_eq(proto_peer_frame(&m, &buf, &len), 0);
		map = decode(buf, len, &msg);
		ck_assert_ptr_null(frame_map_get(map, "tenant"));
		ck_assert_int_eq(proto_peer_parse(map, &o, &err), 0);
		ck_assert_str_eq(o.tenant, "default");
		proto_peer_msg_deinit(&o);
		msgpack_unpacked_destroy(&msg);
		free(buf);
	}

	/* the reader, by hand: absent and nil are the default */
	for (int k = 0; k < 2; k++) {
		buf = pack_prefill_tenant(k ? TEN_NIL : TEN_ABSENT, NULL, 0, &len);
		ck_assert_int_eq(proto_peer_parse(decode(buf, len, &msg), &o, &err), 0);
		ck_assert_str_eq(o.tenant, "default");
		ck_assert_uint_eq(o.id, 77);
		proto_peer_msg_deinit(&o);
		msgpack_unpacked_destroy(&msg);
		free(buf);
	}
	/* 63 characters is the longest */
	memset(long63, 'a', 63);
	long63[63] = 0;
	buf = pack_prefill_tenant(TEN_STR, long63, 63, &len);
	ck_assert_int_eq(proto_peer_parse(decode(buf, len, &msg), &o, &err), 0);
	ck_assert_str_eq(o.tenant, long63);
	proto_peer_msg_deinit(&o);
	msgpack_unpacked_destroy(&msg);
	free(buf);

	/* anything else is a range error naming the key, never the value;
	 * type and id are known (prefill answers that request) */
	memset(long64, 'b', 64);
	long64[64] = 0;
	static const struct { enum tenant_kind kind; const char *s; size_t len; } bad[] = {
		{ TEN_STR, "", 0 },
		{ TEN_STR, NULL, 64 },          /* long64 */
		{ TEN_STR, "a b", 3 },
		{ TEN_STR, "evil\"tenant=root", 17 },
		{ TEN_STR, "line\nbreak", 10 },
		{ TEN_STR, "nul\0after", 9 },
		{ TEN_STR, "caf\xc3\xa9", 5 },
		{ TEN_STR, "a/b", 3 },
		{ TEN_INT, NULL, 0 },
		{ TEN_BIN, "alice", 5 },
	};
	for (size_t i = 0; i < KVD_ARRAY_SIZE(bad); i++) {
		const char *s = bad[i].s ? bad[i].s : long64;

		buf = pack_prefill_tenant(bad[i].kind, s, bad[i].len, &len);
		memset(&err, 0, sizeof(err));
		ck_assert_int_eq(proto_peer_parse(decode(buf, len, &msg), &o, &err),
				 FRAME_E_RANGE);
		ck_assert_str_eq(err.key, "tenant");
		ck_assert_ptr_nonnull(strstr(err.msg, "1..63"));
		if (bad[i].len > 2) {
			char head[8] = { 0 };

			memcpy(head, s, 3);
			ck_assert_ptr_null(strstr(err.msg, head));
		}
		ck_assert_int_eq(o.type, PEER_MSG_PREFILL_REQUEST);
		ck_assert_uint_eq(o.id, 77);
		ck_assert_ptr_null(o.tokens);
		ck_assert_ptr_null(o.pages);
		msgpack_unpacked_destroy(&msg);
		free(buf);
	}
}
END_TEST

static Suite *proto_suite(void)
{
	Suite *s = suite_create("proto");
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, test_request_roundtrip);
	tcase_add_test(tc, test_request_rejects);
	tcase_add_test(tc, test_events_roundtrip);
	tcase_add_test(tc, test_peer_roundtrip);
	tcase_add_test(tc, test_peer_rejects);
	tcase_add_test(tc, test_peer_tenant);
	tcase_add_test(tc, test_peer_verbs);
	tcase_add_test(tc, test_peer_session_optional);
	tcase_add_test(tc, test_fuzz);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(proto_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
