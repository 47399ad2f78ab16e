/* jsongram.h - JSON output by construction: a byte-level recognizer for
 * JSON (RFC 8259), optionally held to a schema, and the token mask it
 * gives a sampler.
 *
 * Three objects:
 *   struct jgram        a compiled grammar: a tree of schema nodes
 *                       (jgram_new + jgram_node_add/jgram_lit_add, then
 *                       jgram_seal), or jgram_new_object() for
 *                       response_format json_object (any JSON object).
 *                       Immutable once sealed: any thread may read it,
 *                       and several runs may share it (jgram_ref).
 *   struct jgram_vocab  a model's vocabulary as a byte trie of the
 *                       tokens' pieces (tokenizer_piece), built once per
 *                       model; immutable, shared.
 *   struct jgram_run    one request's position in one grammar: its
 *                       recognizer state and mask scratch. One thread at
 *                       a time (the engine's compute thread).
 *
 * What the grammar accepts. Any JSON value the node tree allows, written
 * with at most JGRAM_WS_MAX whitespace bytes in a row (before, between
 * and after tokens: a model cannot loop on whitespace), containers
 * nested at most JGRAM_DEPTH_MAX deep, numbers of at most
 * JGRAM_NUM_INT_MAX, _FRAC_MAX and _EXP_MAX digits in their parts (so
 * every parser reads them as a finite double or an int64), strings of
 * any length (or as their checks say, below) with escapes checked
 * (surrogate pairs paired) and UTF-8 checked (no overlongs, surrogates,
 * or code points above U+10FFFF). Enum and const values, and property
 * names, are matched byte for byte against their compact JSON text (as
 * jansson writes it): the model must write "é", not "\u00e9".
 *
 * Schema nodes: a set of types (JGRAM_T_*), for objects the properties
 * (each at most once, any order; `}` only once the required ones are
 * given; no other keys) or, with none listed, any keys with any values
 * (free_keys); for arrays the items' node and min/max items; enum
 * literals (when present they decide alone). Node 0 is ANY: every type,
 * free keys, items of ANY.
 *
 * String checks (a node's str; minLength, maxLength, pattern): lengths
 * count code points (an escape is the one character it denotes, a
 * surrogate pair one); a character is refused when no string of the
 * lengths could follow, `"` before min_len or before the pattern can
 * end. With a pattern (jsonpat.h: an automaton over characters, its
 * state a position bitset) the string's text is matched as it comes,
 * a \u escape is refused (the characters it alone can write match
 * nothing) and the other escapes step the automaton by the character
 * they denote. In the mask, a string with lengths only keeps the
 * plain-text shortcut while a whole piece (JGRAM_PIECE_MAX) fits under
 * max_len; a patterned one keeps the plain tokens allowed for its last
 * pattern state while far from its bounds, and is walked byte by byte
 * near them.
 *
 * Number ranges (a node's range; minimum, maximum, exclusiveMinimum,
 * exclusiveMaximum with integer bounds): such a number is written
 * without an exponent, and a byte is taken only when some completion of
 * the digits so far lies in the range (so `-` needs a negative value
 * in it, `1` under maximum 150 may go on to `15` but not `16`), the
 * number ends only in it.
 *
 * Alternatives (alt; JSON Schema's anyOf): a node may name an earlier
 * node tried when a value cannot start on it with the byte; the nodes
 * of a chain start on disjoint first bytes (an object '{', an array
 * '[', a string '"', a number '-' or a digit, true, false, null:
 * jgram_node_firsts), so the first byte picks one branch and the value
 * follows it alone. jgram_seal refuses overlapping chains.
 *
 * A tagged union (is_union; a tool call's shape): an object whose first
 * key is forced to be the literal `tag` (e.g. "name"), whose value is one
 * of the node's literals (compact JSON strings, e.g. "get_weather"); the
 * literal chosen names, in its `node`, the object node (its variant) that
 * the rest of the object follows: its properties after a `,`, its
 * required ones before `}`. So the name comes first and decides the
 * schema of what follows it.
 *
 * A wrap (jgram_wrap; a chat format's call syntax): the output is
 * `pre VALUE post`, repeated 1 to max_rep times, with at most
 * JGRAM_WS_MAX whitespace bytes before and after each VALUE and between
 * repetitions; pre and post are matched byte for byte (e.g. Hermes'
 * "<tool_call>" and "</tool_call>"). Complete only after a whole post.
 *
 * A lead (jgram_lead; Mistral's [TOOL_CALLS]): the output opens with one
 * control token, given by its text and resolved to its id in the run's
 * vocabulary; the mask allows it alone until it is drawn, then the rest
 * of the grammar follows. It feeds no bytes (control tokens decode to
 * none), and a run fed bytes only has none.
 *
 * A lazy grammar (jgram_lazy; tool_choice "auto", where the answer may
 * be text): the run starts FREE - every token allowed, as without a
 * grammar - and the grammar takes over at a trigger:
 *   JGRAM_LAZY_PRE    the wrap's pre, anywhere in the output (Hermes'
 *                     "<tool_call>"): from the byte right after it the
 *                     output is the wrap's (the value, post, further
 *                     repetitions up to max_rep, whitespace, EOS) and
 *                     nothing else - no text after the calls;
 *   JGRAM_LAZY_START  the output's first non-whitespace byte, when the
 *                     grammar accepts it (Llama 3.1's bare call object:
 *                     `{`); any other first byte makes the whole output
 *                     free text;
 *   JGRAM_LAZY_LEAD   the lead token (Mistral's [TOOL_CALLS]), when it
 *                     is drawn: until then every token is allowed and
 *                     no byte is fed; from it the grammar holds.
 * A token that straddles the trigger (text, the trigger, bytes after
 * it) is allowed only when the grammar takes the bytes after it; a
 * trigger split over tokens is matched across them (KMP over pre: the
 * run keeps how much of it is pending). Cost: with nothing of the
 * trigger pending the free mask touches only the tokens whose piece
 * holds the whole trigger (a list built once per vocabulary and
 * trigger) - near zero; with a part pending, and before the first byte
 * under LAZY_START, it walks only the trie's prefixes that go on
 * matching (or that the grammar took), not the whole trie.
 * Control tokens (no text) and EOS are allowed in free text; EOS once
 * the grammar has taken over only when complete, as always.
 *
 * No dead ends: from every state the recognizer reaches, some byte is
 * accepted, or the value is complete (jgram_run_complete): `,` is
 * refused when no property is left, `]` before min_items, a value past
 * max_items, a container at the depth bound; jgram_seal refuses a tree
 * that cannot fit the depth or whose node has nothing to accept. With a
 * vocabulary that has every byte as a token (SentencePiece byte
 * fallback, byte-level BPE: jgram_vocab_bytes_covered) the mask is
 * therefore never empty. Where it still is (a vocabulary without byte
 * tokens), jgram_run_mask returns 0 and the caller ends the request
 * (the engine: as if EOS was drawn).
 *
 * Errors: 0, a negative errno, or JGRAM_E_INVALID (a node tree or a
 * literal the grammar cannot hold; the message names it).
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpu/text/tokenizer.h"

#define JGRAM_E_INVALID 1

#define JGRAM_DEPTH_MAX 16u      /* containers nested */
#define JGRAM_WS_MAX 8u          /* whitespace bytes in a row */
#define JGRAM_NUM_INT_MAX 18u    /* a number's digits before '.' (int64) */
#define JGRAM_NUM_FRAC_MAX 17u   /* after it (a double's precision) */
#define JGRAM_NUM_EXP_MAX 2u     /* in its exponent (no overflow) */
#define JGRAM_NODES_MAX 512u     /* schema nodes, ANY included */
#define JGRAM_LITS_MAX 64u       /* enum values or properties of one node */
#define JGRAM_LIT_BYTES_MAX 32768u /* all literals' bytes together */
#define JGRAM_ITEMS_MAX 4096u    /* min_items / max_items */
#define JGRAM_PIECE_MAX 64u      /* longer token pieces are never allowed */
#define JGRAM_ANY 0u             /* node 0 */
#define JGRAM_WRAP_MAX 64u       /* bytes of a wrap's pre or post text */
#define JGRAM_REPS_MAX 64u       /* a wrap's repetitions */
#define JGRAM_LEN_MAX 65536u     /* a string's minLength / maxLength */
#define JGRAM_STRS_MAX 256u      /* string checks (jgram_str_add) */
#define JGRAM_RANGES_MAX 256u    /* number ranges (jgram_range_add) */
#define JGRAM_RANGE_ABS 999999999999999999LL  /* |bound| (18 digits) */
#define JGRAM_EXCL_ABS 9007199254740992LL   /* |exclusive bound| of a real (2^53) */

