#!/usr/bin/env bash
# The vhostmq CNI plugin (cmd/vhostmq-cni) outside Kubernetes, against a real
# node agent (bin/vhostmq-dataplane with its own temporary config: apiSocket,
# socketRoot and stateDir in the work dir, the first two CPUs this process may
# use, slotsPerCPU 4).  No kubelet, no device plugin, no Multus: this script
# plays the device plugin's part by writing an allocation exactly as
# plugin/allocate.go does (directory <socketRoot>/qp-<first 8 bytes, in hex, of
# sha256 of the sorted comma-joined slot IDs>, mode 0770, owner 107:107, and
# the record <socketRoot>/.qp-<hash>.slots listing the slot IDs, mode 0600),
# and Multus' part by passing deviceID and CNIDeviceInfoFile.
#
#   cnitool  cnitool ADD, CHECK, DEL, DEL again in a network namespace made
#            here (ip netns add vhostmq-e2e-cni: a fixed name, as cnitool
#            derives the container ID, so the port ID and MAC, from its path),
#            NETCONFPATH a temporary folder, CAP_ARGS deviceID +
#            CNIDeviceInfoFile, CNI_ARGS IgnoreUnknown=1 (as every runtime
#            sends it; host-local refuses unknown args without it) and
#            K8S_POD_NAMESPACE/NAME/UID.  The ADD result and the device-info
#            file are compared with golden files (hack/testdata/cni/) after
#            normalising the variable parts (work dir, netns path, and this
#            machine's two CPU numbers, which read as 0 and 1);
#            `vhostmqctl -o json port show/list` must show the port with the
#            allocation's queue pairs, slots, socket path, MAC and pod labels;
#            DEL removes it, device-info file and libcni cache entry included.
#            Then socketMode "client" (the dataplane's socket appears in the
#            allocation folder and goes with DEL), and IPAM delegation to
#            Debian's /usr/lib/cni/host-local (CNI <= 1.0.0, so cniVersion
#            1.0.0): the result carries the address, DEL releases the lease.
#   crictl   a containerd of our own (own --config: root, state, socket, runc
#            root and CNI folders in the work dir; the cluster's containerd,
#            if hack/cluster is up, is not touched) with the plugin as its
#            only network, a static top-level deviceID (no kubelet or Multus
#            passes one) and host-local IPAM (containerd 1.6 refuses a sandbox
#            whose eth0 has no address), the pause image hack/cluster caches;
#            crictl runp (ADD: a port labelled with the pod metadata), stopp
#            (DEL: port gone), rmp (DEL again with an empty CNI_NETNS: must
#            succeed).  A logging shim in front of the plugin records each
#            call containerd makes (command, exit status, netns, CNI_ARGS).
#   errors   bad input straight into the plugin binary, agent up: no
#            CNI_COMMAND / CNI_CONTAINERID / CNI_IFNAME / CNI_NETNS, bad
#            interface name, bad JSON, unknown field, unsupported cniVersion,
#            bad mtu, bad socketMode, no deviceID, no allocations, a deviceID
#            of no allocation, queuePairs above the allocation, slots held by
#            another port, an unwritable device-info file (the port is rolled
#            back), CHECK of a missing port; agent down: ADD (11, try again
#            later), STATUS (50), DEL (succeeds, records a pending deletion),
#            GC (11); the agent back: GC clears the pending deletion, and
#            another pending one is cleared by the next ADD.  Each exit status
#            and CNI error JSON is checked against hack/testdata/cni/
#            errors.golden; after each: no port, device-info file or socket
#            is left.
# Logs each check (hack/lib.sh's vmq_ok / vmq_fail), prints the ADD/DEL
# timings, the failures and "N passed, N failed"; exits non-zero if anything
# failed.  Everything it made (processes, netns, mounts,
# cgroups, the work dir, libcni cache entries, host folders it created) is
# removed at exit, also on failure.
#
# Usage: hack/e2e-cni.sh [--parts cnitool,crictl,errors] [--no-build] [--update] [--keep DIR]
#   --parts LIST  which parts to run (default: all three)
#   --no-build    use bin/vhostmq-cni, bin/vhostmq-dataplane, bin/vhostmqctl
#                 as they are (default: build them with CGO_ENABLED=0)
#   --update      rewrite the golden files from this run (review the diff!)
#   --keep DIR    work dir (default: a new /tmp/vhostmq-e2e-cni.XXXXXX,
#                 removed at exit); kept, with logs and configs
# Environment:
#   VHOSTMQ_TEST_BIN_DIR  take the three binaries from this folder, build nothing
#   VHOSTMQ_CNITOOL       a cnitool binary (default: built from the cni module
#                         in go.mod if that works, else hack/cluster's cached one)
# Needs root.  Installs containerd, runc, containernetworking-plugins, jq with
# apt-get when missing; crictl, cnitool and the pause image come from
# hack/cluster's cache (/var/cache/vhostmq/k8s), built there if missing.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=cluster/lib.sh
source "$HERE/cluster/lib.sh"
# shellcheck disable=SC2034  # read by vmq_log (hack/lib.sh, sourced by cluster/lib.sh)
VMQ_TAG=e2e-cni

