package dataplane

import (
	"bytes"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vhostmq/vhostmq/dataplane/frontend"
	"github.com/vhostmq/vhostmq/dataplane/netdev"
	"github.com/vhostmq/vhostmq/dataplane/vhostuser"
	"github.com/vhostmq/vhostmq/dataplane/virtio"
	"github.com/vhostmq/vhostmq/dataplane/vswitch"
)

// The per-packet paths that the DPDK comparison (hack/bench/run.sh)
// exercises, measured and checked in-process: the guest-TX drop path (g2h),
// forwarding into each guest RX layout (h2g/p2p), MAC lookups, that none of
// them allocates, and that a busy worker silences kicks.

// TestBusyPollingSuppressesKicks: a worker that never sleeps must ask its
// guests not to kick (VRING_USED_F_NO_NOTIFY). A driver without EVENT_IDX
// (DPDK's virtio PMD and virtio-user) otherwise kicks on every TX burst: an
// eventfd write for virtio-user, an exit to the hypervisor for a guest.
// Before the fix the flag was only set after the worker had slept, which a
// busy worker never does, and hack/bench saw ~10,000 kicks/s from one
// virtio-user port (strace) where DPDK's vhost backend sees none.
// (Adaptive and interrupt workers do sleep between these one-by-one frames
// and rightly ask for kicks before they do.)
func TestBusyPollingSuppressesKicks(t *testing.T) {
	for _, mode := range []Polling{PollBusy} {
		t.Run(mode.String(), func(t *testing.T) {
			d := newDataplane(t)
			var socks [2]string
			for i, name := range []string{"a", "b"} {
				socks[i] = sockPath(t, name)
				cfg := netdev.Config{Name: name, Socket: socks[i], Role: netdev.RoleServer, QueuePairs: 1, MTU: 1500}
				if err := d.AddPort(cfg, PortOptions{Polling: mode}); err != nil {
					t.Fatal(err)
				}
			}
			// The rings must start while the worker polls, as they do when a
			// VM boots on a running dataplane: were the worker asleep, the
			// wake-up would ask the new rings not to kick.
			w := d.workers[0]
			p0 := w.passes.Load()
			waitFor(t, "the worker to poll", func() bool { return w.passes.Load() > p0+1000 })
			fcfg := frontend.Config{Features: frontend.DefaultFeatures &^ (1 << virtio.FEventIdx), RxPoll: true}
			a := dial(t, socks[0], fcfg)
			b := dial(t, socks[1], fcfg)
			learn(t, a, b, 1)
			// Frames one by one, each waited for: every one would kick.
			frame := udpFrame(macB, macA, 1, 9, make([]byte, 64))
			const n = 2000
			before := a.Stats(0).TX
			deadline := time.Now().Add(20 * time.Second)
			for i := 0; i < n && time.Now().Before(deadline); i++ {
				if err := a.Send(0, frame); err != nil {
					t.Fatalf("send %d: %v", i, err)
				}
				if _, err := b.Recv(0, 2*time.Second); err != nil {
					t.Fatalf("recv %d: %v", i, err)
				}
				a.ReclaimTx(0)
			}
			st := a.Stats(0).TX
			kicks, quiet := st.Kicks-before.Kicks, st.KicksSuppressed-before.KicksSuppressed
			t.Logf("%s: %d kicks, %d suppressed for %d frames", mode, kicks, quiet, st.Frames-before.Frames)
			// A few kicks are fine (before the worker first asks); one per
			// frame is not.
			if kicks > n/10 {
				t.Errorf("%s polling: the guest kicked %d times for %d frames sent one by one (%d kicks suppressed)",
					mode, kicks, n, quiet)
			}
		})
	}
}

// The benchmarks below time one worker pass over a 32-frame burst, as
// BenchmarkForward does, and report per frame both the wall time
// (dataplane-ns/frame) and the worker thread's CPU time (cpu-ns/frame). On
// a shared machine the wall time includes preemption; the CPU time does
// not, so it is the one to compare across runs. It includes about half of
// the two CLOCK_THREAD_CPUTIME_ID reads (a system call) per burst. The
// testing timer runs during the passes only, so allocs/op are theirs.

