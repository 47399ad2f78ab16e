# tests/deps.sh - the Debian 12 packages kvd builds and tests with.
# shellcheck shell=bash
# Sourced by tests/run and quickstart.sh; installs only what is missing.
KVD_DEBS=(meson ninja-build pkg-config gcc libc6-dev
	libuv1-dev libmsgpack-dev libinih-dev libxxhash-dev check
	libsystemd-dev libibverbs-dev libsodium-dev libssl-dev systemd python3 jq iproute2 procps
	clang libclang-rt-dev spin prometheus
	node-llhttp libjansson-dev curl gdb valgrind)
# headless browser of tests/integration/chat_page.sh (about 122 MB to fetch,
# 414 MB installed, 21 s on the dev machine)
KVD_DEBS+=(chromium)

kvd_install_deps() {
	local missing=() p sudo=
	for p in "${KVD_DEBS[@]}"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" ||
			missing+=("$p")
	done
	[ ${#missing[@]} -eq 0 ] && return 0
	[ "$(id -u)" -eq 0 ] || sudo=sudo
	echo "installing: ${missing[*]}"
	$sudo apt-get update -q
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
}
