#!/usr/bin/env bash
# SIGHUP reloads the API keys file (http.api_keys_file) and says so in
# the log (event=reload); before, SIGHUP's default action killed the node
# without a line. A key added to the file works at once, on HTTP and on
# the msgpack socket; a removed one is refused; a file that fails its
# checks (another's permissions, a bad line) keeps the keys in use and
# logs why; a node without keys, and a prefill node, log that there is
# nothing to reload and serve on. kvd logs to stderr only: there is no log file to reopen.
# SIGHUP also reads the INI again for http.cors_origins: a new origin is
# allowed and a dropped one refused at once; an INI that fails its checks
# (a path-shaped origin) keeps the list in use and logs FILE:LINE and why.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/serve_lib.sh"
command -v curl >/dev/null || skip "curl absent"
command -v python3 >/dev/null || skip "python3 absent"
TC=$(dirname "$0")/tenant_client.py

gen_model "$T/m.gguf"
M=$T/m.gguf
KEY_A=alice-0123456789abcdef0123456789abcdef
KEY_B=bob-0123456789abcdef0123456789abcdef00
KEY_C=carol-0123456789abcdef0123456789abcdef
printf '%s alice\n%s bob\n' "$KEY_A" "$KEY_B" > "$T/keys"
chmod 600 "$T/keys"
# models KEY: the HTTP status of GET /v1/models with KEY
models() { curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $1" "$U/v1/models" || true; }
alive() { kill -0 "$PID_n" 2>/dev/null; }

next_port; H=$PORT; next_port; CL=$PORT
write_node n standalone "$M" "listen.http=127.0.0.1:$H" "listen.client=127.0.0.1:$CL" \
	"http.api_keys_file=$T/keys" "log.level=info" "http.cors_origins=https://a.example"
start_node n
check "node up" wait_log "$T/n.log" "event=serve_ready" 60
U=http://127.0.0.1:$H
check "alice's key: 200" test "$(models "$KEY_A")" = 200
check "carol's key (not in the file yet): 401" test "$(models "$KEY_C")" = 401

# ---- a good file: carol in, alice out ----------------------------------------------
printf '%s bob\n%s carol\n' "$KEY_B" "$KEY_C" > "$T/keys"
MK=$(log_mark "$T/n.log")
kill -HUP "$PID_n"
check "SIGHUP: event=reload api_keys=loaded keys=2 tenants=2" \
	wait_log "$T/n.log" 'event=reload signal=HUP api_keys=loaded file=.* keys=2 tenants=2 log=stderr' 10 "$MK"
check "  ... the node lives" alive
check "carol's key, added: 200" test "$(models "$KEY_C")" = 200
check "bob's key, kept: 200" test "$(models "$KEY_B")" = 200
check "alice's key, removed: 401" test "$(models "$KEY_A")" = 401
out=$(python3 "$TC" "$CL" mp_key "$KEY_C" || true)
check "msgpack auth with carol's new key: auth_ok ($out)" bash -c "[[ '$out' == auth_ok:carol* ]]"
out=$(python3 "$TC" "$CL" mp_key "$KEY_A" || true)
check "msgpack auth with alice's removed key: frame_error" bash -c "[[ '$out' == frame_error* ]]"

# ---- a file that fails its checks: the keys in use stay --------------------------------
printf '%s alice\n' "$KEY_A" > "$T/keys"
chmod 644 "$T/keys"
MK=$(log_mark "$T/n.log")
kill -HUP "$PID_n"
check "a group/world-readable file: event=reload api_keys=kept, naming the file" \
	wait_log "$T/n.log" "event=reload signal=HUP api_keys=kept file=\"?$T/keys\"? keys=2 .*msg=\".*keys.*(group|other|mode|access)" 10 "$MK"
check "  ... the node lives" alive
check "  ... carol's key still works: 200" test "$(models "$KEY_C")" = 200
check "  ... alice's key still refused: 401" test "$(models "$KEY_A")" = 401
printf 'short alice\n' > "$T/keys"
chmod 600 "$T/keys"
MK=$(log_mark "$T/n.log")
kill -HUP "$PID_n"
check "a bad line: api_keys=kept, naming FILE:LINE" \
	wait_log "$T/n.log" "event=reload signal=HUP api_keys=kept .*msg=\".*keys:1" 10 "$MK"
check "  ... bob's key still works: 200" test "$(models "$KEY_B")" = 200

# ---- http.cors_origins from the INI ------------------------------------------------------
# the INI goes through every boot check, the keys file's among them: a
# good one again (a bad one keeps the origins too, naming the keys file)
printf '%s bob\n%s carol\n' "$KEY_B" "$KEY_C" > "$T/keys"
# acao ORIGIN: the Access-Control-Allow-Origin GET /v1/models answers to ORIGIN (bob's key)
acao() {
	curl -s -o /dev/null -D - -H "Authorization: Bearer $KEY_B" -H "Origin: $1" "$U/v1/models" |
		tr -d '\r' | sed -n 's/^[Aa]ccess-[Cc]ontrol-[Aa]llow-[Oo]rigin: //p'
}
# hup_origins LIST DESCRIPTION PATTERN: the INI's http.cors_origins is
# LIST, then SIGHUP; the reload's line matches PATTERN
hup_origins() {
	local mk
	sed -i "s|^cors_origins = .*|cors_origins = $1|" "$T/n.ini"
	mk=$(log_mark "$T/n.log")
	kill -HUP "$PID_n"
	check "$2" wait_log "$T/n.log" "$3" 10 "$mk"
}
check "a.example allowed at boot" test "$(acao https://a.example)" = https://a.example
check "b.example refused at boot" test -z "$(acao https://b.example)"
hup_origins "https://b.example, http://localhost:5173" \
	"SIGHUP with new origins: event=reload cors_origins=loaded origins=2" \
	'event=reload signal=HUP cors_origins=loaded file=.* origins=2 any=no'
check "  ... b.example, added: allowed" test "$(acao https://b.example)" = https://b.example
check "  ... localhost:5173, added: allowed" test "$(acao http://localhost:5173)" = http://localhost:5173
check "  ... a.example, dropped: refused" test -z "$(acao https://a.example)"
hup_origins "https://c.example, app.example.com/x" \
	"a path-shaped origin: cors_origins=kept, naming FILE:LINE, the key and the entry" \
	"level=error .*event=reload signal=HUP cors_origins=kept file=.* origins=2 any=no msg=\".*n.ini:[0-9]+: http.cors_origins: .*app.example.com/x"
check "  ... the node lives" alive
check "  ... b.example still allowed" test "$(acao https://b.example)" = https://b.example
check "  ... c.example not taken: refused" test -z "$(acao https://c.example)"
hup_origins "" "an empty list: cors_origins=loaded origins=0 (CORS off)" \
	'event=reload signal=HUP cors_origins=loaded file=.* origins=0 any=no'
check "  ... b.example now refused" test -z "$(acao https://b.example)"

# ---- a node without keys ------------------------------------------------------------------
next_port; H2=$PORT
write_node k standalone "$M" "listen.http=127.0.0.1:$H2" "log.level=info"
start_node k
check "keyless node up" wait_log "$T/k.log" "event=serve_ready" 60
MK=$(log_mark "$T/k.log")
kill -HUP "$PID_k"
check "keyless: event=reload api_keys=none" \
	wait_log "$T/k.log" 'event=reload signal=HUP api_keys=none log=stderr' 10 "$MK"
check "  ... the node lives and serves" bash -c \
	"kill -0 $PID_k && test \"\$(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:$H2/v1/models)\" = 200"

# ---- a prefill node: no client keys, serves on ----------------------------------------------
next_port; PP=$PORT
write_node p prefill "$M" "listen.peer=127.0.0.1:$PP" "log.level=info"
start_node p
check "prefill node up" wait_log "$T/p.log" "event=serve_ready" 60
MK=$(log_mark "$T/p.log")
kill -HUP "$PID_p"
check "prefill: event=reload api_keys=none" \
	wait_log "$T/p.log" 'event=reload signal=HUP api_keys=none log=stderr' 10 "$MK"
check "  ... no HTTP front: no cors_origins line" bash -c "sleep 0.5; ! tail -c +$((MK + 1)) '$T/p.log' | grep -q cors_origins"
check "  ... the node lives" kill -0 "$PID_p"

stop_node n
stop_node k
stop_node p
finish
