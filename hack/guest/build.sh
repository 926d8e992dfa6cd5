#!/usr/bin/env bash
# Build the vhostmq test guest: a Debian kernel booted through its PVH entry
# point plus a small initramfs whose /init (hack/guest/init) is driven by
# vmq.* kernel command line keys.
#
# Output (OUT, default <repo>/_output/guest):
#   initramfs.cpio.gz  busybox-static, virtio_net + virtio_pci modules (with
#                      their dependencies, uncompressed, in load order),
#                      ethtool, iperf3 and their shared libraries, /init
#   vmlinux            uncompressed ELF extracted from the bzImage; QEMU boots it
#                      through PVH, skipping real mode and the decompressor
#                      (about twice as fast under TCG)
#   vmlinuz            the bzImage (fallback)
#   guest.env          GUEST_KVER, GUEST_VMLINUX, GUEST_BZIMAGE, GUEST_INITRD
#   .stamp             checksum of every input; an unchanged rebuild is a no-op
#
# The kernel comes from KERNEL_DIR (default $VHOSTMQ_KERNEL_DIR or
# /var/cache/vhostmq/guest-kernel, filled by hack/install-deps.sh), a
# `dpkg-deb -x` of Debian's linux-image package; the newest kernel there (or
# in / when that has none) with a module tree is used.
#
# Usage: hack/guest/build.sh [-o OUT] [-k KERNEL_DIR] [-f]
#   -f   rebuild even if the stamp matches
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=../lib.sh
source "$HERE/../lib.sh"
VMQ_TAG=guest-build

OUT=$VMQ_GUEST_DIR KROOT=$VMQ_KERNEL_DIR FORCE=0
while (($#)); do
    case $1 in
        -o) OUT=$2; shift 2 ;;
        -k) KROOT=${2%/}; shift 2 ;;
        -f) FORCE=1; shift ;;
        -h | --help) vmq_usage "$0"; exit 0 ;;
        *) vmq_die "unknown argument: $1 (see --help)" ;;
    esac
done
T0=$(vmq_now)

# ---------------------------------------------------------------- inputs
pick_kernel() { # ROOT -> newest version with boot/vmlinuz-V and lib/modules/V/kernel
    local root=$1 f v
    for f in "$root"/boot/vmlinuz-*; do
        [[ -e $f ]] || continue
        v=${f##*/vmlinuz-}
        [[ -d $root/lib/modules/$v/kernel ]] && echo "$v"
    done | sort -V | tail -n1
}
KVER=$(pick_kernel "$KROOT")
if [[ -z $KVER ]]; then
    KVER=$(pick_kernel "")
    [[ -n $KVER ]] && KROOT=""
fi
[[ -n $KVER ]] || vmq_die "no guest kernel in $KROOT (nor in /boot): run hack/install-deps.sh"
KIMG=$KROOT/boot/vmlinuz-$KVER
KCFG=$KROOT/boot/config-$KVER
MODDIR=$KROOT/lib/modules/$KVER

BUSYBOX=/bin/busybox
[[ -x $BUSYBOX ]] || BUSYBOX=$(command -v busybox || true)
[[ -n $BUSYBOX ]] || vmq_die "busybox not found: apt-get install busybox-static"
ldd "$BUSYBOX" >/dev/null 2>&1 && vmq_die "$BUSYBOX is dynamically linked: apt-get install busybox-static"
BINS=()
for b in ethtool iperf3; do
    p=$(command -v "$b" || true)
    [[ -n $p ]] || vmq_die "$b not installed: run hack/install-deps.sh"
    BINS+=("$(readlink -f "$p")")
done

# modules: virtio_net and virtio_pci unless built in, dependencies first.
# modules.dep when the tree has one (installed kernel), else modinfo (an
# unpacked .deb has none: depmod runs in the package's postinst)
declare -a ORDER=()
modfile() {
    local n=$1 f
    f=$(find "$MODDIR/kernel" \( -name "$n.ko*" -o -name "${n//_/-}.ko*" \) -print -quit)
    [[ -n $f ]] || vmq_die "module $n not found under $MODDIR/kernel"
    echo "$f"
}
add_module() {
    local n=$1 f deps d
    if [[ -f $MODDIR/modules.dep ]]; then
        local line
        line=$(grep -E "(^|/)${n}\.ko(\.[a-z]+)?:" "$MODDIR/modules.dep" | head -n1) || vmq_die "module $n not in modules.dep"
        f=$MODDIR/${line%%:*}
        deps=$(for d in ${line#*:}; do d=${d##*/}; echo "${d%%.ko*}"; done)
    else
        f=$(modfile "$n")
        deps=$(modinfo -F depends "$f" | tr ',' ' ')
    fi
    for d in $deps; do add_module "$d"; done
    [[ " ${ORDER[*]} " == *" $f "* ]] || ORDER+=("$f")
}
for spec in VIRTIO_NET:virtio_net VIRTIO_PCI:virtio_pci; do
    grep -q "^CONFIG_${spec%%:*}=y" "$KCFG" 2>/dev/null || add_module "${spec##*:}"
done

# ---------------------------------------------------------------- stamp
STAMP=$(
    {
        sha256sum "$0" "$HERE/init" "$KIMG" "$BUSYBOX" "${BINS[@]}" "${ORDER[@]}"
        echo "$KVER"
    } | sha256sum | cut -c1-32
)
if [[ $FORCE == 0 && -f $OUT/.stamp && $(<"$OUT/.stamp") == "$STAMP" && -f $OUT/guest.env && -f $OUT/initramfs.cpio.gz ]]; then
    vmq_log "up to date: $OUT (kernel $KVER)"
    exit 0
fi

# ---------------------------------------------------------------- build
mkdir -p "$OUT"
WORK=$(mktemp -d "$OUT/.build.XXXXXX")
trap 'rm -rf -- "$WORK"' EXIT
ROOT=$WORK/root
mkdir -p "$ROOT"/{bin,sbin,usr/bin,usr/sbin,lib/modules,proc,sys,dev,tmp,run,etc,root}
install -m 0755 "$BUSYBOX" "$ROOT/bin/busybox"
install -m 0755 "$HERE/init" "$ROOT/init"

: >"$ROOT/lib/modules/load-order"
for f in "${ORDER[@]}"; do
    base=${f##*/}
    case $base in # busybox insmod wants plain .ko
        *.ko.xz) xz -dc "$f" >"$ROOT/lib/modules/${base%.xz}"; base=${base%.xz} ;;
        *.ko.zst) zstd -qdc "$f" >"$ROOT/lib/modules/${base%.zst}"; base=${base%.zst} ;;
        *.ko.gz) gzip -dc "$f" >"$ROOT/lib/modules/${base%.gz}"; base=${base%.gz} ;;
        *) cp "$f" "$ROOT/lib/modules/$base" ;;
    esac
    echo "$base" >>"$ROOT/lib/modules/load-order"
