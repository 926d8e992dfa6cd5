#!/usr/bin/env bash
# Queue pairs through Dynamic Resource Allocation on the real one-node
# cluster (hack/cluster/cluster.sh: Kubernetes v1.37, containerd 2 with CDI),
# beside the device plugin, the way a user installs it: the Helm chart with
# dra.enabled and devicePlugin.enabled, the CNI called by multus-lite (the
# Multus stand-in of test-cni.sh).
#
# Feature gates: none. What this uses is on by default in v1.37:
# DynamicResourceAllocation (GA 1.34), DRAResourceClaimDeviceStatus (GA
# 1.37), DRAResourceClaimGranularStatusAuthorization (beta 1.36). The device
# metadata file (KEP-5304) is the driver's (kubeletplugin), needing no gate.
#
# Each check printed as ok/FAIL with its time:
#   (a) helm install: the DaemonSet (dataplane, device plugin, DRA driver)
#       Ready; the DeviceClass; a ResourceSlice of 8 devices; allocatable 8
#       Least exposure, asked of this API server: the CNI's host token is
#       a 10-minute token of vhostmq-cni, which may get pods, NADs and VMIs
#       and not list, watch or write (kubectl auth can-i, and the host
#       kubeconfig itself); the node pod's account reads no pods and mints
#       only that token; the webhook has 2 ready replicas and a
#       PodDisruptionBudget (minAvailable 1), and sees only pods naming a
#       vhostmq NAD it knows (a server dry run of each); metrics on (the
#       tap uplink: host network) answer on 127.0.0.1 only, not on the
#       node's addresses nor from the LAN host behind the tap's bridge
#   (b) a device-plugin pod dp-c (2 queue pairs) Running: the agent holds its
#       slots for its allocation, and the slice drops them (6 devices)
#   (c) pods dra-a and dra-b with ResourceClaimTemplates of 4 and 2 queue
#       pairs on the NAD vhu-dra (no resourceName: the CNI finds the claim)
#       Running; each one's port has exactly its claim's allocated devices
#       as slots; the claim's status.devices say Ready with the socket; the
#       device-plugin side shrinks (allocatable 2); no slot is held twice
#       (from the agent)
#   (d) in each pod QEMU reads the socket from the claim's metadata file
#       (/var/run/kubernetes.io/dra-device-attributes/...) and the queue
#       count from VHOSTMQ_QUEUE_SLOTS (CDI env); the guests report 4 and 2
#       queues and ping each other
#       The chart runs the tap uplink (uplink.mode=tap on a bridge in the
#       node's netns that holds the node's address on a LAN, 10.0.1.254/24,
#       with another host on it, a netns at 10.0.1.100): that host and the
#       node reach both guests through it
#   (e) a claim for one more slot (dra-x) and a device-plugin pod for one
#       more (dp-y) stay Pending with the scheduler's reasons
#   (f) the DRA driver's container restarted, then the kubelet restarted:
#       the claims stay prepared (same reservations, pods Running, guests
#       still pinging, slice unchanged)
#   (g) dra-b deleted: its claim is unprepared (reservation, socket
#       directory, CDI spec and metadata gone); dp-y deleted, dra-x then
#       runs on the freed capacity with its one slot
#   (h) everything deleted: 8 devices in the slice, allocatable 8, no
#       reservation, nothing left in /var/run/vhostmq but api.sock, no CDI
#       spec of ours
#   (i) create -> Running of a busybox pod asking 2 queue pairs, through
#       the device plugin and through a claim, interleaved rounds
#   (j) helm upgrade to dra.devices=numa: one device per NUMA node whose
#       consumable capacity queuePairs claims share; (c), (e) and (i) again
# Ends with claim-to-Running times beside the device-plugin pod's and
# "N passed, N failed"; exits non-zero if anything failed.
#
# Usage: hack/cluster/test-dra.sh [--keep]
# Environment: VHOSTMQ_TEST_BIN_DIR (as test-cni.sh), VHOSTMQ_TEST_DRA_DIR
# (default /run/vhostmq-test-dra), VHOSTMQ_TEST_GUEST_TIMEOUT=150,
# VHOSTMQ_DRA_ROUNDS=3 (the timing rounds of (i) and (j))
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$HERE/lib.sh"
VMQ_TAG=test-dra

KEEP=0
case ${1:-} in
    --keep) KEEP=1 ;;
    "") ;;
    -h | --help) vmq_usage "$0"; exit 0 ;;
    *) vmq_die "unknown argument $1 (see --help)" ;;
esac
RES=vhostmq.io/queue-pairs
DRIVER=queues.vhostmq.io
NS=vhostmq-system
SOCK_DIR=/var/run/vhostmq
API_SOCK=/run/vhostmq/api.sock
TDIR=${VHOSTMQ_TEST_DRA_DIR:-/run/vhostmq-test-dra}
GUEST_TIMEOUT=${VHOSTMQ_TEST_GUEST_TIMEOUT:-150}
MLOG=$VMQC_LOGS/multus-lite-dra.log
HELM=${VHOSTMQ_TOOLS:-/var/cache/vhostmq/tools}/helm-v3.22.0
RELEASE=vhostmq
declare -A MACS=([dra-a]=52:54:00:d4:a0:0a [dra-b]=52:54:00:d4:a0:0b)
# the node's network for the tap uplink: a bridge in the node's netns with
# the node's address on it, and one more host (a netns on a veth)
LAN_BR=vmq-lan LAN_NS=vhostmq-test-lan LAN_NODE_IP=10.0.1.254 LAN_HOST_IP=10.0.1.100
declare -A T_RUN=() SLOTS=() CLAIM=()
passed=0 failed=0 we_started=0 t_test=$(vmq_now)
work=$(mktemp -d)

k() { vmqc_kubectl "$@"; }
h() { vmqc_in_ns env HELM_CACHE_HOME="$VMQC_RUN/helm/cache" HELM_CONFIG_HOME="$VMQC_RUN/helm/config" \
    HELM_DATA_HOME="$VMQC_RUN/helm/data" "$HELM" --kubeconfig "$VMQC_KUBECONFIG" "$@"; }
ctl() { timeout 20 "$bins/vhostmqctl" --socket "$API_SOCK" "$@"; }
# shellcheck source-path=SCRIPTDIR source=checks.sh
source "$HERE/checks.sh"

delete_ours() {
    k delete pod -l app=vhostmq-dra-test --ignore-not-found --grace-period 5 --wait=true --timeout 90s >/dev/null 2>&1 || true
    k delete resourceclaimtemplates.resource.k8s.io qp4 qp2 qp1 --ignore-not-found >/dev/null 2>&1 || true
    k delete network-attachment-definitions.k8s.cni.cncf.io vhu-dra --ignore-not-found >/dev/null 2>&1 || true
}

