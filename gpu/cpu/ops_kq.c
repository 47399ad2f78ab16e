/* ops_kq.c - K-quant blocks: unpack/pack, dequantization, quantizer and
 * dot products (scalar reference, AVX2, AVX-512 and AVX-512 VNNI).
 *
 * Design. Each type has one unpacker and one packer to the reference form
 * w = (d * sc[g]) * q - (dmin * mn[g]) over groups g of 16 weights (types
 * with 32-weight sub-blocks, Q4_K and Q5_K, repeat a sub-block's scale in
 * its two groups). Everything else is written once against that form:
 * dequantization, the quantizer (choose d, dmin, sc, mn, q; then pack)
 * and the scalar dot, which is the reference the SIMD kernels are tested
 * against.
 *
 * Dot products. Against a Q8_K activation block (dx, xq[256], bsums[16]):
 *     sum_e w[e] x[e] = dx * (d * isum - dmin * msum)
 *     isum = sum_g sc[g] * sum_{e in g} q[e] xq[e]
 *     msum = sum_g mn[g] * bsums[g]
 * isum and msum are exact integers (|isum| < 2^31 for every type), so a
 * kernel may compute them in any order; the float part is one call to
 * ops_kq_combine per block and the blocks are accumulated in index
 * order. The scalar and SIMD tables therefore agree bit for bit.
 *
 * AVX2 uses maddubs (unsigned x signed bytes): Q2_K, Q4_K and Q5_K quants
 * are already unsigned; Q3_K and Q6_K store q + 4 and q + 32, so their
 * kernels dot the stored value and subtract 4 (32) * sc[g] * bsums[g].
 */
#include "gpu/cpu/ops_kq.h"

#include <math.h>
#include <string.h>

#include "gpu/cpu/ops_cpu.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KQ_HAVE_X86 1
#else
#define KQ_HAVE_X86 0
#endif

int ops_kq_index(enum ggml_type t)
{
	return t >= GGML_TYPE_Q2_K && t <= GGML_TYPE_Q6_K ? (int)(t - GGML_TYPE_Q2_K)
							   : -1;
}

size_t ops_kq_block_bytes(enum ggml_type t)
{
	static const size_t bytes[OPS_KQ_N] = { 84, 110, 144, 176, 210 };
	int i = ops_kq_index(t);

	return i < 0 ? 0 : bytes[i];
}

/* ---- scale packing ------------------------------------------------------- */

/* Q4_K / Q5_K: 8 scales and 8 mins of 6 bits in 12 bytes. Sub-blocks 0-3
 * keep their low 6 bits in bytes 0-3 (scale) and 4-7 (min); sub-blocks 4-7
 * keep their low 4 bits in bytes 8-11 (scale low nibble, min high
 * nibble) and their top 2 bits in bits 6-7 of bytes 0-3 (scale) and 4-7
 * (min). */
static void k4_get(const uint8_t *s, int j, int *sc, int *mn)
{
	if (j < 4) {
		*sc = s[j] & 63;
		*mn = s[j + 4] & 63;
	} else {
		*sc = (s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4);
		*mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
	}
}

static void k4_put(uint8_t *s, const int16_t *sc, const int16_t *mn)
{
	memset(s, 0, 12);
	for (int j = 0; j < 8; j++) {
		int a = sc[2 * j] & 63, m = mn[2 * j] & 63;

		if (j < 4) {
			s[j] |= (uint8_t)a;
			s[j + 4] |= (uint8_t)m;
		} else {
			s[j + 4] = (uint8_t)((a & 0xf) | ((m & 0xf) << 4));
			s[j - 4] |= (uint8_t)((a >> 4) << 6);
			s[j] |= (uint8_t)((m >> 4) << 6);
		}
	}
}

/* Q3_K: 16 scales of 6 bits in 12 bytes. Scale i's low 4 bits: the low
 * nibble of byte i (i < 8) or the high nibble of byte i - 8; its high 2
 * bits: bits 2*(i/4) of byte 8 + i%4. */
static int k3_get(const uint8_t *s, int i)
{
	int lo = i < 8 ? s[i] & 0xf : s[i - 8] >> 4;
	int hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;

	return lo | (hi << 4);
}

static void k3_put(uint8_t *s, const int16_t *sc)
{
	memset(s, 0, 12);
	for (int i = 0; i < 16; i++) {
		int v = (sc[i] + 32) & 63;

		s[i % 8] |= (uint8_t)((v & 0xf) << (i < 8 ? 0 : 4));
		s[8 + i % 4] |= (uint8_t)((v >> 4) << (2 * (i / 4)));
	}
}

/* ---- unpack / pack per type ---------------------------------------------- */

/* Q2_K and Q3_K place weight e = 128n + 32j + l (n < 2, j < 4, l < 32) in
 * bits 2j..2j+1 of qs[32n + l]. */
static void q2_unpack(const void *blk, struct ops_kq_unpacked *u)
{
	const struct ops_block_q2_k *b = blk;

	u->d = ops_f16_to_f32(b->d);
	u->dmin = ops_f16_to_f32(b->dmin);
	for (int g = 0; g < 16; g++) {
		u->sc[g] = b->scales[g] & 0xf;
		u->mn[g] = b->scales[g] >> 4;
	}
	for (int e = 0; e < OPS_QK_K; e++)
		u->q[e] = (int8_t)((b->qs[32 * (e / 128) + e % 32] >>
				    (2 * ((e % 128) / 32))) & 3);
}

static void q2_pack(const struct ops_kq_unpacked *u, void *blk)
{
	struct ops_block_q2_k *b = blk;

	memset(b, 0, sizeof(*b));
	b->d = ops_f32_to_f16(u->d);
	b->dmin = ops_f32_to_f16(u->dmin);
	for (int g = 0; g < 16; g++)
		b->scales[g] = (uint8_t)((u->sc[g] & 0xf) | ((u->mn[g] & 0xf) << 4));
	for (int e = 0; e < OPS_QK_K; e++)
		b->qs[32 * (e / 128) + e % 32] |=
			(uint8_t)((u->q[e] & 3) << (2 * ((e % 128) / 32)));
}

/* Q3_K: as Q2_K for the low 2 bits; the high bit of weight e is bit
 * 4n + j of hmask[l]; q = low + 4 * high - 4. */
