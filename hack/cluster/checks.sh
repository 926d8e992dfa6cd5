# shellcheck shell=bash
# The cluster tests' check lines: "ok   WHAT (S s)" / "FAIL WHAT (S s)",
# timed from the last step, counted in passed/failed. Sourced after lib.sh
# (vmq_now, vmqc_secs) by the scripts that print "N passed, N failed".
passed=${passed:-0} failed=${failed:-0}
step_t0=$(vmq_now)
step() { step_t0=$(vmq_now); echo "--- $*"; }
pass() { printf 'ok   %s (%s s)\n' "$1" "$(vmqc_secs "$step_t0")"; passed=$((passed + 1)); }
fail() { printf 'FAIL %s (%s s)\n' "$1" "$(vmqc_secs "$step_t0")"; failed=$((failed + 1)); }
check() { # check WHAT CMD...: ok when CMD succeeds
    local what=$1
    shift
    if "$@"; then pass "$what"; else fail "$what"; fi
}
