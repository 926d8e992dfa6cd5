package dataplane

// Frames through the uplink (uplink.go is the device). Frames from the
// uplink are learned into the network's MAC table as living behind the
// uplink and switched like a guest's. Each worker reads its own queue (in
// its epoll set, level-triggered) and writes the frames its guests send
// to the uplink into the same queue, flushed once per burst.
//
// Backpressure: a unicast frame from the uplink that finds its guest's RX
// ring full is held, and the worker reads no more from its queue until
// the guest gives buffers back (the device's queue is the buffer, as with
// QEMU's own tap backend) or heldLimit passes. A sleeping worker wakes on
// the guest's RX kick: before it sleeps it re-enables that ring's kicks,
// re-checks it and adds a copy of its kick eventfd to its epoll set
// (armUplinkHold, hold.go).

import (
	"net"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vhostmq/vhostmq/dataplane/netdev"
	"github.com/vhostmq/vhostmq/dataplane/offload"
	"github.com/vhostmq/vhostmq/dataplane/tap"
	"github.com/vhostmq/vhostmq/dataplane/virtio"
	"github.com/vhostmq/vhostmq/dataplane/virtq"
	"github.com/vhostmq/vhostmq/dataplane/vswitch"
	"github.com/vhostmq/vhostmq/dataplane/vxlan"
)

// heldLimit is how long a frame from the uplink waits for its guest to
// give RX buffers back before it is dropped. The other guests served by
// the same uplink queue wait as long, so a guest that stopped taking
// frames must not hold them up for longer; frames to it are then dropped
// at once (as with no backpressure) until it takes one again.
var heldLimit = 50 * time.Millisecond

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
	queueOff bool                         // the queue is out of the epoll set (armUplinkHold, or parked)
	// pause asks the worker to stop reading the queue once it delivered
	// what it read (a handoff: frames wait in the device's queue for the
	// successor); parked says it has.
	pause, parked atomic.Bool
	notifyOn      *netdev.Vring  // the RX ring armUplinkHold asked to kick
	pending       bool           // frames sent since the last Flush
	tapq          *tapQueue      // the tap queue (vnet headers), nil for af_xdp and vxlan
	vxq           *vxlan.Queue   // the vxlan queue, nil for tap and af_xdp
	one           [1]*vxlan.Peer // sendOverlay's list of one VTEP (no allocation per frame)
	meta          upMeta         // offload metadata of the frame at next (uplinkMetaIn)
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
	var nw *network
	if w.up.vxq != nil {
		if nw = w.fromVTEP(u, frame, now); nw == nil {
			return true
		}
	} else {
		var vid int
		vid, frame = vswitch.PopVLAN(frame)
		if nw = (*u.byVLAN.Load())[vid]; nw == nil {
			u.RxNoNetwork.Add(1)
			return true
		}
	}
	if !w.uplinkMetaIn(frame, len(frame) != n) {
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

// upMeta is the offload metadata of the uplink frame being switched: the
// tap's vnet header, its VLAN tag (if any) removed, checked.
type upMeta struct {
	on bool
	h  virtio.NetHdr
	in offload.Info
}

// uplinkMetaIn reads and checks the vnet header of the frame just taken
// from the worker's tap queue (untagged: tagged says whether a tag was
// removed) into w.up.meta; false: the header does not fit the frame.
func (w *worker) uplinkMetaIn(frame []byte, tagged bool) bool {
	wu := w.up
	wu.meta.on = false
	if wu.tapq == nil {
		return true
	}
	hb := wu.tapq.rx[:tap.HdrLen]
	if hb[0]|hb[1] == 0 {
		return true
	}
	m := &wu.meta
	m.h.Decode(hb)
	m.h.NumBuffers = 0
	if tagged && m.h.Flags&offload.FNeedsCsum != 0 {
		if m.h.CsumStart < vlanTag {
			return false
		}
		m.h.CsumStart -= vlanTag
	}
	in, err := offload.Check(&m.h, frame, len(frame))
	if err != nil {
		return false
	}
	if m.h.GSOType != virtio.GSONone {
		m.h.HdrLen = uint16(in.L4End)
	}
	m.in, m.on = in, true
	return true
}

// deliverUp delivers the uplink frame being switched to dst, with its
// offload metadata if it has any, and returns the RX vring that had no
// room for it (uncounted), else nil.
func (w *worker) deliverUp(dst *port, frame []byte, hash uint32) *netdev.Vring {
	wu := w.up
	if !wu.meta.on {
		return w.deliverBuf(dst, frame, hash)
	}
	w.s.off.h, w.s.off.in = wu.meta.h, wu.meta.in
	return w.deliverMeta(dst, frame, hash)
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

// uplinkMeta sends a checked frame with metadata w.s.off.h from scratch to
// the uplink: whole to the tap (its vnet header carries the metadata),
// completed or segmented in software for af_xdp.
func (w *worker) uplinkMeta(nw *network, frame []byte) {
	wu := w.up
	if wu == nil {
		return
	}
	o := &w.s.off
	h := &o.h
	gso := h.GSOType != virtio.GSONone
	if gso && offload.SegmentLen(h, &o.in) > wu.u.mtu {
		wu.u.TxOversize.Add(1)
		return
	}
	switch {
	case wu.tapq != nil:
		buf := wu.q.TxFrame()
		if txHeadroom+len(frame) > len(buf) {
			wu.u.TxOversize.Add(1)
			wu.q.Cancel()
			return
		}
		copy(buf[txHeadroom:], frame)
		w.sendUplinkHdr(nw, buf, txHeadroom, len(frame), h)
		if gso {
			wu.u.TxGSOWhole.Add(1)
		}
	case gso:
		o.seg.Start(frame, h, o.in)
		for seg := o.seg.Next(); seg != nil; seg = o.seg.Next() {
			w.uplinkCopy(nw, seg)
		}
		wu.u.TxGSOSegmented.Add(1)
	case h.Flags&offload.FNeedsCsum != 0:
		old := offload.Complete(frame, h)
		w.uplinkCopy(nw, frame)
		offload.Restore(frame, h, old)
		wu.u.TxCsumSoftware.Add(1)
	default:
		w.uplinkCopy(nw, frame)
	}
}

// uplinkCopy sends a complete frame from a buffer to the uplink.
func (w *worker) uplinkCopy(nw *network, frame []byte) {
	wu := w.up
	buf := wu.q.TxFrame()
	if buf == nil {
		wu.u.TxDropped.Add(1)
		return
	}
	if txHeadroom+len(frame) > len(buf) {
		wu.u.TxOversize.Add(1)
		wu.q.Cancel()
		return
	}
	copy(buf[txHeadroom:], frame)
	w.sendUplink(nw, buf, txHeadroom, len(frame))
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
	if wu.vxq != nil {
		w.sendOverlay(nw, buf, start, n)
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
