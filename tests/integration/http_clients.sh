#!/usr/bin/env bash
# The npm clients, unchanged, against a standalone node's HTTP front
# (issue 24.7): the official `openai` client (current major), the Vercel
# AI SDK (`ai` + `@ai-sdk/openai`, whose default provider calls
# /v1/responses) and LangChain JS (`@langchain/openai` +
# `@langchain/core`). Node scripts: openai_client.mjs, aisdk_client.mjs,
# langchain_client.mjs (a case is one function in each; clients_run.mjs
# runs them).
#   - greedy text, finish reason and usage equal kvd generate: chat,
#     responses (each client that has it), completions, streamed or not;
#   - a seed: the same sampled text through every client, equal to kvd
#     generate with that seed; another seed, another text;
#   - n: 3 through the openai client, streamed and not: choice i equals
#     kvd generate with seed + i, completion_tokens summed;
#   - a stop string ends the text before it (finish_reason stop);
#   - a client that aborts mid-stream: the node logs the client gone
#     (event=client_gone, at info) and serves the next request;
#   - logprobs through each client's option (openai logprobs/top_logprobs,
#     the AI SDK's providerOptions.openai.logprobs, ChatOpenAI's
#     logprobs/topLogprobs): one per completion token, 2 alternatives,
#     at temperature 0 the chosen token the likeliest;
#   - JSON mode: openai json_object; a zod schema through each client's
#     structured output (openai zodResponseFormat + parse, the AI SDK's
#     generateObject, LangChain's withStructuredOutput jsonSchema): valid;
#   - a tool call round trip: openai zodFunction (strict) with tool_choice
#     required (parse's parsed_arguments, the message sent back as parse
#     answered it, then the tool's result) and with the default "auto";
#     the AI SDK's generateText with a strict tool, toolChoice required
#     then none (prepareStep), stepCountIs(2); LangChain's bindTools with
#     tool_choice any, a ToolMessage back; each call valid by its schema;
#   - refusals as each client's own exception: 401 (AuthenticationError,
#     APICallError statusCode 401, LangChain's with MODEL_AUTHENTICATION),
#     400 context_length_exceeded, 429 when the tenant's queue is full.
# The packages are installed once into a cache under the build tree
# (KVD_BUILD/npm-clients, the versions in its .pkgs), bounded by a
# timeout; without node (20 or later), npm or the registry the test
# skips (77).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/serve_lib.sh"
command -v node >/dev/null || skip "node absent"
# these majors declare node >= 22 (ai, openai) or >= 20 (LangChain); they
# pass here on node 20, not known on Debian 12's node 18
NODE_MAJOR=$(node -p 'process.versions.node.split(".")[0]')
[ "$NODE_MAJOR" -ge 20 ] || skip "node $(node --version): the current npm clients need node >= 20 (22 by their engines)"

npm_packages clients openai@7 ai@7 @ai-sdk/openai@4 @langchain/openai@1 @langchain/core@1 zod@4

M=${KVD_SHARED:-}/models/stories260K.gguf
[ -f "$M" ] || { gen_model "$T/m.gguf"; M=$T/m.gguf; }
KEY=carol-0123456789abcdef0123456789abcdef
KEY_B=bob-0123456789abcdef0123456789abcdef00
printf '%s carol\n%s bob max_active=1 max_queued=1\n' "$KEY" "$KEY_B" > "$T/keys"
chmod 600 "$T/keys"
next_port; H=$PORT
write_node f standalone "$M" "listen.http=127.0.0.1:$H" "http.api_keys_file=$T/keys" \
	"kv.pool_tokens=4096" "kv.capacity_policy=clamp" "http.model_name=kvd-test" \
	"model.chat_template=chatml" "model.chat_template_unsafe=true"
start_node f
check "node up" wait_log "$T/f.log" "event=serve_ready"
U=http://127.0.0.1:$H/v1