static void q3_unpack(const void *blk, struct ops_kq_unpacked *u)
{
	const struct ops_block_q3_k *b = blk;

	u->d = ops_f16_to_f32(b->d);
	u->dmin = 0.0f;
	for (int g = 0; g < 16; g++) {
		u->sc[g] = (int16_t)(k3_get(b->scales, g) - 32);
		u->mn[g] = 0;
	}
	for (int e = 0; e < OPS_QK_K; e++) {
		int n = e / 128, j = (e % 128) / 32, l = e % 32;
		int lo = (b->qs[32 * n + l] >> (2 * j)) & 3;
		int hi = (b->hmask[l] >> (4 * n + j)) & 1;

		u->q[e] = (int8_t)(lo + 4 * hi - 4);
	}
}

static void q3_pack(const struct ops_kq_unpacked *u, void *blk)
{
	struct ops_block_q3_k *b = blk;

	memset(b, 0, sizeof(*b));
	b->d = ops_f32_to_f16(u->d);
	k3_put(b->scales, u->sc);
	for (int e = 0; e < OPS_QK_K; e++) {
		int n = e / 128, j = (e % 128) / 32, l = e % 32;
		int v = (u->q[e] + 4) & 7;

		b->qs[32 * n + l] |= (uint8_t)((v & 3) << (2 * j));
		b->hmask[l] |= (uint8_t)((v >> 2) << (4 * n + j));
	}
}

/* Q4_K / Q5_K: weight e = 64c + 32h + l (c < 4, h < 2, l < 32) is nibble h
 * of qs[32c + l]; Q5_K adds bit 2c + h of qh[l] as the value 16. */
static void q45_unpack(const uint8_t *dd, const uint8_t *scales,
		       const uint8_t *qh, const uint8_t *qs,
		       struct ops_kq_unpacked *u)
{
	uint16_t d, dmin;

	memcpy(&d, dd, 2);
	memcpy(&dmin, dd + 2, 2);
	u->d = ops_f16_to_f32(d);
	u->dmin = ops_f16_to_f32(dmin);
	for (int j = 0; j < 8; j++) {
		int sc, mn;

		k4_get(scales, j, &sc, &mn);
		u->sc[2 * j] = u->sc[2 * j + 1] = (int16_t)sc;
		u->mn[2 * j] = u->mn[2 * j + 1] = (int16_t)mn;
	}
	for (int e = 0; e < OPS_QK_K; e++) {
		int c = e / 64, h = (e % 64) / 32, l = e % 32;
		int v = (qs[32 * c + l] >> (4 * h)) & 0xf;

		if (qh)
			v |= ((qh[l] >> (2 * c + h)) & 1) << 4;
		u->q[e] = (int8_t)v;
	}
}

static void q45_pack(const struct ops_kq_unpacked *u, uint8_t *dd,
		     uint8_t *scales, uint8_t *qh, uint8_t *qs)
{
	uint16_t d = ops_f32_to_f16(u->d), dmin = ops_f32_to_f16(u->dmin);

	memcpy(dd, &d, 2);
	memcpy(dd + 2, &dmin, 2);
	k4_put(scales, u->sc, u->mn);
	memset(qs, 0, 128);
	if (qh)
		memset(qh, 0, 32);
	for (int e = 0; e < OPS_QK_K; e++) {
		int c = e / 64, h = (e % 64) / 32, l = e % 32;

		qs[32 * c + l] |= (uint8_t)((u->q[e] & 0xf) << (4 * h));
		if (qh)
			qh[l] |= (uint8_t)(((u->q[e] >> 4) & 1) << (2 * c + h));
	}
}

static void q4_unpack(const void *blk, struct ops_kq_unpacked *u)
{
	const struct ops_block_q4_k *b = blk;

	q45_unpack((const uint8_t *)b, b->scales, NULL, b->qs, u);
}

static void q4_pack(const struct ops_kq_unpacked *u, void *blk)
{
	struct ops_block_q4_k *b = blk;

	q45_pack(u, (uint8_t *)b, b->scales, NULL, b->qs);
}

static void q5_unpack(const void *blk, struct ops_kq_unpacked *u)
{
	const struct ops_block_q5_k *b = blk;

	q45_unpack((const uint8_t *)b, b->scales, b->qh, b->qs, u);
}

static void q5_pack(const struct ops_kq_unpacked *u, void *blk)
{
	struct ops_block_q5_k *b = blk;

	q45_pack(u, (uint8_t *)b, b->scales, b->qh, b->qs);
}

/* Q6_K: weight e = 128n + 32k + l (n < 2, k < 4, l < 32): low 4 bits are
 * nibble k/2 of ql[64n + 32(k%2) + l], high 2 bits are bits 2k..2k+1 of
 * qh[32n + l]; q = that 6-bit value - 32. */
static void q6_unpack(const void *blk, struct ops_kq_unpacked *u)
{
	const struct ops_block_q6_k *b = blk;

	u->d = ops_f16_to_f32(b->d);
	u->dmin = 0.0f;
	for (int g = 0; g < 16; g++) {
		u->sc[g] = b->scales[g];
		u->mn[g] = 0;
	}
	for (int e = 0; e < OPS_QK_K; e++) {
		int n = e / 128, k = (e % 128) / 32, l = e % 32;
		int lo = (b->ql[64 * n + 32 * (k % 2) + l] >> (4 * (k / 2))) & 0xf;
		int hi = (b->qh[32 * n + l] >> (2 * k)) & 3;

		u->q[e] = (int8_t)((lo | (hi << 4)) - 32);
	}
}

static void q6_pack(const struct ops_kq_unpacked *u, void *blk)
{
	struct ops_block_q6_k *b = blk;

	memset(b, 0, sizeof(*b));
	b->d = ops_f32_to_f16(u->d);
	for (int g = 0; g < 16; g++)
		b->scales[g] = (int8_t)u->sc[g];
	for (int e = 0; e < OPS_QK_K; e++) {
		int n = e / 128, k = (e % 128) / 32, l = e % 32;
		int v = (u->q[e] + 32) & 63;

		b->ql[64 * n + 32 * (k % 2) + l] |= (uint8_t)((v & 0xf) << (4 * (k / 2)));
		b->qh[32 * n + l] |= (uint8_t)((v >> 4) << (2 * k));
	}
}

