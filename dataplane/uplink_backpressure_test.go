package dataplane

import (
	"encoding/binary"
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vhostmq/vhostmq/dataplane/frontend"
	"github.com/vhostmq/vhostmq/dataplane/internal/nettest"
	"github.com/vhostmq/vhostmq/dataplane/netdev"
	"github.com/vhostmq/vhostmq/dataplane/virtio"
)

// peerMAC2 is the source of the frames the peer node injects.
var peerMAC2 = [6]byte{0x02, 0, 0, 0x77, 0, 9}

// quiet turns IPv6 off in the namespaces: no neighbour discovery floods
// the guests' small RX rings (a flood that finds a ring full is dropped
// and counted, which these tests count as a failure).
func quiet(t *testing.T, namespaces ...string) {
	for _, ns := range namespaces {
		nettest.Run(t, "ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1")
	}
}

// quietBed is newUplinkBed, quiet.
func quietBed(t *testing.T) *uplinkBed {
	b := newUplinkBed(t)
	quiet(t, b.node, b.peer)
	return b
}

// withHeldLimit sets heldLimit for the dataplanes the test creates.
func withHeldLimit(t *testing.T, d time.Duration) {
	old := heldLimit
	heldLimit = d
	t.Cleanup(func() { heldLimit = old })
}

// peerSocket is an AF_PACKET socket on the peer node's end of the veth
// (vB in both beds).
func peerSocket(t *testing.T, peer string) int {
	t.Helper()
	var fd int
	nettest.In(t, peer, func() {
		var err error
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		ifi, err := net.InterfaceByName("vB")
		if err != nil {
			t.Fatal(err)
		}
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Ifindex: ifi.Index}); err != nil {
			t.Fatal(err)
		}
	})
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

// seqFrame is a UDP frame of one flow to dst carrying seq.
func upSeqFrame(dst [6]byte, seq uint32) []byte {
	udp := make([]byte, 8+4)
	binary.BigEndian.PutUint16(udp[0:], 5000)
	binary.BigEndian.PutUint16(udp[2:], 5001)
	binary.BigEndian.PutUint16(udp[4:], uint16(len(udp)))
	binary.BigEndian.PutUint32(udp[8:], seq)
	return nettest.IPv4(dst, peerMAC2, [4]byte{10, 77, 0, 1}, [4]byte{10, 77, 0, 5}, 17, udp)
}

func frameSeq(f []byte) (uint32, bool) {
	if len(f) < 46 || [6]byte(f[6:12]) != peerMAC2 {
		return 0, false
	}
	return binary.BigEndian.Uint32(f[42:]), true
}

// injectSeq sends frames seq first..first+n-1 to dst from the peer node.
func injectSeq(t *testing.T, fd int, dst [6]byte, first, n int) {
	t.Helper()
	for i := range n {
		if _, err := unix.Write(fd, upSeqFrame(dst, uint32(first+i))); err != nil {
			t.Fatal(err)
		}
	}
}

