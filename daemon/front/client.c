/* client.c - the client API on decode and standalone nodes.
 *
 * Design. A client connection is a frame decoder and a list of requests
 * that still point at it. Each request frame goes through the same gate,
 * in this order, and the first refusal is the answer (invariant 3: before
 * any page is touched):
 *   1. the frame parses (INVALID_REQUEST with the parser's sentence);
 *   2. the node admits new work at all (DRAINING);
 *   3. the prompt tokenizes and every id is in the vocabulary (a text
 *      prompt over CLIENT_PROMPT_INLINE_MAX bytes is tokenized on the
 *      preparation workers, off the loop, serve->prep: a long one never
 *      stalls another tenant's stream; shorter ones, well under a
 *      millisecond each, and ids are done here);
 *   4. prompt + max_tokens fits the smallest context and pool on the
 *      request's path (PROMPT_TOO_LONG, logged with the figures);
 *   5. only then pages are reserved (OVERLOADED when the pool is full).
 * Steps 4 and 5 are the role's (serve->admit: decode.c's
 * serve__decode_admit or serve__local_admit); standalone requests go to
 * the local engine with engine-owned pages.
 *
 * A client that goes away orphans its requests (invariant 8): nothing is
 * cut mid-transfer; the request runs its transfer to completion or abort,
 * then its pages are released and it ends as failed. A request answers
 * its client exactly once (final or error); token events only come before.
 * The connection is its requests' sink (sink.c): the machines answer
 * through serve__sink_*, which reach the frames below through
 * client_sink_ops; the HTTP front (http.c) is the other sink.
 */
#include "daemon/front/front_int.h"
#include "conf/util.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

/* Text prompts up to this many bytes are tokenized on the loop (well
 * under a millisecond; at most 16 of them per 64 KiB read); longer ones
 * on the preparation workers, whose per-tenant bound (8 being prepared)
 * would otherwise refuse a burst of short ones. */
#define CLIENT_PROMPT_INLINE_MAX 4096u

/* ---- sending events ---------------------------------------------------------- */

/* Every frame to a client goes through its wbound (invariant 11). A
 * write past the hard bound or a failed write does not close here: the
 * callers are in the middle of a request's state change, so the
 * connection is doomed (nothing more is written or read) and the sweep
 * closes it, orphaning its requests as a disconnect does. */
static void client_doom(struct client_conn *c, const char *reason)
{
	if (c->doom || c->closing)
		return;
	c->doom = reason;
	wbound_read_stop(&c->wb);
}

/* A write that failed later, in its callback (the client is gone: its
 * socket answered with a reset) dooms the connection too - so a killed
 * client is noticed at its first failed answer, not only at EOF, which
 * looks the same as a half-close. */
static void client_written(struct wbound *wb, int status)
{
	struct client_conn *c = kvd_container_of(wb, struct client_conn, wb);

	if (status < 0)
		client_doom(c, serve__write_failed(status));
}

static void client_write(struct client_conn *c, char *data, size_t len)
{
	int rc;

	if (c->closing || c->doom) {
		free(data);
		return;
	}
	rc = wbound_write(&c->wb, data, len);
	if (rc == WBOUND_E_HARD)
		client_doom(c, "write_queue_hard");
	else if (rc)
		client_doom(c, serve__write_failed(rc));
}

static void client_send(struct client_conn *c, struct frame_writer *w)
{
	char *data;
	size_t len;

	if (frame_writer_finish(w, PROTO_CLIENT_FRAME_MAX, &data, &len) == 0)
		client_write(c, data, len);
	frame_writer_deinit(w);
}

static void client_error_to(struct client_conn *c, uint64_t id, int code,
			    const char *msg)
{
	char *data;
	size_t len;

	if (proto_client_frame_error(id, code, msg, &data, &len) == 0)
		client_write(c, data, len);
}

/* An error that belongs to no request (a frame that is not a map, the
 * connection limit): its own event type, never an error for id 0. */
static void client_frame_error_to(struct client_conn *c, int code,
				  const char *msg)
{
	char *data;
	size_t len;

	if (proto_client_frame_conn_error(code, msg, &data, &len) == 0)
		client_write(c, data, len);
}

static void client_conn_end(struct client_conn *c);

/* ---- the connection as a sink (sink.c calls these) ---------------------------- */

static struct client_conn *client_of(struct serve_sink *k)
{
	return kvd_container_of(k, struct client_conn, sink);
}

