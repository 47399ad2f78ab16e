/* errors.c - the admin plane's wire codes (ctl/admin.h) folded into kvd's
 * kinds (conf/err.h); the names are the wire names admin_strerror gives.
 */
#include "ctl/errors.h"
#include "ctl/admin.h"

#define N (ADMIN_E__N - ADMIN_E_MALFORMED)

/* the wire names ("error" of a reply): stable, scripts match on them */
static const char *const admin_names[N] = {
	[ADMIN_E_MALFORMED - 1] = "malformed",
	[ADMIN_E_TOO_BIG - 1] = "too_big",
	[ADMIN_E_UNKNOWN_COMMAND - 1] = "unknown_command",
	[ADMIN_E_BAD_ARGS - 1] = "bad_args",
	[ADMIN_E_DENIED - 1] = "denied",
	[ADMIN_E_BUSY - 1] = "busy",
	[ADMIN_E_NOT_FOUND - 1] = "not_found",
	[ADMIN_E_WRONG_STATE - 1] = "wrong_state",
	[ADMIN_E_CAPACITY - 1] = "capacity",
	[ADMIN_E_TIMEOUT - 1] = "timeout",
	[ADMIN_E_UNSUPPORTED - 1] = "unsupported",
	[ADMIN_E_INTERNAL - 1] = "internal",
	[ADMIN_E_TOO_MANY_CLIENTS - 1] = "too_many_clients",
	[ADMIN_E_DRAINING - 1] = "draining",
	[ADMIN_E_OUT_OF_RANGE - 1] = "out_of_range",
	[ADMIN_E_POOL_FULL - 1] = "pool_full",
};

static const uint8_t admin_kinds[N] = {
	[ADMIN_E_MALFORMED - 1] = KVD_ERR_INVALID,
	[ADMIN_E_TOO_BIG - 1] = KVD_ERR_TOO_BIG,
	[ADMIN_E_UNKNOWN_COMMAND - 1] = KVD_ERR_INVALID,
	[ADMIN_E_BAD_ARGS - 1] = KVD_ERR_INVALID,
	[ADMIN_E_DENIED - 1] = KVD_ERR_AUTH,
	[ADMIN_E_BUSY - 1] = KVD_ERR_FULL,
	[ADMIN_E_NOT_FOUND - 1] = KVD_ERR_NOTFOUND,
	[ADMIN_E_WRONG_STATE - 1] = KVD_ERR_STATE,
	[ADMIN_E_CAPACITY - 1] = KVD_ERR_INVALID,
	[ADMIN_E_TIMEOUT - 1] = KVD_ERR_TIMEOUT,
	[ADMIN_E_UNSUPPORTED - 1] = KVD_ERR_UNSUPPORTED,
	[ADMIN_E_INTERNAL - 1] = KVD_ERR_SYSTEM,
	[ADMIN_E_TOO_MANY_CLIENTS - 1] = KVD_ERR_FULL,
	[ADMIN_E_DRAINING - 1] = KVD_ERR_STATE,
	[ADMIN_E_OUT_OF_RANGE - 1] = KVD_ERR_INVALID,
	[ADMIN_E_POOL_FULL - 1] = KVD_ERR_FULL,
};

const struct kvd_err_table kvd_err_admin =
	KVD_ERR_TABLE("admin", ADMIN_E_MALFORMED, ADMIN_E__N - 1, admin_names, admin_kinds);

const struct kvd_err_table *const kvd_err_ctl[] = { &kvd_err_admin, NULL };
