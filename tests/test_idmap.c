/* test_idmap.c - conf/idmap: the intrusive hash map keyed by uint64 id.
 *
 * A reference model (a plain array of slots, each either in the map under
 * an id or not, found by a linear scan) runs side by side with the map
 * through tens of thousands of random inserts, removes and finds, in
 * phases that fill the map (so the bucket array grows several times),
 * churn it, and empty it. Ids come from three sources: sequential (the
 * registry's case), random 64-bit, and ids that differ only in their
 * high bits. After every step the count must match; every few steps every
 * live id must be found as its own node, every removed id must not be,
 * and the chains must be consistent (each node in the bucket its id
 * hashes to - checked by finding it - with pprev pointing at the pointer
 * that points at it, and exactly n nodes over all buckets).
 *
 * The same run is repeated with max_buckets capped at the inline buckets
 * (as if every growth had found no memory): chains of hundreds, and every
 * removal in the middle of one.
 *
 * Seed: KVD_SEED, else the time; printed in the failure message.
 */
#include <check.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "conf/idmap.h"
#include "conf/util.h"

#define SLOTS 1500

struct slot {
	struct kvd_idmap_node node;
	uint64_t id;
	bool in;
};

struct model {
	struct kvd_idmap m;
	struct slot s[SLOTS];
	size_t n;
	uint64_t rng;
	uint64_t seed;
	uint64_t next_seq;
	uint64_t step;
	/* outcomes seen, so a run that never exercised one fails */
	uint64_t inserts, removes, hits, misses, grows;
};

