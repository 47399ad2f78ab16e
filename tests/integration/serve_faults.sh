#!/usr/bin/env bash
# Faults during the KV transfer (fault points, test builds only): one
# corrupted byte in a batch, a short transfer, the data connection cut
# mid-batch, a client that disconnects mid-transfer, prefill SIGKILLed
# mid-transfer. After each: every request reached a terminal state, page
# accounting is zero on both nodes, and later requests are correct
# (equal to their offline runs). Corruption and short transfers must end
# in INTEGRITY with no token emitted. Every wait is on a condition; every
# log check reads only what a node wrote after the action under test
# (log_mark). The keyed links here only authenticate, so they send
# batches zero-copy (the MAC streamed over the pool's pages);
# serve_batch_faults.sh runs the transport's faults on both paths.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/serve_lib.sh"

grep -q "KVD_FAULT_POINTS 1" "$KVD_BUILD/kvd_build.h" || skip "built without fault points"
gen_model "$T/m.gguf"
MODEL=$T/m.gguf
PROMPT=$(seq -s, 10 109)          # 100 tokens: 7 pages of 16
# 16 KiB batches hold one 8 KiB page: every request takes 7 batches
SHORT=$(seq -s, 10 57)            # 48 tokens: 3 pages (0.9 s at slow_batch)
pair pf df "$MODEL" "transfer.max_batch_bytes=16K" -- "transfer.max_batch_bytes=16K" \
	"transfer.prefill_timeout_ms=1500" "transfer.transfer_timeout_ms=1500"
REF=$(offline --model "$MODEL" --prompt "The end of the story" --max-tokens 12 --temperature 0.9 --seed 3)

# restart_prefill [KVD_FAULT spec]: stop prefill, start it again; true
# once decode logged a peer_up after the old process was gone (a missing
# or silent log is never "up").
restart_prefill() {
	local mark
	stop_node pf
	mark=$(log_mark "$T/df.log")
	if [ -n "${1:-}" ]; then start_node pf "KVD_FAULT=$1"; else start_node pf; fi
	wait_log "$T/df.log" "event=peer_up " 15 "$mark"
}

# ask: one 7-page request; its answer in OUT; MD and MP: where decode's
# and prefill's logs stood before it
ask() {
	MD=$(log_mark "$T/df.log")
	MP=$(log_mark "$T/pf.log")
	OUT=$(gen "$C_PORT" --tokens "$PROMPT" --max-tokens 8 || true)
}
err_is() { [ "$(echo "$OUT" | json_get error)" = "$1" ]; }
dlog() { log_has "$T/df.log" "$1" "$MD"; }   # decode logged it after ask
plog() { log_has "$T/pf.log" "$1" "$MP"; }  # prefill logged it after ask

QUAR=0                            # pages decode is expected to have quarantined
after() { # after LABEL: terminal, zero pages, correct output
	local label=$1 out
	check "$label: zero pages held and nothing in flight on decode" settle df
	check "$label: zero pages held and nothing in flight on prefill" settle pf
	check "$label: decode quarantined exactly the expected pages ($QUAR)" \
		test "$(status_get df pool.quarantined)" = "$QUAR"
	check "$label: prefill quarantined nothing" test "$(status_get pf pool.quarantined)" = 0
	out=$(gen "$C_PORT" --prompt "The end of the story" --max-tokens 12 --temperature 0.9 --seed 3 || true)
	check "$label: a later request equals its offline run" same_ids "$out" "$REF"
}

