/* prepack.c - the repack cache (see prepack.h for the rules).
 *
 * File layout (native byte order: the file is machine-local, its name and
 * header carry the kernel table):
 *
 *   struct pk_hdr                 magic, versions, table, model, sizes, sum
 *   struct pk_ent[n_ent]          one per packed matrix, in matrix order
 *   (zeros up to data_off, a multiple of PK_ALIGN)
 *   packed matrices, each at a PK_ALIGN-aligned offset, in entry order
 *
 * sum is the SHA-256 of the header (sum zeroed) followed by the table.
 * Name: pack-<first 32 hex digits of the model's SHA-256>-<table>.kvpack:
 * content-addressed, so daemons serving the same model from different
 * paths share one file (and its page-cache pages).
 */
#include "gpu/prepack.h"
#include "conf/util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "conf/sha256.h"
#include "gpu/ops_cpu.h"

#define PK_MAGIC "KVDPACK\n"
#define PK_FORMAT 1u
#define PK_ALIGN ((uint64_t)4096)
#define PK_TMP_STALE_S 3600 /* a temporary file this old is a crashed writer's */

struct pk_hdr {
	char magic[8];
	uint32_t format;      /* PK_FORMAT */
	uint32_t layout;      /* OPS_PACK_LAYOUT */
	char variant[32];     /* kernel table name, NUL padded */
	char sha256[64];      /* the model's fingerprint (hex) */
	uint32_t n_ent;
	uint32_t ent_size;    /* sizeof(struct pk_ent) */
	uint64_t data_off;
	uint64_t file_size;
	uint8_t sum[SHA256_DIGEST_SIZE];
};

struct pk_ent {
	uint32_t slot;        /* index into the caller's matrices */
	uint32_t type;
	uint32_t rows;
	uint32_t cols;
	uint64_t off;
	uint64_t bytes;
};

_Static_assert(sizeof(struct pk_hdr) == 168, "pk_hdr layout (tests/test_prepack.c)");
_Static_assert(sizeof(struct pk_ent) == 32, "pk_ent layout (tests/test_prepack.c)");

struct prepack {
	void *map;            /* the cache file's mapping, or NULL */
	size_t map_len;
	void **anon;          /* (n) private copies when not mapped */
	uint32_t n;
};

static uint64_t align_up(uint64_t v)
{
	return (v + PK_ALIGN - 1) & ~(PK_ALIGN - 1);
}

void prepack_entry_name(const char *sha256, const char *variant, char *out,
			size_t out_size)
{
	snprintf(out, out_size, "pack-%.32s-%s.kvpack", sha256, variant);
}

void prepack_free(struct prepack *p)
{
	if (!p)
		return;
	if (p->map)
		munmap(p->map, p->map_len);
	if (p->anon)
		for (uint32_t i = 0; i < p->n; i++)
			free(p->anon[i]);
	free(p->anon);
	free(p);
}

static bool sha_ok(const char *s)
{
	if (!s || strlen(s) != 64)
		return false;
	for (int i = 0; i < 64; i++)
		if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
			return false;
	return true;
}

/* The header and table this process would write (data offsets filled). */
static int expect(const struct ops_kernels *k, struct ops_mat *const *mats,
		  uint32_t n, const char *sha256, struct pk_hdr *h,
		  struct pk_ent **ents)
{
	struct pk_ent *e;
	uint64_t off;
	uint32_t m = 0;

