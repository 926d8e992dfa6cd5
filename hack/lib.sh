# shellcheck shell=bash
# shellcheck disable=SC2034  # globals are read by the scripts that source this file
# Shared helpers for the vhostmq hack/ scripts.  Source it, do not run it.
#
#   source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
#
# Process hygiene
#   Every background process is started through vmq_bg, which wraps it in
#   `timeout` (so nothing outlives its bound even if this shell is SIGKILLed),
#   remembers its PID, and vmq_init installs an EXIT trap that stops exactly
#   those PIDs (SIGTERM, then SIGKILL) newest first.  Nothing is ever killed
#   by name.
#
# Environment knobs (all optional)
#   VHOSTMQ_DATAPLANE   dataplane binary (default <repo>/bin/vhostmq-dataplane)
#   VHOSTMQ_BACKEND     dataplane (default) | testpmd: use one dpdk-testpmd
#                       process with net_vhost ports in io forwarding as a
#                       stand-in backend; a small shim turns its telemetry into
#                       the dataplane's stats.json format.  For developing the
#                       guest tooling without the Go dataplane.
#   VHOSTMQ_DP_CPUS     worker CPUs written into the config (default "1" on
#                       machines with 2+ CPUs, else "0")
#   VHOSTMQ_LOG_LEVEL   dataplane logLevel (default info)
#   VHOSTMQ_REBALANCE   dataplane rebalance settings, e.g. "intervalSeconds: 1,
#                       threshold: 1" (default: none, the rebalancer is off)
#   VHOSTMQ_KERNEL_DIR  extracted guest kernel (default /var/cache/vhostmq/guest-kernel)
#   VHOSTMQ_GUEST_DIR   guest image dir (default <repo>/_output/guest)
#   VHOSTMQ_GUEST_SMP   vCPUs of each test guest (default 1)
#   VHOSTMQ_QEMU        the QEMU binary the guests run (default
#                       qemu-system-x86_64; hack/kubevirt/launcher-qemu.sh
#                       runs the KubeVirt launcher's QEMU 10.0)

VMQ_HACK_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
VMQ_REPO_ROOT=$(cd "$VMQ_HACK_DIR/.." && pwd)
VMQ_KERNEL_DIR=${VHOSTMQ_KERNEL_DIR:-/var/cache/vhostmq/guest-kernel}
VMQ_GUEST_DIR=${VHOSTMQ_GUEST_DIR:-$VMQ_REPO_ROOT/_output/guest}
VMQ_DATAPLANE=${VHOSTMQ_DATAPLANE:-$VMQ_REPO_ROOT/bin/vhostmq-dataplane}
VMQ_BACKEND=${VHOSTMQ_BACKEND:-dataplane}
VMQ_PY=python3
[[ -x /usr/bin/python3 ]] && VMQ_PY=/usr/bin/python3

VMQ_PIDS=()
VMQ_CLEAN_PATHS=()
VMQ_CLEAN_GLOBS=()
VMQ_FAILS=()

# ------------------------------------------------------------------ logging
vmq_log() { printf '[%(%H:%M:%S)T %s] %s\n' -1 "${VMQ_TAG:-vhostmq}" "$*" >&2; }
vmq_die() { vmq_log "FATAL: $*"; exit 1; }
vmq_now() { date +%s.%N; }
# vmq_elapsed T0 [T1]: seconds between two vmq_now stamps, 2 decimals
vmq_elapsed() { awk -v a="$1" -v b="${2:-$(vmq_now)}" 'BEGIN { printf "%.2f", b - a }'; }
vmq_usage() { # print the leading comment block of a script as its help text
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$1"
}

