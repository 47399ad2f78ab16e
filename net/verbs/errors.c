/* errors.c - net/verbs/'s error codes folded into kvd's kinds
 * (conf/err.h). tests/test_err.c checks every code has a name and a kind.
 */
#include "net/verbs/errors.h"
#include "net/verbs/verbs_mac.h"
#include "net/verbs/verbs_rc.h"
#include "net/verbs/verbs_scope.h"
#include "net/verbs/verbs_target.h"

#define N(lo, hi) ((hi) - (lo) + 1)

static const char *const rc_names[N(VERBS_RC_E_PEER, VERBS_RC_E_PORT)] = {
	"peer", "state", "port",
};
static const uint8_t rc_kinds[N(VERBS_RC_E_PEER, VERBS_RC_E_PORT)] = {
	KVD_ERR_INVALID, KVD_ERR_STATE, KVD_ERR_UNSUPPORTED,
};
const struct kvd_err_table kvd_err_verbs_rc =
	KVD_ERR_TABLE("verbs_rc", VERBS_RC_E_PEER, VERBS_RC_E_PORT, rc_names, rc_kinds);

static const char *const scope_names[N(VERBS_SCOPE_E_PAGE, VERBS_SCOPE_E_FAILED)] = {
	"page", "short", "runs", "range", "state", "failed",
};
static const uint8_t scope_kinds[N(VERBS_SCOPE_E_PAGE, VERBS_SCOPE_E_FAILED)] = {
	KVD_ERR_UNSUPPORTED, KVD_ERR_UNSUPPORTED, KVD_ERR_TOO_BIG,
	KVD_ERR_INVALID, KVD_ERR_STATE, KVD_ERR_SYSTEM,
};
const struct kvd_err_table kvd_err_verbs_scope =
	KVD_ERR_TABLE("verbs_scope", VERBS_SCOPE_E_PAGE, VERBS_SCOPE_E_FAILED,
		      scope_names, scope_kinds);

static const char *const mac_names[N(VERBS_MAC_E_AUTH, VERBS_MAC_E_PAGE)] = {
	"auth", "page",
};
static const uint8_t mac_kinds[N(VERBS_MAC_E_AUTH, VERBS_MAC_E_PAGE)] = {
	KVD_ERR_AUTH, KVD_ERR_INVALID,
};
const struct kvd_err_table kvd_err_verbs_mac =
	KVD_ERR_TABLE("verbs_mac", VERBS_MAC_E_AUTH, VERBS_MAC_E_PAGE, mac_names, mac_kinds);

/* a peer's write scope that would aim outside its request */
static const char *const target_names[N(VERBS_TARGET_E_EMPTY, VERBS_TARGET_E_UNCOVERED)] = {
	"empty", "wrap", "foreign", "overlap", "uncovered",
};
static const uint8_t target_kinds[N(VERBS_TARGET_E_EMPTY, VERBS_TARGET_E_UNCOVERED)] = {
	KVD_ERR_INVALID, KVD_ERR_INVALID, KVD_ERR_INVALID, KVD_ERR_INVALID,
	KVD_ERR_INVALID,
};
const struct kvd_err_table kvd_err_verbs_target =
	KVD_ERR_TABLE("verbs_target", VERBS_TARGET_E_EMPTY, VERBS_TARGET_E_UNCOVERED,
		      target_names, target_kinds);

const struct kvd_err_table *const kvd_err_verbs[] = {
	&kvd_err_verbs_rc, &kvd_err_verbs_scope, &kvd_err_verbs_mac,
	&kvd_err_verbs_target, NULL,
};
