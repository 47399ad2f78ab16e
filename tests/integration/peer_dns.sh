#!/usr/bin/env bash
# Peers by name (daemon/node/peerdns.c), against a real DNS server: the
# test runs in its own network and mount namespaces (unshare), starts
# dnsmasq on 127.0.0.53:53 answering from a hosts file the test writes
# (SIGHUP reloads it), and bind-mounts a resolv.conf naming it over
# /etc/resolv.conf - only inside the namespace, so kvd's resolver (glibc
# getaddrinfo through libuv) asks dnsmasq and nothing on the host changes.
# Two prefill nodes on 127.0.0.2 and 127.0.0.3 (one port: an A record has
# none), a decode node with peers.prefill = prefill.kvd.test:PORT:
#  - the name's two addresses become two links, and both carry requests;
#  - 127.0.0.3 leaves the answer while clients load the pair: its link
#    drains (it had requests in flight, none new goes to it, every
#    client request succeeds) and then closes; the prefill node lives on;
#  - it comes back: a link again, requests again;
#  - the DNS server goes away: resolution fails, logged, links kept;
#  - a keyless decode node refuses a name that resolves off loopback;
#  - decode stops cleanly (its loop closes: names, timers, lookups).
if [ -z "${KVD_PEER_DNS_NS:-}" ]; then
	command -v dnsmasq >/dev/null 2>&1 || [ -x /usr/sbin/dnsmasq ] ||
		{ echo "SKIP: dnsmasq is not installed (Debian package dnsmasq-base, tests/deps.sh)"; exit 77; }
	command -v unshare >/dev/null 2>&1 || { echo "SKIP: no unshare (util-linux)"; exit 77; }
	ns=(-n -m)
	[ "$(id -u)" -eq 0 ] || ns=(-r -n -m)
	unshare "${ns[@]}" true 2>/dev/null ||
		{ echo "SKIP: cannot create network and mount namespaces (unshare ${ns[*]})"; exit 77; }
	KVD_PEER_DNS_NS=1 exec unshare "${ns[@]}" bash "$0" "$@"
fi
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/serve_lib.sh"

PATH=$PATH:/usr/sbin
grep -q "KVD_FAULT_POINTS 1" "$KVD_BUILD/kvd_build.h" || skip "built without fault points"
ip link set lo up 2>/dev/null || skip "cannot bring up loopback in the network namespace"
DNS=127.0.0.53
NAME=prefill.kvd.test
printf 'nameserver %s\noptions timeout:1 attempts:1\n' "$DNS" > "$T/resolv.conf"
mount --bind "$T/resolv.conf" /etc/resolv.conf 2>/dev/null ||
	skip "cannot bind-mount a resolv.conf in the mount namespace"

hosts() { # hosts IP...: NAME answers these (A records), dnsmasq reloads
	: > "$T/hosts.new"
	for ip in "$@"; do echo "$ip $NAME" >> "$T/hosts.new"; done
	mv "$T/hosts.new" "$T/hosts"
	[ -z "${PID_dns:-}" ] || kill -HUP "$PID_dns"
}
hosts 127.0.0.2 127.0.0.3
dnsmasq --keep-in-foreground --conf-file=/dev/null --no-resolv --no-hosts --local=/kvd.test/ \
	--addn-hosts="$T/hosts" --listen-address=$DNS --bind-interfaces --port=53 \
	--user=root --pid-file= --local-ttl=0 --log-queries --log-facility="$T/dnsmasq.log" &
PID_dns=$!
PIDS+=("$PID_dns")
# answers IP...: the system resolver gives exactly these, asked as kvd
# asks it (getaddrinfo without AI_ADDRCONFIG, which getent uses and which
# hides IPv4 in a namespace whose only interface is loopback)
answers() {
	test "$(python3 -c 'import socket, sys
print(" ".join(sorted({a[4][0] for a in socket.getaddrinfo(sys.argv[1], 1, socket.AF_INET, socket.SOCK_STREAM)})))' "$NAME" 2>/dev/null)" = "$*"
}
check "dnsmasq answers for $NAME" wait_for 10 answers 127.0.0.2 127.0.0.3

gen_model "$T/m.gguf"
MODEL=$T/m.gguf
# prompt N: N tokens (100: 7 batches of 16K), the first two random, so
# that requests sent together do not share a prefix (decode's gate holds
# a request back while one with its prefix computes: they would run one
# after another)
prompt() { echo "$((RANDOM % 300 + 10)),$((RANDOM % 300 + 10)),$(seq -s, 10 $(($1 + 7)))"; }
next_port; P_PORT=$PORT
next_port; C_PORT=$PORT
write_node p2 prefill "$MODEL" "listen.peer=127.0.0.2:$P_PORT" "transfer.max_batch_bytes=16K"
write_node p3 prefill "$MODEL" "listen.peer=127.0.0.3:$P_PORT" "transfer.max_batch_bytes=16K"
write_node dl decode "$MODEL" "listen.client=127.0.0.1:$C_PORT" \
	"peers.prefill=$NAME:$P_PORT" "peers.resolve_interval_ms=300" \
	"transfer.max_batch_bytes=16K" "transfer.prefill_timeout_ms=20000" \
	"transfer.transfer_timeout_ms=20000" "log.level=info"
