package dataplane

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vhostmq/vhostmq/dataplane/frontend"
	"github.com/vhostmq/vhostmq/dataplane/netdev"
	"github.com/vhostmq/vhostmq/dataplane/virtio"
)

// Lost wake-ups. A worker that sleeps must not miss a guest's kick, and a
// guest that sleeps (waiting for TX completions or RX frames) must not
// miss an interrupt; either mistake stalls a queue until some unrelated
// event, the way a KubeVirt run once stalled under CPU starvation. These
// tests starve the process (more runnable threads than CPUs), use
// 4-entry rings and interrupt-driven frontends (RxPoll off: Recv and
// WaitTx sleep on the call eventfd and do not look at the ring again when
// no interrupt came), and require every frame to arrive within
// liveBound: a liveness bound, not a speed claim.

const liveBound = 10 * time.Second

// starve oversubscribes the CPUs: GOMAXPROCS twice the CPU count and as
// many goroutines spinning (yielding now and then) as there are CPUs, so
// the kernel preempts the worker thread and the frontends at arbitrary
// points, as a busy node does. (GOMAXPROCS 1 would hide races: the worker
// runs Go code only while no frontend goroutine does.)
func starve(t *testing.T) {
	n := runtime.NumCPU()
	prev := runtime.GOMAXPROCS(2*n + 1)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				for i := 0; i < 200000; i++ {
					_ = i * i
				}
				runtime.Gosched()
			}
		}()
	}
	t.Cleanup(func() {
		close(stop)
		wg.Wait()
		runtime.GOMAXPROCS(prev)
	})
}

// flowFrame is frame seq of stream pair, from src to dst; a stream's
// frames are one flow, so they keep one RX queue.
func flowFrame(dst, src [6]byte, pair, seq, size int) []byte {
	p := make([]byte, size-42)
	binary.BigEndian.PutUint32(p, uint32(seq))
	return udpFrame(dst, src, uint16(1000+pair), 9, p)
}

func TestNoLostWakeups(t *testing.T) {
	// Window 1: a stream sends its next frame only when the last one
	// arrived, so one missed kick or RX interrupt stalls it for good
	// (unless another stream's traffic happens to wake the sleeper: hence
	// a single stream). Window 4 with two descriptors per frame: the TX
	// ring (two frames) fills and the sender sleeps until a TX completion
	// interrupt, the way a Linux guest stops its TX queue.
	type shape struct{ streams, window int }
	for _, mode := range []Polling{PollInterrupt, PollAdaptive} {
		for _, eventIdx := range []bool{true, false} {
			for _, sh := range []shape{{1, 1}, {1, 4}, {4, 4}} {
				name := fmt.Sprintf("%s/event-idx=%v/streams=%d/window=%d", mode, eventIdx, sh.streams, sh.window)
				t.Run(name, func(t *testing.T) { wakeupCase(t, mode, eventIdx, sh.streams, sh.window) })
			}
		}
	}
}

