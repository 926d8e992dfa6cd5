package dataplane

// Into an RX ring: the other half of the per-packet path (transmit.go is
// the first). A burst holds one destination RX vring at a time (holdRX):
// consecutive frames to it share one lock, one avail-index read and one
// used-index publish, and releaseRX publishes what it received and
// decides about the interrupt, once per ring and burst (touch,
// callTouched).
//
// A frame already in one piece (the direct TX path's frame in the source
// guest's memory, a DHCP answer, an uplink frame, a completed or
// segmented offload frame) goes in with put: one copy, into buffers taken
// on the direct path when the guest posted the usual one-descriptor
// buffers (virtq/direct.go), else through the walker (fill). A frame the
// walker reads from its source chain goes in with forward (unicast, the
// chain read once) or deliver (a flood, the chain walked again per
// destination). unicastRun and spanRun (transmit.go) take a run of
// buffers back to back for a run of frames to one guest.

import (
	"github.com/vhostmq/vhostmq/dataplane/netdev"
	"github.com/vhostmq/vhostmq/dataplane/virtio"
	"github.com/vhostmq/vhostmq/dataplane/virtq"
)

const (
	// maxMergeBufs bounds how many RX chains one frame may span with
	// MRG_RXBUF; a 9702-byte frame needs 7 chains of Linux's smallest
	// mergeable buffers.
	maxMergeBufs = 64
	// maxTouched bounds the RX vrings one burst remembers to interrupt;
	// beyond it, interrupts are sent at once.
	maxTouched = 64
)

type usedElem struct {
	head uint16
	len  uint32
}

// rxHold is the destination RX vring a burst holds locked, so that
// consecutive frames to it share one lock, one avail-index read and one
// used-index publish.
type rxHold struct {
	v         *netdev.Vring
	q         *virtq.Queue
	port      *port  // v's port: a stopped ring is no longer offered to flows
	hdrLen    int    // v's virtio-net header length
	mergeable bool   // v's guest takes frames spanning several chains
	logging   bool   // v's queue marks what is written into it (live migration)
	avail     int    // chains known to be available and not yet taken; re-read at 0
	frames    uint64 // frames pushed and not yet published
	bytes     uint64
	// pub is the ring's used index when the hold began: what a fault in
	// the source's memory rolls the hold back to (releaseAfterFault)
	pub uint16
}

// holdRX makes rv the held RX vring (releasing the previous one) and
// returns the hold, or nil when rv cannot take frames.
func (w *worker) holdRX(rv *netdev.Vring, dst *port) *rxHold {
	h := &w.s.rx
	if h.v == rv {
		return h
	}
	w.releaseRX(false)
	rv.Lock()
	q := rv.Queue()
	if q == nil {
		rv.Unlock()
		return nil
	}
	*h = rxHold{v: rv, q: q, port: dst, hdrLen: rv.HdrLen(), mergeable: rv.Mergeable(), logging: q.Logging(), pub: q.UsedIdx()}
	return h
}

// releaseRX publishes what the held RX vring received (one fence), counts
// it, and unlocks it. With callNow the guest is interrupted at once if it
// wants to be (the end of a burst); otherwise the decision waits for
// callTouched.
func (w *worker) releaseRX(callNow bool) {
	h := &w.s.rx
	rv := h.v
	if rv == nil {
		return
	}
	if h.frames > 0 {
		s := &w.s
		prev := s.inRX
		s.inRX = true
		h.q.Publish()
		s.inRX = prev
		c := &rv.Counters
		c.Packets.Add(h.frames)
		c.Bytes.Add(h.bytes)
		if callNow {
			w.untouch(rv)
			rv.Call()
		} else {
			w.touch(rv)
		}
	} else if callNow && w.untouch(rv) {
		rv.Call()
	}
	*h = rxHold{}
	rv.Unlock()
}

type fillResult int

const (
	fillDone   fillResult = iota // the frame is in nbufs chains, taken and not yet pushed
	fillNoRoom                   // no (or too few) buffers: nothing taken
	fillBroken                   // the destination broke the ring protocol: stopped and released
)

// fillWalk: the guest's buffers are not all direct ones; nothing was
// taken, the walker decides.
const fillWalk fillResult = -1

