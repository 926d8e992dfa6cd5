package dhcp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"sync/atomic"
)

// Message types (option 53).
const (
	Discover = 1
	Offer    = 2
	Request  = 3
	Decline  = 4
	Ack      = 5
	Nak      = 6
	Release  = 7
	Inform   = 8
)

// Option codes used here.
const (
	optPad             = 0
	optSubnetMask      = 1
	optRouter          = 3
	optDNS             = 6
	optDomainName      = 15
	optMTU             = 26
	optBroadcast       = 28
	optRequestedIP     = 50
	optLeaseTime       = 51
	optOverload        = 52
	optMessageType     = 53
	optServerID        = 54
	optMaxSize         = 57
	optRenewalTime     = 58
	optRebindingTime   = 59
	optDomainSearch    = 119
	optClasslessRoutes = 121
	optEnd             = 255
)

const (
	ethLen    = 14
	ipLen     = 20
	udpLen    = 8
	fixedLen  = 236 // op .. file
	magicLen  = 4
	bootpMin  = 300 // BOOTP's minimum message; some clients drop shorter ones
	serverUDP = 67
	clientUDP = 68
	// minMessage is the DHCP message every client must accept (576-byte
	// IP datagram); replies never exceed it.
	minMessage = 576 - ipLen - udpLen
	// FrameSize is the largest reply frame Handle writes.
	FrameSize = ethLen + ipLen + udpLen + minMessage
	// MinFrame is the shortest frame that can hold a DHCP request.
	MinFrame = ethLen + ipLen + udpLen + fixedLen + magicLen + 1
)

var magic = [4]byte{99, 130, 83, 99}

// Counters count what the server saw and sent; safe to read at any time.
type Counters struct {
	Discovers atomic.Uint64
	Requests  atomic.Uint64
	Declines  atomic.Uint64 // the guest found its address in use: worth a look
	Releases  atomic.Uint64
	Informs   atomic.Uint64
	Offers    atomic.Uint64
	Acks      atomic.Uint64
	Naks      atomic.Uint64
	// Malformed are frames that are not a well-formed DHCP client message
	// (bad IP/UDP header or checksum, bad BOOTP fields, bad options):
	// dropped.
	Malformed atomic.Uint64
	// Ignored are well-formed messages that get no answer: for another
	// server, from a client whose hardware address is not the lease's, or
	// of a type only servers send.
	Ignored atomic.Uint64
}

// Server answers one port's guest from its lease. Handle may be called
// from several goroutines at once.
type Server struct {
	lease     Lease
	opts      []byte  // the lease's configuration options, encoded once
	sid       [4]byte // server identifier
	yiaddr    [4]byte
	mac       [6]byte // the server's Ethernet address
	leaseSecs uint32
	Counters  Counters
}

// NewServer validates the lease and prepares its answers; mac is the
// Ethernet address replies come from.
func NewServer(l Lease, mac [6]byte) (*Server, error) {
	if err := l.Validate(); err != nil {
		return nil, err
	}
	if l.LeaseTime == 0 {
		l.LeaseTime = DefaultLeaseTime
	}
	opts, err := l.options()
	if err != nil {
		return nil, fmt.Errorf("lease: %w", err)
	}
	l.Routes = append([]Route(nil), l.Routes...)
	l.DNS = append([]netip.Addr(nil), l.DNS...)
	l.Search = append([]string(nil), l.Search...)
	return &Server{lease: l, opts: opts, sid: l.serverID().As4(), yiaddr: l.Addr.Addr().As4(), mac: mac,
		leaseSecs: uint32(l.LeaseTime.Seconds())}, nil
}

// Lease returns the server's lease.
func (s *Server) Lease() Lease { return s.lease }

// ServerID returns the server identifier the replies carry.
func (s *Server) ServerID() netip.Addr { return netip.AddrFrom4(s.sid) }

// IsClientFrame tells from a frame's first bytes (Ethernet, IPv4 without
// options, UDP ports) whether it is a DHCP client message, i.e. UDP from
// port 68 to port 67 in an unfragmented IPv4 packet. It is the cheap test
// on the forwarding path; Handle checks the rest.
func IsClientFrame(h []byte) bool {
	if len(h) < ethLen+ipLen+4 || h[12] != 0x08 || h[13] != 0x00 || h[14]>>4 != 4 || h[23] != 17 {
		return false
	}
	l4 := ethLen + int(h[14]&0xf)*4
	if binary.BigEndian.Uint16(h[20:22])&0x3fff != 0 || len(h) < l4+4 {
		return false
	}
	return binary.BigEndian.Uint16(h[l4:]) == clientUDP && binary.BigEndian.Uint16(h[l4+2:]) == serverUDP
}

// request is what Handle needs from a client message.
type request struct {
	msgType     byte
	xid         [4]byte
	flags       [2]byte
	ciaddr      [4]byte
	chaddr      [6]byte
	reqIP       [4]byte
	hasReqIP    bool
	serverID    [4]byte
	hasServerID bool
}

