package dataplane

// Offloads on the per-packet path. A frame whose virtio-net header carries
// metadata (NEEDS_CSUM with csum_start/csum_offset, a GSO type and size)
// goes whole, header and all, to a guest that negotiated the matching
// GUEST_* features: in one copy, like any unicast frame. Otherwise it is
// read into the worker's scratch (one copy), checked there, and each
// destination gets what it can take: the frame with its metadata, the
// frame with its checksum completed, or its segments (package offload).
// Frames without metadata never come here.

import (
	"github.com/vhostmq/vhostmq/dataplane/netdev"
	"github.com/vhostmq/vhostmq/dataplane/offload"
	"github.com/vhostmq/vhostmq/dataplane/virtio"
	"github.com/vhostmq/vhostmq/dataplane/virtq"
	"github.com/vhostmq/vhostmq/dataplane/vswitch"
)

// offloadScratch is a worker's room for frames with offload metadata.
type offloadScratch struct {
	h   virtio.NetHdr // the frame's metadata, as its sender gave it
	in  offload.Info  // where its headers are (offload.Check)
	hdr [virtio.NetHdrSize]byte
	lin [offload.MaxFrame + 1]byte // the frame read out of its chain
	seg offload.Segmenter
}

type offloadMode int

const (
	offloadPass   offloadMode = iota // one copy, metadata passed whole
	offloadLinear                    // read into scratch, then per destination
	offloadBad                       // the metadata cannot describe the frame: dropped
	offloadMTU                       // GSO segments would exceed the MTU: dropped
)

// offloadTX decides, from a guest TX frame's header and first bytes, how
// the frame goes on, and returns the longest frame its header allows. A
// unicast frame to a guest (guest true) that accepts the metadata is
// passed whole; the header to write is then in w.s.off.hdr.
func (w *worker) offloadTX(hdrLen int, prefix []byte, maxFrame int, to *port, guest bool) (int, offloadMode) {
	o := &w.s.off
	o.h.Decode(w.s.peek[:hdrLen])
	o.h.Flags &^= offload.FDataValid // a device flag: meaningless from a driver
	o.h.NumBuffers = 0
	in, err := offload.Check(&o.h, prefix, offload.MaxFrame)
	o.in = in
	limit := maxFrame
	if o.h.GSOType != virtio.GSONone {
		limit = offload.MaxFrame
	}
	switch {
	case err == offload.ErrNeedLonger:
		return limit, offloadLinear
	case err != nil:
		return offload.MaxFrame, offloadBad
	case o.h.GSOType != virtio.GSONone && offload.SegmentLen(&o.h, &in) > maxFrame-ethHeader-vlanTag:
		return offload.MaxFrame, offloadMTU
	}
	if guest {
		need := offload.Needs(&o.h, in.IPv6)
		if to.dev.RxOffload()&need == need {
			o.h.NumBuffers = 1
			o.h.Encode(o.hdr[:])
			return limit, offloadPass
		}
	}
	return limit, offloadLinear
}

// linearize reads a frame (prefix already read, the rest in r) into the
// worker's scratch and returns its length (more than limit: too long).
func (w *worker) linearize(r *virtq.Reader, prefix []byte, limit int) int {
	o := &w.s.off
	n := copy(o.lin[:], prefix)
	return n + r.Read(o.lin[n:limit+1])
}

// offloadCheck checks the scratch frame of n bytes against its metadata.
func (w *worker) offloadCheck(n int) bool {
	o := &w.s.off
	in, err := offload.Check(&o.h, o.lin[:n], n)
	o.in = in
	return err == nil
}

// offloadOversize reports whether the checked frame's GSO segments would
// be longer than maxFrame allows.
func (w *worker) offloadOversize(maxFrame int) bool {
	o := &w.s.off
	return o.h.GSOType != virtio.GSONone && offload.SegmentLen(&o.h, &o.in) > maxFrame-ethHeader-vlanTag
}