static void client_sink_token(struct serve_sink *k, struct serve_req *r,
			      uint32_t index, int32_t token, const char *piece,
			      size_t len, const struct sampler_logprobs *lp)
{
	struct frame_writer w;

	/* lp: only for a request that asked (its logprobs) */
	frame_writer_init(&w);
	proto_client_pack_token(frame_writer_packer(&w), r->client_id, index,
				(uint32_t)token, piece,
				(uint32_t)KVD_MIN(len, PROTO_CLIENT_PIECE_MAX), lp);
	client_send(client_of(k), &w);
}

static void client_sink_final(struct serve_sink *k, struct serve_req *r,
			      const struct serve_final_info *fi)
{
	struct proto_client_final f = { 0 };
	struct frame_writer w;

	snprintf(f.finish_reason, sizeof(f.finish_reason), "%s", fi->reason);
	f.prompt_tokens = fi->prompt_tokens;
	f.cached_tokens = fi->cached_tokens;
	f.output_tokens = fi->output_tokens;
	f.ttft_us = fi->ttft_us;
	f.total_us = fi->total_us;
	f.text_len = (uint32_t)KVD_MIN(fi->text_len, sizeof(f.text));
	memcpy(f.text, fi->text, f.text_len);
	frame_writer_init(&w);
	proto_client_pack_final(frame_writer_packer(&w), r->client_id, &f);
	client_send(client_of(k), &w);
}

static void client_sink_error(struct serve_sink *k, struct serve_req *r,
			      int code, const char *msg)
{
	client_error_to(client_of(k), r->client_id, code, msg);
}

/* Requests on it, or text prompts of it being tokenized. */
static bool client_busy(const struct client_conn *c)
{
	return c->sink.n_reqs || !kvd_list_empty(&c->preps);
}

/* a half-closed client had its last answer: flush, then close */
static void client_sink_detached(struct serve_sink *k, struct serve_req *r)
{
	struct client_conn *c = client_of(k);

	(void)r;
	if (c->eof && !client_busy(c))
		client_conn_end(c);
}

static const struct serve_sink_ops client_sink_ops = {
	.token = client_sink_token,
	.final = client_sink_final,
	.error = client_sink_error,
	.detached = client_sink_detached,
};

/* ---- admission ---------------------------------------------------------------- */

static void client_reject(struct client_conn *c, uint64_t id, int code,
			  enum kvd_reject why, const char *msg)
{
	struct serve *s = c->s;

	if (why < KVD_REJECT__N)
		s->d->counters.rejected[why]++;
	/* refused before it became a request: no latency to observe */
	kvd_metrics_request_end(&s->d->metrics, c->tenant, NULL, code, 0);
	KVLOG_RL_WARN(s->log, &s->rl[SERVE_RL_CLIENT_REFUSED], "request_rejected", "client_id=%llu tenant=%s code=%s msg=%s",
		   (unsigned long long)id, KVLOG_Q(c->tenant), proto_err_name(code),
		   KVLOG_Q(msg));
	client_error_to(c, id, code, msg);
}

/* A logit_bias id outside the vocabulary is the request's
 * INVALID_REQUEST. true when so (refused). */
static bool client_bias_outside(struct client_conn *c,
				const struct proto_client_request *q)
{
	char msg[128];

	if (!proto_client_bias_outside(q, tokenizer_n_vocab(c->s->tok), msg, sizeof(msg)))
		return false;
	client_reject(c, q->id, PROTO_ERR_INVALID_REQUEST, KVD_REJECT_INVALID, msg);
	return true;
}

/* The prompt's ids are known: a request, to the tenant's queue. Takes
 * q (deinit here) and ids. */
static void client_admit(struct client_conn *c, struct proto_client_request *q,
			 int32_t *ids, uint32_t n_ids)
{
	struct serve *s = c->s;
	struct serve_req *r;

	if (client_bias_outside(c, q)) {
		free(ids);
		proto_client_request_deinit(q);
		return;
	}
	r = serve__req_new(s, s->d->cfg.role == KVD_ROLE_DECODE ? SREQ_DECODE
							  : SREQ_LOCAL);
	if (!r) {
		free(ids);
		client_reject(c, q->id, PROTO_ERR_INTERNAL, KVD_REJECT__N,
			      "out of memory");
		proto_client_request_deinit(q);
		return;
	}
	serve__sink_attach(r, &c->sink);
	r->client_id = q->id;
	snprintf(r->tenant, sizeof(r->tenant), "%s", c->tenant);
	r->lim = c->lim;
	snprintf(r->cache_salt, sizeof(r->cache_salt), "%s", q->cache_salt);
	r->prompt = ids;
	r->n_prompt = n_ids;
	r->max_tokens = q->max_tokens;
	/* the bias array moves to the request (freed with it) */
	r->sp = proto_client_request_sampling(q);
	r->bias = q->bias;
	q->bias = NULL;
	q->n_bias = 0;
	proto_client_request_deinit(q);
	serve__gate_admit(r);   /* the tenant's queue, then the role's admission */
}