PARTS="cnitool,crictl,errors" NO_BUILD=0 UPDATE=0 WORK="" KEEP=0
vmq_args --parts=PARTS --no-build:NO_BUILD=1 --update:UPDATE=1 --keep=WORK -- "$@"
[[ -z $WORK ]] || KEEP=1
for p in ${PARTS//,/ }; do
    [[ $p =~ ^(cnitool|crictl|errors)$ ]] || vmq_die "--parts: '$p' is not cnitool, crictl or errors"
done
part() { [[ ,$PARTS, == *,$1,* ]]; }
vmq_need_root

GOLDEN=$VMQ_REPO_ROOT/hack/testdata/cni
NETNS=vhostmq-e2e-cni             # fixed: cnitool derives the container ID (and
NETNS_PATH=/var/run/netns/$NETNS  # so the MAC) from the netns path
POD_NS=e2e POD_NAME=vm1 POD_UID=6a1e2e00-0000-4000-8000-00000000c0de
CTR_DIR=/var/run/vhostmq          # containerSocketDir (the plugin's default)
KUBECONFIG_DEFAULT=/etc/cni/net.d/vhostmq.d/vhostmq.kubeconfig
# host folders that cnitool, ip netns and containerd may create; removed at
# exit when they were not there before and are empty
HOST_DIRS=(/var/lib/cni/results /var/lib/cni /run/containerd/s /run/containerd /run/netns)
declare -A EXISTED=()
for d in "${HOST_DIRS[@]}"; do [[ -e $d ]] && EXISTED[$d]=1; done

declare -A MS=()
section() { printf '\n=== %s\n' "$*"; }
now_ms() { echo $(($(date +%s%N) / 1000000)); }
indent() { sed 's/^/    /'; }

# ------------------------------------------------------------------ work dir, cleanup
if [[ -z $WORK ]]; then
    WORK=$(mktemp -d /tmp/vhostmq-e2e-cni.XXXXXX)
else
    mkdir -p "$WORK"
    WORK=$(cd "$WORK" && pwd)
    [[ -z $(ls -A "$WORK") ]] || vmq_die "--keep $WORK is not empty (an agent state dir there would restore old ports)"
fi
((KEEP)) || vmq_track_path "$WORK"
ROOT=$WORK/root          # the agent's socketRoot: allocations
API=$WORK/api.sock
NO_PODRES=$WORK/no-kubelet/pod-resources.sock   # never exists: no pod-resources API
CTD=$WORK/ctd
CTD_SOCK=$CTD/containerd.sock
CTD_PID="" NETNS_MADE=0 CGROUP_PARENT="" CRICTL="" AGENT_PID="" AGENT_UP=0 AGENT_N=0

cleanup() {
    local rc=$? m f pid d
    set +e
    if [[ -n $CTD_PID ]] && vmq_alive "$CTD_PID"; then
        # sandboxes still there (a failed run): remove them through CRI (DEL)
        [[ -n $CRICTL ]] && timeout 60 "$CRICTL" --config "$CTD/crictl.yaml" rmp -af >/dev/null 2>&1
        vmq_stop "$CTD_PID" 15
    fi
    # shims and pause processes of our containerd (their PIDs are in its state
    # folder); a PID is killed only if it still is a shim / in our cgroup
    for f in "$CTD"/state/io.containerd.runtime.v2.task/*/*/init.pid "$CTD"/state/io.containerd.runtime.v2.task/*/*/shim.pid; do
        [[ -f $f ]] || continue
        pid=$(cat "$f")
        kill -0 "$pid" 2>/dev/null || continue
        case $f in
            */shim.pid) [[ $(readlink "/proc/$pid/exe") == */containerd-shim-runc-v2 ]] || continue ;;
            */init.pid) if [[ -z $CGROUP_PARENT ]] || ! grep -qF "$CGROUP_PARENT/" "/proc/$pid/cgroup"; then continue; fi ;;
        esac
        vmq_log "killing leftover $(basename "$f" .pid) pid $pid"
        kill -KILL "$pid"
    done
    # netns bind mounts and overlay rootfs mounts of our containerd
    awk -v w="$WORK/" 'index($5, w) == 1 { print $5 }' /proc/self/mountinfo | sort -r |
        while read -r m; do umount "$m" 2>/dev/null || umount -l "$m"; done
    ((NETNS_MADE)) && ip netns del "$NETNS" 2>/dev/null
    # libcni's cache entries of our networks (DEL removes them; a failed run may not)
    for f in /var/lib/cni/results/vhostmq-e2e-*; do [[ -e $f ]] && rm -f "$f"; done
    if [[ -n $CGROUP_PARENT ]]; then
        while read -r m; do
            d=$m$CGROUP_PARENT
            [[ -d $d ]] && find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null
        done < <(awk '$3 == "cgroup" || $3 == "cgroup2" { print $2 }' /proc/mounts)
    fi
    (exit "$rc")
    vmq_cleanup # the agent and containerd (by PID, newest first), the work dir
    for d in "${HOST_DIRS[@]}"; do
        [[ -n ${EXISTED[$d]:-} || ! -d $d || -n $(ls -A "$d" 2>/dev/null) ]] && continue
        if [[ $d == /run/netns ]]; then umount "$d" 2>/dev/null; fi
        rmdir "$d" 2>/dev/null
    done
    ((KEEP)) && echo "work dir (logs, configs): $WORK"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
T0=$(vmq_now)

# ------------------------------------------------------------------ packages, binaries, tools
[[ -e $KUBECONFIG_DEFAULT ]] &&
    vmq_die "$KUBECONFIG_DEFAULT exists: the plugin would read pod annotations from that cluster; move it away for this test"
VMQC_PKGS=(containerd runc containernetworking-plugins jq iproute2 util-linux gcc libc6-dev)
vmqc_install_deps
[[ -x /usr/lib/cni/host-local && -x /usr/lib/cni/loopback ]] || vmq_die "no /usr/lib/cni/host-local or loopback (containernetworking-plugins)"

if [[ -n ${VHOSTMQ_TEST_BIN_DIR:-} ]]; then
    BIN=$(cd "$VHOSTMQ_TEST_BIN_DIR" && pwd)
    vmq_log "binaries from $BIN"
else
    BIN=$VMQ_REPO_ROOT/bin
    if ((!NO_BUILD)); then
        t=$(vmq_now)
        (cd "$VMQ_REPO_ROOT" && CGO_ENABLED=0 timeout 900 go build -trimpath -o "$BIN/" \
            ./cmd/vhostmq-cni ./cmd/vhostmq-dataplane ./cmd/vhostmqctl) || vmq_die "go build failed"
        vmq_log "built vhostmq-cni, vhostmq-dataplane, vhostmqctl into $BIN in $(vmq_elapsed "$t") s"
    fi
fi
PLUGIN=$BIN/vhostmq-cni DATAPLANE=$BIN/vhostmq-dataplane CTL=$BIN/vhostmqctl
for b in "$PLUGIN" "$DATAPLANE" "$CTL"; do [[ -x $b ]] || vmq_die "$b missing (make build, or drop --no-build)"; done

CNITOOL=${VHOSTMQ_CNITOOL:-}
if part cnitool && [[ -z $CNITOOL ]]; then
    # the cni module is in go.mod; its cnitool needs cobra, which go.sum may lack
    if (cd "$VMQ_REPO_ROOT" && CGO_ENABLED=0 GOFLAGS=-mod=readonly timeout 300 \
        go build -trimpath -o "$WORK/cnitool" github.com/containernetworking/cni/cnitool) 2>"$WORK/cnitool-build.log"; then
        CNITOOL=$WORK/cnitool
    else
        vmq_log "cnitool does not build from go.mod ($(grep -m1 -o 'missing go.sum entry for module providing package [^ ]*' "$WORK/cnitool-build.log" || echo "see $WORK/cnitool-build.log"));" \
            "using hack/cluster's ($VMQC_CNITOOL_PKG)"
        vmqc_build_tools
        CNITOOL=$VMQC_TOOLS/cnitool
    fi
fi
if part crictl; then
    vmqc_build_tools
    vmqc_base_images
    CRICTL=$VMQC_TOOLS/crictl
    command -v containerd >/dev/null || vmq_die "containerd missing"
fi

