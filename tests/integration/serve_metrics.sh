#!/usr/bin/env bash
# Prometheus metrics through `kvctl metrics` on a prefill+decode pair:
# the text is valid (promtool check metrics, when installed), and the
# figures move as the requests that ran say they must - two served
# requests (tokens, TTFT and inter-token counts, transfer bytes and
# times), one corrupted batch (fault point corrupt_batch: an integrity
# failure, by kind), one oversized prompt (an admission rejection) -
# and the pool, capacity and peer gauges equal kvctl status. Also the
# chat format the nodes resolved at boot: decode's from model.chat_template,
# prefill's recognized in the GGUF's tokenizer.chat_template.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/serve_lib.sh"

grep -q "KVD_FAULT_POINTS 1" "$KVD_BUILD/kvd_build.h" || skip "built without fault points"
gen_model "$T/m.gguf" --chat-template llama3
MODEL=$T/m.gguf
PROMPT=$(seq -s, 10 49)            # 40 tokens: 3 pages of 16
NP=40
pair pm dm "$MODEL"
# (the generated vocabulary has no <|im_start|> token: accepted explicitly)
printf '[model]\nchat_template = chatml\nchat_template_unsafe = true\n' >> "$T/dm.ini"
start_node dm
start_node pm KVD_FAULT=corrupt_batch:1
check "decode sees its prefill peer" wait_up dm

# metric NODE NAME{LABELS}: the value of one sample of the node's text
# (empty when absent)
metrics() { "$KVCTL" --socket "$T/$1.sock" metrics; }
metric() { metrics "$1" | awk -v k="$2" '$1 == k { print $2; f = 1 } END { if (!f) print "" }'; }
eq() { [ "$(metric "$1" "$2")" = "$3" ] || { echo "  $1 $2 = '$(metric "$1" "$2")', want '$3'" >&2; return 1; }; }
gt0() { local v; v=$(metric "$1" "$2"); [ -n "$v" ] && awk -v v="$v" 'BEGIN { exit !(v > 0) }'; }

# promcheck NAME: promtool parses the node's text, vLLM's names in it,
# and lints nothing but their colon (serve_lib.sh promtool_ok)
promcheck() {
	metrics "$1" > "$T/$1.prom" || return 1
	grep -q '^vllm:num_requests_running' "$T/$1.prom" || return 1
	promtool_ok "$T/$1.prom"
}
if command -v promtool >/dev/null 2>&1; then
	check "promtool accepts decode's text before any request" promcheck dm
	check "promtool accepts prefill's text before any request" promcheck pm
else
	echo "# promtool absent (Debian package prometheus): the format check is skipped"
fi
check "kvctl metrics exits 0 and prints text" test -n "$(metrics dm)"
check "no request counted yet" eq dm 'kvd_requests_total{tenant="default",outcome="length"}' ""
check "vLLM's names before any request: 0 generated" eq dm 'vllm:generation_tokens_total{model_name="m"}' 0
check "  ... no TTFT observed" eq dm 'vllm:time_to_first_token_seconds_count{model_name="m"}' 0
check "peers up on decode" eq dm kvd_peers_up 1
check "chat format from the config on decode" \
	log_has "$T/dm.log" 'event=chat_template format=chatml source=config'
check "kvd_info names the chat format" \
	bash -c "$KVCTL --socket $T/dm.sock metrics | grep -q 'chat_template=\"chatml\"'"
check "prefill recognized the model's template (model make --chat-template llama3)" \
	log_has "$T/pm.log" 'event=chat_template format=llama3 source=gguf'

# 1: the first batch is corrupted in flight: INTEGRITY, no token; decode
# tears the link down, and the peer comes back
MARK=$(log_mark "$T/dm.log")
OUT=$(gen "$C_PORT" --tokens "$PROMPT" --max-tokens 8 || true)
check "corrupted request: typed error, no token" no_token "$OUT"
check "decode settles" settle dm
check "the peer is back" wait_log "$T/dm.log" "event=peer_up " 20 "$MARK"
# 2, 3: served
A=$(gen "$C_PORT" --tokens "$PROMPT" --max-tokens 8 || true)
B=$(gen "$C_PORT" --tokens "$PROMPT" --max-tokens 5 || true)
NA=$(echo "$A" | json_get output_ids | tr ',' '\n' | grep -c . || true)
NB=$(echo "$B" | json_get output_ids | tr ',' '\n' | grep -c . || true)
check "two requests served ($NA + $NB tokens)" test "$NA" -gt 0 -a "$NB" -gt 0
# 4: more than the context holds: refused at admission
C=$(gen "$C_PORT" --tokens "$PROMPT" --max-tokens 100000 || true)
check "oversized request refused with a typed error" no_token "$C"
check "both nodes settle" settle dm pm

D='{tenant="default",outcome='
check "one integrity outcome" eq dm "kvd_requests_total${D}\"integrity\"}" 1
check "one prompt_too_long outcome" eq dm "kvd_requests_total${D}\"prompt_too_long\"}" 1
STOP=$(metric dm "kvd_requests_total${D}\"stop\"}")
LEN=$(metric dm "kvd_requests_total${D}\"length\"}")
check "two served outcomes (stop $STOP + length $LEN)" test $((STOP + LEN)) = 2
check "nothing abandoned" eq dm "kvd_requests_total${D}\"abandoned\"}" 0
check "admission rejection counted by reason" \
	eq dm 'kvd_admission_rejections_total{reason="prompt_too_long"}' 1
check "generation tokens = tokens the clients got ($((NA + NB)))" \
	eq dm 'kvd_generation_tokens_total{tenant="default"}' $((NA + NB))
