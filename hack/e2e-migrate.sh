#!/usr/bin/env bash
# End-to-end test of live migration over vhostmq: a QEMU guest (TCG, 1 vCPU,
# 512 MiB memfd share=on) moves to a second QEMU on another port of the same
# dataplane while the dataplane writes into its memory.
#
#   guest b  (10.0.0.2, port b)  writes --mb MiB from /dev/urandom, hashes it,
#                                pings a every 10 ms and sends the file to a
#                                over TCP (busybox nc)
#   guest a  (10.0.0.1, port a)  receives the file and hashes it as it comes
#   QEMU a2  (port a2, a's MAC)  started with -incoming: the target
# While the file streams, a migrates to a2 (QMP `migrate` over a unix
# socket, max-bandwidth raised, downtime limit 300 ms).  QEMU only migrates
# a vhost-user NIC whose backend logs the pages it writes (VHOST_F_LOG_ALL,
# LOG_SHMFD); a page the dataplane wrote and did not log would reach a2 stale
# and corrupt the file or stall TCP.  After the migration a's QEMU quits and
# port a is deleted through the agent API.
#
# Asserted: no migration blocker and status "completed"; the transfer was
# under way when the migration began; with both guests stopped after the
# migration (--memcheck: the target started with -S), their memories are equal page
# for page (what a page the dataplane wrote and did not log breaks; then
# the target runs); the sha256 a2's guest computed equals
# the one b computed, over the whole file; every vring a stopped at
# (GET_VRING_BASE) is where a2 started (SET_VRING_BASE); after the migration
# a2 carries the guest's traffic (its counters move, a's do not); b's pings
# are answered after port a is gone; the dataplane exits 0.  Reported:
# migration total time, downtime and setup time (query-migrate), RAM
# transferred, dirty-sync rounds, the longest ping gap (replies lost in a
# row x 10 ms), the file's transfer time.
#
# Usage: hack/e2e-migrate.sh [--role server|client|both] [--mb 200]
#          [--queues 1] [--tail 8] [--memcheck yes|no] [--keep DIR]
#   --role both   server, then client (default)
#   --mb N        file size in MiB (the migration starts 1 s into the
#                 transfer, which at TCG speed takes several seconds)
#   --tail S      seconds b keeps pinging after the file went (port a is
#                 deleted meanwhile)
#   --memcheck    start the target paused (-S) and compare the two guests'
#                 memories page by page before it runs (default: yes in the
#                 client role, no in the server role: the comparison's pause
#                 of several seconds is in that run's ping gap, so the server
#                 run measures the gap and the client run the memory)
#   --keep DIR    work dir (default: a new /tmp/vhostmq-e2e-migrate.XXXXXX)
# Needs root and hack/install-deps.sh; builds the guest image if needed.
# Exit status: 0 when every assertion held.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$HERE/lib.sh"

ROLE=both MB=200 QUEUES=1 TAIL=8 MEMCHECK="" WORK=""
vmq_args --role=ROLE --mb=MB --queues=QUEUES --tail=TAIL --memcheck=MEMCHECK --keep=WORK -- "$@"
[[ $ROLE =~ ^(server|client|both)$ ]] || vmq_die "--role must be server, client or both"
if ! [[ $MB =~ ^[1-9][0-9]*$ ]] || ((MB > 300)); then vmq_die "--mb must be 1..300 (the file lives in b's 512 MiB)"; fi
[[ $QUEUES =~ ^[1-9][0-9]*$ ]] || vmq_die "--queues must be a positive number"
[[ $TAIL =~ ^[1-9][0-9]*$ ]] || vmq_die "--tail must be a positive number of seconds"
[[ $MEMCHECK =~ ^(|yes|no)$ ]] || vmq_die "--memcheck must be yes or no"
[[ -n $MEMCHECK ]] || { MEMCHECK=no; [[ $ROLE == client ]] && MEMCHECK=yes; }
vmq_need_root
vmq_workdir vhostmq-e2e-migrate
vmq_init
T0=$(vmq_now)
vmq_build_guest
[[ $VMQ_BACKEND == dataplane ]] || vmq_die "the migration test needs the dataplane backend (VHOSTMQ_BACKEND=dataplane)"

