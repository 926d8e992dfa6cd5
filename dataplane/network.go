package dataplane

import (
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/vhostmq/vhostmq/dataplane/vswitch"
)

// network is one isolated L2 segment: its own MAC table and port list, so
// that ports on different networks never see each other's frames, floods
// included. Ports name their network (the NAD's network name); "" is the
// default network.
type network struct {
	name  string
	vlan  int // 802.1Q VID on the uplink; 0 = untagged
	macs  *vswitch.Table[*port]
	ports atomic.Pointer[[]*port] // every port, for flooding
	up    *port                   // the uplink's stand-in in macs; nil when the network is not on the uplink
}

func newNetwork(name string, vlan int) *network {
	n := &network{name: name, vlan: vlan, macs: vswitch.NewTable[*port](0)}
	n.ports.Store(&[]*port{})
	return n
}

// checkNetwork refuses a port that asks for another VLAN than its
// network has. Caller holds d.mu.
func (d *Dataplane) checkNetwork(name string, vlan int) error {
	if n, ok := d.nets[name]; ok && n.vlan != vlan {
		return fmt.Errorf("vlan: %d, but network %q has vlan %d", vlan, name, n.vlan)
	}
	return nil
}

// joinNetwork adds p to its network, creating the network on first use.
// Caller holds d.mu and has called checkNetwork and checkUplink.
func (d *Dataplane) joinNetwork(p *port, name string, vlan int, uplink bool) {
	n, ok := d.nets[name]
	if !ok {
		n = newNetwork(name, vlan)
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
