/* test_fingerprint.c - the model fingerprint cache (conf/fingerprint.c).
 *
 * Every answer is checked against SHA-256 of the file's bytes computed here,
 * so a cache that hands back a stale or forged digest fails. Files are
 * created once and aged past the racy window (the cache stores nothing for
 * a file whose ctime is under a second old), then each case works on its
 * own file and its own cache directory.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "conf/fingerprint.h"

#define N_FILES 8
#define FILE_BYTES (3 * 1024 * 1024 + 17)

static char g_root[] = "/tmp/kvd_fp_XXXXXX";

static void path_of(int i, char *out, size_t n)
{
	snprintf(out, n, "%s/model%d.gguf", g_root, i);
}

static void cache_of(int i, char *out, size_t n)
{
	snprintf(out, n, "%s/cache%d", g_root, i);
}

static void fill(uint8_t *b, size_t n, unsigned seed)
{
	uint32_t x = seed * 2654435761u + 1;

	for (size_t i = 0; i < n; i++) {
		x = x * 1664525u + 1013904223u;
		b[i] = (uint8_t)(x >> 24);
	}
}

/* The digest the fingerprint must equal: hash the file's bytes here. */
static void expect_hex(const char *path, char hex[SHA256_HEX_SIZE])
{
	uint8_t d[SHA256_DIGEST_SIZE];
	struct sha256 c;
	uint8_t buf[65536];
	size_t n;
	FILE *f = fopen(path, "rb");

	ck_assert_ptr_nonnull(f);
	sha256_init(&c);
	while ((n = fread(buf, 1, sizeof(buf), f)) > 0)
		sha256_update(&c, buf, n);
	fclose(f);
	sha256_final(&c, d);
	sha256_hex(d, hex);
}

/* Outside any test (Check's asserts need one): failures exit. */
static void setup_once(void)
{
	uint8_t *b = malloc(FILE_BYTES);
	char p[256];

	if (!b || !mkdtemp(g_root)) {
		perror("setup");
		exit(1);
	}
	for (int i = 0; i < N_FILES; i++) {
		FILE *f;

		fill(b, FILE_BYTES, (unsigned)i + 1);
		path_of(i, p, sizeof(p));
		f = fopen(p, "wb");
		if (!f || fwrite(b, 1, FILE_BYTES, f) != FILE_BYTES || fclose(f)) {
			perror(p);
			exit(1);
		}
	}
	free(b);
	usleep(1200 * 1000); /* past the racy window: entries may be stored */
}

/* Hash (miss, stored), then hit: same digest, file not read. */
static void prime(int i, char hex[SHA256_HEX_SIZE])
{
	char p[256], dir[256], want[SHA256_HEX_SIZE];
	struct kvd_fp_info fi;

	path_of(i, p, sizeof(p));
	cache_of(i, dir, sizeof(dir));
	expect_hex(p, want);
	ck_assert_int_eq(kvd_fingerprint(p, dir, hex, &fi), 0);
	ck_assert_str_eq(hex, want);
	ck_assert(!fi.cached);
	ck_assert_str_eq(fi.lookup, "absent");
	ck_assert_str_eq(fi.store, "stored");
	ck_assert_uint_eq(fi.hashed_bytes, FILE_BYTES);
	ck_assert_int_eq(kvd_fingerprint(p, dir, hex, &fi), 0);
	ck_assert_str_eq(hex, want);
	ck_assert(fi.cached);
	ck_assert_str_eq(fi.lookup, "hit");
	ck_assert_uint_eq(fi.hashed_bytes, 0);
}

static void entry_path(int i, char *out, size_t n)
{
	char p[256], dir[256];
	struct stat st;

	path_of(i, p, sizeof(p));
	cache_of(i, dir, sizeof(dir));
	ck_assert_int_eq(stat(p, &st), 0);
	snprintf(out, n, "%s/model-%llx-%llx.fp", dir,
		 (unsigned long long)st.st_dev, (unsigned long long)st.st_ino);
}

