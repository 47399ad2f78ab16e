#!/usr/bin/env bash
# bench_types.sh - prefill and decode tok/s per weight type on a generated
# ~100M llama (12 layers, dim 768, 12 heads / 4 KV heads, ff 2048, vocab
# 16000: `kvctl model make`), through bench_engine --raw, and, when
# $KVD_SHARED/tools/llama.cpp/llama-bench exists, the same file through
# llama-bench (-p 128 -n 64 -t THREADS), the two run in turn round by
# round so machine drift hits both alike.
#
# For each type (f32 f16 q8_0 q4_0 q2_k q3_k q4_k q5_k q6_k q4_k_m) the
# model is written to a temporary directory, benched, and deleted (never
# kept). One warm-up round per type is discarded, then KVD_BENCH_RUNS
# rounds (default 5). Prints per type the median tok/s and the spread
# (min-max over the rounds), and llama-bench's the same way with the
# ratios kvd / llama.cpp of the medians. Never fails on speed; not part of
# the test suite (`meson test --benchmark types`, or run it directly with
# KVD_BUILD set). Knobs: KVD_BENCH_RUNS, KVD_BENCH_THREADS (default 1),
# KVD_BENCH_TYPES (a space-separated subset), KVD_BENCH_LAYERS (default
# 12; fewer for a quick look). At 5 rounds, 1 thread, about 10 minutes on
# a 2-vCPU machine.
#
# The workloads differ in one respect: kvd decodes 64 tokens after the
# 128-token prompt (positions 128..191), llama-bench's tg64 starts from an
# empty context; at these lengths attention is a small share of a step.
set -euo pipefail
: "${KVD_BUILD:?set KVD_BUILD to the meson build directory}"
SHARED=${KVD_SHARED:-$(dirname "$0")/../../../shared}
KVCTL=$KVD_BUILD/kvctl
BENCH=$KVD_BUILD/tests/bench/bench_engine
LLB=$SHARED/tools/llama.cpp/llama-bench
RUNS=${KVD_BENCH_RUNS:-5}
TH=${KVD_BENCH_THREADS:-1}
LAYERS=${KVD_BENCH_LAYERS:-12}
TYPES=${KVD_BENCH_TYPES:-f32 f16 q8_0 q4_0 q2_k q3_k q4_k q5_k q6_k q4_k_m}

for x in "$KVCTL" "$BENCH"; do
	[ -x "$x" ] || { echo "bench_types: $x not built" >&2; exit 77; }
done
case $RUNS in ''|*[!0-9]*) echo "bench_types: KVD_BENCH_RUNS must be a number" >&2; exit 2;; esac
case $TH in ''|*[!0-9]*) echo "bench_types: KVD_BENCH_THREADS must be a number" >&2; exit 2;; esac
[ "$RUNS" -ge 1 ] || { echo "bench_types: KVD_BENCH_RUNS >= 1" >&2; exit 2; }
HAVE_LLB=0
if [ -x "$LLB" ] && "$LLB" --help >/dev/null 2>&1; then
	HAVE_LLB=1
else
	echo "bench_types: no runnable $LLB; kvd figures only"
fi

T=$(mktemp -d /tmp/kvd-bench-types.XXXXXX)
trap 'rm -rf "$T"' EXIT

# "median min-max" of the numbers on stdin (one a line)
stats() {
	sort -g | awk '{ v[NR] = $1 } END {
		if (NR == 0) { print "- -"; exit }
		m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
		printf "%.1f %.1f-%.1f\n", m, v[1], v[NR] }'
}

# llama-bench -o jsonl: the avg_ts of the line whose n_prompt (pp) or
# n_gen (tg) is non-zero
llb_ts() { # FILE pp|tg
	local key=n_prompt
	[ "$2" = tg ] && key=n_gen
	sed -n "s/.*\"$key\": \\([1-9][0-9]*\\),.*\"avg_ts\": \\([0-9.]*\\),.*/\\2/p" "$1" |
		head -1
}

printf 'weight types, generated llama (%s layers, dim 768, 12/4 heads, ff 2048, vocab 16000)\n' "$LAYERS"
printf '%s thread(s), prompt 128, decode 64; median and min-max of %s rounds (tok/s)\n' "$TH" "$RUNS"
printf '%-7s %7s | %-20s %-20s' type MiB "kvd prefill" "kvd decode"
[ $HAVE_LLB = 1 ] && printf ' | %-20s %-20s %6s %6s' "llama.cpp pp128" "llama.cpp tg64" "pp x" "tg x"
printf '\n'
for ty in $TYPES; do
	M=$T/m_$ty.gguf
	if ! "$KVCTL" model make "$M" --layers "$LAYERS" --dim 768 --heads 12 --kv-heads 4 \
		--ff 2048 --vocab 16000 --ctx 2048 --dtype "$ty" >"$T/make.log" 2>&1; then
		echo "$ty: kvctl model make failed: $(tail -1 "$T/make.log")"
		continue
	fi
	: >"$T/kvd"; : >"$T/llb_pp"; : >"$T/llb_tg"
	for r in $(seq 0 "$RUNS"); do
		"$BENCH" --model "$M" --raw 1 --threads "$TH" >"$T/one" 2>"$T/err" ||
			{ echo "$ty: bench_engine failed: $(tail -1 "$T/err")"; break; }
		[ "$r" -gt 0 ] && cat "$T/one" >>"$T/kvd"
		if [ $HAVE_LLB = 1 ]; then
			"$LLB" -m "$M" -p 128 -n 64 -t "$TH" -r 1 --no-warmup -o jsonl \
				>"$T/llb.json" 2>"$T/err" ||
				{ echo "$ty: llama-bench failed: $(tail -1 "$T/err")"; HAVE_LLB=0; continue; }
			if [ "$r" -gt 0 ]; then
				llb_ts "$T/llb.json" pp >>"$T/llb_pp"
				llb_ts "$T/llb.json" tg >>"$T/llb_tg"
			fi
		fi
	done
	mib=$(( $(stat -c %s "$M") / 1048576 ))
	read -r kp kps < <(awk '{ print $1 }' "$T/kvd" | stats)
	read -r kd kds < <(awk '{ print $2 }' "$T/kvd" | stats)
	printf '%-7s %7s | %-20s %-20s' "$ty" "$mib" "$kp ($kps)" "$kd ($kds)"
	if [ $HAVE_LLB = 1 ] && [ -s "$T/llb_pp" ]; then
		read -r lp lps < <(stats <"$T/llb_pp")
		read -r lt lts < <(stats <"$T/llb_tg")
		printf ' | %-20s %-20s %6s %6s' "$lp ($lps)" "$lt ($lts)" \
			"$(awk -v a="$kp" -v b="$lp" 'BEGIN { printf "%.2f", a / b }')" \
			"$(awk -v a="$kd" -v b="$lt" 'BEGIN { printf "%.2f", a / b }')"
	fi
	printf '\n'
	rm -f "$M"
done
