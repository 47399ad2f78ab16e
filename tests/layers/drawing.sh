#!/usr/bin/env bash
# The request machines drawn in daemon/README.md are the tables as they
# are: the README's block equals `test_machine --draw` (regenerate it
# with that command when a table changes).
set -euo pipefail
want=$("$KVD_BUILD/tests/test_machine" --draw)
have=$(awk '/^decode: new -> /{on=1} on && /^```$/{exit} on' "$KVD_SRC/daemon/README.md")
if [ "$want" != "$have" ]; then
	echo "daemon/README.md's machine drawing differs from the tables:"
	diff <(echo "$have") <(echo "$want") || true
	exit 1
fi
echo "ok - daemon/README.md draws the tables as they are"
