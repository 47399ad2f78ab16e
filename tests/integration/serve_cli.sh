#!/usr/bin/env bash
# kvd serve -m FILE: a standalone node without an INI (issue 24). The
# flags go through the config's key table and checks: a completion over
# HTTP on --host:--port, --ctx sizing the pool and the context, the admin
# socket under $XDG_RUNTIME_DIR/kvd when neither $RUNTIME_DIRECTORY nor
# /run/kvd is writable (else the working directory), --api-key-file
# (401 without a key, 200 with), --threads; a bad flag value is exit 78
# naming the config key, a non-loopback --host without keys is refused as
# the INI's listen.http is, a missing -m is usage (64).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/serve_lib.sh"
command -v curl >/dev/null || skip "curl absent"
gen_model "$T/m.gguf"
mkdir -p "$T/xdg" "$T/cwd"
# a serve whose admin socket must fall back (as an ordinary user's would);
# serve_bg: in the background, $! its pid (the subshell execs into kvd)
serve() { (cd "$T/cwd" && exec env -u RUNTIME_DIRECTORY XDG_RUNTIME_DIR="$T/xdg" "$KVD" serve "$@"); }
serve_bg() {
	local log=$1; shift
	(cd "$T/cwd" && exec env -u RUNTIME_DIRECTORY XDG_RUNTIME_DIR="$T/xdg" "$KVD" serve "$@" >"$log" 2>&1) &
	PIDS+=($!)
}
NOKVD=1; [ -d /run/kvd ] && [ -w /run/kvd ] && NOKVD=0

next_port; H=$PORT
serve_bg "$T/s1.log" -m "$T/m.gguf" --port "$H" --ctx 256 --threads 1; S1=$!
check "kvd serve: ready" wait_log "$T/s1.log" "event=serve_ready role=standalone .*http=127.0.0.1:$H" 60
check "  ... --ctx 256: the context and a pool of one context" \
	log_has "$T/s1.log" "event=kv_capacity role=standalone pool_tokens=256 .*context_length=256"
check "  ... --threads 1" log_has "$T/s1.log" "event=engine_ready .*threads=1 "
st=$(curl -s -o "$T/body" -w '%{http_code}' "http://127.0.0.1:$H/v1/completions" \
	-d '{"prompt":"Once","max_tokens":4}' || true)
check "  ... a completion: 200" test "$st" = 200
check "  ... of 4 tokens" grep -q '"completion_tokens":4' "$T/body"
if [ $NOKVD = 1 ]; then
	check "  ... the admin socket under \$XDG_RUNTIME_DIR/kvd (0700)" bash -c \
		"test -S '$T/xdg/kvd/kvd0.sock' && test \$(stat -c %a '$T/xdg/kvd') = 700"
	check "  ... kvctl status there: standalone, ready" bash -c \
		"'$KVCTL' --socket '$T/xdg/kvd/kvd0.sock' status | grep -q 'kvd0 (standalone), ready'"
	if ! ls /run/kvd/*.sock >/dev/null 2>&1; then
		check "  ... kvctl finds it without --socket (\$XDG_RUNTIME_DIR/kvd)" bash -c \
			"env -u KVCTL_SOCKET XDG_RUNTIME_DIR='$T/xdg' '$KVCTL' status | grep -q 'kvd0 (standalone), ready'"
	fi
fi
kill -TERM "$S1"; wait "$S1" 2>/dev/null || true
check "  ... SIGTERM: it stopped" bash -c "! kill -0 $S1 2>/dev/null"

if [ $NOKVD = 1 ]; then
	# no $XDG_RUNTIME_DIR either: the working directory
	next_port; H=$PORT
	(cd "$T/cwd" && exec env -u RUNTIME_DIRECTORY -u XDG_RUNTIME_DIR "$KVD" serve \
		-m "$T/m.gguf" --port "$H" --ctx 128) >"$T/s2.log" 2>&1 &
	PIDS+=($!); S2=$!
	check "without \$XDG_RUNTIME_DIR: the admin socket in the working directory" \
		wait_log "$T/s2.log" "event=admin_listening path=\"?$T/cwd/kvd0.sock" 60
	kill -TERM "$S2"; wait "$S2" 2>/dev/null || true
fi

KEY=alice-0123456789abcdef0123456789abcdef
printf '%s alice\n' "$KEY" >"$T/keys"; chmod 600 "$T/keys"
next_port; H=$PORT
serve_bg "$T/s3.log" -m "$T/m.gguf" --port "$H" --ctx 128 --api-key-file "$T/keys"; S3=$!
check "--api-key-file: ready" wait_log "$T/s3.log" "event=listen_http .*keys=1" 60
code() { curl -s -o /dev/null -w '%{http_code}' "$@" || true; }
check "  ... no key: 401" test "$(code "http://127.0.0.1:$H/v1/models")" = 401
check "  ... the key: 200" test "$(code -H "Authorization: Bearer $KEY" "http://127.0.0.1:$H/v1/models")" = 200
kill -TERM "$S3"; wait "$S3" 2>/dev/null || true

rc=0; serve -m "$T/m.gguf" --threads lots >/dev/null 2>"$T/e1" || rc=$?
check "--threads lots: exit 78 naming engine.threads and the value ($rc)" \
	bash -c "test $rc = 78 && grep -q \"engine.threads: 'lots'\" '$T/e1'"
rc=0; serve -m "$T/m.gguf" --host 0.0.0.0 >/dev/null 2>"$T/e2" || rc=$?
check "--host 0.0.0.0 without keys: refused as listen.http is ($rc)" \
	bash -c "test $rc = 78 && grep -q 'listen.http' '$T/e2'"
rc=0; serve -m "$T/nope.gguf" >/dev/null 2>"$T/e3" || rc=$?
check "a missing model: exit 78 naming it ($rc)" bash -c "test $rc = 78 && grep -q nope.gguf '$T/e3'"
rc=0; serve --port 1 >/dev/null 2>&1 || rc=$?
check "no -m: usage, exit 64 ($rc)" test "$rc" = 64
finish
