#!/usr/bin/env bash
# The HTTP front's llama-server and operator endpoints (issue 24, items 4
# and 6), with curl on real nodes:
#   - /tokenize and /detokenize: ids equal `kvctl model tokenize`, pieces
#     (text, or byte values for a piece that is not UTF-8 alone),
#     add_special, a round trip; a large body through the prep pool while
#     the loop stays responsive; the key (401), the body bound (413), the
#     token bound and the vocabulary (400 naming the param), bad JSON and
#     unknown fields (400);
#   - GET /v1/models/{id}: the model object (also percent-encoded), 404
#     model_not_found otherwise, 401 without a key;
#   - CORS (http.cors_origins): an allowed Origin echoed with Vary on JSON,
#     SSE, errors and 401s; OPTIONS preflight 204 without a key; another
#     origin: no header and 403 on preflight; off by default;
#   - /livez and /readyz: keyless; a decode node without its prefill: livez
#     200, readyz 503 unpaired; with it: 200; after kvctl drain: readyz
#     503 draining at once while the request in flight is still served;
#   - vLLM metric names (http.metrics_vllm_names): they parse, carry
#     model_name = http.model_name, and move with the requests; off: gone;
#   - special tokens in a completion prompt (http.parse_special): "</s>" is
#     the control token, off: text; never in chat content.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/serve_lib.sh"
command -v curl >/dev/null || skip "curl absent"
command -v jq >/dev/null || skip "jq absent"

# stories260K (a real SentencePiece vocabulary with byte tokens and </s>)
M=$(shared_model stories260K.gguf)
KEY=carol-0123456789abcdef0123456789abcdef
ADM=admin-0123456789abcdef0123456789abcdef
printf '%s carol\n%s ops admin\n' "$KEY" "$ADM" > "$T/keys"
chmod 600 "$T/keys"
ORIGIN=https://app.example.com
write_node bad standalone "$M" "listen.http=127.0.0.1:8080" "http.cors_origins=$ORIGIN, app.example.com/x"
rc=0; "$KVD" --check-config --config "$T/bad.ini" > "$T/bad.out" 2>&1 || rc=$?
check "http.cors_origins with a path-shaped entry: exit 78 naming it ($rc)" \
	bash -c "test $rc = 78 && grep -q 'http.cors_origins' '$T/bad.out' && grep -q 'app.example.com/x' '$T/bad.out'"
next_port; H=$PORT
write_node s standalone "$M" "listen.http=127.0.0.1:$H" "http.api_keys_file=$T/keys" \
	"http.model_name=org/stories" "http.max_body_bytes=2M" \
	"http.cors_origins=$ORIGIN, http://localhost:5173" \
	"model.chat_template=chatml" "model.chat_template_unsafe=true"
start_node s
check "standalone node up" wait_log "$T/s.log" "event=serve_ready"
U=http://127.0.0.1:$H

# req METHOD PATH [BODY] [curl args...]: status on stdout, body in $T/body,
# headers in $T/head (with $KEY unless the args give another)
req() {
	local m=$1 p=$2 b=${3:-}; shift 3 || shift $#
	local a=(-s -o "$T/body" -D "$T/head" -w '%{http_code}' -X "$m")
	[ -z "$b" ] || a+=(--data-binary "$b")
	curl "${a[@]}" "$@" "$U$p" || true
}
auth=(-H "Authorization: Bearer $KEY")
hdr() { grep -i "^$1:" "$T/head" | head -1 | cut -d: -f2- | tr -d '\r' | sed 's/^ //'; }