var (
	errShort    = errors.New("truncated")
	errIP       = errors.New("bad IPv4 header")
	errUDP      = errors.New("bad UDP header")
	errChecksum = errors.New("bad checksum")
	errBOOTP    = errors.New("bad BOOTP fields")
	errOptions  = errors.New("bad options")
)

// parse checks a whole client frame, strictly: Ethernet, IPv4 (header
// checksum, no fragments), UDP 68→67 (length, checksum when present),
// BOOTP request fields for Ethernet, the magic cookie and every option's
// length.
func parse(f []byte) (request, error) {
	var r request
	if len(f) < ethLen+ipLen+udpLen {
		return r, errShort
	}
	if f[12] != 0x08 || f[13] != 0x00 {
		return r, errIP
	}
	ip := f[ethLen:]
	ihl := int(ip[0]&0xf) * 4
	total := int(binary.BigEndian.Uint16(ip[2:4]))
	switch {
	case ip[0]>>4 != 4 || ihl < ipLen:
		return r, errIP
	case total < ihl+udpLen || total > len(ip):
		return r, errShort
	case binary.BigEndian.Uint16(ip[6:8])&0x3fff != 0 || ip[9] != 17:
		return r, errIP
	case checksum(0, ip[:ihl]) != 0:
		return r, errChecksum
	}
	ip = ip[:total] // Ethernet padding beyond the datagram is not ours
	udp := ip[ihl:]
	ulen := int(binary.BigEndian.Uint16(udp[4:6]))
	switch {
	case binary.BigEndian.Uint16(udp[0:2]) != clientUDP || binary.BigEndian.Uint16(udp[2:4]) != serverUDP:
		return r, errUDP
	case ulen != len(udp):
		return r, errUDP
	case binary.BigEndian.Uint16(udp[6:8]) != 0 && checksum(pseudo(ip[12:16], ip[16:20], ulen), udp) != 0:
		return r, errChecksum
	}
	m := udp[udpLen:]
	if len(m) < fixedLen+magicLen {
		return r, errShort
	}
	// op BOOTREQUEST, Ethernet, no relay: a directly attached guest
	if m[0] != 1 || m[1] != 1 || m[2] != 6 || m[3] != 0 || binary.BigEndian.Uint32(m[24:28]) != 0 {
		return r, errBOOTP
	}
	if [4]byte(m[fixedLen:fixedLen+4]) != magic {
		return r, errBOOTP
	}
	copy(r.xid[:], m[4:8])
	copy(r.flags[:], m[10:12])
	copy(r.ciaddr[:], m[12:16])
	copy(r.chaddr[:], m[28:34])
	if err := r.options(m[fixedLen+magicLen:]); err != nil {
		return r, err
	}
	if r.msgType == 0 {
		return r, errOptions
	}
	return r, nil
}

// options walks the options: every length within the message, one
// message type, the fixed-size ones at their size, an end option followed
// only by padding. Overloading sname/file is not supported (a client has
// no reason to in a request).
func (r *request) options(o []byte) error {
	for i := 0; ; {
		if i >= len(o) {
			return errOptions // no end option
		}
		code := o[i]
		if code == optPad {
			i++
			continue
		}
		if code == optEnd {
			for _, b := range o[i+1:] {
				if b != 0 {
					return errOptions
				}
			}
			return nil
		}
		if i+2 > len(o) || i+2+int(o[i+1]) > len(o) {
			return errOptions
		}
		v := o[i+2 : i+2+int(o[i+1])]
		i += 2 + len(v)
		switch code {
		case optMessageType:
			if len(v) != 1 || v[0] < Discover || v[0] > Inform || r.msgType != 0 {
				return errOptions
			}
			r.msgType = v[0]
		case optRequestedIP:
			if len(v) != 4 || r.hasReqIP {
				return errOptions
			}
			r.reqIP, r.hasReqIP = [4]byte(v), true
		case optServerID:
			if len(v) != 4 || r.hasServerID {
				return errOptions
			}
			r.serverID, r.hasServerID = [4]byte(v), true
		case optMaxSize:
			if len(v) != 2 || binary.BigEndian.Uint16(v) < 576 {
				return errOptions
			}
		case optOverload:
			return errOptions
		}
	}
}

