package dataplane

import (
	"errors"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vhostmq/vhostmq/dataplane/netdev"
)

// The stall watchdog is defence in depth against a guest TX ring that
// nobody serves: with EVENT_IDX a driver kicks only when its avail index
// passes the avail_event the device published, so one kick that is lost
// (or one the device consumed without serving the ring and re-publishing
// avail_event) silences that queue for good. Every tick it looks at each
// started TX ring without waiting for any lock a worker holds. A ring
// stalls when it has entries waiting, took none for the bound, and its
// worker could have served it meanwhile: it slept, or it made passes. (A
// worker that did neither is busy or starved: worker health reports that,
// not a ring stall.) A stalled ring is healed: avail_event re-published,
// its kick eventfd put back into its worker's epoll set if it was missing,
// its pair put back on its worker if it was off every list, and the worker
// woken, which then serves it. Each stall is counted
// (vhostmq_queue_stalls_total) and logged once, with the ring's indices and
// flags, until the ring moves again.
//
// Cost when nothing stalls: one goroutine that wakes every bound/4 and, per
// active TX ring, takes a free lock and reads two indices
// (BenchmarkWatchdogScan). A ring its worker parked (active.go) costs a
// flag: the worker's own sweep looks at it within sweepInterval, which is
// shorter than the bound, and finds what a lost kick left waiting.

// DefaultStallBound is how long a TX ring may hold entries that its worker
// could have taken before the watchdog calls it stalled.
const DefaultStallBound = 100 * time.Millisecond

// WatchdogConfig configures the stall watchdog.
type WatchdogConfig struct {
	// Bound: 0 means DefaultStallBound; negative turns the watchdog off.
	Bound time.Duration
	// RingDump, when positive, logs every TX ring's state at debug level
	// this often (what the watchdog sees, for a stall it did not catch).
	RingDump time.Duration
}

type watchdog struct {
	d     *Dataplane
	cfg   WatchdogConfig
	seen  map[*netdev.Vring]ringWatch
	stop  chan struct{}
	done  chan struct{}
	dumps int64 // last ring dump, ns
	// A scan allocates nothing (it runs beside the workers, and the
	// per-packet allocation tests count every goroutine's): the port
	// list is reused and rings are remembered by value, with the scan
	// that last saw them.
	ports []*port
	scans uint64
}

// ringWatch is what the watchdog remembers of one TX ring between ticks.
type ringWatch struct {
	lastAvail uint16
	since     int64  // ns: the ring has had entries waiting and taken none since
	passes    uint64 // its worker's pass count then
	sleeps    uint64 // and sleep count
	reported  bool   // this stall was logged
	scan      uint64 // the last scan that saw the ring
}

func (d *Dataplane) startWatchdog(cfg WatchdogConfig) *watchdog {
	if cfg.Bound == 0 {
		cfg.Bound = DefaultStallBound
	}
	wd := &watchdog{d: d, cfg: cfg, seen: map[*netdev.Vring]ringWatch{}, stop: make(chan struct{}), done: make(chan struct{})}
	if cfg.Bound < 0 {
		close(wd.done)
		return wd
	}
	go wd.routine()
	return wd
}

func (wd *watchdog) close() {
	select {
	case <-wd.done:
		return
	default:
	}
	close(wd.stop)
	<-wd.done
}

func (wd *watchdog) routine() {
	defer close(wd.done)
	t := time.NewTicker(max(wd.cfg.Bound/4, time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-wd.stop:
			return
		case now := <-t.C:
			wd.scan(now.UnixNano())
		}
	}
}

// scan looks at every TX ring once.
func (wd *watchdog) scan(now int64) {
	dump := wd.cfg.RingDump > 0 && now-wd.dumps >= int64(wd.cfg.RingDump)
	if dump {
		wd.dumps = now
	}
	wd.scans++
	wd.ports = wd.d.appendPorts(wd.ports[:0])
	for _, p := range wd.ports {
		for _, a := range p.assigns {
			wd.check(a, now, dump)
		}
	}
	clear(wd.ports) // no removed port kept alive until the next scan
	for v, rw := range wd.seen {
		if rw.scan != wd.scans { // its port is gone
			delete(wd.seen, v)
		}
	}
}