# ---- /tokenize and /detokenize --------------------------------------------------------
TEXT='Once upon a time, é 😀'
want=$("$KVCTL" model tokenize "$M" --no-bos --json "$TEXT" | jq -c .ids)
st=$(req POST /tokenize "$(jq -cn --arg c "$TEXT" '{content: $c}')" "${auth[@]}")
check "tokenize: 200 ($st)" test "$st" = 200
check "  ... the ids of kvctl model tokenize --no-bos ($want)" test "$(jq -c .tokens "$T/body")" = "$want"
wantb=$("$KVCTL" model tokenize "$M" --json "$TEXT" | jq -c .ids)
st=$(req POST /tokenize "$(jq -cn --arg c "$TEXT" '{content: $c, add_special: true}')" "${auth[@]}")
check "  ... add_special: BOS first, as kvctl model tokenize" test "$(jq -c .tokens "$T/body")" = "$wantb"
st=$(req POST /tokenize "$(jq -cn --arg c "$TEXT" '{content: $c, with_pieces: true}')" "${auth[@]}")
check "  ... with_pieces: 200, the same ids" test "$st $(jq -c '[.tokens[].id]' "$T/body")" = "200 $want"
check "  ... pieces join to the text (the leading space of SentencePiece aside)" \
	test "$(jq -r '[.tokens[].piece | strings] | join("")' "$T/body" | sed 's/^ //')" = "${TEXT%😀}"
check "  ... a piece that is not UTF-8 alone is its byte values" \
	jq -e '[.tokens[].piece | arrays] | length > 0 and all(.[]; all(.[]; type == "number" and . >= 128 and . < 256))' "$T/body"
check "  ... the byte pieces hold the emoji's four bytes" \
	test "$(jq -c '[.tokens[].piece | arrays | .[]]' "$T/body")" = "[240,159,152,128]"
st=$(req POST /detokenize "{\"tokens\":$want}" "${auth[@]}")
check "detokenize: the round trip gives the text back ($st)" \
	test "$st $(jq -r .content "$T/body" | sed 's/^ //')" = "200 $TEXT"
st=$(req POST /tokenize '{"content":""}' "${auth[@]}")
check "tokenize \"\": []" test "$st $(jq -c .tokens "$T/body")" = "200 []"
st=$(req POST /detokenize '{"tokens":[]}' "${auth[@]}")
check "detokenize []: \"\"" test "$st $(jq -c .content "$T/body")" = '200 ""'
st=$(req POST /tokenize '{"content":"hi"}')
check "tokenize without a key: 401 ($st)" test "$st" = 401
st=$(req POST /detokenize '{"tokens":[1]}' -H "Authorization: Bearer ${KEY}x")
check "detokenize with a wrong key: 401 ($st)" test "$st" = 401
NV=$("$KVCTL" model inspect "$M" --json | jq -r .n_vocab)
st=$(req POST /detokenize "{\"tokens\":[1,$NV]}" "${auth[@]}")
check "an id outside the vocabulary ($NV): 400 naming tokens ($st)" \
	test "$st $(jq -r .error.param "$T/body")" = "400 tokens"
check "  ... saying which" jq -e '.error.message | test("tokens\\[1\\]")' "$T/body"
st=$(req POST /detokenize '{"tokens":[1,-3]}' "${auth[@]}")
check "a negative id: 400 naming tokens ($st)" test "$st $(jq -r .error.param "$T/body")" = "400 tokens"
st=$(req POST /detokenize '{"tokens":[1,"a"]}' "${auth[@]}")
check "a string id: 400 naming tokens ($st)" test "$st $(jq -r .error.param "$T/body")" = "400 tokens"
st=$(req POST /detokenize '{"tokens":"1 2"}' "${auth[@]}")
check "tokens not an array: 400 naming tokens ($st)" test "$st $(jq -r .error.param "$T/body")" = "400 tokens"
jq -cn '{tokens: [range(131073) | 1]}' > "$T/many.json"
st=$(req POST /detokenize "@$T/many.json" "${auth[@]}")
check "131073 ids (over PROTO_CLIENT_TOKENS_MAX): 400 naming tokens ($st)" \
	test "$st $(jq -r .error.param "$T/body")" = "400 tokens"
python3 -c 'import json; print(json.dumps({"content": "\n" * 140000}))' > "$T/nl.json"
st=$(req POST /tokenize "@$T/nl.json" "${auth[@]}")
check "content of 140000 tokens (over PROTO_CLIENT_TOKENS_MAX): 400 naming content ($st)" \
	test "$st $(jq -r .error.param "$T/body")" = "400 content"
