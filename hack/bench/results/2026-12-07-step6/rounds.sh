#!/usr/bin/env bash
# rounds.sh N CONFIG OUT: N rounds of one DPDK run, then the dataplane
# binaries /tmp/bins/old and /tmp/bins/new back to back (their order
# alternating), each a one-trial hack/bench/run.sh; run from the repo root.
set -uo pipefail
n=$1 cfg=$2 out=$3
printf 'round\tbinary\tconfig\tbackend\tMpps\tbusy%%\tpsi%%\n' >"$out"
for ((r = 1; r <= n; r++)); do
    order="new old"; ((r % 2 == 0)) && order="old new"
    for b in dpdk $order; do
        d=/tmp/ab/run-$cfg-$r-$b
        if [[ $b == dpdk ]]; then
            hack/bench/run.sh --trials 1 --duration 3 --warmup 1 --configs "$cfg" --backends dpdk --out "$d" >"$d.log" 2>&1
        else
            VHOSTMQ_DATAPLANE=/tmp/bins/$b hack/bench/run.sh --trials 1 --duration 3 --warmup 1 --configs "$cfg" --backends vhostmq --out "$d" >"$d.log" 2>&1
        fi
        awk -F'\t' -v r="$r" -v b="$b" 'NR > 1 { print r "\t" (b == "dpdk" ? "-" : b) "\t" $2 "\t" $3 "\t" $4 "\t" $9 "\t" $8 }' "$d/raw.tsv" >>"$out"
        tail -1 "$out"
    done
done
