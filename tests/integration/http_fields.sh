#!/usr/bin/env bash
# The request fields OpenAI clients send by default (issue 24.1), on a
# standalone node's HTTP front whose pool holds exactly one context
# (kv.pool_tokens=128, clamp):
#   - fields that cannot change the output (user, metadata, store,
#     service_tier, parallel_tool_calls, prompt_cache_key, ...) are
#     accepted, each with a debug line and kvd_http_ignored_fields_total
#     {field=...}; a wrong type is a 400 naming it, and a field that would
#     change the output (best_of: 2 without n: 2) stays a 400 naming it;
#   - no max_tokens: the rest of the context (prompt + completion = 128
#     unless EOS came first), on both endpoints; two such requests at once
#     both complete (the second waits for the pages, never refused); the
#     tenant's max_tokens and http.default_max_tokens bound the default;
#   - chat content as text parts equals the string joined with "\n";
#     an image_url part is a 400 naming it;
#   - without seed, two sampled requests draw different seeds (in the
#     answer and in a stream's first chunk) and sending one back repeats
#     its text; greedy answers are equal;
#   - a stop string across a token boundary ends the text before it;
#   - on a decode node with two prefill peers, one whose pool holds 128
#     tokens and one 4096, the default fits the smaller (decode picks a
#     peer by load, not size; kv.capacity_policy=clamp lowers decode's
#     context to the path's): every request without max_tokens is
#     answered within 128 tokens, none refused prompt_too_long.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/serve_lib.sh"
command -v curl >/dev/null || skip "curl absent"
command -v jq >/dev/null || skip "jq absent"

# stories260K when shared/ has it (real text: the stop string below needs
# tokens of several bytes), else the generated model
M=${KVD_SHARED:-}/models/stories260K.gguf
[ -f "$M" ] || { gen_model "$T/m.gguf"; M=$T/m.gguf; }
KEY=carol-0123456789abcdef0123456789abcdef
KEY_S=sam-0123456789abcdef0123456789abcdef00
ADM=admin-0123456789abcdef0123456789abcdef
printf '%s carol\n%s sam max_tokens=40\n%s ops admin\n' "$KEY" "$KEY_S" "$ADM" > "$T/keys"
chmod 600 "$T/keys"
next_port; H=$PORT
write_node f standalone "$M" "listen.http=127.0.0.1:$H" "http.api_keys_file=$T/keys" \
	"kv.pool_tokens=128" "kv.capacity_policy=clamp" \
	"model.chat_template=chatml" "model.chat_template_unsafe=true"
start_node f
check "node up" wait_log "$T/f.log" "event=serve_ready"
U=http://127.0.0.1:$H/v1

# post PATH BODY [KEY]: status on stdout, body in $T/body
post() {
	curl -s -o "$T/body" -w '%{http_code}' -H "Authorization: Bearer ${3:-$KEY}" \
		-d "$2" "$U/$1" || true
}
CHAT='"messages":[{"role":"user","content":"Once upon a time"}]'

# ---- ignored fields --------------------------------------------------------------
MK=$(log_mark "$T/f.log")
st=$(post chat/completions "{$CHAT,\"max_tokens\":2,\"user\":\"u1\",\"metadata\":{\"k\":\"v\"},\"store\":false,\"service_tier\":\"auto\",\"parallel_tool_calls\":true,\"prompt_cache_key\":\"p\",\"safety_identifier\":\"s\"}")
check "chat with user, metadata, store, service_tier, parallel_tool_calls, prompt_cache_key, safety_identifier: 200 ($st)" test "$st" = 200
check "  ... a debug line per ignored field" \
	log_has "$T/f.log" 'event=http_ignored_field .*field="?metadata"?( |$)' "$MK"
check "  ... (seven of them)" \
	test "$(log_since "$T/f.log" "$MK" | grep -c 'event=http_ignored_field')" = 7
st=$(post completions '{"prompt":"Once","max_tokens":2,"user":"u2"}')
check "completion with user: 200 ($st)" test "$st" = 200
curl -s -H "Authorization: Bearer $ADM" "http://127.0.0.1:$H/metrics" > "$T/metrics"
check "kvd_http_ignored_fields_total counts by field" \
	grep -q '^kvd_http_ignored_fields_total{field="user"} 2$' "$T/metrics"
check "  ... metadata 1" grep -q '^kvd_http_ignored_fields_total{field="metadata"} 1$' "$T/metrics"
check "  ... only the known names as labels" \
	test "$(grep -c '^kvd_http_ignored_fields_total{' "$T/metrics")" = 8
st=$(post chat/completions "{$CHAT,\"store\":\"yes\"}")
check "store: \"yes\" is 400 naming store ($st)" \
	test "$st $(jq -r .error.param "$T/body")" = "400 store"
st=$(post completions '{"prompt":"Once","best_of":2}')
check "best_of: 2 without n: 2 (would change the output) stays 400 naming it ($st)" \
	test "$st $(jq -r .error.param "$T/body")" = "400 best_of"
