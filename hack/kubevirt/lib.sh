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
    for c in "${VMKV_COMPONENTS[@]}" container-disk; do [[ -x $VMKV_BIN/$c ]] || return 1; done
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
