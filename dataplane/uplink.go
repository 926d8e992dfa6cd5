package dataplane

// The uplink: networks that ask for it reach the node's network through
// one multiqueue tap (dataplane/tap) or AF_XDP sockets on a NIC
// (dataplane/afxdp), one queue per worker either way (uplinkQueue). A
// network is untagged on the uplink, or tagged with its VLAN (802.1Q push
// on the way out, pop on the way in); frames from the uplink are learned
// into the network's MAC table as living behind the uplink and switched
// like a guest's. Each worker reads its own queue (in its epoll set,
// level-triggered) and writes the frames its guests send to the uplink
// into the same queue, flushed once per burst.
//
// Backpressure: a unicast frame from the uplink that finds its guest's RX
// ring full is held, and the worker reads no more from its queue until
// the guest gives buffers back (the device's queue is the buffer, as with
// QEMU's own tap backend) or heldLimit passes. A sleeping worker wakes on
// the guest's RX kick: before it sleeps it re-enables that ring's kicks,
// re-checks it and adds a copy of its kick eventfd to its epoll set.

import (
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/vhostmq/vhostmq/dataplane/afxdp"
	"github.com/vhostmq/vhostmq/dataplane/handoff"
	"github.com/vhostmq/vhostmq/dataplane/netdev"
	"github.com/vhostmq/vhostmq/dataplane/offload"
	"github.com/vhostmq/vhostmq/dataplane/tap"
	"github.com/vhostmq/vhostmq/dataplane/virtio"
	"github.com/vhostmq/vhostmq/dataplane/virtq"
	"github.com/vhostmq/vhostmq/dataplane/vswitch"
)

// uplinkToken marks an uplink queue in a worker's epoll set, heldKickToken
// the kick eventfd of the RX ring a held frame waits for.
const (
	uplinkToken   = -2
	heldKickToken = -3
)

// heldLimit is how long a frame from the uplink waits for its guest to
// give RX buffers back before it is dropped. The other guests served by
// the same uplink queue wait as long, so a guest that stopped taking
// frames must not hold them up for longer; frames to it are then dropped
// at once (as with no backpressure) until it takes one again.
var heldLimit = 50 * time.Millisecond

// txHeadroom is where a frame to the uplink starts in its TxFrame buffer:
// room for the tap's vnet header and a VLAN tag pushed in front.
const txHeadroom = tap.HdrLen + vlanTag

// Uplink kinds.
const (
	UplinkTap   = "tap"
	UplinkAFXDP = "af_xdp"
)

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
	mtu  int           // the largest frame the uplink carries, less the Ethernet header
	// macGen changes when guest MACs leave the af_xdp device's map, so
	// that workers forget which ones they added.
	macGen atomic.Uint64
	// byVLAN maps a VLAN ID (0: untagged) to the network using it on the
	// uplink; copy on write under Dataplane.mu.
	byVLAN atomic.Pointer[map[int]*network]
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
	// offloads (offloads.go): guest GSO frames sent whole (tap) or
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
	// offloads
	TxGSOWhole     uint64 `json:"txGsoWhole"`
	TxGSOSegmented uint64 `json:"txGsoSegmented"`
	TxCsumSoftware uint64 `json:"txCsumSoftware"`
	RxBadOffload   uint64 `json:"rxBadOffload"`
}

// workerUplink is a worker's uplink queue and its frame list.
type workerUplink struct {
	u      *uplink
	q      uplinkQueue
	frames [burstSize][]byte
	// frames[next:n] are received and not yet switched; the one at next
	// is held while held.to is set
	next, n  int
	held     heldFrame
	heldOn   atomic.Pointer[netdev.Vring] // held.rv, for the Changed hook
	stalled  *port                        // a guest whose held frame waited heldLimit
	limit    int64                        // heldLimit in ns
	epfd     int                          // the worker's
	queueOff bool                         // the queue is out of the epoll set (armHeld, or parked)
	// pause asks the worker to stop reading the queue once it delivered
	// what it read (a handoff: frames wait in the device's queue for the
	// successor); parked says it has.
	pause, parked atomic.Bool
	notifyOn      *netdev.Vring // the RX ring armHeld asked to kick
	pending       bool          // frames sent since the last Flush
	tapq          *tapQueue     // the tap queue (vnet headers), nil for af_xdp
	meta          upMeta        // offload metadata of the frame at next (offloads.go)
	// af_xdp: guest MACs this worker put into the device's map (as of
	// u.macGen == gen), so a burst costs a map lookup, not a syscall.
	known map[vswitch.MAC]struct{}
	gen   uint64
}

