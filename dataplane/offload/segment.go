package offload

import (
	"encoding/binary"

	"github.com/vhostmq/vhostmq/dataplane/virtio"
)

// MaxSegment bounds one segment: the largest frame a segment may be.
const MaxSegment = MaxFrame

// Segmenter cuts a checked GSO frame into segments of gso_size payload
// bytes, each a complete frame with its own headers and checksums, as the
// kernel's GSO would put them on the wire: IPv4 total length, ID (the
// first segment's ID counts up) and header checksum; IPv6 payload length;
// TCP sequence numbers, CWR on the first segment only, FIN and PSH on the
// last only; for USO a UDP header per segment. One Segmenter per worker:
// the segment it returns lives in its buffer until the next call.
type Segmenter struct {
	frame []byte
	in    Info
	size  int // gso_size
	off   int // payload offset of the next segment (from in.L4End)
	n     int // segments made
	buf   [MaxSegment]byte
}

// Start prepares to segment frame, checked with Check against its full
// length (so in describes a GSO frame).
func (s *Segmenter) Start(frame []byte, h *virtio.NetHdr, in Info) {
	s.frame, s.in, s.size, s.off, s.n = frame, in, int(h.GSOSize), 0, 0
}

// Next returns the next segment, or nil after the last.
func (s *Segmenter) Next() []byte {
	in := &s.in
	payload := len(s.frame) - in.L4End
	if s.off >= payload || s.size == 0 {
		return nil
	}
	plen := min(s.size, payload-s.off)
	last := s.off+plen == payload
	hl := in.L4End
	b := s.buf[:hl+plen]
	copy(b, s.frame[:hl])
	copy(b[hl:], s.frame[hl+s.off:hl+s.off+plen])
	ip := b[in.L3:]
	l4len := hl - in.L4 + plen
	if in.IPv6 {
		binary.BigEndian.PutUint16(ip[4:], uint16(in.L4-in.L3-40+l4len))
	} else {
		ihl := in.L4 - in.L3
		binary.BigEndian.PutUint16(ip[2:], uint16(ihl+l4len))
		id := binary.BigEndian.Uint16(ip[4:])
		binary.BigEndian.PutUint16(ip[4:], id+uint16(s.n))
		ip[10], ip[11] = 0, 0
		binary.BigEndian.PutUint16(ip[10:], ^Fold(Sum(ip[:ihl], 0)))
	}
	l4 := b[in.L4:]
	var csumAt int
	if in.Proto == protoTCP {
		seq := binary.BigEndian.Uint32(l4[4:])
		binary.BigEndian.PutUint32(l4[4:], seq+uint32(s.off))
		if s.n > 0 {
			l4[13] &^= 0x80 // CWR
		}
		if !last {
			l4[13] &^= 0x01 | 0x08 // FIN, PSH
		}
		csumAt = 16
	} else {
		binary.BigEndian.PutUint16(l4[4:], uint16(l4len))
		csumAt = 6
	}
	l4[csumAt], l4[csumAt+1] = 0, 0
	c := ^Fold(Sum(l4[:l4len], pseudoSum(ip, in.IPv6, in.Proto, l4len)))
	if c == 0 && in.Proto == protoUDP {
		c = 0xffff
	}
	binary.BigEndian.PutUint16(l4[csumAt:], c)
	s.off += plen
	s.n++
	return b
}
