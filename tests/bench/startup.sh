#!/usr/bin/env bash
# startup.sh - time to ready, kvd vs llama-server, on an ~80 MB and a
# ~400 MB model (issue 11, item 4).
#
#   KVD_BUILD=build tests/bench/startup.sh [ROUNDS]
#
# Models: the 100M llama of the issue (12 layers, dim 768, 12/4 heads, ff
# 2048, vocab 16000) as Q6_K (~82 MB) and F32 (~400 MB), made with
# `kvctl model make` in a temporary directory (or KVD_BENCH_MODELS="A B").
# Each round runs, per model, interleaved:
#   kvd cold    an empty model.fingerprint_cache: the boot hashes the file
#               and repacks the weights into the repack cache there
#   kvd cached  the entries the cold boot wrote: no read of the weights,
#               no repacking (the repack cache file is mapped)
#   llama.cpp   ../shared/tools/llama.cpp/llama-server, when present
# Ready means: kvd logged event=ready (what it tells systemd as READY=1,
# after the capacity check and with every listener up); llama-server
# answered GET /health with 200. Both from process start, polled every
# 5 ms. The model file is in the page cache for all three (the first,
# unmeasured, run reads it): this measures the work, not the disk.
# Prints every run, then median, min-max per model and mode, and the
# median ratio kvd/llama-server. KVD_BENCH_LLAMA_ENV (e.g.
# "OMP_WAIT_POLICY=passive") is llama-server's extra environment. Never
# fails on speed.
set -euo pipefail
: "${KVD_BUILD:?KVD_BUILD must point at the build directory}"
KVD=$KVD_BUILD/kvd
KVCTL=$KVD_BUILD/kvctl
SHARED=${KVD_SHARED:-$(dirname "$0")/../../../shared}
LLAMA=$SHARED/tools/llama.cpp/llama-server
ROUNDS=${1:-${KVD_BENCH_ROUNDS:-5}}
T=$(mktemp -d /tmp/kvd-startup.XXXXXX)
trap 'rm -rf "$T"' EXIT
# private copies: a rebuild during the run cannot swap the binary under it
cp "$KVD" "$KVCTL" "$T/" && KVD=$T/kvd KVCTL=$T/kvctl
[ -x "$LLAMA" ] || { echo "# llama-server absent ($LLAMA): kvd only"; LLAMA=; }

if [ -n "${KVD_BENCH_MODELS:-}" ]; then
	read -r -a MODELS <<<"$KVD_BENCH_MODELS"
else
	MODELS=("$T/m100_q6_k.gguf" "$T/m100_f32.gguf")
	for dt in q6_k f32; do
		"$KVCTL" model make "$T/m100_$dt.gguf" --layers 12 --dim 768 --heads 12 \
			--kv-heads 4 --ff 2048 --vocab 16000 --ctx 4096 --dtype $dt --seed 1 >/dev/null
	done
fi
PORT=$((31000 + RANDOM % 2000))

