// Command neighbour measures what a flood does to a neighbour on the same
// dataplane worker (#27: the same-worker flood's effect on a neighbour's
// p99), in-process with Go test frontends (dataplane/frontend) as guests.
// One worker serves four ports: a request/response pair (r1 sends a
// 64-byte frame to r2, r2's thread answers at once, r1 times the round
// trip) and a flood pair (f1 sends 64-byte frames to f2 as fast as it
// can). Each trial runs the round trips quiet, beside the flood, and
// beside the flood under an egress limit on f1 (-flood-limit: the limiter
// protecting the neighbour), alternating so that the machine's drift
// falls on each alike. It prints the round trips' p50/p99/p999 and rate,
// the flood's frames/s before and during them, and p99 over the quiet
// p99, per trial and pooled.
//
// Isolation on two CPUs: the worker alone on -worker-cpu, every other
// thread of the process on -gen-cpu. There the r threads run at normal
// priority and sleep on their call eventfds between frames, as a vCPU
// waits for its interrupt; the flood's generator and sink run at
// SCHED_IDLE (nice 19 where refused), each on its own locked thread, so
// the kernel runs an r thread first whenever it is runnable: the
// neighbour loses the worker's time, not a CPU shared with the flood's
// guests. In the quiet variant the flood's threads spin without sending,
// so that -gen-cpu never halts in any variant (waking a halted vCPU adds
// ~25 µs here, to the quiet round trips alone).
//
// The flood's threads share the Go runtime with the r threads, and one
// holding a runtime lock while starved would stall them (with the
// collector on, p99 was 4-5 ms and the flood stopped): so they allocate
// nothing (the sink gives f2's RX buffers back by hand instead of
// copying frames out), the collector is off during a trial, and
// GOMAXPROCS is raised so that a woken r thread never waits for a P.
// Each row gives how long the worker, and the r threads, waited runnable
// for their CPUs (schedstat): their wake-ups' latency, and on a shared
// machine what other processes took from them.
//
// It measures and prints (TSV); it asserts nothing. `make bench` runs it.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vhostmq/vhostmq/dataplane"
	"github.com/vhostmq/vhostmq/dataplane/frontend"
	"github.com/vhostmq/vhostmq/dataplane/virtio"
	"github.com/vhostmq/vhostmq/hack/bench/inproc"
)

var (
	macF1 = [6]byte{0x52, 0x54, 0, 0, 0, 0xf1}
	macF2 = [6]byte{0x52, 0x54, 0, 0, 0, 0xf2}
	macR1 = [6]byte{0x52, 0x54, 0, 0, 0, 0x01}
	macR2 = [6]byte{0x52, 0x54, 0, 0, 0, 0x02}
)

