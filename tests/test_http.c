/* test_http.c - the HTTP front's pure parts: requests off the wire with
 * kvd's bounds (net/wire/http_wire.c over llhttp), OpenAI bodies (net/wire/openai.c)
 * and API keys (conf/apikeys.c). The daemon side is tests/integration/
 * http_api.sh and http_openai.sh.
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conf/apikeys.h"
#include "conf/util.h"
#include "net/wire/http_wire.h"
#include "net/wire/openai.h"

/* Feed `s` in reads of `chunk` bytes (0: whole) and collect the requests:
 * up to 4 (method path body) into out[]; returns the last result. */
struct got {
	int n;
	char line[4][1200];
	bool keep_alive[4];
	char inm[4][HTTP_WIRE_INM_MAX + 1];  /* If-None-Match */
	enum http_wire_method method[4];
	char origin[4][HTTP_WIRE_ORIGIN_MAX + 1];
	bool has_origin[4];
	bool cont;
	int status;
};

static int feed(const char *s, size_t chunk, size_t max_head, size_t max_body,
		struct got *g)
{
	struct http_wire w;
	size_t n = strlen(s), off = 0, have = 0, used;
	char *buf = malloc(n + 1);
	int rc = HTTP_WIRE_AGAIN;

	memset(g, 0, sizeof(*g));
	http_wire_init(&w, max_head, max_body);
	while (off < n) {
		size_t take = chunk ? (chunk < n - off ? chunk : n - off) : n - off;

		memcpy(buf + have, s + off, take);
		have += take;
		off += take;
		for (;;) {
			rc = http_wire_feed(&w, buf, have, &used);
			memmove(buf, buf + used, have - used);
			have -= used;
			g->cont |= w.want_continue;
			if (rc != HTTP_WIRE_MSG)
				break;
			if (g->n < 4) {
				snprintf(g->line[g->n], sizeof(g->line[0]), "%s %s %s|%s",
					 w.msg.method_name, w.msg.path, w.msg.auth,
					 w.msg.body ? w.msg.body : "");
				g->keep_alive[g->n] = w.msg.keep_alive;
				snprintf(g->inm[g->n], sizeof(g->inm[0]), "%s",
					 w.msg.if_none_match);
				g->method[g->n] = w.msg.method;
				memcpy(g->origin[g->n], w.msg.origin, sizeof(w.msg.origin));
				g->has_origin[g->n] = w.msg.has_origin;
			}
			g->n++;
			http_wire_next(&w);
		}
		if (rc != HTTP_WIRE_AGAIN)
			break;
	}
	g->status = w.status;
	http_wire_deinit(&w);
	free(buf);
	return rc;
}

START_TEST(test_wire_requests)
{
	static const char two[] =
		"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k1\r\n"
		"Content-Length: 14\r\n\r\n{\"prompt\":\"a\"}"
		"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n";
	struct got g;

	/* one request per llhttp pause; the same whole, per byte, per 7 */
	for (size_t chunk = 0; chunk < 8; chunk += 1) {
		ck_assert_int_eq(feed(two, chunk, 4096, 4096, &g), HTTP_WIRE_AGAIN);
		ck_assert_int_eq(g.n, 2);
		ck_assert_str_eq(g.line[0], "POST /v1/completions Bearer k1|{\"prompt\":\"a\"}");
		ck_assert_str_eq(g.line[1], "GET /health |");
		ck_assert(g.keep_alive[0]);
		ck_assert(!g.keep_alive[1]);
	}
	/* chunked body, Expect: 100-continue */
	ck_assert_int_eq(feed("POST /x HTTP/1.1\r\nExpect: 100-continue\r\nTransfer-Encoding: chunked\r\n\r\n"
			      "3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n", 5, 4096, 4096, &g), HTTP_WIRE_AGAIN);
	ck_assert_int_eq(g.n, 1);
	ck_assert_str_eq(g.line[0], "POST /x |abcde");
	ck_assert(g.cont);
	/* HTTP/1.0 without keep-alive closes */
	feed("GET / HTTP/1.0\r\n\r\n", 0, 4096, 4096, &g);
	ck_assert_int_eq(g.n, 1);
	ck_assert(!g.keep_alive[0]);
}
END_TEST

/* CORS: the Origin header is kept whole (bounded, never cut), OPTIONS
 * is a method of its own, and a second request on the connection does
 * not inherit the first one's Origin. */
START_TEST(test_wire_origin)
{
	static const char two[] =
		"OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
		"origin: https://app.example.com:8443\r\n"
		"Access-Control-Request-Method: POST\r\n\r\n"
		"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n";
	struct got g;
	char big[1200];

	for (size_t chunk = 0; chunk < 8; chunk += 3) {
		ck_assert_int_eq(feed(two, chunk, 4096, 4096, &g), HTTP_WIRE_AGAIN);
		ck_assert_int_eq(g.n, 2);
		ck_assert_int_eq(g.method[0], HTTP_WIRE_OPTIONS);
		ck_assert_str_eq(g.line[0], "OPTIONS /v1/chat/completions |");
		ck_assert(g.has_origin[0]);
		ck_assert_str_eq(g.origin[0], "https://app.example.com:8443");
		ck_assert_int_eq(g.method[1], HTTP_WIRE_GET);
		ck_assert(!g.has_origin[1]);
		ck_assert_str_eq(g.origin[1], "");
	}
	/* DELETE is neither GET, POST nor OPTIONS */
	feed("DELETE /v1/models HTTP/1.1\r\n\r\n", 0, 4096, 4096, &g);
	ck_assert_int_eq(g.n, 1);
	ck_assert_int_eq(g.method[0], HTTP_WIRE_OTHER);
	/* an Origin longer than its buffer: 431, not cut to a prefix that
	 * might be on the allow-list */
	static const char pre[] = "GET / HTTP/1.1\r\nOrigin: ";
	size_t at = sizeof(pre) - 1;

	memset(big, 'o', sizeof(big));
	memcpy(big, pre, at);
	memcpy(big + at + HTTP_WIRE_ORIGIN_MAX + 1, "\r\n\r\n", 5);
	ck_assert_int_eq(feed(big, 0, 4096, 4096, &g), HTTP_WIRE_E_HEADERS);
	ck_assert_int_eq(g.status, 431);
	ck_assert_int_eq(g.n, 0);
	/* the longest that fits is kept whole */
	memcpy(big + at + HTTP_WIRE_ORIGIN_MAX, "\r\n\r\n", 5);
	ck_assert_int_eq(feed(big, 0, 4096, 4096, &g), HTTP_WIRE_AGAIN);
	ck_assert_int_eq(g.n, 1);
	ck_assert_uint_eq(strlen(g.origin[0]), HTTP_WIRE_ORIGIN_MAX);
	/* two Origin headers are not one origin */
	ck_assert_int_eq(feed("GET / HTTP/1.1\r\nOrigin: https://a\r\nOrigin: https://b\r\n\r\n",
			      0, 4096, 4096, &g), HTTP_WIRE_E_PARSE);
	ck_assert_int_eq(g.status, 400);
}
END_TEST

