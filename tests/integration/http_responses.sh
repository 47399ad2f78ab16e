#!/usr/bin/env bash
# POST /v1/responses (issue 24.4, stateless) on a standalone node's HTTP
# front, with curl (the npm clients are http_clients.sh's):
#   - greedy text equals kvd generate of kvctl's chatml ids for the same
#     messages (instructions first as a system message), usage counts
#     them; the object's shape (resp_/msg_ ids, one assistant message with
#     one output_text part, store false, usage details);
#   - max_output_tokens cuts: status incomplete, incomplete_details
#     max_output_tokens (stories260K reaches no EOS here, so status
#     completed is not seen: it is any other finish);
#   - streamed: the events in OpenAI's order, each `event:` its data's
#     type, sequence_number 0, 1, 2, ..., the deltas' concatenation equal
#     to the non-streamed text and to output_text.done's, the last event
#     response.incomplete with the same usage;
#   - message items (developer as system, input_text parts, an earlier
#     output_text sent back) render as the same chat messages do;
#   - refused, naming the param: previous_response_id, conversation,
#     tools, reasoning, text.format json, an input item of another type,
#     an image part; 401 without a key; a prompt beyond the context is
#     400 context_length_exceeded, streamed or not; store true accepted;
#   - nothing held afterwards; in fault-point builds, an allocation that
#     fails while the answer is made (KVD_HTTP_NOMEM) ends it with a 500
#     or an `error` event, the connection closed, nothing held.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/serve_lib.sh"
command -v curl >/dev/null || skip "curl absent"
command -v jq >/dev/null || skip "jq absent"

M=${KVD_SHARED:-}/models/stories260K.gguf
[ -f "$M" ] || { gen_model "$T/m.gguf"; M=$T/m.gguf; }
KEY=carol-0123456789abcdef0123456789abcdef
printf '%s carol\n' "$KEY" > "$T/keys"
chmod 600 "$T/keys"
next_port; H=$PORT
write_node f standalone "$M" "listen.http=127.0.0.1:$H" "http.api_keys_file=$T/keys" \
	"kv.pool_tokens=128" "kv.capacity_policy=clamp" "http.model_name=kvd-test" \
	"model.chat_template=chatml" "model.chat_template_unsafe=true"
start_node f
check "node up" wait_log "$T/f.log" "event=serve_ready"
U=http://127.0.0.1:$H/v1

# post BODY [CURL ARGS...]: status on stdout, body in $T/body
post() {
	local b=$1; shift
	curl -s -o "$T/body" -w '%{http_code}' -H "Authorization: Bearer $KEY" "$@" \
		-d "$b" "$U/responses" || true
}
# ref MAX ROLE=CONTENT...: kvd generate of kvctl's chatml ids, as
# {text, out, in}
ref() {
	local mt=$1 ids; shift
	ids=$("$KVCTL" model chat "$M" --format chatml --ids "$@")
	offline --model "$M" --prompt-ids "$(tr ' ' ',' <<<"$ids" | sed 's/,$//')" \
		--max-tokens "$mt" |
		jq -c '{text, out: (.output_ids | length), in: (.prompt_ids | length)}'
}
jqe() { jq -e "$@" >/dev/null; }
got_of() {
	jq -c '{text: .output[0].content[0].text, out: .usage.output_tokens, in: .usage.input_tokens}' "$T/body"
}

# ---- the answer -------------------------------------------------------------------
want=$(ref 24 "system=Tell a story." "user=Once upon a time")
st=$(post '{"model":"kvd-test","input":[{"role":"developer","content":"Tell a story."},{"role":"user","content":"Once upon a time"}],"max_output_tokens":24,"temperature":0}')
check "input items, developer first: 200 ($st)" test "$st" = 200
check "  ... the text and usage of kvd generate for kvctl's ids, developer as system ($(got_of))" test "$(got_of)" = "$want"
st=$(post '{"model":"kvd-test","input":"Once upon a time","instructions":"Tell a story.","max_output_tokens":24,"temperature":0}')
check "input a string, instructions: 200 ($st)" test "$st" = 200
check "  ... the same: instructions first as a system message ($(got_of))" test "$(got_of)" = "$want"
cp "$T/body" "$T/plain"
check "  ... object response, resp_ id, store false, the model's name" \
	jqe '.object == "response" and (.id | test("^resp_[0-9a-f]{32}$")) and .store == false and .model == "kvd-test" and (.created_at | type) == "number"' "$T/plain"
