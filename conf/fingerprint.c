/* fingerprint.c - SHA-256 of the model file, cached by (dev, ino, size,
 * mtime, ctime).
 *
 * Why these keys. A model replaced by a new file (rename, copy) gets a new
 * inode or device; a model rewritten in place keeps both, and may keep its
 * size, and a tool may even restore its mtime (touch -d, rsync -t, cp -p).
 * It cannot restore its ctime: the kernel sets ctime to "now" on every
 * write and on every metadata change, including utimensat(), and no
 * unprivileged call sets it back. So (dev, ino, size, mtime, ctime) all
 * unchanged means the bytes were not touched, and any change is a miss.
 *
 * The one gap is granularity: the kernel stamps ctime from a coarse clock
 * (one tick, a few ms), so a write in the same tick as the previous one
 * leaves ctime equal. An entry is therefore stored only when the file's
 * ctime is at least KVD_FP_RACY_NS older than the moment we fstat'ed it
 * before hashing (the "racy clean" rule git uses for its index): a file
 * written within that window is hashed on every boot until it settles.
 * And the model is fstat'ed again after hashing; if anything moved, the
 * bytes we hashed may be a mix, so nothing is stored.
 *
 * Trust. The cache holds the daemon's own statements, so an entry counts
 * only when the directory is writable by nobody but its owner (this user
 * or root) and the entry is a regular file owned by this user, writable by
 * nobody else, opened without following a symlink, at most
 * KVD_FP_ENTRY_MAX bytes, and parses exactly (one line, every field, the
 * digest 64 lowercase hex digits). Anything else is a miss and the entry
 * is rewritten: a corrupt cache can cost a full hash, never a wrong
 * fingerprint. Writes go to a temporary name in the same directory (O_EXCL,
 * mode 0600), are fsync'ed, then renamed over the entry, so a crash leaves
 * the old entry or the new one, never half of one.
 */
#include "conf/fingerprint.h"
#include "conf/util.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define KVD_FP_RACY_NS 1000000000LL /* ctime must be this much older */
#define KVD_FP_ENTRY_MAX 512
#define KVD_FP_MAGIC "kvd-fingerprint v1"

struct fp_key {
	uint64_t dev, ino, size;
	int64_t mtime_ns, ctime_ns;
};

static int64_t ts_ns(const struct timespec *t)
{
	return (int64_t)t->tv_sec * 1000000000LL + t->tv_nsec;
}

static void fp_key_of(const struct stat *st, struct fp_key *k)
{
	k->dev = (uint64_t)st->st_dev;
	k->ino = (uint64_t)st->st_ino;
	k->size = (uint64_t)st->st_size;
	k->mtime_ns = ts_ns(&st->st_mtim);
	k->ctime_ns = ts_ns(&st->st_ctim);
}

static bool fp_key_eq(const struct fp_key *a, const struct fp_key *b)
{
	return a->dev == b->dev && a->ino == b->ino && a->size == b->size &&
	       a->mtime_ns == b->mtime_ns && a->ctime_ns == b->ctime_ns;
}

static void entry_name(const struct fp_key *k, char *out, size_t n)
{
	snprintf(out, n, "model-%" PRIx64 "-%" PRIx64 ".fp", k->dev, k->ino);
}

static int entry_format(const struct fp_key *k, const char *hex, char *out,
			size_t n)
{
	return snprintf(out, n,
			KVD_FP_MAGIC " dev=%" PRIu64 " ino=%" PRIu64
			" size=%" PRIu64 " mtime_ns=%" PRId64
			" ctime_ns=%" PRId64 " sha256=%s\n",
			k->dev, k->ino, k->size, k->mtime_ns, k->ctime_ns, hex);
}

static bool is_hex64(const char *s)
{
	for (int i = 0; i < 64; i++)
		if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
			return false;
	return true;
}

/* The entry must be byte-for-byte what we would write for key k with its
 * digest: re-format it from the digest it names and compare whole lines.
 * That rejects extra fields, spaces, missing newline and trailing bytes
 * without a hand-written parser to get wrong. */
static bool entry_parse(const char *buf, size_t len, const struct fp_key *k,
			char hex[SHA256_HEX_SIZE])
{
	const char *p = memmem(buf, len, " sha256=", 8);
	char want[KVD_FP_ENTRY_MAX];
	int n;

	if (!p || (size_t)(buf + len - (p + 8)) != 65 || !is_hex64(p + 8))
		return false;
	memcpy(hex, p + 8, 64);
	hex[64] = '\0';
	n = entry_format(k, hex, want, sizeof(want));
	return n > 0 && (size_t)n == len && !memcmp(want, buf, len);
}

