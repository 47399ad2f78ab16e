/* test_place.c - daemon/node/place.h: where a decode node's prompt runs.
 *
 * The rule is checked against a reference written differently (the two
 * expected waits as long double quotients, on values small enough to be
 * exact), then for the properties the policy promises: off means never,
 * no room for prompts in a step (decoders >= step_tokens) means never, an
 * idle peer always wins, more queued at the peer only ever moves prompts
 * here, more queued here or more decoders only ever move them away, no
 * overflow at the largest counts, and a burst of prompts placed one by one
 * (nothing finishing meanwhile) ends split in the ratio the percentage and
 * the free share of a step state: local / peer tokens -> percent / 100 *
 * (step_tokens - decoders) / step_tokens.
 */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "daemon/node/place.h"

/* wait here: (local + n) / speed; at the peer: peer + n */
static bool ref_local(uint32_t percent, uint32_t budget, uint32_t dec,
		      uint64_t local, uint64_t peer, uint32_t n)
{
	long double speed, here, there;

	if (percent == 0 || percent > 100 || dec >= budget)
		return false;
	speed = (long double)percent / 100.0L * (long double)(budget - dec) / budget;
	here = (long double)(local + n) / speed;
	there = (long double)(peer + n);
	/* the quotients round: decide exact ties by cross-multiplying */
	if (fabsl(here - there) < 1e-6L * there)
		return (local + n) * 100 * budget < (peer + n) * percent * (budget - dec);
	return here < there;
}

/* the static rule: no speed measured yet */
static bool place(uint32_t pc, uint32_t st, uint32_t dec, uint64_t l, uint64_t p,
		  uint32_t n)
{
	return serve_place_local(pc, st, dec, l, p, n, 0, 0);
}

/* the budget of the tests: 64 tokens a step, no decoders */
#define P(pc, l, p, n) place((pc), 64, 0, (l), (p), (n))

START_TEST(test_off_and_idle)
{
	for (uint64_t l = 0; l < 4096; l += 64)
		for (uint64_t p = 0; p < 4096; p += 64) {
			ck_assert(!P(0, l, p, 128));
			ck_assert(!P(101, l, p, 128));
			/* no room for prompts in a step */
			ck_assert(!place(100, 32, 32, l, p, 128));
			ck_assert(!place(100, 32, 40, l, p, 128));
			ck_assert(!place(100, 0, 0, l, p, 128));
		}
	/* an idle peer (nothing of ours queued there) always wins */
	for (uint32_t pc = 1; pc <= 100; pc++)
		for (uint32_t n = 1; n < 5000; n += 97)
			for (uint32_t d = 0; d < 64; d += 7)
				ck_assert_msg(!place(pc, 64, d, 0, 0, n),
					      "pc=%u n=%u decoders=%u", pc, n, d);
	/* one prompt queued at the peer: at 100 percent the second one is
	 * computed here (its wait, n, is shorter than 2n) */
	ck_assert(P(100, 0, 128, 128));
	ck_assert(!P(50, 0, 128, 128));   /* 2n vs 2n: not shorter */
	ck_assert(P(50, 0, 129, 128));
	/* half the step taken by decoders halves the speed here */
	ck_assert(place(100, 64, 0, 0, 129, 128));
	ck_assert(!place(100, 64, 32, 0, 128, 128));
	ck_assert(place(100, 64, 32, 0, 129, 128));
}
END_TEST

START_TEST(test_reference)
{
	uint32_t seed = 12345;

	for (int i = 0; i < 200000; i++) {
		uint32_t pc, n, budget, dec;
		uint64_t l, p;

		seed = seed * 1103515245u + 12345u;
		pc = (seed >> 8) % 102;            /* includes 0 and 101 */
		seed = seed * 1103515245u + 12345u;
		n = 1 + (seed >> 8) % 4096;
		seed = seed * 1103515245u + 12345u;
		l = (seed >> 4) % 70000;
		seed = seed * 1103515245u + 12345u;
		p = (seed >> 4) % 70000;
		seed = seed * 1103515245u + 12345u;
		budget = 1 + (seed >> 8) % 1024;
		seed = seed * 1103515245u + 12345u;
		dec = (seed >> 8) % (budget + 8);  /* includes >= budget */
		ck_assert_msg(place(pc, budget, dec, l, p, n) ==
			      ref_local(pc, budget, dec, l, p, n),
			      "pc=%u budget=%u dec=%u l=%llu p=%llu n=%u", pc, budget, dec,
			      (unsigned long long)l, (unsigned long long)p, n);
	}
}
END_TEST