if [[ $ROLE == both ]]; then
    RUNS=(server client)
    for r in "${RUNS[@]}"; do
        vmq_log "===== role $r ====="
        vmq_rerun "$WORK/$r" --role "$r"
    done
    # row I: run I's columns, from its result.env
    # shellcheck disable=SC2317  # called by vmq_rerun_summary
    row() {
        local mem=- gap=${max_gap_ms:-?}
        [[ ${memcheck:-} != yes ]] || mem=${mem_pages_differing:-?}-differ gap+="(paused)"
        echo "${RUNS[$1]} ${mig_status:-?} ${mig_total_ms:-?} ${mig_downtime_ms:-?} ${mig_setup_ms:-?} ${mig_ram_mib:-?}" \
            "${mig_dirty_syncs:-?} ${file_mib:-?} ${file_s:-?} ${sha_match:-?} $mem $gap ${pings:-?}"
    }
    vmq_rerun_summary e2e-migrate "role status total_ms downtime_ms setup_ms ram_mib dirty_syncs file_mib file_s sha256 memory max_ping_gap_ms pings" row
    exit 0 # (a failed verdict ends it with status 1: set -e)
fi

# ---------------------------------------------------------------- one role
VMQ_TAG=e2e-migrate/$ROLE
GUEST_S=300 BACKEND_S=330
MAC_A=52:54:00:00:00:0a MAC_B=52:54:00:00:00:0b
: >"$WORK/result.env"
VMQ_TG_WORK=$WORK # vmq_res writes there
vmq_res role "$ROLE"
vmq_res queues "$QUEUES"
vmq_res cpu_psi_start "$(vmq_cpu_psi)"

# qmp SOCKET JSON: one QMP command; prints its "return" (or the error) as JSON
qmp() {
    "$VMQ_PY" - "$1" "$2" <<'PY'
import json, socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(10)
s.connect(sys.argv[1])
f = s.makefile("rw")
def reply():
    while True:
        m = json.loads(f.readline())
        if "return" in m or "error" in m:
            return m
json.loads(f.readline())  # greeting
f.write('{"execute": "qmp_capabilities"}\n'); f.flush(); reply()
f.write(sys.argv[2] + "\n"); f.flush()
m = reply()
print(json.dumps(m.get("return", m)))
PY
}

# port_packets NAME rx|tx: the port's packets over all pairs, from the stats file
port_packets() {
    jq -r --arg p "$1" --arg k "${2}Packets" '[.ports[]? | select(.name == $p) | .queues[]? | .[$k] // 0] | add // 0' "$STATS" 2>/dev/null || echo 0
}

# b comes from the config file; a and a2 are added through the agent API,
# as the CNI adds a pod's port (and a port of the config file cannot be
# deleted through it)
VMQ_SOCK_ROLE=$ROLE
vmq_ports_reset
vmq_port_add b "$WORK/b.sock" "$QUEUES" "$MAC_B"
STATS=$WORK/stats.json CFG=$WORK/dataplane.yaml
vmq_write_config "$CFG" "$STATS"
echo "socketRoot: $WORK" >>"$CFG" # where ports added through the API may have their sockets
[[ -x $VMQ_CTL ]] || vmq_die "$VMQ_CTL not found: run 'make build'"
add_ports() {
    local g
    for g in a a2; do
        vmq_ctl port add "$g" --socket "$WORK/$g.sock" --role "$ROLE" --queues "$QUEUES" --mac "$MAC_A" \
            >"$WORK/port-add-$g.txt" 2>&1 || vmq_die "vhostmqctl port add $g: $(cat "$WORK/port-add-$g.txt")"
        [[ $ROLE == client ]] || vmq_wait_path "$WORK/$g.sock" 20 "$VMQ_BE_PID" || vmq_die "the dataplane did not create $g.sock"
    done
}

VMQ_GUEST_EXTRA[a]="-qmp unix:$WORK/qmp-a.sock,server=on,wait=off"
VMQ_GUEST_EXTRA[a2]="-qmp unix:$WORK/qmp-a2.sock,server=on,wait=off -incoming unix:$WORK/mig.sock"
# -S: the target stays paused after the migration, so that both copies of
# the guest's memory can be compared before it runs
[[ $MEMCHECK == no ]] || VMQ_GUEST_EXTRA[a2]+=" -S"
vmq_res memcheck "$MEMCHECK"
COMMON=("vmq.duration=$((GUEST_S - 20))" vmq.interval=0.01 "vmq.filemb=$MB" "vmq.tail=$TAIL")
mode=connect
[[ $ROLE == client ]] && mode=listen
if [[ $ROLE == server ]]; then
    vmq_backend_start "$WORK" "$CFG" "$STATS" "$BACKEND_S"
    add_ports
