#!/usr/bin/env bash
# A Debian 12 cloud image for the install guide's VMs (docs/user/install.md):
# what quay.io/containerdisks/debian:12 is to a user (that registry cannot be
# reached from here), built from Debian's packages: a qcow2 disk with one
# ext4 partition and EXTLINUX (BIOS boot, as KubeVirt boots by default; GRUB
# would need the partition's block device, and loop partitions are not
# available everywhere: the disk is written through an offset mount), the
# cloud kernel, systemd, cloud-init (NoCloud and ConfigDrive: KubeVirt's
# cloudInitNoCloud volume; its default user is "debian"), ifupdown + DHCP on
# the first NIC (cloud-init's fallback network), a login on the serial
# console (console=ttyS0), ping and iproute2.  Cached; rebuilt when an input
# changes.
#
# Usage: hack/kubevirt/cloud-image.sh [-f]
#   -f   rebuild even if the stamp matches
# Output: $VMKV_IMAGES/debian-12-cloud.qcow2 (and the containerDisk's
# Containerfile next to it: FROM scratch, the disk at /disk/ owned by 107,
# as KubeVirt's docs make one)
# Environment: VHOSTMQ_DEBIAN_MIRROR (as images.sh)
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$HERE/lib.sh"
VMQ_TAG=cloud-image

FORCE=0
vmq_args -f:FORCE=1 -- "$@"
vmq_need_root
OUT=$VMKV_IMAGES/debian-12-cloud.qcow2
MIRROR=$(vmkv_debian_mirror)
PKGS=(linux-image-cloud-amd64 systemd-sysv udev e2fsprogs cloud-init ifupdown isc-dhcp-client
    iproute2 iputils-ping netbase sudo procps ethtool)
stamp=$(printf '%s\n' "$MIRROR" "${PKGS[@]}" "$(sha256sum "${BASH_SOURCE[0]}")" | sha256sum | cut -c1-32)
if ((!FORCE)) && [[ -f $OUT && $(cat "$OUT.stamp" 2>/dev/null) == "$stamp" ]]; then
    vmq_log "cached: $OUT ($(du -h "$OUT" | cut -f1))"
    exit 0
fi
vmkv_host_tools qemu-img:qemu-utils sfdisk:fdisk mkfs.ext4:e2fsprogs extlinux:extlinux \
    /usr/lib/syslinux/mbr/mbr.bin:syslinux-common
vmkv_lock images 3600
mkdir -p "$VMKV_IMAGES"
vmkv_have_base || vmkv_debian_base "$MIRROR"
T0=$(vmq_now)

R=$VMKV_ROOTFS/cloud.part work=$(mktemp -d) mnt=""
cleanup() {
    local rc=$?
    set +e
    if [[ -n $mnt ]]; then
        umount "$mnt" 2>/dev/null
    fi
    for m in dev/pts dev proc sys; do umount "$R/$m" 2>/dev/null; done
    rm -rf "$R" "$work"
    exit "$rc"
}
trap cleanup EXIT

