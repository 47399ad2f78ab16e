/* transport_noverbs.c - the build without libibverbs: no real device
 * (transport_verbs.c still opens the emulated one). */
#include "net/verbs/verbs_ops.h"

#include <stddef.h>

/* No libibverbs: only the emulation (net/verbs/verbs_emu.c) is there. */
const struct verbs_ops *verbs_real_ops(void)
{
	return NULL;
}
