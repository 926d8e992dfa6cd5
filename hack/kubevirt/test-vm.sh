#!/usr/bin/env bash
# vhostmq as a user installs it, on real KubeVirt v1.7.0 (hack/kubevirt/
# testbed.sh up must have run): issues #7 and #8 with nothing stood in but
# Multus.  Bash does the bring-up only; every check is a Go spec
# (test/e2e/kubevirt_test.go, Ginkgo label kubevirt; the chain and the
# checks are listed there and in test/e2e/README.md):
#
#   the spec binary (go test -c -tags e2e ./test/e2e/), compiled first;
#   leftovers of an earlier run removed (VMs, the release, the device
#   plugin's test DaemonSet); Multus' NAD CRD; the guest's kernel-boot
#   image imported; the image localhost/vhostmq:dev (every binary of the
#   test bed, hack/cluster/images.sh --bundle) and localhost/vhostmq:upgrade
#   (the same sources linked stripped: another digest, for helm upgrade);
#   with the second node, the second node cordoned until the migration
#   (the nodes' networks are joined by the chart's vxlan uplink over their
#   InternalIP addresses: nothing to bring up); the test bed's own binding registration and vhostmq-cni link
#   taken out (the chart installs both).  Then the specs: helm install,
#   the VMs, traffic, migrations, helm upgrade, delete, helm uninstall.
#   At the end (also after a failure) what the specs left is deleted and
#   the test bed's binding and CNI link are put back.
#
# Usage: hack/kubevirt/test-vm.sh [--keep] [-- GINKGO_ARGS...]
#   --keep        leave what is up at the end (VMs, the release) for a look
#   GINKGO_ARGS   passed on, e.g. -- -ginkgo.focus 'vm1'
# Environment:
#   VHOSTMQ_KUBEVIRT_VM_TIMEOUT=420      bound on each VM's start and boot (s):
#                                        above virt-handler's resync, which once
#                                        had to restart a domain it undefined
#                                        (VMI Running after 239 s)
#   VHOSTMQ_KUBEVIRT_RECLAIM_TIMEOUT=120 bound on the allocation reclaim (s)
#   VHOSTMQ_KUBEVIRT_MIGRATE_MB=200      the file vm4 streams to vm3 while it migrates
# Output: the specs' (ginkgo -v); guest consoles, followed logs, domain XML,
# helm's output, timings.txt, junit.xml and the diagnostics of failed specs
# in $VMQC_LOGS/kubevirt-test-vm/.  Exit status: the specs'.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$HERE/lib.sh"
VMQ_TAG=kubevirt-test-vm

KEEP=0
vmq_args --keep:KEEP=1 -- "$@"
GINKGO_ARGS=("${VMQ_REST[@]}")
vmq_need_root
DS_NS=vhostmq-system
NS=vhostmq-kv-test
BIN_DIR=$VMKV_RUN/bin
RELEASE=vhostmq
IMAGE_REPO=localhost/vhostmq
SIDECAR_IMAGE=localhost/vhostmq/kubevirt-binding:dev # what testbed.sh up imported
# the image holds every binary the chart runs (the Dockerfile's vhostmq target)
BUNDLE=(vhostmq-dataplane vhostmq-deviceplugin vhostmqctl vhostmq-cni vhostmq-install-cni vhostmq-webhook vhostmq-kubevirt-register)
NODE_CNI_BIN=$VMQC_RUN/cni/bin
NODE_CNI_CONF=$VMQC_RUN/cni/net.d
HELM=${VHOSTMQ_TOOLS:-/var/cache/vhostmq/tools}/helm-v3.22.0
OUT=$VMQC_LOGS/kubevirt-test-vm # the specs' log folder (kept)
TWO_NODES=0
vmqc_has_node2 && TWO_NODES=1
work=$(mktemp -d /tmp/vhostmq-kv-test.XXXXXX)
rc=0

