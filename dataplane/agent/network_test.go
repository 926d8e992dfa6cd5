package agent

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/vhostmq/vhostmq/dataplane"
	"github.com/vhostmq/vhostmq/dataplane/afxdp"
	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
	"github.com/vhostmq/vhostmq/dataplane/dhcp/dhcptest"
	"github.com/vhostmq/vhostmq/dataplane/frontend"
	"github.com/vhostmq/vhostmq/dataplane/internal/nettest"
	"github.com/vhostmq/vhostmq/dataplane/tap"
	"github.com/vhostmq/vhostmq/dataplane/vxlan"
)

func ipConfig() *agentv1.IPConfig {
	return &agentv1.IPConfig{
		Addresses:  []string{"fd00::5/64", "10.4.0.5/16"},
		Gateway:    "10.4.0.1",
		Routes:     []*agentv1.Route{{Dst: "192.168.0.0/16", Gateway: "10.4.0.254"}, {Dst: "fd01::/64"}},
		DnsServers: []string{"10.96.0.10"},
		DnsSearch:  []string{"ns1.svc.cluster.local"},
	}
}

func TestNetworkValidation(t *testing.T) {
	e := start(t, shortDir(t), nil, 2)
	for _, tc := range []struct {
		field  string
		mutate func(*agentv1.PortSpec)
	}{
		{"network", func(s *agentv1.PortSpec) { s.Network = "bad name" }},
		{"vlan", func(s *agentv1.PortSpec) { s.Vlan = 4095 }},
		{"ip", func(s *agentv1.PortSpec) { s.Ip = nil }},
		{"ip.addresses[1]", func(s *agentv1.PortSpec) { s.Ip.Addresses[1] = "10.4.0.5" }},
		{"ip.addresses", func(s *agentv1.PortSpec) { s.Ip.Addresses = []string{"fd00::5/64"} }},
		{"ip.addresses[1]", func(s *agentv1.PortSpec) { s.Ip.Addresses[1] = "10.4.0.0/16" }},
		{"ip.gateway", func(s *agentv1.PortSpec) { s.Ip.Gateway = "10.4.0" }},
		{"ip.gateway", func(s *agentv1.PortSpec) { s.Ip.Gateway = "10.4.0.5" }},
		{"ip.routes[0].dst", func(s *agentv1.PortSpec) { s.Ip.Routes[0].Dst = "192.168.1.0/16" }},
		{"ip.routes[0].gateway", func(s *agentv1.PortSpec) { s.Ip.Routes[0].Gateway = "x" }},
		{"ip.routes[0].gateway", func(s *agentv1.PortSpec) { s.Ip.Routes[0].Gateway = "fd00::1" }},
		{"ip.dns_servers[0]", func(s *agentv1.PortSpec) { s.Ip.DnsServers[0] = "0.0.0.0" }},
		{"ip.dns_search[0]", func(s *agentv1.PortSpec) { s.Ip.DnsSearch[0] = "no spaces.example" }},
		{"ip.lease_seconds", func(s *agentv1.PortSpec) { s.Ip.LeaseSeconds = 5 }},
	} {
		s := e.spec("v", 1)
		s.Dhcp, s.Ip, s.Network = true, ipConfig(), "ns1/red"
		tc.mutate(s)
		_, err := e.create(s)
		if code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "spec."+tc.field+":") {
			t.Errorf("bad %s: %v, want InvalidArgument naming spec.%s", tc.field, err, tc.field)
		}
	}
	l, _ := e.client.ListPorts(context.Background(), &agentv1.ListPortsRequest{})
	if len(l.Ports) != 0 {
		t.Errorf("%d ports after refused requests", len(l.Ports))
	}
	// A network's VLAN is one: a second port must agree.
	a := e.spec("a", 1)
	a.Network, a.Vlan = "ns1/red", 10
	if _, err := e.create(a); err != nil {
		t.Fatal(err)
	}
	b := e.spec("b", 1)
	b.Network, b.Vlan = "ns1/red", 20
	if _, err := e.create(b); code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), `spec.vlan: 20, but port "a" of network "ns1/red" has vlan 10`) {
		t.Errorf("second VLAN on a network: %v", err)
	}
	// the same ID with another IP configuration names it
	a2 := proto.Clone(a).(*agentv1.PortSpec)
	a2.Ip = ipConfig()
	if _, err := e.create(a2); code(err) != codes.AlreadyExists || !strings.Contains(err.Error(), "spec.ip:") {
		t.Errorf("changed ip: %v", err)
	}
}

