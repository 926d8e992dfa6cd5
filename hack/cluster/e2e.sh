#!/usr/bin/env bash
# The Go cluster specs (test/e2e, build tag e2e; Ginkgo) on the one-node
# test cluster. Bash does the bring-up only: the binaries (static), the
# cluster (cluster.sh up, unless it is up), the image localhost/vhostmq:dev
# and busybox imported, the vhostmq DaemonSet (manifests/vhostmq.yaml)
# applied; then `go test -tags e2e ./test/e2e/` asserts everything, and the
# end takes down what this script brought up.
#
# Usage: hack/cluster/e2e.sh [--keep] [--cni] [--label-filter EXPR] [-- GINKGO_ARGS...]
#   --keep               leave the cluster and the objects up
#   --cni                the node's CNI is multus-lite (hack/cluster/multus-lite,
#                        a Multus stand-in) delegating to vhostmq-cni, both
#                        from $VHOSTMQ_TEST_CNI_DIR; the NAD CRD and the NAD
#                        vhu-net applied; the guest image (hack/guest) and helm
#                        built: what the cni specs need (test-cni.sh). A
#                        cluster that is up must have been started so.
#   --label-filter EXPR  the specs to run (Ginkgo labels: deviceplugin, cni)
#   GINKGO_ARGS          passed on, e.g. -- -ginkgo.focus '\(c\)'
# Environment:
#   VHOSTMQ_TEST_BIN_DIR   folder with static vhostmq-dataplane, vhostmqctl and
#                          vhostmq-deviceplugin, with --cni also vhostmq-cni
#                          and multus-lite (default: built from ./cmd/... and
#                          ./hack/cluster/multus-lite with CGO_ENABLED=0 into
#                          a temporary folder)
#   VHOSTMQ_DEVICEPLUGIN   a device-plugin binary to use instead (a stand-in)
#   VHOSTMQ_TEST_CNI_DIR=/run/vhostmq-test-cni   --cni: the CNI binaries and
#                          conflists the node uses, multus-lite's state
#                          (kept with --keep, removed after down)
#   VHOSTMQ_E2E_LOGS       the run's folder: diagnostics of failed specs,
#                          saved logs, junit.xml (default
#                          $VHOSTMQ_CLUSTER_LOGS/e2e/<UTC time>)
#   the specs' own knobs (VHOSTMQ_TEST_REREG_LIMIT, ...) go through as they are
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$HERE/lib.sh"
VMQ_TAG=e2e

KEEP=0 CNI=0 LABELS=""
vmq_args --keep:KEEP=1 --cni:CNI=1 --label-filter=LABELS -- "$@"
GINKGO_ARGS=("${VMQ_REST[@]}")
IMAGE=localhost/vhostmq:dev
MANIFEST=$HERE/manifests/vhostmq.yaml
TDIR=${VHOSTMQ_TEST_CNI_DIR:-/run/vhostmq-test-cni}
we_started=0 crd_made=0
work=$(mktemp -d)
export VHOSTMQ_E2E_LOGS=${VHOSTMQ_E2E_LOGS:-$VMQC_LOGS/e2e/$(date -u +%Y%m%dT%H%M%SZ)}

k() { vmqc_kubectl "$@"; }