// threadCPU is the calling thread's CPU time in nanoseconds (the caller is
// locked to its thread).
func threadCPU() int64 {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts)
	return ts.Nano()
}

// pathRig is a dataplane whose worker is stopped: the test drives
// w.pass() itself. tx sends; rx (nil for a port alone) receives.
type pathRig struct {
	w      *worker
	tx, rx *frontend.Frontend
	frames [][]byte
	// VHOSTMQ_BENCH_MAC_FLOOD=N: before each burst (outside the pass) the
	// network's table learns N new addresses behind a stand-in, as an
	// uplink does during a source-address flood on the LAN
	flood   int
	flooder *port
	macs    *vswitch.Table[*port]
	next    uint32
	// pairs: both ports' queue pairs; with 2, a's bursts alternate between
	// its pairs, the same flows on both (the p2p loop of hack/bench/run.sh)
	pairs, turn int
}

// newPathRig: port "a" alone (frames to an unknown unicast address: no
// destination, dropped after the dequeue, as the g2h benchmark's) or a→b
// (rxCfg != nil: every frame copied into b's RX ring). The only worker is
// stopped before the ports exist and every pass is the rig's own, so that
// a callgrind count of worker.pass (hack/bench/instructions.sh) holds
// nothing but the passes the test drives: no idle passes whose number
// depends on timing.
func newPathRig(tb testing.TB, size int, rxCfg *frontend.Config) *pathRig {
	// One worker (no other worker's idle passes), no watchdog (its
	// TryLock on a ring would make a pass spin on the ring's mutex).
	d, err := New(Config{CPUs: []int{0}, Logger: testLogger(tb), Watchdog: WatchdogConfig{Bound: -1}})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(d.Close)
	r := &pathRig{w: d.workers[0]}
	r.w.halt()
	cfg := frontend.Config{QueueSize: 1024, RxPoll: true, TxBufSize: 2048}
	// Ports as the CNI makes them: given their MAC and IPAM address, port
	// security on (the frames' source IP is 10.0.0.1 both ways);
	// VHOSTMQ_BENCH_PORT_SECURITY=off measures the path without it.
	opt := PortOptions{Security: PortSecurity{IPs: []netip.Addr{netip.MustParseAddr("10.0.0.1")}}}
	if os.Getenv("VHOSTMQ_BENCH_PORT_SECURITY") == "off" {
		opt.Security.Off = true
	}
	// VHOSTMQ_BENCH_BANDWIDTH=bits/s: both ports limited both ways at that
	// rate (one that never binds, such as 1000000000000, measures what the
	// limits' checks cost a frame).
	if bps, err := strconv.ParseUint(os.Getenv("VHOSTMQ_BENCH_BANDWIDTH"), 10, 64); err == nil && bps > 0 {
		r := Rate{BitsPerSecond: bps, BurstBits: MaxBurstBits}
		opt.Bandwidth = Bandwidth{Ingress: r, Egress: r}
	}
	r.pairs = 1
	if rxCfg != nil && rxCfg.QueuePairs > 1 {
		r.pairs = rxCfg.QueuePairs
	}
	cfg.QueuePairs = r.pairs
	r.tx = dial(tb, addPortPairs(tb, d, "a", macA, opt, r.pairs), cfg)
	if n, err := strconv.Atoi(os.Getenv("VHOSTMQ_BENCH_MAC_FLOOD")); err == nil && n > 0 {
		r.flood, r.flooder, r.macs = n, &port{}, d.nets[""].macs
		r.macs.SetLimit(r.flooder, 1<<30)
	}
	dst := [6]byte{0x02, 0, 0, 0, 0, 0x99} // nobody
	if rxCfg != nil {
		c := *rxCfg
		c.QueueSize, c.RxPoll = 1024, true
		r.rx = dial(tb, addPortPairs(tb, d, "b", macB, opt, r.pairs), c)
		r.learn(tb, r.tx, r.rx, macA)
		r.learn(tb, r.rx, r.tx, macB)
		dst = macB
	}
	for i := range burstSize {
		r.frames = append(r.frames, udpFrame(dst, macA, uint16(i), 9, make([]byte, size-42)))
	}
	if r.pairs > 1 {
		// b sends the same flows back on each of its pairs, as the loop's
		// other direction does: b's flow table steers a's frames (the
		// addresses and ports as they are: the flow hash is symmetric,
		// and port security passes the rig's one source address)
		var back [][]byte
		for _, f := range r.frames {
			f = bytes.Clone(f)
			copy(f[0:6], macA[:])
			copy(f[6:12], macB[:])
			back = append(back, f)
		}
		for pair := range r.pairs {
			if n, err := r.rx.SendBurst(pair, back); err != nil || n != len(back) {
				tb.Fatalf("b queued %d of %d frames on pair %d: %v", n, len(back), pair, err)
			}
			r.w.pass()
			got := 0
			for p := range r.pairs {
				n, _, _ := r.tx.Discard(p)
				got += n
			}
			if got != len(back) {
				tb.Fatalf("a received %d of b's %d frames from pair %d", got, len(back), pair)
			}
			r.rx.ReclaimTx(pair)
		}
	}
	return r
}

