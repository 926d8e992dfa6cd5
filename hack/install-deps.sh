#!/usr/bin/env bash
# Install what the vhostmq e2e tests need on Debian 12 (bookworm), as root.
# Idempotent and fast when everything is present (no apt-get call at all then).
#
#   * packages: QEMU 10.0 (TCG; pinned, from bookworm-backports: see
#     below), busybox-static, iperf3, ethtool, cpio, kmod,
#     python3, jq, xz-utils, virt-xml-validate (libvirt-clients, libxml2-utils;
#     checks the KubeVirt binding's domain XML), the reference CNI plugins
#     (IPAM delegation tests), podman (the Dockerfile, hack/image.sh) and DPDK's testpmd with the vhost and virtio-user
#     PMDs (dpdk-testpmd is in dpdk-dev; the PMDs are separate plugin
#     packages, loaded from /usr/lib/x86_64-linux-gnu/dpdk/pmds-23.0);
#     each is installed only if missing.
#   * guest kernel: the linux-image package linux-image-amd64 points to is
#     downloaded (apt-get download) and unpacked with dpkg-deb -x into
#     KERNEL_DIR; nothing is installed into /boot, no host initramfs is built.
#   * runc: podman's OCI runtime for image builds is pinned to it (hack/lib.sh
#     vmq_podman; crun, podman's first choice, refuses hybrid cgroups).
#   * at the end, hack/doctor.sh prints what the tests will use and fails
#     when something cannot work.
#   * hugepages are optional (DPDK runs with --no-huge otherwise);
#     --hugepages N reserves N 2 MiB pages and mounts hugetlbfs.
#
# Usage: hack/install-deps.sh [--kernel-dir DIR] [--no-kernel] [--refresh-kernel]
#                             [--hugepages N] [--with-shellcheck] [--no-image-builds]
#   --kernel-dir DIR    default $VHOSTMQ_KERNEL_DIR or /var/cache/vhostmq/guest-kernel
#   --refresh-kernel    re-resolve linux-image-amd64 even if a kernel is cached
#   --no-image-builds   the caller builds no image (make demo): the doctor
#                       does not probe podman
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$HERE/lib.sh"
VMQ_TAG=install-deps

KDIR=$VMQ_KERNEL_DIR WANT_KERNEL=1 REFRESH=0 HUGE=0 SHELLCHECK=0 NO_IMAGES=0 DOCTOR_ARGS=()
vmq_args --kernel-dir=KDIR --no-kernel:WANT_KERNEL=0 --refresh-kernel:REFRESH=1 --hugepages=HUGE \
    --with-shellcheck:SHELLCHECK=1 --no-image-builds:NO_IMAGES=1 -- "$@"
((!NO_IMAGES)) || DOCTOR_ARGS=(--no-podman)
vmq_need_root
[[ $(dpkg --print-architecture) == amd64 ]] || vmq_die "only amd64 is supported (QEMU x86_64 guests)"
export DEBIAN_FRONTEND=noninteractive

PKGS=(busybox-static iperf3 ethtool cpio kmod python3 jq xz-utils gzip
    procps coreutils dpdk-dev librte-net-vhost23 librte-net-virtio23 protobuf-compiler make
    libvirt-clients libxml2-utils containernetworking-plugins podman runc curl
    valgrind prometheus bash-completion fish zsh stress-ng nodejs) # nodejs: the docs' mermaid diagrams parsed (hack/docscheck/mermaid.sh); valgrind: callgrind instructions per frame (hack/bench/instructions.sh); prometheus: promtool (hack/test-alerts.sh); shells: vhostmqctl's completion (hack/e2e-observe.sh); stress-ng: the loads of hack/bench/handoff.sh
((SHELLCHECK)) && PKGS+=(shellcheck)
# Debian's nodejs comes without npm (NodeSource's has it built in)
command -v npm >/dev/null 2>&1 || PKGS+=(npm)

T0=$(vmq_now)
UPDATED=0
apt_update() {
    ((UPDATED)) && return 0
    vmq_log "apt-get update"
    timeout 600 apt-get update -q >/dev/null || vmq_die "apt-get update failed"
    UPDATED=1
}
installed() { [[ $(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null) == installed ]]; }