/* Per type: codec and the quantizer's ranges. */
struct kq_traits {
	void (*unpack)(const void *blk, struct ops_kq_unpacked *u);
	void (*pack)(const struct ops_kq_unpacked *u, void *blk);
	int qmax;         /* quants 0..qmax (with mins) or -qmax-1..qmax */
	int scmax;        /* largest packed scale (and min) */
	bool has_min;
};

static const struct kq_traits kq_traits[OPS_KQ_N] = {
	{ q2_unpack, q2_pack, 3, 15, true },
	{ q3_unpack, q3_pack, 3, 31, false },
	{ q4_unpack, q4_pack, 15, 63, true },
	{ q5_unpack, q5_pack, 31, 63, true },
	{ q6_unpack, q6_pack, 31, 127, false },
};

void ops_kq_unpack(enum ggml_type t, const void *blk, struct ops_kq_unpacked *u)
{
	kq_traits[ops_kq_index(t)].unpack(blk, u);
}

void ops_kq_pack(enum ggml_type t, const struct ops_kq_unpacked *u, void *blk)
{
	kq_traits[ops_kq_index(t)].pack(u, blk);
}

void ops_kq_dequant_row(enum ggml_type t, const void *row, float *out,
			uint32_t n)
{
	const struct kq_traits *tr = &kq_traits[ops_kq_index(t)];
	size_t bb = ops_kq_block_bytes(t);
	struct ops_kq_unpacked u;

	for (uint32_t b = 0; b < n / OPS_QK_K; b++) {
		tr->unpack((const uint8_t *)row + b * bb, &u);
		for (int e = 0; e < OPS_QK_K; e++) {
			float dl = u.d * (float)u.sc[e / 16];
			float ml = u.dmin * (float)u.mn[e / 16];

			out[(size_t)b * OPS_QK_K + e] = dl * (float)u.q[e] - ml;
		}
	}
}

/* ---- quantizer ------------------------------------------------------------ */

/* Types with mins (Q2_K, Q4_K, Q5_K): per group w ~ s * q - m with
 * m = -min(0, min w) and s = (max w + m) / qmax; then d, dmin scale the
 * largest s and m to the packed range. Symmetric types (Q3_K, Q6_K): the
 * group's largest-magnitude weight maps to -(qmax + 1), the one end of the
 * signed range reached exactly. Groups of 32 for Q4_K/Q5_K share one scale
 * (computed over the 32). */
static void kq_quantize_block(const struct kq_traits *tr, int gsize,
			      const float *x, struct ops_kq_unpacked *u)
{
	float s[16], m[16], smax = 0.0f, mmax = 0.0f;

	for (int g = 0; g < 16; g += gsize / 16) {
		const float *xg = x + 16 * g;
		float lo = 0.0f, hi = 0.0f, big = 0.0f;

		for (int i = 0; i < gsize; i++) {
			lo = fminf(lo, xg[i]);
			hi = fmaxf(hi, xg[i]);
			if (fabsf(xg[i]) > fabsf(big))
				big = xg[i];
		}
		if (tr->has_min) {
			m[g] = -lo;
			s[g] = (hi - lo) / (float)tr->qmax;
		} else {
			m[g] = 0.0f;
			s[g] = -big / (float)(tr->qmax + 1);
		}
		for (int k = 1; k < gsize / 16; k++) {
			s[g + k] = s[g];
			m[g + k] = m[g];
		}
		smax = fmaxf(smax, fabsf(s[g]));
		mmax = fmaxf(mmax, m[g]);
	}
	/* round d, dmin to half first: the kernels see the stored values */
	u->d = ops_f16_to_f32(ops_f32_to_f16(smax / (float)tr->scmax));
	u->dmin = tr->has_min ? ops_f16_to_f32(ops_f32_to_f16(mmax / (float)tr->scmax))
			      : 0.0f;
	for (int g = 0; g < 16; g++) {
		int lim = tr->has_min ? 0 : -tr->scmax - 1;
		float sc = u->d > 0.0f ? roundf(s[g] / u->d) : 0.0f;
		float mn = u->dmin > 0.0f ? roundf(m[g] / u->dmin) : 0.0f;

		u->sc[g] = (int16_t)fmaxf((float)lim, fminf((float)tr->scmax, sc));
		u->mn[g] = (int16_t)fminf((float)tr->scmax, mn);
	}
	for (int e = 0; e < OPS_QK_K; e++) {
		float dl = u->d * (float)u->sc[e / 16];
		float ml = u->dmin * (float)u->mn[e / 16];
		float q = dl != 0.0f ? roundf((x[e] + ml) / dl) : 0.0f;
		float qlo = tr->has_min ? 0.0f : (float)(-tr->qmax - 1);

		u->q[e] = (int8_t)fmaxf(qlo, fminf((float)tr->qmax, q));
	}
}

void ops_kq_quantize_row(enum ggml_type t, const float *x, uint32_t n,
			 void *out)
{
	const struct kq_traits *tr = &kq_traits[ops_kq_index(t)];
	int gsize = t == GGML_TYPE_Q4_K || t == GGML_TYPE_Q5_K ? 32 : 16;
	size_t bb = ops_kq_block_bytes(t);
	struct ops_kq_unpacked u;

	for (uint32_t b = 0; b < n / OPS_QK_K; b++) {
		kq_quantize_block(tr, gsize, x + (size_t)b * OPS_QK_K, &u);
		tr->pack(&u, (uint8_t *)out + b * bb);
	}
}

void ops_q8_k_quantize(const float *x, uint32_t n, struct ops_block_q8_k *out)
{
	for (uint32_t b = 0; b < n / OPS_QK_K; b++) {
		const float *xb = x + (size_t)b * OPS_QK_K;
		float amax = 0.0f, id;

		for (int j = 0; j < OPS_QK_K; j++)
			amax = fmaxf(amax, fabsf(xb[j]));
		out[b].d = amax / 127.0f;
		id = amax > 0.0f ? 127.0f / amax : 0.0f;
		for (int g = 0; g < OPS_QK_K / 16; g++) {
			int sum = 0;

			for (int j = 16 * g; j < 16 * g + 16; j++) {
				float q = fminf(127.0f, fmaxf(-127.0f, roundf(xb[j] * id)));

				out[b].qs[j] = (int8_t)q;
				sum += out[b].qs[j];
			}
			out[b].bsums[g] = (int16_t)sum;
		}
	}
}

/* ---- dot products: scalar reference --------------------------------------- */