START_TEST(test_monotonic)
{
	for (uint32_t pc = 10; pc <= 100; pc += 15)
		for (uint32_t d = 0; d < 64; d += 9)
			for (uint64_t l = 0; l < 2048; l += 32)
				for (uint64_t p = 0; p < 4096; p += 32) {
					bool here = place(pc, 64, d, l, p, 100);

					/* more at the peer: never moves a prompt away */
					if (here)
						ck_assert(place(pc, 64, d, l, p + 32, 100));
					/* more here, or more decoders: never moves one here */
					if (!here) {
						ck_assert(!place(pc, 64, d, l + 32, p, 100));
						ck_assert(!place(pc, 64, d + 1, l, p, 100));
					}
				}
}
END_TEST

START_TEST(test_no_overflow)
{
	uint64_t big = (uint64_t)1 << 62;   /* beyond any pool */
	uint32_t st = UINT32_MAX;

	ck_assert(!place(100, st, 0, big, 0, 4096));
	ck_assert(place(100, st, 0, 0, big, 4096));
	ck_assert(!place(100, st, 0, big, big - 1, UINT32_MAX));
	ck_assert(place(100, st, 0, big - 1, big, UINT32_MAX));
	ck_assert(!place(100, st, st - 1, big - 1, big, UINT32_MAX));
}
END_TEST

/* A burst placed one by one: the split converges to the speed ratio. */
START_TEST(test_burst_split)
{
	static const uint32_t pcs[] = { 25, 50, 75, 100 };
	static const uint32_t decs[] = { 0, 16, 48 };

	for (size_t k = 0; k < sizeof(pcs) / sizeof(pcs[0]); k++)
		for (size_t j = 0; j < sizeof(decs) / sizeof(decs[0]); j++) {
			uint64_t local = 0, peer = 0;
			uint32_t n = 128, n_local = 0, total = 600, budget = 64;
			/* here : peer speed, as a fraction num / den */
			uint64_t num = (uint64_t)pcs[k] * (budget - decs[j]), den = 100u * budget;

			for (uint32_t i = 0; i < total; i++) {
				if (place(pcs[k], budget, decs[j], local, peer, n)) {
					local += n;
					n_local++;
				} else {
					peer += n;
				}
			}
			/* local / peer within one prompt of num / den */
			ck_assert_msg(local * den <= num * (peer + n) &&
				      (local + n) * den >= num * peer,
				      "percent %u decoders %u: %llu tokens here, %llu at the peer",
				      pcs[k], decs[j], (unsigned long long)local,
				      (unsigned long long)peer);
			ck_assert_uint_gt(n_local, 0);
			ck_assert_uint_lt(n_local, total);
		}
}
END_TEST

/* Measured speeds replace the static ratio, capped at percent / 100;
 * one unknown speed keeps the static rule. */
START_TEST(test_measured)
{
	/* here half as fast as the peer: local when (L + n) < 0.5 (R + n) */
	ck_assert(!serve_place_local(100, 64, 0, 0, 128, 128, 500, 1000));
	ck_assert(serve_place_local(100, 64, 0, 0, 129, 128, 500, 1000));
	ck_assert(!serve_place_local(100, 64, 0, 100, 300, 128, 500, 1000));
	/* a tenth as fast: a long peer queue is needed */
	ck_assert(!serve_place_local(100, 64, 0, 0, 1100, 128, 100, 1000));
	ck_assert(serve_place_local(100, 64, 0, 0, 1200, 128, 100, 1000));
	/* measured faster than percent allows: capped at percent */
	ck_assert(!serve_place_local(25, 64, 0, 0, 128 * 3 - 1, 128, 5000, 1000));
	ck_assert(serve_place_local(25, 64, 0, 0, 128 * 3 + 1, 128, 5000, 1000));
	/* an idle peer still always wins */
	for (double v = 1; v < 1e6; v *= 3)
		ck_assert(!serve_place_local(100, 64, 0, 0, 0, 128, v, 1000));
	/* decoders filling the step: never */
	ck_assert(!serve_place_local(100, 64, 64, 0, 100000, 128, 1000, 1000));
	/* one speed unknown: the static rule (0.5 here: 2n vs 2n) */
	ck_assert(!serve_place_local(50, 64, 0, 0, 128, 128, 0, 1000));
	ck_assert(!serve_place_local(50, 64, 0, 0, 128, 128, 1000, 0));
	ck_assert(serve_place_local(50, 64, 0, 0, 129, 128, 0, 1000));
	ck_assert(!serve_place_local(0, 64, 0, 0, 100000, 128, 1000, 1));
}
END_TEST

