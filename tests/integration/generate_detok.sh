#!/usr/bin/env bash
# `kvd generate`: a detokenizer error on the prompt's ids ends the run
# with exit 1, naming the id, instead of being overwritten and ignored.
# No input reaches it (the tokenizer's vocabulary and the model's are
# checked equal at open, and the engine refuses an unknown id before the
# prompt is detokenized), so gdb makes the first detok_push return
# -ERANGE. Skips without gdb or where it may not trace.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/serve_lib.sh"
command -v gdb >/dev/null || skip "gdb absent"
gen_model "$T/m.gguf"
run=("$KVD" generate --model "$T/m.gguf" --prompt hello --max-tokens 2)

check "without the fault: a run (exit 0)" quiet "${run[@]}"
# LeakSanitizer cannot run under ptrace: off for the traced run (ASan builds)
ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0 timeout 120 gdb -q -batch -ex 'break detok_push' -ex run -ex 'return (int)-34' \
	-ex continue --args "${run[@]}" >"$T/gdb.out" 2>&1 || true
grep -q "hit Breakpoint 1" "$T/gdb.out" || skip "gdb could not run kvd here: $(tail -n 3 "$T/gdb.out")"
check "detok_push failing on the prompt: exit 1" grep -q "exited with code 01" "$T/gdb.out"
check "the message names the prompt id" \
	grep -q "kvd generate: prompt id [0-9]*: outside the tokenizer's vocabulary" "$T/gdb.out"
finish
