#!/usr/bin/env bash
# Issues #7 and #8 proven on real KubeVirt, in one command: build KubeVirt v1.7.0
# (build.sh), its Debian images (images.sh), bring up the test bed
# (testbed.sh up --nodes N: the cluster, two nodes by default, with
# multus-lite, kube-proxy, KubeVirt with useEmulation, the vhostmq binding),
# run the VM test (test-vm.sh: the bring-up of the chart's images, then the
# Go specs of test/e2e/kubevirt_test.go: helm install of the chart, a
# 4-vCPU and a 2-vCPU VM on vhostmq, queues, traffic, a live migration to
# the second node while a file streams in, helm upgrade and uninstall), then
# the install guide word for word (test-install.sh: docs/user/install.md and
# uninstall.md on this test bed, with a registry and a Debian cloud image),
# and take down what it brought up.  Prints the timings of each stage and ends
# with "N passed, N failed" (the stages and every spec, from the specs'
# JUnit report); exit status 1 if anything failed.
#
# Usage: hack/kubevirt/test.sh [--keep]
# Environment: VHOSTMQ_KUBEVIRT_NODES=2 (1: one node, the migration goes
#   only as far as its target pod); VHOSTMQ_KUBEVIRT_INSTALL_GUIDE=1 (0: no
#   install-guide stage)
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

JUNIT=$VMQC_LOGS/kubevirt-test-vm/junit.xml # the specs' report (test-vm.sh)
# junit_counts FILE LABEL: "passed failed skipped" of the specs ([It]
# test cases) with LABEL in a Ginkgo JUnit report (the suite lists the
# others as skipped); "0 0 0" without a report
junit_counts() {
    local cases
    cases=$(grep -o "<testcase name=\"\\[It\\][^\"]*\\[$2\\]\" [^>]*status=\"[a-z]*\"" "$1" 2>/dev/null |
        sed 's/.*status="//; s/"$//' || true)
    printf '%s %s %s\n' "$(grep -cx passed <<<"$cases" || true)" \
        "$(grep -cxE 'failed|panicked|interrupted|aborted|timedout' <<<"$cases" || true)" \
        "$(grep -cxE 'skipped|pending' <<<"$cases" || true)"
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
    # test-vm.sh runs the Go specs (label kubevirt): each spec is one check,
    # counted from their JUnit report; an exit without a failed spec (the
    # bring-up, a timeout) is one failure more
    rc=0
    args=()
    ((KEEP)) && args+=(--keep)
    echo "=== test-vm: $HERE/test-vm.sh ${args[*]}"
    t0=$(vmq_now)
    mkdir -p "$(dirname "$OUT")"
    rm -f "$JUNIT"
    "$HERE/test-vm.sh" "${args[@]}" 2>&1 | tee "$OUT" || rc=$?
    T[test-vm]=$(vmqc_secs "$t0")
    read -r sp sf ss <<<"$(junit_counts "$JUNIT" kubevirt)"
    echo "specs: $sp passed, $sf failed, $ss skipped (exit $rc; $JUNIT)"
    passed=$((passed + sp)) failed=$((failed + sf))
    if ((rc != 0 && sf == 0)); then
        echo "FAIL test-vm.sh exit $rc without a failed spec (the bring-up, or the specs did not end)"
        failed=$((failed + 1))
    elif ((sp == 0)); then
        echo "FAIL no spec passed (skipped: KubeVirt not served?)"
        failed=$((failed + 1))
    fi
fi
# the install guide word for word (docs/user/install.md): after test-vm.sh,
# whose specs uninstall their release; --keep leaves that release up
# (the test bed must be up; KubeVirt may still be reconciling test-vm's
# uninstall: test-install.sh waits for it)
if ((!KEEP)) && [[ ${VHOSTMQ_KUBEVIRT_INSTALL_GUIDE:-1} == 1 ]] && vmqc_is_up; then
    stage install-guide "$HERE/test-install.sh" || true
fi
if ((we_up && !KEEP)); then
    stage down "$HERE/testbed.sh" down || true
    stage "nothing left after down" down_clean || true
fi
echo
echo "timings: build ${T[build]:--} s, images ${T[images]:--} s, testbed up ${T[up]:--} s," \
    "test-vm ${T[test-vm]:--} s, install-guide ${T[install-guide]:--} s, down ${T[down]:--} s; total $(vmqc_secs "$T0") s"
echo "caches: $(du -sh "$VMKV_CACHE/bin" 2>/dev/null | cut -f1) binaries, $(du -sh "$VMKV_ROOTFS" 2>/dev/null | cut -f1) rootfs," \
    "$(du -sh "$VMKV_IMAGES" 2>/dev/null | cut -f1) images in $VMKV_CACHE"
echo "$passed passed, $failed failed"
((failed == 0))
