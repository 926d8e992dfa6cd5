#!/usr/bin/env bash
# Callgrind instructions per frame: vhostmq's per-frame path against DPDK's
# vhost backend (Debian's dpdk-testpmd, DPDK 22.11, net_vhost ports) on the
# same frames.  Prints both and their ratio; --budget turns vhostmq's counts
# into a pass/fail check.  What `make bench-instructions` runs.
#
# vhostmq  the in-process benchmarks of dataplane/bench_paths_test.go, built
#          once (go test -c), each run under
#            GOGC=off GODEBUG=asyncpreemptoff=1,cpu.rdtscp=off valgrind
#            --tool=callgrind --fair-sched=yes
#            --toggle-collect='github.com/vhostmq/vhostmq/dataplane.(*worker).pass'
#          at -test.benchtime Nx and N0x; per frame = (I(N) - I(N0)) / (N - N0),
#          which removes the set-up, the warm-up and the b.N=1 probe
#          (GOGC=off: no write-barrier noise; cpu.rdtscp=off: valgrind 3.19
#          dies on RDTSCP).  I = the PROGRAM TOTALS of the run: the rig's
#          dataplane has one worker, stopped before its ports exist, and no
#          watchdog, so every pass counted is one the benchmark drove (the
#          learning passes are the same in both runs); repeat runs agree to
#          +-0.5 per frame.  Column "bench-calls": the same from the calls
#          callgrind attributes to pathRig.burst -> worker.pass, a
#          cross-check (callgrind now and then loses a caller across Go's
#          stack switches, so it is not the measure).
# DPDK     the backend dpdk-testpmd (one forwarding lcore) under callgrind
#          (--separate-threads=yes), the frontend dpdk-testpmd native with
#          net_virtio_user ports (split ring, in_order=0, queue_size=1024).
#          Debian's testpmd is stripped: --toggle-collect cannot name
#          pkt_burst_io_forward / pkt_burst_receive, so the script finds the
#          forwarding function in the forwarding lcore's call graph (the
#          dpdk-testpmd function that calls the net_vhost PMD's burst
#          functions, called once per poll) and takes its inclusive count:
#          what --toggle-collect on it would count (PMD rx/tx,
#          rte_vhost_dequeue/enqueue_burst, xstats, mbuf alloc and free).
#          Two phases: the backend forwards for --dpdk-idle s while the
#          frontend is connected but sends nothing (every poll empty; then
#          callgrind_control --dump), then for --dpdk-seconds with traffic;
#          `stop` and `quit` through the prompt.  The frontend, native on a
#          busy machine, is descheduled for milliseconds at a time and the
#          backend polls empty meanwhile (often most of its polls), so
#            per frame = (I(fwd) - empty polls * I(empty poll)) / frames
#          with I(empty poll) from the idle phase (a constant: the same code
#          path every time), frames = the backend's RX-packets, non-empty
#          polls = the PMD tx calls (io: tx runs only after rx returned
#          frames) or frames / 32 (rxonly: the frontend queues whole bursts).
#          logs/dpdk-PATH/ has the raw count and the empty polls too.
#
# Paths (SIZE 64 or 1500):
#   g2h-SIZE          vhostmq: BenchmarkPathTxDrop/SIZEB (dequeue, header
#                     peek, learning, lookup miss, drop).  DPDK: rxonly on
#                     one vhost port, the frontend txonly (dequeue into an
#                     mbuf, free), like run.sh's g2h
#   p2p-SIZE-mrg      vhostmq: BenchmarkPathForward/mrg/SIZEB (a -> b, 2 KiB
#   p2p-SIZE-nomrg      mergeable RX buffers; nomrg: without MRG_RXBUF).
#                     DPDK: io vhost0 <-> vhost1, the frontend io-forwards
#                     between its two virtio-user ports (mrg_rxbuf=1/0), the
#                     loop seeded with `start tx_first K`, like run.sh's p2p
#   p2p-SIZE-span512  vhostmq: mrg-span512 (512 B RX buffers, a 1500 B frame
#                     spans 3; TX frames in one descriptor).  DPDK: the p2p
#                     loop with --mbuf-size=628 on the frontend (virtio posts
#                     628 - 128 headroom + 12 header = 512 B RX buffers) and
#                     --enable-scatter.  testpmd has one mempool, so its TX
#                     frames are chains of 500 B segments (an indirect
#                     descriptor table) too, which the rig does not send:
#                     the dequeue of that run is replaced by the dequeue
#                     (rte_vhost_dequeue_burst, inclusive) of the
#                     p2p-SIZE-mrg run (same frames, one TX descriptor; run
#                     too if not asked for).  logs/dpdk-PATH-raw: as measured
#   p2p-SIZE-macflood vhostmq only: p2p-SIZE-mrg while the network's MAC
#                     table learns 32 new addresses before every burst
#                     (VHOSTMQ_BENCH_MAC_FLOOD, outside the pass: a
#                     source-address flood on the uplink); against
#                     p2p-SIZE-mrg it is what such a flood costs the busy path
#   p2p-SIZE-log      vhostmq only: p2p-SIZE-mrg while b's frontend migrates
#                     (LOG_ALL on, a dirty log, the used ring logged): the
#                     cost of dirty-page logging, against p2p-SIZE-mrg
# Default paths: g2h-64 p2p-64-mrg p2p-64-nomrg p2p-1500-mrg p2p-1500-nomrg
# p2p-1500-span512.
#
# Usage: hack/bench/instructions.sh [--paths LIST] [--n 25600] [--n0 3200]
#          [--smoke] [--dpdk | --no-dpdk] [--dpdk-seconds 30] [--dpdk-idle 5]
#          [--dpdk-mem nohuge|huge] [--seed-bursts 8] [--out DIR]
#          [--budget FILE]
#   --paths LIST      comma/space separated paths (above)
#   --n N, --n0 N0    benchtime of the two vhostmq runs (multiples of 32)
#   --smoke           what CI runs: g2h-64 p2p-64-mrg p2p-1500-mrg
#                     p2p-1500-span512 p2p-64-macflood, N=6400 N0=3200, no DPDK (unless
#                     --dpdk); the same counts as the long run (+-0.1)
#   --no-dpdk/--dpdk  skip / run the DPDK side (default: run it, except
#                     with --smoke)
#   --dpdk-seconds S  traffic window of each DPDK run (default 30)
#   --dpdk-idle S     idle window (empty polls only) before it (default 5)
#   --dpdk-mem        EAL memory of both testpmds: nohuge (default: --no-huge
#                     -m 512, memfd) or huge (-m 512 --single-file-segments;
#                     works under valgrind too, but takes 2 MiB pages other
#                     runs on the machine may want)
#   --seed-bursts K   32-frame bursts per direction seeding a p2p loop
#                     (default 8; K*32 must fit the 1024-entry rings)
#   --out DIR         results (default _output/bench/instructions-<UTC time>):
#                     instructions.tsv, meta.txt, logs/ (per run: callgrind
#                     files, callgrind_annotate top 20, per-frame profiles)
#   --pgo PROFILE     build the test binary with this CPU profile (go
#                     build -pgo; to try one: go test -cpuprofile on the
#                     path benchmarks).  Default: none, as the dataplane
#                     binary is built (PGO made the gathered path slower:
#                     docs/performance.md)
#   --budget FILE     TSV "path<TAB>instructions" ('#' comments and a
#                     "path" header line allowed): exit 1 naming every path
#                     whose vhostmq count is more than 10 % over its budget;
#                     a budgeted path that was not measured is an error
# Exit status 1 if a run failed or the budget check failed.  DPDK needs
# root and 2 CPUs.  Needs valgrind, go, python3, and for DPDK dpdk-dev,
# librte-net-vhost23 and librte-net-virtio23 (all from hack/install-deps.sh).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=../lib.sh disable=SC1091
source "$HERE/../lib.sh"
# shellcheck source-path=SCRIPTDIR source=lib.sh disable=SC1091
source "$HERE/lib.sh"
# shellcheck disable=SC2034  # read by lib.sh
VMQ_TAG=instr

