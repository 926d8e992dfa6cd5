#!/usr/bin/env bash
# The CNI plugin (cmd/vhostmq-cni) on a real one-node cluster
# (hack/cluster/cluster.sh), called the way Multus calls it.
#
# MULTUS IS NOT USED: it cannot be built here (the Go module proxy does not
# serve it).  The cluster's CNI is hack/cluster/multus-lite, a small stand-in
# that does what Multus does for these pods: the default network
# (bridge + host-local, as cluster.sh writes it) first, then each
# NetworkAttachmentDefinition of the pod's k8s.v1.cni.cncf.io/networks
# annotation with deviceID (the k-th of the pod's sorted devices of the NAD's
# k8s.v1.cni.cncf.io/resourceName, from the kubelet's pod-resources API),
# CNIDeviceInfoFile (the device plugin's device-info file copied there first),
# ifname net1..., then the k8s.v1.cni.cncf.io/network-status annotation.
#
# With the vhostmq DaemonSet (dataplane + device plugin, manifests/vhostmq.yaml)
# and the NAD CRD (manifests/nad-crd.yaml); one Go spec per check, run in
# this order ((d) first, because (b)/(c) take all 8 slots):
#   the DaemonSet pod Running, node allocatable vhostmq.io/queue-pairs = 8
#   (a) NAD vhu-net (resourceName vhostmq.io/queue-pairs, type vhostmq-cni);
#       charts/vhostmq rendered with each uplink mode, metrics exposure and
#       DRA passes this API server's validation (kubectl apply --dry-run=server)
#   (d) pods annotated vhostmq.io/queues: "9" (4 allocated) and vhostmq.io/polling: spin
#       (4 slots each; networks "default/vhu-net@net1" and "vhu-net") fail
#       their sandbox with a FailedCreatePodSandBox event naming the
#       annotation, and leave no port, device-info file or multus-lite cache
#   (b) two pods asking for 4 queue pairs each (all 8 slots), networks
#       "vhu-net" (comma form) and the JSON form with interface and mac, are
#       Running; each has a dataplane port with 4 queue pairs on exactly its 4
#       slots (VHOSTMQ_QUEUE_SLOTS) in its allocation folder, deviceID = its
#       first sorted slot, and network-status lists eth0 and net1 with the
#       device-info {"type":"vhost-user","version":"1.1.0","vhost-user":
#       {"mode":"server","path":"/var/run/vhostmq/net1.sock"}}
#   (c) in each pod a QEMU (stand-in for virt-launcher) reads the socket path
#       and MAC from network-status (downward API), listens there
#       (server=on,wait=off; the dataplane dials), 4 queues, memfd memory; the
#       guests (hack/guest, 256 MiB, TCG) report 4 rx + 4 tx queues and ping
#       each other; after iperf3 -P 32 both ways (result shown, not judged:
#       TCG guests on a busy machine can stall in TCP backoff) every queue pair
#       a guest used (its own counters) was served on that pair of its port,
#       and some pair carried frames each way (the agent's counters); port
#       security on the CNI's ports (vhu-net has no IPAM: MAC only): guest a
#       pinging b from a MAC that is not its port's gets no reply and its
#       frames are counted as spoofed at a's port (none at b's), while its
#       own MAC still reaches b before and after
#   (e) deleting the pods removes the ports, the sockets, the device-info files
#       and (device plugin reclaim) the allocation folders: nothing is left in
#       /var/run/vhostmq but the agent's api.sock, nothing in
#       /var/run/k8s.cni.cncf.io/devinfo/cni
# QEMU in the pods is the host's: the container (busybox image, uid 107 as in
# KubeVirt) mounts the host's /usr, /lib, /lib64 and the guest image folder
# read-only (hostPath) and runs /usr/bin/qemu-system-x86_64 from there.
#
# The bring-up is bash: hack/cluster/e2e.sh --cni (the binaries and
# multus-lite, the cluster with multus-lite as its CNI, the image, the
# DaemonSet, the NAD CRD and NAD, the guest image, helm); the checks are the
# Go specs of test/e2e/cni_test.go (label cni), one per check, in the order
# above (test/e2e/README.md maps each former bash check to its
# spec). Ends with Ginkgo's "N Passed | N Failed"; exits non-zero if anything
# failed. In $VHOSTMQ_CLUSTER_LOGS/e2e/<UTC time>/: guests/serial-{a,b}.log
# (the guests' consoles), multus-lite.log (this run's ADDs and DELs with
# their timings), cni.{dataplane,deviceplugin}.log, junit.xml, and a folder
# of diagnostics per failed spec.
#
# Usage: hack/cluster/test-cni.sh [--keep] [-- GINKGO_ARGS...]
#   Brings the cluster up with multus-lite as its CNI (and down at the end)
#   unless it is already up; a cluster that is up must have been started by
#   this script (--keep), then only what the test made is removed.  --keep
#   leaves everything running.
# Environment:
#   VHOSTMQ_TEST_BIN_DIR   folder with static vhostmq-dataplane, vhostmqctl,
#                          vhostmq-deviceplugin, vhostmq-cni and multus-lite
#                          (default: built with CGO_ENABLED=0 into a temporary
#                          folder from ./cmd/... and ./hack/cluster/multus-lite)
#   VHOSTMQ_TEST_CNI_DIR=/run/vhostmq-test-cni   the CNI binaries, conflists and
#                          multus-lite state the node uses (kept with --keep,
#                          removed after down)
#   VHOSTMQ_TEST_GUEST_TIMEOUT=150   bound on boot, link and traffic (s)
#   VHOSTMQ_TEST_RECLAIM_TIMEOUT=90  how long (e) waits for the reclaim
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
case ${1:-} in
    -h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
esac
exec "$HERE/e2e.sh" --cni --label-filter cni "$@"
