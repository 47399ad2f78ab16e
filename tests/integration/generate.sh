#!/usr/bin/env bash
# `kvd generate` end to end: the golden greedy output of stories260K
# (prompt_ids and output_ids exactly, any thread count and page size),
# readable streamed text, a generated model in every weight type, and the
# typed refusals (prompt too long, usage).
. "$(dirname "$0")/lib.sh"
M=$(shared_model)
G=${KVD_SHARED}/models/golden.json
command -v python3 >/dev/null || { echo "skip: python3 absent"; exit 77; }
"$KVD" generate --help >/dev/null 2>&1 || { echo "skip: this kvd has no generate command"; exit 77; }

# compare JSON_OUTPUT: prompt_ids and output_ids equal golden.json's case
golden_eq() {
	python3 - "$G" "$1" <<'EOF'
import json, sys
case = [c for c in json.load(open(sys.argv[1]))["cases"] if c["model"] == "stories260K.gguf"][0]
got = json.load(open(sys.argv[2]))
ok = got["prompt_ids"] == case["prompt_ids"] and got["output_ids"] == case["output_ids"] \
     and got["finish_reason"] in ("length", "stop") and got["text"] == case["output_text"]
if not ok:
    print("want", case["prompt_ids"], case["output_ids"], file=sys.stderr)
    print("got ", got, file=sys.stderr)
sys.exit(0 if ok else 1)
EOF
}

PROMPT=$(python3 -c 'import json,sys; print([c for c in json.load(open(sys.argv[1]))["cases"] if c["model"]=="stories260K.gguf"][0]["prompt"])' "$G")
NTOK=$(python3 -c 'import json,sys; print([c for c in json.load(open(sys.argv[1]))["cases"] if c["model"]=="stories260K.gguf"][0]["max_tokens"])' "$G")

for v in "1 16" "2 1" "2 64"; do
	set -- $v
	"$KVD" generate --model "$M" --prompt "$PROMPT" --max-tokens "$NTOK" \
		--threads "$1" --page-tokens "$2" --json >"$T/g.json"
	check "golden greedy output, threads $1 page_tokens $2" golden_eq "$T/g.json"
done

"$KVD" generate --model "$M" --prompt "$PROMPT" --max-tokens 60 >"$T/text.txt"
check "streamed text is readable" grep -q "Lily" "$T/text.txt"

# the same seed gives the same sampled tokens at 1 and 2 threads
"$KVD" generate --model "$M" --prompt "$PROMPT" --max-tokens 40 --temperature 0.8 \
	--top-k 40 --top-p 0.9 --seed 7 --threads 1 --json >"$T/s1.json"
"$KVD" generate --model "$M" --prompt "$PROMPT" --max-tokens 40 --temperature 0.8 \
	--top-k 40 --top-p 0.9 --seed 7 --threads 2 --page-tokens 3 --kv-dtype f32 --json >"$T/s2.json"
check "sampled output independent of threads and pages" cmp -s "$T/s1.json" "$T/s2.json"

for dt in f32 f16 q8_0 q4_0 q2_k q3_k q4_k q5_k q6_k q4_k_m; do
	dim=64 ff=128
	case $dt in q*_k*) dim=256 ff=256 ;; esac # whole 256-weight blocks
	"$KVCTL" model make "$T/m_$dt.gguf" --layers 2 --dim $dim --heads 4 --kv-heads 2 \
		--ff $ff --vocab 512 --dtype "$dt" --seed 3 >/dev/null
	set +e
	"$KVD" generate --model "$T/m_$dt.gguf" --prompt "hello kvd" --max-tokens 8 \
		--kv-dtype f16 --json >"$T/m_$dt.json"
	rc=$?
	set -e
	check "generated $dt model runs (rc=$rc)" python3 -c '
import json, sys
o = json.load(open(sys.argv[1]))
sys.exit(0 if len(o["prompt_ids"]) > 0 and 0 < len(o["output_ids"]) <= 8 else 1)' "$T/m_$dt.json"
done

set +e
out=$("$KVD" generate --model "$M" --prompt "$PROMPT" --max-tokens 5000 2>&1 >/dev/null)
rc=$?
"$KVD" generate --prompt x >/dev/null 2>&1
rc_usage=$?
set -e
check "prompt + max tokens beyond the context is refused (rc=$rc)" \
	bash -c '[ "$1" -eq 1 ] && grep -q "prompt too long" <<<"$2"' _ "$rc" "$out"
check "missing --model is a usage error (rc=$rc_usage)" test "$rc_usage" -eq 64

finish
