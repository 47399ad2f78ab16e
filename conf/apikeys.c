/* apikeys.c - parse the API keys file, look keys up in constant time.
 *
 * Design. The file is read once (at --check-config and at boot) after
 * the private-file checks; each entry keeps SHA-256(key) and the tenant.
 * A lookup hashes the candidate and ORs the differences of all 32 bytes
 * against every entry, remembering the match without branching on it, so
 * its time depends only on the number of entries.
 *
 * Roles and limits are words after the tenant (apikeys_opts). Limits are
 * the tenant's: a line that gives one is checked against the earlier
 * lines of its tenant that give it too, and once the file is read the
 * limits are copied to every key of the tenant (apikeys_spread), so a
 * lookup finds them on whichever key was used.
 */
#include "conf/apikeys.h"
#include "conf/keyfile.h"
#include "conf/sha256.h"
#include "conf/util.h"

#include <errno.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct apikey_entry {
	uint8_t digest[SHA256_DIGEST_SIZE];
	char tenant[KVD_APIKEY_TENANT_MAX + 1];
	struct kvd_apikey_info info;     /* info.tenant points at tenant */
	bool has_lim;                    /* this line gave a limit */
};

/* The limit options, by name; `lim` field offsets. */
static const struct apikey_opt {
	const char *name;
	size_t off;
} apikey_opts[] = {
	{ "share", offsetof(struct kvd_tenant_limits, share) },
	{ "max_active", offsetof(struct kvd_tenant_limits, max_active) },
	{ "max_queued", offsetof(struct kvd_tenant_limits, max_queued) },
	{ "max_tokens", offsetof(struct kvd_tenant_limits, max_tokens) },
};

#define APIKEY_N_OPTS (sizeof(apikey_opts) / sizeof(apikey_opts[0]))

static uint32_t *lim_field(struct kvd_tenant_limits *l, size_t i)
{
	return (uint32_t *)((char *)l + apikey_opts[i].off);
}

struct kvd_apikeys {
	struct apikey_entry *e;   /* (n) */
	size_t n;
};