func main() {
	trials := flag.Int("trials", 3, "trials, each running every variant once")
	rtts := flag.Int("round-trips", 5000, "timed round trips per variant and trial")
	limitFlag := flag.String("flood-limit", "100M", "egress limit of the flood's sender in the third variant (bits/s; \"\": no such variant)")
	warmup := flag.Duration("warmup", 200*time.Millisecond, "how long the flood runs alone before the round trips (flood_fps_alone)")
	modeFlag := flag.String("mode", "adaptive", "the ports' polling mode (adaptive, interrupt, busy)")
	workerCPU := flag.Int("worker-cpu", 1, "CPU of the dataplane's one worker, alone")
	genCPU := flag.Int("gen-cpu", 0, "CPU of the guests' threads (r pair at normal priority, flood at SCHED_IDLE) and the rest of the process")
	flag.Parse()
	mode, err := inproc.ParsePolling(*modeFlag)
	if err != nil {
		fail(fmt.Errorf("-mode: %w", err))
	}
	variants := []variant{{name: "quiet"}, {name: "flood", flood: true}}
	if *limitFlag != "" {
		lim, err := inproc.ParseRate(*limitFlag)
		if err != nil {
			fail(fmt.Errorf("-flood-limit: %w", err))
		}
		variants = append(variants, variant{name: "flood@" + *limitFlag, flood: true, limit: lim})
	}
	// The main thread stays the main goroutine's: a pinned goroutine
	// ending on it would leave it wedged (it cannot exit) at idle priority.
	runtime.LockOSThread()
	if err := inproc.PinProcess(*genCPU); err != nil {
		fail(fmt.Errorf("pinning the process to CPU %d: %w", *genCPU, err))
	}
	inproc.SpareProcs(8)
	debug.SetGCPercent(-1)
	debug.SetMemoryLimit(1 << 30) // a trial longer than planned still collects
	policy, err := idlePolicy(*genCPU)
	if err != nil {
		fail(fmt.Errorf("lowering the flood's threads: %w", err))
	}

	b, err := newBench(mode, *workerCPU, *genCPU, *warmup)
	if err != nil {
		fail(err)
	}
	defer b.r.Close()
	if b.worker, err = inproc.ThreadOn(*workerCPU); err != nil {
		fail(err)
	}
	fmt.Printf("# %s, %d CPUs, Go frontend guests; worker alone on CPU %d (polling %s), every other thread on CPU %d: there the r pair's threads at normal priority (sleeping on their call eventfds between frames), the flood's generator and sink at %s (spinning without sending when quiet), so the kernel runs the r threads first whenever they are runnable; GOMAXPROCS %d, GC off in trials; %d round trips of 64 B per variant and trial after %s of the flood alone; %s\n",
		time.Now().UTC().Format(time.RFC3339), runtime.NumCPU(), *workerCPU, mode, *genCPU, policy, runtime.GOMAXPROCS(0), *rtts, *warmup, inproc.Pressure())
	fmt.Println("trial\tvariant\tround_trips\tp50_us\tp99_us\tp999_us\tround_trips_per_s\tflood_fps_alone\tflood_fps\tp99_vs_quiet\tworker_runq_wait_pct\tr_runq_wait_pct")
	pooled := make([]result, len(variants))
	for t := 1; t <= *trials; t++ {
		var quiet time.Duration
		for i, v := range variants {
			res, err := b.trial(v, *rtts)
			if err != nil {
				fail(fmt.Errorf("trial %d, %s: %w", t, v.name, err))
			}
			if i == 0 {
				quiet = res.pct(0.99)
			}
			res.print(fmt.Sprint(t), v.name, quiet)
			pooled[i].add(res)
		}
	}
	for i, v := range variants {
		pooled[i].print("all", v.name, pooled[0].pct(0.99))
	}
	fmt.Printf("# after: %s\n", inproc.Pressure())
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "neighbour:", err)
	os.Exit(1)
}

// variant is what runs beside the round trips.
type variant struct {
	name  string
	flood bool
	limit uint64 // f1's egress limit, bits/s (0: none)
}

// result is a variant's round trips, sorted, the flood's frames received
// meanwhile, and how long the worker waited for its CPU.
type result struct {
	rtts                    []time.Duration
	elapsed, runWait, rWait time.Duration
	floodFrames             uint64
	floodAlone              float64 // frames/s before the round trips (summed when pooled)
	trials                  int     // pooled
}

func (r *result) add(o result) {
	r.rtts = append(r.rtts, o.rtts...)
	slices.Sort(r.rtts)
	r.elapsed += o.elapsed
	r.runWait += o.runWait
	r.rWait += o.rWait
	r.floodFrames += o.floodFrames
	r.floodAlone += o.floodAlone
	r.trials++
}

func (r result) pct(q float64) time.Duration {
	if len(r.rtts) == 0 {
		return 0
	}
	return r.rtts[min(len(r.rtts)-1, int(q*float64(len(r.rtts))))]
}

func (r result) print(trial, variant string, quiet time.Duration) {
	us := func(d time.Duration) float64 { return float64(d) / 1e3 }
	s := r.elapsed.Seconds()
	alone := r.floodAlone / float64(max(r.trials, 1))
	fmt.Printf("%s\t%s\t%d\t%.1f\t%.1f\t%.1f\t%.0f\t%.0f\t%.0f\t%.2f\t%.1f\t%.1f\n", trial, variant, len(r.rtts), us(r.pct(0.5)), us(r.pct(0.99)), us(r.pct(0.999)),
		float64(len(r.rtts))/s, alone, float64(r.floodFrames)/s, float64(r.pct(0.99))/float64(quiet), 100*float64(r.runWait)/float64(r.elapsed),
		100*float64(r.rWait)/float64(r.elapsed))
}

// idlePolicy reports what Idle does on this kernel, from a thread that
// ends with it.
func idlePolicy(cpu int) (string, error) {
	type answer struct {
		policy string
		err    error
	}
	c := make(chan answer)
	go func() {
		inproc.Pin(cpu)
		p, err := inproc.Idle()
		c <- answer{p, err}
	}()
	a := <-c
	return a.policy, a.err
}

// bench is the dataplane and the four guests, set up once for every trial.
type bench struct {
	r              *inproc.Rig
	f1, f2, r1, r2 *frontend.Frontend
	cpu            int
	warmup         time.Duration
	worker         int          // the worker's thread
	answerer       atomic.Int64 // r2's thread
	// f2's RX ring, reaped by hand: the next used entry, and the frames
	// reaped
	last uint16
	sunk atomic.Uint64
}

