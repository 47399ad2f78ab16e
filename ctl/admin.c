/* admin.c - the admin socket server: connections, framing, bounds.
 *
 * Design. The admin plane must never be the way to hurt a node, so every
 * connection is handled as hostile until proven otherwise:
 *
 *  - Credentials first. SO_PEERCRED at accept gives the peer's uid/gid;
 *    root, or a member of admin.group (primary group, or supplementary
 *    groups from the peer's passwd entry via getgrouplist), may talk. A
 *    refused peer gets one `denied` frame and is closed once it is written.
 *  - One table. Every command is a row (name, handler, argument schema,
 *    privilege, fault-point only) in admin_cmds.c, the schemas in
 *    admin_args.c; the dispatcher here checks the privilege and the
 *    schema (strict: unknown keys are errors) before the handler runs,
 *    so handlers receive typed, validated arguments and stay short.
 *  - Bounded per client. A client owns a fixed read chunk, a frame decoder
 *    bounded by ADMIN_FRAME_MAX, at most one call in progress and a write
 *    queue (net/wbound.h) that pauses reading above ADMIN_WRITE_HIGH
 *    bytes and closes the client past ADMIN_WRITE_HARD. A client that
 *    pipelines requests is served in order; while a call waits (drain, a
 *    shrinking resize) reading stops, so nothing piles up.
 *  - Typed errors, never a crash. A bad frame (not msgpack, not a map)
 *    gets a `malformed` reply and the connection goes on; an oversized
 *    length gets `too_big` and a close (the stream cannot be resynced);
 *    unknown commands and bad arguments get their own codes. Other
 *    clients never notice.
 *
 * Replies are maps: {ok, cmd, id?, result} or {ok, cmd, id?, error, code,
 * message, key?}. Handlers pack exactly one map into call->res; the
 * envelope is built around it when the call completes, now or later.
 *
 * Memory: the server and each client are freed in their handles' close
 * callbacks (libuv: "memory freed only in the close callback").
 */
#include "ctl/admin.h"
#include "ctl/errors.h"
#include "conf/util.h"
#include "ctl/admin_int.h"
#include "daemon/node/daemon.h"
#include "daemon/node/ops.h"
#include "kvd_build.h"
#include "net/wire/frame.h"
#include "net/wbound.h"

#include <errno.h>
#include <grp.h>
#include <stdarg.h>
#include <pwd.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

/* Write bounds (net/wbound.h): commands stop being read past HIGH, so at
 * most one reply (ADMIN_REPLY_MAX) lands past it; a client whose queue
 * is past HARD, or past HIGH for ADMIN_WRITE_STALL_MS, is closed. Fixed,
 * not listen.*: the admin plane is the operator's and must not depend on
 * the limits tuned for tenants. */
#define ADMIN_WRITE_HIGH (256u * 1024)
#define ADMIN_WRITE_HARD (ADMIN_WRITE_HIGH + 2 * ADMIN_REPLY_MAX)
#define ADMIN_WRITE_STALL_MS 30000

const char *admin_strerror(int code)
{
	if (code <= 0 || code >= ADMIN_E__N)
		return "?";
	return kvd_err_code_name(&kvd_err_admin, code);
}

static void client_pump(struct admin_client *c);
static void client_close(struct admin_client *c);
static int client_read_start(struct admin_client *c);

/* ---- writing ------------------------------------------------------------- */

static size_t client_write_queued(struct admin_client *c)
{
	return wbound_queued(&c->wb);
}

static void client_closed_for(struct admin_client *c, const char *reason)
{
	KVLOG_WARN(&c->s->d->log, "admin_closed",
		   "uid=%u pid=%d reason=%s queued=%zu", (unsigned)c->uid,
		   (int)c->pid, reason, client_write_queued(c));
	client_close(c);
}

static void client_written(struct wbound *wb, int status)
{
	struct admin_client *c = kvd_container_of(wb, struct admin_client, wb);

	if (c->closing)
		return;
	if (status < 0 || (c->close_after_write && client_write_queued(c) == 0)) {
		client_close(c);
		return;
	}
	client_pump(c);
}