k() { vmqc_kubectl "$@"; }
h() { # helm against the test cluster, its caches in our run folder (as framework.Helm)
    vmqc_in_ns env HELM_CACHE_HOME="$VMQC_RUN/helm/cache" HELM_CONFIG_HOME="$VMQC_RUN/helm/config" \
        HELM_DATA_HOME="$VMQC_RUN/helm/data" "$HELM" --kubeconfig "$VMQC_KUBECONFIG" "$@"
}
# the binding as testbed.sh up registered it (deploy/examples/kubevirt-binding.yaml)
unregister_testbed_binding() {
    k -n kubevirt patch kubevirt kubevirt --type merge -p '{"spec":{"configuration":{"network":{"binding":{"vhostmq":null}}}}}' >/dev/null
}
# restore_testbed: what testbed.sh up set up and the chart replaced
restore_testbed() {
    [[ -e $NODE_CNI_BIN/vhostmq-cni ]] || ln -sf "$(readlink -f "$VMKV_RUN/cni/bin/vhostmq-cni")" "$NODE_CNI_BIN/vhostmq-cni"
    [[ -f $VMKV_RUN/kubevirt-binding.yaml ]] &&
        k -n kubevirt patch kubevirt kubevirt --type merge --patch-file "$VMKV_RUN/kubevirt-binding.yaml" >/dev/null
}
delete_ours() {
    k -n "$NS" delete vm --all --ignore-not-found --wait=true --timeout 120s >/dev/null 2>&1 || true
    k -n "$NS" delete vmi --all --ignore-not-found --wait=true --timeout 60s >/dev/null 2>&1 || true
    k delete ns "$NS" --ignore-not-found --wait=true --timeout 120s >/dev/null 2>&1 || true
}
uninstall() {
    if h status "$RELEASE" -n "$DS_NS" >/dev/null 2>&1; then
        h uninstall "$RELEASE" -n "$DS_NS" --wait --timeout 2m >/dev/null 2>&1 || true
    fi
}

