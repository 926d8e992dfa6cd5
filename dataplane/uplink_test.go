package dataplane

import (
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/vhostmq/vhostmq/dataplane/frontend"
	"github.com/vhostmq/vhostmq/dataplane/internal/nettest"
	"github.com/vhostmq/vhostmq/dataplane/netdev"
	"github.com/vhostmq/vhostmq/dataplane/tap"
)

// uplinkBed is two "nodes": network namespaces, each with a Linux
// bridge, joined by a veth pair between the bridges. The peer's bridge
// has 10.77.0.1/24: a kernel to ARP and ping.
type uplinkBed struct {
	node, peer string
	peerMAC    [6]byte
}

func newUplinkBed(t *testing.T) *uplinkBed {
	b := &uplinkBed{node: fmt.Sprintf("vmqn%d", os.Getpid()), peer: fmt.Sprintf("vmqp%d", os.Getpid())}
	nettest.AddNetns(t, b.node, b.peer)
	for _, ns := range []string{b.node, b.peer} {
		// no multicast snooping: a snooping bridge joins 224.0.0.106 and
		// reports it (IGMP) to the guests
		nettest.Run(t, "ip", "-n", ns, "link", "add", "br0", "type", "bridge", "mcast_snooping", "0")
		nettest.Run(t, "ip", "-n", ns, "link", "set", "br0", "up")
	}
	nettest.Run(t, "ip", "-n", b.node, "link", "add", "vA", "type", "veth", "peer", "name", "vB", "netns", b.peer)
	nettest.Run(t, "ip", "-n", b.node, "link", "set", "vA", "master", "br0", "up")
	nettest.Run(t, "ip", "-n", b.peer, "link", "set", "vB", "master", "br0", "up")
	nettest.Run(t, "ip", "-n", b.peer, "addr", "add", "10.77.0.1/24", "dev", "br0")
	// a bridge takes a port's address unless it has its own: fix it
	b.peerMAC = [6]byte{0x02, 0, 0, 0x77, 0, 1}
	nettest.Run(t, "ip", "-n", b.peer, "link", "set", "br0", "address", net.HardwareAddr(b.peerMAC[:]).String())
	return b
}

