/* test_kvpool.c - unit tests of the KV page pool (gpu/kv/kvpool.c).
 *
 * Every transition, legal and illegal; all-or-nothing on a bad entry in
 * the middle of a table; fences deferring release; quarantine never
 * reused; grow and shrink with pages in use; exact stats; and the "stale
 * bytes" scenario of the incident: a page freed by request A still holds
 * A's bytes and tag, request B gets the same physical page, B's writer
 * never writes, and verify must refuse B's table.
 *
 * The pool is also run on two fake backends that are not host-visible
 * (one reading tags one by one, one with a batched tags_compare), so the
 * paths used for device memory are exercised without a GPU.
 */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/kv/kvpool.h"

/* Small geometry: 4 tokens x kv_dim 8 x f16 = 64-byte blocks, 2 layers:
 * 64 (tag) + 4 blocks * 64 = 320 bytes a page. */
static const struct kvpool_geom geom = {
	.page_tokens = 4, .n_layer = 2, .kv_dim = 8, .dtype = KV_DTYPE_F16,
};

/* ---- fake non-host-visible backends -------------------------------------- */

struct fake_ctx {
	unsigned reads, writes, compares;
	unsigned allocs, frees;
	int fail_after;          /* > 0: that many more allocs succeed */
	size_t live_bytes;
};

static int fake_alloc(void *ctx, size_t bytes, void **out)
{
	struct fake_ctx *c = ctx;

	if (c->fail_after > 0 && --c->fail_after == 0) {
		c->fail_after = 1; /* keep failing */
		return -ENOMEM;
	}
	if (posix_memalign(out, 64, bytes))
		return -ENOMEM;
	c->allocs++;
	c->live_bytes += bytes;
	return 0;
}

static void fake_free(void *ctx, void *ptr, size_t bytes)
{
	struct fake_ctx *c = ctx;

	c->frees++;
	c->live_bytes -= bytes;
	free(ptr);
}

static int fake_read(void *ctx, void *dst, const void *src, size_t n)
{
	((struct fake_ctx *)ctx)->reads++;
	memcpy(dst, src, n);
	return 0;
}

static int fake_write(void *ctx, void *dst, const void *src, size_t n)
{
	((struct fake_ctx *)ctx)->writes++;
	memcpy(dst, src, n);
	return 0;
}

static int fake_compare(void *ctx, void *const *pages, const void *expected,
			uint32_t n, uint32_t *bad)
{
	((struct fake_ctx *)ctx)->compares++;
	for (uint32_t i = 0; i < n; i++)
		if (memcmp(pages[i], (const char *)expected + 64 * i, 64)) {
			if (bad)
				*bad = i;
			return 1;
		}
	return 0;
}

static const struct kvmem_ops fake_read_ops = {
	.name = "fake-read", .host_visible = false, .alloc = fake_alloc,
	.free = fake_free, .read = fake_read, .write = fake_write,
};

static const struct kvmem_ops fake_batch_ops = {
	.name = "fake-batch", .host_visible = false, .alloc = fake_alloc,
	.free = fake_free, .read = fake_read, .write = fake_write,
	.tags_compare = fake_compare,
};

/* ---- helpers --------------------------------------------------------------- */

static struct kvmem host_mem;

static struct kvpool *pool_new(uint32_t n)
{
	struct kvpool *p = NULL;

	kvmem_host_init(&host_mem);
	ck_assert_int_eq(kvpool_new(&p, &host_mem, &geom, n), 0);
	ck_assert_ptr_nonnull(p);
	return p;
}

static enum kvpage_state page_state(struct kvpool *p, uint32_t page)
{
	struct kvpool_page_info pi;

	ck_assert_int_eq(kvpool_page_info(p, page, &pi), 0);
	return pi.state;
}

static struct kvpool_stats stats(struct kvpool *p)
{
	struct kvpool_stats st;

	kvpool_get_stats(p, &st);
	return st;
}

/* Snapshot of all page metadata, to prove a failed call changed nothing. */
struct snap {
	struct kvpool_stats st;
	struct kvpool_page_info pi[64];
};

static void snap_take(struct kvpool *p, struct snap *s)
{
	memset(s, 0, sizeof(*s));
	kvpool_get_stats(p, &s->st);
	ck_assert_uint_le(s->st.slots, 64);
	for (uint32_t i = 0; i < s->st.slots; i++)
		ck_assert_int_eq(kvpool_page_info(p, i, &s->pi[i]), 0);
}

static void snap_same(struct kvpool *p, const struct snap *a)
{
	struct snap b;

	snap_take(p, &b);
	ck_assert_int_eq(memcmp(&a->st, &b.st, sizeof(a->st)), 0);
	for (uint32_t i = 0; i < a->st.slots; i++) {
		ck_assert_int_eq(a->pi[i].state, b.pi[i].state);
		ck_assert_uint_eq(a->pi[i].owner, b.pi[i].owner);
		ck_assert_uint_eq(a->pi[i].gen, b.pi[i].gen);
		ck_assert_uint_eq(a->pi[i].fences, b.pi[i].fences);
		ck_assert_int_eq(a->pi[i].retiring, b.pi[i].retiring);
	}
}

/* Reserve n pages, fill them with a pattern and valid tags, mark ready. */
static void fill_ready(struct kvpool *p, uint64_t owner, uint32_t n,
		       struct kvpool_ref *t, uint32_t tokens)
{
	ck_assert_int_eq(kvpool_reserve(p, owner, n, t), 0);
	ck_assert_int_eq(kvpool_fill_begin(p, owner, t, n), 0);
	for (uint32_t i = 0; i < n; i++) {
		char *a = kvpool_page_addr(p, t[i].page);

		ck_assert_ptr_nonnull(a);
		memset(a + KVTAG_BYTES, (int)(owner & 0xff),
		       kvpool_page_bytes(&geom) - KVTAG_BYTES);
	}
	ck_assert_int_eq(kvpool_tag_write(p, owner, t, n, tokens), 0);
	ck_assert_int_eq(kvpool_mark_ready(p, owner, t, n, tokens), 0);
}

/* ---- geometry and tags ------------------------------------------------------ */

