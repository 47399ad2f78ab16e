/* test_prepack.c - the repack cache (gpu/model/prepack.c).
 *
 * A generated Q4_0 model with Q6_K attn_v/ffn_down/output (so both the
 * Q4_0 and a K-quant layout are in one file) is bound through
 * prepack_bind with and without a cache directory; every packed copy must
 * equal, byte for byte, the one ops_mat_pack makes (the kernels then read
 * the same bytes, so outputs are bit-identical: tests/integration/
 * pack_cache.sh checks that on kvd generate's tokens). Cases: written then
 * reused (the second bind packs nothing), every kind of damaged, foreign
 * or stale file refused by name and rebuilt, unsafe files and directories
 * refused, several processes binding at once.
 *
 * The cleanup of the directory (prepack_clean, tcase "clean"): files
 * planted by hand (a pack header, then zeros), aged with utimensat:
 * another model's file older than the retention removed, a younger one
 * kept, the bound file kept; another format or layout removed at once;
 * symlinks (and their targets), directories, FIFOs and other users'
 * files left; a file a process holds (flock) left; keep_days 0; the
 * bound on entries read; an unsafe directory; a failure logged, not
 * returned. Through prepack_bind (tcase "cache"): the bound file is
 * touched and locked, others cleaned only when the key asks.
 *
 * Only the avx512vnni table has packed layouts: without it the "cache"
 * cases do not run (the "clean" ones need no kernels).
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <time.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "conf/log.h"
#include "conf/sha256.h"
#include "gpu/model/gguf_gen.h"
#include "gpu/model/model.h"
#include "gpu/cpu/ops_cpu.h"
#include "gpu/model/prepack.h"

#define SHA_A "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
#define SHA_B "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210"
#define MAX_MATS 64

static char g_root[] = "/tmp/kvd_pack_XXXXXX";
static struct model *g_m;
static const struct ops_kernels *g_k;

/* The model's matrices, fresh (packed NULL). */
struct mats {
	struct ops_mat m[MAX_MATS];
	struct ops_mat *p[MAX_MATS];
	uint32_t n;
};

static void mats_init(struct mats *s)
{
	s->n = 0;
	for (uint32_t l = 0; l < g_m->hp.n_layer; l++) {
		const struct model_layer *L = &g_m->layers[l];
		const struct ops_mat *src[] = { &L->wq, &L->wk, &L->wv, &L->wo,
						&L->w_gate, &L->w_up, &L->w_down };

		for (size_t i = 0; i < 7; i++)
			s->m[s->n++] = *src[i];
	}
	s->m[s->n++] = g_m->output;
	for (uint32_t i = 0; i < s->n; i++) {
		s->m[i].packed = NULL;
		s->p[i] = &s->m[i];
	}
}

/* Every copy equals ops_mat_pack's; returns how many matrices have one. */
static uint32_t check_copies(const struct mats *s)
{
	uint32_t n = 0;

	for (uint32_t i = 0; i < s->n; i++) {
		size_t b = ops_mat_packed_bytes(g_k, &s->m[i]);
		void *ref = NULL;

		ck_assert_int_eq(ops_mat_pack(g_k, &s->m[i], &ref), 0);
		ck_assert_int_eq(!!ref, !!b);
		ck_assert_int_eq(!!s->m[i].packed, !!b);
		if (b) {
			ck_assert_msg(!memcmp(ref, s->m[i].packed, b),
				      "matrix %u: packed copy differs", i);
			n++;
		}
		free(ref);
	}
	return n;
}

/* Bind with dir and sha; check the verdicts and the copies. */
static void bind_expect(const char *dir, const char *sha, const char *lookup,
			const char *store)
{
	struct prepack_key key = { .dir = dir, .sha256 = sha };
	struct prepack_info info;
	struct prepack *p;
	struct mats s;
	uint32_t n;

	mats_init(&s);
	ck_assert_int_eq(prepack_bind(&p, g_k, s.p, s.n, &key, &info), 0);
	ck_assert_msg(!strcmp(info.lookup, lookup), "lookup %s, want %s",
		      info.lookup, lookup);
	ck_assert_msg(!strcmp(info.store, store), "store %s, want %s",
		      info.store, store);
	n = check_copies(&s);
	ck_assert_uint_gt(n, 8);
	if (!strcmp(lookup, "hit")) {
		ck_assert_uint_eq(info.mapped, n);
		ck_assert_uint_eq(info.packed, 0); /* nothing repacked */
	} else {
		ck_assert_uint_eq(info.mapped, 0);
		ck_assert_uint_eq(info.packed, n);
	}
	prepack_free(p);
}

static void fresh_dir(char *out, size_t n, const char *name)
{
	char cmd[600];

	snprintf(out, n, "%s/%s", g_root, name);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", out);
	ck_assert_int_eq(system(cmd), 0);
}

static void entry_path(char *out, size_t n, const char *dir, const char *sha)
{
	char name[128];

	prepack_entry_name(sha, g_k->name, name, sizeof(name));
	snprintf(out, n, "%s/%s", dir, name);
}

static long file_size(const char *path)
{
	struct stat st;

	ck_assert_int_eq(stat(path, &st), 0);
	return (long)st.st_size;
}

static void patch(const char *path, long off, const void *b, size_t n)
{
	int fd = open(path, O_WRONLY);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(pwrite(fd, b, n, off), (ssize_t)n);
	close(fd);
}

static void flip(const char *path, long off)
{
	uint8_t c;
	int fd = open(path, O_RDWR);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(pread(fd, &c, 1, off), 1);
	c ^= 0x40;
	ck_assert_int_eq(pwrite(fd, &c, 1, off), 1);
	close(fd);
}