__attribute__((noinline))
float ops_kq_combine(float dx, float d, float dmin, int32_t isum, int32_t msum)
{
	return (dx * d) * (float)isum - (dx * dmin) * (float)msum;
}

static float kq_dot_ref(enum ggml_type t, const void *w,
			const struct ops_block_q8_k *x, uint32_t n)
{
	const struct kq_traits *tr = &kq_traits[ops_kq_index(t)];
	size_t bb = ops_kq_block_bytes(t);
	struct ops_kq_unpacked u;
	float acc = 0.0f;

	for (uint32_t b = 0; b < n / OPS_QK_K; b++) {
		int32_t isum = 0, msum = 0;

		tr->unpack((const uint8_t *)w + b * bb, &u);
		for (int g = 0; g < 16; g++) {
			int32_t s = 0;

			for (int j = 16 * g; j < 16 * g + 16; j++)
				s += u.q[j] * x[b].qs[j];
			isum += u.sc[g] * s;
			msum += u.mn[g] * x[b].bsums[g];
		}
		acc += ops_kq_combine(x[b].d, u.d, u.dmin, isum, msum);
	}
	return acc;
}

#define KQ_REF(name, type)                                                   \
	static float name(const void *w, const struct ops_block_q8_k *x,     \
			  uint32_t n)                                        \
	{                                                                    \
		return kq_dot_ref(type, w, x, n);                            \
	}
KQ_REF(dot_q2_k_ref, GGML_TYPE_Q2_K)
KQ_REF(dot_q3_k_ref, GGML_TYPE_Q3_K)
KQ_REF(dot_q4_k_ref, GGML_TYPE_Q4_K)
KQ_REF(dot_q5_k_ref, GGML_TYPE_Q5_K)
KQ_REF(dot_q6_k_ref, GGML_TYPE_Q6_K)

const ops_kq_dot_fn ops_kq_dot_scalar[OPS_KQ_N] = {
	dot_q2_k_ref, dot_q3_k_ref, dot_q4_k_ref, dot_q5_k_ref, dot_q6_k_ref,
};

/* ---- dot products: AVX2 ----------------------------------------------------- */

#if KQ_HAVE_X86
#define KQ_AVX2 __attribute__((target("avx2,fma,f16c")))
/* weight prefetch distance in bytes, as ops_cpu.c's kernels */
#define KQ_PF_DIST 2048

/* A half's exact float value in one instruction (the tables holding
 * these kernels require F16C); ops_f16_to_f32 gives the same bits. */
KQ_AVX2 static inline float kq_h2f(uint16_t h)
{
	return _cvtsh_ss(h);
}

KQ_AVX2 static inline int32_t hsum_i32(__m256i v)
{
	__m128i s = _mm_add_epi32(_mm256_castsi256_si128(v),
				  _mm256_extracti128_si256(v, 1));

	s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
	s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
	return _mm_cvtsi128_si32(s);
}

/* Q4_K/Q5_K scales and mins of one block as bytes: 0..7 = sc, 8..15 = mn
 * (the k4_get rule, four sub-blocks per 32-bit word), built in registers
 * (a store and a wider load back would stall on store forwarding). */
KQ_AVX2 static inline __m128i k4_bytes(const uint8_t *s)
{
	uint32_t a[3];

	memcpy(a, s, 12);
	return _mm_set_epi32(
		(int)(((a[2] >> 4) & 0x0f0f0f0fu) | ((a[1] >> 6) & 0x03030303u) << 4),
		(int)(a[1] & 0x3f3f3f3fu),
		(int)((a[2] & 0x0f0f0f0fu) | ((a[0] >> 6) & 0x03030303u) << 4),
		(int)(a[0] & 0x3f3f3f3fu));
}

/* msum of a block whose 8 mins (bytes 8..15 of sm) each cover two groups
 * of 16. */
KQ_AVX2 static inline int32_t k4_msum(__m128i sm, const int16_t *bsums)
{
	__m256i m16 = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(sm, sm));

	return hsum_i32(_mm256_madd_epi16(
		_mm256_loadu_si256((const __m256i *)bsums), m16));
}

/* Q4_K and Q5_K: per 64-weight chunk c, one 32-byte load of qs gives
 * sub-block 2c (low nibbles) and 2c + 1 (high nibbles); Q5_K ORs in 16
 * from bits 2c and 2c + 1 of qh. maddubs pairs stay below 2 * 31 * 128,
 * and madd by the broadcast scale (one byte shuffle of the eight scales)
 * widens to int32. */
KQ_AVX2 static inline __attribute__((always_inline)) float
dot_q45_avx2(const uint8_t *dd, const uint8_t *scales, const uint8_t *qh,
	     const uint8_t *qs, const struct ops_block_q8_k *x)
{
	const __m256i m4 = _mm256_set1_epi8(0x0f);
	const __m256i one = _mm256_set1_epi8(1);
	__m256i isum = _mm256_setzero_si256();
	__m256i hb = qh ? _mm256_loadu_si256((const __m256i *)qh) : one;
	__m128i sm = k4_bytes(scales);
	__m256i s16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm));
	uint16_t d, dmin;

#pragma GCC unroll 4
	for (int c = 0; c < 4; c++) {
		__m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
		__m256i lo = _mm256_and_si256(q, m4);
		__m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
		__m256i x0 = _mm256_loadu_si256((const __m256i *)(x->qs + 64 * c));
		__m256i x1 = _mm256_loadu_si256((const __m256i *)(x->qs + 64 * c + 32));
		__m256i s0 = _mm256_shuffle_epi8(s16, _mm256_set1_epi16(
			(short)((4 * c) | (4 * c + 1) << 8)));
		__m256i s1 = _mm256_shuffle_epi8(s16, _mm256_set1_epi16(
			(short)((4 * c + 2) | (4 * c + 3) << 8)));

		if (qh) {
			__m256i h = _mm256_srli_epi16(hb, 2 * c);

			lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(h, one), 4));
			hi = _mm256_or_si256(hi, _mm256_slli_epi16(
				_mm256_and_si256(_mm256_srli_epi16(h, 1), one), 4));
		}
		__m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, x0), s0);
		__m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, x1), s1);

		isum = _mm256_add_epi32(isum, _mm256_add_epi32(p0, p1));
	}
	memcpy(&d, dd, 2);
	memcpy(&dmin, dd + 2, 2);
	return ops_kq_combine(x->d, kq_h2f(d), kq_h2f(dmin),
			      hsum_i32(isum), k4_msum(sm, x->bsums));
}

