#!/usr/bin/env bash
# End-to-end test of the vxlan uplink (issue #30): guests on nodes that
# share no L2 segment are on one network.
#
# Four network namespaces: a router R and three "nodes" on three subnets,
# each joined to R by a veth pair (no bridge anywhere, so nothing but
# routed IP crosses between them):
#
#   n1  10.1.0.2   dataplane, uplink.vxlan; guest a  10.20.0.2 (DHCP)  client: ping b, iperf3 both ways
#   n2  10.2.0.2   dataplane, uplink.vxlan; guest b  10.20.0.3 (DHCP)  iperf3 server
#   nk  10.3.0.2   the kernel's own vxlan device vx0 (VNI 100) with 10.20.0.9/24:
#                  the interoperability peer
#   R   10.{1,2,3}.0.1, forwarding
#
# The ports are created over the agent API as the CNI does, on network
# "ov" with uplink vxlan and VNI 100, without an MTU: the agent gives
# them the uplink's (the underlay's 1500 less 50). The guests' NICs get
# host_mtu=1450 (what the KubeVirt binding puts in the domain, announced
# to the guest through VIRTIO_NET_F_MTU) and DHCP's option 26 says 1450.
#
# Asserted: each port's MTU is 1450 and a port asking for 1500 is
# refused naming mtu; each guest's own eth0 MTU is 1450, and its DHCP
# lease says so; a reaches b across the router (ping, iperf3 forward and
# reverse); the kernel's vxlan device pings both guests (frames both ways
# in the standard's format); each node's uplink counted traffic to and
# from both VTEPs and learned addresses behind them; every dataplane
# exits 0 on SIGTERM.
#
# Then, in the same run, the kernel's own overlay on the same route: a
# bridge with a vxlan device and a tap per node, guests ka and kb on the
# taps (QEMU's virtio-net, vhost=off), host_mtu 1450, the same iperf3;
# the rates are printed side by side (measured, not asserted beyond > 0).
#
# Usage: hack/e2e-overlay.sh [--keep DIR] [--time 5] [--streams 4] [--polling interrupt] [--offloads on]
# Needs root, QEMU and the guest image (hack/install-deps.sh). Exit
# status 0 when every assertion held.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$HERE/lib.sh"

WORK="" ITIME=5 STREAMS=4 POLLING=interrupt OFFLOADS=on
vmq_args --keep=WORK --time=ITIME --streams=STREAMS --polling=POLLING --offloads=OFFLOADS -- "$@"
vmq_need_root
vmq_workdir vhostmq-e2e-overlay
VMQ_TAG=e2e-overlay
vmq_init
T0=$(vmq_now)
vmq_build_guest
vmq_log "building the dataplane and vhostmqctl into $WORK/bin"
(cd "$VMQ_REPO_ROOT" && go build -o "$WORK/bin/" ./cmd/vhostmq-dataplane ./cmd/vhostmqctl) || vmq_die "go build failed"
VMQ_CTL=$WORK/bin/vhostmqctl

R=vmqor-$$ N1=vmqo1-$$ N2=vmqo2-$$ NK=vmqok-$$
netns_del() {
    local n
    for n in "$N1" "$N2" "$NK" "$R"; do ip netns del "$n" 2>/dev/null; done
    true
}
trap 'rc=$?; vmq_cleanup; netns_del; exit $rc' EXIT
for n in "$R" "$N1" "$N2" "$NK"; do
    ip netns add "$n"
    ip -n "$n" link set lo up
done
ip netns exec "$R" sysctl -qw net.ipv4.ip_forward=1
i=0
for n in "$N1" "$N2" "$NK"; do
    i=$((i + 1))
    ip -n "$R" link add "r$i" type veth peer name up0 netns "$n"
    ip -n "$R" addr add "10.$i.0.1/24" dev "r$i"
    ip -n "$R" link set "r$i" up
    ip -n "$n" addr add "10.$i.0.2/24" dev up0
    ip -n "$n" link set up0 up
    ip -n "$n" route add default via "10.$i.0.1"
