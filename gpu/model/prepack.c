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
 *
 * Cleanup (prepack_clean). Content addressing means a node that moves to
 * another model, or an upgrade that bumps OPS_PACK_LAYOUT or PK_FORMAT,
 * leaves the old file (hundreds of MB) behind; nothing else removes it.
 * After a bind that hit or stored, the directory is read (at most
 * PREPACK_CLEAN_MAX_ENTRIES entries) and a pack-*.kvpack entry other
 * than the bound one is unlinked when all hold:
 *  - fstatat(AT_SYMLINK_NOFOLLOW) says a regular file of our euid, and
 *    the descriptor opened with O_NOFOLLOW | O_NONBLOCK is that same
 *    inode (a symlink is never followed, a FIFO never blocks, another
 *    user's file is not ours to judge);
 *  - it is stale: its header names another format or layout (no build
 *    of this one will read it: at once), or its mtime is older than the
 *    retention (or the retention is 0). mtime, not atime (relatime and
 *    noatime make atime useless): every bind touches its file with
 *    futimens, so the file of any model served in the last keep_days
 *    stays, also one that another daemon of this host serves from the
 *    same directory;
 *  - no process holds it: every bind keeps a shared flock on its file
 *    until prepack_free, and the cleaner takes an exclusive one without
 *    waiting (LOCK_NB) - refused means in use, left. This covers what
 *    the age alone cannot: a daemon that has run for longer than the
 *    retention without a restart. Unlinking a file that some process
 *    has mapped would still be safe for that process (the mapping keeps
 *    the inode alive on Linux; pages stay valid), it would only pack
 *    again at its next start; the lock spares it that.
 *  - the name still points at the inode checked (fstatat again just
 *    before unlinkat): a concurrent bind may have renamed a new file
 *    over it. A rename landing in the microseconds between that check
 *    and unlinkat would lose the new file's name: again only a repack.
 * A bind that opens a file while a cleaner holds its exclusive lock
 * gets "busy" and packs a new file. Anything that fails is logged
 * (event=pack_cache_cleanup_failed, a warning) and skipped; the bind
 * never fails because of cleanup. A flock that fails for another
 * reason than contention (a file system without flock) leaves the age
 * rule alone in charge.
 */
#include "gpu/model/prepack.h"
#include "conf/util.h"

#include <dirent.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdatomic.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "conf/log.h"
#include "conf/sha256.h"
#include "gpu/cpu/ops_cpu.h"

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
	int lock_fd;          /* the mapped file, holding a shared flock
			       * (in use: prepack_clean leaves it); or -1 */
	struct pk_guard *guard; /* the lease on lock_fd while map is the
				 * file's shared mapping; NULL otherwise */
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

static void pk_guard_stop(struct pk_guard *g);

void prepack_free(struct prepack *p)
{
	if (!p)
		return;
	pk_guard_stop(p->guard);
	if (p->map)
		munmap(p->map, p->map_len);
	if (p->lock_fd >= 0)
		close(p->lock_fd);
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

/* Private memory for a whole cache file's bytes (anonymous, so nothing
 * outside the process can take its pages away: issue 22 item 8), or
 * NULL. Transparent huge pages where the kernel offers them: a region of
 * hundreds of MB then costs a few hundred page faults, not 100k. */
static uint8_t *pk_region(size_t size)
{
	void *m = mmap(NULL, size, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (m == MAP_FAILED)
		return NULL;
#ifdef MADV_HUGEPAGE
	(void)madvise(m, size, MADV_HUGEPAGE);
#endif
	return m;
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

/* ---- holding a hit's bytes (issue 22 item 8) -------------------------------
 *
 * A mapping of the cache file shared with the page cache costs nothing
 * at start, but a truncation of the file (by this user: the ownership
 * checks cannot stop that) takes its pages away and the next read is a
 * SIGBUS. So a hit is mapped only under a read lease (F_SETLEASE
 * F_RDLCK): the kernel then holds back whoever opens the file for
 * writing or truncates it (for up to /proc/sys/fs/lease-break-time,
 * 45 s by default) and signals this process first. The signal goes to
 * one watcher thread (F_SETOWN_EX F_OWNER_TID, F_SETSIG PK_LEASE_SIG,
 * blocked in that thread and waited for with sigwaitinfo), which copies
 * the mapping into private memory, moves the copy over the mapping's
 * address in one step (mremap MREMAP_FIXED: a kernel reading the weights
 * meanwhile sees the old page or the copy, the same bytes) and only then
 * releases the lease, so the writer proceeds against a file nobody here
 * reads any more (event=pack_cache_detached). The lease is taken before
 * the size is checked and the header and table are compared again, so
 * what was checked is what is leased. Where no lease can be had (another
 * process holds the file open for writing, a file system without leases,
 * leases disabled), the file is read into private memory instead: the
 * measured cost is in gpu/README.md "Repack cache".
 */
#define PK_LEASE_SIG (SIGRTMIN + 7)

struct pk_guard {
	pthread_t thread;
	pthread_mutex_t mu;      /* map, broken */
	sem_t ready;
	pid_t tid;               /* the watcher's */
	int fd;                  /* the leased file (not owned) */
	uint8_t *map;            /* (len) the shared mapping; NULL before attach */
	size_t len;
	bool broken;             /* the lease was broken or released */
	atomic_bool quit;
	struct kvlog *log;
};

/* The lease is being broken: make the mapping private, then let go. */
static void pk_guard_detach(struct pk_guard *g)
{
	uint8_t *copy;
	bool ok = true;

	pthread_mutex_lock(&g->mu);
	if (!g->broken && g->map) {
		copy = pk_region(g->len);
		ok = copy != NULL;
		if (ok) {
			memcpy(copy, g->map, g->len);
			(void)mprotect(copy, g->len, PROT_READ);
			ok = mremap(copy, g->len, g->len, MREMAP_MAYMOVE | MREMAP_FIXED,
				    g->map) != MAP_FAILED;
			if (!ok)
				munmap(copy, g->len);
		}
		if (ok)
			KVLOG_WARN(g->log, "pack_cache_detached",
				   "bytes=%zu msg=\"the cache file is being written or truncated; using a private copy\"",
				   g->len);
		else
			KVLOG_ERR(g->log, "pack_cache_detach_failed", "bytes=%zu errno=%d",
				  g->len, errno);
	}
	/* without a copy the lease is kept: the kernel revokes it after
	 * lease-break-time, the most time this can buy */
	if (ok && !g->broken) {
		g->broken = true;
		(void)fcntl(g->fd, F_SETLEASE, F_UNLCK);
	}
	pthread_mutex_unlock(&g->mu);
}

static void *pk_guard_main(void *arg)
{
	struct pk_guard *g = arg;
	siginfo_t si;
	sigset_t set;

	g->tid = gettid();
	sigemptyset(&set);
	sigaddset(&set, PK_LEASE_SIG);
	sem_post(&g->ready);
	for (;;) {
		if (sigwaitinfo(&set, &si) < 0)
			continue;
		if (atomic_load(&g->quit))
			return NULL;
		pk_guard_detach(g);
	}
}

/* Release the lease, end the watcher. Safe with NULL. */
static void pk_guard_stop(struct pk_guard *g)
{
	if (!g)
		return;
	pthread_mutex_lock(&g->mu);
	if (!g->broken)
		(void)fcntl(g->fd, F_SETLEASE, F_UNLCK);
	g->broken = true;
	pthread_mutex_unlock(&g->mu);
	atomic_store(&g->quit, true);
	pthread_kill(g->thread, PK_LEASE_SIG);
	pthread_join(g->thread, NULL);
	pthread_mutex_destroy(&g->mu);
	sem_destroy(&g->ready);
	free(g);
}

/* A watcher thread and a read lease on fd, or NULL (errno set). */
static struct pk_guard *pk_guard_start(int fd, struct kvlog *log)
{
	struct pk_guard *g = calloc(1, sizeof(*g));
	struct f_owner_ex owner;
	sigset_t set, old;
	int r;

	if (!g)
		return NULL;
	g->fd = fd;
	g->log = log;
	pthread_mutex_init(&g->mu, NULL);
	sem_init(&g->ready, 0, 0);
	/* the watcher inherits the signal blocked: it never runs a handler,
	 * sigwaitinfo takes it */
	sigemptyset(&set);
	sigaddset(&set, PK_LEASE_SIG);
	pthread_sigmask(SIG_BLOCK, &set, &old);
	r = pthread_create(&g->thread, NULL, pk_guard_main, g);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (r) {
		pthread_mutex_destroy(&g->mu);
		sem_destroy(&g->ready);
		free(g);
		errno = r;
		return NULL;
	}
	while (sem_wait(&g->ready) && errno == EINTR)
		;
	owner = (struct f_owner_ex){ .type = F_OWNER_TID, .pid = g->tid };
	if (fcntl(fd, F_SETSIG, PK_LEASE_SIG) || fcntl(fd, F_SETOWN_EX, &owner) ||
	    fcntl(fd, F_SETLEASE, F_RDLCK)) {
		r = errno;
		g->broken = true;   /* no lease to release */
		pk_guard_stop(g);
		errno = r;
		return NULL;
	}
	return g;
}

/* The shared mapping under g's lease, or NULL: the lease broke before
 * the mapping could be handed to the watcher (it is released). */
static uint8_t *pk_guard_map(struct pk_guard *g, size_t len)
{
	uint8_t *m = mmap(NULL, len, PROT_READ, MAP_SHARED, g->fd, 0);

	if (m == MAP_FAILED)
		return NULL;
	pthread_mutex_lock(&g->mu);
	if (g->broken) {
		munmap(m, len);
		m = NULL;
	} else {
		g->map = m;
		g->len = len;
	}
	pthread_mutex_unlock(&g->mu);
	return m;
}

/* The whole file read into private memory, or NULL with *why. */
static uint8_t *pk_copy(int fd, size_t len, const char **why, int *err)
{
	uint8_t *m = pk_region(len);

	if (!m) {
		*err = errno;
		*why = "io_error";
		return NULL;
	}
	if (pread_all(fd, m, len, 0)) {
		munmap(m, len);
		*why = "truncated";   /* shorter than a moment ago */
		return NULL;
	}
	(void)mprotect(m, len, PROT_READ);
	return m;
}

/* The checked file's bytes at a stable address: mapped under a lease
 * (p->guard set) or copied; NULL with *why. Header and table are
 * compared again there: the file may have changed since they were read. */
static uint8_t *pk_bring(int fd, const struct pk_hdr *h, const struct pk_ent *e,
			 struct prepack *p, struct kvlog *log, const char **why,
			 int *err)
{
	size_t len = (size_t)h->file_size;
	struct stat st;
	uint8_t *m = NULL;

	p->guard = pk_guard_start(fd, log);
	if (p->guard) {
		if (fstat(fd, &st) || (uint64_t)st.st_size != h->file_size) {
			pk_guard_stop(kvd_steal(&p->guard));
			*why = "truncated";
			return NULL;
		}
		m = pk_guard_map(p->guard, len);
		if (!m)
			pk_guard_stop(kvd_steal(&p->guard));
	}
	if (!m)
		m = pk_copy(fd, len, why, err);
	if (m && (memcmp(m, h, sizeof(*h)) ||
		  memcmp(m + sizeof(*h), e, (size_t)h->n_ent * sizeof(*e)))) {
		pk_guard_stop(kvd_steal(&p->guard));
		munmap(m, len);
		*why = "corrupt";     /* header or table changed meanwhile */
		return NULL;
	}
	return m;
}

/* Open the cache entry `name` of dfd as ours to read: a regular file of
 * our euid that group and others cannot write, never through a symlink,
 * and under a shared lock (in use from now on: a cleaner leaves it).
 * NULL with *fd open and *st its stat, or the verdict (nothing open). */
static const char *pk_open(int dfd, const char *name, struct stat *st,
			   int *fd, int *err)
{
	*fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
	if (*fd < 0) {
		*err = errno;
		return errno == ENOENT ? "absent" : errno == ELOOP ? "unsafe_entry"
								     : "io_error";
	}
	if (fstat(*fd, st) || !S_ISREG(st->st_mode) || st->st_uid != geteuid() ||
	    (st->st_mode & (S_IWGRP | S_IWOTH))) {
		close(*fd);
		return "unsafe_entry";
	}
	/* a cleaner holding it right now is about to remove it */
	if (flock(*fd, LOCK_SH | LOCK_NB) && errno == EWOULDBLOCK) {
		close(*fd);
		return "busy";
	}
	return NULL;
}

/* Read the header of the file open at fd (its size st_size) into *h and
 * check that its table, of our entry size and want's entry count, fits
 * in the file. NULL, or the verdict (fd left open). */
static const char *pk_read_header(int fd, off_t st_size,
				  const struct pk_hdr *want, struct pk_hdr *h)
{
	if ((uint64_t)st_size < sizeof(*h) || pread_all(fd, h, sizeof(*h), 0))
		return "truncated";
	if (memcmp(h->magic, PK_MAGIC, 8) || h->ent_size != sizeof(struct pk_ent) ||
	    h->n_ent != want->n_ent) {
		/* n_ent bounds the table read: only a table of our own size */
		return h->n_ent != want->n_ent && !memcmp(h->magic, PK_MAGIC, 8) &&
		       h->format == PK_FORMAT ? "shape" : "corrupt";
	}
	if ((uint64_t)st_size < sizeof(*h) + (uint64_t)h->n_ent * sizeof(struct pk_ent))
		return "truncated";
	return NULL;
}

/* The header h and table e, as read, against the file (its size st_size)
 * and what we would write (want, went): the sum, the versions, the kernel
 * variant, the model, the sizes, and every entry the matrix we would
 * pack, inside the file, in order. NULL, or the verdict. */
static const char *pk_check_table(const struct pk_hdr *h,
				  const struct pk_ent *e, off_t st_size,
				  const struct pk_hdr *want,
				  const struct pk_ent *went)
{
	uint8_t sum[SHA256_DIGEST_SIZE];
	const char *why = NULL;

	header_sum(h, e, sum);
	if (memcmp(sum, h->sum, sizeof(sum)))
		return "corrupt";
	if (h->format != want->format || h->layout != want->layout)
		return "version";
	if (memcmp(h->variant, want->variant, sizeof(h->variant)))
		return "variant";
	if (memcmp(h->sha256, want->sha256, sizeof(h->sha256)))
		return "fingerprint";
	if (h->file_size != (uint64_t)st_size)
		return "truncated";
	if (h->data_off != want->data_off)
		return "corrupt";
	for (uint32_t i = 0; i < h->n_ent && !why; i++) {
		uint64_t lo = i ? e[i - 1].off + e[i - 1].bytes : h->data_off;

		if (e[i].slot != went[i].slot || e[i].type != went[i].type ||
		    e[i].rows != went[i].rows || e[i].cols != went[i].cols ||
		    e[i].bytes != went[i].bytes)
			why = "shape";
		else if (e[i].off % PK_ALIGN || e[i].off < lo ||
			 e[i].off > h->file_size ||
			 e[i].bytes > h->file_size - e[i].off)
			why = "corrupt";
	}
	return why;
}

/* Bring the checked file's bytes to an address nothing outside can take
 * away (pk_bring: leased mapping or private copy), spot-check every
 * matrix there - so the bytes checked are the bytes used - and point
 * mats at them (p->map set). NULL, or the verdict (nothing kept). */
static const char *pk_attach(int fd, const struct pk_hdr *h,
			     const struct pk_ent *e, const struct ops_kernels *k,
			     struct ops_mat *const *mats, struct prepack *p,
			     struct kvlog *log, int *err)
{
	const char *why = NULL;
	void *map;

	map = pk_bring(fd, h, e, p, log, &why, err);
	if (!map)
		return why;
	for (uint32_t i = 0; i < h->n_ent && !why; i++)
		if (!spot_check(k, mats[e[i].slot], (const uint8_t *)map + e[i].off,
				(size_t)e[i].bytes))
			why = "content";
	if (why) {
		pk_guard_stop(kvd_steal(&p->guard));
		munmap(map, (size_t)h->file_size);
		return why;
	}
	p->map = map;
	p->map_len = (size_t)h->file_size;
	for (uint32_t i = 0; i < h->n_ent; i++)
		mats[e[i].slot]->packed = (const uint8_t *)map + e[i].off;
	return NULL;
}

/* Map the cache file when it is valid; its verdict otherwise. */
static const char *lookup(int dfd, const char *name,
			  const struct ops_kernels *k,
			  struct ops_mat *const *mats, const struct pk_hdr *want,
			  const struct pk_ent *went, struct prepack *p,
			  struct kvlog *log, int *err)
{
	struct pk_hdr h;
	struct pk_ent *e = NULL;
	const char *why;
	struct stat st;
	int fd;

	why = pk_open(dfd, name, &st, &fd, err);
	if (why)
		return why;
	why = pk_read_header(fd, st.st_size, want, &h);
	if (why) {
		close(fd);
		return why;
	}
	e = calloc(h.n_ent ? h.n_ent : 1, sizeof(*e));
	if (!e) {
		close(fd);
		return "io_error";
	}
	if (pread_all(fd, e, (size_t)h.n_ent * sizeof(*e), sizeof(h)))
		why = "truncated";
	if (!why)
		why = pk_check_table(&h, e, st.st_size, want, went);
	if (!why)
		why = pk_attach(fd, &h, e, k, mats, p, log, err);
	if (!why) {
		/* used now: its age restarts (a read-only file system keeps
		 * the old time; the lock still protects it while we run) */
		(void)futimens(fd, NULL);
		p->lock_fd = fd;
		fd = -1;
		why = "hit";
	}
	free(e);
	if (fd >= 0)
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

/* The file just written (wfd, its writable mapping wmap of len bytes),
 * held as a hit is: a read-only descriptor of the same inode with the
 * shared flock, mapped under a lease (the written pages are in the page
 * cache: nothing is read) or, without one, copied. The writable mapping
 * and descriptor go first: a lease needs no writer open. The final
 * address in p->map; 0 or a negative errno (p as it was, wfd and wmap
 * released either way). */
static int store_hold(int dfd, const char *name, int wfd, uint8_t *wmap,
		      size_t len, const struct pk_hdr *h, const struct pk_ent *e,
		      struct prepack *p, struct kvlog *log)
{
	struct stat ws, rs;
	const char *why = NULL;
	char self[64];
	uint8_t *m;
	int rfd, err = 0;

	snprintf(self, sizeof(self), "/proc/self/fd/%d", wfd);
	rfd = open(self, O_RDONLY | O_CLOEXEC);
	if (rfd < 0)  /* no /proc: the name, checked to be that inode */
		rfd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (rfd >= 0 && (fstat(wfd, &ws) || fstat(rfd, &rs) ||
			 ws.st_dev != rs.st_dev || ws.st_ino != rs.st_ino)) {
		close(rfd);
		rfd = -1;
		errno = ESTALE;
	}
	if (rfd < 0) {
		err = -errno;
		munmap(wmap, len);
		close(wfd);
		return err;
	}
	(void)flock(rfd, LOCK_SH | LOCK_NB);
	munmap(wmap, len);
	close(wfd);
	m = pk_bring(rfd, h, e, p, log, &why, &err);
	if (!m) {
		close(rfd);
		return err ? -err : -EIO;
	}
	p->lock_fd = rfd;
	p->map = m;
	p->map_len = len;
	return 0;
}

/* Pack into a new file (temporary name, fsync, rename) through a shared
 * writable mapping, then hold it as a hit is (store_hold). 0, or a
 * negative errno with nothing left behind and p as it was. */
static int store(int dfd, const char *name, const struct ops_kernels *k,
		 struct ops_mat *const *mats, struct pk_hdr *h,
		 const struct pk_ent *e, struct prepack *p, struct kvlog *log)
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
	/* held before the name exists: a cleaner never sees it unheld */
	(void)flock(fd, LOCK_SH | LOCK_NB);
	if (fsync(fd) || renameat(dfd, tmp, dfd, name)) {
		r = -errno;
		munmap(map, (size_t)h->file_size);
		goto fail;
	}
	r = store_hold(dfd, name, fd, map, (size_t)h->file_size, h, e, p, log);
	if (r)
		return r;   /* the file stays: a good one, for the next start */
	for (uint32_t i = 0; i < h->n_ent; i++)
		mats[e[i].slot]->packed = (const uint8_t *)p->map + e[i].off;
	return 0;
fail:
	close(fd);
	(void)unlinkat(dfd, tmp, 0);
	return r;
}

/* ---- cleanup ---------------------------------------------------------------- */

static bool pack_name(const char *n)
{
	size_t l = strlen(n);

	return l > 12 && !strncmp(n, "pack-", 5) && !strcmp(n + l - 7, ".kvpack");
}

static void clean_failed(struct kvlog *log, const char *name, const char *op,
			 int err, struct prepack_clean_stats *st)
{
	st->failed++;
	KVLOG_WARN(log, "pack_cache_cleanup_failed", "name=%s op=%s errno=%d",
		   KVLOG_Q(name), op, err);
}

/* Why the file open at fd is stale ("version", "unused"), or NULL. */
static const char *stale(int fd, const struct stat *st, uint32_t keep_days,
			 time_t now)
{
	struct { char magic[8]; uint32_t format, layout; } h;

	if (st->st_size >= (off_t)sizeof(h) && !pread_all(fd, &h, sizeof(h), 0) &&
	    !memcmp(h.magic, PK_MAGIC, 8) &&
	    (h.format != PK_FORMAT || h.layout != OPS_PACK_LAYOUT))
		return "version";
	if (!keep_days || now - st->st_mtim.tv_sec > (time_t)keep_days * 86400)
		return "unused";
	return NULL;
}

/* One entry: removed when it is ours, stale and held by nobody. */
static void clean_entry(int dfd, const char *name, uint32_t keep_days,
			time_t now, struct kvlog *log,
			struct prepack_clean_stats *st)
{
	struct stat ls, fs, again;
	const char *why;
	int fd;

	if (fstatat(dfd, name, &ls, AT_SYMLINK_NOFOLLOW)) {
		if (errno != ENOENT) /* gone meanwhile: another cleaner's */
			clean_failed(log, name, "stat", errno, st);
		return;
	}
	if (!S_ISREG(ls.st_mode) || ls.st_uid != geteuid())
		return;
	fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0) {
		if (errno != ENOENT && errno != ELOOP)
			clean_failed(log, name, "open", errno, st);
		return;
	}
	if (fstat(fd, &fs) || fs.st_dev != ls.st_dev || fs.st_ino != ls.st_ino ||
	    !S_ISREG(fs.st_mode) || fs.st_uid != geteuid())
		goto out; /* replaced between the two looks: next time */
	why = stale(fd, &fs, keep_days, now);
	if (!why)
		goto out;
	if (flock(fd, LOCK_EX | LOCK_NB)) {
		if (errno == EWOULDBLOCK) {
			st->in_use++;
			goto out;
		}
		/* no flock here: the age rule alone decides */
	}
	if (fstatat(dfd, name, &again, AT_SYMLINK_NOFOLLOW) ||
	    again.st_dev != fs.st_dev || again.st_ino != fs.st_ino)
		goto out; /* a new file under the name: not this one */
	if (unlinkat(dfd, name, 0)) {
		if (errno != ENOENT)
			clean_failed(log, name, "unlink", errno, st);
		goto out;
	}
	st->removed++;
	st->freed += (uint64_t)fs.st_size;
	KVLOG_INFO(log, "pack_cache_removed", "name=%s reason=%s bytes=%llu age_s=%lld",
		   KVLOG_Q(name), why, (unsigned long long)fs.st_size,
		   (long long)(now - fs.st_mtim.tv_sec));
out:
	close(fd);
}

/* The cleanup of the directory open at dfd (the rules at the top). */
static int clean_dir(int dfd, const char *keep, uint32_t keep_days,
		     struct kvlog *log, struct prepack_clean_stats *st)
{
	time_t now = time(NULL);
	struct dirent *de;
	DIR *d;
	int fd;

	*st = (struct prepack_clean_stats){ 0 };
	/* its own open file description: readdir's offset is not dfd's */
	fd = openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	d = fd >= 0 ? fdopendir(fd) : NULL;
	if (!d) {
		int err = errno;

		if (fd >= 0)
			close(fd);
		clean_failed(log, ".", "opendir", err, st);
		return -err;
	}
	while (st->examined < PREPACK_CLEAN_MAX_ENTRIES) {
		errno = 0;
		de = readdir(d);
		if (!de) {
			if (errno)
				clean_failed(log, ".", "readdir", errno, st);
			break;
		}
		st->examined++;
		if (!pack_name(de->d_name) || (keep && !strcmp(de->d_name, keep)))
			continue;
		clean_entry(dfd, de->d_name, keep_days, now, log, st);
	}
	closedir(d);
	return 0;
}

int prepack_clean(const char *dir, const char *keep, uint32_t keep_days,
		  struct kvlog *log, struct prepack_clean_stats *st)
{
	struct prepack_clean_stats dummy;
	int dfd, r;

	if (!st)
		st = &dummy;
	*st = (struct prepack_clean_stats){ 0 };
	dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0) {
		r = -errno;
		clean_failed(log, dir, "opendir", -r, st);
		return r;
	}
	if (!kvd_dir_owner_only(dfd)) {
		close(dfd);
		clean_failed(log, dir, "unsafe_dir", EPERM, st);
		return -EPERM;
	}
	r = clean_dir(dfd, keep, keep_days, log, st);
	close(dfd);
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

/* The cache directory key->dir open (made, 0700, when missing) and
 * checked ours alone; its descriptor, or -1 with info's lookup and store
 * (and err) saying why. */
static int open_cache_dir(const struct prepack_key *key,
			  struct prepack_info *info)
{
	int dfd = open(key->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

	if (dfd < 0 && errno == ENOENT && !mkdir(key->dir, 0700))
		dfd = open(key->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0) {
		info->err = errno;
		info->lookup = info->store = "dir_error";
		return -1;
	}
	if (!kvd_dir_owner_only(dfd)) {
		info->lookup = info->store = "unsafe_dir";
		close(dfd);
		return -1;
	}
	return dfd;
}

/* Bind mats to the cache entry `name` of dfd: map it when it is valid
 * (lookup), else pack and store a new one (store), then clean the
 * directory when asked (store fills h's sum). True when mats point into
 * the entry; false (mats unpacked, info saying why) when they need
 * private copies. */
static bool bind_cached(int dfd, const char *name, const struct ops_kernels *k,
			struct ops_mat *const *mats, uint32_t n,
			const struct prepack_key *key, struct pk_hdr *h,
			const struct pk_ent *e, struct prepack *p,
			struct prepack_info *info)
{
	int r;

	info->lookup = lookup(dfd, name, k, mats, h, e, p, key->log, &info->err);
	if (!strcmp(info->lookup, "hit")) {
		info->store = "-";
		info->hold = p->guard ? "lease" : "copy";
		info->mapped = h->n_ent;
		if (key->clean)
			clean_dir(dfd, name, key->keep_days, key->log, &info->clean);
		return true;
	}
	for (uint32_t i = 0; i < n; i++)
		mats[i]->packed = NULL;
	sweep_tmp(dfd, name);
	r = store(dfd, name, k, mats, h, e, p, key->log);
	if (!r) {
		info->store = "stored";
		info->hold = p->guard ? "lease" : "copy";
		info->packed = h->n_ent;
		if (key->clean)
			clean_dir(dfd, name, key->keep_days, key->log, &info->clean);
		return true;
	}
	info->store = "error";
	info->err = -r;
	return false;
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
	*info = (struct prepack_info){ .lookup = "off", .store = "off", .hold = "-" };
	*out = NULL;
	if (key && key->dir && key->dir[0] && !sha_ok(key->sha256))
		return -EINVAL;
	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->lock_fd = -1;
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
	dfd = open_cache_dir(key, info);
	if (dfd >= 0 && bind_cached(dfd, name, k, mats, n, key, &h, e, p, info))
		goto done;
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
