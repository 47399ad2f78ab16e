#!/usr/bin/env bash
# Tenants as a boundary of the serving layer (issue 21, deliverables 2 and
# 4): each attack below failed on the code before it.
#   - /metrics names every tenant's series: a tenant's key gets 403, only
#     an admin key (role `admin` in the keys file) reads it;
#   - the msgpack client API with a keys file: a request without an auth
#     frame is a frame_error and nothing is served; `auth` with a good key
#     serves the request as the key's tenant;
#   - silent (keyless, idle) connections filling listen.max_clients do not
#     keep a client with a key out, on HTTP and on the msgpack socket: the
#     oldest unauthenticated connection makes room;
#   - a refusal at listen.max_clients reads the request first (HTTP: its
#     head, then drops its body; msgpack: drops what it sends after the
#     frame_error and FIN): a client
#     that sends a 3 MB body reads the 503, not a reset (before: its send
#     failed with a reset, the request unread);
#   - a busy node queues instead of refusing: a tenant's requests past the
#     node's slots wait in its queue, and only past its max_queued are
#     refused, with 429 and Retry-After;
#   - fairness: tenant A floods (12 streamed requests of 400 tokens in
#     flight, closed loop, engine.max_batch = 4) while tenant B sends one
#     short request at a time: B's next request gets the next free slot
#     (its TTFT is bounded by one of A's requests, below the first-come
#     order, where it queued behind A's whole flood), and with a per-tenant
#     max_active that leaves B a slot it is served at once. The figures
#     are printed, with the same flood on a node that admits everything at
#     once (tenants.node_max_active = 1000: the order before the gate).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/serve_lib.sh"
command -v curl >/dev/null || skip "curl absent"
command -v python3 >/dev/null || skip "python3 absent"
TC=$(dirname "$0")/tenant_client.py

# requests that take a while: ~4 ms a token on one thread
"$KVCTL" model make "$T/m.gguf" --layers 8 --dim 256 --heads 4 --kv-heads 2 \
	--ff 512 --vocab 320 --ctx 1024 --seed 11 >/dev/null
M=$T/m.gguf
KEY_A=alice-0123456789abcdef0123456789abcdef
KEY_B=bob-0123456789abcdef0123456789abcdef00
KEY_C=carol-0123456789abcdef0123456789abcdef
KEY_OPS=ops-0123456789abcdef0123456789abcdef000
printf '%s alice\n%s bob user\n%s carol max_queued=2\n%s ops admin\n' \
	"$KEY_A" "$KEY_B" "$KEY_C" "$KEY_OPS" > "$T/keys"
chmod 600 "$T/keys"
code() { curl -s -o "$T/body" -w '%{http_code}' "$@"; }

# ---- config: a non-loopback msgpack socket needs keys ---------------------------
write_node cfg1 standalone "$M" "listen.client=0.0.0.0:7600"
rc=0; "$KVD" --check-config --config "$T/cfg1.ini" >"$T/cfg1.out" 2>&1 || rc=$?
check "non-loopback listen.client without keys: exit 78 naming http.api_keys_file" \
	bash -c "test $rc = 78 && grep -q 'api_keys_file' '$T/cfg1.out'"
write_node cfg2 standalone "$M" "listen.client=0.0.0.0:7600" "http.api_keys_file=$T/keys"
check "  ... valid with a keys file (no listen.http needed)" "$KVD" --check-config --config "$T/cfg2.ini"

# ---- one node: metrics, msgpack keys, queues --------------------------------------
next_port; A_HTTP=$PORT; next_port; A_CL=$PORT
write_node ta standalone "$M" "listen.http=127.0.0.1:$A_HTTP" "listen.client=127.0.0.1:$A_CL" \
	"http.api_keys_file=$T/keys" "engine.max_batch=2"
start_node ta
check "standalone up" wait_log "$T/ta.log" "event=serve_ready" 60
U=http://127.0.0.1:$A_HTTP
# the prefix cache split between the keys file's four tenants (128 of the
# 256-page pool's half each: 32), so no tenant's insert needs another's room
check "prefix cache shared out: 4 tenants, 32 pages each" \
	log_has "$T/ta.log" 'event=prefix_cache_shares tenants=4 tenant_pages=32 source=api_keys_file'

