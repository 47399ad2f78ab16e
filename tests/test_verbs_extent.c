/* test_verbs_extent.c - the stale-tail rule over RDMA: the extents of a
 * partly filled page cover exactly the tag and positions [0, tokens) of
 * every K/V block (checked byte by byte against the layout in
 * gpu/kv/kvpool.h), a full page is one extent without the padding, and bad
 * counts are refused. */
#include <check.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/gguf/gguf.h"
#include "net/verbs/verbs_extent.h"

/* Mark the bytes the layout says positions [0, tokens) and the tag own. */
static void expected(const struct kvpool_geom *g, uint32_t tokens, uint8_t *m)
{
	uint64_t tb = (uint64_t)g->kv_dim * kv_dtype_size(g->dtype);
	uint64_t block = g->page_tokens * tb;

	memset(m, 1, KVTAG_BYTES);
	for (uint32_t l = 0; l < g->n_layer; l++)
		for (int kv = 0; kv < 2; kv++)
			memset(m + KVTAG_BYTES + (2 * l + (uint32_t)kv) * block, 1,
			       tokens * tb);
}

START_TEST(test_extents_cover_filled_bytes)
{
	const struct kvpool_geom geoms[] = {
		{ .page_tokens = 16, .n_layer = 2, .kv_dim = 8, .dtype = KV_DTYPE_F16 },
		{ .page_tokens = 4, .n_layer = 5, .kv_dim = 3, .dtype = KV_DTYPE_F32 },
		{ .page_tokens = 1, .n_layer = 1, .kv_dim = 1, .dtype = KV_DTYPE_F16 },
	};

	for (size_t gi = 0; gi < sizeof(geoms) / sizeof(geoms[0]); gi++) {
		const struct kvpool_geom *g = &geoms[gi];
		uint64_t pb = kvpool_page_bytes(g);
		uint8_t *want = calloc(1, pb), *got = calloc(1, pb);
		struct verbs_extent ex[64];

		ck_assert_ptr_nonnull(want);
		ck_assert_ptr_nonnull(got);
		for (uint32_t t = 1; t <= g->page_tokens; t++) {
			int n = verbs_extent_page(g, t, ex, 64);

			ck_assert_int_eq(n, (int)verbs_extent_count(g, t));
			ck_assert_int_eq(n, t == g->page_tokens ? 1 : (int)(2 * g->n_layer));
			memset(want, 0, pb);
			memset(got, 0, pb);
			expected(g, t, want);
			for (int i = 0; i < n; i++) {
				ck_assert_uint_le(ex[i].offset + ex[i].length, pb);
				ck_assert_uint_gt(ex[i].length, 0);
				if (i)   /* ascending, disjoint, not adjacent */
					ck_assert_uint_gt(ex[i].offset,
							  ex[i - 1].offset + ex[i - 1].length);
				for (uint64_t b = 0; b < ex[i].length; b++)
					got[ex[i].offset + b]++;
			}
			ck_assert_msg(memcmp(want, got, pb) == 0,
				      "geometry %zu tokens %u: extents differ from the layout",
				      gi, t);
		}
		free(want);
		free(got);
	}
}
END_TEST

START_TEST(test_extents_refused)
{
	const struct kvpool_geom g = { .page_tokens = 16, .n_layer = 3,
				       .kv_dim = 8, .dtype = KV_DTYPE_F16 };
	const struct kvpool_geom bad = { .page_tokens = 16, .n_layer = 0,
					 .kv_dim = 8, .dtype = KV_DTYPE_F16 };
	struct verbs_extent ex[8];

	ck_assert_int_eq(verbs_extent_page(&g, 0, ex, 8), -EINVAL);
	ck_assert_int_eq(verbs_extent_page(&g, 17, ex, 8), -EINVAL);
	ck_assert_uint_eq(verbs_extent_count(&g, 0), 0);
	ck_assert_uint_eq(verbs_extent_count(&g, 17), 0);
	ck_assert_int_eq(verbs_extent_page(&bad, 1, ex, 8), -EINVAL);
	/* 6 extents needed: 5 slots are refused and nothing is written */
	memset(ex, 0xab, sizeof(ex));
	ck_assert_int_eq(verbs_extent_page(&g, 3, ex, 5), -ENOSPC);
	ck_assert_uint_eq(ex[0].offset, 0xababababababababull);
	ck_assert_int_eq(verbs_extent_page(&g, 3, ex, 6), 6);
	ck_assert_int_eq(verbs_extent_page(&g, 16, ex, 1), 1);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("verbs_extent");
	TCase *tc = tcase_create("core");
	SRunner *sr;
	int failed;

	tcase_add_test(tc, test_extents_cover_filled_bytes);
	tcase_add_test(tc, test_extents_refused);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
