/* tokenizer_int.h - what the tokenizer's files share; not for other modules.
 *
 * tokenizer.c       vocabulary load, the public getters, tokenizer_encode
 * tokenizer_merge.c the pair-merge engine both encoders run
 * tokenizer_spm.c   SentencePiece encode (score-driven merges)
 * tokenizer_bpe.c   byte-level BPE encode (pre-tokenizer, rank merges)
 * detok.c           incremental decoding and tokenizer_decode
 *
 * A struct tokenizer is immutable after tokenizer_new(); everything here
 * that takes a const tokenizer may run on any thread. A struct merger and
 * a struct ids belong to one encode call.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpu/tokenizer.h"

#define SP_SPACE "\xe2\x96\x81" /* U+2581 LOWER ONE EIGHTH BLOCK */

/* BPE pre-tokenizer flavour (tokenizer.ggml.pre). */
enum pre_kind { PRE_GPT2 = 0, PRE_LLAMA3, PRE_SMOLLM };

struct tstr {
	uint32_t off;  /* into the arena */
	uint32_t len;
};

struct strmap {
	uint32_t *slot;   /* (mask + 1) index + 1; 0 = empty */
	uint32_t mask;
};

struct tokenizer {
	enum tokenizer_kind kind;
	enum pre_kind pre;
	uint32_t n_vocab;
	char *arena;           /* token texts, merge texts, pieces */
	size_t arena_len, arena_cap;
	struct tstr *text;     /* (n_vocab) vocabulary entries */
	struct tstr *piece;    /* (n_vocab) decoded bytes */
	float *score;          /* (n_vocab) SentencePiece scores */
	uint8_t *type;         /* (n_vocab) TOKEN_TYPE_* */
	struct strmap vmap;    /* text -> id */
	uint32_t n_merges;
	struct tstr *merge;    /* (n_merges) "left right" */
	struct strmap mmap;    /* merge text -> rank */
	int32_t byte_tok[256]; /* SPM byte fallback: id of <0xNN>, or -1 */
	int32_t bos, eos, unk;
	bool add_bos;
	bool add_space_prefix;
	size_t max_piece;
};

/* ---- lookups and UTF-8 (tokenizer.c) ------------------------------------- */

/* The slot holding key (p, n), or the empty slot where it would go. */
uint32_t *tokenizer__strmap_slot(const struct strmap *m, const char *arena,
				 const struct tstr *keys, const char *p,
				 size_t n);
/* The id of vocabulary entry p[0..n), or -1. */
int32_t tokenizer__vocab_find(const struct tokenizer *t, const char *p,
			      size_t n);

/* Length of the UTF-8 sequence a lead byte announces (1 for anything
 * that is not a lead byte), as llama.cpp splits text into symbols. */
static inline size_t tokenizer__utf8_len(uint8_t c)
{
	static const uint8_t lens[16] = { 1, 1, 1, 1, 1, 1, 1, 1,
					  1, 1, 1, 1, 2, 2, 3, 4 };
	return lens[c >> 4];
}

/* Strict decode of one code point at s[0..n), n >= 1: returns its length
 * and the code point, or length 1 and UINT32_MAX for an invalid sequence. */
size_t tokenizer__utf8_decode(const uint8_t *s, size_t n, uint32_t *cp);

/* GPT-2's byte -> code point map (printable Latin-1 bytes stand for
 * themselves, the other 68 for U+0100.. in byte order). */
void tokenizer__gpt2_byte_map(uint32_t cp_of[256]);

/* ---- encoder output (tokenizer.c) ---------------------------------------- */

struct ids {
	int32_t *v;     /* (cap) malloc'd; the caller frees it */
	size_t n, cap;
};

int tokenizer__ids_push(struct ids *o, int32_t id);

/* ---- merge engine (tokenizer_merge.c) ------------------------------------ */

struct sym {
	int32_t prev, next;   /* neighbours in the list, -1 at the ends */
	uint32_t off;         /* into the symbol text */
	uint32_t n;           /* bytes; 0 once merged into its left neighbour */
};

struct pair {
	double prio;          /* higher first: SPM score, or -BPE rank */
	int32_t left, right;
	uint32_t size;        /* left.n + right.n when pushed */
};

struct heap {
	struct pair *v;       /* (cap) binary max-heap on (prio, -left) */
	size_t n, cap;
};

struct merger;

/* What differs between the two vocabularies: which pairs may merge, and
 * what a final symbol the vocabulary lacks becomes. */
struct merger_ops {
	/* 1 with *prio (higher merges first) when a and b may merge, 0 when
	 * they may not, or a negative errno. */
	int (*prio)(struct merger *m, const struct sym *a, const struct sym *b,
		    double *prio);
	/* Push the ids standing for symbol y, which is not in the
	 * vocabulary. 0 or a negative errno. */
	int (*fallback)(struct merger *m, const struct sym *y, struct ids *out);
};

/* One merge session over a symbol text (normalized prompt, or one mapped
 * BPE word). Zero it, set t and ops, then split/run/emit per text. */
struct merger {
	const struct tokenizer *t;
	const struct merger_ops *ops;
	const char *s;        /* symbol text */
	struct sym *sym;      /* (n_sym) */
	size_t n_sym, cap_sym;
	struct heap heap;
	char *key;            /* (key_cap) BPE "left right" scratch */
	size_t key_cap;
};

void tokenizer__merger_deinit(struct merger *m);
/* Split s[0..n) into one symbol per UTF-8 character, merge the best pair
 * until none can merge, and append the final symbols' ids to out. The
 * session's buffers are reused by the next call. 0 or a negative errno. */
int tokenizer__merger_encode(struct merger *m, const char *s, size_t n,
			     struct ids *out);

/* ---- encoders (tokenizer_spm.c, tokenizer_bpe.c) ------------------------- */

/* Append the ids of text[0..len) to out; 0 or a negative errno. */
int tokenizer__spm_encode(const struct tokenizer *t, const char *text,
			  size_t len, struct ids *out);
int tokenizer__bpe_encode(const struct tokenizer *t, const char *text,
			  size_t len, struct ids *out);
