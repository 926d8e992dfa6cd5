#!/usr/bin/env bash
# What an operator watches, against a real dataplane under traffic: a DPDK
# virtio-user frontend (dpdk-testpmd, flowgen, 2 queue pairs) sends on port
# "a" to a MAC no port has: the one fault, every frame dropped as
# no_destination.
#
# The chart's alerts: a real Prometheus (Debian's package) scrapes the
# dataplane every second. Asserted:
#   - the scrape target is up, and the dataplane's series are there with the
#     `node` label the chart's monitors add;
#   - all seven rules of charts/vhostmq/files/alerts.yaml evaluate (health ok);
#   - VhostmqDropsHigh fires, for port a, reason no_destination, and no other
#     alert does (no stall, every worker healthy, the port connected, no
#     memory fault, and no kube-state-metrics series, so the Kubernetes
#     alerts stay quiet).
# The rules run as they are but with VhostmqDropsHigh's `for:` set to 0s
# (its 10 minutes are what promtool's tests cover: hack/test-alerts.sh);
# the others keep theirs, so a worker a busy machine starved for one scrape
# is pending, as in a cluster, not firing.
#
# vhostmqctl's shell completion, with two more ports made through the API:
# bash (cobra's script under Debian's bash-completion, its completion
# function called as bash does) lists the agent's port IDs after
# `port show`, the ones not yet given after `stats ID`, the output formats
# after -o and the subcommands after `port`; fish's `complete -C` lists
# the port IDs after `port del`; zsh's script loads under compinit.
#
# `vhostmqctl top` in tmux (send-keys, capture-pane), 160x30: the screen
# lists port a with its rates and drops by reason; u shows its 2 queue
# pairs, w the workers, s marks a sort column; q ends it with status 0;
# started again, it ends by itself, status 3 (the agent cannot be reached),
# naming the socket, when the dataplane is stopped.
#
# Usage: hack/e2e-observe.sh [--keep DIR]
# Environment: VHOSTMQ_DATAPLANE (hack/lib.sh)
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$HERE/lib.sh"
VMQ_TAG=e2e-observe

WORK=""
vmq_args --keep=WORK -- "$@"
vmq_need_root
vmq_need prometheus promtool dpdk-testpmd jq curl python3 tmux fish zsh
[[ -f /usr/share/bash-completion/bash_completion ]] || vmq_die "bash-completion missing: run hack/install-deps.sh"
vmq_workdir vhostmq-e2e-observe
vmq_init
T0=$(vmq_now)
SECS=300
# flowgen's fixed source (DPDK 22.11, app/test-pmd/flowgen.c): the port's
# MAC, so that port security lets its frames on to the switch
MAC_A=00:01:02:03:04:00
# two free loopback ports: the dataplane's metrics, Prometheus' API
read -r MPORT PPORT < <(python3 -c 'import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])')

# ------------------------------------------------------------------ dataplane
VMQ_SOCK_ROLE=server
vmq_ports_reset
vmq_port_add a "$WORK/a.sock" 2 "$MAC_A"
vmq_write_config "$WORK/dataplane.yaml" "$WORK/stats.json"
printf "metricsAddress: 127.0.0.1:%s\nsocketRoot: %s\n" "$MPORT" "$WORK" >>"$WORK/dataplane.yaml" # API ports under WORK
vmq_backend_start "$WORK" "$WORK/dataplane.yaml" "$WORK/stats.json" "$SECS"
read -r -a mem <<<"$(vmq_dpdk_mem_args 512)"
prefix=vmq$$prom
vmq_dpdk_track "$prefix"
# flowgen sends to 00:01:02:03:04:01 (DPDK 22.11 ignores --eth-peer): no port
# has it and there is no other port to flood to
vmq_bg "$WORK/testpmd.log" "$SECS" stdbuf -oL dpdk-testpmd -l 0,1 --main-lcore 1 --no-pci "${mem[@]}" \
    --file-prefix="$prefix" --vdev "net_virtio_user0,path=$WORK/a.sock,queues=2,mac=$MAC_A" -- \
    --nb-cores=1 --rxq=2 --txq=2 --port-topology=loop --forward-mode=flowgen --total-num-mbufs=32768 --stats-period=3600
