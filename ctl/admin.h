/* admin.h - the admin socket: msgpack frames over a Unix stream socket.
 *
 * The server listens on cfg.admin_socket (mode cfg.admin_mode, group
 * cfg.admin_group). Each connection's peer credentials (SO_PEERCRED) are
 * checked at accept: root, or a user whose primary or supplementary groups
 * include the admin group, may talk; anyone else gets one `denied` error
 * frame, a log line, and the door. Requests and replies are frames
 * (net/wire/frame.h); the protocol is documented in ctl/README.md.
 *
 * Lifecycle (libuv style): admin_server_start() builds and listens;
 * admin_server_close() closes every handle, and memory is freed in the
 * close callbacks, so the loop must run afterwards (kvd_daemon_deinit
 * does). If start fails, nothing is left behind.
 *
 * Thread: loop thread only.
 */
#pragma once

#include <stddef.h>

struct kvd_daemon;
struct admin_server;

/* Wire error codes (the "code" of an error reply; "error" holds the name).
 * Stable: scripts match on them. */
enum {
	ADMIN_E_MALFORMED = 1,   /* not a msgpack map, or truncated */
	ADMIN_E_TOO_BIG,         /* frame longer than ADMIN_FRAME_MAX */
	ADMIN_E_UNKNOWN_COMMAND,
	ADMIN_E_BAD_ARGS,        /* missing, unknown or mistyped argument */
	ADMIN_E_DENIED,          /* credentials or privilege */
	ADMIN_E_BUSY,            /* e.g. another resize is running */
	ADMIN_E_NOT_FOUND,       /* no such request */
	ADMIN_E_WRONG_STATE,     /* e.g. resume while stopping */
	ADMIN_E_CAPACITY,        /* resize below the capacity requirement */
	ADMIN_E_TIMEOUT,         /* waited and gave up; the work goes on */
	ADMIN_E_UNSUPPORTED,     /* not in this build */
	ADMIN_E_INTERNAL,        /* system failure on the daemon side */
	ADMIN_E_TOO_MANY_CLIENTS,
	ADMIN_E_DRAINING,        /* the node admits nothing new */
	ADMIN_E_OUT_OF_RANGE,    /* argument value out of range */
	ADMIN_E_POOL_FULL,
	ADMIN_E__N,
};

#define ADMIN_FRAME_MAX (64u * 1024)   /* request payload bytes */
#define ADMIN_REPLY_MAX (1u << 20)     /* reply payload bytes */
#define ADMIN_CLIENTS_MAX 64

/* Wire name of an ADMIN_E_* code ("too_big", ...). */
const char *admin_strerror(int code);

/* Listen on d->cfg.admin_socket. *out is NULL (and 0 returned) when the
 * socket is "none" or empty. Negative errno on failure (socket in use by
 * a live daemon: -EADDRINUSE). */
int admin_server_start(struct admin_server **out, struct kvd_daemon *d);

/* Close the listener and every client, unlink the socket. Safe with NULL;
 * call once. */
void admin_server_close(struct admin_server *s);

/* Both in one: start into d->admin and register a daemon stop hook that
 * closes it (kvd_daemon_on_stop). 0 or negative errno (nothing started). */
int admin_server_attach(struct kvd_daemon *d);
