package cni

import (
	"encoding/json"
	"fmt"

	"github.com/containernetworking/cni/pkg/types"

	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
	"github.com/vhostmq/vhostmq/internal/bandwidth"
)

// A port's rate limits come from one of two places, the first present:
//
//  1. runtimeConfig.bandwidth, the CNI bandwidth capability: the runtime
//     passes it to a configuration that declares "capabilities":
//     {"bandwidth": true}. containerd and CRI-O fill it from the pod's
//     kubernetes.io/ingress-bandwidth and egress-bandwidth annotations,
//     with a burst of their own (containerd 2^32-1 bits, toCNIBandWidth in
//     internal/cri/server/sandbox_run.go; CRI-O 2^35-1): the dataplane caps
//     a burst at 2^30 bits and the agent logs it.
//
//     Under Multus (v4, checked at 95a0932) it reaches a secondary
//     network's delegate when both configurations declare the capability:
//     the runtime passes it to Multus when Multus' own configuration does,
//     which the thick daemon and the thin entrypoint copy from the
//     cluster network's (pkg/server/config/generator.go,
//     cmd/thin_entrypoint/main.go). Multus starts every delegate's runtime
//     config from its own, secondary networks included, and replaces the
//     bandwidth with the "bandwidth" of the network's entry in
//     k8s.v1.cni.cncf.io/networks when it has one (mergeCNIRuntimeConfig,
//     newCNIRuntimeConf: pkg/types/conf.go, called for every delegate from
//     CmdAdd in pkg/multus/multus.go); libcni hands it to the delegate
//     only if the NAD's configuration declares the capability. The thick
//     shim forwards the runtime's stdin to the daemon
//     (pkg/server/api/shim.go), so thin and thick Multus do the same.
//
//     It wins over the annotations: it is what the runtime read from
//     them, or the network's own entry.
//  2. the pod's kubernetes.io/ingress-bandwidth and egress-bandwidth,
//     read here through the API server like the vhostmq.io/ annotations,
//     with the default burst (10 ms of the rate): what works when the
//     runtime passes nothing (Multus' configuration or the NAD without the
//     capability, a runtime that reads no annotations).
//
// Each is checked before anything is made: a bad value is a CNI error
// naming the field or the annotation, and no port is created.

// BandwidthEntry is the bandwidth capability's argument, as
// containernetworking/plugins' bandwidth plugin reads it
// (plugins/meta/bandwidth/main.go, which is package main: repeated
// here): rates in bits per second, bursts in bits, 0 for none. Unlike
// that plugin, a rate may come without a burst (the dataplane's default
// burst then).
type BandwidthEntry struct {
	IngressRate  uint64 `json:"ingressRate"`
	IngressBurst uint64 `json:"ingressBurst"`
	EgressRate   uint64 `json:"egressRate"`
	EgressBurst  uint64 `json:"egressBurst"`
}

// parseRuntimeBandwidth reads runtimeConfig.bandwidth; ok is false when
// the runtime passed none.
func parseRuntimeBandwidth(raw json.RawMessage) (b *agentv1.Bandwidth, ok bool, err error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, false, nil
	}
	var e BandwidthEntry
	if err := json.Unmarshal(raw, &e); err != nil {
		return nil, false, configError("runtimeConfig.bandwidth: %s is not {ingressRate, ingressBurst, egressRate, egressBurst} in bits per second and bits: %v", raw, err)
	}
	b = &agentv1.Bandwidth{}
	for _, d := range []struct {
		dir, annotation string
		rate, burst     uint64
		set             func(*agentv1.Rate)
	}{
		{"ingress", bandwidth.AnnotationIngress, e.IngressRate, e.IngressBurst, func(r *agentv1.Rate) { b.Ingress = r }},
		{"egress", bandwidth.AnnotationEgress, e.EgressRate, e.EgressBurst, func(r *agentv1.Rate) { b.Egress = r }},
	} {
		if d.rate == 0 {
			if d.burst != 0 {
				return nil, false, configError("runtimeConfig.bandwidth.%sBurst: %d bits without an %sRate", d.dir, d.burst, d.dir)
			}
			continue
		}
		if err := bandwidth.CheckRate(d.rate); err != nil {
			return nil, false, configError("runtimeConfig.bandwidth.%sRate: %v (the runtime passes the pod's %s here)", d.dir, err, d.annotation)
		}
		d.set(&agentv1.Rate{BitsPerSecond: d.rate, BurstBits: d.burst})
	}
	if b.Ingress == nil && b.Egress == nil {
		b = nil // present and zero: no limit on this network
	}
	return b, true, nil
}

// portBandwidth is the port's rate limits: runtimeConfig.bandwidth, else
// the pod's annotations (nil without a kubeconfig), else none.
func portBandwidth(conf *NetConf, annotations map[string]string) (*agentv1.Bandwidth, error) {
	b, ok, err := parseRuntimeBandwidth(conf.RuntimeConfig.Bandwidth)
	if err != nil || ok {
		return b, err
	}
	b, err = bandwidth.FromAnnotations(annotations)
	if err != nil {
		return nil, types.NewError(ErrBadAnnotation, "pod annotation "+err.Error(), "")
	}
	return b, nil
}

// bandwidthString says a port's limits in CHECK's mismatch errors.
func bandwidthString(b *agentv1.Bandwidth) string {
	if b.IsZero() {
		return "none"
	}
	r := func(r *agentv1.Rate) string {
		if r.GetBitsPerSecond() == 0 {
			return "none"
		}
		return fmt.Sprintf("%d bit/s burst %d", r.GetBitsPerSecond(), r.GetBurstBits())
	}
	return "ingress " + r(b.GetIngress()) + ", egress " + r(b.GetEgress())
}
