package dataplane

// The vxlan uplink (#30): networks on it reach the same networks on the
// other nodes through VXLAN tunnels over the node's routed network, told
// apart by their VNI. Each worker has its own sockets (dataplane/vxlan),
// in its epoll set like any uplink queue. This file is the overlay's
// decisions: which nodes are VTEPs, which remote address is behind which
// VTEP (a learning table per network, aged like the MAC table, flushed
// when a VTEP goes), where a frame from a guest goes (its VTEP, or every
// VTEP: head-end replication), and what comes in from whom.
//
// Why UDP sockets and not AF_XDP: the overlay rides the node's own
// routing (any NIC, bond or VLAN the route to a VTEP takes, the kernel's
// neighbour resolution and its IP-level MTU checks), and needs no NIC
// that the dataplane owns; AF_XDP would need the dataplane to route and
// resolve neighbours itself. The cost is a syscall per burst each way.

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync/atomic"

	"github.com/vishvananda/netlink"

	"github.com/vhostmq/vhostmq/dataplane/vswitch"
	"github.com/vhostmq/vhostmq/dataplane/vxlan"
)

// overlay is the vxlan uplink's state beside its sockets.
type overlay struct {
	cfg    vxlan.Config
	nl     *netlink.Handle // in the network namespace the sockets were made in
	queues []*vxlan.Queue  // one per worker
	peers  atomic.Pointer[peerSet]
	// RxUnknownVTEP counts datagrams from an address that is no VTEP:
	// only the nodes' addresses may put frames on a network.
	RxUnknownVTEP atomic.Uint64
	// TxNoVTEP counts frames from guests with no VTEP to go to (no other
	// node yet).
	TxNoVTEP atomic.Uint64
}

// peerSet is the VTEPs, copied on write.
type peerSet struct {
	byAddr map[[4]byte]*vxlan.Peer
	all    []*vxlan.Peer // sorted by address; every flood goes to each
}

// openOverlay opens a queue per worker on the node's address, adopting
// the handed sockets (rx, tx pairs, taken from fds and set to -1) first.
func openOverlay(c vxlan.Config, workers int, handed []int, fds []int) (*overlay, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if c.Port == 0 {
		c.Port = vxlan.DefaultPort
	}
	o := &overlay{cfg: c}
	var err error
	if o.nl, err = netlink.NewHandle(); err != nil {
		return nil, fmt.Errorf("netlink: %w", err)
	}
	for i := 0; i+1 < len(handed) && len(o.queues) < workers; i += 2 {
		q, err := vxlan.Adopt(fds[handed[i]], fds[handed[i+1]], c.Port)
		fds[handed[i]], fds[handed[i+1]] = -1, -1
		if err != nil {
			o.close()
			return nil, err
		}
		o.queues = append(o.queues, q)
	}
	for len(o.queues) < workers {
		q, err := vxlan.Open(c.Local, c.Port)
		if err != nil {
			o.close()
			return nil, err
		}
		o.queues = append(o.queues, q)
	}
	o.peers.Store(&peerSet{byAddr: map[[4]byte]*vxlan.Peer{}})
	if _, err := o.setVTEPs(c.VTEPs); err != nil {
		o.close()
		return nil, err
	}
	return o, nil
}

func (o *overlay) close() {
	for _, q := range o.queues {
		q.Close()
	}
	if o.nl != nil {
		o.nl.Close()
	}
}

// check says why the overlay cannot carry traffic: the node's address is
// on none of its interfaces (the sockets are bound to it).
func (o *overlay) check() error {
	addrs, err := o.nl.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		return fmt.Errorf("reading the node's addresses: %w", err)
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap() == o.cfg.Local {
			return nil
		}
	}
	return fmt.Errorf("the local address %s is on none of the node's interfaces", o.cfg.Local)
}

// setVTEPs makes addrs (the node's own address left out) the VTEPs, and
// returns the ones that went. A VTEP that stays keeps its counters.
func (o *overlay) setVTEPs(addrs []netip.Addr) (gone []*vxlan.Peer, err error) {
	old := o.peers.Load()
	next := &peerSet{byAddr: map[[4]byte]*vxlan.Peer{}}
	for i, a := range addrs {
		if !a.Is4() {
			return nil, fmt.Errorf("vteps[%d]: %q is not an IPv4 address", i, a)
		}
		k := a.As4()
		if a == o.cfg.Local || next.byAddr[k] != nil {
			continue
		}
		p := old.byAddr[k]
		if p == nil {
			if p, err = vxlan.NewPeer(a); err != nil {
				return nil, err
			}
		}
		next.byAddr[k] = p
		next.all = append(next.all, p)
	}
	slices.SortFunc(next.all, func(a, b *vxlan.Peer) int { return a.Addr.Compare(b.Addr) })
	for k, p := range old.byAddr {
		if next.byAddr[k] == nil {
			gone = append(gone, p)
		}
	}
	o.peers.Store(next)
	return gone, nil
}

