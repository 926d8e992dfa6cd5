package dataplane

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"regexp"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vhostmq/vhostmq/dataplane/frontend"
	"github.com/vhostmq/vhostmq/dataplane/netdev"
	"github.com/vhostmq/vhostmq/dataplane/vhostuser"
)

// The fault-injection suite (#26): a victim frontend takes back the memory
// it shared (ftruncate of its unsealed memfd, or of its dirty log) at
// every phase the tests can reach. Each case asserts that the process
// lives (the test binary is it), that a numbered stream between two other
// ports on the same worker loses, duplicates and reorders nothing, that
// the victim's port counts one fault of the right reason and serves the
// next frontend, and that no goroutine or fd is left behind.

var macV = [6]byte{0x52, 0x54, 0, 0, 0, 0x0e}

// faultRig is one worker serving three ports: a and b, the bystanders,
// and v, the victim.
type faultRig struct {
	t     *testing.T
	d     *Dataplane
	a, b  *frontend.Frontend
	vSock string
	vcfg  frontend.Config
	v     *frontend.Frontend
	// baseline fds and goroutines: the bystanders connected, the
	// victim's port without a session
	fds, goroutines int
	stream          *frontend.Stream
	logs            *syncBuffer // the dataplane's log
	// fromVictim counts the victim's frames b received during the stream;
	// noneFromVictim: the case wants none (its one frame faulted half way)
	fromVictim     atomic.Int64
	noneFromVictim bool
}

const faultStreamFrames = 3000

func newFaultRig(t *testing.T, cfg Config, vcfg frontend.Config) *faultRig {
	return newFaultRigB(t, cfg, vcfg, frontend.Config{})
}

// newFaultRigB is newFaultRig with b's frontend configured by bcfg.
func newFaultRigB(t *testing.T, cfg Config, vcfg, bcfg frontend.Config) *faultRig {
	t.Helper()
	skipUnderRace(t)
	if cfg.CPUs == nil {
		cfg.CPUs = []int{0} // one worker: the victim's faults happen on the bystanders' worker
	}
	logs := &syncBuffer{}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	}
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	r := &faultRig{t: t, d: d, vcfg: vcfg, logs: logs}
	r.a = dial(t, addPort(t, d, "a", netdev.RoleServer, 1), frontend.Config{})
	r.b = dial(t, addPort(t, d, "b", netdev.RoleServer, 1), bcfg)
	learn(t, r.a, r.b, 1)
	r.vSock = addPort(t, d, "v", netdev.RoleServer, 1)
	r.fds, r.goroutines = openFDs(t), settledGoroutines()
	r.vcfg.UnsealedMemory = true
	r.v = r.connectVictim(r.vcfg)
	return r
}

// connectVictim attaches a frontend to the victim's port and makes the
// switch learn its MAC.
func (r *faultRig) connectVictim(cfg frontend.Config) *frontend.Frontend {
	t := r.t
	t.Helper()
	f, err := frontend.Dial(r.vSock, cfg)
	if err != nil {
		t.Fatalf("victim's port: dial: %v", err)
	}
	if err := f.Send(0, broadcastFrom(macV)); err != nil {
		t.Fatal(err)
	}
	for _, x := range []*frontend.Frontend{r.a, r.b} {
		if fr, _ := recvAny(t, x, 1, 2*time.Second); !bytes.Equal(fr[6:12], macV[:]) {
			t.Fatalf("got %x, want the victim's broadcast", fr[:12])
		}
	}
	return f
}

// startStream starts the bystanders' numbered stream a -> b; b's receiver
// skips what is not a's frame for it (a's frames to the victim, flooded
// while the victim's MAC is unknown, and the victim's own).
func (r *faultRig) startStream() {
	r.stream = frontend.StartStreamMatching(r.a, r.b, faultStreamFrames,
		func(i int) []byte { return numbered(macB, macA, i) },
		func(f []byte) bool {
			if len(f) >= 12 && bytes.Equal(f[6:12], macV[:]) {
				r.fromVictim.Add(1)
			}
			return len(f) >= 12 && bytes.Equal(f[0:12], append(macB[:], macA[:]...))
		})
	waitSent(r.t, r.stream, faultStreamFrames/10)
}

