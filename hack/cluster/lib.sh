# shellcheck shell=bash
# shellcheck disable=SC2034  # globals are read by the scripts that source this file
# Shared settings and helpers of the one-node test cluster (hack/cluster/).
# Source it, do not run it:
#
#   source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
#
# Environment (all optional):
#   VHOSTMQ_K8S_CACHE      build cache kept between runs   (/var/cache/vhostmq/k8s)
#   VHOSTMQ_K8S_VERSION    Kubernetes release to build      (v1.37.2)
#   VHOSTMQ_CLUSTER_RUN    PIDs, sockets, runtime state     (/run/vhostmq-cluster)
#   VHOSTMQ_CLUSTER_DATA   etcd, containerd root, configs   (/var/lib/vhostmq-cluster)
#   VHOSTMQ_CLUSTER_LOGS   daemon logs, kept after down     (/var/log/vhostmq-cluster)
#   VHOSTMQ_CLUSTER_NETNS  the node's network namespace     (vhostmq-cluster)

VMQC_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=../lib.sh
source "$VMQC_DIR/../lib.sh"

export PATH="$PATH:/usr/local/go/bin"

K8S_VERSION=${VHOSTMQ_K8S_VERSION:-v1.37.2}
VMQC_CACHE=${VHOSTMQ_K8S_CACHE:-/var/cache/vhostmq/k8s}
VMQC_BIN=$VMQC_CACHE/bin/$K8S_VERSION   # the five Kubernetes binaries
VMQC_TOOLS=$VMQC_CACHE/tools            # crictl, cnitool
VMQC_IMAGES=$VMQC_CACHE/images          # pause.tar, busybox.tar (OCI layouts)
VMQC_RUN=${VHOSTMQ_CLUSTER_RUN:-/run/vhostmq-cluster}
VMQC_DATA=${VHOSTMQ_CLUSTER_DATA:-/var/lib/vhostmq-cluster}
VMQC_LOGS=${VHOSTMQ_CLUSTER_LOGS:-/var/log/vhostmq-cluster}
VMQC_NETNS=${VHOSTMQ_CLUSTER_NETNS:-vhostmq-cluster}

VMQC_K8S_COMPONENTS=(kubelet kube-apiserver kube-scheduler kube-controller-manager kubectl)
VMQC_CRICTL_PKG=sigs.k8s.io/cri-tools/cmd/crictl@v1.37.0
VMQC_CNITOOL_PKG=github.com/containernetworking/cni/cnitool@v1.3.1
# containerd 2 (Debian 12 has 1.6, which has no CDI: the DRA driver's claims
# are CDI devices), built from the module proxy with its runc shim and ctr;
# cluster.sh runs it with its folder first on PATH, so the shim is its own
VMQC_CONTAINERD_VERSION=${VHOSTMQ_CONTAINERD_VERSION:-v2.4.2}
VMQC_CTRD_BIN=$VMQC_CACHE/containerd/$VMQC_CONTAINERD_VERSION
VMQC_CTR=$VMQC_CTRD_BIN/ctr
VMQC_CDI_DIR=$VMQC_RUN/cdi        # the CDI spec folder the nodes' containerd reads

