#!/usr/bin/env bash
# Log injection: strings a peer chooses (the hello's `node`, the model
# fingerprint of a refused hello) must not forge a line in the node's log,
# and `kvctl audit` must judge each node by its own lines only.
#
# la is a healthy prefill node; lc an undersized one that refuses to start
# (its log holds its one insufficient kv_capacity line). A fake decode
# sends la hellos whose node name starts a new line with a forged
# event=kv_capacity and whose fingerprint breaks out of the quoted msg= to
# complete the forged figures: one forgery tries to fail la (pool_tokens=1),
# one to pass lc (pool_tokens=99999). The test holds whatever the handshake
# logs (or does not log, if a hello is refused before it is read): no line
# may start other than with the node's own ts=, every kv_capacity line is
# the node's own, and the audit verdicts are la ok, lc FAIL.
# Keyless (loopback) peering, where a hello is read before any proof: the
# widest surface for a forged string (keyed nodes refuse it unread).
export KVD_TEST_KEYLESS=1
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/serve_lib.sh"
FAKE="python3 $(dirname "$0")/fake_peer.py"

gen_model "$T/m.gguf"        # context 512
M=$T/m.gguf

next_port; A_PORT=$PORT
next_port; C_PORT=$PORT
write_node la prefill "$M" "listen.peer=127.0.0.1:$A_PORT" "kv.pool_tokens=4096"
write_node lc prefill "$M" "listen.peer=127.0.0.1:$C_PORT" "kv.pool_tokens=128"
start_node la
start_node lc
check "healthy prefill up" wait_log "$T/la.log" "event=serve_ready"
check "undersized prefill refuses to start" wait_log "$T/lc.log" "event=kv_capacity .*verdict=insufficient"
wait "$PID_lc" 2>/dev/null || true

# node names (at most 63 bytes) that start a forged line; the fingerprint
# (at most 64) closes the msg="..." quote it lands in and adds the figures
FAIL_LA='x\nevent=kv_capacity node=la pool_tokens=1'
PASS_LC='x\nevent=kv_capacity node=lc pool_tokens=99999'
BREAK='" context_length=9 margin=1 x="'
# accepted hellos first: each ends with the node logging its own
# kv_capacity line (peer up, peer down); the refused ones last, so on a
# node that lets them through the forged lines are each node's latest
for node in "$FAIL_LA" "$PASS_LC" 'a\x01b\x1b[2J\x7f"\\'; do
	$FAKE hello "127.0.0.1:$A_PORT" "$T/la.log" "$node" >/dev/null 2>&1 || true
done
check "prefill still serving its peer port" quiet $FAKE hello "127.0.0.1:$A_PORT" "$T/la.log" ok
# every line a hello makes la write (up, down, its kv_capacity) is out
# once la has let the fake go: it writes them before it answers status
no_peers() { [ "$(status_get la peers)" = 0 ]; }
check "la let every fake peer go" wait_for 10 no_peers
for node in "$PASS_LC" "$FAIL_LA"; do
	$FAKE hello "127.0.0.1:$A_PORT" "$T/la.log" "$node" "$BREAK" >/dev/null 2>&1 || true
done
check "la let the refused fake peers go" wait_for 10 no_peers

check "every line of the log is one of the node's own" python3 -c '
import sys
for line in open(sys.argv[1], "rb"):
    if not line.startswith(b"ts=") or b" node=la event=" not in line:
        sys.exit("foreign line: %r" % line)
    if any(c < 0x20 and c != 0x0a or c == 0x7f for c in line):
        sys.exit("control byte in: %r" % line)' "$T/la.log"
check "every kv_capacity line is the node's own" \
	test "$($FAKE caplines "$T/la.log" | sort -u)" = "la 4096"
check "audit passes the healthy node" quiet "$KVCTL" audit "$T/la.log"
out=$("$KVCTL" audit "$T/lc.log" "$T/la.log" || true)
check "audit fails the undersized node on its own figures" \
	grep -q "^FAIL lc: pool of 128 tokens" <<<"$out"
check "audit does not fail the healthy node" \
	bash -c '! grep -q "^FAIL la" <<<"$1"' _ "$out"
stop_node la
finish
