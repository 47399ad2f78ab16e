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

# --- undersized pool, policy refuse: exit 78, verdict=insufficient, no socket ---
{ base; printf '[kv]\npool_tokens = 1000\n'; } >"$T/small.ini"
set +e
"$KVD" --config "$T/small.ini" 2>"$T/small.log"
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

# --- enough pool: ok verdict ---
{ base; printf '[kv]\nmemory_bytes = 64M\n'; } >"$T/big.ini"
"$KVD" --config "$T/big.ini" 2>"$T/big.log" &
pid=$!
PIDS+=("$pid")
check "sufficient pool becomes ready" wait_log "$T/big.log" 'event=ready' 10
check "sufficient pool verdict=ok" grep -q 'event=kv_capacity .*verdict=ok .*advertised_context=2048' "$T/big.log"
kill -INT "$pid"; wait "$pid" || true

finish
