# shellcheck shell=bash
# shellcheck disable=SC2034  # globals are read by the scripts that source this file
# Shared settings of the real-KubeVirt test bed (hack/kubevirt/).  Source it,
# do not run it:
#
#   source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
#
# It sources hack/cluster/lib.sh (the one-node cluster's settings and
# helpers, which sources hack/lib.sh).
#
# Environment (all optional):
#   VHOSTMQ_KUBEVIRT_VERSION  KubeVirt release to build     (v1.7.0: the newest
#                             whose dependencies the module proxy serves)
#   VHOSTMQ_KUBEVIRT_CACHE    binaries, rootfs, images kept  (/var/cache/vhostmq/kubevirt)
#   VHOSTMQ_KUBEVIRT_RUN      test-bed state (PIDs, flags)   (/run/vhostmq-kubevirt)

VMKV_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=../cluster/lib.sh
source "$VMKV_DIR/../cluster/lib.sh"

KV_VERSION=${VHOSTMQ_KUBEVIRT_VERSION:-v1.7.0}
VMKV_CACHE=${VHOSTMQ_KUBEVIRT_CACHE:-/var/cache/vhostmq/kubevirt}
VMKV_BIN=$VMKV_CACHE/bin/$KV_VERSION               # KubeVirt's binaries
VMKV_KUBE_PROXY=$VMKV_CACHE/bin/kube-proxy-$K8S_VERSION  # the node has none
VMKV_IMAGES=$VMKV_CACHE/images                     # OCI tarballs
VMKV_ROOTFS=$VMKV_CACHE/rootfs                     # debootstrap base + image root
VMKV_BASE=$VMKV_ROOTFS/base                        # Debian 12 minbase (debootstrap)
VMKV_RUN=${VHOSTMQ_KUBEVIRT_RUN:-/run/vhostmq-kubevirt}
VMKV_TAG=$KV_VERSION-debian
VMKV_REG=localhost/kubevirt
VMKV_IMAGE_TAR=$VMKV_IMAGES/kubevirt-$KV_VERSION.tar
VMKV_GUEST_IMAGE=localhost/vhostmq/guest-kernel:dev
VMKV_GUEST_TAR=$VMKV_IMAGES/guest-kernel.tar
# what the images need; sidecars/network-passt-binding and the generic
# sidecar-shim are not built (our binding is its own sidecar)
VMKV_COMPONENTS=(virt-operator virt-api virt-controller virt-handler virt-launcher
    virt-launcher-monitor virt-chroot virt-freezer virt-probe virt-tail)
# KubeVirt's command-line client, on the host only (the install guide's
# `virtctl console`)
VMKV_TOOLS=(virtctl)
# the images the operator deploys (one rootfs, several names)
VMKV_IMAGE_NAMES=(virt-operator virt-api virt-controller virt-handler virt-launcher)

# vmkv_lock NAME [SECONDS]: one build.sh (NAME build), images.sh (images) or
# testbed.sh up/down (testbed) at a time: flock on $VMKV_CACHE/.lock-NAME,
# fd 8 (cluster.sh uses fd 9)
vmkv_lock() {
    mkdir -p "$VMKV_CACHE"
    exec 8>>"$VMKV_CACHE/.lock-$1"
    flock -w "${2:-600}" 8 || vmq_die "another hack/kubevirt $1 is running (lock $VMKV_CACHE/.lock-$1)"
}

# vmkv_debian_mirror: VHOSTMQ_DEBIAN_MIRROR, else the host's own Debian
# mirror (deb822 URIs: or a deb line; not security), without a trailing /
vmkv_debian_mirror() {
    local m=${VHOSTMQ_DEBIAN_MIRROR:-}
    if [[ -z $m ]]; then
        m=$({
            grep -h -E '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{ print $2 }'
            grep -h -E '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null | awk '{ print $2 }'
        } | grep -v -e security -e nodesource -e google | grep -m1 '/debian/\?$' || true)
    fi
    [[ -n $m ]] || vmq_die "no Debian mirror in the host's apt sources; set VHOSTMQ_DEBIAN_MIRROR"
    echo "${m%/}"
}

# vmkv_have_base: the debootstrap base is complete
vmkv_have_base() { [[ -x $VMKV_BASE/usr/bin/apt-get && -f $VMKV_BASE/.complete ]]; }

# vmkv_debian_base MIRROR: Debian 12 minbase by debootstrap into $VMKV_BASE
# (the images' common start; callers hold vmkv_lock images)
vmkv_debian_base() {
    local log=$VMKV_ROOTFS/debootstrap.log
    command -v debootstrap >/dev/null ||
        DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -q --no-install-recommends debootstrap >/dev/null ||
        vmq_die "apt-get install debootstrap failed"
    mkdir -p "$VMKV_ROOTFS"
    rm -rf "$VMKV_BASE"
    vmq_log "debootstrap --variant=minbase bookworm from $1"
    timeout 900 debootstrap --variant=minbase bookworm "$VMKV_BASE" "$1" >"$log" 2>&1 ||
        { tail -n 20 "$log" >&2; vmq_die "debootstrap failed (log $log)"; }
    touch "$VMKV_BASE/.complete"
}