/* A text prompt being tokenized on a preparation worker (daemon/front/prep.h).
 * c is NULL once its connection closed (the job is then cancelled and
 * frees itself in client_prep_done). */
struct client_prep {
	struct prep_job job;             /* key: the connection's tenant */
	struct client_conn *c;
	struct kvd_list node;            /* client_conn.preps */
	struct serve *s;                 /* outlives the pool */
	const struct tokenizer *tok;     /* lives until prep_stop */
	struct proto_client_request q;   /* owned: deinit at the end */
	int32_t *ids;                    /* (n_ids) the result, or NULL */
	uint32_t n_ids;
	int rc;                          /* serve__sink_prompt_ids' */
	char msg[PROTO_CLIENT_MSG_MAX];
};

/* Worker thread: the tokenizer is immutable, q is the job's own. */
static void client_prep_run(struct prep_job *j)
{
	struct client_prep *cp = kvd_container_of(j, struct client_prep, job);

	cp->rc = serve__sink_prompt_ids(cp->tok, NULL, 0, cp->q.prompt,
					strlen(cp->q.prompt), false, &cp->ids, &cp->n_ids,
					cp->msg, sizeof(cp->msg));
}

/* Loop thread: tokenized (or cancelled). The node may have begun to
 * drain meanwhile: checked again, as the frame was. */
static void client_prep_done(struct prep_job *j, bool cancelled)
{
	struct client_prep *cp = kvd_container_of(j, struct client_prep, job);
	struct client_conn *c = cp->c;
	struct serve *s = cp->s;

	if (c)
		kvd_list_del(&cp->node);
	if (cancelled || !c || c->closing) {
		free(cp->ids);
	} else if (cp->rc) {
		free(cp->ids);
		client_reject(c, cp->q.id, PROTO_ERR_INVALID_REQUEST, KVD_REJECT_INVALID,
			      cp->rc < 0 ? "out of memory" : cp->msg);
	} else if (kvd_request_gate(s->reqtab) || s->stopping) {
		free(cp->ids);
		client_reject(c, cp->q.id, PROTO_ERR_DRAINING, KVD_REJECT_DRAINING,
			      "the node is draining and admits no new requests");
	} else {
		client_admit(c, &cp->q, cp->ids, cp->n_ids);   /* takes q, ids */
		free(cp);
		if (c->eof && !client_busy(c))
			client_conn_end(c);
		return;
	}
	proto_client_request_deinit(&cp->q);
	free(cp);
	if (c && !c->closing && c->eof && !client_busy(c))
		client_conn_end(c);
}

/* A text prompt goes to the preparation workers; OVERLOADED (nothing
 * queued) past their bounds. Takes q. */
static void client_prep_submit(struct client_conn *c, struct proto_client_request *q)
{
	struct serve *s = c->s;
	struct client_prep *cp = calloc(1, sizeof(*cp));
	int rc;

	if (!cp) {
		client_reject(c, q->id, PROTO_ERR_INTERNAL, KVD_REJECT__N, "out of memory");
		proto_client_request_deinit(q);
		return;
	}
	cp->c = c;
	cp->s = s;
	cp->tok = s->tok;
	cp->q = *q;
	snprintf(cp->job.key, sizeof(cp->job.key), "%s", c->tenant);
	cp->job.bytes = strlen(q->prompt);
	cp->job.run = client_prep_run;
	cp->job.done = client_prep_done;
	rc = prep_submit(&s->front->prep, &cp->job);
	if (rc) {
		proto_client_request_deinit(&cp->q);
		free(cp);
		/* one sentence for both bounds (rc): whether the others'
		 * work filled the pool is not this tenant's to learn */
		(void)rc;
		client_reject(c, q->id, PROTO_ERR_OVERLOADED, KVD_REJECT_OVERLOADED,
			      "too many prompts are being tokenized; retry later");
		return;
	}
	kvd_list_add_tail(&c->preps, &cp->node);
}

