package dataplane

import (
	"sync"

	"github.com/vhostmq/vhostmq/dataplane/dhcp"
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
