/* test_serve_objects.c - the serving layer's objects without a socket:
 * the tenant gate's admission and queueing in front of a role (a test
 * admit function stands for decode's or standalone's), the order a node
 * tears them down in, a request's per-kind part, and a link's state
 * table. A real libuv loop, pool and registry; no listener, no peer, no
 * client connection (a request's client is absent: its answers go
 * nowhere, its failure code is what the test reads).
 */
#include <arpa/inet.h>
#include <check.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conf/config.h"
#include "daemon/node/serve_int.h"
#include "gpu/text/jsongram.h"
#include "gpu/kv/kvmem.h"
#include "gpu/kv/kvpool.h"

static const struct kvpool_geom geom = {
	.page_tokens = 16, .n_layer = 1, .kv_dim = 8, .dtype = KV_DTYPE_F16,
};

struct world {
	struct kvd_daemon *d;
	struct serve *s;
	struct kvmem host;
	struct serve_req *admitted[16];
	unsigned n_admitted;
};

static struct world W;

/* The role's admission: the request holds its slot until the test ends
 * it (a real role would register it and reserve its pages). */
static void test_admit(struct serve_req *r)
{
	ck_assert_uint_lt(W.n_admitted, 16);
	W.admitted[W.n_admitted++] = r;
}

/* node_max_active slots, max_queued per tenant, pool_pages pages */
static void world_up(uint32_t slots, uint32_t max_queued, uint32_t pool_pages)
{
	struct kvd_daemon *d = calloc(1, sizeof(*d));
	struct serve *s = calloc(1, sizeof(*s));

	ck_assert(d && s);
	memset(&W, 0, sizeof(W));
	kvd_config_defaults(&d->cfg);
	d->cfg.role = KVD_ROLE_STANDALONE;
	d->cfg.node_max_active = slots;
	d->cfg.tenant_max_queued = max_queued;
	d->state = KVD_STATE_READY;
	kvlog_init(&d->log, KVLOG_ERROR, 2, "test");
	ck_assert_int_eq(uv_loop_init(&d->loop), 0);
	kvmem_host_init(&W.host);
	ck_assert_int_eq(kvpool_new(&d->pool, &W.host, &geom, pool_pages), 0);
	d->cap.advertised_context = 4096;
	d->cap.pool_tokens = (uint64_t)pool_pages * geom.page_tokens;
	s->d = d;
	s->log = &d->log;
	kvd_list_init(&s->reqs);
	kvd_list_init(&s->links);
	s->reqtab = kvd_daemon_requests(d);
	ck_assert_int_eq(serve__gate_init(s), 0);
	s->admit = test_admit;
	W.d = d;
	W.s = s;
}

static struct serve_req *req(const char *tenant, uint32_t n_prompt, uint32_t max_tokens)
{
	struct serve_req *r = serve__req_new(W.s, SREQ_LOCAL);
	static int32_t next_token = 1;

	ck_assert_ptr_nonnull(r);
	snprintf(r->tenant, sizeof(r->tenant), "%s", tenant);
	r->prompt = calloc(n_prompt, sizeof(*r->prompt));
	ck_assert_ptr_nonnull(r->prompt);
	/* prompts share no prefix (the gate's prefix hold-back stays out) */
	for (uint32_t i = 0; i < n_prompt; i++)
		r->prompt[i] = next_token++;
	r->n_prompt = n_prompt;
	r->max_tokens = max_tokens;
	return r;
}

static bool was_admitted(const struct serve_req *r)
{
	for (unsigned i = 0; i < W.n_admitted; i++)
		if (W.admitted[i] == r)
			return true;
	return false;
}

/* An admitted request ends; the gate pumps from its timer, on the loop. */
static void finish(struct serve_req *r)
{
	serve__req_end(r, true);
	uv_run(&W.d->loop, UV_RUN_NOWAIT);
}

/* The node's teardown order: the gate stops (no pump after), every live
 * request ends, every handle closes; then the loop holds nothing. */