cleanup() {
    local rc=$?
    set +e
    if ((KEEP)); then
        vmq_log "--keep: leaving the cluster and the test objects up"
    elif ((we_started)); then
        "$HERE/cluster.sh" down # pods first: CNI DEL needs $TDIR
        ((CNI)) && rm -rf "$TDIR"
    elif vmqc_is_up; then
        k delete pod -l app=vhostmq-test --grace-period 1 --wait=true --timeout 60s >/dev/null 2>&1
        ((CNI)) && k delete network-attachment-definitions.k8s.cni.cncf.io vhu-net --ignore-not-found --timeout 30s >/dev/null 2>&1
        k delete -f "$MANIFEST" --ignore-not-found --wait=true --timeout 60s >/dev/null 2>&1
        ((crd_made)) && k delete -f "$HERE/manifests/nad-crd.yaml" --ignore-not-found --timeout 30s >/dev/null 2>&1
    fi
    rm -rf "$work"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

vmq_need_root
t0=$(vmq_now)
# ------------------------------------------------------------------ binaries
bins=$work/bin
mkdir -p "$bins"
want=(vhostmq-dataplane vhostmq-deviceplugin vhostmqctl) pkgs=(./cmd/...)
((CNI)) && want+=(vhostmq-cni multus-lite) pkgs+=(./hack/cluster/multus-lite)
if [[ -n ${VHOSTMQ_TEST_BIN_DIR:-} ]]; then
    cp "$VHOSTMQ_TEST_BIN_DIR"/vhostmq* "$bins/"
    ((CNI)) && cp "$VHOSTMQ_TEST_BIN_DIR"/multus-lite "$bins/"
else
    vmq_log "building ${pkgs[*]} (CGO_ENABLED=0) into $bins"
    (cd "$VMQ_REPO_ROOT" && CGO_ENABLED=0 timeout 900 go build -trimpath -o "$bins/" "${pkgs[@]}") ||
        vmq_die "go build ${pkgs[*]} failed"
fi
[[ -n ${VHOSTMQ_DEVICEPLUGIN:-} ]] && cp "$VHOSTMQ_DEVICEPLUGIN" "$bins/vhostmq-deviceplugin"
for b in "${want[@]}"; do
    [[ -x $bins/$b ]] || vmq_die "$b was not built (is cmd/$b there? VHOSTMQ_DEVICEPLUGIN=PATH uses a stand-in)"
    vmqc_check_static "$bins/$b"
done
# the specs, compiled before the run (the node's netns reaches no proxy)
vmq_log "building the e2e specs (go test -c -tags e2e ./test/e2e/)"
(cd "$VMQ_REPO_ROOT" && timeout 900 go test -c -tags e2e -o "$work/e2e.test" ./test/e2e/) ||
    vmq_die "building test/e2e failed"
if ((CNI)); then
    # the guests' QEMU is the host's; the chart checks need helm
    for c in qemu-system-x86_64 jq; do command -v "$c" >/dev/null || vmq_die "$c missing: run hack/install-deps.sh"; done
    vmq_build_guest # hack/guest/build.sh into _output/guest (a no-op when up to date)
    vmq_guest_env
    [[ -n ${GUEST_VMLINUX:-} && -f $GUEST_VMLINUX ]] || vmq_die "the guest image has no vmlinux (hack/guest/build.sh)"
    export VHOSTMQ_E2E_GUEST_IMAGE=${GUEST_VMLINUX%/*}
    export VHOSTMQ_E2E_HELM=${VHOSTMQ_TOOLS:-/var/cache/vhostmq/tools}/helm-v3.22.0
    [[ -x $VHOSTMQ_E2E_HELM ]] || "$HERE/../manifests.sh" >/dev/null
fi

# install_cni: the CNI binaries the node runs, replaced atomically (the
# cluster's CNI bin folder links to them)
install_cni() {
    local b
    mkdir -p "$TDIR/bin" "$TDIR/state"
    for b in multus-lite vhostmq-cni; do
        cp "$bins/$b" "$TDIR/bin/.$b.new"
        mv -f "$TDIR/bin/.$b.new" "$TDIR/bin/$b"
    done
}

# ------------------------------------------------------------------ cluster
# --cni: multus-lite's own conflist (the only one in the node's CNI folder)
# and the default network it delegates to, the bridge + host-local
# conflist cluster.sh writes when it is not given one
if vmqc_is_up; then
    vmq_log "using the cluster that is up"
    if ((CNI)); then
        if ! grep -qs "\"clusterNetwork\": \"$TDIR/default.conflist\"" "$VMQC_RUN/cni/net.d/00-multus-lite.conflist" ||
            [[ $(readlink "$VMQC_RUN/cni/bin/vhostmq-cni") != "$TDIR/bin/vhostmq-cni" ]]; then
            vmq_die "the cluster that is up does not run multus-lite from $TDIR as its CNI; take it down ($HERE/cluster.sh down) and run this again"
        fi
        install_cni
    fi
elif ((CNI)); then
    rm -rf "$TDIR"
    install_cni
    vmqc_multus_lite_conflists "$TDIR" "$VMQC_LOGS/multus-lite.log"
    we_started=1
    VHOSTMQ_CLUSTER_CNI_CONFLIST=$TDIR/00-multus-lite.conflist \
        VHOSTMQ_CLUSTER_CNI_PLUGINS="$TDIR/bin/multus-lite $TDIR/bin/vhostmq-cni" "$HERE/cluster.sh" up
else
    we_started=1
    "$HERE/cluster.sh" up
fi
# leftovers of an earlier run on a cluster that stayed up (--keep)
k delete pod -l app=vhostmq-test --ignore-not-found --grace-period 1 --wait=true --timeout 60s >/dev/null
k delete -f "$MANIFEST" --ignore-not-found --wait=true --timeout 90s >/dev/null
"$HERE/images.sh" --bundle "$IMAGE" "$bins"/vhostmq*
vmqc_ctr images ls -q | grep -x "$VMQC_BUSYBOX_IMAGE" >/dev/null || vmqc_import "$VMQC_IMAGES/busybox.tar"
k apply -f "$MANIFEST" >/dev/null
if ((CNI)); then
    k get crd network-attachment-definitions.k8s.cni.cncf.io >/dev/null 2>&1 || crd_made=1
    vmqc_apply_nad vhostmq.io/queue-pairs
    export VHOSTMQ_E2E_CNI_DIR=$TDIR VHOSTMQ_E2E_MULTUS_LOG=$VMQC_LOGS/multus-lite.log
fi
t_up=$(vmqc_secs "$t0")

# ------------------------------------------------------------------ specs
export VHOSTMQ_E2E_KUBECONFIG=$VMQC_KUBECONFIG VHOSTMQ_E2E_NETNS=/run/netns/$VMQC_NETNS
export VHOSTMQ_E2E_KUBECTL=$VMQC_BIN/kubectl VHOSTMQ_E2E_NODE=$VMQC_NODE
export VHOSTMQ_E2E_CTR=$VMQC_CTR VHOSTMQ_E2E_CTR_SOCKET=$VMQC_CTR_SOCK
export VHOSTMQ_E2E_CLUSTER_SH=$HERE/cluster.sh VHOSTMQ_E2E_MANIFEST=$MANIFEST
export VHOSTMQ_E2E_TEST_IMAGE=$VMQC_BUSYBOX_IMAGE
export VHOSTMQ_CLUSTER_RUN=$VMQC_RUN VHOSTMQ_CLUSTER_LOGS=$VMQC_LOGS
mkdir -p "$VHOSTMQ_E2E_LOGS"
args=(-test.v -test.timeout 30m -ginkgo.v -ginkgo.junit-report "$VHOSTMQ_E2E_LOGS/junit.xml")
[[ -n $LABELS ]] && args+=(-ginkgo.label-filter "$LABELS")
t1=$(vmq_now)
rc=0
# go test runs a package's test binary in the package's folder
(cd "$VMQ_REPO_ROOT/test/e2e" && timeout 1900 "$work/e2e.test" "${args[@]}" "${GINKGO_ARGS[@]}") || rc=$?
echo "--- bring-up (binaries, specs, cluster, image, DaemonSet) ${t_up} s; specs $(vmqc_secs "$t1") s; logs: $VHOSTMQ_E2E_LOGS"
((rc == 0)) || exit "$rc"
