package dataplane

// Frames the dataplane itself puts into a guest's RX ring: DHCP answers
// now, frames from an uplink later. They come from a buffer rather than
// another guest's chain.

import (
	"github.com/vhostmq/vhostmq/dataplane/netdev"
	"github.com/vhostmq/vhostmq/dataplane/virtio"
	"github.com/vhostmq/vhostmq/dataplane/virtq"
	"github.com/vhostmq/vhostmq/dataplane/vswitch"
)

// answerDHCP handles a DHCP client frame from p's guest (the TX chain at
// head of q) and puts the answer, if any, into p's RX ring. The caller
// holds q's vring lock.
func (w *worker) answerDHCP(p *port, q *virtq.Queue, head uint16, hdrLen, frameLen int) {
	// Lock order: the TX vring, r.mu, then an RX vring.
	r := p.dhcp
	r.mu.Lock()
	defer r.mu.Unlock()
	if frameLen > len(r.in) {
		r.srv.Counters.Malformed.Add(1)
		return
	}
	rd := q.NewReader(head)
	rd.Skip(hdrLen)
	if rd.Read(r.in[:frameLen]) != frameLen || rd.Err() != nil {
		return // the guest changed its buffer under us: its frame, its loss
	}
	if n := r.srv.Handle(r.in[:frameLen], r.out[:]); n > 0 {
		w.deliverBuf(p, r.out[:n], vswitch.FlowHash(r.out[:n]))
	}
}

// deliverBuf copies a frame from a dataplane buffer into an RX vring of
// dst, spanning several chains with MRG_RXBUF. The virtio-net header says
// nothing but num_buffers: the frame is complete and checksummed.
func (w *worker) deliverBuf(dst *port, frame []byte, hash uint32) bool {
	pair := dst.pickRX(hash)
	if pair < 0 {
		dst.dev.Vrings()[0].Counters.DropDisable.Add(1)
		return false
	}
	rv := dst.dev.Vrings()[2*pair]
	rv.Lock()
	defer rv.Unlock()
	rq := rv.Queue()
	if rq == nil {
		rv.Counters.DropDisable.Add(1)
		return false
	}
	s := &w.s
	prev := s.culprit
	s.culprit = rv
	ok := w.deliverBufLocked(rv, rq, frame)
	s.culprit = prev
	return ok
}

func (w *worker) deliverBufLocked(rv *netdev.Vring, rq *virtq.Queue, frame []byte) bool {
	s := &w.s
	avail, err := rq.Pending()
	if err != nil {
		w.breakVring(rv, err)
		return false
	}
	var hdr [virtio.NetHdrSize]byte
	(&virtio.NetHdr{NumBuffers: 1}).Encode(hdr[:])
	dhdr := rv.HdrLen()
	nbufs, copied := 0, 0
	for copied < len(frame) {
		if nbufs == avail || nbufs == maxMergeBufs || (nbufs == 1 && !rv.Mergeable()) {
			rq.Unpop(nbufs)
			rv.Counters.DropNoBuf.Add(1)
			return false
		}
		h, err := rq.Pop()
		if err != nil {
			rq.Unpop(nbufs)
			w.breakVring(rv, err)
			return false
		}
		wr := rq.NewWriter(h)
		n := 0
		if nbufs == 0 {
			n = wr.Write(hdr[:dhdr])
		}
		c := wr.Write(frame[copied:])
		if err := wr.Err(); err != nil {
			rq.Unpop(nbufs + 1)
			w.breakVring(rv, err)
			return false
		}
		if (nbufs == 0 && n < dhdr) || c == 0 {
			rq.Unpop(nbufs + 1) // a buffer too small for anything
			rv.Counters.DropNoBuf.Add(1)
			return false
		}
		copied += c
		s.used[nbufs] = usedElem{head: h, len: uint32(n + c)}
		nbufs++
	}
	if nbufs > 1 {
		wr := rq.NewWriter(s.used[0].head)
		wr.Skip(10)
		nb := [2]byte{byte(nbufs), byte(nbufs >> 8)}
		wr.Write(nb[:])
	}
	for i := range nbufs {
		rq.Push(s.used[i].head, s.used[i].len)
	}
	rq.Publish()
	rv.Counters.Packets.Add(1)
	rv.Counters.Bytes.Add(uint64(len(frame)))
	w.touch(rv)
	return true
}