fi
vmq_guest_start b "$WORK/b.sock" "$mode" "$MAC_B" "$QUEUES" "$GUEST_S" "$WORK" \
    vmq.ip=10.0.0.2/24 vmq.peer=10.0.0.1 vmq.role=sendfile,idle "${COMMON[@]}"
vmq_guest_start a "$WORK/a.sock" "$mode" "$MAC_A" "$QUEUES" "$GUEST_S" "$WORK" \
    vmq.ip=10.0.0.1/24 vmq.peer=10.0.0.2 vmq.role=recvfile,idle "${COMMON[@]}"
vmq_guest_start a2 "$WORK/a2.sock" "$mode" "$MAC_A" "$QUEUES" "$GUEST_S" "$WORK" \
    vmq.ip=10.0.0.1/24 vmq.peer=10.0.0.2 vmq.role=recvfile,idle "${COMMON[@]}"
if [[ $ROLE == client ]]; then
    for g in a a2 b; do
        vmq_wait_path "$WORK/$g.sock" 20 "${VMQ_GUEST_PID[$g]}" || vmq_die "QEMU $g did not create its socket"
    done
    vmq_backend_start "$WORK" "$CFG" "$STATS" "$BACKEND_S"
    add_ports
fi
for g in a b; do
    vmq_guest_wait "$g" '^VHOSTMQ-RESULT link ' 120 || vmq_die "guest $g did not bring eth0 up"
done
vmq_guest_wait a '^VHOSTMQ-RESULT recvfile-ready ' 60 || vmq_die "guest a does not listen"
vmq_guest_wait b '^VHOSTMQ-RESULT sendfile-ready ' 240 || vmq_die "guest b did not write its file"
SHA_B=$(vmq_result "${VMQ_GUEST_LOG[b]}" sendfile-ready sha256)
BYTES_B=$(vmq_result "${VMQ_GUEST_LOG[b]}" sendfile-ready bytes)
vmq_log "b's file: $BYTES_B bytes, sha256 $SHA_B"
vmq_guest_wait b '^VHOSTMQ-RESULT sendfile-start ' 90 || vmq_die "guest b did not reach a"
sleep 1
# the stream must be under way: the dataplane writes a's memory throughout
if grep -aq '^VHOSTMQ-RESULT sendfile ' "${VMQ_GUEST_LOG[b]}"; then
    vmq_fail "the file was sent before the migration began: raise --mb"
fi
RX_A0=$(port_packets a rx)
vmq_log "migrating a -> a2 (a has received $RX_A0 frames)"
qmp "$WORK/qmp-a.sock" '{"execute": "migrate-set-parameters", "arguments": {"max-bandwidth": 1073741824, "downtime-limit": 300}}' >/dev/null
MT0=$(vmq_now)
out=$(qmp "$WORK/qmp-a.sock" "{\"execute\": \"migrate\", \"arguments\": {\"uri\": \"unix:$WORK/mig.sock\"}}")
[[ $out == "{}" ]] || vmq_fail "migrate refused: $out"
status="" info="{}"
while (($(awk -v t="$(vmq_elapsed "$MT0")" 'BEGIN { print (t < 180) }'))); do
    info=$(qmp "$WORK/qmp-a.sock" '{"execute": "query-migrate"}' || echo '{}')
    status=$(jq -r '.status // "?"' <<<"$info")
    [[ $status =~ ^(completed|failed|cancelled)$ ]] && break
    sleep 0.25
done
echo "$info" >"$WORK/query-migrate.json"
vmq_res mig_status "$status"
vmq_res mig_total_ms "$(jq -r '."total-time" // "?"' <<<"$info")"
vmq_res mig_downtime_ms "$(jq -r '.downtime // "?"' <<<"$info")"
vmq_res mig_setup_ms "$(jq -r '."setup-time" // "?"' <<<"$info")"
vmq_res mig_ram_mib "$(jq -r '(.ram.transferred // 0) / 1048576 | floor' <<<"$info")"
vmq_res mig_dirty_syncs "$(jq -r '.ram."dirty-sync-count" // "?"' <<<"$info")"
if [[ $status == completed ]]; then
    vmq_ok "migration completed: total ${VMQ_RES[mig_total_ms]} ms, downtime ${VMQ_RES[mig_downtime_ms]} ms, ${VMQ_RES[mig_ram_mib]} MiB in ${VMQ_RES[mig_dirty_syncs]} dirty syncs"
