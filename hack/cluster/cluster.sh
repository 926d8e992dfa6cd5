#!/usr/bin/env bash
# The project's one-node Kubernetes test cluster: etcd, kube-apiserver,
# kube-scheduler, kube-controller-manager, containerd and a kubelet, all on this
# machine, all in a network namespace of their own, all started and stopped by
# PID by this script.  For the device-plugin (and later CNI) cluster tests.
#
# Usage: hack/cluster/cluster.sh COMMAND
#   up               install the node packages if missing, build (or take from
#                    the cache) the Kubernetes binaries, crictl, cnitool and
#                    the pause/busybox images, start the node, wait until it
#                    is Ready; prints the bring-up timings
#   down             delete every pod (so CNI DEL runs), stop all daemons by
#                    PID, unmount, remove the netns, cgroups, state and every
#                    host folder that up (or the pods) created; logs are kept
#                    in VHOSTMQ_CLUSTER_LOGS (down --purge removes them too)
#   exec [--] CMD    run CMD inside the node's network namespace with
#                    KUBECONFIG set and kubectl, crictl, cnitool first on PATH
#   env              print the cluster's environment as export lines
#   status           daemons, node, pods, bring-up timings
#   restart-kubelet  stop the kubelet and start it again (pods keep running)
#   add-node         a second node, vhostmq-node2, joined to the running
#                    cluster: its own netns (192.0.2.2, pods 198.18.0.0/24,
#                    routed to the first node's over a veth), its own mount
#                    namespace (its /run, /var/lib/kubelet and the other
#                    per-node host folders are its own, the rest of the file
#                    system is shared), containerd and kubelet; waits until
#                    it is Ready.  down takes it down with the rest.
#   exec2 [--] CMD   run CMD in the second node's netns and mount namespace
#   build            packages, binaries and images only (warms the cache)
#
# Environment (defaults):
#   VHOSTMQ_K8S_CACHE=/var/cache/vhostmq/k8s  binaries and base images, kept
#                        between runs; a run without it builds (10-17 min cold)
#   VHOSTMQ_K8S_VERSION=v1.37.2
#   VHOSTMQ_CLUSTER_RUN=/run/vhostmq-cluster        PIDs, sockets, CNI config
#   VHOSTMQ_CLUSTER_DATA=/var/lib/vhostmq-cluster   etcd, containerd root, pki
#   VHOSTMQ_CLUSTER_LOGS=/var/log/vhostmq-cluster   daemon and pod logs
#   VHOSTMQ_CLUSTER_NETNS=vhostmq-cluster
#   VHOSTMQ_CLUSTER_LIFETIME=3600   a watchdog runs `down` after this many s
#   VHOSTMQ_CLUSTER_STATUS_FREQ=1s  kubelet node status update/report period
#   VHOSTMQ_CLUSTER_CNI_CONFLIST=   a conflist to use instead of bridge+host-local
#   VHOSTMQ_CLUSTER_CNI_PLUGINS=    extra CNI plugin binaries (space-separated
#                        paths) linked into the node's CNI bin folder
#   VHOSTMQ_CLUSTER_CNI_CONFLIST2=  add-node: the second node's conflist
#                        (default: bridge + host-local on its pod range)
#
# Isolation: the node's netns holds lo and a veth pair (both ends inside, this
# kernel has no dummy netdev) with 192.0.2.1; pods get 198.51.100.0/24,
# services 203.0.113.0/24 (RFC 5737 ranges), no default route: nothing leaves
# the namespace.  Pod cgroups nest under the caller's memory cgroup.  CNI
# binaries and config live in VHOSTMQ_CLUSTER_RUN, not /opt/cni or /etc/cni.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$HERE/lib.sh"
VMQ_TAG=cluster
SELF=$HERE/$(basename "${BASH_SOURCE[0]}")

LIFETIME=${VHOSTMQ_CLUSTER_LIFETIME:-3600}
STATUS_FREQ=${VHOSTMQ_CLUSTER_STATUS_FREQ:-1s}
CNI_CONFLIST=${VHOSTMQ_CLUSTER_CNI_CONFLIST:-}
CNI_PLUGINS=${VHOSTMQ_CLUSTER_CNI_PLUGINS:-}
CNI_BIN=$VMQC_RUN/cni/bin
CNI_CONF=$VMQC_RUN/cni/net.d
# host paths that up, the kubelet, containerd or our DaemonSet create; down
# removes those that did not exist before up (and /var/lib/kubelet if it
# carries our marker file)
HOST_PATHS=(/run/vhostmq /var/lib/vhostmq /run/k8s.cni.cncf.io /var/lib/cni
    /run/containerd /run/netns /var/log/containers /var/log/pods /run/xtables.lock)
SYSCTLS=(vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops
    kernel.keys.root_maxkeys kernel.keys.root_maxbytes)

# ------------------------------------------------------------------ lock
# One cluster.sh up/down/restart at a time; the lock is the cache folder.
take_lock() {
    mkdir -p "$VMQC_CACHE"
    exec 9<"$VMQC_CACHE"
    flock -w "${1:-10}" 9 || vmq_die "another cluster.sh up/down/build is running (lock on $VMQC_CACHE)"
}

# ------------------------------------------------------------------ processes
# start_proc NAME CMD...: start a daemon inside the netns, in a session of its
# own, logging to $VMQC_LOGS/NAME.log; records "NAME PID".  In a script (no job
# control) the background child is no process-group leader, so setsid and
# nsenter both exec in place and $! is the daemon itself.  fd 9 (the lock) is
# closed, or the daemons would hold the lock for as long as they run.
start_proc() {
    local name=$1
    shift
    setsid nsenter --net="/run/netns/$VMQC_NETNS" -- "$@" >>"$VMQC_LOGS/$name.log" 2>&1 </dev/null 9<&- &
    echo "$name $!" >>"$VMQC_PIDS"
    vmq_log "started $name (pid $!)"
}

