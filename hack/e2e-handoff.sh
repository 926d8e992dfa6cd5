#!/usr/bin/env bash
# End-to-end test of an upgrade without a gap (#17): two QEMU guests (TCG,
# 1 vCPU, 512 MiB memfd share=on) with 4 queue pairs each run traffic
# through the dataplane while a rebuilt dataplane binary starts on the same
# config and state directory and takes their live vhost-user sessions over
# (handoff.sock); the old process then serves nothing and is stopped.
#
#   guest a (10.0.0.1): pings b every 10 ms while iperf3 -P 16 runs forward
#                       and then reverse (vmq.bgping), the handoff half way
#                       through the forward run
#   guest b (10.0.0.2): iperf3 server
#   both: report eth0's carrier_changes whenever it moves (vmq.carrierwatch)
#
# Asserted: the successor adopted both live sessions and connected no
# frontend anew (its log), the old process handed them over and exits 0 on
# SIGTERM; neither guest's carrier_changes moved (QEMU shows a guest a link
# down/up when its backend goes away: with a reconnect it moves by 2);
# iperf3 succeeded both ways; the pings were answered to the end, and no
# run of lost pings that began within 1.5 s of the switch is longer than
# both 3 (50 ms at 10 ms) and the longest run elsewhere in the same run
# (the load's own, the baseline); the successor's stats show both ports
# connected and every queue the guests used (their own counters) served.
# Reported: the longest ping gap,
# where it fell against the switch and in how many runs pings were lost,
# how long the rings stood still (the old process's freeze to the
# successor serving; the old side's freeze to Taken) and the successor's
# hello to serving.
#
# --baseline ROLE adds one run of what an upgrade was before: the old
# process SIGKILLed, the rebuilt one started (the frontends reconnect).
# There the carrier_changes must move (else the detector is blind) and the
# gap is reported beside the handoff's.
#
# Usage: hack/e2e-handoff.sh [--role server|client|both] [--queues 4]
#          [--time 12] [--at 4] [--baseline server|client|none] [--keep DIR]
#   --role both   server, then client (default)
#   --time S      seconds of each iperf3 direction
#   --at S        seconds into the forward run at which the successor starts
#   --keep DIR    work dir (default: a new /tmp/vhostmq-e2e-handoff.XXXXXX)
# Needs root, Go (to rebuild the dataplane) and hack/install-deps.sh.
# Exit status: 0 when every assertion held.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$HERE/lib.sh"

ROLE=both QUEUES=4 ITIME=12 AT=4 WORK="" BASELINE=none
vmq_args --role=ROLE --queues=QUEUES --time=ITIME --at=AT --baseline=BASELINE --keep=WORK -- "$@"
[[ $ROLE =~ ^(server|client|both)$ ]] || vmq_die "--role must be server, client or both"
[[ $BASELINE =~ ^(server|client|none)$ ]] || vmq_die "--baseline must be server, client or none"
[[ $QUEUES =~ ^[1-9][0-9]*$ && $ITIME =~ ^[1-9][0-9]*$ && $AT =~ ^[0-9]+$ ]] || vmq_die "--queues, --time and --at are numbers"
((AT < ITIME)) || vmq_die "--at must be less than --time (the handoff happens during the forward run)"
vmq_need_root
vmq_workdir vhostmq-e2e-handoff
vmq_init
T0=$(vmq_now)
VMQ_TAG=e2e-handoff
[[ $VMQ_BACKEND == dataplane ]] || vmq_die "the handoff is the dataplane's: VHOSTMQ_BACKEND must be dataplane"
vmq_build_guest

# The successor: the same source rebuilt, told apart by its version.
NEXT=$WORK/vhostmq-dataplane.next
NEXT_VERSION=rebuilt-$(date +%s)
vmq_log "rebuilding the dataplane as $NEXT (version $NEXT_VERSION)"
(cd "$VMQ_REPO_ROOT" && go build -ldflags "-X github.com/vhostmq/vhostmq/dataplane/agent.Version=$NEXT_VERSION" \
    -o "$NEXT" ./cmd/vhostmq-dataplane) || vmq_die "go build of the successor failed"
