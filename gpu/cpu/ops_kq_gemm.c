/* ops_kq_gemm.c - K-quant (Q2_K .. Q6_K) matmul tiles for the avx512vnni
 * table: sixteen weight rows x up to four tokens, on weights repacked at
 * backend start; and the AVX-512 Q8_K activation quantizer.
 *
 * The dot kernels of ops_kq.c take one row against one token: per
 * 256-weight block they unpack the row's quants, multiply 64 at a time
 * (maddubs + vpdpwssd), then reduce a zmm of int32 to one sum, build the
 * min sum, and call ops_kq_combine - the reduction and the per-block
 * scalar tail cost more than the multiplies, and prefill paid them once
 * per (row, token, block). Here the lanes are rows instead: sixteen rows
 * are interleaved so that int32 lane r of a 64-byte weight vector holds
 * four consecutive quants of row r, and vpdpbusd against the token's
 * four activation bytes broadcast (an embedded {1to16} load) sums them
 * into lane r. No reduction at all: after a sub-block (Q4_K, Q5_K: 32
 * weights) or group (Q2_K, Q3_K, Q6_K: 16) each lane holds that row's exact integer
 * sum, which vpmulld scales by the row's sub-block scale and adds to the
 * block sum; the block tail (min sum, float combine) runs once per token
 * for sixteen rows at a time. Each unpacked weight vector serves up to
 * four tokens. Decode (one token) runs the same tile: four to ten times
 * the dot kernel's rate from cache, so it stays bound by memory.
 *
 * Memory: the copy is about the file's size (Q2_K +19%, Q3_K +4%, Q4_K
 * and Q5_K +3%, Q6_K +0%); the file's pages are then only read for rows
 * outside whole groups.
 *
 * Bits (invariant 9). Per (row, token) the block's isum and msum are the
 * exact integers of the scalar reference, and the float tail is its
 * ops_kq_combine, op for op: (dx * d) * (float)isum - (dx * dmin) *
 * (float)msum, added to the row's accumulator block after block from 0.
 * The multiplies and subtractions are the _round intrinsics (builtins
 * GCC never contracts into an FMA, as it may the plain vector operators).
 * So a value has the same bits as the table's dot_kq of that row and
 * token, whether it came from a tile, from the dot (rows outside a full
 * group of sixteen), alone or batched.
 *
 * Repacked layouts (per group of 16 rows r, per 256-weight block, the
 * groups one after another, each group's blocks in order):
 *
 * Q4_K, 2368 bytes (the file's 16 x 144 = 2304, plus 64):
 *   [0, 2048)     quants: for sub-block s < 8, step k < 4: 64 bytes,
 *                 byte 4r + i = q(32s + 8k + i) | q(32s + 8k + 4 + i) << 4
 *   [2048, 2176)  scales: byte 16s + r = sc of sub-block s (0..63)
 *   [2176, 2304)  mins: for pair p < 4: bytes 32p + 2r + {0, 1} = mn of
 *                 sub-blocks 2p, 2p + 1 (int16 pairs after widening)
 *   [2304, 2336)  d of row r (half), [2336, 2368) dmin of row r (half)
 * Q5_K, 2880 bytes (the file's 16 x 176 = 2816, plus 64): Q4_K's layout
 *   with the fifth bits inserted after the quants: [2048, 2560) for
 *   sub-block s 64 bytes, byte 4r + i bit 2k (2k + 1) = bit 4 of the
 *   quant in the low (high) nibble of step k's byte 4r + i; scales, mins,
 *   d and dmin follow, each 512 bytes later than in Q4_K
 * Q6_K, 3360 bytes (the file's size): q stored + 32 (u = 0..63)
 *   [0, 3072)     for group g < 16 (weights 16g ..), 192 bytes: byte
 *                 4r + i of [0, 64) = u(step 0) & 15 | (u(step 1) & 15) << 4,
 *                 of [64, 128) the same for steps 2 and 3, of [128, 192)
 *                 the high bits u >> 4 of step s at bits 2s, 2s + 1;
 *                 step s's weight is 16g + 4s + i
 *   [3072, 3328)  scales: byte 16g + r = sc of group g (int8)
 *   [3328, 3360)  d of row r (half)
 * Q2_K, 1600 bytes (the file's 1344, plus 256): q = 0..3
 *   [0, 1024)     for group g: 64 bytes, byte 4r + i bits 2s, 2s + 1 = q of
 *                 weight 16g + 4s + i
 *   [1024, 1280)  scales: byte 16g + r (0..15)
 *   [1280, 1536)  mins: for pair p < 8: bytes 32p + 2r + {0, 1} = mn of
 *                 groups 2p, 2p + 1
 *   [1536, 1568)  d, [1568, 1600) dmin of row r (halves)
 * Q3_K, 1824 bytes (the file's 1760, plus 64): u = q + 4 = 0..7
 *   [0, 1024)     the two low bits as Q2_K's
 *   [1024, 1536)  for groups 2p, 2p + 1: 64 bytes, byte 4r + i bit s (bit
 *                 4 + s) = bit 2 of u of step s of group 2p (2p + 1)
 *   [1536, 1792)  scales: byte 16g + r (int8, -32..31)
 *   [1792, 1824)  d of row r (half)
 * The offsets of Q3_K and Q6_K (4, 32) are taken out by starting each
 * group's lane sum at -offset * bsums[g] of the token, so the lane ends at
 * sum q * x exactly.
 */
#include "gpu/cpu/ops_gemm.h"

#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#define KQG_AVX512                                                          \
	__attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512dq,"    \
			      "avx512vl,avx512vnni")))
#define KQG_BODY KQG_AVX512 static inline __attribute__((always_inline))

#define KQG_R 16         /* rows per group */
#define KQG_T 4          /* tokens per tile */
#define Q4KP_BLOCK 2368  /* repacked Q4_K bytes per group and block */
#define Q5KP_BLOCK 2880  /* Q5_K: Q4_K's plus 512 bytes of fifth bits */
#define Q5KP_H 512       /* offset of Q5_K's scales .. dmin past Q4_K's */
#define Q6KP_BLOCK 3360  /* repacked Q6_K bytes per group and block */
#define Q2KP_BLOCK 1600  /* Q2_K */
#define Q3KP_BLOCK 1824  /* Q3_K */

