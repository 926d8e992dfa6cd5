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