/* The speed estimator: busy time only while tokens were pending, done
 * tokens over it, nothing before PLACE_MIN_TOKENS, a bounded memory. */
START_TEST(test_speed)
{
	struct place_speed q = { 0 };
	uint64_t t = 1000000000ull, ms = 1000000ull;

	ck_assert(place_speed_get(&q) == 0);
	place_speed_observe(&q, t, 256, 0);          /* work arrives */
	place_speed_observe(&q, t + 100 * ms, 128, 128);
	ck_assert(place_speed_get(&q) == 0);        /* 128 < PLACE_MIN_TOKENS */
	place_speed_observe(&q, t + 200 * ms, 0, 128);
	ck_assert(place_speed_get(&q) == 0);        /* 256 */
	/* idle for 10 s: not busy time */
	place_speed_observe(&q, t + 10200 * ms, 512, 0);
	place_speed_observe(&q, t + 10400 * ms, 0, 512);
	/* 768 tokens in 0.4 s busy */
	ck_assert_msg(place_speed_get(&q) > 1919 && place_speed_get(&q) < 1921,
		      "speed %f", place_speed_get(&q));
	/* a long busy stretch at a new speed: the old one fades */
	for (int i = 0; i < 200; i++) {
		uint64_t now = t + 20000 * ms + (uint64_t)i * 100 * ms;

		place_speed_observe(&q, now, 1000, i ? 50 : 0);   /* 500 tok/s */
	}
	ck_assert(q.busy_s <= PLACE_WINDOW_S);
	ck_assert_msg(place_speed_get(&q) > 450 && place_speed_get(&q) < 550,
		      "speed %f after 20 s at 500 tok/s", place_speed_get(&q));
	/* time going backwards (a bad clock) adds nothing */
	{
		double b = q.busy_s;

		place_speed_observe(&q, t, 1000, 0);
		ck_assert(q.busy_s == b);
	}
}
END_TEST

/* place_step_units: the decoders' share rounded up, the prompt budget
 * beside it, and no wrap whatever per_decoder a model file yields. */
START_TEST(test_step_units)
{
	uint32_t st, du;

	place_step_units(40, 10, 1.65, &st, &du);
	ck_assert_uint_eq(du, 17);          /* ceil(16.5) */
	ck_assert_uint_eq(st, 57);
	place_step_units(0, 32, 1.0, &st, &du);
	ck_assert_uint_eq(du, 32);
	ck_assert_uint_eq(st, 32);
	ck_assert(!serve_place_local(100, st, du, 0, 1u << 20, 128, 0, 0));
	/* below 1, NaN: one prompt token a decoder */
	place_step_units(5, 8, 0.2, &st, &du);
	ck_assert_uint_eq(du, 8);
	place_step_units(5, 8, NAN, &st, &du);
	ck_assert_uint_eq(du, 8);
	ck_assert_uint_eq(st, 13);
	/* a huge logits share: saturated, never wrapped */
	place_step_units(1000000, 4096, 1e9, &st, &du);
	ck_assert_uint_eq(du, PLACE_UNITS_MAX);
	ck_assert_uint_eq(st, PLACE_UNITS_MAX);
	ck_assert(!serve_place_local(100, st, du, 0, 1u << 20, 128, 0, 0));
	place_step_units(UINT32_MAX, 4096, (double)PLACE_UNITS_MAX / 8192, &st, &du);
	ck_assert_uint_eq(du, PLACE_UNITS_MAX / 2 + 1);   /* ceil(x.5) */
	ck_assert_uint_eq(st, PLACE_UNITS_MAX);
	ck_assert_uint_ge(st, du);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("place");
	TCase *tc = tcase_create("core");
	SRunner *sr;
	int failed;

	tcase_add_test(tc, test_off_and_idle);
	tcase_add_test(tc, test_reference);
	tcase_add_test(tc, test_monotonic);
	tcase_add_test(tc, test_no_overflow);
	tcase_add_test(tc, test_burst_split);
	tcase_add_test(tc, test_measured);
	tcase_add_test(tc, test_speed);
	tcase_add_test(tc, test_step_units);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