// put copies frame behind the header s.hdr (plainHdr but while an offload
// frame is delivered) into an RX vring of dst, through the burst's RX hold.
// It returns the vring chosen and how it went: fillNoRoom (uncounted: the
// caller holds or drops the frame; no tokens of dst's ingress limit
// spent), fillBroken (the ring stopped, dst had no ready ring, or its
// ingress limit dropped the frame: rv nil, counted), or fillDone.
func (w *worker) put(dst *port, frame []byte, hash uint32) (rv *netdev.Vring, res fillResult) {
	// A port with one pair whose ring the burst holds already takes the
	// frame there: held, the ring cannot stop meanwhile.
	h := &w.s.rx
	if h.port != dst || len(dst.rxReady) != 1 {
		pair := dst.pickRX(hash)
		if pair < 0 {
			dst.dev.Vrings()[0].Counters.DropDisable.Add(1)
			return nil, fillBroken
		}
		rv := dst.dev.Vrings()[2*pair]
		if h.v != rv {
			if h = w.holdRX(rv, dst); h == nil {
				rv.Counters.DropDisable.Add(1)
				return nil, fillBroken
			}
		}
	}
	rv = h.v
	s := &w.s
	s.inRX = true
	res = fillDone
	if h.avail == 0 {
		res = h.refill()
	}
	if res == fillDone && !w.admit(dst, len(frame)) {
		// policed (bandwidth.go), once the ring has room: a frame the
		// ring could not take spends no tokens
		s.inRX = false
		return nil, fillBroken
	}
	if res == fillDone {
		q, dhdr := h.q, h.hdrLen
		head, buf, t := q.PopRX(dhdr)
		switch {
		case t == virtq.Direct && len(buf) >= dhdr+len(frame): // one buffer: the usual
			h.avail--
			copy(buf[dhdr:], frame)
			if pp := s.pp; pp != nil {
				s.applyPatch(buf[dhdr:], pp, s.ppAt)
			}
			s.putHdr(buf, dhdr)
			if h.logging { // live migration: the frontend resends what we wrote
				q.LogWritten(buf[:dhdr+len(frame)])
			}
			q.Push(head, uint32(dhdr+len(frame)))
			h.frames++
			h.bytes += uint64(len(frame))
		case t == virtq.Direct && h.mergeable:
			h.avail--
			res = w.putSpan(h, head, buf, frame)
		case t == virtq.Broken:
			w.breakHeld(virtq.ErrHeadOutOfRange)
			res = fillBroken
		default: // the walker decides (also that a short buffer is no room)
			q.Unpop(1)
			res = fillWalk
		}
	} else if res == fillBroken {
		w.breakHeld(virtq.ErrAvailIdx)
	}
	if res == fillWalk {
		if s.pp != nil {
			frame = s.checkedCopy(frame)
		}
		var none virtq.Reader // the whole frame is the prefix
		var n, nbufs int
		n, nbufs, res = w.fill(h, frame, &none, len(frame))
		if res == fillDone {
			w.commit(h, nbufs, n)
		}
	}
	// Cleared on a normal return only: after a fault in rv's memory
	// serveSafely must blame rv, not the source ring.
	s.inRX = false
	if res == fillBroken {
		return nil, res
	}
	return rv, res
}

