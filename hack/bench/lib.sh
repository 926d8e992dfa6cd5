#!/usr/bin/env bash
# Process and DPDK helpers run.sh, flows.sh and instructions.sh share (sourced after ../lib.sh).

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

# link_up PREFIX NPORTS SECONDS: wait until every port of a testpmd reports link up
link_up() {
    "$VMQ_PY" - "$@" <<'PY'
import json, socket, sys, time
prefix, n, end = sys.argv[1], int(sys.argv[2]), time.monotonic() + float(sys.argv[3])
while time.monotonic() < end:
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        s.settimeout(2)
        s.connect("/var/run/dpdk/%s/dpdk_telemetry.v2" % prefix)
        s.recv(1 << 16)
        up = 0
        for i in range(n):
            s.send(("/ethdev/link_status,%d" % i).encode())
            up += json.loads(s.recv(1 << 16).decode())["/ethdev/link_status"].get("status") == "UP"
        s.close()
        if up == n:
            sys.exit(0)
    except (OSError, ValueError, KeyError):
        pass
    time.sleep(0.1)
sys.exit(1)
PY
}