static void world_down(void)
{
	struct serve *s = W.s;
	struct kvd_daemon *d = W.d;

	serve__gate_stop(s);
	while (!kvd_list_empty(&s->reqs))
		serve__req_end(kvd_list_entry(s->reqs.next, struct serve_req, node), false);
	while (s->closes_pending)
		ck_assert_int_ge(uv_run(&d->loop, UV_RUN_ONCE), 0);
	ck_assert_uint_eq(s->n_reqs, 0);
	ck_assert_int_eq(uv_loop_close(&d->loop), 0);
	fairq_deinit(&s->fq);
	kvpool_free(d->pool);
	free(s);
	free(d);
}

/* The slot that comes back goes to the tenant with the fewest admitted
 * requests (per share), not to the oldest waiting request. */
START_TEST(test_fair_order)
{
	struct serve_req *a1, *a2, *a3, *b1;

	world_up(2, 4, 64);
	a1 = req("alice", 20, 8);
	serve__gate_admit(a1);
	a2 = req("alice", 20, 8);
	serve__gate_admit(a2);
	ck_assert(was_admitted(a1) && was_admitted(a2));
	a3 = req("alice", 20, 8);
	serve__gate_admit(a3);
	b1 = req("bob", 20, 8);
	serve__gate_admit(b1);
	/* two slots, both alice's: both wait */
	ck_assert_uint_eq(W.n_admitted, 2);
	ck_assert(a3->fq.waiting && b1->fq.waiting);
	/* a slot comes back: bob (none admitted) before alice's older a3 */
	finish(a1);
	ck_assert_uint_eq(W.n_admitted, 3);
	ck_assert(was_admitted(b1) && !was_admitted(a3));
	finish(b1);
	ck_assert(was_admitted(a3));
	world_down();
}
END_TEST

/* r with q's prompt (the same tenant's: a choice of one n > 1 request) */
static struct serve_req *req_same(const struct serve_req *q, bool shares)
{
	struct serve_req *r = req(q->tenant, q->n_prompt, q->max_tokens);

	memcpy(r->prompt, q->prompt, q->n_prompt * sizeof(*r->prompt));
	r->shares_prompt = shares;
	return r;
}

/* The choices of an HTTP n > 1 request (daemon/front/http_api.c): choice
 * 0 computes the prompt and holds the others (prefix hold-back) until its
 * first token; then every later choice goes at once - a shares_prompt
 * request holds nobody, where a request of its own would hold the next
 * same-prompt request in turn. */
START_TEST(test_choices_share_prompt)
{
	struct serve_req *c0, *c1, *c2, *o1, *o2;

	world_up(8, 8, 256);
	ck_assert(W.d->cfg.cache_enabled);
	c0 = req("alice", 40, 8);
	serve__gate_admit(c0);
	ck_assert(was_admitted(c0) && c0->on_computing);
	c1 = req_same(c0, true);
	serve__gate_admit(c1);
	c2 = req_same(c0, true);
	serve__gate_admit(c2);
	uv_run(&W.d->loop, UV_RUN_NOWAIT);
	ck_assert(c1->fq.waiting && c2->fq.waiting);   /* held behind choice 0 */
	serve__gate_first_token(c0);
	uv_run(&W.d->loop, UV_RUN_NOWAIT);
	ck_assert(was_admitted(c1) && was_admitted(c2));
	ck_assert(!c1->on_computing && !c2->on_computing);
	/* the same without shares_prompt: the first one admitted holds the
	 * second until its own first token */
	o1 = req_same(c0, false);
	serve__gate_admit(o1);
	ck_assert(was_admitted(o1) && o1->on_computing);
	o2 = req_same(c0, false);
	serve__gate_admit(o2);
	uv_run(&W.d->loop, UV_RUN_NOWAIT);
	ck_assert(o2->fq.waiting);
	serve__gate_first_token(o1);
	uv_run(&W.d->loop, UV_RUN_NOWAIT);
	ck_assert(was_admitted(o2));
	world_down();
}
END_TEST

