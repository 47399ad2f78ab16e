/* tokenizer_spm.c - SentencePiece encode (tokenizer.ggml.model = llama).
 *
 * The llama.cpp / llama2.c approach. The text gets the dummy-prefix
 * space, spaces become U+2581, and the merge engine (tokenizer_merge.c)
 * merges the pair whose concatenation is the vocabulary entry with the
 * best score, leftmost first. Symbols that are not in the vocabulary at
 * the end fall back to <0xNN> byte tokens (or <unk>).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "conf/util.h"
#include "gpu/text/tokenizer_int.h"

/* A pair may merge when its concatenation is a vocabulary entry; the
 * higher the entry's score, the sooner. */
static int spm_prio(struct merger *m, const struct sym *a, const struct sym *b,
		    double *prio)
{
	const struct tokenizer *t = m->t;
	int32_t id = tokenizer__vocab_find(t, m->s + a->off, a->n + b->n);

	if (id < 0)
		return 0;
	*prio = t->score[id];
	return 1;
}

/* Byte fallback: each byte's <0xNN> token (or the raw byte, or unk). */
static int spm_fallback(struct merger *m, const struct sym *y, struct ids *out)
{
	const struct tokenizer *t = m->t;
	int rc;

	for (uint32_t k = 0; k < y->n; k++) {
		int32_t bt = t->byte_tok[(uint8_t)m->s[y->off + k]];
		if (bt >= 0 && (rc = tokenizer__ids_push(out, bt)))
			return rc;
	}
	return 0;
}

static const struct merger_ops spm_ops = { .prio = spm_prio,
					   .fallback = spm_fallback };

int tokenizer__spm_encode(const struct tokenizer *t, const char *text,
			  size_t len, bool prefix, struct ids *out)
{
	struct merger m = { .t = t, .ops = &spm_ops };
	_cleanup_free_ char *norm = NULL; /* (3 * len + 3) escaped text */
	size_t n = 0;
	int rc;

	if (!len)
		return 0;
	norm = malloc(3 * len + 3);
	if (!norm)
		return -ENOMEM;
	if (prefix && t->add_space_prefix) {
		memcpy(norm, SP_SPACE, 3);
		n = 3;
	}
	for (size_t i = 0; i < len; i++) {
		if (text[i] == ' ') {
			memcpy(norm + n, SP_SPACE, 3);
			n += 3;
		} else {
			norm[n++] = text[i];
		}
	}
	rc = tokenizer__merger_encode(&m, norm, n, out);
	tokenizer__merger_deinit(&m);
	return rc;
}
