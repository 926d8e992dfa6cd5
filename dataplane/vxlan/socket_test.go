package vxlan

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vhostmq/vhostmq/dataplane/internal/nettest"
)

var (
	macA = [6]byte{0x02, 0, 0, 0, 0, 0x0a}
	macB = [6]byte{0x02, 0, 0, 0, 0, 0x0b}
)

// inNetns makes a namespace with lo up and returns its name.
func inNetns(t *testing.T, tag string) string {
	ns := fmt.Sprintf("vx%s-%d", tag, os.Getpid())
	nettest.AddNetns(t, ns)
	nettest.Run(t, "ip", "-n", ns, "link", "set", "lo", "up")
	return ns
}

func openIn(t *testing.T, ns, addr string) *Queue {
	t.Helper()
	var q *Queue
	var err error
	nettest.In(t, ns, func() { q, err = Open(netip.MustParseAddr(addr), DefaultPort) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(q.Close)
	return q
}

func peer(t *testing.T, addr string) *Peer {
	p, err := NewPeer(netip.MustParseAddr(addr))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// send queues frame to peers through q.
func send(q *Queue, frame []byte, vni, hash uint32, peers ...*Peer) {
	buf := q.TxFrame()
	copy(buf[14:], frame)
	q.SendTo(14, len(frame), vni, hash, peers)
}

// receive polls q until it has n frames or 5 s pass.
func receive(t *testing.T, q *Queue, n int) (frames [][]byte, vnis []uint32, srcs [][4]byte) {
	t.Helper()
	buf := make([][]byte, Burst)
	for end := time.Now().Add(5 * time.Second); len(frames) < n && time.Now().Before(end); {
		got := q.Receive(buf)
		for i := 0; i < got; i++ {
			vni, src := q.Meta(i)
			frames = append(frames, append([]byte(nil), buf[i]...))
			vnis, srcs = append(vnis, vni), append(srcs, src)
		}
		if got == 0 {
			time.Sleep(time.Millisecond)
		}
	}
	return
}

func frame(dst, src [6]byte, n int) []byte {
	f := make([]byte, n)
	copy(f, dst[:])
	copy(f[6:], src[:])
	binary.BigEndian.PutUint16(f[12:], 0x88b5) // local experimental ethertype
	for i := 14; i < n; i++ {
		f[i] = byte(i)
	}
	return f
}

// TestQueueUnicastFloodAndOversize: frames reach the VTEPs they are sent
// to with their VNI and the sender's address; the outer source port is
// the flow's; a datagram over the route's MTU is refused and counted,
// never fragmented.
func TestQueueUnicastFloodAndOversize(t *testing.T) {
	ns := inNetns(t, "q")
	a := openIn(t, ns, "127.0.0.1")
	b := openIn(t, ns, "127.0.0.2")
	c := openIn(t, ns, "127.0.0.3")
	pb, pc := peer(t, "127.0.0.2"), peer(t, "127.0.0.3")

	f1 := frame(macB, macA, 60)
	f2 := frame([6]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, macA, 200)
	send(a, f1, 42, 0x1234, pb)
	send(a, f2, 43, 0x5678, pb, pc) // head-end replication
	a.Flush()

	frames, vnis, srcs := receive(t, b, 2)
	if len(frames) != 2 || !bytes.Equal(frames[0], f1) || !bytes.Equal(frames[1], f2) || vnis[0] != 42 || vnis[1] != 43 {
		t.Fatalf("VTEP b got %d frames, VNIs %v; want f1 (42) and f2 (43)", len(frames), vnis)
	}
	if srcs[0] != [4]byte{127, 0, 0, 1} {
		t.Errorf("source VTEP %v, want 127.0.0.1", srcs[0])
	}
	if frames, vnis, _ := receive(t, c, 1); len(frames) != 1 || !bytes.Equal(frames[0], f2) || vnis[0] != 43 {
		t.Fatalf("VTEP c got %d frames (VNIs %v); want the flood", len(frames), vnis)
	}
	if pb.TxPackets.Load() != 2 || pc.TxPackets.Load() != 1 || pb.TxBytes.Load() != uint64(len(f1)+len(f2)) {
		t.Errorf("peer counters: b %d packets %d bytes, c %d packets", pb.TxPackets.Load(), pb.TxBytes.Load(), pc.TxPackets.Load())
	}

	// the outer source port, as a plain UDP socket sees it
	var fd int
	var err error
	nettest.In(t, ns, func() {
		fd, err = unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
		if err == nil {
			err = unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 4}, Port: DefaultPort})
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 5})
	send(a, f1, 42, 0xdeadbeef, peer(t, "127.0.0.4"))
	a.Flush()
	dg := make([]byte, 2048)
	n, from, err := unix.Recvfrom(fd, dg, 0)
	if err != nil {
		t.Fatal(err)
	}
	if port := from.(*unix.SockaddrInet4).Port; port != int(SrcPort(0xdeadbeef)) {
		t.Errorf("outer source port %d, want SrcPort(hash) = %d", port, SrcPort(0xdeadbeef))
	}
	if vni, inner, err := Parse(dg[:n]); err != nil || vni != 42 || !bytes.Equal(inner, f1) {
		t.Errorf("the plain socket's datagram: vni %d, %v", vni, err)
	}

	// over the route's MTU: refused, counted, nothing arrives
	nettest.Run(t, "ip", "-n", ns, "link", "set", "lo", "mtu", "1500")
	big := frame(macB, macA, 1500-Overhead+ethLen+1) // one byte over
	fit := frame(macB, macA, 1500-Overhead+ethLen)
	send(a, big, 42, 1, pb)
	send(a, fit, 42, 2, pb)
	a.Flush()
	if pb.TxErrors.Load() != 1 {
		t.Errorf("TxErrors %d after a datagram one byte over the MTU, want 1", pb.TxErrors.Load())
	}
	frames, _, _ = receive(t, b, 1)
	if len(frames) != 1 || len(frames[0]) != len(fit) {
		t.Errorf("after the oversize frame b got %d frames (%v), want only the %d-byte one", len(frames), lens(frames), len(fit))
	}
}

func lens(fs [][]byte) []int {
	var l []int
	for _, f := range fs {
		l = append(l, len(f))
	}
	return l
}

// TestKernelVXLANInterop: the kernel's own vxlan device is the peer, so
// the wire format is the standard's both ways: it decapsulates our ICMP
// echo request and answers with an encapsulated reply we parse.
func TestKernelVXLANInterop(t *testing.T) {
	kern, ours := inNetns(t, "k"), inNetns(t, "o")
	nettest.Run(t, "ip", "link", "add", "vxk0", "netns", kern, "type", "veth", "peer", "name", "vxo0", "netns", ours)
	nettest.Run(t, "ip", "-n", kern, "addr", "add", "192.168.77.1/24", "dev", "vxk0")
	nettest.Run(t, "ip", "-n", ours, "addr", "add", "192.168.77.2/24", "dev", "vxo0")
	nettest.Run(t, "ip", "-n", kern, "link", "set", "vxk0", "up")
	nettest.Run(t, "ip", "-n", ours, "link", "set", "vxo0", "up")
	nettest.Run(t, "ip", "-n", kern, "link", "add", "vx0", "type", "vxlan", "id", "4242", "dstport", fmt.Sprint(DefaultPort),
		"local", "192.168.77.1", "dev", "vxk0", "nolearning")
	nettest.Run(t, "ip", "-n", kern, "addr", "add", "10.9.0.2/24", "dev", "vx0")
	nettest.Run(t, "ip", "-n", kern, "link", "set", "vx0", "up")
	ourMAC := net.HardwareAddr(macA[:]).String()
	nettest.Run(t, "bridge", "-n", kern, "fdb", "append", ourMAC, "dev", "vx0", "dst", "192.168.77.2")
	nettest.Run(t, "ip", "-n", kern, "neigh", "add", "10.9.0.1", "lladdr", ourMAC, "dev", "vx0", "nud", "permanent")
	out := nettest.Run(t, "ip", "-n", kern, "-br", "link", "show", "vx0")
	hw, err := net.ParseMAC(strings.Fields(out)[2])
	if err != nil {
		t.Fatalf("vx0's MAC from %q: %v", out, err)
	}
	var kernMAC [6]byte
	copy(kernMAC[:], hw)

	q := openIn(t, ours, "192.168.77.2")
	icmp := make([]byte, 8+32)
	icmp[0] = 8 // echo request
	binary.BigEndian.PutUint16(icmp[4:], 0x77)
	binary.BigEndian.PutUint16(icmp[6:], 1)
	binary.BigEndian.PutUint16(icmp[2:], nettest.Checksum(icmp))
	req := nettest.IPv4(kernMAC, macA, [4]byte{10, 9, 0, 1}, [4]byte{10, 9, 0, 2}, 1, icmp)
	kp := peer(t, "192.168.77.1")
	var reply []byte
	var vni uint32
	var src [4]byte
	for try := 0; try < 5 && reply == nil; try++ { // the veth's first frames may find no neighbour yet
		send(q, req, 4242, 9, kp)
		q.Flush()
		frames, vnis, srcs := receive(t, q, 1)
		for i, f := range frames {
			if len(f) >= 34+8 && binary.BigEndian.Uint16(f[12:]) == 0x0800 && f[23] == 1 && f[34] == 0 {
				reply, vni, src = f, vnis[i], srcs[i]
			}
		}
	}
	if reply == nil {
		t.Fatalf("no echo reply from the kernel's vxlan device; its counters:\n%s", nettest.Run(t, "ip", "-n", kern, "-s", "link", "show", "vx0"))
	}
	if vni != 4242 || src != [4]byte{192, 168, 77, 1} || [6]byte(reply[0:6]) != macA || [6]byte(reply[6:12]) != kernMAC {
		t.Errorf("reply: vni %d from %v, %x -> %x; want 4242 from 192.168.77.1, %x -> %x", vni, src, reply[6:12], reply[0:6], kernMAC, macA)
	}
	if !bytes.Equal(reply[14+12:14+16], []byte{10, 9, 0, 2}) || !bytes.Equal(reply[14+20+8:], icmp[8:]) {
		t.Errorf("reply from %v, payload %x; want 10.9.0.2 and our payload", reply[14+12:14+16], reply[14+20+8:])
	}
	if kp.TxPackets.Load() == 0 || kp.TxErrors.Load() != 0 {
		t.Errorf("peer counters: %d sent, %d errors", kp.TxPackets.Load(), kp.TxErrors.Load())
	}
}
