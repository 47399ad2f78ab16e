# shellcheck shell=bash
# tests/integration/lb_lib.sh - HAProxy in front of decode nodes, for
# haproxy_lb.sh, rolling_restart.sh and kill_nodes.sh. Sourced after
# lib.sh and serve_lib.sh. The HAProxy config is the committed one,
# deploy/haproxy/kvd.cfg, read as it is: its addresses come from the
# environment (KVD_LB_BIND, KVD_DECODE1, KVD_DECODE2, KVD_LB_STATS,
# KVD_LB_LOG, KVD_LB_STATS_HTTP), so nothing is rewritten on the way.

LB_CFG=${KVD_SRC:?KVD_SRC not set}/deploy/haproxy/kvd.cfg
LB_LOAD=$KVD_SRC/tests/integration/lb_load.py

# need_haproxy: skip unless haproxy can run the config here: installed
# (tests/deps.sh), root (the config drops to user haproxy and chroots to
# /var/lib/haproxy, as on a Debian host), the package's user and chroot.
need_haproxy() {
	PATH=$PATH:/usr/sbin
	command -v haproxy >/dev/null 2>&1 ||
		skip "haproxy is not installed (Debian package haproxy, tests/deps.sh)"
	[ "$(id -u)" -eq 0 ] || skip "haproxy runs the config as root (user haproxy, chroot): not root"
	getent passwd haproxy >/dev/null && [ -d /var/lib/haproxy ] ||
		skip "no haproxy user or /var/lib/haproxy (the Debian package makes both)"
	command -v python3 >/dev/null || skip "python3 absent"
	command -v curl >/dev/null || skip "curl absent"
	command -v jq >/dev/null || skip "jq absent"
}

# lb_env BIND D1 D2: the environment the config reads (LB_STATS: the
# stats frontend's port, from next_port)
lb_env() {
	echo "KVD_LB_BIND=$1" "KVD_DECODE1=$2" "KVD_DECODE2=$3" \
		"KVD_LB_STATS=$T/lb.sock" "KVD_LB_LOG=stdout" "KVD_LB_STATS_HTTP=127.0.0.1:$LB_STATS"
}

# lb_start BIND D1 D2: check the config, run haproxy in the foreground
# (-db) with it; its log (one httplog line a request) in $T/lb.log.
lb_start() {
	local e
	next_port; LB_STATS=$PORT
	read -ra e <<<"$(lb_env "$@")"
	env "${e[@]}" haproxy -c -q -f "$LB_CFG" > "$T/lb.check" 2>&1 ||
		{ cat "$T/lb.check" >&2; return 1; }
	env "${e[@]}" haproxy -db -f "$LB_CFG" >> "$T/lb.log" 2>&1 &
	PIDS+=($!)
	PID_lb=$!
}

# lb_csv: haproxy's stats table (the stats frontend's /stats;csv; curl,
# not a python client: a python start costs a second on a loaded machine)
lb_csv() { curl -s --max-time 5 "http://127.0.0.1:$LB_STATS/stats;csv" 2>/dev/null || true; }

# lb_state SERVER: UP, DOWN, ... as haproxy's health checks see it
# (the status column; "UP 1/2" while going down is UP).
lb_state() {
	lb_csv | awk -F, -v s="$1" '$1 == "kvd_decode" && $2 == s { split($18, a, " "); print a[1] }'
}
lb_is() { [ "$(lb_state "$1")" = "$2" ]; }

# lb_retries SERVER: requests haproxy retried from SERVER (wretr)
lb_retries() {
	lb_csv | awk -F, -v s="$1" '$1 == "kvd_decode" && $2 == s { print $16 }'
}

# readyz PORT: the node's /readyz status code
readyz() { curl -s -o /dev/null -w '%{http_code}' --max-time 5 "http://$1/readyz" || true; }

# served NODE TENANT [MARK]: completions the node answered 200 for TENANT
served() {
	log_count "$T/$1.log" "event=http_request .*tenant=\"?$2\"? .*path=\"?/v1/completions\"? status=200 " "${3:-0}"
}

# pool_clean NAME...: every named node answers, holds no page, has
# nothing in flight, quarantined nothing, and every page is free (or
# the prefix cache's, evictable)
pool_clean() {
	local n st
	for n in "$@"; do
		st=$("$KVCTL" --socket "$T/$n.sock" --json status 2>/dev/null) || return 1
		jq -e '.in_flight == 0 and .pool.quarantined == 0 and
			(.pool.reserved + .pool.filling + .pool.ready + .pool.fenced + .pool.cached_held) == 0 and
			(.pool.free + .pool.cached) == .pool.pages' <<<"$st" >/dev/null || return 1
	done
}
pool_line() { # pool_line NAME: the pool's figures, for a report
	"$KVCTL" --socket "$T/$1.sock" --json status 2>/dev/null | jq -c '{state, in_flight, pool: (.pool | {pages, free, cached, reserved, filling, ready, fenced, quarantined})}' || echo "$1: no answer"
}

