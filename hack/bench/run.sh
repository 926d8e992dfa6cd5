#!/usr/bin/env bash
# vhostmq against DPDK's vhost backend, measured with the same DPDK
# virtio-user traffic (Debian's dpdk-testpmd, DPDK 22.11) in interleaved
# trials.  What `make bench` runs.
#
# Every run starts one backend and one frontend testpmd, measures a fixed
# window, and stops both.  Backends:
#   dpdk     dpdk-testpmd with net_vhost ports (iface=SOCK,queues=N), one
#            forwarding lcore; rxonly, txonly or io forwarding (below)
#   vhostmq  bin/vhostmq-dataplane with a temporary YAML config: one worker
#            on the backend CPU, ports with N queue pairs, polling busy
# The frontend is always dpdk-testpmd with net_virtio_user ports
# (path=SOCK,queues=N), one forwarding lcore on the frontend CPU.
#
# Topologies (configs are TOPO-SIZE-qN, SIZE = frame bytes without FCS):
#   g2h   guest TX: the frontend sends (txonly) on one port; the backend
#         takes every frame off the ring and drops it.  dpdk: rxonly (the
#         vhost dequeue copies each frame into an mbuf, then frees it).
#         vhostmq: one port alone, frames to an unknown unicast MAC: flooded
#         to no other port, counted as noDestination (the dataplane reads
#         the 78 header bytes, never the payload).  Rate: frontend TX.
#   h2g   guest RX.  dpdk: txonly on the vhost port, the frontend receives
#         (rxonly).  vhostmq cannot originate frames, so this is port->port:
#         frames circulate b -> switch -> a -> frontend io forwarding -> b
#         (the "p2p1" loop below).  Rate: frontend RX on port a.
#   p2p   port->port both ways through the backend: two ports, the
#         frontend io-forwards between its two virtio-user ports and seeds
#         the loop with `start tx_first K`; dpdk io-forwards vhost0<->vhost1,
#         vhostmq switches on learned MACs.  Rate: frontend RX, both ports.
#   p2p1  port->port one way (b -> a) for both backends, the loop seeded on
#         port b only.  Not in the default set; the like-for-like partner of
#         vhostmq's h2g row.
#
# Usage: hack/bench/run.sh [--trials 5] [--duration 5] [--warmup 2]
#          [--configs LIST] [--smoke] [--out DIR] [--backends "dpdk vhostmq"]
#          [--mem auto|huge|nohuge] [--role server|client] [--cpus FE,BE]
#          [--polling busy|adaptive|interrupt] [--seed-bursts 8]
#   --configs LIST  comma/space separated configs or globs, e.g.
#                   "g2h-*,p2p-64-q2"; default: g2h, h2g and p2p, each with
#                   64 and 1500 B and 1 and 2 queue pairs (12 configs)
#   --smoke         1 trial, 1 s warm-up, 1 s window, one config per
#                   topology (g2h-64-q1 h2g-1500-q2 p2p-64-q2): what CI runs
#   --out DIR       results (default _output/bench/<UTC time>): raw.tsv,
#                   summary.txt, summary.md, meta.txt and logs/ of every run
#   --mem           DPDK memory: hugepages (-m 256 --single-file-segments)
#                   or --no-huge -m 256; auto (default) picks hugepages when
#                   enough 2 MiB pages are free, once per dpdk/vhostmq pair
#   --role          server (default): the backends listen; client: the
#                   virtio-user ports listen (server=1) and the backends dial
#   --cpus FE,BE    frontend and backend polling CPUs (default 0,1)
#   --polling       vhostmq's ports' polling mode (default busy, as DPDK's)
#   --seed-bursts K bursts of 32 frames per stream that seed a loop (default 8)
#   --burst-stats   testpmd records its burst sizes (--record-burst-stats):
#                   the frontend's (both backends) and DPDK's backend's
#                   RX/TX burst spread, printed at stop into
#                   logs/RUN/{frontend,backend}.log; vhostmq's own frames
#                   per burst are in logs/RUN/vhostmq-stats.json
#   --perf          also `perf record -g` the backend and the frontend during
#                   each window: logs/RUN/perf-{be,fe}.data, top symbols in
#                   logs/RUN/perf-{be,fe}.txt
# Order: for each trial, for each config, both backends back to back, the
# first backend alternating between trials, so every ratio comes from two
# runs a few seconds apart.  A failed run is recorded (status column) and
# the benchmark goes on; the exit status is 1 if any run failed.
# Environment: VHOSTMQ_DATAPLANE (default <repo>/bin/vhostmq-dataplane),
#   VHOSTMQ_CTL (default <repo>/bin/vhostmqctl).  Needs root, 2 CPUs and
#   hack/install-deps.sh (dpdk-dev, librte-net-vhost23, librte-net-virtio23,
#   jq, python3).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=../lib.sh disable=SC1091
source "$HERE/../lib.sh"
# shellcheck source-path=SCRIPTDIR source=lib.sh disable=SC1091
source "$HERE/lib.sh"
# shellcheck disable=SC2034  # read by lib.sh
VMQ_TAG=bench