# One node per client for the whole test, asked through FIFOs
# (clients_run.mjs): start_client NAME, then ask NAME MODE PROMPT_JSON
# MAX_TOKENS TEMPERATURE SEED [STOP_JSON] prints its answer line (the key:
# $CKEY, else carol's).
start_client() {
	local c=$1
	mkfifo "$T/$c.in" "$T/$c.out"
	node "$KVD_SRC/tests/integration/${c}_client.mjs" "$MOD" "$U" kvd-test \
		<"$T/$c.in" >"$T/$c.out" 2>"$T/$c.err" &
	PIDS+=($!)
	eval "exec {IN_$c}>\"\$T/$c.in\" {OUT_$c}<\"\$T/$c.out\""
}
ask() {
	local c=$1 in=IN_$1 out=OUT_$1 line
	shift
	jq -nc --arg key "${CKEY:-$KEY}" --arg mode "$1" --argjson prompt "$2" --argjson mt "$3" \
		--argjson t "$4" --argjson seed "$5" --argjson stop "${6:-null}" \
		'{key: $key, mode: $mode, prompt: $prompt, max_tokens: $mt, temperature: $t, seed: $seed, stop: $stop}' \
		>&"${!in}"
	if read -r -t 120 line <&"${!out}"; then
		echo "$line"
	else
		echo "{\"exception\": \"$c: no answer\"}"
		cat "$T/$c.err" >&2
	fi
}
client() { ask "$@"; }
for c in openai aisdk langchain; do start_client $c; done
fields() { jq -c '{text, finish_reason, completion_tokens, prompt_tokens}' 2>/dev/null <<<"$1" || echo "$1"; }
# same WHAT GOT WANT: a check that prints both when they differ
same() {
	check "$1" test "$2" = "$3"
	[ "$2" = "$3" ] || echo "#   got  $2"$'\n'"#   want $3"
}
# kvd generate of kvctl's chatml ids for one user message
chat_ref() { # chat_ref TEXT MAX_TOKENS TEMPERATURE SEED
	local ids
	ids=$("$KVCTL" model chat "$M" --format chatml --ids "user=$1")
	offline --model "$M" --prompt-ids "$(tr ' ' ',' <<<"$ids" | sed 's/,$//')" \
		--max-tokens "$2" --temperature "$3" --seed "$4" |
		jq -c '{text, finish_reason, completion_tokens: (.output_ids | length), prompt_tokens: (.prompt_ids | length)}'
}
jqe() { jq -e "$@" >/dev/null; }
msgs() { jq -nc --arg p "$1" '[{role: "user", content: $p}]'; }

# ---- greedy: equal to kvd generate -------------------------------------------------
P="Once upon a time"
want=$(chat_ref "$P" 24 0 0)
echo "# chat reference: $want"
for cm in openai:chat openai:chatstream openai:responses openai:responsesstream \
	  aisdk:responses aisdk:responsesstream aisdk:chat aisdk:chatstream \
	  langchain:chat langchain:chatstream langchain:responses langchain:responsesstream; do
	got=$(client "${cm%%:*}" "${cm#*:}" "$(msgs "$P")" 24 0 0)
	same "${cm%%:*} ${cm#*:}: greedy text, finish and usage equal kvd generate" "$(fields "$got")" "$want"
done
got=$(client openai responsesstream "$(msgs "$P")" 24 0 0)
check "openai responses stream: the events a Responses client expects ($(jq -c .events <<<"$got"))" \
	jqe '.events == ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added", "response.output_text.delta", "response.output_text.done", "response.content_part.done", "response.output_item.done", "response.incomplete"]' <<<"$got"
want=$(offline --model "$M" --prompt "$P" --max-tokens 20 |
	jq -c '{text, finish_reason, completion_tokens: (.output_ids | length), prompt_tokens: (.prompt_ids | length)}')
for cm in openai:plain openai:stream langchain:plain; do
	got=$(client "${cm%%:*}" "${cm#*:}" "$(jq -n --arg p "$P" '$p')" 20 0 0)
	same "${cm%%:*} completion ${cm#*:}: equal to kvd generate" "$(fields "$got")" "$want"
