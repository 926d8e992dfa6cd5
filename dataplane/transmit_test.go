package dataplane

import (
	"bytes"
	"encoding/binary"
	"errors"
	"runtime/debug"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vhostmq/vhostmq/dataplane/frontend"
	"github.com/vhostmq/vhostmq/dataplane/netdev"
	"github.com/vhostmq/vhostmq/dataplane/vhostuser"
	"github.com/vhostmq/vhostmq/dataplane/virtio"
)

// Per-burst delivery (transmit.go, deliver.go): a burst holds each destination RX ring
// once, publishes once and interrupts once; frames keep their order per
// destination; a ring that fills mid-burst takes what fits; a source chain
// that breaks mid-copy leaves nothing in the destination.

// burstRig is a dataplane with ports named after fes whose worker is
// stopped after every port's MAC was learned: the test runs w.pass().
type burstRig struct {
	d   *Dataplane
	w   *worker
	fes []*frontend.Frontend
}

func newBurstRig(t *testing.T, macs [][6]byte, cfgs []frontend.Config) *burstRig {
	t.Helper()
	r := &burstRig{d: newDataplane(t)}
	for i := range macs {
		name := string(rune('a' + i))
		r.fes = append(r.fes, dial(t, addPort(t, r.d, name, netdev.RoleServer, 1), cfgs[i]))
	}
	r.w = r.d.workers[0]
	r.w.halt()
	for i, m := range macs {
		if err := r.fes[i].Send(0, broadcastFrom(m)); err != nil {
			t.Fatal(err)
		}
		r.w.pass()
		for j, f := range r.fes {
			if j == i {
				continue
			}
			if got, err := f.RecvAll(0, 0); err != nil || len(got) != 1 {
				t.Fatalf("port %d: got %d frames of %d's broadcast: %v", j, len(got), i, err)
			}
		}
		r.fes[i].ReclaimTx(0)
	}
	return r
}

// seqFrame is a unicast frame carrying its sequence number.
func seqFrame(dst, src [6]byte, seq, size int) []byte {
	p := make([]byte, size-42)
	binary.BigEndian.PutUint32(p, uint32(seq))
	return udpFrame(dst, src, 1, 9, p)
}

func TestBurstInterleavedDestinations(t *testing.T) {
	// c takes 512-byte buffers: its 1500-byte frames span three. Without
	// EVENT_IDX, and as the frontend's RX rings never set NO_INTERRUPT,
	// every interrupt decision is a call: the count of calls is the count
	// of decisions.
	f := frontend.DefaultFeatures &^ (1 << virtio.FEventIdx)
	r := newBurstRig(t, [][6]byte{macA, macB, macC}, []frontend.Config{
		{QueueSize: 256, RxPoll: true, Features: f}, {QueueSize: 256, RxPoll: true, Features: f},
		{QueueSize: 256, RxPoll: true, RxBufSize: 512, Features: f},
	})
	a, b, c := r.fes[0], r.fes[1], r.fes[2]
	var frames, toB, toC [][]byte
	for i := range burstSize {
		dst, size := macB, 64
		if i%3 != 0 {
			dst, size = macC, 1500
		}
		f := seqFrame(dst, macA, i, size)
		frames = append(frames, f)
		if dst == macB {
			toB = append(toB, f)
		} else {
			toC = append(toC, f)
		}
	}
	b.DrainCalls(0)
	c.DrainCalls(0)
	cBefore := portStats(t, r.d, "c").Queues[0]
	if n, err := a.SendBurst(0, frames); err != nil || n != len(frames) {
		t.Fatalf("queued %d of %d: %v", n, len(frames), err)
	}
	if !r.w.pass() {
		t.Fatal("the pass found no work")
	}
	calls := [2]uint64{b.DrainCalls(0), c.DrainCalls(0)}
	for i, x := range []struct {
		name string
		f    *frontend.Frontend
		want [][]byte
	}{{"b", b, toB}, {"c", c, toC}} {
		got, err := x.f.RecvAll(0, 0)
		if err != nil || len(got) != len(x.want) {
			t.Fatalf("%s received %d frames of %d: %v", x.name, len(got), len(x.want), err)
		}
		for i := range got {
			if !bytes.Equal(got[i], x.want[i]) {
				t.Fatalf("%s: frame %d is not the one sent in that place (seq %d)", x.name, i, binary.BigEndian.Uint32(got[i][42:]))
			}
		}
		if calls[i] != 1 {
			t.Errorf("%s was interrupted %d times for one burst", x.name, calls[i])
		}
	}
	// The burst's time is accounted to a's pair (coarsely: the pass reads
	// the clock only around bursts that had work), once published (the
	// halted worker's loop would publish at housekeeping).
	r.w.publish()
	if ns := portStats(t, r.d, "a").Queues[0].BusyNs; ns == 0 {
		t.Error("no busy time accounted to a's pair")
	}
	st := portStats(t, r.d, "c").Queues[0]
	if n, drops := st.RxPackets-cBefore.RxPackets, st.Drops.RxNoBuffer; n != uint64(len(toC)) || drops != 0 {
		t.Errorf("c: %d frames counted, %d no-buffer drops; want %d, 0", n, drops, len(toC))
	}
}

