/* verbs_emu_none.c - a build without the emulated RDMA device
 * (-Dverbs_emu=false, what release builds are): there is no emu: device
 * to open, so none of its test controls can be reached; each answers as
 * "not here". transport_verbs.c refuses emu:DIR with a config error.
 */
#include "net/verbs/verbs_emu.h"
#include "net/verbs/verbs_ops.h"

#include <errno.h>
#include <string.h>

const struct verbs_ops *verbs_emu_ops(void)
{
	return NULL;
}

int verbs_emu_pump(struct verbs_ctx *ctx)
{
	(void)ctx;
	return -ENOTSUP;
}

int verbs_emu_deliver(struct verbs_ctx *ctx, unsigned n)
{
	(void)ctx;
	(void)n;
	return -ENOTSUP;
}

unsigned verbs_emu_arrived(struct verbs_ctx *ctx)
{
	(void)ctx;
	return 0;
}

int verbs_emu_inject(struct verbs_qp *qp, enum verbs_wc_status status)
{
	(void)qp;
	(void)status;
	return -ENOTSUP;
}

bool verbs_emu_out_pending(struct verbs_ctx *ctx)
{
	(void)ctx;
	return false;
}

int verbs_emu_wire_fd(struct verbs_ctx *ctx)
{
	(void)ctx;
	return -1;
}

void verbs_emu_stats(struct verbs_ctx *ctx, struct verbs_emu_stats *out)
{
	(void)ctx;
	memset(out, 0, sizeof(*out));
}
