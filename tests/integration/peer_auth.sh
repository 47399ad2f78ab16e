#!/usr/bin/env bash
# Only proven peers (invariant 11), attacked as a stranger on the network
# would (fake_peer.py plays each attacker):
#   - a stranger without the key tries every way in - a plain hello, a
#     guessed proof, a hello after the challenge, a request before any
#     proof, a forged data token, the old guessable session - and gets a
#     bare refusal each time: no model fingerprint, no node name, nothing
#     held, one escaped log line per refusal;
#   - a crowd of silent connections from one address: at most 8 wait for
#     a handshake (each new one evicts the oldest), not past liveness or
#     the proof deadline; the admin socket and the pair carry on
#     (peer_flood: more);
#   - strangers announcing 4 MiB frames before any proof: a node reads only
#     handshake-sized frames until the peer has proved, memory stays bounded;
#   - a peer holding another cluster's key fails the proof;
#   - an insider's sealed frame with a flipped tag bit: counted
#     (kvd_peer_auth_failures_total{kind="frame"}) and the link closed;
#   - a man in the middle relays a decode's handshake to the keyed
#     prefill: the proofs are bound to both nodes' names and addresses,
#     so the relayed one is refused and decode never pairs;
#   - data-connection hijack race: while the real decode restarts three
#     times, a process that paired itself (it holds the key) opens data
#     connections with guessed tokens - its own token's neighbours (what a
#     counter would hand the next peer) and random ones - as fast as it
#     can: it never receives a byte of KV and the real decode pairs and
#     serves every time;
#   - a rogue prefill at decode's configured address, without the key,
#     proves nothing: decode refuses it, never sends it a hello or a
#     prompt, and its client gets the typed NO_PREFILL_PEER error; a rogue
#     that answers the proof with a plain hello (a downgrade) likewise, and
#     one whose challenge names another integrity suite gets no proof;
#   - a keyed node and a keyless one never pair;
#   - the key file and loopback rules at config time (exit 78).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/serve_lib.sh"
FAKE=(python3 "$(dirname "$0")/fake_peer.py")

gen_model "$T/m.gguf"
M=$T/m.gguf
PROMPT="Once upon a time"
REF=$(offline --model "$M" --prompt "$PROMPT" --max-tokens 8)

pair pa da "$M"
start_node pa
start_node da
check "keyed pair up" wait_up da
check "the pair logs that it is authenticated" \
	grep -q "event=peer_up .*authenticated=yes" "$T/pa.log"
SHA=$(grep -o 'model_sha256=[0-9a-f]*' "$T/pa.log" | head -1 | cut -d= -f2)

# ---- a stranger --------------------------------------------------------------
n0=$(grep -c "event=peer_refused" "$T/pa.log" || true)
rc=0
"${FAKE[@]}" stranger "127.0.0.1:$P_PORT" "$T/pa.log" > "$T/stranger.out" 2>&1 || rc=$?
sed 's/^/# /' "$T/stranger.out"
check "stranger: every attempt got a bare refusal, and nothing else" test $rc = 0
check "stranger: 8 attempts ran" test "$(grep -c '"case"' "$T/stranger.out")" = 8
check "stranger: another integrity suite, or none, is refused with 'suite'" \
	test "$(grep -E '"case": "(other|no)_suite"' "$T/stranger.out" | grep -c '"reason": "suite"')" = 2
check "stranger: no byte of the model fingerprint left prefill" \
	test -n "$SHA" -a "$(grep -c "$SHA" "$T/stranger.out")" = 0
check "stranger: prefill's node name never left prefill" \
	test "$(grep -c '"pa"' "$T/stranger.out")" = 0
