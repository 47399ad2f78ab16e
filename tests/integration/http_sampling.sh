#!/usr/bin/env bash
# Sampling controls over HTTP (issue 24.1): logit_bias, logprobs,
# frequency/presence/repetition penalties and min_p, on a standalone
# node and on a prefill+decode pair (stories260K; skips 77 without it):
#   - logit_bias -100 on the greedy first token changes the output; +100
#     on a token makes every token that one;
#   - logprobs in both endpoints' shapes, streaming and not, aligned with
#     the tokens (as many as completion_tokens, the same streamed or
#     not), and in greedy mode the chosen token's logprob >= every
#     alternative's; a non-streamed answer holds at most 16384 tokens'
#     logprobs (HTTP_LP_HELD_MAX: a larger max_tokens is a 400 naming
#     max_tokens), a streamed one is not bound by that;
#   - the msgpack client API (kvctl generate) takes logit_bias and
#     logprobs: the same text and logprobs as HTTP for the same request,
#     +100 forces a token, an id outside the vocabulary is
#     INVALID_REQUEST, bad values are usage errors;
#   - kvd generate (offline) takes the same options: kvctl generate's
#     tokens and logprobs as printed, HTTP's text, the node's message for
#     an id outside the vocabulary;
#   - frequency_penalty 2 repeats fewer tokens than 0;
#   - the same extended request on the pair and on the standalone node
#     gives the same tokens and logprobs (decode samples the first token
#     itself: event=decode_recompute), streaming or not, max_tokens 1 too;
#     a plain request on the pair does not recompute;
#   - bad values are 400s naming the parameter.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/serve_lib.sh"
command -v curl >/dev/null || skip "curl absent"
command -v jq >/dev/null || skip "jq absent"
M=$(shared_model) || exit

KEY=carol-0123456789abcdef0123456789abcdef
printf '%s carol\n' "$KEY" > "$T/keys"
chmod 600 "$T/keys"
HTTP_KEYS=("http.api_keys_file=$T/keys" "model.chat_template=chatml"
	   "model.chat_template_unsafe=true")
next_port; H_L=$PORT
next_port; C_L=$PORT
write_node l standalone "$M" "listen.http=127.0.0.1:$H_L" "listen.client=127.0.0.1:$C_L" \
	"${HTTP_KEYS[@]}"
next_port; H_D=$PORT
pair pi di "$M" -- "listen.http=127.0.0.1:$H_D" "${HTTP_KEYS[@]}"
start_node l
start_node pi
start_node di
check "standalone up" wait_log "$T/l.log" "event=serve_ready"
check "pair up" wait_up di

# post PORT PATH BODY: status on stdout, body in $T/body
post() {
	curl -s -o "$T/body" -w '%{http_code}' -H "Authorization: Bearer $KEY" \
		-d "$3" "http://127.0.0.1:$1/v1/$2" || true
}
# sse PORT PATH BODY: the stream's data lines as a JSON array in $T/body
sse() {
	{ curl -s -N -H "Authorization: Bearer $KEY" -d "$3" "http://127.0.0.1:$1/v1/$2" |
		sed -n -e '/^data: \[DONE\]$/d' -e 's/^data: //p' | jq -s . > "$T/body"; } || true
}
# jqe FILTER... : jq -e, quietly (a check's condition)
jqe() { jq -e "$@" >/dev/null; }
P='"prompt":"Once upon a time"'
CHAT='"messages":[{"role":"user","content":"Once upon a time"}]'

# ---- logit_bias -------------------------------------------------------------------
ref=$(offline --model "$M" --prompt "Once upon a time" --max-tokens 12 --temperature 0)
first=$(jq -r '.output_ids[0]' <<<"$ref")
forced=$(jq -r '.output_ids[2]' <<<"$ref")
st=$(post $H_L completions "{$P,\"max_tokens\":12,\"temperature\":0,\"logprobs\":0}")
check "greedy completion 200 and equal to kvd generate" \
	test "$st $(jq -r '.choices[0].text' "$T/body")" = "200 $(jq -r .text <<<"$ref")"
