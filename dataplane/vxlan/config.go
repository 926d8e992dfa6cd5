package vxlan

import (
	"fmt"
	"net/netip"
)

// Config is the overlay uplink of a node.
type Config struct {
	// Local is the node's underlay address: VXLAN datagrams are received
	// on it and sent from it.
	Local netip.Addr
	// Port is the UDP port of every VTEP (DefaultPort when 0).
	Port uint16
	// MTU is the underlay's MTU; the guests' is Overhead less.
	MTU int
	// VTEPs are the other nodes' underlay addresses (Local among them is
	// ignored); the node agent replaces them as Nodes come and go.
	VTEPs []netip.Addr
}

// MinUnderlayMTU is the smallest underlay MTU accepted: an inner MTU of
// IPv4's minimum, 576.
const MinUnderlayMTU = 576 + Overhead

// Validate names the field that is wrong.
func (c Config) Validate() error {
	if !c.Local.Is4() {
		return fmt.Errorf("local: %q is not an IPv4 address (the underlay is IPv4)", c.Local)
	}
	if c.MTU < MinUnderlayMTU || c.MTU > MaxUnderlayMTU {
		return fmt.Errorf("mtu: %d is outside %d..%d (the underlay's MTU; guests get %d less)", c.MTU, MinUnderlayMTU, MaxUnderlayMTU, Overhead)
	}
	for i, a := range c.VTEPs {
		if !a.Is4() {
			return fmt.Errorf("vteps[%d]: %q is not an IPv4 address", i, a)
		}
	}
	return nil
}

// InnerMTU is the guests' MTU on an underlay of MTU mtu.
func InnerMTU(mtu int) int { return mtu - Overhead }