/* Queue a frame; takes ownership of data. */
static void client_send(struct admin_client *c, char *data, size_t len)
{
	int r;

	if (c->closing) {
		free(data);
		return;
	}
	/* a stall is judged when the next reply is queued: a client that
	 * sends nothing more holds at most one reply past HIGH and one of
	 * ADMIN_CLIENTS_MAX slots */
	if (wbound_poll(&c->wb, kvd_now_ns()) == WBOUND_E_STALL) {
		free(data);
		client_closed_for(c, "write_stall");
		return;
	}
	r = wbound_write(&c->wb, data, len);
	if (r == WBOUND_E_HARD)
		client_closed_for(c, "write_queue_hard");
	else if (r)
		client_close(c);
}

/* The envelope around a result (code 0) or an error. */
static void client_reply(struct admin_client *c, int code)
{
	struct admin_call *call = &c->call;
	struct frame_writer w;
	msgpack_packer *pk;
	char *data;
	size_t len;
	uint32_t n = 3 + call->has_id + (code ? 2 + (call->key[0] != 0) : 0);
	int r;

	frame_writer_init(&w);
	pk = frame_writer_packer(&w);
	msgpack_pack_map(pk, n);
	frame_pack_kv_bool(pk, "ok", code == 0);
	frame_pack_kv_str(pk, "cmd", call->cmd ? call->cmd->name : "");
	if (call->has_id)
		frame_pack_kv_u64(pk, "id", call->id);
	if (code == 0) {
		frame_pack_str(pk, "result");
		frame_writer_append(&w, call->res.buf + FRAME_HEADER_BYTES,
				    call->res.len - FRAME_HEADER_BYTES);
	} else {
		frame_pack_kv_str(pk, "error", admin_strerror(code));
		frame_pack_kv_u64(pk, "code", (uint64_t)code);
		frame_pack_kv_str(pk, "message", call->msg);
		if (call->key[0])
			frame_pack_kv_str(pk, "key", call->key);
	}
	r = frame_writer_finish(&w, ADMIN_REPLY_MAX, &data, &len);
	frame_writer_deinit(&w);
	frame_writer_clear(&call->res);
	if (r) {
		KVLOG_ERR(&c->s->d->log, "admin_reply_failed", "code=%d", r);
		client_close(c);
		return;
	}
	client_send(c, data, len);
}

int admin__call_fail(struct admin_call *call, int code, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(call->msg, sizeof(call->msg), fmt, ap);
	va_end(ap);
	return code;
}

void admin__call_complete(struct admin_call *call, int code)
{
	struct admin_client *c = call->c;

	c->pending = false;
	uv_timer_stop(&c->timer);
	client_reply(c, code);
	client_pump(c);
}

/* ---- dispatch ------------------------------------------------------------------ */

/* Copy a wire string for a message, printable bytes only. */
static void admin_printable(char *dst, size_t size, const msgpack_object *o)
{
	size_t n = 0;

	if (o && o->type == MSGPACK_OBJECT_STR)
		for (; n < o->via.str.size && n + 1 < size; n++) {
			unsigned char ch = (unsigned char)o->via.str.ptr[n];

			dst[n] = ch >= 0x20 && ch < 0x7f && ch != '"' ? (char)ch : '?';
		}
	dst[n] = '\0';
}

static int client_dispatch_args(struct admin_call *call,
				const msgpack_object *m)
{
	static const char *const envelope[] = { "cmd", "id", NULL };
	const struct admin_cmd *cmd = call->cmd;
	struct frame_error ferr;
	int r;

	r = frame_map_parse(m, cmd->args ? cmd->args->fields : NULL,
			    cmd->args ? cmd->args->n : 0, FRAME_SCHEMA_STRICT,
			    envelope, &call->a, &call->present, &ferr);
	if (r) {
		snprintf(call->key, sizeof(call->key), "%s", ferr.key);
		return admin__call_fail(call, ADMIN_E_BAD_ARGS, "%s: %s (%s)",
					ferr.key[0] ? ferr.key : "arguments",
					ferr.msg, frame_strerror(r));
	}
	return cmd->fn(call);
}