# load_start URL OUT KEYS [ARGS]: closed-loop streaming clients (lb_load.py)
# until load_stop; one JSON line a request in OUT
load_start() {
	local url=$1 out=$2 keys=$3; shift 3
	rm -f "$T/load.stop"
	python3 "$LB_LOAD" load "$url" "$out" "$T/load.stop" --keys "$keys" "$@" &
	PIDS+=($!)
	PID_load=$!
}
load_stop() {
	touch "$T/load.stop"
	wait "$PID_load" || true
}
# load_stats OUT [ARGS]: lb_load.py stats
load_stats() { python3 "$LB_LOAD" stats "$@"; }
now() { date +%s.%N; }

# ---- a cluster behind haproxy: two decode, two prefill nodes, by name ----
# (rolling_restart.sh, kill_nodes.sh)

# lb_netns SCRIPT ARGS...: run SCRIPT again in its own network and mount
# namespaces (peer_dns.sh's way: dnsmasq on 127.0.0.53 there, a
# resolv.conf naming it bind-mounted over /etc/resolv.conf there only),
# or skip; returns at once inside them. Before lib.sh.
lb_netns() {
	[ -z "${KVD_LB_NS:-}" ] || return 0
	command -v dnsmasq >/dev/null 2>&1 || [ -x /usr/sbin/dnsmasq ] ||
		{ echo "SKIP: dnsmasq is not installed (Debian package dnsmasq-base, tests/deps.sh)"; exit 77; }
	command -v unshare >/dev/null 2>&1 || { echo "SKIP: no unshare (util-linux)"; exit 77; }
	[ "$(id -u)" -eq 0 ] || { echo "SKIP: haproxy runs the config as root (user haproxy, chroot): not root"; exit 77; }
	unshare -n -m true 2>/dev/null ||
		{ echo "SKIP: cannot create network and mount namespaces (unshare -n -m)"; exit 77; }
	KVD_LB_NS=1 exec unshare -n -m bash "$@"
}

# lb_hosts: write $T/hosts from LB_OUT (prefill addresses out of the
# answer) and reload dnsmasq. Names: prefill.kvd.test (the prefill nodes'
# addresses, 127.0.0.2 and .3, a headless Service's answer), decode-1 and
# decode-2.kvd.test (127.0.0.4, .5: haproxy's servers).
LB_OUT=""
lb_hosts() {
	local ip
	: > "$T/hosts.new"
	for ip in 127.0.0.2 127.0.0.3; do
		[[ " $LB_OUT " == *" $ip "* ]] || echo "$ip prefill.kvd.test" >> "$T/hosts.new"
	done
	printf '127.0.0.4 decode-1.kvd.test\n127.0.0.5 decode-2.kvd.test\n' >> "$T/hosts.new"
	mv "$T/hosts.new" "$T/hosts"
	[ -z "${PID_dns:-}" ] || kill -HUP "$PID_dns"
}

# lb_answers NAME IP...: the system resolver gives exactly these for NAME
lb_answers() {
	local name=$1; shift
	test "$(python3 -c 'import socket, sys
print(" ".join(sorted({a[4][0] for a in socket.getaddrinfo(sys.argv[1], 1, socket.AF_INET, socket.SOCK_STREAM)})))' "$name" 2>/dev/null)" = "$*"
}

