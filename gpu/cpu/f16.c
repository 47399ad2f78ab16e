/* f16.c - IEEE half <-> float, bit for bit, in plain C: the weight and
 * KV conversions every kernel table shares (gpu/cpu/ops_cpu.c, gpu/cpu/ops_kq.c)
 * and what the model generator's quantizer needs; no CPU feature checks,
 * so the fuzz builds link it alone. Declared in gpu/cpu/ops_cpu.h.
 */
#include "gpu/cpu/ops_cpu.h"

#include <string.h>

/* ---- half precision, scalar ---------------------------------------------- */

float ops_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000) << 16;
	uint32_t exp = (h >> 10) & 0x1f;
	uint32_t man = h & 0x3ff;
	uint32_t bits;
	float f;

	if (exp == 0) {
		if (man == 0) {
			bits = sign;
		} else {
			/* subnormal: normalise the mantissa */
			int e = -1;

			do {
				e++;
				man <<= 1;
			} while (!(man & 0x400));
			bits = sign | ((uint32_t)(127 - 15 - e) << 23) |
			       ((man & 0x3ff) << 13);
		}
	} else if (exp == 31) {
		bits = sign | 0x7f800000u | (man << 13);
	} else {
		bits = sign | ((exp + 112) << 23) | (man << 13);
	}
	memcpy(&f, &bits, sizeof(f));
	return f;
}

uint16_t ops_f32_to_f16(float f)
{
	uint32_t x, ax, sign, r, rem;

	memcpy(&x, &f, sizeof(x));
	sign = (x >> 16) & 0x8000;
	ax = x & 0x7fffffffu;
	if (ax >= 0x7f800000u) /* inf or NaN (NaN stays quiet NaN) */
		return (uint16_t)(sign | 0x7c00 |
				  (ax > 0x7f800000u ? 0x200 | ((ax >> 13) & 0x3ff) : 0));
	if (ax >= 0x477ff000u) /* rounds past 65504 */
		return (uint16_t)(sign | 0x7c00);
	if (ax < 0x38800000u) { /* below 2^-14: half subnormal or zero */
		uint32_t e = ax >> 23, m, shift, half;

		if (ax < 0x33000000u) /* below 2^-25: rounds to zero */
			return (uint16_t)sign;
		m = (ax & 0x7fffff) | 0x800000;
		shift = 126 - e;
		r = m >> shift;
		rem = m & ((1u << shift) - 1);
		half = 1u << (shift - 1);
		if (rem > half || (rem == half && (r & 1)))
			r++;
		return (uint16_t)(sign | r);
	}
	r = (ax >> 13) - (112u << 10);
	rem = ax & 0x1fff;
	if (rem > 0x1000 || (rem == 0x1000 && (r & 1)))
		r++; /* a carry into the exponent is the right answer */
	return (uint16_t)(sign | r);
}