PATHS="" N=25600 N0=3200 SMOKE=0 DPDK="" DPDK_S=30 IDLE_S=5 MEM=nohuge SEED=8 OUT="" BUDGET="" PGO=off
ARGS=("$@")
while (($#)); do
    case $1 in
        --paths) PATHS+=" $2"; shift 2 ;;
        --n) N=$2; shift 2 ;;
        --n0) N0=$2; shift 2 ;;
        --smoke) SMOKE=1; shift ;;
        --dpdk) DPDK=1; shift ;;
        --no-dpdk) DPDK=0; shift ;;
        --dpdk-seconds) DPDK_S=$2; shift 2 ;;
        --dpdk-idle) IDLE_S=$2; shift 2 ;;
        --dpdk-mem) MEM=$2; shift 2 ;;
        --seed-bursts) SEED=$2; shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        --budget) BUDGET=$2; shift 2 ;;
        --pgo) PGO=$2; shift 2 ;;
        -h | --help) vmq_usage "$0"; exit 0 ;;
        *) vmq_die "unknown argument: $1 (see --help)" ;;
    esac
done
if ((SMOKE)); then
    N=6400 N0=3200
    [[ -n ${PATHS// /} ]] || PATHS="g2h-64 p2p-64-mrg p2p-1500-mrg p2p-1500-span512 p2p-64-macflood"
    [[ -n $DPDK ]] || DPDK=0
fi
[[ -n $DPDK ]] || DPDK=1
[[ -n ${PATHS// /} ]] || PATHS="g2h-64 p2p-64-mrg p2p-64-nomrg p2p-1500-mrg p2p-1500-nomrg p2p-1500-span512"

# ---------------------------------------------------------------- arguments
posint() { [[ $2 =~ ^[1-9][0-9]*$ ]] || vmq_die "$1 must be a positive integer, not '$2'"; }
posint --n "$N"
posint --n0 "$N0"
posint --dpdk-seconds "$DPDK_S"
posint --dpdk-idle "$IDLE_S"
posint --seed-bursts "$SEED"
((N > N0)) || vmq_die "--n ($N) must be larger than --n0 ($N0)"
((N % 32 == 0 && N0 % 32 == 0)) || vmq_die "--n and --n0 must be multiples of 32 (a pass handles 32 frames)"
((SEED * 32 <= 1024)) || vmq_die "--seed-bursts $SEED: more frames than a 1024-entry ring holds"
[[ $MEM =~ ^(nohuge|huge)$ ]] || vmq_die "--dpdk-mem must be nohuge or huge"
PATH_LIST=()
for p in ${PATHS//,/ }; do
    [[ $p =~ ^(g2h-(64|1500)|p2p-(64|1500)-(mrg|nomrg|span512|log|macflood))$ ]] ||
        vmq_die "--paths: '$p' is not g2h-SIZE or p2p-SIZE-{mrg,nomrg,span512,log,macflood} (SIZE 64 or 1500)"
    [[ " ${PATH_LIST[*]} " == *" $p "* ]] || PATH_LIST+=("$p")
done
((${#PATH_LIST[@]} > 0)) || vmq_die "--paths is empty"
if [[ -n $BUDGET ]]; then
    [[ -r $BUDGET ]] || vmq_die "--budget: cannot read $BUDGET"
    BUDGET=$(cd "$(dirname "$BUDGET")" && pwd)/$(basename "$BUDGET")
fi

# ---------------------------------------------------------------- environment
for c in valgrind callgrind_annotate go "$VMQ_PY" timeout; do
    command -v "$c" >/dev/null || vmq_die "$c missing$([[ $c == valgrind || $c == callgrind_annotate ]] && echo ': apt-get install valgrind')"
done
if ((DPDK)); then
    vmq_need_root
    for c in dpdk-testpmd callgrind_control stdbuf mkfifo; do
        command -v "$c" >/dev/null || vmq_die "$c missing: run hack/install-deps.sh (and apt-get install valgrind)"
    done
    (($(nproc) >= 2)) || vmq_die "the DPDK side needs 2 CPUs"
fi
GO=${GO:-go}
V_GO=$("$GO" version)
V_VG=$(valgrind --version)
V_DPDK=$(dpkg-query -W -f='${Version}' dpdk-dev 2>/dev/null || echo '?')
vmq_log "go: $V_GO"
vmq_log "valgrind: $V_VG"
if ((DPDK)); then
    vmq_log "dpdk-testpmd: $(command -v dpdk-testpmd) (dpdk-dev $V_DPDK)"
else
    vmq_log "dpdk-testpmd: not used (--no-dpdk$( ((SMOKE)) && echo ', --smoke'))"
fi

[[ -n $OUT ]] || OUT=$VMQ_REPO_ROOT/_output/bench/instructions-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$OUT/logs"
OUT=$(cd "$OUT" && pwd)
LOGS=$OUT/logs
vmq_init
# binaries and sockets live in a short private directory (AF_UNIX paths are short)
WORK=$(mktemp -d /tmp/vmqinstr.XXXXXX)
vmq_track_path "$WORK"
T0=$(vmq_now)
FAILED=0
FE_CPU=0 BE_CPU=1
MAC_A=02:76:6d:71:00:0a
MAC_B=02:76:6d:71:00:0b
MAC_NOBODY=02:76:6d:71:00:ff
if [[ $MEM == huge ]]; then MEMW=(-m 512 --single-file-segments); else MEMW=(--no-huge -m 512); fi
((DPDK)) && vmq_log "dpdk memory: ${MEMW[*]} (--dpdk-mem $MEM), callgrind on the backend, frontend native"

{
    echo "started_utc $(date -u +%FT%TZ)"
    echo "command hack/bench/instructions.sh ${ARGS[*]}"
    echo "paths ${PATH_LIST[*]}"
    echo "git $(git -C "$VMQ_REPO_ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$VMQ_REPO_ROOT" diff --quiet HEAD -- dataplane 2>/dev/null || echo ' (dataplane/ modified)')"
    echo "go $V_GO"
    echo "valgrind $V_VG"
    echo "dpdk $( ((DPDK)) && echo "dpdk-dev $V_DPDK, ${MEMW[*]}, window ${DPDK_S}s, idle ${IDLE_S}s, seed bursts $SEED" || echo "not run")"
    echo "vhostmq_pgo $PGO"
    echo "vhostmq_n $N"
    echo "vhostmq_n0 $N0"
    echo "kernel $(uname -r)"
    echo "cpu $(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)"
    echo "psi_cpu_at_start $(vmq_cpu_psi)"
} >"$OUT/meta.txt"

# ---------------------------------------------------------------- callgrind files
# cgpy CMD ARGS...: callgrind output analysis (python3, below)
cgpy() {
    "$VMQ_PY" - "$@" <<'PY'
import collections, glob, os, re, sys

def parse(path):
    """Self cost per function and call edges of one callgrind file.
    Functions are keyed (object, name): unnamed functions of stripped
    objects are named by their offset, which repeats across objects."""
    names = {"ob": {}, "fn": {}}
    def name(kind, val):
        m = re.match(r"\((\d+)\)(?:\s+(.*))?$", val.strip())
        if not m:
            return val.strip()
        if m.group(2) is not None:
            names[kind][m.group(1)] = m.group(2)
        return names[kind][m.group(1)]
    self_ = collections.Counter()
    edges = {}  # (caller, callee) -> [calls, inclusive]
    ob = fn = cob = cfn = None
    pending = None
    npos = 1
    with open(path) as f:
        for line in f:
            if pending is not None:
                parts = line.split()
                e = edges.setdefault((fn, cfn), [0, 0])
                e[0] += pending
                e[1] += int(parts[npos]) if len(parts) > npos else 0
                pending = None
                cob = None
                continue
            if line.startswith("positions:"):
                npos = len(line.split()) - 1
            elif line.startswith("ob="):
                ob = name("ob", line[3:])
            elif line.startswith("fn="):
                fn = (ob, name("fn", line[3:]))
                cob = None
            elif line.startswith("cob="):
                cob = name("ob", line[4:])
            elif line.startswith("cfn="):
                cfn = (cob or ob, name("fn", line[4:]))
            elif line.startswith("calls="):
                pending = int(line[6:].split()[0])
            elif line[:1].isdigit() or line[:1] in "+-*":
                parts = line.split()
                if fn is not None and len(parts) > npos:
                    self_[fn] += int(parts[npos])
    return self_, edges

def incl(self_, edges):
    out = collections.Counter(self_)
    for (a, b), (n, c) in edges.items():
        if a != b:
            out[a] += c
    return out

def calls_to(edges, f):
    return sum(n for (a, b), (n, c) in edges.items() if b == f and a != f)

def short(f):
    ob, fn = f
    return "%s [%s]" % (fn, os.path.basename(ob or "?"))

def vprofile(n, n0, fn_, fn0):
    """per-frame self instructions per function: (N run - N0 run) / (N - N0)"""
    s, _ = parse(fn_)
    s0, _ = parse(fn0)
    d = n - n0
    rows = sorted(((s[f] - s0.get(f, 0)) / d, f) for f in set(s) | set(s0))
    rows.reverse()
    tot = sum(r for r, _ in rows)
    print("# vhostmq per-frame self instructions, (run N=%d - run N0=%d) / %d; total %.1f" % (n, n0, d, tot))
    print("# (all of worker.pass: the worker's idle passes during set-up add timing noise, mostly in pass/serveSafely)")
    for r, f in rows[:40]:
        if abs(r) >= 0.05:
            print("%9.1f  %s" % (r, short(f)))

def dpdk(final_prefix, idle_prefix, frames, mode, burst, profile_out):
    # the forwarding lcore's thread file: where a dpdk-testpmd function
    # calls into the net_vhost PMD most often
    best = None
    for path in sorted(glob.glob(final_prefix + "-[0-9]*")):
        s, e = parse(path)
        cand = collections.Counter()
        for (a, b), (n, c) in e.items():
            if a and b and "dpdk-testpmd" in (a[0] or "") and "librte_net_vhost" in (b[0] or ""):
                cand[a] = max(cand[a], n)
        for f, n in cand.items():
            if best is None or n > best[0]:
                best = (n, path, f, s, e)
    if best is None:
        sys.exit("no dpdk-testpmd function calls the net_vhost PMD in %s-*" % final_prefix)
    _, path, fwd, s, e = best
    thread = path[len(final_prefix) + 1:]
    idle_path = "%s-%s" % (idle_prefix, thread)
    si, ei = parse(idle_path)
    inc, inci = incl(s, e), incl(si, ei)
    polls, polls_i = calls_to(e, fwd), calls_to(ei, fwd)
    if polls_i < 1000:
        sys.exit("idle phase: only %d polls of %s in %s" % (polls_i, fwd[1], idle_path))
    pmd = sorted(((n, b) for (a, b), (n, c) in e.items() if a == fwd and "librte_net_vhost" in (b[0] or "")), reverse=True)
    rx = pmd[0][1]
    if mode == "io":
        if len(pmd) < 2:
            sys.exit("io: the forwarding function never called the PMD tx function")
        tx = pmd[1][1]
        nonempty = pmd[1][0]
        how = "PMD tx calls"
    else:
        tx = None
        nonempty = -(-frames // burst)
        how = "frames/%d" % burst
    empty = polls - nonempty
    c_empty = inci[fwd] / polls_i
    raw = inc[fwd] / frames
    per = (inc[fwd] - empty * c_empty) / frames
    # per-frame profile: every function of the lcore thread, its idle cost
    # per poll times the empty polls taken off
    def corr(cnt, cnti, f):
        return (cnt.get(f, 0) - cnti.get(f, 0) / polls_i * empty) / frames
    named = [("forwarding function (inclusive)", fwd), ("PMD rx (inclusive)", rx)]
    if tx:
        named.append(("PMD tx (inclusive)", tx))
    for want in ("rte_vhost_dequeue_burst", "rte_vhost_enqueue_burst"):
        for f in inc:
            if f[1] == want:
                named.append((want + " (inclusive)", f))
    with open(profile_out, "w") as o:
        print("# DPDK per-frame instructions of the forwarding lcore (thread %s), empty polls taken off" % thread, file=o)
        print("# frames %d, polls %d (idle phase %d), non-empty %d (%s), empty %d (%.1f%%), one empty poll %.1f"
              % (frames, polls, polls_i, nonempty, how, empty, 100.0 * empty / max(polls, 1), c_empty), file=o)
        print("# raw (empty polls included) %.1f per frame, corrected %.1f" % (raw, per), file=o)
        for label, f in named:
            print("%9.1f  %s = %s; %.1f per empty poll" % (corr(inc, inci, f), label, short(f), inci.get(f, 0) / polls_i), file=o)
        print("# self per frame (top 25)", file=o)
        rows = sorted(((corr(s, si, f), f) for f in set(s) | set(si)), reverse=True)
        for r, f in rows[:25]:
            if abs(r) >= 0.05:
                print("%9.1f  %s" % (r, short(f)), file=o)
    def named_corr(want):
        for f in inc:
            if f[1] == want:
                return "%.1f" % corr(inc, inci, f)
        return "NA"
    print("per_frame=%.1f raw=%.1f frames=%d polls=%d nonempty=%d empty=%d empty_poll=%.1f deq=%s enq=%s thread=%s fwd=%s rx=%s tx=%s idle_polls=%d"
          % (per, raw, frames, polls, nonempty, empty, c_empty, named_corr("rte_vhost_dequeue_burst"),
             named_corr("rte_vhost_enqueue_burst"), thread, fwd[1], rx[1], tx[1] if tx else "-", polls_i))

def edge(path, caller, callee):
    """calls and inclusive instructions of the calls CALLER -> CALLEE"""
    _, e = parse(path)
    n = c = 0
    for (a, b), (k, v) in e.items():
        if a and b and a[1].endswith(caller) and b[1].endswith(callee):
            n += k
            c += v
    if n == 0:
        sys.exit("no call %s -> %s in %s" % (caller, callee, path))
    print(n, c)

def top(path, n):
    """the n functions with the most self instructions (callgrind_annotate
    3.19 books a whole thread on clone() in a dump taken mid-run)"""
    s, _ = parse(path)
    tot = sum(s.values())
    print("%s PROGRAM TOTALS (self instructions, %s)" % (format(tot, ","), path))
    for f, v in s.most_common(n):
        print("%15s (%5.2f%%)  %s" % (format(v, ","), 100.0 * v / max(tot, 1), short(f)))

cmd = sys.argv[1]
if cmd == "top":
    top(sys.argv[2], int(sys.argv[3]))
elif cmd == "edge":
    edge(sys.argv[2], sys.argv[3], sys.argv[4])
elif cmd == "vprofile":
    vprofile(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
elif cmd == "dpdk":
    dpdk(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], int(sys.argv[6]), sys.argv[7])
else:
    sys.exit("cgpy: unknown command " + cmd)
PY
}
# cg_total FILE: the brief's callgrind_annotate | awk '/PROGRAM TOTALS/ ...',
# reading to the end (an early awk exit is a SIGPIPE under pipefail)
cg_total() { callgrind_annotate "$1" | awk '/PROGRAM TOTALS/ && !t { gsub(",", "", $1); print $1; t = 1 }'; }
cg_top20() { # the 20 functions with the most self instructions
    callgrind_annotate --inclusive=no "$1" | awk '/PROGRAM TOTALS/ { print; next } /file:function/ { t = 1; print; next } t && NF && ++n <= 21'
}

# ---------------------------------------------------------------- vhostmq
declare -A VHOSTMQ=() VHOSTMQ_TOT=() DPDKR=() DPDKNOTE=()
bench_regex() { # bench_regex PATH: the anchored -test.bench regex of a path
    local p=$1 size
    [[ $p =~ -(64|1500)(-|$) ]]
    size=${BASH_REMATCH[1]}
    case $p in
        g2h-*) echo "^BenchmarkPathTxDrop\$/^${size}B\$" ;;
        *-span512) echo "^BenchmarkPathForward\$/^mrg-span512\$/^${size}B\$" ;;
        *-macflood) echo "^BenchmarkPathForward\$/^mrg\$/^${size}B\$" ;;
        *) echo "^BenchmarkPathForward\$/^${p##*-}\$/^${size}B\$" ;;
    esac
}
vhostmq_side() {
    local pgo=(-pgo=off)
    [[ $PGO != off ]] && pgo=(-pgo="$(realpath "$PGO")")
    vmq_log "building the dataplane test binary (go test -c ${pgo[*]} ./dataplane)"
    if ! (cd "$VMQ_REPO_ROOT" && "$GO" test -c "${pgo[@]}" -o "$WORK/dataplane.test" ./dataplane) >"$LOGS/go-test-c.log" 2>&1; then
        vmq_log "FAILED: go test -c ./dataplane (log $LOGS/go-test-c.log):"
        tail -n 15 "$LOGS/go-test-c.log" | sed 's/^/    /' >&2
        FAILED=$((FAILED + 1))
        return
    fi
    local p attempt d best
    for p in "${PATH_LIST[@]}"; do
        # The totals are the measure: the rig's only worker never runs on
        # its own, so every pass in them is one the benchmark drove. The
        # benchmark's passes as callgrind attributes them are a
        # cross-check: callgrind loses a caller now and then across Go's
        # stack switches (the calls come out one pass low), and a
        # goroutine switch inside a pass (the scheduler preempting the
        # benchmark under callgrind's slowness) can put another
        # goroutine's instructions into the totals. When the two disagree
        # by more than 1 % the path is measured again, up to 3 times, and
        # the closest pair is kept.
        best=""
        for attempt in 1 2 3; do
            vhostmq_measure "$p" || break
            d=$(awk -v a="$VM_PF" -v b="$VM_TOT" 'BEGIN { if (b !~ /^[0-9.]+$/ || a == 0) { print 0; exit } x = (a - b) / a; if (x < 0) x = -x; printf "%.4f", x }')
            if [[ -z $best ]] || awk -v d="$d" -v b="$best" 'BEGIN { exit !(d < b) }'; then
                best=$d VHOSTMQ[$p]=$VM_PF VHOSTMQ_TOT[$p]=$VM_TOT
                cp "$LOGS/vhostmq-$p.perframe.txt.try" "$LOGS/vhostmq-$p.perframe.txt" 2>/dev/null || true
            fi
            awk -v d="$d" 'BEGIN { exit !(d <= 0.01) }' && break
            vmq_log "vhostmq $p: the totals ($VM_PF) and the benchmark's calls ($VM_TOT) disagree by $(awk -v d="$d" 'BEGIN { printf "%.1f", d * 100 }') %$( ((attempt < 3)) && echo ": measuring again")"
        done
        rm -f "$LOGS/vhostmq-$p.perframe.txt.try"
        if [[ -z $best ]]; then
            VHOSTMQ[$p]=fail VHOSTMQ_TOT[$p]=fail
            FAILED=$((FAILED + 1))
        elif ((attempt > 1)); then
            vmq_log "vhostmq $p: kept ${VHOSTMQ[$p]} (benchmark's calls ${VHOSTMQ_TOT[$p]})"
        fi
    done
}

# vhostmq_measure PATH: the two callgrind runs of a path; sets VM_PF (per
# frame from the totals) and VM_TOT (from the benchmark's calls, or ?)
vhostmq_measure() {
    local p=$1 n re t0 out tot calls pi ok=1 edges=1
    local -A T=() B=()
    re=$(bench_regex "$p")
    for n in "$N0" "$N"; do
        out=$LOGS/vhostmq-$p-$n
        t0=$(vmq_now)
        local flood=0
        [[ $p == *-macflood ]] && flood=32
        if ! (cd "$VMQ_REPO_ROOT/dataplane" && VHOSTMQ_BENCH_MAC_FLOOD=$flood GOGC=off GODEBUG=asyncpreemptoff=1,cpu.rdtscp=off timeout 900 \
            valgrind --tool=callgrind --fair-sched=yes --callgrind-out-file="$out.callgrind" \
            --toggle-collect='github.com/vhostmq/vhostmq/dataplane.(*worker).pass' \
            "$WORK/dataplane.test" -test.run '^$' -test.bench "$re" -test.benchtime "${n}x") >"$out.log" 2>&1; then
            vmq_log "vhostmq $p N=$n: FAILED (log $out.log): $(grep -v '^==' "$out.log" | tail -n 3 | tr '\n' ' ')"
            ok=0
            break
        fi
        grep -q "^Benchmark.*[[:space:]]${n}[[:space:]]" "$out.log" || { vmq_log "vhostmq $p N=$n: no benchmark line with $n iterations (regex $re; log $out.log)"; ok=0; break; }
        tot=$(cg_total "$out.callgrind")
        [[ $tot =~ ^[0-9]+$ ]] || { vmq_log "vhostmq $p N=$n: no PROGRAM TOTALS in $out.callgrind"; ok=0; break; }
        T[$n]=$tot
        # the passes the benchmark drives (pathRig.burst -> worker.pass)
        if read -r calls pi < <(cgpy edge "$out.callgrind" '.(*pathRig).burst' 'dataplane.(*worker).pass' 2>>"$out.log"); then
            B[$n]=$pi
        else
            edges=0 calls='?' pi='?'
        fi
        cg_top20 "$out.callgrind" >"$out.top20.txt"
        vmq_log "vhostmq $p N=$n: $tot instructions in pass(), $pi in the benchmark's $calls passes ($(vmq_elapsed "$t0") s)"
    done
    ((ok)) || return 1
    VM_PF=$(awk -v a="${T[$N]}" -v b="${T[$N0]}" -v d=$((N - N0)) 'BEGIN { printf "%.1f", (a - b) / d }')
    VM_TOT='?'
    if ((edges)); then
        VM_TOT=$(awk -v a="${B[$N]}" -v b="${B[$N0]}" -v d=$((N - N0)) 'BEGIN { printf "%.1f", (a - b) / d }')
    fi
    cgpy vprofile "$N" "$N0" "$LOGS/vhostmq-$p-$N.callgrind" "$LOGS/vhostmq-$p-$N0.callgrind" \
        >"$LOGS/vhostmq-$p.perframe.txt.try" || vmq_log "vhostmq $p: per-frame profile failed"
    vmq_log "vhostmq $p: $VM_PF instructions/frame ((${T[$N]} - ${T[$N0]}) / $((N - N0)); $VM_TOT in the calls callgrind attributes to the benchmark)"
}

# ---------------------------------------------------------------- DPDK
# acc_stats LOG: "RX-packets TX-packets TX-dropped" of the last
# "Accumulated forward statistics" block testpmd printed
acc_stats() {
    awk '/Accumulated forward statistics/ { acc = 1; next }
         acc && /RX-packets:/ { rx = $2 }
         acc && /TX-packets:/ { tx = $2; d = $4; acc = 0 }
         END { if (rx != "") print rx, tx, d; else print "NA NA NA" }' "$1" 2>/dev/null || echo "NA NA NA"
}
RUN_N=0
declare -A DPDK_DEQ=()
# dpdk_one PATH [TAG]: one backend under callgrind, its frontend, both
# phases; the result goes to DPDKR[TAG] (default PATH)
dpdk_one() {
    local p=$1 tag=${2:-$1} mode size mrg=1 span=0 nports=2
    [[ $p =~ -(64|1500)(-|$) ]]
    size=${BASH_REMATCH[1]}
    case $p in
        g2h-*) mode=rxonly nports=1 ;;
        *-nomrg) mode=io mrg=0 ;;
        *-span512) mode=io span=1 ;;
        *) mode=io ;;
    esac
    RUN_N=$((RUN_N + 1))
    local rdir=$LOGS/dpdk-$tag sdir=$WORK/d$RUN_N
    rm -rf "$rdir"
    mkdir -p "$rdir" "$sdir"
    local socks=("$sdir/a.sock" "$sdir/b.sock") bp=vmqi$$r${RUN_N}be fp=vmqi$$r${RUN_N}fe
    vmq_dpdk_track "$bp"
    vmq_dpdk_track "$fp"
    local bound=$((IDLE_S + DPDK_S + 400)) cg=$rdir/be.callgrind status=ok t0
    t0=$(vmq_now)
    # shellcheck disable=SC2054  # commas are DPDK option syntax
    local -a be_cmd=(stdbuf -oL valgrind --tool=callgrind --fair-sched=yes --separate-threads=yes
        --callgrind-out-file="$cg" dpdk-testpmd -l "$FE_CPU,$BE_CPU" --main-lcore "$FE_CPU" --no-pci "${MEMW[@]}"
        --file-prefix="$bp" --vdev "net_vhost0,iface=${socks[0]},queues=1")
    ((nports == 2)) && be_cmd+=(--vdev "net_vhost1,iface=${socks[1]},queues=1")
    be_cmd+=(-- -i --nb-cores=1 --rxq=1 --txq=1 --forward-mode="$mode" --no-flush-rx --total-num-mbufs=32768)
    local vu="queues=1,queue_size=1024,in_order=0,packed_vq=0,mrg_rxbuf=$mrg" fe_mode=txonly peer0=$MAC_NOBODY
    local -a fe_cmd=(stdbuf -oL dpdk-testpmd -l "$FE_CPU,$BE_CPU" --main-lcore "$BE_CPU" --no-pci "${MEMW[@]}"
        --file-prefix="$fp" --vdev "net_virtio_user0,path=${socks[0]},$vu,mac=$MAC_A")
    if [[ $mode == io ]]; then
        fe_cmd+=(--vdev "net_virtio_user1,path=${socks[1]},$vu,mac=$MAC_B")
        fe_mode=io peer0=$MAC_B
    fi
    # span512: 628 B mbufs, i.e. RX descriptors of 628 - 128 headroom + 12
    # header = 512 B; the seed frames are chains of 500 B segments
    local txpkts=$size
    local -a fe_extra=()
    if ((span)); then
        fe_extra=(--mbuf-size=628 --enable-scatter)
        ((size <= 500)) || txpkts=$(awk -v s="$size" 'BEGIN { while (s > 500) { o = o "500,"; s -= 500 } print o s }')
    fi
    # shellcheck disable=SC2054
    fe_cmd+=(-- -i --no-flush-rx --nb-cores=1 --rxq=1 --txq=1 --rxd=1024 --txd=1024 --forward-mode="$fe_mode"
        --txpkts="$txpkts" "${fe_extra[@]}" --total-num-mbufs=32768 --eth-peer=0,"$peer0" --eth-peer=1,"$MAC_A")
    {
        printf 'backend:  '; printf '%q ' "${be_cmd[@]}"; echo
        printf 'frontend: '; printf '%q ' "${fe_cmd[@]}"; echo
    } >"$rdir/commands.txt"

    local befd fefd be_pid="" fe_pid="" vg_pid=""
    mkfifo "$sdir/be.in" "$sdir/fe.in"
    exec {befd}<>"$sdir/be.in" {fefd}<>"$sdir/fe.in"
    fail() { [[ $status != ok ]] || status="$*"; vmq_log "dpdk $tag: FAILED: $*"; }
    start_proc() { # start_proc VAR LOGNAME FIFO CMD...
        local var=$1 log=$2 fifo=$3
        shift 3
        timeout --kill-after=5 "$bound" "$@" <"$fifo" >"$rdir/$log.log" 2>&1 &
        printf -v "$var" '%s' "$!"
        vmq_track "$!"
    }
    # the backend listens; wait for its prompt (callgrind start-up takes a while)
    start_proc be_pid backend "$sdir/be.in" "${be_cmd[@]}"
    vmq_wait_log "$rdir/backend.log" '^testpmd> ' 180 "$be_pid" || fail "backend testpmd (callgrind) did not reach its prompt"
    vg_pid=$(vmq_child "$be_pid")
    if [[ $status == ok ]]; then
        start_proc fe_pid frontend "$sdir/fe.in" "${fe_cmd[@]}"
        vmq_wait_log "$rdir/frontend.log" '^testpmd> ' 60 "$fe_pid" || fail "frontend testpmd did not reach its prompt"
    fi
    if [[ $status == ok ]]; then
        link_up "$fp" "$nports" 60 || fail "virtio-user link not up after 60 s"
    fi
    # idle phase: the backend polls, nobody sends
    if [[ $status == ok ]]; then
        printf 'start\n' >&"$befd"
        vmq_wait_log "$rdir/backend.log" 'packet forwarding - ports=' 60 "$be_pid" || fail "backend did not start forwarding"
    fi
    if [[ $status == ok ]]; then
        sleep "$IDLE_S"
        timeout 60 callgrind_control --dump=idle "$vg_pid" >"$rdir/callgrind_control.log" 2>&1 ||
            fail "callgrind_control --dump failed (see $rdir/callgrind_control.log)"
        local end=$((SECONDS + 60))
        until compgen -G "$cg.1-*" >/dev/null; do
            ((SECONDS < end)) || { fail "no idle-phase dump $cg.1-*"; break; }
            sleep 0.2
        done
    fi
    # traffic phase
    if [[ $status == ok ]]; then
        if [[ $fe_mode == io ]]; then
            printf 'start tx_first %d\n' "$SEED" >&"$fefd"
        else
            printf 'start\n' >&"$fefd"
        fi
        vmq_wait_log "$rdir/frontend.log" 'packet forwarding - ports=' 30 "$fe_pid" || fail "frontend did not start"
    fi
    [[ $status == ok ]] && sleep "$DPDK_S"
    # stop: the backend first (it must not poll an idle ring), then the
    # frontend; quit the backend last so that callgrind writes its files
    if vmq_alive "$be_pid"; then
        printf 'stop\n' >&"$befd" || true
        vmq_wait_log "$rdir/backend.log" 'Accumulated forward statistics' 120 "$be_pid" ||
            [[ $status != ok ]] || fail "backend did not print its forward statistics"
    fi
    if [[ -n $fe_pid ]]; then
        if vmq_alive "$fe_pid"; then printf 'stop\nquit\n' >&"$fefd" || true; fi
        local e2=$((SECONDS + 20))
        while vmq_alive "$fe_pid" && ((SECONDS < e2)); do sleep 0.2; done
        stop_pid "$fe_pid"
    fi
    if vmq_alive "$be_pid"; then
        printf 'quit\n' >&"$befd" || true
        local e3=$((SECONDS + 180))
        while vmq_alive "$be_pid" && ((SECONDS < e3)); do sleep 0.5; done
    fi
    stop_pid "$be_pid" 20
    [[ $VMQ_RC == 0 || $status != ok ]] || fail "backend exited with status $VMQ_RC"
    exec {befd}>&- {fefd}>&-

    local rx tx drop res=""
    read -r rx tx drop < <(acc_stats "$rdir/backend.log")
    if [[ $status == ok ]]; then
        if [[ ! $rx =~ ^[0-9]+$ ]] || ((rx < 10000)); then
            fail "too few frames forwarded: $rx (backend.log)"
        elif ! compgen -G "$cg-*" >/dev/null; then
            fail "callgrind wrote no final files ($cg-*)"
        elif ! res=$(cgpy dpdk "$cg" "$cg.1" "$rx" "$mode" 32 "$rdir/perframe.txt" 2>"$rdir/analysis.err"); then
            fail "callgrind analysis: $(tail -n 1 "$rdir/analysis.err")"
        fi
    fi
    if [[ $status == ok ]]; then
        echo "$res" >"$rdir/result.txt"
        local -A R=()
        local kv
        for kv in $res; do R[${kv%%=*}]=${kv#*=}; done
        DPDKR[$tag]=${R[per_frame]}
        DPDK_DEQ[$tag]=${R[deq]}
        DPDKNOTE[$tag]="frames $rx (TX $tx), polls ${R[polls]}, empty ${R[empty]} x ${R[empty_poll]}, raw ${R[raw]}"
        if [[ $drop =~ ^[0-9]+$ ]] && ((drop * 100 > rx)); then
            DPDKNOTE[$tag]+=", TX-dropped $drop (>1 %: the count is low)"
        fi
        if [[ -f $cg-${R[thread]} ]]; then cgpy top "$cg-${R[thread]}" 20 >"$rdir/top20.txt" || true; fi
        vmq_log "dpdk $tag: ${DPDKR[$tag]} instructions/frame (${DPDKNOTE[$tag]}; $(vmq_elapsed "$t0") s)"
    else
        DPDKR[$tag]=fail
        DPDKNOTE[$tag]=$status
        FAILED=$((FAILED + 1))
    fi
    dpdk_forget "$bp"
    dpdk_forget "$fp"
    rm -rf -- "$sdir"
}
# dpdk_span PATH: span512 with frames of more than one 500 B segment.  The
# frontend's one mempool makes its TX frames chains too (indirect
# descriptors), which vhostmq's rig does not send: the dequeue is taken
# from the p2p-SIZE-mrg run (single-descriptor TX, same frames) and the
# enqueue into 512 B buffers from the span512 run:
#   dpdk = span512 run - its rte_vhost_dequeue_burst + p2p-SIZE-mrg's
dpdk_span() {
    local p=$1 mrgp=${1%-span512}-mrg
    [[ -n ${DPDK_DEQ[$mrgp]:-} ]] || dpdk_one "$mrgp"
    dpdk_one "$p" "$p-raw"
    if [[ ${DPDKR[$p-raw]} =~ ^[0-9.]+$ && ${DPDK_DEQ[$mrgp]:-} =~ ^[0-9.]+$ ]]; then
        DPDKR[$p]=$(awk -v t="${DPDKR[$p-raw]}" -v d="${DPDK_DEQ[$p-raw]}" -v m="${DPDK_DEQ[$mrgp]}" 'BEGIN { printf "%.1f", t - d + m }')
        DPDKNOTE[$p]="${DPDKR[$p-raw]} measured with chained TX frames - its dequeue ${DPDK_DEQ[$p-raw]} + $mrgp's dequeue ${DPDK_DEQ[$mrgp]} (${DPDKNOTE[$p-raw]})"
    else
        DPDKR[$p]=fail
        DPDKNOTE[$p]="span512 run: ${DPDKNOTE[$p-raw]:-?}; $mrgp run: ${DPDKNOTE[$mrgp]:-?}"
    fi
}

# ---------------------------------------------------------------- main
T_V=$(vmq_now)
vhostmq_side
T_V=$(vmq_elapsed "$T_V")
T_D=0
if ((DPDK)); then
    T_D=$(vmq_now)
    for p in "${PATH_LIST[@]}"; do [[ $p == *-span512 || $p == *-log || $p == *-macflood ]] || dpdk_one "$p"; done
    for p in "${PATH_LIST[@]}"; do
        if [[ $p == p2p-64-span512 ]]; then
            dpdk_one "$p" # 64 B frames: one segment, one TX descriptor
        elif [[ $p == *-span512 ]]; then
            dpdk_span "$p"
        fi
    done
    T_D=$(vmq_elapsed "$T_D")
fi

TSV=$OUT/instructions.tsv
printf 'path\tvhostmq\tdpdk\tratio\n' >"$TSV"
TABLE="path vhostmq bench-calls dpdk vhostmq/dpdk"
for p in "${PATH_LIST[@]}"; do
    v=${VHOSTMQ[$p]:-fail} d=n/a r=n/a
    ((DPDK)) && [[ $p != *-log && $p != *-macflood ]] && d=${DPDKR[$p]:-fail}
    if [[ $v =~ ^[0-9.]+$ && $d =~ ^[0-9.]+$ ]]; then r=$(awk -v a="$v" -v b="$d" 'BEGIN { printf "%.2f", a / b }'); fi
    printf '%s\t%s\t%s\t%s\n' "$p" "$v" "$d" "$r" >>"$TSV"
    TABLE+=$'\n'"$p $v ${VHOSTMQ_TOT[$p]:-fail} $d $r"
done
{
    echo "psi_cpu_at_end $(vmq_cpu_psi)"
    echo "vhostmq_seconds $T_V"
    echo "dpdk_seconds $T_D"
    for p in "${PATH_LIST[@]}"; do echo "vhostmq_$p ${VHOSTMQ[$p]:-fail} (bench calls ${VHOSTMQ_TOT[$p]:-fail})"; done
    for p in "${PATH_LIST[@]}"; do [[ -z ${DPDKNOTE[$p]:-} ]] || echo "dpdk_$p ${DPDKNOTE[$p]}"; done
    echo "finished_utc $(date -u +%FT%TZ) ($(vmq_elapsed "$T0") s)"
} >>"$OUT/meta.txt"

echo
echo "callgrind instructions per frame (vhostmq: worker.pass(), (N=$N - N0=$N0) / $((N - N0))," \
    "bench-calls: the same from the calls callgrind attributes to pathRig.burst, a cross-check; DPDK: testpmd's forwarding lcore, empty polls taken off)"
vmq_table <<<"$TABLE"
if ((DPDK)); then
    echo
    for p in "${PATH_LIST[@]}"; do echo "dpdk $p: ${DPDKNOTE[$p]:-}"; done
fi
echo
echo "tsv: $TSV; meta: $OUT/meta.txt; logs: $LOGS (vhostmq ${T_V}s, dpdk ${T_D}s)"

# ---------------------------------------------------------------- budget
if [[ -n $BUDGET ]]; then
    echo
    bad=0
    while IFS=$'\t' read -r bp bi _; do
        bp=${bp%%#*}
        bp=${bp//[[:space:]]/}
        [[ -n $bp && $bp != path ]] || continue
        if [[ ! $bi =~ ^[0-9]+(\.[0-9]+)?$ ]]; then
            echo "budget: FAIL $bp: budget '$bi' is not a number ($BUDGET)"
            bad=$((bad + 1))
            continue
        fi
        v=${VHOSTMQ[$bp]:-}
        if [[ -z $v ]]; then
            echo "budget: FAIL $bp: in the budget but not measured (--paths ${PATH_LIST[*]})"
            bad=$((bad + 1))
        elif [[ ! $v =~ ^[0-9.]+$ ]]; then
            echo "budget: FAIL $bp: the vhostmq run failed"
            bad=$((bad + 1))
        elif awk -v v="$v" -v b="$bi" 'BEGIN { exit !(v > b * 1.10) }'; then
            echo "budget: FAIL $bp: $v instructions/frame, budget $bi (+$(awk -v v="$v" -v b="$bi" 'BEGIN { printf "%.1f", 100 * (v - b) / b }') %, more than 10 % over)"
            bad=$((bad + 1))
        else
            echo "budget: ok $bp: $v instructions/frame, budget $bi ($(awk -v v="$v" -v b="$bi" 'BEGIN { printf "%+.1f", 100 * (v - b) / b }') %)"
        fi
    done <"$BUDGET"
    # a source-address flood on the uplink must not cost the busy path:
    # each macflood path within 1 % of its path without the flood
    for p in "${PATH_LIST[@]}"; do
        [[ $p == *-macflood ]] || continue
        base=${p%-macflood}-mrg v=${VHOSTMQ[$p]:-} vb=${VHOSTMQ[${p%-macflood}-mrg]:-}
        if [[ ! $v =~ ^[0-9.]+$ || ! $vb =~ ^[0-9.]+$ ]]; then
            echo "budget: FAIL $p: needs $base measured beside it"
            bad=$((bad + 1))
        elif awk -v v="$v" -v b="$vb" 'BEGIN { exit !(v > b * 1.01) }'; then
            echo "budget: FAIL $p: $v instructions/frame with 32 new addresses learned per burst, $vb without (more than 1 % more)"
            bad=$((bad + 1))
        else
            echo "budget: ok $p: $v instructions/frame with 32 new addresses learned per burst, $vb without"
        fi
    done
    if ((bad)); then
        echo "budget: $bad path(s) failed ($BUDGET)"
        exit 1
    fi
fi
if ((FAILED)); then
    echo "instructions: $FAILED run(s) FAILED"
    exit 1
fi
