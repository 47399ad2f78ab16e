#!/bin/sh
# admin.sh - start a real kvd and drive every kvctl command against it.
#
#   drain under synthetic load admits nothing new and loses nothing in
#   flight; grow and shrink under load leave page accounting exact; abort,
#   capacity and audit; bad frames (admin_frames.py); a refused credential
#   (run as another user, when we are root); the daemon serves throughout
#   and exits 0 on SIGTERM.
#
# Environment: KVD_BUILD (build dir), KVD_SRC (source dir); KVD_BIN
# overrides the kvd binary. Needs python3 (meson does too).
set -eu

BUILD=${KVD_BUILD:?KVD_BUILD not set}
SRC=${KVD_SRC:?KVD_SRC not set}
KVD=${KVD_BIN:-$BUILD/kvd}
KVCTL=$BUILD/kvctl
T=$(mktemp -d /tmp/kvd-admin.XXXXXX)
PID=
FAILS=0

cleanup() {
	if [ -n "$PID" ] && kill -0 "$PID" 2>/dev/null; then
		kill -KILL "$PID" 2>/dev/null || true
	fi
	rm -rf "$T"
}
trap cleanup EXIT INT TERM

fail() {
	echo "FAIL: $*"
	FAILS=$((FAILS + 1))
}
ok() {
	echo "ok   $*"
}
# json FIELD.PATH < json: print one field of a JSON object
json() {
	if command -v jq >/dev/null 2>&1; then
		jq -r --arg p "$1" 'getpath($p | split("."))'
		return
	fi
	python3 -c 'import json,sys
v=json.load(sys.stdin)
for k in sys.argv[1].split("."): v=v[k]
print(str(v).lower() if isinstance(v,bool) else v)' "$1"
}
# expect NAME WANT GOT
expect() {
	if [ "$2" = "$3" ]; then ok "$1 ($3)"; else fail "$1: want $2, got $3"; fi
}
kvctl() {
	"$KVCTL" --socket "$T/n0.sock" --timeout 30 "$@"
}
st() {
	kvctl --json status | json "$1"
}
# wait_until SECONDS WHAT CONDITION: poll the shell CONDITION every 50 ms
# until it holds; a failure (naming WHAT) when SECONDS pass first.
wait_until() {
	_n=$(($1 * 20))
	while [ $_n -gt 0 ]; do
		if eval "$3"; then return 0; fi
		sleep 0.05
		_n=$((_n - 1))
	done
	fail "waited $1 s for: $2"
}
# rc CMD...: run, print the exit code
rc() {
	set +e
	"$@" >"$T/out" 2>"$T/err"
	echo $?
	set -e
}

# Load comes from the fault.load admin command, compiled only with fault
# points (-Dfault_points=true, as tests/run builds); without them the idle
# versions of drain and resize run instead.
FAULT=0
grep -q "define KVD_FAULT_POINTS 1" "$BUILD/kvd_build.h" && FAULT=1

"$KVCTL" model make "$T/m.gguf" --layers 2 --dim 64 --heads 4 --kv-heads 2 \
	--ff 128 --vocab 300 --ctx 1024 >/dev/null

# Group for the credential test: when root, a group that "nobody" is in
# and "daemon" is not; else our own group (no credential test).
GROUP=$(id -gn)
if [ "$(id -u)" = 0 ] && getent group nogroup >/dev/null &&
   getent passwd daemon >/dev/null && getent passwd nobody >/dev/null; then
	GROUP=nogroup
	chmod 0755 "$T"
fi

# 64 pages of 16 tokens; context 256 needs 16 pages.
cat >"$T/n0.ini" <<EOF
[node]
name = n0
role = standalone
[model]
path = $T/m.gguf
context_length = 256
[kv]
page_tokens = 16
pool_tokens = 1024
capacity_margin = 1.0
[admin]
socket = $T/n0.sock
mode = 0666
group = $GROUP
[log]
level = info
EOF

"$KVD" --config "$T/n0.ini" 2>"$T/kvd.log" &
PID=$!
i=0
while [ ! -S "$T/n0.sock" ]; do
	i=$((i + 1))
	if [ $i -gt 100 ] || ! kill -0 "$PID" 2>/dev/null; then
		echo "FAIL: kvd did not open its admin socket"; cat "$T/kvd.log"
		exit 1
	fi
	sleep 0.05
