/* openai.c - read an OpenAI completion or chat body, refuse what we
 * cannot honour.
 *
 * Design. Each accepted key has a row (name, which endpoints, reader);
 * a key without a row is refused by name, so a new OpenAI parameter is
 * refused until someone decides what kvd does with it. Readers check
 * type and range and say which parameter failed.
 */
#include "net/wire/openai.h"
#include "net/wire/openai_int.h"
#include "net/wire/jschema.h"
#include "net/wire/proto_client.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int openai_error_set(struct openai_error *err, int status, const char *type,
		     const char *code, const char *param, const char *fmt, ...)
{
	va_list ap;

	err->status = status;
	snprintf(err->type, sizeof(err->type), "%s", type);
	snprintf(err->code, sizeof(err->code), "%s", code ? code : "");
	snprintf(err->param, sizeof(err->param), "%s", param ? param : "");
	va_start(ap, fmt);
	vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
	va_end(ap);
	return OPENAI_E_INVALID;
}

int openai__bad(struct openai_error *err, const char *param, const char *fmt, ...)
{
	char msg[200];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	return openai_error_set(err, 400, "invalid_request_error", NULL, param,
				"%s", msg);
}

/* A client's name that goes back to it: cut, never raw bytes. */
static void name_clean(char *out, size_t size, const char *name)
{
	snprintf(out, size, "%s", name);
	for (char *c = out; *c; c++)
		if ((unsigned char)*c < 0x20 || (unsigned char)*c > 0x7e ||
		    *c == '"' || *c == '\\')
			*c = '?';
}

/* A value kvd does not serve (an input item's or a part's type) at
 * `param` (our words: a path such as "input[2].type"). */
static int unsupported_at(struct openai_error *err, const char *param,
			  const char *name, const char *what)
{
	char clean[40];

	name_clean(clean, sizeof(clean), name);
	return openai_error_set(err, 400, "invalid_request_error",
				"unsupported_parameter", param,
				"'%s' is not supported by this server: %s", clean, what);
}

int openai__unsupported(struct openai_error *err, const char *key,
			const char *what)
{
	char param[40];

	name_clean(param, sizeof(param), key);
	return openai_error_set(err, 400, "invalid_request_error",
				"unsupported_parameter", param,
				"'%s' is not supported by this server%s%s", param,
				what ? ": " : "", what ? what : "");
}

/* ---- readers -------------------------------------------------------------- */

typedef int (*field_fn)(struct openai_req *q, const char *k, json_t *v,
			struct openai_error *err);

static int rd_model(struct openai_req *q, const char *k, json_t *v,
		    struct openai_error *err)
{
	if (!json_is_string(v) || json_string_length(v) > OPENAI_MODEL_MAX)
		return openai__bad(err, k, "'%s' must be a string of at most %u bytes", k,
			   OPENAI_MODEL_MAX);
	snprintf(q->model, sizeof(q->model), "%s", json_string_value(v));
	return 0;
}

static int tokens_of(struct openai_req *q, const char *k, json_t *arr,
		     struct openai_error *err)
{
	size_t n = json_array_size(arr), i;
	json_t *e;

	if (n == 0 || n > PROTO_CLIENT_TOKENS_MAX)
		return openai__bad(err, k, "'%s' holds 1..%u token ids", k, PROTO_CLIENT_TOKENS_MAX);
	q->tokens = malloc(n * sizeof(*q->tokens));
	if (!q->tokens)
		return -ENOMEM;
	json_array_foreach(arr, i, e) {
		json_int_t t;

		if (!json_is_integer(e) || (t = json_integer_value(e)) < 0 ||
		    t > UINT32_MAX)
			return openai__bad(err, k, "'%s' token %zu is not a token id", k, i);
		q->tokens[i] = (uint32_t)t;
	}
	q->n_tokens = (uint32_t)n;
	return 0;
}

static int rd_prompt(struct openai_req *q, const char *k, json_t *v,
		     struct openai_error *err)
{
	json_t *one;

	if (json_is_array(v) && json_array_size(v) == 1 &&
	    (json_is_string(one = json_array_get(v, 0)) || json_is_array(one)))
		v = one;   /* a batch of one */
	if (json_is_string(v)) {
		size_t n = json_string_length(v);

		if (n == 0 || n > PROTO_CLIENT_PROMPT_MAX)
			return openai__bad(err, k, "'%s' must be 1..%u bytes", k, PROTO_CLIENT_PROMPT_MAX);
		q->prompt = strdup(json_string_value(v));
		return q->prompt ? 0 : -ENOMEM;
	}
	if (json_is_array(v) && json_array_size(v) > 0 &&
	    json_is_integer(json_array_get(v, 0)))
		return tokens_of(q, k, v, err);
	if (json_is_array(v) && json_array_size(v) > 1)
		return openai__unsupported(err, k, "one prompt per request (n = 1)");
	return openai__bad(err, k, "'%s' must be a string or an array of token ids", k);
}

/* Text part types: chat's; the Responses API's, where an output_text
 * (an earlier answer sent back) may carry its annotations and logprobs,
 * which cannot change what is rendered and are dropped. */
static const struct part_type {
	const char *name;
	bool resp;                       /* Responses API (else chat) */
	bool extras;                     /* annotations, logprobs allowed */
} part_types[] = {
	{ "text", false, false },
	{ "input_text", true, false },
	{ "output_text", true, true },
};