FE_PID=$VMQ_BG_PID
vmq_wait_log "$WORK/testpmd.log" 'packet forwarding - ports=' 60 "$FE_PID" || vmq_die "testpmd did not start forwarding (log $WORK/testpmd.log)"

# ------------------------------------------------------------------ Prometheus
# the rules as they are, VhostmqDropsHigh's `for:` at 0s
awk '/- alert:/ { drops = ($3 == "VhostmqDropsHigh") } drops && /^ +for:/ { sub(/for:.*/, "for: 0s") } { print }' \
    "$VMQ_REPO_ROOT/charts/vhostmq/files/alerts.yaml" >"$WORK/alerts.yaml"
grep -q 'for: 0s' "$WORK/alerts.yaml" || vmq_die "VhostmqDropsHigh's for: not found in alerts.yaml"
promtool check rules "$WORK/alerts.yaml" >/dev/null || vmq_die "promtool check rules $WORK/alerts.yaml failed"
cat >"$WORK/prometheus.yml" <<EOF
global: {scrape_interval: 1s, evaluation_interval: 1s}
rule_files: [$WORK/alerts.yaml]
scrape_configs:
  - job_name: vhostmq
    honor_labels: true
    static_configs: [{targets: ["127.0.0.1:$MPORT"]}]
    # what the chart's monitors do with __meta_kubernetes_pod_node_name
    relabel_configs: [{target_label: node, replacement: e2e-node}]
EOF
promtool check config "$WORK/prometheus.yml" >/dev/null || vmq_die "promtool check config failed"
vmq_bg "$WORK/prometheus.log" "$SECS" prometheus --config.file "$WORK/prometheus.yml" --storage.tsdb.path "$WORK/tsdb" \
    --web.listen-address "127.0.0.1:$PPORT" --log.level warn
PROM_PID=$VMQ_BG_PID
vmq_log "$(prometheus --version 2>&1 | head -n 1); pid $PROM_PID on 127.0.0.1:$PPORT, scraping 127.0.0.1:$MPORT"
api() { curl -fsS --max-time 5 "http://127.0.0.1:$PPORT/api/v1/$1"; }
query() { curl -fsS --max-time 5 "http://127.0.0.1:$PPORT/api/v1/query" --data-urlencode "query=$1" | jq -c '.data.result'; }
firing() { api alerts | jq -c '[.data.alerts[] | select(.state == "firing") | {alertname: .labels.alertname, port: .labels.port, reason: .labels.reason, node: .labels.node}] | sort_by(.alertname)'; }

# target_health: the vhostmq target's health, and its last error if any
target_health() {
    api targets | jq -r '[.data.activeTargets[] | select(.labels.job == "vhostmq")
        | .health + (if .lastError != "" then " (" + .lastError + ")" else "" end)] | join(",")'
}
VMQ_POLL_S=0.5 vmq_eventually 60 "the scrape target 127.0.0.1:$MPORT is up" up target_health || true
firing_names() { firing | jq -r '[.[].alertname] | join(",")'; }
VMQ_POLL_S=1 vmq_eventually 90 "VhostmqDropsHigh fires" '~(^|,)VhostmqDropsHigh(,|$)' firing_names || true
sleep 3 # a few more evaluations
F=$(firing)
vmq_log "firing: $F"
want='[{"alertname":"VhostmqDropsHigh","port":"a","reason":"no_destination","node":"e2e-node"}]'
if [[ $(jq -cS . <<<"$F") == "$(jq -cS . <<<"$want")" ]]; then
    vmq_ok "exactly one alert fires: VhostmqDropsHigh for port a, reason no_destination, node e2e-node"
else
    vmq_fail "firing alerts $F, want $want"
fi
RULES=$(api rules | jq -c '[.data.groups[].rules[] | {name, health, state, lastError}]')
echo "$RULES" | jq -r '.[] | "  rule \(.name): health \(.health), state \(.state)\(if .lastError != "" then ", error " + .lastError else "" end)"'
if [[ $(jq -r 'length' <<<"$RULES") == 7 && $(jq -r '[.[] | select(.health == "ok")] | length' <<<"$RULES") == 7 ]]; then
    vmq_ok "all 7 rules evaluate against the real series (health ok)"
