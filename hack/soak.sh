#!/usr/bin/env bash
# Soak: the dataplane under traffic and churn for a set time (make soak:
# 30 min; make test runs --duration 120).
#
#   guests   two QEMU guests on ports a and b (client role: QEMU listens,
#            the dataplane dials, as with KubeVirt): a changes its queue
#            count (ethtool -L combined 1,4,2,4,...) and runs iperf3 -P 32
#            to b after each change, for the whole run
#   DPDK     cycles of: two ports created through the control API
#            (vhostmqctl port add, server role, 2 pairs, their own network),
#            a testpmd (virtio-user, flowgen) on each, one of them killed
#            and started again (a frontend disconnecting and reconnecting),
#            both ports deleted through the API
#   restart  the dataplane is SIGKILLed and started again once, half way
#            (ports from the API restored from its state dir, QEMU re-dialled)
#
# Asserted: no kick was lost (every stall the watchdog healed, in both
# dataplane lifetimes, was answered by the guest's late kick, which the
# dataplane logs as such); every DPDK cycle moved frames through both of
# its ports before and after the reconnect; every API call succeeded; no
# growth of the dataplane's open fds (+8), goroutines (+16), anonymous RSS
# (+48 MiB: its own memory; the guests' shared memory it maps is not
# counted) or Go heap in use (+32 MiB) from the first cycle after the
# restart to the end; at the end
# both guests still pass traffic (a's last queue change and iperf3 after
# it succeeded) and every queue change outside the restart window did.
# Figures per cycle go to the table printed at the end.
#
# Usage: hack/soak.sh [--duration SECONDS] [--keep DIR]
# Needs root, QEMU, DPDK and the guest image (hack/install-deps.sh).
# Exit status: 0 when every assertion held.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$HERE/lib.sh"
VMQ_TAG=soak

DUR=1800 WORK=""
vmq_args --duration=DUR --keep=WORK -- "$@"
if ! [[ $DUR =~ ^[0-9]+$ ]] || ((DUR < 60)); then vmq_die "--duration must be at least 60 seconds"; fi
vmq_need_root
vmq_need dpdk-testpmd jq curl stdbuf
vmq_workdir vhostmq-soak
vmq_init
T0=$(vmq_now)
vmq_build_guest
[[ -x $VMQ_CTL ]] || vmq_die "no $VMQ_CTL: run make build"

# ---------------------------------------------------------------- guests and dataplane
STEPS=$((DUR / 5 + 4))
seq=""
for ((i = 0; i < STEPS; i++)); do seq+="${seq:+,}$(((i % 4 == 0) ? 1 : (i % 4 == 2) ? 2 : 4))"; done
VMQ_TG_GUEST_S=$((DUR + 240))
VMQ_TG_BACKEND_S=$((DUR + 300))
vmq_tg_setup "$WORK" client 4
METRICS=127.0.0.1:$((19400 + $$ % 500))
{
    echo "metricsAddress: \"$METRICS\""
    echo "socketRoot: $WORK"
} >>"$VMQ_TG_CFG"
vmq_log "work dir $WORK, $DUR s, dataplane metrics on $METRICS"
vmq_tg_boot churn "vmq.churn=$seq" vmq.churnpause=1

metric() { # NAME: its value on the dataplane's /metrics
    curl -s --max-time 5 "http://$METRICS/metrics" | awk -v n="$1" '$1 == n { printf "%d", $2; exit }'
}
# anon_mib: the dataplane's anonymous resident memory (its heap and stacks;
# the guests' memory it maps is shared and would count pages it touched)
anon_mib() {
    local pid
    pid=$(vmq_child "$VMQ_BE_PID")
    awk '/^RssAnon:/ { printf "%d", $2 / 1024 }' "/proc/$pid/status" 2>/dev/null || echo 0
}
stalls() { jq '[.ports[].queues[].stalls] | add // 0' "$VMQ_TG_STATS" 2>/dev/null || echo 0; }

