#!/usr/bin/env bash
# shellcheck disable=SC2034  # globals are read by the scripts that source this file
# What the benchmark scripts share: processes, DPDK, arguments, their results
# folder and meta.txt (sourced after ../lib.sh).

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

# posint OPTION VALUE: dies unless VALUE is a positive integer
posint() { [[ $2 =~ ^[1-9][0-9]*$ ]] || vmq_die "$1 must be a positive integer, not '$2'"; }

# bench_setup NAME TMPNAME: OUT, the results (default
# _output/bench/NAME<UTC time>), with logs/, made absolute; the exit trap
# (vmq_init); WORK, a short private folder for sockets (AF_UNIX paths are
# short: /tmp/TMPNAME.XXXXXX), removed at exit; T0
bench_setup() {
    [[ -n $OUT ]] || OUT=$VMQ_REPO_ROOT/_output/bench/$1$(date -u +%Y%m%dT%H%M%SZ)
    mkdir -p "$OUT/logs"
    OUT=$(cd "$OUT" && pwd)
    vmq_init
    WORK=$(mktemp -d "/tmp/$2.XXXXXX")
    vmq_track_path "$WORK"
    T0=$(vmq_now)
}

# bench_meta_machine: meta.txt's lines on the tree, the binaries and the machine
bench_meta_machine() {
    echo "git $(git -C "$VMQ_REPO_ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$VMQ_REPO_ROOT" diff --quiet HEAD -- dataplane cmd 2>/dev/null || echo ' (dataplane/ or cmd/ modified)')"
    echo "dataplane $VMQ_DATAPLANE"
    echo "dpdk $(dpkg-query -W -f='${Version}' dpdk-dev 2>/dev/null || echo '?')"
    echo "kernel $(uname -r)"
    echo "cpu $(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)"
    echo "psi_cpu_at_start $(vmq_cpu_psi)"
}

# bench_mem MB N: the DPDK memory of the next run, N testpmds of MB each:
# MEM (huge, nohuge) or, for auto, huge when enough 2 MiB pages are free
bench_mem() {
    case $MEM in
        huge | nohuge) echo "$MEM" ;;
        *) if (($(vmq_free_hugepages) * 2 >= $2 * ($1 + 64))); then echo huge; else echo nohuge; fi ;;
    esac
}
# bench_mem_args MODE MB: EAL memory words of that mode
bench_mem_args() { if [[ $1 == huge ]]; then echo "-m $2 --single-file-segments"; else echo "--no-huge -m $2"; fi; }

# quit_testpmd PID FD: stop forwarding and quit through the prompt on FD
# (testpmd prints its forward statistics), else stop_pid; VMQ_RC = exit status
quit_testpmd() {
    VMQ_RC=0
    [[ -n $1 ]] || return 0
    if vmq_alive "$1"; then
        printf 'stop\nquit\n' >&"$2" || true
        local end=$((SECONDS + 15))
        while vmq_alive "$1" && ((SECONDS < end)); do sleep 0.1; done
    fi
    stop_pid "$1"
}

# stats_window API SECONDS OUT: `vhostmqctl stats` over the next SECONDS
# into OUT (errors: OUT.err), in the background; stats_window_wait reaps
# it and prints its error, with status 1, if it failed
stats_window() {
    STATS_OUT=$3
    timeout $(($2 + 20)) "$VMQ_CTL" --socket "$1" --timeout 10s -o json stats --interval "${2}s" >"$3" 2>"$3.err" &
    STATS_PID=$!
    vmq_track "$STATS_PID"
}
stats_window_wait() {
    local rc=0
    wait "$STATS_PID" || rc=$?
    untrack "$STATS_PID"
    ((rc == 0)) || { tail -n 1 "$STATS_OUT.err"; return 1; }
}

# bench_finish NAME TABLE_PY MD: the finish time into meta.txt, TABLE_PY's
# summary of RAW (OUT/summary.txt, markdown OUT/MD), then "NAME: all N runs
# ok", or "NAME: F of N runs FAILED" and status 1 (FAILED of NRUNS)
bench_finish() {
    echo "finished_utc $(date -u +%FT%TZ) ($(vmq_elapsed "$T0") s)" >>"$OUT/meta.txt"
    "$VMQ_PY" "$HERE/$2" --meta "$OUT/meta.txt" --md "$OUT/$3" "$RAW" >"$OUT/summary.txt"
    cat "$OUT/summary.txt"
    echo
    echo "raw: $RAW"
    echo "summary: $OUT/summary.txt (markdown: $OUT/$3); logs: $OUT/logs; $(vmq_elapsed "$T0") s"
    if ((FAILED)); then
        echo "$1: $FAILED of $NRUNS runs FAILED (status column of $RAW)"
        return 1
    fi
    echo "$1: all $NRUNS runs ok"
}

# bench_start: the run counters RUN_N and FAILED, RUN_BOUND (the seconds any
# process of one run may live), DPDK_MB (each testpmd's memory) and the
# first lines of meta.txt (the script's own follow, then bench_meta_machine)
bench_start() {
    DPDK_MB=256 RUN_N=0 FAILED=0
    RUN_BOUND=$((WARMUP + DURATION + 150))
    {
        echo "started_utc $(date -u +%FT%TZ)"
        echo "command hack/bench/${0##*/} ${VMQ_ARGS[*]}"
        echo "trials $TRIALS"
        echo "warmup_s $WARMUP"
        echo "window_s $DURATION"
    } >"$OUT/meta.txt"
}

# bench_run ID: one more run (RUN_N): its logs folder rdir (OUT/logs/ID),
# its socket folder sdir, made, and started (UTC), into the caller's locals
bench_run() {
    RUN_N=$((RUN_N + 1))
    rdir=$OUT/logs/$1 sdir=$WORK/r$RUN_N
    mkdir -p "$rdir" "$sdir"
    started=$(date -u +%FT%TZ)
}