done
VTEPS="[10.1.0.2, 10.2.0.2, 10.3.0.2]"
# the kernel's VTEP on nk, with its head-end replication list
ip -n "$NK" link add vx0 type vxlan id 100 dstport 4789 local 10.3.0.2 dev up0
ip -n "$NK" link set vx0 mtu 1450 up
ip -n "$NK" addr add 10.20.0.9/24 dev vx0
for d in 10.1.0.2 10.2.0.2; do bridge -n "$NK" fdb append 00:00:00:00:00:00 dev vx0 dst "$d"; done
vmq_log "router $R; nodes $N1 (10.1.0.2), $N2 (10.2.0.2), $NK (10.3.0.2, kernel vxlan VNI 100)"

# node NAME NETNS LOCAL: a dataplane in NETNS with the vxlan uplink on LOCAL
declare -A DP_PID=() API=()
node() {
    local name=$1 ns=$2 local=$3 dir=$WORK/$1
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
  vxlan:
    local: $local
    mtu: 1500
    vteps: $VTEPS
EOF
    vmq_bg "$dir/dataplane.log" 600 ip netns exec "$ns" "$WORK/bin/vhostmq-dataplane" --config "$dir/config.yaml"
    DP_PID[$name]=$VMQ_BG_PID
    vmq_wait_path "$dir/api.sock" 20 "$VMQ_BG_PID" || { tail -n 20 "$dir/dataplane.log" >&2; vmq_die "node $name: no API socket"; }
    vmq_log "node $name: dataplane pid $VMQ_BG_PID in netns $ns, vxlan uplink on $local"
}
# port NODE NAME ADDRESS MAC [MORE...]: a server-role port on network ov,
# VNI 100, the vxlan uplink, DHCP
port() {
    local n=$1 name=$2 addr=$3 mac=$4
    shift 4
    VMQ_API=${API[$n]} vmq_ctl port add "$name" --socket "$WORK/$n/s/$name/vhu.sock" --role server --mac "$mac" --polling "$POLLING" \
        --network ov --uplink vxlan --vni 100 --dhcp --address "$addr" --gateway 10.20.0.1 --dns 10.20.0.1 "$@"
}
port_mtu() { VMQ_API=${API[$1]} vmq_ctl -o json port show "$2" | jq -r '.mtu'; }

stop_node() {
    vmq_stop "${DP_PID[$1]}" 10
    if [[ $VMQ_RC == 0 ]]; then vmq_ok "node $1: dataplane exited 0 on SIGTERM"; else vmq_fail "node $1: dataplane exit status $VMQ_RC"; fi
}

node n1 "$N1" 10.1.0.2
node n2 "$N2" 10.2.0.2
port n1 a 10.20.0.2/24 52:54:00:20:00:02 >/dev/null || vmq_die "node n1: port add a failed"
port n2 b 10.20.0.3/24 52:54:00:20:00:03 >/dev/null || vmq_die "node n2: port add b failed"
for p in n1:a n2:b; do
    m=$(port_mtu "${p%%:*}" "${p#*:}")
    if [[ $m == 1450 ]]; then vmq_ok "port ${p#*:}: mtu $m (none asked: the vxlan uplink's, 1500 less 50)"; else vmq_fail "port ${p#*:}: mtu $m, want 1450"; fi
done
if out=$(port n1 big 10.20.0.7/24 52:54:00:20:00:07 --mtu 1500 2>&1); then
    vmq_fail "a port with mtu 1500 on the vxlan uplink of a 1500-byte underlay was accepted"
elif [[ $out == *"mtu: 1500 is more than the vxlan uplink carries: 1450"* ]]; then
    vmq_ok "a port with mtu 1500 is refused: $(tail -n 1 <<<"$out")"
else
    vmq_fail "a port with mtu 1500: refused, but not naming mtu: $out"
fi

COMMON=("vmq.ip=dhcp" "vmq.time=$ITIME" "vmq.streams=$STREAMS" "vmq.duration=200" "vmq.offloads=$OFFLOADS")
VMQ_GUEST_DEV_OPTS[a]=host_mtu=1450 VMQ_GUEST_DEV_OPTS[b]=host_mtu=1450
vmq_guest_start b "$WORK/n2/s/b/vhu.sock" connect 52:54:00:20:00:03 1 240 "$WORK" vmq.role=server "${COMMON[@]}"
vmq_guest_start a "$WORK/n1/s/a/vhu.sock" connect 52:54:00:20:00:02 1 240 "$WORK" \
    vmq.role=client vmq.peer=10.20.0.3 "${COMMON[@]}"

