#!/usr/bin/env bash
# deploy/Containerfile, built and run with podman (issue 25.5):
#   - the image builds from the repository (build stage: Debian 12 and
#     meson; runtime stage: Debian 12 slim with kvd, kvctl and their
#     libraries), its user is 10001, not root;
#   - kvd --version runs in it, every library of kvd and kvctl resolves,
#     and it holds no compiler, assembler, linker or build tool;
#   - kvctl in the image makes a model on a volume; kvd --check-config
#     passes there as the image's user, and `kvd serve -m` on that volume
#     (read-only) serves /livez, /readyz and a greedy completion equal to
#     this build's kvd generate, as uid 10001; a stop (SIGTERM) ends it
#     with status 0;
#   - the image's size (printed; what the runtime stage adds over its base
#     is bounded: binutils in it, 39 MiB, fails).
# No registry is reachable here: the base image is made with debootstrap
# (minbase, from the Debian mirror: KVD_DEBIAN_MIRROR; its tarball kept as
# KVD_BUILD/container/base.tar) and given to the Containerfile as BASE and
# RUNTIME_BASE. Everything lives in podman storage of its own under the
# build tree (KVD_BUILD/container), never in the machine's, and is kept
# between runs (the base and the build stage's package layer are reused).
# Where podman cannot run containers (no podman or debootstrap, not root,
# no runtime that starts here) the test skips (77) saying why; in a
# sanitizer build too (the image does not depend on the build).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/serve_lib.sh"
command -v podman >/dev/null || skip "podman absent (tests/deps.sh KVD_TEST_DEBS)"
command -v curl >/dev/null || skip "curl absent"
command -v jq >/dev/null || skip "jq absent"
[ "$(id -u)" -eq 0 ] || skip "needs root: rootful podman with storage of its own under the build tree"
# the image is built from the sources, whatever this build is
! ldd "$KVD" 2>/dev/null | grep -q libasan ||
	skip "a sanitizer build: the image is built from the sources alike, run in the release build"