check "stranger: plain hello refused: auth_required" grep -q '"case": "plain_hello".*"reason": "auth_required"' "$T/stranger.out"
check "stranger: guessed proof refused: auth_failed" grep -q '"case": "wrong_proof".*"reason": "auth_failed"' "$T/stranger.out"
check "stranger: hello instead of a proof refused" grep -q '"case": "hello_after_challenge".*"reason": "protocol"' "$T/stranger.out"
check "stranger: request before any proof refused" grep -q '"case": "request_first".*"reason": "protocol"' "$T/stranger.out"
check "stranger: forged data token refused" grep -q '"case": "forged_token".*"reason": "bad_token"' "$T/stranger.out"
n1=$(grep -c "event=peer_refused" "$T/pa.log" || true)
check "stranger: one peer_refused line per refusal (7 more, got $((n1 - n0)))" test $((n1 - n0)) = 7
check "stranger: failed proofs and tokens counted" \
	test "$(status_get pa counters.peer_auth_failures)" -ge 2
check "stranger: nothing held, nothing in flight on prefill" settle pa
out=$(gen "$C_PORT" --prompt "$PROMPT" --max-tokens 8 || true)
check "stranger: the real pair still serves exact output" same_ids "$out" "$REF"

# ---- a crowd of silent strangers ----------------------------------------------
# 300 connections from one address that never say a word: at most 8
# wait for a handshake (each new one evicts the oldest, closed at the next
# tick), the waiting ones are closed once silent for three heartbeats or
# at the proof deadline (1 s), the admin socket answers throughout and the
# real pair keeps serving.
MC=$(log_mark "$T/pa.log")
"${FAKE[@]}" crowd "127.0.0.1:$P_PORT" 300 3 > "$T/crowd.out" 2>&1 &
CPID=$!
PIDS+=("$CPID")
crowd_in() { grep -q "^crowd=" "$T/crowd.out" 2>/dev/null; }
check "crowd: all 300 connections opened" wait_for 30 crowd_in
check "crowd: prefill's admin socket answers" quiet timeout 5 "$KVCTL" --socket "$T/pa.sock" status
out=$(gen "$C_PORT" --prompt "$PROMPT" --max-tokens 8 || true)
check "crowd: the real pair serves exact output meanwhile" same_ids "$out" "$REF"
wait "$CPID" || true
echo "# crowd: $(tr '\n' ' ' < "$T/crowd.out")"
# what prefill did, from its own lines (the crowd's 0.5 s look at its
# sockets races the tick that closes the evicted ones on a loaded machine)
evicted=$(log_since "$T/pa.log" "$MC" | grep -o "event=peer_handshakes_evicted count=[0-9]* proof_timeouts=[0-9]*" |
	awk -F'[= ]' '{ e += $4; p += $6 } END { print e + 0, p + 0 }')
echo "# crowd: prefill evicted ${evicted% *} handshakes and closed ${evicted#* } at the proof deadline"
check "crowd: all but the 8 handshakes one address may hold were evicted" test "${evicted% *}" -ge 292
check "crowd: the rest were closed in time (liveness or the proof deadline)" grep -q "closed_after=300" "$T/crowd.out"

# ---- big frames before any proof -----------------------------------------------
# 60 strangers each announce a 4 MiB frame and send 3 MiB of it: before a
# peer has proved the key, a node reads only handshake-sized frames, so
# prefill's memory stays bounded and the connections are closed.
rss_kb() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status" 2>/dev/null || echo 0; }
rss0=$(rss_kb "$PID_pa")
"${FAKE[@]}" bigframes "127.0.0.1:$P_PORT" 60 3 4 > "$T/big.out" 2>&1 &
BPID=$!
PIDS+=("$BPID")
peak=$rss0
while kill -0 "$BPID" 2>/dev/null; do
	r=$(rss_kb "$PID_pa"); [ "$r" -gt "$peak" ] && peak=$r
	sleep 0.1
