#!/usr/bin/env bash
# n > 1 over HTTP (issue 24.1): n choices of one request, their prompt
# computed once.
#   - /v1/completions and /v1/chat/completions, streamed and not, n=4 and
#     n=3: choices[i].index 0..n-1, each with its finish_reason and its
#     logprobs; streamed, every chunk names its choice, one usage chunk
#     (choices []) and one [DONE] at the end; usage counts the prompt
#     once and sums the choices' completion tokens (each choice's count:
#     its logprobs entries);
#   - choice i of a request with seed s is the answer of a single
#     request with seed s + i (invariant 9), streamed or not;
#   - sharing: of an n=4 request on a 70-token prompt (pages of 16), the
#     prompt is computed once: choices 1..3 each read 64 tokens from
#     the tenant's prefix cache (kvctl cache status hit_tokens +192,
#     request_done cached_tokens=64 three times); with cache.enabled=off
#     the same request is computed 4 times (cached_tokens=0 four times)
#     and gives the same texts; on a prefill+decode pair the prefill
#     peer computes it once (its hit_tokens +128 for n=3); on a decode
#     node with two idle prefill peers every choice goes to choice 0's
#     peer (prefill_done 3 / 0; by load alone, 2 / 1) and its cache
#     serves choices 1 and 2 (hit_tokens +128, prefill_served
#     cached_tokens=64 twice);
#   - n=3 under a JSON schema (each choice its own run of the grammar):
#     each text follows it, choice i is the single request with seed
#     s + i; bob's n=3 under it refused whole and a client leaving such
#     a stream free everything (under ASan: every run and the grammar);
#   - bounds: n past http.max_n and best_of other than n are 400s naming
#     them; bob (max_active=1, max_queued=1) asking n=3 is refused whole
#     (429 overloaded, no choice answered, nothing held after), n=2 is
#     served (the second choice waits its turn);
#   - kvctl abort of the public id of a streamed n=3 request ends every
#     choice (an error event, [DONE]); a client that leaves an n=3
#     stream frees every choice: the pool holds nothing after either;
#   - the nodes are stopped at the end, so an ASan build's leak check
#     runs (serve_finish: no sanitizer report in any log).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/serve_lib.sh"
command -v curl >/dev/null || skip "curl absent"
command -v jq >/dev/null || skip "jq absent"

# a model whose 1000 tokens take a while (the abort), chatml (served
# unsafe: its vocabulary has no <|im_start|>)
"$KVCTL" model make "$T/m.gguf" --layers 4 --dim 256 --heads 4 --kv-heads 2 \
	--ff 512 --vocab 600 --ctx 4096 --seed 5 --chat-template chatml >/dev/null
M=$T/m.gguf
KEY=alice-0123456789abcdef0123456789abcdef
KEY_B=bob-0123456789abcdef0123456789abcdef00
printf '%s alice\n%s bob max_active=1 max_queued=1\n' "$KEY" "$KEY_B" > "$T/keys"
chmod 600 "$T/keys"
COMMON=("http.api_keys_file=$T/keys" "model.chat_template_unsafe=true" "kv.pool_tokens=16384"
	"http.max_n=6")
next_port; H=$PORT
write_node s standalone "$M" "listen.http=127.0.0.1:$H" "${COMMON[@]}"
next_port; H_OFF=$PORT
write_node off standalone "$M" "listen.http=127.0.0.1:$H_OFF" "${COMMON[@]}" "cache.enabled=off"
next_port; H_D=$PORT
pair p d "$M" "kv.pool_tokens=16384" -- "listen.http=127.0.0.1:$H_D" "${COMMON[@]}"
# a decode node with two prefill peers
next_port; PA=$PORT
next_port; PB=$PORT
next_port; H_2=$PORT
write_node pa prefill "$M" "listen.peer=127.0.0.1:$PA" "kv.pool_tokens=16384"
write_node pb prefill "$M" "listen.peer=127.0.0.1:$PB" "kv.pool_tokens=16384"
write_node d2 decode "$M" "peers.prefill=127.0.0.1:$PA,127.0.0.1:$PB" \
	"listen.http=127.0.0.1:$H_2" "${COMMON[@]}"