// macNobody is an address no port has: frames to it are flooded.
var macNobody = [6]byte{0x52, 0x54, 0, 0, 9, 9}

// smallRingBurst sends 32 frames of 1500 bytes from a to dst in a rig
// whose port b posted 8 buffers shaped by cfg, runs one pass and checks
// that the frames that fit arrived, in order. It returns the rig, the
// frames, how many fit and b's queue stats from before the pass.
func smallRingBurst(t *testing.T, cfg frontend.Config, dst [6]byte) (r *burstRig, frames [][]byte, fit int, before QueueStats) {
	t.Helper()
	small := cfg
	small.QueueSize, small.RxPoll = 8, true
	r = newBurstRig(t, [][6]byte{macA, macB}, []frontend.Config{{QueueSize: 256, RxPoll: true}, small})
	per := 1
	if cfg.RxBufSize == 512 {
		per = 3 // a 1500-byte frame spans 3 buffers of 512
	}
	for i := range burstSize {
		frames = append(frames, seqFrame(dst, macA, i, 1500))
	}
	before = portStats(t, r.d, "b").Queues[0]
	if n, err := r.fes[0].SendBurst(0, frames); err != nil || n != len(frames) {
		t.Fatalf("queued %d of %d: %v", n, len(frames), err)
	}
	r.w.pass()
	fit = 8 / per
	got, err := r.fes[1].RecvAll(0, 0)
	if err != nil || len(got) != fit {
		t.Fatalf("b received %d frames, want the %d that fit: %v", len(got), fit, err)
	}
	for i := range got {
		if !bytes.Equal(got[i], frames[i]) {
			t.Fatalf("frame %d is not the %d-th sent (seq %d)", i, i, binary.BigEndian.Uint32(got[i][42:]))
		}
	}
	return r, frames, fit, before
}

func TestBurstRingFillsMidBurst(t *testing.T) {
	for _, v := range rxVariants {
		t.Run(v.name, func(t *testing.T) {
			r, frames, fit, before := smallRingBurst(t, v.cfg, macB)
			a, b := r.fes[0], r.fes[1]
			// The rest is held in a's ring (hold.go), not dropped: the
			// chains stay untaken and the burst ended at the first that
			// found no room.
			st := portStats(t, r.d, "b").Queues[0]
			if d := st.Drops.RxNoBuffer - before.Drops.RxNoBuffer; d != 0 {
				t.Errorf("%d no-buffer drops, want 0 (held)", d)
			}
			if n, _ := a.ReclaimTx(0); n != burstSize-fit {
				t.Errorf("%d of a's TX chains outstanding after the pass, want the %d held", n, burstSize-fit)
			}
			// b reposted its buffers while receiving: each pass delivers
			// the next frames that fit, in order, until all arrived.
			for i := fit; i < burstSize; {
				r.w.pass()
				got, err := b.RecvAll(0, 0)
				if err != nil || len(got) == 0 {
					t.Fatalf("after frame %d: pass delivered nothing: %v", i, err)
				}
				for _, g := range got {
					if !bytes.Equal(g, frames[i]) {
						t.Fatalf("frame %d is not the %d-th sent", i, i)
					}
					i++
				}
			}
			st = portStats(t, r.d, "b").Queues[0]
			if d := st.Drops.RxNoBuffer - before.Drops.RxNoBuffer; d != 0 {
				t.Errorf("%d no-buffer drops, want 0", d)
			}
			if h := st.Held - before.Held; h == 0 {
				t.Error("no held frames counted")
			}
			if n, _ := a.ReclaimTx(0); n != 0 {
				t.Errorf("%d of a's TX chains still outstanding after all were delivered", n)
			}
		})
	}
}