static bool tenant_char(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
	       (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-';
}

bool kvd_apikeys_tenant_ok(const char *s, size_t len)
{
	if (!s || len == 0 || len > KVD_APIKEY_TENANT_MAX)
		return false;
	for (size_t i = 0; i < len; i++)
		if (!tenant_char(s[i]))
			return false;
	return true;
}

static bool key_char(char c)
{
	return c > ' ' && c < 0x7f;
}

/* One word after the tenant, [w, we): a role or NAME=N. 0, or -1 with why. */
static int apikeys_word(struct apikey_entry *e, const char *name, unsigned lineno,
			const char *w, const char *we, char *why, size_t why_size)
{
	size_t n = (size_t)(we - w);
	const char *eq = memchr(w, '=', n);

	if (!eq) {
		if (n == 5 && !memcmp(w, "admin", 5)) {
			e->info.admin = true;
			return 0;
		}
		if (n == 4 && !memcmp(w, "user", 4))
			return 0;
	}
	for (size_t i = 0; eq && i < APIKEY_N_OPTS; i++) {
		size_t nl = strlen(apikey_opts[i].name);
		unsigned long long v = 0;
		const char *d = eq + 1;

		if ((size_t)(eq - w) != nl || memcmp(w, apikey_opts[i].name, nl))
			continue;
		for (; d < we && *d >= '0' && *d <= '9' && v <= UINT32_MAX; d++)
			v = v * 10 + (unsigned)(*d - '0');
		if (d != we || d == eq + 1 || v == 0 || v > UINT32_MAX) {
			snprintf(why, why_size, "%s:%u: %s is a number 1..%u",
				 name, lineno, apikey_opts[i].name, UINT32_MAX);
			return -1;
		}
		*lim_field(&e->info.lim, i) = (uint32_t)v;
		e->has_lim = true;
		return 0;
	}
	snprintf(why, why_size, "%s:%u: after the tenant: `admin`, `user`, share=N, max_active=N, max_queued=N or max_tokens=N (got '%.*s')",
		 name, lineno, (int)KVD_MIN(n, (size_t)32), w);
	return -1;
}

/* The words after the tenant, [p, end). 0, or -1 with why. */
static int apikeys_opts(struct apikey_entry *e, const char *name, unsigned lineno,
			const char *p, const char *end, char *why, size_t why_size)
{
	while (p < end) {
		const char *w = p;

		while (p < end && key_char(*p))
			p++;
		if (apikeys_word(e, name, lineno, w, p, why, why_size))
			return -1;
		while (p < end && (*p == ' ' || *p == '\t'))
			p++;
	}
	return 0;
}

/* A limit e gives that an earlier line of its tenant gives otherwise:
 * -1 with why. */
static int apikeys_lim_agree(const struct kvd_apikeys *k, const struct apikey_entry *e,
			     const char *name, unsigned lineno, char *why, size_t why_size)
{
	for (size_t j = 0; e->has_lim && j < k->n; j++) {
		struct kvd_tenant_limits a = k->e[j].info.lim, b = e->info.lim;

		if (!k->e[j].has_lim || strcmp(k->e[j].tenant, e->tenant))
			continue;
		for (size_t i = 0; i < APIKEY_N_OPTS; i++) {
			uint32_t x = *lim_field(&a, i), y = *lim_field(&b, i);

			if (x && y && x != y) {
				snprintf(why, why_size, "%s:%u: tenant %s has %s=%u on an earlier line: a tenant's limits are the same on each of its lines",
					 name, lineno, e->tenant, apikey_opts[i].name, x);
				return -1;
			}
		}
	}
	return 0;
}

/* Every key of a tenant gets the limits any line of it gives. */
static void apikeys_spread(struct kvd_apikeys *k)
{
	for (size_t j = 0; j < k->n; j++) {
		if (!k->e[j].has_lim)
			continue;
		for (size_t m = 0; m < k->n; m++) {
			if (m == j || strcmp(k->e[m].tenant, k->e[j].tenant))
				continue;
			for (size_t i = 0; i < APIKEY_N_OPTS; i++) {
				uint32_t *to = lim_field(&k->e[m].info.lim, i);

				if (!*to)
					*to = *lim_field(&k->e[j].info.lim, i);
			}
		}
	}
}

/* One line [p, end): 0 (entry or nothing), -1 with why. */
static int apikeys_line(struct kvd_apikeys *k, size_t cap, const char *name,
			unsigned lineno, const char *p, const char *end,
			char *why, size_t why_size)
{
	const char *key, *ten, *opts;
	size_t klen, tlen;
	struct apikey_entry *e;
	char rule[200];

	if (end > p && end[-1] == '\r')
		end--;
	while (p < end && (*p == ' ' || *p == '\t'))
		p++;
	if (p == end || *p == '#')
		return 0;
	key = p;
	while (p < end && key_char(*p))
		p++;
	klen = (size_t)(p - key);
	if (p < end && *p != ' ' && *p != '\t') {
		snprintf(why, why_size, "%s:%u: a key holds printable ASCII without spaces",
			 name, lineno);
		return -1;
	}
	while (p < end && (*p == ' ' || *p == '\t'))
		p++;
	ten = p;
	while (p < end && tenant_char(*p))
		p++;
	tlen = (size_t)(p - ten);
	if ((p != end && *p != ' ' && *p != '\t') || tlen == 0) {
		snprintf(why, why_size, "%s:%u: expected `KEY TENANT [ROLE] [NAME=N ...]` (tenant: 1..%u of A-Z a-z 0-9 _ . -)",
			 name, lineno, KVD_APIKEY_TENANT_MAX);
		return -1;
	}
	while (p < end && (*p == ' ' || *p == '\t'))
		p++;
	opts = p;
	if (klen > KVD_APIKEY_MAX) {
		snprintf(why, why_size, "%s:%u: a key is %u..%u characters (this one is %zu)",
			 name, lineno, KVD_APIKEY_MIN, KVD_APIKEY_MAX, klen);
		return -1;
	}
	if (kvd_secret_check(key, klen, KVD_APIKEY_MIN, rule, sizeof(rule))) {
		snprintf(why, why_size, "%s:%u: the key %s", name, lineno, rule);
		return -1;
	}
	if (tlen > KVD_APIKEY_TENANT_MAX) {
		snprintf(why, why_size, "%s:%u: tenant longer than %u characters",
			 name, lineno, KVD_APIKEY_TENANT_MAX);
		return -1;
	}
	if (k->n == cap)
		return -ENOMEM;   /* cannot happen: cap counts lines */
	e = &k->e[k->n];
	sha256_buf(key, klen, e->digest);
	for (size_t i = 0; i < k->n; i++)
		if (!memcmp(k->e[i].digest, e->digest, sizeof(e->digest))) {
			snprintf(why, why_size, "%s:%u: this key is listed twice",
				 name, lineno);
			return -1;
		}
	memcpy(e->tenant, ten, tlen);
	e->tenant[tlen] = 0;
	e->info.tenant = e->tenant;
	if (apikeys_opts(e, name, lineno, opts, end, why, why_size) ||
	    apikeys_lim_agree(k, e, name, lineno, why, why_size)) {
		memset(e, 0, sizeof(*e));
		return -1;
	}
	k->n++;
	return 0;
}

int kvd_apikeys_parse(struct kvd_apikeys **out, const char *name,
		      const char *text, size_t len, char *why, size_t why_size)
{
	struct kvd_apikeys *k;
	size_t lines = 1;
	const char *p = text, *end = text + len;
	unsigned lineno = 0;
	int rc = 0;

	*out = NULL;
	if (memchr(text, 0, len)) {
		snprintf(why, why_size, "%s: holds a NUL byte; not a keys file", name);
		return -1;
	}
	for (size_t i = 0; i < len; i++)
		lines += text[i] == '\n';
	k = calloc(1, sizeof(*k));
	if (!k || !(k->e = calloc(lines, sizeof(*k->e)))) {
		free(k);
		return -ENOMEM;
	}
	while (p < end && !rc) {
		const char *nl = memchr(p, '\n', (size_t)(end - p));
		const char *le = nl ? nl : end;

		rc = apikeys_line(k, lines, name, ++lineno, p, le, why, why_size);
		p = nl ? nl + 1 : end;
	}
	if (!rc)
		apikeys_spread(k);
	if (!rc && k->n == 0) {
		snprintf(why, why_size, "%s: no `KEY TENANT` line", name);
		rc = -1;
	}
	if (rc) {
		kvd_apikeys_free(k);
		return rc;
	}
	*out = k;
	return 0;
}

int kvd_apikeys_load(struct kvd_apikeys **out, const char *path, char *why,
		     size_t why_size)
{
	char *buf;
	size_t got = 0;
	int rc;

	*out = NULL;
	buf = malloc(KVD_APIKEYS_FILE_MAX + 1);
	if (!buf)
		return -ENOMEM;
	rc = kvd_private_read(path, "an API keys file", buf, KVD_APIKEYS_FILE_MAX,
			      &got, why, why_size);
	if (!rc)
		rc = kvd_apikeys_parse(out, path, buf, got, why, why_size);
	explicit_bzero(buf, got);
	free(buf);
	return rc;
}

void kvd_apikeys_free(struct kvd_apikeys *k)
{
	if (!k)
		return;
	free(k->e);
	free(k);
}

size_t kvd_apikeys_count(const struct kvd_apikeys *k)
{
	return k ? k->n : 0;
}

size_t kvd_apikeys_tenants(const struct kvd_apikeys *k)
{
	size_t n = 0;

	for (size_t i = 0; k && i < k->n; i++) {
		size_t j = 0;

		while (j < i && strcmp(k->e[j].tenant, k->e[i].tenant))
			j++;
		n += j == i;
	}
	return n;
}

const struct kvd_apikey_info *kvd_apikeys_find(const struct kvd_apikeys *k,
					       const char *key, size_t len)
{
	uint8_t d[SHA256_DIGEST_SIZE];
	size_t found = 0;   /* index + 1 of the match; 0 none */

	if (!k)
		return NULL;
	sha256_buf(key, len, d);
	for (size_t i = 0; i < k->n; i++) {
		uint8_t diff = 0;

		for (size_t j = 0; j < sizeof(d); j++)
			diff |= (uint8_t)(d[j] ^ k->e[i].digest[j]);
		/* all ones when diff == 0, else zero: no branch on the secret */
		size_t eq = (size_t)0 - (size_t)(((unsigned)diff - 1u) >> 8 & 1u);

		found |= eq & (i + 1);
	}
	return found ? &k->e[found - 1].info : NULL;
}

const char *kvd_apikeys_lookup(const struct kvd_apikeys *k, const char *key,
			       size_t len)
{
	const struct kvd_apikey_info *i = kvd_apikeys_find(k, key, len);

	return i ? i->tenant : NULL;
}
