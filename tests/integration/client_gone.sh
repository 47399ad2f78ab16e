#!/usr/bin/env bash
# A client that goes away is the client's choice, not a failure of the
# node: it is logged at info with its own reason (event=client_gone, and
# for an HTTP connection closed mid-exchange event=client_closed
# reason=client_gone), and its orphaned request, which still completes
# its transfer (invariant 8), ends without a warning. Before, each such
# request ended with `level=warn event=request_failed code=INTERNAL
# msg="the request ended unanswered"` and the HTTP close was a warning.
# Needs fault points (prefill's slow_batch holds a transfer 300 ms, so
# the client can leave while its request's KV is still moving).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/serve_lib.sh"
command -v curl >/dev/null || skip "curl absent"
grep -q "KVD_FAULT_POINTS 1" "$KVD_BUILD/kvd_build.h" ||
	skip "needs fault points (meson -Dfault_points=true)"

gen_model "$T/m.gguf"
next_port; H=$PORT
pair pi di "$T/m.gguf" -- "listen.http=127.0.0.1:$H"
start_node di
start_node pi KVD_FAULT=slow_batch
check "decode paired" wait_up di
U=http://127.0.0.1:$H

# ---- HTTP: curl killed mid-transfer (its socket closes with a FIN) -----------------
MD=$(log_mark "$T/di.log")
timeout 0.15 curl -s "$U/v1/completions" -d '{"prompt":"Once upon a time","max_tokens":40}' \
	>/dev/null 2>&1 || true
check "HTTP: event=client_gone at info, naming the state" \
	wait_log "$T/di.log" "level=info .*event=client_gone .*state=transfer" 10 "$MD"
id=$(log_since "$T/di.log" "$MD" | grep -o 'event=client_gone id=[0-9]*' | head -1 | sed 's/.*id=//')
check "  ... the transfer still completed" wait_log "$T/di.log" "event=transfer_done id=$id " 10 "$MD"
check "  ... the connection's close at info, reason=client_gone" \
	log_has "$T/di.log" "level=info .*event=client_closed .*proto=http reason=client_gone" "$MD"
sleep 0.5
check "  ... no request_failed line for it" bash -c \
	"! grep -E 'event=request_failed id=$id ' <(tail -c +$((MD + 1)) '$T/di.log')"
check "  ... and no warning at all" bash -c \
	"! grep -E 'level=(warn|error)' <(tail -c +$((MD + 1)) '$T/di.log')"

# ---- the msgpack socket: kvctl generate killed mid-transfer ------------------------------
MD=$(log_mark "$T/di.log")
timeout 0.15 "$KVCTL" generate --server "127.0.0.1:$C_PORT" --prompt "Once upon a time" \
	--max-tokens 40 >/dev/null 2>&1 || true
check "msgpack: the request ends (client_gone or request_done)" \
	wait_log "$T/di.log" "event=(client_gone|request_done) " 10 "$MD"
sleep 1
check "  ... no request_failed line, no warning" bash -c \
	"! grep -E 'event=request_failed|level=(warn|error)' <(tail -c +$((MD + 1)) '$T/di.log')"

stop_node di
stop_node pi
finish
