/* verbs_rc.c - one RC queue pair, described and connected over the
 * control link.
 *
 * Design. The QP goes to INIT with remote write allowed as soon as it is
 * made (decode's windows are bound on it, prefill's writes leave from it)
 * and waits there for the peer's verbs_qp. The peer is trusted with
 * nothing the device does not check: the parser bounded every number; we
 * refuse an MTU that is not a power of two (the wire enum has no other
 * value) and use the smaller of both sides' MTUs, so a peer cannot make
 * us send packets its path cannot carry or ours cannot. The PSN is random
 * per QP, so a stale packet of an earlier QP with the same number is not
 * taken for a fresh one.
 */
#include "net/verbs/verbs_rc.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>

#include "conf/util.h"
#include "net/wire/names.h"

void verbs_rc_close(struct verbs_rc *rc)
{
	if (rc->qp)
		rc->ops->destroy_qp(rc->qp);
	rc->qp = NULL;
	if (rc->cq)
		rc->ops->destroy_cq(rc->cq);
	rc->cq = NULL;
	rc->connected = false;
}

int verbs_rc_open(struct verbs_rc *rc, const struct verbs_ops *ops,
		  struct verbs_ctx *ctx, struct verbs_pd *pd, uint8_t port,
		  int gid_index, const struct verbs_qp_caps *caps,
		  uint32_t cq_depth)
{
	int r;

	memset(rc, 0, sizeof(*rc));
	rc->ops = ops;
	rc->port = port;
	rc->gid_index = gid_index;
	rc->cq_fd = -1;
	r = ops->query_port(ctx, port, &rc->port_attr);
	if (r)
		return r;
	if (!rc->port_attr.active)
		return VERBS_RC_E_PORT;
	r = ops->query_gid(ctx, port, gid_index, &rc->gid);
	if (r)
		return r;
	if (getrandom(&rc->psn, sizeof(rc->psn), 0) != sizeof(rc->psn))
		return -errno;
	rc->psn &= 0xffffff;
	r = ops->create_cq(ctx, cq_depth, &rc->cq, &rc->cq_fd);
	if (r) {
		rc->cq = NULL;
		return r;
	}
	rc->caps = *caps;
	r = ops->create_qp(pd, rc->cq, rc->cq, &rc->caps, &rc->qp, &rc->qpn);
	if (r) {
		rc->qp = NULL;
		goto fail;
	}
	r = ops->qp_init(rc->qp, port, VERBS_ACCESS_REMOTE_WRITE);
	if (r)
		goto fail;
	return 0;
fail:
	verbs_rc_close(rc);
	return r;
}

void verbs_rc_describe(const struct verbs_rc *rc, struct proto_peer_verbs_qp *out)
{
	memset(out, 0, sizeof(*out));
	out->qpn = rc->qpn;
	out->psn = rc->psn;
	out->lid = rc->port_attr.lid;
	out->mtu = rc->port_attr.active_mtu;
	memcpy(out->gid, rc->gid.raw, sizeof(out->gid));
}

int verbs_rc_connect(struct verbs_rc *rc, const struct proto_peer_verbs_qp *peer,
		     char *why, size_t why_size)
{
	struct verbs_qp_dest d = { 0 };
	int r;

	if (rc->connected || !rc->qp) {
		snprintf(why, why_size, "the queue pair is connected already");
		return VERBS_RC_E_STATE;
	}
	if (peer->mtu < 256 || peer->mtu > 4096 || (peer->mtu & (peer->mtu - 1))) {
		snprintf(why, why_size, "the peer's mtu %u is not 256, 512, 1024, 2048 or 4096",
			 peer->mtu);
		return VERBS_RC_E_PEER;
	}
	if (peer->qpn == 0 || peer->qpn > 0xffffff || peer->psn > 0xffffff ||
	    peer->lid > 0xffff) {
		snprintf(why, why_size, "the peer's qpn, psn or lid is out of range");
		return VERBS_RC_E_PEER;
	}
	d.qpn = peer->qpn;
	d.psn = peer->psn;
	d.lid = (uint16_t)peer->lid;
	d.mtu = KVD_MIN(peer->mtu, rc->port_attr.active_mtu);
	memcpy(d.gid.raw, peer->gid, sizeof(d.gid.raw));
	r = rc->ops->qp_rtr(rc->qp, rc->port, rc->gid_index, &d);
	if (r == -EINVAL) {
		snprintf(why, why_size, "the device refused the peer's address (gid, lid or mtu)");
		return VERBS_RC_E_PEER;
	}
	if (r)
		return r;
	r = rc->ops->qp_rts(rc->qp, rc->psn);
	if (r)
		return r;
	rc->path_mtu = d.mtu;
	rc->connected = true;
	return 0;
}

/* The name of a completion status, for log lines (net/verbs/verbs_ops.h). */
static const char *const wc_names[VERBS_WC__COUNT] = {
	[VERBS_WC_SUCCESS] = "success",
	[VERBS_WC_LOC_LEN_ERR] = "local_length_error",
	[VERBS_WC_LOC_PROT_ERR] = "local_protection_error",
	[VERBS_WC_WR_FLUSH_ERR] = "flushed",
	[VERBS_WC_REM_ACCESS_ERR] = "remote_access_error",
	[VERBS_WC_REM_OP_ERR] = "remote_operation_error",
	[VERBS_WC_RETRY_EXC_ERR] = "retry_exceeded",
	[VERBS_WC_RNR_RETRY_EXC_ERR] = "rnr_retry_exceeded",
	[VERBS_WC_MW_BIND_ERR] = "mw_bind_error",
	[VERBS_WC_GENERAL_ERR] = "general_error",
};

const char *verbs_wc_status_name(enum verbs_wc_status s)
{
	return NET_NAME(wc_names, (int)s);
}
