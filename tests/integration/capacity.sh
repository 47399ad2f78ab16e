#!/usr/bin/env bash
# Boot capacity check (invariant 4) and config refusal through the real
# binary: bad configs exit 78 naming FILE:LINE; an undersized pool exits 78
# with verdict=insufficient before listening; clamp starts and says so.
. "$(dirname "$0")/lib.sh"
M=$(shared_model)

base() { printf '[node]\nname = cap\n[model]\npath = %s\n[admin]\nsocket = %s/admin.sock\n' "$M" "$T"; }

# --- ten kinds of bad config, each: exit 78, FILE:LINE in the message ---
i=0
while IFS='|' read -r what text; do
	i=$((i + 1))
	f=$T/bad$i.ini
	{ base; printf '%b' "$text"; } >"$f"
	set +e
	out=$("$KVD" --check-config --config "$f" 2>&1 >/dev/null)
	rc=$?
	set -e
	if [ $rc -eq 78 ] && grep -qE "^$f:[0-9]+: " <<<"$out"; then
		ok "bad config refused with FILE:LINE: $what ($out)"
	else
		not_ok "bad config: $what: rc=$rc out=$out"
	fi
done <<'EOF_CASES'
unknown section|[kv]\npool_tokens = 4096\n[bogus]\nx = 1\n
unknown key|[kv]\npool_tokens = 4096\npool_tokenz = 5\n
bad integer|[kv]\npool_tokens = many\n
out of range|[kv]\npool_tokens = 4096\npage_tokens = 0\n
bad enum|[kv]\npool_tokens = 4096\ncapacity_policy = hope\n
bad boolean|[kv]\npool_tokens = 4096\n[transfer]\nchecksum = perhaps\n
both pool sizes|[kv]\npool_tokens = 4096\nmemory_bytes = 1G\n
duplicate key|[kv]\npool_tokens = 4096\npool_tokens = 8192\n
decode without prefill peers|[kv]\npool_tokens = 4096\n[node]\nrole = decode\n
batch cannot move within release timeout|[kv]\npool_tokens = 4096\n[transfer]\nmax_batch_bytes = 512M\nlink_gbps = 1\nrelease_timeout_ms = 1000\n
bad address|[kv]\npool_tokens = 4096\n[listen]\nclient = localhost\n
margin below one|[kv]\npool_tokens = 4096\ncapacity_margin = 0.5\n
syntax error|[kv]\npool_tokens = 4096\nnot ini at all\n
EOF_CASES

# --- a good config passes check-config ---
{ base; printf '[kv]\npool_tokens = 4096\n'; } >"$T/good.ini"
check "check-config accepts a good config" quiet "$KVD" --check-config --config "$T/good.ini"

# --- the admin socket's directory: --check-config fails exactly when the
# start would (before, it passed, and the start exited 1 at bind) ---
# host_rc WHAT INI [ENV...]: check-config's and the start's exit codes
# (timeout: a start that runs) must both be 78, naming admin.socket
host_refused() {
	local what=$1 ini=$2 rc1=0 rc2=0; shift 2
	env "$@" "$KVD" --check-config --config "$ini" >/dev/null 2>"$T/host1.err" || rc1=$?
	env "$@" timeout 20 "$KVD" --config "$ini" >/dev/null 2>"$T/host2.err" || rc2=$?
	check "$what: check-config exits 78 ($rc1), naming admin.socket and the directory" \
		bash -c "test $rc1 = 78 && grep -q 'admin.socket: .*directory' '$T/host1.err'"
	check "$what: ... and so does the start ($rc2), with the same message" \
		bash -c "test $rc2 = 78 && cmp -s '$T/host1.err' '$T/host2.err'"
}
{ base | sed "s|^socket = .*|socket = $T/nodir/admin.sock|"; printf '[kv]\npool_tokens = 4096\n'; } >"$T/nodir.ini"
host_refused "admin.socket in a missing directory" "$T/nodir.ini"
touch "$T/afile"
{ base | sed "s|^socket = .*|socket = $T/afile/admin.sock|"; printf '[kv]\npool_tokens = 4096\n'; } >"$T/notdir.ini"
host_refused "admin.socket under a file" "$T/notdir.ini"
# the default (no admin.socket): $RUNTIME_DIRECTORY, else /run/kvd
printf '[node]\nname = cap\n[model]\npath = %s\n[kv]\npool_tokens = 4096\n' "$M" >"$T/dflt.ini"
mkdir -p "$T/rt"
check "the default socket under an existing \$RUNTIME_DIRECTORY: check-config passes" \
	quiet env RUNTIME_DIRECTORY="$T/rt" "$KVD" --check-config --config "$T/dflt.ini"
host_refused "the default socket, \$RUNTIME_DIRECTORY missing" "$T/dflt.ini" RUNTIME_DIRECTORY="$T/rt-gone"
if [ ! -d /run/kvd ] || ! [ -w /run/kvd ]; then
	host_refused "the default socket, no /run/kvd to write" "$T/dflt.ini" -u RUNTIME_DIRECTORY
