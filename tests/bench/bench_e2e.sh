#!/usr/bin/env bash
# bench_e2e.sh - end-to-end serving figures on loopback, one run:
#   - tokens/s and TTFT p50/p99 at concurrency 1, 8 and 32 through a
#     prefill+decode pair (TTFT as the decode node measures it: request
#     arrival to first token event);
#   - the cost of integrity: two pairs from the same binary, one with
#     transfer.checksum=on, one off, requests interleaved round by round
#     in ABBA order (on off, off on, ...), so machine drift hits both alike;
#     and, since that difference drowns in noise on a small machine, the
#     checksum time the nodes measure themselves (counters.checksum_ns) as
#     a share of the runs' wall time and of p99 TTFT;
#   - KV transfer GB/s against a raw TCP loopback copy (bench_xfer).
# Prints figures; never fails on speed. KVD_BENCH_ROUNDS (default 3),
# KVD_BENCH_MODEL (a GGUF to use instead of a generated one).
set -euo pipefail
: "${KVD_BUILD:?}"
KVD=$KVD_BUILD/kvd
KVCTL=$KVD_BUILD/kvctl
T=$(mktemp -d /tmp/kvd-bench.XXXXXX)
PIDS=()
cleanup() {
	local p
	for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$T"
}
trap cleanup EXIT
ROUNDS=${KVD_BENCH_ROUNDS:-3}
PORT=$((30000 + RANDOM % 20000))

M=${KVD_BENCH_MODEL:-}
if [ -z "$M" ]; then
	M=$T/m.gguf
	"$KVCTL" model make "$M" --layers 4 --dim 256 --heads 8 --kv-heads 4 --ff 768 \
		--vocab 512 --ctx 1024 --seed 3 >/dev/null
fi

node() { # node NAME ROLE CHECKSUM PEERPORT [CLIENTPORT]
	local name=$1 role=$2 ck=$3 pp=$4 cp=${5:-}
	{
		printf '[node]\nname = %s\nrole = %s\n[model]\npath = %s\n' "$name" "$role" "$M"
		printf '[kv]\npool_tokens = 65536\ndtype = f16\n[engine]\nthreads = 1\nmax_batch = 32\n'
		printf '[transfer]\nchecksum = %s\n' "$ck"
		printf '[admin]\nsocket = %s/%s.sock\n[log]\nlevel = info\n' "$T" "$name"
		if [ "$role" = prefill ]; then
			printf '[listen]\npeer = 127.0.0.1:%s\n' "$pp"
		else
			printf '[listen]\nclient = 127.0.0.1:%s\n[peers]\nprefill = 127.0.0.1:%s\n' "$cp" "$pp"
		fi
	} >"$T/$name.ini"
	"$KVD" --config "$T/$name.ini" >"$T/$name.log" 2>&1 &
	PIDS+=($!)
}

node p_on prefill on $((PORT + 1))
node d_on decode on $((PORT + 1)) $((PORT + 2))
node p_off prefill off $((PORT + 3))
node d_off decode off $((PORT + 3)) $((PORT + 4))
for _ in $(seq 1 200); do
	grep -q "event=peer_up" "$T/d_on.log" 2>/dev/null &&
		grep -q "event=peer_up" "$T/d_off.log" 2>/dev/null && break
	sleep 0.05