cleanup() {
    local r=$?
    set +e
    if ((KEEP)); then
        vmq_log "--keep: leaving the VMs and the release $RELEASE (helm -n $DS_NS uninstall $RELEASE takes it down)"
    else
        delete_ours
        uninstall
        k delete ns "$DS_NS" --ignore-not-found --wait=true --timeout 60s >/dev/null 2>&1
        restore_testbed
        if ((TWO_NODES)); then
            k uncordon "$VMQC_NODE2" >/dev/null 2>&1
        fi
    fi
    rm -rf "$work"
    exit "$r"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

[[ -x $BIN_DIR/vhostmq-webhook && -x $VMKV_KUBE_PROXY ]] || vmq_die "the test bed is not up ($HERE/testbed.sh up)"
"$HERE/testbed.sh" status >/dev/null 2>&1 || vmq_die "the test bed is not up or KubeVirt is not Available ($HERE/testbed.sh status)"
t0=$(vmq_now)
# the specs, compiled before anything changes on the cluster
vmq_log "building the e2e specs (go test -c -tags e2e ./test/e2e/)"
(cd "$VMQ_REPO_ROOT" && timeout 900 go test -c -tags e2e -o "$work/e2e.test" ./test/e2e/) || vmq_die "building test/e2e failed"
[[ -x $HELM ]] || "$VMQ_REPO_ROOT/hack/manifests.sh" >/dev/null # builds and caches helm
rm -rf "$OUT"
mkdir -p "$OUT"

# ------------------------------------------------------------------ leftovers, CRD, images
delete_ours       # of a --keep run
vmkv_stop_webhook # of runs before the chart
uninstall
k delete -f "$VMKV_DIR/../cluster/manifests/vhostmq.yaml" --ignore-not-found --wait=true --timeout 90s >/dev/null 2>&1 || true
k apply -f "$VMKV_DIR/../cluster/manifests/nad-crd.yaml" >/dev/null # Multus' CRD: the chart's NAD needs it
k wait --for=condition=Established crd/network-attachment-definitions.k8s.cni.cncf.io --timeout 30s >/dev/null
vmqc_import "$VMKV_GUEST_TAR" # the guest kernel-boot image as images.sh made it last
bins=() up_bins=()
for b in "${BUNDLE[@]}"; do bins+=("$BIN_DIR/$b"); done
"$VMKV_DIR/../cluster/images.sh" --bundle "$IMAGE_REPO:dev" "${bins[@]}"
# rebuilt: the same sources linked stripped (-s -w, as the Dockerfile does), so another image
mkdir -p "$work/upgrade"
(cd "$VMQ_REPO_ROOT" && CGO_ENABLED=0 timeout 900 go build -trimpath -ldflags='-s -w' -o "$work/upgrade/" ./cmd/...) ||
    vmq_die "rebuilding the binaries for the upgrade failed"
for b in "${BUNDLE[@]}"; do up_bins+=("$work/upgrade/$b"); done
"$VMKV_DIR/../cluster/images.sh" --bundle "$IMAGE_REPO:upgrade" "${up_bins[@]}"

# the VMs start on the first node (the second is cordoned until the
# migration); the nodes' dataplanes are joined by the vxlan uplink
((TWO_NODES)) && k cordon "$VMQC_NODE2" >/dev/null
# what the test bed registered and installed by hand goes: the chart does it now
unregister_testbed_binding
rm -f "$NODE_CNI_BIN/vhostmq-cni"
t_up=$(vmqc_secs "$t0")

# ------------------------------------------------------------------ specs
export VHOSTMQ_E2E_LOGS=$OUT
export VHOSTMQ_E2E_KUBECONFIG=$VMQC_KUBECONFIG VHOSTMQ_E2E_NETNS=/run/netns/$VMQC_NETNS
export VHOSTMQ_E2E_KUBECTL=$VMQC_BIN/kubectl VHOSTMQ_E2E_NODE=$VMQC_NODE
export VHOSTMQ_E2E_CTR=$VMQC_CTR VHOSTMQ_E2E_CTR_SOCKET=$VMQC_CTR_SOCK
export VHOSTMQ_E2E_TEST_IMAGE=$VMQC_BUSYBOX_IMAGE VHOSTMQ_E2E_NAMESPACE=$DS_NS
export VHOSTMQ_E2E_HELM=$HELM VHOSTMQ_E2E_CHART=$VMQ_REPO_ROOT/charts/vhostmq
export VHOSTMQ_CLUSTER_RUN=$VMQC_RUN VHOSTMQ_CLUSTER_LOGS=$VMQC_LOGS
export VHOSTMQ_E2E_KV_BIN=$BIN_DIR VHOSTMQ_E2E_NODE_CNI_BIN=$NODE_CNI_BIN VHOSTMQ_E2E_NODE_CNI_CONF=$NODE_CNI_CONF
export VHOSTMQ_E2E_IMAGE_REPO=$IMAGE_REPO VHOSTMQ_E2E_SIDECAR_IMAGE=$SIDECAR_IMAGE VHOSTMQ_E2E_KV_GUEST_IMAGE=$VMKV_GUEST_IMAGE
VHOSTMQ_E2E_NODE2="" VHOSTMQ_E2E_NODE2_MNT=""
((TWO_NODES)) && VHOSTMQ_E2E_NODE2=$VMQC_NODE2 VHOSTMQ_E2E_NODE2_MNT=$VMQC_N2_MNT
export VHOSTMQ_E2E_NODE2 VHOSTMQ_E2E_NODE2_MNT
args=(-test.v -test.timeout 70m -ginkgo.timeout 65m -ginkgo.v -ginkgo.label-filter kubevirt
    -ginkgo.junit-report "$OUT/junit.xml")
t1=$(vmq_now)
# go test runs a package's test binary in the package's folder
(cd "$VMQ_REPO_ROOT/test/e2e" && timeout 4200 "$work/e2e.test" "${args[@]}" "${GINKGO_ARGS[@]}") || rc=$?
echo "--- bring-up (specs built, images) ${t_up} s; specs $(vmqc_secs "$t1") s; logs, junit.xml: $OUT"
((rc == 0)) || exit "$rc"