else
    vmq_fail "migration ended '$status': $(jq -c '{status, "error-desc"}' <<<"$info")"
fi
grep -aq 'vhost lacks VHOST_F_LOG_ALL\|Migration disabled' "$WORK"/guest-a.qemu.log && vmq_fail "QEMU installed a migration blocker (guest-a.qemu.log)"
# Both guests are stopped now (a after the migration, a2 by -S) and their
# rings too: their memories must be equal, page for page. A page the
# dataplane wrote into a's memory and did not log was not sent again and
# differs here (the guest itself would often hide it, by writing the page
# again or by TCP resending what came garbled).
if [[ $status == completed && $MEMCHECK == yes ]]; then
    ramsz=$((512 * 1048576))
    for g in a a2; do
        qmp "$WORK/qmp-$g.sock" "{\"execute\": \"pmemsave\", \"arguments\": {\"val\": 0, \"size\": $ramsz, \"filename\": \"$WORK/ram-$g.bin\"}}" >/dev/null
    done
    diff=$("$VMQ_PY" - "$WORK/ram-a.bin" "$WORK/ram-a2.bin" <<'PY'
import sys
a, b = open(sys.argv[1], "rb"), open(sys.argv[2], "rb")
diff, page = [], 0
while True:
    x, y = a.read(4096), b.read(4096)
    if not x and not y:
        break
    if x != y:
        diff.append(page)
    page += 1
print(len(diff), page, " ".join("%#x" % (p * 4096) for p in diff[:8]))
PY
)
    read -r ndiff npages first <<<"$diff"
    vmq_res mem_pages_differing "$ndiff"
    if [[ $ndiff == 0 ]]; then
        vmq_ok "the target's memory equals the source's ($npages pages)"
    else
        vmq_fail "$ndiff of $npages pages differ between the source's and the target's memory (first at GPA ${first:-?}; dumps kept: $WORK/ram-a.bin, ram-a2.bin)"
    fi
    [[ $ndiff == 0 ]] && rm -f "$WORK/ram-a.bin" "$WORK/ram-a2.bin"
    out=$(qmp "$WORK/qmp-a2.sock" '{"execute": "cont"}')
    [[ $out == "{}" ]] || vmq_fail "cont on a2: $out"
fi
st2=$(qmp "$WORK/qmp-a2.sock" '{"execute": "query-status"}' | jq -r '.status // "?"')
[[ $st2 == running ]] || vmq_fail "a2 is '$st2' after the migration, want running"
qmp "$WORK/qmp-a.sock" '{"execute": "quit"}' >/dev/null 2>&1 || true
sleep 1

# the guest, now in a2, finishes receiving; b reports the pings
if vmq_guest_wait a2 '^VHOSTMQ-RESULT recvfile ' 240; then
    sha=$(vmq_result "${VMQ_GUEST_LOG[a2]}" recvfile sha256)
    vmq_res file_mib "$((BYTES_B / 1048576))"
    if [[ $sha == "$SHA_B" ]]; then
        vmq_res sha_match yes
        vmq_ok "a2 received b's $BYTES_B bytes: the same sha256"
    else
        vmq_res sha_match NO
        vmq_fail "a2 received data with sha256 ${sha:-none}; b sent $BYTES_B bytes, sha256 $SHA_B"
    fi
else
    vmq_res sha_match none
    vmq_fail "the guest did not finish receiving in a2"
fi
# the MAC lives on a2 now: a2 carries the traffic, a (its QEMU gone) none
# (b pings a2 every interval until its tail ends: wait for both counters to
# move, however slowly a busy machine runs the guests, within the tail)
RX_A=$(port_packets a rx) RX_A2=$(port_packets a2 rx) TX_A2=$(port_packets a2 tx)
a2_moved() { echo "rx +$(($(port_packets a2 rx) - RX_A2)) tx +$(($(port_packets a2 tx) - TX_A2))"; }
VMQ_POLL_S=0.25 vmq_eventually "$TAIL" "a2 carries the guest's traffic after the migration (its rx and tx move)" \
    '~^rx \+[1-9][0-9]* tx \+[1-9]' a2_moved || true