# vmkv_src: KubeVirt's module source folder (downloads the module; no
# network needed once it is in GOMODCACHE)
vmkv_src() {
    local d
    d=$(cd /tmp && timeout 600 go mod download -json "kubevirt.io/kubevirt@$KV_VERSION" |
        sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
    [[ -d $d/cmd/virt-launcher ]] || vmq_die "cannot download kubevirt.io/kubevirt@$KV_VERSION from the module proxy"
    echo "$d"
}

# vmkv_have_binaries: every component and container-disk is in the cache
vmkv_have_binaries() {
    local c
    for c in "${VMKV_COMPONENTS[@]}" "${VMKV_TOOLS[@]}" container-disk; do [[ -x $VMKV_BIN/$c ]] || return 1; done
    [[ -x $VMKV_KUBE_PROXY ]]
}

# vmkv_oci_layout OUT.tar LAYER_ROOT 'REF ENTRYPOINT_JSON USER' ...: one
# uncompressed layer (file capabilities kept: virt-launcher-monitor needs
# one) named by several references, one config + manifest each, as an OCI
# image layout that `ctr images import` takes.  Reproducible.
vmkv_oci_layout() {
    local out=$1 root=$2 tmp layer lsize spec ref entry user cfg csize man msize manifests=""
    shift 2
    tmp=$(mktemp -d "$(dirname "$out")/.oci.XXXXXX")
    mkdir -p "$tmp/blobs/sha256"
    tar --sort=name --mtime=@0 --numeric-owner --xattrs --xattrs-include='security.capability' \
        -C "$root" -cf "$tmp/layer" .
    layer=$(sha256sum "$tmp/layer" | cut -d' ' -f1)
    lsize=$(stat -c %s "$tmp/layer")
    mv "$tmp/layer" "$tmp/blobs/sha256/$layer"
    for spec in "$@"; do
        read -r ref entry user <<<"$spec"
        printf '{"architecture":"amd64","os":"linux","config":{"User":"%s","Entrypoint":%s,"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],"WorkingDir":"/"},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
            "${user:-}" "$entry" "$layer" >"$tmp/cfg"
        cfg=$(sha256sum "$tmp/cfg" | cut -d' ' -f1)
        csize=$(stat -c %s "$tmp/cfg")
        mv "$tmp/cfg" "$tmp/blobs/sha256/$cfg"
        printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:%s","size":%s}]}' \
            "$cfg" "$csize" "$layer" "$lsize" >"$tmp/man"
        man=$(sha256sum "$tmp/man" | cut -d' ' -f1)
        msize=$(stat -c %s "$tmp/man")
        mv "$tmp/man" "$tmp/blobs/sha256/$man"
        manifests+="${manifests:+,}{\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\"digest\":\"sha256:$man\",\"size\":$msize,\"platform\":{\"architecture\":\"amd64\",\"os\":\"linux\"},\"annotations\":{\"io.containerd.image.name\":\"$ref\",\"org.opencontainers.image.ref.name\":\"${ref##*:}\"}}"
    done
    echo "{\"schemaVersion\":2,\"manifests\":[$manifests]}" >"$tmp/index.json"
    echo '{"imageLayoutVersion":"1.0.0"}' >"$tmp/oci-layout"
    tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$tmp" \
        -cf "$out.part" oci-layout index.json blobs
    mv "$out.part" "$out"
    rm -rf "$tmp"
}

# vmkv_stop_webhook: the webhook process test-vm.sh started (left by a --keep
# run), by the PID in $VMKV_RUN/webhook.pid if that still is it
vmkv_stop_webhook() {
    local p
    p=$(cat "$VMKV_RUN/webhook.pid" 2>/dev/null || true)
    if [[ -n $p && $(cat "/proc/$p/comm" 2>/dev/null) == timeout ]] && grep -qaF vhostmq-webhook "/proc/$p/cmdline" 2>/dev/null; then
        vmq_stop "$p"
    fi
    rm -f "$VMKV_RUN/webhook.pid"
}

# vmkv_crc32_pad FILE: append zero bytes to FILE until its CRC32 is in
# 1..2^31-1.  KubeVirt v1.7.0 + Kubernetes 1.37: virt-handler writes the
# CRC32 (uint32) of every containerDisk and kernel-boot file to the VMI's
# status (volumeStatus[].containerDiskVolume.checksum,
# kernelBootStatus.*.checksum), which the VMI CRD declares "format: int32";
# the 1.37 API server rejects a value >= 2^31 ("Checked value must be of
# type integer with format int32") and the VMI's status never leaves
# Scheduled.  The file's format must ignore trailing zeros (ELF, cpio, qcow2).
vmkv_crc32_pad() {
    "$VMQ_PY" - "$1" <<'PY' || vmq_die "padding $1 failed"
import sys, zlib
p = sys.argv[1]
c = 0
with open(p, "rb") as f:
    while b := f.read(1 << 20):
        c = zlib.crc32(b, c)
n = 0
with open(p, "ab") as f:
    while not 0 < c < 1 << 31:
        f.write(b"\0")
        c = zlib.crc32(b"\0", c)
        n += 1
print(f"{p}: crc32 {c} after {n} zero bytes", file=sys.stderr)
PY
}

# vmkv_host_tools WHAT:PACKAGE...: apt-get install each PACKAGE whose WHAT,
# a command (or an absolute file path), the host lacks
vmkv_host_tools() {
    local p w
    for p in "$@"; do
        w=${p%%:*}
        if [[ $w == /* ]]; then [[ -f $w ]] && continue; else command -v "$w" >/dev/null && continue; fi
        DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -q --no-install-recommends "${p#*:}" >/dev/null ||
            vmq_die "apt-get install ${p#*:} failed"
    done
}
