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
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vhostmq/vhostmq/dataplane"
	"github.com/vhostmq/vhostmq/dataplane/frontend"
	"github.com/vhostmq/vhostmq/dataplane/netdev"
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
		switch strings.TrimSpace(s) {
		case "adaptive":
			modes = append(modes, dataplane.PollAdaptive)
		case "interrupt":
			modes = append(modes, dataplane.PollInterrupt)
		case "busy":
			modes = append(modes, dataplane.PollBusy)
		default:
			fail(fmt.Errorf("-modes: %q is not adaptive, interrupt or busy", s))
		}
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
	macA  = [6]byte{0x52, 0x54, 0, 0, 0, 0x0a}
	macB  = [6]byte{0x52, 0x54, 0, 0, 0, 0x0b}
	bcast = [6]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
)

var watchdogBound time.Duration

func run(m dataplane.Polling, idle int, window time.Duration, workerCPU, genCPU int) (result, error) {
	var res result
	dir, err := os.MkdirTemp("", "vmq-density")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(dir)
	d, err := dataplane.New(dataplane.Config{CPUs: []int{workerCPU}, Watchdog: dataplane.WatchdogConfig{Bound: watchdogBound}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return res, err
	}
	defer d.Close()
	var fes []*frontend.Frontend
	defer func() {
		for _, f := range fes {
			f.Close()
		}
	}()
	add := func(name string, mac net.HardwareAddr, cfg frontend.Config) (*frontend.Frontend, error) {
		sock := filepath.Join(dir, name+".sock")
		if err := d.AddPort(netdev.Config{Name: name, Socket: sock, Role: netdev.RoleServer, QueuePairs: 1, MTU: 1500, MAC: mac},
			dataplane.PortOptions{Polling: m}); err != nil {
			return nil, err
		}
		for try := 0; ; try++ {
			f, err := frontend.Dial(sock, cfg)
			if err == nil {
				fes = append(fes, f)
				return f, nil
			}
			if try == 50 {
				return nil, fmt.Errorf("dialling port %s: %w", name, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	busy := frontend.Config{QueueSize: 1024, RxPoll: true}
	a, err := add("a", macA[:], busy)
	if err != nil {
		return res, err
	}
	b, err := add("b", macB[:], busy)
	if err != nil {
		return res, err
	}
	for i := range idle {
		if _, err := add(fmt.Sprintf("idle%d", i), nil, frontend.Config{QueueSize: 64, MemSize: 2 << 20}); err != nil {
			return res, err
		}
	}
	// b speaks, so a's frames to it are switched, not flooded to the idle ports
	if err := b.Send(0, inproc.Frame(bcast, macB)); err != nil {
		return res, fmt.Errorf("b's greeting: %w", err)
	}
	if _, err := a.Recv(0, 5*time.Second); err != nil {
		return res, fmt.Errorf("b's greeting: %w (%+v)", err, d.Stats())
	}
	b.ReclaimTx(0)
	time.Sleep(500 * time.Millisecond) // setup done, an adaptive worker asleep
	res.rssMiB, res.fds, res.goroutines = rssMiB(), fds(), runtime.NumGoroutine()
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
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		var set unix.CPUSet
		set.Set(genCPU)
		unix.SchedSetaffinity(0, &set)
		burst := make([][]byte, 32)
		for i := range burst {
			burst[i] = inproc.Frame(macB, macA)
		}
		for deadline := start.Add(window); time.Now().Before(deadline); {
			if _, err := a.SendBurst(0, burst); err != nil && !errors.Is(err, frontend.ErrRingFull) {
				done <- fmt.Errorf("sending: %w", err)
				return
			}
			fr, err := b.RecvAll(0, 0)
			if err != nil && !errors.Is(err, frontend.ErrTimeout) {
				done <- fmt.Errorf("receiving: %w", err)
				return
			}
			got += uint64(len(fr))
			a.ReclaimTx(0)
		}
		done <- nil
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

func rssMiB() float64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0
	}
	pages, _ := strconv.ParseFloat(f[1], 64)
	return pages * float64(os.Getpagesize()) / (1 << 20)
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