# ------------------------------------------------------------------ the agent
allowed_cpus() {
    awk '/^Cpus_allowed_list:/ { n = split($2, r, ",")
        for (i = 1; i <= n; i++) { m = split(r[i], ab, "-"); hi = m > 1 ? ab[2] : ab[1]; for (c = ab[1]; c <= hi; c++) print c } }' /proc/self/status
}
mapfile -t CPUS < <(allowed_cpus | head -n 2)
((${#CPUS[@]} >= 1)) || vmq_die "cannot read this process's CPUs"
mkdir -p "$ROOT" "$WORK/state" "$WORK/devinfo" "$WORK/calls"
cat >"$WORK/dataplane.yaml" <<EOF
# hack/e2e-cni.sh
cpus: [$(IFS=,; echo "${CPUS[*]}")]
slotsPerCPU: 4
socketRoot: $ROOT
stateDir: $WORK/state
apiSocket: $API
logLevel: info
EOF
# shellcheck disable=SC2034  # read by vmq_ctl (hack/lib.sh)
VMQ_CTL=$CTL VMQ_API=$API
start_agent() {
    local t0 rc=0
    t0=$(now_ms)
    AGENT_N=$((AGENT_N + 1))
    vmq_bg "$WORK/agent-$AGENT_N.log" 900 "$DATAPLANE" --config "$WORK/dataplane.yaml"
    AGENT_PID=$VMQ_BG_PID
    vmq_wait_path "$API" 30 "$AGENT_PID" || rc=$?
    ((rc == 0)) && { vmq_poll 10 0.05 vmq_ctl capacity >/dev/null 2>&1 || rc=1; }
    if ((rc != 0)); then
        tail -n 20 "$WORK/agent-$AGENT_N.log" >&2
        vmq_die "the agent did not start (log $WORK/agent-$AGENT_N.log)"
    fi
    MS[agent_start_$AGENT_N]=$(($(now_ms) - t0))
    AGENT_UP=1
}
# stop_cmd PID: SIGTERM to the command running under `timeout` PID (started by
# vmq_bg), then reap it; sets VMQ_RC.  Signalling `timeout` itself (vmq_stop)
# delivers SIGTERM twice (it forwards it to the command, then to its process
# group), and the dataplane dies with 143 when the second one comes during its
# shutdown (seen in 7 of 40 tries); one SIGTERM must end it with status 0.
stop_cmd() {
    local pid=$1 child i
    child=$(vmq_child "$pid")
    [[ -n $child ]] && kill -TERM "$child" 2>/dev/null
    { for ((i = 0; i < 150; i++)); do vmq_alive "$pid" || break; sleep 0.1; done; } 2>/dev/null
    vmq_stop "$pid" # reaps it (or ends it, if it still runs 15 s later)
}
stop_agent() {
    stop_cmd "$AGENT_PID"
    AGENT_UP=0
    vmq_expect "agent #$AGENT_N's exit status on SIGTERM" "$VMQ_RC" 0
}
ports_json() { vmq_ctl -o json port list; }
port_ids() { ports_json | jq -r '.ports[].id' | sort | paste -sd' '; }
has_port() { [[ " $(port_ids) " == *" $1 "* ]]; }
no_port() { ! has_port "$1"; }
pending_ids() { find "$ROOT/.cni-pending-del" -mindepth 1 -maxdepth 1 -type f ! -name '.*' -printf '%f\n' 2>/dev/null | sort | paste -sd' '; }
# port_id CONTAINERID IFNAME, cnitool_cid NETNS_PATH, gen_mac CONTAINERID IFNAME:
# the plugin's and cnitool's derivations (cni.PortID, generatedMAC; cnitool)
port_id() { printf 'cni-%s' "$(printf '%s/%s' "$1" "$2" | sha256sum | cut -c1-24)"; }
cnitool_cid() { printf 'cnitool-%s' "$(printf '%s' "$1" | sha512sum | cut -c1-20)"; }
gen_mac() {
    local h
    h=$(printf 'mac/%s/%s' "$1" "$2" | sha256sum | cut -c1-12)
    printf '%02x:%s:%s:%s:%s:%s' $(((0x${h:0:2} & 0xfc) | 0x02)) "${h:2:2}" "${h:4:2}" "${h:6:2}" "${h:8:2}" "${h:10:2}"
}

# ------------------------------------------------------------------ the allocation (device plugin's part)
# allocate ID...: what plugin/allocate.go's Allocate does for one container
# (--socket-owner 107:107 --socket-mode 0770); sets ALLOC_DIR and ALLOC_LIST
allocate() {
    local sorted
    sorted=$(printf '%s\n' "$@" | LC_ALL=C sort | paste -sd,)
    ALLOC_DIR=qp-$(printf '%s' "$sorted" | sha256sum | cut -c1-16)
    ALLOC_LIST=$sorted
    install -d -m 0755 "$ROOT"
    install -d -m 0770 -o 107 -g 107 "$ROOT/$ALLOC_DIR"
    (IFS=,; echo "$*") >"$ROOT/.$ALLOC_DIR.slots"
    chmod 0600 "$ROOT/.$ALLOC_DIR.slots"
}
P=${CPUS[0]} Q=${CPUS[1]:-}
if [[ -n $Q ]]; then A_SLOTS=("c$P-s0" "c$Q-s0" "c$P-s1" "c$Q-s1"); else A_SLOTS=("c$P-s0" "c$P-s1" "c$P-s2" "c$P-s3"); fi
allocate "${A_SLOTS[@]}" # kubelet's order: the plugin's preferred allocation spreads over CPUs
A_DIR=$ALLOC_DIR A_LIST=$ALLOC_LIST
A_DEV=${A_LIST%%,*} # Multus passes one device ID; the first (sorted) is interface 0's
A_SLOTS_JSON=$(jq -cn --arg l "$A_LIST" '$l | split(",")')
A_CANON=c0-s0,c0-s1,c1-s0,c1-s1 # what A_LIST reads as on CPUs 0 and 1 (the goldens)

# norm: temporary paths, the netns path and this machine's CPU numbers
# replaced, so that output compares with the goldens
norm() {
    local args=(-e "s#$WORK#\$WORK#g" -e "s#$NETNS_PATH#\$NETNS#g" -e "s#$A_LIST#$A_CANON#g")
    args+=(-e "s/\\bc$P-s/\\x01c0-s/g")
    [[ -n $Q ]] && args+=(-e "s/\\bc$Q-s/\\x01c1-s/g")
    sed "${args[@]}" -e 's/\x01//g'
}
# golden NAME FILE: FILE equals $GOLDEN/NAME (--update: becomes it)
golden() {
    local name=$1 f=$2
    if ((UPDATE)); then
        mkdir -p "$GOLDEN"
        cp "$f" "$GOLDEN/$name"
        return 0
    fi
    if [[ ! -f $GOLDEN/$name ]]; then
        echo "    no $GOLDEN/$name (run with --update to create it)"
        return 1
    fi
    diff -u "$GOLDEN/$name" "$f" >"$f.diff" && return 0
    head -n 30 "$f.diff" | indent
    return 1
}
# port_is ID EXPECT_JSON: every key of EXPECT_JSON has that value in
# `vhostmqctl -o json port show ID`, and the port has one queue entry per
# queue pair, each on one of its slots; prints the differences
port_is() {
    local id=$1 want=$2 got
    got=$(vmq_ctl -o json port show "$id" 2>&1) || { echo "    port show $id: $got"; return 1; }
    echo "$got" >"$WORK/port-$id.json"
    jq -r --argjson w "$want" '. as $p
        | ($w | to_entries | map(select($p[.key] != .value) | "\(.key) is \($p[.key] | tojson), want \(.value | tojson)")) +
          (if ($p.status.queues | length) != $p.queue_pairs then ["\($p.status.queues | length) queue entries for \($p.queue_pairs) pairs"] else [] end) +
          [$p.status.queues[] | select(.slot as $s | $p.slots | map(. == $s) | any | not) | "pair \(.pair) on slot \(.slot), not one of the port'"'"'s"]
        | .[] | "    port \($p.id): " + .' <<<"$got" | tee "$WORK/port-$id.problems"
    [[ ! -s $WORK/port-$id.problems ]]
}
# cni_err FILE: a CNI error's code and msg, for FAIL lines
cni_err() { jq -r '"code \(.code): \(.msg)"' "$1" 2>/dev/null | head -n 1 || head -c 300 "$1"; }

start_agent
vmq_ok "agent up (CPUs ${CPUS[*]}, slotsPerCPU 4) in ${MS[agent_start_1]} ms; allocation $A_DIR = $A_LIST"

# ================================================================== 1. cnitool
if part cnitool; then
    section "1. cnitool ADD / CHECK / DEL ($CNITOOL)"
    [[ -e /run/netns/$NETNS ]] && vmq_die "netns $NETNS exists: another e2e-cni run? (else: ip netns del $NETNS)"
    ip netns add "$NETNS"
    NETNS_MADE=1
    CT=$WORK/cnitool.d
    mkdir -p "$CT/net.d" "$CT/bin" "$WORK/ipam"
    ln -s "$PLUGIN" "$CT/bin/vhostmq-cni"
    ln -s /usr/lib/cni/host-local "$CT/bin/host-local"
    CID=$(cnitool_cid "$NETNS_PATH")
    # conflist NAME CNIVERSION EXTRA_JSON: one vhostmq network for cnitool
    conflist() {
        jq -n --arg name "$1" --arg v "$2" --argjson extra "$3" --arg api "$API" --arg root "$ROOT" --arg pr "$NO_PODRES" \
            '{cniVersion: $v, name: $name, plugins: [{type: "vhostmq-cni", agentSocket: $api, socketRoot: $root,
              podResourcesSocket: $pr, capabilities: {deviceID: true, CNIDeviceInfoFile: true}} + $extra]}' >"$CT/net.d/$1.conflist"
    }
    conflist vhostmq-e2e 1.1.0 '{}'
    conflist vhostmq-e2e-client 1.1.0 '{"socketMode": "client"}'
    conflist vhostmq-e2e-ipam 1.0.0 "$(jq -cn --arg d "$WORK/ipam" '{ipam: {type: "host-local", subnet: "192.0.2.0/28", dataDir: $d}}')"
    # cnitool_run LABEL CMD NETWORK IFNAME: sets RC, OUT, MS[LABEL]
    cnitool_run() {
        local t0
        LABEL=$1 OUT=$CT/$1.out
        RC=0
        t0=$(now_ms)
        NETCONFPATH=$CT/net.d CNI_PATH=$CT/bin CNI_IFNAME=$4 \
            CAP_ARGS="{\"deviceID\":\"$A_DEV\",\"CNIDeviceInfoFile\":\"$WORK/devinfo/$4.json\"}" \
            CNI_ARGS="IgnoreUnknown=1;K8S_POD_NAMESPACE=$POD_NS;K8S_POD_NAME=$POD_NAME;K8S_POD_UID=$POD_UID" \
            timeout 60 "$CNITOOL" "$2" "$3" "$NETNS_PATH" >"$OUT" 2>"$OUT.err" || RC=$?
        MS[$1]=$(($(now_ms) - t0))
    }
    # ok_run WHAT: pass/fail on RC, showing cnitool's error
    ok_run() {
        if ((RC == 0)); then vmq_ok "$1: exit 0 (${MS[$LABEL]} ms)"; else vmq_fail "$1: exit $RC: $(head -n 1 "$OUT.err")"; fi
    }
    # cache_entry NETWORK IFNAME: libcni's cached result of an attachment
    cache_entry() { echo "/var/lib/cni/results/$1-$CID-$2"; }

    # ---- default network: socketMode server (QEMU creates the socket)
    ID=$(port_id "$CID" net1)
    HOST_SOCK=$ROOT/$A_DIR/net1.sock
    cnitool_run add add vhostmq-e2e net1; ok_run "cnitool add"
    if ((RC == 0)); then
        { cat "$OUT"; echo; } | norm >"$CT/add-result.json"
        vmq_check "ADD result matches hack/testdata/cni/add-result.json" golden add-result.json "$CT/add-result.json"
    else
        vmq_fail "ADD result: none to compare with hack/testdata/cni/add-result.json"
    fi
    MAC=$(jq -r '.interfaces[0].mac // empty' "$OUT" 2>/dev/null || true)
    vmq_expect "ADD result's MAC, the plugin's derivation from container ID $CID and net1" "$MAC" "$(gen_mac "$CID" net1)"
    DI=$WORK/devinfo/net1.json
    if [[ -f $DI ]]; then
        { cat "$DI"; echo; } | norm >"$CT/add-devinfo.json"
        vmq_check "device-info file matches hack/testdata/cni/add-devinfo.json" golden add-devinfo.json "$CT/add-devinfo.json"
        vmq_expect "device-info file's mode (read-only)" "$(stat -c %a "$DI")" 444
    else
        vmq_fail "ADD wrote no device-info file $DI"
    fi
    want=$(jq -cn --arg sock "$HOST_SOCK" --arg mac "$MAC" --argjson slots "$A_SLOTS_JSON" --arg cid "$CID" \
        --arg ns "$POD_NS" --arg name "$POD_NAME" --arg uid "$POD_UID" \
        '{queue_pairs: 4, slots: $slots, socket: $sock, mac: $mac, role: "client", mtu: 1500,
          socket_uid: 107, socket_gid: 107, socket_mode: "0770", pod: "\($ns)/\($name)",
          labels: {"cni.containerID": $cid, "cni.ifname": "net1", interface: "net1", network: "vhostmq-e2e",
                   "k8s.pod.namespace": $ns, "k8s.pod.name": $name, "k8s.pod.uid": $uid}}')
    vmq_check "vhostmqctl port show $ID: 4 queue pairs on $A_LIST, socket \$WORK/root/$A_DIR/net1.sock, MAC, 0770 107:107, pod labels" port_is "$ID" "$want"
    vmq_expect "vhostmqctl port list: exactly that port" "$(port_ids)" "$ID"
    cnitool_run check check vhostmq-e2e net1; ok_run "cnitool check"
    cnitool_run del del vhostmq-e2e net1; ok_run "cnitool del"
    vmq_check "DEL: port $ID gone" no_port "$ID"
    vmq_check "DEL: device-info file gone" test ! -e "$DI"
    vmq_check "DEL: libcni cache entry gone" test ! -e "$(cache_entry vhostmq-e2e net1)"
    cnitool_run del2 del vhostmq-e2e net1; ok_run "cnitool del again"
    vmq_expect "nothing left: ports" "$(port_ids)" ""

    # ---- socketMode client: the dataplane listens in the allocation folder
    ID=$(port_id "$CID" net2)
    HOST_SOCK=$ROOT/$A_DIR/net2.sock
    cnitool_run add_client add vhostmq-e2e-client net2; ok_run "socketMode client: cnitool add"
    vmq_check "socketMode client: the agent listens on \$WORK/root/$A_DIR/net2.sock" test -S "$HOST_SOCK"
    vmq_expect "socketMode client: device-info's vhost-user: mode client, path $CTR_DIR/net2.sock" \
        "$(jq -c '."vhost-user"' "$WORK/devinfo/net2.json" 2>/dev/null)" "{\"mode\":\"client\",\"path\":\"$CTR_DIR/net2.sock\"}"
    vmq_check "socketMode client: port role server" port_is "$ID" '{"role":"server","queue_pairs":4}'
    cnitool_run check_client check vhostmq-e2e-client net2; ok_run "socketMode client: cnitool check"
    cnitool_run del_client del vhostmq-e2e-client net2; ok_run "socketMode client: cnitool del"
    client_gone() { [[ -z $(port_ids) && ! -e $HOST_SOCK ]]; }
    vmq_check "socketMode client: DEL removed the port and its socket" client_gone

    # ---- IPAM delegation to host-local
    ID=$(port_id "$CID" net1)
    LEASES=$WORK/ipam/vhostmq-e2e-ipam
    leases() { find "$LEASES" -maxdepth 1 -type f -name '[0-9]*.[0-9]*' -printf '%f\n' 2>/dev/null | paste -sd' '; }
    cnitool_run add_ipam add vhostmq-e2e-ipam net1; ok_run "host-local IPAM: cnitool add"
    if ((RC == 0)); then
        { cat "$OUT"; echo; } | norm >"$CT/add-ipam-result.json"
        vmq_check "host-local IPAM: ADD result (192.0.2.2/28 on interface 0) matches hack/testdata/cni/add-ipam-result.json" \
            golden add-ipam-result.json "$CT/add-ipam-result.json"
    else
        vmq_fail "host-local IPAM: ADD result: none to compare with hack/testdata/cni/add-ipam-result.json"
    fi
    vmq_check "host-local IPAM: lease 192.0.2.2 held for $CID" grep -qs "$CID" "$LEASES/192.0.2.2"
    vmq_check "host-local IPAM: port $ID exists" has_port "$ID"
    vmq_check "host-local IPAM: port $ID has dhcp on (the default with ipam) with the IPAM result" port_is "$ID" \
        '{"network":"vhostmq-e2e-ipam","dhcp":true,"ip":{"addresses":["192.0.2.2/28"],"gateway":"192.0.2.1","routes":[],"dns_servers":[],"dns_search":[],"lease_seconds":0}}'
    cnitool_run check_ipam check vhostmq-e2e-ipam net1; ok_run "host-local IPAM: cnitool check"
    cnitool_run del_ipam del vhostmq-e2e-ipam net1; ok_run "host-local IPAM: cnitool del"
    vmq_expect "host-local IPAM: DEL released the lease: leases in dataDir" "$(leases)" ""
    vmq_check "host-local IPAM: DEL removed the port" no_port "$ID"
    cnitool_run del2_ipam del vhostmq-e2e-ipam net1; ok_run "host-local IPAM: cnitool del again"
    nothing_left() { [[ -z $(port_ids) && -z $(find "$WORK/devinfo" "$ROOT" -type f -name "*.json" -o -type s) && -z $(pending_ids) ]]; }
    vmq_check "cnitool part: no port, device-info file, socket or pending deletion left" nothing_left
    ip netns del "$NETNS" && NETNS_MADE=0
fi

# ================================================================== 2. containerd + crictl
if part crictl; then
    section "2. containerd + crictl runp / stopp / rmp"
    vmqc_is_up && vmq_log "the hack/cluster node is up: its containerd is left alone (ours has its own socket, root, state)"
    mkdir -p "$CTD/cni-bin" "$CTD/net.d" "$CTD/ipam" "$CTD/logs" "$CTD/opt"
    ln -s /usr/lib/cni/loopback "$CTD/cni-bin/loopback" # containerd 1.6 sets up lo in every sandbox
    ln -s /usr/lib/cni/host-local "$CTD/cni-bin/host-local"
    CALLS=$CTD/plugin-calls.log # COMMAND|EXIT|CONTAINERID|NETNS|IFNAME|CNI_ARGS
    : >"$CALLS"
    # the logging shim containerd runs as "vhostmq-cni": records every call
    # (command, exit status, container ID, netns, ifname, CNI_ARGS), passes
    # stdin, stdout and the exit status through unchanged
    cat >"$CTD/cni-bin/vhostmq-cni" <<EOF
#!/bin/bash
out=\$("$PLUGIN"); rc=\$?
printf '%s' "\$out"
printf '%s|%s|%s|%s|%s|%s\n' "\${CNI_COMMAND:-}" "\$rc" "\${CNI_CONTAINERID:-}" "\${CNI_NETNS:-}" "\${CNI_IFNAME:-}" "\${CNI_ARGS:-}" >>"$CALLS"
exit \$rc
EOF
    chmod 0755 "$CTD/cni-bin/vhostmq-cni"
    jq -n --arg api "$API" --arg root "$ROOT" --arg pr "$NO_PODRES" --arg dev "$A_DEV" --arg d "$CTD/ipam" \
        '{cniVersion: "1.0.0", name: "vhostmq-e2e-ctd", plugins: [{type: "vhostmq-cni", agentSocket: $api, socketRoot: $root,
          podResourcesSocket: $pr, deviceID: $dev, ipam: {type: "host-local", subnet: "192.0.2.0/28", dataDir: $d}}]}' \
        >"$CTD/net.d/10-vhostmq-e2e-ctd.conflist"
    cat >"$CTD/containerd.toml" <<EOF
