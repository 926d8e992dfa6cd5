package dataplane

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vhostmq/vhostmq/dataplane/balance"
	"github.com/vhostmq/vhostmq/dataplane/frontend"
	"github.com/vhostmq/vhostmq/dataplane/netdev"
)

func newBalancedDataplane(t *testing.T, topo balance.Topology, rc RebalanceConfig) *Dataplane {
	t.Helper()
	d, err := New(Config{CPUs: []int{0, 1}, Topology: topo, Rebalance: rc, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	return d
}

func pairCPUs(t *testing.T, d *Dataplane, port string) []int {
	t.Helper()
	var out []int
	for _, q := range portStats(t, d, port).Queues {
		out = append(out, q.CPU)
	}
	return out
}

// TestPlacementStaysOnOneNUMANode: without CPUs given, a port's pairs go
// to distinct workers of one NUMA node; across nodes only when
// configured. The topology is injected (this machine has one node).
func TestPlacementStaysOnOneNUMANode(t *testing.T) {
	for _, tc := range []struct {
		name  string
		topo  balance.Topology
		cross bool
		want  [][]int // by port added: its pairs' CPUs
	}{
		{"one node", balance.Topology{0: 0, 1: 0}, false, [][]int{{0, 1}, {1, 0}}},
		{"two nodes", balance.Topology{0: 0, 1: 1}, false, [][]int{{0, 0}, {1, 1}}},
		{"two nodes, crossNUMA", balance.Topology{0: 0, 1: 1}, true, [][]int{{0, 1}, {1, 0}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newBalancedDataplane(t, tc.topo, RebalanceConfig{CrossNUMA: tc.cross})
			for i, want := range tc.want {
				name := fmt.Sprintf("p%d", i)
				addPort(t, d, name, netdev.RoleServer, 2)
				if got := pairCPUs(t, d, name); fmt.Sprint(got) != fmt.Sprint(want) {
					t.Errorf("port %s: pairs on CPUs %v, want %v", name, got, want)
				}
				for _, q := range portStats(t, d, name).Queues {
					if q.NUMA != tc.topo.Node(q.CPU) {
						t.Errorf("port %s pair %d: NUMA %d, want %d", name, q.Pair, q.NUMA, tc.topo.Node(q.CPU))
					}
				}
			}
		})
	}
}

func TestRebalanceConfigErrorsNameTheField(t *testing.T) {
	for _, tc := range []struct {
		cfg   RebalanceConfig
		field string
	}{
		{RebalanceConfig{Interval: time.Millisecond}, "rebalance.interval"},
		{RebalanceConfig{Interval: -time.Second}, "rebalance.interval"},
		{RebalanceConfig{Threshold: 101}, "rebalance.threshold"},
		{RebalanceConfig{Improvement: -1}, "rebalance.improvement"},
	} {
		_, err := New(Config{Rebalance: tc.cfg, Logger: testLogger(t)})
		if err == nil || !containsField(err, tc.field) {
			t.Errorf("%+v: err %v, want one naming %s", tc.cfg, err, tc.field)
		}
	}
}

func containsField(err error, field string) bool {
	return err != nil && len(err.Error()) >= len(field) && err.Error()[:len(field)] == field
}

// runStreams sends numbered frames on every pair of both ports, at most
// window in flight per stream (below the RX ring size: no drop is
// allowed), and checks that each stream's frames arrive complete and in
// order. It runs until stop, given the frames received so far, returns
// true, and returns the frames received.
func runStreams(t *testing.T, fes [2]*frontend.Frontend, pairs, window int, stop func(received int64) bool) int64 {
	t.Helper()
	macs := [2][6]byte{macA, macB}
	var wg sync.WaitGroup
	errs := make(chan error, 4*pairs)
	var quit atomic.Bool
	var total atomic.Int64
	for k := range 2 * pairs {
		s, p := k%2, k/2
		credit := make(chan struct{}, window)
		for range window {
			credit <- struct{}{}
		}
		tx, rx := fes[s], fes[1-s]
		var sent atomic.Int64
		var sending atomic.Bool
		sending.Store(true)
		wg.Add(2)
		go func() {
			defer wg.Done()
			defer sending.Store(false)
			for seq := 1; !quit.Load(); seq++ {
				select {
				case <-credit:
				case <-time.After(liveBound):
					errs <- fmt.Errorf("side %d pair %d: frame %d not received within %v", s, p, seq-window, liveBound)
					quit.Store(true)
					return
				}
				fr := flowFrame(macs[1-s], macs[s], p, seq, 64)
				err := tx.Send(p, fr)
				if errors.Is(err, frontend.ErrRingFull) {
					if err = tx.WaitTx(p, liveBound); err == nil {
						err = tx.Send(p, fr)
					}
				}
				if err != nil {
					errs <- fmt.Errorf("side %d pair %d: send %d: %w", s, p, seq, err)
					quit.Store(true)
					return
				}
				sent.Store(int64(seq))
			}
		}()
		go func() {
			defer wg.Done()
			var waited time.Duration
			for seq := int64(1); ; {
				const poll = 20 * time.Millisecond
				fr, err := rx.Recv(p, poll)
				if errors.Is(err, frontend.ErrTimeout) {
					if !sending.Load() && seq > sent.Load() {
						return
					}
					if waited += poll; waited > liveBound {
						errs <- fmt.Errorf("side %d pair %d: frame %d of %d not received within %v", s, p, seq, sent.Load(), liveBound)
						quit.Store(true)
						return
					}
					continue
				}
				waited = 0
				if err != nil {
					errs <- fmt.Errorf("side %d pair %d: recv: %w", s, p, err)
					quit.Store(true)
					return
				}
				if got := int64(binary.BigEndian.Uint32(fr[42:])); got != seq {
					errs <- fmt.Errorf("side %d pair %d: received frame %d, want %d (lost or reordered)", s, p, got, seq)
					quit.Store(true)
					return
				}
				seq++
				total.Add(1)
				credit <- struct{}{}
			}
		}()
	}
	go func() {
		for !quit.Load() {
			if stop(total.Load()) {
				quit.Store(true)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	wg.Wait()
	quit.Store(true)
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	return total.Load()
}

// twoPortsOnOneWorker adds ports a and b with pairs queue pairs each, all
// served by CPU 0, connects Go frontends and pins each pair's flow to
// that pair on both sides.
func twoPortsOnOneWorker(t *testing.T, d *Dataplane, pairs int) [2]*frontend.Frontend {
	t.Helper()
	var fes [2]*frontend.Frontend
	cpus := make([]int, pairs)
	for i, n := range []string{"a", "b"} {
		s := sockPath(t, n)
		if err := d.AddPort(netdev.Config{Name: n, Socket: s, Role: netdev.RoleServer, QueuePairs: pairs, MTU: 1500}, PortOptions{CPUs: cpus}); err != nil {
			t.Fatal(err)
		}
		fes[i] = dial(t, s, frontend.Config{QueuePairs: pairs, QueueSize: 256})
	}
	learn(t, fes[0], fes[1], pairs)
	macs := [2][6]byte{macA, macB}
	for p := range pairs {
		for s := range 2 {
			if err := fes[s].Send(p, flowFrame(macs[1-s], macs[s], p, 0, 64)); err != nil {
				t.Fatal(err)
			}
			recvAny(t, fes[1-s], pairs, liveBound)
		}
	}
	for _, n := range []string{"a", "b"} {
		for _, c := range pairCPUs(t, d, n) {
			if c != 0 {
				t.Fatalf("port %s starts with a pair on CPU %d", n, c)
			}
		}
	}
	return fes
}

// TestRebalancerMovesQueuesUnderTraffic: two ports with two pairs each all
// start on worker 0 of two; with traffic on every pair the rebalancer
// moves pairs to worker 1 (logging each move), and every stream's frames
// arrive, none lost, none reordered, across the moves. Throughput before
// and after is logged, not asserted.
func TestRebalancerMovesQueuesUnderTraffic(t *testing.T) {
	const pairs = 2
	d := newBalancedDataplane(t, balance.Topology{0: 0, 1: 0}, RebalanceConfig{Interval: 300 * time.Millisecond, Threshold: 1, Improvement: 25})
	fes := twoPortsOnOneWorker(t, d, pairs)
	var movedAt time.Time
	var atMove int64
	start := time.Now()
	deadline := start.Add(20 * time.Second)
	total := runStreams(t, fes, pairs, 32, func(n int64) bool {
		if movedAt.IsZero() && len(d.RebalanceStatus().LastMoves) > 0 {
			movedAt, atMove = time.Now(), n
		}
		return (!movedAt.IsZero() && time.Since(movedAt) > time.Second) || time.Now().After(deadline)
	})
	end := time.Now()
	st := d.RebalanceStatus()
	if len(st.LastMoves) == 0 {
		t.Fatalf("no queue moved in %v; last run: %+v", time.Since(start).Round(time.Millisecond), st.LastRun)
	}
	for _, m := range st.LastMoves {
		if m.Failures != "" || m.FromCPU != 0 || m.ToCPU != 1 || m.Manual {
			t.Errorf("move %+v: want an automatic move from CPU 0 to CPU 1", m)
		}
		t.Logf("moved %s/%d from CPU %d to CPU %d at %.1f%% load", m.Port, m.Pair, m.FromCPU, m.ToCPU, 100*m.Load)
	}
	// Each port's pairs started together on CPU 0: the plan takes one of
	// each to CPU 1 (keeping a port's pairs apart) rather than both of one.
	for _, n := range []string{"a", "b"} {
		if cpus := pairCPUs(t, d, n); cpus[0] == cpus[1] {
			t.Errorf("port %s: pairs still share CPU %d", n, cpus[0])
		}
	}
	for _, n := range []string{"a", "b"} {
		for _, q := range portStats(t, d, n).Queues {
			if q.Drops.RxNoBuffer != 0 || q.Drops.BadChain != 0 || q.Drops.NoDestination != 0 {
				t.Errorf("port %s pair %d: drops %+v", n, q.Pair, q.Drops)
			}
			if q.Bursts == 0 || q.BusyNs == 0 {
				t.Errorf("port %s pair %d: %d bursts, %d ns busy: not measured", n, q.Pair, q.Bursts, q.BusyNs)
			}
			t.Logf("port %s pair %d on CPU %d: %d bursts, %.0f ns/burst, %.0f ns/frame", n, q.Pair, q.CPU, q.Bursts,
				float64(q.BusyNs)/float64(q.Bursts), float64(q.BusyNs)/float64(q.TxPackets))
		}
	}
	before, after := movedAt.Sub(start).Seconds(), end.Sub(movedAt).Seconds()
	t.Logf("%d frames in order; before the first move %.0f frames/s over %.2fs, after %.0f frames/s over %.2fs",
		total, float64(atMove)/before, before, float64(total-atMove)/after, after)
}

// TestManualRebalance: with the automatic rebalancer off, Rebalance
// measures over its window and moves; the next call leaves the moved
// pairs where they went.
func TestManualRebalance(t *testing.T) {
	const pairs = 2
	d := newBalancedDataplane(t, balance.Topology{0: 0, 1: 0}, RebalanceConfig{})
	fes := twoPortsOnOneWorker(t, d, pairs)
	var runs []RebalanceRun
	n := runStreams(t, fes, pairs, 32, func(int64) bool {
		runs = append(runs, d.Rebalance(200*time.Millisecond))
		return len(runs) == 3
	})
	if len(runs[0].Moves) == 0 {
		t.Fatalf("first manual run moved nothing: %s (loads %v)", runs[0].Reason, runs[0].Before)
	}
	for _, m := range runs[0].Moves {
		if !m.Manual || m.Failures != "" {
			t.Errorf("move %+v", m)
		}
	}
	// A moved pair settles: the next run leaves it where it went.
	for _, m := range runs[0].Moves {
		for _, m1 := range runs[1].Moves {
			if m1.Port == m.Port && m1.Pair == m.Pair {
				t.Errorf("%s/%d moved again in the next run: %+v", m.Port, m.Pair, m1)
			}
		}
	}
	if n := len(runs[1].Moves) + len(runs[2].Moves); n > 0 {
		t.Logf("later runs moved %d more (loads %v, %v)", n, runs[1].Before, runs[2].Before)
	}
	if n == 0 {
		t.Fatal("no traffic")
	}
	if st := d.RebalanceStatus(); st.Runs != 3 || st.LastRun == nil || !st.LastRun.Manual {
		t.Errorf("status %+v", st)
	}
}

// TestMoveOfRemovedPortRefused: a move planned before RemovePort does not
// put the pair back on a worker.
func TestMoveOfRemovedPortRefused(t *testing.T) {
	d := newBalancedDataplane(t, nil, RebalanceConfig{})
	addPort(t, d, "a", netdev.RoleServer, 1)
	d.mu.Lock()
	a := d.byName["a"].assigns[0]
	d.mu.Unlock()
	from := a.port.workers[0].Load()
	to := d.workers[1-from.id]
	if err := d.RemovePort("a"); err != nil {
		t.Fatal(err)
	}
	d.placeMu.Lock()
	err := d.move(a, from, to)
	d.placeMu.Unlock()
	if err == nil {
		t.Fatal("moved a removed port's pair")
	}
	for _, w := range d.workers {
		if n := len(w.list.Load().list); n != 0 {
			t.Errorf("worker %d serves %d pairs after the port is gone", w.id, n)
		}
	}
}