/* The connection closes: its prompts still being tokenized are dropped. */
static void client_prep_cancel_all(struct client_conn *c)
{
	while (!kvd_list_empty(&c->preps)) {
		struct client_prep *cp = kvd_list_entry(c->preps.next, struct client_prep, node);

		kvd_list_del(&cp->node);
		cp->c = NULL;
		prep_cancel(&cp->job);
	}
}

static void client_request(struct client_conn *c, const msgpack_object *map)
{
	struct serve *s = c->s;
	struct proto_client_request q;
	struct frame_error err = { 0 };
	char msg[PROTO_CLIENT_MSG_MAX];
	int32_t *ids = NULL;
	uint32_t n_ids = 0;
	uint64_t id = 0;
	const msgpack_object *ido = frame_map_get(map, "id");
	int rc;

	rc = proto_client_request_parse(map, &q, &err);
	if (rc) {
		const char *why = rc < 0 ? "out of memory" : err.msg;

		/* answer the request when it named itself; a frame without a
		 * usable id is the connection's error, not id 0's */
		if (ido && frame_obj_u64(ido, &id) == 0) {
			client_reject(c, id, PROTO_ERR_INVALID_REQUEST,
				      KVD_REJECT_INVALID, why);
		} else {
			s->d->counters.rejected[KVD_REJECT_INVALID]++;
			KVLOG_RL_WARN(s->log, &s->rl[SERVE_RL_CLIENT_REFUSED], "client_frame_error",
				   "conn=%llu code=INVALID_REQUEST msg=\"%s\"",
				   (unsigned long long)c->conn_id, why);
			client_frame_error_to(c, PROTO_ERR_INVALID_REQUEST, why);
		}
		return;
	}
	if (kvd_request_gate(s->reqtab) || s->stopping) {
		client_reject(c, q.id, PROTO_ERR_DRAINING, KVD_REJECT_DRAINING,
			      "the node is draining and admits no new requests");
		proto_client_request_deinit(&q);
		return;
	}
	if (!q.tokens && q.prompt && strlen(q.prompt) > CLIENT_PROMPT_INLINE_MAX) {
		client_prep_submit(c, &q);   /* text: tokenized off the loop */
		return;
	}
	rc = serve__sink_prompt_ids(s->tok, q.tokens, q.n_tokens, q.prompt,
				    q.prompt ? strlen(q.prompt) : 0, false, &ids, &n_ids,
				    msg, sizeof(msg));
	if (rc) {
		client_reject(c, q.id, PROTO_ERR_INVALID_REQUEST, KVD_REJECT_INVALID,
			      rc < 0 ? "out of memory" : msg);
		proto_client_request_deinit(&q);
		return;
	}
	client_admit(c, &q, ids, n_ids);
}

static void client_unpend(struct client_conn *c)
{
	serve__pending_del(&c->pend);
}

/* The first frame when a keys file is set: {type:auth, key}. A good key
 * names the connection's tenant (auth_ok); anything else is a
 * frame_error and the end of the connection. */
static void client_auth(struct client_conn *c, const msgpack_object *map)
{
	struct serve *s = c->s;
	struct frame_error err = { 0 };
	char key[PROTO_CLIENT_KEY_MAX + 1];
	const struct kvd_apikey_info *k = NULL;
	char *data;
	size_t len;

	if (proto_client_auth_parse(map, key, &err) == 0) {
		k = kvd_apikeys_find(s->keys, key, strlen(key));
		if (!k)
			snprintf(err.msg, sizeof(err.msg), "invalid API key");
	}
	memset(key, 0, sizeof(key));
	if (!k) {
		s->d->counters.rejected[KVD_REJECT_INVALID]++;
		kvd_metrics_request_end(&s->d->metrics, KVD_TENANT_DEFAULT, NULL,
					PROTO_ERR_INVALID_REQUEST, 0);
		KVLOG_RL_WARN(s->log, &s->rl[SERVE_RL_CLIENT_REFUSED], "client_auth_failed",
			      "conn=%llu msg=%s", (unsigned long long)c->conn_id,
			      KVLOG_Q(err.msg));
		client_frame_error_to(c, PROTO_ERR_INVALID_REQUEST, err.msg);
		client_conn_end(c);
		return;
	}
	c->authed = true;
	client_unpend(c);
	snprintf(c->tenant, sizeof(c->tenant), "%s", k->tenant);
	c->lim = k->lim;
	KVLOG_DEBUG(s->log, "client_auth", "conn=%llu tenant=%s",
		    (unsigned long long)c->conn_id, KVLOG_Q(c->tenant));
	if (proto_client_frame_auth_ok(c->tenant, &data, &len) == 0)
		client_write(c, data, len);
}

