package dataplane

import (
	"strings"
	"testing"

	"github.com/vhostmq/vhostmq/dataplane/internal/nettest"
	"github.com/vhostmq/vhostmq/dataplane/netdev"
)

// TestUplinkMTU: a port whose MTU is more than its network's uplink
// carries is refused, naming mtu and why (an AF_XDP frame's size, the
// NIC's MTU, the tap's configured MTU); nothing is left behind, and a
// port that fits, or is not on the uplink, is accepted.
func TestUplinkMTU(t *testing.T) {
	add := func(d *Dataplane, name string, mtu int) error {
		return d.AddPort(netdev.Config{Name: name, Socket: sockPath(t, name), Role: netdev.RoleServer, QueuePairs: 1, MTU: mtu},
			PortOptions{Network: "red", Uplink: true})
	}
	refused := func(d *Dataplane, name string, mtu int, want string) {
		t.Helper()
		err := add(d, name, mtu)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("port with mtu %d: %v, want %q", mtu, err, want)
		}
		if _, ok := d.Port(name); ok {
			t.Errorf("refused port %q left behind", name)
		}
	}

	b := newXDPBed(t)
	// a jumbo NIC: the AF_XDP frame is the limit
	nettest.Run(t, "ip", "-n", b.node, "link", "set", "vA", "mtu", "9000")
	d := xdpDataplane(t, b.node, "vA")
	refused(d, "j", 9000, `port "j": mtu: 9000 is more than the af_xdp uplink carries: 3822 (an AF_XDP frame is at most 3840 bytes, Ethernet header and VLAN tag included)`)
	if err := d.CheckUplinkMTU(3823); err == nil {
		t.Error("CheckUplinkMTU(3823) on a 9000-byte NIC: nil")
	}
	if err := add(d, "ok", 3822); err != nil {
		t.Errorf("port with mtu 3822: %v", err)
	}
	refused(d, "j2", 4000, "mtu: 4000 is more than") // the network exists now
	if err := d.AddPort(netdev.Config{Name: "local", Socket: sockPath(t, "local"), Role: netdev.RoleServer, QueuePairs: 1, MTU: 9000},
		PortOptions{Network: "blue"}); err != nil {
		t.Errorf("port with mtu 9000 off the uplink: %v", err)
	}
	// the NIC's own MTU is the limit
	d2 := xdpDataplane(t, b.peer, "vB")
	refused(d2, "k", 1600, `mtu: 1600 is more than the af_xdp uplink carries: 1500 (the MTU of vB)`)

	tb := newUplinkBed(t)
	d3 := uplinkDataplane(t, tb.node)
	refused(d3, "m", 9000, `mtu: 9000 is more than the tap uplink carries: 1500 (uplink.tap.mtu)`)
	if err := add(d3, "n", 0); err != nil {
		t.Errorf("port with the default mtu on the tap uplink: %v", err)
	}
}
