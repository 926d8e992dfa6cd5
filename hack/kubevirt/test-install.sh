#!/usr/bin/env bash
# The install guide (docs/user/install.md) followed word for word on the
# KubeVirt test bed (testbed.sh up), as a platform engineer walks it, and
# then the uninstall guide's steps 1-2 (docs/user/uninstall.md).
#
# The guide's shell blocks (sections 1-6) run as they are written, in one
# bash (set -euo pipefail, every command echoed) inside the first node's
# network namespace, with kubectl, helm, virtctl and `docker` on PATH:
#   * `docker` is podman (as Debian's podman-docker makes it), pinned as the
#     tests pin it; `docker build` is given the local golang:1.26 base and
#     the host's Go caches (no registry but ours is reachable);
#   * the registry is Debian's docker-registry (distribution 2.8), started
#     here at 192.0.2.1:5000 in the node's netns; every node's containerd
#     pulls from it over HTTP (hosts.toml, hack/cluster/cluster.sh);
#   * the guide's VM image, quay.io/containerdisks/debian:12, cannot be
#     pulled here: cloud-image.sh builds a Debian 12 cloud image from
#     Debian's packages (cloud-init, default user debian), made into a
#     containerDisk with KubeVirt's documented Containerfile and pushed to
#     the registry;
#   * Multus: the test bed's multus-lite, a stand-in (Multus is not served
#     by the module proxy).
# Placeholders the guide asks the reader to fill are filled, each found
# exactly once or the test fails (so the guide cannot drift from this):
# REPO (the registry), NODE, VM_IMAGE, dataplane.cpus (this machine has CPUs
# 0-1), <vm-b's address> (from vm-b's network-status); the values file
# also gets the test bed's CNI folders (paths.cniBinDir/cniConfDir: not
# /opt/cni/bin and /etc/cni/net.d here).  The block marked
# "<!-- install-test: in the guest vm-a -->" runs on vm-a's serial console
# through `virtctl console` (expect logs in as debian/vhostmq), and
# `kubectl exec -it ... vhostmqctl top` runs on a pseudo-terminal for a few
# seconds, then q.
#
# Checks: the guide's commands all succeed; the guest reports status: done
# from cloud-init, the IPAM address of vm-a's network-status on its NIC, two
# rx and two tx queues, and 3 of 3 pings to vm-b answered; the node's agent
# shows both VMs' ports connected, 2 queue pairs each, both enabled by the
# guest; top's table lists both, connected; after the uninstall steps: no
# VM, no release, the namespace gone and the binding out of the KubeVirt CR.
# KubeVirt v1.7.0 deletes a VM's domain while it starts when the start
# takes virt-handler longer than its fixed 20 s SyncVMI timeout (kubevirt
# issue 17367, fixed by PR 18545 after v1.7.0): the domain stays Shutoff in
# virt-handler's view, the retry takes it for an inactive domain, signals
# its deletion and unmounts the container disk (the launcher's volumeroot
# exits 0); the VMI is neither deleted nor failed, so the VM is never
# started again.  Two Debian guests started at once under TCG on two CPUs
# cross that line about every other run.  While the guide runs, a watcher
# looks for exactly that (a "Signaled Deletion" event of the VMI's own UID
# while the VMI has no deletionTimestamp) and deletes that VMI once, so
# that the VM controller starts the VM again, as troubleshooting.md tells
# a reader to; each such restart is printed, and a second one of the same
# VM is left to fail the guide.
# Ends with the failures and "N passed, N failed" (vmq_fails_report).
# Logs: $VMQC_LOGS/kubevirt-test-install/ (the script as run, its output,
# the console, the registry's log).
#
# Usage: hack/kubevirt/test-install.sh
#   The test bed must be up (testbed.sh up, or test.sh --keep) without a
#   vhostmq release (test-vm.sh uninstalls its own at its end).
# Environment: VHOSTMQ_INSTALL_GUEST_TIMEOUT=900 (s from the VMs' Ready to
#   the guest checks done: a Debian boot with cloud-init under TCG)
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$HERE/lib.sh"
VMQ_TAG=test-install

