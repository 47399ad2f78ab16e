#!/usr/bin/env bash
# The model fingerprint cache (model.fingerprint_cache, conf/fingerprint.c)
# through the real binary: the first boot hashes and stores, the next one
# reads the cache (and the same SHA-256 as sha256sum), $CACHE_DIRECTORY is
# the default, and a model rewritten in place - same size, mtime put back -
# is hashed again: its new fingerprint reaches the handshake and a peer
# holding the old bytes refuses it. A hit is verified in full off the
# loop after start: a cached start logs event=model_fingerprint_verified,
# and an entry whose sampled evidence matches but whose digest names other
# bytes (two same-metadata files that differ outside the samples) takes
# the node out of service: event=model_fingerprint_mismatch, exit 65, the
# entry dropped, and the restart hashes in full (issue 22 item 2).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/serve_lib.sh"
command -v sha256sum >/dev/null || skip "sha256sum absent"

A=$T/a.gguf
gen_model "$A"
cp "$A" "$T/b.gguf"
sleep 1.2 # past the racy window: the cache stores only settled files

# boot NAME [keys...]: a node whose pool is too small exits 78 right after
# the fingerprint and the capacity line - a boot that stops early.
boot() {
	local name=$1; shift
	write_node "$name" standalone "$A" "kv.pool_tokens=1" "$@"
	set +e
	timeout 60 env ${BOOT_ENV:-} "$KVD" --config "$T/$name.ini" >"$T/$name.log" 2>&1
	local rc=$?
	set -e
	[ $rc -eq 78 ] || echo "# boot $name: rc=$rc"
}
fp_line() { grep 'event=model_fingerprint' "$T/$1.log"; }
sha_of() { sha256sum "$1" | cut -d' ' -f1; }
OLD=$(sha_of "$A")

boot b1 "model.fingerprint_cache=$T/fpc"
check "first boot hashes the file and stores an entry" \
	grep -q "source=hash lookup=absent store=stored hashed_bytes=$(stat -c %s "$A") .*sha256=$OLD" <(fp_line b1)
boot b2 "model.fingerprint_cache=$T/fpc"
check "second boot reads the cache, same digest as sha256sum" \
	grep -q "source=cache lookup=hit store=- hashed_bytes=0 .*sha256=$OLD" <(fp_line b2)
check "capacity line carries the cached fingerprint" grep -q "model_sha256=$OLD" "$T/b2.log"
check "the cache directory and entry are private" \
	test "$(stat -c %a "$T/fpc")" = 700 -a "$(stat -c %a "$T"/fpc/model-*.fp)" = 600

BOOT_ENV="CACHE_DIRECTORY=$T/sysd" boot b3
BOOT_ENV="CACHE_DIRECTORY=$T/sysd" boot b4
check "\$CACHE_DIRECTORY is the default cache" grep -q "source=cache lookup=hit" <(fp_line b4)
BOOT_ENV="CACHE_DIRECTORY=$T/sysd" boot b5 "model.fingerprint_cache=off"
check "model.fingerprint_cache=off hashes every boot" grep -q "source=hash lookup=off store=off" <(fp_line b5)

write_node bad standalone "$A" "model.fingerprint_cache=relative/dir"
set +e; out=$("$KVD" --check-config --config "$T/bad.ini" 2>&1 >/dev/null); rc=$?; set -e
check "a relative cache path is a config error naming the key ($out)" \
	test $rc -eq 78 -a -n "$(grep 'model.fingerprint_cache' <<<"$out")"

# --- rewritten in place: same size, same inode, old mtime restored ---------
touch -r "$A" "$T/mtime.ref"
size0=$(stat -c %s "$A"); ino0=$(stat -c %i "$A")
printf '\x5a\x5a\x5a\x5a' | dd of="$A" bs=1 seek=$((size0 - 64)) conv=notrunc status=none
touch -r "$T/mtime.ref" "$A"
NEW=$(sha_of "$A")
check "rewrite kept size, inode and mtime, changed the bytes" \
	test "$(stat -c %s "$A")" = "$size0" -a "$(stat -c %i "$A")" = "$ino0" \
	-a "$(stat -c %Y.%y "$A")" = "$(stat -c %Y.%y "$T/mtime.ref")" -a "$NEW" != "$OLD"
boot b6 "model.fingerprint_cache=$T/fpc"
check "the cache does not hide the rewrite: hashed again, new digest" \
	grep -q "source=hash lookup=stale .*sha256=$NEW" <(fp_line b6)

# The rewritten model on prefill (cached entry of the old bytes in its
# cache), the old bytes on decode: the handshake refuses the pair.
pair p_fp d_fp "$A" "model.fingerprint_cache=$T/fpc" -- "model.fingerprint_cache=$T/fpc_d"
sed -i "s|^path = .*|path = $T/b.gguf|" "$T/d_fp.ini"
start_node p_fp
start_node d_fp
check "prefill announces the new fingerprint" wait_log "$T/p_fp.log" "event=model_fingerprint .*sha256=$NEW" 10
check "decode with the old bytes refuses the peer on model_sha256" \
	wait_log "$T/d_fp.log" "event=peer_refused .*field=model_sha256" 10
stop_node d_fp
stop_node p_fp
# --- the full check of a hit (issue 22 item 2) --------------------------
C=$T/c.gguf
cp "$T/b.gguf" "$C"
sleep 1.2
write_node fc0 standalone "$C" "model.fingerprint_cache=$T/fpc_c" "kv.pool_tokens=1"
timeout 60 "$KVD" --config "$T/fc0.ini" >"$T/fc0.log" 2>&1 || true
check "an entry is stored for c.gguf" grep -q "store=stored .*sha256=$OLD" "$T/fc0.log"
write_node fc1 standalone "$C" "model.fingerprint_cache=$T/fpc_c"
start_node fc1
check "a cached start verifies the digest in full off the loop" \
	wait_log "$T/fc1.log" "event=model_fingerprint_verified bytes=$(stat -c %s "$C") .*sha256=$OLD" 20
check "... after reading only the evidence at boot" \
	grep -q "source=cache lookup=hit store=- hashed_bytes=0 evidence_bytes=[1-9]" "$T/fc1.log"
stop_node fc1
E=$(echo "$T"/fpc_c/model-*.fp)
FAKE=$(printf '%064d' 7)
sed -i "s/sha256=[0-9a-f]*\$/sha256=$FAKE/" "$E"
write_node fc2 standalone "$C" "model.fingerprint_cache=$T/fpc_c"
set +e; timeout 30 "$KVD" --config "$T/fc2.ini" >"$T/fc2.log" 2>&1; rc=$?; set -e
check "an entry naming other bytes is trusted at boot (sampled evidence matches)" \
	grep -q "source=cache lookup=hit .*sha256=$FAKE" "$T/fc2.log"
check "... the full check finds the mismatch and stops the node: exit 65 (rc=$rc)" test $rc -eq 65
check "... logging event=model_fingerprint_mismatch with both digests" \
	grep -q "event=model_fingerprint_mismatch .*cached=$FAKE actual=$OLD .*entry=dropped action=stop" "$T/fc2.log"
check "... the entry is dropped" test ! -e "$E"
write_node fc3 standalone "$C" "model.fingerprint_cache=$T/fpc_c" "kv.pool_tokens=1"
timeout 60 "$KVD" --config "$T/fc3.ini" >"$T/fc3.log" 2>&1 || true
check "the restart hashes in full: the right digest" \
	grep -q "source=hash lookup=absent store=stored .*sha256=$OLD" "$T/fc3.log"
finish
