#!/usr/bin/env bash
# A decode peer that breaks the rules cannot hold a prefill node's memory,
# pages or time beyond a bound (invariant 11). tests/attack/kvd_attack
# plays the hostile peer - with the cluster key, an insider - against a
# prefill node that also serves a real decode node:
#   - abort flood: aborts as fast as possible, never reading the acks:
#     prefill's RSS stays bounded, prefill closes the connection, the real
#     pair keeps serving correct output throughout;
#   - request cap: the (max_requests+1)-th concurrent request of one peer
#     is rejected OVERLOADED;
#   - pool holding: requests that fill what the peer may hold, never a
#     release_ack: the real decode still gets served, the pages come back
#     within release_timeout_ms while the attacker is still connected;
#   - drain: kvctl drain returns within node.drain_timeout_ms while the
#     attacker keeps sending and holding;
#   - data stall: a peer that never reads its data connection makes
#     prefill send no more than a bounded backlog, then lose the peer and
#     take its pages back.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/serve_lib.sh"

ATTACK_BIN=$KVD_BUILD/tests/kvd_attack
[ -x "$ATTACK_BIN" ] || { echo "skip: $ATTACK_BIN not built"; exit 77; }
# The attacker holds the cluster key (a decode node gone rogue): bounds
# must hold against an authenticated peer, not only against strangers.
# It connects from 127.0.0.2: prefill's caps hold per decode node (source
# address), and the real decode node is 127.0.0.1.
ATTACK=("$ATTACK_BIN" --log "$T/pf.log" --key "$(cluster_key)" --source 127.0.0.2)
gen_model "$T/m.gguf"
M=$T/m.gguf
PROMPT="The end of the story"
REF=$(offline --model "$M" --prompt "$PROMPT" --max-tokens 8 --seed 5)

# Phase A: max_requests 4, control writes bounded at 64K/1M, stalled
# ones closed after 0.5 s.
# Heartbeats of 500 ms: a flooded loop on a loaded 2-core machine must
# not look dead to the real decode node.
pair pf df "$M" "listen.write_queue_soft=64K" "listen.write_queue_hard=1M" \
	"listen.write_stall_timeout_ms=500" "peers.max_requests=4" \
	"transfer.heartbeat_ms=500" -- "transfer.heartbeat_ms=500"
start_node pf
start_node df
check "pair up" wait_up df

rss_kb() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status" 2>/dev/null || echo 0; }
ms() { date +%s%3N; }

# ---- abort flood -------------------------------------------------------------
# 12 s: loopback socket buffers absorb a few MB of acks before any queue
# forms in prefill, then the stall bound must run out while the attacker
# still sends (an ASan build on a loaded machine needed more than 6 s to
# fill them).
rss0=$(rss_kb "$PID_pf")
"${ATTACK[@]}" abort-flood "127.0.0.1:$P_PORT" 12 > "$T/flood.out" 2>&1 &
APID=$!
PIDS+=("$APID")
good=0; bad=0; peak=$rss0
end=$(( $(ms) + 13000 ))
while [ "$(ms)" -lt "$end" ]; do
	r=$(rss_kb "$PID_pf"); [ "$r" -gt "$peak" ] && peak=$r
	out=$(gen "$C_PORT" --prompt "$PROMPT" --max-tokens 8 --seed 5 || true)
	if same_ids "$out" "$REF"; then good=$((good + 1)); else bad=$((bad + 1)); echo "# during flood: $out"; fi
	r=$(rss_kb "$PID_pf"); [ "$r" -gt "$peak" ] && peak=$r
done
wait "$APID" || true
r=$(rss_kb "$PID_pf"); [ "$r" -gt "$peak" ] && peak=$r
growth_kb=$((peak - rss0))
echo "# abort flood: $(cat "$T/flood.out"); prefill RSS $rss0 kB -> peak $peak kB (+$((growth_kb / 1024)) MB)"
check "abort flood: the attacker completed the handshake" grep -q "handshake=ok" "$T/flood.out"
check "abort flood: prefill RSS grew by less than 64 MB" test "$growth_kb" -lt 65536
check "abort flood: prefill closed the connection while the attacker was still sending" grep -q "closed=during" "$T/flood.out"
check "abort flood: prefill logged why" grep -q "event=peer_down peer_node=attacker msg=\"control write queue" "$T/pf.log"
check "abort flood: prefill is alive" kill -0 "$PID_pf"
check "abort flood: the real pair served correct output throughout ($good ok, $bad wrong)" \
	test "$good" -ge 1 -a "$bad" = 0
