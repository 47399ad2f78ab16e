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
#     read; each refusal is counted once.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/serve_lib.sh"
command -v curl >/dev/null || skip "curl absent"
command -v python3 >/dev/null || skip "python3 absent"
RAW=$(dirname "$0")/http_raw.py

gen_model "$T/m.gguf"
M=$T/m.gguf
KEY=dave-0123456789abcdef00
printf '%s dave\n' "$KEY" > "$T/keys"
chmod 600 "$T/keys"

next_port; S_HTTP=$PORT
write_node sa standalone "$M" "listen.http=127.0.0.1:$S_HTTP" "http.api_keys_file=$T/keys" \
	"http.read_timeout_ms=30000"
start_node sa
check "standalone with HTTP up" wait_log "$T/sa.log" "event=listen_http" 60

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

finish