size_t ops_kqg__packed_bytes(enum ggml_type t, uint32_t rows, uint32_t cols)
{
	size_t per = t == GGML_TYPE_Q2_K ? Q2KP_BLOCK
		   : t == GGML_TYPE_Q3_K ? Q3KP_BLOCK
		   : t == GGML_TYPE_Q4_K ? Q4KP_BLOCK
		   : t == GGML_TYPE_Q5_K ? Q5KP_BLOCK
		   : t == GGML_TYPE_Q6_K ? Q6KP_BLOCK : 0;

	return (size_t)(rows / KQG_R) * (cols / OPS_QK_K) * per;
}

/* ---- repacking -------------------------------------------------------- */

/* Straight from the file's bytes (layouts in gpu/README.md), eight
 * quants per 64-bit word: a Q4_K sub-block s's 32 quants are nibble s % 2
 * of qs[32 (s / 2) ..], so word k (quants 8k .. 8k + 7) gives the packed
 * dword of step k as its low half | its high half << 4. */
static uint64_t ld64(const uint8_t *p)
{
	uint64_t v;

	memcpy(&v, p, 8);
	return v;
}

static void st32(uint8_t *p, uint64_t v)
{
	uint32_t u = (uint32_t)v;

	memcpy(p, &u, 4);
}

/* Q5_K's fifth bit of weight 32s + l is bit s of qh[l]. */
static void pack_q45_k(const uint8_t *blk, int r, uint8_t *p, bool q5)
{
	const uint8_t *sc = blk + 4, *qh = blk + 16, *qs = blk + (q5 ? 48 : 16);
	const uint64_t m4 = 0x0f0f0f0f0f0f0f0full, m1 = 0x0101010101010101ull;
	size_t h = q5 ? Q5KP_H : 0;

	for (int s = 0; s < 8; s++) {
		uint64_t hb = 0;
		int scv, mnv;

		for (int k = 0; k < 4; k++) {
			uint64_t n = (ld64(qs + 32 * (s / 2) + 8 * k) >> (4 * (s % 2))) & m4;
			uint64_t v = (ld64(qh + 8 * k) >> s) & m1;

			st32(p + (4 * s + k) * 64 + 4 * r, n | (n >> 32) << 4);
			hb |= (uint32_t)v << (2 * k) | (uint32_t)(v >> 32) << (2 * k + 1);
		}
		if (q5)
			st32(p + 2048 + 64 * s + 4 * r, hb);
		if (s < 4) {
			scv = sc[s] & 63;
			mnv = sc[s + 4] & 63;
		} else {
			scv = (sc[s + 4] & 15) | (sc[s - 4] >> 6) << 4;
			mnv = (sc[s + 4] >> 4) | (sc[s] >> 6) << 4;
		}
		p[h + 2048 + 16 * s + r] = (uint8_t)scv;
		p[h + 2176 + 32 * (s / 2) + 2 * r + s % 2] = (uint8_t)mnv;
	}
	memcpy(p + h + 2304 + 2 * r, blk, 2);     /* d */
	memcpy(p + h + 2336 + 2 * r, blk + 2, 2); /* dmin */
}

/* Q6_K group g (weights 16g ..) lies in half n = g / 8, span k = g % 8
 * / 2, at l = 16 (g % 2): low bits nibble k / 2 of ql[64n + 32 (k % 2) +
 * l ..], high bits 2k, 2k + 1 of qh[32n + l ..]; the stored 6-bit value
 * is already q + 32. */
static void pack_q6_k(const uint8_t *blk, int r, uint8_t *p)
{
	const uint8_t *ql = blk, *qh = blk + 128;
	const int8_t *sc = (const int8_t *)(blk + 192);
	const uint64_t m4 = 0x0f0f0f0f0f0f0f0full, m2 = 0x0303030303030303ull;

	for (int g = 0; g < 16; g++) {
		int n = g / 8, k = g % 8 / 2, l = 16 * (g % 2);
		const uint8_t *lo = ql + 64 * n + 32 * (k % 2) + l, *hi = qh + 32 * n + l;
		uint64_t a = (ld64(lo) >> (4 * (k / 2))) & m4;
		uint64_t b = (ld64(lo + 8) >> (4 * (k / 2))) & m4;
		uint64_t ha = (ld64(hi) >> (2 * k)) & m2, hb = (ld64(hi + 8) >> (2 * k)) & m2;
		uint8_t *pg = p + 192 * g + 4 * r;

		st32(pg, a | (a >> 32) << 4);       /* steps 0, 1 */
		st32(pg + 64, b | (b >> 32) << 4);  /* steps 2, 3 */
		st32(pg + 128, ha | (ha >> 32) << 2 | hb << 4 | (hb >> 32) << 6);
		p[3072 + 16 * g + r] = (uint8_t)sc[g];
	}
	memcpy(p + 3328 + 2 * r, blk + 208, 2); /* d */
}

/* Q2_K / Q3_K group g (weights 16g ..) lies in half n = g / 8, span j =
 * g % 8 / 2, at l = 16 (g % 2): two bits 2j of qs[32n + l ..]; Q3_K's
 * third bit is bit 4n + j of hmask[l ..]. Step s's byte 4r + i takes
 * quants 4s + i of the group, at bits 2s (and bit s + 4 (g % 2) of the
 * pair's high-bit vector). */
static uint32_t g16_gather2(uint64_t a, uint64_t b, int w)
{
	return (uint32_t)a | (uint32_t)(a >> 32) << w | (uint32_t)b << 2 * w |
	       (uint32_t)(b >> 32) << 3 * w;
}

