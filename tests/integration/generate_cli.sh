#!/usr/bin/env bash
# The command lines of `kvctl generate` and `kvd generate`. Every value of
# a request field (--max-tokens, --temperature, --top-k, --top-p, --seed;
# kvctl also --id, --tokens) is read with the bounds the server reads a
# request with (net/PROTOCOL.md s. 1), by both commands alike: a bad one
# is a usage error (kvctl: exit 2, kvd: 64) naming the option and the
# value with the same words, before any connection or model; the bounds
# themselves pass and reach the server as given. --tokens given twice:
# the last wins and the first list is not leaked (valgrind). Memory
# running out while the final event's text is kept (the fault library,
# tests/integration/shim.c) is an error, never exit 0. The server is a
# stand-in on a unix socket that records the request and answers one
# final event.
. "$(dirname "$0")/lib.sh"
command -v python3 >/dev/null || skip "python3 absent"
NONE=unix:$T/nobody.sock     # nobody listens: a value that passes gets 69

# refused OPTION VALUE [kvctl]: kvctl generate exits 2, stderr names both,
# nothing on stdout; and (unless kvctl only) kvd generate exits 64 with
# the same message after its own name
refused() {
	local rc=0
	"$KVCTL" generate --server "$NONE" --prompt hi "$1" "$2" >"$T/out" 2>"$T/err" || rc=$?
	check "$1 '$2': a usage error (exit $rc)" test "$rc" -eq 2
	check "$1 '$2': the message names the option and the value" \
		grep -qF -- "$1 '$2'" "$T/err"
	check "$1 '$2': nothing on stdout" test ! -s "$T/out"
	[ "${3:-}" != kvctl ] || return 0
	rc=0
	"$KVD" generate --model "$T/none.gguf" --prompt hi "$1" "$2" >"$T/out" 2>"$T/kerr" || rc=$?
	check "kvd generate $1 '$2': a usage error (exit $rc)" test "$rc" -eq 64
	check "kvd generate $1 '$2': kvctl's message" \
		test "$(sed 's/^kvd generate: //' "$T/kerr")" = "$(sed 's/^kvctl generate: //' "$T/err")"
}
for v in abc "" -1 5x " 5" +5 0x10 0 1048577 99999999999999999999; do refused --max-tokens "$v"; done
for v in x -1 100.5 1e3 nan inf 0x1p3 "1 " ""; do refused --temperature "$v"; done
for v in 0 -0.5 1.5 1e-50 x; do refused --top-p "$v"; done
for v in abc -1 4294967296 1.5; do refused --top-k "$v"; done
for v in abc -1 18446744073709551616 0x10; do refused --seed "$v"; done
for v in abc -1 18446744073709551616; do refused --id "$v" kvctl; done
for v in 21 -1 x "" 1.5; do refused --logprobs "$v"; done
for v in 1:101 "5:" "5:,6:1" x 1 -1:2 1:2, "1:2;3:4" 4294967296:1; do refused --logit-bias "$v"; done
for o in --presence-penalty --frequency-penalty; do
	for v in 2.5 -2.5 x - --1 -x "- 1"; do refused $o "$v"; done
done
for v in 0 11 x -1; do refused --repetition-penalty "$v"; done
for v in 2 -0.1 -0 x; do refused --min-p "$v"; done
# the bounds themselves are kvd generate's too: past the options, the
# model (absent) is what fails
rc=0
"$KVD" generate --model "$T/none.gguf" --prompt hi --max-tokens 1048576 --temperature 100 \
	--top-p 1 --top-k 4294967295 --seed 18446744073709551615 >/dev/null 2>&1 || rc=$?
check "kvd generate: the bounds pass (exit $rc: the model)" test "$rc" -eq 66
rc=0
"$KVD" generate --model "$T/none.gguf" --prompt hi --logprobs 20 --logit-bias "0:-100,4294967295:100" \
	--presence-penalty -2 --frequency-penalty 2 --repetition-penalty 10 --min-p 1 >/dev/null 2>&1 || rc=$?
