/* tokenizer.h - text <-> token ids, built from a GGUF file's metadata.
 *
 * Two vocabulary kinds, chosen by tokenizer.ggml.model:
 *   "llama"  SentencePiece-style: pieces with scores, a dummy-prefix
 *            space, U+2581 for spaces, score-driven merging, byte
 *            fallback to <0xNN> tokens (Llama 2, TinyLlama, stories).
 *   "gpt2"   byte-level BPE: tokenizer.ggml.merges ranks, bytes mapped to
 *            printable chars, a pre-tokenizer split approximating the
 *            GPT-2 or Llama-3 regex (tokenizer.ggml.pre) (SmolLM, Llama 3).
 *
 * Special tokens written as text in a prompt ("<s>", "<|eot_id|>") are
 * NOT parsed as specials unless the caller asks (TOKENIZER_PARSE_SPECIAL,
 * for chat templates the operator writes): by default they are ordinary
 * text, so a tenant cannot forge control tokens through the prompt.
 * User-defined tokens (MPT's runs of spaces, added words) are always
 * matched in the text first, longest first, as llama.cpp does.
 *
 * A struct tokenizer copies everything it needs out of the gguf_file; it
 * may outlive it. It is immutable after tokenizer_new(): any thread may
 * encode and decode concurrently. A struct detok (incremental decoder)
 * belongs to one request/thread.
 *
 * Errors: tokenizer_new() returns GGUF_E_* (MISSING, TYPE, MALFORMED,
 * UNSUPPORTED) with err naming the key and offset, or a negative errno.
 * Encode/decode return 0 or a negative errno (-ENOMEM, -ERANGE for a
 * token id outside the vocabulary).
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpu/gguf/gguf.h"

enum tokenizer_kind {
	TOKENIZER_SPM = 0,   /* tokenizer.ggml.model = llama */
	TOKENIZER_BPE = 1,   /* tokenizer.ggml.model = gpt2 */
};

/* llama.cpp token types (tokenizer.ggml.token_type). */
enum tokenizer_type {
	TOKEN_TYPE_UNDEFINED = 0,
	TOKEN_TYPE_NORMAL = 1,
	TOKEN_TYPE_UNKNOWN = 2,
	TOKEN_TYPE_CONTROL = 3,
	TOKEN_TYPE_USER_DEFINED = 4,
	TOKEN_TYPE_UNUSED = 5,
	TOKEN_TYPE_BYTE = 6,
};

struct tokenizer;

int tokenizer_new(struct tokenizer **out, const struct gguf_file *f,
		  struct gguf_error *err);
void tokenizer_free(struct tokenizer *t);

enum tokenizer_kind tokenizer_kind(const struct tokenizer *t);
uint32_t tokenizer_n_vocab(const struct tokenizer *t);
/* Special ids; -1 when the vocabulary has none. */
int32_t tokenizer_bos(const struct tokenizer *t);
int32_t tokenizer_eos(const struct tokenizer *t);
int32_t tokenizer_unk(const struct tokenizer *t);
/* tokenizer.ggml.add_bos_token (default: true for llama, false for gpt2). */
bool tokenizer_add_bos(const struct tokenizer *t);
/* The token's type (TOKEN_TYPE_*), TOKEN_TYPE_UNDEFINED when out of range. */
enum tokenizer_type tokenizer_token_type(const struct tokenizer *t, int32_t id);
/* The vocabulary entry as stored ("▁the", "<0x0A>", "Ġthe"). */
int tokenizer_token_text(const struct tokenizer *t, int32_t id,
			 const char **ptr, size_t *len);

/* Encode len bytes of text (any bytes; invalid UTF-8 falls back to byte
 * tokens). BOS is prepended when add_bos and the vocabulary has one.
 * *ids is malloc'd (the caller frees it), *n_ids its length. */
int tokenizer_encode(const struct tokenizer *t, const char *text, size_t len,
		     bool add_bos, int32_t **ids, size_t *n_ids);

enum tokenizer_flags {
	TOKENIZER_ADD_BOS = 1 << 0,
	TOKENIZER_PARSE_SPECIAL = 1 << 1, /* control/unknown tokens in text */
};
/* tokenizer_encode with TOKENIZER_* flags. */
int tokenizer_encode_ex(const struct tokenizer *t, const char *text, size_t len,
			unsigned flags, int32_t **ids, size_t *n_ids);

/* The bytes a token stands for when decoded: "▁the" -> " the", "<0x0A>"
 * -> "\n", "Ġthe" -> " the", control tokens -> "". The bytes may be part
 * of a UTF-8 character (byte tokens); use struct detok for a stream. 0 or
 * -ERANGE. */
int tokenizer_piece(const struct tokenizer *t, int32_t id, const char **ptr,
		    size_t *len);
/* Decode a whole sequence into a malloc'd NUL-terminated string (invalid
 * UTF-8 replaced by U+FFFD, SentencePiece's leading space after BOS
 * removed). */
int tokenizer_decode(const struct tokenizer *t, const int32_t *ids, size_t n,
		     char **text, size_t *len);

/* ---- incremental decoding ---------------------------------------------- */

/* Takes ids one at a time and hands back text chunks that always end on a
 * UTF-8 character boundary: an incomplete character is held until its
 * last byte arrives; bytes that can never form a valid character come out
 * as U+FFFD. The first piece after BOS loses its leading space
 * (SentencePiece's dummy prefix); a stream that starts without BOS (a
 * continuation) keeps it. */
struct detok {
	const struct tokenizer *tok;
	uint8_t pend[4];      /* (n_pend) bytes of an incomplete character */
	uint32_t n_pend;
	bool after_bos;       /* the next piece drops its leading space */
	char *out;            /* (cap) chunk buffer, valid until the next call */
	size_t cap;
};

int detok_init(struct detok *d, const struct tokenizer *t);
void detok_deinit(struct detok *d); /* safe twice */
/* Push one id; *chunk / *len is the text now complete (may be empty).
 * 0, or -ERANGE for an id outside the vocabulary (state unchanged). */
int detok_push(struct detok *d, int32_t id, const char **chunk, size_t *len);
/* End of stream: held bytes come out as U+FFFD. */
int detok_flush(struct detok *d, const char **chunk, size_t *len);

/* UTF-8 helper shared with tests: true when buf[0..len) is valid UTF-8
 * (no overlongs, surrogates or code points above U+10FFFF). */
bool tokenizer_utf8_valid(const char *buf, size_t len);
