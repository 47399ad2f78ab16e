# tests/deps.sh - the Debian 12 packages kvd builds and tests with.
# shellcheck shell=bash
# Sourced by tests/run and quickstart.sh; installs only what is missing.
KVD_DEBS=(meson ninja-build pkg-config gcc libc6-dev
	libuv1-dev libmsgpack-dev libinih-dev libxxhash-dev check
	libsystemd-dev libibverbs-dev libsodium-dev libssl-dev systemd python3 jq iproute2 procps
	dnsmasq-base
	clang libclang-rt-dev spin prometheus
	node-llhttp libjansson-dev curl gdb valgrind
	nodejs npm)
# node and npm run the npm clients' tests (http_openai, http_clients);
# on Debian 12 they pull some 350 packages (22 MB to download). A
# package whose command is already on the PATH counts as present: Node
# from NodeSource bundles npm and conflicts with Debian's npm package.
declare -A KVD_DEB_CMD=([nodejs]=node [npm]=npm)
# headless browser of tests/integration/chat_page.sh (about 122 MB to fetch,
# 414 MB installed, 21 s on the dev machine)
KVD_DEBS+=(chromium)

kvd_install_deps() {
	local missing=() p sudo=
	for p in "${KVD_DEBS[@]}"; do
		[ -n "${KVD_DEB_CMD[$p]:-}" ] && command -v "${KVD_DEB_CMD[$p]}" >/dev/null && continue
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" ||
			missing+=("$p")
	done
	[ ${#missing[@]} -eq 0 ] && return 0
	[ "$(id -u)" -eq 0 ] || sudo=sudo
	echo "installing: ${missing[*]}"
	$sudo apt-get update -q
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
}
