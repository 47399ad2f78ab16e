#!/usr/bin/env bash
# SIGKILL under load (issue 25 item 6): the cluster of rolling_restart.sh
# (haproxy with deploy/haproxy/kvd.cfg, decode nodes d1 d2, prefill nodes
# p1 p2, names from the test's dnsmasq, lb_lib.sh lb_cluster); prefills
# send one batch per 300 ms (slow_batch) so requests stay on them a
# while. Closed-loop streaming clients, two keys per decode node; when d1
# streams an answer and p1 is still sending the KV of one of d2's
# requests (both decodes' debug logs), d1 and p1 are SIGKILLed.
#  - what was streaming on d1 ends at the client with the stream cut
#    (HTTP 200, events, then the connection closes with no [DONE]: the
#    head went out with the first token, so haproxy cannot turn it into
#    a 5xx), within seconds, never a hang; a request d1 had taken but
#    not answered a byte of is retried by haproxy on d2 (retry-on
#    empty-response) and completes;
#  - every other request completes: d2's, and those d1's keys send after
#    the kill (haproxy: connection refused, retried on d2, then DOWN);
#    those d2 had on p1 too (decode failover to p2: event=failover; a kvd
#    without failover ends them 500 and this test fails);
#  - the survivors (d2, p2) end with every page free, nothing in flight
#    or quarantined, and serve on.
. "$(dirname "$0")/lb_lib.sh"
lb_netns "$0" "$@"
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/serve_lib.sh"
. "$(dirname "$0")/lb_lib.sh"
need_haproxy
grep -q "KVD_FAULT_POINTS 1" "$KVD_BUILD/kvd_build.h" || skip "built without fault points (slow_batch)"

"$KVCTL" model make "$T/big.gguf" --layers 4 --dim 256 --heads 4 --kv-heads 2 \
	--ff 512 --vocab 2000 --ctx 2048 --seed 11 >/dev/null
LB_DECODE_LOG=debug
# prompts of about 60 tokens (--prompt-repeat 8) in batches of one page:
# a transfer takes four or five batches, a second and more, so the kill
# finds one of d2's under way
LB_NODE_KEYS=("transfer.max_batch_bytes=70000")
check "the cluster is up behind haproxy, keys on both decodes" \
	lb_cluster "$T/big.gguf" KVD_FAULT=slow_batch
[ "$FAILS" = 0 ] || { finish; exit 1; }

load_start "$LB_URL" "$T/load" "$(lb_load_keys 2)" --max-tokens 384 --prompt-repeat 8
sleep 4
# on_p1_from_d2: d2 has a request whose KV p1 has not finished sending
# (d2's debug log: prefill_sent to p1's address, no transfer_done, no end)
on_p1_from_d2() {
	local a e
	a=$(grep -E "event=prefill_sent id=[0-9]+ .* peer=\"?127.0.0.2:$P_PORT\"? " "$T/d2.log" |
		grep -o " id=[0-9]*" | sort -u)
	e=$(grep -E "event=(transfer_done|request_done|request_failed) id=[0-9]+ " "$T/d2.log" |
		grep -o " id=[0-9]*" | sort -u)
	[ -n "$(comm -23 <(echo "$a") <(echo "$e"))" ]
}
# streaming_on_d1: d1 streams an answer now (its KV arrived, not ended)
streaming_on_d1() {
	local a e
	a=$(grep -E "event=transfer_done id=[0-9]+ " "$T/d1.log" | grep -o " id=[0-9]*" | sort -u)
	e=$(grep -E "event=(request_done|request_failed) id=[0-9]+ " "$T/d1.log" | grep -o " id=[0-9]*" | sort -u)
	[ -n "$(comm -23 <(echo "$a") <(echo "$e"))" ]
}
# (p1's side checked again last: the greps of a loaded machine take time)
both_busy() { on_p1_from_d2 && streaming_on_d1 && on_p1_from_d2; }
check "d1 streams an answer and p1 is sending one of d2's" wait_for 30 both_busy
T_K=$(now)
kill -KILL "$PID_d1" "$PID_p1"
wait "$PID_d1" 2>/dev/null || true
wait "$PID_p1" 2>/dev/null || true
check "haproxy marks d1 DOWN" wait_for 10 lb_is decode1 DOWN
sleep 5
load_stop

