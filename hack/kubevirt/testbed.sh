#!/usr/bin/env bash
# Real KubeVirt v1.7.0 (virt-operator, -api, -controller, -handler,
# -launcher; QEMU under TCG: useEmulation) on the project's one-node cluster
# (hack/cluster/cluster.sh), with vhostmq's network binding registered.
#
# Usage: hack/kubevirt/testbed.sh up [--nodes 2]|down|status
#   up      build.sh and images.sh (no-ops when cached), the project's
#           binaries (make build) and multus-lite; cluster.sh up with
#           multus-lite as the node's CNI (a Multus stand-in: Multus is not
#           served by the module proxy) and vhostmq-cni beside it; then
#           kube-proxy, the test-bed fixes, virt-operator, the KubeVirt CR
#           (useEmulation, the vhostmq binding of
#           deploy/examples/kubevirt-binding.yaml with the sidecar image
#           localhost/vhostmq/kubevirt-binding:dev made from
#           bin/vhostmq-kubevirt-binding by hack/cluster/images.sh); waits
#           until KubeVirt is Available.  A cluster that is already up is
#           used only if this script started it (same CNI folder).
#           --nodes 2: a second node as well (cluster.sh add-node) with its
#           own multus-lite configuration and kube-proxy: virt-handler and
#           the vhostmq DaemonSet run on both, a VM can migrate between them
#   down    stop kube-proxy (by PID), cluster.sh down (if up started the
#           cluster), unmount and remove the host folders KubeVirt made, set
#           / back to private if up made it shared
#   status  the cluster, kube-proxy, KubeVirt's phase and pods
#
# What the bare node lacks for KubeVirt and what up adds (the fixes of
# /work/shared/reference/kubevirt/REPORT.md, none patches KubeVirt):
#   * kube-proxy (pods reach the API server and virt-api's webhooks through
#     Service IPs): v1.37.2 from build.sh, iptables mode, in the node's netns,
#     by PID, bounded by the cluster's lifetime;
#   * a route for the Service range in the netns (it has no default route;
#     a locally sent packet needs one before kube-proxy's OUTPUT DNAT);
#   * (none now: cluster.sh's API server has a front proxy, and publishes
#     its CA in kube-system/extension-apiserver-authentication, which
#     virt-api needs to start and to trust the aggregated requests of
#     virtctl console; up waits until it is there);
#   * mount --make-shared / (virt-handler's Bidirectional /var/run/kubevirt:
#     containerd 1.6 checks the mount holding the path as written, i.e. /);
#   * the node label node-role.kubernetes.io/control-plane (operator
#     placement);
#   * kvm64 taken off KubeVirt's obsolete CPU models (obsoleteCPUModels:
#     its default list without kvm64 and kvm64-v1): virt-handler's node
#     labeller asks libvirt for KVM's capabilities whenever /dev/kvm exists,
#     and on machines whose /dev/kvm cannot run guests (this kind) KVM's
#     host-model is kvm64 and no named model is usable. KubeVirt's default
#     list counts kvm64 obsolete, so no node is labelled
#     cpu-model-migration.node.kubevirt.io/kvm64 and a VM (host-model, run
#     by TCG) cannot migrate ("no node is suitable to run the required CPU
#     model"); up waits until every node carries that label for its
#     host-model;
#   * in the images (images.sh): the virtqemud shim, the virt-handler
#     /proc/1 shim, the file capability of virt-launcher-monitor.
#
# Environment: VHOSTMQ_KUBEVIRT_* (lib.sh), VHOSTMQ_CLUSTER_* (cluster.sh;
#   VHOSTMQ_CLUSTER_LIFETIME defaults to 7200 here), VHOSTMQ_KUBEVIRT_TIMEOUT=900
#   (seconds to wait for KubeVirt Available), VHOSTMQ_TEST_BIN_DIR (static
#   vhostmq-* binaries and multus-lite instead of make build)
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$HERE/lib.sh"
VMQ_TAG=kubevirt-testbed
CLUSTER=$HERE/../cluster/cluster.sh
export VHOSTMQ_CLUSTER_LIFETIME=${VHOSTMQ_CLUSTER_LIFETIME:-7200}
KV_TIMEOUT=${VHOSTMQ_KUBEVIRT_TIMEOUT:-900}
CNI_DIR=$VMKV_RUN/cni
BIN_DIR=$VMKV_RUN/bin           # the project's binaries this test bed uses
MLOG=$VMQC_LOGS/multus-lite.log
KP_LOG=$VMQC_LOGS/kube-proxy.log
SIDECAR_IMAGE=localhost/vhostmq/kubevirt-binding:dev
# host folders KubeVirt's hostPath volumes create; down removes those that
# were not there before up
KV_HOST_DIRS=(/run/kubevirt /run/kubevirt-private /run/kubevirt-libvirt-runtimes /var/lib/kubevirt-node-labeller
    /run/kubevirt-hooks)

