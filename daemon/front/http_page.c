/* http_page.c - the chat page: GET /, /chat.js, /chat.css.
 *
 * Design. The page is three static files compiled into the binary
 * (http_page.h): nothing is read from disk or fetched from elsewhere at
 * run time, so what a node serves is what was built and reviewed. They
 * hold no data - no model output, no key, nothing of a tenant - so they
 * are served without a key, like /health; the page's own calls
 * (/v1/models, /v1/chat/completions) go through the API and its keys
 * like any client's.
 *
 * Headers. A strict Content-Security-Policy: the page may load script,
 * style and connections from this origin only (no inline script or
 * style, so no 'unsafe-inline'), no frames, no forms posted anywhere,
 * no base-URI change; nosniff; no referrer. Model output can then only
 * ever be text (the script inserts it with textContent) and even an
 * injected tag could load or send nothing. ETag (a hash of the bytes,
 * made at build time) with Cache-Control: no-cache: the browser asks
 * again each load and gets a 304 without the body while the build is
 * the same.
 */
#include "daemon/front/http_page.h"
#include "daemon/front/http_int.h"

#include <string.h>

#define PAGE_HEADERS                                                        \
	"Cache-Control: no-cache\r\n"                                       \
	"Content-Security-Policy: default-src 'none'; script-src 'self'; "  \
	"style-src 'self'; connect-src 'self'; img-src 'self' data:; "      \
	"base-uri 'none'; form-action 'none'; frame-ancestors 'none'\r\n"   \
	"X-Content-Type-Options: nosniff\r\n"                               \
	"Referrer-Policy: no-referrer\r\n"

/* The asset at the request's path (without its query); NULL none. */
static const struct http_page_asset *page_find(const char *path)
{
	size_t plen = strcspn(path, "?");

	for (size_t i = 0; i < http_page_n_assets; i++) {
		const struct http_page_asset *a = &http_page_assets[i];

		if (strlen(a->path) == plen && !strncmp(a->path, path, plen))
			return a;
	}
	return NULL;
}

/* If-None-Match names the asset's ETag (one of a comma-separated list,
 * or "*"): the client's copy is current. */
static bool page_fresh(const struct http_page_asset *a, const char *inm)
{
	size_t elen = strlen(a->etag);
	const char *p = inm;

	if (!strcmp(inm, "*"))
		return true;
	while ((p = strstr(p, a->etag)) != NULL) {
		char after = p[elen];

		if (after == '\0' || after == ',' || after == ' ' || after == '\t')
			return true;
		p += elen;
	}
	return false;
}

bool http_page_get(struct http_conn *hc, const struct http_msg *m)
{
	const struct http_page_asset *a = page_find(m->path);
	char extra[512];
	int status;

	if (!hc->s->d->cfg.http_chat_page || !a)
		return false;
	status = page_fresh(a, m->if_none_match) ? 304 : 200;
	snprintf(extra, sizeof(extra), "ETag: %s\r\n" PAGE_HEADERS, a->etag);
	/* a 304's Content-Length is the 200's (RFC 9110 8.6); no body */
	http__head_ext(hc, status, a->ctype, (long long)a->len, extra);
	if (status == 200)
		http__write_copy(hc, (const char *)a->data, a->len);
	KVLOG_DEBUG(hc->s->log, "http_page", "conn=%llu path=%s status=%d bytes=%zu",
		    (unsigned long long)hc->conn_id, a->path, status,
		    status == 200 ? a->len : (size_t)0);
	http__exchange_done(hc);
	return true;
}