/* ---- connections ---------------------------------------------------------------- */

/* The bounds of one connection (invariant 11), all judged by one sweep
 * timer in the serving layer instead of a timer per connection:
 *   - writes go through c->wb: past write_queue_soft reading stops, past
 *     write_queue_hard (or past soft for write_stall_timeout_ms) the
 *     connection closes;
 *   - a frame that began (and the first frame of a connection) must be
 *     whole within client_read_timeout_ms (slowloris);
 *   - a connection with no request in flight that sends nothing for
 *     client_idle_timeout_ms is closed;
 *   - a new connection is pending until it authenticated (a keys file:
 *     its first frame is {type:auth, key}) or sent its first frame
 *     (keyless); at max_clients the oldest pending one is closed to make
 *     room, so silent or keyless connections never keep a client out;
 *     with none pending, the new connection gets one frame_error
 *     OVERLOADED and is closed.
 * A client that half-closes keeps its connection until every request on
 * it has been answered; then kvd flushes and closes it. */

static void client_conn_closed(uv_handle_t *h)
{
	struct client_conn *c = h->data;
	struct serve *s = c->s;

	frame_decoder_deinit(&c->dec);
	free(c);
	s->closes_pending--;
}

static void client_conn_close(struct client_conn *c)
{
	struct serve *s = c->s;

	if (c->closing)
		return;
	c->closing = true;
	c->eof = false;   /* no shutdown from the detaches below */
	client_prep_cancel_all(c);
	serve__sink_gone(s, &c->sink);
	kvd_list_del(&c->node);
	client_unpend(c);
	if (c->counted)
		s->front->n_clients--;
	if (c->refusing)
		s->front->n_client_refusing--;
	s->closes_pending++;
	uv_close(&c->h.handle, client_conn_closed);
}

/* Closed for a bound: one line an operator can grep and count. */
static void client_conn_close_for(struct client_conn *c, const char *reason)
{
	KVLOG_RL(c->s->log, &c->s->rl[SERVE_RL_CLIENT_CONN],
		 serve__closed_level(reason), "client_closed",
		   "conn=%llu reason=%s requests=%u queued=%zu peak_queued=%llu",
		   (unsigned long long)c->conn_id, reason, c->sink.n_reqs,
		   wbound_queued(&c->wb), (unsigned long long)c->wb.peak);
	client_conn_close(c);
}

static void client_shutdown_cb(uv_shutdown_t *req, int status)
{
	struct client_conn *c = req->data;

	(void)status;   /* flushed or failed: the connection is done either way */
	c->shutting = false;
	client_conn_close(c);
}

/* Stop reading, flush what is queued, then close (requests still on the
 * connection are orphaned then). Safe from any state change: the close
 * happens in a later callback. */
static void client_conn_end(struct client_conn *c)
{
	if (c->closing || c->shutting || c->doom)
		return;
	wbound_read_stop(&c->wb);
	c->shut.data = c;
	if (uv_shutdown(&c->shut, &c->h.stream, client_shutdown_cb) == 0)
		c->shutting = true;
	else
		client_doom(c, "write_failed");
}

void serve__client_sweep(struct serve *s)
{
	const struct kvd_config *cfg = &s->d->cfg;
	uint64_t now = kvd_now_ns();
	uint64_t read_ns = (uint64_t)cfg->client_read_timeout_ms * 1000000u;
	uint64_t idle_ns = (uint64_t)cfg->client_idle_timeout_ms * 1000000u;
	struct kvd_list *pos, *nxt;

	kvd_list_for_each_safe(pos, nxt, &s->front->clients) {
		struct client_conn *c = kvd_list_entry(pos, struct client_conn, node);
		int rc;

		if (c->closing)
			continue;
		if (c->refusing) {
			if (now - c->t_rx_ns >= CLIENT_REFUSE_DRAIN_MS * 1000000ull)
				client_conn_close(c);
			continue;
		}
		if (c->doom) {
			client_conn_close_for(c, c->doom);
			continue;
		}
		rc = wbound_poll(&c->wb, now);
		if (rc) {
			client_conn_close_for(c, rc == WBOUND_E_HARD ?
					      "write_queue_hard" : "write_stall");
			continue;
		}
		if (c->shutting || c->eof || c->wb.paused)
			continue;   /* waiting on the client's reading, not its writing */
		if (c->t_frame_ns && now - c->t_frame_ns >= read_ns)
			client_conn_close_for(c, "read_timeout");
		else if (!c->t_frame_ns && !client_busy(c) &&
			 now - c->t_rx_ns >= idle_ns)
			client_conn_close_for(c, "idle_timeout");
	}
}