KQ_AVX2 static float dot_q4_k_avx2(const void *w, const struct ops_block_q8_k *x,
				   uint32_t n)
{
	const struct ops_block_q4_k *b = w;
	float acc = 0.0f;

	for (uint32_t i = 0; i < n / OPS_QK_K; i++) {
		_mm_prefetch((const char *)(b + i) + KQ_PF_DIST, _MM_HINT_T0);
		acc += dot_q45_avx2((const uint8_t *)&b[i], b[i].scales, NULL,
				    b[i].qs, &x[i]);
	}
	return acc;
}

KQ_AVX2 static float dot_q5_k_avx2(const void *w, const struct ops_block_q8_k *x,
				   uint32_t n)
{
	const struct ops_block_q5_k *b = w;
	float acc = 0.0f;

	for (uint32_t i = 0; i < n / OPS_QK_K; i++) {
		_mm_prefetch((const char *)(b + i) + KQ_PF_DIST, _MM_HINT_T0);
		acc += dot_q45_avx2((const uint8_t *)&b[i], b[i].scales, b[i].qh,
				    b[i].qs, &x[i]);
	}
	return acc;
}

/* Q2_K and Q3_K: per half n, one 32-byte load of qs holds four spans of
 * 32 weights (bits 2j..2j+1); span j covers groups 8n + 2j (low lane) and
 * 8n + 2j + 1 (high lane). Q3_K (hmask set) adds 4 * (bit 4n + j of
 * hmask) and, as its quants are stored + 4, its caller subtracts
 * 4 * sum_g sc[g] * bsums[g]. s16 holds the block's 16 scales as int16.
 * Returns the block's isum.
 *
 * The per-span scale pair comes from one byte shuffle of the half's eight
 * scales (broadcast to both lanes), and the high bit is moved to bit 2 by
 * one immediate shift: an earlier version built each pair with two
 * broadcasts and an insert from memory and shifted by register counts,
 * which made Q3_K 3.5x slower than Q4_K per byte. */
KQ_AVX2 static inline __m256i k23_scale_pair(__m256i half8, int j)
{
	/* low lane: bytes of int16 scale 2j, high lane: of scale 2j + 1 */
	const __m256i ctl = _mm256_set_m128i(
		_mm_set1_epi16((short)((4 * j + 2) | (4 * j + 3) << 8)),
		_mm_set1_epi16((short)((4 * j) | (4 * j + 1) << 8)));

	return _mm256_shuffle_epi8(half8, ctl);
}

/* Bit `bit` of every byte of v, moved to bit 2 (the value 4). */
KQ_AVX2 static inline __m256i k3_hbit(__m256i v, int bit)
{
	const __m256i four = _mm256_set1_epi8(4);

	/* epi16 shifts by at most 5 keep bit 2 of each byte within its byte */
	if (bit >= 2)
		return _mm256_and_si256(_mm256_srli_epi16(v, bit - 2), four);
	return _mm256_and_si256(_mm256_slli_epi16(v, 2 - bit), four);
}

KQ_AVX2 static inline __attribute__((always_inline)) int32_t
k23_isum(const uint8_t *qs, const uint8_t *hmask, __m256i s16, const int8_t *xq)
{
	const __m256i m3 = _mm256_set1_epi8(3);
	__m256i hm = hmask ? _mm256_loadu_si256((const __m256i *)hmask)
			   : _mm256_setzero_si256();
	__m256i isum = _mm256_setzero_si256();

	/* unrolled, so every shift count is an immediate */
#pragma GCC unroll 2
	for (int n = 0; n < 2; n++) {
		__m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * n));
		__m256i half8 = n ? _mm256_permute2x128_si256(s16, s16, 0x11)
				  : _mm256_permute2x128_si256(s16, s16, 0x00);

#pragma GCC unroll 4
		for (int j = 0; j < 4; j++) {
			__m256i u = _mm256_and_si256(_mm256_srli_epi16(q, 2 * j), m3);
			__m256i xv = _mm256_loadu_si256(
				(const __m256i *)(xq + 128 * n + 32 * j));

			if (hmask)
				u = _mm256_or_si256(u, k3_hbit(hm, 4 * n + j));
			isum = _mm256_add_epi32(isum, _mm256_madd_epi16(
					_mm256_maddubs_epi16(u, xv),
					k23_scale_pair(half8, j)));
		}
	}
	return hsum_i32(isum);
}

KQ_AVX2 static float dot_q2_k_avx2(const void *w, const struct ops_block_q8_k *x,
				   uint32_t n)
{
	const struct ops_block_q2_k *b = w;
	const __m128i m4 = _mm_set1_epi8(0x0f);
	float acc = 0.0f;

	for (uint32_t i = 0; i < n / OPS_QK_K; i++) {
		__m128i sv = _mm_loadu_si128((const __m128i *)b[i].scales);
		__m256i mn = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sv, 4), m4));
		__m256i sc = _mm256_cvtepu8_epi16(_mm_and_si128(sv, m4));
		int32_t msum;

		_mm_prefetch((const char *)(b + i) + KQ_PF_DIST, _MM_HINT_T0);
		msum = hsum_i32(_mm256_madd_epi16(
			_mm256_loadu_si256((const __m256i *)x[i].bsums), mn));
		acc += ops_kq_combine(x[i].d, kq_h2f(b[i].d),
				      kq_h2f(b[i].dmin),
				      k23_isum(b[i].qs, NULL, sc, x[i].qs), msum);
	}
	return acc;
}

/* Q3_K's 16 scales (stored + 32) as bytes (the k3_get rule), in
 * registers: low nibbles of bytes 0-7 then their high nibbles, each ORed
 * with bits 2(i/4)..2(i/4)+1 of byte 8 + i%4 moved to bits 4-5. The 12
 * bytes are loaded as 8 + 4, never past the block. */
