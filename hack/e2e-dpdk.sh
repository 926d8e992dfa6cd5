#!/usr/bin/env bash
# End-to-end test of the vhostmq dataplane with DPDK virtio-user frontends
# (no QEMU): for each queue count N, the dataplane gets two ports "a" and "b"
# with N queue pairs, and one dpdk-testpmd with a net_virtio_user vdev
# (queues=N) is attached to each port.
#
# Traffic: both testpmds run in flowgen mode (receive and count everything,
# transmit 64-byte UDP frames with many different IP destinations on every TX
# queue), so frames cross the dataplane's switch from a to b and from b to a
# on every queue pair while each testpmd counts what it receives.  DPDK
# 22.11's flowgen ignores --eth-peer: both send from 00:01:02:03:04:00 to
# 00:01:02:03:04:01, an address no port has, so here the switch floods each
# frame to the other port (the only one).  Unicast forwarding of learned
# MACs with DPDK peers is what hack/bench/flows.sh (a witness port counts 0
# floods) and run.sh's p2p loops drive; guests' unicast is e2e-qemu's.
#
# Asserted for every N: in the dataplane's stats file ALL N queue pairs of
# BOTH ports have rxPackets>0 and txPackets>0; both testpmds received
# packets on every one of their N RX queues (telemetry); the dataplane exits
# 0 on SIGTERM.
#
# Usage: hack/e2e-dpdk.sh [--queues "1 2 4"] [--role server|client] [--time 3] [--keep DIR]
#   --role server  the dataplane listens, virtio-user dials (default)
#          client  virtio-user listens (server=1), the dataplane dials
#   --time S       seconds of traffic after every queue pair has seen some
#   --keep DIR     work dir (default: a new /tmp/vhostmq-e2e-dpdk.XXXXXX); kept
# Memory: hugepages (--single-file-segments) when enough 2 MiB pages are free,
# else --no-huge -m 512 with --total-num-mbufs=32768.  Nothing is reserved.
# CPUs: each testpmd polls on lcore 0 (its main lcore 1 sleeps); the
# dataplane's workers go to CPU 1 (VHOSTMQ_DP_CPUS).
# Environment: VHOSTMQ_DATAPLANE, VHOSTMQ_BACKEND=testpmd (stand-in), see hack/lib.sh.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$HERE/lib.sh"
VMQ_TAG=e2e-dpdk

QLIST="1 2 4" ROLE=server DUR=3 WORK=""
vmq_args --queues=QLIST --role=ROLE --time=DUR --keep=WORK -- "$@"
[[ $ROLE =~ ^(server|client)$ ]] || vmq_die "--role must be server or client"
for n in $QLIST; do [[ $n =~ ^[1-9][0-9]*$ ]] || vmq_die "--queues: '$n' is not a positive number"; done
vmq_need_root
vmq_need dpdk-testpmd jq timeout stdbuf
vmq_workdir vhostmq-e2e-dpdk
vmq_init
T0=$(vmq_now)
VMQ_SOCK_ROLE=$ROLE
MAC_A=02:76:6d:71:00:0a
MAC_B=02:76:6d:71:00:0b
SECS=$((DUR + 120))   # bound on every process of one round

# start_frontend NAME SOCK N MAC PEER_MAC WORKDIR: one testpmd, virtio-user, flowgen
declare -A FE_PID=() FE_PREFIX=() FE_LOG=()
start_frontend() {
    local name=$1 sock=$2 n=$3 mac=$4 peer=$5 dir=$6 prefix vdev mem
    prefix=vmq$$$name$n
    vdev="net_virtio_user0,path=$sock,queues=$n,mac=$mac"
    [[ $ROLE == client ]] && vdev+=",server=1"
    read -r -a mem <<<"$(vmq_dpdk_mem_args 512)"
    vmq_dpdk_track "$prefix"
    FE_PREFIX[$name]=$prefix
    FE_LOG[$name]=$dir/testpmd-$name.log
    vmq_bg "${FE_LOG[$name]}" "$SECS" stdbuf -oL dpdk-testpmd -l 0,1 --main-lcore 1 --no-pci "${mem[@]}" \
        --file-prefix="$prefix" --vdev "$vdev" -- \
        --nb-cores=1 --rxq="$n" --txq="$n" --port-topology=loop --forward-mode=flowgen \
        --eth-peer=0,"$peer" --total-num-mbufs=32768 --stats-period=3600
    FE_PID[$name]=$VMQ_BG_PID
    vmq_log "testpmd $name: pid $VMQ_BG_PID, $vdev, ${mem[*]}, log ${FE_LOG[$name]}"
}

# fe_stats NAME: "ipackets opackets q_ipackets q_opackets" of the frontend's port 0
fe_stats() { vmq_dpdk_port_stats "${FE_PREFIX[$1]}" 0 || true; }

