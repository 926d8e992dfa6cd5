#!/usr/bin/env bash
# Says what the tests will use on this machine and fails early, with the
# reason and the fix, when something they need cannot work.  Run by
# hack/install-deps.sh after it installed the packages (so by .ci/run and
# every make target that installs), and on its own as `make doctor`.
#
# A line per fact: "ok", "info" (a fact the tests adapt to) or "FAIL" (the
# tests cannot pass; the line says why and what to do).  The choices a
# machine's state could change are pinned elsewhere and printed here: the OCI
# runtime podman builds images with (hack/lib.sh vmq_podman), the guest
# kernel (hack/install-deps.sh), the Kubernetes and KubeVirt versions
# (hack/cluster/lib.sh, hack/kubevirt/lib.sh) and their build caches.
#
# Usage: hack/doctor.sh [--no-podman]
#   --no-podman   skip the image-build probe (for targets that build no image)
# Exit status 1 if any FAIL.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$HERE/lib.sh"
VMQ_TAG=doctor
PODMAN_PROBE=1
vmq_args --no-podman:PODMAN_PROBE=0 -- "$@"

nfail=0
ok() { printf '  ok    %-14s %s\n' "$1" "$2"; }
info() { printf '  info  %-14s %s\n' "$1" "$2"; }
bad() { printf '  FAIL  %-14s %s\n' "$1" "$2"; nfail=$((nfail + 1)); }
ver() { "$@" 2>/dev/null | head -n1 || true; }
pkgver() { dpkg-query -W -f='${Version}' "$1" 2>/dev/null || true; }

echo "vhostmq doctor: what the tests use on $(hostname)"

# ------------------------------------------------------------------ machine
if [[ $(id -u) == 0 ]]; then ok user root; else bad user "not root: the tests create namespaces, taps and mounts (run as root)"; fi
osrel() { sed -n "s/^$1=\"\{0,1\}\([^\"]*\)\"\{0,1\}\$/\1/p" /etc/os-release; }
os=$(osrel PRETTY_NAME)
if [[ "$(osrel ID) $(osrel VERSION_ID)" == "debian 12" ]]; then ok os "$os, kernel $(uname -r)"; else info os "$os, kernel $(uname -r) (the scripts are written for Debian 12)"; fi
cpus=$(nproc)
mem=$(awk '/^MemTotal:/ { printf "%d", $2 / 1048576 }' /proc/meminfo)
if ((cpus >= 2)); then ok cpus "$cpus online (dataplane workers on CPU 1, guests and peers share both)"; else info cpus "$cpus online: workers and peers share one CPU, the smokes are slow"; fi
if ((mem >= 8)); then ok memory "$mem GiB"; else bad memory "$mem GiB: the KubeVirt test bed needs about 8 GiB"; fi
free_gb=$(df -P -BG /var/cache 2>/dev/null | awk 'NR == 2 { sub(/G/, "", $4); print $4 }')
if ((${free_gb:-0} >= 25)); then ok disk "${free_gb} GiB free under /var/cache"; else bad disk "${free_gb:-?} GiB free under /var/cache: the Kubernetes and KubeVirt builds need about 25 GiB"; fi
if command -v go >/dev/null; then
    gv=$(go env GOVERSION)
    if [[ $gv == go1.2[6-9]* || $gv == go1.[3-9][0-9]* ]]; then ok go "$gv ($(go env GOROOT))"; else bad go "$gv: go.mod and the Dockerfile need go1.26 or later"; fi
else
    bad go "no go on PATH (install Go 1.26, or put /usr/local/go/bin on PATH)"
fi

# ------------------------------------------------------------------ kernel features
layout() {
    if [[ -f /sys/fs/cgroup/cgroup.controllers ]]; then
        echo "v2 (unified)"
    elif [[ -f /sys/fs/cgroup/unified/cgroup.controllers ]]; then
        echo "hybrid: v1 controllers, cgroup2 at /sys/fs/cgroup/unified with [$(tr '\n' ' ' </sys/fs/cgroup/unified/cgroup.controllers | sed 's/ $//')]"
    else
        echo "v1"
    fi
}
CG=$(layout)
ok cgroups "$CG"
if [[ -c /dev/net/tun ]]; then ok tun "/dev/net/tun (tap uplinks, e2e-uplink)"; else bad tun "no /dev/net/tun: modprobe tun"; fi
probe_ns=vhostmq-doctor-$$
if ip netns add "$probe_ns" 2>/dev/null; then
    if ip -n "$probe_ns" link add vmqd0 type veth peer name vmqd1 2>/dev/null; then
        ok netns "namespaces and veths can be made"
    else
        bad netns "cannot create a veth in a namespace (CNI and uplink tests need it)"
    fi
    ip netns del "$probe_ns" 2>/dev/null || true
