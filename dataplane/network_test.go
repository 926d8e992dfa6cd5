package dataplane

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vhostmq/vhostmq/dataplane/dhcp"
	"github.com/vhostmq/vhostmq/dataplane/dhcp/dhcptest"
	"github.com/vhostmq/vhostmq/dataplane/frontend"
	"github.com/vhostmq/vhostmq/dataplane/netdev"
)

var macC = [6]byte{0x52, 0x54, 0, 0, 0, 0x0c}

func addPortOpt(t testing.TB, d *Dataplane, name string, opt PortOptions) string {
	t.Helper()
	s := sockPath(t, name)
	if err := d.AddPort(netdev.Config{Name: name, Socket: s, Role: netdev.RoleServer, QueuePairs: 1, MTU: 1500}, opt); err != nil {
		t.Fatal(err)
	}
	return s
}

func discover(chaddr [6]byte, xid uint32) []byte {
	return dhcptest.Frame(dhcptest.Discover, xid, chaddr)
}

func expectNothing(t testing.TB, f *frontend.Frontend, who string) {
	t.Helper()
	if fr, err := f.Recv(0, 100*time.Millisecond); err == nil {
		t.Errorf("%s received a frame it must not see: %x", who, fr[:min(len(fr), 42)])
	} else if !errors.Is(err, frontend.ErrTimeout) {
		t.Fatal(err)
	}
}

// TestDHCPAnsweredByTheDataplane: a guest's DISCOVER on a port with a
// lease is answered by the dataplane into that guest's RX ring with the
// lease's address, and never reaches the other guests.
func TestDHCPAnsweredByTheDataplane(t *testing.T) {
	d := newDataplane(t)
	lease := &dhcp.Lease{MAC: macA, Addr: netip.MustParsePrefix("10.9.0.5/24"), Gateway: netip.MustParseAddr("10.9.0.1")}
	a := dial(t, addPortOpt(t, d, "a", PortOptions{DHCP: lease}), frontend.Config{})
	b := dial(t, addPortOpt(t, d, "b", PortOptions{}), frontend.Config{})
	if err := a.Send(0, discover(macA, 0xabcd)); err != nil {
		t.Fatal(err)
	}
	fr, _ := recvAny(t, a, 1, 2*time.Second)
	if len(fr) < 42+240 || binary.BigEndian.Uint16(fr[34:]) != 67 || binary.BigEndian.Uint16(fr[36:]) != 68 {
		t.Fatalf("A got %x, want a DHCP reply", fr[:min(len(fr), 42)])
	}
	m := fr[42:]
	if binary.BigEndian.Uint32(m[4:]) != 0xabcd || netip.AddrFrom4([4]byte(m[16:20])) != netip.MustParseAddr("10.9.0.5") {
		t.Errorf("reply xid %#x yiaddr %v", binary.BigEndian.Uint32(m[4:]), netip.AddrFrom4([4]byte(m[16:20])))
	}
	if [6]byte(fr[0:6]) != macA || [6]byte(fr[6:12]) != serverMAC {
		t.Errorf("reply from %x to %x", fr[6:12], fr[0:6])
	}
	expectNothing(t, b, "B")
	st := portStats(t, d, "a").DHCP
	if st == nil || st.Offers != 1 || st.Discovers != 1 {
		t.Errorf("DHCP stats %+v", st)
	}
	// a malformed one is counted and dropped
	bad := discover(macA, 1)
	bad[14+8]-- // IP header checksum
	if err := a.Send(0, bad); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the malformed DISCOVER counted", func() bool { return portStats(t, d, "a").DHCP.Malformed == 1 })
	expectNothing(t, a, "A")
	expectNothing(t, b, "B")

	// without a lease the same DISCOVER is an ordinary broadcast
	if err := b.Send(0, discover(macB, 2)); err != nil {
		t.Fatal(err)
	}
	if fr, _ := recvAny(t, a, 1, 2*time.Second); [6]byte(fr[6:12]) != macB {
		t.Errorf("A got %x, want B's DISCOVER", fr[:12])
	}
}

// TestNetworksAreIsolated: ports on different networks never see each
// other's frames, broadcasts and unknown unicasts included, even for an
// address learned on the other network.
func TestNetworksAreIsolated(t *testing.T) {
	d := newDataplane(t)
	a := dial(t, addPortOpt(t, d, "a", PortOptions{Network: "red"}), frontend.Config{})
	b := dial(t, addPortOpt(t, d, "b", PortOptions{Network: "red"}), frontend.Config{})
	c := dial(t, addPortOpt(t, d, "c", PortOptions{Network: "blue", VLAN: 20}), frontend.Config{})
	learn(t, a, b, 1)
	expectNothing(t, c, "C (blue) after red's broadcasts")
	if err := c.Send(0, broadcastFrom(macC)); err != nil {
		t.Fatal(err)
	}
	expectNothing(t, a, "A (red) after blue's broadcast")
	expectNothing(t, b, "B (red) after blue's broadcast")
	waitFor(t, "C's lone broadcast counted as undeliverable", func() bool {
		return portStats(t, d, "c").Queues[0].Drops.NoDestination == 1
	})
	// A unicast to C's address from red: unknown on red, so flooded on red
	// only.
	if err := a.Send(0, udpFrame(macC, macA, 1, 2, []byte("x"))); err != nil {
		t.Fatal(err)
	}
	if fr, _ := recvAny(t, b, 1, 2*time.Second); [6]byte(fr[0:6]) != macC {
		t.Errorf("B got %x", fr[:12])
	}
	expectNothing(t, c, "C (blue) after red's unicast to its address")
}

func TestNetworkVLANMustAgree(t *testing.T) {
	d := newDataplane(t)
	addPortOpt(t, d, "a", PortOptions{Network: "red", VLAN: 10})
	err := d.AddPort(netdev.Config{Name: "b", Socket: sockPath(t, "b"), Role: netdev.RoleServer, QueuePairs: 1, MTU: 1500},
		PortOptions{Network: "red", VLAN: 11})
	if err == nil || !strings.Contains(err.Error(), "vlan: 11, but network \"red\" has vlan 10") {
		t.Errorf("err = %v", err)
	}
	if _, ok := d.Port("b"); ok {
		t.Error("the refused port exists")
	}
	err = d.AddPort(netdev.Config{Name: "c", Socket: sockPath(t, "c"), Role: netdev.RoleServer, QueuePairs: 1, MTU: 1500},
		PortOptions{VLAN: 4095})
	if err == nil || !strings.Contains(err.Error(), "vlan: 4095") {
		t.Errorf("err = %v", err)
	}
	// the network goes with its last port; then another VLAN is fine
	if err := d.RemovePort("a"); err != nil {
		t.Fatal(err)
	}
	addPortOpt(t, d, "b2", PortOptions{Network: "red", VLAN: 11})
}
