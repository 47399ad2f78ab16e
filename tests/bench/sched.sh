#!/usr/bin/env bash
# sched.sh - the scheduler under load (issue 11, item 3): TTFT p50/p99 and
# inter-token p99, standalone vs a prefill+decode pair, at 8 and 32 clients.
#
#   KVD_BUILD=build tests/bench/sched.sh
#
# Setups (all up at once, idle while another is measured; the order of the
# setups is reversed every other round), KVD_BENCH_SETUPS (default
# "standalone pair hybrid100_c32 hybrid100_c32_s15"):
#   standalone  one node, engine.threads 2
#   pair        prefill + decode, engine.threads 1 each, pinned to CPU 0
#               and CPU 1 (taskset) when there are two CPUs or more, the
#               defaults: a prefill node's engine.step_tokens = 0 means 128
#               tokens per step with no per-prompt chunk limit (the oldest
#               prompts whole); every prompt goes to the peer
#   pair96      the pair with the prefill node's engine.step_tokens = 96,
#               prefill_chunk = 64 (96-token slices, what it did before)
#   hybridNN    the pair with the decode node's peers.local_prefill =
#               NN (conditional disaggregation, daemon/node/place.h: it computes
#               a prompt itself when the peer's queue is the longer wait)
# Options after the name, each "_X", set the engine of the standalone node
# or the pair's decode node: _cK prefill_chunk = K, _sMS step_ms = MS,
# _tN step_tokens = N (e.g. hybrid100_c32_s20, standalone_s20); _pN sets
# the pair's prefill node's step_tokens = prefill_chunk = N. Plain
# "standalone" is always run.
# Per run it also prints each node's CPU seconds (/proc, all threads): the
# summary's "CPU busy" is that over the run's wall time (100 = one CPU), so
# a setup that leaves a CPU idle shows it.
# Load: loadgen.py (closed loop, client clock), 128-token distinct prompts,
# KVD_BENCH_MAX_TOKENS (32) tokens out greedy, KVD_BENCH_PER_CLIENT (2) x
# clients requests per run (at least 16). KVD_BENCH_LOG sets the nodes'
# log.level (warn; debug logs every engine step) and KVD_BENCH_KEEP=DIR
# keeps the nodes' logs and configs and the raw runs there. Model: KVD_BENCH_MODEL, or a generated 4-layer, dim-512
# Q8_0 llama with a 16000-token vocabulary. KVD_BENCH_ROUNDS (2),
# KVD_BENCH_CLIENTS ("8 32"). Prints median (min-max) over rounds; never
# fails on speed.
set -euo pipefail
: "${KVD_BUILD:?KVD_BUILD must point at the build directory}"
HERE=$(cd "$(dirname "$0")" && pwd)
ROUNDS=${KVD_BENCH_ROUNDS:-2}
CLIENTS=${KVD_BENCH_CLIENTS:-8 32}
NTOK=${KVD_BENCH_MAX_TOKENS:-32}
T=$(mktemp -d /tmp/kvd-sched.XXXXXX)
PIDS=()
cleanup() {
	local p
	for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	if [ -n "${KVD_BENCH_KEEP:-}" ]; then mkdir -p "$KVD_BENCH_KEEP"; cp "$T"/*.log "$T"/*.ini "$T/runs" "$KVD_BENCH_KEEP/" 2>/dev/null || true; fi
	rm -rf "$T"
}
trap cleanup EXIT
cp "$KVD_BUILD/kvd" "$KVD_BUILD/kvctl" "$T/"
KVD=$T/kvd
M=${KVD_BENCH_MODEL:-}
if [ -z "$M" ]; then
	M=$T/m.gguf
	"$T/kvctl" model make "$M" --layers 4 --dim 512 --heads 8 --kv-heads 4 --ff 1536 \
		--vocab 16000 --ctx 2048 --dtype q8_0 --seed 5 >/dev/null
fi
PIN0=() PIN1=()
if command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then
	PIN0=(taskset -c 0) PIN1=(taskset -c 1)
fi
echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) CPUs; rounds $ROUNDS; model $(basename "$M")"
PORT=$((34000 + RANDOM % 2000))

node() { # node NAME ROLE THREADS [key=value ...] (after [listen]/[peers] lines in LISTEN)
	local name=$1 role=$2 th=$3; shift 3
	{
		printf '[node]\nname = %s\nrole = %s\n[model]\npath = %s\n' "$name" "$role" "$M"
		printf '[kv]\npool_tokens = 32768\ndtype = f16\n'
		printf '[engine]\nthreads = %s\nmax_batch = 32\n' "$th"
		for kv in "$@"; do printf '%s\n' "$kv"; done
		printf '[admin]\nsocket = %s/%s.sock\n[log]\nlevel = %s\n' "$T" "$name" "${KVD_BENCH_LOG:-warn}"
	} >"$T/$name.ini"
}
declare -A NPID
start() { # start NAME [pin...]
	local name=$1; shift
	"$@" "$KVD" --config "$T/$name.ini" >"$T/$name.log" 2>&1 &
	PIDS+=($!)
	NPID[$name]=$!
}
cpu_ticks() { # cpu_ticks PID: user + system clock ticks so far
	local f
	read -r -a f <"/proc/$1/stat"
	echo $((f[13] + f[14]))
}

declare -A CP NODES
# opts SPEC: the engine lines of a setup's _options (after the base name):
# cK prefill_chunk = K, sMS step_ms = MS, tN step_tokens = N
opts() {
	local o
	for o in $(tr _ ' ' <<<"$1"); do
		case $o in
		c[0-9]*) echo "prefill_chunk = ${o#c}" ;;
		s[0-9]*) echo "step_ms = ${o#s}" ;;
		t[0-9]*) echo "step_tokens = ${o#t}" ;;
		p[0-9]*) ;;   # the prefill node's (below)
		*) echo "sched.sh: unknown option $o" >&2; return 2 ;;
		esac
	done
}
SETUPS=(${KVD_BENCH_SETUPS:-standalone pair hybrid100_c32 hybrid100_c32_s15})
[[ " ${SETUPS[*]} " == *" standalone "* ]] || SETUPS=(standalone "${SETUPS[@]}")
k=1
for setup in "${SETUPS[@]}"; do
	base=${setup%%_*} spec=""
	[ "$base" != "$setup" ] && spec=${setup#*_}
	mapfile -t eng < <(opts "$spec")
	pp=$((PORT + k)); cp=$((PORT + k + 1)); k=$((k + 2))
	CP[$setup]=$cp
	if [ "$base" = standalone ]; then
		# unpinned, both CPUs: the reference
		nd=sa; [ "$setup" != standalone ] && nd="sa_$spec"
		NODES[$setup]=$nd
		node "$nd" standalone 2 "${eng[@]}" "[listen]" "client = 127.0.0.1:$cp"
		start "$nd"
		continue
	fi
	pextra=() dpeers=()
	# _pN: the prefill node's step_tokens = prefill_chunk = N
	for o in $(tr _ ' ' <<<"$spec"); do
		case $o in p[0-9]*) pextra=("step_tokens = ${o#p}" "prefill_chunk = ${o#p}") ;; esac
	done
	case $base in
	pair) ;;
	pair96) pextra=("step_tokens = 96" "prefill_chunk = 64") ;;
	hybrid[0-9]*)   # decode's peers.local_prefill = NN
		dpeers=("local_prefill = ${base#hybrid}") ;;
	*) echo "sched.sh: unknown setup $setup" >&2; exit 2 ;;
	esac
	NODES[$setup]="p_$setup d_$setup"
	node "p_$setup" prefill 1 "${pextra[@]}" "[listen]" "peer = 127.0.0.1:$pp"
	node "d_$setup" decode 1 "${eng[@]}" "[listen]" "client = 127.0.0.1:$cp" \
		"[peers]" "prefill = 127.0.0.1:$pp" "${dpeers[@]}"
	start "p_$setup" "${PIN0[@]}"
	start "d_$setup" "${PIN1[@]}"
done
for _ in $(seq 1 600); do
	ok=1
	for s in "${!CP[@]}"; do (exec 3<>"/dev/tcp/127.0.0.1/${CP[$s]}") 2>/dev/null || ok=0; done
	[ $ok = 1 ] && break
	sleep 0.1
done
# every setup answers one request before the clock starts
for s in "${SETUPS[@]}"; do
	for i in $(seq 1 100); do
		out=$(python3 "$HERE/loadgen.py" kvd "127.0.0.1:${CP[$s]}" 1 1 128 2)
		grep -q '"errors": 0' <<<"$out" && break
		if [ "$i" = 100 ]; then
			echo "sched.sh: $s does not answer: $out" >&2
			tail -n 5 "$T"/*.log >&2
			exit 1
		fi
		sleep 0.2
	done
done
REV=()
for ((i = ${#SETUPS[@]} - 1; i >= 0; i--)); do REV+=("${SETUPS[i]}"); done
for c in $CLIENTS; do
	n=$((c * ${KVD_BENCH_PER_CLIENT:-2})); [ $n -lt 16 ] && n=16
	for r in $(seq 1 "$ROUNDS"); do
		order=("${SETUPS[@]}")
		[ $((r % 2)) = 0 ] && order=("${REV[@]}")
		for s in "${order[@]}"; do
			read -r -a nodes <<<"${NODES[$s]}"
			declare -A c0=()
			for nd in "${nodes[@]}"; do c0[$nd]=$(cpu_ticks "${NPID[$nd]}"); done
			out=$(python3 "$HERE/loadgen.py" kvd "127.0.0.1:${CP[$s]}" "$c" "$n" 128 "$NTOK" "$r")
			# each node's CPU seconds over the run (user + system, all threads)
			cpu=""
			for nd in "${nodes[@]}"; do
				cpu+=" cpu_${nd%%_*}=$(( $(cpu_ticks "${NPID[$nd]}") - c0[$nd] ))"
			done
			echo "sched round=$r clients=$c setup=$s hz=$(getconf CLK_TCK)$cpu $out" | tee -a "$T/runs"
		done
	done
done
python3 - "$T/runs" "${SETUPS[@]}" <<'EOF'
import json, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    head, js = line.split(" {", 1)
    o = json.loads("{" + js)
    d = dict(kv.split("=") for kv in head.split()[1:])
    o["cpu"] = {k[4:]: int(x) / int(d["hz"]) for k, x in d.items() if k.startswith("cpu_")}
    runs.setdefault((int(d["clients"]), d["setup"]), []).append(o)
def stat(v):
    v = [x for x in v if x is not None]
    return "%.1f (%.1f-%.1f)" % (statistics.median(v), min(v), max(v)) if v else "n/a"
print("\nmedian (min-max) over rounds; ms unless noted")
print("%4s %-11s %-22s %-24s %-24s %-24s %-26s %-18s %s" % ("cli", "setup", "tok/s", "TTFT p50", "TTFT p99", "inter-token p99", "CPU busy % (prefill/decode)", "CPU ms/request", "errors"))
for (c, s) in sorted(runs, key=lambda k: (k[0], sys.argv[2:].index(k[1]))):
    v = runs[(c, s)]
    # a node's CPU time over the run's wall time: 100 = one CPU all the time
    busy = []
    for node in ("sa",) if s.startswith("standalone") else ("p", "d"):
        b = [100.0 * o["cpu"][node] / o["wall_s"] for o in v]
        busy.append("%.0f" % statistics.median(b))
    # all the setup's nodes' CPU time per request: what the work costs,
    # steadier than wall-clock figures on a shared machine
    cost = stat([1e3 * sum(o["cpu"].values()) / o["requests"] for o in v if o["requests"]])
    print("%4d %-11s %-22s %-24s %-24s %-24s %-26s %-18s %d (%d rounds)" % (c, s, stat([o["tok_per_s"] for o in v]),
          stat([o["ttft_ms"]["p50"] for o in v]), stat([o["ttft_ms"]["p99"] for o in v]),
          stat([o["itl_ms"]["p99"] for o in v]), "/".join(busy), cost, sum(o["errors"] for o in v), len(v)))
EOF
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
