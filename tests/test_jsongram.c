/* test_jsongram.c - the JSON recognizer, the schema compiler and the
 * token mask (gpu/text/jsongram.h, net/wire/jschema.h).
 *
 *   - accept/reject tables of JSON texts for json_object: valid texts are
 *     accepted and complete; each invalid one is accepted up to a given
 *     prefix and refused at the next byte (escapes, surrogates, UTF-8,
 *     numbers, whitespace at its bound, nesting at its bound);
 *   - schema conformance: documents that match are accepted, each
 *     violation is refused at its first wrong byte; unsupported keywords,
 *     bad counts, unknown $ref, recursion and size are refused by name;
 *   - the mask on generated vocabularies (SentencePiece and byte-level
 *     BPE): never empty along random walks, equal to a brute-force check
 *     of every token's piece, EOS only once the value is complete, and
 *     every walk that ends with EOS parses with jansson (an independent
 *     parser) and holds the schema's required fields;
 *   - lazy grammars (tool_choice "auto"): free text takes every byte, the
 *     grammar holds from the trigger (a wrap's pre anywhere, KMP across
 *     false starts; or the first non-whitespace byte); random walks that
 *     draw the trigger a byte at a time (split over tokens) or inside
 *     longer tokens with bytes after it, the mask equal to a brute-force
 *     replay (control and long tokens allowed in free text), every
 *     Hermes walk that ends holding one valid call after its trigger.
 */
#include <check.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpu/gguf/gguf.h"
#include "gpu/model/gguf_gen.h"
#include "gpu/text/jsongram.h"
#include "gpu/text/jsonpat.h"
#include "gpu/text/tokenizer.h"
#include "net/wire/jschema.h"
#include "net/wire/openai.h"

/* bytes of text accepted one by one: the index of the first refused,
 * or -1 when all were; *complete after them */
static long feed_until(const struct jgram *g, const char *text, size_t len,
		       bool *complete)
{
	struct jgram_run *r;
	long bad = -1;

	ck_assert_int_eq(jgram_run_new(&r, g, NULL), 0);
	for (size_t i = 0; i < len && bad < 0; i++)
		if (!jgram_run_feed(r, text + i, 1))
			bad = (long)i;
	*complete = jgram_run_complete(r);
	jgram_run_free(r);
	return bad;
}

static void expect_valid(const struct jgram *g, const char *text)
{
	bool complete;
	long bad = feed_until(g, text, strlen(text), &complete);

	ck_assert_msg(bad < 0, "'%s' refused at byte %ld", text, bad);
	ck_assert_msg(complete, "'%s' accepted but not complete", text);
}

/* prefix is accepted, the first byte of rest is refused */
static void expect_refused(const struct jgram *g, const char *prefix, const char *rest)
{
	size_t n = strlen(prefix);
	char *all = malloc(n + strlen(rest) + 1);
	bool complete;
	long bad;

	ck_assert_ptr_nonnull(all);
	strcpy(all, prefix);
	strcat(all, rest);
	bad = feed_until(g, all, strlen(all), &complete);
	ck_assert_msg(bad == (long)n, "'%s' + '%s': refused at %ld, want %zu", prefix,
		      rest, bad, n);
	free(all);
}

/* ---- json_object ------------------------------------------------------ */

static const char *const obj_valid[] = {
	"{}",
	" {\"a\":1}",
	"{\"a\": [1, 2.5e-3, -0, 0.5E+7, true, false, null, \"x\"]}",
	"{\"k\":{\"n\":{\"m\":[]}}}",
	"{\"\\u00e9\\ud83d\\ude00\":\"\\\"\\\\\\/\\b\\f\\n\\r\\t\"}",
	"{\"utf8\":\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\xf4\x8f\xbf\xbf\"}",
	"{\"a\":{},\"a\":[]}\n",
	"{\n       \"a\"        :\n       1        }        ",
};

/* {prefix accepted, rest whose first byte is refused} */
static const char *const obj_refused[][2] = {
	{ "", "[]" },                        /* json_object: an object */
	{ "", "1" },
	{ "{\"a\":0", "1}" },                /* no leading zeros */
	{ "{\"a\":1", "x}" },
	{ "{", "," },
	{ "{\"a\"", "1" },
	{ "{\"a\":tr", "x" },
	{ "{\"a\":\"", "\x01\"}" },          /* control characters escaped */
	{ "{\"a\":\"\\ud800", "\"}" },        /* a high surrogate alone */
	{ "{\"a\":\"\\ud800\\", "n" },
	{ "{\"a\":\"\\ud800\\u", "0" },
	{ "{\"a\":\"\\ud800\\ud", "8" },     /* two high surrogates */
	{ "{\"a\":\"\\ud", "c" },            /* a low surrogate alone */
	{ "{\"a\":\"\\", "x" },
	{ "{\"a\":\"\\u12", "g" },
	{ "{\"a\":\"", "\xc0\xaf\"}" },      /* overlong */
	{ "{\"a\":\"\xed", "\xa0\x80\"}" },  /* UTF-8 surrogate */
	{ "{\"a\":\"\xf4", "\x90\x80\x80\"}" }, /* above U+10FFFF */
	{ "{\"a\":\"\xe2\x82", "\"}" },       /* a character cut */
	{ "{\"a\":\"", "\xff\"}" },
	{ "{}", "{}" },                       /* one value */
	{ "{\"a\":-", "}" },
	{ "{\"a\":1.", "}" },
	{ "{\"a\":", ".5}" },
	{ "{\"a\":1e", "}" },
	{ "{\"a\":1e+", "}" },
	{ "{        ", " }" },                /* JGRAM_WS_MAX in a row */
	{ "        ", " {}" },
	{ "{}        ", " " },
	{ "{\"a\":1,", "}" },                 /* no trailing comma */
	{ "{\"a\":[1,", "]}" },
	{ "{\"a\":[1", "}" },
	{ "{\"a\":1", "]" },
	{ "{\"a\" ", "," },
	{ "{\"a\":nul", "1" },
};

START_TEST(object_accepts)
{
	struct jgram *g;

	ck_assert_int_eq(jgram_new_object(&g), 0);
	for (size_t i = 0; i < sizeof(obj_valid) / sizeof(obj_valid[0]); i++)
		expect_valid(g, obj_valid[i]);
	jgram_free(g);
}
END_TEST

/* The n choices of one request: runs of one grammar, each holder with
 * its reference; each run's state is its own, and the grammar lives
 * until the last holder lets it go (ASan: no leak, no use after free). */
START_TEST(shared_runs)
{
	struct jgram *g, *h;
	struct jgram_run *a, *b;

	ck_assert_int_eq(jgram_new_object(&g), 0);
	h = jgram_ref(g);
	ck_assert_ptr_eq(h, g);
	ck_assert_int_eq(jgram_run_new(&a, g, NULL), 0);
	ck_assert_int_eq(jgram_run_new(&b, h, NULL), 0);
	jgram_free(g);                   /* the first holder goes: b still reads h */
	ck_assert(jgram_run_feed(a, "{\"x\":", 5));
	ck_assert(jgram_run_feed(b, "{}", 2));
	ck_assert(jgram_run_complete(b));
	ck_assert(!jgram_run_complete(a));
	ck_assert(!jgram_run_feed(b, "{", 1));
	jgram_run_free(a);
	jgram_run_free(b);
	jgram_free(h);
	jgram_free(NULL);
}
END_TEST

START_TEST(object_refuses)
{
	struct jgram *g;

	ck_assert_int_eq(jgram_new_object(&g), 0);
	for (size_t i = 0; i < sizeof(obj_refused) / sizeof(obj_refused[0]); i++)
		expect_refused(g, obj_refused[i][0], obj_refused[i][1]);
	jgram_free(g);
}
END_TEST

/* Incomplete texts are accepted and not complete: EOS may not come. */
START_TEST(object_incomplete)
{
	static const char *const part[] = { "", " ", "{", "{\"a\"", "{\"a\":",
		"{\"a\":1", "{\"a\":\"x", "{\"a\":[", "{\"a\":tru", "{\"a\":\"\\u00" };
	struct jgram *g;
	bool complete;

	ck_assert_int_eq(jgram_new_object(&g), 0);
	for (size_t i = 0; i < sizeof(part) / sizeof(part[0]); i++) {
		ck_assert_int_eq(feed_until(g, part[i], strlen(part[i]), &complete), -1);
		ck_assert_msg(!complete, "'%s' complete", part[i]);
	}
	jgram_free(g);
}
END_TEST

/* JGRAM_DEPTH_MAX containers nest; one more is refused at its bracket,
 * and a scalar still fits there (no dead end). */
START_TEST(object_depth)
{
	char buf[4 * JGRAM_DEPTH_MAX + 64];
	struct jgram *g;
	size_t n = 0;
	bool complete;

	ck_assert_int_eq(jgram_new_object(&g), 0);
	n += (size_t)sprintf(buf + n, "{\"a\":");
	for (unsigned d = 1; d < JGRAM_DEPTH_MAX; d++)
		n += (size_t)sprintf(buf + n, "[");
	ck_assert_int_eq(feed_until(g, buf, n, &complete), -1);
	buf[n] = '[';
	ck_assert_int_eq(feed_until(g, buf, n + 1, &complete), (long)n);
	buf[n] = '{';
	ck_assert_int_eq(feed_until(g, buf, n + 1, &complete), (long)n);
	buf[n] = '7';
	for (unsigned d = 1; d < JGRAM_DEPTH_MAX; d++)
		buf[n + d] = ']';
	buf[n + JGRAM_DEPTH_MAX] = '}';
	ck_assert_int_eq(feed_until(g, buf, n + JGRAM_DEPTH_MAX + 1, &complete), -1);
	ck_assert(complete);
	jgram_free(g);
}
END_TEST

/* ---- schemas ------------------------------------------------------------ */

static const char person[] =
	"{\"type\":\"object\",\"title\":\"p\",\"properties\":{"
	"\"name\":{\"type\":\"string\",\"description\":\"who\"},"
	"\"age\":{\"type\":\"integer\"},"
	"\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\"]},\"minItems\":1,\"maxItems\":2},"
	"\"ok\":{\"type\":\"boolean\"},"
	"\"x\":{\"type\":[\"number\",\"null\"]},"
	"\"c\":{\"const\":\"k\"},"
	"\"n\":{\"enum\":[1,12,\"s\",null,true]}},"
	"\"required\":[\"name\",\"age\"],\"additionalProperties\":false}";

static struct jgram *compile(const char *schema)
{
	struct jgram *g = NULL;
	char msg[200] = "";
	int rc = jschema_compile_text(schema, strlen(schema), &g, msg, sizeof(msg));