done

# ---- daemon unavailable, usage ------------------------------------------------
expect "no daemon -> 69" 69 "$(rc "$KVCTL" --socket "$T/none.sock" status)"
expect "usage -> 2" 2 "$(rc "$KVCTL" --socket "$T/n0.sock" pool resize)"
expect "usage: both sizes -> 2" 2 "$(rc "$KVCTL" --socket "$T/n0.sock" pool resize --tokens 1 --bytes 1)"
expect "unknown subcommand -> 2" 2 "$(rc "$KVCTL" frobnicate)"

# ---- status, capacity -----------------------------------------------------------
expect "status" 0 "$(rc kvctl status)"
grep -q "^node .*n0 (standalone), ready" "$T/out" || fail "status table: $(cat "$T/out")"
expect "state" ready "$(st state)"
expect "pool pages" 64 "$(st pool.pages)"
expect "capacity" 0 "$(rc kvctl capacity)"
expect "capacity verdict" ok "$(kvctl --json capacity | json verdict)"
expect "capacity transport" tcp "$(kvctl --json capacity | json transport)"
expect "status transport" tcp "$(st capacity.transport)"
expect "status" 0 "$(rc kvctl status)"
grep -q "^  transport   tcp$" "$T/out" || fail "status table has no transport line: $(cat "$T/out")"
grep -q "event=kv_capacity .*kv_dtype=[a-z0-9]* transport=tcp verbs_device=\"\"" "$T/kvd.log" ||
	fail "kv_capacity line names no transport: $(grep event=kv_capacity "$T/kvd.log" | head -1)"

# ---- kvctl's own options after the command; --version -----------------------------
expect "status --json (after the command)" ready \
	"$("$KVCTL" status --json --socket "$T/n0.sock" --timeout 30 | json state)"
expect "capacity --socket=PATH --json" ok \
	"$("$KVCTL" capacity --socket="$T/n0.sock" --json | json verdict)"
v=$("$KVCTL" drain --json --no-wait --socket "$T/n0.sock" | json state)
case "$v" in draining|drained) ok "drain's own options beside kvctl's ($v)" ;;
	*) fail "drain --json --no-wait --socket: $v" ;; esac
expect "resume --json" ready "$(kvctl resume --json | json state)"
expect "an option without its value -> 2" 2 "$(rc "$KVCTL" status --socket)"
expect "status --help" 0 "$(rc "$KVCTL" status --help)"
grep -q "^usage: kvctl status" "$T/out" || fail "status --help: $(cat "$T/out")"
expect "audit FILE --json" 0 "$(rc "$KVCTL" audit "$T/kvd.log" --json)"
head -c 1 "$T/out" | grep -q '[[{]' || fail "audit --json after the file: $(head -c 200 "$T/out")"
expect "kvctl --version" 0 "$(rc "$KVCTL" --version)"
v=$(cat "$T/out")
expect "kvctl --version: kvd's version" "$("$KVD" --version | cut -d' ' -f1-2 | sed 's/^kvd/kvctl/')" "$v"
case "$v" in "kvctl "[0-9]*.[0-9]*) ok "kvctl --version names a version ($v)" ;;
	*) fail "kvctl --version: $v" ;; esac

if [ "$FAULT" = 1 ]; then
# ---- drain under load ---------------------------------------------------------------
# 10 requests x 3 pages, released at 6 s (room for slow kvctl calls on a
# loaded machine), fenced for the first 1.2 s.
kvctl --json fault load --count 10 --tokens 48 --hold-ms 6000 --fence-ms 1200 >"$T/load"
expect "load admitted" 10 "$(json admitted <"$T/load")"
expect "pages in use" 30 "$(st pool.ready)"
expect "drain --no-wait" draining "$(kvctl --json drain --no-wait | json state)"
kvctl --json fault load --count 3 --tokens 16 --hold-ms 10 >"$T/load2"
expect "draining admits nothing" 0 "$(json admitted <"$T/load2")"
expect "rejected as draining" 3 "$(json rejected_draining <"$T/load2")"
expect "in flight while draining" 10 "$(st in_flight)"
expect "drain waits until drained" drained "$(kvctl --json drain | json state)"
expect "nothing in flight" 0 "$(st in_flight)"
expect "all 10 completed" 10 "$(st counters.completed)"
expect "none failed" 0 "$(st counters.failed)"
expect "rejected.draining counter" 3 "$(st counters.rejected.draining)"
expect "every page free again" 64 "$(st pool.free)"
expect "resume" ready "$(kvctl --json resume | json state)"
expect "admits again" 1 "$(kvctl --json fault load --count 1 --tokens 16 --hold-ms 1 | json admitted)"