// heldFrame is a frame from the uplink waiting for room in its guest's RX
// ring.
type heldFrame struct {
	to    *port         // the destination; nil: nothing held
	rv    *netdev.Vring // its RX ring that was full
	frame []byte        // VLAN tag removed
	hash  uint32
	since int64 // when it first found the ring full
	kick  int   // a copy of rv's kick eventfd while in the worker's epoll set, else -1
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
func (d *Dataplane) openUplink(tc *tap.Config, xc *afxdp.Config, handed *HandedUplink) error {
	u := &uplink{}
	paused := false // an adopted tap is read once the adopted ports are served
	queues := make([]uplinkQueue, len(d.workers))
	switch {
	case tc != nil && xc != nil:
		return errors.New("uplink: tap and af_xdp exclude each other")
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
}

func (u *uplink) check() error {
	if u.tap != nil {
		return u.tap.Check()
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
	if u.tap != nil {
		cfg := u.tap.Config()
		s.Name, s.Attach, s.Queues = cfg.Name, cfg.Attach, u.tap.Queues()
	} else {
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
func (d *Dataplane) checkUplink(name string, vlan int, want bool, mtu int) error {
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
	if u.xdp != nil {
		why = "the MTU of " + u.xdp.Config().Interface
		if u.mtu < u.xdp.MTU() {
			why = fmt.Sprintf("an AF_XDP frame is at most %d bytes, Ethernet header and VLAN tag included", afxdp.MaxFrame)
		}
	}
	return fmt.Errorf("mtu: %d is more than the %s uplink carries: %d (%s)", mtu, u.kind, u.mtu, why)
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
	m := map[int]*network{}
	for k, v := range *d.up.byVLAN.Load() {
		if v != n {
			m[k] = v
		}
	}
	d.up.byVLAN.Store(&m)
}

// serveUplinkSafely confines a fault in a guest's memory while delivering
// frames from the uplink to that guest's RX ring.
func (w *worker) serveUplinkSafely() (worked bool) {
	defer func() {
		if r := recover(); r != nil {
			w.panics.Add(1)
			// The held RX ring is the only guest memory this path touches
			// (one being released on the way to the next is still held).
			var culprit *netdev.Vring
			if h := &w.s.rx; h.v != nil {
				culprit = h.v
				h.unready()
				h.v.Unlock()
				*h = rxHold{}
			}
			w.s.inRX = false
			if v := culprit; v != nil {
				w.stopFaulted(r, "delivering from the uplink", v)
				w.untouch(v)
			}
			// The frame being delivered is dropped; the rest of the batch
			// waits for the next pass, and the guests that got frames
			// earlier in it are interrupted.
			wu := w.up
			wu.dropHeld()
			if wu.next < wu.n {
				wu.next++
			}
			w.callTouched()
			worked = true
		}
	}()
	return w.serveUplink()
}

// serveUplink moves up to a burst of frames from the worker's uplink
// queue to the guests and reports whether it moved any. It stops at a
// frame whose guest's RX ring is full and keeps it (held) for the next
// pass.
func (w *worker) serveUplink() bool {
	wu := w.up
	u := wu.u
	worked := false
	paused := wu.pause.Load()
	if !paused && wu.parked.Load() {
		wu.parked.Store(false)
		wu.pollQueue(true)
	}
	var now int64 // read once, and only when there are frames
	if wu.held.to != nil {
		if !w.retryHeld() {
			w.releaseRX(false)
			return false
		}
		worked = true
		now = time.Now().UnixNano()
		w.upStart = now
	}
	for got := 0; ; {
		for ; wu.next < wu.n; wu.next++ {
			if now == 0 {
				now = time.Now().UnixNano()
				w.upStart = now // busy time (worker.go)
			}
			if !w.fromUplink(u, wu.frames[wu.next], now) {
				w.s.inRX = false
				w.releaseRX(true) // the guest gets what filled its ring
				w.callTouched()
				return true
			}
			worked = true
		}
		if wu.n > 0 {
			wu.q.Release() // delivered frames are copies
			wu.next, wu.n = 0, 0
		}
		if got >= burstSize || paused {
			break
		}
		n := wu.q.Receive(wu.frames[:burstSize-got])
		if n == 0 {
			break
		}
		wu.n = n
		got += n
	}
	if worked {
		w.s.inRX = false
		w.releaseRX(true)
		w.callTouched()
	}
	if paused && !wu.parked.Load() {
		// everything read is delivered (a held frame returned above)
		wu.pollQueue(false)
		wu.parked.Store(true)
	}
	return worked
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

// fromUplink learns and switches one frame from the uplink. It reports
// false when the frame is held: its guest's RX ring is full.
func (w *worker) fromUplink(u *uplink, frame []byte, now int64) bool {
	if len(frame) < ethHeader {
		u.RxRunt.Add(1)
		return true
	}
	u.RxPackets.Add(1)
	u.RxBytes.Add(uint64(len(frame)))
	n := len(frame)
	vid, frame := vswitch.PopVLAN(frame)
	nw := (*u.byVLAN.Load())[vid]
	if nw == nil {
		u.RxNoNetwork.Add(1)
		return true
	}
	if !w.uplinkMetaIn(frame, len(frame) != n) { // offloads.go
		u.RxBadOffload.Add(1)
		return true
	}
	var dmac, smac vswitch.MAC
	copy(dmac[:], frame[0:6])
	copy(smac[:], frame[6:12])
	if !nw.macs.Learn(smac, nw.up, now) && !smac.IsMulticast() && !smac.IsZero() {
		w.uplinkTableFull(nw, smac, now)
	}
	hash := vswitch.FlowHash(frame)
	if !dmac.IsMulticast() {
		if p, ok := nw.macs.Lookup(dmac); ok {
			if p.up != nil {
				u.RxNoDestination.Add(1) // back where it came from
				return true
			}
			return w.toGuest(p, frame, hash, now)
		}
	}
	// floods are never held: one full ring must not stop the rest
	ports := *nw.ports.Load()
	if len(ports) == 0 {
		u.RxNoDestination.Add(1)
	}
	for _, p := range ports {
		if full := w.deliverUp(p, frame, hash); full != nil {
			full.Counters.DropNoBuf.Add(1)
		}
	}
	return true
}

// toGuest delivers a unicast frame from the uplink to p, or holds it when
// p's RX ring is full (false).
func (w *worker) toGuest(p *port, frame []byte, hash uint32, now int64) bool {
	wu := w.up
	full := w.deliverUp(p, frame, hash)
	switch {
	case full == nil:
		if wu.stalled == p {
			wu.stalled = nil
		}
		return true
	case wu.stalled == p:
		full.Counters.DropNoBuf.Add(1)
		return true
	}
	wu.held = heldFrame{to: p, rv: full, frame: frame, hash: hash, since: now, kick: -1}
	wu.heldOn.Store(full)
	return false
}

// retryHeld delivers the held frame if its guest gave buffers back, or
// drops it once it waited heldLimit. It reports whether the frame is gone
// (delivered or dropped). The RX hold may be left taken.
func (w *worker) retryHeld() bool {
	wu := w.up
	h := &wu.held
	if full := w.deliverUp(h.to, h.frame, h.hash); full != nil {
		if nanotime()-h.since < wu.limit {
			h.rv = full
			wu.heldOn.Store(full)
			return false
		}
		full.Counters.DropNoBuf.Add(1)
		wu.stalled = h.to
	}
	wu.dropHeld()
	wu.next++
	return true
}

// dropHeld forgets the held frame.
func (wu *workerUplink) dropHeld() {
	wu.held = heldFrame{kick: -1}
	wu.heldOn.Store(nil)
}

// armHeld prepares the worker's sleep while it holds a frame: the full
// RX ring asks its guest to kick when it adds buffers, is checked once
// more, and a copy of its kick eventfd joins the worker's epoll set (a
// kick after the check leaves the eventfd readable; a copy, so that the
// port closing or replacing its fd cannot leave a stale entry behind);
// the uplink queue, still readable, leaves the set until the sleep ends.
// It reports whether the worker must not sleep: buffers arrived, or the
// ring stopped (the next pass drops the frame).
func (w *worker) armHeld() (more bool) {
	wu := w.up
	if wu == nil || wu.held.to == nil {
		return false
	}
	rv := wu.held.rv
	kick, more := w.armRX(rv) // hold.go
	if more {
		return true
	}
	wu.notifyOn = rv
	wu.pollQueue(false)
	wu.held.kick = kick
	return false
}

// pollQueue stops or resumes waiting for the uplink queue.
func (wu *workerUplink) pollQueue(on bool) {
	fd := wu.q.FD()
	if fd < 0 || wu.queueOff == !on || on && wu.parked.Load() {
		return
	}
	wu.queueOff = !on
	ev := unix.EpollEvent{Fd: int32(fd), Pad: uplinkToken}
	if on {
		ev.Events = unix.EPOLLIN
	}
	unix.EpollCtl(wu.epfd, unix.EPOLL_CTL_MOD, fd, &ev)
}

// unarmHeld undoes armHeld after a sleep.
func (w *worker) unarmHeld() {
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

// forwardUplink sends a unicast frame from a guest's TX chain to the
// uplink: the prefix already read, then the rest of r, up to limit bytes.
// It returns the frame length (more than limit: too long, not sent). The
// caller checks r.Err().
func (w *worker) forwardUplink(nw *network, r *virtq.Reader, prefix []byte, limit int) int {
	wu := w.up
	if wu == nil { // the network is on the uplink only if there is one
		return len(prefix) + r.Skip(limit+1-len(prefix))
	}
	buf := wu.q.TxFrame()
	if buf == nil {
		wu.u.TxDropped.Add(1)
		return len(prefix) + r.Skip(limit+1-len(prefix))
	}
	// an af_xdp frame buffer may be shorter than limit
	room := min(limit, len(buf)-txHeadroom)
	n := copy(buf[txHeadroom:txHeadroom+room], prefix)
	for n < room && r.More() {
		n += r.Read(buf[txHeadroom+n : txHeadroom+room])
	}
	if n == room {
		n += r.Skip(limit + 1 - room) // beyond limit means too long
	}
	if n > limit || r.Err() != nil {
		wu.q.Cancel()
		return n
	}
	if n > room {
		wu.u.TxOversize.Add(1)
		wu.q.Cancel()
		return n
	}
	w.sendUplink(nw, buf, txHeadroom, n)
	return n
}

// floodUplink sends a flooded frame from a guest's TX chain (walked again)
// to the uplink.
func (w *worker) floodUplink(nw *network, src *virtq.Queue, head uint16, hdrLen int, prefix []byte, frameLen int) {
	wu := w.up
	if wu == nil {
		return
	}
	buf := wu.q.TxFrame()
	if buf == nil {
		wu.u.TxDropped.Add(1)
		return
	}
	if txHeadroom+frameLen > len(buf) {
		wu.u.TxOversize.Add(1)
		wu.q.Cancel()
		return
	}
	r := src.NewReader(head)
	r.Skip(hdrLen)
	if r.Read(buf[txHeadroom:txHeadroom+frameLen]) != frameLen || r.Err() != nil {
		wu.q.Cancel()
		return // the chain changed under us
	}
	copy(buf[txHeadroom:], prefix) // the head as it was read and checked

	w.sendUplink(nw, buf, txHeadroom, frameLen)
}

// sendUplink tags the frame at buf[start:start+n] (the worker's TxFrame
// buffer) with the network's VLAN and queues it on the worker's uplink
// queue, flushed at the end of the burst.
func (w *worker) sendUplink(nw *network, buf []byte, start, n int) {
	w.sendUplinkHdr(nw, buf, start, n, nil)
}

// sendUplinkHdr is sendUplink for a frame with offload metadata h (nil:
// none) to the tap, which takes it whole (GSO segments checked against the
// uplink's MTU by the caller).
func (w *worker) sendUplinkHdr(nw *network, buf []byte, start, n int, h *virtio.NetHdr) {
	wu := w.up
	u := wu.u
	limit := u.mtu + ethHeader
	if h != nil && h.GSOType != virtio.GSONone {
		limit = tap.MaxFrame - vlanTag
	}
	if n > limit {
		u.TxOversize.Add(1)
		wu.q.Cancel()
		return
	}
	if nw.vlan != 0 {
		start = vswitch.PushVLAN(buf, start, nw.vlan)
		n += vlanTag
	}
	if h != nil && wu.tapq != nil {
		th := *h
		th.Flags &^= offload.FDataValid
		th.NumBuffers = 0
		if nw.vlan != 0 { // the tag moved the headers
			if th.Flags&offload.FNeedsCsum != 0 {
				th.CsumStart += vlanTag
			}
			if th.HdrLen != 0 {
				th.HdrLen += vlanTag
			}
		}
		th.Encode(wu.tapq.txHdr[:])
	}
	if !wu.q.Send(start, n) {
		u.TxDropped.Add(1)
		return
	}
	wu.pending = true
	u.TxPackets.Add(1)
	u.TxBytes.Add(uint64(n))
}

// flushUplink sends what the burst queued on the uplink.
func (w *worker) flushUplink() {
	if wu := w.up; wu != nil && wu.pending {
		wu.pending = false
		wu.q.Flush()
	}
}

// uplinkTableFull counts a source a network could not learn behind the
// uplink, and says so at most every 10 s.
func (w *worker) uplinkTableFull(nw *network, smac vswitch.MAC, now int64) {
	u := w.up.u
	u.MACTableFull.Add(1)
	if last := u.lastFullLog.Load(); now-last > 10e9 && u.lastFullLog.CompareAndSwap(last, now) {
		w.dp.log.Warn("network learned as many addresses behind the uplink as it may (uplink.maxMACs): frames to the others flood its guests",
			"network", nw.name, "limit", w.dp.uplinkMACs, "unlearned", net.HardwareAddr(smac[:]).String(), "refused", u.MACTableFull.Load())
	}
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