out=$(gen "$C_PORT" --prompt "$PROMPT" --max-tokens 8 --seed 5 || true)
check "abort flood: a request after the flood equals its offline run" same_ids "$out" "$REF"

# ---- request cap ---------------------------------------------------------------
# 5 requests of 32 tokens (2 pages) held without release_ack: the fifth
# finds 4 in flight.
timeout 30 "${ATTACK[@]}" hold "127.0.0.1:$P_PORT" 32 5 3 > "$T/cap.out" 2>&1 || true
echo "# request cap: $(tail -1 "$T/cap.out")"; { grep "event=prefill_reject" "$T/pf.log" || true; } | sed "s/^/# /" | tail -3
check "request cap: four requests admitted" grep -q " done=4 " <(tail -1 "$T/cap.out")
check "request cap: the fifth rejected OVERLOADED" grep -q " overloaded=1 " <(tail -1 "$T/cap.out")
check "request cap: prefill logged the cap" grep -q "event=peer_cap peer_node=attacker .*cap=max_requests" "$T/pf.log"
check "request cap: zero pages held once the attacker left" settle pf

# Phase B: default request cap; pages held up to 5 s without an ack;
# drain bounded at 1 s.
stop_node pf
write_node pf prefill "$M" "listen.peer=127.0.0.1:$P_PORT" "transfer.release_timeout_ms=5000" \
	"node.drain_timeout_ms=1000"
ups=$(grep -c "event=peer_up" "$T/df.log")
start_node pf
more_ups() { [ "$(grep -c 'event=peer_up' "$T/df.log")" -gt "$ups" ]; }
check "phase B: prefill back up and paired" wait_for 15 more_ups
check "phase B: prefill logged its per-peer limits" \
	grep -q "event=peer_limits max_requests=256 max_pages=128 max_pages_source=auto" "$T/pf.log"

# ---- pool holding ---------------------------------------------------------------
# 20 requests of 256 tokens (16 pages each): 320 pages wanted of a
# 256-page pool. The per-peer page cap (half the pool) stops it at 8.
"${ATTACK[@]}" hold "127.0.0.1:$P_PORT" 256 20 30 > "$T/hold.out" 2>&1 &
APID=$!
PIDS+=("$APID")
wait_for 10 grep -q "^sent=" "$T/hold.out" && answered=0 || answered=1
t_answered=$(ms)
echo "# pool holding: $(head -1 "$T/hold.out"); prefill holds $(held pf) pages"
check "pool holding: every attacker request answered" test $answered = 0
check "pool holding: the page cap rejected the rest OVERLOADED" grep -q "done=8 overloaded=12" "$T/hold.out"
# the real decode's requests run while the attacker holds its pages;
# meanwhile watch prefill's page count fall back to what they hold
( for i in 1 2 3; do
	gen "$C_PORT" --prompt "$PROMPT" --max-tokens 8 --seed 5 || true; echo
  done > "$T/real.out" 2>&1 ) &
GPID=$!
PIDS+=("$GPID")
released() { [ "$(held pf)" -lt 128 ]; }
wait_for 6 released || true
t_back=$(( $(ms) - t_answered ))
check "pool holding: the attacker was still connected" kill -0 "$APID"
wait "$GPID" || true
good=0
while read -r out; do
	[ -n "$out" ] || continue
	if same_ids "$out" "$REF"; then good=$((good + 1)); else echo "# while held: $out"; fi
