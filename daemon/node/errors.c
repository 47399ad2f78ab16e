/* errors.c - daemon/node/'s error codes folded into kvd's kinds
 * (conf/err.h). tests/test_err.c checks every code has a name and a kind.
 */
#include "daemon/node/errors.h"
#include "daemon/node/daemon.h"
#include "daemon/node/fairq.h"
#include "daemon/node/ops.h"

#define N(lo, hi) ((hi) - (lo) + 1)

static const char *const daemon_names[N(KVD_E_CAPACITY, KVD_E_NOTFOUND)] = {
	"capacity", "model", "draining", "busy", "not_found",
};
static const uint8_t daemon_kinds[N(KVD_E_CAPACITY, KVD_E_NOTFOUND)] = {
	KVD_ERR_FULL, KVD_ERR_INVALID, KVD_ERR_STATE, KVD_ERR_FULL,
	KVD_ERR_NOTFOUND,
};
const struct kvd_err_table kvd_err_daemon =
	KVD_ERR_TABLE("daemon", KVD_E_CAPACITY, KVD_E_NOTFOUND, daemon_names, daemon_kinds);

static const uint8_t ops_kinds[N(KVD_OPS_E_STATE, KVD_OPS_E_UNSUPPORTED)] = {
	KVD_ERR_STATE, KVD_ERR_INVALID, KVD_ERR_TIMEOUT, KVD_ERR_FULL,
	KVD_ERR_UNSUPPORTED,
};
const struct kvd_err_table kvd_err_ops =
	KVD_ERR_TABLE_FN("ops", KVD_OPS_E_STATE, KVD_OPS_E_UNSUPPORTED, kvd_ops_strerror, ops_kinds);

static const char *const fairq_names[N(FAIRQ_E_TOO_BIG, FAIRQ_E_FULL)] = {
	"too_big", "full",
};
static const uint8_t fairq_kinds[N(FAIRQ_E_TOO_BIG, FAIRQ_E_FULL)] = {
	KVD_ERR_TOO_BIG, KVD_ERR_FULL,
};
const struct kvd_err_table kvd_err_fairq =
	KVD_ERR_TABLE("fairq", FAIRQ_E_TOO_BIG, FAIRQ_E_FULL, fairq_names, fairq_kinds);

const struct kvd_err_table *const kvd_err_node[] = {
	&kvd_err_daemon, &kvd_err_ops, &kvd_err_fairq, NULL,
};
