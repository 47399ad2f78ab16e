/* sink.h - where a request's answer goes (sink.c): the one
 * seam between the request machines and a client of either front.
 *
 * Private to the node's serving core (daemon/node/serve_int.h includes
 * it with the other objects' headers). Loop thread only.
 */
#pragma once

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>

#include "conf/list.h"
#include "gpu/sampler.h"
#include "gpu/text/tokenizer.h"

struct serve;
struct serve_req;
struct serve_sink;
struct link;

/* ---- sinks (sink.c) ------------------------------------------------------ */

/* What a finished request tells its client. */
struct serve_final_info {
	const char *reason;              /* "stop" | "length" */
	uint32_t prompt_tokens, output_tokens;
	uint32_t cached_tokens;          /* of prompt_tokens, from the cache */
	uint64_t ttft_us, total_us;
	const char *text;                /* the detokenizer's tail, (text_len) */
	size_t text_len;
};

/* A sink is where a request's answer goes: a msgpack client connection
 * (client.c) or an HTTP exchange (http.c). The machines answer through
 * serve__sink_* only and never learn which it is. The ops run on the loop
 * thread inside a request's state change: they queue bytes and must not
 * close a connection or call back into a request (defer that). */
struct serve_sink_ops {
	/* lp: the token's log-probabilities when the request asked for
	 * them and the node sampled it (gpu/sampler.h), else NULL */
	void (*token)(struct serve_sink *k, struct serve_req *r, uint32_t index,
		      int32_t token, const char *piece, size_t len,
		      const struct sampler_logprobs *lp);
	void (*final)(struct serve_sink *k, struct serve_req *r,
		      const struct serve_final_info *f);
	void (*error)(struct serve_sink *k, struct serve_req *r, int code,
		      const char *msg);
	/* r left k (after its answer, or gone); NULL: nothing to do */
	void (*detached)(struct serve_sink *k, struct serve_req *r);
};

struct serve_sink {
	const struct serve_sink_ops *ops;
	struct kvd_list reqs;            /* serve_req.sink_node, attached */
	uint32_t n_reqs;
};

/* sink.c: answering a request, whatever its client speaks. Each answer
 * goes at most once (final or error); tokens only before it; nothing goes
 * to a request whose sink left. */
void serve__sink_attach(struct serve_req *r, struct serve_sink *k);
void serve__sink_token(struct serve_req *r, int32_t token,
		       const struct sampler_logprobs *lp);
void serve__sink_final(struct serve_req *r, const char *reason);
void serve__sink_error(struct serve_req *r, int code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* r leaves its sink (DA_DETACH_CLIENT, the end of r); none: nothing. */
void serve__sink_detach(struct serve_req *r);
/* The client of k left: every request on it takes client_gone (orphaned,
 * invariant 8) and detaches. Not from inside a sink op. */
void serve__sink_gone(struct serve *s, struct serve_sink *k);
/* The same for one request (its client stopped wanting it: an HTTP stop
 * string matched). Not from inside a sink op. */
void serve__sink_leave(struct serve_req *r);
/* Start streaming: the detokenizer learns the prompt. */
int serve__sink_stream_begin(struct serve_req *r);
/* A client's prompt as ids for the model's tokenizer (s->tok), the same
 * for every front: the given ids (each inside the vocabulary) when
 * tokens is not NULL, else text tokenized (BOS as the vocabulary asks;
 * 1..PROTO_CLIENT_TOKENS_MAX ids); parse_special: text naming a control
 * token ("<|im_start|>", "</s>") becomes it (TOKENIZER_PARSE_SPECIAL;
 * /v1/completions under http.parse_special, as llama-server does - the
 * client may send those ids as tokens all the same), else it is text. 0 with *out malloc'd; 1 with a
 * sentence in msg (the client's error); -ENOMEM. Any thread (the
 * tokenizer is immutable): HTTP runs it on its preparation workers. */
int serve__sink_prompt_ids(const struct tokenizer *tok, const uint32_t *tokens,
			   uint32_t n_tokens, const char *text, size_t text_len,
			   bool parse_special, int32_t **out, uint32_t *n,
			   char *msg, size_t msg_size);
