/* test_wbound.c - the bounded write queue on a real socket pair whose far
 * end does not read: past soft the stream stops reading, past hard the
 * write says close, a queue stuck past soft is reported after stall_ms,
 * and once the far end reads, the queue drains and reading resumes.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "conf/util.h"
#include "net/wbound.h"

#define CHUNK 65536

struct fx {
	uv_loop_t loop;
	uv_pipe_t pipe;
	int far;                 /* the other end: a plain fd we read or not */
	struct wbound wb;
	int reads;
	char rbuf[4096];
};

static void fx_alloc(uv_handle_t *h, size_t hint, uv_buf_t *b)
{
	struct fx *f = h->data;

	(void)hint;
	*b = uv_buf_init(f->rbuf, sizeof(f->rbuf));
}

static void fx_read(uv_stream_t *st, ssize_t n, const uv_buf_t *b)
{
	struct fx *f = st->data;

	(void)b;
	if (n > 0)
		f->reads++;
}

static void fx_init(struct fx *f, const struct wbound_limits *lim)
{
	int sv[2];
	int sz = 4096;

	memset(f, 0, sizeof(*f));
	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	/* small kernel buffers so the libuv queue fills quickly */
	setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
	setsockopt(sv[1], SOL_SOCKET, SO_RCVBUF, &sz, sizeof(sz));
	ck_assert_int_eq(uv_loop_init(&f->loop), 0);
	ck_assert_int_eq(uv_pipe_init(&f->loop, &f->pipe, 0), 0);
	ck_assert_int_eq(uv_pipe_open(&f->pipe, sv[0]), 0);
	f->pipe.data = f;
	f->far = sv[1];
	wbound_init(&f->wb, (uv_stream_t *)&f->pipe, lim, fx_alloc, fx_read);
	ck_assert_int_eq(wbound_read_start(&f->wb), 0);
}

static void fx_deinit(struct fx *f)
{
	uv_close((uv_handle_t *)&f->pipe, NULL);
	uv_run(&f->loop, UV_RUN_DEFAULT);
	ck_assert_int_eq(uv_loop_close(&f->loop), 0);
	close(f->far);
}

static int fx_write(struct fx *f)
{
	char *d = malloc(CHUNK);

	ck_assert_ptr_nonnull(d);
	memset(d, 'x', CHUNK);
	return wbound_write(&f->wb, d, CHUNK);
}

START_TEST(soft_pauses_hard_closes)
{
	struct wbound_limits lim = { .soft = 4 * CHUNK, .hard = 16 * CHUNK,
				     .stall_ms = 60000 };
	struct fx f;
	int rc = 0, i;

	fx_init(&f, &lim);
	ck_assert(f.wb.reading);
	for (i = 0; i < 64 && !f.wb.paused; i++)
		ck_assert_int_eq(fx_write(&f), 0);
	ck_assert_msg(f.wb.paused, "queue never passed soft");
	ck_assert(!f.wb.reading);
	ck_assert_uint_gt(wbound_queued(&f.wb), lim.soft);
	/* the owner's wish to read does not override the bound */
	ck_assert_int_eq(wbound_read_start(&f.wb), 0);
	ck_assert(!f.wb.reading);
	for (i = 0; i < 64 && rc == 0; i++)
		rc = fx_write(&f);
	ck_assert_int_eq(rc, WBOUND_E_HARD);
	ck_assert_uint_gt(wbound_queued(&f.wb), lim.hard);
	fx_deinit(&f);
}
END_TEST

START_TEST(stall_reported_then_drain_resumes)
{
	struct wbound_limits lim = { .soft = 2 * CHUNK, .hard = 64 * CHUNK,
				     .stall_ms = 50 };
	struct fx f;
	char sink[CHUNK];
	uint64_t t0;

	fx_init(&f, &lim);
	while (!f.wb.paused)
		ck_assert_int_eq(fx_write(&f), 0);
	t0 = kvd_now_ns();
	ck_assert_int_eq(wbound_poll(&f.wb, t0), 0);
	ck_assert_int_eq(wbound_poll(&f.wb, t0 + 60 * 1000000ull), WBOUND_E_STALL);
	/* the far end reads everything: the queue drains, reading resumes */
	for (int spins = 0; spins < 10000 && f.wb.paused; spins++) {
		ssize_t n = recv(f.far, sink, sizeof(sink), MSG_DONTWAIT);

		(void)n;
		uv_run(&f.loop, UV_RUN_NOWAIT);
	}
	ck_assert(!f.wb.paused);
	ck_assert(f.wb.reading);
	ck_assert_int_eq(wbound_poll(&f.wb, kvd_now_ns() + 3600ull * 1000000000ull), 0);
	/* and reading works again: a byte from the far end is read */
	ck_assert_int_eq(write(f.far, "y", 1), 1);
	for (int spins = 0; spins < 1000 && !f.reads; spins++)
		uv_run(&f.loop, UV_RUN_NOWAIT);
	ck_assert_int_gt(f.reads, 0);
	fx_deinit(&f);
}
END_TEST

static int written_n, written_status;

static void count_written(struct wbound *wb, int status)
{
	(void)wb;
	written_n++;
	written_status = status;
}

START_TEST(on_write_runs_per_completed_write)
{
	struct wbound_limits lim = { .soft = 2 * CHUNK, .hard = 64 * CHUNK,
				     .stall_ms = 50 };
	struct fx f;
	char sink[CHUNK];

	fx_init(&f, &lim);
	written_n = 0;
	written_status = -1;
	wbound_on_write(&f.wb, count_written);
	for (int i = 0; i < 3; i++)
		ck_assert_int_eq(fx_write(&f), 0);
	for (int spins = 0; spins < 10000 && written_n < 3; spins++) {
		ssize_t n = recv(f.far, sink, sizeof(sink), MSG_DONTWAIT);

		(void)n;
		uv_run(&f.loop, UV_RUN_NOWAIT);
	}
	ck_assert_int_eq(written_n, 3);
	ck_assert_int_eq(written_status, 0);
	/* a write cancelled by the close is not reported */
	ck_assert_int_eq(fx_write(&f), 0);
	ck_assert_int_eq(fx_write(&f), 0);
	fx_deinit(&f);
	ck_assert_int_eq(written_n, 3);
}
END_TEST

START_TEST(write_after_close_is_epipe)
{
	struct wbound_limits lim = { .soft = CHUNK, .hard = 4 * CHUNK, .stall_ms = 10 };
	struct fx f;

	fx_init(&f, &lim);
	uv_close((uv_handle_t *)&f.pipe, NULL);
	ck_assert_int_eq(fx_write(&f), -EPIPE);
	uv_run(&f.loop, UV_RUN_DEFAULT);
	ck_assert_int_eq(uv_loop_close(&f.loop), 0);
	close(f.far);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("wbound");
	TCase *tc = tcase_create("core");
	SRunner *sr;
	int nf;

	tcase_add_test(tc, soft_pauses_hard_closes);
	tcase_add_test(tc, stall_reported_then_drain_resumes);
	tcase_add_test(tc, write_after_close_is_epipe);
	tcase_add_test(tc, on_write_runs_per_completed_write);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	nf = srunner_ntests_failed(sr);
	srunner_free(sr);
	return nf ? 1 : 0;
}