static struct link *link_up(uint64_t serial, uint32_t load);

/* A later choice is made with the role's kind, never its choice 0's: on
 * a decode node choice 0 may have run locally (SREQ_LOCAL: decode
 * reuse, peers.local_prefill) while choice 1 goes to a peer, whose
 * batches, done and abort_ack find only SREQ_DECODE requests - with
 * choice 0's kind it timed out and its abort tore the link down. The
 * rest of it is choice 0's, seed + i; under a grammar it shares the
 * grammar (a reference: each frees its own, ASan sees no leak) and
 * takes its own run. */
START_TEST(test_choice_kind_and_fields)
{
	static const struct sampler_bias bias[] = { { .id = 5, .bias = -100.0f } };
	struct serve_req *c0, *c1, *c2;
	struct jgram_run *run;

	world_up(8, 8, 256);
	W.d->cfg.role = KVD_ROLE_DECODE;
	c0 = req("alice", 40, 8);
	c0->kind = SREQ_LOCAL;           /* placed here (decode_run_local) */
	snprintf(c0->public_id, sizeof(c0->public_id), "cmpl-x");
	snprintf(c0->cache_salt, sizeof(c0->cache_salt), "salt");
	c0->client_id = 7;
	c0->sp.seed = 42;
	c0->bias = malloc(sizeof(bias));
	ck_assert_ptr_nonnull(c0->bias);
	memcpy(c0->bias, bias, sizeof(bias));
	c0->sp.logit_bias = c0->bias;
	c0->sp.n_logit_bias = 1;
	ck_assert_int_eq(jgram_new_object(&c0->gram), 0);
	ck_assert_int_eq(jgram_run_new(&c0->jrun, c0->gram, NULL), 0);
	ck_assert_int_eq(jgram_run_new(&run, c0->gram, NULL), 0);
	c1 = serve__req_choice_new(c0, 1, run);
	ck_assert_ptr_nonnull(c1);
	ck_assert_int_eq(c1->kind, SREQ_DECODE);
	ck_assert(c1->shares_prompt && c1->sp.seed == 43 && c1->client_id == 7);
	ck_assert_str_eq(c1->public_id, "cmpl-x");
	ck_assert_str_eq(c1->cache_salt, "salt");
	ck_assert_str_eq(c1->tenant, "alice");
	ck_assert(c1->n_prompt == 40 && c1->prompt != c0->prompt &&
		  !memcmp(c1->prompt, c0->prompt, 40 * sizeof(*c1->prompt)));
	ck_assert(c1->bias != c0->bias && c1->sp.logit_bias == c1->bias &&
		  c1->sp.n_logit_bias == 1 && c1->bias[0].id == 5);
	ck_assert(c1->gram == c0->gram && c1->jrun == run);
	serve__req_end(c0, false);       /* choice 0 goes first: c1's grammar stays */
	while (W.s->closes_pending)
		ck_assert_int_ge(uv_run(&W.d->loop, UV_RUN_ONCE), 0);
	ck_assert(jgram_run_feed(c1->jrun, "{}", 2) && jgram_run_complete(c1->jrun));
	/* a standalone node's choices are local; no grammar, no run */
	W.d->cfg.role = KVD_ROLE_STANDALONE;
	c0 = req("alice", 40, 8);
	c2 = serve__req_choice_new(c0, 2, NULL);
	ck_assert_ptr_nonnull(c2);
	ck_assert_int_eq(c2->kind, SREQ_LOCAL);
	ck_assert(c2->gram == NULL && c2->jrun == NULL && c2->sp.seed == 2 && !c2->bias);
	world_down();
}
END_TEST

/* On a decode node with several prefill peers the hold-back is only a
 * choice's behind its own choice 0 (the same public id: it goes to
 * choice 0's peer); a same-prompt request of its own, or a choice of
 * another exchange, is not held (it may go to another peer). */