enum jgram_type {
	JGRAM_T_OBJECT = 1 << 0,
	JGRAM_T_ARRAY = 1 << 1,
	JGRAM_T_STRING = 1 << 2,
	JGRAM_T_NUMBER = 1 << 3,
	JGRAM_T_INTEGER = 1 << 4,
	JGRAM_T_BOOLEAN = 1 << 5,
	JGRAM_T_NULL = 1 << 6,
	JGRAM_T_ALL = (1 << 7) - 1,
};

/* A schema node. Literals [lit, lit + n_lit) are its enum values, or for
 * an object its property names (JSON strings, quotes included) with
 * each property's value node in the literal's `node`. */
struct jgram_node {
	uint16_t types;           /* JGRAM_T_* (ignored when is_enum) */
	uint16_t items;           /* array: its items' node */
	uint32_t lit, n_lit;
	bool is_enum;             /* literals are the only values */
	bool is_union;            /* a tagged union (above): literals are the
				   * tag's values, each literal's node its
				   * variant (an object node) */
	uint32_t tag;             /* union: the tag key's literal ("\"name\"") */
	bool free_keys;           /* object: any key, values ANY (no literals) */
	uint32_t min_items, max_items;
	uint64_t required;        /* object: bit i = literal lit + i */
	uint16_t alt;             /* anyOf: the node tried when this one
				   * cannot start with the byte (0: none;
				   * an earlier node; first bytes disjoint,
				   * jgram_node_firsts) */
	uint16_t str;             /* string: its checks (jgram_str_add), 0 none */
	uint16_t range;           /* number, integer: its range (jgram_range_add),
				   * 0 none */
};

