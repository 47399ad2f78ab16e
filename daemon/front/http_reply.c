/* http_reply.c - answers that belong to no request, and API keys.
 *
 * The OpenAI-shaped error (logged, counted, the exchange done after it),
 * the JSON answer, the refusal log line, and the request's key: the
 * endpoint files (http_api.c, http_tok.c) call these, and the CORS
 * preflight's answer; this file calls
 * only http.c (the writes), so no endpoint calls back into another.
 */
#include "daemon/front/http_int.h"
#include "daemon/node/serve_int.h"
#include "conf/apikeys.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* (a request refused after its body was prepared is no longer the
 * parser's: the exchange kept its method and path) */
void http__log(struct http_conn *hc, int status, const char *tenant,
		    const char *what)
{
	bool kept = hc->x.method[0];

	KVLOG_RL_INFO(hc->s->log, &hc->s->rl[SERVE_RL_HTTP_REFUSED], "http_request",
		   "conn=%llu tenant=%s method=%s path=%s status=%d msg=%s",
		   (unsigned long long)hc->conn_id, KVLOG_Q(tenant),
		   KVLOG_Q(kept ? hc->x.method : hc->wire.msg.method_name),
		   KVLOG_Q(kept ? hc->x.path : hc->wire.msg.path),
		   status, KVLOG_Q(what));
}

char *http__error_json(const char *msg, const char *type, const char *code,
			const char *param, size_t *len)
{
	json_t *e = json_pack("{s:{s:s, s:s, s:o, s:o}}", "error",
			      "message", msg, "type", type,
			      "param", param && *param ? json_string(param) : json_null(),
			      "code", code && *code ? json_string(code) : json_null());
	char *out = e ? json_dumps(e, JSON_COMPACT) : NULL;

	json_decref(e);
	*len = out ? strlen(out) : 0;
	return out;
}

void http__respond_json(struct http_conn *hc, int status, json_t *j)
{
	char *body = j ? json_dumps(j, JSON_COMPACT) : NULL;

	json_decref(j);
	if (!body) {
		http__respond(hc, 500, "application/json", "{}", 2);
		return;
	}
	http__respond(hc, status, "application/json", body, strlen(body));
	free(body);
}

/* An answer that belongs to no request (routing, keys, the body): the
 * exchange is complete after it. msg must be safe to echo (our words,
 * or sanitized by the parser). */
void http__error(struct http_conn *hc, int status, const char *type,
		      const char *code, const char *param, const char *msg,
		      const char *tenant)
{
	size_t len;
	char *body = http__error_json(msg, type, code, param, &len);

	http__log(hc, status, tenant, msg);
	http__refusal_count(hc->s, status, tenant, PROTO_ERR_DRAINING);
	if (body) {
		http__respond(hc, status, "application/json", body, len);
	} else {
		http__respond(hc, 500, "application/json", "{}", 2);
	}
	free(body);
	http__exchange_done(hc);
}

/* Without keys every request is tenant "default", a user with the
 * config's limits. */
static const struct kvd_apikey_info api_keyless = { .tenant = KVD_TENANT_DEFAULT };

/* The request's key: its tenant, role and limits (api_keyless without
 * keys); NULL for a missing or wrong key (nothing answered). */
const struct kvd_apikey_info *http__key_info(const struct http_server *hs,
						  const struct http_msg *m)
{
	const char *v = m->auth;

	if (!hs->s->keys)
		return &api_keyless;
	if (m->has_auth && !strncasecmp(v, "Bearer ", 7)) {
		v += 7;
		while (*v == ' ')
			v++;
		return kvd_apikeys_find(hs->s->keys, v, strlen(v));
	}
	return NULL;
}

/* The request's key; NULL after answering 401. */
const struct kvd_apikey_info *http__auth_key(struct http_conn *hc,
						  const struct http_msg *m)
{
	const struct kvd_apikey_info *k = http__key_info(hc->hs, m);

	if (k)
		return k;
	http__error(hc, 401, "invalid_request_error", "invalid_api_key", NULL,
		  m->has_auth ? "Incorrect API key provided."
			      : "No API key provided: send `Authorization: Bearer KEY`.",
		  "-");
	return NULL;
}

/* The tenant of the request's key; NULL after answering 401. */
const char *http__auth(struct http_conn *hc, const struct http_msg *m)
{
	const struct kvd_apikey_info *k = http__auth_key(hc, m);

	return k ? k->tenant : NULL;
}

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

/* The CORS preflight (http_cors.c decided hc->cors with the head). */
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
