/* http_wire.h - HTTP/1.1 requests off the wire, with limits (llhttp).
 *
 * A struct http_wire parses one connection's request stream with llhttp
 * (Debian's node-llhttp C sources, built as a static library) and keeps
 * only what the HTTP front needs: method, path, the Authorization,
 * Content-Type, Origin (CORS), Expect and If-None-Match headers,
 * keep-alive, and the
 * body. It stops after
 * each complete request (llhttp pause), so pipelined requests are taken
 * one at a time and the caller decides when to parse the next.
 *
 * Limits: the request line plus header fields and values at most
 * max_header bytes (431), at most HTTP_WIRE_HEADERS_MAX header lines
 * (431), the body at most max_body bytes (413, judged on Content-Length
 * before any body byte arrives, and on chunked bodies as they grow);
 * a wanted header longer than its buffer is a 431 too (never truncated),
 * but for If-None-Match, which is then taken as absent (it only saves a
 * download).
 *
 * Errors: http_wire_feed returns HTTP_WIRE_AGAIN (all input used, no
 * complete request), HTTP_WIRE_MSG (one request in w->msg; `*used` bytes
 * were taken), or HTTP_WIRE_E_* with w->status (the HTTP status to answer
 * with) and w->why (a constant sentence); after an error the connection
 * must close. -ENOMEM for the body buffer. Loop thread only.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <llhttp.h>

#define HTTP_WIRE_PATH_MAX 512u
#define HTTP_WIRE_AUTH_MAX 512u
#define HTTP_WIRE_CTYPE_MAX 128u
#define HTTP_WIRE_INM_MAX 128u
/* An origin is scheme://host[:port]: a 253-byte DNS name fits. */
#define HTTP_WIRE_ORIGIN_MAX 320u
#define HTTP_WIRE_HEADERS_MAX 100u

enum {
	HTTP_WIRE_AGAIN = 0,
	HTTP_WIRE_MSG = 1,
	HTTP_WIRE_E_PARSE = 2,    /* 400: not HTTP/1.x */
	HTTP_WIRE_E_HEADERS = 3,  /* 431: head too large */
	HTTP_WIRE_E_BODY = 4,     /* 413: body too large */
	HTTP_WIRE_E_VERSION = 5,  /* 505 */
	HTTP_WIRE_E_UPGRADE = 6,  /* 501: Upgrade/CONNECT not served */
};

enum http_wire_method {
	HTTP_WIRE_OTHER = 0, HTTP_WIRE_GET, HTTP_WIRE_POST, HTTP_WIRE_OPTIONS,
};

struct http_msg {
	enum http_wire_method method;
	char method_name[16];
	char path[HTTP_WIRE_PATH_MAX + 1];          /* request target, NUL-ended */
	char auth[HTTP_WIRE_AUTH_MAX + 1];          /* Authorization value */
	char ctype[HTTP_WIRE_CTYPE_MAX + 1];        /* Content-Type value */
	char if_none_match[HTTP_WIRE_INM_MAX + 1];  /* If-None-Match value; ""
						     * absent or too long */
	char origin[HTTP_WIRE_ORIGIN_MAX + 1];      /* Origin value ("" none) */
	bool has_auth;
	bool has_origin;
	bool keep_alive;                            /* at completion */
	bool http10;                                /* HTTP/1.0: no chunked */
	char *body;                                 /* (body_len + 1), NUL-ended; owned */
	size_t body_len;
};

/* Which header's value is being collected. */
enum http_wire_hdr {
	HW_HDR_NONE = 0, HW_HDR_AUTH, HW_HDR_CTYPE, HW_HDR_ORIGIN, HW_HDR_EXPECT,
	HW_HDR_INM,
};

struct http_wire {
	llhttp_t p;
	llhttp_settings_t set;
	size_t max_header, max_body;
	size_t head_bytes;                          /* of the request in progress */
	unsigned n_headers;
	bool in_head;                               /* a request began, head not done */
	bool started;                               /* a request began, not complete */
	bool want_continue;                         /* Expect: 100-continue seen; the
						     * caller answers and clears it */
	char field[32];                             /* current header name (lower) */
	size_t field_len;
	bool field_long;
	enum http_wire_hdr hdr;
	char expect[32];
	size_t body_cap;
	int err;                                    /* HTTP_WIRE_E_* from a callback */
	int status;                                 /* HTTP status for an error */
	const char *why;                            /* constant sentence */
	bool msg_done;
	struct http_msg msg;
};

void http_wire_init(struct http_wire *w, size_t max_header, size_t max_body);
void http_wire_deinit(struct http_wire *w);
/* Parse [data, data+len). See the header comment for the results. */
int http_wire_feed(struct http_wire *w, const char *data, size_t len,
		   size_t *used);
/* Done with w->msg: free its body and let the next request parse. */
void http_wire_next(struct http_wire *w);
/* Take the complete request's body (NUL-ended, *len bytes; NULL when it
 * has none): the caller owns and frees it, the message keeps no body. */
char *http_wire_take_body(struct http_wire *w, size_t *len);