vmq_args -- "$@"
vmq_need_root
GUIDE=$VMQ_REPO_ROOT/docs/user/install.md
UNGUIDE=$VMQ_REPO_ROOT/docs/user/uninstall.md
OUT=$VMQC_LOGS/kubevirt-test-install
HELM=${VHOSTMQ_TOOLS:-/var/cache/vhostmq/tools}/helm-v3.22.0
TOOLS=${VHOSTMQ_TOOLS:-/var/cache/vhostmq/tools}
GUEST_TIMEOUT=${VHOSTMQ_INSTALL_GUEST_TIMEOUT:-900}
VM_IMAGE=$VMQC_REGISTRY/containerdisks/debian:12
work=$(mktemp -d /tmp/vhostmq-install.XXXXXX)
reg_pid="" watcher_pid=""
k() { vmqc_kubectl "$@"; }

cleanup() {
    local rc=$?
    set +e
    [[ -n $watcher_pid ]] && kill "$watcher_pid" 2>/dev/null
    # whatever the guide made, if it stopped half way
    k delete vm vm-a vm-b --ignore-not-found --wait=true --timeout 120s >/dev/null 2>&1
    if vmqc_in_ns "$HELM" --kubeconfig "$VMQC_KUBECONFIG" -n vhostmq-system status vhostmq >/dev/null 2>&1; then
        vmqc_in_ns "$HELM" --kubeconfig "$VMQC_KUBECONFIG" -n vhostmq-system uninstall vhostmq --wait --timeout 3m >/dev/null 2>&1
    fi
    k delete namespace vhostmq-system --ignore-not-found --wait=true --timeout 120s >/dev/null 2>&1
    [[ -n $reg_pid ]] && vmq_stop "$reg_pid"
    vmq_podman rmi -f "$VM_IMAGE" >/dev/null 2>&1
    vmq_podman images --format '{{.Repository}}:{{.Tag}}' | grep "^$VMQC_REGISTRY/" |
        while read -r i; do vmq_podman rmi -f "$i" >/dev/null 2>&1; done
    rm -rf "$work"
    exit "$rc"
}
trap cleanup EXIT

# ------------------------------------------------------------------ preconditions
vmqc_is_up || vmq_die "the test bed is not up (hack/kubevirt/testbed.sh up)"
k get kubevirt -n kubevirt kubevirt >/dev/null || vmq_die "no KubeVirt CR: is the test bed up?"
# Available again after whatever changed its CR last (test-vm.sh's uninstall
# takes the binding out)
k -n kubevirt wait kv/kubevirt --for condition=Available --timeout 300s >/dev/null ||
    vmq_die "KubeVirt is not Available: $(k -n kubevirt get kv kubevirt -o jsonpath='{.status.conditions}' 2>&1)"
! k get namespace vhostmq-system >/dev/null 2>&1 || vmq_die "namespace vhostmq-system exists: a vhostmq release is installed (helm -n vhostmq-system uninstall vhostmq)"
grep -q "config_path = \"$VMQC_REGISTRY_HOSTS\"" "$VMQC_DATA/containerd.toml" ||
    vmq_die "the cluster's containerd has no registry config_path: it was started by an older cluster.sh; take it down and up again"
