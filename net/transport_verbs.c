/* transport_verbs.c - the RDMA (ibverbs) transport: device probe only.
 *
 * Design. This file is built only when libibverbs is found. The RDMA data
 * path (registering the pool's chunks, RDMA WRITE of each batch's pages,
 * completions reported per batch on the control connection) is a later
 * issue. Until then the transport must say clearly why it cannot run and
 * must never pretend to transfer: with no device (ibv_get_device_list
 * returns NULL with errno ENOSYS where the kernel has no RDMA support, or
 * an empty list) it answers -ENODEV "no RDMA device"; with a
 * device it answers -ENOTSUP, so a node configured for verbs refuses to
 * start rather than silently falling back.
 */
#include "net/transport.h"

#include <errno.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <string.h>

int transport_verbs_new(struct transport **out, uv_loop_t *loop,
			const struct transport_cfg *cfg, char *why,
			size_t why_size)
{
	struct ibv_device **list;
	int n = 0, err;

	(void)loop;
	(void)cfg;
	*out = NULL;
	errno = 0;
	list = ibv_get_device_list(&n);
	if (!list) {
		err = errno;
		snprintf(why, why_size, "no RDMA device (ibv_get_device_list: %s)",
			 err ? strerror(err) : "no list");
		return -ENODEV;
	}
	ibv_free_device_list(list);
	if (n == 0) {
		snprintf(why, why_size, "no RDMA device");
		return -ENODEV;
	}
	snprintf(why, why_size,
		 "%d RDMA device(s) found, but the verbs data path is not implemented yet",
		 n);
	return -ENOTSUP;
}
