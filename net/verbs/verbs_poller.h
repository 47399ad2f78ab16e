/* verbs_poller.h - a CQ's completions on the libuv loop.
 *
 * Watches the CQ's completion channel fd with a uv_poll_t: when it is
 * readable, the pending events are consumed and acknowledged, the CQ is
 * armed again, and then drained (arming before draining: a completion
 * that arrives meanwhile either is polled now or fires the channel
 * again), each completion handed to on_wc in order. For the emulated
 * device (net/verbs/verbs_emu.h) it also watches the wire fd and pumps the
 * context when packets arrive (wire_fd < 0: a real device, no wire), and
 * pumps again every millisecond while packets wait to leave (a full
 * datagram queue at the far end says nothing when it empties).
 *
 * Loop thread only. verbs_poller_close() stops both watches; closed() is
 * called once both handles are closed, after which the owner may free
 * the poller. If start fails (an error from libuv), closed() never fires
 * and any handle it had opened is closing: keep p until the loop has run
 * once more.
 */
#pragma once

#include <stdbool.h>
#include <uv.h>

#include "net/verbs/verbs_ops.h"

struct verbs_poller {
	uv_poll_t cq_watch;
	uv_poll_t wire_watch;
	uv_timer_t retry;          /* emulated: pump again while packets wait */
	bool has_wire;
	bool closing;
	unsigned open_handles;
	const struct verbs_ops *ops;
	struct verbs_cq *cq;
	struct verbs_ctx *ctx;     /* emulated: pumped when the wire is readable */
	void (*on_wc)(void *arg, const struct verbs_wc *wc);
	void *arg;
	void (*closed)(struct verbs_poller *p);
	uint64_t events, completions;
};

int verbs_poller_start(struct verbs_poller *p, uv_loop_t *loop,
		       const struct verbs_ops *ops, struct verbs_cq *cq,
		       int cq_fd, struct verbs_ctx *ctx, int wire_fd,
		       void (*on_wc)(void *arg, const struct verbs_wc *wc),
		       void *arg);
/* Emulated device: after the owner posted (packets may wait for room in
 * the far end's queue), make sure the loop pumps again while they wait.
 * Nothing for a real device. */
void verbs_poller_kick(struct verbs_poller *p);
void verbs_poller_close(struct verbs_poller *p,
			void (*closed)(struct verbs_poller *p));
