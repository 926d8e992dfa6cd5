package dataplane

// The uplink: networks that ask for it reach the node's network through
// one multiqueue tap (dataplane/tap) or AF_XDP sockets on a NIC
// (dataplane/afxdp), one queue per worker either way (uplinkQueue). A
// network is untagged on the uplink, or tagged with its VLAN (802.1Q push
// on the way out, pop on the way in). This file is the device: opening
// and closing it, its health and counters, the networks on it and their
// MTUs, the af_xdp device's map of guest MACs, pausing it for a handoff
// and handing its tap to a successor. The frames through it are
// uplink_io.go's.

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/vhostmq/vhostmq/dataplane/afxdp"
	"github.com/vhostmq/vhostmq/dataplane/handoff"
	"github.com/vhostmq/vhostmq/dataplane/tap"
	"github.com/vhostmq/vhostmq/dataplane/vswitch"
	"github.com/vhostmq/vhostmq/dataplane/vxlan"
)

// Uplink kinds.
const (
	UplinkTap   = "tap"
	UplinkAFXDP = "af_xdp"
	UplinkVXLAN = "vxlan"
)

// txHeadroom is where a frame to the uplink starts in its TxFrame buffer:
// room for the tap's vnet header and a VLAN tag pushed in front.
const txHeadroom = tap.HdrLen + vlanTag

// uplinkQueue is one worker's queue of the uplink device: a tap queue or
// an afxdp.Queue. Only that worker calls it.
type uplinkQueue interface {
	// FD is what the worker waits on for frames (-1: nothing to wait for).
	FD() int
	// Receive fills frames with received frames, valid until Release.
	Receive(frames [][]byte) int
	Release()
	// TxFrame returns a buffer to build a frame in at txHeadroom (nil when
	// none is free); Send(off, n) queues buf[off:off+n], Cancel gives the
	// buffer back; Flush sends what was queued.
	TxFrame() []byte
	Send(off, n int) bool
	Cancel()
	Flush()
}

// uplink is the dataplane's uplink: a tap or an AF_XDP device.
type uplink struct {
	kind string
	tap  *tap.Device   // kind tap
	xdp  *afxdp.Device // kind af_xdp
	vx   *overlay      // kind vxlan
	mtu  int           // the largest frame the uplink carries, less the Ethernet header
	// macGen changes when guest MACs leave the af_xdp device's map, so
	// that workers forget which ones they added.
	macGen atomic.Uint64
	// byVLAN maps a VLAN ID (0: untagged) to the network using it on the
	// uplink; copy on write under Dataplane.mu.
	byVLAN atomic.Pointer[map[int]*network]
	// byVNI maps a VNI to the network using it on the vxlan uplink; copy
	// on write under Dataplane.mu.
	byVNI atomic.Pointer[map[uint32]*network]
	UplinkCounters
}

// UplinkCounters count the uplink's traffic; "rx" is from the tap (toward
// the guests), "tx" toward the tap.
type UplinkCounters struct {
	RxPackets, RxBytes, TxPackets, TxBytes atomic.Uint64
	RxNoNetwork                            atomic.Uint64 // a VLAN (or untagged) no network uses
	RxRunt                                 atomic.Uint64 // shorter than an Ethernet header
	RxNoDestination                        atomic.Uint64 // no port on the network to deliver to
	TxDropped                              atomic.Uint64 // the queue was full (tap: EAGAIN; af_xdp: no free frame) or refused the frame
	TxOversize                             atomic.Uint64 // larger than the uplink carries
	MACErrors                              atomic.Uint64 // af_xdp: a guest MAC the XDP program's map refused (full)
	MACTableFull                           atomic.Uint64 // frames whose source a network could not learn: its uplink addresses are at the limit (uplink.maxMACs)
	lastFullLog                            atomic.Int64  // unix nanoseconds of the last "table full" line
	// offloads (uplink_io.go): guest GSO frames sent whole (tap) or
	// segmented (af_xdp), partial checksums completed (af_xdp), frames
	// from the tap whose vnet header did not fit them
	TxGSOWhole, TxGSOSegmented, TxCsumSoftware, RxBadOffload atomic.Uint64
}