START_TEST(test_no_cache)
{
	char p[256], hex[SHA256_HEX_SIZE], want[SHA256_HEX_SIZE];
	struct kvd_fp_info fi;

	path_of(0, p, sizeof(p));
	expect_hex(p, want);
	ck_assert_int_eq(kvd_fingerprint(p, NULL, hex, &fi), 0);
	ck_assert_str_eq(hex, want);
	ck_assert_str_eq(fi.lookup, "off");
	ck_assert(!fi.cached);
	ck_assert_int_eq(kvd_fingerprint(p, "", hex, NULL), 0);
	ck_assert_str_eq(hex, want);
	ck_assert_int_eq(kvd_fingerprint("/nonexistent/kvd/model.gguf", NULL,
					 hex, &fi), -ENOENT);
}
END_TEST

START_TEST(test_hit_and_entry_mode)
{
	char hex[SHA256_HEX_SIZE], e[512];
	struct stat st;

	prime(1, hex);
	entry_path(1, e, sizeof(e));
	ck_assert_int_eq(lstat(e, &st), 0);
	ck_assert(S_ISREG(st.st_mode));
	ck_assert_uint_eq(st.st_mode & 0777, 0600);
}
END_TEST

/* The model rewritten in place: same size, the old mtime put back. Only
 * ctime tells, and the cache must not hide the change. */
START_TEST(test_in_place_rewrite_same_size_same_mtime)
{
	char p[256], dir[256], hex[SHA256_HEX_SIZE], old[SHA256_HEX_SIZE],
	     want[SHA256_HEX_SIZE];
	struct kvd_fp_info fi;
	struct stat st0, st1;
	struct timespec ts[2];
	int fd;

	prime(2, old);
	path_of(2, p, sizeof(p));
	cache_of(2, dir, sizeof(dir));
	ck_assert_int_eq(stat(p, &st0), 0);
	fd = open(p, O_WRONLY);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(pwrite(fd, "\x5a", 1, FILE_BYTES / 2), 1);
	ts[0] = st0.st_atim;
	ts[1] = st0.st_mtim;
	ck_assert_int_eq(futimens(fd, ts), 0);
	ck_assert_int_eq(close(fd), 0);
	ck_assert_int_eq(stat(p, &st1), 0);
	ck_assert_int_eq(st1.st_size, st0.st_size);
	ck_assert_int_eq(st1.st_mtim.tv_sec, st0.st_mtim.tv_sec);
	ck_assert_int_eq(st1.st_mtim.tv_nsec, st0.st_mtim.tv_nsec);
	ck_assert_int_eq(st1.st_ino, st0.st_ino);

	expect_hex(p, want);
	ck_assert_str_ne(want, old);
	ck_assert_int_eq(kvd_fingerprint(p, dir, hex, &fi), 0);
	ck_assert_str_eq(hex, want);
	ck_assert(!fi.cached);
	ck_assert_str_eq(fi.lookup, "stale");
	/* its ctime is now: nothing is stored until it settles */
	ck_assert_str_eq(fi.store, "skipped_recent");
	ck_assert_int_eq(kvd_fingerprint(p, dir, hex, &fi), 0);
	ck_assert_str_eq(hex, want);
	ck_assert(!fi.cached);
}
END_TEST

/* Entries that are not exactly ours are misses; the real digest comes
 * back and a good entry replaces them. */
