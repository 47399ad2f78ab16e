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
