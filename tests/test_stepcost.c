/* test_stepcost.c - gpu/cpu/stepcost.h, the learned step time, and
 * engine_prompt_budget (gpu/engine.h), the rule a step's prompt tokens
 * follow under engine.step_ms.
 *
 * The model is checked on synthetic steps whose time is exactly
 * proportional to their work units: the learned time per unit converges
 * to the true one, small steps (fixed costs) are ignored, the budget is
 * the exact floor of what fits and never negative, and the engine's rule
 * adds the floor that keeps prompts going, the step_tokens cap and "no
 * decoders, no time limit".
 */
#include <check.h>
#include <math.h>
#include <stdint.h>

#include "gpu/engine.h"
#include "gpu/cpu/stepcost.h"

START_TEST(test_ratio)
{
	struct stepcost c;

	/* 4 layers of dim 512 (12.6 M) against 16000 x 512 logits */
	stepcost_init(&c, 12582912, 8192000);
	ck_assert_uint_eq(c.logits_q8, (uint32_t)(8192000.0 / 12582912 * 256 + 0.5));
	ck_assert(c.steps == 0 && c.ns_per_unit == 0);
	/* nothing observed: no limit, no prediction */
	ck_assert_uint_eq(stepcost_prompt_budget(&c, 8, 1000000), UINT32_MAX);
	ck_assert_uint_eq(stepcost_predict_ns(&c, 8, 8), 0);
	/* no layers: the ratio is capped, not a division by zero */
	stepcost_init(&c, 0, 100);
	ck_assert_uint_eq(c.logits_q8, 0);
}
END_TEST

START_TEST(test_learns)
{
	struct stepcost c;
	const double true_ns = 2500.0;   /* per unit */

	stepcost_init(&c, 1000, 500);    /* ratio 0.5: a logits row is 0.5 units */
	/* a tiny step (mostly fixed cost) teaches nothing */
	stepcost_observe(&c, 2, 2, 1000000);
	ck_assert(c.steps == 0);
	for (int i = 0; i < 100; i++) {
		uint32_t tok = 8 + (uint32_t)(i * 37 % 90), out = (uint32_t)(i % 9);
		double u = tok + out * 0.5;

		stepcost_observe(&c, tok, out, (uint64_t)(u * true_ns));
	}
	ck_assert_msg(fabs(c.ns_per_unit - true_ns) < 1e-6 * true_ns,
		      "learned %f ns per unit, true %f", c.ns_per_unit, true_ns);
	/* 10 decoders = 15 units (37500 ns); 100 us leaves 62500 ns = 25 tokens */
	ck_assert_uint_eq(stepcost_prompt_budget(&c, 10, 100000), 25);
	ck_assert_uint_eq(stepcost_prompt_budget(&c, 10, 100000 - 1), 24);
	/* decoders alone over the target: nothing, never negative */
	ck_assert_uint_eq(stepcost_prompt_budget(&c, 100, 100000), 0);
	ck_assert_uint_eq(stepcost_prompt_budget(&c, 0, 0), 0);
	ck_assert_uint_eq(stepcost_predict_ns(&c, 10, 25), 100000);
	/* a slower machine: the mean follows within a few dozen steps */
	for (int i = 0; i < 60; i++)
		stepcost_observe(&c, 64, 0, (uint64_t)(64 * 2 * true_ns));
	ck_assert_msg(fabs(c.ns_per_unit - 2 * true_ns) < 0.01 * true_ns,
		      "after the change: %f", c.ns_per_unit);
	/* a huge target does not overflow the count */
	ck_assert_uint_eq(stepcost_prompt_budget(&c, 0, UINT64_MAX), UINT32_MAX - 1);
}
END_TEST

START_TEST(test_engine_rule)
{
	struct engine_params p = ENGINE_PARAMS_DEFAULT;
	struct stepcost c;

	p.prefill_chunk = 32;
	stepcost_init(&c, 1000, 0);      /* no logits cost: a decoder is a unit */
	for (int i = 0; i < 4; i++)
		stepcost_observe(&c, 100, 0, 100 * 100000);   /* 0.1 ms a unit */
	/* no target: the step's tokens left after the decoders */
	p.step_us = 0;
	ck_assert_uint_eq(engine_prompt_budget(&p, 64, &c, 20), 44);
	ck_assert_uint_eq(engine_prompt_budget(&p, 64, &c, 64), 0);
	ck_assert_uint_eq(engine_prompt_budget(&p, 64, &c, 70), 0);
	/* 5 ms: 50 units, 20 decoders leave 30 */
	p.step_us = 5000;
	ck_assert_uint_eq(engine_prompt_budget(&p, 64, &c, 20), 30);
	/* ... and never more than step_tokens leaves */
	ck_assert_uint_eq(engine_prompt_budget(&p, 40, &c, 20), 20);
	/* decoders over the target: the floor that keeps prompts going */
	ck_assert_uint_eq(engine_prompt_budget(&p, 1000, &c, 60), ENGINE_STEP_MIN_PROMPT);
	p.prefill_chunk = 2;
	ck_assert_uint_eq(engine_prompt_budget(&p, 1000, &c, 60), 2);
	/* no decoders: no time limit */
	ck_assert_uint_eq(engine_prompt_budget(&p, 512, &c, 0), 512);
	/* nothing learned yet: step_tokens only */
	stepcost_init(&c, 1000, 0);
	ck_assert_uint_eq(engine_prompt_budget(&p, 64, &c, 20), 44);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("stepcost");
	TCase *tc = tcase_create("core");
	SRunner *sr;
	int failed;

	tcase_add_test(tc, test_ratio);
	tcase_add_test(tc, test_learns);
	tcase_add_test(tc, test_engine_rule);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
