/* test_kvmem_cuda.c - the KV pool on CUDA device memory (suite 'gpu').
 *
 * Exits 77 (skip) when the build has no CUDA or no device answers
 * cudaGetDeviceCount. Otherwise: allocate device pages through the pool,
 * write tags through the backend, and check whole tables with the batched
 * tag kernel (cuda/kvtag.cu): a good table passes; a corrupted tag, a
 * stale tag left by the previous owner, a tag copied from another page and
 * a swapped table are each reported at the right (lowest) index. The same
 * tables are checked against a host-side reading of the tags to prove the
 * kernel and the host agree.
 *
 * Runs without fork: CUDA is initialised in main and a forked child cannot
 * use it.
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/kv/kvpool.h"

static struct kvmem dev_mem;

/* Realistic geometry: 16 tokens x 22 layers x kv_dim 256 x f16. */
static const struct kvpool_geom geom = {
	.page_tokens = 16, .n_layer = 22, .kv_dim = 256, .dtype = KV_DTYPE_F16,
};

static struct kvpool *pool_new(uint32_t n)
{
	struct kvpool *p = NULL;

	ck_assert_int_eq(kvpool_new(&p, &dev_mem, &geom, n), 0);
	return p;
}

static void tag_put(struct kvpool *p, uint32_t page, const struct kvtag *t)
{
	ck_assert_int_eq(dev_mem.ops->write(dev_mem.ctx,
					    kvpool_page_addr(p, page), t,
					    sizeof(*t)),
			 0);
}

START_TEST(t_backend_roundtrip)
{
	void *d = NULL;
	unsigned char in[4096], out[4096];

	ck_assert_str_eq(dev_mem.ops->name, "cuda");
	ck_assert(!dev_mem.ops->host_visible);
	ck_assert_ptr_nonnull(dev_mem.ops->tags_compare);
	ck_assert_int_eq(dev_mem.ops->alloc(dev_mem.ctx, sizeof(in), &d), 0);
	for (size_t i = 0; i < sizeof(in); i++)
		in[i] = (unsigned char)(i * 7 + 1);
	ck_assert_int_eq(dev_mem.ops->write(dev_mem.ctx, d, in, sizeof(in)), 0);
	memset(out, 0, sizeof(out));
	ck_assert_int_eq(dev_mem.ops->read(dev_mem.ctx, out, d, sizeof(out)),
			 0);
	ck_assert_int_eq(memcmp(in, out, sizeof(in)), 0);
	dev_mem.ops->free(dev_mem.ctx, d, sizeof(in));
}
END_TEST

START_TEST(t_verify_tables)
{
	enum { N = 1000 };
	struct kvpool *p = pool_new(N + 8);
	struct kvpool_ref *t = calloc(N, sizeof(*t));
	uint32_t tokens = N * 16 - 5, bad = 0;
	struct kvtag tag, saved;

	ck_assert_int_eq(kvpool_reserve(p, 77, N, t), 0);
	ck_assert_int_eq(kvpool_fill_begin(p, 77, t, N), 0);
	ck_assert_int_eq(kvpool_tag_write(p, 77, t, N, tokens), 0);
	ck_assert_int_eq(kvpool_mark_ready(p, 77, t, N, tokens), 0);
	ck_assert_int_eq(kvpool_verify(p, 77, t, N, tokens, &bad), 0);

	/* one corrupted tag at 777 */
	ck_assert_int_eq(dev_mem.ops->read(dev_mem.ctx, &saved,
					   kvpool_page_addr(p, t[777].page),
					   sizeof(saved)),
			 0);
	tag = saved;
	tag.tokens ^= 1;
	tag_put(p, t[777].page, &tag);
	ck_assert_int_eq(kvpool_verify(p, 77, t, N, tokens, &bad),
			 KVPOOL_E_TAG);
	ck_assert_uint_eq(bad, 777);
	/* a second one lower down: the lowest index is reported */
	kvtag_make(&tag, 77, t[12].gen, t[13].page, 12, 16);
	tag_put(p, t[12].page, &tag);
	ck_assert_int_eq(kvpool_verify(p, 77, t, N, tokens, &bad),
			 KVPOOL_E_TAG);
	ck_assert_uint_eq(bad, 12);
	/* repair both; the table verifies again */
	tag_put(p, t[777].page, &saved);
	kvtag_make(&tag, 77, t[12].gen, t[12].page, 12, 16);
	tag_put(p, t[12].page, &tag);
	ck_assert_int_eq(kvpool_verify(p, 77, t, N, tokens, NULL), 0);
	/* the last page's tag holds 11 tokens, not 16 */
	ck_assert_int_eq(kvpool_verify(p, 77, t, N, N * 16, &bad),
			 KVPOOL_E_TAG);
	ck_assert_uint_eq(bad, N - 1);
	ck_assert_int_eq(kvpool_release(p, 77, t, N), 0);
	free(t);
	kvpool_free(p);
}
END_TEST

