package dataplane

import (
	"fmt"

	"github.com/vhostmq/vhostmq/dataplane/guestmem"
	"github.com/vhostmq/vhostmq/dataplane/netdev"
)

// A worker runs with debug.SetPanicOnFault, so a frontend that took back
// memory it shared (netdev/fault.go) makes the worker panic where it
// touched it; serveSafely and serveUplinkSafely recover, and stopFaulted
// stops the ring whose port owns the memory and ends that port's session.
// A ring armed outside a burst goes through netdev.Vring.SetNotify, which
// catches its own faults.

// stopFaulted stops the ring to blame for a panic r while serving: for a
// memory fault, the one of the candidates (the ring the burst's
// bookkeeping blames first) whose port's memory holds the faulting
// address, and that port's session ends; for any other panic (a bug), the
// first candidate. It returns the ring it stopped. No candidate's lock is
// held.
func (w *worker) stopFaulted(r any, where string, candidates ...*netdev.Vring) *netdev.Vring {
	f := guestmem.AsFault(r)
	v := candidates[0]
	if f != nil {
		for _, c := range candidates {
			if c == nil {
				continue
			}
			c.Lock()
			holds := c.Holds(f.Addr)
			c.Unlock()
			if holds {
				v = c
				break
			}
		}
	}
	v.Lock()
	w.breakVring(v, fmt.Errorf("fault while %s: %v", where, r))
	if f != nil {
		v.Port.Fault(v, where, f)
	}
	v.Unlock()
	return v
}