KQ_AVX2 static inline __m128i k3_bytes(const uint8_t *s)
{
	const __m128i m4 = _mm_set1_epi8(0x0f), m3 = _mm_set1_epi8(3);
	uint32_t tail;
	__m128i v, lo, hi;

	memcpy(&tail, s + 8, 4);
	v = _mm_loadl_epi64((const __m128i *)s);
	lo = _mm_unpacklo_epi64(_mm_and_si128(v, m4),
				_mm_and_si128(_mm_srli_epi16(v, 4), m4));
	/* word k = bytes 8..11, shifted right by 2k; bits 0-1 of each byte */
	hi = _mm_and_si128(_mm_srlv_epi32(_mm_set1_epi32((int)tail),
					  _mm_set_epi32(6, 4, 2, 0)), m3);
	return _mm_or_si128(lo, _mm_slli_epi16(hi, 4));
}

/* Q3_K's scales as int16 (stored - 32) and its correction
 * sum_g sc[g] * bsums[g]. */
KQ_AVX2 static inline __m256i k3_scales(const uint8_t *scales, const int16_t *bsums,
					int32_t *corr)
{
	__m256i sv = _mm256_sub_epi16(_mm256_cvtepu8_epi16(k3_bytes(scales)),
				      _mm256_set1_epi16(32));

	*corr = hsum_i32(_mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)bsums), sv));
	return sv;
}

KQ_AVX2 static float dot_q3_k_avx2(const void *w, const struct ops_block_q8_k *x,
				   uint32_t n)
{
	const struct ops_block_q3_k *b = w;
	float acc = 0.0f;

	for (uint32_t i = 0; i < n / OPS_QK_K; i++) {
		int32_t corr;
		__m256i sc;

		_mm_prefetch((const char *)(b + i) + KQ_PF_DIST, _MM_HINT_T0);
		sc = k3_scales(b[i].scales, x[i].bsums, &corr);
		acc += ops_kq_combine(x[i].d, kq_h2f(b[i].d), 0.0f,
				      k23_isum(b[i].qs, b[i].hmask, sc, x[i].qs) -
				      4 * corr, 0);
	}
	return acc;
}

/* Q6_K: per half n, ql0/ql1/qh (32 bytes each) give four 32-weight spans
 * of stored values u = q + 32 (0..63); span k covers groups 8n + 2k and
 * 8n + 2k + 1 (one per 128-bit lane). sum q x = sum u x - 32 sum x, and
 * sum x per group is bsums. */
KQ_AVX2 static float dot_q6_k_avx2(const void *w, const struct ops_block_q8_k *x,
				   uint32_t n)
{
	const struct ops_block_q6_k *b = w;
	const __m256i m4 = _mm256_set1_epi8(0x0f);
	const __m256i m30 = _mm256_set1_epi8(0x30);
	float acc = 0.0f;

	for (uint32_t i = 0; i < n / OPS_QK_K; i++) {
		__m256i isum = _mm256_setzero_si256();
		int32_t corr = 0;

		_mm_prefetch((const char *)(b + i) + KQ_PF_DIST, _MM_HINT_T0);
		for (int g = 0; g < 16; g++)
			corr += b[i].scales[g] * x[i].bsums[g];
		for (int h = 0; h < 2; h++) {
			__m256i l0 = _mm256_loadu_si256((const __m256i *)(b[i].ql + 64 * h));
			__m256i l1 = _mm256_loadu_si256((const __m256i *)(b[i].ql + 64 * h + 32));
			__m256i qh = _mm256_loadu_si256((const __m256i *)(b[i].qh + 32 * h));
			__m256i u[4];

			u[0] = _mm256_or_si256(_mm256_and_si256(l0, m4),
					       _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
			u[1] = _mm256_or_si256(_mm256_and_si256(l1, m4),
					       _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
			u[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
					       _mm256_and_si256(qh, m30));
			u[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
					       _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
			for (int k = 0; k < 4; k++) {
				int g = 8 * h + 2 * k;
				__m256i xv = _mm256_loadu_si256(
					(const __m256i *)(x[i].qs + 128 * h + 32 * k));
				__m256i s = _mm256_set_m128i(
					_mm_set1_epi16(b[i].scales[g + 1]),
					_mm_set1_epi16(b[i].scales[g]));

				isum = _mm256_add_epi32(isum, _mm256_madd_epi16(
						_mm256_maddubs_epi16(u[k], xv), s));
			}
		}
		acc += ops_kq_combine(x[i].d, kq_h2f(b[i].d), 0.0f,
				      hsum_i32(isum) - 32 * corr, 0);
	}
	return acc;
}

/* ---- dot products: AVX-512 (BW, optionally VNNI) ---------------------------- */

/* The AVX2 scheme at twice the width: one 512-bit maddubs + madd covers
 * 64 weights (four groups of 16 for Q2_K, Q3_K and Q6_K; two 32-weight
 * sub-blocks for Q4_K and Q5_K); the per-lane int16 scales come from one
 * permute of the block's scales, and a third bit (Q3_K's hmask, Q5_K's
 * qh) is one byte test into a mask plus one masked add. With VNNI the
 * madd + add is one vpdpwssd. Integer sums, so bit-identical to the
 * scalar kernels.
 *
 * Each kernel is written once as an always-inline body taking `vnni` and
 * instantiated twice: for the avx512 table (vnni false) and for the
 * avx512vnni table (true), which ops_kernels_avx512vnni() hands out only
 * when the CPU reports avx512vnni. vpdpwssd is inline asm: its intrinsic
 * cannot be inlined into a body compiled for a target without avx512vnni,
 * even where that branch is dead. */
#define KQ_AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw")))
#define KQ_BODY512 KQ_AVX512 static inline __attribute__((always_inline))

/* acc + madd(p, s) (int16 pairs times int16 scales, summed to int32) */
KQ_BODY512 __m512i k512_dp(__m512i acc, __m512i p, __m512i s, bool vnni)
{
	if (vnni) {
		__asm__("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(p), "v"(s));
		return acc;
	}
	return _mm512_add_epi32(acc, _mm512_madd_epi16(p, s));
}

/* idx for permutexvar_epi16: 16-bit lane l takes element base + l / span */
KQ_AVX512 static inline __m512i k512_idx(int base, int span)
{
	int16_t v[32];

	for (int l = 0; l < 32; l++)
		v[l] = (int16_t)(base + l / span);
	return _mm512_loadu_si512(v);
}

/* int16 lanes lo in the low 256 bits, hi in the high 256 */
KQ_AVX512 static inline __m512i k512_halves16(int lo, int hi)
{
	return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16((short)lo)),
				  _mm256_set1_epi16((short)hi), 1);
}

/* the same for bytes */
KQ_AVX512 static inline __m512i k512_halves8(int lo, int hi)
{
	return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi8((char)lo)),
				  _mm256_set1_epi8((char)hi), 1);
}

