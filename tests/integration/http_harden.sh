#!/usr/bin/env bash
# The HTTP front's trust boundary and its failures (a standalone node with
# API keys):
#   - the key is judged at the end of the head: a request with a wrong or
#     missing key and a large Content-Length whose body never comes is
#     answered 401 and closed at once (kvd reads none of the body; before,
#     it waited for the body up to http.read_timeout_ms); with
#     `Expect: 100-continue` no 100 Continue goes out first; a client
#     that sends the body anyway reads the 401, not a reset (kvd drops
#     the body, bounded, after its FIN); a good key still gets its body
#     read; each refusal is counted once;
#   - deadlines count from accept: a client silent for most of
#     http.header_timeout_ms that then trickles a head gets its 408 at
#     header_timeout_ms from accept (before: from its first byte, so it
#     held the connection for up to twice the time); `100 Continue` goes
#     out only once the key is accepted and the body is still to come: a
#     body sent with the head gets no 100 (before: a 100 went out even
#     ahead of a 401);
#   - allocation failures on the answer path (KVD_HTTP_NOMEM, fault-point
#     builds): every failing allocation of an exchange, streamed or not,
#     ends in a 500 (or an SSE error event once the head is out) and a
#     closed connection - never a stalled one - and the request's pages
#     go back; the same for n=2 (every choice's pages), with a JSON
#     grammar too (each choice's run and the shared grammar freed).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/serve_lib.sh"
command -v curl >/dev/null || skip "curl absent"
command -v python3 >/dev/null || skip "python3 absent"
command -v jq >/dev/null || skip "jq absent"
RAW=$(dirname "$0")/http_raw.py

gen_model "$T/m.gguf"
M=$T/m.gguf
KEY=dave-0123456789abcdef0123456789abcdef
printf '%s dave admin\n' "$KEY" > "$T/keys"
chmod 600 "$T/keys"

next_port; S_HTTP=$PORT
write_node sa standalone "$M" "listen.http=127.0.0.1:$S_HTTP" "http.api_keys_file=$T/keys" \
	"http.read_timeout_ms=30000" "http.header_timeout_ms=$((1500 * TSCALE))"
start_node sa
check "standalone with HTTP up" wait_log "$T/sa.log" "event=serve_ready" 60

# ---- the key before the body ----------------------------------------------------
MS=$(log_mark "$T/sa.log")
out=$(python3 "$RAW" "$S_HTTP" early wrong-key-0123456789 900000 || true)
echo "# wrong key, 900000-byte body never sent: $out"
check "wrong key, body never sent: 401 and closed without the body" \
	bash -c "[[ '$out' =~ ^status=401\ ms=([0-9]+)\ closed$ ]] && [ \${BASH_REMATCH[1]} -lt 3000 ]"
out=$(python3 "$RAW" "$S_HTTP" early - 900000 || true)
echo "# no key, 900000-byte body never sent: $out"
check "no key, body never sent: 401 and closed without the body" \
	bash -c "[[ '$out' =~ ^status=401\ ms=([0-9]+)\ closed$ ]] && [ \${BASH_REMATCH[1]} -lt 3000 ]"
out=$(python3 "$RAW" "$S_HTTP" early "$KEY" 900000 2 || true)
echo "# good key, body never sent: $out"
check "good key, body never sent: kvd waits for the body (no answer in 2 s)" test "$out" = none
check "  ... the refusals logged with their status" \
	test "$(log_count "$T/sa.log" "event=http_request .*path=/v1/completions status=401" "$MS")" = 2
head -c 200000 /dev/zero | tr '\0' 'a' > "$T/big"
curl -s -v -o "$T/c100.body" -w '%{http_code}\n' "127.0.0.1:$S_HTTP/v1/completions" \
	-H "Authorization: Bearer wrong-key-0123456789" -H "Expect: 100-continue" \
	--data-binary @"$T/big" > "$T/c100.out" 2>&1 || true
check "Expect: 100-continue with a wrong key: 401" grep -q "^401$" "$T/c100.out"
check "  ... and no 100 Continue before it" bash -c "! grep -q '< HTTP/1.1 100' '$T/c100.out'"
check "  ... the error object names the key" grep -q '"code":"invalid_api_key"' "$T/c100.body"
# a client that sends its body at once (no Expect): it gets the 401, not
# a reset (kvd half-closes, then drops the body it did not want, bounded)
head -c 900000 /dev/zero | tr '\0' 'a' > "$T/big9"
got=""
for i in 1 2 3 4 5; do
	got+="$(curl -s -o /dev/null -w '%{http_code}' "127.0.0.1:$S_HTTP/v1/completions" \
		-H "Authorization: Bearer wrong-key-0123456789" -H "Expect:" \
		--data-binary @"$T/big9" || echo "-rc$?") "
