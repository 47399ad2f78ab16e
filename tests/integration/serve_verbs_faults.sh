#!/usr/bin/env bash
# RDMA faults over the emulated device (issue 13): each one gives the
# client a typed error, keeps decode's pages fenced until the queue pair's
# flush completions are drained (the transport's verbs_closed line comes
# before the request's link_lost step), leaks no page on either node, and
# the next request - on a new link - is served equal to `kvd generate`.
#   late write: decode's NIC holds prefill's writes 1.5 s (emu hold_ms,
#               while $T/rdma/hold exists);
#               decode times out at 0.6 s and revokes the scope; the write
#               that arrives then is refused by the NIC and lands nowhere
#               (writes_applied=0 writes_refused=1);
#   QP error mid-batch: prefill's QP goes to error after the first write
#               of a batch (fault point verbs_qp_error);
#   completion error: the emulated NIC fails prefill's oldest WR
#               (fault point verbs_completion_error);
#   corrupt batch: a page byte flipped after the MAC (corrupt_batch) is
#               INTEGRITY, counted once, and the link is rebuilt;
#   abort_ack first: decode handles a batch's completion late
#               (verbs_slow_completion) and its transfer times out: the
#               abort_ack (batches=1) comes first, and the pages stay
#               fenced until the batch's completion (batches_landed).
#   bind fails: decode's window bind completes with an error (fault point
#               verbs_bind_fail; windows only): the request fails
#               INTERNAL naming it, no verbs_scope is sent, the link is
#               rebuilt;
#   write beside: a lying prefill writes its first page to the page just
#               past the run decode granted (fault point
#               verbs_write_beside): decode's NIC refuses it
#               (writes_applied=0 writes_refused=1), nothing lands;
#   pool resize: pages added by kvctl pool resize are registered on first
#               use and written; shrink and grow again are served too;
#   flush withheld: decode's device never delivers the flush completions
#               (emu flush=0) when the link is lost: after
#               transfer.verbs_flush_timeout_ms the request's pages are
#               quarantined, never freed (event=verbs_flush_timeout,
#               counters.verbs_flush_timeouts).
# Every case runs with the write scope KVD_TEST_VERBS_SCOPE (auto: type-2
# memory windows on the emulated device; mr: per-request registrations);
# the boot line and kvctl status say which.
# Needs the emulated device (hold_ms, flush=0): with KVD_TEST_VERBS_DEVICE
# set to a real device only the fault points run.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/serve_lib.sh"
export KVD_TEST_TRANSPORT=verbs

M=$T/m.gguf
gen_model "$M" --dtype f32
PROMPT=$(printf 'word %.0s' $(seq 1 40))   # 13 pages: a batch of many writes
case "${KVD_TEST_VERBS_SCOPE:-auto}" in
mr) SCOPE=per_request_mr ;;
*) SCOPE=memory_windows ;;
esac
# the scope in use, in decode's boot line and kvctl status (a real device
# without windows takes mr under auto: not checked there)
scope_in_use() {
	[ -n "${KVD_TEST_VERBS_DEVICE:-}" ] && [ "${KVD_TEST_VERBS_SCOPE:-auto}" = auto ] && return 0
	grep -q "event=transport transport=verbs .*write_scope=$SCOPE " "$T/$1.log" &&
		[ "$(status_get "$1" capacity.verbs_write_scope)" = "$SCOPE" ]
}

run_case() { # run_case TAG DECODE_DEVICE PREFILL_FAULT [decode keys...]
	local tag=$1 ddev=$2 fault=$3 out; shift 3
	pair "p$tag" "d$tag" "$M" -- "transfer.verbs_device=$ddev" "$@"
	start_node "p$tag" ${fault:+KVD_FAULT=$fault}
	start_node "d$tag"
	check "$tag: decode paired over verbs" wait_up "d$tag"
	check "$tag: decode's write scope is $SCOPE" scope_in_use "d$tag"
	[ -z "${HOLD:-}" ] || : > "$HOLD"
	out=$(gen "$C_PORT" --prompt "$PROMPT" --max-tokens 8 --temperature 0 || true)
	[ -z "${HOLD:-}" ] || rm -f "$HOLD"
	HOLD=
	OUT=$out
	check "$tag: the client gets a typed error and no token ($out)" no_token "$out"
	check "$tag: decode's pages stay fenced until the QP is drained" \
		wait_for 10 fence_until_drained "d$tag" "$(rid "d$tag")"
	check "$tag: zero pages held on decode" settle "d$tag"
	check "$tag: zero pages held on prefill" settle "p$tag"
	check "$tag: decode reconnects" wait_for 20 eval \
		"[ \$(grep -c 'event=peer_up' '$T/d$tag.log') -ge 2 ]"
	served_equal "$tag"
	check "$tag: zero pages held on both nodes afterwards" settle "d$tag" "p$tag"
	[ -z "${AFTER:-}" ] || "$AFTER" "$tag"
	AFTER=
	stop_node "d$tag"
	stop_node "p$tag"
}

