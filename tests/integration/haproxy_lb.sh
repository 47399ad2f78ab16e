#!/usr/bin/env bash
# HAProxy in front of two kvd nodes (issue 25 item 4), with the committed
# config, deploy/haproxy/kvd.cfg, as it is (lb_lib.sh: its addresses come
# from the environment). Two standalone nodes on loopback, each with the
# OpenAI API and the same API keys:
#  - requests go through, answered by the nodes;
#  - SSE passes unbuffered: through HAProxy the events of an 800-token
#    stream arrive spread over time (in at least a third as many distinct
#    5 ms slots as straight from the node), the first long before the
#    last (without `option http-no-delay` they come in a few bursts, the
#    first after ~200 ms);
#  - API-key affinity: every request of a key lands on one node, and the
#    eight keys spread over both (hash on the Authorization header);
#  - `kvctl drain` on one node: /readyz is 503 at once; requests that
#    reach it before HAProxy's checks notice are refused `draining`
#    (nothing admitted) and HAProxy retries them on the other node (the
#    clients write head and body apart, as python's do: without option
#    http-buffer-request some were not retryable); then
#    HAProxy marks it DOWN (the time is printed against the config's
#    bound); under closed-loop streaming load no client request fails;
#    `kvctl resume`: UP again and its keys come back to it;
#  - SIGTERM on a node under load (no drain first): its requests finish,
#    what reaches it is refused or finds the port closed and is retried
#    on the other node: no client request fails, it exits 0;
#  - no page is held anywhere at the end.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/serve_lib.sh"
. "$(dirname "$0")/lb_lib.sh"
need_haproxy

# a model whose tokens take about a millisecond each, so a stream lasts
# long enough to see how it arrives (http_tenants.sh's)
"$KVCTL" model make "$T/big.gguf" --layers 4 --dim 256 --heads 4 --kv-heads 2 \
	--ff 512 --vocab 2000 --ctx 8192 --seed 11 >/dev/null
NK=8
KEYS=()
: > "$T/keys"
for ((i = 0; i < NK; i++)); do
	KEYS+=("t$i-0123456789abcdef0123456789abcdef-$i")
	echo "${KEYS[$i]} tenant$i" >> "$T/keys"
done
chmod 600 "$T/keys"
next_port; H1=$PORT
next_port; H2=$PORT
next_port; LB=$PORT
for n in 1 2; do
	p=H$n
	write_node "d$n" standalone "$T/big.gguf" "listen.http=127.0.0.1:${!p}" \
		"http.api_keys_file=$T/keys" "kv.pool_tokens=16384" "log.level=info"
	start_node "d$n"
done
check "both nodes are ready" wait_for 30 eval '[ "$(readyz 127.0.0.1:$H1)" = 200 ] && [ "$(readyz 127.0.0.1:$H2)" = 200 ]'
check "haproxy -c accepts deploy/haproxy/kvd.cfg" lb_start "127.0.0.1:$LB" "127.0.0.1:$H1" "127.0.0.1:$H2"
check "haproxy sees both nodes UP (/readyz checks)" wait_for 15 eval 'lb_is decode1 UP && lb_is decode2 UP'
U=http://127.0.0.1:$LB


# ---- requests go through -----------------------------------------------
st=$(curl -s -o "$T/body" -w '%{http_code}' -H "Authorization: Bearer ${KEYS[0]}" \
	-d '{"prompt":"Once upon a time","max_tokens":8}' "$U/v1/completions" || true)
check "a completion through haproxy: 200 ($st)" test "$st" = 200
check "  ... with a node's answer" jqt '.object == "text_completion" and .usage.completion_tokens > 0' "$T/body"
st=$(curl -s -o /dev/null -w '%{http_code}' -d '{"prompt":"x","max_tokens":2}' "$U/v1/completions" || true)
check "  ... a request without a key: the node's 401 passes through ($st)" test "$st" = 401

# ---- SSE passes unbuffered --------------------------------------------------
# (up to three tries, the first that passes counts: a loaded machine can
# hold any process back for tens of ms, while a buffering proxy holds
# every stream)
for try in 1 2 3; do
	direct=$(python3 "$LB_LOAD" sse "http://127.0.0.1:$H1" "${KEYS[0]}" 800)
	vialb=$(python3 "$LB_LOAD" sse "$U" "${KEYS[0]}" 800)
	echo "# try $try: SSE straight from the node: $direct"
	echo "# try $try: SSE through haproxy:        $vialb"
	dd=$(jq .distinct <<<"$direct")
	jqt --argjson d "$dd" '.outcome == "ok" and .first < .last / 2 and .distinct >= 10 and
		.distinct * 3 >= $d' <<<"$vialb" && break
done
check "the stream through haproxy ends well" jqt '.outcome == "ok" and .events > 100' <<<"$vialb"
check "  ... its first event well before its last (first < last / 2)" \
	jqt '.first < .last / 2' <<<"$vialb"
check "  ... its events spread over time as from the node (distinct 5 ms slots: $(jq .distinct <<<"$vialb") via haproxy, $dd direct)" \
	jqt --argjson d "$dd" '.distinct >= 10 and .distinct * 3 >= $d' <<<"$vialb"

