// Package offload is the frame logic behind virtio-net checksum and
// segmentation offloads: it checks the GSO/checksum metadata of a virtio-net
// (or tap vnet) header against the frame it describes, completes a partial
// checksum, and cuts a GSO frame into wire-sized segments for a receiver
// that cannot take it whole. It knows nothing of rings or ports; it never
// allocates (a Segmenter is per-worker scratch).
package offload

import (
	"encoding/binary"
	"errors"

	"github.com/vhostmq/vhostmq/dataplane/virtio"
)

// GSO types of the virtio-net header (gso_type; ECN is a flag on the TCP
// types).
const (
	GSONone  = 0
	GSOTCPv4 = 1
	GSOUDP   = 3 // UFO: never offered, refused
	GSOTCPv6 = 4
	GSOUDPL4 = 5 // USO
	GSOECN   = 0x80
)

// Header flags.
const (
	FNeedsCsum = virtio.NetHdrFNeedsCsum
	FDataValid = virtio.NetHdrFDataValid
)

// MaxFrame bounds a GSO frame: a 64 KiB IP packet (IPv6: plus its header)
// behind an Ethernet header and a VLAN tag.
const MaxFrame = 65535 + 40 + 14 + 4

// MaxSegments bounds how many segments one GSO frame may be cut into; a
// gso_size that would give more is refused (no real stack sends an MSS
// under 64 bytes).
const MaxSegments = 1024

// Caps is what a receiver (a guest's RX side, or the tap) accepts.
type Caps uint8

// Receiver capabilities, from the virtio-net GUEST_* features (or the tap's
// TUNSETOFFLOAD flags).
const (
	CapCsum Caps = 1 << iota // GUEST_CSUM: NEEDS_CSUM frames, DATA_VALID hints
	CapTSO4                  // GUEST_TSO4
	CapTSO6                  // GUEST_TSO6
	CapECN                   // GUEST_ECN
	CapUSO4                  // GUEST_USO4
	CapUSO6                  // GUEST_USO6
)

// CapsFromFeatures maps negotiated virtio-net features to what the guest
// accepts on its RX side.
func CapsFromFeatures(f uint64) Caps {
	var c Caps
	for _, m := range [...]struct {
		bit uint
		c   Caps
	}{{virtio.NetFGuestCsum, CapCsum}, {virtio.NetFGuestTSO4, CapTSO4}, {virtio.NetFGuestTSO6, CapTSO6},
		{virtio.NetFGuestECN, CapECN}, {virtio.NetFGuestUSO4, CapUSO4}, {virtio.NetFGuestUSO6, CapUSO6}} {
		if f&(1<<m.bit) != 0 {
			c |= m.c
		}
	}
	if c&CapCsum == 0 {
		return 0 // every offload needs GUEST_CSUM (spec 5.1.3.1)
	}
	return c
}

// Needs returns the capabilities a receiver must have to take a frame with
// header h whole.
func Needs(h *virtio.NetHdr, ipv6 bool) Caps {
	var c Caps
	if h.Flags&FNeedsCsum != 0 {
		c |= CapCsum
	}
	switch h.GSOType &^ GSOECN {
	case GSOTCPv4:
		c |= CapCsum | CapTSO4
	case GSOTCPv6:
		c |= CapCsum | CapTSO6
	case GSOUDPL4:
		c |= CapCsum | CapUSO4
		if ipv6 {
			c ^= CapUSO4 | CapUSO6
		}
	}
	if h.GSOType&GSOECN != 0 {
		c |= CapECN
	}
	return c
}

// Info locates the headers of a checked frame.
type Info struct {
	L3    int   // offset of the IP header (after Ethernet and an 802.1Q tag)
	L4    int   // offset of the TCP/UDP header (GSO frames; else csum_start)
	L4End int   // end of the TCP/UDP header (GSO frames)
	IPv6  bool  // the IP header is IPv6
	Proto uint8 // 6 TCP, 17 UDP (GSO frames)
	// MinLen is the shortest frame the header can describe: a frame that
	// turns out shorter is malformed.
	MinLen int
}

// Errors of Check; each names what is wrong with the header.
var (
	ErrFlags      = errors.New("offload: unknown header flags")
	ErrGSOType    = errors.New("offload: unsupported gso_type")
	ErrCsumRange  = errors.New("offload: csum_start/csum_offset outside the frame")
	ErrGSONoCsum  = errors.New("offload: GSO without NEEDS_CSUM")
	ErrGSOSize    = errors.New("offload: gso_size is 0 or gives too many segments")
	ErrL3         = errors.New("offload: GSO frame is not IPv4/IPv6 as gso_type says")
	ErrL4         = errors.New("offload: GSO frame is not TCP/UDP as gso_type says, or has a bad L4 header")
	ErrCsumL4     = errors.New("offload: GSO csum_start/csum_offset do not point at the L4 checksum")
	ErrShort      = errors.New("offload: frame shorter than its headers")
	ErrTooLong    = errors.New("offload: GSO frame longer than an IP packet can be")
	ErrNeedLonger = errors.New("offload: headers not within the bytes given")
)