// expectFault checks everything a case must show once the victim faulted.
func (r *faultRig) expectFault(reason netdev.FaultReason) {
	t := r.t
	t.Helper()
	var ps PortStats
	deadline := time.Now().Add(10 * time.Second)
	for {
		ps = portStats(t, r.d, "v")
		if !ps.Connected && faultsOf(ps, reason) >= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("victim's port: connected=%v faults=%+v after 10s, want disconnected with one %s fault", ps.Connected, ps.Faults, reason)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if n := faultsOf(ps, reason); n != 1 || ps.Faults.GuestMemory+ps.Faults.DirtyLog != 1 {
		t.Errorf("victim's port: faults %+v, want exactly one %s fault", ps.Faults, reason)
	}
	if m := caughtIn.FindStringSubmatch(r.logs.String()); m != nil {
		t.Logf("caught while %s", m[1])
	}
	r.v.Close()          // only Close is safe on a frontend whose memory is gone
	if r.stream == nil { // the attack needed an idle worker: the bystanders stream after it
		r.startStream()
	}
	waitStream(t, r.stream) // every frame once, in order
	if n := r.fromVictim.Load(); r.noneFromVictim && n > 0 {
		t.Errorf("b received %d frames (or parts of one) from the victim, whose only frame to it faulted half way", n)
	}
	for _, name := range []string{"a", "b"} {
		ps := portStats(t, r.d, name)
		if !ps.Connected || ps.Connects != 1 || ps.Faults != (netdev.FaultCounts{}) {
			t.Errorf("bystander %s: connected=%v after %d connects, faults=%+v after the victim's fault; want its one session untouched",
				name, ps.Connected, ps.Connects, ps.Faults)
		}
		if q := ps.Queues[0]; q.Drops.BadChain != 0 || !q.RxEnabled || !q.TxEnabled {
			t.Errorf("bystander %s: pair 0 %d bad chains, rx enabled %v, tx enabled %v: the victim's fault reached it",
				name, q.Drops.BadChain, q.RxEnabled, q.TxEnabled)
		}
	}
	// The same port serves the next frontend, both ways.
	v2 := r.connectVictim(frontend.Config{})
	msg := udpFrame(macV, macA, 7, 7, []byte("after the fault"))
	if err := r.a.Send(0, msg); err != nil {
		t.Fatal(err)
	}
	if got, err := v2.Recv(0, 2*time.Second); err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("the victim's next frontend: got %x, %v; want a's frame", got, err)
	}
	back := udpFrame(macA, macV, 7, 7, []byte("back"))
	if err := v2.Send(0, back); err != nil {
		t.Fatal(err)
	}
	if got, err := r.a.Recv(0, 2*time.Second); err != nil || !bytes.Equal(got, back) {
		t.Fatalf("a from the victim's next frontend: got %x, %v", got, err)
	}
	v2.Close()
	waitFor(t, "the victim's port to see its next frontend go", func() bool { return !portStats(t, r.d, "v").Connected })
	r.expectNoLeak()
}