static uint64_t rnd(struct model *t)
{
	/* splitmix64 */
	uint64_t z = (t->rng += 0x9E3779B97F4A7C15ull);

	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

#define CHECK(t, cond) \
	ck_assert_msg((cond), "seed=%" PRIu64 " step=%" PRIu64 ": %s", \
		      (t)->seed, (t)->step, #cond)

static struct slot *model_find(struct model *t, uint64_t id)
{
	for (size_t i = 0; i < SLOTS; i++)
		if (t->s[i].in && t->s[i].id == id)
			return &t->s[i];
	return NULL;
}

static uint64_t fresh_id(struct model *t)
{
	uint64_t id;

	do {
		switch (rnd(t) % 3) {
		case 0:
			id = t->next_seq++;
			break;
		case 1:
			id = rnd(t);
			break;
		default:   /* same low bits, different high bits */
			id = (rnd(t) % 64) << 40 | 7;
			break;
		}
	} while (model_find(t, id));
	return id;
}

/* The whole structure against the model. */
static void check_all(struct model *t)
{
	size_t nb = (size_t)1 << t->m.bits, seen = 0;

	CHECK(t, t->m.n == t->n);
	for (size_t b = 0; b < nb; b++) {
		struct kvd_idmap_node **pp = &t->m.b[b];

		for (struct kvd_idmap_node *n = *pp; n; pp = &n->next, n = n->next) {
			struct slot *s = kvd_container_of(n, struct slot, node);

			CHECK(t, n->pprev == pp);
			CHECK(t, s >= t->s && s < t->s + SLOTS);
			CHECK(t, s->in && n->id == s->id);
			seen++;
		}
	}
	CHECK(t, seen == t->n);
	for (size_t i = 0; i < SLOTS; i++) {
		struct kvd_idmap_node *n = kvd_idmap_find(&t->m, t->s[i].id);

		if (t->s[i].in)
			CHECK(t, n == &t->s[i].node);
		else
			CHECK(t, !n || kvd_container_of(n, struct slot, node)->in);
	}
}

static void op_insert(struct model *t)
{
	size_t i = rnd(t) % SLOTS;
	unsigned bits = t->m.bits;

	if (t->s[i].in)
		return;
	t->s[i].id = fresh_id(t);
	kvd_idmap_insert(&t->m, &t->s[i].node, t->s[i].id);
	t->s[i].in = true;
	t->n++;
	t->inserts++;
	if (t->m.bits != bits)
		t->grows++;
	CHECK(t, kvd_idmap_find(&t->m, t->s[i].id) == &t->s[i].node);
}

static void op_remove(struct model *t)
{
	size_t i = rnd(t) % SLOTS;

	if (!t->s[i].in)
		return;
	kvd_idmap_remove(&t->m, &t->s[i].node);
	t->s[i].in = false;
	t->n--;
	t->removes++;
	CHECK(t, kvd_idmap_find(&t->m, t->s[i].id) == NULL);
}

static void op_find(struct model *t)
{
	uint64_t id = rnd(t) % 2 ? t->s[rnd(t) % SLOTS].id : rnd(t) % (t->next_seq + 8);
	struct slot *want = model_find(t, id);
	struct kvd_idmap_node *got = kvd_idmap_find(&t->m, id);

	CHECK(t, got == (want ? &want->node : NULL));
	if (got)
		t->hits++;
	else
		t->misses++;
}

/* One run: phases of (insert weight, remove weight) out of 10, each
 * `len` steps: fill, churn, drain, fill again, churn. */
static void run(struct model *t, size_t max_buckets)
{
	static const struct { int ins, rem; } phases[] = {
		{ 9, 1 }, { 5, 5 }, { 1, 9 }, { 9, 1 }, { 5, 5 }, { 0, 10 },
	};
	const uint64_t len = 8000;

	kvd_idmap_init(&t->m);
	t->m.max_buckets = max_buckets;
	for (size_t p = 0; p < KVD_ARRAY_SIZE(phases); p++) {
		for (uint64_t k = 0; k < len; k++, t->step++) {
			int w = (int)(rnd(t) % 12);

			if (w < phases[p].ins)
				op_insert(t);
			else if (w < phases[p].ins + phases[p].rem)
				op_remove(t);
			else
				op_find(t);
			CHECK(t, t->m.n == t->n);
			if (t->step % 499 == 0)
				check_all(t);
		}
		check_all(t);
	}
	kvd_idmap_deinit(&t->m);
	kvd_idmap_deinit(&t->m);   /* safe twice */
}

static struct model *model_new(void)
{
	struct model *t = calloc(1, sizeof(*t));
	const char *e = getenv("KVD_SEED");

	ck_assert_ptr_nonnull(t);
	t->seed = e ? strtoull(e, NULL, 10) : (uint64_t)time(NULL);
	t->rng = t->seed;
	t->next_seq = 1;
	return t;
}

START_TEST(test_model_growing)
{
	struct model *t = model_new();

	run(t, 0);
	/* the map filled to hundreds of entries and emptied again */
	ck_assert_uint_ge(t->grows, 5);
	ck_assert_uint_ge(t->inserts, 2000);
	ck_assert_uint_ge(t->removes, 2000);
	ck_assert_uint_gt(t->hits, 0);
	ck_assert_uint_gt(t->misses, 0);
	ck_assert_uint_eq(t->m.grow_failed, 0);
	free(t);
}
END_TEST

START_TEST(test_model_no_growth)
{
	struct model *t = model_new();

	run(t, KVD_IDMAP_INLINE);
	ck_assert_uint_eq(t->grows, 0);
	ck_assert_uint_ge(t->inserts, 2000);
	free(t);
}
END_TEST

/* grow: rounds up to a power of two, never shrinks, respects the cap,
 * and keeps every entry; 1,000 sequential ids then spread over a
 * 1,024-bucket array with no long chain. */
START_TEST(test_grow)
{
	static struct kvd_idmap_node nodes[1000];
	struct kvd_idmap m;
	size_t longest = 0;

	kvd_idmap_init(&m);
	ck_assert_uint_eq((size_t)1 << m.bits, KVD_IDMAP_INLINE);
	for (uint64_t i = 0; i < 1000; i++)
		kvd_idmap_insert(&m, &nodes[i], i + 1);
	ck_assert_uint_eq((size_t)1 << m.bits, 1024);
	ck_assert_int_eq(kvd_idmap_grow(&m, 3000), 0);
	ck_assert_uint_eq((size_t)1 << m.bits, 4096);
	ck_assert_int_eq(kvd_idmap_grow(&m, 10), 0);
	ck_assert_uint_eq((size_t)1 << m.bits, 4096);
	m.max_buckets = 6000;
	ck_assert_int_eq(kvd_idmap_grow(&m, 100000), 0);
	ck_assert_uint_eq((size_t)1 << m.bits, 4096);
	m.max_buckets = 0;
	ck_assert_int_eq(kvd_idmap_grow(&m, 1024), 0);
	for (uint64_t i = 0; i < 1000; i++)
		ck_assert_ptr_eq(kvd_idmap_find(&m, i + 1), &nodes[i]);
	ck_assert_ptr_null(kvd_idmap_find(&m, 0));
	ck_assert_ptr_null(kvd_idmap_find(&m, 1001));
	for (size_t b = 0; b < ((size_t)1 << m.bits); b++) {
		size_t len = 0;

		for (struct kvd_idmap_node *n = m.b[b]; n; n = n->next)
			len++;
		longest = KVD_MAX(longest, len);
	}
	ck_assert_uint_le(longest, 4);
	kvd_idmap_deinit(&m);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("idmap");
	TCase *tc = tcase_create("idmap");
	SRunner *sr;
	int nf;

	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_model_growing);
	tcase_add_test(tc, test_model_no_growth);
	tcase_add_test(tc, test_grow);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	nf = srunner_ntests_failed(sr);
	srunner_free(sr);
	return nf ? EXIT_FAILURE : EXIT_SUCCESS;
}
