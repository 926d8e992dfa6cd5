#!/usr/bin/env bash
# Build minimal OCI images from static binaries and import them into the test
# cluster's containerd (namespace k8s.io); no registry, no docker.
#
# Usage: hack/cluster/images.sh [--out DIR] [--no-import] NAME=STATIC_BINARY ...
#        hack/cluster/images.sh [--out DIR] [--no-import] --bundle REF STATIC_BINARY ...
#        hack/cluster/images.sh --base
#   NAME=STATIC_BINARY   one image per binary, localhost/vhostmq/NAME:dev,
#                        the binary at /usr/local/bin/NAME, its entrypoint
#   --bundle REF BIN...  one image REF holding every BIN in /usr/local/bin, no
#                        entrypoint (the pod names the command); the DaemonSet
#                        uses `--bundle localhost/vhostmq:dev bin/*`
#   --base               the cluster's pause and busybox images into the cache
#                        (cluster.sh up does this)
#   --out DIR            keep the tarballs in DIR (default: a temporary folder,
#                        removed after the import)
#   --no-import          only write the tarballs (needs --out)
# Every image holds just the binaries, /etc/passwd, /etc/group and /tmp.  A
# binary with an ELF interpreter is refused: build with CGO_ENABLED=0.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$HERE/lib.sh"
VMQ_TAG=images

out="" import=1 bundle="" base=0 args=()
while (($#)); do
    case $1 in
        --out) out=$2; shift 2 ;;
        --no-import) import=0; shift ;;
        --bundle) bundle=$2; shift 2 ;;
        --base) base=1; shift ;;
        -h | --help) vmq_usage "$0"; exit 0 ;;
        -*) vmq_die "unknown option $1 (see --help)" ;;
        *) args+=("$1"); shift ;;
    esac
done

if ((base)); then
    vmqc_base_images
    ls -l "$VMQC_IMAGES"
    exit 0
fi
((${#args[@]})) || { vmq_usage "$0" >&2; exit 2; }
((import)) || [[ -n $out ]] || vmq_die "--no-import needs --out DIR"
if ((import)) && ! vmqc_is_up; then
    vmq_die "the cluster is not up (hack/cluster/cluster.sh up), or use --out DIR --no-import"
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
[[ -n $out ]] || out=$work/out
mkdir -p "$out"
tarballs=()

# image REF TARBALL_NAME ENTRYPOINT_JSON BINARY...
image() {
    local ref=$1 tarball=$out/$2 entry=$3 root=$work/root b
    shift 3
    rm -rf "$root"
    vmqc_rootfs_base "$root"
    for b in "$@"; do
        vmqc_check_static "$b"
        cp "$b" "$root/usr/local/bin/"
    done
    vmqc_oci_image "$ref" "$root" "$tarball" "$entry"
    tarballs+=("$tarball")
    vmq_log "$ref: $tarball ($(du -h "$tarball" | cut -f1), $(printf '%s ' "$@"))"
}

if [[ -n $bundle ]]; then
    [[ $bundle == *:* ]] || bundle=$bundle:dev
    name=${bundle%:*}
    image "$bundle" "${name##*/}.tar" "" "${args[@]}"
else
    for pair in "${args[@]}"; do
        [[ $pair == ?*=?* ]] || vmq_die "expected NAME=STATIC_BINARY, got '$pair'"
        name=${pair%%=*} bin=${pair#*=}
        [[ $name =~ ^[a-z0-9][a-z0-9._-]*$ ]] || vmq_die "bad image name '$name'"
        vmqc_check_static "$bin"
        # the binary is installed under NAME, so that is what the entrypoint runs
        cp "$bin" "$work/$name"
        image "localhost/vhostmq/$name:dev" "$name.tar" "[\"/usr/local/bin/$name\"]" "$work/$name"
        rm -f "$work/$name"
    done
fi

if ((import)); then
    vmqc_import "${tarballs[@]}"
    vmq_log "imported into the cluster: $(vmqc_ctr images ls -q | grep '^localhost/' | tr '\n' ' ')"
fi
