/* driver.c - a deterministic mutation fuzzer for any compiler.
 *
 * libFuzzer needs clang; CI builds with gcc (release, and ASan+UBSan). So
 * every target (fuzz_<name>.c) is also linked with this main(), which
 * fuzzes it without coverage feedback but with the same property checks:
 *
 *   1. seeds: the target's own (fuzz_target_seeds(), built with kvd's
 *      writers at run time) plus every file of the directories/files
 *      named on the command line (tests/fuzz/corpus/<name>/: committed
 *      text seeds and minimized regressions);
 *   2. each seed as is, then truncated at every length (seeds up to 4 KiB;
 *      larger ones at every length of the first 512 bytes and then in 512
 *      steps), because most decoder bugs sit at a boundary;
 *   3. a stream of mutants, each 1..8 stacked edits of a seed or of a
 *      recent mutant: bit flips, random and "interesting" bytes, integers
 *      at 1/2/4/8 bytes in either byte order (0, -1, 0x7FFFFFFF,
 *      0xFFFFFFFF, 2^63, huge lengths, the input's own length +-1), small
 *      arithmetic on an integer, byte insert/delete, chunk duplication,
 *      splice and cross-over with another seed, truncation, appending,
 *      and decimal numbers in text replaced by extreme ones (2^64, 1e300,
 *      nan, -1) for the text formats.
 *
 * Everything is a function of the seed (env KVD_SEED, printed; random when
 * unset) and the iteration number, so "seed=S iteration=I" replays a
 * failure. The loop stops after KVD_FUZZ_ITERS inputs (default 40000) or
 * KVD_FUZZ_SECONDS (default 15), whichever comes first, so a slow
 * sanitizer build still ends in time.
 *
 * When an input crashes (signal, sanitizer report, FUZZ_CHECK), the input
 * is written to $KVD_FUZZ_ARTIFACTS (default: the current directory) as
 * crash-<name>-<seed>-<iteration> before the process dies, and
 * `fuzz_<name> --replay FILE` runs it alone.
 *
 * Built with -DKVD_FUZZ_LIBFUZZER (tests/fuzz/run), the same binary is a
 * libFuzzer fuzzer: `--seeds DIR` writes the target's seeds, `--mutate`
 * runs this loop, anything else goes to LLVMFuzzerRunDriver().
 *
 * The crash bookkeeping (the current input, for the signal handler) is
 * the one piece of global mutable state; it is test scaffolding and lives
 * only here.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "tests/fuzz/fuzz.h"

#define FUZZ_MAX_INPUT (1u << 20)   /* mutants never grow beyond this */
#define FUZZ_RING 64                /* recent mutants kept as bases */

/* ---- sanitizer defaults ------------------------------------------------- */

/* Make the sanitizers fatal even when the environment says nothing (the
 * environment still wins): a UBSan report that lets the input go on is a
 * passed test that should have failed. */
const char *__asan_default_options(void);
const char *__ubsan_default_options(void);
const char *__asan_default_options(void)
{
	return "abort_on_error=1:detect_leaks=1";
}

const char *__ubsan_default_options(void)
{
	return "halt_on_error=1:print_stacktrace=1";
}

void __sanitizer_set_death_callback(void (*cb)(void)) __attribute__((weak));

/* ---- crash bookkeeping -------------------------------------------------- */

static struct {
	const uint8_t *data;       /* (len) bytes of the input being run */
	size_t len;
	char path[4096];           /* where it goes if the process dies */
	volatile sig_atomic_t saved;
} crash;

