/* link.c - what both ends of a peer link share: framing and sealing a
 * control frame, the bounded control write queue and its heartbeat
 * check, feeding read bytes through the frame decoder, and the paired
 * peers' figures for the capacity line.
 *
 * Calls only io.c among the serving files; decode.c (the connecting end)
 * and prefill.c (the accepting end) build on it.
 */
#include "daemon/serve_int.h"
#include "conf/util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int serve__peer_frame(struct peer_aead *tx, const struct proto_peer_msg *m,
		      char **data, size_t *len)
{
	int r = proto_peer_frame(m, data, len);

	if (r)
		return r > 0 ? -EMSGSIZE : r;
	if (tx) {
		r = peer_frame_seal(tx, data, len);
		if (r) {
			free(*data);
			*data = NULL;
			return r;
		}
	}
	return 0;
}

void serve__figures_add(struct kvd_peer_figures *pf,
			const struct proto_peer_hello *h)
{
	pf->min_pool_tokens = pf->up ? KVD_MIN(pf->min_pool_tokens, h->pool_tokens)
				     : h->pool_tokens;
	pf->min_context = pf->up ? KVD_MIN(pf->min_context, (uint32_t)h->context)
				 : (uint32_t)h->context;
	pf->up++;
}

int serve__link_send(struct wbound *wb, bool *dead, struct peer_aead *tx,
		     const struct proto_peer_msg *m)
{
	char *data;
	size_t len;
	int rc;

	if (*dead)
		return -EPIPE;
	rc = serve__peer_frame(tx, m, &data, &len);
	if (rc)
		return rc;
	rc = wbound_write(wb, data, len);
	if (rc == WBOUND_E_HARD) {
		*dead = true;
		wbound_read_stop(wb);
		return -EPIPE;
	}
	return rc;
}

const char *serve__link_write_poll(struct serve *s, struct wbound *wb, bool dead,
				   uint64_t now, uint64_t *last_heard_ns,
				   const char *who)
{
	int rc = dead ? WBOUND_E_HARD : wbound_poll(wb, now);

	if (!rc) {
		/* not reading it (past soft): its silence is ours, and the
		 * stall bound, not liveness, decides how long it may last */
		if (wb->paused)
			*last_heard_ns = now;
		return NULL;
	}
	KVLOG_WARN(s->log, "write_bound",
		   "peer=%s conn=peer_control reason=%s queued=%zu peak=%llu soft=%llu hard=%llu stall_ms=%u",
		   KVLOG_Q(who), rc == WBOUND_E_HARD ? "hard" : "stall",
		   wbound_queued(wb), (unsigned long long)wb->peak,
		   (unsigned long long)wb->lim.soft,
		   (unsigned long long)wb->lim.hard, wb->lim.stall_ms);
	return rc == WBOUND_E_HARD ? "control write queue past its hard bound" :
				     "control write queue stalled past its soft bound";
}

int serve__send_peer(uv_stream_t *st, struct peer_aead *tx,
		     const struct proto_peer_msg *m)
{
	char *data;
	size_t len;
	int r;

	if (uv_is_closing((uv_handle_t *)st))
		return -EPIPE;   /* never spend a counter on a dead link */
	r = serve__peer_frame(tx, m, &data, &len);
	if (r)
		return r;
	return serve__write(st, data, len);
}

const char *serve__peer_feed(struct serve *s, const char *who,
			     struct frame_decoder *dec, const char *q, size_t n,
			     const bool *closing,
			     void (*on_msg)(void *arg, struct proto_peer_msg *m),
			     void *arg)
{
	while (n > 0 && !*closing) {
		size_t used;
		int rc = frame_decoder_feed(dec, q, n, &used);

		if (rc)
			return "control stream error";
		q += used;
		n -= used;
		for (;;) {
			const msgpack_object *map;
			struct proto_peer_msg m;
			struct frame_error err = { 0 };

			rc = frame_decoder_next(dec, &map);
			if (rc == FRAME_E_AGAIN)
				break;
			if (rc == 0)
				rc = proto_peer_parse(map, &m, &err);
			if (rc) {
				KVLOG_ERR(s->log, "peer_protocol", "peer=%s code=%s msg=%s",
					  KVLOG_Q(who), frame_strerror(rc),
					  KVLOG_Q(err.msg));
				return "protocol error";
			}
			on_msg(arg, &m);
			proto_peer_msg_deinit(&m);
			if (*closing)
				return NULL;
		}
	}
	return NULL;
}
