package dataplane

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/vhostmq/vhostmq/dataplane/frontend"
	"github.com/vhostmq/vhostmq/dataplane/netdev"
	"github.com/vhostmq/vhostmq/dataplane/virtio"
)

// holdBed is one interrupt-polling worker and one-pair ports named by
// names, their frontends with cfgs, every guest's MAC learned.
func holdBed(t *testing.T, names []string, macs [][6]byte, cfgs []frontend.Config) (*Dataplane, []*frontend.Frontend) {
	t.Helper()
	d, err := New(Config{CPUs: []int{0}, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	var fes []*frontend.Frontend
	for i, n := range names {
		s := sockPath(t, n)
		if err := d.AddPort(netdev.Config{Name: n, Socket: s, Role: netdev.RoleServer, QueuePairs: 1, MTU: 1500},
			PortOptions{Polling: PollInterrupt}); err != nil {
			t.Fatal(err)
		}
		fes = append(fes, dial(t, s, cfgs[i]))
	}
	for i, f := range fes {
		if err := f.Send(0, broadcastFrom(macs[i])); err != nil {
			t.Fatal(err)
		}
		for j, g := range fes {
			if j != i {
				if _, err := g.Recv(0, 2*time.Second); err != nil {
					t.Fatalf("%s did not get %s's broadcast: %v", names[j], names[i], err)
				}
			}
		}
	}
	return d, fes
}

func numbered(dst, src [6]byte, i int) []byte {
	return udpFrame(dst, src, 1000, 80, binary.BigEndian.AppendUint32([]byte("hold"), uint32(i)))
}

// TestHeldFramesArriveInOrder: 256 frames into an 8-entry RX ring whose
// guest takes them slowly all arrive, in order, none dropped; the worker
// sleeps on the destination's kick meanwhile (interrupt polling), with
// EVENT_IDX and without. The hold bound is far (10 s) so that a machine
// under load cannot make a hold expire, and the run must end well before
// it: a lost wake-up would show as a hold waiting out its bound.
func TestHeldFramesArriveInOrder(t *testing.T) {
	withHeldLimit(t, 10*time.Second)
	for _, eventIdx := range []bool{true, false} {
		t.Run(fmt.Sprintf("eventIdx=%v", eventIdx), func(t *testing.T) {
			t0 := time.Now()
			feats := frontend.DefaultFeatures
			if !eventIdx {
				feats &^= 1 << virtio.FEventIdx
			}
			d, fes := holdBed(t, []string{"a", "b"}, [][6]byte{macA, macB},
				[]frontend.Config{{Features: feats}, {Features: feats, QueueSize: 8}})
			a, b := fes[0], fes[1]
			const n = 256
			done := make(chan error, 1)
			go func() {
				for i := range n {
					if err := sendRetry(a, 0, numbered(macB, macA, i)); err != nil {
						done <- err
						return
					}
				}
				done <- nil
			}()
			for i := range n {
				fr, err := b.Recv(0, 5*time.Second)
				if err != nil {
					t.Fatalf("frame %d: %v (b: %+v)", i, err, portStats(t, d, "b").Queues[0])
				}
				if want := numbered(macB, macA, i); !bytes.Equal(fr, want) {
					t.Fatalf("frame %d out of order: got seq %x", i, fr[42:])
				}
				if i%16 == 0 {
					time.Sleep(2 * time.Millisecond) // a slow guest: its ring fills
				}
			}
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			q := portStats(t, d, "b").Queues[0]
			if q.Drops.RxNoBuffer != 0 || q.Drops.RxHoldExpired != 0 {
				t.Errorf("drops: rxNoBuffer %d, expired %d; want none", q.Drops.RxNoBuffer, q.Drops.RxHoldExpired)
			}
			if q.Held == 0 {
				t.Error("no frame was held: the test did not fill the ring")
			}
			if el := time.Since(t0); el > 5*time.Second {
				t.Errorf("took %v: a held frame waited for its bound (a lost wake-up)", el)
			}
			t.Logf("held %d times, worker slept %d times", q.Held, d.workers[0].sleeps.Load())
		})
	}
}

// TestStuckGuestHoldsOthersBriefly: b takes nothing; a's frames to b are
// held for heldLimit once, then dropped at once until b takes a frame,
// while a's frames to c behind them arrive, all of them, soon: after one
// hold, not one per frame. The bound is a second long so that the time
// tells one hold (about 1 s) from two or more (2 s and up) on a busy
// machine too.
func TestStuckGuestHoldsOthersBriefly(t *testing.T) {
	withHeldLimit(t, time.Second)
	d, fes := holdBed(t, []string{"a", "b", "c"}, [][6]byte{macA, macB, macC},
		[]frontend.Config{{}, {QueueSize: 8}, {}})
	a, b, c := fes[0], fes[1], fes[2]
	t0 := time.Now()
	const n = 40
	for i := range n {
		if err := sendRetry(a, 0, numbered(macB, macA, i)); err != nil {
			t.Fatal(err)
		}
		if err := sendRetry(a, 0, numbered(macC, macA, i)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range n {
		fr, err := c.Recv(0, 2*time.Second)
		if err != nil {
			t.Fatalf("c's frame %d: %v", i, err)
		}
		if !bytes.Equal(fr, numbered(macC, macA, i)) {
			t.Fatalf("c's frame %d out of order", i)
		}
	}
	el := time.Since(t0)
	if el >= 2*heldLimit {
		t.Errorf("c got its frames after %v, two holds of %v or more: a stuck b held them too long", el, heldLimit)
	}
	q := portStats(t, d, "b").Queues[0]
	if q.Drops.RxHoldExpired != 1 {
		t.Errorf("hold expiries %d, want 1 (then b's frames are dropped at once)", q.Drops.RxHoldExpired)
	}
	if want := uint64(n - 8); q.Drops.RxNoBuffer != want {
		t.Errorf("b rxNoBuffer %d, want %d (all but the 8 that fit)", q.Drops.RxNoBuffer, want)
	}
	// b wakes up: it gets the 8 that fit, and then frames again
	got, err := b.RecvAll(0, 100*time.Millisecond)
	if err != nil || len(got) != 8 {
		t.Fatalf("b's ring held %d frames, want 8: %v", len(got), err)
	}
	if err := sendRetry(a, 0, numbered(macB, macA, 999)); err != nil {
		t.Fatal(err)
	}
	if fr, err := b.Recv(0, 2*time.Second); err != nil || !bytes.Equal(fr, numbered(macB, macA, 999)) {
		t.Fatalf("b after it woke: %v", err)
	}
	t.Logf("c's %d frames in %v", n, el.Round(time.Millisecond))
}

// TestHoldMovedLeavesNoKickCopy: a pair whose frame is held while its
// worker sleeps moves to another worker, and its port is removed later:
// the kick eventfd copy the first worker waited on is closed, not leaked
// in its epoll set, and the frame is delivered by the new worker.
func TestHoldMovedLeavesNoKickCopy(t *testing.T) {
	withHeldLimit(t, time.Minute)
	d, err := New(Config{CPUs: []int{0, 1}, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	fes := map[string]*frontend.Frontend{}
	for i, n := range []string{"a", "b"} {
		s := sockPath(t, n)
		if err := d.AddPort(netdev.Config{Name: n, Socket: s, Role: netdev.RoleServer, QueuePairs: 1, MTU: 1500},
			PortOptions{Polling: PollInterrupt, CPUs: []int{0}}); err != nil {
			t.Fatal(err)
		}
		cfg := frontend.Config{}
		if i == 1 {
			cfg.QueueSize = 8
		}
		fes[n] = dial(t, s, cfg)
	}
	a, b := fes["a"], fes["b"]
	learn(t, a, b, 1)
	fds := func() int { n, _ := os.ReadDir("/proc/self/fd"); return len(n) }
	before := fds()
	for i := range 9 { // 8 fit, the 9th is held
		if err := a.Send(0, numbered(macB, macA, i)); err != nil {
			t.Fatal(err)
		}
	}
	pa := d.byName["a"]
	w0, w1 := d.workers[0], d.workers[1]
	waitFor(t, "a frame held while the worker sleeps", func() bool {
		return pa.assigns[0].holding.Load() && w0.sleeping.Load()
	})
	if fds() != before+1 {
		t.Logf("fds %d -> %d while armed (the kick copy)", before, fds())
	}
	d.placeMu.Lock()
	err = d.move(pa.assigns[0], w0, w1)
	d.placeMu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	// b takes its 8 frames; the held 9th comes through the new worker
	got, err := b.RecvN(0, 9, 3*time.Second)
	if err != nil {
		t.Fatalf("b got %d of 9 frames after the move: %v", len(got), err)
	}
	waitFor(t, "the first worker asleep again", func() bool { return w0.sleeping.Load() })
	time.Sleep(20 * time.Millisecond)
	if n := fds(); n > before {
		t.Errorf("open fds %d -> %d: a kick copy leaked", before, n)
	}
}