st=$(req POST /tokenize '{"content":7}' "${auth[@]}")
check "content not a string: 400 naming content ($st)" test "$st $(jq -r .error.param "$T/body")" = "400 content"
st=$(req POST /tokenize '{"content":"a","with_pieces":"yes"}' "${auth[@]}")
check "with_pieces not a boolean: 400 naming it ($st)" test "$st $(jq -r .error.param "$T/body")" = "400 with_pieces"
st=$(req POST /tokenize '{"content":"a","n_probs":3}' "${auth[@]}")
check "an unknown field: 400 naming it ($st)" jq -e '.error.message | test("n_probs")' "$T/body"
st=$(req POST /tokenize '{"content":' "${auth[@]}")
check "bad JSON: 400 ($st)" test "$st" = 400
head -c 2200000 /dev/zero | tr '\0' a > "$T/huge"
st=$(curl -s -o "$T/body" -w '%{http_code}' "${auth[@]}" --data-binary "@$T/huge" "$U/tokenize" || true)
check "a body over http.max_body_bytes: 413 ($st)" test "$st" = 413
# a large body goes to the prep pool: the loop answers others meanwhile
python3 -c 'import json,sys; print(json.dumps({"content": "Once upon a time there was a little girl. " * 9000}))' > "$T/big.json"
MK=$(log_mark "$T/s.log")
curl -s -o "$T/bigans" -w '%{http_code}' "${auth[@]}" --data-binary "@$T/big.json" "$U/tokenize" > "$T/bigst" &
BP=$!
lz=$(curl -s -o /dev/null -w '%{http_code} %{time_total}' "$U/livez" || true)
wait $BP
check "a 380 KB body: 200 ($(cat "$T/bigst"))" test "$(cat "$T/bigst")" = 200
check "  ... about 10 tokens per sentence" jq -e '.tokens | length > 50000 and length < 131072' "$T/bigans"
check "  ... /livez answered meanwhile ($lz)" test "${lz%% *}" = 200
check "  ... no loop iteration was busy 20 ms with it" bash -c "! log_since '$T/s.log' $MK | grep -q 'event=loop_busy'"

# ---- GET /v1/models/{id} ----------------------------------------------------------------
st=$(req GET /v1/models/org%2Fstories "" "${auth[@]}")
check "/v1/models/org%2Fstories: 200 ($st)" test "$st" = 200
check "  ... the model object" test "$(jq -c '{id, object, owned_by}' "$T/body")" = '{"id":"org/stories","object":"model","owned_by":"kvd"}'
check "  ... the one /v1/models lists" \
	test "$(jq -c . "$T/body")" = "$(curl -s "${auth[@]}" "$U/v1/models" | jq -c '.data[0]')"
st=$(req GET /v1/models/gpt-4o "" "${auth[@]}")
check "/v1/models/gpt-4o: 404 ($st)" test "$st" = 404
check "  ... OpenAI's shape: model_not_found, param model" \
	test "$(jq -c '.error | {type, code, param}' "$T/body")" = '{"type":"invalid_request_error","code":"model_not_found","param":"model"}'
check "  ... naming the id" jq -e '.error.message | test("gpt-4o")' "$T/body"
st=$(req GET /v1/models/org/stories "" "${auth[@]}")
check "/v1/models/org/stories (two segments): 404 ($st)" test "$st" = 404
st=$(req GET /v1/models/%ff%00 "" "${auth[@]}")
check "a bad id (%ff%00): 404, valid JSON" test "$st $(jq -r .error.code "$T/body")" = "404 model_not_found"
st=$(req GET /v1/models/org%2Fstories)
check "without a key: 401 ($st)" test "$st" = 401

# ---- CORS ------------------------------------------------------------------------------
st=$(req GET /v1/models "" "${auth[@]}" -H "Origin: $ORIGIN")
check "allowed Origin on JSON: Access-Control-Allow-Origin echoed ($st)" \
	test "$(hdr Access-Control-Allow-Origin)" = "$ORIGIN"
check "  ... Vary: Origin" test "$(hdr Vary)" = Origin
check "  ... Retry-After exposed to the page" test "$(hdr Access-Control-Expose-Headers)" = Retry-After
st=$(req GET /v1/models "" -H "Origin: $ORIGIN")
check "  ... on a 401 ($st)" test "$st $(hdr Access-Control-Allow-Origin)" = "401 $ORIGIN"
st=$(req POST /v1/completions '{"prompt":"Once","logprobs":true}' "${auth[@]}" -H "Origin: http://localhost:5173")
check "  ... on an error (400), the second origin of the list ($st)" \
	test "$st $(hdr Access-Control-Allow-Origin)" = "400 http://localhost:5173"
