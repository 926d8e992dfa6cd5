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
# and the NAD CRD (manifests/nad-crd.yaml); each check printed as ok/FAIL with
# its time (run in this order: (d) first, because (b)/(c) take all 8 slots):
#   (a) NAD vhu-net (resourceName vhostmq.io/queue-pairs, type vhostmq-cni)
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
#       of both ports carried traffic both ways (dataplane counters); port
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
# Ends with "N passed, N failed"; exits non-zero if anything failed.  Kept in
# /var/log/vhostmq-cluster: multus-lite.log (every ADD/DEL with its timings),
# test-cni.serial-{a,b}.log (guest consoles), test-cni.{dataplane,deviceplugin}.log,
# and on failure test-cni-diagnostics.txt.
#
# Usage: hack/cluster/test-cni.sh [--keep]
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
#                          multus-lite state the node uses, and the guests'
#                          serial logs (kept with --keep, removed after down)
#   VHOSTMQ_TEST_GUEST_TIMEOUT=150   bound on boot, link and traffic (s)
#   VHOSTMQ_TEST_RECLAIM_TIMEOUT=90  how long (e) waits for the reclaim
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$HERE/lib.sh"
VMQ_TAG=test-cni

KEEP=0
case ${1:-} in
    --keep) KEEP=1 ;;
    "") ;;
    -h | --help) vmq_usage "$0"; exit 0 ;;
    *) vmq_die "unknown argument $1 (see --help)" ;;
esac
RES=vhostmq.io/queue-pairs
NS=vhostmq-system
SOCK_DIR=/var/run/vhostmq
DEVINFO_CNI=/var/run/k8s.cni.cncf.io/devinfo/cni
API_SOCK=/run/vhostmq/api.sock
TDIR=${VHOSTMQ_TEST_CNI_DIR:-/run/vhostmq-test-cni}
GUEST_TIMEOUT=${VHOSTMQ_TEST_GUEST_TIMEOUT:-150}
RECLAIM_TIMEOUT=${VHOSTMQ_TEST_RECLAIM_TIMEOUT:-90}
IMAGE=localhost/vhostmq:dev
MLOG=$VMQC_LOGS/multus-lite.log
WANT_DEVINFO='{"type":"vhost-user","version":"1.1.0","vhost-user":{"mode":"server","path":"/var/run/vhostmq/net1.sock"}}'
B_MAC=52:54:00:c0:ff:0b
passed=0 failed=0 we_started=0 crd_made=0 t_test=$(vmq_now)
declare -A T_RUN=() T_ADD=() T_NET1=() SLOTS=() MAC=() PORT=()
T_BAD=- T_PODS_GONE=- T_PORTS_GONE=- T_RECLAIM=- RTT_AB=- RTT_AB2=- RTT_BA=- IPERF=-
work=$(mktemp -d)

k() { vmqc_kubectl "$@"; }
ctl() { timeout 20 "$bins/vhostmqctl" --socket "$API_SOCK" "$@"; }
# shellcheck source-path=SCRIPTDIR source=checks.sh
source "$HERE/checks.sh"

delete_ours() { # the test's pods and NAD (CNI DEL runs for the pods); no CRD yet is fine
    k delete pod -l app=vhostmq-cni-test --ignore-not-found --grace-period 5 --wait=true --timeout 60s >/dev/null 2>&1 || true
    k delete network-attachment-definitions.k8s.cni.cncf.io vhu-net --ignore-not-found --timeout 30s >/dev/null 2>&1 || true
}