# ---- API-key affinity -------------------------------------------------------
MA1=$(log_mark "$T/d1.log"); MA2=$(log_mark "$T/d2.log")
for ((i = 0; i < NK; i++)); do
	for r in 1 2 3; do
		curl -s -o /dev/null -H "Authorization: Bearer ${KEYS[$i]}" \
			-d "{\"prompt\":\"key $i request $r\",\"max_tokens\":4}" "$U/v1/completions" || true
	done
done
ON1=(); ON2=(); SPLIT=0
for ((i = 0; i < NK; i++)); do
	a=$(served d1 "tenant$i" "$MA1"); b=$(served d2 "tenant$i" "$MA2")
	if [ "$a" -ge 3 ] && [ "$b" = 0 ]; then ON1+=("$i")
	elif [ "$b" -ge 3 ] && [ "$a" = 0 ]; then ON2+=("$i")
	else SPLIT=$((SPLIT + 1)); echo "# tenant$i: $a on d1, $b on d2"; fi
done
echo "# keys on d1: ${ON1[*]:-none}; on d2: ${ON2[*]:-none}"
check "every key's requests landed on one node ($SPLIT split)" test "$SPLIT" = 0
check "the keys spread over both nodes (${#ON1[@]} on d1, ${#ON2[@]} on d2)" \
	test "${#ON1[@]}" -ge 1 -a "${#ON2[@]}" -ge 1
[ "${#ON1[@]}" -ge 1 ] && [ "${#ON2[@]}" -ge 1 ] || finish || exit 1

# ---- drain one node under load ------------------------------------------------
# four streaming clients: two keys of each node
LK=$(printf '%s,' "${KEYS[${ON1[0]}]}" "${KEYS[${ON2[0]}]}" \
	"${KEYS[${ON1[1]:-${ON1[0]}}]}" "${KEYS[${ON2[1]:-${ON2[0]}}]}")
load_start "$U" "$T/load1" "${LK%,}" --max-tokens 48
sleep 2
R1=$(status_get d1 counters.rejected.draining)
W0=$(lb_retries decode1)
t0=$(now)
"$KVCTL" --socket "$T/d1.sock" drain --no-wait >/dev/null
A1=$(status_get d1 counters.admitted)
check "d1 draining: /readyz 503 at once" test "$(readyz "127.0.0.1:$H1")" = 503
# requests of a d1 key right away, before HAProxy's checks can notice
PROBE=0
for r in 1 2 3 4; do
	st=$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer ${KEYS[${ON1[0]}]}" \
		-d '{"prompt":"probe","max_tokens":4}' "$U/v1/completions" || true)
	[ "$st" = 200 ] && PROBE=$((PROBE + 1))
done
t1=$(now)
check "requests of a d1 key sent then succeed ($PROBE of 4)" test "$PROBE" = 4
RD=$(( $(status_get d1 counters.rejected.draining) - R1 ))
W1=$(lb_retries decode1)
check "  ... d1 refused them 'draining' ($RD) and haproxy retried them elsewhere ($((W1 - W0)) retries)" \
	test "$RD" -ge 1 -a "$((W1 - W0))" -ge "$RD"
check "haproxy marks d1 DOWN" wait_for 10 lb_is decode1 DOWN
t2=$(now)
echo "# d1 DOWN in haproxy $(awk "BEGIN { print $t2 - $t0 }") s after kvctl drain (probes took $(awk "BEGIN { print $t1 - $t0 }") s; bound: inter 2s + fastinter 0.5s + a check)"
check "  ... within the config's bound (inter + (fall-1) x fastinter + timeout check = 4.5 s, + 1 s of polling)" \
	awk "BEGIN { exit !($t2 - $t0 < 5.5 * $TSCALE) }"
M2=$(log_mark "$T/d2.log")
sleep 2
check "d1 admitted nothing since the drain" test "$(status_get d1 counters.admitted)" = "$A1"
check "d2 served d1's keys meanwhile" test "$(served d2 "tenant${ON1[0]}" "$M2")" -ge 1
check "d1 is drained" wait_for 10 eval '[ "$(status_get d1 state)" = drained ]'
"$KVCTL" --socket "$T/d1.sock" resume >/dev/null
check "kvctl resume: /readyz 200" test "$(readyz "127.0.0.1:$H1")" = 200
check "haproxy marks d1 UP again" wait_for 10 lb_is decode1 UP
M1=$(log_mark "$T/d1.log")
sleep 1.5
check "d1 serves its keys again" test "$(served d1 "tenant${ON1[0]}" "$M1")" -ge 1
load_stop
S=$(load_stats "$T/load1")
echo "# load during drain and resume: $S"
check "no client request failed ($(jq -c .outcomes <<<"$S"))" jqt '.n >= 20 and .ok == .n' <<<"$S"

# ---- SIGTERM under load, no drain first ---------------------------------------
load_start "$U" "$T/load2" "${LK%,}" --max-tokens 48
sleep 1.5
kill -TERM "$PID_d2"
rc=0; wait "$PID_d2" || rc=$?
check "d2 exits 0 on SIGTERM under load ($rc)" test "$rc" = 0
check "haproxy marks d2 DOWN" wait_for 10 lb_is decode2 DOWN
sleep 1
load_stop
S=$(load_stats "$T/load2")
echo "# load across d2's SIGTERM: $S"
check "no client request failed ($(jq -c .outcomes <<<"$S"))" jqt '.n >= 10 and .ok == .n' <<<"$S"
check "no page held on d1" wait_for 10 pool_clean d1
echo "# d1: $(pool_line d1)"
serve_finish