START_TEST(test_corrupt_entries)
{
	static const char *const bad[] = {
		"",
		"garbage\n",
		"kvd-fingerprint v1 dev=1 ino=2 size=3 mtime_ns=4 ctime_ns=5 sha256=00\n",
	};
	char hex[SHA256_HEX_SIZE], want[SHA256_HEX_SIZE], e[512], p[256],
	     dir[256], line[512], forged[600];
	struct kvd_fp_info fi;
	FILE *f;
	size_t n;

	prime(3, want);
	path_of(3, p, sizeof(p));
	cache_of(3, dir, sizeof(dir));
	entry_path(3, e, sizeof(e));
	f = fopen(e, "r");
	ck_assert_ptr_nonnull(f);
	ck_assert_ptr_nonnull(fgets(line, sizeof(line), f));
	fclose(f);
	n = strlen(line);
	ck_assert(n > 66 && line[n - 1] == '\n');

	for (size_t i = 0; i < 3 + 8; i++) {
		const char *text;
		char *q;

		switch (i) {
		case 7: /* the seed in uppercase hex */
		case 8: /* the evidence one digit off */
		case 9: /* the evidence one digit short */
		case 10: /* seed and evidence swapped in place */
			snprintf(forged, sizeof(forged), "%s", line);
			q = strstr(forged, i == 7 ? " seed=" : " evidence=");
			ck_assert_ptr_nonnull(q);
			q += i == 7 ? 6 : 10;
			if (i == 7) {
				for (int j = 0; j < 16; j++)
					q[j] = (char)(q[j] >= 'a' ? q[j] - 32 : q[j]);
				if (!strpbrk(q, "ABCDEF"))
					q[0] = 'A';  /* all digits: force one letter */
			} else if (i == 8) {
				q[5] = q[5] == '0' ? '1' : '0';
			} else if (i == 9) {
				memmove(q, q + 1, strlen(q + 1) + 1);
			} else {
				char *sd = strstr(forged, " seed="), tmp[600];

				snprintf(tmp, sizeof(tmp), "%.*s evidence=%.64s seed=%.16s sha256=%s",
					 (int)(sd - forged), forged, q, sd + 6,
					 strstr(forged, " sha256=") + 8);
				snprintf(forged, sizeof(forged), "%s", tmp);
			}
			text = forged;
			break;
		case 3: /* the right line with an uppercase digest */
			snprintf(forged, sizeof(forged), "%.*s%s\n", (int)(n - 65),
				 line, "E3B0C44298FC1C149AFBF4C8996FB92427AE41E4649B934CA495991B7852B855");
			text = forged;
			break;
		case 4: /* trailing bytes */
			snprintf(forged, sizeof(forged), "%sx", line);
			text = forged;
			break;
		case 5: /* no newline */
			snprintf(forged, sizeof(forged), "%.*s", (int)(n - 1), line);
			text = forged;
			break;
		case 6: /* longer than any entry */
			memset(forged, 'k', sizeof(forged) - 1);
			forged[sizeof(forged) - 1] = '\0';
			text = forged;
			break;
		default:
			text = bad[i];
		}
		f = fopen(e, "w");
		ck_assert_ptr_nonnull(f);
		fputs(text, f);
		fclose(f);
		ck_assert_int_eq(chmod(e, 0600), 0);
		ck_assert_int_eq(kvd_fingerprint(p, dir, hex, &fi), 0);
		ck_assert_msg(!fi.cached, "case %zu trusted", i);
		ck_assert_str_eq(hex, want);
		ck_assert_msg(!strcmp(fi.lookup, i == 8 ? "evidence" : "corrupt") ||
				      (i != 8 && !strcmp(fi.lookup, "stale")),
			      "case %zu: lookup=%s", i, fi.lookup);
		ck_assert_str_eq(fi.store, "stored");
		/* rewritten: the next boot hits again */
		ck_assert_int_eq(kvd_fingerprint(p, dir, hex, &fi), 0);
		ck_assert(fi.cached);
		ck_assert_str_eq(hex, want);
	}
}
END_TEST

/* A well-formed entry with a forged digest is used only where nobody else
 * could have written it: group-writable entry, symlinked entry and a
 * directory others may write are all refused. */
