// Command limiter measures how closely the per-port rate limits
// (dataplane.PortOptions.Bandwidth, dataplane/bandwidth.go) hold their
// rate, in-process with the Go test frontend (dataplane/frontend) playing
// the guests: port a sends to port b, one goroutine pinned to -gen-cpu
// offering frames on a as fast as it can and draining b, the worker alone
// on -worker-cpu (every other thread of the process pinned to -gen-cpu).
// For each frame size and rate, a run without a limit, then one for each
// direction:
//
//   - egress: the limit on a, shaped (a's frames wait in its ring);
//   - ingress: the limit on b, policed (drops.rateLimited).
//
// Each run is a fresh dataplane. The bucket starts full (10 ms of the
// rate by default), so the run first offers for -warmup, which spends the
// initial burst, and then counts over -window what b's frontend itself
// received, in Ethernet frame bytes as the limit counts them: nothing is
// subtracted. It prints that rate, its ratio to the limit, the offered
// rate, what a sent, frames/s, the limiter's own counts over the window,
// and how long the worker and the generator waited for their CPUs
// (schedstat): on a shared machine a bucket overflows, and loses tokens,
// while its worker waits, or while the generator does and offers nothing.
//
// The offered rate is what b received in the run without a limit just
// before: what the generator, the worker and b's frontend carry at that
// size, at that moment of a busy machine. (What a sent is no measure of
// it: a shaped sender sends what passes, and a policed one more than b
// could take.) A ratio says something of the limiter only where that was
// above the limit; where it was not 5% above, the row says "offered below
// limit" instead. The default rates run from 512 kbit/s (1000 frames of
// 64 B a second: accuracy at low packet rates) to 10 Gbit/s.
//
// It measures and prints (TSV); it asserts nothing. `make bench` runs it.
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vhostmq/vhostmq/dataplane"
	"github.com/vhostmq/vhostmq/dataplane/frontend"
	"github.com/vhostmq/vhostmq/hack/bench/inproc"
)

var (
	macA = [6]byte{0x52, 0x54, 0, 0, 0, 0x0a}
	macB = [6]byte{0x52, 0x54, 0, 0, 0, 0x0b}
)

// margin is how far above the limit the offered rate must be for the
// ratio to mean something.
const margin = 1.05

func main() {
	ratesFlag := flag.String("rates", "512k,10M,100M,1G,10G", "limits in bits/s (comma-separated; 512k is 1000 frames/s of 64 B)")
	sizesFlag := flag.String("sizes", "64,1500", "frame sizes in bytes, Ethernet header included (comma-separated)")
	dirsFlag := flag.String("dirs", "egress,ingress", "directions limited (comma-separated: egress on the sender's port, ingress on the receiver's)")
	window := flag.Duration("window", 2*time.Second, "measuring window of each run")
	warmup := flag.Duration("warmup", 500*time.Millisecond, "offering before the window, which spends the bucket's initial burst")
	modeFlag := flag.String("mode", "adaptive", "the ports' polling mode (adaptive, interrupt, busy)")
	workerCPU := flag.Int("worker-cpu", 1, "CPU of the dataplane's one worker, alone")
	genCPU := flag.Int("gen-cpu", 0, "CPU of the generator goroutine (sends on a, drains b) and the rest of the process")
	flag.Parse()
	mode, err := inproc.ParsePolling(*modeFlag)
	if err != nil {
		fail(fmt.Errorf("-mode: %w", err))
	}
	var rates []string
	for _, s := range strings.Split(*ratesFlag, ",") {
		if _, err := inproc.ParseRate(s); err != nil {
			fail(fmt.Errorf("-rates: %w", err))
		}
		rates = append(rates, strings.TrimSpace(s))
	}
	var sizes []int
	for _, s := range strings.Split(*sizesFlag, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 60 || n > 1514 {
			fail(fmt.Errorf("-sizes: %q is not a frame size in 60..1514", s))
		}
		sizes = append(sizes, n)
	}
	var dirs []string
	for _, s := range strings.Split(*dirsFlag, ",") {
		if s = strings.TrimSpace(s); s != "egress" && s != "ingress" {
			fail(fmt.Errorf("-dirs: %q is not egress or ingress", s))
		}
		dirs = append(dirs, s)
	}
	if err := inproc.PinProcess(*genCPU); err != nil {
		fail(fmt.Errorf("pinning the process to CPU %d: %w", *genCPU, err))
	}
	inproc.SpareProcs(8)
	cfg := config{mode: mode, workerCPU: *workerCPU, genCPU: *genCPU, warmup: *warmup, window: *window}
	fmt.Printf("# %s, %d CPUs, Go frontend guests; worker alone on CPU %d (polling %s), generator (sends on a, drains b) on CPU %d; each run %s of warm-up (spends the initial burst, nothing subtracted), then %s counted by b's frontend; offered: what b received in the unlimited run just before; sent: what a put in its ring (a shaped sender's ring is full: what passes); ratio only where offered >= %.2f x limit; %s\n",
		time.Now().UTC().Format(time.RFC3339), runtime.NumCPU(), *workerCPU, mode, *genCPU, *warmup, *window, margin, inproc.Pressure())
	fmt.Println("direction\tlimit\tframe_bytes\tlimit_fps\tachieved_bps\tratio\toffered_bps\tsent_bps\trx_fps\trate_limited\tshaped\trx_no_buffer\tworker_runq_wait_pct\tgen_runq_wait_pct")
	for _, size := range sizes {
		for _, rs := range rates {
			rate, _ := inproc.ParseRate(rs)
			free, err := run(cfg, "none", 0, size)
			if err != nil {
				fail(fmt.Errorf("%d B without a limit: %w", size, err))
			}
			free.print("none", "-", 0, size, free.achieved)
			for _, dir := range dirs {
				res, err := run(cfg, dir, rate, size)
				if err != nil {
					fail(fmt.Errorf("%s %s, %d B: %w", dir, rs, size, err))
				}
				res.print(dir, rs, rate, size, free.achieved)
			}
		}
	}
	fmt.Printf("# after: %s\n", inproc.Pressure())
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "limiter:", err)
	os.Exit(1)
}