// UplinkStats is a snapshot of the uplink.
type UplinkStats struct {
	Kind            string `json:"kind"`
	Name            string `json:"name"`
	Attach          string `json:"attach,omitempty"`
	Queues          int    `json:"queues"`
	Healthy         bool   `json:"healthy"`
	Reason          string `json:"reason,omitempty"`
	RxPackets       uint64 `json:"rxPackets"`
	RxBytes         uint64 `json:"rxBytes"`
	TxPackets       uint64 `json:"txPackets"`
	TxBytes         uint64 `json:"txBytes"`
	RxNoNetwork     uint64 `json:"rxNoNetwork"`
	RxRunt          uint64 `json:"rxRunt"`
	RxNoDestination uint64 `json:"rxNoDestination"`
	TxDropped       uint64 `json:"txDropped"`
	TxOversize      uint64 `json:"txOversize"`
	// af_xdp: how the XDP program and sockets run, and why not faster
	Mode      string `json:"mode,omitempty"`
	MACErrors uint64 `json:"macErrors,omitempty"`
	// MACTableFull counts frames whose source address a network could
	// not learn behind the uplink: it holds uplink.maxMACs already, and
	// unicast to the rest floods its guests.
	MACTableFull uint64 `json:"macTableFull,omitempty"`
	// vxlan: datagrams from an address that is no VTEP, datagrams that
	// are not VXLAN (or too long), frames with no VTEP to go to; and
	// each VTEP's counters
	RxUnknownVTEP uint64      `json:"rxUnknownVtep,omitempty"`
	RxInvalid     uint64      `json:"rxInvalid,omitempty"`
	TxNoVTEP      uint64      `json:"txNoVtep,omitempty"`
	VTEPs         []VTEPStats `json:"vteps,omitempty"`
	// offloads
	TxGSOWhole     uint64 `json:"txGsoWhole"`
	TxGSOSegmented uint64 `json:"txGsoSegmented"`
	TxCsumSoftware uint64 `json:"txCsumSoftware"`
	RxBadOffload   uint64 `json:"rxBadOffload"`
}

// tapQueue is a tap queue: one frame per read and write, behind a vnet
// header with the frame's offload metadata (a received frame's in
// rx[:tap.HdrLen]; txHdr for the next Send, zero: none).
type tapQueue struct {
	fd    int
	txHdr [tap.HdrLen]byte
	rx    [tap.HdrLen + tap.MaxFrame]byte
	tx    [txHeadroom + tap.MaxFrame]byte
}

func (q *tapQueue) FD() int { return q.fd }

func (q *tapQueue) Receive(frames [][]byte) int {
	if len(frames) == 0 {
		return 0
	}
	n, err := unix.Read(q.fd, q.rx[:])
	if err != nil || n <= 0 {
		return 0 // EAGAIN: empty
	}
	frames[0] = q.rx[min(tap.HdrLen, n):n]
	return 1
}

func (q *tapQueue) Release()        {}
func (q *tapQueue) TxFrame() []byte { return q.tx[:] }
func (q *tapQueue) Cancel()         {}
func (q *tapQueue) Flush()          {}

func (q *tapQueue) Send(off, n int) bool {
	copy(q.tx[off-tap.HdrLen:off], q.txHdr[:])
	clear(q.txHdr[:])
	_, err := unix.Write(q.fd, q.tx[off-tap.HdrLen:off+n])
	return err == nil
}

