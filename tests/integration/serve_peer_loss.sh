#!/usr/bin/env bash
# Losing the prefill peer, and decode's own limits, with real processes:
#  - heartbeat loss: prefill frozen (SIGSTOP) mid-transfer; decode must
#    declare it lost after three missed heartbeats, fail the request with
#    a typed error and free its pages while prefill is still frozen; after
#    SIGCONT prefill frees its side and the pair serves again;
#  - peer lost while aborting: decode aborts a transfer (INTEGRITY), the
#    ack is late, prefill is killed before it comes: the abort ends on the
#    loss (the connection that could write is gone), no page held;
#  - decode's abort timeout: prefill acks only after decode's
#    release_timeout_ms: decode tears the link down (abort_ack_timeout),
#    ends the abort, holds no page, pairs again;
#  - OVERLOADED on decode: its pool is full (synthetic load): the request
#    is refused before prefill hears of it;
#  - an abort that cannot be queued (abort_send_fail): decode cannot keep
#    its side of the handshake, so the link is torn down and the abort
#    ends with it; pages fenced until then, none held after.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/serve_lib.sh"

grep -q "KVD_FAULT_POINTS 1" "$KVD_BUILD/kvd_build.h" || skip "built without fault points"
gen_model "$T/m.gguf"
MODEL=$T/m.gguf
PROMPT=$(seq -s, 10 109)          # 100 tokens: 7 pages of 16, 7 batches
REF=$(offline --model "$MODEL" --prompt "The end of the story" --max-tokens 12 --temperature 0.9 --seed 3)
# heartbeats every 200 ms (dead after 3 missed); phase timeouts long
# enough that only the loss can end a transfer here; tenants.max_queued=0:
# a busy decode refuses at once (the OVERLOADED case) instead of queueing
pair pl dl "$MODEL" "transfer.max_batch_bytes=16K" -- "transfer.max_batch_bytes=16K" "tenants.max_queued=0" \
	"transfer.prefill_timeout_ms=8000" "transfer.transfer_timeout_ms=8000"

restart_prefill() { # restart_prefill [KVD_FAULT spec]: true once dl paired with it
	local mark
	stop_node pl
	mark=$(log_mark "$T/dl.log")
	if [ -n "${1:-}" ]; then start_node pl "KVD_FAULT=$1"; else start_node pl; fi
	wait_log "$T/dl.log" "event=peer_up " 15 "$mark"
}
later() { # later LABEL: a later request equals its offline run
	local out
	out=$(gen "$C_PORT" --prompt "The end of the story" --max-tokens 12 --temperature 0.9 --seed 3 || true)
	check "$1: a later request equals its offline run" same_ids "$out" "$REF"
}
# bg_ask FILE: one 7-page request in the background (pid in CPID), after
# marking decode's log (MD)
bg_ask() {
	MD=$(log_mark "$T/dl.log")
	"$KVCTL" generate --server "127.0.0.1:$C_PORT" --json --tokens "$PROMPT" --max-tokens 8 >"$1" 2>&1 &
	CPID=$!
	PIDS+=($CPID)
}
fenced_ms() { # fenced_ms ID: decode's measure of the abort handshake
	log_since "$T/dl.log" "$MD" | grep -o "event=abort_done id=$1 tenant=default fenced_ms=[0-9]*" | tail -1 | sed 's/.*fenced_ms=//' || true
}

start_node dl

# --- heartbeat loss: prefill frozen mid-transfer ------------------------------
# slow_batch: one batch per 300 ms, so the transfer is still going when
# prefill freezes
check "heartbeat: prefill up (300 ms per batch)" restart_prefill slow_batch
bg_ask "$T/stop.out"
check "heartbeat: the request reached its transfer" wait_log "$T/dl.log" "event=prefill_sent " 10 "$MD"
kill -STOP "$PID_pl"
check "heartbeat: decode declared the frozen prefill lost" \
	wait_log "$T/dl.log" "event=peer_down .*three heartbeats missed" 10 "$MD"
wait $CPID 2>/dev/null || true
OUT=$(cat "$T/stop.out")
check "heartbeat: a typed error reaches the client" test "$(echo "$OUT" | json_get error)" = INTERNAL
check "heartbeat: no token emitted (the request ran)" ran_no_token "$OUT" dl "$MD"
check "heartbeat: decode failed it for the lost peer" \
	log_has "$T/dl.log" "event=request_failed .*code=INTERNAL .*lost during the transfer" "$MD"