cmp -s "$NEXT" "$VMQ_DATAPLANE" && vmq_die "the rebuilt binary is the same file as $VMQ_DATAPLANE"


# run_role ROLE handoff|restart
run_role() {
    local role=$1 mode=$2 work=$WORK/$1-$2 old_pid old_log new_log g v line
    VMQ_TAG=e2e-handoff/$role/$mode
    VMQ_TG_INTERVAL=0.01
    VMQ_TG_GUEST_S=300 VMQ_TG_BACKEND_S=360
    vmq_tg_setup "$work" "$role" "$QUEUES"
    # 16 streams: the queues the guests use (their choice) carry some
    # after the handoff too (the successor's counters start there)
    vmq_tg_boot client,idle vmq.bgping=1 vmq.carrierwatch=1 vmq.streams=16 "vmq.time=$ITIME"
    old_pid=$VMQ_BE_PID old_log=$VMQ_BE_LOG
    for g in a b; do
        vmq_guest_wait "$g" '^VHOSTMQ-RESULT carrier ' 30 || vmq_fail "guest $g reported no carrier_changes"
    done
    # the forward run starts after a's 5 pings (about 1 s)
    vmq_guest_wait a '^VHOSTMQ-RESULT ping ' 120 || { vmq_fail "guest a did not reach b"; vmq_tg_teardown; return; }
    # guest a's pings every 10 ms start now (give or take the log poll)
    local t_ping t_start t_switch
    t_ping=$(vmq_now)
    sleep "$AT"
    t_start=$(vmq_now)
    t_switch=$t_start
    if [[ $mode == restart ]]; then
        vmq_log "baseline: SIGKILL the old dataplane, start the rebuilt one (the frontends reconnect)"
        vmq_crash "$old_pid"
    fi
    VMQ_DATAPLANE_SAVED=$VMQ_DATAPLANE
    VMQ_DATAPLANE=$NEXT
    vmq_backend_start "$work" "$VMQ_TG_CFG" "$VMQ_TG_STATS" "$VMQ_TG_BACKEND_S"
    VMQ_DATAPLANE=$VMQ_DATAPLANE_SAVED
    new_log=$VMQ_BE_LOG
    if [[ $mode == restart ]]; then
        :
    elif vmq_wait_log "$new_log" 'handoff done: serving' 30 "$VMQ_BE_PID"; then
        line=$(grep -a -m1 'handoff done: serving' "$new_log")
        vmq_res handoff_adopted "$(vmq_kv "$line" adopted)"
        vmq_res handoff_successor_s "$(vmq_kv "$line" sinceHello)"
        vmq_res handoff_frozen "$(vmq_kv "$line" sinceFreeze)"
        vmq_res handoff_start_to_serving_s "$(vmq_elapsed "$t_start")"
        t_switch=$(vmq_now)
        [[ ${VMQ_RES[handoff_adopted]} == 2 ]] || vmq_fail "the successor adopted ${VMQ_RES[handoff_adopted]} sessions, want 2: $line"
    else
        vmq_fail "the successor did not take the ports over (see $new_log)"
        tail -n 20 "$new_log" | sed 's/^/    | /' >&2 || true
    fi
    if [[ $mode == restart ]]; then
        :
    elif vmq_wait_log "$old_log" 'handoff done: the successor serves' 30 "$old_pid" &&
        line=$(grep -a -m1 'handoff done: the successor serves' "$old_log"); then
        vmq_res handoff_pause "$(vmq_kv "$line" pause)"
        vmq_ok "handoff: the rings stopped for ${VMQ_RES[handoff_frozen]:-?} (the old process's freeze to the successor serving; ${VMQ_RES[handoff_pause]} to Taken); the successor served ${VMQ_RES[handoff_successor_s]:-?} after its hello, ${VMQ_RES[handoff_start_to_serving_s]:-?} s after it started"
    else
        vmq_fail "the old process did not hand the ports over (see $old_log)"
    fi
    if [[ $mode == handoff ]]; then
        vmq_stop "$old_pid" 12
        vmq_res old_exit "$VMQ_RC"
        [[ $VMQ_RC == 0 ]] || vmq_fail "the old process exited $VMQ_RC on SIGTERM after the handoff, want 0"
        v=$(vmq_count_log "$new_log" 'msg="frontend connected"')
        [[ $v == 0 ]] || vmq_fail "the successor connected $v frontends anew (a reconnect, not a handoff; see $new_log)"
        v=$(vmq_count_log "$new_log" 'frontend session adopted from the previous process')
        [[ $v == 2 ]] || vmq_fail "the successor adopted $v sessions, want 2 (see $new_log)"
    fi

    # guest a's client role: iperf3 both ways, then its pings' summary
    vmq_tg_traffic || true
    local la=${VMQ_GUEST_LOG[a]}
    if vmq_guest_wait a '^VHOSTMQ-RESULT pings ' 30; then
        local t_end sent first
        t_end=$(vmq_now)
        sent=$(vmq_result "$la" pings sent) first=$(vmq_result "$la" pings first_seq)
        # from_switch SEQ...: seconds from the switch to when each sequence
        # number was sent, the pings spread evenly over the host's time from
        # their start to their summary (a loaded TCG guest sends fewer than
        # one per interval, so its own clock would drift)
        from_switch() { awk -v f="$first" -v n="$sent" -v a="$t_ping" -v b="$t_switch" -v e="$t_end" \
            '$1 ~ /^[0-9]+$/ && n > 0 { printf "%+.2f %s\n", a + ($1 - f) / n * (e - a) - b, $2 }'; }
        vmq_res pings "$(vmq_result "$la" pings received)/$(vmq_result "$la" pings sent)"
        vmq_res max_gap_ms "$(vmq_result "$la" pings max_gap_ms)"
        vmq_res max_rtt_ms "$(vmq_result "$la" pings max_rtt_ms)"
        vmq_ok "pings every 10 ms across the handoff: ${VMQ_RES[pings]} answered, longest gap ${VMQ_RES[max_gap_ms]} ms, longest round trip ${VMQ_RES[max_rtt_ms]} ms"
        # Where the longest gap fell against the switch (the successor
        # serving; in the baseline the kill): a gap seconds away from it was
        # the load, not the handoff.
        v=$(vmq_result "$la" pings gap_seq)
        if [[ $v =~ ^[0-9]+$ ]] && ((v > 0)); then
            vmq_res gap_from_switch_s "$(from_switch <<<"$v" | cut -d' ' -f1)"
        else
            vmq_res gap_from_switch_s -
        fi
        vmq_res lost_runs "$(vmq_result "$la" pings lost_runs)"
        vmq_log "the longest gap began ${VMQ_RES[gap_from_switch_s]} s from the switch (estimate from sequence numbers); pings were lost in ${VMQ_RES[lost_runs]} separate runs"
        # The handoff's own gap (#17: under 50 ms, 4 pings at 10 ms)
        # against this run's own baseline: runs of lost pings that began
        # within 1.5 s of the switch (the estimate of when a ping was sent
        # is off by up to 0.6 s in the baseline) compared with the longest
        # run elsewhere in the same run, under the same load (16 iperf3
        # streams and two TCG guests on two cores, and whatever else the
        # machine does). The switch may add no gap the load does not make.
        local runs near far limit
        runs=$(vmq_result "$la" pings long_runs | tr ',+' '\n ' | from_switch)
        near=$(awk '$1 > -1.5 && $1 < 1.5 && $2 > m { m = $2 } END { print m + 0 }' <<<"$runs")
        far=$(awk '($1 <= -1.5 || $1 >= 1.5) && $2 > m { m = $2 } END { print m + 0 }' <<<"$runs")
        limit=$((far > 3 ? far : 3))
        vmq_res lost_near_switch "$near"
        vmq_res lost_elsewhere "$far"
        if [[ $mode == handoff ]] && ((near > limit)); then
            vmq_fail "pings lost at the switch: a run of $near (from $(awk -v n="$near" '$2 == n { print $1; exit }' <<<"$runs") s), longer than the longest run elsewhere in this run ($far) and than 3 (runs of 4+: $(vmq_result "$la" pings long_runs))"
        elif [[ $mode == handoff ]]; then
            vmq_ok "the switch lost no more pings in a row ($near) than the load did elsewhere in the same run ($far; 3 at least: under 50 ms at 10 ms)"
        fi
        v=$(vmq_result "$la" pings last_seq)
        if ! [[ $v =~ ^[0-9]+$ ]] || (($(vmq_result "$la" pings sent) - v >= 100)); then
            vmq_fail "pings stopped being answered: $(vmq_result_line "$la" pings)"
        fi
    else
        vmq_fail "guest a reported no pings"
    fi
    for g in a b; do
        v=$(vmq_carrier_values "$g")
        vmq_res "carrier_changes_$g" "$v"
        if [[ $mode == restart ]]; then
            if [[ $v == *,* ]]; then
                vmq_ok "baseline: guest $g saw the reconnect as link down/up (carrier_changes $v)"
            else
                vmq_fail "baseline: guest $g's carrier_changes did not move ($v): the detector would miss a reconnect"
            fi
        elif [[ $v =~ ^[0-9]+$ ]]; then
            vmq_ok "guest $g: carrier_changes stayed $v (no link down/up)"
        else
            vmq_fail "guest $g: carrier_changes moved: $v"
        fi
    done
    for g in a b; do
        [[ $(vmq_stats_port "$VMQ_TG_STATS" "$g" connected "") == true ]] || vmq_fail "port $g is not connected at the end"
    done
    vmq_tg_teardown
    [[ $VMQ_RC == 0 ]] || vmq_fail "the successor exited $VMQ_RC on SIGTERM, want 0"
}