# run_one MODE MODEL: prints milliseconds to ready
run_one() {
	local mode=$1 m=$2 name
	name=$(basename "$m" .gguf)
	PORT=$((PORT + 1))
	if [ "$mode" = llama ]; then
		python3 - "$LLAMA" "$m" "$PORT" "$T/llama.log" <<'EOF_PY'
import os, subprocess, sys, time, urllib.request
exe, m, port, log = sys.argv[1:5]
t0 = time.monotonic()
env = dict(os.environ)
for kv in os.environ.get("KVD_BENCH_LLAMA_ENV", "").split():
    k, _, v = kv.partition("=")
    env[k] = v
p = subprocess.Popen([exe, "-m", m, "--port", port, "-t", "2", "-tb", "2", "-np", "32",
                      "-c", "8192", "--kv-unified", "--cache-ram", "0", "--no-cache-prompt"],
                     stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env)
ms = None
while time.monotonic() - t0 < 120 and p.poll() is None:
    try:
        if urllib.request.urlopen("http://127.0.0.1:%s/health" % port, timeout=1).status == 200:
            ms = (time.monotonic() - t0) * 1e3
            break
    except Exception:
        pass
    time.sleep(0.005)
p.terminate(); p.wait()
print("%.1f" % ms if ms is not None else "nan")
EOF_PY
		return
	fi
	[ "$mode" = cold ] && rm -rf "$T/fpc_$name"
	cat >"$T/$name.ini" <<EOF_INI
[node]
name = st
role = standalone
[model]
path = $m
fingerprint_cache = $T/fpc_$name
[kv]
pool_tokens = 8192
[engine]
threads = 2
max_batch = 32
[listen]
client = 127.0.0.1:$PORT
[admin]
socket = $T/st.sock
EOF_INI
	python3 - "$KVD" "$T/$name.ini" "$T/kvd.log" <<'EOF_PY'
import subprocess, sys, time
exe, ini, log = sys.argv[1:4]
t0 = time.monotonic()
p = subprocess.Popen([exe, "--config", ini], stdout=open(log, "w"), stderr=subprocess.STDOUT)
ms = None
while time.monotonic() - t0 < 120 and p.poll() is None:
    if b"event=ready" in open(log, "rb").read():
        ms = (time.monotonic() - t0) * 1e3
        break
    time.sleep(0.005)
p.terminate(); p.wait()
print("%.1f" % ms if ms is not None else "nan")
EOF_PY
	grep -q "event=model_fingerprint source=$([ "$mode" = cold ] && echo hash || echo cache)" "$T/kvd.log" ||
		echo "# warning: $mode boot of $name: $(grep -o 'event=model_fingerprint source=[a-z]* lookup=[a-z_]* store=[a-z_-]*' "$T/kvd.log")" >&2
	# the repack cache (gpu/model/prepack.h) lives in the same directory: a
	# cached boot maps it (or has nothing to pack: F32)
	[ "$mode" != cached ] || grep -Eq "event=pack_cache lookup=(hit|none|off) " "$T/kvd.log" ||
		echo "# warning: cached boot of $name: $(grep -o 'event=pack_cache lookup=[a-z_]* store=[a-z_-]*' "$T/kvd.log")" >&2
}

MODES=(cold cached)
[ -n "$LLAMA" ] && MODES+=(llama)
for m in "${MODELS[@]}"; do
	cat "$m" >/dev/null # into the page cache
	echo "# $(basename "$m"): $(stat -c %s "$m") bytes"
	run_one cold "$m" >/dev/null # primes the cache entry (after the racy window)
done
sleep 1.1
for m in "${MODELS[@]}"; do run_one cold "$m" >/dev/null; done # entries stored now
for r in $(seq 1 "$ROUNDS"); do
	for m in "${MODELS[@]}"; do
		# alternate the order round by round (ABC, CBA, ...)
		order=("${MODES[@]}")
		[ $((r % 2)) = 0 ] && order=($(printf '%s\n' "${MODES[@]}" | tac))
		for mode in "${order[@]}"; do
			ms=$(run_one "$mode" "$m")
			echo "run round=$r model=$(basename "$m" .gguf) mode=$mode ms=$ms" | tee -a "$T/runs"
		done
	done
done
python3 - "$T/runs" <<'EOF_PY'
import re, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    d = dict(kv.split("=") for kv in line.split()[1:])
    if re.fullmatch(r"[0-9.]+", d.get("ms", "")):
        runs.setdefault((d["model"], d["mode"]), []).append(float(d["ms"]))
models = sorted({k[0] for k in runs})
print("\n%-14s %-7s %6s %10s %19s %12s" % ("model", "mode", "rounds", "median ms", "range ms", "kvd/llama"))
for m in models:
    ll = runs.get((m, "llama"))
    for mode in ("cold", "cached", "llama"):
        v = runs.get((m, mode))
        if not v:
            continue
        med = statistics.median(v)
        ratio = "%.2f" % (med / statistics.median(ll)) if ll and mode != "llama" else "-"
        print("%-14s %-7s %6d %10.1f %9.1f - %7.1f %12s" % (m, mode, len(v), med, min(v), max(v), ratio))
EOF_PY
