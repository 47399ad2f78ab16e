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
 *
 * Content evidence (issue 22). Metadata can still collide: two images of
 * a file system (a VM or container image copied and changed offline, a
 * snapshot restored, a disk swapped under the same device number) can
 * hold files with the same device, inode, size, mtime and ctime and other
 * bytes, and the entry of one would name the other. So an entry also
 * binds content: the SHA-256 of the file's size, the first KVD_FP_HEAD
 * bytes (the GGUF header: version, metadata, tensor table), one
 * KVD_FP_BLOCK block at a point of each of KVD_FP_SAMPLES equal strata of
 * the rest, chosen from a seed drawn at random when the entry is written
 * (so the sampled offsets are not known to whoever prepares an image,
 * unless they can read this user's cache), and the last block. A hit
 * recomputes it (about 1.3 MiB of reads whatever the model's size) and
 * any difference is the verdict "evidence": hashed in full and rewritten.
 * Bytes outside the samples can still differ; the full SHA-256 of what a
 * hit named is therefore verified off the loop after start by the daemon
 * (daemon/node/fpcheck.c), which takes the node out of service on a mismatch
 * and drops the entry (kvd_fingerprint_forget).
 */
#include "conf/fingerprint.h"
#include "conf/util.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define KVD_FP_RACY_NS 1000000000LL /* ctime must be this much older */
#define KVD_FP_ENTRY_MAX 512
#define KVD_FP_MAGIC "kvd-fingerprint v2"
#define KVD_FP_HEAD (1u << 20)   /* bytes of the file's start in the evidence */
#define KVD_FP_BLOCK 4096u       /* one sampled block */
#define KVD_FP_SAMPLES 64u       /* strata of the rest, one block each */

/* What an entry binds besides the stat figures: the evidence's seed and
 * digest (hex). */
struct fp_evidence {
	uint64_t seed;
	char hex[SHA256_HEX_SIZE];
};

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

static int entry_format(const struct fp_key *k, const struct fp_evidence *ev,
			const char *hex, char *out, size_t n)
{
	return snprintf(out, n,
			KVD_FP_MAGIC " dev=%" PRIu64 " ino=%" PRIu64
			" size=%" PRIu64 " mtime_ns=%" PRId64
			" ctime_ns=%" PRId64 " seed=%016" PRIx64
			" evidence=%s sha256=%s\n",
			k->dev, k->ino, k->size, k->mtime_ns, k->ctime_ns,
			ev->seed, ev->hex, hex);
}

static bool is_hex(const char *s, int n)
{
	for (int i = 0; i < n; i++)
		if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
			return false;
	return true;
}

/* The n lowercase hex digits after `tag` in buf (len bytes) into out
 * (n + 1 bytes); false when absent or not hex. */
static bool field_hex(const char *buf, size_t len, const char *tag, int n,
		      char *out)
{
	size_t tl = strlen(tag);
	const char *p = memmem(buf, len, tag, tl);

	if (!p || (size_t)(buf + len - (p + tl)) < (size_t)n || !is_hex(p + tl, n))
		return false;
	memcpy(out, p + tl, (size_t)n);
	out[n] = '\0';
	return true;
}

/* The entry must be byte-for-byte what we would write for key k with the
 * seed, evidence and digest it names: re-format it and compare whole
 * lines. That rejects extra fields, spaces, missing newline and trailing
 * bytes without a hand-written parser to get wrong. */
static bool entry_parse(const char *buf, size_t len, const struct fp_key *k,
			struct fp_evidence *ev, char hex[SHA256_HEX_SIZE])
{
	char want[KVD_FP_ENTRY_MAX], seed[17];
	int n;

	if (!field_hex(buf, len, " seed=", 16, seed) ||
	    !field_hex(buf, len, " evidence=", 64, ev->hex) ||
	    !field_hex(buf, len, " sha256=", 64, hex))
		return false;
	ev->seed = strtoull(seed, NULL, 16);
	n = entry_format(k, ev, hex, want, sizeof(want));
	return n > 0 && (size_t)n == len && !memcmp(want, buf, len);
}

static uint64_t fp_mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

/* Feed [off, off + n) of fd to c, through buf (KVD_FP_HEAD bytes: the
 * head in one read - a system call costs tens of us in some guests).
 * 0, or -EIO when the file is shorter (it changed), or -errno. */
static int feed_range(int fd, struct sha256 *c, uint8_t *buf, uint64_t off,
		      uint64_t n, uint64_t *bytes)
{
	while (n) {
		size_t want = n < KVD_FP_HEAD ? (size_t)n : KVD_FP_HEAD;
		ssize_t r = pread(fd, buf, want, (off_t)off);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return r < 0 ? -errno : -EIO;
		sha256_update(c, buf, (size_t)r);
		off += (uint64_t)r;
		n -= (uint64_t)r;
		*bytes += (uint64_t)r;
	}
	return 0;
}

/* The content evidence of the file open at fd, of `size` bytes, under
 * ev->seed (see the top of this file): ev->hex. 0 or a negative errno. */
static int evidence_of(int fd, uint64_t size, struct fp_evidence *ev,
		       uint64_t *bytes)
{
	uint8_t d[SHA256_DIGEST_SIZE], *buf = malloc(KVD_FP_HEAD);
	uint64_t head = size < KVD_FP_HEAD ? size : KVD_FP_HEAD;
	uint64_t rest = size - head, pre[2] = { size, ev->seed };
	struct sha256 c;
	int r;

	if (!buf)
		return -ENOMEM;
	sha256_init(&c);
	sha256_update(&c, pre, sizeof(pre));
	r = feed_range(fd, &c, buf, 0, head, bytes);
	for (uint32_t i = 0; !r && rest > KVD_FP_BLOCK && i < KVD_FP_SAMPLES; i++) {
		/* stratum i is [lo, hi) of the rest; one block inside it */
		uint64_t lo = rest / KVD_FP_SAMPLES * i, hi = rest / KVD_FP_SAMPLES * (i + 1);
		uint64_t span = hi - lo > KVD_FP_BLOCK ? hi - lo - KVD_FP_BLOCK : 1;
		uint64_t off = head + lo + fp_mix(ev->seed ^ ((uint64_t)i << 32)) % span;

		sha256_update(&c, &off, sizeof(off));
		r = feed_range(fd, &c, buf, off, KVD_FP_BLOCK, bytes);
	}
	if (!r && rest)
		r = feed_range(fd, &c, buf, size - (rest < KVD_FP_BLOCK ? rest : KVD_FP_BLOCK),
			       rest < KVD_FP_BLOCK ? rest : KVD_FP_BLOCK, bytes);
	free(buf);
	if (r)
		return r;
	sha256_final(&c, d);
	sha256_hex(d, ev->hex);
	return 0;
}

static const char *cache_lookup(int dfd, int fd_model, const struct fp_key *k,
				char hex[SHA256_HEX_SIZE], uint64_t *ev_bytes)
{
	struct fp_evidence ev, now;
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
	if (!entry_parse(buf, len, k, &ev, hex)) {
		/* ours, of another file or an older format: stale */
		return !memcmp(buf, "kvd-fingerprint v", 17) ? "stale" : "corrupt";
	}
	/* the stat figures agree; do the bytes? */
	now.seed = ev.seed;
	if (evidence_of(fd_model, k->size, &now, ev_bytes) ||
	    strcmp(now.hex, ev.hex))
		return "evidence";
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

static int cache_store(int dfd, const struct fp_key *k,
			const struct fp_evidence *ev, const char *hex)
{
	char name[80], tmp[128], line[KVD_FP_ENTRY_MAX];
	int fd, n, r;

	entry_name(k, name, sizeof(name));
	snprintf(tmp, sizeof(tmp), ".%s.%ld.tmp", name, (long)getpid());
	n = entry_format(k, ev, hex, line, sizeof(line));
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

static int fk_random(uint64_t *out)
{
	return getrandom(out, sizeof(*out), 0) == sizeof(*out) ? 0 : -EIO;
}

static int64_t wall_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_REALTIME, &t);
	return ts_ns(&t);
}

/* The cache directory open, made 0700 when missing, and ours alone; or
 * -1 with the verdict in info. */
static int cache_dir_open(const char *cache_dir, struct kvd_fp_info *info)
{
	int dfd = open(cache_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

	if (dfd < 0 && errno == ENOENT && !mkdir(cache_dir, 0700))
		dfd = open(cache_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0) {
		info->lookup = info->store = "dir_error";
		info->store_errno = errno;
		return -1;
	}
	if (!kvd_dir_owner_only(dfd)) {
		info->lookup = info->store = "unsafe_dir";
		close(dfd);
		return -1;
	}
	return dfd;
}

/* After a full hash: store the entry when the file held still (k, taken
 * before hashing at t0, equals fstat now) and settled, with a fresh seed
 * and the evidence under it. 0 or the fstat errno. */
static int fp_store(int fd, int dfd, const struct fp_key *k, int64_t t0,
		    const char *hex, struct kvd_fp_info *info)
{
	struct fp_evidence ev = { 0 };
	struct fp_key k2;
	struct stat st;
	uint64_t ignored = 0;

	if (fk_random(&ev.seed) || evidence_of(fd, k->size, &ev, &ignored)) {
		info->store = "skipped_changed";
		return 0;
	}
	if (fstat(fd, &st))
		return -errno;
	fp_key_of(&st, &k2);
	if (!fp_key_eq(k, &k2)) {
		info->store = "skipped_changed";
	} else if (k->ctime_ns > t0 - KVD_FP_RACY_NS) {
		info->store = "skipped_recent";
	} else {
		info->store_errno = -cache_store(dfd, k, &ev, hex);
		info->store = info->store_errno ? "error" : "stored";
	}
	return 0;
}

int kvd__fingerprint_stat(int fd, const struct stat *st, const char *cache_dir,
			  char hex[SHA256_HEX_SIZE], struct kvd_fp_info *info)
{
	struct fp_key k;
	int64_t t0 = wall_ns();
	int dfd = -1, r;

	*info = (struct kvd_fp_info){ .lookup = "off", .store = "off" };
	fp_key_of(st, &k);
	info->dev = k.dev;
	info->ino = k.ino;
	if (cache_dir && cache_dir[0]) {
		dfd = cache_dir_open(cache_dir, info);
		if (dfd >= 0)
			info->lookup = cache_lookup(dfd, fd, &k, hex, &info->evidence_bytes);
	}
	if (!strcmp(info->lookup, "hit")) {
		info->cached = true;
		info->store = "-";
		close(dfd);
		return 0;
	}
	r = sha256_fd(fd, hex, &info->hashed_bytes);
	if (!r && dfd >= 0)
		r = fp_store(fd, dfd, &k, t0, hex, info);
	if (dfd >= 0)
		close(dfd);
	return r;
}

int kvd_fingerprint(const char *path, const char *cache_dir,
		    char hex[SHA256_HEX_SIZE], struct kvd_fp_info *info)
{
	struct kvd_fp_info dummy;
	struct stat st;
	int fd, r;

	if (!info)
		info = &dummy;
	*info = (struct kvd_fp_info){ .lookup = "off", .store = "off" };
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	r = fstat(fd, &st) ? -errno : kvd__fingerprint_stat(fd, &st, cache_dir, hex, info);
	close(fd);
	return r;
}

int kvd_fingerprint_forget(const char *cache_dir, uint64_t dev, uint64_t ino)
{
	struct fp_key k = { .dev = dev, .ino = ino };
	char name[80];
	int dfd, r = 0;

	if (!cache_dir || !cache_dir[0])
		return 0;
	dfd = open(cache_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return errno == ENOENT ? 0 : -errno;
	entry_name(&k, name, sizeof(name));
	if (unlinkat(dfd, name, 0) && errno != ENOENT)
		r = -errno;
	close(dfd);
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