START_TEST(test_choices_held_several_peers)
{
	struct serve_req *c0, *c1, *other, *own;
	struct link *a, *b;

	world_up(8, 8, 256);
	W.d->cfg.role = KVD_ROLE_DECODE;
	W.d->cfg.n_peers_prefill = 2;
	a = link_up(1, 0);               /* the path's limit: the peers' */
	b = link_up(2, 0);
	a->hello.context = b->hello.context = 4096;
	a->hello.pool_tokens = b->hello.pool_tokens = 4096;
	c0 = req("alice", 40, 8);
	snprintf(c0->public_id, sizeof(c0->public_id), "cmpl-x");
	serve__gate_admit(c0);
	ck_assert(was_admitted(c0) && c0->on_computing);
	own = req_same(c0, false);
	serve__gate_admit(own);
	other = req_same(c0, true);
	snprintf(other->public_id, sizeof(other->public_id), "cmpl-y");
	serve__gate_admit(other);
	c1 = req_same(c0, true);
	snprintf(c1->public_id, sizeof(c1->public_id), "cmpl-x");
	serve__gate_admit(c1);
	uv_run(&W.d->loop, UV_RUN_NOWAIT);
	ck_assert(was_admitted(own) && was_admitted(other));
	ck_assert(c1->fq.waiting);       /* held behind its choice 0 */
	serve__gate_first_token(c0);
	uv_run(&W.d->loop, UV_RUN_NOWAIT);
	ck_assert(was_admitted(c1));
	kvd_list_del(&a->node);
	kvd_list_del(&b->node);
	free(a);
	free(b);
	world_down();
}
END_TEST

START_TEST(test_queue_bound)
{
	struct serve_req *a1, *a2, *a3;

	world_up(1, 1, 64);
	a1 = req("alice", 20, 8);
	serve__gate_admit(a1);
	a2 = req("alice", 20, 8);
	serve__gate_admit(a2);
	ck_assert(a2->fq.waiting);
	/* one past alice's max_queued: refused at once, typed */
	a3 = req("alice", 20, 8);
	serve__gate_admit(a3);
	/* ended, not freed yet: its handle closes on the next loop turn */
	ck_assert(a3->ended);
	ck_assert_int_eq(a3->fail_code, PROTO_ERR_OVERLOADED);
	ck_assert_uint_eq(W.d->counters.rejected[KVD_REJECT_OVERLOADED], 1);
	ck_assert(!was_admitted(a3));
	world_down();
}
END_TEST

/* A request waits for pages, not only for a slot: the gate never admits
 * more than the pool holds (invariant 3, before the pool's own word). */
START_TEST(test_waits_for_pages)
{
	struct serve_req *a, *b;

	world_up(4, 4, 4);          /* 4 pages of 16 tokens */
	a = req("alice", 40, 8);    /* 3 pages */
	serve__gate_admit(a);
	ck_assert(was_admitted(a));
	b = req("bob", 30, 8);      /* 3 pages: only 1 left */
	serve__gate_admit(b);
	ck_assert(b->fq.waiting && !was_admitted(b));
	serve__gate_settle(a);      /* the engine reserved a's pages ... */
	ck_assert_int_eq(kvpool_reserve(W.d->pool, 7, 3, (struct kvpool_ref[3]){ 0 }), 0);
	finish(a);                  /* ... and a ended: still no pages */
	ck_assert(!was_admitted(b));
	world_down();
}
END_TEST

START_TEST(test_drain_refuses_waiting)
{
	struct serve_req *a, *b;

	world_up(1, 4, 64);
	a = req("alice", 20, 8);
	serve__gate_admit(a);
	b = req("bob", 20, 8);
	serve__gate_admit(b);
	ck_assert(b->fq.waiting);
	W.d->state = KVD_STATE_DRAINING;
	finish(a);
	/* the pump runs after a's end and refuses, never admits (b is freed
	 * by now: what it was told is in the counters) */
	ck_assert(!was_admitted(b));
	ck_assert_uint_eq(W.d->counters.rejected[KVD_REJECT_DRAINING], 1);
	ck_assert_uint_eq(W.s->n_reqs, 0);
	world_down();
}
END_TEST