START_TEST(t_geometry)
{
	struct kvpool *p = pool_new(8);
	struct kvpool_geom bad = geom;
	struct kvpool *q = NULL;

	ck_assert_uint_eq(kvpool_page_bytes(&geom), 320);
	ck_assert_uint_eq(kvpool_block_offset(p, 0, 0), 64);
	ck_assert_uint_eq(kvpool_block_offset(p, 0, 1), 128);
	ck_assert_uint_eq(kvpool_block_offset(p, 1, 0), 192);
	ck_assert_uint_eq(kvpool_block_offset(p, 1, 1), 256);
	ck_assert_uint_eq(kvpool_pages_for(p, 0), 0);
	ck_assert_uint_eq(kvpool_pages_for(p, 1), 1);
	ck_assert_uint_eq(kvpool_pages_for(p, 4), 1);
	ck_assert_uint_eq(kvpool_pages_for(p, 5), 2);
	ck_assert_uint_eq(kvpool_geom(p)->kv_dim, 8);
	/* an odd size is rounded up to 64 */
	bad.kv_dim = 3;
	bad.page_tokens = 1;
	bad.n_layer = 1;
	ck_assert_uint_eq(kvpool_page_bytes(&bad), 128);
	bad = geom;
	bad.page_tokens = 0;
	ck_assert_uint_eq(kvpool_page_bytes(&bad), 0);
	ck_assert_int_eq(kvpool_new(&q, &host_mem, &bad, 4), KVPOOL_E_RANGE);
	bad = geom;
	bad.dtype = (enum kv_dtype)7;
	ck_assert_int_eq(kvpool_new(&q, &host_mem, &bad, 4), KVPOOL_E_RANGE);
	ck_assert_ptr_null(q);
	/* pages are 64-byte aligned and stride page_bytes apart */
	for (uint32_t i = 0; i < 8; i++) {
		uintptr_t a = (uintptr_t)kvpool_page_addr(p, i);

		ck_assert_uint_eq(a % 64, 0);
		if (i)
			ck_assert_uint_eq(a - (uintptr_t)kvpool_page_addr(p, i - 1),
					  320);
	}
	ck_assert_ptr_null(kvpool_page_addr(p, 8));
	ck_assert_str_eq(kvpage_state_name(KVPAGE_FENCED), "fenced");
	ck_assert_str_eq(kvpage_state_name(KVPAGE_N_STATES), "invalid");
	kvpool_free(p);
	kvpool_free(NULL);
}
END_TEST

START_TEST(t_tag_bytes)
{
	struct kvtag t;
	unsigned char *b = (unsigned char *)&t;

	kvtag_make(&t, 42, 7, 3, 1, 4);
	ck_assert_uint_eq(t.magic, KVTAG_MAGIC);
	ck_assert_int_eq(memcmp(b, "VKDVTAG1", 8), 0);
	ck_assert_int_eq(kvtag_check(&t, 42, 7, 3, 1, 4), 0);
	ck_assert_int_eq(kvtag_check(&t, 43, 7, 3, 1, 4), KVPOOL_E_TAG);
	ck_assert_int_eq(kvtag_check(&t, 42, 8, 3, 1, 4), KVPOOL_E_TAG);
	ck_assert_int_eq(kvtag_check(&t, 42, 7, 2, 1, 4), KVPOOL_E_TAG);
	ck_assert_int_eq(kvtag_check(&t, 42, 7, 3, 0, 4), KVPOOL_E_TAG);
	ck_assert_int_eq(kvtag_check(&t, 42, 7, 3, 1, 3), KVPOOL_E_TAG);
	/* any single bit flipped anywhere in the 64 bytes is caught */
	for (int i = 0; i < 64 * 8; i++) {
		b[i / 8] ^= (unsigned char)(1u << (i % 8));
		ck_assert_int_eq(kvtag_check(&t, 42, 7, 3, 1, 4), KVPOOL_E_TAG);
		b[i / 8] ^= (unsigned char)(1u << (i % 8));
	}
	ck_assert_int_eq(kvtag_check(&t, 42, 7, 3, 1, 4), 0);
}
END_TEST

/* ---- legal transitions ------------------------------------------------------ */

START_TEST(t_lifecycle)
{
	struct kvpool *p = pool_new(8);
	struct kvpool_ref t[3];
	struct kvpool_stats st;
	uint32_t bad = 99;

	st = stats(p);
	ck_assert_uint_eq(st.pages, 8);
	ck_assert_uint_eq(st.slots, 8);
	ck_assert_uint_eq(st.by_state[KVPAGE_FREE], 8);
	ck_assert_uint_eq(st.tokens, 32);
	ck_assert_uint_eq(st.page_bytes, 320);
	ck_assert_uint_eq(st.page_tokens, 4);

	ck_assert_int_eq(kvpool_reserve(p, 7, 3, t), 0);
	for (int i = 0; i < 3; i++) {
		ck_assert_int_eq(page_state(p, t[i].page), KVPAGE_RESERVED);
		ck_assert_uint_gt(t[i].gen, 0);
		for (int j = 0; j < i; j++) {
			ck_assert_uint_ne(t[i].page, t[j].page);
			ck_assert_uint_ne(t[i].gen, t[j].gen);
		}
	}
	st = stats(p);
	ck_assert_uint_eq(st.by_state[KVPAGE_FREE], 5);
	ck_assert_uint_eq(st.by_state[KVPAGE_RESERVED], 3);

	ck_assert_int_eq(kvpool_fill_begin(p, 7, t, 3), 0);
	ck_assert_uint_eq(stats(p).by_state[KVPAGE_FILLING], 3);
	ck_assert_int_eq(kvpool_tag_write(p, 7, t, 3, 10), 0);
	/* a FILLING table verifies once its tags are written */
	ck_assert_int_eq(kvpool_verify(p, 7, t, 3, 10, &bad), 0);
	ck_assert_int_eq(kvpool_mark_ready(p, 7, t, 3, 10), 0);
	ck_assert_uint_eq(stats(p).by_state[KVPAGE_READY], 3);
	ck_assert_int_eq(kvpool_verify(p, 7, t, 3, 10, NULL), 0);
	/* decode appends two tokens: tags rewritten for 12 positions */
	ck_assert_int_eq(kvpool_tag_write(p, 7, t, 3, 12), 0);
	ck_assert_int_eq(kvpool_verify(p, 7, t, 3, 12, NULL), 0);
	ck_assert_int_eq(kvpool_verify(p, 7, t, 3, 10, &bad), KVPOOL_E_TAG);
	ck_assert_uint_eq(bad, 2); /* last page held 2, now holds 4 */
	/* a reader may verify a prefix of the table */
	ck_assert_int_eq(kvpool_verify(p, 7, t, 2, 8, NULL), 0);

	ck_assert_int_eq(kvpool_release(p, 7, t, 3), 0);
	st = stats(p);
	ck_assert_uint_eq(st.by_state[KVPAGE_FREE], 8);
	ck_assert_uint_eq(st.by_state[KVPAGE_READY], 0);
	ck_assert_uint_eq(st.pages, 8);
	kvpool_free(p);
}
END_TEST