/* Header offsets (struct pk_hdr in prepack.c): magic 0, format 8, layout
 * 12, variant 16..47, sha256 48..111, n_ent 112, ent_size 116, data_off
 * 120, file_size 128, sum 136..167; table from 168 (32 bytes each). */
#define OFF_LAYOUT 12
#define OFF_VARIANT 16
#define OFF_SHA 48
#define OFF_SUM 136
#define HDR_SIZE 168

/* Recompute the header checksum after a patch (a well-formed file that
 * differs only in what the patch changed). */
static void reseal(const char *path)
{
	uint8_t h[HDR_SIZE], sum[SHA256_DIGEST_SIZE];
	uint32_t n_ent;
	uint8_t *tab;
	struct sha256 c;
	int fd = open(path, O_RDWR);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(pread(fd, h, sizeof(h), 0), (ssize_t)sizeof(h));
	memcpy(&n_ent, h + 112, 4);
	tab = malloc((size_t)n_ent * 32);
	ck_assert_ptr_nonnull(tab);
	ck_assert_int_eq(pread(fd, tab, (size_t)n_ent * 32, HDR_SIZE), (ssize_t)n_ent * 32);
	memset(h + OFF_SUM, 0, SHA256_DIGEST_SIZE);
	sha256_init(&c);
	sha256_update(&c, h, sizeof(h));
	sha256_update(&c, tab, (size_t)n_ent * 32);
	sha256_final(&c, sum);
	ck_assert_int_eq(pwrite(fd, sum, sizeof(sum), OFF_SUM), (ssize_t)sizeof(sum));
	free(tab);
	close(fd);
}

static uint64_t first_data_off(const char *path)
{
	uint64_t off;
	int fd = open(path, O_RDONLY);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(pread(fd, &off, 8, 120), 8);
	close(fd);
	return off;
}

START_TEST(test_no_dir_packs)
{
	bind_expect(NULL, NULL, "off", "off");
	bind_expect("", SHA_A, "off", "off");
}
END_TEST

START_TEST(test_written_then_reused)
{
	char dir[512], path[700];
	struct stat st;

	fresh_dir(dir, sizeof(dir), "reuse");
	bind_expect(dir, SHA_A, "absent", "stored");
	entry_path(path, sizeof(path), dir, SHA_A);
	ck_assert_int_eq(stat(path, &st), 0);
	ck_assert_int_eq(st.st_mode & 0777, 0600);
	ck_assert_int_eq(stat(dir, &st), 0);
	ck_assert_int_eq(st.st_mode & 0777, 0700); /* made by the bind */
	bind_expect(dir, SHA_A, "hit", "-");
	bind_expect(dir, SHA_A, "hit", "-");
	/* another model's fingerprint has its own file */
	bind_expect(dir, SHA_B, "absent", "stored");
	bind_expect(dir, SHA_A, "hit", "-");
}
END_TEST

/* Issue 22 item 8: a cache file truncated while a process uses it (by
 * the same user: the ownership checks cannot stop that) must not kill the
 * process with SIGBUS. Bind - by a store and by a hit (the file's pages
 * under a read lease) and by a hit while another descriptor holds the
 * file open for writing (no lease: a private copy) -, then
 * truncate the file to half and to 0 and read every packed copy: all
 * still equal ops_mat_pack's. A truncation by the lease holder's own
 * process waits until the watcher thread copied the mapping. A bind after
 * the truncation refuses the file by name and packs again. */
START_TEST(test_truncated_while_bound)
{
	static const struct {
		const char *lookup, *store, *hold;
		bool writer;
	} t[] = {
		{ "absent", "stored", "lease", false },
		{ "hit", "-", "lease", false },
		{ "hit", "-", "copy", true },
	};
	char dir[512], path[700];

	fresh_dir(dir, sizeof(dir), "trunc_live");
	entry_path(path, sizeof(path), dir, SHA_A);
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		struct prepack_key key = { .dir = dir, .sha256 = SHA_A };
		struct prepack_info info;
		struct prepack *p;
		struct mats s;
		int wfd = -1;
		long sz;

		if (i == 2)   /* the last case's file: a fresh store, then held */
			bind_expect(dir, SHA_A, "truncated", "stored");
		if (t[i].writer) {
			wfd = open(path, O_RDWR);
			ck_assert_int_ge(wfd, 0);
		}
		mats_init(&s);
		ck_assert_int_eq(prepack_bind(&p, g_k, s.p, s.n, &key, &info), 0);
		ck_assert_str_eq(info.lookup, t[i].lookup);
		ck_assert_str_eq(info.store, t[i].store);
		ck_assert_msg(!strcmp(info.hold, t[i].hold), "case %zu: hold %s, want %s",
			      i, info.hold, t[i].hold);
		sz = file_size(path);
		ck_assert_int_eq(truncate(path, sz / 2), 0);
		ck_assert_uint_gt(check_copies(&s), 8);  /* SIGBUS here before */
		ck_assert_int_eq(truncate(path, 0), 0);
		ck_assert_uint_gt(check_copies(&s), 8);
		prepack_free(p);
		if (wfd >= 0)
			close(wfd);
		if (i == 0) {
			/* the truncated file is refused by name and rebuilt */
			bind_expect(dir, SHA_A, "truncated", "stored");
		}
	}
}
END_TEST

