package dataplane

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vhostmq/vhostmq/dataplane/frontend"
	"github.com/vhostmq/vhostmq/dataplane/netdev"
)

// activeRig is a worker serving a and b, which talk, and idle ports
// c0..c(n-1), all connected.
type activeRig struct {
	d     *Dataplane
	w     *worker
	a, b  *frontend.Frontend
	idle  []*frontend.Frontend
	macsC [][6]byte
}

func newActiveRig(t *testing.T, cfg Config, polling Polling, n int) *activeRig {
	t.Helper()
	if cfg.CPUs == nil {
		cfg.CPUs = []int{0}
	}
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	r := &activeRig{d: d, w: d.workers[0]}
	add := func(name string) *frontend.Frontend {
		s := sockPath(t, name)
		if err := d.AddPort(netdev.Config{Name: name, Socket: s, Role: netdev.RoleServer, QueuePairs: 1, MTU: 1500}, PortOptions{Polling: polling}); err != nil {
			t.Fatal(err)
		}
		return dial(t, s, frontend.Config{})
	}
	r.a, r.b = add("a"), add("b")
	learn(t, r.a, r.b, 1)
	for i := range n {
		r.idle = append(r.idle, add(fmt.Sprintf("c%d", i)))
		r.macsC = append(r.macsC, [6]byte{0x52, 0x54, 0, 0, 1, byte(i)})
	}
	// every ring started (a start pokes the worker, which then looks at
	// its parked rings: the tests want to see the sweep and kicks alone)
	waitFor(t, "every port's pair enabled", func() bool {
		for _, ps := range d.Stats() {
			if ps.EnabledPairs != 1 {
				return false
			}
		}
		return true
	})
	return r
}

// settle waits until every ring is parked and the worker asleep, with no
// poke on its way (a ring's start pokes from the frontend's session
// goroutine, which a busy machine may run late): a later frame is found by
// its kick or the sweep only.
func settle(t *testing.T, r *activeRig) {
	t.Helper()
	quiet := func() bool { return r.w.activeN.Load() == 0 && r.w.sleeping.Load() && !r.w.poked.Load() }
	waitFor(t, "every ring parked and the worker asleep", quiet)
	time.Sleep(100 * time.Millisecond)
	waitFor(t, "every ring parked and the worker asleep, still", quiet)
}

// TestIdleRingsPark: rings that moved nothing for parkIdle leave the
// worker's passes, while a pair with traffic stays in them; a parked
// ring's kick brings it back while the worker is busy with the other,
// and its frame arrives.
func TestIdleRingsPark(t *testing.T) {
	for _, polling := range []Polling{PollAdaptive, PollInterrupt} {
		t.Run(polling.String(), func(t *testing.T) {
			// no sweep: it could find c5's frame between the guest's
			// avail publish and its look at the kick flag, and the ring
			// would come back without a kick (a CI run saw it under -race)
			r := newActiveRig(t, Config{parkedSweep: -1}, polling, 16)
			// a -> b all along, from another goroutine
			stop := make(chan struct{})
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				fr := udpFrame(macB, macA, 1, 2, make([]byte, 64))
				for {
					select {
					case <-stop:
						return
					default:
					}
					r.a.ReclaimTx(0)
					r.a.Send(0, fr)
					for {
						if _, err := r.b.Recv(0, 0); err != nil {
							break
						}
					}
					time.Sleep(50 * time.Microsecond)
				}
			}()
			defer func() { close(stop); wg.Wait() }()
			// parked, with no poke on its way: a ring's start pokes from
			// the frontend's session goroutine, which a busy machine may
			// run late, and the poke looks at every parked ring: it could
			// find c5's frame before c5 looked at the kick flag (a CI run
			// saw no kick so)
			quiet := func() bool { return r.w.activeN.Load() <= 2 && !r.w.poked.Load() }
			waitFor(t, "the idle rings to park", quiet)
			time.Sleep(100 * time.Millisecond)
			waitFor(t, "the idle rings to park, still", quiet)
			before := portStats(t, r.d, "c5").Queues[0].Kicks
			// to a: the traffic goroutine drains b, a only sends
			frame := udpFrame(macA, r.macsC[5], 7, 7, []byte("from a parked ring"))
			if err := r.idle[5].Send(0, frame); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(2 * time.Second)
			for {
				got, err := r.a.Recv(0, time.Until(deadline))
				if err != nil {
					t.Fatalf("the parked ring's frame did not arrive: %v (active rings %d)", err, r.w.activeN.Load())
				}
				if bytes.Equal(got, frame) {
					break
				}
			}
			if k := portStats(t, r.d, "c5").Queues[0].Kicks - before; k < 1 {
				t.Errorf("c5 kicked %d times to leave its parked ring: it was not parked", k)
			}
		})
	}
}