static void crash_save(void)
{
	int fd;

	if (crash.saved || !crash.data || !crash.path[0])
		return;
	crash.saved = 1;
	fd = open(crash.path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return;
	for (size_t o = 0; o < crash.len;) {
		ssize_t w = write(fd, crash.data + o, crash.len - o);

		if (w <= 0)
			break;
		o += (size_t)w;
	}
	close(fd);
	/* async-signal-safe report: write(2) of fixed strings only */
	static const char a[] = "fuzz driver: crashing input saved to ";
	(void)!write(2, a, sizeof(a) - 1);
	(void)!write(2, crash.path, strlen(crash.path));
	(void)!write(2, "\n", 1);
}

static void crash_signal(int sig)
{
	crash_save();
	signal(sig, SIG_DFL);
	raise(sig);
}

static void crash_install(void)
{
	static const int sigs[] = { SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL };

	for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++)
		signal(sigs[i], crash_signal);
	if (__sanitizer_set_death_callback)
		__sanitizer_set_death_callback(crash_save);
}

static void run_one(const uint8_t *data, size_t len)
{
	/* A private copy: a target that writes into its input, or reads one
	 * byte past it, meets ASan instead of the next input. */
	uint8_t *copy = malloc(len ? len : 1);

	if (!copy) {
		fprintf(stderr, "fuzz driver: out of memory\n");
		abort();
	}
	memcpy(copy, data, len);
	crash.data = copy;
	crash.len = len;
	LLVMFuzzerTestOneInput(copy, len);
	if (memcmp(copy, data, len)) {
		fprintf(stderr, "fuzz_%s: the target wrote into its input\n",
			fuzz_target_name);
		abort();
	}
	crash.data = NULL;
	free(copy);
}

/* ---- inputs ------------------------------------------------------------- */

struct blob {
	uint8_t *p;     /* (n) bytes */
	size_t n;
};

struct blobs {
	struct blob *v; /* (n) inputs, each owned */
	size_t n, cap;
};

static void blobs_add(struct blobs *b, const void *p, size_t n)
{
	if (b->n == b->cap) {
		size_t cap = b->cap ? b->cap * 2 : 16;
		struct blob *v = realloc(b->v, cap * sizeof(*v));

		if (!v)
			abort();
		b->v = v;
		b->cap = cap;
	}
	b->v[b->n].p = malloc(n ? n : 1);
	if (!b->v[b->n].p)
		abort();
	memcpy(b->v[b->n].p, p, n);
	b->v[b->n].n = n;
	b->n++;
}

static void blobs_free(struct blobs *b)
{
	for (size_t i = 0; i < b->n; i++)
		free(b->v[i].p);
	free(b->v);
	b->v = NULL;
	b->n = b->cap = 0;
}

static void seeds_emit(void *ctx, const void *data, size_t len)
{
	blobs_add(ctx, data, len);
}

static int read_file(const char *path, struct blobs *b)
{
	FILE *f = fopen(path, "rb");
	uint8_t *buf = NULL;
	size_t n = 0, cap = 0;

	if (!f)
		return -errno;
	for (;;) {
		if (n == cap) {
			cap = cap ? cap * 2 : 4096;
			uint8_t *nb = realloc(buf, cap);

			if (!nb)
				abort();
			buf = nb;
		}
		size_t r = fread(buf + n, 1, cap - n, f);

		n += r;
		if (r == 0)
			break;
	}
	fclose(f);
	if (n <= FUZZ_MAX_INPUT)
		blobs_add(b, buf, n);
	free(buf);
	return 0;
}

static int names_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every regular file of a directory, in name order (deterministic). */
static int read_path(const char *path, struct blobs *b)
{
	struct stat st;
	DIR *d;
	struct dirent *e;
	char **names = NULL;
	size_t n = 0, cap = 0;

	if (stat(path, &st) < 0)
		return -errno;
	if (!S_ISDIR(st.st_mode))
		return read_file(path, b);
	d = opendir(path);
	if (!d)
		return -errno;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.' || !strcmp(e->d_name, "README"))
			continue;
		if (n == cap) {
			cap = cap ? cap * 2 : 16;
			char **nn = realloc(names, cap * sizeof(*nn));

			if (!nn)
				abort();
			names = nn;
		}
		if (asprintf(&names[n], "%s/%s", path, e->d_name) < 0)
			abort();
		n++;
	}
	closedir(d);
	qsort(names, n, sizeof(*names), names_cmp);
	for (size_t i = 0; i < n; i++) {
		if (stat(names[i], &st) == 0 && S_ISREG(st.st_mode))
			read_file(names[i], b);
		free(names[i]);
	}
	free(names);
	return 0;
}