tok0=$(jq -r '.choices[0].logprobs.tokens[0]' "$T/body")
st=$(post $H_L completions "{$P,\"max_tokens\":12,\"temperature\":0,\"logit_bias\":{\"$first\":-100},\"logprobs\":0}")
check "logit_bias -100 on the greedy first token ($first): 200, another output" \
	test "$st" = 200 -a "$(jq -r '.choices[0].text' "$T/body")" != "$(jq -r .text <<<"$ref")"
check "  ... and another first token" \
	test "$(jq -r '.choices[0].logprobs.tokens[0]' "$T/body")" != "$tok0"
st=$(post $H_L completions "{$P,\"max_tokens\":6,\"temperature\":0.9,\"seed\":3,\"logit_bias\":{\"$forced\":100},\"logprobs\":1}")
check "logit_bias +100 on token $forced: every token is it" \
	test "$st $(jq -c '[.choices[0].logprobs.tokens[]] | unique | length' "$T/body") $(jq -r '.usage.completion_tokens' "$T/body")" = "200 1 6"
check "  ... with logprob ~ 0" \
	jqe '[.choices[0].logprobs.token_logprobs[] | select(. < -0.001)] | length == 0' "$T/body"

# ---- logprobs held: a non-streamed answer holds at most 16384 tokens' ----------------
st=$(post $H_L completions "{$P,\"max_tokens\":16385,\"logprobs\":0}")
check "logprobs, not streamed, max_tokens 16385: 400 naming max_tokens ($st)" \
	test "$st $(jq -r .error.param "$T/body")" = "400 max_tokens"
check "  ... saying why" grep -q "holds at most 16384 tokens" "$T/body"
st=$(post $H_L chat/completions "{$CHAT,\"max_completion_tokens\":20000,\"logprobs\":true}")
check "  ... chat too ($st)" test "$st $(jq -r .error.param "$T/body")" = "400 max_tokens"
st=$(post $H_L completions "{$P,\"max_tokens\":16385,\"logprobs\":0,\"stream\":true}")
check "  ... streamed, that bound does not apply (the context's does: $st)" \
	bash -c "! grep -q 'holds at most' '$T/body'"
st=$(post $H_L completions "{$P,\"max_tokens\":16384,\"logprobs\":0}")
check "  ... 16384 passes that bound (the context's answers: $st)" \
	bash -c "! grep -q 'holds at most' '$T/body'"
st=$(post $H_L completions "{$P,\"max_tokens\":8193,\"n\":2,\"logprobs\":0}")
check "  ... over all choices: n 2 x max_tokens 8193 is a 400 naming max_tokens ($st)" \
	bash -c "test '$st' = 400 && grep -q 'holds at most 16384 tokens over its choices' '$T/body'"

# ---- logprobs shapes --------------------------------------------------------------
st=$(post $H_L completions "{$P,\"max_tokens\":16,\"temperature\":0,\"logprobs\":3}")
cp "$T/body" "$T/cmpl"
check "completions logprobs 3: 200, four arrays as long as completion_tokens" \
	jqe '.choices[0].logprobs as $l | .usage.completion_tokens as $n |
		($l.tokens|length) == $n and ($l.token_logprobs|length) == $n and
		($l.top_logprobs|length) == $n and ($l.text_offset|length) == $n and $n == 16' "$T/cmpl"
check "  ... top_logprobs hold 3 each, the chosen >= each (greedy), offsets rise from 0" \
	jqe '.choices[0].logprobs as $l |
		([$l.top_logprobs[] | length] | all(. == 3)) and
		([range(0; $l.tokens|length) as $i |
		  ($l.token_logprobs[$i] + 1e-6) >= ([$l.top_logprobs[$i][]] | max)] | all) and
		$l.text_offset[0] == 0 and ($l.text_offset | . == sort) and
		([$l.token_logprobs[] | . <= 0] | all)' "$T/cmpl"