// openUplink opens the configured uplink device and puts each worker's
// queue into its epoll set.
func (d *Dataplane) openUplink(tc *tap.Config, xc *afxdp.Config, vc *vxlan.Config, handed *HandedUplink) error {
	u := &uplink{}
	paused := false // an adopted tap is read once the adopted ports are served
	queues := make([]uplinkQueue, len(d.workers))
	switch {
	case (tc != nil) && (xc != nil) || (tc != nil || xc != nil) && vc != nil:
		return errors.New("uplink: tap, af_xdp and vxlan exclude each other")
	case vc != nil:
		handedQueues, fds := handedOverlay(vc, handed)
		o, err := openOverlay(*vc, len(d.workers), handedQueues, fds)
		if err != nil {
			return fmt.Errorf("uplink.vxlan.%w", err)
		}
		paused = handedQueues != nil
		u.kind, u.vx, u.mtu = UplinkVXLAN, o, vxlan.InnerMTU(o.cfg.MTU)
		for i := range queues {
			queues[i] = o.queues[i]
		}
		d.log.Info("vxlan uplink up", "local", o.cfg.Local.String(), "port", o.cfg.Port, "underlayMTU", o.cfg.MTU, "mtu", u.mtu,
			"vteps", len(o.peers.Load().all), "adoptedQueues", len(handedQueues)/2)
	case tc != nil:
		dev, adopted, err := adoptTap(tc, handed, len(d.workers))
		if err != nil {
			return fmt.Errorf("uplink.tap: the predecessor's tap: %w", err)
		}
		if !adopted {
			if dev, err = tap.Open(*tc, len(d.workers)); err != nil {
				return fmt.Errorf("uplink.tap.%w", err)
			}
		}
		paused = adopted
		u.kind, u.tap, u.mtu = UplinkTap, dev, dev.Config().MTU
		for i := range queues {
			queues[i] = &tapQueue{fd: dev.Queue(i)}
		}
		d.ownDev, d.ownBridge = tc.Name, tc.Attach
		own := ownAddresses(d.ownDev, d.ownBridge)
		d.own.Store(&own)
		d.log.Info("tap uplink up", "tap", tc.Name, "attach", tc.Attach, "queues", dev.Queues(), "mtu", dev.Config().MTU,
			"adopted", adopted, "nodeAddresses", len(own))
	default:
		dev, err := afxdp.Open(*xc, len(d.workers))
		if err != nil {
			return fmt.Errorf("uplink.af_xdp.%w", err)
		}
		u.kind, u.xdp = UplinkAFXDP, dev
		u.mtu = min(dev.MTU(), afxdp.MaxFrame-ethHeader-vlanTag)
		for i := range queues {
			queues[i] = dev.Queue(i)
		}
		d.ownDev = xc.Interface
		own := ownAddresses(d.ownDev, "")
		d.own.Store(&own)
		d.log.Info("af_xdp uplink up", "interface", xc.Interface, "nicQueues", dev.Queues(), "mode", dev.Mode().String(), "mtu", u.mtu,
			"nodeAddresses", len(own))
	}
	u.byVLAN.Store(&map[int]*network{})
	u.byVNI.Store(&map[uint32]*network{})
	for i, w := range d.workers {
		fd := queues[i].FD()
		if fd < 0 {
			continue // sends only
		}
		ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd), Pad: uplinkToken}
		if err := unix.EpollCtl(w.epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
			u.close()
			return fmt.Errorf("uplink: epoll_ctl: %w", err)
		}
	}
	for i, w := range d.workers {
		w.up = &workerUplink{u: u, q: queues[i], known: map[vswitch.MAC]struct{}{}, limit: int64(heldLimit), epfd: w.epfd}
		w.up.tapq, _ = queues[i].(*tapQueue)
		w.up.vxq, _ = queues[i].(*vxlan.Queue)
		w.up.held.kick = -1
		w.up.pause.Store(paused)
		w.wake()
	}
	d.up = u
	return nil
}

func (u *uplink) close() {
	if u.tap != nil {
		u.tap.Close()
	}
	if u.xdp != nil {
		u.xdp.Close()
	}
	if u.vx != nil {
		u.vx.close()
	}
}

func (u *uplink) check() error {
	switch {
	case u.tap != nil:
		return u.tap.Check()
	case u.vx != nil:
		return u.vx.check()
	}
	return u.xdp.Check()
}

// guestMAC makes sure the af_xdp device steers frames to mac (a guest on
// a network on the uplink) to us. It runs once per source address and
// burst; the map is written once per address (and again after removals).
func (w *worker) guestMAC(mac vswitch.MAC) {
	wu := w.up
	if wu == nil || wu.u.xdp == nil {
		return
	}
	if g := wu.u.macGen.Load(); g != wu.gen {
		clear(wu.known)
		wu.gen = g
	}
	if _, ok := wu.known[mac]; ok {
		return
	}
	if err := wu.u.xdp.AddMAC(mac); err != nil {
		wu.u.MACErrors.Add(1)
		return
	}
	wu.known[mac] = struct{}{}
}