/* http.cors_origins: the list's syntax, and which Origin values pass. */
START_TEST(test_origins)
{
	struct kvd_origins o;
	const char *why = NULL;
	char bad[64], many[1024] = "";

	ck_assert_int_eq(kvd_origins_parse(&o, "", &why, bad, sizeof(bad)), 0);
	ck_assert(!o.any);
	ck_assert_uint_eq(o.n, 0);
	ck_assert(!kvd_origins_allow(&o, "https://a.example"));   /* off */
	ck_assert_int_eq(kvd_origins_parse(&o, " https://a.example ,http://localhost:5173,,http://[::1]:8080",
					   &why, bad, sizeof(bad)), 0);
	ck_assert_uint_eq(o.n, 3);
	ck_assert(kvd_origins_allow(&o, "https://a.example"));
	ck_assert(kvd_origins_allow(&o, "HTTPS://A.example"));
	ck_assert(kvd_origins_allow(&o, "http://localhost:5173"));
	ck_assert(kvd_origins_allow(&o, "http://[::1]:8080"));
	ck_assert(!kvd_origins_allow(&o, "http://a.example"));        /* scheme */
	ck_assert(!kvd_origins_allow(&o, "https://a.example.evil"));  /* extension */
	ck_assert(!kvd_origins_allow(&o, "https://a.exampl"));        /* prefix */
	ck_assert(!kvd_origins_allow(&o, "http://localhost:5174"));   /* port */
	ck_assert(!kvd_origins_allow(&o, "null"));
	ck_assert(!kvd_origins_allow(&o, ""));
	/* a copy (SIGHUP's swap) points into its own buffer: it outlives
	 * the scratch list it came from, which the next parse rewrites */
	{
		struct kvd_origins c;

		kvd_origins_copy(&c, &o);
		ck_assert_int_eq(kvd_origins_parse(&o, "https://b.example", &why, bad, sizeof(bad)), 0);
		ck_assert_uint_eq(c.n, 3);
		for (uint32_t i = 0; i < c.n; i++)
			ck_assert(c.origin[i] >= c.buf && c.origin[i] < c.buf + sizeof(c.buf));
		ck_assert(kvd_origins_allow(&c, "http://[::1]:8080"));
		ck_assert(kvd_origins_allow(&c, "https://a.example"));
		ck_assert(!kvd_origins_allow(&c, "https://b.example"));
	}
	/* any: still only well-formed origins */
	ck_assert_int_eq(kvd_origins_parse(&o, "*", &why, bad, sizeof(bad)), 0);
	ck_assert(o.any);
	ck_assert(kvd_origins_allow(&o, "https://anything.example"));
	ck_assert(!kvd_origins_allow(&o, "null"));
	ck_assert(!kvd_origins_allow(&o, "https://a.example\r\nX-Evil: 1"));
	ck_assert(!kvd_origins_allow(&o, "https://a.example/path"));
	/* bad entries are named */
	ck_assert_int_eq(kvd_origins_parse(&o, "https://ok.example, app.example.com", &why, bad, sizeof(bad)),
			 -EINVAL);
	ck_assert_str_eq(bad, "app.example.com");
	ck_assert_ptr_nonnull(why);
	ck_assert_int_eq(kvd_origins_parse(&o, "https://a.example/", &why, bad, sizeof(bad)), -EINVAL);
	ck_assert_int_eq(kvd_origins_parse(&o, "ftp://a.example", &why, bad, sizeof(bad)), -EINVAL);
	ck_assert_int_eq(kvd_origins_parse(&o, "https://", &why, bad, sizeof(bad)), -EINVAL);
	for (int i = 0; i < 33; i++)
		snprintf(many + strlen(many), sizeof(many) - strlen(many), "%shttp://h%d",
			 i ? "," : "", i);
	ck_assert_int_eq(kvd_origins_parse(&o, many, &why, bad, sizeof(bad)), -EINVAL);
	ck_assert_str_eq(bad, "http://h32");
}
END_TEST

