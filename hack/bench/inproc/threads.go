package inproc

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Where the benchmarks' threads run. A benchmark's goroutines play
// guests' threads, so the kernel should schedule them as it would those:
// each on its own OS thread, with its own CPU mask and priority.

// Pin locks the calling goroutine to its OS thread for good and pins the
// thread to cpu. It never unlocks: when the goroutine returns the Go
// runtime ends the thread, so no other goroutine inherits its CPU mask
// (or the priority Idle gave it).
func Pin(cpu int) error {
	runtime.LockOSThread()
	var set unix.CPUSet
	set.Set(cpu)
	return unix.SchedSetaffinity(0, &set)
}

// Idle lowers the calling pinned thread to SCHED_IDLE, where any thread
// of normal priority that wakes on its CPU runs at once; or to nice 19
// where the kernel refuses SCHED_IDLE. It returns which it did.
func Idle() (string, error) {
	attr := unix.SchedAttr{Policy: unix.SCHED_IDLE}
	if err := unix.SchedSetAttr(0, &attr, 0); err == nil {
		return "SCHED_IDLE", nil
	}
	if err := unix.Setpriority(unix.PRIO_PROCESS, unix.Gettid(), 19); err != nil {
		return "", err
	}
	return "nice 19", nil
}

// PinProcess pins every thread of the process to cpu. Threads the Go
// runtime starts later are cloned from these and inherit the mask, so
// only threads that pin themselves elsewhere (the dataplane's workers)
// run on another CPU. Call it before starting the dataplane.
func PinProcess(cpu int) error {
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return err
	}
	var set unix.CPUSet
	set.Set(cpu)
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		if err := unix.SchedSetaffinity(tid, &set); err != nil && err != unix.ESRCH {
			return err
		}
	}
	return nil
}

// SpareProcs raises GOMAXPROCS to n at least. A pinned busy goroutine (a
// worker, a generator) holds a P while it runs; with as many Ps as CPUs,
// a goroutine the kernel wakes (a guest's thread back from its call
// eventfd) would wait for the Go scheduler to preempt one of them, up to
// 10 ms, instead of running at once: the kernel should decide who runs,
// as it does for guests.
func SpareProcs(n int) {
	if runtime.GOMAXPROCS(0) < n {
		runtime.GOMAXPROCS(n)
	}
}

// ThreadOn returns the thread of the process allowed on cpu alone: with
// the rest of the process pinned elsewhere (PinProcess), the dataplane's
// worker there.
func ThreadOn(cpu int) (int, error) {
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return 0, err
	}
	want := strconv.Itoa(cpu)
	for _, t := range tasks {
		b, err := os.ReadFile("/proc/self/task/" + t.Name() + "/status")
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "Cpus_allowed_list:"); ok && strings.TrimSpace(v) == want {
				return strconv.Atoi(t.Name())
			}
		}
	}
	return 0, fmt.Errorf("no thread of the process is pinned to CPU %d alone", cpu)
}

// RunqWait is how long thread tid has waited, runnable, for its CPU
// (/proc/.../schedstat): on a shared machine, what other processes took
// from it.
func RunqWait(tid int) time.Duration {
	b, err := os.ReadFile("/proc/self/task/" + strconv.Itoa(tid) + "/schedstat")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0
	}
	ns, _ := strconv.ParseInt(f[1], 10, 64)
	return time.Duration(ns)
}
