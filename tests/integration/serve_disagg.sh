#!/usr/bin/env bash
# Disaggregated serving end to end on loopback: a prefill and a decode
# node produce, token for token, what `kvd generate` produces offline
# (stories260K from shared/ when present, and generated models); the
# standalone node too; a peer with another model is refused with a log
# line and the client gets NO_PREFILL_PEER; a batch bound that cannot move
# within release_timeout_ms at link_gbps is refused by --check-config; a
# verbs transport without an RDMA device refuses to start, and one on the
# emulated device checks the configured terms against it at boot.
# KVD_TEST_TRANSPORT=verbs runs the pairs over RDMA (serve_lib.sh).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/serve_lib.sh"

compare() { # compare PORT MODEL PROMPT MAX TEMP SEED LABEL
	local port=$1 model=$2 prompt=$3 max=$4 temp=$5 seed=$6 label=$7 a b
	a=$(gen "$port" --prompt "$prompt" --max-tokens "$max" --temperature "$temp" --seed "$seed" || true)
	b=$(offline --model "$model" --prompt "$prompt" --max-tokens "$max" --temperature "$temp" --seed "$seed" || true)
	if same_ids "$a" "$b" && same_text "$a" "$b"; then
		ok "$label: ids and text equal offline ($(echo "$a" | json_get output_ids | tr ',' '\n' | wc -l) tokens)"
	else
		not_ok "$label: served=$a offline=$b"
	fi
}

run_model() { # run_model TAG MODEL
	local tag=$1 m=$2
	pair "p_$tag" "d_$tag" "$m" -- ""
	start_node "p_$tag"
	start_node "d_$tag"
	check "$tag: decode paired with prefill" wait_up "d_$tag"
	check "$tag: prefill steps take prompts whole, 128 tokens (step_tokens 0 on a prefill node)" \
		grep -q "event=engine_ready .*prefill_chunk=128 step_tokens=128" "$T/p_$tag.log"
	check "$tag: decode keeps small steps (max_batch + prefill_chunk)" \
		grep -q "event=engine_ready .*max_batch=32 prefill_chunk=64 step_tokens=96" "$T/d_$tag.log"
	compare "$C_PORT" "$m" "Once upon a time" 40 0 0 "$tag greedy"
	compare "$C_PORT" "$m" "The little dog ran to the park and" 32 0.8 1234 "$tag temperature 0.8 seed 1234"
	compare "$C_PORT" "$m" "A" 1 0 0 "$tag max_tokens 1 (first token from prefill only)"
	compare "$C_PORT" "$m" "$(printf 'word %.0s' $(seq 1 40))" 24 0.5 7 "$tag multi-page prompt"
	check "$tag: zero pages held on both nodes" settle "p_$tag" "d_$tag"
	check "$tag: prefill logged its peer's capacity" grep -q "event=peer_capacity peer_node=d_$tag" "$T/p_$tag.log"
	check "$tag: kv_capacity reason=peer logged" grep -q "event=kv_capacity .*reason=peer" "$T/d_$tag.log"
	stop_node "d_$tag"
	stop_node "p_$tag"
	check "$tag: decode stopped cleanly" grep -q "event=stopped exit_code=0" "$T/d_$tag.log"
	check "$tag: prefill stopped cleanly" grep -q "event=stopped exit_code=0" "$T/p_$tag.log"
}

S=${KVD_SHARED:-}/models/stories260K.gguf
if [ -f "$S" ]; then
	run_model stories "$S"
else
	echo "SKIP (part): $S absent: generated models only" >&2
	echo "# SKIP (part): $S absent: generated models only"
fi
gen_model "$T/gen_f32.gguf" --dtype f32
run_model genf32 "$T/gen_f32.gguf"
gen_model "$T/gen_q8.gguf" --dtype q8_0 --seed 5
run_model genq8 "$T/gen_q8.gguf"