START_TEST(test_wire_bounds)
{
	struct got g;
	char big[3000];

	/* body: refused on Content-Length, before a byte of it */
	ck_assert_int_eq(feed("POST / HTTP/1.1\r\nContent-Length: 5000\r\n\r\n", 0, 4096, 4096, &g),
			 HTTP_WIRE_E_BODY);
	ck_assert_int_eq(g.status, 413);
	/* a chunked body growing past the bound */
	ck_assert_int_eq(feed("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
			      "800\r\n", 0, 4096, 1024, &g), HTTP_WIRE_AGAIN);
	memset(big, 'a', sizeof(big));
	memcpy(big, "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n800\r\n", 51);
	big[sizeof(big) - 1] = 0;
	ck_assert_int_eq(feed(big, 100, 4096, 1024, &g), HTTP_WIRE_E_BODY);
	/* head past the bound, and too many header lines */
	memset(big, 'b', sizeof(big));
	memcpy(big, "GET / HTTP/1.1\r\nX: ", 19);
	big[sizeof(big) - 1] = 0;
	ck_assert_int_eq(feed(big, 64, 1024, 4096, &g), HTTP_WIRE_E_HEADERS);
	ck_assert_int_eq(g.status, 431);
	{
		char many[4096] = "GET / HTTP/1.1\r\n";

		for (int i = 0; i < 120; i++)
			strcat(many, "A: b\r\n");
		ck_assert_int_eq(feed(many, 0, 65536, 4096, &g), HTTP_WIRE_E_HEADERS);
	}
	/* an Authorization value too long for its buffer: refused, not cut */
	memset(big, 'c', sizeof(big));
	memcpy(big, "GET / HTTP/1.1\r\nAuthorization: ", 31);
	memcpy(big + 1000, "\r\n\r\n", 5);
	ck_assert_int_eq(feed(big, 0, 4096, 4096, &g), HTTP_WIRE_E_HEADERS);
	/* not HTTP; HTTP/2; smuggling-shaped headers */
	ck_assert_int_eq(feed("HELLO\r\n\r\n", 0, 4096, 4096, &g), HTTP_WIRE_E_PARSE);
	ck_assert_int_eq(g.status, 400);
	ck_assert_int_ne(feed("GET / HTTP/2.0\r\n\r\n", 0, 4096, 4096, &g), HTTP_WIRE_AGAIN);
	ck_assert_int_ne(feed("POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
			      0, 4096, 4096, &g), HTTP_WIRE_AGAIN);
	ck_assert_int_eq(feed("POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
			      0, 4096, 4096, &g), HTTP_WIRE_E_PARSE);
	ck_assert_int_eq(g.n, 0);
}
END_TEST

/* If-None-Match (the chat page's ETag): kept per request; one too long
 * for its buffer is taken as absent, never a 431 */
START_TEST(test_wire_if_none_match)
{
	char req[1200];
	struct got g;
	int n;

	for (size_t chunk = 0; chunk < 8; chunk++) {
		ck_assert_int_eq(feed("GET / HTTP/1.1\r\nIf-None-Match: \"e1\"\r\n\r\n"
				      "GET /chat.js HTTP/1.1\r\n\r\n", chunk, 4096, 4096, &g),
				 HTTP_WIRE_AGAIN);
		ck_assert_int_eq(g.n, 2);
		ck_assert_str_eq(g.inm[0], "\"e1\"");
		ck_assert_str_eq(g.inm[1], "");
	}
	n = snprintf(req, sizeof(req), "GET / HTTP/1.1\r\nIf-None-Match: \"");
	memset(req + n, 'x', 400);
	snprintf(req + n + 400, sizeof(req) - (size_t)n - 400,
		 "\"\r\nAuthorization: Bearer k\r\n\r\n");
	for (size_t chunk = 0; chunk < 8; chunk += 3) {
		ck_assert_int_eq(feed(req, chunk, 4096, 4096, &g), HTTP_WIRE_AGAIN);
		ck_assert_int_eq(g.n, 1);
		ck_assert_str_eq(g.inm[0], "");
		ck_assert_str_eq(g.line[0], "GET / Bearer k|");
	}
}
END_TEST

static int parse(const char *body, bool chat, struct openai_req *q,
		 struct openai_error *e)
{
	memset(e, 0, sizeof(*e));
	return openai_req_parse(q, chat, body, strlen(body), e);
}

/* the sampling controls (issue 24.1): values, ranges, logit_bias sorted */
START_TEST(test_openai_sampling)
{
	static const struct { const char *body; bool chat; const char *param; } bad[] = {
		{ "\"presence_penalty\":2.01", false, "presence_penalty" },
		{ "\"frequency_penalty\":-2.5", false, "frequency_penalty" },
		{ "\"frequency_penalty\":\"1\"", false, "frequency_penalty" },
		{ "\"repetition_penalty\":0", false, "repetition_penalty" },
		{ "\"repeat_penalty\":10.01", false, "repeat_penalty" },
		{ "\"min_p\":-0.1", false, "min_p" },
		{ "\"logit_bias\":[1]", false, "logit_bias" },
		{ "\"logit_bias\":{\"-1\":1}", false, "logit_bias" },
		{ "\"logit_bias\":{\"+1\":1}", false, "logit_bias" },
		{ "\"logit_bias\":{\"01\":1}", false, "logit_bias" },
		{ "\"logit_bias\":{\"2147483648\":1}", false, "logit_bias" },
		{ "\"logit_bias\":{\"1\":-100.5}", false, "logit_bias" },
		{ "\"logit_bias\":{\"1\":\"x\"}", false, "logit_bias" },
		{ "\"logprobs\":6", false, "logprobs" },
		{ "\"logprobs\":-1", false, "logprobs" },
		{ "\"logprobs\":true", false, "logprobs" },
		{ "\"logprobs\":1", true, "logprobs" },
		{ "\"logprobs\":true,\"top_logprobs\":21", true, "top_logprobs" },
		{ "\"logprobs\":false,\"top_logprobs\":1", true, "top_logprobs" },
		{ "\"top_logprobs\":1", false, "top_logprobs" },   /* chat only */
	};
	struct openai_req q;
	struct openai_error e;
	char body[4096];
	int n;

	ck_assert_int_eq(parse("{\"prompt\":\"x\",\"presence_penalty\":-2,\"frequency_penalty\":1.5,"
			       "\"repeat_penalty\":1.3,\"min_p\":0.05,\"logprobs\":3,"
			       "\"logit_bias\":{\"50\":-100,\"7\":100,\"0\":1.5}}", false, &q, &e), 0);
	ck_assert(q.presence_penalty == -2.0f && q.frequency_penalty == 1.5f &&
		  q.repetition_penalty == 1.3f && q.min_p == 0.05f);
	ck_assert(q.logprobs && q.top_logprobs == 3);
	ck_assert_uint_eq(q.n_bias, 3);
	ck_assert(q.bias[0].id == 0 && q.bias[0].bias == 1.5f && q.bias[1].id == 7 &&
		  q.bias[1].bias == 100.0f && q.bias[2].id == 50 && q.bias[2].bias == -100.0f);
	openai_req_deinit(&q);
	/* logprobs 0: on, no alternatives; null: off */
	ck_assert_int_eq(parse("{\"prompt\":\"x\",\"logprobs\":0,\"logit_bias\":{}}", false, &q, &e), 0);
	ck_assert(q.logprobs && q.top_logprobs == 0 && q.n_bias == 0);
	openai_req_deinit(&q);
	ck_assert_int_eq(parse("{\"prompt\":\"x\",\"logprobs\":null,\"repetition_penalty\":null}", false, &q, &e), 0);
	ck_assert(!q.logprobs && q.repetition_penalty == 0.0f);
	openai_req_deinit(&q);
	ck_assert_int_eq(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"c\"}],"
			       "\"logprobs\":true,\"top_logprobs\":20}", true, &q, &e), 0);
	ck_assert(q.logprobs && q.top_logprobs == 20);
	openai_req_deinit(&q);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		snprintf(body, sizeof(body), "{%s,%s}", bad[i].chat ?
			 "\"messages\":[{\"role\":\"user\",\"content\":\"c\"}]" : "\"prompt\":\"x\"",
			 bad[i].body);
		ck_assert_msg(parse(body, bad[i].chat, &q, &e) == OPENAI_E_INVALID, "%s", body);
		ck_assert_str_eq(e.param, bad[i].param);
		ck_assert_int_eq(e.status, 400);
	}
	/* 300 entries are fine, 301 are not */
	for (int lim = 300; lim <= 301; lim++) {
		n = snprintf(body, sizeof(body), "{\"prompt\":\"x\",\"logit_bias\":{");
		for (int i = 0; i < lim; i++)
			n += snprintf(body + n, sizeof(body) - (size_t)n, "%s\"%d\":1", i ? "," : "", i);
		snprintf(body + n, sizeof(body) - (size_t)n, "}}");
		ck_assert_int_eq(parse(body, false, &q, &e), lim == 300 ? 0 : OPENAI_E_INVALID);
		if (lim == 300) {
			ck_assert_uint_eq(q.n_bias, 300);
			openai_req_deinit(&q);
		}
	}
}
END_TEST