/* Q2_K and Q3_K: vector v = 2h + p (h the half, p < 2) holds weights
 * 128h + 64p .. +63 = span 2p of half h (qs bits 4p..4p+1, low 256 bits)
 * and span 2p + 1 (bits 4p+2..4p+3, high 256 bits) of the half's one
 * 32-byte qs load, broadcast; it covers groups 4v .. 4v + 3. Q3_K adds 4
 * where bit 4h + 2p (low) / 4h + 2p + 1 (high) of hmask[l] is set.
 * s16: the block's 16 scales as int16 in the low 256 bits. */
KQ_BODY512 int32_t k23_isum_512(const uint8_t *qs, const uint8_t *hmask,
				__m512i s16, const int8_t *xq, bool vnni)
{
	const __m512i m3 = _mm512_set1_epi8(3);
	const __m512i four = _mm512_set1_epi8(4);
	const __m512i sh[2] = { k512_halves16(0, 2), k512_halves16(4, 6) };
	__m512i hm = hmask ? _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)hmask))
			   : _mm512_setzero_si512();
	__m512i isum = _mm512_setzero_si512();

#pragma GCC unroll 2
	for (int h = 0; h < 2; h++) {
		__m512i q = _mm512_broadcast_i64x4(
			_mm256_loadu_si256((const __m256i *)(qs + 32 * h)));

#pragma GCC unroll 2
		for (int p = 0; p < 2; p++) {
			int v = 2 * h + p;
			__m512i u = _mm512_and_si512(_mm512_srlv_epi16(q, sh[p]), m3);
			__m512i xv = _mm512_loadu_si512(xq + 64 * v);

			if (hmask) {
				__m512i bm = k512_halves8(1 << (4 * h + 2 * p),
							  1 << (4 * h + 2 * p + 1));

				u = _mm512_mask_add_epi8(u, _mm512_test_epi8_mask(hm, bm),
							 u, four);
			}
			isum = k512_dp(isum, _mm512_maddubs_epi16(u, xv),
				       _mm512_permutexvar_epi16(k512_idx(4 * v, 8), s16),
				       vnni);
		}
	}
	return _mm512_reduce_add_epi32(isum);
}

KQ_BODY512 float q2_k_512(const void *w, const struct ops_block_q8_k *x,
			  uint32_t n, bool vnni)
{
	const struct ops_block_q2_k *b = w;
	const __m128i m4 = _mm_set1_epi8(0x0f);
	float acc = 0.0f;

	for (uint32_t i = 0; i < n / OPS_QK_K; i++) {
		__m128i sv = _mm_loadu_si128((const __m128i *)b[i].scales);
		__m256i sc = _mm256_cvtepu8_epi16(_mm_and_si128(sv, m4));
		__m256i mn = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sv, 4), m4));
		int32_t msum;

		_mm_prefetch((const char *)(b + i) + KQ_PF_DIST, _MM_HINT_T0);
		msum = hsum_i32(_mm256_madd_epi16(
			_mm256_loadu_si256((const __m256i *)x[i].bsums), mn));
		acc += ops_kq_combine(x[i].d, kq_h2f(b[i].d),
				      kq_h2f(b[i].dmin),
				      k23_isum_512(b[i].qs, NULL, _mm512_castsi256_si512(sc),
						   x[i].qs, vnni), msum);
	}
	return acc;
}

KQ_BODY512 float q3_k_512(const void *w, const struct ops_block_q8_k *x,
			  uint32_t n, bool vnni)
{
	const struct ops_block_q3_k *b = w;
	float acc = 0.0f;

	for (uint32_t i = 0; i < n / OPS_QK_K; i++) {
		int32_t corr;
		__m256i sc;

		_mm_prefetch((const char *)(b + i) + KQ_PF_DIST, _MM_HINT_T0);
		sc = k3_scales(b[i].scales, x[i].bsums, &corr);
		acc += ops_kq_combine(x[i].d, kq_h2f(b[i].d), 0.0f,
				      k23_isum_512(b[i].qs, b[i].hmask,
						   _mm512_castsi256_si512(sc), x[i].qs,
						   vnni) - 4 * corr, 0);
	}
	return acc;
}

/* Q4_K and Q5_K: chunk c's 32-byte qs load, broadcast, gives sub-block
 * 2c (low nibbles, low 256 bits) and 2c + 1 (high nibbles, high 256
 * bits) against 64 contiguous activations; Q5_K adds 16 where bit 2c
 * (low) / 2c + 1 (high) of qh[l] is set. */
KQ_BODY512 float k45_block_512(const uint8_t *dd, const uint8_t *scales,
			       const uint8_t *qh, const uint8_t *qs,
			       const struct ops_block_q8_k *x, bool vnni)
{
	const __m512i m4 = _mm512_set1_epi8(0x0f);
	const __m512i sixteen = _mm512_set1_epi8(16);
	const __m512i sh = k512_halves16(0, 4);
	__m512i qhv = qh ? _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)qh))
			 : _mm512_setzero_si512();
	__m128i sm = k4_bytes(scales);
	__m512i s16 = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(sm));
	__m512i isum = _mm512_setzero_si512();
	uint16_t d, dmin;

#pragma GCC unroll 4
	for (int c = 0; c < 4; c++) {
		__m512i q = _mm512_broadcast_i64x4(
			_mm256_loadu_si256((const __m256i *)(qs + 32 * c)));
		__m512i u = _mm512_and_si512(_mm512_srlv_epi16(q, sh), m4);
		__m512i xv = _mm512_loadu_si512(x->qs + 64 * c);

		if (qh)
			u = _mm512_mask_add_epi8(u, _mm512_test_epi8_mask(
				qhv, k512_halves8(1 << (2 * c), 1 << (2 * c + 1))),
				u, sixteen);
		isum = k512_dp(isum, _mm512_maddubs_epi16(u, xv),
			       _mm512_permutexvar_epi16(k512_idx(2 * c, 16), s16), vnni);
	}
	memcpy(&d, dd, 2);
	memcpy(&dmin, dd + 2, 2);
	return ops_kq_combine(x->d, kq_h2f(d), kq_h2f(dmin),
			      _mm512_reduce_add_epi32(isum), k4_msum(sm, x->bsums));
}

