/* fpcheck.c - hash the model in full on a thread, report on the loop.
 *
 * The thread reads the mapping in FPCHECK_CHUNK pieces and looks at the
 * cancel flag between them, so a stop waits at most one chunk's hashing
 * (~10 ms at 1.5-2 GB/s) before the join. It runs at nice 19: on a node
 * busy serving, the check takes longer rather than taking CPU from
 * requests. The result crosses to the loop through one uv_async_t; the
 * loop joins the thread there (it has finished) before calling back.
 */
#include "daemon/node/fpcheck.h"
#include "conf/util.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#define FPCHECK_CHUNK (16u << 20)

struct fpcheck {
	uv_async_t async;
	pthread_t thread;
	bool joined;
	atomic_bool cancel;
	atomic_bool finished;
	const uint8_t *data;     /* (size) the model's bytes, not owned */
	size_t size;
	char want[SHA256_HEX_SIZE];
	char got[SHA256_HEX_SIZE];
	uint64_t t0_ns, ns;
	fpcheck_done_fn done;
	void *arg;
};

static void *fpcheck_main(void *p)
{
	struct fpcheck *f = p;
	uint8_t d[SHA256_DIGEST_SIZE];
	struct sha256 c;

	(void)setpriority(PRIO_PROCESS, (id_t)gettid(), 19);
	sha256_init(&c);
	for (size_t off = 0; off < f->size; off += FPCHECK_CHUNK) {
		if (atomic_load(&f->cancel))
			return NULL;
		sha256_update(&c, f->data + off,
			      f->size - off < FPCHECK_CHUNK ? f->size - off : FPCHECK_CHUNK);
	}
	sha256_final(&c, d);
	sha256_hex(d, f->got);
	f->ns = kvd_now_ns() - f->t0_ns;
	atomic_store(&f->finished, true);
	uv_async_send(&f->async);
	return NULL;
}

static void fpcheck_async_cb(uv_async_t *a)
{
	struct fpcheck *f = kvd_container_of(a, struct fpcheck, async);
	fpcheck_done_fn done = f->done;

	if (!atomic_load(&f->finished) || !done)
		return;
	pthread_join(f->thread, NULL);
	f->joined = true;
	f->done = NULL;
	/* last: done may stop the node, and with it free f */
	done(f->arg, !strcmp(f->want, f->got), f->got, f->size, (double)f->ns / 1e6);
}

static void fpcheck_close_cb(uv_handle_t *h)
{
	free(kvd_container_of((uv_async_t *)h, struct fpcheck, async));
}

int fpcheck_start(struct fpcheck **out, uv_loop_t *loop, const void *data,
		  size_t size, const char *want_hex, fpcheck_done_fn done,
		  void *arg)
{
	struct fpcheck *f;
	int r;

	*out = NULL;
	if (strlen(want_hex) != SHA256_HEX_SIZE - 1)
		return -EINVAL;
	f = calloc(1, sizeof(*f));
	if (!f)
		return -ENOMEM;
	f->data = data;
	f->size = size;
	memcpy(f->want, want_hex, SHA256_HEX_SIZE);
	f->done = done;
	f->arg = arg;
	f->t0_ns = kvd_now_ns();
	r = uv_async_init(loop, &f->async, fpcheck_async_cb);
	if (r) {
		free(f);
		return r;
	}
	r = -pthread_create(&f->thread, NULL, fpcheck_main, f);
	if (r) {
		f->joined = true;
		f->done = NULL;
		uv_close((uv_handle_t *)&f->async, fpcheck_close_cb);
		return r;
	}
	*out = f;
	return 0;
}

void fpcheck_stop(struct fpcheck *f)
{
	if (!f)
		return;
	atomic_store(&f->cancel, true);
	if (!f->joined) {
		pthread_join(f->thread, NULL);
		f->joined = true;
	}
	f->done = NULL;
	uv_close((uv_handle_t *)&f->async, fpcheck_close_cb);
}