st=$(req POST /v1/completions '{"prompt":"Once","max_tokens":4,"stream":true}' "${auth[@]}" -H "Origin: $ORIGIN")
check "  ... on SSE ($st)" test "$st $(hdr Access-Control-Allow-Origin)" = "200 $ORIGIN"
check "  ... the stream intact" grep -q '^data: \[DONE\]' "$T/body"
st=$(req GET /v1/models "" "${auth[@]}" -H "Origin: https://evil.example.com")
check "an origin not in the list: 200, no CORS header ($st)" \
	test "$st $(hdr Access-Control-Allow-Origin)$(hdr Vary)" = "200 "
st=$(req GET /v1/models "" "${auth[@]}" -H "Origin: https://app.example.com.evil")
check "  ... nor an allowed origin's extension" test -z "$(hdr Access-Control-Allow-Origin)"
st=$(req GET /v1/models "" "${auth[@]}")
check "no Origin: no CORS header" test -z "$(hdr Access-Control-Allow-Origin)"
st=$(req OPTIONS /v1/chat/completions "" -H "Origin: $ORIGIN" \
	-H "Access-Control-Request-Method: POST" -H "Access-Control-Request-Headers: authorization,content-type,x-stainless-os")
check "preflight, no key: 204 ($st)" test "$st" = 204
check "  ... Allow-Origin echoed" test "$(hdr Access-Control-Allow-Origin)" = "$ORIGIN"
check "  ... Allow-Methods has POST" bash -c "grep -i '^Access-Control-Allow-Methods:' '$T/head' | grep -q POST"
check "  ... Allow-Headers: Authorization, Content-Type and the openai client's" \
	bash -c "grep -i '^Access-Control-Allow-Headers:' '$T/head' | grep -i Authorization | grep -i Content-Type | grep -qi X-Stainless-OS"
check "  ... Max-Age" test -n "$(hdr Access-Control-Max-Age)"
check "  ... no body" test ! -s "$T/body"
st=$(req OPTIONS /v1/models "" -H "Origin: https://evil.example.com" -H "Access-Control-Request-Method: GET")
check "preflight from another origin: 403, no CORS header ($st)" \
	test "$st $(hdr Access-Control-Allow-Origin)" = "403 "
st=$(req OPTIONS /v1/models/org%2Fstories "")
check "OPTIONS without Origin (not a preflight): 204 with Allow: OPTIONS, GET ($st)" \
	test "$st $(hdr Allow)" = "204 OPTIONS, GET"
check "  ... no CORS header" test -z "$(hdr Access-Control-Allow-Origin)"
st=$(req OPTIONS /nowhere "" -H "Origin: $ORIGIN")
check "preflight on an unknown path: 404 ($st)" test "$st" = 404
# keep-alive: the second request on the connection has no Origin
curl -s -D "$T/h2" -o /dev/null "${auth[@]}" -H "Origin: $ORIGIN" "$U/v1/models" \
	--next -s -D "$T/h3" -o /dev/null "${auth[@]}" "$U/v1/models"
check "keep-alive: the next request without Origin gets no CORS header" \
	bash -c "grep -qi '^Access-Control-Allow-Origin' '$T/h2' && ! grep -qi '^Access-Control-Allow-Origin' '$T/h3'"

# ---- /livez, /readyz on a standalone node ------------------------------------------------
st=$(req GET /livez)
check "/livez without a key: 200 ($st)" test "$st $(jq -r .status "$T/body")" = "200 alive"
st=$(req GET /readyz)
check "/readyz on a standalone node: 200 ($st)" test "$st $(jq -r .status "$T/body")" = "200 ready"