static const struct part_type *part_type_of(const char *name, bool resp)
{
	for (size_t i = 0; i < sizeof(part_types) / sizeof(part_types[0]); i++)
		if (part_types[i].resp == resp && !strcmp(part_types[i].name, name))
			return &part_types[i];
	return NULL;
}

/* One content part: {"type": a text type, "text": a string} (and the
 * type's extras); 0 or the error. */
static int part_check(const char *k, size_t i, size_t j, json_t *part, bool resp,
		      struct openai_error *err)
{
	json_t *type = json_object_get(part, "type");
	json_t *text = json_object_get(part, "text");
	const struct part_type *pt;
	char param[48];
	size_t keys = 2;

	if (!json_is_string(type))
		return openai__bad(err, k, "'%s[%zu].content[%zu].type' must be a string", k, i, j);
	pt = part_type_of(json_string_value(type), resp);
	if (!pt && !resp)
		return openai__unsupported(err, json_string_value(type),
				   "content parts of type text only");
	if (!pt) {
		snprintf(param, sizeof(param), "%s[%zu].content[%zu].type", k, i, j);
		return unsupported_at(err, param, json_string_value(type),
				      "content parts of type input_text or output_text only");
	}
	if (pt->extras)
		keys += !!json_object_get(part, "annotations") +
			!!json_object_get(part, "logprobs");
	if (!json_is_string(text) || json_object_size(part) != keys)
		return openai__bad(err, k, "'%s[%zu].content[%zu]' must be {\"type\": \"%s\", \"text\": a string}",
			   k, i, j, pt->name);
	return 0;
}

/* A message's content: a string, or an array of text parts joined with
 * "\n" (vLLM's rule); another part type is refused by name. *out is
 * malloc'd. */
static int content_of(const char *k, size_t i, json_t *c, bool resp, char **out,
		      struct openai_error *err)
{
	size_t n = 0, j;
	json_t *part;
	char *p;
	int rc;

	if (json_is_string(c))
		return (*out = strdup(json_string_value(c))) ? 0 : -ENOMEM;
	if (!json_is_array(c) || json_array_size(c) == 0)
		return openai__bad(err, k, "'%s[%zu].content' must be a string or an array of text parts", k, i);
	json_array_foreach(c, j, part) {
		if ((rc = part_check(k, i, j, part, resp, err)))
			return rc;
		n += json_string_length(json_object_get(part, "text")) + 1;
	}
	if (!(p = *out = malloc(n)))
		return -ENOMEM;
	json_array_foreach(c, j, part) {
		json_t *text = json_object_get(part, "text");

		if (j)
			*p++ = '\n';
		memcpy(p, json_string_value(text), json_string_length(text));
		p += json_string_length(text);
	}
	*p = 0;
	return 0;
}

/* Its keys: role, content and name; an assistant's tool_calls, a tool
 * result's tool_call_id. An assistant's "parsed" is ignored: the openai
 * SDK's chat.completions.parse() adds it to the message it answers (its
 * own parse of the content), and its docs send that message back as it
 * is in the next request's history; the content stays what counts. */
static int msg_keys(const char *k, size_t i, json_t *m, const char *role,
		    struct openai_error *err)
{
	const char *key;
	json_t *x;

	json_object_foreach(m, key, x) {
		if (!strcmp(key, "role") || !strcmp(key, "content") || !strcmp(key, "name"))
			continue;
		if ((!strcmp(key, "tool_calls") || !strcmp(key, "parsed")) &&
		    !strcmp(role, "assistant"))
			continue;
		if (!strcmp(key, "tool_call_id") && !strcmp(role, "tool")) {
			if (!json_is_string(x) || json_string_length(x) > 256)
				return openai__bad(err, k, "'%s[%zu].tool_call_id' must be a string of at most 256 bytes", k, i);
			continue;
		}
		return openai__unsupported(err, key, "messages carry role and content (an assistant's tool_calls, a tool's tool_call_id)");
	}
	if (!strcmp(role, "tool") && !json_object_get(m, "tool_call_id"))
		return openai__bad(err, k, "'%s[%zu].tool_call_id' is required for a tool message", k, i);
	return 0;
}

static int msg_of(struct openai_req *q, const char *k, size_t i, json_t *m,
		  struct openai_error *err)
{
	static const char *const roles[] = { "system", "user", "assistant",
					     "developer", "tool" };
	json_t *role = json_object_get(m, "role");
	json_t *content = json_object_get(m, "content");
	struct openai_msg *om = &q->msgs[i];
	size_t r = 0;
	int rc;

	if (!json_is_object(m))
		return openai__bad(err, k, "'%s[%zu]' is not an object", k, i);
	if (!json_is_string(role))
		return openai__bad(err, k, "'%s[%zu].role' must be a string", k, i);
	while (r < 5 && strcmp(json_string_value(role), roles[r]))
		r++;
	if (r == 5)
		return openai__bad(err, k, "'%s[%zu].role' must be system, developer, user, assistant or tool", k, i);
	if ((rc = msg_keys(k, i, m, roles[r], err)))
		return rc;
	q->n_msgs = i + 1;
	if (!(om->role = strdup(roles[r])))
		return -ENOMEM;
	if ((rc = openai__msg_calls(om, i, json_object_get(m, "tool_calls"), err)))
		return rc;
	if (json_object_get(m, "tool_call_id") &&
	    !(om->tool_call_id = strdup(json_string_value(json_object_get(m, "tool_call_id")))))
		return -ENOMEM;
	if (om->n_calls && (!content || json_is_null(content)))
		return (om->content = strdup("")) ? 0 : -ENOMEM;
	return content_of(k, i, content, false, &om->content, err);
}

