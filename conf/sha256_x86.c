/* sha256_x86.c - SHA-256 block compression with the x86 SHA extensions.
 *
 * The SHA instructions keep the eight working variables in two registers
 * in a fixed order - ABEF and CDGH, high lane first - rather than the
 * state order a..h, so the state is permuted in before the blocks and out
 * after them. Each SHA256RNDS2 does two rounds: it reads the message words
 * plus round constants (W[t] + K[t], sha256__k) from the low two lanes of its third
 * operand, so a group of four words is two calls, the second on the group
 * shifted down by two lanes. The message schedule is computed four words
 * at a time: for words t..t+3,
 *   W[t] = sigma1(W[t-2]) + W[t-7] + sigma0(W[t-15]) + W[t-16]
 * SHA256MSG1(g-4, g-3) gives W[t-16] + sigma0(W[t-15]) for the four
 * lanes, the W[t-7] terms are the group g-2 shifted by one word with the
 * first word of g-1 (PALIGNR), and SHA256MSG2 adds the sigma1 terms, which
 * depend on words of the group being computed, lane by lane.
 *
 * Written from the FIPS 180-4 definitions and the instruction descriptions
 * in the Intel SDM; sha256_blocks_scalar is the reference it is tested
 * against bit for bit (tests/test_sha256.c). Only called after
 * sha256__have_x86_sha() said the CPU has SHA, SSSE3 and SSE4.1.
 */
#include "conf/sha256.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>

bool sha256__have_x86_sha(void)
{
	unsigned a, b, c, d;

	if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_SSSE3) || !(c & bit_SSE4_1))
		return false;
	if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
		return false;
	return (b & bit_SHA) != 0;
}

__attribute__((target("sha,sse4.1,ssse3")))
void sha256__blocks_x86(uint32_t h[8], const uint8_t *p, size_t n)
{
	/* big-endian words: reverse the bytes of each 32-bit lane */
	const __m128i bswap = _mm_set_epi64x(0x0c0d0e0f08090a0bLL, 0x0405060700010203LL);
	__m128i abef, cdgh, t;

	/* lanes written high to low: h[0..3] loads as DCBA, h[4..7] as HGFE */
	t = _mm_loadu_si128((const __m128i *)&h[0]);
	cdgh = _mm_loadu_si128((const __m128i *)&h[4]);
	t = _mm_shuffle_epi32(t, 0xB1);          /* CDAB */
	cdgh = _mm_shuffle_epi32(cdgh, 0x1B);    /* EFGH */
	abef = _mm_alignr_epi8(t, cdgh, 8);      /* ABEF */
	cdgh = _mm_blend_epi16(cdgh, t, 0xF0);   /* CDGH */

	for (; n; n--, p += 64) {
		__m128i w[4], m, abef0 = abef, cdgh0 = cdgh;

		for (int g = 0; g < 16; g++) {
			if (g < 4) {
				w[g] = _mm_shuffle_epi8(
					_mm_loadu_si128((const __m128i *)(p + 16 * g)), bswap);
			} else {
				__m128i x = _mm_sha256msg1_epu32(w[g & 3], w[(g + 1) & 3]);

				x = _mm_add_epi32(x, _mm_alignr_epi8(w[(g + 3) & 3],
								     w[(g + 2) & 3], 4));
				w[g & 3] = _mm_sha256msg2_epu32(x, w[(g + 3) & 3]);
			}
			m = _mm_add_epi32(w[g & 3], _mm_load_si128((const __m128i *)&sha256__k[4 * g]));
			cdgh = _mm_sha256rnds2_epu32(cdgh, abef, m);
			m = _mm_shuffle_epi32(m, 0x0E);
			abef = _mm_sha256rnds2_epu32(abef, cdgh, m);
		}
		abef = _mm_add_epi32(abef, abef0);
		cdgh = _mm_add_epi32(cdgh, cdgh0);
	}

	t = _mm_shuffle_epi32(abef, 0x1B);       /* FEBA */
	cdgh = _mm_shuffle_epi32(cdgh, 0xB1);    /* DCHG */
	abef = _mm_blend_epi16(t, cdgh, 0xF0);   /* DCBA: h[0..3] */
	cdgh = _mm_alignr_epi8(cdgh, t, 8);      /* HGFE: h[4..7] */
	_mm_storeu_si128((__m128i *)&h[0], abef);
	_mm_storeu_si128((__m128i *)&h[4], cdgh);
}
#else
bool sha256__have_x86_sha(void)
{
	return false;
}

void sha256__blocks_x86(uint32_t h[8], const uint8_t *p, size_t n)
{
	(void)h; (void)p; (void)n;
}
#endif