START_TEST(test_openai_bodies)
{
	struct openai_req q;
	struct openai_error e;

	ck_assert_int_eq(parse("{\"prompt\":\"hi\"}", false, &q, &e), 0);
	ck_assert_str_eq(q.prompt, "hi");
	ck_assert_uint_eq(q.max_tokens, 0);   /* not given: the front's default */
	ck_assert(q.temperature == 1.0f && q.top_p == 1.0f && !q.has_seed && !q.stream);
	ck_assert_uint_eq(q.ignored, 0);
	openai_req_deinit(&q);

	ck_assert_int_eq(parse("{\"model\":\"m\",\"prompt\":[[1,2,3]],\"max_tokens\":5,\"temperature\":0,"
			       "\"top_p\":0.5,\"top_k\":-1,\"seed\":9,\"stop\":[\"a\",\"bc\"],\"n\":1,"
			       "\"stream\":true,\"user\":\"u\",\"presence_penalty\":0}", false, &q, &e), 0);
	ck_assert_uint_eq(q.n_tokens, 3);
	ck_assert(!q.prompt && q.tokens[2] == 3 && q.max_tokens == 5 && q.top_k == 0 &&
		  q.seed == 9 && q.has_seed && q.stream && q.n_stop == 2 && q.stop_len[1] == 2);
	ck_assert_uint_eq(q.ignored, 1u << OPENAI_IGN_USER);
	ck_assert_str_eq(q.model, "m");
	openai_req_deinit(&q);

	/* n: 1 when absent, 1..OPENAI_N_MAX (the front bounds it by
	 * http.max_n); best_of only equal to n */
	ck_assert_uint_eq(q.n, 0);   /* deinit cleared it */
	ck_assert_int_eq(parse("{\"prompt\":\"x\"}", false, &q, &e), 0);
	ck_assert_uint_eq(q.n, 1);
	openai_req_deinit(&q);
	ck_assert_int_eq(parse("{\"prompt\":\"x\",\"n\":4,\"best_of\":4}", false, &q, &e), 0);
	ck_assert_uint_eq(q.n, 4);
	openai_req_deinit(&q);
	ck_assert_int_eq(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"c\"}],\"n\":128}",
			       true, &q, &e), 0);
	ck_assert_uint_eq(q.n, 128);
	openai_req_deinit(&q);
	ck_assert_int_eq(parse("{\"prompt\":\"x\",\"best_of\":1}", false, &q, &e), 0);
	ck_assert_uint_eq(q.n, 1);
	openai_req_deinit(&q);
	{
		static const char *const bad_n[] = {
			"\"n\":0", "\"n\":-1", "\"n\":129", "\"n\":2.5", "\"n\":\"2\"",
			"\"n\":true", "\"n\":4294967298",
		};

		for (size_t i = 0; i < sizeof(bad_n) / sizeof(bad_n[0]); i++) {
			char b[128];

			snprintf(b, sizeof(b), "{\"prompt\":\"x\",%s}", bad_n[i]);
			ck_assert_msg(parse(b, false, &q, &e) == OPENAI_E_INVALID, "%s", b);
			ck_assert_str_eq(e.param, "n");
			ck_assert_int_eq(e.status, 400);
		}
	}
	/* best_of other than n: still refused, by name, in either order */
	ck_assert_int_eq(parse("{\"prompt\":\"x\",\"n\":2,\"best_of\":3}", false, &q, &e),
			 OPENAI_E_INVALID);
	ck_assert_str_eq(e.param, "best_of");
	ck_assert_str_eq(e.code, "unsupported_parameter");
	ck_assert_int_eq(parse("{\"prompt\":\"x\",\"best_of\":2}", false, &q, &e), OPENAI_E_INVALID);
	ck_assert_str_eq(e.param, "best_of");
	ck_assert_int_eq(parse("{\"best_of\":3,\"prompt\":\"x\",\"n\":2}", false, &q, &e),
			 OPENAI_E_INVALID);
	ck_assert_str_eq(e.param, "best_of");
	/* best_of is completions' only; n is not the Responses API's */
	ck_assert_int_eq(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"c\"}],\"best_of\":1}",
			       true, &q, &e), OPENAI_E_INVALID);
	ck_assert_str_eq(e.param, "best_of");
	/* what would change the result is named, never ignored */
	ck_assert_int_eq(parse("{\"prompt\":\"x\",\"echo\":true}", false, &q, &e), OPENAI_E_INVALID);
	ck_assert_str_eq(e.param, "echo");
	ck_assert_int_eq(parse("{\"prompt\":\"x\",\"mirostat\":1}", false, &q, &e), OPENAI_E_INVALID);
	ck_assert_str_eq(e.param, "mirostat");
	ck_assert_int_eq(parse("{\"prompt\":\"x\",\"messages\":[]}", false, &q, &e), OPENAI_E_INVALID);
	ck_assert_str_eq(e.param, "messages");
	ck_assert_int_eq(parse("{\"prompt\":[\"a\",\"b\"]}", false, &q, &e), OPENAI_E_INVALID);
	ck_assert_int_eq(parse("{\"prompt\":\"x\",\"\\u0001\\\"\":1}", false, &q, &e), OPENAI_E_INVALID);
	ck_assert_str_eq(e.param, "??");   /* sanitized before it goes back */
	/* types and ranges */
	ck_assert_int_eq(parse("{\"prompt\":\"x\",\"top_p\":0}", false, &q, &e), OPENAI_E_INVALID);
	ck_assert_str_eq(e.param, "top_p");
	ck_assert_int_eq(parse("{\"prompt\":\"x\",\"max_tokens\":0}", false, &q, &e), OPENAI_E_INVALID);
	ck_assert_int_eq(parse("{\"prompt\":\"x\",\"temperature\":\"hot\"}", false, &q, &e), OPENAI_E_INVALID);
	ck_assert_int_eq(parse("{\"prompt\":\"x\",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", false, &q, &e),
			 OPENAI_E_INVALID);
	ck_assert_int_eq(parse("{\"prompt\":\"x\",\"seed\":-1}", false, &q, &e), OPENAI_E_INVALID);
	ck_assert_int_eq(parse("{\"prompt\":\"\"}", false, &q, &e), OPENAI_E_INVALID);
	ck_assert_int_eq(parse("{\"max_tokens\":3}", false, &q, &e), OPENAI_E_INVALID);
	ck_assert_str_eq(e.param, "prompt");
	ck_assert_int_eq(parse("{\"prompt\":\"a\",\"prompt\":\"b\"}", false, &q, &e), OPENAI_E_INVALID);
	ck_assert_int_eq(parse("[1]", false, &q, &e), OPENAI_E_INVALID);
	ck_assert_int_eq(parse("{\"prompt\":\"a\\u0000b\"}", false, &q, &e), OPENAI_E_INVALID);
	/* cache_salt (issue 21): accepted on both endpoints, 1..256 bytes */
	ck_assert_int_eq(parse("{\"prompt\":\"x\",\"cache_salt\":\"s1\"}", false, &q, &e), 0);
	ck_assert_str_eq(q.cache_salt, "s1");
	openai_req_deinit(&q);
	ck_assert_int_eq(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"c\"}],"
			       "\"cache_salt\":\"s2\"}", true, &q, &e), 0);
	ck_assert_str_eq(q.cache_salt, "s2");
	openai_req_deinit(&q);
	ck_assert_int_eq(parse("{\"prompt\":\"x\",\"cache_salt\":\"\"}", false, &q, &e), OPENAI_E_INVALID);
	ck_assert_str_eq(e.param, "cache_salt");
	ck_assert_int_eq(parse("{\"prompt\":\"x\",\"cache_salt\":7}", false, &q, &e), OPENAI_E_INVALID);
	ck_assert_int_eq(parse("{\"prompt\":\"x\",\"cache_salt\":\"a\\u0000b\"}", false, &q, &e),
			 OPENAI_E_INVALID);

	/* chat */
	ck_assert_int_eq(parse("{\"messages\":[{\"role\":\"system\",\"content\":\"s\"},"
			       "{\"role\":\"user\",\"content\":\"u\"}],\"max_completion_tokens\":7,"
			       "\"response_format\":{\"type\":\"text\"}}", true, &q, &e), 0);
	ck_assert_uint_eq(q.n_msgs, 2);
	ck_assert_str_eq(q.msgs[1].role, "user");
	ck_assert_str_eq(q.msgs[1].content, "u");
	ck_assert_uint_eq(q.max_tokens, 7);
	openai_req_deinit(&q);
	ck_assert_int_eq(parse("{\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}", true, &q, &e),
			 OPENAI_E_INVALID);
	ck_assert_int_eq(parse("{\"messages\":[{\"role\":\"user\",\"content\":[]}]}", true, &q, &e),
			 OPENAI_E_INVALID);
	/* response_format json (issue 24.2): a grammar on both endpoints;
	 * what cannot be served names response_format */
	ck_assert_ptr_null(q.gram);
	ck_assert_int_eq(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
			       "\"response_format\":{\"type\":\"json_object\"}}", true, &q, &e), 0);
	ck_assert_ptr_nonnull(q.gram);
	openai_req_deinit(&q);
	ck_assert_int_eq(parse("{\"prompt\":\"x\",\"response_format\":{\"type\":\"json_schema\","
			       "\"json_schema\":{\"name\":\"p\",\"strict\":true,\"schema\":{\"type\":\"object\","
			       "\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]}}}}",
			       false, &q, &e), 0);
	ck_assert_ptr_nonnull(q.gram);
	openai_req_deinit(&q);
	static const char *const bad_rf[] = {
		"{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"p\",\"schema\":{\"type\":\"string\",\"pattern\":\"(?<=a)\"}}}",
		"{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"a b\",\"schema\":{}}}",
		"{\"type\":\"json_schema\",\"json_schema\":{\"schema\":{}}}",
		"{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"p\",\"strict\":1}}",
		"{\"type\":\"json_schema\"}",
		"{\"type\":\"json_object\",\"x\":1}",
		"{\"type\":\"yaml\"}",
		"\"json_object\"",
	};
	for (size_t i = 0; i < sizeof(bad_rf) / sizeof(bad_rf[0]); i++) {
		char body[512];

		snprintf(body, sizeof(body), "{\"prompt\":\"x\",\"response_format\":%s}", bad_rf[i]);
		ck_assert_msg(parse(body, false, &q, &e) == OPENAI_E_INVALID, "%s accepted", bad_rf[i]);
		ck_assert_str_eq(e.param, "response_format");
		ck_assert_int_eq(e.status, 400);
		if (i == 0)
			ck_assert_ptr_nonnull(strstr(e.msg, "'pattern'"));
	}
	ck_assert_int_eq(parse("{\"prompt\":\"x\"}", true, &q, &e), OPENAI_E_INVALID);
}
END_TEST

