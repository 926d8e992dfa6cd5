#!/usr/bin/env bash
# End-to-end test: two QEMU guests (TCG, 1 vCPU, 512 MiB memfd share=on) with
# a vhost-user multiqueue virtio-net-pci NIC each, switched by the vhostmq
# dataplane (bin/vhostmq-dataplane --config FILE, two ports "a" and "b").
#
#   guest a (10.0.0.1): ping b, iperf3 -P 32 forward and -P 32 -R reverse
#   guest b (10.0.0.2): iperf3 server
#
# Roles (who listens on the vhost-user socket):
#   server  the dataplane listens; QEMU dials with -chardev socket,reconnect=1
#   client  QEMU listens (server=on,wait=off); the dataplane dials.  Also a
#           reconnect test: while a pings b continuously, the dataplane is
#           SIGKILLed, kept down ~2 s and restarted with the same config; the
#           pings must resume without restarting the guests.  Outage measured.
#   both    server, then client (default)
#
# Offloads (checksum, TSO, ECN negotiated with the dataplane):
#   on      both guests use them: their TCP segments cross whole (64 KiB GSO
#           frames, one copy); asserted: gsoWhole>0 at both ports
#   off     both guests turn them off (ethtool -K, vmq.offloads=off): plain
#           frames; asserted: no GSO frame and no partial checksum seen
#   mixed   guest b's NIC negotiates no GUEST_* offload (QEMU guest_csum=off,
#           guest_tso4/6=off, guest_ecn=off): what a sends b is segmented
#           and checksummed by the dataplane; asserted: gsoSegmented>0 and
#           csumSoftware>0 at b, gsoWhole>0 at a (b still sends TSO)
#   Every mode: no frame dropped for a bad offload header.
#
# Asserted: both guests use N rx + N tx queues; ping works; iperf3 succeeds
# both ways with a rate > 0 (TCG-bound, ~0.5 Gbit/s); every queue each
# guest put frames on or read frames from during the traffic (its own
# ethtool -S counters: which queues it uses is its XPS and flow hash's
# choice) was served on that pair in the dataplane's stats; the offload
# counters above; the dataplane exits 0 on SIGTERM; reconnect recovers.
#
# Usage: hack/e2e-qemu.sh [--role server|client|both] [--queues 4] [--keep DIR]
#          [--streams 32] [--time 5] [--reconnect auto|yes|no] [--down 2]
#          [--offloads on|off|mixed]
#   --role both    three runs: server with offloads on, client with offloads
#                  off (and the reconnect test), server with offloads mixed;
#                  --offloads is ignored then
#   --keep DIR     work dir for logs, configs, sockets and stats (default: a
#                  new /tmp/vhostmq-e2e-qemu.XXXXXX); printed at the end, kept
#   --reconnect    auto = only in the client role
# Environment: VHOSTMQ_DATAPLANE (binary), VHOSTMQ_BACKEND=testpmd (stand-in
#   backend for developing this script), VHOSTMQ_DP_CPUS; see hack/lib.sh.
# Needs root and hack/install-deps.sh; builds the guest image if needed.
# Exit status: 0 when every assertion held.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$HERE/lib.sh"

ROLE=both QUEUES=4 WORK="" STREAMS=32 ITIME=5 RECONNECT=auto DOWN=2 OFFLOADS=on
vmq_args --role=ROLE --queues=QUEUES --keep=WORK --streams=STREAMS --time=ITIME --reconnect=RECONNECT \
    --down=DOWN --offloads=OFFLOADS -- "$@"
[[ $ROLE =~ ^(server|client|both)$ ]] || vmq_die "--role must be server, client or both"
[[ $QUEUES =~ ^[1-9][0-9]*$ ]] || vmq_die "--queues must be a positive number"
[[ $RECONNECT =~ ^(auto|yes|no)$ ]] || vmq_die "--reconnect must be auto, yes or no"
[[ $OFFLOADS =~ ^(on|off|mixed)$ ]] || vmq_die "--offloads must be on, off or mixed"
vmq_need_root
vmq_workdir vhostmq-e2e-qemu
vmq_init
T0=$(vmq_now)
vmq_build_guest