start_node df
check "corrupt_batch: prefill up" restart_prefill corrupt_batch:1
ask
check "corrupt_batch: INTEGRITY reaches the client" err_is INTEGRITY
check "corrupt_batch: no token emitted (the request ran)" ran_no_token "$OUT" df "$MD"
# keyed link: the AEAD tag catches the flipped byte first (auth_failed);
# keyless: XXH3 does (checksum_mismatch)
check "corrupt_batch: decode logged the checksum failure" dlog "event=batch_checksum .*error=(checksum_mismatch|auth_failed)"
# the header of a corrupt batch is not trusted: the data stream is broken
check "corrupt_batch: decode tore the peer down" dlog "event=peer_down .*failed (its checksum|authentication)"
check "corrupt_batch: prefill saw the connection go" wait_log "$T/pf.log" "event=peer_down" 5 "$MP"
check "corrupt_batch: prefill survived writing into the torn-down connection" kill -0 "$PID_pf"
check "corrupt_batch: counted as an integrity failure" test "$(status_get df counters.integrity_failures)" -ge 1
check "corrupt_batch: decode reconnected" wait_log "$T/df.log" "event=peer_up " 15 "$MD"
after corrupt_batch

# the same corruption under a request whose first token decode draws
# itself (a penalty: dreq_recompute): the batch check comes first, so the
# recompute's re-tag never covers bytes that were not checked
check "corrupt_batch+recompute: prefill up" restart_prefill corrupt_batch:1
MD=$(log_mark "$T/df.log")
OUT=$(gen "$C_PORT" --tokens "$PROMPT" --max-tokens 8 --frequency-penalty 0.5 || true)
check "corrupt_batch+recompute: INTEGRITY reaches the client" err_is INTEGRITY
check "corrupt_batch+recompute: decode logged the checksum failure" \
	dlog "event=batch_checksum .*error=(checksum_mismatch|auth_failed)"
check "corrupt_batch+recompute: no recompute of unchecked KV" bash -c \
	"! tail -c +$((MD + 1)) '$T/df.log' | grep -q 'event=decode_recompute '"
check "corrupt_batch+recompute: decode reconnected" wait_log "$T/df.log" "event=peer_up " 15 "$MD"
out=$(gen "$C_PORT" --tokens "$PROMPT" --max-tokens 8 --frequency-penalty 0.5 || true)
check "corrupt_batch+recompute: the same request then answers, recomputed" \
	test "$(echo "$out" | json_get error)" = "" -a \
	"$(log_count "$T/df.log" "event=decode_recompute " "$MD")" -ge 1
after corrupt_batch+recompute

check "short_transfer: prefill up" restart_prefill short_transfer:1
ask
check "short_transfer: INTEGRITY reaches the client" err_is INTEGRITY
check "short_transfer: the message says short transfer" grep -q "short transfer" <<<"$(echo "$OUT" | json_get message)"
check "short_transfer: no token emitted, never decoded (the request ran)" ran_no_token "$OUT" df "$MD"
after short_transfer

check "cut_peer_mid_batch: prefill up" restart_prefill cut_peer_mid_batch:1
ask
check "cut_peer_mid_batch: a typed error reaches the client" err_is INTERNAL
check "cut_peer_mid_batch: no token emitted (the request ran)" ran_no_token "$OUT" df "$MD"
check "cut_peer_mid_batch: prefill cut the batch (zero-copy path)" plog "event=fault point=cut_peer_mid_batch .*path=zero_copy"
check "cut_peer_mid_batch: decode saw the cut" dlog "event=peer_down .*data connection cut mid-batch"
check "cut_peer_mid_batch: decode reconnected" wait_log "$T/df.log" "event=peer_up " 15 "$MD"
after cut_peer_mid_batch

check "stale_generation: prefill up" restart_prefill stale_generation:1
ask
check "stale_generation: INTEGRITY reaches the client" err_is INTEGRITY
check "stale_generation: no token emitted (the request ran)" ran_no_token "$OUT" df "$MD"
check "stale_generation: decode refused the page by its generation" dlog "event=request_failed .*code=INTEGRITY .*not the request's page"
after stale_generation

check "nan_kv: prefill up" restart_prefill nan_kv:1
ask
check "nan_kv: INTEGRITY reaches the client" err_is INTEGRITY
check "nan_kv: no token emitted (the request ran)" ran_no_token "$OUT" df "$MD"
check "nan_kv: decode refused the batch for its non-finite K/V" dlog "event=request_failed .*code=INTEGRITY .*non-finite K/V"
after nan_kv

