package dataplane

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/vhostmq/vhostmq/dataplane/frontend"
	"github.com/vhostmq/vhostmq/dataplane/netdev"
)

// stallPair is two one-pair ports on one interrupt-polling worker, with
// the given watchdog, and both guests' addresses learned.
func stallPair(t *testing.T, wd WatchdogConfig) (d *Dataplane, a, b *frontend.Frontend) {
	t.Helper()
	// The worker's own sweep of parked rings would heal the stalls first.
	d, err := New(Config{CPUs: []int{0}, Logger: testLogger(t), Watchdog: wd, parkedSweep: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	for _, n := range []string{"a", "b"} {
		if err := d.AddPort(netdev.Config{Name: n, Socket: sockPath(t, n), Role: netdev.RoleServer, QueuePairs: 1, MTU: 1500},
			PortOptions{Polling: PollInterrupt}); err != nil {
			t.Fatal(err)
		}
	}
	pa, _ := d.Port("a")
	pb, _ := d.Port("b")
	a = dial(t, pa.Config().Socket, frontend.Config{QueuePairs: 1})
	b = dial(t, pb.Config().Socket, frontend.Config{QueuePairs: 1})
	if !a.Info().HasFeature(29) { // VIRTIO_RING_F_EVENT_IDX: the stall needs it
		t.Fatal("EVENT_IDX not negotiated")
	}
	learn(t, a, b, 1)
	return d, a, b
}

func waitSleeping(t *testing.T, d *Dataplane) {
	t.Helper()
	waitFor(t, "the worker asleep", func() bool { return d.workers[0].sleeping.Load() })
	time.Sleep(20 * time.Millisecond)
}

// TestWatchdogHealsLostKick: a guest's kick goes missing, so with
// EVENT_IDX it never kicks again. Without the watchdog the frame waits
// forever (checked first); with it, the frame and every later one arrive,
// the stall is counted once.
func TestWatchdogHealsLostKick(t *testing.T) {
	frame := udpFrame(macB, macA, 1000, 80, []byte("lost kick"))

	d, a, b := stallPair(t, WatchdogConfig{Bound: -1})
	waitSleeping(t, d)
	if err := a.SendNoKick(0, frame); err != nil {
		t.Fatal(err)
	}
	if err := a.Send(0, udpFrame(macB, macA, 1001, 80, []byte("no kick either"))); err != nil {
		t.Fatal(err)
	}
	if fr, err := b.Recv(0, 500*time.Millisecond); !errors.Is(err, frontend.ErrTimeout) {
		t.Fatalf("without the watchdog a frame behind a lost kick arrived (%x, %v): the test would prove nothing", fr, err)
	}

	d, a, b = stallPair(t, WatchdogConfig{Bound: 50 * time.Millisecond})
	waitSleeping(t, d)
	t0 := time.Now()
	if err := a.SendNoKick(0, frame); err != nil {
		t.Fatal(err)
	}
	fr, err := b.Recv(0, 2*time.Second)
	if err != nil {
		t.Fatalf("frame behind a lost kick: %v", err)
	}
	if !bytes.Equal(fr, frame) {
		t.Fatalf("got %x, want the frame sent", fr)
	}
	t.Logf("healed after %v", time.Since(t0).Round(time.Millisecond))
	if n := portStats(t, d, "a").Queues[0].Stalls; n != 1 {
		t.Errorf("stalls = %d, want 1", n)
	}
	waitSleeping(t, d)
	for i := range 20 {
		if err := a.Send(0, udpFrame(macB, macA, uint16(2000+i), 80, []byte("after"))); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Recv(0, 2*time.Second); err != nil {
			t.Fatalf("frame %d after the heal: %v", i, err)
		}
	}
	if n := portStats(t, d, "a").Queues[0].Stalls; n != 1 {
		t.Errorf("stalls = %d after traffic resumed, want still 1", n)
	}
}

// TestWatchdogRestoresKickFD: the kick eventfd fell out of the worker's
// epoll set (a bug of that kind); the watchdog puts it back and the ring
// is served.
func TestWatchdogRestoresKickFD(t *testing.T) {
	d, a, b := stallPair(t, WatchdogConfig{Bound: 50 * time.Millisecond})
	p, _ := d.Port("a")
	tx := p.Vrings()[1]
	w := d.workers[0]
	tx.Lock()
	fd := tx.KickFD()
	w.unwatch(tx, fd)
	tx.Unlock()
	if w.kickWatched(tx, fd) {
		t.Fatal("kick fd still watched after unwatch")
	}
	waitSleeping(t, d)
	frame := udpFrame(macB, macA, 1000, 80, []byte("kick into the void"))
	if err := a.Send(0, frame); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Recv(0, 2*time.Second); err != nil {
		t.Fatalf("frame whose kick nobody watched: %v", err)
	}
	if !w.kickWatched(tx, fd) {
		t.Error("the watchdog did not put the kick fd back")
	}
	if n := portStats(t, d, "a").Queues[0].Stalls; n != 1 {
		t.Errorf("stalls = %d, want 1", n)
	}
}

// TestWatchdogRestoresPair: a pair fell off every worker's list; the
// watchdog puts it back.
func TestWatchdogRestoresPair(t *testing.T) {
	d, a, b := stallPair(t, WatchdogConfig{Bound: 50 * time.Millisecond})
	pa := d.byName["a"]
	w := d.workers[0]
	w.take(pa.assigns[0])
	w.quiesce(time.Second)
	waitSleeping(t, d)
	if err := a.Send(0, udpFrame(macB, macA, 1000, 80, []byte("orphan"))); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Recv(0, 2*time.Second); err != nil {
		t.Fatalf("frame of a pair on no worker: %v", err)
	}
	if !w.serves(pa.assigns[0]) {
		t.Error("pair not back on its worker")
	}
}

// TestWatchdogQuietUnderTraffic: busy rings on a shared worker in every
// polling mode are never called stalled.
func TestWatchdogQuietUnderTraffic(t *testing.T) {
	for _, mode := range []Polling{PollInterrupt, PollAdaptive, PollBusy} {
		t.Run(mode.String(), func(t *testing.T) {
			d, err := New(Config{CPUs: []int{0}, Logger: testLogger(t), Watchdog: WatchdogConfig{Bound: 20 * time.Millisecond}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(d.Close)
			for _, n := range []string{"a", "b"} {
				if err := d.AddPort(netdev.Config{Name: n, Socket: sockPath(t, n), Role: netdev.RoleServer, QueuePairs: 2, MTU: 1500},
					PortOptions{Polling: mode}); err != nil {
					t.Fatal(err)
				}
			}
			pa, _ := d.Port("a")
			pb, _ := d.Port("b")
			a := dial(t, pa.Config().Socket, frontend.Config{QueuePairs: 2})
			b := dial(t, pb.Config().Socket, frontend.Config{QueuePairs: 2})
			learn(t, a, b, 2)
			deadline := time.Now().Add(time.Second)
			n := 0
			for time.Now().Before(deadline) {
				if err := a.Send(n%2, udpFrame(macB, macA, uint16(n), 80, []byte("x"))); err != nil {
					if errors.Is(err, frontend.ErrRingFull) {
						time.Sleep(time.Millisecond)
						continue
					}
					t.Fatal(err)
				}
				n++
				if n%64 == 0 {
					b.RecvAll(0, 0)
					b.RecvAll(1, 0)
					time.Sleep(time.Duration(n%7) * time.Millisecond)
				}
			}
			for _, name := range []string{"a", "b"} {
				for _, q := range portStats(t, d, name).Queues {
					if q.Stalls != 0 {
						t.Errorf("port %s pair %d: %d stalls under plain traffic", name, q.Pair, q.Stalls)
					}
				}
			}
			t.Logf("%d frames", n)
		})
	}
}

// BenchmarkWatchdogScan: what one watchdog tick costs with nothing stalled
// (64 ports of 2 pairs, 128 TX rings).
func BenchmarkWatchdogScan(b *testing.B) {
	d, err := New(Config{CPUs: []int{0}, Logger: testLogger(b), Watchdog: WatchdogConfig{Bound: -1}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(d.Close)
	for i := range 64 {
		n := "p" + string(rune('A'+i/26)) + string(rune('a'+i%26))
		if err := d.AddPort(netdev.Config{Name: n, Socket: sockPath(b, n), Role: netdev.RoleServer, QueuePairs: 2, MTU: 1500}, PortOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	wd := &watchdog{d: d, cfg: WatchdogConfig{Bound: DefaultStallBound}, seen: map[*netdev.Vring]ringWatch{}}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		wd.scan(time.Now().UnixNano())
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/128, "ns/ring")
}

// TestWatchdogScanAllocatesNothing: the scan runs every 25 ms beside the
// workers; it must not make garbage (nor make the per-packet allocation
// tests, which count every goroutine's allocations, flaky).
func TestWatchdogScanAllocatesNothing(t *testing.T) {
	d, err := New(Config{CPUs: []int{0}, Logger: testLogger(t), Watchdog: WatchdogConfig{Bound: -1}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	a := dial(t, addPort(t, d, "a", netdev.RoleServer, 2), frontend.Config{QueuePairs: 2})
	addPort(t, d, "b", netdev.RoleServer, 1)
	// a's TX ring has a frame waiting that no worker takes: the scan
	// remembers it from then on.
	d.workers[0].halt()
	if err := a.Send(0, broadcastFrom(macA)); err != nil {
		t.Fatal(err)
	}
	wd := &watchdog{d: d, cfg: WatchdogConfig{Bound: time.Hour}, seen: map[*netdev.Vring]ringWatch{}}
	wd.scan(time.Now().UnixNano())
	if len(wd.seen) != 1 {
		t.Fatalf("the scan remembers %d rings, want a's pending one", len(wd.seen))
	}
	if allocs := testing.AllocsPerRun(100, func() { wd.scan(time.Now().UnixNano()) }); allocs != 0 {
		t.Fatalf("a scan allocated %.1f times", allocs)
	}
}

// TestWatchdogLeavesShapedRingAlone: a ring its port's egress limit
// shaped waits for its worker's timer, not for a kick (its guest is not
// asked to kick), so a frame that waits for tokens longer than the bound
// while the worker sleeps is no stall; it leaves when the tokens come.
func TestWatchdogLeavesShapedRingAlone(t *testing.T) {
	d, a, b := stallPair(t, WatchdogConfig{Bound: 50 * time.Millisecond})
	// 1 kB/s: the bucket's floor (two frames) passes at once, then each
	// 1400-byte frame waits about 1.4 s for its tokens
	if err := d.SetBandwidth("a", Bandwidth{Egress: Rate{BitsPerSecond: MinBitsPerSecond}}); err != nil {
		t.Fatal(err)
	}
	waitSleeping(t, d)
	payload := bytes.Repeat([]byte{0x5a}, 1400)
	const n = 4
	for i := range n {
		if err := a.Send(0, udpFrame(macB, macA, uint16(3000+i), 80, payload)); err != nil {
			t.Fatal(err)
		}
	}
	got := 0
	for ; got < n; got++ {
		if _, err := b.Recv(0, 300*time.Millisecond); err != nil {
			break
		}
	}
	if got == n {
		t.Fatalf("all %d frames passed a 1 kB/s limit at once: nothing waited for tokens, the test would prove nothing", n)
	}
	time.Sleep(300 * time.Millisecond) // six bounds with the frames waiting
	if s := portStats(t, d, "a").Queues[0]; s.Stalls != 0 || s.Shaped == 0 {
		t.Errorf("after %d of %d frames passed: stalls %d (want 0: a shaped ring waits for tokens), shaped %d (want > 0)", got, n, s.Stalls, s.Shaped)
	}
	if _, err := b.Recv(0, 3*time.Second); err != nil {
		t.Errorf("frame %d behind the limit: %v", got+1, err)
	}
}
