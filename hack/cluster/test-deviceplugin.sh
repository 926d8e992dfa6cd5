#!/usr/bin/env bash
# The device plugin on a real one-node cluster (hack/cluster/cluster.sh): the
# vhostmq DaemonSet (dataplane + device plugin, manifests/vhostmq.yaml) from
# an image of our static binaries, then, each printed as ok/FAIL with its time:
#   (a) node capacity and allocatable vhostmq.io/queue-pairs = 8, equal to the
#       agent's slots_total (vhostmqctl capacity on the host)
#   (b) a pod asking for 4 is Running with a mount at /var/run/vhostmq and
#       VHOSTMQ_QUEUE_SLOTS = 4 slot IDs c<cpu>-s<n> spread over the CPUs; a
#       pod asking for 2 gets 2 slots on distinct CPUs
#   (c) after a kubelet restart allocatable is back to 8 in < 5 s
#   (d) killing the dataplane process drops allocatable to 0 within 5 s; it is
#       back to 8 after the container restarts
#   (e) a pod asking for 9 stays Pending: FailedScheduling, Insufficient ...
#   (f) a deleted pod's allocation is reclaimed while the plugin runs (the
#       other pod's is kept); deleting the other pods and right after them
#       the DaemonSet leaves no allocation folders in /var/run/vhostmq and no
#       files in /var/run/k8s.cni.cncf.io/devinfo/dp
# Ends with "N passed, N failed"; exits non-zero if anything failed.
#
# Usage: hack/cluster/test-deviceplugin.sh [--keep]
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
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$HERE/lib.sh"
VMQ_TAG=test-dp

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
DEVINFO=/var/run/k8s.cni.cncf.io/devinfo/dp
API_SOCK=/run/vhostmq/api.sock
REREG_LIMIT=${VHOSTMQ_TEST_REREG_LIMIT:-}
UNHEALTHY_LIMIT=${VHOSTMQ_TEST_UNHEALTHY_LIMIT:-}
RECLAIM_TIMEOUT=${VHOSTMQ_TEST_RECLAIM_TIMEOUT:-90}
IMAGE=localhost/vhostmq:dev
passed=0 failed=0 we_started=0 logs_pid=""
T_REREG=- T_REREG_LOG=- T_DROP=- T_RECOVER=- T_RECLAIM=-
work=$(mktemp -d)

k() { vmqc_kubectl "$@"; }
# ok/FAIL lines: "ok   WHAT (T s)" with T the seconds since the step began
# shellcheck source-path=SCRIPTDIR source=checks.sh
source "$HERE/checks.sh"

node_json() { k get --raw "/api/v1/nodes/$VMQC_NODE" 2>/dev/null; }
allocatable() { node_json | jq -r --arg r "$RES" '.status.allocatable[$r] // "none"'; }
capacity() { node_json | jq -r --arg r "$RES" '.status.capacity[$r] // "none"'; }
alloc_is() { [[ $(allocatable) == "$1" ]]; }

