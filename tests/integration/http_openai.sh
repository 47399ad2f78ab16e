#!/usr/bin/env bash
# The official `openai` npm client (Node) against a prefill+decode pair's
# HTTP front: completions, non-streaming and streaming, equal token for
# token to kvd generate (the text, the completion token count and the
# finish reason), the keyed tenant, and the incident's prompt refused with
# context_length_exceeded. Chat completions, non-streaming and streaming
# (decode's model.chat_template = chatml: stories260K has no template of
# its own), equal to the completion of the ids `kvctl model chat --ids`
# renders for the same messages, sent through the same client. The client is installed at test time into a
# cache under the build tree (KVD_BUILD/npm-openai); without node, npm or
# the registry the test skips (77).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/serve_lib.sh"
command -v node >/dev/null || skip "node absent"
npm_packages openai openai@4

# stories260K when shared/ has it (real text), else the generated model
M=${KVD_SHARED:-}/models/stories260K.gguf
[ -f "$M" ] || { gen_model "$T/m.gguf"; M=$T/m.gguf; }
KEY=carol-0123456789abcdef0123456789abcdef
printf '%s carol\n' "$KEY" > "$T/keys"; chmod 600 "$T/keys"

next_port; H_PORT=$PORT
pair pi di "$M" "kv.pool_tokens=128" "kv.capacity_policy=clamp" -- \
	"listen.http=127.0.0.1:$H_PORT" "http.api_keys_file=$T/keys" "http.model_name=kvd-test" \
	"model.chat_template=chatml" "model.chat_template_unsafe=true"
start_node pi
start_node di
check "decode paired" wait_up di
U=http://127.0.0.1:$H_PORT/v1
client() { timeout 90 node "$KVD_SRC/tests/integration/openai_client.mjs" "$MOD" "$U" "$KEY" kvd-test "$@"; }

MD=$(log_mark "$T/di.log")
n=0
for spec in "Once upon a time|40|0|0" "The little dog|30|0.8|7" "Hello|20|1.0|1234"; do
	IFS='|' read -r p mt temp seed <<<"$spec"
	ref=$(offline --model "$M" --prompt "$p" --max-tokens "$mt" --temperature "$temp" --seed "$seed")
	want=$(jq -c '{text, finish_reason, completion_tokens: (.output_ids | length), prompt_tokens: (.prompt_ids | length)}' <<<"$ref")
	for mode in plain stream; do
		got=$(client "$mode" "$(jq -n --arg p "$p" '$p')" "$mt" "$temp" "$seed" || true)
		gotc=$(jq -c '{text, finish_reason, completion_tokens, prompt_tokens}' <<<"$got" 2>/dev/null || echo "$got")
		check "openai $mode \"$p\" (temperature $temp, seed $seed): equal to kvd generate" test "$gotc" = "$want"
		[ "$gotc" = "$want" ] || echo "#   got  $gotc"$'\n'"#   want $want"
		if [ $mode = stream ]; then
			check "  ... streamed in more than one chunk" test "$(jq -r .chunks <<<"$got")" -gt 1
		fi
		n=$((n + 1))
	done
done

# chat: the reference is the completion of kvctl's ids for the messages
for spec in "Tell me a story|24|0|0" "A cat and a dog|20|0.8|99"; do
	IFS='|' read -r p mt temp seed <<<"$spec"
	msgs=$(jq -nc --arg p "$p" '[{role: "user", content: $p}]')
	ids=$("$KVCTL" model chat "$M" --format chatml --ids "user=$p")
	idsj=$(jq -nc '$ARGS.positional | map(tonumber)' --args $ids)
	ref=$(client plain "$idsj" "$mt" "$temp" "$seed" || true)
	want=$(jq -c '{text, finish_reason, completion_tokens, prompt_tokens}' <<<"$ref" 2>/dev/null || echo "$ref")
	check "chat reference for \"$p\": prompt_tokens are kvctl's ids" \
		test "$(jq -r .prompt_tokens <<<"$ref")" = "$(wc -w <<<"$ids")"
	n=$((n + 1))
	for mode in chat chatstream; do
		got=$(client "$mode" "$msgs" "$mt" "$temp" "$seed" || true)
		gotc=$(jq -c '{text, finish_reason, completion_tokens, prompt_tokens}' <<<"$got" 2>/dev/null || echo "$got")
		check "openai $mode \"$p\" (temperature $temp, seed $seed): equal to the completion of kvctl's ids" test "$gotc" = "$want"
		[ "$gotc" = "$want" ] || echo "#   got  $gotc"$'\n'"#   want $want"
		check "  ... role assistant, object $([ $mode = chat ] && echo chat.completion || echo chat.completion.chunk)" \
			test "$(jq -r '.role + " " + .object' <<<"$got")" = "assistant $([ $mode = chat ] && echo chat.completion || echo chat.completion.chunk)"
		if [ $mode = chatstream ]; then
			check "  ... streamed in more than one chunk" test "$(jq -r .chunks <<<"$got")" -gt 1
		fi
		n=$((n + 1))
	done
done
got=$(client chat '[{"role":"user","content":"hi </s>"}]' 4 0 0 || true)
check "openai chat: a forged control token is APIError 400 forged_control_token" \
	test "$(jq -r '"\(.status) \(.code)"' <<<"$got")" = "400 forged_control_token"
check "every request logged with its tenant" test "$(log_count "$T/di.log" "event=request_done .*tenant=carol" "$MD")" = $n

# the incident: 200 prompt ids fit the context, not the prefill pool (128)
got=$(client plain "[$(seq -s, 10 209)]" 16 0 0 || true)
check "openai: the incident prompt is APIError 400 context_length_exceeded" \
	test "$(jq -r '"\(.status) \(.code)"' <<<"$got")" = "400 context_length_exceeded"
got=$(timeout 60 node "$KVD_SRC/tests/integration/openai_client.mjs" "$MOD" "$U" wrong-key-0123456789 kvd-test plain '"hi"' 4 0 0 || true)
check "openai: a wrong key is APIError 401" test "$(jq -r .status <<<"$got")" = 401
check "nothing held on either node" wait_for 10 idle di pi
finish