else
    vmq_fail "rules not all evaluated: $RULES"
fi
for m in vhostmq_queue_drops_total vhostmq_queue_stalls_total vhostmq_worker_healthy vhostmq_port_connected vhostmq_slots; do
    # over the last 30 s: one scrape missed on a loaded machine (1 s interval
    # and timeout) marks the target's series stale at that instant
    n=$(query "count(last_over_time($m{node=\"e2e-node\"}[30s]))" | jq -r '.[0].value[1] // 0')
    if ((n > 0)); then vmq_ok "$m: $n series with node=e2e-node"; else vmq_fail "$m: no series with node=e2e-node"; fi
done
ratio=$(query 'sum by (reason) (rate(vhostmq_queue_drops_total{port="a"}[1m])) / scalar(sum(rate(vhostmq_queue_packets_total{port="a"}[1m])))' |
    jq -r '[.[] | select((.value[1] | tonumber) > 0) | "\(.metric.reason) \(.value[1] | tonumber * 100 | floor)%"] | join(", ")')
vmq_log "port a's drops by reason over its frames (1 m): ${ratio:-none}"

vmq_stop "$PROM_PID"

# ------------------------------------------------------------------ shell completion
CTL=$VMQ_CTL API=$VMQ_API
[[ -x $CTL ]] || vmq_die "$CTL not found: run make build"
# two more ports, made through the API, for the completion to list
for p in vm-blue vm-green; do
    vmq_ctl port add "$p" --socket "$WORK/$p.sock" --role server \
        --label k8s.pod.namespace=prod --label "k8s.pod.name=virt-launcher-$p" >/dev/null ||
        vmq_die "vhostmqctl port add $p failed"
