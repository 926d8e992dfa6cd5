package dataplane

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vhostmq/vhostmq/dataplane/frontend"
	"github.com/vhostmq/vhostmq/dataplane/netdev"
	"github.com/vhostmq/vhostmq/dataplane/vhostuser"
	"github.com/vhostmq/vhostmq/dataplane/virtio"
	"github.com/vhostmq/vhostmq/dataplane/vswitch"
)

// The tests in this file drive the whole dataplane (ports, workers,
// switch) with the in-repo vhost-user frontend over real unix sockets and
// memfd guest memory. QEMU and DPDK are the judges in hack/e2e-*.sh.

var macA = [6]byte{0x52, 0x54, 0, 0, 0, 0x0a}
var macB = [6]byte{0x52, 0x54, 0, 0, 0, 0x0b}

func testLogger(t testing.TB) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func newDataplane(t testing.TB, cpus ...int) *Dataplane {
	t.Helper()
	d, err := New(Config{CPUs: cpus, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	return d
}

func sockPath(t testing.TB, name string) string {
	// t.TempDir can exceed the 108-byte sun_path limit; keep it short.
	dir, err := os.MkdirTemp("", "vmq")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, name+".sock")
}

func addPort(t testing.TB, d *Dataplane, name string, role netdev.Role, pairs int) string {
	t.Helper()
	s := sockPath(t, name)
	if err := d.AddPort(netdev.Config{Name: name, Socket: s, Role: role, QueuePairs: pairs, MTU: 1500}, PortOptions{}); err != nil {
		t.Fatal(err)
	}
	return s
}

func dial(t testing.TB, path string, cfg frontend.Config) *frontend.Frontend {
	t.Helper()
	var f *frontend.Frontend
	var err error
	for i := 0; i < 50; i++ {
		if f, err = frontend.Dial(path, cfg); err == nil {
			t.Cleanup(func() { f.Close() })
			return f
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("dial %s: %v", path, err)
	return nil
}

// udpFrame builds an Ethernet/IPv4/UDP frame; the ports pick the flow.
func udpFrame(dst, src [6]byte, sport, dport uint16, payload []byte) []byte {
	b := make([]byte, 0, 42+len(payload))
	b = append(b, dst[:]...)
	b = append(b, src[:]...)
	b = binary.BigEndian.AppendUint16(b, 0x0800)
	ipLen := 20 + 8 + len(payload)
	b = append(b, 0x45, 0, byte(ipLen>>8), byte(ipLen), 0, 0, 0x40, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2)
	b = binary.BigEndian.AppendUint16(b, sport)
	b = binary.BigEndian.AppendUint16(b, dport)
	b = binary.BigEndian.AppendUint16(b, uint16(8+len(payload)))
	b = append(b, 0, 0)
	return append(b, payload...)
}

// reply swaps addresses and ports, so it belongs to the same flow.
func reply(f []byte) []byte {
	r := bytes.Clone(f)
	copy(r[0:6], f[6:12])
	copy(r[6:12], f[0:6])
	copy(r[26:30], f[30:34])
	copy(r[30:34], f[26:30])
	copy(r[34:36], f[36:38])
	copy(r[36:38], f[34:36])
	return r
}

func broadcastFrom(src [6]byte) []byte {
	return udpFrame([6]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, src, 67, 68, []byte("hello"))
}

// recvAny waits for one frame on any pair and returns it with its pair.
func recvAny(t testing.TB, f *frontend.Frontend, pairs int, timeout time.Duration) ([]byte, int) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		for p := range pairs {
			fr, err := f.Recv(p, time.Millisecond)
			if err == nil {
				return fr, p
			}
			if !errors.Is(err, frontend.ErrTimeout) {
				t.Fatalf("recv pair %d: %v", p, err)
			}
		}
	}
	t.Fatalf("no frame within %v", timeout)
	return nil, -1
}

func portStats(t testing.TB, d *Dataplane, name string) PortStats {
	t.Helper()
	for _, ps := range d.Stats() {
		if ps.Name == name {
			return ps
		}
	}
	t.Fatalf("no port %q in stats", name)
	return PortStats{}
}

func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// learn makes the switch learn both guests' MACs.
func learn(t testing.TB, a, b *frontend.Frontend, pairs int) {
	t.Helper()
	if err := a.Send(0, broadcastFrom(macA)); err != nil {
		t.Fatal(err)
	}
	if fr, _ := recvAny(t, b, pairs, 2*time.Second); !bytes.Equal(fr[6:12], macA[:]) {
		t.Fatalf("B got %x, want a frame from A", fr[:12])
	}
	if err := b.Send(0, broadcastFrom(macB)); err != nil {
		t.Fatal(err)
	}
	if fr, _ := recvAny(t, a, pairs, 2*time.Second); !bytes.Equal(fr[6:12], macB[:]) {
		t.Fatalf("A got %x, want a frame from B", fr[:12])
	}
}

func TestNegotiation(t *testing.T) {
	d := newDataplane(t)
	s := addPort(t, d, "a", netdev.RoleServer, 4)
	f := dial(t, s, frontend.Config{QueuePairs: 4, ProtocolFeatures: frontend.DefaultProtocolFeatures | 1<<vhostuser.ProtoConfigureMemSlots | 1<<vhostuser.ProtoNetMTU | 1<<vhostuser.ProtoRARP})
	info := f.Info()
	if info.QueueNum != 4 {
		t.Errorf("GET_QUEUE_NUM = %d, want 4 (queue pairs)", info.QueueNum)
	}
	if info.OfferedFeatures != netdev.OfferedFeatures {
		t.Errorf("offered features %#x, want %#x", info.OfferedFeatures, netdev.OfferedFeatures)
	}
	for _, bit := range []uint{virtio.FVersion1, virtio.FIndirectDesc, virtio.FEventIdx, virtio.NetFMrgRxbuf, virtio.NetFMQ} {
		if !info.HasFeature(bit) {
			t.Errorf("feature bit %d not negotiated", bit)
		}
	}
	for _, bit := range []uint{vhostuser.ProtoMQ, vhostuser.ProtoReplyAck, vhostuser.ProtoConfigureMemSlots, vhostuser.ProtoNetMTU, vhostuser.ProtoRARP, vhostuser.ProtoStatus} {
		if info.OfferedProtocolFeatures&(1<<bit) == 0 {
			t.Errorf("protocol feature %d not offered", bit)
		}
	}
	waitFor(t, "4 enabled pairs", func() bool { return portStats(t, d, "a").EnabledPairs == 4 })

	// Same features after a reconnect.
	f.Close()
	waitFor(t, "disconnect", func() bool { return !portStats(t, d, "a").Connected })
	f2 := dial(t, s, frontend.Config{QueuePairs: 4})
	if f2.Info().OfferedFeatures != info.OfferedFeatures || f2.Info().OfferedProtocolFeatures != info.OfferedProtocolFeatures {
		t.Errorf("features changed across reconnect: %#x/%#x then %#x/%#x", info.OfferedFeatures, info.OfferedProtocolFeatures,
			f2.Info().OfferedFeatures, f2.Info().OfferedProtocolFeatures)
	}
	if got := portStats(t, d, "a").Connects; got != 2 {
		t.Errorf("connects = %d, want 2", got)
	}
	// NET_SET_MTU above the port MTU is refused with a non-zero ack.
	f3 := dial(t, addPort(t, d, "m", netdev.RoleServer, 1), frontend.Config{ProtocolFeatures: frontend.DefaultProtocolFeatures | 1<<vhostuser.ProtoNetMTU})
	var nack *frontend.NackError
	if err := f3.Ctrl(vhostuser.ReqNetSetMTU, vhostuser.EncodeU64(nil, 9000), nil); !errors.As(err, &nack) {
		t.Errorf("NET_SET_MTU 9000 on a 1500 port: err = %v, want a nack", err)
	}
	if err := f3.Ctrl(vhostuser.ReqNetSetMTU, vhostuser.EncodeU64(nil, 1400), nil); err != nil {
		t.Errorf("NET_SET_MTU 1400: %v", err)
	}
}

// TestTrafficEveryQueueBothWays sends a flow from every TX queue of each
// port and checks it arrives intact, and that the reply to a flow arrives
// on the RX queue of the pair the flow was sent from (virtio automatic
// receive steering).
func TestTrafficEveryQueueBothWays(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  frontend.Config
	}{
		{"default", frontend.Config{QueuePairs: 4}},
		{"indirect", frontend.Config{QueuePairs: 4, TxIndirect: true}},
		{"split-header", frontend.Config{QueuePairs: 4, TxLayout: frontend.TxSplitHeader}},
		{"mergeable-small-buffers", frontend.Config{QueuePairs: 4, RxBufSize: 256}},
		{"no-event-idx", frontend.Config{QueuePairs: 4, Features: frontend.DefaultFeatures &^ (1 << virtio.FEventIdx)}},
		{"two-regions", frontend.Config{QueuePairs: 4, Regions: 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newDataplane(t)
			a := dial(t, addPort(t, d, "a", netdev.RoleServer, 4), tc.cfg)
			b := dial(t, addPort(t, d, "b", netdev.RoleServer, 4), tc.cfg)
			learn(t, a, b, 4)
			payload := bytes.Repeat([]byte("0123456789abcdef"), 80) // 1280 B: spans buffers with RxBufSize 256
			for _, dir := range []struct {
				name       string
				from, to   *frontend.Frontend
				src, dst   [6]byte
				fromN, toN string
				sport      uint16 // flows of their own: a flow moves to another pair only after a quiet epoch (vswitch.FlowTable)
			}{{"a->b", a, b, macA, macB, "a", "b", 1000}, {"b->a", b, a, macB, macA, "b", "a", 3000}} {
				for pair := range 4 {
					fr := udpFrame(dir.dst, dir.src, dir.sport+uint16(pair*7), 5201, payload)
					if err := dir.from.Send(pair, fr); err != nil {
						t.Fatalf("%s pair %d: send: %v", dir.name, pair, err)
					}
					got, gotPair := recvAny(t, dir.to, 4, 2*time.Second)
					if !bytes.Equal(got, fr) {
						t.Fatalf("%s pair %d: frame corrupted (%d bytes, want %d)", dir.name, pair, len(got), len(fr))
					}
					// The reply goes back from the pair it arrived on and must
					// reach the sender on the pair the flow left from.
					if err := dir.to.Send(gotPair, reply(fr)); err != nil {
						t.Fatal(err)
					}
					back, backPair := recvAny(t, dir.from, 4, 2*time.Second)
					if !bytes.Equal(back, reply(fr)) {
						t.Fatalf("%s pair %d: reply corrupted", dir.name, pair)
					}
					if backPair != pair {
						t.Errorf("%s: reply to a flow sent on pair %d arrived on pair %d", dir.name, pair, backPair)
					}
				}
			}
			for _, name := range []string{"a", "b"} {
				ps := portStats(t, d, name)
				for _, q := range ps.Queues {
					if q.RxPackets == 0 || q.TxPackets == 0 {
						t.Errorf("port %s pair %d: rx %d tx %d packets, want both > 0", name, q.Pair, q.RxPackets, q.TxPackets)
					}
					if q.Drops != (QueueDrops{}) {
						t.Errorf("port %s pair %d: drops %+v", name, q.Pair, q.Drops)
					}
				}
			}
		})
	}
}

