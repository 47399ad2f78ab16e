/* prep.c - the request preparation pool (prep.h).
 *
 * Design. The same shape as compute.c: two lists under one mutex - jobs
 * to the workers, finished jobs back - and a uv_async_t that wakes the
 * loop. A job is the caller's memory from submit to done; the pool only
 * links it, so nothing here allocates after start and a finished job can
 * always be handed back.
 *
 * A worker takes a job (prep_pick: the oldest whose key no other worker
 * runs, else the oldest), marks it running, runs it without the lock,
 * and moves it to the done list. A job cancelled while queued is moved
 * to done without running. The loop's wakeup drains the done list and
 * calls each done(job, cancelled) - the only place a job leaves the
 * pool, so the bounds (jobs, bytes, per key) count a job until its
 * owner has been told, and an owner that went away (cancelled) frees it
 * there. prep_stop joins the workers first, then delivers whatever is
 * left (queued jobs never ran) as cancelled, on the loop thread.
 *
 * Workers lower their own priority (setpriority on the thread id: a
 * Linux thread's nice value is its own), so bulk tokenizing yields to
 * the loop and the engine on a busy machine; failing to is harmless.
 */
#include "daemon/front/prep.h"

#include <errno.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#define PREP_NICE 10

static void prep_append(struct prep_job **head, struct prep_job **tail,
			struct prep_job *j)
{
	j->next = NULL;
	if (*tail)
		(*tail)->next = j;
	else
		*head = j;
	*tail = j;
}

/* ---- workers ----------------------------------------------------------------- */

static bool prep_key_running(const struct prep *p, const char *key)
{
	for (unsigned i = 0; i < PREP_THREADS; i++)
		if (p->running[i] && !strcmp(p->running[i]->key, key))
			return true;
	return false;
}

/* Under mu: unlink and return the job a worker runs next; NULL when
 * none is queued. */
static struct prep_job *prep_pick(struct prep *p)
{
	struct prep_job **best = NULL, *j;

	for (struct prep_job **pp = &p->queue; *pp; pp = &(*pp)->next) {
		if (!prep_key_running(p, (*pp)->key)) {
			best = pp;
			break;
		}
	}
	if (!best)
		best = p->queue ? &p->queue : NULL;
	if (!best)
		return NULL;
	j = *best;
	*best = j->next;
	if (p->queue_tail == j) {
		p->queue_tail = NULL;
		for (struct prep_job *k = p->queue; k; k = k->next)
			p->queue_tail = k;
	}
	j->next = NULL;
	return j;
}

static void *prep_worker_main(void *arg)
{
	struct prep *p = ((struct prep_slot *)arg)->p;
	unsigned slot = ((struct prep_slot *)arg)->slot;
	struct prep_job *j;

	(void)setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), PREP_NICE);
	pthread_mutex_lock(&p->mu);
	for (;;) {
		while (!p->stop && !p->queue)
			pthread_cond_wait(&p->cv, &p->mu);
		if (p->stop)
			break;
		j = prep_pick(p);
		if (!atomic_load(&j->cancelled)) {
			p->running[slot] = j;
			j->ran = true;
			pthread_mutex_unlock(&p->mu);
			j->run(j);
			pthread_mutex_lock(&p->mu);
			p->running[slot] = NULL;
		}
		prep_append(&p->done, &p->done_tail, j);
		uv_async_send(&p->async);
	}
	pthread_mutex_unlock(&p->mu);
	return NULL;
}

/* ---- the loop side --------------------------------------------------------------- */

static void prep_deliver(struct prep *p, struct prep_job *list)
{
	while (list) {
		struct prep_job *j = list;

		list = j->next;
		j->next = NULL;
		p->n_jobs--;
		p->bytes -= j->bytes;
		j->done(j, atomic_load(&j->cancelled) || !j->ran);
	}
}

static void prep_async_cb(uv_async_t *a)
{
	struct prep *p = a->data;
	struct prep_job *list;

	pthread_mutex_lock(&p->mu);
	list = p->done;
	p->done = p->done_tail = NULL;
	pthread_mutex_unlock(&p->mu);
	prep_deliver(p, list);
}