# the outcome of every request, with its key's node
K1=$(printf '%s,' "${LB_KEYS_1[@]:0:2}"); K1="[${K1%,}]"
K2=$(printf '%s,' "${LB_KEYS_2[@]:0:2}"); K2="[${K2%,}]"
# lb_load.py numbers its clients by their place in the key list: 0 2 on
# d1's keys, 1 3 on d2's (lb_load_keys)
jq -c --argjson tk "$T_K" '. + {on_d1: (.key % 2 == 0), before: (.t0 < $tk)}' "$T/load" > "$T/load.j"
S=$(load_stats "$T/load")
echo "# all requests: $S"
n_cut=$(jq -s '[.[] | select(.outcome == "cut")] | length' "$T/load.j")
n_bad=$(jq -s '[.[] | select(.outcome != "ok" and .outcome != "cut")] | length' "$T/load.j")
n_cut_d1=$(jq -s --argjson tk "$T_K" '[.[] | select(.outcome == "cut" and .on_d1 and .before and .t_end < $tk + 5)] | length' "$T/load.j")
n_d2=$(jq -s '[.[] | select(.on_d1 | not)] | length' "$T/load.j")
n_d2_ok=$(jq -s '[.[] | select((.on_d1 | not) and .outcome == "ok")] | length' "$T/load.j")
n_after=$(jq -s --argjson tk "$T_K" '[.[] | select(.on_d1 and .t0 > $tk + 0.1)] | length' "$T/load.j")
n_after_ok=$(jq -s --argjson tk "$T_K" '[.[] | select(.on_d1 and .t0 > $tk + 0.1 and .outcome == "ok")] | length' "$T/load.j")
n_d1_in_ok=$(jq -s --argjson tk "$T_K" '[.[] | select(.on_d1 and .t0 < $tk and .t_end > $tk and .outcome == "ok")] | length' "$T/load.j")
echo "# in flight on d1 at the kill: $n_cut cut at the client, $n_d1_in_ok retried by haproxy and completed"
echo "# d2's keys: $n_d2_ok of $n_d2 ok; d1's keys after the kill: $n_after_ok of $n_after ok"
jq -s -c --argjson tk "$T_K" '.[] | select(.outcome != "ok") | {key, outcome, detail, began: (.t0 - $tk), ended: (.t_end - $tk)}' "$T/load.j" | head -8 | sed 's/^/# /'
check "no request ended other than complete or cut ($n_bad)" test "$n_bad" = 0
check "every cut stream was on d1, began before the kill, ended within 5 s of it ($n_cut_d1 of $n_cut)" \
	test "$n_cut_d1" = "$n_cut"
check "at most d1's two clients were cut ($n_cut)" test "$n_cut" -le 2
check "d1 had a request in flight at the kill, and it ended cut or completed ($n_cut + $n_d1_in_ok)" \
	test $((n_cut + n_d1_in_ok)) -ge 1
check "every request of d2's keys completed ($n_d2_ok of $n_d2)" test "$n_d2_ok" = "$n_d2" -a "$n_d2" -ge 4
check "d1's keys after the kill completed, on d2 ($n_after_ok of $n_after)" \
	test "$n_after_ok" = "$n_after" -a "$n_after" -ge 2
check "d2 saw its link to p1 go" log_has "$T/d2.log" "event=peer_down peer=\"?127.0.0.2:$P_PORT\"?"
# d2's requests the kill caught on p1: sent there, their KV never came
a=$(grep -E "event=prefill_sent id=[0-9]+ .* peer=\"?127.0.0.2:$P_PORT\"? " "$T/d2.log" | grep -o " id=[0-9]*" | sort -u)
e=$(grep -E "event=transfer_done id=[0-9]+ " "$T/d2.log" | grep -o " id=[0-9]*" | sort -u)
CAUGHT=$(comm -23 <(echo "$a") <(echo "$e") | grep -c id || true)
echo "# d2's requests caught mid-transfer on p1: $CAUGHT; d2's failovers: $(log_count "$T/d2.log" "event=failover ")"
check "the survivors hold no page, nothing in flight or quarantined" wait_for 15 pool_clean d2 p2
for n in d2 p2; do echo "# $n: $(pool_line "$n")"; done
st=$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer ${KEYS[${LB_KEYS_1[0]}]}" \
	-d '{"prompt":"after","max_tokens":4}' "$LB_URL/v1/completions" || true)
check "the survivors serve on ($st)" test "$st" = 200
check "  ... and hold nothing after it" wait_for 15 pool_clean d2 p2
serve_finish