// putSpan is put for a frame longer than its first direct buffer, whose
// header is at first[:h.hdrLen]: the rest goes into the following
// buffers, and the header says how many (num_buffers).
func (w *worker) putSpan(h *rxHold, head uint16, first, frame []byte) fillResult {
	s := &w.s
	q := h.q
	dhdr := h.hdrLen
	// Each buffer's used element is written as it fills (invisible until
	// the hold publishes); a frame that does not fit takes them back.
	if pp := s.pp; pp != nil && len(first) < dhdr+patchLen {
		// the first buffer cannot hold what was checked: from a copy of
		// the frame with it written over (the guest may rewrite its own)
		frame = s.checkedCopy(frame)
	}
	k := copy(first[dhdr:], frame)
	if pp := s.pp; pp != nil && len(first) >= dhdr+patchLen {
		s.applyPatch(first[dhdr:], pp, s.ppAt)
	}
	firstLen := dhdr + k
	q.Push(head, uint32(firstLen))
	nbufs := 1
	for k < len(frame) {
		if nbufs == maxMergeBufs {
			w.unspan(h, nbufs)
			return fillNoRoom
		}
		if h.avail == 0 {
			if res := h.refill(); res != fillDone {
				w.unspan(h, nbufs)
				if res == fillBroken {
					w.breakHeld(virtq.ErrAvailIdx)
				}
				return res
			}
		}
		head, buf, t := q.PopRX(1)
		switch t {
		case virtq.Walk:
			w.unspan(h, nbufs)
			q.Unpop(1)
			return fillWalk
		case virtq.Broken:
			w.unspan(h, nbufs)
			w.breakHeld(virtq.ErrHeadOutOfRange)
			return fillBroken
		}
		h.avail--
		m := copy(buf, frame[k:])
		if h.logging {
			q.LogWritten(buf[:m])
		}
		q.Push(head, uint32(m))
		nbufs++
		k += m
	}
	s.putHdr(first, dhdr)
	if dhdr >= 12 {
		putNumBuffers(first, nbufs)
	}
	if h.logging {
		q.LogWritten(first[:firstLen])
	}
	h.frames++
	h.bytes += uint64(len(frame))
	return fillDone
}

// unspan gives back the last n buffers putSpan took and pushed.
func (w *worker) unspan(h *rxHold, n int) {
	h.q.Unpush(n)
	w.unfill(h, n)
}

// refill re-reads how many chains the held ring's guest made available:
// fillNoRoom when none, fillBroken when its avail index is broken (the
// caller gives back what it took, then breakHeld).
func (h *rxHold) refill() fillResult {
	n, err := h.q.Pending()
	if err != nil {
		return fillBroken
	}
	if n == 0 {
		return fillNoRoom
	}
	h.avail = n
	return fillDone
}

// putHdr writes the first n (10 or 12) bytes of s.hdr at the start of
// buf, which holds at least n, as one or two stores rather than a call,
// and only where buf does not hold them already. A driver recycles its
// receive buffers, and a buffer usually still holds the header of the
// last frame it received, the same as this one's: left unwritten, its
// cache line stays shared and the driver's first read of the frame (its
// num_buffers) hits its own cache instead of fetching the line from the
// worker's. DPDK's vhost does the same (ASSIGN_UNLESS_EQUAL).
func (s *scratch) putHdr(buf []byte, n int) {
	if n == virtio.NetHdrSize {
		if h := (*[virtio.NetHdrSize]byte)(buf); *h != s.hdr {
			*h = s.hdr
		}
	} else if h := buf[:n]; string(h) != string(s.hdr[:n]) {
		copy(h, s.hdr[:n])
	}
}

// putNumBuffers sets the num_buffers field of the 12-byte header at the
// start of buf to c, only if it differs (putHdr).
func putNumBuffers(buf []byte, c int) {
	if buf[10] != byte(c) || buf[11] != byte(c>>8) {
		buf[10], buf[11] = byte(c), byte(c>>8)
	}
}

// checkedCopy copies a direct frame port security checked (s.pp) into
// scratch with the checked fields written over it, for the paths that
// deliver it in pieces: the guest may rewrite its own buffer meanwhile.
func (s *scratch) checkedCopy(frame []byte) []byte {
	lin := s.off.lin[:len(frame)]
	copy(lin, frame)
	s.applyPatch(lin, s.pp, s.ppAt)
	return lin
}

// deliverBuf copies a frame from a dataplane buffer into an RX vring of
// dst through the burst's RX hold (so a worker still holds at most one RX
// vring), spanning several chains with MRG_RXBUF. The virtio-net header
// says nothing but num_buffers: the frame is complete and checksummed.
// It returns the RX vring that had no room for the frame, uncounted (the
// caller drops it or keeps it for later: uplink_io.go), else nil.
func (w *worker) deliverBuf(dst *port, frame []byte, hash uint32) (full *netdev.Vring) {
	if rv, res := w.put(dst, frame, hash); res == fillNoRoom {
		return rv
	}
	return nil
}