static void client_dispatch(struct admin_client *c, const msgpack_object *m)
{
	struct admin_call *call = &c->call;
	struct kvd_daemon *d = c->s->d;
	const msgpack_object *name = frame_map_get(m, "cmd");
	const msgpack_object *id = frame_map_get(m, "id");
	char shown[64];
	int r;

	frame_writer_clear(&call->res);
	call->cmd = NULL;
	call->has_id = false;
	call->msg[0] = call->key[0] = '\0';
	call->deadline_ns = 0;
	memset(&call->a, 0, sizeof(call->a));
	call->present = 0;
	if (id && frame_obj_u64(id, &call->id) == 0)
		call->has_id = true;

	if (id && !call->has_id) {
		snprintf(call->key, sizeof(call->key), "id");
		r = admin__call_fail(call, ADMIN_E_BAD_ARGS,
				     "id must be an unsigned integer");
	} else if (!name || name->type != MSGPACK_OBJECT_STR) {
		snprintf(call->key, sizeof(call->key), "cmd");
		r = admin__call_fail(call, ADMIN_E_BAD_ARGS,
				     "cmd (a string) is required");
	} else if (!(call->cmd = admin__cmd_find(name))) {
		admin_printable(shown, sizeof(shown), name);
		r = admin__call_fail(call, ADMIN_E_UNKNOWN_COMMAND,
				     "unknown command '%s'", shown);
	} else if (c->priv < call->cmd->priv) {
		r = admin__call_fail(call, ADMIN_E_DENIED, "%s needs root",
				     call->cmd->name);
		KVLOG_WARN(&d->log, "admin_denied", "uid=%u pid=%d cmd=%s"
			   " reason=privilege", (unsigned)c->uid, (int)c->pid,
			   call->cmd->name);
	} else {
		r = client_dispatch_args(call, m);
	}
	if (call->cmd)
		KVLOG(&d->log,
		      r > 0 ? KVLOG_WARN
			    : (!strcmp(call->cmd->name, "status") ||
			       !strcmp(call->cmd->name, "capacity"))
				      ? KVLOG_DEBUG : KVLOG_INFO,
		      "admin_command", "cmd=%s uid=%u pid=%d result=%s",
		      call->cmd->name, (unsigned)c->uid, (int)c->pid,
		      r == ADMIN_PENDING ? "pending"
					 : r ? admin_strerror(r) : "ok");
	else
		KVLOG_WARN(&d->log, "admin_bad_request", "uid=%u pid=%d error=%s",
			   (unsigned)c->uid, (int)c->pid, admin_strerror(r));
	if (r == ADMIN_PENDING) {
		c->pending = true;
		return;
	}
	client_reply(c, r);
}

/* A frame-level error: reply without a command. */
static void client_frame_error(struct admin_client *c, int code, const char *what)
{
	struct admin_call *call = &c->call;

	call->cmd = NULL;
	call->has_id = false;
	call->key[0] = '\0';
	snprintf(call->msg, sizeof(call->msg), "%s", what);
	KVLOG_WARN(&c->s->d->log, "admin_bad_frame", "uid=%u pid=%d error=%s",
		   (unsigned)c->uid, (int)c->pid, admin_strerror(code));
	client_reply(c, code);
}

/* Process buffered frames until a call waits, the write queue is high or
 * input runs out; then read again if there is room. */
