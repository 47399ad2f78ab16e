/* keyfile.h - reading the cluster secret (peers.key_file).
 *
 * The secret is the whole content of a regular file: at least
 * KVD_KEYFILE_MIN bytes (kvctl keygen writes 32 random bytes as 64 hex
 * digits and a newline), at most KVD_KEYFILE_MAX. A file that group or
 * others may read, write or execute is refused, as is anything that is not
 * a regular file: a secret another account can read is no secret.
 *
 * The bytes are key material, not the key: net/peer_auth derives every key
 * from them with a KDF, so their encoding does not matter.
 *
 * Errors: 0; -1 with a sentence in `why` (the caller exits 78 naming
 * peers.key_file). Thread safety: none needed (boot only).
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#define KVD_KEYFILE_MIN 32u
#define KVD_KEYFILE_MAX 4096u

/* Read `path` into buf[KVD_KEYFILE_MAX]; *len gets the byte count. */
int kvd_keyfile_read(const char *path, uint8_t *buf, size_t *len,
		     char *why, size_t why_size);

/* Open `path` for reading after the same checks (a regular file that
 * group and others cannot touch); `what` names the secret in `why`.
 * An fd, or -1 with a sentence in `why`. */
int kvd_private_open(const char *path, const char *what, char *why,
		     size_t why_size);