check "prompt tokens = two prefilled prompts ($((2 * NP)))" \
	eq dm 'kvd_prompt_tokens_total{tenant="default"}' $((2 * NP))
check "two TTFT observations" eq dm 'kvd_time_to_first_token_seconds_count{tenant="default"}' 2
check "TTFT +Inf bucket equals its count" \
	eq dm 'kvd_time_to_first_token_seconds_bucket{tenant="default",le="+Inf"}' 2
check "inter-token observations = tokens - first tokens ($((NA + NB - 2)))" \
	eq dm 'kvd_inter_token_latency_seconds_count{tenant="default"}' $((NA + NB - 2))
check "four requests ended (e2e observations)" \
	eq dm 'kvd_e2e_request_latency_seconds_count{tenant="default"}' 4
CK=$(metric dm 'kvd_integrity_failures_total{kind="checksum"}')
MAC=$(metric dm 'kvd_integrity_failures_total{kind="mac"}')
check "one integrity failure, caught by the batch check (checksum $CK, mac $MAC)" \
	test $((CK + MAC)) = 1
check "integrity kinds sum to the status counter" \
	test "$(status_get dm counters.integrity_failures)" = $((CK + MAC))
check "decode received KV bytes" gt0 dm 'kvd_kv_transfer_bytes_total{direction="receive"}'
check "prefill sent KV bytes" gt0 pm 'kvd_kv_transfer_bytes_total{direction="send"}'
check "decode timed two transfers" eq dm 'kvd_kv_transfer_seconds_count{direction="receive"}' 2
# prefill timed the two served transfers (the corrupted one's link was
# torn down under it, so it may not have finished sending)
PT=$(metric pm 'kvd_kv_transfer_seconds_count{direction="send"}')
check "prefill timed the served transfers ($PT)" test "${PT:-0}" -ge 2 -a "${PT:-0}" -le 3
check "prefill counts no client requests" \
	eq pm 'kvd_requests_total{tenant="default",outcome="length"}' ""
for s in free reserved filling ready fenced quarantined retired; do
	check "kv pages $s = kvctl status" eq dm "kvd_kv_pages{state=\"$s\"}" "$(status_get dm pool.$s)"
done
check "pool tokens = kvctl status" eq dm kvd_kv_pool_tokens "$(status_get dm pool.tokens)"
check "advertised context = kvctl status" eq dm kvd_advertised_context_tokens \
	"$(status_get dm capacity.advertised_context)"
check "capacity ok" eq dm kvd_capacity_ok 1
check "admitted counter = kvctl status" eq dm kvd_requests_admitted_total \
	"$(status_get dm counters.admitted)"
check "node state ready" eq dm 'kvd_node_state{state="ready"}' 1

# vLLM's names (http.metrics_vllm_names, on): the same figures summed over
# tenants, model_name = the model file's name (no http.model_name here)
V='{model_name="m"}'
check "vllm:generation_tokens_total = kvd's ($((NA + NB)))" eq dm "vllm:generation_tokens_total$V" $((NA + NB))
check "vllm:prompt_tokens_total = kvd's ($((2 * NP)))" eq dm "vllm:prompt_tokens_total$V" $((2 * NP))
VS=$(metric dm 'vllm:request_success_total{model_name="m",finished_reason="stop"}')
VL=$(metric dm 'vllm:request_success_total{model_name="m",finished_reason="length"}')
check "vllm:request_success_total stop ($VS) + length ($VL) = 2" test "$(( ${VS:-100} + ${VL:-100} ))" = 2
check "vllm:request_success_total{finished_reason=\"stop\"} = kvd's ($STOP)" \
	eq dm 'vllm:request_success_total{model_name="m",finished_reason="stop"}' "$STOP"
check "vllm:request_success_total abort = 0" \
	eq dm 'vllm:request_success_total{model_name="m",finished_reason="abort"}' 0
check "vllm:time_to_first_token_seconds: two observations" \
	eq dm "vllm:time_to_first_token_seconds_count$V" 2
check "  ... its +Inf bucket" \
	eq dm 'vllm:time_to_first_token_seconds_bucket{model_name="m",le="+Inf"}' 2
check "  ... its sum = kvd's" eq dm "vllm:time_to_first_token_seconds_sum$V" \
	"$(metric dm 'kvd_time_to_first_token_seconds_sum{tenant="default"}')"
check "vllm:time_per_output_token_seconds: $((NA + NB - 2)) observations" \
	eq dm "vllm:time_per_output_token_seconds_count$V" $((NA + NB - 2))
check "vllm:e2e_request_latency_seconds: four" eq dm "vllm:e2e_request_latency_seconds_count$V" 4
check "vllm:num_requests_running 0 once settled" eq dm "vllm:num_requests_running$V" 0
check "vllm:num_requests_waiting 0" eq dm "vllm:num_requests_waiting$V" 0
check "vllm:kv_cache_usage_perc = kvd_kv_cache_usage_perc" eq dm "vllm:kv_cache_usage_perc$V" \
	"$(metric dm kvd_kv_cache_usage_perc)"
check "vllm:gpu_cache_usage_perc, the same" eq dm "vllm:gpu_cache_usage_perc$V" \
	"$(metric dm kvd_kv_cache_usage_perc)"
if command -v promtool >/dev/null 2>&1; then
	check "promtool accepts decode's text after the requests" promcheck dm
	check "promtool accepts prefill's text after the requests" promcheck pm
fi
check "kvctl --json metrics carries the same text" \
	bash -c "$KVCTL --socket $T/dm.sock --json metrics | grep -q kvd_requests_total"
serve_finish
