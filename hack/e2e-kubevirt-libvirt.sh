#!/usr/bin/env bash
# End-to-end test of the KubeVirt binding sidecar without KubeVirt: the
# domain the sidecar produces is defined and started for real by libvirtd
# (qemu:///system, Debian's libvirt 9.0 + QEMU 7.2, TCG), its guest gets 4
# queue pairs on the vhostmq dataplane and pings a peer through it.
#
#   1. the dataplane (bin built from this tree) with two ports: "fast",
#      role client (QEMU is the vhost-user server, KubeVirt's default mode;
#      the dataplane dials QEMU's socket), 4 queue pairs; and "peer", role
#      server, 4 queue pairs, where a plain QEMU guest (1 vCPU, as in
#      e2e-qemu.sh) dials in and serves ping and iperf3 at 10.0.0.2
#   2. the sidecar vhostmq-kubevirt-binding with --hooks-dir and
#      --network-info, a network-info file as KubeVirt's downward API
#      writes it (vhost-user device-info: mode server, the socket path)
#   3. OnDefineDomain over the sidecar's gRPC socket (hack/kubevirt/hookcall),
#      twice, as virt-launcher does (nichotplug.go WithNetworkIfacesResources):
#        pass 1: KubeVirt v1.7.0's real domain XML with its 4 placeholder
#                NICs (cni/kubevirt/binding/testdata/domain-kubevirt-v1.7.0.xml)
#                -> virsh define -> dumpxml --inactive
#        pass 2: that domain's devices from libvirt, the placeholder NICs
#                dropped (KubeVirt puts back its own interface list: none for
#                a VMI whose only NIC is bound to vhostmq) -> OnDefineDomain
#                again; a third call on its output must change nothing
#      The VMI is hack/kubevirt/testdata/vmi.json: 4 vCPUs,
#      networkInterfaceMultiqueue, interface "fast" bound to "vhostmq".
#      Adapted in KubeVirt's XML, because they must be to boot here: the
#      kernel/initrd paths (a copy of the test guest, hack/guest/build.sh),
#      the kernel command line (the guest's vmq.* keys), the kubevirt-private
#      serial and VNC socket directory (-> the work dir), a unique domain
#      name and UUID per run (VMI uid and sysinfo uuid). Nothing else.
#   4. virt-xml-validate on the sidecar's input and output (as the sidecar's
#      Go test does: KubeVirt's XML does not validate because of its empty
#      <sysinfo> children; the output must fail in exactly the same way, and
#      validate with <sysinfo> removed). Then the ONLY test-bed additions to
#      the sidecar's output: <qemu:override> vectors=0 on alias ua-fast
#      (QEMU 7.2 under TCG crashes with MSI-X on vhost-user; not needed with
#      newer QEMU), and <emulator> hack/kubevirt/qemu-tcg-shim, which runs
#      the 4-vCPU guest's TCG on one thread (QEMU 10.0's multi-threaded TCG
#      can abort it at boot, iotlb_to_section; as KubeVirt's launcher image
#      in the test bed does). virsh define + start.
#   5. checks: QEMU's command line has the vhost-user netdev with queues=4;
#      the dataplane port is connected with 4 queue pairs enabled
#      (vhostmqctl port show / queues); the guest sees 4 rx + 4 tx queues,
#      pings the peer, runs iperf3 both ways; per-queue dataplane counters
#   6. destroy + undefine; the dataplane sees QEMU go away; the sidecar and
#      the dataplane exit 0 on SIGTERM; everything stopped and removed.
#
# Usage: hack/e2e-kubevirt-libvirt.sh [--keep DIR] [--no-override]
#   --keep DIR     work dir (logs, XML of every step, configs); kept. Default:
#                  a new /var/tmp/vhostmq-e2e-kvlv.XXXXXX, removed at exit
#                  (/var/tmp, not /tmp: QEMU runs as libvirt-qemu and must
#                  reach the kernel, the sockets and the serial log)
#   --no-override  start the sidecar's output exactly as returned (QEMU
#                  versions without the MSI-X bug; QEMU 7.2 + TCG crashes)
# Logs each check (hack/lib.sh's vmq_ok / vmq_fail), prints timings (define
# -> guest ping), the failures and "N passed, N failed"; exits non-zero if
# anything failed.
#
# Needs root and Go. Installs with apt-get what is missing: libvirt-daemon-system
# libvirt-clients libxml2-utils qemu-system-x86 (and jq, python3, the guest
# image tools); the guest kernel comes from hack/install-deps.sh.
# libvirtd and virtlogd are started (foreground, under timeout) only if none
# is running, and then stopped by PID; that libvirtd runs in a mount namespace
# of its own where /dev/kvm is hidden (libvirt's capabilities cache is
# otherwise outdated at every lookup on machines whose /dev/kvm group is not
# kvm: a QEMU probe per virsh call); what that libvirtd leaves (its empty
# /sys/fs/cgroup/*/machine cgroups, /run/libvirt) is removed if it was not
# there before. The domain is destroyed and undefined, its libvirt log
# (/var/log/libvirt/qemu/NAME.log) moved into the work dir. Every other
# process is started and stopped by PID (hack/lib.sh), bounded by a timeout.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$HERE/lib.sh"
VMQ_TAG=e2e-kubevirt-libvirt

WORK="" KEEP=0 OVERRIDE=1
vmq_args --keep=WORK --no-override:OVERRIDE=0 -- "$@"
[[ -z $WORK ]] || KEEP=1
vmq_need_root

QUEUES=4
BUDGET=600                      # bound on every background process (s)
KV_DOMAIN=$VMQ_REPO_ROOT/cni/kubevirt/binding/testdata/domain-kubevirt-v1.7.0.xml
KV_VMI=$HERE/kubevirt/testdata/vmi.json
MAC_FAST=02:76:6d:71:00:01
MAC_PEER=02:76:6d:71:00:02
NAME=default_vhuvmi-$$          # KubeVirt names domains <namespace>_<vmi>
UUID=$(cat /proc/sys/kernel/random/uuid)
export LIBVIRT_DEFAULT_URI=qemu:///system

