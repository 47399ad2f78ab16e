# shellcheck shell=bash
# tests/integration/serve_lib.sh - helpers for the serving tests: write
# node configs, start prefill/decode pairs on loopback, ask them through
# kvctl generate, read page accounting through kvctl status. Sourced after
# lib.sh (which traps EXIT and kills every pid in PIDS).

# Test ports come from below the kernel's ephemeral range
# (net.ipv4.ip_local_port_range, 32768 by default), so no outgoing
# connection on the machine can hold one: a port taken from inside that
# range can be bound by another process's connect(2) between next_port and
# the node's bind, and a node connecting to a peer port that nobody listens
# on yet can even be handed that very port as its own (a TCP self-connect).
EPHEMERAL_LO=$(awk '{ print $1 }' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
[ "${EPHEMERAL_LO:-0}" -gt 12000 ] 2>/dev/null || EPHEMERAL_LO=32768
PORT=$((10000 + (RANDOM % ((EPHEMERAL_LO - 11000) / 10)) * 10 + $$ % 10))
# next_port: PORT is the next port nobody on this machine listens on (other
# test runs may share the machine; not in a subshell), wrapping before the
# ephemeral range.
next_port() {
	PORT=$((PORT + 1))
	[ "$PORT" -lt $((EPHEMERAL_LO - 1)) ] || PORT=10000
	while (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; do
		PORT=$((PORT + 1))
		[ "$PORT" -lt $((EPHEMERAL_LO - 1)) ] || PORT=10000
	done
}

# listening PORT: something listens on 127.0.0.1:PORT (without
# connecting to it, where ss is installed).
listening() {
	if command -v ss >/dev/null 2>&1; then
		ss -Hltn "sport = :$1" 2>/dev/null | grep -q .
	else
		(exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
	fi
}

# gen_model OUT [extra kvctl model make args]: a small deterministic model.
gen_model() {
	local out=$1; shift
	"$KVCTL" model make "$out" --layers 2 --dim 64 --heads 4 --kv-heads 2 \
		--ff 128 --vocab 320 --ctx 512 --seed 11 "$@" >/dev/null
}

# cluster_key: the test's shared cluster secret (kvctl keygen), made once.
cluster_key() {
	[ -f "$T/cluster.key" ] || "$KVCTL" keygen "$T/cluster.key"
	echo "$T/cluster.key"
}

# verbs_device: the RDMA device the tests' nodes use with
# KVD_TEST_TRANSPORT=verbs: KVD_TEST_VERBS_DEVICE (a device name, or
# emu:DIR[,opts]), else an emulated device in $T/rdma that delivers every
# write as soon as it arrives (auto=1). tests/verbs/run sets these two
# variables to run a suite over a real device (and KVD_TEST_VERBS_PORT,
# KVD_TEST_VERBS_GID_INDEX for transfer.verbs_port / verbs_gid_index).
verbs_device() {
	if [ -n "${KVD_TEST_VERBS_DEVICE:-}" ]; then
		echo "$KVD_TEST_VERBS_DEVICE"
	else
		mkdir -p "$T/rdma"
		echo "emu:$T/rdma,auto=1"
	fi
}

# write_node NAME ROLE MODEL [KEY=VALUE ...] - keys as section.key
# (node.* keys join the [node] section, model.* ones the [model] section).
# Nodes are authenticated peers (peers.key_file) unless KVD_TEST_KEYLESS=1
# or the caller passes peers.key_file= (empty: keyless, loopback only).
# KVD_TEST_TRANSPORT=verbs: prefill and decode nodes move KV over RDMA
# (transfer.transport=verbs on verbs_device; a caller's keys win), with
# transfer.verbs_write_scope = KVD_TEST_VERBS_SCOPE (auto, mw, mr) when
# it is set. Decode nodes keep every request on the transfer path
# (cache.decode_reuse=off: the tests of transfers, fences and coverage
# must not see a repeated prompt served from decode's own cache);
# cache_disagg.sh turns it on to test that reuse.
write_node() {
	local name=$1 role=$2 model=$3; shift 3
	local -A kv=(
		[kv.pool_tokens]=4096 [kv.dtype]=f32 [kv.page_tokens]=16
		[engine.threads]=1 [log.level]=debug [transfer.heartbeat_ms]=200
		[transfer.release_timeout_ms]=2000
	)
	if [ "${KVD_TEST_TRANSPORT:-tcp}" = verbs ] && [ "$role" != standalone ]; then
		[ -n "${KVD_TEST_VERBS_DEVICE:-}" ] || need_verbs_emu "KVD_TEST_TRANSPORT=verbs"
		kv[transfer.transport]=verbs
		kv[transfer.verbs_device]=$(verbs_device)
		[ -z "${KVD_TEST_VERBS_PORT:-}" ] || kv[transfer.verbs_port]=$KVD_TEST_VERBS_PORT
		[ -z "${KVD_TEST_VERBS_GID_INDEX:-}" ] ||
			kv[transfer.verbs_gid_index]=$KVD_TEST_VERBS_GID_INDEX
		[ -z "${KVD_TEST_VERBS_SCOPE:-}" ] ||
			kv[transfer.verbs_write_scope]=$KVD_TEST_VERBS_SCOPE
	fi
	[ "${KVD_TEST_KEYLESS:-0}" = 1 ] || kv[peers.key_file]=$(cluster_key)
	[ "$role" != decode ] || kv[cache.decode_reuse]=off
	local a sec
	for a in "$@"; do [ -n "$a" ] && kv[${a%%=*}]=${a#*=}; done
	{
		printf '[node]\nname = %s\nrole = %s\n' "$name" "$role"
		for a in "${!kv[@]}"; do
			if [ "${a%%.*}" = node ]; then
				printf '%s = %s\n' "${a#*.}" "${kv[$a]}"
			fi
		done
		printf '[model]\npath = %s\n' "$model"
		for a in "${!kv[@]}"; do
			if [ "${a%%.*}" = model ]; then
				printf '%s = %s\n' "${a#*.}" "${kv[$a]}"
			fi
		done
		printf '[admin]\nsocket = %s/%s.sock\n' "$T" "$name"
		for sec in kv engine cache listen http tenants peers transfer log; do
			printf '[%s]\n' "$sec"
			for a in "${!kv[@]}"; do
				if [ "${a%%.*}" = "$sec" ]; then
					printf '%s = %s\n' "${a#*.}" "${kv[$a]}"
				fi
			done
		done
	} > "$T/$name.ini"
}

# start_node NAME [ENV=VALUE ...]: run kvd in the background; pid in
# PID_<NAME>.
start_node() {
	local name=$1; shift
	env "$@" "$KVD" --config "$T/$name.ini" >> "$T/$name.log" 2>&1 &
	PIDS+=($!)
	printf -v "PID_$name" '%s' "$!"
}

stop_node() { # stop_node NAME: SIGTERM, wait for exit
	local p="PID_$1"
	[ -n "${!p:-}" ] || return 0
	kill -TERM "${!p}" 2>/dev/null || true
	wait "${!p}" 2>/dev/null || true
}

# pair NAME_P NAME_D MODEL [prefill keys] -- [decode keys]: write and
# start a prefill and a decode node, wait until decode sees its peer.
# Sets P_PORT, C_PORT (decode's client port).
pair() {
	local p=$1 d=$2 model=$3; shift 3
	local pk=() dk=() side=p a
	for a in "$@"; do
		if [ "$a" = "--" ]; then side=d; continue; fi
		if [ $side = p ]; then pk+=("$a"); else dk+=("$a"); fi
	done
	next_port; P_PORT=$PORT
	next_port; C_PORT=$PORT
	write_node "$p" prefill "$model" "listen.peer=127.0.0.1:$P_PORT" "${pk[@]}"
	write_node "$d" decode "$model" "listen.client=127.0.0.1:$C_PORT" \
		"peers.prefill=127.0.0.1:$P_PORT" "${dk[@]}"
}

# wait_up DECODE_NAME: the decode node logged its peer's capacity.
wait_up() { wait_log "$T/$1.log" "event=peer_capacity" "${2:-40}"; }

# gen PORT ARGS...: kvctl generate --json against 127.0.0.1:PORT.
gen() {
	local port=$1; shift
	timeout 60 "$KVCTL" generate --server "127.0.0.1:$port" --json "$@"
}

# offline ARGS...: kvd generate --json (the solo reference).
offline() { timeout 60 "$KVD" generate --json "$@"; }

# JSON is read with jq when it is installed (a tenth of python's start-up
# cost, which is what settle() and friends pay on every poll of a loaded
# machine), else with python3.
if command -v jq >/dev/null 2>&1; then HAVE_JQ=1; else HAVE_JQ=0; fi

# json_path PATH: one field (PATH like pool.free) of the JSON object on
# stdin; lists as a,b,c; absent or unparsable: empty.
json_path() {
	if [ $HAVE_JQ = 1 ]; then
		jq -r --arg p "$1" 'getpath($p | split(".")) |
			if type == "array" then map(tostring) | join(",")
			elif . == null then "" else tostring end' 2>/dev/null || true
		return 0
	fi
	python3 -c 'import json,sys
try:
    o=json.loads(sys.stdin.read() or "{}")
    for k in sys.argv[1].split("."):
        o=o.get(k,"") if isinstance(o,dict) else ""
except Exception:
    o=""
if isinstance(o,bool):
    o=str(o).lower()
print(",".join(map(str,o)) if isinstance(o,list) else o)' "$1"
}

# json_get KEY: read one key of a JSON object on stdin (lists as a,b,c).
json_get() { json_path "$1"; }

# held NAME: pages held on that node (reserved, filling, ready, fenced,
# and cached pages a running request maps), from kvctl status. Cached
# pages nobody maps are the cache's (evictable), not held. Quarantined
# pages are out of circulation for
# good, not held by anyone: tests that expect none assert pool.quarantined.
held() {
	local st
	st=$("$KVCTL" --socket "$T/$1.sock" --json status 2>/dev/null) || return 0
	if [ $HAVE_JQ = 1 ]; then
		jq -r '.pool | .reserved + .filling + .ready + .fenced + .cached_held' <<<"$st" 2>/dev/null || true
		return 0
	fi
	python3 -c 'import json,sys
p=json.loads(sys.argv[1])["pool"]
print(p["reserved"]+p["filling"]+p["ready"]+p["fenced"]+p["cached_held"])' "$st" 2>/dev/null || true
}

# status_get NAME PATH: a field of kvctl status (PATH like counters.failed);
# empty when the node does not answer.
status_get() {
	"$KVCTL" --socket "$T/$1.sock" --json status 2>/dev/null | json_path "$2"
}

# idle NAME...: every named node holds no page and has nothing in flight
# (a node that does not answer is not idle).
idle() {
	local name
	for name in "$@"; do
		[ "$(held "$name")" = 0 ] && [ "$(status_get "$name" in_flight)" = 0 ] || return 1
	done
}

# settle NAME...: wait (up to 10 s x TSCALE) until idle NAME...
settle() { wait_for 10 idle "$@"; }

# no_token OUT: OUT is a client answer that carries a typed error and no
# token. An empty or unparsable answer (the client timed out, never
# connected, the request never ran) is not "no token": it fails.
no_token() {
	if [ $HAVE_JQ = 1 ]; then
		jq -en --arg o "$1" '$o | fromjson | type == "object" and
			((.error // "") | length > 0) and
			((.output_ids // []) | length == 0)' >/dev/null 2>&1
		return
	fi
	python3 -c 'import json,sys
try:
    o=json.loads(sys.argv[1])
except Exception:
    sys.exit("no_token: not a client answer: %r" % sys.argv[1][:200])
if not isinstance(o,dict) or not o.get("error"):
    sys.exit("no_token: no typed error in %r" % sys.argv[1][:200])
if o.get("output_ids"):
    sys.exit("no_token: tokens emitted: %r" % o.get("output_ids"))' "$1"
}

# sent_since NAME MARK: the decode node NAME sent a prefill_request after
# MARK (log_mark of its log): the request under test really ran.
sent_since() { log_has "$T/$1.log" "event=prefill_sent " "$2"; }

# ran_no_token OUT NAME MARK: no_token OUT, and the request reached the
# transfer on decode NAME after MARK.
ran_no_token() { no_token "$1" && sent_since "$2" "$3"; }

# last_sent_id NAME MARK: the id of the latest prefill_request decode NAME
# sent after MARK (empty if none).
last_sent_id() {
	log_since "$T/$1.log" "$2" | grep -o 'event=prefill_sent id=[0-9]*' | tail -1 | sed 's/.*id=//' || true
}

# rid NAME [N]: the id of the N-th (default 1st) request node NAME
# registered. Ids count up from a random start on each node
# (daemon/node/request.c), never from 1; its first req_state line
# (log.level=debug) gives the start. Empty before its first request.
rid() {
	local f
	f=$(grep -o -m1 'event=req_state id=[0-9]*' "$T/$1.log" | sed 's/.*id=//' || true)
	[ -z "$f" ] || echo $((f + ${2:-1} - 1))
}

# same_ids A B: two JSON outputs carry the same non-empty output_ids.
same_ids() {
	local a b
	a=$(echo "$1" | json_get output_ids)
	b=$(echo "$2" | json_get output_ids)
	[ -n "$a" ] && [ "$a" = "$b" ]
}

# same_text A B: two JSON outputs carry the same "text" (byte for byte).
same_text() {
	if [ $HAVE_JQ = 1 ]; then
		jq -en --arg a "$1" --arg b "$2" '($a | fromjson | .text) == ($b | fromjson | .text)' \
			>/dev/null 2>&1
		return
	fi
	python3 -c 'import json,sys
a=json.loads(sys.argv[1]); b=json.loads(sys.argv[2])
sys.exit(0 if a.get("text")==b.get("text") else 1)' "$1" "$2" 2>/dev/null
}

# serve_finish: no node log holds a sanitizer report (ASan/UBSan/LSan
# builds), then lib.sh's finish.
serve_finish() {
	local f bad=0
	for f in "$T"/*.log; do
		[ -e "$f" ] || continue
		if grep -qE "ERROR: (Address|Leak)Sanitizer|runtime error:" "$f"; then
			not_ok "sanitizer report in $(basename "$f")"
			grep -E -A12 "ERROR: (Address|Leak)Sanitizer|runtime error:" "$f" | head -40
			bad=1
		fi
	done
	[ $bad = 1 ] || ok "no sanitizer report in any node log"
	finish
}

# ---- verbs suites (serve_verbs_faults, serve_verbs_liar) ----

# served_equal LABEL (needs PROMPT, M, C_PORT): the next request is
# served and equals `kvd generate`.
served_equal() {
	local a b
	a=$(gen "$C_PORT" --prompt "$PROMPT" --max-tokens 12 --temperature 0 || true)
	b=$(offline --model "$M" --prompt "$PROMPT" --max-tokens 12 --temperature 0 || true)
	check "$1: the next request is served, equal to kvd generate" \
		eval 'same_ids "$a" "$b" && same_text "$a" "$b"'
}

# fence_until_drained NODE ID: the request's LINK_LOST step (where its
# pages are unfenced) comes after the transport logged that its QP was
# drained and closed.
fence_until_drained() {
	local f=$T/$1.log c l
	c=$(grep -n "event=verbs_closed side=receiver" "$f" | head -1 | cut -d: -f1)
	l=$(grep -n "event=req_state id=$2 .*event=link_lost" "$f" | head -1 | cut -d: -f1)
	[ -n "$c" ] && [ -n "$l" ] && [ "$c" -lt "$l" ]
}

# promtool_ok FILE: promtool parses the Prometheus text in FILE and its
# linter finds nothing but the colon of vLLM's names
# (http.metrics_vllm_names: the format allows it, the linter reserves it
# for recording rules). promtool exits 3 for lint findings, 1 for a text
# it cannot parse; any other finding is printed and fails.
promtool_ok() {
	local rc=0 other
	promtool check metrics < "$1" > "$1.lint" 2>&1 || rc=$?
	[ $rc = 0 ] && return 0
	[ $rc = 3 ] || { cat "$1.lint" >&2; return 1; }
	other=$(grep -cv "^vllm:[a-z0-9_:]* metric names should not contain ':'\$" "$1.lint" || true)
	[ "$other" = 0 ] || { cat "$1.lint" >&2; return 1; }
}