// Handle answers one client frame (Ethernet, starting at the destination
// address). It writes the reply frame to out (at least FrameSize bytes) and
// returns its length, or 0 when there is nothing to send; malformed frames
// are counted and dropped.
func (s *Server) Handle(frame, out []byte) int {
	r, err := parse(frame)
	if err != nil {
		s.Counters.Malformed.Add(1)
		return 0
	}
	if s.lease.MAC != ([6]byte{}) && r.chaddr != s.lease.MAC {
		s.Counters.Ignored.Add(1)
		return 0
	}
	zero := [4]byte{}
	switch r.msgType {
	case Discover:
		s.Counters.Discovers.Add(1)
		s.Counters.Offers.Add(1)
		return s.reply(out, &r, Offer)
	case Request:
		s.Counters.Requests.Add(1)
		var want [4]byte
		switch {
		case r.hasServerID: // SELECTING: the client picked a server
			if r.serverID != s.sid {
				s.Counters.Ignored.Add(1)
				return 0
			}
			want = r.reqIP // zero when missing: a NAK
		case r.hasReqIP: // INIT-REBOOT
			want = r.reqIP
		case r.ciaddr != zero: // RENEWING or REBINDING
			want = r.ciaddr
		default:
			s.Counters.Malformed.Add(1)
			return 0
		}
		if want != s.yiaddr {
			s.Counters.Naks.Add(1)
			return s.reply(out, &r, Nak)
		}
		s.Counters.Acks.Add(1)
		return s.reply(out, &r, Ack)
	case Decline:
		s.Counters.Declines.Add(1)
		return 0
	case Release:
		s.Counters.Releases.Add(1)
		return 0
	case Inform:
		s.Counters.Informs.Add(1)
		s.Counters.Acks.Add(1)
		return s.reply(out, &r, Ack)
	}
	s.Counters.Ignored.Add(1) // OFFER, ACK or NAK from a guest
	return 0
}

// reply writes the answer frame and returns its length.
func (s *Server) reply(out []byte, r *request, typ byte) int {
	out = out[:FrameSize]
	clear(out)
	inform := r.msgType == Inform
	bcast := r.flags[0]&0x80 != 0
	var dstIP [4]byte
	switch {
	case typ == Nak:
		dstIP, bcast = [4]byte{255, 255, 255, 255}, true
	case r.ciaddr != [4]byte{}:
		dstIP = r.ciaddr
	case bcast:
		dstIP = [4]byte{255, 255, 255, 255}
	default:
		dstIP = s.yiaddr
	}
	// DHCP message
	m := out[ethLen+ipLen+udpLen:]
	m[0], m[1], m[2] = 2, 1, 6
	copy(m[4:8], r.xid[:])
	copy(m[10:12], r.flags[:])
	if typ != Nak {
		copy(m[12:16], r.ciaddr[:])
	}
	if typ != Nak && !inform {
		copy(m[16:20], s.yiaddr[:])
	}
	copy(m[28:34], r.chaddr[:])
	copy(m[fixedLen:], magic[:])
	o := m[fixedLen+magicLen : fixedLen+magicLen]
	o = append(o, optMessageType, 1, typ, optServerID, 4)
	o = append(o, s.sid[:]...)
	if typ != Nak {
		if !inform {
			o = appendU32(o, optLeaseTime, s.leaseSecs)
			o = appendU32(o, optRenewalTime, s.leaseSecs/2)
			o = appendU32(o, optRebindingTime, s.leaseSecs/8*7)
		}
		o = append(o, s.opts...)
	}
	o = append(o, optEnd)
	mlen := max(fixedLen+magicLen+len(o), bootpMin)
	// UDP
	udp := out[ethLen+ipLen:]
	ulen := udpLen + mlen
	binary.BigEndian.PutUint16(udp[0:2], serverUDP)
	binary.BigEndian.PutUint16(udp[2:4], clientUDP)
	binary.BigEndian.PutUint16(udp[4:6], uint16(ulen))
	cs := checksum(pseudo(s.sid[:], dstIP[:], ulen), udp[:ulen])
	if cs == 0 {
		cs = 0xffff
	}
	binary.BigEndian.PutUint16(udp[6:8], cs)
	// IPv4
	ip := out[ethLen:]
	ip[0], ip[8], ip[9] = 0x45, 64, 17
	binary.BigEndian.PutUint16(ip[2:4], uint16(ipLen+ulen))
	copy(ip[12:16], s.sid[:])
	copy(ip[16:20], dstIP[:])
	binary.BigEndian.PutUint16(ip[10:12], checksum(0, ip[:ipLen]))
	// Ethernet
	if bcast {
		copy(out[0:6], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	} else {
		copy(out[0:6], r.chaddr[:])
	}
	copy(out[6:12], s.mac[:])
	out[12], out[13] = 0x08, 0x00
	return ethLen + ipLen + ulen
}

func appendU32(b []byte, code byte, v uint32) []byte {
	b = append(b, code, 4)
	return binary.BigEndian.AppendUint32(b, v)
}

// pseudo is the sum of the UDP pseudo-header.
func pseudo(src, dst []byte, ulen int) uint32 {
	var sum uint32
	for i := 0; i < 4; i += 2 {
		sum += uint32(binary.BigEndian.Uint16(src[i:])) + uint32(binary.BigEndian.Uint16(dst[i:]))
	}
	return sum + 17 + uint32(ulen)
}

// checksum returns the Internet checksum of b with sum added in: the
// value for a checksum field, and 0 over data whose field is correct.
func checksum(sum uint32, b []byte) uint16 {
	for len(b) >= 2 {
		sum += uint32(binary.BigEndian.Uint16(b))
		b = b[2:]
	}
	if len(b) == 1 {
		sum += uint32(b[0]) << 8
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}
