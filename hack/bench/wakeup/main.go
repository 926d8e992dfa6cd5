// Command wakeup measures what the polling modes cost and buy, in-process
// with the Go test frontend (dataplane/frontend) playing the guests:
//
//   - idle: the dataplane's CPU use (getrusage of the whole process: the
//     worker, the Go runtime and the idle frontends) with N connected,
//     silent ports on one pinned worker, per polling mode;
//   - latency: from a guest's send (descriptor published, kick written if
//     the backend asked for kicks) to the frame's used entry appearing in
//     the other guest's RX ring, per polling mode, with the sender idle
//     for a given gap before each frame (a gap longer than the adaptive
//     worker's 200 µs idle window lets it fall asleep).
//
// It measures and prints; it asserts nothing. `make bench` runs it; on this
// shared 2-CPU machine run it under the heavy-run lock (busy polling burns
// a CPU).
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vhostmq/vhostmq/dataplane"
	"github.com/vhostmq/vhostmq/dataplane/frontend"
	"github.com/vhostmq/vhostmq/hack/bench/inproc"
)

var modes = []dataplane.Polling{dataplane.PollInterrupt, dataplane.PollAdaptive, dataplane.PollBusy}

func main() {
	what := flag.String("mode", "idle,latency", "what to measure: idle, latency or both (comma-separated)")
	ports := flag.Int("ports", 10, "idle: connected silent ports")
	window := flag.Duration("window", 10*time.Second, "idle: measuring window per polling mode")
	frames := flag.Int("frames", 2000, "latency: frames per polling mode and gap")
	gapsFlag := flag.String("gaps", "20us,1ms", "latency: sender idle time before each frame (comma-separated)")
	workerCPU := flag.Int("cpu", 1, "CPU of the dataplane's one worker")
	senderCPU := flag.Int("sender-cpu", 0, "latency: CPU of the sending and timing goroutine")
	flag.Parse()
	var gaps []time.Duration
	for _, g := range strings.Split(*gapsFlag, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(g))
		if err != nil {
			fail(fmt.Errorf("-gaps: %w", err))
		}
		gaps = append(gaps, d)
	}
	fmt.Printf("# %s, %d CPUs, worker on CPU %d, Go frontend guests; %s\n", time.Now().UTC().Format(time.RFC3339), runtime.NumCPU(), *workerCPU, inproc.Pressure())
	for _, w := range strings.Split(*what, ",") {
		switch strings.TrimSpace(w) {
		case "idle":
			fmt.Printf("idle\tmode\tports\twindow_s\tcpu_pct\tworker_sleeps_per_s\n")
			for _, m := range modes {
				if err := idle(m, *ports, *window, *workerCPU); err != nil {
					fail(err)
				}
			}
		case "latency":
			fmt.Printf("latency\tmode\tgap\tframes\tmedian_us\tp99_us\tmax_us\n")
			for _, m := range modes {
				for _, g := range gaps {
					if err := latency(m, g, *frames, *workerCPU, *senderCPU); err != nil {
						fail(err)
					}
				}
			}
		default:
			fail(fmt.Errorf("-mode: %q is not idle or latency", w))
		}
	}
	fmt.Printf("# after: %s\n", inproc.Pressure())
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "wakeup:", err)
	os.Exit(1)
}

// newRig is a dataplane with one pinned worker and n connected ports.
func newRig(m dataplane.Polling, n, cpu int, fcfg frontend.Config) (*inproc.Rig, []*frontend.Frontend, error) {
	r, err := inproc.NewRig(dataplane.Config{CPUs: []int{cpu}})
	if err != nil {
		return nil, nil, err
	}
	var fes []*frontend.Frontend
	for i := range n {
		f, err := r.Add(fmt.Sprintf("p%d", i), nil, dataplane.PortOptions{Polling: m}, fcfg)
		if err != nil {
			r.Close()
			return nil, nil, err
		}
		fes = append(fes, f)
	}
	return r, fes, nil
}

func sleeps(d *dataplane.Dataplane) uint64 {
	var n uint64
	for _, w := range d.WorkerStats() {
		n += w.Sleeps
	}
	return n
}

func idle(m dataplane.Polling, ports int, window time.Duration, cpu int) error {
	r, _, err := newRig(m, ports, cpu, frontend.Config{})
	if err != nil {
		return err
	}
	defer r.Close()
	time.Sleep(time.Second) // setup done, the adaptive worker asleep
	c0, s0, t0 := inproc.CPUTime(), sleeps(r.D), time.Now()
	time.Sleep(window)
	c1, s1, t1 := inproc.CPUTime(), sleeps(r.D), time.Now()
	el := t1.Sub(t0)
	fmt.Printf("idle\t%s\t%d\t%.1f\t%.2f\t%.1f\n", m, ports, el.Seconds(), 100*float64(c1-c0)/float64(el), float64(s1-s0)/el.Seconds())
	return nil
}

var macA = [6]byte{0x52, 0x54, 0, 0, 0, 0x0a}
var macB = [6]byte{0x52, 0x54, 0, 0, 0, 0x0b}

func latency(m dataplane.Polling, gap time.Duration, frames, workerCPU, senderCPU int) error {
	r, fes, err := newRig(m, 2, workerCPU, frontend.Config{RxPoll: true})
	if err != nil {
		return err
	}
	defer r.Close()
	a, b := fes[0], fes[1]
	if err := inproc.Greet(a, macA, b); err != nil {
		return err
	}
	if err := inproc.Greet(b, macB, a); err != nil {
		return err
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var set unix.CPUSet
	set.Set(senderCPU)
	unix.SchedSetaffinity(0, &set)
	fr := inproc.Frame(macB, macA)
	lat := make([]time.Duration, 0, frames)
	for range frames {
		// Off the CPU for most of a long gap (as an idle guest), spinning
		// for the last 100 µs so that the sender is awake and warm when
		// the clock starts: what is timed is the dataplane's side.
		until := time.Now().Add(gap)
		if gap > 200*time.Microsecond {
			time.Sleep(gap - 100*time.Microsecond)
		}
		for time.Now().Before(until) {
		}
		before := b.UsedIdx(0)
		t0 := time.Now()
		if err := a.Send(0, fr); err != nil {
			return err
		}
		deadline := t0.Add(5 * time.Second)
		for b.UsedIdx(0) == before {
			if time.Now().After(deadline) {
				return errors.New("a frame took more than 5 s")
			}
		}
		lat = append(lat, time.Since(t0))
		if _, err := b.RecvAll(0, 0); err != nil {
			return err
		}
		a.ReclaimTx(0)
	}
	slices.Sort(lat)
	us := func(d time.Duration) float64 { return float64(d) / 1e3 }
	fmt.Printf("latency\t%s\t%s\t%d\t%.1f\t%.1f\t%.1f\n", m, gap, len(lat), us(lat[len(lat)/2]), us(lat[len(lat)*99/100]), us(lat[len(lat)-1]))
	return nil
}