static void pack_q23_k(const uint8_t *blk, int r, uint8_t *p, bool q3)
{
	const uint8_t *qs = blk + (q3 ? 32 : 16), *hm = blk;
	const uint64_t m2 = 0x0303030303030303ull, m1 = 0x0101010101010101ull;

	for (int g = 0; g < 16; g++) {
		int n = g / 8, j = g % 8 / 2, l = 16 * (g % 2);
		const uint8_t *q = qs + 32 * n + l;

		st32(p + 64 * g + 4 * r, g16_gather2((ld64(q) >> 2 * j) & m2,
						      (ld64(q + 8) >> 2 * j) & m2, 2));
		if (q3) {
			uint8_t *ph = p + 1024 + 64 * (g / 2) + 4 * r;
			uint32_t hb = g16_gather2((ld64(hm + l) >> (4 * n + j)) & m1,
						  (ld64(hm + l + 8) >> (4 * n + j)) & m1, 1);
			uint32_t old = 0;

			if (g % 2)
				memcpy(&old, ph, 4);
			st32(ph, old | hb << 4 * (g % 2));
		}
	}
	if (q3) {
		const uint8_t *sc = blk + 96;

		for (int i = 0; i < 16; i++) {
			int lo = i < 8 ? sc[i] & 15 : sc[i - 8] >> 4;
			int hi = (sc[8 + i % 4] >> (2 * (i / 4))) & 3;

			p[1536 + 16 * i + r] = (uint8_t)(int8_t)((lo | hi << 4) - 32);
		}
		memcpy(p + 1792 + 2 * r, blk + 108, 2); /* d */
		return;
	}
	for (int g = 0; g < 16; g++) {
		p[1024 + 16 * g + r] = blk[g] & 15;
		p[1280 + 32 * (g / 2) + 2 * r + g % 2] = blk[g] >> 4;
	}
	memcpy(p + 1536 + 2 * r, blk + 80, 2); /* d */
	memcpy(p + 1568 + 2 * r, blk + 82, 2); /* dmin */
}

void ops_kqg__pack(const struct ops_mat *w, void *out)
{
	size_t per = ops_kqg__packed_bytes(w->type, KQG_R, OPS_QK_K);
	size_t bb = ops_kq_block_bytes(w->type);
	uint32_t nb = w->cols / OPS_QK_K;

	/* each source row read once, front to back (one stream), into the
	 * group's blocks (in cache: nb x per bytes) */
	for (uint32_t g = 0; g < w->rows / KQG_R; g++)
		for (int r = 0; r < KQG_R; r++)
			for (uint32_t b = 0; b < nb; b++) {
				uint8_t *p = (uint8_t *)out + ((size_t)g * nb + b) * per;
				const uint8_t *blk = (const uint8_t *)w->data +
						     (size_t)(g * KQG_R + (uint32_t)r) * w->row_bytes +
						     b * bb;

				if (w->type == GGML_TYPE_Q6_K)
					pack_q6_k(blk, r, p);
				else if (w->type == GGML_TYPE_Q2_K || w->type == GGML_TYPE_Q3_K)
					pack_q23_k(blk, r, p, w->type == GGML_TYPE_Q3_K);
				else
					pack_q45_k(blk, r, p, w->type == GGML_TYPE_Q5_K);
			}
}

/* ---- tiles -------------------------------------------------------------- */

/* The first token tile of a group (`pf`) fetches ahead: the lines of the
 * block two blocks on (the next group's, past a group's end: the groups
 * lie one after another), as the dot kernels do 2 KiB ahead - the one
 * sequential stream decode reads. Later token tiles find the group in L1. */
KQG_BODY void kqg_prefetch(const uint8_t *p, size_t block)
{
	for (size_t o = 0; o < block; o += 64)
		_mm_prefetch((const char *)p + 2 * block + o, _MM_HINT_T0);
}

/* ops_kq_combine for sixteen rows, op for op (see top). */
KQG_BODY __m512 kqg_combine(__m512 dx, __m512 d, __m512 dmin, __m512i isum,
			    __m512i msum)
{
	const int rc = _MM_FROUND_CUR_DIRECTION;
	__m512 a = _mm512_mul_round_ps(_mm512_mul_round_ps(dx, d, rc),
				       _mm512_cvtepi32_ps(isum), rc);
	__m512 b = _mm512_mul_round_ps(_mm512_mul_round_ps(dx, dmin, rc),
				       _mm512_cvtepi32_ps(msum), rc);

	return _mm512_sub_round_ps(a, b, rc);
}

/* acc + vpdpbusd(w, the four activation bytes at p in every int32
 * lane), the broadcast folded into the instruction's {1to16} memory
 * operand (GCC does not fold it for vpdpbusd by itself). */
KQG_BODY __m512i dpb_bcast(__m512i acc, __m512i w, const int8_t *p)
{
	__asm__("vpdpbusd %2%{1to16%}, %1, %0"
		: "+v"(acc)
		: "v"(w), "m"(*(const int32_t(*)[1])(const void *)p));
	return acc;
}

/* y[t * ys + r] for the group's 16 rows and tokens t < T; x[t] the
 * tokens' Q8_K rows. */
/* Bit 2k + j of each byte of hb (j = 0, 1) moved to bit 4, the rest of
 * the byte clear: one 16-bit shift (the bits it carries across bytes
 * never reach bit 4) and the mask in the caller's ternary logic. */
KQG_BODY __m512i kqg_bit4(__m512i hb, int k, int j)
{
	int sh = 4 - 2 * k - j;

	return sh >= 0 ? _mm512_slli_epi16(hb, (unsigned)sh)
		       : _mm512_srli_epi16(hb, (unsigned)-sh);
}

/* Sub-block s of Q4_K's (Q5_K's when Q5) block p for tokens t < T:
 * is[t] += sc[s] * (the lanes' sums of the 32 quants times x[t]'s).
 * hb: the sub-block's fifth bits (Q5). */
KQG_BODY void q45_sub(const uint8_t *p, int s, __m512i sc, __m512i hb,
		      const struct ops_block_q8_k *const *x, uint32_t b,
		      const int T, const bool Q5, __m512i *is)
{
	const __m512i m4 = _mm512_set1_epi8(0x0f);
	const __m512i m10 = _mm512_set1_epi8(0x10);
	/* two chains per token (low / high nibbles), so that 2T
	 * independent vpdpbusd chains hide its latency */
	__m512i sa[KQG_T], sb[KQG_T];

#pragma GCC unroll 4
	for (int t = 0; t < T; t++)
		sa[t] = sb[t] = _mm512_setzero_si512();
#pragma GCC unroll 4
	for (int k = 0; k < 4; k++) {
		__m512i v = _mm512_loadu_si512(p + (4 * s + k) * 64);
		__m512i lo = _mm512_and_si512(v, m4);
		__m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);

		if (Q5) { /* 0xf8: a | (b & c) */
			lo = _mm512_ternarylogic_epi32(lo, kqg_bit4(hb, k, 0), m10, 0xf8);
			hi = _mm512_ternarylogic_epi32(hi, kqg_bit4(hb, k, 1), m10, 0xf8);
		}

#pragma GCC unroll 4
		for (int t = 0; t < T; t++) {
			const int8_t *xq = x[t][b].qs + 32 * s + 8 * k;

			sa[t] = dpb_bcast(sa[t], lo, xq);
			sb[t] = dpb_bcast(sb[t], hi, xq + 4);
		}
	}
