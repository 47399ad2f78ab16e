/* compute.c - the compute thread: one engine, fed from the loop.
 *
 * Design. The loop thread owns every decision; one compute thread owns
 * the engine. They meet in two queues under one mutex: jobs (submit,
 * free) go to the thread, messages (submitted, token, done, freed) come
 * back through a uv_async_t and are handed to the owner's deliver
 * callback. The loop never calls an engine function and the thread
 * touches nothing but the engine, the pool and these queues, so neither
 * needs more locking than the queue's. The pool is shared (its calls
 * lock), but page *bytes* are only touched by the owner that holds them:
 * the engine while an owner computes, the loop otherwise.
 *
 * An owner's end never needs memory on the thread: its SUBMITTED and
 * DONE messages are allocated with its submit job, its FREED with the
 * free job, which the caller allocates when it creates the owner (loop
 * side, where a failure is answered at once). The thread keeps each DONE
 * until the engine reports the end or the owner is freed; a token the
 * thread cannot allocate a message for ends the owner there, failed,
 * through that DONE - a dropped DONE would leave the owner waiting
 * forever, a dropped token would corrupt its text.
 *
 * Pages lent to the engine (decode's transferred KV) are released by the
 * thread right after engine_req_free, in the same job, so no window
 * exists in which the pool could hand them out while the engine still
 * reads them (invariant 2).
 *
 * The module knows owners only as uint64 keys; it never sees what they
 * are, and its caller decides fault points (a submit's `nomem`).
 */
#include "daemon/node/compute.h"
#include "conf/util.h"
#include "conf/log.h"
#include "gpu/kv/kvpool.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

void compute_job_free(struct compute_job *j)
{
	if (!j)
		return;
	free(j->prompt);
	free(j->table);
	free(j->bias);
	free(j->release);
	free(j->cache_prompt);
	free(j->reply);
	free(j->done);
	free(j);
}

static void compute_msgs_free(struct compute_msg *m)
{
	while (m) {
		struct compute_msg *next = m->next;

		free(m->table);
		free(m->mapped);
		free(m);
		m = next;
	}
}

static void compute_append(struct compute_msg **head, struct compute_msg **tail,
			   struct compute_msg *m)
{
	m->next = NULL;
	if (*tail)
		(*tail)->next = m;
	else
		*head = m;
	*tail = m;
}

/* ---- the thread ------------------------------------------------------------- */

/* Thread: take the pending DONE `user` (an engine event's user pointer),
 * or the one of `owner` when user is NULL; NULL when it is not pending
 * any more (already sent: the owner ended early). */
static struct compute_msg *compute_done_take(struct compute *c, void *user,
					     uint64_t owner)
{
	for (struct compute_msg **p = &c->dones; *p; p = &(*p)->next) {
		struct compute_msg *m = *p;

		if (user ? (void *)m == user : m->owner == owner) {
			*p = m->next;
			m->next = NULL;
			return m;
		}
	}
	return NULL;
}

/* Thread, FREE: the lent pages that hold a finished prompt's full pages
 * (compute_job_cache) go to the prefix cache first; j->release keeps the
 * pages the cache did not adopt. Without memory for the marks, nothing
 * is cached: the pages are released as they would be. */
static void compute_cache_lent(struct compute *c, struct compute_job *j)
{
	uint32_t n_full = KVD_MIN(j->cache_pages, j->n_release), kept = 0;
	bool *taken;

	if (!j->cache_prompt || !n_full || j->quarantine || !c->ep.cache)
		return;
	taken = calloc(j->n_release, sizeof(*taken));
	if (!taken)
		return;
	if (pcache_insert(c->ep.cache, &j->key, j->cache_prompt, j->owner,
			  j->release, 0, n_full, taken)) {
		for (uint32_t i = 0; i < j->n_release; i++)
			if (!taken[i])
				j->release[kept++] = j->release[i];
		j->n_release = kept;
	}
	free(taken);
}

/* Thread: run one job; returns its reply (preallocated with the job). */
static struct compute_msg *compute_run_job(struct compute *c,
					   struct compute_job *j)
{
	struct compute_msg *m = j->reply;
	struct engine_req *req = NULL;

