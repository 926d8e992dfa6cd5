package dataplane

import (
	"slices"
	"time"

	"golang.org/x/sys/unix"
)

// A worker's active set: its cost follows its work, not the number of
// rings it holds.
//
// Each TX ring a worker serves is either active or parked:
//
//   - active rings are visited every pass, with guest kicks off (the
//     guest adds chains without a notification: the worker will look);
//   - parked rings are not visited: their kicks are on, and a kick is
//     what brings one back.
//
// A ring parks when it has moved nothing for parkIdle: kicks are turned on
// and the ring checked once more under its lock (a chain added before the
// guest could see kicks on is found then; one added after makes the guest
// kick), the way a worker arms every ring before it sleeps. Nothing else
// changes about sleeping: a worker about to sleep arms its active rings,
// and once asleep they are all parked; a kick wakes it and activates its
// ring only.
//
// A kick on a parked ring is seen by epoll: in the sleep, or while the
// worker is awake by a look without waiting (epoll_wait with timeout 0)
// at most every housekeepInterval. Housekeeping also parks idle rings and
// sweeps parked ones a few at a time, so that every parked ring is looked
// at within sweepInterval whatever happens to its kicks; a sleeping
// worker wakes for that too. A ring that starts, stops, gets a new kick
// eventfd or is healed by the watchdog pokes its worker, which looks at
// its parked rings at once.
//
// Holding rings (hold.go) never park: they wait for another ring's buffers,
// and their own kicks say nothing about that. Nor do shaped rings
// (bandwidth.go): they wait for tokens, and sleepTimeout for them.

const (
	// parkIdle is how long a ring must have moved nothing before it is
	// parked: longer than adaptive polling's idle time, so that a ring
	// a flow is using stays polled between its bursts.
	parkIdle = int64(1_000_000)
	// housekeepInterval is how often (ns) an awake worker looks for
	// kicks, parks idle rings and sweeps parked ones: the most a busy
	// worker adds to a parked ring's first frame.
	housekeepInterval = int64(20_000)
	// housekeepPasses is how many passes an awake worker makes between
	// two looks at the clock for housekeeping.
	housekeepPasses = 4
	// sweepInterval bounds the time between two looks at any parked ring
	// (Config.parkedSweep changes it for tests).
	sweepInterval = int64(50_000_000)
)

// sync rebuilds the active and parked sets when the worker's list
// changed. A pair the worker parked stays parked; one that is new to it is
// active (its kicks may be on or off: polling it is always right).
func (w *worker) sync() {
	l := w.list.Load()
	if l == w.seen {
		return
	}
	w.seen = l
	w.keepSuspects(l.list)
	clear(w.active)
	clear(w.parked)
	w.active, w.parked = w.active[:0], w.parked[:0]
	clear(w.byID)
	now := nanotime()
	for _, a := range l.list {
		w.byID[a.tx.ID] = a
		if a.parked && a.owner == w {
			a.at = len(w.parked)
			w.parked = append(w.parked, a)
			continue
		}
		a.owner, a.parked, a.lastWork = w, false, now
		a.swept.Store(false)
		a.at = len(w.active)
		w.active = append(w.active, a)
	}
	w.sweepAt = 0
	w.activeN.Store(int32(len(w.active)))
}

// activate moves a parked ring back to the active set and turns its kicks
// off.
func (w *worker) activate(a *assignment, now int64) {
	if !a.parked {
		return
	}
	last := w.parked[len(w.parked)-1]
	w.parked[a.at], last.at = last, a.at
	w.parked[len(w.parked)-1] = nil
	w.parked = w.parked[:len(w.parked)-1]
	a.parked, a.lastWork, a.at = false, now, len(w.active)
	a.swept.Store(false)
	w.active = append(w.active, a)
	a.tx.Lock()
	if q := a.tx.Queue(); q != nil {
		a.tx.SetNotify(q, false)
	}
	a.tx.Unlock()
}

// park tries to move active[i] to the parked set: its kicks are turned on
// and it is checked once more. It reports whether the ring parked (false:
// it has work, or it must stay active).
func (w *worker) park(i int) bool {
	a := w.active[i]
	if a.hold.rv != nil {
		return false
	}
	a.tx.Lock()
	more := false
	if q := a.tx.Queue(); q != nil {
		if more = a.tx.SetNotify(q, true); more {
			a.tx.SetNotify(q, false)
		}
	} else if q := a.tx.StartedDisabled(); q != nil {
		more = a.tx.SetNotify(q, true)
	}
	a.tx.Unlock()
	if more {
		return false
	}
	w.parkArmed(i)
	return true
}