static void client_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf)
{
	struct client_conn *c = h->data;

	(void)hint;
	*buf = uv_buf_init(c->rbuf, sizeof(c->rbuf));
}

/* The client sent EOF: answer what is in flight, then close. */
static void client_eof(struct client_conn *c)
{
	c->eof = true;
	if (!client_busy(c))
		client_conn_end(c);   /* answers already queued still go out */
	else
		wbound_read_stop(&c->wb);
}

static void client_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
	struct client_conn *c = st->data;
	const char *p = buf->base;
	size_t n = nread > 0 ? (size_t)nread : 0;
	bool whole = false;   /* a frame completed in this read */

	if (c->refusing) {
		/* refused: what it still sends is dropped, so closing with
		 * unread bytes does not reset the frame_error away */
		if (nread < 0)
			client_conn_close(c);
		return;
	}
	if (nread == UV_EOF) {
		client_eof(c);
		return;
	}
	if (nread < 0) {
		client_conn_close(c);
		return;
	}
	if (n)
		c->t_rx_ns = kvd_now_ns();
	while (n > 0 && !c->closing && !c->doom) {
		size_t used;
		int rc = frame_decoder_feed(&c->dec, p, n, &used);

		if (rc) {
			client_conn_close(c);
			return;
		}
		p += used;
		n -= used;
		for (;;) {
			const msgpack_object *map;

			rc = frame_decoder_next(&c->dec, &map);
			if (rc == FRAME_E_AGAIN)
				break;
			whole = true;
			if (rc == 0 && !c->authed) {
				client_auth(c, map);
			} else if (rc == 0) {
				client_unpend(c);   /* keyless: its first frame */
				client_request(c, map);
			} else if (rc == FRAME_E_MALFORMED || rc == FRAME_E_NOTMAP) {
				client_frame_error_to(c, PROTO_ERR_INVALID_REQUEST,
						      "the frame is not one msgpack map");
			} else {
				client_frame_error_to(c, PROTO_ERR_INVALID_REQUEST,
						      "frame too big; closing");
				client_conn_end(c);
				return;
			}
			if (c->closing || c->doom)
				return;
		}
	}
	/* the read timeout runs from the first byte of an incomplete frame */
	if (frame_decoder_pending(&c->dec) == 0)
		c->t_frame_ns = whole ? 0 : c->t_frame_ns;
	else if (whole || !c->t_frame_ns)
		c->t_frame_ns = c->t_rx_ns;
}

static void client_refuse_shut_cb(uv_shutdown_t *req, int status)
{
	struct client_conn *c = req->data;

	if (status < 0 && !c->closing)
		client_conn_close(c);
}

/* Past max_clients (or evicted): one frame_error OVERLOADED, written now
 * without queueing (a few dozen bytes into a new socket's empty buffer),
 * its slot given back at once, then our FIN; what the client still
 * sends (a request it wrote before reading) is read and dropped until
 * its EOF or CLIENT_REFUSE_DRAIN_MS, so it reads the refusal instead of a
 * reset. Past CLIENT_REFUSING_MAX such connections the fd closes at
 * once, so a burst of refusals never holds many descriptors. */
static void client_refuse(struct client_conn *c)
{
	struct serve *s = c->s;
	char *data;
	size_t len;

	if (proto_client_frame_conn_error(PROTO_ERR_OVERLOADED,
					  "the node holds its maximum of client connections (listen.max_clients); retry later",
					  &data, &len) == 0) {
		uv_buf_t b = uv_buf_init(data, (unsigned)len);

		(void)uv_try_write(&c->h.stream, &b, 1);   /* best effort */
		free(data);
	}
	client_unpend(c);
	if (c->counted) {
		c->counted = false;
		s->front->n_clients--;
	}
	if (s->front->n_client_refusing >= CLIENT_REFUSING_MAX || c->sink.n_reqs) {
		client_conn_close(c);
		return;
	}
	c->refusing = true;
	s->front->n_client_refusing++;
	c->t_rx_ns = kvd_now_ns();
	c->shut.data = c;
	if (uv_shutdown(&c->shut, &c->h.stream, client_refuse_shut_cb) ||
	    wbound_read_start(&c->wb))
		client_conn_close(c);
}

