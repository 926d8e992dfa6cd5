#!/usr/bin/env bash
# Issues #7 and #8 proven on real KubeVirt, in one command: build KubeVirt v1.7.0
# (build.sh), its Debian images (images.sh), bring up the test bed
# (testbed.sh up --nodes N: the cluster, two nodes by default, with
# multus-lite, kube-proxy, KubeVirt with useEmulation, the vhostmq binding),
# run the VM test (test-vm.sh: helm install of the chart, a 4-vCPU and a
# 2-vCPU VM on vhostmq, queues, traffic, a live migration to the second
# node while a file streams in, helm upgrade and uninstall), and take down
# what it brought up.  Prints the
# timings of each stage and ends with "N passed, N failed" (the stages and
# every check of test-vm.sh); exit status 1 if anything failed.
#
# Usage: hack/kubevirt/test.sh [--keep]
# Environment: VHOSTMQ_KUBEVIRT_NODES=2 (1: one node, the migration goes
#   only as far as its target pod)
#   --keep   leave the test bed, the VMs and the vhostmq objects up
#            (hack/kubevirt/testbed.sh down takes them down)
# A test bed that is already up (testbed.sh up, or test.sh --keep) is used
# and left up.  The caches of build.sh and images.sh are kept
# (/var/cache/vhostmq/kubevirt); a run without them builds them (~10 min
# more on 2 busy cores).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$HERE/lib.sh"
VMQ_TAG=kubevirt-test

KEEP=0
case ${1:-} in
    --keep) KEEP=1 ;;
    "") ;;
    -h | --help) vmq_usage "$0"; exit 0 ;;
    *) vmq_die "unknown argument $1 (see --help)" ;;
esac
vmq_need_root
passed=0 failed=0 we_up=0
declare -A T=()
OUT=$VMQC_LOGS/kubevirt-test.log

stage() { # stage NAME CMD...: run, time, count
    local name=$1 t0 rc=0
    shift
    t0=$(vmq_now)
    echo "=== $name: $*"
    "$@" || rc=$?
    T[$name]=$(vmqc_secs "$t0")
    if ((rc == 0)); then
        printf 'ok   %s (%s s)\n' "$name" "${T[$name]}"
        passed=$((passed + 1))
    else
        printf 'FAIL %s (exit %s, %s s)\n' "$name" "$rc" "${T[$name]}"
        failed=$((failed + 1))
    fi
    return "$rc"
}

root_shared() { awk '$5 == "/" { print $7 }' /proc/self/mountinfo | grep -c shared || true; }
ROOT_SHARED_BEFORE=$(root_shared)
down_clean() { # nothing of the test bed is left
    local ok=0
    [[ -e /run/netns/$VMQC_NETNS ]] && { echo "    netns $VMQC_NETNS still there"; ok=1; }
    [[ -e /run/netns/$VMQC_NETNS2 ]] && { echo "    netns $VMQC_NETNS2 still there"; ok=1; }
    [[ -d $VMKV_RUN || -d $VMQC_RUN ]] && { echo "    $VMKV_RUN or $VMQC_RUN still there"; ok=1; }
    [[ $(root_shared) == "$ROOT_SHARED_BEFORE" ]] || { echo "    / is shared now, it was not before"; ok=1; }
    grep -qE ' /(var/)?run/kubevirt' /proc/self/mountinfo && { echo "    KubeVirt mounts left"; ok=1; }
    return "$ok"
}

T0=$(vmq_now)
stage build "$HERE/build.sh" || true
stage images "$HERE/images.sh" || true
if "$HERE/testbed.sh" status >/dev/null 2>&1; then
    vmq_log "the test bed is up; using it (and leaving it up)"
else
    ((failed == 0)) || { echo "$passed passed, $failed failed"; exit 1; }
    we_up=1
    stage up "$HERE/testbed.sh" up --nodes "${VHOSTMQ_KUBEVIRT_NODES:-2}" || true
fi
if ((failed == 0)); then
    # test-vm.sh counts its own checks: add them to ours
    rc=0
    args=()
    ((KEEP)) && args+=(--keep)
    echo "=== test-vm: $HERE/test-vm.sh ${args[*]}"
    t0=$(vmq_now)
    mkdir -p "$(dirname "$OUT")"
    "$HERE/test-vm.sh" "${args[@]}" 2>&1 | tee "$OUT" || rc=$?
    T[test-vm]=$(vmqc_secs "$t0")
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$OUT" | tail -n1 || true)
    if [[ -n $line ]]; then
        passed=$((passed + ${line%% passed*}))
        f=${line#*, }
        failed=$((failed + ${f%% failed*}))
    else
        echo "FAIL test-vm.sh ended without its summary (exit $rc)"
        failed=$((failed + 1))
    fi
fi
if ((we_up && !KEEP)); then
    stage down "$HERE/testbed.sh" down || true
    stage "nothing left after down" down_clean || true
fi
echo
echo "timings: build ${T[build]:--} s, images ${T[images]:--} s, testbed up ${T[up]:--} s," \
    "test-vm ${T[test-vm]:--} s, down ${T[down]:--} s; total $(vmqc_secs "$T0") s"
echo "caches: $(du -sh "$VMKV_CACHE/bin" 2>/dev/null | cut -f1) binaries, $(du -sh "$VMKV_ROOTFS" 2>/dev/null | cut -f1) rootfs," \
    "$(du -sh "$VMKV_IMAGES" 2>/dev/null | cut -f1) images in $VMKV_CACHE"
echo "$passed passed, $failed failed"
((failed == 0))
