#!/usr/bin/env bash
# How closely the per-port rate limits hold with DPDK traffic (the in-process
# hack/bench/limiter cannot offer more than ~1.3 Gbit/s).  Part of
# `make bench`.
#
# One bin/vhostmq-dataplane per frame size and trial (one worker on the
# second CPU of --cpus; ports a and b added through its API with
# `vhostmqctl port add`, busy polling, port security off: a config file's
# ports cannot take live limits) and two DPDK 22.11 virtio-user testpmds
# (Debian's dpdk-testpmd), non-interactive:
#   #1 on port a: txonly, --txpkts=SIZE frames to b's MAC, as fast as it can
#   #2 on port b: rxonly, counts what it receives
# Both forwarding lcores share the first CPU of --cpus (their main lcores
# sleep on the second): the dataplane's worker keeps a CPU to itself, as in
# hack/bench/limiter.  Sharing a CPU, #1 and #2 run in turns of a few ms,
# so the rings must hold a turn's frames: --ring (virtio-user queue_size,
# --rxd, --txd; default 16384) sets them.  What still overflows b's ring
# while #2 waits is column b_ring_drop_pps (the dataplane's drops toward b
# but rate_limited); it caps the offered rate at 64 B (~2 Gbit/s here).
#
# For each size, with the same processes, limits set live with
# `vhostmqctl port bandwidth`: no limit (the offered rate), then for each
# rate an egress limit on a (shaped) and an ingress limit on b (policed,
# drops counted as rate_limited).  Each case: set the limit, --warmup
# seconds (spends the bucket's initial burst), then a window of --window
# seconds over which #2's own port counters (telemetry /ethdev/stats,
# ibytes) give the achieved rate.  virtio-user's ibytes are the bytes on the
# ring, the Ethernet frame without the 4-byte CRC, which is how the limit
# counts (column rx_frame_bytes = ibytes/ipackets, checked against SIZE).
# offered_bps: what b received in the no-limit case of that size and trial;
# a_tx_bps: what #1 got onto a's ring in this case (for egress: what the
# shaper let through).  ratio = achieved / limit, "-" where the offered
# rate is not 5 % above the limit (the row then says nothing of the
# limiter).  dp_cpu_pct: the dataplane's CPU time over the window (% of
# one CPU); dp_wait_pct, fe_wait_pct: how long the dataplane's threads and
# the two testpmds' threads were runnable but waiting for a CPU (schedstat,
# % of the window; the testpmds' ~100 is their sharing one CPU): a busy
# neighbour on the machine shows up there, and a worker kept off its CPU
# for longer than a bucket's depth (10 ms) loses tokens.  With --trials N
# it prints medians per case, and quiet_ratio over the rows whose
# dataplane waited < 15 %.  It measures and prints; it asserts nothing.
#
# Usage: hack/bench/limiter-dpdk.sh [--sizes "64 1500"] [--rates "1G 10G"]
#          [--trials 1] [--warmup 1] [--window 3] [--cpus 0,1] [--ring 16384]
#          [--out DIR]
#   --rates   Kubernetes quantities (decimal: 1G = 10^9 bit/s)
#   --out     results (default _output/bench/limiter-dpdk-<UTC time>):
#             table.tsv and logs/ (configs, testpmd logs, window JSON)
# Needs root, hack/install-deps.sh (dpdk-testpmd, jq, python3; hugepages
# help: 2 x (256 + RING/128) MiB) and `make build` (bin/vhostmq-dataplane,
# bin/vhostmqctl).  Every process runs under `timeout` and is stopped at
# exit.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=../lib.sh disable=SC1091
source "$HERE/../lib.sh"
# shellcheck source-path=SCRIPTDIR source=lib.sh disable=SC1091
source "$HERE/lib.sh"
# shellcheck disable=SC2034  # read by lib.sh
VMQ_TAG=limiter-dpdk

SIZES="64 1500" RATES="1G 10G" WARMUP=1 WINDOW=3 CPUS=0,1 OUT="" RING=16384 TRIALS=1
vmq_args --sizes=SIZES --rates=RATES --warmup=WARMUP --window=WINDOW --cpus=CPUS --out=OUT --ring=RING \
    --trials=TRIALS -- "$@"
for s in $SIZES; do
    [[ $s =~ ^[0-9]+$ ]] || vmq_die "--sizes: '$s' is not a number"
    ((s >= 60 && s <= 1514)) || vmq_die "--sizes: '$s' must be 60..1514"
