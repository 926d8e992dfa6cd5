#!/usr/bin/env bash
# Queue pairs through Dynamic Resource Allocation on the real one-node cluster
# (hack/cluster/cluster.sh: Kubernetes v1.37, containerd 2 with CDI), beside
# the device plugin, the way a user installs it: the Helm chart with
# dra.enabled and devicePlugin.enabled, the CNI called by multus-lite (the
# Multus stand-in of test-cni.sh).
#
# Feature gates: none. What this uses is on by default in v1.37:
# DynamicResourceAllocation (GA 1.34), DRAResourceClaimDeviceStatus (GA
# 1.37), DRAResourceClaimGranularStatusAuthorization (beta 1.36). The device
# metadata file (KEP-5304) is the driver's (kubeletplugin), needing no gate.
#
# Bash does the bring-up: the static binaries and multus-lite, the guest
# image (hack/guest), helm, the cluster with multus-lite as its CNI, the
# kubernetes Service routed into the node's netns (no kube-proxy), the image
# localhost/vhostmq:dev and busybox imported, the NAD CRD, and the LAN the
# tap uplink joins (a bridge vmq-lan in the node's netns with the node's
# address 10.0.1.254/24, another host on it: the netns vhostmq-test-lan at
# 10.0.1.100). The checks are the Go specs of test/e2e/dra_test.go (label
# dra), one per check (test/e2e/README.md maps each check of this script's
# bash past to its spec); the install itself is check (a), so the specs run
# helm install (and uninstall the release at the end):
#   (a) helm install: the DaemonSet (dataplane, device plugin, DRA driver)
#       Ready; the DeviceClass; a ResourceSlice of 8 devices; allocatable 8
#       Least exposure, asked of this API server (SubjectAccessReviews, and
#       the host kubeconfig itself): the CNI's host token is a 10-minute
#       token of vhostmq-cni, which may get pods, NADs and VMIs and not
#       list, watch or write; the node pod's account reads no pods and
#       mints only that token; the webhook has 2 ready replicas and a
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
#       (from the agent's gRPC API)
#   (d) in each pod QEMU reads the socket from the claim's metadata file
#       (/var/run/kubernetes.io/dra-device-attributes/...) and the queue
#       count from VHOSTMQ_QUEUE_SLOTS (CDI env); the guests report 4 and 2
#       queues and ping each other; through the tap uplink (uplink.mode=tap
#       on vmq-lan) the LAN host and the node reach both guests
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
#       the device plugin and through a claim, interleaved rounds (times
#       reported, not judged)
#   (j) helm upgrade to dra.devices=numa: one device per NUMA node whose
#       consumable capacity queuePairs claims share; (c), (e) and (i) again
# Ends with Ginkgo's "N Passed | N Failed" and the report entries
# (claim-to-Running beside the device-plugin pod's, the rounds' medians);
# exits non-zero if anything failed. In $VHOSTMQ_CLUSTER_LOGS/e2e/<UTC
# time>/: guests/serial-dra-{a,b}.log (the guests' consoles), junit.xml, a
# folder of diagnostics per failed spec (with dra.txt: claims, slices, the
# agent's capacity and ports, the node pod's logs, multus-lite's log, the
# kubelet's DRA lines).
#
# Usage: hack/cluster/test-dra.sh [--keep] [-- GINKGO_ARGS...]
#   Brings the cluster up with multus-lite as its CNI (and down at the end)
#   unless it is already up; a cluster that is up must have been started by
#   this script (--keep), then only what the test made is removed.  --keep
#   leaves everything running, the release too.
# Environment: VHOSTMQ_TEST_BIN_DIR (as test-cni.sh), VHOSTMQ_TEST_DRA_DIR
# (default /run/vhostmq-test-dra), VHOSTMQ_TEST_GUEST_TIMEOUT=150,
# VHOSTMQ_DRA_ROUNDS=3 (the timing rounds of (i) and (j)), VHOSTMQ_E2E_LOGS
# (as e2e.sh)
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$HERE/lib.sh"
VMQ_TAG=test-dra

KEEP=0
vmq_args --keep:KEEP=1 -- "$@"
GINKGO_ARGS=("${VMQ_REST[@]}")
NS=vhostmq-system
RELEASE=vhostmq
TDIR=${VHOSTMQ_TEST_DRA_DIR:-/run/vhostmq-test-dra}
MLOG=$VMQC_LOGS/multus-lite-dra.log
HELM=${VHOSTMQ_TOOLS:-/var/cache/vhostmq/tools}/helm-v3.22.0
# the node's network for the tap uplink: a bridge in the node's netns with
# the node's address on it, and one more host (a netns on a veth)
LAN_BR=vmq-lan LAN_NS=vhostmq-test-lan LAN_NODE_IP=10.0.1.254 LAN_HOST_IP=10.0.1.100
we_started=0 t0=$(vmq_now)
work=$(mktemp -d)
export VHOSTMQ_E2E_LOGS=${VHOSTMQ_E2E_LOGS:-$VMQC_LOGS/e2e/$(date -u +%Y%m%dT%H%M%SZ)}