done
if ! grep -q "event=peer_up" "$T/d_on.log" || ! grep -q "event=peer_up" "$T/d_off.log"; then
	echo "bench_e2e: the pairs did not come up:" >&2
	tail -5 "$T"/*.log >&2
	exit 1
fi
declare -A CPORT=([on]=$((PORT + 2)) [off]=$((PORT + 4)))

one() { # one PORT I: one request, JSON line out
	local i=$2
	"$KVCTL" generate --server "127.0.0.1:$1" --json --id "$i" \
		--prompt "request $i: once upon a time in a land far away there lived a small dragon who" \
		--max-tokens 32 --temperature 0.8 --seed "$i"
}
export -f one
export KVCTL

# ck_ns MODE: checksum time (ns) both nodes of a pair have spent so far
ck_ns() {
	local total=0 node v
	for node in "p_$1" "d_$1"; do
		v=$("$KVCTL" --socket "$T/$node.sock" --json status 2>/dev/null |
			python3 -c 'import json,sys; print(json.load(sys.stdin)["counters"]["checksum_ns"])' 2>/dev/null || echo 0)
		total=$((total + v))
	done
	echo "$total"
}

run() { # run MODE CONC N -> appends "wall_s tokens ttft..." to $T/res.MODE.CONC
	local mode=$1 conc=$2 n=$3 t0 t1 c0 c1
	c0=$(ck_ns "$mode")
	t0=$(date +%s.%N)
	seq 1 "$n" | xargs -P "$conc" -I{} bash -c 'one "$0" "$1"' "${CPORT[$mode]}" {} >"$T/out" 2>/dev/null || true
	t1=$(date +%s.%N)
	c1=$(ck_ns "$mode")
	echo "$t0 $t1 $((c1 - c0))" >>"$T/ck.$mode.$conc"
	python3 - "$t0" "$t1" "$T/out" >>"$T/res.$mode.$conc" <<'EOF'
import json, sys
t0, t1 = float(sys.argv[1]), float(sys.argv[2])
toks, ttft = 0, []
for line in open(sys.argv[3]):
    try:
        o = json.loads(line)
    except Exception:
        continue
    if "error" in o:
        print("bench_e2e: request failed:", o.get("error"), o.get("message"), file=sys.stderr)
        continue
    toks += o["output_tokens"]
    ttft.append(o["ttft_us"])
print(t1 - t0, toks, " ".join(map(str, ttft)))
EOF
}

for conc in 1 8 32; do
	n=$((conc * 4))
	[ $n -lt 16 ] && n=16
	for r in $(seq 1 "$ROUNDS"); do
		# ABBA order: neither mode always runs first (warm caches,
		# a neighbour's burst) across rounds
		if [ $((r % 2)) = 1 ]; then order="on off"; else order="off on"; fi
		for mode in $order; do run "$mode" "$conc" "$n"; done
	done
done

python3 - "$T" <<'EOF'
import sys
t = sys.argv[1]
def load(mode, conc):
    wall = toks = 0
    ttft = []
    for line in open(f"{t}/res.{mode}.{conc}"):
        parts = line.split()
        wall += float(parts[0]); toks += int(parts[1])
        ttft += [int(x) for x in parts[2:]]
    ttft.sort()
    pct = lambda p: ttft[min(len(ttft) - 1, int(p * len(ttft)))] / 1000 if ttft else float("nan")
    return toks / wall if wall else 0, pct(0.5), pct(0.99), len(ttft)
print("end-to-end (loopback, prefill+decode pair, 32 output tokens per request)")
print(f"{'conc':>4} {'integrity':>9} {'tok/s':>9} {'ttft p50 ms':>12} {'ttft p99 ms':>12} {'requests':>8}")
for conc in (1, 8, 32):
    r = {m: load(m, conc) for m in ("on", "off")}
    for m in ("on", "off"):
        tps, p50, p99, n = r[m]
        print(f"{conc:>4} {m:>9} {tps:>9.1f} {p50:>12.2f} {p99:>12.2f} {n:>8}")
    on, off = r["on"], r["off"]
    print(f"     checksum cost: throughput {100 * (off[0] - on[0]) / off[0]:+.2f}%  p99 ttft {100 * (on[2] - off[2]) / off[2]:+.2f}%")
    # measured directly: the time both nodes spent checksumming and
    # verifying batches (counters.checksum_ns) over the wall time of the
    # checksum=on runs. Counting both nodes against one wall clock is an
    # upper bound on the throughput and TTFT the checksum can cost.
    wall = ns = 0.0
    for line in open(f"{t}/ck.on.{conc}"):
        a, b, c = line.split()
        wall += float(b) - float(a); ns += int(c)
    print(f"     checksum time measured in the nodes: {ns / 1e6:.2f} ms in {wall:.2f} s of runs = {100 * ns / 1e9 / wall:.3f}% (upper bound on its cost)")
    per_req_ms = ns / 1e6 / on[3] if on[3] else float("nan")
    print(f"     per request {per_req_ms * 1e3:.1f} us = {100 * per_req_ms / on[2]:.3f}% of p99 ttft (upper bound)")
EOF
"$KVD_BUILD/tests/bench/bench_xfer" "${KVD_BENCH_XFER_MIB:-512}" "$ROUNDS"
