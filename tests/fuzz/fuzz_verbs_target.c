/* fuzz_verbs_target.c - the writing side's check of a peer's scope runs
 * (net/verbs/verbs_target.h): the runs come from decode, untrusted.
 *
 * Input bytes:
 *   byte 0        n_dst (1..32) and page_bytes (4096, 1, 2^40, 2^63)
 *   then n_dst    destination pages (a byte each: small, so runs collide)
 *   then          n_runs (0..8), per run: 4 bytes first_page (byte 0 also
 *                 selects a value near 2^32), 2 bytes n_pages (0 and
 *                 huge values included), 8 bytes addr, 1 byte rkey
 * Missing bytes read as 0. Properties beyond "no crash":
 *   - the verdict is 0 or a VERBS_TARGET_E_* code; a refusal has one
 *     non-empty line;
 *   - accepted exactly when a brute-force reference says the runs are
 *     non-empty, do not wrap, name only destination pages, each at most
 *     once, cover every destination page, and the request names no page
 *     twice;
 *   - accepted: every destination page is found in exactly the run that
 *     holds it, at addr + (page - first_page) x page_bytes, with its rkey;
 *     a page outside every run is not found.
 */
#include <errno.h>
#include <string.h>

#include "net/verbs/verbs_target.h"
#include "tests/fuzz/fuzz.h"

const char fuzz_target_name[] = "verbs_target";

#define MAX_DST 32
#define MAX_RUNS 8

struct cursor {
	const uint8_t *p;
	size_t n, off;
};

static uint64_t take(struct cursor *c, int bytes)
{
	uint64_t v = 0;

	for (int i = 0; i < bytes; i++)
		v |= (uint64_t)(c->off < c->n ? c->p[c->off++] : 0) << (8 * i);
	return v;
}

static bool reference_ok(const struct proto_peer_run *runs, uint32_t n_runs,
			 const uint32_t *dst, uint32_t n_dst, uint64_t pb)
{
	uint8_t cover[256] = { 0 }, is_dst[256] = { 0 };

	if (!n_runs)
		return false;
	for (uint32_t i = 0; i < n_dst; i++) {
		if (is_dst[dst[i]])
			return false;
		is_dst[dst[i]] = 1;
	}
	for (uint32_t i = 0; i < n_runs; i++) {
		const struct proto_peer_run *r = &runs[i];

		if (!r->n_pages)
			return false;
		if ((uint64_t)r->first_page + r->n_pages - 1 > UINT32_MAX)
			return false;
		if (r->n_pages > (UINT64_MAX - r->addr) / pb)
			return false;
	}
	for (uint32_t i = 0; i < n_runs; i++) {
		const struct proto_peer_run *r = &runs[i];

		/* more pages than destinations: one is foreign */
		/* in 64 bits: a run at the top of the page numbers must not
		 * wrap to an empty loop here (it did, and the reference took
		 * a run naming pages 0xfffffffe..0xffffffff as harmless) */
		if (r->n_pages > n_dst || (uint64_t)r->first_page + r->n_pages > 256)
			return false;
		for (uint32_t p = r->first_page; p < r->first_page + r->n_pages; p++) {
			if (!is_dst[p] || cover[p])
				return false;
			cover[p] = 1;
		}
	}
	for (uint32_t i = 0; i < n_dst; i++)
		if (!cover[dst[i]])
			return false;
	return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const uint64_t pbs[4] = { 4096, 1, 1ull << 40, 1ull << 63 };
	struct cursor c = { data, size, 0 };
	struct proto_peer_run runs[MAX_RUNS];
	uint32_t dst[MAX_DST], n_dst, n_runs;
	uint64_t pb, b0 = take(&c, 1);
	char why[200];
	int r;

	n_dst = 1 + (uint32_t)(b0 % MAX_DST);
	pb = pbs[(b0 >> 5) & 3];
	for (uint32_t i = 0; i < n_dst; i++)
		dst[i] = (uint32_t)take(&c, 1);
	n_runs = (uint32_t)(take(&c, 1) % (MAX_RUNS + 1));
	for (uint32_t i = 0; i < n_runs; i++) {
		uint32_t fp = (uint32_t)take(&c, 4);

		runs[i].first_page = (fp & 0x80) ? UINT32_MAX - (fp & 0x7f) : fp & 0xff;
		runs[i].n_pages = (uint32_t)take(&c, 2);
		if (runs[i].n_pages & 0x8000)
			runs[i].n_pages = UINT32_MAX - (runs[i].n_pages & 0xff);
		runs[i].addr = take(&c, 8);
		runs[i].rkey = (uint32_t)take(&c, 1);
	}
	why[0] = '\0';
	r = verbs_target_check(runs, n_runs, dst, n_dst, pb, why, sizeof(why));
	FUZZ_CHECK(r == 0 || (r >= VERBS_TARGET_E_EMPTY && r <= VERBS_TARGET_E_UNCOVERED),
		   "verdict %d", r);
	FUZZ_CHECK((r == 0) == reference_ok(runs, n_runs, dst, n_dst, pb),
		   "verdict %d (%s), reference %d", r, why,
		   reference_ok(runs, n_runs, dst, n_dst, pb));
	if (r) {
		FUZZ_CHECK(why[0] && !strchr(why, '\n'), "sentence '%s'", why);
		return 0;
	}
	for (uint32_t i = 0; i < n_dst; i++) {
		uint64_t addr = 0;
		uint32_t rkey = 0, hits = 0, k = 0;

		for (uint32_t j = 0; j < n_runs; j++)
			if (dst[i] >= runs[j].first_page &&
			    dst[i] - runs[j].first_page < runs[j].n_pages) {
				hits++;
				k = j;
			}
		FUZZ_CHECK(hits == 1, "page %u in %u runs", dst[i], hits);
		FUZZ_CHECK(verbs_target_find(runs, n_runs, dst[i], pb, &addr, &rkey) == 0,
			   "page %u not found", dst[i]);
		FUZZ_CHECK(addr == runs[k].addr + (uint64_t)(dst[i] - runs[k].first_page) * pb &&
			   rkey == runs[k].rkey, "page %u target", dst[i]);
	}
	for (uint32_t p = 0; p < 256; p++) {
		bool in = false;
		uint64_t addr;
		uint32_t rkey;

		for (uint32_t i = 0; i < n_dst; i++)
			in |= dst[i] == p;
		if (!in)
			FUZZ_CHECK(verbs_target_find(runs, n_runs, p, pb, &addr, &rkey) == -ENOENT,
				   "foreign page %u found", p);
	}
	return 0;
}

