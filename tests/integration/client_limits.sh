#!/usr/bin/env bash
# The client plane holds bounded resources (invariant 11): hostile
# clients (tests/integration/attack_client.py) against a standalone node
# with small limits, and after each attack a normal client is served.
#   - id 0 and a malformed frame on one connection are told apart;
#   - 50 clients that half-close after their request all get the answer;
#   - slowloris and silent connections are closed within
#     client_read_timeout_ms; a connection silent for most of it that
#     then trickles a frame is closed at the timeout from accept, not from
#     its first byte;
#   - a flood past max_clients gets OVERLOADED frame errors while the
#     admin socket still answers (kvd runs under a low `ulimit -n`);
#   - a client that never reads is closed at write_queue_hard and the
#     node's RSS grows by less than 64 MB.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/serve_lib.sh"
command -v python3 >/dev/null || { echo "skip: python3 absent"; exit 77; }
ATTACK="python3 $(dirname "$0")/attack_client.py"

gen_model "$T/m.gguf"
next_port; SP=$PORT
write_node solo standalone "$T/m.gguf" "listen.client=127.0.0.1:$SP,unix:$T/solo.client" \
	kv.pool_tokens=32768 listen.max_clients=64 listen.client_read_timeout_ms=1000 \
	listen.client_idle_timeout_ms=3000 listen.write_queue_soft=64K \
	listen.write_queue_hard=1M listen.write_stall_timeout_ms=3000 log.level=info
# a low fd limit (soft and hard): 64 clients fit beside the reserve, a
# flood of 250 connections does not
bash -c 'ulimit -n 200 && exec "$0" "$@"' "$KVD" --config "$T/solo.ini" >>"$T/solo.log" 2>&1 &
PIDS+=($!); PID_solo=$!
check "node ready" wait_log "$T/solo.log" "event=serve_ready" 30

served() { # served LABEL: a normal client gets its answer
	local out
	out=$(gen "$SP" --prompt "Once upon a time" --max-tokens 8 2>&1) || true
	check "$1: a normal client is served" test -n "$(echo "$out" | json_get finish_reason)"
}
jget() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }

# --- id 0 vs a frame-level error ---------------------------------------------
out=$($ATTACK id0 "127.0.0.1:$SP")
echo "# id0: $out"
check "id 0: one final for request 0, nothing else terminal for id 0" python3 -c '
import json,sys
ev=json.loads(sys.argv[1])["events"]
t=[e for e in ev if e.get("id")==0 and e["type"] in ("final","error")]
sys.exit(0 if [e["type"] for e in t]==["final"] else 1)' "$out"
check "id 0: the malformed frame is a frame_error without id" python3 -c '
import json,sys
ev=json.loads(sys.argv[1])["events"]
f=[e for e in ev if "id" not in e]
sys.exit(0 if len(f)==1 and f[0]["type"]=="frame_error" and f[0]["code"]=="INVALID_REQUEST" else 1)' "$out"

# --- half-close ----------------------------------------------------------------
out=$(timeout $((90 * TSCALE)) $ATTACK halfclose "127.0.0.1:$SP" 50 16)
echo "# halfclose: $out"
check "half-close: 50 of 50 clients get their final event" test "$(jget "$out" finals)" = 50
check "half-close: every connection closed after its answer" test "$(jget "$out" still_open)" = 0
check "half-close: zero pages held" settle solo

# --- slowloris and silent connections -----------------------------------------
gen "$SP" --prompt "Once upon a time" --max-tokens 8 >"$T/during_slow" 2>&1 &
gpid=$!
out=$(timeout $((30 * TSCALE)) $ATTACK slowloris "127.0.0.1:$SP" 30 8)
echo "# slowloris: $out"
check "slowloris: 30 of 30 connections closed" test "$(jget "$out" closed)" = 30
check "slowloris: closed within read timeout + 2.5 s (x KVD_TEST_TIME_SCALE)" python3 -c \
	'import sys; v=sys.argv[1]; sys.exit(0 if v!="None" and float(v)<=1+2.5*int(sys.argv[2]) else 1)' "$(jget "$out" max_close_s)" "$TSCALE"
out=$(timeout $((30 * TSCALE)) $ATTACK idle "unix:$T/solo.client" 10 8)
echo "# idle: $out"
check "silent unix: connections closed within read timeout + 2.5 s (x KVD_TEST_TIME_SCALE)" python3 -c \
	'import sys; v=sys.argv[1]; sys.exit(0 if v!="None" and float(v)<=1+2.5*int(sys.argv[2]) else 1)' "$(jget "$out" max_close_s)" "$TSCALE"
out=$(timeout $((30 * TSCALE)) $ATTACK late "127.0.0.1:$SP" $((8 * TSCALE / 10)).$((8 * TSCALE % 10)))
echo "# silent 0.8 s, then a frame trickled: $out"
check "late frame: closed within the read timeout of accept + one sweep + slack, not of its first byte" python3 -c \
	'import sys; v=sys.argv[1]; sys.exit(0 if v!="None" and float(v)<=1.6*int(sys.argv[2]) else 1)' "$(jget "$out" closed_s)" "$TSCALE"
wait $gpid || true
check "slowloris: a normal client was served meanwhile" \
	test -n "$(json_get finish_reason <"$T/during_slow")"
check "read timeouts logged" grep -q "event=client_closed.*reason=read_timeout" "$T/solo.log"

# --- connection flood -------------------------------------------------------------
rm -f "$T/flood.ready"
timeout $((60 * TSCALE)) $ATTACK flood "127.0.0.1:$SP" 250 2 "$T/flood.ready" >"$T/flood.out" &
fpid=$!
wait_for 10 test -s "$T/flood.ready" || true
check "flood: kvctl status answers while 250 connections are open" \
	quiet timeout 5 "$KVCTL" --socket "$T/solo.sock" status
wait $fpid || true
out=$(cat "$T/flood.out")
echo "# flood: $out"
check "flood: max_clients (64) connections held" test "$(jget "$out" held)" = 64
check "flood: the 186 others got an OVERLOADED frame error" test "$(jget "$out" overloaded)" = 186
check "flood: no other event on any connection" test "$(jget "$out" other)" = 0
served "after the flood"

# --- a client that never reads ------------------------------------------------------
gen "$SP" --prompt "Once upon a time" --max-tokens 8 >"$T/during_noread" 2>&1 &
gpid=$!
out=$(timeout $((60 * TSCALE)) $ATTACK noread "127.0.0.1:$SP" 25 "$PID_solo")
echo "# noread: $out"
wait $gpid || true
check "non-reading client: RSS growth under 64 MB" \
	python3 -c 'import sys; sys.exit(0 if int(sys.argv[1]) < 65536 else 1)' "$(jget "$out" growth_kb)"
check "non-reading client: the connection was closed" test "$(jget "$out" closed_at)" != None
check "non-reading client: closed for a write bound (logged)" \
	grep -Eq "event=client_closed.*reason=write_(queue_hard|stall)" "$T/solo.log"
check "non-reading client: another client was served meanwhile" \
	test -n "$(json_get finish_reason <"$T/during_noread")"
check "non-reading client: zero pages held afterwards" settle solo
served "after the non-reading client"

stop_node solo
serve_finish
