#!/usr/bin/env bash
# Multiqueue scaling through the switch: flows x queue pairs -> aggregate
# Mpps at the sink and % gain over one queue pair, in the style of the 2011
# multiqueue virtio-net results (../shared/seeds/).  Part of `make bench`.
#
# Every run starts bin/vhostmq-dataplane (a temporary YAML config: one
# worker per CPU of --cpus, three ports with Q queue pairs each, server
# role) and two DPDK 22.11 virtio-user testpmds (Debian's dpdk-testpmd),
# measures a fixed window and stops all three:
#   generator  port g, flowgen forwarding (--flowgen-flows=F, UDP/IPv4, the
#              destination address rotating over F values frame by frame)
#              on Q TX queues served by one forwarding lcore, frames of
#              --size bytes counting the FCS, as flowgen does (--txpkts:
#              64 puts 60-byte frames on the ring).  DPDK 22.11's flowgen ignores --eth-peer and
#              the port's MAC: it always sends from 00:01:02:03:04:00 to
#              00:01:02:03:04:01, so that is the sink's MAC here
#   sink       port s, rxonly on Q RX queues, one forwarding lcore, MAC
#              00:01:02:03:04:01; before the generator starts it sends one
#              burst (`start tx_first 1`) so that the switch has learned
#              its MAC
#   witness    port w, no frontend: a frame the switch floods instead of
#              forwarding to the sink shows up as w's rx_disabled drops
#              (column flood_pps, 0 when every measured frame is unicast)
# How the queues are used: flowgen spreads frames over its TX queues burst
# by burst (a flow is not pinned to one TX queue: each queue carries every
# flow when F <= 32); the dataplane's workers dequeue the generator's TX
# queues (pairs round-robin over the workers, so Q=1 keeps one worker
# busy and Q>=2 both) and pick the sink's RX queue by the flow hash
# (dataplane/vswitch/flow.go; the sink never sent these flows), so F flows
# reach at most min(F, Q) sink RX queues (column sink_rxq: the queues that
# got >= 1 % of the frames).
# CPUs: on a 2-CPU machine the generator's lcore (first CPU of --cpus), the
# sink's lcore (second CPU) and the two workers share the CPUs: every
# number here is two busy pollers (testpmd) plus the workers on two cores,
# which is what this table measures, not a dataplane with cores of its own.
#
# Order: for each trial, for each flow count, the queue-pair counts back to
# back, their order rotated from cell to cell and trial to trial, so each
# gain over Q=1 compares runs a few seconds apart; the table reports medians
# over the trials.  A failed run is recorded (status column) and the
# benchmark goes on; the exit status is 1 if any run failed.
#
# Usage: hack/bench/flows.sh [--trials 3] [--duration 4] [--warmup 2]
#          [--flows "1 2 4 8 16 32 64 128"] [--queues "1 2 4"] [--size 64]
#          [--smoke] [--out DIR] [--mem auto|huge|nohuge]
#          [--polling adaptive|busy|interrupt] [--cpus 0,1] [--ring N]
#   --smoke      1 trial, 1 s warm-up, 1 s window, 8 flows x 1 and 2 queue
#                pairs (two runs, ~20 s): what CI runs
#   --out DIR    results (default _output/bench/flows-<UTC time>): raw.tsv,
#                table.md, summary.txt, meta.txt and logs/ of every run
#   --mem        DPDK memory: hugepages (-m 256 --single-file-segments per
#                testpmd) or --no-huge -m 256; auto (default) picks
#                hugepages when enough 2 MiB pages are free
#   --polling    the ports' polling mode (default adaptive, the dataplane's
#                default: a worker with no queue to serve sleeps and leaves
#                its CPU to the testpmd beside it)
#   --cpus A,B   generator lcore CPU, sink lcore CPU; the dataplane runs one
#                worker on each (default 0,1)
#   --ring N     virtio ring size of both testpmds' queues (virtio-user
#                queue_size, --rxd, --txd; default: DPDK's, 256)
# Environment: VHOSTMQ_DATAPLANE (default <repo>/bin/vhostmq-dataplane),
#   VHOSTMQ_CTL (default <repo>/bin/vhostmqctl).  Needs root, 2 CPUs and
#   hack/install-deps.sh (dpdk-dev, librte-net-virtio23, jq, python3).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=../lib.sh disable=SC1091
source "$HERE/../lib.sh"
# shellcheck source-path=SCRIPTDIR source=lib.sh disable=SC1091
source "$HERE/lib.sh"
# shellcheck disable=SC2034  # read by lib.sh
VMQ_TAG=flows

