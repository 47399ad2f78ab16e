#!/usr/bin/env bash
# startup_gen.sh - one-token `kvd generate` wall time and peak RSS, with
# and without the repack cache (gpu/model/prepack.h), next to llama-simple
# (issue 11, item 4).
#
#   KVD_BUILD=build tests/bench/startup_gen.sh [ROUNDS]
#
# Models: the issue's 100M llama (12 layers, dim 768, 12/4 heads, ff 2048,
# vocab 16000; Q6_K ~82 MB, Q4_0 ~57 MB) and a 480M one (24 layers, dim
# 1024, 16/4 heads, ff 4096, vocab 32000; Q6_K ~354 MB), made with `kvctl
# model make` (or KVD_BENCH_MODELS="A B"). Per round and model, in an
# order that alternates round by round:
#   nocache  no --cache-dir: every start repacks into private memory
#   cold     --cache-dir of an emptied directory: hash, pack, write, fsync
#   cached   --cache-dir as the cold run left it: nothing hashed or packed
#   llama    ../shared/tools/llama.cpp/llama-simple -n 1, when present
# Every run: `kvd generate --prompt hello --max-tokens 1 --threads 2`,
# wall time and maximum RSS from /usr/bin/time (RSS counts the mapped
# pages touched, the cache file's page-cache pages included). Models are
# in the page cache (read once before). Prints every run, then per model
# and mode median and min-max. Never fails on speed.
set -euo pipefail
: "${KVD_BUILD:?KVD_BUILD must point at the build directory}"
SHARED=${KVD_SHARED:-$(dirname "$0")/../../../shared}
LLAMA=$SHARED/tools/llama.cpp/llama-simple
ROUNDS=${1:-${KVD_BENCH_ROUNDS:-5}}
[ -x /usr/bin/time ] || { echo "# /usr/bin/time absent"; exit 77; }
T=$(mktemp -d /tmp/kvd-startgen.XXXXXX)
trap 'rm -rf "$T"' EXIT
cp "$KVD_BUILD/kvd" "$KVD_BUILD/kvctl" "$T/"
KVD=$T/kvd
[ -x "$LLAMA" ] || { echo "# llama-simple absent ($LLAMA): kvd only"; LLAMA=; }
if [ -n "${KVD_BENCH_MODELS:-}" ]; then
	read -r -a MODELS <<<"$KVD_BENCH_MODELS"
else
	MODELS=("$T/m100_q6_k.gguf" "$T/m100_q4_0.gguf" "$T/m480_q6_k.gguf")
	for dt in q6_k q4_0; do
		"$T/kvctl" model make "$T/m100_$dt.gguf" --layers 12 --dim 768 --heads 12 \
			--kv-heads 4 --ff 2048 --vocab 16000 --ctx 4096 --dtype $dt --seed 1 >/dev/null
	done
	"$T/kvctl" model make "$T/m480_q6_k.gguf" --layers 24 --dim 1024 --heads 16 \
		--kv-heads 4 --ff 4096 --vocab 32000 --ctx 4096 --dtype q6_k --seed 1 >/dev/null
	sleep 1.1 # past the fingerprint cache's racy window
fi

# run_one MODE MODEL: prints "SECONDS KB"
run_one() {
	local mode=$1 m=$2 name args=()
	name=$(basename "$m" .gguf)
	case $mode in
	llama)
		/usr/bin/time -f "%e %M" -o "$T/time" "$LLAMA" -m "$m" -n 1 hello >/dev/null 2>&1 ;;
	*)
		[ "$mode" = cold ] && rm -rf "$T/c_$name"
		[ "$mode" = nocache ] || args=(--cache-dir "$T/c_$name")
		/usr/bin/time -f "%e %M" -o "$T/time" "$KVD" generate --model "$m" --prompt hello \
			--max-tokens 1 --threads 2 --json "${args[@]}" >"$T/out.json"
		want=$(case $mode in nocache) echo off ;; cold) echo absent ;; cached) echo hit ;; esac)
		grep -q "\"lookup\":\"$want\"" "$T/out.json" ||
			echo "# warning: $mode run of $name: $(grep -o '"pack_cache":{[^}]*}' "$T/out.json")" >&2 ;;
	esac
	tail -n 1 "$T/time"
}

MODES=(nocache cold cached)
[ -n "$LLAMA" ] && MODES+=(llama)
for m in "${MODELS[@]}"; do
	cat "$m" >/dev/null
	echo "# $(basename "$m"): $(stat -c %s "$m") bytes"
	run_one cold "$m" >/dev/null # warms binaries and the fingerprint entry
done
for r in $(seq 1 "$ROUNDS"); do
	for m in "${MODELS[@]}"; do
		order=("${MODES[@]}")
		[ $((r % 2)) = 0 ] && order=($(printf '%s\n' "${MODES[@]}" | tac))
		for mode in "${order[@]}"; do
			read -r s kb < <(run_one "$mode" "$m")
			echo "run round=$r model=$(basename "$m" .gguf) mode=$mode s=$s rss_kb=$kb" | tee -a "$T/runs"
		done
	done
done
python3 - "$T/runs" <<'EOF_PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    d = dict(kv.split("=") for kv in line.split()[1:])
    runs.setdefault((d["model"], d["mode"]), []).append((float(d["s"]), int(d["rss_kb"]) / 1024))
print("\n%-12s %-8s %6s %9s %15s %10s %15s" % ("model", "mode", "rounds", "median s", "range s", "RSS MB", "range MB"))
for m in sorted({k[0] for k in runs}):
    for mode in ("nocache", "cold", "cached", "llama"):
        v = runs.get((m, mode))
        if not v:
            continue
        s = [x[0] for x in v]; r = [x[1] for x in v]
        print("%-12s %-8s %6d %9.2f %6.2f - %6.2f %10.0f %6.0f - %6.0f" % (m, mode, len(v),
              statistics.median(s), min(s), max(s), statistics.median(r), min(r), max(r)))
EOF_PY
