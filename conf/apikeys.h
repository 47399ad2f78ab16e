/* apikeys.h - the HTTP front's API keys (http.api_keys_file).
 *
 * The file holds one `KEY TENANT [ROLE] [NAME=N ...]` per line: KEY is
 * 32..256 printable ASCII characters without spaces, of at least
 * KVD_SECRET_DISTINCT_MIN distinct characters (kvd_secret_check), TENANT 1..63 of
 * [A-Za-z0-9_.-]; blank lines and lines starting with # are skipped; a
 * key listed twice is an error. The file is private (conf/keyfile.h's
 * checks), at most 1 MiB.
 *
 * ROLE is `user` (the default) or `admin`: only an admin key reads
 * /metrics. The NAME=N options are the tenant's admission limits
 * (daemon/node/fairq.h), each 1..2^32-1: `share` (its weight in the decode
 * batch), `max_active` (requests admitted at once), `max_queued`
 * (requests waiting), `max_tokens` (prompt + max_tokens of its admitted
 * requests together). They belong to the tenant, not the key: a limit
 * given on two lines of one tenant must be equal, and every key of the
 * tenant gets them. An unset one is the config's default (tenants.*).
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
#include <stdint.h>

#define KVD_APIKEYS_FILE_MAX (1u << 20)
#define KVD_APIKEY_MIN 32u
#define KVD_APIKEY_MAX 256u
#define KVD_APIKEY_TENANT_MAX 63u   /* characters; buffers are 64 */

struct kvd_apikeys;

/* A tenant's admission limits; 0 = unset (the config default applies). */
struct kvd_tenant_limits {
	uint32_t share;
	uint32_t max_active;
	uint32_t max_queued;
	uint32_t max_tokens;
};

/* What a key is: its tenant, whether it is an admin key, the tenant's
 * limits as the file gives them. Lives as long as the set. */
struct kvd_apikey_info {
	const char *tenant;
	bool admin;
	struct kvd_tenant_limits lim;
};

int kvd_apikeys_load(struct kvd_apikeys **out, const char *path, char *why,
		     size_t why_size);
/* Same from text (tests, fuzzing); `name` for messages. */
int kvd_apikeys_parse(struct kvd_apikeys **out, const char *name,
		      const char *text, size_t len, char *why, size_t why_size);
void kvd_apikeys_free(struct kvd_apikeys *k);
size_t kvd_apikeys_count(const struct kvd_apikeys *k);
/* Distinct tenants the keys name (0 for NULL). */
size_t kvd_apikeys_tenants(const struct kvd_apikeys *k);
/* True when s (len bytes) is a valid tenant name: 1..KVD_APIKEY_TENANT_MAX
 * of [A-Za-z0-9_.-]. The one rule for keys files and the peer protocol. */
bool kvd_apikeys_tenant_ok(const char *s, size_t len);
/* The tenant of `key` (len bytes), or NULL. */
const char *kvd_apikeys_lookup(const struct kvd_apikeys *k, const char *key,
			       size_t len);
/* The same lookup (constant time) giving the key's role and limits. */
const struct kvd_apikey_info *kvd_apikeys_find(const struct kvd_apikeys *k,
					       const char *key, size_t len);