// TestFlowOnTwoPairsStaysOnOne: a guest that sends one flow on two pairs
// at once (a forwarder does) gets every reply on the pair that sent it
// first, in order, until that pair has been silent for a whole epoch of
// the flow table; then the replies follow the other pair. A burst of
// replies to one pair arrives whole and in order (a run of frames steered
// to one of several rings).
func TestFlowOnTwoPairsStaysOnOne(t *testing.T) {
	d := newDataplane(t)
	a := dial(t, addPort(t, d, "a", netdev.RoleServer, 2), frontend.Config{QueuePairs: 2})
	b := dial(t, addPort(t, d, "b", netdev.RoleServer, 2), frontend.Config{QueuePairs: 2})
	learn(t, a, b, 2)
	flow := udpFrame(macA, macB, 4242, 5201, []byte("from b")) // b's flow, to a
	// replies is a burst of n frames of the flow from a to b, numbered
	replies := func(n int) [][]byte {
		var out [][]byte
		for i := range n {
			out = append(out, udpFrame(macB, macA, 5201, 4242, []byte{'r', byte(i)}))
		}
		return out
	}
	expectOn := func(what string, want int, n int) {
		t.Helper()
		if got, err := a.SendBurst(1, replies(n)); err != nil || got != n {
			t.Fatalf("%s: a queued %d of %d replies: %v", what, got, n, err)
		}
		frames, err := b.RecvN(want, n, 2*time.Second)
		if err != nil {
			other, _ := b.RecvAll(1-want, 0)
			t.Fatalf("%s: %d of %d replies on pair %d (%d on pair %d): %v", what, len(frames), n, want, len(other), 1-want, err)
		}
		for i, fr := range frames {
			if p := fr[len(fr)-2:]; p[0] != 'r' || int(p[1]) != i {
				t.Fatalf("%s: reply %d on pair %d is %q, want %q", what, i, want, p, []byte{'r', byte(i)})
			}
		}
	}
	// the flow leaves b on pair 0, then on pair 1, again and again
	for range 4 {
		for pair := range 2 {
			if err := b.Send(pair, flow); err != nil {
				t.Fatal(err)
			}
			recvAny(t, a, 2, 2*time.Second)
		}
	}
	expectOn("the flow sent on both pairs", 0, 24)
	// pair 0 falls silent for the flow: after a whole epoch it moves
	quiet := time.Now().Add(3 * vswitch.FlowEpoch)
	for time.Now().Before(quiet) {
		if err := b.Send(1, flow); err != nil {
			t.Fatal(err)
		}
		recvAny(t, a, 2, 2*time.Second)
		time.Sleep(20 * time.Millisecond)
	}
	expectOn("the flow sent on pair 1 alone", 1, 24)
}