RUNS=("$ROLE:handoff")
[[ $ROLE == both ]] && RUNS=(server:handoff client:handoff)
[[ $BASELINE == none ]] || RUNS+=("$BASELINE:restart")
for run in "${RUNS[@]}"; do
    vmq_log "===== role ${run%:*}, ${run#*:} ====="
    run_role "${run%:*}" "${run#*:}"
done
echo
echo "===== vhostmq e2e-handoff summary ($(vmq_elapsed "$T0") s) ====="
{
    echo "role upgrade queues fwd_gbit/s rev_gbit/s pings longest_gap_ms gap_from_switch_s lost_runs lost_in_a_row(switch/elsewhere) frozen(freeze->serving) pause(old) successor(hello->serving) carrier_a/b"
    for run in "${RUNS[@]}"; do
        ( # one run's result.env, in a subshell of its own
            # shellcheck disable=SC1090
            [[ -f $WORK/${run%:*}-${run#*:}/result.env ]] && source "$WORK/${run%:*}-${run#*:}/result.env"
            echo "${run%:*} ${run#*:} ${queues:-?} ${gbps_forward:-?} ${gbps_reverse:-?} ${pings:-?} ${max_gap_ms:-?} ${gap_from_switch_s:--} ${lost_runs:--} ${lost_near_switch:--}/${lost_elsewhere:--} ${handoff_frozen:--} ${handoff_pause:--} ${handoff_successor_s:--} ${carrier_changes_a:-?}/${carrier_changes_b:-?}"
        )
    done
} | vmq_table
echo "work dir: $WORK"
vmq_verdict e2e-handoff