done
echo "# big frames: $(cat "$T/big.out"); prefill RSS $rss0 kB -> peak $peak kB"
check "big frames: 60 strangers connected" grep -q "conns=60 " "$T/big.out"
check "big frames: prefill RSS grew by less than 64 MB" test $(( (peak - rss0) / 1024 )) -lt 64
check "big frames: prefill closed every one" grep -q "closed=60$" "$T/big.out"
out=$(gen "$C_PORT" --prompt "$PROMPT" --max-tokens 8 || true)
check "big frames: the real pair still serves exact output" same_ids "$out" "$REF"

# ---- another cluster's key ---------------------------------------------------
"$KVCTL" keygen "$T/other.key"
rc=0
"${FAKE[@]}" --key "$T/other.key" tail "127.0.0.1:$P_PORT" "$T/pa.log" > "$T/other.out" 2>&1 || rc=$?
sed 's/^/# /' "$T/other.out" | tail -2
check "other key: no handshake" test $rc = 2
check "other key: prefill refused the proof" grep -q "event=peer_refused .*reason=auth_failed" "$T/pa.log"

# ---- a tampered sealed frame ----------------------------------------------------
# an insider proves the key, then its sealed hello arrives with one bit of
# the tag flipped (forged or corrupted on the way): prefill refuses the
# frame, counts it by kind and closes the link, answering nothing
rc=0
"${FAKE[@]}" --key "$(cluster_key)" tamper "127.0.0.1:$P_PORT" "$T/pa.log" > "$T/tamper.out" 2>&1 || rc=$?
sed 's/^/# /' "$T/tamper.out"
check "tamper: prefill closed the link and answered nothing" test $rc = 0
check "tamper: prefill logged the frame that failed authentication" \
	wait_log "$T/pa.log" "event=peer_auth_failed .*kind=frame" 5
check "tamper: counted, kvd_peer_auth_failures_total{kind=\"frame\"} 1" eval \
	"\"\$KVCTL\" --socket '$T/pa.sock' metrics | grep -x 'kvd_peer_auth_failures_total{kind=\"frame\"} 1' >/dev/null"

# ---- data-connection hijack race ---------------------------------------------
# the attacker holds the key (an insider): it pairs itself, learns its
# own token, and sprays that token's neighbours and random guesses
"${FAKE[@]}" --key "$(cluster_key)" hijack "127.0.0.1:$P_PORT" 12 "$T/pa.log" > "$T/hijack.out" 2>&1 &
HPID=$!
PIDS+=("$HPID")
served=0
for round in 1 2 3; do
	kill -KILL "$PID_da" 2>/dev/null || true
	wait "$PID_da" 2>/dev/null || true
	mp=$(log_mark "$T/pa.log")
	md=$(log_mark "$T/da.log")
	start_node da
	check "hijack race, restart $round: the real decode paired again" \
		wait_log "$T/pa.log" "event=peer_up " 20 "$mp"
	wait_log "$T/da.log" "event=peer_capacity" 20 "$md" || true
	for _ in 1 2 3; do
		out=$(gen "$C_PORT" --prompt "$PROMPT" --max-tokens 8 || true)
		same_ids "$out" "$REF" && served=$((served + 1))
	done
done
wait "$HPID" || true
echo "# hijack: $(cat "$T/hijack.out")"
check "hijack race: every request of the real decode served exactly (9/9: $served)" test $served = 9
check "hijack race: the attacker tried, neighbours of its own token included" \
	grep -Eq "tries=[1-9][0-9]* neighbours=128 " "$T/hijack.out"
check "hijack race: the attacker received no byte of KV" grep -q "kv_bytes=0$" "$T/hijack.out"
check "hijack race: prefill holds nothing afterwards" settle pa

