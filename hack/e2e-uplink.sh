#!/usr/bin/env bash
# End-to-end test of the uplinks (tap and af_xdp) and of DHCP for guests
# (issue #9).
#
# Two "nodes": network namespaces n1 and n2, each with a Linux bridge br0,
# joined by a veth pair between the bridges. Each node runs its own
# dataplane (inside its namespace) with a tap uplink on br0, and the
# ports are created over the agent API (vhostmqctl) with dhcp and an
# address, as the CNI does with its IPAM result:
#
#   n1: guest a  network t10, VLAN 10, 10.10.0.2/24 (DHCP)  client: ping b, iperf3 both ways
#                                                            noreach: c must not answer
#   n2: guest b  network t10, VLAN 10, 10.10.0.3/24 (DHCP)  iperf3 server
#   n2: guest c  network t20, VLAN 20, 10.10.0.4/24 (DHCP)  same subnet, other VLAN
#
# Asserted: each guest's udhcpc gets its address, mask and router from its
# dataplane; a reaches b across the nodes (ping, iperf3 forward and
# reverse); a cannot reach c (VLAN isolation); both uplinks counted
# traffic; every dataplane exits 0 on SIGTERM.
#
# Then the af_xdp uplink: a second veth pair xA (n1) - xB (n2), in no
# bridge; a dataplane per node with `uplink.af_xdp` on its end (XDP in the
# veth driver, copy-mode sockets: a veth has no zero-copy, and the run
# says so with the kernel's reason); guests xa (n1) and xb (n2) on network
# t10, VLAN 10, get their addresses by DHCP from their dataplanes, and xa
# pings xb and runs the same iperf3 across.
#
# Then, in the same run, what a user would pick instead: the same three
# guests on plain taps in the same bridges (kernel forwarding; QEMU's own
# virtio-net backend, vhost=off: this machine has no /dev/vhost-net),
# static addresses, the same iperf3 a->b; the rates are printed side by
# side with the guests' RX-ring-full drops (measured, not asserted beyond
# > 0).
#
# Usage: hack/e2e-uplink.sh [--keep DIR] [--time 5] [--streams 4] [--polling interrupt] [--offloads on]
#   --polling  the ports' polling mode (default interrupt: two dataplanes
#              and three TCG guests share this machine's CPUs, and a
#              polling worker takes CPU the guests need)
#   --offloads on: the guests' NICs as negotiated (TSO/checksum offloads);
#              off: every guest sends plain MTU-sized frames (ethtool -K)
# Needs root, QEMU and the guest image (hack/install-deps.sh); heavy: run
# it under `flock /tmp/vhostmq-heavy.lock`. Exit status 0 when every
# assertion held.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$HERE/lib.sh"

WORK="" ITIME=5 STREAMS=4 POLLING=interrupt OFFLOADS=on
vmq_args --keep=WORK --time=ITIME --streams=STREAMS --polling=POLLING --offloads=OFFLOADS -- "$@"
vmq_need_root
vmq_workdir vhostmq-e2e-uplink
VMQ_TAG=e2e-uplink
vmq_init
T0=$(vmq_now)
vmq_build_guest
vmq_log "building the dataplane and vhostmqctl into $WORK/bin"
(cd "$VMQ_REPO_ROOT" && go build -o "$WORK/bin/" ./cmd/vhostmq-dataplane ./cmd/vhostmqctl) || vmq_die "go build failed"
VMQ_CTL=$WORK/bin/vhostmqctl

N1=vmqu1-$$ N2=vmqu2-$$
netns_del() { ip netns del "$N1" 2>/dev/null; ip netns del "$N2" 2>/dev/null; true; }
trap 'rc=$?; vmq_cleanup; netns_del; exit $rc' EXIT
for n in "$N1" "$N2"; do
    ip netns add "$n"
    ip -n "$n" link set lo up
    ip -n "$n" link add br0 type bridge
    ip -n "$n" link set br0 up
done
ip -n "$N1" link add vA type veth peer name vB netns "$N2"
ip -n "$N1" link set vA master br0 up
ip -n "$N2" link set vB master br0 up