st=$(post completions '{"prompt":"Once","metadata":{}}')
check "metadata on completions (not in its schema): 400 naming it ($st)" \
	test "$st $(jq -r .error.param "$T/body")" = "400 metadata"

# ---- default max_tokens: the rest of the context ------------------------------------
# fills N: prompt + completion reach the context, or EOS came first (stop)
fills() {
	jq -e --argjson n "$1" '(.usage.prompt_tokens + .usage.completion_tokens == $n) or
		(.choices[0].finish_reason == "stop" and .usage.completion_tokens > 16)' "$T/body" >/dev/null
}
st=$(post completions '{"prompt":"Once","temperature":0}')
check "completion without max_tokens: 200 ($st)" test "$st" = 200
check "  ... generates to the end of the context, not 16 tokens ($(jq -c .usage "$T/body"))" fills 128
st=$(post chat/completions "{$CHAT,\"temperature\":0}")
check "chat without max_tokens: 200 ($st)" test "$st" = 200
check "  ... generates to the end of the context, not 16 tokens ($(jq -c .usage "$T/body"))" fills 128
# two at once: each reserves the whole pool; the second waits, then runs
post completions '{"prompt":"abc","temperature":0}' > "$T/st1" &
P1=$!
st=$(curl -s -o "$T/body2" -w '%{http_code}' -H "Authorization: Bearer $KEY" \
	-d '{"prompt":"abc","temperature":0}' "$U/completions" || true)
wait $P1
check "two defaults at once on a one-context pool: both 200 ($(cat "$T/st1") $st)" \
	test "$(cat "$T/st1") $st" = "200 200"
st=$(post completions '{"prompt":"Once","temperature":0}' "$KEY_S")
check "the tenant's max_tokens (40) bounds the default: 200 ($st)" test "$st" = 200
check "  ... prompt + completion <= 40 ($(jq -c .usage "$T/body"))" \
	jq -e '.usage.completion_tokens > 0 and .usage.prompt_tokens + .usage.completion_tokens <= 40' "$T/body"
stop_node f

next_port; H=$PORT
U=http://127.0.0.1:$H/v1
write_node g standalone "$M" "listen.http=127.0.0.1:$H" "http.api_keys_file=$T/keys" \
	"kv.pool_tokens=128" "kv.capacity_policy=clamp" "http.default_max_tokens=20" \
	"model.chat_template=chatml" "model.chat_template_unsafe=true"
start_node g
check "node with http.default_max_tokens=20 up" wait_log "$T/g.log" "event=serve_ready"
st=$(post completions '{"prompt":"Once","temperature":0}')
check "http.default_max_tokens bounds the default: 200, at most 20 tokens ($(jq -c .usage "$T/body"))" \
	jq -e '.usage.completion_tokens <= 20 and .usage.completion_tokens > 16' "$T/body"
st=$(post completions '{"prompt":"Once","temperature":0,"max_tokens":30}')
check "  ... a request's own max_tokens is not bounded by it ($(jq -c .usage "$T/body"))" \
	jq -e '.usage.completion_tokens > 20 or .choices[0].finish_reason == "stop"' "$T/body"

# ---- chat content as text parts -------------------------------------------------------
st=$(post chat/completions '{"messages":[{"role":"user","content":"Once\nupon"}],"max_tokens":12,"temperature":0}')
want=$(jq -c '{t: .choices[0].message.content, p: .usage.prompt_tokens, c: .usage.completion_tokens}' "$T/body")
st=$(post chat/completions '{"messages":[{"role":"user","content":[{"type":"text","text":"Once"},{"type":"text","text":"upon"}]}],"max_tokens":12,"temperature":0}')
check "content as two text parts: 200 ($st)" test "$st" = 200
check "  ... the answer and usage of the string joined with \\n" \
	test "$(jq -c '{t: .choices[0].message.content, p: .usage.prompt_tokens, c: .usage.completion_tokens}' "$T/body")" = "$want"
st=$(post chat/completions '{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"http://x/y.png"}}]}]}')
check "an image_url part: 400 naming it ($st $(jq -r .error.param "$T/body"))" \
	test "$st $(jq -r .error.param "$T/body")" = "400 image_url"

# ---- seeds ---------------------------------------------------------------------------
SAMPLED='"prompt":"Once","max_tokens":24,"temperature":1.0'
post completions "{$SAMPLED}" >/dev/null; cp "$T/body" "$T/s1"
post completions "{$SAMPLED}" >/dev/null; cp "$T/body" "$T/s2"
s1=$(jq -r .seed "$T/s1"); s2=$(jq -r .seed "$T/s2")
check "without seed: a seed drawn per request, in the answer ($s1, $s2)" \
	jq -e --slurpfile b "$T/s2" '(.seed | type) == "number" and .seed != $b[0].seed' "$T/s1"
check "  ... so two identical sampled requests differ" \
	test "$(jq -r '.choices[0].text' "$T/s1")" != "$(jq -r '.choices[0].text' "$T/s2")"