else
    bad netns "cannot create a network namespace (ip netns add): the CNI, uplink and cluster tests need CAP_SYS_ADMIN"
fi
if [[ -e /dev/kvm ]]; then
    info kvm "/dev/kvm exists ($(stat -c '%U:%G %a' /dev/kvm)); the tests run QEMU with TCG all the same (guests do not start under KVM on this machine kind); e2e-kubevirt-libvirt's libvirtd does not see it"
else
    info kvm "no /dev/kvm; QEMU runs TCG"
fi
hp_total=$(awk '/^HugePages_Total:/ { print $2 }' /proc/meminfo)
hp_free=$(awk '/^HugePages_Free:/ { print $2 }' /proc/meminfo)
if grep -q ' hugetlbfs ' /proc/mounts; then
    ok hugepages "$hp_total x 2 MiB reserved, $hp_free free, hugetlbfs at $(awk '$3 == "hugetlbfs" { print $2; exit }' /proc/mounts) (DPDK peers use them when enough are free)"
else
    info hugepages "$hp_total reserved, hugetlbfs not mounted: DPDK peers run --no-huge (install-deps --hugepages N reserves and mounts)"
fi

# ------------------------------------------------------------------ peers
if command -v qemu-system-x86_64 >/dev/null; then
    qv=$(qemu-system-x86_64 --version | sed -n '1s/.*version \([0-9]*\)\..*/\1/p')
    if ((${qv:-0} >= 10)); then
        ok qemu "$(ver qemu-system-x86_64 --version) (TCG)"
    else
        bad qemu "$(ver qemu-system-x86_64 --version): before 10.0 a TCG guest's writes can be lost in a live migration; hack/install-deps.sh installs the pinned QEMU 10.0"
    fi
else
    bad qemu "qemu-system-x86_64 missing (hack/install-deps.sh installs qemu-system-x86)"
fi
if command -v dpdk-testpmd >/dev/null; then
    pmds=$(compgen -G '/usr/lib/x86_64-linux-gnu/dpdk/pmds-*/librte_net_vhost.so*' >/dev/null && echo vhost)
    pmds+=$(compgen -G '/usr/lib/x86_64-linux-gnu/dpdk/pmds-*/librte_net_virtio.so*' >/dev/null && echo ' virtio-user')
    if [[ $pmds == "vhost virtio-user" ]]; then ok dpdk "dpdk-testpmd $(pkgver dpdk-dev), PMDs: $pmds"; else bad dpdk "dpdk-testpmd $(pkgver dpdk-dev) lacks a PMD (have: ${pmds:-none}; need librte-net-vhost23 and librte-net-virtio23)"; fi
else
    bad dpdk "dpdk-testpmd missing (hack/install-deps.sh installs dpdk-dev)"
fi
kv=$(cat "$VMQ_KERNEL_DIR/KERNEL_VERSION" 2>/dev/null || true)
if [[ -n $kv ]]; then ok guest-kernel "$kv in $VMQ_KERNEL_DIR"; else info guest-kernel "not fetched yet ($VMQ_KERNEL_DIR; install-deps fetches it unless --no-kernel)"; fi
for t in iperf3 busybox jq; do command -v "$t" >/dev/null || bad "$t" "missing (hack/install-deps.sh installs it)"; done

# ------------------------------------------------------------------ cluster tests
if command -v iptables >/dev/null; then
    ok iptables "$(ver iptables --version) (the KubeVirt test bed's kube-proxy, iptables mode)"
else
    info iptables "not installed yet (hack/cluster installs it)"
fi
for t in containerd runc; do
    if command -v "$t" >/dev/null; then
        ok "$t" "$(ver "$t" --version) (Debian's containerd: hack/e2e-cni.sh; runtime runc pinned in every config)"
    else
        info "$t" "not installed yet (hack/cluster and hack/e2e-cni.sh install it)"
    fi
done
# the test cluster's containerd is built (CDI for DRA claims), not Debian's
ctrd=/var/cache/vhostmq/k8s/containerd/${VHOSTMQ_CONTAINERD_VERSION:-v2.4.2}/containerd
if [[ -x $ctrd ]]; then
    ok cluster-containerd "$("$ctrd" --version 2>/dev/null | awk '{ print $3 }') at $ctrd (hack/cluster, CDI on)"
