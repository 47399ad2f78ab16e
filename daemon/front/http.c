/* http.c - the HTTP/1.1 front's connections: listener, parser, bounds.
 *
 * Design. An HTTP connection is the msgpack client connection's sibling
 * (client.c) under the same rules of invariant 11, judged by the same
 * sweep timer: it counts against listen.max_clients, every byte to the
 * client goes through its struct wbound (listen.write_queue_*), and time
 * is bounded at each phase:
 *   - a request's line and headers must arrive within
 *     http.header_timeout_ms of its first byte, the whole request within
 *     http.read_timeout_ms (slowloris: 408, closed); the first request of
 *     a new connection counts from accept, not from its first byte (else
 *     a client silent until just before the deadline holds it twice);
 *   - a keep-alive connection idle past http.idle_timeout_ms (counted
 *     from its last answer: bytes that start no request, such as bare
 *     CRLFs, do not refresh it) closes;
 *   - nothing is judged while an answer is being produced (the client is
 *     waiting for us) except the write bounds.
 * Size is bounded by the parser (net/wire/http_wire.h: head, header count,
 * body) and by in[]: bytes that arrive while a request is answered
 * (pipelining) wait there, and reading stops while it is full.
 *
 * One request at a time. llhttp pauses after each request; the next is
 * parsed only once the answer is complete (http__exchange_done), from the
 * kick idle handle - never inside the request's state change that
 * answered - so pipelined requests are answered in order, each once.
 *
 * A client that leaves (EOF or a reset while a request is in flight, a
 * bound) closes the connection; serve__sink_gone orphans its request
 * (invariant 8), exactly as for the msgpack socket. An HTTP client does
 * not half-close to wait for its answer, so EOF mid-request is a leave.
 */
#include "daemon/front/http_int.h"
#include "conf/apikeys.h"
#include "conf/util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const char *http__status_text(int status)
{
	switch (status) {
	case 100: return "Continue";
	case 200: return "OK";
	case 304: return "Not Modified";
	case 204: return "No Content";
	case 400: return "Bad Request";
	case 401: return "Unauthorized";
	case 403: return "Forbidden";
	case 404: return "Not Found";
	case 405: return "Method Not Allowed";
	case 408: return "Request Timeout";
	case 413: return "Content Too Large";
	case 414: return "URI Too Long";
	case 415: return "Unsupported Media Type";
	case 429: return "Too Many Requests";
	case 431: return "Request Header Fields Too Large";
	case 500: return "Internal Server Error";
	case 501: return "Not Implemented";
	case 503: return "Service Unavailable";
	case 504: return "Gateway Timeout";
	case 505: return "HTTP Version Not Supported";
	default: return "Error";
	}
}

/* ---- writing ---------------------------------------------------------------- */

/* As client.c: a write past the hard bound or a failed write dooms the
 * connection (the callers are mid-change of a request); the sweep closes
 * it and orphans what is on it. */
static void http_doom(struct http_conn *hc, const char *reason)
{
	if (hc->doom || hc->closing)
		return;
	hc->doom = reason;
	wbound_read_stop(&hc->wb);
}

static void http_written(struct wbound *wb, int status)
{
	struct http_conn *hc = kvd_container_of(wb, struct http_conn, wb);

	if (status < 0)
		http_doom(hc, serve__write_failed(status));
	else if (hc->in_len && !hc->x.active && !hc->wb.paused)
		http__kick(hc);   /* drained below soft: pipelined input waits */
}

void http__write(struct http_conn *hc, char *data, size_t len)
{
	int rc;

	if (hc->closing || hc->doom || hc->shutting) {
		free(data);
		return;
	}
	rc = wbound_write(&hc->wb, data, len);
	if (rc == WBOUND_E_HARD)
		http_doom(hc, "write_queue_hard");
	else if (rc)
		http_doom(hc, serve__write_failed(rc));
}