/* Each damage is refused with its name, the file rebuilt, then a hit. */
START_TEST(test_damaged_rebuilt)
{
	char dir[512], path[700];
	uint32_t v;
	long sz;

	fresh_dir(dir, sizeof(dir), "damage");
	entry_path(path, sizeof(path), dir, SHA_A);
	bind_expect(dir, SHA_A, "absent", "stored");
	sz = file_size(path);

	ck_assert_int_eq(truncate(path, sz / 2), 0);
	bind_expect(dir, SHA_A, "truncated", "stored");
	ck_assert_int_eq(file_size(path), sz);
	bind_expect(dir, SHA_A, "hit", "-");

	ck_assert_int_eq(truncate(path, sz - 1), 0);
	bind_expect(dir, SHA_A, "truncated", "stored");
	ck_assert_int_eq(truncate(path, 100), 0);
	bind_expect(dir, SHA_A, "truncated", "stored");
	ck_assert_int_eq(truncate(path, 0), 0);
	bind_expect(dir, SHA_A, "truncated", "stored");
	/* grown: the size in the header no longer matches */
	ck_assert_int_eq(truncate(path, sz + 4096), 0);
	bind_expect(dir, SHA_A, "truncated", "stored");
	bind_expect(dir, SHA_A, "hit", "-");

	flip(path, 0); /* magic */
	bind_expect(dir, SHA_A, "corrupt", "stored");
	flip(path, OFF_VARIANT); /* under the checksum */
	bind_expect(dir, SHA_A, "corrupt", "stored");
	flip(path, HDR_SIZE + 24); /* an entry's offset */
	bind_expect(dir, SHA_A, "corrupt", "stored");
	flip(path, OFF_SUM + 5);
	bind_expect(dir, SHA_A, "corrupt", "stored");

	/* an entry's offset pointing past the end, resealed */
	{
		uint64_t big = (uint64_t)sz + 4096;

		patch(path, HDR_SIZE + 16, &big, 8);
		reseal(path);
		bind_expect(dir, SHA_A, "corrupt", "stored");
		big = ~(uint64_t)0 - 4095; /* overflow of off + bytes */
		patch(path, HDR_SIZE + 16, &big, 8);
		reseal(path);
		bind_expect(dir, SHA_A, "corrupt", "stored");
		big = 8192; /* not after the table / overlapping: aligned, inside */
		patch(path, HDR_SIZE + 32 + 16, &big, 8);
		reseal(path);
		bind_expect(dir, SHA_A, "corrupt", "stored");
	}

	/* well-formed files that are not ours to use */
	v = OPS_PACK_LAYOUT + 1;
	patch(path, OFF_LAYOUT, &v, 4);
	reseal(path);
	bind_expect(dir, SHA_A, "version", "stored");
	patch(path, OFF_VARIANT, "avx2\0\0\0\0", 8);
	reseal(path);
	bind_expect(dir, SHA_A, "variant", "stored");
	patch(path, OFF_SHA, SHA_B, 64);
	reseal(path);
	bind_expect(dir, SHA_A, "fingerprint", "stored");
	v = 1000; /* an entry's row count */
	patch(path, HDR_SIZE + 8, &v, 4);
	reseal(path);
	bind_expect(dir, SHA_A, "shape", "stored");

	/* a byte of the packed data in the first rows: the spot check */
	flip(path, (long)first_data_off(path) + 3);
	bind_expect(dir, SHA_A, "content", "stored");
	bind_expect(dir, SHA_A, "hit", "-");
}
END_TEST

START_TEST(test_unsafe_refused)
{
	char dir[512], path[700], other[700], cmd[3000];

	fresh_dir(dir, sizeof(dir), "unsafe");
	entry_path(path, sizeof(path), dir, SHA_A);
	bind_expect(dir, SHA_A, "absent", "stored");

	/* a file others may write: refused, replaced by ours */
	ck_assert_int_eq(chmod(path, 0666), 0);
	bind_expect(dir, SHA_A, "unsafe_entry", "stored");
	bind_expect(dir, SHA_A, "hit", "-");
	ck_assert_int_eq(chmod(path, 0620), 0);
	bind_expect(dir, SHA_A, "unsafe_entry", "stored");

	/* a symlink to a valid file: not followed */
	snprintf(other, sizeof(other), "%s/elsewhere.kvpack", g_root);
	snprintf(cmd, sizeof(cmd), "cp '%s' '%s' && ln -sf '%s' '%s'", path, other,
		 other, path);
	ck_assert_int_eq(system(cmd), 0);
	bind_expect(dir, SHA_A, "unsafe_entry", "stored");
	bind_expect(dir, SHA_A, "hit", "-");

	/* a directory others may write: nothing read, nothing stored */
	ck_assert_int_eq(chmod(dir, 0777), 0);
	bind_expect(dir, SHA_A, "unsafe_dir", "unsafe_dir");
	ck_assert_int_eq(chmod(dir, 0730), 0);
	bind_expect(dir, SHA_A, "unsafe_dir", "unsafe_dir");
	ck_assert_int_eq(chmod(dir, 0700), 0);
	bind_expect(dir, SHA_A, "hit", "-");

	/* owned by another user (only root can make one) */
	if (geteuid() == 0) {
		ck_assert_int_eq(chown(path, 65534, 65534), 0);
		bind_expect(dir, SHA_A, "unsafe_entry", "stored");
		bind_expect(dir, SHA_A, "hit", "-");
	}

	/* the directory is a file: packed in memory, said why */
	bind_expect(path, SHA_A, "dir_error", "dir_error");
}
END_TEST

START_TEST(test_bad_key)
{
	struct prepack_key key = { .dir = g_root, .sha256 = "abc" };
	struct prepack *p = (struct prepack *)1;
	struct mats s;

	mats_init(&s);
	ck_assert_int_eq(prepack_bind(&p, g_k, s.p, s.n, &key, NULL), -EINVAL);
	ck_assert_ptr_null(p);
	key.sha256 = "0123456789ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef";
	ck_assert_int_eq(prepack_bind(&p, g_k, s.p, s.n, &key, NULL), -EINVAL);
	key.sha256 = NULL;
	ck_assert_int_eq(prepack_bind(&p, g_k, s.p, s.n, &key, NULL), -EINVAL);
	for (uint32_t i = 0; i < s.n; i++)
		ck_assert_ptr_null(s.m[i].packed);
}
END_TEST