#pragma GCC unroll 4
	for (int t = 0; t < T; t++)
		is[t] = _mm512_add_epi32(is[t], _mm512_mullo_epi32(
			_mm512_add_epi32(sa[t], sb[t]), sc));
}

/* The min sum of a Q4_K / Q5_K block for one token: each row's
 * sum over sub-blocks of mn * the token's sub-block sum (bsums: its
 * sixteen 16-weight sums); mins: the block's mins (offset 2176 + h). */
KQG_BODY __m512i q45_mins(const uint8_t *mins, const int16_t *bs)
{
	/* int32 lane q: sums of sub-blocks 2q | 2q + 1 << 16 */
	int32_t pr[4];
	__m512i ms = _mm512_setzero_si512();

	_mm_storeu_si128((__m128i *)pr,
		_mm_hadd_epi16(_mm_loadu_si128((const __m128i *)bs),
			       _mm_loadu_si128((const __m128i *)(bs + 8))));
#pragma GCC unroll 4
	for (int q = 0; q < 4; q++) {
		__m512i mn = _mm512_cvtepu8_epi16(
			_mm256_loadu_si256((const __m256i *)(mins + 32 * q)));

		ms = _mm512_dpwssd_epi32(ms, mn, _mm512_set1_epi32(pr[q]));
	}
	return ms;
}

/* Q4_K, and Q5_K when Q5 (the fifth bits or'd in as 16). */
KQG_BODY void tile_q45_k(const uint8_t *pw, uint32_t nb,
			 const struct ops_block_q8_k *const *x, float *y,
			 size_t ys, const int T, const bool pf, const bool Q5)
{
	const size_t h = Q5 ? Q5KP_H : 0;
	__m512 acc[KQG_T];

#pragma GCC unroll 4
	for (int t = 0; t < T; t++)
		acc[t] = _mm512_setzero_ps();
	for (uint32_t b = 0; b < nb; b++) {
		const uint8_t *p = pw + (size_t)b * (Q5 ? Q5KP_BLOCK : Q4KP_BLOCK);

		if (pf)
			kqg_prefetch(p, Q5 ? Q5KP_BLOCK : Q4KP_BLOCK);
		__m512i is[KQG_T];
		__m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + h + 2304)));
		__m512 dm = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + h + 2336)));

#pragma GCC unroll 4
		for (int t = 0; t < T; t++)
			is[t] = _mm512_setzero_si512();
#pragma GCC unroll 1
		for (int s = 0; s < 8; s++) {
			__m512i sc = _mm512_cvtepu8_epi32(
				_mm_loadu_si128((const __m128i *)(p + h + 2048 + 16 * s)));
			__m512i hb = Q5 ? _mm512_loadu_si512(p + 2048 + 64 * s)
					: _mm512_setzero_si512();

			q45_sub(p, s, sc, hb, x, b, T, Q5, is);
		}
#pragma GCC unroll 4
		for (int t = 0; t < T; t++) {
			__m512i ms = q45_mins(p + h + 2176, x[t][b].bsums);

			acc[t] = _mm512_add_round_ps(acc[t],
				kqg_combine(_mm512_set1_ps(x[t][b].d), d, dm, is[t], ms),
				_MM_FROUND_CUR_DIRECTION);
		}
	}
#pragma GCC unroll 4
	for (int t = 0; t < T; t++)
		_mm512_storeu_ps(y + (size_t)t * ys, acc[t]);
}

/* The group-of-16 types (Q2_K, Q3_K, Q6_K; KIND 2, 3, 6): step s (< 4)
 * of group g as unsigned bytes u (Q2_K: q; Q3_K: q + 4; Q6_K: q + 32). */
KQG_BODY void kqg_g16_steps(const uint8_t *p, int g, const int KIND, __m512i *u)
{
	const __m512i m4 = _mm512_set1_epi8(0x0f), m3 = _mm512_set1_epi8(0x03);

	if (KIND == 6) {
		const uint8_t *pg = p + 192 * g;
		const __m512i m30 = _mm512_set1_epi8(0x30);
		__m512i v0 = _mm512_loadu_si512(pg);
		__m512i v1 = _mm512_loadu_si512(pg + 64);
		__m512i h = _mm512_loadu_si512(pg + 128);

		/* low nibble | high bits << 4 (0xf8: a | (b & c)) */
		u[0] = _mm512_ternarylogic_epi32(_mm512_and_si512(v0, m4),
						 _mm512_slli_epi16(h, 4), m30, 0xf8);
		u[1] = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(v0, 4), m4),
						 _mm512_slli_epi16(h, 2), m30, 0xf8);
		u[2] = _mm512_ternarylogic_epi32(_mm512_and_si512(v1, m4), h, m30, 0xf8);
		u[3] = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(v1, 4), m4),
						 _mm512_srli_epi16(h, 2), m30, 0xf8);
		return;
	}
	/* Q2_K, Q3_K: two bits per step at bits 2s; Q3_K's third bit of
	 * step s at bit s + 4 (g % 2) of the pair's high-bit vector */
	__m512i v = _mm512_loadu_si512(p + 64 * g);

	u[0] = _mm512_and_si512(v, m3);
	u[1] = _mm512_and_si512(_mm512_srli_epi16(v, 2), m3);
	u[2] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m3);
	u[3] = _mm512_and_si512(_mm512_srli_epi16(v, 6), m3);
	if (KIND == 3) {
		const __m512i m04 = _mm512_set1_epi8(0x04);
		__m512i h = _mm512_loadu_si512(p + 1024 + 64 * (g / 2));

		for (int st = 0; st < 4; st++) {
			int sh = st + 4 * (g % 2) - 2; /* to bit 2 */
			__m512i hs = sh >= 0 ? _mm512_srli_epi16(h, (unsigned)sh)
					     : _mm512_slli_epi16(h, (unsigned)-sh);

			u[st] = _mm512_ternarylogic_epi32(u[st], hs, m04, 0xf8);
		}
	}
}

