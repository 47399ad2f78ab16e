#!/usr/bin/env bash
# Issue 26, item 1: a decode peer that holds the cluster key and stops
# reading its data connection cannot keep a prefill node's pages. The
# backlog it leaves (a few hundred KB here, 2.6 MB in the issue) stays
# far below the data connection's stall bound (max(write_queue_soft,
# 2 x max_batch_bytes) = 8 MiB with the defaults), its requests never
# reach prefill_done, so before the send deadline neither the stall
# timer nor release_timeout_ms applied and prefill kept the peer's whole
# cap (128 pages, half the pool) for as long as the peer stayed
# connected. With transfer.send_timeout_ms (default: release_timeout_ms)
# a request whose batches make no progress for that long ends: its data
# connection is closed (the only way to get the queued batches back),
# and its pages return once nothing of it is in flight.
# Everything here runs on the defaults (no new key), so the same script
# shows the hole on a build without the deadline.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/serve_lib.sh"

ATTACK_BIN=$KVD_BUILD/tests/kvd_attack
[ -x "$ATTACK_BIN" ] || { echo "skip: $ATTACK_BIN not built"; exit 77; }
# an insider (the cluster key) on another address than the real decode
ATTACK=("$ATTACK_BIN" --log "$T/pf.log" --key "$(cluster_key)" --source 127.0.0.2)
# 3 KB of KV per token (48 KB pages): the cap of 128 pages is 6 MB, more
# than loopback's socket buffers absorb (4 MB) and less than the data
# connection's stall bound (8 MiB)
gen_model "$T/m.gguf" --layers 3 --dim 256 --heads 8 --kv-heads 4
M=$T/m.gguf
PROMPT="The end of the story"
REF=$(offline --model "$M" --prompt "$PROMPT" --max-tokens 8 --seed 5)
ms() { date +%s%3N; }

# write_node's defaults: a 256-page pool, release_timeout_ms = 2000,
# heartbeats of 200 ms; the data bounds are kvd's own defaults.
pair pf df "$M" "transfer.heartbeat_ms=200" -- "transfer.heartbeat_ms=200"
start_node pf
start_node df
check "pair up" wait_up df
check "prefill: automatic per-peer page cap of 128" \
	grep -q "event=peer_limits max_requests=256 max_pages=128 max_pages_source=auto" "$T/pf.log"

# 20 requests of 256 tokens (16 pages each): the cap admits 8 (128
# pages); the data connection is never read.
"${ATTACK[@]}" hold "127.0.0.1:$P_PORT" 256 20 25 --no-read-data > "$T/stall.out" 2>&1 &
APID=$!
PIDS+=("$APID")
holds() { [ "$(held pf)" -ge 100 ]; }
check "the attacker holds its cap of prefill's pages" wait_for 15 holds
t0=$(ms)
echo "# holding: $(held pf) pages on prefill"
freed() { [ "$(held pf)" = 0 ]; }
wait_for 12 freed && back=0 || back=1
t_back=$(( $(ms) - t0 ))
echo "# pages back after $t_back ms (held: $(held pf)); attacker: $(cat "$T/stall.out")"
check "prefill took its pages back (send deadline 2000 ms + 3 s x KVD_TEST_TIME_SCALE)" \
	test "$back" = 0 -a "$t_back" -lt $((2000 + 3000 * TSCALE))
check "prefill logged the send deadline" \
	grep -q "event=send_timeout .*peer_node=attacker .*send_timeout_ms=2000" "$T/pf.log"
check "the data connection was closed for it" \
	grep -q "event=peer_down peer_node=attacker msg=\"data connection made no progress" "$T/pf.log"
check "counted in kvctl status" test "$(status_get pf counters.send_timeouts)" -ge 1
kill "$APID" 2>/dev/null || true; wait "$APID" 2>/dev/null || true

out=$(gen "$C_PORT" --prompt "$PROMPT" --max-tokens 8 --seed 5 || true)
check "the real pair still serves correct output" same_ids "$out" "$REF"
check "zero pages held on both nodes" settle pf df
stop_node df
stop_node pf
serve_finish
