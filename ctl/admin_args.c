/* admin_args.c - the admin commands' argument schemas (admin_args.h).
 *
 * One table per command that takes arguments; the server checks a
 * command's table (types, ranges, required keys, nothing unknown) before
 * its handler in admin_cmds.c runs, so handlers read typed values.
 */
#include "ctl/admin_args.h"

#include "conf/util.h"

#define ARG(name, type, req, field, lo, hi) \
	{ name, type, req, offsetof(struct admin_args, field), 0, lo, hi }

/* Field order is the bit order of `present` (ADMIN_DRAIN_*). */
static const struct frame_field drain_args[] = {
	ARG("wait", FRAME_T_BOOL, false, wait, 0, 0),
	ARG("timeout_ms", FRAME_T_U64, false, timeout_ms, 0, 86400000),
};
/* Field order is the bit order of `present` (ADMIN_RESIZE_*). */
static const struct frame_field resize_args[] = {
	ARG("tokens", FRAME_T_U64, false, tokens, 1, UINT64_MAX),
	ARG("bytes", FRAME_T_U64, false, bytes, 1, UINT64_MAX),
	ARG("force", FRAME_T_BOOL, false, force, 0, 0),
	ARG("timeout_ms", FRAME_T_U64, false, timeout_ms, 0, 3600000),
};
/* Exactly one of the two (ADMIN_ABORT_*): the registry's id, or the id
 * the client was given ("cmpl-..."; not "id": the envelope's call id). */
static const struct frame_field abort_args[] = {
	ARG("request", FRAME_T_U64, false, request, 1, UINT64_MAX),
	{ "public_id", FRAME_T_STR, false, offsetof(struct admin_args, public_id),
	  sizeof(((struct admin_args *)0)->public_id), 0, 0 },
};
static const struct frame_field load_args[] = {
	ARG("count", FRAME_T_U64, true, count, 1, 100000),
	ARG("tokens", FRAME_T_U64, true, tokens, 1, 1u << 24),
	ARG("hold_ms", FRAME_T_U64, true, hold_ms, 0, 600000),
	ARG("fence_ms", FRAME_T_U64, false, fence_ms, 0, 600000),
};

static const struct frame_field cache_flush_args[] = {
	{ "tenant", FRAME_T_STR, false, offsetof(struct admin_args, tenant),
	  sizeof(((struct admin_args *)0)->tenant), 0, 0 },
};

#undef ARG

const struct admin_args_schema admin_args_schemas[ADMIN_ARGS__N] = {
	[ADMIN_ARGS_DRAIN] = { "drain", drain_args, KVD_ARRAY_SIZE(drain_args) },
	[ADMIN_ARGS_RESIZE] = { "pool.resize", resize_args,
				KVD_ARRAY_SIZE(resize_args) },
	[ADMIN_ARGS_ABORT] = { "abort", abort_args, KVD_ARRAY_SIZE(abort_args) },
	[ADMIN_ARGS_LOAD] = { "fault.load", load_args,
			      KVD_ARRAY_SIZE(load_args) },
	[ADMIN_ARGS_CACHE_FLUSH] = { "cache.flush", cache_flush_args,
				     KVD_ARRAY_SIZE(cache_flush_args) },
};