check "bad_tag: prefill up" restart_prefill bad_tag:1
ask
check "bad_tag: INTEGRITY reaches the client" err_is INTEGRITY
check "bad_tag: no token emitted (the request ran)" ran_no_token "$OUT" df "$MD"
check "bad_tag: caught by the tag check at mark_ready" dlog "event=request_failed .*code=INTEGRITY .*failed the tag check"
check "bad_tag: decode quarantined the 7 prefix pages" dlog "event=pages_quarantined .*pages=7 reason=tag_check"
QUAR=7
after bad_tag

# --- abort handshake: pages stay fenced until prefill's abort_ack ----------
check "slow_abort_ack: prefill up" restart_prefill stale_generation:1,slow_abort_ack:1
ask
check "slow_abort_ack: INTEGRITY reaches the client" err_is INTEGRITY
f=$(status_get df pool.fenced)
# fenced while the ack is pending: judged only if the ack had not come by
# the time we looked (a loaded machine may be slower than the 1 s delay)
if ! dlog "event=abort_done "; then
	check "slow_abort_ack: decode keeps the prefix pages fenced while the ack is pending ($f)" test "$f" -gt 0
fi
check "slow_abort_ack: prefill delayed its ack" plog "point=slow_abort_ack"
# the pages stayed fenced until the ack that came a second late: decode's
# own measure, whatever the machine's load did to this script's timing
check "slow_abort_ack: decode ended the abort handshake" wait_log "$T/df.log" "event=abort_done " 10 "$MD"
# abort_ack carries the batches prefill posted (the count a verbs fence
# waits for): the stale batch was posted, and decode accepted none
check "slow_abort_ack: abort_ack named the batches prefill posted" \
	dlog "event=abort_acked id=[0-9]* tenant=default peer=[^ ]* batches_posted=[1-9][0-9]* batches_received=0"
fms=$(log_since "$T/df.log" "$MD" | grep -o 'event=abort_done id=[0-9]* tenant=default fenced_ms=[0-9]*' | tail -1 | sed 's/.*fenced_ms=//' || true)
check "slow_abort_ack: decode kept the prefix pages fenced until the delayed ack (${fms:-?} ms >= 900)" \
	test "${fms:-0}" -ge 900
after slow_abort_ack

# --- phase timeout: prefill slower than transfer.prefill_timeout_ms ---------
check "timeout: prefill up (300 ms per batch)" restart_prefill slow_batch
ask
check "timeout: TIMEOUT reaches the client" err_is TIMEOUT
check "timeout: no token emitted (the request ran)" ran_no_token "$OUT" df "$MD"
check "timeout: decode aborted the transfer" dlog "event=transfer_abort .*code=TIMEOUT"

check "timeout: zero pages held on decode" settle df
check "timeout: zero pages held on prefill" settle pf

# --- kvctl abort ID mid-transfer: the normal failure path -------------------
# prefill still sends a batch per 300 ms: the 3-page request is in its
# transfer from decode's prefill_sent for about a second
failed0=$(status_get df counters.failed)
MD=$(log_mark "$T/df.log")
"$KVCTL" generate --server "127.0.0.1:$C_PORT" --json --tokens "$SHORT" --max-tokens 8 >"$T/abort.out" 2>&1 &
cpid=$!
PIDS+=($cpid)
wait_log "$T/df.log" "event=prefill_sent " 10 "$MD" || true
id=$(last_sent_id df "$MD")
check "kvctl abort: the admin plane finds the serving request (${id:-none})" \
	quiet "$KVCTL" --socket "$T/df.sock" abort "${id:-0}"
wait $cpid 2>/dev/null || true
OUT=$(cat "$T/abort.out")
check "kvctl abort: the client gets a typed error" err_is INTERNAL
check "kvctl abort: no token emitted (the request ran)" ran_no_token "$OUT" df "$MD"
check "kvctl abort: decode aborted the transfer (abort handshake)" \
	dlog "event=transfer_abort id=$id .*code=INTERNAL"
