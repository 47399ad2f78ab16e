#!/usr/bin/env bash
# The chat page (GET /, daemon/front/http_page.c) in a real browser:
# headless Chromium driven by puppeteer-core (chat_page.mjs) against a
# standalone node's HTTP front (stories260K with model.chat_template =
# chatml when shared/ has it, else a generated model):
#   - /, /chat.js and /chat.css are served without a key, byte for byte
#     the files of daemon/front/page/, with their Content-Type, an ETag
#     (If-None-Match: 304, no body) and the strict Content-Security-Policy
#     (default-src 'none', no 'unsafe-inline');
#   - in the page: a wrong key shows the 401 in words; the right key
#     lists the model; a message sent with Enter (temperature 0) streams
#     an answer equal to the same request's through curl, and the page
#     shows its token count (the usage's) and tokens/s; Shift+Enter is a
#     newline; Stop aborts a streaming answer; a request too long for the
#     context shows the 400 in words; every control has a label; nothing overflows a 360 px
#     screen; no CSP violation or script error; every request the page
#     made went to the node's own origin;
#   - a screenshot: $KVD_BUILD/chat_page.png;
#   - http.chat_page = off: /, /chat.js, /chat.css are 404 (the API stays).
# puppeteer-core is installed at test time into a cache under the build
# tree (KVD_BUILD/npm-puppeteer) and uses the system's chromium. Skips
# (77) without chromium, node, npm or the registry.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/serve_lib.sh"
command -v curl >/dev/null || skip "curl absent"
command -v jq >/dev/null || skip "jq absent"
command -v node >/dev/null || skip "node absent"
CHROMIUM=${KVD_CHROMIUM:-$(command -v chromium || command -v chromium-browser || true)}
[ -n "$CHROMIUM" ] || skip "chromium absent (Debian: apt-get install chromium)"
# /usr/bin/chromium is a wrapper script; puppeteer wants the binary
[ -x /usr/lib/chromium/chromium ] && [ "$CHROMIUM" = /usr/bin/chromium ] &&
	CHROMIUM=/usr/lib/chromium/chromium
timeout 30 "$CHROMIUM" --headless --no-sandbox --disable-gpu --version >/dev/null 2>&1 ||
	skip "$CHROMIUM does not run here"

npm_packages puppeteer puppeteer-core@25
echo "# $("$CHROMIUM" --version 2>/dev/null)"

M=${KVD_SHARED:-}/models/stories260K.gguf
[ -f "$M" ] || { gen_model "$T/m.gguf"; M=$T/m.gguf; }
KEY=carol-0123456789abcdef0123456789abcdef
printf '%s carol\n' "$KEY" > "$T/keys"; chmod 600 "$T/keys"
next_port; H=$PORT
write_node f standalone "$M" "listen.http=127.0.0.1:$H" "http.api_keys_file=$T/keys" \
	"http.model_name=kvd-test" "model.chat_template=chatml" "model.chat_template_unsafe=true"
start_node f
check "node up" wait_log "$T/f.log" "event=serve_ready"
B=http://127.0.0.1:$H
PAGE=$KVD_SRC/daemon/front/page

# ---- the files, their headers ---------------------------------------------------
# get PATH [CURL ARGS]: status on stdout, headers in $T/h, body in $T/b
get() {
	local p=$1; shift
	rm -f "$T/b"   # (curl writes no file for an answer without a body)
	curl -s -D "$T/h" -o "$T/b" -w '%{http_code}' "$@" "$B$p" || true
}
hdr() { { grep -i "^$1:" "$T/h" || true; } | head -1 | cut -d: -f2- | sed 's/^ *//; s/\r$//'; }
for f in /:chat.html:text/html /chat.js:chat.js:text/javascript /chat.css:chat.css:text/css; do
	IFS=: read -r p file ctype <<<"$f"
	st=$(get "$p")
	check "GET $p without a key: 200 ($st)" test "$st" = 200
	check "  ... the bytes of daemon/front/page/$file" cmp -s "$T/b" "$PAGE/$file"
	check "  ... Content-Type $ctype" test "$(hdr content-type)" = "$ctype; charset=utf-8"
	csp=$(hdr content-security-policy)
	check "  ... CSP default-src 'none', script-src 'self', connect-src 'self'" \
		grep -q "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'" <<<"$csp"
	check "  ... no 'unsafe-inline' in the CSP" test "${csp/unsafe-inline/}" = "$csp"
	check "  ... nosniff" test "$(hdr x-content-type-options)" = nosniff
	etag=$(hdr etag)
	check "  ... an ETag ($etag), Cache-Control: no-cache" \
		test -n "$etag" -a "$(hdr cache-control)" = no-cache
	st=$(get "$p" -H "If-None-Match: $etag")
	check "  ... If-None-Match: its ETag is 304, no body ($st)" test "$st" = 304 -a ! -s "$T/b"
	st=$(get "$p" -H 'If-None-Match: "0123"')
	check "  ... another ETag is 200 ($st)" test "$st" = 200
done
check "the page has no inline script or style" \
	test "$(grep -Eci '<script>|<script [^>]*>[^<]|<style|style=| on[a-z]+=' "$PAGE/chat.html")" = 0
check "the page's script never sets innerHTML" test "$(grep -c 'innerHTML\s*=' "$PAGE/chat.js")" = 0

# ---- in the browser -------------------------------------------------------------
MSG="Tell me a story about a cat"
MT=24
ref=$(curl -s -H "Authorization: Bearer $KEY" -d "$(jq -nc --arg m "$MSG" --argjson mt $MT \
	'{model: "kvd-test", messages: [{role: "user", content: $m}], temperature: 0, max_tokens: $mt}')" \
	"$B/v1/chat/completions")
