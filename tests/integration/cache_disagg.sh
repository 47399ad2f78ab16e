#!/usr/bin/env bash
# The prefix cache in a prefill+decode pair (issue 21.1): the prefill node
# keeps the cache under the same key rule as a standalone node (tenant and
# cache_salt come with the prefill_request) and computes only the uncached
# suffix; the pages it sends are the whole prompt as before (decode checks
# coverage as always). Through decode's HTTP front with two tenants:
#   - alice's second request on a 70-token prompt reports cached_tokens 64
#     (4 full pages of 16) and the text of the first, which equals kvd
#     generate's offline answer;
#   - bob's same prompt, and alice's with another cache_salt, report 0
#     and the same text;
#   - prefill's log says what it reused (event=request_done on decode
#     carries cached_tokens=64 for alice only); no page leaks after.
# (That part runs with cache.decode_reuse off on decode, as every test
# pair does: the prefill node's cache alone.) Then decode's own reuse
# (cache.decode_reuse, on by default): the pages decode received for
# alice's first request stay in decode's cache when it ends, and her
# second request is computed on decode over them - prefill never sees it
# (its admitted count stays 1; before, every request of a pair went to
# prefill) - with the same text and cached_tokens 64; bob's same prompt
# and alice's other salt still go to prefill and reuse nothing.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/serve_lib.sh"

gen_model "$T/m.gguf"
M=$T/m.gguf
printf 'alice-0123456789abcdef0123456789abcdef alice\nbob-0123456789abcdefgh0123456789abcdef bob\n' > "$T/keys"
chmod 600 "$T/keys"
next_port; H_PORT=$PORT
pair p d "$M" -- "listen.http=127.0.0.1:$H_PORT" "http.api_keys_file=$T/keys"
start_node p
start_node d
check "decode paired" wait_up d

IDS=$(python3 -c 'print(",".join(str(3 + (i * 37) % 300) for i in range(70)))')
req() { # req KEY [SALT] -> "cached text"
	local salt=${2:+,\"cache_salt\":\"$2\"}
	curl -s -m 60 -H "Authorization: Bearer $1" -H 'Content-Type: application/json' \
		-d "{\"prompt\":[$IDS],\"max_tokens\":12,\"temperature\":0$salt}" \
		"http://127.0.0.1:$H_PORT/v1/completions" |
		python3 -c 'import json,sys; j=json.load(sys.stdin); print(j["usage"]["prompt_tokens_details"]["cached_tokens"], json.dumps(j["choices"][0]["text"]))'
}
A=alice-0123456789abcdef0123456789abcdef
B=bob-0123456789abcdefgh0123456789abcdef
r1=$(req $A); r2=$(req $A); r3=$(req $B); r4=$(req $A s1)
echo "# $r1 | $r2 | $r3 | $r4"
ref=$(offline --model "$M" --prompt-ids "$IDS" --max-tokens 12 |
	python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)["text"]))')
check "first request: cached_tokens 0, offline's text" test "$r1" = "0 $ref"
check "alice's second: 64 cached tokens, the same text" test "$r2" = "64 $ref"
check "bob's same prompt: nothing cached" test "$r3" = "0 $ref"
check "alice with another salt: nothing cached" test "$r4" = "0 $ref"
check "decode logged alice's reuse" log_has "$T/d.log" 'event=request_done .*tenant=alice .*cached_tokens=64 '
check "decode never logged a reuse for bob" \
	test "$(grep 'event=request_done' "$T/d.log" | grep 'tenant=bob' | grep -vc 'cached_tokens=0 ')" = 0
check "prefill holds cached pages" test "$(status_get p pool.cached)" -ge 4
check "prefill: nothing held by requests after" settle p d
check "kvctl cache status on prefill: alice 1 hit" \
	test "$("$KVCTL" --socket "$T/p.sock" --json cache status | python3 -c 'import json,sys; print({t["tenant"]: t["hits"] for t in json.load(sys.stdin)["tenants"]}.get("alice"))')" = 1