// expectNoLeak compares fds and goroutines with the baseline.
func (r *faultRig) expectNoLeak() {
	t := r.t
	t.Helper()
	var fds, gs int
	deadline := time.Now().Add(5 * time.Second)
	for {
		fds, gs = openFDs(t), settledGoroutines()
		if fds <= r.fds && gs <= r.goroutines {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("left behind: %d fds (baseline %d), %d goroutines (baseline %d)", fds, r.fds, gs, r.goroutines)
			if gs > r.goroutines {
				buf := make([]byte, 1<<20)
				t.Logf("goroutines:\n%s", buf[:runtime.Stack(buf, true)])
			}
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

var caughtIn = regexp.MustCompile(`took back memory it shared.* while="?([^"=]+?)"? revoked=`)

func faultsOf(ps PortStats, reason netdev.FaultReason) uint64 {
	if reason == netdev.FaultDirtyLog {
		return ps.Faults.DirtyLog
	}
	return ps.Faults.GuestMemory
}

func openFDs(t testing.TB) int {
	t.Helper()
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(es)
}

func settledGoroutines() int {
	runtime.GC()
	time.Sleep(10 * time.Millisecond)
	return runtime.NumGoroutine()
}

// shrink takes the victim's whole memory back.
func (r *faultRig) shrink() {
	r.t.Helper()
	if err := r.v.ShrinkMemory(0); err != nil {
		r.t.Fatal(err)
	}
}

// stopWorker stops the rig's one worker, for a test that drives it.
func (r *faultRig) stopWorker() *worker {
	w := r.d.workers[0]
	w.halt()
	return w
}

// victimSends starts the victim sending frames to itself (the switch drops
// them, no destination, after the worker read them from the victim's
// memory) until the returned stop is called or its memory faults, and
// waits until it sent 50.
func (r *faultRig) victimSends() (stop func()) {
	r.t.Helper()
	done, wg := make(chan struct{}), &sync.WaitGroup{}
	var sent atomic.Int64
	untilFault(done, wg, func() error {
		err := r.v.Send(0, udpFrame(macV, macV, 9, 9, []byte("victim")))
		if err == nil {
			sent.Add(1)
		}
		return err
	})
	waitFor(r.t, "the victim to send", func() bool { return sent.Load() >= 50 })
	return sync.OnceFunc(func() { close(done); wg.Wait() })
}

// untilFault runs fn in a loop on a goroutine of its own, which turns
// the victim frontend's own faults (its memory is gone too) into its end,
// until stop is closed or fn fails.
func untilFault(stop <-chan struct{}, wg *sync.WaitGroup, fn func() error) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
		defer func() { recover() }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := fn(); err != nil && !errors.Is(err, frontend.ErrRingFull) && !errors.Is(err, frontend.ErrTimeout) {
				return
			}
		}
	}()
}

