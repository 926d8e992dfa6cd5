package dataplane

import (
	"bytes"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vhostmq/vhostmq/dataplane/frontend"
	"github.com/vhostmq/vhostmq/dataplane/netdev"
	"github.com/vhostmq/vhostmq/dataplane/vhostuser"
)

// TestControlFloodStaysInItsPort (#26): a frontend that sends control
// messages as fast as its socket takes them (memory tables, which map and
// unmap, and ring enables, which take its rings' locks) is slowed to the
// port's control budget, and the other ports' data and control paths are
// measured against a baseline without the flood, in the same run. The
// timings are reported, not asserted (a busy machine moves them); what is
// asserted is what the dataplane decides: the flooder was held to its
// budget and no bystander frame was lost.
func TestControlFloodStaysInItsPort(t *testing.T) {
	d := newDataplane(t, 0)
	a := dial(t, addPort(t, d, "a", netdev.RoleServer, 1), frontend.Config{})
	b := dial(t, addPort(t, d, "b", netdev.RoleServer, 1), frontend.Config{})
	c := dial(t, addPort(t, d, "c", netdev.RoleServer, 1), frontend.Config{})
	learn(t, a, b, 1)
	flooder := dial(t, addPort(t, d, "f", netdev.RoleServer, 1), frontend.Config{})

	measure := func() (streamTime time.Duration, rtt []time.Duration) {
		t.Helper()
		start := time.Now()
		s := frontend.StartStreamMatching(a, b, 20000, func(i int) []byte { return numbered(macB, macA, i) },
			func(f []byte) bool { return bytes.Equal(f[0:6], macB[:]) })
		for range 200 {
			t0 := time.Now()
			if _, err := c.CtrlGet(vhostuser.ReqGetFeatures, nil); err != nil {
				t.Fatalf("c's control path: %v", err)
			}
			rtt = append(rtt, time.Since(t0))
			time.Sleep(200 * time.Microsecond)
		}
		waitStream(t, s)
		return time.Since(start), rtt
	}
	// The flood pauses between measurements, so that the bystanders are
	// measured alone and beside it in turns on the same machine state.
	var sent atomic.Int64
	var paused atomic.Bool
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		regs := flooder.Regions()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if paused.Load() {
				time.Sleep(time.Millisecond)
				continue
			}
			var err error
			if i%2 == 0 {
				err = flooder.SetMemTableRegions(regs)
			} else {
				err = flooder.SetVringEnable(1, i%4 == 1)
			}
			if err != nil {
				t.Errorf("flooder: %v", err)
				return
			}
			sent.Add(1)
		}
	}()
	floodStart := time.Now()
	waitFor(t, "the flooder to spend its burst", func() bool { return portStats(t, d, "f").ControlThrottled > 0 })
	var alone, beside []time.Duration
	var aloneRTT, besideRTT []time.Duration
	for range 3 {
		paused.Store(true)
		time.Sleep(5 * time.Millisecond)
		st, rtt := measure()
		alone, aloneRTT = append(alone, st), append(aloneRTT, rtt...)
		paused.Store(false)
		time.Sleep(5 * time.Millisecond)
		st, rtt = measure()
		beside, besideRTT = append(beside, st), append(besideRTT, rtt...)
	}
	close(stop)
	wg.Wait()
	floodFor := time.Since(floodStart)
	n := sent.Load()
	ps := portStats(t, d, "f")
	// half the flood maps memory (MemoryMessageCost tokens), half does not (1)
	perPair := int64(netdev.MemoryMessageCost + 1)
	limit := 2 * (netdev.ControlBurst + int64(float64(netdev.ControlRate)*floodFor.Seconds()) + perPair) / perPair
	t.Logf("flood: %d control messages, half of them memory tables, in %v (%.0f/s; budget %d/s, burst %d, a memory table costs %d), throttled %d times",
		n, floodFor.Round(time.Millisecond), float64(n)/floodFor.Seconds(), netdev.ControlRate, netdev.ControlBurst, netdev.MemoryMessageCost, ps.ControlThrottled)
	median := func(l []time.Duration) time.Duration { l = slices.Clone(l); slices.Sort(l); return l[len(l)/2] }
	q := func(r []time.Duration, p int) time.Duration {
		r = slices.Clone(r)
		slices.Sort(r)
		return r[len(r)*p/100]
	}
	base := median(alone)
	for _, m := range []struct {
		what   string
		stream time.Duration
		rtt    []time.Duration
	}{{"alone (median of 3)", base, aloneRTT}, {"beside the flood at its budget (median of 3)", median(beside), besideRTT}} {
		t.Logf("%-46s bystanders' 20000 frames %8v (x%.2f), c's GET_FEATURES p50/p99 %v/%v", m.what+":", m.stream.Round(time.Millisecond),
			m.stream.Seconds()/base.Seconds(), q(m.rtt, 50).Round(time.Microsecond), q(m.rtt, 99).Round(time.Microsecond))
	}
	t.Logf("each stream alone %v, beside the flood %v", alone, beside)
	if n > limit {
		t.Errorf("the flooder got %d messages handled in %v; its budget allows %d", n, floodFor, limit)
	}
}

// TestGuestMemoryBound: a session may map no more guest memory than its
// port's bound; beyond it the table is refused, naming the port and the
// setting, and nothing stays mapped.
func TestGuestMemoryBound(t *testing.T) {
	var logs syncBuffer
	d, err := New(Config{MaxGuestMemory: 16 << 20, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	sock := addPort(t, d, "small", netdev.RoleServer, 1)
	before := openFDs(t)
	if _, err := frontend.Dial(sock, frontend.Config{MemSize: 32 << 20}); err == nil {
		t.Fatal("32 MiB of guest memory accepted by a port bound to 16 MiB")
	}
	waitFor(t, "the refusal", func() bool { return strings.Contains(logs.String(), "maxGuestMemoryGiB") })
	if !strings.Contains(logs.String(), `port \"small\": the regions add up to 33554432 bytes, more than the 16777216`) {
		t.Errorf("the refusal does not name the port and the bound:\n%s", logs.String())
	}
	waitFor(t, "the refused session's fds to close", func() bool { return openFDs(t) <= before })
	if m := portStats(t, d, "small").Memory; m.Regions != 0 {
		t.Errorf("memory %+v after the refusal", m)
	}
	dial(t, sock, frontend.Config{MemSize: 16 << 20}) // at the bound: served
}