fi

# --- undersized pool, policy refuse: exit 78, verdict=insufficient, no socket ---
{ base; printf '[kv]\npool_tokens = 1000\n'; } >"$T/small.ini"
set +e
timeout 20 "$KVD" --config "$T/small.ini" 2>"$T/small.log"   # a node that starts would never exit
rc=$?
set -e
check "undersized pool exits 78" [ $rc -eq 78 ]
check "undersized pool logs verdict=insufficient" grep -q 'event=kv_capacity .*verdict=insufficient policy=refuse' "$T/small.log"
check "exactly one kv_capacity line" [ "$(grep -c 'event=kv_capacity' "$T/small.log")" -eq 1 ]
check "refused before listening" [ ! -e "$T/admin.sock" ]
check "check-config also refuses it" bash -c "! \"\$0\" --check-config --config \"\$1\" >/dev/null 2>&1" "$KVD" "$T/small.ini"

# --- same pool, policy clamp: starts, advertises what fits, stops on TERM ---
{ base; printf '[kv]\npool_tokens = 1000\ncapacity_policy = clamp\ncapacity_margin = 1.25\n'; } >"$T/clamp.ini"
"$KVD" --config "$T/clamp.ini" 2>"$T/clamp.log" &
pid=$!
PIDS+=("$pid")
check "clamped node becomes ready" wait_log "$T/clamp.log" 'event=ready' 10
# 63 pages x 16 = 1008 tokens; 1008 / 1.25 = 806.4 -> 806
check "clamped advertised_context logged" grep -q 'event=kv_capacity .*pool_tokens=1008 .*required_tokens=2560 .*verdict=insufficient policy=clamp advertised_context=806' "$T/clamp.log"
kill -TERM "$pid"
set +e
wait "$pid"
rc=$?
set -e
check "SIGTERM stops the node with exit 0" [ $rc -eq 0 ]
check "stop logged" grep -q 'event=stopped' "$T/clamp.log"

# --- the margin counts: a pool between the context (2048) and context x
# margin (2560) is insufficient - the incident's own failure mode, a node
# that knows its pool is short and says "ok" ---
{ base; printf '[kv]\npool_tokens = 2304\ncapacity_margin = 1.25\n'; } >"$T/margin.ini"
set +e
timeout 20 "$KVD" --config "$T/margin.ini" 2>"$T/margin.log"
rc=$?
set -e
check "pool between context and context x margin: exits 78" [ $rc -eq 78 ]
check "pool between context and context x margin: verdict=insufficient" \
	grep -q 'event=kv_capacity .*pool_tokens=2304 .*context_length=2048 margin=1.25 required_tokens=2560 .*verdict=insufficient policy=refuse' "$T/margin.log"
check "pool between context and context x margin: never ready" bash -c '! grep -q "event=ready" "$0"' "$T/margin.log"
check "check-config refuses it too" bash -c "! \"\$0\" --check-config --config \"\$1\" >/dev/null 2>&1" "$KVD" "$T/margin.ini"
# the same pool with margin 1: ok (the margin, not the pool, decided)
{ base; printf '[kv]\npool_tokens = 2304\ncapacity_margin = 1.0\n'; } >"$T/margin1.ini"
check "the same pool with margin 1.0 passes check-config" quiet "$KVD" --check-config --config "$T/margin1.ini"
# clamp: starts, advertises what fits with the margin, and the verdict
# it reports to kvctl is still not ok
{ base; printf '[kv]\npool_tokens = 2304\ncapacity_margin = 1.25\ncapacity_policy = clamp\n'; } >"$T/marginc.ini"
"$KVD" --config "$T/marginc.ini" 2>"$T/marginc.log" &
pid=$!
PIDS+=("$pid")
check "margin, clamp: becomes ready" wait_log "$T/marginc.log" 'event=ready' 10
# 2304 / 1.25 = 1843.2 -> 1843
check "margin, clamp: advertised_context=1843, verdict=insufficient" \
	grep -q 'event=kv_capacity .*pool_tokens=2304 .*required_tokens=2560 .*verdict=insufficient policy=clamp advertised_context=1843' "$T/marginc.log"
v=$("$KVCTL" --socket "$T/admin.sock" --json capacity 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["verdict"])' || true)
check "margin, clamp: kvctl capacity verdict is not ok ($v)" test "$v" = insufficient
kill -TERM "$pid"; wait "$pid" || true

# --- enough pool: ok verdict ---
{ base; printf '[kv]\nmemory_bytes = 64M\n'; } >"$T/big.ini"
"$KVD" --config "$T/big.ini" 2>"$T/big.log" &
pid=$!
PIDS+=("$pid")
check "sufficient pool becomes ready" wait_log "$T/big.log" 'event=ready' 10
check "sufficient pool verdict=ok" grep -q 'event=kv_capacity .*verdict=ok .*advertised_context=2048' "$T/big.log"
kill -INT "$pid"; wait "$pid" || true

finish
