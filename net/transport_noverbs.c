/* transport_noverbs.c - the verbs transport in a build without ibverbs. */
#include "net/transport.h"
#include "net/verbs_ops.h"

#include <errno.h>
#include <stdio.h>

int transport_verbs_new(struct transport **out, uv_loop_t *loop,
			const struct transport_cfg *cfg, char *why,
			size_t why_size)
{
	(void)loop;
	(void)cfg;
	*out = NULL;
	snprintf(why, why_size, "kvd was built without libibverbs");
	return -ENOTSUP;
}

/* No libibverbs: only the emulation (net/verbs_emu.c) is there. */
const struct verbs_ops *verbs_real_ops(void)
{
	return NULL;
}
