package dataplane

import (
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vhostmq/vhostmq/dataplane/afxdp"
	"github.com/vhostmq/vhostmq/dataplane/frontend"
	"github.com/vhostmq/vhostmq/dataplane/internal/nettest"
	"github.com/vhostmq/vhostmq/dataplane/netdev"
)

// xdpBed is two "nodes" joined by a bare veth pair (no bridge): the
// dataplanes' af_xdp uplinks are on vA and vB, and each node's kernel
// keeps an address on its end (10.79.0.2 and 10.79.0.1).
type xdpBed struct {
	node, peer       string
	nodeMAC, peerMAC [6]byte
}

func newXDPBed(t testing.TB) *xdpBed {
	b := &xdpBed{node: fmt.Sprintf("vmxn%d", os.Getpid()), peer: fmt.Sprintf("vmxp%d", os.Getpid()),
		nodeMAC: [6]byte{0x02, 0, 0, 0x79, 0, 2}, peerMAC: [6]byte{0x02, 0, 0, 0x79, 0, 1}}
	nettest.AddNetns(t, b.node, b.peer)
	nettest.Run(t, "ip", "-n", b.node, "link", "add", "vA", "address", net.HardwareAddr(b.nodeMAC[:]).String(),
		"type", "veth", "peer", "name", "vB", "address", net.HardwareAddr(b.peerMAC[:]).String(), "netns", b.peer)
	nettest.Run(t, "ip", "-n", b.node, "addr", "add", "10.79.0.2/24", "dev", "vA")
	nettest.Run(t, "ip", "-n", b.peer, "addr", "add", "10.79.0.1/24", "dev", "vB")
	nettest.Run(t, "ip", "-n", b.node, "link", "set", "vA", "up")
	nettest.Run(t, "ip", "-n", b.peer, "link", "set", "vB", "up")
	return b
}

