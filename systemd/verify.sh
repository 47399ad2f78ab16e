#!/bin/sh
# verify.sh UNIT KVD - `systemd-analyze verify` on the generated unit.
# The unit names installed paths; verify a copy that points at the built
# binary instead (verify checks that ExecStart= exists). Skips (77)
# without systemd-analyze.
set -eu
unit=$1
kvd=$2
command -v systemd-analyze >/dev/null 2>&1 || { echo "no systemd-analyze: skip"; exit 77; }
T=$(mktemp -d /tmp/kvd-unit.XXXXXX)
trap 'rm -rf "$T"' EXIT
sed -e "s|^\(ExecStart[A-Za-z]*=\)[^ ]*/kvd |\1$kvd |" "$unit" >"$T/kvd@.service"
grep -q "^ExecStart=$kvd " "$T/kvd@.service"
grep -q "^Type=notify" "$T/kvd@.service"
ln -s "kvd@.service" "$T/kvd@test.service"
# verify prints problems on stderr and may exit 0 on some of them: fail
# on any line that names our unit.
out=$(cd "$T" && SYSTEMD_LOG_LEVEL=notice systemd-analyze verify --man=no \
	"$T/kvd@test.service" 2>&1) || { echo "$out"; exit 1; }
echo "$out" | grep -v "^$" | grep -i "kvd@" && exit 1
echo "systemd-analyze verify: ok"
