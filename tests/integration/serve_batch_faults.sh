#!/usr/bin/env bash
# The transport's fault points on both send paths. A keyed link that
# encrypts builds every batch in a buffer of its own (the copy path,
# net/transport_tcp.c); a keyless loopback link from a host pool sends
# zero-copy, straight from prefill's pool, and so does a keyed link that
# only authenticates (the MAC streamed over the same pieces). Each fault
# must be caught by decode the same way on all three: a corrupted byte
# (checksum or AEAD tag), a batch cut in half, a tag
# for another owner, and decode's own entry checks (net/xfer_check.c): a
# page index beyond the request's prefix, a page claiming one token more
# than it holds. After each: INTEGRITY (or INTERNAL for the cut) reaches
# the client with no token, the fault line names the path it took, both
# nodes hold no page and have nothing in flight, decode quarantined only
# what the tag check found, and the next request equals its offline run.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/serve_lib.sh"

grep -q "KVD_FAULT_POINTS 1" "$KVD_BUILD/kvd_build.h" || skip "built without fault points"
gen_model "$T/m.gguf"
MODEL=$T/m.gguf
PROMPT=$(seq -s, 10 109)          # 100 tokens: 7 pages of 16 (the last: 4)
REF=$(offline --model "$MODEL" --prompt "The end of the story" --max-tokens 12 --temperature 0.9 --seed 3)

# restart_prefill P D [KVD_FAULT spec]: true once D paired with the new P
restart_prefill() {
	local p=$1 d=$2 mark
	stop_node "$p"
	mark=$(log_mark "$T/$d.log")
	if [ -n "${3:-}" ]; then start_node "$p" "KVD_FAULT=$3"; else start_node "$p"; fi
	wait_log "$T/$d.log" "event=peer_up " 15 "$mark"
}

# case_run MODE PATH FAULT CODE DECODE_PATTERN [QUARANTINED]
case_run() {
	local mode=$1 path=$2 fault=$3 code=$4 pat=$5 q=${6:-0}
	local p=p_$mode d=d_$mode md mp out label="$mode ($path) $fault"
	check "$label: prefill up" restart_prefill "$p" "$d" "$fault:1"
	md=$(log_mark "$T/$d.log")
	mp=$(log_mark "$T/$p.log")
	out=$(gen "$C_PORT" --tokens "$PROMPT" --max-tokens 8 || true)
	check "$label: $code reaches the client" test "$(echo "$out" | json_get error)" = "$code"
	check "$label: no token emitted (the request ran)" ran_no_token "$out" "$d" "$md"
	check "$label: the fault fired on the $path path" \
		log_has "$T/$p.log" "event=fault point=$fault .*path=$path" "$mp"
	check "$label: decode caught it" log_has "$T/$d.log" "$pat" "$md"
	QUAR=$((QUAR + q))
	check "$label: zero pages held, nothing in flight on both nodes" settle "$d" "$p"
	check "$label: decode quarantined exactly the expected pages ($QUAR)" \
		test "$(status_get "$d" pool.quarantined)" = "$QUAR"
	check "$label: prefill quarantined nothing" test "$(status_get "$p" pool.quarantined)" = 0
	# a fault that tore the link down: decode pairs again before the next
	# request (the first peer_up since the mark is the new link's)
	if log_has "$T/$d.log" "event=peer_down " "$md"; then
		check "$label: decode paired again" wait_log "$T/$d.log" "event=peer_up " 15 "$md"
	fi
	out=$(gen "$C_PORT" --prompt "The end of the story" --max-tokens 12 --temperature 0.9 --seed 3 || true)
	check "$label: a later request equals its offline run" same_ids "$out" "$REF"
}

for mode in keyed encrypted keyless; do
	case $mode in
	keyed) keys=(); path=zero_copy ;;
	encrypted) keys=(transfer.encrypt=on); path=copy ;;
	keyless) keys=(peers.key_file=); path=zero_copy ;;
	esac
	pair "p_$mode" "d_$mode" "$MODEL" "transfer.max_batch_bytes=16K" "${keys[@]}" -- \
		"transfer.max_batch_bytes=16K" "${keys[@]}"
	start_node "d_$mode"
	QUAR=0
	# keyed, encrypted: the AEAD tag catches the flipped byte (auth_failed); keyless:
	# XXH3 does (checksum_mismatch); either way the stream is torn down
	case_run $mode $path corrupt_batch INTEGRITY \
		"event=batch_checksum .*error=(checksum_mismatch|auth_failed)"
	case_run $mode $path cut_peer_mid_batch INTERNAL \
		"event=peer_down .*data connection cut mid-batch"
	case_run $mode $path bad_tag INTEGRITY \
		"event=pages_quarantined .*pages=7 reason=tag_check" 7
	case_run $mode $path bad_entry_index INTEGRITY \
		"event=request_failed .*code=INTEGRITY .*names page index 65535 beyond the 7 prefix pages"
	case_run $mode $path bad_entry_tokens INTEGRITY \
		"event=request_failed .*code=INTEGRITY .*page index 0 holds 17 tokens, expected 16"
	stop_node "d_$mode"
	stop_node "p_$mode"
done
serve_finish