done
# the AI SDK's completion model renders a prompt of its own ("user:" ...):
# streamed equals not streamed, and it is cut at 20
a1=$(fields "$(client aisdk plain "$(jq -n --arg p "$P" '$p')" 20 0 0)")
a2=$(fields "$(client aisdk stream "$(jq -n --arg p "$P" '$p')" 20 0 0)")
same "aisdk completion: streamed equals not streamed" "$a2" "$a1"
check "  ... 20 tokens, finish length ($a1)" jqe '.completion_tokens == 20 and .finish_reason == "length"' <<<"$a1"

# ---- seed: same seed, same text, through every client ------------------------------------
want=$(chat_ref "The little dog" 20 0.8 7)
for c in openai aisdk langchain; do
	got=$(client $c chat "$(msgs "The little dog")" 20 0.8 7)
	same "$c chat, temperature 0.8, seed 7: equal to kvd generate with that seed" "$(fields "$got")" "$want"
done
got=$(client openai chat "$(msgs "The little dog")" 20 0.8 8)
check "  ... seed 8: another text" test "$(jq -r .text <<<"$got")" != "$(jq -r .text <<<"$want")"
# n=3 through the openai client: choice i is the single answer with seed 7 + i
wantn=$(for i in 0 1 2; do chat_ref "The little dog" 20 0.8 $((7 + i)); done | jq -sc '{texts: map(.text), completion_tokens: (map(.completion_tokens) | add)}')
for m in chatn chatnstream; do
	got=$(client openai $m "$(msgs "The little dog")" 20 0.8 7)
	same "openai $m (n: 3): choice i equals kvd generate with seed 7 + i, usage summed" \
		"$(jq -c '{texts, completion_tokens}' <<<"$got" 2>/dev/null || echo "$got")" "$wantn"
done

# ---- stop ----------------------------------------------------------------------------
full=$(chat_ref "$P" 24 0 0 | jq -r .text)
[[ $full == *.* ]] || echo "# (the reference has no '.': the stop checks below cannot hold)"
for cm in openai:chat openai:chatstream aisdk:chat aisdk:chatstream langchain:chat langchain:chatstream; do
	got=$(client "${cm%%:*}" "${cm#*:}" "$(msgs "$P")" 24 0 0 '["."]')
	same "${cm%%:*} ${cm#*:} with stop \".\": the text before it, finish stop" \
		"$(jq -c '{text, finish_reason}' <<<"$got")" "$(jq -nc --arg t "${full%%.*}" '{text: $t, finish_reason: "stop"}')"
done

# ---- logprobs -----------------------------------------------------------------------------
# each client's own logprobs option; at temperature 0 the chosen token is
# the likeliest: its logprob is top[0]'s and no alternative's is above
# it; one entry per completion token, their text the answer's
want=$(chat_ref "$P" 24 0 0)
for c in openai aisdk langchain; do
	got=$(client $c chatlogprobs "$(msgs "$P")" 24 0 0)
	same "$c chat with logprobs (2 alternatives): the greedy text, finish and usage" \
		"$(fields "$got" | jq -c 'del(.prompt_tokens)')" "$(jq -c 'del(.prompt_tokens)' <<<"$want")"
	check "  ... a logprob per completion token, 2 alternatives each, the chosen the likeliest" \
		jqe '(.logprobs | length) == .completion_tokens and (.logprobs | map(.token) | add) == .text and
		     all(.logprobs[]; . as $e | (.top | length) == 2 and .top[0][0] == .token and
		         .logprob <= 0 and all(.top[]; .[1] <= $e.logprob + 1e-6))' <<<"$got"
done