VMQC_NODE=vhostmq-node
VMQC_NODE_IP=192.0.2.1            # RFC 5737 TEST-NET-1, only inside the netns
VMQC_POD_CIDR=198.51.100.0/24     # TEST-NET-2
VMQC_SERVICE_CIDR=203.0.113.0/24  # TEST-NET-3
VMQC_CTR_SOCK=$VMQC_RUN/containerd/containerd.sock
VMQC_PIDS=$VMQC_RUN/pids
VMQC_KUBECONFIG=$VMQC_DATA/admin.kubeconfig
VMQC_KUBELET_ROOT=/var/lib/kubelet
# a second node (cluster.sh add-node): its own netns, mount namespace,
# containerd, kubelet and pod range, joined to the first node's API server
VMQC_NODE2=vhostmq-node2
VMQC_NODE2_IP=192.0.2.2
VMQC_POD_CIDR2=198.18.0.0/24      # RFC 2544 benchmarking range, only in the netns
VMQC_NETNS2=$VMQC_NETNS-2
VMQC_N2_RUN=$VMQC_RUN/node2       # its containerd socket and state, mount ns file
VMQC_N2_DATA=$VMQC_DATA/node2     # its containerd root, kubelet root, per-node host folders
VMQC_N2_CTR_SOCK=$VMQC_N2_RUN/containerd/containerd.sock
VMQC_N2_MNT=$VMQC_N2_RUN/ns/mnt
# a registry at the first node's address (hack/kubevirt/test-install.sh starts
# one there): every node's containerd pulls from it over plain HTTP, as its
# hosts.toml under VMQC_REGISTRY_HOSTS (containerd's config_path) says
VMQC_REGISTRY=$VMQC_NODE_IP:5000
VMQC_REGISTRY_HOSTS=$VMQC_DATA/registry-hosts
VMQC_PAUSE_IMAGE=localhost/vhostmq/pause:dev
VMQC_BUSYBOX_IMAGE=localhost/vhostmq/busybox:dev

# ------------------------------------------------------------------ small helpers
vmqc_in_ns() { nsenter --net="/run/netns/$VMQC_NETNS" -- "$@"; }
# (the discovery cache goes to our run folder, not ~/.kube/cache)
vmqc_kubectl() {
    vmqc_in_ns env KUBECACHEDIR="$VMQC_RUN/kube-cache" \
        "$VMQC_BIN/kubectl" --kubeconfig "$VMQC_KUBECONFIG" --request-timeout 20s "$@"
}

# vmqc_apply_nad RESOURCE: the NetworkAttachmentDefinition CRD and the NAD
# default/vhu-net (vhostmq-cni with the cluster's kubeconfig, its pods'
# devices the RESOURCE the device plugin offers), as test-cni.sh and
# hack/bench/cni-burst.sh use them
vmqc_apply_nad() {
    local conf
    vmqc_kubectl apply -f "$VMQC_DIR/manifests/nad-crd.yaml" >/dev/null
    vmqc_kubectl wait --for=condition=Established crd/network-attachment-definitions.k8s.cni.cncf.io --timeout 30s >/dev/null
    conf=$(jq -cn --arg kc "$VMQC_KUBECONFIG" \
        '{cniVersion: "1.0.0", type: "vhostmq-cni", name: "vhu-net", capabilities: {CNIDeviceInfoFile: true, deviceID: true}, kubeconfig: $kc}')
    vmqc_kubectl apply -f - >/dev/null <<EOF
apiVersion: k8s.cni.cncf.io/v1
kind: NetworkAttachmentDefinition
metadata:
  name: vhu-net
  namespace: default
  annotations:
    k8s.v1.cni.cncf.io/resourceName: $1
spec:
  config: '$conf'
EOF
}
# vmqc_ctr_at SOCK ARGS...: our ctr on a node's containerd, without its
# cgroup v1 deprecation warning on every call
vmqc_ctr_at() {
    local sock=$1
    shift
    timeout 60 "$VMQC_CTR" -a "$sock" -n k8s.io "$@" 2> >(grep -v 'support for cgroup v1 is deprecated' >&2)
}
vmqc_ctr() { vmqc_ctr_at "$VMQC_CTR_SOCK" "$@"; }
vmqc_is_up() { [[ -s $VMQC_RUN/env ]]; }
vmqc_has_node2() { [[ -S $VMQC_N2_CTR_SOCK ]]; }
# vmqc_in_node2 CMD...: run CMD in the second node's netns and mount namespace
vmqc_in_node2() { nsenter --net="/run/netns/$VMQC_NETNS2" --mount="$VMQC_N2_MNT" -- "$@"; }
# vmqc_pid NAME: the recorded PID of daemon NAME ("" when none)
vmqc_pid() { awk -v n="$1" '$1 == n { p = $2 } END { print p }' "$VMQC_PIDS" 2>/dev/null; }
# vmqc_secs T0: seconds since a vmq_now stamp, 1 decimal
vmqc_secs() { awk -v a="$1" -v b="$(vmq_now)" 'BEGIN { printf "%.1f", b - a }'; }
# vmqc_poll SECONDS INTERVAL CMD...: run CMD until it succeeds, at most SECONDS
vmqc_poll() {
    local secs=$1 iv=$2 end
    shift 2
    end=$(($(date +%s%N) / 1000000 + secs * 1000))
    while (($(date +%s%N) / 1000000 < end)); do
        "$@" && return 0
        sleep "$iv"
    done
    "$@"
}

