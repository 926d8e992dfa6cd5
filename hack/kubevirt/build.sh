#!/usr/bin/env bash
# Build KubeVirt's binaries (v1.7.0) and kube-proxy from the Go module proxy
# into the cache, for hack/kubevirt/images.sh and testbed.sh.  A no-op when
# every binary is cached; a run without the cache builds everything (there is
# no other source of these binaries).
#
# Usage: hack/kubevirt/build.sh [-f]
#   -f   rebuild even if the binaries are cached
#
# Output ($VHOSTMQ_KUBEVIRT_CACHE, default /var/cache/vhostmq/kubevirt):
#   bin/v1.7.0/        virt-operator, -api, -controller, -handler, -launcher,
#                      -launcher-monitor, -chroot, -freezer, -probe, -tail
#                      (cgo, dynamically linked against glibc and libvirt: the
#                      images are Debian), container-disk (static C) and
#                      virtctl (the host's client, not in the images)
#   bin/kube-proxy-v1.37.2   the node (hack/cluster) runs none; KubeVirt needs
#                      Service IPs (its webhooks, the API from pods)
#   scratch/v1.7.0/, scratch/k8s-v1.37.2/   the build modules
#
# How: `go install kubevirt.io/kubevirt/cmd/...@v1.7.0` is refused (its go.mod
# has replace directives), so a scratch module requires kubevirt.io/kubevirt,
# copies every replace of its go.mod that does not point into the tree, and
# takes kubevirt.io/api and kubevirt.io/client-go (./staging there) at the
# same published tag.  kube-proxy the same way as hack/cluster/lib.sh builds
# the node: kubernetes' staging modules replaced by their published v0.x.
# Newer KubeVirt does not build here: v1.8/v1.9 need modules the proxy
# refuses (libnbd, virt-template).  virt-launcher links libvirt through cgo:
# Debian 12's libvirt-dev 9.0 compiles libvirt.org/go/libvirt v1.11005.0
# (the 8 calls newer than 9.0 become run-time stubs; KubeVirt v1.7.0 calls
# none of them) and the binary runs with the image's libvirt 11.3.
#
# Environment: VHOSTMQ_KUBEVIRT_VERSION, VHOSTMQ_KUBEVIRT_CACHE (lib.sh),
#   VHOSTMQ_KUBEVIRT_BUILD_TIMEOUT=3000 (seconds for each go build)
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$HERE/lib.sh"
VMQ_TAG=kubevirt-build
BUILD_TIMEOUT=${VHOSTMQ_KUBEVIRT_BUILD_TIMEOUT:-3000}

FORCE=0
vmq_args -f:FORCE=1 -- "$@"
vmq_need_root
command -v go >/dev/null || vmq_die "go is not installed"

