/* fpcheck.h - the model's full SHA-256, verified off the loop after a
 * start that took its fingerprint from the cache (issue 22 item 2).
 *
 * A cache hit (conf/fingerprint.h) checked the file's metadata and a
 * sample of its bytes, not all of them. fpcheck hashes all of them on a
 * thread of its own, at the lowest CPU priority, reading the bytes the
 * node serves (the model's mapping), and reports on the loop.
 *
 * Ownership: `data` must stay mapped until fpcheck_stop() returns. The
 * done callback runs once on the loop thread, unless fpcheck_stop() came
 * first (then never). Loop thread only.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "conf/sha256.h"

struct fpcheck;

/* match: the digest of data equals want_hex; actual_hex: that digest. */
typedef void (*fpcheck_done_fn)(void *arg, bool match, const char *actual_hex,
				uint64_t bytes, double ms);

/* Start hashing data[0, size). 0, or a negative errno with nothing held
 * (no thread, no handle). */
int fpcheck_start(struct fpcheck **out, uv_loop_t *loop, const void *data,
		  size_t size, const char *want_hex, fpcheck_done_fn done,
		  void *arg);
/* Stop: the thread quits at its next chunk and is joined, the handle is
 * closed (memory freed in its close callback). Safe with NULL; may be
 * called from the done callback. */
void fpcheck_stop(struct fpcheck *f);