# start_proc2 NAME CMD...: start_proc in the second node's netns and mount
# namespace
start_proc2() {
    local name=$1
    shift
    setsid nsenter --net="/run/netns/$VMQC_NETNS2" --mount="$VMQC_N2_MNT" -- "$@" >>"$VMQC_LOGS/$name.log" 2>&1 </dev/null 9<&- &
    echo "$name $!" >>"$VMQC_PIDS"
    vmq_log "started $name (pid $!) on $VMQC_NODE2"
}

# alive PID: PID exists and is no zombie (the daemons' parent is init once up
# has exited, and a zombie stays until init gets round to reaping it)
alive() {
    local st
    st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null) || return 1
    [[ -n $st && ${st:0:1} != Z ]]
}

# wait_for NAME SECONDS CMD...: poll CMD every 0.2 s; die when NAME's process
# exits or after SECONDS
wait_for() {
    local name=$1 secs=$2 t0 pid end
    shift 2
    t0=$(vmq_now)
    end=$(($(date +%s%N) / 1000000 + secs * 1000))
    while (($(date +%s%N) / 1000000 < end)); do
        if "$@" >/dev/null 2>&1; then
            vmq_log "$name ready after $(vmqc_secs "$t0") s"
            return 0
        fi
        pid=$(vmqc_pid "$name")
        if [[ -n $pid ]] && ! alive "$pid"; then
            tail -n 30 "$VMQC_LOGS/$name.log" >&2 || true
            vmq_die "$name (pid $pid) exited; log: $VMQC_LOGS/$name.log"
        fi
        sleep 0.2
    done
    tail -n 30 "$VMQC_LOGS/$name.log" >&2 || true
    vmq_die "$name not ready after ${secs}s; log: $VMQC_LOGS/$name.log"
}

# exe_of NAME: the binary a recorded daemon must be running ("" = don't check)
exe_of() {
    case $1 in
        containerd | containerd-2) echo "$VMQC_CTRD_BIN/containerd" ;;
        etcd) command -v etcd ;;
        watchdog) echo "" ;;
        *) echo "$VMQC_BIN/${1%-2}" ;;
    esac
}

# stop_pid NAME PID: SIGTERM, SIGKILL after 15 s (5 s for the API server, whose
# graceful shutdown takes ~8 s and whose state is thrown away anyway); only if
# PID still runs NAME's binary (a recycled PID is left alone)
stop_pid() {
    local name=$1 pid=$2 exe i grace=150 t0
    [[ -n $pid ]] && alive "$pid" || return 0
    exe=$(exe_of "$name")
    if [[ $name == watchdog ]] && ! grep -qaF "$SELF" "/proc/$pid/cmdline" 2>/dev/null; then
        vmq_log "pid $pid is no longer the watchdog; not touching it"
        return 0
    fi
    if [[ -n $exe && $(readlink -f "/proc/$pid/exe" 2>/dev/null) != "$(readlink -f "$exe")" ]]; then
        vmq_log "pid $pid is no longer $name; not touching it"
        return 0
    fi
    [[ $name == kube-apiserver ]] && grace=50
    t0=$(vmq_now)
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < grace; i++)); do
        alive "$pid" || { vmq_log "stopped $name (pid $pid) in $(vmqc_secs "$t0") s"; return 0; }
        sleep 0.1
    done
    vmq_log "$name (pid $pid) still running $((grace / 10)) s after SIGTERM; SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
}

# ------------------------------------------------------------------ node setup
cgroup_root() {
    local mem
    if [[ $(stat -fc %T /sys/fs/cgroup) == cgroup2fs ]]; then echo /vhostmq-cluster; return; fi
    mem=$(awk -F: '$2 == "memory" { print $3 }' /proc/self/cgroup)
    echo "${mem%/}/vhostmq-cluster"
}

