// Package bandwidth reads rate limits written the Kubernetes way: a
// resource quantity of bits per second ("100M", "1G", "1500k", "10Mi"), or
// of bits for a burst. The config file, vhostmqctl, the CNI plugin and the
// webhook all parse with it, so that "100M" means the same everywhere, and
// the pod annotations are read exactly as the container runtime reads
// them.
package bandwidth

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"

	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
)

// The pod annotations Kubernetes defines for a pod's rate limits, in bits
// per second: ingress is to the pod, egress from it. The container runtime
// reads them too, and passes them as the CNI bandwidth capability
// (runtimeConfig.bandwidth) to the plugins that declare it.
const (
	AnnotationIngress = "kubernetes.io/ingress-bandwidth"
	AnnotationEgress  = "kubernetes.io/egress-bandwidth"
)

// Kubernetes' bounds on those annotations (ExtractPodBandwidthResources in
// kubernetes' pkg/util/bandwidth/utils.go, copied into containerd's
// internal/cri/bandwidth/utils.go): containerd refuses the pod's sandbox
// outside them.
const (
	KubeMinBitsPerSecond = 1_000                 // 1k
	KubeMaxBitsPerSecond = 1_000_000_000_000_000 // 1P
)

// maxQuantity bounds a quantity before it is read as an integer (an int64
// holds 9.2E).
var maxQuantity = resource.MustParse("1E")

// ParseQuantity parses s as a whole, non-negative number of bits (per
// second, for a rate). A fraction rounds up, as Kubernetes' Quantity.Value
// does ("1.5k" is 1500, "0.5" is 1).
func ParseQuantity(s string) (uint64, error) {
	q, err := resource.ParseQuantity(s)
	switch {
	case err != nil:
		return 0, fmt.Errorf("%q is not a quantity like 100M, 1G or 1500k", s)
	case q.Sign() < 0:
		return 0, fmt.Errorf("%q is negative", s)
	case q.Cmp(maxQuantity) > 0:
		return 0, fmt.Errorf("%q is more than 1E", s)
	}
	return uint64(q.Value()), nil
}

// CheckRate checks a rate against the dataplane's bounds; 0 (no limit)
// passes.
func CheckRate(bitsPerSecond uint64) error {
	if bitsPerSecond != 0 && (bitsPerSecond < agentv1.MinBitsPerSecond || bitsPerSecond > agentv1.MaxBitsPerSecond) {
		return fmt.Errorf("%d bits/s is outside the dataplane's %d..%d (8 kbit/s..1 Tbit/s)",
			bitsPerSecond, uint64(agentv1.MinBitsPerSecond), uint64(agentv1.MaxBitsPerSecond))
	}
	return nil
}

// ParseRate parses a rate in bits per second and checks it against the
// dataplane's bounds ("0" is no limit).
func ParseRate(s string) (uint64, error) {
	v, err := ParseQuantity(s)
	if err != nil {
		return 0, err
	}
	if err := CheckRate(v); err != nil {
		return 0, fmt.Errorf("%q: %w%s", s, err, milli(s))
	}
	return v, nil
}

// milli hints at the suffix that turns megabits into millibits.
func milli(s string) string {
	if strings.HasSuffix(s, "m") {
		return ` (m is milli: M is mega)`
	}
	return ""
}

// FromAnnotations reads a pod's kubernetes.io/ingress-bandwidth and
// kubernetes.io/egress-bandwidth the way Kubernetes does (a quantity in
// 1k..1P), then against the dataplane's bounds; nil when neither is set.
// An error begins with the annotation's name.
//
// The bursts stay 0, the dataplane's default (10 ms of the rate): the
// runtimes' own burst for an annotation (containerd 2^32-1 bits, CRI-O
// 2^35-1) would let a VM send half a gigabyte at line rate first.
func FromAnnotations(a map[string]string) (*agentv1.Bandwidth, error) {
	var b *agentv1.Bandwidth
	for _, an := range []struct {
		key string
		set func(*agentv1.Bandwidth, *agentv1.Rate)
	}{
		{AnnotationIngress, func(b *agentv1.Bandwidth, r *agentv1.Rate) { b.Ingress = r }},
		{AnnotationEgress, func(b *agentv1.Bandwidth, r *agentv1.Rate) { b.Egress = r }},
	} {
		s, ok := a[an.key]
		if !ok {
			continue
		}
		v, err := ParseQuantity(s)
		switch {
		case err != nil:
			return nil, fmt.Errorf("%s: %w (bits per second)", an.key, err)
		case v < KubeMinBitsPerSecond || v > KubeMaxBitsPerSecond:
			return nil, fmt.Errorf("%s: %q is outside Kubernetes' 1k..1P bits per second%s", an.key, s, milli(s))
		}
		if err := CheckRate(v); err != nil {
			return nil, fmt.Errorf("%s: %q: %w", an.key, s, err)
		}
		if b == nil {
			b = &agentv1.Bandwidth{}
		}
		an.set(b, &agentv1.Rate{BitsPerSecond: v})
	}
	return b, nil
}
