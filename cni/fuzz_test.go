package cni

import (
	"errors"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
	"github.com/vhostmq/vhostmq/internal/bandwidth"
)

// FuzzLoadConf: any configuration either loads with its invariants or is
// refused with a CNI error; nothing panics.
func FuzzLoadConf(f *testing.F) {
	for _, s := range []string{
		`{"cniVersion":"1.0.0","name":"n","type":"vhostmq-cni"}`,
		`{"cniVersion":"1.1.0","name":"n","type":"vhostmq-cni","mtu":9000,"queuePairs":4,"socketMode":"client","polling":"busy","deviceID":"c0-s0","runtimeConfig":{"deviceID":"c0-s0","mac":"52:54:00:00:00:01","CNIDeviceInfoFile":"/x"}}`,
		`{"cniVersion":"1.0.0","name":"n","type":"vhostmq-cni","ipam":{"type":"host-local","subnet":"192.0.2.0/24"},"kubeconfig":"/k","resourceName":"a/b"}`,
		`{"cniVersion":"1.0.0","name":"n","type":"vhostmq-cni","prevResult":{"cniVersion":"1.0.0","interfaces":[{"name":"net1"}]}}`,
		`{"cniVersion":"1.0.0","name":"n","type":"vhostmq-cni","dhcp":false,"vlan":10,"uplink":"tap","ipam":{"type":"static"}}`,
		`{"cniVersion":"1.0.0","name":"n","type":"vhostmq-cni","dhcp":true}`, `{"vlan":"10"}`,
		`{"MTU":1}`, `[]`, `null`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		n, err := loadConf(data)
		if err != nil {
			var te *types.Error
			if !errors.As(err, &te) || te.Msg == "" {
				t.Fatalf("error %v (%T) is not a CNI error with a message", err, err)
			}
			return
		}
		if n.MTU != 0 && (n.MTU < minMTU || n.MTU > maxMTU) || n.QueuePairs > maxQueuePairs ||
			(n.SocketMode != "server" && n.SocketMode != "client") || n.AgentSocket == "" || n.SocketRoot == "" ||
			n.VLAN > maxVLAN || (n.Uplink != "none" && n.Uplink != "tap") || n.DHCP == nil || (*n.DHCP && n.IPAM.Type == "") {
			t.Fatalf("accepted an invalid config: %+v", n)
		}
	})
}

// FuzzParseAnnotations: annotation values come from whoever may edit the
// pod; they are accepted only in range.
func FuzzParseAnnotations(f *testing.F) {
	f.Add("4", "server", "adaptive")
	f.Add("0", "both", "")
	f.Add("129", "client", "spin")
	f.Fuzz(func(t *testing.T, q, mode, poll string) {
		s, err := parseAnnotations(map[string]string{AnnotationQueues: q, AnnotationSocketMode: mode, AnnotationPolling: poll})
		if err != nil {
			var te *types.Error
			if !errors.As(err, &te) || te.Code != ErrBadAnnotation {
				t.Fatalf("error %v", err)
			}
			return
		}
		if s.queues < 1 || s.queues > maxQueuePairs {
			t.Fatalf("queues %d accepted from %q", s.queues, q)
		}
	})
}

// FuzzBandwidth: the rate limits come from the pod's author (the
// kubernetes.io annotations, a network entry's "bandwidth" through
// Multus); a limit is accepted only within the dataplane's bounds, and a
// refusal is a CNI error naming the annotation or the field.
func FuzzBandwidth(f *testing.F) {
	f.Add("100M", "1G", []byte(`{"ingressRate":100000000,"ingressBurst":4294967295}`))
	f.Add("2k", "", []byte(`{"egressBurst":1}`))
	f.Add("1.5e9", "-1", []byte(`{"egressRate":-5}`))
	f.Add("100m", "1P", []byte(`null`))
	f.Fuzz(func(t *testing.T, ingress, egress string, raw []byte) {
		inBounds := func(b *agentv1.Bandwidth) {
			for _, r := range []*agentv1.Rate{b.GetIngress(), b.GetEgress()} {
				if v := r.GetBitsPerSecond(); v == 0 && r.GetBurstBits() != 0 || v != 0 && (v < agentv1.MinBitsPerSecond || v > agentv1.MaxBitsPerSecond) {
					t.Fatalf("accepted %v", b)
				}
			}
		}
		b, err := portBandwidth(&NetConf{}, map[string]string{bandwidth.AnnotationIngress: ingress, bandwidth.AnnotationEgress: egress})
		var te *types.Error
		switch {
		case err == nil:
			inBounds(b)
		case !errors.As(err, &te) || te.Code != ErrBadAnnotation || !strings.HasPrefix(te.Msg, "pod annotation kubernetes.io/"):
			t.Fatalf("annotations %q, %q: error %v", ingress, egress, err)
		}
		b, _, err = parseRuntimeBandwidth(raw)
		switch {
		case err == nil:
			inBounds(b)
		case !errors.As(err, &te) || te.Code != types.ErrInvalidNetworkConfig || !strings.HasPrefix(te.Msg, "runtimeConfig.bandwidth"):
			t.Fatalf("runtimeConfig.bandwidth %q: error %v", raw, err)
		}
	})
}