/* Several processes start at once on an empty directory: each gets
 * correct copies, one file remains, no temporary file is left, and the
 * next start is a hit. */
START_TEST(test_concurrent_starts)
{
	enum { N = 4 };
	char dir[512];
	int go[2], st;
	pid_t pid[N];
	DIR *d;
	struct dirent *de;
	int files = 0;

	fresh_dir(dir, sizeof(dir), "race");
	ck_assert_int_eq(mkdir(dir, 0700), 0);
	ck_assert_int_eq(pipe(go), 0);
	for (int i = 0; i < N; i++) {
		pid[i] = fork();
		ck_assert_int_ge(pid[i], 0);
		if (pid[i] == 0) {
			struct prepack_key key = { .dir = dir, .sha256 = SHA_A };
			struct prepack_info info;
			struct prepack *p;
			struct mats s;
			char c;

			close(go[1]);
			if (read(go[0], &c, 1) != 0)
				_exit(3);
			mats_init(&s);
			if (prepack_bind(&p, g_k, s.p, s.n, &key, &info))
				_exit(4);
			/* a racer may find the file another one renamed */
			if (strcmp(info.store, "stored") && strcmp(info.lookup, "hit"))
				_exit(5);
			for (uint32_t j = 0; j < s.n; j++) {
				size_t b = ops_mat_packed_bytes(g_k, &s.m[j]);
				void *ref = NULL;

				if (ops_mat_pack(g_k, &s.m[j], &ref) ||
				    (b && memcmp(ref, s.m[j].packed, b)))
					_exit(6);
				free(ref);
			}
			prepack_free(p);
			_exit(0);
		}
	}
	close(go[0]);
	close(go[1]); /* all start now */
	for (int i = 0; i < N; i++) {
		ck_assert_int_eq(waitpid(pid[i], &st, 0), pid[i]);
		ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0,
			      "child %d: status %d", i, st);
	}
	d = opendir(dir);
	ck_assert_ptr_nonnull(d);
	while ((de = readdir(d))) {
		if (de->d_name[0] == '.' && (!de->d_name[1] ||
					     !strcmp(de->d_name, "..")))
			continue;
		ck_assert_msg(!strstr(de->d_name, ".tmp"), "left: %s", de->d_name);
		files++;
	}
	closedir(d);
	ck_assert_int_eq(files, 1);
	bind_expect(dir, SHA_A, "hit", "-");
}
END_TEST

/* A store that fails (here: the file size limit, which binds root too)
 * leaves no file behind and falls back to private copies, all correct. */
START_TEST(test_store_fails)
{
	char dir[512];
	pid_t pid;
	int st;
	DIR *d;
	struct dirent *de;

	fresh_dir(dir, sizeof(dir), "full");
	ck_assert_int_eq(mkdir(dir, 0700), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		struct rlimit rl = { .rlim_cur = 65536, .rlim_max = 65536 };
		struct prepack_key key = { .dir = dir, .sha256 = SHA_A };
		struct prepack_info info;
		struct prepack *p;
		struct mats s;

		signal(SIGXFSZ, SIG_IGN);
		if (setrlimit(RLIMIT_FSIZE, &rl))
			_exit(2);
		mats_init(&s);
		if (prepack_bind(&p, g_k, s.p, s.n, &key, &info))
			_exit(3);
		if (strcmp(info.lookup, "absent") || strcmp(info.store, "error") ||
		    info.err != EFBIG || info.mapped)
			_exit(4);
		if (check_copies(&s) != info.packed)
			_exit(5);
		prepack_free(p);
		_exit(0);
	}
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child status %d", st);
	d = opendir(dir);
	ck_assert_ptr_nonnull(d);
	while ((de = readdir(d)))
		ck_assert_msg(de->d_name[0] == '.' && (!de->d_name[1] ||
						       !strcmp(de->d_name, "..")),
			      "left behind: %s", de->d_name);
	closedir(d);
	bind_expect(dir, SHA_A, "absent", "stored");
}
END_TEST

/* A crashed writer's temporary file is removed once it is old; a fresh
 * one (maybe a live writer's) is left alone. */
START_TEST(test_stale_tmp_swept)
{
	char dir[512], name[128], old[900], young[900];
	struct timespec ts[2] = { { .tv_sec = 1000 }, { .tv_sec = 1000 } };
	int fd;

	fresh_dir(dir, sizeof(dir), "sweep");
	ck_assert_int_eq(mkdir(dir, 0700), 0);
	prepack_entry_name(SHA_A, g_k->name, name, sizeof(name));
	snprintf(old, sizeof(old), "%s/.%s.1.0000000000000001.tmp", dir, name);
	snprintf(young, sizeof(young), "%s/.%s.2.0000000000000002.tmp", dir, name);
	fd = open(old, O_CREAT | O_WRONLY, 0600);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(futimens(fd, ts), 0);
	close(fd);
	fd = open(young, O_CREAT | O_WRONLY, 0600);
	ck_assert_int_ge(fd, 0);
	close(fd);
	bind_expect(dir, SHA_A, "absent", "stored");
	ck_assert_int_ne(access(old, F_OK), 0);
	ck_assert_int_eq(access(young, F_OK), 0);
}
END_TEST

/* ---- cleanup ------------------------------------------------------------- */

#define DAY 86400L
#define PK_FORMAT_NOW 1u /* PK_FORMAT in prepack.c */
#define NAME_KEEP "pack-00000000000000000000000000000000-avx512vnni.kvpack"
#define NAME_A "pack-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa-avx512vnni.kvpack"
#define NAME_B "pack-bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb-avx512vnni.kvpack"
#define NAME_C "pack-cccccccccccccccccccccccccccccccc-avx2.kvpack"
#define NAME_D "pack-dddddddddddddddddddddddddddddddd-avx512vnni.kvpack"
#define NAME_E "pack-eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee-avx512vnni.kvpack"

