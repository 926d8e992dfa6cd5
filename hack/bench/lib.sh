#!/usr/bin/env bash
# Process and DPDK helpers run.sh and flows.sh share (sourced after ../lib.sh).

# untrack PID: forget a process once it is reaped, so that the exit trap
# never signals a recycled PID
untrack() {
    local i
    for i in "${!VMQ_PIDS[@]}"; do [[ ${VMQ_PIDS[i]} == "$1" ]] && unset 'VMQ_PIDS[i]'; done
    VMQ_PIDS=("${VMQ_PIDS[@]}")
}
stop_pid() { # stop_pid PID [GRACE]: stop, reap, untrack; VMQ_RC = exit status
    [[ -n $1 ]] || return 0
    vmq_stop "$1" "${2:-8}"
    untrack "$1"
}
dpdk_forget() { # remove what a finished DPDK process left behind
    rm -rf -- "/var/run/dpdk/$1"
    rm -f -- /dev/hugepages/"$1"map_* /dev/hugepages/"$1"-*
}
