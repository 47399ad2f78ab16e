#!/usr/bin/env bash
# compare.sh - kvd vs llama.cpp on the same GGUF files, interleaved, as the
# tables of issue 11 (median ratio kvd / llama.cpp, with the range).
#
#   KVD_BUILD=build tests/bench/compare.sh [engine|serve|all]   (default all)
#
# Needs ../shared/tools/llama.cpp/ (llama-bench, llama-server); exits 77
# without it. Models: the issue's 100M llama (12 layers, dim 768, 12/4
# heads, ff 2048, vocab 16000) from `kvctl model make`, one per weight type,
# in a temporary directory (never committed).
#
# engine: per round, weight type and thread count, kvd and llama-bench in
#   alternating order (kvd first in odd rounds): kvd = `kvd generate --json
#   --prompt-ids <128 ids> --max-tokens 64 --ignore-eos --warmup`
#   (timings.prompt_tokens_per_s, timings.gen_tokens_per_s); llama.cpp =
#   `llama-bench -p 128 -n 64 -r 1 -o json` (its pp128 and tg64 avg_ts, after
#   its own warm-up). The ratio is taken per round (the two runs sat next to
#   each other), then its median and min-max over the rounds are printed.
#   kvd's decode runs after the 128-token prompt, llama-bench's tg64 on an
#   empty context: kvd's attention reads a longer context.
# serve: kvd standalone and llama-server side by side (both up, idle while
#   the other is measured), 2 threads, 32 slots, 128-token prompts -> 64
#   tokens greedy, closed-loop clients from loadgen.py (client-side clock,
#   distinct prompts) at 1, 8 and 32 clients, 4 x clients requests (at least
#   16; KVD_BENCH_REQS_PER_CLIENT) per run, the order alternating per round. Prints throughput and
#   TTFT p50/p99, inter-token p99, each as the median and min-max over rounds,
#   and the median per-round ratio kvd / llama-server.
#
# Environment: KVD_BENCH_ROUNDS (3), KVD_BENCH_TYPES ("f32 f16 q8_0 q4_0
# q4_k q6_k"), KVD_BENCH_THREADS ("1 2"), KVD_BENCH_CLIENTS ("1 8 32"),
# KVD_BENCH_SERVE_TYPE (q8_0), KVD_BENCH_MAX_TOKENS (64),
# KVD_BENCH_LLAMA_ENV (e.g. "OMP_WAIT_POLICY=passive" on a shared machine,
# where llama.cpp's spinning OpenMP threads lose to other load).
# The load average is printed before and after: on a shared machine the
# figures are only as good as it. Never fails on speed.
set -euo pipefail
: "${KVD_BUILD:?KVD_BUILD must point at the build directory}"
HERE=$(cd "$(dirname "$0")" && pwd)
SHARED=${KVD_SHARED:-$HERE/../../../shared}
LL=$SHARED/tools/llama.cpp
if [ ! -x "$LL/llama-bench" ] || [ ! -x "$LL/llama-server" ]; then
	echo "SKIP: $LL has no llama-bench/llama-server"
	exit 77
fi
WHAT=${1:-all}
ROUNDS=${KVD_BENCH_ROUNDS:-3}
TYPES=${KVD_BENCH_TYPES:-f32 f16 q8_0 q4_0 q4_k q6_k}
THREADS=${KVD_BENCH_THREADS:-1 2}
CLIENTS=${KVD_BENCH_CLIENTS:-1 8 32}
SERVE_TYPE=${KVD_BENCH_SERVE_TYPE:-q8_0}
NTOK=${KVD_BENCH_MAX_TOKENS:-64}
read -r -a LLENV <<<"${KVD_BENCH_LLAMA_ENV:-}"
T=$(mktemp -d /tmp/kvd-compare.XXXXXX)
PIDS=()
cleanup() {
	local p
	for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$T"
}
trap cleanup EXIT
# private copies: a rebuild during the run cannot swap the binary under it
cp "$KVD_BUILD/kvd" "$KVD_BUILD/kvctl" "$T/"
KVD=$T/kvd
KVCTL=$T/kvctl
echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) CPUs; rounds $ROUNDS"

model() { # model TYPE: path of the 100M model in that type (made once)
	local m=$T/m100_$1.gguf
	[ -f "$m" ] || "$KVCTL" model make "$m" --layers 12 --dim 768 --heads 12 \
		--kv-heads 4 --ff 2048 --vocab 16000 --ctx 4096 --dtype "$1" --seed 1 >/dev/null
	echo "$m"
}

