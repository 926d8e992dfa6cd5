package dataplane

// DHCP: a port given a lease has its guest's DHCP client frames answered
// by the dataplane itself (dataplane/dhcp), never switched. The burst's
// classify and txWalk (transmit.go) find them; the answer goes into the
// guest's RX ring like any frame from a buffer (put, deliver.go).

import (
	"sync"

	"github.com/vhostmq/vhostmq/dataplane/dhcp"
	"github.com/vhostmq/vhostmq/dataplane/offload"
	"github.com/vhostmq/vhostmq/dataplane/virtio"
	"github.com/vhostmq/vhostmq/dataplane/virtq"
	"github.com/vhostmq/vhostmq/dataplane/vswitch"
)

// serverMAC is the Ethernet source of the dataplane's own answers: a
// locally administered address ("vmq").
var serverMAC = [6]byte{0x02, 0x76, 0x6d, 0x71, 0x00, 0x01}

// dhcpResponder answers one port's guest. DHCP is control traffic (a few
// frames per guest per lease period), so one lock and one pair of buffers
// per port serve every worker.
type dhcpResponder struct {
	srv *dhcp.Server
	mu  sync.Mutex
	in  [1518]byte // a DHCP request never needs more than an untagged 1500-byte MTU frame
	out [dhcp.FrameSize]byte
}

func newDHCPResponder(l dhcp.Lease) (*dhcpResponder, error) {
	srv, err := dhcp.NewServer(l, serverMAC)
	if err != nil {
		return nil, err
	}
	return &dhcpResponder{srv: srv}, nil
}

// DHCPStats counts what a port's DHCP server saw and answered.
type DHCPStats struct {
	Discovers uint64 `json:"discovers"`
	Requests  uint64 `json:"requests"`
	Declines  uint64 `json:"declines"`
	Releases  uint64 `json:"releases"`
	Informs   uint64 `json:"informs"`
	Offers    uint64 `json:"offers"`
	Acks      uint64 `json:"acks"`
	Naks      uint64 `json:"naks"`
	Malformed uint64 `json:"malformed"` // dropped: not a well-formed DHCP client message
	Ignored   uint64 `json:"ignored"`   // well-formed, not ours to answer
}

func (r *dhcpResponder) stats() *DHCPStats {
	if r == nil {
		return nil
	}
	c := &r.srv.Counters
	return &DHCPStats{Discovers: c.Discovers.Load(), Requests: c.Requests.Load(), Declines: c.Declines.Load(),
		Releases: c.Releases.Load(), Informs: c.Informs.Load(), Offers: c.Offers.Load(), Acks: c.Acks.Load(),
		Naks: c.Naks.Load(), Malformed: c.Malformed.Load(), Ignored: c.Ignored.Load()}
}

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
		if rv, ok := w.putBuf(p, r.out[:n], &plainHdr, vswitch.FlowHash(r.out[:n])); !ok && rv != nil {
			rv.Counters.DropNoBuf.Add(1)
		}
	}
}