CDIR=$KVD_BUILD/container
mkdir -p "$CDIR"
BASE=localhost/kvd-test-base:bookworm
IMAGE=localhost/kvd-test:latest
NAME=kvd-test-$$
MIRROR=${KVD_DEBIAN_MIRROR:-http://deb.debian.org/debian}
# (the run root, its state while it runs, is named in the storage's
# database, so it is the same for every run on this storage, and its path
# is at most 50 characters)
RUNROOT=/tmp/kvd-podman-$(printf '%s' "$CDIR" | sha256sum | cut -c1-12)
PODMAN=(podman --root "$CDIR/storage" --runroot "$RUNROOT")
# vfs where overlay does not mount, remembered with the storage
[ ! -f "$CDIR/vfs" ] || PODMAN+=(--storage-driver vfs)
ctr_cleanup() {
	local rc=$?
	set +e
	"${PODMAN[@]}" rm -f -t 0 "$NAME" >/dev/null 2>&1
	(exit "$rc")
	cleanup
}
trap ctr_cleanup EXIT

# ---- a base image, made here -------------------------------------------------------
# A storage podman cannot open (another run root named in its database, a
# podman upgrade) is the test's own: it starts again.
"${PODMAN[@]}" info >/dev/null 2>&1 || rm -rf "$CDIR/storage"
if ! "${PODMAN[@]}" image exists "$BASE" 2>/dev/null; then
	# the root file system, kept as a tarball beside the storage
	if [ ! -s "$CDIR/base.tar" ]; then
		command -v debootstrap >/dev/null || skip "debootstrap absent (tests/deps.sh KVD_TEST_DEBS)"
		echo "# debootstrap --variant=minbase bookworm from $MIRROR"
		timeout 900 debootstrap --variant=minbase bookworm "$T/rootfs" "$MIRROR" >"$T/debootstrap.log" 2>&1 ||
			{ tail -5 "$T/debootstrap.log"; skip "debootstrap from $MIRROR failed (mirror unreachable?)"; }
		# as debian:12-slim: no package files, lists, docs or man pages
		rm -rf "$T"/rootfs/var/cache/apt/archives/*.deb "$T"/rootfs/var/lib/apt/lists/* \
			"$T"/rootfs/usr/share/doc/* "$T"/rootfs/usr/share/man/*
		tar -C "$T/rootfs" -cf "$CDIR/base.tar.part" . && mv "$CDIR/base.tar.part" "$CDIR/base.tar"
		rm -rf "$T/rootfs"
	fi
	if ! "${PODMAN[@]}" import "$CDIR/base.tar" "$BASE" >"$T/import.log" 2>&1; then
		cat "$T/import.log"
		# overlay on overlay (a container in a container) does not mount
		grep -qi overlay "$T/import.log" || skip "podman import fails: $(tail -1 "$T/import.log")"
		rm -rf "$CDIR/storage"
		touch "$CDIR/vfs"
		PODMAN+=(--storage-driver vfs)
		"${PODMAN[@]}" import "$CDIR/base.tar" "$BASE" >"$T/import.log" 2>&1 ||
			{ cat "$T/import.log"; skip "podman import fails with overlay and vfs storage"; }
	fi
fi

# ---- how containers run on this machine --------------------------------------------
# crun refuses hybrid cgroups (v1 with a v2 mount) where runc runs, and a
# sandbox may refuse to raise RLIMIT_NOFILE/NPROC to podman's defaults:
# the first of these that runs a container is used for the build too.
RUN_OPTS=()
ok_opts=
for rt in "" runc; do
	[ -z "$rt" ] || command -v "$rt" >/dev/null || continue
	for ul in "" "--ulimit nofile=4096:4096 --ulimit nproc=4096:4096"; do
		# shellcheck disable=SC2086 # the ulimit options are words
		if "${PODMAN[@]}" ${rt:+--runtime "$rt"} run --rm --network host $ul "$BASE" true \
			>"$T/probe.log" 2>&1; then
			[ -z "$rt" ] || PODMAN+=(--runtime "$rt")
			# shellcheck disable=SC2206
			RUN_OPTS=(--network host $ul)
			ok_opts=1
			break 2
		fi
		echo "# podman ${rt:+--runtime $rt }run $ul: $(tail -1 "$T/probe.log")"
	done
done
[ -n "$ok_opts" ] || skip "podman cannot start a container here: $(tail -1 "$T/probe.log")"
echo "# podman $(podman --version | awk '{print $3}'): ${PODMAN[*]:1} run ${RUN_OPTS[*]}"

# ---- the build ---------------------------------------------------------------------------
t0=$(date +%s)
if ! timeout 1500 "${PODMAN[@]}" build --pull=never "${RUN_OPTS[@]}" \
	--build-arg BASE="$BASE" --build-arg RUNTIME_BASE="$BASE" --build-arg JOBS=2 \
	-f "$KVD_SRC/deploy/Containerfile" -t "$IMAGE" "$KVD_SRC" >"$T/build.log" 2>&1; then
	tail -40 "$T/build.log"
	not_ok "podman build -f deploy/Containerfile"
	finish
	exit 1
fi
ok "podman build -f deploy/Containerfile ($(($(date +%s) - t0)) s)"
prun() { "${PODMAN[@]}" run --rm "${RUN_OPTS[@]}" "$@"; }

# ---- what the image holds -----------------------------------------------------------
want=$("$KVD" --version | awk '{print $1, $2}')
got=$(prun "$IMAGE" --version)
echo "# $got"
check "kvd --version in the image: $want" test "$(awk '{print $1, $2}' <<<"$got")" = "$want"
check "the image's user is 10001:10001 (numeric: runAsNonRoot can verify it)" \
	test "$("${PODMAN[@]}" image inspect --format '{{.Config.User}}' "$IMAGE")" = "10001:10001"
check "its entrypoint is kvd" \
	test "$("${PODMAN[@]}" image inspect --format '{{json .Config.Entrypoint}}' "$IMAGE")" = '["/usr/local/bin/kvd"]'
inside() { prun --entrypoint /bin/sh "$IMAGE" -c "$1"; }
check "a shell in the image runs as uid 10001, gid 10001" test "$(inside 'id -u; id -g' | tr '\n' ' ')" = "10001 10001 "
missing=$(inside 'ldd /usr/local/bin/kvd /usr/local/bin/kvctl' | grep -c "not found" || true)
check "every library of kvd and kvctl resolves in the image ($missing missing)" test "$missing" = 0
tools=$(inside 'for t in gcc cc c99 clang tcc as ld ld.bfd ld.gold make ninja meson cpp; do command -v $t; done; ls -d /usr/lib/gcc/*/*/cc1 /usr/libexec/gcc 2>/dev/null; true')
check "no compiler, assembler, linker or build tool in the image (found: ${tools:-none})" test -z "$tools"

# ---- a model on a volume, a node from it ------------------------------------------------
mkdir -p "$T/models"
chmod 0777 "$T/models" # the image's user writes the model
# (quickstart.sh's model: greedy, "Once upon a time" goes on past 16 tokens)
prun -v "$T/models:/models" --entrypoint /usr/local/bin/kvctl "$IMAGE" model make /models/m.gguf \
	--layers 4 --dim 128 --heads 4 --kv-heads 2 --ff 384 --vocab 512 --ctx 1024 --seed 1 >/dev/null
check "kvctl model make in the image writes the model to the volume, owned by 10001" \
	test "$(stat -c %u "$T/models/m.gguf" 2>/dev/null)" = 10001
printf '[node]\nrole = standalone\n[model]\npath = /models/m.gguf\n[kv]\npool_tokens = 2048\n' > "$T/models/n.ini"
chmod 0644 "$T/models/n.ini"
check "kvd --check-config in the image, as its user (admin socket in its /run/kvd)" \
	quiet prun -v "$T/models:/models:ro" "$IMAGE" --check-config --config /models/n.ini

next_port
P=$PORT
"${PODMAN[@]}" run -d --name "$NAME" "${RUN_OPTS[@]}" -v "$T/models:/models:ro" "$IMAGE" \
	serve -m /models/m.gguf --host 127.0.0.1 --port "$P" --threads 2 >/dev/null
ready() { curl -sf -o /dev/null "http://127.0.0.1:$P/readyz"; }
if ! wait_for 60 ready; then
	"${PODMAN[@]}" logs "$NAME" 2>&1 | tail -20
	not_ok "kvd serve -m in the container: /readyz 200"
	finish
	exit 1
fi
ok "kvd serve -m in the container: /readyz 200"
check "its /livez: 200" curl -sf -o /dev/null "http://127.0.0.1:$P/livez"
uid=$("${PODMAN[@]}" exec "$NAME" awk '/^Uid:/ {print $2 $3}' /proc/1/status)
check "kvd in the container runs as uid 10001 (real, effective: $uid)" test "$uid" = 1000110001
PROMPT="Once upon a time"
want=$("$KVD" generate --model "$T/models/m.gguf" --prompt "$PROMPT" --max-tokens 16 \
	--temperature 0 --json | jq -c '{text, completion_tokens: (.output_ids | length)}')
got=$(curl -sS "http://127.0.0.1:$P/v1/completions" \
	-d "$(jq -nc --arg p "$PROMPT" '{prompt: $p, max_tokens: 16, temperature: 0}')" |
	jq -c '{text: .choices[0].text, completion_tokens: .usage.completion_tokens}')
echo "# container: $got"
echo "# this build's kvd generate: $want"
check "a greedy completion from the container equals this build's kvd generate" test "$got" = "$want"
check "... all 16 tokens of it" test "$(jq .completion_tokens <<<"$got")" = 16
"${PODMAN[@]}" stop -t 30 "$NAME" >/dev/null
rc=$("${PODMAN[@]}" wait "$NAME" 2>/dev/null || "${PODMAN[@]}" inspect --format '{{.State.ExitCode}}' "$NAME")
check "podman stop (SIGTERM): kvd drains and exits 0 (got $rc)" test "$rc" = 0
"${PODMAN[@]}" logs "$NAME" 2>&1 | grep -E "event=(serve_ready|drain|stop)" | head -5 | sed 's/^/# /'

# ---- size ------------------------------------------------------------------------------------
size=$("${PODMAN[@]}" image inspect --format '{{.Size}}' "$IMAGE")
bsize=$("${PODMAN[@]}" image inspect --format '{{.Size}}' "$BASE")
added=$(((size - bsize) / 1048576))
echo "# image size: $((size / 1048576)) MiB; its base (debootstrap minbase, as debian:12-slim): $((bsize / 1048576)) MiB; the runtime stage adds $added MiB"
check "the runtime stage adds under 32 MiB to its base (libraries, kvd, kvctl: $added MiB)" \
	test "$added" -lt 32
finish
