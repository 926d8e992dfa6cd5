package dataplane

import (
	"cmp"
	"fmt"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vhostmq/vhostmq/dataplane/netdev"
	"github.com/vhostmq/vhostmq/dataplane/vswitch"
)

// assignment is one queue pair a worker serves. It goes with the pair
// when the rebalancer moves the pair to another worker, counters included.
type assignment struct {
	port    *port
	pair    int
	tx      *netdev.Vring
	polling Polling
	// Counted by the one worker serving the pair (a move waits until the
	// old worker has let go) in plain fields, and published for anyone to
	// read by publish: a locked store per burst costs the frames more than
	// fresher figures are worth (#29).
	busyNs      atomic.Uint64 // time spent in bursts that moved frames
	bursts      atomic.Uint64 // bursts that moved frames
	ownBusyNs   uint64        // busyNs as the serving worker counts it
	ownBursts   uint64        // bursts as the serving worker counts it
	unpublished bool          // own* moved since publish
	// hold is a frame of this pair's guest held for a full destination
	// RX ring (hold.go); holding and heldOn say so to other goroutines
	// (the watchdog leaves a holding ring alone; the RX ring's Changed
	// hook wakes the worker).
	hold    txHold
	holding atomic.Bool
	heldOn  atomic.Pointer[netdev.Vring]
	// macs caches the network's MAC table for this pair's frames; only
	// the worker serving the pair touches it
	macs vswitch.Cache[*port]
	// The serving worker's view of the pair (active.go), touched by that
	// worker only: whether it parked the TX ring, where the ring is in
	// its active or parked set, and when a burst last moved frames.
	owner    *worker
	parked   bool
	at       int
	lastWork int64
	// swept says, to the watchdog, that the ring is parked on a worker
	// that sweeps its parked rings: that sweep, not the watchdog, finds
	// its lost kicks.
	swept atomic.Bool
	// suspectAt: when the sweep found the parked ring with chains and no
	// kick, the ring's kick count then and how long it had been parked,
	// read while the ring is among its worker's suspects; parkedAt: when
	// it last parked (active.go)
	suspectAt, suspectParked, parkedAt int64
	suspectKicks                       uint64
	// stalledAt: when the sweep found the entries of the ring's last
	// declared stall (0: none since its next kick; active.go)
	stalledAt int64
	// shapedUntil: the port's egress limit stopped the ring until then
	// (bandwidth.go); 0: not shaped. The ring stays active, unarmed.
	shapedUntil int64
	// shaped says shapedUntil is set, to the watchdog: a shaped ring waits
	// for its worker's timer, not for a kick
	shaped atomic.Bool
	// deficit is what the ring's bursts took beyond their fair share
	// (negative or zero bytes: transmit.go); the serving worker's only
	deficit int64
}

// assignments is a worker's list, with the most demanding polling mode
// among them.
type assignments struct {
	list []*assignment
	mode Polling // PollBusy > PollAdaptive > PollInterrupt
}

func demand(m Polling) int {
	switch m {
	case PollBusy:
		return 2
	case PollAdaptive:
		return 1
	}
	return 0
}

func newAssignments(list []*assignment) *assignments {
	as := &assignments{list: list, mode: PollInterrupt}
	for _, a := range list {
		if demand(a.polling) > demand(as.mode) {
			as.mode = a.polling
		}
	}
	return as
}