static void seed(fuzz_emit_fn emit, void *ctx, const uint8_t *b, size_t n)
{
	emit(ctx, b, n);
}

void fuzz_target_seeds(fuzz_emit_fn emit, void *ctx)
{
	/* 3 destination pages 5, 6, 9 at page_bytes 4096; runs
	 * {5, 2, 0x1000, 7} and {9, 1, 0x9000, 8}: accepted */
	static const uint8_t ok[] = {
		2, 5, 6, 9, 2,
		5, 0, 0, 0, 2, 0, 0x00, 0x10, 0, 0, 0, 0, 0, 0, 7,
		9, 0, 0, 0, 1, 0, 0x00, 0x90, 0, 0, 0, 0, 0, 0, 8,
	};
	/* the same with the second run one page long too far: foreign */
	static const uint8_t foreign[] = {
		2, 5, 6, 9, 2,
		5, 0, 0, 0, 2, 0, 0x00, 0x10, 0, 0, 0, 0, 0, 0, 7,
		9, 0, 0, 0, 2, 0, 0x00, 0x90, 0, 0, 0, 0, 0, 0, 8,
	};
	/* overlapping runs */
	static const uint8_t overlap[] = {
		2, 5, 6, 9, 2,
		5, 0, 0, 0, 2, 0, 0x00, 0x10, 0, 0, 0, 0, 0, 0, 7,
		6, 0, 0, 0, 1, 0, 0x00, 0x90, 0, 0, 0, 0, 0, 0, 8,
	};
	/* an address at the top of the space: wraps */
	static const uint8_t wrap[] = {
		0, 5, 1,
		5, 0, 0, 0, 1, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 1,
	};

	seed(emit, ctx, ok, sizeof(ok));
	seed(emit, ctx, foreign, sizeof(foreign));
	seed(emit, ctx, overlap, sizeof(overlap));
	seed(emit, ctx, wrap, sizeof(wrap));
}
