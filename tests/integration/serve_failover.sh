#!/usr/bin/env bash
# Failover (peers.failover_retries): one decode node, two prefill peers.
#  - kill: prefill A sends one batch per 300 ms (fault point slow_batch),
#    so its transfers are mid-way when it is SIGKILLed under a load of N
#    concurrent requests; every request ends with the output of its solo
#    run (`kvd generate`, the same ids: invariant 9) - those on A placed
#    again on B (`event=failover ... reason=link_lost`) - decode holds no
#    page afterwards and quarantined none, and kvctl status counts the
#    failovers the log shows;
#  - drain: prefill A, restarted, is drained (`kvctl drain`) under load:
#    it refuses new prefill_requests with DRAINING, decode places them on
#    B (`reason=reject`): zero failed requests;
#  - verbs (KVD_TEST_TRANSPORT=verbs, serve_failover_verbs): the
#    failover comes only after the lost link's QP drained its flushes;
#    a DRAINING refusal releases the pages at once, and they stay fenced
#    until the windows' invalidations completed (release_waited_revoke);
#  - off: with peers.failover_retries = 0 the same kill ends A's requests
#    with the typed error of a lost peer (INTERNAL), no token, no page
#    held.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/serve_lib.sh"

grep -q "KVD_FAULT_POINTS 1" "$KVD_BUILD/kvd_build.h" || skip "built without fault points"
gen_model "$T/m.gguf"
MODEL=$T/m.gguf
N=6
LONG=$(seq -s ' ' 1 60 | sed 's/[0-9]*/once/g')   # a prompt of several pages

prompt_of() { echo "story $1: $LONG"; }
ask() { # ask I OUT: request I in the background (pid in APIDS)
	timeout 60 "$KVCTL" generate --server "127.0.0.1:$C_PORT" --json \
		--prompt "$(prompt_of "$1")" --max-tokens 10 --temperature 0.9 --seed "$1" \
		>"$2" 2>&1 &
	APIDS+=($!)
	PIDS+=($!)
}
wait_asks() { local p; for p in "${APIDS[@]}"; do wait "$p" 2>/dev/null || true; done; APIDS=(); }
failovers_since() { log_count "$T/d.log" "event=failover id=[0-9]+ .*reason=$1 " "$2"; }

for i in $(seq 1 $N); do
	offline --model "$MODEL" --prompt "$(prompt_of "$i")" --max-tokens 10 \
		--temperature 0.9 --seed "$i" >"$T/ref.$i" 2>/dev/null || true
done
refs_ok() { local i; for i in $(seq 1 $N); do [ -n "$(json_get output_ids <"$T/ref.$i")" ] || return 1; done; }
# all_equal PHASE: every answer of PHASE equals its solo run
all_equal() {
	local i bad=0
	for i in $(seq 1 $N); do
		same_ids "$(cat "$T/$1.$i")" "$(cat "$T/ref.$i")" && continue
		echo "request $i: $(cat "$T/$1.$i")"
		bad=1
	done
	return $bad
}
check "references: every solo run produced tokens" refs_ok

next_port; PA=$PORT
next_port; PB=$PORT
next_port; C_PORT=$PORT
write_node pa prefill "$MODEL" "listen.peer=127.0.0.1:$PA" "transfer.max_batch_bytes=16K"
write_node pb prefill "$MODEL" "listen.peer=127.0.0.1:$PB" "transfer.max_batch_bytes=16K"
decode_node() { # decode_node RETRIES: (re)write and start decode
	write_node d decode "$MODEL" "listen.client=127.0.0.1:$C_PORT" \
		"peers.prefill=127.0.0.1:$PA,127.0.0.1:$PB" "transfer.max_batch_bytes=16K" \
		"peers.failover_retries=$1" "transfer.prefill_timeout_ms=20000" \
		"transfer.transfer_timeout_ms=20000"
	local mark
	mark=$(log_mark "$T/d.log")
	start_node d
	wait_for 20 eval '[ "$(log_count "$T/d.log" "event=peer_up " "'"$mark"'")" -ge 2 ]'
}
start_pa() { # start_pa [KVD_FAULT spec]: true once decode paired with it again
	local mark
	mark=$(log_mark "$T/d.log")
	if [ -n "${1:-}" ]; then start_node pa "KVD_FAULT=$1"; else start_node pa; fi
	wait_log "$T/d.log" "event=peer_up peer=127.0.0.1:$PA " 20 "$mark"
}
# kill_mid_transfer MARK: SIGKILL A once a request is on it and a batch
# or two of it are in (one per 300 ms; each request's takes seconds)
kill_mid_transfer() {
	local rc=0
	wait_log "$T/d.log" "event=prefill_sent .*peer=\"?127.0.0.1:$PA " 20 "$1" || rc=1
	sleep 1
	kill -KILL "$PID_pa"
	wait "$PID_pa" 2>/dev/null || true
	return $rc
}
# mid_way MARK: some request that failed over had received a batch
# before (the kill landed mid-transfer, not before or after it)
mid_way() {
	local id
	for id in $(log_since "$T/d.log" "$1" | grep -o "event=failover id=[0-9]*" | sed 's/.*id=//'); do
		log_has "$T/d.log" "event=req_state id=$id .*from=transfer event=batch " "$1" && return 0
	done
	return 1
}
APIDS=()

start_node pa KVD_FAULT=slow_batch
start_node pb
check "decode paired with both prefills" decode_node 1