post completions "{$SAMPLED,\"seed\":$s1}" >/dev/null
check "  ... sending the seed back repeats the text, and the answer names it" \
	test "$(jq -c '[.choices[0].text, .seed]' "$T/body")" = "$(jq -c '[.choices[0].text, .seed]' "$T/s1")"
curl -sN -H "Authorization: Bearer $KEY" -d "{$SAMPLED,\"seed\":$s1,\"stream\":true}" \
	"$U/completions" | sed -n 's/^data: //p' | grep -v '^\[DONE\]' > "$T/ev"
check "  ... a stream's first chunk carries the seed, the others not" \
	test "$(jq -sc '[.[0].seed, ([.[1:][] | select(has("seed"))] | length)]' "$T/ev")" = "[$s1,0]"
check "  ... and streams the same text" \
	test "$(jq -sj '.[].choices[0].text' "$T/ev")" = "$(jq -j '.choices[0].text' "$T/s1")"
GREEDY='"prompt":"Once","max_tokens":24,"temperature":0'
post completions "{$GREEDY}" >/dev/null; cp "$T/body" "$T/g1"
post completions "{$GREEDY}" >/dev/null
check "greedy without seed: the same text twice (seeds $(jq -r .seed "$T/g1") $(jq -r .seed "$T/body"))" \
	test "$(jq -r '.choices[0].text' "$T/body")" = "$(jq -r '.choices[0].text' "$T/g1")"

# ---- a stop string across a token boundary -----------------------------------------------
# the stream's chunks are its tokens' text: the stop string is the last
# two bytes of one chunk and the first two of the next
curl -sN -H "Authorization: Bearer $KEY" -d "{$GREEDY,\"stream\":true}" "$U/completions" |
	sed -n 's/^data: //p' | grep -v '^\[DONE\]' | jq -r '.choices[0].text | @json' > "$T/chunks"
IFS=$'\t' read -r stop want < <(python3 - "$T/chunks" <<'PY'
import json, sys
c = [json.loads(l) for l in open(sys.argv[1])]
full = "".join(c)
for k in range(2, len(c) - 1):
    if len(c[k]) >= 2 and len(c[k + 1]) >= 2:
        stop = c[k][-2:] + c[k + 1][:2]
        print(json.dumps(stop), json.dumps(full[:full.index(stop)]), sep="\t")
        break
PY
) || true
if [ -z "${stop:-}" ]; then
	echo "# no two chunks of two bytes or more (the generated model's bytes): stop across tokens not tested"
else for mode in false true; do
	curl -sN -H "Authorization: Bearer $KEY" -d "{$GREEDY,\"stop\":[$stop],\"stream\":$mode}" \
		"$U/completions" > "$T/st"
	if [ $mode = true ]; then
		got=$(sed -n 's/^data: //p' "$T/st" | grep -v '^\[DONE\]' | jq -sc '[([.[].choices[0].text] | add), .[-1].choices[0].finish_reason]')
	else
		got=$(jq -c '[.choices[0].text, .choices[0].finish_reason]' "$T/st")
	fi
	check "stop $stop across two tokens, stream=$mode: the text ends before it, finish stop" \
		test "$got" = "[$want,\"stop\"]"
done; fi
stop_node g

# ---- decode with two prefill peers of different sizes -------------------------------------
next_port; PA=$PORT; next_port; PB=$PORT; next_port; H=$PORT
U=http://127.0.0.1:$H/v1
write_node pa prefill "$M" "listen.peer=127.0.0.1:$PA" "kv.pool_tokens=128" "kv.capacity_policy=clamp"
write_node pb prefill "$M" "listen.peer=127.0.0.1:$PB"
write_node dm decode "$M" "peers.prefill=127.0.0.1:$PA,127.0.0.1:$PB" "kv.capacity_policy=clamp" \
	"listen.http=127.0.0.1:$H" "http.api_keys_file=$T/keys"
start_node pa; start_node pb; start_node dm
two_up() { [ "$(log_count "$T/dm.log" "event=peer_up ")" -ge 2 ]; }
check "decode paired with both prefill peers" wait_for 30 two_up
pids=()
for i in 1 2 3 4 5 6; do
	curl -s -o "$T/d.$i" -H "Authorization: Bearer $KEY" -d '{"prompt":"Once","temperature":0}' "$U/completions" &
	pids+=($!)
	[ "$i" -gt 4 ] && wait "${pids[@]}"
done
wait "${pids[@]}" || true
ok=0
for i in 1 2 3 4 5 6; do
	jq -e '.usage.completion_tokens > 0 and .usage.prompt_tokens + .usage.completion_tokens <= 128' "$T/d.$i" >/dev/null 2>&1 &&
		ok=$((ok + 1)) || echo "# d.$i: $(head -c 300 "$T/d.$i")"
done
check "six requests without max_tokens: all answered within the smaller peer's 128 tokens ($ok)" test "$ok" = 6
echo "# served by the 128-token peer: $(status_get pa counters.admitted), by the other: $(status_get pb counters.admitted)"

finish
