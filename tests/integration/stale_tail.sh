#!/usr/bin/env bash
# Invariant 10 on the wire: the unfilled tail of a request's last page
# (which still holds an earlier tenant's K/V: pages are never zeroed
# between owners) never leaves prefill. A real decode node first runs a
# canary request whose last page is 15/16 full; its pages go back to
# prefill's free list (a stack: the canary's last page is handed out
# next). Then a fake decode (fake_peer.py) asks prefill for a 1-token
# prompt and reads the KV batch off the data connection: every byte of
# positions >= 1, in every layer's K and V block, must be zero.
# Keyless (loopback) peering: any local process may play decode, which is
# exactly the attacker this test is; a keyed decode is checked through the real decode node.
export KVD_TEST_KEYLESS=1
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/serve_lib.sh"

gen_model "$T/m.gguf"
M=$T/m.gguf
CANARY=$(seq -s, 40 134)       # 95 tokens: 5 full pages and 15 of 16

pair sp sd "$M"
start_node sp
start_node sd
check "decode paired" wait_up sd
out=$(gen "$C_PORT" --tokens "$CANARY" --max-tokens 4 || true)
check "the canary request ran through prefill" test -n "$(echo "$out" | json_get output_ids)"
check "prefill released the canary's pages" settle sp

rc=0
python3 "$(dirname "$0")/fake_peer.py" tail "127.0.0.1:$P_PORT" "$T/sp.log" \
	> "$T/fake.out" 2>&1 || rc=$?
sed 's/^/# /' "$T/fake.out" | tail -5
check "the fake decode got a 1-token page from prefill" test $rc -le 1
check "no byte past the request's token leaves prefill" test $rc = 0
check "prefill still serves the real decode" \
	test -n "$(gen "$C_PORT" --prompt "Once upon a time" --max-tokens 4 | json_get output_ids)"
stop_node sd
stop_node sp
finish
