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
 */
#include "daemon/front/http_int.h"
#include "conf/util.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

_Static_assert(HTTP_WIRE_ORIGIN_MAX == KVD_ORIGIN_MAX,
	       "the parser keeps every origin the allow-list can hold");

/* What the openai JS client sends beside Authorization and Content-Type
 * (its x-stainless-* telemetry, the organization and project headers). */
#define CORS_ALLOW_HEADERS \
	"Authorization, Content-Type, Accept, OpenAI-Organization, " \
	"OpenAI-Project, OpenAI-Beta, X-Stainless-Lang, " \
	"X-Stainless-Package-Version, X-Stainless-OS, X-Stainless-Arch, " \
	"X-Stainless-Runtime, X-Stainless-Runtime-Version, " \
	"X-Stainless-Retry-Count, X-Stainless-Timeout, X-Stainless-Helper-Method"
/* Seconds a browser may reuse a preflight's answer (Chromium caps 7200). */
#define CORS_MAX_AGE_S 600

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
	/* the origin passed cors_origin_valid: no CR, LF or quote in it */
	n = snprintf(buf, size, "Access-Control-Allow-Origin: %s\r\nVary: Origin\r\n",
		     hc->cors_origin);
	return n < 0 ? 0 : KVD_MIN((size_t)n, size - 1);
}

void http__cors_preflight(struct http_conn *hc, const struct http_msg *m,
			  const char *methods)
{
	static const char forbidden[] =
		"{\"error\":{\"message\":\"this origin is not allowed (http.cors_origins)\",\"type\":\"invalid_request_error\",\"param\":null,\"code\":\"cors_origin_not_allowed\"}}\n";
	char extra[1024];

	if (m->has_origin && !hc->cors) {
		KVLOG_RL_INFO(hc->s->log, &hc->s->rl[SERVE_RL_HTTP_REFUSED], "http_request",
			      "conn=%llu tenant=- method=OPTIONS path=%s status=403 origin=%s msg=\"origin not allowed\"",
			      (unsigned long long)hc->conn_id, KVLOG_Q(m->path),
			      KVLOG_Q(m->origin));
		http__refusal_count(hc->s, 403, NULL, PROTO_ERR_INTERNAL);
		http__respond(hc, 403, "application/json", forbidden, sizeof(forbidden) - 1);
		http__exchange_done(hc);
		return;
	}
	if (!m->has_origin)
		snprintf(extra, sizeof(extra), "Allow: OPTIONS, %s\r\n", methods);
	else
		snprintf(extra, sizeof(extra),
			 "Access-Control-Allow-Methods: OPTIONS, %s\r\n"
			 "Access-Control-Allow-Headers: " CORS_ALLOW_HEADERS "\r\n"
			 "Access-Control-Max-Age: %d\r\n",
			 methods, CORS_MAX_AGE_S);
	http__no_content(hc, extra);
	http__exchange_done(hc);
}