func newBench(mode dataplane.Polling, workerCPU, genCPU int, warmup time.Duration) (*bench, error) {
	r, err := inproc.NewRig(dataplane.Config{CPUs: []int{workerCPU}})
	if err != nil {
		return nil, err
	}
	b := &bench{r: r, cpu: genCPU, warmup: warmup}
	opts := dataplane.PortOptions{Polling: mode}
	flood := frontend.Config{QueueSize: 1024, RxPoll: true}
	sink := frontend.Config{QueueSize: 1024, RxPoll: true, NoRxPrefill: true} // its buffers posted raw
	rr := frontend.Config{QueueSize: 256}                                     // RX waits sleep on the call eventfd
	for _, p := range []struct {
		f    **frontend.Frontend
		name string
		mac  [6]byte
		cfg  frontend.Config
	}{{&b.f1, "f1", macF1, flood}, {&b.f2, "f2", macF2, sink}, {&b.r1, "r1", macR1, rr}, {&b.r2, "r2", macR2, rr}} {
		if *p.f, err = r.Add(p.name, p.mac[:], opts, p.cfg); err != nil {
			r.Close()
			return nil, err
		}
	}
	if err := b.postRaw(); err != nil {
		r.Close()
		return nil, err
	}
	// every address learned: no frame is flooded to a neighbour (f2 hears
	// the others' greetings too, in its raw buffers: the sink reaps them)
	all := []*frontend.Frontend{b.f1, b.f2, b.r1, b.r2}
	for i, mac := range [][6]byte{macF1, macF2, macR1, macR2} {
		hear := slices.DeleteFunc(slices.Clone(all), func(f *frontend.Frontend) bool { return f == all[i] || f == b.f2 })
		if err := inproc.Greet(all[i], mac, hear...); err != nil {
			r.Close()
			return nil, err
		}
	}
	return b, nil
}

// postRaw gives every descriptor of f2's RX ring, each with its buffer,
// to the dataplane as a raw chain, which the sink reaps and gives back
// without the frontend's Recv (it copies each frame into a new slice).
func (b *bench) postRaw() error {
	vi, err := b.f2.Vring(0)
	if err != nil {
		return err
	}
	ids, err := b.f2.ReserveDescs(0, vi.Size)
	if err != nil {
		return err
	}
	for _, id := range ids {
		if err := b.f2.WriteDesc(0, int(id), b.f2.GPA(vi.BufOff+int(id)*vi.BufSize), uint32(vi.BufSize), virtio.DescFWrite, 0); err != nil {
			return err
		}
	}
	if err := b.f2.PublishAvail(0, ids...); err != nil {
		return err
	}
	return b.f2.Notify(0)
}

// trial runs n round trips beside v.
func (b *bench) trial(v variant, n int) (result, error) {
	runtime.GC() // none during the trial
	errc := make(chan error, 4)
	var stopFlood, drain atomic.Bool
	genDone, sinkDone := make(chan struct{}), make(chan struct{})
	if v.limit > 0 {
		if err := b.r.D.SetBandwidth("f1", dataplane.Bandwidth{Egress: dataplane.Rate{BitsPerSecond: v.limit}}); err != nil {
			return result{}, err
		}
	}
	// quiet too: the flood's threads spin without sending
	go b.generate(v.flood, &stopFlood, genDone, errc)
	go b.sink(&drain, sinkDone, errc)
	f0, t0 := b.sunk.Load(), time.Now()
	time.Sleep(b.warmup)
	alone := float64(b.sunk.Load()-f0) / time.Since(t0).Seconds()
	var stopAnswers atomic.Bool
	answered := make(chan struct{})
	go b.answer(&stopAnswers, answered, errc)
	resc := make(chan result, 1)
	go func() {
		res, err := b.roundTrips(n)
		if err != nil {
			errc <- err
		}
		resc <- res
	}()
	res := <-resc
	res.floodAlone = alone
	stopAnswers.Store(true)
	<-answered
	// The flood stops and its frames drain, limit lifted, so that the
	// next trial finds the worker with nothing of it left.
	stopFlood.Store(true)
	<-genDone
	if v.limit > 0 {
		if err := b.r.D.SetBandwidth("f1", dataplane.Bandwidth{}); err != nil {
			return res, err
		}
	}
	drain.Store(true)
	<-sinkDone
	select {
	case err := <-errc:
		return res, err
	default:
	}
	return res, nil
}