sse $H_L completions "{$P,\"max_tokens\":16,\"temperature\":0,\"logprobs\":3,\"stream\":true}"
check "completions stream: the chunks' logprobs join to the plain answer's" \
	test "$(jq -c '[.[] | .choices[0].logprobs | select(. != null) | .tokens[]]' "$T/body") $(jq -c '[.[] | .choices[0].logprobs | select(. != null) | .token_logprobs[]]' "$T/body")" = \
	     "$(jq -c '.choices[0].logprobs.tokens' "$T/cmpl") $(jq -c '.choices[0].logprobs.token_logprobs' "$T/cmpl")"
check "  ... in more than one chunk, each chunk's text its tokens' text" \
	jqe '[.[] | .choices[0] | select(.logprobs != null) |
		{t: .text, j: (.logprobs.tokens | join(""))}] |
		(.[0].j |= ltrimstr(" ")) | length > 2 and all(.t == .j)' "$T/body"

st=$(post $H_L chat/completions "{$CHAT,\"max_tokens\":12,\"temperature\":0,\"logprobs\":true,\"top_logprobs\":5}")
cp "$T/body" "$T/chat"
check "chat logprobs true, top_logprobs 5: 200, content as long as completion_tokens" \
	jqe '(.choices[0].logprobs.content | length) == .usage.completion_tokens and .usage.completion_tokens > 0' "$T/chat"
check "  ... {token, logprob, bytes, top_logprobs[5]}, the chosen first (greedy)" \
	jqe '[.choices[0].logprobs.content[] |
		(.token|type) == "string" and (.bytes|type) == "array" and
		(.top_logprobs|length) == 5 and .top_logprobs[0].token == .token and
		.logprob + 1e-6 >= ([.top_logprobs[].logprob]|max) and
		([.top_logprobs[] | (.bytes|type) == "array"] | all)] | all' "$T/chat"
sse $H_L chat/completions "{$CHAT,\"max_tokens\":12,\"temperature\":0,\"logprobs\":true,\"top_logprobs\":5,\"stream\":true}"
check "chat stream: the chunks' content joins to the plain answer's" \
	test "$(jq -c '[.[] | .choices[0].logprobs | select(. != null) | .content[]]' "$T/body")" = \
	     "$(jq -c '.choices[0].logprobs.content' "$T/chat")"
st=$(post $H_L chat/completions "{$CHAT,\"max_tokens\":4,\"temperature\":0}")
check "without logprobs: logprobs null" test "$st $(jq -c '.choices[0].logprobs' "$T/body")" = "200 null"
st=$(post $H_L completions "{$P,\"max_tokens\":24,\"temperature\":0,\"logprobs\":0,\"stop\":[\" the\"]}")
check "a stop string: logprobs cover no token past it" \
	jqe '.choices[0] | .finish_reason == "stop" and (.text | length) > 0 and
		(.text | length) as $n | (.logprobs.text_offset | all(. < $n))' "$T/body"
sse $H_L completions "{$P,\"max_tokens\":24,\"temperature\":0,\"logprobs\":0,\"stop\":[\" the\"],\"stream\":true}"
check "  ... streamed too" \
	jqe '([.[] | .choices[0].text] | join("")) as $t | ($t | length) > 0 and
		([.[] | .choices[0].logprobs | select(. != null) | .text_offset[]] | all(. < ($t | length)))' "$T/body"