static int rd_messages(struct openai_req *q, const char *k, json_t *v,
		       struct openai_error *err)
{
	size_t n = json_array_size(v), i;
	json_t *m;
	int rc;

	if (!json_is_array(v) || n == 0 || n > OPENAI_MSGS_MAX)
		return openai__bad(err, k, "'%s' must be an array of 1..%u messages", k, OPENAI_MSGS_MAX);
	q->msgs = calloc(n, sizeof(*q->msgs));
	if (!q->msgs)
		return -ENOMEM;
	json_array_foreach(v, i, m)
		if ((rc = msg_of(q, k, i, m, err)))
			return rc;
	return 0;
}

static int rd_max_tokens(struct openai_req *q, const char *k, json_t *v,
			 struct openai_error *err)
{
	json_int_t n;

	if (json_is_null(v))
		return 0;
	if (!json_is_integer(v) || (n = json_integer_value(v)) < 1 ||
	    n > PROTO_CLIENT_MAX_TOKENS)
		return openai__bad(err, k, "'%s' must be an integer in 1..%u", k, PROTO_CLIENT_MAX_TOKENS);
	q->max_tokens = (uint32_t)n;
	return 0;
}

static int number(json_t *v, double lo, double hi, bool lo_open, double *out)
{
	double d;

	if (!json_is_number(v))
		return -1;
	d = json_number_value(v);
	if (!isfinite(d) || d < lo || d > hi || (lo_open && d <= lo))
		return -1;
	*out = d;
	return 0;
}

static int rd_temperature(struct openai_req *q, const char *k, json_t *v,
			  struct openai_error *err)
{
	double d;

	if (json_is_null(v))
		return 0;
	if (number(v, 0.0, 100.0, false, &d))
		return openai__bad(err, k, "'%s' must be a number in [0, 100]", k);
	q->temperature = (float)d;
	return 0;
}

static int rd_top_p(struct openai_req *q, const char *k, json_t *v,
		    struct openai_error *err)
{
	double d;

	if (json_is_null(v))
		return 0;
	if (number(v, 0.0, 1.0, true, &d) || (float)d <= 0.0f)
		return openai__bad(err, k, "'%s' must be a number in (0, 1]", k);
	q->top_p = (float)d;
	return 0;
}

static int rd_top_k(struct openai_req *q, const char *k, json_t *v,
		    struct openai_error *err)
{
	json_int_t n;

	if (json_is_null(v))
		return 0;
	if (!json_is_integer(v) || (n = json_integer_value(v)) < -1 ||
	    n > UINT32_MAX)
		return openai__bad(err, k, "'%s' must be an integer >= 0 (0 or -1: off)", k);
	q->top_k = n < 0 ? 0 : (uint32_t)n;
	return 0;
}

static int rd_seed(struct openai_req *q, const char *k, json_t *v,
		   struct openai_error *err)
{
	if (json_is_null(v))
		return 0;
	if (!json_is_integer(v) || json_integer_value(v) < 0)
		return openai__bad(err, k, "'%s' must be an integer >= 0", k);
	q->seed = (uint64_t)json_integer_value(v);
	q->has_seed = true;
	return 0;
}

static int stop_one(struct openai_req *q, const char *k, json_t *v,
		    struct openai_error *err)
{
	size_t n;

	if (!json_is_string(v) || (n = json_string_length(v)) == 0 ||
	    n > OPENAI_STOP_BYTES)
		return openai__bad(err, k, "'%s' strings are 1..%u bytes", k, OPENAI_STOP_BYTES);
	q->stop[q->n_stop] = strdup(json_string_value(v));
	if (!q->stop[q->n_stop])
		return -ENOMEM;
	q->stop_len[q->n_stop++] = n;
	return 0;
}

static int rd_stop(struct openai_req *q, const char *k, json_t *v,
		   struct openai_error *err)
{
	size_t i;
	json_t *e;
	int rc;

	if (json_is_null(v))
		return 0;
	if (json_is_string(v))
		return stop_one(q, k, v, err);
	if (!json_is_array(v) || json_array_size(v) > OPENAI_STOP_MAX)
		return openai__bad(err, k, "'%s' must be a string or an array of at most %u strings", k,
			   OPENAI_STOP_MAX);
	json_array_foreach(v, i, e)
		if ((rc = stop_one(q, k, e, err)))
			return rc;
	return 0;
}

static int rd_stream(struct openai_req *q, const char *k, json_t *v,
		     struct openai_error *err)
{
	if (json_is_null(v))
		return 0;
	if (!json_is_boolean(v))
		return openai__bad(err, k, "'%s' must be true or false", k);
	q->stream = json_is_true(v);
	return 0;
}

static int rd_cache_salt(struct openai_req *q, const char *k, json_t *v,
			 struct openai_error *err)
{
	size_t n;