check "/metrics with a tenant's key: 403" test "$(code -H "Authorization: Bearer $KEY_B" "$U/metrics")" = 403
check "  ... and none of the text" bash -c "! grep -q kvd_requests_total '$T/body'"
check "/metrics without a key: 401" test "$(code "$U/metrics")" = 401
check "/metrics with the admin key: 200" test "$(code -H "Authorization: Bearer $KEY_OPS" "$U/metrics")" = 200
check "  ... the Prometheus text" grep -q '^kvd_requests_total' "$T/body"

out=$(python3 "$TC" "$A_CL" mp_nokey || true)
echo "# msgpack request without a key: $out"
check "msgpack request without auth: frame_error, nothing served" \
	bash -c "[[ '$out' == frame_error:INVALID_REQUEST* ]] && [[ '$out' != *token* ]]"
out=$(python3 "$TC" "$A_CL" mp_key wrong-key-0123456789 || true)
check "msgpack auth with a wrong key: frame_error" bash -c "[[ '$out' == frame_error* ]]"
MA=$(log_mark "$T/ta.log")
out=$(python3 "$TC" "$A_CL" mp_key "$KEY_A" || true)
echo "# msgpack request after auth: $out"
check "msgpack auth with alice's key: auth_ok, then served" \
	bash -c "[[ '$out' == 'auth_ok:alice token'* ]] && [[ '$out' == *final ]]"
check "  ... as tenant alice" wait_log "$T/ta.log" "event=request_done .*tenant=alice" 5 "$MA"
out=$(KVD_API_KEY=$KEY_B gen "$A_CL" --prompt "Once" --max-tokens 2 || true)
check "kvctl generate with KVD_API_KEY: served" test -n "$(echo "$out" | json_get finish_reason)"
out=$(gen "$A_CL" --prompt "Once" --max-tokens 2 2>&1 || true)
check "kvctl generate without it: refused (INVALID_REQUEST)" bash -c "grep -q INVALID_REQUEST <<<'$out'"

# carol: max_queued=2; the node admits 2 at once (engine.max_batch)
MQ=$(log_mark "$T/ta.log")
out=$(python3 "$TC" "$A_HTTP" burst "$KEY_C" 6 600)
echo "# 6 requests of carol at once, 2 slots, max_queued 2: $out"
check "a busy node queues: 2 admitted + 2 waiting served 200" bash -c "[[ '$out' == '200=4 '* ]]"
check "  ... only past the tenant's queue: 429, with Retry-After" \
	bash -c "[[ '$out' == *' 429=2 retry_after=2 '* ]]"
check "  ... refused as tenant_queue_full" \
	test "$(log_count "$T/ta.log" "event=admission_reject .*tenant=carol reason=tenant_queue_full" "$MQ")" = 2
check "  ... nothing held afterwards" settle ta
stop_node ta

# ---- connection slots: silent connections, a refusal read as a status -------------
next_port; B_HTTP=$PORT; next_port; B_CL=$PORT
write_node tb standalone "$M" "listen.http=127.0.0.1:$B_HTTP" "listen.client=127.0.0.1:$B_CL" \
	"http.api_keys_file=$T/keys" "listen.max_clients=4" "engine.max_batch=8" "http.max_body_bytes=8M"
start_node tb
check "standalone (max_clients 4) up" wait_log "$T/tb.log" "event=serve_ready" 60
python3 "$TC" "$B_HTTP" silent 4 30 > "$T/silent1" &
SIL1=$!; PIDS+=($!)
wait_for 5 grep -q opened=4 "$T/silent1" || true
check "4 silent HTTP connections, then a client with a key: served 200" \
	test "$(code -H "Authorization: Bearer $KEY_A" -d '{"prompt":"Once","max_tokens":2}' "http://127.0.0.1:$B_HTTP/v1/completions")" = 200
check "  ... the oldest silent one made room" log_has "$T/tb.log" "event=client_closed .*proto=http reason=evicted_unauthenticated"
python3 "$TC" "$B_CL" silent 4 30 > "$T/silent2" &
SIL2=$!; PIDS+=($!)
wait_for 5 grep -q opened=4 "$T/silent2" || true
out=$(python3 "$TC" "$B_CL" mp_key "$KEY_A" || true)
check "4 silent msgpack connections, then an authenticated client: served" \
	bash -c "[[ '$out' == 'auth_ok:alice token'* ]] && [[ '$out' == *final ]]"