// worker is one dataplane thread, locked to its OS thread and pinned to
// one CPU. It serves the queue pairs assigned to it in turn, a burst each,
// and sleeps in epoll_wait on their kick eventfds when none has work
// (after re-enabling notifications and re-checking every ring, so that no
// kick is lost). Busy and adaptive polling can be added in pass/idle
// without touching the rest.
type worker struct {
	dp     *Dataplane
	id     int
	cpu    int
	epfd   int
	wakefd int

	mu   sync.Mutex // serialises changes to list
	list atomic.Pointer[assignments]

	// classified, set by tests only, runs between classify and the
	// switching of a gather: a guest rewriting its frames there
	classified func()

	stopping atomic.Bool
	sleeping atomic.Bool // in epoll_wait: idle, not stuck
	done     chan struct{}

	// health-check bookkeeping, only touched by Dataplane.WorkerHealth
	// (under its healthMu)
	seenPasses uint64
	seenAt     time.Time

	passes   atomic.Uint64 // loop iterations: the health check watches it move (and a pair's move, quiesce)
	sleeps   atomic.Uint64
	busyNs   atomic.Uint64 // queues and uplink, as published (publish)
	upBusyNs atomic.Uint64 // the uplink queue's share of busyNs
	// the worker's own running totals of busyNs and upBusyNs
	ownBusyNs, ownUpBusyNs uint64
	upStart                int64 // wall clock at the start of the last uplink burst (uplink_io.go)
	panics                 atomic.Uint64
	events                 [64]unix.EpollEvent
	s                      scratch
	drainBuf               [8]byte
	up                     *workerUplink // the worker's uplink queue (uplink_io.go); nil without an uplink
	// armedHolds are the pairs whose held frame's RX ring armPairHold armed
	// for this sleep (hold.go)
	armedHolds []*assignment

	// The active set (active.go), built from the list the worker last
	// saw; only the worker touches it.
	seen       *assignments
	active     []*assignment // visited every pass
	parked     []*assignment // kicks on; visited by the sweep only
	byID       map[uint32]*assignment
	sweepAt    int   // the sweep's next index into parked
	sweptAt    int64 // ns: the last sweep
	sweepEvery int64 // ns: sweepInterval, or Config.parkedSweep; <= 0: no sweep
	hkAt       int64 // ns: the last housekeeping
	poked      atomic.Bool
	announcing atomic.Bool // a port of its pairs has an announcement to send (announce.go)
	rarp       [rarpLen]byte
	activeN    atomic.Int32  // len(active), for stats
	suspects   []*assignment // swept rings whose kick may have been lost (active.go)
	grace      int64         // ns an interrupt-mode worker polls before it sleeps (tuneGrace)
	woken      bool          // a wake-up was drained in this loop iteration (active.go)
}

// Tokens (EpollEvent.Pad) of a worker's epoll set besides its TX rings'
// kick eventfds (their vring IDs): its wake-up eventfd, its uplink queue
// (uplinkToken), and the kick eventfd copy of the RX ring a held frame
// waits for (heldKickToken: hold.go).
const (
	wakeToken     = -1
	uplinkToken   = -2
	heldKickToken = -3
)

func newWorker(dp *Dataplane, id, cpu int) (*worker, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("worker %d: epoll_create: %w", id, err)
	}
	wakefd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(epfd)
		return nil, fmt.Errorf("worker %d: eventfd: %w", id, err)
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(wakefd), Pad: wakeToken}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, wakefd, &ev); err != nil {
		unix.Close(epfd)
		unix.Close(wakefd)
		return nil, fmt.Errorf("worker %d: epoll_ctl: %w", id, err)
	}
	w := &worker{dp: dp, id: id, cpu: cpu, epfd: epfd, wakefd: wakefd, done: make(chan struct{}), byID: map[uint32]*assignment{},
		sweepEvery: sweepInterval}
	if dp.parkedSweep != 0 {
		w.sweepEvery = int64(dp.parkedSweep)
	}
	w.s.init()
	w.list.Store(newAssignments(nil))
	return w, nil
}

// add and remove change the assignment list (copy on write) and wake the
// worker so it sees the change.
func (w *worker) add(a *assignment) {
	w.mu.Lock()
	w.list.Store(newAssignments(append(append([]*assignment(nil), w.list.Load().list...), a)))
	w.mu.Unlock()
	w.wake()
}

// take removes one assignment from the list; it reports whether it was
// there.
func (w *worker) take(a *assignment) bool {
	w.mu.Lock()
	old := w.list.Load().list
	l := make([]*assignment, 0, len(old))
	for _, x := range old {
		if x != a {
			l = append(l, x)
		}
	}
	found := len(l) != len(old)
	if found {
		w.list.Store(newAssignments(l))
	}
	w.mu.Unlock()
	w.wake()
	return found
}

