#!/usr/bin/env bash
# Faults during the KV transfer (fault points, test builds only): one
# corrupted byte in a batch, a short transfer, the data connection cut
# mid-batch, a client that disconnects mid-transfer, prefill SIGKILLed
# mid-transfer. After each: every request reached a terminal state, page
# accounting is zero on both nodes, and later requests are correct
# (equal to their offline runs). Corruption and short transfers must end
# in INTEGRITY with no token emitted.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/serve_lib.sh"

if ! grep -q "KVD_FAULT_POINTS 1" "$KVD_BUILD/kvd_build.h"; then
	echo "skip: built without fault points"
	exit 77
fi
gen_model "$T/m.gguf"
M=$T/m.gguf
PROMPT=$(seq -s, 10 109)          # 100 tokens: 7 pages of 16
# 16 KiB batches hold one 8 KiB page: every request takes 7 batches
SHORT=$(seq -s, 10 57)            # 48 tokens: 3 pages (0.9 s at slow_batch)
pair pf df "$M" "transfer.max_batch_bytes=16K" -- "transfer.max_batch_bytes=16K" \
	"transfer.prefill_timeout_ms=1500" "transfer.transfer_timeout_ms=1500"
REF=$(offline --model "$M" --prompt "The end of the story" --max-tokens 12 --temperature 0.9 --seed 3)

ups=0
restart_prefill() { # restart_prefill [KVD_FAULT spec]
	stop_node pf 2>/dev/null || true
	if [ -n "${1:-}" ]; then start_node pf "KVD_FAULT=$1"; else start_node pf; fi
	ups=$((ups + 1))
	local n=300
	while [ $n -gt 0 ] && [ "$(grep -c 'event=peer_up' "$T/df.log")" -lt $ups ]; do
		sleep 0.05; n=$((n - 1))
	done
	[ $n -gt 0 ]
}

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
out=$(gen "$C_PORT" --tokens "$PROMPT" --max-tokens 8 || true)
check "corrupt_batch: INTEGRITY reaches the client" test "$(echo "$out" | json_get error)" = INTEGRITY
check "corrupt_batch: no token emitted" test -z "$(echo "$out" | json_get output_ids)"
# keyed link: the AEAD tag catches the flipped byte first (auth_failed);
# keyless: XXH3 does (checksum_mismatch)
check "corrupt_batch: decode logged the checksum failure" grep -Eq "event=batch_checksum .*error=(checksum_mismatch|auth_failed)" "$T/df.log"
# the header of a corrupt batch is not trusted: the data stream is broken
check "corrupt_batch: decode tore the peer down" grep -Eq "event=peer_down .*failed (its checksum|authentication)" "$T/df.log"
check "corrupt_batch: prefill saw the connection go" wait_log "$T/pf.log" "event=peer_down" 5
check "corrupt_batch: prefill survived writing into the torn-down connection" kill -0 "$PID_pf"
check "corrupt_batch: counted as an integrity failure" test "$(status_get df counters.integrity_failures)" -ge 1
ups=$((ups + 1))
n=0; while [ $n -lt 200 ] && [ "$(grep -c 'event=peer_up' "$T/df.log")" -lt $ups ]; do sleep 0.05; n=$((n + 1)); done
check "corrupt_batch: decode reconnected" test $n -lt 200
after corrupt_batch

check "short_transfer: prefill up" restart_prefill short_transfer:1
out=$(gen "$C_PORT" --tokens "$PROMPT" --max-tokens 8 || true)
check "short_transfer: INTEGRITY reaches the client" test "$(echo "$out" | json_get error)" = INTEGRITY
check "short_transfer: the message says short transfer" grep -q "short transfer" <<<"$(echo "$out" | json_get message)"
check "short_transfer: no token emitted, never decoded" test -z "$(echo "$out" | json_get output_ids)"
after short_transfer