	ck_assert_msg(rc == 0, "%s: %s", schema, msg);
	return g;
}

START_TEST(schema_accepts)
{
	static const char *const docs[] = {
		"{\"name\":\"x\",\"age\":3}",
		"{\"age\":-3,\"name\":\"y\",\"tags\":[\"a\",\"b\"],\"ok\":true,\"x\":null,\"c\":\"k\"}",
		"{ \"name\": \"\", \"age\": 0, \"x\": 1.5e3, \"n\": 12 }",
		"{\"name\":\"z\",\"n\":1,\"age\":1}",
		"{\"name\":\"z\",\"n\":\"s\",\"age\":1,\"tags\":[\"b\"]}",
	};
	struct jgram *g = compile(person);

	for (size_t i = 0; i < sizeof(docs) / sizeof(docs[0]); i++)
		expect_valid(g, docs[i]);
	jgram_free(g);
}
END_TEST

START_TEST(schema_refuses)
{
	static const char *const bad[][2] = {
		{ "{\"age\":3", "}" },                         /* name required */
		{ "", "[" },
		{ "{\"name\":\"x\",\"age\":3", ".5}" },        /* integer */
		{ "{\"name\":\"x\",\"age\":3", "e1}" },
		{ "{\"name\":\"x\",\"", "q\":1}" },            /* no such key */
		{ "{\"name\":\"x\",\"n", "ame\":\"y\"}" },     /* once ("n" is one) */
		{ "{\"name\":", "1}" },
		{ "{\"name\":\"x\",\"age\":1,\"tags\":[", "]}" },  /* minItems */
		{ "{\"name\":\"x\",\"age\":1,\"tags\":[\"a\",\"b\"", ",\"a\"]}" }, /* maxItems */
		{ "{\"name\":\"x\",\"age\":1,\"tags\":[\"", "c\"]}" },
		{ "{\"name\":\"x\",\"age\":1,\"c\":\"", "j\"}" },
		{ "{\"name\":\"x\",\"age\":1,\"", "extra\":1}" },
		{ "{\"name\":\"x\",\"age\":1,\"n\":1", "3}" },
		{ "{\"name\":\"x\",\"age\":1,\"n\":", "2}" },
		{ "{\"name\":\"x\",\"age\":1,\"ok\":", "null}" },
		{ "{\"name\":\"x\",\"age\":1,\"x\":", "\"1\"}" },
	};
	struct jgram *g = compile(person);

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		expect_refused(g, bad[i][0], bad[i][1]);
	jgram_free(g);
}
END_TEST

/* Every property used: `,` is refused (a key could not follow). */
START_TEST(schema_no_dead_end)
{
	struct jgram *g = compile("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"null\"}}}");

	expect_refused(g, "{\"a\":null", ",");
	expect_valid(g, "{\"a\":null}");
	expect_valid(g, "{}");
	jgram_free(g);
	g = compile("{\"type\":\"array\",\"maxItems\":0}");
	expect_refused(g, "[", "1");
	expect_valid(g, "[]");
	jgram_free(g);
	g = compile("{\"type\":\"object\",\"additionalProperties\":false}");
	expect_refused(g, "{", "\"");
	jgram_free(g);
}
END_TEST

START_TEST(schema_refs_and_any)
{
	struct jgram *g = compile("{\"$defs\":{\"p\":{\"type\":\"integer\"}},\"type\":\"array\","
				  "\"items\":{\"$ref\":\"#/$defs/p\"}}");

	expect_valid(g, "[1,2]");
	expect_refused(g, "[1,", "\"");
	jgram_free(g);
	g = compile("{}");
	expect_valid(g, "[{\"q\":[null]},\"s\"]");
	expect_valid(g, "3");
	jgram_free(g);
	g = compile("{\"type\":\"object\",\"properties\":{\"free\":true}}");
	expect_valid(g, "{\"free\":{\"any\":[1]}}");
	jgram_free(g);
}
END_TEST

/* anyOf / oneOf: branches of different kinds, enum branches merged,
 * pydantic's Optional[X]; the first byte picks the branch. */
START_TEST(schema_anyof)
{
	struct jgram *g = compile(
		"{\"$defs\":{\"P\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},"
		"\"required\":[\"a\"]}},\"type\":\"object\",\"properties\":{"
		"\"o\":{\"anyOf\":[{\"$ref\":\"#/$defs/P\"},{\"type\":\"null\"}],\"default\":null},"
		"\"e\":{\"anyOf\":[{\"enum\":[\"x\",\"y\"]},{\"const\":3},{\"type\":\"null\"}]},"
		"\"m\":{\"oneOf\":[{\"type\":\"array\",\"items\":{\"type\":\"boolean\"}},"
		"{\"type\":\"string\"},{\"type\":\"integer\"}]},"
		"\"t\":{\"type\":[\"string\",\"null\"],\"description\":\"nullable\"}}}");

	expect_valid(g, "{\"o\":{\"a\":1},\"e\":\"x\",\"m\":[true],\"t\":null}");
	expect_valid(g, "{\"o\":null,\"e\":3,\"m\":\"s\",\"t\":\"q\"}");
	expect_valid(g, "{\"e\":null,\"m\":-4}");
	expect_refused(g, "{\"o\":", "1}");
	expect_refused(g, "{\"o\":{", "}");                 /* a required */
	expect_refused(g, "{\"o\":{\"a\":", "\"1\"}");
	expect_refused(g, "{\"e\":\"", "z\"}");
	expect_refused(g, "{\"e\":", "4}");
	expect_refused(g, "{\"e\":", "true}");
	expect_refused(g, "{\"m\":", "null}");
	expect_refused(g, "{\"m\":1", ".5}");               /* integer */
	expect_refused(g, "{\"m\":[", "1]}");
	expect_refused(g, "{\"t\":", "1}");
	jgram_free(g);
	/* object branches told apart by a const (pydantic's discriminated
	 * union): a tagged union, the tag's key first */
	g = compile("{\"$defs\":{\"Cat\":{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":\"cat\"},"
		    "\"lives\":{\"type\":\"integer\"}},\"required\":[\"kind\",\"lives\"]},"
		    "\"Dog\":{\"type\":\"object\",\"properties\":{\"good\":{\"type\":\"boolean\"},"
		    "\"kind\":{\"enum\":[\"dog\"],\"type\":\"string\"}},\"required\":[\"kind\"],"
		    "\"additionalProperties\":false}},\"type\":\"object\",\"properties\":{\"pet\":{\"oneOf\":["
		    "{\"$ref\":\"#/$defs/Cat\"},{\"$ref\":\"#/$defs/Dog\"},{\"type\":\"null\"}]}},"
		    "\"required\":[\"pet\"]}");
	expect_valid(g, "{\"pet\":{\"kind\":\"cat\",\"lives\":9}}");
	expect_valid(g, "{\"pet\":{\"kind\":\"dog\"}}");
	expect_valid(g, "{\"pet\": { \"kind\" : \"dog\" , \"good\":true}}");
	expect_valid(g, "{\"pet\":null}");
	expect_refused(g, "{\"pet\":{\"", "lives\":1,\"kind\":\"cat\"}");
	expect_refused(g, "{\"pet\":{\"kind\":\"cat\"", "}}");
	expect_refused(g, "{\"pet\":{\"kind\":\"dog\",\"", "lives\":1}}");
	expect_refused(g, "{\"pet\":{\"kind\":\"c", "o\"}}");
	jgram_free(g);
	g = compile("{\"anyOf\":[{\"type\":\"number\"},{\"type\":\"boolean\"}]}");
	expect_valid(g, "1.5");
	expect_valid(g, "false");
	expect_refused(g, "", "\"");
	jgram_free(g);
	g = compile("{\"oneOf\":[{\"const\":\"a\"},{\"const\":\"b\"}]}");
	expect_valid(g, "\"b\"");
	expect_refused(g, "\"", "c\"");
	jgram_free(g);
}
END_TEST

/* minLength/maxLength count code points (an escape one, a surrogate
 * pair one); `"` waits for minLength, a character past maxLength is
 * refused at its first byte. */
START_TEST(schema_lengths)
{
	struct jgram *g = compile("{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}");

	expect_valid(g, "\"ab\"");
	expect_valid(g, "\"abc\"");
	expect_valid(g, "\"\xc3\xa9\\n\"");
	expect_valid(g, "\"ab\\ud83d\\ude00\"");
	expect_valid(g, "\"\xf0\x9f\x98\x80\\u00e9\"");
	expect_refused(g, "\"a", "\"");
	expect_refused(g, "\"", "\"");
	expect_refused(g, "\"abc", "d\"");
	expect_refused(g, "\"abc", "\xc3\xa9\"");
	expect_refused(g, "\"abc", "\\n\"");
	expect_refused(g, "\"ab\\ud83d\\ude00", "x\"");
	jgram_free(g);
	g = compile("{\"type\":[\"string\",\"null\"],\"maxLength\":0}");
	expect_valid(g, "\"\"");
	expect_valid(g, "null");
	expect_refused(g, "\"", "a\"");
	jgram_free(g);
}
END_TEST

/* pattern and format: the string matches as it comes; no dead end with
 * lengths; escapes step the pattern by their character, \u is refused. */