done
echo "# wrong key, 900000-byte body sent at once, five times: $got"
check "wrong key, body sent at once: a 401 every time, no reset" test "$got" = "401 401 401 401 401 "
code=$(curl -s -o "$T/ok.body" -w '%{http_code}' "127.0.0.1:$S_HTTP/v1/completions" \
	-H "Authorization: Bearer $KEY" \
	-d '{"prompt":"Once upon a time","max_tokens":4,"temperature":0}' || true)
check "a good key with a body: 200" test "$code" = 200
curl -s "127.0.0.1:$S_HTTP/metrics" -H "Authorization: Bearer $KEY" > "$T/metrics" || true
check "the eight early refusals counted once each" \
	grep -q '^kvd_requests_total{tenant="default",outcome="invalid_request"} 8$' "$T/metrics"

# ---- 100 Continue only after the key ------------------------------------------------
out=$(python3 "$RAW" "$S_HTTP" expect wrong-key-0123456789 with || true)
check "Expect: 100-continue, wrong key, body in the same write: the 401 alone ($out)" \
	test "$out" = "statuses=401"
out=$(python3 "$RAW" "$S_HTTP" expect wrong-key-0123456789 after || true)
check "Expect: 100-continue, wrong key, body held back: the 401 alone ($out)" \
	test "$out" = "statuses=401"
out=$(python3 "$RAW" "$S_HTTP" expect "$KEY" after || true)
check "Expect: 100-continue, good key, body held back: 100 Continue, then 200 ($out)" \
	test "$out" = "statuses=100,200"
out=$(python3 "$RAW" "$S_HTTP" expect "$KEY" with || true)
check "Expect: 100-continue, good key, body already sent: no 100, the 200 ($out)" \
	test "$out" = "statuses=200"

# ---- the head's deadline counts from accept ----------------------------------------
# silent for 1.2 s of the 1.5 s, then a head trickled a byte per 200 ms
out=$(python3 "$RAW" "$S_HTTP" late $((12 * TSCALE / 10)).$((12 * TSCALE % 10)) || true)
echo "# silent 1.2 s, then a head trickled: $out (http.header_timeout_ms $((1500 * TSCALE)))"
check "a head begun late: 408 within header_timeout_ms of accept + one sweep + slack, not of its first byte" \
	bash -c "[[ '$out' =~ ^status=408\ ms=([0-9]+)$ ]] && [ \${BASH_REMATCH[1]} -ge $((1450 * TSCALE)) ] && [ \${BASH_REMATCH[1]} -lt $((2200 * TSCALE)) ]"
check "  ... logged as header_timeout" grep -q "event=client_closed .*proto=http reason=header_timeout" "$T/sa.log"

