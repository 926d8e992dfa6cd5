#!/usr/bin/env bash
# End-to-end test of queue-count changes under traffic, the way the stall
# seen on KubeVirt began: guest a (2 vCPUs, 4 queue pairs) changes its
# queue count with `ethtool -L eth0 combined K` for K in --sequence
# (default 1,4,2,4 three times) and after each change sends 32 iperf3
# flows to guest b; QEMU turns each change into SET_VRING_ENABLE messages.
#
# The guest runs one iperf3 client per vCPU, pinned there, so its XPS map
# puts flows on every enabled queue. Asserted after every change, against
# the guest's own per-queue counters (ethtool -S): on every pair the
# dataplane served each frame the guest put on that TX queue and put each
# frame the guest read from that RX queue (cumulative counts, within a ring
# of each other), and a pair the guest disabled moved nothing during the
# step (the dataplane's counters from the guest's start line on); over the
# run, each pair carried the guest's frames after it was re-enabled; at
# the end: the stall watchdog found nothing
# (vhostmq_queue_stalls_total 0 on both ports), iperf3 succeeded at every
# step. Which queues the guest uses is the guest's choice: a queue it left
# empty in one step is shown in the table, not failed.
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
vmq_args --role=ROLE --sequence=SEQ --keep=WORK -- "$@"
[[ $ROLE =~ ^(server|client)$ ]] || vmq_die "--role must be server or client"
[[ $SEQ =~ ^[1-4](,[1-4])*$ ]] || vmq_die "--sequence must be queue counts 1..4, comma-separated"
vmq_need_root
vmq_workdir vhostmq-e2e-queues
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

# counters NAME: "served rx" frames of each of port NAME's pairs, one pair a
# line, cumulative since the port's frontend connected: served is what the
# dataplane took from the guest's TX ring (forwarded or dropped), rx what it
# put into the guest's RX ring.
counters() {
    jq -r --arg p "$1" '.ports[] | select(.name == $p) | .queues[] |
        "\(.txPackets + .drops.txDisabled + .drops.noDestination + .drops.mtu + .drops.runt + .drops.badOffload + .drops.spoofed) \(.rxPackets)"' "$VMQ_TG_STATS"
}
# The guest counts a TX frame once the dataplane returned its buffer and an
# RX frame once it took it from the ring, so on every pair the dataplane's
# cumulative count is at least the guest's and at most a ring (256 entries,
# not yet reaped or read by the guest) plus a few frames (TCP teardown after
# the guest read its counters) above it.
SLACK=320
la=${VMQ_GUEST_LOG[a]}
declare -A exercised=() disabled=() # pair -> steps the guest sent on it after a re-enable; pair -> was disabled since
table=("step queues guest_tx_per_pair(step) dataplane-guest_tx(total) dataplane-guest_rx(total) iperf_mbps result")
for i in "${!STEPS[@]}"; do
    step=$((i + 1)) k=${STEPS[i]}
    # The host's counters once the guest disabled the queues beyond k (it
    # says start a second after ethtool; the stats file may be 500 ms old):
    # a pair the guest disabled must get nothing from here on.
    if ! vmq_guest_wait a "^VHOSTMQ-RESULT churn step=$step queues=$k phase=start " 120; then
        vmq_fail "step $step (combined $k): the guest did not change its queue count"
        break
    fi
    sleep 0.5
    mapfile -t begin < <(counters a)
    if ! vmq_guest_wait a "^VHOSTMQ-RESULT churn step=$step queues=$k phase=done " 120; then
        vmq_fail "step $step (combined $k): the guest did not finish its traffic"
        break
    fi
    sleep 0.8 # the stats file is rewritten every 500 ms
    mapfile -t cur < <(counters a)
    log=$(tr -d '\r' <"$la")
    first=$(grep "^VHOSTMQ-RESULT churn step=$step queues=$k phase=start " <<<"$log" | tail -n1)
    line=$(grep "^VHOSTMQ-RESULT churn step=$step queues=$k phase=done " <<<"$log" | tail -n1)
    rc=$(vmq_kv "$line" rc) mbps=$(vmq_kv "$line" receiver_mbps)
    gtx="" dtx="" drx="" ok=1
    for ((p = 0; p < 4; p++)); do
        read -r ht hr <<<"${cur[p]:-0 0}"
        if ((p >= k)); then
            # Disabled: the guest lists no counters for it (ethtool -S shows
            # the enabled queues), and the dataplane must use it for nothing.
            disabled[$p]=1
            read -r bt br <<<"${begin[p]:-0 0}"
            gtx+="${gtx:+/}-" dtx+="${dtx:+/}-" drx+="${drx:+/}-"
            if ((ht != bt || hr != br)); then
                ok=0
                vmq_fail "step $step (combined $k): pair $p, which the guest disabled, moved $((ht - bt)) TX and $((hr - br)) RX frames during the step"
            fi
            continue
        fi
        # the guest's own counters (ethtool -S) in its churn lines
        t1=$(vmq_kv "$line" "tx_q$p") r1=$(vmq_kv "$line" "rx_q$p") t0=$(vmq_kv "$first" "tx_q$p") r0=$(vmq_kv "$first" "rx_q$p")
        if [[ -z $t1 || -z $r1 || -z $t0 || -z $r0 ]]; then
            ok=0
            vmq_fail "step $step (combined $k): the guest reported no counters for enabled queue $p (start: ${first:-none}; done: ${line:-none})"
            continue
        fi
        gt=$((t1 - t0))
        gtx+="${gtx:+/}$gt" dtx+="${dtx:+/}$((ht - t1))" drx+="${drx:+/}$((hr - r1))"
        # Every frame the guest put on queue p was served on pair p, and
        # every frame it read from RX queue p was put there by the dataplane.
        if ((ht < t1 || ht > t1 + SLACK)); then
            ok=0
            vmq_fail "step $step (combined $k): pair $p of port a served $ht frames from the guest's TX ring; the guest counts tx_q$p=$t1 (the dataplane's count must be within [$t1, $((t1 + SLACK))])"
        fi
        if ((hr < r1 || hr > r1 + SLACK)); then
            ok=0
            vmq_fail "step $step (combined $k): pair $p of port a put $hr frames into the guest's RX ring; the guest counts rx_q$p=$r1 (the dataplane's count must be within [$r1, $((r1 + SLACK))])"
        fi
        if ((gt > 0)) && [[ $p == 0 || -n ${disabled[$p]:-} ]]; then
            exercised[$p]+="${exercised[$p]:+,}$step"
        fi
    done
    [[ $rc == 0 ]] || { ok=0; vmq_fail "step $step (combined $k): iperf3 failed (rc=$rc)"; }
    table+=("$step $k $gtx $dtx $drx ${mbps:-?} $([[ $ok == 1 ]] && echo ok || echo FAIL)")
done
# Each pair must have carried the guest's frames after it was re-enabled
# (pair 0, never disabled: at all), or the run proved nothing about it.
for ((p = 0; p < 4; p++)); do
    if [[ -n ${exercised[$p]:-} ]]; then
        vmq_ok "pair $p carried the guest's traffic after a re-enable in steps ${exercised[$p]}, served frame for frame"
    else
        vmq_fail "the guest never sent on queue $p after re-enabling it (guest tx per pair and step in the table): the run did not exercise pair $p"
    fi
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
vmq_verdict e2e-queues