void http__write_copy(struct http_conn *hc, const char *data, size_t len)
{
	char *p = malloc(len ? len : 1);

	if (!p) {
		http_doom(hc, "write_failed");
		return;
	}
	memcpy(p, data, len);
	http__write(hc, p, len);
}

/* The status line and headers. ctype NULL: a 204 (no Content-Type, no
 * length, no body). extra: whole header lines ("Name: v\r\n"), or NULL. */
static void http_head_write(struct http_conn *hc, int status, const char *ctype,
			    long long content_length, const char *extra)
{
	char buf[2048];
	int n;
	bool http10 = hc->http10;

	if (ctype && content_length < 0 && http10)
		hc->close_after = true;   /* the body ends with the connection */
	n = snprintf(buf, sizeof(buf), "HTTP/1.1 %d %s\r\n", status,
		     http__status_text(status));
	if (ctype)
		n += snprintf(buf + n, sizeof(buf) - (size_t)n,
			      "Content-Type: %s\r\n%s%s", ctype,
			      content_length >= 0 ? "" :
			      http10 ? "" : "Transfer-Encoding: chunked\r\n",
			      content_length < 0 && !strncmp(ctype, "text/event-stream", 17) ?
			      "Cache-Control: no-cache\r\n" : "");
	n += snprintf(buf + n, sizeof(buf) - (size_t)n, "%s",
		      hc->close_after ? "Connection: close\r\n" :
		      http10 ? "Connection: keep-alive\r\n" : "");
	if (ctype && content_length >= 0)
		n += snprintf(buf + n, sizeof(buf) - (size_t)n,
			      "Content-Length: %lld\r\n", content_length);
	if (status == 429 || status == 503)
		n += snprintf(buf + n, sizeof(buf) - (size_t)n, "Retry-After: 1\r\n");
	/* every answer to an allowed origin, errors and 401s included, so
	 * a browser page can read why it failed */
	n += (int)http__cors_headers(hc, buf + n, sizeof(buf) - (size_t)n);
	n += snprintf(buf + n, sizeof(buf) - (size_t)n, "%s\r\n", extra ? extra : "");
	if ((size_t)n >= sizeof(buf)) {
		http_doom(hc, "write_failed");   /* cannot happen: bounded parts */
		return;
	}
	http__write_copy(hc, buf, (size_t)n);
}

void http__head(struct http_conn *hc, int status, const char *ctype,
		long long content_length)
{
	http_head_write(hc, status, ctype, content_length, NULL);
}

void http__head_ext(struct http_conn *hc, int status, const char *ctype,
		    long long content_length, const char *extra)
{
	http_head_write(hc, status, ctype, content_length, extra);
}

void http__no_content(struct http_conn *hc, const char *extra)
{
	http_head_write(hc, 204, NULL, 0, extra);
}

void http__chunk(struct http_conn *hc, const char *data, size_t len)
{
	char hdr[24];
	char *p;
	int n;

	if (hc->http10) {
		if (len)
			http__write_copy(hc, data, len);
		return;
	}
	n = snprintf(hdr, sizeof(hdr), "%zx\r\n", len);
	p = malloc((size_t)n + len + 2 + (len ? 0 : 2));
	if (!p) {
		http_doom(hc, "write_failed");
		return;
	}
	memcpy(p, hdr, (size_t)n);
	memcpy(p + n, data, len);
	memcpy(p + n + len, "\r\n", 2);
	if (!len)   /* the last chunk: "0\r\n\r\n" */
		memcpy(p + n + 2, "\r\n", 2);
	http__write(hc, p, (size_t)n + len + 2 + (len ? 0 : 2));
}

void http__respond(struct http_conn *hc, int status, const char *ctype,
		   const char *body, size_t len)
{
	http__head(hc, status, ctype, (long long)len);
	if (len)
		http__write_copy(hc, body, len);
}

