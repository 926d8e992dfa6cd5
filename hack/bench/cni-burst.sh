#!/usr/bin/env bash
# CNI ADD under a burst (#27's density benchmark): N pods (default 50), each
# asking for one vhostmq queue pair (vhostmq.io/queue-pairs: 1) with the
# network vhu-net (k8s.v1.cni.cncf.io/networks), created by one
# `kubectl apply` on the one-node test cluster (hack/cluster/) whose CNI is
# multus-lite, the project's Multus stand-in (NOT Multus).  Part of
# `make bench`.
#
# Steps:
#   1. the cluster: brought up with multus-lite as its CNI (as
#      hack/cluster/test-cni.sh does, binaries in VHOSTMQ_BENCH_CNI_DIR) and
#      taken down at the end, or, when one is up, used if its CNI is
#      multus-lite (then only what this script made or changed is undone)
#   2. queue slots: the manifests give the dataplane 4 slots per CPU
#      (ConfigMap vhostmq-dataplane, dataplane.yaml slotsPerCPU; cpus [0, 1]),
#      8 on the test node, too few for N one-pair pods.  The DaemonSet runs
#      with --slots-per-cpu (32: 64 slots on 2 CPUs): applied from a copy of
#      manifests/vhostmq.yaml with that value when the DaemonSet is not
#      there (deleted at the end), else the ConfigMap is patched and the
#      DaemonSet's pod deleted so that it restarts with it; at the end the
#      ConfigMap is put back, the pod restarted again and the node's
#      allocatable waited for until it is what it was.  The repository's
#      manifest is not changed.
#   3. the NAD vhu-net (resourceName vhostmq.io/queue-pairs, type
#      vhostmq-cni) and its CRD, unless there (then removed at the end)
#   4. N pods (pause image, terminationGracePeriodSeconds 1) in one
#      `kubectl apply`; polled every 0.5 s until all are Running (bounded;
#      a pod's Running time is that of the first poll that saw it, so
#      0.5 s plus a kubectl call coarse)
#   5. from multus-lite's log (as test-cni.sh reads it) per pod: the whole
#      multus-lite ADD (default network + net1 + the network-status patch),
#      the vhostmq-cni ADD of net1 inside it, the default network's
#      (bridge) ADD, failed ADDs (the runtime retries them)
#   6. the dataplane's ports (vhostmqctl -o json port list on the host): one
#      per pod, how its slots spread over the CPUs
#   7. the pods deleted (one kubectl delete, waited for): delete time, ports
#      gone, and nothing left that the burst made: no socket but api.sock,
#      no allocation folder (the device plugin reclaims them 30 s after
#      Allocate at the earliest), no device-info file, no multus-lite cache
# Prints a table (p50/p99/max, nearest rank: with 50 pods p99 is the 50th
# value, the max) and writes DIR/summary.tsv, DIR/pods.tsv (per pod),
# DIR/multus-lite.log (this run's lines), DIR/meta.txt.  Timings are
# reported, not judged: the exit status is non-zero only when the run
# failed (a pod not Running in time, ports missing, something left behind,
# the slots not restored).
#
# Usage: hack/bench/cni-burst.sh [--pods 50] [--slots-per-cpu 32] [--out DIR]
#   --pods N            pods in the burst (default 50)
#   --slots-per-cpu N   the dataplane's slots per CPU for the run (default 32;
#                       the manifests' 4 is restored after)
#   --out DIR           results (default _output/bench/cni-burst-<UTC time>)
# Environment:
#   VHOSTMQ_TEST_BIN_DIR   static vhostmq-dataplane, vhostmq-deviceplugin,
#                          vhostmqctl, vhostmq-cni and multus-lite (default:
#                          built with CGO_ENABLED=0 into a temporary folder)
#   VHOSTMQ_BENCH_CNI_DIR=/run/vhostmq-bench-cni  the CNI binaries, conflists
#                          and multus-lite state of a cluster this script
#                          brings up (removed after its down)
#   VHOSTMQ_BENCH_RUNNING_TIMEOUT=300  bound on create -> all Running (s)
#   VHOSTMQ_BENCH_RECLAIM_TIMEOUT=120  bound on delete -> allocation folders gone (s)
# Root only.  Cluster bring-up when nothing is up: ~10 s with the cache in
# /var/cache/vhostmq (10-17 min for the first Kubernetes build on a machine).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CLUSTER=$(cd "$HERE/../cluster" && pwd)
# shellcheck source-path=SCRIPTDIR source=../cluster/lib.sh
source "$CLUSTER/lib.sh"
VMQ_TAG=cni-burst