# ---------------------------------------------------------------- DPDK cycles
declare -A FE_PID=()
fe_start() { # NAME SOCK MAC PEER
    local name=$1 prefix mem
    prefix=soak$$$name$RANDOM
    read -r -a mem <<<"$(vmq_dpdk_mem_args 256)"
    vmq_dpdk_track "$prefix"
    vmq_bg "$WORK/testpmd-$name.log" $((DUR + 120)) stdbuf -oL dpdk-testpmd -l 0,1 --main-lcore 1 --no-pci "${mem[@]}" \
        --file-prefix="$prefix" --vdev "net_virtio_user0,path=$2,queues=2,mac=$3" -- \
        --nb-cores=1 --rxq=2 --txq=2 --port-topology=loop --forward-mode=flowgen \
        --eth-peer=0,"$4" --total-num-mbufs=16384 --stats-period=3600
    FE_PID[$name]=$VMQ_BG_PID
}
fe_stop() { [[ -n ${FE_PID[$1]:-} ]] && vmq_stop "${FE_PID[$1]}" 3; FE_PID[$1]=""; }
# port_frames NAME: tx+rx frames of a port in the stats file
port_frames() { jq --arg p "$1" '[.ports[] | select(.name == $p) | .queues[] | .txPackets + .rxPackets] | add // 0' "$VMQ_TG_STATS" 2>/dev/null || echo 0; }
# moved NAME BEFORE WHAT: asserts that within 20 s port NAME moves frames past BEFORE
moved() { VMQ_POLL_S=0.5 vmq_eventually 20 "$3" ">$2" port_frames "$1"; }

cycle() { # N: one DPDK cycle; its table row into ROW
    local n=$1 s ok=1 b
    local sa=$WORK/d$n-a.sock sb=$WORK/d$n-b.sock
    for s in a b; do
        local sock=$WORK/d$n-$s.sock
        # flowgen sends from 00:01:02:03:04:00, not the port's MAC: port security off
        vmq_ctl port add "d$n-$s" --socket "$sock" --role server --queues 2 --network dpdk --polling adaptive --port-security=false \
            --mac "$(printf '02:76:6d:71:%02x:%s' $((n % 256)) "$([[ $s == a ]] && echo 0a || echo 0b)")" >/dev/null ||
            { vmq_fail "cycle $n: vhostmqctl port add d$n-$s failed"; ok=0; }
    done
    if ! vmq_wait_path "$sa" 10 || ! vmq_wait_path "$sb" 10; then vmq_fail "cycle $n: the API's ports have no sockets"; ok=0; fi
    fe_start a "$sa" 02:76:6d:71:00:0a 02:76:6d:71:00:0b
    fe_start b "$sb" 02:76:6d:71:00:0b 02:76:6d:71:00:0a
    for s in a b; do moved "d$n-$s" 0 "cycle $n: port d$n-$s moves frames" || ok=0; done
    # a frontend goes away and comes back
    vmq_crash "${FE_PID[a]}" || vmq_fail "cycle $n: testpmd a was gone before it was killed (see $WORK/testpmd-a.log)"
    FE_PID[a]=""
    sleep 1
    b=$(port_frames "d$n-a")
    fe_start a "$sa" 02:76:6d:71:00:0a 02:76:6d:71:00:0b
    moved "d$n-a" "$b" "cycle $n: port d$n-a moves frames after its frontend reconnected" || ok=0
    sleep 3
    fe_stop a
    fe_stop b
    for s in a b; do vmq_ctl port del "d$n-$s" >/dev/null || { vmq_fail "cycle $n: vhostmqctl port del d$n-$s failed"; ok=0; }; done
    [[ -e $sa || -e $sb ]] && { vmq_fail "cycle $n: a deleted port's socket is still there"; ok=0; }
    ROW="$n $(vmq_elapsed "$T0") $(metric process_open_fds) $(metric go_goroutines) $(anon_mib) $(($(metric go_memstats_heap_inuse_bytes) / 1048576)) $(stalls) $([[ $ok == 1 ]] && echo ok || echo FAIL)"
}