/* ---- randomness --------------------------------------------------------- */

/* splitmix64: the loop's only randomness. */
static uint64_t rng_next(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static size_t rng_below(uint64_t *s, size_t n)
{
	return n ? (size_t)(rng_next(s) % n) : 0;
}

/* ---- mutation ----------------------------------------------------------- */

struct mutant {
	uint8_t *p;     /* (cap) bytes, [0, n) the input */
	size_t n, cap;
};

static void mutant_reserve(struct mutant *m, size_t n)
{
	if (n <= m->cap)
		return;
	size_t cap = m->cap ? m->cap : 256;

	while (cap < n)
		cap *= 2;
	uint8_t *p = realloc(m->p, cap);

	if (!p)
		abort();
	m->p = p;
	m->cap = cap;
}

static void mutant_set(struct mutant *m, const uint8_t *p, size_t n)
{
	mutant_reserve(m, n);
	memcpy(m->p, p, n);
	m->n = n;
}

static void mutant_insert(struct mutant *m, size_t at, const uint8_t *p,
			  size_t n)
{
	if (m->n + n > FUZZ_MAX_INPUT)
		return;
	mutant_reserve(m, m->n + n);
	memmove(m->p + at + n, m->p + at, m->n - at);
	if (p)
		memcpy(m->p + at, p, n);
	m->n += n;
}

static void mutant_delete(struct mutant *m, size_t at, size_t n)
{
	memmove(m->p + at, m->p + at + n, m->n - at - n);
	m->n -= n;
}

/* Write the low `w` bytes of v at `at`, little- or big-endian. */
static void put_int(struct mutant *m, size_t at, unsigned w, uint64_t v,
		    bool be)
{
	if (at + w > m->n)
		return;
	for (unsigned i = 0; i < w; i++)
		m->p[at + (be ? w - 1 - i : i)] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_int(const struct mutant *m, size_t at, unsigned w, bool be)
{
	uint64_t v = 0;

	for (unsigned i = 0; i < w && at + w <= m->n; i++)
		v |= (uint64_t)m->p[at + (be ? w - 1 - i : i)] << (8 * i);
	return v;
}

static uint64_t interesting(uint64_t *s, size_t len)
{
	static const uint64_t v[] = {
		0, 1, 2, 3, 4, 7, 8, 16, 31, 32, 63, 64, 0x7f, 0x80, 0xff,
		0x100, 0x7fff, 0x8000, 0xffff, 0x10000, 0xfffff, 0x100000,
		0x100001, 0x7fffffff, 0x80000000, 0xfffffffe, 0xffffffff,
		0x100000000ull, 0x40000000, 0x3fffffff, 1ull << 40, 1ull << 62,
		0x7fffffffffffffffull, 0x8000000000000000ull,
		0xfffffffffffffffeull, 0xffffffffffffffffull,
	};
	size_t k = rng_below(s, sizeof(v) / sizeof(v[0]) + 3);

	if (k < sizeof(v) / sizeof(v[0]))
		return v[k];
	/* the input's own length and its neighbours: off-by-one bait */
	return (uint64_t)len + k - sizeof(v) / sizeof(v[0]) - 1;
}

static void mutate_once(struct mutant *m, const struct blobs *pool,
			uint64_t *s)
{
	static const unsigned widths[] = { 1, 2, 4, 8 };
	size_t at = rng_below(s, m->n + 1);
	size_t k, n;
	uint8_t tmp[16];

	switch (rng_below(s, 14)) {
	case 0: /* flip a bit */
		if (m->n)
			m->p[rng_below(s, m->n)] ^= (uint8_t)(1u << rng_below(s, 8));
		break;
	case 1: /* random byte */
		if (m->n)
			m->p[rng_below(s, m->n)] = (uint8_t)rng_next(s);
		break;
	case 2: /* interesting byte */
		if (m->n) {
			/* ... and msgpack's empty str/map/array, nil and
			 * 32-bit containers; text delimiters */
			static const uint8_t b[] = { 0, 1, 0x7f, 0x80, 0xff,
						     0x20, '=', '[', '\n', 0xc0,
						     0xdc, 0xdd, 0xde, 0xdf,
						     0xa0, 0x90, '"', '\\' };
			m->p[rng_below(s, m->n)] = b[rng_below(s, sizeof(b))];
		}
		break;
	case 3: /* interesting integer, either byte order */
	case 4: {
		unsigned w = widths[rng_below(s, 4)];

		if (m->n >= w)
			put_int(m, rng_below(s, m->n - w + 1), w,
				interesting(s, m->n), rng_next(s) & 1);
		break;
	}
	case 5: { /* add or subtract a little */
		unsigned w = widths[rng_below(s, 4)];
		bool be = rng_next(s) & 1;

		if (m->n >= w) {
			at = rng_below(s, m->n - w + 1);
			int64_t d = (int64_t)rng_below(s, 35) - 17;

			put_int(m, at, w, get_int(m, at, w, be) + (uint64_t)d, be);
		}
		break;
	}
	case 6: /* insert random bytes */
		n = 1 + rng_below(s, 16);
		for (k = 0; k < n; k++)
			tmp[k] = (uint8_t)rng_next(s);
		mutant_insert(m, at, tmp, n);
		break;
	case 7: /* delete a range */
		if (m->n) {
			at = rng_below(s, m->n);
			n = 1 + rng_below(s, (m->n - at) < 64 ? m->n - at : 64);
			mutant_delete(m, at, n);
		}
		break;
	case 8: /* duplicate a chunk somewhere else */
		if (m->n) {
			size_t from = rng_below(s, m->n);

			n = 1 + rng_below(s, m->n - from < 256 ? m->n - from : 256);
			uint8_t *c = malloc(n);

			if (!c)
				abort();
			memcpy(c, m->p + from, n);
			mutant_insert(m, rng_below(s, m->n + 1), c, n);
			free(c);
		}
		break;
	case 9: { /* splice: our prefix, another seed's suffix */
		const struct blob *o = &pool->v[rng_below(s, pool->n)];
		size_t cut = rng_below(s, o->n + 1);

		m->n = at;
		mutant_insert(m, m->n, o->p + cut, o->n - cut);
		break;
	}
	case 10: { /* cross-over: overwrite with another seed's bytes */
		const struct blob *o = &pool->v[rng_below(s, pool->n)];

		if (o->n && m->n) {
			size_t from = rng_below(s, o->n);

			at = rng_below(s, m->n);
			n = 1 + rng_below(s, o->n - from);
			if (n > m->n - at)
				n = m->n - at;
			memcpy(m->p + at, o->p + from, n);
		}
		break;
	}
	case 11: /* truncate */
		m->n = rng_below(s, m->n + 1);
		break;
	case 12: { /* a decimal number in text becomes an extreme one */
		static const char *const nums[] = {
			"0", "-1", "1", "4294967295", "4294967296",
			"18446744073709551615", "18446744073709551616",
			"9223372036854775808", "1e300", "-1e300", "1e-300",
			"nan", "inf", "0x10", "00000000000000000000001",
			"99999999999999999999999999999", "0.0000001",
		};
		size_t i = m->n ? rng_below(s, m->n) : 0, j;

		while (i < m->n && (m->p[i] < '0' || m->p[i] > '9'))
			i++;
		if (i == m->n)
			break;
		for (j = i; j < m->n && ((m->p[j] >= '0' && m->p[j] <= '9') ||
					 m->p[j] == '.'); j++)
			;
		const char *v = nums[rng_below(s, sizeof(nums) / sizeof(nums[0]))];

		mutant_delete(m, i, j - i);
		mutant_insert(m, i, (const uint8_t *)v, strlen(v));
		break;
	}
	default: /* append a copy of another seed (two frames in a stream) */
		if (pool->n) {
			const struct blob *o = &pool->v[rng_below(s, pool->n)];

			mutant_insert(m, m->n, o->p, o->n);
		}
		break;
	}
}

/* ---- the loop ----------------------------------------------------------- */

struct opts {
	uint64_t seed;
	uint64_t iters;
	double seconds;
	const char *artifacts;
};

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void crash_path_set(const struct opts *o, uint64_t iter)
{
	snprintf(crash.path, sizeof(crash.path), "%s/crash-%s-%" PRIu64 "-%" PRIu64,
		 o->artifacts, fuzz_target_name, o->seed, iter);
}

static int fuzz_loop(const struct opts *o, struct blobs *seeds)
{
	struct blobs ring = { 0 };
	struct mutant m = { 0 };
	uint64_t iter = 0, truncs = 0;
	double t0 = now_s(), deadline = t0 + o->seconds;
	size_t ring_next = 0;

	fprintf(stderr, "fuzz_%s: seed=%" PRIu64 " (KVD_SEED=%" PRIu64
		" to replay) seeds=%zu iters<=%" PRIu64 " seconds<=%.0f\n",
		fuzz_target_name, o->seed, o->seed, seeds->n, o->iters,
		o->seconds);
	if (!seeds->n) {
		uint8_t z = 0;

		blobs_add(seeds, &z, 0);
	}

	/* seeds as they are, then truncated */
	for (size_t i = 0; i < seeds->n; i++) {
		const struct blob *b = &seeds->v[i];

		crash_path_set(o, iter);
		run_one(b->p, b->n);
		iter++;
		for (size_t len = 0; len < b->n; len++) {
			if (b->n > 4096 && len > 512 && len % 512)
				continue;
			crash_path_set(o, iter);
			run_one(b->p, len);
			iter++;
			truncs++;
		}
	}

	/* mutants */
	while (iter < o->iters) {
		if ((iter & 63) == 0 && now_s() > deadline)
			break;
		/* the iteration's own stream: replay needs only (seed, iter) */
		uint64_t is = o->seed ^ (iter * 0xd1b54a32d192ed03ull);
		const struct blob *base;

		rng_next(&is);
		if (ring.n && rng_below(&is, 10) < 3)
			base = &ring.v[rng_below(&is, ring.n)];
		else
			base = &seeds->v[rng_below(&is, seeds->n)];
		mutant_set(&m, base->p, base->n);
		size_t k = 1 + rng_below(&is, 8);

		if (rng_below(&is, 2))
			k = 1 + rng_below(&is, 2);
		while (k--)
			mutate_once(&m, seeds, &is);
		crash_path_set(o, iter);
		run_one(m.p, m.n);
		iter++;

		/* keep some mutants as bases: deeper edits without coverage */
		if (m.n <= 65536 && rng_below(&is, 4) == 0) {
			if (ring.n < FUZZ_RING) {
				blobs_add(&ring, m.p, m.n);
			} else {
				struct blob *r = &ring.v[ring_next++ % FUZZ_RING];
				uint8_t *p = realloc(r->p, m.n ? m.n : 1);

				if (!p)
					abort();
				memcpy(p, m.p, m.n);
				r->p = p;
				r->n = m.n;
			}
		}
	}
	fprintf(stderr, "fuzz_%s: %" PRIu64 " inputs (%" PRIu64
		" truncations) in %.1f s, no property violated\n",
		fuzz_target_name, iter, truncs, now_s() - t0);
	free(m.p);
	blobs_free(&ring);
	return 0;
}

static int write_seeds(const char *dir)
{
	struct blobs b = { 0 };
	char path[4096];

	fuzz_target_seeds(seeds_emit, &b);
	for (size_t i = 0; i < b.n; i++) {
		snprintf(path, sizeof(path), "%s/seed-%s-%03zu", dir,
			 fuzz_target_name, i);
		FILE *f = fopen(path, "wb");

		if (!f || fwrite(b.v[i].p, 1, b.v[i].n, f) != b.v[i].n) {
			fprintf(stderr, "fuzz_%s: cannot write %s: %s\n",
				fuzz_target_name, path, strerror(errno));
			if (f)
				fclose(f);
			blobs_free(&b);
			return 1;
		}
		fclose(f);
	}
	fprintf(stderr, "fuzz_%s: %zu seeds written to %s\n",
		fuzz_target_name, b.n, dir);
	blobs_free(&b);
	return 0;
}

static int replay(int argc, char **argv)
{
	struct blobs b = { 0 };

	for (int i = 0; i < argc; i++) {
		size_t before = b.n;

		if (read_path(argv[i], &b) < 0) {
			fprintf(stderr, "fuzz_%s: cannot read %s\n",
				fuzz_target_name, argv[i]);
			blobs_free(&b);
			return 2;
		}
		for (size_t k = before; k < b.n; k++) {
			snprintf(crash.path, sizeof(crash.path), "%s",
				 "/dev/null");
			run_one(b.v[k].p, b.v[k].n);
		}
	}
	fprintf(stderr, "fuzz_%s: %zu inputs replayed, no property violated\n",
		fuzz_target_name, b.n);
	blobs_free(&b);
	return 0;
}

static uint64_t env_u64(const char *name, uint64_t def)
{
	const char *v = getenv(name);
	char *end;

	if (!v || !*v)
		return def;
	errno = 0;
	unsigned long long x = strtoull(v, &end, 0);

	return errno || *end ? def : (uint64_t)x;
}

static int usage(const char *prog)
{
	fprintf(stderr,
		"usage: %s [PATH...]          mutate seeds + PATH files/dirs\n"
		"       %s --replay PATH...   run these inputs once\n"
		"       %s --seeds DIR        write the target's seeds\n"
		"env: KVD_SEED, KVD_FUZZ_ITERS (40000), KVD_FUZZ_SECONDS (15),\n"
		"     KVD_FUZZ_ARTIFACTS (.)\n",
		prog, prog, prog);
	return 2;
}

#ifdef KVD_FUZZ_LIBFUZZER
int LLVMFuzzerRunDriver(int *argc, char ***argv,
			int (*cb)(const uint8_t *data, size_t size));
#endif

int main(int argc, char **argv)
{
	struct opts o = { 0 };
	struct blobs seeds = { 0 };
	int r;

	if (argc >= 2 && !strcmp(argv[1], "--help"))
		return usage(argv[0]);
	if (argc == 3 && !strcmp(argv[1], "--seeds"))
		return write_seeds(argv[2]);
#ifdef KVD_FUZZ_LIBFUZZER
	if (argc < 2 || strcmp(argv[1], "--mutate"))
		return LLVMFuzzerRunDriver(&argc, &argv, LLVMFuzzerTestOneInput);
	argv++;
	argc--;
#endif
	crash_install();
	if (argc >= 2 && !strcmp(argv[1], "--replay"))
		return replay(argc - 2, argv + 2);

	o.seed = env_u64("KVD_SEED", 0);
	if (!getenv("KVD_SEED") || !*getenv("KVD_SEED")) {
		struct timespec ts;

		clock_gettime(CLOCK_REALTIME, &ts);
		o.seed = ((uint64_t)ts.tv_sec * 1000003u) ^ (uint64_t)ts.tv_nsec ^
			 ((uint64_t)getpid() << 32);
	}
	o.iters = env_u64("KVD_FUZZ_ITERS", 40000);
	o.seconds = (double)env_u64("KVD_FUZZ_SECONDS", 15);
	o.artifacts = getenv("KVD_FUZZ_ARTIFACTS");
	if (!o.artifacts || !*o.artifacts)
		o.artifacts = ".";

	fuzz_target_seeds(seeds_emit, &seeds);
	for (int i = 1; i < argc; i++) {
		if (argv[i][0] == '-')
			return usage(argv[0]);
		/* a missing corpus directory is fine: not every target has one */
		read_path(argv[i], &seeds);
	}
	r = fuzz_loop(&o, &seeds);
	blobs_free(&seeds);
	return r;
}