START_TEST(test_unsafe_modes)
{
	char hex[SHA256_HEX_SIZE], want[SHA256_HEX_SIZE], e[512], p[256],
	     dir[256], line[512], target[600];
	const char *zero = "0000000000000000000000000000000000000000000000000000000000000000";
	struct kvd_fp_info fi;
	FILE *f;
	size_t n;

	prime(4, want);
	path_of(4, p, sizeof(p));
	cache_of(4, dir, sizeof(dir));
	entry_path(4, e, sizeof(e));
	f = fopen(e, "r");
	ck_assert_ptr_nonnull(f);
	ck_assert_ptr_nonnull(fgets(line, sizeof(line), f));
	fclose(f);
	n = strlen(line);
	snprintf(line + n - 65, sizeof(line) - (n - 65), "%s\n", zero);

	/* group-writable entry */
	f = fopen(e, "w");
	fputs(line, f);
	fclose(f);
	ck_assert_int_eq(chmod(e, 0620), 0);
	ck_assert_int_eq(kvd_fingerprint(p, dir, hex, &fi), 0);
	ck_assert_str_eq(fi.lookup, "unsafe_entry");
	ck_assert(!fi.cached);
	ck_assert_str_eq(hex, want);

	/* symlink to a forged entry */
	snprintf(target, sizeof(target), "%s/forged", g_root);
	f = fopen(target, "w");
	fputs(line, f);
	fclose(f);
	ck_assert_int_eq(chmod(target, 0600), 0);
	ck_assert_int_eq(unlink(e), 0);
	ck_assert_int_eq(symlink(target, e), 0);
	ck_assert_int_eq(kvd_fingerprint(p, dir, hex, &fi), 0);
	ck_assert_str_eq(fi.lookup, "unsafe_entry");
	ck_assert_str_eq(hex, want);
	/* rename replaced the link with a real entry; the target is intact */
	ck_assert_int_eq(kvd_fingerprint(p, dir, hex, &fi), 0);
	ck_assert(fi.cached);
	f = fopen(target, "r");
	ck_assert_ptr_nonnull(fgets(line, sizeof(line), f));
	fclose(f);
	ck_assert_ptr_nonnull(strstr(line, zero));

	/* forged entry in a directory others may write */
	f = fopen(e, "w");
	fputs(line, f);
	fclose(f);
	ck_assert_int_eq(chmod(e, 0600), 0);
	ck_assert_int_eq(chmod(dir, 0777), 0);
	ck_assert_int_eq(kvd_fingerprint(p, dir, hex, &fi), 0);
	ck_assert_str_eq(fi.lookup, "unsafe_dir");
	ck_assert_str_eq(fi.store, "unsafe_dir");
	ck_assert(!fi.cached);
	ck_assert_str_eq(hex, want);
	ck_assert_int_eq(chmod(dir, 0700), 0);
	/* the forged entry is still there and now counts: proof that the
	 * directory mode, not luck, refused it above */
	ck_assert_int_eq(kvd_fingerprint(p, dir, hex, &fi), 0);
	ck_assert(fi.cached);
	ck_assert_str_eq(hex, zero);
}
END_TEST

/* Issue 22 item 2: two files with the same metadata (device, inode, size,
 * mtime, ctime - as two copies of a file-system image can have) and other
 * bytes. The cache entry written for one must not name the other: the
 * lookup is fed the first file's stat for the second file's descriptor
 * (kvd__fingerprint_stat) and must answer the second file's own digest,
 * by the content evidence ("evidence"). Files differing in the header
 * (first MiB), the last block, or everywhere are all caught; a hit reads
 * a bounded amount whatever the size. */
START_TEST(test_same_metadata_other_bytes)
{
	static const struct {
		const char *what;
		long off;        /* byte changed in a copy of file 7; -1: file 6 */
	} t[] = {
		{ "another file of the same size", -1 },
		{ "one byte in the header", 100 },
		{ "one byte at the end", FILE_BYTES - 1 },
		{ "the last byte of the header", (1 << 20) - 1 },
	};
	char hex[SHA256_HEX_SIZE], a_hex[SHA256_HEX_SIZE], want[SHA256_HEX_SIZE],
	     a[256], b[256], dir[256], cmd[700];
	struct kvd_fp_info fi;
	struct stat sa;

	prime(7, a_hex);
	path_of(7, a, sizeof(a));
	cache_of(7, dir, sizeof(dir));
	ck_assert_int_eq(stat(a, &sa), 0);
	/* a hit checks the evidence, reading a bounded part of the file */
	ck_assert_int_eq(kvd_fingerprint(a, dir, hex, &fi), 0);
	ck_assert(fi.cached);
	ck_assert_uint_gt(fi.evidence_bytes, 1u << 20);
	ck_assert_uint_le(fi.evidence_bytes, (1u << 20) + 66u * 4096u);
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		int fd;

		if (t[i].off < 0) {
			path_of(6, b, sizeof(b));
		} else {
			snprintf(b, sizeof(b), "%s/copy%zu.gguf", g_root, i);
			snprintf(cmd, sizeof(cmd), "cp '%s' '%s'", a, b);
			ck_assert_int_eq(system(cmd), 0);
			fd = open(b, O_RDWR);
			ck_assert_int_ge(fd, 0);
			ck_assert_int_eq(pwrite(fd, "\xa5", 1, t[i].off), 1);
			close(fd);
		}
		expect_hex(b, want);
		ck_assert_str_ne(want, a_hex);
		fd = open(b, O_RDONLY);
		ck_assert_int_ge(fd, 0);
		ck_assert_int_eq(kvd__fingerprint_stat(fd, &sa, dir, hex, &fi), 0);
		close(fd);
		ck_assert_msg(!strcmp(hex, want), "%s: got the first file's digest (lookup=%s)",
			      t[i].what, fi.lookup);
		ck_assert(!fi.cached);
		ck_assert_str_eq(fi.lookup, "evidence");
		ck_assert_uint_eq(fi.hashed_bytes, FILE_BYTES);
	}
	/* the entry of the first file still serves it */
	ck_assert_int_eq(kvd_fingerprint(a, dir, hex, &fi), 0);
	ck_assert_str_eq(hex, a_hex);
	ck_assert(fi.cached);
	/* forget drops it: the next start hashes in full */
	ck_assert_int_eq(kvd_fingerprint_forget(dir, fi.dev, fi.ino), 0);
	ck_assert_int_eq(kvd_fingerprint(a, dir, hex, &fi), 0);
	ck_assert_str_eq(fi.lookup, "absent");
	ck_assert_str_eq(hex, a_hex);
	ck_assert_int_eq(kvd_fingerprint_forget(dir, fi.dev, fi.ino), 0);
	ck_assert_int_eq(kvd_fingerprint_forget(dir, fi.dev, fi.ino), 0); /* twice: fine */
}
END_TEST