# ---- JSON mode and structured output --------------------------------------------------------
# json_object: the answer is an object from its first token (free text
# without the grammar: a story); a zod schema (an enum, a boolean and an
# integer - zod's .int() sends minimum and maximum -, strict) through each
# client's structured output: valid by the schema.
# The model writes whitespace between JSON tokens, hence 200 tokens.
got=$(client openai chatjson "$(msgs "$P")" 200 0 0)
check "openai json_object: the answer is a JSON object (or, cut at max_tokens, starts as one) ($(jq -c '{text: .text[:40], finish_reason}' <<<"$got" 2>/dev/null || echo "$got"))" \
	jqe '(.text | test("^\\s*[{]")) and (.finish_reason == "length" or (.json | type) == "object")' <<<"$got"
for c in openai aisdk langchain; do
	got=$(client $c chatparse "$(msgs "$P")" 200 0 0)
	check "$c structured output (zod schema, json_schema strict): valid ($(jq -c .parsed <<<"$got" 2>/dev/null || echo "$got"))" \
		jqe '.valid and (.parsed | keys) == ["ending", "mood", "stars"] and (.finish_reason // "stop") == "stop"' <<<"$got"
done

# ---- a tool call round trip -----------------------------------------------------------------
# a strict tool (enums only) called as the client asks, its arguments
# valid by the zod schema, the tool's result sent back and answered
got=$(client openai chattools "$(msgs "$P")" 200 0 0)
check "openai zodFunction tool, tool_choice required: a valid call, then the result sent back and answered ($(jq -c '{calls, finish_reason_1, finish_reason}' <<<"$got" 2>/dev/null || echo "$got"))" \
	jqe '(.calls | length) >= 1 and all(.calls[]; .valid and .name == "get_weather") and
	     .finish_reason_1 == "tool_calls" and (.finish_reason == "stop" or .finish_reason == "length") and
	     .prompt_tokens_2 > .prompt_tokens_1' <<<"$got"
got=$(client openai chattoolsauto "$(msgs "$P")" 200 0 0)
check "openai zodFunction tool, tool_choice auto: served, text or valid calls ($(jq -c '{calls, finish_reason_1}' <<<"$got" 2>/dev/null || echo "$got"))" \
	jqe '((.calls | length) > 0 and all(.calls[]; .valid)) or ((.calls | length) == 0 and (.text_1 | length) > 0)' <<<"$got"
got=$(client aisdk chattools "$(msgs "$P")" 200 0 0)
check "aisdk tool (strict), toolChoice required then none: execute got valid input, step 2 sent its result, a final text ($(jq -c '{calls, steps, tool_result_sent, finish_reason}' <<<"$got" 2>/dev/null || echo "$got"))" \
	jqe '(.calls | length) >= 1 and all(.calls[]; .valid) and .steps == 2 and .tool_result_sent and
	     .finish_reason_1 == "tool-calls" and (.text | length) > 0 and
	     (.finish_reason == "stop" or .finish_reason == "length")' <<<"$got"
got=$(client langchain chattools "$(msgs "$P")" 200 0 0)
check "langchain bindTools, tool_choice any: valid tool_calls, the ToolMessage back, a final answer ($(jq -c '{calls, finish_reason}' <<<"$got" 2>/dev/null || echo "$got"))" \
	jqe '(.calls | length) >= 1 and all(.calls[]; .valid) and .executed == (.calls | length) and
	     .finish_reason_1 == "tool_calls" and (.text | length) > 0 and
	     (.finish_reason == "stop" or .finish_reason == "length")' <<<"$got"