# both send one batch per 300 ms (slow_batch): a request stays in flight
# on its prefill node for about two seconds, so requests that arrive
# together spread over both (decode picks the least loaded) and a drain
# finds some on the link it drains
start_node p2 KVD_FAULT=slow_batch
start_node p3 KVD_FAULT=slow_batch
start_node dl

up_to() { # up_to IP [MARK]: decode's link to IP:P_PORT came up after MARK
	wait_log "$T/dl.log" "event=peer_up peer=\"?$1:$P_PORT\"?" 20 "${2:-0}"
}
check "the name resolved to 127.0.0.2" wait_log "$T/dl.log" "event=peer_dns_add name=\"?$NAME\"? addr=\"?127.0.0.2:$P_PORT" 10
check "the name resolved to 127.0.0.3" wait_log "$T/dl.log" "event=peer_dns_add name=\"?$NAME\"? addr=\"?127.0.0.3:$P_PORT" 10
check "a link to 127.0.0.2 is up" up_to 127.0.0.2
check "a link to 127.0.0.3 is up" up_to 127.0.0.3
check "dnsmasq answered kvd's queries" grep -q "query\[A\] $NAME" "$T/dnsmasq.log"

# burst N: N requests at once; prints how many failed
burst() {
	local i fail=0 pids=()
	for ((i = 0; i < $1; i++)); do
		gen "$C_PORT" --tokens "$(prompt 100)" --max-tokens 4 > "$T/burst.$i" 2>&1 & pids+=($!)
	done
	for i in "${!pids[@]}"; do
		wait "${pids[$i]}" && ! grep -q '"error"' "$T/burst.$i" || fail=$((fail + 1))
	done
	echo $fail
}
served() { log_count "$T/$1.log" "event=prefill_done " "${2:-0}"; }
M2=$(log_mark "$T/p2.log"); M3=$(log_mark "$T/p3.log")
check "6 requests at once succeed" test "$(burst 6)" = 0
check "127.0.0.2 computed some of them ($(served p2 "$M2"))" test "$(served p2 "$M2")" -ge 1
check "127.0.0.3 computed some of them ($(served p3 "$M3"))" test "$(served p3 "$M3")" -ge 1

# --- 127.0.0.3 leaves the answer under load -----------------------------
# worker K: requests one after another until $T/stop exists; one line per
# request in $T/load.K: ok, or the failure
worker() {
	local out
	while [ ! -f "$T/stop" ]; do
		if out=$(gen "$C_PORT" --tokens "$(prompt 100)" --max-tokens 4 2>&1) &&
		   ! grep -q '"error"' <<<"$out"; then
			echo ok
		else
			echo "failed: $out" | tr '\n' ' '; echo
		fi
	done >> "$T/load.$1"
}
# two long requests (300 tokens: 19 batches, about six seconds on a
# prefill node) at once on the idle pair: one lands on each link
M3=$(log_mark "$T/p3.log")
LPIDS=()
for k in 1 2; do
	gen "$C_PORT" --tokens "$(prompt 300)" --max-tokens 4 > "$T/long.$k" 2>&1 & LPIDS+=($!); PIDS+=($!)
done
check "a long request is on 127.0.0.3" \
	wait_log "$T/p3.log" "event=req_state .*event=computed to=sending" 20 "$M3"
WPIDS=()
for k in 1 2 3 4; do worker $k & WPIDS+=($!); PIDS+=($!); done
sleep 0.5
MD=$(log_mark "$T/dl.log")
M3PRE=$(log_mark "$T/p3.log")
hosts 127.0.0.2
check "127.0.0.3 left the answer: its link drains" \
	wait_log "$T/dl.log" "event=peer_dns_drain name=\"?$NAME\"? addr=\"?127.0.0.3:$P_PORT\"? requests=" 10 "$MD"
M3=$(log_mark "$T/p3.log")
ON=$(log_since "$T/dl.log" "$MD" | grep -o "event=peer_dns_drain .*requests=[0-9]*" | sed 's/.*requests=//' | head -1)
check "with requests in flight on it (${ON:-none})" test "${ON:-0}" -ge 1
# six more at once while it drains: the least loaded link would be the
# draining one for some of them, were draining links not skipped
check "6 requests at once while it drains succeed" test "$(burst 6)" = 0
check "then its link closes" wait_log "$T/dl.log" "event=peer_drained peer=\"?127.0.0.3:$P_PORT\"? was_up=1" 30 "$MD"
check "127.0.0.2 was not drained" test "$(log_count "$T/dl.log" "event=peer_dns_drain .*127.0.0.2" "$MD")" = 0
check "no request failed on decode during the drain" \
	test "$(log_count "$T/dl.log" "event=request_failed" "$MD")" = 0