// wakeupCase runs streams streams ((side s, pair p) → (side 1-s, pair p))
// of perStream frames each, at most window in flight per stream, so the
// 4-buffer RX ring never overflows and every frame must arrive.
func wakeupCase(t *testing.T, mode Polling, eventIdx bool, streams, window int) {
	perStream := 1500
	if testing.Short() {
		perStream = 300
	}
	const pairs, ring = 2, 4
	d := newDataplane(t)
	var socks [2]string
	for i, n := range []string{"a", "b"} {
		socks[i] = sockPath(t, n)
		cfg := netdev.Config{Name: n, Socket: socks[i], Role: netdev.RoleServer, QueuePairs: pairs, MTU: 1500}
		if err := d.AddPort(cfg, PortOptions{Polling: mode}); err != nil {
			t.Fatal(err)
		}
	}
	feat := frontend.DefaultFeatures
	if !eventIdx {
		feat &^= 1 << virtio.FEventIdx
	}
	fcfg := frontend.Config{QueuePairs: pairs, QueueSize: ring, Features: feat}
	fes := [2]*frontend.Frontend{dial(t, socks[0], fcfg), dial(t, socks[1], fcfg)}
	macs := [2][6]byte{macA, macB}
	if window == 1 {
		for _, f := range fes {
			if err := f.SetTxLayout(frontend.TxContiguous, false); err != nil {
				t.Fatal(err)
			}
		}
	}
	learn(t, fes[0], fes[1], pairs)
	// Pin each stream's flow to pair p on both sides: a sends it on p (b
	// learns nothing yet), b answers on p, after which both flow tables
	// say p.
	for p := range pairs {
		for s := range 2 {
			if err := fes[s].Send(p, flowFrame(macs[1-s], macs[s], p, 0, 64)); err != nil {
				t.Fatal(err)
			}
			recvAny(t, fes[1-s], pairs, liveBound)
		}
	}
	starve(t)

	var wg sync.WaitGroup
	errs := make(chan error, 2*streams)
	var moved atomic.Int64
	for k := range streams {
		s, p := k%2, k/2
		credit := make(chan struct{}, window)
		for range window {
			credit <- struct{}{}
		}
		tx, rx := fes[s], fes[1-s]
		wg.Add(2)
		go func() { // sender
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(s), uint64(p)))
			for seq := 1; seq <= perStream; seq++ {
				select {
				case <-credit:
				case <-time.After(liveBound):
					errs <- fmt.Errorf("side %d pair %d: frame %d not received within %v", s, p, seq-window, liveBound)
					return
				}
				fr := flowFrame(macs[1-s], macs[s], p, seq, 64+rng.IntN(1437))
				err := tx.Send(p, fr)
				if errors.Is(err, frontend.ErrRingFull) {
					if err = tx.WaitTx(p, liveBound); err == nil {
						err = tx.Send(p, fr)
					} else {
						err = fmt.Errorf("no TX completion interrupt within %v (a lost wake-up): %w", liveBound, err)
					}
				}
				if err != nil {
					errs <- fmt.Errorf("side %d pair %d: send %d: %w", s, p, seq, err)
					return
				}
				switch rng.IntN(8) {
				case 0:
					runtime.Gosched()
				case 1: // around the adaptive worker's idle window
					time.Sleep(time.Duration(rng.IntN(400)) * time.Microsecond)
				}
			}
		}()
		go func() { // receiver
			defer wg.Done()
			for seq := 1; seq <= perStream; seq++ {
				fr, err := rx.Recv(p, liveBound)
				if err != nil {
					errs <- fmt.Errorf("side %d pair %d: frame %d of %d not received within %v (%w): a lost wake-up",
						s, p, seq, perStream, liveBound, err)
					return
				}
				if got := int(binary.BigEndian.Uint32(fr[42:])); got != seq {
					errs <- fmt.Errorf("side %d pair %d: received frame %d, want %d", s, p, got, seq)
					return
				}
				moved.Add(1)
				credit <- struct{}{}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	var sleeps uint64
	for _, ws := range d.WorkerStats() {
		sleeps += ws.Sleeps
	}
	for _, n := range []string{"a", "b"} {
		for _, q := range portStats(t, d, n).Queues {
			if q.Drops.RxNoBuffer != 0 || q.Drops.BadChain != 0 {
				t.Errorf("port %s pair %d: %d no-buffer drops, %d bad chains", n, q.Pair, q.Drops.RxNoBuffer, q.Drops.BadChain)
			}
		}
	}
	t.Logf("%d frames, worker slept %d times", moved.Load(), sleeps)
	if sleeps == 0 {
		t.Error("the worker never slept: the test did not exercise the sleep path")
	}
}

// TestFullRxRingNeedsNoWakeup: frames that find the receiver's RX ring
// full are dropped and counted, never parked, so the sender's chains all
// complete (no TX stall behind a slow receiver) and nothing has to wake
// when the receiver posts buffers again: its next frame simply arrives.
func TestFullRxRingNeedsNoWakeup(t *testing.T) {
	for _, mode := range []Polling{PollInterrupt, PollAdaptive} {
		t.Run(mode.String(), func(t *testing.T) {
			d := newDataplane(t)
			var socks [2]string
			for i, n := range []string{"a", "b"} {
				socks[i] = sockPath(t, n)
				cfg := netdev.Config{Name: n, Socket: socks[i], Role: netdev.RoleServer, QueuePairs: 1, MTU: 1500}
				if err := d.AddPort(cfg, PortOptions{Polling: mode}); err != nil {
					t.Fatal(err)
				}
			}
			fcfg := frontend.Config{QueueSize: 4}
			a, b := dial(t, socks[0], fcfg), dial(t, socks[1], fcfg)
			learn(t, a, b, 1)
			const sent = 12 // three rings' worth, nobody receiving
			for i := 1; i <= sent; i++ {
				if err := sendWait(a, 0, seqFrame(macB, macA, i, 200)); err != nil {
					t.Fatalf("send %d: %v (a TX stall behind a full RX ring)", i, err)
				}
			}
			waitFor(t, "every frame accounted for", func() bool {
				q := portStats(t, d, "b").Queues[0]
				return q.RxPackets-1+q.Drops.RxNoBuffer == sent // -1: learn's broadcast
			})
			got, err := b.RecvAll(0, liveBound)
			if err != nil || len(got) != 4 {
				t.Fatalf("b received %d frames (its ring holds 4): %v", len(got), err)
			}
			if err := sendWait(a, 0, seqFrame(macB, macA, sent+1, 200)); err != nil {
				t.Fatal(err)
			}
			fr, err := b.Recv(0, liveBound)
			if err != nil || binary.BigEndian.Uint32(fr[42:]) != sent+1 {
				t.Fatalf("the frame after b posted buffers again did not arrive within %v: %v", liveBound, err)
			}
		})
	}
}

// sendWait sends fr, first waiting (interrupt-driven) up to liveBound for
// room in the TX ring if it is full.
func sendWait(f *frontend.Frontend, pair int, fr []byte) error {
	err := f.Send(pair, fr)
	if errors.Is(err, frontend.ErrRingFull) {
		if err = f.WaitTx(pair, liveBound); err != nil {
			return fmt.Errorf("no TX completion interrupt within %v: %w", liveBound, err)
		}
		err = f.Send(pair, fr)
	}
	return err
}
