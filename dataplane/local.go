package dataplane

// Frames the dataplane itself puts into a guest's RX ring: DHCP answers
// and frames from the uplink. They come from a buffer rather than
// another guest's chain.

import (
	"github.com/vhostmq/vhostmq/dataplane/netdev"
	"github.com/vhostmq/vhostmq/dataplane/virtq"
	"github.com/vhostmq/vhostmq/dataplane/vswitch"
)

// answerDHCP handles a DHCP client frame from p's guest (the TX chain at
// head of q) and puts the answer, if any, into p's RX ring. The caller
// holds q's vring lock.
func (w *worker) answerDHCP(p *port, q *virtq.Queue, head uint16, hdrLen, frameLen int) {
	// Lock order: r.mu, then an RX vring. A worker never waits for r.mu
	// while it holds an RX vring.
	w.releaseRX(false)
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
		if full := w.deliverBuf(p, r.out[:n], vswitch.FlowHash(r.out[:n])); full != nil {
			full.Counters.DropNoBuf.Add(1)
		}
	}
}

// deliverBuf copies a frame from a dataplane buffer into an RX vring of
// dst through the burst's RX hold (so a worker still holds at most one RX
// vring), spanning several chains with MRG_RXBUF. The virtio-net header
// says nothing but num_buffers: the frame is complete and checksummed.
// It returns the RX vring that had no room for the frame, uncounted (the
// caller drops it or keeps it for later: uplink.go), else nil.
func (w *worker) deliverBuf(dst *port, frame []byte, hash uint32) (full *netdev.Vring) {
	if rv, res := w.put(dst, frame, hash); res == fillNoRoom {
		return rv
	}
	return nil
}
