package dataplane

// Holding guest-to-guest frames. A unicast frame whose destination guest's
// RX ring is full is not dropped at once (TCP would have to resend it):
// the source TX chain stays in its ring, untaken, and the burst on that
// ring stops there, the way the tap uplink leaves a frame in the kernel's
// queue (uplink_io.go). The ring is tried again on the next pass; a
// sleeping worker waits on the destination ring's kick as well. Bounded: a frame
// held for heldLimit (50 ms) is dropped (counted rxNoBuffer and
// rxHoldExpired at the destination), and until that destination takes a
// frame again its frames from this ring are dropped at once, so one stuck
// guest holds a source queue at most once per heldLimit and other
// destinations behind it wait no longer than that. Floods are never held,
// and neither are frames read into scratch for software segmentation.
//
// A sleeping worker waits for a held frame's destination ring the same way
// for a pair's frame and for one from the uplink (uplink_io.go): arm
// prepares the sleep with armPairHold and armUplinkHold (both armRX), and
// unarmHolds undoes both after it.

import (
	"golang.org/x/sys/unix"

	"github.com/vhostmq/vhostmq/dataplane/netdev"
)

// txHold is what an assignment holds: its TX ring's next chain is a frame
// for rv, a full RX ring of dst. Only the worker serving the pair touches
// it, except heldOn and holding, which others read.
type txHold struct {
	rv      *netdev.Vring
	dst     *port
	since   int64 // ns, when the frame first found rv full
	kick    int   // a copy of rv's kick eventfd in the worker's epoll set while it sleeps, else -1
	stalled *port // a destination whose held frame waited heldLimit: its frames are dropped until it takes one
}

// hold decides, inside forward, about a unicast frame that found rv full:
// true keeps it (the caller gives the TX chain back and ends the burst).
func (w *worker) hold(rv *netdev.Vring, dst *port) bool {
	s := &w.s
	a := s.a
	if a == nil || a.hold.stalled == dst {
		return false
	}
	if a.hold.rv != nil && s.inHandFirst() { // the held frame once more (the burst's first)
		if s.start-a.hold.since < int64(heldLimit) {
			a.hold.rv = rv
			a.heldOn.Store(rv)
			s.held = true
			return true
		}
		a.hold.stalled = dst
		rv.Counters.HoldExpired.Add(1)
		return false
	}
	a.hold.rv, a.hold.dst, a.hold.since = rv, dst, s.start
	a.holding.Store(true)
	a.heldOn.Store(rv)
	rv.Counters.Held.Add(1)
	s.held = true
	return true
}

// delivered forgets a stalled destination once it takes a frame again.
func (a *assignment) delivered(dst *port) {
	if a.hold.stalled == dst {
		a.hold.stalled = nil
	}
}

// clearHold forgets the held frame: delivered, dropped, or its ring gone.
func (a *assignment) clearHold() {
	a.hold.rv, a.hold.dst = nil, nil
	a.holding.Store(false)
	a.heldOn.Store(nil)
}

// holdTimeout is how long (ns) the worker may sleep for its held guest
// frames: until the first one's time is up, at most 1 ms for one without
// a kick to wait on; -1 when it holds none.
func (w *worker) holdTimeout() int64 {
	left := int64(-1)
	now := nanotime()
	for _, a := range w.active { // a holding ring never parks (active.go)
		if a.hold.rv == nil {
			continue
		}
		l := int64(heldLimit) - (now - a.hold.since)
		if a.hold.kick < 0 {
			l = min(l, int64(1e6))
		}
		if left < 0 || l < left {
			left = max(l, 0)
		}
	}
	return left
}