# lb_cluster MODEL [PREFILL_ENV...]: dnsmasq, prefill nodes p1 (127.0.0.2)
# and p2 (127.0.0.3) on P_PORT, decode nodes d1 (127.0.0.4) and d2
# (127.0.0.5) on H_PORT (HTTP; peers.prefill = prefill.kvd.test:P_PORT),
# haproxy on 127.0.0.1:LB_PORT with KVD_DECODEn = decode-n.kvd.test:H_PORT.
# API keys KEYS[0..7] (tenant0..7); LB_KEYS_1 / LB_KEYS_2: the indexes of
# the keys haproxy sends to d1 / d2. PREFILL_ENV: for start_node (faults).
# LB_NODE_KEYS: more config keys for every node; LB_PREFILL_LOG,
# LB_DECODE_LOG: their log levels (info).
LB_PREFILL_ENV=()
LB_NODE_KEYS=()
lb_cluster() {
	local model=$1 i n; shift
	LB_PREFILL_ENV=("$@")
	PATH=$PATH:/usr/sbin
	ip link set lo up 2>/dev/null || skip "cannot bring up loopback in the network namespace"
	printf 'nameserver 127.0.0.53\noptions timeout:1 attempts:1\n' > "$T/resolv.conf"
	mount --bind "$T/resolv.conf" /etc/resolv.conf 2>/dev/null ||
		skip "cannot bind-mount a resolv.conf in the mount namespace"
	lb_hosts
	dnsmasq --keep-in-foreground --conf-file=/dev/null --no-resolv --no-hosts --local=/kvd.test/ \
		--addn-hosts="$T/hosts" --listen-address=127.0.0.53 --bind-interfaces --port=53 \
		--user=root --pid-file= --local-ttl=0 --log-facility="$T/dnsmasq.log" &
	PID_dns=$!
	PIDS+=("$PID_dns")
	wait_for 10 lb_answers prefill.kvd.test 127.0.0.2 127.0.0.3 || return 1
	KEYS=()
	: > "$T/keys"
	for ((i = 0; i < 8; i++)); do
		KEYS+=("t$i-0123456789abcdef0123456789abcdef-$i")
		echo "${KEYS[$i]} tenant$i" >> "$T/keys"
	done
	chmod 600 "$T/keys"
	next_port; P_PORT=$PORT
	next_port; H_PORT=$PORT
	next_port; LB_PORT=$PORT
	for n in 1 2; do
		write_node "p$n" prefill "$model" "listen.peer=127.0.0.$((n + 1)):$P_PORT" "log.level=${LB_PREFILL_LOG:-info}" "${LB_NODE_KEYS[@]}"
		write_node "d$n" decode "$model" "listen.http=127.0.0.$((n + 3)):$H_PORT" \
			"http.api_keys_file=$T/keys" "peers.prefill=prefill.kvd.test:$P_PORT" \
			"peers.resolve_interval_ms=2000" "transfer.prefill_timeout_ms=20000" \
			"transfer.transfer_timeout_ms=20000" "log.level=${LB_DECODE_LOG:-info}" "${LB_NODE_KEYS[@]}"
	done
	start_node p1 "${LB_PREFILL_ENV[@]}"
	start_node p2 "${LB_PREFILL_ENV[@]}"
	start_node d1
	start_node d2
	lb_alive() { local n; for n in p1 p2 d1 d2; do kill -0 "$(eval echo "\$PID_$n")" 2>/dev/null || return 2; done; }
	wait_for 40 eval 'lb_alive && [ "$(readyz 127.0.0.4:$H_PORT)" = 200 ] && [ "$(readyz 127.0.0.5:$H_PORT)" = 200 ] || { lb_alive || return 0; false; }' &&
		lb_alive ||
		{ echo "# decode nodes not ready" >&2; return 1; }
	for n in 1 2; do
		for i in 2 3; do
			wait_log "$T/d$n.log" "event=peer_up peer=\"?127.0.0.$i:$P_PORT\"?" 20 ||
				{ echo "# d$n: no link to 127.0.0.$i" >&2; return 1; }
		done
	done
	lb_start "127.0.0.1:$LB_PORT" "decode-1.kvd.test:$H_PORT" "decode-2.kvd.test:$H_PORT" || return 1
	wait_for 15 eval 'lb_is decode1 UP && lb_is decode2 UP' || return 1
	LB_URL=http://127.0.0.1:$LB_PORT
	# which node each key lands on
	local m1 m2
	m1=$(log_mark "$T/d1.log"); m2=$(log_mark "$T/d2.log")
	for ((i = 0; i < 8; i++)); do
		curl -s -o /dev/null -H "Authorization: Bearer ${KEYS[$i]}" \
			-d "{\"prompt\":\"key $i\",\"max_tokens\":2}" "$LB_URL/v1/completions" || true
	done
	LB_KEYS_1=(); LB_KEYS_2=()
	for ((i = 0; i < 8; i++)); do
		if [ "$(served d1 "tenant$i" "$m1")" = 1 ]; then LB_KEYS_1+=("$i")
		elif [ "$(served d2 "tenant$i" "$m2")" = 1 ]; then LB_KEYS_2+=("$i"); fi
	done
	echo "# keys on d1: ${LB_KEYS_1[*]:-none}; on d2: ${LB_KEYS_2[*]:-none}"
	[ "${#LB_KEYS_1[@]}" -ge 2 ] && [ "${#LB_KEYS_2[@]}" -ge 2 ]
}

# lb_load_keys N: N keys of each decode node, comma-separated (for
# load_start: 2N clients, half on each node while both are up)
lb_load_keys() {
	local out="" i
	for ((i = 0; i < $1; i++)); do
		out+="${KEYS[${LB_KEYS_1[$i]}]},${KEYS[${LB_KEYS_2[$i]}]},"
	done
	echo "${out%,}"
}
jqt() { jq -e "$@" >/dev/null; }   # a jq test, quiet