	if (json_is_null(v))
		return 0;
	if (!json_is_string(v))
		return openai__bad(err, k, "'%s' must be a string", k);
	n = json_string_length(v);
	if (n == 0 || n > OPENAI_SALT_MAX || memchr(json_string_value(v), 0, n))
		return openai__bad(err, k, "'%s' must be 1 to %u bytes, without NUL", k,
			   OPENAI_SALT_MAX);
	memcpy(q->cache_salt, json_string_value(v), n);
	q->cache_salt[n] = 0;
	return 0;
}

/* A number in [lo, hi] ((lo, hi] with lo_open) into *out; null: absent. */
static int rd_float(float *out, const char *k, json_t *v, double lo, double hi,
		    bool lo_open, struct openai_error *err)
{
	double d;

	if (json_is_null(v))
		return 0;
	if (number(v, lo, hi, lo_open, &d))
		return openai__bad(err, k, "'%s' must be a number in %c%g, %g]", k,
			   lo_open ? '(' : '[', lo, hi);
	*out = (float)d;
	return 0;
}

static int rd_presence(struct openai_req *q, const char *k, json_t *v,
		       struct openai_error *err)
{
	return rd_float(&q->presence_penalty, k, v, -2.0, 2.0, false, err);
}

static int rd_frequency(struct openai_req *q, const char *k, json_t *v,
			struct openai_error *err)
{
	return rd_float(&q->frequency_penalty, k, v, -2.0, 2.0, false, err);
}

static int rd_repetition(struct openai_req *q, const char *k, json_t *v,
			 struct openai_error *err)
{
	return rd_float(&q->repetition_penalty, k, v, 0.0, 10.0, true, err);
}

static int rd_min_p(struct openai_req *q, const char *k, json_t *v,
		    struct openai_error *err)
{
	return rd_float(&q->min_p, k, v, 0.0, 1.0, false, err);
}

/* A token id as logit_bias writes it: 1..10 decimal digits, no sign, no
 * leading zero (so one id has one spelling), below 2^31. */
static int bias_id(const char *key, uint32_t *id)
{
	size_t n = strlen(key);
	uint64_t x = 0;

	if (n == 0 || n > 10 || (key[0] == '0' && n > 1))
		return -1;
	for (size_t i = 0; i < n; i++) {
		if (key[i] < '0' || key[i] > '9')
			return -1;
		x = x * 10 + (uint64_t)(key[i] - '0');
	}
	if (x > INT32_MAX)
		return -1;
	*id = (uint32_t)x;
	return 0;
}

static int bias_cmp(const void *pa, const void *pb)
{
	const struct sampler_bias *a = pa, *b = pb;

	return (a->id > b->id) - (a->id < b->id);
}

static int rd_logit_bias(struct openai_req *q, const char *k, json_t *v,
			 struct openai_error *err)
{
	size_t n = json_object_size(v), i = 0;
	const char *key;
	json_t *x;
	double d;

	if (json_is_null(v))
		return 0;
	if (!json_is_object(v) || n > OPENAI_BIAS_MAX)
		return openai__bad(err, k, "'%s' must be an object of at most %u token ids", k,
			   OPENAI_BIAS_MAX);
	if (n == 0)
		return 0;
	q->bias = malloc(n * sizeof(*q->bias));
	if (!q->bias)
		return -ENOMEM;
	json_object_foreach(v, key, x) {
		if (bias_id(key, &q->bias[i].id))
			return openai__bad(err, k, "'%s' keys must be token ids (decimal, no sign or leading zero)", k);
		if (number(x, -100.0, 100.0, false, &d))
			return openai__bad(err, k, "'%s' values must be numbers in [-100, 100]", k);
		q->bias[i++].bias = (float)d;
	}
	q->n_bias = (uint32_t)n;
	qsort(q->bias, n, sizeof(*q->bias), bias_cmp);
	return 0;
}

/* completions: an integer 0..5; chat: true or false */
static int rd_logprobs(struct openai_req *q, const char *k, json_t *v,
		       struct openai_error *err)
{
	json_int_t n;

	if (json_is_null(v))
		return 0;
	if (q->chat) {
		if (!json_is_boolean(v))
			return openai__bad(err, k, "'%s' must be true or false", k);
		q->logprobs = json_is_true(v);
		return 0;
	}
	if (!json_is_integer(v) || (n = json_integer_value(v)) < 0 ||
	    n > OPENAI_CMPL_LOGPROBS_MAX)
		return openai__bad(err, k, "'%s' must be an integer in 0..%u", k,
			   OPENAI_CMPL_LOGPROBS_MAX);
	q->logprobs = true;
	q->top_logprobs = (uint32_t)n;
	return 0;
}

static int rd_top_logprobs(struct openai_req *q, const char *k, json_t *v,
			   struct openai_error *err)
{
	json_int_t n;

	if (json_is_null(v))
		return 0;
	if (!json_is_integer(v) || (n = json_integer_value(v)) < 0 ||
	    n > OPENAI_TOP_LOGPROBS_MAX)
		return openai__bad(err, k, "'%s' must be an integer in 0..%u", k,
			   OPENAI_TOP_LOGPROBS_MAX);
	q->top_logprobs = (uint32_t)n;
	q->has_top_logprobs = true;
	return 0;
}

/* Fields that cannot change the output, by enum openai_ignored: accepted
 * at the type OpenAI gives them (null too), recorded in q->ignored. */
