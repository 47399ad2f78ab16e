#!/usr/bin/env bash
# kvctl's file readers. `kvctl model tokenize --file`: a file that cannot
# be read to its end - a directory, or one whose read fails after some
# bytes (the fault library, tests/integration/shim.c) - is an error
# naming the file and the cause (exit 1, nothing on stdout), never the
# tokens of what was read before the failure, nor of bytes past what was
# read; a readable file gives the same ids as the text on the command
# line. `kvctl audit FILE`: a file it cannot read is named with the
# cause (exit 1).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/serve_lib.sh"
gen_model "$T/m.gguf"
TEXT="Once upon a time there was a little model that read files."
printf '%s' "$TEXT" >"$T/in.txt"

want=$("$KVCTL" model tokenize "$T/m.gguf" "$TEXT")
got=$("$KVCTL" model tokenize "$T/m.gguf" --file "$T/in.txt")
check "a readable file: the ids of its text" test -n "$want" -a "$got" = "$want"

# refused TAG [ENV=VALUE...]: tokenize --file FILE fails with exit 1,
# stderr names FILE and CAUSE, stdout is empty
refused() {
	local what=$1 file=$2 cause=$3 rc=0; shift 3
	env "$@" "$KVCTL" model tokenize "$T/m.gguf" --file "$file" \
		>"$T/out" 2>"$T/err" || rc=$?
	check "$what: refused (exit $rc)" test "$rc" -eq 1
	check "$what: the message names the file and the cause" \
		grep -qF "$file: $cause" "$T/err"
	check "$what: nothing on stdout" test ! -s "$T/out"
}

refused "a directory" "$T" "Is a directory"
if shim_ok; then
	refused "a read failing at once" "$T/in.txt" "Input/output error" \
		LD_PRELOAD="$SHIM" KVD_SHIM_READ_FAIL="$T/in.txt:0"
	refused "a read failing after 20 bytes" "$T/in.txt" "Input/output error" \
		LD_PRELOAD="$SHIM" KVD_SHIM_READ_FAIL="$T/in.txt:20"
else
	echo "# the fault library cannot be preloaded here (ASan build): read failures not tried"
fi

# audit_refused WHAT FILE CAUSE [ENV=VALUE...]: kvctl audit FILE fails
# with exit 1 and stderr names FILE and CAUSE
audit_refused() {
	local what=$1 file=$2 cause=$3 rc=0; shift 3
	env "$@" "$KVCTL" audit "$file" >"$T/out" 2>"$T/err" || rc=$?
	check "audit, $what: refused (exit $rc)" test "$rc" -eq 1
	check "audit, $what: the message names the file and the cause" \
		grep -qF "$file: $cause" "$T/err"
}
audit_refused "a directory" "$T" "Is a directory"
if shim_ok; then
	audit_refused "a read failing after 20 bytes" "$T/in.txt" "Input/output error" \
		LD_PRELOAD="$SHIM" KVD_SHIM_READ_FAIL="$T/in.txt:20"
fi
finish