// generate is f1's guest, at idle priority: 64-byte frames to f2 as fast
// as its ring takes them, or (quiet) just the spinning.
func (b *bench) generate(send bool, stop *atomic.Bool, done chan<- struct{}, errc chan<- error) {
	defer close(done)
	if err := b.lower(); err != nil {
		errc <- err
		return
	}
	burst := inproc.Burst(macF2, macF1, 64, 32)
	for !send && !stop.Load() {
	}
	for !stop.Load() {
		if _, err := b.f1.SendBurst(0, burst); err != nil && !errors.Is(err, frontend.ErrRingFull) {
			errc <- fmt.Errorf("flooding: %w", err)
			return
		}
	}
}

// sink is f2's guest, at idle priority: it drains until told to, and
// then until f1's ring is empty. It reaps f2's used ring by hand and
// gives the buffers straight back (postRaw), allocating nothing.
func (b *bench) sink(drain *atomic.Bool, done chan<- struct{}, errc chan<- error) {
	defer close(done)
	if err := b.lower(); err != nil {
		errc <- err
		return
	}
	heads := make([]uint16, 0, 1024)
	var until time.Time
	for {
		heads = heads[:0]
		for used := b.f2.UsedIdx(0); b.last != used; b.last++ {
			heads = append(heads, uint16(b.f2.UsedElemAt(0, b.last).ID))
		}
		if len(heads) > 0 {
			b.sunk.Add(uint64(len(heads)))
			if err := b.f2.PublishAvail(0, heads...); err != nil {
				errc <- fmt.Errorf("sinking the flood: %w", err)
				return
			}
			if err := b.f2.Notify(0); err != nil {
				errc <- fmt.Errorf("sinking the flood: %w", err)
				return
			}
			continue
		}
		if !drain.Load() {
			continue
		}
		if until.IsZero() {
			until = time.Now().Add(5 * time.Second)
		}
		left, err := b.f1.ReclaimTx(0)
		if left == 0 || err != nil {
			return
		}
		if time.Now().After(until) {
			errc <- fmt.Errorf("the flood's ring still holds %d frames 5 s after it stopped", left)
			return
		}
	}
}

// lower pins the calling goroutine's thread beside the r pair, at idle
// priority.
func (b *bench) lower() error {
	if err := inproc.Pin(b.cpu); err != nil {
		return err
	}
	_, err := inproc.Idle()
	return err
}

// answer is r2's guest: each frame from r1 answered at once.
func (b *bench) answer(stop *atomic.Bool, done chan<- struct{}, errc chan<- error) {
	defer close(done)
	if err := inproc.Pin(b.cpu); err != nil {
		errc <- err
		return
	}
	b.answerer.Store(int64(unix.Gettid()))
	reply := inproc.Frame(macR1, macR2)
	for !stop.Load() {
		if _, err := b.r2.Recv(0, 20*time.Millisecond); err != nil {
			if errors.Is(err, frontend.ErrTimeout) {
				continue
			}
			errc <- fmt.Errorf("r2 receiving: %w", err)
			return
		}
		if err := b.r2.Send(0, reply); err != nil {
			errc <- fmt.Errorf("r2 answering: %w", err)
			return
		}
	}
}

// roundTrips is r1's guest: n timed round trips after a few untimed ones
// (the threads' first wake-ups, the rings' first pages).
func (b *bench) roundTrips(n int) (result, error) {
	var res result
	if err := inproc.Pin(b.cpu); err != nil {
		return res, err
	}
	req := inproc.Frame(macR2, macR1)
	trip := func() error {
		if err := b.r1.Send(0, req); err != nil {
			return fmt.Errorf("r1 sending: %w", err)
		}
		for {
			fr, err := b.r1.Recv(0, time.Second)
			if err != nil {
				return fmt.Errorf("r1 waiting for r2's answer: %w", err)
			}
			if len(fr) >= 12 && [6]byte(fr[6:12]) == macR2 {
				return nil
			}
		}
	}
	for range 100 {
		if err := trip(); err != nil {
			return res, err
		}
	}
	res.rtts = make([]time.Duration, 0, n)
	// r2 has answered: its thread is known
	rWait := func() time.Duration { return inproc.RunqWait(unix.Gettid()) + inproc.RunqWait(int(b.answerer.Load())) }
	f0, w0, r0, start := b.sunk.Load(), inproc.RunqWait(b.worker), rWait(), time.Now()
	for range n {
		t0 := time.Now()
		if err := trip(); err != nil {
			return res, err
		}
		res.rtts = append(res.rtts, time.Since(t0))
	}
	res.elapsed, res.floodFrames = time.Since(start), b.sunk.Load()-f0
	res.runWait, res.rWait = inproc.RunqWait(b.worker)-w0, rWait()-r0
	slices.Sort(res.rtts)
	return res, nil
}
