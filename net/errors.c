/* errors.c - net/'s error codes folded into kvd's kinds (conf/err.h),
 * and a kind into the client wire code (the fold's other direction, for
 * the fronts). tests/test_err.c checks every code has a name and a kind.
 */
#include "net/errors.h"
#include "net/chapoly.h"
#include "net/peer_auth.h"
#include "net/transport.h"
#include "net/wbound.h"
#include "net/wire/frame.h"
#include "net/wire/http_wire.h"
#include "net/wire/proto_client.h"
#include "net/xfer.h"
#include "net/xfer_check.h"

#define N(lo, hi) ((hi) - (lo) + 1)

static const uint8_t frame_kinds[N(FRAME_E_AGAIN, FRAME_E_AUTH)] = {
	KVD_ERR_AGAIN, KVD_ERR_TOO_BIG, KVD_ERR_INVALID, KVD_ERR_INVALID,
	KVD_ERR_INVALID, KVD_ERR_INVALID, KVD_ERR_INVALID, KVD_ERR_INVALID,
	KVD_ERR_INVALID, KVD_ERR_INVALID, KVD_ERR_AUTH,
};
const struct kvd_err_table kvd_err_frame =
	KVD_ERR_TABLE_FN("frame", FRAME_E_AGAIN, FRAME_E_AUTH, frame_strerror, frame_kinds);

static const uint8_t proto_kinds[N(PROTO_ERR_PROMPT_TOO_LONG, PROTO_ERR_INTERNAL)] = {
	KVD_ERR_TOO_BIG, KVD_ERR_INVALID, KVD_ERR_FULL, KVD_ERR_STATE,
	KVD_ERR_STATE, KVD_ERR_INTEGRITY, KVD_ERR_TIMEOUT, KVD_ERR_SYSTEM,
};
const struct kvd_err_table kvd_err_proto =
	KVD_ERR_TABLE_FN("proto", PROTO_ERR_PROMPT_TOO_LONG, PROTO_ERR_INTERNAL, proto_err_name, proto_kinds);

static const char *const http_names[N(HTTP_WIRE_E_PARSE, HTTP_WIRE_E_UPGRADE)] = {
	"parse", "headers", "body", "version", "upgrade",
};
static const uint8_t http_kinds[N(HTTP_WIRE_E_PARSE, HTTP_WIRE_E_UPGRADE)] = {
	KVD_ERR_INVALID, KVD_ERR_TOO_BIG, KVD_ERR_TOO_BIG, KVD_ERR_UNSUPPORTED,
	KVD_ERR_UNSUPPORTED,
};
const struct kvd_err_table kvd_err_http_wire =
	KVD_ERR_TABLE("http_wire", HTTP_WIRE_E_PARSE, HTTP_WIRE_E_UPGRADE, http_names, http_kinds);

static const uint8_t xfer_kinds[N(XFER_E_AGAIN, XFER_E_AUTH)] = {
	KVD_ERR_AGAIN, KVD_ERR_INVALID, KVD_ERR_UNSUPPORTED, KVD_ERR_TOO_BIG,
	KVD_ERR_INVALID, KVD_ERR_INTEGRITY, KVD_ERR_INTEGRITY, KVD_ERR_FULL,
	KVD_ERR_AUTH,
};
const struct kvd_err_table kvd_err_xfer =
	KVD_ERR_TABLE_FN("xfer", XFER_E_AGAIN, XFER_E_AUTH, xfer_strerror, xfer_kinds);

/* a batch that does not match what decode reserved cannot be trusted,
 * whatever the detail; PENDING is the one code that is not a failure */