START_TEST(schema_patterns)
{
	struct jgram *g = compile("{\"type\":\"string\",\"pattern\":\"^[a-z]{2}\\\\d+$\"}");

	expect_valid(g, "\"ab12\"");
	expect_refused(g, "\"a", "1\"");
	expect_refused(g, "\"ab", "\"");
	expect_refused(g, "\"ab1", "x\"");
	expect_refused(g, "\"ab", "\\u0031\"");
	jgram_free(g);
	g = compile("{\"type\":\"string\",\"pattern\":\"a(b|\\\"c)\"}");   /* a search */
	expect_valid(g, "\"xxaby y\"");
	expect_valid(g, "\"\\\\a\\\"c\"");
	expect_valid(g, "\"\xc3\xa9" "ab\"");
	expect_refused(g, "\"", "\"");
	expect_refused(g, "\"xa", "\"");
	jgram_free(g);
	/* ^a\\$ is a, a backslash, the end; ^a\\\$ ends with a literal '$' */
	g = compile("{\"type\":\"string\",\"pattern\":\"^a\\\\\\\\$\"}");
	expect_valid(g, "\"a\\\\\"");
	expect_refused(g, "\"a\\\\", "x");
	jgram_free(g);
	g = compile("{\"type\":\"string\",\"pattern\":\"^a\\\\\\\\\\\\$\"}");
	expect_valid(g, "\"a\\\\$x\"");
	expect_refused(g, "\"a\\\\", "x");
	jgram_free(g);
	g = compile("{\"type\":\"string\",\"pattern\":\"^(ab)+$\",\"minLength\":3,\"maxLength\":5}");
	expect_valid(g, "\"abab\"");
	expect_refused(g, "\"ab", "\"");
	expect_refused(g, "\"abab", "a");
	jgram_free(g);
	g = compile("{\"type\":\"string\",\"pattern\":\"^.[^a-c]\\\\s?\\\\w{2,}$\"}");
	expect_valid(g, "\"zz\\t_9\"");
	expect_valid(g, "\"z\xc3\xa9_9\"");
	expect_refused(g, "\"z", "b");
	expect_refused(g, "\"", "\xc3\xa9");          /* '.': ASCII only */
	jgram_free(g);
	g = compile("{\"type\":\"string\",\"format\":\"date\"}");
	expect_valid(g, "\"2024-02-28\"");
	expect_refused(g, "\"2024-02-2", "9\"");
	expect_refused(g, "\"2024-1", "3-01\"");
	jgram_free(g);
	g = compile("{\"type\":\"string\",\"format\":\"date-time\"}");
	expect_valid(g, "\"2024-02-28T23:59:09.123Z\"");
	expect_valid(g, "\"1999-12-01T00:00:00+05:30\"");
	expect_refused(g, "\"2024-02-28T2", "4:00:00Z\"");
	jgram_free(g);
	g = compile("{\"type\":\"string\",\"format\":\"uuid\"}");
	expect_valid(g, "\"123e4567-e89b-12d3-a456-426614174000\"");
	expect_refused(g, "\"123e4567", "e");
	jgram_free(g);
	g = compile("{\"type\":\"string\",\"format\":\"email\"}");
	expect_valid(g, "\"a.b@c-d.io\"");
	expect_valid(g, "\"a@b.com\"");
	expect_refused(g, "\"a@b.alt", "\"");
	expect_refused(g, "\"a@b.local", "\"");
	expect_refused(g, "\"a@", "\"");
	expect_refused(g, "\"a", "A");
	jgram_free(g);
	g = compile("{\"type\":\"string\",\"format\":\"ipv4\"}");
	expect_valid(g, "\"255.0.10.199\"");
	expect_refused(g, "\"25", "6");
	jgram_free(g);
}
END_TEST

/* minimum/maximum (exclusive too): a digit is taken only when some
 * completion lies in range; no exponent; numbers with integer bounds. */
START_TEST(schema_ranges)
{
	struct jgram *g = compile("{\"type\":\"integer\",\"minimum\":-5,\"maximum\":150}");

	expect_valid(g, "150");
	expect_valid(g, "-5");
	expect_valid(g, "0");
	expect_valid(g, "-0");
	expect_valid(g, "99");
	expect_refused(g, "15", "1");
	expect_refused(g, "16", "0");                 /* 160 > 150 */
	expect_refused(g, "-", "6");
	expect_refused(g, "-1", "0");                 /* -10 < -5 */
	expect_refused(g, "-0", "1");
	expect_refused(g, "1", "e2");
	jgram_free(g);
	g = compile("{\"type\":\"integer\",\"exclusiveMinimum\":10,\"exclusiveMaximum\":12.5}");
	expect_valid(g, "11");
	expect_valid(g, "12");
	expect_refused(g, "1", "0");
	expect_refused(g, "", "-");
	expect_refused(g, "", "9");
	expect_refused(g, "1", " ");                  /* 1 alone is out */
	jgram_free(g);
	g = compile("{\"type\":\"number\",\"exclusiveMinimum\":0,\"maximum\":1}");
	expect_valid(g, "0.5");
	expect_valid(g, "1");
	expect_valid(g, "1.000");
	expect_valid(g, "0.00000000000000001");
	expect_refused(g, "", "-");
	expect_refused(g, "0", " ");
	expect_refused(g, "0.0", " ");
	expect_refused(g, "0.0000000000000000", " ");  /* 17 digits: nothing left */
	expect_refused(g, "1.0", "1");
	expect_refused(g, "1", "0");
	expect_refused(g, "0.5", "e1");
	jgram_free(g);
	g = compile("{\"type\":[\"number\",\"null\"],\"maximum\":-3,\"exclusiveMaximum\":-3}");
	expect_valid(g, "-3.5");
	expect_valid(g, "null");
	expect_refused(g, "", "3");
	expect_refused(g, "-3", " ");
	expect_refused(g, "-2", ".");
	jgram_free(g);
	/* exclusive bounds as a double parser reads the number: 17 nines
	 * read as the bound itself (round to nearest), 16 do not */
	g = compile("{\"type\":\"number\",\"exclusiveMinimum\":-1,\"exclusiveMaximum\":1}");
	expect_valid(g, "0.9999999999999999");
	expect_valid(g, "-0.9999999999999999");
	expect_valid(g, "0.99999999999999994");       /* 1 - 6e-17: below 1 - 2^-54 */
	expect_refused(g, "0.9999999999999999", "9");
	expect_refused(g, "0.9999999999999999", "5");  /* 1 - 5e-17 rounds to 1 */
	expect_refused(g, "-0.9999999999999999", "9");
	jgram_free(g);
	g = compile("{\"type\":\"number\",\"exclusiveMinimum\":100}");
	expect_valid(g, "100.0000000000001");
	expect_valid(g, "100.00000000000000711");      /* past 100 + 2^-47 */
	expect_refused(g, "100.00000000000000", "0");    /* 15 zeros: <= 100 + 1e-15 */
	expect_refused(g, "100.000000000000007", "0");  /* <= 100 + 7.1e-15: 100 */
	expect_refused(g, "100", " ");
	jgram_free(g);
	g = compile("{\"type\":\"number\",\"exclusiveMaximum\":0}");
	expect_valid(g, "-0.00000000000000001");
	expect_refused(g, "-0", " ");
	expect_refused(g, "", "0");
	jgram_free(g);
	g = compile("{\"anyOf\":[{\"type\":\"integer\",\"minimum\":1,\"maximum\":3},{\"type\":\"string\"}]}");
	expect_valid(g, "2");
	expect_refused(g, "", "0");
	jgram_free(g);
}
END_TEST

/* jpat_can_end (reach tables, one lookup or a scan) against stepping
 * the automaton length by length from random states and windows. */
static bool can_end_slow(const struct jpat *p, uint64_t set, uint32_t lo, uint32_t hi)
{
	uint64_t enter = 0;

	for (unsigned s = 0; s < JPAT_SYMS; s++)
		enter |= p->match[s];
	for (uint32_t l = 0; l <= hi && l <= lo + 600; l++) {
		uint64_t next = 0;

		if (l >= lo && (set & p->final))
			return true;
		for (uint64_t m = set; m; m &= m - 1)
			next |= p->follow[__builtin_ctzll(m)];
		set = next & enter;
	}
	return false;
}

START_TEST(pattern_windows)
{
	static const char *const res[] = { "^(a{15}|b{17})*$", "^(ab|c)+d?$", "x(yz){2,5}",
					   "^[0-9]{4}-\\d\\d$", "^(a|bcd)*$",
					   "^(?:(?:.{7})*|(?:.{9})*|(?:.{4})*)$" };
	char msg[160];

	srand(7);
	for (size_t i = 0; i < sizeof(res) / sizeof(res[0]); i++) {
		struct jpat p;

		ck_assert_msg(!jpat_compile(&p, res[i], strlen(res[i]), msg, sizeof(msg)), "%s", msg);
		for (int k = 0; k < 3000; k++) {
			uint64_t set = 1;
			uint32_t lo = (uint32_t)rand() % 300, hi;

			for (int n = rand() % 40; n > 0; n--) {
				uint64_t t = jpat_step(&p, set, "abcdxyz0123-"[rand() % 12]);

				set = t ? t : set;
			}
			hi = rand() % 4 ? lo + (uint32_t)rand() % 300 : UINT32_MAX;
			ck_assert_msg(jpat_can_end(&p, set, lo, hi) == can_end_slow(&p, set, lo, hi),
				      "%s: set %llx [%u, %u]", res[i], (unsigned long long)set, lo, hi);
		}
		jpat_free(&p);
	}
	ck_assert_int_eq(jpat_compile(&(struct jpat){ 0 }, "^(a{19}|b{23})*$", 16, msg, sizeof(msg)),
			 JPAT_E_INVALID);
}
END_TEST

/* A counted repetition of an empty group is not copied, and a compile's
 * parse work is capped: nested {64}s of nothing compile at once, not in
 * 64^depth steps (six levels took about 20 minutes before: the test's
 * timeout fails it; measured 1-17 us each now, no clock asserted). */
START_TEST(pattern_nesting)
{
	static const char *const res[] = { "((((){64}){64}){64}){64}",
					   "(((((){64}){64}){64}){64}){9}",
					   "((((((?:){64}){64}){64}){64}){64}){64}x",
					   "^((((((|){64}){64}){64}){64}){64}){64}a{3}$" };
	char msg[160];

	for (size_t i = 0; i < sizeof(res) / sizeof(res[0]); i++) {
		struct jpat p;
		int rc = jpat_compile(&p, res[i], strlen(res[i]), msg, sizeof(msg));

		ck_assert_msg(!rc, "%s: %s", res[i], msg);
		jpat_free(&p);
	}
}
END_TEST

