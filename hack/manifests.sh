#!/usr/bin/env bash
# Lints the Helm chart and renders deploy/vhostmq.yaml from it (the plain
# manifests are never edited by hand). helm is built from the Go module
# proxy once per machine into VHOSTMQ_TOOLS (default /var/cache/vhostmq/tools).
#
# Usage: hack/manifests.sh [--check]
#   --check   fail if deploy/vhostmq.yaml differs from a fresh render, and
#             run the chart's exposure tests (go test ./charts/: metrics
#             bind and auth, RBAC of the CNI's token, the webhook's scope
#             and PodDisruptionBudget); what `make verify` runs
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$HERE/lib.sh"
VMQ_TAG=manifests
cd "$HERE/.."

HELM_VERSION=v3.22.0
KUBE_VERSION=1.37.2
TOOLS=${VHOSTMQ_TOOLS:-/var/cache/vhostmq/tools}
check=0
vmq_args --check:check=1 -- "$@"

helm=$TOOLS/helm-$HELM_VERSION
if [[ ! -x $helm ]]; then
    vmq_log "building helm $HELM_VERSION from the Go module proxy (a few minutes, once per machine)"
    mkdir -p "$TOOLS"
    tmp=$(mktemp -d)
    GOFLAGS='' GOBIN=$tmp go install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
    mv "$tmp/helm" "$helm"
    rmdir "$tmp"
fi

# the defaults, every optional part switched on, each uplink
for set in "" "kubevirt.registerBinding=true,metrics.enabled=true,metrics.serviceMonitor.enabled=true,webhook.certManager.enabled=true,dra.enabled=true" \
    "devicePlugin.enabled=false,dra.enabled=true,webhook.enabled=false" \
    "uplink.mode=tap,uplink.tap.attach=br0,networkAttachmentDefinition.uplink=tap,networkAttachmentDefinition.vlan=10" \
    "uplink.mode=af_xdp,uplink.af_xdp.interface=eth1,networkAttachmentDefinition.uplink=af_xdp" \
    "dra.enabled=true,dra.devices=numa" "dataplane.requireSealedMemory=true" \
    "metrics.enabled=true,metrics.auth=kubernetes,metrics.serviceMonitor.enabled=true,metrics.readers[0].kind=ServiceAccount,metrics.readers[0].name=prometheus,metrics.readers[0].namespace=monitoring" \
    "uplink.mode=tap,networkAttachmentDefinition.uplink=tap,metrics.enabled=true,metrics.bind=podIP,metrics.auth=tls,metrics.tls.secretName=m,metrics.tls.clientCASecretName=ca,metrics.podMonitor.enabled=true" \
    "namespace.create=true,webhook.replicas=1,webhook.networkNames={dpdk-net}"; do
    args=(lint --strict charts/vhostmq --kube-version "$KUBE_VERSION" ${set:+--set "$set"})
    "$helm" "${args[@]}" >/dev/null || { "$helm" "${args[@]}"; vmq_die "helm lint ${set:+--set $set }failed"; }
done
# values that cannot work are refused, naming the value
while IFS='|' read -r set want; do
    if out=$("$helm" template x charts/vhostmq --kube-version "$KUBE_VERSION" --set "$set" 2>&1 >/dev/null); then
        vmq_die "helm template --set $set: rendered, want it refused naming $want"
    fi
    grep -qF "$want" <<<"$out" || vmq_die "helm template --set $set: refused without naming $want: $out"
done <<'EOF'
uplink.mode=af_xdp|uplink.af_xdp.interface
uplink.mode=bogus|/uplink/mode
networkAttachmentDefinition.uplink=tap|networkAttachmentDefinition.uplink
uplink.mode=tap,networkAttachmentDefinition.uplink=af_xdp|networkAttachmentDefinition.uplink
networkAttachmentDefinition.vlan=5|networkAttachmentDefinition.vlan
networkAttachmentDefinition.vlan=5000|/networkAttachmentDefinition/vlan
uplink.mode=tap,networkAttachmentDefinition.uplink=tap,networkAttachmentDefinition.mtu=9000|networkAttachmentDefinition.mtu
uplink.mode=af_xdp,uplink.af_xdp.interface=eth1,networkAttachmentDefinition.uplink=af_xdp,networkAttachmentDefinition.mtu=9000|networkAttachmentDefinition.mtu
uplink.tap.name=this-name-is-too-long|/uplink/tap/name
devicePlugin.enabled=false,webhook.enabled=false|devicePlugin.enabled, dra.enabled
devicePlugin.enabled=false,dra.enabled=true|webhook.enabled
dra.enabled=true,dra.deviceClass=Bad_Name|/dra/deviceClass
dra.enabled=true,dra.devices=any|/dra/devices
EOF
# consumable capacity (dra.devices=numa) needs Kubernetes 1.36
if out=$("$helm" template x charts/vhostmq --kube-version 1.35.0 --set dra.enabled=true,dra.devices=numa 2>&1 >/dev/null) ||
    ! grep -qF "dra.devices: numa needs Kubernetes 1.36" <<<"$out"; then
    vmq_die "helm template --kube-version 1.35.0 --set dra.enabled=true,dra.devices=numa: want it refused naming dra.devices: $out"
fi

# The plain manifests take their webhook certificate from cert-manager: a
# chart-generated one would change on every render.
render() {
    {
        echo "# Rendered from charts/vhostmq by hack/manifests.sh (make manifests); do not edit."
        echo "# Needs cert-manager for the webhook certificate and Multus' NetworkAttachmentDefinition CRD."
        echo "# Install: kubectl apply -f deploy/vhostmq.yaml (it makes the namespace vhostmq-system, Pod Security privileged)"
        "$helm" template vhostmq charts/vhostmq --namespace vhostmq-system --kube-version "$KUBE_VERSION" \
            --set webhook.certManager.enabled=true --set namespace.create=true
    }
}
if ((check)); then
    if ! diff -u deploy/vhostmq.yaml <(render) >/dev/null; then
        vmq_die "deploy/vhostmq.yaml is stale: run make manifests and commit the result"
    fi
    VHOSTMQ_HELM=$helm go test -count=1 ./charts/ >/dev/null || {
        VHOSTMQ_HELM=$helm go test -count=1 ./charts/
        vmq_die "the chart's exposure tests failed (go test ./charts/)"
    }
    vmq_log "helm lint ok; deploy/vhostmq.yaml matches the chart; go test ./charts/ ok"
else
    render >deploy/vhostmq.yaml
    vmq_log "helm lint ok; wrote deploy/vhostmq.yaml"
fi