for g in b a; do
    if vmq_guest_wait "$g" 'VHOSTMQ-RESULT link ' 150; then
        log=${VMQ_GUEST_LOG[$g]}
        dm=$(vmq_result "$log" dhcp mtu) lm=$(vmq_result "$log" link mtu) ip=$(vmq_result "$log" dhcp ip)
        if [[ $lm == 1450 && $dm == 1450 ]]; then
            vmq_ok "guest $g: eth0 mtu $lm (VIRTIO_NET_F_MTU), DHCP from its dataplane: $ip, mtu $dm"
        else
            vmq_fail "guest $g: eth0 mtu ${lm:-?}, DHCP ip ${ip:-?} mtu ${dm:-?}; want 1450 both"
        fi
    else
        vmq_fail "guest $g: no link result"
    fi
done

# the kernel's vxlan device pings both guests (it learns their MACs from
# the frames our dataplanes send, and floods its ARP to both VTEPs)
for g in a:10.20.0.2 b:10.20.0.3; do
    if out=$(ip netns exec "$NK" busybox ping -c 3 -W 10 "${g#*:}" 2>&1); then
        vmq_ok "the kernel's vxlan device (nk) pings guest ${g%%:*}: $(grep -o '[0-9]* packets received' <<<"$out"), $(grep -o 'round-trip.*' <<<"$out")"
    else
        vmq_fail "the kernel's vxlan device does not reach guest ${g%%:*}: $(tail -n 2 <<<"$out" | tr '\n' ' ')"
    fi
done

if vmq_guest_wait a 'VHOSTMQ-RESULT role-done role=client' 240; then
    la=${VMQ_GUEST_LOG[a]}
    if [[ $(vmq_result "$la" reach ok) == 1 ]]; then vmq_ok "a reaches b across the router"; else vmq_fail "a does not reach b"; fi
    loss=$(vmq_result "$la" ping loss_pct)
    if [[ $loss == 0 ]]; then vmq_ok "ping a->b: 0% loss, rtt avg $(vmq_result "$la" ping rtt_avg_ms) ms"; else vmq_fail "ping a->b: loss $loss%"; fi
    for dir in forward reverse; do
        line=$(vmq_iperf_line "$la" "$dir")
        rc=$(vmq_kv "$line" rc) gbps=$(vmq_kv "$line" gbps)
        if [[ $rc == 0 && -n $gbps ]] && awk -v g="$gbps" 'BEGIN { exit !(g > 0) }'; then
            vmq_ok "iperf3 a->b $dir over the overlay: $gbps Gbit/s ($STREAMS streams, ${ITIME}s, TCG guests)"
        else
            vmq_fail "iperf3 a->b $dir: $line"
        fi
        printf 'vxlan_%s_gbps=%s\n' "$dir" "$gbps" >>"$WORK/result.env"
    done
else
    vmq_fail "guest a did not finish its roles"
fi

# each node's uplink: traffic both ways with both other VTEPs, addresses
# learned behind them
sleep 1 # one more stats file
for n in n1 n2; do
    up=$(jq -c '.uplink // empty' "$WORK/$n/stats.json" 2>/dev/null || true)
    if [[ -n $up ]] && jq -e '.kind == "vxlan" and .healthy and (.vteps | length == 2)
        and all(.vteps[]; .txPackets > 0 and .rxPackets > 0 and .macs >= 1 and .txErrors == 0)' <<<"$up" >/dev/null; then
        vmq_ok "node $n uplink: $(jq -c '{name, txPackets, rxPackets, rxUnknownVtep, vteps: [.vteps[] | {address, txPackets, rxPackets, macs}]}' <<<"$up")"
    else
        vmq_fail "node $n uplink: ${up:-none}; want vxlan, healthy, both other VTEPs with traffic both ways and a learned address"
    fi