/* dir/name (a static buffer: one use at a time) */
static const char *path_of(const char *dir, const char *name)
{
	static char path[900];

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	return path;
}

/* Set path's mtime (and atime) to age_s seconds ago, not following a
 * symlink. */
static void age(const char *path, long age_s)
{
	struct timespec ts[2] = { { .tv_sec = time(NULL) - age_s },
				  { .tv_sec = time(NULL) - age_s } };

	ck_assert_msg(utimensat(AT_FDCWD, path, ts, AT_SYMLINK_NOFOLLOW) == 0,
		      "utimensat %s: %s", path, strerror(errno));
}

/* dir/name: a pack header's first fields (magic, format, layout), then
 * zeros up to size bytes, last modified age_s seconds ago. */
static void plant(const char *dir, const char *name, uint32_t format,
		  uint32_t layout, long size, long age_s)
{
	char path[900];
	uint8_t h[16];
	int fd;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0600);
	ck_assert_int_ge(fd, 0);
	memcpy(h, "KVDPACK\n", 8);
	memcpy(h + 8, &format, 4);
	memcpy(h + 12, &layout, 4);
	ck_assert_int_eq(write(fd, h, sizeof(h)), (ssize_t)sizeof(h));
	ck_assert_int_eq(ftruncate(fd, size), 0);
	close(fd);
	age(path, age_s);
}

static void plant_now(const char *dir, const char *name, long age_s)
{
	plant(dir, name, PK_FORMAT_NOW, OPS_PACK_LAYOUT, 8192, age_s);
}

static bool present(const char *dir, const char *name)
{
	char path[900];
	struct stat st;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	return lstat(path, &st) == 0;
}

static void clean_dir_new(char *out, size_t n, const char *name)
{
	fresh_dir(out, n, name);
	ck_assert_int_eq(mkdir(out, 0700), 0);
}

/* A log that writes into a temporary file, read back whole. */
struct cap {
	FILE *f;
	struct kvlog lg;
	char text[65536];
};

static void cap_open(struct cap *c)
{
	c->f = tmpfile();
	ck_assert_ptr_nonnull(c->f);
	kvlog_init(&c->lg, KVLOG_INFO, fileno(c->f), "t");
}

static const char *cap_read(struct cap *c)
{
	ssize_t r = pread(fileno(c->f), c->text, sizeof(c->text) - 1, 0);

	ck_assert_int_ge(r, 0);
	c->text[r] = '\0';
	return c->text;
}

static void cap_close(struct cap *c)
{
	fclose(c->f);
}

/* Regular files and everything else in dir, but . and .. */
static int count_entries(const char *dir)
{
	struct dirent *de;
	int n = 0;
	DIR *d = opendir(dir);

	ck_assert_ptr_nonnull(d);
	while ((de = readdir(d)))
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
			n++;
	closedir(d);
	return n;
}

/* Another model's file past the retention goes, a younger one and the
 * bound file (however old) stay; other names are not ours to touch. */
START_TEST(test_clean_by_age)
{
	struct prepack_clean_stats st;
	struct cap c;
	char dir[512], want[300];

	clean_dir_new(dir, sizeof(dir), "age");
	plant_now(dir, NAME_KEEP, 30 * DAY);
	plant(dir, NAME_A, PK_FORMAT_NOW, OPS_PACK_LAYOUT, 10000, 7 * DAY + 600);
	plant_now(dir, NAME_B, 6 * DAY);
	plant_now(dir, "notes.kvpack", 30 * DAY);
	plant_now(dir, "pack-x.kvpack.bak", 30 * DAY);
	cap_open(&c);
	ck_assert_int_eq(prepack_clean(dir, NAME_KEEP, 7, &c.lg, &st), 0);
	ck_assert(!present(dir, NAME_A));
	ck_assert(present(dir, NAME_B));
	ck_assert(present(dir, NAME_KEEP));
	ck_assert(present(dir, "notes.kvpack"));
	ck_assert(present(dir, "pack-x.kvpack.bak"));
	ck_assert_uint_eq(st.removed, 1);
	ck_assert_uint_eq(st.freed, 10000);
	ck_assert_uint_eq(st.failed, 0);
	ck_assert_uint_eq(st.examined, 7); /* 5 files, . and .. */
	snprintf(want, sizeof(want),
		 "event=pack_cache_removed name=%s reason=unused bytes=10000 ", NAME_A);
	ck_assert_msg(strstr(cap_read(&c), want), "log: %s", c.text);
	ck_assert_ptr_null(strstr(c.text, NAME_B));
	/* the younger file, once past the retention too */
	age(path_of(dir, NAME_B), 8 * DAY);
	ck_assert_int_eq(prepack_clean(dir, NAME_KEEP, 7, &c.lg, &st), 0);
	ck_assert(!present(dir, NAME_B));
	ck_assert(present(dir, NAME_KEEP));
	ck_assert_uint_eq(st.removed, 1);
	/* a longer retention keeps what a shorter one would remove */
	plant_now(dir, NAME_A, 20 * DAY);
	ck_assert_int_eq(prepack_clean(dir, NAME_KEEP, 30, &c.lg, &st), 0);
	ck_assert(present(dir, NAME_A));
	ck_assert_uint_eq(st.removed, 0);
	cap_close(&c);
}
END_TEST

/* Another format or layout version is never read again: removed however
 * young. A file whose header is not a pack header waits for its age. */