/* Issue 24.1: what cannot change the output is accepted and reported. */
START_TEST(test_openai_ignored)
{
	struct openai_req q;
	struct openai_error e;

	ck_assert_int_eq(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"c\"}],"
			       "\"user\":\"u\",\"metadata\":{\"a\":\"b\"},\"store\":false,"
			       "\"service_tier\":\"auto\",\"parallel_tool_calls\":true,"
			       "\"prompt_cache_key\":\"k\",\"prompt_cache_retention\":\"24h\","
			       "\"safety_identifier\":null}", true, &q, &e), 0);
	ck_assert_uint_eq(q.ignored, (1u << OPENAI_IGNORED__N) - 1);
	openai_req_deinit(&q);
	for (unsigned i = 0; i < OPENAI_IGNORED__N; i++)
		ck_assert(strcmp(openai_ignored_name(i), "?"));
	ck_assert_str_eq(openai_ignored_name(OPENAI_IGNORED__N), "?");
	/* the type is still checked, and named */
	ck_assert_int_eq(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"c\"}],"
			       "\"store\":\"yes\"}", true, &q, &e), OPENAI_E_INVALID);
	ck_assert_str_eq(e.param, "store");
	ck_assert_int_eq(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"c\"}],"
			       "\"metadata\":[1]}", true, &q, &e), OPENAI_E_INVALID);
	ck_assert_str_eq(e.param, "metadata");
	/* completions' schema has only user */
	ck_assert_int_eq(parse("{\"prompt\":\"x\",\"store\":false}", false, &q, &e),
			 OPENAI_E_INVALID);
	ck_assert_str_eq(e.param, "store");
	ck_assert_str_eq(e.code, "unsupported_parameter");
}
END_TEST

