#!/usr/bin/env bash
# Issue 26, item 2: a drain ends within its timeouts whatever a decode
# peer that holds the cluster key does. The peer stops reading its data
# connection with requests in flight: at node.drain_timeout_ms the drain
# aborts them, but an aborted prefill request keeps its pages until none
# of its batches is queued, and a stalled data connection never reports
# them - so before the send deadline `kvctl drain` never returned, and
# SIGTERM stopped the node only through its last-resort grace (two
# release timeouts after the abort, event=drain_timeout action=stop).
# Now the aborted requests end at the send deadline (transfer.
# send_timeout_ms, default release_timeout_ms): the drain completes
# within drain_timeout_ms + send_timeout_ms, and SIGTERM exits cleanly
# before the grace. Runs on keys that existed before the deadline, so
# the same script shows the hole on a build without it.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/serve_lib.sh"

ATTACK_BIN=$KVD_BUILD/tests/kvd_attack
[ -x "$ATTACK_BIN" ] || { echo "skip: $ATTACK_BIN not built"; exit 77; }
ATTACK=("$ATTACK_BIN" --log "$T/pf.log" --key "$(cluster_key)" --source 127.0.0.2)
# 3 KB of KV per token (48 KB pages): the cap of 128 pages is 6 MB, more
# than loopback's socket buffers absorb (4 MB) and less than the data
# connection's stall bound (8 MiB)
gen_model "$T/m.gguf" --layers 3 --dim 256 --heads 8 --kv-heads 4
M=$T/m.gguf
ms() { date +%s%3N; }

# release 5 s: the send deadline is 5 s, SIGTERM's grace 10 s after the
# drain deadline - far enough apart to tell which one ended the node.
next_port; P_PORT=$PORT
write_node pf prefill "$M" "listen.peer=127.0.0.1:$P_PORT" \
	"transfer.release_timeout_ms=5000" "node.drain_timeout_ms=1000"
start_node pf
check "prefill up" wait_log "$T/pf.log" "event=serve_ready" 20

holds() { [ "$(held pf)" -ge 100 ]; }
stall() { # stall OUT: the attacker holds 8 requests it never reads
	"${ATTACK[@]}" hold "127.0.0.1:$P_PORT" 256 8 30 --no-read-data > "$1" 2>&1 &
	APID=$!
	PIDS+=("$APID")
	wait_for 15 holds
}

# ---- kvctl drain -----------------------------------------------------------
check "drain: the attacker holds prefill's pages, unread" stall "$T/a1.out"
t0=$(ms)
dout=$(timeout 20 "$KVCTL" --socket "$T/pf.sock" drain 2>&1) && drc=0 || drc=$?
t_drain=$(( $(ms) - t0 ))
echo "# drain: rc=$drc in $t_drain ms: $dout"
check "drain: kvctl drain succeeded" test "$drc" = 0
check "drain: within drain_timeout_ms + send_timeout_ms + 2 s (x KVD_TEST_TIME_SCALE)" \
	test "$t_drain" -lt $((1000 + 5000 + 2000 * TSCALE))
check "drain: the deadline aborted the attacker's requests" \
	grep -q "event=drain_timeout .*action=abort" "$T/pf.log"
check "drain: they ended at the send deadline" grep -q "event=send_timeout .*peer_node=attacker" "$T/pf.log"
check "drain: nothing in flight" test "$(status_get pf in_flight)" = 0
check "drain: zero pages held" settle pf
kill "$APID" 2>/dev/null || true; wait "$APID" 2>/dev/null || true
check "drain: resume" quiet "$KVCTL" --socket "$T/pf.sock" resume

# ---- SIGTERM ---------------------------------------------------------------
check "sigterm: the attacker holds prefill's pages again" stall "$T/a2.out"
t0=$(ms)
kill -TERM "$PID_pf"
wait "$PID_pf" 2>/dev/null && rc=0 || rc=$?
t_stop=$(( $(ms) - t0 ))
echo "# SIGTERM: exit $rc after $t_stop ms"
check "sigterm: prefill exited 0" test "$rc" = 0
check "sigterm: within drain_timeout_ms + send_timeout_ms + 2 s, before the grace (x KVD_TEST_TIME_SCALE)" \
	test "$t_stop" -lt $((1000 + 5000 + 2000 * TSCALE))
check "sigterm: not through the last-resort grace" \
	bash -c "! grep -q 'event=drain_timeout .*action=stop' '$T/pf.log'"
kill "$APID" 2>/dev/null || true; wait "$APID" 2>/dev/null || true
serve_finish
