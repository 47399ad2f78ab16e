/* jsonpat.h - a JSON Schema `pattern` (an ECMA-262 regular expression)
 * as a small automaton over a string's characters, for jsongram's
 * strings (jsongram.h).
 *
 * The subset: literal characters (printable ASCII) and escaped ones
 * (\. \\ \/ \- \[ ... and \t \n \r \f \v \xHH \uHHHH of ASCII); the
 * classes . \d \w \s \D \W \S and bracket classes [a-z0-9_] and [^...]
 * (ranges, the escapes above inside); groups ( ) and (?: ); alternation
 * |; the quantifiers ? * + {m} {m,} {m,n} (m, n <= JPAT_REP_MAX; a lazy
 * `?` after one changes nothing a search accepts); ^ as the first
 * character and $ as the last (a search otherwise: anything may come
 * before and after the match; with a top-level | the anchors are
 * refused: write ^(a|b)$). Everything else (backreferences, lookaround,
 * \b, named groups, \p{..}, a raw '{' or non-ASCII in the pattern) is
 * refused: JPAT_E_INVALID with a message, as is a pattern whose
 * expansion parses more than JPAT_ATOMS_MAX atoms (copies included: a
 * bound on a compile's time, which the 63 positions alone are not).
 *
 * Characters. The automaton reads symbols: an ASCII code (0..127) or
 * JPAT_OTHER, any non-ASCII code point. Only what both ECMA-262 and
 * Python's re agree on is generated: `.` and \D \W \S match ASCII only
 * (no line terminator), a negated bracket class also matches non-ASCII
 * unless it holds one of \d \w \s \D \W \S. Control characters a JSON
 * string can only write as \u escapes (all but \b \t \n \f \r) match
 * nothing: the grammar forbids \u in a patterned string.
 *
 * The automaton is Glushkov's: one position per character class in the
 * pattern (a counted repetition is expanded into copies; an empty group
 * is not copied: it matches only ""), position 0
 * the start; a state is a set of positions (a uint64_t bitset, so at
 * most JPAT_POS_MAX positions). reach[L] holds the positions from which
 * the pattern can end after exactly L more symbols; the sequence is
 * periodic after `pre` entries with period `period` (pre + period <=
 * JPAT_REACH_MAX), and kept as a sparse table of ORs (reach_or: the
 * ORs of every run of 2^j entries, at most 9 x 256 words), so whether
 * a state can end within any length window is at most three runs of
 * two lookups each (jpat_can_end), whatever the window: this is how
 * jsongram combines a pattern with minLength/maxLength and keeps every
 * accepted prefix completable.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define JPAT_E_INVALID 1
#define JPAT_POS_MAX 64u      /* positions, the start included */
#define JPAT_REP_MAX 64u      /* m and n of {m,n} */
#define JPAT_REACH_MAX 256u   /* reach[] entries (pre + period) */
#define JPAT_BYTES_MAX 1024u  /* a pattern's length */
#define JPAT_ATOMS_MAX (64u * JPAT_BYTES_MAX) /* atoms parsed, copies included */
#define JPAT_OTHER 128u       /* the symbol of any non-ASCII code point */
#define JPAT_SYMS 129u

struct jpat {
	uint32_t n;                      /* positions, 0 the start */
	uint64_t follow[JPAT_POS_MAX];   /* may come after position i */
	uint64_t match[JPAT_SYMS];       /* positions whose class holds the symbol */
	uint64_t final;                  /* positions the pattern may end at */
	uint32_t pre, period, levels;
	uint64_t *reach_or;              /* (levels x (pre + period)) [j][k]:
					  * the positions of reach[k] ..
					  * reach[k + 2^j - 1]; [0] is reach */
};

/* Compile re (len bytes); msg says why on JPAT_E_INVALID; -ENOMEM. */
int jpat_compile(struct jpat *p, const char *re, size_t len, char *msg, size_t msg_len);
void jpat_free(struct jpat *p);
/* The state after symbol sym. */
uint64_t jpat_step(const struct jpat *p, uint64_t set, unsigned sym);
/* Some L in [lo, hi] symbols more can end the pattern from set. */
bool jpat_can_end(const struct jpat *p, uint64_t set, uint32_t lo, uint32_t hi);