// TestFloodToOnePortRunsAndDrops: in a network of two ports, frames to
// an address nobody has are a flood that reaches one port: they arrive in
// order, as a run would deliver them, and those its ring has no room for
// are dropped and counted as a flood's are, never held (a's chains all
// come back in the pass).
func TestFloodToOnePortRunsAndDrops(t *testing.T) {
	for _, v := range rxVariants {
		t.Run(v.name, func(t *testing.T) {
			r, _, fit, before := smallRingBurst(t, v.cfg, macNobody)
			st := portStats(t, r.d, "b").Queues[0]
			if d, h := st.Drops.RxNoBuffer-before.Drops.RxNoBuffer, st.Held-before.Held; d != uint64(burstSize-fit) || h != 0 {
				t.Errorf("b: %d no-buffer drops and %d held, want %d and 0 (a flood drops what finds no room)", d, h, burstSize-fit)
			}
			if n, _ := r.fes[0].ReclaimTx(0); n != 0 {
				t.Errorf("%d of a's TX chains outstanding after the pass, want 0 (nothing held)", n)
			}
		})
	}
}

// TestInOrderBothWays: with VIRTIO_F_IN_ORDER on both guests, every ring
// is used in the order its buffers were made available, through what
// reorders nothing but could: frames held for a full 8-entry ring, frames
// spanning 512-byte buffers, a runt and a flood dropped in between. The
// test frontend checks each used entry against the avail ring.
func TestInOrderBothWays(t *testing.T) {
	inOrder := frontend.DefaultFeatures | 1<<virtio.FInOrder
	r := newBurstRig(t, [][6]byte{macA, macB}, []frontend.Config{
		{QueueSize: 256, RxPoll: true, Features: inOrder},
		{QueueSize: 8, RxPoll: true, RxBufSize: 512, Features: inOrder}})
	a, b := r.fes[0], r.fes[1]
	var want [][]byte
	for round := range 3 {
		var frames [][]byte
		for i := range burstSize {
			switch {
			case i == 5:
				frames = append(frames, make([]byte, 10)) // a runt: dropped
			case i == 9 && round == 1:
				frames = append(frames, seqFrame(macNobody, macA, 1000+i, 60)) // a flood to b
				want = append(want, frames[len(frames)-1])
			default:
				frames = append(frames, seqFrame(macB, macA, round*100+i, 60+i*45))
				want = append(want, frames[len(frames)-1])
			}
		}
		if n, err := a.SendBurst(0, frames); err != nil || n != len(frames) {
			t.Fatalf("round %d: queued %d of %d: %v", round, n, len(frames), err)
		}
	}
	var got [][]byte
	for pass := 0; len(got) < len(want) && pass < 1000; pass++ {
		r.w.pass()
		fs, err := b.RecvAll(0, 0)
		if err != nil {
			t.Fatalf("b after %d frames: %v", len(got), err)
		}
		got = append(got, fs...)
		if _, err := a.ReclaimTx(0); err != nil {
			t.Fatalf("a's TX ring after %d frames: %v", len(got), err)
		}
	}
	if len(got) != len(want) {
		t.Fatalf("b received %d frames of %d", len(got), len(want))
	}
	for i := range got {
		if !bytes.Equal(got[i], want[i]) {
			t.Fatalf("frame %d is not the %d-th sent", i, i)
		}
	}
	if n, err := a.ReclaimTx(0); n != 0 || err != nil {
		t.Errorf("%d of a's TX chains outstanding at the end (%v)", n, err)
	}
}

