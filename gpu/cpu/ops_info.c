/* ops_info.c - the kernel variant per weight type (see ops_info.h).
 *
 * The variant of a type is the narrowest table that holds the same dot
 * function pointer as the table in use - narrowest first, because a wider
 * table reuses narrower kernels for what it has none of (the "avx512"
 * table runs the AVX2 F32/F16/Q8_0/Q4_0 dots). For F32, F16, Q8_0 and
 * Q4_0 that is the one-row dot (decode) and the three-token dot (prefill);
 * when they differ both are named, "avx2+avx512" (decode+prefill). K-quant
 * dots come from the per-width arrays ops_kq_dot_scalar/avx2/avx512/
 * avx512vnni. Wider
 * tables are looked at only when the CPU reported their width; their
 * functions are compared here, never called.
 */
#include "gpu/cpu/ops_info.h"

#include <stdio.h>
#include <string.h>

#include "gpu/cpu/ops_cpu.h"
#include "gpu/cpu/ops_kq.h"

/* The dot kernel of type t in table k (decode when !prefill). */
static const void *dot_of(const struct ops_kernels *k, enum ggml_type t,
			  bool prefill)
{
	int i = ops_kq_index(t);

	if (i >= 0)
		return (const void *)k->dot_kq[i];
	switch (t) {
	case GGML_TYPE_F32:
		return prefill ? (const void *)k->dot3_f32 : (const void *)k->dot_f32;
	case GGML_TYPE_F16:
		return prefill ? (const void *)k->dot3_f16 : (const void *)k->dot_f16;
	case GGML_TYPE_Q8_0:
		return prefill ? (const void *)k->dot3_q8_0 : (const void *)k->dot_q8_0;
	case GGML_TYPE_Q4_0:
		return prefill ? (const void *)k->dot3_q4_0 : (const void *)k->dot_q4_0;
	default:
		return NULL;
	}
}

#define N_TABLES 4
/* narrowest first; "avx512vnni" is the avx512 table with VNNI kernels */
#define TABLE_NAMES(X) X(scalar) X(avx2) X(avx512) X(avx512vnni)

static const char *variant_of(const struct ops_kernels *k, enum ggml_type t,
			      bool prefill)
{
	const struct ops_kernels *tables[N_TABLES] = {
		ops_kernels_scalar(), ops_kernels_avx2(), ops_kernels_avx512(),
		ops_kernels_avx512vnni(),
	};
	const void *f = dot_of(k, t, prefill);

	for (size_t i = 0; i < N_TABLES; i++)
		if (tables[i] && f && dot_of(tables[i], t, prefill) == f)
			return tables[i]->name;
	return k->name;
}

const char *ops_kernel_variant(const struct ops_kernels *k, enum ggml_type t)
{
	/* every (decode, prefill) pair of names: a static string per pair */
#define NAME(n) #n,
#define PAIR_ROW(d) { PAIR_COLS(d) },
#define PAIR(d, p) #d "+" #p,
#define PAIR_COLS(d) PAIR(d, scalar) PAIR(d, avx2) PAIR(d, avx512) PAIR(d, avx512vnni)
	static const char *const names[N_TABLES] = { TABLE_NAMES(NAME) };
	static const char *const pairs[N_TABLES][N_TABLES] = { TABLE_NAMES(PAIR_ROW) };
#undef NAME
#undef PAIR_ROW
#undef PAIR
#undef PAIR_COLS
	const char *d, *p;
	int a = -1, b = -1;

	if (!k || !ops_type_supported(t))
		return "none";
	d = variant_of(k, t, false);
	p = variant_of(k, t, true);
	if (!strcmp(d, p))
		return d;
	for (int i = 0; i < N_TABLES; i++) {
		if (!strcmp(d, names[i]))
			a = i;
		if (!strcmp(p, names[i]))
			b = i;
	}
	return a >= 0 && b >= 0 ? pairs[a][b] : d;
}
