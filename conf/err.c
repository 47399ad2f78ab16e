/* err.c - the kinds of error and the fold from a module's codes (err.h). */
#include "conf/err.h"
#include "conf/util.h"

#include <errno.h>
#include <string.h>

static const char *const kind_names[KVD_ERR__N] = {
	[KVD_OK] = "ok", [KVD_ERR_INVALID] = "invalid",
	[KVD_ERR_TOO_BIG] = "too_big", [KVD_ERR_AUTH] = "auth",
	[KVD_ERR_INTEGRITY] = "integrity", [KVD_ERR_FULL] = "full",
	[KVD_ERR_STATE] = "state", [KVD_ERR_UNSUPPORTED] = "unsupported",
	[KVD_ERR_NOTFOUND] = "not_found", [KVD_ERR_TIMEOUT] = "timeout",
	[KVD_ERR_AGAIN] = "again", [KVD_ERR_NOMEM] = "no_memory",
	[KVD_ERR_SYSTEM] = "system", [KVD_ERR_BUG] = "bug",
};

static const char *const kind_meanings[KVD_ERR__N] = {
	[KVD_OK] = "no error",
	[KVD_ERR_INVALID] = "the input is malformed or inconsistent",
	[KVD_ERR_TOO_BIG] = "the input is over a bound",
	[KVD_ERR_AUTH] = "a proof, MAC or key did not verify, or the caller may not do this",
	[KVD_ERR_INTEGRITY] = "KV failed a tag, checksum or coverage check",
	[KVD_ERR_FULL] = "no room now; the same request may succeed later",
	[KVD_ERR_STATE] = "not possible in the current state",
	[KVD_ERR_UNSUPPORTED] = "not something this build or device can do",
	[KVD_ERR_NOTFOUND] = "no such thing",
	[KVD_ERR_TIMEOUT] = "waited and gave up",
	[KVD_ERR_AGAIN] = "incomplete: more input is needed",
	[KVD_ERR_NOMEM] = "out of memory",
	[KVD_ERR_SYSTEM] = "the system or a device failed",
	[KVD_ERR_BUG] = "an error code no table knows",
};

const char *kvd_err_name(enum kvd_err k)
{
	return (unsigned)k < KVD_ERR__N ? kind_names[k] : kind_names[KVD_ERR_BUG];
}

const char *kvd_err_meaning(enum kvd_err k)
{
	return (unsigned)k < KVD_ERR__N ? kind_meanings[k] : kind_meanings[KVD_ERR_BUG];
}

enum kvd_err kvd_err_errno(int rc)
{
	if (rc == 0)
		return KVD_OK;
	if (rc > 0)
		return KVD_ERR_BUG;
	switch (-rc) {
	case ENOMEM:
		return KVD_ERR_NOMEM;
	case ETIMEDOUT:
		return KVD_ERR_TIMEOUT;
	case EINVAL: case EPROTO: case EBADMSG: case EILSEQ:
		return KVD_ERR_INVALID;
	case E2BIG: case EMSGSIZE: case EFBIG: case ERANGE: case ENAMETOOLONG:
		return KVD_ERR_TOO_BIG;
	case EACCES: case EPERM:
		return KVD_ERR_AUTH;
	case ENOTSUP: case ENOSYS: case ENODEV:
		return KVD_ERR_UNSUPPORTED;
	case ENOENT: case ESRCH:
		return KVD_ERR_NOTFOUND;
	case EAGAIN:
		return KVD_ERR_AGAIN;
	case EBUSY: case ENOSPC: case ENOBUFS: case EMFILE: case ENFILE:
		return KVD_ERR_FULL;
	case EALREADY: case EISCONN: case ENOTCONN: case ECANCELED: case ESHUTDOWN:
		return KVD_ERR_STATE;
	default:
		return KVD_ERR_SYSTEM;
	}
}

enum kvd_err kvd_err_fold(const struct kvd_err_table *t, int rc)
{
	if (rc <= 0)
		return kvd_err_errno(rc);
	if (rc < t->first || rc > t->last)
		return KVD_ERR_BUG;
	return (enum kvd_err)t->kinds[rc - t->first];
}

const char *kvd_err_code_name(const struct kvd_err_table *t, int rc)
{
	if (rc == 0)
		return "ok";
	if (rc < 0)
		return strerror(-rc);
	if (rc < t->first || rc > t->last)
		return "unknown";
	if (t->name)
		return t->name(rc);
	return t->names[rc - t->first] ? t->names[rc - t->first] : "unknown";
}
