#!/usr/bin/env bash
# A prefill node's HTTP listener, and one request's ids across two nodes
# (issue 25, items 3 and 7), with curl on a real pair:
#   - prefill with listen.http: /livez 200, /readyz 200 ready role prefill,
#     /health agrees; /metrics: 401 without a key, 403 with a tenant's, 200
#     with the admin key, Prometheus text promtool parses, with prefill's
#     own figures (kvd_info role=prefill, KV sent) moving with a request;
#     every client path (completions, chat, models, tokenize, the chat page)
#     404 in OpenAI's error shape;
#   - request ids: decode's and prefill's differ, neither counts from 1;
#     decode's request_done names prefill's id (prefill_id=) and node,
#     prefill's prefill_served names decode's (remote_id=) and node, so one
#     grep of decode's id finds the request on both nodes;
#   - kvctl audit of both logs: per node its role, verdict and requests;
#     without decode's kv_capacity line (a later journal window) decode is
#     UNJUDGED and the exit 3, not 0
#     done (exit 0);
#   - kvctl drain on prefill: /readyz 503 draining at once, /livez 200, and
#     a decode's request already on it still completes (fault-point builds:
#     slow_batch keeps it in flight).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/serve_lib.sh"
command -v curl >/dev/null || skip "curl absent"
command -v jq >/dev/null || skip "jq absent"

M=$(shared_model stories260K.gguf)
KEY=alice-0123456789abcdef0123456789abcdef
ADM=admin-0123456789abcdef0123456789abcdef
printf '%s alice\n%s ops admin\n' "$KEY" "$ADM" > "$T/keys"
chmod 600 "$T/keys"
FAULT=0
grep -q "KVD_FAULT_POINTS 1" "$KVD_BUILD/kvd_build.h" && FAULT=1

# a keyless prefill listener must be loopback (as on decode)
write_node bad prefill "$M" "listen.peer=127.0.0.1:1" "listen.http=0.0.0.0:8080" "peers.key_file="
rc=0; "$KVD" --check-config --config "$T/bad.ini" > "$T/bad.out" 2>&1 || rc=$?
check "keyless prefill listen.http off loopback: exit 78 naming listen.http ($rc)" \
	bash -c "test $rc = 78 && grep -q 'listen.http' '$T/bad.out'"

next_port; PH=$PORT
next_port; DH=$PORT
# prefill sends a page a batch (a page of stories260K is 20544 bytes): with
# slow_batch a prompt of 4 pages is over a second in flight
pair pi di "$M" "listen.http=127.0.0.1:$PH" "http.api_keys_file=$T/keys" \
	"transfer.max_batch_bytes=24K" -- "listen.http=127.0.0.1:$DH" "http.api_keys_file=$T/keys"
if [ $FAULT = 1 ]; then start_node pi KVD_FAULT=slow_batch; else start_node pi; fi
check "prefill listens for HTTP" wait_log "$T/pi.log" "event=listen_http addr=\"?127.0.0.1:$PH"
P=http://127.0.0.1:$PH
D=http://127.0.0.1:$DH

# req URL METHOD PATH [BODY] [curl args...]: status on stdout, body in $T/body
req() {
	local u=$1 m=$2 p=$3 b=${4:-}; shift 4 || shift $#
	local a=(-s -o "$T/body" -w '%{http_code}' -X "$m")
	[ -z "$b" ] || a+=(--data-binary "$b")
	curl "${a[@]}" "$@" "$u$p" || true
}
auth=(-H "Authorization: Bearer $KEY")
adm=(-H "Authorization: Bearer $ADM")

# ---- probes ----------------------------------------------------------------------
st=$(req "$P" GET /livez)
check "prefill /livez: 200 alive ($st)" test "$st $(jq -r .status "$T/body")" = "200 alive"
ready() { test "$(req "$P" GET /readyz)" = 200; }
check "prefill /readyz: 200 once up" wait_for 10 ready
check "  ... ready, role prefill (no peer needed)" \
	test "$(jq -c '{status, role}' "$T/body")" = '{"status":"ready","role":"prefill"}'
st=$(req "$P" GET /health)
check "  ... /health agrees ($st)" test "$st $(jq -r .status "$T/body")" = "200 ok"