void http__refusal_count(struct serve *s, int status, const char *tenant,
			 int code_503)
{
	int code;

	if (status == 408)
		code = PROTO_ERR_TIMEOUT;
	else if (status == 429)
		code = PROTO_ERR_OVERLOADED;
	else if (status == 503)
		code = code_503;
	else if (status >= 400 && status < 500)
		code = PROTO_ERR_INVALID_REQUEST;
	else
		code = PROTO_ERR_INTERNAL;
	if (!tenant || !*tenant || !strcmp(tenant, "-"))
		tenant = KVD_TENANT_DEFAULT;
	/* no request, no latency to observe */
	kvd_metrics_request_end(&s->d->metrics, tenant, NULL, code, 0);
}

/* ---- closing ---------------------------------------------------------------- */

static void http_conn_closed(uv_handle_t *h)
{
	struct http_conn *hc = h->data;
	struct serve *s = hc->s;

	http_wire_deinit(&hc->wire);
	free(hc);
	s->closes_pending--;
}

/* The connection proved a key (or keys are off): it keeps its slot. */
static void http_unpend(struct http_conn *hc)
{
	serve__pending_del(&hc->pend);
}

static void http_conn_close(struct http_conn *hc)
{
	struct http_server *hs = hc->hs;
	struct serve *s = hc->s;

	if (hc->closing)
		return;
	hc->closing = true;
	/* the request in flight is orphaned (invariant 8), answered ones
	 * that still free their engine are let go */
	hc->x.r = NULL;
	hc->x.n_cancel = 0;
	serve__sink_gone(s, &hc->sink);
	if (hs->exchange_free)
		hs->exchange_free(&hc->x);
	if (hc->kicked) {
		kvd_list_del(&hc->kick_node);
		hc->kicked = false;
	}
	kvd_list_del(&hc->node);
	http_unpend(hc);
	if (hc->counted)
		s->front->n_clients--;
	if (hc->refusing)
		hs->n_refusing--;
	s->closes_pending++;
	uv_close((uv_handle_t *)&hc->tcp, http_conn_closed);
}

static void http_conn_close_for(struct http_conn *hc, const char *reason)
{
	KVLOG_RL(hc->s->log, &hc->s->rl[SERVE_RL_CLIENT_CONN],
		 serve__closed_level(reason), "client_closed",
		   "conn=%llu proto=http reason=%s requests=%u queued=%zu peak_queued=%llu",
		   (unsigned long long)hc->conn_id, reason, hc->sink.n_reqs,
		   wbound_queued(&hc->wb), (unsigned long long)hc->wb.peak);
	http_conn_close(hc);
}

static void http_shutdown_cb(uv_shutdown_t *req, int status)
{
	struct http_conn *hc = req->data;

	hc->shutting = false;
	/* the answer is out and the client has our FIN: a body it still
	 * sends is read and dropped (bounded) so that closing with unread
	 * bytes does not reset the connection before it read the answer */
	if (status == 0 && hc->drain_left && !hc->eof && !hc->doom &&
	    !hc->closing) {
		hc->draining = true;
		hc->t_drain_ns = kvd_now_ns();
		hc->in_len = 0;
		if (wbound_read_start(&hc->wb) == 0)
			return;
	}
	http_conn_close(hc);
}

void http__drain_after(struct http_conn *hc)
{
	const struct kvd_config *cfg = &hc->s->d->cfg;

	hc->close_after = true;
	hc->drain_left = (uint64_t)cfg->http_max_body_bytes + HTTP_IN_MAX;
}

/* Stop reading, flush what is queued, close. Safe inside a state change. */
static void http_conn_end(struct http_conn *hc)
{
	if (hc->closing || hc->shutting || hc->doom || hc->draining)
		return;
	wbound_read_stop(&hc->wb);
	hc->shut.data = hc;
	if (uv_shutdown(&hc->shut, (uv_stream_t *)&hc->tcp, http_shutdown_cb) == 0)
		hc->shutting = true;
	else
		http_doom(hc, "write_failed");
}