// quiesce waits until the worker can no longer be using a list older than
// the current one: it has started a loop iteration since (every list load
// of an iteration follows its passes increment), or it has stopped. The
// change's wake-up may have been taken by an iteration that began before
// p0 was read and went back to sleep, so the worker is woken again while
// it waits. False after timeout.
func (w *worker) quiesce(timeout time.Duration) bool {
	p0 := w.passes.Load()
	deadline := time.Now().Add(timeout)
	for i := 0; w.passes.Load() == p0; i++ {
		select {
		case <-w.done:
			return true
		default:
		}
		if time.Now().After(deadline) {
			return false
		}
		if i%50 == 0 {
			w.wake()
		}
		time.Sleep(20 * time.Microsecond)
	}
	return true
}

func (w *worker) remove(p *port) {
	w.mu.Lock()
	var l []*assignment
	for _, a := range w.list.Load().list {
		if a.port != p {
			l = append(l, a)
		}
	}
	w.list.Store(newAssignments(l))
	w.mu.Unlock()
	w.wake()
}

func (w *worker) wake() { unix.Write(w.wakefd, eventOne[:]) }

var eventOne = [8]byte{1}

// watch and unwatch add a TX vring's kick eventfd to the epoll set; they
// run under the vring's lock (netdev hooks). epoll_ctl may run while the
// worker sleeps in epoll_wait.
func (w *worker) watch(v *netdev.Vring, fd int) {
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd), Pad: int32(v.ID)}
	if err := unix.EpollCtl(w.epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		w.dp.log.Error("cannot wait on kick eventfd", "port", v.Port.Name(), "vring", v.Index, "err", err)
	}
	w.poke() // a parked ring's kicks now come on this fd: look at it
}

func (w *worker) unwatch(_ *netdev.Vring, fd int) {
	unix.EpollCtl(w.epfd, unix.EPOLL_CTL_DEL, fd, nil)
}

// routine is the worker thread.
func (w *worker) routine() {
	defer close(w.done)
	runtime.LockOSThread() // never unlocked: the thread keeps its CPU mask and exits with us
	if w.cpu >= 0 {
		var set unix.CPUSet
		set.Set(w.cpu)
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			w.dp.log.Warn("cannot pin worker", "worker", w.id, "cpu", w.cpu, "err", err)
		}
	}
	// A fault in guest memory (a frontend shrinking its memory file) becomes
	// a panic that pass() confines to the vring being touched.
	debug.SetPanicOnFault(true)
	w.dp.log.Debug("worker started", "worker", w.id, "cpu", w.cpu)
	defer w.dp.log.Debug("worker stopped", "worker", w.id)
	idleSince, idlePasses := int64(0), 0
	defer w.publish()
	for !w.stopping.Load() {
		if w.list.Load() != w.seen {
			// the pairs may leave with this increment (quiesce)
			w.publish()
		}
		passes := w.passes.Add(1)
		w.woken = false // what a wake-up announced is looked at from here on
		w.sync()        // every use of the list in this iteration follows the increment (quiesce)
		if passes%disarmPasses == 0 {
			// Rings started while the worker polls still ask for kicks
			// (only activating a ring disarms it); ask again. arm() runs
			// before every sleep, so no wake-up can be lost.
			w.disarm()
		}
		if passes%housekeepPasses == 0 {
			if now := nanotime(); now-w.hkAt >= housekeepInterval {
				w.housekeep(now) // active.go
			}
		}
		if w.pass() {
			idleSince, idlePasses = 0, 0
			continue
		}
		mode := w.list.Load().mode
		if mode == PollBusy {
			continue
		}
		// The clock is read every adaptiveCheck idle passes only.
		idlePasses++
		if idlePasses%adaptiveCheck != 1 {
			continue
		}
		now := nanotime()
		if idleSince == 0 {
			idleSince = now
		}
		if limit := w.idleLimit(mode); now-idleSince < limit {
			continue
		}
		idleFrom := idleSince
		idleSince, idlePasses = 0, 0
		if w.woken {
			// housekeeping drained a wake-up after this iteration began
			// (a stop, a changed list): begin another instead of sleeping
			continue
		}
		if w.arm() {
			w.unarmHolds()
			continue
		}
		w.publish()
		w.parkAllArmed() // armed and checked: kicks bring them back
		w.sleeps.Add(1)
		w.sleeping.Store(true)
		w.sleep(w.sleepTimeout())
		w.sleeping.Store(false)
		w.unarmHolds()
		if mode == PollInterrupt {
			w.tuneGrace(nanotime() - idleFrom)
		}
	}
}

