package dataplane

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/vhostmq/vhostmq/dataplane/frontend"
	"github.com/vhostmq/vhostmq/dataplane/handoff"
	"github.com/vhostmq/vhostmq/dataplane/internal/nettest"
	"github.com/vhostmq/vhostmq/dataplane/netdev"
	"github.com/vhostmq/vhostmq/dataplane/vhostuser"
	"github.com/vhostmq/vhostmq/dataplane/vxlan"
)

// overlayBed is three "nodes" on three subnets joined only by a router
// namespace (no shared L2): A (10.1.0.2) and B (10.2.0.2) run dataplanes
// with vxlan uplinks, K (10.3.0.2) the kernel's own vxlan device on VNI
// 100 with 10.9.0.3/24, as an interoperability peer.
type overlayBed struct {
	a, b, k, router string
	kernelMAC       [6]byte
}

var (
	vtepA = netip.MustParseAddr("10.1.0.2")
	vtepB = netip.MustParseAddr("10.2.0.2")
	vtepK = netip.MustParseAddr("10.3.0.2")
)

func newOverlayBed(t *testing.T) *overlayBed {
	pid := os.Getpid()
	o := &overlayBed{a: fmt.Sprintf("vxa%d", pid), b: fmt.Sprintf("vxb%d", pid), k: fmt.Sprintf("vxk%d", pid), router: fmt.Sprintf("vxr%d", pid)}
	nettest.AddNetns(t, o.a, o.b, o.k, o.router)
	nettest.Run(t, "ip", "netns", "exec", o.router, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	for i, ns := range []string{o.a, o.b, o.k} {
		sub := i + 1
		nettest.Run(t, "ip", "-n", o.router, "link", "add", fmt.Sprintf("r%d", sub), "type", "veth", "peer", "name", "up0", "netns", ns)
		nettest.Run(t, "ip", "-n", o.router, "addr", "add", fmt.Sprintf("10.%d.0.1/24", sub), "dev", fmt.Sprintf("r%d", sub))
		nettest.Run(t, "ip", "-n", o.router, "link", "set", fmt.Sprintf("r%d", sub), "up")
		nettest.Run(t, "ip", "-n", ns, "addr", "add", fmt.Sprintf("10.%d.0.2/24", sub), "dev", "up0")
		nettest.Run(t, "ip", "-n", ns, "link", "set", "up0", "up")
		nettest.Run(t, "ip", "-n", ns, "link", "set", "lo", "up")
		nettest.Run(t, "ip", "-n", ns, "route", "add", "default", "via", fmt.Sprintf("10.%d.0.1", sub))
	}
	nettest.Run(t, "ip", "-n", o.k, "link", "add", "vx0", "type", "vxlan", "id", "100", "dstport", "4789", "local", "10.3.0.2", "dev", "up0")
	nettest.Run(t, "ip", "-n", o.k, "link", "set", "vx0", "mtu", "1450", "up")
	nettest.Run(t, "ip", "-n", o.k, "addr", "add", "10.9.0.3/24", "dev", "vx0")
	for _, dst := range []string{"10.1.0.2", "10.2.0.2"} { // the kernel's head-end replication list
		nettest.Run(t, "bridge", "-n", o.k, "fdb", "append", "00:00:00:00:00:00", "dev", "vx0", "dst", dst)
	}
	out := nettest.Run(t, "ip", "-n", o.k, "-br", "link", "show", "vx0")
	hw, err := net.ParseMAC(strings.Fields(out)[2])
	if err != nil {
		t.Fatalf("vx0's MAC from %q: %v", out, err)
	}
	o.kernelMAC = [6]byte(hw)
	return o
}

func overlayDataplane(t *testing.T, ns string, local netip.Addr) *Dataplane {
	var d *Dataplane
	var err error
	nettest.In(t, ns, func() {
		d, err = New(Config{CPUs: []int{0, 1}, Logger: testLogger(t),
			VXLAN: &vxlan.Config{Local: local, MTU: 1500, VTEPs: []netip.Addr{vtepA, vtepB, vtepK}}})
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	return d
}

func addOverlayPort(t *testing.T, d *Dataplane, name string, mtu int, opt PortOptions) (string, error) {
	s := sockPath(t, name)
	return s, d.AddPort(netdev.Config{Name: name, Socket: s, Role: netdev.RoleServer, QueuePairs: 1, MTU: mtu}, opt)
}

func addOverlayPortMAC(t *testing.T, d *Dataplane, name string, mac [6]byte, opt PortOptions) (string, error) {
	s := sockPath(t, name)
	return s, d.AddPort(netdev.Config{Name: name, Socket: s, Role: netdev.RoleServer, QueuePairs: 1, MTU: 1450, MAC: mac[:]}, opt)
}

// TestVXLANUplink: guests on two nodes that share no L2 segment are on one
// network through the vxlan uplinks (flood, learned unicast), and reach
// the kernel's vxlan device on a third node (ARP, ping: the wire format is
// the standard's both ways); addresses are learned behind their VTEPs and
// forgotten when a VTEP goes; a datagram from an address that is no VTEP
// is dropped; a frame the underlay cannot carry is refused, never
// fragmented; a port or network that does not fit the uplink gets an
// error naming the field.
func TestVXLANUplink(t *testing.T) {
	o := newOverlayBed(t)
	da := overlayDataplane(t, o.a, vtepA)
	db := overlayDataplane(t, o.b, vtepB)
	ov := PortOptions{Network: "ov", VNI: 100, Uplink: true}
	sa, err := addOverlayPort(t, da, "a", 1450, ov)
	if err != nil {
		t.Fatal(err)
	}
	sb, err := addOverlayPort(t, db, "b", 1450, ov)
	if err != nil {
		t.Fatal(err)
	}
	a, b := dial(t, sa, frontend.Config{}), dial(t, sb, frontend.Config{})
	t.Cleanup(func() {
		if t.Failed() {
			s1, _ := da.UplinkStats()
			s2, _ := db.UplinkStats()
			t.Logf("uplink stats: A %+v\nB %+v", s1, s2)
			t.Log(nettest.Run(t, "ip", "-s", "-n", o.k, "link", "show", "vx0"), nettest.Run(t, "bridge", "-n", o.k, "fdb", "show", "dev", "vx0"))
		}
	})
	bcast := [6]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

	// across the router: a's broadcast reaches b, b's answer is unicast
	if err := a.Send(0, ipFrame(bcast, macA)); err != nil {
		t.Fatal(err)
	}
	recvMatching(t, b, "a's broadcast at b (node B, through the router)", isFrom(macA))
	if err := b.Send(0, ipFrame(macA, macB)); err != nil {
		t.Fatal(err)
	}
	recvMatching(t, a, "b's unicast at a", isFrom(macB))

	// the kernel's vxlan device on node K: ARP and ping
	ipA, ipK := [4]byte{10, 9, 0, 1}, [4]byte{10, 9, 0, 3}
	if err := a.Send(0, nettest.ARPRequest(macA, ipA, ipK)); err != nil {
		t.Fatal(err)
	}
	r := recvMatching(t, a, "ARP reply from the kernel's vxlan device", isARPReply(ipK))
	if [6]byte(r[22:28]) != o.kernelMAC {
		t.Errorf("ARP reply from %x, want vx0's %x", r[22:28], o.kernelMAC)
	}
	if err := a.Send(0, echoRequest(o.kernelMAC, macA, ipA, ipK, 9)); err != nil {
		t.Fatal(err)
	}
	recvMatching(t, a, "echo reply from 10.9.0.3 (kernel vxlan)", func(f []byte) bool {
		return len(f) >= 42 && f[23] == 1 && f[34] == 0 && [4]byte(f[26:30]) == ipK && binary.BigEndian.Uint16(f[38:]) == 9
	})

	// what node A learned, and where
	behind := func(mac [6]byte) string {
		for _, e := range da.OverlayTable(time.Now().UnixNano()) {
			if e.MAC == net.HardwareAddr(mac[:]).String() {
				return e.VTEP
			}
		}
		return ""
	}
	if v := behind(macB); v != "10.2.0.2" {
		t.Errorf("b's MAC behind %q, want 10.2.0.2", v)
	}
	if v := behind(o.kernelMAC); v != "10.3.0.2" {
		t.Errorf("vx0's MAC behind %q, want 10.3.0.2", v)
	}
	st, _ := da.UplinkStats()
	if st.Kind != UplinkVXLAN || !st.Healthy || len(st.VTEPs) != 2 || st.Name != "10.1.0.2:4789" {
		t.Fatalf("A's uplink: kind %q healthy %v name %q VTEPs %+v; want vxlan, the two others", st.Kind, st.Healthy, st.Name, st.VTEPs)
	}
	for _, v := range st.VTEPs {
		if v.TxPackets == 0 || v.RxPackets == 0 || v.MACs != 1 || v.TxErrors != 0 {
			t.Errorf("VTEP %+v: want traffic both ways, one address behind it, no errors", v)
		}
	}

	// a guest that cannot announce itself lands on node B (its QEMU sends
	// SEND_RARP): node A's table has it behind B at once, before the guest
	// sent anything
	macM := [6]byte{0x52, 0x54, 0, 0, 0x4d, 0x4d}
	sm, err := addOverlayPortMAC(t, db, "m", macM, ov)
	if err != nil {
		t.Fatal(err)
	}
	m := dial(t, sm, frontend.Config{ProtocolFeatures: frontend.DefaultProtocolFeatures | 1<<vhostuser.ProtoRARP})
	if err := m.Ctrl(vhostuser.ReqSendRARP, append(macM[:], 0, 0), nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the migrated guest's MAC behind node B on node A", func() bool { return behind(macM) == "10.2.0.2" })
	recvMatching(t, a, "the RARP at a on node A", func(f []byte) bool { return isFrom(macM)(f) && f[12] == 0x80 && f[13] == 0x35 })

	// a datagram from the router's address (no VTEP) is dropped
	var rogue *vxlan.Queue
	nettest.In(t, o.router, func() { rogue, err = vxlan.Open(netip.MustParseAddr("10.1.0.1"), vxlan.DefaultPort) })
	if err != nil {
		t.Fatal(err)
	}
	defer rogue.Close()
	pa, _ := vxlan.NewPeer(vtepA)
	buf := rogue.TxFrame()
	f := ipFrame(macA, [6]byte{0x52, 0x54, 0, 0, 0x66, 0x66})
	copy(buf[14:], f)
	rogue.SendTo(14, len(f), 100, 1, []*vxlan.Peer{pa})
	rogue.Flush()
	noneMatching(t, a, "a frame from an address that is no VTEP reached a", isFrom([6]byte{0x52, 0x54, 0, 0, 0x66, 0x66}))
	if st, _ := da.UplinkStats(); st.RxUnknownVTEP != 1 {
		t.Errorf("rxUnknownVtep %d, want 1", st.RxUnknownVTEP)
	}

	// node B goes: what was learned behind it is forgotten
	if err := da.SetVTEPs([]netip.Addr{vtepA, vtepK}); err != nil {
		t.Fatal(err)
	}
	if v := behind(macB); v != "" {
		t.Errorf("b's MAC still behind %q after its VTEP went", v)
	}
	if err := da.SetVTEPs([]netip.Addr{vtepA, vtepB, vtepK}); err != nil {
		t.Fatal(err)
	}

	// the underlay shrinks under a 1450-byte frame: refused and counted
	// at the VTEP, nothing fragmented reaches b
	nettest.Run(t, "ip", "-n", o.a, "link", "set", "up0", "mtu", "1400")
	big := udpFrame(macB, macA, 1, 2, make([]byte, 1450-28))
	if err := a.Send(0, big); err != nil {
		t.Fatal(err)
	}
	noneMatching(t, b, "a frame larger than the underlay carries reached b", func(f []byte) bool { return len(f) == len(big) })
	var txErr uint64
	st, _ = da.UplinkStats()
	for _, v := range st.VTEPs {
		txErr += v.TxErrors
	}
	if txErr != 2 { // to b, and flooded to K too (b's MAC was forgotten)
		t.Errorf("VTEP txErrors %d after a frame over the underlay's MTU, want 2 (%+v)", txErr, st.VTEPs)
	}

	// ports and networks that do not fit the uplink
	for _, c := range []struct {
		name string
		mtu  int
		opt  PortOptions
		want string
	}{
		{"m", 1500, ov, `mtu: 1500 is more than the vxlan uplink carries: 1450 (uplink.vxlan.mtu 1500 less 50 bytes of VXLAN encapsulation)`},
		{"v", 1450, PortOptions{Network: "tagged", VLAN: 7, VNI: 7, Uplink: true}, "vlan: 7, but on the vxlan uplink a network is told apart by its vni"},
		{"n", 1450, PortOptions{Network: "novni", Uplink: true}, "vni: a network on the vxlan uplink needs one"},
		{"dup", 1450, PortOptions{Network: "other", VNI: 100, Uplink: true}, `vni: 100 is used on the uplink by network "ov"`},
		{"agree", 1450, PortOptions{Network: "ov", VNI: 101, Uplink: true}, `vni: 101, but network "ov" has vni 100`},
	} {
		if _, err := addOverlayPort(t, da, c.name, c.mtu, c.opt); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("port %q: %v, want %q", c.name, err, c.want)
		}
	}
}

// TestHandoverWithVXLANUplink: the vxlan uplink's sockets go with the
// ports to a successor. A numbered stream from a guest on node B comes in
// over the overlay while port a and node A's sockets move: every frame
// arrives once and in order (what came in meanwhile waits in the same
// sockets), and the old dataplane reads none of it afterwards.
func TestHandoverWithVXLANUplink(t *testing.T) {
	o := newOverlayBed(t)
	old := overlayDataplane(t, o.a, vtepA)
	peer := overlayDataplane(t, o.b, vtepB)
	opt := PortOptions{Network: "ov", VNI: 100, Uplink: true}
	sa, err := addOverlayPort(t, old, "a", 1450, opt)
	if err != nil {
		t.Fatal(err)
	}
	sb, err := addOverlayPort(t, peer, "b", 1450, opt)
	if err != nil {
		t.Fatal(err)
	}
	cfgs := map[string]netdev.Config{"a": {Name: "a", Socket: sa, Role: netdev.RoleServer, QueuePairs: 1, MTU: 1450}}
	a, bb := dial(t, sa, frontend.Config{}), dial(t, sb, frontend.Config{})
	if err := a.Send(0, ipFrame([6]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, macA)); err != nil {
		t.Fatal(err)
	}
	recvMatching(t, bb, "a's broadcast at b", isFrom(macA))
	if err := bb.Send(0, ipFrame(macA, macB)); err != nil {
		t.Fatal(err)
	}
	recvMatching(t, a, "b's unicast at a", isFrom(macB))

	const n = 3000
	s := frontend.StartStreamMatching(bb, a, n, numberedIP, isNumbered)
	waitSent(t, s, n/3)
	oc, nc := handoffPair(t)
	oldDone, rep := oldSide(old, oc, nil)
	succ, err := newSideBuilt(t, nc, cfgs, map[string]PortOptions{"a": opt}, true, func(st *handoff.State, fds []int) (*Dataplane, error) {
		if st.Uplink == nil || st.Uplink.Kind != UplinkVXLAN || st.Uplink.Name != "10.1.0.2:4789" || len(st.Uplink.Queues) != 4 {
			return nil, fmt.Errorf("handed uplink %+v, want vxlan 10.1.0.2:4789 with 2 socket pairs", st.Uplink)
		}
		var d *Dataplane
		var err error
		nettest.In(t, o.a, func() {
			d, err = New(Config{CPUs: []int{0, 1}, Logger: testLogger(t),
				VXLAN:  &vxlan.Config{Local: vtepA, MTU: 1500, VTEPs: []netip.Addr{vtepA, vtepB, vtepK}},
				Handed: &HandedUplink{Uplink: st.Uplink, FDs: fds}})
		})
		if err == nil {
			t.Cleanup(d.Close)
		}
		return d, err
	})
	if err != nil {
		t.Fatal("successor: ", err)
	}
	if err := <-oldDone; err != nil {
		t.Fatal("old: ", err)
	}
	atHandover := s.Sent()
	waitStream(t, s)
	t.Logf("handover of %d port and the vxlan sockets after %d of %d frames, paused %v", rep.Ports, atHandover, n, rep.Pause)
	ost, _ := old.UplinkStats()
	nst, _ := succ.UplinkStats()
	if nst.RxPackets == 0 || !nst.Healthy || nst.Name != "10.1.0.2:4789" {
		t.Errorf("the successor's uplink: %+v; want the stream's rest on 10.1.0.2:4789", nst)
	}
	rx := ost.RxPackets
	s2 := frontend.StartStreamMatching(bb, a, 200, numberedIP, isNumbered)
	waitStream(t, s2)
	if ost, _ = old.UplinkStats(); ost.RxPackets != rx {
		t.Errorf("the old dataplane read %d datagrams after the handover", ost.RxPackets-rx)
	}
	if err := a.Send(0, ipFrame(macB, macA)); err != nil {
		t.Fatal(err)
	}
	recvMatching(t, bb, "a's unicast at b through the adopted sockets", isFrom(macA))
}

// TestOverlayPathAllocatesNothing: a worker's pass that encapsulates a
// burst of guest frames for a VTEP, and one that receives a burst of
// datagrams and delivers them to a guest, allocate nothing.
func TestOverlayPathAllocatesNothing(t *testing.T) {
	if raceDetector {
		// AllocsPerRun counts the whole process, and under -race other
		// goroutines' instrumented code allocates now and then (1 in 10
		// runs here); the test runs without -race in make test too
		t.Skip("allocation counts are not meaningful under -race")
	}
	o := newOverlayBed(t)
	var da *Dataplane
	var err error
	nettest.In(t, o.a, func() {
		da, err = New(Config{CPUs: []int{0}, Logger: testLogger(t),
			VXLAN: &vxlan.Config{Local: vtepA, MTU: 1500, VTEPs: []netip.Addr{vtepA, vtepB}}})
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(da.Close)
	db := overlayDataplane(t, o.b, vtepB)
	opt := PortOptions{Network: "ov", VNI: 100, Uplink: true}
	sa, err := addOverlayPort(t, da, "a", 1450, opt)
	if err != nil {
		t.Fatal(err)
	}
	sb, err := addOverlayPort(t, db, "b", 1450, opt)
	if err != nil {
		t.Fatal(err)
	}
	a, b := dial(t, sa, frontend.Config{QueueSize: 1024}), dial(t, sb, frontend.Config{QueueSize: 1024})
	if err := a.Send(0, ipFrame([6]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, macA)); err != nil {
		t.Fatal(err)
	}
	recvMatching(t, b, "a's broadcast at b", isFrom(macA))
	if err := b.Send(0, ipFrame(macA, macB)); err != nil {
		t.Fatal(err)
	}
	recvMatching(t, a, "b's unicast at a", isFrom(macB))

	// every worker of both nodes halted: this test's passes are the only
	// code running on the path (AllocsPerRun counts the whole process)
	const runs = 5
	w := da.workers[0]
	w.halt()
	wb := db.byName["b"].workers[0].Load()
	for _, x := range db.workers {
		x.halt()
	}
	frames := make([][]byte, 0, burstSize)
	for i := range burstSize {
		frames = append(frames, udpFrame(macB, macA, uint16(i), 9, make([]byte, 64)))
	}
	for i := 0; i <= runs; i++ { // AllocsPerRun makes runs+1 calls
		if n, err := a.SendBurst(0, frames); err != nil || n != len(frames) {
			t.Fatalf("queued %d of %d: %v", n, len(frames), err)
		}
	}
	tx := da.up.vx.peers.Load().byAddr[vtepB.As4()].TxPackets.Load()
	if allocs := testing.AllocsPerRun(runs, func() {
		if !w.pass() {
			t.Fatal("the pass found no work")
		}
	}); allocs != 0 {
		t.Errorf("a pass encapsulating %d frames allocated %.1f times", burstSize, allocs)
	}
	if got := da.up.vx.peers.Load().byAddr[vtepB.As4()].TxPackets.Load() - tx; got != (runs+1)*burstSize {
		t.Errorf("%d datagrams to node B, want %d", got, (runs+1)*burstSize)
	}

	// the other way: datagrams from b wait in node A's socket
	back := make([][]byte, 0, burstSize)
	for i := range burstSize {
		back = append(back, udpFrame(macA, macB, uint16(i), 9, make([]byte, 64)))
	}
	peerB := da.up.vx.peers.Load().byAddr[vtepB.As4()]
	rx0 := peerB.RxPackets.Load()
	for i := 0; i <= runs; i++ {
		if n, err := b.SendBurst(0, back); err != nil || n != len(back) {
			t.Fatalf("b queued %d of %d: %v", n, len(back), err)
		}
	}
	// node B's worker sends them (and takes a's datagrams from above)
	want := uint64((runs + 1) * burstSize)
	toA := db.up.vx.peers.Load().byAddr[vtepA.As4()]
	for sent0, deadline := toA.TxPackets.Load(), time.Now().Add(10*time.Second); toA.TxPackets.Load()-sent0 < want; {
		if time.Now().After(deadline) {
			t.Fatalf("node B sent %d of b's %d frames in 10 s", toA.TxPackets.Load()-sent0, want)
		}
		wb.pass()
	}
	// the datagrams come through the router when they come: every pass
	// until all are delivered must allocate nothing
	for deadline := time.Now().Add(10 * time.Second); peerB.RxPackets.Load()-rx0 < want; {
		if time.Now().After(deadline) {
			t.Fatalf("node A took %d of b's %d datagrams in 10 s", peerB.RxPackets.Load()-rx0, want)
		}
		if allocs := testing.AllocsPerRun(1, func() { w.pass() }); allocs != 0 {
			t.Fatalf("a pass receiving datagrams and delivering them to a allocated %.1f times", allocs)
		}
	}
	if got, _ := a.RecvAll(0, 100*time.Millisecond); len(got) < int(want) {
		t.Errorf("a received %d of b's %d frames", len(got), want)
	}
}