// forgetGuestMACs takes a removed port's addresses out of the af_xdp
// device's map. Call before the MAC table forgets them.
func (d *Dataplane) forgetGuestMACs(p *port) {
	u := d.up
	if u == nil || u.xdp == nil || p.net.up == nil {
		return
	}
	p.net.macs.Entries(func(mac vswitch.MAC, owner *port, _ int64) {
		if owner == p {
			u.xdp.DeleteMAC(mac)
		}
	})
	u.macGen.Add(1)
}

// HasUplink reports whether the dataplane has an uplink of that kind.
func (d *Dataplane) HasUplink(kind string) bool { return d.up != nil && d.up.kind == kind }

// UplinkHealth says why the uplink cannot carry traffic (missing or down
// bridge, tap or NIC, XDP program gone), or nil; nil too without an uplink.
func (d *Dataplane) UplinkHealth() error {
	if d.up == nil {
		return nil
	}
	return d.up.check()
}

// UplinkStats returns the uplink's counters, or false without one.
func (d *Dataplane) UplinkStats() (UplinkStats, bool) {
	u := d.up
	if u == nil {
		return UplinkStats{}, false
	}
	s := UplinkStats{Kind: u.kind, Healthy: true,
		RxPackets: u.RxPackets.Load(), RxBytes: u.RxBytes.Load(), TxPackets: u.TxPackets.Load(), TxBytes: u.TxBytes.Load(),
		RxNoNetwork: u.RxNoNetwork.Load(), RxRunt: u.RxRunt.Load(), RxNoDestination: u.RxNoDestination.Load(),
		TxDropped: u.TxDropped.Load(), TxOversize: u.TxOversize.Load(), MACErrors: u.MACErrors.Load(), MACTableFull: u.MACTableFull.Load()}
	s.TxGSOWhole, s.TxGSOSegmented, s.TxCsumSoftware = u.TxGSOWhole.Load(), u.TxGSOSegmented.Load(), u.TxCsumSoftware.Load()
	s.RxBadOffload = u.RxBadOffload.Load()
	switch {
	case u.tap != nil:
		cfg := u.tap.Config()
		s.Name, s.Attach, s.Queues = cfg.Name, cfg.Attach, u.tap.Queues()
	case u.vx != nil:
		d.overlayStats(&s)
	default:
		s.Name, s.Queues, s.Mode = u.xdp.Config().Interface, u.xdp.Queues(), u.xdp.Mode().String()
	}
	if err := u.check(); err != nil {
		s.Healthy, s.Reason = false, err.Error()
	}
	return s, true
}

// checkUplink refuses a network on the uplink when there is none, when it
// is down, or when another network uses the VLAN there, and a port on it
// whose MTU is more than the uplink carries. Caller holds d.mu.
func (d *Dataplane) checkUplink(name string, vlan int, vni uint32, want bool, mtu int) error {
	if want && d.up != nil {
		if err := d.up.checkMTU(mtu); err != nil {
			return err
		}
	}
	if n, ok := d.nets[name]; ok {
		if (n.up != nil) != want {
			return fmt.Errorf("uplink: network %q is %s the uplink", name, map[bool]string{true: "on", false: "not on"}[n.up != nil])
		}
		return nil
	}
	if !want {
		return nil
	}
	if d.up == nil {
		return errors.New("uplink: this dataplane has no uplink")
	}
	if err := d.up.check(); err != nil {
		return fmt.Errorf("uplink: %w", err)
	}
	if d.up.vx != nil {
		switch {
		case vlan != 0:
			return fmt.Errorf("vlan: %d, but on the vxlan uplink a network is told apart by its vni, not a VLAN", vlan)
		case vni == 0:
			return fmt.Errorf("vni: a network on the vxlan uplink needs one (1..%d)", vxlan.MaxVNI)
		}
		if other, ok := (*d.up.byVNI.Load())[vni]; ok {
			return fmt.Errorf("vni: %d is used on the uplink by network %q", vni, other.name)
		}
		return nil
	}
	if vni != 0 {
		return fmt.Errorf("vni: %d, but the uplink is %s, not vxlan", vni, d.up.kind)
	}
	if other, ok := (*d.up.byVLAN.Load())[vlan]; ok {
		return fmt.Errorf("vlan: %d is used on the uplink by network %q", vlan, other.name)
	}
	return nil
}

