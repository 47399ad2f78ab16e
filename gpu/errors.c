/* errors.c - gpu/'s error codes folded into kvd's kinds (conf/err.h):
 * one table per module whose public functions return codes of their own.
 * The tokenizer reports GGUF_E_* codes (its vocabulary is GGUF metadata)
 * and the prefix cache the pool's. tests/test_err.c checks every code
 * has a name and a kind.
 */
#include "gpu/errors.h"
#include "gpu/engine.h"
#include "gpu/gguf/gguf.h"
#include "gpu/kv/kvpool.h"
#include "gpu/model/model.h"

#define N(lo, hi) ((hi) - (lo) + 1)

static const uint8_t gguf_kinds[N(GGUF_E_MAGIC, GGUF_E_UNSUPPORTED)] = {
	[GGUF_E_MAGIC - 1] = KVD_ERR_INVALID,
	[GGUF_E_VERSION - 1] = KVD_ERR_UNSUPPORTED,
	[GGUF_E_TRUNCATED - 1] = KVD_ERR_INVALID,
	[GGUF_E_MALFORMED - 1] = KVD_ERR_INVALID,
	[GGUF_E_TENSOR - 1] = KVD_ERR_INVALID,
	[GGUF_E_MISSING - 1] = KVD_ERR_INVALID,
	[GGUF_E_TYPE - 1] = KVD_ERR_INVALID,
	[GGUF_E_ARCH - 1] = KVD_ERR_UNSUPPORTED,
	[GGUF_E_UNSUPPORTED - 1] = KVD_ERR_UNSUPPORTED,
};
const struct kvd_err_table kvd_err_gguf =
	KVD_ERR_TABLE_FN("gguf", GGUF_E_MAGIC, GGUF_E_UNSUPPORTED, gguf_strerror, gguf_kinds);

static const char *const model_names[N(MODEL_E_TENSOR, MODEL_E_ALIGN)] = {
	"tensor", "type", "align",
};
static const uint8_t model_kinds[N(MODEL_E_TENSOR, MODEL_E_ALIGN)] = {
	KVD_ERR_INVALID, KVD_ERR_UNSUPPORTED, KVD_ERR_INVALID,
};
const struct kvd_err_table kvd_err_model =
	KVD_ERR_TABLE("model", MODEL_E_TENSOR, MODEL_E_ALIGN, model_names, model_kinds);

static const char *const kvpool_names[N(KVPOOL_E_FULL, KVPOOL_E_COVERAGE)] = {
	"full", "stale", "state", "range", "tag", "coverage",
};
/* stale and state: a caller naming a page it does not hold, or in the
 * wrong state - kvd's own bookkeeping, never a client's input */
static const uint8_t kvpool_kinds[N(KVPOOL_E_FULL, KVPOOL_E_COVERAGE)] = {
	KVD_ERR_FULL, KVD_ERR_STATE, KVD_ERR_STATE, KVD_ERR_INVALID,
	KVD_ERR_INTEGRITY, KVD_ERR_INTEGRITY,
};
const struct kvd_err_table kvd_err_kvpool =
	KVD_ERR_TABLE("kvpool", KVPOOL_E_FULL, KVPOOL_E_COVERAGE, kvpool_names, kvpool_kinds);

static const uint8_t engine_kinds[N(ENGINE_E_TOO_LONG, ENGINE_E_POOL)] = {
	KVD_ERR_TOO_BIG, KVD_ERR_INVALID, KVD_ERR_INTEGRITY,
	KVD_ERR_STATE,          /* geometry: the node's pool, not the input */
	KVD_ERR_FULL, KVD_ERR_UNSUPPORTED, KVD_ERR_FULL, KVD_ERR_STATE,
};
const struct kvd_err_table kvd_err_engine =
	KVD_ERR_TABLE_FN("engine", ENGINE_E_TOO_LONG, ENGINE_E_POOL, engine_strerror, engine_kinds);

const struct kvd_err_table *const kvd_err_gpu[] = {
	&kvd_err_gguf, &kvd_err_model, &kvd_err_kvpool, &kvd_err_engine, NULL,
};