/* Refused by name, with JSCHEMA_E_INVALID. */
START_TEST(schema_errors)
{
	static const char *const bad[][2] = {
		{ "{\"type\":\"string\",\"pattern\":\"(x\"}", "pattern" },
		{ "{\"pattern\":\"a(?=b)\"}", "pattern" },
		{ "{\"pattern\":\"(a)\\\\1\"}", "pattern" },
		{ "{\"pattern\":\"\\\\p{L}\"}", "pattern" },
		{ "{\"pattern\":\"\\\\bx\"}", "pattern" },
		{ "{\"pattern\":\"\xc3\xa9\"}", "pattern" },
		{ "{\"pattern\":\"^a|b$\"}", "pattern" },
		{ "{\"pattern\":\"a{1,100}\"}", "pattern" },
		{ "{\"pattern\":\"a**\"}", "pattern" },
		{ "{\"pattern\":\"[a-z]{40}[0-9]{40}\"}", "pattern" },
		{ "{\"pattern\":\"^a{4}$\",\"maxLength\":3}", "pattern" },
		{ "{\"pattern\":\"a\",\"format\":\"date\"}", "format" },
		{ "{\"format\":\"hostname\"}", "hostname" },
		{ "{\"type\":\"string\",\"maxLength\":70000}", "maxLength" },
		{ "{\"type\":\"string\",\"minLength\":3,\"maxLength\":2}", "minLength" },
		{ "{\"enum\":[\"a\"],\"minLength\":1}", "minLength" },
		{ "{\"type\":\"number\",\"minimum\":0.5}", "minimum" },
		{ "{\"type\":\"integer\",\"minimum\":3,\"maximum\":2}", "maximum" },
		{ "{\"type\":\"integer\",\"exclusiveMinimum\":2,\"exclusiveMaximum\":3}", "minimum" },
		{ "{\"type\":\"number\",\"exclusiveMinimum\":2,\"maximum\":2}", "minimum" },
		{ "{\"type\":\"integer\",\"minimum\":1e19}", "minimum" },
		{ "{\"type\":\"integer\",\"exclusiveMinimum\":true}", "exclusiveMinimum" },
		{ "{\"type\":\"number\",\"exclusiveMaximum\":9007199254740993}", "exclusiveMaximum" },
		{ "{\"exclusiveMinimum\":-9007199254740993,\"maximum\":0}", "exclusiveMinimum" },
		{ "{\"const\":3,\"maximum\":2}", "maximum" },
		{ "{\"type\":\"strin\"}", "strin" },
		{ "{\"type\":[]}", "type" },
		{ "{\"type\":\"array\",\"minItems\":3,\"maxItems\":2}", "minItems" },
		{ "{\"type\":\"array\",\"maxItems\":-1}", "maxItems" },
		{ "{\"type\":\"object\",\"required\":[\"zz\"],\"properties\":{}}", "zz" },
		{ "{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"n\":{\"$ref\":\"#/$defs/n\"}}}},"
		  "\"$ref\":\"#/$defs/n\"}", "deeper" },
		{ "{\"$ref\":\"#/$defs/none\"}", "none" },
		{ "{\"$ref\":\"http://x/y\"}", "$ref" },
		{ "{\"enum\":[]}", "enum" },
		{ "{\"enum\":[{\"a\":1}]}", "enum" },
		{ "{\"type\":\"string\",\"enum\":[1]}", "type" },
		{ "{\"type\":\"object\",\"additionalProperties\":{}}", "additionalProperties" },
		{ "{\"anyOf\":[]}", "anyOf" },
		{ "{\"anyOf\":[{\"type\":\"string\"},{\"type\":[\"string\",\"null\"]}]}", "anyOf" },
		{ "{\"anyOf\":[{\"type\":\"object\"},{\"type\":\"object\"}]}", "object" },
		{ "{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"number\"}]}", "anyOf" },
		{ "{\"anyOf\":[{\"type\":\"string\"},{\"enum\":[\"a\"]}]}", "anyOf" },
		{ "{\"oneOf\":[{\"enum\":[\"a\",\"b\"]},{\"const\":\"a\"}]}", "oneOf" },
		{ "{\"oneOf\":[{\"type\":\"null\"}],\"anyOf\":[{\"type\":\"null\"}]}", "oneOf" },
		{ "{\"type\":\"object\",\"anyOf\":[{\"type\":\"null\"}]}", "type" },
		{ "{\"anyOf\":{}}", "anyOf" },
		{ "{\"anyOf\":[{\"type\":\"string\",\"enum\":[1]}]}", "anyOf" },
		{ "false", "object" },
		{ "{\"type\":\"string\",\"enum\":[1],\"const\":1}", "const" },
	};
	struct jgram *g;
	char msg[200];

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		msg[0] = 0;
		g = NULL;
		ck_assert_msg(jschema_compile_text(bad[i][0], strlen(bad[i][0]), &g, msg,
						   sizeof(msg)) == JSCHEMA_E_INVALID,
			      "%s accepted", bad[i][0]);
		ck_assert_ptr_null(g);
		ck_assert_msg(strstr(msg, bad[i][1]), "%s: '%s' does not name %s", bad[i][0],
			      msg, bad[i][1]);
	}
}
END_TEST

/* Bounds: nesting past JGRAM_DEPTH_MAX, too many enum values, too big. */
START_TEST(schema_bounds)
{
	char *s = malloc(JSCHEMA_BYTES_MAX + 64);
	struct jgram *g = NULL;
	size_t n = 0;
	char msg[200];

	ck_assert_ptr_nonnull(s);
	for (unsigned d = 0; d <= JGRAM_DEPTH_MAX; d++)
		n += (size_t)sprintf(s + n, "{\"type\":\"array\",\"items\":");
	n += (size_t)sprintf(s + n, "{\"type\":\"null\"}");
	for (unsigned d = 0; d <= JGRAM_DEPTH_MAX; d++)
		s[n++] = '}';
	ck_assert_int_eq(jschema_compile_text(s, n, &g, msg, sizeof(msg)), JSCHEMA_E_INVALID);
	ck_assert_msg(strstr(msg, "nesting"), "%s", msg);
	n = (size_t)sprintf(s, "{\"enum\":[0");
	for (unsigned i = 1; i <= JGRAM_LITS_MAX; i++)
		n += (size_t)sprintf(s + n, ",%u", i);
	n += (size_t)sprintf(s + n, "]}");
	ck_assert_int_eq(jschema_compile_text(s, n, &g, msg, sizeof(msg)), JSCHEMA_E_INVALID);
	/* oneOf's merged enums: refused by size before any value is
	 * compared with another (8000 x 8000 comparisons took 0.5 s) */
	n = (size_t)sprintf(s, "{\"oneOf\":[{\"enum\":[0");
	for (unsigned i = 1; i < 8000; i++)
		n += (size_t)sprintf(s + n, ",0");
	n += (size_t)sprintf(s + n, "]},{\"enum\":[1");
	for (unsigned i = 1; i < 8000; i++)
		n += (size_t)sprintf(s + n, ",1");
	n += (size_t)sprintf(s + n, "]}]}");
	ck_assert_int_eq(jschema_compile_text(s, n, &g, msg, sizeof(msg)), JSCHEMA_E_INVALID);
	/* by size: compared first, the duplicate 0s were the refusal */
	ck_assert_msg(strstr(msg, "'enum' must be a list of 1.."), "%s", msg);
	n = (size_t)sprintf(s, "{\"oneOf\":[");
	for (unsigned b = 0; b < 2; b++) {
		n += (size_t)sprintf(s + n, "%s{\"enum\":[%u", b ? "," : "", b * 40);
		for (unsigned i = 1; i < 40; i++)
			n += (size_t)sprintf(s + n, ",%u", b * 40 + i);
		n += (size_t)sprintf(s + n, "]}");
	}
	n += (size_t)sprintf(s + n, "]}");
	ck_assert_int_eq(jschema_compile_text(s, n, &g, msg, sizeof(msg)), JSCHEMA_E_INVALID);
	ck_assert_msg(strstr(msg, "enum"), "%s", msg);
	n = (size_t)sprintf(s, "{\"description\":\"");
	memset(s + n, 'x', JSCHEMA_BYTES_MAX);
	n += JSCHEMA_BYTES_MAX;
	n += (size_t)sprintf(s + n, "\"}");
	ck_assert_int_eq(jschema_compile_text(s, n, &g, msg, sizeof(msg)), JSCHEMA_E_INVALID);
	ck_assert_msg(strstr(msg, "bytes"), "%s", msg);
	ck_assert_ptr_null(g);
	free(s);
}
END_TEST

/* ---- tool calls: a tagged union and a wrap ------------------------------- */

static void add_lit(struct jgram *g, const char *text, uint16_t node, uint32_t *idx)
{
	ck_assert_int_eq(jgram_lit_add(g, text, strlen(text), node, idx), 0);
}

/* {"op": "add" | "neg", then add: "a" and "b" integers, neg: "x" a
 * number}, optionally wrapped in <c>...</c> up to reps times. */
static struct jgram *tool_union_how(const char *pre, const char *post, uint32_t reps,
				    enum jgram_lazy how)
{
	struct jgram *g;
	struct jgram_node *n;
	uint16_t num, intg, add, neg, root;
	uint32_t first, tag, l;

	ck_assert_int_eq(jgram_new(&g), 0);
	ck_assert_int_eq(jgram_node_add(g, &intg, &n), 0);
	n->types = JGRAM_T_INTEGER;
	ck_assert_int_eq(jgram_node_add(g, &num, &n), 0);
	n->types = JGRAM_T_NUMBER;
	add_lit(g, "\"a\"", intg, &first);
	add_lit(g, "\"b\"", intg, NULL);
	ck_assert_int_eq(jgram_node_add(g, &add, &n), 0);
	*n = (struct jgram_node){ .types = JGRAM_T_OBJECT, .lit = first, .n_lit = 2,
				  .required = 3, .max_items = JGRAM_ITEMS_MAX };
	add_lit(g, "\"x\"", num, &first);
	ck_assert_int_eq(jgram_node_add(g, &neg, &n), 0);
	*n = (struct jgram_node){ .types = JGRAM_T_OBJECT, .lit = first, .n_lit = 1,
				  .max_items = JGRAM_ITEMS_MAX };
	add_lit(g, "\"op\"", 0, &tag);
	add_lit(g, "\"add\"", add, &first);
	add_lit(g, "\"neg\"", neg, &l);
	ck_assert_int_eq(jgram_node_add(g, &root, &n), 0);
	*n = (struct jgram_node){ .is_union = true, .tag = tag, .lit = first, .n_lit = 2,
				  .max_items = JGRAM_ITEMS_MAX };
	if (post)
		ck_assert_int_eq(jgram_wrap(g, pre, strlen(pre), post, strlen(post), reps), 0);
	if (how)
		ck_assert_int_eq(jgram_lazy(g, how), 0);
	ck_assert_int_eq(jgram_seal(g, root, NULL, 0), 0);
	return g;
}

static struct jgram *tool_union(const char *pre, const char *post, uint32_t reps)
{
	return tool_union_how(pre, post, reps, JGRAM_LAZY_NONE);
}

/* The tag first, its value picks the rest; nothing else. */
START_TEST(union_accepts_refuses)
{
	static const char *const bad[][2] = {
		{ "{", "}" },                               /* the tag is due */
		{ "{\"", "a\":1}" },                        /* the tag first */
		{ "{\"op\":\"", "mul\"}" },
		{ "{\"op\":", "1}" },
		{ "{\"op\":\"add\"", "}" },                /* add needs a and b */
		{ "{\"op\":\"add\",\"", "x\":1}" },        /* neg's key under add */
		{ "{\"op\":\"add\",\"", "op\":\"add\"}" },  /* the tag again */
		{ "{\"op\":\"add\",\"a\":1,\"b\":2", ",\"a\"" },  /* all given */
		{ "{\"op\":\"add\",\"a\":1", ".5" },       /* integer */
		{ "{\"op\":\"neg\",\"", "a\":1}" },
		{ "{\"op\":\"neg\"}", "{" },                 /* one value */
	};
	struct jgram *g = tool_union(NULL, NULL, 0);

	expect_valid(g, "{\"op\":\"add\",\"b\":2,\"a\":1}");
	expect_valid(g, " { \"op\" : \"neg\" , \"x\" : -1.5e2 } ");
	expect_valid(g, "{\"op\":\"neg\"}");
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		expect_refused(g, bad[i][0], bad[i][1]);
	jgram_free(g);
}
END_TEST