# ---- penalties -----------------------------------------------------------------------
repeats() { jq '.choices[0].logprobs.tokens | length - (unique | length)' "$T/body"; }
post $H_L completions "{$P,\"max_tokens\":100,\"temperature\":0,\"logprobs\":0,\"frequency_penalty\":0}" >/dev/null
r0=$(repeats)
post $H_L completions "{$P,\"max_tokens\":100,\"temperature\":0,\"logprobs\":0,\"frequency_penalty\":2}" >/dev/null
r2=$(repeats)
check "frequency_penalty 2 repeats fewer tokens than 0 ($r2 < $r0)" test "$r2" -lt "$r0"
post $H_L completions "{$P,\"max_tokens\":100,\"temperature\":0,\"logprobs\":0,\"repetition_penalty\":1.5,\"presence_penalty\":1}" >/dev/null
r3=$(repeats)
check "repetition_penalty 1.5 + presence_penalty 1 repeat fewer too ($r3 < $r0)" test "$r3" -lt "$r0"
st=$(post $H_L completions "{$P,\"max_tokens\":20,\"temperature\":1.0,\"seed\":5,\"min_p\":1}")
check "min_p 1 at temperature 1 is greedy" \
	test "$st $(jq -r '.choices[0].text' "$T/body")" = "200 $(offline --model "$M" --prompt "Once upon a time" --max-tokens 20 --temperature 0 | jq -r .text)"

# ---- the pair recomputes what prefill cannot sample -----------------------------------
MD=$(log_mark "$T/di.log")
EXT="\"temperature\":0.8,\"seed\":7,\"logprobs\":4,\"frequency_penalty\":0.7,\"repeat_penalty\":1.2,\"min_p\":0.05,\"logit_bias\":{\"$first\":-5}"
for body in "{$P,\"max_tokens\":24,$EXT}" "{$P,\"max_tokens\":24,$EXT,\"stream\":true}" \
	    "{$P,\"max_tokens\":1,$EXT}"; do
	if jq -e .stream <<<"$body" >/dev/null; then
		sse $H_L completions "$body"; cp "$T/body" "$T/want"
		sse $H_D completions "$body"
		f='[.[] | .choices[0] | .text, .logprobs]'
	else
		post $H_L completions "$body" >/dev/null; cp "$T/body" "$T/want"
		post $H_D completions "$body" >/dev/null
		f='.choices[0] | [.text, .logprobs, .finish_reason]'
	fi
	check "pair = standalone: $(jq -c '{max_tokens, stream}' <<<"$body")" \
		test "$(jq -c "$f" "$T/body")" = "$(jq -c "$f" "$T/want")"
	[ "$(jq -c "$f" "$T/body")" = "$(jq -c "$f" "$T/want")" ] ||
		echo "#   got  $(jq -c "$f" "$T/body" | head -c 300)"$'\n'"#   want $(jq -c "$f" "$T/want" | head -c 300)"
done
check "  ... decode recomputed the last prompt position" \
	test "$(log_count "$T/di.log" "event=decode_recompute " "$MD")" = 3
# prompts whose last position starts a page (17, 33 with 16-token pages),
# ends one (16) or is the only one (1): the retag covers each case
for n in 1 16 17 33; do
	ids=$(jq -nc --argjson n $n '[1] + [range(1; $n) | (. * 37) % 500 + 3]')
	body="{\"prompt\":$ids,\"max_tokens\":6,\"temperature\":0,\"logprobs\":2,\"presence_penalty\":1}"
	post $H_L completions "$body" >/dev/null; cp "$T/body" "$T/want"
	st=$(post $H_D completions "$body")
	check "pair = standalone for a $n-token prompt" \
		test "$st $(jq -c '.choices[0].logprobs' "$T/body")" = "200 $(jq -c '.choices[0].logprobs' "$T/want")"
done
st=$(post $H_D chat/completions "{$CHAT,\"max_tokens\":8,\"temperature\":0,\"logprobs\":true,\"top_logprobs\":2}")
cp "$T/body" "$T/pchat"
post $H_L chat/completions "{$CHAT,\"max_tokens\":8,\"temperature\":0,\"logprobs\":true,\"top_logprobs\":2}" >/dev/null
check "pair chat logprobs = standalone's" \
	test "$st $(jq -c '.choices[0].logprobs' "$T/pchat")" = "200 $(jq -c '.choices[0].logprobs' "$T/body")"
MD=$(log_mark "$T/di.log")
st=$(post $H_D completions "{$P,\"max_tokens\":8,\"temperature\":0}")
check "a plain request on the pair: 200, no recompute" \
	test "$st $(log_count "$T/di.log" "event=decode_recompute " "$MD")" = "200 0"

