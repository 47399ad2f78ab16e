#!/usr/bin/env bash
# The repack cache end to end (gpu/model/prepack.h): `kvd generate --cache-dir`
# on generated Q6_K, Q4_K, Q4_K_M (Q6_K attn_v/ffn_down/output: two
# layouts in one file) and Q4_0 models. The first run packs and stores the file, the second
# maps it and packs nothing (timings.pack_cache counts both), and the
# output tokens are the same with no cache, a fresh cache and a reused
# one; a cache file damaged between runs is refused by name and rebuilt
# with the same output; the daemon logs event=pack_cache at boot (stored
# at the first, hit at the second). The cleanup (prepack_clean): another
# model's pack file unused for longer than the retention is removed by
# kvd generate and by the daemon's boot (one event=pack_cache_removed
# line each), a younger one is kept until model.pack_cache_keep_days = 0.
# A pack file truncated under a running node: the node copies its
# mapping privately (event=pack_cache_detached) and serves on.
# Skips without the avx512vnni kernels (nothing is packed then).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/serve_lib.sh"
command -v python3 >/dev/null || skip "python3 absent"

# field JSON EXPR: print a value of kvd generate's --json output
field() { python3 -c 'import json,sys; o=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2"; }
pgen() { # pgen MODEL OUT [--cache-dir DIR]
	local m=$1 out=$2; shift 2
	"$KVD" generate --model "$m" --prompt "the cache keeps the packed weights" \
		--max-tokens 12 --ignore-eos --threads 2 --json "$@" >"$out"
}

for dt in q6_k q4_k q4_k_m q4_0; do
	"$KVCTL" model make "$T/$dt.gguf" --layers 2 --dim 256 --heads 4 --kv-heads 2 \
		--ff 512 --vocab 512 --seed 5 --dtype "$dt" >/dev/null
done

pgen "$T/q6_k.gguf" "$T/probe.json" --cache-dir "$T/probe"
[ "$(field "$T/probe.json" 'o["timings"]["pack_cache"]["lookup"]')" = absent ] ||
	skip "nothing packed on this CPU ($(field "$T/probe.json" 'o["timings"]["pack_cache"]'))"

for dt in q6_k q4_k q4_k_m q4_0; do
	m=$T/$dt.gguf C=$T/cache_$dt
	pgen "$m" "$T/$dt.none.json"
	pgen "$m" "$T/$dt.first.json" --cache-dir "$C"
	pgen "$m" "$T/$dt.second.json" --cache-dir "$C"
	check "$dt: no cache packs every matrix in memory" \
		test "$(field "$T/$dt.none.json" '[o["timings"]["pack_cache"][k] for k in ("lookup","store")]')" = "['off', 'off']"
	check "$dt: first start packs and stores" \
		test "$(field "$T/$dt.first.json" '(o["timings"]["pack_cache"]["lookup"], o["timings"]["pack_cache"]["store"], o["timings"]["pack_cache"]["packed"] > 0)')" = "('absent', 'stored', True)"
	check "$dt: second start maps the file and packs nothing" \
		test "$(field "$T/$dt.second.json" '(o["timings"]["pack_cache"]["lookup"], o["timings"]["pack_cache"]["packed"], o["timings"]["pack_cache"]["mapped"])')" = \
		"('hit', 0, $(field "$T/$dt.first.json" 'o["timings"]["pack_cache"]["packed"]'))"
	for run in first second; do
		check "$dt: output ids with the $run cached start equal those without a cache" \
			test "$(field "$T/$dt.none.json" 'o["output_ids"]')" = "$(field "$T/$dt.$run.json" 'o["output_ids"]')"
	done
	check "$dt: 12 tokens generated" test "$(field "$T/$dt.none.json" 'len(o["output_ids"])')" = 12
done

# damage: truncated, then a flipped byte in the first packed rows
C=$T/cache_q6_k
f=$(ls "$C"/pack-*.kvpack)
truncate -s 5000 "$f"
pgen "$T/q6_k.gguf" "$T/trunc.json" --cache-dir "$C"
check "truncated file refused and rebuilt" \
	test "$(field "$T/trunc.json" '[o["timings"]["pack_cache"][k] for k in ("lookup","store")]')" = "['truncated', 'stored']"
python3 - "$f" <<'EOF_PY'
import struct, sys
with open(sys.argv[1], "r+b") as f:
    f.seek(120); off = struct.unpack("<Q", f.read(8))[0]
    f.seek(off + 7); b = f.read(1); f.seek(off + 7); f.write(bytes([b[0] ^ 0x21]))
EOF_PY
pgen "$T/q6_k.gguf" "$T/flip.json" --cache-dir "$C"
check "damaged packed bytes refused (spot check) and rebuilt" \
	test "$(field "$T/flip.json" '[o["timings"]["pack_cache"][k] for k in ("lookup","store")]')" = "['content', 'stored']"
for j in trunc flip; do
	check "output after the rebuild ($j) unchanged" \
		test "$(field "$T/q6_k.none.json" 'o["output_ids"]')" = "$(field "$T/$j.json" 'o["output_ids"]')"
done
chmod 0644 "$f" && chmod g+w "$f"
pgen "$T/q6_k.gguf" "$T/perm.json" --cache-dir "$C"
check "group-writable cache file refused" \
	test "$(field "$T/perm.json" 'o["timings"]["pack_cache"]["lookup"]')" = unsafe_entry
# cleanup by kvd generate (the default retention, 7 days)
chmod 0600 "$f"
old=pack-11111111111111111111111111111111-avx512vnni.kvpack
young=pack-22222222222222222222222222222222-avx512vnni.kvpack
head -c 10000 /dev/zero >"$C/$old" && touch -d '10 days ago' "$C/$old"
head -c 10000 /dev/zero >"$C/$young" && touch -d '2 days ago' "$C/$young"
pgen "$T/q6_k.gguf" "$T/clean.json" --cache-dir "$C"
check "kvd generate removes another model's pack file unused for 10 days" \
	test "$(field "$T/clean.json" '(o["timings"]["pack_cache"]["lookup"], o["timings"]["pack_cache"]["removed"], o["timings"]["pack_cache"]["freed"])')" = "('hit', 1, 10000)" -a ! -e "$C/$old"
check "kvd generate keeps one unused for 2 days, and its own" test -e "$C/$young" -a -e "$f"
set +e
"$KVD" generate --model "$T/q6_k.gguf" --prompt x --cache-dir relative/dir >/dev/null 2>&1
rc=$?
set -e
check "--cache-dir must be absolute (usage error, rc=$rc)" test "$rc" = 64

# three starts at once on an empty directory: all the same output, one
# cache file, no temporary file left, and the next start is a hit
C=$T/cache_race
pids=()
for i in 1 2 3; do
	pgen "$T/q4_0.gguf" "$T/race$i.json" --cache-dir "$C" &
	pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
check "concurrent starts all succeed" test $rc = 0
for i in 1 2 3; do
	check "concurrent start $i: same output ids" \
		test "$(field "$T/q4_0.none.json" 'o["output_ids"]')" = "$(field "$T/race$i.json" 'o["output_ids"]')"
done
check "one cache file, no temporary left" \
	test "$(ls -A "$C" | grep -c kvpack)" = 1 -a "$(ls -A "$C" | grep -c '\.tmp$' || true)" = 0
pgen "$T/q4_0.gguf" "$T/race_after.json" --cache-dir "$C"
check "the start after the race maps the file" \
	test "$(field "$T/race_after.json" 'o["timings"]["pack_cache"]["lookup"]')" = hit

# the daemon: stored at the first boot, hit at the second, in the
# fingerprint cache's directory; model.pack_cache=off packs in memory
for boot in 1 2 3 4; do
	extra=
	[ $boot = 3 ] && extra=model.pack_cache=off
	[ $boot = 4 ] && extra=model.pack_cache_keep_days=0
	if [ $boot = 2 ]; then # another model's files: one stale, one young
		head -c 5000 /dev/zero >"$T/dcache/$old" && touch -d '30 days ago' "$T/dcache/$old"
		head -c 7000 /dev/zero >"$T/dcache/$young" && touch -d '1 day ago' "$T/dcache/$young"
	fi
	next_port
	write_node "pk$boot" standalone "$T/q4_0.gguf" "listen.client=127.0.0.1:$PORT" \
		"model.fingerprint_cache=$T/dcache" $extra
	start_node "pk$boot"
	wait_log "$T/pk$boot.log" "event=ready" 60 || true
	stop_node "pk$boot"
	if [ $boot = 2 ]; then
		after2="young=$([ -e "$T/dcache/$young" ] && echo kept || echo gone) old=$([ -e "$T/dcache/$old" ] && echo kept || echo gone)"
	fi
done
check "daemon boot 1 stores the repack cache" grep -q "event=pack_cache lookup=absent store=stored" "$T/pk1.log"
check "daemon boot 2 maps it and packs nothing" \
	grep -q "event=pack_cache lookup=hit store=- hold=[a-z]* errno=0 mapped=[1-9][0-9]* packed=0 " "$T/pk2.log"
check "model.pack_cache=off packs in memory" grep -q "event=pack_cache lookup=off store=off" "$T/pk3.log"
check "daemon boot 2 removes the stale file, one line naming it" \
	grep -q "event=pack_cache_removed name=$old reason=unused bytes=5000 " "$T/pk2.log"
check "daemon boot 2 keeps the young file ($after2)" test "$after2" = "young=kept old=gone"
check "daemon boot 2 counts the removal in event=pack_cache" \
	grep -q "event=pack_cache lookup=hit .* removed=1 freed=5000 in_use=0" "$T/pk2.log"
check "model.pack_cache_keep_days=0 removes the young file, keeps its own" \
	grep -q "event=pack_cache_removed name=$young reason=unused bytes=7000 " "$T/pk4.log"
check "keep_days=0: own file kept (boot 4 was a hit), the young file gone" \
	test "$(ls "$T/dcache" | grep -c '^pack-.*\.kvpack$')" = 1 -a ! -e "$T/dcache/$young"
check "keep_days=0 boot maps its own file" grep -q "event=pack_cache lookup=hit " "$T/pk4.log"
# a pack file truncated under a running node (issue 22 item 8): the node
# holds its hit under a read lease, copies the mapping privately when
# the truncation comes, and goes on serving the same tokens (a SIGBUS
# killed it before)
pgen "$T/q4_0.gguf" "$T/ref5.json"
next_port
write_node pk5 standalone "$T/q4_0.gguf" "listen.client=127.0.0.1:$PORT" \
	"model.fingerprint_cache=$T/dcache"
start_node pk5
wait_log "$T/pk5.log" "event=ready" 60 || true
check "boot 5 holds its hit under a lease" grep -q "event=pack_cache lookup=hit store=- hold=lease " "$T/pk5.log"
# truncate(1) opens O_NONBLOCK: EAGAIN while the lease is held, which
# starts the break; once the node has its copy (ms), a retry goes through
trunc_all() { local f; for f in "$T"/dcache/pack-*.kvpack; do truncate -s 0 "$f" 2>/dev/null || return 1; done; }
wait_for 10 trunc_all || true
check "the pack file is truncated under the node" \
	test "$(stat -c %s "$(ls "$T"/dcache/pack-*.kvpack | head -1)")" = 0
gen "$PORT" --prompt "the cache keeps the packed weights" --max-tokens 12 >"$T/gen5.json" || true
check "the node detached its copy (event=pack_cache_detached)" grep -q "event=pack_cache_detached" "$T/pk5.log"
check "... still runs" kill -0 "$PID_pk5"
check "... and serves the same tokens as kvd generate" python3 -c '
import json,sys
a=json.load(open(sys.argv[1]))["output_ids"]; b=json.load(open(sys.argv[2]))["output_ids"]
sys.exit(0 if a and a[:len(b)]==b[:len(a)] else "%r != %r" % (a, b))' "$T/gen5.json" "$T/ref5.json"
stop_node pk5
finish
