/* apikeys.h - the HTTP front's API keys (http.api_keys_file).
 *
 * The file holds one `KEY TENANT` per line: KEY is 32..256 printable
 * ASCII characters without spaces, of at least KVD_SECRET_DISTINCT_MIN
 * distinct characters (kvd_secret_check), TENANT 1..63 of [A-Za-z0-9_.-]; blank
 * lines and lines starting with # are skipped; a key listed twice is an
 * error. The file is private (conf/keyfile.h's checks), at most 1 MiB.
 *
 * Only SHA-256 digests of the keys are kept. A lookup hashes the
 * presented key and compares its digest with every entry in constant time
 * (no early exit, no length leak), so the time a refusal takes says
 * nothing about how close a guess was.
 *
 * Errors: 0; -1 with a sentence in `why` naming the file and line; -ENOMEM.
 * Thread safety: a loaded set is read-only.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#define KVD_APIKEYS_FILE_MAX (1u << 20)
#define KVD_APIKEY_MIN 32u
#define KVD_APIKEY_MAX 256u
#define KVD_APIKEY_TENANT_MAX 63u   /* characters; buffers are 64 */

struct kvd_apikeys;

int kvd_apikeys_load(struct kvd_apikeys **out, const char *path, char *why,
		     size_t why_size);
/* Same from text (tests, fuzzing); `name` for messages. */
int kvd_apikeys_parse(struct kvd_apikeys **out, const char *name,
		      const char *text, size_t len, char *why, size_t why_size);
void kvd_apikeys_free(struct kvd_apikeys *k);
size_t kvd_apikeys_count(const struct kvd_apikeys *k);
/* True when s (len bytes) is a valid tenant name: 1..KVD_APIKEY_TENANT_MAX
 * of [A-Za-z0-9_.-]. The one rule for keys files and the peer protocol. */
bool kvd_apikeys_tenant_ok(const char *s, size_t len);
/* The tenant of `key` (len bytes), or NULL. */
const char *kvd_apikeys_lookup(const struct kvd_apikeys *k, const char *key,
			       size_t len);