# ---- engine: prefill (pp128) and decode (tg64) -----------------------------
IDS=$(python3 -c 'print(",".join(["1"] + [str(300 + (j * 104729) % 15000) for j in range(127)]))')

# Both write their report to a file that is parsed after they exit: a
# reader started on a pipe (python's start-up is ~40 ms of CPU) competed
# with the measured run for the two CPUs - kvd generate starts in ~0.2 s,
# so the reader's start-up fell inside its timed prompt (2-thread prefill
# measured 1100-1500 tok/s piped, 2735-2762 to a file, same binary).
kvd_engine() { # kvd_engine MODEL THREADS -> "pp tg"
	"$KVD" generate --model "$1" --prompt-ids "$IDS" --max-tokens "$NTOK" \
		--ignore-eos --warmup --threads "$2" --json >"$T/kvd.json" || return 1
	python3 -c 'import json,sys; t=json.load(open(sys.argv[1]))["timings"]; print(t["prompt_tokens_per_s"], t["gen_tokens_per_s"], "/".join(sorted(set(t["kernels"].values()))))' "$T/kvd.json"
}

llama_engine() { # llama_engine MODEL THREADS -> "pp tg"
	env "${LLENV[@]}" "$LL/llama-bench" -m "$1" -p 128 -n "$NTOK" -t "$2" -r 1 -o json \
		>"$T/llama.json" 2>/dev/null || return 1
	python3 -c '
import json, sys
pp = tg = None
for r in json.load(open(sys.argv[1])):
    if r["n_prompt"] > 0 and r["n_gen"] == 0: pp = r["avg_ts"]
    if r["n_gen"] > 0 and r["n_prompt"] == 0: tg = r["avg_ts"]
print(pp, tg)' "$T/llama.json"
}

if [ "$WHAT" = engine ] || [ "$WHAT" = all ]; then
	for ty in $TYPES; do model "$ty" >/dev/null; done
	for r in $(seq 1 "$ROUNDS"); do
		for ty in $TYPES; do
			m=$(model "$ty")
			for th in $THREADS; do
				if [ $((r % 2)) = 1 ]; then order="kvd llama"; else order="llama kvd"; fi
				for who in $order; do
					if [ $who = kvd ]; then
						read -r pp tg kern < <(kvd_engine "$m" "$th")
					else
						read -r pp tg < <(llama_engine "$m" "$th")
						kern=-
					fi
					echo "engine round=$r type=$ty threads=$th who=$who pp=$pp tg=$tg kernels=$kern" | tee -a "$T/engine"
				done
			done
		done
	done
	python3 - "$T/engine" <<'EOF'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    d = dict(kv.split("=", 1) for kv in line.split()[1:])
    runs.setdefault((d["type"], d["threads"], d["round"]), {})[d["who"]] = d
def f(x):
    try: return float(x)
    except ValueError: return None
types = []; threads = []
for (ty, th, _) in runs:
    if ty not in types: types.append(ty)
    if th not in threads: threads.append(th)
def stat(v):
    v = [x for x in v if x is not None]
    if not v: return "n/a"
    return "%.2f (%.2f-%.2f)" % (statistics.median(v), min(v), max(v))
print("\nkvd / llama.cpp, per-round ratios: median (min-max) over rounds; tok/s medians")
print("%-6s %3s %-20s %-20s %9s %9s %9s %9s %s" % ("type", "thr", "prefill pp128", "decode tg64",
      "kvd pp", "llama pp", "kvd tg", "llama tg", "kvd kernels"))
for ty in types:
    for th in threads:
        rr = [v for (a, b, _), v in runs.items() if a == ty and b == th and "kvd" in v and "llama" in v]
        if not rr: continue
        ratio = lambda k: [f(v["kvd"][k]) / f(v["llama"][k]) if f(v["kvd"][k]) and f(v["llama"][k]) else None for v in rr]
        med = lambda who, k: statistics.median([f(v[who][k]) for v in rr if f(v[who][k])] or [float("nan")])
        print("%-6s %3s %-20s %-20s %9.1f %9.1f %9.1f %9.1f %s (%d rounds)" % (ty, th, stat(ratio("pp")), stat(ratio("tg")),
              med("kvd", "pp"), med("llama", "pp"), med("kvd", "tg"), med("llama", "tg"),
              rr[0]["kvd"]["kernels"], len(rr)))
