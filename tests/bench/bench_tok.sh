#!/usr/bin/env bash
# bench_tok.sh - tokenizer throughput, kvd next to llama.cpp, same text,
# same ids.
#
# For each vocabulary (default: llama-bpe and qwen2, byte-level BPE with
# their pre-tokenizers, and llama-spm, SentencePiece) from
# $KVD_SHARED/vocab: bench_tok encodes KVD_TOK_MIB MiB (default 1) of mixed
# text (prose, code, digit runs, CJK, Cyrillic, emoji with ZWJ and flags,
# whitespace runs) KVD_TOK_RUNS times (default 5) and reports the median
# MB/s (min-max). When $KVD_SHARED/tools/llama.cpp/llama-server exists, a
# one-layer model carrying that vocabulary (`kvctl model make
# --vocab-from`) is served and the same text is POSTed to /tokenize
# (add_special and parse_special off) KVD_TOK_RUNS times after one
# warm-up; its figure is bytes / wall time of the request, so it includes
# HTTP and JSON (an upper bound on llama.cpp's tokenizer time, and a lower
# bound on its MB/s). The ids of both must be equal ("ids" column).
# Skips (77) without the vocabularies; never fails on speed, exits 1 when
# the ids differ.
set -euo pipefail
: "${KVD_BUILD:?set KVD_BUILD to the meson build directory}"
SHARED=${KVD_SHARED:-$(dirname "$0")/../../../shared}
KVCTL=$KVD_BUILD/kvctl
BT=$KVD_BUILD/tests/bench/bench_tok
SRV=$SHARED/tools/llama.cpp/llama-server
MIB=${KVD_TOK_MIB:-1}
RUNS=${KVD_TOK_RUNS:-5}
VOCABS=${KVD_TOK_VOCABS:-llama-bpe qwen2 llama-spm}
[ -d "$SHARED/vocab" ] || { echo "bench_tok: no $SHARED/vocab"; exit 77; }
[ -x "$BT" ] || { echo "bench_tok: $BT not built"; exit 77; }
case $RUNS$MIB in *[!0-9]*) echo "bench_tok: KVD_TOK_RUNS, KVD_TOK_MIB are numbers" >&2; exit 2;; esac
HAVE_SRV=0
if [ -x "$SRV" ] && command -v curl >/dev/null; then HAVE_SRV=1; fi

T=$(mktemp -d /tmp/kvd-bench-tok.XXXXXX)
SP=
cleanup() {
	[ -n "$SP" ] && kill "$SP" 2>/dev/null && wait "$SP" 2>/dev/null
	rm -rf "$T"
}
trap cleanup EXIT

stats() { # "median min-max" of numbers on stdin
	sort -g | awk '{ v[NR] = $1 } END {
		m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
		printf "%.2f %.2f-%.2f\n", m, v[1], v[NR] }'
}

bad=0
printf 'tokenizer throughput: %s MiB mixed text, %s runs, 1 thread; MB/s median (min-max)\n' "$MIB" "$RUNS"
printf '%-10s %-22s %8s %6s' vocab "kvd MB/s" tokens "B/tok"
[ $HAVE_SRV = 1 ] && printf ' | %-22s %7s %4s' "llama-server MB/s" "kvd x" ids
printf '\n'
for v in $VOCABS; do
	V=$SHARED/vocab/ggml-vocab-$v.gguf
	[ -r "$V" ] || { echo "$v: no $V"; continue; }
	out=$("$BT" "$V" --mib "$MIB" --runs "$RUNS" --ids-out "$T/ids" --json-out "$T/req.json")
	# "X MB/s (A-B), N bytes, M tokens, R bytes/token"
	read -r kmed _ krange nbytes _ ntok _ bpt _ <<<"$out"
	krange=${krange%,}
	printf '%-10s %-22s %8s %6s' "$v" "$kmed $krange" "$ntok" "$bpt"
	if [ $HAVE_SRV = 1 ]; then
		"$KVCTL" model make "$T/m.gguf" --layers 1 --dim 64 --heads 4 --kv-heads 2 \
			--ff 128 --dtype q8_0 --vocab-from "$V" >/dev/null
		port=$((30000 + RANDOM % 20000))
		"$SRV" -m "$T/m.gguf" --port "$port" -t 1 -c 256 >"$T/srv.log" 2>&1 &
		SP=$!
		for _ in $(seq 150); do
			curl -sf "localhost:$port/health" >/dev/null 2>&1 && break
			sleep 0.2
		done
		: >"$T/times"
		for r in $(seq 0 "$RUNS"); do
			t=$(curl -sf -o "$T/resp.json" -w '%{time_total}' \
				-H 'Content-Type: application/json' \
				--data-binary @"$T/req.json" "localhost:$port/tokenize") || t=
			[ -n "$t" ] || { echo " llama-server request failed"; break; }
			[ "$r" -gt 0 ] && awk -v b="$nbytes" -v t="$t" 'BEGIN { print b / 1e6 / t }' >>"$T/times"
		done
		kill "$SP" 2>/dev/null; wait "$SP" 2>/dev/null || true
		SP=
		if [ -s "$T/times" ]; then
			read -r lmed lrange < <(stats <"$T/times")
			lrange="($lrange)"
			sed 's/^{"tokens":\[//; s/\]}$//; s/,/ /g' "$T/resp.json" >"$T/lids"
			same=no
			tr -d '\n' <"$T/ids" | cmp -s - <(tr -d '\n' <"$T/lids") && same=yes
			[ $same = yes ] || bad=1
			printf ' | %-22s %7s %4s' "$lmed $lrange" \
				"$(awk -v a="$kmed" -v b="$lmed" 'BEGIN { printf "%.1f", a / b }')" "$same"
		fi
	fi
	printf '\n'
done
exit $bad