START_TEST(t_release_from_each_state)
{
	struct kvpool *p = pool_new(4);
	struct kvpool_ref t[1];

	/* RESERVED -> FREE */
	ck_assert_int_eq(kvpool_reserve(p, 1, 1, t), 0);
	ck_assert_int_eq(kvpool_release(p, 1, t, 1), 0);
	ck_assert_int_eq(page_state(p, t[0].page), KVPAGE_FREE);
	/* FILLING -> FREE */
	ck_assert_int_eq(kvpool_reserve(p, 1, 1, t), 0);
	ck_assert_int_eq(kvpool_fill_begin(p, 1, t, 1), 0);
	ck_assert_int_eq(kvpool_release(p, 1, t, 1), 0);
	ck_assert_int_eq(page_state(p, t[0].page), KVPAGE_FREE);
	/* READY -> FREE */
	fill_ready(p, 1, 1, t, 3);
	ck_assert_int_eq(kvpool_release(p, 1, t, 1), 0);
	ck_assert_int_eq(page_state(p, t[0].page), KVPAGE_FREE);
	ck_assert_uint_eq(stats(p).by_state[KVPAGE_FREE], 4);
	kvpool_free(p);
}
END_TEST

/* ---- illegal transitions ---------------------------------------------------- */

START_TEST(t_illegal)
{
	struct kvpool *p = pool_new(8);
	struct kvpool_ref t[2], old[2], dup[2], oob[1];
	struct snap s;

	ck_assert_int_eq(kvpool_reserve(p, 5, 0, t), KVPOOL_E_RANGE);
	ck_assert_int_eq(kvpool_reserve(p, 5, 1, NULL), KVPOOL_E_RANGE);
	ck_assert_int_eq(kvpool_reserve(p, 5, 2, t), 0);
	snap_take(p, &s);

	/* wrong state from RESERVED */
	ck_assert_int_eq(kvpool_tag_write(p, 5, t, 2, 8), KVPOOL_E_STATE);
	ck_assert_int_eq(kvpool_mark_ready(p, 5, t, 2, 8), KVPOOL_E_STATE);
	ck_assert_int_eq(kvpool_verify(p, 5, t, 2, 8, NULL), KVPOOL_E_STATE);
	ck_assert_int_eq(kvpool_unfence(p, 5, t, 2), KVPOOL_E_STATE);
	/* wrong owner */
	ck_assert_int_eq(kvpool_fill_begin(p, 6, t, 2), KVPOOL_E_STALE);
	ck_assert_int_eq(kvpool_release(p, 6, t, 2), KVPOOL_E_STALE);
	ck_assert_int_eq(kvpool_fence(p, 6, t, 2), KVPOOL_E_STALE);
	ck_assert_int_eq(kvpool_quarantine(p, 6, t, 2), KVPOOL_E_STALE);
	ck_assert_int_eq(kvpool_verify(p, 6, t, 2, 8, NULL), KVPOOL_E_STALE);
	/* bad arguments */
	ck_assert_int_eq(kvpool_release(p, 5, t, 0), KVPOOL_E_RANGE);
	ck_assert_int_eq(kvpool_release(p, 5, NULL, 1), KVPOOL_E_RANGE);
	oob[0].page = 8;
	oob[0].gen = t[0].gen;
	ck_assert_int_eq(kvpool_release(p, 5, oob, 1), KVPOOL_E_RANGE);
	dup[0] = t[0];
	dup[1] = t[0];
	ck_assert_int_eq(kvpool_fence(p, 5, dup, 2), KVPOOL_E_RANGE);
	ck_assert_int_eq(kvpool_release(p, 5, dup, 2), KVPOOL_E_RANGE);
	snap_same(p, &s);

	ck_assert_int_eq(kvpool_fill_begin(p, 5, t, 2), 0);
	ck_assert_int_eq(kvpool_fill_begin(p, 5, t, 2), KVPOOL_E_STATE);
	/* coverage: 2 pages hold 5..8 tokens */
	ck_assert_int_eq(kvpool_tag_write(p, 5, t, 2, 4), KVPOOL_E_COVERAGE);
	ck_assert_int_eq(kvpool_tag_write(p, 5, t, 2, 9), KVPOOL_E_COVERAGE);
	ck_assert_int_eq(kvpool_tag_write(p, 5, t, 2, 0), KVPOOL_E_COVERAGE);
	ck_assert_int_eq(kvpool_tag_write(p, 5, t, 2, 5), 0);
	ck_assert_int_eq(kvpool_mark_ready(p, 5, t, 2, 4), KVPOOL_E_COVERAGE);
	ck_assert_int_eq(kvpool_mark_ready(p, 5, t, 1, 5), KVPOOL_E_COVERAGE);
	ck_assert_int_eq(kvpool_verify(p, 5, t, 2, 0, NULL),
			 KVPOOL_E_COVERAGE);
	/* tags written for 5 tokens do not verify for 6 */
	ck_assert_int_eq(kvpool_mark_ready(p, 5, t, 2, 6), KVPOOL_E_TAG);
	ck_assert_int_eq(page_state(p, t[0].page), KVPAGE_FILLING);
	ck_assert_int_eq(kvpool_mark_ready(p, 5, t, 2, 5), 0);
	ck_assert_int_eq(kvpool_mark_ready(p, 5, t, 2, 5), KVPOOL_E_STATE);
	ck_assert_int_eq(kvpool_fill_begin(p, 5, t, 2), KVPOOL_E_STATE);

	/* after release: the same table is refused everywhere */
	memcpy(old, t, sizeof(t));
	ck_assert_int_eq(kvpool_release(p, 5, t, 2), 0);
	ck_assert_int_eq(kvpool_release(p, 5, old, 2), KVPOOL_E_STATE);
	ck_assert_int_eq(kvpool_verify(p, 5, old, 2, 5, NULL), KVPOOL_E_STATE);
	ck_assert_int_eq(kvpool_fence(p, 5, old, 2), KVPOOL_E_STATE);
	ck_assert_int_eq(kvpool_quarantine(p, 5, old, 2), KVPOOL_E_STATE);
	/* the pages go to a new owner: the old table is now stale */
	ck_assert_int_eq(kvpool_reserve(p, 9, 8, (struct kvpool_ref[8]){ 0 }),
			 0);
	ck_assert_int_eq(kvpool_verify(p, 5, old, 2, 5, NULL), KVPOOL_E_STALE);
	ck_assert_int_eq(kvpool_release(p, 5, old, 2), KVPOOL_E_STALE);
	/* right page, right owner id reused, old generation: still stale */
	ck_assert_int_eq(kvpool_release(p, 9, old, 2), KVPOOL_E_STALE);
	kvpool_free(p);
}
END_TEST