# ---------------------------------------------------------------- both: one child run per role
if [[ $ROLE == both ]]; then
    RUNS=(server:on client:off server:mixed)
    for run in "${RUNS[@]}"; do
        r=${run%:*} o=${run#*:}
        vmq_log "===== role $r, offloads $o ====="
        vmq_rerun "$WORK/$r-$o" --role "$r" --offloads "$o"
    done
    # row I: run I's columns, from its result.env
    # shellcheck disable=SC2317  # called by vmq_rerun_summary
    row() {
        local avg=${rtt_ms:-?/?/?}
        avg=${avg#*/}
        echo "${RUNS[$1]%:*} ${RUNS[$1]#*:} ${queues:-?} ${boot_s_a:-?}/${boot_s_b:-?} ${avg%/*} ${gbps_forward:-?} ${gbps_reverse:-?}" \
            "${gso_whole_a:-?}/${gso_whole_b:-?} ${gso_segmented_b:-?} ${reconnect:--} ${reconnect_first_ok_s:--} ${reconnect_outage_s:--}"
    }
    vmq_rerun_summary e2e-qemu "role offloads queues boot_a/b_s ping_rtt_avg_ms fwd_gbit/s rev_gbit/s gso_whole_a/b gso_segmented_b reconnect first_reply_s outage_s" row
    exit 0 # (a failed verdict ends it with status 1: set -e)
fi

# ---------------------------------------------------------------- one role
VMQ_TAG=e2e-qemu/$ROLE
DO_RECONNECT=0
[[ $RECONNECT == yes || ($RECONNECT == auto && $ROLE == client) ]] && DO_RECONNECT=1
AROLES=client,idle   # stay up: the host checks "connected" and stops the guests itself
((DO_RECONNECT)) && AROLES=client,pinger

GUEST_ARGS=("vmq.streams=$STREAMS" "vmq.time=$ITIME")
case $OFFLOADS in
    off) GUEST_ARGS+=(vmq.offloads=off) ;;
    mixed) VMQ_GUEST_DEV_OPTS[b]=guest_csum=off,guest_tso4=off,guest_tso6=off,guest_ecn=off ;;
esac

# offload_counters: the per-port offload counters (summed over queue pairs)
# from the stats file into VMQ_RES, then the assertions of the mode
offload_counters() {
    local g k v
    local -A names=([gsoWhole]=gso_whole [gsoSegmented]=gso_segmented [csumSoftware]=csum_software [badOffload]=bad_offload)
    for g in a b; do
        for k in "${!names[@]}"; do
            v=$(jq -r --arg p "$g" --arg k "$k" '[.ports[] | select(.name == $p) | .queues[] |
                (.offload[$k] // .drops[$k] // 0)] | add // 0' "$VMQ_TG_STATS" 2>/dev/null)
            vmq_res "${names[$k]}_$g" "${v:-?}"
        done
    done
    vmq_log "offload counters: gso whole a/b ${VMQ_RES[gso_whole_a]}/${VMQ_RES[gso_whole_b]}," \
        "segmented a/b ${VMQ_RES[gso_segmented_a]}/${VMQ_RES[gso_segmented_b]}," \
        "checksums completed a/b ${VMQ_RES[csum_software_a]}/${VMQ_RES[csum_software_b]}," \
        "bad headers a/b ${VMQ_RES[bad_offload_a]}/${VMQ_RES[bad_offload_b]}"
    gt0() { [[ ${VMQ_RES[$1]} =~ ^[0-9]+$ ]] && ((VMQ_RES[$1] > 0)); }
    is0() { [[ ${VMQ_RES[$1]} == 0 ]]; }
    for g in a b; do is0 "bad_offload_$g" || vmq_fail "offloads: port $g dropped ${VMQ_RES[bad_offload_$g]} frames for bad offload headers"; done
    case $OFFLOADS in
        on)
            for g in a b; do gt0 "gso_whole_$g" || vmq_fail "offloads on: no GSO frame reached $g whole"; done
            for g in a b; do is0 "gso_segmented_$g" || vmq_fail "offloads on: ${VMQ_RES[gso_segmented_$g]} GSO frames segmented for $g, which takes them whole"; done
            ;;
        off)
            for g in a b; do
                for k in gso_whole gso_segmented csum_software; do
                    is0 "${k}_$g" || vmq_fail "offloads off: $k at $g is ${VMQ_RES[${k}_$g]}, want 0"
                done
            done
            ;;
        mixed)
            gt0 gso_segmented_b || vmq_fail "offloads mixed: no GSO frame segmented for b"
            gt0 csum_software_b || vmq_fail "offloads mixed: no checksum completed for b"
            gt0 gso_whole_a || vmq_fail "offloads mixed: no GSO frame reached a whole"
            is0 gso_whole_b || vmq_fail "offloads mixed: ${VMQ_RES[gso_whole_b]} GSO frames reached b whole, which takes none"
            ;;
    esac
}

vmq_tg_setup "$WORK" "$ROLE" "$QUEUES"
vmq_log "work dir $WORK, backend $VMQ_BACKEND, $QUEUES queue pairs, guest a roles $AROLES, offloads $OFFLOADS"
vmq_res offloads "$OFFLOADS"
vmq_tg_boot "$AROLES" "${GUEST_ARGS[@]}"
for g in a b; do
    vmq_log "guest $g offloads: $(vmq_result_line "${VMQ_GUEST_LOG[$g]}" offloads)"
done
if vmq_tg_traffic; then
    offload_counters
    ((DO_RECONNECT)) && vmq_tg_reconnect "$DOWN"
elif ((DO_RECONNECT)); then
    vmq_res reconnect skipped
    vmq_fail "reconnect test skipped: no traffic between the guests to begin with"
fi
vmq_tg_teardown
vmq_res wall_s "$(vmq_elapsed "$T0")"

vmq_tg_summary
echo
echo "wall time ${VMQ_RES[wall_s]} s; work dir (logs, config, stats): $WORK"
vmq_verdict "e2e-qemu role=$ROLE"
