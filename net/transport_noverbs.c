/* transport_noverbs.c - the verbs transport in a build without ibverbs. */
#include "net/transport.h"

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
