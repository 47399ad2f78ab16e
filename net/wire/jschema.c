/* jschema.c - JSON Schema -> jsongram nodes (jschema.h).
 *
 * Design. One recursive walk: a schema object's children (property and
 * item schemas) are compiled first, so every node refers only to nodes
 * before it (what jgram_seal asks), then the node itself and its
 * literals (enum values or property names, contiguous). Each keyword has
 * a row in a table (what it is for); a key without a row is refused by
 * name. anyOf/oneOf compile each branch (enum-only ones merged into one
 * enum, refused once past JGRAM_LITS_MAX values; object branches with a
 * const tag property into one tagged union of their untagged copies)
 * and chain them as alternatives, refused when two may start alike. String checks (minLength,
 * maxLength, pattern, format as a built-in pattern) and number ranges go
 * to the grammar's tables (jgram_str_add, jgram_range_add). $ref is
 * inlined, so a recursive schema runs into the depth bound and is
 * refused; the node bound caps a schema that refers to one
 * definition many times.
 */
#include "net/wire/jschema.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct jsc {
	struct jgram *g;
	const json_t *root;              /* for $ref */
	unsigned depth;
	char *msg;
	size_t msg_len;
};

static int jsc_bad(struct jsc *c, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static int jsc_bad(struct jsc *c, const char *fmt, ...)
{
	va_list ap;

	if (c->msg && c->msg_len) {
		va_start(ap, fmt);
		vsnprintf(c->msg, c->msg_len, fmt, ap);
		va_end(ap);
	}
	return JSCHEMA_E_INVALID;
}

/* A client's key, safe to quote back: printable ASCII, cut. */
static const char *jsc_name(const char *k, char *buf, size_t n)
{
	snprintf(buf, n, "%s", k);
	for (char *p = buf; *p; p++)
		if ((unsigned char)*p < 0x20 || (unsigned char)*p > 0x7e ||
		    *p == '"' || *p == '\\')
			*p = '?';
	return buf;
}

/* ---- keywords ----------------------------------------------------------- */

enum kw_use { KW_ANNOTATION, KW_READ };

static const struct kw {
	const char *name;
	enum kw_use use;
} keywords[] = {
	{ "type", KW_READ }, { "properties", KW_READ }, { "required", KW_READ },
	{ "additionalProperties", KW_READ }, { "items", KW_READ },
	{ "minItems", KW_READ }, { "maxItems", KW_READ }, { "enum", KW_READ },
	{ "const", KW_READ }, { "$ref", KW_READ }, { "anyOf", KW_READ },
	{ "oneOf", KW_READ }, { "minLength", KW_READ }, { "maxLength", KW_READ },
	{ "pattern", KW_READ }, { "format", KW_READ }, { "minimum", KW_READ },
	{ "maximum", KW_READ }, { "exclusiveMinimum", KW_READ },
	{ "exclusiveMaximum", KW_READ },
	{ "title", KW_ANNOTATION }, { "description", KW_ANNOTATION },
	{ "$comment", KW_ANNOTATION }, { "examples", KW_ANNOTATION },
	{ "default", KW_ANNOTATION }, { "$schema", KW_ANNOTATION },
	{ "$id", KW_ANNOTATION }, { "$defs", KW_ANNOTATION },
	{ "definitions", KW_ANNOTATION },
};

static int jsc_keywords(struct jsc *c, const json_t *s)
{
	const char *k;
	json_t *v;
	char nb[40];

	json_object_foreach((json_t *)s, k, v) {
		size_t i = 0;

		while (i < sizeof(keywords) / sizeof(keywords[0]) && strcmp(keywords[i].name, k))
			i++;
		if (i == sizeof(keywords) / sizeof(keywords[0]))
			return jsc_bad(c, "the schema keyword '%s' is not supported", jsc_name(k, nb, sizeof(nb)));
	}
	return 0;
}

static const struct type_name {
	const char *name;
	unsigned bit;
} type_names[] = {
	{ "object", JGRAM_T_OBJECT }, { "array", JGRAM_T_ARRAY },
	{ "string", JGRAM_T_STRING }, { "number", JGRAM_T_NUMBER },
	{ "integer", JGRAM_T_INTEGER }, { "boolean", JGRAM_T_BOOLEAN },
	{ "null", JGRAM_T_NULL },
};

/* The name of a kind in bits (the lowest). */
static const char *type_of(unsigned bits)
{
	for (size_t i = 0; i < sizeof(type_names) / sizeof(type_names[0]); i++)
		if (bits & type_names[i].bit)
			return type_names[i].name;
	return "values";
}

static int type_bit(struct jsc *c, const json_t *v, unsigned *bits)
{
	char nb[40];

	if (!json_is_string(v))
		return jsc_bad(c, "'type' must be a type name or a list of them");
	for (size_t i = 0; i < sizeof(type_names) / sizeof(type_names[0]); i++) {
		if (!strcmp(type_names[i].name, json_string_value(v))) {
			*bits |= type_names[i].bit;
			return 0;
		}
	}
	return jsc_bad(c, "the type '%s' is not supported", jsc_name(json_string_value(v), nb, sizeof(nb)));
}

static int jsc_types(struct jsc *c, const json_t *s, unsigned *types)
{
	const json_t *t = json_object_get(s, "type");
	size_t i;
	json_t *e;
	int rc;

	*types = 0;
	if (!t) {
		*types = JGRAM_T_ALL;
		return 0;
	}
	if (!json_is_array(t))
		return type_bit(c, t, types);
	if (json_array_size(t) == 0)
		return jsc_bad(c, "'type' must not be an empty list");
	json_array_foreach(t, i, e)
		if ((rc = type_bit(c, e, types)))
			return rc;
	return 0;
}

static int jsc_count(struct jsc *c, const json_t *s, const char *k, uint32_t *out)
{
	const json_t *v = json_object_get(s, k);

	if (!v)
		return 0;
	if (!json_is_integer(v) || json_integer_value(v) < 0 ||
	    json_integer_value(v) > JGRAM_ITEMS_MAX)
		return jsc_bad(c, "'%s' must be an integer in 0..%u", k, JGRAM_ITEMS_MAX);
	*out = (uint32_t)json_integer_value(v);
	return 0;
}

/* ---- the walk ------------------------------------------------------------- */

static int jsc_node(struct jsc *c, const json_t *s, uint16_t *id);

/* "#/$defs/NAME" or "#/definitions/NAME" in the root schema. */
static int jsc_ref(struct jsc *c, const json_t *ref, uint16_t *id)
{
	const char *r = json_is_string(ref) ? json_string_value(ref) : "";
	const char *name = NULL, *where = NULL;
	const json_t *defs, *target;
	char nb[40];

	if (!strncmp(r, "#/$defs/", 8))
		where = "$defs", name = r + 8;
	else if (!strncmp(r, "#/definitions/", 14))
		where = "definitions", name = r + 14;
	if (!name || strchr(name, '/') || strchr(name, '~'))
		return jsc_bad(c, "'$ref' must be \"#/$defs/NAME\" or \"#/definitions/NAME\", not '%s'",
			       jsc_name(r, nb, sizeof(nb)));
	defs = json_object_get(c->root, where);
	target = json_is_object(defs) ? json_object_get(defs, name) : NULL;
	if (!target)
		return jsc_bad(c, "'$ref' names '%s', which is not defined", jsc_name(name, nb, sizeof(nb)));
	return jsc_node(c, target, id);
}

/* Does JSON value v have one of the types? */
static bool value_fits(const json_t *v, unsigned types)
{
	switch (json_typeof(v)) {
	case JSON_STRING: return types & JGRAM_T_STRING;
	case JSON_INTEGER: return types & (JGRAM_T_INTEGER | JGRAM_T_NUMBER);
	case JSON_REAL: return types & JGRAM_T_NUMBER;
	case JSON_TRUE:
	case JSON_FALSE: return types & JGRAM_T_BOOLEAN;
	case JSON_NULL: return types & JGRAM_T_NULL;
	default: return false;
	}
}

static int jsc_lit(struct jsc *c, const json_t *v, uint16_t node, uint32_t *idx)
{
	char *text = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
	int rc;

	if (!text)
		return -ENOMEM;
	rc = jgram_lit_add(c->g, text, strlen(text), node, idx);
	free(text);
	if (rc == JGRAM_E_INVALID)
		return jsc_bad(c, "the schema's values and names exceed %u bytes", JGRAM_LIT_BYTES_MAX);
	return rc;
}

/* Keywords an enum/const would have to be checked against: refused. */
static const char *const str_kws[] = { "minLength", "maxLength", "pattern", "format",
				       "minimum", "maximum", "exclusiveMinimum",
				       "exclusiveMaximum" };

/* enum / const: the values of the node's types, as its literals. */
static int jsc_enum(struct jsc *c, const json_t *s, unsigned types, uint16_t *id)
{
	const json_t *e = json_object_get(s, "enum"), *k = json_object_get(s, "const");
	struct jgram_node *n;
	json_t *one = NULL;
	uint32_t first = 0, cnt = 0, idx;
	size_t i;
	json_t *v;
	int rc;

	if (e && k)
		return jsc_bad(c, "'enum' and 'const' together are not supported");
	for (size_t w = 0; w < sizeof(str_kws) / sizeof(str_kws[0]); w++)
		if (json_object_get(s, str_kws[w]))
			return jsc_bad(c, "'%s' with 'enum' or 'const' is not supported", str_kws[w]);
	if (k)
		e = one = json_pack("[O]", k);
	if (!e)
		return -ENOMEM;
	if (!json_is_array(e) || json_array_size(e) == 0 || json_array_size(e) > JGRAM_LITS_MAX)
		rc = jsc_bad(c, "'enum' must be a list of 1..%u values", JGRAM_LITS_MAX);
	else if ((rc = jgram_node_add(c->g, id, &n)) == JGRAM_E_INVALID)
		rc = jsc_bad(c, "the schema has more than %u nodes", JGRAM_NODES_MAX);
	json_array_foreach(e, i, v) {
		if (rc)
			break;
		if (json_is_object(v) || json_is_array(v))
			rc = jsc_bad(c, "'enum' and 'const' values must be strings, numbers, booleans or null");
		else if (value_fits(v, types) && !(rc = jsc_lit(c, v, 0, &idx)))
			first = cnt++ ? first : idx;
	}
	json_decref(one);
	if (!rc && !cnt)
		rc = jsc_bad(c, "'enum' has no value of the schema's type");
	if (!rc)
		*jgram_node(c->g, *id) = (struct jgram_node){ .is_enum = true,
			.lit = first, .n_lit = cnt };
	return rc;
}

struct props {
	const char *name[JGRAM_LITS_MAX];
	uint16_t node[JGRAM_LITS_MAX];
	uint32_t n;
	uint64_t required;
};

static int jsc_required(struct jsc *c, const json_t *s, struct props *p)
{
	const json_t *req = json_object_get(s, "required");
	size_t i;
	json_t *v;
	char nb[40];

	if (!req)
		return 0;
	if (!json_is_array(req))
		return jsc_bad(c, "'required' must be a list of property names");
	json_array_foreach(req, i, v) {
		uint32_t k = 0;

		if (!json_is_string(v))
			return jsc_bad(c, "'required' must be a list of property names");
		while (k < p->n && strcmp(p->name[k], json_string_value(v)))
			k++;
		if (k == p->n)
			return jsc_bad(c, "'required' names '%s', which is not in 'properties'",
				       jsc_name(json_string_value(v), nb, sizeof(nb)));
		p->required |= UINT64_C(1) << k;
	}
	return 0;
}

static int jsc_props(struct jsc *c, const json_t *s, struct props *p, bool *free_keys)
{
	const json_t *props = json_object_get(s, "properties");
	const json_t *add = json_object_get(s, "additionalProperties");
	const char *k;
	json_t *v;
	int rc;

	if (add && !json_is_boolean(add))
		return jsc_bad(c, "'additionalProperties' must be true or false (a schema is not supported)");
	if (props && !json_is_object(props))
		return jsc_bad(c, "'properties' must be an object");
	if (json_object_size(props) > JGRAM_LITS_MAX)
		return jsc_bad(c, "'properties' holds more than %u names", JGRAM_LITS_MAX);
	json_object_foreach((json_t *)props, k, v) {
		if ((rc = jsc_node(c, v, &p->node[p->n])))
			return rc;
		p->name[p->n++] = k;
	}
	/* no properties and extra keys allowed: any keys, any values */
	*free_keys = !props && !json_is_false(add);
	return jsc_required(c, s, p);
}

static int jsc_add_props(struct jsc *c, struct jgram_node *n, const struct props *p)
{
	uint32_t idx;
	int rc;

	for (uint32_t i = 0; i < p->n; i++) {
		json_t *name = json_string(p->name[i]);

		if (!name)
			return -ENOMEM;
		rc = jsc_lit(c, name, p->node[i], &idx);
		json_decref(name);
		if (rc)
			return rc;
		n->lit = i ? n->lit : idx;
	}
	n->n_lit = p->n;
	n->required = p->required;
	return 0;
}

/* ---- strings -------------------------------------------------------------- */

/* format: a pattern every string of which the format's checkers take
 * (days 01-28 only, so every date exists; years 1000-2999). */
static const struct fmt {
	const char *name, *re;
} formats[] = {
	{ "date-time", "^[12]\\d{3}-(0[1-9]|1[0-2])-(0[1-9]|1\\d|2[0-8])T([01]\\d|2[0-3]):[0-5]\\d:"
		       "[0-5]\\d(\\.\\d{1,6})?(Z|[+-]([01]\\d|2[0-3]):[0-5]\\d)$" },
	{ "date", "^[12]\\d{3}-(0[1-9]|1[0-2])-(0[1-9]|1\\d|2[0-8])$" },
	{ "time", "^([01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d(\\.\\d{1,6})?(Z|[+-]([01]\\d|2[0-3]):[0-5]\\d)$" },
	{ "uuid", "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$" },
	/* a top-level domain of 2 or 3 letters but "alt": no special-use
	 * name (local, test, onion, arpa, alt ...) that checkers refuse */
	{ "email", "^[a-z0-9]+([._-][a-z0-9]+)*@[a-z0-9]+(-[a-z0-9]+)*(\\.[a-z0-9]+)*\\."
		   "([a-z]{2}|[b-z][a-z]{2}|a[a-km-z][a-z]|al[a-su-z])$" },
	{ "ipv4", "^((25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)\\.){3}(25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)$" },
};

static int jsc_len(struct jsc *c, const json_t *s, const char *k, uint32_t *out)
{
	const json_t *v = json_object_get(s, k);

	if (!v)
		return 0;
	if (!json_is_integer(v) || json_integer_value(v) < 0 ||
	    json_integer_value(v) > JGRAM_LEN_MAX)
		return jsc_bad(c, "'%s' must be an integer in 0..%u", k, JGRAM_LEN_MAX);
	*out = (uint32_t)json_integer_value(v);
	return 0;
}

/* pattern or format: the regular expression, *kw the keyword. */
static int jsc_regex(struct jsc *c, const json_t *s, const char **re, const char **kw)
{
	const json_t *p = json_object_get(s, "pattern"), *f = json_object_get(s, "format");
	char nb[40];

	*re = NULL;
	*kw = p ? "pattern" : f ? "format" : "maxLength";
	if (p && f)
		return jsc_bad(c, "'pattern' and 'format' together are not supported");
	if ((p && !json_is_string(p)) || (f && !json_is_string(f)))
		return jsc_bad(c, "'%s' must be a string", *kw);
	if (p) {
		*re = json_string_value(p);
		return 0;
	}
	for (size_t i = 0; f && i < sizeof(formats) / sizeof(formats[0]); i++)
		if (!strcmp(formats[i].name, json_string_value(f)))
			*re = formats[i].re;
	if (f && !*re)
		return jsc_bad(c, "the format '%s' is not supported (date-time, date, time, uuid, "
			       "email, ipv4 are)", jsc_name(json_string_value(f), nb, sizeof(nb)));
	return 0;
}

/* minLength, maxLength, pattern, format: the node's string checks. */
static int jsc_string(struct jsc *c, const json_t *s, uint16_t *str)
{
	uint32_t lo = 0, hi = UINT32_MAX;
	const char *re, *kw;
	char m[160];
	int rc;

	if (!json_object_get(s, "minLength") && !json_object_get(s, "maxLength") &&
	    !json_object_get(s, "pattern") && !json_object_get(s, "format"))
		return 0;
	if ((rc = jsc_len(c, s, "minLength", &lo)) || (rc = jsc_len(c, s, "maxLength", &hi)) ||
	    (rc = jsc_regex(c, s, &re, &kw)))
		return rc;
	if (lo > hi)
		return jsc_bad(c, "'minLength' is above 'maxLength'");
	m[0] = 0;
	rc = jgram_str_add(c->g, lo, hi, re, re ? strlen(re) : 0, str, m, sizeof(m));
	if (rc == JGRAM_E_INVALID)
		return jsc_bad(c, "'%s' cannot be served: %s", kw, m);
	return rc;
}

/* ---- number ranges -------------------------------------------------------- */

/* A bound as an int64 (reals rounded inward, saturated). */
static int64_t bound_int(const json_t *b, bool upper, bool *exact)
{
	double d = json_number_value(b), r = upper ? floor(d) : ceil(d);

	*exact = json_is_integer(b) || r == d;
	if (json_is_integer(b))
		return (int64_t)json_integer_value(b);
	if (r >= 9e18 || r <= -9e18)
		return r > 0 ? INT64_MAX / 2 : INT64_MIN / 2;
	return (int64_t)r;
}

/* One bound (integers: made inclusive); *present false when absent. */
static int jsc_bound(struct jsc *c, const json_t *s, const char *k, bool integer,
		     bool upper, int64_t *v, bool *excl, bool *present)
{
	const json_t *b = json_object_get(s, k);
	bool ex = !strncmp(k, "exclusive", 9), exact;

	*present = b != NULL;
	*v = 0;
	*excl = false;
	if (!b)
		return 0;
	if (!json_is_number(b))
		return jsc_bad(c, "'%s' must be a number", k);
	*v = bound_int(b, upper, &exact);
	if (!integer && !exact)
		return jsc_bad(c, "'%s' must be an integer for a number (only integer bounds "
			       "are supported)", k);
	if (integer && ex && exact && *v > INT64_MIN / 2 && *v < INT64_MAX / 2)
		*v += upper ? -1 : 1;
	*excl = ex && !integer;
	return 0;
}

/* The tighter of minimum / exclusiveMinimum (or the maxima), clamped
 * to what 18 digits can write; an exclusive one of a real at most
 * JGRAM_EXCL_ABS (jgram_range_add compares as a double parser reads). */
static int jsc_side(struct jsc *c, const json_t *s, bool integer, bool upper, int64_t *v,
		    bool *excl)
{
	int64_t a, b;
	bool ax, bx, ap, bp;
	int rc;

	if ((rc = jsc_bound(c, s, upper ? "maximum" : "minimum", integer, upper, &a, &ax, &ap)) ||
	    (rc = jsc_bound(c, s, upper ? "exclusiveMaximum" : "exclusiveMinimum", integer,
			    upper, &b, &bx, &bp)))
		return rc;
	*v = upper ? JGRAM_RANGE_ABS : -JGRAM_RANGE_ABS;
	*excl = false;
	if (ap)
		*v = a, *excl = ax;
	if (bp && (!ap || (upper ? b <= a : b >= a)))
		*v = b, *excl = bx;
	if (upper ? *v > JGRAM_RANGE_ABS : *v < -JGRAM_RANGE_ABS)
		*v = upper ? JGRAM_RANGE_ABS : -JGRAM_RANGE_ABS, *excl = false;
	if (*excl && (*v > JGRAM_EXCL_ABS || *v < -JGRAM_EXCL_ABS))
		return jsc_bad(c, "'%s' for a number must be at most 2^53 in size (a double's "
			       "whole numbers)", upper ? "exclusiveMaximum" : "exclusiveMinimum");
	return 0;
}

/* minimum, maximum, exclusiveMinimum, exclusiveMaximum: the node's range. */
static int jsc_range(struct jsc *c, const json_t *s, unsigned types, uint16_t *range)
{
	bool integer = !(types & JGRAM_T_NUMBER), lx, hx;
	int64_t lo, hi;
	int rc;

	if (!json_object_get(s, "minimum") && !json_object_get(s, "maximum") &&
	    !json_object_get(s, "exclusiveMinimum") && !json_object_get(s, "exclusiveMaximum"))
		return 0;
	if ((rc = jsc_side(c, s, integer, false, &lo, &lx)) ||
	    (rc = jsc_side(c, s, integer, true, &hi, &hx)))
		return rc;
	if (!(types & (JGRAM_T_NUMBER | JGRAM_T_INTEGER)))
		return 0;
	if (lo > JGRAM_RANGE_ABS || hi < -JGRAM_RANGE_ABS)
		return jsc_bad(c, "'minimum' or 'maximum' is beyond %lld in size", JGRAM_RANGE_ABS);
	rc = jgram_range_add(c->g, lo, lx, hi, hx, integer, range);
	if (rc == JGRAM_E_INVALID)
		return jsc_bad(c, "'minimum' and 'maximum' leave no %s", integer ? "integer" : "number");
	return rc;
}

/* A schema of types (no enum): its children, then the node. */
static int jsc_typed(struct jsc *c, const json_t *s, unsigned types, uint16_t *id)
{
	struct jgram_node node = { .types = (uint16_t)types, .items = JGRAM_ANY,
				   .max_items = JGRAM_ITEMS_MAX }, *n;
	const json_t *items = json_object_get(s, "items");
	struct props p = { .n = 0 };
	int rc = 0;

	if (items && (rc = jsc_node(c, items, &node.items)))
		return rc;
	if ((rc = jsc_count(c, s, "minItems", &node.min_items)) ||
	    (rc = jsc_count(c, s, "maxItems", &node.max_items)))
		return rc;
	if (node.min_items > node.max_items)
		return jsc_bad(c, "'minItems' is above 'maxItems'");
	if ((rc = jsc_props(c, s, &p, &node.free_keys)) || (rc = jsc_string(c, s, &node.str)) ||
	    (rc = jsc_range(c, s, types, &node.range)))
		return rc;
	rc = jgram_node_add(c->g, id, &n);
	if (rc == JGRAM_E_INVALID)
		return jsc_bad(c, "the schema has more than %u nodes", JGRAM_NODES_MAX);
	if (rc)
		return rc;
	*n = node;
	return jsc_add_props(c, n, &p);
}

/* ---- anyOf / oneOf -------------------------------------------------------- */

/* A branch that is only enum or const (and its type, annotations): its
 * values are merged with the other such branches' into one enum. */
static bool enum_only(const json_t *b)
{
	const char *k;
	json_t *v;

	if (!json_is_object(b) || (!json_object_get(b, "enum") && !json_object_get(b, "const")))
		return false;
	json_object_foreach((json_t *)b, k, v) {
		size_t i = 0;

		while (i < sizeof(keywords) / sizeof(keywords[0]) && strcmp(keywords[i].name, k))
			i++;
		if (i == sizeof(keywords) / sizeof(keywords[0]) ||
		    (keywords[i].use == KW_READ && strcmp(k, "enum") && strcmp(k, "const") &&
		     strcmp(k, "type")))
			return false;
	}
	return true;
}

/* The enum-only branch b's values of its type, appended to all; oneOf:
 * a value twice would match two branches. Each list and the merged one
 * hold at most JGRAM_LITS_MAX values, refused as soon as one is past it,
 * so the comparisons are at most JGRAM_LITS_MAX^2. */
static int branch_values(struct jsc *c, const json_t *b, json_t *all, bool one, const char *kw)
{
	const json_t *e = json_object_get(b, "enum"), *k = json_object_get(b, "const");
	size_t before = json_array_size(all), i, j;
	json_t *list = k ? json_pack("[O]", k) : json_incref((json_t *)e), *v;
	unsigned types;
	int rc = list ? 0 : -ENOMEM;

	if (!rc && e && k)
		rc = jsc_bad(c, "'enum' and 'const' together are not supported");
	if (!rc && (!json_is_array(list) || json_array_size(list) > JGRAM_LITS_MAX))
		rc = jsc_bad(c, "'enum' must be a list of 1..%u values", JGRAM_LITS_MAX);
	if (!rc)
		rc = jsc_types(c, b, &types);
	json_array_foreach(list, i, v) {
		for (j = 0; !rc && one && j < before; j++)
			if (json_equal(v, json_array_get(all, j)))
				rc = jsc_bad(c, "'%s' branches both allow one value", kw);
		if (rc)
			break;
		if (value_fits(v, types) && json_array_append(all, v))
			rc = -ENOMEM;
		else if (json_array_size(all) > JGRAM_LITS_MAX)
			rc = jsc_bad(c, "'%s' branches' enums hold more than %u values together",
				     kw, JGRAM_LITS_MAX);
	}
	json_decref(list);
	return rc;
}

/* ---- object branches told apart by a tag -------------------------------- */

/* A branch through its $refs (at most JSCHEMA_DEPTH_MAX of them; NULL
 * when one is not found: the branch's own compile says why). */
static const json_t *resolved(struct jsc *c, const json_t *b)
{
	for (unsigned k = 0; k < JSCHEMA_DEPTH_MAX && json_is_object(b) &&
			     json_is_string(json_object_get(b, "$ref")); k++) {
		const char *r = json_string_value(json_object_get(b, "$ref"));
		const char *where = !strncmp(r, "#/$defs/", 8) ? "$defs"
				    : !strncmp(r, "#/definitions/", 14) ? "definitions" : NULL;

		if (!where)
			return NULL;
		b = json_object_get(json_object_get(c->root, where), r + strlen(where) + 3);
	}
	return b;
}

/* An object branch: "type": "object" and no alternatives of its own. */
static bool object_branch(const json_t *b)
{
	const json_t *t = json_is_object(b) ? json_object_get(b, "type") : NULL;

	return json_is_string(t) && !strcmp(json_string_value(t), "object") &&
	       !json_object_get(b, "anyOf") && !json_object_get(b, "oneOf") &&
	       !json_object_get(b, "enum") && !json_object_get(b, "const");
}

/* Branch b's tag value: property k required, a const (or one-value
 * enum) string. NULL when it has none. */
static const json_t *tag_value(const json_t *b, const char *k)
{
	const json_t *p = json_object_get(json_object_get(b, "properties"), k), *v, *e, *r;
	size_t i;
	bool req = false;

	json_array_foreach(json_object_get(b, "required"), i, r)
		req |= json_is_string(r) && !strcmp(json_string_value(r), k);
	if (!req || !json_is_object(p))
		return NULL;
	e = json_object_get(p, "enum");
	v = json_object_get(p, "const");
	if (!v && json_is_array(e) && json_array_size(e) == 1)
		v = json_array_get(e, 0);
	return json_is_string(v) ? v : NULL;
}

/* The tag of the object branches obj[0..n): a property of the first
 * whose value is a distinct const string in every one; NULL if none. */
static const char *find_tag(const json_t *const *obj, size_t n)
{
	const char *k;
	json_t *v;

	json_object_foreach(json_object_get(obj[0], "properties"), k, v) {
		size_t i = 0;

		while (i < n && tag_value(obj[i], k)) {
			size_t j = 0;

			while (j < i && !json_equal(tag_value(obj[j], k), tag_value(obj[i], k)))
				j++;
			if (j < i)
				break;
			i++;
		}
		if (i == n)
			return k;
	}
	return NULL;
}

/* Branch b without its tag property: the variant's schema. */
static json_t *untagged(const json_t *b, const char *tag)
{
	json_t *v = json_copy((json_t *)b), *props, *req = json_array(), *r;
	size_t i;

	props = v ? json_copy(json_object_get(b, "properties")) : NULL;
	if (!props || !req || json_object_del(props, tag) ||
	    json_object_set_new(v, "properties", props)) {
		json_decref(v);
		json_decref(req);
		return NULL;
	}
	json_array_foreach(json_object_get(b, "required"), i, r)
		if ((!json_is_string(r) || strcmp(json_string_value(r), tag)) &&
		    json_array_append(req, r))
			break;
	if (i < json_array_size(json_object_get(b, "required")) ||
	    json_object_set_new(v, "required", req)) {
		json_decref(v);
		return NULL;
	}
	return v;
}

/* The object branches as a tagged union (jsongram.h): the tag's key
 * first, its value naming the variant the rest follows. */
static int jsc_tagged(struct jsc *c, const json_t *const *obj, size_t n, const char *tag,
		      uint16_t *id)
{
	uint16_t var[JGRAM_LITS_MAX];
	uint32_t key, first = 0, idx;
	json_t *name = json_string(tag);
	struct jgram_node *u;
	int rc = name ? 0 : -ENOMEM;

	for (size_t i = 0; i < n && !rc; i++) {
		json_t *v = untagged(obj[i], tag);

		rc = v ? jsc_node(c, v, &var[i]) : -ENOMEM;
		json_decref(v);
	}
	if (!rc)
		rc = jsc_lit(c, name, 0, &key);
	json_decref(name);
	for (size_t i = 0; i < n && !rc; i++) {
		rc = jsc_lit(c, tag_value(obj[i], tag), var[i], &idx);
		first = i ? first : idx;
	}
	if (!rc && (rc = jgram_node_add(c->g, id, &u)) == JGRAM_E_INVALID)
		rc = jsc_bad(c, "the schema has more than %u nodes", JGRAM_NODES_MAX);
	if (!rc)
		*u = (struct jgram_node){ .is_union = true, .tag = key, .lit = first,
					  .n_lit = (uint32_t)n, .max_items = JGRAM_ITEMS_MAX };
	return rc;
}

/* The last node of id's chain of alternatives. */
static struct jgram_node *chain_end(struct jsc *c, uint16_t id)
{
	struct jgram_node *n = jgram_node(c->g, id);

	while (n->alt)
		n = jgram_node(c->g, n->alt);
	return n;
}

/* Each branch compiled (the enum-only ones as one enum), then chained
 * by alt, last first: branch i's chain ends in branch i - 1's node. */
static int jsc_branches(struct jsc *c, const json_t *list, const char *kw,
			uint16_t *ids, size_t *n)
{
	const json_t *obj[JGRAM_LITS_MAX];
	json_t *vals = json_array(), *b;
	const char *tag = NULL;
	size_t i, n_obj = 0;
	int rc = vals ? 0 : -ENOMEM;

	json_array_foreach(list, i, b)
		if (object_branch(resolved(c, b)))
			obj[n_obj++] = resolved(c, b);
	if (n_obj > 1 && !(tag = find_tag(obj, n_obj)))
		rc = jsc_bad(c, "'%s' has %zu object branches and no property that tells them "
			     "apart (one required in each, a different const string)", kw, n_obj);
	if (tag && !rc)
		rc = jsc_tagged(c, obj, n_obj, tag, &ids[(*n)++]);
	json_array_foreach(list, i, b) {
		if (rc)
			break;
		if (tag && object_branch(resolved(c, b)))
			continue;
		if (enum_only(b))
			rc = branch_values(c, b, vals, !strcmp(kw, "oneOf"), kw);
		else
			rc = jsc_node(c, b, &ids[(*n)++]);
	}
	if (!rc && json_array_size(vals)) {
		json_t *e = json_pack("{s:O}", "enum", vals);

		rc = e ? jsc_node(c, e, &ids[(*n)++]) : -ENOMEM;
		json_decref(e);
	}
	json_decref(vals);
	return rc;
}

static int jsc_anyof(struct jsc *c, const json_t *s, uint16_t *id)
{
	const char *kw = json_object_get(s, "anyOf") ? "anyOf" : "oneOf";
	const json_t *list = json_object_get(s, kw);
	uint16_t ids[JGRAM_LITS_MAX];
	unsigned seen = 0;
	size_t n = 0;
	const char *k;
	json_t *v;
	int rc;

	json_object_foreach((json_t *)s, k, v) {
		char nb[40];

		for (size_t i = 0; i < sizeof(keywords) / sizeof(keywords[0]); i++)
			if (!strcmp(keywords[i].name, k) && keywords[i].use == KW_READ &&
			    strcmp(k, kw))
				return jsc_bad(c, "'%s' together with '%s' is not supported", kw,
					       jsc_name(k, nb, sizeof(nb)));
	}
	if (!json_is_array(list) || !json_array_size(list) ||
	    json_array_size(list) > JGRAM_LITS_MAX)
		return jsc_bad(c, "'%s' must be a list of 1..%u schemas", kw, JGRAM_LITS_MAX);
	if ((rc = jsc_branches(c, list, kw, ids, &n)))
		return rc;
	if (!n)
		return jsc_bad(c, "'%s' has no value of its branches' types", kw);
	for (size_t i = 0; i < n; i++) {
		unsigned f = jgram_node_firsts(c->g, ids[i]);

		if (f & seen)
			return jsc_bad(c, "'%s' branches overlap: two of them may be %s (only "
				       "branches of different types, or enum/const values, "
				       "are supported)", kw, type_of(f & seen));
		seen |= f;
		if (i)
			chain_end(c, ids[i])->alt = ids[i - 1];
	}
	*id = ids[n - 1];
	return 0;
}

static int jsc_node(struct jsc *c, const json_t *s, uint16_t *id)
{
	unsigned types;
	int rc;

	if (json_is_true(s))
		s = json_object();   /* any value: below, an empty schema */
	else
		json_incref((json_t *)s);
	if (!s)
		return -ENOMEM;
	if (++c->depth > JSCHEMA_DEPTH_MAX)
		rc = jsc_bad(c, "the schema nests deeper than %u levels (or its $ref recurses)",
			     JSCHEMA_DEPTH_MAX);
	else if (!json_is_object(s))
		rc = jsc_bad(c, "a schema must be an object");
	else if (!(rc = jsc_keywords(c, s)) &&
		 (json_object_get(s, "anyOf") || json_object_get(s, "oneOf")))
		rc = json_object_get(s, "anyOf") && json_object_get(s, "oneOf")
			? jsc_bad(c, "'anyOf' and 'oneOf' together are not supported")
			: jsc_anyof(c, s, id);
	else if (!rc && json_object_get(s, "$ref"))
		rc = jsc_ref(c, json_object_get(s, "$ref"), id);
	else if (!rc && !(rc = jsc_types(c, s, &types)))
		rc = json_object_get(s, "enum") || json_object_get(s, "const")
			? jsc_enum(c, s, types, id) : jsc_typed(c, s, types, id);
	c->depth--;
	json_decref((json_t *)s);
	return rc;
}

int jschema_add(struct jgram *g, const json_t *schema, uint16_t *id, char *msg,
		size_t msg_len)
{
	struct jsc c = { .g = g, .root = schema, .msg = msg, .msg_len = msg_len };

	if (json_dumpb(schema, NULL, 0, JSON_COMPACT | JSON_ENCODE_ANY) > JSCHEMA_BYTES_MAX)
		return jsc_bad(&c, "the schema is over %u bytes", JSCHEMA_BYTES_MAX);
	return jsc_node(&c, schema, id);
}

int jschema_compile(const json_t *schema, struct jgram **out, char *msg,
		    size_t msg_len)
{
	struct jsc c = { .root = schema, .msg = msg, .msg_len = msg_len };
	char seal[128];
	uint16_t root;
	int rc;

	rc = jgram_new(&c.g);
	if (!rc)
		rc = jschema_add(c.g, schema, &root, msg, msg_len);
	if (!rc && jgram_seal(c.g, root, seal, sizeof(seal)))
		rc = jsc_bad(&c, "the schema cannot be generated: %s", seal);
	if (rc) {
		jgram_free(c.g);
		return rc;
	}
	*out = c.g;
	return 0;
}

int jschema_compile_text(const char *text, size_t len, struct jgram **out,
			 char *msg, size_t msg_len)
{
	json_error_t je;
	json_t *s = json_loadb(text, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &je);
	int rc;

	if (!s) {
		if (msg && msg_len)
			snprintf(msg, msg_len, "the schema is not valid JSON");
		return JSCHEMA_E_INVALID;
	}
	rc = jschema_compile(s, out, msg, msg_len);
	json_decref(s);
	return rc;
}