# ---- /metrics: the admin key ---------------------------------------------------------
st=$(req "$P" GET /metrics)
check "prefill /metrics without a key: 401 ($st)" test "$st" = 401
st=$(req "$P" GET /metrics "" "${auth[@]}")
check "  ... with a tenant's key: 403 ($st)" test "$st $(jq -r .error.code "$T/body")" = "403 forbidden"
st=$(req "$P" GET /metrics "" "${adm[@]}")
check "  ... with the admin key: 200 ($st)" test "$st" = 200
check "  ... kvd_info says role prefill" grep -q '^kvd_info{node="pi",role="prefill",' "$T/body"
pm() { # pm SERIES: a sample of prefill's /metrics (admin key), "" when absent
	curl -s "${adm[@]}" "$P/metrics" | awk -v k="$1" '$1 == k { print $2; f = 1 } END { if (!f) print "" }'
}
b0=$(pm 'kvd_kv_transfer_bytes_total{direction="send"}')
n0=$(pm 'kvd_kv_transfer_batches_total{direction="send"}')
check "  ... KV sent: $b0 bytes, $n0 batches before any request" test "$b0 $n0" = "0 0"

# ---- every client path: 404 ------------------------------------------------------
for p in "POST /v1/completions" "POST /v1/chat/completions" "POST /v1/responses" \
	 "GET /v1/models" "GET /v1/models/stories" "POST /tokenize" "POST /detokenize" \
	 "GET /" "GET /chat.js"; do
	st=$(req "$P" ${p% *} "${p#* }" '{"prompt":"Once","max_tokens":2}' "${auth[@]}")
	check "prefill $p: 404 ($st)" test "$st" = 404
	check "  ... OpenAI's error shape, naming what prefill serves" \
		jq -e '.error.type == "invalid_request_error" and (.error.message | test("/livez, /readyz, /health and /metrics"))' "$T/body"
done
st=$(req "$P" OPTIONS /v1/completions "" -H "Origin: https://app.example.com")
check "prefill OPTIONS /v1/completions: 404 ($st)" test "$st" = 404

# ---- one request through the pair: ids and metrics --------------------------------
start_node di
check "decode paired" wait_up di
dready() { test "$(req "$D" GET /readyz)" = 200; }
check "decode /readyz: 200" wait_for 10 dready
MD=$(log_mark "$T/di.log")
MP=$(log_mark "$T/pi.log")
st=$(req "$D" POST /v1/completions '{"prompt":"Once upon a time","max_tokens":4,"temperature":0}' "${auth[@]}")
check "a completion through the pair: 200, 4 tokens ($st)" \
	test "$st $(jq -r .usage.completion_tokens "$T/body")" = "200 4"
check "prefill logged the request served" wait_log "$T/pi.log" "event=prefill_served " 10 "$MP"
check "decode logged it done" wait_log "$T/di.log" "event=request_done " 10 "$MD"
dline=$(log_since "$T/di.log" "$MD" | grep "event=request_done " | head -1)
pline=$(log_since "$T/pi.log" "$MP" | grep "event=prefill_served " | head -1)
did=$(grep -o ' id=[0-9]*' <<<"$dline" | head -1 | cut -d= -f2)
pid=$(grep -o ' id=[0-9]*' <<<"$pline" | head -1 | cut -d= -f2)
check "decode's id ($did) and prefill's ($pid) differ, neither counts from 1" \
	eval '[ -n "$did" ] && [ -n "$pid" ] && [ "$did" != "$pid" ] && [ "$did" -gt 1000 ] && [ "$pid" -gt 1000 ]'
check "  ... nor do the nodes' first ids ($(rid di) $(rid pi))" \
	eval '[ -n "$(rid di)" ] && [ "$(rid di)" != "$(rid pi)" ]'
check "decode's request_done names prefill's id and node" \
	grep -q " prefill_node=pi prefill_id=$pid\( \|$\)" <<<"$dline"
check "prefill's prefill_served names decode's id and node" \
	grep -q " remote_id=$did decode_node=di " <<<"$pline"
check "one grep of decode's id finds the request on both nodes" \
	eval '[ "$(grep -lE "(^| )(id|remote_id)=$did( |$)" "$T/di.log" "$T/pi.log" | wc -l)" = 2 ]'
check "decode's access line names the same id" \
	eval 'log_since "$T/di.log" "$MD" | grep "event=http_request " | grep -q " id=$did client_id="'
check "one grep of prefill's id finds it on both nodes" \
	eval '[ "$(grep -lE "(^| )(id|prefill_id)=$pid( |$)" "$T/di.log" "$T/pi.log" | wc -l)" = 2 ]'
b1=$(pm 'kvd_kv_transfer_bytes_total{direction="send"}')
n1=$(pm 'kvd_kv_transfer_batches_total{direction="send"}')
check "prefill's metrics moved: $b1 bytes, $n1 batches sent" \
	eval '[ "${b1:-0}" -gt 0 ] && [ "${n1:-0}" -ge 1 ]'