TRIALS=5 DURATION=5 WARMUP=2 CONFIGS="" SMOKE=0 OUT="" BACKENDS="dpdk vhostmq"
MEM=auto ROLE=server CPUS=0,1 POLLING=busy SEED=8 PERF=0 BURSTS=0
vmq_args --trials=TRIALS --duration=DURATION --warmup=WARMUP --configs+=CONFIGS --smoke:SMOKE=1 --out=OUT \
    --backends=BACKENDS --mem=MEM --role=ROLE --cpus=CPUS --polling=POLLING --seed-bursts=SEED --perf:PERF=1 --burst-stats:BURSTS=1 -- "$@"
if ((SMOKE)); then
    TRIALS=1 DURATION=1 WARMUP=1
    [[ -n ${CONFIGS// /} ]] || CONFIGS="g2h-64-q1 h2g-1500-q2 p2p-64-q2"
fi

# ---------------------------------------------------------------- arguments
posint --trials "$TRIALS"
posint --duration "$DURATION"
posint --seed-bursts "$SEED"
[[ $WARMUP =~ ^[0-9]+$ ]] || vmq_die "--warmup must be a number of seconds, not '$WARMUP'"
[[ $MEM =~ ^(auto|huge|nohuge)$ ]] || vmq_die "--mem must be auto, huge or nohuge"
[[ $ROLE =~ ^(server|client)$ ]] || vmq_die "--role must be server or client"
[[ $POLLING =~ ^(busy|adaptive|interrupt)$ ]] || vmq_die "--polling must be busy, adaptive or interrupt"
[[ $CPUS =~ ^([0-9]+),([0-9]+)$ ]] || vmq_die "--cpus must be FE,BE (two CPU numbers), not '$CPUS'"
FE_CPU=${BASH_REMATCH[1]} BE_CPU=${BASH_REMATCH[2]}
((FE_CPU != BE_CPU)) || vmq_die "--cpus: the frontend and the backend need different CPUs"
read -r -a BACKEND_LIST <<<"$BACKENDS"
((${#BACKEND_LIST[@]} > 0)) || vmq_die "--backends is empty"
for b in "${BACKEND_LIST[@]}"; do [[ $b =~ ^(dpdk|vhostmq)$ ]] || vmq_die "--backends: '$b' is not dpdk or vhostmq"; done

ALL_CONFIGS=()
for t in g2h h2g p2p; do for s in 64 1500; do for q in 1 2; do ALL_CONFIGS+=("$t-$s-q$q"); done; done; done
CFG_LIST=()
if [[ -z ${CONFIGS// /} ]]; then
    CFG_LIST=("${ALL_CONFIGS[@]}")
else
    for pat in ${CONFIGS//,/ }; do
        if [[ $pat == *[*?[]* ]]; then
            n=0
            for c in "${ALL_CONFIGS[@]}" p2p1-64-q1 p2p1-64-q2 p2p1-1500-q1 p2p1-1500-q2; do
                # shellcheck disable=SC2053  # the pattern is meant to glob
                [[ $c == $pat ]] && { CFG_LIST+=("$c"); n=$((n + 1)); }
            done
            ((n > 0)) || vmq_die "--configs: '$pat' matches no config"
        else
            CFG_LIST+=("$pat")
        fi
    done
fi
for c in "${CFG_LIST[@]}"; do
    [[ $c =~ ^(g2h|h2g|p2p|p2p1)-([0-9]+)-q([0-9]+)$ ]] || vmq_die "--configs: '$c' is not TOPO-SIZE-qN (TOPO g2h|h2g|p2p|p2p1)"
    ((BASH_REMATCH[2] >= 60 && BASH_REMATCH[2] <= 1518)) || vmq_die "--configs: '$c': frame size must be 60..1518"
    ((BASH_REMATCH[3] >= 1 && BASH_REMATCH[3] <= 8)) || vmq_die "--configs: '$c': queue pairs must be 1..8"
done

# ---------------------------------------------------------------- environment
vmq_need_root
vmq_need dpdk-testpmd jq timeout stdbuf mkfifo "$VMQ_PY"
((PERF == 0)) || command -v perf >/dev/null || vmq_die "--perf: perf missing (apt-get install linux-perf)"
for b in "${BACKEND_LIST[@]}"; do
    if [[ $b == vhostmq ]]; then
        [[ -x $VMQ_DATAPLANE ]] || vmq_die "$VMQ_DATAPLANE not found: run 'make build' (or set VHOSTMQ_DATAPLANE)"
        [[ -x $VMQ_CTL ]] || vmq_die "$VMQ_CTL not found: run 'make build' (or set VHOSTMQ_CTL)"
    fi
done
NCPU=$(nproc)
((FE_CPU < NCPU && BE_CPU < NCPU)) || vmq_die "--cpus $CPUS: this machine has $NCPU CPUs (nproc)"

bench_setup "" vmqbench
RAW=$OUT/raw.tsv
# vhostmq's /metrics (Go runtime counters around each window)
METRICS_PORT=${VHOSTMQ_BENCH_METRICS_PORT:-19473}
# go_runtime_counters: "GC_CYCLES MALLOCS" of the running dataplane, or "NA NA"
go_runtime_counters() {
    "$VMQ_PY" - "$METRICS_PORT" <<'PY' 2>/dev/null || echo "NA NA"
import sys, urllib.request
body = urllib.request.urlopen("http://127.0.0.1:%s/metrics" % sys.argv[1], timeout=5).read().decode()
v = {}
for line in body.splitlines():
    name, _, val = line.partition(" ")
    if name in ("go_gc_duration_seconds_count", "go_memstats_mallocs_total"):
        v[name] = int(float(val))
print(v["go_gc_duration_seconds_count"], v["go_memstats_mallocs_total"])
PY
}

MAC_A=02:76:6d:71:00:0a
MAC_B=02:76:6d:71:00:0b
MAC_NOBODY=02:76:6d:71:00:ff
bench_start
{
    echo "configs ${CFG_LIST[*]}"
    echo "backends ${BACKEND_LIST[*]}"
    echo "role $ROLE"
    echo "cpus frontend=$FE_CPU backend=$BE_CPU (of $NCPU)"
    echo "vhostmq_polling $POLLING"
    echo "seed_bursts $SEED"
    echo "mem $MEM"
    bench_meta_machine
} >>"$OUT/meta.txt"

printf '%s\n' "trial	config	backend	mpps	cpu_pct	be_mpps	fe_cpu_pct	psi_some_avg10	busy_pct	be_drop_pps	src_drop_pct	window_s	mem	started_utc	status	gc_cycles	mallocs_per_frame" >"$RAW"

# ---------------------------------------------------------------- helpers
# src_drop_pct LOG: TX-dropped / TX-total (%) in the last "Accumulated
# forward statistics" block testpmd printed (at stop or exit)
src_drop_pct() {
    awk '/Accumulated forward statistics/ { acc = 1; next }
         acc && /TX-packets:/ { d = $4; t = $6; acc = 0 }
         END { if (t > 0) printf "%.2f", 100 * d / t; else print "NA" }' "$1" 2>/dev/null || echo NA
}

# ---------------------------------------------------------------- one run
# run_one TRIAL CONFIG BACKEND MEM: one measurement, one line in raw.tsv
run_one() {
    local trial=$1 cfg=$2 be=$3 mem=$4
    [[ $cfg =~ ^(g2h|h2g|p2p|p2p1)-([0-9]+)-q([0-9]+)$ ]]
    local topo=${BASH_REMATCH[1]} size=${BASH_REMATCH[2]} q=${BASH_REMATCH[3]}
    local id rdir sdir started
    id=$(printf 't%02d-%s-%s' "$trial" "$cfg" "$be")
    bench_run "$id"

    # what the frontend does and what is counted
    local nports=2 fe_mode=io seed=both
    case $topo in
        g2h) nports=1 fe_mode=txonly seed=none ;;
        h2g) if [[ $be == dpdk ]]; then nports=1 fe_mode=rxonly seed=none; else seed=b; fi ;;
        p2p1) seed=b ;;
    esac
    local be_mode=io
    [[ $topo == g2h ]] && be_mode=rxonly
    [[ $topo == h2g && $be == dpdk ]] && be_mode=txonly
    local socks=("$sdir/a.sock" "$sdir/b.sock") fprefix=vmqb$$r${RUN_N}fe bprefix=vmqb$$r${RUN_N}be
    vmq_dpdk_track "$fprefix"
    vmq_dpdk_track "$bprefix"
    local client=0 vserver=0
    [[ $ROLE == client ]] && client=1 vserver=1

    local be_pid="" be_real="" fe_pid="" fe_real="" fefd="" status=ok
    local -a memw burst_args=()
    ((BURSTS)) && burst_args=(--record-burst-stats)
    read -r -a memw <<<"$(bench_mem_args "$mem" "$DPDK_MB")"

    # --- backend command
    local -a be_cmd
    if [[ $be == dpdk ]]; then
        local -a vdevs=()
        local i
        for ((i = 0; i < nports; i++)); do
            vdevs+=(--vdev "net_vhost$i,iface=${socks[i]},queues=$q,client=$client")
        done
        be_cmd=(stdbuf -oL dpdk-testpmd -l "$FE_CPU,$BE_CPU" --main-lcore "$FE_CPU" --no-pci "${memw[@]}"
            --file-prefix="$bprefix" "${vdevs[@]}" -- --nb-cores=1 --rxq="$q" --txq="$q"
            --forward-mode="$be_mode" --txpkts="$size" --txonly-multi-flow --total-num-mbufs=32768
            --stats-period=3600 "${burst_args[@]}")
    else
        local names=(a b) macs=("$MAC_A" "$MAC_B") i sec=true
        # the p2p frontend forwards (io) what each port received out of the
        # other, with its sender's MAC: a forwarder, port security off
        [[ $fe_mode == io ]] && sec=false
        {
            echo "# hack/bench/run.sh $id"
            echo "cpus: [$BE_CPU]"
            echo "apiSocket: $sdir/api.sock"
            echo "stateDir: $sdir/state"
            echo "logLevel: info"
            echo "metricsAddress: 127.0.0.1:$METRICS_PORT"
            echo "ports:"
            for ((i = 0; i < nports; i++)); do
                echo "  - {name: ${names[i]}, socket: ${socks[i]}, role: $([[ $ROLE == server ]] && echo server || echo client)," \
                    "queuePairs: $q, mtu: 1500, mac: \"${macs[i]}\", polling: $POLLING, portSecurity: $sec}"
            done
        } >"$rdir/vhostmq.yaml"
        be_cmd=("$VMQ_DATAPLANE" --config "$rdir/vhostmq.yaml")
    fi
    printf '%q ' "${be_cmd[@]}" >"$rdir/backend.cmd"
    echo >>"$rdir/backend.cmd"

    # --- frontend command (interactive, commands through a fifo)
    local -a fvdevs=(--vdev "net_virtio_user0,path=${socks[0]},queues=$q,mac=$MAC_A,server=$vserver")
    ((nports == 2)) && fvdevs+=(--vdev "net_virtio_user1,path=${socks[1]},queues=$q,mac=$MAC_B,server=$vserver")
    local peer0=$MAC_B
    [[ $topo == g2h ]] && peer0=$MAC_NOBODY
    # shellcheck disable=SC2054  # commas are testpmd option syntax
    local -a fe_cmd=(stdbuf -oL dpdk-testpmd -l "$FE_CPU,$BE_CPU" --main-lcore "$BE_CPU" --no-pci "${memw[@]}"
        --file-prefix="$fprefix" "${fvdevs[@]}" -- -i --no-flush-rx --nb-cores=1 --rxq="$q" --txq="$q"
        --forward-mode="$fe_mode" --txpkts="$size" --txonly-multi-flow --total-num-mbufs=32768
        --eth-peer=0,"$peer0" --eth-peer=1,"$MAC_A" "${burst_args[@]}")
    printf '%q ' "${fe_cmd[@]}" >"$rdir/frontend.cmd"
    echo >>"$rdir/frontend.cmd"

    local fifo=$sdir/fe.in
    mkfifo "$fifo"
    exec {fefd}<>"$fifo"
    start_backend() {
        ((client)) || rm -f "${socks[@]:0:nports}"
        timeout --kill-after=5 "$RUN_BOUND" "${be_cmd[@]}" >"$rdir/backend.log" 2>&1 </dev/null {fefd}>&- &
        be_pid=$!
        vmq_track "$be_pid"
    }
    start_frontend() {
        timeout --kill-after=5 "$RUN_BOUND" "${fe_cmd[@]}" <"$fifo" >"$rdir/frontend.log" 2>&1 {fefd}>&- &
        fe_pid=$!
        vmq_track "$fe_pid"
    }
    fail() { status="fail:$*"; vmq_log "$id: FAILED: $*"; }
    local t_run
    t_run=$(vmq_now)
    phase() { echo "$1 $(vmq_elapsed "$t_run")" >>"$rdir/phases.txt"; }

    local i
    if [[ $ROLE == server ]]; then
        start_backend
        for ((i = 0; i < nports; i++)); do
            vmq_wait_path "${socks[i]}" 30 "$be_pid" || { fail "backend did not create ${socks[i]}"; break; }
        done
        [[ $status == ok ]] && start_frontend
    else
        # a listening virtio-user waits in its probe for the first
        # connection, so port b's socket appears only once a is connected;
        # both backends re-dial until it does
        start_frontend
        vmq_wait_path "${socks[0]}" 30 "$fe_pid" || fail "virtio-user did not create ${socks[0]}"
        [[ $status == ok ]] && start_backend
    fi
    phase sockets
    if [[ $status == ok && $be == dpdk ]]; then
        vmq_wait_log "$rdir/backend.log" 'packet forwarding - ports=' 60 "$be_pid" || fail "backend testpmd did not start forwarding"
        phase backend_forwarding
    fi
    if [[ $status == ok ]]; then
        vmq_wait_log "$rdir/frontend.log" '^testpmd> ' 60 "$fe_pid" || fail "frontend testpmd did not reach its prompt"
        phase frontend_prompt
    fi
    if [[ $status == ok ]]; then
        link_up "$fprefix" "$nports" 30 || fail "virtio-user link not up after 30 s"
        phase link_up
    fi
    if [[ $status == ok ]]; then
        be_real=$(vmq_child "$be_pid")
        fe_real=$(vmq_child "$fe_pid")
        case $seed in
            none) printf 'start\n' >&"$fefd" ;;
            both) printf 'start tx_first %d\n' "$SEED" >&"$fefd" ;;
            b) printf 'set portlist 1\nstart tx_first %d\nstop\nset portlist 0,1\nstart\n' "$SEED" >&"$fefd" ;;
        esac
        local starts=1
        [[ $seed == b ]] && starts=2
        local end=$((SECONDS + 30))
        while (($(vmq_count_log "$rdir/frontend.log" 'packet forwarding - ports=') < starts)); do
            if ((SECONDS >= end)) || ! vmq_alive "$fe_pid"; then
                fail "frontend did not start forwarding"
                break
            fi
            sleep 0.1
        done
    fi

    phase frontend_forwarding
    # --- the window
    local mpps=NA cpu=NA be_mpps=NA fe_cpu=NA psi=NA busy=NA drops=NA srcdrop=NA win=NA gc=NA mpf=NA
    if [[ $status == ok ]]; then
        sleep "$WARMUP"
        local -a specs=("dpdk:fe:$fprefix:$nports" "proc:fe:$fe_real" "proc:be:$be_real")
        [[ $be == dpdk ]] && specs+=("dpdk:be:$bprefix:$nports")
        local m0="" err
        [[ $be == vhostmq ]] && m0=$(go_runtime_counters)
        if [[ $be == vhostmq ]]; then
            stats_window "$sdir/api.sock" "$DURATION" "$rdir/vhostmq-stats.json"
        fi
        local perf_pids=() side pid
        if ((PERF)); then
            for side in be fe; do
                pid=$be_real
                [[ $side == fe ]] && pid=$fe_real
                timeout $((DURATION + 30)) perf record -q -g -p "$pid" -o "$rdir/perf-$side.data" -- sleep "$DURATION" \
                    >"$rdir/perf-$side.log" 2>&1 &
                perf_pids+=($!)
                vmq_track "$!"
            done
        fi
        if ! "$VMQ_PY" "$HERE/window.py" "$DURATION" "${specs[@]}" >"$rdir/window.json" 2>"$rdir/window.err"; then
            fail "window measurement: $(tail -n 1 "$rdir/window.err")"
        fi
        if [[ $be == vhostmq ]]; then
            err=$(stats_window_wait) || fail "vhostmqctl stats: $err"
        fi
        [[ $be == vhostmq ]] && echo "$m0 $(go_runtime_counters)" >"$rdir/go-runtime.txt"
        for pid in "${perf_pids[@]}"; do
            wait "$pid" || vmq_log "$id: perf record failed (see $rdir/perf-*.log)"
            untrack "$pid"
        done
    fi
    phase window_done
    # --- stop: the frontend first (it prints its forward statistics), then the backend
    quit_testpmd "$fe_pid" "$fefd"
    exec {fefd}>&-
    phase frontend_stopped
    [[ $VMQ_RC == 0 || $status != ok ]] || fail "frontend testpmd exited with status $VMQ_RC"
    stop_pid "$be_pid" 12
    if [[ $status == ok && $VMQ_RC != 0 ]]; then
        fail "$be backend exited with status $VMQ_RC on SIGTERM$([[ $VMQ_RC == 137 ]] && echo " (SIGKILLed after not exiting in time)")"
    fi
    phase backend_stopped
    if [[ $status == ok ]]; then
        # frontend packets that crossed the backend: TX for g2h, RX on port
        # a for h2g/p2p1, RX on both ports for p2p; the backend's own count
        # of the same frames; its drops (g2h frames are meant to be dropped
        # by vhostmq as noDestination: not a loss)
        local vfile=/dev/null
        [[ $be == vhostmq ]] && vfile=$rdir/vhostmq-stats.json
        IFS=$'\t' read -r mpps win cpu fe_cpu psi be_mpps busy drops < <(jq -r --arg topo "$topo" --slurpfile v "$vfile" '
            def r3: . * 1000 | round / 1000;
            def fe: if $topo == "g2h" then .ports[0].opackets elif $topo == "p2p" then [.ports[].ipackets] | add
                    else .ports[0].ipackets end;
            def be: if $topo == "g2h" then .ports[0].ipackets elif $topo == "p2p" then [.ports[].opackets] | add
                    else .ports[0].opackets end;
            def pa: .ports[] | select(.id == "a") | .total.rates;
            def vm: if $topo == "g2h" then pa.tx_packets_per_second elif $topo == "p2p"
                    then [.ports[].total.rates.rx_packets_per_second] | add else pa.rx_packets_per_second end;
            [ (.dpdk.fe | fe / .seconds / 1e6 | r3), (.dpdk.fe.seconds | r3), (.cpu.be | round), (.cpu.fe | round),
              (.psi_avg10 // "NA"),
              (if .dpdk.be then (.dpdk.be | be / .seconds / 1e6 | r3) elif $v[0] then ($v[0] | vm / 1e6 | r3) else "NA" end),
              (if $v[0] then [$v[0].ports[].total.rates.busy_percent] | add | round else "NA" end),
              (if .dpdk.be then (.dpdk.be | ([.ports[] | .imissed + .ierrors + .oerrors + .rx_nombuf] | add) / .seconds | round)
               elif $v[0] then [$v[0].ports[].total.rates.drops_per_second | .total - .no_destination] | add | round
               else "NA" end) ] | @tsv' "$rdir/window.json") || fail "cannot read the window's counters"
        awk -v m="$mpps" 'BEGIN { exit !(m > 0) }' || fail "no frames in the window (frontend counted $mpps Mpps)"
        # the Go runtime's GC cycles and heap allocations over the window
        # (from the dataplane's /metrics, read just before and after it):
        # the gRPC stats call and the scrapes allocate a little; the frames
        # must not
        if [[ -s $rdir/go-runtime.txt ]]; then
            read -r gc mpf < <(awk -v fps="$be_mpps" -v w="$win" '
                NF == 4 && $1 != "NA" && $3 != "NA" {
                    frames = fps * 1e6 * w
                    printf "%d %s\n", $3 - $1, (frames > 0 ? sprintf("%.6f", ($4 - $2) / frames) : "NA"); ok = 1 }
                END { if (!ok) print "NA NA" }' "$rdir/go-runtime.txt")
        fi
    fi
    if [[ $topo == h2g && $be == dpdk ]]; then srcdrop=$(src_drop_pct "$rdir/backend.log"); else srcdrop=$(src_drop_pct "$rdir/frontend.log"); fi
    local side
    for side in be fe; do
        if ((PERF)) && [[ -s $rdir/perf-$side.data ]]; then
            timeout 120 perf report -i "$rdir/perf-$side.data" --stdio --no-children --percent-limit 0.5 -g none \
                --sort dso,symbol >"$rdir/perf-$side.txt" 2>/dev/null || true
        fi
    done
    dpdk_forget "$fprefix"
    dpdk_forget "$bprefix"
    rm -rf -- "$sdir"

    [[ $status == ok ]] || FAILED=$((FAILED + 1))
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$trial" "$cfg" "$be" "$mpps" "$cpu" "$be_mpps" \
        "$fe_cpu" "$psi" "$busy" "$drops" "$srcdrop" "$win" "$mem" "$started" "${status// /_}" "$gc" "$mpf" >>"$RAW"
    vmq_log "$(printf '%-16s %-8s %8s Mpps (backend counted %s, cpu %s%%, busy %s%%, psi %s, src drop %s%%) %s' \
        "$cfg" "$be" "$mpps" "$be_mpps" "$cpu" "$busy" "$psi" "$srcdrop" "$status")"
}

# ---------------------------------------------------------------- main loop
NRUNS=$((TRIALS * ${#CFG_LIST[@]} * ${#BACKEND_LIST[@]}))
vmq_log "$NRUNS runs: $TRIALS trial(s) x ${#CFG_LIST[@]} config(s) x ${#BACKEND_LIST[@]} backend(s)," \
    "${WARMUP}s warm-up + ${DURATION}s window each; results in $OUT"
for ((trial = 1; trial <= TRIALS; trial++)); do
    order=("${BACKEND_LIST[@]}")
    if ((trial % 2 == 0)); then
        order=()
        for ((i = ${#BACKEND_LIST[@]} - 1; i >= 0; i--)); do order+=("${BACKEND_LIST[i]}"); done
    fi
    for cfg in "${CFG_LIST[@]}"; do
        mem=$(bench_mem "$DPDK_MB" 2)
        for be in "${order[@]}"; do
            run_one "$trial" "$cfg" "$be" "$mem"
        done
    done
done
bench_finish bench summary.py summary.md