const (
	etherTypeIPv4 = 0x0800
	etherTypeIPv6 = 0x86dd
	etherTypeVLAN = 0x8100
	protoTCP      = 6
	protoUDP      = 17
)

// Check validates header h against frame and says where its headers are.
// total is the frame's full length; frame may be only its first bytes
// (then ErrNeedLonger when the headers reach beyond them: check again
// with more). A frame without metadata (no flags, GSONone) passes.
func Check(h *virtio.NetHdr, frame []byte, total int) (Info, error) {
	var in Info
	if h.Flags&^(FNeedsCsum|FDataValid) != 0 {
		return in, ErrFlags
	}
	gso := h.GSOType &^ GSOECN
	switch gso {
	case GSONone:
		if h.GSOType != GSONone {
			return in, ErrGSOType
		}
	case GSOTCPv4, GSOTCPv6:
	case GSOUDPL4:
		if h.GSOType&GSOECN != 0 {
			return in, ErrGSOType
		}
	default:
		return in, ErrGSOType
	}
	if h.Flags&FNeedsCsum != 0 {
		in.L4 = int(h.CsumStart)
		in.MinLen = int(h.CsumStart) + int(h.CsumOffset) + 2
		if in.L4 < 14 || in.MinLen > total {
			return in, ErrCsumRange
		}
	}
	if gso == GSONone {
		return in, nil
	}
	if h.Flags&FNeedsCsum == 0 {
		return in, ErrGSONoCsum
	}
	if h.GSOSize == 0 {
		return in, ErrGSOSize
	}
	if total > MaxFrame {
		return in, ErrTooLong
	}
	if len(frame) < 14 {
		return in, ErrNeedLonger
	}
	in.L3 = 14
	et := binary.BigEndian.Uint16(frame[12:])
	if et == etherTypeVLAN {
		if len(frame) < 18 {
			return in, ErrNeedLonger
		}
		et = binary.BigEndian.Uint16(frame[16:])
		in.L3 = 18
	}
	l3 := in.L3
	switch et {
	case etherTypeIPv4:
		if gso == GSOTCPv6 {
			return in, ErrL3
		}
		if len(frame) < l3+20 {
			return in, ErrNeedLonger
		}
		ihl := int(frame[l3]&0x0f) * 4
		if frame[l3]>>4 != 4 || ihl < 20 {
			return in, ErrL3
		}
		if binary.BigEndian.Uint16(frame[l3+6:])&0x3fff != 0 {
			return in, ErrL3 // a fragment cannot be segmented
		}
		in.Proto = frame[l3+9]
		in.L4 = l3 + ihl
	case etherTypeIPv6:
		if gso == GSOTCPv4 {
			return in, ErrL3
		}
		if len(frame) < l3+40 {
			return in, ErrNeedLonger
		}
		if frame[l3]>>4 != 6 {
			return in, ErrL3
		}
		in.IPv6 = true
		in.Proto = frame[l3+6] // extension headers are not segmented
		in.L4 = l3 + 40
	default:
		return in, ErrL3
	}
	if int(h.CsumStart) != in.L4 {
		return in, ErrCsumL4
	}
	switch {
	case gso == GSOUDPL4 && in.Proto == protoUDP:
		if h.CsumOffset != 6 {
			return in, ErrCsumL4
		}
		in.L4End = in.L4 + 8
	case gso != GSOUDPL4 && in.Proto == protoTCP:
		if h.CsumOffset != 16 {
			return in, ErrCsumL4
		}
		if len(frame) < in.L4+13 {
			return in, ErrNeedLonger
		}
		thl := int(frame[in.L4+12]>>4) * 4
		if thl < 20 {
			return in, ErrL4
		}
		in.L4End = in.L4 + thl
	default:
		return in, ErrL4
	}
	if in.L4End >= total {
		return in, ErrShort // no payload to segment
	}
	if (total-in.L4End+int(h.GSOSize)-1)/int(h.GSOSize) > MaxSegments {
		return in, ErrGSOSize
	}
	in.MinLen = max(in.MinLen, in.L4End+1)
	return in, nil
}

// SegmentLen returns the IP packet length of the largest segment a GSO
// frame with header h and info in gives: what must fit the MTU.
func SegmentLen(h *virtio.NetHdr, in *Info) int {
	return in.L4End - in.L3 + int(h.GSOSize)
}
