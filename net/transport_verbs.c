/* transport_verbs.c - the RDMA (ibverbs) transport: device probe only.
 *
 * Design. This file is built only when libibverbs is found. The RDMA data
 * path (issue 13: QPs connected over the control link - net/verbs_rc.h,
 * the pool registered with per-request write scope - net/verbs_scope.h,
 * batches as RDMA WRITEs with their MAC checked by decode) is not wired in
 * yet. Until then the transport must say clearly why it cannot run and
 * must never pretend to transfer. It probes through the ops table
 * (net/verbs_ops.h): with no device (ibv_get_device_list fails with
 * ENOSYS where the kernel has no RDMA support, or the list is empty) it
 * answers -ENODEV "no RDMA device"; with a device it says what the device
 * offers (max_mr_size, and the write scope it would get: type-2 memory
 * windows or per-request registrations) and answers -ENOTSUP, so a node
 * configured for verbs refuses to start rather than silently falling back.
 */
#include "net/transport.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "net/verbs_ops.h"
#include "net/verbs_scope.h"

int transport_verbs_new(struct transport **out, uv_loop_t *loop,
			const struct transport_cfg *cfg, char *why,
			size_t why_size)
{
	const struct verbs_ops *v = verbs_real_ops();
	struct verbs_ctx *ctx = NULL;
	struct verbs_dev_attr a;
	int r;

	(void)loop;
	(void)cfg;
	*out = NULL;
	r = v->open(NULL, &ctx);
	if (r < 0) {
		snprintf(why, why_size, "no RDMA device (%s)", strerror(-r));
		return -ENODEV;
	}
	r = v->query_device(ctx, &a);
	v->close(ctx);
	if (r < 0) {
		snprintf(why, why_size, "RDMA device query failed (%s)", strerror(-r));
		return -ENODEV;
	}
	snprintf(why, why_size,
		 "an RDMA device was found (max_mr_size %llu, write scope %s), but the verbs data path is not implemented yet",
		 (unsigned long long)a.max_mr_size,
		 verbs_scope_mode_name(a.mw_type2 ? VERBS_SCOPE_WINDOWS : VERBS_SCOPE_MR));
	return -ENOTSUP;
}