PODS=50 SLOTS=32 OUT=""
vmq_args --pods=PODS --slots-per-cpu=SLOTS --out=OUT -- "$@"
[[ $PODS =~ ^[1-9][0-9]*$ ]] || vmq_die "--pods: a positive number, not $PODS"
[[ $SLOTS =~ ^[1-9][0-9]*$ && $SLOTS -le 128 ]] || vmq_die "--slots-per-cpu: 1..128 (the dataplane's bound), not $SLOTS"
OUT=${OUT:-$VMQ_REPO_ROOT/_output/bench/cni-burst-$(date -u +%Y%m%dT%H%M%SZ)}

RES=vhostmq.io/queue-pairs
NS=vhostmq-system
DS_LABEL=app.kubernetes.io/name=vhostmq
LABEL=app=vhostmq-cni-burst
SOCK_DIR=/var/run/vhostmq
API_SOCK=/run/vhostmq/api.sock
DEVINFO_CNI=/var/run/k8s.cni.cncf.io/devinfo/cni
DEVINFO_DP=/var/run/k8s.cni.cncf.io/devinfo/dp
IMAGE=localhost/vhostmq:dev
TDIR=${VHOSTMQ_BENCH_CNI_DIR:-/run/vhostmq-bench-cni}
RUNNING_TIMEOUT=${VHOSTMQ_BENCH_RUNNING_TIMEOUT:-300}
RECLAIM_TIMEOUT=${VHOSTMQ_BENCH_RECLAIM_TIMEOUT:-120}
MLOG=$VMQC_LOGS/multus-lite.log
MSTATE=""
we_started=0 ds_made=0 conf_changed=0 crd_made=0 nad_made=0 pods_made=0
orig_conf="" orig_alloc="" mlog0=0 cluster_ok=0
work=$(mktemp -d)
bins=$work/bin

k() { vmqc_kubectl "$@"; }
VMQ_CTL=$bins/vhostmqctl VMQ_API=$API_SOCK # for vmq_ctl
allocatable() { k get --raw "/api/v1/nodes/$VMQC_NODE" | jq -r --arg r "$RES" '.status.allocatable[$r] // "0"'; }
ds_ready() { k -n "$NS" wait --for=condition=Ready pod -l "$DS_LABEL" --timeout 5s >/dev/null 2>&1; }
our_ports() { vmq_ctl -o json port list | jq -c '.ports[] | select((.labels["k8s.pod.name"] // "") | startswith("burst-"))'; }
n_our_ports() { our_ports | jq -s length; }
no_burst_pods() { local out; out=$(k get pods -l "$LABEL" -o name) && [[ -z $out ]]; }
# delete_burst SECONDS: delete the burst's pods (CNI DEL runs), wait until
# they are gone (polled: kubectl's own --wait rides on a watch that its
# 20 s request timeout may cut)
delete_burst() {
    k delete pod -l "$LABEL" --ignore-not-found --wait=false >/dev/null && vmqc_poll "$1" 0.5 no_burst_pods
}
# multus-lite's log lines of this run (a cluster kept up keeps older ones)
mlog() { tail -n +"$((mlog0 + 1))" "$MLOG" 2>/dev/null || true; }
# what a burst leaves on the host, one path a line (compared with the same
# before the burst): allocation folders and slots files, sockets but
# api.sock, CNI device-info files, multus-lite's cache
host_leftovers() {
    {
        find "$SOCK_DIR" -mindepth 1 -maxdepth 1 ! -path "$API_SOCK" ! -path "$SOCK_DIR/api.sock"
        find "$SOCK_DIR" -mindepth 2 -type s
        find "$DEVINFO_CNI" "$DEVINFO_DP" -mindepth 1 -maxdepth 1
        [[ -n $MSTATE ]] && find "$MSTATE" -maxdepth 1 -type f
    } 2>/dev/null | sort || true
}
new_leftovers() { comm -13 "$work/before.txt" <(host_leftovers); }