declare -A RES=()
TESTPMD_ROWS=()
for n in $QLIST; do
    round=$(vmq_now)
    dir=$WORK/q$n
    mkdir -p "$dir"
    vmq_log "===== $n queue pair(s), role $ROLE ====="
    vmq_ports_reset
    # flowgen sends from 00:01:02:03:04:00, not its port's MAC: a
    # generator is a guest that sends others' addresses (port security off)
    VMQ_PORT_SECURITY=false
    vmq_port_add a "$dir/a.sock" "$n" "$MAC_A"
    vmq_port_add b "$dir/b.sock" "$n" "$MAC_B"
    stats=$dir/stats.json
    rm -f "$stats" "$dir/a.sock" "$dir/b.sock"
    vmq_write_config "$dir/dataplane.yaml" "$stats"

    if [[ $ROLE == server ]]; then
        vmq_backend_start "$dir" "$dir/dataplane.yaml" "$stats" "$SECS"
        start_frontend b "$dir/b.sock" "$n" "$MAC_B" "$MAC_A" "$dir"
        start_frontend a "$dir/a.sock" "$n" "$MAC_A" "$MAC_B" "$dir"
    else
        start_frontend b "$dir/b.sock" "$n" "$MAC_B" "$MAC_A" "$dir"
        start_frontend a "$dir/a.sock" "$n" "$MAC_A" "$MAC_B" "$dir"
        for s in a b; do
            vmq_wait_path "$dir/$s.sock" 30 "${FE_PID[$s]}" || vmq_die "testpmd $s did not create $dir/$s.sock"
        done
        vmq_backend_start "$dir" "$dir/dataplane.yaml" "$stats" "$SECS"
    fi
    ok=1
    for s in a b; do
        if ! vmq_wait_log "${FE_LOG[$s]}" 'packet forwarding - ports=' 60 "${FE_PID[$s]}"; then
            tail -n 15 "${FE_LOG[$s]}" | sed 's/^/    | /' >&2
            vmq_fail "N=$n: testpmd $s did not start forwarding (log ${FE_LOG[$s]})"
            ok=0
        fi
    done
    if ((ok)); then
        # idle queue pairs in the dataplane's stats: none, or which
        VMQ_POLL_S=0.5 vmq_eventually 30 "N=$n: all $n queue pairs of ports a and b have rxPackets>0 and txPackets>0" "" \
            vmq_stats_idle "$stats" "$n" a b && sleep "$DUR"
        for s in a b; do
            read -r ip op qip qop <<<"$(fe_stats "$s")"
            RES[$n.$s]="${ip:-0} ${op:-0} ${qip:-} ${qop:-}"
            idle_rxq=$(awk -v q="${qip:-}" -v n="$n" 'BEGIN { split(q, a, ","); for (i = 1; i <= n; i++) if (a[i] + 0 <= 0) s = s " " i - 1; print s }')
            if [[ ${ip:-0} -gt 0 && -z $idle_rxq ]]; then
                vmq_ok "N=$n: testpmd $s received $ip packets (per RX queue: $(cut -d, -f1-"$n" <<<"$qip"))"
            else
                vmq_fail "N=$n: testpmd $s received ${ip:-0} packets; RX queues without packets:${idle_rxq:- none}"
            fi
            TESTPMD_ROWS+=("$n $s ${ip:-0} ${op:-0} $(cut -d, -f1-"$n" <<<"${qip:-0}") $(cut -d, -f1-"$n" <<<"${qop:-0}")")
        done
    fi
    [[ -s $stats ]] && cp "$stats" "$dir/stats-traffic.json"
    for s in a b; do vmq_stop "${FE_PID[$s]}"; done
    vmq_backend_stop
    if [[ $VMQ_BACKEND == dataplane && $VMQ_RC != 0 ]]; then
        vmq_fail "N=$n: dataplane exited with status $VMQ_RC on SIGTERM (want 0$([[ $VMQ_RC == 137 ]] && echo "; 137: SIGKILLed after not exiting within 5 s"); log $VMQ_BE_LOG)"
    fi
    RES[$n.wall]=$(vmq_elapsed "$round")
    vmq_log "N=$n done in ${RES[$n.wall]} s"
done

echo
echo "===== vhostmq e2e-dpdk: role=$ROLE backend=$VMQ_BACKEND queues=\"$QLIST\" ($(vmq_elapsed "$T0") s) ====="
echo "dataplane per-queue counters (rx = toward the virtio-user port, tx = from it):"
{
    echo "N port pair cpu rxPackets txPackets rxBytes txBytes kicks calls drops"
    for n in $QLIST; do
        f=$WORK/q$n/stats-traffic.json
        [[ -s $f ]] && vmq_stats_queues "$f" | awk -v n="$n" '{ print n, $0 }'
    done
} | vmq_table | sed 's/^/  /'
echo "testpmd (virtio-user) port counters:"
{
    echo "N side rx_packets tx_packets rx_per_queue tx_per_queue"
    for r in "${TESTPMD_ROWS[@]}"; do echo "$r"; done
} | vmq_table | sed 's/^/  /'
echo "work dir (logs, configs, stats): $WORK"
vmq_verdict e2e-dpdk