// forward copies a unicast frame into an RX vring of dst, reading the rest
// of the source chain from r (whose first bytes, prefix, were already
// read), and returns the frame length (more than maxFrame: too long, not
// delivered). The caller checks r.Err().
func (w *worker) forward(dst *port, r *virtq.Reader, prefix []byte, maxFrame int, hash uint32) int {
	pair := dst.pickRX(hash)
	if pair < 0 {
		n := len(prefix) + r.Skip(maxFrame+1-len(prefix))
		if n <= maxFrame {
			dst.dev.Vrings()[0].Counters.DropDisable.Add(1)
		}
		return n
	}
	rv := dst.dev.Vrings()[2*pair]
	h := w.holdRX(rv, dst)
	if h == nil {
		n := len(prefix) + r.Skip(maxFrame+1-len(prefix))
		if n <= maxFrame {
			rv.Counters.DropDisable.Add(1)
		}
		return n
	}
	s := &w.s
	s.inRX = true
	n, nbufs, res := w.fill(h, prefix, r, maxFrame+1)
	if res == fillDone {
		if n <= maxFrame && n >= s.minLen && r.Err() == nil && w.admit(dst, n) {
			if a := s.a; a != nil && a.hold.stalled != nil {
				a.delivered(dst)
			}
			w.commit(h, nbufs, n)
			if s.hdr[1] != virtio.GSONone { // offloads.go: a GSO frame passed whole
				rv.Counters.GSOWhole.Add(1)
			}
		} else {
			w.unfill(h, nbufs)
		}
	}
	// Cleared on a normal return only: after a fault in rv's memory
	// serveSafely must blame rv, not the source ring.
	s.inRX = false
	if res == fillDone || (res == fillNoRoom && w.hold(rv, dst)) {
		return n
	}
	n += r.Skip(maxFrame + 1 - n)
	if res == fillNoRoom && n <= maxFrame && r.Err() == nil {
		rv.Counters.DropNoBuf.Add(1)
	}
	return n
}

// deliver copies a flooded frame into an RX vring of dst: prefix (its
// head as read and checked once) and the rest walking the source chain
// again (a guest rewriting its descriptors meanwhile only hurts its own
// frame: the walk is bounded again and a frame that came out shorter is
// not delivered).
func (w *worker) deliver(dst *port, src *virtq.Queue, head uint16, srcHdr int, prefix []byte, frameLen int, hash uint32) {
	pair := dst.pickRX(hash)
	if pair < 0 {
		dst.dev.Vrings()[0].Counters.DropDisable.Add(1)
		return
	}
	rv := dst.dev.Vrings()[2*pair]
	h := w.holdRX(rv, dst)
	if h == nil {
		rv.Counters.DropDisable.Add(1)
		return
	}
	s := &w.s
	s.inRX = true
	r := src.NewReader(head)
	r.Skip(srcHdr + len(prefix))
	n, nbufs, res := w.fill(h, prefix, &r, frameLen)
	switch {
	case res == fillDone && n == frameLen && r.Err() == nil && w.admit(dst, n): // bandwidth.go
		w.commit(h, nbufs, n)
	case res == fillDone:
		w.unfill(h, nbufs) // the source chain changed under us, or the ingress limit dropped it
	case res == fillNoRoom:
		rv.Counters.DropNoBuf.Add(1)
	}
	s.inRX = false
}