type config struct {
	mode              dataplane.Polling
	workerCPU, genCPU int
	warmup, window    time.Duration
}

// result is one run's rates (bits/s, frames/s) and the limiter's counts
// over the window.
type result struct {
	achieved, sent, fps             float64
	workerWait, genWait             float64 // fractions of the window
	rateLimited, shaped, rxNoBuffer uint64
}

func (r result) print(dir, limit string, rate uint64, size int, offered float64) {
	ratio, limitFPS := "-", "-"
	if rate > 0 {
		limitFPS = fmt.Sprintf("%.0f", float64(rate)/float64(8*size))
		ratio = "offered below limit"
		if offered >= margin*float64(rate) {
			ratio = fmt.Sprintf("%.4f", r.achieved/float64(rate))
		}
	}
	fmt.Printf("%s\t%s\t%d\t%s\t%.0f\t%s\t%.0f\t%.0f\t%.0f\t%d\t%d\t%d\t%.1f\t%.1f\n", dir, limit, size, limitFPS, r.achieved, ratio, offered, r.sent, r.fps,
		r.rateLimited, r.shaped, r.rxNoBuffer, 100*r.workerWait, 100*r.genWait)
}

// run offers size-byte frames a -> b with rate on dir ("none": no limit)
// and counts over the window.
func run(cfg config, dir string, rate uint64, size int) (result, error) {
	var res result
	r, err := inproc.NewRig(dataplane.Config{CPUs: []int{cfg.workerCPU}})
	if err != nil {
		return res, err
	}
	defer r.Close()
	optsA, optsB := dataplane.PortOptions{Polling: cfg.mode}, dataplane.PortOptions{Polling: cfg.mode}
	switch dir {
	case "egress":
		optsA.Bandwidth.Egress.BitsPerSecond = rate
	case "ingress":
		optsB.Bandwidth.Ingress.BitsPerSecond = rate
	}
	busy := frontend.Config{QueueSize: 1024, RxPoll: true}
	a, err := r.Add("a", macA[:], optsA, busy)
	if err != nil {
		return res, err
	}
	b, err := r.Add("b", macB[:], optsB, busy)
	if err != nil {
		return res, err
	}
	if err := inproc.Greet(b, macB, a); err != nil {
		return res, err
	}

	var stop atomic.Bool
	var gen atomic.Int64 // the generator's thread
	done := make(chan error, 1)
	go func() {
		inproc.Pin(cfg.genCPU)
		gen.Store(int64(unix.Gettid()))
		_, err := inproc.Pump(a, b, inproc.Burst(macB, macA, size, 32), stop.Load)
		done <- err
	}()
	time.Sleep(cfg.warmup)
	worker, err := inproc.ThreadOn(cfg.workerCPU)
	if err != nil {
		stop.Store(true)
		<-done
		return res, err
	}
	s0, w0, g0 := snap(r.D, a, b), inproc.RunqWait(worker), inproc.RunqWait(int(gen.Load()))
	time.Sleep(cfg.window)
	s1, w1, g1 := snap(r.D, a, b), inproc.RunqWait(worker), inproc.RunqWait(int(gen.Load()))
	stop.Store(true)
	if err := <-done; err != nil {
		return res, err
	}
	el := s1.at.Sub(s0.at).Seconds()
	res.achieved = float64(8*(s1.rxBytes-s0.rxBytes)) / el
	res.sent = float64(8*(s1.txBytes-s0.txBytes)) / el
	res.fps = float64(s1.rxFrames-s0.rxFrames) / el
	res.workerWait, res.genWait = (w1-w0).Seconds()/el, (g1-g0).Seconds()/el
	res.rateLimited, res.shaped, res.rxNoBuffer = s1.rateLimited-s0.rateLimited, s1.shaped-s0.shaped, s1.rxNoBuffer-s0.rxNoBuffer
	return res, nil
}

// counts is what the frontends counted themselves (frames and Ethernet
// bytes: a's sent, b's received) and the dataplane's limiter counts.
type counts struct {
	at                              time.Time
	txBytes, rxBytes, rxFrames      uint64
	rateLimited, shaped, rxNoBuffer uint64
}

func snap(d *dataplane.Dataplane, a, b *frontend.Frontend) counts {
	c := counts{at: time.Now(), txBytes: a.Stats(0).TX.Bytes}
	rx := b.Stats(0).RX
	c.rxBytes, c.rxFrames = rx.Bytes, rx.Frames
	if ps, ok := d.PortStats("a"); ok && len(ps.Queues) > 0 {
		c.shaped = ps.Queues[0].Shaped
	}
	if ps, ok := d.PortStats("b"); ok && len(ps.Queues) > 0 {
		c.rateLimited, c.rxNoBuffer = ps.Queues[0].Drops.RateLimited, ps.Queues[0].Drops.RxNoBuffer
	}
	return c
}
