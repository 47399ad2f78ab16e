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

# dump_logs: the last lines of every log the test's nodes wrote, to
# stderr (meson prints it with the failure), so a failure on a machine we
# cannot log into still says why a node did what it did.
dump_logs() {
	local f
	for f in "$T"/*.log; do
		[ -f "$f" ] || continue
		echo "--- last 40 lines of ${f##*/}" >&2
		tail -n 40 "$f" >&2
	done
}

cleanup() {
	local rc=$? p
	for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	if [ "$rc" -ne 0 ] && [ "$rc" -ne 77 ]; then dump_logs; fi
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

# skip MESSAGE: skip the whole test, loudly (meson counts exit 77 as
# SKIP; the message goes to stderr so a $(...) caller cannot swallow it).
skip() {
	echo "SKIP: $*" >&2
	echo "SKIP: $*"
	exit 77
}

# npm_packages NAME PKG...: the npm packages PKG... (name@range) in
# $KVD_BUILD/npm-NAME, installed once (again when the list changes; its
# .pkgs holds it) with npm's cache beside them and a timeout; MOD is set
# to its node_modules, and each package's version printed as a comment.
# Skips (77) without npm or jq, or when the install fails (the registry
# unreachable). A directory that holds every package but no .pkgs (made
# before this helper) counts as installed.
npm_packages() {
	local dir=$KVD_BUILD/npm-$1 p name have=1; shift
	command -v npm >/dev/null || skip "npm absent"
	command -v jq >/dev/null || skip "jq absent"
	for p; do
		name=${p%@*}; [ -n "$name" ] || name=$p
		[ -f "$dir/node_modules/$name/package.json" ] || have=0
	done
	[ -f "$dir/.pkgs" ] || [ $have = 0 ] || echo "$*" > "$dir/.pkgs"
	if [ "$(cat "$dir/.pkgs" 2>/dev/null)" != "$*" ]; then
		mkdir -p "$dir"
		timeout 180 npm install --prefix "$dir" --cache "$dir/.npm" \
			--no-audit --no-fund --loglevel=error "$@" >"$T/npm.log" 2>&1 ||
			{ cat "$T/npm.log"; skip "npm install $* failed (registry unreachable?)"; }
		echo "$*" > "$dir/.pkgs"
	fi
	MOD=$dir/node_modules
	for p; do
		name=${p%@*}; [ -n "$name" ] || name=$p
		echo "# $name $(jq -r .version "$MOD/$name/package.json")"
	done
}

# need_verbs_emu WHAT: skip unless kvd carries the emulated RDMA device
# (-Dverbs_emu=true, a test build: tests/run builds so).
need_verbs_emu() {
	[ "${KVD_VERBS_EMU:-1}" != 0 ] ||
		skip "$1 needs the emulated RDMA device: this kvd was built without it (meson -Dverbs_emu=true)"
}

# The fault library (tests/integration/shim.c) for LD_PRELOAD, and
# shim_ok: it can be preloaded into this build's binaries (not into an
# ASan build's, whose runtime must be the first library).
SHIM=$KVD_BUILD/tests/libkvd_shim.so
# The fault library preloads only into a build without ASan, and
# valgrind runs only there too (plain_build). ldd, which runs the loader,
# once printed nothing for the ASan kvctl on a loaded machine (the shim
# was then preloaded and kvctl aborted; valgrind was run on it): a failed
# ldd is a no, and the ELF's NEEDED entries are read as well.
plain_build() {
	local libs
	libs=$(ldd "$KVCTL" 2>/dev/null) || return 1
	! grep -q libasan <<<"$libs" &&
		! readelf -d "$KVCTL" 2>/dev/null | grep -q 'NEEDED.*libasan'
}
shim_ok() { [ -f "$SHIM" ] && plain_build; }

# The test model: stories260K from shared/, or skip. Call it as
# M=$(shared_model) || exit: the skip's exit status is the subshell's.
shared_model() {
	local m=${KVD_SHARED:-}/models/stories260K.gguf
	[ -f "$m" ] || skip "$m absent"
	echo "$m"
}

# Time budgets. Every wait below is on a condition and returns as soon as
# it holds, so its budget only bounds a failure; KVD_TEST_TIME_SCALE
# (an integer, default 1) stretches them all on a slow or loaded machine.
TSCALE=${KVD_TEST_TIME_SCALE:-1}

# wait_for SECONDS COMMAND...: poll COMMAND every 50 ms until it succeeds
# (true) or SECONDS x TSCALE pass (false).
wait_for() {
	local n=$(( $1 * 20 * TSCALE )); shift
	while [ $n -gt 0 ]; do
		"$@" && return 0
		sleep 0.05; n=$((n - 1))
	done
	"$@"
}

# log_mark FILE: FILE's size in bytes now (0 when absent). Pass it to
# wait_log / log_since / log_count so that only lines written after the
# mark - after the action under test - can match.
log_mark() { stat -c %s "$1" 2>/dev/null || echo 0; }

# log_since FILE [MARK]: FILE from byte MARK on (nothing when absent).
log_since() { tail -c +$(( ${2:-0} + 1 )) "$1" 2>/dev/null || true; }

# log_has FILE PATTERN [MARK]: a line after MARK matches (grep -E).
log_has() { log_since "$1" "${3:-0}" | grep -Eq -- "$2"; }

# log_count FILE PATTERN [MARK]: how many lines after MARK match.
log_count() { log_since "$1" "${3:-0}" | grep -Ec -- "$2" || true; }

# wait_log FILE PATTERN [SECONDS] [MARK]: until a line written after MARK
# (default: the whole file) matches PATTERN (grep -E). A missing file
# never matches.
wait_log() {
	wait_for "${3:-10}" log_has "$1" "$2" "${4:-0}"
}

# quiet COMMAND...: run with its output discarded (for use under check)
quiet() { "$@" >/dev/null 2>&1; }
