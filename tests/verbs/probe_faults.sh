#!/bin/bash
# probe_faults.sh PROBE - verbs_probe reports what it must: a device that
# registers less than asked fails the probe (exit 1, naming the check),
# an ibverbs device that is not there is "no device" (exit 77), an
# emulated one that cannot open is a failure, bad arguments are usage
# errors (exit 2).
set -u
probe=$1
fails=0

# expect RC PATTERN ARGS... - run the probe, check its exit code and that
# its output has a line matching PATTERN.
expect() {
	local want=$1 pat=$2 out rc
	shift 2
	out=$("$probe" "$@" 2>&1)
	rc=$?
	if [ "$rc" -ne "$want" ] || ! grep -qE -- "$pat" <<<"$out"; then
		echo "FAIL: verbs_probe $* exited $rc (want $want), output:"
		echo "$out"
		fails=$((fails + 1))
	else
		echo "ok: verbs_probe $* -> $rc"
	fi
}

# registrations past 64 KiB are cut: the pool (128 KiB) is refused
expect 1 '^probe: FAIL scope: the device registered less than asked' --emu=short_mr=65536
# registrations past 16 KiB are cut: already the first registration
expect 1 '^probe: FAIL setup: the device registered less than asked' --emu=short_mr=16384
# no such device, whatever this machine has
expect 77 '^probe: (no RDMA device named kvd-no-such-device|this build has no libibverbs)' \
	kvd-no-such-device
# an emulated device whose directory is not there is a failure, not a skip
expect 1 '^probe: FAIL open' emu:/nonexistent-kvd-probe-dir
expect 2 'usage' --port 0 --emu
expect 2 'usage' --emu emu:/tmp
[ "$fails" -eq 0 ]