start_node s
start_node off
start_node p
start_node d
start_node pa
start_node pb
start_node d2
check "standalone up" wait_log "$T/s.log" "event=serve_ready"
check "cache-off node up" wait_log "$T/off.log" "event=serve_ready"
check "pair up" wait_up d
two_up() { test "$(grep -c 'event=peer_capacity' "$T/d2.log")" -ge 2; }
check "decode with two prefill peers up" wait_for 40 two_up

# post PORT PATH BODY [KEY]: status on stdout, body in $T/body
post() {
	curl -s -m 60 -o "$T/body" -w '%{http_code}' -H "Authorization: Bearer ${4:-$KEY}" \
		-d "$3" "http://127.0.0.1:$1/v1/$2" || true
}
# sse PORT PATH BODY: the raw stream in $T/raw, its data objects as a JSON
# array in $T/body
sse() {
	curl -s -m 60 -N -H "Authorization: Bearer $KEY" -d "$3" \
		"http://127.0.0.1:$1/v1/$2" > "$T/raw" || true
	sed -n -e '/^data: \[DONE\]$/d' -e 's/^data: //p' "$T/raw" | jq -s . > "$T/body"
}
jqe() { jq -e "$@" >/dev/null; }
# hits NODE: alice's prompt tokens read from the prefix cache so far
hits() {
	"$KVCTL" --socket "$T/$1.sock" --json cache status 2>/dev/null |
		jq -r '[.tenants[] | select(.tenant == "alice") | .hit_tokens] | add // 0'
}
IDS=$(python3 -c 'print(",".join(str(3 + (i * 37) % 500) for i in range(70)))')
CMPL="\"prompt\":[$IDS],\"max_tokens\":10,\"temperature\":0.9,\"logit_bias\":{\"2\":-100}"
CHAT='"messages":[{"role":"user","content":"Tell me a story about a cat"}],"max_tokens":10,"temperature":0.9,"logit_bias":{"2":-100}'

# ---- completions, not streamed: shapes, usage, seeds, sharing -------------------------
h0=$(hits s); mark=$(log_mark "$T/s.log")
st=$(post $H completions "{$CMPL,\"n\":4,\"seed\":42,\"logprobs\":1,\"cache_salt\":\"n4\"}")
cp "$T/body" "$T/n4.json"
h1=$(hits s)
n64=$(log_since "$T/s.log" "$mark" | grep 'event=request_done' | grep -c 'cached_tokens=64 ' || true)
check "n=4 completions: 200 ($st)" test "$st" = 200
check "  ... 4 choices, index 0..3, each with a finish_reason and logprobs" \
	jqe '[.choices[].index] == [0,1,2,3] and all(.choices[]; (.finish_reason | type) == "string" and (.logprobs.tokens | length) > 0)' "$T/n4.json"
check "  ... usage: the prompt once, completion tokens summed over choices" \
	jqe '.usage.prompt_tokens == 70 and .usage.completion_tokens == ([.choices[].logprobs.tokens | length] | add) and .usage.total_tokens == .usage.prompt_tokens + .usage.completion_tokens and .seed == 42' "$T/n4.json"
check "  ... the choices differ (four seeds)" jqe '[.choices[].text] | unique | length > 1' "$T/n4.json"
for i in 0 1 2 3; do
	post $H completions "{$CMPL,\"seed\":$((42 + i)),\"cache_salt\":\"single\"}" >/dev/null
	check "  ... choice $i is the single request with seed $((42 + i))" \
		test "$(jq -c .choices[0].text "$T/body")" = "$(jq -c ".choices[$i].text" "$T/n4.json")"
done
echo "# sharing: alice's hit_tokens $h0 -> $h1 over the n=4 request (70-token prompt, pages of 16)"
check "sharing: choices 1..3 read 3 x 64 prompt tokens from the cache" test $((h1 - h0)) = 192
check "  ... request_done: choice 0 computed it, three mapped its 4 pages" \
	test "$n64" = 3
check "  ... usage.cached_tokens: the fewest (the one computation's: 0)" \
	jqe '.usage.prompt_tokens_details.cached_tokens == 0' "$T/n4.json"

# cache off: computed four times, the same texts
mark=$(log_mark "$T/off.log")
st=$(post $H_OFF completions "{$CMPL,\"n\":4,\"seed\":42,\"logprobs\":1}")
check "cache off: n=4 is 200 ($st), the prompt computed by each choice" \
	test "$st/$(log_since "$T/off.log" "$mark" | grep 'event=request_done' | grep -c 'cached_tokens=0 ')" = 200/4