EOF
fi

# ---- serve: kvd standalone vs llama-server ---------------------------------
if [ "$WHAT" = serve ] || [ "$WHAT" = all ]; then
	m=$(model "$SERVE_TYPE")
	KPORT=$((32000 + RANDOM % 2000)); LPORT=$((KPORT + 1))
	cat >"$T/sv.ini" <<EOF
[node]
name = cmp
role = standalone
[model]
path = $m
[kv]
pool_tokens = 16384
[engine]
threads = 2
max_batch = 32
[listen]
client = 127.0.0.1:$KPORT
[admin]
socket = $T/cmp.sock
[log]
level = warn
EOF
	"$KVD" --config "$T/sv.ini" >"$T/kvd.log" 2>&1 &
	PIDS+=($!)
	env "${LLENV[@]}" "$LL/llama-server" -m "$m" --port "$LPORT" -t 2 -tb 2 -np 32 -c 8192 \
		--kv-unified --cache-ram 0 --no-cache-prompt >"$T/llama.log" 2>&1 &
	PIDS+=($!)
	for _ in $(seq 1 600); do
		if (exec 3<>"/dev/tcp/127.0.0.1/$KPORT") 2>/dev/null &&
		   python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=1)' \
			"http://127.0.0.1:$LPORT/health" >/dev/null 2>&1; then break; fi
		sleep 0.1
	done
	# one short request each: weights paged in, llama warmed
	python3 "$HERE/loadgen.py" kvd "127.0.0.1:$KPORT" 1 1 128 4 >/dev/null
	python3 "$HERE/loadgen.py" llama "127.0.0.1:$LPORT" 1 1 128 4 >/dev/null
	for c in $CLIENTS; do
		n=$((c * ${KVD_BENCH_REQS_PER_CLIENT:-4})); [ $n -lt 16 ] && n=16
		for r in $(seq 1 "$ROUNDS"); do
			if [ $((r % 2)) = 1 ]; then order="kvd llama"; else order="llama kvd"; fi
			for who in $order; do
				port=$KPORT; [ $who = llama ] && port=$LPORT
				out=$(python3 "$HERE/loadgen.py" $who "127.0.0.1:$port" "$c" "$n" 128 "$NTOK" "$r")
				echo "serve round=$r clients=$c $out" | tee -a "$T/serve"
			done
		done
	done
	python3 - "$T/serve" <<'EOF'
import json, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    head, js = line.split(" {", 1)
    o = json.loads("{" + js)
    d = dict(kv.split("=") for kv in head.split()[1:])
    runs.setdefault((int(d["clients"]), d["round"]), {})[o["kind"]] = o
def stat(v, fmt="%.1f"):
    v = [x for x in v if x is not None]
    if not v: return "n/a"
    return (fmt + " (" + fmt + "-" + fmt + ")") % (statistics.median(v), min(v), max(v))
print("\nserving, 128-token prompts -> up to 64 tokens, 2 threads; median (min-max) over rounds")
print("%4s %-6s %-24s %-26s %-26s %-26s %s" % ("cli", "who", "tok/s", "TTFT p50 ms", "TTFT p99 ms", "inter-token p99 ms", "errors"))
for c in sorted({k[0] for k in runs}):
    rr = [v for (cc, _), v in runs.items() if cc == c and "kvd" in v and "llama" in v]
    for who in ("kvd", "llama"):
        g = lambda f: [f(v[who]) for v in rr]
        print("%4d %-6s %-24s %-26s %-26s %-26s %d" % (c, who, stat(g(lambda o: o["tok_per_s"])),
              stat(g(lambda o: o["ttft_ms"]["p50"])), stat(g(lambda o: o["ttft_ms"]["p99"])),
              stat(g(lambda o: o["itl_ms"]["p99"])), sum(g(lambda o: o["errors"]))))
    ratio = lambda f: [f(v["kvd"]) / f(v["llama"]) if f(v["kvd"]) and f(v["llama"]) else None for v in rr]
    print("%4d %-6s tok/s %s  TTFT p50 %s  TTFT p99 %s  (%d rounds)" % (c, "ratio", stat(ratio(lambda o: o["tok_per_s"]), "%.2f"),
          stat(ratio(lambda o: o["ttft_ms"]["p50"]), "%.2f"), stat(ratio(lambda o: o["ttft_ms"]["p99"]), "%.2f"), len(rr)))
EOF
fi
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
