/* err.h - one error space where kvd's layers meet.
 *
 * Inside a module, errors are the module's own: 0, a negative errno for
 * what the system refused, or a positive code of the module's enum
 * (GGUF_E_*, KVPOOL_E_*, FRAME_E_*, ...), named and documented in its
 * header. Codes of different modules overlap (1 is the first code of most
 * of them), so a code means nothing without its module. Where a caller in
 * another layer has to act on an error - answer a client, count it, pick
 * a wire code, decide whether to retry - it folds the code once, through
 * the module's table, into a kind below, and acts on the kind. Each
 * layer keeps its modules' tables in one file (gpu/errors.c,
 * net/errors.c, daemon/node/errors.c, ctl/errors.c); tests/test_err.c
 * checks every code of every table has a name and a kind, and pins what
 * each kind means.
 */
#pragma once

#include <stdint.h>

enum kvd_err {
	KVD_OK = 0,
	KVD_ERR_INVALID,      /* bad input: a file, frame, value or request
			       * that is malformed or inconsistent */
	KVD_ERR_TOO_BIG,      /* input over a bound: a prompt past the
			       * context, a frame or body past its limit */
	KVD_ERR_AUTH,         /* a proof, MAC or key did not verify, or the
			       * caller may not do this */
	KVD_ERR_INTEGRITY,    /* KV that cannot be trusted: a tag, checksum
			       * or coverage check failed */
	KVD_ERR_FULL,         /* no room now (pages, queue, slots): the same
			       * request may succeed later */
	KVD_ERR_STATE,        /* not in this state: closed, draining, done
			       * already */
	KVD_ERR_UNSUPPORTED,  /* well-formed, but not something this build or
			       * device can do */
	KVD_ERR_NOTFOUND,     /* no such thing (a request, a key) */
	KVD_ERR_TIMEOUT,      /* waited and gave up */
	KVD_ERR_AGAIN,        /* incomplete: feed more bytes */
	KVD_ERR_NOMEM,        /* out of memory */
	KVD_ERR_SYSTEM,       /* the system or a device failed (errno) */
	KVD_ERR_BUG,          /* a code no table knows: kvd itself is wrong */
	KVD_ERR__N
};

/* One module's codes first..last: a kind for each (indexed by code -
 * first), and their names - the module's own name function where it has
 * one, else a table here (indexed the same way). */
struct kvd_err_table {
	const char *module;
	int first, last;
	const char *(*name)(int code);   /* or NULL: names */
	const char *const *names;
	const uint8_t *kinds;            /* enum kvd_err */
};

/* "ok", "invalid", "too_big", ... (KVD_ERR_BUG's name for out of range). */
const char *kvd_err_name(enum kvd_err k);
/* What a kind means, one sentence. */
const char *kvd_err_meaning(enum kvd_err k);
/* The kind of a negative errno (ENOMEM: NOMEM, ETIMEDOUT: TIMEOUT, EINVAL
 * and EPROTO: INVALID, ENOTSUP and ENOSYS: UNSUPPORTED, ...; the rest
 * SYSTEM); 0: OK; a positive value: BUG. */
enum kvd_err kvd_err_errno(int rc);
/* The kind of rc, a return value of t's module: 0, a negative errno, or
 * one of its codes; any other positive value is KVD_ERR_BUG. */
enum kvd_err kvd_err_fold(const struct kvd_err_table *t, int rc);
/* The name of rc in t's module, "ok" for 0, strerror's text for a
 * negative errno, "unknown" outside the table. */
const char *kvd_err_code_name(const struct kvd_err_table *t, int rc);

#define KVD_ERR_TABLE(mod, lo, hi, nm, kd) \
	{ .module = (mod), .first = (lo), .last = (hi), .names = (nm), .kinds = (kd) }
/* ... for a module that names its codes itself */
#define KVD_ERR_TABLE_FN(mod, lo, hi, fn, kd) \
	{ .module = (mod), .first = (lo), .last = (hi), .name = (fn), .kinds = (kd) }