// TestDHCPThroughTheAgent: a port created over the API with dhcp on and
// its IPAM configuration answers its guest's DISCOVER with that address,
// before and after an agent restart (the configuration is persisted).
func TestDHCPThroughTheAgent(t *testing.T) {
	dir := shortDir(t)
	e := start(t, dir, nil, 2)
	s := e.spec("d", 1)
	s.Mac, s.Network, s.Vlan, s.Dhcp, s.Ip = "52:54:00:00:00:0d", "ns1/red", 7, true, ipConfig()
	s.Ip.Addresses[0] = "FD00:0:0::5/64" // not canonical: stored canonical
	if _, err := e.create(s); err != nil {
		t.Fatal(err)
	}
	ask := func(e *env) dhcptest.Reply {
		t.Helper()
		f, err := frontend.Dial(s.SocketPath, frontend.Config{})
		for i := 0; err != nil && i < 100; i++ {
			time.Sleep(20 * time.Millisecond)
			f, err = frontend.Dial(s.SocketPath, frontend.Config{})
		}
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if err := f.Send(0, dhcptest.Frame(dhcptest.Discover, 42, [6]byte{0x52, 0x54, 0, 0, 0, 0x0d})); err != nil {
			t.Fatal(err)
		}
		fr, err := f.Recv(0, 3*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		r, err := dhcptest.ParseReply(fr)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	want := func(r dhcptest.Reply) {
		t.Helper()
		if r.Type != 2 || r.XID != 42 || r.YIAddr != netip.MustParseAddr("10.4.0.5") || string(r.Options[1]) != "\xff\xff\x00\x00" ||
			string(r.Options[3]) != "\x0a\x04\x00\x01" || string(r.Options[26]) != "\x05\xdc" {
			t.Errorf("reply type %d xid %d yiaddr %v options %v", r.Type, r.XID, r.YIAddr, r.Options)
		}
	}
	want(ask(e))
	// counted in the metrics, by type
	fams, done, err := newPortMetrics(e.ag, prometheus.NewRegistry()).Gather()
	defer done()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range fams {
		if f.GetName() != "vhostmq_dhcp_messages_total" {
			continue
		}
		for _, m := range f.Metric {
			for _, l := range m.Label {
				if l.GetName() == "type" {
					got[l.GetValue()] = m.GetCounter().GetValue()
				}
			}
		}
	}
	if got["discover"] != 1 || got["offer"] != 1 || got["malformed"] != 0 || len(got) != 10 {
		t.Errorf("vhostmq_dhcp_messages_total by type: %v", got)
	}
	stored, _ := os.ReadFile(filepath.Join(e.state, stateName))
	for _, w := range []string{`"schemaVersion": 2`, `"network": "ns1/red"`, `"vlan": 7`, `"dhcp": true`, `"fd00::5/64"`} {
		if !strings.Contains(string(stored), w) {
			t.Errorf("state file lacks %s:\n%s", w, stored)
		}
	}
	e.stop()
	e2 := start(t, dir, nil, 2)
	p, err := e2.client.GetPort(context.Background(), &agentv1.GetPortRequest{Id: "d"})
	if err != nil {
		t.Fatal(err)
	}
	if p.Spec.Network != "ns1/red" || p.Spec.Vlan != 7 || !p.Spec.Dhcp || p.Spec.Ip.GetAddresses()[0] != "fd00::5/64" {
		t.Errorf("restored spec %v", p.Spec)
	}
	want(ask(e2))
}

// TestSchema1StateRestored: a ports.json written before network, vlan,
// ip and dhcp existed restores its ports (on the default network).
func TestSchema1StateRestored(t *testing.T) {
	dir := shortDir(t)
	state := filepath.Join(dir, "state")
	os.MkdirAll(state, 0o700)
	sock := filepath.Join(dir, "s", "old", "vhu.sock")
	os.WriteFile(filepath.Join(state, stateName), []byte(`{"schemaVersion": 1, "ports": [
  {"id": "old", "socketPath": "`+sock+`", "role": "ROLE_SERVER", "queuePairs": 1, "mtu": 1500, "socketMode": 488, "polling": "POLLING_ADAPTIVE"}]}`), 0o600)
	e := start(t, dir, nil, 2)
	p, err := e.client.GetPort(context.Background(), &agentv1.GetPortRequest{Id: "old"})
	if err != nil {
		t.Fatalf("schema 1 port not restored: %v", err)
	}
	if p.Spec.Network != "" || p.Spec.Ip != nil || p.Spec.Dhcp {
		t.Errorf("restored spec %v", p.Spec)
	}
	if aside, _ := filepath.Glob(filepath.Join(state, stateName+".corrupt-*")); len(aside) != 0 {
		t.Errorf("schema 1 file was put aside: %v", aside)
	}
}

// TestTapUplinkThroughTheAgent: with a tap uplink on a bridge, ports ask
// for it by network; a down bridge shows in health and metrics and new
// ports on it are refused naming spec.uplink.
func TestTapUplinkThroughTheAgent(t *testing.T) {
	ns := fmt.Sprintf("vmqag%d", os.Getpid())
	dp := dataplaneInNetns(t, ns, [][]string{{"-n", ns, "link", "add", "br0", "type", "bridge"}, {"-n", ns, "link", "set", "br0", "up"}},
		dataplane.Config{Logger: logger(), Uplink: &tap.Config{Name: "vmqup0", Attach: "br0"}})
	e := startOn(t, shortDir(t), dp, 4)
	s := e.spec("u", 1)
	s.Network, s.Vlan, s.Uplink = "ns1/red", 10, "tap"
	if _, err := e.create(s); err != nil {
		t.Fatal(err)
	}
	// the same network without the uplink: refused, naming the field
	s2 := e.spec("u2", 1)
	s2.Network, s2.Vlan = "ns1/red", 10
	if _, err := e.create(s2); code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), `spec.uplink: "none", but port "u" of network "ns1/red" has uplink "tap"`) {
		t.Errorf("mixed uplink on one network: %v", err)
	}
	if h := e.ag.Health(); !h.Healthy || strings.Contains(h.Reason, "uplink") {
		t.Errorf("health with the uplink up: %v", h)
	}
	exec.Command("ip", "-n", ns, "link", "set", "br0", "down").Run()
	s3 := e.spec("u3", 1)
	s3.Network, s3.Uplink = "ns1/blue", "tap"
	if _, err := e.create(s3); code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), `spec.uplink: the tap uplink cannot carry traffic: attach: bridge "br0" is down`) {
		t.Errorf("new uplinked port with br0 down: %v", err)
	}
	waitHealth := time.Now().Add(3 * time.Second)
	for !strings.Contains(e.ag.Health().Reason, `uplink: attach: bridge "br0" is down`) {
		if time.Now().After(waitHealth) {
			t.Fatalf("health does not report the down bridge: %v", e.ag.Health())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !e.ag.Health().Healthy {
		t.Error("a down uplink made the node unhealthy: its slots still serve local networks")
	}
}

// TestAFXDPUplinkThroughTheAgent: with an af_xdp uplink on a veth, ports
// ask for it by network ("af_xdp"); asking for the tap uplink the node
// lacks is refused, and so are new ports while the NIC is down.
func TestAFXDPUplinkThroughTheAgent(t *testing.T) {
	ns := fmt.Sprintf("vmqax%d", os.Getpid())
	dp := dataplaneInNetns(t, ns, [][]string{{"-n", ns, "link", "add", "vx0", "type", "veth", "peer", "name", "vx1"},
		{"-n", ns, "link", "set", "vx0", "up"}, {"-n", ns, "link", "set", "vx1", "up"}},
		dataplane.Config{Logger: logger(), AFXDP: &afxdp.Config{Interface: "vx0"}})
	e := startOn(t, shortDir(t), dp, 4)
	s := e.spec("u", 1)
	s.Network, s.Uplink = "ns1/red", "af_xdp"
	if _, err := e.create(s); err != nil {
		t.Fatal(err)
	}
	// ns1/red is on the uplink, untagged: another network cannot be
	sv := e.spec("uv", 1)
	sv.Network, sv.Uplink = "ns1/violet", "af_xdp"
	if _, err := e.create(sv); err == nil || !strings.Contains(err.Error(), `vlan: 0 is used on the uplink by network "ns1/red"`) {
		t.Errorf("a second untagged network on the af_xdp uplink: %v", err)
	}
	sj := e.spec("uj", 1)
	sj.Network, sj.Uplink, sj.Mtu = "ns1/red", "af_xdp", 1600
	if _, err := e.create(sj); code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), `spec.mtu: 1600 is more than the af_xdp uplink carries: 1500 (the MTU of vx0)`) {
		t.Errorf("port mtu above the uplink's: %v", err)
	}
	s2 := e.spec("u2", 1)
	s2.Network, s2.Uplink = "ns1/green", "tap"
	if _, err := e.create(s2); code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), `spec.uplink: "tap", but this node has no tap uplink (agent config uplink.tap)`) {
		t.Errorf("tap uplink on an af_xdp node: %v", err)
	}
	s2.Uplink = "ovs"
	if _, err := e.create(s2); code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), `spec.uplink: "ovs" is not "none", "tap", "af_xdp" or "vxlan"`) {
		t.Errorf("unknown uplink kind: %v", err)
	}
	exec.Command("ip", "-n", ns, "link", "set", "vx0", "down").Run()
	s3 := e.spec("u3", 1)
	s3.Network, s3.Uplink = "ns1/blue", "af_xdp"
	if _, err := e.create(s3); code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), `spec.uplink: the af_xdp uplink cannot carry traffic: interface: "vx0" is down`) {
		t.Errorf("new uplinked port with vx0 down: %v", err)
	}
	waitHealth := time.Now().Add(3 * time.Second)
	for !strings.Contains(e.ag.Health().Reason, `uplink: interface: "vx0" is down`) {
		if time.Now().After(waitHealth) {
			t.Fatalf("health does not report the down NIC: %v", e.ag.Health())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestVXLANUplinkThroughTheAgent: a network on the vxlan uplink needs a
// VNI that its ports agree on and no VLAN; an MTU left at 0 is the
// uplink's (the underlay's 1500 less 50), a larger one is refused.
func TestVXLANUplinkThroughTheAgent(t *testing.T) {
	ns := fmt.Sprintf("vmqvx%d", os.Getpid())
	vc := &vxlan.Config{Local: netip.MustParseAddr("10.50.0.1"), MTU: 1500, VTEPs: []netip.Addr{netip.MustParseAddr("10.50.0.2")}}
	dp := dataplaneInNetns(t, ns, [][]string{{"-n", ns, "link", "add", "d0", "type", "veth", "peer", "name", "d1"},
		{"-n", ns, "addr", "add", "10.50.0.1/24", "dev", "d0"}, {"-n", ns, "link", "set", "d0", "up"}, {"-n", ns, "link", "set", "d1", "up"}},
		dataplane.Config{Logger: logger(), VXLAN: vc})
	e := startOn(t, shortDir(t), dp, 4)
	for _, c := range []struct {
		name, network string
		vni, vlan     uint32
		mtu           uint32
		code          codes.Code
		want          string
	}{
		{"novni", "ns1/red", 0, 0, 0, codes.InvalidArgument, "spec.vni: 0 is outside 1..16777215"},
		{"vlan", "ns1/red", 10, 7, 0, codes.InvalidArgument, "spec.vlan: 7, but on the vxlan uplink"},
		{"jumbo", "ns1/red", 10, 0, 1500, codes.FailedPrecondition, "spec.mtu: 1500 is more than the vxlan uplink carries: 1450"},
	} {
		s := e.spec(c.name, 1)
		s.Network, s.Uplink, s.Vni, s.Vlan, s.Mtu = c.network, "vxlan", c.vni, c.vlan, c.mtu
		if _, err := e.create(s); code(err) != c.code || !strings.Contains(err.Error(), c.want) {
			t.Errorf("port %q: %v, want %v naming %q", c.name, err, c.code, c.want)
		}
	}
	s := e.spec("u", 1)
	s.Network, s.Uplink, s.Vni = "ns1/red", "vxlan", 10
	p, err := e.create(s)
	if err != nil {
		t.Fatal(err)
	}
	if m := p.GetStatus().GetMtu(); m != 1450 {
		t.Errorf("port with mtu 0 on the vxlan uplink: mtu %d, want 1450", m)
	}
	s2 := e.spec("u2", 1)
	s2.Network, s2.Uplink, s2.Vni = "ns1/red", "vxlan", 11
	if _, err := e.create(s2); code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), `spec.vni: 11, but port "u" of network "ns1/red" has vni 10`) {
		t.Errorf("a second port of the network with another vni: %v", err)
	}
	s3 := e.spec("u3", 1)
	s3.Network, s3.Uplink, s3.Vni = "ns1/blue", "tap", 12
	if _, err := e.create(s3); code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), `spec.vni: 12, but uplink is "tap"`) {
		t.Errorf("a vni with the tap uplink: %v", err)
	}
}

// dataplaneInNetns makes network namespace ns (removed when the test
// ends; without root the test is skipped), runs the ip commands in setup,
// and starts a dataplane inside it.
func dataplaneInNetns(t *testing.T, ns string, setup [][]string, cfg dataplane.Config) *dataplane.Dataplane {
	t.Helper()
	nettest.AddNetns(t, ns)
	for _, args := range setup {
		nettest.Run(t, append([]string{"ip"}, args...)...)
	}
	var dp *dataplane.Dataplane
	var err error
	nettest.In(t, ns, func() { dp, err = dataplane.New(cfg) })
	if err != nil {
		t.Fatal(err)
	}
	return dp
}