# cgroup v1: create ROOT in every hierarchy (a new cpuset starts empty: copy
# cpus and mems down from the parents); remember the topmost folder created
make_cgroups() {
    local root=$1 m d top p part
    [[ $(stat -fc %T /sys/fs/cgroup) == cgroup2fs ]] && { mkdir -p "/sys/fs/cgroup$root"; echo "/sys/fs/cgroup$root" >>"$VMQC_RUN/cgroups"; return 0; }
    while read -r m; do
        d=$m$root
        top=$d
        while [[ ! -d $(dirname "$top") ]]; do top=$(dirname "$top"); done
        [[ -d $d ]] || echo "$top" >>"$VMQC_RUN/cgroups"
        mkdir -p "$d"
        if [[ -f $m/cpuset.cpus ]]; then
            p=$m
            for part in ${root//\// }; do
                p=$p/$part
                [[ -n $(cat "$p/cpuset.cpus") ]] || cat "$(dirname "$p")/cpuset.cpus" >"$p/cpuset.cpus"
                [[ -n $(cat "$p/cpuset.mems") ]] || cat "$(dirname "$p")/cpuset.mems" >"$p/cpuset.mems"
            done
        fi
    done < <(awk '$3 == "cgroup" || ($3 == "cgroup2" && $2 != "/sys/fs/cgroup") { print $2 }' /proc/mounts)
}

write_pki() {
    local pki=$VMQC_DATA/pki token
    mkdir -p "$pki"
    openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
    openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
    token=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
    # one static cluster-admin token (group system:masters) for every client
    echo "$token,admin,admin,system:masters" >"$pki/tokens.csv"
    chmod 600 "$pki/tokens.csv"
    # the aggregation layer's front proxy (kubeadm's front-proxy-ca and
    # front-proxy-client): the API server forwards a request for an
    # aggregated API (KubeVirt's subresources: virtctl console) with this
    # client certificate and the user in X-Remote-User; the API server
    # publishes the CA in kube-system/extension-apiserver-authentication,
    # where virt-api reads it
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj /CN=front-proxy-ca \
        -keyout "$pki/front-proxy-ca.key" -out "$pki/front-proxy-ca.crt" 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -subj /CN=front-proxy-client \
        -keyout "$pki/front-proxy-client.key" -out "$pki/front-proxy-client.csr" 2>/dev/null
    openssl x509 -req -days 3650 -in "$pki/front-proxy-client.csr" -CA "$pki/front-proxy-ca.crt" \
        -CAkey "$pki/front-proxy-ca.key" -CAcreateserial -extfile <(echo extendedKeyUsage=clientAuth) \
        -out "$pki/front-proxy-client.crt" 2>/dev/null
    cat >"$VMQC_KUBECONFIG" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: vhostmq
  cluster: {server: "https://127.0.0.1:6443", insecure-skip-tls-verify: true}
users:
- name: admin
  user: {token: "$token"}
contexts:
- name: vhostmq
  context: {cluster: vhostmq, user: admin}
current-context: vhostmq
EOF
    chmod 600 "$VMQC_KUBECONFIG"
}

setup_cni() {
    local p
    mkdir -p "$CNI_BIN" "$CNI_CONF" "$VMQC_RUN/cni/ipam"
    # containerd needs loopback for every sandbox; the default conflist needs
    # bridge and host-local (Debian's containernetworking-plugins)
    for p in /usr/lib/cni/*; do ln -sf "$p" "$CNI_BIN/"; done
    for p in $CNI_PLUGINS; do
        [[ -x $p ]] || vmq_die "VHOSTMQ_CLUSTER_CNI_PLUGINS: $p is not executable"
        ln -sf "$(readlink -f "$p")" "$CNI_BIN/$(basename "$p")"
    done
    if [[ -n $CNI_CONFLIST ]]; then
        cp "$CNI_CONFLIST" "$CNI_CONF/"
        return 0
    fi
    vmqc_default_conflist "$CNI_CONF/10-vhostmq-cluster.conflist"
}

# write_containerd_config [FILE ROOT STATE SOCK]: the node's containerd
# configuration (defaults: the first node's); the CNI folders are the same
# path on every node (the second node's mount namespace has its own there)
write_containerd_config() {
    local file=${1:-$VMQC_DATA/containerd.toml} root=${2:-$VMQC_DATA/containerd} state=${3:-$VMQC_RUN/containerd} sock=${4:-$VMQC_CTR_SOCK}
    cat >"$file" <<EOF
version = 2
root = "$root"
state = "$state"
[grpc]
  address = "$sock"
[plugins."io.containerd.internal.v1.opt"]
  path = "$root-opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$VMQC_PAUSE_IMAGE"
  # root here lacks CAP_SYS_RESOURCE: runc cannot set an oom_score_adj below
  # containerd's own (the kubelet asks -998 for sandboxes), so every sandbox
  # would fail with "can't get final child's PID from pipe: EOF"; clamp it
  restrict_oom_score_adj = true
  # claims of DRA drivers reach containers as CDI devices (vhostmq-dra)
  enable_cdi = true
  cdi_spec_dirs = ["$VMQC_CDI_DIR"]
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$CNI_BIN"
    conf_dir = "$CNI_CONF"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "$VMQC_REGISTRY_HOSTS"
EOF
    mkdir -p "$VMQC_REGISTRY_HOSTS/$VMQC_REGISTRY"
    cat >"$VMQC_REGISTRY_HOSTS/$VMQC_REGISTRY/hosts.toml" <<EOF
server = "http://$VMQC_REGISTRY"
[host."http://$VMQC_REGISTRY"]
  capabilities = ["pull", "resolve"]
EOF
}

# write_kubelet_config [FILE CGROUP_ROOT CTR_SOCK POD_LOGS]: the node's
# kubelet configuration (defaults: the first node's)
write_kubelet_config() {
    local file=${1:-$VMQC_DATA/kubelet.yaml} cg=${2:-$(cgroup_root)} sock=${3:-$VMQC_CTR_SOCK} logs=${4:-$VMQC_LOGS/pods}
    cat >"$file" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# cgroup v1 here; kubelet >= 1.35 refuses it unless told (it then only warns)
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: $cg
containerRuntimeEndpoint: unix://$sock
imageServiceEndpoint: unix://$sock
podLogsDir: $logs
failSwapOn: false
registerNode: true
# a loopback-only node: whoever reaches the port may use it
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
# a CI disk may be nearly full; no eviction or image GC in the tests' way
evictionHard: {memory.available: "50Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
# report status changes (e.g. device-plugin capacity) quickly
nodeStatusUpdateFrequency: $STATUS_FREQ
nodeStatusReportFrequency: $STATUS_FREQ
syncFrequency: 5s
EOF
}

start_kubelet() {
    start_proc kubelet "$VMQC_BIN/kubelet" --config "$VMQC_DATA/kubelet.yaml" \
        --kubeconfig "$VMQC_KUBECONFIG" --root-dir "$VMQC_KUBELET_ROOT" \
        --hostname-override "$VMQC_NODE" --node-ip "$VMQC_NODE_IP" --v 2
    date +%s.%N >"$VMQC_RUN/kubelet.start"
}

node_ready() {
    [[ $(vmqc_kubectl get node "$VMQC_NODE" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}') == True ]]
}

# ------------------------------------------------------------------ second node
# Folders of /run that are a node's own: the second node gets empty ones
# (KubeVirt's, vhostmq's, containerd's, the pod netns); every other folder
# of the host's /run is bound into its /run as it is.
NODE_OWN_RUN=(containerd kubevirt kubevirt-private kubevirt-libvirt-runtimes kubevirt-hooks
    vhostmq k8s.cni.cncf.io netns xtables.lock)
# host folders outside /run that are a node's own
NODE_OWN_DIRS=(/var/lib/kubelet /var/lib/vhostmq /var/lib/cni /var/lib/kubevirt /var/lib/kubevirt-node-labeller)

# node2_mount_ns: a persistent mount namespace (VMQC_N2_MNT) whose /run is a
# tmpfs holding the host's /run folders (bound) but NODE_OWN_RUN, with
# VMQC_RUN/cni replaced by the node's own CNI folders, NODE_OWN_DIRS bound
# from VMQC_N2_DATA/host, all of it shared within the namespace only (the
# kubelet's and virt-handler's Bidirectional mounts need that), nothing
# propagated back to the host
node2_mount_ns() {
    local d
    mkdir -p "$(dirname "$VMQC_N2_MNT")"
    mount --bind "$(dirname "$VMQC_N2_MNT")" "$(dirname "$VMQC_N2_MNT")"
    mount --make-private "$(dirname "$VMQC_N2_MNT")"
    touch "$VMQC_N2_MNT"
    unshare --mount="$VMQC_N2_MNT" --propagation private true
    mkdir -p "$VMQC_N2_DATA/hostrun"
    for d in "${NODE_OWN_DIRS[@]}"; do
        [[ -e $d ]] || echo "$d" >>"$VMQC_N2_RUN/host-dirs-made"
        mkdir -p "$VMQC_N2_DATA/host$d" "$d"
    done
    # shellcheck disable=SC2016 # expanded by the inner bash, from its arguments
    nsenter --mount="$VMQC_N2_MNT" -- bash -euo pipefail -c '
        own_run=" $1 "; own_dirs=$2; hostrun=$3; data=$4; cni=$5; vrun=$6
        mount --make-rprivate /
        mount --rbind /run "$hostrun"
        mount -t tmpfs -o mode=0755 vhostmq-node2-run /run
        for e in "$hostrun"/* "$hostrun"/.[!.]*; do
            [[ -e $e || -L $e ]] || continue
            n=${e##*/}
            # (mount itself made /run/mount for its utab)
            [[ $own_run == *" $n "* || -e /run/$n ]] && continue
            if [[ -L $e ]]; then cp -P "$e" "/run/$n"
            elif [[ -d $e ]]; then mkdir "/run/$n"; mount --rbind "$e" "/run/$n"
            else touch "/run/$n"; mount --bind "$e" "/run/$n"; fi
        done
        mount --bind "$cni" "$vrun/cni"
        for d in $own_dirs; do mount --bind "$data/host$d" "$d"; done
        umount -l "$hostrun"
        mount --make-rshared /
    ' node2-mounts "${NODE_OWN_RUN[*]}" "${NODE_OWN_DIRS[*]}" "$VMQC_N2_DATA/hostrun" "$VMQC_N2_DATA" "$VMQC_N2_RUN/cni" "$VMQC_RUN"
}