done < "$T/real.out"
check "pool holding: the real decode's requests succeed (3/$good)" test "$good" = 3
# from prefill's own log, per request: its prefill_done (all sent: the
# release timer starts) to its release_timeout (polling kvctl is too
# coarse on a loaded machine; the first done to the last release would
# add how far apart the 8 computes ran, which a slow machine stretches)
span=$(python3 -c 'import sys,re,datetime
def ts(l): return datetime.datetime.strptime(l.split()[0][3:], "%Y-%m-%dT%H:%M:%S.%fZ")
def rid(l): m = re.search(r" remote_id=([0-9]+)", l); return m and m.group(1)
lines=open(sys.argv[1]).read().splitlines()
b=max([i for i,l in enumerate(lines) if "event=peer_limits" in l] + [0])
done={}
for l in lines[b:]:   # the attacker asked first: the first done of an id is its
    if "event=prefill_done" in l: done.setdefault(rid(l), ts(l))
rel={rid(l): ts(l) for l in lines[b:] if "event=release_timeout" in l and "peer_node=attacker" in l}
d=[(rel[k]-done[k]).total_seconds()*1000 for k in rel if k in done]
print(int(max(d)) if len(d) >= 8 else 999999)' "$T/pf.log")
echo "# pool holding: the attacker's pages back after $t_back ms (polled); the longest request held its pages $span ms from its prefill_done to its release (log)"
check "pool holding: prefill released each of the attacker's requests within release_timeout_ms (5000) + 1 s" \
	test "$span" -lt 6000
check "pool holding: zero pages held on prefill once the real requests ended" settle pf
check "pool holding: prefill logged release_timeout" grep -q "event=release_timeout .*peer_node=attacker" "$T/pf.log"
check "pool holding: counted" test "$(status_get pf counters.release_timeouts)" -ge 8
kill "$APID" 2>/dev/null || true; wait "$APID" 2>/dev/null || true

# ---- drain ------------------------------------------------------------------------
"${ATTACK[@]}" hold "127.0.0.1:$P_PORT" 256 8 10 --keep-sending > "$T/drain.out" 2>&1 &
APID=$!
PIDS+=("$APID")
holds4() { [ "$(status_get pf in_flight)" -ge 4 ]; }
check "drain: the attacker holds requests" wait_for 5 holds4
t0=$(ms)
dout=$(timeout 20 "$KVCTL" --socket "$T/pf.sock" drain 2>&1) && drc=0 || drc=$?
t_drain=$(( $(ms) - t0 ))
echo "# drain: rc=$drc in $t_drain ms: $dout"
check "drain: kvctl drain succeeded" test "$drc" = 0
check "drain: it returned within drain_timeout_ms + 1.5 s (x KVD_TEST_TIME_SCALE)" \
	test "$t_drain" -lt $((1000 + 1500 * TSCALE))
check "drain: prefill logged the deadline" grep -q "event=drain_timeout .*action=abort" "$T/pf.log"
check "drain: nothing in flight on prefill" test "$(status_get pf in_flight)" = 0
check "drain: zero pages held on prefill" settle pf
kill "$APID" 2>/dev/null || true; wait "$APID" 2>/dev/null || true
check "drain: resume" quiet "$KVCTL" --socket "$T/pf.sock" resume
out=$(gen "$C_PORT" --prompt "$PROMPT" --max-tokens 8 --seed 5 || true)
check "after all: a request equals its offline run" same_ids "$out" "$REF"
check "after all: zero pages held on both nodes" settle pf df

stop_node df
stop_node pf

# ---- a peer that never reads its data connection ------------------------------
# 60 requests of 16 pages (about 8 MB of KV, sealed: copies) with small
# batches: past the soft bound prefill sends nothing more to it, and once
# the backlog has sat there for write_stall_timeout_ms the peer is gone -
# its pages come back, prefill's memory stays bounded.
next_port; S_PORT=$PORT
write_node ps prefill "$M" "listen.peer=127.0.0.1:$S_PORT" "kv.pool_tokens=16384" \
	"peers.max_pages=1000" "peers.max_requests=64" "transfer.max_batch_bytes=16K" \
	"listen.write_queue_soft=64K" "listen.write_stall_timeout_ms=500" \
	"transfer.release_timeout_ms=30000" "transfer.heartbeat_ms=200"
start_node ps
check "data stall: prefill up" wait_log "$T/ps.log" "event=serve_ready" 20
rss0=$(rss_kb "$PID_ps")
"$ATTACK_BIN" --log "$T/ps.log" --key "$(cluster_key)" hold "127.0.0.1:$S_PORT" 256 60 6 \
	--no-read-data > "$T/stall.out" 2>&1 &
APID=$!
PIDS+=("$APID")
peak=$rss0
end=$(( $(ms) + 6500 ))
while [ "$(ms)" -lt "$end" ]; do
	r=$(rss_kb "$PID_ps"); [ "$r" -gt "$peak" ] && peak=$r
	sleep 0.1
done
wait "$APID" || true
echo "# data stall: $(tail -1 "$T/stall.out"); prefill RSS $rss0 kB -> peak $peak kB"
check "data stall: the attacker's requests were admitted" grep -q "handshake=ok" "$T/stall.out"
check "data stall: prefill tore the peer down for its unread data connection" \
	grep -q "event=write_bound .*conn=peer_data reason=stall" "$T/ps.log"
check "data stall: prefill RSS grew by less than 64 MB" test $(( (peak - rss0) / 1024 )) -lt 64
check "data stall: every page came back" settle ps
stop_node ps
serve_finish