	j->reply = NULL;
	m->owner = j->owner;
	if (j->kind == COMPUTE_JOB_SUBMIT) {
		j->rp.prompt = j->prompt;
		j->rp.table = j->table;
		j->rp.user = j->done;
		m->kind = COMPUTE_MSG_SUBMITTED;
		m->error = engine_submit(c->eng, &j->rp, &req);
		m->req = req;
		m->cached = req ? engine_req_cached(req) : 0;
		if (!m->error) {
			/* in the engine: its DONE waits here until the engine
			 * reports the end, or the owner is freed first */
			j->done->owner = j->owner;
			j->done->nomem = j->nomem;
			j->done->next = c->dones;
			c->dones = j->done;
			j->done = NULL;
		}
		return m;
	}
	/* a freed owner reports nothing more: its DONE, if the engine
	 * never reported the end, goes with it */
	free(compute_done_take(c, NULL, j->owner));
	/* The engine's own word on lent pages, decided here and not from
	 * the DONE the loop may never read (its owner may be freed first,
	 * by an abort or a client gone): a bad tag quarantines them, and
	 * nothing of a failed request is cached. */
	if (j->req && j->release &&
	    (engine_req_integrity_bad(j->req) ||
	     engine_req_finish(j->req, NULL) == ENGINE_FINISH_ERROR)) {
		j->quarantine = j->quarantine || engine_req_integrity_bad(j->req);
		free(j->cache_prompt);
		j->cache_prompt = NULL;
	}
	if (j->req)
		engine_req_free(c->eng, j->req);
	m->kind = COMPUTE_MSG_FREED;
	m->error = 0;
	compute_cache_lent(c, j);
	if (j->release && j->n_release) {
		int rc = j->quarantine ?
			kvpool_quarantine(c->pool, j->owner, j->release, j->n_release) :
			kvpool_release(c->pool, j->owner, j->release, j->n_release);

		/* the pool refused: it and the owner disagree about these
		 * pages, so none may go back to the free list (a second
		 * refusal leaves them where they are: still not free) */
		if (rc && !j->quarantine)
			(void)kvpool_quarantine(c->pool, j->owner, j->release, j->n_release);
		m->error = rc;   /* the loop logs the breach */
	}
	return m;
}

/* Thread: a DONE event. A finished prompt's pages go with it, for prefill
 * to send (also when the first sampled token was the end of sequence);
 * without memory for that copy m->table stays NULL, which the receiver
 * must treat as a failure. */
static void compute_done(struct compute_msg *m, const struct engine_event *ev)
{
	m->kind = COMPUTE_MSG_DONE;
	m->req = ev->req;
	m->pos = ev->pos;
	m->finish = ev->finish;
	m->error = ev->error;
	if ((m->finish == ENGINE_FINISH_PREFILLED || m->finish == ENGINE_FINISH_STOP) &&
	    !m->nomem) {
		uint32_t n_table, n_kv;
		const struct kvpool_ref *t = engine_req_table(ev->req, &n_table, &n_kv);

		uint32_t n_mapped;
		const uint64_t *ids = engine_req_mapped(ev->req, &n_mapped);

		m->table = malloc(sizeof(*t) * n_table);
		if (n_mapped)
			m->mapped = malloc(sizeof(*ids) * n_mapped);
		if (m->table && (!n_mapped || m->mapped)) {
			memcpy(m->table, t, sizeof(*t) * n_table);
			m->n_table = n_table;
			m->n_kv = n_kv;
			if (n_mapped)
				memcpy(m->mapped, ids, sizeof(*ids) * n_mapped);
			m->n_mapped = n_mapped;
		} else {
			free(m->table);
			free(m->mapped);
			m->table = NULL;
			m->mapped = NULL;
		}
	}
}

/* Thread: one engine step's events become messages. A token that cannot
 * be reported (no memory) must not vanish from the owner's stream: the
 * owner ends there, failed with -ENOMEM, through its preallocated DONE,
 * and the engine stops computing it. */