# node NAME NETNS [IFACE]: a dataplane in NETNS with the tap uplink on br0,
# or with IFACE: the af_xdp uplink on IFACE
declare -A DP_PID=() API=()
node() {
    local name=$1 ns=$2 iface=${3:-} dir=$WORK/$1 up
    up=$'  tap:\n    name: vmqup0\n    attach: br0'
    [[ -z $iface ]] || up=$'  af_xdp:\n    interface: '$iface
    mkdir -p "$dir/s"
    API[$name]=$dir/api.sock
    cat >"$dir/config.yaml" <<EOF
cpus: [${VHOSTMQ_DP_CPUS:-$(vmq_default_cpus)}]
apiSocket: $dir/api.sock
stateDir: $dir/state
socketRoot: $dir/s
statsFile: $dir/stats.json
logLevel: ${VHOSTMQ_LOG_LEVEL:-info}
uplink:
$up
EOF
    vmq_bg "$dir/dataplane.log" 600 ip netns exec "$ns" "$WORK/bin/vhostmq-dataplane" --config "$dir/config.yaml"
    DP_PID[$name]=$VMQ_BG_PID
    vmq_wait_path "$dir/api.sock" 20 "$VMQ_BG_PID" || { tail -n 20 "$dir/dataplane.log" >&2; vmq_die "node $name: no API socket"; }
    vmq_log "node $name: dataplane pid $VMQ_BG_PID in netns $ns"
}
# port NODE NAME VLAN ADDRESS MAC [UPLINK]: a server-role port on network
# t<VLAN> with the uplink (default tap)
port() {
    local n=$1 name=$2 vlan=$3 addr=$4 mac=$5 uplink=${6:-tap}
    VMQ_API=${API[$n]} vmq_ctl port add "$name" --socket "$WORK/$n/s/$name/vhu.sock" --role server --mac "$mac" --polling "$POLLING" \
        --network "t$vlan" --vlan "$vlan" --uplink "$uplink" --dhcp --address "$addr" --gateway 10.10.0.1 --dns 10.10.0.1 >/dev/null ||
        vmq_die "node $n: port add $name failed"
}

# check_dhcp GUEST WANT-IP
check_dhcp() {
    local log=${VMQ_GUEST_LOG[$1]} ip mask router
    ip=$(vmq_result "$log" dhcp ip) mask=$(vmq_result "$log" dhcp mask) router=$(vmq_result "$log" dhcp router)
    if [[ $ip == "$2" && $mask == 24 && $router == 10.10.0.1 ]]; then
        vmq_ok "guest $1: DHCP from its dataplane: $ip/$mask router $router ($(vmq_result_line "$log" dhcp))"
    else
        vmq_fail "guest $1: DHCP gave ip=$ip mask=$mask router=$router, want $2/24 router 10.10.0.1"
    fi
}

# check_traffic CLIENT SERVER PREFIX WHAT: the client's reach, ping and
# iperf3 results; the rates go to result.env as PREFIX{forward,reverse}_gbps
check_traffic() {
    local la=${VMQ_GUEST_LOG[$1]} loss rtt dir line rc gbps
    if [[ $(vmq_result "$la" reach ok) == 1 ]]; then vmq_ok "$1 reaches $2 $4"; else vmq_fail "$1 does not reach $2 $4"; fi
    loss=$(vmq_result "$la" ping loss_pct) rtt=$(vmq_result "$la" ping rtt_avg_ms)
    if [[ $loss == 0 ]]; then vmq_ok "ping $1->$2 $4: 0% loss, rtt avg $rtt ms"; else vmq_fail "ping $1->$2 $4: loss $loss%"; fi
    for dir in forward reverse; do
        line=$(vmq_iperf_line "$la" "$dir")
        rc=$(vmq_kv "$line" rc) gbps=$(vmq_kv "$line" gbps)
        if [[ $rc == 0 && -n $gbps ]] && awk -v g="$gbps" 'BEGIN { exit !(g > 0) }'; then
            vmq_ok "iperf3 $1->$2 $dir $4: $gbps Gbit/s ($STREAMS streams, ${ITIME}s, TCG guests)"
        else
            vmq_fail "iperf3 $1->$2 $dir $4: $line"
        fi
        printf '%s%s_gbps=%s\n' "$3" "$dir" "$gbps" >>"$WORK/result.env"
    done
}