struct jgram_lit {
	uint32_t off, len;        /* in the grammar's byte pool */
	uint16_t node;            /* a property's value node */
};

struct jgram;
struct jgram_vocab;
struct jgram_run;

/* ---- building a grammar ---------------------------------------------------- */

/* A grammar with only node 0 (ANY) and that as its root. */
int jgram_new(struct jgram **out);
/* response_format json_object: the root is an object with any keys. */
int jgram_new_object(struct jgram **out);
/* One more holder of g (a sealed grammar another run will read): each
 * holder calls jgram_free once; the last frees it. Any thread. */
struct jgram *jgram_ref(struct jgram *g);
/* Drops the caller's hold (NULL: nothing); frees g with the last. */
void jgram_free(struct jgram *g);
/* Append a node (zeroed; max_items = JGRAM_ITEMS_MAX); *id its index.
 * JGRAM_E_INVALID past JGRAM_NODES_MAX. The pointer is valid until the
 * next add. */
int jgram_node_add(struct jgram *g, uint16_t *id, struct jgram_node **node);
struct jgram_node *jgram_node(struct jgram *g, uint16_t id);
/* Append a literal (a compact JSON scalar text); *idx its index.
 * JGRAM_E_INVALID past JGRAM_LIT_BYTES_MAX. */
int jgram_lit_add(struct jgram *g, const char *text, size_t len,
		  uint16_t node, uint32_t *idx);
/* String checks for a node's str: min_len..max_len code points
 * (max_len UINT32_MAX: none; else <= JGRAM_LEN_MAX) and, when pattern
 * is not NULL, a regular expression (gpu/text/jsonpat.h's subset) the
 * string must match; *idx (>= 1) for jgram_node.str. JGRAM_E_INVALID
 * with msg filled: bad lengths, a pattern outside the subset, no string
 * of the lengths matching, past JGRAM_STRS_MAX. */
int jgram_str_add(struct jgram *g, uint32_t min_len, uint32_t max_len,
		  const char *pattern, size_t pattern_len, uint16_t *idx,
		  char *msg, size_t msg_len);
/* A range for a node's numbers: lo <= x (lo < x when lo_excl) and
 * x <= hi (x < hi when hi_excl); integer bounds of at most
 * JGRAM_RANGE_ABS; *idx (>= 1) for jgram_node.range. A real x (not
 * integer) is compared as a double parser reads it (rounding to
 * nearest): 0.99999999999999999 is refused under an exclusive 1, which
 * it reads as 1; so an exclusive bound of a real is at most
 * JGRAM_EXCL_ABS in size (a double holds it exactly). JGRAM_E_INVALID:
 * out of bounds, empty (for integers: no integer in it), past
 * JGRAM_RANGES_MAX. */
int jgram_range_add(struct jgram *g, int64_t lo, bool lo_excl, int64_t hi, bool hi_excl,
		    bool integer, uint16_t *idx);
/* Wrap the root value in pre and post (at most JGRAM_WRAP_MAX bytes
 * each; post not empty; pre not empty when max_rep > 1), repeated 1 to
 * max_rep (<= JGRAM_REPS_MAX) times. Before jgram_lazy and jgram_seal;
 * JGRAM_E_INVALID otherwise. */
