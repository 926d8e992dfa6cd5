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
# Logs each check, prints the failures and "N passed, N failed"; exit
# status 1 if any check failed.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$HERE/lib.sh"
VMQ_TAG=image
KEEP=0
vmq_args --keep:KEEP=1 -- "$@"
vmq_need_root
command -v podman >/dev/null || vmq_die "podman is missing (hack/install-deps.sh installs it)"
command -v "$VMQ_OCI_RUNTIME" >/dev/null || vmq_die "OCI runtime $VMQ_OCI_RUNTIME is missing (hack/install-deps.sh installs runc; VHOSTMQ_OCI_RUNTIME picks another)"
cd "$VMQ_REPO_ROOT"

vmq_log "podman $(podman version --format '{{.Client.Version}}'), OCI runtime $VMQ_OCI_RUNTIME ($("$VMQ_OCI_RUNTIME" --version | head -n1)), storage $(vmq_podman info --format '{{.Store.GraphDriverName}}'), cgroups $(vmq_podman info --format '{{.Host.CgroupsVersion}}') via cgroupfs; podman's own default would be $(podman info --format '{{.Host.OCIRuntime.Name}}' 2>/dev/null || echo '?')"
MAIN=localhost/vhostmq:podman
SIDECAR=localhost/vhostmq/kubevirt-binding:podman
work=$(mktemp -d /tmp/vhostmq-image.XXXXXX)
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
vmq_golang_base "$work/base"
vmq_log "base $VMQ_GOLANG_BASE: busybox + $(go env GOVERSION) ($(vmq_podman image inspect "$VMQ_GOLANG_BASE" --format '{{.Size}}' | numfmt --to=iec))"

# --------------------------------------------------------------- podman build
build() { # LOG podman-build-args...: the build's output to LOG, its tail on failure
    local log=$1
    shift
    vmq_podman build --pull=never --network host "${VMQ_GOLANG_LEND[@]}" "$@" . >"$log" 2>&1 || { tail -n 20 "$log"; return 1; }
}
t0=$(vmq_now)
vmq_check "podman build . -> $MAIN" build "$work/build-main.log" -t "$MAIN"
vmq_check "podman build --target kubevirt-binding . -> $SIDECAR" build "$work/build-sidecar.log" --target kubevirt-binding -t "$SIDECAR"
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
vmq_expect "$MAIN's binaries, one per cmd/ ($ncmd)" "$nbin" "$ncmd"
vmq_check "$MAIN's binaries are byte for byte the offline build's" same_bins "$work/main"
sidecar_bins=$(find "$work/sidecar/usr/local/bin" -type f -printf '%f\n' | paste -sd' ')
sidecar_diff=$(same_bins "$work/sidecar" | paste -sd' ' || true)
vmq_expect "$SIDECAR's binaries, byte for byte the offline build's" "$sidecar_bins${sidecar_diff:+;$sidecar_diff}" vhostmq-kubevirt-binding
ep() { vmq_podman image inspect "$1" --format '{{json .Config.Entrypoint}} {{.Config.User}}'; }
vmq_expect "entrypoints and users: $MAIN / $SIDECAR" "$(ep "$MAIN")/$(ep "$SIDECAR")" \
    '["/usr/local/bin/vhostmq-dataplane"] /["/usr/local/bin/vhostmq-kubevirt-binding"] 107:107'
dynamic=""
for b in "$work"/main/usr/local/bin/*; do
    readelf -lW "$b" 2>/dev/null | grep -q 'program interpreter' && dynamic+=" ${b##*/}"
done
vmq_expect "$MAIN's dynamically linked binaries" "${dynamic# }" ""
vmq_fails_report