/* Issue 24.1: chat content as text parts. */
START_TEST(test_openai_parts)
{
	struct openai_req q;
	struct openai_error e;

	/* text parts, joined with \n */
	ck_assert_int_eq(parse("{\"messages\":[{\"role\":\"user\",\"content\":"
			       "[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\"bc\"}]}]}",
			       true, &q, &e), 0);
	ck_assert_str_eq(q.msgs[0].content, "a\nbc");
	openai_req_deinit(&q);
	ck_assert_int_eq(parse("{\"messages\":[{\"role\":\"user\",\"content\":"
			       "[{\"type\":\"text\",\"text\":\"\"}]}]}", true, &q, &e), 0);
	ck_assert_str_eq(q.msgs[0].content, "");
	openai_req_deinit(&q);
	ck_assert_int_eq(parse("{\"messages\":[{\"role\":\"user\",\"content\":"
			       "[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"image_url\","
			       "\"image_url\":{\"url\":\"u\"}}]}]}", true, &q, &e), OPENAI_E_INVALID);
	ck_assert_str_eq(e.param, "image_url");
	ck_assert_str_eq(e.code, "unsupported_parameter");
	ck_assert_int_eq(parse("{\"messages\":[{\"role\":\"user\",\"content\":"
			       "[{\"type\":\"text\"}]}]}", true, &q, &e), OPENAI_E_INVALID);
	ck_assert_str_eq(e.param, "messages");
	ck_assert_int_eq(parse("{\"messages\":[{\"role\":\"user\",\"content\":"
			       "[{\"type\":\"text\",\"text\":\"a\",\"x\":1}]}]}", true, &q, &e),
			 OPENAI_E_INVALID);
	ck_assert_int_eq(parse("{\"messages\":[{\"role\":\"user\",\"content\":[\"a\"]}]}",
			       true, &q, &e), OPENAI_E_INVALID);
	ck_assert_int_eq(parse("{\"messages\":[{\"role\":\"user\",\"content\":7}]}",
			       true, &q, &e), OPENAI_E_INVALID);
}
END_TEST

static int parse_resp(const char *body, struct openai_req *q, struct openai_error *e)
{
	memset(e, 0, sizeof(*e));
	return openai_req_parse_ep(q, OPENAI_EP_RESPONSES, body, strlen(body), e);
}

/* The refusal of a responses body: its param and code. */
static void resp_refused(const char *body, const char *param, const char *code)
{
	struct openai_req q;
	struct openai_error e;

	ck_assert_msg(parse_resp(body, &q, &e) == OPENAI_E_INVALID, "accepted: %s", body);
	ck_assert_int_eq(e.status, 400);
	ck_assert_msg(!strcmp(e.param, param), "%s: param %s, not %s", body, e.param, param);
	ck_assert_msg(!strcmp(e.code, code), "%s: code %s, not %s", body, e.code, code);
	ck_assert(e.msg[0]);
}