// addPortPairs is addPortMAC with pairs queue pairs.
func addPortPairs(tb testing.TB, d *Dataplane, name string, mac [6]byte, opt PortOptions, pairs int) string {
	tb.Helper()
	s := sockPath(tb, name)
	cfg := netdev.Config{Name: name, Socket: s, Role: netdev.RoleServer, QueuePairs: pairs, MTU: 1500, MAC: net.HardwareAddr(mac[:])}
	if err := d.AddPort(cfg, opt); err != nil {
		tb.Fatal(err)
	}
	return s
}

// learn has from's guest broadcast from mac and runs passes until to's
// guest got it: the switch then knows mac.
func (r *pathRig) learn(tb testing.TB, from, to *frontend.Frontend, mac [6]byte) {
	tb.Helper()
	if err := from.Send(0, broadcastFrom(mac)); err != nil {
		tb.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		r.w.pass()
		if fr, err := to.Recv(0, time.Millisecond); err == nil {
			if [6]byte(fr[6:12]) != mac {
				tb.Fatalf("got a frame from %x, want one from %x", fr[6:12], mac)
			}
			from.ReclaimTx(0)
			return
		}
	}
	tb.Fatalf("the broadcast from %x did not arrive", mac)
}

// burst queues 32 frames, runs one pass and returns its wall and CPU time.
// With b, only the pass runs with b's timer on, so that allocs/op are the
// pass's (the test frontend allocates).
func (r *pathRig) burst(tb testing.TB, b *testing.B) (wall, cpu int64) {
	pair := r.turn % r.pairs
	r.turn++
	if n, err := r.tx.SendBurst(pair, r.frames); err != nil || n != len(r.frames) {
		tb.Fatalf("queued %d of %d frames: %v", n, len(r.frames), err)
	}
	for range r.flood {
		r.next++
		r.macs.Learn(vswitch.MAC{0x02, 0xf1, byte(r.next >> 24), byte(r.next >> 16), byte(r.next >> 8), byte(r.next)}, r.flooder, 1)
	}
	if b != nil {
		b.StartTimer()
	}
	t0, c0 := nanotime(), threadCPU()
	if !r.w.pass() {
		tb.Fatal("the pass found no work")
	}
	c1, t1 := threadCPU(), nanotime()
	if b != nil {
		b.StopTimer()
	}
	switch {
	case r.rx != nil && r.pairs == 1:
		if got, err := r.rx.RecvAll(0, 0); err != nil || len(got) != len(r.frames) {
			tb.Fatalf("b received %d of %d frames: %v", len(got), len(r.frames), err)
		}
	case r.rx != nil:
		got := 0
		for p := range r.pairs {
			n, _, err := r.rx.Discard(p)
			if err != nil {
				tb.Fatalf("b's pair %d: %v", p, err)
			}
			got += n
		}
		if got != len(r.frames) {
			tb.Fatalf("b received %d of %d frames", got, len(r.frames))
		}
	}
	r.tx.ReclaimTx(pair)
	return t1 - t0, c1 - c0
}