k() { vmqc_kubectl "$@"; }

# ------------------------------------------------------------------ binaries
# project_bins: bin/ by `make build` (CGO_ENABLED=0, static) and multus-lite,
# copied to $BIN_DIR (what the node runs stays put while bin/ is rebuilt)
project_bins() {
    local b src=${VHOSTMQ_TEST_BIN_DIR:-}
    mkdir -p "$BIN_DIR"
    if [[ -z $src ]]; then
        vmq_log "make build (bin/) and multus-lite"
        make -s -C "$VMQ_REPO_ROOT" build >/dev/null || vmq_die "make build failed"
        (cd "$VMQ_REPO_ROOT" && CGO_ENABLED=0 timeout 900 go build -trimpath -o "$BIN_DIR/multus-lite" ./hack/cluster/multus-lite) ||
            vmq_die "building hack/cluster/multus-lite failed"
        src=$VMQ_REPO_ROOT/bin
    else
        cp "$src/multus-lite" "$BIN_DIR/multus-lite"
    fi
    for b in vhostmq-dataplane vhostmq-deviceplugin vhostmqctl vhostmq-cni vhostmq-install-cni vhostmq-kubevirt-binding vhostmq-kubevirt-register vhostmq-webhook; do
        [[ -x $src/$b ]] || vmq_die "$src/$b missing"
        cp "$src/$b" "$BIN_DIR/.$b.new"
        mv -f "$BIN_DIR/.$b.new" "$BIN_DIR/$b"
    done
    for b in "$BIN_DIR"/*; do vmqc_check_static "$b"; done
}

# install_cni: the CNI binaries the node runs (the node's CNI bin folder
# links here), replaced atomically
install_cni() {
    local b
    mkdir -p "$CNI_DIR/bin" "$CNI_DIR/state"
    for b in multus-lite vhostmq-cni; do
        cp "$BIN_DIR/$b" "$CNI_DIR/bin/.$b.new"
        mv -f "$CNI_DIR/bin/.$b.new" "$CNI_DIR/bin/$b"
    done
}

ours() { # the cluster that is up runs multus-lite from our CNI folder
    grep -qs "\"clusterNetwork\": \"$CNI_DIR/default.conflist\"" "$VMQC_RUN/cni/net.d/00-multus-lite.conflist"
}

cluster_up() {
    if vmqc_is_up; then
        ours || vmq_die "the cluster that is up was not started by $0 (its CNI is not multus-lite from $CNI_DIR); take it down first ($CLUSTER down)"
        vmq_log "using the cluster that is up"
        install_cni
        return 0
    fi
    install_cni
    # the default network multus-lite delegates to: what cluster.sh writes
    # when it is not given a conflist
    vmqc_multus_lite_conflists "$CNI_DIR" "$MLOG"
    touch "$VMKV_RUN/cluster-started"
    VHOSTMQ_CLUSTER_CNI_CONFLIST=$CNI_DIR/00-multus-lite.conflist \
        VHOSTMQ_CLUSTER_CNI_PLUGINS="$CNI_DIR/bin/multus-lite $CNI_DIR/bin/vhostmq-cni" "$CLUSTER" up 8<&-
}

# ------------------------------------------------------------------ kube-proxy
# kube-proxy runs on every node: NODE is 1 (the default) or 2
kp_pidfile() { [[ ${1:-1} == 1 ]] && echo "$VMKV_RUN/kube-proxy.pid" || echo "$VMKV_RUN/kube-proxy-$1.pid"; }
kp_alive() { # NODE: the recorded PID still runs our kube-proxy (a recycled PID is not)
    local p
    p=$(cat "$(kp_pidfile "${1:-1}")" 2>/dev/null || true)
    [[ -n $p && $(readlink -f "/proc/$p/exe" 2>/dev/null) == "$(readlink -f "$VMKV_KUBE_PROXY")" ]]
}
start_kube_proxy() { # [NODE]
    local node=${1:-1} enter kubeconfig name cidr log
    kp_alive "$node" && return 0
    if ((node == 1)); then
        enter=(nsenter --net="/run/netns/$VMQC_NETNS") kubeconfig=$VMQC_KUBECONFIG name=$VMQC_NODE cidr=$VMQC_POD_CIDR log=$KP_LOG
    else
        enter=(nsenter --net="/run/netns/$VMQC_NETNS2" --mount="$VMQC_N2_MNT")
        kubeconfig=$VMQC_N2_DATA/kubeconfig name=$VMQC_NODE2 cidr=$VMQC_POD_CIDR2 log=$VMQC_LOGS/kube-proxy-node2.log
    fi
    # no timeout(1) wrapper: the PID must be kube-proxy itself; it is stopped
    # by down, and the cluster's watchdog (down after its lifetime) takes the
    # netns away under it
    setsid "${enter[@]}" -- "$VMKV_KUBE_PROXY" \
        --kubeconfig "$kubeconfig" --hostname-override "$name" \
        --proxy-mode iptables --cluster-cidr "$cidr" --conntrack-max-per-core 0 \
        --healthz-bind-address 127.0.0.1:10256 --metrics-bind-address 127.0.0.1:10249 \
        >>"$log" 2>&1 </dev/null 8<&- 9<&- &
    echo $! >"$(kp_pidfile "$node")"
    vmqc_poll 60 0.5 "${enter[@]}" -- curl -fs http://127.0.0.1:10256/healthz >/dev/null ||
        { tail -n 20 "$log" >&2; vmq_die "kube-proxy on $name is not healthy (log $log)"; }
    vmq_log "kube-proxy up on $name (pid $(cat "$(kp_pidfile "$node")"), log $log)"
}
stop_kube_proxy() { # on every node
    local node p i
    for node in 1 2; do
        p=$(cat "$(kp_pidfile "$node")" 2>/dev/null || true)
        if kp_alive "$node"; then
            kill -TERM "$p" 2>/dev/null || true
            for ((i = 0; i < 50; i++)); do kp_alive "$node" || break; sleep 0.1; done
            kp_alive "$node" && kill -KILL "$p" 2>/dev/null
            vmq_log "stopped kube-proxy of node $node (pid $p)"
        fi
        rm -f "$(kp_pidfile "$node")"
    done
}

# ------------------------------------------------------------------ second node
# add_node2: cluster.sh add-node with multus-lite as its CNI (its own
# state, log, pod range, and the API server's address as that node sees
# it), kube-proxy in its netns, vhostmq-cni beside multus-lite
add_node2() {
    if vmqc_has_node2; then
        vmq_log "the second node is up"
    else
        vmqc_multus_lite_conflists "$CNI_DIR/node2" "$VMQC_LOGS/multus-lite-node2.log" "$VMQC_N2_DATA/kubeconfig" "$VMQC_POD_CIDR2"
        VHOSTMQ_CLUSTER_CNI_CONFLIST2=$CNI_DIR/node2/00-multus-lite.conflist \
            VHOSTMQ_CLUSTER_CNI_PLUGINS="$CNI_DIR/bin/multus-lite $CNI_DIR/bin/vhostmq-cni" "$CLUSTER" add-node 8<&-
    fi
    start_kube_proxy 2
}

# ------------------------------------------------------------------ KubeVirt
# the operator's manifests from the module (manifests/generated), as
# KubeVirt's release kubevirt-operator.yaml is made from them
kubevirt_manifests() {
    local src
    src=$(vmkv_src)
    cat <<EOF
apiVersion: v1
kind: Namespace
metadata:
  name: kubevirt
  labels: {kubevirt.io: "", pod-security.kubernetes.io/enforce: privileged}
---
EOF
    cat "$src/manifests/generated/kv-resource.yaml"
    cat <<EOF
---
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: kubevirt-cluster-critical}
value: 1000000000
globalDefault: false
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: kubevirt.io:operator
  labels: {operator.kubevirt.io: "", rbac.authorization.k8s.io/aggregate-to-admin: "true"}
rules:
- apiGroups: [kubevirt.io]
  resources: [kubevirts]
  verbs: [get, delete, create, update, patch, list, watch, deletecollection]
---
EOF
    sed 's/{{.Namespace}}/kubevirt/g' "$src/manifests/generated/rbac-operator.authorization.k8s.yaml.in"
    # the Deployment as virt-operator's NewOperatorDeployment writes it, one
    # replica, the component images named by environment
    cat <<EOF
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: virt-operator, namespace: kubevirt, labels: {kubevirt.io: virt-operator}}
spec:
  replicas: 1
  selector: {matchLabels: {kubevirt.io: virt-operator}}
  template:
    metadata:
      labels: {kubevirt.io: virt-operator, app.kubernetes.io/name: virt-operator, prometheus.kubevirt.io: "true"}
    spec:
      priorityClassName: kubevirt-cluster-critical
      serviceAccountName: kubevirt-operator
      securityContext: {runAsNonRoot: true, seccompProfile: {type: RuntimeDefault}}
      containers:
      - name: virt-operator
        image: $VMKV_REG/virt-operator:$VMKV_TAG
        imagePullPolicy: IfNotPresent
        command: [virt-operator]
        args: [--port, "8443", -v, "2"]
        ports: [{name: metrics, containerPort: 8443}, {name: webhooks, containerPort: 8444}]
        readinessProbe: {httpGet: {scheme: HTTPS, port: 8443, path: /metrics}, initialDelaySeconds: 5, timeoutSeconds: 10}
        env:
        - {name: VIRT_OPERATOR_IMAGE, value: $VMKV_REG/virt-operator:$VMKV_TAG}
        - {name: VIRT_API_IMAGE, value: $VMKV_REG/virt-api:$VMKV_TAG}
        - {name: VIRT_CONTROLLER_IMAGE, value: $VMKV_REG/virt-controller:$VMKV_TAG}
        - {name: VIRT_HANDLER_IMAGE, value: $VMKV_REG/virt-handler:$VMKV_TAG}
        - {name: VIRT_LAUNCHER_IMAGE, value: $VMKV_REG/virt-launcher:$VMKV_TAG}
        - {name: KUBEVIRT_VERSION, value: $VMKV_TAG}
        resources: {requests: {cpu: 10m, memory: 450Mi}}
        securityContext: {allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}, seccompProfile: {type: RuntimeDefault}}
        volumeMounts:
        - {name: kubevirt-operator-certs, mountPath: /etc/virt-operator/certificates, readOnly: true}
        - {name: profile-data, mountPath: /profile-data}
      volumes:
      - name: kubevirt-operator-certs
        secret: {secretName: kubevirt-operator-certs, optional: true}
      - name: profile-data
        emptyDir: {}
EOF
}

kubevirt_cr() {
    cat <<EOF
apiVersion: kubevirt.io/v1
kind: KubeVirt
metadata: {name: kubevirt, namespace: kubevirt}
spec:
  imagePullPolicy: IfNotPresent
  infra: {replicas: 1}
  configuration:
    developerConfiguration:
      useEmulation: true
    obsoleteCPUModels:
$(for m in 486 pentium pentium2 pentium3 pentiumpro coreduo n270 core2duo Conroe athlon phenom qemu64 qemu32 kvm32 Opteron_G1 Opteron_G2; do
        printf '      %s: true\n      %s-v1: true\n' "$m" "$m"
    done)
EOF
}

# nodes_migratable: every node is labelled a migration target for its own
# host-model (virt-handler's node labeller)
nodes_migratable() {
    k get nodes -o json | jq -e '.items | length > 0 and all(.metadata.labels as $l
        | [$l | keys[] | select(startswith("host-model-cpu.node.kubevirt.io/")) | ltrimstr("host-model-cpu.node.kubevirt.io/")]
        | length == 1 and $l["cpu-model-migration.node.kubevirt.io/" + .[0]] == "true")' >/dev/null
}

# front_proxy_published: the API server has published its front proxy's CA
front_proxy_published() {
    [[ -n $(k -n kube-system get cm extension-apiserver-authentication -o jsonpath='{.data.requestheader-client-ca-file}' 2>/dev/null) ]]
}

# the test-bed fixes (see the header)
apply_fixes() {
    if ! awk '$5 == "/" { print $7 }' /proc/self/mountinfo | grep -q shared; then
        mount --make-shared / && touch "$VMKV_RUN/root-made-shared"
    fi
    ip -n "$VMQC_NETNS" route replace "$VMQC_SERVICE_CIDR" dev node0
    vmq_poll 60 1 front_proxy_published ||
        vmq_die "kube-system/extension-apiserver-authentication has no requestheader-client-ca-file after 60 s (the API server's front proxy: hack/cluster/cluster.sh)"
    k label node "$VMQC_NODE" node-role.kubernetes.io/control-plane= --overwrite >/dev/null
}

kv_available() { k -n kubevirt wait kv/kubevirt --for condition=Available --timeout 5s >/dev/null 2>&1; }

cmd_up() {
    local t0 t d nodes=1
    case ${1:-} in
        --nodes) nodes=${2:-}; [[ $nodes == 1 || $nodes == 2 ]] || vmq_die "--nodes: 1 or 2" ;;
        "") ;;
        *) vmq_die "up: unknown argument $1" ;;
    esac
    vmq_need_root
    t0=$(vmq_now)
    "$HERE/build.sh"
    "$HERE/images.sh"
    T_PREP=$(vmqc_secs "$t0")
    vmkv_lock testbed 600
    mkdir -p "$VMKV_RUN"
    project_bins
    if [[ ! -f $VMKV_RUN/preexisting-dirs ]]; then
        for d in "${KV_HOST_DIRS[@]}"; do [[ -e $d ]] && echo "$d"; done >"$VMKV_RUN/preexisting-dirs"
    fi
    t=$(vmq_now)
    cluster_up
    ((nodes == 1)) || add_node2
    T_CLUSTER=$(vmqc_secs "$t")
    t=$(vmq_now)
    vmqc_import "$VMKV_IMAGE_TAR" "$VMKV_GUEST_TAR"
    "$VMKV_DIR/../cluster/images.sh" kubevirt-binding="$BIN_DIR/vhostmq-kubevirt-binding"
    T_IMPORT=$(vmqc_secs "$t")
    t=$(vmq_now)
    start_kube_proxy
    apply_fixes
    kubevirt_manifests | k apply --server-side --force-conflicts -f - >/dev/null
    vmqc_poll 300 2 k -n kubevirt rollout status deploy/virt-operator --timeout 5s >/dev/null 2>&1 ||
        { k -n kubevirt get pods -o wide >&2; vmq_die "virt-operator is not ready"; }
    T_OPERATOR=$(vmqc_secs "$t")
    vmq_log "virt-operator ready after $T_OPERATOR s"
    kubevirt_cr | k apply -f - >/dev/null
    # our binding, as deploy/examples/kubevirt-binding.yaml registers it
    sed "s#sidecarImage: .*#sidecarImage: $SIDECAR_IMAGE#" "$VMQ_REPO_ROOT/deploy/examples/kubevirt-binding.yaml" >"$VMKV_RUN/kubevirt-binding.yaml"
    k -n kubevirt patch kubevirt kubevirt --type merge --patch-file "$VMKV_RUN/kubevirt-binding.yaml" >/dev/null
    if ! vmqc_poll "$KV_TIMEOUT" 2 kv_available; then
        k -n kubevirt get kv,pods -o wide >&2 || true
        vmq_die "KubeVirt not Available after $KV_TIMEOUT s"
    fi
    if ! vmqc_poll 180 2 nodes_migratable; then
        k get nodes -o json | jq -r '.items[] | "\(.metadata.name): host-model \([.metadata.labels | keys[] | select(startswith("host-model-cpu.node.kubevirt.io/")) | ltrimstr("host-model-cpu.node.kubevirt.io/")] | join(" ")), obsolete-host-model \(.metadata.labels["node-labeller.kubevirt.io/obsolete-host-model"] // "-")"' >&2 || true
        vmq_die "not every node is labelled a migration target for its host-model CPU (cpu-model-migration.node.kubevirt.io/<host-model>): see virt-handler's node labeller"
    fi
    vmq_log "every node is a migration target for its host-model CPU ($(k get nodes -o json | jq -r '[.items[].metadata.labels | keys[] | select(startswith("host-model-cpu.node.kubevirt.io/")) | ltrimstr("host-model-cpu.node.kubevirt.io/")] | unique | join(" ")'))"
    T_KV=$(vmqc_secs "$t")
    echo "prep=$T_PREP cluster=$T_CLUSTER import=$T_IMPORT operator=$T_OPERATOR kubevirt_available=$T_KV total=$(vmqc_secs "$t0")" >"$VMKV_RUN/timings"
    vmq_log "KubeVirt $KV_VERSION Available ($(cat "$VMKV_RUN/timings"))"
    k -n kubevirt get pods -o wide >&2
    echo "testbed up: build+images ${T_PREP}s, cluster ${T_CLUSTER}s, image import ${T_IMPORT}s, virt-operator ${T_OPERATOR}s, KubeVirt Available ${T_KV}s; total $(vmqc_secs "$t0")s"
}

cmd_down() {
    local d m
    vmq_need_root
    vmkv_lock testbed 600
    set +e
    vmkv_stop_webhook
    stop_kube_proxy
    # only a cluster up started (a half-started one of somebody else's
    # cluster.sh up is not ours to take down)
    if [[ -f $VMKV_RUN/cluster-started ]] || { vmqc_is_up && ours; }; then
        "$CLUSTER" down 8<&-
    elif vmqc_is_up; then
        vmq_log "the cluster that is up is not ours; leaving it"
    fi
    # what virt-handler mounted under its host folders (Bidirectional), deepest first
    for d in "${KV_HOST_DIRS[@]}"; do
        awk '{ print $5 }' /proc/self/mountinfo | grep -E "^$d(/|\$)" | sort -r |
            while read -r m; do umount "$m" 2>/dev/null || umount -l "$m"; done
    done
    for d in "${KV_HOST_DIRS[@]}"; do
        [[ -e $d ]] || continue
        grep -qxF "$d" "$VMKV_RUN/preexisting-dirs" 2>/dev/null && continue
        rm -rf "$d"
    done
    if [[ -f $VMKV_RUN/root-made-shared ]]; then
        mount --make-private / && rm -f "$VMKV_RUN/root-made-shared"
    fi
    rm -rf "$VMKV_RUN"
    vmq_log "test bed is down"
    return 0
}

cmd_status() {
    local rc=0
    "$CLUSTER" status || rc=1
    if kp_alive 1; then echo "kube-proxy: pid $(cat "$(kp_pidfile 1)") running"; else echo "kube-proxy: not running"; rc=1; fi
    if vmqc_has_node2; then
        if kp_alive 2; then echo "kube-proxy of $VMQC_NODE2: pid $(cat "$(kp_pidfile 2)") running"; else echo "kube-proxy of $VMQC_NODE2: not running"; rc=1; fi
    fi
    [[ -f $VMKV_RUN/timings ]] && echo "bring-up timings: $(cat "$VMKV_RUN/timings")"
    if vmqc_is_up; then
        echo "KubeVirt: $(k -n kubevirt get kv kubevirt -o jsonpath='{.status.phase}' 2>/dev/null || echo absent)"
        kv_available || rc=1
        k -n kubevirt get pods -o wide 2>/dev/null || true
        k get vm,vmi -A 2>/dev/null || true
    fi
    return "$rc"
}

case ${1:-} in
    up) shift; cmd_up "$@" ;;
    down) cmd_down ;;
    status) cmd_status ;;
    -h | --help | help) vmq_usage "$0" ;;
    *) vmq_usage "$0" >&2; exit 2 ;;
esac
