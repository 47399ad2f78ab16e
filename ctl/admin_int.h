/* admin_int.h - what the admin server (admin.c) and its commands
 * (admin_cmds.c) share; not for other modules.
 *
 * admin.c owns connections: credentials, framing, bounds, replies.
 * admin_cmds.c owns the command table and the handlers. A handler gets a
 * struct admin_call whose arguments are already checked against its
 * schema (admin_args.h), packs one map into call->res and returns 0, or
 * ADMIN_PENDING and later calls admin__call_complete(), or an ADMIN_E_*
 * code from admin__call_fail().
 *
 * Thread: loop thread only.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "conf/list.h"
#include "ctl/admin.h"
#include "ctl/admin_args.h"
#include "daemon/node/ops.h"
#include "net/wire/frame.h"
#include "net/wbound.h"

#define ADMIN_READ_CHUNK 4096

enum admin_priv {
	ADMIN_PRIV_NONE = 0,
	ADMIN_PRIV_MEMBER,    /* in admin.group */
	ADMIN_PRIV_ROOT,
};

/* Handler return: the reply is packed (0), will come later (PENDING), or
 * an ADMIN_E_* error with call->msg set. */
#define ADMIN_PENDING (-1000)

struct admin_client;

struct admin_call {
	struct admin_client *c;
	const struct admin_cmd *cmd;
	bool has_id;
	uint64_t id;
	struct admin_args a;
	uint64_t present;             /* bit i: cmd->args->fields[i] was given */
	uint64_t deadline_ns;         /* drain wait; 0 = none */
	struct frame_writer res;      /* the result map, packed by handlers */
	char msg[200];                /* error message */
	char key[64];                 /* argument an error is about */
};

struct admin_cmd {
	const char *name;
	int (*fn)(struct admin_call *call);
	const struct admin_args_schema *args; /* NULL: takes none */
	enum admin_priv priv;
	bool fault_only;              /* only with KVD_FAULT_POINTS */
};

struct admin_client {
	struct admin_server *s;
	uv_pipe_t pipe;
	uv_timer_t timer;             /* polls a waiting drain; write stall */
	struct wbound wb;             /* every reply */
	unsigned handles;             /* open handles; freed at 0 */
	struct frame_decoder dec;
	char rbuf[ADMIN_READ_CHUNK];  /* (ADMIN_READ_CHUNK) last read; [roff,
				       * rlen) not yet fed to dec */
	size_t roff, rlen;
	uid_t uid;
	gid_t gid;
	pid_t pid;
	enum admin_priv priv;
	bool closing, pending, close_after_write;
	struct admin_call call;
	struct kvd_list link;         /* in s->clients */
};

struct admin_server {
	struct kvd_daemon *d;
	uv_pipe_t listener;
	struct kvd_ops ops;
	unsigned handles;             /* listener + ops; freed at 0 */
	bool have_group;
	gid_t group;
	char path[108];
	struct kvd_list clients;      /* struct admin_client.link, newest first */
	uint32_t n_clients;
	bool closing;
};

/* ---- admin.c ------------------------------------------------------------- */

/* Set call->msg from fmt and return code (an ADMIN_E_*). */
int admin__call_fail(struct admin_call *call, int code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* Finish a call that returned ADMIN_PENDING: reply (code 0: call->res)
 * and go on with the client's next frame. */
void admin__call_complete(struct admin_call *call, int code);

/* ---- admin_cmds.c -------------------------------------------------------- */

/* The command named by the wire string name, or NULL (fault-point
 * commands exist only in builds with KVD_FAULT_POINTS). */
const struct admin_cmd *admin__cmd_find(const msgpack_object *name);
