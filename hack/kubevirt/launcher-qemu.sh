#!/usr/bin/env bash
# Runs the QEMU of the KubeVirt launcher image (QEMU 10.0 from
# bookworm-backports, in hack/kubevirt/images.sh's cache) on the host, with
# the host's /tmp, /var/tmp, /work, /dev and /proc seen at the same paths,
# so that the e2e scripts can drive the QEMU that KubeVirt runs instead of
# Debian 12's 7.2:
#
#   VHOSTMQ_QEMU=hack/kubevirt/launcher-qemu.sh hack/e2e-queues.sh
#
# Usage: hack/kubevirt/launcher-qemu.sh QEMU-ARGS...   (as root)
# Needs the launcher root: make test-kubevirt (or hack/kubevirt/images.sh)
# builds it once per machine.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${VHOSTMQ_KUBEVIRT_CACHE:-/var/cache/vhostmq/kubevirt}
ROOT=$CACHE/rootfs/pkgs-${VHOSTMQ_KUBEVIRT_LIBVIRT_SUITE:-bookworm-backports}
[[ -x $ROOT/usr/bin/qemu-system-x86_64 ]] || {
    echo "launcher-qemu: no QEMU in $ROOT: build the launcher root first (hack/kubevirt/images.sh, or make test-kubevirt)" >&2
    exit 1
}
binds=(/tmp /var/tmp /dev /proc "$(cd "$HERE/../.." && pwd)")
# everything under a private mount namespace: nothing stays mounted
# shellcheck disable=SC2016  # the inner script expands its own arguments
exec unshare --mount --propagation private -- bash -c '
    root=$1; shift
    n=$1; shift
    for ((i = 0; i < n; i++)); do
        mkdir -p "$root$1"
        mount --rbind "$1" "$root$1"
        shift
    done
    exec chroot "$root" qemu-system-x86_64 "$@"
' launcher-qemu "$ROOT" "${#binds[@]}" "${binds[@]}" "$@"
