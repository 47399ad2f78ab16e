/* errors.h - the fold tables of daemon/node/'s modules (conf/err.h). */
#pragma once

#include "conf/err.h"

extern const struct kvd_err_table kvd_err_daemon;  /* KVD_E_* (daemon.h) */
extern const struct kvd_err_table kvd_err_ops;     /* KVD_OPS_E_* (ops.h) */
extern const struct kvd_err_table kvd_err_fairq;   /* FAIRQ_E_* */
/* every table above, NULL-terminated (tests/test_err.c) */
extern const struct kvd_err_table *const kvd_err_node[];