/* A bad entry in the middle of a table makes every call change nothing. */
START_TEST(t_all_or_nothing)
{
	struct kvpool *p = pool_new(8);
	struct kvpool_ref t[5], other[1];
	struct snap s;

	fill_ready(p, 3, 5, t, 20);
	ck_assert_int_eq(kvpool_reserve(p, 4, 1, other), 0);

	for (int kind = 0; kind < 4; kind++) {
		struct kvpool_ref bad[5];
		int want;

		memcpy(bad, t, sizeof(t));
		switch (kind) {
		case 0: /* stale generation */
			bad[2].gen--;
			want = KVPOOL_E_STALE;
			break;
		case 1: /* another request's page */
			bad[2] = other[0];
			want = KVPOOL_E_STALE;
			break;
		case 2: /* out of range */
			bad[2].page = 1000;
			want = KVPOOL_E_RANGE;
			break;
		default: /* duplicate */
			bad[2] = bad[1];
			want = KVPOOL_E_RANGE;
			break;
		}
		snap_take(p, &s);
		ck_assert_int_eq(kvpool_fence(p, 3, bad, 5), want);
		ck_assert_int_eq(kvpool_release(p, 3, bad, 5), want);
		ck_assert_int_eq(kvpool_quarantine(p, 3, bad, 5), want);
		ck_assert_int_eq(kvpool_tag_write(p, 3, bad, 5, 20), want);
		ck_assert_int_eq(kvpool_verify(p, 3, bad, 5, 20, NULL), want);
		snap_same(p, &s);
		ck_assert_int_eq(kvpool_verify(p, 3, t, 5, 20, NULL), 0);
	}
	/* wrong state in the middle: page 2 quarantined on its own */
	ck_assert_int_eq(kvpool_fence(p, 3, t, 5), 0);
	ck_assert_int_eq(kvpool_quarantine(p, 3, &t[2], 1), 0);
	snap_take(p, &s);
	ck_assert_int_eq(kvpool_release(p, 3, t, 5), KVPOOL_E_STATE);
	ck_assert_int_eq(kvpool_fence(p, 3, t, 5), KVPOOL_E_STATE);
	snap_same(p, &s);
	/* unfence accepts the quarantined page (it holds a fence) */
	ck_assert_int_eq(kvpool_unfence(p, 3, t, 5), 0);
	ck_assert_uint_eq(stats(p).fences, 0);
	ck_assert_int_eq(kvpool_unfence(p, 3, t, 5), KVPOOL_E_STATE);
	kvpool_free(p);
}
END_TEST

START_TEST(t_full_unchanged)
{
	struct kvpool *p = pool_new(6);
	struct kvpool_ref t[7];
	struct snap s;

	ck_assert_int_eq(kvpool_reserve(p, 1, 7, t), KVPOOL_E_FULL);
	ck_assert_int_eq(kvpool_reserve(p, 1, 4, t), 0);
	snap_take(p, &s);
	ck_assert_int_eq(kvpool_reserve(p, 2, 3, t + 4), KVPOOL_E_FULL);
	snap_same(p, &s);
	ck_assert_int_eq(kvpool_reserve(p, 2, 2, t + 4), 0);
	ck_assert_int_eq(kvpool_reserve(p, 3, 1, t + 6), KVPOOL_E_FULL);
	ck_assert_uint_eq(stats(p).by_state[KVPAGE_FREE], 0);
	kvpool_free(p);
}
END_TEST

/* ---- fences: deferred release (invariant 2) --------------------------------- */

START_TEST(t_fence_defers_release)
{
	struct kvpool *p = pool_new(4);
	struct kvpool_ref t[2], rest[3];
	struct kvpool_stats st;

	ck_assert_int_eq(kvpool_reserve(p, 1, 2, t), 0);
	ck_assert_int_eq(kvpool_fill_begin(p, 1, t, 2), 0);
	ck_assert_int_eq(kvpool_fence(p, 1, t, 2), 0);   /* transfer */
	ck_assert_int_eq(kvpool_fence(p, 1, t, 1), 0);   /* peer ack */
	st = stats(p);
	ck_assert_uint_eq(st.fences, 3);
	/* abort: release while fenced */
	ck_assert_int_eq(kvpool_release(p, 1, t, 2), 0);
	st = stats(p);
	ck_assert_uint_eq(st.by_state[KVPAGE_FENCED], 2);
	ck_assert_uint_eq(st.by_state[KVPAGE_FREE], 2);
	/* fenced pages are not handed out */
	ck_assert_int_eq(kvpool_reserve(p, 2, 3, rest), KVPOOL_E_FULL);
	ck_assert_int_eq(kvpool_reserve(p, 2, 2, rest), 0);
	for (int i = 0; i < 2; i++)
		ck_assert(rest[i].page != t[0].page && rest[i].page != t[1].page);
	/* the owner's table still identifies them for unfence only */
	ck_assert_int_eq(kvpool_fill_begin(p, 1, t, 2), KVPOOL_E_STATE);
	ck_assert_int_eq(kvpool_fence(p, 1, t, 2), KVPOOL_E_STATE);
	ck_assert_int_eq(kvpool_release(p, 1, t, 2), KVPOOL_E_STATE);
	ck_assert_int_eq(kvpool_unfence(p, 1, t, 2), 0);  /* transfer done */
	ck_assert_int_eq(page_state(p, t[0].page), KVPAGE_FENCED);
	ck_assert_int_eq(page_state(p, t[1].page), KVPAGE_FREE);
	ck_assert_int_eq(kvpool_unfence(p, 1, t, 2), KVPOOL_E_STATE);
	ck_assert_int_eq(page_state(p, t[0].page), KVPAGE_FENCED);
	ck_assert_int_eq(kvpool_unfence(p, 1, t, 1), 0);  /* peer acked */
	ck_assert_int_eq(page_state(p, t[0].page), KVPAGE_FREE);
	st = stats(p);
	ck_assert_uint_eq(st.fences, 0);
	ck_assert_uint_eq(st.by_state[KVPAGE_FREE], 2);
	ck_assert_uint_eq(st.by_state[KVPAGE_FENCED], 0);
	/* unfence while still owned does not free */
	ck_assert_int_eq(kvpool_fence(p, 2, rest, 2), 0);
	ck_assert_int_eq(kvpool_unfence(p, 2, rest, 2), 0);
	ck_assert_int_eq(page_state(p, rest[0].page), KVPAGE_RESERVED);
	kvpool_free(p);
}
END_TEST

/* ---- quarantine ------------------------------------------------------------ */

