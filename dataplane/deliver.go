package dataplane

import (
	"github.com/vhostmq/vhostmq/dataplane/netdev"
	"github.com/vhostmq/vhostmq/dataplane/virtio"
	"github.com/vhostmq/vhostmq/dataplane/virtq"
)

// Delivering a frame that is already in one piece (the direct TX path's
// frame in the source guest's memory, a DHCP answer, an uplink frame, a
// completed or segmented offload frame) into a guest's RX ring: one copy,
// into buffers taken on the direct path when the guest posted the usual
// one-descriptor buffers (virtq/direct.go), else through the walker.

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

// fillWalk: the guest's buffers are not all direct ones; nothing was
// taken, the walker decides.
const fillWalk fillResult = -1

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
		first[10], first[11] = byte(nbufs), byte(nbufs>>8)
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
// buf, which holds at least n, as one or two stores rather than a call.
func (s *scratch) putHdr(buf []byte, n int) {
	if n == virtio.NetHdrSize {
		*(*[virtio.NetHdrSize]byte)(buf) = s.hdr
	} else {
		copy(buf[:n], s.hdr[:n])
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
