package dataplane

import (
	"fmt"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// WorkerHealth says whether one worker can serve its queues.
type WorkerHealth struct {
	CPU     int
	Healthy bool
	Reason  string
}

// stuckAfter is how long a worker may go without finishing a loop before
// it counts as stuck; a pass over its queues takes microseconds.
const stuckAfter = 2 * time.Second

// WorkerHealth checks every worker: it must be running, either asleep
// waiting for kicks or making progress, and its CPU must still be online
// and allowed to this process. Calls are serialised (healthMu).
func (d *Dataplane) WorkerHealth() []WorkerHealth {
	d.healthMu.Lock()
	defer d.healthMu.Unlock()
	now := time.Now()
	var allowed unix.CPUSet
	affOK := unix.SchedGetaffinity(0, &allowed) == nil
	out := make([]WorkerHealth, 0, len(d.workers))
	for _, w := range d.workers {
		h := WorkerHealth{CPU: w.cpu, Healthy: true}
		passes := w.passes.Load()
		if passes != w.seenPasses || w.seenAt.IsZero() {
			w.seenPasses, w.seenAt = passes, now
		}
		switch {
		case w.stopping.Load():
			h.Healthy, h.Reason = false, "worker stopped"
		case !w.sleeping.Load() && now.Sub(w.seenAt) > stuckAfter:
			h.Healthy, h.Reason = false, fmt.Sprintf("worker made no progress for %v", now.Sub(w.seenAt).Round(time.Second))
		case w.cpu >= 0 && !cpuOnline(w.cpu):
			h.Healthy, h.Reason = false, fmt.Sprintf("CPU %d is offline", w.cpu)
		case w.cpu >= 0 && affOK && !allowed.IsSet(w.cpu):
			h.Healthy, h.Reason = false, fmt.Sprintf("CPU %d is no longer allowed to this process", w.cpu)
		}
		out = append(out, h)
	}
	return out
}

func cpuOnline(cpu int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/sys/devices/system/cpu/cpu%d/online", cpu))
	if err != nil {
		// cpu0 often has no "online" file; a missing CPU has no directory.
		_, serr := os.Stat(fmt.Sprintf("/sys/devices/system/cpu/cpu%d", cpu))
		return serr == nil
	}
	return strings.TrimSpace(string(b)) == "1"
}
