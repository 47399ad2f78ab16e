/* sink.c - where a request's answer goes.
 *
 * Design. The request machines (decode.c) answer a client through four
 * calls - a token, the final, an error, detach - and never learn whether
 * the client is a msgpack connection (client.c) or an HTTP exchange
 * (http.c). What both need is done here once: the first-token time, the
 * output count, detokenizing (the detokenizer learns the prompt first, so
 * the leading-space rule is the one kvd generate uses), answering at most
 * once, and the request_done / request_failed lines with the tenant. What
 * differs (msgpack frames, SSE events or one JSON body) is the sink's ops.
 * A prompt becomes ids here too (serve__sink_prompt_ids), the same checks
 * for every front.
 *
 * Invariant 8 for every front alike: a client that leaves calls
 * serve__sink_gone, which gives each of its requests the machine's
 * client_gone event (orphaned: the transfer completes or aborts, then the
 * pages go back) and detaches it; later answers go nowhere.
 *
 * Below the roles: calls req.c only; the fronts reach it, it reaches the
 * fronts only through the ops.
 */
#include "daemon/node/serve_int.h"
#include "conf/util.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

int serve__sink_prompt_ids(const struct tokenizer *tok, const uint32_t *tokens,
			   uint32_t n_tokens, const char *text, size_t text_len,
			   bool parse_special, int32_t **out, uint32_t *n,
			   char *msg, size_t msg_size)
{
	uint32_t n_vocab = tokenizer_n_vocab(tok);
	int32_t *ids;
	size_t n_ids = 0;

	if (tokens) {
		ids = malloc(sizeof(*ids) * n_tokens);
		if (!ids)
			return -ENOMEM;
		for (uint32_t i = 0; i < n_tokens; i++) {
			if (tokens[i] >= n_vocab) {
				snprintf(msg, msg_size, "token id %u at %u is outside the vocabulary (%u)",
					 tokens[i], i, n_vocab);
				free(ids);
				return 1;
			}
			ids[i] = (int32_t)tokens[i];
		}
		*out = ids;
		*n = n_tokens;
		return 0;
	}
	if (tokenizer_encode_ex(tok, text, text_len,
				(tokenizer_add_bos(tok) ? TOKENIZER_ADD_BOS : 0) |
				(parse_special ? TOKENIZER_PARSE_SPECIAL : 0),
				&ids, &n_ids)) {
		snprintf(msg, msg_size, "the prompt cannot be tokenized");
		return 1;
	}
	if (n_ids == 0 || n_ids > PROTO_CLIENT_TOKENS_MAX) {
		free(ids);
		snprintf(msg, msg_size, "the prompt tokenizes to %zu tokens", n_ids);
		return 1;
	}
	*out = ids;
	*n = (uint32_t)n_ids;
	return 0;
}

void serve__sink_attach(struct serve_req *r, struct serve_sink *k)
{
	r->sink = k;
	k->n_reqs++;
	kvd_list_add_tail(&k->reqs, &r->sink_node);
}

int serve__sink_stream_begin(struct serve_req *r)
{
	const char *chunk;
	size_t len;
	int rc;

	if (r->dt_init)
		return 0;
	rc = detok_init(&r->dt, r->s->tok);
	if (rc)
		return rc;
	r->dt_init = true;
	/* the prompt's BOS sets the leading-space rule, as kvd generate does */
	for (uint32_t i = 0; i < r->n_prompt; i++)
		if (detok_push(&r->dt, r->prompt[i], &chunk, &len))
			break;
	return 0;
}

void serve__sink_token(struct serve_req *r, int32_t token,
		       const struct sampler_logprobs *lp)
{
	const char *chunk = "";
	size_t len = 0;
	uint64_t now = kvd_now_ns();
	bool first = !r->t_first_ns;

	if (first) {
		r->t_first_ns = now;
		serve__gate_first_token(r);   /* its prompt's pages are cached now */
	}
	kvd_metrics_token(&r->s->d->metrics, r->tenant, first, r->n_prompt,
			  first ? now - r->t_arrive_ns : now - r->t_last_ns);
	r->t_last_ns = now;
	r->n_out++;
	if (!r->sink || r->answered)
		return;
	if (r->dt_init && detok_push(&r->dt, token, &chunk, &len))
		len = 0;
	r->sink->ops->token(r->sink, r, r->n_out - 1, token, chunk, len, lp);
}

/* A decode request's other side, for its end line: the prefill node and
 * that node's id for the request (from prefill_done), so a grep for
 * either id finds both nodes' lines (prefill logs decode's as
 * remote_id); "" for a request computed here or before prefill_done. */
