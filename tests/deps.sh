# tests/deps.sh - the Debian 12 packages kvd builds and tests with.
# shellcheck shell=bash
# Sourced by tests/run and quickstart.sh; installs only what is missing.
# What kvd builds and runs with (quickstart.sh installs these only).
KVD_DEBS=(meson ninja-build pkg-config gcc libc6-dev
	libuv1-dev libmsgpack-dev libinih-dev libxxhash-dev check
	libsystemd-dev libibverbs-dev libsodium-dev libssl-dev systemd python3
	node-llhttp libjansson-dev curl)
# What the tests add (tests/run installs both lists): jq, iproute2 and
# procps in the scripts; dnsmasq-base, the DNS server of peer_dns (and of
# rolling_restart, kill_nodes); haproxy, the load balancer of haproxy_lb,
# rolling_restart and kill_nodes (deploy/haproxy/kvd.cfg); clang
# and its runtime for the libFuzzer run; spin for the model; prometheus
# for promtool; gdb and valgrind; node and npm for the npm clients' tests
# (http_openai, http_clients, chat_page: on Debian 12 some 350 packages,
# 22 MB to download); chromium, the headless browser of chat_page (122 MB
# to fetch, 414 MB installed, 21 s on the dev machine); podman, runc (for
# hosts whose cgroups crun refuses) and debootstrap, which build and run
# deploy/Containerfile (container_build); kubernetes-client, whose kubectl
# renders deploy/k8s (k8s_manifests: kubectl kustomize).
KVD_TEST_DEBS=(jq iproute2 procps dnsmasq-base haproxy
	clang libclang-rt-dev spin prometheus gdb valgrind
	nodejs npm chromium podman runc debootstrap kubernetes-client)
# A package whose command is already on the PATH counts as present: Node
# from NodeSource bundles npm and conflicts with Debian's npm package, and
# a kubectl from Kubernetes' or a cloud SDK's packages with Debian's.
declare -A KVD_DEB_CMD=([nodejs]=node [npm]=npm [kubernetes-client]=kubectl)

# kvd_install_deps [--build]: both lists, or only KVD_DEBS with --build.
kvd_install_deps() {
	local missing=() p sudo= want=("${KVD_DEBS[@]}")
	[ "${1:-}" = --build ] || want+=("${KVD_TEST_DEBS[@]}")
	for p in "${want[@]}"; do
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
