/* errors.h - the fold tables of gpu/'s modules (conf/err.h): a caller in
 * another layer turns a gguf, model, kvpool or engine code into a kind
 * with kvd_err_fold(&kvd_err_engine, rc).
 */
#pragma once

#include "conf/err.h"

extern const struct kvd_err_table kvd_err_gguf;    /* GGUF_E_*, and the tokenizer's */
extern const struct kvd_err_table kvd_err_model;   /* MODEL_E_* */
extern const struct kvd_err_table kvd_err_kvpool;  /* KVPOOL_E_*, and the prefix cache's */
extern const struct kvd_err_table kvd_err_engine;  /* ENGINE_E_* */
/* every table above, NULL-terminated (tests/test_err.c) */
extern const struct kvd_err_table *const kvd_err_gpu[];