# --- a late write after a timeout fails at decode's NIC ---------------------
if [ -z "${KVD_TEST_VERBS_DEVICE:-}" ]; then
	mkdir -p "$T/rdma"
	HOLD=$T/rdma/hold   # the slow fabric is on while it exists (verbs_emu.h)
	run_case late "emu:$T/rdma,auto=1,hold_ms=1500" "" \
		"transfer.prefill_timeout_ms=600" "transfer.transfer_timeout_ms=600"
	check "late: TIMEOUT reaches the client" test "$(echo "$OUT" | json_get error)" = TIMEOUT
	check "late: decode revoked the scope and aborted at the timeout" \
		grep -q "event=transfer_abort id=$(rid dlate) .*code=TIMEOUT" "$T/dlate.log"
	check "late: the late write was refused by decode's NIC and landed nowhere" \
		grep -q "event=verbs_closed side=receiver writes_applied=0 writes_refused=1" "$T/dlate.log"
	check "late: prefill saw the remote access error" \
		grep -q "event=verbs_completion_error .*status=remote_access_error" "$T/plate.log"
	ms=$(grep -o "event=abort_done id=$(rid dlate) .*fenced_ms=[0-9]*" "$T/dlate.log" | grep -o "[0-9]*$" || echo 0)
	check "late: the pages stayed fenced until the late write was refused (${ms} ms >= 700)" \
		test "${ms:-0}" -ge 700
else
	echo "# SKIP (part): late write needs the emulated device (hold_ms)"
fi

# (the abort_ack and MAC cases do not depend on the write scope: the mr
# variant, serve_verbs_faults_mr, leaves them to this one)
if [ "${KVD_TEST_VERBS_SCOPE:-auto}" != mr ]; then
# --- abort_ack overtakes a batch's completion: the fence waits for it ------
# decode handles its batch completion 500 ms late (verbs_slow_completion);
# its transfer times out at 250 ms and prefill, whose batch has completed,
# acks at once with batches=1: decode unfences only once that batch's
# completion is in (batches_landed = batches_posted), not at the ack.
pair pack dack "$M" -- "transfer.prefill_timeout_ms=5000" "transfer.transfer_timeout_ms=250"
start_node pack
start_node dack KVD_FAULT=verbs_slow_completion:1
check "ack: decode paired over verbs" wait_up dack
out=$(gen "$C_PORT" --prompt "$PROMPT" --max-tokens 8 --temperature 0 || true)
check "ack: TIMEOUT reaches the client ($out)" test "$(echo "$out" | json_get error)" = TIMEOUT
check "ack: the abort_ack came before the batch's completion was handled" \
	wait_log "$T/dack.log" "event=abort_acked id=$(rid dack) .*batches_posted=1 batches_received=0 batches_landed=0" 5
check "ack: the fence waited for the posted batch to complete" \
	wait_log "$T/dack.log" "event=abort_fence_done id=$(rid dack) .*batches_posted=1 batches_landed=1" 5
ms=$(grep -o "event=abort_done id=$(rid dack) .*fenced_ms=[0-9]*" "$T/dack.log" | grep -o "[0-9]*$" || echo 0)
check "ack: pages fenced past the ack until the completion (${ms} ms >= 150)" test "${ms:-0}" -ge 150
check "ack: zero pages held on both nodes" settle dack pack
check "ack: the link stayed up (nothing was refused)" \
	test "$(grep -c 'event=peer_up' "$T/dack.log")" = 1
served_equal ack
stop_node dack
stop_node pack

# --- a corrupted batch fails its MAC at decode ------------------------------
# prefill flips a byte of a page after the batch MAC (corrupt_batch): decode
# verifies the MAC over its copy of the pages before anything is believed
pair pmac dmac "$M"
start_node pmac KVD_FAULT=corrupt_batch:1
start_node dmac
check "mac: decode paired over verbs" wait_up dmac
out=$(gen "$C_PORT" --prompt "$PROMPT" --max-tokens 8 --temperature 0 || true)
check "mac: INTEGRITY reaches the client ($out)" test "$(echo "$out" | json_get error)" = INTEGRITY
check "mac: decode logged the failed MAC" \
	grep -q "event=batch_checksum .*claimed_id=$(rid dmac) seq=0 error=auth_failed" "$T/dmac.log"