/* A request the parser refused: answer with its status, then close (the
 * stream cannot be trusted past a framing error). */
static void http_refuse(struct http_conn *hc, int status, const char *why)
{
	char body[384];
	int n;

	KVLOG_RL_WARN(hc->s->log, &hc->s->rl[SERVE_RL_HTTP_REFUSED], "http_refused",
		   "conn=%llu status=%d msg=%s", (unsigned long long)hc->conn_id,
		   status, KVLOG_Q(why));
	n = snprintf(body, sizeof(body),
		     "{\"error\":{\"message\":\"%s\",\"type\":\"invalid_request_error\",\"param\":null,\"code\":null}}\n",
		     why);   /* why: one of http_wire's constant sentences */
	hc->close_after = true;
	/* a refused body (413): the head, its Origin with it, was whole */
	if (hc->wire.in_head)
		hc->cors = false;
	else
		http__cors_judge(hc, &hc->wire.msg);
	http__refusal_count(hc->s, status, NULL, PROTO_ERR_INTERNAL);
	http__respond(hc, status, "application/json", body, (size_t)n);
	http_conn_end(hc);
}

/* ---- reading and parsing ------------------------------------------------------ */

/* Past listen.max_clients, the 503 - after the request's head was read,
 * with its body dropped after our FIN (http__drain_after), so the client
 * reads the status instead of a reset. */
static void http_refuse_busy(struct http_conn *hc)
{
	static const char body[] =
		"{\"error\":{\"message\":\"the node holds its maximum of client connections (listen.max_clients); retry later\",\"type\":\"server_error\",\"param\":null,\"code\":\"overloaded\"}}\n";
	struct serve *s = hc->s;

	KVLOG_RL_WARN(s->log, &s->rl[SERVE_RL_CLIENT_FULL], "client_refused",
		      "conn=%llu proto=http reason=max_clients max_clients=%u",
		      (unsigned long long)hc->conn_id, s->front->max_clients);
	http__refusal_count(s, 503, NULL, PROTO_ERR_OVERLOADED);
	http__drain_after(hc);
	http__respond(hc, 503, "application/json", body, sizeof(body) - 1);
	http_conn_end(hc);
}

/* A request's head is complete: a connection over the bound gets its
 * 503 now; a pending one whose head has a good key holds its slot from
 * here. False when answered (stop parsing). */
static bool http_head_gate(struct http_conn *hc)
{
	http__cors_judge(hc, &hc->wire.msg);
	if (hc->refusing) {
		http_refuse_busy(hc);
		return false;
	}
	if (hc->pend.on && hc->hs->head_auth &&
	    hc->hs->head_auth(hc, &hc->wire.msg))
		http_unpend(hc);
	return true;
}

static void http_read_wish(struct http_conn *hc)
{
	if (hc->closing || hc->doom || hc->shutting || hc->eof)
		return;
	if (hc->in_len < sizeof(hc->in))
		(void)wbound_read_start(&hc->wb);
	else
		wbound_read_stop(&hc->wb);
}