done
for r in $RATES; do [[ $r =~ ^[0-9]+(k|M|G)?$ ]] || vmq_die "--rates: '$r' is not like 500M or 1G"; done
[[ $WARMUP =~ ^[0-9]+$ ]] || vmq_die "--warmup must be whole seconds"
[[ $WINDOW =~ ^[1-9][0-9]*$ ]] || vmq_die "--window must be whole seconds > 0"
[[ $TRIALS =~ ^[1-9][0-9]*$ ]] || vmq_die "--trials must be a positive number"
[[ $RING =~ ^[1-9][0-9]*$ ]] || vmq_die "--ring must be a number"
((RING >= 256 && RING <= 32768 && (RING & (RING - 1)) == 0)) || vmq_die "--ring must be a power of two, 256..32768"
[[ $CPUS =~ ^([0-9]+),([0-9]+)$ ]] || vmq_die "--cpus must be FE,DP"
FE_CPU=${BASH_REMATCH[1]} DP_CPU=${BASH_REMATCH[2]}
((FE_CPU != DP_CPU && FE_CPU < $(nproc) && DP_CPU < $(nproc))) || vmq_die "--cpus $CPUS: two different CPUs of $(nproc)"

vmq_need_root
vmq_need dpdk-testpmd jq timeout stdbuf "$VMQ_PY"
[[ -x $VMQ_DATAPLANE && -x $VMQ_CTL ]] || vmq_die "$VMQ_DATAPLANE or $VMQ_CTL missing: run 'make build'"

bench_setup limiter-dpdk- vmqlim
MAC_A=02:76:6d:71:00:0a
MAC_B=02:76:6d:71:00:0b
NCASES=$((1 + 2 * $(wc -w <<<"$RATES")))
TRIAL=0
QUIET=15 # % of the window: a row whose dataplane waited less for its CPU is "quiet"
BOUND=$((60 + NCASES * (WARMUP + WINDOW + 15))) # seconds any process may live