# ---- no memory while answering ------------------------------------------------------
if grep -q "KVD_FAULT_POINTS 1" "$KVD_BUILD/kvd_build.h"; then
	fails_json=0; fails_sse=0
	for n in 1 2 3 4 5 6 7 8 9 10 1000; do
		next_port; H=$PORT
		write_node "nm$n" standalone "$M" "listen.http=127.0.0.1:$H" "http.api_keys_file=$T/keys"
		start_node "nm$n" KVD_HTTP_NOMEM=$n
		if ! wait_log "$T/nm$n.log" "event=serve_ready" 60; then
			grep "level=error" "$T/nm$n.log" | sed 's/^/# /'
			not_ok "nomem $n: node up"; stop_node "nm$n"; continue
		fi
		rc=0
		code=$(curl -s --max-time 20 -o "$T/nm$n.json" -w '%{http_code}' \
			"127.0.0.1:$H/v1/completions" -H "Authorization: Bearer $KEY" \
			-d '{"prompt":"Once upon a time","max_tokens":8,"temperature":0}') || rc=$?
		if [ "$code" = 500 ]; then
			fails_json=$((fails_json + 1))
			check "nomem $n, JSON: 500 naming the failure, closed (curl rc $rc)" \
				bash -c "[ $rc = 0 ] && grep -q 'out of memory while answering' '$T/nm$n.json'"
		else
			check "nomem $n, JSON: a whole answer (got $code, curl rc $rc)" \
				bash -c "[ $rc = 0 ] && [ '$code' = 200 ] && jq -e '.choices[0].finish_reason' '$T/nm$n.json' >/dev/null"
		fi
		rc=0
		code=$(curl -s -N --max-time 20 -o "$T/nm$n.sse" -w '%{http_code}' \
			"127.0.0.1:$H/v1/completions" -H "Authorization: Bearer $KEY" \
			-d '{"prompt":"Once upon a time","max_tokens":8,"temperature":0,"stream":true}') || rc=$?
		if [ "$code" = 500 ]; then
			# before the head went out: an error object, as for JSON
			check "nomem $n, SSE: 500 before any event, closed (curl rc $rc)" \
				bash -c "[ $rc = 0 ] && grep -q 'out of memory while answering' '$T/nm$n.sse'"
		elif grep -q "out of memory while answering" "$T/nm$n.sse"; then
			fails_sse=$((fails_sse + 1))
			check "nomem $n, SSE: an error event, [DONE], the stream ended (curl rc $rc)" \
				bash -c "[ $rc = 0 ] && tail -n 2 '$T/nm$n.sse' | grep -q '^data: \[DONE\]'"
		else
			check "nomem $n, SSE: a whole stream (curl rc $rc)" \
				bash -c "[ $rc = 0 ] && grep -q '\"finish_reason\":\"' '$T/nm$n.sse' && tail -n 2 '$T/nm$n.sse' | grep -q '^data: \[DONE\]'"
		fi
		# n=2: the choices' own allocations (daemon/front/http_api.c
		# choices_*) fail as cleanly, and no choice is left running
		rc=0
		code=$(curl -s --max-time 20 -o "$T/nm$n.n2.json" -w '%{http_code}' \
			"127.0.0.1:$H/v1/completions" -H "Authorization: Bearer $KEY" \
			-d '{"prompt":"Once upon a time","max_tokens":8,"temperature":0,"n":2}') || rc=$?
		check "nomem $n, JSON n=2: a 500 naming the failure or both choices (got $code, curl rc $rc)" \
			bash -c "[ $rc = 0 ] && { grep -q 'out of memory' '$T/nm$n.n2.json' ||
				{ [ '$code' = 200 ] && jq -e '[.choices[].index] == [0,1]' '$T/nm$n.n2.json' >/dev/null; }; }"
		rc=0
		code=$(curl -s -N --max-time 20 -o "$T/nm$n.n2.sse" -w '%{http_code}' \
			"127.0.0.1:$H/v1/completions" -H "Authorization: Bearer $KEY" \
			-d '{"prompt":"Once upon a time","max_tokens":8,"temperature":0,"stream":true,"n":2}') || rc=$?
		check "nomem $n, SSE n=2: a 500, an error event and [DONE], or both choices and [DONE] (got $code, curl rc $rc)" \
			bash -c "[ $rc = 0 ] && { [ '$code' = 500 ] || { tail -n 2 '$T/nm$n.n2.sse' | grep -q '^data: \[DONE\]' &&
				{ grep -q 'out of memory' '$T/nm$n.n2.sse' || [ \$(grep -c '\"finish_reason\":\"' '$T/nm$n.n2.sse') = 2 ]; }; }; }"
		# n=2 under a grammar: each choice its own run, one grammar
		# shared (freed once, whichever allocation failed: ASan)
		rc=0
		code=$(curl -s --max-time 20 -o "$T/nm$n.n2g.json" -w '%{http_code}' \
			"127.0.0.1:$H/v1/completions" -H "Authorization: Bearer $KEY" \
			-d '{"prompt":"Once upon a time","max_tokens":8,"temperature":1,"seed":3,"n":2,"response_format":{"type":"json_object"}}') || rc=$?
		check "nomem $n, JSON n=2 under a grammar: a 500 naming the failure or both choices (got $code, curl rc $rc)" \
			bash -c "[ $rc = 0 ] && { grep -q 'out of memory' '$T/nm$n.n2g.json' ||
				{ [ '$code' = 200 ] && jq -e '[.choices[].index] == [0,1]' '$T/nm$n.n2g.json' >/dev/null; }; }"
		check "nomem $n: nothing held afterwards" settle "nm$n"
		check "nomem $n: the node is alive" kill -0 "$(eval echo "\$PID_nm$n")"
		stop_node "nm$n"
	done
	echo "# nomem: $fails_json JSON answers and $fails_sse streams failed cleanly"
	check "nomem: the fault point failed some JSON answers" test "$fails_json" -ge 2
	check "nomem: and some streams" test "$fails_sse" -ge 3
	check "nomem: not the 1000th allocation (a whole answer then)" \
		bash -c "! grep -q 'out of memory' '$T/nm1000.json' '$T/nm1000.sse'"
fi
stop_node sa
serve_finish