check "kvctl abort: counted as failed" test "$(status_get df counters.failed)" = $((failed0 + 1))
check "kvctl abort: zero pages held afterwards on decode" settle df
check "kvctl abort: zero pages held afterwards on prefill" settle pf

# --- client disconnect mid-transfer (invariant 8) -------------------------
MD=$(log_mark "$T/df.log")
"$KVCTL" generate --server "127.0.0.1:$C_PORT" --json --tokens "$SHORT" --max-tokens 8 >"$T/gone.out" 2>&1 &
cpid=$!
PIDS+=($cpid)
wait_log "$T/df.log" "event=prefill_sent " 10 "$MD" || true
id=$(last_sent_id df "$MD")
check "client gone: the request reached its transfer (${id:-none})" test -n "$id"
MK=$(log_mark "$T/df.log")
kill -KILL $cpid 2>/dev/null || true
wait $cpid 2>/dev/null || true
check "client gone: killed while the transfer was still going" \
	bash -c '! head -c "$1" | grep -q "event=transfer_done id=$2 "' _ "$((MK - MD))" "$id" \
	< <(log_since "$T/df.log" "$MD")
# A killed client's FIN looks like a half-close (whose answers kvd still
# writes, net/PROTOCOL.md s. 1): decode learns the client is gone when a
# write fails (client_gone), or writes the few answers of this small
# model into the dead socket first (request_done) - either way after the
# transfer, which is never cut in half, and the request ends.
check "client gone: the transfer still completed (not cut in half)" wait_log "$T/df.log" "event=transfer_done id=$id " 10 "$MK"
check "client gone: the request ended" \
	wait_log "$T/df.log" "event=(client_gone|request_done) id=$id " 10 "$MD"
check "client gone: prefill released after decode's release_ack" settle pf
after client_gone

# --- prefill SIGKILLed mid-transfer ----------------------------------------
# (prefill still sends a batch per 300 ms: killed inside the transfer)
MD=$(log_mark "$T/df.log")
"$KVCTL" generate --server "127.0.0.1:$C_PORT" --json --tokens "$PROMPT" --max-tokens 8 >"$T/kill.out" 2>&1 &
cpid=$!
PIDS+=($cpid)
wait_log "$T/df.log" "event=prefill_sent " 10 "$MD" || true
kill -KILL "$PID_pf"
wait "$PID_pf" 2>/dev/null || true
wait $cpid 2>/dev/null || true
OUT=$(cat "$T/kill.out")
check "prefill killed: a typed error reaches the client" err_is INTERNAL
check "prefill killed: no token emitted (the request ran)" ran_no_token "$OUT" df "$MD"
check "prefill killed: decode failed it for the lost peer" \
	dlog "event=request_failed .*code=INTERNAL .*lost during the transfer"
check "prefill killed: decode holds no page and nothing in flight" settle df
check "prefill killed: prefill restarts and pairs again" restart_prefill
after prefill_killed

# --- abort handshake: decode's abort crosses a submit that then fails ------
# prefill's submit is stuck past decode's prefill timeout, then refused:
# prefill must still answer the abort (no abort_ack_timeout, peer kept)
check "stuck_submit: prefill up" restart_prefill stuck_submit:1
downs=$(log_count "$T/df.log" "event=peer_down")
ask
check "stuck_submit: TIMEOUT reaches the client" err_is TIMEOUT
check "stuck_submit: prefill's submit was stuck" plog "point=stuck_submit"
check "stuck_submit: the refused submit reached decode (3 s)" wait_log "$T/pf.log" "event=prefill_reject .*OVERLOADED" 5 "$MP"
# the abort ends one way or the other within release_timeout_ms (2 s)
check "stuck_submit: decode's abort handshake ended" \
	wait_log "$T/df.log" "event=(abort_done|abort_ack_timeout) " 10 "$MD"