[[ -x $HELM ]] || "$VMQ_REPO_ROOT/hack/manifests.sh" >/dev/null # builds and caches helm
[[ -x $VMKV_BIN/virtctl ]] || "$HERE/build.sh"
# Multus' CRD (the prerequisites: Multus installs it; here multus-lite
# stands in for Multus, and the CRD is the stand-in's part)
k apply -f "$VMQ_REPO_ROOT/hack/cluster/manifests/nad-crd.yaml" >/dev/null
k wait --for=condition=Established crd/network-attachment-definitions.k8s.cni.cncf.io --timeout 30s >/dev/null
vmkv_host_tools expect:expect
command -v podman >/dev/null || vmq_die "podman is missing (hack/install-deps.sh installs it)"
# the registry: Debian's docker-registry binary, unpacked, not installed (the
# package would start a registry on the host's :5000)
REGISTRY_BIN=$TOOLS/docker-registry-$(apt-cache policy docker-registry | sed -n 's/^ *Candidate: //p')
if [[ ! -x $REGISTRY_BIN ]]; then
    chmod 0711 "$work" && mkdir -m 0777 "$work/deb" # apt's sandbox user writes the download
    (cd "$work/deb" && timeout 300 apt-get download -q docker-registry >/dev/null) || vmq_die "apt-get download docker-registry failed"
    dpkg-deb -x "$work"/deb/docker-registry_*.deb "$work/reg"
    mkdir -p "$TOOLS"
    install -m 0755 "$work/reg/usr/bin/docker-registry" "$REGISTRY_BIN"
fi
"$HERE/cloud-image.sh"
rm -rf "$OUT"
mkdir -p "$OUT"
T0=$(vmq_now)

# ------------------------------------------------------------------ the registry
mkdir -p "$work/registry"
cat >"$work/registry.yml" <<EOF
version: 0.1
log: {level: info, accesslog: {disabled: true}}
storage: {filesystem: {rootdirectory: $work/registry}, delete: {enabled: true}}
http: {addr: "$VMQC_REGISTRY"}
EOF
setsid nsenter --net="/run/netns/$VMQC_NETNS" -- "$REGISTRY_BIN" serve "$work/registry.yml" >"$OUT/registry.log" 2>&1 </dev/null &
reg_pid=$!
for _ in $(seq 100); do vmqc_in_ns curl -fsS "http://$VMQC_REGISTRY/v2/" >/dev/null 2>&1 && break; sleep 0.1; done
vmqc_in_ns curl -fsS "http://$VMQC_REGISTRY/v2/" >/dev/null || vmq_die "the registry did not answer (log $OUT/registry.log)"
vmq_log "registry $REGISTRY_BIN at http://$VMQC_REGISTRY (pid $reg_pid)"

# ------------------------------------------------------------------ the reader's checkout
# (the guide runs in a checkout: a copy of this one's files, .git linked for
# `git rev-parse`, so what it writes stays out of this tree)
CO=$work/checkout
mkdir -p "$CO"
(cd "$VMQ_REPO_ROOT" && git ls-files -co --exclude-standard -z | tar --null -T - -cf - | tar -C "$CO" -xf -)
ln -s "$VMQ_REPO_ROOT/.git" "$CO/.git"
# the Dockerfile's `go mod download` runs where no network is: fill the
# host's module cache (lent to the build) first
(cd "$CO" && timeout 600 go mod download) || vmq_die "go mod download failed"

# ------------------------------------------------------------------ the tools on PATH
mkdir -p "$work/bin"
vmq_golang_base "$work/base"
cat >"$work/bin/docker" <<EOF
#!/usr/bin/env bash
# docker for the guide's commands: podman with this machine's pins; builds
# get the local golang:1.26 base and the host's Go caches; our registry
# speaks HTTP
case \${1:-} in
    build) shift; exec podman --runtime $VMQ_OCI_RUNTIME --cgroup-manager cgroupfs --events-backend file build --pull=never --network host ${VMQ_GOLANG_LEND[*]} "\$@" ;;
    push) shift; exec podman --runtime $VMQ_OCI_RUNTIME --cgroup-manager cgroupfs --events-backend file push --tls-verify=false "\$@" ;;
    *) exec podman --runtime $VMQ_OCI_RUNTIME --cgroup-manager cgroupfs --events-backend file "\$@" ;;
esac
EOF
ln -s "$VMQC_BIN/kubectl" "$work/bin/kubectl"
ln -s "$HELM" "$work/bin/helm"
ln -s "$VMKV_BIN/virtctl" "$work/bin/virtctl"
chmod +x "$work/bin/docker"