/* pre VALUE post, 1..reps times, whitespace around; complete only after
 * a whole post. */
START_TEST(wrap_accepts_refuses)
{
	static const char *const bad[][2] = {
		{ "", "{" },                                /* pre first */
		{ "<c", "d" },
		{ "<c>{\"op\":\"neg\"}<", "c" },
		{ "<c>{\"op\":\"neg\"}</c><c>{\"op\":\"neg\"}</c>", "<" },   /* 2 reps */
		{ "<c>{\"op\":\"neg\"}", "x" },
		{ "<c>{\"op\":\"neg\"}</c>        ", " " },   /* whitespace bound */
	};
	struct jgram *g = tool_union("<c>", "</c>", 2);
	bool complete;

	expect_valid(g, "<c>{\"op\":\"neg\"}</c>");
	expect_valid(g, "<c>\n{\"op\":\"add\",\"a\":1,\"b\":2}\n</c>\n<c>{\"op\":\"neg\"}</c>\n");
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		expect_refused(g, bad[i][0], bad[i][1]);
	static const char *const open[] = { "", "<c>", "<c>{\"op\":\"neg\"}", "<c>{\"op\":\"neg\"}</",
					    "<c>{\"op\":\"neg\"}</c><c>" };
	for (size_t i = 0; i < sizeof(open) / sizeof(open[0]); i++) {
		ck_assert_int_eq(feed_until(g, open[i], strlen(open[i]), &complete), -1);
		ck_assert_msg(!complete, "'%s' complete", open[i]);
	}
	jgram_free(g);
	/* no pre: the value then post, once */
	g = tool_union("", "]", 1);
	expect_valid(g, "{\"op\":\"neg\"} ]");
	expect_refused(g, "{\"op\":\"neg\"}]", "[");
	jgram_free(g);
}
END_TEST

/* Lazy on pre: free text until pre, then only the wrap's calls (at
 * most reps), whitespace and the end. */
START_TEST(lazy_pre_accepts_refuses)
{
	static const char *const bad[][2] = {
		{ "text <c>", "x" },                        /* the grammar after pre */
		{ "a<<c>", "}" },                           /* a trigger after a false start */
		{ "<c>{\"op\":\"neg\"}</c>", "y" },        /* no text after the calls */
		{ "<c>{\"op\":\"neg\"}</c> ", "<" },       /* one call (reps 1) */
		{ "t<c>{\"op\":\"add\",\"a\":1", "}" },    /* the schema holds */
		{ "<c<c>", "x" },
	};
	static const char *const good[] = {
		"", "  ", "hello <c <", "{\"op\":1} </c> < c>",
		"a<<c>{\"op\":\"neg\"}</c>",
		"x <c>{\"op\":\"neg\"}</c>\n ",
		"<<<c>\n{\"op\":\"add\",\"a\":1,\"b\":2}\n</c>",
	};
	struct jgram *g = tool_union_how("<c>", "</c>", 1, JGRAM_LAZY_PRE);
	struct jgram_run *r;
	bool complete;

	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
		expect_valid(g, good[i]);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		expect_refused(g, bad[i][0], bad[i][1]);
	ck_assert_int_eq(feed_until(g, "ab<c>{", 6, &complete), -1);
	ck_assert(!complete);
	ck_assert_int_eq(jgram_run_new(&r, g, NULL), 0);
	ck_assert(jgram_run_feed(r, "ab<c", 4));
	ck_assert(jgram_run_free_text(r) && !jgram_run_triggered(r) && jgram_run_complete(r));
	ck_assert(jgram_run_feed(r, ">", 1));
	ck_assert(!jgram_run_free_text(r) && jgram_run_triggered(r) && !jgram_run_complete(r));
	jgram_run_free(r);
	jgram_free(g);
	/* several calls, and a trigger that overlaps itself (KMP) */
	g = tool_union_how("aab", "</c>", 2, JGRAM_LAZY_PRE);
	expect_valid(g, "aaab{\"op\":\"neg\"}</c>aab{\"op\":\"neg\"}</c>");
	expect_valid(g, "abaa aaa");
	expect_refused(g, "xaaab", "x");
	jgram_free(g);
}
END_TEST

/* Lazy at the start: a first `{` is the call's, anything else is text. */
START_TEST(lazy_start_accepts_refuses)
{
	static const char *const bad[][2] = {
		{ "  {", "x" },
		{ "{\"op\":\"neg\"}", "x" },
		{ "\n{\"op\":\"neg\"} ", "t" },
		{ "{\"op\":\"add\",\"a\":1", "}" },
	};
	static const char *const good[] = {
		"", "  ", "hello {", "[1]", " x{\"op\":", " \n{\"op\":\"neg\"}",
		"{\"op\":\"add\",\"a\":1,\"b\":2} ",
	};
	struct jgram *g = tool_union_how(NULL, NULL, 0, JGRAM_LAZY_START);
	bool complete;

	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
		expect_valid(g, good[i]);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		expect_refused(g, bad[i][0], bad[i][1]);
	ck_assert_int_eq(feed_until(g, " {", 2, &complete), -1);
	ck_assert(!complete);
	jgram_free(g);
	/* LAZY_PRE needs a pre; neither after seal */
	g = tool_union_how(NULL, NULL, 0, JGRAM_LAZY_NONE);
	ck_assert_int_eq(jgram_lazy(g, JGRAM_LAZY_START), JGRAM_E_INVALID);
	jgram_free(g);
	ck_assert_int_eq(jgram_new(&g), 0);
	ck_assert_int_eq(jgram_lazy(g, JGRAM_LAZY_PRE), JGRAM_E_INVALID);
	ck_assert_int_eq(jgram_wrap(g, "", 0, "]", 1, 1), 0);
	ck_assert_int_eq(jgram_lazy(g, JGRAM_LAZY_PRE), JGRAM_E_INVALID);
	ck_assert_int_eq(jgram_lazy(g, 7), JGRAM_E_INVALID);
	jgram_free(g);
	/* no wrap after jgram_lazy: its trigger's KMP table is the old pre's */
	ck_assert_int_eq(jgram_new(&g), 0);
	ck_assert_int_eq(jgram_wrap(g, "<a>", 3, "</a>", 4, 1), 0);
	ck_assert_int_eq(jgram_lazy(g, JGRAM_LAZY_PRE), 0);
	ck_assert_int_eq(jgram_wrap(g, "<bb>", 4, "</bb>", 5, 1), JGRAM_E_INVALID);
	jgram_free(g);
}
END_TEST

/* What jgram_wrap and jgram_seal refuse. */
START_TEST(union_wrap_invalid)
{
	struct jgram *g;
	struct jgram_node *n;
	uint16_t obj, str, root;
	uint32_t tag, v;
	char msg[160];
	char big[JGRAM_WRAP_MAX + 1];

	memset(big, 'x', sizeof(big));
	ck_assert_int_eq(jgram_new(&g), 0);
	ck_assert_int_eq(jgram_wrap(g, "a", 1, "", 0, 1), JGRAM_E_INVALID);    /* no post */
	ck_assert_int_eq(jgram_wrap(g, "", 0, "b", 1, 2), JGRAM_E_INVALID);    /* reps, no pre */
	ck_assert_int_eq(jgram_wrap(g, big, sizeof(big), "b", 1, 1), JGRAM_E_INVALID);
	ck_assert_int_eq(jgram_wrap(g, "a", 1, "b", 1, JGRAM_REPS_MAX + 1), JGRAM_E_INVALID);
	ck_assert_int_eq(jgram_wrap(g, "a", 1, "b", 1, 0), JGRAM_E_INVALID);
	ck_assert_int_eq(jgram_node_add(g, &str, &n), 0);
	n->types = JGRAM_T_STRING;
	add_lit(g, "\"k\"", str, &v);
	ck_assert_int_eq(jgram_node_add(g, &obj, &n), 0);
	*n = (struct jgram_node){ .types = JGRAM_T_OBJECT, .lit = v, .n_lit = 1 };
	add_lit(g, "\"k\"", 0, &tag);
	add_lit(g, "\"s\"", str, &v);       /* a variant that is no object */
	ck_assert_int_eq(jgram_node_add(g, &root, &n), 0);
	*n = (struct jgram_node){ .is_union = true, .tag = tag, .lit = v, .n_lit = 1 };
	ck_assert_int_eq(jgram_seal(g, root, msg, sizeof(msg)), JGRAM_E_INVALID);
	ck_assert_msg(strstr(msg, "object node"), "%s", msg);
	jgram_node(g, root)->is_union = false;
	jgram_node(g, root)->types = JGRAM_T_NULL;
	add_lit(g, "\"t\"", obj, &v);       /* the variant takes the tag's key "k" */
	ck_assert_int_eq(jgram_node_add(g, &root, &n), 0);
	*n = (struct jgram_node){ .is_union = true, .tag = tag, .lit = v, .n_lit = 1 };
	ck_assert_int_eq(jgram_seal(g, root, msg, sizeof(msg)), JGRAM_E_INVALID);
	ck_assert_msg(strstr(msg, "tag's key again"), "%s", msg);
	add_lit(g, "3", obj, &v);             /* a value that is no string */
	ck_assert_int_eq(jgram_node_add(g, &root, &n), 0);
	*n = (struct jgram_node){ .is_union = true, .tag = tag, .lit = v, .n_lit = 1 };
	ck_assert_int_eq(jgram_seal(g, root, msg, sizeof(msg)), JGRAM_E_INVALID);
	jgram_free(g);
}
END_TEST

/* ---- the mask ----------------------------------------------------------- */

static char tmpdir[256];

static struct tokenizer *gen_tok(enum gguf_vocab_kind kind, struct gguf_file **f)
{
	struct gguf_llama_params p = GGUF_LLAMA_PARAMS_DEFAULT;
	struct gguf_error err;
	struct tokenizer *t;
	char path[512];