int prep_start(struct prep *p, uv_loop_t *loop)
{
	int r;

	if (pthread_mutex_init(&p->mu, NULL))
		return -ENOMEM;
	if (pthread_cond_init(&p->cv, NULL)) {
		pthread_mutex_destroy(&p->mu);
		return -ENOMEM;
	}
	p->mu_init = true;
	r = uv_async_init(loop, &p->async, prep_async_cb);
	if (r)
		return r;
	p->async.data = p;
	p->async_open = true;
	for (unsigned i = 0; i < PREP_THREADS; i++) {
		p->slots[i] = (struct prep_slot){ p, i };
		r = pthread_create(&p->th[i], NULL, prep_worker_main, &p->slots[i]);
		if (r)
			return -r;
		p->n_threads++;
	}
	return 0;
}

/* Under mu: jobs of `key` not yet delivered. */
/* Jobs under key between submit and done, and their bytes. */
static uint32_t prep_key_jobs(const struct prep *p, const char *key, size_t *bytes)
{
	const struct prep_job *lists[] = { p->queue, p->done };
	uint32_t n = 0;

	*bytes = 0;
	for (unsigned l = 0; l < 2; l++)
		for (const struct prep_job *j = lists[l]; j; j = j->next)
			if (!strcmp(j->key, key)) {
				n++;
				*bytes += j->bytes;
			}
	for (unsigned i = 0; i < PREP_THREADS; i++)
		if (p->running[i] && !strcmp(p->running[i]->key, key)) {
			n++;
			*bytes += p->running[i]->bytes;
		}
	return n;
}

int prep_submit(struct prep *p, struct prep_job *j)
{
	size_t kb;
	uint32_t n;

	if (p->stop || !p->n_threads || p->n_jobs >= PREP_JOBS_MAX ||
	    j->bytes > PREP_BYTES_MAX - p->bytes)
		return PREP_E_FULL;
	j->key[PREP_KEY_MAX - 1] = '\0';
	j->next = NULL;
	j->ran = false;
	atomic_store(&j->cancelled, false);
	pthread_mutex_lock(&p->mu);
	n = prep_key_jobs(p, j->key, &kb);
	if (n >= PREP_KEY_JOBS_MAX ||
	    (n && (kb >= PREP_KEY_BYTES_MAX || j->bytes > PREP_KEY_BYTES_MAX - kb))) {
		pthread_mutex_unlock(&p->mu);
		return PREP_E_KEY_FULL;
	}
	prep_append(&p->queue, &p->queue_tail, j);
	pthread_cond_signal(&p->cv);
	pthread_mutex_unlock(&p->mu);
	p->n_jobs++;
	p->bytes += j->bytes;
	return 0;
}

void prep_cancel(struct prep_job *j)
{
	atomic_store(&j->cancelled, true);
}

void prep_stop(struct prep *p)
{
	struct prep_job *list;

	if (!p->mu_init)
		return;
	pthread_mutex_lock(&p->mu);
	p->stop = true;
	pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->mu);
	for (unsigned i = 0; i < p->n_threads; i++)
		pthread_join(p->th[i], NULL);
	p->n_threads = 0;
	/* what finished, then what never ran (cancelled: !ran) */
	list = p->done;
	p->done = p->done_tail = NULL;
	prep_deliver(p, list);
	list = p->queue;
	p->queue = p->queue_tail = NULL;
	prep_deliver(p, list);
}

bool prep_close(struct prep *p, uv_close_cb cb, void *data)
{
	if (p->mu_init) {
		pthread_cond_destroy(&p->cv);
		pthread_mutex_destroy(&p->mu);
		p->mu_init = false;
	}
	if (!p->async_open)
		return false;
	p->async_open = false;
	p->async.data = data;
	uv_close((uv_handle_t *)&p->async, cb);
	return true;
}

uint32_t prep_jobs(const struct prep *p)
{
	return p->n_jobs;
}