// disarmPasses is how often (in passes) a polling worker asks its guests
// again not to kick.
const disarmPasses = 1024

// adaptiveIdle is how long an adaptive worker keeps polling without work
// before it sleeps: long enough to catch the next burst of a busy flow
// without paying a kick and a wake-up, short enough that idle ports cost
// nothing.
const adaptiveIdle = int64(200 * time.Microsecond)

// interruptIdle is how long an interrupt-mode worker keeps polling
// without work before it sleeps, at least: a sleep, a wake-up and the
// guest's kick cost more than that much polling, and an idle worker still
// sleeps at once in human terms.
const interruptIdle = int64(20 * time.Microsecond)

// idleLimit is how long the worker polls without work before it sleeps.
// An interrupt-mode worker's grace follows its wake-ups (tuneGrace).
func (w *worker) idleLimit(m Polling) int64 {
	if m == PollAdaptive {
		return adaptiveIdle
	}
	return max(w.grace, interruptIdle)
}

// tuneGrace sets an interrupt-mode worker's grace from its last idle
// spell (polling and sleep, until the wake-up): work that came back
// within adaptiveIdle is a flow between bursts, and the next spell polls
// twice as long (at most adaptiveIdle) to catch it without a sleep, a
// wake-up and a kick, so under load the worker stops sleeping thousands
// of times a second; a longer spell sets it back to interruptIdle, so an
// idle port costs a 20 µs poll per wake-up.
func (w *worker) tuneGrace(spell int64) {
	if spell < adaptiveIdle {
		w.grace = min(adaptiveIdle, 2*spell)
	} else {
		w.grace = interruptIdle
	}
}

// adaptiveCheck is how many idle passes an adaptive worker makes between
// two looks at the clock (an idle pass over a few rings takes well under a
// microsecond; a clock read costs about as much as the pass).
const adaptiveCheck = 16

func nanotime() int64 { return time.Now().UnixNano() }

// publish stores the busy times and burst counts the worker counted since
// it last did, for the stats, the rebalancer and the health check to read:
// at housekeeping, before it sleeps, before it takes a new list, and when
// it stops. Readers see them at most housekeepInterval late while it works.
func (w *worker) publish() {
	for _, a := range w.active {
		if a.unpublished {
			a.busyNs.Store(a.ownBusyNs)
			a.bursts.Store(a.ownBursts)
			a.unpublished = false
		}
	}
	if w.busyNs.Load() != w.ownBusyNs {
		w.busyNs.Store(w.ownBusyNs)
		w.upBusyNs.Store(w.ownUpBusyNs)
	}
}

// pass serves every assigned queue pair once. A pass without work reads
// no clock: a burst with work reads the wall clock when it starts (it
// needs it for MAC learning) and once more here when it ends.
//
// It is never inlined: the instruction counts of docs/performance.md are
// taken inside it (callgrind --toggle-collect), whatever the compiler
// inlines around it.
//
//go:noinline
func (w *worker) pass() (worked bool) {
	w.sync()
	if w.announcing.Load() && w.announcing.Swap(false) {
		w.sendAnnouncementsSafely()
	}
	for _, a := range w.active {
		if a.shapedUntil != 0 {
			if nanotime() < a.shapedUntil {
				continue
			}
			a.shapedUntil = 0
			a.shaped.Store(false)
		}
		w.s.start = 0
		if !w.serveSafely(a) {
			continue
		}
		w.flushUplink()
		worked = true
		if t0 := w.s.start; t0 != 0 {
			d := uint64(max(nanotime()-t0, 0))
			a.lastWork = t0
			a.ownBusyNs += d
			a.ownBursts++
			a.unpublished = true
			w.ownBusyNs += d
		}
	}
	if w.up != nil {
		w.upStart = 0
		if w.serveUplinkSafely() {
			worked = true
			if t0 := w.upStart; t0 != 0 {
				d := uint64(max(nanotime()-t0, 0))
				w.ownUpBusyNs += d
				w.ownBusyNs += d
			}
		}
	}
	return worked
}