check "mac: zero pages held on both nodes" settle dmac pmac
check "mac: one integrity failure counted" test "$(status_get dmac counters.integrity_failures)" = 1
check "mac: decode reconnects" wait_for 20 eval \
	"[ \$(grep -c 'event=peer_up' '$T/dmac.log') -ge 2 ]"
served_equal mac
stop_node dmac
stop_node pmac

fi

# --- a QP error mid-batch ----------------------------------------------------
run_case qperr "$(verbs_device)" "verbs_qp_error:1"
check "qperr: prefill moved its QP to error after the first write" \
	grep -q "event=fault point=verbs_qp_error request=$(rid dqperr) seq=0 posted=1" "$T/pqperr.log"

if [ "${KVD_TEST_VERBS_SCOPE:-auto}" != mr ]; then
# --- a completion error -------------------------------------------------------
run_case wcerr "$(verbs_device)" "verbs_completion_error:1"
check "wcerr: the completion error is logged with its status" \
	grep -q "event=verbs_completion_error .*status=general_error" "$T/pwcerr.log"

fi

# --- a window bind that fails: the request fails typed, nothing is sent ----
if [ "$SCOPE" = memory_windows ] && [ -z "${KVD_TEST_VERBS_DEVICE:-}" ]; then
	pair pbind dbind "$M"
	start_node pbind
	start_node dbind KVD_FAULT=verbs_bind_fail:1
	check "bind: decode paired over verbs" wait_up dbind
	out=$(gen "$C_PORT" --prompt "$PROMPT" --max-tokens 8 --temperature 0 || true)
	check "bind: the client gets INTERNAL naming the bind ($out)" \
		eval 'no_token "$out" && [ "$(echo "$out" | json_get error)" = INTERNAL ] &&
		      echo "$out" | grep -q "memory window bind failed"'
	check "bind: decode logged the failed bind" \
		grep -q "event=verbs_scope_failed id=$(rid dbind) op=bind" "$T/dbind.log"
	check "bind: no verbs_scope went to prefill for it" \
		eval '! grep -q "event=verbs_scope_live id=$(rid dbind) " "$T/dbind.log"'
	check "bind: prefill wrote nothing of it" \
		eval '! grep -q "event=prefill_done " "$T/pbind.log"'
	check "bind: zero pages held on both nodes" settle dbind pbind
	check "bind: decode reconnects" wait_for 20 eval \
		"[ \$(grep -c 'event=peer_up' '$T/dbind.log') -ge 2 ]"
	served_equal bind
	stop_node dbind
	stop_node pbind
fi

# --- a write beside the scope: a page of decode's pool the request was not given
run_case beside "$(verbs_device)" "verbs_write_beside:1"
check "beside: prefill wrote its first page beside the granted run" \
	grep -q "event=fault point=verbs_write_beside request=$(rid dbeside) " "$T/pbeside.log"
check "beside: decode's NIC refused it, nothing of the link landed" \
	eval 'grep "event=verbs_closed side=receiver .*writes_refused=1 " "$T/dbeside.log" | grep -q "writes_applied=0 "'
check "beside: prefill's queue pair failed on it" \
	grep -q "event=peer_down .*msg=\"RDMA queue pair error\"" "$T/pbeside.log"

# --- pages added by kvctl pool resize are registered and written ----------
# decode's pool grows from 256 to 512 pages; the pool hands out the
# highest free pages first, so the next request's prefix lies in the new
# range: the transport registers it on first use, the transfer lands and
# is verified (MAC, tags, coverage) and served equal to kvd generate; a
# shrink back retires the pages once no request holds them, and a second
# grow is served again.
GROWDEV=$(verbs_device)
[ -n "${KVD_TEST_VERBS_DEVICE:-}" ] || GROWDEV="$GROWDEV,hold_ms=1500"
pair pgrow dgrow "$M" -- "transfer.verbs_device=$GROWDEV"
start_node pgrow
start_node dgrow
check "grow: decode paired over verbs" wait_up dgrow
check "grow: the pool grows to 512 pages" \
	quiet "$KVCTL" --socket "$T/dgrow.sock" pool resize --tokens 8192