static void client_pump(struct admin_client *c)
{
	const msgpack_object *m;
	bool want_read;
	size_t used;
	int r;

	while (!c->closing && !c->pending && !c->close_after_write &&
	       client_write_queued(c) <= ADMIN_WRITE_HIGH) {
		r = frame_decoder_next(&c->dec, &m);
		if (r == FRAME_E_AGAIN) {
			if (c->roff == c->rlen)
				break;
			r = frame_decoder_feed(&c->dec, c->rbuf + c->roff,
					       c->rlen - c->roff, &used);
			if (r < 0) {
				client_close(c);
				return;
			}
			c->roff += used;
			continue;
		}
		if (r == 0) {
			client_dispatch(c, m);
		} else if (r == FRAME_E_TOOBIG) {
			client_frame_error(c, ADMIN_E_TOO_BIG,
					   "frame longer than the limit; closing");
			c->close_after_write = true;
		} else if (r < 0) {
			client_close(c);
			return;
		} else {
			client_frame_error(c, ADMIN_E_MALFORMED,
					   r == FRAME_E_NOTMAP
					   ? "frame payload is not a msgpack map"
					   : "frame payload is not valid msgpack");
		}
	}
	if (c->closing)
		return;
	want_read = !c->pending && !c->close_after_write &&
		    c->roff == c->rlen &&
		    client_write_queued(c) <= ADMIN_WRITE_HIGH;
	if (want_read) {
		if (client_read_start(c) < 0)
			client_close(c);
	} else {
		wbound_read_stop(&c->wb);
	}
}

/* ---- connections ----------------------------------------------------------------- */

static void client_handle_closed_cb(uv_handle_t *h)
{
	struct admin_client *c = h->data;

	if (--c->handles)
		return;
	frame_decoder_deinit(&c->dec);
	frame_writer_deinit(&c->call.res);
	free(c);
}

static void client_close(struct admin_client *c)
{
	struct admin_server *s = c->s;

	if (c->closing)
		return;
	c->closing = true;
	if (c->pending)
		kvd_ops_resize_detach(&s->ops, c);
	c->pending = false;
	kvd_list_del(&c->link);
	s->n_clients--;
	uv_close((uv_handle_t *)&c->pipe, client_handle_closed_cb);
	uv_close((uv_handle_t *)&c->timer, client_handle_closed_cb);
}

static void client_alloc_cb(uv_handle_t *h, size_t hint, uv_buf_t *buf)
{
	struct admin_client *c = h->data;

	(void)hint;
	*buf = uv_buf_init(c->rbuf, sizeof(c->rbuf));
}

static void client_read_cb(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
	struct admin_client *c = st->data;

	(void)buf;
	if (nread == 0)
		return;
	if (nread < 0) {
		if (nread == UV_EOF && frame_decoder_finish(&c->dec))
			KVLOG_WARN(&c->s->d->log, "admin_bad_frame",
				   "uid=%u pid=%d error=truncated pending=%zu",
				   (unsigned)c->uid, (int)c->pid,
				   frame_decoder_pending(&c->dec));
		client_close(c);
		return;
	}
	c->roff = 0;
	c->rlen = (size_t)nread;
	client_pump(c);
}

static int client_read_start(struct admin_client *c)
{
	return wbound_read_start(&c->wb);
}

/* Is uid a member of gid through its passwd entry's group list? */
static bool admin_uid_in_group(uid_t uid, gid_t gid)
{
	struct passwd pw, *pwp = NULL;
	char buf[4096];
	gid_t groups[256];
	int n = KVD_ARRAY_SIZE(groups);

	if (getpwuid_r(uid, &pw, buf, sizeof(buf), &pwp) != 0 || !pwp)
		return false;
	if (pw.pw_gid == gid)
		return true;
	if (getgrouplist(pw.pw_name, pw.pw_gid, groups, &n) < 0)
		n = KVD_ARRAY_SIZE(groups);   /* more than fit: check those */
	for (int i = 0; i < n; i++)
		if (groups[i] == gid)
			return true;
	return false;
}

static enum admin_priv admin_peer_priv(struct admin_server *s,
				       struct admin_client *c)
{
	struct ucred cred;
	socklen_t len = sizeof(cred);
	uv_os_fd_t fd;

