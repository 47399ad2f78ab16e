/* io.c - loop I/O helpers the serving files share: queue a write,
 * refuse a connection at accept without leaving it unaccepted, close a
 * handle counted against the serving layer's teardown, parse host:port.
 *
 * The bottom of daemon/'s serving files: calls none of them.
 */
#include "daemon/node/serve_int.h"
#include "conf/util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct serve_write {
	uv_write_t req;
	char *data;
};

static void serve_write_cb(uv_write_t *req, int status)
{
	struct serve_write *w = kvd_container_of(req, struct serve_write, req);

	(void)status;
	free(w->data);
	free(w);
}

/* Queue data (malloc'd, consumed in every case). */
int serve__write(uv_stream_t *st, char *data, size_t len)
{
	struct serve_write *w;
	uv_buf_t buf;
	int r;

	if (uv_is_closing((uv_handle_t *)st) || !uv_is_writable(st)) {
		free(data);
		return -EPIPE;
	}
	w = malloc(sizeof(*w));
	if (!w) {
		free(data);
		return -ENOMEM;
	}
	w->data = data;
	buf = uv_buf_init(data, (unsigned)len);
	r = uv_write(&w->req, st, &buf, 1, serve_write_cb);
	if (r) {
		free(data);
		free(w);
	}
	return r;
}

struct serve_drop {
	union serve_stream h;
	struct serve *s;
};

static void serve_drop_closed(uv_handle_t *h)
{
	struct serve_drop *d = h->data;

	d->s->closes_pending--;
	free(d);
}

/* libuv has already accept(2)ed the connection it reports, and stops
 * polling a listener whose callback leaves it unaccepted; so a refused
 * connection is accepted into a small handle and closed at once. */
void serve__accept_drop(struct serve *s, uv_stream_t *server)
{
	struct serve_drop *d = malloc(sizeof(*d));
	int rc = -ENOMEM;

	if (d) {
		d->s = s;
		rc = server->type == UV_NAMED_PIPE ? uv_pipe_init(&s->d->loop, &d->h.pipe, 0)
						   : uv_tcp_init(&s->d->loop, &d->h.tcp);
		if (rc)
			free(d);
	}
	if (rc) {
		/* no memory even for that: close the descriptor libuv holds
		 * for us (accepted_fd, in uv.h's unix stream fields) */
		if (server->accepted_fd >= 0) {
			close(server->accepted_fd);
			server->accepted_fd = -1;
		}
		return;
	}
	d->h.handle.data = d;
	(void)uv_accept(server, &d->h.stream);
	s->closes_pending++;
	uv_close(&d->h.handle, serve_drop_closed);
}

void serve__handle_closed(uv_handle_t *h)
{
	struct serve *s = h->data;

	s->closes_pending--;
}

void serve__close_handle(struct serve *s, uv_handle_t *h)
{
	h->data = s;
	s->closes_pending++;
	uv_close(h, serve__handle_closed);
}

/* "host:port" -> sockaddr (IPv4, or [IPv6]:port). */
int serve__parse_hostport(const char *spec, struct sockaddr_storage *ss)
{
	char host[256];
	const char *colon = strrchr(spec, ':');
	long port;
	char *end;

	if (!colon || colon == spec || (size_t)(colon - spec) >= sizeof(host))
		return -EINVAL;
	memcpy(host, spec, (size_t)(colon - spec));
	host[colon - spec] = 0;
	port = strtol(colon + 1, &end, 10);
	if (*end || port < 0 || port > 65535)
		return -EINVAL;
	if (host[0] == '[') {
		size_t n = strlen(host);

		if (n < 3 || host[n - 1] != ']')
			return -EINVAL;
		host[n - 1] = 0;
		return uv_ip6_addr(host + 1, (int)port, (struct sockaddr_in6 *)ss);
	}
	if (!strcmp(host, "localhost"))
		snprintf(host, sizeof(host), "127.0.0.1");
	return uv_ip4_addr(host, (int)port, (struct sockaddr_in *)ss);
}