done
# the overlay table as vhostmqctl shows it: b's address behind n2, the
# kernel device's behind nk
KMAC=$(ip -n "$NK" -br link show vx0 | awk '{ print $3 }')
ov=$(VMQ_API=${API[n1]} vmq_ctl -o json overlay 2>&1 || true)
echo "$ov" >"$WORK/overlay-n1.json"
if jq -e --arg k "$KMAC" 'any(.entries[]; .mac == "52:54:00:20:00:03" and .vtep == "10.2.0.2" and .network == "ov" and .vni == 100)
    and any(.entries[]; .mac == $k and .vtep == "10.3.0.2")' <<<"$ov" >/dev/null 2>&1; then
    vmq_ok "vhostmqctl overlay on n1: b (52:54:00:20:00:03) behind 10.2.0.2, the kernel's vx0 ($KMAC) behind 10.3.0.2"
else
    vmq_fail "vhostmqctl overlay on n1: want b behind 10.2.0.2 and vx0 ($KMAC) behind 10.3.0.2: $ov"
fi
# the underlay's UDP counters: datagrams the kernel dropped for want of
# socket buffer (RcvbufErrors, SndbufErrors) show where a rate is lost
for n in "$N1" "$N2"; do
    # shellcheck disable=SC2016  # awk's own variables
    vmq_log "netns $n UDP: $(ip netns exec "$n" awk '/^Udp:/ { if (!h) { split($0, k); h = 1 } else { for (i = 2; i <= NF; i++) printf "%s=%s ", k[i], $i } }' /proc/net/snmp)"
done
for g in a b; do vmq_guest_stop "$g"; done
stop_node n1
stop_node n2

# ---------------------------------------------------------------- the kernel's overlay, same route
# on n1 and n2: br0 holding a vxlan device (VNI 200) and the guest's tap
for n in "$N1:10.1.0.2:10.2.0.2" "$N2:10.2.0.2:10.1.0.2"; do
    IFS=: read -r ns local remote <<<"$n"
    ip -n "$ns" link add br0 type bridge mcast_snooping 0
    ip -n "$ns" link add vk0 type vxlan id 200 dstport 4789 local "$local" dev up0
    bridge -n "$ns" fdb append 00:00:00:00:00:00 dev vk0 dst "$remote"
    ip -n "$ns" link set vk0 mtu 1450 master br0 up
    ip -n "$ns" link set br0 up
done
KCOMMON=("vmq.time=$ITIME" "vmq.streams=$STREAMS" "vmq.duration=200" "vmq.offloads=$OFFLOADS")
vmq_tap_guest kb "$N2" 52:54:00:30:00:03 10.30.0.3/24 1450 vmq.role=server "${KCOMMON[@]}"
vmq_tap_guest ka "$N1" 52:54:00:30:00:02 10.30.0.2/24 1450 vmq.role=client vmq.peer=10.30.0.3 "${KCOMMON[@]}"
if vmq_guest_wait ka 'VHOSTMQ-RESULT role-done role=client' 240; then
    for dir in forward reverse; do
        line=$(vmq_iperf_line "${VMQ_GUEST_LOG[ka]}" "$dir")
        g=$(vmq_kv "$line" gbps)
        printf 'kernel_%s_gbps=%s\n' "$dir" "${g:-}" >>"$WORK/result.env"
        if [[ -n $g ]] && awk -v g="$g" 'BEGIN { exit !(g > 0) }'; then
            vmq_ok "kernel overlay iperf3 $dir: $g Gbit/s"
        else
            vmq_fail "kernel overlay iperf3 $dir: ${line:-no result line}"
        fi
    done
else
    vmq_fail "kernel overlay: guest ka did not finish"
fi
for g in ka kb; do vmq_guest_stop "$g"; done
# shellcheck disable=SC1091
source "$WORK/result.env"
echo
echo "iperf3 a->b across a router (VXLAN over routed IPv4, underlay MTU 1500, guests 1450), ${STREAMS} streams, ${ITIME} s, TCG guests,"
echo "ports polling $POLLING, guest offloads $OFFLOADS (Gbit/s):"
{
    echo "path forward reverse"
    echo "vhostmq(vxlan-uplink) ${vxlan_forward_gbps:-?} ${vxlan_reverse_gbps:-?}"
    echo "kernel(vxlan+bridge+tap,qemu-virtio-net) ${kernel_forward_gbps:-?} ${kernel_reverse_gbps:-?}"
} | vmq_table
echo
echo "wall time $(vmq_elapsed "$T0") s; work dir: $WORK"
vmq_verdict e2e-overlay
