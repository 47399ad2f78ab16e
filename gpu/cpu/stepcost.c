/* stepcost.c - the step time model (see stepcost.h). */
#include "gpu/cpu/stepcost.h"

#include <math.h>

void stepcost_init(struct stepcost *c, uint64_t layer_macs, uint64_t logits_macs)
{
	double r = layer_macs ? (double)logits_macs / (double)layer_macs : 0.0;

	if (r > 1e6)
		r = 1e6;
	c->logits_q8 = (uint32_t)(r * 256.0 + 0.5);
	c->ns_per_unit = 0.0;
	c->steps = 0;
}

static double units_of(const struct stepcost *c, uint32_t tokens, uint32_t outputs)
{
	return (double)tokens + (double)outputs * (double)c->logits_q8 / 256.0;
}

void stepcost_observe(struct stepcost *c, uint32_t tokens, uint32_t outputs,
		      uint64_t ns)
{
	double u = units_of(c, tokens, outputs), x;

	if (u < STEPCOST_MIN_UNITS)
		return;
	x = (double)ns / u;
	if (c->steps == 0)
		c->ns_per_unit = x;
	else
		c->ns_per_unit += (x - c->ns_per_unit) / 8.0;
	c->steps++;
}

uint32_t stepcost_prompt_budget(const struct stepcost *c, uint32_t n_dec,
				uint64_t target_ns)
{
	double fit;

	if (c->steps == 0 || !(c->ns_per_unit > 0.0))
		return UINT32_MAX;
	fit = (double)target_ns / c->ns_per_unit - units_of(c, n_dec, n_dec);
	if (!(fit > 0.0))
		return 0;
	if (fit >= (double)UINT32_MAX - 1.0)
		return UINT32_MAX - 1;
	return (uint32_t)floor(fit);
}

uint64_t stepcost_predict_ns(const struct stepcost *c, uint32_t n_dec,
			     uint32_t n_prompt)
{
	if (c->steps == 0)
		return 0;
	return (uint64_t)(c->ns_per_unit * units_of(c, n_dec + n_prompt, n_dec));
}