/* Offsets in a group-of-16 type's repacked block: scales (int8 or u8,
 * byte 16g + r), mins (Q2_K: pairs, bytes 32p + 2r + {0, 1} = mn of
 * groups 2p, 2p + 1), d (and dmin). */
#define G16_SC(K) ((K) == 6 ? 3072 : (K) == 3 ? 1536 : 1024)
#define G16_MN(K) 1280
#define G16_D(K) ((K) == 6 ? 3328 : (K) == 3 ? 1792 : 1536)
#define G16_BLOCK(K) ((K) == 6 ? Q6KP_BLOCK : (K) == 3 ? Q3KP_BLOCK : Q2KP_BLOCK)

KQG_BODY void tile_g16(const uint8_t *pw, uint32_t nb,
		       const struct ops_block_q8_k *const *x, float *y,
		       size_t ys, const int T, const bool pf, const int KIND)
{
	/* offset of u: each group's lane sums start at -off * bsums[g] */
	const int32_t off = KIND == 6 ? 32 : KIND == 3 ? 4 : 0;
	__m512 acc[KQG_T];

#pragma GCC unroll 4
	for (int t = 0; t < T; t++)
		acc[t] = _mm512_setzero_ps();
	for (uint32_t b = 0; b < nb; b++) {
		const uint8_t *p = pw + (size_t)b * G16_BLOCK(KIND);

		if (pf)
			kqg_prefetch(p, G16_BLOCK(KIND));
		__m512i is[KQG_T];
		__m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + G16_D(KIND))));
		__m512 dm = KIND == 2 ? _mm512_cvtph_ps(_mm256_loadu_si256(
						(const __m256i *)(p + G16_D(KIND) + 32)))
				      : _mm512_setzero_ps();

#pragma GCC unroll 4
		for (int t = 0; t < T; t++)
			is[t] = _mm512_setzero_si512();
#pragma GCC unroll 1
		for (int g = 0; g < 16; g++) {
			const __m128i scb = _mm_loadu_si128((const __m128i *)(p + G16_SC(KIND) + 16 * g));
			__m512i sc = KIND == 2 ? _mm512_cvtepu8_epi32(scb) : _mm512_cvtepi8_epi32(scb);
			__m512i u[4];

			kqg_g16_steps(p, g, KIND, u);
#pragma GCC unroll 4
			for (int t = 0; t < T; t++) {
				const int8_t *xq = x[t][b].qs + 16 * g;
				__m512i sa = _mm512_set1_epi32(-off * (int32_t)x[t][b].bsums[g]);
				__m512i sb = _mm512_setzero_si512();

				sa = dpb_bcast(sa, u[0], xq);
				sb = dpb_bcast(sb, u[1], xq + 4);
				sa = dpb_bcast(sa, u[2], xq + 8);
				sb = dpb_bcast(sb, u[3], xq + 12);
				is[t] = _mm512_add_epi32(is[t], _mm512_mullo_epi32(
					_mm512_add_epi32(sa, sb), sc));
			}
		}
#pragma GCC unroll 4
		for (int t = 0; t < T; t++) {
			__m512i ms = _mm512_setzero_si512();

			if (KIND == 2) {
				/* int32 lane q of bsums: groups 2q | 2q + 1 << 16 */
				int32_t pr[8];

				memcpy(pr, x[t][b].bsums, sizeof(pr));
#pragma GCC unroll 8
				for (int q = 0; q < 8; q++)
					ms = _mm512_dpwssd_epi32(ms, _mm512_cvtepu8_epi16(
						_mm256_loadu_si256((const __m256i *)(p + G16_MN(KIND) + 32 * q))),
						_mm512_set1_epi32(pr[q]));
			}
			acc[t] = _mm512_add_round_ps(acc[t],
				kqg_combine(_mm512_set1_ps(x[t][b].d), d, dm, is[t], ms),
				_MM_FROUND_CUR_DIRECTION);
		}
	}
#pragma GCC unroll 4
	for (int t = 0; t < T; t++)
		_mm512_storeu_ps(y + (size_t)t * ys, acc[t]);
}

KQG_BODY void tile_q2_k(const uint8_t *pw, uint32_t nb,
			const struct ops_block_q8_k *const *x, float *y,
			size_t ys, const int T, const bool pf)
{
	tile_g16(pw, nb, x, y, ys, T, pf, 2);
}

KQG_BODY void tile_q3_k(const uint8_t *pw, uint32_t nb,
			const struct ops_block_q8_k *const *x, float *y,
			size_t ys, const int T, const bool pf)
{
	tile_g16(pw, nb, x, y, ys, T, pf, 3);
}

KQG_BODY void tile_q6_k(const uint8_t *pw, uint32_t nb,
			const struct ops_block_q8_k *const *x, float *y,
			size_t ys, const int T, const bool pf)
{
	tile_g16(pw, nb, x, y, ys, T, pf, 6);
}

/* One function per token count, so the loops over t unroll and the
 * per-token values stay in registers. */
#define KQG_SHAPES(TILE)                                                       \
KQG_AVX512 static void TILE##_n(const uint8_t *pw, uint32_t nb,                \
				const struct ops_block_q8_k *const *x,         \
				float *y, size_t ys, int T, bool pf)           \
{                                                                              \
	switch (T) {                                                           \
	case 4: TILE(pw, nb, x, y, ys, 4, pf); break;                          \
	case 3: TILE(pw, nb, x, y, ys, 3, pf); break;                          \
	case 2: TILE(pw, nb, x, y, ys, 2, pf); break;                          \
	default: TILE(pw, nb, x, y, ys, 1, pf); break;                         \
	}                                                                      \
}
KQG_BODY void tile_q4_k(const uint8_t *pw, uint32_t nb,
			const struct ops_block_q8_k *const *x, float *y,
			size_t ys, const int T, const bool pf)
{
	tile_q45_k(pw, nb, x, y, ys, T, pf, false);
}