# the VM image: the cloud image as a containerDisk (KubeVirt's Containerfile)
cp "$VMKV_IMAGES/debian-12-cloud.qcow2" "$VMKV_IMAGES/Containerfile.debian-12-cloud" "$work/"
vmqc_in_ns env PATH="$work/bin:$PATH" bash -c "docker build -q -f '$work/Containerfile.debian-12-cloud' -t '$VM_IMAGE' '$work' && docker push -q '$VM_IMAGE'" \
    >"$OUT/vm-image.log" 2>&1 || { tail -n 20 "$OUT/vm-image.log"; vmq_die "building or pushing $VM_IMAGE failed"; }
rm -f "$work/debian-12-cloud.qcow2"
vmq_log "pushed $VM_IMAGE"

# ------------------------------------------------------------------ the guide as a script
# blocks: sh (the reader's shell), yaml with a "# FILE" first line (a file
# the reader writes), sh after "<!-- install-test: in the guest VM -->" (typed
# on VM's console); sections "## 1." to "## 6." of install.md
"$VMQ_PY" - "$GUIDE" "$work/guide.sh" "$work" <<'PY' || vmq_die "could not read the guide's blocks"
import re, sys, shlex
guide, out, work = sys.argv[1:]
text = open(guide).read()
start = text.index("\n## 1.")
end = text.index("\n## Next")
body = text[start:end]
parts, guest = [], None
for m in re.finditer(r"(<!-- install-test: in the guest (\S+) -->\n)?```(sh|yaml)\n(.*?)```", body, re.S):
    vm, lang, code = m.group(2), m.group(3), m.group(4)
    if lang == "yaml":
        name = re.match(r"# (\S+\.yaml)\n", code)
        if not name:
            sys.exit("a yaml block without '# FILE.yaml' on its first line: " + code[:60])
        parts.append("cat >%s <<'YAML'\n%sYAML\n" % (name.group(1), code))
    elif vm:
        # typed without the comments (their words would be taken for output)
        code = "".join(re.sub(r"\s+#.*", "", l) + "\n" for l in code.splitlines())
        parts.append("guest_run %s <<'GUEST'\n%sGUEST\n" % (vm, code))
    else:
        parts.append(code)
open(out, "w").write("\n".join(parts))
PY
# fill PLACEHOLDER-LINE REGEX REPLACEMENT: exactly one match in the script
fill() {
    local n
    n=$(grep -c -E -- "$1" "$work/guide.sh" || true)
    [[ $n == 1 ]] || vmq_die "the guide has $n lines matching /$1/, expected 1: the guide and this test disagree"
    local d=$'\x01' # a delimiter neither side holds (the values hold # and /)
    sed -i -E "s$d$1$d$2$d" "$work/guide.sh"
}
fill '^REPO=registry\.example\.com/vhostmq( .*)?$' "REPO=$VMQC_REGISTRY/vhostmq"
fill '^NODE=<a node name>$' "NODE=$VMQC_NODE"
fill '^VM_IMAGE=quay\.io/containerdisks/debian:12( .*)?$' "VM_IMAGE=$VM_IMAGE"
fill '^(  cpus: )\[2, 3\]( .*)?$' '\1[0, 1]\2'
fill '^(kubevirt:)$' "paths: {cniBinDir: $VMQC_RUN/cni/bin, cniConfDir: $VMQC_RUN/cni/net.d}  # the test bed's CNI folders\n\\1"
fill "^ping -c 3 <vm-b's address>$" 'ping -c 3 @VM_B_ADDRESS@'
fill '^(kubectl .* exec) -it (.*vhostmqctl top)$' '\1 -it \2 | tee top.out'