check "  ... with the same choices" test "$(jq -c '[.choices[].text]' "$T/body")" = "$(jq -c '[.choices[].text]' "$T/n4.json")"

# ---- completions, streamed ---------------------------------------------------------------
sse $H completions "{$CMPL,\"n\":4,\"seed\":42,\"logprobs\":1,\"stream\":true}"
check "streamed n=4: every chunk names a choice 0..3, each one finish_reason" \
	jqe '[.[] | .choices[] | select(.finish_reason != null) | .index] | sort == [0,1,2,3]' "$T/body"
check "  ... the texts are the unstreamed ones, by index" \
	test "$(jq -c '[range(4) as $i | [.[] | .choices[] | select(.index == $i) | .text] | add]' "$T/body")" = \
	     "$(jq -c '[.choices[].text]' "$T/n4.json")"
check "  ... one usage chunk at the end (choices []), tokens summed" \
	jqe '(map(select(.usage != null)) | length) == 1 and (last | .choices == [] and .usage.prompt_tokens == 70 and .usage.completion_tokens == 40)' "$T/body"
check "  ... one [DONE], last" \
	bash -c "test \$(grep -c '^data: \[DONE\]' '$T/raw') = 1 && grep '^data: ' '$T/raw' | tail -1 | grep -q DONE"

# ---- chat, streamed and not -------------------------------------------------------------
st=$(post $H chat/completions "{$CHAT,\"n\":3,\"seed\":7,\"logprobs\":true}")
cp "$T/body" "$T/c3.json"
check "n=3 chat: 200 ($st), 3 messages, index 0..2, logprobs each" \
	jqe '[.choices[].index] == [0,1,2] and all(.choices[]; .message.role == "assistant" and (.finish_reason | type) == "string" and (.logprobs.content | length) > 0)' "$T/c3.json"
check "  ... usage sums the choices' tokens" \
	jqe '.usage.completion_tokens == ([.choices[].logprobs.content | length] | add)' "$T/c3.json"
post $H chat/completions "{$CHAT,\"seed\":9}" >/dev/null
check "  ... choice 2 is the single request with seed 9" \
	test "$(jq -c .choices[0].message.content "$T/body")" = "$(jq -c .choices[2].message.content "$T/c3.json")"
sse $H chat/completions "{$CHAT,\"n\":3,\"seed\":7,\"stream\":true}"
check "streamed chat n=3: each choice's first delta has the role, one finish each" \
	jqe '([range(3) as $i | [.[] | .choices[] | select(.index == $i)][0].delta.role] == ["assistant","assistant","assistant"]) and ([.[] | .choices[] | select(.finish_reason != null) | .index] | sort == [0,1,2])' "$T/body"
check "  ... the same contents as unstreamed" \
	test "$(jq -c '[range(3) as $i | [.[] | .choices[] | select(.index == $i) | .delta.content // empty] | add]' "$T/body")" = \
	     "$(jq -c '[.choices[].message.content]' "$T/c3.json")"
check "  ... usage at the end, [DONE] once" \
	bash -c "jq -e 'last | .choices == [] and .usage.completion_tokens == 30' '$T/body' >/dev/null && test \$(grep -c '^data: \[DONE\]' '$T/raw') = 1"

# ---- bounds ----------------------------------------------------------------------------------
st=$(post $H completions "{$CMPL,\"n\":7}")
check "n=7 past http.max_n=6: 400 naming n ($st)" \
	bash -c "test $st = 400 && jq -e '.error.param == \"n\"' '$T/body' >/dev/null"
st=$(post $H completions "{$CMPL,\"n\":2,\"best_of\":3}")
check "best_of 3 with n 2: 400 naming best_of ($st)" \
	bash -c "test $st = 400 && jq -e '.error.param == \"best_of\"' '$T/body' >/dev/null"

