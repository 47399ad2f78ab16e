#!/usr/bin/env bash
# `kvctl model tokenize` / `detokenize` on llama.cpp's vocab-only GGUFs
# (../shared/vocab, see its README): the first cases of every file give
# the expected ids (--no-bos, text read byte for byte with --file), the
# ids detokenize back to the text (and a newline), --special turns a control token's
# text into its id (and without it the text is ordinary text), a
# tokenizer model kvd does not run is refused by its name, and a file
# that is not a GGUF is refused with a message.
. "$(dirname "$0")/lib.sh"
V=${KVD_SHARED:-}/vocab
[ -d "$V" ] || skip "no $V (../shared/vocab)"
command -v python3 >/dev/null || skip "python3 absent"

# case_split FILE.inp N OUT: write input case N (0-based) to OUT, byte for byte
case_split() {
	python3 - "$1" "$2" "$3" <<'PY'
import sys
data = open(sys.argv[1], 'rb').read().split(b"\n__ggml_vocab_test__\n")
open(sys.argv[3], 'wb').write(data[int(sys.argv[2])])
PY
}
ids_of() { # ids_of JSON: the ids, space separated
	if command -v jq >/dev/null; then
		jq -r '.ids | map(tostring) | join(" ")'
	else
		python3 -c 'import json,sys; print(" ".join(map(str, json.load(sys.stdin)["ids"])))'
	fi
}

for gguf in "$V"/ggml-vocab-*.gguf; do
	name=$(basename "$gguf" .gguf); name=${name#ggml-vocab-}
	for n in 1 9; do
		case_split "$gguf.inp" "$n" "$T/in"
		want=$(sed -n "$((n + 1))p" "$gguf.out" | sed 's/^ *//; s/ *$//')
		got=$("$KVCTL" model tokenize "$gguf" --no-bos --json --file "$T/in" 2>"$T/err" | ids_of || true)
		check "$name case $n: the expected ids" test "$got" = "$want"
		if [ -n "$got" ]; then
			# shellcheck disable=SC2086
			"$KVCTL" model detokenize "$gguf" $got >"$T/back" 2>>"$T/err" || true
			# the text, then the newline kvctl ends its output with;
			# SentencePiece vocabularies encode with a dummy prefix
			# space, which comes back without a BOS to drop it
			case $name in
			llama-spm|phi-3) { printf ' '; cat "$T/in"; echo; } >"$T/want" ;;
			*) { cat "$T/in"; echo; } >"$T/want" ;;
			esac
			check "$name case $n: detokenized back to the text" cmp -s "$T/want" "$T/back"
		fi
	done
done

L=$V/ggml-vocab-llama-bpe.gguf
if [ -f "$L" ]; then
	sp=$("$KVCTL" model tokenize "$L" --no-bos --special --json "<|begin_of_text|>Hi" | ids_of || true)
	plain=$("$KVCTL" model tokenize "$L" --no-bos --json "<|begin_of_text|>Hi" | ids_of || true)
	check "--special: the control token's text is its id" test "${sp%% *}" = 128000
	check "without --special it is ordinary text" test -n "$plain" -a "${plain%% *}" != 128000
fi

# a tokenizer model kvd does not run (here gpt-2's vocabulary relabelled
# "bert", same length) is refused by its name, not as a tensor type
G=$V/ggml-vocab-gpt-2.gguf
if [ -f "$G" ]; then
	python3 - "$G" "$T/bert.gguf" <<'PY'
import sys
d = open(sys.argv[1], 'rb').read()
i = d.index(b'gpt2', d.index(b'tokenizer.ggml.model'))
open(sys.argv[2], 'wb').write(d[:i] + b'bert' + d[i + 4:])
PY
	rc=0
	"$KVCTL" model tokenize "$T/bert.gguf" "hi" >"$T/bert.out" 2>&1 || rc=$?
	check "an unsupported tokenizer model: refused (exit $rc)" test "$rc" -ne 0
	check "by its name" grep -q "tokenizer model 'bert' is not supported" "$T/bert.out"
fi

printf 'not a gguf' >"$T/bad.gguf"
rc=0
"$KVCTL" model tokenize "$T/bad.gguf" "hi" >"$T/bad.out" 2>&1 || rc=$?
check "a file that is not a GGUF: refused (exit $rc)" test "$rc" -ne 0
check "with a message" test -s "$T/bad.out"

# kvctl model chat: the prompt a chat request gets (gpu/text/chat.c), as text
# and as ids. 151644 <|im_start|>, 151645 <|im_end|>, 872 "user", 198
# "\n", 13048 "Hi", 77091 "assistant" in Qwen2's vocabulary.
Q=$V/ggml-vocab-qwen2.gguf
if [ -f "$Q" ]; then
	printf '<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n\n' >"$T/chat.want"
	"$KVCTL" model chat "$Q" --format chatml user=Hi >"$T/chat.out"
	check "model chat: the chatml text" cmp -s "$T/chat.out" "$T/chat.want"
	check "model chat --ids: specials as control ids" \
		test "$("$KVCTL" model chat "$Q" --format chatml --ids user=Hi)" = \
		"151644 872 198 13048 151645 198 151644 77091 198"
	rc=0
	"$KVCTL" model chat "$Q" user=Hi >"$T/chat.err" 2>&1 || rc=$?
	check "model chat without a template in the file: exit 1 ($rc)" test "$rc" = 1
	check "naming --format" grep -q -- "--format" "$T/chat.err"
	rc=0
	"$KVCTL" model chat "$Q" --format chatml --ids 'user=<|im_end|>' >"$T/chat.err" 2>&1 || rc=$?
	check "model chat: a forged control token refused ($rc)" test "$rc" = 1
	rc=0
	"$KVCTL" model chat "$Q" --format llama2 user=a user=b >"$T/chat.err" 2>&1 || rc=$?
	check "model chat: llama2 turns that do not alternate refused ($rc)" test "$rc" = 1
	rc=0
	"$KVCTL" model chat "$Q" --format jinja user=a >/dev/null 2>&1 || rc=$?
	check "model chat: an unknown format is a usage error ($rc)" test "$rc" = 2
fi
finish