KQ_BODY512 float q4_k_512(const void *w, const struct ops_block_q8_k *x,
			  uint32_t n, bool vnni)
{
	const struct ops_block_q4_k *b = w;
	float acc = 0.0f;

	for (uint32_t i = 0; i < n / OPS_QK_K; i++) {
		_mm_prefetch((const char *)(b + i) + KQ_PF_DIST, _MM_HINT_T0);
		acc += k45_block_512((const uint8_t *)&b[i], b[i].scales, NULL,
				     b[i].qs, &x[i], vnni);
	}
	return acc;
}

KQ_BODY512 float q5_k_512(const void *w, const struct ops_block_q8_k *x,
			  uint32_t n, bool vnni)
{
	const struct ops_block_q5_k *b = w;
	float acc = 0.0f;

	for (uint32_t i = 0; i < n / OPS_QK_K; i++) {
		_mm_prefetch((const char *)(b + i) + KQ_PF_DIST, _MM_HINT_T0);
		acc += k45_block_512((const uint8_t *)&b[i], b[i].scales, b[i].qh,
				     b[i].qs, &x[i], vnni);
	}
	return acc;
}

/* Q6_K: per half h, the 64 bytes of ql give spans 0|1 (low nibbles) and
 * 2|3 (high nibbles) against 64 contiguous activations each; qh's 32
 * bytes, broadcast, supply bits 4-5 (shifted per 256-bit half). */
KQ_BODY512 float q6_k_512(const void *w, const struct ops_block_q8_k *x,
			  uint32_t n, bool vnni)
{
	const struct ops_block_q6_k *b = w;
	const __m512i m4 = _mm512_set1_epi8(0x0f);
	const __m512i m30 = _mm512_set1_epi8(0x30);
	/* qh shifts: spans 0|1 take bits 0-1|2-3 to 4-5 (left 4|2); spans
	 * 2|3 take bits 4-5|6-7 (right 0|2) */
	const __m512i shl = k512_halves16(4, 2);
	const __m512i shr = k512_halves16(0, 2);
	float acc = 0.0f;

	for (uint32_t i = 0; i < n / OPS_QK_K; i++) {
		__m512i isum = _mm512_setzero_si512();
		__m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)b[i].scales));
		__m512i s16 = _mm512_castsi256_si512(sc16);
		int32_t corr;

		_mm_prefetch((const char *)(b + i) + KQ_PF_DIST, _MM_HINT_T0);
		corr = hsum_i32(_mm256_madd_epi16(
			_mm256_loadu_si256((const __m256i *)x[i].bsums), sc16));
#pragma GCC unroll 2
		for (int h = 0; h < 2; h++) {
			__m512i l = _mm512_loadu_si512(b[i].ql + 64 * h);
			__m512i qh = _mm512_broadcast_i64x4(
				_mm256_loadu_si256((const __m256i *)(b[i].qh + 32 * h)));
			__m512i u01 = _mm512_or_si512(_mm512_and_si512(l, m4),
				_mm512_and_si512(_mm512_sllv_epi16(qh, shl), m30));
			__m512i u23 = _mm512_or_si512(
				_mm512_and_si512(_mm512_srli_epi16(l, 4), m4),
				_mm512_and_si512(_mm512_srlv_epi16(qh, shr), m30));
			__m512i x01 = _mm512_loadu_si512(x[i].qs + 128 * h);
			__m512i x23 = _mm512_loadu_si512(x[i].qs + 128 * h + 64);

			isum = k512_dp(isum, _mm512_maddubs_epi16(u01, x01),
				       _mm512_permutexvar_epi16(k512_idx(8 * h, 8), s16), vnni);
			isum = k512_dp(isum, _mm512_maddubs_epi16(u23, x23),
				       _mm512_permutexvar_epi16(k512_idx(8 * h + 4, 8), s16),
				       vnni);
		}
		acc += ops_kq_combine(x[i].d, kq_h2f(b[i].d), 0.0f,
				      _mm512_reduce_add_epi32(isum) - 32 * corr, 0);
	}
	return acc;
}

/* The two instances of each body (see top of this section). */
#define KQ512_KERNELS(t)                                                        \
	KQ_AVX512 static float dot_##t##_avx512(const void *w,                  \
						const struct ops_block_q8_k *x, \
						uint32_t n)                     \
	{                                                                       \
		return t##_512(w, x, n, false);                                 \
	}                                                                       \
	KQ_AVX512 static float dot_##t##_vnni(const void *w,                    \
					      const struct ops_block_q8_k *x,   \
					      uint32_t n)                       \
	{                                                                       \
		return t##_512(w, x, n, true);                                  \
	}
KQ512_KERNELS(q2_k)
KQ512_KERNELS(q3_k)
KQ512_KERNELS(q4_k)
KQ512_KERNELS(q5_k)
KQ512_KERNELS(q6_k)

const ops_kq_dot_fn ops_kq_dot_avx512[OPS_KQ_N] = {
	dot_q2_k_avx512, dot_q3_k_avx512, dot_q4_k_avx512, dot_q5_k_avx512,
	dot_q6_k_avx512,
};

const ops_kq_dot_fn ops_kq_dot_avx512vnni[OPS_KQ_N] = {
	dot_q2_k_vnni, dot_q3_k_vnni, dot_q4_k_vnni, dot_q5_k_vnni, dot_q6_k_vnni,
};

const ops_kq_dot_fn ops_kq_dot_avx2[OPS_KQ_N] = {
	dot_q2_k_avx2, dot_q3_k_avx2, dot_q4_k_avx2, dot_q5_k_avx2, dot_q6_k_avx2,
};
#else
const ops_kq_dot_fn ops_kq_dot_avx2[OPS_KQ_N] = {
	dot_q2_k_ref, dot_q3_k_ref, dot_q4_k_ref, dot_q5_k_ref, dot_q6_k_ref,
};
const ops_kq_dot_fn ops_kq_dot_avx512[OPS_KQ_N] = {
	dot_q2_k_ref, dot_q3_k_ref, dot_q4_k_ref, dot_q5_k_ref, dot_q6_k_ref,
};
const ops_kq_dot_fn ops_kq_dot_avx512vnni[OPS_KQ_N] = {
	dot_q2_k_ref, dot_q3_k_ref, dot_q4_k_ref, dot_q5_k_ref, dot_q6_k_ref,
};
#endif