# node2_net: the node's netns with a veth to the first node's: 192.0.2.2/24
# there, the first node routes 192.0.2.2 and the node's pod range over it,
# the node sends everything else to the first node (its Services, pods and
# API server); nothing leaves the two namespaces
node2_net() {
    ip netns add "$VMQC_NETNS2"
    echo "$VMQC_NETNS2" >>"$VMQC_RUN/netns"
    ip -n "$VMQC_NETNS2" link set lo up
    ip -n "$VMQC_NETNS" link add node2 type veth peer name node0 netns "$VMQC_NETNS2"
    ip -n "$VMQC_NETNS" link set node2 up
    ip -n "$VMQC_NETNS" route add "$VMQC_NODE2_IP/32" dev node2
    ip -n "$VMQC_NETNS" route add "$VMQC_POD_CIDR2" via "$VMQC_NODE2_IP" dev node2
    ip -n "$VMQC_NETNS2" addr add "$VMQC_NODE2_IP/24" dev node0
    ip -n "$VMQC_NETNS2" link set node0 up
    ip -n "$VMQC_NETNS2" route add default via "$VMQC_NODE_IP" dev node0
    ip netns exec "$VMQC_NETNS" sysctl -qw net.ipv4.ip_forward=1
    ip netns exec "$VMQC_NETNS2" sysctl -qw net.ipv4.ip_forward=1
}