static const char *sink_peer(struct serve_req *r, char *buf, size_t size)
{
	buf[0] = 0;
	if (r->kind == SREQ_DECODE && sreq_d(r)->prefill_id)
		snprintf(buf, size, " prefill_node=%s prefill_id=%llu",
			 KVLOG_Q(sreq_d(r)->prefill_node),
			 (unsigned long long)sreq_d(r)->prefill_id);
	return buf;
}

void serve__sink_final(struct serve_req *r, const char *reason)
{
	char peer[320];
	struct serve_final_info f = { .reason = reason, .text = "" };
	uint64_t now = kvd_now_ns();

	if (r->answered)
		return;
	r->answered = true;
	f.prompt_tokens = r->n_prompt;
	f.cached_tokens = r->cached_tokens;
	f.output_tokens = r->n_out;
	f.ttft_us = r->t_first_ns ? (r->t_first_ns - r->t_arrive_ns) / 1000 : 0;
	f.total_us = (now - r->t_arrive_ns) / 1000;
	if (r->dt_init && detok_flush(&r->dt, &f.text, &f.text_len))
		f.text_len = 0;
	KVLOG_INFO(r->s->log, "request_done",
		   "id=%llu client_id=%llu tenant=%s kind=%s finish=%s prompt_tokens=%u cached_tokens=%u output_tokens=%u ttft_us=%llu total_us=%llu%s",
		   (unsigned long long)r->reg.id,
		   (unsigned long long)r->client_id, KVLOG_Q(r->tenant),
		   r->reg.ops ? r->reg.ops->kind : "?",
		   reason, r->n_prompt, r->cached_tokens, r->n_out,
		   (unsigned long long)f.ttft_us, (unsigned long long)f.total_us,
		   sink_peer(r, peer, sizeof(peer)));
	if (r->sink)
		r->sink->ops->final(r->sink, r, &f);
}

/* The bucket of a request_failed line: a client can make the refusals
 * at will (a prompt too long, a bad request, a full or draining node);
 * an integrity failure, a timeout or an internal error is logged every
 * time. */
static struct kvd_ratelimit *sink_err_rl(struct serve *s, int code)
{
	switch (code) {
	case PROTO_ERR_PROMPT_TOO_LONG:
	case PROTO_ERR_INVALID_REQUEST:
	case PROTO_ERR_OVERLOADED:
	case PROTO_ERR_DRAINING:
		return &s->rl[SERVE_RL_CLIENT_REFUSED];
	default:
		return NULL;
	}
}

void serve__sink_error(struct serve_req *r, int code, const char *fmt, ...)
{
	char msg[PROTO_CLIENT_MSG_MAX + 1], peer[320];
	va_list ap;

	if (r->answered)
		return;
	r->answered = true;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	KVLOG_RL_WARN(r->s->log, sink_err_rl(r->s, code), "request_failed",
		   "id=%llu client_id=%llu tenant=%s code=%s output_tokens=%u%s msg=%s",
		   (unsigned long long)r->reg.id,
		   (unsigned long long)r->client_id, KVLOG_Q(r->tenant),
		   proto_err_name(code), r->n_out, sink_peer(r, peer, sizeof(peer)),
		   KVLOG_Q(msg));
	if (r->sink)
		r->sink->ops->error(r->sink, r, code, msg);
}

void serve__sink_detach(struct serve_req *r)
{
	struct serve_sink *k = r->sink;

	if (!k)
		return;
	k->n_reqs--;
	r->sink = NULL;
	kvd_list_del(&r->sink_node);
	if (k->ops->detached)
		k->ops->detached(k, r);
}

void serve__sink_leave(struct serve_req *r)
{
	if (!r->sink)
		return;
	if (!r->answered) {
		r->client_left = true;
		KVLOG_INFO(r->s->log, "client_gone",
			   "id=%llu client_id=%llu tenant=%s state=%s",
			   (unsigned long long)r->reg.id,
			   (unsigned long long)r->client_id, KVLOG_Q(r->tenant),
			   machine_state_name(&dreq_machine, r->state));
	}
	r->rops->client_gone(r);
	serve__sink_detach(r);
}

void serve__sink_gone(struct serve *s, struct serve_sink *k)
{
	struct kvd_list *pos, *nxt;

	(void)s;
	/* a request leaving may end (and detach) itself, never another one */
	kvd_list_for_each_safe(pos, nxt, &k->reqs)
		serve__sink_leave(kvd_list_entry(pos, struct serve_req, sink_node));
}
