#!/usr/bin/env bash
# bench_http.sh - the HTTP front's cost: one prefill+decode pair on
# loopback whose decode node listens on both its msgpack client socket and
# listen.http; the same load (32 streamed output tokens per request, one
# connection per request) through each, at 1, 8 and 32 concurrent
# clients, interleaved (msgpack, http, then http, msgpack: ABBA) round by
# round so machine drift hits both alike. TTFT and tok/s are measured by
# one client program (bench_http.py) for both protocols. Prints figures;
# never fails on speed. KVD_BENCH_ROUNDS (default 4, keep it even),
# KVD_BENCH_MODEL (a GGUF instead of a generated one).
set -euo pipefail
: "${KVD_BUILD:?}"
here=$(cd "$(dirname "$0")" && pwd)
KVD=$KVD_BUILD/kvd
KVCTL=$KVD_BUILD/kvctl
T=$(mktemp -d /tmp/kvd-bench-http.XXXXXX)
PIDS=()
cleanup() {
	local p
	for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$T"
}
trap cleanup EXIT
ROUNDS=${KVD_BENCH_ROUNDS:-4}
PORT=$((30000 + RANDOM % 20000))
M=${KVD_BENCH_MODEL:-}
if [ -z "$M" ]; then
	M=$T/m.gguf
	"$KVCTL" model make "$M" --layers 4 --dim 256 --heads 8 --kv-heads 4 --ff 768 \
		--vocab 512 --ctx 1024 --seed 3 >/dev/null
fi
KEY=bench-0123456789abcdef0123456789abcdef
printf '%s bench\n' "$KEY" >"$T/keys"; chmod 600 "$T/keys"
common='[kv]\npool_tokens = 65536\ndtype = f16\n[engine]\nthreads = 1\nmax_batch = 32\n[log]\nlevel = info\n'
printf "[node]\nname = p\nrole = prefill\n[model]\npath = %s\n$common[admin]\nsocket = %s/p.sock\n[listen]\npeer = 127.0.0.1:%s\n" \
	"$M" "$T" $((PORT + 1)) >"$T/p.ini"
printf "[node]\nname = d\nrole = decode\n[model]\npath = %s\n$common[admin]\nsocket = %s/d.sock\n[listen]\nclient = 127.0.0.1:%s\nhttp = 127.0.0.1:%s\n[http]\napi_keys_file = %s\n[peers]\nprefill = 127.0.0.1:%s\n" \
	"$M" "$T" $((PORT + 2)) $((PORT + 3)) "$T/keys" $((PORT + 1)) >"$T/d.ini"
"$KVD" --config "$T/p.ini" >"$T/p.log" 2>&1 & PIDS+=($!)
"$KVD" --config "$T/d.ini" >"$T/d.log" 2>&1 & PIDS+=($!)
DPID=$!
for _ in $(seq 1 200); do grep -q "event=peer_up" "$T/d.log" 2>/dev/null && break; sleep 0.05; done
grep -q "event=peer_up" "$T/d.log" || { echo "bench_http: the pair did not come up" >&2; tail "$T"/*.log >&2; exit 1; }

# cpu: the decode node's user+system time so far, in clock ticks (its
# front, its loop and its engine thread; the engine does the same work
# for both protocols, so the difference between them is the front's)
cpu() { awk '{ print $14 + $15 }' "/proc/$DPID/stat"; }
run() { # run PROTO CONC N SEED0 -> appends a JSON line to $T/res.PROTO.CONC
	local port=$((PORT + 2)) c0 c1
	[ "$1" = http ] && port=$((PORT + 3))
	c0=$(cpu)
	python3 "$here/bench_http.py" "$1" "$port" "$2" "$3" "$4" "$KEY" >>"$T/res.$1.$2"
	c1=$(cpu)
	echo "$((c1 - c0)) $3" >>"$T/cpu.$1.$2"
}
# warm-up (page faults, the engine's first batch)
run msgpack 4 8 900000 && run http 4 8 900000 && rm -f "$T"/res.* "$T"/cpu.*
seed=1
for conc in 1 8 32; do
	n=$((conc * 4)); [ $n -lt 16 ] && n=16
	for r in $(seq 1 "$ROUNDS"); do
		if [ $((r % 2)) = 1 ]; then order="msgpack http"; else order="http msgpack"; fi
		# the same requests (seeds) through both protocols in a round
		for p in $order; do run "$p" "$conc" "$n" "$seed"; done
		seed=$((seed + n))
	done
done

python3 - "$T" "$(getconf CLK_TCK)" <<'PY'
import json, sys
t, hz = sys.argv[1], int(sys.argv[2])
def cpu_ms(p, conc):
    ticks = reqs = 0
    for line in open(f"{t}/cpu.{p}.{conc}"):
        a, b = line.split(); ticks += int(a); reqs += int(b)
    return 1000.0 * ticks / hz / reqs if reqs else float("nan")
def load(p, conc):
    wall = toks = errs = 0
    ttft = []
    for line in open(f"{t}/res.{p}.{conc}"):
        o = json.loads(line)
        wall += o["wall_s"]; toks += o["tokens"]; errs += o["errors"]; ttft += o["ttft_us"]
    ttft.sort()
    pct = lambda q: ttft[min(len(ttft) - 1, int(q * len(ttft)))] / 1000 if ttft else float("nan")
    return toks / wall, pct(0.5), pct(0.99), len(ttft), errs
rel = lambda x, b: 100 * (x - b) / b if b else float("nan")
print("HTTP front vs msgpack socket (loopback pair, 32 streamed tokens per request,")
print("one connection per request, client-side TTFT; rounds interleaved ABBA)")
print("decode cpu: the decode node's CPU time per request (loop + engine; the")
print("engine's share is the same for both, so the difference is the front's)")
print(f"{'conc':>4} {'proto':>8} {'tok/s':>9} {'ttft p50 ms':>12} {'ttft p99 ms':>12} {'reqs':>5} {'errors':>6}"
      f" {'tok/s vs msgpack':>17} {'p50 vs msgpack':>15} {'p99 vs msgpack':>15}"
      f" {'decode cpu ms/req':>18} {'vs msgpack':>11}")
for conc in (1, 8, 32):
    r = {p: load(p, conc) for p in ("msgpack", "http")}
    for p in ("msgpack", "http"):
        tps, p50, p99, n, e = r[p]
        b = r["msgpack"]
        print(f"{conc:>4} {p:>8} {tps:>9.1f} {p50:>12.2f} {p99:>12.2f} {n:>5} {e:>6}"
              f" {rel(tps, b[0]):>+16.2f}% {rel(p50, b[1]):>+14.2f}% {rel(p99, b[2]):>+14.2f}%"
              f" {cpu_ms(p, conc):>18.2f} {rel(cpu_ms(p, conc), cpu_ms('msgpack', conc)):>+10.2f}%")
PY