// armRX prepares a sleep that waits for rv to get buffers: its old kicks
// are drained (netdev made the fd non-blocking; the check sees their
// buffers), it asks its guest to kick when it adds buffers and is checked
// once more, and a copy of its kick eventfd joins the worker's epoll set
// (a kick after the check leaves it readable; a copy, so that the port
// closing or replacing its fd cannot leave a stale entry behind). It
// returns the copy (-1: none, sleepTimeout polls) and whether the worker
// must not sleep: buffers arrived, or the ring stopped.
func (w *worker) armRX(rv *netdev.Vring) (kick int, more bool) {
	rv.Lock()
	defer rv.Unlock()
	q := rv.Queue()
	if q == nil {
		return -1, true
	}
	fd := rv.KickFD()
	if fd >= 0 {
		if n, _ := unix.Read(fd, w.drainBuf[:]); n == 8 {
			rv.Counters.Kicks.Add(1)
		}
	}
	if rv.SetNotify(q, true) {
		rv.SetNotify(q, false)
		return -1, true
	}
	if fd < 0 {
		return -1, false
	}
	kick, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return -1, false
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(kick), Pad: heldKickToken}
	if err := unix.EpollCtl(w.epfd, unix.EPOLL_CTL_ADD, kick, &ev); err != nil {
		unix.Close(kick)
		return -1, false
	}
	return kick, false
}

// armPairHold prepares a sleep while pair a holds a frame: armRX on the
// full RX ring the frame waits for, and a is remembered for unarmHolds.
// It reports whether the worker must not sleep: buffers arrived, or the
// ring stopped.
func (w *worker) armPairHold(a *assignment) (more bool) {
	kick, more := w.armRX(a.hold.rv)
	if more {
		return true
	}
	w.armedHolds = append(w.armedHolds, a) // unarmHolds turns the kicks off again
	a.hold.kick = kick
	return false
}

// armUplinkHold is armPairHold for the frame the worker's uplink queue
// holds (uplink_io.go); besides, the uplink queue, still readable, leaves
// the epoll set until the sleep ends. It reports whether the worker must
// not sleep: buffers arrived, or the ring stopped (the next pass drops
// the frame).
func (w *worker) armUplinkHold() (more bool) {
	wu := w.up
	if wu == nil || wu.held.to == nil {
		return false
	}
	rv := wu.held.rv
	kick, more := w.armRX(rv)
	if more {
		return true
	}
	wu.notifyOn = rv
	wu.pollQueue(false)
	wu.held.kick = kick
	return false
}

// unarmHolds undoes what armPairHold and armUplinkHold armed, after a
// sleep or an arm that found work: each kick copy leaves the epoll set,
// each RX ring's kicks are turned off again and the uplink queue rejoins
// the set. The pairs are those armPairHold armed: also one that left the
// worker's list meanwhile (moved, or its port removed), whose kick copy
// must not stay in this worker's epoll set.
func (w *worker) unarmHolds() {
	for i, a := range w.armedHolds {
		if a.hold.kick >= 0 {
			unix.EpollCtl(w.epfd, unix.EPOLL_CTL_DEL, a.hold.kick, nil)
			unix.Close(a.hold.kick)
			a.hold.kick = -1
		}
		if rv := a.hold.rv; rv != nil {
			rv.Lock()
			if q := rv.Queue(); q != nil {
				rv.SetNotify(q, false) // RX kicks are off while no one waits for them
			}
			rv.Unlock()
		}
		w.armedHolds[i] = nil
	}
	w.armedHolds = w.armedHolds[:0]
	wu := w.up
	if wu == nil {
		return
	}
	if wu.held.kick >= 0 {
		unix.EpollCtl(w.epfd, unix.EPOLL_CTL_DEL, wu.held.kick, nil)
		unix.Close(wu.held.kick)
		wu.held.kick = -1
	}
	if rv := wu.notifyOn; rv != nil {
		// RX kicks are off while no one waits for them (netdev)
		wu.notifyOn = nil
		rv.Lock()
		if q := rv.Queue(); q != nil {
			rv.SetNotify(q, false)
		}
		rv.Unlock()
	}
	wu.pollQueue(true)
}

// wakeHolding wakes the workers holding a frame for rv: it stopped or
// started, and its kick eventfd may be another one now.
func (d *Dataplane) wakeHolding(rv *netdev.Vring) {
	for _, w := range d.workers {
		if w.up != nil && w.up.heldOn.Load() == rv {
			w.wake()
			continue
		}
		for _, a := range w.list.Load().list {
			if a.heldOn.Load() == rv {
				w.wake()
				break
			}
		}
	}
}