START_TEST(t_quarantine_never_reused)
{
	struct kvpool *p = pool_new(4);
	struct kvpool_ref q[1], f[1], t[4];
	struct kvpool_stats st;

	ck_assert_int_eq(kvpool_reserve(p, 1, 1, q), 0);
	ck_assert_int_eq(kvpool_quarantine(p, 1, q, 1), 0);
	ck_assert_int_eq(page_state(p, q[0].page), KVPAGE_QUARANTINED);
	/* a fenced (released) page can be quarantined by its last owner */
	ck_assert_int_eq(kvpool_reserve(p, 2, 1, f), 0);
	ck_assert_int_eq(kvpool_fence(p, 2, f, 1), 0);
	ck_assert_int_eq(kvpool_release(p, 2, f, 1), 0);
	ck_assert_int_eq(kvpool_quarantine(p, 2, f, 1), 0);
	st = stats(p);
	ck_assert_uint_eq(st.by_state[KVPAGE_QUARANTINED], 2);
	ck_assert_uint_eq(st.fences, 1);
	ck_assert_uint_eq(st.pages, 4);
	/* the late writer finishes: fence dropped, page stays out */
	ck_assert_int_eq(kvpool_unfence(p, 2, f, 1), 0);
	ck_assert_int_eq(page_state(p, f[0].page), KVPAGE_QUARANTINED);
	for (int round = 0; round < 100; round++) {
		ck_assert_int_eq(kvpool_reserve(p, 10, 3, t), KVPOOL_E_FULL);
		ck_assert_int_eq(kvpool_reserve(p, 10, 2, t), 0);
		for (int i = 0; i < 2; i++)
			ck_assert(t[i].page != q[0].page &&
				  t[i].page != f[0].page);
		ck_assert_int_eq(kvpool_release(p, 10, t, 2), 0);
	}
	ck_assert_int_eq(kvpool_release(p, 1, q, 1), KVPOOL_E_STATE);
	ck_assert_int_eq(kvpool_quarantine(p, 1, q, 1), KVPOOL_E_STATE);
	ck_assert_int_eq(kvpool_fill_begin(p, 1, q, 1), KVPOOL_E_STATE);
	/* shrink cannot count quarantined pages */
	ck_assert_int_eq(kvpool_shrink(p, 3, NULL), KVPOOL_E_RANGE);
	kvpool_free(p);
}
END_TEST

/* ---- grow and shrink --------------------------------------------------------- */

START_TEST(t_grow_shrink)
{
	struct kvpool *p = pool_new(4);
	struct kvpool_ref a[2], b[6];
	struct kvpool_stats st;
	struct kvpool_page_info pi;
	uint32_t now = 99;
	uint64_t g3;

	/* reserve pages 2 and 3 for a (free stack pops the highest first) */
	ck_assert_int_eq(kvpool_reserve(p, 1, 2, a), 0);
	ck_assert_uint_eq(a[0].page, 3);
	ck_assert_uint_eq(a[1].page, 2);
	g3 = a[0].gen;
	/* shrink 3: free pages 1, 0 retire now; page 3 marked retiring */
	ck_assert_int_eq(kvpool_shrink(p, 3, &now), 0);
	ck_assert_uint_eq(now, 2);
	st = stats(p);
	ck_assert_uint_eq(st.pages, 2);
	ck_assert_uint_eq(st.slots, 4);
	ck_assert_uint_eq(st.by_state[KVPAGE_RETIRED], 2);
	ck_assert_uint_eq(st.retiring, 1);
	ck_assert_uint_eq(st.tokens, 8);
	ck_assert_int_eq(kvpool_page_info(p, 3, &pi), 0);
	ck_assert(pi.retiring);
	ck_assert_int_eq(kvpool_reserve(p, 2, 1, b), KVPOOL_E_FULL);
	/* nothing left to shrink: 2 live, 1 retiring already */
	ck_assert_int_eq(kvpool_shrink(p, 2, &now), KVPOOL_E_RANGE);
	ck_assert_uint_eq(now, 0);
	/* release: page 3 retires, page 2 goes free, chunk keeps memory */
	ck_assert_int_eq(kvpool_release(p, 1, a, 2), 0);
	st = stats(p);
	ck_assert_uint_eq(st.pages, 1);
	ck_assert_uint_eq(st.retiring, 0);
	ck_assert_uint_eq(st.by_state[KVPAGE_RETIRED], 3);
	ck_assert_uint_eq(st.by_state[KVPAGE_FREE], 1);
	ck_assert_int_eq(page_state(p, 3), KVPAGE_RETIRED);
	ck_assert_ptr_nonnull(kvpool_page_addr(p, 2));
	/* shrink the last one: the whole chunk goes back to the backend */
	ck_assert_int_eq(kvpool_shrink(p, 1, &now), 0);
	ck_assert_uint_eq(now, 1);
	ck_assert_uint_eq(stats(p).pages, 0);
	ck_assert_ptr_null(kvpool_page_addr(p, 2));
	ck_assert_int_eq(kvpool_page_info(p, 3, &pi), 0);
	ck_assert(!pi.has_memory);
	ck_assert_int_eq(kvpool_reserve(p, 2, 1, b), KVPOOL_E_FULL);

	/* grow 6: the 4 slots come back (memory reallocated), 2 are new */
	ck_assert_int_eq(kvpool_grow(p, 6), 0);
	st = stats(p);
	ck_assert_uint_eq(st.pages, 6);
	ck_assert_uint_eq(st.slots, 6);
	ck_assert_uint_eq(st.by_state[KVPAGE_FREE], 6);
	ck_assert_uint_eq(st.by_state[KVPAGE_RETIRED], 0);
	ck_assert_int_eq(kvpool_reserve(p, 2, 6, b), 0);
	for (int i = 0; i < 6; i++) {
		ck_assert_ptr_nonnull(kvpool_page_addr(p, b[i].page));
		if (b[i].page == 3)
			ck_assert_uint_gt(b[i].gen, g3); /* never repeats */
	}
	/* a page in use, FENCED after release, retires at its last unfence */
	ck_assert_int_eq(kvpool_fence(p, 2, b, 1), 0);
	ck_assert_int_eq(kvpool_shrink(p, 6, &now), 0);
	ck_assert_uint_eq(now, 0);
	ck_assert_uint_eq(stats(p).retiring, 6);
	ck_assert_int_eq(kvpool_release(p, 2, b, 6), 0);
	st = stats(p);
	ck_assert_uint_eq(st.by_state[KVPAGE_RETIRED], 5);
	ck_assert_uint_eq(st.by_state[KVPAGE_FENCED], 1);
	ck_assert_uint_eq(st.retiring, 1);
	ck_assert_int_eq(kvpool_unfence(p, 2, b, 1), 0);
	st = stats(p);
	ck_assert_uint_eq(st.by_state[KVPAGE_RETIRED], 6);
	ck_assert_uint_eq(st.pages, 0);
	ck_assert_uint_eq(st.retiring, 0);
	/* grow 1 after all chunks went back */
	ck_assert_int_eq(kvpool_grow(p, 1), 0);
	ck_assert_uint_eq(stats(p).pages, 1);
	ck_assert_uint_eq(stats(p).slots, 6);
	ck_assert_int_eq(kvpool_grow(p, 0), 0);
	kvpool_free(p);
}
END_TEST