# --- kill: A dies mid-transfer under load -----------------------------------
MD=$(log_mark "$T/d.log")
for i in $(seq 1 $N); do ask "$i" "$T/kill.$i"; done
check "kill: prefill A was SIGKILLed with requests on it" kill_mid_transfer "$MD"
wait_asks
check "kill: every request equals its solo run" all_equal kill
NF=$(failovers_since link_lost "$MD")
check "kill: requests on A failed over to B (event=failover reason=link_lost, $NF)" \
	eval '[ "$NF" -ge 1 ] && log_has "$T/d.log" "event=failover id=[0-9]+ client_id=[0-9]+ tenant=[^ ]+ from=\"?127.0.0.1:$PA\"? to=\"?127.0.0.1:$PB\"? reason=link_lost attempt=1" "$MD"'
check "kill: a request that failed over had received batches from A" mid_way "$MD"
if [ "${KVD_TEST_TRANSPORT:-tcp}" = verbs ]; then
	# RDMA: the old pages are unfenced (and the request placed again)
	# only after the lost link's QP drained its flush completions
	after_flush() {
		local c f
		c=$(grep -n "event=verbs_closed side=receiver" "$T/d.log" | head -1 | cut -d: -f1)
		f=$(grep -n "event=failover " "$T/d.log" | head -1 | cut -d: -f1)
		[ -n "$c" ] && [ -n "$f" ] && [ "$c" -lt "$f" ]
	}
	check "kill (verbs): the failover came after the flush drained" after_flush
fi
check "kill: no request failed" test "$(log_count "$T/d.log" "event=request_failed " "$MD")" = 0
check "kill: decode holds no page" settle d
check "kill: decode quarantined nothing" test "$(status_get d pool.quarantined)" = 0
check "kill: kvctl status counts the failovers ($NF)" test "$(status_get d counters.failovers)" = "$NF"
metric_failovers() { "$KVCTL" --socket "$T/d.sock" metrics | awk '$1 == "kvd_failovers_total" { print $2 }'; }
check "kill: the metric kvd_failovers_total counts them" test "$(metric_failovers)" = "$NF"

# --- drain: A refuses new requests while it drains --------------------------
check "drain: prefill A back (300 ms per batch)" start_pa slow_batch
MD=$(log_mark "$T/d.log")
# one request on A keeps its drain open while the others arrive; two
# asked at once put one on each prefill by load (A, back, may tie with
# B's stale reported load and lose the tie)
ask 1 "$T/drain.1"
ask 2 "$T/drain.2"
check "drain: a request is on A" wait_log "$T/d.log" "event=prefill_sent .*peer=\"?127.0.0.1:$PA" 20 "$MD"
check "drain: kvctl drain on A" quiet "$KVCTL" --socket "$T/pa.sock" drain
for i in $(seq 3 $N); do ask "$i" "$T/drain.$i"; done
wait_asks
check "drain: every request equals its solo run (zero failed)" all_equal drain
NR=$(failovers_since reject "$MD")
check "drain: A refused with DRAINING and decode placed them again ($NR)" \
	eval '[ "$NR" -ge 1 ] && log_has "$T/d.log" "event=prefill_rejected .*code=DRAINING" "$MD"'
if [ "${KVD_TEST_TRANSPORT:-tcp}" = verbs ]; then
	# RDMA, memory windows: a refused request's pages go back at once,
	# while the invalidations of its windows are still in flight; the
	# transport's fence keeps them out of the free list until those
	# completed (event=release_waited_revoke, with the wait)
	rejects_waited() {
		local ids id
		ids=$(log_since "$T/d.log" "$MD" | grep -E "event=prefill_rejected .*code=DRAINING" |
			sed -E 's/.* id=([0-9]+) .*/\1/')
		[ -n "$ids" ] || return 1
		for id in $ids; do
			log_has "$T/d.log" "event=release_waited_revoke id=$id pages=[1-9][0-9]* waited_ms=[0-9]+ by=invalidate state=released" "$MD" ||
				return 1
		done
	}
	W=$(log_since "$T/d.log" "$MD" | grep -Eo "event=release_waited_revoke .*" |
		grep -Eo "waited_ms=[0-9]+" | tr '\n' ' ')
	check "drain (verbs): each refused request's pages waited for its windows' invalidation ($W)" \
		rejects_waited
fi
check "drain: no request failed" test "$(log_count "$T/d.log" "event=request_failed " "$MD")" = 0
check "drain: decode holds no page" settle d
check "drain: decode quarantined nothing" test "$(status_get d pool.quarantined)" = 0
stop_node pa

# --- off: failover_retries = 0 keeps the typed error -------------------------
stop_node d
start_node pa KVD_FAULT=slow_batch
check "off: decode (failover_retries = 0) paired with both prefills" decode_node 0
MD=$(log_mark "$T/d.log")
for i in $(seq 1 $N); do ask "$i" "$T/off.$i"; done
check "off: prefill A was SIGKILLed with requests on it" kill_mid_transfer "$MD"
wait_asks
lost=0 good=0 other=0
for i in $(seq 1 $N); do
	o=$(cat "$T/off.$i")
	if no_token "$o" && [ "$(echo "$o" | json_get error)" = INTERNAL ]; then
		lost=$((lost + 1))
	elif same_ids "$o" "$(cat "$T/ref.$i")"; then
		good=$((good + 1))
	else
		other=$((other + 1)); echo "request $i: $o"
	fi
done
check "off: A's requests end INTERNAL, no token ($lost); the rest equal their solo runs ($good)" \
	eval '[ $lost -ge 1 ] && [ $other = 0 ]'
check "off: no failover" test "$(log_count "$T/d.log" "event=failover " "$MD")" = 0
check "off: decode failed them for the lost peer" \
	log_has "$T/d.log" "event=request_failed .*code=INTERNAL .*lost during the transfer" "$MD"
check "off: decode holds no page" settle d
check "off: decode quarantined nothing" test "$(status_get d pool.quarantined)" = 0
serve_finish