/* Parse what in[] holds while no request is being answered. */
static void http_pump(struct http_conn *hc)
{
	/* past the write queue's soft bound no new request starts (as the
	 * msgpack socket stops reading): a client that pipelines requests
	 * and reads no answer cannot make kvd produce more */
	while (!hc->x.active && !hc->closing && !hc->doom && !hc->shutting &&
	       !hc->wb.paused && hc->in_len > 0) {
		size_t used = 0;
		int rc = http_wire_feed(&hc->wire, hc->in, hc->in_len, &used);

		if (used) {
			memmove(hc->in, hc->in + used, hc->in_len - used);
			hc->in_len -= used;
		}
		/* the head is complete and a body is to come: the endpoint
		 * judges the head first (the key), so a refused request
		 * makes kvd read none of its body, and gets no 100 Continue */
		if (rc == HTTP_WIRE_AGAIN && hc->wire.started && !hc->wire.in_head &&
		    !hc->head_judged) {
			hc->head_judged = true;
			if (!http_head_gate(hc))
				return;   /* answered 503; the connection ends */
			if (hc->hs->head_check && !hc->hs->head_check(hc, &hc->wire.msg))
				return;   /* answered; the connection ends */
		}
		/* 100 Continue only once the endpoint accepted the head (the
		 * key) and the body is still to come; a body that came with
		 * the head needs none (RFC 9110 s. 10.1.1), and a request
		 * refused or answered whole never gets one ahead of it */
		if (hc->wire.want_continue) {
			static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";

			hc->wire.want_continue = false;
			if (rc == HTTP_WIRE_AGAIN && hc->head_judged)
				http__write_copy(hc, cont, sizeof(cont) - 1);
		}
		if (rc == HTTP_WIRE_AGAIN) {
			/* the first request's time counts from accept: a client
			 * silent until just before the deadline must not start
			 * a second one with its first byte */
			if (hc->wire.started && !hc->t_req_ns)
				hc->t_req_ns = hc->n_requests ? hc->t_rx_ns : hc->t_accept_ns;
			break;
		}
		if (rc != HTTP_WIRE_MSG) {
			http_refuse(hc, hc->wire.status ? hc->wire.status : 400,
				    hc->wire.why ? hc->wire.why : "malformed HTTP request");
			return;
		}
		if (!hc->head_judged && !http_head_gate(hc))
			return;
		hc->t_req_ns = 0;
		hc->head_judged = false;
		hc->n_requests++;
		hc->http10 = hc->wire.msg.http10;
		if (!hc->wire.msg.keep_alive)
			hc->close_after = true;
		hc->hs->handler(hc, &hc->wire.msg);
		http_wire_next(&hc->wire);
		/* the last bytes of in[] may begin the next request */
		if (hc->in_len && !hc->t_req_ns)
			hc->t_req_ns = kvd_now_ns();
	}
	if (!hc->x.active && hc->close_after && !hc->closing)
		http_conn_end(hc);
	else if (!hc->x.active && hc->eof && hc->in_len == 0)
		http_conn_end(hc);
	http_read_wish(hc);
}

void http__exchange_done(struct http_conn *hc)
{
	hc->cors = false;   /* the next request shows its own Origin */
	hc->x.active = false;
	hc->x.r = NULL;
	hc->t_idle_ns = hc->t_rx_ns = kvd_now_ns();   /* idle counts from the answer */
	if (hc->close_after)
		http_conn_end(hc);
	else if (hc->in_len || hc->eof)
		http__kick(hc);
	else
		http_read_wish(hc);
}

static void http_kick_cb(uv_idle_t *i)
{
	struct http_server *hs = i->data;

	while (!kvd_list_empty(&hs->kick_list)) {
		struct http_conn *hc = kvd_list_entry(hs->kick_list.next,
						      struct http_conn, kick_node);
		kvd_list_del(&hc->kick_node);
		hc->kicked = false;
		while (hc->x.n_cancel) {
			/* a stop string ended the answer (or one choice of it,
			 * or an error ended the others): the generation is not
			 * wanted any more; the request is orphaned, so its
			 * pages go back once nothing can write them */
			serve__sink_leave(hc->x.cancel[--hc->x.n_cancel]);
		}
		if (!hc->closing)
			http_pump(hc);
	}
	uv_idle_stop(i);
	hs->kick_on = false;
}

void http__kick(struct http_conn *hc)
{
	struct http_server *hs = hc->hs;

	if (hc->closing || hc->kicked || hc->draining || !hs->kick_open)
		return;
	hc->kicked = true;
	kvd_list_add_tail(&hs->kick_list, &hc->kick_node);
	if (!hs->kick_on && uv_idle_start(&hs->kick, http_kick_cb) == 0)
		hs->kick_on = true;
}