func TestGuestFaultStaysInItsPort(t *testing.T) {
	cases := []struct {
		name   string
		idle   bool // the worker must be idle at the attack: no stream during it
		cfg    Config
		vcfg   frontend.Config
		bcfg   frontend.Config // the bystander b's frontend
		reason netdev.FaultReason
		attack func(t *testing.T, r *faultRig)
	}{
		{name: "idle, then a kick", cfg: Config{Watchdog: WatchdogConfig{Bound: -1}}, attack: func(t *testing.T, r *faultRig) {
			r.shrink()
			if err := r.v.Kick(1); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "idle, the watchdog looks", idle: true, cfg: Config{Watchdog: WatchdogConfig{Bound: 20 * time.Millisecond}}, attack: func(t *testing.T, r *faultRig) {
			r.shrink()
		}},
		{name: "guest sending", attack: func(t *testing.T, r *faultRig) {
			stop := r.victimSends()
			r.shrink()
			time.Sleep(50 * time.Millisecond)
			stop()
		}},
		{name: "guest sending to a bystander, a frame across the revoked end", attack: acrossRevokedEnd},
		{name: "guest sending to a bystander with small buffers, a frame across the revoked end", bcfg: frontend.Config{RxBufSize: 512},
			attack: acrossRevokedEnd},
		{name: "guest receiving from another port", attack: func(t *testing.T, r *faultRig) {
			stop, wg := make(chan struct{}), &sync.WaitGroup{}
			var got atomic.Int64
			untilFault(stop, wg, func() error {
				if _, err := r.v.Recv(0, time.Millisecond); err != nil {
					return err
				}
				got.Add(1)
				return nil
			})
			// a sends to the victim from a goroutine of its own, beside
			// the stream: the worker faults while serving a's TX ring.
			aStop, awg := make(chan struct{}), &sync.WaitGroup{}
			awg.Add(1)
			go func() {
				defer awg.Done()
				for i := 0; ; i++ {
					select {
					case <-aStop:
						return
					default:
					}
					if err := r.a.Send(0, udpFrame(macV, macA, 5, 5, []byte("to the victim"))); err != nil {
						time.Sleep(100 * time.Microsecond)
					}
					if i%8 == 0 {
						time.Sleep(50 * time.Microsecond)
					}
				}
			}()
			waitFor(t, "the victim to receive", func() bool { return got.Load() >= 50 })
			r.shrink()
			waitFor(t, "the victim's fault", func() bool { return portStats(t, r.d, "v").Faults.GuestMemory > 0 })
			time.Sleep(50 * time.Millisecond) // a goes on sending to the gone victim
			close(aStop)
			awg.Wait()
			close(stop)
			wg.Wait()
		}},
		{name: "ring stopped with GET_VRING_BASE, restarted after", cfg: Config{Watchdog: WatchdogConfig{Bound: -1}}, attack: func(t *testing.T, r *faultRig) {
			// The ring stops first: from then on no worker touches it
			// (a running ring's fault is the worker's to catch).
			if _, err := r.v.GetVringBase(1); err != nil {
				t.Fatalf("GET_VRING_BASE: %v", err)
			}
			r.shrink()
			efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(efd)
			// SET_VRING_KICK restarts the ring: the control path reads
			// its used index from the gone memory.
			r.v.Ctrl(vhostuser.ReqSetVringKick, vhostuser.EncodeU64(nil, 1), []int{efd})
		}},
		{name: "a new SET_MEM_TABLE", cfg: Config{Watchdog: WatchdogConfig{Bound: -1}}, attack: func(t *testing.T, r *faultRig) {
			// Both rings stop first, so that no worker finds the memory
			// gone before the control path does.
			for _, vr := range []int{0, 1} {
				if _, err := r.v.GetVringBase(vr); err != nil {
					t.Fatalf("GET_VRING_BASE %d: %v", vr, err)
				}
			}
			r.shrink()
			err := r.v.SetMemTableRegions(r.v.Regions())
			var nack *frontend.NackError
			if !errors.As(err, &nack) {
				t.Fatalf("SET_MEM_TABLE of the shrunk memory: %v, want a refusal", err)
			}
			// The old table stays; restarting a ring on it faults.
			efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(efd)
			r.v.Ctrl(vhostuser.ReqSetVringKick, vhostuser.EncodeU64(nil, 1), []int{efd})
		}},
		{name: "a rebalance move of the victim's pair, the guest sending", cfg: Config{CPUs: []int{0, 1}}, attack: func(t *testing.T, r *faultRig) {
			stop := r.victimSends()
			defer stop()
			pv := r.d.byName["v"]
			from := pv.workers[0].Load()
			to := r.d.workers[0]
			if to == from {
				to = r.d.workers[1]
			}
			r.shrink()
			r.d.placeMu.Lock()
			err := r.d.move(pv.assigns[0], from, to)
			r.d.placeMu.Unlock()
			if err != nil {
				t.Fatalf("moving the victim's pair: %v", err)
			}
		}},
		{name: "dirty log, guest receiving", vcfg: frontend.Config{ProtocolFeatures: frontend.DefaultProtocolFeatures | 1<<vhostuser.ProtoLogSHMFD},
			reason: netdev.FaultDirtyLog, attack: func(t *testing.T, r *faultRig) {
				fd, _, size := newDirtyLog(t, r.v)
				r.fds++ // the test's own log fd, closed when it ends
				if err := r.v.SetLogBase(fd, size, 0); err != nil {
					t.Fatal(err)
				}
				lr := &logRig{b: r.v}
				lr.setFeatures(t, true)
				lr.setLogUsed(t, true)
				stop, wg := make(chan struct{}), &sync.WaitGroup{}
				untilFault(stop, wg, func() error {
					_, err := r.v.Recv(0, time.Millisecond)
					return err
				})
				if err := unix.Ftruncate(fd, 0); err != nil {
					t.Fatal(err)
				}
				for i := 0; portStats(t, r.d, "v").Faults.DirtyLog == 0 && i < 2000; i++ {
					if err := r.a.Send(0, udpFrame(macV, macA, 5, 5, []byte("logged"))); err != nil {
						time.Sleep(time.Millisecond)
					}
				}
				close(stop)
				wg.Wait()
			}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := newFaultRigB(t, c.cfg, c.vcfg, c.bcfg)
			if !c.idle {
				r.startStream()
			}
			c.attack(t, r)
			r.expectFault(cmpReason(c.reason))
		})
	}
}

func cmpReason(r netdev.FaultReason) netdev.FaultReason {
	if r == "" {
		return netdev.FaultGuestMemory
	}
	return r
}