check "heartbeat: decode holds no page while prefill is still frozen" settle dl
check "heartbeat: decode quarantined nothing" test "$(status_get dl pool.quarantined)" = 0
check "heartbeat: prefill really is still frozen" \
	test "$(awk '{print $3}' "/proc/$PID_pl/stat" 2>/dev/null)" = T
MC=$(log_mark "$T/dl.log")
kill -CONT "$PID_pl"
check "heartbeat: prefill, thawed, frees its side" settle pl
check "heartbeat: decode paired with it again" wait_log "$T/dl.log" "event=peer_up " 15 "$MC"
check "heartbeat: prefill quarantined nothing" test "$(status_get pl pool.quarantined)" = 0
later heartbeat

# --- peer lost while aborting -----------------------------------------------
# stale_generation: decode refuses the first batch and aborts;
# slow_abort_ack: prefill would ack a second later, but dies first
check "abort+loss: prefill up" restart_prefill stale_generation:1,slow_abort_ack:1
bg_ask "$T/lost.out"
check "abort+loss: decode aborted the transfer" \
	wait_log "$T/dl.log" "event=transfer_abort .*code=INTEGRITY" 10 "$MD"
id=$(log_since "$T/dl.log" "$MD" | grep -o "event=transfer_abort id=[0-9]*" | tail -1 | sed 's/.*id=//' || true)
check "abort+loss: the ack was still pending when prefill died" \
	test "$(log_count "$T/dl.log" "event=abort_done id=${id:-x} " "$MD")" = 0
kill -KILL "$PID_pl"
wait "$PID_pl" 2>/dev/null || true
wait $CPID 2>/dev/null || true
OUT=$(cat "$T/lost.out")
check "abort+loss: INTEGRITY reaches the client" test "$(echo "$OUT" | json_get error)" = INTEGRITY
check "abort+loss: no token emitted (the request ran)" ran_no_token "$OUT" dl "$MD"
check "abort+loss: decode saw the peer go" wait_log "$T/dl.log" "event=peer_down " 10 "$MD"
check "abort+loss: the abort ended on the loss" wait_log "$T/dl.log" "event=abort_done id=${id:-x} " 10 "$MD"
fms=$(fenced_ms "${id:-x}")
check "abort+loss: before the delayed ack could have come (${fms:-?} ms < 1000)" test "${fms:-9999}" -lt 1000
check "abort+loss: no abort_ack_timeout" test "$(log_count "$T/dl.log" "event=abort_ack_timeout" "$MD")" = 0
check "abort+loss: decode holds no page" settle dl
check "abort+loss: decode quarantined nothing" test "$(status_get dl pool.quarantined)" = 0
check "abort+loss: prefill restarts and pairs again" restart_prefill
later abort+loss

# --- an abort frame that cannot be queued ------------------------------------
# stale_generation: decode refuses the first batch; abort_send_fail: its
# abort cannot be queued, so the link is doomed and torn down at the tick
stop_node dl
start_node dl KVD_FAULT=abort_send_fail:1
check "abort unsent: prefill up" restart_prefill stale_generation:1
bg_ask "$T/unsent.out"
wait $CPID 2>/dev/null || true
OUT=$(cat "$T/unsent.out")
check "abort unsent: INTEGRITY reaches the client" test "$(echo "$OUT" | json_get error)" = INTEGRITY
check "abort unsent: no token emitted (the request ran)" ran_no_token "$OUT" dl "$MD"
check "abort unsent: the abort could not be queued" \
	wait_log "$T/dl.log" "event=peer_send_failed .*type=abort" 10 "$MD"
check "abort unsent: so decode tore the link down" \
	wait_log "$T/dl.log" "event=peer_down .*a control frame could not be queued" 10 "$MD"