	p.n_vocab = 600;
	p.vocab = kind;
	snprintf(path, sizeof(path), "%s/v%d.gguf", tmpdir, (int)kind);
	ck_assert_int_eq(gguf_make_llama(path, &p), 0);
	ck_assert_int_eq(gguf_open(f, path, &err), 0);
	ck_assert_int_eq(tokenizer_new(&t, *f, &err), 0);
	return t;
}

static bool allowed(const uint64_t *a, int32_t id)
{
	return a[(uint32_t)id / 64] >> ((uint32_t)id % 64) & 1;
}

/* The mask equals feeding each token's piece to a fresh run that read
 * the same history. */
static void check_mask(const struct jgram *g, const struct tokenizer *t,
		       const uint64_t *a, const char *hist, size_t n_hist)
{
	struct jgram_run *r;

	for (int32_t id = 0; id < (int32_t)tokenizer_n_vocab(t); id++) {
		enum tokenizer_type ty = tokenizer_token_type(t, id);
		const char *p;
		size_t len;
		bool want;

		if (jgram_run_new(&r, g, NULL) || !jgram_run_feed(r, hist, n_hist) ||
		    tokenizer_piece(t, id, &p, &len))
			ck_abort_msg("token %d: cannot replay the history", id);
		if (id == tokenizer_eos(t))
			want = jgram_run_complete(r);
		else if (jgram_run_free_text(r))   /* text tokens of any length */
			want = !len || ty == TOKEN_TYPE_CONTROL || ty == TOKEN_TYPE_UNKNOWN ||
			       ty == TOKEN_TYPE_UNUSED || id == tokenizer_bos(t) ||
			       jgram_run_feed(r, p, len);
		else
			want = len && ty != TOKEN_TYPE_CONTROL && ty != TOKEN_TYPE_UNKNOWN &&
			       ty != TOKEN_TYPE_UNUSED && id != tokenizer_bos(t) &&
			       len <= JGRAM_PIECE_MAX && jgram_run_feed(r, p, len);
		if (allowed(a, id) != want)
			ck_abort_msg("token %d ('%.*s') after '%.*s': mask %d, want %d",
			      id, (int)len, p, (int)n_hist, hist, allowed(a, id), want);
		jgram_run_free(r);
	}
}

/* A random walk: a token drawn among those allowed (EOS taken a tenth of
 * the time it is offered) until EOS or max steps, the mask checked by
 * brute force every brute steps (0: never). Returns the text; *eos
 * when it ended on EOS. */
static bool text_token(const struct tokenizer *t, int32_t id)
{
	enum tokenizer_type ty = tokenizer_token_type(t, id);

	return ty != TOKEN_TYPE_CONTROL && ty != TOKEN_TYPE_UNKNOWN && ty != TOKEN_TYPE_UNUSED &&
	       id != tokenizer_bos(t) && id != tokenizer_eos(t);
}

static const char *walk_force;   /* a lazy walk's trigger, drawn often */
static int32_t byte_tok[256];    /* each byte's one-byte token */

/* In free text, now and then walk_force a byte at a time (mostly to
 * its end, sometimes broken off). */
static int32_t walk_forced(struct jgram_run *r, const uint64_t *a, size_t *fp)
{
	int32_t id;

	if (!walk_force || !jgram_run_free_text(r) || !walk_force[*fp] ||
	    rand() % 10 < (*fp ? 1 : 7)) {
		*fp = 0;
		return -1;
	}
	id = byte_tok[(uint8_t)walk_force[(*fp)++]];
	return allowed(a, id) ? id : -1;
}

static char *walk(const struct jgram *g, const struct jgram_vocab *v,
		  const struct tokenizer *t, unsigned seed, unsigned steps,
		  unsigned brute, bool *eos)
{
	size_t fp = 0;
	uint32_t nv = tokenizer_n_vocab(t);
	float *logits = calloc(nv, sizeof(float));
	char *hist = malloc(steps * JGRAM_PIECE_MAX + 1);
	struct jgram_run *r;
	size_t n = 0;

	srand(seed);
	*eos = false;
	ck_assert_int_eq(jgram_run_new(&r, g, v), 0);
	for (unsigned s = 0; s < steps && !*eos; s++) {
		uint32_t k = 0, pick, cnt;
		const uint64_t *a;
		int32_t id = -1;
		const char *p;
		size_t len;

		memset(logits, 0, nv * sizeof(float));
		cnt = jgram_run_mask(r, logits, nv);
		if (!cnt)
			ck_abort_msg("seed %u step %u: an empty mask after '%.*s'", seed, s,
				     (int)n, hist);
		a = jgram_run_allowed(r);
		for (uint32_t i = 0; i < nv; i++) {
			/* (Check's asserts are slow in a loop this hot) */
			if (allowed(a, (int32_t)i) != !isinf(logits[i]))
				ck_abort_msg("token %u: allowed %d, logit %f", i,
					     allowed(a, (int32_t)i), logits[i]);
			k += allowed(a, (int32_t)i);
		}
		if (k != cnt)
			ck_abort_msg("mask says %u allowed, the bitmap %u", cnt, k);
		if (brute && s % brute == 0)
			check_mask(g, t, a, hist, n);
		if (allowed(a, tokenizer_eos(t)) &&
		    (k == 1 || rand() % (jgram_run_free_text(r) ? 100 : 10) == 0)) {
			*eos = true;
			ck_assert(jgram_run_accept(r, tokenizer_eos(t)));
			break;
		}
		id = walk_forced(r, a, &fp);
		pick = (uint32_t)rand() % (k - allowed(a, tokenizer_eos(t)));
		for (uint32_t i = 0; i < nv && id < 0; i++)
			if (allowed(a, (int32_t)i) && (int32_t)i != tokenizer_eos(t) && !pick--)
				id = (int32_t)i;
		if (!jgram_run_accept(r, id) || tokenizer_piece(t, id, &p, &len))
			ck_abort_msg("token %d allowed but not accepted", id);
		if (!text_token(t, id))
			continue;   /* a control token writes nothing (free text) */
		ck_assert_uint_le(len, JGRAM_PIECE_MAX);
		memcpy(hist + n, p, len);
		n += len;
	}
	hist[n] = 0;
	jgram_run_free(r);
	free(logits);
	return hist;
}

/* A Hermes call grammar from an OpenAI body (net/wire/openai_toolgram.c):
 * f strict ({"k": an integer}), g any object. */
static struct jgram *hermes_calls(void)
{
	static const char body[] =
		"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"required\","
		"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"strict\":true,"
		"\"parameters\":{\"type\":\"object\",\"properties\":{\"k\":{\"type\":\"integer\"}},"
		"\"required\":[\"k\"]}}},{\"type\":\"function\",\"function\":{\"name\":\"g\"}}]}";
	struct openai_req q;
	struct openai_error e;
	struct jgram *g;

	ck_assert_int_eq(openai_req_parse(&q, true, body, strlen(body), &e), 0);
	ck_assert_int_eq(openai_tools_grammar(&q, CHAT_CHATML, &e), 0);
	g = q.gram;
	q.gram = NULL;
	openai_req_deinit(&q);
	return g;
}

/* text is Hermes calls of f (arguments exactly {"k": an integer}) or g
 * (an object), read with jansson. */
static void check_calls(const char *text, unsigned seed)
{
	const char *p = text, *end;
	unsigned n = 0;

	for (;;) {
		json_t *j, *a;
		const char *name;

		while (*p && strchr(" \t\r\n", *p))
			p++;
		if (!*p)
			break;
		ck_assert_msg(!strncmp(p, "<tool_call>", 11), "seed %u: '%s'", seed, text);
		p += 11;
		end = strstr(p, "</tool_call>");
		ck_assert_msg(end, "seed %u: '%s' unclosed", seed, text);
		j = json_loadb(p, (size_t)(end - p), 0, NULL);
		name = json_string_value(json_object_get(j, "name"));
		a = json_object_get(j, "arguments");
		ck_assert_msg(name && json_is_object(a) && json_object_size(j) == 2,
			      "seed %u: '%.*s' is not a call", seed, (int)(end - p), p);
		ck_assert_msg(!strcmp(name, "g") || (!strcmp(name, "f") && json_object_size(a) == 1 &&
						     json_is_integer(json_object_get(a, "k"))),
			      "seed %u: '%.*s'", seed, (int)(end - p), p);
		json_decref(j);
		p = end + 12;
		n++;
	}
	ck_assert_msg(n >= 1, "seed %u: no call in '%s'", seed, text);
}

/* Strings under checks, anyOf, integer bounds: walked, then checked by
 * hand (check_rich). */
static const char rich[] =
	"{\"type\":\"object\",\"properties\":{"
	"\"id\":{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}-\\\\d{3}$\"},"
	"\"name\":{\"type\":\"string\",\"minLength\":2,\"maxLength\":5},"
	"\"long\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":70},"
	"\"when\":{\"type\":\"string\",\"format\":\"date\"},"
	"\"opt\":{\"anyOf\":[{\"type\":\"integer\",\"minimum\":-20,\"exclusiveMaximum\":300},"
	"{\"type\":\"null\"},{\"enum\":[\"x\"]}]},"
	"\"r\":{\"type\":\"number\",\"exclusiveMinimum\":-1,\"maximum\":2},"
	"\"u\":{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"t\":{\"const\":\"a\"},"
	"\"v\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":9}},\"required\":[\"t\",\"v\"]},"
	"{\"type\":\"object\",\"properties\":{\"t\":{\"const\":\"b\"}},\"required\":[\"t\"]}]},"
	"\"q\":{\"type\":\"string\",\"pattern\":\"x\\\"|\\\\\\\\\",\"maxLength\":8}},"
	"\"required\":[\"id\",\"name\",\"when\",\"opt\"]}";

static unsigned code_points(const char *p)
{
	unsigned n = 0;

	for (; *p; p++)
		n += ((uint8_t)*p & 0xc0) != 0x80;
	return n;
}