bps() { # bps QUANTITY: bits per second
    awk -v q="$1" 'BEGIN { m = 1; if (q ~ /k$/) m = 1e3; else if (q ~ /M$/) m = 1e6; else if (q ~ /G$/) m = 1e9
                           sub(/[kMG]$/, "", q); printf "%.0f", q * m }'
}
# sched_ns PID...: "run wait" ns summed over every thread of the PIDs (schedstat)
sched_ns() {
    local p
    for p in "$@"; do cat /proc/"$p"/task/*/schedstat 2>/dev/null || true; done | awk '{ r += $1; w += $2 } END { printf "%.0f %.0f\n", r, w }'
}
VMQ_API=$WORK/api.sock # a link to the current dataplane's

TABLE=$OUT/table.tsv
printf 'trial\tsize\tdirection\tlimit\toffered_bps\tachieved_bps\tratio\ta_tx_bps\trx_frame_bytes\trate_limited_pps\tb_ring_drop_pps\tdp_cpu_pct\tdp_wait_pct\tfe_wait_pct\n' >"$TABLE"

# one_size SIZE: a dataplane and two testpmds, every case, then stop all
one_size() {
    local size=$1 dir=$OUT/logs/t$TRIAL-$1 sd=$WORK/$TRIAL-$1 mem pa pb dp_pid tx_pid rx_pid
    mkdir -p "$dir" "$sd"
    read -r -a mem <<<"$(vmq_dpdk_mem_args $((256 + RING / 128)))"
    pa=vmql$$a$TRIAL-$size pb=vmql$$b$TRIAL-$size
    vmq_dpdk_track "$pa"
    vmq_dpdk_track "$pb"
    # the ports come from the API, not the config file: a config file's
    # ports take their limits there only, an API port's can be set live
    cat >"$dir/dataplane.yaml" <<EOF
cpus: [$DP_CPU]
apiSocket: $sd/api.sock
socketRoot: $sd
stateDir: $sd/state
logLevel: info
EOF
    ln -sfn "$sd/api.sock" "$WORK/api.sock"
    vmq_bg "$dir/dataplane.log" "$BOUND" "$VMQ_DATAPLANE" --config "$dir/dataplane.yaml"
    dp_pid=$VMQ_BG_PID
    vmq_wait_path "$sd/api.sock" 30 "$dp_pid" || vmq_die "dataplane did not create its API socket; see $dir/dataplane.log"
    local n m
    for n in a b; do
        m=$MAC_A
        [[ $n == b ]] && m=$MAC_B
        vmq_ctl port add "$n" --socket "$sd/$n.sock" --role server \
            --mac "$m" --polling busy --port-security=false >>"$dir/ports.txt" || vmq_die "port add $n failed"
        vmq_wait_path "$sd/$n.sock" 30 "$dp_pid" || vmq_die "dataplane did not create $sd/$n.sock; see $dir/dataplane.log"
    done
    # shellcheck disable=SC2054  # commas are testpmd option syntax
    local common=(-l "$FE_CPU,$DP_CPU" --main-lcore "$DP_CPU" --no-pci "${mem[@]}")
    # shellcheck disable=SC2054
    vmq_bg "$dir/testpmd-b.log" "$BOUND" stdbuf -oL dpdk-testpmd "${common[@]}" --file-prefix="$pb" \
        --vdev "net_virtio_user0,path=$sd/b.sock,queues=1,queue_size=$RING,mac=$MAC_B" -- --nb-cores=1 --port-topology=loop \
        --forward-mode=rxonly --rxd="$RING" --txd="$RING" --total-num-mbufs=$((2 * RING + 8192)) --stats-period=3600
    rx_pid=$VMQ_BG_PID
    # shellcheck disable=SC2054
    vmq_bg "$dir/testpmd-a.log" "$BOUND" stdbuf -oL dpdk-testpmd "${common[@]}" --file-prefix="$pa" \
        --vdev "net_virtio_user0,path=$sd/a.sock,queues=1,queue_size=$RING,mac=$MAC_A" -- --nb-cores=1 --port-topology=loop \
        --forward-mode=txonly --txpkts="$size" --eth-peer=0,"$MAC_B" --rxd="$RING" --txd="$RING" --total-num-mbufs=$((2 * RING + 8192)) --stats-period=3600
    tx_pid=$VMQ_BG_PID
    local p
    for p in "$rx_pid:b" "$tx_pid:a"; do
        vmq_wait_log "$dir/testpmd-${p#*:}.log" 'packet forwarding - ports=' 60 "${p%:*}" ||
            vmq_die "testpmd ${p#*:} did not start forwarding; see $dir/testpmd-${p#*:}.log"
    done
    for p in "$pa" "$pb"; do link_up "$p" 1 30 || vmq_die "virtio-user link of $p not up"; done

    local dp_real fe_real=() s0 s1
    dp_real=$(vmq_child "$dp_pid")
    fe_real=("$(vmq_child "$tx_pid")" "$(vmq_child "$rx_pid")")
    local offered="" cases=(none:-) r
    for r in $RATES; do cases+=("egress:$r" "ingress:$r"); done
    local c dirn lim id err line
    for c in "${cases[@]}"; do
        dirn=${c%%:*} lim=${c#*:} id=$size-$dirn-$lim
        for n in a b; do vmq_ctl port bandwidth "$n" --clear >/dev/null || vmq_die "clearing $n's limits failed"; done
        case $dirn in
            egress) vmq_ctl port bandwidth a --egress "$lim" >"$dir/$id.ctl" ;;
            ingress) vmq_ctl port bandwidth b --ingress "$lim" >"$dir/$id.ctl" ;;
        esac
        sleep "$WARMUP"
        stats_window "$VMQ_API" "$WINDOW" "$dir/$id.stats.json"
        s0="$(sched_ns "$dp_real") $(sched_ns "${fe_real[@]}") $(vmq_now)"
        "$VMQ_PY" "$HERE/window.py" "$WINDOW" "dpdk:rx:$pb:1" "dpdk:tx:$pa:1" >"$dir/$id.window.json" 2>"$dir/$id.window.err" ||
            vmq_die "window measurement failed: $(tail -n 1 "$dir/$id.window.err")"
        s1="$(sched_ns "$dp_real") $(sched_ns "${fe_real[@]}") $(vmq_now)"
        # the dataplane's CPU (% of one) and time its threads and the
        # testpmds' threads spent runnable but waiting for a CPU (% of the
        # window): a busy neighbour on the machine shows up here
        local dpc dpw few
        read -r dpc dpw few < <(awk -v a="$s0" -v b="$s1" 'BEGIN { split(a, x, " "); split(b, y, " "); t = (y[5] - x[5]) * 1e9
            printf "%.0f %.1f %.1f\n", 100 * (y[1] - x[1]) / t, 100 * (y[2] - x[2]) / t, 100 * (y[4] - x[4]) / t }')
        err=$(stats_window_wait) || vmq_log "$id: vhostmqctl stats failed: $err"
        line=$(jq -r --slurpfile v "$dir/$id.stats.json" '
            (.dpdk.rx | .ports[0].ibytes * 8 / .seconds | round) as $rx
            | (.dpdk.tx | .ports[0].obytes * 8 / .seconds | round) as $tx
            | (.dpdk.rx.ports[0] | if .ipackets > 0 then .ibytes / .ipackets * 100 | round / 100 else "NA" end) as $fb
            | ($v[0] // {} | [.ports[]? | select(.id == "b") | .total.rates.drops_per_second] | first // {}) as $d
            | [$rx, $tx, $fb, ($d.rate_limited // "NA" | if type == "number" then round else . end),
               (if $d.total then ($d.total - ($d.rate_limited // 0) - ($d.no_destination // 0)) | round else "NA" end)] | @tsv' \
            "$dir/$id.window.json" 2>/dev/null) || line=$'NA\tNA\tNA\tNA\tNA'
        local ach tx fb rl rd ratio
        IFS=$'\t' read -r ach tx fb rl rd <<<"$line"
        [[ $dirn == none ]] && offered=$ach
        ratio=-
        if [[ $dirn != none ]] && awk -v o="$offered" -v l="$(bps "$lim")" 'BEGIN { exit !(o > 1.05 * l) }'; then
            ratio=$(awk -v a="$ach" -v l="$(bps "$lim")" 'BEGIN { printf "%.4f", a / l }')
        fi
        printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$TRIAL" "$size" "$dirn" "$lim" "$offered" "$ach" "$ratio" \
            "$tx" "$fb" "$rl" "$rd" "$dpc" "$dpw" "$few" >>"$TABLE"
        vmq_log "$(printf 'trial %s %5s B %-7s %-4s offered %12s achieved %12s ratio %-6s (dataplane waited %s%%)' \
            "$TRIAL" "$size" "$dirn" "$lim" "$offered" "$ach" "$ratio" "$dpw")"
    done
    vmq_ctl stats -o wide --interval 0 >"$dir/final-stats.txt" 2>&1 || true
    stop_pid "$tx_pid"
    stop_pid "$rx_pid"
    stop_pid "$dp_pid" 12
    dpdk_forget "$pa"
    dpdk_forget "$pb"
}

vmq_log "sizes $SIZES, rates $RATES, ${WARMUP}s warm-up + ${WINDOW}s window per case; results in $OUT"
for ((TRIAL = 1; TRIAL <= TRIALS; TRIAL++)); do
    for s in $SIZES; do one_size "$s"; done
done
echo
echo "rates in bit/s of Ethernet frame bytes without CRC (testpmd #2's ibytes); ratio = achieved / limit"
vmq_table <"$TABLE"
if ((TRIALS > 1)); then
    echo
    echo "medians over $TRIALS trials (ratio over the trials where the offered rate was 5 % above the limit;"
    echo "quiet_ratio: only those where the dataplane waited for its CPU < $QUIET % of the window)"
    "$VMQ_PY" - "$TABLE" "$QUIET" <<'PY' | vmq_table
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
keys = []
for r in rows:
    k = (r["size"], r["direction"], r["limit"])
    if k not in keys:
        keys.append(k)
med = lambda v: statistics.median(v) if v else None
quiet = float(sys.argv[2])
print("size direction limit offered_bps achieved_bps ratio min_ratio max_ratio n_ratio quiet_ratio n_quiet")
for k in keys:
    rs = [r for r in rows if (r["size"], r["direction"], r["limit"]) == k]
    num = lambda f: [float(r[f]) for r in rs if r[f] not in ("", "NA", "-")]
    ra = num("ratio")
    rq = [float(r["ratio"]) for r in rs if r["ratio"] not in ("", "NA", "-") and r["dp_wait_pct"] not in ("", "NA")
          and float(r["dp_wait_pct"]) < quiet]
    fmt = lambda v, p: "-" if v is None else (p % v)
    print(*k, fmt(med(num("offered_bps")), "%.0f"), fmt(med(num("achieved_bps")), "%.0f"),
          fmt(med(ra), "%.4f"), fmt(min(ra) if ra else None, "%.4f"), fmt(max(ra) if ra else None, "%.4f"), len(ra),
          fmt(med(rq), "%.4f"), len(rq))
PY
fi
echo "table: $TABLE; logs: $OUT/logs"