	e = calloc(n ? n : 1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	for (uint32_t i = 0; i < n; i++) {
		size_t b = ops_mat_packed_bytes(k, mats[i]);

		if (b)
			e[m++] = (struct pk_ent){ .slot = i, .type = mats[i]->type,
						  .rows = mats[i]->rows,
						  .cols = mats[i]->cols, .bytes = b };
	}
	memset(h, 0, sizeof(*h));
	memcpy(h->magic, PK_MAGIC, 8);
	h->format = PK_FORMAT;
	h->layout = OPS_PACK_LAYOUT;
	snprintf(h->variant, sizeof(h->variant), "%s", k->name);
	memcpy(h->sha256, sha256, 64);
	h->n_ent = m;
	h->ent_size = sizeof(struct pk_ent);
	h->data_off = align_up(sizeof(*h) + (uint64_t)m * sizeof(*e));
	off = h->data_off;
	for (uint32_t i = 0; i < m; i++) {
		e[i].off = off;
		off = align_up(off + e[i].bytes);
	}
	h->file_size = off;
	*ents = e;
	return 0;
}

static void header_sum(const struct pk_hdr *h, const struct pk_ent *e,
		       uint8_t out[SHA256_DIGEST_SIZE])
{
	struct pk_hdr z = *h;
	struct sha256 c;

	memset(z.sum, 0, sizeof(z.sum));
	sha256_init(&c);
	sha256_update(&c, &z, sizeof(z));
	sha256_update(&c, e, (size_t)h->n_ent * sizeof(*e));
	sha256_final(&c, out);
}

static int pread_all(int fd, void *buf, size_t n, off_t off)
{
	uint8_t *p = buf;

	while (n) {
		ssize_t r = pread(fd, p, n, off);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return r < 0 ? -errno : -EIO;
		p += r;
		n -= (size_t)r;
		off += r;
	}
	return 0;
}

/* The first group of 16 rows of w packed again equals the copy's first
 * bytes (each layout starts with that group, or with those rows). */
static bool spot_check(const struct ops_kernels *k, const struct ops_mat *w,
		       const uint8_t *copy, size_t copy_bytes)
{
	struct ops_mat v = *w;
	size_t b;
	void *tmp;
	bool ok;

	v.rows = w->rows < 16 ? w->rows : 16;
	v.packed = NULL;
	b = ops_mat_packed_bytes(k, &v);
	if (!b || b > copy_bytes)
		return false;
	tmp = malloc(b);
	if (!tmp)
		return false;
	ops_mat_pack_into(k, &v, tmp);
	ok = !memcmp(tmp, copy, b);
	free(tmp);
	return ok;
}

/* Map the cache file when it is valid; its verdict otherwise. */
static const char *lookup(int dfd, const char *name,
			  const struct ops_kernels *k,
			  struct ops_mat *const *mats, const struct pk_hdr *want,
			  const struct pk_ent *went, struct prepack *p, int *err)
{
	struct pk_hdr h;
	struct pk_ent *e = NULL;
	uint8_t sum[SHA256_DIGEST_SIZE];
	const char *why = NULL;
	struct stat st;
	void *map;
	int fd;

	fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
	if (fd < 0) {
		*err = errno;
		return errno == ENOENT ? "absent" : errno == ELOOP ? "unsafe_entry"
								     : "io_error";
	}
	if (fstat(fd, &st) || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
	    (st.st_mode & (S_IWGRP | S_IWOTH))) {
		close(fd);
		return "unsafe_entry";
	}
	if ((uint64_t)st.st_size < sizeof(h) || pread_all(fd, &h, sizeof(h), 0)) {
		close(fd);
		return "truncated";
	}
	if (memcmp(h.magic, PK_MAGIC, 8) || h.ent_size != sizeof(*e) ||
	    h.n_ent != want->n_ent) {
		/* n_ent bounds the table read: only a table of our own size */
		close(fd);
		return h.n_ent != want->n_ent && !memcmp(h.magic, PK_MAGIC, 8) &&
		       h.format == PK_FORMAT ? "shape" : "corrupt";
	}
	if ((uint64_t)st.st_size < sizeof(h) + (uint64_t)h.n_ent * sizeof(*e)) {
		close(fd);
		return "truncated";
	}
	e = calloc(h.n_ent ? h.n_ent : 1, sizeof(*e));
	if (!e) {
		close(fd);
		return "io_error";
	}
	if (pread_all(fd, e, (size_t)h.n_ent * sizeof(*e), sizeof(h))) {
		why = "truncated";
		goto out;
	}
	header_sum(&h, e, sum);
	if (memcmp(sum, h.sum, sizeof(sum))) {
		why = "corrupt";
		goto out;
	}
	if (h.format != want->format || h.layout != want->layout) {
		why = "version";
		goto out;
	}
	if (memcmp(h.variant, want->variant, sizeof(h.variant))) {
		why = "variant";
		goto out;
	}
	if (memcmp(h.sha256, want->sha256, sizeof(h.sha256))) {
		why = "fingerprint";
		goto out;
	}
	if (h.file_size != (uint64_t)st.st_size) {
		why = "truncated";
		goto out;
	}
	if (h.data_off != want->data_off) {
		why = "corrupt";
		goto out;
	}
	/* every entry is the matrix we would pack, inside the file, in order */
	for (uint32_t i = 0; i < h.n_ent && !why; i++) {
		uint64_t lo = i ? e[i - 1].off + e[i - 1].bytes : h.data_off;

		if (e[i].slot != went[i].slot || e[i].type != went[i].type ||
		    e[i].rows != went[i].rows || e[i].cols != went[i].cols ||
		    e[i].bytes != went[i].bytes)
			why = "shape";
		else if (e[i].off % PK_ALIGN || e[i].off < lo ||
			 e[i].off > h.file_size ||
			 e[i].bytes > h.file_size - e[i].off)
			why = "corrupt";
	}
	if (why)
		goto out;
	map = mmap(NULL, (size_t)h.file_size, PROT_READ, MAP_SHARED, fd, 0);
	if (map == MAP_FAILED) {
		*err = errno;
		why = "io_error";
		goto out;
	}
	for (uint32_t i = 0; i < h.n_ent && !why; i++)
		if (!spot_check(k, mats[e[i].slot], (const uint8_t *)map + e[i].off,
				(size_t)e[i].bytes))
			why = "content";
	if (why) {
		munmap(map, (size_t)h.file_size);
		goto out;
	}
	p->map = map;
	p->map_len = (size_t)h.file_size;
	for (uint32_t i = 0; i < h.n_ent; i++)
		mats[e[i].slot]->packed = (const uint8_t *)map + e[i].off;
	why = "hit";
out:
	free(e);
	close(fd);
	return why;
}

/* Remove temporary files of this entry left by writers that died (older
 * than PK_TMP_STALE_S: a live writer's is younger). */
static void sweep_tmp(int dfd, const char *name)
{
	size_t nl = strlen(name);
	time_t now = time(NULL);
	struct dirent *de;
	DIR *d;
	int fd = dup(dfd);

	if (fd < 0)
		return;
	d = fdopendir(fd);
	if (!d) {
		close(fd);
		return;
	}
	while ((de = readdir(d))) {
		size_t l = strlen(de->d_name);
		struct stat st;

		if (l < nl + 6 || de->d_name[0] != '.' ||
		    strncmp(de->d_name + 1, name, nl) || de->d_name[nl + 1] != '.' ||
		    strcmp(de->d_name + l - 4, ".tmp"))
			continue;
		if (!fstatat(dfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) &&
		    st.st_uid == geteuid() && st.st_mtime + PK_TMP_STALE_S < now)
			(void)unlinkat(dfd, de->d_name, 0);
	}
	closedir(d);
}

/* Pack into a new file (temporary name, fsync, rename) and keep it
 * mapped. 0, or a negative errno with nothing left behind and p as it
 * was. */
static int store(int dfd, const char *name, const struct ops_kernels *k,
		 struct ops_mat *const *mats, struct pk_hdr *h,
		 const struct pk_ent *e, struct prepack *p)
{
	char tmp[256];
	uint64_t rnd = 0;
	uint8_t *map;
	int fd, r;

	if (getrandom(&rnd, sizeof(rnd), 0) != sizeof(rnd))
		rnd = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
	snprintf(tmp, sizeof(tmp), ".%s.%ld.%016llx.tmp", name, (long)getpid(),
		 (unsigned long long)rnd);
	if (h->file_size > SIZE_MAX)
		return -EFBIG;
	fd = openat(dfd, tmp, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
		    0600);
	if (fd < 0)
		return -errno;
	/* blocks reserved now: a full disk is this error, not a SIGBUS
	 * while packing through the mapping */
	r = -posix_fallocate(fd, 0, (off_t)h->file_size);
	if (r)
		goto fail;
	map = mmap(NULL, (size_t)h->file_size, PROT_READ | PROT_WRITE, MAP_SHARED,
		   fd, 0);
	if (map == MAP_FAILED) {
		r = -errno;
		goto fail;
	}
#ifdef MADV_POPULATE_WRITE
	(void)madvise(map, (size_t)h->file_size, MADV_POPULATE_WRITE);
#endif
	for (uint32_t i = 0; i < h->n_ent; i++)
		ops_mat_pack_into(k, mats[e[i].slot], map + e[i].off);
	header_sum(h, e, h->sum);
	memcpy(map + sizeof(*h), e, (size_t)h->n_ent * sizeof(*e));
	memcpy(map, h, sizeof(*h));
	if (fsync(fd) || renameat(dfd, tmp, dfd, name)) {
		r = -errno;
		munmap(map, (size_t)h->file_size);
		goto fail;
	}
	(void)mprotect(map, (size_t)h->file_size, PROT_READ);
	close(fd);
	p->map = map;
	p->map_len = (size_t)h->file_size;
	for (uint32_t i = 0; i < h->n_ent; i++)
		mats[e[i].slot]->packed = map + e[i].off;
	return 0;
fail:
	close(fd);
	(void)unlinkat(dfd, tmp, 0);
	return r;
}

/* Private copies, as without a cache. */
static int pack_anon(const struct ops_kernels *k, struct ops_mat *const *mats,
		     uint32_t n, struct prepack *p, struct prepack_info *info)
{
	p->anon = calloc(n ? n : 1, sizeof(*p->anon));
	if (!p->anon)
		return -ENOMEM;
	p->n = n;
	for (uint32_t i = 0; i < n; i++) {
		int r = ops_mat_pack(k, mats[i], &p->anon[i]);

		if (r)
			return r;
		mats[i]->packed = p->anon[i];
		if (p->anon[i])
			info->packed++;
	}
	return 0;
}

int prepack_bind(struct prepack **out, const struct ops_kernels *k,
		 struct ops_mat *const *mats, uint32_t n,
		 const struct prepack_key *key, struct prepack_info *info)
{
	struct prepack_info dummy;
	struct prepack *p;
	struct pk_hdr h;
	struct pk_ent *e = NULL;
	char name[128];
	int dfd = -1, r = 0;

	if (!info)
		info = &dummy;
	*info = (struct prepack_info){ .lookup = "off", .store = "off" };
	*out = NULL;
	if (key && key->dir && key->dir[0] && !sha_ok(key->sha256))
		return -EINVAL;
	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	for (uint32_t i = 0; i < n; i++) {
		mats[i]->packed = NULL;
		info->bytes += ops_mat_packed_bytes(k, mats[i]);
	}
	if (!key || !key->dir || !key->dir[0])
		goto anon;
	r = expect(k, mats, n, key->sha256, &h, &e);
	if (r)
		goto done;
	if (!h.n_ent) {
		info->lookup = info->store = "-";
		info->lookup = "none";
		goto done;
	}
	prepack_entry_name(key->sha256, k->name, name, sizeof(name));
	dfd = open(key->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0 && errno == ENOENT && !mkdir(key->dir, 0700))
		dfd = open(key->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0) {
		info->err = errno;
		info->lookup = info->store = "dir_error";
		goto anon;
	}
	if (!kvd_dir_owner_only(dfd)) {
		info->lookup = info->store = "unsafe_dir";
		goto anon;
	}
	info->lookup = lookup(dfd, name, k, mats, &h, e, p, &info->err);
	if (!strcmp(info->lookup, "hit")) {
		info->store = "-";
		info->mapped = h.n_ent;
		goto done;
	}
	for (uint32_t i = 0; i < n; i++)
		mats[i]->packed = NULL;
	sweep_tmp(dfd, name);
	r = store(dfd, name, k, mats, &h, e, p);
	if (!r) {
		info->store = "stored";
		info->packed = h.n_ent;
		goto done;
	}
	info->store = "error";
	info->err = -r;
	r = 0;
anon:
	r = pack_anon(k, mats, n, p, info);
done:
	if (dfd >= 0)
		close(dfd);
	free(e);
	if (r) {
		for (uint32_t i = 0; i < n; i++)
			mats[i]->packed = NULL;
		prepack_free(p);
		return r;
	}
	*out = p;
	return 0;
}