diagnostics() {
    local f=$VMQC_LOGS/test-dra-diagnostics.txt
    {
        echo "=== pods"; k get pods -A -o wide
        echo "=== events"; k get events -A --sort-by .lastTimestamp | tail -n 50
        echo "=== claims"; k get resourceclaims -A -o yaml
        echo "=== slices"; k get resourceslices -o yaml
        echo "=== capacity"; ctl -o json capacity
        echo "=== ports"; ctl -o wide port list
        echo "=== multus-lite log"; tail -n 40 "$MLOG"
        for c in dataplane deviceplugin dra; do echo "=== $c log"; k -n "$NS" logs ds/$RELEASE -c "$c" --tail 60; done
        for p in dra-a dra-b; do echo "=== $p log"; k logs "$p" --tail 20; echo "=== $p serial"; tail -n 25 "$TDIR/guests/serial-$p.log"; done
        echo "=== kubelet DRA lines"; grep -iE 'dra|claim' "$VMQC_LOGS/kubelet.log" | tail -n 40 | cut -c1-400
        echo "=== folders"; find "$SOCK_DIR" "$VMQC_CDI_DIR" -maxdepth 2 -ls
    } >"$f" 2>&1
    echo "diagnostics: $f"
}

# lan_up: the LAN the tap uplink joins (the bridge the chart's
# uplink.tap.attach names must exist before the node pod starts)
lan_up() {
    lan_down
    ip -n "$VMQC_NETNS" link add "$LAN_BR" type bridge &&
        ip -n "$VMQC_NETNS" addr add "$LAN_NODE_IP/24" dev "$LAN_BR" &&
        ip -n "$VMQC_NETNS" link set "$LAN_BR" up &&
        ip netns add "$LAN_NS" &&
        ip -n "$VMQC_NETNS" link add vmq-lan-h type veth peer name lan0 netns "$LAN_NS" &&
        ip -n "$VMQC_NETNS" link set vmq-lan-h master "$LAN_BR" up &&
        ip -n "$LAN_NS" addr add "$LAN_HOST_IP/24" dev lan0 &&
        ip -n "$LAN_NS" link set lan0 up && ip -n "$LAN_NS" link set lo up
}
lan_down() {
    ip netns del "$LAN_NS" 2>/dev/null
    ip -n "$VMQC_NETNS" link del "$LAN_BR" 2>/dev/null
    return 0
}

