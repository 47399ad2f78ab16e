/* verbs_poller.c - a CQ's completions on the libuv loop.
 *
 * Design. ibverbs reports completions in two steps: the completion
 * channel's fd becomes readable once after the CQ was armed and a
 * completion arrived, and the completions themselves are polled. The
 * order below is the one that loses nothing: consume and acknowledge the
 * events, arm, then poll until the CQ is empty. Arming before the drain
 * means a completion that lands between the last poll and the next
 * readiness either is polled in this round or fires the channel again.
 * The drain is bounded by the CQ's depth (completions cannot be more than
 * the work requests posted, which the owner bounds). A poll error (an
 * overflowed CQ) is handed on as a completion with VERBS_WC_GENERAL_ERR
 * and wr_id 0: the owner must tear the queue pair down.
 */
#include "net/verbs/verbs_poller.h"

#include <errno.h>
#include <string.h>

#include "net/verbs/verbs_emu.h"

static void poller_drain(struct verbs_poller *p)
{
	struct verbs_wc wc[16];
	int n;

	while (p->ops->get_cq_event(p->cq) == 0)
		p->events++;
	p->ops->req_notify(p->cq);
	do {
		n = p->ops->poll_cq(p->cq, 16, wc);
		if (n < 0) {
			struct verbs_wc bad = { .status = VERBS_WC_GENERAL_ERR };

			p->on_wc(p->arg, &bad);
			return;
		}
		for (int i = 0; i < n; i++) {
			p->completions++;
			p->on_wc(p->arg, &wc[i]);
		}
	} while (n == 16);
}

static void cq_ready(uv_poll_t *h, int status, int events)
{
	struct verbs_poller *p = h->data;

	(void)events;
	(void)status;   /* an error on an eventfd/channel: drain anyway */
	poller_drain(p);
}

#define RETRY_MS 1

static void retry_cb(uv_timer_t *t)
{
	struct verbs_poller *p = t->data;

	verbs_emu_pump(p->ctx);
	poller_drain(p);
	verbs_poller_kick(p);
}

void verbs_poller_kick(struct verbs_poller *p)
{
	if (p->has_wire && !p->closing && verbs_emu_out_pending(p->ctx) &&
	    !uv_is_active((uv_handle_t *)&p->retry))
		uv_timer_start(&p->retry, retry_cb, RETRY_MS, 0);
}

static void wire_ready(uv_poll_t *h, int status, int events)
{
	struct verbs_poller *p = h->data;

	(void)events;
	(void)status;
	verbs_emu_pump(p->ctx);
	/* the completions the pump made (its eventfd fires too) are taken
	 * now, in the same turn as the delivery: a receiver reposts a
	 * consumed receive before the sender can have seen the ack */
	poller_drain(p);
	verbs_poller_kick(p);
}

int verbs_poller_start(struct verbs_poller *p, uv_loop_t *loop,
		       const struct verbs_ops *ops, struct verbs_cq *cq,
		       int cq_fd, struct verbs_ctx *ctx, int wire_fd,
		       void (*on_wc)(void *arg, const struct verbs_wc *wc),
		       void *arg)
{
	int r;

	memset(p, 0, sizeof(*p));
	p->ops = ops;
	p->cq = cq;
	p->ctx = ctx;
	p->on_wc = on_wc;
	p->arg = arg;
	r = uv_poll_init(loop, &p->cq_watch, cq_fd);
	if (r)
		return r;
	p->cq_watch.data = p;
	p->open_handles = 1;
	if (wire_fd >= 0) {
		r = uv_poll_init(loop, &p->wire_watch, wire_fd);
		if (r)
			goto fail;
		p->wire_watch.data = p;
		p->has_wire = true;
		p->open_handles++;
		uv_timer_init(loop, &p->retry);
		p->retry.data = p;
		p->open_handles++;
		r = uv_poll_start(&p->wire_watch, UV_READABLE, wire_ready);
		if (r)
			goto fail;
	}
	r = uv_poll_start(&p->cq_watch, UV_READABLE, cq_ready);
	if (r)
		goto fail;
	/* arm, and take what is there already */
	poller_drain(p);
	return 0;
fail:
	/* closing handles needs the loop to run; a failed start is rare
	 * (uv_poll_init on a bad fd): close them, the owner must keep p
	 * alive until the loop has run once */
	uv_close((uv_handle_t *)&p->cq_watch, NULL);
	if (p->has_wire) {
		uv_close((uv_handle_t *)&p->wire_watch, NULL);
		uv_close((uv_handle_t *)&p->retry, NULL);
	}
	return r;
}

static void poller_closed(uv_handle_t *h)
{
	struct verbs_poller *p = h->data;

	if (--p->open_handles == 0 && p->closed)
		p->closed(p);
}

void verbs_poller_close(struct verbs_poller *p,
			void (*closed)(struct verbs_poller *p))
{
	p->closed = closed;
	p->closing = true;
	uv_close((uv_handle_t *)&p->cq_watch, poller_closed);
	if (p->has_wire) {
		uv_close((uv_handle_t *)&p->wire_watch, poller_closed);
		uv_close((uv_handle_t *)&p->retry, poller_closed);
	}
}