kill "$SIL1" "$SIL2" 2>/dev/null || true
wait "$SIL1" "$SIL2" 2>/dev/null || true
# four clients with a key hold every slot (a request each, then idle
# keep-alive: authenticated connections are never evicted)
HOLD=()
for i in 1 2 3 4; do python3 "$TC" "$B_HTTP" hold "$KEY_A" 60 > "$T/hold$i" & HOLD+=($!); PIDS+=($!); done
wait_for 10 bash -c "grep -qs holding '$T/hold1' && grep -qs holding '$T/hold2' && grep -qs holding '$T/hold3' && grep -qs holding '$T/hold4'" || true
out=$(python3 "$TC" "$B_HTTP" busy "$KEY_B" 3000000 || true)
echo "# a fifth client with a key and a 3 MB body: $out"
check "a refusal at max_clients reads the request: the client reads 503, not a reset" test "$out" = status=503
check "  ... logged as max_clients" log_has "$T/tb.log" "event=client_refused .*proto=http reason=max_clients"
out=$(python3 "$TC" "$B_CL" mp_busy 50 || true)
echo "# a msgpack client that writes 3 MB of requests at once on a full node: $out"
check "  ... the msgpack socket's refusal too: frame_error OVERLOADED read, not a reset" \
	test "$out" = frame_error:OVERLOADED
kill "${HOLD[@]}" 2>/dev/null || true
stop_node tb

# ---- fairness: B's time to first token while A floods ------------------------------
# The prefix cache is off here: A's flood repeats one prompt, and with the
# cache the gate would hold A's later requests for its first one's prompt
# (the prefix hold-back) - they would no longer be admitted at once, and
# the first-come order this compares against would be gone.
run_ttft() { # run_ttft NAME EXTRA...: print the ttft JSON
	local name=$1; shift
	next_port; local h=$PORT
	write_node "$name" standalone "$M" "listen.http=127.0.0.1:$h" "http.api_keys_file=$T/keys" \
		"engine.max_batch=4" "kv.pool_tokens=16384" "cache.enabled=false" "$@"
	start_node "$name"
	wait_log "$T/$name.log" "event=serve_ready" 60 >/dev/null || true
	python3 "$TC" "$h" ttft "$KEY_A" "$KEY_B" 12 400 8
	stop_node "$name"
}
fair=$(run_ttft tf)
echo "# work-conserving (the default: node_max_active = engine.max_batch): $fair"
capped=$(run_ttft tc "tenants.max_active=3")
echo "# tenants.max_active = 3 of 4 slots: $capped"
fifo=$(run_ttft tg "tenants.node_max_active=1000")
echo "# every request admitted at once (the first-come order before the gate): $fifo"
jv() { python3 -c "import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])" "$1" "$2"; }
check "A's floods ran (no error)" \
	test "$(jv "$fair" a_errors)$(jv "$capped" a_errors)$(jv "$fifo" a_errors)" = 000
check "B's TTFT p50 under A's flood: below the first-come order's" \
	python3 -c "import json,sys; a=json.loads(sys.argv[1]); b=json.loads(sys.argv[2]); sys.exit(not (0 <= a['b_flood_p50_ms'] < b['b_flood_p50_ms']))" "$fair" "$fifo"
check "  ... bounded by one of A's requests (its time in the flood)" \
	python3 -c "import json,sys; d=json.loads(sys.argv[1]); sys.exit(not (0 <= d['b_flood_p50_ms'] <= d['a_flood_p50_ms']))" "$fair"
check "with a slot A cannot take (max_active 3 of 4): B's worst TTFT under 200 ms" \
	python3 -c "import json,sys; d=json.loads(sys.argv[1]); sys.exit(not (0 <= d['b_flood_max_ms'] < 200))" "$capped"

# ---- a drain refuses what waits, whatever pumps the queue ---------------------------
# (and, before it, what waits is visible and abortable: below)
# one slot: alice's long stream runs, bob's request waits; kvctl drain,
# then at once the stream is aborted - its end pumps the queue, which
# admitted bob's request mid-drain (a drained node that had just started
# new work); now a drain refuses the queue from every pump
"$KVCTL" model make "$T/long.gguf" --layers 4 --dim 256 --heads 4 --kv-heads 2 \
	--ff 512 --vocab 2000 --ctx 8192 --seed 11 >/dev/null
next_port; DH=$PORT
write_node dq standalone "$T/long.gguf" "listen.http=127.0.0.1:$DH" "http.api_keys_file=$T/keys" \
	"tenants.node_max_active=1" "kv.pool_tokens=16384"
start_node dq
wait_log "$T/dq.log" "event=serve_ready" 60 >/dev/null || true
curl -s -N -H "Authorization: Bearer $KEY_A" \
	-d '{"prompt":"Once upon","max_tokens":6000,"temperature":0,"stream":true}' \
	"http://127.0.0.1:$DH/v1/completions" > "$T/dq.sse" &