check "  ... cut at 24: status incomplete, reason max_output_tokens" \
	jqe '.status == "incomplete" and .incomplete_details.reason == "max_output_tokens" and .max_output_tokens == 24' "$T/plain"
check "  ... one assistant message item, one output_text part with annotations" \
	jqe '(.output | length) == 1 and .output[0].type == "message" and .output[0].role == "assistant" and (.output[0].id | test("^msg_")) and .output[0].status == "incomplete" and (.output[0].content | length) == 1 and .output[0].content[0].type == "output_text" and .output[0].content[0].annotations == []' "$T/plain"
check "  ... usage: total, cached and reasoning tokens" \
	jqe '.usage.total_tokens == .usage.input_tokens + .usage.output_tokens and (.usage.input_tokens_details.cached_tokens | type) == "number" and .usage.output_tokens_details.reasoning_tokens == 0' "$T/plain"
st=$(post '{"input":"Once upon a time","temperature":0}')
check "no max_output_tokens: the rest of the context, then incomplete ($st $(jq -c '[.status, .usage.total_tokens, .max_output_tokens]' "$T/body"))" \
	jqe '.status == "incomplete" and .usage.total_tokens == 128 and .max_output_tokens == null' "$T/body"

# ---- streamed ---------------------------------------------------------------------
curl -sN -H "Authorization: Bearer $KEY" -d '{"input":"Once upon a time","instructions":"Tell a story.","max_output_tokens":24,"temperature":0,"stream":true}' \
	"$U/responses" > "$T/sse" || true
# the events as [{event, data}]
jq -Rn '[inputs] | reduce .[] as $l ({ev: [], name: null};
	if ($l | startswith("event: ")) then .name = ($l[7:])
	elif ($l | startswith("data: ")) then .ev += [{event: .name, data: ($l[6:] | fromjson)}] | .name = null
	else . end) | .ev' "$T/sse" > "$T/ev"
