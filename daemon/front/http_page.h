/* http_page.h - the chat page the HTTP front serves at GET / (and its
 * /chat.js, /chat.css): static files compiled into kvd.
 *
 * The files are daemon/front/page/; at build time
 * daemon/front/page/embed.py turns them into http_page_assets[] (a
 * generated C file, daemon/meson.build). The page holds no data and is
 * served without a key; every API call it makes carries the key its user
 * types. http.chat_page = off: the paths are 404 (http_api.c). Loop
 * thread only.
 */
#pragma once

#include <stddef.h>

#include <stdbool.h>

struct http_conn;
struct http_msg;

/* One embedded file (generated; read-only for the process' life). */
struct http_page_asset {
	const char *path;                /* URL path: "/", "/chat.js", ... */
	const char *ctype;               /* Content-Type */
	const char *etag;                /* quoted: "\"<32 hex>\"" */
	const unsigned char *data;       /* (len) bytes */
	size_t len;
};

extern const struct http_page_asset http_page_assets[];
extern const size_t http_page_n_assets;

/* GET of an asset's path: 200 with the bytes, 304 when If-None-Match
 * names its ETag, and true (the exchange is complete). False, having
 * written nothing, when http.chat_page is off or no asset has the path:
 * the caller answers 404. */
bool http_page_get(struct http_conn *hc, const struct http_msg *m);