/* A grow whose allocation fails changes nothing; memory stays balanced. */
START_TEST(t_grow_enomem)
{
	struct fake_ctx c = { 0 };
	struct kvmem m = { .ops = &fake_read_ops, .ctx = &c };
	struct kvpool *p = NULL;
	struct kvpool_ref a[2];
	struct snap s;

	ck_assert_int_eq(kvpool_new(&p, &m, &geom, 4), 0);
	ck_assert_int_eq(kvpool_grow(p, 4), 0);          /* chunk 1 */
	ck_assert_uint_eq(c.allocs, 2);
	ck_assert_uint_eq(c.live_bytes, 8 * 320);
	/* chunk 0 fully retired goes back to the backend */
	ck_assert_int_eq(kvpool_reserve(p, 1, 2, a), 0); /* pages 7, 6 */
	ck_assert_int_eq(kvpool_shrink(p, 6, NULL), 0);
	ck_assert_uint_eq(c.frees, 1);
	ck_assert_uint_eq(c.live_bytes, 4 * 320);
	ck_assert_ptr_null(kvpool_page_addr(p, 0));
	/* growing 7: slots 4, 5 cost nothing, then chunk 0 again (4) and a
	 * new chunk (1): the second allocation fails, the first is given
	 * back, nothing changes */
	snap_take(p, &s);
	c.fail_after = 2;
	ck_assert_int_eq(kvpool_grow(p, 7), -ENOMEM);
	snap_same(p, &s);
	ck_assert_uint_eq(c.allocs, 3);
	ck_assert_uint_eq(c.frees, 2);
	ck_assert_uint_eq(c.live_bytes, 4 * 320);
	/* the first allocation failing: nothing allocated at all */
	c.fail_after = 1;
	ck_assert_int_eq(kvpool_grow(p, 7), -ENOMEM);
	snap_same(p, &s);
	ck_assert_uint_eq(c.allocs, 3);
	c.fail_after = 0;
	ck_assert_int_eq(kvpool_grow(p, 7), 0);
	ck_assert_uint_eq(c.allocs, 5);
	ck_assert_uint_eq(stats(p).pages, 9);
	ck_assert_uint_eq(stats(p).slots, 9);
	ck_assert_uint_eq(stats(p).by_state[KVPAGE_FREE], 7);
	ck_assert_uint_eq(c.live_bytes, 9 * 320);
	ck_assert_int_eq(kvpool_release(p, 1, a, 2), 0);
	ck_assert_uint_eq(stats(p).by_state[KVPAGE_FREE], 9);
	kvpool_free(p);
	ck_assert_uint_eq(c.live_bytes, 0);
	ck_assert_uint_eq(c.allocs, c.frees);
}
END_TEST

START_TEST(t_quarantine_cancels_retiring)
{
	struct kvpool *p = pool_new(2);
	struct kvpool_ref a[2];

	ck_assert_int_eq(kvpool_reserve(p, 1, 2, a), 0);
	ck_assert_int_eq(kvpool_shrink(p, 1, NULL), 0);
	ck_assert_uint_eq(stats(p).retiring, 1);
	ck_assert_int_eq(kvpool_quarantine(p, 1, a, 2), 0);
	ck_assert_uint_eq(stats(p).retiring, 0);
	ck_assert_uint_eq(stats(p).pages, 2);
	kvpool_free(p);
}
END_TEST

/* ---- stale bytes: the incident ----------------------------------------------- */