# ---- the msgpack client API: the penalties and min_p (kvctl generate) ----------------
PEN=(--frequency-penalty 2 --repetition-penalty 1.3 --presence-penalty 0.5 --min-p 0.1)
post $H_L completions "{$P,\"max_tokens\":40,\"temperature\":0.7,\"seed\":11,\"frequency_penalty\":2,\"repetition_penalty\":1.3,\"presence_penalty\":0.5,\"min_p\":0.1}" >/dev/null
want=$(jq -r '.choices[0].text' "$T/body")
out=$(KVD_API_KEY=$KEY gen "$C_L" --prompt "Once upon a time" --max-tokens 40 --temperature 0.7 --seed 11 "${PEN[@]}" || true)
check "kvctl generate with the penalties and min_p = HTTP's text" test "$(jq -r .text <<<"$out")" = "$want"
plain=$(KVD_API_KEY=$KEY gen "$C_L" --prompt "Once upon a time" --max-tokens 40 --temperature 0.7 --seed 11 || true)
check "  ... and not the plain request's" test "$(jq -r .text <<<"$plain")" != "$want"
MD=$(log_mark "$T/di.log")
out=$(KVD_API_KEY=$KEY gen "$C_PORT" --prompt "Once upon a time" --max-tokens 40 --temperature 0.7 --seed 11 "${PEN[@]}" || true)
check "  ... on the pair too (recomputed)" \
	test "$(jq -r .text <<<"$out") $(log_count "$T/di.log" "event=decode_recompute " "$MD")" = "$want 1"
check "kvctl generate --min-p 2: usage error (exit 2)" \
	bash -c "'$KVCTL' generate --server 127.0.0.1:$C_L --prompt x --min-p 2 2>/dev/null; test \$? = 2"

# ---- the msgpack client API: logit_bias and logprobs (kvctl generate) -------------------
post $H_L completions "{$P,\"max_tokens\":8,\"temperature\":0.8,\"seed\":5,\"logit_bias\":{\"$first\":-100,\"$forced\":3},\"logprobs\":2}" >/dev/null
cp "$T/body" "$T/lb_http.json"
out=$(KVD_API_KEY=$KEY gen "$C_L" --prompt "Once upon a time" --max-tokens 8 --temperature 0.8 --seed 5 \
	--logit-bias "$first:-100,$forced:3" --logprobs 2 || true)
check "kvctl generate --logit-bias --logprobs 2: HTTP's text" \
	test "$(jq -r .text <<<"$out")" = "$(jq -r '.choices[0].text' "$T/lb_http.json")"
check "  ... HTTP's logprobs, token by token (to 1e-4)" \
	jqe --slurpfile h "$T/lb_http.json" '[.logprobs, $h[0].choices[0].logprobs.token_logprobs] | transpose |
		(length == 8) and all(.[0] - .[1] | fabs < 1e-4)' <<<"$out"
check "  ... two alternatives each" \
	jqe '[.top_logprobs[] | length == 2] | all' <<<"$out"
out=$(KVD_API_KEY=$KEY gen "$C_L" --prompt "Once upon a time" --max-tokens 6 --temperature 0.9 --seed 3 \
	--logit-bias "$forced:100" || true)
check "  ... logit_bias +100 on token $forced: every token is it" \
	jqe --argjson f "$forced" '(.output_ids | length) == 6 and all(.output_ids[]; . == $f)' <<<"$out"
check "  ... no logprobs unless asked" jq -e 'has("logprobs") | not' <<<"$out"
out=$(KVD_API_KEY=$KEY gen "$C_L" --prompt "Once upon a time" --max-tokens 2 --logit-bias "999999:1" || true)
check "  ... a token outside the vocabulary: INVALID_REQUEST naming logit_bias" \
	jqe '.error == "INVALID_REQUEST" and (.message | contains("logit_bias"))' <<<"$out"
