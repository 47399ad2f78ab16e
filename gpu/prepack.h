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
 * leaves no half file under the real name), and later starts map that file
 * read-only and shared: no packing, the pages come from the page cache on
 * first touch and are shared by every process serving the model.
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
 * The same user truncating a mapped file under a running daemon would
 * kill it with SIGBUS; kvd itself only ever replaces files by rename.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

struct ops_kernels;
struct ops_mat;

/* The cache's key and place. dir NULL or "" means no cache. */
struct prepack_key {
	const char *dir;    /* cache directory (made 0700 if missing) */
	const char *sha256; /* the model's fingerprint: 64 lowercase hex digits */
};

/* What happened, for the caller's log line (event=pack_cache). */
struct prepack_info {
	/* "off" (no cache dir), "none" (nothing to pack), "hit", "absent",
	 * "dir_error", "unsafe_dir", "unsafe_entry", "io_error", "truncated",
	 * "corrupt" (magic, checksum, offsets), "version" (format or layout),
	 * "variant" (another kernel table), "fingerprint" (another model),
	 * "shape" (entries differ from this model's matrices), "content"
	 * (the re-packed first rows differ) */
	const char *lookup;
	/* "-" (hit or none), "off", "stored", "error" (err says why; the
	 * copies are then private memory as without a cache), "unsafe_dir",
	 * "dir_error" */
	const char *store;
	int err;            /* errno of a failed store or of dir_error */
	uint32_t packed;    /* matrices this call packed */
	uint32_t mapped;    /* matrices taken from the cache file */
	uint64_t bytes;     /* bytes of all packed copies */
};

struct prepack;

/* Give each of the n matrices that has a packed layout under k its
 * ->packed copy (others get NULL), from the cache when key names one and
 * it holds a valid file, else packed now (and stored when key names a
 * usable directory). *out owns the copies: free it after the last matmul.
 * A cache problem is never an error (info says what happened). Returns 0,
 * or -ENOMEM / -EINVAL (a bad sha256) with nothing held. info may be NULL. */
int prepack_bind(struct prepack **out, const struct ops_kernels *k,
		 struct ops_mat *const *mats, uint32_t n,
		 const struct prepack_key *key, struct prepack_info *info);
void prepack_free(struct prepack *p);

/* The cache file's name for a model and kernel table (out: 128 bytes). */
void prepack_entry_name(const char *sha256, const char *variant, char *out,
			size_t out_size);