check "kvd generate: logprobs, logit_bias and the penalties' bounds pass (exit $rc: the model)" test "$rc" -eq 66
for v in x "" 1,2, ,1 1,,2 4294967296 1,-2 "1, 2"; do
	rc=0
	"$KVCTL" generate --server "$NONE" --tokens "$v" >"$T/out" 2>"$T/err" || rc=$?
	check "--tokens '$v': a usage error (exit $rc)" test "$rc" -eq 2
	check "--tokens '$v': the message names the option and the value" \
		grep -qF -- "--tokens '$v'" "$T/err"
done

# stand_in MODE: a server on $T/s.sock for one connection: it writes the
# request it got to $T/req.json and answers a final event with text "ab"
# (MODE nomem: an auth_ok frame first, and the final 0.3 s later, so the
# final arrives in a read of its own)
stand_in() {
	rm -f "$T/s.sock" "$T/req.json"
	python3 - "$T/s.sock" "$T/req.json" "$1" "$(dirname "$0")" <<'PY' &
import json, socket, sys, time
sys.path.insert(0, sys.argv[4])
import mpk
s = socket.socket(socket.AF_UNIX)
s.bind(sys.argv[1]); s.listen(1)
c, _ = s.accept()
req = mpk.recv_frame(c)
json.dump(req, open(sys.argv[2], "w"))
if sys.argv[3] == "nomem":
    mpk.send_frame(c, {"type": "auth_ok", "tenant": "t"})
    time.sleep(0.3)
mpk.send_frame(c, {"type": "final", "id": req["id"], "finish_reason": "length",
                   "prompt_tokens": 2, "output_tokens": 0, "ttft_us": 1,
                   "total_us": 2, "text": "ab"})
c.recv(1)
PY
	PIDS+=($!)
	wait_for 10 test -S "$T/s.sock"
}
req_field() { python3 -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))[sys.argv[2]]))' "$T/req.json" "$1"; }

stand_in final
out=$("$KVCTL" generate --server "unix:$T/s.sock" --json --tokens 7,8 --tokens 1,4294967295 \
	--max-tokens 1048576 --temperature 100 --top-p 1 --top-k 4294967295 \
	--seed 18446744073709551615 --id 18446744073709551615 2>"$T/err") || true
check "the bounds pass: served" grep -q '"finish_reason":"length"' <<<"$out"
check "--tokens twice: the last list is sent" test "$(req_field tokens)" = "[1, 4294967295]"
check "max_tokens as given" test "$(req_field max_tokens)" = 1048576
check "temperature as given" test "$(req_field temperature)" = 100.0
check "top_p as given" test "$(req_field top_p)" = 1.0
check "top_k as given" test "$(req_field top_k)" = 4294967295
check "seed as given" test "$(req_field seed)" = 18446744073709551615
check "id as given" test "$(req_field id)" = 18446744073709551615

if command -v valgrind >/dev/null && plain_build; then
	rc=0
	valgrind -q --leak-check=full --errors-for-leak-kinds=definite --error-exitcode=99 \
		"$KVCTL" generate --server "$NONE" --tokens 1,2 --tokens 3 >/dev/null 2>"$T/vg" || rc=$?
	check "--tokens twice: nothing leaked (exit $rc, 99: valgrind's)" test "$rc" -eq 69
else
	echo "# valgrind absent or an ASan build: the leak check not run"
fi

if shim_ok; then
	stand_in nomem
	rc=0
	LD_PRELOAD="$SHIM" KVD_SHIM_NOMEM_AFTER=final \
		"$KVCTL" generate --server "unix:$T/s.sock" --prompt hi >"$T/out" 2>"$T/err" || rc=$?
	check "out of memory keeping the final's text: not success (exit $rc)" test "$rc" -ne 0
	check "out of memory: said" grep -q "out of memory" "$T/err"
else
	echo "# the fault library cannot be preloaded here (ASan build): out of memory not tried"
fi
finish
