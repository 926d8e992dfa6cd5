package dataplane

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/vhostmq/vhostmq/dataplane/frontend"
	"github.com/vhostmq/vhostmq/dataplane/internal/nettest"
	"github.com/vhostmq/vhostmq/dataplane/netdev"
	"github.com/vhostmq/vhostmq/dataplane/tap"
	"github.com/vhostmq/vhostmq/dataplane/vswitch"
)

// TestUplinkTableBounds: a network learns at most uplink.maxMACs addresses
// behind the uplink, counting the rest (mac_table_full); the node's own
// addresses (the bridge, its ports, the tap) are never learned behind a
// guest, not even one whose port security is off, and no port may be
// given one as its MAC.
func TestUplinkTableBounds(t *testing.T) {
	b := newUplinkBed(t)
	var d *Dataplane
	var err error
	nettest.In(t, b.node, func() {
		d, err = New(Config{CPUs: []int{0}, Logger: testLogger(t), Uplink: &tap.Config{Name: "vmqtap0", Attach: "br0"}, UplinkMACs: 8})
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	d2 := uplinkDataplane(t, b.peer)
	off := PortOptions{Network: "red", Uplink: true, Security: PortSecurity{Off: true}}
	g := dial(t, addPortOpt(t, d, "g", off), frontend.Config{})
	lan := dial(t, addPortOpt(t, d2, "lan", off), frontend.Config{}) // 20 hosts behind the peer's uplink

	// the node's own addresses, as the kernel in its namespace has them
	var own []vswitch.MAC
	for _, ifc := range []string{"br0", "vA", "vmqtap0"} {
		out := nettest.Run(t, "ip", "-n", b.node, "-br", "link", "show", ifc)
		f := strings.Fields(out)
		if len(f) < 3 {
			t.Fatalf("ip link show %s: %q", ifc, out)
		}
		hw, err := net.ParseMAC(f[2])
		if err != nil {
			t.Fatalf("%s: %q: %v", ifc, out, err)
		}
		own = append(own, vswitch.MAC(hw))
	}
	for _, m := range own {
		if err := g.Send(0, udpFrame([6]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, m, 1, 2, []byte("from the node's address"))); err != nil {
			t.Fatal(err)
		}
	}
	// a fresh bridge port may take a moment: each of the LAN's 20 hosts
	// speaks until its broadcast reached g
	for i := range 20 {
		host := [6]byte{0x02, 0x1a, 0, 0, 0, byte(i + 1)}
		// ARP: a bridge with br_netfilter loaded drops IPv4 frames whose
		// header checksum is not right (udpFrame leaves it 0)
		fr := nettest.ARPRequest(host, [4]byte{10, 77, 1, byte(i + 1)}, [4]byte{10, 77, 0, 1})
		deadline := time.Now().Add(5 * time.Second)
		for {
			if err := lan.Send(0, fr); err != nil {
				t.Fatal(err)
			}
			got, err := g.Recv(0, 100*time.Millisecond)
			if err == nil && [6]byte(got[6:12]) == host {
				break
			}

			if time.Now().After(deadline) {
				s, _ := d.UplinkStats()
				s2, _ := d2.UplinkStats()
				t.Fatalf("host %d's broadcast never reached g (uplink %+v; peer's uplink %+v; lan %+v)", i, s, s2, portStats(t, d2, "lan").Queues[0])
			}
		}
	}
	waitFor(t, "12 LAN hosts refused", func() bool { s, _ := d.UplinkStats(); return s.MACTableFull >= 12 })
	time.Sleep(100 * time.Millisecond)
	red := d.nets["red"]
	if n := red.macs.Owned(red.up); n != 8 {
		t.Errorf("%d addresses learned behind the uplink, want the limit 8", n)
	}
	if s, _ := d.UplinkStats(); s.MACTableFull < 12 {
		t.Errorf("mac_table_full %d, want at least 12 (20 hosts, limit 8; a host that spoke twice counts twice)", s.MACTableFull)
	}
	for _, m := range own {
		if p, ok := red.macs.Lookup(m); ok && p.up == nil {
			t.Errorf("the node's own address %v was learned behind guest port %s (the dataplane's own set: %x)", net.HardwareAddr(m[:]), p.dev.Name(), *d.own.Load())
		}
	}
	hw := net.HardwareAddr(own[0][:])
	err = d.AddPort(netdev.Config{Name: "x", Socket: sockPath(t, "x"), Role: netdev.RoleServer, QueuePairs: 1, MTU: 1500, MAC: hw},
		PortOptions{Network: "red", Uplink: true})
	if err == nil || !strings.Contains(err.Error(), "mac: "+hw.String()+" is the node's own address") {
		t.Errorf("a port given the bridge's MAC %s: %v, want an error naming mac", hw, err)
	}
}