/* What the node holds at stop: admitted and waiting requests alike end,
 * the queue empties, every handle closes (world_down checks the loop). */
START_TEST(test_teardown_with_waiting)
{
	struct serve_req *w[3];

	world_up(1, 4, 64);
	for (int i = 0; i < 3; i++) {
		w[i] = req(i ? "bob" : "alice", 20, 8);
		serve__gate_admit(w[i]);
	}
	ck_assert_uint_eq(W.n_admitted, 1);
	ck_assert_uint_eq(W.s->fq.queued, 2);
	world_down();
}
END_TEST

START_TEST(test_parts_by_kind)
{
	struct serve_req *r;

	world_up(1, 4, 64);
	r = req("alice", 4, 4);
	sreq_d(r)->n_table = 3;     /* a local request has the decode part */
	ck_assert_uint_eq(sreq_dc(r)->n_table, 3);
	world_down();
}
END_TEST

/* Asking a decode request for the prefill part stops the node. */
START_TEST(test_wrong_part_aborts)
{
	struct serve_req *r;

	world_up(1, 4, 64);
	r = req("alice", 4, 4);
	(void)sreq_p(r);
}
END_TEST

static struct link *link_of(enum link_side side)
{
	struct link *l = calloc(1, sizeof(*l));

	ck_assert_ptr_nonnull(l);
	l->s = W.s;
	l->side = side;
	snprintf(l->addr, sizeof(l->addr), "test");
	return l;
}

/* A dialled link, up, in the node's list, with that serial and load. */
static struct link *link_up(uint64_t serial, uint32_t load)
{
	static const enum link_state up[] = {
		LINK_CONNECTING, LINK_CHALLENGE, LINK_PROOF, LINK_HELLO,
		LINK_BINDING, LINK_UP,
	};
	struct link *l = link_of(LINK_DIAL);

	for (size_t i = 0; i < sizeof(up) / sizeof(up[0]); i++)
		serve__link_set_state(l, up[i]);
	l->serial = serial;
	l->load = load;
	kvd_list_init(&l->reqs);
	kvd_list_add_tail(&W.s->links, &l->node);
	return l;
}

/* With several prefill peers, the later choices of an n > 1 request go
 * to the peer choice 0 was placed on (its prefix cache holds the
 * prompt), not by load - while that peer takes requests: draining,
 * refused lately or the one a failover leaves, they go by load again;
 * a choice of another exchange, or a request of its own, goes by load;
 * with choice 0 gone, a placed sibling choice names the peer. */
START_TEST(test_choices_follow_choice0_peer)
{
	struct link *a, *b;
	struct serve_req *c0, *c1, *c2, *other;

	world_up(8, 8, 256);
	W.d->cfg.role = KVD_ROLE_DECODE;
	a = link_up(1, 0);               /* idle: the load's choice */
	b = link_up(2, 5);
	c0 = req("alice", 40, 8);
	snprintf(c0->public_id, sizeof(c0->public_id), "cmpl-x");
	ck_assert_ptr_eq(serve__decode_pick_peer(W.s, c0, NULL), a);
	c0->peer_serial = b->serial;     /* placed on b (b was idle then) */
	c1 = req_same(c0, true);
	snprintf(c1->public_id, sizeof(c1->public_id), "cmpl-x");
	ck_assert_ptr_eq(serve__decode_pick_peer(W.s, c1, NULL), b);
	/* not a choice of it: by load */
	other = req_same(c0, true);
	snprintf(other->public_id, sizeof(other->public_id), "cmpl-y");
	ck_assert_ptr_eq(serve__decode_pick_peer(W.s, other, NULL), a);
	c1->shares_prompt = false;
	ck_assert_ptr_eq(serve__decode_pick_peer(W.s, c1, NULL), a);
	c1->shares_prompt = true;
	/* b leaves the placement: by load */
	ck_assert_ptr_eq(serve__decode_pick_peer(W.s, c1, b), a);
	b->draining = true;
	ck_assert_ptr_eq(serve__decode_pick_peer(W.s, c1, NULL), a);
	b->draining = false;
	b->refused_draining_ns = kvd_now_ns();
	ck_assert_ptr_eq(serve__decode_pick_peer(W.s, c1, NULL), a);
	b->refused_draining_ns = 0;
	/* choice 0 gone: choice 1, placed on b, names it for choice 2 */
	c1->peer_serial = b->serial;
	serve__req_end(c0, true);
	c2 = req_same(c1, true);
	snprintf(c2->public_id, sizeof(c2->public_id), "cmpl-x");
	ck_assert_ptr_eq(serve__decode_pick_peer(W.s, c2, NULL), b);
	kvd_list_del(&a->node);
	kvd_list_del(&b->node);
	free(a);
	free(b);
	world_down();
}
END_TEST

