#!/usr/bin/env bash
# cache_tenants.sh - issue 21.6: the prefix cache under a multi-tenant load,
# kvd with the cache vs kvd without vs llama-server with its prompt cache,
# interleaved in one run (the order rotates per round).
#
#   KVD_BUILD=build tests/bench/cache_tenants.sh
#
# Load (cache_tenants.py): 4 tenants, each with its own SYS-token system
# prompt (default 1024), CLIENTS closed-loop clients (default 32) with short
# distinct user turns (8 ids), MAX_TOKENS 16, streamed, through HTTP (kvd:
# /v1/completions with each tenant's API key; llama-server: /completion,
# cache_prompt true). Then the cross-tenant probe on the idle server: 5
# times, tenant 0 sends a fresh prefix, another tenant guesses it right
# and then sends a wrong guess of the same length (llama-server has no
# tenants: any client). Prints
# throughput, TTFT p50/p99 and the right/wrong latency ratio per server and
# round. Never fails on speed.
#
# Model: KVD_BENCH_MODEL, else the issue's 100M Q8_0 llama (12 layers, dim
# 768, 12/4 heads, ff 2048, vocab 16000) from `kvctl model make`.
# Environment: KVD_BENCH_ROUNDS (1), KVD_BENCH_CLIENTS (32),
# KVD_BENCH_REQUESTS (2 x clients), KVD_BENCH_SYS (1024), KVD_BENCH_THREADS
# (2), KVD_BENCH_LLAMA_ENV (e.g. OMP_WAIT_POLICY=passive). llama-server
# comes from ../shared/tools/llama.cpp (skipped when absent).
set -euo pipefail
: "${KVD_BUILD:?KVD_BUILD must point at the build directory}"
HERE=$(cd "$(dirname "$0")" && pwd)
SHARED=${KVD_SHARED:-$HERE/../../../shared}
LL=$SHARED/tools/llama.cpp/llama-server
KVD=$KVD_BUILD/kvd
KVCTL=$KVD_BUILD/kvctl
ROUNDS=${KVD_BENCH_ROUNDS:-1}
CLIENTS=${KVD_BENCH_CLIENTS:-32}
REQS=${KVD_BENCH_REQUESTS:-$((2 * CLIENTS))}
SYS=${KVD_BENCH_SYS:-1024}
THREADS=${KVD_BENCH_THREADS:-2}
read -r -a LLENV <<<"${KVD_BENCH_LLAMA_ENV:-}"
T=$(mktemp -d /tmp/kvd-cache-bench.XXXXXX)
PIDS=()
cleanup() {
	local p
	for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$T"
}
trap cleanup EXIT
M=${KVD_BENCH_MODEL:-}
if [ -z "$M" ]; then
	M=$T/m.gguf
	"$KVCTL" model make "$M" --layers 12 --dim 768 --heads 12 --kv-heads 4 \
		--ff 2048 --vocab 16000 --ctx 4096 --dtype q8_0 --seed 21 >/dev/null
fi
KEYS=""
for t in t0 t1 t2 t3 prober; do
	k="$t-$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')"
	printf '%s %s\n' "$k" "$t" >>"$T/keys"
	KEYS="$KEYS${KEYS:+,}$k"
done
chmod 600 "$T/keys"
PORT=$((30000 + RANDOM % 20000))
node() { # node NAME HTTP_PORT CACHE(on|off)
	cat >"$T/$1.ini" <<EOI
[node]
name = $1
role = standalone
[model]
path = $M
[kv]
pool_tokens = 65536
dtype = f16
[engine]
threads = $THREADS
max_batch = 32
[cache]
enabled = $3
[listen]
http = 127.0.0.1:$2
[http]
api_keys_file = $T/keys
[admin]
socket = $T/$1.sock
[log]
level = warn
EOI
	"$KVD" --config "$T/$1.ini" >"$T/$1.log" 2>&1 &
	PIDS+=($!)
}
node kvd_cache $((PORT + 1)) on
node kvd_nocache $((PORT + 2)) off
SERVERS="kvd_cache kvd_nocache"
if [ -x "$LL" ]; then
	env "${LLENV[@]}" "$LL" -m "$M" --port $((PORT + 3)) -t "$THREADS" -tb "$THREADS" \
		-np "$CLIENTS" -c $(( (SYS + 64) * CLIENTS )) --kv-unified >"$T/llama.log" 2>&1 &
	PIDS+=($!)
	SERVERS="$SERVERS llama"
else
	echo "# llama-server absent ($LL): kvd only"
fi
port_of() { case $1 in kvd_cache) echo $((PORT + 1));; kvd_nocache) echo $((PORT + 2));; llama) echo $((PORT + 3));; esac; }
kind_of() { [ "$1" = llama ] && echo llama || echo kvd; }
for s in $SERVERS; do
	for _ in $(seq 1 1200); do
		(exec 3<>"/dev/tcp/127.0.0.1/$(port_of "$s")") 2>/dev/null && break
		sleep 0.1
	done
done
sleep 1
echo "# load before: $(cut -d' ' -f1-3 /proc/loadavg); clients=$CLIENTS requests=$REQS sys=$SYS threads=$THREADS"
set -- $SERVERS
for r in $(seq 1 "$ROUNDS"); do
	order=("$@")
	for _ in $(seq 2 "$r"); do order=("${order[@]:1}" "${order[0]}"); done
	for s in "${order[@]}"; do
		out=$(python3 "$HERE/cache_tenants.py" "$(kind_of "$s")" "127.0.0.1:$(port_of "$s")" \
			"$CLIENTS" "$REQS" "$SYS" 16 "$r" "$KEYS")
		echo "round=$r server=$s $out" | tee -a "$T/res"
	done
done
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$T/res" <<'EOP'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    head, js = line.split(" {", 1)
    s = head.split("server=")[1]
    rows.setdefault(s, []).append(json.loads("{" + js))
print("| server | req/s | tok/s | TTFT p50 ms | TTFT p99 ms | cross-tenant right/wrong |")
print("| --- | ---: | ---: | ---: | ---: | ---: |")
for s, v in rows.items():
    med = lambda f: statistics.median(f(x) for x in v if f(x) is not None)
    print("| %s | %.2f | %.1f | %.0f | %.0f | %.3f |" % (
        s, med(lambda x: x["req_per_s"]), med(lambda x: x["tok_per_s"]),
        med(lambda x: x["ttft_ms"]["p50"]), med(lambda x: x["ttft_ms"]["p99"]),
        med(lambda x: x["probe"]["ratio"])))
EOP
