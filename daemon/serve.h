/* serve.h - disaggregated serving: the client API, the prefill/decode
 * peer protocol and the KV transfer, on one node's loop.
 *
 * serve_start() reads the node's role and config and opens what that role
 * serves (net/PROTOCOL.md):
 *   standalone  client listener (listen.client); compute local
 *   decode      client listener; connections to every peers.prefill
 *   prefill     peer listener (listen.peer)
 * It binds the model and tokenizer, starts one compute thread that owns
 * the engine (no compute ever runs on the loop thread), and registers a
 * stop hook (kvd_daemon_on_stop) that closes every handle, aborts what is
 * in flight and joins the thread. Fault points (tests) are read from the
 * KVD_FAULT environment variable (net/fault.h).
 *
 * Returns 0, a negative errno (listener could not bind, thread could not
 * start) or KVD_E_MODEL (model or tokenizer unusable); on error nothing
 * is left running and the caller stops the node.
 *
 * Thread: loop thread only.
 */
#pragma once

struct kvd_daemon;

int serve_start(struct kvd_daemon *d);
