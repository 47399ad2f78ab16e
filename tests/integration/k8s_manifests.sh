#!/usr/bin/env bash
# deploy/k8s, offline (issue 25.5): `kubectl kustomize` renders it (with
# secrets made here: the repository holds none), every object is valid
# against the Kubernetes OpenAPI schema of its kind and has no field the
# API does not define (k8s_validate.mjs; a typo'd field and a wrong type
# are shown to fail), and kvd's side holds:
#   - each role's pod, replayed: its Secret and ConfigMap files as the
#     kubelet mounts them (root:10001 0440 under fsGroup, 0644), the
#     prepare init container's script as uid 10001, then
#     `kvd --check-config` of what it wrote, as uid 10001, exits 0 (the
#     node named after the pod, the secrets owner-only);
#   - the probes: /livez (startup, liveness) and /readyz (readiness) on
#     the container port whose number is the config's listen.http, bound
#     to every address; the peer ports and Service names are the
#     config's (listen.peer, peers.prefill);
#   - non-root (the image's USER), read-only root, every path kvd writes
#     on a volume; requests = limits, cpu = engine.threads, memory >=
#     kv.memory_bytes + 512MiB; terminationGracePeriodSeconds > the
#     preStop drain's wait >= node.drain_timeout_ms + 2 x
#     transfer.release_timeout_ms, and the drain goes to admin.socket;
#   - Services and PodDisruptionBudgets select their role's pods.
# The npm packages (kubernetes-models, @kubernetes/client-node, yaml)
# are installed once into KVD_BUILD/npm-k8s; without kubectl, node, npm
# or the registry the test skips (77).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/serve_lib.sh"
command -v kubectl >/dev/null || skip "kubectl absent (kubectl kustomize renders deploy/k8s)"
command -v node >/dev/null || skip "node absent"
SRC=$KVD_SRC/deploy/k8s

npm_packages k8s kubernetes-models@4 @kubernetes/client-node@1 yaml@2
echo "# $(kubectl version --client 2>/dev/null | tr '\n' ' ')"
VALIDATE=$KVD_SRC/tests/integration/k8s_validate.mjs
jqe() { jq -e "$@" >/dev/null; }

# ---- render ---------------------------------------------------------------------------
if command -v git >/dev/null && git -C "$KVD_SRC" rev-parse >/dev/null 2>&1; then
	tracked=$(git -C "$KVD_SRC" ls-files deploy | grep -E '(^|/)(cluster\.key|api\.keys)$' || true)
	check "the repository holds no secret under deploy/ (${tracked:-no cluster.key, no api.keys})" test -z "$tracked"
	check "deploy/k8s/secrets/.gitignore keeps them out" \
		test "$(git -C "$KVD_SRC" check-ignore deploy/k8s/secrets/cluster.key deploy/k8s/secrets/api.keys | wc -l)" = 2
fi
cp -r "$SRC" "$T/k8s"
"$KVCTL" keygen "$T/k8s/secrets/cluster.key" >/dev/null
USER_KEY=$(head -c 24 /dev/urandom | base64 | tr +/ -_)
ADMIN_KEY=$(head -c 24 /dev/urandom | base64 | tr +/ -_)
printf '%s acme\n%s ops admin\n' "$USER_KEY" "$ADMIN_KEY" > "$T/k8s/secrets/api.keys"
if ! kubectl kustomize "$T/k8s" >"$T/all.yaml" 2>"$T/kustomize.err"; then
	cat "$T/kustomize.err"
	not_ok "kubectl kustomize deploy/k8s renders"
	finish
	exit 1
fi
ok "kubectl kustomize deploy/k8s renders ($(grep -c '^kind:' "$T/all.yaml") objects)"
rm -rf "$T/k8s"

