#!/usr/bin/env bash
# The Go cluster specs (test/e2e, build tag e2e; Ginkgo) on the one-node
# test cluster. Bash does the bring-up only: the binaries (static), the
# cluster (cluster.sh up, unless it is up), the image localhost/vhostmq:dev
# and busybox imported, the vhostmq DaemonSet (manifests/vhostmq.yaml)
# applied; then `go test -tags e2e ./test/e2e/` asserts everything, and the
# end takes down what this script brought up.
#
# Usage: hack/cluster/e2e.sh [--keep] [--label-filter EXPR] [-- GINKGO_ARGS...]
#   --keep               leave the cluster and the objects up
#   --label-filter EXPR  the specs to run (Ginkgo labels: deviceplugin)
#   GINKGO_ARGS          passed on, e.g. -- -ginkgo.focus '\(c\)'
# Environment:
#   VHOSTMQ_TEST_BIN_DIR   folder with static vhostmq-dataplane, vhostmqctl and
#                          vhostmq-deviceplugin (default: built from ./cmd/...
#                          with CGO_ENABLED=0 into a temporary folder)
#   VHOSTMQ_DEVICEPLUGIN   a device-plugin binary to use instead (a stand-in)
#   VHOSTMQ_E2E_LOGS       the run's folder: diagnostics of failed specs,
#                          saved logs, junit.xml (default
#                          $VHOSTMQ_CLUSTER_LOGS/e2e/<UTC time>)
#   the specs' own knobs (VHOSTMQ_TEST_REREG_LIMIT, ...) go through as they are
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$HERE/lib.sh"
VMQ_TAG=e2e

KEEP=0 LABELS="" GINKGO_ARGS=()
while (($#)); do
    case $1 in
        --keep) KEEP=1 ;;
        --label-filter) LABELS=${2:?--label-filter needs an expression}; shift ;;
        --) shift; GINKGO_ARGS=("$@"); break ;;
        -h | --help) vmq_usage "$0"; exit 0 ;;
        *) vmq_die "unknown argument $1 (see --help)" ;;
    esac
    shift
done
IMAGE=localhost/vhostmq:dev
MANIFEST=$HERE/manifests/vhostmq.yaml
we_started=0
work=$(mktemp -d)
export VHOSTMQ_E2E_LOGS=${VHOSTMQ_E2E_LOGS:-$VMQC_LOGS/e2e/$(date -u +%Y%m%dT%H%M%SZ)}

k() { vmqc_kubectl "$@"; }

cleanup() {
    local rc=$?
    set +e
    if ((KEEP)); then
        vmq_log "--keep: leaving the cluster and the test objects up"
    elif ((we_started)); then
        "$HERE/cluster.sh" down
    elif vmqc_is_up; then
        k delete pod -l app=vhostmq-test --grace-period 1 --wait=true --timeout 60s >/dev/null 2>&1
        k delete -f "$MANIFEST" --ignore-not-found --wait=true --timeout 60s >/dev/null 2>&1
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
if [[ -n ${VHOSTMQ_TEST_BIN_DIR:-} ]]; then
    cp "$VHOSTMQ_TEST_BIN_DIR"/vhostmq* "$bins/"
else
    vmq_log "building ./cmd/... (CGO_ENABLED=0) into $bins"
    (cd "$VMQ_REPO_ROOT" && CGO_ENABLED=0 timeout 900 go build -trimpath -o "$bins/" ./cmd/...) ||
        vmq_die "go build ./cmd/... failed"
fi
[[ -n ${VHOSTMQ_DEVICEPLUGIN:-} ]] && cp "$VHOSTMQ_DEVICEPLUGIN" "$bins/vhostmq-deviceplugin"
for b in vhostmq-dataplane vhostmq-deviceplugin vhostmqctl; do
    [[ -x $bins/$b ]] || vmq_die "$b was not built (is cmd/$b there? VHOSTMQ_DEVICEPLUGIN=PATH uses a stand-in)"
    vmqc_check_static "$bins/$b"
done
# the specs, compiled before the run (the node's netns reaches no proxy)
vmq_log "building the e2e specs (go test -c -tags e2e ./test/e2e/)"
(cd "$VMQ_REPO_ROOT" && timeout 900 go test -c -tags e2e -o "$work/e2e.test" ./test/e2e/) ||
    vmq_die "building test/e2e failed"

# ------------------------------------------------------------------ cluster
if vmqc_is_up; then
    vmq_log "using the cluster that is up"
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
