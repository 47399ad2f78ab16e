#!/usr/bin/env bash
# A rolling restart under load (issue 25 item 6): haproxy with the
# committed deploy/haproxy/kvd.cfg in front of two decode nodes, two
# prefill nodes behind them, every name from the test's dnsmasq
# (lb_lib.sh lb_cluster: decodes reach the prefills as prefill.kvd.test,
# haproxy the decodes as decode-N.kvd.test), in the test's own network
# and mount namespaces. Closed-loop streaming clients (lb_load.py, two
# keys per decode node) run throughout; every node is restarted, one at a
# time, the way deploy/haproxy/README.md says:
#  - a decode node: kvctl drain (waits until what it holds is served;
#    /readyz is 503 from the start), haproxy marks it DOWN, SIGTERM (exit
#    0), start, /readyz 200, haproxy marks it UP;
#  - a prefill node, as a Kubernetes pod leaves a headless Service: its
#    address leaves prefill.kvd.test's answer as kvctl drain begins; the
#    decode nodes re-resolve every 2 s (peers.resolve_interval_ms; 5 s by
#    default), so for up to 2 s they still send it requests, which it
#    refuses `draining` and decode fails over to the other prefill (a kvd
#    without decode failover fails them: this test then fails, on the
#    prefill restarts only); then the decodes' links to it close,
#    SIGTERM, start, ready, back in the answer, both decodes link to it
#    again.
# Then: no client request failed (every stream ended with its finish
# reason and [DONE]), the load ran through every restart, every node's
# pool is all free (nothing held, in flight or quarantined), and TTFT
# p50/p99 during the restarts is printed against the steady state.
. "$(dirname "$0")/lb_lib.sh"
lb_netns "$0" "$@"
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/serve_lib.sh"
. "$(dirname "$0")/lb_lib.sh"
need_haproxy

"$KVCTL" model make "$T/big.gguf" --layers 4 --dim 256 --heads 4 --kv-heads 2 \
	--ff 512 --vocab 2000 --ctx 2048 --seed 11 >/dev/null
check "the cluster is up behind haproxy, keys on both decodes" lb_cluster "$T/big.gguf"
[ "$FAILS" = 0 ] || { finish; exit 1; }

# decode_restart N: drain, DOWN, SIGTERM, start, ready, UP
decode_restart() {
	local n=$1 rc=0 h=127.0.0.$(($1 + 3)):$H_PORT
	timeout 60 "$KVCTL" --socket "$T/d$n.sock" drain >/dev/null || rc=$?
	check "d$n: kvctl drain returns drained ($rc)" test "$rc" = 0
	check "d$n: haproxy marks it DOWN" wait_for 10 lb_is "decode$n" DOWN
	kill -TERM "$(eval echo "\$PID_d$n")"
	rc=0; wait "$(eval echo "\$PID_d$n")" || rc=$?
	check "d$n: exits 0 on SIGTERM ($rc)" test "$rc" = 0
	start_node "d$n"
	check "d$n: /readyz 200 again" wait_for 40 eval '[ "$(readyz '"$h"')" = 200 ]'
	check "d$n: haproxy marks it UP" wait_for 15 lb_is "decode$n" UP
}