check "grow: decode has 512 pages" test "$(status_get dgrow pool.pages)" = 512
served_equal grow
check "grow: the new range was registered for the transfer" \
	grep -q "event=verbs_pool_chunk op=register first_page=256 pages=256 code=0" "$T/dgrow.log"
check "grow: zero pages held on both nodes" settle dgrow pgrow
# shrink while request 2 holds pages of the new range (its writes land
# 1.5 s late: emu hold_ms while $T/rdma/hold exists): as over tcp, free
# pages retire first and the request's stay live (and registered) until
# it has released them
[ -n "${KVD_TEST_VERBS_DEVICE:-}" ] || : > "$T/rdma/hold"
gen "$C_PORT" --prompt "$PROMPT" --max-tokens 12 --temperature 0 > "$T/shrunk.out" 2>&1 &
GEN=$!
check "shrunk: request 2 holds pages" wait_log "$T/dgrow.log" "event=prefill_sent id=$(rid dgrow 2) " 20
check "shrunk: the pool shrinks back under the request" \
	quiet "$KVCTL" --socket "$T/dgrow.sock" pool resize --tokens 4096
wait "$GEN" || true
rm -f "$T/rdma/hold"
a=$(cat "$T/shrunk.out")
b=$(offline --model "$M" --prompt "$PROMPT" --max-tokens 12 --temperature 0 || true)
check "shrunk: request 2 is served, equal to kvd generate" \
	eval 'same_ids "$a" "$b" && same_text "$a" "$b"'
# the shrink came between request 2's admission and its transfer's end
line_of() { grep -n "$1" "$T/dgrow.log" | head -1 | cut -d: -f1; }
l_sent=$(line_of "event=prefill_sent id=$(rid dgrow 2) ")
l_shrink=$(line_of "event=kv_pool_resized pages_before=512 pages_after=256")
l_done=$(line_of "event=transfer_done id=$(rid dgrow 2) ")
[ -n "${KVD_TEST_VERBS_DEVICE:-}" ] ||   # (no slow fabric on a real device)
check "shrunk: the shrink came while request 2 held its pages" \
	eval '[ -n "$l_sent" ] && [ -n "$l_shrink" ] && [ -n "$l_done" ] && [ "$l_sent" -lt "$l_shrink" ] && [ "$l_shrink" -lt "$l_done" ]'
check "shrunk: zero pages held on both nodes" settle dgrow pgrow
check "shrunk: decode has 256 pages" test "$(status_get dgrow pool.pages)" = 256
# grown again: the pool's new memory for pages 256.. is registered anew
# where it moved (the stale chunk deregistered first), or reused as is
check "regrow: the pool grows again" \
	quiet "$KVCTL" --socket "$T/dgrow.sock" pool resize --tokens 8192
served_equal regrow
check "regrow: zero pages held on both nodes" settle dgrow pgrow
check "grow: the link stayed up" test "$(grep -c 'event=peer_up' "$T/dgrow.log")" = 1
stop_node dgrow
stop_node pgrow

# --- the flush completions never come: pages quarantined, never freed -------
if [ -z "${KVD_TEST_VERBS_DEVICE:-}" ]; then
	noflush_checks() { # while dnoflush still runs (after its next request)
		local q pages free
		check "noflush: decode gave up on the flush after the bound" \
			grep -q "event=verbs_flush_timeout side=receiver .*timeout_ms=300" "$T/dnoflush.log"
		q=$(grep -o "event=pages_quarantined id=$(rid dnoflush) .*pages=[0-9]*" "$T/dnoflush.log" |
			grep -o "pages=[0-9]*" | head -1 | cut -d= -f2)
		check "noflush: request 1's prefix quarantined (${q:-none} pages)" test "${q:-0}" -ge 1
		check "noflush: the pool counts them quarantined" \
			test "$(status_get dnoflush pool.quarantined)" = "${q:-x}"
		pages=$(status_get dnoflush pool.pages)
		free=$(status_get dnoflush pool.free)
		check "noflush: they stay out of the free list ($free free of $pages)" \
			test "$((pages - ${q:-0}))" = "$free"
		check "noflush: one flush timeout counted" \
			test "$(status_get dnoflush counters.verbs_flush_timeouts)" = 1
	}
	mkdir -p "$T/rdma"
	AFTER=noflush_checks
	run_case noflush "emu:$T/rdma,auto=1,flush=0" "verbs_qp_error:1" \
		"transfer.verbs_flush_timeout_ms=300"
else
	echo "# SKIP (part): flush withheld needs the emulated device (flush=0)"
fi

serve_finish
