/* wbound.c - bounded write queues (see wbound.h).
 *
 * libuv already keeps the queue and counts its bytes; all this module adds
 * is the decision. The one subtlety is the write callback: it must find
 * the wbound to resume reading, and it may run after the owner closed the
 * stream (status UV_ECANCELED). The owner frees its memory only in the
 * handle's close callback, which libuv runs after every write callback,
 * so the pointer held by the write request stays valid; the callback
 * touches nothing once the handle is closing.
 */
#include "net/wbound.h"
#include "conf/util.h"

#include <errno.h>
#include <stdlib.h>

struct wbound_req {
	uv_write_t req;
	struct wbound *wb;
	char *data;
};

static void wbound_apply(struct wbound *wb)
{
	bool want = wb->want_read && !wb->paused;

	if (want == wb->reading || uv_is_closing((uv_handle_t *)wb->st))
		return;
	if (want) {
		if (uv_read_start(wb->st, wb->alloc_cb, wb->read_cb) == 0)
			wb->reading = true;
	} else {
		uv_read_stop(wb->st);
		wb->reading = false;
	}
}

void wbound_init(struct wbound *wb, uv_stream_t *st,
		 const struct wbound_limits *lim,
		 uv_alloc_cb alloc_cb, uv_read_cb read_cb)
{
	*wb = (struct wbound){ .st = st, .lim = *lim, .alloc_cb = alloc_cb,
			       .read_cb = read_cb };
}

size_t wbound_queued(const struct wbound *wb)
{
	return uv_stream_get_write_queue_size(wb->st);
}

/* Compare the queue with the bounds after it grew or shrank. */
static int wbound_judge(struct wbound *wb)
{
	size_t q = wbound_queued(wb);

	if (q > wb->peak)
		wb->peak = q;
	if (q > wb->lim.hard)
		return WBOUND_E_HARD;
	if (q > wb->lim.soft) {
		if (!wb->over_since_ns)
			wb->over_since_ns = kvd_now_ns();
		if (!wb->paused) {
			wb->paused = true;
			wbound_apply(wb);
		}
	} else if (q <= wb->lim.soft / 2) {
		wb->over_since_ns = 0;
		if (wb->paused) {
			wb->paused = false;
			wbound_apply(wb);
		}
	}
	return 0;
}

static void wbound_write_cb(uv_write_t *req, int status)
{
	struct wbound_req *w = kvd_container_of(req, struct wbound_req, req);
	struct wbound *wb = w->wb;

	free(w->data);
	free(w);
	if (status == UV_ECANCELED || uv_is_closing((uv_handle_t *)wb->st))
		return;
	(void)wbound_judge(wb);   /* shrinking: never past hard */
	if (wb->written)
		wb->written(wb, status);
}

void wbound_on_write(struct wbound *wb,
		     void (*written)(struct wbound *wb, int status))
{
	wb->written = written;
}

int wbound_write(struct wbound *wb, char *data, size_t len)
{
	struct wbound_req *w;
	uv_buf_t buf;
	int rc;

	if (uv_is_closing((uv_handle_t *)wb->st) || !uv_is_writable(wb->st)) {
		free(data);
		return -EPIPE;
	}
	w = malloc(sizeof(*w));
	if (!w) {
		free(data);
		return -ENOMEM;
	}
	w->wb = wb;
	w->data = data;
	buf = uv_buf_init(data, (unsigned)len);
	rc = uv_write(&w->req, wb->st, &buf, 1, wbound_write_cb);
	if (rc) {
		free(data);
		free(w);
		return rc;
	}
	return wbound_judge(wb);
}

int wbound_read_start(struct wbound *wb)
{
	wb->want_read = true;
	if (wb->paused || wb->reading)
		return 0;
	if (uv_is_closing((uv_handle_t *)wb->st))
		return -EPIPE;
	{
		int rc = uv_read_start(wb->st, wb->alloc_cb, wb->read_cb);

		if (rc == 0)
			wb->reading = true;
		return rc;
	}
}

void wbound_read_stop(struct wbound *wb)
{
	wb->want_read = false;
	wbound_apply(wb);
}

int wbound_poll(struct wbound *wb, uint64_t now_ns)
{
	if (uv_is_closing((uv_handle_t *)wb->st))
		return 0;
	if (wbound_judge(wb) == WBOUND_E_HARD)
		return WBOUND_E_HARD;
	if (wb->over_since_ns &&
	    now_ns - wb->over_since_ns >= (uint64_t)wb->lim.stall_ms * 1000000ull)
		return WBOUND_E_STALL;
	return 0;
}