# ---- the schemas ------------------------------------------------------------------------
node "$VALIDATE" "$MOD" "$T/all.yaml" "$T/all.json" >"$T/validate.out" && vrc=0 || vrc=$?
sed 's/^/  /' "$T/validate.out"
check "every object valid and strict (k8s_validate.mjs: $(grep -c '^ok' "$T/validate.out") ok)" test "$vrc" = 0
# the validator can fail: a typo'd field, a string for an integer
sed '0,/readOnlyRootFilesystem:/s//readOnlyRootFilesytem:/' "$T/all.yaml" > "$T/typo.yaml"
node "$VALIDATE" "$MOD" "$T/typo.yaml" /dev/null >"$T/typo.out" && trc=0 || trc=$?
check "a typo'd field (readOnlyRootFilesytem) fails validation: exit $trc" test "$trc" = 1
check "... naming the field" grep -q "^not ok .*readOnlyRootFilesytem (not a field of V1SecurityContext)" "$T/typo.out"
sed '0,/terminationGracePeriodSeconds: 90/s//terminationGracePeriodSeconds: "90"/' "$T/all.yaml" > "$T/type.yaml"
node "$VALIDATE" "$MOD" "$T/type.yaml" /dev/null >"$T/type.out" && trc=0 || trc=$?
check "a string for an integer fails validation ($(grep -m1 '^not ok' "$T/type.out"))" \
	grep -q "^not ok .*terminationGracePeriodSeconds must be integer" "$T/type.out"

J=$T/all.json
obj() { jq -c --arg k "$1" --arg n "$2" '.[] | select(.kind == $k and .metadata.name == $n)' "$J"; }
for o in Namespace:kvd Service:kvd-prefill Service:kvd-decode StatefulSet:kvd-prefill \
	Deployment:kvd-decode PodDisruptionBudget:kvd-prefill PodDisruptionBudget:kvd-decode \
	PersistentVolumeClaim:kvd-models; do
	check "$o is rendered" test -n "$(obj "${o%%:*}" "${o#*:}")"
done
check "every namespaced object is in namespace kvd" \
	jqe '[.[] | select(.kind != "Namespace") | .metadata.namespace == "kvd"] | all' "$J"
check "the prefill Service is headless (clusterIP None), ready pods only" \
	jqe '.clusterIP == "None" and (.publishNotReadyAddresses | not)' <<<"$(obj Service kvd-prefill | jq .spec)"

# ---- kvd's side, per role ---------------------------------------------------------
IMAGE_UID=$(awk '$1 == "USER" { split($2, a, ":"); print a[1] }' "$KVD_SRC/deploy/Containerfile")
gen_model "$T/model.gguf"
# qty Q: a Kubernetes quantity in bytes (Ki Mi Gi Ti, or plain)
qty() {
	local n=${1%[KMGT]i} u=${1#"${1%[KMGT]i}"}
	case $u in Ki) echo $((n << 10)) ;; Mi) echo $((n << 20)) ;; Gi) echo $((n << 30)) ;;
	Ti) echo $((n << 40)) ;; *) echo "$n" ;; esac
}
# ge A B...: A >= the sum of B..., each a number (an empty one fails)
ge() {
	local a=$1 sum=0 v
	shift
	for v in "$a" "$@"; do [[ $v =~ ^[0-9]+$ ]] || return 1; done
	for v in "$@"; do sum=$((sum + v)); done
	[ "$a" -ge "$sum" ]
}
# as_pod CMD...: CMD as the pods' user and group (the kubelet's), when
# this test is root; else as this user (the modes still hold)
as_pod() {
	if [ "$(id -u)" -eq 0 ]; then
		setpriv --reuid "$IMAGE_UID" --regid "$IMAGE_UID" --groups "$IMAGE_UID" "$@"
	else
		"$@"
	fi
}
# resolved FILE SECTION KEY: a key of kvd --check-config's resolved output
resolved() {
	awk -v s="[$2]" -v k="$3" '/^\[/ { in_s = ($0 == s) } in_s && $1 == k { print $3; exit }' "$1"
}