ROWS=("cycle t_s open_fds goroutines rss_anon_mib heap_mib stalls result")
END=$(($(date +%s) + DUR))
HALF=$(($(date +%s) + DUR / 2))
restarted=0 n=0 base="" stalls_before=0 restart_t0="" restart_t1=""
while (($(date +%s) < END)); do
    n=$((n + 1))
    cycle "$n"
    ROWS+=("$ROW")
    vmq_log "cycle $ROW"
    if ((!restarted && $(date +%s) >= HALF)); then
        stalls_before=$(stalls)
        restart_t0=$(vmq_now)
        vmq_log "SIGKILL the dataplane and start it again"
        vmq_backend_crash
        sleep 1
        vmq_backend_start "$WORK" "$VMQ_TG_CFG" "$VMQ_TG_STATS" "$VMQ_TG_BACKEND_S"
        vmq_eventually 30 "port a reconnected after the restart" a=true vmq_stats_connected "$VMQ_TG_STATS" a || true
        restart_t1=$(vmq_now)
        restarted=1
        ROWS+=("restart $(vmq_elapsed "$T0") - - - - $stalls_before -")
        base=""
        continue
    fi
    [[ -z $base ]] && base=$ROW
done
((restarted)) || vmq_fail "the run ended before the dataplane restart (--duration too short)"

# ---------------------------------------------------------------- end checks
stalls_after=$(stalls)
# a stall the sweep declared whose kick then came (the guest's vCPU
# descheduled past the bound on a busy machine) is the guest being late,
# not a kick lost: the dataplane tells them apart and logs the late ones
late=$(cat "$WORK"/backend-*.log 2>/dev/null | grep -c 'kick came late' || true)
if ((stalls_before + stalls_after > late)); then
    vmq_fail "the stall watchdog healed $stalls_before + $stalls_after stalls, $((stalls_before + stalls_after - late)) of them lost kicks ($late answered by a late kick, in the dataplane's log)"
elif ((late > 0)); then
    vmq_ok "no lost kick: the watchdog's $late stall(s) were each answered by the guest's late kick (its vCPU descheduled past the bound; in the dataplane's log)"
fi
if [[ -n $base ]]; then
    read -r _ _ f0 g0 r0 h0 _ <<<"$base"
    read -r _ _ f1 g1 r1 h1 _ <<<"${ROWS[-1]}"
    ((f1 - f0 <= 8)) || vmq_fail "open fds grew from $f0 to $f1"
    ((g1 - g0 <= 16)) || vmq_fail "goroutines grew from $g0 to $g1"
    ((r1 - r0 <= 48)) || vmq_fail "anonymous RSS grew from $r0 to $r1 MiB"
    ((h1 - h0 <= 32)) || vmq_fail "the Go heap in use grew from $h0 to $h1 MiB"
else
    vmq_fail "no cycle after the restart to measure growth from (--duration too short)"
fi
# the guests: every queue change outside the restart window passed traffic
la=${VMQ_GUEST_LOG[a]}
last=$(tr -d '\r' <"$la" | grep -c '^VHOSTMQ-RESULT churn step=[0-9]* .*phase=done' || true)
bad=$(tr -d '\r' <"$la" | grep '^VHOSTMQ-RESULT churn step=[0-9]* .*phase=done' | grep -vc ' rc=0 ' || true)
lastrc=$(tr -d '\r' <"$la" | grep '^VHOSTMQ-RESULT churn step=[0-9]* .*phase=done' | tail -n1 | sed -n 's/.* rc=\([0-9]*\).*/\1/p')
((last > 0)) || vmq_fail "guest a finished no queue change"
[[ $lastrc == 0 ]] || vmq_fail "guest a's last queue change passed no traffic (rc=$lastrc)"
((bad <= 2)) || vmq_fail "$bad of guest a's $last queue changes passed no traffic (at most 2 may fall in the restart window)"
vmq_tg_teardown

echo
echo "===== vhostmq soak ($DUR s requested, $(vmq_elapsed "$T0") s wall) ====="
printf '%s\n' "${ROWS[@]}" | vmq_table
echo "guest a: $last queue changes under iperf3 ($bad without traffic; the dataplane restart took $(vmq_elapsed "${restart_t0:-$T0}" "${restart_t1:-$T0}") s to reconnect a)"
echo "stalls healed: $stalls_before before the restart, $stalls_after after"
echo "work dir (logs, config, stats): $WORK"
vmq_verdict soak