static void compute_step(struct compute *c, struct compute_msg **head,
			 struct compute_msg **tail)
{
	const struct engine_event *ev;
	struct compute_msg *ended = NULL;
	size_t n_ev = 0;
	uint32_t n_seq, n_tok, n_dec, budget;
	double unit_ns;
	uint64_t t0 = kvd_now_ns();

	(void)engine_step(c->eng, &ev, &n_ev);
	engine_last_step(c->eng, &n_seq, &n_tok, &n_dec);
	engine_last_budget(c->eng, &budget, &unit_ns);
	pthread_mutex_lock(&c->mu);
	engine_step_cost(c->eng, &c->cost);
	pthread_mutex_unlock(&c->mu);
	atomic_store_explicit(&c->decoders, n_dec, memory_order_relaxed);
	/* what each step computed and how long it took: with the request
	 * lines' times, where a request's TTFT went */
	KVLOG_DEBUG(c->log, "engine_step", "seqs=%u tokens=%u decoders=%u prompts=%u us=%llu prompt_budget=%lld unit_ns=%.0f",
		    n_seq, n_tok, n_dec, n_seq - n_dec,
		    (unsigned long long)((kvd_now_ns() - t0) / 1000),
		    budget == UINT32_MAX ? -1LL : (long long)budget, unit_ns);
	for (size_t i = 0; i < n_ev; i++) {
		struct compute_msg *done, *m = NULL;

		if (ev[i].kind == ENGINE_EV_DONE) {
			done = compute_done_take(c, ev[i].user, 0);
			if (done) {   /* else it ended early, below */
				compute_done(done, &ev[i]);
				compute_append(head, tail, done);
			}
			continue;
		}
		done = compute_done_take(c, ev[i].user, 0);
		if (!done)
			continue;         /* ended early: nothing more of it */
		if (!done->nomem)   /* its logprobs, when asked, ride with it */
			m = calloc(1, sizeof(*m) + (ev[i].lp ? sizeof(*ev[i].lp) : 0));
		if (!m) {
			struct engine_event fail = ev[i];

			fail.finish = ENGINE_FINISH_ERROR;
			fail.error = -ENOMEM;
			compute_done(done, &fail);
			compute_append(head, tail, done);
			if (!ended)
				ended = done;
			continue;
		}
		/* still running: its DONE goes back to wait */
		done->next = c->dones;
		c->dones = done;
		m->kind = COMPUTE_MSG_TOKEN;
		m->owner = ev[i].owner;
		m->req = ev[i].req;
		m->token = ev[i].token;
		m->pos = ev[i].pos;
		if (ev[i].lp) {
			m->lp = (struct sampler_logprobs *)(m + 1);
			*m->lp = *ev[i].lp;
		}
		compute_append(head, tail, m);
	}
	/* after the events (they live until the next engine call): the
	 * owners ended early compute no more (a no-op for those the engine
	 * finished itself) */
	for (struct compute_msg *m = ended; m; m = m->next)
		if (m->kind == COMPUTE_MSG_DONE && m->finish == ENGINE_FINISH_ERROR &&
		    m->error == -ENOMEM)
			engine_req_cancel(c->eng, m->req);
}

/* Thread: hand messages to the loop. */
static void compute_post(struct compute *c, struct compute_msg *head,
			 struct compute_msg *tail)
{
	if (!head)
		return;
	pthread_mutex_lock(&c->mu);
	if (c->msgs_tail)
		c->msgs_tail->next = head;
	else
		c->msgs = head;
	c->msgs_tail = tail;
	pthread_mutex_unlock(&c->mu);
	uv_async_send(&c->async);
}