func (r *pathRig) run(b *testing.B) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	b.ReportAllocs()
	var wall, cpu int64
	b.ResetTimer()
	b.StopTimer()
	for done := 0; done < b.N; done += burstSize {
		w, c := r.burst(b, b)
		wall += w
		cpu += c
	}
	b.ReportMetric(float64(wall)/float64(b.N), "dataplane-ns/frame")
	b.ReportMetric(float64(cpu)/float64(b.N), "cpu-ns/frame")
}

// rxVariants are the guest RX layouts: one 2048-byte buffer per frame with
// MRG_RXBUF (what virtio-user and Linux use), without MRG_RXBUF, and
// MRG_RXBUF with 512-byte buffers (a 1500-byte frame spans 3).
var rxVariants = []struct {
	name string
	cfg  frontend.Config
}{
	{"mrg", frontend.Config{}},
	{"nomrg", frontend.Config{Features: frontend.DefaultFeatures &^ (1 << virtio.NetFMrgRxbuf)}},
	{"mrg-span512", frontend.Config{RxBufSize: 512}},
	// VIRTIO_F_IN_ORDER: the frontend fails on any used entry out of avail order
	{"inorder-span512", frontend.Config{RxBufSize: 512, Features: frontend.DefaultFeatures | 1<<virtio.FInOrder}},
}

// BenchmarkPathTxDrop: the g2h path; dequeue, header peek, learning, flow
// hash, lookup miss, drop (noDestination). The payload is never read.
func BenchmarkPathTxDrop(b *testing.B) {
	for _, size := range []int{64, 1500} {
		b.Run(sizeName(size), func(b *testing.B) { newPathRig(b, size, nil).run(b) })
	}
}

// BenchmarkPathForward: TX dequeue plus the RX enqueue (one copy guest to
// guest) for each RX layout; minus BenchmarkPathTxDrop it is the enqueue.
// "log": the mrg layout while b's frontend migrates (LOG_ALL, a dirty log,
// the used ring logged too): what dirty-page logging costs.
func BenchmarkPathForward(b *testing.B) {
	for _, v := range rxVariants {
		for _, size := range []int{64, 1500} {
			b.Run(v.name+"/"+sizeName(size), func(b *testing.B) { newPathRig(b, size, &v.cfg).run(b) })
		}
	}
	// "mrg-q2": both ports with two pairs, a's bursts alternating between
	// its pairs with the same flows, which b sent on both of its pairs
	for _, size := range []int{64, 1500} {
		b.Run("mrg-q2/"+sizeName(size), func(b *testing.B) { newPathRig(b, size, &frontend.Config{QueuePairs: 2}).run(b) })
	}
	for _, size := range []int{64, 1500} {
		b.Run("log/"+sizeName(size), func(b *testing.B) {
			cfg := frontend.Config{ProtocolFeatures: frontend.DefaultProtocolFeatures | 1<<vhostuser.ProtoLogSHMFD}
			r := newPathRig(b, size, &cfg)
			startDirtyLog(b, r.rx)
			r.burst(b, nil) // the rings restarted: the first pass after
			r.run(b)
		})
	}
}

// BenchmarkPathMACLookup: a hit and a miss in a table of 256 addresses,
// and the per-frame refresh of a known source (Learn).
func BenchmarkPathMACLookup(b *testing.B) {
	t := vswitch.NewTable[int](0)
	macs := make([]vswitch.MAC, 256)
	for i := range macs {
		macs[i] = vswitch.MAC{0x02, 0, 0, 0, byte(i >> 8), byte(i)}
		t.Learn(macs[i], i%4, 1)
	}
	miss := vswitch.MAC{0x02, 0xff, 0, 0, 0, 1}
	b.Run("hit", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			if _, ok := t.Lookup(macs[i&255]); !ok {
				b.Fatal("miss")
			}
		}
	})
	b.Run("miss", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			if _, ok := t.Lookup(miss); ok {
				b.Fatal("hit")
			}
		}
	})
	b.Run("learn-known", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			t.Learn(macs[i&255], (i&255)%4, 2)
		}
	})
}

