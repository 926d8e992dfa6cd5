package main

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/vhostmq/vhostmq/dataplane/agent/agenttest"
	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
	"github.com/vhostmq/vhostmq/dataplane/config"
)

// A static port's portSecurity and ips reach its spec, and the agent
// takes that spec as it is.
func TestStaticSpecPortSecurity(t *testing.T) {
	n := agenttest.Start(t, "", 2)
	cfg, err := config.Parse(fmt.Appendf(nil, `
ports:
  - {name: a, socket: %s, role: server, queuePairs: 1, mac: "52:54:00:12:34:56", ips: [10.1.2.3, "fd00::3", "::ffff:10.1.2.4"]}
  - {name: b, socket: %s, role: server, queuePairs: 1, portSecurity: false}
`, filepath.Join(n.SocketRoot, "a", "vhu.sock"), filepath.Join(n.SocketRoot, "b", "vhu.sock")))
	if err != nil {
		t.Fatal(err)
	}
	a, b := staticSpec(&cfg.Ports[0]), staticSpec(&cfg.Ports[1])
	if want := []string{"10.1.2.3/32", "fd00::3/128", "10.1.2.4/32"}; !a.PortSecurityOn() || !slices.Equal(a.GetIp().GetAddresses(), want) {
		t.Errorf("port a: port security %v, ip.addresses %v; want on, %v", a.PortSecurity, a.GetIp().GetAddresses(), want)
	}
	if b.PortSecurityOn() || b.Ip != nil {
		t.Errorf("port b: port security %v, ip %v; want off and none", b.PortSecurity, b.Ip)
	}
	for _, s := range []*agentv1.PortSpec{a, b} {
		p, err := n.Client.CreatePort(context.Background(), &agentv1.CreatePortRequest{Spec: s})
		if err != nil {
			t.Fatalf("port %s: %v", s.Id, err)
		}
		if p.Spec.PortSecurityOn() != s.PortSecurityOn() || !slices.Equal(p.Spec.GetIp().GetAddresses(), s.GetIp().GetAddresses()) {
			t.Errorf("port %s: the agent has %v, sent %v", s.Id, p.Spec, s)
		}
	}
}

// A static port's bandwidth reaches its spec as the API writes it (none:
// unset), and the agent enforces it.
func TestStaticSpecBandwidth(t *testing.T) {
	n := agenttest.Start(t, "", 2)
	cfg, err := config.Parse(fmt.Appendf(nil, `
ports:
  - {name: a, socket: %s, role: server, queuePairs: 1, bandwidth: {ingress: 100M, egressBurst: 1Mi, egress: 1G}}
  - {name: b, socket: %s, role: server, queuePairs: 1}
`, filepath.Join(n.SocketRoot, "a", "vhu.sock"), filepath.Join(n.SocketRoot, "b", "vhu.sock")))
	if err != nil {
		t.Fatal(err)
	}
	a, b := staticSpec(&cfg.Ports[0]), staticSpec(&cfg.Ports[1])
	want := &agentv1.Bandwidth{Ingress: &agentv1.Rate{BitsPerSecond: 100e6}, Egress: &agentv1.Rate{BitsPerSecond: 1e9, BurstBits: 1 << 20}}
	if !proto.Equal(a.Bandwidth, want) || b.Bandwidth != nil {
		t.Errorf("bandwidth: port a %v, want %v; port b %v, want none", a.Bandwidth, want, b.Bandwidth)
	}
	p, err := n.Client.CreatePort(context.Background(), &agentv1.CreatePortRequest{Spec: a})
	if err != nil || !proto.Equal(p.Spec.Bandwidth, want) {
		t.Errorf("port a: %v, the agent has bandwidth %v", err, p.GetSpec().GetBandwidth())
	}
}