static void check_rich(const json_t *j, unsigned seed, const char *text)
{
	const char *id = json_string_value(json_object_get(j, "id"));
	const char *name = json_string_value(json_object_get(j, "name"));
	const char *when = json_string_value(json_object_get(j, "when"));
	const json_t *opt = json_object_get(j, "opt"), *q = json_object_get(j, "q");
	const json_t *u = json_object_get(j, "u");
	const json_t *lng = json_object_get(j, "long");
	const char *t = json_string_value(json_object_get(u, "t"));
	int y, m, d;

	ck_assert_msg(id && strlen(id) == 6 && id[0] >= 'A' && id[0] <= 'Z' && id[1] >= 'A' &&
		      id[1] <= 'Z' && id[2] == '-' && strspn(id + 3, "0123456789") == 3,
		      "seed %u: id in '%s'", seed, text);
	ck_assert_msg(name && code_points(name) >= 2 && code_points(name) <= 5,
		      "seed %u: name in '%s'", seed, text);
	ck_assert_msg(!lng || (json_is_string(lng) && code_points(json_string_value(lng)) >= 1 &&
			       code_points(json_string_value(lng)) <= 70),
		      "seed %u: long in '%s'", seed, text);
	ck_assert_msg(when && strlen(when) == 10 && sscanf(when, "%4d-%2d-%2d", &y, &m, &d) == 3 &&
		      m >= 1 && m <= 12 && d >= 1 && d <= 28, "seed %u: when in '%s'", seed, text);
	ck_assert_msg(!json_object_get(j, "r") || (json_number_value(json_object_get(j, "r")) > -1 &&
						    json_number_value(json_object_get(j, "r")) <= 2),
		      "seed %u: r in '%s'", seed, text);
	ck_assert_msg(!u || (json_object_size(u) == 2 && !strcmp(t ? t : "", "a") &&
			     json_integer_value(json_object_get(u, "v")) >= 0 &&
			     json_integer_value(json_object_get(u, "v")) <= 9) ||
		      (json_object_size(u) == 1 && !strcmp(t ? t : "", "b")),
		      "seed %u: u in '%s'", seed, text);
	ck_assert_msg(!json_is_integer(opt) || (json_integer_value(opt) >= -20 &&
						json_integer_value(opt) < 300),
		      "seed %u: opt in '%s'", seed, text);
	ck_assert_msg(opt && (json_is_integer(opt) || json_is_null(opt) ||
			      !strcmp(json_string_value(opt) ? json_string_value(opt) : "", "x")),
		      "seed %u: opt in '%s'", seed, text);
	ck_assert_msg(!q || (json_is_string(q) && (strstr(json_string_value(q), "x\"") ||
						   strchr(json_string_value(q), '\\'))),
		      "seed %u: q in '%s'", seed, text);
}

static void walks(enum gguf_vocab_kind kind)
{
	struct gguf_file *f;
	struct tokenizer *t = gen_tok(kind, &f);
	struct jgram_vocab *v;
	struct jgram *gs[4];
	unsigned ended = 0, calls = 0, riches = 0;

	ck_assert_int_eq(jgram_vocab_new(&v, t), 0);
	ck_assert(jgram_vocab_bytes_covered(v));
	ck_assert_int_eq(jgram_new_object(&gs[0]), 0);
	gs[1] = compile(person);
	gs[2] = hermes_calls();
	gs[3] = compile(rich);
	for (unsigned seed = 1; seed <= 80; seed++) {
		const struct jgram *g = gs[seed % 4];
		bool eos;
		char *text = walk(g, v, t, seed, 400, seed <= 6 ? 3 : 0, &eos);
		json_error_t je;
		json_t *j;

		if (eos && g == gs[2]) {
			check_calls(text, seed);
			calls++;
		} else if (eos) {
			ended++;
			j = json_loads(text, JSON_DECODE_ANY, &je);
			ck_assert_msg(j && json_is_object(j), "seed %u: '%s' does not parse: %s",
				      seed, text, je.text);
			if (g == gs[1])
				ck_assert_msg(json_is_string(json_object_get(j, "name")) &&
					      json_is_integer(json_object_get(j, "age")),
					      "seed %u: '%s' lacks its required fields", seed, text);
			if (g == gs[3]) {
				check_rich(j, seed, text);
				riches++;
			}
			json_decref(j);
		}
		free(text);
	}
	ck_assert_msg(ended >= 10, "only %u of 40 JSON walks ended", ended);
	ck_assert_msg(calls >= 5, "only %u of 20 call walks ended", calls);
	ck_assert_msg(riches >= 5, "only %u of 20 checked walks ended", riches);
	jgram_free(gs[3]);
	jgram_free(gs[0]);
	jgram_free(gs[1]);
	jgram_free(gs[2]);
	jgram_vocab_free(v);
	tokenizer_free(t);
	gguf_close(f);
}

/* The chatml call grammar under tool_choice "auto" (lazy on
 * "<tool_call>"), as openai_toolgram.c makes it. */
static struct jgram *hermes_auto(void)
{
	static const char body[] =
		"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"parallel_tool_calls\":false,"
		"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"strict\":true,"
		"\"parameters\":{\"type\":\"object\",\"properties\":{\"k\":{\"type\":\"integer\"}},"
		"\"required\":[\"k\"]}}},{\"type\":\"function\",\"function\":{\"name\":\"g\"}}]}";
	struct openai_req q;
	struct openai_error e;
	struct jgram *g;

	ck_assert_int_eq(openai_req_parse(&q, true, body, strlen(body), &e), 0);
	ck_assert_int_eq(openai_tools_grammar(&q, CHAT_CHATML, &e), 0);
	ck_assert_ptr_nonnull(q.gram);
	g = q.gram;
	q.gram = NULL;
	openai_req_deinit(&q);
	return g;
}

/* A trigger the vocabulary holds inside a longer token with bytes
 * after it (tokens straddling it are common in random walks). */
static void short_trigger(const struct tokenizer *t, char *out)
{
	for (int32_t id = 0; id < (int32_t)tokenizer_n_vocab(t); id++) {
		const char *p;
		size_t len;

		if (!text_token(t, id) || tokenizer_piece(t, id, &p, &len))
			continue;
		for (size_t i = 0; i + 2 < len; i++) {
			if (strchr(" \t\r\n{", p[i]) || strchr(" \t\r\n{", p[i + 1]) ||
			    p[i] == p[i + 1] || (uint8_t)p[i] >= 0x80 || (uint8_t)p[i + 1] >= 0x80)
				continue;
			out[0] = p[i];
			out[1] = p[i + 1];
			out[2] = 0;
			return;
		}
	}
	ck_abort_msg("no token holds two bytes with one after them");
}

/* Lazy walks: free text, the trigger drawn a byte at a time (split over
 * tokens) or inside longer tokens, then the grammar; the mask equals
 * the brute force at every third step of the first walks. */
static void walks_lazy(enum gguf_vocab_kind kind)
{
	struct gguf_file *f;
	struct tokenizer *t = gen_tok(kind, &f);
	struct jgram_vocab *v;
	struct jgram *gs[2];
	char trig[3];
	unsigned fired[2] = { 0 };

	ck_assert_int_eq(jgram_vocab_new(&v, t), 0);
	for (int32_t id = 0; id < (int32_t)tokenizer_n_vocab(t); id++) {
		const char *p;
		size_t len;

		if (text_token(t, id) && !tokenizer_piece(t, id, &p, &len) && len == 1)
			byte_tok[(uint8_t)p[0]] = id;
	}
	short_trigger(t, trig);
	gs[0] = hermes_auto();
	gs[1] = tool_union_how(trig, "</c>", 2, JGRAM_LAZY_PRE);
	for (unsigned seed = 1; seed <= 40; seed++) {
		unsigned w = seed % 2;
		const char *call;
		bool eos;
		char *text;

		walk_force = w ? trig : "<tool_call>";
		text = walk(gs[w], v, t, seed, 300, seed <= 8 ? 3 : 0, &eos);
		call = strstr(text, walk_force);
		if (call && w == 0 && eos) {
			check_calls(call, seed);
			ck_assert_msg(!strstr(call + 11, "<tool_call>"), "seed %u: two calls in '%s'",
				      seed, text);
		}
		fired[w] += call != NULL;
		free(text);
	}
	walk_force = NULL;
	ck_assert_msg(fired[0] >= 5 && fired[1] >= 5, "triggers fired in %u and %u of 20 walks",
		      fired[0], fired[1]);
	jgram_free(gs[0]);
	jgram_free(gs[1]);
	jgram_vocab_free(v);
	tokenizer_free(t);
	gguf_close(f);
}

START_TEST(mask_lazy_spm)
{
	walks_lazy(GGUF_VOCAB_LLAMA);
}
END_TEST

START_TEST(mask_lazy_bpe)
{
	walks_lazy(GGUF_VOCAB_GPT2);
}
END_TEST

/* A broad pattern in an unbounded string: the plain tokens allowed kept
 * for the pattern's state (run_pat) agree with the brute-force replay at
 * every step, in a class repeated and after a state change. */
static void pattern_walks(enum gguf_vocab_kind kind)
{
	struct gguf_file *f;
	struct tokenizer *t = gen_tok(kind, &f);
	struct jgram_vocab *v;
	struct jgram *g = compile("{\"type\":\"object\",\"properties\":{\"w\":{\"type\":\"string\","
				  "\"pattern\":\"^[a-z ,.]*[0-9]?[A-Z]*$\",\"minLength\":3}},"
				  "\"required\":[\"w\"]}");
	unsigned inside = 0;

	ck_assert_int_eq(jgram_vocab_new(&v, t), 0);
	for (unsigned seed = 1; seed <= 4; seed++) {
		bool eos;
		char *text = walk(g, v, t, seed, 60, 1, &eos);

		inside += strlen(text) > 12;
		free(text);
	}
	ck_assert_msg(inside >= 2, "the walks did not go into the string");
	jgram_free(g);
	jgram_vocab_free(v);
	tokenizer_free(t);
	gguf_close(f);
}

START_TEST(mask_pattern_spm)
{
	pattern_walks(GGUF_VOCAB_LLAMA);
}
END_TEST

START_TEST(mask_pattern_bpe)
{
	pattern_walks(GGUF_VOCAB_GPT2);
}
END_TEST

START_TEST(mask_walks_spm)
{
	walks(GGUF_VOCAB_LLAMA);
}
END_TEST

START_TEST(mask_walks_bpe)
{
	walks(GGUF_VOCAB_GPT2);
}
END_TEST

/* EOS only when complete; after the value only whitespace and EOS. */
START_TEST(mask_eos)
{
	struct gguf_file *f;
	struct tokenizer *t = gen_tok(GGUF_VOCAB_LLAMA, &f);
	uint32_t nv = tokenizer_n_vocab(t);
	float *logits = calloc(nv, sizeof(float));
	struct jgram_vocab *v;
	struct jgram_run *r;
	struct jgram *g;
	const char *p;
	size_t len;

	ck_assert_int_eq(jgram_vocab_new(&v, t), 0);
	ck_assert_int_eq(jgram_new_object(&g), 0);
	ck_assert_int_eq(jgram_run_new(&r, g, v), 0);
	jgram_run_mask(r, logits, nv);
	ck_assert(!allowed(jgram_run_allowed(r), tokenizer_eos(t)));
	ck_assert(!jgram_run_accept(r, tokenizer_eos(t)));
	ck_assert(jgram_run_feed(r, "{}", 2));
	memset(logits, 0, nv * sizeof(float));
	jgram_run_mask(r, logits, nv);
	ck_assert(allowed(jgram_run_allowed(r), tokenizer_eos(t)));
	for (int32_t id = 0; id < (int32_t)nv; id++) {
		if (!allowed(jgram_run_allowed(r), id) || id == tokenizer_eos(t))
			continue;
		ck_assert_int_eq(tokenizer_piece(t, id, &p, &len), 0);
		for (size_t i = 0; i < len; i++)
			ck_assert_msg(strchr(" \t\n\r", p[i]), "token %d '%.*s' after {}", id,
				      (int)len, p);
	}
	ck_assert(!isinf(logits[tokenizer_eos(t)]));
	ck_assert(isinf(logits[tokenizer_bos(t)]));
	jgram_run_free(r);
	jgram_free(g);
	jgram_vocab_free(v);
	tokenizer_free(t);
	gguf_close(f);
	free(logits);
}
END_TEST