/* A connection that has not authenticated (or, keyless, sent a frame)
 * closes to make room for a new one (serve__pending_evict). */
static void client_evict(struct serve_pending *p)
{
	struct client_conn *c = kvd_container_of(p, struct client_conn, pend);

	KVLOG_RL_WARN(c->s->log, &c->s->rl[SERVE_RL_CLIENT_CONN], "client_closed",
		      "conn=%llu reason=evicted_unauthenticated",
		      (unsigned long long)c->conn_id);
	client_refuse(c);   /* one frame_error OVERLOADED, then closed */
}

static void client_accept(uv_stream_t *server, int status)
{
	struct client_listener *l = server->data;
	struct serve *s = l->s;
	const struct kvd_config *cfg = &s->d->cfg;
	struct wbound_limits lim = { .soft = cfg->write_queue_soft,
				     .hard = cfg->write_queue_hard,
				     .stall_ms = cfg->write_stall_timeout_ms };
	struct client_conn *c;
	int rc;

	if (status < 0) {
		/* EMFILE/ENFILE: libuv already closed the pending connections
		 * with its reserved fd (uv__emfile_trick); nothing to accept */
		KVLOG_WARN(s->log, "client_accept_failed", "error=%s",
			   uv_err_name(status));
		return;
	}
	c = s->stopping ? NULL : calloc(1, sizeof(*c));
	if (!c) {
		serve__accept_drop(s, server);
		return;
	}
	c->s = s;
	rc = l->is_pipe ? uv_pipe_init(&s->d->loop, &c->h.pipe, 0)
			: uv_tcp_init(&s->d->loop, &c->h.tcp);
	if (rc) {
		free(c);
		serve__accept_drop(s, server);
		return;
	}
	c->h.handle.data = c;
	c->conn_id = ++s->next_conn_id;
	c->t_rx_ns = c->t_frame_ns = kvd_now_ns();
	frame_decoder_init(&c->dec, PROTO_CLIENT_FRAME_MAX);
	wbound_init(&c->wb, &c->h.stream, &lim, client_alloc, client_read);
	wbound_on_write(&c->wb, client_written);
	c->sink.ops = &client_sink_ops;
	kvd_list_init(&c->sink.reqs);
	kvd_list_init(&c->preps);
	kvd_list_add(&s->front->clients, &c->node);
	if (uv_accept(server, &c->h.stream)) {
		client_conn_close(c);
		return;
	}
	if (!l->is_pipe)
		uv_tcp_nodelay(&c->h.tcp, 1);
	if (s->front->n_clients >= s->front->max_clients && !serve__pending_evict(s)) {
		KVLOG_RL_WARN(s->log, &s->rl[SERVE_RL_CLIENT_FULL], "client_refused",
			   "conn=%llu reason=max_clients max_clients=%u",
			   (unsigned long long)c->conn_id, s->front->max_clients);
		client_refuse(c);
		return;
	}
	c->counted = true;
	s->front->n_clients++;
	serve__pending_add(s, &c->pend, client_evict);
	c->authed = !s->keys;
	snprintf(c->tenant, sizeof(c->tenant), "%s", KVD_TENANT_DEFAULT);
	if (wbound_read_start(&c->wb))
		client_conn_close(c);
}

/* File descriptors: kvd raises its soft RLIMIT_NOFILE to the hard limit
 * and clamps max_clients so that the clients leave room for everything
 * else: the admin socket and its clients (ADMIN_CLIENTS_MAX in
 * ctl/admin.h, 64, + the listener), peer connections (control and data
 * per prefill peer), and a base for the model, the log, the loop's own
 * fds and libuv's spare fd for EMFILE. */
#define SERVE_FD_RESERVE_BASE 32u
/* Connections the kernel completes before kvd accepts them: a burst past
 * max_clients is refused at once instead of waiting out SYN retries. */
#define SERVE_CLIENT_BACKLOG 511
#define SERVE_FD_RESERVE_ADMIN 66u

