package offload

import (
	"encoding/binary"

	"github.com/vhostmq/vhostmq/dataplane/virtio"
)

// Sum adds b to the one's complement sum acc (RFC 1071), unfolded: b is
// read as big-endian 16-bit words, an odd last byte padded with zero.
func Sum(b []byte, acc uint64) uint64 {
	for len(b) >= 32 {
		acc += uint64(binary.BigEndian.Uint32(b)) + uint64(binary.BigEndian.Uint32(b[4:])) +
			uint64(binary.BigEndian.Uint32(b[8:])) + uint64(binary.BigEndian.Uint32(b[12:])) +
			uint64(binary.BigEndian.Uint32(b[16:])) + uint64(binary.BigEndian.Uint32(b[20:])) +
			uint64(binary.BigEndian.Uint32(b[24:])) + uint64(binary.BigEndian.Uint32(b[28:]))
		b = b[32:]
	}
	for len(b) >= 4 {
		acc += uint64(binary.BigEndian.Uint32(b))
		b = b[4:]
	}
	if len(b) >= 2 {
		acc += uint64(binary.BigEndian.Uint16(b))
		b = b[2:]
	}
	if len(b) == 1 {
		acc += uint64(b[0]) << 8
	}
	return acc
}

// Fold folds an unfolded sum into 16 bits (not complemented).
func Fold(acc uint64) uint16 {
	acc = (acc >> 32) + (acc & 0xffffffff)
	acc = (acc >> 32) + (acc & 0xffffffff)
	acc = (acc >> 16) + (acc & 0xffff)
	acc = (acc >> 16) + (acc & 0xffff)
	acc = (acc >> 16) + (acc & 0xffff)
	return uint16(acc)
}

// Complete finishes a NEEDS_CSUM frame in place: the checksum over
// frame[csum_start:] (the field holds the pseudo-header sum, as the
// sender left it) goes to csum_start+csum_offset. It returns the two
// bytes it overwrote, for Restore when the same frame also goes, whole,
// to a receiver that takes the partial checksum. The caller has checked
// h with Check against len(frame).
func Complete(frame []byte, h *virtio.NetHdr) (old uint16) {
	at := int(h.CsumStart) + int(h.CsumOffset)
	old = binary.BigEndian.Uint16(frame[at:])
	c := ^Fold(Sum(frame[h.CsumStart:], 0))
	if c == 0 {
		c = 0xffff // UDP: 0 means "no checksum"; the same value for TCP
	}
	binary.BigEndian.PutUint16(frame[at:], c)
	return old
}

// Restore puts back what Complete overwrote.
func Restore(frame []byte, h *virtio.NetHdr, old uint16) {
	binary.BigEndian.PutUint16(frame[int(h.CsumStart)+int(h.CsumOffset):], old)
}

// pseudoSum is the TCP/UDP pseudo-header sum for an L4 segment of l4len
// bytes of the IP packet at ip.
func pseudoSum(ip []byte, ipv6 bool, proto uint8, l4len int) uint64 {
	var acc uint64
	if ipv6 {
		acc = Sum(ip[8:40], 0)
	} else {
		acc = Sum(ip[12:20], 0)
	}
	return acc + uint64(proto) + uint64(l4len)
}
