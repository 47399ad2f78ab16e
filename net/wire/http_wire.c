/* http_wire.c - llhttp with limits; one request at a time.
 *
 * Design. llhttp does the grammar (request line, header syntax,
 * Content-Length vs Transfer-Encoding, chunked framing): a well-kept
 * parser rather than our own, since request smuggling lives in exactly
 * those corners. What is ours is what llhttp leaves to its user: how much
 * a request may make us hold (the head and body bounds, checked in the
 * callbacks as bytes arrive, so nothing past a bound is buffered), which
 * headers we keep (by name, case-insensitively, split across reads), and
 * one request at a time: on_message_complete pauses the parser, so a
 * pipelined second request stays in the caller's buffer until it asks
 * for it (http_wire_next).
 */
#include "net/wire/http_wire.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static struct http_wire *wire_of(llhttp_t *p)
{
	return p->data;
}

static int wire_fail(struct http_wire *w, int err, int status, const char *why)
{
	if (!w->err) {
		w->err = err;
		w->status = status;
		w->why = why;
	}
	return -1;   /* HPE_USER: llhttp stops */
}

static int wire_head_add(struct http_wire *w, size_t n)
{
	w->head_bytes += n;
	if (w->head_bytes > w->max_header)
		return wire_fail(w, HTTP_WIRE_E_HEADERS, 431,
				 "the request line and headers are too large");
	return 0;
}

static int on_message_begin(llhttp_t *p)
{
	struct http_wire *w = wire_of(p);

	w->started = w->in_head = true;
	w->head_bytes = 0;
	w->n_headers = 0;
	w->field_len = 0;
	w->field_long = false;
	w->hdr = HW_HDR_NONE;
	w->expect[0] = 0;
	return 0;
}

static int on_url(llhttp_t *p, const char *at, size_t n)
{
	struct http_wire *w = wire_of(p);
	size_t have = strlen(w->msg.path);

	if (wire_head_add(w, n))
		return -1;
	if (have + n > HTTP_WIRE_PATH_MAX)
		return wire_fail(w, HTTP_WIRE_E_HEADERS, 414, "the request target is too long");
	memcpy(w->msg.path + have, at, n);
	w->msg.path[have + n] = 0;
	return 0;
}

static int on_header_field(llhttp_t *p, const char *at, size_t n)
{
	struct http_wire *w = wire_of(p);

	if (wire_head_add(w, n))
		return -1;
	if (w->field_len + n >= sizeof(w->field)) {
		w->field_long = true;   /* no header we keep has a long name */
		return 0;
	}
	memcpy(w->field + w->field_len, at, n);
	w->field_len += n;
	return 0;
}

static int on_header_field_complete(llhttp_t *p)
{
	struct http_wire *w = wire_of(p);

	if (++w->n_headers > HTTP_WIRE_HEADERS_MAX)
		return wire_fail(w, HTTP_WIRE_E_HEADERS, 431, "too many header lines");
	w->field[w->field_len] = 0;
	w->hdr = HW_HDR_NONE;
	if (!w->field_long) {
		if (!strcasecmp(w->field, "authorization")) {
			w->hdr = HW_HDR_AUTH;
			w->msg.auth[0] = 0;
			w->msg.has_auth = true;
		} else if (!strcasecmp(w->field, "content-type")) {
			w->hdr = HW_HDR_CTYPE;
			w->msg.ctype[0] = 0;
		} else if (!strcasecmp(w->field, "origin")) {
			/* a repeated Origin is not one origin: never allowed */
			w->hdr = HW_HDR_ORIGIN;
			if (w->msg.has_origin)
				return wire_fail(w, HTTP_WIRE_E_PARSE, 400,
						 "the Origin header is repeated");
			w->msg.has_origin = true;
		} else if (!strcasecmp(w->field, "expect")) {
			w->hdr = HW_HDR_EXPECT;
			w->expect[0] = 0;
		} else if (!strcasecmp(w->field, "if-none-match")) {
			w->hdr = HW_HDR_INM;
			w->msg.if_none_match[0] = 0;
		}
	}
	w->field_len = 0;
	w->field_long = false;
	return 0;
}