// TestFaultIsLoggedWithWhatWasRevoked: the log line names the port, the
// ring and what the frontend took back.
func TestFaultIsLoggedWithWhatWasRevoked(t *testing.T) {
	var buf syncBuffer
	cfg := Config{Watchdog: WatchdogConfig{Bound: -1}, Logger: slog.New(slog.NewTextHandler(&buf, nil))}
	r := newFaultRig(t, cfg, frontend.Config{})
	r.shrink()
	if err := r.v.Kick(1); err != nil {
		t.Fatal(err)
	}
	r.expectFault(netdev.FaultGuestMemory)
	out := buf.String()
	for _, want := range []string{"took back memory it shared", "port=v", "vring=1", "guest memory region gpa 0x100000", "its file now has 0 bytes", "reason=guest_memory"} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestGuestFaultDuringHandoff: the victim takes its memory back while its
// port is being handed to a successor dataplane (after the predecessor
// froze it, before the successor maps it). The successor adopts the port
// without its session instead of refusing the whole takeover: the
// bystanders' stream crosses the handoff whole, the victim's port on the
// successor counts the fault and serves the victim's next frontend.
func TestGuestFaultDuringHandoff(t *testing.T) {
	skipUnderRace(t)
	cases := []struct {
		name     string
		twoPhase bool
		// afterMapped: the memory goes once the successor mapped it
		// (two phases: before Final), not before it does
		afterMapped bool
	}{{"one-phase", false, false}, {"two-phase", true, false}, {"two-phase, after the successor mapped it", true, true}}
	for _, ph := range cases {
		t.Run(ph.name, func(t *testing.T) {
			old := newDataplane(t, 0)
			cfgs := map[string]netdev.Config{}
			a := attach(t, old, "a", netdev.RoleServer, 1, cfgs)
			b := attach(t, old, "b", netdev.RoleServer, 1, cfgs)
			learn(t, a, b, 1)
			vcfg := netdev.Config{Name: "v", Socket: sockPath(t, "v"), Role: netdev.RoleServer, QueuePairs: 1, MTU: 1500}
			cfgs["v"] = vcfg
			if err := old.AddPort(vcfg, PortOptions{}); err != nil {
				t.Fatal(err)
			}
			v, err := frontend.Dial(vcfg.Socket, frontend.Config{UnsealedMemory: true})
			if err != nil {
				t.Fatal(err)
			}
			defer v.Close()
			s := frontend.StartStreamMatching(a, b, faultStreamFrames, func(i int) []byte { return numbered(macB, macA, i) },
				func(f []byte) bool { return bytes.Equal(f[0:6], macB[:]) })
			waitSent(t, s, faultStreamFrames/3)

			oc, nc := handoffPair(t)
			var logs syncBuffer
			succ, err := New(Config{CPUs: []int{0}, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(succ.Close)
			shrunk := make(chan error, 1)
			shrink := func() { shrunk <- v.ShrinkMemory(0) }
			var oldDone chan error
			var rep *HandoverReport
			if ph.afterMapped {
				oldDone, rep = oldSideFinal(old, oc, nil, shrink)
			} else {
				oldDone, rep = oldSide(old, oc, shrink)
			}
			if err := newSide(t, succ, nc, cfgs, ph.twoPhase); err != nil {
				t.Fatal("successor: ", err)
			}
			if err := <-oldDone; err != nil {
				t.Fatal("old: ", err)
			}
			if err := <-shrunk; err != nil {
				t.Fatal(err)
			}
			waitStream(t, s)
			if rep.Ports != 3 {
				t.Errorf("handed %d ports, want 3", rep.Ports)
			}
			waitFor(t, "the successor to end the victim's session", func() bool {
				ps := portStats(t, succ, "v")
				return !ps.Connected && ps.Faults.GuestMemory == 1
			})
			if m := caughtIn.FindStringSubmatch(logs.String()); m != nil {
				t.Logf("caught by the successor while %s", m[1])
			}
			for _, name := range []string{"a", "b"} {
				if p, _ := succ.Port(name); !p.Connected() || p.Connects() != 1 {
					t.Errorf("bystander %s on the successor: connected %v after %d connects; want its adopted session", name, p.Connected(), p.Connects())
				}
			}
			v.Close()
			v2 := dial(t, vcfg.Socket, frontend.Config{})
			if err := v2.Send(0, udpFrame(macA, macV, 1, 1, []byte("after the handoff"))); err != nil {
				t.Fatal(err)
			}
			if got, err := a.Recv(0, 2*time.Second); err != nil || !bytes.Equal(got[6:12], macV[:]) {
				t.Fatalf("a from the victim's next frontend: %x, %v", got, err)
			}
		})
	}
}

// TestArmingFaultedRingBeforeSleep: a worker about to sleep re-enables
// kicks on every ring it serves (arm), writing ring memory outside a
// burst. The victim's memory gone, that ends the victim's session only,
// and arm says to look again (the next pass finds the ring stopped).
func TestArmingFaultedRingBeforeSleep(t *testing.T) {
	r := newFaultRig(t, Config{Watchdog: WatchdogConfig{Bound: -1}}, frontend.Config{})
	w := r.stopWorker()
	// The test drives the worker: faults become panics as on its thread.
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	r.shrink()
	if !w.arm() {
		t.Error("arm found the victim's ring faulted and did not say to look again")
	}
	waitFor(t, "the victim's session to end", func() bool {
		ps := portStats(t, r.d, "v")
		return !ps.Connected && ps.Faults.GuestMemory == 1
	})
	if m := caughtIn.FindStringSubmatch(r.logs.String()); m == nil || m[1] != "notification setting" {
		t.Errorf("caught in %q, want notification setting", m)
	}
	for _, name := range []string{"a", "b"} {
		if ps := portStats(t, r.d, name); !ps.Connected || ps.Queues[0].Drops.BadChain != 0 {
			t.Errorf("bystander %s: connected %v, %d bad chains", name, ps.Connected, ps.Queues[0].Drops.BadChain)
		}
	}
	r.v.Close()
}

// TestRequireSealedMemory: with RequireSealedMemory, memory and a dirty
// log whose file the frontend could shrink are refused with an error
// naming the port and the setting; sealed memory is served, and the
// stats say which is which.
func TestRequireSealedMemory(t *testing.T) {
	var logs syncBuffer
	d, err := New(Config{RequireSealedMemory: true, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	sock := addPort(t, d, "strict", netdev.RoleServer, 1)
	_, err = frontend.Dial(sock, frontend.Config{UnsealedMemory: true})
	if err == nil || !strings.Contains(err.Error(), "SET_MEM_TABLE") {
		t.Fatalf("an unsealed frontend: %v, want SET_MEM_TABLE refused", err)
	}
	waitFor(t, "the refusal in the log", func() bool { return strings.Contains(logs.String(), "requireSealedMemory") })
	for _, want := range []string{`port \"strict\": SET_MEM_TABLE region 0`, "not sealed against shrinking (F_SEAL_SHRINK)", "requireSealedMemory"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the refusal does not say %q:\n%s", want, logs.String())
		}
	}
	f := dial(t, sock, frontend.Config{ProtocolFeatures: frontend.DefaultProtocolFeatures | 1<<vhostuser.ProtoLogSHMFD})
	if m := portStats(t, d, "strict").Memory; !m.Sealed() || m.Regions != 1 {
		t.Errorf("a sealed frontend: memory %+v, want sealed", m)
	}
	// Its dirty log is a plain memfd: refused too.
	fd, _, size := newDirtyLog(t, f)
	if err := f.SetLogBase(fd, size, 0); err == nil {
		t.Error("an unsealed dirty log was accepted")
	}
	if m := portStats(t, d, "strict").Memory; m.Log {
		t.Errorf("memory %+v after the refused log: want no log mapped", m)
	}
}

// TestInterruptDecisionFaultStaysInItsPort: whether a guest wants an
// interrupt is read from its ring memory at the end of a burst, for every
// destination the burst touched, by the worker serving the source. A
// destination whose memory is gone there ends its own session: the source
// and the other destinations are not blamed, and the worker goes on.
func TestInterruptDecisionFaultStaysInItsPort(t *testing.T) {
	r := newFaultRig(t, Config{Watchdog: WatchdogConfig{Bound: -1}}, frontend.Config{})
	w := r.stopWorker()
	// The test drives the worker: faults become panics as on its thread.
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	vrx := r.d.byName["v"].dev.Vrings()[0]
	brx := r.d.byName["b"].dev.Vrings()[0]
	for _, rv := range []*netdev.Vring{brx, vrx} { // a burst delivered to both
		rv.Lock()
		w.touch(rv)
		rv.Unlock()
	}
	r.shrink()
	w.callTouched()
	waitFor(t, "the victim's session to end", func() bool {
		ps := portStats(t, r.d, "v")
		return !ps.Connected && ps.Faults.GuestMemory == 1
	})
	if m := caughtIn.FindStringSubmatch(r.logs.String()); m == nil || m[1] != "interrupt decision" {
		t.Errorf("caught in %q, want interrupt decision", m)
	}
	for _, name := range []string{"a", "b"} {
		if ps := portStats(t, r.d, name); !ps.Connected || ps.Queues[0].Drops.BadChain != 0 || ps.Faults.GuestMemory != 0 {
			t.Errorf("bystander %s: connected %v, %d bad chains, faults %+v", name, ps.Connected, ps.Queues[0].Drops.BadChain, ps.Faults)
		}
	}
	r.v.Close()
}

// acrossRevokedEnd: the victim's rings stay and its TX buffers go, and its
// last frame to b starts before the new end of its memory: the worker
// faults half way through copying it into b's RX ring (across several of
// b's buffers when they are small). b keeps its ring and what it got (the
// stream to it loses nothing).
func acrossRevokedEnd(t *testing.T, r *faultRig) {
	r.noneFromVictim = true
	// Its rings stay, its TX buffers go, and its last frame to b
	// starts before the new end of its memory: the worker faults
	// half way through copying it into b's RX ring. b keeps its
	// ring and what it got (the stream to it loses nothing).
	vi, err := r.v.Vring(1)
	if err != nil {
		t.Fatal(err)
	}
	end := vi.BufOff &^ (os.Getpagesize() - 1)
	frame := udpFrame(macB, macV, 9, 9, bytes.Repeat([]byte("v"), 1400))
	const hdr = 12           // virtio-net header, VERSION_1
	start := end - hdr - 700 // 700 bytes stay: more than one small buffer of b
	clear(r.v.Mem()[start : start+hdr])
	copy(r.v.Mem()[start+hdr:end], frame) // the header and the first bytes stay
	if err := r.v.ShrinkMemory(end); err != nil {
		t.Fatal(err)
	}
	ids, err := r.v.ReserveDescs(1, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.v.WriteDesc(1, int(ids[0]), r.v.GPA(start), uint32(hdr+len(frame)), 0, 0); err != nil {
		t.Fatal(err)
	}
	if err := r.v.PublishAvail(1, ids[0]); err != nil {
		t.Fatal(err)
	}
	if err := r.v.Kick(1); err != nil {
		t.Fatal(err)
	}
}

// skipUnderRace skips a fault-injection test under -race (raceDetector).
func skipUnderRace(t *testing.T) {
	t.Helper()
	if raceDetector {
		t.Skip("a fault inside the race detector's atomics cannot become a panic: run without -race (make test-unit)")
	}
}

// TestResetOwnerStopsTheSession: RESET_OWNER (and RESET_DEVICE) stop every
// ring and forget the negotiation, and the same connection goes on: it is
// answered and can set the device up again.
func TestResetOwnerStopsTheSession(t *testing.T) {
	d := newDataplane(t)
	a := dial(t, addPort(t, d, "a", netdev.RoleServer, 1), frontend.Config{})
	if ps := portStats(t, d, "a"); ps.EnabledPairs != 1 || ps.Memory.Regions != 1 {
		t.Fatalf("before: %d pairs enabled, %d regions", ps.EnabledPairs, ps.Memory.Regions)
	}
	if err := a.Conn().WriteMessage(vhostuser.ReqResetOwner, 1, nil, nil); err != nil { // version 1, no NEED_REPLY
		t.Fatal(err)
	}
	v, err := a.CtrlGet(vhostuser.ReqGetFeatures, nil)
	if err != nil || len(v) != 8 {
		t.Fatalf("GET_FEATURES after RESET_OWNER: %x, %v", v, err)
	}
	ps := portStats(t, d, "a")
	if ps.EnabledPairs != 0 || ps.Memory.Regions != 0 || !ps.Connected {
		t.Errorf("after RESET_OWNER: %d pairs enabled, %d regions mapped, connected %v; want nothing set up, the connection kept",
			ps.EnabledPairs, ps.Memory.Regions, ps.Connected)
	}
}
