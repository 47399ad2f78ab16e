#!/usr/bin/env bash
# response_format json_object and json_schema (issue 24.2) on a standalone
# node's HTTP front, with stories260K (skipped when ../shared lacks it) and
# with a generated model (random weights: it knows nothing of JSON, the
# grammar alone makes its output JSON):
#   - sampled at temperature 1 with several seeds, on both endpoints and
#     streamed: every answer that finished with "stop" parses and matches
#     its schema, every answer cut by "length" is a JSON prefix
#     (json_check.py: its own reader and validator, not kvd's);
#   - the same under a schema with anyOf (pydantic's Optional), a
#     nullable type, string lengths, a pattern, formats and number
#     bounds (json_check.py's validator is tested first on a wrong value
#     for each keyword: --selftest);
#   - a schema whose values are bounded (enums, an integer; patterns,
#     formats, ranges, anyOf, a tagged oneOf of objects) always
#     finishes with "stop" within its max_tokens;
#   - the same seed gives the same answer (invariant 9);
#   - a schema kvd cannot hold the output to (a lookahead pattern, `not`,
#     overlapping anyOf branches), a bad name, and a
#     bad response_format are 400 naming response_format; the node
#     still serves afterwards;
#   - n=3 under one bounded schema (each choice its own run): every
#     choice stops, parses and matches, choice i is the single request
#     with seed 1 + i, streamed the same;
#   - a prefill+decode pair gives the standalone node's answers (the
#     decode node draws the first token under the grammar itself), n=2
#     too.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/serve_lib.sh"
command -v curl >/dev/null || skip "curl absent"
command -v jq >/dev/null || skip "jq absent"
command -v python3 >/dev/null || skip "python3 absent"
CHECK="python3 $KVD_SRC/tests/integration/json_check.py"
SEEDS=${KVD_JSON_SEEDS:-4}

cat > "$T/person.json" <<'EOF'
{"type": "object", "properties": {
  "name": {"type": "string"}, "age": {"type": "integer"},
  "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
  "ok": {"type": "boolean"}, "score": {"type": ["number", "null"]}},
 "required": ["name", "age", "ok"], "additionalProperties": false}
EOF
cat > "$T/short.json" <<'EOF'
{"type": "object", "properties": {
  "color": {"enum": ["red", "green", "blue"]}, "n": {"type": "integer"},
  "on": {"const": true}},
 "required": ["color", "n", "on"], "additionalProperties": false}
EOF

cat > "$T/rich.json" <<'EOF'
{"type": "object", "properties": {
  "id": {"type": "string", "pattern": "^[A-Z]{2}-\\d{3}$"},
  "name": {"type": "string", "minLength": 2, "maxLength": 12},
  "born": {"anyOf": [{"type": "string", "format": "date"}, {"type": "null"}]},
  "seen": {"type": "string", "format": "date-time"},
  "key": {"type": ["string", "null"], "format": "uuid"},
  "age": {"type": "integer", "minimum": 0, "exclusiveMaximum": 130},
  "score": {"type": "number", "exclusiveMinimum": -1, "maximum": 1},
  "pet": {"oneOf": [{"enum": ["cat", "dog"]}, {"type": "integer", "maximum": -1}]},
  "note": {"type": "string", "pattern": "ok", "maxLength": 6}},
 "required": ["id", "name", "born", "age", "pet"], "additionalProperties": false}
EOF
cat > "$T/richshort.json" <<'EOF'
{"type": "object", "properties": {
  "id": {"type": "string", "pattern": "^[A-Z]{2}-\\d{3}$"},
  "day": {"type": "string", "format": "date"},
  "n": {"type": "integer", "minimum": -9, "maximum": 99},
  "o": {"anyOf": [{"type": "integer", "exclusiveMinimum": 0, "maximum": 3}, {"type": "null"}]},
  "s": {"type": ["string", "null"], "minLength": 1, "maxLength": 4, "pattern": "^[a-z]+$"},
  "x": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
  "u": {"oneOf": [{"$ref": "#/$defs/A"}, {"type": "object", "properties": {"t": {"const": "b"}},
                                            "required": ["t"], "additionalProperties": false}]}},
 "required": ["id", "day", "n", "o", "s", "x", "u"], "additionalProperties": false,
 "$defs": {"A": {"type": "object", "properties": {"t": {"const": "a"},
                 "v": {"type": "integer", "minimum": 0, "maximum": 9}},
                 "required": ["t", "v"], "additionalProperties": false}}}
