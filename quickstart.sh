#!/usr/bin/env bash
# quickstart.sh - from a fresh clone to a streamed generation, in one go:
# install the Debian packages kvd needs, build it, generate a small model
# with `kvctl model make` (or use the GGUF named as $1), make a cluster key
# (`kvctl keygen`), start a prefill and a decode node on loopback that
# prove they hold it before anything else, send one prompt with
# `kvctl generate`, print the streamed text, then the same through the
# OpenAI-compatible HTTP front with curl, last a chat request to
# /v1/chat/completions (the model's chat template, or chatml set with
# model.chat_template when the GGUF has none kvd recognizes), stop both
# nodes.
#
#   bash quickstart.sh [MODEL.gguf] [PROMPT]
#
# Environment: KVD_QS_BUILD (build dir, default build-quickstart),
# KVD_QS_PORT (first of three loopback ports, default 7600; the HTTP
# front listens on the third).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cd "$here"
. "$here/tests/deps.sh"
kvd_install_deps --build

build=${KVD_QS_BUILD:-$here/build-quickstart}
if [ ! -f "$build/build.ninja" ]; then
	meson setup "$build" --buildtype=release -Dfault_points=false >/dev/null
fi
ninja -C "$build" kvd kvctl >/dev/null
KVD=$build/kvd
KVCTL=$build/kvctl

run=$(mktemp -d /tmp/kvd-quickstart.XXXXXX)
pids=()
cleanup() {
	local p
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	rm -rf "$run"
}
trap cleanup EXIT

model=${1:-}
if [ -z "$model" ]; then
	model=$run/quickstart.gguf
	echo "== generating a small model (random weights: expect gibberish text;"
	echo "   pass a real GGUF as \$1 for prose): kvctl model make $model"
	"$KVCTL" model make "$model" --layers 4 --dim 128 --heads 4 --kv-heads 2 \
		--ff 384 --vocab 512 --ctx 1024 --seed 1 --chat-template chatml >/dev/null
fi
# chat needs a template kvd knows: the GGUF's tokenizer.chat_template when
# kvctl recognizes it, else the config sets one (stories260K has none).
# Neither vocabulary has <|im_start|> as a token, so a message could spell
# out a system turn: kvd refuses such a template unless the config accepts
# it (model.chat_template_unsafe), as this demo does; a real chat model's
# vocabulary needs no such line.
chat_cfg="chat_template_unsafe = true\n"
if ! "$KVCTL" model chat "$model" user=hi >/dev/null 2>&1; then
	echo "== $model has no chat template kvd recognizes: decode gets model.chat_template = chatml"
	chat_cfg="${chat_cfg}chat_template = chatml\n"
fi
prompt=${2:-Once upon a time}
port=${KVD_QS_PORT:-7600}
echo "== kvctl keygen $run/cluster.key (the secret both nodes prove they hold)"
"$KVCTL" keygen "$run/cluster.key"

node() { # node NAME ROLE PEERS_LINES MODEL_LINES LISTEN_LINES...
	local name=$1 role=$2 peers=$3 mlines=$4; shift 4
	{
		printf '[node]\nname = %s\nrole = %s\n' "$name" "$role"
		printf '[model]\npath = %s\n%b' "$model" "$mlines"
		printf '[kv]\npool_tokens = 8192\n'
		printf '[admin]\nsocket = %s/%s.sock\n' "$run" "$name"
		printf '%b' "$@"
		printf '[peers]\nkey_file = %s/cluster.key\n%b' "$run" "$peers"
	} >"$run/$name.ini"
	"$KVD" --config "$run/$name.ini" >"$run/$name.log" 2>&1 &
	pids+=($!)
}

echo "== starting prefill (127.0.0.1:$((port + 1))) and decode (127.0.0.1:$port)"
node prefill prefill "" "" "[listen]\npeer = 127.0.0.1:$((port + 1))\n"
node decode decode "prefill = 127.0.0.1:$((port + 1))\n" "$chat_cfg" \
	"[listen]\nclient = 127.0.0.1:$port\nhttp = 127.0.0.1:$((port + 2))\n[http]\nmodel_name = quickstart\n"
for _ in $(seq 1 100); do
	grep -q "event=peer_up" "$run/decode.log" 2>/dev/null && break
	sleep 0.1
done
if ! grep -q "event=peer_up" "$run/decode.log"; then
	echo "quickstart: the nodes did not pair; their logs:" >&2
	cat "$run/prefill.log" "$run/decode.log" >&2
	exit 1
fi
grep -m1 -h "event=kv_capacity" "$run/prefill.log"
grep -m1 -h "event=kv_capacity" "$run/decode.log"

echo "== kvctl generate --server 127.0.0.1:$port --prompt \"$prompt\""
printf '%s' "$prompt"
"$KVCTL" generate --server "127.0.0.1:$port" --prompt "$prompt" --max-tokens 64 \
	--temperature 0.8 --seed 42
echo
# the same request through the OpenAI-compatible HTTP front (loopback
# without http.api_keys_file; with one, add -H "Authorization: Bearer KEY")
qprompt=$(printf '%s' "$prompt" | sed 's/[\\"]/\\&/g')
body=$(printf '{"model":"quickstart","prompt":"%s","max_tokens":64,"temperature":0.8,"seed":42}' "$qprompt")
echo "== curl http://127.0.0.1:$((port + 2))/v1/completions -d '$body'"
curl -sS "http://127.0.0.1:$((port + 2))/v1/completions" \
	-H 'Content-Type: application/json' -d "$body"
echo
# the last step: a chat request, rendered with the model's chat template
body=$(printf '{"model":"quickstart","messages":[{"role":"user","content":"%s"}],"max_tokens":64,"temperature":0.8,"seed":42}' "$qprompt")
echo "== curl http://127.0.0.1:$((port + 2))/v1/chat/completions -d '$body'"
curl -sS --fail-with-body "http://127.0.0.1:$((port + 2))/v1/chat/completions" \
	-H 'Content-Type: application/json' -d "$body"
echo
echo "== done; stopping the nodes"
