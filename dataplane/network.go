package dataplane

import (
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/vhostmq/vhostmq/dataplane/vswitch"
	"github.com/vhostmq/vhostmq/dataplane/vxlan"
)

// network is one isolated L2 segment: its own MAC table and port list, so
// that ports on different networks never see each other's frames, floods
// included. Ports name their network (the NAD's network name); "" is the
// default network.
type network struct {
	name  string
	vlan  int    // 802.1Q VID on the uplink; 0 = untagged
	vni   uint32 // VXLAN network identifier on the vxlan uplink; 0 = none
	macs  *vswitch.Table[*port]
	ports atomic.Pointer[[]*port] // every port, for flooding
	up    *port                   // the uplink's stand-in in macs; nil when the network is not on the uplink
	// vteps says which VTEP each address learned behind the vxlan uplink
	// is behind (overlay.go); nil unless the network is on that uplink.
	vteps *vswitch.Table[*vxlan.Peer]
}

func newNetwork(name string, vlan int, vni uint32) *network {
	n := &network{name: name, vlan: vlan, vni: vni, macs: vswitch.NewTable[*port](0)}
	n.ports.Store(&[]*port{})
	return n
}

// checkNetwork refuses a port that asks for another VLAN or VNI than its
// network has. Caller holds d.mu.
func (d *Dataplane) checkNetwork(name string, vlan int, vni uint32) error {
	n, ok := d.nets[name]
	switch {
	case ok && n.vlan != vlan:
		return fmt.Errorf("vlan: %d, but network %q has vlan %d", vlan, name, n.vlan)
	case ok && n.vni != vni:
		return fmt.Errorf("vni: %d, but network %q has vni %d", vni, name, n.vni)
	}
	return nil
}

// joinNetwork adds p to its network, creating the network on first use.
// Caller holds d.mu and has called checkNetwork and checkUplink.
func (d *Dataplane) joinNetwork(p *port, name string, vlan int, vni uint32, uplink bool) {
	n, ok := d.nets[name]
	if !ok {
		n = newNetwork(name, vlan, vni)
		if uplink {
			d.attachUplink(n)
		}
		d.nets[name] = n
	}
	p.net = n
	all := append(append([]*port(nil), *n.ports.Load()...), p)
	n.ports.Store(&all)
}

// leaveNetwork removes p from its network; an empty network goes away.
// Caller holds d.mu.
func (d *Dataplane) leaveNetwork(p *port) {
	n := p.net
	all := slices.DeleteFunc(append([]*port(nil), *n.ports.Load()...), func(x *port) bool { return x == p })
	n.ports.Store(&all)
	if len(all) == 0 {
		delete(d.nets, n.name)
		d.detachUplink(n)
	}
}

// networks returns every network (for aging).
func (d *Dataplane) networks() []*network {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]*network, 0, len(d.nets))
	for _, n := range d.nets {
		out = append(out, n)
	}
	return out
}