/* A missing directory is created 0700; a file in its place is an error
 * reported in info, never a failure of the fingerprint. */
START_TEST(test_dir_create_and_error)
{
	char p[256], dir[256], hex[SHA256_HEX_SIZE], want[SHA256_HEX_SIZE];
	struct kvd_fp_info fi;
	struct stat st;

	path_of(5, p, sizeof(p));
	expect_hex(p, want);
	cache_of(5, dir, sizeof(dir));
	ck_assert_int_eq(kvd_fingerprint(p, dir, hex, &fi), 0);
	ck_assert_int_eq(stat(dir, &st), 0);
	ck_assert_uint_eq(st.st_mode & 0777, 0700);
	ck_assert_str_eq(fi.store, "stored");

	ck_assert_int_eq(kvd_fingerprint(p, p, hex, &fi), 0); /* a file */
	ck_assert_str_eq(fi.lookup, "dir_error");
	ck_assert_str_eq(hex, want);
	ck_assert(!fi.cached);
}
END_TEST

START_TEST(test_cache_dir_resolution)
{
	char out[64];

	unsetenv("CACHE_DIRECTORY");
	kvd_fingerprint_cache_dir("", out, sizeof(out));
	ck_assert_str_eq(out, "");
	kvd_fingerprint_cache_dir("/var/cache/x", out, sizeof(out));
	ck_assert_str_eq(out, "/var/cache/x");
	setenv("CACHE_DIRECTORY", "/var/cache/kvd:/var/cache/other", 1);
	kvd_fingerprint_cache_dir("", out, sizeof(out));
	ck_assert_str_eq(out, "/var/cache/kvd");
	kvd_fingerprint_cache_dir("off", out, sizeof(out));
	ck_assert_str_eq(out, "");
	setenv("CACHE_DIRECTORY", "relative/dir", 1);
	kvd_fingerprint_cache_dir("", out, sizeof(out));
	ck_assert_str_eq(out, "");
	unsetenv("CACHE_DIRECTORY");
}
END_TEST

int main(void)
{
	Suite *s = suite_create("fingerprint");
	TCase *tc = tcase_create("fingerprint");
	SRunner *sr;
	int failed;

	setup_once();
	tcase_add_test(tc, test_no_cache);
	tcase_add_test(tc, test_hit_and_entry_mode);
	tcase_add_test(tc, test_in_place_rewrite_same_size_same_mtime);
	tcase_add_test(tc, test_corrupt_entries);
	tcase_add_test(tc, test_unsafe_modes);
	tcase_add_test(tc, test_same_metadata_other_bytes);
	tcase_add_test(tc, test_dir_create_and_error);
	tcase_add_test(tc, test_cache_dir_resolution);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	{
		char cmd[300];

		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_root);
		if (system(cmd) != 0)
			failed++;
	}
	return failed ? 1 : 0;
}