# --- standalone node: the same answers on one node -----------------------
next_port; SP=$PORT
write_node solo standalone "$T/gen_f32.gguf" "listen.client=127.0.0.1:$SP,unix:$T/solo.client"
start_node solo
check "standalone listening" wait_log "$T/solo.log" "event=serve_ready"
compare "$SP" "$T/gen_f32.gguf" "Once upon a time" 40 0 0 "standalone greedy"
out=$(timeout 30 "$KVCTL" generate --server "unix:$T/solo.client" --json --prompt "hello" --max-tokens 5 || true)
check "standalone over unix:PATH" test "$(echo "$out" | json_get finish_reason)" = length
# typed errors on the client API
out=$(timeout 30 "$KVCTL" generate --server "127.0.0.1:$SP" --json --prompt "x" --max-tokens 600 || true)
check "standalone: prompt + max_tokens beyond context is PROMPT_TOO_LONG" test "$(echo "$out" | json_get error)" = PROMPT_TOO_LONG
out=$(timeout 30 "$KVCTL" generate --server "127.0.0.1:$SP" --json --tokens 1,99999 --max-tokens 4 || true)
check "token id outside the vocabulary is INVALID_REQUEST" test "$(echo "$out" | json_get error)" = INVALID_REQUEST
check "standalone: zero pages held" settle solo
stop_node solo

# --- two prefill peers: load spread, a dead one is avoided; drain ---------
next_port; PA=$PORT
next_port; PB=$PORT
next_port; DC=$PORT
write_node pa prefill "$T/gen_f32.gguf" "listen.peer=127.0.0.1:$PA"
write_node pb prefill "$T/gen_f32.gguf" "listen.peer=127.0.0.1:$PB"
write_node dm decode "$T/gen_f32.gguf" "listen.client=127.0.0.1:$DC" \
	"peers.prefill=127.0.0.1:$PA,127.0.0.1:$PB"
# Decode picks the peer with the fewer requests in transfer: the 12
# requests spread only if they overlap, which a loaded machine does not
# promise (each may end before the next arrives, and all go to the first
# peer). In fault-point builds slow_batch makes every transfer last
# 300 ms, so they do.
SLOW=()
grep -q "KVD_FAULT_POINTS 1" "$KVD_BUILD/kvd_build.h" && SLOW=(KVD_FAULT=slow_batch)
start_node pa "${SLOW[@]}"
start_node pb "${SLOW[@]}"
start_node dm
two_up() { [ "$(log_count "$T/dm.log" "event=peer_up ")" -ge 2 ]; }
check "decode paired with both prefill peers" wait_for 30 two_up
gens=()
for i in $(seq 1 12); do
	gen "$DC" --prompt "spread $i over the peers" --max-tokens 8 >"$T/spread.$i" &
	gens+=($!)
done
wait "${gens[@]}" || true
answered=0
for i in $(seq 1 12); do
	case $(json_get finish_reason <"$T/spread.$i") in
	length|stop) answered=$((answered + 1)) ;;
	*) echo "# spread.$i: $(cat "$T/spread.$i")" ;;
	esac
done
check "12 concurrent requests all answered ($answered)" test $answered = 12
ca=$(status_get pa counters.admitted); cb=$(status_get pb counters.admitted)
check "12 concurrent requests spread over both peers by load ($ca + $cb)" test "$ca" -gt 0 -a "$cb" -gt 0 -a $((ca + cb)) = 12
stop_node pa
check "decode notices the lost peer" wait_log "$T/dm.log" "event=peer_down" 5
out=$(gen "$DC" --prompt "still served" --max-tokens 4 || true)
check "with one peer down, requests go to the healthy one" test "$(echo "$out" | json_get finish_reason)" = length
"$KVCTL" --socket "$T/dm.sock" drain --no-wait >/dev/null 2>&1 || true
out=$(gen "$DC" --prompt "while draining" --max-tokens 4 || true)
check "draining decode answers DRAINING" test "$(echo "$out" | json_get error)" = DRAINING
"$KVCTL" --socket "$T/dm.sock" resume >/dev/null 2>&1 || true
out=$(gen "$DC" --prompt "after resume" --max-tokens 4 || true)
check "after resume it serves again" test "$(echo "$out" | json_get finish_reason)" = length
check "multi-peer: zero pages held" settle dm pb
stop_node dm
stop_node pb

# --- a decode node whose model differs: pairing refused -------------------
gen_model "$T/other.gguf" --seed 99
pair p_mis d_mis "$T/gen_f32.gguf"
sed -i "s|^path = .*|path = $T/other.gguf|" "$T/d_mis.ini"
start_node p_mis
start_node d_mis
check "mismatched model: decode logs peer_refused naming model_sha256" \
	wait_log "$T/d_mis.log" "event=peer_refused .*field=model_sha256" 10
out=$(gen "$C_PORT" --prompt "hi" --max-tokens 3 || true)
check "no usable peer: NO_PREFILL_PEER reaches the client" test "$(echo "$out" | json_get error)" = NO_PREFILL_PEER
stop_node d_mis
stop_node p_mis