# ---- n > 1 under a grammar: each choice its own run of it ---------------------------------------
echo '{"type":"object","properties":{"s":{"type":"string"}},"required":["s"],"additionalProperties":false}' > "$T/s.json"
JS="\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"t\",\"schema\":$(cat "$T/s.json")}}"
st=$(post $H completions "{$CMPL,\"n\":3,\"seed\":5,$JS}")
cp "$T/body" "$T/j3.json"
for i in 0 1 2; do jq -c ".choices[$i] | {text, finish: .finish_reason}" "$T/j3.json" > "$T/j3_$i.json"; done
python3 "$KVD_SRC/tests/integration/json_check.py" "$T/s.json" "$T"/j3_{0,1,2}.json > "$T/j3.check" 2>&1 || true
check "n=3 with a JSON schema: 200 ($st), 3 choices, each stops matching it or is its prefix ($(tail -1 "$T/j3.check"))" \
	bash -c "test $st = 200 && jq -e '[.choices[].index] == [0,1,2]' '$T/j3.json' >/dev/null && grep -q ' bad=0$' '$T/j3.check'"
for i in 0 1 2; do
	post $H completions "{$CMPL,\"seed\":$((5 + i)),$JS}" >/dev/null
	check "  ... choice $i is the single request with seed $((5 + i))" \
		test "$(jq -c .choices[0].text "$T/body")" = "$(jq -c ".choices[$i].text" "$T/j3.json")"
done
mark=$(log_mark "$T/s.log")
st=$(post $H completions "{$CMPL,\"n\":3,$JS}" "$KEY_B")
check "bob asking n=3 under a grammar: refused whole, 429 ($st)" \
	bash -c "test $st = 429 && jq -e '.error.code == \"overloaded\"' '$T/body' >/dev/null"
check "  ... nothing held after" settle s
# at least 1000 booleans: every choice runs to its max_tokens
JL='"response_format":{"type":"json_schema","json_schema":{"name":"t","schema":{"type":"array","items":{"type":"boolean"},"minItems":1000}}}'
mark=$(log_mark "$T/s.log")
curl -s -m 2 -N -H "Authorization: Bearer $KEY" -d "{\"prompt\":[$IDS],\"max_tokens\":3000,\"temperature\":0.9,\"n\":3,\"stream\":true,$JL}" \
	"http://127.0.0.1:$H/v1/completions" > "$T/jl.sse" || true
check "a client leaving an n=3 stream under a grammar: every choice ends" settle s
check "  ... the three were running (client_gone x $(log_since "$T/s.log" "$mark" | grep -c "event=client_gone id="))" \
	test "$(log_since "$T/s.log" "$mark" | grep -c 'event=client_gone id=')" = 3
mark=$(log_mark "$T/s.log")
st=$(post $H completions "{$CMPL,\"n\":3}" "$KEY_B")
check "bob (max_active 1, max_queued 1) asking n=3: refused whole, 429 ($st)" \
	bash -c "test $st = 429 && jq -e '.error.code == \"overloaded\" and (.choices == null)' '$T/body' >/dev/null"
check "  ... its queue bound named in the log" log_has "$T/s.log" 'event=admission_reject .*tenant=bob reason=tenant_queue_full' "$mark"
check "  ... nothing held after" settle s
st=$(post $H completions "{$CMPL,\"n\":2}" "$KEY_B")
check "bob's n=2: 200 with 2 choices ($st)" \
	bash -c "test $st = 200 && jq -e '[.choices[].index] == [0,1]' '$T/body' >/dev/null"

# ---- abort and disconnect free every choice ----------------------------------------------------
LONG="\"prompt\":[$IDS],\"max_tokens\":3000,\"temperature\":0.9,\"logit_bias\":{\"2\":-100},\"n\":3,\"stream\":true"
curl -s -N -H "Authorization: Bearer $KEY" -d "{$LONG}" "http://127.0.0.1:$H/v1/completions" > "$T/long.sse" &
lpid=$!; PIDS+=($lpid)
three() { test "$(grep '^data: {' "$T/long.sse" | sed 's/^data: //' | jq -s '[.[].choices[0].index] | unique | length' 2>/dev/null)" = 3; }
check "a long n=3 stream: every choice streams" wait_for 30 three
sid=$(grep -m1 '^data: {' "$T/long.sse" | sed 's/^data: //' | jq -r .id)
rc=0; "$KVCTL" --socket "$T/s.sock" abort "$sid" >/dev/null 2>&1 || rc=$?
check "kvctl abort $sid: 0 ($rc)" test "$rc" = 0
check "  ... the stream ends" wait_for 20 bash -c "! kill -0 $lpid 2>/dev/null"
check "  ... with an error event and [DONE], not 3 x 3000 tokens" \
	bash -c "grep -q '\"error\"' '$T/long.sse' && tail -1 '$T/long.sse' | grep -q '\\[DONE\\]\\|^$' && test \$(grep -c '^data: {' '$T/long.sse') -lt 9000"