check "cut_peer_mid_batch: prefill up" restart_prefill cut_peer_mid_batch:1
out=$(gen "$C_PORT" --tokens "$PROMPT" --max-tokens 8 || true)
check "cut_peer_mid_batch: a typed error reaches the client" test "$(echo "$out" | json_get error)" = INTERNAL
check "cut_peer_mid_batch: no token emitted" test -z "$(echo "$out" | json_get output_ids)"
check "cut_peer_mid_batch: decode saw the cut" grep -q "event=peer_down .*data connection cut mid-batch" "$T/df.log"
ups=$((ups + 1))
check "cut_peer_mid_batch: decode reconnected" wait_log "$T/df.log" "event=peer_up" 10
n=0; while [ $n -lt 100 ] && [ "$(grep -c 'event=peer_up' "$T/df.log")" -lt $ups ]; do sleep 0.05; n=$((n + 1)); done
after cut_peer_mid_batch

check "stale_generation: prefill up" restart_prefill stale_generation:1
out=$(gen "$C_PORT" --tokens "$PROMPT" --max-tokens 8 || true)
check "stale_generation: INTEGRITY reaches the client" test "$(echo "$out" | json_get error)" = INTEGRITY
check "stale_generation: no token emitted" test -z "$(echo "$out" | json_get output_ids)"
check "stale_generation: decode refused the page by its generation" grep -q "event=request_failed .*code=INTEGRITY .*not the request's page" "$T/df.log"
after stale_generation

check "nan_kv: prefill up" restart_prefill nan_kv:1
out=$(gen "$C_PORT" --tokens "$PROMPT" --max-tokens 8 || true)
check "nan_kv: INTEGRITY reaches the client" test "$(echo "$out" | json_get error)" = INTEGRITY
check "nan_kv: no token emitted" test -z "$(echo "$out" | json_get output_ids)"
check "nan_kv: decode refused the batch for its non-finite K/V" grep -q "event=request_failed .*code=INTEGRITY .*non-finite K/V" "$T/df.log"
after nan_kv

check "bad_tag: prefill up" restart_prefill bad_tag:1
out=$(gen "$C_PORT" --tokens "$PROMPT" --max-tokens 8 || true)
check "bad_tag: INTEGRITY reaches the client" test "$(echo "$out" | json_get error)" = INTEGRITY
check "bad_tag: no token emitted" test -z "$(echo "$out" | json_get output_ids)"
check "bad_tag: caught by the tag check at mark_ready" grep -q "event=request_failed .*code=INTEGRITY .*failed the tag check" "$T/df.log"
check "bad_tag: decode quarantined the 7 prefix pages" grep -q "event=pages_quarantined .*pages=7 reason=tag_check" "$T/df.log"
QUAR=7
after bad_tag

# --- abort handshake: pages stay fenced until prefill's abort_ack ----------
check "slow_abort_ack: prefill up" restart_prefill stale_generation:1,slow_abort_ack:1
L0=$(wc -l < "$T/df.log")   # only lines written after this point count
out=$(gen "$C_PORT" --tokens "$PROMPT" --max-tokens 8 || true)
check "slow_abort_ack: INTEGRITY reaches the client" test "$(echo "$out" | json_get error)" = INTEGRITY
f=$(status_get df pool.fenced)
since() { tail -n +$((L0 + 1)) "$T/df.log"; }
# fenced while the ack is pending: judged only if the ack had not come by
# the time we looked (a loaded machine may be slower than the 1 s delay)
if ! since | grep -q "event=abort_done "; then
	check "slow_abort_ack: decode keeps the prefix pages fenced while the ack is pending ($f)" test "$f" -gt 0
fi
check "slow_abort_ack: prefill delayed its ack" grep -q "point=slow_abort_ack" "$T/pf.log"
# the pages stayed fenced until the ack that came a second late: decode's
# own measure, whatever the machine's load did to this script's timing
n=200
while [ $n -gt 0 ] && ! since | grep -q "event=abort_done "; do sleep 0.05; n=$((n - 1)); done
check "slow_abort_ack: decode ended the abort handshake" test $n -gt 0
fms=$(since | grep -o 'event=abort_done id=[0-9]* fenced_ms=[0-9]*' | tail -1 | sed 's/.*fenced_ms=//')
check "slow_abort_ack: decode kept the prefix pages fenced until the delayed ack (${fms:-?} ms >= 900)" \
	test "${fms:-0}" -ge 900
after slow_abort_ack

