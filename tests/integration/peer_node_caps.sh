#!/usr/bin/env bash
# Issue 26, item 3: prefill's per-peer caps (peers.max_pages,
# peers.max_requests) and its link count hold per decode *node*, not per
# link. One key holder that opened two links held 256 of 256 pages (the
# cap was counted per link, and up to 512 links were accepted) and the
# real decode node's requests failed OVERLOADED. A node is its source
# address (daemon/README.md: the cluster key is shared, so a proof says
# only that the peer holds it, and the hello's name is whatever the key
# holder chose): the attacker here connects from 127.0.0.2, the real
# decode node from 127.0.0.1. A request whose link is lost still counts
# against its node until it ends: dropping the links and reconnecting
# does not buy a fresh set of caps.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/serve_lib.sh"

ATTACK_BIN=$KVD_BUILD/tests/kvd_attack
[ -x "$ATTACK_BIN" ] || { echo "skip: $ATTACK_BIN not built"; exit 77; }
ATTACK=("$ATTACK_BIN" --log "$T/pf.log" --key "$(cluster_key)" --source 127.0.0.2)
gen_model "$T/m.gguf"
M=$T/m.gguf
PROMPT="The end of the story"
REF=$(offline --model "$M" --prompt "$PROMPT" --max-tokens 8 --seed 5)

# release 20 s: the attacker's pages stay held (it never sends
# release_ack) for the whole check
pair pf df "$M" "transfer.release_timeout_ms=20000" -- "transfer.release_timeout_ms=20000"
start_node pf
start_node df
check "pair up" wait_up df
check "prefill: automatic per-peer page cap of 128" \
	grep -q "event=peer_limits max_requests=256 max_pages=128 max_pages_source=auto" "$T/pf.log"

# ---- pages: two links, one node -----------------------------------------------
# 20 requests of 256 tokens (16 pages), round robin over two links: 320
# pages wanted of a 256-page pool; the node may hold 128 of them.
"${ATTACK[@]}" hold "127.0.0.1:$P_PORT" 256 20 15 --links 2 > "$T/two.out" 2>&1 &
APID=$!
PIDS+=("$APID")
check "two links: every attacker request answered" wait_for 15 grep -q "^sent=" "$T/two.out"
echo "# two links: $(head -1 "$T/two.out"); prefill holds $(held pf) pages"
check "two links: both handshakes succeeded" grep -q " links=2/2" "$T/two.out"
check "two links: the node's page cap admitted 8 requests in all, 12 OVERLOADED" \
	grep -q "done=8 overloaded=12" "$T/two.out"
check "two links: prefill holds at most the cap (128 pages)" test "$(held pf)" -le 128
check "two links: prefill logged the cap per node" \
	grep -q "event=peer_cap peer_node=attacker .*peer_addr=127.0.0.2 .*cap=max_pages .*links=2" "$T/pf.log"
out=$(gen "$C_PORT" --prompt "$PROMPT" --max-tokens 8 --seed 5 || true)
echo "# real decode while the attacker holds its cap: $out" | cut -c1-300
check "two links: the real decode node is served, output equal to its offline run" \
	same_ids "$out" "$REF"
kill "$APID" 2>/dev/null || true; wait "$APID" 2>/dev/null || true
check "two links: zero pages held once the attacker left" settle pf

# ---- links: at most peers.max_links (default 4) per node -----------------------
timeout 30 "${ATTACK[@]}" hold "127.0.0.1:$P_PORT" 16 1 2 --links 6 > "$T/six.out" 2>&1 || true
echo "# six links: $(tail -1 "$T/six.out")"
check "six links: four accepted, two refused" grep -q " links=4/6" <(tail -1 "$T/six.out")
check "six links: prefill logged the refusal" \
	grep -q "event=peer_refused .*reason=too_many_links" "$T/pf.log"
# ---- a lost link's requests still count ----------------------------------------
# every prefill submit is held 2.5 s (fault point stuck_submit), so the
# attacker's admitted requests outlive its link: it sends 10 (8 fit the
# cap), leaves after 1 s, and reconnects at once with 10 more - before,
# the detached requests were forgotten by the caps and 8 more were
# admitted; now all 10 are OVERLOADED until the first 8 end.
mark=$(log_mark "$T/df.log")
stop_node pf
start_node pf "KVD_FAULT=stuck_submit"
check "stuck_submit: pair up again" wait_log "$T/df.log" "event=peer_up " 15 "$mark"
timeout 30 "${ATTACK[@]}" hold "127.0.0.1:$P_PORT" 256 10 1 > "$T/r1.out" 2>&1 || true
timeout 30 "${ATTACK[@]}" hold "127.0.0.1:$P_PORT" 256 10 1 > "$T/r2.out" 2>&1 || true
echo "# first link: $(head -1 "$T/r1.out"); second link: $(head -1 "$T/r2.out")"
check "relink: the first link had 8 admitted, 2 OVERLOADED" grep -q "overloaded=2 " "$T/r1.out"
check "relink: the second link, while the first one's requests run on: all 10 OVERLOADED" \
	grep -q "overloaded=10 " "$T/r2.out"
check "relink: nothing held once they ended" settle pf
mark=$(log_mark "$T/df.log")
stop_node pf
start_node pf
check "pair up without the fault" wait_log "$T/df.log" "event=peer_up " 15 "$mark"

out=$(gen "$C_PORT" --prompt "$PROMPT" --max-tokens 8 --seed 5 || true)
check "after all: a request equals its offline run" same_ids "$out" "$REF"
check "after all: zero pages held on both nodes" settle pf df
stop_node df
stop_node pf
serve_finish
