/* http_cors.c - CORS for the HTTP front: an allow-list of origins.
 *
 * Design. A browser page on another origin may call the API only when
 * the answer says so. http.cors_origins lists the origins that may
 * (or "*" for any); empty, the default, is off: no answer carries a CORS
 * header, and every preflight is refused. The decision is made once per
 * request, when its head is complete (http__cors_judge), and kept on the
 * connection, because an answer - a stream above all - is written long
 * after the parser moved on; every answer's head then carries it
 * (http.c), JSON, SSE, errors and 401s alike, so a page can read why a
 * request failed.
 *
 * The origin is echoed, never "*", even when any is allowed: with
 * `Vary: Origin` a cache cannot hand one origin's answer to another.
 * CORS does not replace the key: a preflight needs none (browsers send
 * none), the request that follows still does. Credentials (cookies) are
 * not allowed: the API reads none.
 *
 * The Origin is compared whole and case-insensitively (scheme and host
 * are; conf/util.h kvd_origins), against entries the config check found
 * to look like an origin (scheme://host[:port], no path), so a typo
 * fails the boot (exit 78) instead of silently allowing nothing. The
 * parser refuses an Origin longer than its buffer (431) and a repeated
 * one (400): never a cut prefix.
 *
 * SIGHUP reads the list again from the INI (serve.c): the list lives
 * here, and the next request's head meets the new one; a request whose
 * head was judged keeps its answer (a stream its headers).
 */
#include "daemon/front/http_int.h"
#include "conf/util.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

_Static_assert(HTTP_WIRE_ORIGIN_MAX == KVD_ORIGIN_MAX,
	       "the parser keeps every origin the allow-list can hold");

struct kvd_origins *serve__http_cors(struct serve *s)
{
	return s->front->http ? &s->front->http->cors : NULL;
}

void http__cors_judge(struct http_conn *hc, const struct http_msg *m)
{
	hc->cors = m->has_origin && kvd_origins_allow(&hc->hs->cors, m->origin);
	if (hc->cors)
		snprintf(hc->cors_origin, sizeof(hc->cors_origin), "%s", m->origin);
	else
		hc->cors_origin[0] = 0;
}

size_t http__cors_headers(const struct http_conn *hc, char *buf, size_t size)
{
	int n;

	if (!size)
		return 0;
	buf[0] = 0;
	if (!hc->cors)
		return 0;
	/* the origin passed cors_origin_valid: no CR, LF or quote in it.
	 * Retry-After is not a CORS-safelisted header: exposed, a page (or
	 * the openai client in a browser) can read when to retry a 429/503 */
	n = snprintf(buf, size, "Access-Control-Allow-Origin: %s\r\n"
		     "Access-Control-Expose-Headers: Retry-After\r\nVary: Origin\r\n",
		     hc->cors_origin);
	return n < 0 ? 0 : KVD_MIN((size_t)n, size - 1);
}