# the prelude: guest_run (the console) and a terminal for exec -it
cat >"$work/prelude.sh" <<EOF
set -euo pipefail
cd "$CO"
# guest_run VM < COMMANDS: log in on VM's serial console and type each line
guest_run() {
    local vm=\$1 addr
    addr=\$(kubectl get pod -l vm.kubevirt.io/name=vm-b -o jsonpath='{.items[0].metadata.annotations.k8s\.v1\.cni\.cncf\.io/network-status}' |
        jq -r '[.[] | select(.name == "vhostmq-system/vhu-net") | .ips[0]][0]')
    sed "s#@VM_B_ADDRESS@#\$addr#" >"$work/guest-\$vm.cmds"
    expect -f "$work/console.exp" "\$vm" "$work/guest-\$vm.cmds" "$OUT/console-\$vm.log" $GUEST_TIMEOUT
}
# kubectl exec -it: a pseudo-terminal for a few seconds, then q
kubectl() {
    if [[ " \$* " == *" exec -it "* ]]; then
        (sleep 6; printf q) | script -qfec "\$(printf '%q ' command kubectl "\$@")" /dev/null
    else
        command kubectl "\$@"
    fi
}
set -x
EOF
cat >"$work/console.exp" <<'EOF'
# console.exp VM COMMANDS LOG TIMEOUT: log in as debian/vhostmq on VM's
# serial console (again until cloud-init has set the password; the kernel's
# and cloud-init's messages come in between: no pattern is anchored at the
# end; getty's prompt is "HOSTNAME login: ", unlike "Last login: ..."),
# type each line of COMMANDS, each followed by its exit status, then log out
lassign $argv vm cmds log total
set deadline [expr {[clock seconds] + $total}]
log_file -noappend $log
set timeout 15
spawn virtctl console $vm
set prompt {debian@[^ ]*:~\$ }
set in 0
send "\r"
while {!$in && [clock seconds] < $deadline} {
    expect {
        -re $prompt { set in 1 }
        -re "(^|\n)$vm login: " { send "debian\r" }
        "Password:" { send "vhostmq\r" }
        "Login incorrect" { sleep 5 }
        timeout { send "\r" }
        eof { puts "\nCONSOLE-EOF"; exit 3 }
    }
}
if {!$in} { puts "\nLOGIN-TIMEOUT"; exit 2 }
set f [open $cmds]
while {[gets $f line] >= 0} {
    if {[string trim $line] eq ""} continue
    set timeout [expr {max(10, $deadline - [clock seconds])}]
    send "$line\r"
    expect -re $prompt
    send "echo CMD-STATUS=\$?\r"
    expect -re $prompt
}
close $f
set timeout 30
send "exit\r"
expect -re "(^|\n)$vm login: "
send "\x1d"
expect eof
EOF
cat "$work/prelude.sh" "$work/guide.sh" >"$OUT/guide.sh"
vmq_log "running the guide: $(grep -c . "$work/guide.sh") lines ($OUT/guide.sh, output in $OUT/guide.log)"

# ------------------------------------------------------------------ run it
# restart_prematurely_deleted: the watcher (see the top): each VMI of the
# guide's VMs whose own UID got a "Signaled Deletion" event while it has no
# deletionTimestamp is deleted once per VM; lines "VM UID" in $work/restarts
restart_prematurely_deleted() {
    local vm uid n
    while sleep 5; do
        for vm in vm-a vm-b; do
            grep -q "^$vm " "$work/restarts" 2>/dev/null && continue
            uid=$(k get vmi "$vm" -o json 2>/dev/null | jq -r 'select(.metadata.deletionTimestamp == null) | .metadata.uid' 2>/dev/null) || continue
            [[ -n $uid ]] || continue
            n=$(k get events -o json --field-selector "involvedObject.kind=VirtualMachineInstance,involvedObject.name=$vm,reason=Deleted" 2>/dev/null |
                jq --arg uid "$uid" '[.items[] | select(.involvedObject.uid == $uid and .message == "Signaled Deletion")] | length' 2>/dev/null) || continue
            ((${n:-0} > 0)) || continue
            echo "$vm $uid" >>"$work/restarts"
            vmq_log "KubeVirt signalled the deletion of $vm's domain (VMI $uid) while nobody deleted the VMI: its premature deletion of a slow start (kubevirt#17367); deleting the VMI so that the VM starts again"
            k delete vmi "$vm" --wait=false >/dev/null 2>&1 || vmq_log "deleting VMI $vm failed"
        done
    done
}
restart_prematurely_deleted &
watcher_pid=$!
t=$(vmq_now)
guide_ok() {
    (vmqc_in_ns env PATH="$work/bin:$PATH" KUBECONFIG="$VMQC_KUBECONFIG" \
        HELM_CACHE_HOME="$work/helm/cache" HELM_CONFIG_HOME="$work/helm/config" HELM_DATA_HOME="$work/helm/data" \
        KUBECACHEDIR="$work/kube-cache" timeout 3600 bash "$OUT/guide.sh") >"$OUT/guide.log" 2>&1
}
guide_rc=0
guide_ok || guide_rc=$?
kill "$watcher_pid" 2>/dev/null
wait "$watcher_pid" 2>/dev/null || true
watcher_pid=""
if [[ -s $work/restarts ]]; then
    vmq_log "VMs started again after KubeVirt's premature deletion of their domain (kubevirt#17367): $(awk '{ printf "%s%s (VMI %s)", NR > 1 ? ", " : "", $1, $2 }' "$work/restarts")"
    cp "$work/restarts" "$OUT/restarts"