KQG_BODY void tile_q5_k(const uint8_t *pw, uint32_t nb,
			const struct ops_block_q8_k *const *x, float *y,
			size_t ys, const int T, const bool pf)
{
	tile_q45_k(pw, nb, x, y, ys, T, pf, true);
}

KQG_SHAPES(tile_q2_k)
KQG_SHAPES(tile_q3_k)
KQG_SHAPES(tile_q4_k)
KQG_SHAPES(tile_q5_k)
KQG_SHAPES(tile_q6_k)

/* Rows [r0, r1): the whole groups of sixteen inside it from the repacked
 * copy, every token four at a time; the rows before the first and after
 * the last whole group (a thread's range need not fall on a group
 * boundary, a matrix's row count need not be a multiple of 16) through
 * the table's dot, which gives the same bits. */
KQG_AVX512 bool ops_kqg__matmul(const struct ops_mat *w, const void *act,
				size_t act_stride, uint32_t n, float *y,
				size_t y_stride, uint32_t r0, uint32_t r1)
{
	void (*tile)(const uint8_t *, uint32_t, const struct ops_block_q8_k *const *,
		     float *, size_t, int, bool);
	ops_kq_dot_fn dot = ops_kq_dot_avx512vnni[ops_kq_index(w->type)];
	uint32_t nb = w->cols / OPS_QK_K;
	size_t per;
	uint32_t g0 = (r0 + KQG_R - 1) / KQG_R, g1 = r1 / KQG_R;
	const uint8_t *a = act;

	if (!w->packed)
		return false;
	if (w->type == GGML_TYPE_Q2_K) {
		tile = tile_q2_k_n;
		per = Q2KP_BLOCK;
	} else if (w->type == GGML_TYPE_Q3_K) {
		tile = tile_q3_k_n;
		per = Q3KP_BLOCK;
	} else if (w->type == GGML_TYPE_Q4_K) {
		tile = tile_q4_k_n;
		per = Q4KP_BLOCK;
	} else if (w->type == GGML_TYPE_Q5_K) {
		tile = tile_q5_k_n;
		per = Q5KP_BLOCK;
	} else if (w->type == GGML_TYPE_Q6_K) {
		tile = tile_q6_k_n;
		per = Q6KP_BLOCK;
	} else {
		return false;
	}
	if (g1 < g0)
		g1 = g0; /* no whole group: every row through the dot */
	for (uint32_t r = r0; r < r1; r++) {
		if (r == g0 * KQG_R && g1 > g0) {
			r = g1 * KQG_R - 1;
			continue;
		}
		for (uint32_t i = 0; i < n; i++)
			y[(size_t)i * y_stride + r] =
				dot((const uint8_t *)w->data + (size_t)r * w->row_bytes,
				    (const void *)(a + (size_t)i * act_stride), w->cols);
	}
	for (uint32_t g = g0; g < g1; g++) {
		const uint8_t *pw = (const uint8_t *)w->packed + (size_t)g * nb * per;

		for (uint32_t i = 0; i < n; i += KQG_T) {
			int T = n - i >= KQG_T ? KQG_T : (int)(n - i);
			const struct ops_block_q8_k *x[KQG_T];

			for (int t = 0; t < KQG_T; t++)
				x[t] = (const void *)(a + (size_t)(i + (uint32_t)(t < T ? t : 0)) *
							  act_stride);
			tile(pw, nb, x, y + (size_t)i * y_stride + (size_t)g * KQG_R,
			     y_stride, T, i == 0);
		}
	}
	return true;
}

/* ---- Q4_0 in groups of 16 rows ------------------------------------------ */

/* The same scheme for Q4_0 (32 weights per block, one half scale): per
 * group of 16 rows and block, 256 bytes of quants (vector k < 4, byte
 * 4r + i = u(8k + i) | u(8k + 4 + i) << 4, u the stored nibble w + 8)
 * then the 16 rows' d (halves): 288 bytes, the file's 16 x 18. The rows
 * past the last whole group follow in the file's layout, so the copy
 * holds every row and the file is not read again.
 *
 * Per (row, token) and block the exact integer s = sum (u - 8) x (lane
 * sums started at -8 * sum x), then acc = fma((float)s, d_w * d_x, acc),
 * block after block from 0: the tile does it for 16 rows at once, the
 * one-row dots (decode of the rows outside whole groups, the unpacked
 * file layout, and the table's dot_q4_0 / dot3_q4_0) op for op, so every
 * path gives the same bits. */
#define Q4R_BLOCK 288

/* sum of the 32 activation bytes of a block (exact) */
KQG_BODY int32_t q4r_xsum(const struct ops_block_q8_act *x)
{
	__m256i s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(1),
					_mm256_loadu_si256((const __m256i *)x->qs));
	__m128i r = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));

	r = _mm_add_epi32(r, _mm_shuffle_epi32(r, 0x4e));
	r = _mm_add_epi32(r, _mm_shuffle_epi32(r, 0xb1));
	return _mm_cvtsi128_si32(r);
}

/* s = sum (u - 8) x for u the block's 32 nibbles in element order */
KQG_BODY int32_t q4r_bsum(__m256i u, const struct ops_block_q8_act *x)
{
	__m256i s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), u,
					_mm256_loadu_si256((const __m256i *)x->qs));
	__m128i r = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));

	r = _mm_add_epi32(r, _mm_shuffle_epi32(r, 0x4e));
	r = _mm_add_epi32(r, _mm_shuffle_epi32(r, 0xb1));
	return _mm_cvtsi128_si32(r) - 8 * q4r_xsum(x);
}

KQG_BODY float q4r_step(float acc, int32_t s, float dw, float dx)
{
	return _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss((float)s), _mm_set_ss(dw * dx),
					  _mm_set_ss(acc)));
}

/* One row in the file's layout against one token. */
KQG_AVX512 float ops_kqg__dot_q4_0(const struct ops_block_q4_0 *w,
				   const struct ops_block_q8_act *x, uint32_t n)
{
	float acc = 0.0f;

	for (uint32_t b = 0; b < n / 32; b++) {
		__m128i q = _mm_loadu_si128((const __m128i *)w[b].qs);
		__m256i u = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q),
					     _mm256_set1_epi8(0x0f));

		acc = q4r_step(acc, q4r_bsum(u, x + b), _cvtsh_ss(w[b].d), x[b].d);
	}
	return acc;
}