// TestPerPacketPathAllocatesNothing: a worker pass on each path above
// allocates nothing (TestForwardingAllocatesNothing covers the default
// forwarding pass), and neither do MAC lookups and refreshes.
func TestPerPacketPathAllocatesNothing(t *testing.T) {
	const runs = 5
	type pathCase struct {
		name  string
		size  int
		rxCfg *frontend.Config
	}
	var cases []pathCase
	for _, size := range []int{64, 1500} {
		cases = append(cases, pathCase{"tx drop", size, nil})
		for _, v := range rxVariants {
			cases = append(cases, pathCase{"forward " + v.name, size, &v.cfg})
		}
	}
	for _, c := range cases {
		r := newPathRig(t, c.size, c.rxCfg)
		r.burst(t, nil) // first use may allocate; per packet nothing may
		// AllocsPerRun makes runs+1 calls: queue that many bursts first
		// (the test frontend's sends allocate, the passes must not).
		for i := 0; i <= runs; i++ {
			if n, err := r.tx.SendBurst(0, r.frames); err != nil || n != len(r.frames) {
				t.Fatalf("%s %s: queued %d of %d frames: %v", c.name, sizeName(c.size), n, len(r.frames), err)
			}
		}
		allocs := testing.AllocsPerRun(runs, func() {
			if !r.w.pass() {
				t.Fatal("the pass found no work")
			}
		})
		if allocs != 0 {
			t.Errorf("%s %s: a pass over %d frames allocated %.1f times", c.name, sizeName(c.size), burstSize, allocs)
		}
	}
	tab := vswitch.NewTable[int](0)
	known, unknown := vswitch.MAC{0x02, 0, 0, 0, 0, 1}, vswitch.MAC{0x02, 0, 0, 0, 0, 2}
	tab.Learn(known, 1, 1)
	if allocs := testing.AllocsPerRun(100, func() {
		tab.Lookup(known)
		tab.Lookup(unknown)
		tab.Learn(known, 1, 2e9)
	}); allocs != 0 {
		t.Errorf("MAC lookups and a refresh allocated %.1f times", allocs)
	}
}

// TestFaultInDestinationMemoryStopsOnlyItsRing: a fault while copying into
// a destination guest's RX buffer (its memory file shrank under the
// mapping) stops that RX ring, not the sender's TX ring, which goes on
// forwarding to others. deliver used to restore the culprit in a deferred
// call, which ran before serveSafely's recover and so blamed the sender.
func TestFaultInDestinationMemoryStopsOnlyItsRing(t *testing.T) {
	d := newDataplane(t)
	a := dial(t, addPort(t, d, "a", netdev.RoleServer, 1), frontend.Config{})
	b := dial(t, addPort(t, d, "b", netdev.RoleServer, 1), frontend.Config{
		NoRxPrefill:      true,
		ProtocolFeatures: frontend.DefaultProtocolFeatures | 1<<vhostuser.ProtoConfigureMemSlots,
	})
	c := dial(t, addPort(t, d, "c", netdev.RoleServer, 1), frontend.Config{})

	// b's only RX buffer faults when written (a second region, truncated).
	faultingRXBuffer(t, b)

	// c announces itself (b's copy of the broadcast faults); then a floods
	// a frame (b faults, if it has not yet) and sends one to c.
	if err := c.Send(0, broadcastFrom(macB)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b's RX ring to stop", func() bool { return portStats(t, d, "b").Queues[0].Drops.BadChain > 0 })
	if _, err := a.Recv(0, 2*time.Second); err != nil {
		t.Fatalf("a did not get c's broadcast: %v", err)
	}
	if err := a.Send(0, udpFrame(macB, macA, 1, 9, []byte("to c"))); err != nil {
		t.Fatal(err)
	}
	if got, err := c.Recv(0, 2*time.Second); err != nil || string(got[42:]) != "to c" {
		t.Fatalf("c did not get a's frame after b's fault (%q, %v): a's TX ring was stopped for b's fault", got, err)
	}
	for _, name := range []string{"a", "c"} {
		if n := portStats(t, d, name).Queues[0].Drops.BadChain; n != 0 {
			t.Errorf("port %s: %d rings stopped by b's fault", name, n)
		}
	}
	if d.workers[0].panics.Load() == 0 {
		t.Error("no fault was recovered: the test did not test anything")
	}
}
