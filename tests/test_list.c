/* test_list.c - conf/list.h against a reference array.
 *
 * Every operation is applied to a list of nodes and to a plain array of
 * their ids in list order; after each step the list is walked forwards
 * and backwards and must hold exactly the array, every node's
 * kvd_list_linked() must say whether the array holds it, and
 * kvd_list_empty() whether the array is empty. Deletion during
 * kvd_list_for_each_safe removes a chosen subset and must visit every
 * node exactly once, in order.
 */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "conf/list.h"

#define N_NODES 32

struct item {
	int id;
	struct kvd_list link;
};

/* A list and its model: ids in list order. */
struct fixture {
	struct kvd_list head;
	struct item items[N_NODES];
	int ref[N_NODES];
	int n_ref;
};

static void fixture_init(struct fixture *f)
{
	kvd_list_init(&f->head);
	for (int i = 0; i < N_NODES; i++) {
		f->items[i].id = i;
		kvd_list_init(&f->items[i].link);
	}
	f->n_ref = 0;
}

static int ref_index(const struct fixture *f, int id)
{
	for (int i = 0; i < f->n_ref; i++)
		if (f->ref[i] == id)
			return i;
	return -1;
}

static void ref_insert(struct fixture *f, int at, int id)
{
	memmove(&f->ref[at + 1], &f->ref[at],
		(size_t)(f->n_ref - at) * sizeof(f->ref[0]));
	f->ref[at] = id;
	f->n_ref++;
}

static void ref_remove(struct fixture *f, int id)
{
	int at = ref_index(f, id);

	if (at < 0)
		return;
	memmove(&f->ref[at], &f->ref[at + 1],
		(size_t)(f->n_ref - at - 1) * sizeof(f->ref[0]));
	f->n_ref--;
}

/* Each operation on the list and on the model together. */
static void op_add(struct fixture *f, int id)
{
	kvd_list_add(&f->head, &f->items[id].link);
	ref_insert(f, 0, id);
}

static void op_add_tail(struct fixture *f, int id)
{
	kvd_list_add_tail(&f->head, &f->items[id].link);
	ref_insert(f, f->n_ref, id);
}

static void op_del(struct fixture *f, int id)
{
	kvd_list_del(&f->items[id].link);
	ref_remove(f, id);
}

/* Where the list and the model first differ, or NULL when they agree
 * (walked forwards and backwards; linked() for every node). Check's
 * asserts cost a system call each, so the walk collects and the caller
 * asserts once. */
static const char *list_diff(const struct fixture *f)
{
	const struct kvd_list *pos;
	int i = 0;

	if (kvd_list_empty(&f->head) != (f->n_ref == 0))
		return "empty() disagrees";
	kvd_list_for_each(pos, &f->head) {
		const struct item *it = kvd_list_entry(pos, struct item, link);

		if (i >= f->n_ref || it->id != f->ref[i])
			return "forward walk differs";
		if (pos->next->prev != pos)
			return "next->prev is not the node";
		i++;
	}
	if (i != f->n_ref)
		return "forward walk too short";
	for (pos = f->head.prev; pos != &f->head; pos = pos->prev) {
		const struct item *it = kvd_list_entry(pos, struct item, link);

		if (i <= 0 || it->id != f->ref[--i])
			return "backward walk differs";
	}
	if (i != 0)
		return "backward walk too short";
	for (int id = 0; id < N_NODES; id++)
		if (kvd_list_linked(&f->items[id].link) != (ref_index(f, id) >= 0))
			return "linked() disagrees";
	return NULL;
}

static void check_same(const struct fixture *f)
{
	const char *why = list_diff(f);

	ck_assert_msg(!why, "list vs model: %s", why);
}

START_TEST(test_empty)
{
	struct kvd_list head = KVD_LIST_INIT(head);
	struct item a = { .id = 1 };
	struct kvd_list *pos, *nxt;
	int visits = 0;

	ck_assert(kvd_list_empty(&head));
	ck_assert(!kvd_list_linked(&head));
	kvd_list_for_each_safe(pos, nxt, &head)
		visits++;
	ck_assert_int_eq(visits, 0);

	kvd_list_init(&a.link);
	ck_assert(!kvd_list_linked(&a.link));
	kvd_list_add(&head, &a.link);
	ck_assert(!kvd_list_empty(&head));
	ck_assert(kvd_list_linked(&a.link));
	ck_assert_ptr_eq(kvd_list_entry(head.next, struct item, link), &a);
	ck_assert_ptr_eq(head.prev, &a.link);
	kvd_list_del(&a.link);
	ck_assert(kvd_list_empty(&head));
	ck_assert(!kvd_list_linked(&a.link));
	/* unlinking twice is harmless and leaves the head alone */
	kvd_list_del(&a.link);
	ck_assert(kvd_list_empty(&head));
	ck_assert_ptr_eq(head.next, &head);
	ck_assert_ptr_eq(head.prev, &head);
}
END_TEST