# prefill_restart N: out of the name's answer + drain, links closed,
# SIGTERM, start, ready, back in the answer, linked again
prefill_restart() {
	local n=$1 rc=0 ip=127.0.0.$(($1 + 1)) m1 m2
	m1=$(log_mark "$T/d1.log"); m2=$(log_mark "$T/d2.log")
	LB_OUT=$ip; lb_hosts
	RJ1=$(log_count "$T/d1.log" "event=prefill_rejected"); RJ2=$(log_count "$T/d2.log" "event=prefill_rejected")
	timeout 60 "$KVCTL" --socket "$T/p$n.sock" drain >/dev/null || rc=$?
	check "p$n: kvctl drain returns drained ($rc)" test "$rc" = 0
	for d in 1 2; do
		check "p$n: d$d's link to it closed" \
			wait_log "$T/d$d.log" "event=peer_drained peer=\"?$ip:$P_PORT\"?" 15 "$(eval echo "\$m$d")"
	done
	echo "# p$n: the decodes sent it $(( $(log_count "$T/d1.log" "event=prefill_rejected") - RJ1 + $(log_count "$T/d2.log" "event=prefill_rejected") - RJ2 )) requests it refused while draining, before they re-resolved its name"
	kill -TERM "$(eval echo "\$PID_p$n")"
	rc=0; wait "$(eval echo "\$PID_p$n")" || rc=$?
	check "p$n: exits 0 on SIGTERM ($rc)" test "$rc" = 0
	m1=$(log_mark "$T/d1.log"); m2=$(log_mark "$T/d2.log")
	start_node "p$n" "${LB_PREFILL_ENV[@]}"
	check "p$n: ready again" wait_for 30 eval '[ "$(status_get p'"$n"' state)" = ready ]'
	LB_OUT=""; lb_hosts
	for d in 1 2; do
		check "p$n: d$d links to it again" \
			wait_log "$T/d$d.log" "event=peer_up peer=\"?$ip:$P_PORT\"?" 20 "$(eval echo "\$m$d")"
	done
}

load_start "$LB_URL" "$T/load" "$(lb_load_keys 2)" --max-tokens 32 --think-ms 20
sleep 5
T_R0=$(now)
PH=()
for step in d1 p1 d2 p2; do
	t=$(now)
	case $step in
	d*) decode_restart "${step#d}" ;;
	p*) prefill_restart "${step#p}" ;;
	esac
	PH+=("$step:$t:$(now)")
	sleep 1
done
T_R1=$(now)
sleep 3
load_stop

S_ALL=$(load_stats "$T/load")
S_STEADY=$(load_stats "$T/load" --to "$T_R0")
S_AFTER=$(load_stats "$T/load" --from "$T_R1")
S_RESTART=$(load_stats "$T/load" --from "$T_R0" --to "$T_R1")
echo "# all requests:           $S_ALL"
echo "# steady state (before):  $S_STEADY"
echo "# during the restarts:    $S_RESTART"
echo "# after:                  $S_AFTER"
for p in "${PH[@]}"; do
	IFS=: read -r step a b <<<"$p"
	echo "# restart of $step ($(awk "BEGIN { printf \"%.1f\", $b - $a }") s): $(load_stats "$T/load" --from "$a" --to "$b")"
done
echo "# TTFT p50/p99 (ms): steady $(jq -r '"\(.ttft_p50_ms)/\(.ttft_p99_ms)"' <<<"$S_STEADY"), during the restarts $(jq -r '"\(.ttft_p50_ms)/\(.ttft_p99_ms)"' <<<"$S_RESTART")"
check "no client request failed ($(jq -c .outcomes <<<"$S_ALL"); $(jq -c .failures <<<"$S_ALL"))" \
	jqt '.ok == .n' <<<"$S_ALL"
for p in "${PH[@]}"; do
	IFS=: read -r step a b <<<"$p"
	check "requests ran through the restart of $step" \
		jqt '.ok >= 4' <<<"$(load_stats "$T/load" --from "$a" --to "$b")"
done
check "the load ran before and after ($(jq .n <<<"$S_STEADY"), $(jq .n <<<"$S_AFTER"))" \
	jqt --argjson a "$(jq .n <<<"$S_AFTER")" '.n >= 10 and $a >= 4' <<<"$S_STEADY"
check "no page held, in flight or quarantined on any node" wait_for 15 pool_clean d1 d2 p1 p2
for n in d1 d2 p1 p2; do echo "# $n: $(pool_line "$n")"; done
for n in d1 d2; do
	check "$n failed no request (counters.failed $(status_get "$n" counters.failed))" \
		test "$(status_get "$n" counters.failed)" = 0
done
serve_finish
