#!/usr/bin/env bash
# How long an upgrade stops the rings, quiet and beside other work (#33):
# two QEMU guests (TCG, 4 queue pairs, 1 vCPU) run iperf3 and ping each
# other every 10 ms through the dataplane, which hands its live ports to a
# successor --runs times in a row (two builds taking turns, as
# hack/e2e-handoff.sh does once), first with nothing else running, then
# with each load of --loads beside it for the whole series:
#
#   none   nothing else
#   cpu    stress-ng --cpu 2: both cores busy
#   vm     stress-ng --vm 2 --vm-bytes 1G: memory written and read back
#   fault  stress-ng --fault 2: minor and major page faults
#   fork   stress-ng --fork 2: processes made and reaped
#   mixed  stress-ng --cpu 1 --vm 1 --vm-bytes 1G --fault 1 --fork 1
#   crowd  stress-ng --cpu 6 --vm 2 --vm-bytes 512M --fault 2: ten busy
#          tasks on two cores, a long run queue (a busy node's)
#
# Per handoff, from the two processes' own logs: frozen (the old process
# stopped its rings until the successor served them, on one clock), the
# old process's freeze to Taken, the successor's hello to serving and its
# start (first log line) to serving; and whether a guest saw its link go
# down (carrier_changes moved: a reconnect, not a handoff). Printed: each
# handoff, then p50 and max per load, with the CPU pressure during the
# series (PSI: the share of time some task waited for a CPU). Nothing is asserted: this is a measurement;
# make test's hack/e2e-handoff.sh asserts what the guests see.
#
# Usage: hack/bench/handoff.sh [--runs 10] [--loads none,cpu,vm,fault,fork,mixed,crowd]
#          [--role client|server] [--nice N] [--keep DIR]
#   --nice N   run the dataplanes at nice N (e.g. -10): what a higher CPU
#              priority does to the frozen time under load
# Needs root, Go, QEMU and stress-ng (hack/install-deps.sh). About 1 min
# per load at 10 runs.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=../lib.sh
source "$HERE/../lib.sh"
VMQ_TAG=bench-handoff

RUNS=10 LOADS=none,cpu,vm,fault,fork,mixed,crowd ROLE=client WORK="" NICE=""
vmq_args --runs=RUNS --loads=LOADS --role=ROLE --nice=NICE --keep=WORK -- "$@"
[[ $RUNS =~ ^[1-9][0-9]*$ ]] || vmq_die "--runs must be a positive number"
[[ -z $NICE || $NICE =~ ^-?[0-9]+$ ]] || vmq_die "--nice must be a number (-20..19)"
[[ $ROLE =~ ^(server|client)$ ]] || vmq_die "--role must be server or client"
[[ $LOADS =~ ^(none|cpu|vm|fault|fork|mixed|crowd)(,(none|cpu|vm|fault|fork|mixed|crowd))*$ ]] ||
    vmq_die "--loads must name none, cpu, vm, fault, fork, mixed or crowd, comma-separated"
vmq_need_root
command -v stress-ng >/dev/null || vmq_die "stress-ng not found: hack/install-deps.sh installs it"
vmq_workdir vhostmq-bench-handoff
vmq_init
[[ $VMQ_BACKEND == dataplane ]] || vmq_die "the handoff is the dataplane's: VHOSTMQ_BACKEND must be dataplane"
vmq_build_guest

# Two builds that take turns: the successor must be another binary (its
# version tells them apart in the logs).
BINS=()
for v in a b; do
    BINS+=("$WORK/vhostmq-dataplane.$v")
    (cd "$VMQ_REPO_ROOT" && go build -ldflags "-X github.com/vhostmq/vhostmq/dataplane/agent.Version=bench-$v" \
        -o "$WORK/vhostmq-dataplane.$v" ./cmd/vhostmq-dataplane) || vmq_die "go build of the dataplane failed"
    if [[ -n $NICE ]]; then
        printf '#!/bin/sh\nexec nice -n %s %s "$@"\n' "$NICE" "$WORK/vhostmq-dataplane.$v" >"$WORK/nice.$v"
        chmod +x "$WORK/nice.$v"
        BINS[-1]=$WORK/nice.$v
    fi
done

load_args() {
    case $1 in
        cpu) echo "--cpu 2" ;;
        vm) echo "--vm 2 --vm-bytes 1G" ;;
        fault) echo "--fault 2" ;;
        fork) echo "--fork 2" ;;
        mixed) echo "--cpu 1 --vm 1 --vm-bytes 1G --fault 1 --fork 1" ;;
        crowd) echo "--cpu 6 --vm 2 --vm-bytes 512M --fault 2" ;;
    esac
}
# logtime LINE: seconds since the epoch of a dataplane log line's time=
logtime() { sed -n 's/^time=\([^ ]*\) .*/\1/p' <<<"$1" | xargs -r -I{} date -d {} +%s.%N; }
# dur D: a Go duration (1.5ms, 2.1s, 300µs) in milliseconds
dur() {
    awk -v d="$1" 'BEGIN { v = d + 0; u = d; sub(/^[0-9.]+/, "", u)
        printf "%.2f", (u == "s") ? v * 1000 : (u == "ms") ? v : (u == "µs" || u == "us") ? v / 1000 : (u == "ns") ? v / 1e6 : -1 }'
}

