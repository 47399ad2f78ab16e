/* test_prepack.c - the repack cache (gpu/prepack.c).
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
 * Only the avx512vnni table has packed layouts: without it the test
 * exits 77 (skip).
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "conf/sha256.h"
#include "gpu/gguf_gen.h"
#include "gpu/model.h"
#include "gpu/ops_cpu.h"
#include "gpu/prepack.h"

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

static void setup(void)
{
	struct gguf_llama_params p = GGUF_LLAMA_PARAMS_DEFAULT;
	struct gguf_error err;
	char path[600];

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
	SRunner *sr;
	int failed;

	g_k = ops_kernels_avx512vnni();
	if (!g_k) {
		printf("SKIP: no avx512vnni kernels, nothing is packed\n");
		return 77;
	}
	tcase_add_unchecked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 300);
	tcase_add_test(tc, test_no_dir_packs);
	tcase_add_test(tc, test_written_then_reused);
	tcase_add_test(tc, test_damaged_rebuilt);
	tcase_add_test(tc, test_unsafe_refused);
	tcase_add_test(tc, test_bad_key);
	tcase_add_test(tc, test_concurrent_starts);
	tcase_add_test(tc, test_stale_tmp_swept);
	tcase_add_test(tc, test_store_fails);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