static int hdr_append(struct http_wire *w, char *dst, size_t cap,
		      const char *at, size_t n)
{
	size_t have = strlen(dst);

	if (have + n >= cap)
		return wire_fail(w, HTTP_WIRE_E_HEADERS, 431, "a header value is too long");
	memcpy(dst + have, at, n);
	dst[have + n] = 0;
	return 0;
}

/* If-None-Match only saves a download: one too long for its buffer is
 * taken as absent (the rest of its pieces are not collected). */
static int hdr_append_or_drop(struct http_wire *w, char *dst, size_t cap,
			      const char *at, size_t n)
{
	size_t have = strlen(dst);

	if (have + n >= cap) {
		dst[0] = 0;
		w->hdr = HW_HDR_NONE;
		return 0;
	}
	memcpy(dst + have, at, n);
	dst[have + n] = 0;
	return 0;
}

static int on_header_value(llhttp_t *p, const char *at, size_t n)
{
	struct http_wire *w = wire_of(p);

	if (wire_head_add(w, n))
		return -1;
	switch (w->hdr) {
	case HW_HDR_AUTH:
		return hdr_append(w, w->msg.auth, sizeof(w->msg.auth), at, n);
	case HW_HDR_CTYPE:
		return hdr_append(w, w->msg.ctype, sizeof(w->msg.ctype), at, n);
	case HW_HDR_ORIGIN:
		return hdr_append(w, w->msg.origin, sizeof(w->msg.origin), at, n);
	case HW_HDR_EXPECT:
		return hdr_append(w, w->expect, sizeof(w->expect), at, n);
	case HW_HDR_INM:
		return hdr_append_or_drop(w, w->msg.if_none_match,
					  sizeof(w->msg.if_none_match), at, n);
	case HW_HDR_NONE:
		break;
	}
	return 0;
}

static int on_headers_complete(llhttp_t *p)
{
	struct http_wire *w = wire_of(p);
	uint8_t method = llhttp_get_method(p);

	w->in_head = false;
	if (llhttp_get_http_major(p) != 1)
		return wire_fail(w, HTTP_WIRE_E_VERSION, 505, "only HTTP/1.0 and HTTP/1.1 are served");
	if (llhttp_get_upgrade(p) || method == HTTP_CONNECT)
		return wire_fail(w, HTTP_WIRE_E_UPGRADE, 501, "Upgrade and CONNECT are not served");
	w->msg.method = method == HTTP_GET ? HTTP_WIRE_GET :
			method == HTTP_POST ? HTTP_WIRE_POST :
			method == HTTP_OPTIONS ? HTTP_WIRE_OPTIONS : HTTP_WIRE_OTHER;
	snprintf(w->msg.method_name, sizeof(w->msg.method_name), "%s",
		 llhttp_method_name((llhttp_method_t)method));
	w->msg.http10 = llhttp_get_http_minor(p) == 0;
	/* Content-Length is known now: refuse before any body byte */
	if ((p->flags & F_CONTENT_LENGTH) && p->content_length > w->max_body)
		return wire_fail(w, HTTP_WIRE_E_BODY, 413, "the request body is too large");
	if (!strcasecmp(w->expect, "100-continue"))
		w->want_continue = true;
	return 0;
}

static int on_body(llhttp_t *p, const char *at, size_t n)
{
	struct http_wire *w = wire_of(p);
	struct http_msg *m = &w->msg;

	if (m->body_len + n > w->max_body)
		return wire_fail(w, HTTP_WIRE_E_BODY, 413, "the request body is too large");
	if (m->body_len + n + 1 > w->body_cap) {
		size_t cap = w->body_cap ? w->body_cap : 4096;
		char *nb;

		/* a declared length (at most max_body: on_headers_complete)
		 * gets its room once its bytes come, not by doublings that
		 * copy a large body over and over on the loop */
		if (!w->body_cap && (p->flags & F_CONTENT_LENGTH) &&
		    m->body_len + n + p->content_length + 1 > cap)
			cap = m->body_len + n + p->content_length + 1;
		while (cap < m->body_len + n + 1)
			cap *= 2;
		if (cap > w->max_body + 1)
			cap = w->max_body + 1;
		nb = realloc(m->body, cap);
		if (!nb)
			return wire_fail(w, -ENOMEM, 503, "out of memory");
		m->body = nb;
		w->body_cap = cap;
	}
	memcpy(m->body + m->body_len, at, n);
	m->body_len += n;
	m->body[m->body_len] = 0;
	return 0;
}