	if (uv_fileno((uv_handle_t *)&c->pipe, &fd) < 0 ||
	    getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0)
		return ADMIN_PRIV_NONE;
	c->uid = cred.uid;
	c->gid = cred.gid;
	c->pid = cred.pid;
	if (cred.uid == 0)
		return ADMIN_PRIV_ROOT;
	if (s->have_group &&
	    (cred.gid == s->group || admin_uid_in_group(cred.uid, s->group)))
		return ADMIN_PRIV_MEMBER;
	return ADMIN_PRIV_NONE;
}

/* Refuse a connection with one error frame, then close. */
static void client_refuse(struct admin_client *c, int code, const char *msg)
{
	c->call.cmd = NULL;
	c->call.has_id = false;
	c->call.key[0] = '\0';
	snprintf(c->call.msg, sizeof(c->call.msg), "%s", msg);
	c->close_after_write = true;
	client_reply(c, code);
}

static void server_connection_cb(uv_stream_t *ls, int status)
{
	struct admin_server *s = ls->data;
	struct kvd_daemon *d = s->d;
	struct admin_client *c;

	if (status < 0) {
		KVLOG_WARN(&d->log, "admin_accept_failed", "error=%s",
			   KVLOG_Q(uv_strerror(status)));
		return;
	}
	c = calloc(1, sizeof(*c));
	if (!c)
		return;
	c->s = s;
	frame_decoder_init(&c->dec, ADMIN_FRAME_MAX);
	frame_writer_init(&c->call.res);
	c->call.c = c;
	uv_pipe_init(&d->loop, &c->pipe, 0);
	uv_timer_init(&d->loop, &c->timer);
	c->pipe.data = c;
	c->timer.data = c;
	c->handles = 2;
	{
		static const struct wbound_limits lim = {
			.soft = ADMIN_WRITE_HIGH, .hard = ADMIN_WRITE_HARD,
			.stall_ms = ADMIN_WRITE_STALL_MS,
		};

		wbound_init(&c->wb, (uv_stream_t *)&c->pipe, &lim,
			    client_alloc_cb, client_read_cb);
		wbound_on_write(&c->wb, client_written);
	}
	kvd_list_add(&s->clients, &c->link);
	s->n_clients++;
	if (uv_accept(ls, (uv_stream_t *)&c->pipe) < 0) {
		client_close(c);
		return;
	}
	c->priv = admin_peer_priv(s, c);
	if (c->priv == ADMIN_PRIV_NONE) {
		KVLOG_WARN(&d->log, "admin_denied",
			   "uid=%u gid=%u pid=%d reason=credentials group=%s",
			   (unsigned)c->uid, (unsigned)c->gid, (int)c->pid,
			   KVLOG_Q(s->have_group ? d->cfg.admin_group : "-"));
		client_refuse(c, ADMIN_E_DENIED,
			      "not root and not in the admin group");
		return;
	}
	if (s->n_clients > ADMIN_CLIENTS_MAX) {
		KVLOG_WARN(&d->log, "admin_refused", "uid=%u pid=%d"
			   " reason=too_many_clients", (unsigned)c->uid,
			   (int)c->pid);
		client_refuse(c, ADMIN_E_TOO_MANY_CLIENTS,
			      "too many admin clients");
		return;
	}
	KVLOG_DEBUG(&d->log, "admin_connect", "uid=%u pid=%d", (unsigned)c->uid,
		    (int)c->pid);
	if (client_read_start(c) < 0)
		client_close(c);
}

/* ---- the server --------------------------------------------------------------------- */

static void server_handle_closed(struct admin_server *s)
{
	if (--s->handles == 0)
		free(s);
}

static void server_listener_closed_cb(uv_handle_t *h)
{
	server_handle_closed(h->data);
}

static void server_ops_closed(struct kvd_ops *o)
{
	server_handle_closed(kvd_container_of(o, struct admin_server, ops));
}