/* Issue 24.4: the Responses API's body, stateless. */
START_TEST(test_openai_responses)
{
	struct openai_req q;
	struct openai_error e;

	/* a string: one user message */
	ck_assert_int_eq(parse_resp("{\"model\":\"m\",\"input\":\"hi\",\"max_output_tokens\":9,"
				    "\"temperature\":0,\"top_p\":0.5,\"seed\":3,\"stream\":true,"
				    "\"store\":true,\"text\":{\"format\":{\"type\":\"text\"}},"
				    "\"previous_response_id\":null,\"tools\":[],\"reasoning\":null,"
				    "\"truncation\":\"disabled\"}", &q, &e), 0);
	ck_assert(q.chat && q.n_msgs == 1 && q.max_tokens == 9 && q.temperature == 0.0f &&
		  q.top_p == 0.5f && q.has_seed && q.seed == 3 && q.stream);
	ck_assert_str_eq(q.msgs[0].role, "user");
	ck_assert_str_eq(q.msgs[0].content, "hi");
	ck_assert_uint_eq(q.ignored, 1u << OPENAI_IGN_STORE);   /* store: accepted, kept nothing */
	openai_req_deinit(&q);

	/* items, and the instructions first as a system message whatever
	 * the keys' order; output_text with its annotations; developer kept
	 * (the front renders it as system) */
	ck_assert_int_eq(parse_resp("{\"input\":[{\"role\":\"developer\",\"content\":\"d\"},"
				    "{\"type\":\"message\",\"role\":\"user\",\"content\":"
				    "[{\"type\":\"input_text\",\"text\":\"a\"},{\"type\":\"input_text\",\"text\":\"b\"}]},"
				    "{\"type\":\"message\",\"id\":\"msg_1\",\"status\":\"completed\",\"role\":\"assistant\","
				    "\"content\":[{\"type\":\"output_text\",\"text\":\"c\",\"annotations\":[]}]}],"
				    "\"instructions\":\"be brief\"}", &q, &e), 0);
	ck_assert_uint_eq(q.n_msgs, 4);
	ck_assert_str_eq(q.msgs[0].role, "system");
	ck_assert_str_eq(q.msgs[0].content, "be brief");
	ck_assert_str_eq(q.msgs[1].role, "developer");
	ck_assert_str_eq(q.msgs[2].content, "a\nb");
	ck_assert_str_eq(q.msgs[3].role, "assistant");
	ck_assert_str_eq(q.msgs[3].content, "c");
	ck_assert_ptr_null(q.instructions);
	openai_req_deinit(&q);

	/* what needs state or capabilities kvd lacks: named */
	resp_refused("{\"input\":\"x\",\"previous_response_id\":\"resp_1\"}",
		     "previous_response_id", "unsupported_parameter");
	resp_refused("{\"input\":\"x\",\"conversation\":\"conv_1\"}", "conversation",
		     "unsupported_parameter");
	resp_refused("{\"input\":\"x\",\"tools\":[{\"type\":\"web_search\"}]}", "tools",
		     "unsupported_parameter");
	resp_refused("{\"input\":\"x\",\"reasoning\":{\"effort\":\"low\"}}", "reasoning",
		     "unsupported_parameter");
	resp_refused("{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"json_object\"}}}",
		     "text.format", "unsupported_parameter");
	resp_refused("{\"input\":\"x\",\"text\":{\"verbosity\":\"low\"}}", "text",
		     "unsupported_parameter");
	resp_refused("{\"input\":[{\"type\":\"function_call_output\",\"call_id\":\"c\",\"output\":\"o\"}]}",
		     "input[0].type", "unsupported_parameter");
	resp_refused("{\"input\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"user\",\"content\":"
		     "[{\"type\":\"input_text\",\"text\":\"b\"},{\"type\":\"input_image\",\"image_url\":\"u\"}]}]}",
		     "input[1].content[1].type", "unsupported_parameter");
	resp_refused("{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_file\",\"file_id\":\"f\"}]}]}",
		     "input[0].content[0].type", "unsupported_parameter");
	resp_refused("{\"input\":\"x\",\"truncation\":\"auto\"}", "truncation", "unsupported_parameter");
	resp_refused("{\"input\":\"x\",\"background\":true}", "background", "unsupported_parameter");
	/* chat's and completions' names are not this API's */
	resp_refused("{\"input\":\"x\",\"max_tokens\":3}", "max_tokens", "unsupported_parameter");
	resp_refused("{\"input\":\"x\",\"n\":2}", "n", "unsupported_parameter");
	resp_refused("{\"input\":\"x\",\"stop\":\"a\"}", "stop", "unsupported_parameter");
	resp_refused("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", "messages",
		     "unsupported_parameter");
	/* types and bounds */
	resp_refused("{\"max_output_tokens\":3}", "input", "");
	resp_refused("{\"input\":\"\"}", "input", "");
	resp_refused("{\"input\":[]}", "input", "");
	resp_refused("{\"input\":7}", "input", "");
	resp_refused("{\"input\":[{\"role\":\"tool\",\"content\":\"x\"}]}", "input", "");
	resp_refused("{\"input\":[{\"role\":\"user\"}]}", "input", "");
	resp_refused("{\"input\":[{\"role\":\"user\",\"content\":\"x\",\"name\":\"n\"}]}", "name",
		     "unsupported_parameter");
	resp_refused("{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_text\","
		     "\"text\":\"a\",\"annotations\":[]}]}]}", "input", "");
	resp_refused("{\"input\":[{\"type\":7,\"role\":\"user\",\"content\":\"x\"}]}",
		     "input[0].type", "");
	resp_refused("{\"input\":\"x\",\"instructions\":5}", "instructions", "");
	resp_refused("{\"input\":\"x\",\"max_output_tokens\":0}", "max_output_tokens", "");
	/* a chat part type is not this API's, nor the reverse */
	resp_refused("{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"}]}]}",
		     "input[0].content[0].type", "unsupported_parameter");
	ck_assert_int_eq(parse("{\"messages\":[{\"role\":\"user\",\"content\":"
			       "[{\"type\":\"input_text\",\"text\":\"a\"}]}]}", true, &q, &e), OPENAI_E_INVALID);
	/* a client's type name goes back cut and clean */
	ck_assert_int_eq(parse_resp("{\"input\":[{\"type\":\"\\u0001\\\"x\",\"role\":\"user\"}]}", &q, &e),
			 OPENAI_E_INVALID);
	ck_assert(!strchr(e.msg, 1) && strstr(e.msg, "'??x'"));
}
END_TEST