# a shrink must not wait for cached pages that nobody will release: the
# cache empties first (before: the resize timed out with them retiring)
rc=0
"$KVCTL" --socket "$T/p.sock" pool resize --tokens 2048 --wait-ms 5000 >/dev/null 2>&1 || rc=$?
check "prefill shrinks with cached pages (rc=$rc)" test "$rc" = 0
check "... and holds no cached page after" test "$(status_get p pool.cached)" = 0
check "alice's next request computes again, same text" test "$(req $A)" = "0 $ref"
stop_node d
stop_node p

# ---- decode's own cache (cache.decode_reuse = on, the default) ---------------------
next_port; H_PORT=$PORT
pair p2 d2 "$M" -- "listen.http=127.0.0.1:$H_PORT" "http.api_keys_file=$T/keys" "cache.decode_reuse=on"
start_node p2
start_node d2
check "second pair up (decode_reuse on)" wait_up d2
dcache() { # dcache NODE TENANT -> its cached pages on NODE
	"$KVCTL" --socket "$T/$1.sock" --json cache status |
		python3 -c 'import json,sys; print({t["tenant"]: t["pages"] for t in json.load(sys.stdin)["tenants"]}.get(sys.argv[1], 0))' "$2"
}
r1=$(req $A)
check "alice's first request: through prefill, offline's text" test "$r1" = "0 $ref"
has_alice() { [ "$(dcache d2 alice)" -ge 4 ]; }
check "decode keeps the 4 full pages it received for alice" wait_for 10 has_alice
r2=$(req $A)
check "alice's second: 64 cached tokens, the same text ($r2)" test "$r2" = "64 $ref"
check "  ... computed on decode: prefill admitted only the first" \
	test "$(status_get p2 counters.admitted)" = 1
check "  ... decode counted the hit for alice" \
	test "$("$KVCTL" --socket "$T/d2.sock" --json cache status | python3 -c 'import json,sys; print({t["tenant"]: t["hits"] for t in json.load(sys.stdin)["tenants"]}.get("alice"))')" = 1
r3=$(req $B); r4=$(req $A s1)
check "bob's same prompt: nothing cached, the same text" test "$r3" = "0 $ref"
check "alice with another salt: nothing cached, the same text" test "$r4" = "0 $ref"
check "  ... both went to prefill" test "$(status_get p2 counters.admitted)" = 3
check "nothing held by requests after, on either node" settle p2 d2

# a client that leaves mid-generation: its verified prompt pages are
# still cached, and nothing stays held
IDS2=$(python3 -c 'print(",".join(str(5 + (i * 41) % 300) for i in range(70)))')
curl -s -m 1 -N -H "Authorization: Bearer $B" \
	-d "{\"prompt\":[$IDS2],\"max_tokens\":400,\"temperature\":0,\"stream\":true}" \
	"http://127.0.0.1:$H_PORT/v1/completions" >/dev/null 2>&1 || true
bob8() { [ "$(dcache d2 bob)" -ge 8 ]; }
check "client gone mid-generation: its 4 prompt pages cached too (bob: 8)" wait_for 20 bob8
check "  ... nothing held after" settle p2 d2

# a page whose tag breaks after mark_ready (fault retag_ready): the engine
# refuses it, the lent pages are quarantined and none is cached
stop_node d2
MD=$(log_mark "$T/d2.log")
start_node d2 KVD_FAULT=retag_ready:1
check "decode restarted with retag_ready" wait_log "$T/d2.log" "event=peer_capacity" 40 "$MD"
check "  ... serving" wait_log "$T/d2.log" "event=serve_ready" 40 "$MD"
out=$(curl -s -m 60 -H "Authorization: Bearer $A" \
	-d "{\"prompt\":[$IDS],\"max_tokens\":12,\"temperature\":0}" \
	"http://127.0.0.1:$H_PORT/v1/completions")
check "retag_ready: the client gets an error, no text" bash -c "grep -q '\"error\"' <<<'$out'"
check "  ... the lent pages were quarantined" \
	wait_log "$T/d2.log" "event=pages_quarantined .*reason=engine_integrity" 10 "$MD"
check "  ... and none of them cached for alice" test "$(dcache d2 alice)" = 0
r5=$(req $A)
check "alice's next request: through prefill again, the same text" test "$r5" = "64 $ref"
finish