MISSING=()
for p in "${PKGS[@]}"; do installed "$p" || MISSING+=("$p"); done
if ((${#MISSING[@]})); then
    apt_update
    vmq_log "apt-get install ${MISSING[*]}"
    APTLOG=$(mktemp /tmp/vhostmq-apt.XXXXXX.log)
    if ! timeout 1200 apt-get install -y -q --no-install-recommends "${MISSING[@]}" >"$APTLOG" 2>&1; then
        tail -n 30 "$APTLOG" >&2
        vmq_die "apt-get install failed (log: $APTLOG)"
    fi
    rm -f "$APTLOG"
    # the prometheus package's own daemon is not wanted (the tests start
    # the Prometheus they need); without systemd nothing was started
    if [[ " ${MISSING[*]} " == *" prometheus "* && -d /run/systemd/system ]]; then
        systemctl disable --now prometheus 2>/dev/null || true
    fi
else
    vmq_log "all ${#PKGS[@]} packages already installed"
fi

# QEMU, pinned: Debian 12's QEMU 7.2 loses pages a TCG guest writes during a
# live migration (without any vhost-user device: 63-270 of 131072 pages
# differed in three runs of a guest writing a file, 0 with QEMU 10.0), which
# e2e-migrate's memory check and file hash then blame on the dataplane. The
# tests run QEMU 10.0 from bookworm-backports, the version KubeVirt's
# launcher runs; backports keep their low priority, nothing else moves.
QEMU_PIN=${VHOSTMQ_QEMU_VERSION:-1:10.0.2+ds-2+deb13u1~bpo12+1}
BPO_LIST=/etc/apt/sources.list.d/vhostmq-bookworm-backports.list
# (a removed package keeps its version in dpkg's database: the status counts)
if [[ $(dpkg-query -W -f='${db:Status-Status} ${Version}' qemu-system-x86 2>/dev/null) != "installed $QEMU_PIN" ]]; then
    if [[ ! -f $BPO_LIST ]]; then
        echo "deb http://deb.debian.org/debian bookworm-backports main" >"$BPO_LIST"
        UPDATED=0
    fi
    apt_update
    vmq_log "apt-get install QEMU $QEMU_PIN (bookworm-backports)"
    APTLOG=$(mktemp /tmp/vhostmq-apt.XXXXXX.log)
    if ! timeout 1200 apt-get install -y -q --no-install-recommends --allow-downgrades -t bookworm-backports \
        "qemu-system-x86=$QEMU_PIN" "qemu-system-common=$QEMU_PIN" "qemu-system-data=$QEMU_PIN" >"$APTLOG" 2>&1; then
        tail -n 30 "$APTLOG" >&2
        vmq_die "installing QEMU $QEMU_PIN failed (log: $APTLOG)"
    fi
    rm -f "$APTLOG"
fi
T1=$(vmq_now)

# ------------------------------------------------------------------ guest kernel
cached_kver() { # version of a complete cached kernel tree, or nothing
    local v
    [[ -f $KDIR/KERNEL_VERSION ]] || return 0
    v=$(<"$KDIR/KERNEL_VERSION")
    [[ -f $KDIR/boot/vmlinuz-$v && -d $KDIR/lib/modules/$v/kernel ]] && echo "$v"
    return 0
}
if ((WANT_KERNEL)); then
    KVER=$(cached_kver)
    if [[ -z $KVER || $REFRESH == 1 ]]; then
        resolve() { apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ { print $2; exit }'; }
        PKG=$(resolve)
        [[ -n $PKG ]] || { apt_update; PKG=$(resolve); }
        [[ -n $PKG ]] || vmq_die "cannot resolve linux-image-amd64 to a versioned kernel package"
        NEW=${PKG#linux-image-}
        if [[ $NEW != "$KVER" ]]; then
            vmq_log "fetching guest kernel $PKG into $KDIR"
            DL=$(mktemp -d /tmp/vhostmq-kernel.XXXXXX)
            chmod 0755 "$DL"   # apt's _apt sandbox user must be able to write here
            chown _apt "$DL" 2>/dev/null || true
            STAGE=""
            trap 'rm -rf -- "$DL" ${STAGE:+"$STAGE"}' EXIT
            if ! (cd "$DL" && timeout 600 apt-get download -q "$PKG" >"$DL/download.log" 2>&1); then
                apt_update
                (cd "$DL" && timeout 600 apt-get download -q "$PKG" >"$DL/download.log" 2>&1) ||
                    { cat "$DL/download.log" >&2; vmq_die "apt-get download $PKG failed"; }
            fi
            # unpack next to the final place, then swap: never leave a half tree
            mkdir -p "$(dirname "$KDIR")"
            STAGE=$(mktemp -d "$(dirname "$KDIR")/.guest-kernel.XXXXXX")
            dpkg-deb -x "$DL"/"$PKG"_*.deb "$STAGE"
            [[ -f $STAGE/boot/vmlinuz-$NEW ]] || vmq_die "package $PKG has no boot/vmlinuz-$NEW"
            echo "$NEW" >"$STAGE/KERNEL_VERSION"
            rm -rf -- "$KDIR"
            mv "$STAGE" "$KDIR"
            chmod 0755 "$KDIR"
            rm -rf -- "$DL"
            trap - EXIT
            KVER=$NEW
        fi
    fi
    vmq_log "guest kernel $KVER in $KDIR"
fi
T2=$(vmq_now)

if ((HUGE > 0)); then
    echo "$HUGE" >/proc/sys/vm/nr_hugepages || true
    grep -q ' hugetlbfs ' /proc/mounts || { mkdir -p /dev/hugepages && mount -t hugetlbfs -o pagesize=2M nodev /dev/hugepages; }
    vmq_log "hugepages: $(cat /proc/sys/vm/nr_hugepages) x 2 MiB reserved"
fi

vmq_log "done: packages $(vmq_elapsed "$T0" "$T1") s, kernel $(vmq_elapsed "$T1" "$T2") s"
echo "VHOSTMQ_KERNEL_DIR=$KDIR"
# what the tests will use, and an early stop when something cannot work
VHOSTMQ_KERNEL_DIR=$KDIR "$HERE/doctor.sh" "${DOCTOR_ARGS[@]}"
