/* verbs_rc.h - one RC queue pair to a peer, connected from a verbs_qp.
 *
 * The glue between the ops table (net/verbs/verbs_ops.h) and the exchange on
 * the control link (net/wire/proto_peer.h PEER_MSG_VERBS_QP): make a CQ with
 * its completion channel and an RC QP (INIT, remote write allowed),
 * describe it for the peer, and take the peer's description to RTR and
 * RTS. The peer's description has been parsed (bounded) already; what only
 * the device can judge (an MTU that is not a power of two, a GID from
 * another fabric) is refused here with a sentence, and the QP stays
 * unconnected.
 *
 * Errors: negative errno from the device; VERBS_RC_E_* for a description
 * this side cannot use. One thread (the loop) uses it.
 */
#pragma once

#include <stddef.h>

#include "net/wire/proto_peer.h"
#include "net/verbs/verbs_ops.h"

enum {
	VERBS_RC_E_PEER = 1,   /* the peer's verbs_qp cannot be used */
	VERBS_RC_E_STATE,      /* connect twice, or on a QP in error */
	VERBS_RC_E_PORT,       /* our port is not active */
};

struct verbs_rc {
	const struct verbs_ops *ops;
	struct verbs_cq *cq;       /* send and receive completions */
	int cq_fd;                 /* its completion channel (non-blocking) */
	struct verbs_qp *qp;
	struct verbs_qp_caps caps; /* what the device granted (>= wanted) */
	uint32_t qpn;
	uint32_t psn;              /* our first send PSN (random, 24 bits) */
	uint8_t port;
	int gid_index;
	struct verbs_port_attr port_attr;
	struct verbs_gid gid;
	uint32_t path_mtu;         /* after connect: min of both sides */
	bool connected;
};

int verbs_rc_open(struct verbs_rc *rc, const struct verbs_ops *ops,
		  struct verbs_ctx *ctx, struct verbs_pd *pd, uint8_t port,
		  int gid_index, const struct verbs_qp_caps *caps,
		  uint32_t cq_depth);
/* Our side, for a verbs_qp message. */
void verbs_rc_describe(const struct verbs_rc *rc, struct proto_peer_verbs_qp *out);
/* RTR to the peer, then RTS. why: a sentence on VERBS_RC_E_*. */
int verbs_rc_connect(struct verbs_rc *rc, const struct proto_peer_verbs_qp *peer,
		     char *why, size_t why_size);
/* Destroy the QP and the CQ (safe twice). */
void verbs_rc_close(struct verbs_rc *rc);
