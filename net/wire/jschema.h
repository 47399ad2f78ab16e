/* jschema.h - a JSON Schema compiled into a grammar (gpu/text/jsongram.h)
 * for response_format json_schema.
 *
 * The subset served: type (a name or a list of names: object, array,
 * string, number, integer, boolean, null), properties, required,
 * additionalProperties (false, or true: extra keys are allowed but never
 * generated), items, minItems, maxItems, enum and const (of strings,
 * numbers, booleans and null), $ref to "#/$defs/NAME" or
 * "#/definitions/NAME" (inlined; a recursive one is refused by the
 * depth bound), anyOf and oneOf (below), minLength and maxLength (code
 * points, at most JGRAM_LEN_MAX), pattern (gpu/text/jsonpat.h's subset
 * of ECMA-262; a search unless anchored), format date-time, date, time,
 * uuid, email, ipv4 (built-in patterns, each a subset of what the
 * format's checkers take: dates use days 01-28 only, so every one
 * exists), minimum, maximum, exclusiveMinimum, exclusiveMaximum (for an
 * integer any bounds, rounded inward; for a number integer bounds only;
 * such numbers are written without an exponent), and the annotations title, description, $comment,
 * examples, default, $schema, $id, $defs, definitions (read as nothing).
 * Every other keyword is refused by name: a schema kvd cannot hold the
 * output to is never served as if it could. The schema `true` or `{}`
 * is any value.
 *
 * What is generated: each object's keys are its properties (each at
 * most once, in any order; the required ones all before `}`), nothing
 * else - so additionalProperties is false in effect, as strict mode
 * asks. Enum/const values and keys are written as jansson writes them
 * (compact, UTF-8 as is).
 *
 * anyOf / oneOf (alone beside annotations): the branches that are only
 * enum/const are merged into one enum (oneOf: no value in two of them);
 * the others, and that enum, must start on different first bytes - an
 * object, an array, a string, a number or integer, a boolean, null
 * (pydantic's Optional[X] is X or null) - and are chained as the
 * grammar's alternatives (jsongram.h), so the first byte picks the one
 * branch the value follows; oneOf's branches then cannot overlap.
 * Object branches (through $ref too) are one tagged union when a
 * property is required in each with a different const (or one-value
 * enum) string - pydantic's discriminated union: that key is written
 * first and its value picks the branch the rest of the object follows.
 * Other branches of one kind (objects without such a tag, string and
 * string-or-null) are refused naming the keyword.
 *
 * Bounds: JSCHEMA_BYTES_MAX bytes of schema (compact), JSCHEMA_DEPTH_MAX
 * schema objects nested (through properties, items and $ref), the
 * grammar's node, literal and nesting bounds (JGRAM_*).
 *
 * Errors: 0; JSCHEMA_E_INVALID with msg naming the keyword (the front's
 * 400, param response_format); -ENOMEM. Pure: any thread.
 */
#pragma once

#include <jansson.h>
#include <stddef.h>

#include "gpu/text/jsongram.h"

#define JSCHEMA_E_INVALID 1
#define JSCHEMA_BYTES_MAX 32768u
#define JSCHEMA_DEPTH_MAX 32u

/* A sealed grammar for the schema in *out (jgram_free it). */
int jschema_compile(const json_t *schema, struct jgram **out, char *msg,
		    size_t msg_len);
/* The schema's nodes added to g (unsealed: a larger grammar, e.g. a
 * tool call's; net/wire/openai_toolgram.c), *id its root node. The same
 * errors; on one, g may hold nodes no root reaches (harmless). */
int jschema_add(struct jgram *g, const json_t *schema, uint16_t *id, char *msg,
		size_t msg_len);
/* The same from JSON text (for tests and the fuzzer). */
int jschema_compile_text(const char *text, size_t len, struct jgram **out,
			 char *msg, size_t msg_len);