static void stale_bytes_on(const struct kvmem *mem)
{
	struct kvpool *p = NULL;
	struct kvpool_ref a[1], b[1], b2[2];
	uint64_t page_bytes = kvpool_page_bytes(&geom);
	unsigned char *a_bytes = malloc(page_bytes);
	unsigned char *junk = malloc(page_bytes);
	struct kvtag t;
	uint32_t bad = 99;

	ck_assert_int_eq(kvpool_new(&p, mem, &geom, 4), 0);
	/* Request A writes its KV and tags, is read, and finishes. */
	ck_assert_int_eq(kvpool_reserve(p, 0xA, 1, a), 0);
	ck_assert_int_eq(kvpool_fill_begin(p, 0xA, a, 1), 0);
	memset(a_bytes, 0xAA, page_bytes);
	ck_assert_int_eq(mem->ops->write(mem->ctx,
					 (char *)kvpool_page_addr(p, a[0].page) +
						 KVTAG_BYTES,
					 a_bytes, page_bytes - KVTAG_BYTES),
			 0);
	ck_assert_int_eq(kvpool_tag_write(p, 0xA, a, 1, 3), 0);
	ck_assert_int_eq(kvpool_mark_ready(p, 0xA, a, 1, 3), 0);
	ck_assert_int_eq(kvpool_verify(p, 0xA, a, 1, 3, NULL), 0);
	ck_assert_int_eq(mem->ops->read(mem->ctx, a_bytes,
					kvpool_page_addr(p, a[0].page),
					page_bytes),
			 0);
	ck_assert_int_eq(kvpool_release(p, 0xA, a, 1), 0);

	/* Request B gets the same physical page; its writer never writes. */
	ck_assert_int_eq(kvpool_reserve(p, 0xB, 1, b), 0);
	ck_assert_uint_eq(b[0].page, a[0].page);
	ck_assert_uint_gt(b[0].gen, a[0].gen);
	ck_assert_int_eq(kvpool_fill_begin(p, 0xB, b, 1), 0);
	ck_assert_int_eq(kvpool_verify(p, 0xB, b, 1, 3, &bad), KVPOOL_E_TAG);
	ck_assert_uint_eq(bad, 0);
	ck_assert_int_eq(kvpool_mark_ready(p, 0xB, b, 1, 3), KVPOOL_E_TAG);
	ck_assert_int_eq(page_state(p, b[0].page), KVPAGE_FILLING);

	/* A remote writer replays A's old bytes (tag included) into it. */
	ck_assert_int_eq(mem->ops->write(mem->ctx,
					 kvpool_page_addr(p, b[0].page),
					 a_bytes, page_bytes),
			 0);
	ck_assert_int_eq(kvpool_verify(p, 0xB, b, 1, 3, NULL), KVPOOL_E_TAG);
	ck_assert_int_eq(kvpool_mark_ready(p, 0xB, b, 1, 3), KVPOOL_E_TAG);
	/* A's own table is refused by metadata before any byte is read */
	ck_assert_int_eq(kvpool_verify(p, 0xA, a, 1, 3, NULL), KVPOOL_E_STALE);
	/* B's table with A's generation is stale too */
	b2[0].page = b[0].page;
	b2[0].gen = a[0].gen;
	ck_assert_int_eq(kvpool_verify(p, 0xB, b2, 1, 3, NULL),
			 KVPOOL_E_STALE);
	ck_assert_int_eq(kvpool_release(p, 0xB, b, 1), 0);

	/* A tag copied from another page: same owner and generation, but
	 * made for a different physical page (or index). */
	ck_assert_int_eq(kvpool_reserve(p, 0xC, 2, b2), 0);
	ck_assert_int_eq(kvpool_fill_begin(p, 0xC, b2, 2), 0);
	ck_assert_int_eq(kvpool_tag_write(p, 0xC, b2, 2, 8), 0);
	ck_assert_int_eq(kvpool_verify(p, 0xC, b2, 2, 8, NULL), 0);
	kvtag_make(&t, 0xC, b2[0].gen, b2[1].page, 0, 4);
	ck_assert_int_eq(mem->ops->write(mem->ctx,
					 kvpool_page_addr(p, b2[0].page), &t,
					 sizeof(t)),
			 0);
	ck_assert_int_eq(kvpool_verify(p, 0xC, b2, 2, 8, &bad), KVPOOL_E_TAG);
	ck_assert_uint_eq(bad, 0);
	/* page 1's real tag copied into page 0 */
	ck_assert_int_eq(mem->ops->read(mem->ctx, &t,
					kvpool_page_addr(p, b2[1].page),
					sizeof(t)),
			 0);
	ck_assert_int_eq(mem->ops->write(mem->ctx,
					 kvpool_page_addr(p, b2[0].page), &t,
					 sizeof(t)),
			 0);
	ck_assert_int_eq(kvpool_verify(p, 0xC, b2, 2, 8, &bad), KVPOOL_E_TAG);
	ck_assert_uint_eq(bad, 0);
	/* swapped table order: tags hold the index */
	ck_assert_int_eq(kvpool_tag_write(p, 0xC, b2, 2, 8), 0);
	{
		struct kvpool_ref sw[2] = { b2[1], b2[0] };

		ck_assert_int_eq(kvpool_verify(p, 0xC, sw, 2, 8, &bad),
				 KVPOOL_E_TAG);
		ck_assert_uint_eq(bad, 0);
	}
	/* a corrupted reserved field (bytes 40..47 of the tag) is caught */
	memset(junk, 0x5c, 8);
	ck_assert_int_eq(mem->ops->write(mem->ctx,
					 (char *)kvpool_page_addr(p, b2[1].page) +
						 40,
					 junk, 8),
			 0);
	ck_assert_int_eq(kvpool_verify(p, 0xC, b2, 2, 8, &bad), KVPOOL_E_TAG);
	ck_assert_uint_eq(bad, 1);
	kvpool_free(p);
	free(a_bytes);
	free(junk);
}

START_TEST(t_stale_bytes_host)
{
	struct kvmem m;

	kvmem_host_init(&m);
	stale_bytes_on(&m);
	kvmem_deinit(&m);
	kvmem_deinit(&m);
}
END_TEST

START_TEST(t_stale_bytes_not_host_visible)
{
	struct fake_ctx c = { 0 };
	struct kvmem m = { .ops = &fake_read_ops, .ctx = &c };

	stale_bytes_on(&m);
	ck_assert_uint_gt(c.reads, 0);
}
END_TEST

START_TEST(t_stale_bytes_batched)
{
	struct fake_ctx c = { 0 };
	struct kvmem m = { .ops = &fake_batch_ops, .ctx = &c };

	stale_bytes_on(&m);
	ck_assert_uint_gt(c.compares, 0);
}
END_TEST

/* ---- unfilled tails (invariant 10) ------------------------------------------ */

/* Fill a page with a marker, zero its tail for `tokens`, check that
 * exactly positions >= tokens of every block are zero and the tag and the
 * head kept their bytes. On backend `m` (host, or a fake without zero2d
 * that is not host-visible: the fallback writes zeros). */
static void zero_tail_on(const struct kvmem *m, const struct kvpool_geom *g,
			 uint32_t tokens)
{
	struct kvpool *p = NULL;
	struct kvpool_ref ref;
	uint64_t pb = kvpool_page_bytes(g);
	size_t elt = g->dtype == KV_DTYPE_F32 ? 4 : 2;
	size_t row = elt * g->kv_dim, block = row * g->page_tokens;
	uint8_t *page, *back;

	ck_assert_int_eq(kvpool_new(&p, m, g, 3), 0);
	ck_assert_int_eq(kvpool_reserve(p, 42, 1, &ref), 0);
	page = malloc(pb);
	back = malloc(pb);
	ck_assert_ptr_nonnull(page);
	ck_assert_ptr_nonnull(back);
	memset(page, 0xa5, pb);
	ck_assert_int_eq(m->ops->write(m->ctx, kvpool_page_addr(p, ref.page),
				       page, pb), 0);
	ck_assert_int_eq(kvpool_zero_tail(p, 42, &ref, tokens), 0);
	ck_assert_int_eq(m->ops->read(m->ctx, back, kvpool_page_addr(p, ref.page),
				      pb), 0);
	for (size_t i = 0; i < pb; i++) {
		size_t in = i - KVTAG_BYTES, pos = (in % block) / row;
		int tail = i >= KVTAG_BYTES && in < 2 * g->n_layer * block &&
			   pos >= tokens;

		ck_assert_msg(back[i] == (tail ? 0 : 0xa5),
			      "byte %zu (tokens %u, page_tokens %u, %s): %02x",
			      i, tokens, g->page_tokens,
			      g->dtype == KV_DTYPE_F32 ? "f32" : "f16", back[i]);
	}
	free(page);
	free(back);
	kvpool_free(p);
}

START_TEST(t_zero_tail)
{
	static const uint32_t pts[] = { 1, 4, 16, 5 };
	struct fake_ctx c = { 0 };
	struct kvmem fake = { .ops = &fake_read_ops, .ctx = &c };
	struct kvmem host;

	kvmem_host_init(&host);
	for (size_t i = 0; i < sizeof(pts) / sizeof(pts[0]); i++)
		for (int dt = 0; dt < 2; dt++)
			for (uint32_t t = 0; t <= pts[i]; t++) {
				struct kvpool_geom g = {
					.page_tokens = pts[i], .n_layer = 3,
					.kv_dim = 8 + 4 * (uint32_t)i,
					.dtype = dt ? KV_DTYPE_F16 : KV_DTYPE_F32,
				};

				zero_tail_on(&host, &g, t);
				zero_tail_on(&fake, &g, t);
			}
	ck_assert_uint_gt(c.writes, 0);
}
END_TEST