/* Any object, after the lead token lead. */
static struct jgram *lead_object(const char *lead)
{
	struct jgram_node *n;
	struct jgram *g;
	uint16_t id;

	ck_assert_int_eq(jgram_new(&g), 0);
	ck_assert_int_eq(jgram_node_add(g, &id, &n), 0);
	n->types = JGRAM_T_OBJECT;
	n->free_keys = true;
	ck_assert_int_eq(jgram_lead(g, lead, strlen(lead)), 0);
	ck_assert_int_eq(jgram_seal(g, id, NULL, 0), 0);
	return g;
}

/* A lead token (Mistral's [TOOL_CALLS]; here the generated vocabulary's
 * BOS, a control token): it alone until drawn, no EOS before it, then
 * the byte grammar; a lead that is no control token fails the run. */
START_TEST(mask_lead)
{
	struct gguf_file *f;
	struct tokenizer *t = gen_tok(GGUF_VOCAB_LLAMA, &f);
	uint32_t nv = tokenizer_n_vocab(t);
	float *logits = calloc(nv, sizeof(float));
	int32_t bos = tokenizer_bos(t), brace = -1;
	struct jgram_vocab *v;
	struct jgram_run *r;
	struct jgram *g;
	const char *p;
	size_t len;

	ck_assert_int_eq(jgram_vocab_new(&v, t), 0);
	g = lead_object("<s>");
	ck_assert_int_eq(jgram_lead(g, "<s>", 3), JGRAM_E_INVALID);   /* sealed */
	ck_assert_int_eq(jgram_run_new(&r, g, v), 0);
	ck_assert_uint_eq(jgram_run_mask(r, logits, nv), 1);
	for (int32_t id = 0; id < (int32_t)nv; id++) {
		ck_assert_int_eq(allowed(jgram_run_allowed(r), id), id == bos);
		ck_assert_int_eq(isinf(logits[id]) != 0, id != bos);
		if (brace < 0 && !tokenizer_piece(t, id, &p, &len) && len == 1 && p[0] == '{')
			brace = id;
	}
	ck_assert_int_ge(brace, 0);
	ck_assert(!jgram_run_can(r, '{'));
	ck_assert(!jgram_run_complete(r));
	ck_assert(!jgram_run_accept(r, brace));
	ck_assert(!jgram_run_accept(r, tokenizer_eos(t)));
	ck_assert(jgram_run_accept(r, bos));
	memset(logits, 0, nv * sizeof(float));
	ck_assert_uint_gt(jgram_run_mask(r, logits, nv), 1);
	ck_assert(!allowed(jgram_run_allowed(r), bos));
	ck_assert(allowed(jgram_run_allowed(r), brace));
	ck_assert(jgram_run_accept(r, brace));
	ck_assert(jgram_run_feed(r, "}", 1));
	ck_assert(jgram_run_complete(r));
	jgram_run_free(r);
	/* bytes only: no lead */
	ck_assert_int_eq(jgram_run_new(&r, g, NULL), 0);
	ck_assert(jgram_run_feed(r, "{}", 2));
	jgram_run_free(r);
	jgram_free(g);
	/* not one control token of the vocabulary; empty */
	g = lead_object("ab");
	ck_assert_int_eq(jgram_run_new(&r, g, v), -ENOENT);
	jgram_free(g);
	ck_assert_int_eq(jgram_new(&g), 0);
	ck_assert_int_eq(jgram_lead(g, "", 0), JGRAM_E_INVALID);
	jgram_free(g);
	jgram_vocab_free(v);
	tokenizer_free(t);
	gguf_close(f);
	free(logits);
}
END_TEST

/* A lazy lead (JGRAM_LAZY_LEAD; tool_choice "auto" in Mistral v0.3's
 * format): every token is allowed and the output may end until the lead
 * is drawn; from it the byte grammar holds (after the lead, `x` is
 * refused and EOS only once the object is complete). The mode needs a
 * lead and no pre; a lead after jgram_lazy is refused. */
START_TEST(mask_lead_lazy)
{
	struct gguf_file *f;
	struct tokenizer *t = gen_tok(GGUF_VOCAB_LLAMA, &f);
	uint32_t nv = tokenizer_n_vocab(t);
	float *logits = calloc(nv, sizeof(float));
	int32_t bos = tokenizer_bos(t), eos = tokenizer_eos(t), brace = -1, x = -1;
	struct jgram_vocab *v;
	struct jgram_run *r;
	struct jgram_node *n;
	struct jgram *g;
	uint16_t id;
	const char *p;
	size_t len;

	ck_assert_int_eq(jgram_vocab_new(&v, t), 0);
	for (int32_t i = 0; i < (int32_t)nv; i++) {
		if (tokenizer_piece(t, i, &p, &len) || len != 1)
			continue;
		if (p[0] == '{' && brace < 0)
			brace = i;
		if (p[0] == 'x' && x < 0)
			x = i;
	}
	ck_assert(brace >= 0 && x >= 0);
	ck_assert_int_eq(jgram_new(&g), 0);
	ck_assert_int_eq(jgram_node_add(g, &id, &n), 0);
	n->types = JGRAM_T_OBJECT;
	n->free_keys = true;
	ck_assert_int_eq(jgram_lazy(g, JGRAM_LAZY_LEAD), JGRAM_E_INVALID);   /* no lead */
	ck_assert_int_eq(jgram_lead(g, "<s>", 3), 0);
	ck_assert_int_eq(jgram_lazy(g, JGRAM_LAZY_START), JGRAM_E_INVALID);
	ck_assert_int_eq(jgram_lazy(g, JGRAM_LAZY_LEAD), 0);
	ck_assert_int_eq(jgram_lead(g, "<s>", 3), JGRAM_E_INVALID);   /* lazy already */
	ck_assert_int_eq(jgram_seal(g, id, NULL, 0), 0);
	ck_assert_int_eq(jgram_run_new(&r, g, v), 0);
	/* free text: everything, EOS included; text is taken */
	ck_assert_uint_eq(jgram_run_mask(r, logits, nv), nv);
	for (int32_t i = 0; i < (int32_t)nv; i++)
		ck_assert(!isinf(logits[i]));
	ck_assert(jgram_run_free_text(r));
	ck_assert(!jgram_run_triggered(r));
	ck_assert(jgram_run_complete(r));
	ck_assert(jgram_run_accept(r, x));
	ck_assert(jgram_run_accept(r, brace));
	ck_assert(jgram_run_feed(r, "x}", 2));
	/* the lead: the grammar from here */
	ck_assert(jgram_run_accept(r, bos));
	ck_assert(!jgram_run_free_text(r));
	ck_assert(jgram_run_triggered(r));
	ck_assert(!jgram_run_complete(r));
	memset(logits, 0, nv * sizeof(float));
	ck_assert_uint_lt(jgram_run_mask(r, logits, nv), nv);
	ck_assert(!allowed(jgram_run_allowed(r), x));
	ck_assert(!allowed(jgram_run_allowed(r), eos));
	ck_assert(allowed(jgram_run_allowed(r), brace));
	ck_assert(!jgram_run_accept(r, x));
	ck_assert(jgram_run_accept(r, brace));
	ck_assert(jgram_run_feed(r, "}", 1));
	ck_assert(jgram_run_complete(r));
	jgram_run_free(r);
	jgram_free(g);
	jgram_vocab_free(v);
	tokenizer_free(t);
	gguf_close(f);
	free(logits);
}
END_TEST

static void setup(void)
{
	const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";

	snprintf(tmpdir, sizeof(tmpdir), "%s/test_jsongram.XXXXXX", base);
	ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static void teardown(void)
{
	char cmd[300];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
	ck_assert_int_eq(system(cmd), 0);
}

int main(void)
{
	Suite *s = suite_create("jsongram");
	TCase *tc = tcase_create("recognizer");
	TCase *tm = tcase_create("mask");
	SRunner *sr;
	int failed;

	tcase_add_test(tc, object_accepts);
	tcase_add_test(tc, object_refuses);
	tcase_add_test(tc, shared_runs);
	tcase_add_test(tc, object_incomplete);
	tcase_add_test(tc, object_depth);
	tcase_add_test(tc, schema_accepts);
	tcase_add_test(tc, schema_refuses);
	tcase_add_test(tc, schema_no_dead_end);
	tcase_add_test(tc, schema_refs_and_any);
	tcase_add_test(tc, schema_anyof);
	tcase_add_test(tc, schema_lengths);
	tcase_add_test(tc, schema_patterns);
	tcase_add_test(tc, schema_ranges);
	tcase_add_test(tc, pattern_windows);
	tcase_add_test(tc, pattern_nesting);
	tcase_add_test(tc, schema_errors);
	tcase_add_test(tc, schema_bounds);
	tcase_add_test(tc, union_accepts_refuses);
	tcase_add_test(tc, wrap_accepts_refuses);
	tcase_add_test(tc, union_wrap_invalid);
	tcase_add_test(tc, lazy_pre_accepts_refuses);
	tcase_add_test(tc, lazy_start_accepts_refuses);
	suite_add_tcase(s, tc);
	tcase_add_checked_fixture(tm, setup, teardown);
	tcase_set_timeout(tm, 300);
	tcase_add_test(tm, mask_walks_spm);
	tcase_add_test(tm, mask_walks_bpe);
	tcase_add_test(tm, mask_pattern_spm);
	tcase_add_test(tm, mask_pattern_bpe);
	tcase_add_test(tm, mask_eos);
	tcase_add_test(tm, mask_lead);
	tcase_add_test(tm, mask_lead_lazy);
	tcase_add_test(tm, mask_lazy_spm);
	tcase_add_test(tm, mask_lazy_bpe);
	suite_add_tcase(s, tm);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
