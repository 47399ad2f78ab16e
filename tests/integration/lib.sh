# shellcheck shell=bash
# tests/integration/lib.sh - helpers for integration tests that start real
# kvd processes. Sourced; expects KVD_BUILD (build dir) and KVD_SRC.
set -euo pipefail

: "${KVD_BUILD:?KVD_BUILD must point at the build directory}"
KVD=$KVD_BUILD/kvd
KVCTL=$KVD_BUILD/kvctl
T=$(mktemp -d /tmp/kvd-it.XXXXXX)
PIDS=()
FAILS=0
PASSES=0

cleanup() {
	local p
	for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$T"
}
trap cleanup EXIT

ok() { PASSES=$((PASSES + 1)); echo "ok - $*"; }
not_ok() { FAILS=$((FAILS + 1)); echo "not ok - $*"; }
check() { # check DESCRIPTION COMMAND...
	local what=$1; shift
	if "$@"; then ok "$what"; else not_ok "$what"; fi
}
finish() {
	echo "$PASSES passed, $FAILS failed"
	[ "$FAILS" -eq 0 ]
}

# The test model: stories260K from shared/, or skip.
shared_model() {
	local m=${KVD_SHARED:-}/models/stories260K.gguf
	if [ ! -f "$m" ]; then echo "skip: $m absent"; exit 77; fi
	echo "$m"
}

# wait_log FILE PATTERN [SECONDS]
wait_log() {
	local f=$1 pat=$2 n=$(( ${3:-10} * 20 ))
	while [ $n -gt 0 ]; do
		grep -q -- "$pat" "$f" 2>/dev/null && return 0
		sleep 0.05; n=$((n - 1))
	done
	return 1
}

# quiet COMMAND...: run with its output discarded (for use under check)
quiet() { "$@" >/dev/null 2>&1; }