// TestPairsEnableDisable: rings stay disabled until SET_VRING_ENABLE, and
// traffic only uses enabled pairs.
func TestPairsEnableDisable(t *testing.T) {
	d := newDataplane(t)
	a := dial(t, addPort(t, d, "a", netdev.RoleServer, 4), frontend.Config{QueuePairs: 4})
	b := dial(t, addPort(t, d, "b", netdev.RoleServer, 4), frontend.Config{QueuePairs: 4, EnablePairs: 1})
	waitFor(t, "b with one enabled pair", func() bool { return portStats(t, d, "b").EnabledPairs == 1 })
	learn(t, a, b, 1)
	for i := range 16 {
		if err := a.Send(i%4, udpFrame(macB, macA, uint16(2000+i), 80, []byte("x"))); err != nil {
			t.Fatal(err)
		}
	}
	frames, err := b.RecvN(0, 16, 2*time.Second)
	if err != nil {
		t.Fatalf("received %d of 16 on pair 0: %v", len(frames), err)
	}
	if err := b.SetPairsEnabled(4); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b with 4 enabled pairs", func() bool { return portStats(t, d, "b").EnabledPairs == 4 })
	seen := map[int]bool{}
	for i := range 64 {
		if err := a.Send(i%4, udpFrame(macB, macA, uint16(3000+i*13), 80, []byte("y"))); err != nil {
			t.Fatal(err)
		}
		_, p := recvAny(t, b, 4, 2*time.Second)
		seen[p] = true
	}
	if len(seen) < 2 {
		t.Errorf("64 flows all arrived on pairs %v after enabling 4", seen)
	}
	if err := b.SetPairsEnabled(1); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b back to one pair", func() bool { return portStats(t, d, "b").EnabledPairs == 1 })
	for i := range 8 {
		a.Send(i%4, udpFrame(macB, macA, uint16(4000+i*17), 80, []byte("z")))
	}
	if frames, err := b.RecvN(0, 8, 2*time.Second); err != nil {
		t.Fatalf("after disabling pairs 1-3: got %d of 8 on pair 0: %v", len(frames), err)
	}
}