// checkMTU refuses a port MTU (0: netdev's default) that the uplink
// cannot carry: its frames would be dropped there (TxOversize).
func (u *uplink) checkMTU(mtu int) error {
	if mtu == 0 {
		mtu = 1500 // netdev.New's default
	}
	if mtu <= u.mtu {
		return nil
	}
	why := "uplink.tap.mtu"
	if u.vx != nil {
		why = fmt.Sprintf("uplink.vxlan.mtu %d less %d bytes of VXLAN encapsulation", u.vx.cfg.MTU, vxlan.Overhead)
	}
	if u.xdp != nil {
		why = "the MTU of " + u.xdp.Config().Interface
		if u.mtu < u.xdp.MTU() {
			why = fmt.Sprintf("an AF_XDP frame is at most %d bytes, Ethernet header and VLAN tag included", afxdp.MaxFrame)
		}
	}
	return fmt.Errorf("mtu: %d is more than the %s uplink carries: %d (%s)", mtu, u.kind, u.mtu, why)
}

// UplinkMTU is the largest MTU a port on the uplink may have; 0 without
// an uplink.
func (d *Dataplane) UplinkMTU() int {
	if d.up == nil {
		return 0
	}
	return d.up.mtu
}

// CheckUplinkMTU says why a port with that MTU cannot be on the uplink,
// or nil; nil too without an uplink.
func (d *Dataplane) CheckUplinkMTU(mtu int) error {
	if d.up == nil {
		return nil
	}
	return d.up.checkMTU(mtu)
}

// attachUplink puts a new network on the uplink. Caller holds d.mu.
func (d *Dataplane) attachUplink(n *network) {
	n.up = &port{net: n, up: d.up, guard: &guard{}, mac: noKey}
	n.macs.SetLimit(n.up, d.uplinkMACs)
	if d.up.vx != nil {
		n.vteps = vswitch.NewTable[*vxlan.Peer](d.uplinkMACs)
		m := maps.Clone(*d.up.byVNI.Load())
		m[n.vni] = n
		d.up.byVNI.Store(&m)
		return
	}
	m := map[int]*network{}
	for k, v := range *d.up.byVLAN.Load() {
		m[k] = v
	}
	m[n.vlan] = n
	d.up.byVLAN.Store(&m)
}

// detachUplink takes a network that lost its last port off the uplink.
// Caller holds d.mu.
func (d *Dataplane) detachUplink(n *network) {
	if n.up == nil {
		return
	}
	if n.vteps != nil {
		m := maps.Clone(*d.up.byVNI.Load())
		delete(m, n.vni)
		d.up.byVNI.Store(&m)
		return
	}
	m := map[int]*network{}
	for k, v := range *d.up.byVLAN.Load() {
		if v != n {
			m[k] = v
		}
	}
	d.up.byVLAN.Store(&m)
}

// pauseUplink stops every worker reading its uplink queue, once each has
// delivered what it already read (a held frame included, which waits at
// most heldLimit): from then on frames wait in the device's queues. A
// handoff pauses the uplink before it freezes the rings, so that no frame
// is read and not delivered. The workers go on serving their rings.
func (d *Dataplane) pauseUplink(timeout time.Duration) error {
	if d.up == nil {
		return nil
	}
	for _, w := range d.workers {
		w.up.pause.Store(true)
		w.wake()
	}
	deadline := time.Now().Add(timeout)
	for _, w := range d.workers {
		for i := 1; !w.up.parked.Load(); i++ {
			if time.Now().After(deadline) {
				d.resumeUplink()
				return fmt.Errorf("uplink: worker %d did not stop reading its queue within %v", w.id, timeout)
			}
			if i%20 == 0 {
				w.wake()
			}
			time.Sleep(50 * time.Microsecond)
		}
	}
	return nil
}

// resumeUplink lets the workers read their uplink queues again.
func (d *Dataplane) resumeUplink() {
	if d.up == nil {
		return
	}
	for _, w := range d.workers {
		w.up.pause.Store(false)
		w.wake()
	}
}