check "kvctl generate --logprobs 21, --logit-bias 1:101: usage errors (exit 2)" \
	bash -c "'$KVCTL' generate --server 127.0.0.1:$C_L --prompt x --logprobs 21 2>/dev/null; a=\$?;
		'$KVCTL' generate --server 127.0.0.1:$C_L --prompt x --logit-bias 1:101 2>/dev/null; test \$a\$? = 22"

# ---- kvd generate (offline): the same options, the same answer ----------------------------
out=$(KVD_API_KEY=$KEY gen "$C_L" --prompt "Once upon a time" --max-tokens 8 --temperature 0.8 --seed 5 \
	--logit-bias "$first:-100,$forced:3" --logprobs 2 || true)
off=$(offline --model "$M" --prompt "Once upon a time" --max-tokens 8 --temperature 0.8 --seed 5 \
	--logit-bias "$first:-100,$forced:3" --logprobs 2 || true)
check "kvd generate --logit-bias --logprobs 2: kvctl generate's tokens" \
	test "$(jq -c .output_ids <<<"$off")" = "$(jq -c .output_ids <<<"$out")"
check "  ... kvctl generate's logprobs and alternatives, as printed" \
	test "$(jq -c '[.logprobs, .top_logprobs]' <<<"$off")" = "$(jq -c '[.logprobs, .top_logprobs]' <<<"$out")"
check "  ... HTTP's text" test "$(jq -r .text <<<"$off")" = "$(jq -r '.choices[0].text' "$T/lb_http.json")"
off=$(offline --model "$M" --prompt "Once upon a time" --max-tokens 40 --temperature 0.7 --seed 11 "${PEN[@]}" || true)
check "kvd generate with the penalties and min_p = HTTP's text" test "$(jq -r .text <<<"$off")" = "$want"
off=$(offline --model "$M" --prompt "Once upon a time" --max-tokens 6 --temperature 0.9 --seed 3 \
	--logit-bias "$forced:100" || true)
check "  ... logit_bias +100 on token $forced: every token is it, no logprobs unless asked" \
	jqe --argjson f "$forced" '(.output_ids | length) == 6 and all(.output_ids[]; . == $f) and (has("logprobs") | not)' <<<"$off"
rc=0
"$KVD" generate --model "$M" --prompt x --max-tokens 2 --logit-bias "999999:1" >"$T/out" 2>"$T/err" || rc=$?
check "  ... a token outside the vocabulary: exit 1, the node's message ($rc)" \
	bash -c "test $rc = 1 && grep -q \"names token 999999; the vocabulary has\" '$T/err' && test ! -s '$T/out'"

# ---- bad values -----------------------------------------------------------------------
bad() { # bad PATH PARAM BODY-FIELDS
	local st
	st=$(post $H_L "$1" "{$([ "$1" = completions ] && echo "$P" || echo "$CHAT"),$3}")
	check "$1 $(head -c 60 <<<"$3"): 400 naming $2" \
		test "$st $(jq -r .error.param "$T/body")" = "400 $2"
}
bad completions presence_penalty '"presence_penalty":2.5'
bad completions frequency_penalty '"frequency_penalty":"1"'
bad completions repetition_penalty '"repetition_penalty":0'
bad completions repeat_penalty '"repeat_penalty":10.5'
bad completions min_p '"min_p":1.5'
bad completions logit_bias '"logit_bias":{"abc":1}'
bad completions logit_bias '"logit_bias":{"5":101}'
bad completions logit_bias '"logit_bias":{"05":1}'
bad completions logit_bias '"logit_bias":{"99999":1}'
bad completions logit_bias "\"logit_bias\":$(jq -nc '[range(301)] | map({key: tostring, value: 1}) | from_entries')"
bad completions logprobs '"logprobs":6'
bad completions logprobs '"logprobs":true'
bad chat/completions logprobs '"logprobs":1'
bad chat/completions top_logprobs '"logprobs":true,"top_logprobs":21'
bad chat/completions top_logprobs '"top_logprobs":2'
finish