// TestRunsOfMixedSizes: a burst's frames come in runs to one guest
// (unicastRun, spanRun) with sizes that fit one buffer, span several or
// outgrow what the guest posted mid-run; small rings fill mid-run. Every
// frame arrives once, whole and in order, and none is dropped.
func TestRunsOfMixedSizes(t *testing.T) {
	sizes := []int{64, 600, 1500, 100, 1514, 60, 1024}
	for _, v := range rxVariants {
		t.Run(v.name, func(t *testing.T) {
			small := v.cfg
			small.QueueSize, small.RxPoll = 16, true
			other := frontend.Config{QueueSize: 16, RxPoll: true, RxBufSize: 512}
			if v.cfg.Features != 0 {
				other = small // without MRG_RXBUF frames cannot span
			}
			r := newBurstRig(t, [][6]byte{macA, macB, macC}, []frontend.Config{{QueueSize: 256, RxPoll: true}, small, other})
			a := r.fes[0]
			var frames [][]byte
			want := map[*frontend.Frontend][][]byte{}
			for i := range burstSize {
				dst, to := macB, r.fes[1]
				if (i/5)%2 == 1 {
					dst, to = macC, r.fes[2]
				}
				f := seqFrame(dst, macA, i, sizes[i%len(sizes)])
				frames = append(frames, f)
				want[to] = append(want[to], f)
			}
			before := [2]PortStats{portStats(t, r.d, "b"), portStats(t, r.d, "c")}
			// a runt inside a run is dropped there, and the run goes on
			burst := append(append(append([][]byte{}, frames[:7]...), frames[7][:10]), frames[7:]...)
			if n, err := a.SendBurst(0, burst); err != nil || n != len(burst) {
				t.Fatalf("queued %d of %d: %v", n, len(burst), err)
			}
			got := map[*frontend.Frontend][][]byte{}
			for pass := 0; len(got[r.fes[1]])+len(got[r.fes[2]]) < burstSize; pass++ {
				if pass == 100 {
					t.Fatalf("after 100 passes b has %d frames, c %d (of %d, %d)", len(got[r.fes[1]]), len(got[r.fes[2]]), len(want[r.fes[1]]), len(want[r.fes[2]]))
				}
				r.w.pass()
				for _, f := range r.fes[1:] {
					fs, err := f.RecvAll(0, 0)
					if err != nil && !errors.Is(err, frontend.ErrTimeout) {
						t.Fatal(err)
					}
					got[f] = append(got[f], fs...)
				}
			}
			for i, f := range r.fes[1:] {
				if len(got[f]) != len(want[f]) {
					t.Fatalf("port %d received %d frames, want %d", i+1, len(got[f]), len(want[f]))
				}
				for j := range got[f] {
					if !bytes.Equal(got[f][j], want[f][j]) {
						t.Fatalf("port %d: frame %d (%d bytes) is not the one sent in that place (%d bytes)", i+1, j, len(got[f][j]), len(want[f][j]))
					}
				}
				st := portStats(t, r.d, string(rune('b'+i))).Queues[0]
				if d := st.Drops.RxNoBuffer - before[i].Queues[0].Drops.RxNoBuffer; d != 0 {
					t.Errorf("port %d: %d no-buffer drops", i+1, d)
				}
				if n := st.RxPackets - before[i].Queues[0].RxPackets; n != uint64(len(want[f])) {
					t.Errorf("port %d: %d frames counted, want %d", i+1, n, len(want[f]))
				}
			}
			if n, _ := a.ReclaimTx(0); n != 0 {
				t.Errorf("%d of a's TX chains outstanding after all were delivered", n)
			}
			if n := portStats(t, r.d, "a").Queues[0].Drops.Runt; n != 1 {
				t.Errorf("a: %d runts counted, want 1", n)
			}
		})
	}
}