ROWS=("load run frozen_ms freeze_to_taken_ms hello_to_serving_ms start_to_serving_ms")
SUMMARY=("load runs frozen_ms(p50/max) hello_to_serving_ms(p50/max) start_to_serving_ms(p50/max) cpu_psi_some reconnects")
IFS=, read -r -a LOADLIST <<<"$LOADS"
for load in "${LOADLIST[@]}"; do
    work=$WORK/$load
    VMQ_TAG=bench-handoff/$load
    VMQ_TG_INTERVAL=0.01
    VMQ_TG_GUEST_S=$((120 + RUNS * 8)) VMQ_TG_BACKEND_S=$((VMQ_TG_GUEST_S + 60))
    VMQ_DATAPLANE=${BINS[0]}
    vmq_tg_setup "$work" "$ROLE" 4
    vmq_tg_boot client,idle vmq.bgping=1 vmq.carrierwatch=1 vmq.streams=4 "vmq.time=$((RUNS * 4 + 30))"
    vmq_guest_wait a '^VHOSTMQ-RESULT ping ' 120 || vmq_die "guest a did not reach b"
    sleep 2 # iperf3 under way
    spid=""
    if [[ $load != none ]]; then
        # shellcheck disable=SC2046 # the load's arguments are words
        vmq_bg "$work/stress-ng.log" $((RUNS * 10 + 60)) stress-ng $(load_args "$load") --timeout $((RUNS * 10 + 30))
        spid=$VMQ_BG_PID
        sleep 3 # the load under way
    fi
    psi0=$(awk '/^some/ { sub(/total=/, "", $5); print $5 }' /proc/pressure/cpu 2>/dev/null || echo 0)
    t0=$(vmq_now)
    old_pid=$VMQ_BE_PID old_log=$VMQ_BE_LOG
    frozen=() hello=() startsv=()
    for ((r = 1; r <= RUNS; r++)); do
        VMQ_DATAPLANE=${BINS[r % 2]}
        vmq_backend_start "$work" "$VMQ_TG_CFG" "$VMQ_TG_STATS" "$VMQ_TG_BACKEND_S"
        new_pid=$VMQ_BE_PID new_log=$VMQ_BE_LOG
        if ! vmq_wait_log "$new_log" 'handoff done: serving' 30 "$new_pid"; then
            tail -n 20 "$new_log" >&2 || true
            vmq_die "handoff $r under load $load: the successor did not serve (see $new_log)"
        fi
        line=$(grep -a -m1 'handoff done: serving' "$new_log")
        oline=$(grep -a -m1 'handoff done: the successor serves' "$old_log" || true)
        f=$(dur "$(vmq_kv "$line" sinceFreeze)") h=$(dur "$(vmq_kv "$line" sinceHello)") p=$(dur "$(vmq_kv "$oline" pause)")
        s=$(awk -v a="$(logtime "$(head -n1 "$new_log")")" -v b="$(logtime "$line")" 'BEGIN { printf "%.2f", (b - a) * 1000 }')
        frozen+=("$f") hello+=("$h") startsv+=("$s")
        ROWS+=("$load $r $f $p $h $s")
        vmq_log "handoff $r: frozen $f ms (old: freeze to Taken $p ms), hello to serving $h ms, start to serving $s ms"
        vmq_stop "$old_pid" 12
        old_pid=$new_pid old_log=$new_log
        sleep 1
    done
    psi1=$(awk '/^some/ { sub(/total=/, "", $5); print $5 }' /proc/pressure/cpu 2>/dev/null || echo 0)
    psi=$(awk -v a="$psi0" -v b="$psi1" -v t="$(vmq_elapsed "$t0")" 'BEGIN { printf "%.0f%%", (b - a) / 1e4 / t }')
    [[ -n $spid ]] && vmq_stop "$spid" 5
    reconnects=0
    for g in a b; do [[ $(vmq_carrier_values "$g") == *,* ]] && reconnects=$((reconnects + 1)); done
    VMQ_BE_PID=$old_pid VMQ_BE_LOG=$old_log
    vmq_tg_teardown
    stat() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { printf "%s/%s", v[int((NR + 1) / 2)], v[NR] }'; }
    SUMMARY+=("$load $RUNS $(stat "${frozen[@]}") $(stat "${hello[@]}") $(stat "${startsv[@]}") $psi $reconnects")
done

echo
echo "===== vhostmq handoff bench ($ROLE role, $RUNS handoffs per load${NICE:+, dataplanes at nice $NICE}) ====="
printf '%s\n' "${ROWS[@]}" | vmq_table
echo
printf '%s\n' "${SUMMARY[@]}" | vmq_table
echo "frozen: the old process's freeze to the successor serving (the rings stood still); cpu_psi_some: the share of time"
echo "some task waited for a CPU during the series (/proc/pressure/cpu); reconnects: guests whose link went down"
echo "work dir: $WORK"