else
    info cluster-containerd "not built yet: make test-cluster builds containerd ${VHOSTMQ_CONTAINERD_VERSION:-v2.4.2} from the module proxy (2-4 min)"
fi

# ------------------------------------------------------------------ image builds
# podman picks its runtime from what is installed (crun first on Debian 12),
# so the tests pin one (vmq_podman) and probe it with a real RUN step.
if ((PODMAN_PROBE)); then
    if ! command -v podman >/dev/null; then
        bad podman "missing (hack/install-deps.sh installs podman and runc)"
    elif ! command -v "$VMQ_OCI_RUNTIME" >/dev/null; then
        bad oci-runtime "$VMQ_OCI_RUNTIME is missing (install it, or set VHOSTMQ_OCI_RUNTIME to one that is installed)"
    else
        dflt=$(podman info --format '{{.Host.OCIRuntime.Name}}' 2>/dev/null || echo '?')
        p=$(mktemp -d /tmp/vhostmq-doctor.XXXXXX)
        mkdir -p "$p/root/bin"
        cp /bin/busybox "$p/root/bin/" 2>/dev/null && ln -s busybox "$p/root/bin/sh" && ln -s busybox "$p/root/bin/true"
        printf 'FROM localhost/vhostmq-doctor:probe\nRUN true\n' >"$p/Containerfile"
        probe() { # RUNTIME: a one-step build with it; its error on stdout
            local img
            img=$(podman --runtime "$1" --cgroup-manager cgroupfs --events-backend file build --pull=never --network host -q -f "$p/Containerfile" "$p" 2>&1) ||
                { echo "$img" | grep -m1 -E '^error running container' | sed 's/^error running container: //' || echo "$img" | grep -v '^$' | tail -n1; return 1; }
            podman --events-backend file rmi -f "${img##*$'\n'}" >/dev/null 2>&1 || true
        }
        if tar -C "$p/root" -c . | podman --events-backend file import - localhost/vhostmq-doctor:probe >/dev/null 2>&1; then
            if err=$(probe "$VMQ_OCI_RUNTIME"); then
                ok oci-runtime "podman $(podman version --format '{{.Client.Version}}') builds with $VMQ_OCI_RUNTIME ($(ver "$VMQ_OCI_RUNTIME" --version)), cgroupfs, storage $(podman info --format '{{.Store.GraphDriverName}}' 2>/dev/null)"
            else
                bad oci-runtime "a RUN step with $VMQ_OCI_RUNTIME fails: $err (cgroups: $CG; set VHOSTMQ_OCI_RUNTIME to a runtime that works here)"
            fi
            if [[ $dflt != "$VMQ_OCI_RUNTIME" ]]; then
                if err=$(probe "$dflt"); then
                    info podman-default "podman's own default runtime here is $dflt (it would work too; the tests use $VMQ_OCI_RUNTIME)"
                else
                    info podman-default "podman's own default runtime here is $dflt, which fails on this machine: $err; the tests use $VMQ_OCI_RUNTIME"
                fi
            fi
            podman --events-backend file rmi -f localhost/vhostmq-doctor:probe >/dev/null 2>&1 || true
        else
            bad podman "podman import failed (storage: $(podman info --format '{{.Store.GraphRoot}}' 2>&1 | tail -n1))"
        fi
        rm -rf "$p"
    fi
fi

# ------------------------------------------------------------------ caches
cached() { # NAME DIR WHAT
    if [[ -d $2 && -n $(ls -A "$2" 2>/dev/null) ]]; then
        ok "$1" "warm: $2 ($(du -sh "$2" 2>/dev/null | cut -f1))"
    else
        info "$1" "cold: $2 is empty; $3"
    fi
}
cached k8s-cache /var/cache/vhostmq/k8s "the first make test-cluster builds Kubernetes (10-17 min)"
cached kubevirt-cache /var/cache/vhostmq/kubevirt "the first make test-kubevirt builds KubeVirt and its images (about 10 min)"
cached go-modcache "$(go env GOMODCACHE 2>/dev/null)" "the first build downloads modules"

if ((nfail)); then
    vmq_log "$nfail problem(s) above: the tests cannot pass on this machine until they are fixed"
    exit 1
fi
vmq_log "this machine can run the tests"
