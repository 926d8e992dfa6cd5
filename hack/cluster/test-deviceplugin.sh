#!/usr/bin/env bash
# The device plugin on a real one-node cluster (hack/cluster/cluster.sh): the
# vhostmq DaemonSet (dataplane + device plugin, manifests/vhostmq.yaml) from
# an image of our static binaries, then the Go specs of
# test/e2e/deviceplugin_test.go (label deviceplugin), one per check:
#   (a) node capacity and allocatable vhostmq.io/queue-pairs = 8, equal to the
#       agent's slots_total (its gRPC API on the host)
#   (b) a pod asking for 4 is Running with a mount at /var/run/vhostmq and
#       VHOSTMQ_QUEUE_SLOTS = 4 slot IDs c<cpu>-s<n> spread over the CPUs; a
#       pod asking for 2 gets 2 slots on distinct CPUs
#   (c) after a kubelet restart allocatable is back to 8 (time reported)
#   (d) killing the dataplane process drops allocatable to 0; it is back to
#       8 after the container restarts
#   (e) a pod asking for 9 stays Pending: FailedScheduling, Insufficient ...
#   (f) a deleted pod's allocation is reclaimed while the plugin runs (the
#       other pod's is kept); deleting the other pods and right after them
#       the DaemonSet leaves no allocation folders in /var/run/vhostmq and no
#       files in /var/run/k8s.cni.cncf.io/devinfo/dp
# The bring-up is hack/cluster/e2e.sh's; this runs it for the device-plugin
# specs. Ends with Ginkgo's "N Passed | N Failed"; exits non-zero if anything
# failed. Diagnostics of failed specs, the plugin's and the dataplane's logs
# and junit.xml go to $VHOSTMQ_CLUSTER_LOGS/e2e/<UTC time>/.
#
# Usage: hack/cluster/test-deviceplugin.sh [--keep] [-- GINKGO_ARGS...]
#   Brings the cluster up (and down at the end) unless it is already up; then
#   it only removes what it created.  --keep leaves everything running.
# Environment:
#   VHOSTMQ_TEST_BIN_DIR   folder with static vhostmq-dataplane, vhostmqctl and
#                          vhostmq-deviceplugin (default: built from ./cmd/...
#                          with CGO_ENABLED=0 into a temporary folder)
#   VHOSTMQ_DEVICEPLUGIN   a device-plugin binary to use instead (a stand-in)
#   VHOSTMQ_TEST_REREG_LIMIT, VHOSTMQ_TEST_UNHEALTHY_LIMIT   seconds: when set,
#                          (c) and (d) also fail past them; by default their
#                          times are reported (a busy node's kubelet takes
#                          its time) and only the outcome is asserted
#   VHOSTMQ_TEST_RECLAIM_TIMEOUT=90   how long (f) waits for a freed allocation
#                          to be reclaimed with the plugin still running
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
case ${1:-} in
    -h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
esac
exec "$HERE/e2e.sh" --label-filter deviceplugin "$@"