# --- phase timeout: prefill slower than transfer.prefill_timeout_ms ---------
check "timeout: prefill up (300 ms per batch)" restart_prefill slow_batch
out=$(gen "$C_PORT" --tokens "$PROMPT" --max-tokens 8 || true)
check "timeout: TIMEOUT reaches the client" test "$(echo "$out" | json_get error)" = TIMEOUT
check "timeout: no token emitted" test -z "$(echo "$out" | json_get output_ids)"
check "timeout: decode aborted the transfer" grep -q "event=transfer_abort .*code=TIMEOUT" "$T/df.log"

check "timeout: zero pages held on decode" settle df
check "timeout: zero pages held on prefill" settle pf

# --- client disconnect mid-transfer (invariant 8) -------------------------
# --- kvctl abort ID mid-transfer: the normal failure path -------------------
failed0=$(status_get df counters.failed)
"$KVCTL" generate --server "127.0.0.1:$C_PORT" --json --tokens "$SHORT" --max-tokens 8 >"$T/abort.out" 2>&1 &
cpid=$!
PIDS+=($cpid)
sleep 0.4
id=$(grep -o 'event=prefill_sent id=[0-9]*' "$T/df.log" | tail -1 | sed 's/.*id=//' || true)
check "kvctl abort: the admin plane finds the serving request ($id)" \
	quiet "$KVCTL" --socket "$T/df.sock" abort "$id"
wait $cpid 2>/dev/null || true
out=$(cat "$T/abort.out")
check "kvctl abort: the client gets a typed error, no token" \
	test "$(echo "$out" | json_get error)" = INTERNAL -a -z "$(echo "$out" | json_get output_ids)"
check "kvctl abort: decode aborted the transfer (abort handshake)" \
	grep -q "event=transfer_abort id=$id .*code=INTERNAL" "$T/df.log"
check "kvctl abort: counted as failed" test "$(status_get df counters.failed)" = $((failed0 + 1))
check "kvctl abort: zero pages held afterwards on decode" settle df
check "kvctl abort: zero pages held afterwards on prefill" settle pf

"$KVCTL" generate --server "127.0.0.1:$C_PORT" --json --tokens "$SHORT" --max-tokens 8 >"$T/gone.out" 2>&1 &
cpid=$!
PIDS+=($cpid)
sleep 0.5
id=$(grep -o 'event=prefill_sent id=[0-9]*' "$T/df.log" | tail -1 | sed 's/.*id=//' || true)
kill -KILL $cpid 2>/dev/null || true
wait $cpid 2>/dev/null || true
# A killed client's FIN looks like a half-close (whose answers kvd still
# writes, net/PROTOCOL.md s. 1): decode learns the client is gone when a
# write fails (client_gone), or writes the few answers of this small
# model into the dead socket first (request_done) - either way after the
# transfer, which is never cut in half, and the request ends.
check "client gone: the transfer still completed (not cut in half)" wait_log "$T/df.log" "event=transfer_done id=$id " 10
check "client gone: the request ended" \
	wait_log "$T/df.log" "event=\\(client_gone\\|request_done\\) id=$id " 10
check "client gone: prefill released after decode's release_ack" settle pf
after client_gone

# --- prefill SIGKILLed mid-transfer ----------------------------------------
"$KVCTL" generate --server "127.0.0.1:$C_PORT" --json --tokens "$PROMPT" --max-tokens 8 >"$T/kill.out" 2>&1 &
cpid=$!
PIDS+=($cpid)
sleep 0.8
kill -KILL "$PID_pf"
wait "$PID_pf" 2>/dev/null || true
wait $cpid 2>/dev/null || true
out=$(cat "$T/kill.out")
check "prefill killed: a typed error reaches the client" test "$(echo "$out" | json_get error)" = INTERNAL
check "prefill killed: no token emitted" test -z "$(echo "$out" | json_get output_ids)"
check "prefill killed: decode holds no page and nothing in flight" settle df
check "prefill killed: prefill restarts and pairs again" restart_prefill
after prefill_killed