role_checks() { # role_checks ROLE KIND NAME
	local role=$1 kind=$2 name=$3 w pod spec c cm ini P vm
	w=$(obj "$kind" "$name")
	spec=$(jq -c '.spec.template.spec' <<<"$w")
	c=$(jq -c '.containers[] | select(.name == "kvd")' <<<"$spec")
	echo "# --- $role ($kind $name)"
	check "$role: one kvd container, one prepare init container" \
		test "$(jq '[.containers[], .initContainers[]] | length' <<<"$spec")" = 2

	# The pod's files as the kubelet mounts them, under $pod
	pod=$T/pod-$role
	mkdir -p "$pod/etc/kvd/config" "$pod/etc/kvd/secret" "$pod/run/kvd-private" \
		"$pod/run/kvd" "$pod/var/cache/kvd" "$pod/models"
	cp "$T/model.gguf" "$pod/models/model.gguf"
	cm=$(jq -r '.volumes[] | select(.name == "config") | .configMap.name' <<<"$spec")
	jq -r --arg n "$cm" '.[] | select(.kind == "ConfigMap" and .metadata.name == $n) | .data["kvd.ini"]' "$J" \
		> "$pod/etc/kvd/config/kvd.ini"
	check "$role: its ConfigMap $cm holds kvd.ini" test -s "$pod/etc/kvd/config/kvd.ini"
	local sec mode fsg
	sec=$(jq -r '.volumes[] | select(.name == "secret") | .secret.secretName' <<<"$spec")
	mode=$(jq -r '.volumes[] | select(.name == "secret") | .secret.defaultMode' <<<"$spec")
	fsg=$(jq -r '.securityContext.fsGroup' <<<"$spec")
	check "$role: the Secret volume is mode 0440 (got $(printf '%o' "$mode")) and fsGroup the image's group ($fsg)" \
		test "$mode" = 288 -a "$fsg" = "$IMAGE_UID"
	for f in cluster.key api.keys; do
		jq -r --arg n "$sec" --arg f "$f" '.[] | select(.kind == "Secret" and .metadata.name == $n) | .data[$f]' "$J" |
			base64 -d > "$pod/etc/kvd/secret/$f"
		# the kubelet: root-owned, group fsGroup, defaultMode
		if [ "$(id -u)" -eq 0 ]; then chown "0:$fsg" "$pod/etc/kvd/secret/$f"; fi
		chmod "$(printf '%o' "$mode")" "$pod/etc/kvd/secret/$f"
	done
	chmod 0644 "$pod/etc/kvd/config/kvd.ini" "$pod/models/model.gguf"
	chmod 0755 "$T" "$pod" "$pod"/* "$pod"/*/*
	# emptyDirs: world-writable directories
	chmod 0777 "$pod/run/kvd-private" "$pod/run/kvd" "$pod/var/cache/kvd"

	# The prepare init container, its paths under $pod
	local script podname=$name-0
	script=$(jq -r '.initContainers[] | select(.name == "prepare") | .command[2]' <<<"$spec")
	check "$role: prepare runs /bin/sh -ec SCRIPT" \
		test "$(jq -c '.initContainers[0].command[0:2]' <<<"$spec")" = '["/bin/sh","-ec"]'
	script=${script//\/etc\/kvd\//$pod/etc/kvd/}
	script=${script//\/run\/kvd-private/$pod/run/kvd-private}
	check "$role: the prepare script runs as the pods' user" \
		as_pod env POD_NAME="$podname" /bin/sh -ec "$script"
	ls -ln "$pod/run/kvd-private" | sed 's/^/#   /'
	for f in cluster.key api.keys; do
		check "$role: prepared $f is owner-only (0400) and the pods' user's" \
			test "$(stat -c '%a %u' "$pod/run/kvd-private/$f")" = "400 $([ "$(id -u)" -eq 0 ] && echo "$IMAGE_UID" || id -u)"
	done

	# kvd --check-config of what prepare wrote, its paths under $pod
	ini=$T/$role.ini
	sed -e "s#/run/kvd-private/#$pod/run/kvd-private/#" -e "s#/run/kvd/#$pod/run/kvd/#" \
		-e "s#/models/#$pod/models/#" "$pod/run/kvd-private/kvd.ini" > "$ini"
	chmod 0644 "$ini"
	local cc
	as_pod env CACHE_DIRECTORY="$pod/var/cache/kvd/node" "$KVD" --check-config --config "$ini" >"$T/$role.resolved" 2>&1 && cc=0 || cc=$?
	P=$(resolved "$T/$role.resolved" listen http)
	[ "$cc" = 0 ] || tail -3 "$T/$role.resolved"
	check "$role: kvd --check-config of the prepared INI exits 0 as the pods' user" test "$cc" = 0
	check "$role: node.name is the pod's name" test "$(resolved "$T/$role.resolved" node name)" = "$podname"
	check "$role: node.role is $role" test "$(resolved "$T/$role.resolved" node role)" = "$role"

	# probes on listen.http, every address
	local hp=${P##*:} ports
	check "$role: listen.http binds every address (got $P; the kubelet probes the pod's IP)" test "${P%:*}" = 0.0.0.0
	ports=$(jq -c '[.ports[] | {(.name): .containerPort}] | add' <<<"$c")
	check "$role: startup and liveness probe /livez, readiness /readyz" \
		test "$(jq -c '[.startupProbe.httpGet.path, .livenessProbe.httpGet.path, .readinessProbe.httpGet.path]' <<<"$c")" = '["/livez","/livez","/readyz"]'
	for pr in startupProbe livenessProbe readinessProbe; do
		local pp
		pp=$(jq -r --arg p "$pr" '.[$p].httpGet.port' <<<"$c")
		[ -z "${pp//[0-9]/}" ] || pp=$(jq -r --arg n "$pp" '.[$n] // empty' <<<"$ports")
		check "$role: $pr's port is listen.http's ($pp = $hp)" test "$pp" = "$hp"
	done
	if [ "$role" = prefill ]; then
		local pe
		pe=$(resolved "$T/$role.resolved" listen peer)
		check "$role: container port peer is listen.peer's ($pe)" test "$(jq -r .peer <<<"$ports")" = "${pe##*:}"
		PREFILL_PEER_PORT=${pe##*:}
	else
		DECODE_PEERS=$(resolved "$T/$role.resolved" peers prefill)
		DECODE_HTTP=$hp
	fi

	# security and the paths kvd writes
	check "$role: pod runs as the image's user ($IMAGE_UID), non-root" \
		jqe --argjson u "$IMAGE_UID" '.securityContext | .runAsNonRoot and .runAsUser == $u and .runAsGroup == $u' <<<"$spec"
	check "$role: every container: read-only root, no privilege escalation, no capabilities" \
		jqe '[.containers[], .initContainers[] | .securityContext | .readOnlyRootFilesystem and (.allowPrivilegeEscalation | not) and .capabilities.drop == ["ALL"]] | all' <<<"$spec"
	local sock cache
	sock=$(resolved "$T/$role.resolved" admin socket)
	sock=${sock#"$pod"}
	vm=$(jq -c '[.volumeMounts[] | select(.readOnly | not) | .mountPath]' <<<"$c")
	check "$role: admin.socket's directory (${sock%/*}) is a writable volume" \
		jqe --arg d "${sock%/*}" 'index($d) != null' <<<"$vm"
	cache=$(jq -r '.env[] | select(.name == "CACHE_DIRECTORY") | .value' <<<"$c")
	check "$role: CACHE_DIRECTORY ($cache) is below a writable volume, a directory kvd makes" \
		jqe --arg d "${cache%/*}" 'index($d) != null' <<<"$vm"
	check "$role: the models volume is read-only at the model's directory" \
		jqe '.volumeMounts[] | select(.name == "models") | .readOnly and .mountPath == "/models"' <<<"$c"

	# resources from the capacity check
	local th mem req lim
	th=$(resolved "$T/$role.resolved" engine threads)
	mem=$(resolved "$T/$role.resolved" kv memory_bytes)
	req=$(jq -c '.resources.requests | {cpu, memory}' <<<"$c")
	lim=$(jq -c '.resources.limits | {cpu, memory}' <<<"$c")
	check "$role: requests = limits (Guaranteed: $req)" test "$req" = "$lim"
	check "$role: cpu = engine.threads ($th)" test "$(jq -r .cpu <<<"$req")" = "$th"
	check "$role: memory $(jq -r .memory <<<"$req") >= kv.memory_bytes ($mem) + 512MiB" \
		ge "$(qty "$(jq -r .memory <<<"$req")")" "$mem" $((512 << 20))

	# drain before SIGTERM
	local grace drain rel pre wait
	grace=$(jq -r .terminationGracePeriodSeconds <<<"$spec")
	drain=$(resolved "$T/$role.resolved" node drain_timeout_ms)
	rel=$(resolved "$T/$role.resolved" transfer release_timeout_ms)
	pre=$(jq -c .lifecycle.preStop.exec.command <<<"$c")
	wait=$(jq -r 'index("--wait-ms") as $i | .[$i + 1]' <<<"$pre")
	check "$role: preStop is kvctl drain on admin.socket ($pre)" \
		jqe --arg s "$sock" '.[0] == "/usr/local/bin/kvctl" and .[1] == "--socket" and .[2] == $s and .[3] == "drain"' <<<"$pre"
	check "$role: the drain waits drain_timeout_ms ($drain) + 2 x release_timeout_ms ($rel): $wait" \
		ge "$wait" "$drain" "$rel" "$rel"
	check "$role: terminationGracePeriodSeconds ($grace s) > the drain's wait" \
		ge "$((grace * 1000))" "$wait" 1

	# selectors
	local labels
	labels=$(jq -c .spec.template.metadata.labels <<<"$w")
	check "$role: the workload's selector matches its pods" \
		jqe --argjson l "$labels" '.spec.selector.matchLabels | to_entries | all($l[.key] == .value)' <<<"$w"
	check "$role: its PodDisruptionBudget selects them" \
		jqe --argjson l "$labels" '.spec.selector.matchLabels | to_entries | all($l[.key] == .value)' <<<"$(obj PodDisruptionBudget "$name")"
	check "$role: its Service selects them" \
		jqe --argjson l "$labels" '.spec.selector | to_entries | all($l[.key] == .value)' <<<"$(obj Service "$name")"
	SERVICE_PORTS=$(obj Service "$name" | jq -c '.spec.ports')
	CONTAINER_PORTS=$ports
}

role_checks prefill StatefulSet kvd-prefill
check "prefill: the StatefulSet's serviceName is the headless Service" \
	test "$(obj StatefulSet kvd-prefill | jq -r .spec.serviceName)" = kvd-prefill
check "prefill: the headless Service's port peer leads to listen.peer ($PREFILL_PEER_PORT)" \
	jqe --argjson cp "$CONTAINER_PORTS" --arg p "$PREFILL_PEER_PORT" \
	'.[] | select(.name == "peer") | (.port | tostring) == $p and $cp[.targetPort] == ($p | tonumber)' <<<"$SERVICE_PORTS"
role_checks decode Deployment kvd-decode
check "decode: peers.prefill ($DECODE_PEERS) names the headless Service and its peer port" \
	test "$DECODE_PEERS" = "kvd-prefill:$PREFILL_PEER_PORT"
check "decode: its Service's port http leads to listen.http ($DECODE_HTTP)" \
	jqe --argjson cp "$CONTAINER_PORTS" --arg p "$DECODE_HTTP" \
	'.[] | select(.name == "http") | $cp[.targetPort] == ($p | tonumber)' <<<"$SERVICE_PORTS"
finish
