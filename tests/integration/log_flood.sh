#!/usr/bin/env bash
# A remote party cannot fill a node's disk through its log: the lines it
# can trigger at will go through a token bucket per kind (conf/ratelimit.h,
# daemon/node/serve_int.h enum serve_rl), and what is held back is counted in
# `event=log_suppressed kind=K suppressed=N` lines.
#   - an authenticated peer (tests/attack/kvd_attack junk-flood) sends a
#     prefill node 3000 control frames it never expects: a bounded number
#     of `peer_protocol` lines, and lines + suppressed counts = 3000
#     exactly once the flood ends; the link and the node stay up;
#   - a fake prefill peer answers a request with 2000 abort_acks nobody
#     asked for: a bounded number of `abort_acked` lines on decode, the
#     accounting adds up, the request still ends and frees its pages;
#   - an HTTP client sends 400 pipelined requests with a wrong key: 400
#     answers of 401, a bounded number of `http_request` lines, the
#     summary adds up to 400, and /metrics still counts every refusal.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/serve_lib.sh"

ATTACK_BIN=$KVD_BUILD/tests/kvd_attack
[ -x "$ATTACK_BIN" ] || skip "$ATTACK_BIN not built"
command -v python3 >/dev/null || skip "python3 absent"
command -v curl >/dev/null || skip "curl absent"

# daemon/node/serve_int.h: SERVE_RL_BURST lines at once, one per
# SERVE_RL_PERIOD_MS after that
BURST=32
PERIOD_MS=500
# most lines a bucket lets through in S seconds (plus one for rounding)
bound() { echo $(( BURST + ($1 * 1000 / PERIOD_MS) + 1 )); }
ms() { date +%s%3N; }

gen_model "$T/m.gguf"
M=$T/m.gguf

# sum_suppressed FILE KIND MARK: the suppressed counts of KIND after MARK
sum_suppressed() {
	log_since "$1" "$3" | grep -Eo "event=log_suppressed kind=$2 suppressed=[0-9]+" |
		awk -F= '{ s += $NF } END { print s + 0 }'
}
# accounted FILE EVENT_RE KIND MARK WANT: lines + suppressed = WANT
accounted() {
	local n s
	n=$(log_count "$1" "$2" "$4")
	s=$(sum_suppressed "$1" "$3" "$4")
	[ $((n + s)) -eq "$5" ]
}

# ---- a peer's unexpected messages ---------------------------------------------
next_port; P_PORT=$PORT
write_node pf prefill "$M" "listen.peer=127.0.0.1:$P_PORT"
start_node pf
check "prefill up" wait_log "$T/pf.log" "event=serve_ready" 60
MP=$(log_mark "$T/pf.log")
t0=$(ms)
"$ATTACK_BIN" --log "$T/pf.log" --key "$(cluster_key)" junk-flood "127.0.0.1:$P_PORT" 3000 \
	> "$T/junk.out" 2>&1 || true
secs=$(( ($(ms) - t0) / 1000 + 1 ))
echo "# junk flood: $(cat "$T/junk.out") in ${secs}s"
check "junk: the attacker sent 3000 unexpected frames" grep -q "handshake=ok junk=3000" "$T/junk.out"
# every frame is accounted for once the bucket reopens (the sweep says it)
check "junk: lines + suppressed add up to 3000" \
	wait_for 10 accounted "$T/pf.log" "event=peer_protocol .*unexpected prefill_reject" peer_protocol "$MP" 3000
n=$(log_count "$T/pf.log" "event=peer_protocol" "$MP")
secs=$(( ($(ms) - t0) / 1000 + 1 ))
echo "# junk flood: $n peer_protocol lines, $(sum_suppressed "$T/pf.log" peer_protocol "$MP") suppressed, ${secs}s"
check "junk: at most $(bound $secs) peer_protocol lines in ${secs}s (not 3000)" \
	test "$n" -ge 1 -a "$n" -le "$(bound $secs)"
check "junk: the summary line names its kind and count" \
	log_has "$T/pf.log" "level=warn node=pf event=log_suppressed kind=peer_protocol suppressed=[1-9][0-9]*$" "$MP"
check "junk: prefill is alive" kill -0 "$PID_pf"
stop_node pf