// TestReconnectServerRole: the frontend goes away and comes back (QEMU
// restarting with reconnect=1); the port serves the new session.
func TestReconnectServerRole(t *testing.T) {
	d := newDataplane(t)
	sa := addPort(t, d, "a", netdev.RoleServer, 2)
	a := dial(t, sa, frontend.Config{QueuePairs: 2})
	b := dial(t, addPort(t, d, "b", netdev.RoleServer, 2), frontend.Config{QueuePairs: 2})
	learn(t, a, b, 2)
	a.Close()
	waitFor(t, "a disconnected", func() bool { return !portStats(t, d, "a").Connected })
	a = dial(t, sa, frontend.Config{QueuePairs: 2})
	learn(t, a, b, 2)
	if c := portStats(t, d, "a").Connects; c != 2 {
		t.Errorf("connects = %d, want 2", c)
	}
}

// TestReconnectClientRole: the frontend listens (QEMU server=on, as in
// KubeVirt); the dataplane dials, and after the dataplane itself is
// restarted the frontend's setup is replayed on the new connection with the
// same guest memory and traffic resumes.
func TestReconnectClientRole(t *testing.T) {
	sa, sb := sockPath(t, "a"), sockPath(t, "b")
	la, err := frontend.Listen(sa)
	if err != nil {
		t.Fatal(err)
	}
	defer la.Close()
	lb, err := frontend.Listen(sb)
	if err != nil {
		t.Fatal(err)
	}
	defer lb.Close()
	start := func() *Dataplane {
		d, err := New(Config{Logger: testLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range []struct{ n, s string }{{"a", sa}, {"b", sb}} {
			if err := d.AddPort(netdev.Config{Name: p.n, Socket: p.s, Role: netdev.RoleClient, QueuePairs: 2, MTU: 1500}, PortOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		return d
	}
	d := start()
	a, err := la.Accept(frontend.Config{QueuePairs: 2}, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := lb.Accept(frontend.Config{QueuePairs: 2}, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	learn(t, a, b, 2)

	// The dataplane dies and comes back; the frontends keep their memory.
	d.Close()
	t0 := time.Now()
	d = start()
	defer d.Close()
	for _, x := range []struct {
		l *frontend.Listener
		f *frontend.Frontend
	}{{la, a}, {lb, b}} {
		c, err := x.l.AcceptConn(5 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if err := x.f.Reattach(c); err != nil {
			t.Fatal(err)
		}
	}
	learn(t, a, b, 2)
	t.Logf("traffic resumed %v after the dataplane restarted", time.Since(t0).Round(time.Millisecond))
}

// TestMemTableChangeUnderTraffic re-sends SET_MEM_TABLE with a different
// region layout while frames flow; none may be lost or corrupted, and no
// ring may break.
func TestMemTableChangeUnderTraffic(t *testing.T) {
	d := newDataplane(t)
	a := dial(t, addPort(t, d, "a", netdev.RoleServer, 2), frontend.Config{QueuePairs: 2})
	b := dial(t, addPort(t, d, "b", netdev.RoleServer, 2), frontend.Config{QueuePairs: 2, RxBufSize: 2048})
	learn(t, a, b, 2)
	const n = 400
	var got atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		deadline := time.Now().Add(10 * time.Second)
		for got.Load() < n && time.Now().Before(deadline) {
			for p := range 2 {
				frs, err := b.RecvAll(p, time.Millisecond)
				if err == nil {
					for _, fr := range frs {
						if len(fr) != 42+100 || fr[42] != 9 || fr[141] != 9 {
							t.Errorf("corrupted frame: %d bytes: %x", len(fr), fr[:min(len(fr), 64)])
						}
					}
					got.Add(int64(len(frs)))
				}
			}
		}
	}()
	for i := range n {
		fr := udpFrame(macB, macA, uint16(i%251), 9, bytes.Repeat([]byte{byte(9)}, 100))
		for {
			err := a.Send(i%2, fr)
			if err == nil {
				break
			}
			if !errors.Is(err, frontend.ErrRingFull) {
				t.Fatal(err)
			}
			a.WaitTx(i%2, time.Second)
		}
		if i%50 == 25 {
			// 1..4 regions of the same memory, as QEMU does on hotplug.
			if err := a.SetMemTable(1 + (i/50)%4); err != nil {
				t.Fatal(err)
			}
			if err := b.SetMemTable(1 + (i/50+1)%4); err != nil {
				t.Fatal(err)
			}
		}
		if i%8 == 7 {
			time.Sleep(time.Millisecond) // let the guest side keep up; drops are not what this tests
		}
	}
	wg.Wait()
	ps := portStats(t, d, "b")
	var drops uint64
	for _, q := range ps.Queues {
		drops += q.Drops.RxNoBuffer
		if q.Drops.BadChain != 0 {
			t.Errorf("pair %d: a ring broke during memory table changes", q.Pair)
		}
	}
	if got.Load()+int64(drops) != n {
		t.Errorf("received %d + dropped %d (no buffer) of %d frames", got.Load(), drops, n)
	}
	if got.Load() < n/2 {
		t.Errorf("only %d of %d frames arrived", got.Load(), n)
	}
}

// TestHostileChainStopsOnlyItsRing: a looping descriptor chain stops that
// vring with a counter; the port's other pairs and other ports keep
// forwarding.
func TestHostileChainStopsOnlyItsRing(t *testing.T) {
	d := newDataplane(t)
	sa := addPort(t, d, "a", netdev.RoleServer, 2)
	a := dial(t, sa, frontend.Config{QueuePairs: 2})
	b := dial(t, addPort(t, d, "b", netdev.RoleServer, 2), frontend.Config{QueuePairs: 2})
	learn(t, a, b, 2)
	ids, err := a.ReserveDescs(1, 2) // vring 1 = TX of pair 0
	if err != nil {
		t.Fatal(err)
	}
	off, _ := a.Alloc(64, 16)
	// A loop of empty descriptors: only the hop limit ends the walk. (A loop
	// of non-empty ones ends at the MTU and is dropped as oversize.)
	a.WriteDesc(1, int(ids[0]), a.GPA(off), 0, virtio.DescFNext, ids[1])
	a.WriteDesc(1, int(ids[1]), a.GPA(off), 0, virtio.DescFNext, ids[0])
	a.PublishAvail(1, ids[0])
	a.Kick(1)
	waitFor(t, "bad chain counted", func() bool { return portStats(t, d, "a").Queues[0].Drops.BadChain == 1 })
	// Pair 1 of a still works, and so does b.
	fr := udpFrame(macB, macA, 7, 7, []byte("still alive"))
	if err := a.Send(1, fr); err != nil {
		t.Fatal(err)
	}
	if got, _ := recvAny(t, b, 2, 2*time.Second); !bytes.Equal(got, fr) {
		t.Fatal("frame from the healthy pair corrupted")
	}
	// A reconnect sets the ring up again.
	a.Close()
	waitFor(t, "a disconnected", func() bool { return !portStats(t, d, "a").Connected })
	a = dial(t, sa, frontend.Config{QueuePairs: 2})
	if err := a.Send(0, fr); err != nil {
		t.Fatal(err)
	}
	if got, _ := recvAny(t, b, 2, 2*time.Second); !bytes.Equal(got, fr) {
		t.Fatal("frame after reconnect corrupted")
	}
}

// TestMalformedMessageEndsOnlyThatSession: garbage on one port's socket
// closes that connection; the dataplane and the other port keep running,
// and the bad port accepts a new session.
func TestMalformedMessageEndsOnlyThatSession(t *testing.T) {
	d := newDataplane(t)
	sa := addPort(t, d, "a", netdev.RoleServer, 1)
	a := dial(t, sa, frontend.Config{})
	b := dial(t, addPort(t, d, "b", netdev.RoleServer, 1), frontend.Config{})
	c := dial(t, addPort(t, d, "c", netdev.RoleServer, 1), frontend.Config{})
	for _, bad := range []struct {
		req     vhostuser.Request
		payload []byte
	}{
		{vhostuser.Request(999), nil},                                                     // unknown request
		{vhostuser.ReqSetVringNum, []byte{1, 2, 3}},                                       // short payload
		{vhostuser.ReqSetVringNum, vhostuser.VringState{Index: 77, Num: 256}.Encode(nil)}, // vring out of range
		{vhostuser.ReqSetVringNum, vhostuser.VringState{Index: 0, Num: 100}.Encode(nil)},  // not a power of 2
		{vhostuser.ReqSetFeatures, vhostuser.EncodeU64(nil, 1<<63)},                       // unoffered feature
	} {
		if err := a.Conn().WriteMessage(bad.req, 0, bad.payload, nil); err != nil {
			t.Fatal(err)
		}
		waitFor(t, fmt.Sprintf("a's session closed after bad %s", bad.req), func() bool { return !portStats(t, d, "a").Connected })
		a.Close()
		a = dial(t, sa, frontend.Config{})
	}
	learn(t, b, c, 1) // b's guest sends from macA, c's from macB (port security: theirs now)
	macOfA := [6]byte{0x52, 0x54, 0, 0, 0, 0x0c}
	fr := udpFrame([6]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, macOfA, 1, 1, []byte("a is back"))
	if err := a.Send(0, fr); err != nil {
		t.Fatal(err)
	}
	if got, _ := recvAny(t, b, 1, 2*time.Second); !bytes.Equal(got, fr) {
		t.Fatal("a's frame did not reach b after the new session")
	}
}

// TestMTU: a frame longer than the port MTU allows is dropped and counted.
func TestMTU(t *testing.T) {
	d := newDataplane(t)
	a := dial(t, addPort(t, d, "a", netdev.RoleServer, 1), frontend.Config{TxBufSize: 4096})
	b := dial(t, addPort(t, d, "b", netdev.RoleServer, 1), frontend.Config{})
	learn(t, a, b, 1)
	big := udpFrame(macB, macA, 1, 1, make([]byte, 1500)) // 1542 > 1500+18
	if err := a.Send(0, big); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "mtu drop", func() bool { return portStats(t, d, "a").Queues[0].Drops.MTU == 1 })
	ok := udpFrame(macB, macA, 1, 1, make([]byte, 1500-28)) // IP packet of exactly 1500
	if err := a.Send(0, ok); err != nil {
		t.Fatal(err)
	}
	if got, _ := recvAny(t, b, 1, 2*time.Second); !bytes.Equal(got, ok) {
		t.Fatal("full-MTU frame corrupted")
	}
}

// TestForwardingAllocatesNothing runs worker passes by hand (the worker
// goroutine stopped) and checks that moving a burst allocates nothing.
func TestForwardingAllocatesNothing(t *testing.T) {
	d := newDataplane(t)
	a := dial(t, addPort(t, d, "a", netdev.RoleServer, 1), frontend.Config{QueueSize: 1024})
	b := dial(t, addPort(t, d, "b", netdev.RoleServer, 1), frontend.Config{QueueSize: 1024})
	learn(t, a, b, 1)
	w := d.workers[0]
	w.halt()
	frames := make([][]byte, 0, 256)
	for i := range 256 {
		frames = append(frames, udpFrame(macB, macA, uint16(i), 9, make([]byte, 64)))
	}
	if n, err := a.SendBurst(0, frames); err != nil || n != 256 {
		t.Fatalf("queued %d of 256: %v", n, err)
	}
	before := portStats(t, d, "b").Queues[0].RxPackets
	allocs := testing.AllocsPerRun(5, func() {
		if !w.pass() {
			t.Fatal("no work")
		}
	})
	if allocs != 0 {
		t.Errorf("a forwarding pass of %d frames allocated %.1f times", burstSize, allocs)
	}
	if got := portStats(t, d, "b").Queues[0].RxPackets - before; got != 6*burstSize {
		t.Errorf("b received %d frames, want %d", got, 6*burstSize)
	}
}

// TestManyPairsAndMemSlots: 128 queue pairs (the vhost-user maximum) with
// 1024-entry rings, memory set up region by region with ADD_MEM_REG.
func TestManyPairsAndMemSlots(t *testing.T) {
	d := newDataplane(t)
	cfg := frontend.Config{QueuePairs: 128, QueueSize: 1024, UseMemSlots: true, Regions: 12,
		ProtocolFeatures: frontend.DefaultProtocolFeatures | 1<<vhostuser.ProtoConfigureMemSlots}
	a := dial(t, addPort(t, d, "a", netdev.RoleServer, 128), cfg)
	b := dial(t, addPort(t, d, "b", netdev.RoleServer, 128), cfg)
	if got := a.Info().MaxMemSlots; got < 12 {
		t.Fatalf("GET_MAX_MEM_SLOTS = %d, want ≥ 12", got)
	}
	waitFor(t, "128 enabled pairs", func() bool { return portStats(t, d, "b").EnabledPairs == 128 })
	learn(t, a, b, 128)
	for _, pair := range []int{1, 63, 127} {
		fr := udpFrame(macB, macA, uint16(pair), 1, []byte("far pair"))
		if err := a.Send(pair, fr); err != nil {
			t.Fatal(err)
		}
		if got, _ := recvAny(t, b, 128, 2*time.Second); !bytes.Equal(got, fr) {
			t.Fatalf("pair %d: frame corrupted", pair)
		}
	}
	if q := portStats(t, d, "a").Queues[127]; q.TxPackets != 1 {
		t.Errorf("pair 127 carried %d frames, want 1", q.TxPackets)
	}
}

// TestRemovePortUnderTraffic removes a port while another floods it.
func TestRemovePortUnderTraffic(t *testing.T) {
	d := newDataplane(t)
	a := dial(t, addPort(t, d, "a", netdev.RoleServer, 2), frontend.Config{QueuePairs: 2})
	dial(t, addPort(t, d, "b", netdev.RoleServer, 2), frontend.Config{QueuePairs: 2})
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if err := a.Send(i%2, broadcastFrom(macA)); err != nil {
				a.WaitTx(i%2, 10*time.Millisecond)
			}
		}
	}()
	time.Sleep(50 * time.Millisecond)
	if err := d.RemovePort("b"); err != nil {
		t.Fatal(err)
	}
	if err := d.RemovePort("b"); !errors.Is(err, ErrNoPort) {
		t.Errorf("second remove: %v, want ErrNoPort", err)
	}
	time.Sleep(50 * time.Millisecond)
	close(stop)
	<-done
	if len(d.Stats()) != 1 {
		t.Errorf("stats list %d ports, want 1", len(d.Stats()))
	}
}

// TestRepeatedAddMemReg: QEMU before 8.1 sends ADD_MEM_REG (and later
// REM_MEM_REG) once per queue pair for the same region. Each must succeed,
// and the region must stay mapped until the last REM.
func TestRepeatedAddMemReg(t *testing.T) {
	d := newDataplane(t)
	cfg := frontend.Config{QueuePairs: 2, UseMemSlots: true,
		ProtocolFeatures: frontend.DefaultProtocolFeatures | 1<<vhostuser.ProtoConfigureMemSlots}
	a := dial(t, addPort(t, d, "a", netdev.RoleServer, 2), cfg)
	b := dial(t, addPort(t, d, "b", netdev.RoleServer, 2), cfg)
	regs := a.Regions()
	for range 3 { // pairs 1..3 of a 4-pair QEMU NIC add it again
		if err := a.AddMemRegion(regs[0]); err != nil {
			t.Fatalf("repeated ADD_MEM_REG: %v", err)
		}
	}
	for range 3 {
		if err := a.RemMemRegion(regs[0]); err != nil {
			t.Fatalf("REM_MEM_REG of a region added 4 times: %v", err)
		}
	}
	learn(t, a, b, 2) // still mapped: traffic flows
	if err := a.RemMemRegion(regs[0]); err != nil {
		t.Fatalf("last REM_MEM_REG: %v", err)
	}
	var nack *frontend.NackError
	if err := a.RemMemRegion(regs[0]); !errors.As(err, &nack) {
		t.Errorf("REM_MEM_REG of a region no longer mapped: %v, want a nack", err)
	}
}

// TestWorkerHealth: a sleeping worker is healthy, one that stops making
// progress or has stopped is not.
func TestWorkerHealth(t *testing.T) {
	d := newDataplane(t)
	waitFor(t, "worker asleep", func() bool { return d.workers[0].sleeping.Load() })
	if h := d.WorkerHealth(); len(h) != 1 || !h[0].Healthy {
		t.Fatalf("idle worker: %+v", h)
	}
	w := d.workers[0]
	// Pretend it is stuck in a pass: awake, and no loop since long ago.
	w.stopping.Store(true)
	w.wake()
	<-w.done
	w.stopping.Store(false)
	w.sleeping.Store(false)
	w.seenPasses, w.seenAt = w.passes.Load(), time.Now().Add(-3*time.Second)
	if h := d.WorkerHealth(); h[0].Healthy || !strings.Contains(h[0].Reason, "no progress") {
		t.Errorf("stuck worker: %+v", h)
	}
	w.stopping.Store(true)
	if h := d.WorkerHealth(); h[0].Healthy || h[0].Reason != "worker stopped" {
		t.Errorf("stopped worker: %+v", h)
	}
	w.done = make(chan struct{}) // let Close's stop() return
	close(w.done)
}
