#!/usr/bin/env bash
# A lying prefill over RDMA (issue 13), and the mailbox credits that let
# decode fall behind without losing the link. The liar is kvd's own
# prefill role with fault points (net/fault.h): it holds the cluster key,
# so every lie reaches decode authenticated.
#   credits:  decode falls behind its NIC (verbs_slow_completion: its
#             batch completions wait 500 ms, no receive is reposted);
#             one page per batch, so prefill runs out of its 4 credits
#             and queues (credit_waits > 0): the output equals
#             `kvd generate`, no integrity failure, every batch credited,
#             headers inline (verbs_inline=256) and then, with
#             verbs_inline=0, from the staging buffer;
#   abort:    abort_ack claims 1000 batches more than were posted
#             (lie_abort_batches): the pages stay fenced past the ack and
#             past the batch's completion until release_timeout_ms tears
#             the link down and the QP is drained;
#   unasked:  an abort_ack decode never asked for, claiming 1000 batches,
#             beside the first batch (lie_unasked_ack): ignored, served.
#   done:     prefill_done claims 3 batches more (lie_done_batches), and
#             its abort_ack lies too: TIMEOUT at transfer_timeout_ms, then
#             the same release bound;
#   slot:     a batch's WRITE_WITH_IMM names a mailbox slot its credit
#             did not give (verbs_wrong_slot): INTEGRITY, one credit
#             violation counted, link torn down, fenced until drained;
#   (a write aimed past its granted run is serve_verbs_faults' `beside`
#   case, fault point verbs_write_beside, with both scope kinds;)
#   flood:    batches posted without credits while decode is behind
#             (verbs_flood): the batch beyond the posted receives lands
#             nowhere (the NIC has no receive for it), the link ends;
#   credit:   a lying decode credits 100 batches more than were posted
#             (verbs_lie_credit): prefill refuses it and ends the link.
# Each lie ends with a typed error to the client, no page held on either
# node, and the next request - on a new link - served equal to
# `kvd generate`. Needs the emulated device (fault points, emu hold).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/serve_lib.sh"
export KVD_TEST_TRANSPORT=verbs
[ -z "${KVD_TEST_VERBS_DEVICE:-}" ] || skip "the lying prefill needs the emulated device"

M=$T/m.gguf
gen_model "$M" --dtype f32
PROMPT=$(printf 'word %.0s' $(seq 1 40))
# one page (8 KiB here) per batch: a request is many batches, more than
# the mailbox's 4 slots
SMALL="transfer.max_batch_bytes=12288"

fenced_ms() { # fenced_ms NODE ID
	grep -o "event=abort_done id=$2 .*fenced_ms=[0-9]*" "$T/$1.log" | head -1 |
		grep -o "[0-9]*$" || echo 0
}

# lie TAG PREFILL_FAULT DECODE_FAULT [prefill keys] -- [decode keys]: one
# request against a lying prefill; the common ending is checked here.
lie() {
	local tag=$1 pf=$2 df=$3; shift 3
	pair "p$tag" "d$tag" "$M" "$@"
	start_node "p$tag" ${pf:+KVD_FAULT=$pf}
	start_node "d$tag" ${df:+KVD_FAULT=$df}
	check "$tag: decode paired over verbs" wait_up "d$tag"
	OUT=$(gen "$C_PORT" --prompt "$PROMPT" --max-tokens 8 --temperature 0 || true)
	check "$tag: the client gets a typed error and no token ($OUT)" no_token "$OUT"
	check "$tag: decode's pages stay fenced until the QP is drained" \
		wait_for 10 fence_until_drained "d$tag" "$(rid "d$tag")"
	check "$tag: zero pages held on decode" settle "d$tag"
	check "$tag: zero pages held on prefill" settle "p$tag"
	check "$tag: decode reconnects" wait_for 20 eval \
		"[ \$(grep -c 'event=peer_up' '$T/d$tag.log') -ge 2 ]"
}

lie_end() { # lie_end TAG: the next request, then stop both
	served_equal "$1"
	check "$1: zero pages held on both nodes afterwards" settle "d$1" "p$1"
	stop_node "d$1"
	stop_node "p$1"
}

