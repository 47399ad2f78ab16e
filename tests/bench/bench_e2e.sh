#!/usr/bin/env bash
# bench_e2e.sh - end-to-end serving figures on loopback, one run:
#   - tokens/s and TTFT p50/p99 at concurrency 1, 8 and 32 through a
#     prefill+decode pair (TTFT as the decode node measures it: request
#     arrival to first token event);
#   - the cost of integrity and of the peer AEAD: four pairs from the same
#     binary - keyless with transfer.checksum=on and off, keyed
#     (peers.key_file: every KV batch sealed, MAC only) and keyed with
#     transfer.encrypt=on, both with checksums on - requests interleaved
#     round by round, forward then reverse order (on off mac enc, enc mac
#     off on, ...: ABBA for four), so machine drift hits all alike; and,
#     since those differences drown in noise on a small machine, the time
#     the nodes measure themselves (counters.checksum_ns: XXH3, and on
#     keyed links seal and open too) as a share of the runs' wall time and
#     of p99 TTFT;
#   - KV transfer GB/s per mode against a raw TCP loopback copy, and the
#     primitives' own speed (bench_xfer).
# Prints figures; never fails on speed. KVD_BENCH_ROUNDS (default 2, keep
# it even), KVD_BENCH_MODEL (a GGUF to use instead of a generated one),
# KVD_BENCH_XFER_MIB (bench_xfer MiB per run, default 512).
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
ROUNDS=${KVD_BENCH_ROUNDS:-2}
PORT=$((30000 + RANDOM % 20000))

M=${KVD_BENCH_MODEL:-}
if [ -z "$M" ]; then
	M=$T/m.gguf
	"$KVCTL" model make "$M" --layers 4 --dim 256 --heads 8 --kv-heads 4 --ff 768 \
		--vocab 512 --ctx 1024 --seed 3 >/dev/null
fi

"$KVCTL" keygen "$T/cluster.key" >/dev/null
# The pairs, in the order of a forward round.
MODES=(on off mac enc)

node() { # node NAME ROLE MODE PEERPORT [CLIENTPORT]
	local name=$1 role=$2 mode=$3 pp=$4 cp=${5:-} ck=on
	[ "$mode" = off ] && ck=off
	{
		printf '[node]\nname = %s\nrole = %s\n[model]\npath = %s\n' "$name" "$role" "$M"
		printf '[kv]\npool_tokens = 65536\ndtype = f16\n[engine]\nthreads = 1\nmax_batch = 32\n'
		printf '[transfer]\nchecksum = %s\n' "$ck"
		[ "$mode" = enc ] && printf 'encrypt = on\n'
		printf '[admin]\nsocket = %s/%s.sock\n[log]\nlevel = info\n' "$T" "$name"
		if [ "$role" = prefill ]; then
			printf '[listen]\npeer = 127.0.0.1:%s\n' "$pp"
		else
			printf '[listen]\nclient = 127.0.0.1:%s\n' "$cp"
		fi
		printf '[peers]\n'
		[ "$role" = decode ] && printf 'prefill = 127.0.0.1:%s\n' "$pp"
		case $mode in mac | enc) printf 'key_file = %s/cluster.key\n' "$T" ;; esac
	} >"$T/$name.ini"
	"$KVD" --config "$T/$name.ini" >"$T/$name.log" 2>&1 &
	PIDS+=($!)
}

declare -A CPORT
k=0
for mode in "${MODES[@]}"; do
	node "p_$mode" prefill "$mode" $((PORT + k + 1))
	node "d_$mode" decode "$mode" $((PORT + k + 1)) $((PORT + k + 2))
	CPORT[$mode]=$((PORT + k + 2))
	k=$((k + 2))
done
up() {
	local m
	for m in "${MODES[@]}"; do
		grep -q "event=peer_up" "$T/d_$m.log" 2>/dev/null || return 1
	done
}
for _ in $(seq 1 200); do up && break; sleep 0.05; done
if ! up; then
	echo "bench_e2e: the pairs did not come up:" >&2
	tail -5 "$T"/*.log >&2
	exit 1
fi

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
		# forward, then reverse: over two rounds every mode sits
		# at the same mean position (warm caches, a neighbour's burst)
		if [ $((r % 2)) = 1 ]; then order="on off mac enc"; else order="enc mac off on"; fi
		for mode in $order; do run "$mode" "$conc" "$n"; done
	done
done

python3 - "$T" <<'EOF'
import sys
t = sys.argv[1]
modes = ("on", "off", "mac", "enc")
label = {"on": "checksum=on", "off": "checksum=off", "mac": "sealed", "enc": "encrypted"}
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
def measured(mode, conc):
    # (wall s of the runs, ns both nodes spent in checksum_ns over them)
    wall = ns = 0.0
    for line in open(f"{t}/ck.{mode}.{conc}"):
        a, b, c = line.split()
        wall += float(b) - float(a); ns += int(c)
    return wall, ns
def rel(x, base):
    return 100 * (x - base) / base if base else float("nan")
print("end-to-end (loopback, prefill+decode pair, 32 output tokens per request)")
print("  vs xxh3: against the keyless checksum=on pair; sealed and encrypted pairs")
print("  checksum too. in-node: counters.checksum_ns of both nodes (XXH3, and on")
print("  keyed links seal + open) over the runs: an upper bound on what it costs.")
print(f"{'conc':>4} {'mode':>12} {'tok/s':>9} {'ttft p50 ms':>12} {'ttft p99 ms':>12} {'reqs':>5}"
      f" {'tok/s vs xxh3':>14} {'p99 vs xxh3':>12} {'in-node ms':>11} {'% wall':>7}"
      f" {'us/req':>8} {'% p99':>7}")
for conc in (1, 8, 32):
    r = {m: load(m, conc) for m in modes}
    for m in modes:
        tps, p50, p99, n = r[m]
        wall, ns = measured(m, conc)
        per_req_us = ns / 1e3 / n if n else float("nan")
        share_p99 = 100 * per_req_us / 1e3 / p99 if n and p99 else float("nan")
        print(f"{conc:>4} {label[m]:>12} {tps:>9.1f} {p50:>12.2f} {p99:>12.2f} {n:>5}"
              f" {rel(tps, r['on'][0]):>+13.2f}% {rel(p99, r['on'][2]):>+11.2f}%"
              f" {ns / 1e6:>11.2f} {100 * ns / 1e9 / wall if wall else 0:>6.3f}%"
              f" {per_req_us:>8.1f} {share_p99:>6.3f}%")
    # what a keyed link adds per request over XXH3 alone, as the nodes
    # measured it (both nodes: sender seal + receiver open)
    _, on_ns = measured("on", conc)
    base = on_ns / r["on"][3] if r["on"][3] else 0
    for m in ("mac", "enc"):
        _, ns = measured(m, conc)
        per = ns / r[m][3] if r[m][3] else 0
        print(f"     {label[m]}: {(per - base) / 1e3:+.1f} us per request in the nodes over xxh3"
              f" = {100 * (per - base) / 1e6 / r[m][2]:.3f}% of its p99 ttft")
EOF
"$KVD_BUILD/tests/bench/bench_xfer" "${KVD_BENCH_XFER_MIB:-512}" "$ROUNDS"