START_TEST(test_clean_version)
{
	struct prepack_clean_stats st;
	struct cap c;
	char dir[512], want[300];

	clean_dir_new(dir, sizeof(dir), "version");
	plant(dir, NAME_A, PK_FORMAT_NOW + 1, OPS_PACK_LAYOUT, 8192, 0);
	plant(dir, NAME_B, PK_FORMAT_NOW, OPS_PACK_LAYOUT + 1, 4096, 0);
	plant(dir, NAME_C, PK_FORMAT_NOW, OPS_PACK_LAYOUT, 8192, 0);
	plant(dir, NAME_D, PK_FORMAT_NOW + 1, OPS_PACK_LAYOUT, 8, 0); /* short */
	plant(dir, NAME_E, PK_FORMAT_NOW + 1, OPS_PACK_LAYOUT, 8192, 0);
	flip(path_of(dir, NAME_E), 0); /* not a pack header: its age decides */
	plant(dir, NAME_KEEP, PK_FORMAT_NOW + 1, OPS_PACK_LAYOUT, 8192, 0);
	cap_open(&c);
	ck_assert_int_eq(prepack_clean(dir, NAME_KEEP, 7, &c.lg, &st), 0);
	ck_assert(!present(dir, NAME_A));
	ck_assert(!present(dir, NAME_B));
	ck_assert(present(dir, NAME_C));
	ck_assert(present(dir, NAME_D));
	ck_assert(present(dir, NAME_E));
	ck_assert(present(dir, NAME_KEEP));
	ck_assert_uint_eq(st.removed, 2);
	ck_assert_uint_eq(st.freed, 8192 + 4096);
	snprintf(want, sizeof(want),
		 "event=pack_cache_removed name=%s reason=version bytes=4096 ", NAME_B);
	ck_assert_msg(strstr(cap_read(&c), want), "log: %s", c.text);
	cap_close(&c);
}
END_TEST

/* Never through a link, never what is not a regular file: a symlink
 * named like a pack file stays, and so does its target outside. */
START_TEST(test_clean_symlink)
{
	struct prepack_clean_stats st;
	char dir[512], target[600], inner[900], link[900];

	clean_dir_new(dir, sizeof(dir), "links");
	snprintf(target, sizeof(target), "%s/outside.kvpack", g_root);
	plant(g_root, "outside.kvpack", PK_FORMAT_NOW + 1, OPS_PACK_LAYOUT, 8192, 30 * DAY);
	snprintf(link, sizeof(link), "%s/%s", dir, NAME_A);
	ck_assert_int_eq(symlink(target, link), 0);
	age(link, 30 * DAY);
	/* a link to a stale file of the same directory */
	plant_now(dir, "old.bin", 30 * DAY);
	snprintf(inner, sizeof(inner), "%s/old.bin", dir);
	snprintf(link, sizeof(link), "%s/%s", dir, NAME_B);
	ck_assert_int_eq(symlink(inner, link), 0);
	age(link, 30 * DAY);
	/* a directory and a FIFO with pack names (a FIFO would block an open) */
	snprintf(link, sizeof(link), "%s/%s", dir, NAME_C);
	ck_assert_int_eq(mkdir(link, 0700), 0);
	age(link, 30 * DAY);
	snprintf(link, sizeof(link), "%s/%s", dir, NAME_D);
	ck_assert_int_eq(mkfifo(link, 0600), 0);
	age(link, 30 * DAY);
	ck_assert_int_eq(prepack_clean(dir, NAME_KEEP, 0, NULL, &st), 0);
	ck_assert_uint_eq(st.removed, 0);
	ck_assert_int_eq(access(target, F_OK), 0);
	ck_assert_int_eq(access(inner, F_OK), 0);
	ck_assert(present(dir, NAME_A));
	ck_assert(present(dir, NAME_B));
	ck_assert(present(dir, NAME_C));
	ck_assert(present(dir, NAME_D));
	ck_assert_int_eq(unlink(target), 0);
}
END_TEST

/* Another user's file (root can plant one): left, whatever its age. */
START_TEST(test_clean_foreign_owner)
{
	struct prepack_clean_stats st;
	char dir[512], path[900];

	clean_dir_new(dir, sizeof(dir), "foreign");
	plant_now(dir, NAME_A, 30 * DAY);
	plant_now(dir, NAME_B, 30 * DAY);
	snprintf(path, sizeof(path), "%s/%s", dir, NAME_A);
	ck_assert_int_eq(chown(path, 65534, 65534), 0);
	ck_assert_int_eq(prepack_clean(dir, NAME_KEEP, 0, NULL, &st), 0);
	ck_assert(present(dir, NAME_A));
	ck_assert(!present(dir, NAME_B)); /* the same case, ours: removed */
	ck_assert_uint_eq(st.removed, 1);
}
END_TEST

/* keep_days 0: every other pack file goes at once, the bound one stays. */
START_TEST(test_clean_keep_zero)
{
	struct prepack_clean_stats st;
	char dir[512];

	clean_dir_new(dir, sizeof(dir), "zero");
	plant_now(dir, NAME_KEEP, 0);
	plant_now(dir, NAME_A, 0);
	plant_now(dir, NAME_C, 0);
	plant_now(dir, NAME_B, -DAY); /* mtime ahead of the clock */
	ck_assert_int_eq(prepack_clean(dir, NAME_KEEP, 0, NULL, &st), 0);
	ck_assert(present(dir, NAME_KEEP));
	ck_assert(!present(dir, NAME_A));
	ck_assert(!present(dir, NAME_B));
	ck_assert(!present(dir, NAME_C));
	ck_assert_uint_eq(st.removed, 3);
	ck_assert_uint_eq(st.freed, 3 * 8192);
	/* with no file to keep, that one goes too */
	ck_assert_int_eq(prepack_clean(dir, NULL, 0, NULL, &st), 0);
	ck_assert_int_eq(count_entries(dir), 0);
}
END_TEST

/* A file a live process holds (the shared flock every bind keeps) is in
 * use: left, counted; once released it is removed. */