static int on_message_complete(llhttp_t *p)
{
	struct http_wire *w = wire_of(p);

	w->msg.keep_alive = llhttp_should_keep_alive(p);
	w->msg_done = true;
	w->started = false;
	return HPE_PAUSED;
}

void http_wire_init(struct http_wire *w, size_t max_header, size_t max_body)
{
	memset(w, 0, sizeof(*w));
	llhttp_settings_init(&w->set);
	w->set.on_message_begin = on_message_begin;
	w->set.on_url = on_url;
	w->set.on_header_field = on_header_field;
	w->set.on_header_field_complete = on_header_field_complete;
	w->set.on_header_value = on_header_value;
	w->set.on_headers_complete = on_headers_complete;
	w->set.on_body = on_body;
	w->set.on_message_complete = on_message_complete;
	llhttp_init(&w->p, HTTP_REQUEST, &w->set);
	w->p.data = w;
	w->max_header = max_header;
	w->max_body = max_body;
}

void http_wire_deinit(struct http_wire *w)
{
	free(w->msg.body);
	w->msg.body = NULL;
	w->body_cap = 0;
}

char *http_wire_take_body(struct http_wire *w, size_t *len)
{
	char *b = w->msg.body;

	*len = b ? w->msg.body_len : 0;
	w->msg.body = NULL;
	w->msg.body_len = 0;
	w->body_cap = 0;
	return b;
}

void http_wire_next(struct http_wire *w)
{
	free(w->msg.body);
	memset(&w->msg, 0, sizeof(w->msg));
	w->body_cap = 0;
	w->msg_done = false;
	llhttp_resume(&w->p);
}

/* llhttp hands a span (target, header name or value) to its callback at
 * the span's end or at the end of the bytes it was given, and stops at a
 * malformed byte without handing over the span it was in. Fed a whole
 * head at once, a span past its bound with a bad byte further on was a
 * 400; cut into reads, the bound saw it first: 414 or 431. So the head
 * goes in a byte at a time (a few hundred calls for a usual head, at most
 * max_header), every bound is judged at the byte that crosses it, and the
 * answer never depends on how the bytes came; the body goes in at once. */
static llhttp_errno_t wire_execute(struct http_wire *w, const char *data, size_t len)
{
	llhttp_errno_t e = HPE_OK;
	size_t off = 0;

	while (off < len && e == HPE_OK) {
		size_t n = w->in_head || !w->started ? 1 : len - off;

		e = llhttp_execute(&w->p, data + off, n);
		off += n;
	}
	return e;
}

int http_wire_feed(struct http_wire *w, const char *data, size_t len,
		   size_t *used)
{
	llhttp_errno_t e;

	*used = 0;
	if (w->err)
		return w->err;
	if (w->msg_done)
		return HTTP_WIRE_MSG;   /* the caller has not taken it yet */
	if (len == 0)
		return HTTP_WIRE_AGAIN;
	e = wire_execute(w, data, len);
	if (e == HPE_OK) {
		*used = len;
		return HTTP_WIRE_AGAIN;
	}
	if (e == HPE_PAUSED && w->msg_done) {
		*used = (size_t)(llhttp_get_error_pos(&w->p) - data);
		return HTTP_WIRE_MSG;
	}
	if (w->err == -ENOMEM)
		return -ENOMEM;
	if (!w->err)
		wire_fail(w, HTTP_WIRE_E_PARSE, 400, "malformed HTTP request");
	return w->err;
}