fi
if ((guide_rc == 0)); then
    vmq_ok "every command of install.md sections 1-6 succeeded ($(vmqc_secs "$t") s)"
else
    vmq_fail "install.md sections 1-6: a command failed after $(vmqc_secs "$t") s (last lines below, log $OUT/guide.log)"
    tail -n 30 "$OUT/guide.log" | sed 's/^/    /'
    # what kept a VM from Ready: its launcher pod's unready containers,
    # how they ended and their last words (a containerDisk container that
    # exited once left vm-a NotReady for 15 min)
    k get pods -l kubevirt.io=virt-launcher -o json 2>/dev/null | jq -r '.items[] | .metadata.name as $p
        | .status.containerStatuses[]? | select(.ready | not) | "\($p) \(.name) \(.state | keys[0]) \(.state.terminated.exitCode // "-")"' 2>/dev/null |
        while read -r pod ctr state code; do
            vmq_log "not ready: $pod container $ctr ($state, exit $code); its last lines:"
            k logs "$pod" -c "$ctr" --tail=3 2>&1 | sed 's/^/    /' || true
        done || true
fi

# ------------------------------------------------------------------ what the reader sees
console=""
# without carriage returns and terminal escapes (bash's bracketed paste
# wraps every prompt and output in them)
[[ ! -f $OUT/console-vm-a.log ]] || console=$(tr -d '\r' <"$OUT/console-vm-a.log" | sed 's/\x1b\[[0-9;?]*[A-Za-z]//g')
addr_of() { k get pod -l "vm.kubevirt.io/name=$1" -o jsonpath='{.items[0].metadata.annotations.k8s\.v1\.cni\.cncf\.io/network-status}' |
    jq -r '[.[] | select(.name == "vhostmq-system/vhu-net") | .ips[0]][0]'; }
A=$(addr_of vm-a 2>/dev/null || true) B=$(addr_of vm-b 2>/dev/null || true)
statuses=$(grep -o -E '^CMD-STATUS=[0-9]+' <<<"$console" | paste -sd' ' || true)
vmq_expect "the exit statuses of the guide's 4 guest commands" "$statuses" "CMD-STATUS=0 CMD-STATUS=0 CMD-STATUS=0 CMD-STATUS=0"
vmq_expect "cloud-init in vm-a" "$(grep -m1 -o 'status: [a-z]*' <<<"$console" || true)" "status: done"
nic=""
[[ -z $A ]] || nic=$(grep -E "[[:space:]]$A/" <<<"$console" | head -n1 | awk '{ print $1 }' || true)
vmq_expect "vm-a's NIC holding its IPAM address ${A:-(none in network-status)}, by DHCP from the dataplane" "$nic" "~^[a-z]"
queues=$(grep -o -E '\b(rx|tx)-[0-9]+\b' <<<"$console" | sort -u | paste -sd' ' || true)
vmq_expect "the queues of vm-a's NIC" "$queues" "rx-0 rx-1 tx-0 tx-1"
ping=$(grep -m1 -E 'packets transmitted' <<<"$console" || true)
vmq_expect "vm-a pings vm-b (${B:-?})" "$ping" "~^3 packets transmitted, 3 received"
# top's table on the terminal: the two launcher pods' ports, connected
cp "$CO/top.out" "$OUT/top.out" 2>/dev/null || true
top_rows=$(grep -o -E 'default/virt-launcher-vm-[ab]-[a-z0-9]+ +yes' "$OUT/top.out" 2>/dev/null |
    awk '{ print $1 }' | sed -E 's/-[a-z0-9]+$//' | sort -u | paste -sd' ' || true)