# ------------------------------------------------------------------ building
# vmqc_build_k8s: build the five Kubernetes binaries into $VMQC_BIN unless they
# are all there.  `go install k8s.io/kubernetes/cmd/kubelet@v` does not work
# (kubernetes' go.mod replaces its staging modules with ./staging/...), so a
# scratch module requires k8s.io/kubernetes and replaces every staging module
# with its published copy k8s.io/<name> v0.<minor>.<patch>, the list being read
# from kubernetes' own go.mod.  Built into a staging folder and moved into
# place at the end, so an interrupted build leaves nothing half-written.
vmqc_build_k8s() {
    local c todo=() k8s_gomod staging=() sv minor ldflags pkg targets=() mod out t0
    for c in "${VMQC_K8S_COMPONENTS[@]}"; do [[ -x $VMQC_BIN/$c ]] || todo+=("$c"); done
    ((${#todo[@]})) || { vmq_log "Kubernetes $K8S_VERSION binaries cached in $VMQC_BIN"; return 0; }
    t0=$(vmq_now)
    mod=$VMQC_CACHE/scratch/$K8S_VERSION
    out=$VMQC_CACHE/bin/.build-$K8S_VERSION.$$
    mkdir -p "$mod" "$VMQC_BIN"
    rm -rf "$out"
    vmq_log "building ${todo[*]} $K8S_VERSION from the Go module proxy (cold: ~10 min on 2 cores)"
    k8s_gomod=$(cd "$mod" && timeout 600 go mod download -json "k8s.io/kubernetes@$K8S_VERSION" |
        sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
    [[ -f $k8s_gomod ]] || vmq_die "could not download k8s.io/kubernetes@$K8S_VERSION"
    mapfile -t staging < <(sed -n 's#^[[:space:]]*\(k8s\.io/[a-z0-9-]*\) => \./staging/.*#\1#p' "$k8s_gomod")
    ((${#staging[@]} > 10)) || vmq_die "found only ${#staging[@]} staging modules in $k8s_gomod"
    sv="v0.${K8S_VERSION#v1.}"
    minor=${K8S_VERSION#v1.}
    minor=${minor%%.*}
    {
        echo "module vhostmq-k8s-build"
        echo
        grep -E '^(go|godebug) ' "$k8s_gomod"
        echo
        echo "require k8s.io/kubernetes $K8S_VERSION"
        echo
        echo "replace ("
        for c in "${staging[@]}"; do printf '\t%s => %s %s\n' "$c" "$c" "$sv"; done
        echo ")"
    } >"$mod/go.mod"
    rm -f "$mod/go.sum"
    for c in "${todo[@]}"; do targets+=("k8s.io/kubernetes/cmd/$c"); done
    (cd "$mod" && timeout 900 go get "${targets[@]/%/@$K8S_VERSION}") || vmq_die "go get failed"
    # the version stamps of kubernetes' hack/lib/version.sh, so that the
    # binaries report (and compare) the real version
    ldflags="-s -w"
    for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
        ldflags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
        ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    done
    mkdir -p "$out"
    # one go build for all of them shares the compile of the common packages
    (cd "$mod" && CGO_ENABLED=0 timeout "${VHOSTMQ_K8S_BUILD_TIMEOUT:-3000}" \
        go build -trimpath -ldflags "$ldflags" -o "$out/" "${targets[@]}") ||
        { rm -rf "$out"; vmq_die "building Kubernetes failed"; }
    for c in "${todo[@]}"; do mv -f "$out/$c" "$VMQC_BIN/$c"; done
    rm -rf "$out"
    vmq_log "built ${todo[*]} in $(vmqc_secs "$t0") s: $("$VMQC_BIN/kubelet" --version)"
}

# vmqc_build_tools: crictl and cnitool (cheap once the Kubernetes build warmed
# Go's caches) into $VMQC_TOOLS, unless there.
vmqc_build_tools() {
    local t pkg t0
    mkdir -p "$VMQC_TOOLS"
    for t in crictl cnitool; do
        [[ -x $VMQC_TOOLS/$t ]] && continue
        [[ $t == crictl ]] && pkg=$VMQC_CRICTL_PKG || pkg=$VMQC_CNITOOL_PKG
        t0=$(vmq_now)
        GOBIN=$VMQC_TOOLS CGO_ENABLED=0 GOFLAGS=-trimpath timeout 1200 go install "$pkg" ||
            vmq_die "go install $pkg failed"
        vmq_log "built $t in $(vmqc_secs "$t0") s"
    done
}

# vmqc_build_containerd: containerd, containerd-shim-runc-v2 and ctr of
# VMQC_CONTAINERD_VERSION into $VMQC_CTRD_BIN, unless there (2-4 min cold)
vmqc_build_containerd() {
    local c t0 m=github.com/containerd/containerd/v2/cmd
    for c in containerd containerd-shim-runc-v2 ctr; do [[ -x $VMQC_CTRD_BIN/$c ]] || break; done
    [[ -x $VMQC_CTRD_BIN/$c ]] && return 0
    t0=$(vmq_now)
    mkdir -p "$VMQC_CTRD_BIN"
    GOBIN=$VMQC_CTRD_BIN GOFLAGS=-trimpath timeout 1500 go install "$m/containerd@$VMQC_CONTAINERD_VERSION" \
        "$m/containerd-shim-runc-v2@$VMQC_CONTAINERD_VERSION" "$m/ctr@$VMQC_CONTAINERD_VERSION" ||
        vmq_die "go install containerd $VMQC_CONTAINERD_VERSION failed"
    vmq_log "built containerd $VMQC_CONTAINERD_VERSION in $(vmqc_secs "$t0") s"
}

# ------------------------------------------------------------------ node packages
# Debian 12: runc, etcd 3.4, the CNI plugins (in
# /usr/lib/cni), busybox-static (test image), gcc and libc6-dev (the static
# pause binary), jq, curl, openssl, iproute2, util-linux (nsenter).
VMQC_PKGS=(runc etcd-server etcd-client containernetworking-plugins busybox-static
    jq curl openssl iproute2 iptables util-linux gcc libc6-dev procps)
vmqc_install_deps() {
    local p missing=()
    for p in "${VMQC_PKGS[@]}"; do
        [[ $(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null) == installed ]] || missing+=("$p")
    done
    if ((${#missing[@]})); then
        vmq_log "apt-get install ${missing[*]}"
        timeout 600 apt-get update -q >/dev/null || vmq_die "apt-get update failed"
        DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -q --no-install-recommends \
            "${missing[@]}" >/dev/null || vmq_die "apt-get install failed"
    fi
    # the packages' own daemons are not wanted (we run our own containerd and
    # etcd); without systemd nothing was started, with it stop them
    if [[ -d /run/systemd/system ]] && ((${#missing[@]})); then
        systemctl disable --now containerd etcd 2>/dev/null || true
    fi
}

# ------------------------------------------------------------------ images
# vmqc_oci_image REF ROOTFS OUT.tar [ENTRYPOINT_JSON]: write ROOTFS as a
# one-layer OCI image layout tarball (what `ctr images import` takes), named
# REF.  Reproducible: sorted names, mtime 0, root-owned, uncompressed layer.
vmqc_oci_image() {
    local ref=$1 rootfs=$2 out=$3 entry=${4:-} tmp layer lsize cfg csize man msize ep=""
    tmp=$(mktemp -d)
    mkdir -p "$tmp/blobs/sha256"
    tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$rootfs" -cf "$tmp/layer" .
    layer=$(sha256sum "$tmp/layer" | cut -d' ' -f1)
    lsize=$(stat -c %s "$tmp/layer")
    mv "$tmp/layer" "$tmp/blobs/sha256/$layer"
    [[ -n $entry ]] && ep="\"Entrypoint\":$entry,"
    printf '{"architecture":"amd64","os":"linux","config":{%s"Env":["PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"],"WorkingDir":"/"},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
        "$ep" "$layer" >"$tmp/cfg"
    cfg=$(sha256sum "$tmp/cfg" | cut -d' ' -f1)
    csize=$(stat -c %s "$tmp/cfg")
    mv "$tmp/cfg" "$tmp/blobs/sha256/$cfg"
    printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:%s","size":%s}]}' \
        "$cfg" "$csize" "$layer" "$lsize" >"$tmp/man"
    man=$(sha256sum "$tmp/man" | cut -d' ' -f1)
    msize=$(stat -c %s "$tmp/man")
    mv "$tmp/man" "$tmp/blobs/sha256/$man"
    # io.containerd.image.name is the name `ctr images import` gives it
    printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"platform":{"architecture":"amd64","os":"linux"},"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' \
        "$man" "$msize" "$ref" "${ref##*:}" >"$tmp/index.json"
    echo '{"imageLayoutVersion":"1.0.0"}' >"$tmp/oci-layout"
    tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$tmp" \
        -cf "$out.part" oci-layout index.json blobs
    mv "$out.part" "$out"
    rm -rf "$tmp"
}

# vmqc_check_static FILE: fail unless FILE is an executable without an ELF
# interpreter (the images have no libc)
vmqc_check_static() {
    [[ -f $1 && -x $1 ]] || vmq_die "not an executable file: $1"
    if LC_ALL=C readelf -lW "$1" 2>/dev/null | grep -q 'program interpreter'; then
        vmq_die "$1 is dynamically linked; the image has no libc: build it with CGO_ENABLED=0"
    fi
}

# vmqc_rootfs_base DIR: the files every image gets (passwd, group, tmp)
vmqc_rootfs_base() {
    mkdir -p "$1/etc" "$1/tmp" "$1/usr/local/bin" "$1/proc" "$1/sys" "$1/dev"
    chmod 1777 "$1/tmp"
    printf 'root:x:0:0:root:/:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$1/etc/passwd"
    printf 'root:x:0:\nnogroup:x:65534:\n' >"$1/etc/group"
}

# vmqc_base_images: the pause (sandbox) image, from kubernetes' own
# build/pause/linux/pause.c compiled static, and a busybox test image from
# Debian's busybox-static; cached in $VMQC_IMAGES.
vmqc_base_images() {
    local pause_c root a
    mkdir -p "$VMQC_IMAGES"
    if [[ ! -s $VMQC_IMAGES/pause.tar ]]; then
        pause_c="$(go env GOMODCACHE)/k8s.io/kubernetes@$K8S_VERSION/build/pause/linux/pause.c"
        [[ -f $pause_c ]] || (cd /tmp && timeout 600 go mod download "k8s.io/kubernetes@$K8S_VERSION")
        [[ -f $pause_c ]] || vmq_die "no $pause_c"
        root=$(mktemp -d)
        gcc -Os -Wall -static -DVERSION="$K8S_VERSION-vhostmq" -o "$root/pause" "$pause_c"
        strip "$root/pause"
        vmqc_oci_image "$VMQC_PAUSE_IMAGE" "$root" "$VMQC_IMAGES/pause.tar" '["/pause"]'
        rm -rf "$root"
    fi
    if [[ ! -s $VMQC_IMAGES/busybox.tar ]]; then
        root=$(mktemp -d)
        vmqc_rootfs_base "$root"
        mkdir -p "$root/bin"
        cp /bin/busybox "$root/bin/busybox"
        vmqc_check_static "$root/bin/busybox"
        for a in $("$root/bin/busybox" --list); do
            [[ $a == busybox ]] || ln -s busybox "$root/bin/$a"
        done
        vmqc_oci_image "$VMQC_BUSYBOX_IMAGE" "$root" "$VMQC_IMAGES/busybox.tar" '["/bin/sh"]'
        rm -rf "$root"
    fi
}

# vmqc_import TARBALL...: import into the cluster's containerd (k8s.io
# namespace), and the second node's when there is one. With two nodes each
# image is also named REPO@<config digest>: a pod that follows a pod of
# another node asks for the image by the ID the first one ran (KubeVirt's
# migration target pins kernel-boot and container disks so), which a
# registry would serve; here the name must exist on every node.
vmqc_import() {
    local f socks=("$VMQC_CTR_SOCK") s m name cfg
    if [[ $VMQC_CTR_SOCK == "$VMQC_RUN/containerd/containerd.sock" ]] && vmqc_has_node2; then
        socks+=("$VMQC_N2_CTR_SOCK")
    fi
    for f in "$@"; do
        for s in "${socks[@]}"; do
            vmqc_ctr_at "$s" images import "$f" >/dev/null || vmq_die "ctr images import $f (containerd $s) failed"
        done
        ((${#socks[@]} > 1)) || continue
        while read -r m name; do
            [[ $name == */* && $m == sha256:* ]] || continue
            cfg=$(tar -xOf "$f" "blobs/sha256/${m#sha256:}" | jq -r .config.digest) || continue
            for s in "${socks[@]}"; do
                vmqc_ctr_at "$s" images tag --force "$name" "${name%:*}@$cfg" >/dev/null ||
                    vmq_die "ctr images tag $name ${name%:*}@$cfg (containerd $s) failed"
            done
        done < <(tar -xOf "$f" index.json | jq -r '.manifests[] | "\(.digest) \(.annotations["io.containerd.image.name"] // "")"')
    done
}

# vmqc_default_conflist FILE [SUBNET]: a node's default pod network (bridge
# + host-local on SUBNET, default VMQC_POD_CIDR), what cluster.sh uses
# unless given a conflist
vmqc_default_conflist() {
    cat >"$1" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "vhostmq-cluster",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": false,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "${2:-$VMQC_POD_CIDR}"}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": "$VMQC_RUN/cni/ipam"
      }
    }
  ]
}
EOF
}

# vmqc_multus_lite_conflists DIR LOG [KUBECONFIG SUBNET]: DIR/00-multus-lite.conflist
# (the Multus stand-in as the node's CNI, state in DIR/state, log LOG, the
# API server through KUBECONFIG, default the first node's) and the default
# network it delegates to, DIR/default.conflist (pods on SUBNET, default
# VMQC_POD_CIDR)
vmqc_multus_lite_conflists() {
    mkdir -p "$1"
    vmqc_default_conflist "$1/default.conflist" "${4:-$VMQC_POD_CIDR}"
    cat >"$1/00-multus-lite.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "multus-lite",
  "plugins": [
    {
      "type": "multus-lite",
      "kubeconfig": "${3:-$VMQC_KUBECONFIG}",
      "clusterNetwork": "$1/default.conflist",
      "stateDir": "$1/state",
      "logFile": "$2"
    }
  ]
}
EOF
}