node2_ready() {
    [[ $(vmqc_kubectl get node "$VMQC_NODE2" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}') == True ]]
}

# node2_remove: take the second node away again (a failed add-node): its
# daemons by PID, its containers, its namespaces and folders
node2_remove() {
    local name pid f
    set +e
    for name in kubelet-2 containerd-2; do stop_pid "$name" "$(vmqc_pid "$name")"; sed -i "/^$name /d" "$VMQC_PIDS"; done
    for f in "$VMQC_N2_RUN"/containerd/io.containerd.runtime.v2.task/*/*/{init,shim}.pid; do
        [[ -f $f ]] && pid=$(cat "$f") && alive "$pid" && kill -KILL "$pid"
    done
    awk '{ print $5 }' /proc/self/mountinfo | grep -E "^$VMQC_N2_RUN(/|\$)" | sort -r |
        while read -r f; do umount "$f" 2>/dev/null || umount -l "$f"; done
    ip netns del "$VMQC_NETNS2" 2>/dev/null
    sed -i "/^$VMQC_NETNS2\$/d" "$VMQC_RUN/netns"
    if [[ -f $VMQC_N2_RUN/host-dirs-made ]]; then
        while read -r f; do rmdir "$f" 2>/dev/null; done <"$VMQC_N2_RUN/host-dirs-made"
    fi
    if [[ -f $VMQC_N2_RUN/cgroup-root ]]; then
        pid=$(cat "$VMQC_N2_RUN/cgroup-root")
        while read -r f; do
            [[ -d $f$pid ]] && find "$f$pid" -depth -type d -exec rmdir {} \; 2>/dev/null
        done < <(awk '$3 == "cgroup" || $3 == "cgroup2" { print $2 }' /proc/mounts)
    fi
    vmqc_kubectl delete node "$VMQC_NODE2" --ignore-not-found >/dev/null 2>&1
    rm -rf "$VMQC_N2_RUN" "$VMQC_N2_DATA"
    set -e
}

cmd_add_node() {
    local t0 cg p conflist=${VHOSTMQ_CLUSTER_CNI_CONFLIST2:-}
    vmq_need_root
    vmqc_is_up || vmq_die "the cluster is not up (run '$SELF up' first)"
    take_lock 60
    vmqc_has_node2 && vmq_die "$VMQC_NODE2 is already up"
    [[ -e /run/netns/$VMQC_NETNS2 ]] && vmq_die "netns $VMQC_NETNS2 exists; run '$SELF down' first"
    t0=$(vmq_now)
    trap 'rc=$?; if ((rc != 0)); then vmq_log "add-node failed; removing the second node"; node2_remove; fi; exit $rc' EXIT
    mkdir -p "$VMQC_N2_RUN/cni/bin" "$VMQC_N2_RUN/cni/net.d" "$VMQC_N2_RUN/cni/ipam" "$VMQC_N2_DATA" "$VMQC_LOGS/pods-node2"
    for p in /usr/lib/cni/*; do ln -sf "$p" "$VMQC_N2_RUN/cni/bin/"; done
    for p in $CNI_PLUGINS; do ln -sf "$(readlink -f "$p")" "$VMQC_N2_RUN/cni/bin/$(basename "$p")"; done
    if [[ -n $conflist ]]; then
        cp "$conflist" "$VMQC_N2_RUN/cni/net.d/"
    else
        vmqc_default_conflist "$VMQC_N2_RUN/cni/net.d/10-vhostmq-cluster.conflist" "$VMQC_POD_CIDR2"
    fi
    node2_net
    node2_mount_ns
    cg=$(cgroup_root)-2
    make_cgroups "$cg"
    echo "$cg" >"$VMQC_N2_RUN/cgroup-root"
    # the API server as the second node sees it
    sed "s#https://127.0.0.1:6443#https://$VMQC_NODE_IP:6443#" "$VMQC_KUBECONFIG" >"$VMQC_N2_DATA/kubeconfig"
    chmod 600 "$VMQC_N2_DATA/kubeconfig"
    write_containerd_config "$VMQC_N2_DATA/containerd.toml" "$VMQC_N2_DATA/containerd" "$VMQC_N2_RUN/containerd" "$VMQC_N2_CTR_SOCK"
    write_kubelet_config "$VMQC_N2_DATA/kubelet.yaml" "$cg" "$VMQC_N2_CTR_SOCK" "$VMQC_LOGS/pods-node2"
    start_proc2 containerd-2 env PATH="$VMQC_CTRD_BIN:$PATH" "$VMQC_CTRD_BIN/containerd" --config "$VMQC_N2_DATA/containerd.toml"
    wait_for containerd-2 30 "$VMQC_CTR" -a "$VMQC_N2_CTR_SOCK" version
    for p in "$VMQC_IMAGES"/*.tar; do
        vmqc_ctr_at "$VMQC_N2_CTR_SOCK" images import "$p" >/dev/null || vmq_die "importing $p into $VMQC_NODE2's containerd"
    done
    start_proc2 kubelet-2 "$VMQC_BIN/kubelet" --config "$VMQC_N2_DATA/kubelet.yaml" \
        --kubeconfig "$VMQC_N2_DATA/kubeconfig" --root-dir "$VMQC_KUBELET_ROOT" \
        --hostname-override "$VMQC_NODE2" --node-ip "$VMQC_NODE2_IP" --v 2
    wait_for kubelet-2 90 nsenter --net="/run/netns/$VMQC_NETNS2" -- curl -fs http://127.0.0.1:10248/healthz
    wait_for kubelet-2 120 node2_ready
    trap - EXIT
    echo "export VHOSTMQ_CLUSTER_NODE2=$VMQC_NODE2" >>"$VMQC_RUN/env"
    vmq_log "node $VMQC_NODE2 is Ready after $(vmqc_secs "$t0") s (netns $VMQC_NETNS2, mount namespace $VMQC_N2_MNT)"
}

cmd_exec2() {
    vmqc_has_node2 || vmq_die "there is no second node (run '$SELF add-node')"
    [[ ${1:-} == -- ]] && shift
    (($#)) || vmq_die "exec2 needs a command"
    exec nsenter --net="/run/netns/$VMQC_NETNS2" --mount="$VMQC_N2_MNT" -- env PATH="$VMQC_BIN:$VMQC_TOOLS:$PATH" \
        CONTAINER_RUNTIME_ENDPOINT="unix://$VMQC_N2_CTR_SOCK" KUBECONFIG="$VMQC_N2_DATA/kubeconfig" "$@"
}

# ------------------------------------------------------------------ commands
cmd_build() {
    local t0 t1
    vmq_need_root
    T_DEPS=0 T_K8S=0 T_TOOLS=0 T_IMAGES=0
    t0=$(vmq_now); vmqc_install_deps; T_DEPS=$(vmqc_secs "$t0")
    command -v go >/dev/null || vmq_die "go is not installed"
    t1=$(vmq_now); vmqc_build_k8s; T_K8S=$(vmqc_secs "$t1")
    t1=$(vmq_now); vmqc_build_tools; vmqc_build_containerd; T_TOOLS=$(vmqc_secs "$t1")
    t1=$(vmq_now); vmqc_base_images; T_IMAGES=$(vmqc_secs "$t1")
    vmq_log "build: packages ${T_DEPS}s, kubernetes ${T_K8S}s, crictl+cnitool+containerd ${T_TOOLS}s, images ${T_IMAGES}s"
}

# EXIT trap of up: a failure takes down whatever was started
up_exit() {
    if (($1 != 0)); then
        vmq_log "up failed; cleaning up"
        cmd_down --locked
    fi
    exit "$1"
}

cmd_up() {
    local t0 t_node p cg
    vmq_need_root
    take_lock 10
    vmqc_is_up && vmq_die "the cluster is already up ($VMQC_RUN/env); run '$SELF down' first"
    [[ -e $VMQC_PIDS ]] && vmq_die "$VMQC_PIDS exists (a half-started cluster?); run '$SELF down' first"
    [[ -e /run/netns/$VMQC_NETNS ]] && vmq_die "netns $VMQC_NETNS exists; run '$SELF down' first"
    if [[ -d $VMQC_KUBELET_ROOT && -n $(ls -A "$VMQC_KUBELET_ROOT") && ! -e $VMQC_KUBELET_ROOT/.vhostmq-cluster ]]; then
        vmq_die "$VMQC_KUBELET_ROOT is not empty and not ours; move it away first"
    fi
    t0=$(vmq_now)
    cmd_build
    t_node=$(vmq_now)

    mkdir -p "$VMQC_RUN"
    : >"$VMQC_PIDS"
    # from here on a failure takes down whatever was started
    trap 'up_exit $?' EXIT
    for p in "${HOST_PATHS[@]}"; do [[ -e $p ]] && echo "$p"; done >"$VMQC_RUN/host-paths-before"
    ls /run/netns 2>/dev/null >"$VMQC_RUN/netns-before" || true
    for p in "${SYSCTLS[@]}"; do echo "$p $(sysctl -n "$p")"; done >"$VMQC_RUN/sysctls"
    rm -rf "$VMQC_DATA" "$VMQC_LOGS" "$VMQC_KUBELET_ROOT"
    mkdir -p "$VMQC_DATA" "$VMQC_LOGS/pods" "$VMQC_KUBELET_ROOT"
    touch "$VMQC_KUBELET_ROOT/.vhostmq-cluster"

    # the node's network: lo and a veth pair, both ends inside
    ip netns add "$VMQC_NETNS"
    echo "$VMQC_NETNS" >"$VMQC_RUN/netns"
    ip -n "$VMQC_NETNS" link set lo up
    ip -n "$VMQC_NETNS" link add node0 type veth peer name node0-peer
    ip -n "$VMQC_NETNS" addr add "$VMQC_NODE_IP/24" dev node0
    ip -n "$VMQC_NETNS" link set node0-peer up
    ip -n "$VMQC_NETNS" link set node0 up

    cg=$(cgroup_root)
    echo "$cg" >"$VMQC_RUN/cgroup-root"
    make_cgroups "$cg"
    setup_cni
    mkdir -p "$VMQC_CDI_DIR"
    write_containerd_config
    write_kubelet_config

    start_proc containerd env PATH="$VMQC_CTRD_BIN:$PATH" "$VMQC_CTRD_BIN/containerd" --config "$VMQC_DATA/containerd.toml"
    wait_for containerd 30 "$VMQC_CTR" -a "$VMQC_CTR_SOCK" version
    vmq_log "containerd: $("$VMQC_CTR" -a "$VMQC_CTR_SOCK" version 2>/dev/null | awk '/^Server:/ { s = 1 } s && /Version:/ { print $2; exit }'), runc: $(runc --version | head -1)"
    vmqc_import "$VMQC_IMAGES"/*.tar

    write_pki
    start_proc etcd etcd --name "$VMQC_NODE" --data-dir "$VMQC_DATA/etcd" \
        --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
        --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
        --initial-cluster "$VMQC_NODE=http://127.0.0.1:2380"
    wait_for etcd 30 vmqc_in_ns etcdctl --endpoints http://127.0.0.1:2379 endpoint health

    start_proc kube-apiserver "$VMQC_BIN/kube-apiserver" \
        --etcd-servers http://127.0.0.1:2379 \
        --advertise-address "$VMQC_NODE_IP" --bind-address 0.0.0.0 --secure-port 6443 \
        --cert-dir "$VMQC_DATA/pki/apiserver" \
        --service-cluster-ip-range "$VMQC_SERVICE_CIDR" \
        --token-auth-file "$VMQC_DATA/pki/tokens.csv" \
        --authorization-mode Node,RBAC \
        --service-account-issuer https://kubernetes.default.svc \
        --service-account-key-file "$VMQC_DATA/pki/sa.pub" \
        --service-account-signing-key-file "$VMQC_DATA/pki/sa.key" \
        --allow-privileged=true \
        --kubelet-preferred-address-types InternalIP \
        --requestheader-client-ca-file "$VMQC_DATA/pki/front-proxy-ca.crt" \
        --requestheader-allowed-names front-proxy-client \
        --requestheader-username-headers X-Remote-User --requestheader-group-headers X-Remote-Group \
        --requestheader-extra-headers-prefix X-Remote-Extra- \
        --proxy-client-cert-file "$VMQC_DATA/pki/front-proxy-client.crt" \
        --proxy-client-key-file "$VMQC_DATA/pki/front-proxy-client.key"
    wait_for kube-apiserver 90 vmqc_kubectl get --raw /readyz

    start_proc kube-scheduler "$VMQC_BIN/kube-scheduler" \
        --kubeconfig "$VMQC_KUBECONFIG" \
        --authentication-kubeconfig "$VMQC_KUBECONFIG" --authorization-kubeconfig "$VMQC_KUBECONFIG" \
        --leader-elect=false --bind-address 127.0.0.1
    start_proc kube-controller-manager "$VMQC_BIN/kube-controller-manager" \
        --kubeconfig "$VMQC_KUBECONFIG" \
        --authentication-kubeconfig "$VMQC_KUBECONFIG" --authorization-kubeconfig "$VMQC_KUBECONFIG" \
        --leader-elect=false --bind-address 127.0.0.1 \
        --service-account-private-key-file "$VMQC_DATA/pki/sa.key" \
        --root-ca-file "$VMQC_DATA/pki/apiserver/apiserver.crt" \
        --use-service-account-credentials=false
    start_kubelet
    wait_for kube-scheduler 60 vmqc_in_ns curl -fsk https://127.0.0.1:10259/healthz
    wait_for kube-controller-manager 60 vmqc_in_ns curl -fsk https://127.0.0.1:10257/healthz
    wait_for kubelet 90 vmqc_in_ns curl -fs http://127.0.0.1:10248/healthz
    wait_for kubelet 30 test -S "$VMQC_KUBELET_ROOT/device-plugins/kubelet.sock"
    wait_for kubelet 120 node_ready
    # pods are refused until the default ServiceAccount exists
    wait_for kube-controller-manager 60 vmqc_kubectl -n default get serviceaccount default

    # the watchdog takes the node down after LIFETIME even if nobody does;
    # `down` stops it by PID (the TERM ends its sleep)
    setsid bash -c "trap 'kill \$s 2>/dev/null; exit 0' TERM; sleep $LIFETIME & s=\$!; wait \$s; exec '$SELF' down --watchdog" \
        >>"$VMQC_LOGS/watchdog.log" 2>&1 </dev/null 9<&- &
    echo "watchdog $!" >>"$VMQC_PIDS"

    printf 'runtime-endpoint: unix://%s\nimage-endpoint: unix://%s\ntimeout: 30\n' \
        "$VMQC_CTR_SOCK" "$VMQC_CTR_SOCK" >"$VMQC_RUN/crictl.yaml"
    cat >"$VMQC_RUN/env.tmp" <<EOF
export KUBECONFIG=$VMQC_KUBECONFIG
export KUBECACHEDIR=$VMQC_RUN/kube-cache
export VHOSTMQ_CLUSTER_NETNS=$VMQC_NETNS
export VHOSTMQ_CLUSTER_NODE=$VMQC_NODE
export VHOSTMQ_CLUSTER_BIN=$VMQC_BIN
export VHOSTMQ_CLUSTER_TOOLS=$VMQC_TOOLS
export VHOSTMQ_CLUSTER_LOGS=$VMQC_LOGS
export VHOSTMQ_CLUSTER_CTR_SOCK=$VMQC_CTR_SOCK
export VHOSTMQ_CLUSTER_CDI_DIR=$VMQC_CDI_DIR
export VHOSTMQ_CLUSTER_CGROUP_ROOT=$cg
export CONTAINER_RUNTIME_ENDPOINT=unix://$VMQC_CTR_SOCK
export CRI_CONFIG_FILE=$VMQC_RUN/crictl.yaml
EOF
    mv "$VMQC_RUN/env.tmp" "$VMQC_RUN/env"
    T_NODE=$(vmqc_secs "$t_node")
    T_TOTAL=$(vmqc_secs "$t0")
    echo "packages=$T_DEPS k8s_build=$T_K8S tools_build=$T_TOOLS images=$T_IMAGES node_ready=$T_NODE total=$T_TOTAL" \
        >"$VMQC_RUN/timings"
    trap - EXIT
    vmq_log "node $VMQC_NODE is Ready ($K8S_VERSION, netns $VMQC_NETNS); logs: $VMQC_LOGS"
    echo "bring-up: packages ${T_DEPS}s, kubernetes build ${T_K8S}s, crictl+cnitool+containerd ${T_TOOLS}s, images ${T_IMAGES}s, node Ready ${T_NODE}s; total ${T_TOTAL}s"
    echo "try: $SELF exec -- kubectl get pods -A"
}

# Delete every pod first, so their sandboxes are torn down through CRI
# (which runs CNI DEL and lets device plugins see them go).
stop_pods() {
    local i c kpid
    [[ -S $VMQC_CTR_SOCK ]] || return 0
    if [[ -f $VMQC_KUBECONFIG ]] && vmqc_kubectl get --raw /readyz >/dev/null 2>&1; then
        # no controllers: nothing recreates what is deleted
        for c in kube-controller-manager kube-scheduler; do stop_pid "$c" "$(vmqc_pid "$c")"; done
        vmqc_kubectl delete pods --all --all-namespaces --grace-period 2 --wait=false >/dev/null 2>&1 || true
    fi
    kpid=$(vmqc_pid kubelet)
    if { [[ -z $kpid ]] || ! alive "$kpid"; } && [[ -x $VMQC_TOOLS/crictl ]]; then
        # no kubelet: remove the sandboxes through CRI ourselves
        timeout 60 "$VMQC_TOOLS/crictl" -r "unix://$VMQC_CTR_SOCK" rmp -af >/dev/null 2>&1 || true
    fi
    kpid=$(vmqc_pid kubelet-2)
    if [[ -S $VMQC_N2_CTR_SOCK ]] && { [[ -z $kpid ]] || ! alive "$kpid"; } && [[ -x $VMQC_TOOLS/crictl ]]; then
        timeout 60 nsenter --net="/run/netns/$VMQC_NETNS2" --mount="$VMQC_N2_MNT" -- \
            "$VMQC_TOOLS/crictl" -r "unix://$VMQC_N2_CTR_SOCK" rmp -af >/dev/null 2>&1 || true
    fi
    for ((i = 0; i < 60; i++)); do
        if [[ -z $(vmqc_ctr_at "$VMQC_CTR_SOCK" tasks ls -q 2>/dev/null) ]] &&
            { [[ ! -S $VMQC_N2_CTR_SOCK ]] || [[ -z $(vmqc_ctr_at "$VMQC_N2_CTR_SOCK" tasks ls -q 2>/dev/null) ]]; }; then
            return 0
        fi
        sleep 1
    done
    vmq_log "pods still running after 60 s; their processes will be killed"
}

cmd_down() {
    local purge=0 locked=0 name pid f cg m d k v before
    while (($#)); do
        case $1 in
            --purge) purge=1 ;;
            --locked) locked=1 ;;
            --watchdog) vmq_log "watchdog: lifetime over, taking the cluster down" ;;
            *) vmq_die "down: unknown argument $1" ;;
        esac
        shift
    done
    vmq_need_root
    ((locked)) || take_lock 120
    set +e # best effort from here on: one failed step must not stop the rest
    if [[ ! -d $VMQC_RUN ]]; then
        vmq_log "nothing to take down ($VMQC_RUN absent)"
        ((purge)) && rm -rf "$VMQC_LOGS"
        return 0
    fi
    rm -f "$VMQC_RUN/env"
    stop_pods
    # stop in reverse start order (the watchdog too, unless it is us)
    while read -r name pid; do
        [[ $pid == "$$" || $pid == "$PPID" ]] && continue
        stop_pid "$name" "$pid"
    done < <(tac "$VMQC_PIDS" 2>/dev/null)
    # shims and containers that are left: their PIDs are in our containerd's
    # state folder; kill a PID only if it still is a shim, or is in our cgroups
    cg=$(cat "$VMQC_RUN/cgroup-root" 2>/dev/null) || cg=$(cgroup_root)
    for f in "$VMQC_RUN"/containerd/io.containerd.runtime.v2.task/*/*/init.pid \
        "$VMQC_RUN"/containerd/io.containerd.runtime.v2.task/*/*/shim.pid \
        "$VMQC_N2_RUN"/containerd/io.containerd.runtime.v2.task/*/*/init.pid \
        "$VMQC_N2_RUN"/containerd/io.containerd.runtime.v2.task/*/*/shim.pid; do
        [[ -f $f ]] || continue
        pid=$(cat "$f")
        alive "$pid" || continue
        case $f in
            */shim.pid) [[ $(readlink "/proc/$pid/exe") == */containerd-shim-runc-v2 ]] || continue ;;
            */init.pid) grep -qF -e "$cg/" -e "$cg-2/" "/proc/$pid/cgroup" || continue ;;
        esac
        vmq_log "killing leftover $(basename "$f" .pid) pid $pid"
        kill -KILL "$pid"
    done
    sleep 0.5
    # unmount under our folders and the kubelet's, deepest first
    awk '{ print $5 }' /proc/self/mountinfo |
        grep -E "^($VMQC_RUN|$VMQC_DATA|$VMQC_KUBELET_ROOT|/run/containerd)(/|\$)" | sort -r |
        while read -r m; do umount "$m" 2>/dev/null || umount -l "$m"; done
    # pod netns that containerd made and did not remove
    for f in /run/netns/cni-*; do
        [[ -e $f ]] || continue
        grep -qxF "$(basename "$f")" "$VMQC_RUN/netns-before" 2>/dev/null && continue
        umount "$f" 2>/dev/null
        rm -f "$f"
    done
    if [[ -f $VMQC_RUN/netns ]]; then
        while read -r f; do ip netns del "$f" 2>/dev/null; done <"$VMQC_RUN/netns"
    fi
    # the second node's mount points on the host (empty: its files were in
    # its own folders), when add-node made them
    if [[ -f $VMQC_N2_RUN/host-dirs-made ]]; then
        while read -r f; do rmdir "$f" 2>/dev/null; done <"$VMQC_N2_RUN/host-dirs-made"
    fi
    if [[ -f $VMQC_RUN/cgroups ]]; then
        while read -r d; do
            [[ -d $d ]] && find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null
        done <"$VMQC_RUN/cgroups"
    fi
    if [[ -f $VMQC_RUN/sysctls ]]; then
        while read -r k v; do sysctl -qw "$k=$v"; done <"$VMQC_RUN/sysctls"
    fi
    # host folders that were not there before up
    before=$VMQC_RUN/host-paths-before
    if [[ -f $before ]]; then
        for f in "${HOST_PATHS[@]}"; do
            grep -qxF "$f" "$before" && continue
            if [[ $f == /run/netns ]]; then
                # ip netns made it a mount point; shared: only when empty
                [[ -z $(ls -A /run/netns 2>/dev/null) ]] && { umount /run/netns 2>/dev/null; rmdir /run/netns; }
            elif [[ $f == /var/log/containers || $f == /var/log/pods ]]; then
                rmdir "$f" 2>/dev/null # shared folders: only when empty
            else
                rm -rf "$f"
            fi
        done
    fi
    [[ -e $VMQC_KUBELET_ROOT/.vhostmq-cluster ]] && rm -rf "$VMQC_KUBELET_ROOT"
    rm -rf "$VMQC_DATA" "$VMQC_RUN"
    ((purge)) && rm -rf "$VMQC_LOGS"
    vmq_log "cluster is down$( ((purge)) || echo " (logs kept in $VMQC_LOGS)")"
    return 0
}