# ---- shrink under load ----------------------------------------------------------------
# 8 requests x 4 pages; released at 1 s but fenced until 2.5 s (the
# release is deferred until the unfence; room for a slow kvctl call on a
# loaded machine). Shrink 64 -> 20 pages: 32 free pages retire at once,
# 12 in use retire when their fences drop.
wait_until 10 "the earlier load ended" '[ "$(st in_flight)" = 0 ]'
kvctl fault load --count 8 --tokens 64 --hold-ms 1000 --fence-ms 2500 >/dev/null
expect "shrink under load" 0 "$(rc kvctl --json pool resize --tokens 320)"
expect "shrink: pages after" 20 "$(json pages_after <"$T/out")"
expect "shrink: retired at once" 32 "$(json retired_now <"$T/out")"
waited=$(json waited_ms <"$T/out")
[ "$waited" -ge 300 ] && ok "shrink waited for pages in use (${waited} ms)" ||
	fail "shrink did not wait: ${waited} ms"
expect "pool pages after shrink" 20 "$(st pool.pages)"
expect "free after shrink" 20 "$(st pool.free)"
expect "retired after shrink" 44 "$(st pool.retired)"
expect "retiring after shrink" 0 "$(st pool.retiring)"
expect "fences after shrink" 0 "$(st pool.fences)"

# ---- grow under load -------------------------------------------------------------------
kvctl fault load --count 4 --tokens 64 --hold-ms 5000 >/dev/null
expect "in use before grow" 16 "$(st pool.ready)"
expect "grow under load" 0 "$(rc kvctl --json pool resize --tokens 2048)"
expect "grow: pages after" 128 "$(json pages_after <"$T/out")"
[ "$(json waited_ms <"$T/out")" -lt 100 ] && ok "grow is immediate" || fail "grow waited"
expect "in use across grow" 16 "$(st pool.ready)"
# drain waits for the load to finish; then resume
expect "drain after grow" drained "$(kvctl --json drain | json state)"
kvctl resume >/dev/null
expect "completed across grow" 0 "$(st counters.failed)"
expect "free after grow" 128 "$(st pool.free)"
expect "in flight after grow" 0 "$(st in_flight)"

# ---- refused, forced, timeout, busy ------------------------------------------------
expect "shrink below capacity refused" 1 "$(rc kvctl pool resize --tokens 128)"
grep -q "capacity" "$T/err" || fail "refusal message: $(cat "$T/err")"
expect "pages unchanged" 128 "$(st pool.pages)"
expect "forced shrink -> insufficient (1)" 1 "$(rc kvctl --json pool resize --tokens 128 --force)"
expect "forced: verdict" insufficient "$(json capacity.verdict <"$T/out")"
expect "capacity insufficient -> 1" 1 "$(rc kvctl capacity)"
expect "grow back by bytes (8MB: decimal)" 0 "$(rc kvctl pool resize --bytes 8MB)"
expect "pages for 8000000 bytes" $((8000000 / $(st pool.page_bytes))) "$(st pool.pages)"
# 32 pages in use for 4 s; shrinking to 16 must wait for 16 of them
kvctl fault load --count 2 --tokens 256 --hold-ms 4000 >/dev/null
expect "shrink timeout -> 1" 1 "$(rc kvctl pool resize --tokens 256 --wait-ms 100)"
grep -q "timeout" "$T/err" || fail "timeout message: $(cat "$T/err")"
expect "retiring after timeout" 16 "$(st pool.retiring)"
expect "capacity counts only staying pages" 256 "$(st capacity.pool_tokens)"
expect "next resize accepted after a timeout" 0 "$(rc kvctl pool resize --tokens 1024)"
wait_until 15 "the load ended" '[ "$(st in_flight)" = 0 ]'
expect "retiring drained later" 0 "$(st pool.retiring)"
expect "in flight" 0 "$(st in_flight)"
expect "free == pages" "$(st pool.pages)" "$(st pool.free)"