// exportUplink describes the tap uplink for a successor and duplicates
// its queues' fds (appended to fds). An af_xdp uplink cannot be handed:
// its NIC queues are bound to this process's sockets and UMEM.
func (d *Dataplane) exportUplink(fds []int) (*handoff.Uplink, []int, error) {
	u := d.up
	if u == nil {
		return nil, fds, nil
	}
	if u.vx != nil {
		// the sockets go on in the successor: datagrams that come in
		// meanwhile wait in them (a new socket beside them would take its
		// share of the flows and leave the old ones' datagrams unread)
		c := u.vx.cfg
		hu := &handoff.Uplink{Kind: u.kind, Name: overlayName(c), MTU: c.MTU}
		for i, q := range u.vx.queues {
			rx, tx := q.FDs()
			for _, fd := range []int{rx, tx} {
				dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
				if err != nil {
					return nil, fds, fmt.Errorf("uplink: dup of vxlan queue %d: %w", i, err)
				}
				hu.Queues = append(hu.Queues, len(fds))
				fds = append(fds, dup)
			}
		}
		return hu, fds, nil
	}
	if u.tap == nil {
		return nil, fds, fmt.Errorf("the %s uplink cannot be handed over (its NIC queues are bound to this process's sockets)", u.kind)
	}
	cfg := u.tap.Config()
	hu := &handoff.Uplink{Kind: u.kind, Name: cfg.Name, Attach: cfg.Attach, MTU: cfg.MTU}
	for i := range u.tap.Queues() {
		fd, err := unix.FcntlInt(uintptr(u.tap.Queue(i)), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			return nil, fds, fmt.Errorf("uplink: dup of queue %d: %w", i, err)
		}
		hu.Queues = append(hu.Queues, len(fds))
		fds = append(fds, fd)
	}
	return hu, fds, nil
}

// handedOverlay returns the predecessor's vxlan sockets (rx, tx pairs:
// indexes into the returned fds) when its uplink was the same VTEP, else
// nil (the handed fds are left to the caller, who closes them).
func handedOverlay(c *vxlan.Config, h *HandedUplink) (queues, fds []int) {
	if h == nil || h.Uplink == nil || h.Uplink.Kind != UplinkVXLAN {
		return nil, nil
	}
	port := c.Port
	if port == 0 {
		port = vxlan.DefaultPort
	}
	if h.Uplink.Name != overlayName(vxlan.Config{Local: c.Local, Port: port}) || len(h.Uplink.Queues)%2 != 0 {
		return nil, nil
	}
	return h.Uplink.Queues, h.FDs
}

// adoptTap takes the predecessor's tap queues (an upgrade without a gap)
// when its tap is the one tc names; false when it is another (the handed
// queues are left to the caller, who closes them) and the tap is opened
// as usual.
func adoptTap(tc *tap.Config, h *HandedUplink, queues int) (*tap.Device, bool, error) {
	if h == nil || h.Uplink == nil {
		return nil, false, nil
	}
	hu := h.Uplink
	if hu.Kind != UplinkTap || hu.Name != tc.Name {
		return nil, false, nil
	}
	qfds := make([]int, len(hu.Queues))
	for i, idx := range hu.Queues {
		qfds[i] = h.FDs[idx]
		h.FDs[idx] = -1
	}
	dev, err := tap.Adopt(*tc, qfds, queues)
	return dev, true, err
}

// ownAddresses returns the node's own addresses on the uplink: the
// device's, and for a tap attached to a bridge the bridge's and its
// ports' (the node's NIC among them), as MAC table Keys. Read through
// netlink in the caller's network namespace (sysfs shows the one it was
// mounted in).
func ownAddresses(dev, bridge string) map[uint64]struct{} {
	own := map[uint64]struct{}{}
	add := func(hw net.HardwareAddr) {
		if len(hw) == 6 {
			own[vswitch.KeyOf(vswitch.MAC(hw))] = struct{}{}
		}
	}
	if l, err := netlink.LinkByName(dev); err == nil {
		add(l.Attrs().HardwareAddr)
	}
	if bridge == "" {
		return own
	}
	br, err := netlink.LinkByName(bridge)
	if err != nil {
		return own
	}
	add(br.Attrs().HardwareAddr)
	links, _ := netlink.LinkList()
	for _, l := range links {
		if l.Attrs().MasterIndex == br.Attrs().Index {
			add(l.Attrs().HardwareAddr)
		}
	}
	return own
}