START_TEST(test_add_order)
{
	struct fixture f;

	fixture_init(&f);
	/* add puts first, add_tail puts last */
	op_add(&f, 1);
	op_add(&f, 0);
	op_add_tail(&f, 2);
	op_add_tail(&f, 3);
	check_same(&f);
	ck_assert_int_eq(f.ref[0], 0);
	ck_assert_int_eq(f.ref[3], 3);
	/* del from the middle, the front and the back, then the last */
	static const int order[] = { 2, 0, 3, 1 };
	for (size_t k = 0; k < KVD_ARRAY_SIZE(order); k++) {
		op_del(&f, order[k]);
		check_same(&f);
	}
}
END_TEST

/* xorshift32: a fixed sequence, so a failure reproduces. */
static uint32_t rnd(uint32_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 17;
	*s ^= *s << 5;
	return *s;
}

START_TEST(test_random_ops)
{
	struct fixture f;
	uint32_t seed = 0x9e3779b9u;

	fixture_init(&f);
	for (int step = 0; step < 20000; step++) {
		int id = (int)(rnd(&seed) % N_NODES);
		uint32_t op = rnd(&seed) % 3;

		if (op == 2)
			op_del(&f, id); /* also when not linked */
		else if (!kvd_list_linked(&f.items[id].link))
			(op ? op_add_tail : op_add)(&f, id);
		check_same(&f);
	}
}
END_TEST

/* Walk with for_each_safe, deleting every node whose id is in `kill`
 * (bit per id), and check the walk saw every node once, in order. */
static void walk_deleting(struct fixture *f, uint32_t kill)
{
	struct kvd_list *pos, *nxt;
	int before[N_NODES], n_before = f->n_ref, i = 0;

	memcpy(before, f->ref, sizeof(before));
	kvd_list_for_each_safe(pos, nxt, &f->head) {
		struct item *it = kvd_list_entry(pos, struct item, link);

		if (i >= n_before || it->id != before[i])
			ck_abort_msg("for_each_safe visit %d: id %d", i, it->id);
		i++;
		if (kill & (1u << it->id)) {
			kvd_list_del(pos);
			ref_remove(f, it->id);
		}
	}
	ck_assert_int_eq(i, n_before);
	check_same(f);
}

START_TEST(test_for_each_safe_delete)
{
	static const uint32_t kills[] = {
		0,                 /* nothing */
		0xffffffffu,       /* everything */
		0x1u,              /* the first node */
		0x80000000u,       /* the last node */
		0x55555555u,       /* every other node */
		0xaaaaaaaau,
		0x0000ffffu,       /* a run at the front */
		0xffff0000u,       /* a run at the back */
	};
	struct fixture f;
	uint32_t seed = 12345;

	for (size_t k = 0; k < KVD_ARRAY_SIZE(kills); k++) {
		fixture_init(&f);
		for (int id = 0; id < N_NODES; id++)
			op_add_tail(&f, id);
		walk_deleting(&f, kills[k]);
		ck_assert_int_eq(f.n_ref,
				 N_NODES - __builtin_popcount(kills[k]));
	}
	/* random subsets of random lists */
	for (int round = 0; round < 500; round++) {
		fixture_init(&f);
		for (int id = 0; id < N_NODES; id++)
			if (rnd(&seed) & 1)
				(rnd(&seed) & 1 ? op_add : op_add_tail)(&f, id);
		walk_deleting(&f, rnd(&seed));
	}
}
END_TEST

int main(void)
{
	Suite *s = suite_create("list");
	TCase *tc = tcase_create("core");
	SRunner *sr;
	int failed;

	tcase_add_test(tc, test_empty);
	tcase_add_test(tc, test_add_order);
	tcase_add_test(tc, test_random_ops);
	tcase_add_test(tc, test_for_each_safe_delete);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