static const uint8_t check_kinds[N(XFER_CHECK_E_INDEX_RANGE, XFER_CHECK_E_EXTRA_BATCHES)] = {
	KVD_ERR_INTEGRITY, KVD_ERR_INTEGRITY, KVD_ERR_INTEGRITY,
	KVD_ERR_INTEGRITY, KVD_ERR_INTEGRITY, KVD_ERR_INTEGRITY,
	KVD_ERR_INTEGRITY, KVD_ERR_INTEGRITY,
	[XFER_CHECK_PENDING - 1] = KVD_ERR_AGAIN,
	KVD_ERR_INTEGRITY, KVD_ERR_INTEGRITY, KVD_ERR_INTEGRITY,
	KVD_ERR_INTEGRITY,
};
const struct kvd_err_table kvd_err_xfer_check =
	KVD_ERR_TABLE_FN("xfer_check", XFER_CHECK_E_INDEX_RANGE, XFER_CHECK_E_EXTRA_BATCHES, xfer_check_name, check_kinds);

static const char *const transport_names[N(TRANSPORT_E_BOUND, TRANSPORT_E_CLOSED)] = {
	"bound", "closed",
};
static const uint8_t transport_kinds[N(TRANSPORT_E_BOUND, TRANSPORT_E_CLOSED)] = {
	KVD_ERR_TOO_BIG, KVD_ERR_STATE,
};
const struct kvd_err_table kvd_err_transport =
	KVD_ERR_TABLE("transport", TRANSPORT_E_BOUND, TRANSPORT_E_CLOSED,
		      transport_names, transport_kinds);

static const char *const auth_names[N(PEER_AUTH_E_PROOF, PEER_AUTH_E_SIZE)] = {
	"proof", "open", "size",
};
static const uint8_t auth_kinds[N(PEER_AUTH_E_PROOF, PEER_AUTH_E_SIZE)] = {
	KVD_ERR_AUTH, KVD_ERR_AUTH, KVD_ERR_INVALID,
};
const struct kvd_err_table kvd_err_peer_auth =
	KVD_ERR_TABLE("peer_auth", PEER_AUTH_E_PROOF, PEER_AUTH_E_SIZE, auth_names, auth_kinds);

static const char *const wbound_names[N(WBOUND_E_HARD, WBOUND_E_STALL)] = {
	"hard", "stall",
};
static const uint8_t wbound_kinds[N(WBOUND_E_HARD, WBOUND_E_STALL)] = {
	KVD_ERR_FULL, KVD_ERR_TIMEOUT,
};
const struct kvd_err_table kvd_err_wbound =
	KVD_ERR_TABLE("wbound", WBOUND_E_HARD, WBOUND_E_STALL, wbound_names, wbound_kinds);

static const char *const chapoly_names[1] = { "auth" };
static const uint8_t chapoly_kinds[1] = { KVD_ERR_AUTH };
const struct kvd_err_table kvd_err_chapoly =
	KVD_ERR_TABLE("chapoly", CHAPOLY_E_AUTH, CHAPOLY_E_AUTH, chapoly_names, chapoly_kinds);

const struct kvd_err_table *const kvd_err_net[] = {
	&kvd_err_frame, &kvd_err_proto, &kvd_err_http_wire, &kvd_err_xfer,
	&kvd_err_xfer_check, &kvd_err_transport, &kvd_err_peer_auth,
	&kvd_err_wbound, &kvd_err_chapoly, NULL,
};

int kvd_err_to_proto(enum kvd_err k)
{
	switch (k) {
	case KVD_OK:
		return PROTO_ERR_NONE;
	case KVD_ERR_TOO_BIG:
		return PROTO_ERR_PROMPT_TOO_LONG;
	case KVD_ERR_INVALID:
		return PROTO_ERR_INVALID_REQUEST;
	case KVD_ERR_FULL:
		return PROTO_ERR_OVERLOADED;
	case KVD_ERR_INTEGRITY:
		return PROTO_ERR_INTEGRITY;
	case KVD_ERR_TIMEOUT:
		return PROTO_ERR_TIMEOUT;
	default:
		return PROTO_ERR_INTERNAL;
	}
}