# --- credits: decode falls behind, prefill waits, nothing is lost ----------
for inl in 256 0; do
	tag=cr$inl
	pair "p$tag" "d$tag" "$M" "$SMALL" "transfer.verbs_inline=$inl" -- \
		"$SMALL" "transfer.verbs_inline=$inl" "transfer.transfer_timeout_ms=20000"
	start_node "p$tag"
	start_node "d$tag" KVD_FAULT=verbs_slow_completion:3
	check "$tag: decode paired over verbs" wait_up "d$tag"
	a=$(gen "$C_PORT" --prompt "$PROMPT" --max-tokens 12 --temperature 0 || true)
	b=$(offline --model "$M" --prompt "$PROMPT" --max-tokens 12 --temperature 0 || true)
	check "$tag: served while decode fell behind, equal to kvd generate" \
		eval 'same_ids "$a" "$b" && same_text "$a" "$b"'
	check "$tag: decode fell behind its NIC" \
		grep -q "event=fault point=verbs_slow_completion" "$T/d$tag.log"
	nb=$(grep -o "event=prefill_done id=[0-9]* .*batches=[0-9]*" "$T/p$tag.log" | head -1 |
		grep -o "batches=[0-9]*" | cut -d= -f2)
	check "$tag: more batches than mailbox slots (${nb:-0} > 4)" test "${nb:-0}" -gt 4
	w=$(status_get "p$tag" counters.verbs.credit_waits)
	check "$tag: prefill waited for credits ($w)" test "${w:-0}" -ge 1
	c=$(status_get "d$tag" counters.verbs.credits_returned)
	check "$tag: decode returned a credit per batch ($c = ${nb:-0})" test "${c:-x}" = "${nb:-0}"
	check "$tag: no credit violation, no integrity failure" eval \
		"[ \"\$(status_get d$tag counters.verbs.credit_violations)\" = 0 ] && [ \"\$(status_get d$tag counters.integrity_failures)\" = 0 ]"
	hi=$(status_get "p$tag" counters.verbs.header_inline)
	hs=$(status_get "p$tag" counters.verbs.header_staged)
	if [ "$inl" = 0 ]; then
		check "$tag: every header from the staging buffer ($hi inline, $hs staged)" \
			eval "[ '$hi' = 0 ] && [ '$hs' = '${nb:-x}' ]"
	else
		check "$tag: every header inline ($hi inline, $hs staged)" \
			eval "[ '$hi' = '${nb:-x}' ] && [ '$hs' = 0 ]"
	fi
	how=$([ "$inl" = 0 ] && echo staged || echo inline)
	check "$tag: the metrics agree (kvd_verbs_batch_headers_total{how=\"$how\"} ${nb:-x})" \
		eval "\"\$KVCTL\" --socket '$T/p$tag.sock' metrics | grep -x 'kvd_verbs_batch_headers_total{how=\"$how\"} ${nb:-x}' >/dev/null"
	check "$tag: the link stayed up" test "$(grep -c 'event=peer_up' "$T/d$tag.log")" = 1
	check "$tag: zero pages held on both nodes" settle "d$tag" "p$tag"
	stop_node "d$tag"
	stop_node "p$tag"
done

# --- (a) abort_ack claims more batches than were posted ---------------------
# decode's batch completion is 500 ms late and its transfer times out at
# 250 ms; the ack says 1001 batches: the one batch completes, the fence
# holds on until release_timeout_ms (1500) tears the link down.
lie abort lie_abort_batches:1 verbs_slow_completion:1 -- \
	"transfer.prefill_timeout_ms=5000" "transfer.transfer_timeout_ms=250" \
	"transfer.release_timeout_ms=1500"
check "abort: TIMEOUT reaches the client" test "$(echo "$OUT" | json_get error)" = TIMEOUT
check "abort: decode read the inflated count" \
	grep -q "event=abort_acked id=$(rid dabort) .*batches_posted=1001" "$T/dabort.log"
check "abort: the one batch posted completed" \
	wait_log "$T/dabort.log" "event=batch_discarded id=$(rid dabort) " 5
check "abort: no unfence on the lie (no abort_fence_done)" \
	eval "! grep -q 'event=abort_fence_done id=$(rid dabort) ' '$T/dabort.log'"