done
IDS=$(vmq_ctl -o json port list | jq -r '[.ports[].id] | sort | join(" ")')
mkdir -p "$WORK/completion/bin"
ln -sf "$CTL" "$WORK/completion/bin/vhostmqctl" # the scripts call the program by its name
CPATH=$WORK/completion/bin:$PATH
for sh in bash zsh fish; do "$CTL" completion "$sh" >"$WORK/completion/vhostmqctl.$sh"; done
# complete_bash WORD...: COMPREPLY of the function `complete -p vhostmqctl`
# names (cobra's script, with Debian's bash-completion loaded as in a login
# shell) for the command line WORD... (the last word is the one completed),
# one a line, descriptions cut off
complete_bash() {
    PATH=$CPATH bash --norc --noprofile -c '
        shopt -s extglob progcomp
        source /usr/share/bash-completion/bash_completion
        source "$0"
        spec=$(complete -p vhostmqctl) || exit 1
        fn=$(sed -E "s/.* -F ([^ ]+) .*/\1/" <<<"$spec")
        COMP_WORDS=("$@"); COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
        COMP_LINE="${COMP_WORDS[*]}"; COMP_POINT=${#COMP_LINE}; COMP_TYPE=9; COMP_KEY=9
        "$fn" vhostmqctl "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD - 1]}"
        printf "%s\n" "${COMPREPLY[@]}"' "$WORK/completion/vhostmqctl.bash" "$@" 2>>"$WORK/completion/bash.err" |
        awk '{ print $1 }' | sort | paste -sd' '
}
vmq_expect "bash completion (bash-completion $(dpkg-query -W -f='${Version}' bash-completion)): 'vhostmqctl --socket API port show <TAB>' lists the agent's ports (stderr $WORK/completion/bash.err)" \
    "$(complete_bash vhostmqctl --socket "$API" port show "")" "$IDS"
vmq_expect "bash completion: 'stats vm-blue vm-g<TAB>'" "$(complete_bash vhostmqctl --socket "$API" stats vm-blue vm-g)" vm-green
vmq_expect "bash completion: 'port list -o <TAB>'" "$(complete_bash vhostmqctl port list -o "")" "json table wide"
vmq_expect "bash completion: 'port <TAB>'" "$(complete_bash vhostmqctl port "")" "add bandwidth del list show"
got=$(PATH=$CPATH fish --no-config -c "source $WORK/completion/vhostmqctl.fish; complete -C 'vhostmqctl --socket $API port del '" 2>&1 |
    awk '{ print $1 }' | sort | paste -sd' ')
vmq_expect "fish completion ($(fish --version 2>&1 | awk '{ print $NF }')): 'vhostmqctl --socket API port del <TAB>'" "$got" "$IDS"
if zsh -n "$WORK/completion/vhostmqctl.zsh" &&
    PATH=$CPATH zsh -f -c "autoload -U compinit && compinit -u -d $WORK/completion/zcompdump && source $WORK/completion/vhostmqctl.zsh && whence -w _vhostmqctl" | grep -q function; then
    vmq_ok "zsh completion ($(zsh --version | awk '{ print $2 }')): the script parses, and defines _vhostmqctl under compinit"
else
    vmq_fail "zsh completion: $WORK/completion/vhostmqctl.zsh does not load"
fi
for p in vm-blue vm-green; do vmq_ctl port del "$p" >/dev/null || vmq_fail "vhostmqctl port del $p"; done

# ------------------------------------------------------------------ vhostmqctl top
TMUX_SOCK=$WORK/tmux.sock
tm() { tmux -S "$TMUX_SOCK" "$@"; }
screen() { tm capture-pane -p -t top 2>/dev/null || true; }
# top_line ERE: the first line of top's screen that matches ERE, else the
# screen's first two lines (what a failure shows)
top_line() {
    local s
    s=$(screen)
    grep -m1 -E -- "$1" <<<"$s" || head -n 2 <<<"$s"
}
# top_shows SECONDS WHAT ERE: asserts that top's screen gets a line matching ERE
top_shows() { VMQ_POLL_S=0.2 vmq_eventually "$1" "$2" "~$3" top_line "$3"; }
# top_rc: top's exit status, once it ended
top_rc() { cat "$WORK/top.rc" 2>/dev/null || echo "still running"; }
# top in a detached 160x30 session; its exit status goes to a file
start_top() {
    rm -f "$WORK/top.rc"
    tm new-session -d -s top -x 160 -y 30 \
        "$CTL --socket $WORK/api.sock top --interval 1s 2>$WORK/top.err; echo \$? >$WORK/top.rc; sleep 30"
}
start_top
top_shows 15 "top: port a with its rates and its drops by reason" '^a +- +yes +2 +[0-9.]+ [kM]?pps .*no_destination' &&
    screen | sed 's/^/    | /' | head -n 8
tm send-keys -t top u
if top_shows 5 "top: u shows the queues view" 'view: queues'; then
    rows=$(screen | grep -cE '^a +[01] +[^ ]+ +[0-9]+ +[0-9.]+ [kM]?pps' || true)
    vmq_expect "top: port a's queue pairs in the queues view, with their CPUs and rates" "$rows" 2
fi
tm send-keys -t top s
top_shows 5 "top: s sorts by the next column" 'sort: RX PPS, largest first' &&
    top_shows 1 "top: the sort column is marked with *" 'RX PPS\*'
tm send-keys -t top w
top_shows 5 "top: w shows the workers view" 'view: workers' &&
    top_shows 1 "top: the workers view's columns" '^CPU +NUMA +PAIRS +BUSY +UPLINK'
tm send-keys -t top q
vmq_eventually 5 "top: q ends it, status 0" 0 top_rc || true
tm kill-server 2>/dev/null || true
# a server of its own: a new session on the socket of the one just killed
# can meet it still exiting ("server exited unexpectedly")
TMUX_SOCK=$WORK/tmux-2.sock
start_top
top_shows 15 "top started again" '^a ' || true
vmq_stop "$FE_PID"
vmq_backend_stop
if VMQ_POLL_S=0.3 vmq_eventually 15 "top: the dataplane stopped, it ends by itself, status 3" 3 top_rc; then
    vmq_expect "top: its error names the agent's socket" "$(head -c 200 "$WORK/top.err")" "~$WORK/api.sock"
fi
tm kill-server 2>/dev/null || true

echo
echo "===== vhostmq e2e-observe ($(vmq_elapsed "$T0") s): Prometheus $(prometheus --version 2>&1 | awk 'NR == 1 { print $3 }'), firing $F; vhostmqctl top in tmux ====="
echo "work dir: $WORK"
vmq_verdict e2e-observe