static void http_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf)
{
	struct http_conn *hc = h->data;

	(void)hint;
	*buf = uv_buf_init(hc->in + hc->in_len,
			   (unsigned)(sizeof(hc->in) - hc->in_len));
}

static void http_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
	struct http_conn *hc = st->data;

	(void)buf;
	if (hc->draining) {
		/* after a refusal: drop what comes, close at EOF or the bound */
		hc->in_len = 0;
		if (nread < 0 || (uint64_t)nread >= hc->drain_left)
			http_conn_close(hc);
		else
			hc->drain_left -= (uint64_t)nread;
		return;
	}
	if (nread == UV_EOF) {
		hc->eof = true;
		wbound_read_stop(&hc->wb);
		if (hc->x.active)
			http_conn_close_for(hc, SERVE_CLIENT_GONE);
		else
			http_pump(hc);   /* a complete request still answers */
		return;
	}
	if (nread < 0) {
		http_conn_close(hc);
		return;
	}
	if (nread == 0)
		return;
	hc->t_rx_ns = kvd_now_ns();
	hc->in_len += (size_t)nread;
	http_pump(hc);
}

/* ---- accept ------------------------------------------------------------------- */

/* A connection that has not shown a good key yet closes to make room
 * (serve__pending_evict): a keyless or silent connection never keeps a
 * client out. */
static void http_evict(struct serve_pending *p)
{
	struct http_conn *hc = kvd_container_of(p, struct http_conn, pend);

	KVLOG_RL_WARN(hc->s->log, &hc->s->rl[SERVE_RL_CLIENT_CONN], "client_closed",
		      "conn=%llu proto=http reason=evicted_unauthenticated",
		      (unsigned long long)hc->conn_id);
	http_conn_close(hc);
}

/* A new connection's place: one of listen.max_clients (pending until a
 * head with a good key), made by evicting the oldest pending one when the
 * node is full; else, while fewer than HTTP_REFUSING_MAX are, it is read
 * to its head and answered 503 (http_head_gate). False: closed unread. */
static bool http_take_slot(struct http_conn *hc)
{
	struct http_server *hs = hc->hs;
	struct serve *s = hc->s;

	if (s->front->n_clients >= s->front->max_clients && !serve__pending_evict(s)) {
		if (hs->n_refusing >= HTTP_REFUSING_MAX) {
			KVLOG_RL_WARN(s->log, &s->rl[SERVE_RL_CLIENT_FULL], "client_refused",
				      "conn=%llu proto=http reason=max_clients max_clients=%u unread=1",
				      (unsigned long long)hc->conn_id, s->front->max_clients);
			http__refusal_count(s, 503, NULL, PROTO_ERR_OVERLOADED);
			http_conn_close(hc);
			return false;
		}
		hc->refusing = true;
		hs->n_refusing++;
		return true;
	}
	hc->counted = true;
	s->front->n_clients++;
	serve__pending_add(s, &hc->pend, http_evict);
	return true;
}

