/* tokenizer_merge.c - the pair-merge engine of both encoders.
 *
 * The text is split into UTF-8 characters, each a symbol in a doubly
 * linked list. Every adjacent pair that may merge (ops->prio: a
 * vocabulary entry for SentencePiece, a merge rule for BPE) goes into a
 * max-heap keyed by (priority, then leftmost). Popping the best pair
 * merges it if both sides are still what they were when the pair was
 * pushed (their lengths still add up), then the new symbol's pairs with
 * its neighbours are pushed. That is O(n log n) in the text length.
 * Symbols that are not in the vocabulary at the end are handed to
 * ops->fallback.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "conf/util.h"
#include "gpu/text/tokenizer_int.h"

static bool pair_before(const struct pair *a, const struct pair *b)
{
	return a->prio > b->prio || (a->prio == b->prio && a->left < b->left);
}

static int heap_push(struct heap *h, struct pair p)
{
	if (h->n == h->cap) {
		size_t cap = h->cap ? h->cap * 2 : 64;
		struct pair *v = realloc(h->v, cap * sizeof(*v));
		if (!v)
			return -ENOMEM;
		h->v = v;
		h->cap = cap;
	}
	size_t i = h->n++;
	while (i > 0) {
		size_t up = (i - 1) / 2;
		if (!pair_before(&p, &h->v[up]))
			break;
		h->v[i] = h->v[up];
		i = up;
	}
	h->v[i] = p;
	return 0;
}

static struct pair heap_pop(struct heap *h)
{
	struct pair top = h->v[0], last = h->v[--h->n];
	size_t i = 0;

	for (;;) {
		size_t c = 2 * i + 1;
		if (c >= h->n)
			break;
		if (c + 1 < h->n && pair_before(&h->v[c + 1], &h->v[c]))
			c++;
		if (!pair_before(&h->v[c], &last))
			break;
		h->v[i] = h->v[c];
		i = c;
	}
	if (h->n)
		h->v[i] = last;
	return top;
}

void tokenizer__merger_deinit(struct merger *m)
{
	free(m->sym);
	free(m->heap.v);
	free(m->key);
}

/* Split s[0..n) into symbols: one UTF-8 character each (llama.cpp's lead
 * byte rule, clipped at the end). */
static int merger_split(struct merger *m, const char *s, size_t n)
{
	m->s = s;
	m->n_sym = 0;
	m->heap.n = 0;
	if (n > m->cap_sym) {
		struct sym *v = realloc(m->sym, n * sizeof(*v));
		if (!v)
			return -ENOMEM;
		m->sym = v;
		m->cap_sym = n;
	}
	for (size_t off = 0; off < n;) {
		size_t l = KVD_MIN(tokenizer__utf8_len((uint8_t)s[off]),
				   n - off);
		struct sym *y = &m->sym[m->n_sym];
		y->off = (uint32_t)off;
		y->n = (uint32_t)l;
		y->prev = (int32_t)m->n_sym - 1;
		off += l;
		y->next = off < n ? (int32_t)m->n_sym + 1 : -1;
		m->n_sym++;
	}
	return 0;
}

static int merger_try(struct merger *m, int32_t l, int32_t r)
{
	double prio;
	int rc;

	if (l < 0 || r < 0)
		return 0;
	rc = m->ops->prio(m, &m->sym[l], &m->sym[r], &prio);
	if (rc <= 0)
		return rc;
	return heap_push(&m->heap, (struct pair){
		.prio = prio, .left = l, .right = r,
		.size = m->sym[l].n + m->sym[r].n });
}

static int merger_run(struct merger *m)
{
	int rc;

	for (size_t i = 1; i < m->n_sym; i++)
		if ((rc = merger_try(m, (int32_t)i - 1, (int32_t)i)))
			return rc;
	while (m->heap.n) {
		struct pair p = heap_pop(&m->heap);
		struct sym *a = &m->sym[p.left], *b = &m->sym[p.right];
		/* Stale: one side was merged since the pair was pushed. */
		if (!a->n || !b->n || a->n + b->n != p.size || a->next != p.right)
			continue;
		a->n += b->n;
		b->n = 0;
		a->next = b->next;
		if (b->next >= 0)
			m->sym[b->next].prev = p.left;
		if ((rc = merger_try(m, a->prev, p.left)) ||
		    (rc = merger_try(m, p.left, a->next)))
			return rc;
	}
	return 0;
}

/* Emit the final symbols as ids. */
static int merger_emit(struct merger *m, struct ids *out)
{
	const struct tokenizer *t = m->t;
	int rc;

	for (int32_t i = m->n_sym ? 0 : -1; i >= 0; i = m->sym[i].next) {
		const struct sym *y = &m->sym[i];
		int32_t id = tokenizer__vocab_find(t, m->s + y->off, y->n);
		if (id >= 0) {
			if ((rc = tokenizer__ids_push(out, id)))
				return rc;
			continue;
		}
		if ((rc = m->ops->fallback(m, y, out)))
			return rc;
	}
	return 0;
}

int tokenizer__merger_encode(struct merger *m, const char *s, size_t n,
			     struct ids *out)
{
	int rc = merger_split(m, s, n);

	if (!rc)
		rc = merger_run(m);
	if (!rc)
		rc = merger_emit(m, out);
	return rc;
}