void serve__client_limits(struct serve *s)
{
	const struct kvd_config *cfg = &s->d->cfg;
	uint64_t reserve = SERVE_FD_RESERVE_BASE + SERVE_FD_RESERVE_ADMIN +
			   2ull * cfg->n_peers_prefill;
	uint64_t cur, avail;
	struct rlimit rl;

	s->front->max_clients = cfg->max_clients;
	if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
		return;
	if (rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		(void)setrlimit(RLIMIT_NOFILE, &rl);
		(void)getrlimit(RLIMIT_NOFILE, &rl);
	}
	cur = rl.rlim_cur == RLIM_INFINITY ? UINT32_MAX : rl.rlim_cur;
	avail = cur > reserve ? cur - reserve : 0;
	if (avail >= s->front->max_clients) {
		KVLOG_INFO(s->log, "client_limits",
			   "max_clients=%u nofile=%llu reserve=%llu",
			   s->front->max_clients, (unsigned long long)cur,
			   (unsigned long long)reserve);
		return;
	}
	s->front->max_clients = (uint32_t)KVD_MAX(avail, 1);
	KVLOG_WARN(s->log, "client_limits",
		   "max_clients=%u configured=%u nofile=%llu reserve=%llu msg=\"listen.max_clients clamped to the file descriptor limit\"",
		   s->front->max_clients, cfg->max_clients, (unsigned long long)cur,
		   (unsigned long long)reserve);
}

static int client_listen_one(struct serve *s, const char *spec)
{
	struct client_listener *l;
	struct sockaddr_storage ss;
	int rc;

	if (s->front->n_listeners >= KVD_ARRAY_SIZE(s->front->listeners))
		return -ENOSPC;
	l = &s->front->listeners[s->front->n_listeners];
	memset(l, 0, sizeof(*l));
	l->s = s;
	if (!strncmp(spec, "unix:", 5)) {
		l->is_pipe = true;
		snprintf(l->path, sizeof(l->path), "%s", spec + 5);
		rc = uv_pipe_init(&s->d->loop, &l->h.pipe, 0);
		if (rc)
			return rc;
		s->front->n_listeners++;
		l->h.handle.data = l;
		rc = kvd_unix_claim(l->path);
		if (!rc)
			rc = uv_pipe_bind(&l->h.pipe, l->path);
		if (rc) {
			/* not ours: close_all must not remove it */
			KVLOG_ERR(s->log, "listen_client", "addr=%s msg=%s", KVLOG_Q(spec),
				  KVLOG_Q(rc == -EADDRINUSE ?
					      "socket in use by a live process (another kvd?)" :
					  rc == -EEXIST ? "path exists and is not a socket" :
					  uv_strerror(rc)));
			l->path[0] = 0;
			return rc;
		}
	} else {
		rc = serve__parse_hostport(spec, &ss);
		if (rc) {
			KVLOG_ERR(s->log, "listen_client", "addr=%s msg=\"bad address\"",
				  KVLOG_Q(spec));
			return rc;
		}
		rc = uv_tcp_init(&s->d->loop, &l->h.tcp);
		if (rc)
			return rc;
		s->front->n_listeners++;
		l->h.handle.data = l;
		rc = uv_tcp_bind(&l->h.tcp, (struct sockaddr *)&ss, 0);
	}
	if (!rc)
		rc = uv_listen(&l->h.stream, SERVE_CLIENT_BACKLOG, client_accept);
	if (rc)
		KVLOG_ERR(s->log, "listen_client", "addr=%s msg=%s", KVLOG_Q(spec),
			  KVLOG_Q(uv_strerror(rc)));
	else
		KVLOG_INFO(s->log, "listen_client", "addr=%s", KVLOG_Q(spec));
	return rc;
}

int serve__client_listen(struct serve *s)
{
	char list[sizeof(s->d->cfg.listen_client)], *save = NULL, *tok;
	int rc = 0;

	serve__client_limits(s);
	snprintf(list, sizeof(list), "%s", s->d->cfg.listen_client);
	for (tok = strtok_r(list, ",", &save); tok && !rc;
	     tok = strtok_r(NULL, ",", &save)) {
		while (*tok == ' ')
			tok++;
		if (*tok)
			rc = client_listen_one(s, tok);
	}
	return rc;
}

static void listener_closed(uv_handle_t *h)
{
	struct client_listener *l = h->data;

	l->s->closes_pending--;
}

void serve__client_close_all(struct serve *s)
{
	for (unsigned i = 0; i < s->front->n_listeners; i++) {
		struct client_listener *l = &s->front->listeners[i];

		if (l->is_pipe && l->path[0])
			(void)unlink(l->path);
		s->closes_pending++;
		uv_close(&l->h.handle, listener_closed);
	}
	s->front->n_listeners = 0;
	while (!kvd_list_empty(&s->front->clients))
		client_conn_close(kvd_list_entry(s->front->clients.next, struct client_conn, node));
}