k() { vmqc_kubectl "$@"; }
h() { vmqc_in_ns env HELM_CACHE_HOME="$VMQC_RUN/helm/cache" HELM_CONFIG_HOME="$VMQC_RUN/helm/config" \
    HELM_DATA_HOME="$VMQC_RUN/helm/data" "$HELM" --kubeconfig "$VMQC_KUBECONFIG" "$@"; }

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
    if ((KEEP)); then
        vmq_log "--keep: leaving the cluster, the release and the LAN up"
    elif ((we_started)); then
        ip netns del "$LAN_NS" 2>/dev/null
        "$HERE/cluster.sh" down # pods first: CNI DEL needs $TDIR
        rm -rf "$TDIR"
    elif vmqc_is_up; then
        # the specs remove what they made; this is for specs that never ran
        # to their end (a build failure, a timeout)
        k delete pod -l app=vhostmq-test --ignore-not-found --grace-period 5 --wait=true --timeout 90s >/dev/null 2>&1
        k delete resourceclaimtemplates.resource.k8s.io qp4 qp2 qp1 cq4 cq2 cq1 --ignore-not-found >/dev/null 2>&1
        k delete network-attachment-definitions.k8s.cni.cncf.io vhu-dra vhu-unlisted --ignore-not-found >/dev/null 2>&1
        h status "$RELEASE" --namespace "$NS" >/dev/null 2>&1 &&
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
# the specs, compiled before the run (the node's netns reaches no proxy)
vmq_log "building the e2e specs (go test -c -tags e2e ./test/e2e/)"
(cd "$VMQ_REPO_ROOT" && timeout 900 go test -c -tags e2e -o "$work/e2e.test" ./test/e2e/) ||
    vmq_die "building test/e2e failed"
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
    mkdir -p "$TDIR/bin"
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
"$HERE/images.sh" --bundle localhost/vhostmq:dev "${IMAGE_BINS[@]}"
vmqc_ctr images ls -q | grep -x "$VMQC_BUSYBOX_IMAGE" >/dev/null || vmqc_import "$VMQC_IMAGES/busybox.tar"
k apply -f "$HERE/manifests/nad-crd.yaml" >/dev/null
k wait --for=condition=Established crd/network-attachment-definitions.k8s.cni.cncf.io --timeout 30s >/dev/null
# a release a --keep run left is the specs' to replace; its LAN is made anew
lan_up || vmq_die "making the LAN $LAN_BR / $LAN_NS"
echo "--- the node's network: bridge $LAN_BR in the node's netns with $LAN_NODE_IP/24, host $LAN_HOST_IP (netns $LAN_NS)"
t_up=$(vmqc_secs "$t0")

# ------------------------------------------------------------------ specs
export VHOSTMQ_E2E_KUBECONFIG=$VMQC_KUBECONFIG VHOSTMQ_E2E_NETNS=/run/netns/$VMQC_NETNS
export VHOSTMQ_E2E_KUBECTL=$VMQC_BIN/kubectl VHOSTMQ_E2E_NODE=$VMQC_NODE
export VHOSTMQ_E2E_CTR=$VMQC_CTR VHOSTMQ_E2E_CTR_SOCKET=$VMQC_CTR_SOCK
export VHOSTMQ_E2E_CLUSTER_SH=$HERE/cluster.sh VHOSTMQ_E2E_TEST_IMAGE=$VMQC_BUSYBOX_IMAGE
export VHOSTMQ_CLUSTER_RUN=$VMQC_RUN VHOSTMQ_CLUSTER_LOGS=$VMQC_LOGS
export VHOSTMQ_E2E_HELM=$HELM VHOSTMQ_E2E_CDI_DIR=$VMQC_CDI_DIR VHOSTMQ_E2E_GUEST_IMAGE=${GUEST_VMLINUX%/*}
export VHOSTMQ_E2E_CNI_DIR=$TDIR VHOSTMQ_E2E_MULTUS_LOG=$MLOG
export VHOSTMQ_E2E_LAN_BRIDGE=$LAN_BR VHOSTMQ_E2E_LAN_NETNS=$LAN_NS
export VHOSTMQ_E2E_LAN_NODE_IP=$LAN_NODE_IP VHOSTMQ_E2E_LAN_HOST_IP=$LAN_HOST_IP
((KEEP)) && export VHOSTMQ_E2E_KEEP=1
mkdir -p "$VHOSTMQ_E2E_LOGS"
args=(-test.v -test.timeout 40m -ginkgo.v -ginkgo.junit-report "$VHOSTMQ_E2E_LOGS/junit.xml" -ginkgo.label-filter dra)
t1=$(vmq_now)
rc=0
# go test runs a package's test binary in the package's folder
(cd "$VMQ_REPO_ROOT/test/e2e" && timeout 2500 "$work/e2e.test" "${args[@]}" "${GINKGO_ARGS[@]}") || rc=$?
echo "--- cluster bring-up: $BRINGUP"
echo "--- bring-up (binaries, specs, guest, cluster, image, LAN) ${t_up} s; specs $(vmqc_secs "$t1") s; logs: $VHOSTMQ_E2E_LOGS"
((rc == 0)) || exit "$rc"