# ------------------------------------------------------------------ assertions
# The one idiom of the hack/ scripts.  Assertions are soft: vmq_ok and
# vmq_fail record a result and the script goes on, so that one run reports
# every failure.  vmq_expect compares a value and names it either way,
# vmq_check asserts a command, vmq_eventually polls an observer and, when it
# times out, says the value it saw last (not only what it wanted).
# vmq_fails_report (or vmq_verdict) ends the run: the failures, then
# "N passed, N failed"; its status says whether all held.
VMQ_PASSES=0
VMQ_REPORTED=0
vmq_fail() { VMQ_FAILS+=("$*"); vmq_log "ASSERTION FAILED: $*"; }
vmq_ok() { VMQ_PASSES=$((VMQ_PASSES + 1)); vmq_log "ok: $*"; }
# vmq_check WHAT CMD...: ok when CMD succeeds (what CMD prints, e.g. a diff,
# shows why not).  Returns 0 either way, like vmq_fail.
vmq_check() {
    local what=$1
    shift
    if "$@"; then vmq_ok "$what"; else vmq_fail "$what"; fi
}
# vmq_want VALUE WANT: whether VALUE is WANT; WANT "~ERE" matches an extended
# regular expression, ">N" a number above N
vmq_want() {
    case $2 in
        '~'*) [[ $1 =~ ${2#'~'} ]] ;;
        '>'*) [[ $1 =~ ^-?[0-9]+$ ]] && (($1 > ${2#'>'})) ;;
        *) [[ $1 == "$2" ]] ;;
    esac
}
# vmq_expect WHAT VALUE WANT: ok when VALUE is WANT (see vmq_want); either
# way the message says the value.  Returns 0, like vmq_fail.
vmq_expect() {
    if vmq_want "$2" "$3"; then vmq_ok "$1: ${2:-(none)}"; else vmq_fail "$1: got '$2', want '$3'"; fi
}
# vmq_poll SECONDS INTERVAL CMD...: until CMD succeeds; 1 when SECONDS pass
vmq_poll() {
    local end=$(($(date +%s%N) / 1000000 + $1 * 1000)) iv=$2
    shift 2
    until "$@"; do
        (($(date +%s%N) / 1000000 < end)) || return 1
        sleep "$iv"
    done
}
# vmq_observe WANT CMD...: VMQ_SEEN=CMD's output; whether it is WANT
vmq_observe() {
    local want=$1
    shift
    VMQ_SEEN=$("$@") || true
    vmq_want "$VMQ_SEEN" "$want"
}
# vmq_eventually SECONDS WHAT WANT OBSERVER...: poll OBSERVER, a command that
# prints one small value, every VMQ_POLL_S (default 0.2) seconds until it
# prints WANT (see vmq_want): ok; else a failure with the last value seen.
# VMQ_SEEN holds that value.  Returns whether it held: a caller that goes on
# either way calls it in a condition or with `|| true`.
vmq_eventually() {
    local secs=$1 what=$2 want=$3 t0 seen
    shift 3
    t0=$(vmq_now)
    if vmq_poll "$secs" "${VMQ_POLL_S:-0.2}" vmq_observe "$want" "$@"; then
        vmq_ok "$what (after $(vmq_elapsed "$t0") s)"
        return 0
    fi
    seen=${VMQ_SEEN//$'\n'/ | }
    ((${#seen} <= 400)) || seen="${seen:0:400}..."
    vmq_fail "$what: saw '$seen' last, want '$want' (polled $secs s)"
    return 1
}
# vmq_fails_report: the failures and the counts (stdout); 1 if any failed.
# A child of vmq_rerun records the counts in its result.env too, as
# vmq_passed and vmq_failed, for its parent (vmq_rerun_verdict).
vmq_fails_report() {
    local f
    VMQ_REPORTED=1
    if [[ -n ${VMQ_RERUN_CHILD:-} && -n ${VMQ_TG_WORK:-} ]]; then
        vmq_res vmq_passed "$VMQ_PASSES"
        vmq_res vmq_failed "${#VMQ_FAILS[@]}"
    fi
    if ((${#VMQ_FAILS[@]})); then
        echo "FAILED assertions (${#VMQ_FAILS[@]}):"
        for f in "${VMQ_FAILS[@]}"; do echo "  - $f"; done
    fi
    echo "$VMQ_PASSES passed, ${#VMQ_FAILS[@]} failed"
    ((${#VMQ_FAILS[@]} == 0))
}
# vmq_verdict NAME: the report, then "NAME: PASSED", or "NAME: FAILED" and status 1
vmq_verdict() {
    if vmq_fails_report; then echo "$1: PASSED"; else echo "$1: FAILED"; return 1; fi
}

# ------------------------------------------------------------------ arguments
# vmq_args SPEC... -- "$@": the script's options into globals.  SPEC words:
#   --name=VAR       takes a value: VAR=value
#   --name+=VAR      takes a value, appended: VAR+=" value"
#   --name:VAR=VAL   a switch: VAR=VAL
# -h/--help prints the script's usage (vmq_usage); anything else dies.  The
# arguments as given stay in VMQ_ARGS (vmq_rerun passes them on); those
# after a second -- (a program's own, e.g. Ginkgo's) in VMQ_REST.
vmq_args() {
    local -A _vmq_val=() _vmq_app=() _vmq_sw=()
    local _vmq_s
    while (($#)) && [[ $1 != -- ]]; do
        _vmq_s=$1
        case $_vmq_s in
            *+=*) _vmq_app[${_vmq_s%%+=*}]=${_vmq_s#*+=} ;;
            *:*) _vmq_sw[${_vmq_s%%:*}]=${_vmq_s#*:} ;;
            *=*) _vmq_val[${_vmq_s%%=*}]=${_vmq_s#*=} ;;
            *) vmq_die "vmq_args: bad spec '$_vmq_s'" ;;
        esac
        shift
    done
    shift # --
    VMQ_ARGS=("$@")
    VMQ_REST=()
    while (($#)); do
        if [[ $1 == -- ]]; then
            shift
            VMQ_REST=("$@") # for the program the script runs
            break
        fi
        [[ -n $1 ]] || vmq_die "an empty argument (see --help)"
        if [[ -n ${_vmq_sw[$1]:-} ]]; then
            printf -v "${_vmq_sw[$1]%%=*}" '%s' "${_vmq_sw[$1]#*=}"
            shift
            continue
        fi
        if [[ -n ${_vmq_val[$1]:-} || -n ${_vmq_app[$1]:-} ]]; then
            (($# >= 2)) || vmq_die "$1 needs a value (see --help)"
            if [[ -n ${_vmq_val[$1]:-} ]]; then
                printf -v "${_vmq_val[$1]}" '%s' "$2"
            else
                printf -v "${_vmq_app[$1]}" '%s %s' "${!_vmq_app[$1]}" "$2"
            fi
            shift 2
            continue
        fi
        case $1 in
            -h | --help) vmq_usage "$0"; exit 0 ;;
            *) vmq_die "unknown argument: $1 (see --help)" ;;
        esac
    done
}

# vmq_workdir PREFIX: WORK made (a new /tmp/PREFIX.XXXXXX) or, when --keep
# gave one, created and made absolute
vmq_workdir() {
    if [[ -z ${WORK:-} ]]; then WORK=$(mktemp -d "/tmp/$1.XXXXXX"); else mkdir -p "$WORK"; WORK=$(cd "$WORK" && pwd); fi
}

# vmq_rerun DIR ARGS...: this script again as a child, with the arguments it
# was given (VMQ_ARGS) but the options in ARGS (each with a value) replacing
# theirs, and --keep DIR; for --role both.  Its exit status and DIR go to
# VMQ_RERUN_RCS and VMQ_RERUN_DIRS; its counts to DIR/result.env.
VMQ_RERUN_RCS=()
VMQ_RERUN_DIRS=()
vmq_rerun() {
    local dir=$1 a skip=0 drop=" --keep " rest=() pid rc=0
    shift
    for a in "$@"; do [[ $a != --* ]] || drop+="$a "; done
    for a in "${VMQ_ARGS[@]}"; do
        if ((skip)); then skip=0; continue; fi
        if [[ $drop == *" $a "* ]]; then skip=1; continue; fi
        rest+=("$a")
    done
    VMQ_RERUN_CHILD=1 "$BASH" "$0" "${rest[@]}" "$@" --keep "$dir" &
    pid=$!
    vmq_track "$pid"
    wait "$pid" || rc=$?
    VMQ_RERUN_RCS+=("$rc")
    VMQ_RERUN_DIRS+=("$dir")
}
# vmq_rerun_result I: the I-th child's "PASS" or "FAIL(rc=N)" and its checks, "passed/failed"
vmq_rerun_result() {
    local rc=${VMQ_RERUN_RCS[$1]} res=PASS
    ((rc == 0)) || res="FAIL(rc=$rc)"
    # shellcheck disable=SC1091
    echo "$res $(source "${VMQ_RERUN_DIRS[$1]}/result.env" 2>/dev/null; echo "${vmq_passed:-?}/${vmq_failed:-?}")"
}
# vmq_rerun_rows ROW: a table row per child run: what the function ROW I
# prints from the variables of the run's result.env (sourced in a subshell
# of its own), then the run's result (vmq_rerun_result)
vmq_rerun_rows() {
    local i
    for i in "${!VMQ_RERUN_DIRS[@]}"; do
        (
            # shellcheck disable=SC1091
            [[ ! -f ${VMQ_RERUN_DIRS[i]}/result.env ]] || source "${VMQ_RERUN_DIRS[i]}/result.env"
            echo "$("$1" "$i") $(vmq_rerun_result "$i")"
        )
    done
}
# vmq_rerun_summary NAME HEADER ROW: the child runs' table (HEADER, then
# vmq_rerun_rows ROW), the work dir and vmq_rerun_verdict NAME
vmq_rerun_summary() {
    echo
    echo "===== vhostmq $1 summary ($(vmq_elapsed "$T0") s) ====="
    {
        echo "$2 result checks(passed/failed)"
        vmq_rerun_rows "$3"
    } | vmq_table
    echo "work dir: $WORK"
    vmq_rerun_verdict "$1"
}
# vmq_rerun_verdict NAME: the children's counts summed, then "NAME: PASSED",
# or "NAME: FAILED" and status 1 when a child failed
vmq_rerun_verdict() {
    local i c p=0 f=0 bad=0
    for i in "${!VMQ_RERUN_RCS[@]}"; do
        ((VMQ_RERUN_RCS[i] == 0)) || bad=1
        c=$(vmq_rerun_result "$i")
        c=${c#* }
        [[ $c == [0-9]*/[0-9]* ]] || { bad=1; continue; }
        p=$((p + ${c%/*})) f=$((f + ${c#*/}))
    done
    echo "$p passed, $f failed (the runs together)"
    if ((bad)); then echo "$1: FAILED (see the per-run output above)"; return 1; fi
    echo "$1: PASSED"
}

# ------------------------------------------------------------------ processes
vmq_track() { VMQ_PIDS+=("$1"); }
vmq_track_path() { VMQ_CLEAN_PATHS+=("$1"); }   # removed (rm -rf) at exit
vmq_track_glob() { VMQ_CLEAN_GLOBS+=("$1"); }   # files matching removed at exit

# vmq_bg LOG SECONDS CMD...: run CMD in the background under `timeout`, output
# to LOG, stdin from /dev/null.  Sets VMQ_BG_PID (the timeout process; its
# only child is CMD).
vmq_bg() {
    local log=$1 secs=$2
    shift 2
    timeout --kill-after=5 "$secs" "$@" >"$log" 2>&1 </dev/null &
    VMQ_BG_PID=$!
    vmq_track "$VMQ_BG_PID"
}

vmq_alive() { kill -0 "$1" 2>/dev/null; }

# vmq_stop PID [GRACE_S]: SIGTERM.  For a process started by vmq_bg, timeout
# forwards it to the command and SIGKILLs the command itself 5 s later
# (--kill-after), so it normally ends within that.  After GRACE_S (default 8)
# the command and then PID get SIGKILL (the command first: timeout cannot
# forward a SIGKILL).  Sets VMQ_RC to the exit status (128+N = signal N).
vmq_stop() {
    local pid=$1 grace=${2:-8} i child
    VMQ_RC=0
    if vmq_alive "$pid"; then
        kill -TERM "$pid" 2>/dev/null || true
        # stderr off while polling: bash prints its "Killed" job notice when
        # it reaps a job, which happens during these sleeps
        { for ((i = 0; i < grace * 10; i++)); do vmq_alive "$pid" || break; sleep 0.1; done; } 2>/dev/null
        if vmq_alive "$pid"; then
            vmq_log "pid $pid still running ${grace}s after SIGTERM, sending SIGKILL"
            if [[ $(cat "/proc/$pid/comm" 2>/dev/null) == timeout ]]; then
                child=$(vmq_child "$pid")
                [[ -n $child ]] && kill -KILL "$child" 2>/dev/null
            fi
            kill -KILL "$pid" 2>/dev/null || true
        fi
    fi
    { wait "$pid"; } 2>/dev/null || VMQ_RC=$?
}

# vmq_child PID: the (first) child of PID, i.e. the real command under timeout
vmq_child() {
    local c=""
    if [[ -r /proc/$1/task/$1/children ]]; then
        read -r c _ <"/proc/$1/task/$1/children" || true
    fi
    [[ -n $c ]] || c=$(pgrep -P "$1" | head -n1 || true)
    echo "$c"
}

# vmq_crash PID: SIGKILL the command running under `timeout` PID (simulates a
# crash of that command, not a clean exit), then reap the timeout process.
vmq_crash() {
    local pid=$1 child i
    child=$(vmq_child "$pid")
    [[ -n $child ]] || { vmq_log "no child under pid $pid"; return 1; }
    kill -KILL "$child" 2>/dev/null || true
    { for ((i = 0; i < 50; i++)); do vmq_alive "$pid" || break; sleep 0.1; done; wait "$pid"; } 2>/dev/null || true
}

vmq_cleanup() {
    local rc=$? i f g
    set +e
    for ((i = ${#VMQ_PIDS[@]} - 1; i >= 0; i--)); do
        vmq_alive "${VMQ_PIDS[i]}" && vmq_stop "${VMQ_PIDS[i]}"
    done
    for f in "${VMQ_CLEAN_PATHS[@]}"; do rm -rf -- "$f"; done
    for g in "${VMQ_CLEAN_GLOBS[@]}"; do
        while IFS= read -r f; do rm -f -- "$f"; done < <(compgen -G "$g" || true)
    done
    return "$rc"
}

vmq_init() {
    trap vmq_cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
}

vmq_need_root() { [[ $(id -u) == 0 ]] || vmq_die "must run as root"; }
# vmq_need CMD...: dies naming the first CMD not on PATH
vmq_need() {
    local c
    for c in "$@"; do command -v "$c" >/dev/null || vmq_die "$c missing: run hack/install-deps.sh"; done
}

# ------------------------------------------------------------------ waiting
# vmq_wait_path PATH SECONDS [PID]: 0 when PATH exists, 1 on timeout, 2 if PID died
vmq_wait_path() {
    local p=$1 end pid=${3:-}
    end=$(($(date +%s%N) / 1000000 + $2 * 1000))
    while (($(date +%s%N) / 1000000 < end)); do
        [[ -e $p ]] && return 0
        if [[ -n $pid ]] && ! vmq_alive "$pid"; then return 2; fi
        sleep 0.1
    done
    [[ -e $p ]]
}

# vmq_wait_log FILE REGEX SECONDS [PID]: 0 when an ERE matches a line of FILE,
# 1 on timeout, 2 if PID died before it matched.
vmq_wait_log() {
    local f=$1 re=$2 end pid=${4:-}
    end=$(($(date +%s%N) / 1000000 + $3 * 1000))
    while (($(date +%s%N) / 1000000 < end)); do
        grep -a -q -E -- "$re" "$f" 2>/dev/null && return 0
        if [[ -n $pid ]] && ! vmq_alive "$pid"; then
            grep -a -q -E -- "$re" "$f" 2>/dev/null && return 0
            return 2
        fi
        sleep 0.1
    done
    return 1
}

# vmq_count_log FILE REGEX: number of matching lines (0 when FILE is missing)
vmq_count_log() { grep -a -c -E -- "$2" "$1" 2>/dev/null || true; }

# ------------------------------------------------------------------ guest RESULT lines
# The guest prints "VHOSTMQ-RESULT <kind> key=value ..." on its serial console.
# vmq_result LOG KIND KEY: KEY's value in the last KIND line ("" if none)
vmq_result() {
    tr -d '\r' <"$1" 2>/dev/null | awk -v kind="$2" -v key="$3" '
        $1 == "VHOSTMQ-RESULT" && $2 == kind {
            v = ""
            for (i = 3; i <= NF; i++) if (index($i, key "=") == 1) v = substr($i, length(key) + 2)
            last = v; seen = 1
        }
        END { if (seen) print last }'
}
# vmq_spoof LOG STEP [KEY]: KEY (default replies) of the spoof role's STEP
# line (hack/guest/init, role spoof); "" if none
vmq_spoof() {
    tr -d '\r' <"$1" 2>/dev/null | awk -v s="step=$2" -v k="${3:-replies}=" '
        $1 == "VHOSTMQ-RESULT" && $2 == "spoof" && $3 == s { for (i = 4; i <= NF; i++) if (index($i, k) == 1) v = substr($i, length(k) + 1) }
        END { print v }'
}
# vmq_kv LINE KEY: the value of " KEY=value" in LINE (its last such word)
vmq_kv() { sed -n "s/.* $2=\([^ ]*\).*/\1/p" <<<"$1" | head -n1; }
# vmq_iperf_line LOG DIR: the guest's last "iperf dir=DIR" result line (forward, reverse)
vmq_iperf_line() {
    tr -d '\r' <"$1" 2>/dev/null | awk -v d="dir=$2" '$1 == "VHOSTMQ-RESULT" && $2 == "iperf" && $3 == d { l = $0 } END { print l }'
}
# vmq_result_line LOG KIND: the last KIND line without its prefix
vmq_result_line() {
    tr -d '\r' <"$1" 2>/dev/null | awk -v kind="$2" '$1 == "VHOSTMQ-RESULT" && $2 == kind { $1 = ""; l = $0 } END { sub(/^ /, "", l); print l }'
}

# ------------------------------------------------------------------ podman
# Every podman call of the tests goes through vmq_podman, which pins what
# podman would otherwise pick from the machine's state: the OCI runtime (on a
# new Debian 12 machine podman picks crun, which refuses this kernel's hybrid
# cgroup layout -- "cgroups in hybrid mode not supported" -- while runc runs
# on it; a machine that had runc first picks runc), the cgroup manager
# (cgroupfs: no systemd here) and the events log (a file, no journald).
# VHOSTMQ_OCI_RUNTIME overrides the runtime (e.g. crun on a cgroup v2 host).
VMQ_OCI_RUNTIME=${VHOSTMQ_OCI_RUNTIME:-runc}
vmq_podman() { podman --runtime "$VMQ_OCI_RUNTIME" --cgroup-manager cgroupfs --events-backend file "$@"; }

# vmq_golang_base WORKDIR: the Dockerfile's build base (FROM golang:1.26)
# made locally in podman's storage as $VMQ_GOLANG_BASE, since no registry
# is reachable here: busybox-static for RUN's /bin/sh, this machine's Go
# toolchain and CA certificates.  A build lends the host's module and build
# caches with "${VMQ_GOLANG_LEND[@]}" (podman build -v, at the same paths:
# with -trimpath a module package's cache key holds its directory, so a
# warm machine compiles nothing twice and downloads nothing).
VMQ_GOLANG_BASE=docker.io/library/golang:1.26
VMQ_GOLANG_LEND=()
vmq_golang_base() {
    local root=$1 a modcache buildcache
    [[ $(go env GOVERSION) == go1.26* ]] || vmq_die "the Dockerfile builds with golang:1.26; this machine has $(go env GOVERSION)"
    modcache=$(go env GOMODCACHE) buildcache=$(go env GOCACHE)
    VMQ_GOLANG_LEND=(-v "$modcache:$modcache" -v "$buildcache:$buildcache")
    mkdir -p "$root/bin" "$root/usr/local" "$root/etc/ssl/certs" "$root/tmp" "$root/go" "$root/root"
    chmod 1777 "$root/tmp"
    cp /bin/busybox "$root/bin/busybox"
    for a in sh mkdir rm cp ls cat env; do ln -sf busybox "$root/bin/$a"; done
    cp -a "$(go env GOROOT)" "$root/usr/local/go"
    cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/"
    tar -C "$root" -c . | vmq_podman import \
        --change 'ENV PATH=/go/bin:/usr/local/go/bin:/usr/local/bin:/usr/bin:/bin' \
        --change 'ENV GOPATH=/go' --change 'ENV GOTOOLCHAIN=local' --change 'ENV HOME=/root' \
        --change "ENV GOMODCACHE=$modcache" --change "ENV GOCACHE=$buildcache" --change 'WORKDIR /go' \
        - "$VMQ_GOLANG_BASE" >/dev/null
    rm -rf "$root"
}

# ------------------------------------------------------------------ hugepages / DPDK
# vmq_free_hugepages: free 2 MiB pages when hugetlbfs is mounted, else 0
vmq_free_hugepages() {
    if grep -q ' hugetlbfs ' /proc/mounts; then
        awk '/^HugePages_Free:/ { print $2; f = 1 } END { if (!f) print 0 }' /proc/meminfo
    else
        echo 0
    fi
}

# vmq_dpdk_mem_args MB: EAL memory arguments for a virtio-user frontend, as
# words on stdout.  Hugepages (one file per memseg list, which vhost-user's
# 8-region limit needs) when enough are free, else --no-huge (memfd, 4 KiB
# pages).  Hugepages are never reserved here.
vmq_dpdk_mem_args() {
    local mb=$1
    if (($(vmq_free_hugepages) * 2 >= mb + 64)); then
        echo "-m $mb --single-file-segments"
    else
        echo "--no-huge -m $mb"
    fi
}

# vmq_dpdk_track PREFIX: remove DPDK's runtime dir and hugepage files at exit
vmq_dpdk_track() {
    vmq_track_path "/var/run/dpdk/$1"
    vmq_track_glob "/dev/hugepages/$1map_*"
    vmq_track_glob "/dev/hugepages/$1-*"
}

# vmq_telemetry PREFIX CMD...: query the DPDK telemetry socket of the process
# started with --file-prefix=PREFIX; prints one JSON object per CMD.
vmq_telemetry() {
    local prefix=$1
    shift
    "$VMQ_PY" - "/var/run/dpdk/$prefix/dpdk_telemetry.v2" "$@" <<'PY'
import json, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.settimeout(3)
s.connect(sys.argv[1])
s.recv(1 << 16)                       # greeting
for cmd in sys.argv[2:]:
    s.send(cmd.encode())
    print(json.dumps(json.loads(s.recv(1 << 22).decode())))
PY
}

# vmq_dpdk_port_stats PREFIX PORT: "ipackets opackets q_ipackets(csv) q_opackets(csv)"
vmq_dpdk_port_stats() {
    vmq_telemetry "$1" "/ethdev/stats,$2" 2>/dev/null | jq -r '
        (.["/ethdev/stats"] // {}) as $s
        | "\($s.ipackets // 0) \($s.opackets // 0) \(($s.q_ipackets // []) | map(tostring) | join(",")) \(($s.q_opackets // []) | map(tostring) | join(","))"'
}

# ------------------------------------------------------------------ dataplane config
# Port table used by the config writer and the backends: parallel arrays.
VMQ_PORT_NAMES=()
VMQ_PORT_SOCKS=()
VMQ_PORT_MACS=()
VMQ_PORT_QUEUES=()
VMQ_SOCK_ROLE=server    # server: backend listens; client: backend dials
vmq_ports_reset() { VMQ_PORT_NAMES=(); VMQ_PORT_SOCKS=(); VMQ_PORT_MACS=(); VMQ_PORT_QUEUES=(); }
# vmq_port_add NAME SOCKET QUEUE_PAIRS MAC
vmq_port_add() {
    ((${#3} > 0)) || vmq_die "vmq_port_add: queue pairs missing"
    ((${#2} < 100)) || vmq_die "socket path too long for AF_UNIX (${#2} chars): $2"
    VMQ_PORT_NAMES+=("$1"); VMQ_PORT_SOCKS+=("$2"); VMQ_PORT_QUEUES+=("$3"); VMQ_PORT_MACS+=("$4")
}

vmq_default_cpus() { if (($(nproc) >= 2)); then echo 1; else echo 0; fi; }

# vmq_write_config FILE STATSFILE: dataplane YAML from the port table
# (VMQ_PORT_SECURITY=false: every port's portSecurity off, for frontends
# that send from addresses not their port's, like DPDK's flowgen); its API
# socket, FILE's folder/api.sock, becomes VMQ_API
vmq_write_config() {
    local f=$1 stats=$2 i dir
    dir=$(dirname "$f")
    VMQ_API=$dir/api.sock
    {
        echo "# generated by hack/ ($(basename "$0")) at $(date -u +%FT%TZ)"
        echo "cpus: [${VHOSTMQ_DP_CPUS:-$(vmq_default_cpus)}]"
        echo "statsFile: $stats"
        echo "apiSocket: $dir/api.sock"
        echo "stateDir: $dir/state"
        echo "logLevel: ${VHOSTMQ_LOG_LEVEL:-info}"
        [[ -z ${VHOSTMQ_REBALANCE:-} ]] || echo "rebalance: {$VHOSTMQ_REBALANCE}"
        echo "ports:"
        for i in "${!VMQ_PORT_NAMES[@]}"; do
            echo "  - name: ${VMQ_PORT_NAMES[i]}"
            echo "    socket: ${VMQ_PORT_SOCKS[i]}"
            echo "    role: $VMQ_SOCK_ROLE"
            echo "    queuePairs: ${VMQ_PORT_QUEUES[i]}"
            echo "    mtu: 1500"
            echo "    mac: \"${VMQ_PORT_MACS[i]}\""
            [[ -z ${VMQ_PORT_SECURITY:-} ]] || echo "    portSecurity: $VMQ_PORT_SECURITY"
        done
    } >"$f"
}

# vmq_ctl ARGS...: vhostmqctl (VMQ_CTL; VHOSTMQ_CTL, default bin/) against
# the agent API socket VMQ_API, each request bounded (10 s, the whole call 30 s)
VMQ_CTL=${VHOSTMQ_CTL:-$VMQ_REPO_ROOT/bin/vhostmqctl}
VMQ_API=""
vmq_ctl() { timeout 30 "$VMQ_CTL" --socket "$VMQ_API" --timeout 10s "$@"; }

# ------------------------------------------------------------------ backend (dataplane or testpmd)
# vmq_backend_start WORKDIR CONFIG STATSFILE SECONDS
#   Starts the backend for the current port table; in server role waits until
#   every socket exists.  Each start gets its own log: WORKDIR/backend-N.log.
#   Sets VMQ_BE_PID and VMQ_BE_LOG.
VMQ_BE_N=0
VMQ_BE_PID=""
VMQ_SHIM_PID=""
vmq_backend_start() {
    local work=$1 cfg=$2 stats=$3 secs=$4 i rc
    VMQ_BE_N=$((VMQ_BE_N + 1))
    VMQ_BE_LOG=$work/backend-$VMQ_BE_N.log
    case $VMQ_BACKEND in
        dataplane)
            [[ -x $VMQ_DATAPLANE ]] ||
                vmq_die "dataplane binary $VMQ_DATAPLANE not found: run 'make build' (or set VHOSTMQ_DATAPLANE, or VHOSTMQ_BACKEND=testpmd)"
            vmq_log "starting dataplane #$VMQ_BE_N: $VMQ_DATAPLANE --config $cfg (log $VMQ_BE_LOG)"
            vmq_bg "$VMQ_BE_LOG" "$secs" "$VMQ_DATAPLANE" --config "$cfg"
            ;;
        testpmd)
            local prefix=vmqbe$$ vdevs=() nq=${VMQ_PORT_QUEUES[0]} client=0
            [[ $VMQ_SOCK_ROLE == client ]] && client=1
            for i in "${!VMQ_PORT_NAMES[@]}"; do
                # DPDK's vhost server refuses to bind over a stale socket file
                [[ $client == 0 ]] && rm -f "${VMQ_PORT_SOCKS[i]}"
                vdevs+=(--vdev "net_vhost$i,iface=${VMQ_PORT_SOCKS[i]},queues=${VMQ_PORT_QUEUES[i]},client=$client")
            done
            vmq_dpdk_track "$prefix"
            vmq_log "starting testpmd stand-in backend #$VMQ_BE_N (log $VMQ_BE_LOG)"
            vmq_bg "$VMQ_BE_LOG" "$secs" stdbuf -oL dpdk-testpmd -l 0,1 --main-lcore 0 --no-pci --no-huge -m 512 \
                --file-prefix="$prefix" "${vdevs[@]}" -- --nb-cores=1 --rxq="$nq" --txq="$nq" \
                --forward-mode=io --total-num-mbufs=32768 --stats-period=3600
            local tp=$VMQ_BG_PID
            # telemetry queries during port setup crash testpmd: start the shim
            # (one per testpmd instance) only once forwarding runs
            vmq_wait_log "$VMQ_BE_LOG" 'packet forwarding - ports=' 30 "$tp" ||
                { tail -n 20 "$VMQ_BE_LOG" >&2; vmq_die "testpmd backend did not start; see $VMQ_BE_LOG"; }
            printf '%s\n' "$VMQ_SHIM_PY" >"$work/stats-shim.py"
            vmq_bg "$work/stats-shim-$VMQ_BE_N.log" "$secs" "$VMQ_PY" "$work/stats-shim.py" "$prefix" "$stats" "${VMQ_PORT_NAMES[@]}"
            VMQ_SHIM_PID=$VMQ_BG_PID
            VMQ_BG_PID=$tp
            ;;
        *) vmq_die "VHOSTMQ_BACKEND must be dataplane or testpmd, not '$VMQ_BACKEND'" ;;
    esac
    VMQ_BE_PID=$VMQ_BG_PID
    if [[ $VMQ_SOCK_ROLE == server ]]; then
        for i in "${!VMQ_PORT_SOCKS[@]}"; do
            rc=0
            vmq_wait_path "${VMQ_PORT_SOCKS[i]}" 30 "$VMQ_BE_PID" || rc=$?
            if ((rc != 0)); then
                tail -n 20 "$VMQ_BE_LOG" >&2 || true
                vmq_die "backend did not create ${VMQ_PORT_SOCKS[i]} ($([[ $rc == 2 ]] && echo exited || echo timeout)); see $VMQ_BE_LOG"
            fi
        done
    fi
    sleep 0.2
    vmq_alive "$VMQ_BE_PID" || { tail -n 20 "$VMQ_BE_LOG" >&2 || true; vmq_die "backend exited at start; see $VMQ_BE_LOG"; }
}

vmq_shim_stop() {
    [[ -n $VMQ_SHIM_PID ]] || return 0
    vmq_stop "$VMQ_SHIM_PID"
    VMQ_SHIM_PID=""
}

# vmq_backend_stop: clean stop (SIGTERM); sets VMQ_RC to the backend's exit status
vmq_backend_stop() {
    VMQ_RC=0
    vmq_shim_stop
    [[ -n $VMQ_BE_PID ]] || return 0
    vmq_stop "$VMQ_BE_PID" 12
    VMQ_BE_PID=""
}

# vmq_backend_crash: SIGKILL the backend process itself (not its timeout wrapper)
vmq_backend_crash() {
    vmq_shim_stop
    [[ -n $VMQ_BE_PID ]] || return 0
    vmq_crash "$VMQ_BE_PID"
    VMQ_BE_PID=""
}

# Stats shim for VHOSTMQ_BACKEND=testpmd: polls testpmd's telemetry every
# 0.5 s and writes the dataplane's stats.json format (rx = toward the guest =
# testpmd opackets, tx = from the guest = testpmd ipackets).  Like the real
# dataplane, it writes nothing while the backend is down.
# shellcheck disable=SC2016
VMQ_SHIM_PY='
import json, os, socket, sys, time
prefix, out, names = sys.argv[1], sys.argv[2], sys.argv[3:]
path = "/var/run/dpdk/%s/dpdk_telemetry.v2" % prefix
connects = {n: 0 for n in names}
up_before = {n: False for n in names}
def q(s, cmd):
    s.send(cmd.encode())
    return json.loads(s.recv(1 << 22).decode())
while True:
    time.sleep(0.5)
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        s.settimeout(2)
        s.connect(path)
        s.recv(1 << 16)
        ports = []
        for i, n in enumerate(names):
            st = q(s, "/ethdev/stats,%d" % i)["/ethdev/stats"]
            ls = q(s, "/ethdev/link_status,%d" % i)["/ethdev/link_status"]
            info = q(s, "/ethdev/info,%d" % i)["/ethdev/info"]
            up = ls.get("status") == "UP"
            if up and not up_before[n]:
                connects[n] += 1
            up_before[n] = up
            nq = int(info.get("nb_rx_queues", 1))
            qs = []
            for k in range(nq):
                g = lambda key: (st.get(key) or [0] * 16)[k] if k < 16 else 0
                qs.append({"pair": k, "cpu": 1, "rxEnabled": up, "txEnabled": up,
                           "rxPackets": g("q_opackets"), "rxBytes": g("q_obytes"),
                           "txPackets": g("q_ipackets"), "txBytes": g("q_ibytes"),
                           "kicks": 0, "calls": 0,
                           "drops": {"rxNoBuffer": 0, "txDisabled": 0, "badChain": 0, "mtu": 0, "noDestination": 0}})
            ports.append({"name": n, "connected": up, "connects": connects[n], "queuePairs": nq,
                          "enabledPairs": nq if up else 0, "queues": qs})
        s.close()
    except (OSError, ValueError, KeyError) as e:
        continue
    tmp = out + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"ports": ports, "backend": "testpmd"}, f)
    os.replace(tmp, out)
'

# ------------------------------------------------------------------ stats.json readers
# All readers are tolerant: missing fields count as 0/false, unknown fields
# are ignored.

# vmq_stats_queues FILE: TSV, one line per queue pair:
#   port pair cpu rxPackets txPackets rxBytes txBytes kicks calls drops
# (drops: the non-zero drop counters as reason=count,... or "-")
vmq_stats_queues() {
    jq -r '
        .ports[]? as $p
        | ($p.queues // [])[]
        | [ ($p.name // "?"), (.pair // 0), (.cpu // "-"),
            (.rxPackets // 0), (.txPackets // 0), (.rxBytes // 0), (.txBytes // 0),
            (.kicks // 0), (.calls // 0),
            ((.drops // {}) | to_entries | map(select((.value | type) == "number" and .value > 0) | "\(.key)=\(.value)")
             | if length == 0 then "-" else join(",") end) ]
        | @tsv' "$1" 2>/dev/null
}

# vmq_stats_port FILE PORT FIELD [DEFAULT]: a port-level field (connected, connects, enabledPairs ...)
vmq_stats_port() {
    jq -r --arg p "$2" --arg f "$3" --arg d "${4:-}" \
        'first(.ports[]? | select(.name == $p)) as $x | ($x[$f] // $d) | tostring' "$1" 2>/dev/null || echo "${4:-}"
}

# vmq_stats_idle_queues FILE PORT N: prints the pairs (of 0..N-1) whose
# rxPackets or txPackets is 0, or missing; prints nothing when all pairs saw
# traffic in both directions.  "missing-port" when PORT is absent.
vmq_stats_idle_queues() {
    jq -r --arg p "$2" --argjson n "$3" '
        [.ports[]? | select(.name == $p)] as $m
        | if ($m | length) == 0 then "missing-port"
          else ($m[0].queues // []) as $q
          | [range(0; $n) as $i
             | ([$q[] | select((.pair // -1) == $i)] | first // {}) as $e
             | select(($e.rxPackets // 0) <= 0 or ($e.txPackets // 0) <= 0)
             | "\($i)(rx=\($e.rxPackets // 0),tx=\($e.txPackets // 0))"]
          | join(" ") end' "$1" 2>/dev/null || echo "unreadable"
}

# vmq_carrier_values GUEST: the distinct carrier_changes values the guest
# reported (vmq.carrierwatch=1), comma-separated: one value, no link down/up
vmq_carrier_values() { tr -d '\r' <"${VMQ_GUEST_LOG[$1]}" | sed -n 's/^VHOSTMQ-RESULT carrier changes=\([0-9]*\).*/\1/p' | sort -u | paste -sd,; }

# vmq_guest_queue_check FILE PORT N: compares what guest PORT (guest and
# port share a name) put on and read from each of its N queues during its
# traffic, by its own counters (ethtool -S, from its first "guest-queues"
# line before the traffic, phase=traffic or session=0, to its last), with
# pair p's frames in the dataplane's stats: a queue the guest used must
# have been served (frames > 0 that way; the dataplane's counters may
# start later, at a reconnect or handoff, so no exact count), and some
# pair must have carried frames each way. Prints "ok: TABLE" or
# "fail: WHY".
vmq_guest_queue_check() {
    local f=$1 g=$2 n=$3 first last p t0 t1 r0 r1 dt dr why="" table="" busy_t=0 busy_r=0
    first=$(tr -d '\r' <"${VMQ_GUEST_LOG[$g]}" | grep -E '^VHOSTMQ-RESULT guest-queues (phase=traffic|session=0) ' | head -n1)
    last=$(tr -d '\r' <"${VMQ_GUEST_LOG[$g]}" | grep '^VHOSTMQ-RESULT guest-queues ' | tail -n1)
    if [[ -z $first || -z $last || $first == "$last" ]]; then
        echo "fail: guest $g reported no per-queue counters before and after its traffic"
        return
    fi
    for ((p = 0; p < n; p++)); do
        t0=$(vmq_kv "$first" "tx_q$p") t1=$(vmq_kv "$last" "tx_q$p") r0=$(vmq_kv "$first" "rx_q$p") r1=$(vmq_kv "$last" "rx_q$p")
        dt=$(jq -r --arg g "$g" --argjson i "$p" '[.ports[] | select(.name == $g) | .queues[] | select(.pair == $i) | .txPackets] | first // 0' "$f" 2>/dev/null || echo 0)
        dr=$(jq -r --arg g "$g" --argjson i "$p" '[.ports[] | select(.name == $g) | .queues[] | select(.pair == $i) | .rxPackets] | first // 0' "$f" 2>/dev/null || echo 0)
        t1=$((${t1:-0} - ${t0:-0})) r1=$((${r1:-0} - ${r0:-0}))
        table+="${table:+, }$p: $t1/$dt $r1/$dr"
        ((dt > 0)) && busy_t=1
        ((dr > 0)) && busy_r=1
        ((t1 > 0 && dt == 0)) && why+="${why:+; }guest $g sent $t1 frames on tx_q$p, pair $p served none"
        ((r1 > 0 && dr == 0)) && why+="${why:+; }guest $g read $r1 frames from rx_q$p, pair $p delivered none"
    done
    ((busy_t && busy_r)) || why+="${why:+; }no pair carried frames both ways"
    if [[ -n $why ]]; then echo "fail: $why ($table)"; else echo "ok: $table"; fi
}

# vmq_stats_idle FILE N PORT...: observer for vmq_eventually: each PORT's
# pairs of 0..N-1 whose rxPackets or txPackets is still 0, as "port a:
# 1(rx=0,tx=5); ", nothing when every pair of every PORT saw both
vmq_stats_idle() {
    local f=$1 n=$2 p idle
    shift 2
    for p in "$@"; do
        if [[ ! -s $f ]]; then idle="no stats file"; else idle=$(vmq_stats_idle_queues "$f" "$p" "$n"); fi
        [[ -z $idle ]] || printf 'port %s: %s; ' "$p" "$idle"
    done
}

# vmq_stats_connected FILE PORT...: observer for vmq_eventually: "a=true
# b=false", each PORT's connected in the stats file
vmq_stats_connected() {
    local f=$1 p states=()
    shift
    for p in "$@"; do states+=("$p=$(vmq_stats_port "$f" "$p" connected false)"); done
    echo "${states[*]}"
}

# vmq_table: align whitespace-separated columns read from stdin (first line = header)
vmq_table() {
    awk '{ for (i = 1; i <= NF; i++) { c[NR, i] = $i; if (length($i) > w[i]) w[i] = length($i) } if (NF > nf) nf = NF; n = NR }
         END { for (r = 1; r <= n; r++) { line = ""
                 for (i = 1; i <= nf; i++) line = line sprintf(i == 1 ? "%-*s" : "  %*s", w[i], c[r, i])
                 print line } }'
}

# vmq_stats_table FILE [PREFIX_COLUMN]: per-queue counters as an aligned table
vmq_stats_table() {
    {
        echo "${2:+role }port pair cpu rxPackets txPackets rxBytes txBytes kicks calls drops"
        vmq_stats_queues "$1" | awk -v pre="${2:-}" '{ print (pre != "" ? pre " " : "") $0 }'
    } | vmq_table
}

# ------------------------------------------------------------------ guests (QEMU TCG)
# vmq_guest_env: load paths of the guest image (built by hack/guest/build.sh)
vmq_guest_env() {
    [[ -f $VMQ_GUEST_DIR/guest.env ]] || vmq_die "no guest image in $VMQ_GUEST_DIR: run hack/guest/build.sh"
    # shellcheck disable=SC1091
    source "$VMQ_GUEST_DIR/guest.env"
    GUEST_KERNEL=${GUEST_VMLINUX:-}
    [[ -n $GUEST_KERNEL && -f $GUEST_KERNEL ]] || GUEST_KERNEL=$GUEST_BZIMAGE
}

declare -A VMQ_GUEST_PID=() VMQ_GUEST_T0=() VMQ_GUEST_LOG=() VMQ_GUEST_QLOG=() VMQ_GUEST_DEV_OPTS=() VMQ_GUEST_EXTRA=()
# vmq_guest_boot NAME WORKDIR SECONDS NIC-ARGS... -- CMDLINE...: boots a test
#   guest under vmq_bg: TCG, q35, 512 MiB, 1 vCPU (VHOSTMQ_GUEST_SMP), the
#   image of hack/guest/build.sh, the QEMU arguments NIC-ARGS as its network
#   (a vhost-user netdev gets the guest's memory shared: memfd, share=on),
#   CMDLINE words appended to the kernel command line (vmq.* keys, see
#   hack/guest/init).  Serial console: WORKDIR/guest-NAME.log; the command
#   line: WORKDIR/guest-NAME.cmd.  VMQ_GUEST_EXTRA[NAME], if set, holds more
#   QEMU arguments (split on spaces; e.g. a QMP socket and -incoming for a
#   migration target); VMQ_GUEST_WRAP (words, e.g. "ip netns exec NS") runs
#   QEMU under a command.
vmq_guest_boot() {
    local name=$1 work=$2 secs=$3 net=() shared=0 wrap=() extra=()
    shift 3
    while (($#)) && [[ $1 != -- ]]; do
        net+=("$1")
        [[ $1 != vhost-user,* ]] || shared=1
        shift
    done
    shift # --
    vmq_guest_env
    VMQ_GUEST_LOG[$name]=$work/guest-$name.log
    : >"${VMQ_GUEST_LOG[$name]}"
    # thread=single with several vCPUs: QEMU 10.0's multi-threaded TCG can
    # abort a booting guest (iotlb_to_section assertion, one vCPU using the
    # memory map another replaces), as KubeVirt's launcher does (images.sh)
    local accel=tcg
    ((${VHOSTMQ_GUEST_SMP:-1} > 1)) && accel=tcg,thread=single
    local qemu=("${VHOSTMQ_QEMU:-qemu-system-x86_64}" -accel "$accel" -machine q35 -m 512 -smp "${VHOSTMQ_GUEST_SMP:-1}"
        -nodefaults -display none -monitor none -no-reboot)
    # shellcheck disable=SC2054  # commas are QEMU option syntax
    ((shared)) && qemu+=(-object memory-backend-memfd,id=mem0,size=512M,share=on -numa node,memdev=mem0)
    qemu+=(-kernel "$GUEST_KERNEL" -initrd "$GUEST_INITRD"
        -append "${VHOSTMQ_GUEST_CMDLINE:-console=ttyS0 panic=-1 loglevel=4} vmq.name=$name $*"
        "${net[@]}" -serial "file:${VMQ_GUEST_LOG[$name]}")
    [[ -z ${VMQ_GUEST_EXTRA[$name]:-} ]] || read -r -a extra <<<"${VMQ_GUEST_EXTRA[$name]}"
    qemu+=("${extra[@]}")
    [[ -z ${VMQ_GUEST_WRAP:-} ]] || read -r -a wrap <<<"$VMQ_GUEST_WRAP"
    printf '%q ' "${wrap[@]}" "${qemu[@]}" >"$work/guest-$name.cmd"
    echo >>"$work/guest-$name.cmd"
    VMQ_GUEST_T0[$name]=$(vmq_now)
    vmq_bg "$work/guest-$name.qemu.log" "$secs" "${wrap[@]}" "${qemu[@]}"
    VMQ_GUEST_PID[$name]=$VMQ_BG_PID
}

# vmq_guest_start NAME SOCKET connect|listen MAC QUEUES SECONDS WORKDIR CMDLINE...
#   vmq_guest_boot with one NIC: a vhost-user virtio-net-pci with QUEUES
#   queue pairs.  connect: QEMU dials SOCKET and redials every second
#   (reconnect=1); listen: QEMU listens (server=on,wait=off).
#   VMQ_GUEST_DEV_OPTS[NAME], if set, is appended to the virtio-net-pci
#   options (e.g. guest_tso4=off,guest_csum=off).
vmq_guest_start() {
    local name=$1 sock=$2 mode=$3 mac=$4 nq=$5 secs=$6 work=$7 chr mq=on
    shift 7
    case $mode in
        connect) chr="socket,id=chr0,path=$sock,reconnect=1" ;;
        listen) chr="socket,id=chr0,path=$sock,server=on,wait=off"; rm -f "$sock" ;;
        *) vmq_die "vmq_guest_start: mode must be connect or listen" ;;
    esac
    ((nq > 1)) || mq=off
    # vectors=0: QEMU 7.2 + TCG + vhost-user + MSI-X segfaults (msix_set_vector_notifiers)
    vmq_guest_boot "$name" "$work" "$secs" -chardev "$chr" -netdev "vhost-user,id=net0,chardev=chr0,queues=$nq" \
        -device "virtio-net-pci,netdev=net0,mac=$mac,mq=$mq,vectors=0${VMQ_GUEST_DEV_OPTS[$name]:+,${VMQ_GUEST_DEV_OPTS[$name]}}" \
        -- "vmq.queues=$nq" "$@"
    vmq_log "guest $name: pid ${VMQ_GUEST_PID[$name]}, $mode $sock, serial ${VMQ_GUEST_LOG[$name]}"
}

# vmq_guest_wait NAME REGEX SECONDS: wait for a serial-console line; fails
# (with the tail of the log and of QEMU's: VMQ_GUEST_QLOG[NAME], default
# guest-NAME.qemu.log beside it) when the guest exits first or on timeout.
# A guest QEMU started elsewhere (libvirt) is waited on by setting its
# VMQ_GUEST_LOG, VMQ_GUEST_PID and VMQ_GUEST_QLOG.
vmq_guest_wait() {
    local name=$1 rc=0
    vmq_wait_log "${VMQ_GUEST_LOG[$name]}" "$2" "$3" "${VMQ_GUEST_PID[$name]:-}" || rc=$?
    if ((rc != 0)); then
        vmq_log "guest $name: no /$2/ after $3 s ($([[ $rc == 2 ]] && echo "QEMU exited" || echo timeout)); last lines:"
        tail -n 15 "${VMQ_GUEST_LOG[$name]}" 2>/dev/null | tr -d '\r' | sed 's/^/    | /' >&2 || true
        sed 's/^/    qemu: /' "${VMQ_GUEST_QLOG[$name]:-$(dirname "${VMQ_GUEST_LOG[$name]}")/guest-$name.qemu.log}" 2>/dev/null | tail -n 5 >&2 || true
        return 1
    fi
}

# vmq_tap_guest NAME NETNS MAC IP MTU CMDLINE...: a guest on the kernel's
#   path beside the dataplane's, for comparison: its NIC on a tap (no
#   vhost-net) in NETNS's bridge br0, address IP (vmq.ip), work dir $WORK.
#   MTU empty: the default; else the NIC's host_mtu and the tap's MTU.
vmq_tap_guest() {
    local name=$1 ns=$2 mac=$3 ip=$4 mtu=$5 tap=kt$1$$
    shift 5
    tap=${tap:0:15}
    local nic="virtio-net-pci,netdev=net0,mac=$mac" mtuset=()
    if [[ -n $mtu ]]; then
        nic+=",host_mtu=$mtu"
        mtuset=(mtu "$mtu")
    fi
    VMQ_GUEST_WRAP="ip netns exec $ns" vmq_guest_boot "$name" "$WORK" 240 \
        -netdev "tap,id=net0,ifname=$tap,script=no,downscript=no,vhost=off" \
        -device "$nic" -- "vmq.ip=$ip" "$@"
    local i
    for ((i = 0; i < 100; i++)); do
        ip -n "$ns" link set "$tap" "${mtuset[@]}" master br0 up 2>/dev/null && return 0
        sleep 0.1
    done
    vmq_fail "kernel path: tap $tap for $name did not appear in $ns"
}

# vmq_guest_boot_s NAME: host seconds from QEMU start to the guest's "boot" line
# (measured now: call it right after vmq_guest_wait NAME 'VHOSTMQ-RESULT boot')
vmq_guest_boot_s() { vmq_elapsed "${VMQ_GUEST_T0[$1]}"; }

vmq_guest_stop() {
    local name=$1
    [[ -n ${VMQ_GUEST_PID[$name]:-} ]] || return 0
    vmq_stop "${VMQ_GUEST_PID[$name]}"
}

# vmq_build_guest: build (or reuse) the guest image, quietly unless it fails
vmq_build_guest() {
    "$VMQ_HACK_DIR/guest/build.sh" -o "$VMQ_GUEST_DIR" >&2 || vmq_die "guest image build failed"
}

# ------------------------------------------------------------------ two-guest scenario
# Used by e2e-qemu.sh and demo.sh.  Two guests, "a" (client: ping, iperf3
# forward and reverse, optionally then a continuous pinger) and "b" (iperf3
# server), each on its own port of one backend.  Results go to VMQ_RES and to
# WORK/result.env; soft assertions to VMQ_FAILS.
declare -A VMQ_RES=()
VMQ_TG_GUEST_S=240      # bound on each QEMU
VMQ_TG_BACKEND_S=300    # bound on each backend process
VMQ_TG_INTERVAL=0.2     # pinger interval (s)

vmq_res() { VMQ_RES[$1]=$2; printf '%s=%q\n' "$1" "$2" >>"$VMQ_TG_WORK/result.env"; }

# vmq_tg_setup WORK ROLE(server|client) QUEUES
vmq_tg_setup() {
    VMQ_TG_WORK=$1 VMQ_TG_ROLE=$2 VMQ_TG_Q=$3
    mkdir -p "$VMQ_TG_WORK"
    : >"$VMQ_TG_WORK/result.env"
    vmq_need "${VHOSTMQ_QEMU:-qemu-system-x86_64}" jq timeout awk
    [[ $VMQ_BACKEND != testpmd ]] || vmq_need dpdk-testpmd
    VMQ_SOCK_ROLE=$VMQ_TG_ROLE
    vmq_ports_reset
    vmq_port_add a "$VMQ_TG_WORK/a.sock" "$VMQ_TG_Q" 52:54:00:00:00:0a
    vmq_port_add b "$VMQ_TG_WORK/b.sock" "$VMQ_TG_Q" 52:54:00:00:00:0b
    VMQ_TG_STATS=$VMQ_TG_WORK/stats.json
    VMQ_TG_CFG=$VMQ_TG_WORK/dataplane.yaml
    rm -f "$VMQ_TG_STATS"
    vmq_write_config "$VMQ_TG_CFG" "$VMQ_TG_STATS"
    vmq_res role "$VMQ_TG_ROLE"
    vmq_res queues "$VMQ_TG_Q"
    vmq_res backend "$VMQ_BACKEND"
    vmq_res work "$VMQ_TG_WORK"
    vmq_res cpu_psi_start "$(vmq_cpu_psi)"
}

# vmq_tg_boot A_ROLES [EXTRA_CMDLINE...]: start backend and both guests in the
# order the socket role needs, wait for both to boot and report queues.
vmq_tg_boot() {
    local aroles=$1 mode g
    shift
    local common=("vmq.duration=$((VMQ_TG_GUEST_S - 20))" "vmq.interval=$VMQ_TG_INTERVAL" "$@")
    VMQ_TG_AROLES=$aroles
    if [[ $VMQ_TG_ROLE == server ]]; then
        mode=connect
        vmq_backend_start "$VMQ_TG_WORK" "$VMQ_TG_CFG" "$VMQ_TG_STATS" "$VMQ_TG_BACKEND_S"
    else
        mode=listen
    fi
    vmq_guest_start b "$VMQ_TG_WORK/b.sock" "$mode" 52:54:00:00:00:0b "$VMQ_TG_Q" "$VMQ_TG_GUEST_S" "$VMQ_TG_WORK" \
        vmq.ip=10.0.0.2/24 vmq.role=server "${common[@]}"
    vmq_guest_start a "$VMQ_TG_WORK/a.sock" "$mode" 52:54:00:00:00:0a "$VMQ_TG_Q" "$VMQ_TG_GUEST_S" "$VMQ_TG_WORK" \
        vmq.ip=10.0.0.1/24 vmq.peer=10.0.0.2 "vmq.role=$aroles" "${common[@]}"
    if [[ $VMQ_TG_ROLE == client ]]; then
        # QEMU listens; the backend dials (and would re-dial) once the sockets exist
        for g in a b; do
            vmq_wait_path "$VMQ_TG_WORK/$g.sock" 20 "${VMQ_GUEST_PID[$g]}" || vmq_die "QEMU $g did not create its socket"
        done
        vmq_backend_start "$VMQ_TG_WORK" "$VMQ_TG_CFG" "$VMQ_TG_STATS" "$VMQ_TG_BACKEND_S"
    fi
    for g in a b; do
        vmq_guest_wait "$g" '^VHOSTMQ-RESULT boot ' 60 || vmq_die "guest $g did not boot"
        vmq_res "boot_s_$g" "$(vmq_guest_boot_s "$g")"
    done
    for g in a b; do
        vmq_guest_wait "$g" '^VHOSTMQ-RESULT link ' 90 || vmq_die "guest $g did not bring eth0 up"
        local log=${VMQ_GUEST_LOG[$g]} rx tx link
        rx=$(vmq_result "$log" queues rx) tx=$(vmq_result "$log" queues tx) link=$(vmq_result "$log" link state)
        vmq_res "queues_$g" "$rx/$tx"
        vmq_res "link_$g" "$link"
        if [[ $rx == "$VMQ_TG_Q" && $tx == "$VMQ_TG_Q" ]]; then
            vmq_ok "guest $g uses $rx rx + $tx tx queues"
        else
            vmq_fail "guest $g has rx=$rx tx=$tx queues after ethtool -L combined $VMQ_TG_Q ($(vmq_result_line "$log" queues))"
        fi
        [[ $link == up ]] || vmq_fail "guest $g: eth0 operstate $link"
    done
}

# vmq_tg_traffic: wait for guest a's client role, check ping/iperf results and
# the per-queue counters of both ports
vmq_tg_traffic() {
    local la=${VMQ_GUEST_LOG[a]} d g rc idle ret=0
    # guest a gives up after 60 s without an answer from b
    if vmq_guest_wait a '^VHOSTMQ-RESULT reach ' 90; then
        vmq_guest_wait a '^VHOSTMQ-RESULT role-done role=client ' 150 || vmq_fail "guest a did not finish the client role"
    else
        vmq_fail "guest a did not report whether b is reachable"
    fi
    vmq_res ping "$(vmq_result "$la" ping received)/$(vmq_result "$la" ping sent)"
    vmq_res ping_loss_pct "$(vmq_result "$la" ping loss_pct)"
    vmq_res rtt_ms "$(vmq_result "$la" ping rtt_min_ms)/$(vmq_result "$la" ping rtt_avg_ms)/$(vmq_result "$la" ping rtt_max_ms)"
    if [[ $(vmq_result "$la" reach ok) == 1 && $(vmq_result "$la" ping received) =~ ^[1-9][0-9]*$ ]]; then
        vmq_ok "ping a -> b: ${VMQ_RES[ping]} received, rtt min/avg/max ${VMQ_RES[rtt_ms]} ms"
    else
        vmq_fail "ping a -> b failed: $(vmq_result_line "$la" reach); $(vmq_result_line "$la" ping)"
        ret=1
    fi
    for d in forward reverse; do
        local line gbps
        line=$(vmq_iperf_line "$la" "$d")
        rc=$(vmq_kv "$line" rc) gbps=$(vmq_kv "$line" gbps)
        vmq_res "gbps_$d" "${gbps:-none}"
        vmq_res "retrans_$d" "$(vmq_kv "$line" retrans)"
        if [[ $rc == 0 ]] && awk -v g="${gbps:-0}" 'BEGIN { exit !(g > 0) }'; then
            vmq_ok "iperf3 $d: $gbps Gbit/s"
        else
            vmq_fail "iperf3 $d failed: ${line:-no result line}"
        fi
    done
    # counters: every queue a guest used during the traffic, by its own
    # counters, was served on that pair (which queues it uses is the
    # guest's choice: XPS and its flow hash)
    sleep 1 # guest b reports its counters as its last iperf3 session ends; the stats file is 500 ms old at most
    for g in a b; do
        local q
        q=$(vmq_guest_queue_check "$VMQ_TG_STATS" "$g" "$VMQ_TG_Q")
        if [[ $q == ok:* ]]; then
            vmq_ok "port $g: every queue guest $g used was served on its pair (pair guest_tx/dataplane_tx guest_rx/dataplane_rx: ${q#ok: })"
        else
            vmq_fail "port $g: ${q#fail: } (stats $VMQ_TG_STATS)"
        fi
    done
    [[ -s $VMQ_TG_STATS ]] && cp "$VMQ_TG_STATS" "$VMQ_TG_WORK/stats-traffic.json"
    for g in a b; do
        [[ $(vmq_stats_port "$VMQ_TG_STATS" "$g" connected false) == true ]] || vmq_fail "dataplane stats: port $g not connected"
        idle=$(vmq_stats_port "$VMQ_TG_STATS" "$g" enabledPairs "")
        [[ -z $idle || $idle == "$VMQ_TG_Q" ]] || vmq_fail "dataplane stats: port $g enabledPairs=$idle, want $VMQ_TG_Q"
    done
    if ((ret)); then # show what the backend and QEMU said, for the failure report
        vmq_log "backend log $VMQ_BE_LOG (warnings and errors):"
        grep -a -i -E 'level=(WARN|ERROR)|error|fail' "$VMQ_BE_LOG" | sed 's/^time=[^ ]* //' | sort | uniq -c | sort -rn | head -n 8 | sed 's/^/    /' >&2 || true
        for g in a b; do
            sort "$VMQ_TG_WORK/guest-$g.qemu.log" 2>/dev/null | uniq -c | head -n 5 | sed "s/^/    qemu $g: /" >&2 || true
        done
    fi
    return "$ret"
}

vmq_ping_oks() { vmq_count_log "${VMQ_GUEST_LOG[a]}" '^VHOSTMQ-PING ok'; }
# vmq_ping_line N: the Nth ok line's "t run seq" (guest uptime, ping process
# number, sequence number within that process)
vmq_ping_line() {
    tr -d '\r' <"${VMQ_GUEST_LOG[a]}" | awk -v n="$1" '/^VHOSTMQ-PING ok/ && ++c == n {
        for (i = 3; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] } print v["t"], v["run"], v["seq"]; exit }'
}
# vmq_wait_oks N SECONDS: wait until guest a has printed N ok lines in total
vmq_wait_oks() {
    local want=$1 end
    end=$(($(date +%s%N) / 1000000 + $2 * 1000))
    while (($(vmq_ping_oks) < want)); do
        (($(date +%s%N) / 1000000 < end)) || return 1
        vmq_alive "${VMQ_GUEST_PID[a]}" || return 1
        sleep 0.05
    done
}

# vmq_tg_reconnect DOWN_S: guest a pings b continuously (role pinger); the
# backend is SIGKILLed, kept down DOWN_S seconds, and started again with the
# same config.  Measures the outage; the guests keep running throughout.
vmq_tg_reconnect() {
    local down=$1 n0 nk before after t_kill t_start t_ok pa pb
    vmq_guest_wait a '^VHOSTMQ-RESULT pinger ' 30 || { vmq_fail "guest a did not start pinging"; return; }
    n0=$(vmq_ping_oks)
    if ! vmq_wait_oks $((n0 + 5)) 30; then
        vmq_fail "reconnect: guest a gets no ping replies before the restart"
        return
    fi
    pa=${VMQ_GUEST_PID[a]} pb=${VMQ_GUEST_PID[b]}
    t_kill=$(vmq_now)
    vmq_log "reconnect: SIGKILL backend, down ${down}s"
    vmq_backend_crash
    nk=$(vmq_ping_oks)
    before=$(vmq_ping_line "$nk")
    sleep "$down"
    t_start=$(vmq_now)
    vmq_backend_start "$VMQ_TG_WORK" "$VMQ_TG_CFG" "$VMQ_TG_STATS" "$VMQ_TG_BACKEND_S"
    if vmq_wait_oks $((nk + 1)) 60; then
        t_ok=$(vmq_now)
        after=$(vmq_ping_line $((nk + 1)))
        vmq_res reconnect recovered
        vmq_res reconnect_first_ok_s "$(vmq_elapsed "$t_start" "$t_ok")"
        vmq_res reconnect_outage_s "$(vmq_elapsed "$t_kill" "$t_ok")"
        # lost pings: the sequence gap when the same ping process spans the
        # outage, else estimated from the interval (busybox ping restarted)
        vmq_res reconnect_outage_guest_s "$(awk -v a="$before" -v b="$after" 'BEGIN { split(a, x, " "); split(b, y, " "); printf "%.2f", y[1] - x[1] }')"
        vmq_res reconnect_lost_pings "$(awk -v a="$before" -v b="$after" -v iv="$VMQ_TG_INTERVAL" 'BEGIN {
            split(a, x, " "); split(b, y, " ")
            if (x[2] == y[2]) print y[3] - x[3] - 1; else printf "~%d", (y[1] - x[1]) / iv - 1 }')"
        vmq_res reconnect_down_s "$down"
        vmq_ok "reconnect: first ping reply ${VMQ_RES[reconnect_first_ok_s]} s after the restart," \
            "outage ${VMQ_RES[reconnect_outage_s]} s (guest clock ${VMQ_RES[reconnect_outage_guest_s]} s," \
            "${VMQ_RES[reconnect_lost_pings]} pings lost)"
        vmq_wait_oks $((nk + 6)) 20 || vmq_fail "reconnect: pings did not stay up after the first reply"
    else
        vmq_res reconnect failed
        vmq_fail "reconnect: no ping reply within 60 s of restarting the backend (see $VMQ_BE_LOG)"
    fi
    # same guests all along: same QEMU processes, one boot each
    local g
    for g in a b; do
        [[ $(vmq_count_log "${VMQ_GUEST_LOG[$g]}" '^VHOSTMQ-RESULT boot ') == 1 ]] || vmq_fail "reconnect: guest $g rebooted"
    done
    if ! vmq_alive "$pa" || ! vmq_alive "$pb"; then vmq_fail "reconnect: a QEMU process exited"; fi
    vmq_eventually 10 "reconnect: both ports connected again in the dataplane's stats" "a=true b=true" \
        vmq_stats_connected "$VMQ_TG_STATS" a b || true
    [[ -s $VMQ_TG_STATS ]] && cp "$VMQ_TG_STATS" "$VMQ_TG_WORK/stats-reconnect.json"
}

# vmq_cpu_psi: CPU pressure (PSI "some" avg10, %): how busy the machine was
# with other work; TCG guests slow down a lot on a loaded 2-core machine
vmq_cpu_psi() { awk '/^some/ { sub(/avg10=/, "", $2); print $2 }' /proc/pressure/cpu 2>/dev/null || echo "?"; }

# vmq_tg_teardown: stop the guests, then the backend; a dataplane must exit 0 on SIGTERM
vmq_tg_teardown() {
    vmq_res cpu_psi_end "$(vmq_cpu_psi)"
    vmq_guest_stop a
    vmq_guest_stop b
    vmq_backend_stop
    vmq_res backend_exit "$VMQ_RC"
    if [[ $VMQ_BACKEND == dataplane && $VMQ_RC != 0 ]]; then
        vmq_fail "dataplane exited with status $VMQ_RC on SIGTERM (want 0$([[ $VMQ_RC == 137 ]] && echo "; 137: SIGKILLed after not exiting within 5 s"); log $VMQ_BE_LOG)"
    fi
}

# vmq_tg_summary: human-readable report of one scenario (stdout)
vmq_tg_summary() {
    local stats=$VMQ_TG_WORK/stats-traffic.json
    [[ -s $stats ]] || stats=$VMQ_TG_STATS
    echo
    echo "===== vhostmq two-guest run: role=$VMQ_TG_ROLE queue pairs=$VMQ_TG_Q backend=$VMQ_BACKEND" \
        "(host CPU pressure avg10 ${VMQ_RES[cpu_psi_start]:-?}% -> ${VMQ_RES[cpu_psi_end]:-?}%) ====="
    {
        echo "guest roles boot_s queues(rx/tx) link"
        echo "a $VMQ_TG_AROLES ${VMQ_RES[boot_s_a]:-?} ${VMQ_RES[queues_a]:-?} ${VMQ_RES[link_a]:-?}"
        echo "b server ${VMQ_RES[boot_s_b]:-?} ${VMQ_RES[queues_b]:-?} ${VMQ_RES[link_b]:-?}"
    } | vmq_table
    echo
    echo "ping a->b        ${VMQ_RES[ping]:-?} received, loss ${VMQ_RES[ping_loss_pct]:-?}%, rtt min/avg/max ${VMQ_RES[rtt_ms]:-?} ms"
    echo "iperf3 forward   ${VMQ_RES[gbps_forward]:-?} Gbit/s (a -> b, retransmits ${VMQ_RES[retrans_forward]:-?})"
    echo "iperf3 reverse   ${VMQ_RES[gbps_reverse]:-?} Gbit/s (b -> a, retransmits ${VMQ_RES[retrans_reverse]:-?})"
    if [[ -n ${VMQ_RES[reconnect]:-} ]]; then
        echo "reconnect        ${VMQ_RES[reconnect]}: SIGKILL, down ${VMQ_RES[reconnect_down_s]:-?} s;" \
            "first reply ${VMQ_RES[reconnect_first_ok_s]:-?} s after restart;" \
            "total outage ${VMQ_RES[reconnect_outage_s]:-?} s (guest clock ${VMQ_RES[reconnect_outage_guest_s]:-?} s," \
            "${VMQ_RES[reconnect_lost_pings]:-?} pings lost)"
    fi
    echo
    echo "per-queue counters after iperf3 ($stats; rx = toward the guest, tx = from the guest):"
    vmq_stats_table "$stats" | sed 's/^/  /'
}