EOF
check "json_check.py's validator refuses a wrong value for each keyword" $CHECK --selftest

# rf KIND [SCHEMA_FILE]: the response_format object
rf() {
	if [ "$1" = object ]; then
		echo '{"type":"json_object"}'
	else
		jq -c --slurpfile s "$2" '{type: "json_schema", json_schema: {name: "t", strict: true, schema: $s[0]}}' <<<'{}'
	fi
}

# post PATH BODY: status on stdout, body in $T/body
post() {
	curl -s -o "$T/body" -w '%{http_code}' -d "$2" "$U/$1" || true
}

# answer ENDPOINT RF SEED MAX OUT: one sampled answer as {text, finish} in OUT
answer() {
	local ep=$1 rf=$2 seed=$3 max=$4 out=$5 body st
	if [ "$ep" = chat ]; then
		body=$(jq -nc --argjson rf "$rf" --argjson s "$seed" --argjson m "$max" \
			'{messages: [{role: "user", content: "Describe a person as JSON."}], response_format: $rf, temperature: 1, seed: $s, max_tokens: $m}')
		st=$(post chat/completions "$body")
		jq -c '{text: .choices[0].message.content, finish: .choices[0].finish_reason}' "$T/body" > "$out"
	else
		body=$(jq -nc --argjson rf "$rf" --argjson s "$seed" --argjson m "$max" \
			'{prompt: "Once upon a time", response_format: $rf, temperature: 1, seed: $s, max_tokens: $m}')
		st=$(post completions "$body")
		jq -c '{text: .choices[0].text, finish: .choices[0].finish_reason}' "$T/body" > "$out"
	fi
	[ "$st" = 200 ] || { echo "# $ep seed $seed: status $st $(head -c 300 "$T/body")"; return 1; }
}

