/* detok.c - incremental decoding (struct detok) and tokenizer_decode.
 *
 * Every token's decoded bytes (its piece) were computed at load, so
 * decoding is a table lookup; what is left is UTF-8. struct detok runs a
 * strict UTF-8 state machine over the pieces' bytes: complete characters
 * are emitted, an incomplete tail is held for the next token, impossible
 * bytes become U+FFFD. So a stream chunk never ends inside a character
 * and never carries invalid UTF-8. tokenizer_decode is one detok run over
 * the whole sequence.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/text/tokenizer.h"
#include "gpu/text/tokenizer_int.h"

#define UTF8_REPLACEMENT "\xef\xbf\xbd"

int detok_init(struct detok *d, const struct tokenizer *t)
{
	*d = (struct detok){ .tok = t };
	/* Worst case per push: every byte of the piece and the held bytes
	 * becomes a 3-byte U+FFFD. */
	d->cap = 3 * (t->max_piece + 4) + 4;
	d->out = malloc(d->cap);
	return d->out ? 0 : -ENOMEM;
}

void detok_deinit(struct detok *d)
{
	free(d->out);
	d->out = NULL;
	d->cap = 0;
}

/* Bytes a lead byte needs, 0 when it can never start a character. */
static uint32_t utf8_need(uint8_t c)
{
	if (c >= 0xc2 && c <= 0xdf)
		return 2;
	if (c >= 0xe0 && c <= 0xef)
		return 3;
	if (c >= 0xf0 && c <= 0xf4)
		return 4;
	return 0;
}

/* Can byte c follow the held bytes? (second-byte limits exclude overlongs,
 * surrogates and code points above U+10FFFF) */
static bool utf8_cont_ok(const uint8_t *pend, uint32_t n_pend, uint8_t c)
{
	uint8_t lo = 0x80, hi = 0xbf;

	if (n_pend == 1) {
		switch (pend[0]) {
		case 0xe0: lo = 0xa0; break;
		case 0xed: hi = 0x9f; break;
		case 0xf0: lo = 0x90; break;
		case 0xf4: hi = 0x8f; break;
		}
	}
	return c >= lo && c <= hi;
}

static size_t detok_byte(struct detok *d, uint8_t c, char *o)
{
	size_t n = 0;

	if (d->n_pend) {
		if (utf8_cont_ok(d->pend, d->n_pend, c)) {
			d->pend[d->n_pend++] = c;
			if (d->n_pend == utf8_need(d->pend[0])) {
				memcpy(o, d->pend, d->n_pend);
				n = d->n_pend;
				d->n_pend = 0;
			}
			return n;
		}
		/* The held sequence can never complete. */
		memcpy(o, UTF8_REPLACEMENT, 3);
		n = 3;
		d->n_pend = 0;
	}
	if (c < 0x80) {
		o[n++] = (char)c;
	} else if (utf8_need(c)) {
		d->pend[0] = c;
		d->n_pend = 1;
	} else {
		memcpy(o + n, UTF8_REPLACEMENT, 3);
		n += 3;
	}
	return n;
}

int detok_push(struct detok *d, int32_t id, const char **chunk, size_t *len)
{
	const struct tokenizer *t = d->tok;
	const char *p;
	size_t n, o = 0;

	if (tokenizer_piece(t, id, &p, &n))
		return -ERANGE;
	if (id == t->bos) {
		d->after_bos = t->kind == TOKENIZER_SPM && t->add_space_prefix;
	} else if (n) {
		if (d->after_bos && p[0] == ' ') {
			p++;
			n--;
		}
		d->after_bos = false;
	}
	for (size_t i = 0; i < n; i++)
		o += detok_byte(d, (uint8_t)p[i], d->out + o);
	*chunk = d->out;
	*len = o;
	return 0;
}

int detok_flush(struct detok *d, const char **chunk, size_t *len)
{
	size_t o = 0;

	if (d->n_pend) {
		memcpy(d->out, UTF8_REPLACEMENT, 3);
		o = 3;
		d->n_pend = 0;
	}
	*chunk = d->out;
	*len = o;
	return 0;
}

int tokenizer_decode(const struct tokenizer *t, const int32_t *ids, size_t n,
		     char **text, size_t *len)
{
	struct detok d;
	char *buf = NULL;
	size_t used = 0, cap = 0;
	const char *c;
	size_t cl;
	int rc = detok_init(&d, t);

	for (size_t i = 0; i <= n && !rc; i++) {
		rc = i < n ? detok_push(&d, ids[i], &c, &cl) : detok_flush(&d, &c, &cl);
		if (rc)
			break;
		if (used + cl + 1 > cap) {
			size_t nc = cap ? cap : 256;
			while (nc < used + cl + 1)
				nc *= 2;
			char *nb = realloc(buf, nc);
			if (!nb) {
				rc = -ENOMEM;
				break;
			}
			buf = nb;
			cap = nc;
		}
		memcpy(buf + used, c, cl);
		used += cl;
	}
	detok_deinit(&d);
	if (rc) {
		free(buf);
		return rc;
	}
	if (!buf && !(buf = malloc(1)))
		return -ENOMEM;
	buf[used] = '\0';
	*text = buf;
	*len = used;
	return 0;
}