// TestSourceChainBreaksMidCopy: a TX chain whose second descriptor lies
// outside guest memory is found out while its frame is being copied into
// the destination: the sender's ring stops, the destination gets nothing
// and keeps every buffer.
func TestSourceChainBreaksMidCopy(t *testing.T) {
	r := newBurstRig(t, [][6]byte{macA, macB, macC}, []frontend.Config{
		{QueueSize: 256, RxPoll: true}, {QueueSize: 8, RxPoll: true}, {QueueSize: 256, RxPoll: true},
	})
	a, b, c := r.fes[0], r.fes[1], r.fes[2]
	ids, err := a.ReserveDescs(1, 2)
	if err != nil {
		t.Fatal(err)
	}
	fr := seqFrame(macB, macA, 1, 600)
	off, err := a.Alloc(virtio.NetHdrSize+len(fr), 16)
	if err != nil {
		t.Fatal(err)
	}
	copy(a.Mem()[off+virtio.NetHdrSize:], fr)
	a.WriteDesc(1, int(ids[0]), a.GPA(off), uint32(virtio.NetHdrSize+len(fr)), virtio.DescFNext, ids[1])
	a.WriteDesc(1, int(ids[1]), 1<<50, 100, 0, 0)
	a.PublishAvail(1, ids[0])
	r.w.pass()
	if st := portStats(t, r.d, "a").Queues[0]; st.Drops.BadChain != 1 {
		t.Fatalf("a's TX ring: %d bad chains, want 1", st.Drops.BadChain)
	}
	if got, err := b.RecvAll(0, 0); len(got) != 0 {
		t.Fatalf("b received %d frames from a broken chain (%v)", len(got), err)
	}
	// c fills all of b's 8 buffers: none was lost to the aborted copy.
	var frames [][]byte
	for i := range 8 {
		frames = append(frames, seqFrame(macB, macC, i, 1500))
	}
	if n, err := c.SendBurst(0, frames); err != nil || n != len(frames) {
		t.Fatalf("queued %d: %v", n, err)
	}
	r.w.pass()
	if got, err := b.RecvAll(0, 0); err != nil || len(got) != 8 || !bytes.Equal(got[0], frames[0]) {
		t.Fatalf("b received %d of c's 8 frames: %v", len(got), err)
	}
	if st := portStats(t, r.d, "b").Queues[0]; st.Drops.BadChain != 0 || st.Drops.RxNoBuffer != 0 {
		t.Errorf("b: %d bad chains, %d no-buffer drops; want 0, 0", st.Drops.BadChain, st.Drops.RxNoBuffer)
	}
}

