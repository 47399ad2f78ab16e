#!/usr/bin/env bash
# Purity under load (invariant 9): 200 requests from 16 concurrent
# clients, each with a random canary string in its prompt and its own
# sampling parameters and seed, through a prefill+decode pair. Every
# output must equal that request's solo run (kvd generate, offline),
# token for token - the bytes of a tenant never depend on the others
# batched with it. Afterwards no page is held on either node.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/serve_lib.sh"

N=${KVD_PURITY_REQUESTS:-200}
C=${KVD_PURITY_CLIENTS:-16}
gen_model "$T/m.gguf" --layers 1 --seed 21
M=$T/m.gguf
pair pp dp "$M" "engine.max_batch=32" -- "engine.max_batch=32"
start_node pp
start_node dp
check "pair up" wait_up dp

# one line per request: index, seed, temperature, max_tokens, prompt
python3 - "$N" >"$T/reqs.txt" <<'EOF'
import random, sys
n = int(sys.argv[1])
rng = random.Random()
for i in range(n):
    canary = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(rng.randint(6, 40)))
    temp = rng.choice(["0", "0.7", "1.0", "1.3"])
    print(f"{i}\t{rng.randint(0, 2**32)}\t{temp}\t{rng.randint(4, 20)}\tcanary {canary} tells a story:")
EOF

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

start=$(date +%s.%N)
tr '\n' '\0' <"$T/reqs.txt" | xargs -0 -P "$C" -I{} bash -c 'run_one served "$1"' _ {}
end=$(date +%s.%N)
echo "# $N requests, $C clients: $(python3 -c "print(round($end - $start, 2))") s"
tr '\n' '\0' <"$T/reqs.txt" | xargs -0 -P 2 -I{} bash -c 'run_one solo "$1"' _ {}

res=$(python3 - "$T" "$N" <<'EOF'
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
EOF
)
read -r same differ failed <<<"$res"
check "all $N served outputs equal their solo runs ($same same, $differ differ, $failed unreadable)" \
	test "$same" = "$N"
check "zero pages held on both nodes afterwards" settle pp dp
check "decode completed every request" test "$(status_get dp counters.completed)" -ge "$N"
stop_node dp
stop_node pp
serve_finish