# ---- abort --------------------------------------------------------------------------------
first=$(kvctl --json fault load --count 3 --tokens 32 --hold-ms 20000 | json first_id)
failed0=$(st counters.failed)
expect "abort" 0 "$(rc kvctl abort "$first")"
expect "abort again: not found" 1 "$(rc kvctl abort "$first")"
expect "abort unknown" 1 "$(rc kvctl abort 99999999)"
grep -q "not_found" "$T/err" || fail "not_found message: $(cat "$T/err")"
expect "failed counter" $((failed0 + 1)) "$(st counters.failed)"
kvctl abort $((first + 1)) >/dev/null
kvctl abort $((first + 2)) >/dev/null
expect "in flight after aborts" 0 "$(st in_flight)"
expect "free after aborts" "$(st pool.pages)" "$(st pool.free)"

RESIZES=6
else
# ---- without fault points: the same commands on an idle node --------------------
expect "fault.load absent" 1 "$(rc kvctl fault load --count 1 --tokens 1 --hold-ms 1)"
grep -q "unknown_command" "$T/err" || fail "fault.load message: $(cat "$T/err")"
expect "drain idle" drained "$(kvctl --json drain | json state)"
expect "resume" ready "$(kvctl --json resume | json state)"
expect "shrink idle" 20 "$(kvctl --json pool resize --tokens 320 | json pages_after)"
expect "free after shrink" 20 "$(st pool.free)"
expect "shrink below capacity refused" 1 "$(rc kvctl pool resize --tokens 128)"
expect "grow" 0 "$(rc kvctl pool resize --tokens 1024)"
expect "pages after grow" 64 "$(st pool.pages)"
expect "abort unknown" 1 "$(rc kvctl abort 99999999)"
RESIZES=2
fi

# ---- bad frames --------------------------------------------------------------------------
if python3 "$SRC/tests/integration/admin_frames.py" "$T/n0.sock" >"$T/frames" 2>&1; then
	ok "bad frames ($(grep -c '^ok' "$T/frames") cases)"
else
	fail "bad frames:"; grep -v '^ok' "$T/frames"
fi

# ---- credentials ------------------------------------------------------------------------
if [ "$GROUP" = nogroup ] && command -v setpriv >/dev/null; then
	expect "uid daemon refused" 1 "$(rc setpriv --reuid=daemon --regid=daemon --clear-groups "$KVCTL" --socket "$T/n0.sock" status)"
	grep -q "denied" "$T/err" || fail "denied message: $(cat "$T/err")"
	grep -q "event=admin_denied uid=1 " "$T/kvd.log" || fail "no admin_denied log line"
	expect "nobody (in nogroup) allowed" 0 "$(rc setpriv --reuid=nobody --regid=nogroup --clear-groups "$KVCTL" --socket "$T/n0.sock" status)"
	[ "$FAULT" = 1 ] && expect "member: root-only command refused" 1 "$(rc setpriv --reuid=nobody --regid=nogroup --clear-groups "$KVCTL" --socket "$T/n0.sock" fault load --count 1 --tokens 1 --hold-ms 1)"
else
	echo "skip credential test (needs root, setpriv, users daemon/nobody, group nogroup)"
fi

# ---- still serving; audit of our own log; clean exit ------------------------------
expect "status after everything" 0 "$(rc kvctl status)"
expect "state" ready "$(st state)"
n=$(grep -c "event=kv_capacity.*reason=resize" "$T/kvd.log" || true)
expect "one kv_capacity line per resize" "$RESIZES" "$n"
expect "audit of the log" 0 "$(rc "$KVCTL" audit "$T/kvd.log")"
grep -q "^n0 " "$T/out" || fail "audit table: $(cat "$T/out")"

kill -TERM "$PID"
set +e
wait "$PID"
code=$?
set -e
PID=
expect "kvd exit code on SIGTERM" 0 "$code"
[ ! -e "$T/n0.sock" ] && ok "socket removed" || fail "socket left behind"

if [ "$FAILS" -ne 0 ]; then
	echo "$FAILS failure(s); kvd log:"
	tail -40 "$T/kvd.log"
	exit 1
fi
echo "all admin integration checks passed"