id=$(log_since "$T/dl.log" "$MD" | grep -o "event=transfer_abort id=[0-9]*" | tail -1 | sed 's/.*id=//' || true)
check "abort unsent: the abort ended with the link" wait_log "$T/dl.log" "event=abort_done id=${id:-x} " 10 "$MD"
check "abort unsent: decode holds no page" settle dl
check "abort unsent: decode quarantined nothing" test "$(status_get dl pool.quarantined)" = 0
check "abort unsent: prefill holds no page" settle pl
check "abort unsent: decode paired again" wait_log "$T/dl.log" "event=peer_up " 15 "$MD"
later "abort unsent"

# --- OVERLOADED on decode: its pool is full ---------------------------------
# 8 synthetic requests of 500 tokens hold all 256 of decode's pages
pages=$(status_get dl pool.pages)
load=$("$KVCTL" --socket "$T/dl.sock" --json fault load --count 8 --tokens 500 --hold-ms 60000 2>/dev/null || true)
first=$(echo "$load" | json_get first_id); last=$(echo "$load" | json_get last_id)
check "overloaded: synthetic load holds decode's whole pool ($pages pages)" \
	test "$(status_get dl pool.free)" = 0 -a "$(echo "$load" | json_get admitted)" = 8
ov0=$(status_get dl counters.rejected.overloaded)
adm0=$(status_get pl counters.admitted)
MD=$(log_mark "$T/dl.log")
OUT=$(gen "$C_PORT" --tokens "$PROMPT" --max-tokens 8 || true)
check "overloaded: OVERLOADED reaches the client" test "$(echo "$OUT" | json_get error)" = OVERLOADED
check "overloaded: no token emitted" no_token "$OUT"
check "overloaded: counted on decode" test "$(status_get dl counters.rejected.overloaded)" = $((ov0 + 1))
check "overloaded: prefill never heard of it" test "$(status_get pl counters.admitted)" = "$adm0"
check "overloaded: decode sent no prefill_request" \
	test "$(log_count "$T/dl.log" "event=prefill_sent " "$MD")" = 0
check "overloaded: decode's pool is exactly as the load left it" \
	test "$(status_get dl pool.free)" = 0 -a "$(held dl)" = "$pages"
for i in $(seq "${first:-1}" "${last:-0}"); do
	"$KVCTL" --socket "$T/dl.sock" abort "$i" >/dev/null 2>&1 || true
done
check "overloaded: the load ended, every page back" settle dl
later overloaded

# --- decode's abort timeout: the ack never comes in time ---------------------
# decode waits release_timeout_ms (700 ms here: three 200 ms heartbeats must fit) for prefill's abort_ack,
# which slow_abort_ack delays by a second
stop_node dl
sed -i "s/^release_timeout_ms = .*/release_timeout_ms = 700/" "$T/dl.ini"
start_node dl
check "abort timeout: prefill up" restart_prefill stale_generation:1,slow_abort_ack:1
bg_ask "$T/ato.out"
wait $CPID 2>/dev/null || true
OUT=$(cat "$T/ato.out")
check "abort timeout: INTEGRITY reaches the client" test "$(echo "$OUT" | json_get error)" = INTEGRITY
check "abort timeout: no token emitted (the request ran)" ran_no_token "$OUT" dl "$MD"
check "abort timeout: decode gave up on the ack" \
	wait_log "$T/dl.log" "event=abort_ack_timeout " 10 "$MD"
check "abort timeout: and tore the peer connection down" \
	wait_log "$T/dl.log" "event=peer_down .*abort_ack timeout" 10 "$MD"
id=$(log_since "$T/dl.log" "$MD" | grep -o "event=abort_ack_timeout id=[0-9]*" | tail -1 | sed 's/.*id=//' || true)
check "abort timeout: the abort ended with the connection" wait_log "$T/dl.log" "event=abort_done id=${id:-x} " 10 "$MD"
fms=$(fenced_ms "${id:-x}")
check "abort timeout: pages stayed fenced for the whole timeout (${fms:-?} ms >= 650)" test "${fms:-0}" -ge 650
check "abort timeout: decode holds no page" settle dl
check "abort timeout: decode quarantined nothing" test "$(status_get dl pool.quarantined)" = 0
check "abort timeout: prefill's late ack found a closed link; it holds no page" settle pl
check "abort timeout: decode paired again" wait_log "$T/dl.log" "event=peer_up " 15 "$MD"
later "abort timeout"

stop_node dl
stop_node pl
serve_finish