# rx_drops NODE PORT...: frames the ports' guests lost for want of RX
# buffers (rxNoBuffer, all pairs)
rx_drops() {
    local n=$1
    shift
    jq -r --args '[.ports[]? | select(.name as $n | $ARGS.positional | index($n)) | .queues[]?.drops.rxNoBuffer // 0] | add // 0' \
        "$@" <"$WORK/$n/stats.json" 2>/dev/null || echo "?"
}

# check_uplinks JQ NODE...: each node's uplink counters in its stats file
# hold for the jq condition JQ
check_uplinks() {
    local cond=$1 n up
    shift
    sleep 1 # one more stats file
    for n in "$@"; do
        up=$(jq -c '.uplink // empty' "$WORK/$n/stats.json" 2>/dev/null || true)
        if [[ -n $up ]] && jq -e "$cond" <<<"$up" >/dev/null; then
            vmq_ok "node $n uplink: $up"
        else
            vmq_fail "node $n uplink counters: ${up:-none}, want $cond"
        fi
    done
}

# stop_node NAME: SIGTERM, exit status 0 expected
stop_node() {
    vmq_stop "${DP_PID[$1]}" 10
    if [[ $VMQ_RC == 0 ]]; then vmq_ok "node $1: dataplane exited 0 on SIGTERM"; else vmq_fail "node $1: dataplane exit status $VMQ_RC"; fi
}

node n1 "$N1"
node n2 "$N2"
port n1 a 10 10.10.0.2/24 52:54:00:10:00:02
port n2 b 10 10.10.0.3/24 52:54:00:10:00:03
port n2 c 20 10.10.0.4/24 52:54:00:20:00:04

COMMON=("vmq.ip=dhcp" "vmq.time=$ITIME" "vmq.streams=$STREAMS" "vmq.duration=200" "vmq.offloads=$OFFLOADS")
vmq_guest_start b "$WORK/n2/s/b/vhu.sock" connect 52:54:00:10:00:03 1 240 "$WORK" vmq.role=server "${COMMON[@]}"
vmq_guest_start c "$WORK/n2/s/c/vhu.sock" connect 52:54:00:20:00:04 1 240 "$WORK" vmq.role=server "${COMMON[@]}"
vmq_guest_start a "$WORK/n1/s/a/vhu.sock" connect 52:54:00:10:00:02 1 240 "$WORK" \
    vmq.role=client,noreach vmq.peer=10.10.0.3 vmq.noreach=10.10.0.4 "${COMMON[@]}"

for g in b c a; do
    vmq_guest_wait "$g" 'VHOSTMQ-RESULT dhcp' 150 || vmq_fail "guest $g: no DHCP result"
done
check_dhcp a 10.10.0.2
check_dhcp b 10.10.0.3
check_dhcp c 10.10.0.4

if vmq_guest_wait a 'VHOSTMQ-RESULT role-done role=noreach' 180; then
    la=${VMQ_GUEST_LOG[a]}
    check_traffic a b "" "across the nodes (tap uplink, VLAN 10)"
    replies=$(vmq_result "$la" noreach replies)
    if [[ $replies == 0 ]]; then
        vmq_ok "a (VLAN 10) cannot reach c (VLAN 20, same subnet): 0 replies"
    else
        vmq_fail "VLAN isolation: c answered a $replies times"
    fi
else
    vmq_fail "guest a did not finish its roles"
fi

check_uplinks '.healthy and .txPackets > 0 and .rxPackets > 0' n1 n2
printf 'tap_drops_a=%s\ntap_drops_b=%s\n' "$(rx_drops n1 a)" "$(rx_drops n2 b)" >>"$WORK/result.env"
for g in a b c; do vmq_guest_stop "$g"; done
stop_node n1
stop_node n2

# ---------------------------------------------------------------- af_xdp uplink on a veth, same run
ip -n "$N1" link add xA type veth peer name xB netns "$N2"
ip -n "$N1" link set xA up
ip -n "$N2" link set xB up
node x1 "$N1" xA
node x2 "$N2" xB
port x1 xa 10 10.10.0.2/24 52:54:00:10:00:12 af_xdp
port x2 xb 10 10.10.0.3/24 52:54:00:10:00:13 af_xdp
uplink_mode() { jq -r '.uplink.mode // empty' "$WORK/$1/stats.json" 2>/dev/null || true; }
for n in x1 x2; do
    # a veth has no zero-copy: the kernel refuses it, the uplink says why
    if vmq_eventually 5 "node $n af_xdp uplink on a veth: copy-mode sockets, zero-copy refused" \
        '~copy-mode sockets \(zero-copy refused: ' uplink_mode "$n"; then
        vmq_log "node $n af_xdp uplink mode: $VMQ_SEEN"
    fi