static void admin_lookup_group(struct admin_server *s)
{
	struct group gr, *grp = NULL;
	char buf[4096];
	struct kvd_daemon *d = s->d;

	if (!d->cfg.admin_group[0])
		return;
	if (getgrnam_r(d->cfg.admin_group, &gr, buf, sizeof(buf), &grp) == 0 &&
	    grp) {
		s->have_group = true;
		s->group = grp->gr_gid;
		return;
	}
	KVLOG_WARN(&d->log, "admin_group_missing",
		   "group=%s msg=\"no such group: only root may use the admin socket\"",
		   KVLOG_Q(d->cfg.admin_group));
}

static int admin_listen(struct admin_server *s)
{
	struct kvd_daemon *d = s->d;
	int r;

	r = kvd_unix_claim(s->path);  /* a live daemon's socket is not ours */
	if (r < 0)
		return r;
	r = uv_pipe_bind(&s->listener, s->path);
	if (r < 0)
		return r;
	if (chmod(s->path, d->cfg.admin_mode) < 0) {
		r = -errno;
		unlink(s->path);
		return r;
	}
	if (s->have_group && chown(s->path, (uid_t)-1, s->group) < 0)
		KVLOG_WARN(&d->log, "admin_chown_failed", "path=%s group=%s error=%s",
			   KVLOG_Q(s->path), KVLOG_Q(d->cfg.admin_group),
			   KVLOG_Q(strerror(errno)));
	r = uv_listen((uv_stream_t *)&s->listener, ADMIN_CLIENTS_MAX,
		      server_connection_cb);
	if (r < 0)
		unlink(s->path);
	return r;
}

int admin_server_start(struct admin_server **out, struct kvd_daemon *d)
{
	const char *path = d->cfg.admin_socket;
	struct admin_server *s;
	int r;

	*out = NULL;
	if (!path[0] || !strcmp(path, "none"))
		return 0;
	if (strlen(path) >= sizeof(s->path))
		return -ENAMETOOLONG;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->d = d;
	kvd_list_init(&s->clients);
	memcpy(s->path, path, strlen(path) + 1);
	admin_lookup_group(s);
	r = kvd_ops_init(&s->ops, d);
	if (r < 0) {
		free(s);
		return r;
	}
	uv_pipe_init(&d->loop, &s->listener, 0);
	s->listener.data = s;
	s->handles = 2;
	r = admin_listen(s);
	if (r < 0) {
		KVLOG_ERR(&d->log, "admin_listen_failed", "path=%s error=%s",
			  KVLOG_Q(s->path), KVLOG_Q(uv_strerror(r)));
		s->path[0] = '\0';
		admin_server_close(s);
		return r;
	}
	KVLOG_INFO(&d->log, "admin_listening", "path=%s mode=%04o group=%s",
		   KVLOG_Q(s->path), (unsigned)d->cfg.admin_mode,
		   KVLOG_Q(s->have_group ? d->cfg.admin_group : "-"));
	*out = s;
	return 0;
}

void admin_server_close(struct admin_server *s)
{
	if (!s || s->closing)
		return;
	s->closing = true;
	while (!kvd_list_empty(&s->clients))
		client_close(kvd_list_entry(s->clients.next,
					    struct admin_client, link));
	if (s->path[0])
		unlink(s->path);
	uv_close((uv_handle_t *)&s->listener, server_listener_closed_cb);
	kvd_ops_close(&s->ops, server_ops_closed);
}

static void admin_stop_hook(struct kvd_daemon *d, void *arg)
{
	(void)arg;
	admin_server_close(d->admin);
	d->admin = NULL;
}

int admin_server_attach(struct kvd_daemon *d)
{
	int r = admin_server_start(&d->admin, d);

	if (r < 0 || !d->admin)
		return r;
	r = kvd_daemon_on_stop(d, admin_stop_hook, NULL);
	if (r < 0) {
		admin_server_close(d->admin);
		d->admin = NULL;
	}
	return r;
}