# ---- aborts ----------------------------------------------------------------------------
# 1900 tokens take a second or more here: the client aborts after two pieces
for cm in openai:chatabort aisdk:responsesabort langchain:chatabort; do
	MK=$(log_mark "$T/f.log")
	got=$(client "${cm%%:*}" "${cm#*:}" "$(msgs "$P")" 1900 0 0)
	check "${cm%%:*} aborts mid-stream ($(jq -c . <<<"$got" 2>/dev/null || echo "$got"))" \
		jqe '.aborted and .chunks == 2' <<<"$got"
	# a fast node may have written the whole answer into the socket's
	# buffers before the abort reached it: then the exchange ended whole
	# (status 200), not gone; either way at info, never a warning
	check "  ... the node logs the client gone at info (or the answer whole before the abort reached it)" \
		wait_log "$T/f.log" "level=info .*event=(client_gone .*tenant=carol|http_request .*tenant=carol .*status=200 )" 10 "$MK"
	log_has "$T/f.log" "event=client_gone .*tenant=carol" "$MK" ||
		echo "#   (this time the answer was whole before the abort)"
	check "  ... without a warning" bash -c \
		"! tail -c +$((MK + 1)) '$T/f.log' | grep -E 'level=(warn|error)'"
	check "  ... and stays healthy: nothing held, the next request served" wait_for 10 idle f
	got=$(client openai chat "$(msgs "$P")" 24 0 0)
	same "  ... (equal to kvd generate)" "$(fields "$got")" "$(chat_ref "$P" 24 0 0)"
done

# ---- errors as each client's exceptions ---------------------------------------------------
err() { jq -c '{status, code, class, lc_error_code}' 2>/dev/null <<<"$1" || echo "$1"; }
CKEY=wrong-key-0123456789
same "openai 401: AuthenticationError" "$(err "$(client openai chat "$(msgs hi)" 4 0 0)")" \
	'{"status":401,"code":"invalid_api_key","class":"AuthenticationError","lc_error_code":null}'
same "openai responses 401: AuthenticationError" "$(err "$(client openai responses "$(msgs hi)" 4 0 0)")" \
	'{"status":401,"code":"invalid_api_key","class":"AuthenticationError","lc_error_code":null}'
same "aisdk 401: APICallError statusCode 401" "$(err "$(client aisdk responses "$(msgs hi)" 4 0 0)")" \
	'{"status":401,"code":"invalid_api_key","class":"APICallError","lc_error_code":null}'
same "langchain 401: its MODEL_AUTHENTICATION error" "$(err "$(client langchain chat "$(msgs hi)" 4 0 0)")" \
	'{"status":401,"code":"invalid_api_key","class":"AuthenticationError","lc_error_code":"MODEL_AUTHENTICATION"}'
unset CKEY
LONG=$(msgs "$(printf 'Once upon a time %.0s' $(seq 600))")
for cm in openai:chat:BadRequestError openai:responses:BadRequestError aisdk:chat:APICallError \
	  aisdk:responses:APICallError langchain:chat:BadRequestError langchain:responses:BadRequestError; do
	IFS=: read -r c mode cls <<<"$cm"
	same "$c $mode: a prompt beyond the context is 400 context_length_exceeded ($cls)" \
		"$(client "$c" "$mode" "$LONG" 16 0 0 | jq -c '[.status, .code, .class]' 2>/dev/null)" \
		"[400,\"context_length_exceeded\",\"$cls\"]"
done
# bob: max_active=1, max_queued=1; two long requests (1900 tokens each,
# one after the other, EOS banned: a second or more each here) hold
# both, the third is 429 (tried up to five times, in case they ended
# before the client asked)
for cm in openai:chat:RateLimitError aisdk:responses:APICallError langchain:chat:RateLimitError; do
	IFS=: read -r c mode cls <<<"$cm"
	for try in 1 2 3 4 5; do
		hogs=()
		for i in 1 2; do
			curl -s -o /dev/null -H "Authorization: Bearer $KEY_B" \
				-d '{"prompt":"Once","max_tokens":1900,"temperature":0,"logit_bias":{"2":-100}}' "$U/completions" &
			hogs+=($!)
		done
		sleep 0.1
		got=$(CKEY=$KEY_B client "$c" "$mode" "$(msgs hi)" 4 0 0)
		wait "${hogs[@]}"
		[[ $got != *429* ]] || break
	done
	same "$c $mode: the tenant's queue full is 429 ($cls; try $try)" \
		"$(jq -c '[.status, .class]' <<<"$got" 2>/dev/null)" "[429,\"$cls\"]"
done
for c in openai aisdk langchain; do eval "exec {IN_$c}>&-"; done
check "nothing held at the end" wait_for 10 idle f
finish
