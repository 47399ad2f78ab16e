#!/usr/bin/env bash
# Invariant 10 on the wire: the unfilled tail of a request's last page
# (which still holds an earlier tenant's K/V: pages are never zeroed
# between owners) never leaves prefill. A real decode node first runs a
# canary request whose last page is 15/16 full; its pages go back to
# prefill's free list (a stack: the canary's last page is handed out
# next). Then a fake decode (fake_peer.py) asks prefill for a 1-token
# prompt and reads the KV batch off the data connection: every byte of
# positions >= 1, in every layer's K and V block, must be zero.
# Run on a keyless loopback link (any local process may play decode) and
# on keyed links (a decode node holding the key: an insider must not see
# another tenant's bytes either), sealed and encrypted.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/serve_lib.sh"

gen_model "$T/m.gguf"
M=$T/m.gguf
CANARY=$(seq -s, 40 134)       # 95 tokens: 5 full pages and 15 of 16

# three links: keyless loopback, keyed (sealed), keyed and encrypted
for mode in keyless keyed encrypted; do
	case $mode in
	keyless) keys=(peers.key_file=); fake=() ;;
	keyed) keys=(); fake=(--key "$(cluster_key)") ;;
	encrypted) keys=(transfer.encrypt=on); fake=(--key "$(cluster_key)" --encrypt) ;;
	esac
	rm -f "$T"/sp.log "$T"/sd.log
	pair sp sd "$M" "${keys[@]}" -- "${keys[@]}"
	start_node sp
	start_node sd
	check "$mode: decode paired" wait_up sd
	out=$(gen "$C_PORT" --tokens "$CANARY" --max-tokens 4 || true)
	check "$mode: the canary request ran through prefill" test -n "$(echo "$out" | json_get output_ids)"
	check "$mode: prefill released the canary's pages" settle sp

	rc=0
	python3 "$(dirname "$0")/fake_peer.py" "${fake[@]}" tail "127.0.0.1:$P_PORT" "$T/sp.log" \
		> "$T/fake.out" 2>&1 || rc=$?
	sed 's/^/# /' "$T/fake.out" | tail -5
	check "$mode: the fake decode got a 1-token page from prefill" test $rc -le 1
	check "$mode: no byte past the request's token leaves prefill" test $rc = 0
	check "$mode: prefill still serves the real decode" \
		test -n "$(gen "$C_PORT" --prompt "Once upon a time" --max-tokens 4 | json_get output_ids)"
	stop_node sd
	stop_node sp
done
finish