func uplinkDataplane(t *testing.T, ns string) *Dataplane {
	var d *Dataplane
	var err error
	nettest.In(t, ns, func() {
		d, err = New(Config{CPUs: []int{0, 1}, Logger: testLogger(t), Uplink: &tap.Config{Name: "vmqtap0", Attach: "br0"}})
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	return d
}

func echoRequest(dst, src [6]byte, srcIP, dstIP [4]byte, id uint16) []byte {
	ic := make([]byte, 8+32)
	ic[0] = 8
	binary.BigEndian.PutUint16(ic[4:], id)
	binary.BigEndian.PutUint16(ic[6:], 1)
	binary.BigEndian.PutUint16(ic[2:], nettest.Checksum(ic))
	return nettest.IPv4(dst, src, srcIP, dstIP, 1, ic)
}

// recvMatching waits for a frame that match accepts, ignoring others
// (IPv6 neighbour discovery and the like from the peer's kernel).
func recvMatching(t *testing.T, f *frontend.Frontend, what string, match func([]byte) bool) []byte {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		fr, err := f.Recv(0, 50*time.Millisecond)
		if err == nil && match(fr) {
			return fr
		}
		if err == nil && testing.Verbose() {
			t.Logf("waiting for %s, ignored % x", what, fr[:min(len(fr), 42)])
		}
	}
	t.Fatalf("no %s within 3 s", what)
	return nil
}

func isARPReply(from [4]byte) func([]byte) bool {
	return func(f []byte) bool {
		return len(f) >= 42 && binary.BigEndian.Uint16(f[12:]) == 0x0806 && binary.BigEndian.Uint16(f[20:]) == 2 && [4]byte(f[28:32]) == from
	}
}

func noneMatching(t *testing.T, f *frontend.Frontend, what string, match func([]byte) bool) {
	t.Helper()
	deadline := time.Now().Add(300 * time.Millisecond)
	for time.Now().Before(deadline) {
		if fr, err := f.Recv(0, 50*time.Millisecond); err == nil && match(fr) {
			t.Fatalf("%s: % x", what, fr[:min(len(fr), 42)])
		}
	}
}

// ipFrame is udpFrame with a valid IPv4 header checksum: a bridge with
// br_netfilter drops IPv4 with a bad one.
func ipFrame(dst, src [6]byte) []byte {
	f := udpFrame(dst, src, 1, 2, []byte("hi"))
	binary.BigEndian.PutUint16(f[24:], nettest.Checksum(f[14:34]))
	return f
}

func isFrom(mac [6]byte) func([]byte) bool {
	return func(f []byte) bool { return len(f) >= 14 && [6]byte(f[6:12]) == mac }
}

// TestTapUplink: two dataplanes on two "nodes" (namespaces with a bridge
// each, joined by a veth pair): guests reach the peer node's kernel (ARP,
// ping) and each other across the nodes through the tap uplinks, VLAN 20
// tagged on the wire and isolated from the untagged network; a down
// bridge is a health signal and a clear error for new networks.
func TestTapUplink(t *testing.T) {
	b := newUplinkBed(t)
	d := uplinkDataplane(t, b.node)
	d2 := uplinkDataplane(t, b.peer)
	if out := nettest.Run(t, "ip", "-n", b.node, "-d", "link", "show", "vmqtap0"); !strings.Contains(out, "master br0") ||
		!strings.Contains(out, "multi_queue") || !strings.Contains(out, "vnet_hdr") || !strings.Contains(out, ",UP,") {
		t.Errorf("tap as the kernel sees it:\n%s", out)
	}
	a := dial(t, addPortOpt(t, d, "a", PortOptions{Network: "red", Uplink: true}), frontend.Config{})
	c := dial(t, addPortOpt(t, d, "c", PortOptions{Network: "blue", VLAN: 20, Uplink: true}), frontend.Config{})
	bb := dial(t, addPortOpt(t, d2, "b", PortOptions{Network: "red", Uplink: true}), frontend.Config{})
	e := dial(t, addPortOpt(t, d2, "e", PortOptions{Network: "blue", VLAN: 20, Uplink: true}), frontend.Config{})
	macE := [6]byte{0x52, 0x54, 0, 0, 0, 0x0e}
	bcast := [6]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	ipA, peer := [4]byte{10, 77, 0, 5}, [4]byte{10, 77, 0, 1}

	// the peer node's kernel: ARP, then a ping to the address learned
	// from the uplink (a unicast to the uplink)
	// a fresh bridge port may take a moment: ask like an ARP client, again
	// every 300 ms
	stopARP := make(chan struct{})
	arpDone := make(chan struct{})
	go func() {
		defer close(arpDone)
		for {
			a.Send(0, nettest.ARPRequest(macA, ipA, peer))
			select {
			case <-stopARP:
				return
			case <-time.After(300 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() {
		if t.Failed() {
			s1, _ := d.UplinkStats()
			s2, _ := d2.UplinkStats()
			t.Logf("uplink stats: node %+v peer %+v", s1, s2)
			t.Log(nettest.Run(t, "ip", "-s", "-n", b.node, "link", "show", "vmqtap0"), nettest.Run(t, "ip", "-s", "-n", b.node, "link", "show", "vA"),
				nettest.Run(t, "bridge", "-n", b.node, "fdb", "show", "br", "br0"), nettest.Run(t, "ip", "-n", b.peer, "neigh"))
		}
	})
	r := recvMatching(t, a, "ARP reply from 10.77.0.1", isARPReply(peer))
	close(stopARP)
	<-arpDone
	if [6]byte(r[22:28]) != b.peerMAC || [6]byte(r[0:6]) != macA {
		t.Errorf("ARP reply sender %x to %x, want %x to %x", r[22:28], r[0:6], b.peerMAC, macA)
	}
	if err := a.Send(0, echoRequest(b.peerMAC, macA, ipA, peer, 7)); err != nil {
		t.Fatal(err)
	}
	recvMatching(t, a, "echo reply from 10.77.0.1", func(f []byte) bool {
		return len(f) >= 42 && f[23] == 1 && f[34] == 0 && [4]byte(f[26:30]) == peer && binary.BigEndian.Uint16(f[38:]) == 7
	})
	// guest to guest across the nodes, untagged: a's broadcast reaches b,
	// b's unicast answer reaches a
	if err := a.Send(0, ipFrame(bcast, macA)); err != nil {
		t.Fatal(err)
	}
	recvMatching(t, bb, "a's broadcast at b (other node)", isFrom(macA))
	if err := bb.Send(0, ipFrame(macA, macB)); err != nil {
		t.Fatal(err)
	}
	recvMatching(t, a, "b's unicast at a", isFrom(macB))
	// VLAN 20 across the nodes, and apart from the untagged network
	if err := c.Send(0, ipFrame(bcast, macC)); err != nil {
		t.Fatal(err)
	}
	recvMatching(t, e, "c's broadcast at e (VLAN 20, other node)", isFrom(macC))
	if err := e.Send(0, ipFrame(macC, macE)); err != nil {
		t.Fatal(err)
	}
	recvMatching(t, c, "e's unicast at c", isFrom(macE))
	noneMatching(t, a, "the untagged network saw VLAN 20's frames", func(f []byte) bool { return isFrom(macC)(f) || isFrom(macE)(f) })
	noneMatching(t, bb, "the untagged network saw VLAN 20's frames", func(f []byte) bool { return isFrom(macC)(f) || isFrom(macE)(f) })
	noneMatching(t, e, "VLAN 20 saw the untagged network's frames", func(f []byte) bool { return isFrom(macA)(f) || isFrom(macB)(f) })
	c.Send(0, nettest.ARPRequest(macC, [4]byte{10, 77, 0, 6}, peer))
	noneMatching(t, c, "VLAN 20 reached the untagged 10.77.0.1", isARPReply(peer))

	st, ok := d.UplinkStats()
	if !ok || !st.Healthy || st.TxPackets < 5 || st.RxPackets < 4 || st.Queues != 2 {
		t.Errorf("uplink stats %+v", st)
	}
	t.Logf("node 1 uplink: %+v", st)
	// a network on the uplink cannot take a VLAN another one uses there
	err := d.AddPort(netdev.Config{Name: "x", Socket: sockPath(t, "x"), Role: netdev.RoleServer, QueuePairs: 1, MTU: 1500},
		PortOptions{Network: "green", VLAN: 20, Uplink: true})
	if err == nil || !strings.Contains(err.Error(), `vlan: 20 is used on the uplink by network "blue"`) {
		t.Errorf("second network on VLAN 20: %v", err)
	}
	// the bridge goes down: health says so, new networks are refused
	nettest.Run(t, "ip", "-n", b.node, "link", "set", "br0", "down")
	if err := d.UplinkHealth(); err == nil || !strings.Contains(err.Error(), `bridge "br0" is down`) {
		t.Errorf("uplink health with br0 down: %v", err)
	}
	err = d.AddPort(netdev.Config{Name: "y", Socket: sockPath(t, "y"), Role: netdev.RoleServer, QueuePairs: 1, MTU: 1500},
		PortOptions{Network: "green", VLAN: 30, Uplink: true})
	if err == nil || !strings.Contains(err.Error(), `uplink: attach: bridge "br0" is down`) {
		t.Errorf("new network while br0 is down: %v", err)
	}
}

func TestTapUplinkMissingBridge(t *testing.T) {
	b := newUplinkBed(t)
	var err error
	nettest.In(t, b.node, func() {
		_, err = New(Config{Logger: testLogger(t), Uplink: &tap.Config{Name: "vmqtap0", Attach: "nosuchbr"}})
	})
	if err == nil || !strings.Contains(err.Error(), `uplink.tap.attach: no interface "nosuchbr"`) {
		t.Errorf("missing bridge: %v", err)
	}
	// nothing left behind
	if out := nettest.Run(t, "ip", "-n", b.node, "-br", "link"); strings.Contains(out, "vmqtap0") {
		t.Errorf("tap left behind:\n%s", out)
	}
}