# abort WHAT: a failure that ends the run (the EXIT trap tears down and reports)
abort() { vmq_fail "$*"; exit 1; }

# ------------------------------------------------------------------ teardown
DEFINED=0 QEMU_PID="" LIBVIRTD_PID="" VIRTLOGD_PID="" LV_BEFORE=""
SIDECAR_PID="" DP_PID=""
qlog() { echo "/var/log/libvirt/qemu/$NAME.log"; }
domain_gone() { ! timeout 30 virsh -q dominfo "$NAME" >/dev/null 2>&1; }
teardown_domain() {
    ((DEFINED)) || return 0
    timeout 60 virsh -q destroy "$NAME" >/dev/null 2>&1 || true
    timeout 60 virsh -q undefine "$NAME" >/dev/null 2>&1 || true
    if [[ -n $QEMU_PID ]] && vmq_alive "$QEMU_PID" && [[ $(cat "/proc/$QEMU_PID/comm" 2>/dev/null) == qemu-system-x86 ]]; then
        vmq_log "QEMU pid $QEMU_PID outlived virsh destroy; SIGKILL"
        kill -KILL "$QEMU_PID" 2>/dev/null || true
    fi
    if [[ -f $(qlog) ]]; then
        [[ -d $WORK ]] && cp "$(qlog)" "$WORK/libvirt-qemu.log" 2>/dev/null
        rm -f "$(qlog)"
    fi
    DEFINED=0
}
# host_pgrep NAME: PIDs of NAME in this mount namespace (a libvirtd inside a
# container, e.g. a KubeVirt virt-launcher pod, is not the host's)
host_pgrep() {
    local pid self
    self=$(readlink /proc/self/ns/mnt)
    for pid in $(pgrep -x "$1"); do
        [[ $(readlink "/proc/$pid/ns/mnt" 2>/dev/null) == "$self" ]] && echo "$pid"
    done
    return 0
}
# drop_shim_caps: libvirt keeps a capabilities file (about 100-270 kB) for
# every emulator path it probed, and the shim's path is new in every run:
# drop those of this script's work dirs that are gone
drop_shim_caps() {
    local f emu
    for f in /var/cache/libvirt/qemu/capabilities/*.xml; do
        [[ -f $f ]] || continue
        emu=$(sed -n 's|.*<emulator>\(.*\)</emulator>.*|\1|p' "$f" | head -n 1)
        [[ $emu == /var/tmp/vhostmq-e2e-kvlv.*/bin/* && ! -e $emu ]] && rm -f "$f"
    done
    return 0
}
on_exit() {
    local rc=$?
    set +e
    teardown_domain
    vmq_cleanup # every PID we started, newest first; then the work dir
    # what our libvirtd left: its "machine" cgroups (no systemd here) and
    # /run/libvirt, if they were not there before and no libvirtd runs now
    if [[ -n $LIBVIRTD_PID && -z $(host_pgrep libvirtd) && -z $(host_pgrep virtlogd) ]]; then
        local d
        for d in /sys/fs/cgroup/machine /sys/fs/cgroup/*/machine /run/libvirt; do
            [[ -d $d && $'\n'$LV_BEFORE$'\n' != *$'\n'$d$'\n'* ]] || continue
            if [[ $d == /run/libvirt ]]; then rm -rf /run/libvirt; else rmdir "$d" 2>/dev/null; fi
        done
    fi
    drop_shim_caps
    if ((!VMQ_REPORTED)); then
        ((rc == 0 || ${#VMQ_FAILS[@]} > 0)) || vmq_fail "aborted (exit status $rc; see the log above)"
        vmq_fails_report
    fi
    ((KEEP)) && echo "work dir: $WORK"
    ((rc == 0 && ${#VMQ_FAILS[@]} > 0)) && rc=1
    exit "$rc"
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

T_START=$(vmq_now)
if [[ -z $WORK ]]; then
    WORK=$(mktemp -d /var/tmp/vhostmq-e2e-kvlv.XXXXXX)
    vmq_track_path "$WORK"
else
    mkdir -p "$WORK"
    WORK=$(cd "$WORK" && pwd)
fi
# QEMU runs as libvirt-qemu: it must traverse WORK and create its sockets
# (vhost-user server, serial, VNC) in RUN
RUN=$WORK/run
mkdir -p "$RUN" "$WORK/bin" "$WORK/guest" "$WORK/hooks" "$WORK/peer" "$WORK/xml"
chmod 0755 "$WORK" "$WORK/guest"
chmod 0777 "$RUN"
SOCK=$RUN/fast.sock
((${#SOCK} < 100)) || vmq_die "socket path too long for AF_UNIX: $SOCK"

# ------------------------------------------------------------------ dependencies
installed() { [[ $(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null) == installed ]]; }
MISSING=()
for p in libvirt-daemon-system libvirt-clients libxml2-utils qemu-system-x86 jq python3 busybox-static iperf3 ethtool cpio; do
    installed "$p" || MISSING+=("$p")
done
if ((${#MISSING[@]})); then
    vmq_log "apt-get install ${MISSING[*]}"
    export DEBIAN_FRONTEND=noninteractive
    if ! timeout 900 apt-get install -y -q --no-install-recommends "${MISSING[@]}" >"$WORK/apt.log" 2>&1; then
        timeout 600 apt-get update -q >>"$WORK/apt.log" 2>&1 || true
        timeout 900 apt-get install -y -q --no-install-recommends "${MISSING[@]}" >>"$WORK/apt.log" 2>&1 ||
            { tail -n 20 "$WORK/apt.log" >&2; vmq_die "apt-get install ${MISSING[*]} failed"; }
    fi
fi
for c in libvirtd virtlogd virsh virt-xml-validate xmllint qemu-system-x86_64 jq go; do
    command -v "$c" >/dev/null || vmq_die "$c not found"
done
if [[ ! -f $VMQ_KERNEL_DIR/KERNEL_VERSION ]] && ! compgen -G '/boot/vmlinuz-*' >/dev/null; then
    vmq_log "no guest kernel in $VMQ_KERNEL_DIR: running hack/install-deps.sh"
    "$HERE/install-deps.sh" >&2 || vmq_die "hack/install-deps.sh failed"
fi
T_DEPS=$(vmq_now)

# ------------------------------------------------------------------ binaries and guest
vmq_log "building the dataplane, vhostmqctl, the sidecar and hookcall into $WORK/bin"
(cd "$VMQ_REPO_ROOT" && CGO_ENABLED=0 timeout 900 go build -trimpath -o "$WORK/bin/" ./cmd/vhostmq-dataplane \
    ./cmd/vhostmqctl ./cmd/vhostmq-kubevirt-binding ./hack/kubevirt/hookcall) >"$WORK/build.log" 2>&1 ||
    { cat "$WORK/build.log" >&2; abort "go build of the dataplane, vhostmqctl, the sidecar and hookcall"; }
BIN=$WORK/bin
vmq_build_guest
vmq_guest_env
# the domain boots a copy: libvirt relabels (chowns) kernel and initrd while it runs
cp "$GUEST_KERNEL" "$WORK/guest/kernel"
cp "$GUEST_INITRD" "$WORK/guest/initramfs.cpio.gz"
chmod 0644 "$WORK/guest/kernel" "$WORK/guest/initramfs.cpio.gz"
T_BUILD=$(vmq_now)

# ------------------------------------------------------------------ libvirtd + virtlogd
LV_BEFORE=$(compgen -G '/sys/fs/cgroup/machine' || true; compgen -G '/sys/fs/cgroup/*/machine' || true; compgen -G /run/libvirt || true)
if timeout 20 virsh -q version >/dev/null 2>&1; then
    vmq_log "using the libvirtd that is running"
elif [[ -n $(host_pgrep libvirtd) ]]; then
    abort "a libvirtd is running but $LIBVIRT_DEFAULT_URI does not answer"
else
    mkdir -p /run/libvirt
    if [[ -z $(host_pgrep virtlogd) ]]; then
        vmq_bg "$WORK/virtlogd.log" "$BUDGET" virtlogd
        VIRTLOGD_PID=$VMQ_BG_PID
    fi
    if [[ -e /dev/kvm ]]; then
        # libvirtd in a mount namespace of its own where /dev/kvm is an
        # empty root-only file: the domain runs TCG (type qemu) all the
        # same, and libvirt's capabilities cache stays valid. With the real
        # device, libvirt probes KVM as QEMU sees it (usable) but checks
        # the cache against /dev/kvm's access for libvirt-qemu (here no: a
        # group that is not kvm), finds every cache entry outdated and
        # probes QEMU again at every lookup: about 12 s a binary idle, over
        # 60 s for one virsh define while the peer guest boots (a CI run).
        # Its qemu.conf gets KubeVirt's virt-launcher setting namespaces = [ ]
        # (no private /dev per domain, which would try to move our mount).
        install -m 0600 /dev/null "$WORK/no-kvm"
        { cat /etc/libvirt/qemu.conf; echo 'namespaces = [ ]'; } >"$WORK/qemu.conf"
        # shellcheck disable=SC2016  # the inner script expands its own arguments
        vmq_bg "$WORK/libvirtd.log" "$BUDGET" unshare --mount --propagation private -- \
            bash -c 'mount --bind "$1" /dev/kvm && mount --bind "$2" /etc/libvirt/qemu.conf && exec libvirtd' \
            libvirtd "$WORK/no-kvm" "$WORK/qemu.conf"
    else
        vmq_bg "$WORK/libvirtd.log" "$BUDGET" libvirtd
    fi
    LIBVIRTD_PID=$VMQ_BG_PID
    for ((i = 0; i < 600; i++)); do
        timeout 10 virsh -q version >/dev/null 2>&1 && break
        vmq_alive "$LIBVIRTD_PID" || break
        sleep 0.1
    done
    timeout 10 virsh -q version >/dev/null 2>&1 ||
        { tail -n 20 "$WORK/libvirtd.log" >&2; abort "libvirtd did not come up (log $WORK/libvirtd.log)"; }
    vmq_log "started libvirtd (pid $LIBVIRTD_PID)${VIRTLOGD_PID:+ and virtlogd (pid $VIRTLOGD_PID)}$([[ -e /dev/kvm ]] && echo ", /dev/kvm hidden from it")"
fi
LV_VERSION=$(timeout 20 virsh version 2>/dev/null | awk '/Using library/ { l = $NF } /Running hypervisor/ { h = $NF } END { print "libvirt " l ", QEMU " h }')
T_LIBVIRT=$(vmq_now)

# ------------------------------------------------------------------ dataplane + peer guest
# socketRoot is RUN, where QEMU (running as libvirt-qemu) creates its
# server socket; the peer's socket has a directory of its own (its QEMU
# runs as root).
cat >"$WORK/dataplane.yaml" <<EOF
cpus: [$(vmq_default_cpus)]
statsFile: $WORK/stats.json
apiSocket: $WORK/api.sock
stateDir: $WORK/state
socketRoot: $RUN
logLevel: info
ports:
  - name: fast
    socket: $SOCK
    role: client
    queuePairs: $QUEUES
    mtu: 1500
    mac: "$MAC_FAST"
  - name: peer
    socket: $WORK/peer/peer.sock
    role: server
    queuePairs: $QUEUES
    mtu: 1500
    mac: "$MAC_PEER"
EOF
vmq_bg "$WORK/dataplane.log" "$BUDGET" "$BIN/vhostmq-dataplane" --config "$WORK/dataplane.yaml"
DP_PID=$VMQ_BG_PID
if ! vmq_wait_path "$WORK/peer/peer.sock" 30 "$DP_PID" || ! vmq_wait_path "$WORK/api.sock" 30 "$DP_PID"; then
    tail -n 20 "$WORK/dataplane.log" >&2
    abort "the dataplane did not start (log $WORK/dataplane.log)"
fi
VMQ_CTL=$BIN/vhostmqctl VMQ_API=$WORK/api.sock

vmq_guest_start peer "$WORK/peer/peer.sock" connect "$MAC_PEER" "$QUEUES" "$BUDGET" "$WORK" \
    vmq.ip=10.0.0.2/24 vmq.role=server "vmq.duration=$((BUDGET - 30))"

# ------------------------------------------------------------------ sidecar
printf '{"interfaces":[{"network":"fast","deviceInfo":{"type":"vhost-user","version":"1.1.0","vhost-user":{"mode":"server","path":"%s"}},"mac":"%s","mtu":1500}]}\n' \
    "$SOCK" "$MAC_FAST" >"$WORK/network-info"
HOOK_SOCK=$WORK/hooks/vhostmq-binding.sock
vmq_bg "$WORK/sidecar.log" "$BUDGET" env NETWORK_BINDING_PLUGIN_NAME=vhostmq "$BIN/vhostmq-kubevirt-binding" \
    --hooks-dir "$WORK/hooks" --network-info "$WORK/network-info"
SIDECAR_PID=$VMQ_BG_PID
vmq_wait_path "$HOOK_SOCK" 30 "$SIDECAR_PID" ||
    { cat "$WORK/sidecar.log" >&2; abort "the sidecar did not create $HOOK_SOCK"; }

# ------------------------------------------------------------------ XML helpers
# xmltool.py CMD ...: edits of KubeVirt's XML that are not the sidecar's
cat >"$WORK/xmltool.py" <<'PY'
import re, sys
import xml.etree.ElementTree as ET

def rd(p): return open(p).read()
def wr(p, s): open(p, "w").write(s)

def sub1(s, pat, repl, what, flags=0):
    out, n = re.subn(pat, lambda m: repl, s, flags=flags)
    if n == 0:
        sys.exit("adapt: %s not found" % what)
    return out

cmd = sys.argv[1]
if cmd == "adapt":   # IN OUT NAME UUID KERNEL INITRD CMDLINE PRIVATE_DIR
    _, _, src, dst, name, uuid, kernel, initrd, cmdline, private = sys.argv
    s = rd(src)
    s = sub1(s, r"<name>[^<]*</name>", "<name>%s</name>" % name, "<name>")
    s = sub1(s, r'<entry name="uuid">[^<]*</entry>', '<entry name="uuid">%s</entry>' % uuid, "sysinfo uuid")
    s = sub1(s, r"<kernel>[^<]*</kernel>", "<kernel>%s</kernel>" % kernel, "<kernel>")
    s = sub1(s, r"<initrd>[^<]*</initrd>", "<initrd>%s</initrd>" % initrd, "<initrd>")
    s = sub1(s, r"<cmdline>[^<]*</cmdline>", "<cmdline>%s</cmdline>" % cmdline, "<cmdline>")
    s = sub1(s, r"/var/run/kubevirt-private/[^/\"']+/", private.rstrip("/") + "/", "kubevirt-private paths")
    wr(dst, s)
elif cmd == "pass2":  # KUBEVIRT_IN LIBVIRT_INACTIVE OUT: virt-launcher's second define
    _, _, kv, lv, dst = sys.argv
    dev = ET.parse(lv).getroot().find("devices")
    for i in dev.findall("interface"):  # KubeVirt's own interface list: none here
        dev.remove(i)
    new = ET.tostring(dev, encoding="unicode").strip()
    wr(dst, sub1(rd(kv), r"<devices>.*</devices>", new, "<devices>", re.S))
elif cmd == "override":  # IN OUT ALIAS EMULATOR: QEMU + TCG test-bed only
    _, _, src, dst, alias, emulator = sys.argv
    s = rd(src)
    head = s.split(">", 1)[0]
    if "xmlns:qemu=" not in head:
        s = sub1(s, r"<domain\b", '<domain xmlns:qemu="http://libvirt.org/schemas/domain/qemu/1.0"', "<domain")
    ov = ('  <qemu:override>\n    <qemu:device alias="%s">\n      <qemu:frontend>\n'
          '        <qemu:property name="vectors" type="unsigned" value="0"/>\n'
          '      </qemu:frontend>\n    </qemu:device>\n  </qemu:override>\n') % alias
    i = s.rindex("</domain>")
    s = s[:i] + ov + s[i:]
    # QEMU 10.0 + multi-threaded TCG + several vCPUs: iotlb_to_section abort
    # (pass 2's devices come from libvirt's inactive XML, which names one)
    if "<emulator>" in s:
        s = sub1(s, r"<emulator>[^<]*</emulator>", "<emulator>%s</emulator>" % emulator, "<emulator>")
    else:
        s = sub1(s, r"<devices>", "<devices>\n    <emulator>%s</emulator>" % emulator, "<devices>")
    wr(dst, s)
elif cmd == "nosysinfo":  # IN OUT: without KubeVirt's <sysinfo> (empty children the schema refuses)
    _, _, src, dst = sys.argv
    wr(dst, sub1(rd(src), r"\s*<sysinfo\b.*?</sysinfo>", "", "<sysinfo>", re.S))
else:
    sys.exit("unknown command " + cmd)
PY
xt() { "$VMQ_PY" "$WORK/xmltool.py" "$@"; }
xp() { xmllint --xpath "$1" "$2" 2>/dev/null || true; } # xp XPATH FILE
# validate FILE: "validates" or the errors, file name and line numbers removed
validate() {
    local out
    if out=$(timeout 60 virt-xml-validate "$1" domain 2>&1); then echo validates; return; fi
    sed -e "s|$1|DOMAIN|g" -e 's/DOMAIN:[0-9]*:/DOMAIN:/g' <<<"$out"
}
# hookcall N IN OUT: OnDefineDomain over the sidecar's socket
hookcall() {
    "$BIN/hookcall" --socket "$HOOK_SOCK" --domain "$2" --vmi "$WORK/vmi.json" >"$3" 2>"$WORK/xml/hookcall-$1.log"
}
# hookpass N WHAT: pass N of virt-launcher's OnDefineDomain, xml/passN-in.xml
# -> xml/passN-out.xml, timed (T_HOOK[N]: its seconds); a failed call ends the run
declare -A T_HOOK=()
hookpass() {
    local t0
    t0=$(vmq_now)
    hookcall "$1" "$WORK/xml/pass$1-in.xml" "$WORK/xml/pass$1-out.xml" ||
        abort "OnDefineDomain pass $1 ($2): $(grep -v '^hookcall: Info:' "$WORK/xml/hookcall-$1.log" | tr '\n' ' ')"
    T_HOOK[$1]=$(vmq_elapsed "$t0")
}
# check_nic OUT: the vhost-user NIC the sidecar must have produced
check_nic() {
    local f=$1 iface='//devices/interface[@type="vhostuser"]' bad=()
    [[ $(xp "count($iface)" "$f") == 1 ]] || bad+=("vhostuser interfaces=$(xp "count($iface)" "$f")")
    [[ $(xp "string($iface/source/@type)" "$f") == unix ]] || bad+=("source type")
    [[ $(xp "string($iface/source/@path)" "$f") == "$SOCK" ]] || bad+=("source path=$(xp "string($iface/source/@path)" "$f")")
    [[ $(xp "string($iface/source/@mode)" "$f") == server ]] || bad+=("source mode=$(xp "string($iface/source/@mode)" "$f")")
    [[ $(xp "string($iface/driver/@queues)" "$f") == "$QUEUES" ]] || bad+=("queues=$(xp "string($iface/driver/@queues)" "$f")")
    [[ $(xp "string($iface/driver/@rx_queue_size)" "$f")/$(xp "string($iface/driver/@tx_queue_size)" "$f") == 1024/1024 ]] || bad+=("queue sizes")
    [[ $(xp "string($iface/model/@type)" "$f") == virtio-non-transitional ]] || bad+=("model=$(xp "string($iface/model/@type)" "$f")")
    [[ $(xp "string($iface/alias/@name)" "$f") == ua-fast ]] || bad+=("alias=$(xp "string($iface/alias/@name)" "$f")")
    [[ $(xp "string($iface/mac/@address)" "$f") == "$MAC_FAST" ]] || bad+=("mac=$(xp "string($iface/mac/@address)" "$f")")
    [[ $(xp 'string(//memoryBacking/source/@type)' "$f")/$(xp 'string(//memoryBacking/access/@mode)' "$f") == memfd/shared ]] || bad+=("memoryBacking")
    NIC_BAD=${bad[*]}
    [[ -z $NIC_BAD ]]
}
# compare_validation STEP IN OUT: the sidecar must not change the schema result
compare_validation() {
    local vin vout first
    vin=$(validate "$2") vout=$(validate "$3")
    printf '%s\n' "$vin" >"$WORK/xml/validate-$1-in.txt"
    printf '%s\n' "$vout" >"$WORK/xml/validate-$1-out.txt"
    first=$(grep -m1 -o 'Extra element [a-zA-Z]* in interleave' <<<"$vin" || echo "${vin%%$'\n'*}")
    if [[ $vin == "$vout" ]]; then
        if [[ $vin == validates ]]; then
            vmq_ok "virt-xml-validate $1: the sidecar's input and output both validate"
        else
            vmq_ok "virt-xml-validate $1: input fails ($(grep -c 'validity error' <<<"$vin") errors: $first, KubeVirt's empty <sysinfo> children); the sidecar's output fails with exactly the same errors"
        fi
    elif [[ $vout == validates ]]; then
        vmq_ok "virt-xml-validate $1: input fails ($first), the sidecar's output validates"
    else
        vmq_fail "virt-xml-validate $1: the sidecar changed the result: input: $(tr '\n' ' ' <<<"$vin"); output: $(tr '\n' ' ' <<<"$vout")"
    fi
    xt nosysinfo "$3" "$3.nosysinfo"
    vout=$(validate "$3.nosysinfo")
    if [[ $vout == validates ]]; then
        vmq_ok "virt-xml-validate $1: the sidecar's output with <sysinfo> removed validates"
    else
        vmq_fail "virt-xml-validate $1: the sidecar's output with <sysinfo> removed does not validate: $(tr '\n' ' ' <<<"$vout")"
    fi
}

# ------------------------------------------------------------------ inputs
jq --arg uid "$UUID" --arg name "${NAME#default_}" '.metadata.uid = $uid | .metadata.name = $name' "$KV_VMI" >"$WORK/vmi.json"
CMDLINE="console=ttyS0 panic=-1 loglevel=4 vmq.name=kubevirt vmq.ip=10.0.0.1/24 vmq.peer=10.0.0.2 vmq.queues=$QUEUES"
CMDLINE+=" vmq.role=client,idle vmq.pings=5 vmq.streams=16 vmq.time=3 vmq.duration=$((BUDGET - 30))"
xt adapt "$KV_DOMAIN" "$WORK/xml/pass1-in.xml" "$NAME" "$UUID" "$WORK/guest/kernel" "$WORK/guest/initramfs.cpio.gz" "$CMDLINE" "$RUN" ||
    abort "adapting $KV_DOMAIN"

# ------------------------------------------------------------------ pass 1: placeholder domain
hookpass 1 "KubeVirt's domain with placeholder NICs"
nph=$(xp 'count(//devices/interface[starts-with(target/@dev,"placeholder-")])' "$WORK/xml/pass1-out.xml")
if check_nic "$WORK/xml/pass1-out.xml" && [[ $nph == 4 ]]; then
    vmq_ok "OnDefineDomain pass 1 over $(basename "$HOOK_SOCK") (${T_HOOK[1]} s): vhost-user NIC ua-fast, QEMU socket server $SOCK, queues=$QUEUES, rx/tx 1024, mac $MAC_FAST, memfd shared memory; KubeVirt's 4 placeholder NICs kept"
else
    vmq_fail "OnDefineDomain pass 1: ${NIC_BAD:-} placeholders=$nph (output $WORK/xml/pass1-out.xml)"
fi
compare_validation pass1 "$WORK/xml/pass1-in.xml" "$WORK/xml/pass1-out.xml"

if timeout 60 virsh -q define "$WORK/xml/pass1-out.xml" >"$WORK/xml/define-1.log" 2>&1; then
    DEFINED=1
    vmq_ok "virsh define of pass 1's domain (as virt-launcher's first define, to reserve PCI controllers)"
else
    abort "virsh define of pass 1's domain: $(tr '\n' ' ' <"$WORK/xml/define-1.log")"
fi
timeout 60 virsh dumpxml --inactive "$NAME" >"$WORK/xml/pass1-defined.xml" || abort "virsh dumpxml --inactive $NAME"

# ------------------------------------------------------------------ pass 2: the domain virt-launcher starts
xt pass2 "$WORK/xml/pass1-in.xml" "$WORK/xml/pass1-defined.xml" "$WORK/xml/pass2-in.xml" || abort "building pass 2's input"
hookpass 2 "devices from libvirt, placeholders dropped"
nif=$(xp 'count(//devices/interface)' "$WORK/xml/pass2-out.xml")
if check_nic "$WORK/xml/pass2-out.xml" && [[ $nif == 1 ]]; then
    vmq_ok "OnDefineDomain pass 2 (${T_HOOK[2]} s): the vhost-user NIC is back (virt-launcher dropped it with the placeholders), the only interface"
else
    vmq_fail "OnDefineDomain pass 2: ${NIC_BAD:-} interfaces=$nif (output $WORK/xml/pass2-out.xml)"
fi
compare_validation pass2 "$WORK/xml/pass2-in.xml" "$WORK/xml/pass2-out.xml"
if hookcall 3 "$WORK/xml/pass2-out.xml" "$WORK/xml/pass3-out.xml" && cmp -s "$WORK/xml/pass2-out.xml" "$WORK/xml/pass3-out.xml"; then
    vmq_ok "OnDefineDomain on its own output changes nothing (idempotent)"
else
    vmq_fail "OnDefineDomain on its own output: $(diff "$WORK/xml/pass2-out.xml" "$WORK/xml/pass3-out.xml" | head -n 5 | tr '\n' ' ') $(tr '\n' ' ' <"$WORK/xml/hookcall-3.log")"
fi

# ------------------------------------------------------------------ the test-bed override, define, start
if ((OVERRIDE)); then
    # the emulator: the shim beside a link to the real QEMU (it runs "$0.bin")
    install -m 0755 "$HERE/kubevirt/qemu-tcg-shim" "$WORK/bin/qemu-system-x86_64"
    ln -sfn "$(command -v qemu-system-x86_64)" "$WORK/bin/qemu-system-x86_64.bin"
    xt override "$WORK/xml/pass2-out.xml" "$WORK/xml/domain.xml" ua-fast "$WORK/bin/qemu-system-x86_64" || abort "adding <qemu:override>"
    echo "note: test bed only: <qemu:override> vectors=0 on alias ua-fast (QEMU 7.2 under TCG crashes with MSI-X on vhost-user) and <emulator> $WORK/bin/qemu-system-x86_64 (hack/kubevirt/qemu-tcg-shim: the 4-vCPU guest's TCG on one thread, QEMU 10.0's iotlb_to_section abort) added to the sidecar's output; nothing else changed"
    xt nosysinfo "$WORK/xml/domain.xml" "$WORK/xml/domain.xml.nosysinfo"
    if [[ $(validate "$WORK/xml/domain.xml.nosysinfo") == validates ]]; then
        vmq_ok "the test-bed <qemu:override> (vectors=0 on ua-fast) is schema-valid (domain with <sysinfo> removed validates)"
    else
        vmq_fail "the domain with <qemu:override> does not validate: $(validate "$WORK/xml/domain.xml.nosysinfo" | tr '\n' ' ')"
    fi
else
    cp "$WORK/xml/pass2-out.xml" "$WORK/xml/domain.xml"
    echo "note: --no-override: the sidecar's output is defined exactly as returned"
fi

T_DEFINE=$(vmq_now)
timeout 60 virsh -q define "$WORK/xml/domain.xml" >"$WORK/xml/define-2.log" 2>&1 ||
    abort "virsh define of the sidecar's domain: $(tr '\n' ' ' <"$WORK/xml/define-2.log")"
# QEMU waits (server=on) for the dataplane to connect before the guest runs
if ! timeout 120 virsh -q start "$NAME" >"$WORK/xml/start.log" 2>&1; then
    tail -n 5 "$(qlog)" >&2 2>/dev/null || true
    abort "virsh start $NAME ($LV_VERSION, TCG): $(tr '\n' ' ' <"$WORK/xml/start.log")"
fi
T_STARTED=$(vmq_now)
QEMU_PID=$(cat "/run/libvirt/qemu/$NAME.pid" 2>/dev/null || true)
timeout 60 virsh dumpxml "$NAME" >"$WORK/xml/live.xml" 2>/dev/null || true
vmq_ok "virsh define + start $NAME ($LV_VERSION, domain type qemu/TCG): running in $(vmq_elapsed "$T_DEFINE" "$T_STARTED") s, QEMU pid ${QEMU_PID:-?}"

# ------------------------------------------------------------------ QEMU's command line
QARGS=$WORK/qemu-args.txt
if [[ -n $QEMU_PID && -r /proc/$QEMU_PID/cmdline ]]; then
    tr '\0' '\n' <"/proc/$QEMU_PID/cmdline" >"$QARGS"
else
    grep -a -- '^-' "$(qlog)" >"$QARGS" 2>/dev/null || true # libvirt logs one argument per line
fi
NETDEV=$(awk 'p { print; exit } $0 == "-netdev" { p = 1 }' "$QARGS")
NICDEV=$(grep -a -m1 '"driver":"virtio-net-pci' "$QARGS" || true)
CHARDEV=$(grep -a -m1 '^socket,id=charua-fast' "$QARGS" || true)
WANT_VECTORS=any
((OVERRIDE)) && WANT_VECTORS=0
nic=$(jq -r '"\(.mq) \(.vectors)"' <<<"$NICDEV" 2>/dev/null || true)
if [[ $(jq -r '"\(.type) \(.queues)"' <<<"$NETDEV" 2>/dev/null) == "vhost-user $QUEUES" && $CHARDEV == *"path=$SOCK,server=on"* &&
    ($nic == "true $WANT_VECTORS" || ($WANT_VECTORS == any && $nic == "true "*)) ]]; then
    vmq_ok "QEMU command line: -netdev $NETDEV; -chardev $CHARDEV; -device $(jq -c '{driver, mq, rx_queue_size, tx_queue_size, vectors, mac}' <<<"$NICDEV"); -accel $(awk 'p { print; exit } $0 == "-accel" { p = 1 }' "$QARGS")"
else
    vmq_fail "QEMU command line: netdev '$NETDEV' chardev '$CHARDEV' device '$NICDEV' (want vhost-user queues=$QUEUES, server socket $SOCK, mq on, vectors $WANT_VECTORS; pid ${QEMU_PID:-?}, log $(qlog))"
fi

# ------------------------------------------------------------------ the guest
SERIAL=$RUN/virt-serial0-log # the <log file> of KubeVirt's serial console, written by virtlogd
# the domain's guest, as hack/lib.sh's guests: vmq_guest_wait kv REGEX SECONDS
VMQ_GUEST_LOG[kv]=$SERIAL VMQ_GUEST_PID[kv]=$QEMU_PID VMQ_GUEST_QLOG[kv]=$(qlog)
crashed() { grep -a -q 'shutting down, reason=crashed' "$(qlog)" 2>/dev/null && echo "; QEMU crashed (libvirt: reason=crashed)"; true; }
vmq_guest_wait kv '^VHOSTMQ-RESULT boot ' 150 || abort "the domain's guest did not boot (serial log $SERIAL)$(crashed)"
T_BOOT=$(vmq_now)
vmq_guest_wait kv '^VHOSTMQ-RESULT link ' 90 || abort "the domain's guest did not bring eth0 up$(crashed)"
T_LINK=$(vmq_now)
rx=$(vmq_result "$SERIAL" queues rx) tx=$(vmq_result "$SERIAL" queues tx)
brx=$(vmq_result "$SERIAL" queues before_rx) btx=$(vmq_result "$SERIAL" queues before_tx)
if [[ $rx == "$QUEUES" && $tx == "$QUEUES" ]]; then
    vmq_ok "guest (4 vCPUs) sees $rx rx + $tx tx queues on eth0 (driver default before ethtool -L: $brx rx + $btx tx), link $(vmq_result "$SERIAL" link state)"
else
    vmq_fail "guest queues: $(vmq_result_line "$SERIAL" queues)"
fi

# the dataplane's side, while the guest runs
port_json() { vmq_ctl -o json port show fast 2>/dev/null || true; }
# port_state: "connected=C enabled_pairs=N" of the dataplane's port fast
port_state() { jq -r '"connected=\(.status.connected) enabled_pairs=\(.status.enabled_pairs)"' <<<"$(port_json)" 2>/dev/null || echo "no port fast"; }
vmq_eventually 20 "dataplane port fast (role client, dialed QEMU's socket): connected, $QUEUES pairs enabled" \
    "connected=true enabled_pairs=$QUEUES" port_state || true
pj=$(port_json)
qj=$(vmq_ctl -o json queues fast --interval 0 2>/dev/null || true)
printf '%s\n' "$pj" >"$WORK/port-fast.json"
printf '%s\n' "$qj" >"$WORK/queues-fast.json"
vmq_log "port fast: connects=$(jq -r .status.connects <<<"$pj" 2>/dev/null), on CPU $(jq -r '[.slots[] | select((.queues // []) | any(.port == "fast")) | .cpu] | unique | map(tostring) | join(",")' <<<"$qj" 2>/dev/null)"
vmq_expect "vhostmqctl queues: port fast's pairs with rx and tx enabled" \
    "$(jq -r '[.slots[].queues[]? | select(.port == "fast" and .rx_enabled and .tx_enabled) | .pair] | sort | map(tostring) | join(",")' <<<"$qj" 2>/dev/null || true)" 0,1,2,3

# ping and iperf3 to the peer
if vmq_guest_wait kv '^VHOSTMQ-RESULT reach ' 120; then
    T_PING=$(vmq_now)
    if [[ $(vmq_result "$SERIAL" reach ok) == 1 ]]; then
        vmq_ok "guest reaches the peer 10.0.0.2 through the dataplane ($(vmq_elapsed "$T_DEFINE" "$T_PING") s after virsh define)"
    else
        vmq_fail "guest cannot reach the peer: $(vmq_result_line "$SERIAL" reach); peer: $(vmq_result_line "${VMQ_GUEST_LOG[peer]}" link)"
    fi
else
    T_PING=""
    vmq_fail "the guest did not report reaching the peer"
fi
if vmq_guest_wait kv '^VHOSTMQ-RESULT role-done role=client ' 150; then
    sent=$(vmq_result "$SERIAL" ping sent) recv=$(vmq_result "$SERIAL" ping received)
    if [[ $recv =~ ^[1-9][0-9]*$ ]]; then
        vmq_ok "ping 10.0.0.2: $recv/$sent replies, loss $(vmq_result "$SERIAL" ping loss_pct)%, rtt min/avg/max $(vmq_result "$SERIAL" ping rtt_min_ms)/$(vmq_result "$SERIAL" ping rtt_avg_ms)/$(vmq_result "$SERIAL" ping rtt_max_ms) ms"
    else
        vmq_fail "ping 10.0.0.2: $(vmq_result_line "$SERIAL" ping)"
    fi
    ifwd=$(vmq_iperf_line "$SERIAL" forward) irev=$(vmq_iperf_line "$SERIAL" reverse)
    if [[ $ifwd == *" rc=0 "* && $irev == *" rc=0 "* ]]; then
        vmq_ok "iperf3 -P 16 to the peer: forward $(vmq_kv "$ifwd" gbps) Gbit/s, reverse $(vmq_kv "$irev" gbps) Gbit/s (TCG)"
    else
        vmq_fail "iperf3 to the peer: ${ifwd:-no forward result}; ${irev:-no reverse result}"
    fi
else
    vmq_fail "the guest's client role (ping, iperf3) did not finish"
fi
T_TRAFFIC=$(vmq_now)

# per-queue counters (rx = toward the guest, tx = from the guest)
sj=$(vmq_ctl -o json stats fast peer 2>/dev/null || true)
printf '%s\n' "$sj" >"$WORK/stats-after-traffic.json"
QTABLE=$(jq -r '.ports[]? as $p | $p.queues[] | [$p.id, .pair, .cpu, .rx.packets, .tx.packets, .rx.bytes, .tx.bytes,
    ((.drops // {}) | to_entries | map(select(.key != "total" and .value > 0) | "\(.key)=\(.value)") | if length == 0 then "-" else join(",") end)] | @tsv' <<<"$sj" 2>/dev/null || true)
busy=$(awk -F'\t' '$1 == "fast" && $4 > 0 && $5 > 0 { n++ } END { print n + 0 }' <<<"$QTABLE")
tot=$(awk -F'\t' '$1 == "fast" { r += $4; t += $5 } END { print r + 0, t + 0 }' <<<"$QTABLE")
gq=$(tr -d '\r' <"$SERIAL" | awk '$1 == "VHOSTMQ-RESULT" && $2 == "guest-queues" { $1 = $2 = ""; l = $0 } END { sub(/^ +/, "", l); print l }')
# The guest's TX queue is the sending vCPU's (virtio-net XPS), and the
# dataplane steers a flow's RX to the queue it came from, so which pairs carry
# traffic is the guest's choice (where it ran iperf3 and its softirqs). What
# the dataplane decides: every queue the guest used during its traffic, by
# its own counters (from the guest-queues line before iperf3 to the last),
# was served on that pair.
g0=$(tr -d '\r' <"$SERIAL" | grep '^VHOSTMQ-RESULT guest-queues phase=traffic ' | head -n1)
unserved=$(awk -F'\t' -v a="$g0" -v b="$gq" '
    function g(line, k) { return match(line, "(^| )" k "=[0-9]+") ? substr(line, index(substr(line, RSTART), "=") + RSTART) + 0 : 0 }
    $1 == "fast" {
        gt = g(b, "tx_q" $2) - g(a, "tx_q" $2); gr = g(b, "rx_q" $2) - g(a, "rx_q" $2)
        if (gt > 0 && $5 + 0 == 0) printf "pair %d: the guest sent %d on tx_q%d, the dataplane took none; ", $2, gt, $2
        if (gr > 0 && $4 + 0 == 0) printf "pair %d: the guest read %d from rx_q%d, the dataplane put none; ", $2, gr, $2
    }' <<<"$QTABLE")
if [[ -n $g0 && -z $unserved ]] && ((busy >= 1)) && [[ ${tot% *} -gt 0 && ${tot#* } -gt 0 ]]; then
    vmq_ok "per-queue counters of port fast: every queue the guest used was served on its pair; $busy of $QUEUES pairs carried traffic both ways (rx ${tot% *} / tx ${tot#* } packets in total; the guest's per-queue counters: $gq)"
else
    vmq_fail "per-queue counters of port fast: ${unserved:-}$([[ -n $g0 ]] || echo "no guest counters before the traffic; ")$busy of $QUEUES pairs busy both ways: $(tr '\n\t' '; ' <<<"$QTABLE")"
fi
{
    echo "port pair cpu rxPackets txPackets rxBytes txBytes drops"
    tr '\t' ' ' <<<"$QTABLE"
} | vmq_table >"$WORK/queue-table.txt"

# ------------------------------------------------------------------ teardown, checked
if timeout 60 virsh -q destroy "$NAME" >/dev/null 2>&1; then
    vmq_ok "virsh destroy $NAME"
else
    vmq_fail "virsh destroy $NAME"
fi
vmq_eventually 10 "the dataplane saw QEMU go away (port fast not connected; it keeps re-dialing)" \
    '~^connected=false ' port_state || true
if timeout 60 virsh -q undefine "$NAME" >/dev/null 2>&1 && domain_gone; then
    vmq_ok "virsh undefine $NAME"
else
    vmq_fail "virsh undefine $NAME"
fi
DEFINED=0
if [[ -f $(qlog) ]]; then cp "$(qlog)" "$WORK/libvirt-qemu.log"; rm -f "$(qlog)"; fi
vmq_guest_stop peer
vmq_stop "$SIDECAR_PID"
sc_rc=$VMQ_RC
vmq_stop "$DP_PID" 12
dp_rc=$VMQ_RC
if [[ $sc_rc == 0 && $dp_rc == 0 ]]; then
    vmq_ok "the sidecar and the dataplane exit 0 on SIGTERM"
else
    vmq_fail "exit status on SIGTERM: sidecar $sc_rc, dataplane $dp_rc"
fi

# ------------------------------------------------------------------ report
echo
echo "per-queue dataplane counters after the traffic (rx = toward the guest, tx = from the guest):"
sed 's/^/  /' "$WORK/queue-table.txt"
echo
echo "timings (s):"
{
    echo "step seconds"
    echo "dependencies $(vmq_elapsed "$T_START" "$T_DEPS")"
    echo "go-build+guest-image $(vmq_elapsed "$T_DEPS" "$T_BUILD")"
    echo "libvirtd-up $(vmq_elapsed "$T_BUILD" "$T_LIBVIRT")"
    echo "OnDefineDomain-pass1 ${T_HOOK[1]}"
    echo "OnDefineDomain-pass2 ${T_HOOK[2]}"
    echo "define->running $(vmq_elapsed "$T_DEFINE" "$T_STARTED")"
    echo "running->guest-boot-line $(vmq_elapsed "$T_STARTED" "$T_BOOT")"
    echo "running->link-up(4-queues) $(vmq_elapsed "$T_STARTED" "$T_LINK")"
    echo "define->guest-ping ${T_PING:+$(vmq_elapsed "$T_DEFINE" "$T_PING")}"
    echo "define->ping+iperf3-done $(vmq_elapsed "$T_DEFINE" "$T_TRAFFIC")"
    echo "total $(vmq_elapsed "$T_START")"
} | vmq_table | sed 's/^/  /'
echo
vmq_fails_report