/* A dialled link's whole life along the table's edges, twice. */
START_TEST(test_link_life)
{
	static const enum link_state dial[] = {
		LINK_CONNECTING, LINK_CHALLENGE, LINK_PROOF, LINK_HELLO,
		LINK_BINDING, LINK_UP, LINK_CLOSING, LINK_IDLE,
		LINK_CONNECTING, LINK_HELLO, LINK_CLOSING, LINK_IDLE,
	};
	static const enum link_state accept[] = {
		LINK_FIRST, LINK_PROOF, LINK_HELLO, LINK_BINDING, LINK_UP,
		LINK_CLOSING,
	};
	struct link *l;

	world_up(1, 4, 64);
	l = link_of(LINK_DIAL);
	for (size_t i = 0; i < sizeof(dial) / sizeof(dial[0]); i++) {
		serve__link_set_state(l, dial[i]);
		ck_assert_int_eq(l->state, dial[i]);
		ck_assert(link_is_up(l) == (dial[i] == LINK_UP));
		ck_assert(link_is_open(l) == (dial[i] != LINK_IDLE && dial[i] != LINK_CLOSING));
	}
	free(l);
	l = link_of(LINK_ACCEPT);
	for (size_t i = 0; i < sizeof(accept) / sizeof(accept[0]); i++) {
		serve__link_set_state(l, accept[i]);
		ck_assert(link_is_matched(l) == (accept[i] == LINK_BINDING ||
						 accept[i] == LINK_UP));
	}
	ck_assert_str_eq(serve__link_state_name(l->state), "closing");
	free(l);
	world_down();
}
END_TEST

/* Up without the hellos: no such edge, the node stops. */
START_TEST(test_link_skip_aborts)
{
	struct link *l;

	world_up(1, 4, 64);
	l = link_of(LINK_DIAL);
	serve__link_set_state(l, LINK_CONNECTING);
	serve__link_set_state(l, LINK_UP);
}
END_TEST

/* An accepted link is freed once closed, never reconnected. */
START_TEST(test_link_accept_never_idle)
{
	struct link *l;

	world_up(1, 4, 64);
	l = link_of(LINK_ACCEPT);
	serve__link_set_state(l, LINK_FIRST);
	serve__link_set_state(l, LINK_CLOSING);
	serve__link_set_state(l, LINK_IDLE);
}
END_TEST

/* A port nobody listens on: connecting is refused at once. */
static int closed_port(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0), port;

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
	port = ntohs(a.sin_port);
	close(fd);
	return port;
}

static bool dialled(struct serve *s, struct link *l)
{
	struct kvd_list *e;

	kvd_list_for_each(e, &s->links)
		if (kvd_list_entry(e, struct link, node) == l)
			return true;
	return false;
}

/* Run the loop until l is idle (its refused connection closed). */
static void until_idle(struct link *l)
{
	for (int i = 0; i < 2000 && l->state != LINK_IDLE; i++)
		ck_assert_int_ge(uv_run(&W.d->loop, UV_RUN_ONCE), 0);
	ck_assert_int_eq(l->state, LINK_IDLE);
}