# --- abort handshake: decode's abort crosses a submit that then fails ------
# prefill's submit is stuck past decode's prefill timeout, then refused:
# prefill must still answer the abort (no abort_ack_timeout, peer kept)
check "stuck_submit: prefill up" restart_prefill stuck_submit:1
downs=$(grep -c "event=peer_down" "$T/df.log" || true)
out=$(gen "$C_PORT" --tokens "$PROMPT" --max-tokens 8 || true)
check "stuck_submit: TIMEOUT reaches the client" test "$(echo "$out" | json_get error)" = TIMEOUT
check "stuck_submit: prefill's submit was stuck" grep -q "point=stuck_submit" "$T/pf.log"
check "stuck_submit: the refused submit reached decode (3 s)" wait_log "$T/pf.log" "event=prefill_reject .*OVERLOADED" 5
sleep 1.5                         # past decode's release_timeout_ms (2 s)
check "stuck_submit: decode got its abort_ack (no timeout)" \
	test "$(grep -c "event=abort_ack_timeout" "$T/df.log" || true)" = 0
check "stuck_submit: the peer connection survived" \
	test "$(grep -c "event=peer_down" "$T/df.log" || true)" = "$downs"
after stuck_submit

# --- the compute thread has no memory for a request's messages -------------
# prefill's engine computes the prompt, but its token cannot be reported:
# the request ends at once, failed, pages back (a dropped DONE used to
# leave it to decode's prefill timeout)
check "compute_nomem: prefill up" restart_prefill compute_nomem:1
out=$(gen "$C_PORT" --tokens "$PROMPT" --max-tokens 8 || true)
check "compute_nomem: INTERNAL reaches the client" test "$(echo "$out" | json_get error)" = INTERNAL
check "compute_nomem: no token emitted" test -z "$(echo "$out" | json_get output_ids)"
check "compute_nomem: prefill failed the request on the compute error" \
	grep -q "event=prefill_failed .*code=INTERNAL" "$T/pf.log"
after compute_nomem

check "decode counted every failure" test "$(status_get df counters.failed)" -ge 6

# --- the engine's own tag check fails (invariants 1, 2) --------------------
# decode restarts (counters from zero) with 64 KiB batches for dup_entry
stop_node pf
stop_node df
sed -i "s/^max_batch_bytes = 16K$/max_batch_bytes = 64K/" "$T/df.ini" "$T/pf.ini"
start_node df KVD_FAULT=retag_ready:1
QUAR=0
check "retag_ready: prefill up" restart_prefill
out=$(gen "$C_PORT" --tokens "$PROMPT" --max-tokens 8 || true)
check "retag_ready: INTEGRITY reaches the client" test "$(echo "$out" | json_get error)" = INTEGRITY
check "retag_ready: decode broke a tag after mark_ready" grep -q "point=retag_ready" "$T/df.log"
check "retag_ready: the lent pages were quarantined, not released" \
	grep -q "event=pages_quarantined .*reason=engine_integrity" "$T/df.log"
QUAR=$(grep -o "event=pages_quarantined .*reason=engine_integrity" "$T/df.log" | tail -1 | sed 's/.*pages=\([0-9]*\).*/\1/')
after retag_ready

# --- one batch naming the same page twice (coverage, invariant 6) ---------
check "dup_entry: prefill up" restart_prefill dup_entry:1
out=$(gen "$C_PORT" --tokens "$PROMPT" --max-tokens 8 || true)
check "dup_entry: INTEGRITY reaches the client" test "$(echo "$out" | json_get error)" = INTEGRITY
check "dup_entry: no token emitted" test -z "$(echo "$out" | json_get output_ids)"
check "dup_entry: prefill duplicated an entry" grep -q "point=dup_entry" "$T/pf.log"
check "dup_entry: decode refused the batch at entry check" grep -q "event=request_failed .*code=INTEGRITY .*twice (in one batch)" "$T/df.log"
after dup_entry

stop_node df
stop_node pf
check "decode stopped cleanly" grep -q "event=stopped exit_code=0" "$T/df.log"

# --- compute_nomem on a standalone node: nothing else would end it --------
# no peer timeout covers a local request in the engine: a dropped DONE
# left it (and its client) waiting forever
next_port
write_node solo standalone "$M" "listen.client=127.0.0.1:$PORT"
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
