// Command density measures what idle neighbours cost a busy queue pair and
// the node, in-process with the Go test frontend (dataplane/frontend)
// playing the guests: for each polling mode and each number N of
// connected, silent ports on the busy pair's worker,
//
//   - the busy pair (64-byte frames a -> b, sent and drained by one
//     goroutine pinned to -gen-cpu, the worker pinned to -worker-cpu):
//     frames/s; ns per frame of the worker's CPU, all of its time (idle
//     rings visited included: from /proc/stat, so anything else running
//     there counts too), and of the worker's own busy accounting (bursts
//     that moved frames only); and its sleeps per second;
//   - the node: the process's RSS, open fds and goroutines with the N+2
//     ports up (dataplane and test frontends together: the frontends'
//     rings and buffers are shared memory the dataplane maps too), and its
//     CPU use over a window with every port silent.
//
// It is the baseline of the neighbours issue (#27): a worker's cost should
// follow its work, not the number of ports it holds. It measures and
// prints (TSV); it asserts nothing. `make bench` runs it.
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/vhostmq/vhostmq/dataplane"
	"github.com/vhostmq/vhostmq/dataplane/frontend"
	"github.com/vhostmq/vhostmq/hack/bench/inproc"
)

func main() {
	idleFlag := flag.String("idle", "0,255,1023", "numbers of idle ports beside the busy pair (comma-separated)")
	modesFlag := flag.String("modes", "adaptive,interrupt", "polling modes (comma-separated: adaptive, interrupt, busy)")
	window := flag.Duration("window", 3*time.Second, "measuring window of each run")
	workerCPU := flag.Int("worker-cpu", 1, "CPU of the dataplane's one worker")
	genCPU := flag.Int("gen-cpu", 0, "CPU of the generator goroutine (sends on a, drains b)")
	flag.DurationVar(&watchdogBound, "watchdog", 0, "the stall watchdog's bound (0: the default; negative: off), to see its share of idle CPU")
	flag.Parse()
	var idles []int
	for _, s := range strings.Split(*idleFlag, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 0 {
			fail(fmt.Errorf("-idle: %q is not a number of ports", s))
		}
		idles = append(idles, n)
	}
	var modes []dataplane.Polling
	for _, s := range strings.Split(*modesFlag, ",") {
		m, err := inproc.ParsePolling(s)
		if err != nil {
			fail(fmt.Errorf("-modes: %w", err))
		}
		modes = append(modes, m)
	}
	fmt.Printf("# %s, %d CPUs, worker on CPU %d, generator on CPU %d, Go frontend guests, %s windows; %s\n",
		time.Now().UTC().Format(time.RFC3339), runtime.NumCPU(), *workerCPU, *genCPU, *window, inproc.Pressure())
	fmt.Println("mode\tidle_ports\tbusy_fps\tratio\tcpu_ns_per_frame\tbusy_ns_per_frame\tworker_sleeps_per_s\trss_mib\tfds\tgoroutines\tidle_cpu_pct")
	for _, m := range modes {
		base := 0.0
		for _, n := range idles {
			res, err := run(m, n, *window, *workerCPU, *genCPU)
			if err != nil {
				fail(fmt.Errorf("%s with %d idle ports: %w", m, n, err))
			}
			if base == 0 {
				base = res.fps
			}
			fmt.Printf("%s\t%d\t%.0f\t%.2f\t%.0f\t%.0f\t%.0f\t%.1f\t%d\t%d\t%.2f\n", m, n, res.fps, res.fps/base, res.cpuPerFrame, res.nsPerFrame,
				res.sleepsPerS, res.rssMiB, res.fds, res.goroutines, res.idleCPU)
		}
	}
	fmt.Printf("# after: %s\n", inproc.Pressure())
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "density:", err)
	os.Exit(1)
}

type result struct {
	fps, cpuPerFrame, nsPerFrame, sleepsPerS, rssMiB, idleCPU float64
	fds, goroutines                                           int
}

var (
	macA = [6]byte{0x52, 0x54, 0, 0, 0, 0x0a}
	macB = [6]byte{0x52, 0x54, 0, 0, 0, 0x0b}
)

var watchdogBound time.Duration

func run(m dataplane.Polling, idle int, window time.Duration, workerCPU, genCPU int) (result, error) {
	var res result
	r, err := inproc.NewRig(dataplane.Config{CPUs: []int{workerCPU}, Watchdog: dataplane.WatchdogConfig{Bound: watchdogBound}})
	if err != nil {
		return res, err
	}
	defer r.Close()
	d, opts := r.D, dataplane.PortOptions{Polling: m}
	busy := frontend.Config{QueueSize: 1024, RxPoll: true}
	a, err := r.Add("a", macA[:], opts, busy)
	if err != nil {
		return res, err
	}
	b, err := r.Add("b", macB[:], opts, busy)
	if err != nil {
		return res, err
	}
	for i := range idle {
		if _, err := r.Add(fmt.Sprintf("idle%d", i), nil, opts, frontend.Config{QueueSize: 64, MemSize: 2 << 20}); err != nil {
			return res, err
		}
	}
	// b speaks, so a's frames to it are switched, not flooded to the idle ports
	if err := inproc.Greet(b, macB, a); err != nil {
		return res, err
	}
	time.Sleep(500 * time.Millisecond) // setup done, an adaptive worker asleep
	res.rssMiB, res.fds, res.goroutines = inproc.RSSMiB(), fds(), runtime.NumGoroutine()
	c0, t0 := inproc.CPUTime(), time.Now()
	time.Sleep(window)
	res.idleCPU = 100 * float64(inproc.CPUTime()-c0) / float64(time.Since(t0))

	// the busy pair, the generator pinned
	done := make(chan error, 1)
	var got uint64
	w0, s0 := workerStats(d)
	cpu0 := cpuBusy(workerCPU)
	start := time.Now()
	go func() {
		inproc.Pin(genCPU)
		deadline := start.Add(window)
		n, err := inproc.Pump(a, b, inproc.Burst(macB, macA, 64, 32), func() bool { return !time.Now().Before(deadline) })
		got = n
		done <- err
	}()
	if err := <-done; err != nil {
		return res, err
	}
	el := time.Since(start)
	w1, s1 := workerStats(d)
	cpu1 := cpuBusy(workerCPU)
	res.fps = float64(got) / el.Seconds()
	if got > 0 {
		res.nsPerFrame = float64(w1-w0) / float64(got)
		res.cpuPerFrame = float64(cpu1-cpu0) / float64(got)
	}
	res.sleepsPerS = float64(s1-s0) / el.Seconds()
	return res, nil
}

func workerStats(d *dataplane.Dataplane) (busyNs, sleeps uint64) {
	for _, w := range d.WorkerStats() {
		busyNs += w.BusyNs
		sleeps += w.Sleeps
	}
	return busyNs, sleeps
}

func fds() int {
	e, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1
	}
	return len(e)
}

// cpuBusy is the time CPU cpu spent not idle since boot, in ns (/proc/stat
// ticks of USER_HZ, 100 a second).
func cpuBusy(cpu int) float64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 9 || f[0] != "cpu"+strconv.Itoa(cpu) {
			continue
		}
		busy := 0.0
		for i, v := range f[1:9] {
			if i == 3 || i == 4 { // idle, iowait
				continue
			}
			x, _ := strconv.ParseFloat(v, 64)
			busy += x
		}
		return busy * 1e7
	}
	return 0
}
