package afxdp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vhostmq/vhostmq/dataplane/internal/nettest"
)

// bed is two network namespaces joined by a veth pair: "node" has vx
// (10.78.0.2/24, where the device is opened) and "peer" has vy
// (10.78.0.1/24), a kernel to ARP and ping.
type bed struct {
	node, peer string
	peerMAC    [6]byte
	nodeMAC    [6]byte
}

var (
	guestMAC = [6]byte{0x52, 0x54, 0, 0x78, 0, 5}
	guestIP  = [4]byte{10, 78, 0, 5}
	peerIP   = [4]byte{10, 78, 0, 1}
	bcast    = [6]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
)

func newBed(t testing.TB, queues int) *bed {
	b := &bed{node: fmt.Sprintf("xdpn%d", os.Getpid()), peer: fmt.Sprintf("xdpp%d", os.Getpid()),
		peerMAC: [6]byte{0x02, 0, 0, 0x78, 0, 1}, nodeMAC: [6]byte{0x02, 0, 0, 0x78, 0, 2}}
	nettest.AddNetns(t, b.node, b.peer)
	q := fmt.Sprint(queues)
	nettest.Run(t, "ip", "-n", b.node, "link", "add", "vx", "numtxqueues", q, "numrxqueues", q, "address", net.HardwareAddr(b.nodeMAC[:]).String(),
		"type", "veth", "peer", "name", "vy", "numtxqueues", q, "numrxqueues", q, "address", net.HardwareAddr(b.peerMAC[:]).String(), "netns", b.peer)
	nettest.Run(t, "ip", "-n", b.node, "addr", "add", "10.78.0.2/24", "dev", "vx")
	nettest.Run(t, "ip", "-n", b.peer, "addr", "add", "10.78.0.1/24", "dev", "vy")
	nettest.Run(t, "ip", "-n", b.node, "link", "set", "vx", "up")
	nettest.Run(t, "ip", "-n", b.peer, "link", "set", "vy", "up")
	return b
}

// open opens the device on the node's vx, skipping only when the kernel
// refuses AF_XDP or BPF outright.
func (b *bed) open(t testing.TB, cfg Config, workers int) *Device {
	t.Helper()
	if cfg.Interface == "" {
		cfg.Interface = "vx"
	}
	var d *Device
	var err error
	nettest.In(t, b.node, func() { d, err = Open(cfg, workers) })
	if errors.Is(err, unix.EAFNOSUPPORT) {
		t.Skipf("the kernel refuses AF_XDP here: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	return d
}

// rawSocket is an AF_PACKET socket on the peer's vy.
func (b *bed) rawSocket(t testing.TB) int {
	t.Helper()
	var fd int
	nettest.In(t, b.peer, func() {
		var err error
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL)))
		if err != nil {
			t.Fatal(err)
		}
		ifi, err := net.InterfaceByName("vy")
		if err != nil {
			t.Fatal(err)
		}
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifi.Index}); err != nil {
			t.Fatal(err)
		}
		unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 50000})
	})
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

func udpFrame(dst, src [6]byte, payload string) []byte {
	udp := make([]byte, 8+len(payload))
	binary.BigEndian.PutUint16(udp[0:], 9)
	binary.BigEndian.PutUint16(udp[2:], 9)
	binary.BigEndian.PutUint16(udp[4:], uint16(len(udp)))
	copy(udp[8:], payload)
	return nettest.IPv4(dst, src, guestIP, peerIP, 17, udp)
}

// send puts one frame on q's TX ring at offset 64 and flushes.
func send(t testing.TB, q *Queue, frame []byte) {
	t.Helper()
	buf := q.TxFrame()
	if buf == nil {
		t.Fatal("no free TX frame")
	}
	copy(buf[64:], frame)
	if !q.Send(64, len(frame)) {
		t.Fatal("Send refused the frame")
	}
	q.Flush()
}