check "abort: release_timeout_ms tore the link down" \
	grep -q "event=abort_ack_timeout id=$(rid dabort) " "$T/dabort.log"
ms=$(fenced_ms dabort "$(rid dabort)")
check "abort: fenced until the release timeout (${ms} ms >= 1400)" test "${ms:-0}" -ge 1400
lie_end abort

# --- (b) prefill_done claims more batches (and the ack lies too) -----------
lie done lie_done_batches:1,lie_abort_batches:1 "" -- \
	"transfer.transfer_timeout_ms=600" "transfer.release_timeout_ms=1500"
check "done: TIMEOUT reaches the client" test "$(echo "$OUT" | json_get error)" = TIMEOUT
check "done: prefill claimed 3 batches more than it posted" \
	grep -q "event=fault point=lie_done_batches " "$T/pdone.log"
check "done: decode gave up at transfer_timeout_ms" \
	grep -q "event=transfer_abort id=$(rid ddone) .*code=TIMEOUT" "$T/ddone.log"
check "done: release_timeout_ms tore the link down" \
	grep -q "event=abort_ack_timeout id=$(rid ddone) " "$T/ddone.log"
ms=$(fenced_ms ddone "$(rid ddone)")
check "done: fenced until the release timeout (${ms} ms >= 1400)" test "${ms:-0}" -ge 1400
lie_end done

# --- (u) an abort_ack decode never asked for, mid-transfer -----------------
# With its first batch prefill also sends abort_ack claiming 1000 batches.
# Decode asked for nothing: it ignores the ack (a state where it would be a
# BUG step stopped the node, before the decode table ignored it) and the
# request is served.
pair pu du "$M"
start_node pu KVD_FAULT=lie_unasked_ack:1
start_node du
check "unasked: decode paired over verbs" wait_up du
served_equal unasked
check "unasked: prefill sent the unasked ack" \
	grep -q "event=fault point=lie_unasked_ack " "$T/pu.log"
check "unasked: decode is still running, no invariant breach" \
	eval "kill -0 $PID_du && ! grep -q 'event=invariant_breach' '$T/du.log'"
check "unasked: the link stayed up" test "$(grep -c 'event=peer_up' "$T/du.log")" = 1
check "unasked: zero pages held on both nodes" settle du pu
stop_node du
stop_node pu

# --- (c) a mailbox slot it holds no credit for ------------------------------
lie slot verbs_wrong_slot:1 ""
check "slot: INTEGRITY reaches the client" test "$(echo "$OUT" | json_get error)" = INTEGRITY
check "slot: decode named the violation" \
	grep -q "event=verbs_credit_violation side=receiver .*its credit is for slot 0" "$T/dslot.log"
check "slot: one credit violation, one integrity failure counted" eval \
	"[ \"\$(status_get dslot counters.verbs.credit_violations)\" = 1 ] && [ \"\$(status_get dslot counters.integrity_failures)\" = 1 ]"
lie_end slot

# (c) a write outside its scope: serve_verbs_faults' `beside` case
# (fault point verbs_write_beside), with windows and registrations

# --- (d) a flood past the credits while decode is behind --------------------
lie flood verbs_flood verbs_slow_completion:1 "$SMALL" -- "$SMALL"
check "flood: prefill posted past its credits" \
	grep -q "event=fault point=verbs_flood " "$T/pflood.log"
check "flood: the batch beyond the posted receives found none" \
	grep -q "event=verbs_completion_error .*status=rnr_retry_exceeded" "$T/pflood.log"
lie_end flood

# --- a lying decode: credits for batches never posted ----------------------
# prefill must not believe them (it would overwrite slots decode has not
# copied out): the link ends, the request fails typed, nothing is held
lie credit "" verbs_lie_credit:1 "$SMALL" -- "$SMALL"
check "credit: prefill refused the credit, naming it" \
	grep -q "event=peer_refused .*field=verbs_credit msg=\"verbs_credit for 101 batches consumed" "$T/pcredit.log"
check "credit: one credit violation counted on prefill" \
	test "$(status_get pcredit counters.verbs.credit_violations)" = 1
lie_end credit

serve_finish
