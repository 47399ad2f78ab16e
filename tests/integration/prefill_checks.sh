#!/usr/bin/env bash
# Prefill's admission checks on what a decode peer asks (invariants 3,
# 11): a fake decode (fake_peer.py badreq), holding the cluster key, sends
# prefill_requests whose destination page count does not match the prompt
# (one too few, one too many) and one whose prompt holds a token id
# outside the vocabulary. Prefill must answer each with a typed
# prefill_reject (INVALID_REQUEST), admit and reserve nothing for it, and
# keep serving the link: a good request on the same connection then gets
# its pages and prefill_done.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/serve_lib.sh"

gen_model "$T/m.gguf"            # vocabulary of 320
next_port; P_PORT=$PORT
write_node pc prefill "$T/m.gguf" "listen.peer=127.0.0.1:$P_PORT"
start_node pc
check "prefill up" wait_log "$T/pc.log" "event=listen_peer " 30
adm0=$(status_get pc counters.admitted)
MP=$(log_mark "$T/pc.log")
rc=0
python3 "$(dirname "$0")/fake_peer.py" --key "$(cluster_key)" badreq "127.0.0.1:$P_PORT" "$T/pc.log" \
	>"$T/badreq.out" 2>&1 || rc=$?
sed 's/^/# /' "$T/badreq.out"
check "the fake decode paired and ran every case" test $rc = 0 -a "$(grep -c '"case"' "$T/badreq.out")" = 4

reply() { # reply CASE FIELD: that field of prefill's answer to CASE
	grep "\"case\": \"$1\"" "$T/badreq.out" | json_path "reply.$2"
}
for c in pages_short pages_long vocab; do
	check "$c: prefill answered prefill_reject" test "$(reply $c type)" = prefill_reject
	check "$c: with the typed code INVALID_REQUEST" test "$(reply $c code)" = INVALID_REQUEST
	check "$c: for the request it was" test "$(reply $c id)" = \
		"$(case $c in pages_short) echo 100 ;; pages_long) echo 101 ;; vocab) echo 102 ;; esac)"
done
check "pages_short: the message names the page count" grep -q "1 destination pages for 20 prompt tokens; 2 expected" <<<"$(reply pages_short message)"
check "pages_long: the message names the page count" grep -q "3 destination pages for 20 prompt tokens; 2 expected" <<<"$(reply pages_long message)"
check "vocab: the message names the token" grep -q "token id 99999 outside the vocabulary" <<<"$(reply vocab message)"
check "prefill logged the three rejections" \
	test "$(log_count "$T/pc.log" "event=prefill_reject .*code=INVALID_REQUEST" "$MP")" = 3
check "prefill counted them as invalid" test "$(status_get pc counters.rejected.invalid)" = 3
check "good: the same link still serves (prefill_done)" test "$(reply good type)" = prefill_done
check "good: both pages came over the data connection" test "$(reply good pages_received)" = 2
check "prefill admitted only the good request" test "$(status_get pc counters.admitted)" = $((adm0 + 1))
check "prefill computed only the good request" \
	test "$(log_count "$T/pc.log" "event=prefill_done " "$MP")" = 1
check "prefill holds no page, nothing in flight" settle pc
check "prefill quarantined nothing" test "$(status_get pc pool.quarantined)" = 0
stop_node pc
serve_finish
