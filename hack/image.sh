#!/usr/bin/env bash
# Builds the Dockerfile's two images with podman, as a user would
# (`podman build .`, `podman build --target kubevirt-binding .`), and checks
# that they hold exactly the binaries of the offline path (hack/cluster/
# images.sh) built with the Dockerfile's flags, byte for byte.
#
# No registry is reachable here, so the Dockerfile's build base (FROM
# golang:1.26) is made locally: busybox-static for RUN's /bin/sh, this
# machine's Go toolchain and CA certificates (the build downloads modules
# from the Go proxy). The host's module and build caches are lent to the
# build (podman build -v), so a warm machine compiles nothing twice; the
# Dockerfile itself is used as it is.
#
# Usage: hack/image.sh [--keep]
#   --keep   leave the images in podman's storage (localhost/vhostmq:podman,
#            localhost/vhostmq/kubevirt-binding:podman)
# Podman runs with the OCI runtime, cgroup manager and events log pinned
# (vmq_podman in lib.sh), and says which it used.
# Prints "N passed, N failed"; exit status 1 if any check failed.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$HERE/lib.sh"
VMQ_TAG=image
KEEP=0
case ${1:-} in
    --keep) KEEP=1 ;;
    "") ;;
    -h | --help) vmq_usage "$0"; exit 0 ;;
    *) vmq_die "unknown argument $1 (see --help)" ;;
esac
vmq_need_root
command -v podman >/dev/null || vmq_die "podman is missing (hack/install-deps.sh installs it)"
command -v "$VMQ_OCI_RUNTIME" >/dev/null || vmq_die "OCI runtime $VMQ_OCI_RUNTIME is missing (hack/install-deps.sh installs runc; VHOSTMQ_OCI_RUNTIME picks another)"
cd "$VMQ_REPO_ROOT"

vmq_log "podman $(podman version --format '{{.Client.Version}}'), OCI runtime $VMQ_OCI_RUNTIME ($("$VMQ_OCI_RUNTIME" --version | head -n1)), storage $(vmq_podman info --format '{{.Store.GraphDriverName}}'), cgroups $(vmq_podman info --format '{{.Host.CgroupsVersion}}') via cgroupfs; podman's own default would be $(podman info --format '{{.Host.OCIRuntime.Name}}' 2>/dev/null || echo '?')"
GO_VERSION=$(go env GOVERSION)
# the host's caches, lent at the same paths: with -trimpath a module
# package's cache key holds its directory, so same paths mean cache hits
MODCACHE=$(go env GOMODCACHE)
BUILDCACHE=$(go env GOCACHE)
BASE=docker.io/library/golang:1.26
MAIN=localhost/vhostmq:podman
SIDECAR=localhost/vhostmq/kubevirt-binding:podman
work=$(mktemp -d /tmp/vhostmq-image.XXXXXX)
passed=0 failed=0
check() { # check WHAT CMD...
    local what=$1
    shift
    if "$@"; then echo "ok   $what"; passed=$((passed + 1)); else echo "FAIL $what"; failed=$((failed + 1)); fi
}
cleanup() {
    local rc=$?
    set +e
    [[ -n ${cid:-} ]] && vmq_podman rm -f "$cid" >/dev/null 2>&1
    ((KEEP)) || vmq_podman rmi -f "$MAIN" "$SIDECAR" >/dev/null 2>&1
    rm -rf "$work"
    exit "$rc"
}
trap cleanup EXIT

# --------------------------------------------------------------- the base
[[ $GO_VERSION == go1.26* ]] || vmq_die "the Dockerfile builds with golang:1.26; this machine has $GO_VERSION"
root=$work/base
mkdir -p "$root/bin" "$root/usr/local" "$root/etc/ssl/certs" "$root/tmp" "$root/go" "$root/root"
chmod 1777 "$root/tmp"
cp /bin/busybox "$root/bin/busybox"
for a in sh mkdir rm cp ls cat env; do ln -s busybox "$root/bin/$a"; done
cp -a "$(go env GOROOT)" "$root/usr/local/go"
cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/"
tar -C "$root" -c . | vmq_podman import \
    --change 'ENV PATH=/go/bin:/usr/local/go/bin:/usr/local/bin:/usr/bin:/bin' \
    --change 'ENV GOPATH=/go' --change 'ENV GOTOOLCHAIN=local' --change 'ENV HOME=/root' \
    --change "ENV GOMODCACHE=$MODCACHE" --change "ENV GOCACHE=$BUILDCACHE" --change 'WORKDIR /go' \
    - "$BASE" >/dev/null