KQG_AVX512 void ops_kqg__dot3_q4_0(const struct ops_block_q4_0 *w,
				   const struct ops_block_q8_act *x, size_t xs,
				   uint32_t n, float *out)
{
	for (int t = 0; t < 3; t++)
		out[t] = ops_kqg__dot_q4_0(w, x + (size_t)t * xs, n);
}

/* Row r (< 16) of a repacked group against one token. */
KQG_AVX512 static float q4r_dot_packed(const uint8_t *pw, int r, uint32_t nb,
				       const struct ops_block_q8_act *x)
{
	const __m128i m4 = _mm_set1_epi8(0x0f);
	float acc = 0.0f;

	for (uint32_t b = 0; b < nb; b++) {
		const uint8_t *p = pw + (size_t)b * Q4R_BLOCK + 4 * r;
		int32_t v[4];
		uint16_t d;
		__m128i q, lo, hi;

		for (int k = 0; k < 4; k++)
			memcpy(&v[k], p + 64 * k, 4);
		q = _mm_loadu_si128((const __m128i *)v);
		lo = _mm_and_si128(q, m4);                    /* 0..3, 8..11, .. */
		hi = _mm_and_si128(_mm_srli_epi16(q, 4), m4); /* 4..7, 12..15, .. */
		memcpy(&d, pw + (size_t)b * Q4R_BLOCK + 256 + 2 * r, 2);
		acc = q4r_step(acc, q4r_bsum(_mm256_set_m128i(_mm_unpackhi_epi32(lo, hi),
							      _mm_unpacklo_epi32(lo, hi)), x + b),
			       _cvtsh_ss(d), x[b].d);
	}
	return acc;
}

/* xs: NULL, or token t's block sums at xs[t * nb + b] (computed once per
 * pass of tokens by the caller instead of once per group here). */
KQG_BODY void tile_q4r(const uint8_t *pw, uint32_t nb,
		       const struct ops_block_q8_act *const *x, const int32_t *xs,
		       float *y, size_t ys, const int T, const bool pf)
{
	const __m512i m4 = _mm512_set1_epi8(0x0f);
	__m512 acc[KQG_T];

#pragma GCC unroll 4
	for (int t = 0; t < T; t++)
		acc[t] = _mm512_setzero_ps();
	for (uint32_t b = 0; b < nb; b++) {
		const uint8_t *p = pw + (size_t)b * Q4R_BLOCK;
		__m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 256)));
		__m512i sa[KQG_T], sb[KQG_T];

		if (pf)
			kqg_prefetch(p, Q4R_BLOCK);
#pragma GCC unroll 4
		for (int t = 0; t < T; t++) {
			sa[t] = _mm512_set1_epi32(-8 * (xs ? xs[(size_t)t * nb + b]
							    : q4r_xsum(x[t] + b)));
			sb[t] = _mm512_setzero_si512();
		}
#pragma GCC unroll 4
		for (int k = 0; k < 4; k++) {
			__m512i v = _mm512_loadu_si512(p + 64 * k);
			__m512i lo = _mm512_and_si512(v, m4);
			__m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);

#pragma GCC unroll 4
			for (int t = 0; t < T; t++) {
				const int8_t *xq = x[t][b].qs + 8 * k;

				sa[t] = dpb_bcast(sa[t], lo, xq);
				sb[t] = dpb_bcast(sb[t], hi, xq + 4);
			}
		}
#pragma GCC unroll 4
		for (int t = 0; t < T; t++)
			acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(sa[t], sb[t])),
						 _mm512_mul_ps(dw, _mm512_set1_ps(x[t][b].d)),
						 acc[t]);
	}
#pragma GCC unroll 4
	for (int t = 0; t < T; t++)
		_mm512_storeu_ps(y + (size_t)t * ys, acc[t]);
}

KQG_AVX512 static void tile_q4r_n(const uint8_t *pw, uint32_t nb,
				  const struct ops_block_q8_act *const *x,
				  const int32_t *xs, float *y, size_t ys, int T,
				  bool pf)
{
	switch (T) {
	case 4: tile_q4r(pw, nb, x, xs, y, ys, 4, pf); break;
	case 3: tile_q4r(pw, nb, x, xs, y, ys, 3, pf); break;
	case 2: tile_q4r(pw, nb, x, xs, y, ys, 2, pf); break;
	default: tile_q4r(pw, nb, x, xs, y, ys, 1, pf); break;
	}
}

/* Tokens per pass of the Q4_0 matmul: as many as have their block sums
 * in Q4R_XS_INTS on the stack (32 KiB), a multiple of the tile's 4. A
 * pass multiplies every whole group by its tokens, so fewer tokens per
 * pass re-read the groups; below Q4R_XS_MIN tokens per pass the tiles
 * sum the blocks themselves instead, in one pass. */
#define Q4R_XS_INTS 8192
#define Q4R_XS_MIN 32

size_t ops_kqg__q4_0_packed_bytes(uint32_t rows, uint32_t cols)
{
	return (size_t)rows * (cols / 32) * sizeof(struct ops_block_q4_0);
}

void ops_kqg__pack_q4_0(const struct ops_mat *w, void *out)
{
	const uint64_t m4 = 0x0f0f0f0f0f0f0f0full;
	uint32_t nb = w->cols / 32, ng = w->rows / KQG_R;
	uint8_t *tail = (uint8_t *)out + (size_t)ng * nb * Q4R_BLOCK;

	for (uint32_t g = 0; g < ng; g++)
		for (uint32_t b = 0; b < nb; b++) {
			uint8_t *p = (uint8_t *)out + ((size_t)g * nb + b) * Q4R_BLOCK;

			for (int r = 0; r < KQG_R; r++) {
				const struct ops_block_q4_0 *blk = (const void *)
					((const uint8_t *)w->data +
					 (size_t)(g * KQG_R + (uint32_t)r) * w->row_bytes) ;

				blk += b;
				/* vector k: elements 8k .. 8k + 7 are nibble k / 2 of
				 * qs[8 (k % 2) ..] */
				for (int k = 0; k < 4; k++) {
					uint64_t n4 = (ld64(blk->qs + 8 * (k % 2)) >> (4 * (k / 2))) & m4;

					st32(p + 64 * k + 4 * r, n4 | (n4 >> 32) << 4);
				}
				memcpy(p + 256 + 2 * r, &blk->d, 2);
			}
		}
	memcpy(tail, (const uint8_t *)w->data + (size_t)ng * KQG_R * w->row_bytes,
	       (size_t)(w->rows - ng * KQG_R) * w->row_bytes);
}