done
vmq_guest_start xb "$WORK/x2/s/xb/vhu.sock" connect 52:54:00:10:00:13 1 240 "$WORK" vmq.role=server "${COMMON[@]}"
vmq_guest_start xa "$WORK/x1/s/xa/vhu.sock" connect 52:54:00:10:00:12 1 240 "$WORK" \
    vmq.role=client vmq.peer=10.10.0.3 "${COMMON[@]}"
for g in xb xa; do
    vmq_guest_wait "$g" 'VHOSTMQ-RESULT dhcp' 150 || vmq_fail "guest $g: no DHCP result"
done
check_dhcp xa 10.10.0.2
check_dhcp xb 10.10.0.3
if vmq_guest_wait xa 'VHOSTMQ-RESULT role-done role=client' 180; then
    check_traffic xa xb xdp_ "across the nodes (af_xdp uplink on a veth, VLAN 10)"
else
    vmq_fail "guest xa did not finish its roles"
fi
check_uplinks '.healthy and .kind == "af_xdp" and .txPackets > 0 and .rxPackets > 0' x1 x2
printf 'xdp_drops_a=%s\nxdp_drops_b=%s\n' "$(rx_drops x1 xa)" "$(rx_drops x2 xb)" >>"$WORK/result.env"
for g in xa xb; do vmq_guest_stop "$g"; done
stop_node x1
stop_node x2

# ---------------------------------------------------------------- kernel path, same run
KCOMMON=("vmq.time=$ITIME" "vmq.streams=$STREAMS" "vmq.duration=200" "vmq.offloads=$OFFLOADS")
vmq_tap_guest kb "$N2" 52:54:00:30:00:03 10.30.0.3/24 "" vmq.role=server "${KCOMMON[@]}"
vmq_tap_guest kc "$N2" 52:54:00:30:00:04 10.30.0.4/24 "" vmq.role=server "${KCOMMON[@]}"
vmq_tap_guest ka "$N1" 52:54:00:30:00:02 10.30.0.2/24 "" vmq.role=client vmq.peer=10.30.0.3 "${KCOMMON[@]}"
if vmq_guest_wait ka 'VHOSTMQ-RESULT role-done role=client' 180; then
    for dir in forward reverse; do
        line=$(vmq_iperf_line "${VMQ_GUEST_LOG[ka]}" "$dir")
        g=$(vmq_kv "$line" gbps)
        printf 'kernel_%s_gbps=%s\n' "$dir" "${g:-}" >>"$WORK/result.env"
        if [[ -n $g ]] && awk -v g="$g" 'BEGIN { exit !(g > 0) }'; then
            vmq_ok "kernel path iperf3 $dir: $g Gbit/s"
        else
            vmq_fail "kernel path iperf3 $dir: ${line:-no result line}"
        fi
    done
else
    vmq_fail "kernel path: guest ka did not finish"
fi
for g in ka kb kc; do vmq_guest_stop "$g"; done
# shellcheck disable=SC1091
source "$WORK/result.env"
echo
echo "iperf3 a->b across the two nodes, ${STREAMS} streams, ${ITIME} s, TCG guests, ports polling $POLLING, guest offloads $OFFLOADS (Gbit/s;"
echo "rx-drops: frames the client/server guest lost for want of RX buffers, rxNoBuffer, both directions):"
{
    echo "path forward reverse rx-drops"
    echo "vhostmq(tap-uplink) ${forward_gbps:-?} ${reverse_gbps:-?} ${tap_drops_a:-?}/${tap_drops_b:-?}"
    echo "vhostmq(af_xdp-uplink,veth,copy-mode) ${xdp_forward_gbps:-?} ${xdp_reverse_gbps:-?} ${xdp_drops_a:-?}/${xdp_drops_b:-?}"
    echo "kernel(bridge+tap,qemu-virtio-net) ${kernel_forward_gbps:-?} ${kernel_reverse_gbps:-?} -"
} | vmq_table
echo
echo "wall time $(vmq_elapsed "$T0") s; work dir: $WORK"
vmq_verdict e2e-uplink