# answer_n RF SEED MAX N PREFIX: an n=N completions answer, sampled (or
# streamed, with STREAM=true); choice i as {text, finish} in PREFIX_i.json
answer_n() {
	local rf=$1 seed=$2 max=$3 n=$4 pre=$5 body i st
	body=$(jq -nc --argjson rf "$rf" --argjson s "$seed" --argjson m "$max" --argjson n "$n" \
		--argjson st "${STREAM:-false}" \
		'{prompt: "Once upon a time", response_format: $rf, temperature: 1, seed: $s, max_tokens: $m, n: $n, stream: $st}')
	if [ "${STREAM:-false}" = true ]; then
		curl -sN -d "$body" "$U/completions" | sed -n 's/^data: //p' | grep -v '^\[DONE\]' > "$T/body"
		for i in $(seq 0 $((n - 1))); do
			jq -s -c --argjson i "$i" '[.[] | .choices[]? | select(.index == $i)] |
				{text: (map(.text // "") | join("")), finish: (map(.finish_reason // empty) | last)}' \
				"$T/body" > "${pre}_$i.json"
		done
	else
		st=$(post completions "$body")
		[ "$st" = 200 ] || { echo "# n=$n seed $seed: status $st $(head -c 300 "$T/body")"; return 1; }
		for i in $(seq 0 $((n - 1))); do
			jq -c --argjson i "$i" '.choices[$i] | {text, finish: .finish_reason}' "$T/body" > "${pre}_$i.json"
		done
	fi
}

# streamed: the deltas joined, and the last chunk's finish_reason
answer_stream() {
	local rf=$1 seed=$2 max=$3 out=$4 body
	body=$(jq -nc --argjson rf "$rf" --argjson s "$seed" --argjson m "$max" \
		'{prompt: "Once upon a time", response_format: $rf, temperature: 1, seed: $s, max_tokens: $m, stream: true}')
	curl -sN -d "$body" "$U/completions" | sed -n 's/^data: //p' | grep -v '^\[DONE\]' |
		jq -s -c '{text: (map(.choices[0].text // "") | join("")),
			   finish: (map(.choices[0].finish_reason // empty) | last)}' > "$out"
}

# run_model LABEL MODEL MAX: the checks on one model
run_model() {
	local label=$1 m=$2 max=$3 kind ep s files rc
	next_port; H=$PORT
	U=http://127.0.0.1:$H/v1
	write_node "$label" standalone "$m" "listen.http=127.0.0.1:$H" \
		"model.chat_template=chatml" "model.chat_template_unsafe=true"
	start_node "$label"
	check "$label: node up" wait_log "$T/$label.log" "event=serve_ready"
	for kind in object person rich; do
		files=()
		for s in $(seq 1 "$SEEDS"); do
			for ep in cmpl chat; do
				answer $ep "$(rf $kind "$T/$kind.json")" "$s" "$max" "$T/a_${label}_${kind}_${ep}_$s.json" &&
					files+=("$T/a_${label}_${kind}_${ep}_$s.json")
			done
		done
		answer_stream "$(rf $kind "$T/$kind.json")" 99 "$max" "$T/a_${label}_${kind}_stream.json"
		files+=("$T/a_${label}_${kind}_stream.json")
		rc=0
		$CHECK "$([ $kind = object ] && echo object || echo "$T/$kind.json")" "${files[@]}" \
			> "$T/check_${label}_$kind.out" 2>&1 || rc=$?
		check "$label $kind: $((2 * SEEDS + 1)) answers: stop parses and matches, length is a prefix ($(tail -1 "$T/check_${label}_$kind.out"))" \
			test "$rc" = 0 -a "${#files[@]}" = $((2 * SEEDS + 1))
		grep BAD "$T/check_${label}_$kind.out" | head -3 | sed 's/^/# /' || true
	done
	files=()
	for s in 1 2 3; do
		answer cmpl "$(rf schema "$T/short.json")" "$s" 200 "$T/a_${label}_short_$s.json" &&
			files+=("$T/a_${label}_short_$s.json")
	done
	$CHECK "$T/short.json" "${files[@]}" > "$T/check_${label}_short.out" 2>&1 || true
	check "$label: a bounded schema always stops and matches ($(tail -1 "$T/check_${label}_short.out"))" \
		grep -qx "stop=3 length=0 bad=0" "$T/check_${label}_short.out"
	# n=3 under one grammar (the bounded schema): each choice its own run
	# of it, every one stops and matches, choice i is the single request
	# with seed 1 + i; streamed the same
	if answer_n "$(rf schema "$T/short.json")" 1 200 3 "$T/n_${label}"; then
		$CHECK "$T/short.json" "$T/n_${label}"_{0,1,2}.json > "$T/check_${label}_n.out" 2>&1 || true
		check "$label: n=3 under a bounded schema: every choice stops and matches ($(tail -1 "$T/check_${label}_n.out"))" \
			grep -qx "stop=3 length=0 bad=0" "$T/check_${label}_n.out"
		for i in 0 1 2; do
			check "  ... choice $i is the single request with seed $((1 + i))" \
				cmp -s "$T/n_${label}_$i.json" "$T/a_${label}_short_$((1 + i)).json"
		done
	else
		not_ok "$label: n=3 under a bounded schema: 200"
	fi
	STREAM=true answer_n "$(rf schema "$T/short.json")" 1 200 3 "$T/ns_${label}"
	check "  ... streamed: the same choices" \
		bash -c "for i in 0 1 2; do cmp -s '$T/ns_${label}_'\$i.json '$T/n_${label}_'\$i.json || exit 1; done"
	files=()
	for s in 1 2 3; do
		answer cmpl "$(rf schema "$T/richshort.json")" "$s" 480 "$T/a_${label}_richshort_$s.json" &&
			files+=("$T/a_${label}_richshort_$s.json")
	done
	$CHECK "$T/richshort.json" "${files[@]}" > "$T/check_${label}_richshort.out" 2>&1 || true
	check "$label: a bounded schema with patterns, formats, ranges, anyOf always stops and matches ($(tail -1 "$T/check_${label}_richshort.out"))" \
		grep -qx "stop=3 length=0 bad=0" "$T/check_${label}_richshort.out"
	jq -r .text "$T/a_${label}_richshort_1.json" | tr -d ' \t\r\n' | cut -c1-300 | sed 's/^/# one: /' || true
	answer cmpl "$(rf schema "$T/person.json")" 7 "$max" "$T/r1.json"
	answer cmpl "$(rf schema "$T/person.json")" 7 "$max" "$T/r2.json"
	check "$label: the same seed, the same answer" cmp -s "$T/r1.json" "$T/r2.json"
	stop_node "$label"
}

# ---- refusals (one node: the generated model) -----------------------------------------------
gen_model "$T/gen.gguf"
next_port; H=$PORT
U=http://127.0.0.1:$H/v1
write_node r standalone "$T/gen.gguf" "listen.http=127.0.0.1:$H"
start_node r
check "node up" wait_log "$T/r.log" "event=serve_ready"
refused() { # refused DESCRIPTION RESPONSE_FORMAT
	local st
	st=$(post completions "{\"prompt\":\"x\",\"max_tokens\":4,\"response_format\":$2}")
	check "$1: 400 naming response_format ($st $(jq -c .error "$T/body" | head -c 200))" \
		test "$st $(jq -r .error.param "$T/body")" = "400 response_format"
}
refused "a schema with a lookahead pattern" '{"type":"json_schema","json_schema":{"name":"t","schema":{"type":"string","pattern":"^a(?=b)"}}}'
check "  ... the message names the keyword" grep -q "'pattern'" "$T/body"
refused "a schema with not" '{"type":"json_schema","json_schema":{"name":"t","schema":{"not":{"type":"string"}}}}'
check "  ... the message names the keyword" grep -q "'not'" "$T/body"
refused "overlapping anyOf branches" '{"type":"json_schema","json_schema":{"name":"t","schema":{"anyOf":[{"type":"string"},{"type":"string","maxLength":3}]}}}'
check "  ... the message names the keyword" grep -q "'anyOf'" "$T/body"
refused "a recursive \$ref" '{"type":"json_schema","json_schema":{"name":"t","schema":{"$defs":{"n":{"type":"array","items":{"$ref":"#/$defs/n"}}},"$ref":"#/$defs/n"}}}'
refused "a json_schema name with a space" '{"type":"json_schema","json_schema":{"name":"a b","schema":{}}}'
refused "an unknown type" '{"type":"xml"}'
refused "json_object with another key" '{"type":"json_object","schema":{}}'
st=$(post completions '{"prompt":"x","max_tokens":4,"response_format":{"type":"json_object"}}')
check "the node still serves: json_object 200 ($st)" test "$st" = 200
stop_node r

run_model gen "$T/gen.gguf" 160

# a prefill+decode pair: the prefill peer draws the first token without
# the grammar; the decode node drops it and draws it itself over the
# received KV (decode_recompute), so the pair answers as the standalone
# node did, token for token, for the same seeds
next_port; H=$PORT
U=http://127.0.0.1:$H/v1
pair pj dj "$T/gen.gguf" -- "listen.http=127.0.0.1:$H"
start_node pj
start_node dj
check "pair: decode paired" wait_up dj
for s in 1 2; do
	answer cmpl "$(rf object)" "$s" 160 "$T/p_$s.json" || true
	check "pair: json_object seed $s equals the standalone answer" \
		cmp -s "$T/p_$s.json" "$T/a_gen_object_cmpl_$s.json"
done
answer_n "$(rf object)" 1 160 2 "$T/pn" || true
check "pair: json_object n=2 seed 1: the standalone answers of seeds 1 and 2" \
	bash -c "cmp -s '$T/pn_0.json' '$T/a_gen_object_cmpl_1.json' && cmp -s '$T/pn_1.json' '$T/a_gen_object_cmpl_2.json'"
check "pair: the decode node drew the first tokens itself" \
	grep -q "event=decode_recompute" "$T/dj.log"
check "pair: nothing held" settle dj
stop_node dj
stop_node pj
M=${KVD_SHARED:-}/models/stories260K.gguf
if [ -f "$M" ]; then
	run_model stories "$M" 160
else
	echo "# stories260K absent: the generated model only"
fi
serve_finish