static void http_accept(uv_stream_t *server, int status)
{
	struct http_server *hs = server->data;
	struct serve *s = hs->s;
	const struct kvd_config *cfg = &s->d->cfg;
	struct wbound_limits lim = { .soft = cfg->write_queue_soft,
				     .hard = cfg->write_queue_hard,
				     .stall_ms = cfg->write_stall_timeout_ms };
	struct http_conn *hc;

	if (status < 0) {
		KVLOG_WARN(s->log, "client_accept_failed", "proto=http error=%s",
			   uv_err_name(status));
		return;
	}
	hc = hs->stopping ? NULL : calloc(1, sizeof(*hc));
	if (!hc) {
		serve__accept_drop(s, server);
		return;
	}
	hc->hs = hs;
	hc->s = s;
	if (uv_tcp_init(&s->d->loop, &hc->tcp)) {
		free(hc);
		serve__accept_drop(s, server);
		return;
	}
	hc->tcp.data = hc;
	hc->conn_id = ++s->next_conn_id;
	hc->t_accept_ns = hc->t_rx_ns = hc->t_idle_ns = kvd_now_ns();
	http_wire_init(&hc->wire, cfg->http_max_header_bytes, cfg->http_max_body_bytes);
	wbound_init(&hc->wb, (uv_stream_t *)&hc->tcp, &lim, http_alloc, http_read);
	wbound_on_write(&hc->wb, http_written);
	hc->sink.ops = hs->sink_ops;
	kvd_list_init(&hc->sink.reqs);
	kvd_list_add(&hs->conns, &hc->node);
	if (uv_accept(server, (uv_stream_t *)&hc->tcp)) {
		http_conn_close(hc);
		return;
	}
	uv_tcp_nodelay(&hc->tcp, 1);
	if (!http_take_slot(hc))
		return;
	if (wbound_read_start(&hc->wb))
		http_conn_close(hc);
}

/* ---- the loop's stalls ---------------------------------------------------------- */

static uint64_t http_thread_cpu_ns(void)
{
	struct timespec ts;

	if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts))
		return 0;
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Before every poll: the loop thread's CPU time since the last one is
 * what one iteration's callbacks cost (waiting in poll costs none, and a
 * machine too busy to run the loop does not count either). An iteration
 * past HTTP_LOOP_BUSY_MS held every connection that long. */
static void http_watch_cb(uv_prepare_t *h)
{
	struct http_server *hs = h->data;
	uint64_t now = http_thread_cpu_ns();
	uint64_t used = hs->watch_cpu_ns && now > hs->watch_cpu_ns
			? now - hs->watch_cpu_ns : 0;

	hs->watch_cpu_ns = now;
	if (used >= (uint64_t)HTTP_LOOP_BUSY_MS * 1000000u)
		KVLOG_RL_WARN(hs->s->log, &hs->s->rl[SERVE_RL_LOOP_BUSY], "loop_busy",
			      "cpu_ms=%.1f limit_ms=%u", (double)used / 1e6,
			      HTTP_LOOP_BUSY_MS);
}

int http__listen(struct http_server *hs)
{
	struct serve *s = hs->s;
	const char *spec = s->d->cfg.listen_http;
	struct sockaddr_storage ss;
	int rc;

	kvd_list_init(&hs->conns);
	kvd_list_init(&hs->kick_list);
	rc = uv_idle_init(&s->d->loop, &hs->kick);
	if (rc)
		return rc;
	hs->kick.data = hs;
	hs->kick_open = true;
	rc = uv_prepare_init(&s->d->loop, &hs->watch);
	if (rc)
		return rc;
	hs->watch.data = hs;
	hs->watch_open = true;
	uv_prepare_start(&hs->watch, http_watch_cb);
	uv_unref((uv_handle_t *)&hs->watch);
	rc = serve__parse_hostport(spec, &ss);
	if (rc) {
		KVLOG_ERR(s->log, "listen_http", "addr=%s msg=\"bad address\"", KVLOG_Q(spec));
		return rc;
	}
	rc = uv_tcp_init(&s->d->loop, &hs->listener);
	if (rc)
		return rc;
	hs->listener_open = true;
	hs->listener.data = hs;
	rc = uv_tcp_bind(&hs->listener, (struct sockaddr *)&ss, 0);
	if (!rc)
		rc = uv_listen((uv_stream_t *)&hs->listener, 511, http_accept);
	if (rc)
		KVLOG_ERR(s->log, "listen_http", "addr=%s msg=%s", KVLOG_Q(spec),
			  KVLOG_Q(uv_strerror(rc)));
	else
		KVLOG_INFO(s->log, "listen_http", "addr=%s keys=%zu tenants_from=%s chat_template=%s",
			   KVLOG_Q(spec), kvd_apikeys_count(hs->s->keys),
			   hs->s->keys ? "api_keys_file" : "none",
			   chat_format_name(hs->chat_format));
	return rc;
}