static void *compute_main(void *arg)
{
	struct compute *c = arg;

	for (;;) {
		struct compute_job *jobs;
		struct compute_msg *head = NULL, *tail = NULL;
		bool stop;

		pthread_mutex_lock(&c->mu);
		if (engine_idle(c->eng))
			atomic_store_explicit(&c->decoders, 0, memory_order_relaxed);
		while (!c->jobs && !c->stop && engine_idle(c->eng))
			pthread_cond_wait(&c->cv, &c->mu);
		jobs = c->jobs;
		c->jobs = c->jobs_tail = NULL;
		stop = c->stop;
		pthread_mutex_unlock(&c->mu);

		while (jobs) {
			struct compute_job *j = jobs;

			jobs = j->next;
			compute_append(&head, &tail, compute_run_job(c, j));
			compute_job_free(j);
		}
		/* the jobs' replies go before the step: a SUBMITTED reaches
		 * the loop as the step that computes the request's next token
		 * starts (decode streams prefill's first token then) */
		compute_post(c, head, tail);
		head = tail = NULL;
		if (!stop && !engine_idle(c->eng))
			compute_step(c, &head, &tail);
		compute_post(c, head, tail);
		if (stop)
			return NULL;
	}
}

/* ---- the loop side ---------------------------------------------------------- */

static void compute_queue(struct compute *c, struct compute_job *j)
{
	pthread_mutex_lock(&c->mu);
	j->next = NULL;
	if (c->jobs_tail)
		c->jobs_tail->next = j;
	else
		c->jobs = j;
	c->jobs_tail = j;
	pthread_cond_signal(&c->cv);
	pthread_mutex_unlock(&c->mu);
}

struct compute_job *compute_free_job_new(void)
{
	struct compute_job *j = calloc(1, sizeof(*j));

	if (j)
		j->reply = calloc(1, sizeof(*j->reply));
	if (!j || !j->reply) {
		compute_job_free(j);
		return NULL;
	}
	j->kind = COMPUTE_JOB_FREE;
	return j;
}

int compute_submit(struct compute *c, uint64_t owner,
		   const struct engine_req_params *rp, const int32_t *prompt,
		   uint32_t n_prompt, const struct kvpool_ref *table,
		   uint32_t n_table, bool nomem)
{
	struct compute_job *j = calloc(1, sizeof(*j));

	if (!j)
		return -ENOMEM;
	j->kind = COMPUTE_JOB_SUBMIT;
	j->nomem = nomem;
	j->owner = owner;
	j->prompt = malloc(sizeof(int32_t) * n_prompt);
	if (table)
		j->table = malloc(sizeof(*table) * n_table);
	if (rp->sampling.n_logit_bias)
		j->bias = malloc(sizeof(*j->bias) * rp->sampling.n_logit_bias);
	j->reply = calloc(1, sizeof(*j->reply));
	j->done = calloc(1, sizeof(*j->done));
	if (!j->prompt || (table && !j->table) || !j->reply || !j->done ||
	    (rp->sampling.n_logit_bias && !j->bias)) {
		compute_job_free(j);
		return -ENOMEM;
	}
	memcpy(j->prompt, prompt, sizeof(int32_t) * n_prompt);
	if (table)
		memcpy(j->table, table, sizeof(*table) * n_table);
	j->rp = *rp;
	j->rp.owner = owner;
	j->rp.user = NULL;        /* the thread points it at j->done */
	j->rp.prompt = NULL;      /* ... and these at the job's copies */
	j->rp.table = NULL;
	if (rp->cache_key) {
		j->key = *rp->cache_key;
		j->rp.cache_key = &j->key;
	}
	if (j->bias) {
		memcpy(j->bias, rp->sampling.logit_bias,
		       sizeof(*j->bias) * rp->sampling.n_logit_bias);
		j->rp.sampling.logit_bias = j->bias;
	}
	j->rp.n_prompt = n_prompt;
	j->rp.n_table = table ? n_table : 0;
	compute_queue(c, j);
	return 0;
}

void compute_job_cache(struct compute_job *job, const struct pcache_key *key,
		       int32_t *prompt, uint32_t n_full)
{
	free(job->cache_prompt);
	job->key = *key;
	job->cache_prompt = prompt;
	job->cache_pages = prompt ? n_full : 0;
}

void compute_free(struct compute *c, struct compute_job *job, uint64_t owner,
		  struct engine_req *ereq, struct kvpool_ref *release,
		  uint32_t n_release, bool quarantine)
{
	job->kind = COMPUTE_JOB_FREE;
	job->owner = owner;
	job->req = ereq;
	job->release = release;
	job->n_release = release ? n_release : 0;
	job->quarantine = release && quarantine;
	compute_queue(c, job);
}

