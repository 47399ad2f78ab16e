/* prepack.h - where the kernel table's repacked weight copies come from:
 * packed at start into anonymous memory, or mapped from a repack cache
 * file written once per (model fingerprint, layout version, kernel table).
 *
 * The avx512vnni table reads Q4_0, Q8_0 and K-quant matrices in layouts of
 * its own (ops_mat_pack). Packing them reads the whole model once at every
 * backend start (~5 GB/s) and keeps a private copy next to the mapped
 * file. With a cache directory (the fingerprint cache's: systemd's
 * CacheDirectory=), the first start packs straight into a file there
 * (temporary name, fsync, rename: concurrent starts are safe, a crash
 * leaves no half file under the real name), and later starts map that
 * file read-only and shared: no packing, the pages come from the page
 * cache on first touch and are shared by every process serving the model.
 * A mapping is held only under a read lease (issue 22 item 8): whoever
 * opens the file for writing or truncates it waits until this process
 * has copied the mapping into private memory in place, so no truncation
 * can take its pages away (SIGBUS) and no write can change its weights;
 * where no lease can be had the file is read into private memory.
 *
 * A cache file is used only after these checks, all before any kernel
 * reads it: the directory is writable by nobody but its owner (this user
 * or root); the file is a regular file (no symlink followed) owned by this
 * user and writable by nobody else; its header (magic, format, layout
 * version OPS_PACK_LAYOUT, kernel table name, the model's SHA-256, entry
 * count and file size) is read with pread, checksummed (SHA-256 of header
 * and entry table) and must match what this process would write; every
 * entry must name the matrix, type, shape and byte count this process
 * would pack, lie page-aligned inside the file after the table, and not
 * overlap the one before; and the first group of 16 rows of every matrix
 * is packed again and compared with the file's bytes (catches a layout
 * changed without a version bump, and a wrong or stale copy). Anything
 * else is a miss, reported by name, and the file is rebuilt. The packed
 * bytes past that group are not checksummed (that would read the whole
 * file at every start): the kernels use them only as operands, never as
 * offsets, so a flipped byte there can give wrong numbers but no access
 * outside the mapping; the trust assumption is that only the daemon's user
 * writes its cache directory, which is what the ownership checks enforce.
 * The checks run under the lease (or on the private copy), so the bytes
 * checked are the bytes used.
 *
 * Cleanup (prepack_clean; gpu/README.md "Repack cache"): after a bind
 * that hit or stored a file, and only when the key asks for it, the other
 * pack-*.kvpack files of the directory that no start will read again are
 * removed: regular files of this user (never through a symlink) that no
 * live process holds (each process keeps a shared flock on the file it
 * mapped until prepack_free; a file locked so is never removed), and
 * either carry another format or layout version in their header (at
 * once) or were not bound for longer than keep_days (by mtime: every
 * bind touches its file; keep_days 0 = at once). At most
 * PREPACK_CLEAN_MAX_ENTRIES directory entries are looked at per call;
 * a failure is logged and counted, never an error of the bind.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct kvlog;
struct ops_kernels;
struct ops_mat;

/* The retention of model.pack_cache_keep_days's default (conf/config.c
 * writes the same number) and of kvd generate --cache-dir. */
#define PREPACK_KEEP_DAYS_DEFAULT 7u
/* Directory entries one cleanup reads at most (a bound on its work in a
 * directory someone filled; the rest waits for the next start). */
#define PREPACK_CLEAN_MAX_ENTRIES 4096u

/* The cache's key and place. dir NULL or "" means no cache. */
struct prepack_key {
	const char *dir;    /* cache directory (made 0700 if missing) */
	const char *sha256; /* the model's fingerprint: 64 lowercase hex digits */
	/* after a hit or a store, prepack_clean the directory (keeping the
	 * bound file) with this retention, logging each file to log */
	bool clean;
	uint32_t keep_days;
	struct kvlog *log;  /* may be NULL */
};

/* What one cleanup did (each removal and failure also has its log line:
 * event=pack_cache_removed, event=pack_cache_cleanup_failed). */
struct prepack_clean_stats {
	uint32_t examined;  /* directory entries read */
	uint32_t removed;   /* files unlinked */
	uint32_t in_use;    /* candidates left because a process holds them */
	uint32_t failed;    /* entries whose check or removal failed */
	uint64_t freed;     /* bytes (st_size) of the removed files */
};

/* What happened, for the caller's log line (event=pack_cache). */
struct prepack_info {
	/* "off" (no cache dir), "none" (nothing to pack), "hit", "absent",
	 * "dir_error", "unsafe_dir", "unsafe_entry", "io_error", "truncated",
	 * "corrupt" (magic, checksum, offsets), "version" (format or layout),
	 * "variant" (another kernel table), "fingerprint" (another model),
	 * "shape" (entries differ from this model's matrices), "content"
	 * (the re-packed first rows differ), "busy" (a cleanup in another
	 * process is removing it right now) */
	const char *lookup;
	/* "-" (hit or none), "off", "stored", "error" (err says why; the
	 * copies are then private memory as without a cache), "unsafe_dir",
	 * "dir_error" */
	const char *store;
	/* how the copies from the cache file (a hit's, or the file a store
	 * just wrote) are held: "lease" (the file's shared pages under a
	 * read lease: copied privately the moment anyone writes or
	 * truncates the file), "copy" (read into private memory: no lease
	 * could be had), "-" (packed into private memory: no cache file) */
	const char *hold;
	int err;            /* errno of a failed store or of dir_error */
	uint32_t packed;    /* matrices this call packed */
	uint32_t mapped;    /* matrices taken from the cache file */
	uint64_t bytes;     /* bytes of all packed copies */
	struct prepack_clean_stats clean; /* zeros when no cleanup ran */
};

struct prepack;

/* Give each of the n matrices that has a packed layout under k its
 * ->packed copy (others get NULL), from the cache when key names one and
 * it holds a valid file, else packed now (and stored when key names a
 * usable directory). *out owns the copies, and the mapped file's
 * descriptor with its shared flock (one fd): free it after the last
 * matmul. A hit touches the file's mtime. With key->clean, a hit or a
 * store is followed by prepack_clean of the directory (info->clean).
 * A cache problem is never an error (info says what happened). Returns 0,
 * or -ENOMEM / -EINVAL (a bad sha256) with nothing held. info may be NULL. */
int prepack_bind(struct prepack **out, const struct ops_kernels *k,
		 struct ops_mat *const *mats, uint32_t n,
		 const struct prepack_key *key, struct prepack_info *info);
void prepack_free(struct prepack *p);

/* Remove from dir the pack files that will not be read again (the rules
 * above), never the one named keep (NULL: none). Returns 0, -EPERM when
 * the directory is writable by others (nothing is touched), or the
 * negative errno of opening or reading it; per-file failures are counted
 * in st and logged (a warning), not returned. Single-threaded use of dir
 * by this process; other processes may bind and clean concurrently.
 * st may be NULL. */
int prepack_clean(const char *dir, const char *keep, uint32_t keep_days,
		  struct kvlog *log, struct prepack_clean_stats *st);

/* The cache file's name for a model and kernel table (out: 128 bytes). */
void prepack_entry_name(const char *sha256, const char *variant, char *out,
			size_t out_size);
