/* errors.h - the fold table of the admin plane's wire codes (conf/err.h). */
#pragma once

#include "conf/err.h"

extern const struct kvd_err_table kvd_err_admin;   /* ADMIN_E_* */
/* NULL-terminated (tests/test_err.c) */
extern const struct kvd_err_table *const kvd_err_ctl[];
