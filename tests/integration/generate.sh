#!/usr/bin/env bash
# `kvd generate` end to end: the golden greedy output of stories260K
# (prompt_ids and output_ids exactly, any thread count and page size),
# readable streamed text, a generated model in every weight type, the
# --json timings object (counts, consistent rates, threads, the kernel
# variant of every weight type the model has), --prompt-ids and
# --ignore-eos, and the typed refusals (prompt too long, usage, bad ids).
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
# everything but the timings (which differ run to run) is equal
no_timings() { python3 -c 'import json,sys; o=json.load(open(sys.argv[1])); o.pop("timings"); print(json.dumps(o, sort_keys=True))' "$1"; }
check "sampled output independent of threads and pages" \
	test "$(no_timings "$T/s1.json")" = "$(no_timings "$T/s2.json")"

# timings_ok JSON THREADS TYPES: the timings object is there, its counts
# are the output's, its rates agree with its times, and kernels names
# exactly the weight types TYPES (comma list), each with a known variant.
timings_ok() {
	python3 - "$@" <<'EOF_PY'
import json, sys
o = json.load(open(sys.argv[1])); threads = int(sys.argv[2]); types = set(sys.argv[3].split(","))
t = o["timings"]
variants = {"scalar", "avx2", "avx512", "avx512vnni"}
def known(v):
    return all(p in variants for p in v.split("+"))
errs = []
if t["prompt_tokens"] != len(o["prompt_ids"]): errs.append("prompt_tokens")
if t["gen_tokens"] != len(o["output_ids"]): errs.append("gen_tokens")
if not (t["ttft_ms"] > 0): errs.append("ttft_ms")
if abs(t["prompt_tokens_per_s"] - t["prompt_tokens"] / (t["ttft_ms"] / 1e3)) > 0.01 * t["prompt_tokens_per_s"]: errs.append("prompt rate")
if t["gen_tokens"] > 1 and not (t["gen_tokens_per_s"] > 0): errs.append("gen rate")
if t["gen_tokens"] <= 1 and t["gen_tokens_per_s"] is not None: errs.append("gen rate of one token")
if t["threads"] != threads: errs.append("threads")
if set(t["kernels"]) != types or not all(known(v) for v in t["kernels"].values()): errs.append("kernels %r" % t["kernels"])
if errs: print("bad timings:", errs, t, file=sys.stderr)
sys.exit(1 if errs else 0)
EOF_PY
}
check "timings: golden run (f32 stories260K, 2 threads)" timings_ok "$T/g.json" 2 f32
check "timings: sampled run at 1 thread" timings_ok "$T/s1.json" 1 f32

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
	want=$dt
	case $dt in q4_k_m) want=q4_k,q6_k ;; esac # the mix: Q6_K for some tensors
	check "timings: kernels of the $dt model" timings_ok "$T/m_$dt.json" \
		"$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["timings"]["threads"])' "$T/m_$dt.json")" "$want"
done

# --prompt-ids and --ignore-eos: exactly these ids, exactly max-tokens out
IDS=$(python3 -c 'print(",".join(str(3 + i % 500) for i in range(40)))')
"$KVD" generate --model "$T/m_q8_0.gguf" --prompt-ids "$IDS" --max-tokens 12 \
	--ignore-eos --threads 1 --json >"$T/ids.json"
"$KVD" generate --model "$T/m_q8_0.gguf" --prompt-ids "$IDS" --max-tokens 12 \
	--ignore-eos --threads 1 --json --warmup >"$T/ids_w.json"
check "--warmup changes nothing but the timings" \
	test "$(no_timings "$T/ids.json")" = "$(no_timings "$T/ids_w.json")"
check "--prompt-ids: the prompt is those ids, 12 tokens out" python3 -c '
import json, sys
o = json.load(open(sys.argv[1]))
sys.exit(0 if o["prompt_ids"] == [int(x) for x in sys.argv[2].split(",")] and len(o["output_ids"]) == 12 else 1)' "$T/ids.json" "$IDS"
check "timings: --prompt-ids run" timings_ok "$T/ids.json" 1 q8_0
for bad in "1,,2" "1,x" "-1" "1,2," "99999999999"; do
	set +e
	out=$("$KVD" generate --model "$T/m_q8_0.gguf" --prompt-ids "$bad" --json 2>"$T/bad.err")
	rc=$?
	set -e
	check "--prompt-ids '$bad' refused, nothing printed (rc=$rc)" \
		bash -c '[ "$1" -eq 1 ] && [ -z "$2" ] && grep -q "prompt-ids" "$3"' _ "$rc" "$out" "$T/bad.err"
done
set +e
"$KVD" generate --model "$T/m_q8_0.gguf" --prompt-ids 600 --json >/dev/null 2>&1
rc_oov=$?
"$KVD" generate --model "$T/m_q8_0.gguf" --prompt-ids 1 --prompt x --json >/dev/null 2>&1
rc_both=$?
set -e
check "an id outside the vocabulary is refused (rc=$rc_oov)" test "$rc_oov" -eq 1
check "--prompt and --prompt-ids together is a usage error (rc=$rc_both)" test "$rc_both" -eq 64

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