# set_slots CONF N: CONF (dataplane.yaml as a JSON string) with slotsPerCPU N,
# as a JSON string; the rest byte for byte
set_slots() {
    jq -c --arg n "$2" 'if test("(^|\n)[ \t]*slotsPerCPU:") then sub("(?<i>(^|\n)[ \t]*)slotsPerCPU:[^\n]*"; "\(.i)slotsPerCPU: \($n)")
        else (if . == "" or endswith("\n") then . else . + "\n" end) + "slotsPerCPU: \($n)\n" end' <<<"$1"
}
patch_conf() { # CONF: the ConfigMap's dataplane.yaml := CONF (a JSON string)
    k -n "$NS" patch configmap vhostmq-dataplane --type merge \
        -p "$(jq -cn --argjson c "$1" '{data: {"dataplane.yaml": $c}}')" >/dev/null
}
# restart_ds: the DaemonSet's pod deleted (the controller makes a new one,
# which reads the ConfigMap again); waits until it is Ready
restart_ds() {
    k -n "$NS" delete pod -l "$DS_LABEL" --wait=true --timeout 60s >/dev/null &&
        vmqc_poll 120 1 ds_ready
}
# slots_are N: the agent has N slots and the node's allocatable says so
slots_are() {
    [[ $(vmq_ctl -o json capacity 2>/dev/null | jq -r .slots_total) == "$1" && $(allocatable) == "$1" ]]
}
# slots_raised: the agent has SLOTS slots on each of its CPUs and the node's
# allocatable says so
slots_raised() {
    local cap
    cap=$(vmq_ctl -o json capacity 2>/dev/null) || return 1
    [[ $(jq -r --argjson s "$SLOTS" '.slots_total == (.cpus | length) * $s and all(.cpus[]; (.slots | length) == $s)' <<<"$cap") == true &&
        $(allocatable) == $(jq -r .slots_total <<<"$cap") ]]
}

diagnostics() {
    mkdir -p "$OUT"
    {
        echo "=== pods"; k get pods -A -o wide
        echo "=== events"; k get events -A --sort-by .lastTimestamp | tail -n 60
        echo "=== multus-lite log (this run)"; mlog | tail -n 80
        echo "=== containerd CNI errors"; grep -E 'level=error' "$VMQC_LOGS/containerd.log" | tail -n 20 | cut -c1-600
        echo "=== ports"; vmq_ctl -o wide port list
        echo "=== capacity"; vmq_ctl capacity
        echo "=== dataplane log"; k -n "$NS" logs ds/vhostmq -c dataplane --tail 60
        echo "=== deviceplugin log"; k -n "$NS" logs ds/vhostmq -c deviceplugin --tail 60
        echo "=== folders"; find "$SOCK_DIR" "$DEVINFO_CNI" -maxdepth 2 -ls
    } >"$OUT/diagnostics.txt" 2>&1
    echo "diagnostics: $OUT/diagnostics.txt"
}

