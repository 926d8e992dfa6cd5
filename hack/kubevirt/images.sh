#!/usr/bin/env bash
# KubeVirt's component images (Debian, built here: KubeVirt's own images come
# from a registry we cannot reach) and the kernel-boot image of the
# project's test guest, as OCI image-layout tarballs that `ctr images import`
# takes.  Cached; rebuilt only when an input changes.
#
# Usage: hack/kubevirt/images.sh [-f]
#   -f   rebuild even if the stamps match (the debootstrap base is kept)
#
# Output ($VHOSTMQ_KUBEVIRT_CACHE/images):
#   kubevirt-v1.7.0.tar   one layer under five names,
#                         localhost/kubevirt/virt-{operator,api,controller,
#                         handler,launcher}:v1.7.0-debian (operator, api and
#                         controller run as uid 1001: their pods set
#                         runAsNonRoot)
#   guest-kernel.tar      localhost/vhostmq/guest-kernel:dev with
#                         /boot/vmlinux and /boot/initramfs.cpio.gz from
#                         hack/guest/build.sh, for a VMI's
#                         firmware.kernelBoot.container (no disk image)
#
# The root filesystem (rootfs/ in the cache):
#   * Debian 12 minbase by debootstrap from the host's mirror (cached: base/);
#   * libvirt 11.3 and QEMU 10.0 from bookworm-backports, added inside the
#     chroot only (the host's apt sources are untouched); QEMU 10 has no
#     MSI-X crash with vhost-user under TCG (Debian 12's 7.2 does), KubeVirt
#     v1.7.0 ships libvirt 10.10 and QEMU 9.1 (cached with the package list:
#     pkgs-<suite>/);
#   * the binaries of build.sh, KubeVirt's qemu.conf, virtqemud.conf,
#     nsswitch.conf and node-labeller.sh from the module, user/group qemu 107;
#   * /usr/sbin/virtqemud: Debian builds no modular libvirt daemons, so a shim
#     execs libvirtd (same config keys) and names its socket virtqemud-sock;
#   * /usr/bin/virt-handler: a shim for this machine, where /proc/1/root and
#     /proc/1/ns/* give EACCES even to root (PID 1 holds CAP_SYS_RESOURCE, root
#     lacks it): inside the handler's own mount namespace it binds the
#     kubelet's /proc/<pid> over /proc/1, then execs virt-handler.bin (a no-op
#     where /proc/1/root is readable); with two nodes on the machine, the
#     kubelet of the handler's own node (NODE_NAME);
#   * /var/run -> ../run, relative (Debian's is absolute): virt-handler
#     makes a migration's source sockets in the launcher's /var/run through
#     /proc/<pid>/root, where an absolute link resolves in its own root;
#   * /usr/bin/qemu-system-x86_64: qemu-tcg-shim, which runs libvirt's
#     "-accel tcg" as tcg,thread=single for guests with several vCPUs (QEMU
#     10.0's multi-threaded TCG aborts booting them, iotlb_to_section
#     assertion), then execs the real binary (.bin);
#   * virt-launcher-monitor gets cap_net_bind_service=+ep (KubeVirt's image
#     has it; without it "fork/exec /usr/bin/virt-launcher: operation not
#     permitted"); the layer keeps file capabilities.
#
# Environment: VHOSTMQ_KUBEVIRT_{VERSION,CACHE} (lib.sh),
#   VHOSTMQ_KUBEVIRT_LIBVIRT_SUITE=bookworm-backports (bookworm: libvirt 9.0 and
#   QEMU 7.2, which crash on vhost-user + MSI-X under TCG; not tried),
#   VHOSTMQ_DEBIAN_MIRROR=<first Debian mirror of the host's apt sources>
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$HERE/lib.sh"
VMQ_TAG=kubevirt-images

FORCE=0
vmq_args -f:FORCE=1 -- "$@"
vmq_need_root
SUITE=${VHOSTMQ_KUBEVIRT_LIBVIRT_SUITE:-bookworm-backports}
MIRROR=$(vmkv_debian_mirror)
BASE=$VMKV_BASE
PKGS_ROOT=$VMKV_ROOTFS/pkgs-$SUITE
ROOT=$VMKV_ROOTFS/kubevirt-$KV_VERSION
LV_PKGS=(libvirt-daemon libvirt-daemon-driver-qemu libvirt-clients qemu-system-x86 qemu-utils)
# libvirt-daemon-log (virtlogd) is a package of its own from 11.x on
[[ $SUITE == bookworm ]] || LV_PKGS+=(libvirt-daemon-log)
# what virt-handler and virt-launcher call: ip, nft, iptables, mount, ps,
# xorrisofs (virt-launcher makes a cloudInitNoCloud volume's ISO with it)
TOOL_PKGS=(procps iproute2 nftables iptables ca-certificates kmod util-linux xorriso)
T0=$(vmq_now) T_BASE=0 T_PKGS=0 T_KV=0 T_GUEST=0

