#!/usr/bin/env bash
# End-to-end test of queue-count changes under traffic, the way the stall
# seen on KubeVirt began: guest a (2 vCPUs, 4 queue pairs) changes its
# queue count with `ethtool -L eth0 combined K` for K in --sequence
# (default 1,4,2,4 three times) and after each change sends iperf3 -P 32
# flows to guest b; QEMU turns each change into SET_VRING_ENABLE messages.
#
# Asserted after every change, from the dataplane's counters: each of the
# K enabled pairs of port a carried frames out of the guest (TX) and into
# it (RX) during that step's traffic; at the end: the stall watchdog found
# nothing (vhostmq_queue_stalls_total 0 on both ports), iperf3 succeeded
# at every step.
#
# Usage: hack/e2e-queues.sh [--role client|server] [--sequence 1,4,2,4,...]
#          [--keep DIR]
#   --role     who listens on the sockets (default client: QEMU listens and
#              the dataplane dials, as with KubeVirt)
# Needs root, QEMU and the guest image (hack/install-deps.sh). About 2 min.
# Exit status: 0 when every assertion held.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$HERE/lib.sh"
VMQ_TAG=e2e-queues

ROLE=client SEQ=1,4,2,4,1,4,2,4,1,4,2,4 WORK=""
while (($#)); do
    case $1 in
        --role) ROLE=$2; shift 2 ;;
        --sequence) SEQ=$2; shift 2 ;;
        --keep) WORK=$2; shift 2 ;;
        -h | --help) vmq_usage "$0"; exit 0 ;;
        *) vmq_die "unknown argument: $1 (see --help)" ;;
    esac
done
[[ $ROLE =~ ^(server|client)$ ]] || vmq_die "--role must be server or client"
[[ $SEQ =~ ^[1-4](,[1-4])*$ ]] || vmq_die "--sequence must be queue counts 1..4, comma-separated"
vmq_need_root
if [[ -z $WORK ]]; then WORK=$(mktemp -d /tmp/vhostmq-e2e-queues.XXXXXX); else mkdir -p "$WORK"; WORK=$(cd "$WORK" && pwd); fi
vmq_init
T0=$(vmq_now)
vmq_build_guest

IFS=, read -r -a STEPS <<<"$SEQ"
export VHOSTMQ_GUEST_SMP=2
VMQ_TG_GUEST_S=$((120 + 12 * ${#STEPS[@]}))
VMQ_TG_BACKEND_S=$((VMQ_TG_GUEST_S + 60))
vmq_tg_setup "$WORK" "$ROLE" 4
vmq_log "work dir $WORK, role $ROLE, sequence $SEQ (${#STEPS[@]} changes), guests with 2 vCPUs"
vmq_tg_boot churn "vmq.churn=$SEQ" vmq.churnpause=2

# counters NAME: "tx rx" packets of each of port NAME's pairs, one pair a line
counters() {
    jq -r --arg p "$1" '.ports[] | select(.name == $p) | .queues[] | "\(.txPackets) \(.rxPackets)"' "$VMQ_TG_STATS"
}
la=${VMQ_GUEST_LOG[a]}
mapfile -t prev < <(counters a)
table=("step queues tx_frames_per_pair rx_frames_per_pair iperf_mbps result")
for i in "${!STEPS[@]}"; do
    step=$((i + 1)) k=${STEPS[i]}
    if ! vmq_guest_wait a "^VHOSTMQ-RESULT churn step=$step queues=$k phase=done " 120; then
        vmq_fail "step $step (combined $k): the guest did not finish its traffic"
        break
    fi
    sleep 0.8 # the stats file is rewritten every 500 ms
    mapfile -t cur < <(counters a)
    line=$(tr -d '\r' <"$la" | grep "^VHOSTMQ-RESULT churn step=$step queues=$k phase=done " | tail -n1)
    rc=$(sed -n 's/.* rc=\([0-9]*\).*/\1/p' <<<"$line")
    mbps=$(sed -n 's/.* receiver_mbps=\([0-9.]*\).*/\1/p' <<<"$line")
    txs="" rxs="" ok=1
    for ((p = 0; p < 4; p++)); do
        read -r t0 r0 <<<"${prev[p]:-0 0}"
        read -r t1 r1 <<<"${cur[p]:-0 0}"
        dt=$((t1 - t0)) dr=$((r1 - r0))
        txs+="${txs:+/}$dt" rxs+="${rxs:+/}$dr"
        if ((p < k && (dt == 0 || dr == 0))); then
            ok=0
            vmq_fail "step $step (combined $k): enabled pair $p of port a carried tx $dt, rx $dr frames (guest: $(sed -n 's/.*\(tx_q'$p'=[0-9]*\).*/\1/p' <<<"$line"))"
        fi
    done
    [[ $rc == 0 ]] || { ok=0; vmq_fail "step $step (combined $k): iperf3 failed (rc=$rc)"; }
    table+=("$step $k $txs $rxs ${mbps:-?} $([[ $ok == 1 ]] && echo ok || echo FAIL)")
    prev=("${cur[@]}")
done
stalls=$(jq '[.ports[].queues[].stalls] | add // 0' "$VMQ_TG_STATS")
held=$(jq '[.ports[].queues[].held] | add // 0' "$VMQ_TG_STATS")
expired=$(jq '[.ports[].queues[].drops.rxHoldExpired] | add // 0' "$VMQ_TG_STATS")
nobuf=$(jq '[.ports[].queues[].drops.rxNoBuffer] | add // 0' "$VMQ_TG_STATS")
if [[ $stalls == 0 ]]; then vmq_ok "the stall watchdog found no stalled ring"; else vmq_fail "the stall watchdog healed $stalls stalls (see the dataplane log)"; fi
vmq_tg_teardown

echo
echo "===== vhostmq e2e-queues ($ROLE role, $(vmq_elapsed "$T0") s) ====="
printf '%s\n' "${table[@]}" | vmq_table
echo "stalls $stalls, frames held $held, holds expired $expired, rxNoBuffer drops $nobuf"
echo "work dir (logs, config, stats): $WORK"
if vmq_fails_report; then
    echo "e2e-queues: PASSED"
else
    echo "e2e-queues: FAILED"
    exit 1
fi