// parkArmed moves active[i], whose kicks are on, to the parked set.
func (w *worker) parkArmed(i int) {
	a := w.active[i]
	last := w.active[len(w.active)-1]
	w.active[i], last.at = last, i
	w.active[len(w.active)-1] = nil
	w.active = w.active[:len(w.active)-1]
	a.parked, a.at, a.parkedAt = true, len(w.parked), nanotime()
	a.swept.Store(w.sweepEvery > 0)
	w.parked = append(w.parked, a)
}

// parkAllArmed parks every active ring after arm turned their kicks on
// and found no work: the worker is going to sleep.
func (w *worker) parkAllArmed() {
	for i := len(w.active) - 1; i >= 0; i-- {
		if a := w.active[i]; a.hold.rv == nil && a.shapedUntil == 0 {
			w.parkArmed(i)
		}
	}
	w.activeN.Store(int32(len(w.active)))
}

// housekeep runs at most every housekeepInterval while the worker is
// awake: kicks of parked rings, rings gone idle, a slice of the sweep.
func (w *worker) housekeep(now int64) {
	w.hkAt = now
	if len(w.parked) > 0 || w.poked.Load() {
		n, err := unix.EpollWait(w.epfd, w.events[:], 0)
		if err == nil {
			w.handleEvents(n, now)
		}
	}
	w.checkPokes(now)
	if len(w.suspects) > 0 {
		w.judgeSuspects(now)
	}
	w.publish() // before rings park: publish looks at active ones
	for i := len(w.active) - 1; i >= 0; i-- {
		// A busy-polled ring never parks: its guest must never kick.
		if a := w.active[i]; now-a.lastWork >= parkIdle && a.polling != PollBusy && a.shapedUntil == 0 {
			w.park(i)
		}
	}
	if len(w.parked) > 0 && w.sweepEvery > 0 {
		// every parked ring within sweepEvery: n per housekeeping
		n := max(1, int(int64(len(w.parked))*housekeepInterval/w.sweepEvery))
		w.sweep(n, now)
	}
	w.activeN.Store(int32(len(w.active)))
}

// activeTimeout is how long (ns) a sleeping worker may wait before the
// active set needs it: the next sweep of parked rings, a shaped ring's
// tokens (bandwidth.go), a swept ring's late kick; -1: nothing.
func (w *worker) activeTimeout(now int64) int64 {
	left := int64(-1)
	if len(w.parked) > 0 && w.sweepEvery > 0 {
		left = max(w.sweepEvery-(now-w.sweptAt), 0)
	}
	for _, a := range w.active {
		if a.shapedUntil != 0 {
			left = sooner(left, max(a.shapedUntil-now, 0))
		}
	}
	if len(w.suspects) > 0 {
		left = sooner(left, max(stallWait-(now-w.suspects[0].suspectAt), 0))
	}
	return left
}

// sweep looks at n parked rings, round robin, and activates those with
// work a kick did not announce (a lost kick, or a guest that never kicks).
func (w *worker) sweep(n int, now int64) {
	for ; n > 0 && len(w.parked) > 0; n-- {
		if w.sweepAt >= len(w.parked) {
			w.sweepAt = 0
		}
		a := w.parked[w.sweepAt]
		if w.pending(a) {
			w.suspect(a, now)
			w.activate(a, now) // the last parked ring takes its place: look at it next
			continue
		}
		w.sweepAt++
	}
	w.sweptAt = now
}

// suspect remembers a parked ring the sweep found with chains waiting:
// served at once, it is a lost kick (a stall, counted and logged like the
// watchdog's) only if no kick comes within stallWait. A guest may publish
// chains and kick a while later (a vCPU descheduled in between): that
// kick then arrives on the now active ring's eventfd and is counted.
func (w *worker) suspect(a *assignment, now int64) {
	if slices.Contains(w.suspects, a) || kickPending(a) {
		return
	}
	a.suspectAt, a.suspectKicks, a.suspectParked = now, a.tx.Counters.Kicks.Load(), now-a.parkedAt
	w.suspects = append(w.suspects, a)
}

// kickPending reports whether a's kick eventfd has a kick to read.
func kickPending(a *assignment) bool {
	a.tx.Lock()
	defer a.tx.Unlock()
	return readable(a.tx.KickFD())
}