START_TEST(t_zero_tail_checks)
{
	struct kvpool *p = pool_new(4);
	struct kvpool_ref ref, other = { 0 };

	ck_assert_int_eq(kvpool_reserve(p, 1, 1, &ref), 0);
	ck_assert_int_eq(kvpool_zero_tail(p, 1, &ref, geom.page_tokens + 1),
			 KVPOOL_E_RANGE);
	ck_assert_int_eq(kvpool_zero_tail(p, 2, &ref, 1), KVPOOL_E_STALE);
	other = ref;
	other.gen++;
	ck_assert_int_eq(kvpool_zero_tail(p, 1, &other, 1), KVPOOL_E_STALE);
	other = ref;
	other.page = 99;
	ck_assert_int_eq(kvpool_zero_tail(p, 1, &other, 1), KVPOOL_E_RANGE);
	ck_assert_int_eq(kvpool_release(p, 1, &ref, 1), 0);
	ck_assert_int_eq(kvpool_zero_tail(p, 1, &ref, 1), KVPOOL_E_STATE);
	kvpool_free(p);
}
END_TEST

START_TEST(t_kv_finite)
{
	for (int dt = 0; dt < 2; dt++) {
		struct kvpool_geom g = { .page_tokens = 4, .n_layer = 2,
					 .kv_dim = 8,
					 .dtype = dt ? KV_DTYPE_F16 : KV_DTYPE_F32 };
		size_t elt = dt ? 2 : 4, row = elt * g.kv_dim;
		size_t block = row * g.page_tokens;
		uint64_t pb = kvpool_page_bytes(&g);
		uint8_t *page = calloc(1, pb);
		static const uint32_t f32_bad[] = { 0x7fc00000, 0x7f800000,
						    0xff800000, 0x7f800001 };
		static const uint16_t f16_bad[] = { 0x7e00, 0x7c00, 0xfc00,
						    0x7c01 };

		ck_assert_ptr_nonnull(page);
		/* garbage in the tag is not KV */
		memset(page, 0xff, KVTAG_BYTES);
		ck_assert(kvpool_page_kv_finite(&g, page, 4));
		for (int k = 0; k < 4; k++) {
			/* position 2 of the last block (V of layer 1) */
			uint8_t *at = page + KVTAG_BYTES + 3 * block + 2 * row +
				      elt * (size_t)k;

			if (dt)
				memcpy(at, &f16_bad[k], 2);
			else
				memcpy(at, &f32_bad[k], 4);
			ck_assert(!kvpool_page_kv_finite(&g, page, 4));
			ck_assert(!kvpool_page_kv_finite(&g, page, 3));
			/* past the tokens held: the tail, zeroed anyway */
			ck_assert(kvpool_page_kv_finite(&g, page, 2));
			memset(at, 0, elt);
		}
		/* the largest finite values pass */
		if (dt)
			memcpy(page + KVTAG_BYTES, &(uint16_t){ 0x7bff }, 2);
		else
			memcpy(page + KVTAG_BYTES, &(uint32_t){ 0x7f7fffff }, 4);
		ck_assert(kvpool_page_kv_finite(&g, page, 4));
		free(page);
	}
}
END_TEST

START_TEST(t_cuda_init)
{
	struct kvmem m = KVMEM_NULL;
	int r = kvmem_cuda_init(&m, 0);

	/* without a device (or a CUDA build) a typed errno, never a crash */
	if (r) {
		ck_assert(r == -ENOTSUP || r == -ENODEV);
		ck_assert_ptr_null(m.ops);
	} else {
		ck_assert_str_eq(m.ops->name, "cuda");
		ck_assert(!m.ops->host_visible);
	}
	kvmem_deinit(&m);
}
END_TEST

/* ---- threads: the mutex keeps metadata consistent ---------------------------- */

struct worker {
	struct kvpool *p;
	uint64_t owner;
	unsigned seed;
	int errors;
};

static void *worker_run(void *arg)
{
	struct worker *w = arg;
	struct kvpool_ref t[4];

	for (int i = 0; i < 20000; i++) {
		uint32_t n = 1 + rand_r(&w->seed) % 4;
		int r = kvpool_reserve(w->p, w->owner, n, t);

		if (r == KVPOOL_E_FULL)
			continue;
		if (r || kvpool_fill_begin(w->p, w->owner, t, n) ||
		    kvpool_tag_write(w->p, w->owner, t, n, n * 4) ||
		    kvpool_mark_ready(w->p, w->owner, t, n, n * 4) ||
		    kvpool_verify(w->p, w->owner, t, n, n * 4, NULL) ||
		    kvpool_release(w->p, w->owner, t, n))
			w->errors++;
	}
	return NULL;
}

START_TEST(t_threads)
{
	struct kvpool *p = pool_new(12);
	struct worker w[4];
	pthread_t th[4];
	struct kvpool_stats st;

	for (int i = 0; i < 4; i++) {
		w[i] = (struct worker){ .p = p, .owner = 100 + i, .seed = i };
		ck_assert_int_eq(pthread_create(&th[i], NULL, worker_run, &w[i]),
				 0);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(th[i], NULL);
		ck_assert_int_eq(w[i].errors, 0);
	}
	st = stats(p);
	ck_assert_uint_eq(st.by_state[KVPAGE_FREE], 12);
	kvpool_free(p);
}
END_TEST

static Suite *kvpool_suite(void)
{
	Suite *s = suite_create("kvpool");
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, t_geometry);
	tcase_add_test(tc, t_tag_bytes);
	tcase_add_test(tc, t_lifecycle);
	tcase_add_test(tc, t_release_from_each_state);
	tcase_add_test(tc, t_illegal);
	tcase_add_test(tc, t_all_or_nothing);
	tcase_add_test(tc, t_full_unchanged);
	tcase_add_test(tc, t_fence_defers_release);
	tcase_add_test(tc, t_quarantine_never_reused);
	tcase_add_test(tc, t_grow_shrink);
	tcase_add_test(tc, t_grow_enomem);
	tcase_add_test(tc, t_quarantine_cancels_retiring);
	tcase_add_test(tc, t_stale_bytes_host);
	tcase_add_test(tc, t_stale_bytes_not_host_visible);
	tcase_add_test(tc, t_stale_bytes_batched);
	tcase_add_test(tc, t_zero_tail);
	tcase_add_test(tc, t_zero_tail_checks);
	tcase_add_test(tc, t_kv_finite);
	tcase_add_test(tc, t_cuda_init);
	tcase_add_test(tc, t_threads);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(kvpool_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