static const struct ignored {
	const char *name;
	json_type type;                  /* JSON_STRING, JSON_OBJECT, JSON_TRUE (a boolean) */
} ignored[OPENAI_IGNORED__N] = {
	[OPENAI_IGN_USER] = { "user", JSON_STRING },
	[OPENAI_IGN_METADATA] = { "metadata", JSON_OBJECT },
	[OPENAI_IGN_STORE] = { "store", JSON_TRUE },
	[OPENAI_IGN_SERVICE_TIER] = { "service_tier", JSON_STRING },
	/* read by rd_parallel: true (the default) changes nothing; false
	 * with tools is refused (openai__tools_check) */
	[OPENAI_IGN_PARALLEL_TOOL_CALLS] = { "parallel_tool_calls", JSON_TRUE },
	[OPENAI_IGN_PROMPT_CACHE_KEY] = { "prompt_cache_key", JSON_STRING },
	[OPENAI_IGN_PROMPT_CACHE_RETENTION] = { "prompt_cache_retention", JSON_STRING },
	[OPENAI_IGN_SAFETY_IDENTIFIER] = { "safety_identifier", JSON_STRING },
};

const char *openai_ignored_name(unsigned i)
{
	return i < OPENAI_IGNORED__N ? ignored[i].name : "?";
}

static int rd_ignored(struct openai_req *q, const char *k, json_t *v,
		      struct openai_error *err)
{
	static const char *const type_name[] = {
		[JSON_STRING] = "a string", [JSON_OBJECT] = "an object",
		[JSON_TRUE] = "true or false",
	};
	unsigned i = 0;

	while (i < OPENAI_IGNORED__N && strcmp(ignored[i].name, k))
		i++;
	if (i == OPENAI_IGNORED__N)
		return openai__unsupported(err, k, NULL);   /* a row without its name */
	if (!json_is_null(v) && json_typeof(v) != ignored[i].type &&
	    !(ignored[i].type == JSON_TRUE && json_is_boolean(v)))
		return openai__bad(err, k, "'%s' must be %s", k, type_name[ignored[i].type]);
	q->ignored |= 1u << i;
	return 0;
}

/* parallel_tool_calls: recorded; false with tools is held by the call
 * grammar (openai_tools_grammar), an ignored field otherwise. */
static int rd_parallel(struct openai_req *q, const char *k, json_t *v,
		       struct openai_error *err)
{
	q->no_parallel_calls = json_is_false(v);
	return rd_ignored(q, k, v, err);
}

/* n: the choices, 1..OPENAI_N_MAX (the front bounds it further by
 * http.max_n); best_of (completions) is read alone and must equal n
 * (req_complete): kvd returns every choice it samples. */
static int rd_n(struct openai_req *q, const char *k, json_t *v,
		struct openai_error *err)
{
	json_int_t n;

	if (json_is_null(v))
		return 0;
	n = json_is_integer(v) ? json_integer_value(v) : 0;
	if (n < 1 || n > OPENAI_N_MAX)
		return openai__bad(err, k, "'%s' must be an integer in 1..%u", k, OPENAI_N_MAX);
	if (!strcmp(k, "best_of"))
		q->best_of = (uint32_t)n;
	else
		q->n = (uint32_t)n;
	return 0;
}

static int rd_false(struct openai_req *q, const char *k, json_t *v,
		    struct openai_error *err)
{
	(void)q;
	if (json_is_null(v) || json_is_false(v) ||
	    (json_is_integer(v) && json_integer_value(v) == 0))
		return 0;
	return openai__unsupported(err, k, NULL);
}

static int rd_empty(struct openai_req *q, const char *k, json_t *v,
		    struct openai_error *err)
{
	(void)q;
	if (json_is_null(v) || (json_is_object(v) && json_object_size(v) == 0) ||
	    (json_is_array(v) && json_array_size(v) == 0))
		return 0;
	return openai__unsupported(err, k, NULL);
}

/* json_schema's object: name (1..64 of [A-Za-z0-9_-], as OpenAI asks),
 * schema (compiled here, off the loop: jschema.h), strict, description. */
static int schema_of(struct openai_req *q, const char *k, json_t *js,
		     struct openai_error *err)
{
	json_t *name = json_object_get(js, "name"), *schema, *strict;
	char msg[160];
	const char *key;
	json_t *x;
	int rc;

	if (!json_is_object(js))
		return openai__bad(err, k, "'%s.json_schema' must be an object", k);
	json_object_foreach(js, key, x)
		if (strcmp(key, "name") && strcmp(key, "schema") && strcmp(key, "strict") &&
		    strcmp(key, "description"))
			return openai__unsupported(err, key, "json_schema carries name, schema, strict, description");
	if (!json_is_string(name) || json_string_length(name) == 0 ||
	    json_string_length(name) > 64 ||
	    strspn(json_string_value(name), "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") !=
	    json_string_length(name))
		return openai__bad(err, k, "'%s.json_schema.name' must be 1..64 letters, digits, _ or -", k);
	strict = json_object_get(js, "strict");
	if (strict && !json_is_boolean(strict) && !json_is_null(strict))
		return openai__bad(err, k, "'%s.json_schema.strict' must be true or false", k);
	schema = json_object_get(js, "schema");
	if (!schema)
		return jgram_new_object(&q->gram);
	rc = jschema_compile(schema, &q->gram, msg, sizeof(msg));
	if (rc == JSCHEMA_E_INVALID)
		return openai__bad(err, k, "'%s.json_schema.schema': %s", k, msg);
	return rc;
}

