#!/usr/bin/env bash
# The incident as a regression test (MISSION.md): the prefill pool is
# smaller than the context (prefill runs with kv.capacity_policy=clamp); a
# prompt that fits the context but not the prefill pool must get
# PROMPT_TOO_LONG on the client, the rejecting node logs why, no page is
# held afterwards on either node, and the next requests are byte-identical
# to their solo runs. Then the same with decode's own admission switched
# off by a fault point: prefill must reject by itself, and the client must
# still get the typed error - never tokens, never a substitute prompt.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/serve_lib.sh"

gen_model "$T/m.gguf"        # context 512
M=$T/m.gguf
# a 200-token prompt: fits the 512 context, not the 128-token prefill pool
LONG=$(seq -s, 10 209)

pair pi di "$M" "kv.pool_tokens=128" "kv.capacity_policy=clamp"
start_node pi
check "prefill starts clamped, says so" wait_log "$T/pi.log" "event=kv_capacity .*verdict=insufficient policy=clamp advertised_context=128"
start_node di
check "decode paired" wait_up di
check "decode logged the peer's pool and context" grep -q "event=peer_capacity .*peer_pool_tokens=128 peer_context=128" "$T/di.log"
check "decode's kv_capacity line joins the peer: path_context=128" grep -q "event=kv_capacity .*verdict=ok .*peers=1 peer_min_pool_tokens=128 path_context=128 reason=peer" "$T/di.log"
check "prefill's kv_capacity line names its decode peer" grep -q "event=kv_capacity .*peers=1 .*reason=peer" "$T/pi.log"
check "kvctl status counts the peer" test "$(status_get di peers)" = 1

solo_check() { # solo_check LABEL: three requests equal their offline runs
	local label=$1 p a b okc=0
	for p in "Once upon a time" "The cat sat on the mat" "Hello"; do
		a=$(gen "$C_PORT" --prompt "$p" --max-tokens 20 --temperature 0.7 --seed 42 || true)
		b=$(offline --model "$M" --prompt "$p" --max-tokens 20 --temperature 0.7 --seed 42 || true)
		same_ids "$a" "$b" && same_text "$a" "$b" && okc=$((okc + 1))
	done
	check "$label: next requests byte-identical to solo runs" test $okc = 3
}

solo_check "before"
check "checksum time is measured on decode" test "$(status_get di counters.checksum_ns)" -gt 0
check "checksum time is measured on prefill" test "$(status_get pi counters.checksum_ns)" -gt 0
# Decode must refuse before it reserves a page. Its pool is first filled
# but for 6 pages (synthetic load, fault-point builds): the request needs
# 14, so a decode that reserved before its admission check, or skipped
# the check, would answer OVERLOADED and move the pool's figures.
FAULT=0
grep -q "KVD_FAULT_POINTS 1" "$KVD_BUILD/kvd_build.h" && FAULT=1
if [ $FAULT = 1 ]; then
	load=$("$KVCTL" --socket "$T/di.sock" --json fault load --count 1 --tokens 4000 --hold-ms 60000 2>/dev/null || true)
	check "decode's pool held by a synthetic load but for 6 pages" test "$(status_get di pool.free)" = 6
else
	echo "# fault points not compiled in: decode's pool stays empty (no synthetic load)"
fi
free0=$(status_get di pool.free); held0=$(held di)
ptl0=$(status_get di counters.rejected.prompt_too_long)
ov0=$(status_get di counters.rejected.overloaded)
MD=$(log_mark "$T/di.log")
out=$(gen "$C_PORT" --tokens "$LONG" --max-tokens 16 || true)
check "decode admission: PROMPT_TOO_LONG reaches the client" test "$(echo "$out" | json_get error)" = PROMPT_TOO_LONG
check "decode admission: no token emitted" no_token "$out"
check "decode logged why (need vs the prefill pool)" log_has "$T/di.log" "event=admission_reject .*reason=prompt_too_long prompt_tokens=200 max_tokens=16 need=216 limit=128" "$MD"
check "decode admission: counted as prompt_too_long, not overloaded" \
	test "$(status_get di counters.rejected.prompt_too_long)" = $((ptl0 + 1)) -a \
	"$(status_get di counters.rejected.overloaded)" = "$ov0"
check "decode admission: no page reserved (free $free0, held $held0 unchanged)" \
	test "$(status_get di pool.free)" = "$free0" -a "$(held di)" = "$held0"
check "decode admission: no prefill_request sent" test "$(log_count "$T/di.log" "event=prefill_sent " "$MD")" = 0
check "decode admission: prefill rejected nothing (never asked)" \
	test "$(status_get pi counters.rejected.prompt_too_long)" = 0
if [ $FAULT = 1 ]; then
	"$KVCTL" --socket "$T/di.sock" abort "$(echo "$load" | json_get first_id)" >/dev/null 2>&1 || true
fi
check "decode: zero pages held, nothing in flight" settle di
check "prefill: zero pages held, nothing in flight" settle pi
check "prefill computed nothing for it" test "$(status_get pi counters.admitted)" = 3
solo_check "after decode's rejection"

# --- decode's own check switched off: prefill must refuse by itself ------
stop_node di
if [ $FAULT = 0 ]; then
	echo "# fault points not compiled in: skipping the prefill-side half"
	serve_finish
	exit $?
fi
: > "$T/di.log"
start_node di KVD_FAULT=skip_decode_admission
check "decode (admission off) paired again" wait_up di
out=$(gen "$C_PORT" --tokens "$LONG" --max-tokens 16 || true)
check "prefill admission: PROMPT_TOO_LONG reaches the client" test "$(echo "$out" | json_get error)" = PROMPT_TOO_LONG
check "prefill admission: never tokens" no_token "$out"
check "decode really skipped its check" grep -q "event=fault point=skip_decode_admission" "$T/di.log"
check "prefill logged why" grep -q "event=admission_reject .*reason=prompt_too_long prompt_tokens=200 max_tokens=16 need=216 limit=128" "$T/pi.log"
check "decode logged prefill's typed rejection" grep -q "event=prefill_rejected .*code=PROMPT_TOO_LONG" "$T/di.log"
check "prefill: zero pages held after its rejection" settle pi
check "decode: zero pages held after the rejection" settle di
check "prefill counted the rejection" test "$(status_get pi counters.rejected.prompt_too_long)" -ge 1
solo_check "after prefill's rejection"
check "prefill: zero pages held at the end" settle pi di
stop_node di
stop_node pi
serve_finish