# ---- vLLM's metric names (http.metrics_vllm_names, on by default) ---------------------------
vm() { # vm NAME{LABELS}: a sample of GET /metrics (admin key), "" when absent
	curl -s -H "Authorization: Bearer $ADM" "$U/metrics" |
		awk -v k="$1" '$1 == k { print $2; f = 1 } END { if (!f) print "" }'
}
L='model_name="org/stories"'
g0=$(vm "vllm:generation_tokens_total{$L}")
p0=$(vm "vllm:prompt_tokens_total{$L}")
t0=$(vm "vllm:time_to_first_token_seconds_count{$L}")
l0=$(vm "vllm:request_success_total{$L,finished_reason=\"length\"}")
check "vllm:generation_tokens_total{$L} is served ($g0)" test -n "$g0"
st=$(req POST /v1/completions '{"prompt":"Once upon a time","max_tokens":5,"temperature":0}' "${auth[@]}")
check "a completion of 5 tokens: 200 ($st)" test "$st $(jq -r .usage.completion_tokens "$T/body")" = "200 5"
np=$(jq -r .usage.prompt_tokens "$T/body")
check "  ... vllm:generation_tokens_total moved by 5" test "$(vm "vllm:generation_tokens_total{$L}")" = $((g0 + 5))
check "  ... vllm:prompt_tokens_total by its $np prompt tokens" test "$(vm "vllm:prompt_tokens_total{$L}")" = $((p0 + np))
check "  ... vllm:time_to_first_token_seconds_count by 1" \
	test "$(vm "vllm:time_to_first_token_seconds_count{$L}")" = $((t0 + 1))
check "  ... vllm:request_success_total{finished_reason=length} by 1" \
	test "$(vm "vllm:request_success_total{$L,finished_reason=\"length\"}")" = $((l0 + 1))
check "  ... vllm:num_requests_running, vllm:num_requests_waiting, vllm:kv_cache_usage_perc, vllm:gpu_cache_usage_perc, vllm:e2e_request_latency_seconds, vllm:time_per_output_token_seconds present" \
	bash -c "curl -s -H 'Authorization: Bearer $ADM' '$U/metrics' | grep -c -E '^vllm:(num_requests_running|num_requests_waiting|kv_cache_usage_perc|gpu_cache_usage_perc|e2e_request_latency_seconds_count|time_per_output_token_seconds_count)\{$L\} ' | grep -qx 6"
if command -v promtool >/dev/null 2>&1; then
	curl -s -H "Authorization: Bearer $ADM" "$U/metrics" > "$T/m.prom"
	check "promtool parses the text, only the colon of vllm: names linted" promtool_ok "$T/m.prom"
fi

# ---- special tokens in completion prompts (http.parse_special, on by default) --------------
# stories260K's </s> is a control token (id 2)
NSP=$("$KVCTL" model tokenize "$M" --special --json '</s>hi' | jq '.ids | length')
NTX=$("$KVCTL" model tokenize "$M" --json '</s>hi' | jq '.ids | length')
SPIDS=$("$KVCTL" model tokenize "$M" --special --json '</s>hi' | jq -c .ids)
st=$(req POST /v1/completions '{"prompt":"</s>hi","max_tokens":6,"temperature":0}' "${auth[@]}")
check "completion prompt \"</s>hi\": 200, $NSP prompt tokens (the control token), not $NTX ($st)" \
	test "$st $(jq -r .usage.prompt_tokens "$T/body")" = "200 $NSP"
txt=$(jq -r '.choices[0].text' "$T/body")
st=$(req POST /v1/completions "{\"prompt\":$SPIDS,\"max_tokens\":6,\"temperature\":0}" "${auth[@]}")
check "  ... the text of the prompt given as the ids $SPIDS" test "$st $(jq -r '.choices[0].text' "$T/body")" = "200 $txt"
st=$(req POST /tokenize '{"content":"</s>hi"}' "${auth[@]}")
check "/tokenize parses it too (the config's default): $((NSP - 1)) ids" test "$(jq '.tokens | length' "$T/body")" = $((NSP - 1))
st=$(req POST /tokenize '{"content":"</s>hi","parse_special":false}' "${auth[@]}")
check "  ... parse_special false: text, $((NTX - 1)) ids" test "$(jq '.tokens | length' "$T/body")" = $((NTX - 1))
st=$(req POST /v1/chat/completions '{"messages":[{"role":"user","content":"hi </s>"}],"max_tokens":2}' "${auth[@]}")
check "never in chat content: 400 forged_control_token ($st)" \
	test "$st $(jq -r .error.code "$T/body")" = "400 forged_control_token"
stop_node s