# ---- a rogue prefill at decode's configured address --------------------------
for mode in proof plain suite; do
	next_port; R_PORT=$PORT
	next_port; RC_PORT=$PORT
	"${FAKE[@]}" rogue "127.0.0.1:$R_PORT" 6 "$mode" > "$T/rogue_$mode.out" 2>&1 &
	RPID=$!
	PIDS+=("$RPID")
	check "rogue ($mode): listening" wait_for 10 listening "$R_PORT"
	write_node "dr_$mode" decode "$M" "listen.client=127.0.0.1:$RC_PORT" \
		"peers.prefill=127.0.0.1:$R_PORT"
	start_node "dr_$mode"
	if [ $mode = proof ]; then
		check "rogue ($mode): decode refused the impostor's proof" \
			wait_log "$T/dr_$mode.log" "event=peer_refused .*reason=auth_failed" 10
	elif [ $mode = suite ]; then
		check "rogue ($mode): decode refused a challenge naming another integrity suite" \
			wait_log "$T/dr_$mode.log" "event=peer_refused .*reason=suite .*theirs=xxh3-unkeyed" 10
	else
		check "rogue ($mode): decode refused a hello in place of a proof" \
			wait_log "$T/dr_$mode.log" "event=peer_down .*unexpected message during the handshake" 10
	fi
	out=$(gen "$RC_PORT" --prompt "$PROMPT" --max-tokens 8 || true)
	check "rogue ($mode): the client gets NO_PREFILL_PEER" \
		test "$(echo "$out" | json_get error)" = NO_PREFILL_PEER
	check "rogue ($mode): no token reached the client" no_token "$out"
	wait "$RPID" || true
	echo "# rogue ($mode): $(cat "$T/rogue_$mode.out")"
	check "rogue ($mode): decode sent the impostor no hello and no prompt" \
		grep -Eq "^seen=auth_hello(,auth_proof)? count=[1-9]" "$T/rogue_$mode.out"
	if [ $mode = suite ]; then
		check "rogue ($mode): ... and no proof either" \
			grep -Eq "^seen=auth_hello count=[1-9]" "$T/rogue_$mode.out"
	fi
	p="PID_dr_$mode"
	stop_node "dr_$mode"
done

# ---- a relayed handshake ----------------------------------------------------------
# a man in the middle without the key relays a decode's connections to the
# keyed prefill pa: every proof is bound to both nodes' names and to the
# addresses each end sees (decode dialed the relay, pa was dialed by it),
# so the relayed proof does not verify and decode never pairs
next_port; R_PORT=$PORT
next_port; RC_PORT=$PORT
"${FAKE[@]}" relay "127.0.0.1:$R_PORT" "127.0.0.1:$P_PORT" 15 > "$T/relay.out" 2>&1 &
RPID=$!
PIDS+=("$RPID")
check "relay: listening" wait_for 10 listening "$R_PORT"
mp=$(log_mark "$T/pa.log")
write_node drelay decode "$M" "listen.client=127.0.0.1:$RC_PORT" \
	"peers.prefill=127.0.0.1:$R_PORT"
start_node drelay
check "relay: prefill refused the relayed proof" \
	wait_log "$T/pa.log" "event=peer_refused .*reason=auth_failed" 10 "$mp"
out=$(gen "$RC_PORT" --prompt "$PROMPT" --max-tokens 8 || true)
check "relay: the client gets NO_PREFILL_PEER" \
	test "$(echo "$out" | json_get error)" = NO_PREFILL_PEER
check "relay: decode never paired through the relay" \
	eval "! grep -q 'event=peer_up' '$T/drelay.log'"
wait "$RPID" || true
echo "# relay: $(cat "$T/relay.out")"
check "relay: the relay carried decode's handshake" grep -q "relayed=[1-9]" "$T/relay.out"
stop_node drelay