/* The role and limit words after the tenant: admin keys, limits that
 * belong to the tenant (every key of it gets them), and refusals. */
START_TEST(test_apikeys_roles)
{
	static const char good[] =
		"0123456789abcdef0123456789abcdef alice admin\n"
		"1123456789abcdef0123456789abcdef alice share=3 max_active=4\n"
		"2123456789abcdef0123456789abcdef bob user max_queued=2 max_tokens=500\n"
		"3123456789abcdef0123456789abcdef carol\n";
	static const char *const bad[] = {
		"0123456789abcdef0123456789abcdef alice root\n",
		"0123456789abcdef0123456789abcdef alice share=0\n",
		"0123456789abcdef0123456789abcdef alice share=4294967296\n",
		"0123456789abcdef0123456789abcdef alice share=x\n",
		"0123456789abcdef0123456789abcdef alice share=\n",
		"0123456789abcdef0123456789abcdef alice limit=3\n",
		"0123456789abcdef0123456789abcdef alice share=1\n1123456789abcdef0123456789abcdef alice share=2\n",
	};
	const struct kvd_apikey_info *i;
	struct kvd_apikeys *k;
	char why[256];

	ck_assert_int_eq(kvd_apikeys_parse(&k, "K", good, strlen(good), why, sizeof(why)), 0);
	ck_assert_uint_eq(kvd_apikeys_count(k), 4);
	ck_assert_uint_eq(kvd_apikeys_tenants(k), 3);   /* alice twice */
	i = kvd_apikeys_find(k, "0123456789abcdef0123456789abcdef", 32);
	ck_assert_ptr_nonnull(i);
	ck_assert_str_eq(i->tenant, "alice");
	ck_assert(i->admin);
	ck_assert_uint_eq(i->lim.share, 3);        /* the tenant's, from its other line */
	ck_assert_uint_eq(i->lim.max_active, 4);
	i = kvd_apikeys_find(k, "1123456789abcdef0123456789abcdef", 32);
	ck_assert(!i->admin);
	i = kvd_apikeys_find(k, "2123456789abcdef0123456789abcdef", 32);
	ck_assert(!i->admin);
	ck_assert_uint_eq(i->lim.max_queued, 2);
	ck_assert_uint_eq(i->lim.max_tokens, 500);
	ck_assert_uint_eq(i->lim.share, 0);        /* unset: the config's */
	i = kvd_apikeys_find(k, "3123456789abcdef0123456789abcdef", 32);
	ck_assert(!i->admin);
	ck_assert_uint_eq(i->lim.max_active, 0);
	ck_assert_ptr_null(kvd_apikeys_find(k, "4123456789abcdef0123456789abcdef", 32));
	kvd_apikeys_free(k);
	for (size_t n = 0; n < sizeof(bad) / sizeof(bad[0]); n++) {
		why[0] = 0;
		ck_assert_msg(kvd_apikeys_parse(&k, "K", bad[n], strlen(bad[n]), why, sizeof(why)) == -1,
			      "accepted: %s", bad[n]);
		ck_assert_ptr_nonnull(strstr(why, "K:"));
	}
}
END_TEST

START_TEST(test_apikeys)
{
	static const char good[] = "# keys\n\n0123456789abcdef0123456789ABCDEF alice\r\n  fedcba9876543210fedcba9876543210xyz\tbob.2 \n";
	struct kvd_apikeys *k;
	char why[300];

	ck_assert_int_eq(kvd_apikeys_parse(&k, "K", good, strlen(good), why, sizeof(why)), 0);
	ck_assert_uint_eq(kvd_apikeys_count(k), 2);
	ck_assert_str_eq(kvd_apikeys_lookup(k, "0123456789abcdef0123456789ABCDEF", 32), "alice");
	ck_assert_str_eq(kvd_apikeys_lookup(k, "fedcba9876543210fedcba9876543210xyz", 35), "bob.2");
	ck_assert_ptr_null(kvd_apikeys_lookup(k, "0123456789abcdef0123456789ABCDE", 31));    /* a prefix */
	ck_assert_ptr_null(kvd_apikeys_lookup(k, "0123456789abcdef0123456789ABCDEFg", 33));  /* longer */
	ck_assert_ptr_null(kvd_apikeys_lookup(k, "", 0));
	kvd_apikeys_free(k);

	ck_assert_int_eq(kvd_apikeys_parse(&k, "K", "short alice\n", 12, why, sizeof(why)), -1);
	ck_assert_ptr_nonnull(strstr(why, "K:1"));
	ck_assert_int_eq(kvd_apikeys_parse(&k, "K", "0123456789abcdef0123456789ABCDEF a\n0123456789abcdef0123456789ABCDEF b\n", 70,
					   why, sizeof(why)), -1);
	ck_assert_ptr_nonnull(strstr(why, "K:2: this key is listed twice"));
	ck_assert_int_eq(kvd_apikeys_parse(&k, "K", "0123456789abcdef0123456789ABCDEF bad/tenant\n", 44, why, sizeof(why)), -1);
	ck_assert_int_eq(kvd_apikeys_parse(&k, "K", "0123456789abcdef0123456789ABCDEF\n", 33, why, sizeof(why)), -1);
	ck_assert_int_eq(kvd_apikeys_parse(&k, "K", "# nothing\n", 10, why, sizeof(why)), -1);
	ck_assert_ptr_null(k);
}
END_TEST

static Suite *http_suite(void)
{
	Suite *s = suite_create("http");
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, test_wire_requests);
	tcase_add_test(tc, test_wire_bounds);
	tcase_add_test(tc, test_wire_if_none_match);
	tcase_add_test(tc, test_wire_origin);
	tcase_add_test(tc, test_origins);
	tcase_add_test(tc, test_openai_bodies);
	tcase_add_test(tc, test_openai_sampling);
	tcase_add_test(tc, test_openai_ignored);
	tcase_add_test(tc, test_openai_parts);
	tcase_add_test(tc, test_openai_responses);
	tcase_add_test(tc, test_apikeys);
	tcase_add_test(tc, test_apikeys_roles);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(http_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