DQA=$!; PIDS+=($DQA)
dq_id() { grep -q '^data: {' "$T/dq.sse" 2>/dev/null; }
check "drain: alice's stream holds the one slot" wait_for 20 dq_id

# ---- what waits is visible and abortable ---------------------------------------------
# two of bob's requests wait behind alice's stream: kvctl status, kvctl
# queue and the metrics show them, and kvctl abort takes either by the id
# its client was given or by the request number (before: a waiting
# request was in none of them, and abort answered notfound)
for i in 1 2; do
	curl -s -o "$T/wq$i.body" -w '%{http_code}' -H "Authorization: Bearer $KEY_B" \
		-d '{"prompt":"Once","max_tokens":2}' "http://127.0.0.1:$DH/v1/completions" > "$T/wq$i" &
	eval "WQ$i=\$!"
done
dqq() { "$KVCTL" --socket "$T/dq.sock" --json queue > "$T/dq.queue" 2>/dev/null &&
	python3 -c 'import json,sys; sys.exit(json.load(open(sys.argv[1]))["waiting"] != 2)' "$T/dq.queue"; }
check "queue: bob's two requests wait" wait_for 10 dqq
cat "$T/dq.queue"; echo
qf() { python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["requests"][int(sys.argv[2])]; print(r[sys.argv[3]])' "$T/dq.queue" "$@"; }
check "  ... listed with tenant, public id and request number" \
	bash -c "test '$(qf 0 tenant) $(qf 1 tenant)' = 'bob bob' && [[ '$(qf 0 public_id)' == cmpl-* ]] && test '$(qf 1 request)' -gt 0"
check "  ... kvctl status counts them" \
	test "$("$KVCTL" --socket "$T/dq.sock" --json status | json_get waiting)" = 2
"$KVCTL" --socket "$T/dq.sock" metrics > "$T/dq.metrics"
check "  ... the metrics count them, by tenant" \
	bash -c "grep -q '^kvd_num_requests_waiting 2$' '$T/dq.metrics' && grep -q '^kvd_requests_waiting{tenant=\"bob\"} 2$' '$T/dq.metrics'"
MW=$(log_mark "$T/dq.log")
check "kvctl abort takes a waiting request by its public id" \
	"$KVCTL" --socket "$T/dq.sock" abort "$(qf 0 public_id)"
check "kvctl abort takes a waiting request by its number" \
	"$KVCTL" --socket "$T/dq.sock" abort "$(qf 1 request)"
wait "$WQ1" "$WQ2" || true
check "  ... both clients answered with the error, not served ($(cat "$T/wq1") $(cat "$T/wq2"))" \
	bash -c "test '$(cat "$T/wq1")' != 200 && test '$(cat "$T/wq2")' != 200 && grep -q 'aborted by the operator' '$T/wq1.body' && grep -q 'aborted by the operator' '$T/wq2.body'"
check "  ... logged as the operator's aborts of waiting requests" \
	test "$(log_count "$T/dq.log" 'event=request_abort .*source=admin state=waiting result=ok' "$MW")" = 2
check "  ... and the queue is empty" \
	test "$("$KVCTL" --socket "$T/dq.sock" --json queue | json_get waiting)" = 0
check "  ... alice's stream still runs" bash -c "kill -0 $DQA"
curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $KEY_B" \
	-d '{"prompt":"Once","max_tokens":2}' "http://127.0.0.1:$DH/v1/completions" > "$T/dq.b" &
DQB=$!
sleep 0.3   # bob's request waits in his queue
sid=$(grep -m1 '^data: {' "$T/dq.sse" | sed 's/^data: //' | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
"$KVCTL" --socket "$T/dq.sock" drain --no-wait >/dev/null 2>&1 || true
"$KVCTL" --socket "$T/dq.sock" abort "$sid" >/dev/null 2>&1 || true
wait "$DQB" || true
check "drain: the waiting request is refused 503, not started ($(cat "$T/dq.b"))" test "$(cat "$T/dq.b")" = 503
check "  ... logged as a draining refusal" log_has "$T/dq.log" 'event=admission_reject .*tenant=bob reason=draining'
check "  ... and the node drains with nothing in flight" \
	wait_for 10 bash -c "test \"\$('$KVCTL' --socket '$T/dq.sock' --json status | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d[\"state\"], d[\"in_flight\"])')\" = 'drained 0'"
wait "$DQA" 2>/dev/null || true
stop_node dq
serve_finish