/* ops_matmul_rows for Q4_0 on the avx512vnni table: whole groups inside
 * [r0, r1) through the tile, the other rows through the one-row dots -
 * from the copy when there is one (a group's row, or the tail), else
 * from the file. */
KQG_AVX512 void ops_kqg__matmul_q4_0(const struct ops_mat *w, const void *act,
				     size_t act_stride, uint32_t n, float *y,
				     size_t y_stride, uint32_t r0, uint32_t r1)
{
	uint32_t nb = w->cols / 32, ng = w->packed ? w->rows / KQG_R : 0;
	uint32_t g0 = (r0 + KQG_R - 1) / KQG_R, g1 = r1 / KQG_R;
	const uint8_t *a = act, *pk = w->packed;

	if (g1 > ng)
		g1 = ng;
	if (g1 < g0)
		g1 = g0;
	for (uint32_t r = r0; r < r1; r++) {
		if (r == g0 * KQG_R && g1 > g0) {
			r = g1 * KQG_R - 1;
			continue;
		}
		for (uint32_t i = 0; i < n; i++) {
			const struct ops_block_q8_act *x = (const void *)(a + (size_t)i * act_stride);
			float v;

			if (r < ng * KQG_R)
				v = q4r_dot_packed(pk + (size_t)(r / KQG_R) * nb * Q4R_BLOCK,
						   (int)(r % KQG_R), nb, x);
			else
				v = ops_kqg__dot_q4_0((const void *)
					(pk ? pk + (size_t)ng * nb * Q4R_BLOCK +
						      (size_t)(r - ng * KQG_R) * w->row_bytes
					    : (const uint8_t *)w->data + (size_t)r * w->row_bytes),
					x, w->cols);
			y[(size_t)i * y_stride + r] = v;
		}
	}
	if (g1 == g0)
		return;
	uint32_t tc = (uint32_t)(Q4R_XS_INTS / (nb ? nb : 1)) & ~(uint32_t)(KQG_T - 1);
	bool cache = tc >= Q4R_XS_MIN || tc >= n;
	int32_t xs[Q4R_XS_INTS];

	if (!cache)
		tc = n;
	for (uint32_t i0 = 0; i0 < n; i0 += tc) {
		uint32_t i1 = n - i0 < tc ? n : i0 + tc;

		if (cache)
			for (uint32_t i = i0; i < i1; i++)
				for (uint32_t b = 0; b < nb; b++)
					xs[(size_t)(i - i0) * nb + b] = q4r_xsum(
						(const struct ops_block_q8_act *)(const void *)
						(a + (size_t)i * act_stride) + b);
		for (uint32_t g = g0; g < g1; g++) {
			const uint8_t *pw = pk + (size_t)g * nb * Q4R_BLOCK;

			for (uint32_t i = i0; i < i1; i += KQG_T) {
				int T = i1 - i >= KQG_T ? KQG_T : (int)(i1 - i);
				const struct ops_block_q8_act *x[KQG_T];

				for (int t = 0; t < KQG_T; t++)
					x[t] = (const void *)(a + (size_t)(i + (uint32_t)(t < T ? t : 0)) *
								  act_stride);
				tile_q4r_n(pw, nb, x, cache ? xs + (size_t)(i - i0) * nb : NULL,
					   y + (size_t)i * y_stride + (size_t)g * KQG_R,
					   y_stride, T, i == i0);
			}
		}
	}
}

/* ---- Q8_K activations ---------------------------------------------------- */

/* ops_q8_k_quantize, byte for byte, without libm: per block amax over
 * |x| (max is exact, so order does not matter), d = amax / 127, id = 127
 * / amax, q = roundf(x * id) written as truncate and step away from zero
 * when the dropped fraction is at least one half, clamped to +-127; each
 * group of 16 is one vector, so its bsum is that vector's sum. */
KQG_AVX512 void ops_kqg__quantize_q8_k(const float *x, uint32_t n,
				       struct ops_block_q8_k *out)
{
	const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
	const __m512 half = _mm512_set1_ps(0.5f);
	const __m512i lim = _mm512_set1_epi32(127), nlim = _mm512_set1_epi32(-127);

	for (uint32_t b = 0; b < n / OPS_QK_K; b++) {
		const float *xb = x + (size_t)b * OPS_QK_K;
		__m512 a = _mm512_setzero_ps();
		float amax, id;
		__m512 vid;

		for (int g = 0; g < 16; g++) {
			/* |x| first: a NaN lane keeps a, as fmaxf ignores NaN */
			a = _mm512_max_ps(_mm512_and_ps(_mm512_loadu_ps(xb + 16 * g), absmask), a);
		}
		amax = _mm512_reduce_max_ps(a);
		out[b].d = amax / 127.0f;
		id = amax > 0.0f ? 127.0f / amax : 0.0f;
		vid = _mm512_set1_ps(id);
		for (int g = 0; g < 16; g++) {
			__m512 v = _mm512_mul_ps(_mm512_loadu_ps(xb + 16 * g), vid);
			__m512 t = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
			__m512 f = _mm512_and_ps(_mm512_sub_ps(v, t), absmask);
			__mmask16 up = _mm512_cmp_ps_mask(f, half, _CMP_GE_OQ);
			__m512i ti = _mm512_cvttps_epi32(t);
			__m512i sg = _mm512_or_si512(_mm512_srai_epi32(_mm512_castps_si512(v), 31),
						     _mm512_set1_epi32(1));
			__m512i q = _mm512_mask_add_epi32(ti, up, ti, sg);

			q = _mm512_max_epi32(_mm512_min_epi32(q, lim), nlim);
			_mm_storeu_si128((__m128i *)(out[b].qs + 16 * g), _mm512_cvtepi32_epi8(q));
			out[b].bsums[g] = (int16_t)_mm512_reduce_add_epi32(q);
		}
	}
}

#endif