START_TEST(t_stale_bytes_on_device)
{
	struct kvpool *p = pool_new(4);
	struct kvpool_ref a[1], b[1];
	uint32_t bad = 9;

	ck_assert_int_eq(kvpool_reserve(p, 0xA, 1, a), 0);
	ck_assert_int_eq(kvpool_fill_begin(p, 0xA, a, 1), 0);
	ck_assert_int_eq(kvpool_tag_write(p, 0xA, a, 1, 16), 0);
	ck_assert_int_eq(kvpool_mark_ready(p, 0xA, a, 1, 16), 0);
	ck_assert_int_eq(kvpool_release(p, 0xA, a, 1), 0);
	ck_assert_int_eq(kvpool_reserve(p, 0xB, 1, b), 0);
	ck_assert_uint_eq(b[0].page, a[0].page);
	ck_assert_int_eq(kvpool_fill_begin(p, 0xB, b, 1), 0);
	/* B's writer never wrote: A's tag is still in device memory */
	ck_assert_int_eq(kvpool_verify(p, 0xB, b, 1, 16, &bad), KVPOOL_E_TAG);
	ck_assert_uint_eq(bad, 0);
	ck_assert_int_eq(kvpool_mark_ready(p, 0xB, b, 1, 16), KVPOOL_E_TAG);
	ck_assert_int_eq(kvpool_tag_write(p, 0xB, b, 1, 16), 0);
	ck_assert_int_eq(kvpool_mark_ready(p, 0xB, b, 1, 16), 0);
	kvpool_free(p);
}
END_TEST

START_TEST(t_grow_shrink_device)
{
	struct kvpool *p = pool_new(8);
	struct kvpool_ref t[8];
	struct kvpool_stats st;

	ck_assert_int_eq(kvpool_shrink(p, 8, NULL), 0);
	ck_assert_ptr_null(kvpool_page_addr(p, 0));
	ck_assert_int_eq(kvpool_grow(p, 12), 0);
	kvpool_get_stats(p, &st);
	ck_assert_uint_eq(st.pages, 12);
	ck_assert_int_eq(kvpool_reserve(p, 5, 8, t), 0);
	ck_assert_int_eq(kvpool_fill_begin(p, 5, t, 8), 0);
	ck_assert_int_eq(kvpool_tag_write(p, 5, t, 8, 128), 0);
	ck_assert_int_eq(kvpool_verify(p, 5, t, 8, 128, NULL), 0);
	kvpool_free(p);
}
END_TEST

int main(void)
{
	Suite *s;
	TCase *tc;
	SRunner *sr;
	int r, failed;

	/* probe first: nothing of Check's is allocated when we skip */
	r = kvmem_cuda_init(&dev_mem, 0);
	if (r) {
		printf("skip: no CUDA device (%s)\n",
		       r == -ENOTSUP ? "build without CUDA" : strerror(-r));
		return 77;
	}
	s = suite_create("kvmem_cuda");
	tc = tcase_create("device");
	tcase_add_test(tc, t_backend_roundtrip);
	tcase_add_test(tc, t_verify_tables);
	tcase_add_test(tc, t_stale_bytes_on_device);
	tcase_add_test(tc, t_grow_shrink_device);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_set_fork_status(sr, CK_NOFORK);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	kvmem_deinit(&dev_mem);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