cleanup() {
    local rc=$? t0
    set +e
    if ((cluster_ok && (rc != 0 || ${#VMQ_FAILS[@]} > 0))) && vmqc_is_up; then diagnostics; fi
    if ((pods_made)) && vmqc_is_up; then delete_burst 120 2>/dev/null; fi
    if ((we_started)); then
        timeout 600 "$CLUSTER/cluster.sh" down # pods first: CNI DEL needs $TDIR
        rm -rf "$TDIR"
    elif vmqc_is_up; then
        if ((ds_made)); then
            k delete -f "$CLUSTER/manifests/vhostmq.yaml" --ignore-not-found --wait=true --timeout 90s >/dev/null 2>&1
        elif ((conf_changed)); then
            t0=$(vmq_now)
            if patch_conf "$orig_conf" && restart_ds && vmqc_poll 60 0.5 slots_are "$orig_alloc"; then
                vmq_log "slots restored: slotsPerCPU as before, allocatable $RES $orig_alloc again ($(vmqc_secs "$t0") s)"
            else
                vmq_log "FAILED to restore the DaemonSet's slots (allocatable $(allocatable), wanted $orig_alloc); ConfigMap $NS/vhostmq-dataplane should hold:"
                jq -r . <<<"$orig_conf" >&2
                ((rc)) || rc=1
            fi
        fi
        ((nad_made)) && k delete network-attachment-definitions.k8s.cni.cncf.io vhu-net --ignore-not-found --timeout 30s >/dev/null 2>&1
        ((crd_made)) && k delete -f "$CLUSTER/manifests/nad-crd.yaml" --ignore-not-found --timeout 30s >/dev/null 2>&1
    fi
    rm -rf "$work"
    if ((rc == 0 && ${#VMQ_FAILS[@]} > 0)); then rc=1; fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ------------------------------------------------------------------ binaries
vmq_need_root
command -v jq >/dev/null || vmq_die "jq missing: run hack/install-deps.sh"
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

# ------------------------------------------------------------------ cluster
t_run=$(vmq_now)
if vmqc_is_up; then
    conflist=$VMQC_RUN/cni/net.d/00-multus-lite.conflist
    if [[ ! -f $conflist || ! -x $VMQC_RUN/cni/bin/vhostmq-cni ]]; then
        vmq_die "the cluster that is up does not run multus-lite and vhostmq-cni as its CNI; take it down ($CLUSTER/cluster.sh down) and run this again"
    fi
    MLOG=$(jq -r '.plugins[0].logFile' "$conflist")
    MSTATE=$(jq -r '.plugins[0].stateDir' "$conflist")
    vmq_log "using the cluster that is up (its CNI binaries as they are; multus-lite log $MLOG)"
    BRINGUP="already up"
else
    rm -rf "$TDIR"
    mkdir -p "$TDIR/bin"
    cp "$bins/multus-lite" "$bins/vhostmq-cni" "$TDIR/bin/"
    vmqc_multus_lite_conflists "$TDIR" "$MLOG"
    MSTATE=$TDIR/state
    we_started=1
    VHOSTMQ_CLUSTER_CNI_CONFLIST=$TDIR/00-multus-lite.conflist \
        VHOSTMQ_CLUSTER_CNI_PLUGINS="$TDIR/bin/multus-lite $TDIR/bin/vhostmq-cni" \
        timeout 3600 "$CLUSTER/cluster.sh" up >&2
    BRINGUP=$(cat "$VMQC_RUN/timings")
fi
T_BRINGUP=$(vmqc_secs "$t_run")
cluster_ok=1
[[ -f $MLOG ]] && mlog0=$(wc -l <"$MLOG")
# leftovers of an earlier run of this script on a cluster that stayed up
delete_burst 120 || vmq_die "pods of an earlier burst are still there"

# ------------------------------------------------------------------ slots
t_slots=$(vmq_now)
if k -n "$NS" get daemonset vhostmq >/dev/null 2>&1; then
    orig_conf=$(k -n "$NS" get configmap vhostmq-dataplane -o json | jq -c '.data["dataplane.yaml"]')
    [[ $orig_conf == \"* ]] || vmq_die "DaemonSet $NS/vhostmq is there but not its ConfigMap vhostmq-dataplane (not hack/cluster/manifests/vhostmq.yaml?)"
    vmqc_poll 60 1 ds_ready || vmq_die "the DaemonSet's pod is not Ready"
    orig_alloc=$(allocatable)
    new_conf=$(set_slots "$orig_conf" "$SLOTS")
    if [[ $new_conf != "$orig_conf" ]]; then
        vmq_log "DaemonSet $NS/vhostmq is running (allocatable $RES $orig_alloc): slotsPerCPU $SLOTS in its ConfigMap, restarting its pod"
        conf_changed=1
        patch_conf "$new_conf"
        restart_ds || vmq_die "the DaemonSet's pod did not come back Ready"
    fi
else
    vmq_log "the vhostmq DaemonSet with slotsPerCPU $SLOTS (a copy of manifests/vhostmq.yaml, which has 4)"
    "$CLUSTER/images.sh" --bundle "$IMAGE" "$bins"/vhostmq-dataplane "$bins"/vhostmq-deviceplugin "$bins"/vhostmqctl >&2
    sed -E "s/^([[:space:]]*)slotsPerCPU:.*/\1slotsPerCPU: $SLOTS/" "$CLUSTER/manifests/vhostmq.yaml" >"$work/vhostmq.yaml"
    grep -qE "^[[:space:]]*slotsPerCPU: $SLOTS\$" "$work/vhostmq.yaml" || vmq_die "no slotsPerCPU line in manifests/vhostmq.yaml"
    ds_made=1
    k apply -f "$work/vhostmq.yaml" >/dev/null
    vmqc_poll 120 1 ds_ready || vmq_die "the DaemonSet's pod is not Ready"
fi
vmqc_poll 90 0.5 slots_raised ||
    vmq_die "the agent's slots ($(vmq_ctl -o json capacity 2>/dev/null | jq -c '[.slots_total, [.cpus[] | .slots | length]]')) and allocatable $RES ($(allocatable)) are not $SLOTS per CPU"
CAP=$(vmq_ctl -o json capacity)
SLOTS_TOTAL=$(jq -r .slots_total <<<"$CAP")
NCPU=$(jq -r '.cpus | length' <<<"$CAP")
T_SLOTS=$(vmqc_secs "$t_slots")
vmq_log "queue slots: $SLOTS_TOTAL ($NCPU CPUs x $SLOTS), allocatable $RES $(allocatable) after $T_SLOTS s (before: ${orig_alloc:-no DaemonSet})"
((SLOTS_TOTAL >= PODS)) || vmq_die "$SLOTS_TOTAL slots cannot hold $PODS one-pair pods: raise --slots-per-cpu"

# ------------------------------------------------------------------ NAD
k get crd network-attachment-definitions.k8s.cni.cncf.io >/dev/null 2>&1 || crd_made=1
if ! k get network-attachment-definitions.k8s.cni.cncf.io vhu-net >/dev/null 2>&1; then
    nad_made=1
    vmqc_apply_nad "$RES"
fi
[[ $(k get network-attachment-definitions.k8s.cni.cncf.io vhu-net -o jsonpath='{.metadata.annotations.k8s\.v1\.cni\.cncf\.io/resourceName}') == "$RES" ]] ||
    vmq_die "NAD default/vhu-net has no resourceName $RES"

# ------------------------------------------------------------------ burst
width=${#PODS}
names=()
for ((i = 0; i < PODS; i++)); do names+=("$(printf 'burst-%0*d' "$width" "$i")"); done
for p in "${names[@]}"; do
    cat <<EOF
---
apiVersion: v1
kind: Pod
metadata:
  name: $p
  namespace: default
  labels: {app: vhostmq-cni-burst}
  annotations:
    k8s.v1.cni.cncf.io/networks: vhu-net
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  automountServiceAccountToken: false
  enableServiceLinks: false
  containers:
    - name: c
      image: $VMQC_PAUSE_IMAGE
      imagePullPolicy: Never
      resources:
        limits: {$RES: 1}
EOF
done >"$work/pods.yaml"
host_leftovers >"$work/before.txt"
PORTS_BEFORE=$(vmq_ctl -o json port list | jq '.ports | length')
mkdir -p "$OUT"

vmq_log "creating $PODS pods in one kubectl apply"
declare -A T_RUN=()
t0=$(vmq_now)
pods_made=1
k apply -f "$work/pods.yaml" >/dev/null
T_APPLY=$(vmqc_secs "$t0")
# all_running: record when each pod is first seen Running
all_running() {
    local p ph now
    now=$(vmqc_secs "$t0")
    while read -r p ph; do
        [[ $ph == Running && -z ${T_RUN[$p]:-} ]] && T_RUN[$p]=$now
    done < <(k get pods -l "$LABEL" -o json | jq -r '.items[] | "\(.metadata.name) \(.status.phase)"')
    ((${#T_RUN[@]} == PODS))
}
if vmqc_poll "$RUNNING_TIMEOUT" 0.5 all_running; then
    T_ALL=$(vmqc_secs "$t0")
    vmq_log "all $PODS pods Running after $T_ALL s (kubectl apply took $T_APPLY s)"
else
    T_ALL=-
    vmq_fail "only ${#T_RUN[@]} of $PODS pods Running after $RUNNING_TIMEOUT s"
    k get pods -l "$LABEL" -o json | jq -r '.items[] | select(.status.phase != "Running") |
        "    \(.metadata.name) \(.status.phase) \(.status.containerStatuses[0].state.waiting.reason // .status.conditions[0].reason // "")"' | head -n 20 >&2
    k get events -n default --field-selector reason=FailedCreatePodSandBox -o json |
        jq -r '"    FailedCreatePodSandBox events: \(.items | length)", (.items[-1].message // "" | .[0:400] | "    last: " + .)' >&2
fi

# ------------------------------------------------------------------ what the burst made
# multus-lite's lines of this run, per pod: ADD total, net1 (vhostmq-cni),
# eth0 (the default network's bridge), net1's deviceID, failed ADDs, and
# the time of day the last ADD ended
mlog >"$OUT/multus-lite.log" # (an ADD's "done" line is written before it returns, so before Running)
awk -v want="$(printf '%s ' "${names[@]}")" '
    function secs(t) { gsub(/[()s]/, "", t); return t }
    BEGIN { n = split(want, w, " "); for (i = 1; i <= n; i++) ours["default/" w[i]] = 1 }
    $2 != "ADD" || !($3 in ours) { next }
    { p = substr($3, 9) }
    $5 == "done:" { add[p] = secs($NF); end[p] = $1 }
    $5 == "default/vhu-net" && $6 == "net1" && $8 == "ok" { net1[p] = secs($9); split($7, d, "="); dev[p] = d[2] }
    $6 == "eth0" && $7 == "ok" { eth0[p] = secs($8) }
    $5 == "failed" { fails[p]++ }
    END { for (i = 1; i <= n; i++) { p = w[i]
        printf "%s\t%s\t%s\t%s\t%s\t%d\t%s\n", p, (p in add) ? add[p] : "-", (p in net1) ? net1[p] : "-",
            (p in eth0) ? eth0[p] : "-", (p in dev) ? dev[p] : "-", fails[p], (p in end) ? end[p] : "-" } }
' "$OUT/multus-lite.log" >"$work/mlite.tsv"
{
    printf 'pod\trunning_s\tmultus_lite_add_s\tvhostmq_cni_add_s\tdefault_net_add_s\tdevice_id\tfailed_adds\tadd_done_utc\n'
    while IFS=$'\t' read -r p add net1 eth0 dev fails end; do
        printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$p" "${T_RUN[$p]:--}" "$add" "$net1" "$eth0" "$dev" "$fails" "$end"
    done <"$work/mlite.tsv"
} >"$OUT/pods.tsv"
# when the ADDs ran, relative to the create: the first one's start
# (its end minus its total) and the last one's end
T_ADDS=$(awk -F'\t' -v t0="$t0" '
    NR > 1 && $8 != "-" { split($8, a, ":"); e = a[1] * 3600 + a[2] * 60 + a[3]; s = e - $3
        if (!n++ || s < first) first = s; if (e > last) last = e }
    END { z = t0 % 86400; if (n) printf "first ADD began %.1f s, last ended %.1f s after the create", first - z, last - z; else print "no ADD seen" }
' "$OUT/pods.tsv")

PORTS_JSON=$(vmq_ctl -o json port list)
N_PORTS=$(jq '.ports | length' <<<"$PORTS_JSON")
N_OURS=$(jq '[.ports[] | select((.labels["k8s.pod.name"] // "") | startswith("burst-"))] | length' <<<"$PORTS_JSON")
SPREAD=$(jq -r '[.ports[] | select((.labels["k8s.pod.name"] // "") | startswith("burst-")) | .slots[] | sub("-s[0-9]+$"; "")] |
    group_by(.) | map("\(.[0]) \(length)") | join(", ")' <<<"$PORTS_JSON")
vmq_log "dataplane ports: $N_PORTS ($N_OURS of the burst's pods; $PORTS_BEFORE before); slots per CPU: ${SPREAD:-none}"
if ((N_OURS == PODS && N_PORTS == PORTS_BEFORE + PODS)); then
    vmq_ok "one dataplane port per pod ($N_OURS)"
else
    vmq_fail "dataplane ports of the burst: $N_OURS, want $PODS (all ports $N_PORTS, $PORTS_BEFORE before)"
fi
N_FAILED_ADDS=$(awk -F'\t' 'NR > 1 { s += $7 } END { print s + 0 }' "$OUT/pods.tsv")
N_MISSING=$(awk -F'\t' 'NR > 1 && ($3 == "-" || $4 == "-") { n++ } END { print n + 0 }' "$OUT/pods.tsv")
((N_MISSING == 0)) || vmq_log "note: $N_MISSING pods have no complete ADD in multus-lite's log"

# ------------------------------------------------------------------ delete
vmq_log "deleting the $PODS pods"
t_del=$(vmq_now)
if delete_burst 180; then
    T_DEL=$(vmqc_secs "$t_del")
    pods_made=0
    vmq_log "pods gone after $T_DEL s"
else
    T_DEL=-
    vmq_fail "pods not gone 180 s after the delete"
fi
no_ports() { [[ $(n_our_ports) == 0 ]]; }
if vmqc_poll 60 0.2 no_ports; then
    T_DEL_PORTS=$(vmqc_secs "$t_del")
    vmq_ok "no port of the burst left ($T_DEL_PORTS s after the delete)"
else
    T_DEL_PORTS=-
    vmq_fail "$(n_our_ports) ports of the burst left 60 s after the delete"
fi
nothing_left() { [[ -z $(new_leftovers) ]]; }
if vmqc_poll "$RECLAIM_TIMEOUT" 0.5 nothing_left; then
    T_RECLAIM=$(vmqc_secs "$t_del")
    vmq_ok "no socket, allocation folder, device-info file or multus-lite cache of the burst left ($T_RECLAIM s after the delete)"
else
    T_RECLAIM=-
    vmq_fail "left $RECLAIM_TIMEOUT s after the delete: $(new_leftovers | head -n 10 | tr '\n' ' ')($(new_leftovers | wc -l) paths)"
fi

# ------------------------------------------------------------------ summary
# stats COLUMN: n p50 p99 max of a pods.tsv column (nearest rank)
stats() {
    awk -F'\t' -v c="$1" 'NR > 1 && $c != "-" { print $c }' "$OUT/pods.tsv" | sort -g |
        awk '{ v[NR] = $1 } END {
            if (!NR) { print "0\t-\t-\t-"; exit }
            r50 = int(NR * 0.50); if (r50 < NR * 0.50) r50++; if (r50 < 1) r50 = 1
            r99 = int(NR * 0.99); if (r99 < NR * 0.99) r99++; if (r99 < 1) r99 = 1
            printf "%d\t%.3f\t%.3f\t%.3f\n", NR, v[r50], v[r99], v[NR] }'
}
{
    printf 'metric\tn\tp50_s\tp99_s\tmax_s\n'
    printf 'pod_create_to_running\t%s\n' "$(stats 2)"
    printf 'multus_lite_add\t%s\n' "$(stats 3)"
    printf 'vhostmq_cni_add_net1\t%s\n' "$(stats 4)"
    printf 'default_net_add_eth0\t%s\n' "$(stats 5)"
    printf 'create_to_all_running\t1\t-\t-\t%s\n' "$T_ALL"
    printf 'delete_to_pods_gone\t1\t-\t-\t%s\n' "$T_DEL"
    printf 'delete_to_ports_gone\t1\t-\t-\t%s\n' "$T_DEL_PORTS"
    printf 'delete_to_allocations_reclaimed\t1\t-\t-\t%s\n' "$T_RECLAIM"
} >"$OUT/summary.tsv"
{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "commit: $(git -C "$VMQ_REPO_ROOT" rev-parse --short HEAD 2>/dev/null)$(git -C "$VMQ_REPO_ROOT" diff --quiet 2>/dev/null || echo ' (dirty)')"
    echo "machine: $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "pods: $PODS, 1 queue pair each, network vhu-net (multus-lite + vhostmq-cni), image $VMQC_PAUSE_IMAGE"
    if ((ds_made)); then was="no DaemonSet: applied with it by this run, deleted after"; else was="allocatable $orig_alloc, restored after"; fi
    echo "slots: $SLOTS_TOTAL ($NCPU CPUs x $SLOTS slotsPerCPU; $was), ready after $T_SLOTS s"
    echo "cluster: $BRINGUP ($T_BRINGUP s)"
} >"$OUT/meta.txt"

echo "--- CNI ADD burst: $PODS pods created at once on the one-node test cluster (multus-lite, NOT Multus; p99 by nearest rank)"
sed 's/^/    /' "$OUT/meta.txt"
echo "    kubectl apply of the $PODS pods: $T_APPLY s; $T_ADDS"
echo "    dataplane ports while Running: $N_PORTS ($N_OURS of the burst; slots per CPU: ${SPREAD:-none}); failed ADDs retried: $N_FAILED_ADDS"
vmq_table <"$OUT/summary.tsv"
echo "results: $OUT (summary.tsv, pods.tsv, multus-lite.log, meta.txt)"
vmq_fails_report
