/* keyfile.h - reading secret files: the cluster secret (peers.key_file)
 * and the HTTP front's API keys (http.api_keys_file, conf/apikeys.h).
 *
 * A secret file is checked, not trusted (kvd_private_open, on the open
 * descriptor): it must be a regular file (a FIFO, a device or a directory
 * is refused without blocking), owned by this user or root (a file
 * another account owns is that account's to change), and neither group
 * nor others may read, write or execute it. A symlink is followed (systemd
 * credentials and configuration management hand secrets over through
 * one); the file judged is its target.
 *
 * The cluster secret is the whole content of its file: at least
 * KVD_KEYFILE_MIN bytes (kvctl keygen writes 32 random bytes as 64 hex
 * digits and a newline), at most KVD_KEYFILE_MAX, and not of obviously
 * low entropy (kvd_secret_check). The bytes are key material, not the
 * key: net/peer_auth derives every key from them with a KDF, so their
 * encoding does not matter.
 *
 * Errors: 0; -1 with a sentence in `why` that names the file and the rule
 * (the caller exits 78 naming the config key); -ENOMEM. Thread safety:
 * none needed (boot and --check-config only).
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#define KVD_KEYFILE_MIN 32u
#define KVD_KEYFILE_MAX 4096u
/* A secret has at least this many distinct byte values: 32 random hex
 * digits have 16 of 16 possible with near certainty, a key of one or two
 * repeated bytes has one or two. A floor against the obvious, not an
 * entropy estimate. */
#define KVD_SECRET_DISTINCT_MIN 8u

/* Read `path` into buf[KVD_KEYFILE_MAX]; *len gets the byte count. */
int kvd_keyfile_read(const char *path, uint8_t *buf, size_t *len,
		     char *why, size_t why_size);

/* Open `path` for reading after the checks above; `what` names the
 * secret in `why`. An fd, or -1 with a sentence in `why`. */
int kvd_private_open(const char *path, const char *what, char *why,
		     size_t why_size);

/* kvd_private_open, then read the whole file into buf (buf_size bytes);
 * a file of more than max bytes (max < buf_size) is refused. *len gets
 * the byte count. 0, or -1 with a sentence in `why`; on failure the
 * bytes read are wiped. */
int kvd_private_read(const char *path, const char *what, void *buf,
		     size_t max, size_t *len, char *why, size_t why_size);

/* 0 when key (len bytes) may be a secret: at least min bytes and at least
 * KVD_SECRET_DISTINCT_MIN distinct byte values; else -1 with the rule it
 * breaks in `why` (a phrase: the caller prefixes the file or line). */
int kvd_secret_check(const void *key, size_t len, size_t min, char *why,
		     size_t why_size);