cleanup() {
    local rc=$?
    set +e
    if ((failed > 0 || rc != 0)) && vmqc_is_up; then diagnostics; fi
    if ((KEEP)); then
        vmq_log "--keep: leaving the cluster and the test objects up"
    elif ((we_started)); then
        "$HERE/cluster.sh" down
    elif vmqc_is_up; then
        k delete pod -l app=vhostmq-test --grace-period 1 --wait=true --timeout 60s >/dev/null 2>&1
        k delete -f "$HERE/manifests/vhostmq.yaml" --wait=true --timeout 60s >/dev/null 2>&1
    fi
    [[ -n $logs_pid ]] && kill "$logs_pid" 2>/dev/null
    rm -rf "$work"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

diagnostics() {
    local f=$VMQC_LOGS/test-deviceplugin-diagnostics.txt
    {
        echo "=== pods"; k get pods -A -o wide
        echo "=== events"; k get events -A --sort-by .lastTimestamp | tail -n 40
        echo "=== node"; node_json | jq '.status | {capacity, allocatable, conditions}'
        echo "=== saved plugin log"; tail -n 100 "$VMQC_LOGS/test-deviceplugin.plugin.log"
        echo "=== deviceplugin log"; k -n "$NS" logs ds/vhostmq -c deviceplugin --tail 100
        echo "=== deviceplugin previous log"; k -n "$NS" logs ds/vhostmq -c deviceplugin --previous --tail 50
        echo "=== dataplane log"; k -n "$NS" logs ds/vhostmq -c dataplane --tail 50
        echo "=== kubelet log (device manager)"; grep -iE 'device.?plugin|devicemanager|vhostmq' "$VMQC_LOGS/kubelet.log" | tail -n 60
        echo "=== $SOCK_DIR"; find "$SOCK_DIR" "$DEVINFO" -maxdepth 2 -ls
    } >"$f" 2>&1
    echo "diagnostics: $f"
}

# ------------------------------------------------------------------ binaries
vmq_need_root
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

# ------------------------------------------------------------------ cluster
if vmqc_is_up; then
    vmq_log "using the cluster that is up"
else
    we_started=1
    "$HERE/cluster.sh" up
fi
BRINGUP=$(cat "$VMQC_RUN/timings")
# leftovers of an earlier run on a cluster that stayed up (--keep)
k delete pod -l app=vhostmq-test --ignore-not-found --grace-period 1 --wait=true --timeout 60s >/dev/null
k delete -f "$HERE/manifests/vhostmq.yaml" --ignore-not-found --wait=true --timeout 90s >/dev/null
"$HERE/images.sh" --bundle "$IMAGE" "$bins"/vhostmq*
vmqc_ctr images ls -q | grep -x "$VMQC_BUSYBOX_IMAGE" >/dev/null || vmqc_import "$VMQC_IMAGES/busybox.tar"

# test_pod NAME COUNT: a busybox pod asking for COUNT queue pairs
test_pod() {
    cat <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: $1
  namespace: default
  labels: {app: vhostmq-test}
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
        limits: {$RES: $2}
EOF
}

# ------------------------------------------------------------------ (a)
step "(a) the DaemonSet registers $RES"
k apply -f "$HERE/manifests/vhostmq.yaml" >/dev/null
ds_ready() { k -n "$NS" wait --for=condition=Ready pod -l app.kubernetes.io/name=vhostmq --timeout 5s >/dev/null 2>&1; }
check "(a) DaemonSet pod Running" vmqc_poll 90 1 ds_ready
cap_is_8() { [[ $(capacity) == 8 ]] && alloc_is 8; }
check "(a) node capacity and allocatable $RES = 8" vmqc_poll 60 0.2 cap_is_8
echo "    node: capacity $(capacity), allocatable $(allocatable)"
slots_total=$(timeout 20 "$bins/vhostmqctl" --socket "$API_SOCK" capacity -o json | jq -r .slots_total) || slots_total=error
ncpu=$(timeout 20 "$bins/vhostmqctl" --socket "$API_SOCK" capacity -o json | jq -r '.cpus | length') || ncpu=0
echo "    agent: slots_total $slots_total on $ncpu CPUs"
check "(a) vhostmqctl capacity slots_total ($slots_total) = node allocatable ($(allocatable))" \
    test "$slots_total" = "$(allocatable)"

# ------------------------------------------------------------------ (b)
# slots_of POD: the pod's VHOSTMQ_QUEUE_SLOTS
slots_of() { k exec "$1" -- env 2>/dev/null | sed -n 's/^VHOSTMQ_QUEUE_SLOTS=//p' || true; }
# spread_ok SLOTS N: N distinct slot IDs c<cpu>-s<n>, no CPU with more than ceil(N/ncpu)
spread_ok() {
    local slots=$1 n=$2 ids max
    mapfile -t ids < <(tr ',' '\n' <<<"$slots" | sed '/^$/d')
    ((${#ids[@]} == n)) || { echo "    want $n slots, got ${#ids[@]}: '$slots'"; return 1; }
    printf '%s\n' "${ids[@]}" | grep -vE '^c[0-9]+-s[0-9]+$' >/dev/null && { echo "    bad slot ID in '$slots'"; return 1; }
    (($(printf '%s\n' "${ids[@]}" | sort -u | wc -l) == n)) || { echo "    duplicate slot in '$slots'"; return 1; }
    max=$(printf '%s\n' "${ids[@]}" | sed 's/-.*//' | sort | uniq -c | awk 'm < $1 { m = $1 } END { print m }')
    ((ncpu > 0 && max <= (n + ncpu - 1) / ncpu)) || { echo "    $max slots on one CPU (ncpu $ncpu): '$slots'"; return 1; }
}
step "(b) pods get queue slots"
test_pod qp4 4 | k apply -f - >/dev/null
check "(b) pod asking for 4 is Running" k wait --for=condition=Ready pod/qp4 --timeout 90s
check "(b) qp4 has a mount at $SOCK_DIR" k exec qp4 -- sh -c "grep -q ' $SOCK_DIR ' /proc/mounts && test -d $SOCK_DIR"
s4=$(slots_of qp4)
echo "    qp4 VHOSTMQ_QUEUE_SLOTS=$s4"
check "(b) qp4: 4 slots spread over the CPUs (<= ceil(4/$ncpu) per CPU)" spread_ok "$s4" 4
step "(b) second pod"
test_pod qp2 2 | k apply -f - >/dev/null
check "(b) pod asking for 2 is Running" k wait --for=condition=Ready pod/qp2 --timeout 90s
s2=$(slots_of qp2)
echo "    qp2 VHOSTMQ_QUEUE_SLOTS=$s2"
check "(b) qp2: 2 slots on distinct CPUs" spread_ok "$s2" 2
check "(b) qp4 and qp2 share no slot" spread_ok "$s4,$s2" 6

# ------------------------------------------------------------------ (c)
# Done when allocatable is 8 in a status the new kubelet posted: either after
# we saw it zeroed, or with a heartbeat later than the kubelet's start.
step "(c) kubelet restart: re-registration"
"$HERE/cluster.sh" restart-kubelet
kstart=$(cat "$VMQC_RUN/kubelet.start")
seen_drop=0 t_back=""
end=$(($(date +%s) + 60))
while (($(date +%s) < end)); do
    a="" hb=""
    read -r a hb < <(node_json | jq -r --arg r "$RES" \
        '"\(.status.allocatable[$r] // "none") \(.status.conditions[] | select(.type == "Ready") | .lastHeartbeatTime | fromdateiso8601)"') || true
    if [[ ${a:-} != 8 ]]; then
        ((seen_drop)) || echo "    allocatable $a at +$(vmqc_secs "$kstart") s"
        seen_drop=1
    elif ((seen_drop)) || { [[ $hb =~ ^[0-9]+$ ]] && ((hb > ${kstart%.*})); }; then
        t_back=$(vmqc_secs "$kstart")
        break
    fi
    sleep 0.1
done
T_REREG=${t_back:--}
# registration through kubelet.sock, or through the plugin watcher
# (plugins_registry/): the kubelet logs one of these (the second at -v 2)
reg_line=$(awk '/^=== kubelet restarted/ { n = NR } { l[NR] = $0 } END { for (i = n; i <= NR; i++) print l[i] }' "$VMQC_LOGS/kubelet.log" |
    grep -m1 -E "Got registration request from device plugin with resource.*$RES|Registered client\" name=\"$RES\"" || true)
if [[ -n $reg_line ]]; then
    t_reg=$(date -d "$(awk '{ print $2 }' <<<"$reg_line")" +%s.%N)
    T_REREG_LOG=$(awk -v a="$kstart" -v b="$t_reg" 'BEGIN { printf "%.2f", b - a }')
fi
echo "    kubelet started at +0; plugin registered (kubelet log) at +$T_REREG_LOG s; allocatable 8 in the API at +$T_REREG s (zero seen: $seen_drop)"
check "(c) the plugin registered with the new kubelet (kubelet log)" test -n "$reg_line"
check "(c) allocatable back to 8 in a status the new kubelet posted (+$T_REREG s${REREG_LIMIT:+, limit $REREG_LIMIT s})" \
    awk -v t="$T_REREG" -v l="$REREG_LIMIT" 'BEGIN { exit !(t != "-" && (l == "" || t < l)) }'
check "(c) qp4 and qp2 still Running with the same slots" \
    test "$(slots_of qp4)/$(slots_of qp2)" = "$s4/$s2"

# ------------------------------------------------------------------ (d)
step "(d) dataplane killed: devices unhealthy, then back"
dp_status() { k -n "$NS" get pod -l app.kubernetes.io/name=vhostmq -o json |
    jq -r '.items[0].status.containerStatuses[] | select(.name == "dataplane") | "\(.containerID) \(.restartCount)"'; }
read -r cid restarts < <(dp_status) || true
cid=${cid#containerd://}
pid=$(vmqc_ctr tasks ls | awk -v id="$cid" '$1 == id { print $2 }')
comm=$(cat "/proc/$pid/comm" 2>/dev/null || true)
echo "    dataplane container ${cid:0:12} pid ${pid:-?} ($comm), restarts $restarts"
if [[ -n $pid && $comm == vhostmq-datapla* ]]; then
    kill -KILL "$pid"
    t_kill=$(vmq_now)
    if vmqc_poll 30 0.1 alloc_is 0; then T_DROP=$(vmqc_secs "$t_kill"); fi
    check "(d) allocatable 0 after the kill (+$T_DROP s${UNHEALTHY_LIMIT:+, limit $UNHEALTHY_LIMIT s})" \
        awk -v t="$T_DROP" -v l="$UNHEALTHY_LIMIT" 'BEGIN { exit !(t != "-" && (l == "" || t <= l)) }'
    if vmqc_poll 120 0.2 alloc_is 8; then T_RECOVER=$(vmqc_secs "$t_kill"); fi
    check "(d) allocatable back to 8 after the container restart (+$T_RECOVER s)" test "$T_RECOVER" != -
    read -r _ restarts2 < <(dp_status) || true
    check "(d) dataplane container restarted (restarts $restarts -> ${restarts2:-?})" test "${restarts2:-0}" -gt "${restarts:-0}"
else
    fail "(d) found the dataplane container's process (pid '${pid:-}', comm '$comm')"
fi

# ------------------------------------------------------------------ (e)
step "(e) a pod asking for 9 stays Pending"
test_pod qp9 9 | k apply -f - >/dev/null
insufficient() {
    k get events -n default --field-selector involvedObject.name=qp9,reason=FailedScheduling -o json |
        jq -e --arg m "Insufficient $RES" '[.items[].message | select(contains($m))] | length > 0' >/dev/null
}
check "(e) FailedScheduling event says Insufficient $RES" vmqc_poll 30 0.5 insufficient
k get events -n default --field-selector involvedObject.name=qp9,reason=FailedScheduling \
    -o jsonpath='{range .items[*]}    {.message}{"\n"}{end}' | head -n 2
check "(e) qp9 is Pending and not bound to the node" \
    test "$(k get pod qp9 -o jsonpath='{.status.phase}/{.spec.nodeName}')" = "Pending/"

# ------------------------------------------------------------------ (f)
# Two ways an allocation goes: (1) its pod is deleted while the plugin runs:
# the plugin reclaims it once the kubelet's pod-resources API no longer lists
# it (after a grace period for young allocations: Allocate runs before the
# container exists); (2) the pods and then the DaemonSet are deleted at once:
# the plugin reclaims on its way out.
step "(f) qp2 deleted: its allocation is reclaimed while the plugin runs"
# anything under the socket root but sockets (the agent's api.sock stays
# behind when the dataplane is gone; /run and /var/run are one folder here)
leftover_sock() { find "$SOCK_DIR" -mindepth 1 ! -type s 2>/dev/null; }
leftover_devinfo() { find "$DEVINFO" -mindepth 1 2>/dev/null; }
clean() { [[ -z $(leftover_sock) && -z $(leftover_devinfo) ]]; }
no_sock_leftovers() { [[ -z $(leftover_sock) ]]; }
no_devinfo_leftovers() { [[ -z $(leftover_devinfo) ]]; }
show_leftovers() { echo "    $1: $( (leftover_sock; leftover_devinfo) | tr '\n' ' ')"; }
alloc_dirs() { find "$SOCK_DIR" -mindepth 1 -maxdepth 1 -type d -printf '%f\n' 2>/dev/null | sort; }
# qp4's allocation folder: the source of its /var/run/vhostmq bind mount, read
# from the container's mountinfo on the host
qp4_cid=$(k get pod qp4 -o jsonpath='{.status.containerStatuses[0].containerID}')
qp4_pid=$(vmqc_ctr tasks ls | awk -v id="${qp4_cid#containerd://}" '$1 == id { print $2 }')
qp4_dir=$(awk -v m="$SOCK_DIR" '$5 == m { print $4 }' "/proc/${qp4_pid:-0}/mountinfo" 2>/dev/null)
qp4_dir=${qp4_dir##*/}
show_leftovers "before"
qp2_dir=$(alloc_dirs | grep -vxF "${qp4_dir:-none}" | head -n 1)
echo "    allocation folders: $(alloc_dirs | tr '\n' ' ')(qp4: ${qp4_dir:-?}, so qp2: ${qp2_dir:-?})"
k delete pod qp2 --grace-period 1 --wait=true --timeout 60s >/dev/null
t_del=$(vmq_now)
qp2_gone() { [[ -n $qp2_dir && ! -e $SOCK_DIR/$qp2_dir ]]; }
if vmqc_poll "$RECLAIM_TIMEOUT" 0.5 qp2_gone; then
    T_RECLAIM=$(vmqc_secs "$t_del")
    pass "(f) qp2's allocation reclaimed $T_RECLAIM s after its pod was deleted"
else
    fail "(f) qp2's allocation ${qp2_dir:-?} reclaimed within $RECLAIM_TIMEOUT s of its pod's deletion"
fi
sleep 1 # the reclaim pass that took qp2's must not take the one still in use
check "(f) qp4's allocation (in use) kept: $SOCK_DIR/${qp4_dir:-?}" test -n "$qp4_dir" -a -d "$SOCK_DIR/$qp4_dir"
echo "    allocation folders now: $(alloc_dirs | tr '\n' ' ')"

step "(f) qp4, qp9 and right after them the DaemonSet deleted"
# the plugin's log, to its last line (the pod's log goes with the pod)
nsenter --net="/run/netns/$VMQC_NETNS" -- timeout 150 env KUBECACHEDIR="$VMQC_RUN/kube-cache" \
    "$VMQC_BIN/kubectl" --kubeconfig "$VMQC_KUBECONFIG" -n "$NS" logs -f ds/vhostmq -c deviceplugin \
    >"$VMQC_LOGS/test-deviceplugin.plugin.log" 2>&1 &
logs_pid=$!
k -n "$NS" logs ds/vhostmq -c dataplane >"$VMQC_LOGS/test-deviceplugin.dataplane.log" 2>&1
k delete pod qp4 qp9 --grace-period 1 --wait=true --timeout 60s >/dev/null
k delete -f "$HERE/manifests/vhostmq.yaml" --wait=true --timeout 90s >/dev/null
check "(f) no allocation folders or files under $SOCK_DIR" vmqc_poll 10 0.5 no_sock_leftovers
check "(f) no files in $DEVINFO" vmqc_poll 5 0.5 no_devinfo_leftovers
clean || show_leftovers "left"
{ wait "$logs_pid"; } 2>/dev/null || true
logs_pid=""

# ------------------------------------------------------------------ summary
echo "--- summary"
echo "cluster bring-up: $BRINGUP (seconds; k8s_build=0 means cached)"
echo "re-registration after a kubelet restart: allocatable back in ${T_REREG} s (plugin registered at +${T_REREG_LOG} s in the kubelet log)"
echo "dataplane kill: allocatable 0 after ${T_DROP} s, back to 8 after ${T_RECOVER} s"
echo "freed allocation reclaimed ${T_RECLAIM} s after its pod was deleted (plugin running)"
echo "$passed passed, $failed failed"
((failed == 0))