done

for b in "${BINS[@]}"; do # binaries + every library ldd names, at the same paths
    install -m 0755 "$b" "$ROOT/usr/bin/${b##*/}"
    while read -r lib; do
        [[ -e $ROOT$lib ]] || install -D -m 0755 "$(readlink -f "$lib")" "$ROOT$lib"
    done < <(ldd "$b" | grep -oE '/[^ ]+\.so[^ ]*')
done
[[ -e $ROOT/lib64/ld-linux-x86-64.so.2 ]] || install -D -m 0755 "$(readlink -f /lib64/ld-linux-x86-64.so.2)" "$ROOT/lib64/ld-linux-x86-64.so.2"

echo 'root:x:0:0:root:/root:/bin/sh' >"$ROOT/etc/passwd"
echo 'root:x:0:' >"$ROOT/etc/group"
echo '127.0.0.1 localhost' >"$ROOT/etc/hosts"

# reproducible archive: fixed mtimes, sorted names, uid/gid 0
find "$ROOT" -exec touch -h -d @0 {} +
(cd "$ROOT" && find . -mindepth 1 | LC_ALL=C sort | cpio --quiet -o -H newc -R 0:0 --reproducible) |
    gzip -n -6 >"$WORK/initramfs.cpio.gz"

cp "$KIMG" "$WORK/vmlinuz"
# bzImage = setup + compressed ELF: find the compressed stream that inflates
# to an ELF (xz on Debian; gzip and zstd handled too when python has them)
if "$VMQ_PY" - "$KIMG" "$WORK/vmlinux" <<'PY'; then HAVE_VMLINUX=1; else HAVE_VMLINUX=0; fi
import gzip, lzma, sys, zlib
data = open(sys.argv[1], "rb").read()
def xz(off): return lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(data[off:])
def gz(off): return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(data[off:])
for magic, fn in ((b"\xfd7zXZ\x00", xz), (b"\x1f\x8b\x08", gz)):
    off = data.find(magic)
    while off != -1:
        try:
            elf = fn(off)
            if elf[:4] == b"\x7fELF":
                open(sys.argv[2], "wb").write(elf)
                sys.exit(0)
        except Exception:
            pass
        off = data.find(magic, off + 1)
sys.exit("no ELF payload found in " + sys.argv[1])
PY
((HAVE_VMLINUX)) || vmq_log "warning: could not extract vmlinux; guests will boot the bzImage (slower)"

{
    echo "GUEST_KVER=$KVER"
    echo "GUEST_INITRD=$OUT/initramfs.cpio.gz"
    echo "GUEST_BZIMAGE=$OUT/vmlinuz"
    if ((HAVE_VMLINUX)); then echo "GUEST_VMLINUX=$OUT/vmlinux"; else echo "GUEST_VMLINUX="; fi
} >"$WORK/guest.env"
rm -f "$OUT/.stamp" # invalid while files are being replaced
for f in initramfs.cpio.gz vmlinuz vmlinux guest.env; do
    if [[ -f $WORK/$f ]]; then mv -f "$WORK/$f" "$OUT/$f"; else rm -f "$OUT/$f"; fi
done
echo "$STAMP" >"$OUT/.stamp"
vmq_log "built $OUT in $(vmq_elapsed "$T0") s: kernel $KVER, initramfs $(du -h "$OUT/initramfs.cpio.gz" | cut -f1)," \
    "modules $(tr '\n' ' ' <"$ROOT/lib/modules/load-order")"