cleanup() {
    local rc=$?
    set +e
    if ((failed > 0 || rc != 0)) && vmqc_is_up; then diagnostics; fi
    ((KEEP)) || ip netns del "$LAN_NS" 2>/dev/null
    if ((KEEP)); then
        vmq_log "--keep: leaving the cluster and the release up"
    elif ((we_started)); then
        "$HERE/cluster.sh" down
        rm -rf "$TDIR"
    elif vmqc_is_up; then
        delete_ours
        h uninstall "$RELEASE" --namespace "$NS" --wait --timeout 2m >/dev/null 2>&1
        lan_down
    fi
    rm -rf "$work"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ------------------------------------------------------------------ binaries
vmq_need_root
for c in qemu-system-x86_64 jq busybox; do command -v "$c" >/dev/null || vmq_die "$c missing: run hack/install-deps.sh"; done
[[ -x $HELM ]] || "$HERE/../manifests.sh" >/dev/null
bins=$work/bin
mkdir -p "$bins"
if [[ -n ${VHOSTMQ_TEST_BIN_DIR:-} ]]; then
    cp "$VHOSTMQ_TEST_BIN_DIR"/vhostmq* "$VHOSTMQ_TEST_BIN_DIR"/multus-lite "$bins/"
else
    (cd "$VMQ_REPO_ROOT" && CGO_ENABLED=0 timeout 900 go build -trimpath -o "$bins/" ./cmd/... ./hack/cluster/multus-lite) ||
        vmq_die "go build failed"
fi
IMAGE_BINS=()
for b in vhostmq-dataplane vhostmq-deviceplugin vhostmq-dra vhostmqctl vhostmq-cni vhostmq-install-cni vhostmq-webhook multus-lite; do
    [[ -x $bins/$b ]] || vmq_die "$b was not built"
    vmqc_check_static "$bins/$b"
    [[ $b == multus-lite ]] || IMAGE_BINS+=("$bins/$b")
done
vmq_build_guest
vmq_guest_env
[[ -n ${GUEST_VMLINUX:-} && -f $GUEST_VMLINUX ]] || vmq_die "the guest image has no vmlinux (hack/guest/build.sh)"

# ------------------------------------------------------------------ cluster
if vmqc_is_up; then
    vmq_log "using the cluster that is up"
    grep -qs "\"clusterNetwork\": \"$TDIR/default.conflist\"" "$VMQC_RUN/cni/net.d/00-multus-lite.conflist" ||
        vmq_die "the cluster that is up does not run multus-lite from $TDIR; take it down ($HERE/cluster.sh down) and run this test again"
else
    rm -rf "$TDIR"
    mkdir -p "$TDIR/bin" "$TDIR/guests"
    cp "$bins/multus-lite" "$TDIR/bin/"
    vmqc_multus_lite_conflists "$TDIR" "$MLOG"
    we_started=1
    # the chart's install-cni puts vhostmq-cni into the node's CNI folder
    VHOSTMQ_CLUSTER_CNI_CONFLIST=$TDIR/00-multus-lite.conflist \
        VHOSTMQ_CLUSTER_CNI_PLUGINS="$TDIR/bin/multus-lite" "$HERE/cluster.sh" up
fi
BRINGUP=$(cat "$VMQC_RUN/timings")
# The DRA driver is an in-cluster API client (the kubernetes Service); this
# node runs no kube-proxy (test-kubevirt's test bed does): the Service range
# routed into the netns and the kubernetes Service's one endpoint DNATed,
# which is what kube-proxy would do for it. Gone with the netns at down.
svc_ip=$(k get service kubernetes -o jsonpath='{.spec.clusterIP}')
api_ep=$(k get endpointslices -l kubernetes.io/service-name=kubernetes -o json | jq -r '.items[0] | "\(.endpoints[0].addresses[0]):\(.ports[0].port)"')
ip -n "$VMQC_NETNS" route replace "$VMQC_SERVICE_CIDR" dev node0
for chain in OUTPUT PREROUTING; do # host-network and pod-network clients
    vmqc_in_ns iptables -w -t nat -C "$chain" -d "$svc_ip/32" -p tcp --dport 443 -j DNAT --to-destination "$api_ep" 2>/dev/null ||
        vmqc_in_ns iptables -w -t nat -A "$chain" -d "$svc_ip/32" -p tcp --dport 443 -j DNAT --to-destination "$api_ep"
done
echo "--- the kubernetes Service $svc_ip:443 -> $api_ep (iptables DNAT in the node's netns, no kube-proxy)"
echo "--- node: kubelet $("$VMQC_BIN/kubelet" --version | cut -d' ' -f2), containerd $("$VMQC_CTR" -a "$VMQC_CTR_SOCK" version 2>/dev/null | awk '/^Server:/ { s = 1 } s && /Version:/ { print $2; exit }') (CDI specs: $VMQC_CDI_DIR), CNI multus-lite (a Multus stand-in, NOT Multus)"
delete_ours
"$HERE/images.sh" --bundle localhost/vhostmq:dev "${IMAGE_BINS[@]}"
vmqc_ctr images ls -q | grep -x "$VMQC_BUSYBOX_IMAGE" >/dev/null || vmqc_import "$VMQC_IMAGES/busybox.tar"

# ------------------------------------------------------------------ (a)
step "(a) helm install with devicePlugin.enabled, dra.enabled, the tap uplink, the webhook and metrics"
lan_up || vmq_die "making the LAN $LAN_BR / $LAN_NS"
echo "--- the node's network: bridge $LAN_BR in the node's netns with $LAN_NODE_IP/24, host $LAN_HOST_IP (netns $LAN_NS)"
k apply -f "$HERE/manifests/nad-crd.yaml" >/dev/null
k wait --for=condition=Established crd/network-attachment-definitions.k8s.cni.cncf.io --timeout 30s >/dev/null
if h install "$RELEASE" "$VMQ_REPO_ROOT/charts/vhostmq" --namespace "$NS" --create-namespace --wait --timeout 3m \
    --set dra.enabled=true --set devicePlugin.enabled=true --set "dra.cdiDir=$VMQC_CDI_DIR" \
    --set metrics.enabled=true --set "dataplane.cpus={0,1}" \
    --set uplink.mode=tap --set "uplink.tap.attach=$LAN_BR" --set networkAttachmentDefinition.uplink=tap \
    --set "paths.cniBinDir=$VMQC_RUN/cni/bin" --set "paths.cniConfDir=$VMQC_RUN/cni/net.d" >"$work/helm.log" 2>&1; then
    pass "helm install --wait: $(grep -m1 '^STATUS' "$work/helm.log")"
else
    fail "helm install"
    sed 's/^/    /' "$work/helm.log" | tail -n 20
    exit 1
fi
check "(a) the pod runs dataplane, deviceplugin and dra" \
    test "$(k -n "$NS" get pods -l app.kubernetes.io/name=vhostmq -o jsonpath='{.items[0].spec.containers[*].name}' | tr ' ' '\n' | grep -cxE 'dataplane|deviceplugin|dra')" = 3
# the tap uplink needs the host's network namespace and NET_ADMIN, and no more
ds_net=$(k -n "$NS" get ds "$RELEASE" -o json | jq -r '.spec.template.spec as $s | "\($s.hostNetwork) \($s.containers[] | select(.name == "dataplane") | .securityContext.capabilities.add | join(","))"')
check "(a) uplink.mode=tap: the node pod in the host network, the dataplane adding only NET_ADMIN to its own ($ds_net)" \
    test "$ds_net" = "true CHOWN,DAC_OVERRIDE,FOWNER,NET_ADMIN"
tap_on_lan() { ip -n "$VMQC_NETNS" -o link show master "$LAN_BR" | grep -q ' vhostmq0[:@]'; }
check "(a) the dataplane's tap vhostmq0 is a port of $LAN_BR in the node's netns" vmqc_poll 30 0.5 tap_on_lan
has_class() { k get deviceclasses.resource.k8s.io "$DRIVER" -o name >/dev/null; }
check "(a) DeviceClass $DRIVER" has_class
slice() { k get resourceslices -o json | jq -c --arg d "$DRIVER" --arg n "$VMQC_NODE" '[.items[] | select(.spec.driver == $d and .spec.nodeName == $n) | .spec.devices[]]'; }
slice_n() { [[ $(slice | jq length) == "$1" ]]; }
alloc_n() { [[ $(k get --raw "/api/v1/nodes/$VMQC_NODE" | jq -r --arg r "$RES" '.status.allocatable[$r] // 0') == "$1" ]]; }
check "(a) ResourceSlice of $DRIVER on $VMQC_NODE: 8 devices" vmqc_poll 60 0.5 slice_n 8
echo "    devices: $(slice | jq -r '[.[] | "\(.name)(cpu \(.attributes.cpu.int), numa \(.attributes.numaNode.int))"] | join(" ")')"
check "(a) node allocatable $RES = 8" vmqc_poll 60 0.5 alloc_n 8
# the chart's NAD (resourceName: the device plugin's) as DRA pods' NAD: the
# same config without the annotation, so the CNI looks for a claim
k get network-attachment-definitions.k8s.cni.cncf.io -n "$NS" vhu-net -o json |
    jq '{apiVersion, kind, metadata: {name: "vhu-dra", namespace: "default"}, spec: {config: (.spec.config | fromjson | del(.resourceName) | tojson)}}' |
    k apply -f - >/dev/null
check "(a) NAD default/vhu-dra (the chart's vhu-net config without resourceName)" \
    test "$(k get network-attachment-definitions.k8s.cni.cncf.io vhu-dra -o json | jq -r '"\(.metadata.annotations["k8s.v1.cni.cncf.io/resourceName"] // "none") \(.spec.config | fromjson | .type) \(.spec.config | fromjson | has("resourceName"))"')" = "none vhostmq-cni false"

# ------------------------------------------------------------------ (a) exposure
step "(a) least exposure: the CNI's token, the webhook, the metrics"
CNI_SA=system:serviceaccount:$NS:$RELEASE-cni NODE_SA=system:serviceaccount:$NS:$RELEASE-node
can() { # can yes|no VERB RESOURCE [ARGS...]: kubectl auth can-i answers that
    local want=$1
    shift
    [[ $(k auth can-i "$@" 2>/dev/null) == "$want" ]]
}
# can_sar yes|no VERB GROUP RESOURCE USER: a SubjectAccessReview says that
# (kubectl auth can-i needs the resource in discovery: this cluster has no
# KubeVirt CRDs)
can_sar() {
    local want=$1 got
    got=$(k create -o jsonpath='{.status.allowed}' -f - 2>/dev/null <<SAR
apiVersion: authorization.k8s.io/v1
kind: SubjectAccessReview
spec:
  user: $5
  groups: [system:serviceaccounts, "system:serviceaccounts:$NS", system:authenticated]
  resourceAttributes: {verb: $2, group: $3, resource: $4}
SAR
    ) || return 1
    [[ -n $got ]] || return 1
    [[ (${got:-false} == true && $want == yes) || (${got:-false} != true && $want == no) ]]
}
for v in get list watch; do
    want=no
    [[ $v == get ]] && want=yes
    check "(a) the CNI's account: $v pods -A: $want" can "$want" "$v" pods -A --as="$CNI_SA"
    check "(a) the CNI's account: $v network-attachment-definitions -A: $want" \
        can "$want" "$v" network-attachment-definitions.k8s.cni.cncf.io -A --as="$CNI_SA"
    check "(a) the CNI's account: $v virtualmachineinstances -A: $want" \
        can_sar "$want" "$v" kubevirt.io virtualmachineinstances "$CNI_SA"
    check "(a) the CNI's account: $v virtualmachineinstancemigrations -A: $want" \
        can_sar "$want" "$v" kubevirt.io virtualmachineinstancemigrations "$CNI_SA"
done
cni_no_more() {
    can no create pods -A --as="$CNI_SA" && can no get secrets -A --as="$CNI_SA" &&
        can no list resourceslices.resource.k8s.io --as="$CNI_SA"
}
check "(a) the CNI's account: no create pods, no get secrets, no resourceslices" cni_no_more
check "(a) the node pod's account: no get pods (its token is not the host's)" can no get pods -A --as="$NODE_SA"
node_mints_cni_only() {
    can yes create "serviceaccounts/$RELEASE-cni" --subresource=token -n "$NS" --as="$NODE_SA" &&
        can no create "serviceaccounts/$RELEASE-node" --subresource=token -n "$NS" --as="$NODE_SA"
}
check "(a) the node pod's account: creates tokens of $RELEASE-cni only" node_mints_cni_only
# the host file itself: whose token, for how long, and what it can do
host_kc=$VMQC_RUN/cni/net.d/vhostmq.d
jwt_claims() { # FILE: the JWT's payload
    local p
    p=$(cut -d. -f2 <"$1" | tr '_-' '/+')
    while ((${#p} % 4)); do p+='='; done
    base64 -d <<<"$p"
}
claims=$(jwt_claims "$host_kc/token" 2>/dev/null || echo '{}')
echo "    the host token: $(jq -c '{sub, lifetime: (.exp - .iat), pod: (."kubernetes.io".pod.name // null)}' <<<"$claims")"
check "(a) the host token ($host_kc/token) is $RELEASE-cni's, 10 minutes, mode 0600" \
    test "$(jq -r '"\(.sub) \(.exp - .iat)"' <<<"$claims") $(stat -c %a "$host_kc/token")" = "$CNI_SA 600 600"
host_k() {
    vmqc_in_ns env KUBECACHEDIR="$VMQC_RUN/kube-cache" \
        "$VMQC_BIN/kubectl" --kubeconfig "$host_kc/vhostmq.kubeconfig" --request-timeout 20s "$@"
}
node_pod=$(k -n "$NS" get pods -l app.kubernetes.io/component=node -o jsonpath='{.items[0].metadata.name}')
host_gets_pod() { host_k -n "$NS" get pod "$node_pod" -o name >/dev/null; }
check "(a) with the host kubeconfig: get pod $NS/$node_pod works" host_gets_pod
list_refused() {
    local out
    out=$(host_k get pods -A -o name 2>&1) && return 1
    grep -q Forbidden <<<"$out"
}
check "(a) with the host kubeconfig: list pods -A is Forbidden" list_refused
# the webhook: two replicas, a budget, and only pods that can ask for vhostmq
wh_two() { [[ $(k -n "$NS" get deploy "$RELEASE-webhook" -o jsonpath='{.status.readyReplicas}') == 2 ]]; }
check "(a) the webhook Deployment has 2 ready replicas" vmqc_poll 60 1 wh_two
pdb_ok() { [[ $(k -n "$NS" get pdb "$RELEASE-webhook" -o jsonpath='{.spec.minAvailable} {.status.currentHealthy}') == "1 2" ]]; }
check "(a) PodDisruptionBudget $RELEASE-webhook: minAvailable 1, 2 healthy" vmqc_poll 30 1 pdb_ok
# a vhostmq NAD the chart does not know by name: its pods bypass the webhook
k get network-attachment-definitions.k8s.cni.cncf.io -n "$NS" vhu-net -o json |
    jq '{apiVersion, kind, spec, metadata: {name: "vhu-unlisted", namespace: "default",
        annotations: {"k8s.v1.cni.cncf.io/resourceName": .metadata.annotations["k8s.v1.cni.cncf.io/resourceName"]}}}' |
    k apply -f - >/dev/null
dry_pod() { # NETWORKS: a server dry run of a pod naming them: its JSON, or the refusal
    k create --dry-run=server -o json -f - 2>"$work/dry-run.err" <<EOF || cat "$work/dry-run.err"
apiVersion: v1
kind: Pod
metadata: {name: wh-probe, namespace: default, annotations: {k8s.v1.cni.cncf.io/networks: '$1'}}
spec: {containers: [{name: c, image: $VMQC_BUSYBOX_IMAGE}]}
EOF
}
# asked: mutated (the API server reaches the webhook) or refused by
# failurePolicy Fail (it does not: this node runs no kube-proxy)
asked=$(dry_pod "$NS/vhu-net")
went_to_webhook() {
    jq -e '.metadata.annotations["vhostmq.io/queues"]' <<<"$asked" >/dev/null 2>&1 ||
        grep -q 'failed calling webhook "pods.vhostmq.io"' <<<"$asked"
}
check "(a) a pod naming $NS/vhu-net goes to the webhook" went_to_webhook
grep -o 'failed calling webhook[^:]*' <<<"$asked" | head -n 1 | sed 's/^/    /' || true
skipped=$(dry_pod "vhu-unlisted,sriov-net")
not_asked() { jq -e '.metadata.annotations | has("vhostmq.io/queues") | not' <<<"$skipped" >/dev/null 2>&1; }
check "(a) a pod naming other NADs (vhu-unlisted: vhostmq's, not listed; sriov-net) is admitted untouched" not_asked
k delete network-attachment-definitions.k8s.cni.cncf.io vhu-unlisted --ignore-not-found >/dev/null
# metrics: the pod is in the host network (tap), so bound to localhost
metrics_addr() { k -n "$NS" get configmap "$RELEASE-dataplane" -o jsonpath='{.data.dataplane\.yaml}' | grep '^metricsAddress:'; }
check "(a) metrics: the agent config binds 127.0.0.1 ($(metrics_addr))" test "$(metrics_addr)" = 'metricsAddress: "127.0.0.1:9474"'
local_ok() { vmqc_in_ns curl -sf --max-time 5 http://127.0.0.1:9474/healthz >/dev/null; }
check "(a) metrics: http://127.0.0.1:9474/healthz answers on the node" vmqc_poll 30 1 local_ok
refused() { # CMD... (a curl): it cannot connect (exit 7) or times out (28)
    local rc=0
    "$@" >/dev/null 2>&1 || rc=$?
    ((rc == 7 || rc == 28))
}
check "(a) metrics: nothing on the node address $VMQC_NODE_IP:9474" \
    refused vmqc_in_ns curl -s --max-time 5 "http://$VMQC_NODE_IP:9474/metrics"
check "(a) metrics: nothing on the LAN address $LAN_NODE_IP:9474, from the LAN host" \
    refused ip netns exec "$LAN_NS" curl -s --max-time 5 "http://$LAN_NODE_IP:9474/metrics"
no_metrics_svc() { ! k -n "$NS" get service "$RELEASE-metrics" -o name >/dev/null 2>&1; }
check "(a) metrics: no Service $RELEASE-metrics (nothing can scrape a localhost bind)" no_metrics_svc

# capacity from the agent: "slot owner" lines
held() { ctl -o json capacity | jq -r '.cpus[].slots[] | select(.reserved_by != null) | "\(.id) \(.reserved_by)"' | sort; }
held_by() { held | awk -v o="$1" '$2 == o { print $1 }' | sort | paste -sd,; }
sorted_csv() { tr ',' '\n' <<<"$1" | sed '/^$/d' | sort | paste -sd,; }
running() { [[ $(k get pod "$1" -o jsonpath='{.status.phase}') == Running ]]; }
pod_env() { k exec "$1" -- /bin/sh -c "echo \$$2" 2>/dev/null; }

# ------------------------------------------------------------------ (b)
step "(b) device-plugin pod dp-c, 2 queue pairs"
plain_pod() { # NAME CLAIM_TEMPLATE|- DP_COUNT|-
    cat <<EOF
apiVersion: v1
kind: Pod
metadata: {name: $1, namespace: default, labels: {app: vhostmq-dra-test}}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  automountServiceAccountToken: false
$([[ $2 != - ]] && printf '  resourceClaims: [{name: nic, resourceClaimTemplateName: %s}]\n' "$2")
  containers:
    - name: c
      image: $VMQC_BUSYBOX_IMAGE
      imagePullPolicy: Never
      command: ["/bin/sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"]
$([[ $2 != - ]] && echo '      resources: {claims: [{name: nic}]}')
$([[ $3 != - ]] && printf '      resources: {limits: {%s: %s}}\n' "$RES" "$3")
EOF
}
t0=$(vmq_now)
plain_pod dp-c - 2 | k create -f - >/dev/null
if vmqc_poll 60 0.2 running dp-c; then T_RUN[dp-c]=$(vmqc_secs "$t0"); pass "(b) dp-c Running (${T_RUN[dp-c]} s after create)"; else fail "(b) dp-c Running"; fi
SLOTS[dp-c]=$(sorted_csv "$(pod_env dp-c VHOSTMQ_QUEUE_SLOTS)")
dp_owner=$(held | awk '$2 ~ /^alloc\// { print $2; exit }')
check "(b) the agent holds dp-c's slots ${SLOTS[dp-c]:-?} for its allocation (${dp_owner:-none})" \
    test "$(held_by "${dp_owner:-none}")" = "${SLOTS[dp-c]:-?}"
check "(b) the slice drops them: 6 devices, none of dp-c's" vmqc_poll 30 0.5 slice_n 6
none_in_slice() { # CSV: no slice device has one of these names
    slice | jq -e --arg s "$1" '($s | split(",")) as $ids | all(.[]; .name as $n | $ids | index($n) | not)' >/dev/null
}
check "(b) no slice device is one of dp-c's slots" none_in_slice "${SLOTS[dp-c]:-x}"

# ------------------------------------------------------------------ (c)
step "(c) pods with claims for 4 and 2 queue pairs (ResourceClaimTemplates)"
claim_template() { # NAME EXACTLY [CONSTRAINTS]: a ResourceClaimTemplate with one request "queues"
    k apply -f - >/dev/null <<EOF
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: $1, namespace: default}
spec:
  spec:
    devices:
      requests: [{name: queues, exactly: $2}]
      constraints: [${3:-}]
EOF
}
# qpN: N slot devices on one NUMA node
template() { claim_template "qp$1" "{deviceClassName: $DRIVER, allocationMode: ExactCount, count: $1}" "{requests: [queues], matchAttribute: $DRIVER/numaNode}"; }
for n in 4 2 1; do template "$n"; done
# the virt-launcher stand-in: QEMU on the socket the claim's metadata file
# names, as many queues as the claim's slots (CDI env)
cat >"$TDIR/guests/launch.sh" <<'EOF'
#!/bin/sh
PATH=/bin:/usr/bin
md=/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/nic/queues/queues.vhostmq.io-metadata.json
i=0
until [ -s "$md" ]; do
    i=$((i + 1))
    [ $i -le 300 ] || { echo "launch: no metadata file $md"; exit 1; }
    sleep 0.1
done
sock=$(jq -rn 'first(inputs) | .requests[0].devices[0].attributes["vhost-user-path"].string' <"$md")
q=$(echo "$VHOSTMQ_QUEUE_SLOTS" | tr ',' '\n' | grep -c .)
echo "launch: metadata $(jq -cn 'first(inputs) | {apiVersion, podClaimName, devices: [.requests[].devices[] | {name, attributes}]}' <"$md")"
echo "launch: socket=$sock queues=$q slots=$VHOSTMQ_QUEUE_SLOTS env VHOSTMQ_SOCKET=$VHOSTMQ_SOCKET mac=$MAC"
/usr/bin/qemu-system-x86_64 -accel tcg -machine q35 -m 256 -smp 1 \
    -nodefaults -display none -monitor none -no-reboot \
    -object memory-backend-memfd,id=mem0,size=256M,share=on -numa node,memdev=mem0 \
    -kernel /guest/vmlinux -initrd /guest/initramfs.cpio.gz \
    -append "console=ttyS0 panic=-1 loglevel=4 vmq.queues=$q $GUEST_ARGS" \
    -chardev "socket,id=c0,path=$sock,server=on,wait=off" \
    -netdev "vhost-user,id=n0,chardev=c0,queues=$q" \
    -device "virtio-net-pci,netdev=n0,mac=$MAC,mq=on,vectors=0" \
    -serial "file:/out/serial-$GUEST_NAME.log" &
pid=$!
trap 'kill -TERM $pid; wait $pid; exit 0' TERM
wait $pid
echo "launch: QEMU exited: $?"
EOF
chmod 0755 "$TDIR/guests/launch.sh"
chown 107:107 "$TDIR/guests"
rm -f "$TDIR"/guests/serial-*.log
vm_pod() { # NAME TEMPLATE GUEST_ARGS
    cat <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: $1
  namespace: default
  labels: {app: vhostmq-dra-test}
  annotations:
    k8s.v1.cni.cncf.io/networks: '[{"name":"vhu-dra","interface":"net1","mac":"${MACS[$1]}"}]'
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 10
  automountServiceAccountToken: false
  securityContext: {runAsUser: 107, runAsGroup: 107}
  resourceClaims: [{name: nic, resourceClaimTemplateName: $2}]
  containers:
    - name: qemu
      image: $VMQC_BUSYBOX_IMAGE
      imagePullPolicy: Never
      command: ["/bin/sh", "/out/launch.sh"]
      env:
        - {name: GUEST_NAME, value: $1}
        - {name: MAC, value: "${MACS[$1]}"}
        - {name: GUEST_ARGS, value: "vmq.name=$1 $3 vmq.role=pinger vmq.duration=600 vmq.interval=0.5"}
      resources: {claims: [{name: nic}]}
      volumeMounts:
        - {name: usr, mountPath: /usr, readOnly: true}
        - {name: lib, mountPath: /lib, readOnly: true}
        - {name: lib64, mountPath: /lib64, readOnly: true}
        - {name: guest, mountPath: /guest, readOnly: true}
        - {name: out, mountPath: /out}
  volumes:
    - {name: usr, hostPath: {path: /usr, type: Directory}}
    - {name: lib, hostPath: {path: /lib}}
    - {name: lib64, hostPath: {path: /lib64}}
    - {name: guest, hostPath: {path: $(dirname "$GUEST_VMLINUX"), type: Directory}}
    - {name: out, hostPath: {path: $TDIR/guests, type: Directory}}
EOF
}
t0=$(vmq_now)
vm_pod dra-a qp4 'vmq.ip=10.0.1.1/24 vmq.peer=10.0.1.2' | k create -f - >/dev/null
vm_pod dra-b qp2 'vmq.ip=10.0.1.2/24 vmq.peer=10.0.1.1' | k create -f - >/dev/null
for p in dra-a dra-b; do
    if vmqc_poll 120 0.2 running "$p"; then T_RUN[$p]=$(vmqc_secs "$t0"); pass "(c) $p Running (${T_RUN[$p]} s after create)"; else fail "(c) $p Running"; fi
done
claim_of() { k get pod "$1" -o json | jq -r '.status.resourceClaimStatuses[]? | select(.name == "nic") | .resourceClaimName'; }
ports_of() { ctl -o json port list | jq -c --arg p "$1" '.ports[] | select(.labels["k8s.pod.name"] == $p)'; }
declare -A WANT=([dra-a]=4 [dra-b]=2)
network_data() { # CLAIM MAC: every device status of ours has {interfaceName: net1, hardwareAddress: MAC}
    k get resourceclaims.resource.k8s.io "$1" -o json | jq -e --arg d "$DRIVER" --arg m "$2" \
        '[.status.devices[]? | select(.driver == $d)] | length > 0 and all(.networkData.interfaceName == "net1" and .networkData.hardwareAddress == $m)' >/dev/null
}
for p in dra-a dra-b; do
    CLAIM[$p]=$(claim_of "$p")
    cj=$(k get resourceclaims.resource.k8s.io "${CLAIM[$p]:-none}" -o json 2>/dev/null || echo '{}')
    devs=$(jq -r --arg d "$DRIVER" '[.status.allocation.devices.results[]? | select(.driver == $d) | .device] | sort | join(",")' <<<"$cj")
    uid=$(jq -r '.metadata.uid' <<<"$cj")
    SLOTS[$p]=$(sorted_csv "$(pod_env "$p" VHOSTMQ_QUEUE_SLOTS)")
    port=$(ports_of "$p" || true)
    echo "    $p: claim ${CLAIM[$p]:-?} allocated $devs; VHOSTMQ_QUEUE_SLOTS ${SLOTS[$p]}; port $(jq -c '{id, queue_pairs, slots, socket, mac}' <<<"${port:-null}")"
    check "(c) $p: its claim has ${WANT[$p]} devices of $DRIVER on one NUMA node" \
        test "$(jq -r --arg d "$DRIVER" '[.status.allocation.devices.results[] | select(.driver == $d)] | length' <<<"$cj")" = "${WANT[$p]}"
    check "(c) $p: VHOSTMQ_QUEUE_SLOTS = the claim's devices" test "${SLOTS[$p]}" = "$devs"
    check "(c) $p: the agent holds them for claim/$uid" test "$(held_by "claim/$uid")" = "$devs"
    check "(c) $p: one port, ${WANT[$p]} queue pairs on exactly those slots" \
        test "$(jq -s -r '"\(length) \(.[0].queue_pairs) \(.[0].slots | sort | join(","))"' <<<"$port")" = "1 ${WANT[$p]} $devs"
    check "(c) $p: port socket in the claim's directory (claim-<hash>/vhost-user.sock)" \
        bash -c "[[ \$(jq -r .socket <<<'$port') == $SOCK_DIR/claim-*/vhost-user.sock ]]"
    st=$(jq -c --arg d "$DRIVER" '[.status.devices[]? | select(.driver == $d)]' <<<"$cj")
    echo "    $p claim status.devices[0]: $(jq -c '.[0] | {device, data, conditions: [.conditions[] | {type, status, reason}]}' <<<"$st")"
    check "(c) $p: claim status.devices: ${WANT[$p]} Ready entries naming /var/run/vhostmq/nic/vhost-user.sock" \
        test "$(jq -r '[.[] | select(.conditions[0].type == "Ready" and .conditions[0].status == "True" and .data.vhostUserPath == "/var/run/vhostmq/nic/vhost-user.sock")] | length' <<<"$st")" = "${WANT[$p]}"
    check "(c) $p: claim status.devices carry the port's network data (net1, ${MACS[$p]})" \
        vmqc_poll 15 0.5 network_data "${CLAIM[$p]:-none}" "${MACS[$p]}"
done
check "(c) device-plugin side shrinks: allocatable $RES = 2 (6 slots held by claims)" vmqc_poll 30 0.5 alloc_n 2
all_held=$(held | awk '{ print $1 }' | sort | paste -sd,)
check "(c) from the agent: 8 slots held, each once (dp-c 2, dra-a 4, dra-b 2), none shared" \
    test "$(held | awk '{ print $1 }' | sort -u | wc -l) $(held | wc -l) $(sorted_csv "${SLOTS[dp-c]},${SLOTS[dra-a]},${SLOTS[dra-b]}")" = "8 8 $all_held"
held | sed 's/^/    /'

# ------------------------------------------------------------------ (d)
step "(d) QEMU in each pod on the socket from the metadata file; guests ping each other"
serial() { echo "$TDIR/guests/serial-$1.log"; }
qemu_on() { k logs "$1" 2>/dev/null | grep -F "launch: socket=/var/run/vhostmq/nic/vhost-user.sock queues=$2 " >/dev/null; }
for p in dra-a dra-b; do
    check "(d) $p: QEMU on /var/run/vhostmq/nic/vhost-user.sock (metadata file), ${WANT[$p]} queues" \
        vmqc_poll 30 0.5 qemu_on "$p" "${WANT[$p]}"
done
k logs dra-a 2>/dev/null | sed 's/^/    dra-a: /' | cut -c1-400
for p in dra-a dra-b; do
    if vmq_wait_log "$(serial "$p")" '^VHOSTMQ-RESULT link ' "$GUEST_TIMEOUT"; then
        q="$(vmq_result "$(serial "$p")" queues rx)/$(vmq_result "$(serial "$p")" queues tx)"
        check "(d) guest $p: ${WANT[$p]} rx + ${WANT[$p]} tx queues, link up" test "$q $(vmq_result "$(serial "$p")" link state)" = "${WANT[$p]}/${WANT[$p]} up"
    else
        fail "(d) guest $p booted within $GUEST_TIMEOUT s"
    fi
done
pings() { vmq_count_log "$(serial "$1")" '^VHOSTMQ-PING ok'; }
five_more() { (($(pings dra-a) >= $1 + 5 && $(pings dra-b) >= $2 + 5)); }
check "(d) the guests ping each other (5 replies each way)" vmqc_poll "$GUEST_TIMEOUT" 0.5 five_more 0 0
# the guests on the node's network, through the tap uplink
lan_reach() { # FROM(lan|node) IP: 2 echo replies (busybox's ping: Debian's minimal install has none)
    if [[ $1 == lan ]]; then ip netns exec "$LAN_NS" busybox ping -c 2 -W 2 "$2" >/dev/null 2>&1
    else vmqc_in_ns busybox ping -c 2 -W 2 -I "$LAN_BR" "$2" >/dev/null 2>&1; fi
}
for p in dra-a:10.0.1.1 dra-b:10.0.1.2; do
    check "(d) tap uplink: ${p%%:*} (${p#*:}) answers the LAN's other host $LAN_HOST_IP" vmqc_poll 30 1 lan_reach lan "${p#*:}"
    check "(d) tap uplink: ${p%%:*} (${p#*:}) answers the node's address $LAN_NODE_IP on $LAN_BR" vmqc_poll 30 1 lan_reach node "${p#*:}"
done
lan_mac() { ip netns exec "$LAN_NS" ip neigh show "$1" dev lan0 | awk '{ print $3 }'; }
check "(d) the LAN host learnt dra-a's MAC ${MACS[dra-a]} for 10.0.1.1" test "$(lan_mac 10.0.1.1)" = "${MACS[dra-a]}"

# ------------------------------------------------------------------ (e)
step "(e) above the free capacity: a claim and a device-plugin pod stay Pending"
plain_pod dra-x qp1 - | k create -f - >/dev/null
plain_pod dp-y - 1 | k create -f - >/dev/null
sched_msg() { k get events -n default --field-selector "involvedObject.name=$1,reason=FailedScheduling" -o json | jq -r '[.items[].message] | last // ""'; }
has_msg() { [[ $(sched_msg "$1") == *"$2"* ]]; }
check "(e) dra-x Pending: FailedScheduling says the claim cannot be allocated" vmqc_poll 60 0.5 has_msg dra-x "cannot allocate all claims"
echo "    dra-x: $(sched_msg dra-x)"
check "(e) dp-y Pending: FailedScheduling says Insufficient $RES" vmqc_poll 60 0.5 has_msg dp-y "Insufficient $RES"
echo "    dp-y: $(sched_msg dp-y)"
check "(e) both still Pending" test "$(k get pod dra-x dp-y -o jsonpath='{.items[*].status.phase}')" = "Pending Pending"

# ------------------------------------------------------------------ (f)
step "(f) the DRA driver restarted, then the kubelet: prepared claims stay"
before=$(held)
slice_before=$(slice | jq -c '[.[].name] | sort')
dra_cid=$(k -n "$NS" get pods -l app.kubernetes.io/name=vhostmq -o json | jq -r '.items[0].status.containerStatuses[] | select(.name == "dra") | .containerID | sub("containerd://"; "")')
dra_pid=$(vmqc_ctr tasks ls | awk -v id="$dra_cid" '$1 == id { print $2 }')
kill -TERM "${dra_pid:-0}" 2>/dev/null || fail "(f) no DRA driver process (container ${dra_cid:-?})"
restarts() { k -n "$NS" get pods -l app.kubernetes.io/name=vhostmq -o json | jq -r '.items[0].status.containerStatuses[] | select(.name == "dra") | "\(.restartCount) \(.ready)"'; }
restarted() { read -r n ready < <(restarts) && ((n >= 1)) && [[ $ready == true ]]; }
check "(f) the dra container restarted (pid ${dra_pid:-?} killed) and is ready again" vmqc_poll 90 0.5 restarted
echo "    dra container: restarts/ready $(restarts)"
check "(f) after the driver's restart: reservations and slice unchanged" test "$(held) $(slice | jq -c '[.[].name] | sort')" = "$before $slice_before"
n_a=$(pings dra-a) n_b=$(pings dra-b)
"$HERE/cluster.sh" restart-kubelet >/dev/null
node_ready() { [[ $(k get node "$VMQC_NODE" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}') == True ]]; }
check "(f) node Ready after the kubelet restart" vmqc_poll 60 0.5 node_ready
check "(f) reservations unchanged" test "$(held)" = "$before"
slice_same() { [[ $(slice | jq -c '[.[].name] | sort') == "$slice_before" ]]; }
check "(f) the slice unchanged" vmqc_poll 30 0.5 slice_same
check "(f) dra-a, dra-b, dp-c still Running" test "$(k get pod dra-a dra-b dp-c -o jsonpath='{.items[*].status.phase}')" = "Running Running Running"
check "(f) the guests go on pinging each other (5 more replies each way)" vmqc_poll 60 0.5 five_more "$n_a" "$n_b"

# ------------------------------------------------------------------ (g)
step "(g) dra-b deleted: its claim is unprepared; dp-y deleted: dra-x runs"
uid_b=$(k get resourceclaims.resource.k8s.io "${CLAIM[dra-b]:-none}" -o jsonpath='{.metadata.uid}' 2>/dev/null || true)
k delete pod dra-b --wait=true --timeout 60s >/dev/null
k delete pod dp-y --wait=true --timeout 30s >/dev/null
no_claim_b() { [[ -z $(held_by "claim/$uid_b") ]]; }
check "(g) the agent released claim/$uid_b" vmqc_poll 60 0.5 no_claim_b
files_of() { find "$VMQC_CDI_DIR" "$SOCK_DIR" "/var/lib/kubelet/plugins/$DRIVER" -name "*$1*" 2>/dev/null; }
no_files_of() { [[ -z $(files_of "$1") ]]; }
check "(g) its CDI specs and metadata files are gone" vmqc_poll 30 0.5 no_files_of "${uid_b:-none}"
no_record_of() { ! grep -qs "$1" "$SOCK_DIR"/.claim-*.json; }
check "(g) its record for the CNI is gone" vmqc_poll 30 0.5 no_record_of "${uid_b:-none}"
t0=$(vmq_now)
if vmqc_poll 90 0.5 running dra-x; then T_RUN[dra-x]=$(vmqc_secs "$t0"); pass "(g) dra-x Running once capacity was freed (${T_RUN[dra-x]} s)"; else fail "(g) dra-x Running once capacity was freed"; fi
SLOTS[dra-x]=$(pod_env dra-x VHOSTMQ_QUEUE_SLOTS)
check "(g) dra-x: one slot (${SLOTS[dra-x]:-none}), held for its claim, its socket directory mounted" \
    test "$(tr ',' '\n' <<<"${SLOTS[dra-x]}" | grep -c .) $(k exec dra-x -- /bin/sh -c 'test -d /var/run/vhostmq/nic && echo dir')" = "1 dir"

# ------------------------------------------------------------------ (h)
step "(h) everything deleted: all capacity back, nothing left"
delete_ours
check "(h) the slice has 8 devices again" vmqc_poll 60 0.5 slice_n 8
check "(h) node allocatable $RES = 8" vmqc_poll 60 0.5 alloc_n 8
no_held() { [[ -z $(held) ]]; }
check "(h) no reservation in the agent" vmqc_poll 60 0.5 no_held
only_api_sock() { [[ -z $(find "$SOCK_DIR" -mindepth 1 ! -path "$SOCK_DIR/api.sock") ]]; }
check "(h) nothing in $SOCK_DIR but api.sock" vmqc_poll 90 0.5 only_api_sock
no_specs() { [[ -z $(find "$VMQC_CDI_DIR" -name '*vhostmq*' 2>/dev/null) ]]; }
check "(h) no CDI spec of $DRIVER or vhostmq.io in $VMQC_CDI_DIR" vmqc_poll 30 0.5 no_specs

# ------------------------------------------------------------------ (i)
# create -> Running of the same busybox pod asking 2 queue pairs either
# way, one at a time on the idle node, ROUNDS rounds interleaved
# (VHOSTMQ_DRA_ROUNDS, default 3)
ROUNDS=${VHOSTMQ_DRA_ROUNDS:-3}
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || vmq_die "VHOSTMQ_DRA_ROUNDS: a positive count, not '$ROUNDS'"
step "(i) claim-to-Running vs device plugin: busybox pods asking 2 queue pairs, $ROUNDS rounds each"
declare -a T_DP=() T_DRA=() T_NUMA=()
template 2
timed_run() { # NAME CLAIM_TEMPLATE|- DP_COUNT|-: seconds from create to Running
    local t
    t=$(vmq_now)
    plain_pod "$1" "$2" "$3" | k create -f - >/dev/null
    vmqc_poll 60 0.05 running "$1" || { echo -; return 0; }
    vmqc_secs "$t"
    k delete pod "$1" --grace-period 1 --wait=true --timeout 60s >/dev/null
}
for ((r = 1; r <= ROUNDS; r++)); do
    T_DP+=("$(timed_run "dp-t$r" - 2)")
    T_DRA+=("$(timed_run "dra-t$r" qp2 -)")
done
median() { printf '%s\n' "$@" | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
all_ran() { [[ " ${T_DP[*]} ${T_DRA[*]} " != *" - "* ]]; }
check "(i) all $((2 * ROUNDS)) pods ran (device plugin ${T_DP[*]} s; DRA ${T_DRA[*]} s)" all_ran
delete_ours
all_back() { slice_n 8 && alloc_n 8 && [[ -z $(held) ]]; }
check "(i) all capacity back after (slice 8, allocatable 8, no reservation)" vmqc_poll 60 0.5 all_back

# ------------------------------------------------------------------ (j)
# The other device model: one device per NUMA node whose consumable
# capacity queuePairs claims share (KEP-5075); the same checks, shorter
step "(j) helm upgrade to dra.devices=numa: a device per NUMA node with consumable capacity queuePairs"
if h upgrade "$RELEASE" "$VMQ_REPO_ROOT/charts/vhostmq" --namespace "$NS" --reuse-values --set dra.devices=numa \
    --wait --timeout 3m >"$work/helm-numa.log" 2>&1; then
    pass "(j) helm upgrade --set dra.devices=numa"
else
    fail "(j) helm upgrade --set dra.devices=numa"
    sed 's/^/    /' "$work/helm-numa.log" | tail -n 20
fi
numa_slice() { # CAPACITY: one shareable device numa-0 with that capacity
    slice | jq -e --arg c "$1" 'length == 1 and .[0].name == "numa-0" and .[0].capacity["queuePairs"].value == $c and .[0].allowMultipleAllocations == true' >/dev/null
}
check "(j) the slice: numa-0 only, capacity queuePairs 8, shareable" vmqc_poll 90 0.5 numa_slice 8
echo "    devices: $(slice | jq -c '[.[] | {name, capacity}]')"
# cqN: one share of N queuePairs of a NUMA node's device
cap_template() { claim_template "cq$1" "{deviceClassName: $DRIVER, capacity: {requests: {queuePairs: \"$1\"}}}"; }
for n in 4 2 1; do cap_template "$n"; done
plain_pod dp-c - 2 | k create -f - >/dev/null
check "(j) device-plugin pod dp-c (2) Running" vmqc_poll 60 0.2 running dp-c
check "(j) the slice's capacity drops to 6" vmqc_poll 60 0.5 numa_slice 6
t0=$(vmq_now)
plain_pod cap-a cq4 - | k create -f - >/dev/null
plain_pod cap-b cq2 - | k create -f - >/dev/null
for p in cap-a cap-b; do
    if vmqc_poll 60 0.2 running "$p"; then T_RUN[$p]=$(vmqc_secs "$t0"); pass "(j) $p Running (${T_RUN[$p]} s after create)"; else fail "(j) $p Running"; fi
done
declare -A WANTC=([cap-a]=4 [cap-b]=2)
for p in cap-a cap-b; do
    cj=$(k get resourceclaims.resource.k8s.io "$(claim_of "$p")" -o json 2>/dev/null || echo '{}')
    uid=$(jq -r '.metadata.uid' <<<"$cj")
    SLOTS[$p]=$(sorted_csv "$(pod_env "$p" VHOSTMQ_QUEUE_SLOTS)")
    echo "    $p: allocation $(jq -c '[.status.allocation.devices.results[]? | {device, shareID, consumedCapacity}]' <<<"$cj"); slots ${SLOTS[$p]}"
    check "(j) $p: one share of numa-0 consuming ${WANTC[$p]} queuePairs" \
        test "$(jq -r '[.status.allocation.devices.results[] | "\(.device) \(.consumedCapacity["queuePairs"]) \(.shareID != null)"] | join(";")' <<<"$cj")" = "numa-0 ${WANTC[$p]} true"
    check "(j) $p: the agent holds ${WANTC[$p]} slots for claim/$uid = VHOSTMQ_QUEUE_SLOTS" \
        test "$(held_by "claim/$uid") $(tr ',' '\n' <<<"${SLOTS[$p]}" | grep -c .)" = "${SLOTS[$p]} ${WANTC[$p]}"
    cpus=$(tr ',' '\n' <<<"${SLOTS[$p]}" | cut -d- -f1 | sort -u | wc -l)
    check "(j) $p: its slots are on both CPUs ($cpus)" test "$cpus" = 2
done
check "(j) from the agent: 8 slots held, each once" test "$(held | awk '{ print $1 }' | sort -u | wc -l) $(held | wc -l)" = "8 8"
plain_pod cap-x cq1 - | k create -f - >/dev/null
check "(j) cap-x (one more queue pair) Pending: the claim cannot be allocated" vmqc_poll 60 0.5 has_msg cap-x "cannot allocate all claims"
echo "    cap-x: $(sched_msg cap-x)"
k delete pod cap-x dp-c cap-a cap-b --wait=true --timeout 60s >/dev/null
# as (i): one at a time on the idle node (dp-c's slots come back when the
# device plugin reclaims its allocation; 2 of the 6 others are enough)
for ((r = 1; r <= ROUNDS; r++)); do T_NUMA+=("$(timed_run "cap-t$r" cq2 -)"); done
numa_ran() { [[ " ${T_NUMA[*]} " != *" - "* ]]; }
check "(j) $ROUNDS pods with a share of 2 ran one at a time (${T_NUMA[*]} s)" numa_ran
k delete resourceclaimtemplates.resource.k8s.io cq4 cq2 cq1 --ignore-not-found >/dev/null
numa_back() { numa_slice 8 && alloc_n 8 && [[ -z $(held) ]]; }
check "(j) all capacity back (numa-0 8, allocatable 8, no reservation)" vmqc_poll 60 0.5 numa_back

echo "--- summary"
echo "cluster bring-up: $BRINGUP"
echo "claim-to-Running (create -> Running): dra-a (QEMU, claim of 4, CNI) ${T_RUN[dra-a]:--} s, dra-b (claim of 2) ${T_RUN[dra-b]:--} s, dra-x (busybox, claim of 1, once freed) ${T_RUN[dra-x]:--} s"
echo "device plugin: dp-c (busybox, 2 queue pairs) ${T_RUN[dp-c]:--} s; test-cni.sh's QEMU pods are the device-plugin path's with CNI"
echo "(i) create -> Running, busybox asking 2 queue pairs, median of $ROUNDS: device plugin $(median "${T_DP[@]}") s (${T_DP[*]}), DRA claim of 2 slot devices $(median "${T_DRA[@]}") s (${T_DRA[*]})"
echo "(j) the same with dra.devices=numa, a share of 2 queuePairs: $(median "${T_NUMA[@]}") s (${T_NUMA[*]}); cap-a (4) ${T_RUN[cap-a]:--} s, cap-b (2) ${T_RUN[cap-b]:--} s"
echo "test time: $(vmqc_secs "$t_test") s"
echo "$passed passed, $failed failed"
((failed == 0))