check "stuck_submit: decode got its abort_ack (no timeout)" \
	test "$(log_count "$T/df.log" "event=abort_ack_timeout" "$MD")" = 0
check "stuck_submit: the peer connection survived" \
	test "$(log_count "$T/df.log" "event=peer_down")" = "$downs"
after stuck_submit

# --- the compute thread has no memory for a request's messages -------------
# prefill's engine computes the prompt, but its token cannot be reported:
# the request ends at once, failed, pages back (a dropped DONE used to
# leave it to decode's prefill timeout)
check "compute_nomem: prefill up" restart_prefill compute_nomem:1
ask
check "compute_nomem: INTERNAL reaches the client" err_is INTERNAL
check "compute_nomem: no token emitted (the request ran)" ran_no_token "$OUT" df "$MD"
check "compute_nomem: prefill failed the request on the compute error" \
	plog "event=prefill_failed .*code=INTERNAL"
after compute_nomem

check "decode counted every failure" test "$(status_get df counters.failed)" -ge 6

# --- the engine's own tag check fails (invariants 1, 2) --------------------
# decode restarts (counters from zero) with 64 KiB batches for dup_entry
stop_node pf
stop_node df
sed -i "s/^max_batch_bytes = 16K$/max_batch_bytes = 64K/" "$T/df.ini" "$T/pf.ini"
start_node df KVD_FAULT=retag_ready:1
QUAR=0                            # a new decode process: its own count
check "retag_ready: prefill up" restart_prefill
ask
check "retag_ready: INTEGRITY reaches the client" err_is INTEGRITY
check "retag_ready: decode broke a tag after mark_ready" dlog "point=retag_ready"
check "retag_ready: the lent pages were quarantined, not released" \
	dlog "event=pages_quarantined .*reason=engine_integrity"
QUAR=$(log_since "$T/df.log" "$MD" | grep -o "event=pages_quarantined .*reason=engine_integrity" | tail -1 | sed 's/.*pages=\([0-9]*\).*/\1/' || true)
after retag_ready

# --- one batch naming the same page twice (coverage, invariant 6) ---------
check "dup_entry: prefill up" restart_prefill dup_entry:1
ask
check "dup_entry: INTEGRITY reaches the client" err_is INTEGRITY
check "dup_entry: no token emitted (the request ran)" ran_no_token "$OUT" df "$MD"
check "dup_entry: prefill duplicated an entry" plog "point=dup_entry"
check "dup_entry: decode refused the batch at entry check" dlog "event=request_failed .*code=INTEGRITY .*twice \(in one batch\)"
after dup_entry

MD=$(log_mark "$T/df.log")
stop_node df
stop_node pf
check "decode stopped cleanly" dlog "event=stopped exit_code=0"

# --- compute_nomem on a standalone node: nothing else would end it --------
# no peer timeout covers a local request in the engine: a dropped DONE
# left it (and its client) waiting forever
next_port
write_node solo standalone "$MODEL" "listen.client=127.0.0.1:$PORT"
start_node solo KVD_FAULT=compute_nomem:1
check "compute_nomem standalone: node ready" wait_log "$T/solo.log" "event=serve_ready" 30
out=$(timeout 15 "$KVCTL" generate --server "127.0.0.1:$PORT" --json --prompt "The end of the story" --max-tokens 12 --temperature 0.9 --seed 3 || true)
check "compute_nomem standalone: INTERNAL reaches the client" test "$(echo "$out" | json_get error)" = INTERNAL
check "compute_nomem standalone: the request ended, pages back" settle solo
check "compute_nomem standalone: counted as failed" test "$(status_get solo counters.failed)" = 1
out=$(timeout 60 "$KVCTL" generate --server "127.0.0.1:$PORT" --json --prompt "The end of the story" --max-tokens 12 --temperature 0.9 --seed 3 || true)
check "compute_nomem standalone: a later request equals its offline run" same_ids "$out" "$REF"
stop_node solo
serve_finish
