/* errors.h - the fold tables of net/verbs/'s modules (conf/err.h). */
#pragma once

#include "conf/err.h"

extern const struct kvd_err_table kvd_err_verbs_rc;      /* VERBS_RC_E_* */
extern const struct kvd_err_table kvd_err_verbs_scope;   /* VERBS_SCOPE_E_* */
extern const struct kvd_err_table kvd_err_verbs_mac;     /* VERBS_MAC_E_* */
extern const struct kvd_err_table kvd_err_verbs_target;  /* VERBS_TARGET_E_* */
/* every table above, NULL-terminated (tests/test_err.c) */
extern const struct kvd_err_table *const kvd_err_verbs[];