int jgram_wrap(struct jgram *g, const char *pre, size_t pre_len,
	       const char *post, size_t post_len, uint32_t max_rep);
/* The output opens with the control token whose text is text[0, len)
 * (at most JGRAM_WRAP_MAX bytes), before any wrap. Before jgram_seal
 * and jgram_lazy; JGRAM_E_INVALID otherwise. */
int jgram_lead(struct jgram *g, const char *text, size_t len);
enum jgram_lazy {
	JGRAM_LAZY_NONE = 0,     /* the grammar holds from the first byte */
	JGRAM_LAZY_PRE,          /* from after the wrap's pre, found anywhere */
	JGRAM_LAZY_START,        /* from the first non-whitespace byte, if
				  * the grammar takes it */
	JGRAM_LAZY_LEAD,         /* from the lead token, when it is drawn
				  * (Mistral's [TOOL_CALLS]; a lead, no pre) */
};
/* Make g lazy (above). After jgram_wrap, before jgram_seal; LAZY_PRE
 * needs a wrap with a pre and no lead, LAZY_START no lead, LAZY_LEAD a
 * lead and no pre. JGRAM_E_INVALID otherwise. */
int jgram_lazy(struct jgram *g, enum jgram_lazy how);
/* Check the tree from root (nodes may refer only to nodes added before
 * them, or to ANY) and freeze it: JGRAM_E_INVALID with msg filled. */
int jgram_seal(struct jgram *g, uint16_t root, char *msg, size_t msg_len);
uint32_t jgram_n_nodes(const struct jgram *g);
/* The kinds of value node id and its alternatives (alt) may start as:
 * JGRAM_T_* bits by first byte, integer counted as number (both start
 * with '-' or a digit), enum literals by their own first bytes. */
unsigned jgram_node_firsts(const struct jgram *g, uint16_t id);

/* ---- a model's vocabulary -------------------------------------------------- */

/* Tokens of type normal, user-defined, byte (or undefined) with a
 * non-empty piece of at most JGRAM_PIECE_MAX bytes; control, unknown
 * and unused tokens, BOS and EOS are never in the trie. */
int jgram_vocab_new(struct jgram_vocab **out, const struct tokenizer *t);
void jgram_vocab_free(struct jgram_vocab *v);
/* Every byte value is a token alone (the mask is then never empty). */
bool jgram_vocab_bytes_covered(const struct jgram_vocab *v);
uint32_t jgram_vocab_n_vocab(const struct jgram_vocab *v);

/* ---- one request ----------------------------------------------------------- */

/* g (sealed) and v must outlive the run. v may be NULL for a run fed
 * bytes only (jgram_run_feed; no mask, no tokens, no lead). -ENOENT
 * when g has a lead that is not one control token of v's tokenizer. */
int jgram_run_new(struct jgram_run **out, const struct jgram *g,
		  const struct jgram_vocab *v);
void jgram_run_free(struct jgram_run *r);
/* Feed bytes (not tokens): true when all were accepted; on false the
 * state is unchanged. */
bool jgram_run_feed(struct jgram_run *r, const char *bytes, size_t len);
/* The value is complete: EOS (or trailing whitespace) may come now. */
bool jgram_run_complete(const struct jgram_run *r);
/* True when byte c would be accepted now. */
bool jgram_run_can(const struct jgram_run *r, uint8_t c);
/* Set the logits (n_vocab) of the tokens that may not come next to
 * -INFINITY: a token is allowed when the recognizer accepts every byte
 * of its piece; EOS only when complete. Returns how many are allowed
 * (0: none, see above). The engine's constraint callback. */
uint32_t jgram_run_mask(void *run, float *logits, uint32_t n_vocab);
/* The token chosen: its piece is fed (EOS feeds nothing). false when
 * it was not allowed (the state is then unchanged). */
bool jgram_run_accept(void *run, int32_t token);
/* The allowed set as a bitmap of (n_vocab + 63) / 64 words, as the last
 * jgram_run_mask computed it (for tests). */
const uint64_t *jgram_run_allowed(const struct jgram_run *r);
/* A lazy run still in free text (every byte accepted). */
bool jgram_run_free_text(const struct jgram_run *r);
/* A lazy run whose trigger came: the grammar holds the rest. A
 * JGRAM_LAZY_LEAD run made without a vocabulary has no lead (its bytes
 * are those after it, above): triggered from the start. */
bool jgram_run_triggered(const struct jgram_run *r);
