#!/usr/bin/env bash
# No write after the check (issue 22, item 1). A lying prefill that holds
# the cluster key (fault point verbs_late_write, net/fault.h): once a
# batch's WRITE_WITH_IMM completed - decode has checked that batch - it
# RDMA-WRITEs NaN over position 0 of the batch's first page, through the
# request's write scope that is still live, and only then counts the batch
# sent (so its prefill_done comes after the NaN landed). Decode must take
# the scope back (the revocation completed: windows invalidated, or the
# registration gone) before its final check, and check the pages in its
# pool after that: the client gets INTEGRITY and no token, the prefix
# pages are quarantined (their writer cannot be trusted), and the next
# request - on the same link - is served equal to `kvd generate`.
# Run with both write scopes: type-2 memory windows (auto on the emulated
# device) and per-request registrations (mr).
# Needs the emulated device and fault points.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/serve_lib.sh"
export KVD_TEST_TRANSPORT=verbs
[ -z "${KVD_TEST_VERBS_DEVICE:-}" ] || skip "the late write needs the emulated device"

M=$T/m.gguf
gen_model "$M" --dtype f32
PROMPT=$(printf 'word %.0s' $(seq 1 40))
# one page per batch: the poisoned page belongs to a batch decode checked
# long before prefill_done
SMALL="transfer.max_batch_bytes=12288"

for scope in mw mr; do
	tag=late$scope
	pair "p$tag" "d$tag" "$M" "$SMALL" -- "$SMALL" "transfer.verbs_write_scope=$scope"
	start_node "p$tag" KVD_FAULT=verbs_late_write:1
	start_node "d$tag"
	check "$tag: decode paired over verbs" wait_up "d$tag"
	out=$(gen "$C_PORT" --prompt "$PROMPT" --max-tokens 8 --temperature 0 || true)
	check "$tag: prefill wrote NaN after the batch completed" \
		grep -q "event=fault point=verbs_late_write request=$(rid "d$tag") " "$T/p$tag.log"
	check "$tag: the client gets a typed error and no token ($out)" no_token "$out"
	check "$tag: the error is INTEGRITY" test "$(echo "$out" | json_get error)" = INTEGRITY
	check "$tag: decode's final check ran after the revocation completed" \
		grep -q "event=transfer_sealed id=$(rid "d$tag") " "$T/d$tag.log"
	check "$tag: decode named the poisoned page" \
		grep -q "event=transfer_check_failed id=$(rid "d$tag") .*check=finite" "$T/d$tag.log"
	check "$tag: the prefix pages are quarantined, not released" \
		grep -q "event=pages_quarantined id=$(rid "d$tag") " "$T/d$tag.log"
	check "$tag: one integrity failure counted" \
		test "$(status_get "d$tag" counters.integrity_failures)" = 1
	check "$tag: zero pages held on both nodes" settle "d$tag" "p$tag"
	check "$tag: the link stayed up" test "$(grep -c 'event=peer_up' "$T/d$tag.log")" = 1
	served_equal "$tag"
	check "$tag: zero pages held on both nodes afterwards" settle "d$tag" "p$tag"
	stop_node "d$tag"
	stop_node "p$tag"
done

serve_finish