vmq_expect "the VMs' ports in the table vhostmqctl top drew, connected" "$top_rows" "default/virt-launcher-vm-a default/virt-launcher-vm-b"

# the agent's view of the two ports, on the VMs' node
node_pod=$(k -n vhostmq-system get pod -l app.kubernetes.io/instance=vhostmq,app.kubernetes.io/component=node \
    --field-selector "spec.nodeName=$VMQC_NODE" -o name 2>/dev/null | head -n1 || true)
ports=$(k -n vhostmq-system exec "${node_pod:-none}" -c dataplane -- vhostmqctl -o json port list 2>/dev/null |
    jq -r '[.ports[]? | select(.status.connected) | "\(.queue_pairs)/\(.status.enabled_pairs)"] | sort | join(",")' 2>/dev/null || true)
vmq_expect "the node's agent: the connected ports' queue pairs/pairs the guest enabled" "$ports" "2/2,2/2"

# ------------------------------------------------------------------ uninstall.md 1-2
"$VMQ_PY" - "$UNGUIDE" "$work/uninstall.sh" <<'PY' || vmq_die "could not read the uninstall guide's blocks"
import re, sys
guide, out = sys.argv[1:]
text = open(guide).read()
body = text[text.index("\n## 1."):text.index("\n## 3.")]
open(out, "w").write("set -euxo pipefail\n" + "\n".join(re.findall(r"```sh\n(.*?)```", body, re.S)))
PY
sed -i -E 's#^kubectl -n <namespace> delete vm <name>( .*)?$#kubectl -n default delete vm vm-a vm-b --wait#' "$work/uninstall.sh"
grep -q 'delete vm vm-a vm-b' "$work/uninstall.sh" || vmq_die "uninstall.md's 'delete vm <name>' line is not where this test expects it"
cp "$work/uninstall.sh" "$OUT/uninstall.sh"
t=$(vmq_now)
if vmqc_in_ns env PATH="$work/bin:$PATH" KUBECONFIG="$VMQC_KUBECONFIG" HELM_CACHE_HOME="$work/helm/cache" \
    HELM_CONFIG_HOME="$work/helm/config" HELM_DATA_HOME="$work/helm/data" KUBECACHEDIR="$work/kube-cache" \
    timeout 900 bash "$work/uninstall.sh" >"$OUT/uninstall.log" 2>&1; then
    vmq_ok "every command of uninstall.md sections 1-2 succeeded ($(vmqc_secs "$t") s)"
else
    vmq_fail "uninstall.md sections 1-2: a command failed (last lines below, log $OUT/uninstall.log)"
    tail -n 20 "$OUT/uninstall.log" | sed 's/^/    /'
fi
left=$(k get vm -A -o name 2>/dev/null | grep -c . || true)
vmq_expect "VMs left" "$left" 0
ns=$(k get namespace vhostmq-system -o name 2>/dev/null || true)
vmq_expect "namespace vhostmq-system after the uninstall" "$ns" ""
binding=$(k get kubevirt -n kubevirt kubevirt -o jsonpath='{.spec.configuration.network.binding.vhostmq}' 2>/dev/null || true)
vmq_expect "the vhostmq binding in the KubeVirt CR" "$binding" ""

vmq_log "install guide: $(vmqc_secs "$T0") s in all"
vmq_fails_report