// TestParkedRingSwept: a parked ring whose guest's kick is lost is found
// by the worker's sweep within sweepInterval (the watchdog off): nothing
// relies on kicks alone.
func TestParkedRingSwept(t *testing.T) {
	r := newActiveRig(t, Config{Watchdog: WatchdogConfig{Bound: -1}}, PollInterrupt, 4)
	settle(t, r)
	frame := udpFrame(macB, r.macsC[2], 7, 7, []byte("kick lost"))
	t0 := time.Now()
	if err := r.idle[2].SendNoKick(0, frame); err != nil {
		t.Fatal(err)
	}
	got, err := r.b.Recv(0, 2*time.Second)
	if err != nil || !bytes.Equal(got, frame) {
		t.Fatalf("frame behind a lost kick on a parked ring: %x, %v", got, err)
	}
	t.Logf("swept after %v (sweepInterval %v)", time.Since(t0).Round(time.Millisecond), time.Duration(sweepInterval))
	if k := portStats(t, r.d, "c2").Queues[0].Kicks; k != 0 {
		t.Errorf("c2 kicked %d times: the test meant to lose its kick", k)
	}
	// no kick came within stallWait: a stall, counted as the watchdog would
	waitFor(t, "the lost kick counted as a stall", func() bool { return portStats(t, r.d, "c2").Queues[0].Stalls == 1 })
}

// sweptWithoutKick lets the rig settle, has c0 publish a frame to b
// without its kick, and waits for the sweep to deliver it.
func sweptWithoutKick(t *testing.T, r *activeRig) {
	t.Helper()
	settle(t, r)
	frame := udpFrame(macB, r.macsC[0], 7, 7, []byte("kick late"))
	if err := r.idle[0].SendNoKick(0, frame); err != nil {
		t.Fatal(err)
	}
	if got, err := r.b.Recv(0, 2*time.Second); err != nil || !bytes.Equal(got, frame) {
		t.Fatalf("frame before its kick: %x, %v", got, err)
	}
}

// TestSuspectedRingMoves: a ring the sweep found with chains and no kick
// (a suspect, judged after stallWait) may move to another worker before
// it is judged. Its old worker forgets it without reading it (the new one
// writes it from the move on: the race detector watches), the new one
// does not inherit the suspicion, every frame arrives, and once the moves
// stop a kick that never comes is still judged a stall, once.
func TestSuspectedRingMoves(t *testing.T) {
	r := newActiveRig(t, Config{CPUs: []int{0, 1}, Watchdog: WatchdogConfig{Bound: -1}, parkedSweep: 2 * time.Millisecond}, PollInterrupt, 1)
	pc := r.d.byName["c0"]
	send := func(i int) {
		t.Helper()
		frame := udpFrame(macB, r.macsC[0], 7, uint16(i), []byte("no kick"))
		if err := r.idle[0].SendNoKick(0, frame); err != nil {
			t.Fatal(err)
		}
		if got, err := r.b.Recv(0, 2*time.Second); err != nil || !bytes.Equal(got, frame) {
			t.Fatalf("frame %d: got %x, %v", i, got, err)
		}
	}
	for i := range 60 {
		send(i)
		time.Sleep(time.Duration(i%4) * time.Millisecond) // parked again, then swept: a suspect
		from := pc.workers[0].Load()
		to := r.d.workers[0]
		if to == from {
			to = r.d.workers[1]
		}
		r.d.placeMu.Lock()
		err := r.d.move(pc.assigns[0], from, to)
		r.d.placeMu.Unlock()
		if err != nil {
			t.Fatalf("move %d: %v", i, err)
		}
	}
	time.Sleep(time.Duration(2 * stallWait)) // suspects left from the last moves judged
	before := portStats(t, r.d, "c0").Queues[0].Stalls
	w := pc.workers[0].Load()
	waitFor(t, "c0 parked on its worker", func() bool { return w.activeN.Load() == 0 })
	send(60)
	waitFor(t, "the missing kick counted as a stall", func() bool { return portStats(t, r.d, "c0").Queues[0].Stalls > before })
	time.Sleep(time.Duration(2 * stallWait))
	if n := portStats(t, r.d, "c0").Queues[0].Stalls; n != before+1 {
		t.Errorf("stalls %d after the moves, %d after one missing kick: want one more", before, n)
	}
}