// recvFrom waits for a frame on the device's queues that match accepts.
func recvFrom(t testing.TB, d *Device, what string, match func([]byte) bool) []byte {
	t.Helper()
	frames := make([][]byte, 32)
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		for i := range d.queues {
			q := d.Queue(i)
			n := q.Receive(frames)
			for _, f := range frames[:n] {
				if match(f) {
					out := append([]byte(nil), f...)
					q.Release()
					return out
				}
			}
			q.Release()
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("no %s within 3 s", what)
	return nil
}

func none(t testing.TB, d *Device, what string, match func([]byte) bool) {
	t.Helper()
	frames := make([][]byte, 32)
	deadline := time.Now().Add(300 * time.Millisecond)
	for time.Now().Before(deadline) {
		for i := range d.queues {
			q := d.Queue(i)
			n := q.Receive(frames)
			for _, f := range frames[:n] {
				if match(f) {
					t.Errorf("%s: % x", what, f[:min(len(f), 42)])
				}
			}
			q.Release()
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// peerRecv waits for a frame at the peer's raw socket that match accepts.
func peerRecv(t testing.TB, fd int, what string, match func([]byte) bool) []byte {
	t.Helper()
	buf := make([]byte, 4096)
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err == nil && match(buf[:n]) {
			return append([]byte(nil), buf[:n]...)
		}
	}
	t.Fatalf("no %s at the peer within 3 s", what)
	return nil
}

func peerSend(t testing.TB, fd int, frame []byte) {
	t.Helper()
	if _, err := unix.Write(fd, frame); err != nil {
		t.Fatal(err)
	}
}

// udpListen listens in namespace ns.
func (b *bed) udpListen(t testing.TB, ns, addr string) net.PacketConn {
	t.Helper()
	var l net.PacketConn
	nettest.In(t, ns, func() {
		var err error
		if l, err = net.ListenPacket("udp4", addr); err != nil {
			t.Fatal(err)
		}
	})
	t.Cleanup(func() { l.Close() })
	return l
}

func udpRecv(t testing.TB, l net.PacketConn) string {
	t.Helper()
	buf := make([]byte, 256)
	l.SetReadDeadline(time.Now().Add(3 * time.Second))
	n, _, err := l.ReadFrom(buf)
	if err != nil {
		t.Fatalf("UDP at the node's kernel: %v", err)
	}
	return string(buf[:n])
}

// udpSend sends a datagram from the peer's kernel (which resolves the
// address by ARP first).
func (b *bed) udpSend(t testing.TB, addr, payload string) {
	t.Helper()
	nettest.In(t, b.peer, func() {
		c, err := net.Dial("udp4", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.Write([]byte(payload)); err != nil {
			t.Fatal(err)
		}
	})
}

func hasPayload(p string) func([]byte) bool {
	return func(f []byte) bool { return strings.Contains(string(f), p) }
}

// TestVethRoundTrip: on a veth (native XDP, copy-mode sockets; zero-copy
// reported unavailable): frames from the peer to a guest MAC arrive in the
// socket, frames sent on the socket arrive at the peer, ARP works both
// ways (the guest's request out, the peer kernel's unicast reply in, the
// peer's broadcast request in as a copy), frames to other MACs and
// traffic for the node's own kernel IP still reach the kernel.
func TestVethRoundTrip(t *testing.T) {
	b := newBed(t, 1)
	d := b.open(t, Config{}, 2)
	m := d.Mode()
	t.Logf("mode: %s", m)
	if m.ZeroCopy || m.ZeroCopyError == "" {
		t.Errorf("zero-copy on a veth: %+v (want refused, with the reason)", m)
	}
	if d.Queues() != 1 || d.Queue(0).FD() < 0 || d.Queue(1).FD() != -1 || !d.Queue(1).txShared {
		t.Errorf("queues: %d NIC queues, worker fds %d %d", d.Queues(), d.Queue(0).FD(), d.Queue(1).FD())
	}
	if out := nettest.Run(t, "ip", "-n", b.node, "-d", "link", "show", "vx"); !strings.Contains(out, "PROMISC") || !strings.Contains(out, "prog/xdp") {
		t.Errorf("vx as the kernel sees it:\n%s", out)
	}
	if err := d.AddMAC(guestMAC); err != nil {
		t.Fatal(err)
	}
	raw := b.rawSocket(t)

	// peer -> guest MAC: ours
	peerSend(t, raw, udpFrame(guestMAC, b.peerMAC, "to-the-guest"))
	recvFrom(t, d, "the peer's frame to the guest MAC", hasPayload("to-the-guest"))
	// peer -> another MAC: the kernel's (dropped there), not ours
	peerSend(t, raw, udpFrame([6]byte{0x52, 0x54, 0, 0x78, 0, 9}, b.peerMAC, "to-someone-else"))
	none(t, d, "a frame to an unknown MAC reached the socket", hasPayload("to-someone-else"))

	// guest -> peer, from both workers (worker 1 shares queue 0's socket)
	send(t, d.Queue(0), udpFrame(b.peerMAC, guestMAC, "from-worker-0"))
	peerRecv(t, raw, "worker 0's frame", hasPayload("from-worker-0"))
	send(t, d.Queue(1), udpFrame(b.peerMAC, guestMAC, "from-worker-1"))
	peerRecv(t, raw, "worker 1's frame", hasPayload("from-worker-1"))

	// ARP: the guest asks for the peer's kernel, the unicast reply is ours
	send(t, d.Queue(0), nettest.ARPRequest(guestMAC, guestIP, peerIP))
	r := recvFrom(t, d, "ARP reply from 10.78.0.1", func(f []byte) bool {
		return len(f) >= 42 && binary.BigEndian.Uint16(f[12:]) == 0x0806 && binary.BigEndian.Uint16(f[20:]) == 2 && [4]byte(f[28:32]) == peerIP
	})
	if [6]byte(r[0:6]) != guestMAC || [6]byte(r[22:28]) != b.peerMAC {
		t.Errorf("ARP reply to %x from %x", r[0:6], r[22:28])
	}
	// the peer's kernel asks for the guest (its neighbour entry from the
	// guest's request flushed first): a broadcast, copied to us
	nettest.Run(t, "ip", "-n", b.peer, "neigh", "flush", "dev", "vy")
	b.udpSend(t, "10.78.0.5:9", "to-resolve")
	recvFrom(t, d, "the peer's ARP request for the guest (a broadcast copy)", func(f []byte) bool {
		return len(f) >= 42 && [6]byte(f[0:6]) == bcast && binary.BigEndian.Uint16(f[12:]) == 0x0806 && [4]byte(f[38:42]) == guestIP
	})
	// the node's own kernel IP: ARP and UDP still reach it (passed)
	l := b.udpListen(t, b.node, "10.78.0.2:7777")
	b.udpSend(t, "10.78.0.2:7777", "for-the-node-kernel")
	if got := udpRecv(t, l); got != "for-the-node-kernel" {
		t.Errorf("the node's kernel got %q", got)
	}
	none(t, d, "the node kernel's UDP reached the socket", hasPayload("for-the-node-kernel"))

	// a VLAN-tagged broadcast keeps its tag in the copy
	vlanB := udpFrame(bcast, b.peerMAC, "tagged-bcast")
	vlanB = append(append(append([]byte(nil), vlanB[:12]...), 0x81, 0x00, 0x00, 20), vlanB[12:]...)
	peerSend(t, raw, vlanB)
	f := recvFrom(t, d, "the tagged broadcast", hasPayload("tagged-bcast"))
	if binary.BigEndian.Uint16(f[12:]) != 0x8100 || binary.BigEndian.Uint16(f[14:])&0xfff != 20 {
		t.Errorf("tagged broadcast arrived as % x", f[:18])
	}

	for _, s := range d.socks {
		st, err := s.Stats()
		t.Logf("queue %d: kernel stats %+v, rx invalid %d, completions invalid %d, kick errors %d", s.Queue(), st, s.RxInvalid.Load(), s.CompInvalid.Load(), s.KickErrors.Load())
		if s.RxInvalid.Load()+s.CompInvalid.Load()+s.KickErrors.Load() != 0 || err != nil || st.Rx_invalid_descs+st.Tx_invalid_descs != 0 {
			t.Error("invalid descriptors or failed kicks")
		}
	}
	// Close detaches and restores the interface
	d.Close()
	if out := nettest.Run(t, "ip", "-n", b.node, "-d", "link", "show", "vx"); strings.Contains(out, "PROMISC") || strings.Contains(out, "prog/xdp") {
		t.Errorf("vx after Close:\n%s", out)
	}
}

// TestDedicated: on a dedicated NIC broadcasts go to the sockets only; the
// node's kernel no longer sees the peer's ARP requests.
func TestDedicated(t *testing.T) {
	b := newBed(t, 1)
	d := b.open(t, Config{Dedicated: true}, 1)
	if d.group != nil {
		t.Error("a dedicated device opened a group socket")
	}
	raw := b.rawSocket(t)
	peerSend(t, raw, udpFrame(bcast, b.peerMAC, "dedicated-bcast"))
	recvFrom(t, d, "a broadcast on a dedicated NIC", hasPayload("dedicated-bcast"))
	l := b.udpListen(t, b.node, "10.78.0.2:7777")
	b.udpSend(t, "10.78.0.2:7777", "for-the-node-kernel")
	recvFrom(t, d, "the peer's ARP request for the node (dedicated: ours)", func(f []byte) bool {
		return len(f) >= 42 && binary.BigEndian.Uint16(f[12:]) == 0x0806 && [4]byte(f[38:42]) == [4]byte{10, 78, 0, 2}
	})
	l.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	if n, _, err := l.ReadFrom(make([]byte, 64)); err == nil {
		t.Errorf("the node's kernel got a datagram (%d bytes) though its ARP requests go to the dataplane", n)
	}
}

// TestMultiQueue: a veth with two queues gets a socket on each, one per
// worker, and the transmit side is not shared.
func TestMultiQueue(t *testing.T) {
	b := newBed(t, 2)
	d := b.open(t, Config{}, 2)
	if d.Queues() != 2 || len(d.Queue(0).rx) != 1 || len(d.Queue(1).rx) != 1 || d.Queue(0).txShared {
		t.Fatalf("queues %d, worker 0 rx %d, worker 1 rx %d, shared %v", d.Queues(), len(d.Queue(0).rx), len(d.Queue(1).rx), d.Queue(0).txShared)
	}
	if err := d.AddMAC(guestMAC); err != nil {
		t.Fatal(err)
	}
	raw := b.rawSocket(t)
	for i := range 2 {
		send(t, d.Queue(i), udpFrame(b.peerMAC, guestMAC, fmt.Sprintf("mq-from-%d", i)))
		peerRecv(t, raw, "a frame from worker", hasPayload(fmt.Sprintf("mq-from-%d", i)))
	}
	for i := range 8 {
		peerSend(t, raw, udpFrame(guestMAC, b.peerMAC, fmt.Sprintf("mq-to-%d", i)))
		recvFrom(t, d, "a frame to the guest", hasPayload(fmt.Sprintf("mq-to-%d", i)))
	}
	// a second device on the same interface: refused, naming it
	var err error
	nettest.In(t, b.node, func() { _, err = Open(Config{Interface: "vx"}, 1) })
	if err == nil || !strings.Contains(err.Error(), "interface vx: ") {
		t.Errorf("second device on vx: %v", err)
	}
	// one worker, two NIC queues: one epoll fd over both sockets and the
	// group socket
	d.Close()
	d1 := b.open(t, Config{}, 1)
	q := d1.Queue(0)
	if len(q.rx) != 2 || q.group == nil || q.epfd < 0 || q.FD() != q.epfd {
		t.Fatalf("one worker: rx %d, group %v, epfd %d, fd %d", len(q.rx), q.group != nil, q.epfd, q.FD())
	}
	if err := d1.AddMAC(guestMAC); err != nil {
		t.Fatal(err)
	}
	peerSend(t, raw, udpFrame(guestMAC, b.peerMAC, "one-worker"))
	fds := []unix.PollFd{{Fd: int32(q.FD()), Events: unix.POLLIN}}
	if n, err := unix.Poll(fds, 3000); n != 1 || err != nil {
		t.Fatalf("poll on the queue's epoll fd: %d %v", n, err)
	}
	recvFrom(t, d1, "a frame with one worker", hasPayload("one-worker"))
}

func TestMissingOrDownInterface(t *testing.T) {
	b := newBed(t, 1)
	var err error
	nettest.In(t, b.node, func() { _, err = Open(Config{Interface: "nosuch0"}, 1) })
	if err == nil || !strings.Contains(err.Error(), `interface: no interface "nosuch0"`) {
		t.Errorf("missing interface: %v", err)
	}
	nettest.Run(t, "ip", "-n", b.node, "link", "set", "vx", "down")
	nettest.In(t, b.node, func() { _, err = Open(Config{Interface: "vx"}, 1) })
	if err == nil || !strings.Contains(err.Error(), `interface: "vx" is down`) {
		t.Errorf("down interface: %v", err)
	}
	if out := nettest.Run(t, "ip", "-n", b.node, "-d", "link", "show", "vx"); strings.Contains(out, "prog/xdp") || strings.Contains(out, "PROMISC") {
		t.Errorf("left behind:\n%s", out)
	}
	if err := (&Config{}).Validate(); err == nil || !strings.HasPrefix(err.Error(), "interface: ") {
		t.Errorf("empty interface: %v", err)
	}
}

// TestGenericMode: the program in generic (SKB) mode carries the same
// traffic: unicast in, group copies in, frames out.
func TestGenericMode(t *testing.T) {
	b := newBed(t, 1)
	d := b.open(t, Config{Generic: true}, 1)
	if m := d.Mode(); m.XDP != "generic" || !strings.Contains(m.NativeError, "generic mode") {
		t.Errorf("mode %+v", m)
	}
	if out := nettest.Run(t, "ip", "-n", b.node, "-d", "link", "show", "vx"); !strings.Contains(out, " xdpgeneric ") {
		t.Errorf("vx as the kernel sees it:\n%s", out)
	}
	if err := d.AddMAC(guestMAC); err != nil {
		t.Fatal(err)
	}
	raw := b.rawSocket(t)
	peerSend(t, raw, udpFrame(guestMAC, b.peerMAC, "generic-unicast"))
	recvFrom(t, d, "a unicast in generic mode", hasPayload("generic-unicast"))
	peerSend(t, raw, udpFrame(bcast, b.peerMAC, "generic-bcast"))
	recvFrom(t, d, "a broadcast copy in generic mode", hasPayload("generic-bcast"))
	send(t, d.Queue(0), udpFrame(b.peerMAC, guestMAC, "generic-out"))
	peerRecv(t, raw, "a frame sent in generic mode", hasPayload("generic-out"))
	// the node's kernel still gets its own traffic
	l := b.udpListen(t, b.node, "10.78.0.2:7777")
	b.udpSend(t, "10.78.0.2:7777", "generic-kernel")
	if got := udpRecv(t, l); got != "generic-kernel" {
		t.Errorf("the node's kernel got %q", got)
	}
	none(t, d, "the node kernel's datagram reached the socket", hasPayload("generic-kernel"))
}