check "  ... one KV send timed" test "$(pm 'kvd_kv_transfer_seconds_count{direction="send"}')" = 1
if command -v promtool >/dev/null 2>&1; then
	curl -s "${adm[@]}" "$P/metrics" > "$T/p.prom"
	check "promtool parses prefill's text, only the colon of vllm: names linted" promtool_ok "$T/p.prom"
else
	echo "# promtool absent: prefill's text not linted"
fi

# ---- kvctl audit of both nodes' logs --------------------------------------------------
rc=0; "$KVCTL" audit "$T/pi.log" "$T/di.log" > "$T/audit.out" 2>&1 || rc=$?
check "kvctl audit of both logs: exit 0 ($rc)" test "$rc" = 0
check "  ... a row per node with its role and verdict" \
	eval 'grep -qE "^pi +prefill .* ok " "$T/audit.out" && grep -qE "^di +decode .* ok " "$T/audit.out"'
"$KVCTL" audit --json "$T/pi.log" "$T/di.log" > "$T/audit.json" || true
check "  ... JSON: prefill served 1 request, decode answered 1, none failed" \
	jq -e '[.nodes[] | {node, role, done: .requests.done, failed: .requests.failed}] |
	       sort_by(.node) == [{node: "di", role: "decode", done: 1, failed: 0},
				  {node: "pi", role: "prefill", done: 1, failed: 0}]' "$T/audit.json"
# a journal window that starts after decode's boot: di's requests, no
# kv_capacity line of di's - not judged, and not a clean pass (exit 3)
grep -v "event=kv_capacity" "$T/di.log" > "$T/di_window.log"
rc=0; "$KVCTL" audit "$T/pi.log" "$T/di_window.log" > "$T/audit.out" 2>&1 || rc=$?
check "kvctl audit, decode's capacity line outside the window: exit 3 ($rc)" test "$rc" = 3
check "  ... di UNJUDGED, pi ok, the verdict line says why" \
	eval 'grep -qE "^di .* UNJUDGED " "$T/audit.out" && grep -qE "^pi +prefill .* ok " "$T/audit.out" &&
	      grep -q "^audit: UNJUDGED (no finding, but 1 of 2 nodes not judged)" "$T/audit.out"'
rc=0; "$KVCTL" audit --json "$T/pi.log" "$T/di_window.log" > "$T/audit.json" || rc=$?
check "  ... --json: exit 3, ok true, all_judged false ($rc)" \
	eval 'test $rc = 3 && jq -e ".ok == true and .all_judged == false and .unjudged == 1" "$T/audit.json" >/dev/null'

# ---- kvctl drain on prefill: readyz 503 at once, the request it holds served ---------
if [ $FAULT = 1 ]; then
	MP=$(log_mark "$T/pi.log")
	LONG=$(printf 'Once upon a time there was a girl. %.0s' 1 2 3 4 5 6)
	curl -s -o "$T/held" -w '%{http_code}' "${auth[@]}" \
		-d "{\"prompt\":\"$LONG\",\"max_tokens\":8,\"temperature\":0}" \
		"$D/v1/completions" > "$T/heldst" &
	HP=$!
	check "a request in flight on prefill" \
		wait_log "$T/pi.log" "event=req_state id=[0-9]+ tenant=alice machine=prefill from=new" 10 "$MP"
	inf=$("$KVCTL" drain --json --no-wait --socket "$T/pi.sock" | jq -r .in_flight)
	check "kvctl drain on prefill finds it in flight ($inf)" test "$inf" = 1
	st=$(req "$P" GET /readyz)
	check "  ... prefill /readyz 503 draining at once ($st)" \
		test "$st $(jq -r .reason "$T/body")" = "503 draining"
	st=$(req "$P" GET /livez)
	check "  ... /livez still 200 ($st)" test "$st" = 200
	wait $HP || true
	check "  ... decode's request on it still completes (200, $(jq -r .usage.completion_tokens "$T/held") tokens)" \
		test "$(cat "$T/heldst") $(jq -r .usage.completion_tokens "$T/held")" = "200 8"
else
	"$KVCTL" drain --no-wait --socket "$T/pi.sock" >/dev/null
	st=$(req "$P" GET /readyz)
	check "kvctl drain on prefill: /readyz 503 draining ($st)" \
		test "$st $(jq -r .reason "$T/body")" = "503 draining"
	echo "# built without fault points: the request held through a drain is not checked"
fi
check "no page held on either node" settle di pi
serve_finish