RX_Ab=$(port_packets a rx)
((RX_Ab == RX_A)) || vmq_fail "frames still reach port a after the migration (rx $RX_A -> $RX_Ab)"
vmq_ctl port del a >"$WORK/port-del-a.txt" 2>&1 || vmq_fail "vhostmqctl port del a: $(cat "$WORK/port-del-a.txt")"
DEL_T=$(vmq_now)
if vmq_guest_wait b '^VHOSTMQ-RESULT pings ' $((TAIL + 120)); then
    lb=${VMQ_GUEST_LOG[b]}
    sent=$(vmq_result "$lb" pings sent) recvd=$(vmq_result "$lb" pings received) last=$(vmq_result "$lb" pings last_seq)
    vmq_res pings "$recvd/$sent"
    vmq_res max_gap_ms "$(vmq_result "$lb" pings max_gap_ms)"
    vmq_res file_sent_rc "$(vmq_result "$lb" sendfile rc)"
    vmq_res file_s "$(vmq_result "$lb" sendfile secs)"
    [[ ${VMQ_RES[file_sent_rc]} == 0 ]] || vmq_fail "b's nc ended with status ${VMQ_RES[file_sent_rc]}"
    # replies to the last second of pings (100) came after port a was deleted
    ((last >= sent - 100)) || vmq_fail "a2 stopped answering: the last reply was to ping $last of $sent"
    vmq_log "pings: $recvd of $sent answered, longest gap ${VMQ_RES[max_gap_ms]} ms, last reply to #$last" \
        "($(vmq_elapsed "$DEL_T") s after port a was deleted)"
else
    vmq_fail "guest b did not report its pings"
fi

# ring positions: every vring a stopped at is where a2 began
BE=$VMQ_BE_LOG
cont=ok
for ((i = 0; i < 2 * QUEUES; i++)); do
    stop=$(grep -a 'msg="vring stopped"' "$BE" | grep -a 'port=a ' | grep -a "vring=$i " | tail -n 1 | sed -n 's/.*base=\([0-9]*\).*/\1/p')
    start=$(grep -a 'msg="vring base set"' "$BE" | grep -a 'port=a2 ' | grep -a "vring=$i " | tail -n 1 | sed -n 's/.*base=\([0-9]*\).*/\1/p')
    vmq_log "vring $i: a stopped at ${stop:-?}, a2 began at ${start:-?}"
    [[ -n $stop && $stop == "$start" ]] || cont="vring $i: a stopped at ${stop:-?}, a2 began at ${start:-?}"
done
vmq_res rings "$cont"
[[ $cont == ok ]] || vmq_fail "ring positions not continuous: $cont"

vmq_res cpu_psi_end "$(vmq_cpu_psi)"
for g in a a2 b; do vmq_guest_stop "$g"; done
vmq_backend_stop
vmq_res backend_exit "$VMQ_RC"
[[ $VMQ_RC == 0 ]] || vmq_fail "dataplane exited with status $VMQ_RC on SIGTERM (log $BE)"
vmq_res wall_s "$(vmq_elapsed "$T0")"
echo
echo "===== vhostmq live migration: role=$ROLE queue pairs=$QUEUES (host CPU pressure avg10 ${VMQ_RES[cpu_psi_start]}% -> ${VMQ_RES[cpu_psi_end]}%) ====="
echo "migration        ${VMQ_RES[mig_status]}: total ${VMQ_RES[mig_total_ms]} ms, downtime ${VMQ_RES[mig_downtime_ms]} ms, setup ${VMQ_RES[mig_setup_ms]} ms, ${VMQ_RES[mig_ram_mib]} MiB RAM, ${VMQ_RES[mig_dirty_syncs]} dirty syncs"
echo "file b -> a/a2   ${VMQ_RES[file_mib]:-?} MiB in ${VMQ_RES[file_s]:-?} s, sha256 equal: ${VMQ_RES[sha_match]:-?}"
echo "pings b -> a/a2  ${VMQ_RES[pings]:-?} answered (every 10 ms), longest gap ${VMQ_RES[max_gap_ms]:-?} ms$([[ $MEMCHECK == yes ]] && echo " (with the target paused for the memory check)")"
[[ $MEMCHECK == no ]] || echo "memory           ${VMQ_RES[mem_pages_differing]:-?} pages differ between source and target after the stop"
echo "rings            ${VMQ_RES[rings]}"
echo "wall time ${VMQ_RES[wall_s]} s; work dir: $WORK"
vmq_verdict "e2e-migrate role=$ROLE"
