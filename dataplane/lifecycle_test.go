package dataplane

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/vhostmq/vhostmq/dataplane/frontend"
	"github.com/vhostmq/vhostmq/dataplane/netdev"
)

// TestRingLifecycleChurn is the reproduction for queues that are never
// served again after a ring-state change. Guest "a" behaves like Linux's
// virtio_ring (with EVENT_IDX it kicks only when vring_need_event says so)
// behind QEMU's vhost-user-net (every ring set up at start; pairs enabled
// and disabled with SET_VRING_ENABLE as for `ethtool -L`; a pair's
// vhost_dev stopped with GET_VRING_BASE and started again with the memory
// table re-sent and the base it was given, while the guest keeps sending on
// it; the memory table re-sent under traffic; every pair restarted at
// once), in random order. After each change, every enabled pair must carry
// a frame out of the guest and one back in within a bound, and every frame
// the guest sent on a stopped pair must come out once it runs again. The
// watchdog is off: this is about the rings themselves.
func TestRingLifecycleChurn(t *testing.T) {
	const pairs = 4
	iterations := 1000
	if testing.Short() {
		iterations = 200
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, seed>>1))
	for _, slots := range []bool{false, true} {
		t.Run(fmt.Sprintf("memslots=%v", slots), func(t *testing.T) {
			d, err := New(Config{CPUs: []int{0, 1}, Logger: testLogger(t), Watchdog: WatchdogConfig{Bound: -1}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(d.Close)
			for _, n := range []string{"a", "b"} {
				// ControlRate: the churn sends far more than any QEMU
				// (bounds_test.go tests the budget)
				if err := d.AddPort(netdev.Config{Name: n, Socket: sockPath(t, n), Role: netdev.RoleServer, QueuePairs: pairs, MTU: 1500, ControlRate: -1},
					PortOptions{Polling: PollInterrupt}); err != nil {
					t.Fatal(err)
				}
			}
			pa, _ := d.Port("a")
			pb, _ := d.Port("b")
			cfg := frontend.Config{QueuePairs: pairs, QueueSize: 64, UseMemSlots: slots,
				ProtocolFeatures: frontend.DefaultProtocolFeatures | 1<<15 /* CONFIGURE_MEM_SLOTS */}
			a := dial(t, pa.Config().Socket, cfg)
			b := dial(t, pb.Config().Socket, frontend.Config{QueuePairs: pairs})
			learn(t, a, b, pairs)
			c := churn{t: t, d: d, a: a, b: b, pairs: pairs, enabled: pairs, rng: rng}
			deadline := time.Now().Add(20 * time.Second)
			i := 0
			for ; i < iterations && time.Now().Before(deadline); i++ {
				c.step(i)
			}
			t.Logf("%d changes, %d frames each way, ops %v", i, c.seq, c.ops)
		})
	}
}

type churn struct {
	t       *testing.T
	d       *Dataplane
	a, b    *frontend.Frontend
	pairs   int
	enabled int
	rng     *rand.Rand
	seq     uint32
	ops     map[string]int
}

func (c *churn) step(i int) {
	t := c.t
	if c.ops == nil {
		c.ops = map[string]int{}
	}
	op := c.rng.IntN(5)
	var late []uint32 // frames sent on a stopped pair
	switch op {
	case 0, 1: // ethtool -L combined n
		c.enabled = 1 + c.rng.IntN(c.pairs)
		c.ops["enable"]++
		if err := c.a.SetPairsEnabled(c.enabled); err != nil {
			t.Fatalf("change %d: SetPairsEnabled(%d): %v", i, c.enabled, err)
		}
	case 2: // one pair's vhost_dev stopped and started, guest sending meanwhile
		p := c.rng.IntN(c.enabled)
		c.ops["restart"]++
		rb, tb, err := c.a.StopPair(p)
		if err != nil {
			t.Fatalf("change %d: StopPair(%d): %v", i, p, err)
		}
		for range 1 + c.rng.IntN(3) {
			late = append(late, c.send(p))
		}
		if c.rng.IntN(2) == 0 {
			// another pair's vhost_dev sends the memory table meanwhile:
			// the stopped ring must stay stopped (spec "Ring states")
			if err := c.a.SetMemTable(1); err != nil {
				t.Fatalf("change %d: SetMemTable: %v", i, err)
			}
		}
		c.quiet(i, late, "from a stopped ring")
		if err := c.a.StartPair(p, rb, tb, true); err != nil {
			t.Fatalf("change %d: StartPair(%d): %v", i, p, err)
		}
	case 3: // the memory table again, under traffic
		c.ops["memtable"]++
		late = append(late, c.send(c.rng.IntN(c.enabled)))
		if err := c.a.SetMemTable(1 + c.rng.IntN(2)); err != nil {
			t.Fatalf("change %d: SetMemTable: %v", i, err)
		}
	case 4: // every pair stopped, then started in order (vhost_net_stop/start)
		c.ops["restart-all"]++
		type base struct{ rx, tx uint16 }
		bases := make([]base, c.pairs)
		for p := range c.pairs {
			rb, tb, err := c.a.StopPair(p)
			if err != nil {
				t.Fatalf("change %d: StopPair(%d): %v", i, p, err)
			}
			bases[p] = base{rb, tb}
		}
		late = append(late, c.send(c.rng.IntN(c.enabled)))
		for p := range c.pairs {
			if err := c.a.StartPair(p, bases[p].rx, bases[p].tx, p < c.enabled); err != nil {
				t.Fatalf("change %d: StartPair(%d): %v", i, p, err)
			}
		}
	}
	// Every enabled pair carries a frame out, and its reply comes back.
	want := map[uint32]bool{}
	for _, s := range late {
		want[s] = true
	}
	for p := range c.enabled {
		want[c.send(p)] = true
	}
	c.expect(i, c.b, want, "out of guest a")
	back := map[uint32]bool{}
	for s := range want {
		c.seq++
		f := udpFrame(macA, macB, uint16(s%997)+1000, 80, seqPayload(c.seq))
		if err := sendRetry(c.b, int(s)%c.pairs, f); err != nil {
			t.Fatalf("change %d: b send: %v", i, err)
		}
		back[c.seq] = true
	}
	c.expect(i, c.a, back, "into guest a")
}

// quiet checks that none of the numbered frames reaches b for a while.
func (c *churn) quiet(i int, seqs []uint32, what string) {
	deadline := time.Now().Add(5 * time.Millisecond)
	for time.Now().Before(deadline) {
		for p := range c.pairs {
			fr, err := c.b.Recv(p, 0)
			if err != nil || len(fr) < 50 || string(fr[42:46]) != "seq:" {
				continue
			}
			s := binary.BigEndian.Uint32(fr[46:50])
			for _, x := range seqs {
				if x == s {
					c.t.Fatalf("change %d: frame %d came %s", i, s, what)
				}
			}
		}
		time.Sleep(200 * time.Microsecond)
	}
}

// send puts one numbered frame on guest a's TX pair p.
func (c *churn) send(p int) uint32 {
	c.seq++
	f := udpFrame(macB, macA, uint16(c.seq%997)+1000, 80, seqPayload(c.seq))
	if err := sendRetry(c.a, p, f); err != nil {
		c.t.Fatalf("a send on pair %d: %v", p, err)
	}
	return c.seq
}

func sendRetry(f *frontend.Frontend, p int, frame []byte) error {
	deadline := time.Now().Add(2 * time.Second)
	for {
		err := f.Send(p, frame)
		if !errors.Is(err, frontend.ErrRingFull) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(time.Millisecond)
	}
}

func seqPayload(s uint32) []byte { return binary.BigEndian.AppendUint32([]byte("seq:"), s) }

// expect waits until every numbered frame in want arrived at f (any pair),
// within a bound; a frame numbered twice is a duplicate.
func (c *churn) expect(i int, f *frontend.Frontend, want map[uint32]bool, what string) {
	t := c.t
	deadline := time.Now().Add(3 * time.Second)
	for len(want) > 0 {
		if time.Now().After(deadline) {
			var missing []uint32
			for s := range want {
				missing = append(missing, s)
			}
			t.Fatalf("change %d (%v so far): frames %v never came %s within 3 s; ports: a %+v",
				i, c.ops, missing, what, portStats(t, c.d, "a").Queues)
		}
		got := false
		for p := range c.pairs {
			fr, err := f.Recv(p, 0)
			if errors.Is(err, frontend.ErrTimeout) {
				continue
			}
			if err != nil {
				t.Fatalf("change %d: recv pair %d: %v", i, p, err)
			}
			got = true
			if len(fr) < 42+8 || string(fr[42:46]) != "seq:" {
				continue // a broadcast from learn
			}
			delete(want, binary.BigEndian.Uint32(fr[46:50]))
		}
		if !got {
			time.Sleep(200 * time.Microsecond)
		}
	}
}