// TestKickAfterStallIsTold: a kick that comes after the sweep declared
// its ring stalled (later than the stall bound) is logged as late, so a
// late guest can be told from a lost kick.
func TestKickAfterStallIsTold(t *testing.T) {
	var logs syncBuffer
	r := newActiveRig(t, Config{Watchdog: WatchdogConfig{Bound: -1}, Logger: slog.New(slog.NewTextHandler(&logs, nil))}, PollInterrupt, 1)
	sweptWithoutKick(t, r)
	waitFor(t, "the missing kick counted as a stall", func() bool { return portStats(t, r.d, "c0").Queues[0].Stalls == 1 })
	if err := r.idle[0].Kick(1); err != nil { // vring 1: its TX
		t.Fatal(err)
	}
	waitFor(t, "the late kick logged", func() bool { return strings.Contains(logs.String(), "kick came late") })
	if n := portStats(t, r.d, "c0").Queues[0].Stalls; n != 1 {
		t.Errorf("stalls = %d, want 1 (the late kick does not undo it)", n)
	}
}

// TestSweptLateKickIsNoStall: a guest that publishes chains and kicks
// only later (its vCPU descheduled in between) is served by the sweep,
// and its late kick keeps that from counting as a stall.
func TestSweptLateKickIsNoStall(t *testing.T) {
	r := newActiveRig(t, Config{Watchdog: WatchdogConfig{Bound: -1}}, PollInterrupt, 1)
	sweptWithoutKick(t, r)
	if err := r.idle[0].Kick(1); err != nil { // vring 1: its TX
		t.Fatal(err)
	}
	time.Sleep(time.Duration(2 * stallWait))
	if n := portStats(t, r.d, "c0").Queues[0].Stalls; n != 0 {
		t.Errorf("stalls = %d for a kick that came late, want 0", n)
	}
}

// TestParkedRingStartsAfterReconnect: a parked ring whose frontend
// reconnects (new ring memory, new kick eventfd) is served again: the
// ring's start pokes the worker.
func TestParkedRingStartsAfterReconnect(t *testing.T) {
	r := newActiveRig(t, Config{Watchdog: WatchdogConfig{Bound: -1}, parkedSweep: -1}, PollInterrupt, 2)
	waitFor(t, "every ring parked", func() bool { return r.w.activeN.Load() == 0 && r.w.sleeping.Load() })
	p, _ := r.d.Port("c1")
	sock := p.Config().Socket
	r.idle[1].Close()
	waitFor(t, "c1 disconnected", func() bool { return !p.Connected() })
	c := dial(t, sock, frontend.Config{})
	frame := udpFrame(macB, r.macsC[1], 7, 7, []byte("after a reconnect"))
	if err := c.Send(0, frame); err != nil {
		t.Fatal(err)
	}
	if got, err := r.b.Recv(0, 2*time.Second); err != nil || !bytes.Equal(got, frame) {
		t.Fatalf("frame from a reconnected frontend on a parked ring: %x, %v", got, err)
	}
}

// TestPassCostFollowsActiveRings: with every idle ring parked, a pass
// visits the rings with work only (the active set's size is what a pass
// costs: 2 here, whatever the number of idle ports).
func TestPassCostFollowsActiveRings(t *testing.T) {
	r := newActiveRig(t, Config{}, PollAdaptive, 64)
	waitFor(t, "the idle rings to park", func() bool { return r.w.activeN.Load() == 0 && r.w.sleeping.Load() })
	w := r.w
	w.halt()
	// halt made every ring active again, as a restarted worker would find them
	w.pass()
	if n := len(w.active); n != 66 {
		t.Fatalf("%d active rings after halt, want all 66", n)
	}
	w.housekeep(nanotime() + parkIdle)
	if n := len(w.active); n != 0 {
		t.Errorf("%d active rings after parkIdle without work, want 0 (parked %d)", n, len(w.parked))
	}
	if err := r.a.Send(0, udpFrame(macB, macA, 1, 2, []byte("wake"))); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for len(w.active) == 0 && time.Now().Before(deadline) {
		n, err := unix.EpollWait(w.epfd, w.events[:], 100)
		if err != nil {
			continue
		}
		w.handleEvents(n, nanotime())
	}
	if len(w.active) != 1 || w.active[0].port.dev.Name() != "a" {
		t.Fatalf("after a's kick the active set is %d rings, want a's only", len(w.active))
	}
	if !w.pass() {
		t.Fatal("a's frame was not served")
	}
}

// TestHousekeepingKeepsWakeUps: a wake-up (a stop, a changed list) that a
// look for kicks drains while the worker is awake is remembered, so the
// loop begins another iteration instead of sleeping on it (a Close that
// waited forever for its worker, seen in CI).
func TestHousekeepingKeepsWakeUps(t *testing.T) {
	r := newActiveRig(t, Config{}, PollInterrupt, 2)
	w := r.w
	w.halt()
	w.pass()
	w.housekeep(nanotime() + parkIdle) // everything parks: housekeeping looks for kicks
	if len(w.parked) == 0 {
		t.Fatal("no ring parked")
	}
	w.woken = false
	w.wake()
	w.housekeep(nanotime() + 2*parkIdle)
	if !w.woken {
		t.Error("housekeeping drained a wake-up and forgot it: the loop would sleep on it")
	}
}