static int rd_response_format(struct openai_req *q, const char *k, json_t *v,
			      struct openai_error *err)
{
	json_t *t = json_object_get(v, "type");
	const char *type = json_string_value(t);

	if (json_is_null(v))
		return 0;
	if (!json_is_object(v) || !type)
		return openai__bad(err, k, "'%s' must be an object with a string 'type'", k);
	if (!strcmp(type, "text") && json_object_size(v) == 1)
		return 0;
	if (!strcmp(type, "json_object") && json_object_size(v) == 1)
		return jgram_new_object(&q->gram);
	if (!strcmp(type, "json_schema") && json_object_size(v) == 2 &&
	    json_object_get(v, "json_schema"))
		return schema_of(q, k, json_object_get(v, "json_schema"), err);
	return openai__unsupported(err, k, "{\"type\": \"text\"}, {\"type\": \"json_object\"} or "
			   "{\"type\": \"json_schema\", \"json_schema\": {...}}");
}

static int rd_stream_options(struct openai_req *q, const char *k, json_t *v,
			     struct openai_error *err)
{
	(void)q;
	/* usage is always in the final chunk; include_usage changes nothing */
	if (json_is_null(v) || json_is_object(v))
		return 0;
	return openai__bad(err, k, "'%s' must be an object", k);
}

/* ---- the Responses API ------------------------------------------------------- */

/* One message of `input` as the chat role the template renders. */
static int msg_set(struct openai_msg *m, const char *role, const char *content)
{
	m->role = strdup(role);
	m->content = strdup(content);
	return m->role && m->content ? 0 : -ENOMEM;
}

static const char *const input_roles[] = { "system", "developer", "user", "assistant" };

/* One input item: a message ({"type": "message"} or no type), its
 * content a string or text parts; any other item type is named. */
static int input_item(struct openai_req *q, const char *k, size_t i, json_t *m,
		      struct openai_error *err)
{
	static const char *const keys[] = { "type", "role", "content", "id", "status" };
	json_t *type = json_object_get(m, "type");
	json_t *role = json_object_get(m, "role");
	const char *key;
	char param[48];
	size_t r = 0;
	json_t *x;

	if (!json_is_object(m))
		return openai__bad(err, k, "'%s[%zu]' is not an object", k, i);
	snprintf(param, sizeof(param), "%s[%zu].type", k, i);
	if (type && !json_is_string(type))
		return openai__bad(err, param, "'%s' must be a string", param);
	if (type && strcmp(json_string_value(type), "message"))
		return unsupported_at(err, param, json_string_value(type),
				      "input items of type message only");
	json_object_foreach(m, key, x) {
		size_t n = 0;

		while (n < sizeof(keys) / sizeof(keys[0]) && strcmp(keys[n], key))
			n++;
		if (n == sizeof(keys) / sizeof(keys[0]))
			return openai__unsupported(err, key, "input messages carry type, role, content, id and status");
	}
	while (json_is_string(role) && r < sizeof(input_roles) / sizeof(input_roles[0]) &&
	       strcmp(input_roles[r], json_string_value(role)))
		r++;
	if (r == sizeof(input_roles) / sizeof(input_roles[0]) || !json_is_string(role))
		return openai__bad(err, k, "'%s[%zu].role' must be system, developer, user or assistant", k, i);
	q->n_msgs = i + 1;
	if (!(q->msgs[i].role = strdup(input_roles[r])))
		return -ENOMEM;
	return content_of(k, i, json_object_get(m, "content"), true,
			  &q->msgs[i].content, err);
}

/* `input`: a string (one user message) or 1..OPENAI_MSGS_MAX items. */
static int rd_input(struct openai_req *q, const char *k, json_t *v,
		    struct openai_error *err)
{
	size_t n = json_array_size(v), i;
	json_t *m;
	int rc;

	if (json_is_string(v)) {
		if (json_string_length(v) == 0 || json_string_length(v) > PROTO_CLIENT_PROMPT_MAX)
			return openai__bad(err, k, "'%s' must be 1..%u bytes", k, PROTO_CLIENT_PROMPT_MAX);
		if (!(q->msgs = calloc(1, sizeof(*q->msgs))))
			return -ENOMEM;
		q->n_msgs = 1;
		return msg_set(&q->msgs[0], "user", json_string_value(v));
	}
	if (!json_is_array(v) || n == 0 || n > OPENAI_MSGS_MAX)
		return openai__bad(err, k, "'%s' must be a string or an array of 1..%u items", k,
			   OPENAI_MSGS_MAX);
	if (!(q->msgs = calloc(n, sizeof(*q->msgs))))
		return -ENOMEM;
	json_array_foreach(v, i, m)
		if ((rc = input_item(q, k, i, m, err)))
			return rc;
	return 0;
}

static int rd_instructions(struct openai_req *q, const char *k, json_t *v,
			   struct openai_error *err)
{
	if (json_is_null(v))
		return 0;
	if (!json_is_string(v) || json_string_length(v) > PROTO_CLIENT_PROMPT_MAX)
		return openai__bad(err, k, "'%s' must be a string of at most %u bytes", k,
			   PROTO_CLIENT_PROMPT_MAX);
	q->instructions = strdup(json_string_value(v));
	return q->instructions ? 0 : -ENOMEM;
}

