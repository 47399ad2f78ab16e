/* errors.h - the fold tables of net/'s modules (conf/err.h): a caller in
 * another layer turns a code into a kind with kvd_err_fold(&kvd_err_frame,
 * rc). The verbs modules' tables are in net/verbs/errors.h.
 */
#pragma once

#include "conf/err.h"

extern const struct kvd_err_table kvd_err_frame;       /* FRAME_E_* */
extern const struct kvd_err_table kvd_err_proto;       /* enum proto_err, the client wire codes */
extern const struct kvd_err_table kvd_err_http_wire;   /* HTTP_WIRE_E_* (HTTP_WIRE_MSG is a result) */
extern const struct kvd_err_table kvd_err_xfer;        /* XFER_E_* */
extern const struct kvd_err_table kvd_err_xfer_check;  /* XFER_CHECK_E_* (and PENDING) */
extern const struct kvd_err_table kvd_err_transport;   /* TRANSPORT_E_* */
extern const struct kvd_err_table kvd_err_peer_auth;   /* PEER_AUTH_E_* */
extern const struct kvd_err_table kvd_err_wbound;      /* WBOUND_E_* */
extern const struct kvd_err_table kvd_err_chapoly;     /* CHAPOLY_E_* */
/* every table above, NULL-terminated (tests/test_err.c) */
extern const struct kvd_err_table *const kvd_err_net[];

/* The client's wire code for a failure of this kind: too_big is
 * PROMPT_TOO_LONG, invalid INVALID_REQUEST, full OVERLOADED, integrity
 * INTEGRITY, timeout TIMEOUT, every other kind (the node's own trouble)
 * INTERNAL. The one place a kind becomes what a client is told. */
int kvd_err_to_proto(enum kvd_err k);
