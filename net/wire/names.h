/* names.h - the name of a code, from a module's table of names.
 *
 * Each net/ module keeps its codes' names in a table indexed by code
 * (designated initializers, so a gap stays NULL). This is the one lookup
 * they share: the name, or "?" for a code outside the table or a gap.
 */
#pragma once

#include <stddef.h>

#include "conf/util.h"

static inline const char *net__name(const char *const *names, size_t n,
				    int code)
{
	if (code < 0 || (size_t)code >= n || !names[code])
		return "?";
	return names[code];
}

/* NET_NAME(table, code) for a table declared as an array here. */
#define NET_NAME(names, code) net__name(names, KVD_ARRAY_SIZE(names), code)