// learnOnPeer makes the uplink (and the node's bridge) know the guest:
// one broadcast out through it.
func learnOnPeer(t *testing.T, d *Dataplane, f *frontend.Frontend, mac [6]byte) {
	t.Helper()
	if err := f.Send(0, ipFrame([6]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, mac)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the guest's broadcast on the tap", func() bool { s, _ := d.UplinkStats(); return s.TxPackets >= 1 })
}

func guestRX(t *testing.T, d *Dataplane, name string) *netdev.Counters {
	t.Helper()
	p, ok := d.Port(name)
	if !ok {
		t.Fatalf("no port %q", name)
	}
	return &p.Vrings()[0].Counters
}

// TestUplinkBackpressure: frames from the uplink for a guest whose RX
// ring is full wait in the device (the tap's queue, the AF_XDP RX ring:
// the worker stops reading it, and sleeps) and arrive, all and in order,
// when the guest gives buffers back: its RX kick wakes the worker
// (heldLimit is far away, so a lost wake-up fails the test). Tap and
// af_xdp, with and without EVENT_IDX.
func TestUplinkBackpressure(t *testing.T) {
	for _, tc := range []struct {
		name     string
		features uint64
		xdp      bool
	}{
		{"tap/event_idx", frontend.DefaultFeatures, false},
		{"tap/no_event_idx", frontend.DefaultFeatures &^ (1 << virtio.FEventIdx), false},
		{"af_xdp/event_idx", frontend.DefaultFeatures, true},
		{"af_xdp/no_event_idx", frontend.DefaultFeatures &^ (1 << virtio.FEventIdx), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			withHeldLimit(t, time.Minute)
			var d *Dataplane
			var peer string
			if tc.xdp {
				b := newXDPBed(t)
				quiet(t, b.node, b.peer)
				d, peer = xdpDataplane(t, b.node, "vA"), b.peer
			} else {
				b := quietBed(t)
				d, peer = uplinkDataplane(t, b.node), b.peer
			}
			const ring, frames = 8, 64
			a := dial(t, addPortOpt(t, d, "a", PortOptions{Network: "red", Uplink: true, Polling: PollInterrupt}),
				frontend.Config{QueueSize: ring, Features: tc.features})
			learnOnPeer(t, d, a, macA)
			injectSeq(t, peerSocket(t, peer), macA, 0, frames)

			// the ring's worth is delivered, one frame is held, the rest
			// stays in the device; the workers sleep
			waitFor(t, "a full RX ring and a held frame", func() bool { s, _ := d.UplinkStats(); return s.RxPackets >= ring+1 })
			waitFor(t, "sleeping workers", func() bool {
				for _, w := range d.workers {
					if !w.sleeping.Load() {
						return false
					}
				}
				return true
			})
			if s, _ := d.UplinkStats(); s.RxPackets != ring+1 {
				t.Errorf("the uplink read %d frames while the guest's %d-entry ring was full, want %d (the ring's and one held)", s.RxPackets, ring, ring+1)
			}
			got, err := a.RecvN(0, frames, 10*time.Second)
			if err != nil {
				t.Fatalf("received %d of %d frames: %v", len(got), frames, err)
			}
			for i, f := range got {
				if seq, ok := frameSeq(f); !ok || seq != uint32(i) {
					t.Fatalf("frame %d: seq %d (ours: %v), want %d: % x", i, seq, ok, i, f[:min(len(f), 64)])
				}
			}
			rx := guestRX(t, d, "a")
			if n := rx.DropNoBuf.Load(); n != 0 {
				t.Errorf("%d frames dropped for want of RX buffers", n)
			}
			if s, _ := d.UplinkStats(); s.RxPackets != frames {
				t.Errorf("uplink read %d frames, want %d", s.RxPackets, frames)
			}
		})
	}
}

// TestTapUplinkHeldLimit: a guest that stops taking frames holds the
// uplink queue up for heldLimit, then loses its frames (counted) while
// another guest on the same dataplane still gets its own; once it takes
// frames again, they arrive.
func TestTapUplinkHeldLimit(t *testing.T) {
	withHeldLimit(t, 20*time.Millisecond)
	b := quietBed(t)
	d := uplinkDataplane(t, b.node)
	const ring = 8
	a := dial(t, addPortOpt(t, d, "a", PortOptions{Network: "red", Uplink: true}), frontend.Config{QueueSize: ring})
	c := dial(t, addPortOpt(t, d, "c", PortOptions{Network: "red", Uplink: true}), frontend.Config{QueueSize: ring})
	learnOnPeer(t, d, a, macA)
	learnOnPeer(t, d, c, macC)
	for _, f := range []*frontend.Frontend{a, c} { // each other's broadcast
		if _, err := f.Recv(0, 5*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	fd := peerSocket(t, b.peer)
	injectSeq(t, fd, macA, 0, 32)
	injectSeq(t, fd, macC, 100, 4)

	got, err := c.RecvN(0, 4, 5*time.Second)
	if err != nil {
		t.Fatalf("c received %d of 4 frames behind a stuck guest: %v", len(got), err)
	}
	rx := guestRX(t, d, "a")
	waitFor(t, "a's frames past its ring dropped", func() bool { return rx.DropNoBuf.Load() >= 32-ring })
	for i := range ring {
		f, err := a.Recv(0, time.Second)
		if err != nil {
			t.Fatalf("a: frame %d of its full ring: %v", i, err)
		}
		if seq, ok := frameSeq(f); !ok || seq != uint32(i) {
			t.Fatalf("a: frame %d has seq %d (ours: %v)", i, seq, ok)
		}
	}
	injectSeq(t, fd, macA, 200, 1)
	f, err := a.Recv(0, 5*time.Second)
	if err != nil {
		t.Fatalf("a after it took frames again: %v", err)
	}
	if seq, ok := frameSeq(f); !ok || seq != 200 {
		t.Errorf("a after it took frames again: seq %d (ours: %v), want 200", seq, ok)
	}
	if n := rx.DropNoBuf.Load(); n != 32-ring {
		t.Errorf("a: %d frames dropped, want %d", n, 32-ring)
	}
}