sleep 1
touch "$T/stop"
for p in "${WPIDS[@]}"; do wait "$p" || true; done
LFAIL=0
for k in 1 2; do
	wait "${LPIDS[$k - 1]}" && ! grep -q '"error"' "$T/long.$k" || LFAIL=$((LFAIL + 1))
done
check "the long requests succeeded ($LFAIL failed)" test "$LFAIL" = 0
NOK=$(cat "$T"/load.* | grep -c '^ok$' || true)
NFAIL=$(cat "$T"/load.* | grep -vc '^ok$' || true)
check "every client request during the change succeeded ($NOK ok, $NFAIL failed)" test "$NFAIL" = 0
check "the load ran ($NOK requests)" test "$NOK" -ge 4
check "127.0.0.3 was given no request once draining" \
	test "$(log_count "$T/p3.log" "event=req_state .*from=new event=admit" "$M3")" = 0
# (counted from before the change: one may end while the test reads the
# drain line)
check "and finished the ones it had ($(served p3 "$M3PRE") for $ON)" test "$(served p3 "$M3PRE")" -ge "${ON:-1}"
check "the prefill node on 127.0.0.3 lives on (drained, not killed)" kill -0 "$PID_p3"
check "127.0.0.3 is not redialled while out of the answer" \
	test "$(log_count "$T/dl.log" "event=peer_up peer=\"?127.0.0.3" "$MD")" = 0
M2=$(log_mark "$T/p2.log")
check "requests go on (on 127.0.0.2)" test "$(burst 4)" = 0
check "127.0.0.2 computed them ($(served p2 "$M2"))" test "$(served p2 "$M2")" -ge 4

# --- it comes back ------------------------------------------------------
MD=$(log_mark "$T/dl.log")
hosts 127.0.0.2 127.0.0.3
check "127.0.0.3 is back in the answer" \
	wait_log "$T/dl.log" "event=peer_dns_add name=\"?$NAME\"? addr=\"?127.0.0.3:$P_PORT" 10 "$MD"
check "a link to 127.0.0.3 is up again" up_to 127.0.0.3 "$MD"
M3=$(log_mark "$T/p3.log")
check "6 requests at once succeed" test "$(burst 6)" = 0
check "127.0.0.3 computes requests again ($(served p3 "$M3"))" test "$(served p3 "$M3")" -ge 1

# --- the DNS server goes away -------------------------------------------
MD=$(log_mark "$T/dl.log")
kill -TERM "$PID_dns"; wait "$PID_dns" 2>/dev/null || true
check "a failed resolution is logged" wait_log "$T/dl.log" "event=peer_dns_error name=\"?$NAME\"? msg=.*links_kept=1" 10 "$MD"
sleep 1
check "and drains nothing" test "$(log_count "$T/dl.log" "event=peer_dns_drain" "$MD")" = 0
check "requests still succeed" test "$(burst 4)" = 0

# --- decode stops cleanly ----------------------------------------------
kill -TERM "$PID_dl"
stopped() { ! kill -0 "$PID_dl" 2>/dev/null; }
check "decode exits on SIGTERM (names, timers and lookups closed)" wait_for 15 stopped
rc=0; wait "$PID_dl" || rc=$?
check "with status 0 (got $rc)" test "$rc" = 0

# --- keyless: a name's addresses must be loopback -----------------------
printf '10.77.0.9 off.kvd.test\n127.0.0.2 %s\n' "$NAME" > "$T/hosts"
dnsmasq --keep-in-foreground --conf-file=/dev/null --no-resolv --no-hosts --local=/kvd.test/ \
	--addn-hosts="$T/hosts" --listen-address=$DNS --bind-interfaces --port=53 \
	--user=root --pid-file= --log-facility="$T/dnsmasq2.log" &
PID_dns=$!
PIDS+=("$PID_dns")
check "dnsmasq is back" wait_for 10 answers 127.0.0.2
next_port; C2=$PORT
KVD_TEST_KEYLESS=1 write_node dk decode "$MODEL" "listen.client=127.0.0.1:$C2" \
	"peers.prefill=off.kvd.test:$P_PORT" "peers.resolve_interval_ms=300"
start_node dk
check "keyless: an off-loopback answer is refused" \
	wait_log "$T/dk.log" "event=peer_dns_error name=\"?off.kvd.test\"? addr=\"?10.77.0.9:$P_PORT\"? msg=.*not a loopback address" 10
check "keyless: and never dialled" test "$(log_count "$T/dk.log" "event=peer_dns_add|event=peer_connect" 0)" = 0
kill -TERM "$PID_dk"
rc=0; wait "$PID_dk" || rc=$?
check "keyless: that decode node stops cleanly too (status $rc)" test "$rc" = 0

finish
