#!/usr/bin/env bash
# A unix: client socket belongs to the node that listens on it: a second
# node configured with the same path refuses to start (and leaves the
# first node's socket alone, also on its way out); a socket file nobody
# listens on (a node that was killed) is replaced; a path that is not a
# socket is not ours to remove.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/serve_lib.sh"

gen_model "$T/m.gguf"
SOCK=$T/shared.client
ugen() { timeout 60 "$KVCTL" generate --server "unix:$SOCK" --json --prompt "hello" --max-tokens 4; }
served() { # served LABEL: a client over unix:$SOCK gets its answer
	local out
	out=$(ugen 2>&1) || true
	check "$1" test "$(echo "$out" | json_get finish_reason)" = length
}

next_port; write_node one standalone "$T/m.gguf" "listen.client=127.0.0.1:$PORT,unix:$SOCK"
next_port; write_node two standalone "$T/m.gguf" "listen.client=127.0.0.1:$PORT,unix:$SOCK"

start_node one
check "first node ready" wait_log "$T/one.log" "event=serve_ready" 30
served "first node serves over unix:"

# a live owner: the second node must not take the path
set +e
timeout 30 "$KVD" --config "$T/two.ini" >"$T/two.refused.log" 2>&1
rc=$?
set -e
check "second node refuses to start (rc=$rc)" test "$rc" -ne 0 -a "$rc" -ne 124
check "second node says the socket is in use" \
	grep -Eq "event=listen_client .*addr=\"?unix:$SOCK\"? .*in use" "$T/two.refused.log"
check "second node never reported ready" test "$(grep -c "event=serve_ready" "$T/two.refused.log")" = 0
check "the socket file is still there" test -S "$SOCK"
served "first node still serves over unix: after the refused start"

# a stale socket (its node killed, the file left behind) is replaced
kill -KILL "$PID_one"; wait "$PID_one" 2>/dev/null || true
check "the killed node left its socket file" test -S "$SOCK"
start_node two
check "second node starts over a stale socket" wait_log "$T/two.log" "event=serve_ready" 30
served "second node serves over the replaced socket"
stop_node two
check "a stopped node removes its socket" test ! -e "$SOCK"

# not a socket: refused, left alone
echo "not a socket" > "$SOCK"
set +e
timeout 30 "$KVD" --config "$T/one.ini" >"$T/one.refused.log" 2>&1
rc=$?
set -e
check "a node refuses a path that is not a socket (rc=$rc)" test "$rc" -ne 0 -a "$rc" -ne 124
check "the file is untouched" grep -q "not a socket" "$SOCK"
check "and says why" grep -q "event=listen_client .*is not a socket" "$T/one.refused.log"
[ "$FAILS" -eq 0 ] || cat "$T/two.refused.log" "$T/one.refused.log"   # for the log
finish