cleanup() {
    local rc=$?
    set +e
    if ((failed > 0 || rc != 0)) && vmqc_is_up; then diagnostics; fi
    if ((KEEP)); then
        vmq_log "--keep: leaving the cluster, the test objects and $TDIR up"
    elif ((we_started)); then
        "$HERE/cluster.sh" down # pods first: CNI DEL needs $TDIR
        rm -rf "$TDIR"
    elif vmqc_is_up; then
        delete_ours
        k delete -f "$HERE/manifests/vhostmq.yaml" --ignore-not-found --wait=true --timeout 60s >/dev/null 2>&1
        ((crd_made)) && k delete -f "$HERE/manifests/nad-crd.yaml" --ignore-not-found --timeout 30s >/dev/null 2>&1
    fi
    rm -rf "$work"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

diagnostics() {
    local f=$VMQC_LOGS/test-cni-diagnostics.txt p
    {
        echo "=== pods"; k get pods -A -o wide
        echo "=== events"; k get events -A --sort-by .lastTimestamp | tail -n 40
        echo "=== multus-lite log"; tail -n 60 "$MLOG"
        echo "=== containerd CNI errors"; grep -E 'level=error' "$VMQC_LOGS/containerd.log" | tail -n 20 | cut -c1-600
        echo "=== ports"; ctl -o wide port list
        for p in vm-a vm-b; do
            echo "=== $p log"; k logs "$p" --tail 20
            echo "=== $p serial"; tail -n 25 "$TDIR/guests/serial-${p#vm-}.log"
        done
        echo "=== dataplane log"; k -n "$NS" logs ds/vhostmq -c dataplane --tail 40
        echo "=== deviceplugin log"; k -n "$NS" logs ds/vhostmq -c deviceplugin --tail 40
        echo "=== folders"; find "$SOCK_DIR" "$DEVINFO_CNI" "$TDIR/state" -maxdepth 2 -ls
    } >"$f" 2>&1
    echo "diagnostics: $f"
}

# ------------------------------------------------------------------ binaries
vmq_need_root
for c in qemu-system-x86_64 jq; do command -v "$c" >/dev/null || vmq_die "$c missing: run hack/install-deps.sh"; done
bins=$work/bin
mkdir -p "$bins"
if [[ -n ${VHOSTMQ_TEST_BIN_DIR:-} ]]; then
    cp "$VHOSTMQ_TEST_BIN_DIR"/vhostmq* "$VHOSTMQ_TEST_BIN_DIR"/multus-lite "$bins/"
else
    vmq_log "building ./cmd/... and ./hack/cluster/multus-lite (CGO_ENABLED=0) into $bins"
    (cd "$VMQ_REPO_ROOT" && CGO_ENABLED=0 timeout 900 go build -trimpath -o "$bins/" ./cmd/... ./hack/cluster/multus-lite) ||
        vmq_die "go build failed"
fi
for b in vhostmq-dataplane vhostmq-deviceplugin vhostmqctl vhostmq-cni multus-lite; do
    [[ -x $bins/$b ]] || vmq_die "$b was not built"
    vmqc_check_static "$bins/$b"
done
vmq_build_guest # hack/guest/build.sh into _output/guest (a no-op when up to date)
vmq_guest_env
[[ -n ${GUEST_VMLINUX:-} && -f $GUEST_VMLINUX ]] || vmq_die "the guest image has no vmlinux (hack/guest/build.sh)"

# install_cni: the CNI binaries the node runs, replaced atomically (the
# cluster's CNI bin folder links to them)
install_cni() {
    local b
    mkdir -p "$TDIR/bin" "$TDIR/state" "$TDIR/guests"
    for b in multus-lite vhostmq-cni; do
        cp "$bins/$b" "$TDIR/bin/.$b.new"
        mv -f "$TDIR/bin/.$b.new" "$TDIR/bin/$b"
    done
}

# ------------------------------------------------------------------ cluster
# multus-lite's own conflist (the only one in the node's CNI folder) and the
# default network it delegates to: the bridge + host-local conflist that
# cluster.sh writes when it is not given one
if vmqc_is_up; then
    vmq_log "using the cluster that is up"
    if ! grep -qs "\"clusterNetwork\": \"$TDIR/default.conflist\"" "$VMQC_RUN/cni/net.d/00-multus-lite.conflist" ||
        [[ $(readlink "$VMQC_RUN/cni/bin/vhostmq-cni") != "$TDIR/bin/vhostmq-cni" ]]; then
        vmq_die "the cluster that is up does not run multus-lite from $TDIR as its CNI; take it down ($HERE/cluster.sh down) and run this test again"
    fi
    install_cni
else
    rm -rf "$TDIR"
    install_cni
    vmqc_multus_lite_conflists "$TDIR" "$MLOG"
    we_started=1
    VHOSTMQ_CLUSTER_CNI_CONFLIST=$TDIR/00-multus-lite.conflist \
        VHOSTMQ_CLUSTER_CNI_PLUGINS="$TDIR/bin/multus-lite $TDIR/bin/vhostmq-cni" "$HERE/cluster.sh" up
fi
BRINGUP=$(cat "$VMQC_RUN/timings")
# multus-lite's log lines of this run (a cluster kept up keeps older ones)
mlog0=0
[[ -f $MLOG ]] && mlog0=$(wc -l <"$MLOG")
mlog() { tail -n +"$((mlog0 + 1))" "$MLOG" 2>/dev/null || true; }
echo "--- the node's CNI is multus-lite (a Multus stand-in, NOT Multus): $(cd "$VMQC_RUN/cni/net.d" && echo *)"
delete_ours # leftovers of an earlier --keep run
k delete -f "$HERE/manifests/vhostmq.yaml" --ignore-not-found --wait=true --timeout 90s >/dev/null
"$HERE/images.sh" --bundle "$IMAGE" "$bins"/vhostmq-dataplane "$bins"/vhostmq-deviceplugin "$bins"/vhostmqctl
vmqc_ctr images ls -q | grep -x "$VMQC_BUSYBOX_IMAGE" >/dev/null || vmqc_import "$VMQC_IMAGES/busybox.tar"

step "the vhostmq DaemonSet"
k apply -f "$HERE/manifests/vhostmq.yaml" >/dev/null
ds_ready() { k -n "$NS" wait --for=condition=Ready pod -l app.kubernetes.io/name=vhostmq --timeout 5s >/dev/null 2>&1; }
check "DaemonSet pod Running" vmqc_poll 90 1 ds_ready
alloc_8() { [[ $(k get --raw "/api/v1/nodes/$VMQC_NODE" | jq -r --arg r "$RES" '.status.allocatable[$r] // 0') == 8 ]]; }
check "node allocatable $RES = 8" vmqc_poll 60 0.2 alloc_8

# ------------------------------------------------------------------ (a)
step "(a) NetworkAttachmentDefinition vhu-net"
k get crd network-attachment-definitions.k8s.cni.cncf.io >/dev/null 2>&1 || crd_made=1
vmqc_apply_nad "$RES"
check "(a) NAD vhu-net exists with resourceName $RES" \
    test "$(k get network-attachment-definitions.k8s.cni.cncf.io vhu-net -o jsonpath='{.metadata.annotations.k8s\.v1\.cni\.cncf\.io/resourceName}')" = "$RES"
echo "    spec.config: $(k get network-attachment-definitions.k8s.cni.cncf.io vhu-net -o jsonpath='{.spec.config}')"

# The Helm chart's rendering, validated by this API server (Kubernetes 1.37
# schemas, admission, the NAD CRD): server-side dry run, nothing created
# but a scratch namespace. hack/manifests.sh builds and caches helm.
step "(a) charts/vhostmq renders and passes server-side validation"
helm=${VHOSTMQ_TOOLS:-/var/cache/vhostmq/tools}/helm-v3.22.0
[[ -x $helm ]] || "$HERE/../manifests.sh" >/dev/null
chart_ns=vhostmq-chart-check
chart_check() { # SETS: the chart rendered with them, validated by the API server
    k create namespace "$chart_ns" >/dev/null 2>&1 || true
    "$helm" template vhostmq "$HERE/../../charts/vhostmq" --namespace "$chart_ns" --kube-version 1.37.2 \
        --set "metrics.enabled=true,metrics.scrapeAnnotations=true${1:+,$1}" >"$work/chart.yaml" || return 1
    k apply --dry-run=server -f "$work/chart.yaml" >"$work/chart-dryrun.log" 2>&1
}
# each uplink mode (host network and the capabilities it needs), DRA,
# and each metrics exposure (the scrape annotations need one beyond
# localhost, which is where a host-network pod binds by default)
for sets in "" "uplink.mode=tap,uplink.tap.attach=br0,networkAttachmentDefinition.uplink=tap,metrics.bind=podIP,metrics.auth=kubernetes" \
    "uplink.mode=af_xdp,uplink.af_xdp.interface=eth1,networkAttachmentDefinition.uplink=af_xdp,metrics.bind=all,metrics.auth=tls,metrics.tls.secretName=metrics-tls,metrics.tls.clientCASecretName=metrics-ca" \
    "dra.enabled=true,namespace.create=true"; do
    chart_ok=0
    chart_check "$sets" && chart_ok=1
    check "(a) helm template ${sets:+--set $sets }| kubectl apply --dry-run=server: $(grep -c '^kind:' "$work/chart.yaml" 2>/dev/null || echo 0) objects valid" test "$chart_ok" = 1
    ((chart_ok)) || sed 's/^/    /' "$work/chart-dryrun.log" 2>/dev/null || true
done
k delete namespace "$chart_ns" --ignore-not-found --wait=false >/dev/null 2>&1 || true

# pod NAME NETWORKS EXTRA_ANNOTATION_LINE: a busybox pod asking for 4 queue pairs
bad_pod() {
    cat <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: $1
  namespace: default
  labels: {app: vhostmq-cni-test}
  annotations:
    k8s.v1.cni.cncf.io/networks: '$2'
    $3
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  automountServiceAccountToken: false
  containers:
    - name: c
      image: $VMQC_BUSYBOX_IMAGE
      imagePullPolicy: Never
      command: ["/bin/sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"]
      resources:
        limits: {$RES: 4}
EOF
}
# ports_of POD: the dataplane's ports (JSON, one a line) of POD
ports_of() { ctl -o json port list | jq -c --arg p "$1" '.ports[] | select(.labels["k8s.pod.name"] == $p)'; }
# FailedCreatePodSandBox events of this POD (by UID: a kept cluster has
# events of earlier pods of the same name)
sandbox_events() {
    k get events -n default --field-selector "involvedObject.uid=$(k get pod "$1" -o jsonpath='{.metadata.uid}'),reason=FailedCreatePodSandBox" -o json
}
sandbox_event() { sandbox_events "$1" | jq -e --arg t "$2" '[.items[].message | select(contains($t))] | length > 0' >/dev/null; }
event_msg() { sandbox_events "$1" | jq -r '.items[0].message' | sed 's/.*failed (add): multus-lite: /    multus-lite: /'; }

# ------------------------------------------------------------------ (d)
step "(d) bad vhostmq.io annotations fail the sandbox"
bad_pod bad-queues 'default/vhu-net@net1' 'vhostmq.io/queues: "9"' | k create -f - >/dev/null
bad_pod bad-polling 'vhu-net' 'vhostmq.io/polling: spin' | k create -f - >/dev/null
t_bad=$(vmq_now)
check "(d) bad-queues: FailedCreatePodSandBox names vhostmq.io/queues" \
    vmqc_poll 60 0.5 sandbox_event bad-queues 'pod annotation vhostmq.io/queues asks for 9 queue pairs, the pod has 4 allocated'
event_msg bad-queues
check "(d) bad-polling: FailedCreatePodSandBox names vhostmq.io/polling" \
    vmqc_poll 60 0.5 sandbox_event bad-polling 'pod annotation vhostmq.io/polling: "spin" is not interrupt, adaptive or busy'
event_msg bad-polling
T_BAD=$(vmqc_secs "$t_bad")
check "(d) both pods Pending" test "$(k get pod bad-queues bad-polling -o jsonpath='{.items[*].status.phase}')" = "Pending Pending"
check "(d) no port for bad-queues or bad-polling" test -z "$(ports_of bad-queues)$(ports_of bad-polling)"
rolled_back() { # POD...: multus-lite ran DEL of net1 after a failed ADD of each POD
    local p
    for p in "$@"; do mlog | grep -E "ADD default/$p [0-9a-f]+ deleted default/vhu-net net1 deviceID=" >/dev/null || return 1; done
}
check "(d) multus-lite rolled back (DEL of net1 and eth0) after each failed ADD" rolled_back bad-queues bad-polling
k delete pod bad-queues bad-polling --grace-period 1 --wait=true --timeout 60s >/dev/null
check "(d) pods deleted: no device-info file in $DEVINFO_CNI, no multus-lite cache" \
    test -z "$(find "$DEVINFO_CNI" "$TDIR/state" -maxdepth 1 -type f 2>/dev/null)"

# ------------------------------------------------------------------ (b)
# The virt-launcher stand-in: QEMU (host binary) on the socket and MAC that
# network-status names (downward API), queues = the pod's slots.
cat >"$TDIR/guests/launch.sh" <<'EOF'
#!/bin/sh
PATH=/bin
ann=/etc/podinfo/annotations
i=0
until grep -q '^k8s.v1.cni.cncf.io/network-status=' "$ann"; do
    i=$((i + 1))
    [ $i -le 600 ] || { echo "launch: no network-status in $ann after 60 s"; exit 1; }
    sleep 0.1
done
st=$(sed -n 's/^k8s.v1.cni.cncf.io\/network-status="\(.*\)"$/\1/p' "$ann" | sed 's/\\"/"/g')
rest=${st#*'"interface":"net1"'}
m=${rest#*'"mac":"'}
mac=${m%%\"*}
p=${rest#*'"path":"'}
sock=${p%%\"*}
q=$(echo "$VHOSTMQ_QUEUE_SLOTS" | tr ',' '\n' | grep -c .)
echo "launch: net1 mac=$mac socket=$sock queues=$q slots=$VHOSTMQ_QUEUE_SLOTS (network-status after $i polls)"
/usr/bin/qemu-system-x86_64 -accel tcg -machine q35 -m 256 -smp 1 \
    -nodefaults -display none -monitor none -no-reboot \
    -object memory-backend-memfd,id=mem0,size=256M,share=on -numa node,memdev=mem0 \
    -kernel /guest/vmlinux -initrd /guest/initramfs.cpio.gz \
    -append "console=ttyS0 panic=-1 loglevel=4 vmq.queues=$q $GUEST_ARGS" \
    -chardev "socket,id=c0,path=$sock,server=on,wait=off" \
    -netdev "vhost-user,id=n0,chardev=c0,queues=$q" \
    -device "virtio-net-pci,netdev=n0,mac=$mac,mq=on,vectors=0" \
    -serial "file:/out/serial-$GUEST_NAME.log" &
pid=$!
trap 'kill -TERM $pid; wait $pid; echo "launch: QEMU exited ($?) on SIGTERM"; exit 0' TERM
wait $pid
echo "launch: QEMU exited: $?"
EOF
chmod 0755 "$TDIR/guests/launch.sh"
chown 107:107 "$TDIR/guests"
rm -f "$TDIR"/guests/serial-*.log

# vm_pod NAME GUEST NETWORKS GUEST_ARGS
vm_pod() {
    cat <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: $1
  namespace: default
  labels: {app: vhostmq-cni-test}
  annotations:
    k8s.v1.cni.cncf.io/networks: '$3'
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 10
  automountServiceAccountToken: false
  securityContext: {runAsUser: 107, runAsGroup: 107}
  containers:
    - name: qemu
      image: $VMQC_BUSYBOX_IMAGE
      imagePullPolicy: Never
      command: ["/bin/sh", "/out/launch.sh"]
      env:
        - {name: GUEST_NAME, value: $2}
        - {name: GUEST_ARGS, value: "vmq.name=$2 $4 vmq.duration=600 vmq.interval=0.5"}
      resources:
        limits: {$RES: 4}
      volumeMounts:
        - {name: usr, mountPath: /usr, readOnly: true}
        - {name: lib, mountPath: /lib, readOnly: true}
        - {name: lib64, mountPath: /lib64, readOnly: true}
        - {name: guest, mountPath: /guest, readOnly: true}
        - {name: out, mountPath: /out}
        - {name: podinfo, mountPath: /etc/podinfo, readOnly: true}
  volumes:
    - {name: usr, hostPath: {path: /usr, type: Directory}}
    - {name: lib, hostPath: {path: /lib}}
    - {name: lib64, hostPath: {path: /lib64}}
    - {name: guest, hostPath: {path: $(dirname "$GUEST_VMLINUX"), type: Directory}}
    - {name: out, hostPath: {path: $TDIR/guests, type: Directory}}
    - name: podinfo
      downwardAPI:
        items: [{path: annotations, fieldRef: {fieldPath: metadata.annotations}}]
EOF
}

step "(b) two pods on vhu-net, 4 queue pairs each"
t_pods=$(vmq_now)
vm_pod vm-a a 'vhu-net' 'vmq.ip=10.0.0.1/24 vmq.peer=10.0.0.2 vmq.role=client,spoof,pinger vmq.pings=10 vmq.streams=32 vmq.time=2 vmq.victim=10.0.0.9 vmq.victimmac=02:00:00:00:00:99' |
    k create -f - >/dev/null
vm_pod vm-b b "[{\"name\":\"vhu-net\",\"namespace\":\"default\",\"interface\":\"net1\",\"mac\":\"$B_MAC\"}]" \
    'vmq.ip=10.0.0.2/24 vmq.peer=10.0.0.1 vmq.role=server,pinger' | k create -f - >/dev/null
running() { [[ $(k get pod "$1" -o jsonpath='{.status.phase}') == Running ]]; }
for p in vm-a vm-b; do
    if vmqc_poll 90 0.2 running "$p"; then T_RUN[$p]=$(vmqc_secs "$t_pods"); pass "(b) $p Running (${T_RUN[$p]} s after create)"; else fail "(b) $p Running"; fi
done
status_json() { k get pod "$1" -o json | jq -c '.metadata.annotations["k8s.v1.cni.cncf.io/network-status"] // "[]" | fromjson'; }
# sorted_csv CSV: the IDs sorted, comma-separated
sorted_csv() { tr ',' '\n' <<<"$1" | sed '/^$/d' | sort | paste -sd,; }
alloc_dir_of() { # POD: the host folder mounted at /var/run/vhostmq (its container's mountinfo)
    local cid pid
    cid=$(k get pod "$1" -o jsonpath='{.status.containerStatuses[0].containerID}')
    pid=$(vmqc_ctr tasks ls | awk -v id="${cid#containerd://}" '$1 == id { print $2 }')
    awk -v m="$SOCK_DIR" '$5 == m { print $4 }' "/proc/${pid:-0}/mountinfo" 2>/dev/null | sed 's#.*/##'
}
for p in vm-a vm-b; do
    st=$(status_json "$p") || st='[]'
    net1=$(jq -c '.[] | select(.interface == "net1")' <<<"$st")
    eth0=$(jq -c '.[] | select(.interface == "eth0")' <<<"$st")
    MAC[$p]=$(jq -r '.mac // ""' <<<"$net1")
    echo "    $p network-status: $st"
    check "(b) $p network-status: eth0 default network with the pod IP" \
        test "$(jq -r '"\(.name) \(.default) \(.ips[0])"' <<<"$eth0")" = "vhostmq-cluster true $(k get pod "$p" -o jsonpath='{.status.podIP}')"
    check "(b) $p network-status: net1 of default/vhu-net with device-info $WANT_DEVINFO" \
        test "$(jq -cS '[.name, .["device-info"]]' <<<"$net1")" = "$(jq -cS --argjson d "$WANT_DEVINFO" -n '["default/vhu-net", $d]')"
    # shellcheck disable=SC2016  # expanded in the pod
    SLOTS[$p]=$(sorted_csv "$(k exec "$p" -- /bin/sh -c 'echo $VHOSTMQ_QUEUE_SLOTS' 2>/dev/null || true)")
    PORT[$p]=$(ports_of "$p" || true)
    echo "    $p VHOSTMQ_QUEUE_SLOTS (sorted) ${SLOTS[$p]}; port $(jq -c '{id, queue_pairs, slots, socket, mac, role}' <<<"${PORT[$p]:-null}")"
    check "(b) $p: one port, 4 queue pairs on exactly its 4 slots" \
        test "$(jq -s -r '"\(length) \(.[0].queue_pairs) \(.[0].slots | sort | join(","))"' <<<"${PORT[$p]}")" = "1 4 ${SLOTS[$p]}"
    adir=$(alloc_dir_of "$p" || true)
    check "(b) $p: port socket is net1.sock in its allocation folder ${adir:-?}" \
        test "$(jq -r .socket <<<"${PORT[$p]}")" = "$SOCK_DIR/${adir:-?}/net1.sock"
    check "(b) $p: port MAC = network-status MAC (${MAC[$p]:-none})" test "$(jq -r .mac <<<"${PORT[$p]:-null}")" = "${MAC[$p]:-none}"
    # multus-lite's log: the deviceID it passed and how long the ADD took
    line=$(mlog | grep -E "ADD default/$p [0-9a-f]+ default/vhu-net net1 deviceID=" | tail -n 1)
    dev=$(sed -n 's/.* deviceID=\([^ ]*\) ok.*/\1/p' <<<"$line")
    T_NET1[$p]=$(sed -n 's/.* ok (\([0-9.]*\)s)$/\1/p' <<<"$line")
    T_ADD[$p]=$(mlog | grep -E "ADD default/$p [0-9a-f]+ done: " | tail -n 1 | sed -n 's/.*total \([0-9.]*\)s$/\1/p')
    check "(b) $p: deviceID ${dev:-none} = its first sorted slot (Multus index 0)" test "${dev:-none}" = "${SLOTS[$p]%%,*}"
    echo "    $p multus-lite ADD: net1 (vhostmq-cni) ${T_NET1[$p]:-?} s, whole ADD ${T_ADD[$p]:-?} s"
done
check "(b) vm-b (JSON form with mac) got MAC $B_MAC" test "${MAC[vm-b]}" = "$B_MAC"
check "(b) vm-a and vm-b hold all 8 slots, none twice" \
    test "$(sorted_csv "${SLOTS[vm-a]},${SLOTS[vm-b]}" | tr ',' '\n' | sort -u | wc -l)" = 8
check "(b) two CNI device-info files in $DEVINFO_CNI, equal to network-status device-info" \
    test "$(find "$DEVINFO_CNI" -name 'default-vhu-net-*_net1' -exec jq -cS . {} \; | paste -sd' ')" = \
    "$(jq -cS . <<<"$WANT_DEVINFO") $(jq -cS . <<<"$WANT_DEVINFO")"

# ------------------------------------------------------------------ (c)
step "(c) QEMU in each pod on the network-status socket; guests ping each other"
serial() { echo "$TDIR/guests/serial-$1.log"; }
qemu_args() { k logs "vm-$1" 2>/dev/null | grep -F "net1 mac=${MAC[vm-$1]} socket=/var/run/vhostmq/net1.sock queues=4" >/dev/null; }
for g in a b; do
    check "(c) vm-$g: QEMU uses socket /var/run/vhostmq/net1.sock and MAC ${MAC[vm-$g]} from network-status" \
        vmqc_poll 30 0.5 qemu_args "$g"
done
k logs vm-a 2>/dev/null | sed 's/^/    vm-a: /'
connected() { ctl -o json port list | jq -e '[.ports[] | select(.status.connected)] | length == 2' >/dev/null; }
check "(c) the dataplane dialled both QEMUs (ports connected)" vmqc_poll 60 0.5 connected
for g in a b; do
    if vmq_wait_log "$(serial $g)" '^VHOSTMQ-RESULT link ' "$GUEST_TIMEOUT"; then
        q="$(vmq_result "$(serial $g)" queues rx)/$(vmq_result "$(serial $g)" queues tx)"
        echo "    guest $g: booted at uptime $(vmq_result "$(serial $g)" boot uptime) s, link $(vmq_result "$(serial $g)" link state) at $(vmq_result "$(serial $g)" link uptime) s, queues rx/tx $q"
        check "(c) guest $g reports 4 rx + 4 tx queues" test "$q" = 4/4
        check "(c) guest $g eth0 up with MAC ${MAC[vm-$g]}" \
            test "$(vmq_result "$(serial $g)" link state) $(vmq_result "$(serial $g)" link mac)" = "up ${MAC[vm-$g]}"
    else
        fail "(c) guest $g booted and brought eth0 up within $GUEST_TIMEOUT s"
    fi
done
if vmq_wait_log "$(serial a)" '^VHOSTMQ-RESULT role-done role=client ' "$GUEST_TIMEOUT"; then
    la=$(serial a)
    RTT_AB="$(vmq_result "$la" ping rtt_min_ms)/$(vmq_result "$la" ping rtt_avg_ms)/$(vmq_result "$la" ping rtt_max_ms)"
    check "(c) guest a pings b: $(vmq_result "$la" ping received)/$(vmq_result "$la" ping sent) replies, rtt min/avg/max $RTT_AB ms" \
        test "$(vmq_result "$la" reach ok) $(vmq_result "$la" ping received)" = "1 $(vmq_result "$la" ping sent)"
    # iperf3 is there to put traffic on the queues (checked below against
    # the guests' own counters); its result is shown, not judged: on a busy
    # 2-core machine TCG guests starve and streams can sit in TCP backoff
    IPERF="$(tr -d '\r' <"$la" | awk '$2 == "iperf" { for (i = 3; i <= NF; i++) if ($i ~ /^(dir|rc|receiver_mbps)=/) printf "%s ", $i }')"
    echo "    note: iperf3 -P 32 -t 2 a -> b, b -> a: $IPERF(TCG-bound, not judged)"
else
    fail "(c) guest a finished pinging b and iperf3 within $GUEST_TIMEOUT s"
fi
# port security (the CNI's ports carry the pod's MAC; vhu-net has no IPAM,
# so only MACs are checked): guest a's pings to b from another MAC
if vmq_wait_log "$(serial a)" '^VHOSTMQ-RESULT role-done role=spoof ' "$GUEST_TIMEOUT"; then
    spoof_step() { vmq_spoof "$(serial a)" "$1"; }
    spoofed_of() { ctl -o json stats --interval 0 | jq -r --arg pod "default/vm-$1" '[.ports[] | select(.pod == $pod) | .queues[].drops.spoofed] | add // 0'; }
    echo "    guest a's pings to b answered: own MAC $(spoof_step own)/3, from 02:00:00:00:00:99 $(spoof_step victim-mac)/3, own MAC again $(spoof_step after)/3; spoofed drops at a $(spoofed_of a), at b $(spoofed_of b)"
    check "(c) port security: guest a's pings from a MAC not its port's got no reply, its own before and after did" \
        awk -v o="$(spoof_step own)" -v v="$(spoof_step victim-mac)" -v a="$(spoof_step after)" 'BEGIN { exit !(o > 0 && v == "0" && a > 0) }'
    check "(c) port security: a's port counted spoofed frames, b's none" test "$(spoofed_of a | awk '{ print ($1 > 0) }') $(spoofed_of b)" = "1 0"
else
    fail "(c) guest a finished its port security steps within $GUEST_TIMEOUT s"
fi
# then both guests ping each other every 0.5 s (role pinger; guest b has been
# since its boot): the RTTs of the next 10 replies each, with no iperf3 load
pings() { vmq_count_log "$(serial "$1")" '^VHOSTMQ-PING ok'; }
rtt() { # GUEST FROM: min/avg/max of the ping replies after the FROM-th
    tr -d '\r' <"$(serial "$1")" | awk -v from="$2" '/^VHOSTMQ-PING ok/ && ++c > from {
        sub(/rtt_ms=/, "", $6); v = $6 + 0; s += v; n++; if (!n0++ || v < m) m = v; if (v > x) x = v }
        END { if (n) printf "%.3f/%.3f/%.3f", m, s / n, x; else print "-" }'
}
n_a=$(pings a) n_b=$(pings b)
ten_more() { (($(pings a) >= n_a + 10 && $(pings b) >= n_b + 10)); }
if vmqc_poll 60 0.5 ten_more; then
    RTT_AB2=$(rtt a "$n_a") RTT_BA=$(rtt b "$n_b")
    pass "(c) guests ping each other, 10 replies each way: rtt min/avg/max a -> b $RTT_AB2 ms, b -> a $RTT_BA ms"
else
    fail "(c) guests ping each other (10 more replies each way within 60 s: a $(($(pings a) - n_a)), b $(($(pings b) - n_b)))"
fi
# used_served G: every queue guest G used during its iperf3 traffic, by its
# own counters (ethtool -S, from its guest-queues line before the traffic to
# its last), was served on that pair of its port (which queues a guest uses
# is its choice: XPS and the flow hash), and some pair carried frames each
# way. Prints what it saw when it fails.
used_served() {
    local first last
    first=$(tr -d '\r' <"$(serial "$1")" | grep -E '^VHOSTMQ-RESULT guest-queues (phase=traffic|session=0) ' | head -n1)
    last=$(tr -d '\r' <"$(serial "$1")" | grep '^VHOSTMQ-RESULT guest-queues ' | tail -n1)
    [[ -n $first && $first != "$last" ]] || { echo "    guest $1: no per-queue counters before and after its traffic"; return 1; }
    ctl -o json stats --interval 0 | jq -r --arg pod "default/vm-$1" '.ports[] | select(.pod == $pod) | .queues[] | "\(.pair) \(.rx.packets) \(.tx.packets)"' |
        awk -v a="$first" -v b="$last" -v g="$1" '
            function c(line, k) { return match(line, " " k "=[0-9]+") ? substr(line, RSTART + length(k) + 2, RLENGTH - length(k) - 2) + 0 : 0 }
            { gt = c(b, "tx_q" $1) - c(a, "tx_q" $1); gr = c(b, "rx_q" $1) - c(a, "rx_q" $1)
              s = s sprintf(" %d: %d/%d %d/%d", $1, gt, $3, gr, $2)
              if ((gt > 0 && $3 + 0 == 0) || (gr > 0 && $2 + 0 == 0)) bad = 1
              if ($3 + 0 > 0) bt = 1; if ($2 + 0 > 0) br = 1 }
            END { if (bad || !bt || !br) { print "    guest " g " (pair guest_tx/dataplane_tx guest_rx/dataplane_rx):" s; exit 1 } }'
}
for g in a b; do
    check "(c) dataplane: every queue guest $g used (its own counters) was served on its pair, frames both ways" vmqc_poll 10 0.5 used_served "$g"
done
ctl -o json stats --interval 0 | jq -r '.ports[] | "    \(.pod) " + ([.queues[] | "\(.slot) rx \(.rx.packets) tx \(.tx.packets)" + (.drops | to_entries | map(select(.key != "total" and .value > 0) | " \(.key) \(.value)") | join(""))] | join(", "))'

# kept for later: the guests' consoles and the DaemonSet's logs
for g in a b; do cp "$(serial $g)" "$VMQC_LOGS/test-cni.serial-$g.log" 2>/dev/null || true; done
for c in dataplane deviceplugin; do k -n "$NS" logs ds/vhostmq -c "$c" >"$VMQC_LOGS/test-cni.$c.log" 2>&1 || true; done

# ------------------------------------------------------------------ (e)
step "(e) pods deleted: ports, sockets, device-info and allocation folders go"
t_del=$(vmq_now)
k delete pod vm-a vm-b --grace-period 10 --wait=true --timeout 60s >/dev/null
T_PODS_GONE=$(vmqc_secs "$t_del")
no_ports() { [[ $(ctl -o json port list | jq '.ports | length') == 0 ]]; }
if vmqc_poll 10 0.2 no_ports; then T_PORTS_GONE=$(vmqc_secs "$t_del"); pass "(e) no ports left"; else fail "(e) no ports left"; fi
for p in vm-a vm-b; do
    check "(e) multus-lite ran DEL for $p's net1 and default network" \
        test "$(mlog | grep -cE "DEL default/$p [0-9a-f]+ deleted (default/vhu-net net1 deviceID=[^ :]+|vhostmq-cluster eth0): err=<nil>")" -ge 2
done
check "(e) QEMU's sockets are gone (no socket under $SOCK_DIR but api.sock)" \
    test -z "$(find "$SOCK_DIR" -mindepth 1 -type s ! -path "$SOCK_DIR/api.sock")"
check "(e) nothing in $DEVINFO_CNI, no multus-lite cache" \
    test -z "$(find "$DEVINFO_CNI" "$TDIR/state" -maxdepth 1 -type f 2>/dev/null)"
only_api_sock() { [[ -z $(find "$SOCK_DIR" -mindepth 1 ! -path "$SOCK_DIR/api.sock") ]]; }
if vmqc_poll "$RECLAIM_TIMEOUT" 0.5 only_api_sock; then
    T_RECLAIM=$(vmqc_secs "$t_del")
    pass "(e) allocation folders reclaimed: only api.sock left in $SOCK_DIR"
else
    fail "(e) allocation folders reclaimed within $RECLAIM_TIMEOUT s: left $(find "$SOCK_DIR" -mindepth 1 ! -path "$SOCK_DIR/api.sock" | tr '\n' ' ')"
fi

# ------------------------------------------------------------------ summary
echo "--- summary"
echo "Multus stand-in: hack/cluster/multus-lite (Multus itself is not built here); QEMU from the host's /usr via hostPath"
echo "cluster bring-up: $BRINGUP (seconds; k8s_build=0 means cached)"
echo "(d) sandbox failures seen in events after $T_BAD s"
for p in vm-a vm-b; do
    echo "$p: Running ${T_RUN[$p]:--} s after create; multus-lite ADD ${T_ADD[$p]:--} s (vhostmq-cni net1 ${T_NET1[$p]:--} s); slots ${SLOTS[$p]:--}; MAC ${MAC[$p]:--}"
done
echo "ping rtt min/avg/max (TCG): a -> b $RTT_AB ms (10 pings before iperf3); then a -> b $RTT_AB2 ms, b -> a $RTT_BA ms"
echo "iperf3 -P 32 -t 2 (TCG-bound, not judged): $IPERF"
echo "teardown: pods gone ${T_PODS_GONE:--} s, ports gone ${T_PORTS_GONE} s after the delete, allocation folders reclaimed after ${T_RECLAIM} s"
echo "test time: $(vmqc_secs "$t_test") s (before teardown)"
echo "$passed passed, $failed failed"
((failed == 0))