/* `text`: {"format": {"type": "text"}} (or nothing); a schema, JSON mode
 * or a verbosity would change the answer. */
static int rd_text(struct openai_req *q, const char *k, json_t *v,
		   struct openai_error *err)
{
	json_t *f = json_object_get(v, "format");
	json_t *t = json_object_get(f, "type");
	const char *key;
	json_t *x;

	(void)q;
	if (json_is_null(v))
		return 0;
	if (!json_is_object(v))
		return openai__bad(err, k, "'%s' must be an object", k);
	json_object_foreach(v, key, x)
		if (strcmp(key, "format") && !json_is_null(x))
			return unsupported_at(err, "text", key, "text.format of type text only");
	if (!f || json_is_null(f) || (json_is_object(f) && json_object_size(f) == 1 &&
				      json_is_string(t) && !strcmp(json_string_value(t), "text")))
		return 0;
	return unsupported_at(err, "text.format", json_is_string(t) ? json_string_value(t) : "format",
			      "only {\"type\": \"text\"} is served");
}

static int rd_truncation(struct openai_req *q, const char *k, json_t *v,
			 struct openai_error *err)
{
	(void)q;
	if (json_is_null(v) || (json_is_string(v) && !strcmp(json_string_value(v), "disabled")))
		return 0;
	return openai__unsupported(err, k, "only \"disabled\" is served (a prompt too long is refused)");
}

/* instructions become the first message, a system one (OpenAI's rule:
 * they come before the input). */