version = 2
root = "$CTD/root"
state = "$CTD/state"
[grpc]
  address = "$CTD_SOCK"
[plugins."io.containerd.internal.v1.opt"]
  path = "$CTD/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$VMQC_PAUSE_IMAGE"
  # root here lacks CAP_SYS_RESOURCE (see hack/cluster/cluster.sh)
  restrict_oom_score_adj = true
  # pod netns files in our state folder, not /var/run/netns
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "$CTD/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$CTD/cni-bin"
    conf_dir = "$CTD/net.d"
    max_conf_num = 1
EOF
    printf 'runtime-endpoint: unix://%s\nimage-endpoint: unix://%s\ntimeout: 60\n' "$CTD_SOCK" "$CTD_SOCK" >"$CTD/crictl.yaml"
    crictl() { timeout 90 "$CRICTL" --config "$CTD/crictl.yaml" "$@"; }
    # the pod's cgroups nest under ours (as hack/cluster's do); removed at exit
    if [[ $(stat -fc %T /sys/fs/cgroup) == cgroup2fs ]]; then
        CGROUP_PARENT=/vhostmq-e2e-cni-$$
    else
        CGROUP_PARENT=$(awk -F: '$2 == "memory" { print $3 }' /proc/self/cgroup)
        CGROUP_PARENT=${CGROUP_PARENT%/}/vhostmq-e2e-cni-$$
    fi
    jq -n --arg ns "$POD_NS" --arg name "$POD_NAME" --arg uid "$POD_UID" --arg logs "$CTD/logs" --arg cg "$CGROUP_PARENT" \
        '{metadata: {name: $name, namespace: $ns, uid: $uid, attempt: 0}, log_directory: $logs, linux: {cgroup_parent: $cg}}' >"$CTD/pod.json"

    t=$(now_ms)
    vmq_bg "$CTD/containerd.log" 600 containerd --config "$CTD/containerd.toml"
    CTD_PID=$VMQ_BG_PID
    vmq_poll 30 0.1 timeout 5 ctr -a "$CTD_SOCK" version >/dev/null 2>&1 ||
        { tail -n 20 "$CTD/containerd.log" >&2; vmq_die "our containerd did not start (log $CTD/containerd.log)"; }
    # Debian's containerd here, so its own ctr (the cluster's ctr 2.x
    # speaks an API containerd 1.6 lacks)
    (VMQC_CTR_SOCK=$CTD_SOCK && VMQC_CTR=$(command -v ctr) && vmqc_import "$VMQC_IMAGES/pause.tar")
    MS[containerd]=$(($(now_ms) - t))
    vmq_ok "containerd $(containerd --version | awk '{ print $3 }') up on \$WORK/ctd/containerd.sock, $VMQC_PAUSE_IMAGE imported (${MS[containerd]} ms)"

    # calls CMD: the shim's lines for CMD
    calls() { awk -F'|' -v c="$1" '$1 == c' "$CALLS"; }
    ncalls() { calls "$1" | wc -l; }
    t=$(now_ms)
    SID=$(crictl runp "$CTD/pod.json" 2>"$CTD/runp.err") && RC=0 || RC=$?
    MS[runp]=$(($(now_ms) - t))
    if ((RC == 0)) && [[ -n $SID ]]; then
        vmq_ok "crictl runp: sandbox ${SID:0:13} (${MS[runp]} ms)"
    else
        vmq_fail "crictl runp: exit $RC: $(tail -n 3 "$CTD/runp.err" | tr '\n' ' ')"
        SID=$(crictl pods -q 2>/dev/null | head -n 1 || true)
    fi
    ID=$(port_id "$SID" eth0)
    IFS='|' read -r _ add_rc add_cid add_netns add_if add_args < <(calls ADD | head -n 1) || true
    add_ok() { [[ $(ncalls ADD) == 1 && $add_rc == 0 && $add_cid == "$SID" && $add_if == eth0 && $add_netns == "$CTD"/state/* ]]; }
    vmq_check "runp: containerd ran ADD once (exit ${add_rc:-none}) for the sandbox, ifname eth0, in a netns" add_ok
    pod_args() { [[ ";$add_args;" == *";K8S_POD_NAMESPACE=$POD_NS;"* && ";$add_args;" == *";K8S_POD_NAME=$POD_NAME;"* && ";$add_args;" == *";K8S_POD_UID=$POD_UID;"* ]]; }
    vmq_check "runp: CNI_ARGS carry K8S_POD_NAMESPACE/NAME/UID from the pod metadata" pod_args
    want=$(jq -cn --arg sock "$ROOT/$A_DIR/eth0.sock" --argjson slots "$A_SLOTS_JSON" --arg cid "$SID" \
        --arg ns "$POD_NS" --arg name "$POD_NAME" --arg uid "$POD_UID" \
        '{queue_pairs: 4, slots: $slots, socket: $sock, role: "client",
          labels: {"cni.containerID": $cid, "cni.ifname": "eth0", interface: "eth0", network: "vhostmq-e2e-ctd",
                   "k8s.pod.namespace": $ns, "k8s.pod.name": $name, "k8s.pod.uid": $uid}}')
    vmq_check "runp: port $ID on the allocation, labelled with the sandbox and the pod's namespace, name, UID" port_is "$ID" "$want"
    ip=$(crictl inspectp "$SID" 2>/dev/null | jq -r '.status.network.ip // empty' || true)
    vmq_expect "runp: the sandbox's address, host-local's" "$ip" 192.0.2.2
    state=$(crictl inspectp "$SID" 2>/dev/null | jq -r '.status.state // empty' || true)
    vmq_expect "runp: sandbox state" "$state" SANDBOX_READY

    t=$(now_ms)
    crictl stopp "$SID" >"$CTD/stopp.out" 2>&1 && RC=0 || RC=$?
    MS[stopp]=$(($(now_ms) - t))
    vmq_expect "crictl stopp: exit status (${MS[stopp]} ms)" "$RC" 0
    IFS='|' read -r _ del_rc del_cid del_netns _ _ < <(calls DEL | head -n 1) || true
    del_ok() { [[ $(ncalls DEL) == 1 && $del_rc == 0 && $del_cid == "$SID" && -n $del_netns && $del_netns == "$add_netns" ]]; }
    vmq_check "stopp: containerd ran DEL (exit ${del_rc:-none}) with the sandbox's netns" del_ok
    vmq_check "stopp: port $ID gone" no_port "$ID"
    no_lease() { [[ -z $(find "$CTD/ipam" -type f -name "192.0.2.*") ]]; }
    vmq_check "stopp: host-local lease released" no_lease

    t=$(now_ms)
    crictl rmp "$SID" >"$CTD/rmp.out" 2>&1 && RC=0 || RC=$?
    MS[rmp]=$(($(now_ms) - t))
    vmq_expect "crictl rmp: exit status (${MS[rmp]} ms)" "$RC" 0
    IFS='|' read -r _ del2_rc del2_cid del2_netns _ _ < <(calls DEL | sed -n 2p) || true
    del2_ok() { [[ $(ncalls DEL) == 2 && $del2_rc == 0 && $del2_cid == "$SID" && -z $del2_netns ]]; }
    vmq_check "rmp: containerd ran DEL a second time, with an empty CNI_NETNS, and it succeeded (exit ${del2_rc:-none})" del2_ok
    all_gone() { [[ -z $(crictl pods -q 2>/dev/null) && -z $(port_ids) && -z $(pending_ids) ]]; }
    vmq_check "rmp: no sandbox, no port, no pending deletion left" all_gone
    stop_cmd "$CTD_PID"
    vmq_expect "containerd's exit status on SIGTERM" "$VMQ_RC" 0
fi

# ================================================================== 3. bad input
if part errors; then
    section "3. bad input and a vanishing agent (the plugin binary, run directly)"
    EB=$(jq -nc --arg api "$API" --arg root "$ROOT" --arg pr "$NO_PODRES" --arg dev "$A_DEV" --arg di "$WORK/devinfo/errors.json" \
        '{cniVersion: "1.1.0", name: "vhostmq-e2e-errors", type: "vhostmq-cni", agentSocket: $api, socketRoot: $root,
          podResourcesSocket: $pr, deviceID: $dev, runtimeConfig: {CNIDeviceInfoFile: $di}}')
    econf() { jq -c "$@" <<<"$EB"; } # econf [JQ OPTIONS] FILTER: the base configuration changed
    ENV_ADD=(CNI_COMMAND=ADD CNI_CONTAINERID=e2e-errors CNI_NETNS=/var/run/netns/e2e-errors CNI_IFNAME=net1)
    EOUT=$WORK/errors.out
    printf '# hack/e2e-cni.sh part 3: CASE<TAB>exit status<TAB>stdout as compact sorted JSON (the CNI error),\n# or "-" when empty, or "stderr: FIRST LINE" when only stderr has output; paths normalised\n' >"$EOUT"
    declare -A GOLD=()
    if [[ -f $GOLDEN/errors.golden ]]; then
        while IFS=$'\t' read -r name rest; do
            [[ $name == \#* || -z $name ]] || GOLD[$name]=$rest
        done <"$GOLDEN/errors.golden"
    fi
    # plugin OUT CONF ENV...: the binary as a runtime runs it; sets RC, MS[direct]
    plugin() {
        local out=$1 conf=$2 t0
        shift 2
        RC=0
        t0=$(now_ms)
        printf '%s' "$conf" | timeout 30 env -i PATH="$PATH" CNI_PATH=/usr/lib/cni "$@" "$PLUGIN" >"$out" 2>"$out.err" || RC=$?
        MS[direct]=$(($(now_ms) - t0))
    }
    # leftovers WANT_PORTS WANT_PENDING: what is left besides the expected
    leftovers() {
        local f
        if ((AGENT_UP)); then f=$(port_ids); [[ $f == "$1" ]] || echo "ports [$f], want [$1]"; fi
        f=$(find "$WORK/devinfo" -type f | norm | paste -sd' ')
        [[ -z $f ]] || echo "device-info files: $f"
        f=$(find "$ROOT" -type s | norm | paste -sd' ')
        [[ -z $f ]] || echo "sockets: $f"
        f=$(pending_ids)
        [[ $f == "$2" ]] || echo "pending deletions [$f], want [$2]"
    }
    # ecase NAME CONF ENV...: run one case; its exit status and output must
    # match errors.golden, and nothing may be left (ports: WANT_PORTS,
    # pending deletions: WANT_PENDING)
    WANT_PORTS="" WANT_PENDING=""
    ecase() {
        local name=$1 conf=$2 out line left want
        shift 2
        out=$WORK/calls/$name.out
        plugin "$out" "$conf" "$@"
        if [[ -s $out ]]; then
            line=$(jq -S -c . "$out" 2>/dev/null || tr '\n' ' ' <"$out")
        elif [[ -s $out.err ]]; then
            line="stderr: $(head -n 1 "$out.err")"
        else
            line=-
        fi
        line=$(printf 'rc=%s\t%s' "$RC" "$line" | norm)
        printf '%s\t%s\n' "$name" "$line" >>"$EOUT"
        left=$(leftovers "$WANT_PORTS" "$WANT_PENDING")
        if ((UPDATE)) || [[ ${GOLD[$name]:-} == "$line" ]]; then
            if [[ -z $left ]]; then
                vmq_ok "$name: ${line//$'\t'/ } (${MS[direct]} ms); nothing left"
            else
                vmq_fail "$name: ${line//$'\t'/ }; but left: $left"
            fi
        else
            want=${GOLD[$name]:-(not in errors.golden)}
            vmq_fail "$name: ${line//$'\t'/ }; want ${want//$'\t'/ }${left:+; left: $left}"
        fi
    }
    # setup OUT CONF ENV...: a call that must succeed (not a golden case)
    setup() {
        local what=$1
        shift
        plugin "$WORK/calls/setup.out" "$@"
        if ((RC == 0)); then
            vmq_ok "$what (${MS[direct]} ms)"
        else
            vmq_fail "$what: exit $RC: $(cni_err "$WORK/calls/setup.out")"
        fi
    }

    vmq_expect "before: ports, device-info files, sockets or pending deletions" "$(leftovers "" "")" ""
    # environment
    ecase no-command "$EB" CNI_CONTAINERID=e2e-errors CNI_NETNS=/var/run/netns/e2e-errors CNI_IFNAME=net1
    ecase no-containerid "$EB" CNI_COMMAND=ADD CNI_NETNS=/var/run/netns/e2e-errors CNI_IFNAME=net1
    ecase no-ifname "$EB" CNI_COMMAND=ADD CNI_CONTAINERID=e2e-errors CNI_NETNS=/var/run/netns/e2e-errors
    ecase no-netns "$EB" CNI_COMMAND=ADD CNI_CONTAINERID=e2e-errors CNI_IFNAME=net1
    ecase del-no-ifname "$EB" CNI_COMMAND=DEL CNI_CONTAINERID=e2e-errors
    ecase bad-ifname "$EB" CNI_COMMAND=ADD CNI_CONTAINERID=e2e-errors CNI_NETNS=/var/run/netns/e2e-errors CNI_IFNAME=net/1
    # configuration
    ecase bad-json '{"cniVersion": "1.1.0", "name": "vhostmq-e2e-errors", "type": ' "${ENV_ADD[@]}"
    ecase unknown-field "$(econf '. + {queues: 4}')" "${ENV_ADD[@]}"
    ecase bad-cniversion "$(econf '.cniVersion = "0.2.0"')" "${ENV_ADD[@]}"
    ecase bad-mtu "$(econf '.mtu = 65000')" "${ENV_ADD[@]}"
    ecase bad-socketmode "$(econf '.socketMode = "listen"')" "${ENV_ADD[@]}"
    ecase bad-queuepairs "$(econf '.queuePairs = 129')" "${ENV_ADD[@]}"
    ecase bad-dhcp "$(econf '.dhcp = "yes"')" "${ENV_ADD[@]}"
    ecase dhcp-without-ipam "$(econf '.dhcp = true')" "${ENV_ADD[@]}"
    ecase bad-vlan "$(econf '.vlan = 4095')" "${ENV_ADD[@]}"
    ecase bad-uplink "$(econf '.uplink = "eth0"')" "${ENV_ADD[@]}"
    ecase vxlan-without-vni "$(econf '.uplink = "vxlan"')" "${ENV_ADD[@]}"
    ecase vni-without-vxlan "$(econf '.vni = 7')" "${ENV_ADD[@]}"
    # the agent refuses: this node has no tap uplink
    ecase uplink-not-on-node "$(econf '.uplink = "tap"')" "${ENV_ADD[@]}"
    # allocation
    ecase no-deviceid "$(econf 'del(.deviceID)')" "${ENV_ADD[@]}"
    mkdir -p "$WORK/empty-root"
    # shellcheck disable=SC2016  # $r is jq's
    ecase no-allocations "$(econf --arg r "$WORK/empty-root" '.socketRoot = $r')" "${ENV_ADD[@]}"
    ecase unknown-deviceid "$(econf '.deviceID = "c9-s9"')" "${ENV_ADD[@]}"
    ecase queuepairs-above-allocation "$(econf '.queuePairs = 8')" "${ENV_ADD[@]}"
    # the agent refuses: another port holds the allocation's slots
    HOLDER=$(port_id e2e-holder net9)
    setup "ADD e2e-holder/net9 on the allocation" "$(econf 'del(.runtimeConfig)')" \
        CNI_COMMAND=ADD CNI_CONTAINERID=e2e-holder CNI_NETNS=/var/run/netns/e2e-holder CNI_IFNAME=net9
    WANT_PORTS=$HOLDER
    ecase slots-in-use "$EB" "${ENV_ADD[@]}"
    WANT_PORTS=""
    setup "DEL e2e-holder/net9" "$(econf 'del(.runtimeConfig)')" \
        CNI_COMMAND=DEL CNI_CONTAINERID=e2e-holder CNI_NETNS=/var/run/netns/e2e-holder CNI_IFNAME=net9
    # the port is made (socketMode client: its socket too), then the
    # device-info file cannot be written: both must be rolled back
    : >"$WORK/not-a-folder"
    # shellcheck disable=SC2016  # $f is jq's
    ecase devinfo-unwritable "$(econf --arg f "$WORK/not-a-folder/net1.json" '.socketMode = "client" | .runtimeConfig.CNIDeviceInfoFile = $f')" "${ENV_ADD[@]}"
    ecase check-missing-port "$EB" CNI_COMMAND=CHECK CNI_CONTAINERID=e2e-errors CNI_NETNS=/var/run/netns/e2e-errors CNI_IFNAME=net1

    # ---- the agent goes away
    PEND=$(port_id e2e-pend net1)
    ENV_PEND=(CNI_CONTAINERID=e2e-pend CNI_NETNS=/var/run/netns/e2e-pend CNI_IFNAME=net1)
    setup "ADD e2e-pend/net1 (agent up)" "$(econf 'del(.runtimeConfig)')" CNI_COMMAND=ADD "${ENV_PEND[@]}"
    stop_agent
    WANT_PORTS=""
    ecase agent-down-add "$EB" "${ENV_ADD[@]}"
    ecase agent-down-status "$EB" CNI_COMMAND=STATUS
    WANT_PENDING=$PEND
    ecase agent-down-del "$(econf 'del(.runtimeConfig)')" CNI_COMMAND=DEL "${ENV_PEND[@]}"
    vmq_expect "agent down: DEL recorded the pending deletion of e2e-pend/net1" \
        "$(jq -r '"\(.id) \(.containerID) \(.ifname)"' "$ROOT/.cni-pending-del/$PEND" 2>/dev/null)" "$PEND e2e-pend net1"
    ecase agent-down-gc "$(econf '. + {"cni.dev/valid-attachments": []}')" CNI_COMMAND=GC
    start_agent
    vmq_ok "agent back (restart: ${MS[agent_start_$AGENT_N]} ms)"
    restored() { [[ $(port_ids) == "$PEND" && $(pending_ids) == "$PEND" ]]; }
    vmq_check "agent back: it restored port $PEND from its state dir; the deletion is still pending" restored
    WANT_PENDING=""
    ecase gc-after-agent-returns "$(econf '. + {"cni.dev/valid-attachments": []}')" CNI_COMMAND=GC
    # and once more, cleared by the next ADD instead of GC
    PEND2=$(port_id e2e-pend2 net1)
    ENV_PEND2=(CNI_CONTAINERID=e2e-pend2 CNI_NETNS=/var/run/netns/e2e-pend2 CNI_IFNAME=net1)
    setup "ADD e2e-pend2/net1 (agent up)" "$(econf 'del(.runtimeConfig)')" CNI_COMMAND=ADD "${ENV_PEND2[@]}"
    stop_agent
    setup "DEL e2e-pend2/net1 with the agent down" "$(econf 'del(.runtimeConfig)')" CNI_COMMAND=DEL "${ENV_PEND2[@]}"
    vmq_expect "agent down: pending deletions recorded" "$(pending_ids)" "$PEND2"
    start_agent
    NEXT=$(port_id e2e-next net1)
    setup "agent back: ADD e2e-next/net1" "$EB" CNI_COMMAND=ADD CNI_CONTAINERID=e2e-next CNI_NETNS=/var/run/netns/e2e-next CNI_IFNAME=net1
    next_only() { [[ $(port_ids) == "$NEXT" && -z $(pending_ids) ]]; }
    vmq_check "that ADD deleted the restored $PEND2 and cleared the pending record, then made $NEXT on the same slots" next_only
    setup "DEL e2e-next/net1" "$EB" CNI_COMMAND=DEL CNI_CONTAINERID=e2e-next CNI_NETNS=/var/run/netns/e2e-next CNI_IFNAME=net1
    vmq_expect "after the matrix: ports, device-info files, sockets or pending deletions left" "$(leftovers "" "")" ""

    if ((UPDATE)); then
        cp "$EOUT" "$GOLDEN/errors.golden"
        vmq_log "wrote $GOLDEN/errors.golden"
    else
        extra=$(comm -23 <(printf '%s\n' "${!GOLD[@]}" | sort) <(grep -v '^#' "$EOUT" | cut -f1 | sort) | paste -sd' ')
        vmq_expect "cases of errors.golden that did not run" "$extra" ""
    fi
fi

# ================================================================== summary
((AGENT_UP)) && stop_agent
echo
echo "===== vhostmq e2e-cni: parts $PARTS ($(vmq_elapsed "$T0") s) ====="
echo "timings (ms, wall clock of the whole command, plugin process start included):"
ms() { echo "${MS[$1]:--}"; }
part cnitool && printf '  cnitool             ADD %s  CHECK %s  DEL %s  DEL again %s\n' "$(ms add)" "$(ms check)" "$(ms del)" "$(ms del2)"
part cnitool && printf '  cnitool, client     ADD %s  CHECK %s  DEL %s\n' "$(ms add_client)" "$(ms check_client)" "$(ms del_client)"
part cnitool && printf '  cnitool, host-local ADD %s  CHECK %s  DEL %s  DEL again %s\n' "$(ms add_ipam)" "$(ms check_ipam)" "$(ms del_ipam)" "$(ms del2_ipam)"
part crictl && printf '  crictl              runp %s  stopp %s  rmp %s  (containerd start + image import %s)\n' "$(ms runp)" "$(ms stopp)" "$(ms rmp)" "$(ms containerd)"
a=""
for ((i = 1; i <= AGENT_N; i++)); do a+=" $(ms "agent_start_$i")"; done
printf '  agent start to API answering:%s\n' "${a:-}"
((UPDATE)) && echo "golden files rewritten in $GOLDEN: review with git diff"
vmq_fails_report