TRIALS=3 DURATION=4 WARMUP=2 FLOWS="1 2 4 8 16 32 64 128" QUEUES="1 2 4" SIZE=64
SMOKE=0 OUT="" MEM=auto POLLING=adaptive CPUS=0,1 RING=""
vmq_args --trials=TRIALS --duration=DURATION --warmup=WARMUP --flows=FLOWS --queues=QUEUES --size=SIZE \
    --smoke:SMOKE=1 --out=OUT --mem=MEM --polling=POLLING --cpus=CPUS --ring=RING -- "$@"
((SMOKE)) && TRIALS=1 DURATION=1 WARMUP=1 FLOWS=8 QUEUES="1 2"

# ---------------------------------------------------------------- arguments
posint --trials "$TRIALS"
posint --duration "$DURATION"
[[ $WARMUP =~ ^[0-9]+$ ]] || vmq_die "--warmup must be a number of seconds, not '$WARMUP'"
posint --size "$SIZE"
((SIZE >= 64 && SIZE <= 1518)) || vmq_die "--size must be 64..1518 bytes (with the FCS), not $SIZE"
[[ $MEM =~ ^(auto|huge|nohuge)$ ]] || vmq_die "--mem must be auto, huge or nohuge"
[[ $POLLING =~ ^(busy|adaptive|interrupt)$ ]] || vmq_die "--polling must be busy, adaptive or interrupt"
[[ $CPUS =~ ^([0-9]+),([0-9]+)$ ]] || vmq_die "--cpus must be A,B (two CPU numbers), not '$CPUS'"
GEN_CPU=${BASH_REMATCH[1]} SINK_CPU=${BASH_REMATCH[2]}
((GEN_CPU != SINK_CPU)) || vmq_die "--cpus: the generator and the sink need different CPUs"
read -r -a FLOW_LIST <<<"${FLOWS//,/ }"
read -r -a Q_LIST <<<"${QUEUES//,/ }"
((${#FLOW_LIST[@]} > 0)) || vmq_die "--flows is empty"
((${#Q_LIST[@]} > 0)) || vmq_die "--queues is empty"
for f in "${FLOW_LIST[@]}"; do posint --flows "$f"; done
if [[ -n $RING ]]; then
    posint --ring "$RING"
    ((RING >= 64 && RING <= 4096 && (RING & (RING - 1)) == 0)) || vmq_die "--ring must be a power of 2 in 64..4096, not $RING"
fi
for q in "${Q_LIST[@]}"; do
    posint --queues "$q"
    ((q <= 8)) || vmq_die "--queues: $q queue pairs: at most 8"
done

# ---------------------------------------------------------------- environment
vmq_need_root
vmq_need dpdk-testpmd jq timeout stdbuf mkfifo "$VMQ_PY"
[[ -x $VMQ_DATAPLANE ]] || vmq_die "$VMQ_DATAPLANE not found: run 'make build' (or set VHOSTMQ_DATAPLANE)"
[[ -x $VMQ_CTL ]] || vmq_die "$VMQ_CTL not found: run 'make build' (or set VHOSTMQ_CTL)"
NCPU=$(nproc)
((GEN_CPU < NCPU && SINK_CPU < NCPU)) || vmq_die "--cpus $CPUS: this machine has $NCPU CPUs (nproc)"

bench_setup flows- vmqflows
RAW=$OUT/raw.tsv

MAC_G=00:01:02:03:04:00 # flowgen's fixed source and destination (app/test-pmd/flowgen.c)
MAC_S=00:01:02:03:04:01
MAC_W=02:76:6d:71:00:1c
bench_start
{
    echo "flows ${FLOW_LIST[*]}"
    echo "queue_pairs ${Q_LIST[*]}"
    echo "frame_bytes $SIZE"
    echo "cpus generator=$GEN_CPU sink=$SINK_CPU workers=$GEN_CPU,$SINK_CPU (of $NCPU)"
    echo "vhostmq_polling $POLLING"
    echo "mem $MEM"
    echo "ring ${RING:-default (256)}"
    bench_meta_machine
} >>"$OUT/meta.txt"

printf '%s\n' "trial	flows	queues	size	mpps	switched_mpps	gen_mpps	sink_rxq	sink_rxq_pkts	gen_cpu_pct	sink_cpu_pct	dp_cpu_pct	dp_busy_pct	rx_no_buffer_pps	flood_pps	psi_some_avg10	window_s	mem	started_utc	status" >"$RAW"

# ---------------------------------------------------------------- helpers
# port_tx PORTID API: packets port PORTID has sent into the switch so far
port_tx() {
    "$VMQ_CTL" --socket "$2" --timeout 3s -o json stats "$1" 2>/dev/null | jq -r '.ports[0].total.tx.packets // 0' 2>/dev/null || echo 0
}
# rotated OFFSET: the queue-pair list, rotated left by OFFSET
rotated() {
    local n=${#Q_LIST[@]} i
    for ((i = 0; i < n; i++)); do printf '%s ' "${Q_LIST[(i + $1) % n]}"; done
}

# ---------------------------------------------------------------- one run
# run_one TRIAL FLOWS QUEUES MEM: one measurement, one line in raw.tsv
run_one() {
    local trial=$1 flows=$2 q=$3 mem=$4
    local id rdir sdir started
    id=$(printf 't%02d-f%03d-q%d' "$trial" "$flows" "$q")
    bench_run "$id"
    local gprefix=vmqf$$r${RUN_N}g sprefix=vmqf$$r${RUN_N}s api=$sdir/api.sock
    vmq_dpdk_track "$gprefix"
    vmq_dpdk_track "$sprefix"
    local -a memw ringw=()
    local qsz=""
    [[ -n $RING ]] && qsz=",queue_size=$RING" ringw=(--rxd="$RING" --txd="$RING")
    read -r -a memw <<<"$(bench_mem_args "$mem" "$DPDK_MB")"

    {
        echo "# hack/bench/flows.sh $id"
        echo "cpus: [$GEN_CPU, $SINK_CPU]"
        echo "apiSocket: $api"
        echo "stateDir: $sdir/state"
        echo "macAgeSeconds: 3600"
        echo "logLevel: info"
        echo "ports:"
        local n mac
        for n in g s w; do
            case $n in g) mac=$MAC_G ;; s) mac=$MAC_S ;; w) mac=$MAC_W ;; esac
            echo "  - {name: $n, socket: $sdir/$n.sock, role: server, queuePairs: $q, mtu: 1500, mac: \"$mac\", polling: $POLLING}"
        done
    } >"$rdir/vhostmq.yaml"
    local -a dp_cmd=("$VMQ_DATAPLANE" --config "$rdir/vhostmq.yaml")
    # each testpmd: the forwarding lcore on its CPU, the main lcore (the
    # interactive prompt, asleep on its fifo) on the other
    # shellcheck disable=SC2054  # commas are testpmd option syntax
    local -a gen_cmd=(stdbuf -oL dpdk-testpmd -l "$GEN_CPU,$SINK_CPU" --main-lcore "$SINK_CPU" --no-pci "${memw[@]}"
        --file-prefix="$gprefix" --vdev "net_virtio_user0,path=$sdir/g.sock,queues=$q,mac=$MAC_G$qsz"
        -- -i --nb-cores=1 --rxq="$q" --txq="$q" "${ringw[@]}" --forward-mode=flowgen --flowgen-flows="$flows"
        --txpkts="$SIZE" --total-num-mbufs=32768)
    # shellcheck disable=SC2054
    local -a sink_cmd=(stdbuf -oL dpdk-testpmd -l "$SINK_CPU,$GEN_CPU" --main-lcore "$GEN_CPU" --no-pci "${memw[@]}"
        --file-prefix="$sprefix" --vdev "net_virtio_user0,path=$sdir/s.sock,queues=$q,mac=$MAC_S$qsz"
        -- -i --nb-cores=1 --rxq="$q" --txq="$q" "${ringw[@]}" --forward-mode=rxonly --txpkts=64
        --eth-peer=0,"$MAC_G" --total-num-mbufs=32768)
    printf '%q ' "${dp_cmd[@]}" >"$rdir/dataplane.cmd"
    printf '%q ' "${gen_cmd[@]}" >"$rdir/gen.cmd"
    printf '%q ' "${sink_cmd[@]}" >"$rdir/sink.cmd"

    local dp_pid="" gen_pid="" sink_pid="" gfd="" sfd="" status=ok
    fail() { [[ $status != ok ]] || status="fail:$*"; vmq_log "$id: FAILED: $*"; }
    local gfifo=$sdir/gen.in sfifo=$sdir/sink.in
    mkfifo "$gfifo" "$sfifo"
    exec {gfd}<>"$gfifo" {sfd}<>"$sfifo"

    timeout --kill-after=5 "$RUN_BOUND" "${dp_cmd[@]}" >"$rdir/dataplane.log" 2>&1 </dev/null {gfd}>&- {sfd}>&- &
    dp_pid=$!
    vmq_track "$dp_pid"
    for c in g s w; do
        vmq_wait_path "$sdir/$c.sock" 30 "$dp_pid" || { fail "the dataplane did not create $c.sock"; break; }
    done
    if [[ $status == ok ]]; then
        timeout --kill-after=5 "$RUN_BOUND" "${sink_cmd[@]}" <"$sfifo" >"$rdir/sink.log" 2>&1 {gfd}>&- {sfd}>&- &
        sink_pid=$!
        vmq_track "$sink_pid"
        timeout --kill-after=5 "$RUN_BOUND" "${gen_cmd[@]}" <"$gfifo" >"$rdir/gen.log" 2>&1 {gfd}>&- {sfd}>&- &
        gen_pid=$!
        vmq_track "$gen_pid"
        vmq_wait_log "$rdir/sink.log" '^testpmd> ' 60 "$sink_pid" || fail "sink testpmd did not reach its prompt"
    fi
    [[ $status == ok ]] && { vmq_wait_log "$rdir/gen.log" '^testpmd> ' 60 "$gen_pid" || fail "generator testpmd did not reach its prompt"; }
    [[ $status == ok ]] && { link_up "$sprefix" 1 30 || fail "sink link not up after 30 s"; }
    [[ $status == ok ]] && { link_up "$gprefix" 1 30 || fail "generator link not up after 30 s"; }
    if [[ $status == ok ]]; then
        # the sink speaks first, so that the switch knows where MAC_S is
        printf 'start tx_first 1\n' >&"$sfd"
        local end=$((SECONDS + 20))
        until (($(port_tx s "$api") > 0)); do
            if ((SECONDS >= end)) || ! vmq_alive "$sink_pid"; then
                fail "the switch saw no frame from the sink (tx_first)"
                break
            fi
            sleep 0.1
        done
    fi
    if [[ $status == ok ]]; then
        printf 'start\n' >&"$gfd"
        vmq_wait_log "$rdir/gen.log" 'packet forwarding - ports=' 30 "$gen_pid" || fail "generator did not start forwarding"
    fi

    # --- the window
    local mpps=NA switched=NA gen_mpps=NA rxq=NA rxq_pkts=NA gen_cpu=NA sink_cpu=NA dp_cpu=NA busy=NA nobuf=NA flood=NA psi=NA win=NA
    if [[ $status == ok ]]; then
        sleep "$WARMUP"
        local gen_real sink_real dp_real err
        gen_real=$(vmq_child "$gen_pid")
        sink_real=$(vmq_child "$sink_pid")
        dp_real=$(vmq_child "$dp_pid")
        stats_window "$api" "$DURATION" "$rdir/vhostmq-stats.json"
        "$VMQ_PY" "$HERE/window.py" "$DURATION" "dpdk:sink:$sprefix:1" "dpdk:gen:$gprefix:1" \
            "proc:gen:$gen_real" "proc:sink:$sink_real" "proc:dp:$dp_real" >"$rdir/window.json" 2>"$rdir/window.err" ||
            fail "window measurement: $(tail -n 1 "$rdir/window.err")"
        err=$(stats_window_wait) || fail "vhostmqctl stats: $err"
        # the sink's frames per RX queue since it started (the generator's
        # frames dominate: the sink's own burst went the other way)
        vmq_dpdk_port_stats "$sprefix" 0 >"$rdir/sink-queues.txt" || true
    fi
    # --- stop: the testpmds first (they print their forward statistics), then the dataplane
    quit_testpmd "$gen_pid" "$gfd"
    [[ $VMQ_RC == 0 || $status != ok ]] || fail "generator testpmd exited with status $VMQ_RC"
    quit_testpmd "$sink_pid" "$sfd"
    [[ $VMQ_RC == 0 || $status != ok ]] || fail "sink testpmd exited with status $VMQ_RC"
    exec {gfd}>&- {sfd}>&-
    stop_pid "$dp_pid" 12
    [[ $VMQ_RC == 0 || $status != ok ]] || fail "the dataplane exited with status $VMQ_RC on SIGTERM"

    if [[ $status == ok ]]; then
        IFS=$'\t' read -r mpps switched gen_mpps win gen_cpu sink_cpu dp_cpu psi busy nobuf flood < <(jq -r --slurpfile v "$rdir/vhostmq-stats.json" '
            def r3: . * 1000 | round / 1000;
            def port($id): $v[0].ports[] | select(.id == $id) | .total.rates;
            [ (.dpdk.sink | .ports[0].ipackets / .seconds / 1e6 | r3),
              (port("g").tx_packets_per_second / 1e6 | r3),
              (.dpdk.gen | .ports[0].opackets / .seconds / 1e6 | r3),
              (.dpdk.sink.seconds | r3),
              (.cpu.gen | round), (.cpu.sink | round), (.cpu.dp | round),
              (.psi_avg10 // "NA"),
              ([$v[0].ports[].total.rates.busy_percent] | add | round),
              (port("s").drops_per_second.rx_no_buffer | round),
              (port("w").drops_per_second.total | round) ] | @tsv' "$rdir/window.json") ||
            fail "cannot read the window's counters"
        awk -v m="$mpps" 'BEGIN { exit !(m > 0) }' || fail "no frames at the sink in the window ($mpps Mpps)"
        local qline
        read -r _ _ qline _ <"$rdir/sink-queues.txt" || true
        if [[ -n $qline ]]; then
            rxq_pkts=$qline
            rxq=$(awk -F, '{ t = 0; for (i = 1; i <= NF; i++) t += $i; n = 0
                             for (i = 1; i <= NF; i++) if (t > 0 && $i >= t / 100) n++; print n }' <<<"$qline")
        fi
    fi
    dpdk_forget "$gprefix"
    dpdk_forget "$sprefix"
    rm -rf -- "$sdir"

    [[ $status == ok ]] || FAILED=$((FAILED + 1))
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$trial" "$flows" "$q" \
        "$SIZE" "$mpps" "$switched" "$gen_mpps" "$rxq" "$rxq_pkts" "$gen_cpu" "$sink_cpu" "$dp_cpu" "$busy" "$nobuf" "$flood" "$psi" "$win" \
        "$mem" "$started" "${status// /_}" >>"$RAW"
    vmq_log "$(printf '%-14s %7s Mpps at the sink (switched %s, generator %s, sink rxq %s, cpu gen/sink/dp %s/%s/%s%%, flood %s/s, psi %s) %s' \
        "$id" "$mpps" "$switched" "$gen_mpps" "$rxq" "$gen_cpu" "$sink_cpu" "$dp_cpu" "$flood" "$psi" "$status")"
}

# ---------------------------------------------------------------- main loop
NRUNS=$((TRIALS * ${#FLOW_LIST[@]} * ${#Q_LIST[@]}))
vmq_log "$NRUNS runs: $TRIALS trial(s) x ${#FLOW_LIST[@]} flow count(s) x ${#Q_LIST[@]} queue-pair count(s)," \
    "${WARMUP}s warm-up + ${DURATION}s window each; results in $OUT"
cell=0
for ((trial = 1; trial <= TRIALS; trial++)); do
    for flows in "${FLOW_LIST[@]}"; do
        read -r -a order <<<"$(rotated $((cell % ${#Q_LIST[@]})))"
        cell=$((cell + 1))
        mem=$(bench_mem "$DPDK_MB" 2)
        for q in "${order[@]}"; do
            run_one "$trial" "$flows" "$q" "$mem"
        done
    done
done
bench_finish flows flows_table.py table.md