# ---- /livez, /readyz on a decode node: without its prefill, with it, drained ---------------
FAULT=0
grep -q "KVD_FAULT_POINTS 1" "$KVD_BUILD/kvd_build.h" && FAULT=1
next_port; H=$PORT
U=http://127.0.0.1:$H
# prefill sends a page a batch (a page of stories260K is 20544 bytes), so with
# slow_batch a prompt of 4 pages is over a second in flight
pair pi di "$M" "transfer.max_batch_bytes=24K" -- "listen.http=127.0.0.1:$H" "http.api_keys_file=$T/keys" \
	"http.parse_special=off" "http.metrics_vllm_names=off"
start_node di
check "decode listens for HTTP" wait_log "$T/di.log" "event=listen_http"
st=$(req GET /livez)
check "decode without its prefill: /livez 200 ($st)" test "$st" = 200
st=$(req GET /readyz)
check "  ... /readyz 503 ($st)" test "$st $(jq -r .status "$T/body")" = "503 unavailable"
check "  ... saying why (unpaired)" jq -e '.reason | test("unpaired")' "$T/body"
st=$(req GET /health)
check "  ... /health agrees (503)" test "$st" = 503
# slow_batch (fault-point builds): prefill waits 300 ms before each batch,
# so a request is still in flight when the drain comes (its prompt is
# 4 pages: over a second)
if [ $FAULT = 1 ]; then start_node pi KVD_FAULT=slow_batch; else start_node pi; fi
check "decode paired" wait_up di
ready() { test "$(req GET /readyz)" = 200; }
check "with its prefill: /readyz 200" wait_for 10 ready
check "  ... ready, role decode" test "$(jq -c '{status, role}' "$T/body")" = '{"status":"ready","role":"decode"}'
st=$(req POST /v1/completions '{"prompt":"</s>hi","max_tokens":2,"temperature":0}' "${auth[@]}")
check "http.parse_special=off: \"</s>hi\" is text, $NTX prompt tokens ($st)" \
	test "$st $(jq -r .usage.prompt_tokens "$T/body")" = "200 $NTX"
curl -s -H "Authorization: Bearer $ADM" "$U/metrics" > "$T/off.prom"
check "http.metrics_vllm_names=off: no vllm: series" bash -c "! grep -q '^vllm:' '$T/off.prom'"
check "  ... kvd's are there" grep -q '^kvd_generation_tokens_total{tenant="carol"} 2$' "$T/off.prom"
if [ $FAULT = 1 ]; then
	MK=$(log_mark "$T/di.log")
	LONG=$(printf 'Once upon a time there was a girl. %.0s' 1 2 3 4 5 6)
	curl -s -o "$T/held" -w '%{http_code}' "${auth[@]}" -d "{\"prompt\":\"$LONG\",\"max_tokens\":8,\"temperature\":0}" \
		"$U/v1/completions" > "$T/heldst" &
	HP=$!
	check "a request in flight" wait_log "$T/di.log" "event=http_admit" 10 "$MK"
	inf=$("$KVCTL" drain --json --no-wait --socket "$T/di.sock" | jq -r .in_flight)
	check "kvctl drain finds it in flight ($inf)" test "$inf" = 1
	st=$(req GET /readyz)
	check "kvctl drain: /readyz 503 at once ($st)" test "$st $(jq -r .reason "$T/body")" = "503 draining"
	st=$(req GET /livez)
	check "  ... /livez still 200 ($st)" test "$st" = 200
	st=$(req POST /v1/completions '{"prompt":"Once","max_tokens":2}' "${auth[@]}")
	check "  ... a new request: 503 draining ($st)" test "$st $(jq -r .error.code "$T/body")" = "503 draining"
	wait $HP || true
	check "  ... the request it held is still served (200, $(jq -r .usage.completion_tokens "$T/held") tokens)" \
		test "$(cat "$T/heldst") $(jq -r .usage.completion_tokens "$T/held")" = "200 8"
else
	"$KVCTL" drain --no-wait --socket "$T/di.sock" >/dev/null
	st=$(req GET /readyz)
	check "kvctl drain: /readyz 503 ($st)" test "$st $(jq -r .reason "$T/body")" = "503 draining"
	echo "# built without fault points: the request held through a drain is not checked"
fi
serve_finish
