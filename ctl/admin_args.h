/* admin_args.h - the admin commands' argument schemas, as data.
 *
 * The admin server decodes every command's arguments with exactly
 * frame_map_parse(map, s->fields, s->n, FRAME_SCHEMA_STRICT, {"cmd", "id"},
 * &args, &present, &err) on these schemas (net/wire/frame.h) before a handler
 * runs; tests and fuzz targets run the same tables, not copies. The
 * tables depend on net/wire/frame.h only, so they link without the daemon.
 *
 * Bit i of `present` is field i of the schema; the ADMIN_*_ bit names
 * below are that order, which the handlers rely on.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "net/wire/frame.h"

/* Every argument any command takes; each command's schema picks some. */
struct admin_args {
	bool wait;
	uint64_t timeout_ms;
	uint64_t tokens;
	uint64_t bytes;
	bool force;
	uint64_t request;
	char public_id[48];              /* abort: KVD_PUBLIC_ID_MAX */
	uint64_t count;
	uint64_t hold_ms;
	uint64_t fence_ms;
	char tenant[64];           /* cache.flush: one tenant's entries */
};

/* The commands that take arguments. */
enum admin_args_id {
	ADMIN_ARGS_DRAIN = 0,      /* drain */
	ADMIN_ARGS_RESIZE,         /* pool.resize */
	ADMIN_ARGS_ABORT,          /* abort */
	ADMIN_ARGS_LOAD,           /* fault.load */
	ADMIN_ARGS_CACHE_FLUSH,    /* cache.flush */
	ADMIN_ARGS__N,
};

/* Bits of `present`, per schema. */
enum {
	ADMIN_DRAIN_WAIT = 1u << 0,
	ADMIN_DRAIN_TIMEOUT = 1u << 1,
};
enum {
	ADMIN_ABORT_REQUEST = 1u << 0,
	ADMIN_ABORT_ID = 1u << 1,
};
enum {
	ADMIN_RESIZE_TOKENS = 1u << 0,
	ADMIN_RESIZE_BYTES = 1u << 1,
	ADMIN_RESIZE_FORCE = 1u << 2,
	ADMIN_RESIZE_TIMEOUT = 1u << 3,
};

struct admin_args_schema {
	const char *cmd;                  /* the command's wire name */
	const struct frame_field *fields; /* (n) into struct admin_args */
	size_t n;
};

/* Indexed by enum admin_args_id. */
extern const struct admin_args_schema admin_args_schemas[ADMIN_ARGS__N];