START_TEST(test_clean_in_use)
{
	struct prepack_clean_stats st;
	char dir[512], path[900];
	int fd;

	clean_dir_new(dir, sizeof(dir), "inuse");
	plant(dir, NAME_A, PK_FORMAT_NOW + 1, OPS_PACK_LAYOUT, 8192, 30 * DAY);
	snprintf(path, sizeof(path), "%s/%s", dir, NAME_A);
	fd = open(path, O_RDONLY);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(flock(fd, LOCK_SH), 0);
	ck_assert_int_eq(prepack_clean(dir, NAME_KEEP, 0, NULL, &st), 0);
	ck_assert(present(dir, NAME_A));
	ck_assert_uint_eq(st.in_use, 1);
	ck_assert_uint_eq(st.removed, 0);
	close(fd);
	ck_assert_int_eq(prepack_clean(dir, NAME_KEEP, 0, NULL, &st), 0);
	ck_assert(!present(dir, NAME_A));
	ck_assert_uint_eq(st.in_use, 0);
	ck_assert_uint_eq(st.removed, 1);
}
END_TEST

/* One call reads at most PREPACK_CLEAN_MAX_ENTRIES entries; the next
 * start goes on. */
START_TEST(test_clean_bounded)
{
	enum { N = PREPACK_CLEAN_MAX_ENTRIES + 900 };
	struct prepack_clean_stats st;
	char dir[512], name[128];
	int left, calls = 0;

	clean_dir_new(dir, sizeof(dir), "bounded");
	for (int i = 0; i < N; i++) {
		snprintf(name, sizeof(name), "pack-%032d-avx512vnni.kvpack", i);
		plant(dir, name, PK_FORMAT_NOW, OPS_PACK_LAYOUT, 16, 30 * DAY);
	}
	ck_assert_int_eq(prepack_clean(dir, NULL, 7, NULL, &st), 0);
	ck_assert_uint_eq(st.examined, PREPACK_CLEAN_MAX_ENTRIES);
	ck_assert_uint_le(st.removed, PREPACK_CLEAN_MAX_ENTRIES);
	ck_assert_uint_ge(st.removed, PREPACK_CLEAN_MAX_ENTRIES - 2);
	left = count_entries(dir);
	ck_assert_int_eq(left, N - (int)st.removed);
	while (left && calls++ < 3) {
		ck_assert_int_eq(prepack_clean(dir, NULL, 7, NULL, &st), 0);
		left = count_entries(dir);
	}
	ck_assert_int_eq(left, 0);
}
END_TEST

/* A directory others may write is not cleaned (-EPERM), a missing one is
 * its errno; both logged. */
START_TEST(test_clean_bad_dir)
{
	struct prepack_clean_stats st;
	struct cap c;
	char dir[512];

	clean_dir_new(dir, sizeof(dir), "open");
	plant_now(dir, NAME_A, 30 * DAY);
	ck_assert_int_eq(chmod(dir, 0777), 0);
	cap_open(&c);
	ck_assert_int_eq(prepack_clean(dir, NULL, 0, &c.lg, &st), -EPERM);
	ck_assert(present(dir, NAME_A));
	ck_assert_uint_eq(st.removed, 0);
	ck_assert_int_eq(chmod(dir, 0700), 0);
	strcat(dir, "/missing");
	ck_assert_int_eq(prepack_clean(dir, NULL, 0, &c.lg, &st), -ENOENT);
	cap_read(&c);
	ck_assert_msg(strstr(c.text, "level=warn") &&
		      strstr(c.text, "event=pack_cache_cleanup_failed") &&
		      strstr(c.text, "op=unsafe_dir errno=1") &&
		      strstr(c.text, "op=opendir errno=2"), "log: %s", c.text);
	cap_close(&c);
}
END_TEST

/* A file that cannot be opened (no descriptor left: RLIMIT_NOFILE) is a
 * logged failure, counted, the file left, and the call still returns 0
 * having looked at the rest. */
START_TEST(test_clean_failure_logged)
{
	char dir[512], want[300];
	struct cap c;
	pid_t pid;
	int st;

	clean_dir_new(dir, sizeof(dir), "fail");
	plant_now(dir, NAME_A, 30 * DAY);
	cap_open(&c);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		struct prepack_clean_stats cs;
		struct rlimit rl;

		/* fds 0-2 and the log at 3; room for the directory and its
		 * stream (4, 5), not one more */
		if (dup2(fileno(c.f), 3) != 3)
			_exit(2);
		for (int fd = 4; fd < 1024; fd++)
			close(fd);
		c.lg.fd = 3;
		rl.rlim_cur = rl.rlim_max = 6;
		if (setrlimit(RLIMIT_NOFILE, &rl))
			_exit(3);
		if (prepack_clean(dir, NULL, 0, &c.lg, &cs))
			_exit(4);
		_exit(cs.failed == 1 && cs.removed == 0 ? 0 : 5);
	}
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child status %d", st);
	ck_assert(present(dir, NAME_A));
	snprintf(want, sizeof(want),
		 "event=pack_cache_cleanup_failed name=%s op=open errno=%d", NAME_A, EMFILE);
	ck_assert_msg(strstr(cap_read(&c), want), "log: %s", c.text);
	cap_close(&c);
}
END_TEST

/* Through prepack_bind: cleanup only when the key asks; it keeps the
 * file just bound (touched by the bind, so its age restarts) and any
 * file another bind still holds. */