// SetVTEPs replaces the vxlan uplink's VTEPs (the other nodes' underlay
// addresses; the node's own is left out). The addresses learned behind a
// VTEP that went are forgotten at once: frames to them flood to the
// remaining VTEPs until they are learned again.
func (d *Dataplane) SetVTEPs(addrs []netip.Addr) error {
	if d.up == nil || d.up.vx == nil {
		return errors.New("vteps: this dataplane has no vxlan uplink")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	gone, err := d.up.vx.setVTEPs(addrs)
	if err != nil {
		return err
	}
	for _, p := range gone {
		forgot := 0
		for _, n := range d.nets {
			if n.vteps != nil {
				forgot += n.vteps.Forget(p)
			}
		}
		d.log.Info("VTEP gone", "vtep", p.Addr.String(), "forgotAddresses", forgot)
	}
	if len(gone) > 0 || len(addrs) > 0 {
		d.log.Info("VTEPs", "count", len(d.up.vx.peers.Load().all))
	}
	return nil
}

// fromVTEP finds the network and the sending VTEP of the datagram whose
// inner frame is the worker's frame at wu.next, learns the frame's source
// behind that VTEP and returns the network; nil: dropped and counted.
func (w *worker) fromVTEP(u *uplink, frame []byte, now int64) *network {
	wu := w.up
	vni, src := wu.vxq.Meta(wu.next)
	peer := u.vx.peers.Load().byAddr[src]
	if peer == nil {
		u.vx.RxUnknownVTEP.Add(1)
		return nil
	}
	peer.RxPackets.Add(1)
	peer.RxBytes.Add(uint64(len(frame)))
	nw := (*u.byVNI.Load())[vni]
	if nw == nil {
		u.RxNoNetwork.Add(1)
		return nil
	}
	var smac vswitch.MAC
	copy(smac[:], frame[6:12])
	if !smac.IsMulticast() && !smac.IsZero() {
		nw.vteps.Learn(smac, peer, now)
	}
	return nw
}

// sendOverlay sends the frame at buf[start:start+n] (the worker's
// TxFrame buffer) to the VTEP its destination was learned behind, or to
// every VTEP when the destination is a group address or unknown.
func (w *worker) sendOverlay(nw *network, buf []byte, start, n int) {
	wu := w.up
	u := wu.u
	frame := buf[start : start+n]
	peers := u.vx.peers.Load().all
	if frame[0]&1 == 0 {
		if p, ok := nw.vteps.Lookup(vswitch.MAC(frame[0:6])); ok {
			wu.one[0] = p
			peers = wu.one[:]
		}
	}
	if len(peers) == 0 {
		u.vx.TxNoVTEP.Add(1)
		wu.vxq.Cancel()
		return
	}
	wu.vxq.SendTo(start, n, nw.vni, vswitch.FlowHash(frame), peers)
	wu.one[0] = nil
	wu.pending = true
	u.TxPackets.Add(1)
	u.TxBytes.Add(uint64(n))
}

// overlayName is the uplink's name in stats and handoffs: the node's
// VTEP, "address:port".
func overlayName(c vxlan.Config) string { return fmt.Sprintf("%s:%d", c.Local, c.Port) }

// VTEPStats is one VTEP's counters and how many addresses each network
// learned behind it.
type VTEPStats struct {
	Address   string `json:"address"`
	RxPackets uint64 `json:"rxPackets"`
	RxBytes   uint64 `json:"rxBytes"`
	TxPackets uint64 `json:"txPackets"`
	TxBytes   uint64 `json:"txBytes"`
	// TxErrors: datagrams the kernel refused (no route to the VTEP, or
	// larger than the path's MTU: never fragmented); TxDropped: the
	// socket's send buffer was full.
	TxErrors  uint64 `json:"txErrors"`
	TxDropped uint64 `json:"txDropped"`
	MACs      int    `json:"macs"`
}

// OverlayEntry is one address learned behind a VTEP.
type OverlayEntry struct {
	Network string `json:"network"`
	VNI     uint32 `json:"vni"`
	MAC     string `json:"mac"`
	VTEP    string `json:"vtep"`
	AgeSec  int64  `json:"ageSeconds"`
}

// overlayStats fills the overlay's part of the uplink's stats.
func (d *Dataplane) overlayStats(s *UplinkStats) {
	o := d.up.vx
	s.Name = overlayName(o.cfg)
	s.Queues = len(o.queues)
	s.RxUnknownVTEP, s.TxNoVTEP = o.RxUnknownVTEP.Load(), o.TxNoVTEP.Load()
	for _, q := range o.queues {
		s.RxInvalid += q.RxInvalid.Load() + q.RxTooLarge.Load()
	}
	macs := map[*vxlan.Peer]int{}
	for _, n := range d.networks() {
		if n.vteps != nil {
			n.vteps.Entries(func(_ vswitch.MAC, p *vxlan.Peer, _ int64) { macs[p]++ })
		}
	}
	for _, p := range o.peers.Load().all {
		s.VTEPs = append(s.VTEPs, VTEPStats{Address: p.Addr.String(), RxPackets: p.RxPackets.Load(), RxBytes: p.RxBytes.Load(),
			TxPackets: p.TxPackets.Load(), TxBytes: p.TxBytes.Load(), TxErrors: p.TxErrors.Load(), TxDropped: p.TxDropped.Load(), MACs: macs[p]})
	}
}

// OverlayTable lists every address learned behind a VTEP, by network.
func (d *Dataplane) OverlayTable(now int64) []OverlayEntry {
	var out []OverlayEntry
	for _, n := range d.networks() {
		if n.vteps == nil {
			continue
		}
		n.vteps.Entries(func(m vswitch.MAC, p *vxlan.Peer, seen int64) {
			out = append(out, OverlayEntry{Network: n.name, VNI: n.vni, MAC: net.HardwareAddr(m[:]).String(), VTEP: p.Addr.String(), AgeSec: (now - seen) / 1e9})
		})
	}
	slices.SortFunc(out, func(a, b OverlayEntry) int {
		return cmp.Or(cmp.Compare(a.Network, b.Network), cmp.Compare(a.MAC, b.MAC))
	})
	return out
}