// serveSafely confines a panic while serving one vring (a bug or a guest
// memory fault) to the vring it happened on.
func (w *worker) serveSafely(a *assignment) (worked bool) {
	defer func() {
		if r := recover(); r != nil {
			w.panics.Add(1)
			if w.up != nil {
				w.up.q.Cancel() // a frame to the uplink half built
			}
			blamed := cmp.Or(w.s.blamed, a.tx) // endBurst found it
			w.s.inRX, w.s.blamed = false, nil
			w.s.a, w.s.txq, w.s.held = nil, nil, false
			a.clearHold() // the chain in hand is returned (settleAfterFault)
			v := w.stopFaulted(r, "forwarding", blamed)
			w.settleAfterFault(a.tx, v)
			worked = true
		}
	}()
	return w.serveTX(a)
}

// arm re-enables guest kicks on every active TX ring (parked ones have
// them on; and on the RX ring a held uplink frame waits for: hold.go)
// and reports whether work arrived meanwhile.
func (w *worker) arm() (more bool) {
	w.sync()
	for _, a := range w.active {
		if a.shapedUntil != 0 {
			continue // its chains wait for tokens, not a kick: sleepTimeout
		}
		if a.hold.rv != nil {
			// its next chain waits for the destination: wait for that
			// ring's kick instead (hold.go)
			if w.armPairHold(a) {
				more = true
			}
			continue
		}
		a.tx.Lock()
		if q := a.tx.Queue(); q != nil && a.tx.SetNotify(q, true) {
			more = true
		} else if q := a.tx.StartedDisabled(); q != nil && a.tx.SetNotify(q, true) {
			more = true
		}
		a.tx.Unlock()
	}
	if !more {
		more = w.armUplinkHold()
	}
	return more
}

// disarm asks the guests of active rings not to kick while the worker is
// busy.
func (w *worker) disarm() {
	for _, a := range w.active {
		a.tx.Lock()
		if q := a.tx.Queue(); q != nil {
			a.tx.SetNotify(q, false)
		}
		a.tx.Unlock()
	}
}

// sleep waits for a kick or a wake-up (at most timeout ms, -1: no limit)
// and drains the eventfds that fired.
func (w *worker) sleep(timeout int) {
	n, err := unix.EpollWait(w.epfd, w.events[:], timeout)
	if err != nil {
		n = 0 // EINTR
	}
	now := nanotime()
	w.handleEvents(n, now) // active.go
	w.checkPokes(now)
	if w.sweepEvery > 0 && now-w.sweptAt >= w.sweepEvery {
		w.sweep(len(w.parked), now)
	}
	if len(w.suspects) > 0 {
		w.judgeSuspects(now)
	}
	w.activeN.Store(int32(len(w.active)))
}

// sleepTimeout is how long (ms) the worker may sleep: until the held
// frame's time is up, at most 1 ms when there is no kick to wait for;
// until the active set's next timer (active.go); -1 (no limit) without
// any.
func (w *worker) sleepTimeout() int {
	now := nanotime()
	left := sooner(w.holdTimeout(), w.activeTimeout(now)) // hold.go, active.go
	if wu := w.up; wu != nil && wu.held.to != nil {
		l := wu.limit - (now - wu.held.since)
		if wu.held.kick < 0 {
			l = min(l, int64(time.Millisecond))
		}
		left = sooner(left, max(l, 0))
	}
	if left < 0 {
		return -1
	}
	return int(max((left+int64(time.Millisecond)-1)/int64(time.Millisecond), 1))
}

// sooner is the earlier of two timeouts in ns, -1 meaning none.
func sooner(a, b int64) int64 {
	if a < 0 || (b >= 0 && b < a) {
		return b
	}
	return a
}

func (w *worker) stop() {
	w.stopping.Store(true)
	w.wake()
	<-w.done
	unix.Close(w.epfd)
	unix.Close(w.wakefd)
}