static const char *cache_lookup(int dfd, const struct fp_key *k,
				char hex[SHA256_HEX_SIZE])
{
	char name[80], buf[KVD_FP_ENTRY_MAX + 1];
	struct stat st;
	ssize_t n;
	size_t len = 0;
	int fd;

	entry_name(k, name, sizeof(name));
	fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
	if (fd < 0)
		return errno == ENOENT ? "absent" : "unsafe_entry";
	if (fstat(fd, &st) || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
	    (st.st_mode & (S_IWGRP | S_IWOTH))) {
		close(fd);
		return "unsafe_entry";
	}
	while (len < sizeof(buf)) {
		n = read(fd, buf + len, sizeof(buf) - len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		len += (size_t)n;
	}
	close(fd);
	if (len == 0 || len > KVD_FP_ENTRY_MAX)
		return "corrupt";
	/* the same file with other stat figures is stale, not corrupt */
	if (!entry_parse(buf, len, k, hex)) {
		const char *m = memmem(buf, len, KVD_FP_MAGIC " ", sizeof(KVD_FP_MAGIC));

		return m == buf ? "stale" : "corrupt";
	}
	return "hit";
}

static int write_all(int fd, const char *p, size_t n)
{
	while (n) {
		ssize_t w = write(fd, p, n);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return w < 0 ? -errno : -EIO;
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

static int cache_store(int dfd, const struct fp_key *k, const char *hex)
{
	char name[80], tmp[128], line[KVD_FP_ENTRY_MAX];
	int fd, n, r;

	entry_name(k, name, sizeof(name));
	snprintf(tmp, sizeof(tmp), ".%s.%ld.tmp", name, (long)getpid());
	n = entry_format(k, hex, line, sizeof(line));
	if (n <= 0 || n >= (int)sizeof(line))
		return -EOVERFLOW;
	(void)unlinkat(dfd, tmp, 0); /* a leftover of a crashed boot of ours */
	fd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
		    0600);
	if (fd < 0)
		return -errno;
	r = write_all(fd, line, (size_t)n);
	if (!r && fsync(fd))
		r = -errno;
	if (close(fd) && !r)
		r = -errno;
	if (!r && renameat(dfd, tmp, dfd, name))
		r = -errno;
	if (r)
		(void)unlinkat(dfd, tmp, 0);
	return r;
}

static int64_t wall_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_REALTIME, &t);
	return ts_ns(&t);
}

int kvd_fingerprint(const char *path, const char *cache_dir,
		    char hex[SHA256_HEX_SIZE], struct kvd_fp_info *info)
{
	struct kvd_fp_info dummy;
	struct fp_key k, k2;
	struct stat st;
	int64_t t0;
	int fd, dfd = -1, r;

	if (!info)
		info = &dummy;
	*info = (struct kvd_fp_info){ .lookup = "off", .store = "off" };
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	t0 = wall_ns();
	if (fstat(fd, &st)) {
		r = -errno;
		close(fd);
		return r;
	}
	fp_key_of(&st, &k);
	if (cache_dir && cache_dir[0]) {
		dfd = open(cache_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (dfd < 0 && errno == ENOENT && !mkdir(cache_dir, 0700))
			dfd = open(cache_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (dfd < 0) {
			info->lookup = info->store = "dir_error";
			info->store_errno = errno;
		} else if (!kvd_dir_owner_only(dfd)) {
			info->lookup = info->store = "unsafe_dir";
			close(dfd);
			dfd = -1;
		} else {
			info->lookup = cache_lookup(dfd, &k, hex);
		}
	}
	if (!strcmp(info->lookup, "hit")) {
		info->cached = true;
		info->store = "-";
		close(dfd);
		close(fd);
		return 0;
	}
	r = sha256_fd(fd, hex, &info->hashed_bytes);
	if (!r && dfd >= 0) {
		if (fstat(fd, &st)) {
			r = -errno;
		} else {
			fp_key_of(&st, &k2);
			if (!fp_key_eq(&k, &k2)) {
				info->store = "skipped_changed";
			} else if (k.ctime_ns > t0 - KVD_FP_RACY_NS) {
				info->store = "skipped_recent";
			} else {
				info->store_errno = -cache_store(dfd, &k, hex);
				info->store = info->store_errno ? "error" : "stored";
			}
		}
	}
	if (dfd >= 0)
		close(dfd);
	close(fd);
	return r;
}

void kvd_fingerprint_cache_dir(const char *configured, char *out,
			       size_t out_size)
{
	const char *env;
	size_t n;

	if (!out_size)
		return;
	out[0] = '\0';
	if (!strcmp(configured, "off"))
		return;
	if (configured[0]) {
		snprintf(out, out_size, "%s", configured);
		return;
	}
	env = getenv("CACHE_DIRECTORY");
	if (!env || env[0] != '/')
		return;
	n = strcspn(env, ":");
	if (n >= out_size)
		return;
	memcpy(out, env, n);
	out[n] = '\0';
}
