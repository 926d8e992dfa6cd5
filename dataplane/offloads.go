package dataplane

// Offloads on the per-packet path. A frame whose virtio-net header carries
// metadata (NEEDS_CSUM with csum_start/csum_offset, a GSO type and size)
// goes whole, header and all, to a guest that negotiated the matching
// GUEST_* features: in one copy, like any unicast frame. Otherwise it is
// read into the worker's scratch (one copy), checked there, and each
// destination gets what it can take: the frame with its metadata, the
// frame with its checksum completed, or its segments (package offload).
// Frames without metadata never come here. The uplink's side of it (the
// tap's vnet header, software segmentation for af_xdp) is uplink_io.go's;
// a DHCP frame with a partial checksum is dhcp.go's.

import (
	"github.com/vhostmq/vhostmq/dataplane/netdev"
	"github.com/vhostmq/vhostmq/dataplane/offload"
	"github.com/vhostmq/vhostmq/dataplane/virtio"
	"github.com/vhostmq/vhostmq/dataplane/virtq"
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

// deliverMeta delivers a checked frame with metadata w.s.off.h (headers
// at w.s.off.in) from a buffer to dst: whole when dst's guest accepts the
// metadata, else with its checksum completed or cut into segments. The
// frame's bytes are the same afterwards (a flood delivers it again). It
// returns the RX vring that had no room when nothing of the frame went in
// (uncounted: the caller drops or holds it), else nil; a ring that fills
// after some segments went in counts the rest as dropped.
func (w *worker) deliverMeta(dst *port, frame []byte, hash uint32) (full *netdev.Vring) {
	o := &w.s.off
	h := &o.h
	caps := dst.dev.RxOffload()
	need := offload.Needs(h, o.in.IPv6)
	out := virtio.NetHdr{NumBuffers: 1}
	if caps&offload.CapCsum != 0 {
		out.Flags = offload.FDataValid // complete and checked below
	}
	switch {
	case caps&need == need: // DATA_VALID alone (from the tap) needs nothing
		out = *h
		out.NumBuffers = 1
		if caps&offload.CapCsum == 0 {
			out.Flags &^= offload.FDataValid
		}
		out.Encode(o.hdr[:])
		rv, ok := w.putBuf(dst, frame, &o.hdr, hash)
		if !ok {
			return rv
		}
		if h.GSOType != virtio.GSONone {
			rv.Counters.GSOWhole.Add(1)
		}
	case h.GSOType != virtio.GSONone:
		out.Encode(o.hdr[:])
		o.seg.Start(frame, h, o.in)
		var took *netdev.Vring
		for seg := o.seg.Next(); seg != nil; seg = o.seg.Next() {
			rv, ok := w.putBuf(dst, seg, &o.hdr, hash)
			switch {
			case ok:
				took = rv
			case rv != nil && took == nil:
				return rv // nothing went in: the whole frame waits or drops
			case rv != nil:
				rv.Counters.DropNoBuf.Add(1)
			}
		}
		if took != nil {
			took.Counters.GSOSegmented.Add(1)
		}
	case h.Flags&offload.FNeedsCsum != 0:
		out.Encode(o.hdr[:])
		old := offload.Complete(frame, h)
		rv, ok := w.putBuf(dst, frame, &o.hdr, hash)
		offload.Restore(frame, h, old)
		if !ok {
			return rv
		}
		rv.Counters.CsumSoftware.Add(1)
	}
	return nil
}

// putBuf copies a frame from a buffer into an RX vring of dst behind
// virtio-net header hdr (num_buffers 1). ok: rv took it; else rv had no
// room (uncounted), or is nil when dst had no ready ring (counted).
func (w *worker) putBuf(dst *port, frame []byte, hdr *[virtio.NetHdrSize]byte, hash uint32) (rv *netdev.Vring, ok bool) {
	s := &w.s
	s.hdr = *hdr
	defer s.plain() // also when a fault in guest memory unwinds
	rv, res := w.put(dst, frame, hash)
	switch res {
	case fillDone:
		return rv, true
	case fillNoRoom:
		return rv, false
	}
	return nil, false
}

// deliverMetaOrDrop is deliverMeta for frames from guests: one that finds
// no room is dropped (counted at the full ring).
func (w *worker) deliverMetaOrDrop(dst *port, frame []byte, hash uint32) {
	if full := w.deliverMeta(dst, frame, hash); full != nil {
		full.Counters.DropNoBuf.Add(1)
	}
}

// forwardMeta is forward for a frame passed whole: the header in
// w.s.off.hdr is written instead of the plain one, and a frame shorter
// than its header allows is not delivered.
func (w *worker) forwardMeta(dst *port, r *virtq.Reader, prefix []byte, maxFrame int, hash uint32) int {
	s := &w.s
	s.hdr, s.minLen = s.off.hdr, s.off.in.MinLen
	defer s.plain() // also when a fault in guest memory unwinds
	return w.forward(dst, r, prefix, maxFrame, hash)
}

// plain puts back the header and length check of frames without
// metadata.
func (s *scratch) plain() { s.hdr, s.minLen = plainHdr, 0 }

// deliverLinear delivers a guest's frame read into scratch (checked
// against its metadata) to its unicast destination to, or floods it
// (to nil) to the network's other ports and its uplink; it reports
// whether there was anywhere to deliver it.
func (w *worker) deliverLinear(src, to *port, frame []byte, hash uint32) bool {
	switch {
	case to != nil && to.up != nil:
		w.uplinkMeta(src.net, frame)
		return true
	case to != nil:
		w.deliverMetaOrDrop(to, frame, hash)
		return true
	}
	flooded := false
	for _, p := range *src.net.ports.Load() {
		if p != src {
			w.deliverMetaOrDrop(p, frame, hash)
			flooded = true
		}
	}
	if src.net.up != nil {
		w.uplinkMeta(src.net, frame)
		flooded = true
	}
	return flooded
}