static int instructions_first(struct openai_req *q)
{
	struct openai_msg *m;

	if (!q->instructions)
		return 0;
	m = calloc(q->n_msgs + 1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	memcpy(m + 1, q->msgs, q->n_msgs * sizeof(*m));
	if (!(m[0].role = strdup("system"))) {
		free(m);
		return -ENOMEM;
	}
	m[0].content = q->instructions;
	q->instructions = NULL;
	free(q->msgs);
	q->msgs = m;
	q->n_msgs++;
	return 0;
}

enum { EP_CMPL = 1, EP_CHAT = 2, EP_BOTH = 3, EP_RESP = 4 };

static const struct field {
	const char *name;
	unsigned ep;
	field_fn fn;
} fields[] = {
	{ "model", EP_BOTH, rd_model },
	{ "prompt", EP_CMPL, rd_prompt },
	{ "messages", EP_CHAT, rd_messages },
	{ "max_tokens", EP_BOTH, rd_max_tokens },
	{ "max_completion_tokens", EP_CHAT, rd_max_tokens },
	{ "temperature", EP_BOTH, rd_temperature },
	{ "top_p", EP_BOTH, rd_top_p },
	{ "top_k", EP_BOTH, rd_top_k },
	{ "seed", EP_BOTH, rd_seed },
	{ "stop", EP_BOTH, rd_stop },
	{ "stream", EP_BOTH, rd_stream },
	{ "stream_options", EP_BOTH, rd_stream_options },
	{ "user", EP_BOTH, rd_ignored },
	{ "metadata", EP_CHAT, rd_ignored },
	{ "store", EP_CHAT, rd_ignored },
	{ "service_tier", EP_CHAT, rd_ignored },
	{ "parallel_tool_calls", EP_CHAT, rd_parallel },
	{ "prompt_cache_key", EP_CHAT, rd_ignored },
	{ "prompt_cache_retention", EP_CHAT, rd_ignored },
	{ "safety_identifier", EP_CHAT, rd_ignored },
	{ "cache_salt", EP_BOTH, rd_cache_salt },
	{ "n", EP_BOTH, rd_n },
	{ "best_of", EP_CMPL, rd_n },
	{ "presence_penalty", EP_BOTH, rd_presence },
	{ "frequency_penalty", EP_BOTH, rd_frequency },
	{ "repetition_penalty", EP_BOTH, rd_repetition },
	{ "repeat_penalty", EP_BOTH, rd_repetition },
	{ "min_p", EP_BOTH, rd_min_p },
	{ "echo", EP_CMPL, rd_false },
	{ "logprobs", EP_BOTH, rd_logprobs },
	{ "top_logprobs", EP_CHAT, rd_top_logprobs },
	{ "suffix", EP_CMPL, rd_empty },
	{ "logit_bias", EP_BOTH, rd_logit_bias },
	{ "tools", EP_CHAT, openai__rd_tools },
	{ "tool_choice", EP_CHAT, openai__rd_tool_choice },
	{ "functions", EP_CHAT, rd_empty },
	{ "response_format", EP_BOTH, rd_response_format },
};

/* The Responses API's fields (its own table: its names differ, and it
 * has no top_k, stop or penalties). Off-values of what kvd cannot do
 * (null, [], {}, false, 0) are accepted, anything else is named. */
static const struct field resp_fields[] = {
	{ "model", EP_RESP, rd_model },
	{ "input", EP_RESP, rd_input },
	{ "instructions", EP_RESP, rd_instructions },
	{ "max_output_tokens", EP_RESP, rd_max_tokens },
	{ "temperature", EP_RESP, rd_temperature },
	{ "top_p", EP_RESP, rd_top_p },
	{ "seed", EP_RESP, rd_seed },
	{ "stream", EP_RESP, rd_stream },
	{ "stream_options", EP_RESP, rd_stream_options },
	{ "text", EP_RESP, rd_text },
	{ "truncation", EP_RESP, rd_truncation },
	{ "cache_salt", EP_RESP, rd_cache_salt },
	{ "user", EP_RESP, rd_ignored },
	{ "metadata", EP_RESP, rd_ignored },
	{ "store", EP_RESP, rd_ignored },   /* kvd keeps nothing: "store": false */
	{ "service_tier", EP_RESP, rd_ignored },
	{ "parallel_tool_calls", EP_RESP, rd_ignored },
	{ "prompt_cache_key", EP_RESP, rd_ignored },
	{ "prompt_cache_retention", EP_RESP, rd_ignored },
	{ "safety_identifier", EP_RESP, rd_ignored },
	{ "background", EP_RESP, rd_false },
	{ "top_logprobs", EP_RESP, rd_false },
	{ "previous_response_id", EP_RESP, rd_empty },
	{ "conversation", EP_RESP, rd_empty },
	{ "tools", EP_RESP, rd_empty },
	{ "tool_choice", EP_RESP, rd_empty },
	{ "max_tool_calls", EP_RESP, rd_empty },
	{ "reasoning", EP_RESP, rd_empty },
	{ "include", EP_RESP, rd_empty },
	{ "prompt", EP_RESP, rd_empty },
};

static const struct field *field_of(enum openai_ep ep, const char *k)
{
	const struct field *t = ep == OPENAI_EP_RESPONSES ? resp_fields : fields;
	size_t n = ep == OPENAI_EP_RESPONSES ? sizeof(resp_fields) / sizeof(resp_fields[0])
					     : sizeof(fields) / sizeof(fields[0]);
	unsigned mask = ep == OPENAI_EP_RESPONSES ? EP_RESP
			: ep == OPENAI_EP_CHAT ? EP_CHAT : EP_CMPL;

	for (size_t i = 0; i < n; i++)
		if (!strcmp(t[i].name, k) && (t[i].ep & mask))
			return &t[i];
	return NULL;
}

/* What the body must hold, once read. */
static int req_complete(struct openai_req *q, enum openai_ep ep,
			struct openai_error *err)
{
	int rc;

	if (ep == OPENAI_EP_COMPLETIONS && !q->prompt && !q->tokens)
		return openai__bad(err, "prompt", "'prompt' is required");
	if (ep == OPENAI_EP_CHAT && !q->msgs)
		return openai__bad(err, "messages", "'messages' is required");
	if (ep == OPENAI_EP_RESPONSES && !q->msgs)
		return openai__bad(err, "input", "'input' is required");
	if (ep == OPENAI_EP_CHAT && (rc = openai__tools_check(q, err)))
		return rc;
	if (q->has_top_logprobs && !q->logprobs)
		return openai__bad(err, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
	if (q->best_of && q->best_of != (q->n ? q->n : 1))
		return openai__unsupported(err, "best_of", "only best_of equal to n is served");
	for (uint32_t i = 1; i < q->n_bias; i++)
		if (q->bias[i].id == q->bias[i - 1].id)
			return openai__bad(err, "logit_bias", "'logit_bias' names token %u twice",
				   q->bias[i].id);
	return ep == OPENAI_EP_RESPONSES ? instructions_first(q) : 0;
}

int openai_req_parse(struct openai_req *q, bool chat, const char *body,
		     size_t len, struct openai_error *err)
{
	return openai_req_parse_ep(q, chat ? OPENAI_EP_CHAT : OPENAI_EP_COMPLETIONS,
				   body, len, err);
}

int openai_req_parse_ep(struct openai_req *q, enum openai_ep ep,
			const char *body, size_t len, struct openai_error *err)
{
	json_error_t je;
	json_t *root;
	const char *k;
	json_t *v;
	int rc = 0;

	memset(q, 0, sizeof(*q));
	q->chat = ep != OPENAI_EP_COMPLETIONS;
	q->temperature = 1.0f;
	q->top_p = 1.0f;
	root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
	if (!root)
		return openai__bad(err, NULL, "the body is not valid JSON: %s (line %d, column %d)",
			   je.text, je.line, je.column);
	if (!json_is_object(root)) {
		json_decref(root);
		return openai__bad(err, NULL, "the body must be a JSON object");
	}
	json_object_foreach(root, k, v) {
		const struct field *f = field_of(ep, k);

		if (!f) {
			rc = openai__unsupported(err, k, NULL);
			break;
		}
		rc = f->fn(q, k, v, err);
		if (rc)
			break;
	}
	if (!rc)
		rc = req_complete(q, ep, err);
	if (!rc && !q->n)
		q->n = 1;
	json_decref(root);
	if (rc)
		openai_req_deinit(q);
	return rc;
}

void openai_req_deinit(struct openai_req *q)
{
	openai__tools_free(q);
	free(q->prompt);
	free(q->tokens);
	for (size_t i = 0; i < q->n_msgs; i++) {
		free(q->msgs[i].role);
		free(q->msgs[i].content);
	}
	free(q->msgs);
	free(q->instructions);
	free(q->bias);
	jgram_free(q->gram);
	for (uint32_t i = 0; i < q->n_stop; i++)
		free(q->stop[i]);
	memset(q, 0, sizeof(*q));
}
