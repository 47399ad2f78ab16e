/* wbound.h - a bounded write queue for one stream (client, peer control,
 * admin): the one place where kvd decides how much it will buffer for a
 * reader that does not read (invariant 11: no peer or client holds memory
 * beyond a bound).
 *
 * Every frame kvd writes to such a stream goes through wbound_write().
 * After each write the bytes still queued in libuv
 * (uv_stream_get_write_queue_size) are compared with the limits:
 *   - past `soft`: kvd stops reading from the stream (a client that does
 *     not read its answers cannot make us produce more), and notes when;
 *   - past `hard`: wbound_write returns WBOUND_E_HARD - the owner closes;
 *   - past `soft` for `stall_ms`: wbound_poll() returns WBOUND_E_STALL -
 *     the owner closes (owners poll from a periodic timer they already
 *     have, so the bound costs no handle per connection).
 * Reading resumes by itself once the queue drains to soft / 2.
 *
 * The owner starts and stops reading through wbound_read_start/stop
 * (its wish); the stream reads only while the owner wants it and the
 * queue is under the bound.
 *
 * Lifetime: embedded in the connection's owner and initialised after the
 * stream handle. Write callbacks may run after the owner closed the
 * handle (libuv cancels them with UV_ECANCELED before the close
 * callback), so the owner frees the wbound only in the handle's close
 * callback, as it frees the handle. Loop thread only.
 *
 * Errors: 0; positive WBOUND_E_*; negative errno (-EPIPE: the stream is
 * closing; -ENOMEM; libuv's codes).
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

enum {
	WBOUND_E_HARD = 1,   /* queue past the hard bound: close the stream */
	WBOUND_E_STALL,      /* queue past soft for stall_ms: close it */
};

struct wbound_limits {
	uint64_t soft;       /* bytes: stop reading past this */
	uint64_t hard;       /* bytes: close past this */
	uint32_t stall_ms;   /* past soft this long: close */
};

struct wbound {
	uv_stream_t *st;
	struct wbound_limits lim;
	uv_alloc_cb alloc_cb;
	uv_read_cb read_cb;
	bool want_read;      /* the owner's wish */
	bool reading;        /* uv_read_start in force */
	bool paused;         /* over soft: reading held back */
	uint64_t over_since_ns; /* when the queue went past soft; 0 = under */
	uint64_t peak;       /* largest queue seen (bytes), for status/tests */
	/* optional: after each write completed (status 0 or a libuv error),
	 * never once the stream is closing; set with wbound_on_write */
	void (*written)(struct wbound *wb, int status);
};

void wbound_init(struct wbound *wb, uv_stream_t *st,
		 const struct wbound_limits *lim,
		 uv_alloc_cb alloc_cb, uv_read_cb read_cb);

/* Queue `data` (malloc'd, consumed in every case: freed after the write
 * or on error). 0, WBOUND_E_HARD (the data was queued; close now),
 * -EPIPE, -ENOMEM or a libuv error. */
int wbound_write(struct wbound *wb, char *data, size_t len);

/* Be told when each write completes (an owner that must close after its
 * last reply, or resume work it held back while the queue was high). */
void wbound_on_write(struct wbound *wb,
		     void (*written)(struct wbound *wb, int status));

int wbound_read_start(struct wbound *wb);
void wbound_read_stop(struct wbound *wb);

/* Periodic check: 0 or WBOUND_E_STALL. */
int wbound_poll(struct wbound *wb, uint64_t now_ns);

/* Bytes queued and not yet handed to the kernel. */
size_t wbound_queued(const struct wbound *wb);