# --- transfer bound vs release timeout (invariant 5, at config time) ------
write_node bound decode "$T/gen_f32.gguf" "listen.client=127.0.0.1:1" "peers.prefill=127.0.0.1:2" \
	"transfer.max_batch_bytes=1G" "transfer.link_gbps=1" "transfer.release_timeout_ms=1000"
set +e
msg=$("$KVD" --check-config --config "$T/bound.ini" 2>&1 >/dev/null)
rc=$?
set -e
check "a batch that cannot move within release_timeout_ms is refused (exit 78)" test "$rc" = 78
check "the refusal names transfer.max_batch_bytes" grep -q "transfer.max_batch_bytes" <<<"$msg"

# --- verbs without a device: refuse to start, never pretend ---------------
next_port
write_node vb decode "$T/gen_f32.gguf" "listen.client=127.0.0.1:$PORT" \
	"peers.prefill=127.0.0.1:1" "transfer.transport=verbs" "transfer.verbs_device="
set +e
timeout 20 "$KVD" --config "$T/vb.ini" >"$T/vb.log" 2>&1
rc=$?
set -e
check "transport=verbs without RDMA: kvd exits non-zero" test "$rc" != 0
if "$KVD" --version | grep -q "verbs yes"; then
	check "transport=verbs without RDMA: logs why" grep -q "event=transport_unavailable transport=verbs" "$T/vb.log"
else
	# a build without libibverbs refuses the real device in the config
	check "transport=verbs without libibverbs: refused as a config error (exit 78)" test "$rc" = 78
	check "transport=verbs without libibverbs: says why" grep -q "transfer.transport: verbs: this kvd was built without libibverbs" "$T/vb.log"
fi

# --- verbs on the emulated device: the configured terms are checked
# against it at boot, and a term it cannot meet refuses the node ---------
if [ "${KVD_VERBS_EMU:-1}" = 0 ]; then
	echo "# SKIP (part): this kvd has no emulated RDMA device (-Dverbs_emu=true)"
	next_port
	write_node vn decode "$T/gen_f32.gguf" "listen.client=127.0.0.1:$PORT" \
		"peers.prefill=127.0.0.1:1" "transfer.transport=verbs" \
		"transfer.verbs_device=emu:$T"
	set +e
	"$KVD" --config "$T/vn.ini" --check-config >"$T/vn.log" 2>&1
	rc=$?
	set -e
	check "emu: without the emulated device: a config error (exit 78)" test "$rc" = 78
	check "emu: without the emulated device: says why" \
		grep -q "transfer.verbs_device: emu: this kvd was built without the emulated RDMA device" "$T/vn.log"
else
	mkdir -p "$T/emu"
	next_port
	write_node ve decode "$T/gen_f32.gguf" "listen.client=127.0.0.1:$PORT" \
		"peers.prefill=127.0.0.1:1" "transfer.transport=verbs" \
		"transfer.verbs_device=emu:$T/emu,mw=0"
	start_node ve
	check "transport=verbs on emu: capacity line names the transport" \
		wait_log "$T/ve.log" "event=kv_capacity .*transport=verbs verbs_device=\"emu:$T/emu,mw=0\"" 20
	check "transport=verbs on emu: the device's figures at boot" \
		wait_log "$T/ve.log" "event=transport transport=verbs device=emulated max_mr_size=[0-9]* max_qp_wr=[0-9]* write_scope=per_request_mr windows_supported=no" 20
	stop_node ve
	next_port
	write_node vq decode "$T/gen_f32.gguf" "listen.client=127.0.0.1:$PORT" \
		"peers.prefill=127.0.0.1:1" "transfer.transport=verbs" \
		"transfer.verbs_device=emu:$T/emu,max_qp_wr=8" "transfer.verbs_qp_depth=16"
	set +e
	timeout 20 "$KVD" --config "$T/vq.ini" >"$T/vq.log" 2>&1
	rc=$?
	set -e
	check "verbs_qp_depth above the device's max_qp_wr: kvd exits non-zero" test "$rc" != 0
	check "verbs_qp_depth above the device's max_qp_wr: the log names the key" \
		grep -q "event=transport_unavailable .*transfer.verbs_qp_depth=16 is above the device's max_qp_wr=8" "$T/vq.log"
	check "the emulated device left nothing in its directory" test -z "$(ls -A "$T/emu")"
fi

serve_finish
