#!/usr/bin/env bash
# transfer.verbs_inline (issue 13's leftover): each batch's closing
# WRITE_WITH_IMM (header, entries, MAC: 80 + 24 bytes per page) goes
# inline when it fits the size in use. On the emulated device, whose
# inline limit is max_inline=N (default 256; a grant is the size asked,
# rounded up to 64):
#   auto1:   auto, one page per batch: 104 bytes asked, 128 granted; the
#            boot line and kvctl status (capacity.verbs_inline) say 128 on
#            both nodes, the link's QP uses it (peer_up), every header goes inline (counters and metrics),
#            the output equals `kvd generate`;
#   small:   auto on a device whose limit is 100: 104 is refused, 64
#            granted; every 104-byte header is staged, output equal;
#   big:     auto with the default 4 MiB batch bound: 256 asked and
#            granted; the 13-page batch's 392-byte header is staged;
#   number:  verbs_inline = 512 on a device whose limit is 256: the node
#            refuses to start, naming the key and the value.
# Needs the emulated device (its max_inline option).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/serve_lib.sh"
export KVD_TEST_TRANSPORT=verbs
[ -z "${KVD_TEST_VERBS_DEVICE:-}" ] || skip "the inline limit is an emulated device option"

M=$T/m.gguf
gen_model "$M" --dtype f32
PROMPT=$(printf 'word %.0s' $(seq 1 40))   # 13 pages of 16 positions
SMALL="transfer.max_batch_bytes=12288"      # one 8 KiB page per batch
# a heartbeat every 0.5 s (3 missed: 1.5 s) rides out a loaded machine
HB="transfer.heartbeat_ms=500"
mkdir -p "$T/rdma"

# run_case TAG DEVICE_OPTS INLINE_IN_USE HOW [keys...]: a pair on the
# emulated device with those options, one request; HOW (inline, staged)
# is where every batch header must have gone.
run_case() {
	local tag=$1 opts=$2 inl=$3 how=$4 dev a b nb hi hs n; shift 4
	dev="transfer.verbs_device=emu:$T/rdma,auto=1$opts"
	pair "p$tag" "d$tag" "$M" "$dev" "$HB" "$@" -- "$dev" "$HB" "$@"
	start_node "p$tag"
	start_node "d$tag"
	check "$tag: decode paired over verbs" wait_up "d$tag"
	for n in "p$tag" "d$tag"; do
		check "$tag: $n's boot line says inline=$inl (asked: auto)" grep -q \
			"event=transport transport=verbs .* inline=$inl inline_granted=$inl inline_config=auto " \
			"$T/$n.log"
		check "$tag: $n's kvctl status says capacity.verbs_inline=$inl" \
			test "$(status_get "$n" capacity.verbs_inline)" = "$inl"
	done
	check "$tag: prefill's link uses it too (peer_up)" grep -q \
		"event=peer_up .* inline=$inl inline_granted=$inl" "$T/p$tag.log"
	check "$tag: kvctl status prints it" eval \
		"\"\$KVCTL\" --socket '$T/p$tag.sock' status | grep -q 'transport   verbs on .*, inline $inl bytes'"
	a=$(gen "$C_PORT" --prompt "$PROMPT" --max-tokens 12 --temperature 0 || true)
	b=$(offline --model "$M" --prompt "$PROMPT" --max-tokens 12 --temperature 0 || true)
	check "$tag: served, equal to kvd generate" \
		eval 'same_ids "$a" "$b" && same_text "$a" "$b"'
	nb=$(grep -o "event=prefill_done id=[0-9]* .*batches=[0-9]*" "$T/p$tag.log" | head -1 |
		grep -o "batches=[0-9]*" | cut -d= -f2)
	check "$tag: prefill sent batches (${nb:-0})" test "${nb:-0}" -ge 1
	hi=$(status_get "p$tag" counters.verbs.header_inline)
	hs=$(status_get "p$tag" counters.verbs.header_staged)
	if [ "$how" = inline ]; then
		check "$tag: every header inline ($hi inline, $hs staged, ${nb:-x} batches)" \
			eval "[ '$hi' = '${nb:-x}' ] && [ '$hs' = 0 ]"
	else
		check "$tag: every header staged ($hi inline, $hs staged, ${nb:-x} batches)" \
			eval "[ '$hs' = '${nb:-x}' ] && [ '$hi' = 0 ]"
	fi
	check "$tag: the metrics agree (kvd_verbs_batch_headers_total{how=\"$how\"} ${nb:-x})" \
		eval "\"\$KVCTL\" --socket '$T/p$tag.sock' metrics | grep -x 'kvd_verbs_batch_headers_total{how=\"$how\"} ${nb:-x}' >/dev/null"
	check "$tag: no integrity failure" \
		test "$(status_get "d$tag" counters.integrity_failures)" = 0
	check "$tag: zero pages held on both nodes" settle "d$tag" "p$tag"
	stop_node "d$tag"
	stop_node "p$tag"
}

run_case auto1 "" 128 inline "$SMALL"
run_case small ",max_inline=100" 64 staged "$SMALL"
run_case big "" 256 staged
check "big: the batch carried 13 pages (a 392-byte header)" \
	grep -q "event=prefill_done id=$(rid pbig) .*batches=1\b" "$T/pbig.log"

# --- a number the device cannot grant refuses the node -----------------------
next_port
write_node vn decode "$M" "listen.client=127.0.0.1:$PORT" \
	"peers.prefill=127.0.0.1:1" "transfer.verbs_device=emu:$T/rdma" \
	"transfer.verbs_inline=512"
set +e
timeout 20 "$KVD" --config "$T/vn.ini" >"$T/vn.log" 2>&1
rc=$?
set -e
check "verbs_inline=512 above the device's 256: kvd exits non-zero ($rc)" test "$rc" != 0
check "verbs_inline=512 above the device's 256: the log names the key" \
	grep -q "event=transport_unavailable .*transfer.verbs_inline=512 " "$T/vn.log"
check "verbs_inline=512: the node never became ready" \
	eval "! grep -q 'event=ready' '$T/vn.log'"
check "the emulated device left nothing in its directory" test -z "$(ls -A "$T/rdma")"

serve_finish