# build dependencies: cgo against libvirt, gcc for container-disk
install_deps() {
    local p missing=()
    for p in libvirt-dev pkg-config gcc libc6-dev; do
        [[ $(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null) == installed ]] || missing+=("$p")
    done
    ((${#missing[@]})) || return 0
    vmq_log "apt-get install ${missing[*]}"
    timeout 600 apt-get update -q >/dev/null || vmq_die "apt-get update failed"
    DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null ||
        vmq_die "apt-get install ${missing[*]} failed"
}

build_kubevirt() {
    local mod=$VMKV_CACHE/scratch/$KV_VERSION out=$VMKV_CACHE/bin/.build-$KV_VERSION.$$ kvmod gover c
    local pkgs=() ldflags vpkg=kubevirt.io/client-go/version t0 src tools
    t0=$(vmq_now)
    mkdir -p "$mod" "$VMKV_BIN"
    # blank imports, so that `go mod tidy` keeps what we build
    tools=$(
        echo "//go:build tools"
        echo
        echo "package tools"
        echo
        echo "import ("
        for c in "${VMKV_COMPONENTS[@]}" "${VMKV_TOOLS[@]}"; do printf '\t_ "kubevirt.io/kubevirt/cmd/%s"\n' "$c"; done
        echo ")"
    )
    if [[ ! -f $mod/go.sum || $(cat "$mod/tools.go" 2>/dev/null) != "$tools" ]] ||
        ! grep -q "kubevirt.io/kubevirt $KV_VERSION" "$mod/go.mod" 2>/dev/null; then
        kvmod=$(cd "$mod" && timeout 600 go mod download -json "kubevirt.io/kubevirt@$KV_VERSION" |
            sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
        [[ -f $kvmod ]] || vmq_die "could not download kubevirt.io/kubevirt@$KV_VERSION (the proxy serves v1.7.0; newer ones have refused dependencies)"
        gover=$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$kvmod")
        {
            echo "module vhostmq-kubevirt-build"
            echo
            echo "go $gover"
            echo
            echo "require kubevirt.io/kubevirt $KV_VERSION"
            echo
            echo "replace ("
            sed -n '/^replace (/,/^)/p' "$kvmod" | grep '=>' | grep -v '=> \./' || true
            printf '\tkubevirt.io/api => kubevirt.io/api %s\n' "$KV_VERSION"
            printf '\tkubevirt.io/client-go => kubevirt.io/client-go %s\n' "$KV_VERSION"
            echo ")"
        } >"$mod/go.mod"
        echo "$tools" >"$mod/tools.go"
        rm -f "$mod/go.sum"
        vmq_log "go mod tidy (the dependency graph of kubevirt.io/kubevirt $KV_VERSION)"
        (cd "$mod" && timeout 900 go mod tidy) || vmq_die "go mod tidy failed in $mod"
    fi
    for c in "${VMKV_COMPONENTS[@]}" "${VMKV_TOOLS[@]}"; do pkgs+=("kubevirt.io/kubevirt/cmd/$c"); done
    # the version stamp of KubeVirt's hack/version.sh
    ldflags="-s -w -X $vpkg.gitVersion=$KV_VERSION -X $vpkg.gitTreeState=clean -X $vpkg.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    rm -rf "$out"
    mkdir -p "$out"
    vmq_log "go build ${VMKV_COMPONENTS[*]} ${VMKV_TOOLS[*]} (cgo, tags selinux; ~3 min on 2 idle cores)"
    # one go build for all: the shared packages compile once
    (cd "$mod" && CGO_ENABLED=1 timeout "$BUILD_TIMEOUT" go build -trimpath -tags selinux -ldflags "$ldflags" -o "$out/" "${pkgs[@]}") ||
        { rm -rf "$out"; vmq_die "building KubeVirt failed"; }
    # container-disk: the static C helper of containerDisk volumes
    src=$(cd "$mod" && go list -m -f '{{.Dir}}' kubevirt.io/kubevirt)/cmd/container-disk-v2alpha/main.c
    [[ -f $src ]] || vmq_die "no $src"
    gcc -static -O2 -o "$out/container-disk" "$src" || vmq_die "building container-disk failed"
    for c in "${VMKV_COMPONENTS[@]}" "${VMKV_TOOLS[@]}" container-disk; do mv -f "$out/$c" "$VMKV_BIN/$c"; done
    rm -rf "$out"
    T_KV=$(vmqc_secs "$t0")
    vmq_log "built KubeVirt $KV_VERSION in $T_KV s into $VMKV_BIN ($(du -sh "$VMKV_BIN" | cut -f1))"
}

# kube-proxy: hack/cluster builds the node's five binaries; the same scratch
# module recipe (staging modules replaced by their published copies) here
build_kube_proxy() {
    local mod=$VMKV_CACHE/scratch/k8s-$K8S_VERSION k8s_gomod staging=() sv minor ldflags pkg c t0
    t0=$(vmq_now)
    mkdir -p "$mod" "$(dirname "$VMKV_KUBE_PROXY")"
    if [[ ! -f $mod/go.sum ]]; then
        k8s_gomod=$(cd "$mod" && timeout 600 go mod download -json "k8s.io/kubernetes@$K8S_VERSION" |
            sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
        [[ -f $k8s_gomod ]] || vmq_die "could not download k8s.io/kubernetes@$K8S_VERSION"
        mapfile -t staging < <(sed -n 's#^[[:space:]]*\(k8s\.io/[a-z0-9-]*\) => \./staging/.*#\1#p' "$k8s_gomod")
        ((${#staging[@]} > 10)) || vmq_die "found only ${#staging[@]} staging modules in $k8s_gomod"
        sv="v0.${K8S_VERSION#v1.}"
        {
            echo "module vhostmq-kube-proxy-build"
            echo
            grep -E '^(go|godebug) ' "$k8s_gomod"
            echo
            echo "require k8s.io/kubernetes $K8S_VERSION"
            echo
            echo "replace ("
            for c in "${staging[@]}"; do printf '\t%s => %s %s\n' "$c" "$c" "$sv"; done
            echo ")"
        } >"$mod/go.mod"
        (cd "$mod" && timeout 900 go get "k8s.io/kubernetes/cmd/kube-proxy@$K8S_VERSION") ||
            { rm -f "$mod/go.sum"; vmq_die "go get kube-proxy failed"; }
    fi
    minor=${K8S_VERSION#v1.}
    minor=${minor%%.*}
    ldflags="-s -w"
    for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
        ldflags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
    done
    vmq_log "go build kube-proxy $K8S_VERSION"
    (cd "$mod" && CGO_ENABLED=0 timeout "$BUILD_TIMEOUT" go build -trimpath -ldflags "$ldflags" \
        -o "$VMKV_KUBE_PROXY.part" k8s.io/kubernetes/cmd/kube-proxy) || vmq_die "building kube-proxy failed"
    mv -f "$VMKV_KUBE_PROXY.part" "$VMKV_KUBE_PROXY"
    T_KP=$(vmqc_secs "$t0")
    vmq_log "built kube-proxy in $T_KP s: $("$VMKV_KUBE_PROXY" --version 2>&1)"
}

vmkv_lock build 3600
T0=$(vmq_now) T_KV=0 T_KP=0
if ((FORCE == 0)) && vmkv_have_binaries; then
    vmq_log "KubeVirt $KV_VERSION and kube-proxy $K8S_VERSION are cached in $VMKV_CACHE/bin"
else
    install_deps
    kv_missing=0
    for c in "${VMKV_COMPONENTS[@]}" "${VMKV_TOOLS[@]}" container-disk; do [[ -x $VMKV_BIN/$c ]] || kv_missing=1; done
    if ((FORCE || kv_missing)); then build_kubevirt; fi
    if ((FORCE)) || [[ ! -x $VMKV_KUBE_PROXY ]]; then build_kube_proxy; fi
fi
echo "build: kubevirt ${T_KV}s, kube-proxy ${T_KP}s, total $(vmqc_secs "$T0")s; bin $(du -sh "$VMKV_CACHE/bin" | cut -f1)"
