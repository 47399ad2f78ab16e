/* transport_verbs.c - the RDMA (ibverbs) transport: device open and check.
 *
 * Design. Built in every build: it uses the verbs calls only through the
 * ops table (net/verbs_ops.h), so the emulated device (emu:/DIR[,opts],
 * net/verbs_emu.c) works where libibverbs is absent and a real device
 * (any other name, or the first device for an empty name) needs the
 * libibverbs table (verbs_real_ops(): NULL without it).
 *
 * The RDMA data path (issue 13: QPs connected over the control link -
 * net/verbs_rc.h, the pool registered with per-request write scope -
 * net/verbs_scope.h, batches as RDMA WRITEs with their MAC checked by
 * decode) is not wired in yet. Until then the transport opens the
 * configured device and checks the configured terms against it the way
 * the data path will use them - the port is there and active, the GID
 * index is in its table, an RC QP with transfer.verbs_qp_depth send and
 * receive WRs and transfer.verbs_inline inline bytes can be made (the
 * device judges both) - so a node is told at boot which key its device
 * cannot meet. Then it says what the device offers (max_mr_size,
 * max_qp_wr, the write scope: type-2 windows or per-request
 * registrations, the port's MTU) and answers -ENOTSUP: a node configured
 * for verbs refuses to start rather than silently falling back, and it
 * never pretends to transfer.
 *
 * Answers: -ENOTSUP no libibverbs for a real device, or the data path is
 * missing; -ENODEV the device cannot be opened or queried; -EINVAL a
 * configured term the device refuses (why names the key).
 */
#include "net/transport.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "net/verbs_ops.h"
#include "net/verbs_rc.h"
#include "net/verbs_scope.h"

/* Make the QP the data path would make, with the configured terms. */
static int verbs_check_terms(const struct verbs_ops *v, struct verbs_ctx *ctx,
			     const struct transport_cfg *cfg,
			     const struct verbs_dev_attr *a,
			     struct verbs_rc *rc, char *why, size_t why_size)
{
	struct verbs_qp_caps caps = { .max_send_wr = cfg->verbs_qp_depth,
				      .max_recv_wr = cfg->verbs_qp_depth,
				      .max_inline = cfg->verbs_inline };
	struct verbs_port_attr pa;
	struct verbs_pd *pd = NULL;
	int r;

	if (cfg->verbs_qp_depth > a->max_qp_wr) {
		snprintf(why, why_size,
			 "transfer.verbs_qp_depth=%u is above the device's max_qp_wr=%u",
			 cfg->verbs_qp_depth, a->max_qp_wr);
		return -EINVAL;
	}
	if (cfg->verbs_port == 0 || cfg->verbs_port > a->phys_port_cnt ||
	    v->query_port(ctx, (uint8_t)cfg->verbs_port, &pa) < 0) {
		snprintf(why, why_size,
			 "transfer.verbs_port=%u: the device has no such port (%u port%s)",
			 cfg->verbs_port, a->phys_port_cnt,
			 a->phys_port_cnt == 1 ? "" : "s");
		return -EINVAL;
	}
	if (!pa.active) {
		snprintf(why, why_size, "transfer.verbs_port=%u is not active",
			 cfg->verbs_port);
		return -EINVAL;
	}
	if (cfg->verbs_gid_index >= pa.gid_tbl_len) {
		snprintf(why, why_size,
			 "transfer.verbs_gid_index=%u is outside the port's GID table (%u entr%s)",
			 cfg->verbs_gid_index, pa.gid_tbl_len,
			 pa.gid_tbl_len == 1 ? "y" : "ies");
		return -EINVAL;
	}
	r = v->alloc_pd(ctx, &pd);
	if (r < 0) {
		snprintf(why, why_size, "cannot allocate a protection domain (%s)",
			 strerror(-r));
		return -ENODEV;
	}
	r = verbs_rc_open(rc, v, ctx, pd, (uint8_t)cfg->verbs_port,
			  (int)cfg->verbs_gid_index, &caps,
			  2 * cfg->verbs_qp_depth);
	if (r != 0) {
		verbs_rc_close(rc);
		v->dealloc_pd(pd);
		snprintf(why, why_size,
			 "the device refuses an RC queue pair with transfer.verbs_qp_depth=%u and transfer.verbs_inline=%u on port %u, GID index %u (%s)",
			 cfg->verbs_qp_depth, cfg->verbs_inline, cfg->verbs_port,
			 cfg->verbs_gid_index,
			 r < 0 ? strerror(-r) : "port not active");
		return -EINVAL;
	}
	verbs_rc_close(rc);
	v->dealloc_pd(pd);
	return 0;
}

int transport_verbs_new(struct transport **out, uv_loop_t *loop,
			const struct transport_cfg *cfg, char *why,
			size_t why_size)
{
	const char *dev = cfg->verbs_device ? cfg->verbs_device : "";
	bool emu = !strncmp(dev, "emu:", 4);
	const struct verbs_ops *v = emu ? verbs_emu_ops() : verbs_real_ops();
	struct verbs_ctx *ctx = NULL;
	struct verbs_dev_attr a;
	struct verbs_rc rc;
	int r;

	(void)loop;
	*out = NULL;
	if (!v) {
		snprintf(why, why_size,
			 "kvd was built without libibverbs (only the emulated device emu:/DIR is available)");
		return -ENOTSUP;
	}
	r = v->open(dev[0] ? dev : NULL, &ctx);
	if (r < 0) {
		if (emu)
			snprintf(why, why_size,
				 "cannot open the emulated RDMA device (%s): check emu:/DIR[,opts] (net/verbs_emu.h)",
				 strerror(-r));
		else if (dev[0])
			snprintf(why, why_size, "cannot open RDMA device '%.64s' (%s)",
				 dev, strerror(-r));
		else
			snprintf(why, why_size, "no RDMA device (%s)", strerror(-r));
		return -ENODEV;
	}
	r = v->query_device(ctx, &a);
	if (r < 0) {
		v->close(ctx);
		snprintf(why, why_size, "RDMA device query failed (%s)", strerror(-r));
		return -ENODEV;
	}
	r = verbs_check_terms(v, ctx, cfg, &a, &rc, why, why_size);
	v->close(ctx);
	if (r < 0)
		return r;
	snprintf(why, why_size,
		 "an RDMA device was found (%s, max_mr_size %llu, max_qp_wr %u, write scope %s, port %u mtu %u), but the verbs data path is not implemented yet",
		 emu ? "emulated" : "ibverbs",
		 (unsigned long long)a.max_mr_size, a.max_qp_wr,
		 verbs_scope_mode_name(a.mw_type2 ? VERBS_SCOPE_WINDOWS : VERBS_SCOPE_MR),
		 cfg->verbs_port, rc.port_attr.active_mtu);
	return -ENOTSUP;
}