check "streamed: the events in order ($(jq -c '[.[].event] | unique' "$T/ev"))" \
	jqe '[.[].event] | . as $e | ($e[0:4] == ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]) and
		($e[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done", "response.incomplete"]) and
		($e[4:-4] | length > 1 and all(. == "response.output_text.delta"))' "$T/ev"
check "  ... each event's name is its type; sequence_number 0, 1, 2, ..." \
	jqe 'all(.[]; .event == .data.type) and ([.[].data.sequence_number] == [range(length)])' "$T/ev"
check "  ... the deltas make the text of the answer not streamed, and output_text.done's" \
	jqe --slurpfile p "$T/plain" '([.[] | select(.event == "response.output_text.delta") | .data.delta] | add) as $t |
		$t == $p[0].output[0].content[0].text and $t == (.[] | select(.event == "response.output_text.done") | .data.text)' "$T/ev"
check "  ... the deltas name the item: item_id, output_index 0, content_index 0" \
	jqe '(.[2].data.item.id) as $id | all(.[] | select(.event == "response.output_text.delta") | .data; .item_id == $id and .output_index == 0 and .content_index == 0)' "$T/ev"
check "  ... response.incomplete: the same usage, status and output" \
	jqe --slurpfile p "$T/plain" '.[-1].data.response | .usage.output_tokens == $p[0].usage.output_tokens and .usage.input_tokens == $p[0].usage.input_tokens and .status == "incomplete" and .output[0].content[0].text == $p[0].output[0].content[0].text' "$T/ev"
check "  ... no [DONE] (this API has none)" bash -c "! grep -q DONE '$T/sse'"

# ---- message items ----------------------------------------------------------------
want=$(ref 16 "user=Hi" "assistant=Yo" "user=Cat")
st=$(post '{"input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"Hi"}]},{"type":"message","id":"msg_0","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Yo","annotations":[]}]},{"role":"user","content":"Cat"}],"max_output_tokens":16,"temperature":0,"store":true}')
check "message items (input_text, an output_text sent back), store true: 200 ($st)" test "$st" = 200
check "  ... kvd generate of the same chat's ids ($(got_of))" test "$(got_of)" = "$want"
check "  ... store true accepted, the answer says false (kvd keeps nothing)" jqe '.store == false' "$T/body"

# ---- refused ----------------------------------------------------------------------
refused() { # refused BODY PARAM
	local st
	st=$(post "$1")
	check "refused: $1 -> 400 $2 ($st $(jq -r .error.param "$T/body"))" \
		test "$st $(jq -r .error.param "$T/body")" = "400 $2"
}
refused '{"input":"x","previous_response_id":"resp_0123"}' previous_response_id
refused '{"input":"x","conversation":"conv_1"}' conversation
refused '{"input":"x","tools":[{"type":"function","name":"f","parameters":{}}]}' tools
refused '{"input":"x","reasoning":{"effort":"high"}}' reasoning
refused '{"input":"x","text":{"format":{"type":"json_object"}}}' text.format
refused '{"input":[{"type":"function_call_output","call_id":"c","output":"o"}]}' 'input[0].type'
refused '{"input":[{"role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_image","image_url":"http://x/y.png"}]}]}' 'input[0].content[1].type'
st=$(post '{"input":"x"}' -H "Authorization: Bearer wrong-0123456789")
check "a wrong key: 401 ($st)" test "$st $(jq -r .error.code "$T/body")" = "401 invalid_api_key"
long=$(printf 'Once upon a time %.0s' $(seq 60))
st=$(post "{\"input\":\"$long\"}")
check "beyond the context: 400 context_length_exceeded ($st)" \
	test "$st $(jq -r .error.code "$T/body")" = "400 context_length_exceeded"
st=$(post "{\"input\":\"$long\",\"stream\":true}")
check "  ... streamed too, before any event ($st)" \
	test "$st $(jq -r .error.code "$T/body")" = "400 context_length_exceeded"
check "nothing held" wait_for 10 idle f
stop_node f

# ---- allocation failures (fault-point builds): KVD_HTTP_NOMEM=N fails the
# N-th allocation of every exchange; a few of the 38 a short stream makes
if grep -q "KVD_FAULT_POINTS 1" "$KVD_BUILD/kvd_build.h"; then
	for n in 1 2 9 30; do
		next_port; H=$PORT
		write_node "nm$n" standalone "$M" "listen.http=127.0.0.1:$H" \
			"kv.pool_tokens=128" "kv.capacity_policy=clamp" \
			"model.chat_template=chatml" "model.chat_template_unsafe=true"
		start_node "nm$n" KVD_HTTP_NOMEM=$n
		wait_log "$T/nm$n.log" "event=serve_ready" 60 || { not_ok "nomem $n: node up"; continue; }
		rc=0
		code=$(curl -s -N --max-time 20 -o "$T/nm.sse" -w '%{http_code}' "127.0.0.1:$H/v1/responses" \
			-d '{"input":"Once","max_output_tokens":6,"temperature":0,"stream":true}') || rc=$?
		last=$(grep '^event: ' "$T/nm.sse" | tail -1 || true)
		check "nomem $n, streamed: 500 before any event, or an error event last, or the whole stream; closed ($code, curl rc $rc, $last)" \
			bash -c "[ $rc = 0 ] && { [ $code = 500 ] || [ '$last' = 'event: error' ] || [ '$last' = 'event: response.incomplete' ]; }"
		rc=0
		code=$(curl -s --max-time 20 -o "$T/nm.json" -w '%{http_code}' "127.0.0.1:$H/v1/responses" \
			-d '{"input":"Once","max_output_tokens":6,"temperature":0}') || rc=$?
		check "nomem $n, not streamed: 500 naming it, or the whole answer ($code, curl rc $rc)" \
			bash -c "[ $rc = 0 ] && { [ $code = 500 ] && grep -q 'out of memory' '$T/nm.json' || jq -e '.status == \"incomplete\"' '$T/nm.json' >/dev/null; }"
		check "nomem $n: nothing held" wait_for 10 idle "nm$n"
		stop_node "nm$n"
	done
fi
finish