// fill takes buffers from the held RX vring and writes the virtio-net
// header (s.hdr: plainHdr but while an offload frame is delivered), then prefix, then what r still holds, up to limit frame bytes.
// It returns the frame bytes consumed (prefix included) and, when done,
// how many chains hold them (in s.used).
func (w *worker) fill(h *rxHold, prefix []byte, r *virtq.Reader, limit int) (n, nbufs int, res fillResult) {
	s := &w.s
	rv, rq := h.v, h.q
	dhdr := rv.HdrLen()
	prefix = prefix[:min(len(prefix), limit)]
	for {
		if nbufs == maxMergeBufs || (nbufs == 1 && !rv.Mergeable()) {
			w.unfill(h, nbufs)
			return n, 0, fillNoRoom
		}
		if h.avail == 0 {
			avail, err := rq.Pending()
			if err != nil {
				w.unfill(h, nbufs)
				w.breakHeld(err)
				return n, 0, fillBroken
			}
			if avail == 0 {
				w.unfill(h, nbufs)
				return n, 0, fillNoRoom
			}
			h.avail = avail
		}
		head, err := rq.Pop()
		if err != nil {
			w.unfill(h, nbufs)
			w.breakHeld(err)
			return n, 0, fillBroken
		}
		h.avail--
		nbufs++
		wr := rq.NewWriter(head)
		m := 0
		if nbufs == 1 {
			if m = wr.Write(s.hdr[:dhdr]); m < dhdr {
				if err := wr.Err(); err != nil {
					w.unfill(h, nbufs)
					w.breakHeld(err)
					return n, 0, fillBroken
				}
				w.unfill(h, nbufs)
				return n, 0, fillNoRoom
			}
		}
		if len(prefix) > 0 {
			k := wr.Write(prefix)
			prefix = prefix[k:]
			m += k
			n += k
		}
		if len(prefix) == 0 && n < limit {
			c := wr.CopyFrom(r, limit-n)
			m += c
			n += c
		}
		if err := wr.Err(); err != nil {
			w.unfill(h, nbufs)
			w.breakHeld(err)
			return n, 0, fillBroken
		}
		s.used[nbufs-1] = usedElem{head: head, len: uint32(m)}
		if n == limit || (len(prefix) == 0 && !r.More()) {
			return n, nbufs, fillDone
		}
		// this chain is full and the frame goes on: the next chain
	}
}

// unfill gives back the last k chains taken from the held vring.
func (w *worker) unfill(h *rxHold, k int) {
	h.q.Unpop(k)
	h.avail += k
}

// commit returns the chains of a filled frame as used (published when the
// hold is released).
func (w *worker) commit(h *rxHold, nbufs, frameLen int) {
	s := &w.s
	rq := h.q
	if nbufs > 1 {
		// num_buffers lives in the first chain's header (it may be split
		// across descriptors, so write it through a walker).
		wr := rq.NewWriter(s.used[0].head)
		wr.Skip(10)
		nb := [2]byte{byte(nbufs), byte(nbufs >> 8)}
		wr.Write(nb[:])
	}
	for i := range nbufs {
		rq.Push(s.used[i].head, s.used[i].len)
	}
	h.frames++
	h.bytes += uint64(frameLen)
}

// breakHeld stops the held RX vring (its driver broke the ring protocol)
// after publishing the frames it already took, and releases it.
func (w *worker) breakHeld(err error) {
	h := &w.s.rx
	w.breakVring(h.v, err)
	h.unready()
	w.releaseRX(false)
}

// unready takes the held RX vring out of pickRX's choices until the
// frontend sets it up again (the Changed hook), so that flows pinned to it
// move to the port's other pairs instead of being dropped there.
func (h *rxHold) unready() {
	if h.port != nil {
		h.port.rxReady[h.v.Pair()].Store(false)
	}
}

// touch remembers that rv needs an interrupt decision at the end of the
// burst. Caller holds rv's lock.
func (w *worker) touch(rv *netdev.Vring) {
	s := &w.s
	for i := range s.nt {
		if s.touched[i] == rv {
			return
		}
	}
	if s.nt == maxTouched {
		rv.Call()
		return
	}
	s.touched[s.nt] = rv
	s.nt++
}

// untouch forgets rv and reports whether it was remembered.
func (w *worker) untouch(rv *netdev.Vring) bool {
	s := &w.s
	for i := range s.nt {
		if s.touched[i] == rv {
			s.nt--
			s.touched[i], s.touched[s.nt] = s.touched[s.nt], nil
			return true
		}
	}
	return false
}

// callTouched interrupts each destination guest once per burst.
func (w *worker) callTouched() {
	s := &w.s
	for s.nt > 0 {
		s.nt--
		rv := s.touched[s.nt]
		s.touched[s.nt] = nil
		callLocked(rv)
	}
}

func callLocked(rv *netdev.Vring) {
	rv.Lock()
	defer rv.Unlock()
	rv.Call()
}
