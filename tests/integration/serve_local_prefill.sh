#!/usr/bin/env bash
# Conditional disaggregation (peers.local_prefill, daemon/node/place.h): a
# decode node that computes some prompts itself when its prefill peer's
# queue is the longer wait.
#   - the key is range-checked (101 is a config error, exit 78);
#   - under concurrent load with local_prefill = 100 the decode node
#     computes some prompts itself (request_done kind=generate) and sends
#     the others to the peer (kind=decode): both paths are taken;
#   - every output, wherever its prompt ran, equals its solo run token for
#     token (invariant 9), and no page is held afterwards on either node;
#   - one request at a time (an idle peer) always goes to the peer, and
#     local_prefill = 0 (the default) never computes a prompt locally.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/serve_lib.sh"

N=${KVD_LOCAL_PREFILL_REQUESTS:-48}
C=${KVD_LOCAL_PREFILL_CLIENTS:-16}
gen_model "$T/m.gguf" --layers 2 --seed 23
M=$T/m.gguf

write_node bad decode "$M" "listen.client=127.0.0.1:1" "peers.prefill=127.0.0.1:2" \
	"peers.local_prefill=101"
set +e
"$KVD" --check-config --config "$T/bad.ini" >"$T/bad.out" 2>&1
rc=$?
set -e
check "peers.local_prefill = 101 is a config error (exit 78)" test "$rc" = 78
check "the error names the key" grep -q "peers.local_prefill" "$T/bad.out"

pair pp dp "$M" "engine.max_batch=32" -- "engine.max_batch=32" "peers.local_prefill=100" \
	"engine.prefill_chunk=16"
start_node pp
start_node dp
check "pair up" wait_up dp

# sequential requests: the peer is idle each time, so each goes there
for i in 1 2 3; do gen "$C_PORT" --prompt "one at a time $i" --max-tokens 4 >/dev/null; done
check "one request at a time: every prompt went to the peer" \
	test "$(grep -c 'event=request_done .*kind=decode' "$T/dp.log")" = 3
check "one request at a time: none computed locally" \
	test "$(grep -c 'event=request_done .*kind=generate' "$T/dp.log")" = 0
mark=$(wc -l <"$T/dp.log")

python3 - "$N" >"$T/reqs.txt" <<'EOF2'
import random, sys
n = int(sys.argv[1])
rng = random.Random(7)
for i in range(n):
    canary = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(rng.randint(40, 120)))
    temp = rng.choice(["0", "0.8", "1.2"])
    print(f"{i}\t{rng.randint(0, 2**32)}\t{temp}\t{rng.randint(4, 16)}\tcanary {canary} goes on:")
EOF2

run_one() { # run_one MODE LINE (MODE: served|solo)
	local mode=$1 i seed temp max prompt
	IFS=$'\t' read -r i seed temp max prompt <<<"$2"
	if [ "$mode" = served ]; then
		timeout 120 "$KVCTL" generate --server "127.0.0.1:$C_PORT" --json --id "$i" \
			--prompt "$prompt" --max-tokens "$max" --temperature "$temp" --seed "$seed" \
			>"$T/served.$i" 2>&1 || true
	else
		timeout 120 "$KVD" generate --json --model "$M" --prompt "$prompt" \
			--max-tokens "$max" --temperature "$temp" --seed "$seed" >"$T/solo.$i" 2>&1 || true
	fi
}
export -f run_one
export KVCTL KVD M T C_PORT

tr '\n' '\0' <"$T/reqs.txt" | xargs -0 -P "$C" -I{} bash -c 'run_one served "$1"' _ {}
tr '\n' '\0' <"$T/reqs.txt" | xargs -0 -P 2 -I{} bash -c 'run_one solo "$1"' _ {}

res=$(python3 - "$T" "$N" <<'EOF2'
import json, sys
t, n = sys.argv[1], int(sys.argv[2])
same = differ = failed = 0
for i in range(n):
    try:
        a = json.load(open(f"{t}/served.{i}"))
        b = json.load(open(f"{t}/solo.{i}"))
    except Exception:
        failed += 1
        continue
    if "error" in a or a.get("output_ids") != b.get("output_ids") or a.get("text") != b.get("text"):
        differ += 1
        if differ <= 3:
            print(f"request {i}: served={a} solo={b}", file=sys.stderr)
    else:
        same += 1
print(same, differ, failed)
EOF2
)
read -r same differ failed <<<"$res"
check "all $N served outputs equal their solo runs ($same same, $differ differ, $failed unreadable)" \
	test "$same" = "$N"
n_local=$(tail -n +"$((mark + 1))" "$T/dp.log" | grep -c 'event=request_done .*kind=generate' || true)
n_remote=$(tail -n +"$((mark + 1))" "$T/dp.log" | grep -c 'event=request_done .*kind=decode' || true)
echo "# under load: $n_local prompts computed on the decode node, $n_remote on the prefill peer"
check "under load some prompts were computed on the decode node" test "$n_local" -ge 1
check "under load some prompts still went to the prefill peer" test "$n_remote" -ge 1
check "every request accounted for" test "$((n_local + n_remote))" = "$N"
check "every local placement was logged with both queues" \
	test "$(tail -n +"$((mark + 1))" "$T/dp.log" | grep -c 'event=prefill_local .*local_pending=[0-9]* .*peer_pending=[0-9]')" = "$n_local"
check "zero pages held on both nodes afterwards" settle pp dp
stop_node dp
stop_node pp

# the default: never local, whatever the load
pair pp0 dp0 "$M" "engine.max_batch=32" -- "engine.max_batch=32"
start_node pp0
start_node dp0
check "default pair up" wait_up dp0
gens=()
for i in $(seq 0 15); do
	gen "$C_PORT" --prompt "concurrent $i $(head -c 60 /dev/zero | tr '\0' x)" --max-tokens 4 >/dev/null &
	gens+=($!)
done
wait "${gens[@]}" || true   # not the nodes: they run in the background too
check "local_prefill = 0: all 16 concurrent prompts went to the peer" \
	test "$(grep -c 'event=request_done .*kind=decode' "$T/dp0.log")" = 16
check "local_prefill = 0: none computed locally" \
	test "$(grep -c 'event=request_done .*kind=generate' "$T/dp0.log")" = 0
stop_node dp0
stop_node pp0
serve_finish