want=$(jq -r '.choices[0].message.content' <<<"$ref")
want_n=$(jq -r '.usage.completion_tokens' <<<"$ref")
check "curl reference: an answer of $want_n tokens" test -n "$want" -a "$want_n" -gt 0
MK=$(log_mark "$T/f.log")
got=$(CHAT_PAGE_PROFILE=$T/profile timeout 240 node "$KVD_SRC/tests/integration/chat_page.mjs" \
	"$MOD" "$CHROMIUM" "$B/" "$KEY" wrong-key-0123456789abcdef0123456789 "$MSG" 0 $MT "$T/chat_page.png" ||
	echo '{"failure": "the driver failed"}')
echo "# page: $(jq -c '{stats, tokens, rate, models, wrong_key_error, stop_clicked_streaming, stop_stats, context_error, failure}' <<<"$got" 2>/dev/null || echo "$got")"
check "the driver ran to the end" test "$(jq -r '.failure // ""' <<<"$got")" = ""
check "a wrong key: the page shows the 401" \
	grep -q "refused (401)" <<<"$(jq -r .wrong_key_error <<<"$got")"
check "the right key: the page lists the model" test "$(jq -c .models <<<"$got")" = '["kvd-test"]'
check "Shift+Enter adds a newline and sends nothing" test "$(jq -r .shift_enter_newline <<<"$got")" = true
check "the message shows as sent" test "$(jq -r .user <<<"$got")" = "$MSG"
check "the streamed answer in the page equals curl's (temperature 0)" \
	test "$(jq -r .answer <<<"$got")" = "$want"
[ "$(jq -r .answer <<<"$got")" = "$want" ] ||
	echo "#   page $(jq -c .answer <<<"$got")"$'\n'"#   curl $(jq -c '.choices[0].message.content' <<<"$ref")"
check "the page shows the token count ($want_n) and tokens/s" \
	test "$(jq -r .tokens <<<"$got")" = "$want_n" -a \
	"$(jq -r '.rate > 0 and (.stats | test("tokens/s"))' <<<"$got")" = true
check "no error shown after the answer" test "$(jq -r .error_after <<<"$got")" = ""
check "the page's request: stream with include_usage, temperature 0, max_tokens $MT, model kvd-test" \
	test "$(jq -c '.chat_bodies[0] | [.stream, .stream_options.include_usage, .temperature, .max_tokens, .model]' <<<"$got")" = "[true,true,0,$MT,\"kvd-test\"]"
check "the next request carries the conversation (user, assistant: the answer, user)" \
	test "$(jq -c --arg a "$want" --arg m "$MSG" '.chat_bodies[1].messages | [.[0].content == $m, .[1].role, .[1].content == $a, .[2].content]' <<<"$got")" = '[true,"assistant",true,"Tell me more"]'
check "Stop aborts an answer while it streams" \
	test "$(jq -r '"\(.stop_clicked_streaming) \(.stop_stats)"' <<<"$got")" = "true stopped"
check "  ... and the node let the request go (event=client_gone, tenant carol)" \
	log_has "$T/f.log" "event=client_gone .*tenant=carol" "$MK"
check "a request too long for the context: the page says so" \
	grep -q "too long for the model's context (400 context_length_exceeded)" <<<"$(jq -r .context_error <<<"$got")"
check "every control has a label" test "$(jq -c .unlabelled <<<"$got")" = '[]'
check "nothing overflows a 360 px screen" test "$(jq -r .narrow_overflow <<<"$got")" = false
check "no CSP violation or script error (the wrong key's 401 aside)" test "$(jq -c .console_errors <<<"$got")" = '[]'
jq -r '.console_errors[]?' <<<"$got" | sed 's/^/#   console: /'
foreign=$(jq -r --arg b "$B/" '.requests[] | select(startswith($b) or startswith("data:") | not)' <<<"$got")
check "every request the page made was to $B ($(jq '.requests | length' <<<"$got") requests)" \
	test -z "$foreign" -a "$(jq '.requests | length' <<<"$got")" -ge 5
[ -z "$foreign" ] || echo "#   foreign: $foreign"
check "the page's chat request is in the log with its tenant" \
	log_has "$T/f.log" "event=request_done .*tenant=carol" "$MK"
if [ -s "$T/chat_page.png" ] && [ "$(head -c 8 "$T/chat_page.png" | od -An -tx1 | tr -d ' ')" = 89504e470d0a1a0a ]; then
	cp "$T/chat_page.png" "$KVD_BUILD/chat_page.png"
	ok "screenshot: $KVD_BUILD/chat_page.png"
else
	not_ok "screenshot: no PNG"
fi

# ---- http.chat_page = off -------------------------------------------------------
check "nothing held after the page's requests" wait_for 10 idle f
stop_node f
next_port; H=$PORT; B=http://127.0.0.1:$H
write_node g standalone "$M" "listen.http=127.0.0.1:$H" "http.api_keys_file=$T/keys" \
	"http.chat_page=off"
start_node g
check "node with http.chat_page=off up" wait_log "$T/g.log" "event=serve_ready"
for p in / /chat.js /chat.css; do
	st=$(get "$p")
	check "http.chat_page=off: GET $p is 404 ($st)" test "$st" = 404
done
check "  ... in OpenAI's error shape" test "$(jq -r .error.message "$T/b")" = "no such endpoint"
st=$(get /v1/models -H "Authorization: Bearer $KEY")
check "  ... the API stays (/v1/models $st)" test "$st" = 200
finish