// TestFaultMidBurstSettlesTheRest: a fault in one destination's memory
// cuts a burst short. The sender's chains must all come back (the one in
// hand included: a guest waits for every TX chain), and a destination that
// already got frames in that burst must get its interrupt; before, the
// chain in hand was never returned and the burst's pending interrupts and
// TX completions were dropped with it, stalling those guests until some
// later traffic.
func TestFaultMidBurstSettlesTheRest(t *testing.T) {
	d := newDataplane(t)
	noEventIdx := frontend.DefaultFeatures &^ (1 << virtio.FEventIdx) // every interrupt decision calls
	a := dial(t, addPort(t, d, "a", netdev.RoleServer, 1), frontend.Config{QueueSize: 8, Features: noEventIdx})
	b := dial(t, addPort(t, d, "b", netdev.RoleServer, 1), frontend.Config{
		NoRxPrefill:      true,
		ProtocolFeatures: frontend.DefaultProtocolFeatures | 1<<vhostuser.ProtoConfigureMemSlots,
	})
	c := dial(t, addPort(t, d, "c", netdev.RoleServer, 1), frontend.Config{Features: noEventIdx})
	// Everybody announces itself (b has no RX buffers yet: it drops).
	for _, x := range []struct {
		f   *frontend.Frontend
		mac [6]byte
	}{{a, macA}, {b, macB}, {c, macC}} {
		if err := x.f.Send(0, broadcastFrom(x.mac)); err != nil {
			t.Fatal(err)
		}
		for _, y := range []*frontend.Frontend{a, c} {
			if y != x.f {
				if _, err := y.Recv(0, 2*time.Second); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	// b's only RX buffer faults when written.
	faultingRXBuffer(t, b)
	w := d.workers[0]
	w.halt()
	a.ReclaimTx(0)
	c.DrainCalls(0)
	// The test drives the passes: it must turn faults into panics as the
	// worker thread does.
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))

	// One burst: a frame to c, then one to b (faults), then one more to c.
	burst := [][]byte{seqFrame(macC, macA, 1, 200), seqFrame(macB, macA, 2, 200), seqFrame(macC, macA, 3, 200)}
	if n, err := a.SendBurst(0, burst); err != nil || n != len(burst) {
		t.Fatalf("queued %d: %v", n, err)
	}
	w.pass()
	if w.panics.Load() == 0 {
		t.Fatal("no fault was recovered: the test did not test anything")
	}
	if st := portStats(t, d, "b").Queues[0]; st.Drops.BadChain != 1 {
		t.Fatalf("b's RX ring: %d bad chains, want 1 (stopped)", st.Drops.BadChain)
	}
	if n, err := a.ReclaimTx(0); err != nil || n != 2 {
		// frames 2 and 3 are still queued: the burst stopped at the
		// fault, and frame 2, a unicast frame that reached no guest, is
		// served again (and dropped: b's ring is stopped)
		t.Errorf("%d of a's TX chains outstanding after the fault, want 2 (frames 2 and 3, given back): %v", n, err)
	}
	if calls := c.DrainCalls(0); calls == 0 {
		t.Error("c got frame 1 but no interrupt")
	}
	// The next pass serves frames 2 (dropped: b's ring is stopped) and 3;
	// a's ring is not stopped.
	w.pass()
	got, err := c.RecvAll(0, 0)
	if err != nil || len(got) != 2 || !bytes.Equal(got[0], burst[0]) || !bytes.Equal(got[1], burst[2]) {
		t.Fatalf("c received %d frames (want frames 1 and 3): %v", len(got), err)
	}
	if n, _ := a.ReclaimTx(0); n != 0 {
		t.Errorf("%d of a's TX chains never came back", n)
	}
	if st := portStats(t, d, "a").Queues[0]; st.Drops.BadChain != 0 {
		t.Errorf("a's TX ring stopped for b's fault")
	}
}

// TestStoppedRxPairIsNotOffered: when a guest breaks one RX ring, flows
// pinned to that queue pair move to the port's other pairs (before, they
// kept being picked for the stopped ring and dropped there until the
// frontend set it up again).
func TestStoppedRxPairIsNotOffered(t *testing.T) {
	d := newDataplane(t)
	a := dial(t, addPort(t, d, "a", netdev.RoleServer, 2), frontend.Config{QueuePairs: 2})
	b := dial(t, addPort(t, d, "b", netdev.RoleServer, 2), frontend.Config{QueuePairs: 2, NoRxPrefill: true})
	if err := b.Refill(1); err != nil { // pair 0 gets no buffers yet
		t.Fatal(err)
	}
	if err := a.Send(0, broadcastFrom(macA)); err != nil {
		t.Fatal(err)
	}
	if err := b.Send(0, broadcastFrom(macB)); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Recv(0, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	// b sends the flow on pair 0: the switch pins it to b's pair 0.
	flow := udpFrame(macA, macB, 4242, 9, []byte("pin"))
	if err := b.Send(0, flow); err != nil {
		t.Fatal(err)
	}
	recvAny(t, a, 2, 2*time.Second)
	// b's pair-0 RX buffer lies outside its memory: the next write stops
	// that ring.
	ids, err := b.ReserveDescs(0, 1)
	if err != nil {
		t.Fatal(err)
	}
	b.WriteDesc(0, int(ids[0]), 1<<50, 2048, virtio.DescFWrite, 0)
	b.PublishAvail(0, ids[0])
	back := reply(flow)
	if err := a.Send(0, back); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b's RX ring 0 to stop", func() bool { return portStats(t, d, "b").Queues[0].Drops.BadChain == 1 })
	if err := a.Send(0, back); err != nil {
		t.Fatal(err)
	}
	got, err := b.Recv(1, 2*time.Second)
	if err != nil || !bytes.Equal(got, back) {
		t.Fatalf("the flow's next frame did not move to b's pair 1 (%v); rxDisabled drops on pair 0: %d",
			err, portStats(t, d, "b").Queues[0].Drops.RxDisabled)
	}
}

// faultingRXBuffer gives f's RX ring of pair 0 one buffer in a second
// memory region whose memfd is then truncated: the dataplane's next write
// there faults (SIGBUS), as with a guest that shrinks its memory.
func faultingRXBuffer(t testing.TB, f *frontend.Frontend) {
	t.Helper()
	fd, err := unix.MemfdCreate("vhostmq-shrinking", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	const size, gpa = 1 << 16, 1 << 40
	if err := unix.Ftruncate(fd, size); err != nil {
		t.Fatal(err)
	}
	reg := vhostuser.MemRegion{GuestPhysAddr: gpa, Size: size, UserAddr: f.UserAddr(0) + 1<<40}
	if err := f.Ctrl(vhostuser.ReqAddMemReg, vhostuser.EncodeSingleRegion(nil, reg), []int{fd}); err != nil {
		t.Fatal(err)
	}
	if err := f.WriteDesc(0, 0, gpa, 2048, virtio.DescFWrite, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.PublishAvail(0, 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Ftruncate(fd, 0); err != nil {
		t.Fatal(err)
	}
}