/* peers by name (peerdns.c): a drained dialled link takes no request
 * (link_takes_requests), is not redialled, and the tick closes it for
 * good once none of its requests is left - its retry timer too, so the
 * loop closes clean; taken back before that, it dials again. */
START_TEST(test_link_drain)
{
	static const struct link_ops ops = { 0 };
	struct serve *s;
	struct link *l, *m;
	char addr[32];

	world_up(1, 4, 64);
	s = W.s;
	s->d->cfg.role = KVD_ROLE_DECODE;
	snprintf(addr, sizeof(addr), "127.0.0.1:%d", closed_port());
	ck_assert_int_eq(serve__link_dial(s, addr, &ops, NULL), 0);
	ck_assert_int_eq(serve__link_dial(s, addr, &ops, NULL), 0);
	l = kvd_list_entry(s->links.next, struct link, node);
	m = kvd_list_entry(s->links.next->next, struct link, node);
	until_idle(l);
	until_idle(m);
	/* m drains too, with a request on it, until its turn below */
	serve__link_drain(m, true);
	m->n_reqs = 1;

	/* an up link takes requests unless it drains */
	l->state = LINK_UP;
	ck_assert(link_takes_requests(l));
	l->draining = true;
	ck_assert(!link_takes_requests(l));
	l->draining = false;
	l->state = LINK_IDLE;

	/* drained with a request on it: kept; once it is gone: closed */
	serve__link_drain(l, true);
	l->n_reqs = 1;
	serve__link_tick(s);
	ck_assert(dialled(s, l));
	/* the retry timers fire: no redial while draining */
	while (uv_is_active((uv_handle_t *)&l->retry) || uv_is_active((uv_handle_t *)&m->retry))
		ck_assert_int_ge(uv_run(&W.d->loop, UV_RUN_ONCE), 0);
	ck_assert_int_eq(l->state, LINK_IDLE);
	ck_assert_int_eq(m->state, LINK_IDLE);
	l->n_reqs = 0;
	serve__link_tick(s);
	ck_assert(!dialled(s, l));        /* retired: freed once closed */
	ck_assert(dialled(s, m));

	/* taken back before the tick closed it: it dials again */
	m->n_reqs = 0;
	serve__link_drain(m, false);
	for (int i = 0; i < 2000 && m->state == LINK_IDLE; i++)
		ck_assert_int_ge(uv_run(&W.d->loop, UV_RUN_ONCE), 0);
	ck_assert_int_ne(m->state, LINK_IDLE);
	serve__link_tick(s);
	ck_assert(dialled(s, m));
	s->stopping = true;
	serve__link_stop(s);
	ck_assert(kvd_list_empty(&s->links));
	world_down();
}
END_TEST

int main(void)
{
	Suite *s = suite_create("serve_objects");
	TCase *tc = tcase_create("core");
	SRunner *sr;
	int failed;

	tcase_add_test(tc, test_fair_order);
	tcase_add_test(tc, test_queue_bound);
	tcase_add_test(tc, test_choices_share_prompt);
	tcase_add_test(tc, test_choices_follow_choice0_peer);
	tcase_add_test(tc, test_choices_held_several_peers);
	tcase_add_test(tc, test_choice_kind_and_fields);
	tcase_add_test(tc, test_waits_for_pages);
	tcase_add_test(tc, test_drain_refuses_waiting);
	tcase_add_test(tc, test_teardown_with_waiting);
	tcase_add_test(tc, test_parts_by_kind);
	tcase_add_test_raise_signal(tc, test_wrong_part_aborts, SIGABRT);
	tcase_add_test(tc, test_link_life);
	tcase_add_test_raise_signal(tc, test_link_skip_aborts, SIGABRT);
	tcase_add_test_raise_signal(tc, test_link_accept_never_idle, SIGABRT);
	tcase_add_test(tc, test_link_drain);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