// deliverMeta delivers a checked frame with metadata w.s.off.h from a
// buffer to dst: whole when dst's guest accepts the metadata, else with
// its checksum completed or cut into segments. The frame's bytes are the
// same afterwards (a flood delivers it again).
func (w *worker) deliverMeta(dst *port, frame []byte, hash uint32) {
	o := &w.s.off
	h := &o.h
	caps := dst.dev.RxOffload()
	need := offload.Needs(h, o.in.IPv6)
	out := virtio.NetHdr{NumBuffers: 1}
	if caps&offload.CapCsum != 0 {
		out.Flags = offload.FDataValid // complete and checked below
	}
	switch {
	case caps&need == need:
		out = *h
		out.NumBuffers = 1
		if caps&offload.CapCsum == 0 {
			out.Flags &^= offload.FDataValid
		}
		out.Encode(o.hdr[:])
		if rv := w.deliverBufHdr(dst, frame, &o.hdr, hash); rv != nil && h.GSOType != virtio.GSONone {
			rv.Counters.GSOWhole.Add(1)
		}
	case h.GSOType != virtio.GSONone:
		out.Encode(o.hdr[:])
		o.seg.Start(frame, h, o.in)
		var rv *netdev.Vring
		for seg := o.seg.Next(); seg != nil; seg = o.seg.Next() {
			if d := w.deliverBufHdr(dst, seg, &o.hdr, hash); d != nil {
				rv = d
			}
		}
		if rv != nil {
			rv.Counters.GSOSegmented.Add(1)
		}
	case h.Flags&offload.FNeedsCsum != 0:
		out.Encode(o.hdr[:])
		old := offload.Complete(frame, h)
		if rv := w.deliverBufHdr(dst, frame, &o.hdr, hash); rv != nil {
			rv.Counters.CsumSoftware.Add(1)
		}
		offload.Restore(frame, h, old)
	default: // DATA_VALID only (from the tap)
		out.Flags &= h.Flags
		out.Encode(o.hdr[:])
		w.deliverBufHdr(dst, frame, &o.hdr, hash)
	}
}

// deliverBufHdr copies a frame from a buffer into an RX vring of dst, as
// deliverBuf does, behind virtio-net header hdr; it returns the RX vring
// that took the frame, or nil (counted there: no room, not ready).
func (w *worker) deliverBufHdr(dst *port, frame []byte, hdr *[virtio.NetHdrSize]byte, hash uint32) *netdev.Vring {
	pair := dst.pickRX(hash)
	if pair < 0 {
		dst.dev.Vrings()[0].Counters.DropDisable.Add(1)
		return nil
	}
	rv := dst.dev.Vrings()[2*pair]
	h := w.holdRX(rv)
	if h == nil {
		rv.Counters.DropDisable.Add(1)
		return nil
	}
	s := &w.s
	prev := s.culprit
	s.culprit = rv
	s.hdr = *hdr
	var none virtq.Reader // the whole frame is the prefix
	n, nbufs, res := w.fill(h, frame, &none, len(frame))
	s.hdr = plainHdr
	s.culprit = prev
	switch res {
	case fillDone:
		w.commit(h, nbufs, n)
		return rv
	case fillNoRoom:
		rv.Counters.DropNoBuf.Add(1)
	}
	return nil
}

// answerDHCPMeta is answerDHCP for a DHCP frame read into scratch whose
// UDP checksum the guest left partial (CSUM negotiated).
func (w *worker) answerDHCPMeta(p *port, frame []byte) {
	w.releaseRX(false)
	o := &w.s.off
	r := p.dhcp
	r.mu.Lock()
	defer r.mu.Unlock()
	if o.h.GSOType != virtio.GSONone || len(frame) > len(r.in) {
		r.srv.Counters.Malformed.Add(1)
		return
	}
	in := r.in[:len(frame)]
	copy(in, frame)
	if o.h.Flags&offload.FNeedsCsum != 0 {
		offload.Complete(in, &o.h)
	}
	if n := r.srv.Handle(in, r.out[:]); n > 0 {
		w.deliverBufHdr(p, r.out[:n], &plainHdr, vswitch.FlowHash(r.out[:n]))
	}
}

// uplinkMeta sends a checked frame with metadata w.s.off.h from scratch to
// the uplink, completed or segmented in software.
func (w *worker) uplinkMeta(nw *network, frame []byte) {
	wu := w.up
	if wu == nil {
		return
	}
	o := &w.s.off
	h := &o.h
	switch {
	case h.GSOType != virtio.GSONone:
		o.seg.Start(frame, h, o.in)
		for seg := o.seg.Next(); seg != nil; seg = o.seg.Next() {
			w.uplinkCopy(nw, seg)
		}
	case h.Flags&offload.FNeedsCsum != 0:
		old := offload.Complete(frame, h)
		w.uplinkCopy(nw, frame)
		offload.Restore(frame, h, old)
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