check "  ... every choice's pages back (pool holds nothing)" settle s
mark=$(log_mark "$T/s.log")
curl -s -m 2 -N -H "Authorization: Bearer $KEY" -d "{$LONG}" "http://127.0.0.1:$H/v1/completions" > /dev/null || true
check "a client leaving an n=3 stream: every choice ends" settle s
check "  ... (its three requests orphaned: client_gone x $(log_since "$T/s.log" "$mark" | grep -c "event=client_gone id="))" \
	test "$(log_since "$T/s.log" "$mark" | grep -c 'event=client_gone id=')" = 3
free_all() { # NODE: every page free or the cache's (none lost, none quarantined)
	local st; st=$("$KVCTL" --socket "$T/$1.sock" --json status)
	jq -e '.pool | .free + .cached == .pages and .quarantined == 0' <<<"$st" >/dev/null
}
check "  ... kvctl status: pool free + cached = its pages" free_all s

# ---- a prefill+decode pair: the prefill peer computes the prompt once ------------------------
h0=$(hits p)
st=$(post $H_D completions "{$CMPL,\"n\":3,\"seed\":42,\"cache_salt\":\"pair\"}")
h1=$(hits p)
echo "# pair: prefill's hit_tokens for alice $h0 -> $h1 over an n=3 request"
check "pair n=3: 200 ($st), the standalone node's first three choices" \
	test "$st $(jq -c '[.choices[].text]' "$T/body")" = "200 $(jq -c '[.choices[:3][].text]' "$T/n4.json")"
check "  ... prefill read 2 x 64 prompt tokens from its cache" test $((h1 - h0)) = 128
check "  ... nothing held after" settle p d
check "  ... kvctl status on both: every page free or cached" eval "free_all p && free_all d"

# ---- two prefill peers: the later choices go where choice 0 went -------------------------------
# (both idle: by load alone choice 1 would go to the other peer, which
# would compute the whole prompt again)
ha0=$(hits pa); hb0=$(hits pb)
ma=$(log_mark "$T/pa.log"); mb=$(log_mark "$T/pb.log")
st=$(post $H_2 completions "{$CMPL,\"n\":3,\"seed\":42,\"cache_salt\":\"two\"}")
settle pa pb d2 || true         # (the hit counts are published after)
ha1=$(hits pa); hb1=$(hits pb)
na=$(log_since "$T/pa.log" "$ma" | grep -c 'event=prefill_done ' || true)
nb=$(log_since "$T/pb.log" "$mb" | grep -c 'event=prefill_done ' || true)
n64=$(log_since "$T/pa.log" "$ma"; log_since "$T/pb.log" "$mb")
n64=$(grep 'event=prefill_served' <<<"$n64" | grep -c 'cached_tokens=64 ' || true)
echo "# two prefills: hit_tokens pa $ha0 -> $ha1, pb $hb0 -> $hb1; prefill_done pa $na, pb $nb"
check "two prefills, n=3: 200 ($st), the standalone node's first three choices" \
	test "$st $(jq -c '[.choices[].text]' "$T/body")" = "200 $(jq -c '[.choices[:3][].text]' "$T/n4.json")"
check "  ... one prefill computed all three (prefill_done $na / $nb)" \
	bash -c "[ '$na/$nb' = 3/0 ] || [ '$na/$nb' = 0/3 ]"
check "  ... and read 2 x 64 prompt tokens from its cache for choices 1 and 2 (prefill_served cached_tokens=64 x $n64)" \
	test "$((ha1 - ha0 + hb1 - hb0))/$n64" = 128/2
check "  ... nothing held after" settle pa pb d2
# stopped, not killed: an ASan build's leak check runs at their exit
# (every choice's grammar run and reference freed)
for n in d2 pa pb d p off s; do stop_node $n; done
serve_finish
