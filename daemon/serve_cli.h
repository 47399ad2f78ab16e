/* serve_cli.h - `kvd serve -m FILE [--host H] [--port P] [--threads N]
 * [--ctx N] [--api-key-file F]`: the config of a standalone node built
 * from these flags and the defaults, through the same key table and
 * checks as an INI file (serve_cli.c says what the flags decide).
 */
#pragma once

#include "conf/config.h"

#define KVD_EX_USAGE 64

/* argv[0] is "serve". 0 with *cfg loaded and checked (the admin socket's
 * directory too); -1 when --help was printed (exit 0); else the exit
 * code, the problem printed: 64 usage, 78 config or model. */
int kvd_serve_config(int argc, char **argv, struct kvd_config *cfg);
