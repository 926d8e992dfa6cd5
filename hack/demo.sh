#!/usr/bin/env bash
# vhostmq demo (what `make demo` runs), as root on Debian 12:
#   1. install the dependencies (hack/install-deps.sh; a no-op when present)
#   2. build the test guest (hack/guest/build.sh; a no-op when up to date)
#   3. start the dataplane with two ports "a" and "b", 4 queue pairs each,
#      listening on vhost-user sockets (server role)
#   4. boot two QEMU guests (TCG) on those ports, ping and iperf3 between them
#   5. print the per-queue counters of the dataplane as a table, clean up
#
# Usage: hack/demo.sh [--queues 4] [--streams 32] [--time 5] [--keep DIR] [--no-install]
# Environment: VHOSTMQ_DATAPLANE (default <repo>/bin/vhostmq-dataplane, built
#   with `go build` if missing and Go is available), VHOSTMQ_BACKEND=testpmd.
# Exit status: 0 when ping and iperf3 worked and every queue the guests used
# (their own counters) carried traffic on its pair.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$HERE/lib.sh"
VMQ_TAG=demo

QUEUES=4 STREAMS=32 ITIME=5 WORK="" INSTALL=1
vmq_args --queues=QUEUES --streams=STREAMS --time=ITIME --keep=WORK --no-install:INSTALL=0 -- "$@"
vmq_need_root
T0=$(vmq_now)
step() { if [[ -t 1 ]]; then printf '\n\033[1m==> %s\033[0m\n' "$*"; else printf '\n==> %s\n' "$*"; fi; }

step "1/5 dependencies"
if ((INSTALL)); then "$HERE/install-deps.sh" --no-image-builds; else echo "skipped (--no-install)"; fi

step "2/5 guest image"
vmq_build_guest
echo "guest image: $VMQ_GUEST_DIR"

if [[ $VMQ_BACKEND == dataplane && ! -x $VMQ_DATAPLANE ]]; then
    if [[ $VMQ_DATAPLANE == "$VMQ_REPO_ROOT/bin/vhostmq-dataplane" ]] && command -v go >/dev/null; then
        vmq_log "building the dataplane: go build -o bin/ ./cmd/vhostmq-dataplane"
        (cd "$VMQ_REPO_ROOT" && go build -o bin/ ./cmd/vhostmq-dataplane)
    else
        vmq_die "dataplane binary $VMQ_DATAPLANE not found: run 'make build'"
    fi
fi

vmq_workdir vhostmq-demo
vmq_init
vmq_tg_setup "$WORK" server "$QUEUES"

step "3/5 dataplane + 4/5 guests"
echo "config ($VMQ_TG_CFG):"
sed 's/^/    /' "$VMQ_TG_CFG"
vmq_tg_boot client,idle "vmq.streams=$STREAMS" "vmq.time=$ITIME"
echo "guest a: 10.0.0.1, $(vmq_result "${VMQ_GUEST_LOG[a]}" queues rx) rx / $(vmq_result "${VMQ_GUEST_LOG[a]}" queues tx) tx queues, booted in ${VMQ_RES[boot_s_a]} s"
echo "guest b: 10.0.0.2, $(vmq_result "${VMQ_GUEST_LOG[b]}" queues rx) rx / $(vmq_result "${VMQ_GUEST_LOG[b]}" queues tx) tx queues, booted in ${VMQ_RES[boot_s_b]} s"
echo "running: ping, then iperf3 -P $STREAMS for $ITIME s each way (TCG guests: expect well under 1 Gbit/s)"
vmq_tg_traffic || true   # failures are recorded and reported below
CTL=$VMQ_REPO_ROOT/bin/vhostmqctl
if [[ $VMQ_BACKEND == dataplane && -x $CTL ]]; then
    api=$(dirname "$VMQ_TG_CFG")/api.sock
    step "the node agent's view (vhostmqctl --socket $api ...)"
    for cmd in "port list" "queues --interval 0" "stats --interval 0"; do
        echo "\$ vhostmqctl $cmd"
        # shellcheck disable=SC2086 # $cmd is split into arguments on purpose
        "$CTL" --socket "$api" $cmd || vmq_log "vhostmqctl $cmd failed"
        echo
    done
fi
vmq_tg_teardown

step "5/5 results"
vmq_tg_summary
echo
echo "demo took $(vmq_elapsed "$T0") s; logs, config and stats: $WORK"
if vmq_fails_report; then echo "demo: OK"; else echo "demo: FAILED"; exit 1; fi
