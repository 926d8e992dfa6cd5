package dataplane

// A worker runs with debug.SetPanicOnFault, so a frontend that took back
// memory it shared (netdev/fault.go) makes the worker panic where it
// touched it; serveSafely and serveUplinkSafely recover, and stopFaulted
// stops the ring whose port owns the memory and ends that port's session.
// A ring armed outside a burst goes through netdev.Vring.SetNotify, which
// catches its own faults. A burst cut short is rolled back (culprit,
// releaseAfterFault) and settled (settleAfterFault) here; a guest that
// breaks the ring protocol has its ring stopped (breakVring).

import (
	"fmt"

	"github.com/vhostmq/vhostmq/dataplane/guestmem"
	"github.com/vhostmq/vhostmq/dataplane/netdev"
)

// stopFaulted stops v, the ring blamed for a panic r while serving
// (endBurst, or the uplink's held ring, found it by the faulting
// address), and for a memory fault ends its port's session. It returns
// v. v's lock is not held.
func (w *worker) stopFaulted(r any, where string, v *netdev.Vring) *netdev.Vring {
	v.Lock()
	w.breakVring(v, fmt.Errorf("fault while %s: %v", where, r))
	if f := guestmem.AsFault(r); f != nil {
		v.Port.Fault(v, where, f)
	}
	v.Unlock()
	return v
}

// culprit is the ring a panic while serving tx is blamed on: for a memory
// fault, the one of tx and the held RX ring whose port's mappings hold
// the faulting address (a frame from tx's guest into another guest's
// ring may fault in either's memory); otherwise, or when neither holds
// it, the held RX ring if its memory was being touched, else tx. Caller
// holds both rings.
func (w *worker) culprit(r any, tx *netdev.Vring) *netdev.Vring {
	held := w.s.rx.v
	if f := guestmem.AsFault(r); f != nil {
		switch {
		case held != nil && held.Holds(f.Addr):
			return held
		case tx.Holds(f.Addr):
			return tx
		}
	}
	if w.s.inRX && held != nil {
		return held
	}
	return tx
}

// releaseAfterFault releases the held RX ring after a fault. The culprit's
// is dropped as it stands (its memory is not touched again). Any other
// (the fault was in the source's memory) is rolled back to where the hold
// began: the frames the source put there and not yet published are taken
// back (a frame spanning several buffers is pushed before it is copied
// whole: publishing it could hand the guest half a frame and a stale
// header), and every chain taken since is given back (rings complete in
// order). Only the faulting source's frames are lost. Neither touches
// guest memory: the roll-back moves the queue's own indexes, and nothing
// is published.
func (w *worker) releaseAfterFault(culprit *netdev.Vring) {
	h := &w.s.rx
	if h.v == nil {
		return
	}
	w.s.inRX = false
	if h.v == culprit || h.v.Port == culprit.Port {
		h.unready()
	} else {
		h.q.Unpush(int(h.q.UsedIdx() - h.pub))
		h.q.Unpop(int(h.q.LastAvail() - h.q.UsedIdx()))
	}
	h.v.Unlock()
	*h = rxHold{}
}

// settleAfterFault finishes a burst that a fault in another vring's
// memory (culprit, now stopped) cut short, so that no guest waits forever:
// the TX chain in hand is given back (a unicast frame is served again; a
// flood, which may have reached some guests, is lost), the TX ring's
// completions are published and its guest interrupted, and every
// destination that got frames is interrupted.
// Those rings were readable a moment ago; should one fault now all the
// same, the rest of the settling is given up rather than the process.
func (w *worker) settleAfterFault(tx, culprit *netdev.Vring) {
	w.untouch(culprit)
	if tx.Port != culprit.Port {
		w.returnInHandSafely(tx)
	}
	w.callTouched() // each decision catches its own fault (netdev.Vring.Call)
}

// returnInHandSafely is returnInHand, giving up (with a log line) should
// the source's ring fault now all the same.
func (w *worker) returnInHandSafely(tx *netdev.Vring) {
	defer func() {
		if r := recover(); r != nil {
			w.s.k = 0
			w.dp.log.Warn("second fault while settling a burst", "port", tx.Port.Name(), "vring", tx.Index, "err", r)
		}
	}()
	w.returnInHand(tx)
}

// returnInHand returns the TX chain in hand as used, publishes the TX
// ring and interrupts its guest if it wants that.
func (w *worker) returnInHand(tx *netdev.Vring) {
	tx.Lock()
	defer tx.Unlock()
	q := tx.Queue()
	if q == nil {
		q = tx.StartedDisabled()
	}
	if q == nil {
		return
	}
	if s := &w.s; s.k > 0 {
		q.Unpop(s.k - 1 - s.cur)
		if q.LastAvail() != q.UsedIdx() {
			if s.plan[s.cur].act == actUnicast {
				// A unicast frame reached no guest yet (the fault was in
				// its destination's memory, now stopped, or in another
				// port's ring released on its way): served again.
				q.Unpop(1)
			} else {
				// a flood may have reached some guests: not twice
				q.Push(s.frames[s.cur].Head, 0)
			}
		}
		s.k = 0
	}
	q.Publish()
	tx.Call()
}

// breakVring stops a vring whose driver broke the ring protocol. Caller
// holds its lock.
func (w *worker) breakVring(v *netdev.Vring, err error) {
	if v.Break(err) {
		w.dp.log.Warn("vring stopped: the guest broke the ring protocol; it restarts when the frontend sets it up again",
			"port", v.Port.Name(), "vring", v.Index, "err", err)
	}
}