/* ---- sweep and stop ------------------------------------------------------------- */

void serve__http_sweep(struct serve *s)
{
	struct http_server *hs = s->front->http;
	const struct kvd_config *cfg = &s->d->cfg;
	uint64_t now = kvd_now_ns();
	uint64_t head_ns = (uint64_t)cfg->http_header_timeout_ms * 1000000u;
	uint64_t read_ns = (uint64_t)cfg->http_read_timeout_ms * 1000000u;
	uint64_t idle_ns = (uint64_t)cfg->http_idle_timeout_ms * 1000000u;
	struct kvd_list *pos, *nxt;

	if (!hs)
		return;
	kvd_list_for_each_safe(pos, nxt, &hs->conns) {
		struct http_conn *hc = kvd_list_entry(pos, struct http_conn, node);
		int rc;

		if (hc->closing)
			continue;
		if (hc->draining) {
			if (now - hc->t_drain_ns >= HTTP_DRAIN_MS * 1000000ull)
				http_conn_close(hc);
			continue;
		}
		if (hc->doom) {
			http_conn_close_for(hc, hc->doom);
			continue;
		}
		rc = wbound_poll(&hc->wb, now);
		if (rc) {
			http_conn_close_for(hc, rc == WBOUND_E_HARD ?
					    "write_queue_hard" : "write_stall");
			continue;
		}
		if (hc->shutting || hc->x.active || hc->wb.paused)
			continue;   /* we owe the client, not it us */
		if (hc->t_req_ns) {
			bool in_head = hc->wire.in_head || !hc->wire.started;

			if ((in_head && now - hc->t_req_ns >= head_ns) ||
			    now - hc->t_req_ns >= read_ns) {
				KVLOG_RL_WARN(s->log, &s->rl[SERVE_RL_CLIENT_CONN], "client_closed",
					   "conn=%llu proto=http reason=%s",
					   (unsigned long long)hc->conn_id,
					   in_head ? "header_timeout" : "read_timeout");
				http_refuse(hc, 408, "the request did not arrive in time");
			}
		} else if (hc->n_requests == 0 && now - hc->t_accept_ns >= head_ns) {
			http_conn_close_for(hc, "header_timeout");
		} else if (hc->n_requests && now - hc->t_idle_ns >= idle_ns &&
			   hc->sink.n_reqs == 0) {
			http_conn_close_for(hc, "idle_timeout");
		}
	}
}

/* The listener and the kick handle close in either order; the last
 * close callback frees the server. */
static void http_server_closed(uv_handle_t *h)
{
	struct http_server *hs = h->data;
	struct serve *s = hs->s;

	s->closes_pending--;
	if (--hs->handles_open == 0) {
		free(hs);
	}
}

void serve__http_close_all(struct serve *s)
{
	struct http_server *hs = s->front->http;

	if (!hs)
		return;
	hs->stopping = true;
	while (!kvd_list_empty(&hs->conns))
		http_conn_close(kvd_list_entry(hs->conns.next, struct http_conn, node));
	/* every job's connection is gone (cancelled); the pool is the
	 * serve's, stopped after both fronts closed (serve.c) */
	s->front->http = NULL;
	hs->handles_open = (unsigned)hs->listener_open + (unsigned)hs->kick_open +
			   (unsigned)hs->watch_open;
	if (hs->watch_open) {
		s->closes_pending++;
		uv_close((uv_handle_t *)&hs->watch, http_server_closed);
	}
	if (hs->listener_open) {
		s->closes_pending++;
		uv_close((uv_handle_t *)&hs->listener, http_server_closed);
	}
	if (hs->kick_open) {
		s->closes_pending++;
		uv_close((uv_handle_t *)&hs->kick, http_server_closed);
	}
	if (!hs->handles_open) {
		free(hs);
	}
}