START_TEST(test_bind_cleans)
{
	struct prepack_key key = { .sha256 = SHA_A };
	struct prepack_info info;
	struct prepack *p, *held;
	struct mats s;
	struct stat st;
	char dir[512], pa[700], pb[700];

	fresh_dir(dir, sizeof(dir), "bindclean");
	key.dir = dir;
	entry_path(pa, sizeof(pa), dir, SHA_A);
	entry_path(pb, sizeof(pb), dir, SHA_B);
	bind_expect(dir, SHA_A, "absent", "stored");
	bind_expect(dir, SHA_B, "absent", "stored");
	age(pa, 30 * DAY);
	age(pb, 30 * DAY);
	/* no cleanup asked (the default): both stay */
	bind_expect(dir, SHA_A, "hit", "-");
	ck_assert_int_eq(access(pb, F_OK), 0);
	/* that hit touched A: a fresh mtime */
	ck_assert_int_eq(stat(pa, &st), 0);
	ck_assert_int_ge(st.st_mtime, time(NULL) - 60);
	/* asked: B (30 days unused) goes, A (just bound) stays */
	key.clean = true;
	key.keep_days = 7;
	mats_init(&s);
	ck_assert_int_eq(prepack_bind(&p, g_k, s.p, s.n, &key, &info), 0);
	ck_assert_str_eq(info.lookup, "hit");
	ck_assert_uint_eq(info.clean.removed, 1);
	ck_assert_uint_gt(info.clean.freed, 0);
	ck_assert_int_ne(access(pb, F_OK), 0);
	ck_assert_int_eq(access(pa, F_OK), 0);
	check_copies(&s);
	/* A stays held by p; binding B with keep_days 0 leaves A (in use) */
	held = p;
	key.sha256 = SHA_B;
	key.keep_days = 0;
	mats_init(&s);
	ck_assert_int_eq(prepack_bind(&p, g_k, s.p, s.n, &key, &info), 0);
	ck_assert_str_eq(info.store, "stored");
	ck_assert_uint_eq(info.clean.in_use, 1);
	ck_assert_uint_eq(info.clean.removed, 0);
	ck_assert_int_eq(access(pa, F_OK), 0);
	prepack_free(p);
	prepack_free(held);
	/* released: B's next bind (a hit) removes A */
	mats_init(&s);
	ck_assert_int_eq(prepack_bind(&p, g_k, s.p, s.n, &key, &info), 0);
	ck_assert_str_eq(info.lookup, "hit");
	ck_assert_uint_eq(info.clean.removed, 1);
	ck_assert_int_ne(access(pa, F_OK), 0);
	ck_assert_int_eq(access(pb, F_OK), 0);
	prepack_free(p);
	/* a cleaner (here: this test) holding B exclusively: the bind does
	 * not wait, packs and stores a new file */
	{
		int fd = open(pb, O_RDONLY);

		ck_assert_int_ge(fd, 0);
		ck_assert_int_eq(flock(fd, LOCK_EX), 0);
		bind_expect(dir, SHA_B, "busy", "stored");
		close(fd);
		bind_expect(dir, SHA_B, "hit", "-");
	}
}
END_TEST

static void setup(void)
{
	struct gguf_llama_params p = GGUF_LLAMA_PARAMS_DEFAULT;
	struct gguf_error err;
	char path[600];

	strcpy(g_root, "/tmp/kvd_pack_XXXXXX"); /* one fixture per tcase */
	ck_assert_ptr_nonnull(mkdtemp(g_root));
	p.n_layer = 2;
	p.n_embd = 256;
	p.n_ff = 512;
	p.n_head = 4;
	p.n_head_kv = 2;
	p.n_vocab = 320;
	p.n_ctx = 256;
	p.wtype = GGML_TYPE_Q4_0;
	p.mix_q6_k = true;
	p.seed = 11;
	snprintf(path, sizeof(path), "%s/m.gguf", g_root);
	ck_assert_int_eq(gguf_make_llama(path, &p), 0);
	ck_assert_msg(model_open(&g_m, path, &err) == 0, "%s", err.msg);
}

static void teardown(void)
{
	char cmd[600];

	model_free(g_m);
	snprintf(cmd, sizeof(cmd), "chmod -R u+rwx '%s'; rm -rf '%s'", g_root, g_root);
	if (system(cmd))
		fprintf(stderr, "cleanup of %s failed\n", g_root);
}

int main(void)
{
	Suite *s = suite_create("prepack");
	TCase *tc = tcase_create("cache");
	TCase *tcc = tcase_create("clean");
	SRunner *sr;
	int failed;

	tcase_add_unchecked_fixture(tcc, setup, teardown);
	tcase_set_timeout(tcc, 300);
	tcase_add_test(tcc, test_clean_by_age);
	tcase_add_test(tcc, test_clean_version);
	tcase_add_test(tcc, test_clean_symlink);
	if (geteuid() == 0)
		tcase_add_test(tcc, test_clean_foreign_owner);
	else
		printf("SKIP test_clean_foreign_owner: only root can chown\n");
	tcase_add_test(tcc, test_clean_keep_zero);
	tcase_add_test(tcc, test_clean_in_use);
	tcase_add_test(tcc, test_clean_bounded);
	tcase_add_test(tcc, test_clean_bad_dir);
	tcase_add_test(tcc, test_clean_failure_logged);
	suite_add_tcase(s, tcc);
	g_k = ops_kernels_avx512vnni();
	if (!g_k) {
		printf("SKIP cache cases: no avx512vnni kernels, nothing is packed\n");
		goto run;
	}
	tcase_add_unchecked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 300);
	tcase_add_test(tc, test_no_dir_packs);
	tcase_add_test(tc, test_written_then_reused);
	tcase_add_test(tc, test_damaged_rebuilt);
	tcase_add_test(tc, test_truncated_while_bound);
	tcase_add_test(tc, test_unsafe_refused);
	tcase_add_test(tc, test_bad_key);
	tcase_add_test(tc, test_concurrent_starts);
	tcase_add_test(tc, test_stale_tmp_swept);
	tcase_add_test(tc, test_store_fails);
	tcase_add_test(tc, test_bind_cleans);
	suite_add_tcase(s, tc);
run:
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
