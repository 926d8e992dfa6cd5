#!/usr/bin/env bash
# Regenerates cmd/vhostmq-dataplane/default.pgo, the CPU profile that `go
# build` uses for the dataplane binary (-pgo=auto: a default.pgo in the
# main package's directory). The profile comes from the in-process
# per-frame path benchmarks (dataplane/bench_paths_test.go: guest TX drop,
# port->port at 64 and 1500 B in every RX layout), so the compiler inlines
# what a worker spends its time in. The build stays reproducible: the same
# profile gives the same binary; the profile is committed and only changes
# when this script is run (after a change to the per-frame path).
# docs/performance.md says what it gives (callgrind instructions per frame
# with and without it, `make bench-instructions`).
#
# Usage: hack/pgo.sh [--benchtime 2s]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
benchtime=2s
while (($#)); do
    case $1 in
        --benchtime) benchtime=$2; shift 2 ;;
        *) echo "usage: $0 [--benchtime D]" >&2; exit 2 ;;
    esac
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go test -run '^$' -bench '^BenchmarkPath(TxDrop|Forward)$' -benchtime "$benchtime" \
    -cpuprofile "$tmp/cpu.pprof" -o "$tmp/dataplane.test" ./dataplane | grep -E '^(Benchmark|ok)'
cp "$tmp/cpu.pprof" cmd/vhostmq-dataplane/default.pgo
echo "wrote cmd/vhostmq-dataplane/default.pgo ($(stat -c %s cmd/vhostmq-dataplane/default.pgo) bytes)"