// kickAfterStall tells a late kick from a lost one: the first kick of a
// ring whose stall the sweep declared, if it comes within lateKickWindow
// of the entries it found, was late (a guest vCPU descheduled that long),
// not lost.
func (w *worker) kickAfterStall(a *assignment, now int64) {
	if late := now - a.stalledAt; late < lateKickWindow {
		w.dp.log.Info("a stalled queue's kick came late: the guest did kick, after the stall bound",
			"port", a.port.dev.Name(), "pair", a.pair, "cpu", w.cpu, "late_ms", late/1_000_000)
	}
	a.stalledAt = 0
}

// lateKickWindow: a kick this long after a declared stall's entries were
// found still answers them.
const lateKickWindow = int64(2_000_000_000)

// stallWait is how long a swept ring's kick may be late before the sweep
// calls it lost: the watchdog's default bound.
const stallWait = int64(DefaultStallBound)

// judgeSuspects decides about the swept rings whose stallWait is over.
func (w *worker) judgeSuspects(now int64) {
	keep := w.suspects[:0]
	for _, a := range w.suspects {
		switch {
		case now-a.suspectAt < stallWait:
			keep = append(keep, a)
			continue
		case kickPending(a) || a.tx.Counters.Kicks.Load() != a.suspectKicks:
			// the kick came late: not a stall
		default:
			a.tx.Counters.Stalls.Add(1)
			w.dp.log.Warn("queue stalled: a parked ring had entries waiting and its guest did not kick; the sweep served it",
				"port", a.port.dev.Name(), "pair", a.pair, "cpu", w.cpu, "parked_for", time.Duration(a.suspectParked))
			a.stalledAt = a.suspectAt
		}
	}
	clear(w.suspects[len(keep):])
	w.suspects = keep
}

// keepSuspects forgets the suspects that left the worker's list. It reads
// nothing of theirs: once the list changed (take), the pair's new worker
// may already be writing it (move).
func (w *worker) keepSuspects(list []*assignment) {
	w.suspects = slices.DeleteFunc(w.suspects, func(a *assignment) bool { return !slices.Contains(list, a) })
}

// pending reports whether a ring has chains waiting (or has just been
// started or stopped, which the active set must see).
func (w *worker) pending(a *assignment) bool {
	a.tx.Lock()
	defer a.tx.Unlock()
	q := a.tx.Queue()
	if q == nil {
		q = a.tx.StartedDisabled()
	}
	return q != nil && a.tx.Pending(q)
}

// poke tells the worker that one of its rings changed (started, stopped,
// a new kick eventfd, healed): it looks at its parked rings.
func (w *worker) poke() {
	w.poked.Store(true)
	w.wake()
}

// checkPokes looks at every parked ring after a poke: one with work is
// activated, the others are armed again (a ring that restarted has new
// ring memory whose kick setting nobody made).
func (w *worker) checkPokes(now int64) {
	if !w.poked.Load() || !w.poked.Swap(false) {
		return
	}
	for i := len(w.parked) - 1; i >= 0; i-- {
		a := w.parked[i]
		a.tx.Lock()
		more := false
		if q := a.tx.Queue(); q != nil {
			more = a.tx.SetNotify(q, true)
		} else if q := a.tx.StartedDisabled(); q != nil {
			more = a.tx.SetNotify(q, true)
		}
		a.tx.Unlock()
		if more {
			w.activate(a, now)
		}
	}
}

// handleEvents drains what epoll reported (in a sleep, or by a look while
// awake) and activates the rings that kicked.
func (w *worker) handleEvents(n int, now int64) {
	for i := range n {
		ev := &w.events[i]
		switch ev.Pad {
		case wakeToken:
			unix.Read(w.wakefd, w.drainBuf[:])
			w.woken = true // a look while awake took it: the loop must not sleep on it (worker.go)
			continue
		case heldKickToken: // closed by unarmHolds after the sleep
			unix.Read(int(ev.Fd), w.drainBuf[:])
			continue
		case uplinkToken:
			continue
		}
		a := w.byID[uint32(ev.Pad)]
		if a == nil {
			continue
		}
		a.tx.Lock()
		if fd := a.tx.KickFD(); fd == int(ev.Fd) {
			unix.Read(fd, w.drainBuf[:])
			a.tx.Counters.Kicks.Add(1)
		}
		a.tx.Unlock()
		if a.stalledAt != 0 {
			w.kickAfterStall(a, now)
		}
		w.activate(a, now)
	}
}