vmq_log "base $BASE: busybox + $GO_VERSION ($(vmq_podman image inspect "$BASE" --format '{{.Size}}' | numfmt --to=iec))"

# --------------------------------------------------------------- podman build
lend=(-v "$MODCACHE:$MODCACHE" -v "$BUILDCACHE:$BUILDCACHE")
build() { # LOG podman-build-args...: the build's output to LOG, its tail on failure
    local log=$1
    shift
    vmq_podman build --pull=never --network host "${lend[@]}" "$@" . >"$log" 2>&1 || { tail -n 20 "$log"; return 1; }
}
t0=$(vmq_now)
check "podman build . -> $MAIN" build "$work/build-main.log" -t "$MAIN"
check "podman build --target kubevirt-binding . -> $SIDECAR" build "$work/build-sidecar.log" --target kubevirt-binding -t "$SIDECAR"
vmq_log "both images built in $(vmq_elapsed "$t0") s"

# --------------------------------------------------------------- same content
# the offline path's binaries, built with the Dockerfile's command
mkdir -p "$work/host"
CGO_ENABLED=0 GOFLAGS=-buildvcs=false go build -trimpath -ldflags='-s -w' -o "$work/host/" ./cmd/...
# what an image holds: its files, exported
files_of() { # IMAGE DIR
    mkdir -p "$2"
    cid=$(vmq_podman create "$1" /x)
    vmq_podman export "$cid" | tar -C "$2" -x
    vmq_podman rm -f "$cid" >/dev/null
    cid=""
}
files_of "$MAIN" "$work/main"
files_of "$SIDECAR" "$work/sidecar"
same_bins() { # DIR: every binary in DIR/usr/local/bin equals the host's build, and no other file is in the image
    local d=$1 f bad=0
    for f in "$d"/usr/local/bin/*; do
        cmp -s "$f" "$work/host/${f##*/}" || { echo "    ${f##*/} differs from the offline build"; bad=1; }
    done
    [[ -z $(find "$d" -type f ! -path "$d/usr/local/bin/*" ! -path "$d/etc/*" ! -path "$d/proc/*" ! -path "$d/sys/*" ! -path "$d/dev/*") ]] ||
        { echo "    unexpected files: $(find "$d" -type f ! -path "$d/usr/local/bin/*" | head -5 | tr '\n' ' ')"; bad=1; }
    return "$bad"
}
nbin=$(find "$work/main/usr/local/bin" -type f | wc -l)
ncmd=$(find cmd -mindepth 1 -maxdepth 1 -type d | wc -l)
check "$MAIN holds one binary per cmd/ ($nbin of $ncmd)" test "$nbin" = "$ncmd"
check "$MAIN's binaries are byte for byte the offline build's" same_bins "$work/main"
check "$SIDECAR holds only vhostmq-kubevirt-binding, the same bytes" \
    test "$(find "$work/sidecar/usr/local/bin" -type f -printf '%f\n')" = vhostmq-kubevirt-binding -a -z "$(same_bins "$work/sidecar")"
ep() { vmq_podman image inspect "$1" --format '{{json .Config.Entrypoint}} {{.Config.User}}'; }
check "entrypoints: $MAIN $(ep "$MAIN"), $SIDECAR $(ep "$SIDECAR")" \
    test "$(ep "$MAIN")/$(ep "$SIDECAR")" = '["/usr/local/bin/vhostmq-dataplane"] /["/usr/local/bin/vhostmq-kubevirt-binding"] 107:107'
for b in "$work"/main/usr/local/bin/*; do
    readelf -lW "$b" 2>/dev/null | grep -q 'program interpreter' && { echo "    ${b##*/} is dynamically linked"; failed=$((failed + 1)); }
done
echo "$passed passed, $failed failed"
((failed == 0))