# ---- a dual-stack prefill ---------------------------------------------------------
# listen.peer=[::]:P takes IPv4 peers as ::ffff:a.b.c.d while decode's own
# socket says a.b.c.d: the proofs bind both ends' addresses, so both must
# spell them alike (link_sock_addr), or a keyed pair never comes up
if python3 -c 'import socket; socket.socket(socket.AF_INET6).bind(("::", 0))' 2>/dev/null; then
	next_port; V_PORT=$PORT
	next_port; VC_PORT=$PORT
	write_node p6 prefill "$M" "listen.peer=[::]:$V_PORT"
	write_node d6 decode "$M" "listen.client=127.0.0.1:$VC_PORT" "peers.prefill=127.0.0.1:$V_PORT"
	start_node p6
	start_node d6
	check "dual-stack prefill ([::]) and an IPv4 decode: the keyed pair comes up" wait_up d6 20
	out=$(gen "$VC_PORT" --prompt "$PROMPT" --max-tokens 8 || true)
	check "  ... and serves exact output" same_ids "$out" "$REF"
	stop_node d6
	stop_node p6
else
	echo "# no IPv6 socket here: the dual-stack case is not run"
fi

# ---- keyed and keyless never pair ----------------------------------------------
next_port; K_PORT=$PORT
next_port; KC_PORT=$PORT
write_node kl decode "$M" "listen.client=127.0.0.1:$KC_PORT" \
	"peers.prefill=127.0.0.1:$P_PORT" "peers.key_file="
start_node kl
check "keyless decode vs keyed prefill: refused (auth_required)" \
	wait_log "$T/kl.log" "event=peer_refused .*reason=auth_required" 10
stop_node kl
write_node kp prefill "$M" "listen.peer=127.0.0.1:$K_PORT" "peers.key_file="
write_node kd decode "$M" "listen.client=127.0.0.1:$KC_PORT" "peers.prefill=127.0.0.1:$K_PORT"
start_node kp
start_node kd
check "keyed decode vs keyless prefill: refused (no_key)" \
	wait_log "$T/kd.log" "event=peer_refused .*reason=no_key" 10
check "keyless prefill warns at boot that it peers unauthenticated" \
	grep -q "event=peer_auth .*mode=loopback_only" "$T/kp.log"
stop_node kd
stop_node kp

# ---- config-time rules (exit 78) ---------------------------------------------
cfg_rc() { # cfg_rc NAME: kvd --check-config on T/NAME.ini; prints rc and keeps stderr
	local rc=0
	"$KVD" --check-config --config "$T/$1.ini" > "$T/$1.check" 2>&1 || rc=$?
	echo $rc
}
cp "$(cluster_key)" "$T/open.key"; chmod 0644 "$T/open.key"
write_node c1 prefill "$M" "listen.peer=127.0.0.1:1" "peers.key_file=$T/open.key"
check "a key file readable by others: exit 78" test "$(cfg_rc c1)" = 78
check "... naming peers.key_file and the mode" grep -q "peers.key_file.*0644" "$T/c1.check"
head -c 16 /dev/urandom > "$T/short.key"; chmod 0600 "$T/short.key"
write_node c2 prefill "$M" "listen.peer=127.0.0.1:1" "peers.key_file=$T/short.key"
check "a key file of 16 bytes: exit 78" test "$(cfg_rc c2)" = 78
write_node c3 prefill "$M" "listen.peer=10.77.0.1:7000" "peers.key_file="
check "no key and a non-loopback listen.peer: exit 78" test "$(cfg_rc c3)" = 78
check "... saying to set peers.key_file" grep -q "listen.peer.*peers.key_file" "$T/c3.check"
write_node c4 decode "$M" "listen.client=127.0.0.1:1" "peers.prefill=10.77.0.1:7000" "peers.key_file="
check "no key and a non-loopback peers.prefill: exit 78" test "$(cfg_rc c4)" = 78
write_node c5 decode "$M" "listen.client=127.0.0.1:1" "peers.prefill=127.0.0.1:7000" \
	"peers.key_file=" "transfer.encrypt=on"
check "encryption without a key: exit 78" test "$(cfg_rc c5)" = 78
write_node c6 prefill "$M" "listen.peer=10.77.0.1:7000"
check "a key and a non-loopback address: accepted" test "$(cfg_rc c6)" = 0

stop_node da
stop_node pa
serve_finish