// check looks at one pair's TX ring.
func (wd *watchdog) check(a *assignment, now int64, dump bool) {
	v := a.tx
	if a.swept.Load() && !dump {
		// parked: its worker's sweep looks at it (active.go); the
		// watchdog's cost follows the active rings
		if len(wd.seen) > 0 {
			delete(wd.seen, v)
		}
		return
	}
	w := a.port.workers[a.pair].Load()
	if !v.TryLock() {
		delete(wd.seen, v) // a worker is in a burst on it: served
		return
	}
	st := v.State()
	if dump {
		wd.d.log.Debug("ring state", "port", v.Port.Name(), "pair", a.pair, "vring", v.Index, "ring", st,
			"cpu", w.cpu, "workerSleeping", w.sleeping.Load(), "kickWatched", w.kickWatched(v, st.KickFD), "onWorker", w.serves(a))
	}
	pending := st.Pending()
	// A holding ring waits for another ring's buffers, a shaped one for its
	// worker's timer (its guest is not asked to kick): neither waits for a
	// kick, whose loss is what the watchdog looks for.
	if !st.Ready || !st.Started || st.Broken != "" || pending == 0 || int(pending) > st.Size || a.holding.Load() || a.shaped.Load() {
		v.Unlock()
		delete(wd.seen, v)
		return
	}
	rw, ok := wd.seen[v]
	if !ok || rw.lastAvail != st.LastAvail {
		v.Unlock()
		wd.seen[v] = ringWatch{lastAvail: st.LastAvail, since: now, passes: w.passes.Load(), sleeps: w.sleeps.Load(), scan: wd.scans}
		return
	}
	rw.scan = wd.scans
	defer func() { wd.seen[v] = rw }()
	if now-rw.since < int64(wd.cfg.Bound) {
		v.Unlock()
		return
	}
	why := wd.missed(w, &rw, v, st.KickFD)
	if why == "" {
		v.Unlock()
		return
	}
	// Stalled: heal it under the ring's lock, as the kick hooks run.
	v.Counters.Stalls.Add(1)
	watched := w.kickWatched(v, st.KickFD)
	if !watched && st.KickFD >= 0 {
		w.watch(v, st.KickFD)
	}
	if q := v.Queue(); q != nil {
		v.SetNotify(q, true)
	} else if q := v.StartedDisabled(); q != nil {
		v.SetNotify(q, true)
	}
	v.Unlock()
	onWorker := w.serves(a)
	if !onWorker {
		wd.d.replace(a)
	}
	w.poke() // a parked ring is activated only by a kick or a poke (active.go)
	if !rw.reported {
		wd.d.log.Warn("queue stalled: entries waiting and none taken; served it again", "port", v.Port.Name(), "pair", a.pair,
			"vring", v.Index, "for", time.Duration(now-rw.since).String(), "why", why, "ring", st, "cpu", w.cpu,
			"workerSleeping", w.sleeping.Load(), "kickWatched", watched, "onWorker", onWorker)
		rw.reported = true
	}
	rw.since, rw.passes, rw.sleeps = now, w.passes.Load(), w.sleeps.Load()
}

// missed says how the worker could have taken a ring's waiting entries
// since the watchdog first saw them, and did not ("" when it could not: it
// is busy elsewhere or starved of CPU, which worker health reports). A
// complete pass visits every ring; a sleep starts only after every ring
// was re-armed and re-checked; and a worker asleep will not come for the
// ring unless it was woken or a kick is pending on an eventfd it watches.
func (wd *watchdog) missed(w *worker, rw *ringWatch, v *netdev.Vring, kickFD int) string {
	switch {
	case w.passes.Load()-rw.passes >= 2:
		return "its worker made passes without taking them"
	case w.sleeps.Load() != rw.sleeps:
		return "its worker went to sleep with them waiting"
	case !w.sleeping.Load() || readable(w.wakefd):
		return "" // awake, or about to wake
	case !readable(kickFD):
		return "its worker sleeps and no kick is pending"
	case !w.kickWatched(v, kickFD):
		return "its worker sleeps and does not watch the ring's kick"
	}
	return ""
}

// readable reports whether an eventfd has a count to read.
func readable(fd int) bool {
	if fd < 0 {
		return false
	}
	pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	n, err := unix.Poll(pfd, 0)
	return err == nil && n > 0 && pfd[0].Revents&unix.POLLIN != 0
}

// appendPorts appends every port to out, for readers that must not hold
// d.mu long.
func (d *Dataplane) appendPorts(out []*port) []*port {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, p := range d.byName {
		out = append(out, p)
	}
	return out
}

// replace puts a pair that is on no worker's list back on its worker
// (never one of a port being removed).
func (d *Dataplane) replace(a *assignment) {
	d.placeMu.Lock()
	defer d.placeMu.Unlock()
	if a.port.removed {
		return
	}
	for _, w := range d.workers {
		if w.serves(a) {
			return
		}
	}
	w := a.port.workers[a.pair].Load()
	d.log.Error("queue pair was on no worker; put back", "port", a.port.dev.Name(), "pair", a.pair, "cpu", w.cpu)
	w.add(a)
}

// serves reports whether a is on the worker's list.
func (w *worker) serves(a *assignment) bool { return slices.Contains(w.list.Load().list, a) }

// kickWatched reports whether fd is in the worker's epoll set for v: a
// modification with the same event succeeds only for a registered fd.
func (w *worker) kickWatched(v *netdev.Vring, fd int) bool {
	if fd < 0 {
		return false
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd), Pad: int32(v.ID)}
	err := unix.EpollCtl(w.epfd, unix.EPOLL_CTL_MOD, fd, &ev)
	return err == nil || !errors.Is(err, unix.ENOENT)
}