# ---- a prefill peer's unsolicited abort_acks -------------------------------------
# a keyless fake prefill (fake_peer.py ackflood) at the decode node's
# configured address: it pairs, takes one prefill_request and answers it
# with 2000 abort_acks nobody asked for (decode is transferring, not
# aborting), then a prefill_reject
next_port; F_PORT=$PORT
next_port; D_PORT=$PORT
write_node da decode "$M" "listen.client=127.0.0.1:$D_PORT" "peers.prefill=127.0.0.1:$F_PORT" \
	"peers.key_file="
start_node da
check "decode up" wait_log "$T/da.log" "event=serve_ready" 60
MD=$(log_mark "$T/da.log")
python3 "$(dirname "$0")/fake_peer.py" ackflood "127.0.0.1:$F_PORT" "$T/da.log" 2000 $((30 * TSCALE)) \
	> "$T/ack.out" 2>&1 &
FPID=$!
PIDS+=("$FPID")
check "decode paired with the fake prefill" wait_log "$T/da.log" "event=peer_capacity .*peer_node=ackflood" 20 "$MD"
out=$(gen "$D_PORT" --prompt "Once upon a time" --max-tokens 4 2>&1 || true)
wait "$FPID" || true
echo "# ack flood: $(cat "$T/ack.out"); the client got: $out"
check "acks: the fake sent 2000 abort_acks for the request in transfer" grep -q "handshake=ok acks=2000 " "$T/ack.out"
check "acks: the request ended with the fake's reject" bash -c "grep -q 'ackflood: done' <<<'$out'"
check "acks: lines + suppressed add up to 2000" \
	wait_for 10 accounted "$T/da.log" "event=abort_acked " peer_ack "$MD" 2000
n=$(log_count "$T/da.log" "event=abort_acked " "$MD")
echo "# ack flood: $n abort_acked lines, $(sum_suppressed "$T/da.log" peer_ack "$MD") suppressed"
check "acks: at most $(bound 5) abort_acked lines (not 2000)" test "$n" -ge 1 -a "$n" -le "$(bound 5)"
check "acks: decode holds nothing" settle da
check "acks: decode is alive" kill -0 "$PID_da"
stop_node da

# ---- an HTTP client's wrong keys ----------------------------------------------------
KEY=carol-0123456789abcdef0123456789abcdef
printf '%s carol admin\n' "$KEY" > "$T/keys"
chmod 600 "$T/keys"
next_port; S_HTTP=$PORT
write_node sa standalone "$M" "listen.http=127.0.0.1:$S_HTTP" "http.api_keys_file=$T/keys"
start_node sa
check "standalone with HTTP up" wait_log "$T/sa.log" "event=serve_ready" 60
MS=$(log_mark "$T/sa.log")
t0=$(ms)
python3 "$(dirname "$0")/http_raw.py" "$S_HTTP" badkeys 400 > "$T/bad.out" 2>&1 || true
echo "# bad keys: $(cat "$T/bad.out")"
check "badkeys: 400 answers, every one 401" grep -q "^answers=400 status401=400$" "$T/bad.out"
check "badkeys: lines + suppressed add up to 400" \
	wait_for 10 accounted "$T/sa.log" "event=http_request .*status=401" http_refused "$MS" 400
n=$(log_count "$T/sa.log" "event=http_request .*status=401" "$MS")
secs=$(( ($(ms) - t0) / 1000 + 1 ))
echo "# bad keys: $n http_request lines, $(sum_suppressed "$T/sa.log" http_refused "$MS") suppressed, ${secs}s"
check "badkeys: at most $(bound $secs) lines in ${secs}s (not 400)" \
	test "$n" -ge 1 -a "$n" -le "$(bound $secs)"
curl -s "127.0.0.1:$S_HTTP/metrics" -H "Authorization: Bearer $KEY" > "$T/metrics" || true
check "badkeys: /metrics still counts all 400 refusals" \
	grep -q '^kvd_requests_total{tenant="default",outcome="invalid_request"} 400$' "$T/metrics"
check "badkeys: the node still serves the good key" \
	test "$(curl -s -o /dev/null -w '%{http_code}' "127.0.0.1:$S_HTTP/v1/models" -H "Authorization: Bearer $KEY")" = 200
stop_node sa
serve_finish
