/* fingerprint.h - the model fingerprint (SHA-256 of the file), with a cache
 * so that a boot does not read the whole model when it has not changed.
 *
 * The fingerprint is always the SHA-256 of the file's bytes (what
 * `sha256sum` prints), so peers and `kvctl audit` compare the same value
 * whether it came from the cache or from hashing.
 *
 * The cache is one small file per model in a directory the daemon owns
 * (systemd's CacheDirectory=): its name comes from the model's device and
 * inode, its one line records device, inode, size, mtime and ctime (both
 * in ns), a random seed, the content evidence under that seed (SHA-256 of
 * the first MiB and 65 sampled 4 KiB blocks: fingerprint.c) and the
 * digest. An entry is used only when every recorded field equals what
 * fstat() reports on the open model now and the evidence computed now
 * equals the recorded one (verdict "evidence" otherwise); anything else - a
 * missing, unreadable, malformed, oversized or mismatched entry, one not
 * owned by this user or writable by others, or a directory others may
 * write - is a miss: the file is hashed in full and, when safe, the entry
 * rewritten (temporary file + rename, mode 0600). See fingerprint.c for
 * why ctime makes an in-place rewrite visible.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "conf/sha256.h"

/* Where the fingerprint came from and why. */
struct kvd_fp_info {
	bool cached;            /* true: read from the cache, file not read */
	const char *lookup;     /* "hit", "off", "absent", "stale", "corrupt",
				 * "evidence" (the stat figures match, the
				 * sampled bytes do not: another file with the
				 * same metadata), "unsafe_entry",
				 * "unsafe_dir", "dir_error" */
	const char *store;      /* "stored", "off", "skipped_recent" (ctime too
				 * close to now), "skipped_changed" (file changed
				 * while hashed), "unsafe_dir", "dir_error" (the
				 * directory cannot be opened or made), "error"
				 * (writing the entry failed), "-" (hit) */
	int store_errno;        /* with store == "error" or "dir_error" */
	unsigned long long hashed_bytes; /* bytes read to hash (0 on a hit) */
	uint64_t evidence_bytes; /* bytes read to check the evidence */
	uint64_t dev, ino;      /* the model's, naming its entry (forget) */
};

/* Fingerprint `path` into hex (64 digits + NUL). cache_dir NULL or "" means
 * no cache. Returns 0, or a negative errno when the model cannot be opened
 * or read (a cache problem is never an error: it is reported in info and
 * the file is hashed). `info` may be NULL. */
int kvd_fingerprint(const char *path, const char *cache_dir,
		    char hex[SHA256_HEX_SIZE], struct kvd_fp_info *info);

/* A hit names a digest the file's bytes were not hashed for at this start:
 * the caller verifies it in full off its loop (daemon/node/fpcheck.c) and, on
 * a mismatch, drops the entry of (dev, ino) from info so the next start
 * hashes in full. 0 (also when there was none) or a negative errno. */
int kvd_fingerprint_forget(const char *cache_dir, uint64_t dev, uint64_t ino);

/* kvd_fingerprint of the file open at fd as if fstat() said *st (the
 * cache lookup's key): for tests that forge two files' metadata equal.
 * fd is not closed. */
struct stat;
int kvd__fingerprint_stat(int fd, const struct stat *st, const char *cache_dir,
			  char hex[SHA256_HEX_SIZE], struct kvd_fp_info *info);

/* Resolve model.fingerprint_cache: "off" -> "" (no cache); "" -> the first
 * entry of $CACHE_DIRECTORY (systemd's CacheDirectory=) when set and
 * absolute, else ""; anything else as is. out has out_size bytes. */
void kvd_fingerprint_cache_dir(const char *configured, char *out,
			       size_t out_size);