vmkv_host_tools debootstrap:debootstrap setcap:libcap2-bin cpio:cpio
vmkv_lock images 3600
mkdir -p "$VMKV_ROOTFS" "$VMKV_IMAGES"

# ------------------------------------------------------------------ 1. Debian base
if ! vmkv_have_base; then
    t=$(vmq_now)
    vmkv_debian_base "$MIRROR"
    T_BASE=$(vmqc_secs "$t")
fi

# ------------------------------------------------------------------ 2. packages
pkgs_stamp=$(printf '%s\n' "$MIRROR" "$SUITE" "${LV_PKGS[@]}" "${TOOL_PKGS[@]}" | sha256sum | cut -c1-32)
if ((FORCE)) || [[ $(cat "$PKGS_ROOT/.stamp" 2>/dev/null) != "$pkgs_stamp" ]]; then
    t=$(vmq_now)
    rm -rf "$PKGS_ROOT" "$PKGS_ROOT.part"
    cp -a "$BASE" "$PKGS_ROOT.part"
    R=$PKGS_ROOT.part
    {
        echo "deb $MIRROR bookworm main"
        echo "deb $MIRROR bookworm-updates main"
        echo "deb ${MIRROR%/debian}/debian-security bookworm-security main"
        [[ $SUITE == bookworm ]] || echo "deb $MIRROR $SUITE main"
    } >"$R/etc/apt/sources.list"
    printf '#!/bin/sh\nexit 101\n' >"$R/usr/sbin/policy-rc.d"
    chmod +x "$R/usr/sbin/policy-rc.d"
    cp /etc/resolv.conf "$R/etc/resolv.conf"
    in_root() { DEBIAN_FRONTEND=noninteractive timeout 900 chroot "$R" "$@"; }
    alog=$VMKV_ROOTFS/apt.log
    vmq_log "apt-get install in the image root: ${LV_PKGS[*]} (-t $SUITE), ${TOOL_PKGS[*]}"
    {
        in_root apt-get update -q &&
            in_root apt-get install -y -q --no-install-recommends -t "$SUITE" "${LV_PKGS[@]}" &&
            in_root apt-get install -y -q --no-install-recommends "${TOOL_PKGS[@]}" &&
            in_root apt-get clean
    } >"$alog" 2>&1 || { tail -n 20 "$alog" >&2; vmq_die "apt-get in the image root failed (log $alog)"; }
    # shellcheck disable=SC2016  # ${Version} is dpkg-query's format
    echo "libvirt $(in_root dpkg-query -W -f '${Version}' libvirt-daemon), qemu $(in_root dpkg-query -W -f '${Version}' qemu-system-x86)" >"$R/.versions"
    rm -rf "$R"/var/lib/apt/lists/* "$R"/var/cache/apt/*.bin "$R"/usr/share/doc "$R"/usr/share/man \
        "$R"/usr/share/locale "$R/usr/sbin/policy-rc.d" "$R/etc/resolv.conf"
    echo "$pkgs_stamp" >"$R/.stamp"
    mv "$R" "$PKGS_ROOT"
    T_PKGS=$(vmqc_secs "$t")
    vmq_log "packages: $T_PKGS s ($(cat "$PKGS_ROOT/.versions"))"
fi

# ------------------------------------------------------------------ 3. KubeVirt image
for c in "${VMKV_COMPONENTS[@]}" container-disk; do
    [[ -x $VMKV_BIN/$c ]] || vmq_die "$VMKV_BIN/$c missing: run $HERE/build.sh first"
done
KVSRC=$(vmkv_src)
kv_stamp=$({
    cat "$PKGS_ROOT/.stamp"
    sha256sum "$0" "$HERE/lib.sh" "$HERE/qemu-tcg-shim" "$VMKV_BIN"/* "$KVSRC/cmd/virt-launcher/qemu.conf" \
        "$KVSRC/cmd/virt-launcher/virtqemud.conf" "$KVSRC/cmd/virt-launcher/nsswitch.conf" \
        "$KVSRC/cmd/virt-launcher/node-labeller/node-labeller.sh" | cut -d' ' -f1
} | sha256sum | cut -c1-32)
if ((FORCE)) || [[ ! -s $VMKV_IMAGE_TAR || $(cat "$VMKV_IMAGE_TAR.stamp" 2>/dev/null) != "$kv_stamp" ]]; then
    t=$(vmq_now)
    rm -rf "$ROOT"
    cp -a "$PKGS_ROOT" "$ROOT"
    install -m 0755 "$VMKV_BIN"/virt-* "$VMKV_BIN/container-disk" "$ROOT/usr/bin/"
    install -m 0755 "$KVSRC/cmd/virt-launcher/node-labeller/node-labeller.sh" "$ROOT/usr/bin/node-labeller.sh"
    install -m 0644 "$KVSRC/cmd/virt-launcher/qemu.conf" "$KVSRC/cmd/virt-launcher/virtqemud.conf" "$ROOT/etc/libvirt/"
    install -m 0644 "$KVSRC/cmd/virt-launcher/nsswitch.conf" "$ROOT/etc/nsswitch.conf"
    grep -q '^qemu:' "$ROOT/etc/group" || echo 'qemu:x:107:' >>"$ROOT/etc/group"
    grep -q '^qemu:' "$ROOT/etc/passwd" || echo 'qemu:x:107:107:qemu user:/home/qemu:/bin/bash' >>"$ROOT/etc/passwd"
    mkdir -p "$ROOT/home/qemu" "$ROOT/var/run/libvirt" "$ROOT/var/lib/kubevirt-node-labeller"
    chown 107:107 "$ROOT/home/qemu"
    cat >"$ROOT/usr/sbin/virtqemud" <<'EOF'
#!/bin/bash
# Debian ships no modular libvirt daemons: libvirtd stands in for virtqemud
# (same config keys), and its socket gets the name virt-launcher dials.  As
# root libvirtd makes /run/libvirt/libvirt-sock, as a user
# $XDG_RUNTIME_DIR/libvirt/libvirt-sock (virt-launcher sets XDG_RUNTIME_DIR
# to /var/run).  "-d" (node-labeller.sh) daemonizes, as virtqemud -d does.
set -u
if [ "$(id -u)" = 0 ]; then dir=/run/libvirt; else dir="${XDG_RUNTIME_DIR:-/run/user/$(id -u)}/libvirt"; fi
(
    for _ in $(seq 600); do
        if [ -S "$dir/libvirt-sock" ]; then
            ln -sf libvirt-sock "$dir/virtqemud-sock"
            [ -S "$dir/libvirt-sock-ro" ] && ln -sf libvirt-sock-ro "$dir/virtqemud-sock-ro"
            exit 0
        fi
        sleep 0.1
    done
) &
exec /usr/sbin/libvirtd "$@"
EOF
    chmod 0755 "$ROOT/usr/sbin/virtqemud"
    mv "$ROOT/usr/bin/virt-handler" "$ROOT/usr/bin/virt-handler.bin"
    cat >"$ROOT/usr/bin/virt-handler" <<'EOF'
#!/bin/bash
# virt-handler (hostPID) reaches the host through /proc/1/root and, via
# virt-chroot, /proc/1/ns/mnt.  Where PID 1 holds a capability root lacks
# (CAP_SYS_RESOURCE on the vhostmq test machines) both give EACCES and
# virt-handler panics ("failed to detect the presence of selinux").  Bind the
# kubelet's /proc/<pid> (same host namespaces, accessible) over /proc/1 in
# this container's own mount namespace.  A no-op where /proc/1/root is
# readable.
# With several nodes on one machine (hack/cluster add-node), the kubelet is
# the one serving this pod's node (NODE_NAME, its --hostname-override): its
# mount namespace holds that node's /var/lib/kubelet and /run.
if ! ls /proc/1/root/ >/dev/null 2>&1; then
    for p in /proc/[0-9]*; do
        [ "$(cat "$p/comm" 2>/dev/null)" = kubelet ] || continue
        if [ -n "${NODE_NAME:-}" ] && ! tr '\0' '\n' <"$p/cmdline" 2>/dev/null | grep -qx -- "$NODE_NAME"; then
            continue
        fi
        mount --bind "$p" /proc/1 && echo "virt-handler shim: bound $p (the kubelet of ${NODE_NAME:-this node}) over /proc/1" >&2
        break
    done
fi
exec /usr/bin/virt-handler.bin "$@"
EOF
    chmod 0755 "$ROOT/usr/bin/virt-handler"
    mv "$ROOT/usr/bin/qemu-system-x86_64" "$ROOT/usr/bin/qemu-system-x86_64.bin"
    install -m 0755 "$HERE/qemu-tcg-shim" "$ROOT/usr/bin/qemu-system-x86_64"
    setcap cap_net_bind_service=+ep "$ROOT/usr/bin/virt-launcher-monitor"
    # virt-handler reaches a launcher's /var/run through /proc/<pid>/root
    # (the migration proxy's source sockets): Debian's absolute /var/run ->
    # /run would resolve in virt-handler's own root there, so the link is
    # relative, as in KubeVirt's own images
    ln -sfn ../run "$ROOT/var/run"
    echo "$KV_VERSION" >"$ROOT/.version"
    specs=()
    for comp in "${VMKV_IMAGE_NAMES[@]}"; do
        user=""
        case $comp in virt-operator | virt-api | virt-controller) user=1001 ;; esac
        specs+=("$VMKV_REG/$comp:$VMKV_TAG [\"/usr/bin/$comp\"] $user")
    done
    vmkv_oci_layout "$VMKV_IMAGE_TAR" "$ROOT" "${specs[@]}"
    echo "$kv_stamp" >"$VMKV_IMAGE_TAR.stamp"
    rm -rf "$ROOT" # the tarball has it; the packages root is the cache
    T_KV=$(vmqc_secs "$t")
    vmq_log "wrote $VMKV_IMAGE_TAR ($(du -h "$VMKV_IMAGE_TAR" | cut -f1)) in $T_KV s: $VMKV_REG/{$(
        IFS=,
        echo "${VMKV_IMAGE_NAMES[*]}"
    )}:$VMKV_TAG"
else
    vmq_log "$VMKV_IMAGE_TAR is up to date"
fi

# ------------------------------------------------------------------ 4. guest kernel image
# the guest kernel (unpacked linux-image into /var/cache/vhostmq/guest-kernel),
# busybox-static, iperf3, ethtool: a no-op when they are there
"$VMQ_HACK_DIR/install-deps.sh" >/dev/null || vmq_die "hack/install-deps.sh failed"
vmq_build_guest
vmq_guest_env
[[ -n ${GUEST_VMLINUX:-} && -f $GUEST_VMLINUX ]] || vmq_die "the guest image has no vmlinux (hack/guest/build.sh)"
g_stamp=$(sha256sum "$0" "$HERE/lib.sh" "$GUEST_VMLINUX" "$GUEST_INITRD" | cut -d' ' -f1 | sha256sum | cut -c1-32)
if ((FORCE)) || [[ ! -s $VMKV_GUEST_TAR || $(cat "$VMKV_GUEST_TAR.stamp" 2>/dev/null) != "$g_stamp" ]]; then
    t=$(vmq_now)
    groot=$(mktemp -d)
    mkdir -p "$groot/boot"
    install -m 0644 "$GUEST_VMLINUX" "$groot/boot/vmlinux"
    install -m 0644 "$GUEST_INITRD" "$groot/boot/initramfs.cpio.gz"
    # zero bytes are ignored after an ELF's contents and between initramfs
    # archives
    for f in "$groot/boot/vmlinux" "$groot/boot/initramfs.cpio.gz"; do vmkv_crc32_pad "$f"; done
    # owned by qemu (107) like KubeVirt's containerDisk images
    chown -R 107:107 "$groot/boot"
    vmkv_oci_layout "$VMKV_GUEST_TAR" "$groot" "$VMKV_GUEST_IMAGE null"
    rm -rf "$groot"
    echo "$g_stamp" >"$VMKV_GUEST_TAR.stamp"
    T_GUEST=$(vmqc_secs "$t")
    vmq_log "wrote $VMKV_GUEST_TAR ($(du -h "$VMKV_GUEST_TAR" | cut -f1)): $VMKV_GUEST_IMAGE"
fi
echo "images: debootstrap ${T_BASE}s, packages ${T_PKGS}s, kubevirt image ${T_KV}s, guest image ${T_GUEST}s," \
    "total $(vmqc_secs "$T0")s; $(du -h "$VMKV_IMAGE_TAR" | cut -f1) + $(du -h "$VMKV_GUEST_TAR" | cut -f1)," \
    "rootfs cache $(du -sh "$VMKV_ROOTFS" | cut -f1)"