uint32_t compute_step_tokens(const struct compute *c)
{
	return c->step_tokens;
}

uint32_t compute_prompt_budget(struct compute *c, uint32_t n_dec)
{
	struct stepcost cost;

	if (!c->mu_init)
		return c->step_tokens > n_dec ? c->step_tokens - n_dec : 0;
	pthread_mutex_lock(&c->mu);
	cost = c->cost;
	pthread_mutex_unlock(&c->mu);
	return engine_prompt_budget(&c->ep, c->step_tokens, &cost, n_dec);
}

double compute_decoder_units(struct compute *c)
{
	return 1.0 + (double)c->cost.logits_q8 / 256.0;   /* fixed at start */
}

uint32_t compute_decoders(const struct compute *c)
{
	/* the thread writes it; a stale value only shifts one placement */
	return atomic_load_explicit(&c->decoders, memory_order_relaxed);
}

/* Loop: the thread's messages. After compute_stop (mu gone) nothing is
 * delivered. */
static void compute_async_cb(uv_async_t *a)
{
	struct compute *c = kvd_container_of(a, struct compute, async);
	struct compute_msg *msgs;

	if (!c->mu_init)
		return;
	pthread_mutex_lock(&c->mu);
	msgs = c->msgs;
	c->msgs = c->msgs_tail = NULL;
	pthread_mutex_unlock(&c->mu);
	while (msgs) {
		struct compute_msg *m = msgs;

		msgs = m->next;
		m->next = NULL;
		c->deliver(c->deliver_arg, m);
		free(m->table);
		free(m->mapped);
		free(m);
	}
}

int compute_start(struct compute *c, uv_loop_t *loop, const struct model *m,
		  struct kvpool *pool, const struct engine_params *ep,
		  struct kvlog *log, compute_deliver_fn *deliver, void *arg)
{
	int r;

	c->pool = pool;
	c->log = log;
	c->step_tokens = ep->step_tokens ? ep->step_tokens : ep->max_batch + ep->prefill_chunk;
	c->ep = *ep;
	c->ep.pack_dir = c->ep.model_sha256 = NULL;   /* the caller's */
	atomic_init(&c->decoders, 0);
	c->deliver = deliver;
	c->deliver_arg = arg;
	r = engine_new(&c->eng, m, pool, ep, log);
	if (r)
		return r;
	engine_step_cost(c->eng, &c->cost);
	pthread_mutex_init(&c->mu, NULL);
	pthread_cond_init(&c->cv, NULL);
	c->mu_init = true;
	r = uv_async_init(loop, &c->async, compute_async_cb);
	if (r)
		return r;
	c->async_open = true;
	r = -pthread_create(&c->thread, NULL, compute_main, c);
	if (r)
		return r;
	c->started = true;
	return 0;
}

void compute_stop(struct compute *c)
{
	if (c->started) {
		pthread_mutex_lock(&c->mu);
		c->stop = true;
		pthread_cond_signal(&c->cv);
		pthread_mutex_unlock(&c->mu);
		pthread_join(c->thread, NULL);
		c->started = false;
	}
	/* drop what is queued either way */
	while (c->jobs) {
		struct compute_job *j = c->jobs;

		c->jobs = j->next;
		compute_job_free(j);
	}
	compute_msgs_free(c->msgs);
	compute_msgs_free(c->dones);
	c->msgs = c->dones = NULL;
	c->jobs_tail = NULL;
	c->msgs_tail = NULL;
	if (c->eng) {
		engine_free(c->eng);
		c->eng = NULL;
	}
	if (c->mu_init) {
		pthread_mutex_destroy(&c->mu);
		pthread_cond_destroy(&c->cv);
		c->mu_init = false;
	}
}

bool compute_close(struct compute *c, uv_close_cb cb, void *data)
{
	if (!c->async_open)
		return false;
	c->async_open = false;
	c->async.data = data;
	uv_close((uv_handle_t *)&c->async, cb);
	return true;
}