func xdpDataplane(t testing.TB, ns, nic string) *Dataplane {
	var d *Dataplane
	var err error
	nettest.In(t, ns, func() {
		d, err = New(Config{CPUs: []int{0, 1}, Logger: testLogger(t), AFXDP: &afxdp.Config{Interface: nic}})
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	return d
}

// TestAFXDPUplink: two dataplanes on two "nodes" joined by a veth pair,
// each with an af_xdp uplink on its end (native XDP, copy mode: zero-copy
// reported unavailable): a guest reaches the peer node's kernel (ARP,
// ping), guests reach each other across the nodes untagged and on VLAN 20
// (isolated from each other), and each node's kernel keeps its own
// traffic on the shared NIC.
func TestAFXDPUplink(t *testing.T) {
	b := newXDPBed(t)
	d := xdpDataplane(t, b.node, "vA")
	d2 := xdpDataplane(t, b.peer, "vB")
	st, ok := d.UplinkStats()
	if !ok || st.Kind != "af_xdp" || st.Name != "vA" || !st.Healthy || !strings.Contains(st.Mode, "zero-copy refused") {
		t.Errorf("uplink stats %+v", st)
	}
	t.Logf("node 1 uplink mode: %s", st.Mode)
	if !d.HasUplink(UplinkAFXDP) || d.HasUplink(UplinkTap) {
		t.Error("HasUplink does not say af_xdp")
	}
	a := dial(t, addPortOpt(t, d, "a", PortOptions{Network: "red", Uplink: true}), frontend.Config{})
	c := dial(t, addPortOpt(t, d, "c", PortOptions{Network: "blue", VLAN: 20, Uplink: true}), frontend.Config{})
	// f keeps network red on node 1 when a goes away
	f := dial(t, addPortOpt(t, d, "f", PortOptions{Network: "red", Uplink: true}), frontend.Config{})
	bb := dial(t, addPortOpt(t, d2, "b", PortOptions{Network: "red", Uplink: true}), frontend.Config{})
	e := dial(t, addPortOpt(t, d2, "e", PortOptions{Network: "blue", VLAN: 20, Uplink: true}), frontend.Config{})
	macE := [6]byte{0x52, 0x54, 0, 0, 0, 0x0e}
	bcast := [6]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	ipA, peer := [4]byte{10, 79, 0, 5}, [4]byte{10, 79, 0, 1}
	t.Cleanup(func() {
		if t.Failed() {
			s1, _ := d.UplinkStats()
			s2, _ := d2.UplinkStats()
			t.Logf("uplink stats: node %+v peer %+v", s1, s2)
			t.Log(nettest.Run(t, "ip", "-s", "-d", "-n", b.node, "link", "show", "vA"), nettest.Run(t, "ip", "-n", b.peer, "neigh"))
		}
	})

	// the peer node's kernel: ARP (the guest's broadcast out, the unicast
	// reply in: the guest's MAC was put in the XDP map when it sent)
	if err := a.Send(0, nettest.ARPRequest(macA, ipA, peer)); err != nil {
		t.Fatal(err)
	}
	r := recvMatching(t, a, "ARP reply from 10.79.0.1", isARPReply(peer))
	if [6]byte(r[22:28]) != b.peerMAC || [6]byte(r[0:6]) != macA {
		t.Errorf("ARP reply sender %x to %x, want %x to %x", r[22:28], r[0:6], b.peerMAC, macA)
	}
	if err := a.Send(0, echoRequest(b.peerMAC, macA, ipA, peer, 7)); err != nil {
		t.Fatal(err)
	}
	recvMatching(t, a, "echo reply from 10.79.0.1", func(f []byte) bool {
		return len(f) >= 42 && f[23] == 1 && f[34] == 0 && [4]byte(f[26:30]) == peer && binary.BigEndian.Uint16(f[38:]) == 7
	})
	// the peer's kernel asks for the guest: a broadcast the kernel gets
	// and the guest gets a copy of
	nettest.Run(t, "ip", "-n", b.peer, "neigh", "flush", "dev", "vB")
	nettest.In(t, b.peer, func() {
		conn, err := net.Dial("udp4", "10.79.0.5:9")
		if err != nil {
			t.Fatal(err)
		}
		conn.Write([]byte("resolve me"))
		conn.Close()
	})
	recvMatching(t, a, "the peer kernel's ARP request for the guest", func(f []byte) bool {
		return len(f) >= 42 && binary.BigEndian.Uint16(f[12:]) == 0x0806 && [4]byte(f[38:42]) == ipA
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
	if err := a.Send(0, ipFrame(macB, macA)); err != nil {
		t.Fatal(err)
	}
	recvMatching(t, bb, "a's unicast at b", isFrom(macA))
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

	// the node's own kernel still owns its address on the shared NIC
	var l net.PacketConn
	nettest.In(t, b.node, func() {
		var err error
		if l, err = net.ListenPacket("udp4", "10.79.0.2:7777"); err != nil {
			t.Fatal(err)
		}
	})
	defer l.Close()
	nettest.In(t, b.peer, func() {
		conn, err := net.Dial("udp4", "10.79.0.2:7777")
		if err != nil {
			t.Fatal(err)
		}
		conn.Write([]byte("for the node"))
		conn.Close()
	})
	l.SetReadDeadline(time.Now().Add(3 * time.Second))
	buf := make([]byte, 64)
	if n, _, err := l.ReadFrom(buf); err != nil || string(buf[:n]) != "for the node" {
		t.Errorf("the node's kernel: %q, %v", buf[:max(n, 0)], err)
	}

	st, _ = d.UplinkStats()
	if st.TxPackets < 5 || st.RxPackets < 4 || st.MACErrors != 0 {
		t.Errorf("uplink stats %+v", st)
	}
	t.Logf("node 1 uplink: %+v", st)
	// a removed port's MAC leaves the XDP map: a frame to it goes to the
	// kernel (had it reached the dataplane, the unknown unicast would have
	// been flooded to f)
	if err := d.RemovePort("a"); err != nil {
		t.Fatal(err)
	}
	if err := bb.Send(0, ipFrame(macA, macB)); err != nil {
		t.Fatal(err)
	}
	noneMatching(t, f, "a frame to a removed guest's MAC reached the dataplane", func(fr []byte) bool {
		return isFrom(macB)(fr) && [6]byte(fr[0:6]) == macA
	})
	// the NIC goes down: health says so, new networks are refused
	nettest.Run(t, "ip", "-n", b.node, "link", "set", "vA", "down")
	if err := d.UplinkHealth(); err == nil || !strings.Contains(err.Error(), `"vA" is down`) {
		t.Errorf("uplink health with vA down: %v", err)
	}
	err := d.AddPort(netdev.Config{Name: "y", Socket: sockPath(t, "y"), Role: netdev.RoleServer, QueuePairs: 1, MTU: 1500},
		PortOptions{Network: "green", VLAN: 30, Uplink: true})
	if err == nil || !strings.Contains(err.Error(), `uplink: interface: "vA" is down`) {
		t.Errorf("new network while vA is down: %v", err)
	}
}

func TestAFXDPUplinkMissingInterface(t *testing.T) {
	b := newXDPBed(t)
	var err error
	nettest.In(t, b.node, func() {
		_, err = New(Config{Logger: testLogger(t), AFXDP: &afxdp.Config{Interface: "nosuch0"}})
	})
	if err == nil || !strings.Contains(err.Error(), `uplink.af_xdp.interface: no interface "nosuch0"`) {
		t.Errorf("missing interface: %v", err)
	}
}

// BenchmarkAFXDPUplinkGuestToGuest measures frames/s from a guest on one
// dataplane to a guest on the other across the veth pair, both through
// af_xdp uplinks (native XDP, copy mode), 64-byte frames sent in bursts
// of 32 by one goroutine and counted at the receiving guest by another.
func BenchmarkAFXDPUplinkGuestToGuest(b *testing.B) {
	bd := newXDPBed(b)
	d := xdpDataplane(b, bd.node, "vA")
	d2 := xdpDataplane(b, bd.peer, "vB")
	a := dial(b, addPortOpt(b, d, "a", PortOptions{Network: "red", Uplink: true}), frontend.Config{})
	bb := dial(b, addPortOpt(b, d2, "b", PortOptions{Network: "red", Uplink: true}), frontend.Config{})
	// b speaks first: its MAC goes into node 2's XDP map and node 1 learns
	// it behind the uplink, so a's frames go out as unicast
	if err := bb.Send(0, ipFrame(macA, macB)); err != nil {
		b.Fatal(err)
	}
	if _, err := a.Recv(0, 3*time.Second); err != nil {
		b.Fatal(err)
	}
	frame := udpFrame(macB, macA, 1, 2, make([]byte, 64-42))
	burst := make([][]byte, 32)
	for i := range burst {
		burst[i] = frame
	}
	got := make(chan int)
	stop := make(chan struct{})
	go func() {
		n := 0
		defer func() { got <- n }()
		for {
			fr, err := bb.RecvAll(0, 100*time.Millisecond)
			n += len(fr)
			if err != nil && n >= b.N {
				return
			}
			select {
			case <-stop:
				return
			default:
			}
		}
	}()
	b.ResetTimer()
	start := time.Now()
	sent := 0
	for sent < b.N && time.Since(start) < 20*time.Second {
		k, _ := a.SendBurst(0, burst[:min(32, b.N-sent)])
		sent += k
		if k == 0 {
			runtime.Gosched()
		}
	}
	time.Sleep(200 * time.Millisecond) // let the last frames arrive
	close(stop)
	n := <-got
	el := time.Since(start)
	b.StopTimer()
	s1, _ := d.UplinkStats()
	s2, _ := d2.UplinkStats()
	b.Logf("sent %d, received %d; node 1 uplink tx %d dropped %d; node 2 uplink rx %d; b's port %+v", sent, n, s1.TxPackets, s1.TxDropped, s2.RxPackets, portCounters(d2, "b"))
	b.ReportMetric(float64(n)/el.Seconds(), "frames/s")
	b.ReportMetric(float64(sent-n)/float64(max(sent, 1))*100, "%lost")
}

func portCounters(d *Dataplane, name string) any {
	for _, p := range d.Stats() {
		if p.Name == name {
			return p
		}
	}
	return nil
}
