#!/usr/bin/env bash
# Prefill's admission checks on what a decode peer asks (invariants 3,
# 11): a fake decode (fake_peer.py badreq), holding the cluster key, sends
# prefill_requests whose destination page count does not match the prompt
# (one too few, one too many) and one whose prompt holds a token id
# outside the vocabulary, and two whose tenant breaks the API keys file's
# rule (issue 12: a quote, a newline and '='; 64 characters). Prefill must
# answer each with a typed prefill_reject (INVALID_REQUEST), admit and
# reserve nothing for it, never log the bad tenant raw, and keep serving
# the link: a good request (tenant carol) on the same connection then gets
# its pages and prefill_done, and every prefill line naming it carries
# tenant=carol.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/serve_lib.sh"

gen_model "$T/m.gguf"            # vocabulary of 320
next_port; P_PORT=$PORT
write_node pc prefill "$T/m.gguf" "listen.peer=127.0.0.1:$P_PORT"
start_node pc
check "prefill up" wait_log "$T/pc.log" "event=serve_ready" 30
adm0=$(status_get pc counters.admitted)
MP=$(log_mark "$T/pc.log")
rc=0
python3 "$(dirname "$0")/fake_peer.py" --key "$(cluster_key)" badreq "127.0.0.1:$P_PORT" "$T/pc.log" \
	>"$T/badreq.out" 2>&1 || rc=$?
sed 's/^/# /' "$T/badreq.out"
check "the fake decode paired and ran every case" test $rc = 0 -a "$(grep -c '"case"' "$T/badreq.out")" = 6

reply() { # reply CASE FIELD: that field of prefill's answer to CASE
	grep "\"case\": \"$1\"" "$T/badreq.out" | json_path "reply.$2"
}
for c in pages_short pages_long vocab tenant_evil tenant_long; do
	check "$c: prefill answered prefill_reject" test "$(reply $c type)" = prefill_reject
	check "$c: with the typed code INVALID_REQUEST" test "$(reply $c code)" = INVALID_REQUEST
	check "$c: for the request it was" test "$(reply $c id)" = \
		"$(case $c in pages_short) echo 100 ;; pages_long) echo 101 ;; vocab) echo 102 ;;
		tenant_evil) echo 103 ;; tenant_long) echo 104 ;; esac)"
done
check "pages_short: the message names the page count" grep -q "1 destination pages for 20 prompt tokens; 2 expected" <<<"$(reply pages_short message)"
check "pages_long: the message names the page count" grep -q "3 destination pages for 20 prompt tokens; 2 expected" <<<"$(reply pages_long message)"
check "vocab: the message names the token" grep -q "token id 99999 outside the vocabulary" <<<"$(reply vocab message)"
for c in tenant_evil tenant_long; do
	check "$c: the message names the key and the rule" grep -q "'tenant' must be a string of 1..63 characters" <<<"$(reply $c message)"
	reply $c message > "$T/msg.$c"
	check "$c: ... never the value" bash -c "! grep -qE 'evil|t{8}' '$T/msg.$c'"
	check "$c: logged with tenant=- (unknown)" log_has "$T/pc.log" "event=prefill_reject .*remote_id=$([ $c = tenant_evil ] && echo 103 || echo 104) tenant=- code=INVALID_REQUEST" "$MP"
done
log_since "$T/pc.log" "$MP" > "$T/pc.since"
check "the bad tenants are nowhere in prefill's log" bash -c "! grep -qE 'evil|t{16}' '$T/pc.since'"
check "prefill logged the five rejections" \
	test "$(log_count "$T/pc.log" "event=prefill_reject .*code=INVALID_REQUEST" "$MP")" = 5
check "prefill counted them as invalid" test "$(status_get pc counters.rejected.invalid)" = 5
check "good: the same link still serves (prefill_done)" test "$(reply good type)" = prefill_done
check "good: both pages came over the data connection" test "$(reply good pages_received)" = 2
check "prefill admitted only the good request" test "$(status_get pc counters.admitted)" = $((adm0 + 1))
pid=$(log_since "$T/pc.log" "$MP" | grep -E "remote_id=105( |$)" | grep -oE ' id=[0-9]+' | head -1 | sed 's/ id=//')
check "good: prefill's id for it is logged" test -n "$pid"
log_since "$T/pc.log" "$MP" | grep -E "(^| )(id=$pid|remote_id=105)( |$)" > "$T/lines.good"
check "good: several prefill lines name it" test "$(wc -l < "$T/lines.good")" -ge 4
check "good: every one with tenant=carol" bash -c "! grep -v ' tenant=carol ' '$T/lines.good'"
check "prefill computed only the good request" \
	test "$(log_count "$T/pc.log" "event=prefill_done " "$MP")" = 1
check "prefill holds no page, nothing in flight" settle pc
check "prefill quarantined nothing" test "$(status_get pc pool.quarantined)" = 0
stop_node pc
serve_finish