# ------------------------------------------------------------------ the root
rm -rf "$R"
cp -a "$VMKV_BASE" "$R"
{
    echo "deb $MIRROR bookworm main"
    echo "deb $MIRROR bookworm-updates main"
    echo "deb ${MIRROR%/debian}/debian-security bookworm-security main"
} >"$R/etc/apt/sources.list"
printf '#!/bin/sh\nexit 101\n' >"$R/usr/sbin/policy-rc.d"
chmod +x "$R/usr/sbin/policy-rc.d"
cp /etc/resolv.conf "$R/etc/resolv.conf"
alog=$VMKV_ROOTFS/cloud-apt.log
vmq_log "apt-get install in the image root: ${PKGS[*]}"
for m in proc sys dev dev/pts; do mount --bind "/$m" "$R/$m"; done
in_root() { DEBIAN_FRONTEND=noninteractive timeout 1200 chroot "$R" "$@"; }
{
    in_root apt-get update -q &&
        in_root apt-get install -y -q --no-install-recommends "${PKGS[@]}" &&
        in_root apt-get clean
} >"$alog" 2>&1 || { tail -n 20 "$alog" >&2; vmq_die "apt-get in the image root failed (log $alog)"; }
for m in dev/pts dev proc sys; do umount "$R/$m"; done
# cloud-init: only the datasources KubeVirt offers (no network probing of
# EC2 & co. under TCG), DHCP on the first NIC when no network-config says
# otherwise (cloud-init's fallback); the locale the image has (no locales
# package: en_US.UTF-8 would fail cloud-init's locale module)
cat >"$R/etc/cloud/cloud.cfg.d/90-vhostmq.cfg" <<'C'
datasource_list: [NoCloud, ConfigDrive, None]
locale: C.UTF-8
C
grep -q 'name: debian' "$R/etc/cloud/cloud.cfg" || vmq_die "cloud-init's default user is not debian in this package"
rm -rf "$R"/var/lib/apt/lists/* "$R"/var/cache/apt/*.bin "$R"/usr/share/doc "$R"/usr/share/man \
    "$R"/usr/share/locale "$R/usr/sbin/policy-rc.d" "$R/etc/resolv.conf" "$R/.complete"
: >"$R/etc/machine-id"
echo debian >"$R/etc/hostname"

# ------------------------------------------------------------------ the disk
# one partition from sector 2048; its ext4 without the features EXTLINUX
# 6.04 cannot read (64bit, metadata_csum)
size_mb=$(($(du -sm "$R" | cut -f1) + 400))
raw=$work/disk.raw
truncate -s "${size_mb}M" "$raw"
echo 'start=2048, type=83, bootable' | sfdisk -q "$raw"
offset=$((2048 * 512))
mkfs.ext4 -q -F -L root -O ^64bit,^metadata_csum -E offset=$offset "$raw" $(((size_mb * 1024 * 1024 - offset) / 1024))k
uuid=$(blkid -p -O $offset -s UUID -o value "$raw")
[[ -n $uuid ]] || vmq_die "no UUID on the root file system at offset $offset of $raw"
mnt=$work/mnt
mkdir -p "$mnt"
mount -o loop,offset=$offset "$raw" "$mnt"
cp -a "$R"/. "$mnt"/
echo "UUID=$uuid / ext4 errors=remount-ro 0 1" >"$mnt/etc/fstab"
kernel=$(cd "$mnt/boot" && ls vmlinuz-*) initrd=$(cd "$mnt/boot" && ls initrd.img-*)
[[ $kernel == vmlinuz-* && $initrd == initrd.img-* ]] || vmq_die "no kernel or initrd in the image's /boot: $(ls "$mnt/boot")"
mkdir -p "$mnt/boot/extlinux"
cat >"$mnt/boot/extlinux/extlinux.conf" <<X
SERIAL 0 115200
DEFAULT debian
TIMEOUT 1
LABEL debian
  LINUX /boot/$kernel
  INITRD /boot/$initrd
  APPEND root=UUID=$uuid ro console=tty0 console=ttyS0,115200n8
X
xlog=$VMKV_ROOTFS/cloud-extlinux.log
extlinux --install "$mnt/boot/extlinux" >"$xlog" 2>&1 || { cat "$xlog" >&2; vmq_die "extlinux --install failed"; }
umount "$mnt"
mnt=""
dd if=/usr/lib/syslinux/mbr/mbr.bin of="$raw" bs=440 count=1 conv=notrunc status=none
qemu-img convert -c -O qcow2 "$raw" "$OUT.part"
# the checksum KubeVirt 1.7 puts in the VMI's status must fit an int32
vmkv_crc32_pad "$OUT.part"
mv "$OUT.part" "$OUT"
cat >"$VMKV_IMAGES/Containerfile.debian-12-cloud" <<'D'
FROM scratch
ADD --chown=107:107 debian-12-cloud.qcow2 /disk/
D
echo "$stamp" >"$OUT.stamp"
vmq_log "wrote $OUT ($(du -h "$OUT" | cut -f1), root ${size_mb} MiB) in $(vmqc_secs "$T0") s"