cmd_restart_kubelet() {
    local t0
    vmq_need_root
    vmqc_is_up || vmq_die "the cluster is not up"
    take_lock 60
    stop_pid kubelet "$(vmqc_pid kubelet)"
    sed -i '/^kubelet /d' "$VMQC_PIDS"
    echo "=== kubelet restarted by cluster.sh restart-kubelet at $(date -u +%FT%T.%NZ)" >>"$VMQC_LOGS/kubelet.log"
    t0=$(vmq_now)
    start_kubelet
    wait_for kubelet 90 vmqc_in_ns curl -fs http://127.0.0.1:10248/healthz
    vmq_log "kubelet restarted: healthz after $(vmqc_secs "$t0") s (start time in $VMQC_RUN/kubelet.start)"
}

cmd_exec() {
    vmqc_is_up || vmq_die "the cluster is not up (run '$SELF up')"
    [[ ${1:-} == -- ]] && shift
    (($#)) || vmq_die "exec needs a command"
    # shellcheck source=/dev/null
    source "$VMQC_RUN/env"
    exec nsenter --net="/run/netns/$VMQC_NETNS" -- env PATH="$VMQC_BIN:$VMQC_TOOLS:$PATH" "$@"
}

cmd_status() {
    local name pid state
    if ! vmqc_is_up; then
        echo "cluster: down"
        [[ -d $VMQC_RUN ]] && echo "(but $VMQC_RUN exists: a half-started cluster? '$SELF down' cleans up)"
        return 1
    fi
    echo "cluster: up (netns $VMQC_NETNS, node $VMQC_NODE, Kubernetes $K8S_VERSION)"
    echo "bring-up timings: $(cat "$VMQC_RUN/timings" 2>/dev/null)"
    while read -r name pid; do
        state=dead
        alive "$pid" && state=running
        printf '  %-24s pid %-8s %s\n' "$name" "$pid" "$state"
    done <"$VMQC_PIDS"
    vmqc_kubectl get nodes -o wide || true
    vmqc_kubectl get pods -A -o wide || true
    echo "logs: $VMQC_LOGS"
}

case ${1:-} in
    up) shift; cmd_up "$@" ;;
    down) shift; cmd_down "$@" ;;
    exec) shift; cmd_exec "$@" ;;
    env) vmqc_is_up || vmq_die "the cluster is not up"; cat "$VMQC_RUN/env" ;;
    status) cmd_status ;;
    restart-kubelet) cmd_restart_kubelet ;;
    add-node) cmd_add_node ;;
    exec2) shift; cmd_exec2 "$@" ;;
    build) take_lock 10; cmd_build ;;
    -h | --help | help) vmq_usage "$SELF" ;;
    *) vmq_usage "$SELF" >&2; exit 2 ;;
esac
